/*
 * inspect_int.h: what the daemon shows of itself (inspect.c), for the
 * other files of server/.  Loop thread only.
 */
#ifndef SLOTD_SERVER_INSPECT_INT_H
#define SLOTD_SERVER_INSPECT_INT_H

#include "server/admin/admin.h"
#include "server_int.h"

/** admin_hooks_t.sessions: begins GET /sessions for `arg`, the server:
 * the total of live sessions and the `limit` largest (see inspect.c),
 * gathered over several loop turns and written on libuv's thread pool.
 * `done(ctx, ...)` is called once, on the loop thread and never from
 * within this call, unless the listing is canceled first.  Returns the
 * listing, owned by inspect.c until `done` or inspect__sessions_cancel(),
 * or NULL without memory. */
void *inspect__sessions(void *arg, size_t limit, admin_body_cb done, void *ctx);
/** admin_hooks_t.sessions_cancel: `done` will not be called; the listing
 * is freed once its handle and any job on the thread pool are through. */
void inspect__sessions_cancel(void *listing);
/** Moves the cursor of a listing being gathered off connection `c`, which
 * has just left server->conns (c->next still names its successor), and
 * off session `sess`, which is leaving its connection's list. */
void inspect__conn_gone(conn_t *c);
void inspect__session_gone(session_t *sess);
/** admin_hooks_t.health: whether the daemon drains and whether a worker
 * is wedged (worker_pool_wedged() with --wedge-timeout). */
void inspect__health(void *arg, bool *draining, bool *wedged);
/** Fills the stats object (the stats op and the admin port). */
void inspect__stats(server_t *s, proto_stats_t *st);

/** The `stats` figures of tenant `t` alone (a tenant without admin sees
 * only these): its sessions, entries, connections, requests, errors and
 * releases, its share of the pool as the pool's size, its sessions limit
 * as the slots (the daemon's when it has none); g_calls and rows, counted
 * per model for every tenant at once, are 0.  Loop thread. */
void inspect__tenant_stats(server_t *s, const tenant_t *t, proto_stats_t *st);

/** admin_hooks_t.metrics_more with a tenants file: appends the
 * slotd_tenant_* families, one sample per tenant listed now (a tenant a
 * reload dropped is gone from them).  SLOTD_OK or an error. */
int inspect__tenant_metrics(void *arg, proto_buf_t *b);

#endif
