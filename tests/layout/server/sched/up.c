/* A room's file reaching up (tests/layout/selftest.sh): scripts/rooms.sh
 * must flag server/config.h (the sched room calls nothing of the loop),
 * not its own room's worker.h. */
#include "server/config.h"
#include "server/sched/worker.h"
