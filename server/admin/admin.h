/*
 * admin.h: the admin room's one header for the other rooms
 * (server/admin/): the admin HTTP port (GET /health, /stats, /metrics,
 * /sessions; POST /prefix-cache/flush, /tenants/reload), served on the
 * daemon's libuv loop with http-parser, and through metrics.h the
 * daemon's counters, which the loop and the workers update.
 *
 * DESIGN.  The port runs on the loop thread: the listener, every
 * admin connection, and the hooks it calls for figures.  Each connection
 * owns its parser and a reply buffer, freed in its close callback.
 */
#ifndef SLOTD_SERVER_ADMIN_H
#define SLOTD_SERVER_ADMIN_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "metrics.h"
#include "proto/proto.h"

typedef struct admin admin_t;

/** What POST /tenants/reload did (admin_hooks_t.tenants_reload). */
typedef enum admin_reload_rc {
    ADMIN_RELOAD_APPLIED,   /* 200: `tenants` listed now, `revoked` connections told */
    ADMIN_RELOAD_NO_FILE,   /* 409: the daemon runs without --tenants-file */
    ADMIN_RELOAD_REFUSED,   /* 422: the file did not load, `why`; nothing changed */
    ADMIN_RELOAD_NO_MEMORY, /* 503: nothing changed */
} admin_reload_rc_t;

typedef struct admin_reload {
    uint64_t tenants;
    uint64_t revoked;
    char why[512]; /* the reason of ADMIN_RELOAD_REFUSED */
} admin_reload_t;

/** Called on the loop thread when a body built by a hook is ready: `rc`
 * SLOTD_OK with `body` filled, or SLOTD_ENOMEM.  The callee may take the
 * bytes of `body` (swap it with an empty buffer); whatever is left is
 * freed by the hook's side after the call. */
typedef void (*admin_body_cb)(void *ctx, int rc, proto_buf_t *body);

/** What the admin port asks the daemon, on the loop thread. */
typedef struct admin_hooks {
    /** Fills the stats object as the `stats` op would. */
    void (*stats)(void *arg, proto_stats_t *out);
    /** True while serving; false while draining or with a wedged worker.
     * `why` gets a short static reason when false. */
    bool (*healthy)(void *arg, const char **why);
    /** Begins the JSON body of GET /sessions with at most `limit`
     * sessions, built across loop turns so that no turn is long; calls
     * `done(ctx, ...)` once, later, on the loop thread, unless canceled.
     * Returns a handle for sessions_cancel, or NULL without memory.  NULL
     * hook: the route is 404. */
    void *(*sessions)(void *arg, size_t limit, admin_body_cb done, void *ctx);
    /** Cancels a listing begun by `sessions` whose `done` has not run:
     * it will not. */
    void (*sessions_cancel)(void *listing);
    /** Whether the daemon drains and whether a worker is wedged, for the
     * gauges of GET /metrics.  NULL: both false. */
    void (*health)(void *arg, bool *draining, bool *wedged);
    /** POST /prefix-cache/flush: gives up every entry only the prefix cache
     * holds and returns how many.  NULL: the route is 404. */
    uint64_t (*prefix_flush)(void *arg);
    /** POST /tenants/reload: rereads the tenants file as SIGHUP does, fills
     * `out` (zeroed by the caller) and returns an admin_reload_rc_t.  NULL:
     * no such route (a POST there is 405, as to any path without one). */
    int (*tenants_reload)(void *arg, admin_reload_t *out);
    /** GET /metrics: appends more families after metrics_render()'s (the
     * per-tenant ones).  Returns SLOTD_OK or SLOTD_ENOMEM.  NULL: none. */
    int (*metrics_more)(void *arg, proto_buf_t *out);
    void *arg;
    /** The token of --auth-token-file, or NULL (token_len 0) for none.
     * When set, every route but /health asks for "Authorization: Bearer
     * <token>" and answers 401 without it.  Not copied: it must outlive
     * the admin port. */
    const char *token;
    size_t token_len;
    /** With a tenants file: whether the `len` bytes at `token` are the
     * token of a tenant with the admin right.  When set, it replaces
     * `token` and every route but /health asks for such a token.  NULL:
     * `token` decides. */
    bool (*admin_token)(void *arg, const char *token, size_t len);
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
