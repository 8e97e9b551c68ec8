/*
 * handshake.c: a session connection before it is served.  It owns the
 * client's address as the daemon reports it (conn->peer: the socket's
 * peer, or the client a trusted balancer names in a PROXY protocol header),
 * the reading of that header from peers --proxy-from lists, and the bounds
 * on a connection that has not authenticated yet: the --auth-timeout
 * deadline, the shorter line limit (HANDSHAKE_LINE_MAX) and, at
 * --max-connections, the room a new connection takes from the oldest one
 * still in its handshake.
 *
 * A connection is in its handshake from its accept until it has sent its
 * PROXY header (if its peer is listed) and, with a token set, its auth.
 * Those connections are on server->handshake in accept order, which is
 * also the order of their deadlines, so one timer serves the list.  One
 * that overstays its auth gets one auth_required line and is closed as a
 * line_too_long one is (its replies written first); one that is made room
 * for gets one too_many_connections line the same way.  A peer that
 * --proxy-from lists and whose first bytes are not a valid header, or
 * that sends none in time, is closed at once with a log line: it is a
 * balancer that is misconfigured, not a client.
 *
 * DESIGN.  Loop thread only; no lock.  conn.c calls in through
 * conn_hooks_t (at accept, on each read while the header is awaited, at
 * the limit and at the close), and this file calls conn.c, so that calls
 * go one way; dispatch.c calls in when an auth succeeds.  Design:
 * docs/design.md, "Connections at their edges".
 */
#include "handshake_int.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn_int.h"
#include "server/base/log.h"

static void handshake_timer_cb(uv_timer_t *h);

void handshake__init(server_t *s)
{
    TAILQ_INIT(&s->handshake);
    uv_timer_init(&s->loop, &s->handshake_timer);
}

size_t handshake__line_max(const server_config_t *cfg)
{
    if (config_auth_on(cfg) && cfg->max_line > HANDSHAKE_LINE_MAX)
        return HANDSHAKE_LINE_MAX;
    return cfg->max_line;
}

/* ---- The client's address ---- */

/* Formats `family` address `addr` and `port` into `out`. */
static void peer_format(char *out, int family, const void *addr, unsigned port)
{
    char host[INET6_ADDRSTRLEN] = "?";

    if (inet_ntop(family, addr, host, sizeof(host)) == NULL)
        strcpy(host, "?");
    snprintf(out, SERVER_PEER_MAX, family == AF_INET6 ? "[%s]:%u" : "%s:%u", host, port);
}

/* Whether `sa` lies in one of the --proxy-from networks.  An IPv4 client
 * of a dual-stack socket (::ffff:a.b.c.d) matches an IPv4 network. */
static bool peer_listed(const server_config_t *cfg, const struct sockaddr_storage *sa)
{
    const uint8_t *a;
    int family = sa->ss_family;

    if (family == AF_INET) {
        a = (const uint8_t *)&((const struct sockaddr_in *)sa)->sin_addr;
    } else if (family == AF_INET6) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        a = a6->s6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a6)) {
            family = AF_INET;
            a += 12;
        }
    } else {
        return false;
    }
    for (size_t i = 0; i < cfg->nproxy_from; i++) {
        const config_net_t *net = &cfg->proxy_from[i];
        unsigned b = 0;
        if (net->family != family)
            continue;
        for (; b + 8 <= net->prefix && a[b / 8] == net->addr[b / 8]; b += 8)
            ;
        if (b + 8 <= net->prefix)
            continue;
        if (b < net->prefix) {
            uint8_t mask = (uint8_t)(0xffu << (8 - (net->prefix - b)));
            if ((a[b / 8] & mask) != net->addr[b / 8])
                continue;
        }
        return true;
    }
    return false;
}

/* ---- The handshake list ---- */

static void handshake_arm(server_t *s)
{
    conn_t *first = TAILQ_FIRST(&s->handshake);
    uint64_t now = uv_now(&s->loop);

    while (first != NULL && first->handshake_until == 0)
        first = TAILQ_NEXT(first, handshake_link);
    if (first == NULL) {
        uv_timer_stop(&s->handshake_timer);
        return;
    }
    uv_timer_start(&s->handshake_timer, handshake_timer_cb,
                   first->handshake_until > now ? first->handshake_until - now : 0, 0);
}

static void handshake_leave(conn_t *c)
{
    if (!c->in_handshake)
        return;
    TAILQ_REMOVE(&c->server->handshake, c, handshake_link);
    c->in_handshake = false;
    /* The timer stays set for the old head: it rearms when it fires. */
}

/* Whether `c` still has its handshake ahead: a PROXY header, or an auth. */
static bool handshake_pending(const conn_t *c)
{
    return c->proxy != NULL || (config_auth_on(c->server->cfg) && !c->authed);
}

/* Ends the service of `c`, still in its handshake: one error line, then the
 * close once every reply is written (as after line_too_long). */
static void handshake_refuse(conn_t *c, int code, const char *message, metrics_close_t why)
{
    slotd_error_t err;

    handshake_leave(c);
    metrics_count_conn_closed(why);
    slotd_error_set(&err, code, "%s", message);
    /* Nothing is pending before an auth (every line is answered at once),
     * so the line goes out last; if something were, it would go without. */
    if (c->order_head == NULL && proto_reply_error(&c->out, NULL, &err) == SLOTD_OK)
        metrics_count_error(code);
    conn__end_input(c);
    /* Written now: from a timer, the end of this turn may be a while off. */
    conn__write(c);
    conn__update(c);
}

static void handshake_timer_cb(uv_timer_t *h)
{
    server_t *s = container_of(h, server_t, handshake_timer);
    uint64_t now = uv_now(&s->loop);
    char msg[128];
    conn_t *c;

    snprintf(msg, sizeof(msg), "no auth within %" PRIu32 " s; the connection is closed",
             s->cfg->auth_timeout);
    while ((c = TAILQ_FIRST(&s->handshake)) != NULL && c->handshake_until != 0 &&
           c->handshake_until <= now) {
        if (c->proxy != NULL) {
            /* A balancer that sent no header: nothing to tell it. */
            log_warn("connection %" PRIu64 " from %s: no PROXY header within %" PRIu32
                     " s; --proxy-from lists this peer: closing it",
                     c->serial, c->peer, s->cfg->auth_timeout);
            handshake_leave(c);
            metrics_count_conn_closed(METRICS_CLOSE_PROXY_HEADER);
            conn__close(c);
            continue;
        }
        log_debug("connection %" PRIu64 " from %s: no auth within %" PRIu32 " s; closing it",
                  c->serial, c->peer, s->cfg->auth_timeout);
        handshake_refuse(c, SLOTD_EAUTH_REQUIRED, msg, METRICS_CLOSE_AUTH_TIMEOUT);
    }
    handshake_arm(s);
}

bool handshake__make_room(server_t *s)
{
    conn_t *c = TAILQ_FIRST(&s->handshake);
    char msg[160];

    if (c == NULL) {
        /* None open: a connection that never authenticated may still
         * linger after its close (a line too long before its auth, say).
         * It would hold its place for up to CONN_LINGER_MS, and it has
         * nothing of value left to read. */
        if (!config_auth_on(s->cfg))
            return false;
        TAILQ_FOREACH(c, &s->linger, wait_link)
        {
            if (!c->authed) {
                log_debug("connection %" PRIu64 " from %s: lingering ended before its auth, to "
                          "make room for a new connection",
                          c->serial, c->peer);
                conn__linger_cut(c);
                return true;
            }
        }
        return false;
    }
    log_debug("connection %" PRIu64 " from %s: closed before its %s, to make room for a new "
              "connection",
              c->serial, c->peer, c->proxy != NULL ? "PROXY header" : "auth");
    snprintf(msg, sizeof(msg),
             "the daemon serves at most %u connections, and this one made room for a newer one "
             "before it authenticated",
             s->cfg->max_connections);
    handshake_refuse(c, SLOTD_ETOO_MANY_CONNECTIONS, msg, METRICS_CLOSE_ROOM);
    return true;
}

/* ---- The connection's side ---- */

void handshake__begin(conn_t *c)
{
    server_t *s = c->server;
    struct sockaddr_storage ss = {.ss_family = AF_UNSPEC};
    int len = sizeof(ss);
    bool listed = false;

    /* The framer is fresh, nothing in it yet: it starts at the limit of a
     * connection before its auth. */
    proto_framer_free(&c->framer);
    proto_framer_init(&c->framer, handshake__line_max(s->cfg));
    strcpy(c->peer, "?");
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET6) {
            const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
            peer_format(c->peer, AF_INET6, &a->sin6_addr, ntohs(a->sin6_port));
        } else if (ss.ss_family == AF_INET) {
            const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
            peer_format(c->peer, AF_INET, &a->sin_addr, ntohs(a->sin_port));
        }
        listed = peer_listed(s->cfg, &ss);
    }
    if (listed) {
        c->proxy = malloc(sizeof(*c->proxy));
        if (c->proxy == NULL) {
            log_error("connection %" PRIu64 ": no memory for its PROXY header; closing it",
                      c->serial);
            conn__close(c);
            return;
        }
        proto_proxy_init(c->proxy);
    }
    log_debug("connection %" PRIu64 ": accepted from %s%s", c->serial, c->peer,
              listed ? " (a --proxy-from peer: a PROXY header first)" : "");
    if (!handshake_pending(c))
        return;
    c->in_handshake = true;
    c->handshake_until =
        s->cfg->auth_timeout > 0 ? uv_now(&s->loop) + (uint64_t)s->cfg->auth_timeout * 1000 : 0;
    TAILQ_INSERT_TAIL(&s->handshake, c, handshake_link);
    if (TAILQ_FIRST(&s->handshake) == c)
        handshake_arm(s);
}

size_t handshake__proxy_read(conn_t *c, const char *data, size_t len)
{
    proto_proxy_t *p = c->proxy;
    slotd_error_t err;
    size_t used = 0;
    int rc = proto_proxy_feed(p, data, len, &used, &err);
    char was[SERVER_PEER_MAX];

    if (rc == PROTO_PROXY_MORE)
        return used;
    if (rc != SLOTD_OK) {
        log_warn("connection %" PRIu64 " from %s: %s; --proxy-from lists this peer, so its "
                 "connections must begin with a valid PROXY header: closing it",
                 c->serial, c->peer, err.message);
        metrics_count_conn_closed(METRICS_CLOSE_PROXY_HEADER);
        conn__close(c);
        return len;
    }
    strcpy(was, c->peer);
    if (p->family == PROTO_PROXY_INET)
        peer_format(c->peer, AF_INET, p->src, p->src_port);
    else if (p->family == PROTO_PROXY_INET6)
        peer_format(c->peer, AF_INET6, p->src, p->src_port);
    log_debug("connection %" PRIu64 ": PROXY v%d header from %s: the client is %s", c->serial,
              p->version, was, c->peer);
    free(c->proxy);
    c->proxy = NULL;
    if (!handshake_pending(c))
        handshake_leave(c);
    return used;
}

void handshake__authed(conn_t *c)
{
    proto_framer_raise_limit(&c->framer, c->server->cfg->max_line);
    if (!handshake_pending(c))
        handshake_leave(c);
}

void handshake__end(conn_t *c)
{
    handshake_leave(c);
    free(c->proxy);
    c->proxy = NULL;
}
