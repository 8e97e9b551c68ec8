/*
 * admin_http.c: HTTP/1.x request handling for one admin connection, with
 * http-parser and no I/O of its own.
 *
 * Owns the parser, a copy of the URL of the request being read, a scratch
 * buffer for response bodies, and input held back while the caller drains a
 * large output.  Routes:
 *
 *   GET /health   200 {"status":"ok"}, or 503 {"status":"<reason>"} with
 *                 the reason from the healthy hook ("draining" if none);
 *   GET /stats    200 application/json, the stats object as the `stats` op
 *                 writes it (proto_reply_stats() with no tag), trailing
 *                 newline kept;
 *   GET /metrics  200 text/plain; version=0.0.4, from metrics_render();
 *   POST /prefix-cache/flush  200 {"flushed_entries":N}: the prefix cache
 *                 gives up every entry only it holds (the prefix_flush
 *                 hook; 404 without it, as GET is 405);
 *   POST /tenants/reload  rereads the tenants file as SIGHUP does (the
 *                 tenants_reload hook): 200 {"reloaded":true,"tenants":N,
 *                 "revoked":M}, else {"reloaded":false,"error":REASON}
 *                 with 409 (no tenants file), 422 (the file refused,
 *                 nothing changed) or 503 (no memory);
 *   GET /sessions 200 application/json with at most ?limit=N sessions
 *                 (ADMIN_HTTP_SESSIONS_DEFAULT): the caller has the body
 *                 built (ADMIN_HTTP_WAIT, admin_http_complete()) and it
 *                 goes out ADMIN_HTTP_SLICE bytes per resume; 400 for any
 *                 other query (404 without the hook).
 *
 * With a token (admin_hooks_t.token), every route but /health asks for
 * "Authorization: Bearer <token>" and is 401 with "WWW-Authenticate:
 * Bearer" without it.  Other methods, unknown paths, oversized or
 * malformed requests and pipelining are described in the design.
 *
 * DESIGN.  Single-threaded: one admin_http_t is used by one thread at a
 * time; see admin_http_int.h.  No lock.  The http-parser header limit is
 * process-wide, set by the first admin_http_new().
 *
 * Design: docs/design.md, "The admin port's HTTP".
 */
#include "admin_http_int.h"

#include <ctype.h>
#include <http_parser.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "server/base/auth.h"
#include "server/base/log.h"
#include "metrics.h"

/* "Bearer " and the longest token, with room to see a longer value. */
#define AUTHZ_MAX (7 + AUTH_TOKEN_MAX + 1)

typedef struct response {
    int status;
    const char *content_type;
    const char *extra; /* more header lines, each ending "\r\n", or NULL */
    const char *body;
    size_t body_len;
    bool head; /* send the headers only */
    bool close;
    bool keep_alive_10; /* an HTTP/1.0 keep-alive: say so */
    bool body_later;    /* append the headers only: the body follows in slices */
} response_t;

struct admin_http {
    http_parser parser;
    admin_hooks_t hooks;
    admin_http_clock_fn now_ns;
    proto_buf_t *out;                    /* the caller's, during feed and resume only */
    proto_buf_t body;                    /* scratch for the body being answered */
    proto_buf_t held;                    /* unparsed input held back by ADMIN_HTTP_FULL */
    char url[ADMIN_HTTP_MAX_HEADER + 1]; /* the request line fits the header limit */
    size_t url_len;
    uint64_t body_bytes; /* announced by the chunk headers so far */
    uint64_t req_bytes;  /* parsed since the last request ended */
    bool headers_done;   /* on_headers_complete accepted this request */
    int fail_status;     /* set by a callback that stopped the parser */
    bool nomem;          /* a response could not be appended */
    bool closed;         /* ADMIN_HTTP_CLOSE was returned */
    bool full;           /* ADMIN_HTTP_FULL is pending */
    /* ADMIN_HTTP_WAIT is pending: the response to GET /sessions waits for
     * its body (admin_http_complete()), with these headers. */
    bool waiting;
    size_t wait_limit;
    response_t wait_r;
    proto_buf_t rest; /* a long body's bytes not yet appended, from rest_off */
    size_t rest_off;
    uint64_t responses;
    /* The Authorization header of the request being read, gathered across
     * the parser's header callbacks. */
    char hname[16];       /* the header name being read, lower case */
    size_t hname_len;     /* > sizeof(hname): a longer name */
    bool in_value;        /* the last header callback was a value */
    bool value_is_authz;  /* the value being read is Authorization's */
    unsigned authz_count; /* Authorization headers seen */
    char authz[AUTHZ_MAX + 1];
    size_t authz_len; /* > AUTHZ_MAX: too long to be right */
};

#define PARSER_OWNER(p) ((admin_http_t *)(p)->data)

static uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- Responses ---- */

static const char *status_text(int status)
{
    switch (status) {
    case 200:
        return "OK";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 409:
        return "Conflict";
    case 413:
        return "Payload Too Large";
    case 414:
        return "URI Too Long";
    case 422:
        return "Unprocessable Content";
    case 431:
        return "Request Header Fields Too Large";
    case 503:
        return "Service Unavailable";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return "Internal Server Error";
    }
}

static int append_response(admin_http_t *h, const response_t *r)
{
    char hdr[512];
    int n = snprintf(hdr, sizeof(hdr),
                     "HTTP/1.1 %d %s\r\n"
                     "Content-Type: %s\r\n"
                     "Content-Length: %zu\r\n"
                     "Cache-Control: no-store\r\n"
                     "%s%s\r\n",
                     r->status, status_text(r->status), r->content_type, r->body_len,
                     r->extra ? r->extra : "",
                     r->close           ? "Connection: close\r\n"
                     : r->keep_alive_10 ? "Connection: keep-alive\r\n"
                                        : "");
    if (n < 0 || (size_t)n >= sizeof(hdr))
        return SLOTD_EINVAL;
    size_t body_len = r->head || r->body_later ? 0 : r->body_len;
    if (proto_buf_reserve(h->out, (size_t)n + body_len) != SLOTD_OK)
        return SLOTD_ENOMEM;
    proto_buf_append(h->out, hdr, (size_t)n);
    if (body_len > 0)
        proto_buf_append(h->out, r->body, body_len);
    h->responses++;
    return SLOTD_OK;
}

/* Appends the connection's last response, for a request that could not be
 * read. */
static int append_failure(admin_http_t *h, int status)
{
    char body[64];
    int n = snprintf(body, sizeof(body), "%s\n", status_text(status));
    response_t r = {.status = status,
                    .content_type = "text/plain; charset=utf-8",
                    .body = body,
                    .body_len = (size_t)n,
                    .close = true};
    return append_response(h, &r);
}

/* Appends `s` to `b` as a JSON string. */
static int json_string(proto_buf_t *b, const char *s)
{
    if (proto_buf_append(b, "\"", 1) != SLOTD_OK)
        return SLOTD_ENOMEM;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        int rc;
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            rc = proto_buf_append(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            rc = proto_buf_append(b, esc, 6);
        } else {
            rc = proto_buf_append(b, s, 1);
        }
        if (rc != SLOTD_OK)
            return SLOTD_ENOMEM;
    }
    return proto_buf_append(b, "\"", 1);
}

static void get_stats(admin_http_t *h, proto_stats_t *st)
{
    memset(st, 0, sizeof(*st));
    if (h->hooks.stats != NULL)
        h->hooks.stats(h->hooks.arg, st);
}

/* Wrong Bearer tokens are logged at most once per AUTH_LOG_EVERY_NS, each
 * line with the count since the last one, so that a flood of them cannot
 * fill the disk.  The daemon's admin_http_t all live on the loop thread,
 * so the state is plain. */
#define AUTH_LOG_EVERY_NS 10000000000u
static uint64_t auth_logged_ns; /* now_ns() of the last line */
static uint64_t auth_unlogged;  /* wrong tokens since then */
static bool auth_logged;        /* a line was written */

static void log_auth_failure(const admin_http_t *h)
{
    uint64_t now = h->now_ns();
    auth_unlogged++;
    if (auth_logged && now - auth_logged_ns < AUTH_LOG_EVERY_NS)
        return;
    log_warn("admin port: %" PRIu64 " request%s with a wrong Bearer token%s (answered 401; "
             "at most one such line every %u s)",
             auth_unlogged, auth_unlogged == 1 ? "" : "s",
             auth_logged ? " since the last such line" : "",
             (unsigned)(AUTH_LOG_EVERY_NS / 1000000000u));
    auth_logged = true;
    auth_logged_ns = now;
    auth_unlogged = 0;
}

/* True if no token is set, or the request carries exactly one
 * "Authorization: Bearer <token>" with the right one.  A wrong token is
 * counted; a missing header is not. */
static bool authorized(const admin_http_t *h)
{
    const char *v = h->authz;
    size_t n = h->authz_len;

    if (h->hooks.token_len == 0 && h->hooks.admin_token == NULL)
        return true;
    if (h->authz_count == 0)
        return false;
    if (h->authz_count == 1 && n <= AUTHZ_MAX && n > 7 && strncasecmp(v, "bearer ", 7) == 0) {
        v += 7;
        n -= 7;
        while (n > 0 && *v == ' ') {
            v++;
            n--;
        }
        while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t'))
            n--;
        if (h->hooks.admin_token != NULL ? h->hooks.admin_token(h->hooks.arg, v, n)
                                         : auth_equal(v, n, h->hooks.token, h->hooks.token_len))
            return true;
    }
    metrics_count_auth_failure();
    log_auth_failure(h);
    return false;
}

/* The query of GET /sessions: nothing, or "limit=N" with N a decimal
 * integer in 0..ADMIN_HTTP_SESSIONS_MAX.  0 with the limit in *limit, or
 * -1 for anything else (an unknown or repeated parameter, a bad number). */
static int sessions_query(const char *q, size_t len, size_t *limit)
{
    bool seen = false;
    *limit = ADMIN_HTTP_SESSIONS_DEFAULT;
    while (len > 0) {
        size_t n = 0;
        while (n < len && q[n] != '&')
            n++;
        uint64_t v = 0;
        if (n <= 6 || memcmp(q, "limit=", 6) != 0 || seen || n - 6 > 7)
            return -1;
        for (size_t i = 6; i < n; i++) {
            if (q[i] < '0' || q[i] > '9')
                return -1;
            v = v * 10 + (uint64_t)(q[i] - '0');
        }
        if (v > ADMIN_HTTP_SESSIONS_MAX)
            return -1;
        *limit = (size_t)v;
        seen = true;
        q += n;
        len -= n;
        if (len > 0) { /* the '&': another parameter must follow */
            q++;
            len--;
            if (len == 0)
                return -1;
        }
    }
    return 0;
}

/* What route() returns when the body is built elsewhere (GET /sessions). */
#define ROUTE_WAIT 1

/* Fills h->body and `r` for a GET or HEAD of `path` with `query` (qlen
 * bytes, 0 for none). */
static int route(admin_http_t *h, const char *path, size_t len, const char *query, size_t qlen,
                 response_t *r)
{
#define IS(lit) (len == sizeof(lit) - 1 && memcmp(path, lit, len) == 0)
    proto_stats_t st;
    int rc;

    if ((IS("/stats") || IS("/metrics") || (IS("/sessions") && h->hooks.sessions != NULL)) &&
        !authorized(h)) {
        r->status = 401;
        r->content_type = "text/plain; charset=utf-8";
        r->extra = "WWW-Authenticate: Bearer\r\n";
        return proto_buf_append(&h->body, "Unauthorized\n", 13);
    }
    if (IS("/health")) {
        const char *why = NULL;
        bool ok = h->hooks.healthy == NULL || h->hooks.healthy(h->hooks.arg, &why);
        if (!ok && (why == NULL || *why == '\0'))
            why = "draining";
        r->status = ok ? 200 : 503;
        r->content_type = "application/json";
        rc = proto_buf_append(&h->body, "{\"status\":", 10);
        if (rc == SLOTD_OK)
            rc = json_string(&h->body, ok ? "ok" : why);
        if (rc == SLOTD_OK)
            rc = proto_buf_append(&h->body, "}\n", 2);
        return rc;
    }
    if (IS("/stats")) {
        get_stats(h, &st);
        r->status = 200;
        r->content_type = "application/json";
        return proto_reply_stats(&h->body, NULL, &st);
    }
    if (IS("/sessions") && h->hooks.sessions != NULL) {
        size_t limit;
        if (sessions_query(query, qlen, &limit) != 0) {
            r->status = 400;
            r->content_type = "text/plain; charset=utf-8";
            static const char msg[] =
                "Bad Request: the only parameter is limit=N, N in 0..1000000\n";
            return proto_buf_append(&h->body, msg, sizeof(msg) - 1);
        }
        r->status = 200;
        r->content_type = "application/json";
        h->wait_limit = limit;
        return ROUTE_WAIT;
    }
    if (IS("/metrics")) {
        const char *why = NULL;
        bool draining = false, wedged = false;
        if (h->hooks.health != NULL)
            h->hooks.health(h->hooks.arg, &draining, &wedged);
        /* The gauges are set as they are read, as /health would answer. */
        metrics_healthy_set(h->hooks.healthy == NULL || h->hooks.healthy(h->hooks.arg, &why));
        metrics_draining_set(draining);
        metrics_wedged_set(wedged);
        get_stats(h, &st);
        r->status = 200;
        r->content_type = "text/plain; version=0.0.4; charset=utf-8";
        rc = metrics_render(&h->body, &st, h->now_ns());
        if (rc == SLOTD_OK && h->hooks.metrics_more != NULL)
            rc = h->hooks.metrics_more(h->hooks.arg, &h->body);
        return rc;
    }
#undef IS
    r->status = 404;
    r->content_type = "text/plain; charset=utf-8";
    return proto_buf_append(&h->body, "Not Found\n", 10);
}

/* POST /prefix-cache/flush: 200 {"flushed_entries":N}. */
static int post_prefix_flush(admin_http_t *h, response_t *r)
{
    char line[64];
    int n = snprintf(line, sizeof(line), "{\"flushed_entries\":%" PRIu64 "}\n",
                     h->hooks.prefix_flush(h->hooks.arg));
    r->status = 200;
    return proto_buf_append(&h->body, line, (size_t)n);
}

/* POST /tenants/reload: 200 {"reloaded":true,"tenants":N,"revoked":M}, or
 * {"reloaded":false,"error":REASON} with 409 (no tenants file), 422 (the
 * file was refused; nothing changed) or 503 (no memory; nothing changed). */
static int post_tenants_reload(admin_http_t *h, response_t *r)
{
    admin_reload_t out;
    const char *why;
    char line[96];
    int rc, n;

    memset(&out, 0, sizeof(out));
    switch (h->hooks.tenants_reload(h->hooks.arg, &out)) {
    case ADMIN_RELOAD_APPLIED:
        n = snprintf(line, sizeof(line),
                     "{\"reloaded\":true,\"tenants\":%" PRIu64 ",\"revoked\":%" PRIu64 "}\n",
                     out.tenants, out.revoked);
        r->status = 200;
        return proto_buf_append(&h->body, line, (size_t)n);
    case ADMIN_RELOAD_NO_FILE:
        r->status = 409;
        why = "the daemon runs without --tenants-file: nothing to reload";
        break;
    case ADMIN_RELOAD_REFUSED:
        r->status = 422;
        why = out.why;
        break;
    default:
        r->status = 503;
        why = "no memory; nothing changed";
        break;
    }
    static const char head[] = "{\"reloaded\":false,\"error\":";
    rc = proto_buf_append(&h->body, head, sizeof(head) - 1);
    if (rc == SLOTD_OK)
        rc = json_string(&h->body, why);
    if (rc == SLOTD_OK)
        rc = proto_buf_append(&h->body, "}\n", 2);
    return rc;
}

typedef int (*post_fn)(admin_http_t *h, response_t *r);

/* The handler of the POST route in h->url, or NULL (then 405 or 404). */
static post_fn post_route(const admin_http_t *h)
{
#define URL_IS(lit) (h->url_len == sizeof(lit) - 1 && memcmp(h->url, lit, h->url_len) == 0)
    if (h->hooks.prefix_flush != NULL && URL_IS("/prefix-cache/flush"))
        return post_prefix_flush;
    if (h->hooks.tenants_reload != NULL && URL_IS("/tenants/reload"))
        return post_tenants_reload;
    return NULL;
#undef URL_IS
}

/* Answers the request the parser has just completed.  Returns SLOTD_OK or
 * SLOTD_ENOMEM; sets h->closed when this is the last response. */
static int respond(admin_http_t *h)
{
    http_parser *p = &h->parser;
    response_t r = {0};
    int rc = SLOTD_OK;

    /* An Upgrade or CONNECT request hands the connection to another
     * protocol: answer it and close. */
    r.close = !http_should_keep_alive(p) || p->upgrade;
    r.keep_alive_10 = !r.close && p->http_major == 1 && p->http_minor == 0;
    r.head = p->method == HTTP_HEAD;
    h->body.len = 0;

    if (p->method == HTTP_POST && post_route(h) != NULL) {
        /* The routes that change something: the token when one is set. */
        r.content_type = "application/json";
        if (!authorized(h)) {
            r.status = 401;
            r.content_type = "text/plain; charset=utf-8";
            r.extra = "WWW-Authenticate: Bearer\r\n";
            rc = proto_buf_append(&h->body, "Unauthorized\n", 13);
        } else {
            rc = post_route(h)(h, &r);
        }
    } else if (p->method != HTTP_GET && p->method != HTTP_HEAD) {
        r.status = 405;
        r.content_type = "text/plain; charset=utf-8";
        r.extra = "Allow: GET, HEAD\r\n";
        rc = proto_buf_append(&h->body, "Method Not Allowed\n", 19);
    } else {
        struct http_parser_url u;
        http_parser_url_init(&u);
        if (http_parser_parse_url(h->url, h->url_len, 0, &u) != 0 ||
            !(u.field_set & (1u << UF_PATH))) {
            h->closed = true;
            return append_failure(h, 400);
        }
        bool q = (u.field_set & (1u << UF_QUERY)) != 0;
        rc = route(h, h->url + u.field_data[UF_PATH].off, u.field_data[UF_PATH].len,
                   q ? h->url + u.field_data[UF_QUERY].off : "", q ? u.field_data[UF_QUERY].len : 0,
                   &r);
    }
    if (rc == ROUTE_WAIT) {
        /* The headers wait with the body; nothing is appended yet. */
        h->waiting = true;
        h->wait_r = r;
        return SLOTD_OK;
    }
    if (rc != SLOTD_OK)
        return SLOTD_ENOMEM;
    if (r.close)
        h->closed = true;
    r.body = h->body.data;
    r.body_len = h->body.len;
    return append_response(h, &r);
}

/* ---- Parser callbacks: nonzero stops the parser with an error ---- */

static int http_fail(admin_http_t *h, int status)
{
    h->fail_status = status;
    return -1;
}

static int on_message_begin(http_parser *p)
{
    admin_http_t *h = PARSER_OWNER(p);
    h->url_len = 0;
    h->body_bytes = 0;
    h->in_value = true; /* the first name starts afresh */
    h->value_is_authz = false;
    h->authz_count = 0;
    h->authz_len = 0;
    return 0;
}

static int on_header_field(http_parser *p, const char *at, size_t len)
{
    admin_http_t *h = PARSER_OWNER(p);
    if (h->in_value) {
        h->in_value = false;
        h->hname_len = 0;
    }
    for (size_t i = 0; i < len; i++, h->hname_len++)
        if (h->hname_len < sizeof(h->hname))
            h->hname[h->hname_len] = (char)tolower((unsigned char)at[i]);
    return 0;
}

static int on_header_value(http_parser *p, const char *at, size_t len)
{
    admin_http_t *h = PARSER_OWNER(p);
    if (!h->in_value) {
        h->in_value = true;
        h->value_is_authz = h->hname_len == 13 && memcmp(h->hname, "authorization", 13) == 0;
        if (h->value_is_authz) {
            h->authz_count++;
            h->authz_len = 0;
        }
    }
    if (!h->value_is_authz)
        return 0;
    if (len > AUTHZ_MAX - (h->authz_len < AUTHZ_MAX ? h->authz_len : AUTHZ_MAX)) {
        h->authz_len = AUTHZ_MAX + 1;
        return 0;
    }
    memcpy(h->authz + h->authz_len, at, len);
    h->authz_len += len;
    return 0;
}

static int on_url(http_parser *p, const char *at, size_t len)
{
    admin_http_t *h = PARSER_OWNER(p);
    /* The parser counts the request line against the header limit before
     * it hands the URL over, so this cannot overflow; be sure anyway. */
    if (len > ADMIN_HTTP_MAX_HEADER - h->url_len)
        return http_fail(h, 431);
    memcpy(h->url + h->url_len, at, len);
    h->url_len += len;
    h->url[h->url_len] = '\0';
    return 0;
}

static int on_headers_complete(http_parser *p)
{
    admin_http_t *h = PARSER_OWNER(p);
    if (p->http_major != 1)
        return http_fail(h, 505);
    if (h->url_len > ADMIN_HTTP_MAX_URL)
        return http_fail(h, 414);
    /* A declared body too long to bother reading. */
    if (!(p->flags & F_CHUNKED) && p->content_length != ULLONG_MAX &&
        p->content_length > ADMIN_HTTP_MAX_BODY)
        return http_fail(h, 413);
    h->headers_done = true;
    return 0;
}

static int on_chunk_header(http_parser *p)
{
    admin_http_t *h = PARSER_OWNER(p);
    /* content_length is the size of the chunk announced. */
    if (p->content_length > ADMIN_HTTP_MAX_BODY - h->body_bytes)
        return http_fail(h, 413);
    h->body_bytes += p->content_length;
    return 0;
}

static int on_message_complete(http_parser *p)
{
    admin_http_t *h = PARSER_OWNER(p);
    if (respond(h) != SLOTD_OK) {
        h->nomem = true;
        return -1;
    }
    h->full = !h->closed && h->out->len >= ADMIN_HTTP_OUT_HIGH;
    /* Always stop here, so run() knows where each request ends. */
    http_parser_pause(p, 1);
    return 0;
}

/* Every check above runs at a point of the byte stream that does not
 * depend on how the stream was cut into reads (data callbacks do), so the
 * responses are the same however the bytes arrive. */
static const http_parser_settings settings = {
    .on_message_begin = on_message_begin,
    .on_url = on_url,
    .on_header_field = on_header_field,
    .on_header_value = on_header_value,
    .on_headers_complete = on_headers_complete,
    .on_chunk_header = on_chunk_header,
    .on_message_complete = on_message_complete,
};

static void set_header_limit(void)
{
    http_parser_set_max_header_size(ADMIN_HTTP_MAX_HEADER);
}

/* ---- Driving the parser ---- */

/* The status for a request the parser gave up on after `seen` bytes of it
 * (the offending byte included).  http-parser checks its header limit at
 * points that depend on where reads were cut, and may meet a bad byte past
 * the limit first when the bytes come in one piece; so any failure in the
 * request line or headers past the limit is 431, as the limit would have
 * been seen first had the bytes come one by one.  Past the headers
 * (bodies, trailers) every failure is 400 for the same reason. */
static int failure_status(const admin_http_t *h, enum http_errno e, uint64_t seen)
{
    if (h->fail_status != 0)
        return h->fail_status;
    if (!h->headers_done && (e == HPE_HEADER_OVERFLOW || seen > ADMIN_HTTP_MAX_HEADER))
        return 431;
    return 400;
}

/* Parses `len` bytes, one request at a time; *used gets how many were
 * consumed (all of them unless the result is ADMIN_HTTP_FULL). */
static int run(admin_http_t *h, const char *data, size_t len, size_t *used)
{
    size_t off = 0;
    int rc = ADMIN_HTTP_MORE;

    /* An empty feed would read as EOF to http-parser. */
    while (off < len) {
        size_t n = http_parser_execute(&h->parser, &settings, data + off, len - off);
        enum http_errno e = HTTP_PARSER_ERRNO(&h->parser);
        if (e == HPE_PAUSED) {
            /* A request was answered: the next starts after it. */
            http_parser_pause(&h->parser, 0);
            off += n;
            h->req_bytes = 0;
            h->headers_done = false;
            if (h->closed || h->full || h->waiting) {
                rc = h->closed ? ADMIN_HTTP_CLOSE : h->waiting ? ADMIN_HTTP_WAIT : ADMIN_HTTP_FULL;
                break;
            }
            continue;
        }
        if (h->nomem) {
            h->closed = true;
            rc = SLOTD_ENOMEM;
            break;
        }
        if (e != HPE_OK || n != len - off) {
            h->closed = true;
            rc = append_failure(h, failure_status(h, e, h->req_bytes + n + 1));
            rc = rc == SLOTD_OK ? ADMIN_HTTP_CLOSE : SLOTD_ENOMEM;
            break;
        }
        h->req_bytes += n;
        off += n;
    }
    *used = off;
    return rc;
}

admin_http_t *admin_http_new(const admin_hooks_t *hooks, admin_http_clock_fn now_ns)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, set_header_limit);
    admin_http_t *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return NULL;
    if (hooks != NULL)
        h->hooks = *hooks;
    h->now_ns = now_ns != NULL ? now_ns : monotonic_ns;
    proto_buf_init(&h->body);
    proto_buf_init(&h->held);
    proto_buf_init(&h->rest);

    http_parser_init(&h->parser, HTTP_REQUEST);
    h->parser.data = h;
    return h;
}

void admin_http_free(admin_http_t *h)
{
    if (h == NULL)
        return;
    proto_buf_free(&h->body);
    proto_buf_free(&h->held);
    proto_buf_free(&h->rest);
    free(h);
}

int admin_http_feed(admin_http_t *h, const char *data, size_t len, proto_buf_t *out)
{
    if (h->closed)
        return ADMIN_HTTP_CLOSE;
    if (h->full || h->waiting) {
        if (proto_buf_append(&h->held, data, len) != SLOTD_OK)
            return SLOTD_ENOMEM;
        return h->waiting ? ADMIN_HTTP_WAIT : ADMIN_HTTP_FULL;
    }
    h->out = out;
    size_t used;
    int rc = run(h, data, len, &used);
    h->out = NULL;
    if ((rc == ADMIN_HTTP_FULL || rc == ADMIN_HTTP_WAIT) &&
        proto_buf_append(&h->held, data + used, len - used) != SLOTD_OK) {
        h->closed = true;
        return SLOTD_ENOMEM;
    }
    return rc;
}

int admin_http_resume(admin_http_t *h, proto_buf_t *out)
{
    if (h->waiting)
        return ADMIN_HTTP_WAIT;
    if (h->rest_off < h->rest.len) {
        size_t n = h->rest.len - h->rest_off;
        n = n < ADMIN_HTTP_SLICE ? n : ADMIN_HTTP_SLICE;
        if (proto_buf_append(out, h->rest.data + h->rest_off, n) != SLOTD_OK) {
            h->closed = true;
            return SLOTD_ENOMEM;
        }
        h->rest_off += n;
        if (h->rest_off < h->rest.len)
            return ADMIN_HTTP_FULL;
        proto_buf_free(&h->rest);
        h->rest_off = 0;
    }
    if (h->closed)
        return ADMIN_HTTP_CLOSE;
    if (!h->full)
        return ADMIN_HTTP_MORE;
    h->full = false;
    h->out = out;
    size_t used;
    int rc = run(h, h->held.data, h->held.len, &used);
    h->out = NULL;
    if (rc == ADMIN_HTTP_FULL)
        proto_buf_consume(&h->held, used);
    else
        h->held.len = 0;
    return rc;
}

bool admin_http_idle(const admin_http_t *h)
{
    return h->req_bytes == 0 && !h->full && !h->waiting && h->held.len == 0;
}

size_t admin_http_wait_limit(const admin_http_t *h)
{
    return h->wait_limit;
}

int admin_http_complete(admin_http_t *h, int rc, proto_buf_t *body, proto_buf_t *out)
{
    if (!h->waiting)
        return admin_http_resume(h, out);
    h->waiting = false;
    if (rc != SLOTD_OK) {
        h->closed = true;
        return SLOTD_ENOMEM;
    }
    response_t r = h->wait_r;
    r.body_len = body->len;
    r.body_later = true;
    h->out = out;
    rc = append_response(h, &r);
    h->out = NULL;
    if (rc != SLOTD_OK) {
        h->closed = true;
        return SLOTD_ENOMEM;
    }
    if (!r.head) {
        /* The body goes out a slice per resume, from its own buffer. */
        proto_buf_t t = h->rest;
        h->rest = *body;
        *body = t;
        h->rest_off = 0;
    }
    if (r.close)
        h->closed = true;
    h->full = true; /* held input, if any, goes on after the body */
    return admin_http_resume(h, out);
}

uint64_t admin_http_responses(const admin_http_t *h)
{
    return h->responses;
}
