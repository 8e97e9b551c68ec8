/*
 * test_integration_audit.c: the cache audit against real damage, and a
 * wedged worker, through the test-only hooks of a daemon built with
 * -DSLOTD_FAULT_INJECTION=ON.
 *
 * --fault-corrupt-after N damages the most recent entry of the slot of the
 * N-th step job.  With --audit-rate 1 the client still receives exactly
 * the uncached reference (model_generate(use_cache = false), computed
 * here), slotd_cache_divergence_total counts the divergence, the log has a
 * warn line naming the connection, the session and the position, and the
 * rebuilt slot diverges no more.  With --audit-rate 0 the same damage
 * reaches the client: its reply differs from the reference, which is what
 * the audit is for.
 *
 * --fault-wedge-after N holds the worker of the N-th job before its first
 * position: /health answers 503 once that worker has made no progress for
 * --wedge-timeout 1 while the other worker serves on, and 200 again after
 * SIGUSR1 releases it; a SIGTERM during the
 * wedge drains cleanly (exit status 0) with the job answered; and a reply
 * held back for a later job of its connection (--reply-hold-us) leaves when
 * its hold ends, though that job is wedged; slotd_steps_in_flight counts
 * the wedged step and not a step answered unknown_id; and a drain answers
 * shutting_down the lines a client had sent but the daemon had not read.
 */
#include <signal.h>
#include <stdarg.h>
#include <sys/ioctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "itest.h"

/* The daemon's log so far (malloc, NUL-terminated). */
static char *read_log(const itest_daemon_t *d)
{
    FILE *f = fopen(d->log, "r");
    char *text = NULL;
    size_t len = 0;

    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(getdelim(&text, &len, '\0', f) >= 0 || feof(f), 1);
    fclose(f);
    if (text == NULL)
        text = calloc(1, 1);
    return text;
}

/* The log line holding every one of the NULL-terminated words, or NULL
 * (malloc'd copy). */
static char *log_line_with(const itest_daemon_t *d, const char *word, ...)
{
    char *text = read_log(d);
    char *found = NULL;

    for (char *line = strtok(text, "\n"); line != NULL && found == NULL;
         line = strtok(NULL, "\n")) {
        va_list ap;
        bool all = true;
        va_start(ap, word);
        for (const char *w = word; w != NULL && all; w = va_arg(ap, const char *))
            all = strstr(line, w) != NULL;
        va_end(ap);
        if (all)
            found = strdup(line);
    }
    free(text);
    return found;
}

/* ---- Damage caught: the client gets the reference ---- */

START_TEST(test_caught_tiny)
{
    itest_daemon_t *d = itest_daemon_start("--audit-rate", "1", "--fault-corrupt-after", "1", NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t p[] = {0, 1, 2};
    itest_session_t s;

    itest_session_init(&s, "a", "tiny", p, 3);
    itest_session_start(c, &s);
    /* Step job 1 runs, then its slot's entry 3 is damaged.  Step 2 picks
     * from the state, still right, and runs position 4 on the damage; from
     * step 3 on the cache alone would be wrong.  Each reply is checked
     * against the uncached reference, token and printed logit. */
    for (int k = 0; k < 5; k++)
        itest_session_step(c, &s, 1);
    ck_assert_int_eq(itest_metric(d, "slotd_cache_audits_total"), 5);
    /* Caught once at position 5, then the rebuilt slot agrees again. */
    ck_assert_int_eq(itest_metric(d, "slotd_cache_divergence_total"), 1);

    char *line = log_line_with(d, "warn", "audit: connection ", "session 'a'", "position 5",
                               "diverges", NULL);
    if (line == NULL)
        itest_daemon_print_log(d, "no audit warning");
    ck_assert_ptr_nonnull(line);
    free(line);
    line = log_line_with(d, "fault:", "damaged entry 3", NULL);
    ck_assert_ptr_nonnull(line);
    free(line);
    itest_session_finish(c, &s);
    itest_session_free(&s);
    itest_close(c);
}
END_TEST

START_TEST(test_caught_in_one_request)
{
    itest_daemon_t *d = itest_daemon_start("--audit-rate", "1", "--fault-corrupt-after", "1", NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t p[] = {0, 1, 2};
    itest_session_t s;

    itest_session_init(&s, "x", "tiny", p, 3);
    itest_session_start(c, &s);
    itest_session_step(c, &s, 1);
    /* Four picks at once, the second already on the damage: the whole
     * reply is the reference's. */
    itest_session_step(c, &s, 4);
    ck_assert_int_eq(itest_metric(d, "slotd_cache_divergence_total"), 1);
    char *line = log_line_with(d, "warn", "session 'x'", "position 5", NULL);
    ck_assert_ptr_nonnull(line);
    free(line);
    itest_session_free(&s);
    itest_close(c);
}
END_TEST

START_TEST(test_caught_hash)
{
    itest_daemon_t *d = itest_daemon_start("--audit-rate", "1", "--fault-corrupt-after", "2", NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t p[] = {5, 6, 7, 8};
    itest_session_t s, other;

    itest_session_init(&s, "h", "hash", p, 4);
    itest_session_init(&other, "o", "hash", p, 3);
    itest_session_start(c, &s);
    itest_session_start(c, &other);
    itest_session_step(c, &s, 1);     /* step job 1 */
    itest_session_step(c, &s, 1);     /* step job 2: entry 5 damaged after it */
    itest_session_step(c, &other, 2); /* another session is untouched */
    for (int k = 0; k < 6; k++)
        itest_session_step(c, &s, 1 + (uint32_t)k % 3);
    ck_assert_int_eq(itest_metric(d, "slotd_cache_divergence_total"), 1);
    /* The running sum carries the damage into the very next pick: position 6. */
    char *line = log_line_with(d, "warn", "session 'h'", "position 6", NULL);
    if (line == NULL)
        itest_daemon_print_log(d, "no audit warning");
    ck_assert_ptr_nonnull(line);
    free(line);
    itest_session_step(c, &other, 3);
    itest_session_free(&s);
    itest_session_free(&other);
    itest_close(c);
}
END_TEST

/* ---- Damage not looked for: it reaches the client ---- */

/* True if the step reply (parsed `r`, raw `line`) for the n picks after
 * `prefix` differs from the uncached reference in a token or a printed
 * logit. */
static bool differs_from_reference(const char *model, const int64_t *prefix, size_t len, uint32_t n,
                                   const cJSON *r, const char *line)
{
    uint32_t ref[64];
    double logits[64 * 6];
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(r, "tokens");
    bool attn = strcmp(model, "hash") != 0;
    bool differs = false;

    ck_assert_uint_le(len + n, 64);
    itest_reference(model, prefix, len, n, ref, attn ? logits : NULL);
    ck_assert_msg(cJSON_IsArray(toks) && cJSON_GetArraySize(toks) == (int)n, "%s", line);
    for (uint32_t i = 0; i < n; i++)
        differs = differs || cJSON_GetArrayItem(toks, (int)i)->valuedouble != (double)ref[len + i];
    if (attn) {
        char got[64 * 6][64];
        int count = itest_raw_numbers(line, "logits", got, 64 * 6);
        ck_assert_int_eq(count, (int)n * 6);
        for (int i = 0; i < count; i++) {
            char want[64];
            snprintf(want, sizeof(want), "%.6f", logits[i]);
            differs = differs || strcmp(got[i], want) != 0;
        }
    }
    return differs;
}

START_TEST(test_uncaught_tiny)
{
    itest_daemon_t *d = itest_daemon_start("--fault-corrupt-after", "1", NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t seq[8] = {0, 1, 2};

    cJSON *r =
        itest_rpc(c, "{\"op\":\"start\",\"id\":\"a\",\"model\":\"tiny\",\"prompt\":[0,1,2]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"a\"}");
    ck_assert(!differs_from_reference("tiny", seq, 3, 1, r, itest_last_line(c)));
    seq[3] = (int64_t)cJSON_GetArrayItem(cJSON_GetObjectItem(r, "tokens"), 0)->valuedouble;
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"a\",\"n\":4}");
    ck_assert_msg(differs_from_reference("tiny", seq, 4, 4, r, itest_last_line(c)),
                  "the damaged slot gave the reference anyway: %s", itest_last_line(c));
    cJSON_Delete(r);
    ck_assert_int_eq(itest_metric(d, "slotd_cache_audits_total"), 0);
    ck_assert_int_eq(itest_metric(d, "slotd_cache_divergence_total"), 0);
    char *line = log_line_with(d, "audit:", NULL);
    ck_assert_msg(line == NULL, "an audit line with the audit off: %s", line);
    line = log_line_with(d, "fault:", "damaged entry 3", NULL);
    ck_assert_ptr_nonnull(line);
    free(line);
    itest_close(c);
}
END_TEST

START_TEST(test_uncaught_hash)
{
    itest_daemon_t *d = itest_daemon_start("--audit-rate", "0", "--fault-corrupt-after", "1", NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t seq[64] = {9, 8, 7};
    size_t len = 3;
    bool differs = false;

    cJSON *r =
        itest_rpc(c, "{\"op\":\"start\",\"id\":\"h\",\"model\":\"hash\",\"prompt\":[9,8,7]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    for (int k = 0; k < 3; k++) {
        r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"h\"}");
        /* Each reply against the reference of the sequence so far as the
         * client was told it. */
        bool d_k = differs_from_reference("hash", seq, len, 1, r, itest_last_line(c));
        ck_assert_msg(k == 0 ? !d_k : true, "step 1 ran before the damage: %s", itest_last_line(c));
        differs = differs || d_k;
        seq[len++] = (int64_t)cJSON_GetArrayItem(cJSON_GetObjectItem(r, "tokens"), 0)->valuedouble;
        cJSON_Delete(r);
    }
    ck_assert_msg(differs, "the damaged hash slot gave the reference anyway");
    ck_assert_int_eq(itest_metric(d, "slotd_cache_divergence_total"), 0);
    itest_close(c);
}
END_TEST

/* ---- A wedged worker ---- */

/* Polls /health until it answers `status`, for up to `ms`; returns the
 * milliseconds it took, or -1. */
static int64_t await_health(const itest_daemon_t *d, int status, int ms)
{
    int64_t t0 = itest_now_ms(), deadline = t0 + itest_scale_ms(ms);
    for (;;) {
        itest_http_t h;
        itest_http_get(d, "/health", &h);
        int got = h.status;
        if (got == 503)
            ck_assert_msg(strstr(h.body, "stuck") != NULL, "503 for another reason: %s", h.body);
        itest_http_free(&h);
        if (got == status)
            return itest_now_ms() - t0;
        if (itest_now_ms() >= deadline)
            return -1;
        itest_sleep_ms(50);
    }
}

START_TEST(test_wedge_health)
{
    itest_daemon_t *d = itest_daemon_start("--threads", "2", "--wedge-timeout", "1",
                                           "--fault-wedge-after", "1", NULL);
    itest_conn_t *c = itest_connect(d), *c2;
    ck_assert_int_ge(await_health(d, 200, 0), 0);

    /* Job 1 holds its worker. */
    int64_t t0 = itest_now_ms();
    ck_assert(itest_send_str(c, "{\"op\":\"start\",\"id\":\"w\",\"prompt\":[1,2]}\n"));
    ck_assert_msg(await_health(d, 503, 6000) >= 0, "/health never said 503 while wedged");
    ck_assert_msg(itest_now_ms() - t0 >= 1000, "503 after %lld ms, before --wedge-timeout 1",
                  (long long)(itest_now_ms() - t0));
    ck_assert_msg(itest_expect_silence(c, 100), "the wedged job was answered");

    /* The other worker serves on. */
    c2 = itest_connect(d);
    int64_t p[] = {3, 4};
    itest_session_t s;
    itest_session_init(&s, "b", "tiny", p, 2);
    itest_session_start(c2, &s);
    itest_session_step(c2, &s, 2);
    ck_assert_int_ge(await_health(d, 503, 0), 0); /* still wedged */

    itest_daemon_signal(d, SIGUSR1);
    cJSON *r = itest_read_reply(c);
    ck_assert_int_eq(itest_int(r, "entries"), 2);
    cJSON_Delete(r);
    ck_assert_msg(await_health(d, 200, 3000) >= 0, "/health stayed 503 after the release");
    char *line = log_line_with(d, "fault: job 1", "wedges", NULL);
    ck_assert_ptr_nonnull(line);
    free(line);
    itest_session_free(&s);
    itest_close(c);
    itest_close(c2);
}
END_TEST

START_TEST(test_wedge_sigterm)
{
    itest_daemon_t *d = itest_daemon_start("--threads", "1", "--wedge-timeout", "1",
                                           "--fault-wedge-after", "2", NULL);
    itest_conn_t *c = itest_connect(d);

    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1]}"); /* job 1 */
    itest_expect_ok(r);
    cJSON_Delete(r);
    ck_assert(itest_send_str(c, "{\"op\":\"step\",\"id\":\"a\"}\n"    /* job 2: wedged */
                                "{\"op\":\"step\",\"id\":\"a\"}\n")); /* waits behind it */
    ck_assert_msg(await_health(d, 503, 6000) >= 0, "/health never said 503 while wedged");

    /* The drain releases the job: it is answered for real, the one behind
     * it shutting_down, and the daemon exits 0 long before the wedge's own
     * bound. */
    int64_t t0 = itest_now_ms();
    itest_daemon_signal(d, SIGTERM);
    r = itest_read_reply(c);
    ck_assert_int_eq(itest_int(r, "entries"), 2);
    cJSON_Delete(r);
    r = itest_read_reply(c);
    itest_expect_error(r, NULL, "shutting_down", NULL);
    cJSON_Delete(r);
    ck_assert_int_eq(itest_daemon_wait(d, ITEST_STOP_MS), 0);
    ck_assert_msg(itest_now_ms() - t0 < itest_scale_ms(5000), "the drain took %lld ms",
                  (long long)(itest_now_ms() - t0));
    itest_close(c);
}
END_TEST

/* A finished reply held for a later job of its connection (--reply-hold-us
 * 200 ms) leaves when the hold ends, though that job is wedged: job 2 (a
 * step) is done, job 3 (the next start) holds the only worker.  The reply
 * comes no sooner than the hold and long before the release.  This checks
 * the bound, not which timer makes the turn that ends it: the server arms
 * one for the hold, and the worker pool's own wake-up timer also makes a
 * turn every millisecond while a job is out (worker.c), so either alone
 * passes it. */
START_TEST(test_wedge_hold_bounded)
{
    itest_daemon_t *d = itest_daemon_start("--threads", "1", "--fault-wedge-after", "3",
                                           "--reply-hold-us", "200000", NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t p[] = {1, 2};
    itest_session_t a;

    itest_session_init(&a, "a", "tiny", p, 2);
    itest_session_start(c, &a); /* job 1 */
    int64_t t0 = itest_now_ms();
    ck_assert(itest_send_str(c, "{\"op\":\"step\",\"id\":\"a\"}\n"                  /* job 2 */
                                "{\"op\":\"start\",\"id\":\"b\",\"prompt\":[3]}\n")); /* job 3: wedged */
    size_t n;
    char *line = itest_read_line(c, itest_scale_ms(5000), &n);
    int64_t took = itest_now_ms() - t0;
    ck_assert_msg(line != NULL, "the step's reply was held for the wedged job");
    cJSON *r = cJSON_Parse(line);
    ck_assert_ptr_nonnull(r);
    itest_session_check_step(&a, r, line, 1, NULL);
    cJSON_Delete(r);
    free(line);
    fprintf(stderr, "a reply held behind a wedged job of its connection left after %lld ms "
                    "(--reply-hold-us 200000)\n", (long long)took);
    ck_assert_msg(took >= 190, "the reply came after %lld ms, before the 200 ms hold ended",
                  (long long)took);
    ck_assert_msg(itest_expect_silence(c, 100), "the wedged job was answered");

    itest_daemon_signal(d, SIGUSR1);
    r = itest_read_reply(c);
    ck_assert_str_eq(itest_str(r, "id"), "b");
    ck_assert_int_eq(itest_int(r, "entries"), 1);
    cJSON_Delete(r);
    itest_session_free(&a);
    itest_close(c);
}
END_TEST

/* Polls the unlabelled sample `name` of /metrics until it is `want`, for
 * up to `ms` (scaled); its last value. */
static int64_t await_metric(itest_daemon_t *d, const char *name, int64_t want, int ms)
{
    int64_t deadline = itest_now_ms() + itest_scale_ms(ms), v;

    while ((v = itest_metric(d, name)) != want && itest_now_ms() < deadline)
        itest_sleep_ms(20);
    return v;
}

/* slotd_steps_in_flight counts the steps the workers hold, which a wedge
 * keeps up, and not a step answered with an error on the loop. */
START_TEST(test_wedge_steps_in_flight)
{
    itest_daemon_t *d = itest_daemon_start("--threads", "1", "--fault-wedge-after", "2", NULL);
    itest_conn_t *c = itest_connect(d), *c2 = itest_connect(d);

    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1]}"); /* job 1 */
    itest_expect_ok(r);
    cJSON_Delete(r);
    ck_assert_int_eq(itest_metric(d, "slotd_steps_in_flight"), 0);
    ck_assert(itest_send_str(c, "{\"op\":\"step\",\"id\":\"a\"}\n"    /* job 2: wedged */
                                "{\"op\":\"step\",\"id\":\"a\"}\n")); /* waits behind it */
    ck_assert_int_eq(await_metric(d, "slotd_steps_in_flight", 1, 3000), 1);
    r = itest_rpc(c2, "{\"op\":\"step\",\"id\":\"gone\"}");
    itest_expect_error(r, NULL, "unknown_id", NULL);
    cJSON_Delete(r);
    ck_assert_int_eq(itest_metric(d, "slotd_steps_in_flight"), 1);
    ck_assert_int_eq(itest_metric(d, "slotd_step_seconds_count"), 0);

    itest_daemon_signal(d, SIGUSR1);
    for (int i = 0; i < 2; i++) {
        r = itest_read_reply(c);
        ck_assert_int_eq(itest_int(r, "entries"), 2 + i);
        cJSON_Delete(r);
    }
    ck_assert_int_eq(await_metric(d, "slotd_steps_in_flight", 0, 3000), 0);
    ck_assert_int_eq(itest_metric(d, "slotd_step_seconds_count"), 2);
    itest_close(c);
    itest_close(c2);
}
END_TEST

/* The connection's requests read so far, from the admin port's /stats. */
static int64_t requests_read(itest_daemon_t *d)
{
    cJSON *st = itest_admin_stats(d);
    int64_t n = itest_int(st, "requests_total");
    cJSON_Delete(st);
    return n;
}

/* A drain answers every complete line the client sent before it, read or
 * not: the wedged step holds the 1,100 steps behind it, the connection
 * has more than CONN_MAX_OUTSTANDING requests out and stops reading, and
 * 300 more lines wait unread in the socket when SIGTERM comes.  The wedged
 * step gets its result, every other line shutting_down with its tag, in
 * order; a half line at the end gets nothing; then the connection closes. */
START_TEST(test_drain_answers_unread_lines)
{
    itest_daemon_t *d = itest_daemon_start("--threads", "1", "--fault-wedge-after", "2", NULL);
    itest_conn_t *c = itest_connect(d);
    const int held = 1100, unread = 300, lines = 1 + held + unread;
    size_t cap = (size_t)lines * 64, o = 0;
    char *buf = malloc(cap);

    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1]}"); /* job 1 */
    itest_expect_ok(r);
    cJSON_Delete(r);
    /* Tag 0 is job 2, wedged; tags 1..held wait behind it. */
    for (int i = 0; i <= held; i++)
        o += (size_t)snprintf(buf + o, cap - o, "{\"op\":\"step\",\"id\":\"a\",\"tag\":%d}\n", i);
    ck_assert(itest_send(c, buf, o));
    int64_t deadline = itest_now_ms() + itest_scale_ms(5000);
    while (requests_read(d) < 2 + held && itest_now_ms() < deadline)
        itest_sleep_ms(20);
    ck_assert_int_eq(requests_read(d), 2 + held);

    /* Lines it will not read before the drain: steps, a stats, a line
     * that is not JSON (no tag to echo), and half a line. */
    o = 0;
    for (int i = held + 1; i < lines; i++) {
        if (i == held + 100)
            o += (size_t)snprintf(buf + o, cap - o, "not json\n");
        else if (i % 7 == 0)
            o += (size_t)snprintf(buf + o, cap - o, "{\"op\":\"stats\",\"tag\":%d}\n", i);
        else
            o += (size_t)snprintf(buf + o, cap - o, "{\"op\":\"step\",\"id\":\"a\",\"tag\":%d}\n",
                                  i);
    }
    o += (size_t)snprintf(buf + o, cap - o, "{\"op\":\"step\",\"id\":\"a\",\"ta");
    ck_assert(itest_send(c, buf, o));
    free(buf);
    /* All of it in the daemon's socket (nothing left unacknowledged on
     * ours), and still unread a while later. */
    int queued = -1;
    deadline = itest_now_ms() + itest_scale_ms(5000);
    while ((ioctl(itest_conn_fd(c), TIOCOUTQ, &queued) != 0 || queued > 0) &&
           itest_now_ms() < deadline)
        itest_sleep_ms(10);
    ck_assert_int_eq(queued, 0);
    itest_sleep_ms(200);
    ck_assert_int_eq(requests_read(d), 2 + held);

    itest_daemon_signal(d, SIGTERM);
    r = itest_read_reply(c);
    itest_expect_tag(r, "0");
    ck_assert_int_eq(itest_int(r, "entries"), 2);
    cJSON_Delete(r);
    for (int i = 1; i < lines; i++) {
        char tag[16];
        snprintf(tag, sizeof(tag), "%d", i);
        r = itest_read_reply(c);
        itest_expect_error(r, i == held + 100 ? NULL : tag, "shutting_down", NULL);
        cJSON_Delete(r);
    }
    ck_assert_msg(itest_expect_closed(c, ITEST_REPLY_MS), "bytes after the last answer");
    ck_assert_msg(itest_pending(c) == 0, "a partial line of %zu bytes before the close",
                  itest_pending(c));
    ck_assert_int_eq(itest_daemon_wait(d, ITEST_STOP_MS), 0);
    itest_close(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("integration_audit");
    ITEST_ADD(s, test_caught_tiny);
    ITEST_ADD(s, test_caught_in_one_request);
    ITEST_ADD(s, test_caught_hash);
    ITEST_ADD(s, test_uncaught_tiny);
    ITEST_ADD(s, test_uncaught_hash);
    ITEST_ADD(s, test_wedge_health);
    ITEST_ADD(s, test_wedge_sigterm);
    ITEST_ADD(s, test_wedge_steps_in_flight);
    ITEST_ADD(s, test_drain_answers_unread_lines);
    ITEST_ADD(s, test_wedge_hold_bounded);
    return itest_main(s);
}
