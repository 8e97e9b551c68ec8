/*
 * test_integration_shutdown.c: the daemon as a process: how it stops and
 * how it refuses to start.
 *
 * SIGTERM and SIGINT make it stop accepting, answer every request line it
 * has already read (in order, each with its real result or shutting_down,
 * never a partial line), close every connection and exit with status 0.
 * One test sends SIGTERM in the middle of a pipeline of hundreds of lines
 * and checks the replies that come back form an unbroken, correct prefix;
 * another keeps a heavy request running (sized by timing the daemon first)
 * so that the drain can be watched: GET /health must answer 503 while a
 * reply is still owed, and a new session connection must not be served.
 * SIGHUP is logged and ignored: the daemon keeps serving the connections
 * it has and new ones.  The last tests run the executable with bad flags
 * (exit status 2, one line on stderr) and with --help and --version (exit
 * status 0).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <poll.h>

#include "itest.h"

START_TEST(test_sigterm_with_sessions)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *busy = itest_connect(d);
    itest_conn_t *idle = itest_connect(d);
    cJSON *r = itest_rpc(busy, "{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1,2]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_rpc(busy, "{\"op\":\"start\",\"id\":\"b\",\"model\":\"hash\",\"prompt\":[1,2]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    itest_daemon_signal(d, SIGTERM);
    ck_assert_int_eq(itest_daemon_wait(d, ITEST_STOP_MS), 0);
    /* Nothing was owed to either connection: no bytes, just the close. */
    ck_assert_msg(itest_expect_closed(busy, 2000), "bytes after SIGTERM with nothing pending");
    ck_assert_msg(itest_expect_closed(idle, 2000), "bytes after SIGTERM with nothing pending");
    itest_close(busy);
    itest_close(idle);
}
END_TEST

START_TEST(test_sigint)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1,2]}");
    cJSON_Delete(r);
    itest_daemon_signal(d, SIGINT);
    ck_assert_int_eq(itest_daemon_wait(d, ITEST_STOP_MS), 0);
    ck_assert(itest_expect_closed(c, 2000));
    itest_close(c);
    /* The ports are free again. */
    ck_assert_ptr_null(itest_try_connect(d->port));
}
END_TEST

START_TEST(test_sigterm_during_pipeline)
{
    itest_daemon_t *d = itest_daemon_start("--threads", "2", NULL);
    itest_conn_t *c = itest_connect(d);
    itest_conn_t *idle = itest_connect(d);
    itest_conn_t *partial = itest_connect(d);
    int64_t prompt[] = {1, 2, 3};
    cJSON *r =
        itest_rpc(c, "{\"op\":\"start\",\"id\":\"h\",\"model\":\"hash\",\"prompt\":[1,2,3]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_rpc(idle, "{\"op\":\"start\",\"id\":\"h\",\"prompt\":[1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    ck_assert(itest_send_str(partial, "{\"op\":\"stats\""));

    /* The reference of every step the pipeline may get to. */
    const int lines = 400, n = 5;
    size_t max_steps = (size_t)lines * n;
    uint32_t *ref = malloc((3 + max_steps) * sizeof(uint32_t));
    itest_reference("hash", prompt, 3, (int64_t)max_steps, ref, NULL);

    size_t cap = (size_t)lines * 64, o = 0;
    char *buf = malloc(cap);
    for (int i = 0; i < lines; i++) {
        if (i % 4 == 3) {
            o += (size_t)snprintf(buf + o, cap - o, "{\"op\":\"stats\",\"tag\":%d}\n", i);
        } else {
            o += (size_t)snprintf(buf + o, cap - o,
                                  "{\"op\":\"step\",\"id\":\"h\",\"n\":%d,\"tag\":%d}\n", n, i);
        }
    }
    ck_assert(itest_send(c, buf, o));
    free(buf);

    /* Once the first reply is out, SIGTERM. */
    cJSON *first = itest_read_reply(c);
    itest_daemon_signal(d, SIGTERM);

    size_t steps = 0;
    int replies = 0, real = 0, refused = 0;
    cJSON *reply = first;
    char *line = strdup(itest_last_line(c));
    int64_t deadline = itest_now_ms() + 30000;
    for (;;) {
        char tag[16];
        snprintf(tag, sizeof(tag), "%d", replies);
        itest_expect_tag(reply, tag);
        if (itest_error_code(reply) != NULL) {
            itest_expect_error(reply, tag, "shutting_down", NULL);
            refused++;
        } else if (replies % 4 == 3) {
            itest_check_stats_shape(reply);
            real++;
        } else {
            const cJSON *tk = cJSON_GetObjectItemCaseSensitive(reply, "tokens");
            ck_assert_msg(cJSON_IsArray(tk) && cJSON_GetArraySize(tk) == n, "reply %d: %s", replies,
                          line);
            for (int k = 0; k < n; k++) {
                double want = (double)ref[3 + steps + (size_t)k];
                ck_assert_msg(cJSON_GetArrayItem(tk, k)->valuedouble == want,
                              "reply %d, step %zu differs from the reference: %s", replies,
                              steps + (size_t)k + 1, line);
            }
            steps += (size_t)n;
            ck_assert_int_eq(itest_int(reply, "entries"), (int64_t)(3 + steps));
            real++;
        }
        cJSON_Delete(reply);
        free(line);
        replies++;
        ck_assert_msg(itest_now_ms() < deadline, "replies did not stop coming");
        size_t len = 0;
        line = itest_read_line(c, ITEST_REPLY_MS, &len);
        if (line == NULL) {
            break;
        }
        reply = cJSON_ParseWithLength(line, len);
        ck_assert_msg(reply != NULL && cJSON_IsObject(reply), "reply %d is not JSON: %s", replies,
                      line);
    }
    ck_assert_msg(itest_last_io(c) == ITEST_IO_EOF || itest_last_io(c) == ITEST_IO_RESET,
                  "after %d replies the connection neither closed nor answered", replies);
    ck_assert_msg(itest_pending(c) == 0, "a partial line of %zu bytes before the close",
                  itest_pending(c));
    ck_assert_int_eq(replies, lines); /* read or not, every line came before the drain */
    fprintf(stderr,
            "sigterm during pipeline: %d of %d lines answered (%d results, %d shutting_down)\n",
            replies, lines, real, refused);

    ck_assert_msg(itest_expect_closed(idle, ITEST_REPLY_MS), "the idle connection got bytes");
    ck_assert_msg(itest_expect_closed(partial, ITEST_REPLY_MS),
                  "a connection with half a line got bytes");
    ck_assert_int_eq(itest_daemon_wait(d, ITEST_STOP_MS), 0);
    free(ref);
    itest_close(c);
    itest_close(idle);
    itest_close(partial);
}
END_TEST

/* Lines of the daemon's log that contain `text`. */
static int log_count(const itest_daemon_t *d, const char *text)
{
    FILE *f = fopen(d->log, "r");
    char line[2048];
    int n = 0;

    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f) != NULL)
        n += strstr(line, text) != NULL;
    fclose(f);
    return n;
}

/* Waits (bounded) until `text` is on `want` lines of the daemon's log. */
static bool await_log(const itest_daemon_t *d, const char *text, int want)
{
    for (int64_t deadline = itest_now_ms() + ITEST_REPLY_MS; itest_now_ms() < deadline;) {
        if (log_count(d, text) >= want)
            return true;
        itest_sleep_ms(10);
    }
    return log_count(d, text) >= want;
}

START_TEST(test_sighup_ignored)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1,2]}");
    itest_expect_ok(r);
    cJSON_Delete(r);

    /* Twice, each once the one before is logged (signals pending at once
     * are delivered once). */
    for (int i = 1; i <= 2; i++) {
        itest_daemon_signal(d, SIGHUP);
        ck_assert_msg(await_log(d, "signal 1: ignored", i), "SIGHUP %d was not logged", i);
        ck_assert_msg(itest_daemon_alive(d), "SIGHUP %d ended the daemon", i);
    }
    ck_assert_int_eq(log_count(d, "shutting down"), 0);
    /* The session lives on, and a new connection is served. */
    r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"a\",\"n\":1}");
    itest_expect_ok(r);
    ck_assert_int_eq(itest_int(r, "entries"), 3);
    cJSON_Delete(r);
    itest_conn_t *late = itest_connect(d);
    ck_assert_int_eq(itest_stat(late, "live_sessions"), 1);
    itest_http_t h;
    itest_http_get(d, "/health", &h);
    ck_assert_int_eq(h.status, 200);
    itest_http_free(&h);
    itest_close(late);
    itest_close(c);
    ck_assert_int_eq(itest_daemon_stop(d), 0);
}
END_TEST

/* Times one uncached generate of m tokens and m steps on "small". */
static int64_t time_generate(itest_conn_t *c, int m)
{
    int64_t *t = malloc((size_t)m * sizeof(int64_t));
    for (int i = 0; i < m; i++) {
        t[i] = (i * 37) % 512;
    }
    char *arr = itest_json_tokens(t, (size_t)m);
    int64_t t0 = itest_now_ms();
    cJSON *r = itest_rpc(c, "{\"op\":\"generate\",\"model\":\"small\",\"tokens\":%s,\"steps\":%d}",
                         arr, m);
    int64_t t1 = itest_now_ms();
    itest_expect_ok(r);
    cJSON_Delete(r);
    free(arr);
    free(t);
    return t1 - t0;
}

START_TEST(test_health_while_draining)
{
    itest_daemon_t *d = itest_daemon_start("--models", "tiny,hash,small", "--threads", "1",
                                           "--shutdown-timeout", "60", NULL);
    itest_conn_t *c = itest_connect(d);
    itest_http_t h;
    itest_http_get(d, "/health", &h);
    ck_assert_int_eq(h.status, 200);
    itest_http_free(&h);

    /* Find a request that takes about a second or more on this build. */
    int m = 32;
    int64_t took = time_generate(c, m);
    while (took < 700 && m < 340) {
        m = m * 3 / 2;
        took = time_generate(c, m);
    }
    int heavy = m * 3 / 2 <= 512 ? m * 3 / 2 : 512;

    int64_t *t = malloc((size_t)heavy * sizeof(int64_t));
    for (int i = 0; i < heavy; i++) {
        t[i] = (i * 37) % 512;
    }
    char *arr = itest_json_tokens(t, (size_t)heavy);
    const char *generates = "slotd_requests_total{op=\"generate\"}";
    int64_t before = itest_metric(d, generates);
    ck_assert(itest_sendf(c,
                          "{\"op\":\"generate\",\"model\":\"small\",\"tokens\":%s,\"steps\":%d,"
                          "\"tag\":\"heavy\"}\n{\"op\":\"stats\",\"tag\":\"next\"}\n",
                          arr, heavy));
    free(arr);
    free(t);
    /* The daemon has taken the heavy request in before it is told to stop. */
    itest_await_metric(d, generates, before + 1, ITEST_REPLY_MS);
    itest_daemon_signal(d, SIGTERM);

    /* While the heavy reply is owed, the daemon is draining: /health turns
     * to 503 once it has seen the signal. */
    itest_http_t during = {0};
    const char *get = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    struct pollfd pfd = {.fd = itest_conn_fd(c), .events = POLLIN};
    bool answered = false, reply_came = false;
    for (int64_t deadline = itest_now_ms() + ITEST_REPLY_MS;;) {
        itest_http_free(&during);
        answered = itest_http_raw(d->admin_port, get, strlen(get), &during);
        reply_came = poll(&pfd, 1, 0) > 0;
        if (reply_came || (answered && during.status != 200) || itest_now_ms() >= deadline)
            break;
        itest_sleep_ms(5);
    }
    if (!reply_came) {
        ck_assert_msg(answered, "GET /health got no answer while draining");
        ck_assert_msg(during.status == 503, "GET /health while draining: %d, not 503",
                      during.status);
    } else {
        fprintf(stderr,
                "health while draining: the heavy request (%d tokens) finished before "
                "/health turned to 503; drain not observed\n",
                heavy);
    }
    itest_http_free(&during);

    /* A new session connection is not served while draining. */
    if (!reply_came) {
        itest_conn_t *late = itest_try_connect(d->port);
        if (late != NULL) {
            itest_send_str(late, "{\"op\":\"stats\"}\n");
            size_t len = 0;
            char *line = itest_read_line(late, 500, &len);
            if (line != NULL) {
                cJSON *j = cJSON_Parse(line);
                ck_assert_msg(j != NULL && itest_is_error(j, "shutting_down"),
                              "a connection made while draining was served: %s", line);
                cJSON_Delete(j);
                free(line);
            }
            itest_close(late);
        }
    }

    /* The owed replies, in order, then the close and status 0. */
    cJSON *r = itest_read_reply(c);
    itest_expect_tag(r, "\"heavy\"");
    if (itest_error_code(r) != NULL) {
        itest_expect_error(r, "\"heavy\"", "shutting_down", NULL);
    } else {
        const cJSON *tk = cJSON_GetObjectItemCaseSensitive(r, "tokens");
        ck_assert(cJSON_IsArray(tk) && cJSON_GetArraySize(tk) == 2 * heavy);
    }
    cJSON_Delete(r);
    r = itest_read_reply(c);
    itest_expect_tag(r, "\"next\"");
    if (itest_error_code(r) != NULL) {
        itest_expect_error(r, "\"next\"", "shutting_down", NULL);
    } else {
        itest_check_stats_shape(r);
    }
    cJSON_Delete(r);
    ck_assert(itest_expect_closed(c, ITEST_REPLY_MS));
    ck_assert_int_eq(itest_daemon_wait(d, 30000), 0);
    itest_close(c);
}
END_TEST

/* Runs slotd with `flags` (NULL-terminated) and returns its exit status;
 * *err gets its stderr (owned by the caller). */
static int run_slotd(const char *const *flags, char **out, char **err)
{
    const char *argv[32];
    int n = 0;
    argv[n++] = itest_slotd_bin();
    for (int i = 0; flags[i] != NULL; i++) {
        argv[n++] = flags[i];
    }
    argv[n] = NULL;
    return itest_run(argv, "", 0, out, err, 10000);
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s != '\0'; s++) {
        n += *s == '\n';
    }
    return n;
}

START_TEST(test_bad_flags)
{
    /* Valid ports first, so that a daemon that wrongly starts binds
     * nothing it should not; the bad flag comes last. */
    static const char *const cases[][4] = {
        {"--bogus", NULL},
        {"--port", "abc", NULL},
        {"--port", "70000", NULL},
        {"--port", "-1", NULL},
        {"--port", NULL},
        {"--threads", "abc", NULL},
        {"--threads", "-2", NULL},
        {"--cache-mb", "lots", NULL},
        {"--cache-mb", "-1", NULL},
        {"--max-sessions", "x", NULL},
        {"--max-connections", "1x", NULL},
        {"--max-line", "", NULL},
        {"--idle-timeout", "soon", NULL},
        {"--shutdown-timeout", "-5", NULL},
        {"--models", "nosuch", NULL},
        {"--default-model", "nosuch", NULL},
        {"--log-level", "loudest", NULL},
        {"positional", NULL},
        {"-z", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *flags[16];
        int n = 0;
        char port[16], admin[16];
        snprintf(port, sizeof(port), "%d", itest_free_port());
        snprintf(admin, sizeof(admin), "%d", itest_free_port());
        if (strcmp(cases[i][0], "--port") != 0) {
            flags[n++] = "--port";
            flags[n++] = port;
        }
        flags[n++] = "--admin-port";
        flags[n++] = admin;
        flags[n++] = "--listen";
        flags[n++] = "127.0.0.1";
        for (int k = 0; cases[i][k] != NULL; k++) {
            flags[n++] = cases[i][k];
        }
        flags[n] = NULL;
        char *out = NULL, *err = NULL;
        int code = run_slotd(flags, &out, &err);
        char what[128];
        snprintf(what, sizeof(what), "%s %s", cases[i][0], cases[i][1] ? cases[i][1] : "");
        ck_assert_msg(code == 2, "slotd %s: exit status %d, not 2; stderr:\n%s", what, code, err);
        ck_assert_msg(count_lines(err) == 1 && err[strlen(err) - 1] == '\n',
                      "slotd %s: stderr is not one line:\n%s", what, err);
        free(out);
        free(err);
    }
}
END_TEST

START_TEST(test_help_and_version)
{
    const char *help[] = {"--help", NULL};
    const char *version[] = {"--version", NULL};
    char *out = NULL, *err = NULL;
    int code = run_slotd(help, &out, &err);
    ck_assert_msg(code == 0, "slotd --help: exit status %d; stderr:\n%s", code, err);
    ck_assert_msg(strstr(out, "--port") != NULL || strstr(err, "--port") != NULL,
                  "slotd --help does not list --port:\n%s%s", out, err);
    free(out);
    free(err);
    code = run_slotd(version, &out, &err);
    ck_assert_msg(code == 0, "slotd --version: exit status %d; stderr:\n%s", code, err);
    ck_assert_msg(strlen(out) + strlen(err) > 0, "slotd --version printed nothing");
    free(out);
    free(err);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("integration_shutdown");
    ITEST_ADD(s, test_sigterm_with_sessions);
    ITEST_ADD(s, test_sigint);
    ITEST_ADD(s, test_sigterm_during_pipeline);
    ITEST_ADD(s, test_health_while_draining);
    ITEST_ADD(s, test_sighup_ignored);
    ITEST_ADD(s, test_bad_flags);
    ITEST_ADD(s, test_help_and_version);
    return itest_main(s);
}
