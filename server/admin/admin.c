/*
 * admin.c: the admin port on libuv: the listener, the admin connections
 * and their writes.  HTTP itself is admin_http.c's.
 *
 * Owns the admin_t, its listening uv_tcp_t, a sweep timer, and one
 * admin_conn_t per open connection (a uv_tcp_t embedded in it, its
 * admin_http_t and two output buffers).  Bytes read go to admin_http_feed();
 * what it appends is written with one uv_write at a time (`out` collects
 * while `wbuf` is in flight).  While admin_http holds pipelined input back
 * the connection stops reading, and resumes once the output is written.
 * A GET /sessions (ADMIN_HTTP_WAIT) stops reading too while the sessions
 * hook builds its body over later loop turns; the hook's callback hands
 * the body to admin_http_complete(), and a connection closed first
 * cancels the listing.
 * After the last response (a close asked for, or a 400) the connection
 * shuts its side down and lingers, reading and dropping input, until the
 * peer's EOF or ADMIN_LINGER_MS, so that a client that already sent more
 * still gets the response rather than a reset.
 *
 * Limits: at most ADMIN_MAX_CONNS connections.  When one more arrives,
 * the connection that has waited longest for anything to happen makes room
 * (a lingering one first, then one idle between requests, then any), so a
 * health check on a fresh connection is always answered, whoever holds the
 * others.  The sweep timer closes a connection that has produced no
 * response for the idle timeout (an idle keep-alive, a request trickling
 * in, a client that does not read) and a lingering one after
 * ADMIN_LINGER_MS.
 *
 * DESIGN.  Everything here runs on the loop thread, including the hooks
 * admin_http calls.  No lock: nothing is shared with other threads.  Every
 * handle (listener, timer, connections) is counted in
 * `handles`; admin_close() closes them all and the close callback that
 * brings the count to zero frees the admin_t.  A connection is unlinked
 * when its close starts and freed in its close callback; write and shutdown
 * callbacks that arrive for a closing connection (UV_ECANCELED) only
 * return.
 */
#include "admin.h"

#include <arpa/inet.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "admin_http_int.h"

#define ADMIN_MAX_CONNS 64
#define ADMIN_BACKLOG 128
#define ADMIN_READ_SIZE 65536
#define ADMIN_LINGER_MS 2000
#define ADMIN_SWEEP_MS 1000

typedef enum conn_state {
    CONN_OPEN,    /* reading requests */
    CONN_FULL,    /* not reading: input held back until `out` is written */
    CONN_DRAIN,   /* not reading: close once `out` is written */
    CONN_WAIT,    /* not reading: a response waits for its body (`listing`) */
    CONN_LINGER,  /* our side shut down; dropping input until EOF */
    CONN_CLOSING, /* uv_close() called; freed in conn_closed() */
} conn_state_t;

typedef struct admin_conn {
    uv_tcp_t tcp;
    uv_write_t wreq;
    uv_shutdown_t sreq;
    admin_t *admin;
    admin_http_t *http;
    proto_buf_t out;  /* responses not yet handed to uv_write */
    proto_buf_t wbuf; /* the bytes of the write in flight */
    conn_state_t state;
    bool reading;
    bool writing;
    bool peer_eof;
    void *listing;      /* the sessions hook's, while CONN_WAIT */
    uint64_t responses; /* admin_http_responses() when last looked */
    uint64_t deadline;  /* uv_now() after which the sweep closes it */
    uint64_t active;    /* uv_now() of its last accept, read or response */
    struct admin_conn *prev, *next;
} admin_conn_t;

struct admin {
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_timer_t sweep;
    admin_hooks_t hooks;
    uint64_t idle_ms;    /* a connection with no response for this long is closed */
    admin_conn_t *conns; /* open connections, not those closing */
    unsigned nconns;
    unsigned handles; /* handles not yet through their close callback */
    bool closing;
    char readbuf[ADMIN_READ_SIZE]; /* lent to every read, one at a time */
};

static uint64_t hrtime(void)
{
    return uv_hrtime();
}

static void handle_gone(admin_t *a)
{
    if (--a->handles == 0 && a->closing)
        free(a);
}

/* ---- Connections ---- */

static void conn_closed(uv_handle_t *h)
{
    admin_conn_t *c = container_of(h, admin_conn_t, tcp);
    admin_t *a = c->admin;
    admin_http_free(c->http);
    proto_buf_free(&c->out);
    proto_buf_free(&c->wbuf);
    free(c);
    handle_gone(a);
}

static void admin_conn_close(admin_conn_t *c)
{
    if (c->state == CONN_CLOSING)
        return;
    c->state = CONN_CLOSING;
    if (c->listing != NULL) {
        c->admin->hooks.sessions_cancel(c->listing);
        c->listing = NULL;
    }
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        c->admin->conns = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    c->admin->nconns--;
    uv_close((uv_handle_t *)&c->tcp, conn_closed);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    admin_conn_t *c = container_of(h, admin_conn_t, tcp);
    *buf = uv_buf_init(c->admin->readbuf, sizeof(c->admin->readbuf));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

static int admin_read_start(admin_conn_t *c)
{
    if (c->reading)
        return 0;
    int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    c->reading = rc == 0;
    return rc;
}

static void admin_read_stop(admin_conn_t *c)
{
    if (c->reading)
        uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = false;
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    admin_conn_t *c = container_of(req, admin_conn_t, sreq);
    if (c->state == CONN_CLOSING)
        return;
    if (status < 0 || admin_read_start(c) != 0)
        admin_conn_close(c);
}

/* Everything is written and nothing more will be answered. */
static void conn_finish(admin_conn_t *c)
{
    if (c->peer_eof) {
        admin_conn_close(c);
        return;
    }
    c->state = CONN_LINGER;
    c->deadline = uv_now(c->admin->loop) + ADMIN_LINGER_MS;
    admin_read_stop(c);
    if (uv_shutdown(&c->sreq, (uv_stream_t *)&c->tcp, on_shutdown) != 0)
        admin_conn_close(c);
}

static void conn_flush(admin_conn_t *c);
static void conn_listed(void *ctx, int rc, proto_buf_t *body);

/* Acts on what admin_http returned.  Returns false if `c` is now closing. */
static bool conn_next(admin_conn_t *c, int rc)
{
    uint64_t n = admin_http_responses(c->http);
    if (n != c->responses) {
        c->responses = n;
        c->active = uv_now(c->admin->loop);
        c->deadline = c->active + c->admin->idle_ms;
    }
    switch (rc) {
    case ADMIN_HTTP_MORE:
        c->state = CONN_OPEN;
        if (!c->peer_eof && admin_read_start(c) != 0) {
            admin_conn_close(c);
            return false;
        }
        if (c->peer_eof)
            c->state = CONN_DRAIN;
        return true;
    case ADMIN_HTTP_FULL:
        c->state = CONN_FULL;
        admin_read_stop(c);
        return true;
    case ADMIN_HTTP_CLOSE:
        c->state = CONN_DRAIN;
        admin_read_stop(c);
        return true;
    case ADMIN_HTTP_WAIT:
        c->state = CONN_WAIT;
        admin_read_stop(c);
        if (c->listing == NULL) {
            admin_t *a = c->admin;
            c->listing =
                a->hooks.sessions(a->hooks.arg, admin_http_wait_limit(c->http), conn_listed, c);
            if (c->listing == NULL) {
                admin_conn_close(c);
                return false;
            }
        }
        return true;
    default:
        admin_conn_close(c);
        return false;
    }
}

/* admin_body_cb: the body of GET /sessions is ready. */
static void conn_listed(void *ctx, int rc, proto_buf_t *body)
{
    admin_conn_t *c = ctx;
    c->listing = NULL;
    if (conn_next(c, admin_http_complete(c->http, rc, body, &c->out)))
        conn_flush(c);
}

static void on_write(uv_write_t *req, int status);

/* Starts the next write, or takes the next step once all is written. */
static void conn_flush(admin_conn_t *c)
{
    while (!c->writing && c->state != CONN_CLOSING) {
        if (c->out.len > 0) {
            proto_buf_t t = c->wbuf;
            c->wbuf = c->out;
            c->out = t;
            c->out.len = 0;
            uv_buf_t b = uv_buf_init(c->wbuf.data, (unsigned)c->wbuf.len);
            if (uv_write(&c->wreq, (uv_stream_t *)&c->tcp, &b, 1, on_write) != 0) {
                admin_conn_close(c);
                return;
            }
            c->writing = true;
            return;
        }
        if (c->state == CONN_FULL) {
            if (!conn_next(c, admin_http_resume(c->http, &c->out)))
                return;
            continue;
        }
        if (c->state == CONN_DRAIN)
            conn_finish(c);
        return;
    }
}

static void on_write(uv_write_t *req, int status)
{
    admin_conn_t *c = container_of(req, admin_conn_t, wreq);
    c->writing = false;
    c->wbuf.len = 0;
    if (c->state == CONN_CLOSING)
        return;
    if (status < 0) {
        admin_conn_close(c);
        return;
    }
    conn_flush(c);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    admin_conn_t *c = container_of(s, admin_conn_t, tcp);
    if (nread == 0 || c->state == CONN_CLOSING)
        return;
    c->active = uv_now(c->admin->loop);
    if (c->state == CONN_LINGER) {
        if (nread < 0)
            admin_conn_close(c);
        return;
    }
    if (nread < 0) {
        /* EOF: answer what was complete, then close; an error: close now. */
        admin_read_stop(c);
        if (nread != UV_EOF) {
            admin_conn_close(c);
            return;
        }
        c->peer_eof = true;
        if (c->state == CONN_OPEN)
            c->state = CONN_DRAIN;
        conn_flush(c);
        return;
    }
    if (conn_next(c, admin_http_feed(c->http, buf->base, (size_t)nread, &c->out)))
        conn_flush(c);
}

/* How readily `c` gives up its place to a new connection: 2 lingering
 * (its answers are out), 1 idle between requests, 0 anything else. */
static int evict_rank(const admin_conn_t *c)
{
    if (c->state == CONN_LINGER)
        return 2;
    if (c->state == CONN_OPEN && !c->writing && c->out.len == 0 && admin_http_idle(c->http))
        return 1;
    return 0;
}

/* At the limit: closes the connection of the highest rank that has been
 * quiet longest, so that the new one is served rather than refused. */
static void evict(admin_t *a)
{
    admin_conn_t *victim = NULL;
    int best = -1;
    /* Newest first: on a tie in uv_now()'s milliseconds the older wins. */
    for (admin_conn_t *c = a->conns; c != NULL; c = c->next) {
        int r = evict_rank(c);
        if (r > best || (r == best && c->active <= victim->active)) {
            victim = c;
            best = r;
        }
    }
    if (victim != NULL)
        admin_conn_close(victim);
}

static void on_connection(uv_stream_t *server, int status)
{
    admin_t *a = container_of(server, admin_t, listener);
    if (status < 0 || a->closing)
        return;
    if (a->nconns >= ADMIN_MAX_CONNS)
        evict(a);
    admin_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return;
    if (uv_tcp_init(a->loop, &c->tcp) != 0) {
        free(c);
        return;
    }
    a->handles++;
    c->admin = a;
    c->state = CONN_OPEN;
    proto_buf_init(&c->out);
    proto_buf_init(&c->wbuf);
    c->next = a->conns;
    if (a->conns != NULL)
        a->conns->prev = c;
    a->conns = c;
    a->nconns++;
    c->active = uv_now(a->loop);
    c->deadline = c->active + a->idle_ms;

    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0 ||
        (c->http = admin_http_new(&a->hooks, hrtime)) == NULL || admin_read_start(c) != 0) {
        admin_conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
}

/* ---- The admin port ---- */

static void on_sweep(uv_timer_t *t)
{
    admin_t *a = container_of(t, admin_t, sweep);
    uint64_t now = uv_now(a->loop);
    admin_conn_t *next;
    for (admin_conn_t *c = a->conns; c != NULL; c = next) {
        next = c->next;
        if (now >= c->deadline)
            admin_conn_close(c);
    }
}

static void listener_closed(uv_handle_t *h)
{
    handle_gone(container_of(h, admin_t, listener));
}

static void sweep_closed(uv_handle_t *h)
{
    handle_gone(container_of(h, admin_t, sweep));
}

/* Parses an IPv4 or IPv6 literal, the latter with or without brackets. */
static int admin_parse_addr(const char *host, int port, struct sockaddr_storage *ss)
{
    char tmp[128];
    size_t len = strlen(host);
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)ss) == 0)
        return 0;
    if (len >= 2 && host[0] == '[' && host[len - 1] == ']' && len - 2 < sizeof(tmp)) {
        memcpy(tmp, host + 1, len - 2);
        tmp[len - 2] = '\0';
        host = tmp;
    }
    if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss) == 0)
        return 0;
    return UV_EINVAL;
}

int admin_start(uv_loop_t *loop, const char *host, int port, unsigned idle_ms,
                const admin_hooks_t *hooks, admin_t **out)
{
    struct sockaddr_storage ss;
    int rc;

    *out = NULL;
    if (port < 0 || port > 65535 || idle_ms == 0)
        return UV_EINVAL;
    memset(&ss, 0, sizeof(ss));
    if ((rc = admin_parse_addr(host, port, &ss)) != 0)
        return rc;

    admin_t *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return UV_ENOMEM;
    a->loop = loop;
    a->idle_ms = idle_ms;
    if (hooks != NULL)
        a->hooks = *hooks;
    if ((rc = uv_tcp_init(loop, &a->listener)) != 0) {
        free(a);
        return rc;
    }
    a->handles = 1;
    if ((rc = uv_tcp_bind(&a->listener, (const struct sockaddr *)&ss, 0)) != 0 ||
        (rc = uv_listen((uv_stream_t *)&a->listener, ADMIN_BACKLOG, on_connection)) != 0)
        goto fail_listener;
    if ((rc = uv_timer_init(loop, &a->sweep)) != 0)
        goto fail_listener;
    a->handles++;
    /* A quarter of a short timeout, so that the close is not late by a
     * whole sweep. */
    uint64_t every = idle_ms / 4 < ADMIN_SWEEP_MS ? (idle_ms + 3) / 4 : ADMIN_SWEEP_MS;
    uv_timer_start(&a->sweep, on_sweep, every, every);
    uv_unref((uv_handle_t *)&a->sweep);
    *out = a;
    return 0;

fail_listener:
    /* The handle is freed with `a` once the loop has run its close. */
    a->closing = true;
    uv_close((uv_handle_t *)&a->listener, listener_closed);
    return rc;
}

int admin_port(const admin_t *a)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    int rc = uv_tcp_getsockname(&a->listener, (struct sockaddr *)&ss, &len);
    if (rc != 0)
        return rc;
    if (ss.ss_family == AF_INET)
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return UV_EINVAL;
}

void admin_close(admin_t *a)
{
    if (a == NULL || a->closing)
        return;
    a->closing = true;
    while (a->conns != NULL)
        admin_conn_close(a->conns);
    uv_close((uv_handle_t *)&a->listener, listener_closed);
    uv_close((uv_handle_t *)&a->sweep, sweep_closed);
}
