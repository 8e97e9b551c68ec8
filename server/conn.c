/*
 * conn.c: a session connection's socket, from accept to free.  It owns the
 * connection struct and its handle: reading (the read buffer, the framer
 * fed through conn_hooks_t, reading stopped and resumed by the bounds),
 * writing (`out` and the write in flight, output held for a pipelined
 * burst: conn__hold_output()), the close, lingering when the peer's input
 * may not all be read or (in a drain) may still come, then until the peer
 * has taken every reply (SIOCOUTQ), the drain's last read
 * (conn__drain_input()), the connections turned away, and the server's
 * timed lists of quiet (--conn-timeout), lingering and delivering
 * connections with their timers.  It also owns the connection's bounds:
 * the reply bytes held and reserved, the pool room pending, and the parked
 * jobs (conn_int.h; the other files change them only through its
 * functions).
 *
 * DESIGN.  Loop thread only; no lock.  What a line means, and the requests
 * and sessions of a connection, belong to the files above it (dispatch.c,
 * session.c, launch.c): conn.c reaches them only through conn_hooks_t, so
 * that calls go one way.  A record whose job is out counts in `refs`, so the struct
 * outlives the handle until the last job is back.
 *
 * Design: docs/design.md, "Connections at their edges" and "server/ layout".
 */
#include "conn_int.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <linux/sockios.h> /* SIOCOUTQ */

#include "server/base/log.h"

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void read_cb(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);
static void wait_add(server_t *s, conn_t *c, conn_wait_t which, uint64_t until);
static uint64_t linger_until(server_t *s);
static uint64_t linger_hard_until(server_t *s);

/* ---- The connection's lifetime ---- */

static void conn_free(conn_t *c)
{
    server_t *s = c->server;

    assert(c->closed && c->refs == 0 && c->sessions == NULL && c->order_head == NULL);
    assert(!c->dirty && c->wait == CONN_WAIT_NONE);
    s->hooks.freeing(c);
    proto_framer_free(&c->framer);
    session_map_free(&c->map);
    proto_buf_free(&c->out);
    proto_buf_free(&c->wbuf);
    free(c);
    s->nconns_alive--;
    s->hooks.freed(s);
}

void conn__unref(conn_t *c)
{
    assert(c->refs > 0);
    if (--c->refs == 0)
        conn_free(c);
}

static void conn_close_cb(uv_handle_t *h)
{
    conn_t *c = container_of((uv_tcp_t *)h, conn_t, tcp);

    c->server->nsockets--;
    conn__unref(c);
}

static void conn_close_handle(conn_t *c)
{
    if (c->handle_closing)
        return;
    c->handle_closing = true;
    conn__wait_remove(c->server, c);
    uv_close((uv_handle_t *)&c->tcp, conn_close_cb);
}

static void linger_end(conn_t *c)
{
    log_debug("connection %" PRIu64 ": closed after lingering (%zu bytes discarded)", c->serial,
              c->linger_bytes);
    conn_close_handle(c);
}

void conn__linger_cut(conn_t *c)
{
    if (c->wait != CONN_WAIT_LINGER && c->wait != CONN_WAIT_DELIVER)
        return;
    conn__wait_remove(c->server, c);
    linger_end(c);
}

/* Bytes of the connection's send queue the peer has not acknowledged yet
 * (0 when the socket cannot tell). */
static int conn_unsent(conn_t *c)
{
    uv_os_fd_t fd;
    int unsent = 0;

    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0 || ioctl(fd, SIOCOUTQ, &unsent) != 0)
        return 0;
    return unsent;
}

/* The lingering close is past its bytes or its time: closes once the peer
 * has taken every reply, since a close that meets input resets the
 * connection and the kernel then drops what its send queue still holds
 * (behind a proxy, the peer sees a reply cut short and an EOF).  Until
 * then, and at most until `linger_hard`, the input is still discarded. */
static void linger_over(conn_t *c)
{
    server_t *s = c->server;
    int unsent;

    if (c->wait == CONN_WAIT_DELIVER)
        return;
    unsent = conn_unsent(c);
    if (unsent == 0 || c->linger_hard <= uv_now(&s->loop)) {
        if (unsent > 0)
            log_debug("connection %" PRIu64 ": closed with %d bytes not taken by the peer",
                      c->serial, unsent);
        linger_end(c);
        return;
    }
    wait_add(s, c, CONN_WAIT_DELIVER, c->linger_hard);
}

static void linger_read_cb(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    conn_t *c = container_of((uv_tcp_t *)stream, conn_t, tcp);

    (void)buf;
    if (nread > 0)
        c->linger_bytes += (size_t)nread;
    if (nread < 0) /* the peer's EOF (nothing more can come), or a dead socket */
        linger_end(c);
    else if (c->linger_bytes >= CONN_LINGER_MAX_BYTES)
        linger_over(c);
}

static void linger_shutdown_cb(uv_shutdown_t *req, int status)
{
    conn_t *c = container_of(req, conn_t, shutdown_req);

    if (status < 0 && !c->handle_closing)
        linger_end(c);
}

/* Ends the connection's service: off the server's lists, not read any
 * more; its requests and sessions go through conn_hooks_t.detach.  The
 * handle is closed by the caller. */
static void conn_detach(conn_t *c)
{
    server_t *s = c->server;

    c->closed = true;
    conn__wait_remove(s, c);
    s->hooks.closing(c);
    c->reading = false;
    c->release_reason = s->draining ? METRICS_RELEASE_SHUTDOWN : METRICS_RELEASE_DISCONNECT;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    s->nconns--;
    s->hooks.detach(c);
    /* Its requests are dropped or canceled: nothing counts any more. */
    c->park_head = c->park_tail = NULL;
    c->held_bytes = 0;
    c->reserved = 0;
    c->pending_bytes = 0;
    c->pending_slots = 0;
}

/* ---- Parked jobs ---- */

void conn__park(conn_t *c, req_t *r)
{
    req_t **p;

    if (c->park_tail == NULL || c->park_tail->seq < r->seq) {
        r->park_next = NULL;
        if (c->park_tail != NULL)
            c->park_tail->park_next = r;
        else
            c->park_head = r;
        c->park_tail = r;
        return;
    }
    /* A session's request whose turn came after later lines were parked. */
    for (p = &c->park_head; (*p)->seq < r->seq; p = &(*p)->park_next)
        ;
    r->park_next = *p;
    *p = r;
}

req_t *conn__park_pop(conn_t *c)
{
    req_t *r = c->park_head;

    if (r == NULL)
        return NULL;
    c->park_head = r->park_next;
    if (c->park_head == NULL)
        c->park_tail = NULL;
    r->park_next = NULL;
    return r;
}

/* Closes at once: conn_detach(), then the handle.  Idempotent. */
void conn__close(conn_t *c)
{
    if (c->closed)
        return;
    conn_detach(c);
    log_debug("connection %" PRIu64 ": closed", c->serial);
    conn_close_handle(c);
}

/* Whether the peer may have sent input the daemon has not read: always
 * after line_too_long (the rest of the line is likely still coming), never
 * after its EOF, and otherwise if the socket holds unread bytes. */
static bool conn_input_left(conn_t *c)
{
    uv_os_fd_t fd;
    int unread = 0;

    if (c->peer_eof)
        return false;
    if (c->line_too_long)
        return true;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0 || ioctl(fd, FIONREAD, &unread) != 0)
        return true;
    return unread > 0;
}

/* Everything is answered and written, and the peer's input may not have
 * been read to its end: closes lingering (server_int.h, CONN_LINGER_MS). */
static void conn_close_lingering(conn_t *c)
{
    server_t *s = c->server;
    uint64_t now = uv_now(&s->loop), until = linger_until(s);

    conn_detach(c);
    c->linger_hard = linger_hard_until(s);
    uv_read_stop((uv_stream_t *)&c->tcp);
    if (until <= now ||
        uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->tcp, linger_shutdown_cb) != 0 ||
        uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, linger_read_cb) != 0) {
        log_debug("connection %" PRIu64 ": closed", c->serial);
        conn_close_handle(c);
        return;
    }
    wait_add(s, c, CONN_WAIT_LINGER, until);
    log_debug("connection %" PRIu64 ": closed; lingering for its input", c->serial);
}

/* After any progress: closes a connection whose input is over once all is
 * answered and written; otherwise stops or resumes reading by the bounds. */
void conn__update(conn_t *c)
{
    server_t *s = c->server;
    size_t pending;

    if (c->closed)
        return;
    if (c->park_head != NULL && !s->draining) /* the call only when a job is parked */
        s->hooks.run_parked(c);
    if (c->input_done) {
        if (c->order_head == NULL && !c->writing && c->out.len == 0) {
            /* In a drain the peer may not have read its last answers and
             * may still send: a line sent after a plain close would draw
             * a reset, and the reset would destroy those answers. */
            if (conn_input_left(c) || (s->draining && !c->peer_eof))
                conn_close_lingering(c);
            else
                conn__close(c);
        }
        return;
    }
    /* Quiet: no session, nothing to answer or write.  Its clock starts
     * when it becomes quiet; a byte read takes it off the list (read_cb())
     * and the clock starts again after. */
    if (s->cfg->conn_timeout > 0 && !s->draining) {
        bool quiet = c->sessions == NULL && c->order_head == NULL && !c->writing && c->out.len == 0;
        if (quiet && c->wait != CONN_WAIT_QUIET)
            wait_add(s, c, CONN_WAIT_QUIET,
                     uv_now(&s->loop) + (uint64_t)s->cfg->conn_timeout * 1000);
        else if (!quiet && c->wait == CONN_WAIT_QUIET)
            conn__wait_remove(s, c);
    }
    pending = conn__unwritten(c) + c->held_bytes;
    if (c->reading) {
        if (c->outstanding >= CONN_MAX_OUTSTANDING || pending >= CONN_MAX_PENDING_BYTES) {
            uv_read_stop((uv_stream_t *)&c->tcp);
            c->reading = false;
        }
    } else if (c->outstanding < CONN_MAX_OUTSTANDING / 2 && pending < CONN_MAX_PENDING_BYTES / 2) {
        c->reading = true;
        uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
    }
}

/* Ends the input: nothing more is read; the connection closes once every
 * request already read is answered and written. */
void conn__end_input(conn_t *c)
{
    if (c->reading)
        uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = false;
    c->input_done = true;
    c->drain_left = 0;
}

static void write_cb(uv_write_t *req, int status)
{
    conn_t *c = container_of(req, conn_t, write_req);

    c->writing = false;
    c->wbuf.len = 0;
    if (c->wbuf.cap > CONN_MAX_PENDING_BYTES / 4) {
        proto_buf_free(&c->wbuf);
        proto_buf_init(&c->wbuf);
    }
    if (status < 0) {
        if (!c->closed)
            log_debug("connection %" PRIu64 ": write failed: %s", c->serial, uv_strerror(status));
        conn__close(c);
        return;
    }
    if (c->out.len > 0)
        conn__mark_dirty(c->server, c);
    conn__update(c);
}

bool conn__hold_output(conn_t *c, uint64_t *now_ns)
{
    uint64_t hold_ns = (uint64_t)c->server->cfg->reply_hold_us * 1000u;

    if (hold_ns == 0 || c->refs <= 1 || c->closed || c->writing || c->out.len == 0 ||
        c->out.len >= CONN_HOLD_MAX_BYTES)
        return false;
    if (*now_ns == 0)
        *now_ns = uv_hrtime();
    if (c->held_since == 0)
        c->held_since = *now_ns;
    return *now_ns - c->held_since < hold_ns;
}

void conn__write(conn_t *c)
{
    proto_buf_t t;
    uv_buf_t b;
    int n, rc;

    if (c->closed || c->writing || c->out.len == 0)
        return;
    c->held_since = 0;
    metrics_count_socket_write();
    /* What the socket takes at once costs one write(); a uv_write (which
     * also arms the poller) only for the rest. */
    b = uv_buf_init(c->out.data, (unsigned)c->out.len);
    n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    if (n < 0 && n != UV_EAGAIN) {
        log_debug("connection %" PRIu64 ": write failed: %s", c->serial, uv_strerror(n));
        conn__close(c);
        return;
    }
    if (n == (int)c->out.len) {
        c->out.len = 0;
        if (c->out.cap > CONN_MAX_PENDING_BYTES / 4) { /* as write_cb() does */
            proto_buf_free(&c->out);
            proto_buf_init(&c->out);
        }
        conn__update(c);
        return;
    }
    t = c->wbuf;
    c->wbuf = c->out;
    c->out = t;
    n = n > 0 ? n : 0;
    b = uv_buf_init(c->wbuf.data + n, (unsigned)(c->wbuf.len - (size_t)n));
    rc = uv_write(&c->write_req, (uv_stream_t *)&c->tcp, &b, 1, write_cb);
    if (rc != 0) {
        log_debug("connection %" PRIu64 ": write failed: %s", c->serial, uv_strerror(rc));
        c->wbuf.len = 0;
        conn__close(c);
        return;
    }
    c->writing = true;
}

/* ---- Reading ---- */

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn_t *c = container_of((uv_tcp_t *)h, conn_t, tcp);

    buf->base = c->server->readbuf;
    buf->len = sizeof(c->server->readbuf);
    if (c->drain_left > 0 && c->drain_left < buf->len)
        buf->len = c->drain_left; /* not a byte sent after the drain */
}

static void read_cb(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    conn_t *c = container_of((uv_tcp_t *)stream, conn_t, tcp);
    const char *data = buf->base;
    size_t len = nread > 0 ? (size_t)nread : 0;
    int rc;

    if (nread == 0)
        return;
    if (nread < 0) {
        if (nread == UV_EOF) {
            log_debug("connection %" PRIu64 ": end of input", c->serial);
            c->peer_eof = true;
            conn__end_input(c);
            conn__update(c);
        } else {
            log_debug("connection %" PRIu64 ": read failed: %s", c->serial,
                      uv_strerror((int)nread));
            conn__close(c);
        }
        return;
    }

    metrics_count_socket_read();
    c->read_ns = server__turn_ns(c->server); /* each line's, for the wait metrics */
    if (c->wait == CONN_WAIT_QUIET)
        conn__wait_remove(c->server, c); /* not quiet: conn__update() starts the clock again */
    if (c->proxy != NULL) {              /* a PROXY header first */
        size_t used = c->server->hooks.preamble(c, data, len);
        if (c->closed)
            return;
        data += used;
        len -= used;
    }
    if (c->drain_left > 0) {
        rc = proto_framer_feed(&c->framer, data, len, c->server->hooks.drain_line, c);
        if (c->closed)
            return;
        c->drain_left -= (size_t)nread < c->drain_left ? (size_t)nread : c->drain_left;
        if (c->drain_left == 0 && rc == SLOTD_OK)
            conn__end_input(c);
    } else {
        rc = proto_framer_feed(&c->framer, data, len, c->server->hooks.line, c);
    }
    if (c->closed)
        return;
    if (rc == SLOTD_ELINE_TOO_LONG) {
        c->server->hooks.line_too_long(c); /* ends the input */
    } else if (rc != SLOTD_OK) {
        log_error("connection %" PRIu64 ": no memory for a request; closing it", c->serial);
        conn__close(c);
        return;
    }
    conn__update(c);
}

/* ---- Accept, drain ---- */

void conn__turn_away(int fd, const char *why)
{
    char line[200];
    int n = snprintf(line, sizeof(line),
                     "{\"error\":{\"code\":\"too_many_connections\",\"message\":\"%s\"}}\n", why);

    /* Best effort: the socket is fresh, its buffer empty.  What the client
     * already sent is read and dropped before the close (up to 64 KiB,
     * without waiting): closing with input unread would send a reset, and
     * the reset could destroy the line before the client reads it. */
    if (n > 0 && (size_t)n < sizeof(line) && write(fd, line, (size_t)n) < 0)
        log_debug("turning a connection away: %s", strerror(errno));
    else
        metrics_count_error(SLOTD_ETOO_MANY_CONNECTIONS); /* an error reply sent */
    shutdown(fd, SHUT_WR);
    for (int i = 0; i < 16; i++) {
        char sink[4096];
        if (recv(fd, sink, sizeof(sink), MSG_DONTWAIT) <= 0)
            break;
    }
    close(fd);
}

void conn__accept(server_t *s, int fd)
{
    char why[120];
    conn_t *c;
    int rc;

    /* Lingering sockets count: each holds a descriptor until it ends.  At
     * the limit, one still in its handshake makes room if there is one. */
    if (s->nsockets >= s->cfg->max_connections && !s->hooks.make_room(s)) {
        metrics_count_refused();
        snprintf(why, sizeof(why), "the daemon serves at most %u connections",
                 s->cfg->max_connections);
        conn__turn_away(fd, why);
        log_debug("connection turned away: %u open", s->cfg->max_connections);
        return;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL || session_map_init(&c->map) != SLOTD_OK) {
        free(c);
        log_error("no memory for a connection; turning it away");
        conn__turn_away(fd, "the daemon is out of memory");
        return;
    }
    uv_tcp_init(&s->loop, &c->tcp);
    c->server = s;
    c->refs = 1;
    c->serial = ++s->next_serial;
    worker_flow_init(&c->flow);
    proto_framer_init(&c->framer, s->cfg->max_line);
    proto_buf_init(&c->out);
    proto_buf_init(&c->wbuf);
    c->next = s->conns;
    if (s->conns != NULL)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    s->nconns_alive++;
    s->nsockets++;

    rc = uv_tcp_open(&c->tcp, (uv_os_sock_t)fd);
    if (rc != 0)
        close(fd); /* the handle did not take it */
    else
        rc = uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
    if (rc != 0) {
        log_debug("accept failed: %s", uv_strerror(rc));
        conn__close(c);
        return;
    }
    c->reading = true;
    uv_tcp_nodelay(&c->tcp, 1);
    s->hooks.accepted(c); /* its client's address, its PROXY header, its auth */
    if (c->closed)
        return;
    conn__update(c); /* quiet from the start */
}

static void expire_quiet(conn_t *c)
{
    log_debug("connection %" PRIu64 ": quiet for %u s with nothing to do; closing it", c->serial,
              c->server->cfg->conn_timeout);
    metrics_count_conn_timeout();
    conn__close(c);
}

/* A drain ends the input, but not before every complete line the peer
 * had sent by then is answered: what the socket holds at this moment is
 * still read, by read_cb() under the usual bounds (so only as fast as the
 * client reads its answers), and not a byte more (alloc_cb()); each line
 * in it is answered shutting_down.  What the peer sends after the drain
 * began is discarded by the lingering close. */
void conn__drain_input(conn_t *c)
{
    uv_os_fd_t fd;
    int unread = 0;

    if (!c->input_done && uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0 &&
        ioctl(fd, FIONREAD, &unread) == 0 && unread > 0)
        c->drain_left = (size_t)unread;
    else
        conn__end_input(c);
}

void conn__mark_dirty(server_t *s, conn_t *c)
{
    if (c->dirty)
        return;
    c->dirty = true;
    c->dirty_next = s->dirty;
    s->dirty = c;
}

/* ---- Quiet and lingering connections ---- */

static void quiet_timer_cb(uv_timer_t *h);
static void linger_timer_cb(uv_timer_t *h);
static void deliver_timer_cb(uv_timer_t *h);

/* The list, timer and callback of a wait other than CONN_WAIT_NONE. */
static conn_list_t *wait_list(server_t *s, conn_wait_t which, uv_timer_t **t, uv_timer_cb *cb)
{
    switch (which) {
    case CONN_WAIT_NONE:
        break;
    case CONN_WAIT_QUIET:
        *t = &s->quiet_timer;
        *cb = quiet_timer_cb;
        return &s->quiet;
    case CONN_WAIT_LINGER:
        *t = &s->linger_timer;
        *cb = linger_timer_cb;
        return &s->linger;
    case CONN_WAIT_DELIVER:
        *t = &s->deliver_timer;
        *cb = deliver_timer_cb;
        return &s->deliver;
    }
    assert(!"no list for CONN_WAIT_NONE");
    return NULL;
}

/* Sets the list's timer for its first deadline, or stops it; the
 * delivering connections' timer polls while there are any. */
static void wait_arm(server_t *s, conn_wait_t which)
{
    uv_timer_t *t;
    uv_timer_cb cb;
    conn_list_t *l = wait_list(s, which, &t, &cb);
    uint64_t now = uv_now(&s->loop);
    conn_t *first = TAILQ_FIRST(l);

    if (first == NULL) {
        uv_timer_stop(t);
        return;
    }
    if (which == CONN_WAIT_DELIVER) {
        if (!uv_is_active((uv_handle_t *)t))
            uv_timer_start(t, cb, CONN_DELIVER_POLL_MS, CONN_DELIVER_POLL_MS);
        return;
    }
    uv_timer_start(t, cb, first->wait_until > now ? first->wait_until - now : 0, 0);
}

static void wait_add(server_t *s, conn_t *c, conn_wait_t which, uint64_t until)
{
    uv_timer_t *t;
    uv_timer_cb cb;
    conn_list_t *l = wait_list(s, which, &t, &cb);

    conn__wait_remove(s, c);
    assert(which == CONN_WAIT_DELIVER || TAILQ_EMPTY(l) ||
           TAILQ_LAST(l, conn_list)->wait_until <= until);
    c->wait = which;
    c->wait_until = until;
    TAILQ_INSERT_TAIL(l, c, wait_link);
    if (TAILQ_FIRST(l) == c)
        wait_arm(s, which);
}

void conn__wait_remove(server_t *s, conn_t *c)
{
    uv_timer_t *t;
    uv_timer_cb cb;
    conn_list_t *l;

    if (c->wait == CONN_WAIT_NONE)
        return;
    l = wait_list(s, c->wait, &t, &cb);
    TAILQ_REMOVE(l, c, wait_link);
    c->wait = CONN_WAIT_NONE;
    /* The timer stays set for the old head: it rearms when it fires. */
}

/* Ends the wait of every connection on the list whose deadline passed. */
static void wait_expire(server_t *s, conn_wait_t which)
{
    uv_timer_t *t;
    uv_timer_cb cb;
    conn_list_t *l = wait_list(s, which, &t, &cb);
    uint64_t now = uv_now(&s->loop);
    conn_t *c;

    while ((c = TAILQ_FIRST(l)) != NULL && c->wait_until <= now) {
        conn__wait_remove(s, c);
        if (which == CONN_WAIT_QUIET)
            expire_quiet(c);
        else
            linger_over(c);
    }
    wait_arm(s, which);
}

static void quiet_timer_cb(uv_timer_t *h)
{
    wait_expire(container_of(h, server_t, quiet_timer), CONN_WAIT_QUIET);
}

static void linger_timer_cb(uv_timer_t *h)
{
    wait_expire(container_of(h, server_t, linger_timer), CONN_WAIT_LINGER);
}

/* Closes every delivering connection whose peer has taken all its
 * replies, or whose hard deadline passed. */
static void deliver_timer_cb(uv_timer_t *h)
{
    server_t *s = container_of(h, server_t, deliver_timer);
    uint64_t now = uv_now(&s->loop);
    conn_t *c, *next;

    for (c = TAILQ_FIRST(&s->deliver); c != NULL; c = next) {
        next = TAILQ_NEXT(c, wait_link);
        if (c->wait_until <= now || conn_unsent(c) == 0) {
            conn__wait_remove(s, c);
            linger_over(c);
        }
    }
    wait_arm(s, CONN_WAIT_DELIVER);
}

/* ---- Lingering in a drain ---- */

/* The latest a drain lets a lingering close go on: a little before
 * --shutdown-timeout. */
static uint64_t linger_cap_ms(const server_t *s)
{
    uint64_t timeout = (uint64_t)s->cfg->shutdown_timeout * 1000;
    uint64_t spare = timeout / 4 < 500 ? timeout / 4 : 500;

    return s->drain_deadline - spare;
}

static uint64_t linger_until(server_t *s)
{
    uint64_t until = uv_now(&s->loop) + CONN_LINGER_MS;

    if (s->draining && until > linger_cap_ms(s))
        until = linger_cap_ms(s);
    return until;
}

static uint64_t linger_hard_until(server_t *s)
{
    uint64_t until = uv_now(&s->loop) + CONN_LINGER_HARD_MS;

    if (s->draining && until > linger_cap_ms(s))
        until = linger_cap_ms(s);
    return until;
}

/* A drain began: no lingering close may outlast it (linger_until() and
 * linger_hard_until() cap the ones that begin later the same way).  The
 * cap is the same for every one, so the list stays in deadline order. */
void conn__linger_cap(server_t *s)
{
    uint64_t cap = linger_cap_ms(s);
    conn_t *c;

    for (c = TAILQ_FIRST(&s->linger); c != NULL; c = TAILQ_NEXT(c, wait_link)) {
        if (c->wait_until > cap)
            c->wait_until = cap;
        if (c->linger_hard > cap)
            c->linger_hard = cap;
    }
    for (c = TAILQ_FIRST(&s->deliver); c != NULL; c = TAILQ_NEXT(c, wait_link))
        if (c->wait_until > cap)
            c->wait_until = cap;
    wait_arm(s, CONN_WAIT_LINGER);
}
