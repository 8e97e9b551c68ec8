/*
 * test_integration_tenants.c: --tenants-file on the real daemon.
 *
 * Identity: a tenant's token answers {"ok":true,"tenant":NAME}; a wrong
 * one is auth_failed; another tenant's token on an authenticated
 * connection is bad_request and changes nothing.  The admin port's routes
 * but /health need a tenant with `admin`.
 * Limits across connections: `connections` refuses the tenant's next
 * connection with too_many_connections naming the tenant (and the next
 * one is served once one closes); `sessions` and `share` refuse with
 * cache_full naming the tenant, whatever connection asks, while another
 * tenant is served, and the pool a tenant holds stays within its share.
 * Reload (SIGHUP): a dropped tenant's connection gets one auth_revoked
 * line and is closed, a kept tenant's connection serves on, a new tenant
 * can connect, new limits apply to the next request; a bad file changes
 * nothing.  POST /tenants/reload on the admin port does the same for a
 * tenant with admin (200 with the count), is 422 with the reason for a
 * bad file, and 409 without a tenants file.  GET /sessions names each
 * session's tenant; the slotd_tenant_* families of /metrics agree with
 * each tenant's `stats` and pass promtool.
 * Fairness: a tenant over 4 connections and one over 1, both flooding
 * `small` steps over 4 sessions a connection: when the 1-connection
 * tenant has its last reply, the other has had less than 3 times as many
 * (4 times, all of theirs, when each connection was its own flow).
 * Asserted on counts of replies, never on time.
 */
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "itest.h"

#define TOK_A "alice-token-0123456789abcdef"
#define TOK_B "bob-token-0123456789abcdef"
#define TOK_C "carol-token-0123456789abcdef"
#define TOK_OPS "ops-token-0123456789abcdef"

static char tenants_path[64];

/* Writes `text` as the tenants file (mode 600), the first time to a new
 * path, later over it (a reload's new file). */
static const char *tenants_file(const char *text)
{
    char tmp[80];
    int fd;

    if (tenants_path[0] == '\0') {
        snprintf(tenants_path, sizeof(tenants_path), "/tmp/slotd-tenants.XXXXXX");
        fd = mkstemp(tenants_path);
        ck_assert_int_ge(fd, 0);
        close(fd);
    }
    /* Replaced by a rename, so that a reload never reads half a file. */
    snprintf(tmp, sizeof(tmp), "%s.new", tenants_path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    ck_assert_int_eq(rename(tmp, tenants_path), 0);
    return tenants_path;
}

static void tenants_unlink(void)
{
    if (tenants_path[0] != '\0')
        unlink(tenants_path);
    tenants_path[0] = '\0';
}

/* A connection authenticated as the tenant of `token`, named `name`. */
static itest_conn_t *connect_as(const itest_daemon_t *d, const char *token, const char *name)
{
    itest_conn_t *c = itest_connect(d);
    char want[128];
    cJSON *r = itest_rpc(c, "{\"op\":\"auth\",\"token\":\"%s\"}", token);

    snprintf(want, sizeof(want), "{\"ok\":true,\"tenant\":\"%s\"}", name);
    ck_assert_msg(strcmp(itest_last_line(c), want) == 0, "auth: '%s', not '%s'",
                  itest_last_line(c), want);
    cJSON_Delete(r);
    return c;
}

static void admin_get(const itest_daemon_t *d, const char *path, const char *token,
                      itest_http_t *out)
{
    char req[512];
    snprintf(req, sizeof(req),
             "GET %s HTTP/1.1\r\nHost: x\r\n%s%s%sConnection: close\r\n\r\n", path,
             token ? "Authorization: Bearer " : "", token ? token : "", token ? "\r\n" : "");
    ck_assert_msg(itest_http_raw(d->admin_port, req, strlen(req), out), "GET %s: no response",
                  path);
}

/* GET /stats as the tenant of `token`, parsed. */
static cJSON *itest_admin_stats_as(const itest_daemon_t *d, const char *token)
{
    itest_http_t h;
    cJSON *st;

    admin_get(d, "/stats", token, &h);
    ck_assert_int_eq(h.status, 200);
    st = cJSON_Parse(h.body);
    ck_assert_ptr_nonnull(st);
    itest_http_free(&h);
    return st;
}

/* The unlabelled sample `name` of GET /metrics as the tenant of `token`,
 * once it is at least `min` (polled for up to ITEST_REPLY_MS). */
static long await_metric_as(const itest_daemon_t *d, const char *token, const char *name, long min)
{
    long v = -1;
    char key[128];

    snprintf(key, sizeof(key), "\n%s ", name);
    for (int i = 0; i < ITEST_REPLY_MS / 10; i++) {
        itest_http_t h;
        const char *p;
        admin_get(d, "/metrics", token, &h);
        ck_assert_int_eq(h.status, 200);
        p = strstr(h.body, key);
        ck_assert_msg(p != NULL, "no %s in /metrics", name);
        v = strtol(p + strlen(key), NULL, 10);
        itest_http_free(&h);
        if (v >= min)
            break;
        usleep(10000);
    }
    return v;
}

/* Whether the last reply on `c` is error `code` whose message names `what`. */
static void expect_error_naming(itest_conn_t *c, cJSON *r, const char *code, const char *what)
{
    ck_assert_msg(itest_is_error(r, code), "wanted %s, got '%s'", code, itest_last_line(c));
    ck_assert_msg(strstr(itest_last_line(c), what) != NULL, "'%s' does not name '%s'",
                  itest_last_line(c), what);
}

/* Sends the request `fmt` (printf-style, without the newline) on `c`;
 * returns its reply. */
static cJSON *rpc_v(itest_conn_t *c, const char *fmt, va_list ap)
{
    char line[8192];
    int n = vsnprintf(line, sizeof(line), fmt, ap);

    ck_assert(n >= 0 && (size_t)n < sizeof(line));
    return itest_rpc(c, "%s", line);
}

/* Sends a request that must succeed. */
static void rpc_ok(itest_conn_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rpc_ok(itest_conn_t *c, const char *fmt, ...)
{
    va_list ap;
    cJSON *r;

    va_start(ap, fmt);
    r = rpc_v(c, fmt, ap);
    va_end(ap);
    itest_expect_ok(r);
    cJSON_Delete(r);
}

/* Sends a request that must fail with error `code` naming `what`. */
static void rpc_error_naming(itest_conn_t *c, const char *code, const char *what, const char *fmt,
                             ...) __attribute__((format(printf, 4, 5)));
static void rpc_error_naming(itest_conn_t *c, const char *code, const char *what, const char *fmt,
                             ...)
{
    va_list ap;
    cJSON *r;

    va_start(ap, fmt);
    r = rpc_v(c, fmt, ap);
    va_end(ap);
    expect_error_naming(c, r, code, what);
    cJSON_Delete(r);
}

/* The status of GET `path` on the admin port as the tenant of `token`
 * (NULL: none). */
static int admin_status(const itest_daemon_t *d, const char *path, const char *token)
{
    itest_http_t h;
    int status;

    admin_get(d, path, token, &h);
    status = h.status;
    itest_http_free(&h);
    return status;
}

/* `token` on a fresh connection is auth_failed (and, if `closed`, the
 * connection is closed). */
static void auth_fails(const itest_daemon_t *d, const char *token, bool closed)
{
    itest_conn_t *c = itest_connect(d);
    cJSON *r = itest_rpc(c, "{\"op\":\"auth\",\"token\":\"%s\"}", token);

    itest_expect_error(r, NULL, "auth_failed", NULL);
    cJSON_Delete(r);
    if (closed)
        ck_assert(itest_expect_closed(c, ITEST_REPLY_MS));
    itest_close(c);
}

/* Writes into `buf` a JSON array of `count` tokens: `first`, then
 * (i * mul) % 500 for i = 1 .. count - 1. */
static void prompt_json(char *buf, size_t size, int first, int count, int mul)
{
    size_t n = (size_t)snprintf(buf, size, "[%d", first);

    for (int i = 1; i < count; i++)
        n += (size_t)snprintf(buf + n, size - n, ",%d", (i * mul) % 500);
    snprintf(buf + n, size - n, "]");
    ck_assert(n + 1 < size);
}

START_TEST(test_tenant_identity)
{
    itest_daemon_t *d = itest_daemon_start(
        "--tenants-file",
        tenants_file("# the tenants\n"
                     "alice " TOK_A "\n"
                     "bob " TOK_B " weight=2\n"
                     "ops " TOK_OPS " admin\n"),
        NULL);
    itest_conn_t *c = itest_connect(d);
    cJSON *r;

    /* Before auth: auth_required. */
    r = itest_rpc(c, "{\"op\":\"stats\",\"tag\":1}");
    itest_expect_error(r, "1", "auth_required", NULL);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"auth\",\"token\":\"" TOK_A "\",\"tag\":2}");
    ck_assert_str_eq(itest_last_line(c), "{\"tag\":2,\"ok\":true,\"tenant\":\"alice\"}");
    cJSON_Delete(r);
    rpc_ok(c, "{\"op\":\"start\",\"id\":\"s\",\"model\":\"tiny\",\"prompt\":[1,2]}");
    /* Another tenant's token, or none of any, changes nothing. */
    rpc_error_naming(c, "bad_request", "alice",
                     "{\"op\":\"auth\",\"token\":\"" TOK_B "\",\"tag\":3}");
    rpc_error_naming(c, "bad_request", "alice",
                     "{\"op\":\"auth\",\"token\":\"no-such-token-0123456789\",\"tag\":4}");
    r = itest_rpc(c, "{\"op\":\"auth\",\"token\":\"" TOK_A "\",\"tag\":5}");
    ck_assert_str_eq(itest_last_line(c), "{\"tag\":5,\"ok\":true,\"tenant\":\"alice\"}");
    cJSON_Delete(r);
    rpc_ok(c, "{\"op\":\"step\",\"id\":\"s\"}");

    /* A wrong token on a fresh connection: auth_failed, closed. */
    auth_fails(d, "no-such-token-0123456789", true);

    /* The admin port: /health open, the rest for tenants with admin. */
    ck_assert_int_eq(admin_status(d, "/health", NULL), 200);
    ck_assert_int_eq(admin_status(d, "/stats", NULL), 401);
    ck_assert_int_eq(admin_status(d, "/stats", TOK_A), 401);
    ck_assert_int_eq(admin_status(d, "/metrics", TOK_B), 401);
    ck_assert_int_eq(admin_status(d, "/stats", TOK_OPS), 200);
    ck_assert_int_eq(admin_status(d, "/metrics", TOK_OPS), 200);
    itest_close(c);
    tenants_unlink();
}
END_TEST

/* `stats` for a tenant without admin: its own figures and its name; for
 * one with admin, the daemon's. */
START_TEST(test_tenant_stats)
{
    itest_daemon_t *d = itest_daemon_start(
        "--tenants-file",
        tenants_file("alice " TOK_A " share=0.5\nbob " TOK_B "\nops " TOK_OPS " admin\n"), NULL);
    itest_conn_t *a1 = connect_as(d, TOK_A, "alice"), *a2 = connect_as(d, TOK_A, "alice");
    itest_conn_t *b1 = connect_as(d, TOK_B, "bob"), *o = connect_as(d, TOK_OPS, "ops");
    cJSON *r, *st;

    rpc_ok(a1, "{\"op\":\"start\",\"id\":\"s\",\"model\":\"tiny\",\"prompt\":[1,2,3]}");
    rpc_ok(a2, "{\"op\":\"start\",\"id\":\"s\",\"model\":\"tiny\",\"prompt\":[1]}");
    r = itest_rpc(a2, "{\"op\":\"step\",\"id\":\"nope\"}");
    itest_expect_error(r, NULL, "unknown_id", NULL);
    cJSON_Delete(r);
    for (int i = 0; i < 3; i++)
        rpc_ok(b1, "{\"op\":\"start\",\"id\":\"b%d\",\"model\":\"tiny\",\"prompt\":[1,2]}", i);
    rpc_ok(b1, "{\"op\":\"finish\",\"id\":\"b0\"}");

    st = itest_stats(a1);
    itest_check_stats_shape(st);
    ck_assert_str_eq(itest_str(st, "tenant"), "alice");
    ck_assert_int_eq(itest_int(st, "live_sessions"), 2);
    ck_assert_int_eq(itest_int(st, "cache_entries"), 4);
    ck_assert_int_eq(itest_int(st, "connections"), 2);
    /* Its starts, the failed step and this stats (each auth came before
     * its connection was the tenant's). */
    ck_assert_int_eq(itest_int(st, "requests_total"), 4);
    ck_assert_int_eq(itest_int(st, "errors_total"), 1);
    ck_assert_int_eq(itest_int(cJSON_GetObjectItem(st, "released"), "finish"), 0);
    ck_assert(itest_int(st, "pool_bytes_used") > 0);
    ck_assert(itest_int(st, "pool_bytes_total") == 256ll * 1024 * 1024 / 2);
    cJSON_Delete(st);
    st = itest_stats(b1);
    ck_assert_str_eq(itest_str(st, "tenant"), "bob");
    ck_assert_int_eq(itest_int(st, "live_sessions"), 2);
    ck_assert_int_eq(itest_int(cJSON_GetObjectItem(st, "released"), "finish"), 1);
    ck_assert_int_eq(itest_int(st, "connections"), 1);
    cJSON_Delete(st);
    /* The admin tenant: the daemon's figures, no tenant member. */
    st = itest_stats(o);
    ck_assert_ptr_null(cJSON_GetObjectItem(st, "tenant"));
    ck_assert_int_eq(itest_int(st, "live_sessions"), 4);
    ck_assert_int_eq(itest_int(st, "connections"), 4);
    cJSON_Delete(st);
    itest_close(a1);
    itest_close(a2);
    itest_close(b1);
    itest_close(o);
    tenants_unlink();
}
END_TEST

/* `connections`: the tenant's third connection is refused whichever
 * connections the first two are; another tenant is not; once one of the
 * two closes, a new one is served. */
START_TEST(test_tenant_connections)
{
    itest_daemon_t *d = itest_daemon_start(
        "--tenants-file", tenants_file("alice " TOK_A " connections=2\nbob " TOK_B "\n"), NULL);
    itest_conn_t *a1 = connect_as(d, TOK_A, "alice"), *a2 = connect_as(d, TOK_A, "alice");
    itest_conn_t *b[3], *a3 = itest_connect(d);
    cJSON *r;
    bool served = false;

    r = itest_rpc(a3, "{\"op\":\"auth\",\"token\":\"" TOK_A "\",\"tag\":9}");
    expect_error_naming(a3, r, "too_many_connections", "tenant 'alice'");
    ck_assert(strstr(itest_last_line(a3), "connections=2") != NULL);
    cJSON_Delete(r);
    ck_assert(itest_expect_closed(a3, ITEST_REPLY_MS));
    itest_close(a3);
    for (int i = 0; i < 3; i++)
        b[i] = connect_as(d, TOK_B, "bob");
    /* Both of alice's serve on. */
    r = itest_rpc(a1, "{\"op\":\"stats\"}");
    ck_assert(!(itest_error_code(r) != NULL));
    cJSON_Delete(r);
    itest_close(a2);
    /* The close is seen by the daemon in its own time: retry until then. */
    for (int i = 0; i < 200 && !served; i++) {
        itest_conn_t *a4 = itest_connect(d);
        r = itest_rpc(a4, "{\"op\":\"auth\",\"token\":\"" TOK_A "\"}");
        served = !(itest_error_code(r) != NULL);
        if (!served)
            expect_error_naming(a4, r, "too_many_connections", "alice");
        cJSON_Delete(r);
        itest_close(a4);
        if (!served)
            usleep(10000);
    }
    ck_assert_msg(served, "alice's connection never came free");
    for (int i = 0; i < 3; i++)
        itest_close(b[i]);
    itest_close(a1);
    tenants_unlink();
}
END_TEST

/* `sessions` across connections: the tenant's fourth session is refused on
 * any of its connections, naming the tenant; a finish makes room; another
 * tenant is not limited. */
START_TEST(test_tenant_sessions)
{
    itest_daemon_t *d = itest_daemon_start(
        "--tenants-file", tenants_file("alice " TOK_A " sessions=3\nbob " TOK_B "\n"), NULL);
    itest_conn_t *a1 = connect_as(d, TOK_A, "alice"), *a2 = connect_as(d, TOK_A, "alice");
    itest_conn_t *b1 = connect_as(d, TOK_B, "bob");
    cJSON *r;

    for (int i = 0; i < 2; i++)
        rpc_ok(a1, "{\"op\":\"start\",\"id\":\"s%d\",\"model\":\"tiny\",\"prompt\":[1]}", i);
    rpc_ok(a2, "{\"op\":\"start\",\"id\":\"t0\",\"model\":\"tiny\",\"prompt\":[1]}");
    rpc_error_naming(a2, "cache_full", "tenant 'alice'",
                     "{\"op\":\"start\",\"id\":\"t1\",\"model\":\"tiny\",\"prompt\":[1]}");
    /* Refused means nothing changed: t1 is not live. */
    r = itest_rpc(a2, "{\"op\":\"step\",\"id\":\"t1\"}");
    itest_expect_error(r, NULL, "unknown_id", NULL);
    cJSON_Delete(r);
    rpc_error_naming(a1, "cache_full", "tenant 'alice'",
                     "{\"op\":\"start\",\"id\":\"s9\",\"model\":\"tiny\",\"prompt\":[1]}");
    for (int i = 0; i < 5; i++)
        rpc_ok(b1, "{\"op\":\"start\",\"id\":\"b%d\",\"model\":\"tiny\",\"prompt\":[1]}", i);
    rpc_ok(a1, "{\"op\":\"finish\",\"id\":\"s0\"}");
    rpc_ok(a2, "{\"op\":\"start\",\"id\":\"t1\",\"model\":\"tiny\",\"prompt\":[1]}");
    /* A closed connection's sessions are given back to its tenant. */
    itest_close(a1);
    bool served = false;
    for (int i = 0; i < 200 && !served; i++) {
        r = itest_rpc(a2, "{\"op\":\"start\",\"id\":\"u%d\",\"model\":\"tiny\",\"prompt\":[1]}",
                      i);
        served = !(itest_error_code(r) != NULL);
        cJSON_Delete(r);
        if (!served)
            usleep(10000);
    }
    ck_assert_msg(served, "alice's sessions on a closed connection were not given back");
    itest_close(a2);
    itest_close(b1);
    tenants_unlink();
}
END_TEST

/* `share=0.25` of a 16 MiB pool, over 16 connections with
 * --max-connection-share 1: the tenant holds at most a quarter of the pool,
 * its refusals name it, and another tenant then has the rest.  Sessions of
 * 128 positions (512 KiB of `small`), 8 to a share: the same check as 64
 * MiB and 512 positions, without 20 prefills four times as long each (193
 * s of the suite's 263 under memcheck). */
#define SHARE_POOL_MB 16
#define SHARE_MB_STR "16"
START_TEST(test_tenant_share)
{
    itest_daemon_t *d = itest_daemon_start(
        "--tenants-file", tenants_file("alice " TOK_A " share=0.25\nbob " TOK_B "\nops " TOK_OPS
                                       " admin\n"),
        "--cache-mb", SHARE_MB_STR, "--max-connection-share", "1", "--max-sessions", "4096",
        /* every session's prompt is the same: unshared, so that the pool's
         * bytes are the share's (a shared block is counted in each holder's
         * share but once in the pool) */
        "--prefix-cache", "off", NULL);
    itest_conn_t *a[16], *b1;
    int refused = 0, ok = 0;
    cJSON *r, *st;
    int64_t used;

    for (int i = 0; i < 16; i++)
        a[i] = connect_as(d, TOK_A, "alice");
    /* small sessions of a 128-position prompt each, round robin. */
    char prompt[1024];
    prompt_json(prompt, sizeof(prompt), 1, 128, 1);
    for (int k = 0; k < 400 && refused < 16; k++) {
        itest_conn_t *c = a[k % 16];
        r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"s%d\",\"model\":\"small\",\"prompt\":%s}", k,
                      prompt);
        if ((itest_error_code(r) != NULL)) {
            expect_error_naming(c, r, "cache_full", "tenant 'alice'");
            refused++;
        } else {
            ok++;
        }
        cJSON_Delete(r);
    }
    ck_assert_msg(ok > 0 && refused == 16, "%d admitted, %d refused", ok, refused);
    st = itest_admin_stats_as(d, TOK_OPS);
    used = itest_int(st, "pool_bytes_used");
    ck_assert_msg(used <= ((int64_t)SHARE_POOL_MB << 20) / 4,
                  "alice holds %lld bytes of a %d MiB pool", (long long)used, SHARE_POOL_MB);
    ck_assert_msg(used >= ((int64_t)SHARE_POOL_MB << 20) / 8, "alice holds only %lld bytes",
                  (long long)used);
    cJSON_Delete(st);
    /* Bob has the rest: more than alice's share. */
    b1 = connect_as(d, TOK_B, "bob");
    for (int k = 0; k < ok + 4; k++)
        rpc_ok(b1, "{\"op\":\"start\",\"id\":\"b%d\",\"model\":\"small\",\"prompt\":%s}", k,
               prompt);
    for (int i = 0; i < 16; i++)
        itest_close(a[i]);
    itest_close(b1);
    tenants_unlink();
}
END_TEST

/* SIGHUP: bob dropped, carol's token changed, alice's limit changed, dave
 * added; then a file that does not parse changes nothing. */
START_TEST(test_tenant_reload)
{
    itest_daemon_t *d = itest_daemon_start(
        "--tenants-file",
        tenants_file("alice " TOK_A " sessions=1\nbob " TOK_B "\ncarol " TOK_C "\nops " TOK_OPS
                     " admin\n"),
        NULL);
    itest_conn_t *a = connect_as(d, TOK_A, "alice"), *b = connect_as(d, TOK_B, "bob");
    itest_conn_t *c = connect_as(d, TOK_C, "carol"), *x;
    cJSON *r;

    rpc_ok(a, "{\"op\":\"start\",\"id\":\"s0\",\"model\":\"tiny\",\"prompt\":[1]}");
    rpc_error_naming(a, "cache_full", "alice",
                     "{\"op\":\"start\",\"id\":\"s1\",\"model\":\"tiny\",\"prompt\":[1]}");
    rpc_ok(b, "{\"op\":\"start\",\"id\":\"s0\",\"model\":\"tiny\",\"prompt\":[1]}");

    tenants_file("alice " TOK_A " sessions=2\n"
                 "carol carol-has-a-new-token-0123456789\n"
                 "dave dave-token-0123456789abcdef\n"
                 "ops " TOK_OPS " admin\n");
    itest_daemon_signal(d, SIGHUP);
    /* bob and carol: one auth_revoked line each, then the close. */
    r = itest_read_reply(b);
    expect_error_naming(b, r, "auth_revoked", "bob");
    cJSON_Delete(r);
    ck_assert(itest_expect_closed(b, ITEST_REPLY_MS));
    r = itest_read_reply(c);
    expect_error_naming(c, r, "auth_revoked", "carol");
    cJSON_Delete(r);
    ck_assert(itest_expect_closed(c, ITEST_REPLY_MS));
    /* alice serves on, her session kept, with the new limit. */
    rpc_ok(a, "{\"op\":\"step\",\"id\":\"s0\"}");
    rpc_ok(a, "{\"op\":\"start\",\"id\":\"s1\",\"model\":\"tiny\",\"prompt\":[1]}");
    auth_fails(d, TOK_B, false);
    x = connect_as(d, "dave-token-0123456789abcdef", "dave");
    itest_close(x);
    x = connect_as(d, "carol-has-a-new-token-0123456789", "carol");
    itest_close(x);

    /* A bad file (a duplicate name): nothing changes, the daemon says why. */
    tenants_file("alice " TOK_A "\nalice " TOK_B "\n");
    itest_daemon_signal(d, SIGHUP);
    ck_assert_int_ge(await_metric_as(d, TOK_OPS, "slotd_tenants_reload_failures_total", 1), 1);
    ck_assert_int_eq(await_metric_as(d, TOK_OPS, "slotd_tenants_reloads_total", 1), 1);
    rpc_ok(a, "{\"op\":\"step\",\"id\":\"s1\"}");
    x = connect_as(d, "dave-token-0123456789abcdef", "dave");
    itest_close(x);
    auth_fails(d, TOK_B, false);
    itest_close(a);
    itest_close(b);
    itest_close(c);
    tenants_unlink();
}
END_TEST

/* GET /sessions as an admin tenant names each session's tenant. */
START_TEST(test_tenant_sessions_listing)
{
    itest_daemon_t *d = itest_daemon_start(
        "--tenants-file", tenants_file("alice " TOK_A "\nbob " TOK_B "\nops " TOK_OPS " admin\n"),
        NULL);
    itest_conn_t *a = connect_as(d, TOK_A, "alice"), *b = connect_as(d, TOK_B, "bob");
    const cJSON *e;
    itest_http_t h;
    cJSON *r, *j;
    int seen = 0;

    r = itest_rpc(a, "{\"op\":\"start\",\"id\":\"sa\",\"model\":\"tiny\",\"prompt\":[1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_rpc(b, "{\"op\":\"start\",\"id\":\"sb\",\"model\":\"tiny\",\"prompt\":[1,2]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    admin_get(d, "/sessions", TOK_OPS, &h);
    ck_assert_int_eq(h.status, 200);
    j = cJSON_Parse(h.body);
    ck_assert_msg(j != NULL, "body '%s'", h.body);
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "sessions"))
    {
        const char *id = itest_str(e, "id");
        ck_assert_str_eq(itest_str(e, "tenant"), strcmp(id, "sa") == 0 ? "alice" : "bob");
        ck_assert(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(e, "shared_entries")));
        seen++;
    }
    ck_assert_int_eq(seen, 2);
    cJSON_Delete(j);
    itest_http_free(&h);
    itest_close(a);
    itest_close(b);
    ck_assert_int_eq(itest_daemon_stop(d), 0);
    tenants_unlink();
}
END_TEST

/* The sample `family{tenant="NAME"[,code="CODE"]}` of a /metrics body as
 * a number, or -1 if absent. */
static double tenant_sample(const char *body, const char *family, const char *name,
                            const char *code)
{
    char key[192];
    const char *p;

    if (code != NULL)
        snprintf(key, sizeof(key), "\n%s{tenant=\"%s\",code=\"%s\"} ", family, name, code);
    else
        snprintf(key, sizeof(key), "\n%s{tenant=\"%s\"} ", family, name);
    p = strstr(body, key);
    return p != NULL ? strtod(p + strlen(key), NULL) : -1;
}

/* The slotd_tenant_* families: each figure against the tenant's own
 * `stats`, the body accepted by promtool, a tenant dropped by a reload
 * gone from them, and no such family without a tenants file. */
START_TEST(test_tenant_metrics)
{
    itest_daemon_t *d = itest_daemon_start(
        "--tenants-file", tenants_file("alice " TOK_A "\nbob " TOK_B "\nops " TOK_OPS " admin\n"),
        NULL);
    itest_conn_t *a = connect_as(d, TOK_A, "alice"), *b = connect_as(d, TOK_B, "bob");
    const char *promtool = getenv("PROMTOOL") != NULL ? getenv("PROMTOOL") : "promtool";
    const char *argv[] = {promtool, "check", "metrics", NULL};
    char *out = NULL, *err = NULL;
    itest_http_t h;
    cJSON *r, *st;
    int code;

    r = itest_rpc(a, "{\"op\":\"start\",\"id\":\"s\",\"model\":\"tiny\",\"prompt\":[1,2]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_rpc(a, "{\"op\":\"step\",\"id\":\"s\",\"n\":3}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_rpc(a, "{\"op\":\"step\",\"id\":\"nope\"}");
    itest_expect_error(r, NULL, "unknown_id", NULL);
    cJSON_Delete(r);
    r = itest_rpc(a, "{\"op\":\"start\",\"id\":\"s\",\"model\":\"tiny\",\"prompt\":[1]}");
    itest_expect_error(r, NULL, "duplicate_id", NULL);
    cJSON_Delete(r);
    r = itest_rpc(b, "{\"op\":\"start\",\"id\":\"t\",\"model\":\"tiny\",\"prompt\":[1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    st = itest_stats(a);
    admin_get(d, "/metrics", TOK_OPS, &h);
    ck_assert_int_eq(h.status, 200);
    ck_assert(tenant_sample(h.body, "slotd_tenant_requests_total", "alice", NULL) ==
              (double)itest_int(st, "requests_total"));
    ck_assert(tenant_sample(h.body, "slotd_tenant_errors_total", "alice", "unknown_id") == 1);
    ck_assert(tenant_sample(h.body, "slotd_tenant_errors_total", "alice", "duplicate_id") == 1);
    ck_assert(itest_int(st, "errors_total") == 2);
    ck_assert(tenant_sample(h.body, "slotd_tenant_errors_total", "bob", "unknown_id") == -1);
    ck_assert(tenant_sample(h.body, "slotd_tenant_steps_total", "alice", NULL) == 3);
    ck_assert(tenant_sample(h.body, "slotd_tenant_steps_total", "bob", NULL) == 0);
    ck_assert(tenant_sample(h.body, "slotd_tenant_cache_entries", "alice", NULL) ==
              (double)itest_int(st, "cache_entries"));
    ck_assert(itest_int(st, "cache_entries") == 5);
    ck_assert(tenant_sample(h.body, "slotd_tenant_pool_bytes", "alice", NULL) ==
              (double)itest_int(st, "pool_bytes_used"));
    ck_assert(tenant_sample(h.body, "slotd_tenant_live_sessions", "alice", NULL) ==
              (double)itest_int(st, "live_sessions"));
    ck_assert(tenant_sample(h.body, "slotd_tenant_connections", "alice", NULL) ==
              (double)itest_int(st, "connections"));
    /* The start and the step were begun by a worker; the failed lines not. */
    ck_assert(tenant_sample(h.body, "slotd_tenant_request_wait_seconds_count", "alice", NULL) ==
              2);
    ck_assert(tenant_sample(h.body, "slotd_tenant_request_wait_seconds_sum", "alice", NULL) >= 0);
    ck_assert(tenant_sample(h.body, "slotd_tenant_requests_total", "ops", NULL) == 0);
    cJSON_Delete(st);
    code = itest_run(argv, h.body, strlen(h.body), &out, &err, 20000);
    ck_assert_msg(code == 0, "promtool check metrics exited %d:\n%s%s\n--- body ---\n%s", code,
                  out, err, h.body);
    free(out);
    free(err);
    itest_http_free(&h);

    /* bob dropped: his samples go with him. */
    tenants_file("alice " TOK_A "\nops " TOK_OPS " admin\n");
    itest_daemon_signal(d, SIGHUP);
    r = itest_read_reply(b);
    expect_error_naming(b, r, "auth_revoked", "bob");
    cJSON_Delete(r);
    admin_get(d, "/metrics", TOK_OPS, &h);
    ck_assert(tenant_sample(h.body, "slotd_tenant_requests_total", "bob", NULL) == -1);
    ck_assert(tenant_sample(h.body, "slotd_tenant_steps_total", "alice", NULL) == 3);
    itest_http_free(&h);
    itest_close(a);
    itest_close(b);
    ck_assert_int_eq(itest_daemon_stop(d), 0);
    tenants_unlink();

    d = itest_daemon_start(NULL);
    itest_http_get(d, "/metrics", &h);
    ck_assert_int_eq(h.status, 200);
    ck_assert_msg(strstr(h.body, "slotd_tenant_") == NULL, "slotd_tenant_ without a tenants file");
    itest_http_free(&h);
    ck_assert_int_eq(itest_daemon_stop(d), 0);
}
END_TEST

/* POST /tenants/reload as the tenant of `token` (NULL: none). */
static void admin_post(const itest_daemon_t *d, const char *path, const char *token,
                       itest_http_t *out)
{
    char req[512];
    snprintf(req, sizeof(req),
             "POST %s HTTP/1.1\r\nHost: x\r\n%s%s%sContent-Length: 0\r\nConnection: "
             "close\r\n\r\n",
             path, token ? "Authorization: Bearer " : "", token ? token : "", token ? "\r\n" : "");
    ck_assert_msg(itest_http_raw(d->admin_port, req, strlen(req), out), "POST %s: no response",
                  path);
}

/* POST /tenants/reload: admin tenants only; applied as SIGHUP (bob dropped
 * is revoked, dave added can connect, alice serves on), with the count in
 * the body; a file that does not parse is 422 with its reason and changes
 * nothing; without a tenants file, 409. */
START_TEST(test_tenant_admin_reload)
{
    itest_daemon_t *d = itest_daemon_start(
        "--tenants-file", tenants_file("alice " TOK_A "\nbob " TOK_B "\nops " TOK_OPS " admin\n"),
        NULL);
    itest_conn_t *a = connect_as(d, TOK_A, "alice"), *b = connect_as(d, TOK_B, "bob"), *x;
    itest_http_t h;
    cJSON *r, *body;

    r = itest_rpc(a, "{\"op\":\"start\",\"id\":\"s0\",\"model\":\"tiny\",\"prompt\":[1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    tenants_file("alice " TOK_A "\ndave dave-token-0123456789abcdef\nops " TOK_OPS " admin\n");
    /* No token, or a tenant without admin: 401, and nothing reloaded. */
    admin_post(d, "/tenants/reload", NULL, &h);
    ck_assert_int_eq(h.status, 401);
    itest_http_free(&h);
    admin_post(d, "/tenants/reload", TOK_A, &h);
    ck_assert_int_eq(h.status, 401);
    itest_http_free(&h);
    r = itest_rpc(b, "{\"op\":\"start\",\"id\":\"s0\",\"model\":\"tiny\",\"prompt\":[1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);

    admin_post(d, "/tenants/reload", TOK_OPS, &h);
    ck_assert_int_eq(h.status, 200);
    ck_assert_msg(strcmp(h.body, "{\"reloaded\":true,\"tenants\":3,\"revoked\":1}\n") == 0,
                  "body '%s'", h.body);
    itest_http_free(&h);
    r = itest_read_reply(b);
    expect_error_naming(b, r, "auth_revoked", "bob");
    cJSON_Delete(r);
    ck_assert(itest_expect_closed(b, ITEST_REPLY_MS));
    r = itest_rpc(a, "{\"op\":\"step\",\"id\":\"s0\"}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    x = connect_as(d, "dave-token-0123456789abcdef", "dave");
    itest_close(x);

    /* A bad file: 422 naming the line, nothing changed, counted. */
    tenants_file("alice " TOK_A "\nalice " TOK_B "\nops " TOK_OPS " admin\n");
    admin_post(d, "/tenants/reload", TOK_OPS, &h);
    ck_assert_int_eq(h.status, 422);
    body = cJSON_Parse(h.body);
    ck_assert_msg(body != NULL, "body '%s'", h.body);
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(body, "reloaded")));
    ck_assert_msg(strstr(cJSON_GetStringValue(cJSON_GetObjectItem(body, "error")), "line 2") != NULL,
                  "error '%s' does not name line 2", h.body);
    cJSON_Delete(body);
    itest_http_free(&h);
    ck_assert_int_eq(await_metric_as(d, TOK_OPS, "slotd_tenants_reload_failures_total", 1), 1);
    ck_assert_int_eq(await_metric_as(d, TOK_OPS, "slotd_tenants_reloads_total", 1), 1);
    x = connect_as(d, "dave-token-0123456789abcdef", "dave");
    itest_close(x);
    r = itest_rpc(a, "{\"op\":\"step\",\"id\":\"s0\"}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    itest_close(a);
    itest_close(b);
    ck_assert_int_eq(itest_daemon_stop(d), 0);
    tenants_unlink();

    /* Without a tenants file: 409 with the reason. */
    d = itest_daemon_start(NULL);
    admin_post(d, "/tenants/reload", NULL, &h);
    ck_assert_int_eq(h.status, 409);
    ck_assert_msg(strstr(h.body, "--tenants-file") != NULL, "body '%s'", h.body);
    itest_http_free(&h);
    ck_assert_int_eq(itest_daemon_stop(d), 0);
}
END_TEST

/* ---- Fairness ---- */

#define FAIR_SESSIONS 4
#define FAIR_STEPS 96 /* per session */
#define FAIR_TOTAL (FAIR_SESSIONS * FAIR_STEPS)
#define HEAVY_CONNS 4

typedef struct flood {
    itest_conn_t *c;
    int expect;
    _Atomic int got;
    _Atomic int errors;
    pthread_t thread;
} flood_t;

static _Atomic int heavy_got; /* every heavy connection's replies */

static void *flood_read(void *arg)
{
    flood_t *f = arg;

    while (atomic_load(&f->got) < f->expect) {
        char *line = itest_read_line(f->c, ITEST_REPLY_MS, NULL);
        if (line == NULL)
            break;
        if (strncmp(line, "{\"error\"", 8) == 0)
            atomic_fetch_add(&f->errors, 1);
        atomic_fetch_add(&f->got, 1);
        free(line);
    }
    return NULL;
}

typedef struct light {
    flood_t f;
    int heavy_at_end; /* heavy replies counted when the light tenant had all of its */
} light_t;

/* Starts FAIR_SESSIONS small sessions on f->c. */
static void flood_prepare(flood_t *f, const char *prefix)
{
    cJSON *r;

    for (int s = 0; s < FAIR_SESSIONS; s++) {
        r = itest_rpc(f->c, "{\"op\":\"start\",\"id\":\"%s%d\",\"model\":\"small\",\"prompt\":[1]}",
                      prefix, s);
        itest_expect_ok(r);
        cJSON_Delete(r);
    }
}

/* Sends FAIR_TOTAL steps of the sessions of flood_prepare() round robin in
 * one write and reads the replies on a thread. */
static void flood_begin(flood_t *f, const char *prefix)
{
    static char buf[FAIR_TOTAL * 48];
    size_t n = 0;

    for (int k = 0; k < FAIR_STEPS; k++)
        for (int s = 0; s < FAIR_SESSIONS; s++)
            n += (size_t)snprintf(buf + n, sizeof(buf) - n,
                                  "{\"op\":\"step\",\"id\":\"%s%d\",\"scores\":\"none\"}\n",
                                  prefix, s);
    f->expect = FAIR_TOTAL;
    atomic_store(&f->got, 0);
    atomic_store(&f->errors, 0);
    ck_assert(itest_send(f->c, buf, n));
    ck_assert_int_eq(pthread_create(&f->thread, NULL, flood_read, f), 0);
}

static void flood_end(flood_t *f)
{
    ck_assert_int_eq(pthread_join(f->thread, NULL), 0);
    ck_assert_int_eq(atomic_load(&f->got), f->expect);
    ck_assert_int_eq(atomic_load(&f->errors), 0);
}

/* The heavy tenant's replies when the light one had its last: runs both
 * floods; the heavy one's connections start first. */
static int fair_run(const char *file)
{
    itest_daemon_t *d = itest_daemon_start("--tenants-file", tenants_file(file), "--threads", "2",
                                           "--max-batch", "1", NULL);
    flood_t heavy[HEAVY_CONNS], light;
    int at_end, total = 0;

    (void)heavy_got;
    for (int i = 0; i < HEAVY_CONNS; i++)
        heavy[i].c = connect_as(d, TOK_B, "heavy");
    light.c = connect_as(d, TOK_A, "light");
    /* Every session first, then every flood at once. */
    for (int i = 0; i < HEAVY_CONNS; i++)
        flood_prepare(&heavy[i], "h");
    flood_prepare(&light, "l");
    for (int i = 0; i < HEAVY_CONNS; i++)
        flood_begin(&heavy[i], "h");
    flood_begin(&light, "l");
    ck_assert_int_eq(pthread_join(light.thread, NULL), 0);
    at_end = 0;
    for (int i = 0; i < HEAVY_CONNS; i++)
        at_end += atomic_load(&heavy[i].got);
    ck_assert_int_eq(atomic_load(&light.got), FAIR_TOTAL);
    ck_assert_int_eq(atomic_load(&light.errors), 0);
    for (int i = 0; i < HEAVY_CONNS; i++) {
        flood_end(&heavy[i]);
        total += atomic_load(&heavy[i].got);
        itest_close(heavy[i].c);
    }
    itest_close(light.c);
    ck_assert_int_eq(total, HEAVY_CONNS * FAIR_TOTAL);
    tenants_unlink();
    ck_assert_int_eq(itest_daemon_stop(d), 0);
    fprintf(stderr, "fairness: the heavy tenant had %d replies when the light one had its %d\n",
            at_end, FAIR_TOTAL);
    return at_end;
}

/* Equal weights, --max-batch 1: the heavy tenant's 4 connections get less
 * than 3 times what the light tenant's 1 gets (measured: 0.8 to 2.3
 * times); with each connection its own flow they get 4 times (all 1,536
 * of theirs before the light tenant's 384th).  Without batches, so that
 * the count follows the queue's order and the cap, not how many sessions
 * a batch's rounds step (docs/design.md, "Tenants"). */
START_TEST(test_tenant_fairness_equal)
{
    int heavy = fair_run("light " TOK_A "\nheavy " TOK_B "\n");
    ck_assert_msg(heavy < 3 * FAIR_TOTAL,
                  "the 4-connection tenant had %d replies to the 1-connection tenant's %d", heavy,
                  FAIR_TOTAL);
}
END_TEST

/* A start of `small` with a 300-token prompt on `c`; its `cached`. */
static int64_t start_cached(itest_conn_t *c, const char *id)
{
    char prompt[2048];
    prompt_json(prompt, sizeof(prompt), 3, 300, 7);
    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"%s\",\"model\":\"small\",\"prompt\":%s}",
                         id, prompt);
    itest_expect_ok(r);
    int64_t cached = itest_int(r, "cached");
    cJSON_Delete(r);
    return cached;
}

/* With a tenants file the prefix cache's scope is the tenant by default:
 * alice's second connection reuses what her first computed, bob never
 * does, in either order; --prefix-scope global shares between them. */
START_TEST(test_tenant_prefix_scope)
{
    for (int order = 0; order < 3; order++) {
        itest_daemon_t *d = itest_daemon_start(
            "--tenants-file", tenants_file("alice " TOK_A "\nbob " TOK_B "\n"),
            "--prefix-scope", order == 2 ? "global" : "tenant", NULL);
        itest_conn_t *a1 = connect_as(d, TOK_A, "alice"), *a2 = connect_as(d, TOK_A, "alice");
        itest_conn_t *b1 = connect_as(d, TOK_B, "bob");
        if (order == 0) {
            ck_assert_int_eq(start_cached(a1, "x"), 0);
            ck_assert_int_gt(start_cached(a2, "x"), 0);
            ck_assert_int_eq(start_cached(b1, "x"), 0);
        } else if (order == 1) {
            ck_assert_int_eq(start_cached(b1, "x"), 0);
            ck_assert_int_eq(start_cached(a1, "x"), 0);
            ck_assert_int_gt(start_cached(a2, "x"), 0);
        } else {
            ck_assert_int_eq(start_cached(a1, "x"), 0);
            ck_assert_int_gt(start_cached(b1, "x"), 0);
        }
        itest_close(a1);
        itest_close(a2);
        itest_close(b1);
        ck_assert_int_eq(itest_daemon_stop(d), 0);
        tenants_unlink();
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("integration_tenants");
    ITEST_ADD(s, test_tenant_identity);
    ITEST_ADD(s, test_tenant_stats);
    ITEST_ADD(s, test_tenant_connections);
    ITEST_ADD(s, test_tenant_sessions);
    ITEST_ADD(s, test_tenant_share);
    ITEST_ADD(s, test_tenant_reload);
    ITEST_ADD(s, test_tenant_admin_reload);
    ITEST_ADD(s, test_tenant_sessions_listing);
    ITEST_ADD(s, test_tenant_metrics);
    ITEST_ADD(s, test_tenant_prefix_scope);
    ITEST_ADD_TIMEOUT(s, test_tenant_fairness_equal, 300);
    return itest_main(s);
}
