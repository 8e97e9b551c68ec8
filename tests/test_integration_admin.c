/*
 * test_integration_admin.c: the admin port, over real HTTP/1.1.
 *
 * GET /health answers 200 and {"status":"ok"}; GET /stats answers the same
 * figures as the stats op on the session port, taken at the same moment;
 * GET /metrics answers Prometheus text with the 0.0.4 content type, every
 * name prefixed slotd_, counters ending _total, every stats figure present,
 * and `promtool check metrics` (PROMTOOL, or promtool on the PATH; the test
 * fails without it) accepts the body.  An unknown path is 404, another
 * method 405, a malformed request 400; after each of those, and after
 * connections that send half a request or nothing, the daemon still serves
 * both ports.
 *
 * The admin port's own address and its connections: --admin-listen binds
 * it apart from --listen (loopback by default), a bad address stops
 * start-up with status 2; with the connection limit's worth of idle admin
 * connections held open a new connection's /health still answers 200, and
 * idle ones are closed after --admin-idle-timeout.
 *
 * GET /sessions: each session's connection, size and state; its
 * shared_entries follow a fork both ways and the prefix cache.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "itest.h"

START_TEST(test_health)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_http_t h;
    itest_http_get(d, "/health", &h);
    ck_assert_msg(h.status == 200, "GET /health: %d\n%s", h.status, h.head);
    cJSON *j = cJSON_Parse(h.body);
    ck_assert_msg(cJSON_IsObject(j), "GET /health body is not a JSON object: %s", h.body);
    ck_assert_str_eq(itest_str(j, "status"), "ok");
    cJSON_Delete(j);
    itest_http_free(&h);
}
END_TEST

/* The figures that cannot move between the two readings. */
static const char *const stable[] = {
    "cache_entries",
    "live_sessions",
    "g_calls",
    "rows",
    "connections",
    "errors_total",
    "pool_bytes_total",
    "pool_bytes_used",
    "pool_slots_total",
    "pool_slots_used",
    "released.finish",
    "released.disconnect",
    "released.idle",
    "released.shutdown",
    NULL,
};

START_TEST(test_stats_endpoint)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t p[] = {1, 2, 3};
    itest_session_t s, h, f;
    itest_session_init(&s, "s", "tiny", p, 3);
    itest_session_init(&h, "h", "hash", p, 2);
    itest_session_init(&f, "f", "tiny", p, 1);
    itest_session_start(c, &s);
    itest_session_start(c, &h);
    itest_session_start(c, &f);
    itest_session_step(c, &s, 2);
    itest_session_step(c, &h, 7);
    itest_session_finish(c, &f);
    cJSON *r = itest_rpc(c, "{\"op\":\"nope\"}");
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"generate\",\"tokens\":[1],\"steps\":3,\"use_cache\":true}");
    cJSON_Delete(r);

    cJSON *op = itest_stats(c);
    itest_http_t resp;
    itest_http_get(d, "/stats", &resp);
    ck_assert_msg(resp.status == 200, "GET /stats: %d", resp.status);
    cJSON *web = cJSON_Parse(resp.body);
    ck_assert_msg(cJSON_IsObject(web), "GET /stats body is not a JSON object: %s", resp.body);
    itest_check_stats_shape(web);
    for (int i = 0; stable[i] != NULL; i++) {
        ck_assert_msg(itest_int(web, stable[i]) == itest_int(op, stable[i]),
                      "%s: GET /stats says %lld, the stats op %lld", stable[i],
                      (long long)itest_int(web, stable[i]), (long long)itest_int(op, stable[i]));
    }
    int64_t wr = itest_int(web, "requests_total"), orq = itest_int(op, "requests_total");
    ck_assert_msg(wr >= orq && wr <= orq + 1, "requests_total: GET /stats %lld, stats op %lld",
                  (long long)wr, (long long)orq);
    ck_assert_int_eq(itest_int(web, "live_sessions"), 2);
    ck_assert_int_eq(itest_int(web, "cache_entries"), 5 + 9);
    ck_assert_int_eq(itest_int(web, "released.finish"), 1);
    ck_assert_int_eq(itest_int(web, "errors_total"), 1);
    cJSON_Delete(web);
    cJSON_Delete(op);
    itest_http_free(&resp);
    itest_session_free(&s);
    itest_session_free(&h);
    itest_session_free(&f);
    itest_close(c);
}
END_TEST

/* The value of the first sample whose name is `name` (no labels) or -1. */
static double sample(const char *body, const char *name)
{
    size_t n = strlen(name);
    for (const char *line = body; line != NULL && *line != '\0';) {
        if (line[0] != '#' && strncmp(line, name, n) == 0 && (line[n] == ' ' || line[n] == '{')) {
            const char *v = line[n] == '{' ? strchr(line, '}') : line + n;
            if (v != NULL) {
                if (*v == '}') {
                    v++;
                }
                return strtod(v, NULL);
            }
        }
        line = strchr(line, '\n');
        if (line != NULL) {
            line++;
        }
    }
    return -1;
}

static const char *promtool_path(void)
{
    const char *p = getenv("PROMTOOL");
    if (p != NULL && p[0] != '\0') {
        return p;
    }
    static const char *const guesses[] = {"/usr/bin/promtool", "/usr/local/bin/promtool", NULL};
    for (int i = 0; guesses[i] != NULL; i++) {
        if (access(guesses[i], X_OK) == 0) {
            return guesses[i];
        }
    }
    return NULL;
}

START_TEST(test_metrics)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    cJSON *r =
        itest_rpc(c, "{\"op\":\"start\",\"id\":\"m\",\"model\":\"hash\",\"prompt\":[1,2,3]}");
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"m\",\"n\":4}");
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"f\",\"prompt\":[1]}");
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"finish\",\"id\":\"f\"}");
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"bogus\"}");
    cJSON_Delete(r);

    itest_http_t m;
    itest_http_get(d, "/metrics", &m);
    ck_assert_msg(m.status == 200, "GET /metrics: %d", m.status);
    char ct[128];
    ck_assert_msg(itest_http_header(&m, "Content-Type", ct, sizeof(ct)),
                  "GET /metrics has no Content-Type:\n%s", m.head);
    ck_assert_msg(strncmp(ct, "text/plain; version=0.0.4", 25) == 0,
                  "GET /metrics Content-Type is \"%s\"", ct);

    /* Every sample and every TYPE/HELP names slotd_* or, for the standard
     * process collector's families, process_*; counters end _total. */
    int samples = 0;
    char *body = strdup(m.body);
    char *save = NULL;
    for (char *line = strtok_r(body, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "# TYPE ", 7) == 0 || strncmp(line, "# HELP ", 7) == 0) {
            ck_assert_msg(strncmp(line + 7, "slotd_", 6) == 0 ||
                              strncmp(line + 7, "process_", 8) == 0,
                          "metric without the prefix: %s", line);
            if (strncmp(line, "# TYPE ", 7) == 0) {
                char name[200], type[32];
                ck_assert_int_eq(sscanf(line + 7, "%199s %31s", name, type), 2);
                if (strcmp(type, "counter") == 0) {
                    size_t n = strlen(name);
                    ck_assert_msg(n > 6 && strcmp(name + n - 6, "_total") == 0,
                                  "counter %s does not end _total", name);
                }
            }
        } else if (line[0] != '#' && line[0] != '\0') {
            ck_assert_msg(strncmp(line, "slotd_", 6) == 0 || strncmp(line, "process_", 8) == 0,
                          "sample without the prefix: %s", line);
            samples++;
        }
    }
    free(body);
    ck_assert_int_gt(samples, 0);

    /* At least the stats figures. */
    const char *figures[] = {"cache_entries", "live_sessions", "g_calls", "rows",
                             "connections",   "requests",      "errors",  "pool_bytes",
                             "pool_slots",    "released",      NULL};
    for (int i = 0; figures[i] != NULL; i++) {
        ck_assert_msg(strstr(m.body, figures[i]) != NULL, "/metrics has nothing for %s:\n%s",
                      figures[i], m.body);
    }
    for (int i = 0; figures[i] != NULL; i++) {
        char name[64];
        snprintf(name, sizeof(name), "slotd_%s", figures[i]);
        double v = sample(m.body, name);
        if (v >= 0 && strcmp(figures[i], "cache_entries") == 0) {
            ck_assert_msg(v == 7, "slotd_cache_entries is %g, expected 7", v);
        }
        if (v >= 0 && strcmp(figures[i], "live_sessions") == 0) {
            ck_assert_msg(v == 1, "slotd_live_sessions is %g, expected 1", v);
        }
    }

    /* promtool accepts it. */
    const char *promtool = promtool_path();
    ck_assert_msg(promtool != NULL, "promtool not found (set PROMTOOL)");
    const char *argv[] = {promtool, "check", "metrics", NULL};
    char *out = NULL, *err = NULL;
    int code = itest_run(argv, m.body, m.body_len, &out, &err, 20000);
    ck_assert_msg(code == 0, "promtool check metrics exited %d:\n%s%s\n--- body ---\n%s", code, out,
                  err, m.body);
    free(out);
    free(err);
    itest_http_free(&m);
    itest_close(c);
}
END_TEST

/* Sends a raw request and returns the status (0 if none). */
static int raw_status(const itest_daemon_t *d, const char *req, size_t len)
{
    itest_http_t h;
    itest_http_raw(d->admin_port, req, len, &h);
    int status = h.status;
    itest_http_free(&h);
    return status;
}

static void still_serving(const itest_daemon_t *d, itest_conn_t *c, const char *after)
{
    itest_http_t h;
    itest_http_get(d, "/health", &h);
    ck_assert_msg(h.status == 200, "after %s: GET /health is %d", after, h.status);
    itest_http_free(&h);
    cJSON *st = itest_stats(c);
    cJSON_Delete(st);
}

/* Requests the admin port refuses, grouped by status; the session port
 * and the admin port must serve on after each group. */
#define BAD(status, what, req)                                                                     \
    {                                                                                              \
        status, what, req, sizeof(req) - 1                                                         \
    }
static const struct {
    int status;
    const char *what, *req;
    size_t len;
} admin_bad[] = {
    BAD(404, "GET /nope", "GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    BAD(404, "GET /health/x", "GET /health/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    BAD(404, "GET /metricsx", "GET /metricsx HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    BAD(404, "GET /", "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    BAD(405, "POST /health",
        "POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
    BAD(405, "POST /stats",
        "POST /stats HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"),
    BAD(405, "DELETE /metrics", "DELETE /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    BAD(405, "PUT /stats",
        "PUT /stats HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
    BAD(400, "GARBAGE", "GARBAGE\r\n\r\n"),
    BAD(400, "a header line without a colon", "GET /health HTTP/1.1\r\nBad Header Line\r\n\r\n"),
    BAD(400, "binary garbage", "\x01\x02\x03\x04\r\n\r\n"),
    BAD(400, "a control byte in a header name", "GET /health HTTP/1.1\r\nHo\x01st: x\r\n\r\n"),
    BAD(400, "a negative Content-Length", "GET /health HTTP/1.1\r\nContent-Length: -5\r\n\r\n"),
};
#undef BAD

START_TEST(test_admin_errors)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    size_t n = sizeof(admin_bad) / sizeof(admin_bad[0]);

    for (size_t i = 0; i < n; i++) {
        int s = raw_status(d, admin_bad[i].req, admin_bad[i].len);
        ck_assert_msg(s == admin_bad[i].status, "%s: %d, not %d", admin_bad[i].what, s,
                      admin_bad[i].status);
        if (i + 1 == n || admin_bad[i + 1].status != admin_bad[i].status) {
            char after[16];
            snprintf(after, sizeof(after), "%ds", admin_bad[i].status);
            still_serving(d, c, after);
        }
    }

    /* Half a request, then a close; and a connection that says nothing. */
    for (int i = 0; i < 20; i++) {
        itest_conn_t *h = itest_try_connect(d->admin_port);
        ck_assert_ptr_nonnull(h);
        if (i % 2 == 0) {
            itest_send_str(h, "GET /hea");
        }
        if (i % 3 == 0) {
            itest_close_reset(h);
        } else {
            itest_close(h);
        }
    }
    still_serving(d, c, "half requests");

    /* Many requests in a row. */
    for (int i = 0; i < 50; i++) {
        itest_http_t h;
        itest_http_get(d, i % 2 ? "/stats" : "/metrics", &h);
        ck_assert_int_eq(h.status, 200);
        itest_http_free(&h);
    }
    still_serving(d, c, "100 requests");
    itest_close(c);
}
END_TEST

/* The admin port's connection limit (ADMIN_MAX_CONNS in server/admin/admin.c). */
#define ADMIN_LIMIT 64

/* GET /health on a connection kept open; its status, or 0 if the
 * connection closed or nothing came. */
static int held_health(itest_conn_t *c)
{
    if (!itest_send_str(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"))
        return 0;
    char *line = itest_read_line(c, ITEST_REPLY_MS, NULL);
    int status = 0;
    if (line == NULL || sscanf(line, "HTTP/1.1 %d", &status) != 1) {
        free(line);
        return 0;
    }
    free(line);
    /* The headers, the blank line, then the body: one JSON line. */
    while ((line = itest_read_line(c, ITEST_REPLY_MS, NULL)) != NULL && strcmp(line, "\r") != 0)
        free(line);
    ck_assert_msg(line != NULL, "GET /health: the headers do not end");
    free(line);
    line = itest_read_line(c, ITEST_REPLY_MS, NULL);
    ck_assert_msg(line != NULL, "GET /health: no body");
    free(line);
    return status;
}

START_TEST(test_admin_limit_keeps_health)
{
    /* A long idle timeout: here only the limit closes connections. */
    itest_daemon_t *d = itest_daemon_start("--admin-idle-timeout", "600", NULL);
    itest_conn_t *held[ADMIN_LIMIT];
    for (int i = 0; i < ADMIN_LIMIT; i++) {
        held[i] = itest_try_connect(d->admin_port);
        ck_assert_msg(held[i] != NULL, "admin connection %d: %s", i, strerror(errno));
        ck_assert_int_eq(held_health(held[i]), 200);
    }
    /* The limit is reached by idle keep-alive connections: each new one is
     * served, and the oldest idle one makes room. */
    enum { FRESH = 8 };
    itest_conn_t *fresh[FRESH];
    for (int i = 0; i < FRESH; i++) {
        fresh[i] = itest_try_connect(d->admin_port);
        ck_assert_ptr_nonnull(fresh[i]);
        int st = held_health(fresh[i]);
        ck_assert_msg(st == 200, "fresh connection %d at the limit: GET /health is %d", i, st);
    }
    for (int i = 0; i < FRESH; i++)
        ck_assert_msg(itest_expect_closed(held[i], ITEST_REPLY_MS),
                      "held connection %d, among the %d oldest, was not closed to make room", i,
                      FRESH);
    for (int i = FRESH; i < ADMIN_LIMIT; i++)
        ck_assert_msg(held_health(held[i]) == 200, "held connection %d was closed", i);
    for (int i = 0; i < FRESH; i++)
        ck_assert_int_eq(held_health(fresh[i]), 200);
    /* A client that closes after each request is served as well. */
    for (int i = 0; i < 3; i++) {
        itest_http_t h;
        itest_http_get(d, i == 1 ? "/stats" : "/health", &h);
        ck_assert_int_eq(h.status, 200);
        itest_http_free(&h);
    }
    for (int i = 0; i < ADMIN_LIMIT; i++)
        itest_close(held[i]);
    for (int i = 0; i < FRESH; i++)
        itest_close(fresh[i]);
}
END_TEST

START_TEST(test_admin_idle_timeout)
{
    itest_daemon_t *d = itest_daemon_start("--admin-idle-timeout", "1", NULL);
    enum { N = 6 };
    itest_conn_t *c[N];
    for (int i = 0; i < N; i++) {
        c[i] = itest_try_connect(d->admin_port);
        ck_assert_ptr_nonnull(c[i]);
    }
    /* Served once and then idle; never a byte; half a request. */
    ck_assert_int_eq(held_health(c[0]), 200);
    ck_assert_int_eq(held_health(c[1]), 200);
    itest_send_str(c[2], "GET /hea");
    for (int i = 0; i < N; i++)
        ck_assert_msg(itest_expect_closed(c[i], itest_scale_ms(10000)),
                      "idle admin connection %d still open 10 s after a 1 s idle timeout", i);
    for (int i = 0; i < N; i++)
        itest_close(c[i]);
    /* The port itself serves on. */
    itest_http_t h;
    itest_http_get(d, "/health", &h);
    ck_assert_int_eq(h.status, 200);
    itest_http_free(&h);
}
END_TEST

/* True if `host`:`port` accepts a TCP connection. */
static bool accepts_on(const char *host, int port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    ck_assert_int_eq(inet_pton(AF_INET, host, &sa.sin_addr), 1);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    bool ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    int e = errno;
    close(fd);
    ck_assert_msg(ok || e == ECONNREFUSED, "connect to %s:%d: %s", host, port, strerror(e));
    return ok;
}

/* True if the daemon's log has a line containing `text`. */
static bool log_has(const itest_daemon_t *d, const char *text)
{
    FILE *f = fopen(d->log, "r");
    ck_assert_ptr_nonnull(f);
    char line[1024];
    bool found = false;
    while (!found && fgets(line, sizeof(line), f) != NULL)
        found = strstr(line, text) != NULL;
    fclose(f);
    return found;
}

/* Every 127/8 address is this host's loopback; the daemon's sockets bound
 * to 127.0.0.1 are not reachable on 127.0.0.2, those bound to 0.0.0.0 are. */
START_TEST(test_admin_listen_apart)
{
    itest_daemon_t *d = itest_daemon_start("--listen", "0.0.0.0", "--admin-listen", "127.0.0.1",
                                           "--protected-mode", "no", NULL);
    char want[64];
    snprintf(want, sizeof(want), "listening on 0.0.0.0:%d", d->port);
    ck_assert_msg(log_has(d, want), "no '%s' in the log", want);
    snprintf(want, sizeof(want), "admin port on 127.0.0.1:%d", d->admin_port);
    ck_assert_msg(log_has(d, want), "no '%s' in the log", want);
    ck_assert_msg(accepts_on("127.0.0.2", d->port), "the session port is not on every address");
    ck_assert_msg(!accepts_on("127.0.0.2", d->admin_port), "the admin port is on 127.0.0.2");
    ck_assert(accepts_on("127.0.0.1", d->admin_port));
    itest_daemon_stop(d);

    /* SLOTD_ADMIN_LISTEN does the same. */
    setenv("SLOTD_ADMIN_LISTEN", "127.0.0.1", 1);
    d = itest_daemon_start("--listen", "0.0.0.0", "--protected-mode", "no", NULL);
    unsetenv("SLOTD_ADMIN_LISTEN");
    ck_assert(accepts_on("127.0.0.2", d->port));
    ck_assert(!accepts_on("127.0.0.2", d->admin_port));
}
END_TEST

START_TEST(test_admin_listen_default_loopback)
{
    unsetenv("SLOTD_ADMIN_LISTEN");
    itest_daemon_t *d = itest_daemon_start("--listen", "0.0.0.0", "--protected-mode", "no", NULL);
    ck_assert(accepts_on("127.0.0.2", d->port));
    ck_assert_msg(!accepts_on("127.0.0.2", d->admin_port),
                  "--listen 0.0.0.0 moved the admin port off loopback");
    char want[64];
    snprintf(want, sizeof(want), "admin port on 127.0.0.1:%d", d->admin_port);
    ck_assert_msg(log_has(d, want), "no '%s' in the log", want);
}
END_TEST

START_TEST(test_admin_listen_bad)
{
    static const char *const bad[] = {"localhost", "127.0.0.256", "::1%", "[::1", "", NULL};
    for (int i = 0; bad[i] != NULL; i++) {
        const char *argv[] = {
            itest_slotd_bin(), "--admin-listen", bad[i], "--port", "0", "--admin-port", "0", NULL};
        char *out = NULL, *err = NULL;
        int rc = itest_run(argv, NULL, 0, &out, &err, itest_scale_ms(10000));
        char want[128];
        snprintf(want, sizeof(want),
                 "slotd: --admin-listen: '%s' is not a numeric IPv4 or IPv6 address\n", bad[i]);
        ck_assert_msg(rc == 2, "--admin-listen '%s': exit %d", bad[i], rc);
        ck_assert_msg(strcmp(err, want) == 0, "--admin-listen '%s': stderr '%s'", bad[i], err);
        ck_assert_str_eq(out, "");
        free(out);
        free(err);
    }
}
END_TEST

/* GET /sessions`query` parsed; fails unless it is 200 and a JSON object. */
static cJSON *get_sessions(const itest_daemon_t *d, const char *query)
{
    char path[128];
    snprintf(path, sizeof(path), "/sessions%s", query);
    itest_http_t h;
    itest_http_get(d, path, &h);
    ck_assert_msg(h.status == 200, "GET %s: %d", path, h.status);
    cJSON *j = cJSON_Parse(h.body);
    ck_assert_msg(cJSON_IsObject(j), "GET %s: not a JSON object: %s", path, h.body);
    itest_http_free(&h);
    return j;
}

/* The listed session `id`, or NULL. */
static const cJSON *listed(const cJSON *j, const char *id)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "sessions"))
    {
        if (strcmp(itest_str(e, "id"), id) == 0)
            return e;
    }
    return NULL;
}

static int local_port(itest_conn_t *c)
{
    struct sockaddr_in sa;
    socklen_t len = sizeof(sa);
    ck_assert_int_eq(getsockname(itest_conn_fd(c), (struct sockaddr *)&sa, &len), 0);
    return ntohs(sa.sin_port);
}

START_TEST(test_sessions_list)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *a = itest_connect(d), *b = itest_connect(d);
    cJSON *r = itest_rpc(a, "{\"op\":\"start\",\"id\":\"big\",\"prompt\":[1,2,3,4,5,0]}");
    cJSON_Delete(r);
    r = itest_rpc(a, "{\"op\":\"start\",\"id\":\"h\",\"model\":\"hash\",\"prompt\":[1,2,3]}");
    cJSON_Delete(r);
    r = itest_rpc(b, "{\"op\":\"start\",\"id\":\"small\",\"prompt\":[1]}");
    cJSON_Delete(r);

    cJSON *j = get_sessions(d, "");
    ck_assert_int_eq(itest_int(j, "total"), 3);
    ck_assert_int_eq(itest_int(j, "limit"), 100);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "sessions");
    ck_assert_int_eq(cJSON_GetArraySize(list), 3);
    /* Largest first: tiny entries are 256 bytes, hash ones 8. */
    int64_t last = INT64_MAX;
    const cJSON *e;
    cJSON_ArrayForEach(e, list)
    {
        ck_assert_int_le(itest_int(e, "pool_bytes"), last);
        last = itest_int(e, "pool_bytes");
        ck_assert_str_eq(itest_str(e, "state"), "idle");
        ck_assert_int_eq(itest_int(e, "outstanding"), 0);
        const cJSON *age = cJSON_GetObjectItemCaseSensitive(e, "age_seconds");
        const cJSON *idle = cJSON_GetObjectItemCaseSensitive(e, "idle_seconds");
        ck_assert(cJSON_IsNumber(age) && age->valuedouble >= 0 && age->valuedouble < 600);
        ck_assert(cJSON_IsNumber(idle) && idle->valuedouble >= 0 &&
                  idle->valuedouble <= age->valuedouble + 0.001);
    }
    ck_assert_str_eq(itest_str(cJSON_GetArrayItem(list, 0), "id"), "big");
    const cJSON *big = listed(j, "big"), *h = listed(j, "h"), *small = listed(j, "small");
    ck_assert(big && h && small);
    ck_assert_str_eq(itest_str(big, "model"), "tiny");
    ck_assert_str_eq(itest_str(h, "model"), "hash");
    ck_assert_int_eq(itest_int(big, "entries"), 6);
    ck_assert_int_eq(itest_int(h, "entries"), 3);
    ck_assert_int_eq(itest_int(small, "entries"), 1);
    ck_assert_int_gt(itest_int(big, "pool_bytes"), itest_int(small, "pool_bytes"));
    ck_assert_int_ge(itest_int(big, "pool_bytes"), 6 * 256);
    /* The connection: one number for both sessions of `a`, another for b,
     * and each peer address is the client's end of its connection. */
    const cJSON *ca = cJSON_GetObjectItemCaseSensitive(big, "connection");
    const cJSON *ch = cJSON_GetObjectItemCaseSensitive(h, "connection");
    const cJSON *cb = cJSON_GetObjectItemCaseSensitive(small, "connection");
    ck_assert_int_eq(itest_int(ca, "number"), itest_int(ch, "number"));
    ck_assert_int_ne(itest_int(ca, "number"), itest_int(cb, "number"));
    char want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%d", local_port(a));
    ck_assert_str_eq(itest_str(ca, "peer"), want);
    snprintf(want, sizeof(want), "127.0.0.1:%d", local_port(b));
    ck_assert_str_eq(itest_str(cb, "peer"), want);
    cJSON_Delete(j);

    /* ?limit=N: the N largest, the total still counting all. */
    j = get_sessions(d, "?limit=1");
    ck_assert_int_eq(itest_int(j, "total"), 3);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "sessions")), 1);
    ck_assert_ptr_nonnull(listed(j, "big"));
    cJSON_Delete(j);
    j = get_sessions(d, "?limit=0");
    ck_assert_int_eq(itest_int(j, "total"), 3);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "sessions")), 0);
    cJSON_Delete(j);

    static const char *const bad[] = {"?limit=x",         "?limit=",         "?lim=1",
                                      "?limit=1&limit=2", "?limit=10000000", "?limit=1&",
                                      "?limit=-1",        "?limit=1;x"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char path[64];
        itest_http_t hh;
        snprintf(path, sizeof(path), "/sessions%s", bad[i]);
        itest_http_get(d, path, &hh);
        ck_assert_msg(hh.status == 400, "GET %s: %d", path, hh.status);
        itest_http_free(&hh);
    }

    /* Finished and disconnected sessions leave the list. */
    r = itest_rpc(a, "{\"op\":\"finish\",\"id\":\"h\"}");
    cJSON_Delete(r);
    itest_close(b);
    for (int tries = 0;; tries++) {
        j = get_sessions(d, "");
        int64_t total = itest_int(j, "total");
        cJSON_Delete(j);
        if (total == 1)
            break;
        ck_assert_int_lt(tries, itest_scale_ms(5000) / 10);
        usleep(10000);
    }
    itest_close(a);
}
END_TEST


/* A session whose start a worker is running has no slot yet; GET /sessions
 * still names its model (the start's), as the session port's own requests
 * see it, and lists it running with nothing in the pool. */
START_TEST(test_sessions_model_while_start_runs)
{
    /* One worker; the first job, the start, holds it until SIGUSR1. */
    itest_daemon_t *d = itest_daemon_start("--threads", "1", "--models", "hash,tiny",
                                           "--fault-wedge-after", "1", NULL);
    itest_conn_t *a = itest_connect(d);
    itest_send_str(a, "{\"op\":\"start\",\"id\":\"s\",\"model\":\"hash\",\"prompt\":[1,2]}\n");
    cJSON *j = NULL;
    const cJSON *e = NULL;
    for (int tries = 0;; tries++) {
        j = get_sessions(d, "");
        e = listed(j, "s");
        if (e != NULL && strcmp(itest_str(e, "state"), "running") == 0)
            break;
        cJSON_Delete(j);
        ck_assert_int_lt(tries, itest_scale_ms(5000) / 10);
        usleep(10000);
    }
    ck_assert_str_eq(itest_str(e, "model"), "hash");
    ck_assert_int_eq(itest_int(e, "pool_bytes"), 0);
    cJSON_Delete(j);

    itest_daemon_signal(d, SIGUSR1);
    cJSON *r = itest_read_reply(a);
    itest_expect_ok(r);
    cJSON_Delete(r);
    j = get_sessions(d, "");
    ck_assert_str_eq(itest_str(listed(j, "s"), "model"), "hash");
    cJSON_Delete(j);
    itest_close(a);
}
END_TEST

START_TEST(test_sessions_states)
{
    /* One worker; the fourth job holds it until SIGUSR1. */
    itest_daemon_t *d = itest_daemon_start("--threads", "1", "--fault-wedge-after", "4", NULL);
    itest_conn_t *a = itest_connect(d), *b = itest_connect(d);
    cJSON *r = itest_rpc(a, "{\"op\":\"start\",\"id\":\"run\",\"prompt\":[1,2]}");
    cJSON_Delete(r);
    r = itest_rpc(a, "{\"op\":\"start\",\"id\":\"rest\",\"prompt\":[1]}");
    cJSON_Delete(r);
    r = itest_rpc(b, "{\"op\":\"start\",\"id\":\"wait\",\"prompt\":[1,2,3]}");
    cJSON_Delete(r);
    /* Job 4 (run's first step) wedges the worker; run's second step waits
     * behind it, and wait's step waits for the worker. */
    itest_send_str(a, "{\"op\":\"step\",\"id\":\"run\"}\n{\"op\":\"step\",\"id\":\"run\"}\n");
    itest_send_str(b, "{\"op\":\"step\",\"id\":\"wait\"}\n");
    cJSON *j = NULL;
    for (int tries = 0;; tries++) {
        j = get_sessions(d, "");
        const cJSON *run = listed(j, "run"), *w = listed(j, "wait");
        if (run != NULL && w != NULL && strcmp(itest_str(run, "state"), "running") == 0 &&
            itest_int(w, "outstanding") == 1)
            break;
        cJSON_Delete(j);
        ck_assert_int_lt(tries, itest_scale_ms(5000) / 10);
        usleep(10000);
    }
    ck_assert_int_eq(itest_int(listed(j, "run"), "outstanding"), 2);
    ck_assert_str_eq(itest_str(listed(j, "wait"), "state"), "queued");
    ck_assert_str_eq(itest_str(listed(j, "rest"), "state"), "idle");
    ck_assert_int_eq(itest_int(listed(j, "rest"), "outstanding"), 0);
    ck_assert_double_gt(
        cJSON_GetObjectItemCaseSensitive(listed(j, "rest"), "idle_seconds")->valuedouble, -0.001);
    /* A worker may be changing the chains of run and wait: no figure. */
    ck_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(listed(j, "run"), "shared_entries")));
    ck_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(listed(j, "wait"), "shared_entries")));
    ck_assert(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(listed(j, "rest"), "shared_entries")));
    cJSON_Delete(j);

    itest_daemon_signal(d, SIGUSR1);
    for (int i = 0; i < 2; i++) {
        r = itest_read_reply(a);
        cJSON_Delete(r);
    }
    r = itest_read_reply(b);
    cJSON_Delete(r);
    j = get_sessions(d, "");
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "sessions"))
    {
        ck_assert_str_eq(itest_str(e, "state"), "idle");
        ck_assert_int_eq(itest_int(e, "outstanding"), 0);
    }
    ck_assert_int_eq(itest_int(listed(j, "run"), "entries"), 4);
    cJSON_Delete(j);
    itest_close(a);
    itest_close(b);
}
END_TEST

/* slotd_step_seconds and slotd_request_wait_seconds have a series for each
 * model served, and a request counts in its own model's only. */
START_TEST(test_step_seconds_by_model)
{
    itest_daemon_t *d = itest_daemon_start("--models", "hash,tiny", NULL);
    itest_conn_t *c = itest_connect(d);
    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"a\",\"model\":\"tiny\",\"prompt\":[1,2]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"a\"}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    ck_assert_int_eq(itest_await_metric(d, "slotd_step_seconds_count{model=\"tiny\"}", 1, 5000), 1);
    ck_assert_int_eq(itest_metric(d, "slotd_step_seconds_count{model=\"hash\"}"), 0);
    /* The waits for a worker likewise, by op and model. */
    ck_assert_int_eq(
        itest_metric(d, "slotd_request_wait_seconds_count{op=\"start\",model=\"tiny\"}"), 1);
    ck_assert_int_eq(
        itest_metric(d, "slotd_request_wait_seconds_count{op=\"step\",model=\"tiny\"}"), 1);
    ck_assert_int_eq(
        itest_metric(d, "slotd_request_wait_seconds_count{op=\"step\",model=\"hash\"}"), 0);
    itest_http_t h;
    itest_http_get(d, "/metrics", &h);
    ck_assert_ptr_null(strstr(h.body, "slotd_step_seconds_count{model=\"small\"}"));
    ck_assert_ptr_null(strstr(h.body, "slotd_step_seconds_count{model=\"base\"}"));
    itest_http_free(&h);
    itest_close(c);
}
END_TEST

/* slotd_request_duration_seconds by op and model: each request in its
 * model's series, a step or finish in its session's, a request that fails
 * once its model is found in that model's too, and one that found no model
 * (unknown session, model not loaded, stats) in its op's series with no
 * model label. */
static void rpc_expect(itest_conn_t *c, const char *line, const char *code)
{
    cJSON *r = itest_rpc(c, "%s", line);
    if (code == NULL)
        itest_expect_ok(r);
    else
        itest_expect_error(r, NULL, code, NULL);
    cJSON_Delete(r);
}

START_TEST(test_request_duration_by_model)
{
    itest_daemon_t *d = itest_daemon_start("--models", "hash,tiny", NULL);
    itest_conn_t *c = itest_connect(d);
    rpc_expect(c, "{\"op\":\"start\",\"id\":\"h\",\"model\":\"hash\",\"prompt\":[1,2]}", NULL);
    rpc_expect(c, "{\"op\":\"step\",\"id\":\"h\"}", NULL);
    rpc_expect(c, "{\"op\":\"step\",\"id\":\"h\"}", NULL);
    rpc_expect(c, "{\"op\":\"finish\",\"id\":\"h\"}", NULL);
    rpc_expect(c, "{\"op\":\"start\",\"id\":\"t\",\"model\":\"tiny\",\"prompt\":[1,2]}", NULL);
    rpc_expect(c, "{\"op\":\"step\",\"id\":\"t\"}", NULL);
    rpc_expect(c, "{\"op\":\"append\",\"id\":\"t\",\"tokens\":[3]}", NULL);
    rpc_expect(c, "{\"op\":\"fork\",\"id\":\"u\",\"from\":\"t\"}", NULL);
    rpc_expect(c, "{\"op\":\"logits\",\"model\":\"tiny\",\"tokens\":[1,2]}", NULL);
    rpc_expect(c, "{\"op\":\"logits\",\"model\":\"hash\",\"tokens\":[1,2]}", "bad_request");
    rpc_expect(c, "{\"op\":\"step\",\"id\":\"nobody\"}", "unknown_id");
    rpc_expect(c, "{\"op\":\"start\",\"id\":\"s\",\"model\":\"small\",\"prompt\":[1]}",
               "bad_request");
    rpc_expect(c, "{\"op\":\"stats\"}", NULL);

    /* Observed at the end of the loop turn that sent the last reply. */
    itest_await_metric(d, "slotd_request_duration_seconds_count{op=\"stats\"}", 1, 5000);
    static const struct {
        const char *series;
        int64_t n;
    } want[] = {
        {"{op=\"start\",model=\"hash\"}", 1},
        {"{op=\"step\",model=\"hash\"}", 2},
        {"{op=\"finish\",model=\"hash\"}", 1},
        {"{op=\"start\",model=\"tiny\"}", 1},
        {"{op=\"step\",model=\"tiny\"}", 1},
        {"{op=\"finish\",model=\"tiny\"}", 0},
        {"{op=\"append\",model=\"tiny\"}", 1},
        {"{op=\"fork\",model=\"tiny\"}", 1},
        {"{op=\"logits\",model=\"tiny\"}", 1},
        {"{op=\"logits\",model=\"hash\"}", 1},
        {"{op=\"step\"}", 1},
        {"{op=\"start\"}", 1},
        {"{op=\"stats\"}", 1},
        {"{op=\"generate\",model=\"tiny\"}", 0},
    };
    char name[160];
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        snprintf(name, sizeof(name), "slotd_request_duration_seconds_count%s", want[i].series);
        ck_assert_msg(itest_metric(d, name) == want[i].n, "%s: %" PRId64 ", not %" PRId64, name,
                      itest_metric(d, name), want[i].n);
    }
    itest_http_t h;
    itest_http_get(d, "/metrics", &h);
    ck_assert_ptr_null(
        strstr(h.body, "slotd_request_duration_seconds_count{op=\"step\",model=\"small\"}"));
    ck_assert_ptr_null(strstr(h.body, "slotd_request_duration_seconds_count{op=\"stats\",model="));
    itest_http_free(&h);
    itest_close(c);
}
END_TEST

/* The listed session `id`'s shared_entries (fails unless listed, with a number). */
static int64_t listed_shared(const itest_daemon_t *d, const char *id)
{
    cJSON *j = get_sessions(d, "");
    const cJSON *e = listed(j, id);
    ck_assert_msg(e != NULL, "%s not listed", id);
    ck_assert_msg(cJSON_GetObjectItemCaseSensitive(e, "tenant") == NULL,
                  "a tenant member without a tenants file");
    int64_t v = itest_int(e, "shared_entries");
    cJSON_Delete(j);
    return v;
}

/* shared_entries: the entries of a session in blocks another holder holds
 * too.  Without the prefix cache, a fork shares its parent's every entry
 * (full blocks and the tail) both ways, a session nobody forked shares
 * none, and the parent's count goes back to 0 when the fork finishes.
 * With it, a start whose prompt the cache had shares at least what it
 * reused. */
START_TEST(test_sessions_shared_entries)
{
    char prompt[256];
    size_t n = 0;
    for (int i = 0; i < 40; i++)
        n += (size_t)snprintf(prompt + n, sizeof(prompt) - n, "%s%d", i ? "," : "", 1 + i % 5);
    itest_daemon_t *d = itest_daemon_start("--prefix-cache", "off", NULL);
    itest_conn_t *a = itest_connect(d);
    cJSON *r = itest_rpc(a, "{\"op\":\"start\",\"id\":\"p\",\"model\":\"small\",\"prompt\":[%s]}",
                         prompt);
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_rpc(a, "{\"op\":\"start\",\"id\":\"solo\",\"model\":\"small\",\"prompt\":[%s]}",
                  prompt);
    itest_expect_ok(r);
    cJSON_Delete(r);
    ck_assert_int_eq(listed_shared(d, "p"), 0);
    r = itest_rpc(a, "{\"op\":\"fork\",\"id\":\"f\",\"from\":\"p\"}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    ck_assert_int_eq(listed_shared(d, "p"), 40);
    ck_assert_int_eq(listed_shared(d, "f"), 40);
    ck_assert_int_eq(listed_shared(d, "solo"), 0);
    r = itest_rpc(a, "{\"op\":\"finish\",\"id\":\"f\"}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    ck_assert_int_eq(listed_shared(d, "p"), 0);
    itest_close(a);
    ck_assert_int_eq(itest_daemon_stop(d), 0);

    d = itest_daemon_start(NULL);
    a = itest_connect(d);
    r = itest_rpc(a, "{\"op\":\"start\",\"id\":\"c1\",\"model\":\"small\",\"prompt\":[%s]}",
                  prompt);
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_rpc(a, "{\"op\":\"start\",\"id\":\"c2\",\"model\":\"small\",\"prompt\":[%s]}",
                  prompt);
    itest_expect_ok(r);
    int64_t cached = itest_int(r, "cached");
    cJSON_Delete(r);
    ck_assert_int_gt(cached, 0);
    ck_assert_int_ge(listed_shared(d, "c2"), cached);
    ck_assert_int_le(listed_shared(d, "c2"), 40);
    itest_close(a);
}
END_TEST

int main(int argc, char **argv)
{
    if (itest_is_part(argc, argv, "faults") && !itest_fault_hooks())
        return itest_skip("slotd built without the fault hooks (the plain stage has them)");
    Suite *s = suite_create("integration_admin");

    /* The case that holds a job on purpose (--fault-wedge-after). */
    if (itest_is_part(argc, argv, "faults")) {
        ITEST_ADD(s, test_sessions_states);
        ITEST_ADD(s, test_sessions_model_while_start_runs);
        return itest_main(s);
    }
    ITEST_ADD(s, test_health);
    ITEST_ADD(s, test_stats_endpoint);
    ITEST_ADD(s, test_metrics);
    ITEST_ADD(s, test_step_seconds_by_model);
    ITEST_ADD(s, test_request_duration_by_model);
    ITEST_ADD(s, test_admin_errors);
    ITEST_ADD(s, test_admin_limit_keeps_health);
    ITEST_ADD(s, test_admin_idle_timeout);
    ITEST_ADD(s, test_admin_listen_apart);
    ITEST_ADD(s, test_admin_listen_default_loopback);
    ITEST_ADD(s, test_admin_listen_bad);
    ITEST_ADD(s, test_sessions_list);
    ITEST_ADD(s, test_sessions_shared_entries);
    return itest_main(s);
}
