/* A loop file reaching down (tests/layout/selftest.sh): scripts/rooms.sh
 * must flag metrics.h (the admin room shows admin.h only) and not
 * admin.h. */
#include "server/admin/admin.h"
#include "server/admin/metrics.h"
