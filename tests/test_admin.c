/*
 * test_admin.c: Check suite for the admin port: admin_http on its own (bytes
 * in, responses out, no sockets), then admin.c on a real loopback socket
 * with a libuv loop running on its own thread.
 *
 * The hooks report fixed stats and a health flag the tests toggle; the
 * loop thread reads the flag, the test thread writes it (an atomic).
 */
#include <arpa/inet.h>
#include <check.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <uv.h>

#include "server/admin/admin.h"
#include "server/admin/admin_http_int.h"
#include "server/admin/metrics.h"

/* ---- Fixed hooks ---- */

static const proto_stats_t fixed_stats = {
    .cache_entries = 11,
    .live_sessions = 2,
    .g_calls = 33,
    .rows = 44,
    .connections = 5,
    .requests_total = 66,
    .errors_total = 7,
    .pool_bytes_total = 8192,
    .pool_bytes_used = 1024,
    .pool_slots_total = 8,
    .pool_slots_used = 2,
    .released_finish = 1,
    .released_disconnect = 2,
    .released_idle = 3,
    .released_shutdown = 4,
    .uptime_seconds = 99,
    .threads = 3,
};

static atomic_bool healthy_flag = true;
static const char *_Atomic unhealthy_why = NULL;

static void hook_stats(void *arg, proto_stats_t *out)
{
    (void)arg;
    *out = fixed_stats;
}

static bool hook_healthy(void *arg, const char **why)
{
    (void)arg;
    if (atomic_load(&healthy_flag))
        return true;
    *why = atomic_load(&unhealthy_why);
    return false;
}

static atomic_bool draining_flag = false, wedged_flag = false;

static void hook_health(void *arg, bool *draining, bool *wedged)
{
    (void)arg;
    *draining = atomic_load(&draining_flag);
    *wedged = atomic_load(&wedged_flag);
}

static const admin_hooks_t hooks = {
    .stats = hook_stats, .healthy = hook_healthy, .health = hook_health};

static uint64_t fixed_clock(void)
{
    return 42ull * 1000000000ull;
}

/* ---- Parsing responses ---- */

typedef struct resp {
    int status;
    char headers[2048]; /* the header block, lower-cased names */
    char *body;         /* NUL-terminated copy, caller frees */
    size_t body_len;
} resp_t;

/* The value of header `name` (lower case) in `r`, copied into `out`, or
 * NULL if absent. */
static const char *header(const resp_t *r, const char *name, char *out, size_t cap)
{
    size_t n = strlen(name);
    for (const char *p = r->headers; *p;) {
        const char *eol = strstr(p, "\r\n");
        if (eol == NULL)
            break;
        if (strncmp(p, name, n) == 0 && p[n] == ':') {
            const char *v = p + n + 1;
            while (*v == ' ')
                v++;
            size_t len = (size_t)(eol - v);
            if (len >= cap)
                len = cap - 1;
            memcpy(out, v, len);
            out[len] = '\0';
            return out;
        }
        p = eol + 2;
    }
    return NULL;
}

/* Parses one response at `data` (`head`: no body follows).  Returns the
 * bytes it took, or 0 if `data` holds no complete response yet. */
static size_t parse_resp(const char *data, size_t len, bool head, resp_t *r)
{
    memset(r, 0, sizeof(*r));
    const char *end = NULL;
    for (size_t i = 0; i + 4 <= len; i++)
        if (memcmp(data + i, "\r\n\r\n", 4) == 0) {
            end = data + i + 4;
            break;
        }
    if (end == NULL)
        return 0;
    ck_assert_msg(len > 13 && memcmp(data, "HTTP/1.1 ", 9) == 0, "bad status line");
    r->status = atoi(data + 9);
    const char *h = memchr(data, '\n', len) + 1;
    size_t hlen = (size_t)(end - 2 - h);
    ck_assert_uint_lt(hlen, sizeof(r->headers));
    for (size_t i = 0; i < hlen; i++) {
        char c = h[i];
        r->headers[i] = c;
    }
    /* Lower-case the names. */
    for (char *p = r->headers; *p;) {
        for (char *q = p; *q && *q != ':'; q++)
            if (*q >= 'A' && *q <= 'Z')
                *q = (char)(*q - 'A' + 'a');
        char *eol = strstr(p, "\r\n");
        if (eol == NULL)
            break;
        p = eol + 2;
    }
    char v[64];
    ck_assert_msg(header(r, "content-length", v, sizeof(v)) != NULL, "no Content-Length");
    size_t clen = (size_t)strtoul(v, NULL, 10);
    size_t blen = head ? 0 : clen;
    if ((size_t)(data + len - end) < blen)
        return 0;
    r->body_len = clen;
    r->body = calloc(1, blen + 1);
    memcpy(r->body, end, blen);
    return (size_t)(end - data) + blen;
}

static void resp_free(resp_t *r)
{
    free(r->body);
    r->body = NULL;
}

static bool has_header(const resp_t *r, const char *name, const char *value)
{
    char v[256];
    return header(r, name, v, sizeof(v)) != NULL && strcmp(v, value) == 0;
}

/* Unless `name` is NULL, `r` has the header `name` holding `value`; frees
 * `r`. */
static void resp_done(resp_t *r, const char *name, const char *value)
{
    if (name != NULL)
        ck_assert_msg(has_header(r, name, value), "no %s: %s", name, value);
    resp_free(r);
}

/* ---- admin_http without sockets ---- */

typedef struct hx {
    admin_http_t *h;
    proto_buf_t out;
    size_t off; /* responses before `off` were taken by next() */
    int last;   /* the last result */
} hx_t;

static void hx_init(hx_t *x)
{
    x->h = admin_http_new(&hooks, fixed_clock);
    ck_assert_ptr_nonnull(x->h);
    proto_buf_init(&x->out);
    x->off = 0;
    x->last = ADMIN_HTTP_MORE;
    atomic_store(&healthy_flag, true);
    atomic_store(&unhealthy_why, NULL);
    metrics_init(1000000000ull);
}

static void hx_free(hx_t *x)
{
    admin_http_free(x->h);
    proto_buf_free(&x->out);
}

/* Feeds `s` (whole, or `step` bytes at a time), resuming after FULL as a
 * writer that drains nothing would: out keeps growing. */
static int hx_feed_step(hx_t *x, const char *s, size_t len, size_t step)
{
    int rc = ADMIN_HTTP_MORE;
    for (size_t i = 0; i < len; i += step) {
        size_t n = len - i < step ? len - i : step;
        rc = admin_http_feed(x->h, s + i, n, &x->out);
        while (rc == ADMIN_HTTP_FULL)
            rc = admin_http_resume(x->h, &x->out);
    }
    x->last = rc;
    return rc;
}

static int hx_feed(hx_t *x, const char *s)
{
    return hx_feed_step(x, s, strlen(s), strlen(s) ? strlen(s) : 1);
}

/* Takes the next response from the output; fails if there is none. */
/* The next response, into `r`; unless `status` is 0, it must have that one. */
static void hx_next(hx_t *x, bool head, int status, resp_t *r)
{
    size_t n = parse_resp(x->out.data + x->off, x->out.len - x->off, head, r);
    ck_assert_msg(n > 0, "no complete response");
    x->off += n;
    if (status != 0)
        ck_assert_int_eq(r->status, status);
}

/* The next response, of which only its `status` and, unless `name` is NULL,
 * that its header `name` holds `value` matter. */
static void hx_expect(hx_t *x, bool head, int status, const char *name, const char *value)
{
    resp_t r;
    hx_next(x, head, status, &r);
    resp_done(&r, name, value);
}

static bool hx_empty(const hx_t *x)
{
    return x->off == x->out.len;
}

START_TEST(test_http_health)
{
    hx_t x;
    resp_t r;
    char v[128];
    hx_init(&x);
    ck_assert_int_eq(hx_feed(&x, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"), ADMIN_HTTP_MORE);
    hx_next(&x, false, 200, &r);
    ck_assert_str_eq(r.body, "{\"status\":\"ok\"}\n");
    ck_assert(has_header(&r, "content-type", "application/json"));
    ck_assert_ptr_null(header(&r, "connection", v, sizeof(v)));
    resp_free(&r);

    atomic_store(&healthy_flag, false);
    ck_assert_int_eq(hx_feed(&x, "GET /health HTTP/1.1\r\n\r\n"), ADMIN_HTTP_MORE);
    hx_next(&x, false, 503, &r);
    ck_assert_str_eq(r.body, "{\"status\":\"draining\"}\n");
    resp_free(&r);

    atomic_store(&unhealthy_why, "worker \"2\" wedged");
    ck_assert_int_eq(hx_feed(&x, "GET /health HTTP/1.1\r\n\r\n"), ADMIN_HTTP_MORE);
    hx_next(&x, false, 503, &r);
    ck_assert_str_eq(r.body, "{\"status\":\"worker \\\"2\\\" wedged\"}\n");
    resp_free(&r);
    ck_assert(hx_empty(&x));
    ck_assert_uint_eq(admin_http_responses(x.h), 3);
    hx_free(&x);
}
END_TEST

/* The health gauges of /metrics: slotd_healthy is what /health says,
 * draining and wedged what the health hook says. */
START_TEST(test_http_health_gauges)
{
    static const struct {
        bool healthy, draining, wedged;
    } cases[] = {
        {true, false, false}, {false, true, false}, {false, false, true}, {false, true, true}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        hx_t x;
        resp_t r;
        char want[64];
        hx_init(&x);
        atomic_store(&healthy_flag, cases[i].healthy);
        atomic_store(&draining_flag, cases[i].draining);
        atomic_store(&wedged_flag, cases[i].wedged);
        ck_assert_int_eq(hx_feed(&x, "GET /metrics HTTP/1.1\r\n\r\n"), ADMIN_HTTP_MORE);
        hx_next(&x, false, 200, &r);
        snprintf(want, sizeof(want), "\nslotd_healthy %d\n", cases[i].healthy);
        ck_assert_msg(strstr(r.body, want) != NULL, "case %zu: no %s", i, want + 1);
        snprintf(want, sizeof(want), "\nslotd_draining %d\n", cases[i].draining);
        ck_assert_msg(strstr(r.body, want) != NULL, "case %zu: no %s", i, want + 1);
        snprintf(want, sizeof(want), "\nslotd_wedged %d\n", cases[i].wedged);
        ck_assert_msg(strstr(r.body, want) != NULL, "case %zu: no %s", i, want + 1);
        resp_free(&r);
        hx_free(&x);
    }
    atomic_store(&healthy_flag, true);
    atomic_store(&draining_flag, false);
    atomic_store(&wedged_flag, false);
}
END_TEST

START_TEST(test_http_bearer)
{
    static const char tok[] = "unit-token-0123456789";
    admin_hooks_t hk = hooks;
    hk.token = tok;
    hk.token_len = strlen(tok);
    hx_t x;
    resp_t r;
    hx_init(&x);
    admin_http_free(x.h);
    x.h = admin_http_new(&hk, fixed_clock);
    ck_assert_ptr_nonnull(x.h);

    static const struct {
        const char *req;
        int status;
    } cases[] = {
        {"GET /health HTTP/1.1\r\n\r\n", 200},
        {"GET /stats HTTP/1.1\r\n\r\n", 401},
        {"HEAD /metrics HTTP/1.1\r\n\r\n", 401},
        {"GET /stats HTTP/1.1\r\nAuthorization: Bearer unit-token-0123456789\r\n\r\n", 200},
        {"GET /metrics HTTP/1.1\r\nX-A: 1\r\nauthorization:BEARER unit-token-0123456789 \r\n\r\n",
         200},
        {"GET /stats HTTP/1.1\r\nAuthorization: Bearer unit-token-012345678\r\n\r\n", 401},
        {"GET /stats HTTP/1.1\r\nAuthorization: Bearer unit-token-01234567890\r\n\r\n", 401},
        {"GET /stats HTTP/1.1\r\nAuthorization: Bearer unit-token-0123456789\r\n"
         "Authorization: Bearer unit-token-0123456789\r\n\r\n",
         401},
        {"GET /stats HTTP/1.1\r\nAuthorizatio: Bearer unit-token-0123456789\r\n\r\n", 401},
        {"GET /nope HTTP/1.1\r\n\r\n", 404},
    };
    /* Whole, and one byte at a time: the header is gathered across pieces. */
    for (size_t step = 0; step < 2; step++) {
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            const char *q = cases[i].req;
            ck_assert_int_eq(hx_feed_step(&x, q, strlen(q), step ? 1 : strlen(q)), ADMIN_HTTP_MORE);
            hx_next(&x, strncmp(q, "HEAD", 4) == 0, 0, &r);
            ck_assert_msg(r.status == cases[i].status, "%s: %d", q, r.status);
            if (r.status == 401)
                ck_assert(has_header(&r, "www-authenticate", "Bearer"));
            resp_free(&r);
        }
    }
    ck_assert(hx_empty(&x));
    /* Each wrong token counts; a missing header does not. */
    ck_assert_uint_eq(metrics_auth_failure_value(), 2 * 3);
    hx_free(&x);
}
END_TEST

/* POST /tenants/reload: each outcome of the hook as its status and body;
 * 405 without the hook (a POST of no route), GET 404 (no such GET
 * route), 401 without the token.  metrics_more's families follow metrics_render()'s. */
static int reload_outcome;

static int hook_reload(void *arg, admin_reload_t *out)
{
    (void)arg;
    out->tenants = 3;
    out->revoked = 1;
    snprintf(out->why, sizeof(out->why), "--tenants-file: f line 2: \"x\"");
    return reload_outcome;
}

static int hook_metrics_more(void *arg, proto_buf_t *out)
{
    (void)arg;
    static const char fam[] = "# HELP slotd_more_x X.\n# TYPE slotd_more_x gauge\nslotd_more_x 1\n";
    return proto_buf_append(out, fam, sizeof(fam) - 1);
}

START_TEST(test_http_tenants_reload)
{
    static const char tok[] = "unit-token-0123456789";
    static const char post[] = "POST /tenants/reload HTTP/1.1\r\nContent-Length: 0\r\n"
                               "Authorization: Bearer unit-token-0123456789\r\n\r\n";
    static const struct {
        int outcome, status;
        const char *body;
    } cases[] = {
        {ADMIN_RELOAD_APPLIED, 200, "{\"reloaded\":true,\"tenants\":3,\"revoked\":1}\n"},
        {ADMIN_RELOAD_NO_FILE, 409,
         "{\"reloaded\":false,\"error\":\"the daemon runs without --tenants-file: nothing to "
         "reload\"}\n"},
        {ADMIN_RELOAD_REFUSED, 422,
         "{\"reloaded\":false,\"error\":\"--tenants-file: f line 2: \\\"x\\\"\"}\n"},
        {ADMIN_RELOAD_NO_MEMORY, 503,
         "{\"reloaded\":false,\"error\":\"no memory; nothing changed\"}\n"},
    };
    admin_hooks_t hk = hooks;
    hx_t x;
    resp_t r;

    hx_init(&x); /* with hooks lacking tenants_reload: a POST of no route */
    ck_assert_int_eq(hx_feed(&x, post), ADMIN_HTTP_MORE);
    hx_next(&x, false, 405, &r);
    resp_free(&r);
    admin_http_free(x.h);
    hk.token = tok;
    hk.token_len = strlen(tok);
    hk.tenants_reload = hook_reload;
    hk.metrics_more = hook_metrics_more;
    x.h = admin_http_new(&hk, fixed_clock);
    ck_assert_ptr_nonnull(x.h);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        reload_outcome = cases[i].outcome;
        ck_assert_int_eq(hx_feed(&x, post), ADMIN_HTTP_MORE);
        hx_next(&x, false, cases[i].status, &r);
        ck_assert_str_eq(r.body, cases[i].body);
        resp_free(&r);
    }
    ck_assert_int_eq(hx_feed(&x, "POST /tenants/reload HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
                     ADMIN_HTTP_MORE);
    hx_next(&x, false, 401, &r);
    resp_free(&r);
    ck_assert_int_eq(hx_feed(&x, "GET /tenants/reload HTTP/1.1\r\n"
                                 "Authorization: Bearer unit-token-0123456789\r\n\r\n"),
                     ADMIN_HTTP_MORE);
    hx_next(&x, false, 404, &r);
    resp_free(&r);
    ck_assert_int_eq(hx_feed(&x, "GET /metrics HTTP/1.1\r\n"
                                 "Authorization: Bearer unit-token-0123456789\r\n\r\n"),
                     ADMIN_HTTP_MORE);
    hx_next(&x, false, 200, &r);
    ck_assert_msg(r.body_len > 15 && strcmp(r.body + r.body_len - 15, "slotd_more_x 1\n") == 0,
                  "metrics_more's family not last");
    resp_free(&r);
    ck_assert(hx_empty(&x));
    hx_free(&x);
}
END_TEST

START_TEST(test_http_no_hooks)
{
    proto_buf_t out;
    resp_t r;
    proto_buf_init(&out);
    admin_http_t *h = admin_http_new(NULL, NULL);
    const char *req = "GET /health HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\n\r\n";
    ck_assert_int_eq(admin_http_feed(h, req, strlen(req), &out), ADMIN_HTTP_MORE);
    size_t n = parse_resp(out.data, out.len, false, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(r.body, "{\"status\":\"ok\"}\n");
    resp_free(&r);
    ck_assert_uint_gt(parse_resp(out.data + n, out.len - n, false, &r), 0);
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_nonnull(strstr(r.body, "\nslotd_cache_entries 0\n"));
    resp_free(&r);
    admin_http_free(h);
    admin_http_free(NULL);
    proto_buf_free(&out);
}
END_TEST

static void check_stats_json(const char *body)
{
    cJSON *j = cJSON_Parse(body);
    ck_assert_ptr_nonnull(j);
    ck_assert(cJSON_IsObject(j));
    static const struct {
        const char *name;
        double v;
    } want[] = {
        {"cache_entries", 11},     {"live_sessions", 2},
        {"g_calls", 33},           {"rows", 44},
        {"connections", 5},        {"requests_total", 66},
        {"errors_total", 7},       {"pool_bytes_total", 8192},
        {"pool_bytes_used", 1024}, {"pool_slots_total", 8},
        {"pool_slots_used", 2},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        cJSON *m = cJSON_GetObjectItemCaseSensitive(j, want[i].name);
        ck_assert_msg(cJSON_IsNumber(m), "stats lacks %s", want[i].name);
        ck_assert_double_eq(m->valuedouble, want[i].v);
    }
    cJSON *rel = cJSON_GetObjectItemCaseSensitive(j, "released");
    ck_assert(cJSON_IsObject(rel));
    ck_assert_double_eq(cJSON_GetObjectItemCaseSensitive(rel, "finish")->valuedouble, 1);
    ck_assert_double_eq(cJSON_GetObjectItemCaseSensitive(rel, "disconnect")->valuedouble, 2);
    ck_assert_double_eq(cJSON_GetObjectItemCaseSensitive(rel, "idle")->valuedouble, 3);
    ck_assert_double_eq(cJSON_GetObjectItemCaseSensitive(rel, "shutdown")->valuedouble, 4);
    cJSON_Delete(j);
}

START_TEST(test_http_stats)
{
    hx_t x;
    resp_t r;
    hx_init(&x);
    ck_assert_int_eq(hx_feed(&x, "GET /stats?pretty=1 HTTP/1.1\r\n\r\n"), ADMIN_HTTP_MORE);
    hx_next(&x, false, 200, &r);
    ck_assert(has_header(&r, "content-type", "application/json"));
    ck_assert_uint_eq(r.body_len, strlen(r.body));
    ck_assert_int_eq(r.body[r.body_len - 1], '\n');
    check_stats_json(r.body);
    resp_free(&r);
    hx_free(&x);
}
END_TEST

START_TEST(test_http_metrics)
{
    hx_t x;
    resp_t r;
    hx_init(&x);
    /* Absolute-form target and a query: both reduce to the path. */
    ck_assert_int_eq(hx_feed(&x, "GET http://localhost:7071/metrics?x=1 HTTP/1.1\r\n\r\n"),
                     ADMIN_HTTP_MORE);
    hx_next(&x, false, 200, &r);
    ck_assert(has_header(&r, "content-type", "text/plain; version=0.0.4; charset=utf-8"));
    ck_assert_ptr_nonnull(strstr(r.body, "\nslotd_cache_entries 11\n"));
    ck_assert_ptr_nonnull(strstr(r.body, "\nslotd_pool_bytes{state=\"free\"} 7168\n"));
    /* 42 s on the fixed clock, metrics started at 1 s. */
    ck_assert_ptr_nonnull(strstr(r.body, "\nslotd_uptime_seconds 41.000000000\n"));
    resp_free(&r);
    hx_free(&x);
}
END_TEST

START_TEST(test_http_head)
{
    hx_t x;
    resp_t r;
    char v[32];
    hx_init(&x);
    ck_assert_int_eq(hx_feed(&x, "HEAD /health HTTP/1.1\r\n\r\nGET /health HTTP/1.1\r\n\r\n"),
                     ADMIN_HTTP_MORE);
    hx_next(&x, true, 200, &r);
    ck_assert_str_eq(header(&r, "content-length", v, sizeof(v)), "16");
    resp_free(&r);
    hx_next(&x, false, 0, &r);
    ck_assert_str_eq(r.body, "{\"status\":\"ok\"}\n");
    resp_free(&r);
    ck_assert(hx_empty(&x));
    hx_free(&x);
}
END_TEST

START_TEST(test_http_not_found_keeps_open)
{
    hx_t x;
    hx_init(&x);
    ck_assert_int_eq(hx_feed(&x, "GET /nope HTTP/1.1\r\n\r\nGET /health/ HTTP/1.1\r\n\r\n"
                                 "GET /health HTTP/1.1\r\n\r\n"),
                     ADMIN_HTTP_MORE);
    hx_expect(&x, false, 404, NULL, NULL);
    hx_expect(&x, false, 404, NULL, NULL);
    hx_expect(&x, false, 200, NULL, NULL);
    hx_free(&x);
}
END_TEST

START_TEST(test_http_method)
{
    hx_t x;
    hx_init(&x);
    ck_assert_int_eq(hx_feed(&x, "POST /health HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
                                 "DELETE /nope HTTP/1.1\r\n\r\n"
                                 "PUT /stats HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 "3\r\nabc\r\n0\r\n\r\n"
                                 "GET /health HTTP/1.1\r\n\r\n"),
                     ADMIN_HTTP_MORE);
    for (int i = 0; i < 3; i++) {
        hx_expect(&x, false, 405, "allow", "GET, HEAD");
    }
    hx_expect(&x, false, 200, NULL, NULL);
    ck_assert(hx_empty(&x));
    hx_free(&x);
}
END_TEST

/* `req` is answered with `status`, "Connection: close", and nothing after. */
static void expect_final(const char *req, int status)
{
    hx_t x;
    hx_init(&x);
    ck_assert_int_eq(hx_feed(&x, req), ADMIN_HTTP_CLOSE);
    hx_expect(&x, false, status, "connection", "close");
    ck_assert(hx_empty(&x));
    /* Closed: more input is ignored. */
    ck_assert_int_eq(hx_feed(&x, "GET /health HTTP/1.1\r\n\r\n"), ADMIN_HTTP_CLOSE);
    ck_assert_int_eq(admin_http_resume(x.h, &x.out), ADMIN_HTTP_CLOSE);
    ck_assert(hx_empty(&x));
    hx_free(&x);
}

START_TEST(test_http_garbage)
{
    expect_final("HELLO THERE\r\n\r\n", 400);
    expect_final("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400); /* a TLS hello */
    expect_final("GET /health HTTP/9.9\r\n\r\n", 505);
    expect_final("GET /health HTTP/2.0\r\n\r\n", 505);
    expect_final("GET /health HTTP/1.1\r\nBad Header\r\n\r\n", 400);
    expect_final("GET /health HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400);
    expect_final("GET /health HTTP/1.1\r\nContent-Length: -5\r\n\r\n", 400);
    expect_final("GET /health HTTP/1.1\r\nHo\x01st: x\r\n\r\n", 400);
    expect_final("GET /health HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
                 400);
}
END_TEST

START_TEST(test_http_garbage_after_good)
{
    hx_t x;
    hx_init(&x);
    ck_assert_int_eq(hx_feed(&x, "GET /health HTTP/1.1\r\n\r\nxyz\r\n\r\n"), ADMIN_HTTP_CLOSE);
    hx_expect(&x, false, 200, NULL, NULL);
    hx_expect(&x, false, 400, "connection", "close");
    ck_assert(hx_empty(&x));
    hx_free(&x);
}
END_TEST

START_TEST(test_http_limits)
{
    char *big = malloc(20000);
    /* One header value past the limit. */
    int n = snprintf(big, 20000, "GET /health HTTP/1.1\r\nX-Big: %0*d\r\n\r\n",
                     ADMIN_HTTP_MAX_HEADER, 0);
    ck_assert_int_lt(n, 20000);
    expect_final(big, 431);
    /* Many small headers past the limit. */
    strcpy(big, "GET /health HTTP/1.1\r\n");
    for (int i = 0; i < 1500; i++)
        strcat(big, "A: b\r\n");
    strcat(big, "\r\n");
    expect_final(big, 431);
    /* Just under the limit is fine. */
    snprintf(big, 20000, "GET /health HTTP/1.1\r\nX-Big: %0*d\r\n\r\n", ADMIN_HTTP_MAX_HEADER - 100,
             0);
    {
        hx_t x;
        hx_init(&x);
        ck_assert_int_eq(hx_feed(&x, big), ADMIN_HTTP_MORE);
        hx_expect(&x, false, 200, NULL, NULL);
        hx_free(&x);
    }
    /* The URL. */
    strcpy(big, "GET /");
    memset(big + 5, 'a', ADMIN_HTTP_MAX_URL);
    strcpy(big + 5 + ADMIN_HTTP_MAX_URL, " HTTP/1.1\r\n\r\n");
    expect_final(big, 414);
    /* Bodies, declared and chunked. */
    expect_final("POST /health HTTP/1.1\r\nContent-Length: 100000\r\n\r\n", 413);
    {
        /* 17 chunks of 4 KiB is more than 64 KiB: fed in pieces. */
        hx_t x;
        hx_init(&x);
        const char *hd = "POST /health HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        int rc = hx_feed(&x, hd);
        char chunk[0x1000 + 16];
        int len = snprintf(chunk, sizeof(chunk), "1000\r\n");
        memset(chunk + len, 'z', 0x1000);
        memcpy(chunk + len + 0x1000, "\r\n", 2);
        for (int i = 0; i < 17 && rc == ADMIN_HTTP_MORE; i++)
            rc = hx_feed_step(&x, chunk, (size_t)len + 0x1000 + 2, 4096);
        ck_assert_int_eq(rc, ADMIN_HTTP_CLOSE);
        hx_expect(&x, false, 413, NULL, NULL);
        hx_free(&x);
    }
    free(big);
}
END_TEST

START_TEST(test_http_connection_close)
{
    hx_t x;
    hx_init(&x);
    ck_assert_int_eq(hx_feed(&x, "GET /health HTTP/1.1\r\nConnection: close\r\n\r\n"
                                 "GET /stats HTTP/1.1\r\n\r\n"),
                     ADMIN_HTTP_CLOSE);
    hx_expect(&x, false, 200, "connection", "close");
    ck_assert(hx_empty(&x)); /* the pipelined /stats is not answered */
    hx_free(&x);
}
END_TEST

START_TEST(test_http_10)
{
    hx_t x;
    resp_t r;
    char v[64];
    hx_init(&x);
    ck_assert_int_eq(hx_feed(&x, "GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"),
                     ADMIN_HTTP_MORE);
    hx_expect(&x, false, 0, "connection", "keep-alive");
    ck_assert_int_eq(hx_feed(&x, "GET /health HTTP/1.0\r\n\r\n"), ADMIN_HTTP_CLOSE);
    hx_next(&x, false, 0, &r);
    ck_assert_str_eq(header(&r, "connection", v, sizeof(v)), "close");
    resp_free(&r);
    hx_free(&x);
}
END_TEST

START_TEST(test_http_upgrade)
{
    expect_final("GET /health HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", 200);
    expect_final("CONNECT example.com:443 HTTP/1.1\r\n\r\n", 405);
}
END_TEST

START_TEST(test_http_split_bytes)
{
    const char *req = "GET /health HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n"
                      "POST /x HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
                      "GET /stats?q HTTP/1.1\r\n\r\n"
                      "HEAD /metrics HTTP/1.1\r\n\r\n"
                      "GET /health HTTP/1.1\r\nConnection: close\r\n\r\n";
    hx_t whole, split;
    /* HEAD /metrics still sends Content-Length, and the process figures
     * (RSS, CPU seconds) change its digits between two renders. */
    metrics_process_figures(false);
    hx_init(&whole);
    hx_init(&split);
    ck_assert_int_eq(hx_feed(&whole, req), ADMIN_HTTP_CLOSE);
    for (size_t step = 1; step < 7; step++) {
        hx_free(&split);
        hx_init(&split);
        ck_assert_int_eq(hx_feed_step(&split, req, strlen(req), step), ADMIN_HTTP_CLOSE);
        ck_assert_uint_eq(split.out.len, whole.out.len);
        ck_assert(memcmp(split.out.data, whole.out.data, whole.out.len) == 0);
    }
    ck_assert_uint_eq(admin_http_responses(whole.h), 5);
    hx_free(&whole);
    hx_free(&split);
    metrics_process_figures(true);
}
END_TEST

START_TEST(test_http_backpressure)
{
    /* Enough pipelined /stats requests to pass the output mark (not
     * /metrics, whose process figures change from one response to the
     * next). */
    proto_buf_t req, out;
    proto_buf_init(&req);
    proto_buf_init(&out);
    const char *one = "GET /stats HTTP/1.1\r\n\r\n";
    int count = 400;
    for (int i = 0; i < count; i++)
        proto_buf_append(&req, one, strlen(one));
    metrics_init(0);
    admin_http_t *h = admin_http_new(&hooks, fixed_clock);
    int rc = admin_http_feed(h, req.data, req.len, &out);
    ck_assert_int_eq(rc, ADMIN_HTTP_FULL);
    ck_assert_uint_ge(out.len, ADMIN_HTTP_OUT_HIGH);
    ck_assert_uint_lt(admin_http_responses(h), (uint64_t)count);
    /* Feeding while full holds the bytes too. */
    ck_assert_int_eq(admin_http_feed(h, one, strlen(one), &out), ADMIN_HTTP_FULL);
    int rounds = 0;
    size_t total = 0;
    while (rc == ADMIN_HTTP_FULL) {
        total += out.len;
        out.len = 0; /* written out */
        rc = admin_http_resume(h, &out);
        rounds++;
    }
    total += out.len;
    ck_assert_int_eq(rc, ADMIN_HTTP_MORE);
    ck_assert_int_gt(rounds, 1);
    ck_assert_uint_eq(admin_http_responses(h), (uint64_t)count + 1);
    ck_assert_int_eq(admin_http_resume(h, &out), ADMIN_HTTP_MORE);
    /* Every response is the same size here. */
    ck_assert_uint_eq(total % (uint64_t)(count + 1), 0);
    admin_http_free(h);
    proto_buf_free(&req);
    proto_buf_free(&out);
}
END_TEST

START_TEST(test_http_empty_and_partial)
{
    hx_t x;
    hx_init(&x);
    ck_assert_int_eq(admin_http_feed(x.h, "", 0, &x.out), ADMIN_HTTP_MORE);
    ck_assert_int_eq(hx_feed(&x, "\r\n\r\nGET /hea"), ADMIN_HTTP_MORE);
    ck_assert(hx_empty(&x));
    ck_assert_int_eq(admin_http_feed(x.h, "", 0, &x.out), ADMIN_HTTP_MORE);
    ck_assert_int_eq(hx_feed(&x, "lth HTTP/1.1\r\n\r\n"), ADMIN_HTTP_MORE);
    hx_expect(&x, false, 200, NULL, NULL);
    hx_free(&x);
}
END_TEST

/* proto/'s allocator hook (proto/proto_int.h): every proto_buf_t
 * grows through it, so it reaches every allocation admin_http makes after
 * admin_http_new(). */
extern void *(*proto__realloc)(void *ptr, size_t size);
static long allocs_left;

static void *failing_realloc(void *ptr, size_t size)
{
    if (allocs_left-- == 0)
        return NULL;
    return realloc(ptr, size);
}

START_TEST(test_http_nomem)
{
    /* Fail the k-th allocation, for every k until a run needs no failure:
     * each run ends in SLOTD_ENOMEM (and stays closed) or succeeds whole. */
    proto_buf_t req;
    proto_buf_init(&req);
    const char *mix = "GET /health HTTP/1.1\r\n\r\nGET /stats HTTP/1.1\r\n\r\n"
                      "GET /metrics HTTP/1.1\r\n\r\nGET /nope HTTP/1.1\r\n\r\n";
    for (int i = 0; i < 40; i++)
        ck_assert_int_eq(proto_buf_append(&req, mix, strlen(mix)), SLOTD_OK);
    metrics_init(0);
    void *(*saved)(void *, size_t) = proto__realloc;
    int failures = 0;
    for (long k = 0;; k++) {
        admin_http_t *h = admin_http_new(&hooks, fixed_clock);
        proto_buf_t out;
        proto_buf_init(&out);
        ck_assert_ptr_nonnull(h);
        allocs_left = k;
        proto__realloc = failing_realloc;
        int rc = admin_http_feed(h, req.data, req.len, &out);
        while (rc == ADMIN_HTTP_FULL) {
            out.len = 0;
            rc = admin_http_resume(h, &out);
        }
        bool failed = allocs_left < 0;
        proto__realloc = saved;
        if (failed) {
            ck_assert_int_eq(rc, SLOTD_ENOMEM);
            ck_assert_int_eq(admin_http_feed(h, "GET /health HTTP/1.1\r\n\r\n", 24, &out),
                             ADMIN_HTTP_CLOSE);
            failures++;
        } else {
            ck_assert_int_eq(rc, ADMIN_HTTP_MORE);
            ck_assert_uint_eq(admin_http_responses(h), 160);
        }
        admin_http_free(h);
        proto_buf_free(&out);
        if (!failed)
            break;
        ck_assert_int_lt(k, 10000);
    }
    ck_assert_int_gt(failures, 3);
    proto_buf_free(&req);
}
END_TEST

/* ---- The admin port on a live loop ---- */

static uv_loop_t loop;
static uv_async_t stopper;
static admin_t *admin;
static pthread_t loop_thread;
static int port;
static unsigned live_idle_ms = 30000; /* the idle timeout of the next start_on() */

static void on_stop(uv_async_t *a)
{
    admin_close(admin);
    uv_close((uv_handle_t *)a, NULL);
}

static void *run_loop(void *arg)
{
    (void)arg;
    uv_run(&loop, UV_RUN_DEFAULT);
    return NULL;
}

static void start_on(const char *host)
{
    atomic_store(&healthy_flag, true);
    atomic_store(&unhealthy_why, NULL);
    metrics_init(uv_hrtime());
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    ck_assert_int_eq(uv_async_init(&loop, &stopper, on_stop), 0);
    ck_assert_int_eq(admin_start(&loop, host, 0, live_idle_ms, &hooks, &admin), 0);
    ck_assert_ptr_nonnull(admin);
    port = admin_port(admin);
    ck_assert_int_gt(port, 0);
    ck_assert_int_eq(pthread_create(&loop_thread, NULL, run_loop, NULL), 0);
}

static void live_setup(void)
{
    start_on("127.0.0.1");
}

static void live_teardown(void)
{
    uv_async_send(&stopper);
    pthread_join(loop_thread, NULL);
    /* Every handle was closed and every close callback ran. */
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}

static int dial_family(int family, int p)
{
    int fd = socket(family, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    int rc;
    if (family == AF_INET) {
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    } else {
        struct sockaddr_in6 sa = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)p)};
        sa.sin6_addr = in6addr_loopback;
        rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    }
    ck_assert_msg(rc == 0, "connect: %s", strerror(errno));
    return fd;
}

static int dial(void)
{
    return dial_family(AF_INET, port);
}

static void send_str(int fd, const char *s)
{
    size_t len = strlen(s);
    while (len > 0) {
        ssize_t n = send(fd, s, len, MSG_NOSIGNAL);
        ck_assert_msg(n > 0, "send: %s", strerror(errno));
        s += n;
        len -= (size_t)n;
    }
}

/* A connection's incoming bytes, kept across responses. */
typedef struct rx {
    int fd;
    char buf[1 << 18];
    size_t len;
} rx_t;

static rx_t *rx_new(int fd)
{
    rx_t *x = calloc(1, sizeof(*x));
    x->fd = fd;
    return x;
}

static void rx_free(rx_t *x)
{
    close(x->fd);
    free(x);
}

/* The next response, into `r`; unless `status` is 0, it must have that one. */
static void recv_resp(rx_t *x, bool head, int status, resp_t *r)
{
    for (;;) {
        size_t n = parse_resp(x->buf, x->len, head, r);
        if (n > 0) {
            memmove(x->buf, x->buf + n, x->len - n);
            x->len -= n;
            if (status != 0)
                ck_assert_int_eq(r->status, status);
            return;
        }
        ck_assert_uint_lt(x->len, sizeof(x->buf));
        ssize_t got = recv(x->fd, x->buf + x->len, sizeof(x->buf) - x->len, 0);
        ck_assert_msg(got > 0, "recv: %s", got == 0 ? "closed" : strerror(errno));
        x->len += (size_t)got;
    }
}

/* The next response, of which only its `status` and, unless `name` is NULL,
 * that its header `name` holds `value` matter. */
static void recv_expect(rx_t *x, bool head, int status, const char *name, const char *value)
{
    resp_t r;
    recv_resp(x, head, status, &r);
    resp_done(&r, name, value);
}

/* The server closes the connection: EOF, nothing more to read. */
static void expect_eof(rx_t *x)
{
    ck_assert_uint_eq(x->len, 0);
    char c;
    ssize_t n;
    do
        n = recv(x->fd, &c, 1, 0);
    while (n < 0 && errno == EINTR);
    ck_assert_msg(n == 0, "expected EOF, got %zd (%s)", n, n < 0 ? strerror(errno) : "data");
}

static int get_status(rx_t *x, const char *path)
{
    char req[256];
    resp_t r;
    snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: test\r\n\r\n", path);
    send_str(x->fd, req);
    recv_resp(x, false, 0, &r);
    resp_free(&r);
    return r.status;
}

START_TEST(test_live_health_toggle)
{
    rx_t *x = rx_new(dial());
    ck_assert_int_eq(get_status(x, "/health"), 200);
    atomic_store(&healthy_flag, false);
    resp_t r;
    send_str(x->fd, "GET /health HTTP/1.1\r\n\r\n");
    recv_resp(x, false, 503, &r);
    ck_assert_str_eq(r.body, "{\"status\":\"draining\"}\n");
    resp_free(&r);
    atomic_store(&healthy_flag, true);
    ck_assert_int_eq(get_status(x, "/health"), 200);
    rx_free(x);
}
END_TEST

START_TEST(test_live_stats)
{
    rx_t *x = rx_new(dial());
    resp_t r;
    send_str(x->fd, "GET /stats HTTP/1.1\r\n\r\n");
    recv_resp(x, false, 200, &r);
    ck_assert(has_header(&r, "content-type", "application/json"));
    check_stats_json(r.body);
    resp_free(&r);
    rx_free(x);
}
END_TEST

START_TEST(test_live_metrics)
{
    rx_t *x = rx_new(dial());
    resp_t r;
    send_str(x->fd, "GET /metrics HTTP/1.1\r\n\r\n");
    recv_resp(x, false, 200, &r);
    ck_assert(has_header(&r, "content-type", "text/plain; version=0.0.4; charset=utf-8"));
    static const char *const names[] = {
        "slotd_cache_entries 11\n",
        "slotd_live_sessions 2\n",
        "slotd_pool_bytes{state=\"used\"} 1024\n",
        "slotd_pool_slots{state=\"free\"} 6\n",
        "slotd_g_calls_total 33\n",
        "slotd_attention_rows_total 44\n",
        "slotd_requests_total{op=\"invalid\"} ",
        "slotd_errors_total{code=\"bad_json\"} ",
        "slotd_sessions_released_total{reason=\"shutdown\"} ",
        "slotd_connections 5\n",
        "# TYPE slotd_step_seconds histogram\n",
        "slotd_steps_in_flight 0\n",
        "slotd_cache_divergence_total 0\n",
        "slotd_uptime_seconds ",
        "slotd_threads 3\n",
        "# TYPE slotd_last_step_age_seconds gauge\n",
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        ck_assert_msg(strstr(r.body, names[i]) != NULL, "missing %s", names[i]);
    resp_free(&r);
    rx_free(x);
}
END_TEST

START_TEST(test_live_errors_keep_open)
{
    rx_t *x = rx_new(dial());
    ck_assert_int_eq(get_status(x, "/nope"), 404);
    send_str(x->fd, "POST /health HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}");
    recv_expect(x, false, 405, "allow", "GET, HEAD");
    ck_assert_int_eq(get_status(x, "/health"), 200);
    rx_free(x);
}
END_TEST

START_TEST(test_live_garbage_closes)
{
    rx_t *x = rx_new(dial());
    /* More garbage follows the first bad line: the response must still
     * arrive rather than a reset. */
    send_str(x->fd, "garbage\r\n\r\nmore garbage that the server will not read\r\n");
    recv_expect(x, false, 400, "connection", "close");
    expect_eof(x);
    rx_free(x);

    /* The port serves on. */
    x = rx_new(dial());
    ck_assert_int_eq(get_status(x, "/health"), 200);
    rx_free(x);
}
END_TEST

START_TEST(test_live_pipelined)
{
    rx_t *x = rx_new(dial());
    resp_t r;
    send_str(x->fd, "GET /health HTTP/1.1\r\n\r\nGET /stats HTTP/1.1\r\n\r\n"
                    "HEAD /metrics HTTP/1.1\r\n\r\nGET /nope HTTP/1.1\r\n\r\n");
    recv_resp(x, false, 200, &r);
    ck_assert_str_eq(r.body, "{\"status\":\"ok\"}\n");
    resp_free(&r);
    recv_resp(x, false, 200, &r);
    check_stats_json(r.body);
    resp_free(&r);
    recv_resp(x, true, 200, &r);
    ck_assert_uint_gt(r.body_len, 0);
    resp_free(&r);
    recv_expect(x, false, 404, NULL, NULL);
    /* Still open. */
    ck_assert_int_eq(get_status(x, "/health"), 200);
    rx_free(x);
}
END_TEST

START_TEST(test_live_many_pipelined)
{
    /* Far more output than the high mark, read only after sending all. */
    rx_t *x = rx_new(dial());
    const char *one = "GET /metrics HTTP/1.1\r\n\r\n";
    size_t count = 300;
    char *req = malloc(count * strlen(one) + 1);
    req[0] = '\0';
    for (size_t i = 0; i < count; i++)
        strcat(req, one);
    send_str(x->fd, req);
    free(req);
    for (size_t i = 0; i < count; i++) {
        recv_expect(x, false, 200, NULL, NULL);
    }
    ck_assert_int_eq(get_status(x, "/health"), 200);
    rx_free(x);
}
END_TEST

START_TEST(test_live_single_bytes)
{
    rx_t *x = rx_new(dial());
    resp_t r;
    const char *req = "GET /stats?x=y HTTP/1.1\r\nHost: test\r\nAccept: */*\r\n\r\n";
    for (const char *p = req; *p; p++) {
        char one[2] = {*p, 0};
        send_str(x->fd, one);
        /* Pacing, not synchronisation: the response is the same whatever
         * reads the bytes arrive in; the gap makes one byte a read likely. */
        usleep(500);
    }
    recv_resp(x, false, 200, &r);
    check_stats_json(r.body);
    resp_free(&r);
    rx_free(x);
}
END_TEST

START_TEST(test_live_connection_close_and_half_close)
{
    rx_t *x = rx_new(dial());
    send_str(x->fd, "GET /health HTTP/1.1\r\nConnection: close\r\n\r\n");
    recv_expect(x, false, 0, "connection", "close");
    expect_eof(x);
    rx_free(x);

    /* The client sends and shuts its side: it still gets its answers. */
    x = rx_new(dial());
    send_str(x->fd, "GET /health HTTP/1.1\r\n\r\nGET /nope HTTP/1.1\r\n\r\n");
    shutdown(x->fd, SHUT_WR);
    recv_expect(x, false, 200, NULL, NULL);
    recv_expect(x, false, 404, NULL, NULL);
    expect_eof(x);
    rx_free(x);
}
END_TEST

START_TEST(test_live_connection_limit)
{
    enum { N = 64 };
    rx_t *x[N];
    for (int i = 0; i < N; i++) {
        x[i] = rx_new(dial());
        ck_assert_int_eq(get_status(x[i], "/health"), 200); /* accepted and served */
    }
    /* One more: served, and the oldest idle connection makes room. */
    rx_t *over = rx_new(dial());
    ck_assert_int_eq(get_status(over, "/health"), 200);
    expect_eof(x[0]);
    for (int i = 1; i < N; i++)
        ck_assert_int_eq(get_status(x[i], "/health"), 200);
    ck_assert_int_eq(get_status(over, "/health"), 200);

    /* A connection with half a request gives way only after the idle
     * ones: x[1] is now the oldest idle, x[2] the oldest of all. */
    send_str(x[2]->fd, "GET /hea");
    /* A round trip on another connection: the loop reads x[2]'s bytes, sent
     * before, no later than this request, and accepts `more` only after. */
    ck_assert_int_eq(get_status(over, "/health"), 200);
    rx_t *more = rx_new(dial());
    ck_assert_int_eq(get_status(more, "/stats"), 200);
    expect_eof(x[1]);
    send_str(x[2]->fd, "lth HTTP/1.1\r\n\r\n");
    recv_expect(x[2], false, 200, NULL, NULL);

    rx_free(over);
    rx_free(more);
    for (int i = 0; i < N; i++)
        rx_free(x[i]);
}
END_TEST

START_TEST(test_live_idle_timeout)
{
    live_teardown();
    live_idle_ms = 200;
    start_on("127.0.0.1");
    live_idle_ms = 30000;
    rx_t *served = rx_new(dial());
    ck_assert_int_eq(get_status(served, "/health"), 200);
    rx_t *silent = rx_new(dial());
    rx_t *partial = rx_new(dial());
    send_str(partial->fd, "GET /he");
    /* Each is closed once 200 ms pass without a response (bounded by the
     * socket's 10 s receive timeout). */
    expect_eof(served);
    expect_eof(silent);
    expect_eof(partial);
    rx_free(served);
    rx_free(silent);
    rx_free(partial);
}
END_TEST

START_TEST(test_live_close_with_open_connections)
{
    /* Teardown closes the admin port while these are open or mid-request;
     * the loop must still end with every handle closed and nothing leaked. */
    rx_t *a = rx_new(dial());
    rx_t *b = rx_new(dial());
    ck_assert_int_eq(get_status(a, "/health"), 200);
    send_str(b->fd, "GET /hea");
    /* The loop has read b's bytes once it answers a request sent after them. */
    ck_assert_int_eq(get_status(a, "/health"), 200);
    live_teardown();
    expect_eof(a);
    rx_free(a);
    rx_free(b);
    live_setup(); /* for the fixture's teardown */
}
END_TEST

START_TEST(test_live_ipv6)
{
    /* Replace the IPv4 instance with one on ::1 (the part "ipv6": only
     * where this host has it). */
    live_teardown();
    start_on("::1");
    rx_t *x = rx_new(dial_family(AF_INET6, port));
    ck_assert_int_eq(get_status(x, "/health"), 200);
    rx_free(x);
    live_teardown();
    start_on("[::1]");
    x = rx_new(dial_family(AF_INET6, port));
    ck_assert_int_eq(get_status(x, "/metrics"), 200);
    rx_free(x);
}
END_TEST

START_TEST(test_start_errors)
{
    uv_loop_t l;
    admin_t *a = (admin_t *)&l; /* must be reset to NULL */
    ck_assert_int_eq(uv_loop_init(&l), 0);
    ck_assert_int_eq(admin_start(&l, "localhost", 0, 5000, &hooks, &a), UV_EINVAL);
    ck_assert_ptr_null(a);
    ck_assert_int_eq(admin_start(&l, "127.0.0.1", 70000, 5000, &hooks, &a), UV_EINVAL);
    ck_assert_int_eq(admin_start(&l, "127.0.0.1", -1, 5000, &hooks, &a), UV_EINVAL);
    ck_assert_int_eq(admin_start(&l, "[::1", 0, 5000, &hooks, &a), UV_EINVAL);
    ck_assert_int_eq(admin_start(&l, "127.0.0.1", 0, 0, &hooks, &a), UV_EINVAL);

    /* A port in use: the error comes back and the half-made listener is
     * freed when the loop runs. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof(sa);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(fd, 1), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    int rc = admin_start(&l, "127.0.0.1", ntohs(sa.sin_port), 5000, &hooks, &a);
    ck_assert_int_eq(rc, UV_EADDRINUSE);
    ck_assert_ptr_null(a);
    uv_run(&l, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&l), 0);
    close(fd);

    /* Start and close without ever running a connection. */
    ck_assert_int_eq(uv_loop_init(&l), 0);
    ck_assert_int_eq(admin_start(&l, "127.0.0.1", 0, 5000, NULL, &a), 0);
    admin_close(a);
    uv_run(&l, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&l), 0);
}
END_TEST

/* Whether this host can bind the IPv6 loopback. */
static bool have_ipv6_loopback(void)
{
    int probe = socket(AF_INET6, SOCK_STREAM, 0);
    struct sockaddr_in6 sa = {.sin6_family = AF_INET6, .sin6_addr = in6addr_loopback};
    bool have6 = probe >= 0 && bind(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0;

    if (probe >= 0)
        close(probe);
    return have6;
}

/* The part "ipv6" (a CTest entry of its own): the live instance on ::1. */
static Suite *ipv6_suite(void)
{
    Suite *s = suite_create("admin_ipv6");
    TCase *tc = tcase_create("live");

    tcase_add_checked_fixture(tc, live_setup, live_teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_live_ipv6);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *admin_suite(void)
{
    Suite *s = suite_create("admin");

    TCase *tc = tcase_create("http");
    tcase_add_test(tc, test_http_health);
    tcase_add_test(tc, test_http_no_hooks);
    tcase_add_test(tc, test_http_health_gauges);
    tcase_add_test(tc, test_http_bearer);
    tcase_add_test(tc, test_http_tenants_reload);
    tcase_add_test(tc, test_http_stats);
    tcase_add_test(tc, test_http_metrics);
    tcase_add_test(tc, test_http_head);
    tcase_add_test(tc, test_http_not_found_keeps_open);
    tcase_add_test(tc, test_http_method);
    tcase_add_test(tc, test_http_garbage);
    tcase_add_test(tc, test_http_garbage_after_good);
    tcase_add_test(tc, test_http_limits);
    tcase_add_test(tc, test_http_connection_close);
    tcase_add_test(tc, test_http_10);
    tcase_add_test(tc, test_http_upgrade);
    tcase_add_test(tc, test_http_split_bytes);
    tcase_add_test(tc, test_http_backpressure);
    tcase_add_test(tc, test_http_empty_and_partial);
    tcase_add_test(tc, test_http_nomem);
    suite_add_tcase(s, tc);

    tc = tcase_create("live");
    tcase_add_checked_fixture(tc, live_setup, live_teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_live_health_toggle);
    tcase_add_test(tc, test_live_stats);
    tcase_add_test(tc, test_live_metrics);
    tcase_add_test(tc, test_live_errors_keep_open);
    tcase_add_test(tc, test_live_garbage_closes);
    tcase_add_test(tc, test_live_pipelined);
    tcase_add_test(tc, test_live_many_pipelined);
    tcase_add_test(tc, test_live_single_bytes);
    tcase_add_test(tc, test_live_connection_close_and_half_close);
    tcase_add_test(tc, test_live_connection_limit);
    tcase_add_test(tc, test_live_idle_timeout);
    tcase_add_test(tc, test_live_close_with_open_connections);
    suite_add_tcase(s, tc);

    tc = tcase_create("start");
    tcase_add_test(tc, test_start_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    bool ipv6 = argc > 1 && strcmp(argv[1], "ipv6") == 0;

    if (ipv6 && !have_ipv6_loopback()) {
        fprintf(stderr, "SKIP: no IPv6 loopback on this host\n");
        return 77; /* CTest's SKIP_RETURN_CODE */
    }
    SRunner *sr = srunner_create(ipv6 ? ipv6_suite() : admin_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
