/*
 * test_integration_auth.c: the token of --auth-token-file and protected
 * mode, on the real daemon.
 *
 * Without a token the first op is answered.  With one, every op before an
 * auth is auth_required on a connection that stays open; a wrong token is
 * auth_failed, the connection closes after it (lines sent behind it are
 * not answered), and slotd_auth_failures_total counts it; the right token
 * is {"ok":true} echoing the tag, and normal ops follow.  Neither token is
 * ever written to the log.  On the admin port /health stays open while
 * /stats, /metrics and /sessions answer 401 with "WWW-Authenticate: Bearer" unless
 * the request carries "Authorization: Bearer <token>".  A token file that
 * others may read, or of the wrong length, stops start-up with status 2;
 * so does a non-loopback address without a token, unless
 * --protected-mode no.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "itest.h"

#define TOKEN "integration-token-0123456789abcdef"

static char token_path[64];

/* Writes `text` to a new file of mode `mode`; its path in token_path. */
static const char *token_file(const char *text, mode_t mode)
{
    snprintf(token_path, sizeof(token_path), "/tmp/slotd-token.XXXXXX");
    int fd = mkstemp(token_path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    ck_assert_int_eq(chmod(token_path, mode), 0);
    return token_path;
}

static void token_unlink(void)
{
    if (token_path[0] != '\0')
        unlink(token_path);
    token_path[0] = '\0';
}

/* GET `path` on the admin port with `authz` as the Authorization header
 * (NULL for none). */
static void admin_get(const itest_daemon_t *d, const char *path, const char *authz,
                      itest_http_t *out)
{
    char req[512];
    snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\n%s%s%sConnection: close\r\n\r\n",
             path, authz ? "Authorization: " : "", authz ? authz : "", authz ? "\r\n" : "");
    ck_assert_msg(itest_http_raw(d->admin_port, req, strlen(req), out), "GET %s: no response",
                  path);
}

/* slotd_auth_failures_total, read with the token. */
static long auth_failures(const itest_daemon_t *d)
{
    itest_http_t h;
    admin_get(d, "/metrics", "Bearer " TOKEN, &h);
    ck_assert_int_eq(h.status, 200);
    const char *p = strstr(h.body, "\nslotd_auth_failures_total ");
    ck_assert_ptr_nonnull(p);
    long v = strtol(p + strlen("\nslotd_auth_failures_total "), NULL, 10);
    itest_http_free(&h);
    return v;
}

static bool log_contains(const itest_daemon_t *d, const char *text)
{
    FILE *f = fopen(d->log, "r");
    ck_assert_ptr_nonnull(f);
    char line[2048];
    bool found = false;
    while (!found && fgets(line, sizeof(line), f) != NULL)
        found = strstr(line, text) != NULL;
    fclose(f);
    return found;
}

START_TEST(test_auth_off)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    cJSON *r = itest_rpc(c, "{\"op\":\"stats\",\"tag\":1}");
    ck_assert_int_eq(itest_int(r, "live_sessions"), 0);
    cJSON_Delete(r);
    /* An auth without a token set is accepted: clients may send it first. */
    r = itest_rpc(c, "{\"op\":\"auth\",\"token\":\"anything\",\"tag\":2}");
    ck_assert_str_eq(itest_last_line(c), "{\"tag\":2,\"ok\":true}");
    cJSON_Delete(r);
    itest_close(c);
    itest_http_t h;
    admin_get(d, "/stats", NULL, &h);
    ck_assert_int_eq(h.status, 200);
    itest_http_free(&h);
}
END_TEST

START_TEST(test_auth_session)
{
    itest_daemon_t *d = itest_daemon_start("--auth-token-file", token_file(TOKEN "\n", 0600), NULL);
    itest_conn_t *c = itest_connect(d);

    /* Before auth: auth_required, and the connection stays open. */
    cJSON *r = itest_rpc(c, "{\"op\":\"stats\",\"tag\":1}");
    itest_expect_error(r, "1", "auth_required", NULL);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1]}");
    itest_expect_error(r, NULL, "auth_required", NULL);
    cJSON_Delete(r);
    r = itest_rpc(c, "not json");
    itest_expect_error(r, NULL, "auth_required", NULL);
    cJSON_Delete(r);
    /* A malformed auth is a bad_request naming the token, nothing more. */
    r = itest_rpc(c, "{\"op\":\"auth\",\"token\":5}");
    itest_expect_error(r, NULL, "bad_request", "token", NULL);
    cJSON_Delete(r);

    /* A wrong token: auth_failed, then the close; the line sent behind it
     * in the same write is not answered. */
    itest_send_str(c, "{\"op\":\"auth\",\"token\":\"not-the-token-0123456789\",\"tag\":\"x\"}\n"
                      "{\"op\":\"stats\"}\n");
    r = itest_read_reply(c);
    itest_expect_error(r, "\"x\"", "auth_failed", NULL);
    cJSON_Delete(r);
    ck_assert_msg(itest_expect_closed(c, ITEST_REPLY_MS), "the connection stayed open");
    itest_close(c);
    ck_assert_int_eq(auth_failures(d), 1);

    /* The right token: ok with the tag, then the protocol as usual. */
    c = itest_connect(d);
    r = itest_rpc(c, "{\"op\":\"auth\",\"token\":\"" TOKEN "\",\"tag\":7}");
    ck_assert_str_eq(itest_last_line(c), "{\"tag\":7,\"ok\":true}");
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1,2]}");
    ck_assert_str_eq(itest_last_line(c), "{\"id\":\"a\",\"model\":\"tiny\",\"entries\":2,\"cached\":0}");
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"finish\",\"id\":\"a\"}");
    ck_assert_str_eq(itest_last_line(c), "{\"id\":\"a\",\"released\":2}");
    cJSON_Delete(r);
    itest_close(c);

    /* A token of another length, one byte off, its prefix: all wrong. */
    static const char *const wrong[] = {TOKEN "x", "integration-token-0123456789abcdeF",
                                        "integration-token"};
    for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++) {
        c = itest_connect(d);
        r = itest_rpc(c, "{\"op\":\"auth\",\"token\":\"%s\"}", wrong[i]);
        itest_expect_error(r, NULL, "auth_failed", NULL);
        cJSON_Delete(r);
        itest_close(c);
    }
    ck_assert_int_eq(auth_failures(d), 4);
    ck_assert_msg(log_contains(d, "wrong token"), "the failure is not logged");
    ck_assert_msg(!log_contains(d, TOKEN), "the token is in the log");
    ck_assert_msg(!log_contains(d, "not-the-token"), "a wrong token is in the log");
    token_unlink();
}
END_TEST

START_TEST(test_auth_admin)
{
    itest_daemon_t *d = itest_daemon_start("--auth-token-file", token_file(TOKEN, 0400), NULL);
    itest_http_t h;
    char v[128];

    admin_get(d, "/health", NULL, &h);
    ck_assert_int_eq(h.status, 200);
    itest_http_free(&h);
    static const char *const locked[] = {"/stats", "/metrics", "/sessions"};
    for (size_t i = 0; i < 3; i++) {
        admin_get(d, locked[i], NULL, &h);
        ck_assert_msg(h.status == 401, "GET %s without a token: %d", locked[i], h.status);
        ck_assert(itest_http_header(&h, "WWW-Authenticate", v, sizeof(v)));
        ck_assert_str_eq(v, "Bearer");
        itest_http_free(&h);
        admin_get(d, locked[i], "Bearer wrong-token-0123456789", &h);
        ck_assert_int_eq(h.status, 401);
        itest_http_free(&h);
        admin_get(d, locked[i], "Basic " TOKEN, &h);
        ck_assert_int_eq(h.status, 401);
        itest_http_free(&h);
        admin_get(d, locked[i], "Bearer " TOKEN, &h);
        ck_assert_msg(h.status == 200, "GET %s with the token: %d", locked[i], h.status);
        itest_http_free(&h);
        admin_get(d, locked[i], "bearer   " TOKEN, &h);
        ck_assert_int_eq(h.status, 200);
        itest_http_free(&h);
    }
    /* Wrong Bearer and Basic, on every route; a missing header is not one. */
    ck_assert_int_eq(auth_failures(d), 6);
    token_unlink();
}
END_TEST

/* Lines of the daemon's log so far that contain `what`. */
static int log_lines_with(const itest_daemon_t *d, const char *what)
{
    FILE *f = fopen(d->log, "r");
    char line[1024];
    int n = 0;
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f) != NULL)
        n += strstr(line, what) != NULL;
    fclose(f);
    return n;
}

/* Wrong Bearer tokens on the admin port are logged, and a flood of them
 * makes one line, not one per request. */
START_TEST(test_auth_admin_logged)
{
    itest_daemon_t *d = itest_daemon_start("--auth-token-file", token_file(TOKEN, 0400), NULL);
    itest_http_t h;

    admin_get(d, "/stats", "Bearer wrong-token-0123456789", &h);
    ck_assert_int_eq(h.status, 401);
    itest_http_free(&h);
    ck_assert_int_eq(log_lines_with(d, "wrong Bearer token"), 1);
    for (int i = 0; i < 200; i++) {
        admin_get(d, "/metrics", "Bearer wrong-token-0123456789", &h);
        ck_assert_int_eq(h.status, 401);
        itest_http_free(&h);
    }
    ck_assert_int_eq(auth_failures(d), 201);
    /* 201 failures, well within the 10 s between lines (the test's time
     * scale stretches a slow build's run, not the daemon's interval): at
     * most two lines. */
    ck_assert_int_le(log_lines_with(d, "wrong Bearer token"), 2);
    token_unlink();
}
END_TEST

/* Runs slotd with `flags` (NULL-terminated, after free ports) and returns
 * its exit status; its stderr into *err (malloc). */
static int run_slotd(const char *const *flags, char **err)
{
    const char *argv[16];
    int n = 0;
    argv[n++] = itest_slotd_bin();
    argv[n++] = "--port=0";
    argv[n++] = "--admin-port=0";
    for (int i = 0; flags[i] != NULL; i++)
        argv[n++] = flags[i];
    argv[n] = NULL;
    char *out = NULL;
    int rc = itest_run(argv, NULL, 0, &out, err, itest_scale_ms(10000));
    free(out);
    return rc;
}

/* Exactly one line on stderr, containing each of the NULL-terminated words. */
static void one_line_with(const char *err, ...)
{
    const char *nl = strchr(err, '\n');
    ck_assert_msg(nl != NULL && nl[1] == '\0', "not one line: '%s'", err);
    va_list ap;
    va_start(ap, err);
    for (const char *w; (w = va_arg(ap, const char *)) != NULL;)
        ck_assert_msg(strstr(err, w) != NULL, "'%s' is not in '%s'", w, err);
    va_end(ap);
}

START_TEST(test_token_file_checks)
{
    char *err = NULL;
    const char *f[] = {"--auth-token-file", NULL, NULL};

    f[1] = token_file(TOKEN "\n", 0644);
    ck_assert_int_eq(run_slotd(f, &err), 2);
    one_line_with(err, token_path, "others", "chmod 600", NULL);
    free(err);
    token_unlink();

    f[1] = token_file(TOKEN, 0640);
    ck_assert_int_eq(run_slotd(f, &err), 2);
    one_line_with(err, "chmod 600", NULL);
    free(err);
    token_unlink();

    f[1] = token_file("short\n", 0600);
    ck_assert_int_eq(run_slotd(f, &err), 2);
    one_line_with(err, "16 to 4096 bytes", NULL);
    free(err);
    token_unlink();

    f[1] = token_file("tab\tin-the-token-0123456789", 0600);
    ck_assert_int_eq(run_slotd(f, &err), 2);
    one_line_with(err, "printable", NULL);
    free(err);
    token_unlink();

    f[1] = "/nonexistent/token";
    ck_assert_int_eq(run_slotd(f, &err), 2);
    one_line_with(err, "/nonexistent/token", "cannot open", NULL);
    free(err);

    /* SLOTD_AUTH_TOKEN_FILE names the file as well. */
    setenv("SLOTD_AUTH_TOKEN_FILE", token_file(TOKEN "\r\n", 0600), 1);
    itest_daemon_t *d = itest_daemon_start(NULL);
    unsetenv("SLOTD_AUTH_TOKEN_FILE");
    itest_conn_t *c = itest_connect(d);
    cJSON *r = itest_rpc(c, "{\"op\":\"stats\"}");
    itest_expect_error(r, NULL, "auth_required", NULL);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"auth\",\"token\":\"" TOKEN "\"}");
    ck_assert_str_eq(itest_last_line(c), "{\"ok\":true}");
    cJSON_Delete(r);
    itest_close(c);
    token_unlink();
}
END_TEST

START_TEST(test_protected_mode)
{
    char *err = NULL;

    const char *open4[] = {"--listen", "0.0.0.0", NULL};
    ck_assert_int_eq(run_slotd(open4, &err), 2);
    one_line_with(err, "0.0.0.0", "--auth-token-file", "--protected-mode no", NULL);
    free(err);
    const char *open_admin[] = {"--admin-listen", "::", NULL};
    ck_assert_int_eq(run_slotd(open_admin, &err), 2);
    one_line_with(err, "on :: ", "--auth-token-file", "--protected-mode no", NULL);
    free(err);
    const char *bad[] = {"--protected-mode", "maybe", NULL};
    ck_assert_int_eq(run_slotd(bad, &err), 2);
    one_line_with(err, "--protected-mode", "yes or no", NULL);
    free(err);

    /* The override, and a token, each let it start on every address. */
    itest_daemon_t *d = itest_daemon_start("--listen", "0.0.0.0", "--protected-mode", "no", NULL);
    ck_assert(log_contains(d, "--protected-mode no"));
    itest_conn_t *c = itest_connect(d);
    cJSON *r = itest_rpc(c, "{\"op\":\"stats\"}");
    cJSON_Delete(r);
    itest_close(c);
    itest_daemon_stop(d);
    d = itest_daemon_start("--listen", "0.0.0.0", "--auth-token-file", token_file(TOKEN, 0600),
                           NULL);
    c = itest_connect(d);
    r = itest_rpc(c, "{\"op\":\"auth\",\"token\":\"" TOKEN "\"}");
    ck_assert_str_eq(itest_last_line(c), "{\"ok\":true}");
    cJSON_Delete(r);
    itest_close(c);
    token_unlink();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("integration_auth");
    ITEST_ADD(s, test_auth_off);
    ITEST_ADD(s, test_auth_session);
    ITEST_ADD(s, test_auth_admin);
    ITEST_ADD(s, test_auth_admin_logged);
    ITEST_ADD(s, test_token_file_checks);
    ITEST_ADD(s, test_protected_mode);
    return itest_main(s);
}
