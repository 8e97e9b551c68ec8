/*
 * admin.h: the admin HTTP port (GET /health, /stats, /metrics, /sessions), served on
 * the daemon's libuv loop with http-parser.
 *
 * DESIGN.  Everything here runs on the loop thread: the listener, every
 * admin connection, and the hooks it calls for figures.  Each connection
 * owns its parser and a reply buffer, freed in its close callback.
 */
#ifndef SLOTD_SERVER_ADMIN_H
#define SLOTD_SERVER_ADMIN_H

#include <stdbool.h>
#include <uv.h>

#include "proto/proto.h"

typedef struct admin admin_t;

/** What the admin port asks the daemon, on the loop thread. */
typedef struct admin_hooks {
    /** Fills the stats object as the `stats` op would. */
    void (*stats)(void *arg, proto_stats_t *out);
    /** True while serving; false while draining or with a wedged worker.
     * `why` gets a short static reason when false. */
    bool (*healthy)(void *arg, const char **why);
    /** Appends the JSON body of GET /sessions with at most `limit`
     * sessions; SLOTD_OK or SLOTD_ENOMEM.  NULL: the route is 404. */
    int (*sessions)(void *arg, size_t limit, proto_buf_t *out);
    void *arg;
    /** The token of --auth-token-file, or NULL (token_len 0) for none.
     * When set, every route but /health asks for "Authorization: Bearer
     * <token>" and answers 401 without it.  Not copied: it must outlive
     * the admin port. */
    const char *token;
    size_t token_len;
} admin_hooks_t;

/** Listens on host:port on `loop`; a connection that produces no response
 * for `idle_ms` (at least 1) is closed.  *out is owned by the caller until
 * admin_close() has finished.  Returns 0 or a negative libuv error. */
int admin_start(uv_loop_t *loop, const char *host, int port, unsigned idle_ms,
                const admin_hooks_t *hooks, admin_t **out);

/** The local port `a` listens on (useful after asking for port 0), or a
 * negative libuv error. */
int admin_port(const admin_t *a);

/** Stops listening and closes every admin connection; `a` is freed once
 * the last handle's close callback has run (the loop keeps running until
 * then).  */
void admin_close(admin_t *a);

#endif
