/*
 * inspect_int.h: what the daemon shows of itself (inspect.c), for the
 * other files of server/.  Loop thread only.
 */
#ifndef SLOTD_SERVER_INSPECT_INT_H
#define SLOTD_SERVER_INSPECT_INT_H

#include "server_int.h"

/** Appends the JSON body of GET /sessions: the total of live sessions and
 * the `limit` largest (see inspect.c).  SLOTD_OK or SLOTD_ENOMEM. */
int inspect__sessions(server_t *s, size_t limit, proto_buf_t *out);
/** Fills the stats object (the stats op and the admin port). */
void inspect__stats(server_t *s, proto_stats_t *st);

#endif
