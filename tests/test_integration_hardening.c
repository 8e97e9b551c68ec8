/*
 * test_integration_hardening.c: the daemon-side hardening, against the
 * real daemon, in every build.
 *
 * The cache audit on a healthy daemon: with --audit-rate 1 every step
 * request is recomputed without the cache (slotd_cache_audits_total counts
 * each, and a hash step's g calls grow by the length it recomputed) and
 * every reply is still exactly the uncached reference, with no divergence;
 * with --audit-rate 0 nothing is audited and a step costs its one call;
 * a sampled rate under pipelined load on several connections and threads
 * still answers every step exactly.  A daemon that loads only the hash
 * model starts and serves.  Connections turned away past
 * --max-connections are counted in slotd_connections_refused_total.  A
 * --cache-mb past physical memory, a bad --audit-rate, and (in a normal
 * build) the test-only --fault-* flags are refused with exit status 2 and
 * one line on stderr.
 *
 * The audit against real damage (the fault hooks) is
 * test_integration_audit.c, built with -DSLOTD_FAULT_INJECTION=ON.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"

/* Runs slotd with `flags` (after free ports) and returns its exit status;
 * *err gets its stderr. */
static int run_slotd(const char *const *flags, char **err)
{
    const char *argv[24];
    char port[16], admin[16];
    int n = 0;

    snprintf(port, sizeof(port), "%d", itest_free_port());
    snprintf(admin, sizeof(admin), "%d", itest_free_port());
    argv[n++] = itest_slotd_bin();
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1";
    argv[n++] = "--port";
    argv[n++] = port;
    argv[n++] = "--admin-port";
    argv[n++] = admin;
    for (int i = 0; flags[i] != NULL && n < 23; i++)
        argv[n++] = flags[i];
    argv[n] = NULL;
    return itest_run(argv, "", 0, NULL, err, ITEST_REPLY_MS);
}

/* Fails unless slotd with `flags` exits with status 2 and one line on
 * stderr containing `says`. */
static void expect_refused(const char *const *flags, const char *says)
{
    char *err = NULL;
    int code = run_slotd(flags, &err);

    ck_assert_msg(code == 2, "slotd %s %s: exit status %d, not 2; stderr:\n%s", flags[0],
                  flags[1] ? flags[1] : "", code, err);
    ck_assert_msg(strstr(err, says) != NULL, "slotd %s: stderr does not say '%s':\n%s", flags[0],
                  says, err);
    ck_assert_msg(strchr(err, '\n') == err + strlen(err) - 1, "stderr is not one line:\n%s", err);
    free(err);
}

/* ---- The audit on a healthy daemon ---- */

START_TEST(test_audit_all_exact)
{
    itest_daemon_t *d =
        itest_daemon_start("--audit-rate", "1", "--models", "tiny,hash,small", NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t p[] = {3, 1, 4, 1, 5};
    itest_session_t t, h, s;
    int requests = 0;

    itest_session_init(&t, "t", "tiny", p, 3);
    itest_session_init(&h, "h", "hash", p, 5);
    itest_session_init(&s, "s", "small", p, 4);
    itest_session_start(c, &t);
    itest_session_start(c, &h);
    itest_session_start(c, &s);
    for (int k = 0; k < 5; k++) {
        itest_session_step(c, &t, 1);
        itest_session_step(c, &h, (uint32_t)k + 1);
        itest_session_step(c, &s, 2);
        requests += 3;
    }
    itest_session_step(c, &h, 40);
    itest_session_step(c, &s, 20);
    requests += 2;
    itest_session_finish(c, &t);
    itest_session_finish(c, &h);
    itest_session_finish(c, &s);

    ck_assert_int_eq(itest_metric(d, "slotd_cache_audits_total"), requests);
    ck_assert_int_eq(itest_metric(d, "slotd_cache_divergence_total"), 0);
    cJSON *st = itest_stats(c);
    ck_assert_int_eq(itest_int(st, "cache_entries"), 0);
    cJSON_Delete(st);
    itest_session_free(&t);
    itest_session_free(&h);
    itest_session_free(&s);
    itest_close(c);
}
END_TEST

/* A hash step of n = 1 at length len costs 1 g call cached; the audit's
 * uncached recompute adds len more. */
static int64_t g_calls_of_step(const char *rate, int64_t len)
{
    itest_daemon_t *d = itest_daemon_start("--audit-rate", rate, NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t p[64];
    itest_session_t s;

    for (int64_t i = 0; i < len; i++)
        p[i] = (i * 37) % 1000;
    itest_session_init(&s, "a", "hash", p, (size_t)len);
    itest_session_start(c, &s);
    int64_t before = itest_stat(c, "g_calls");
    itest_session_step(c, &s, 1);
    int64_t cost = itest_stat(c, "g_calls") - before;
    itest_session_finish(c, &s);
    itest_session_free(&s);
    itest_close(c);
    ck_assert_int_eq(itest_daemon_stop(d), 0);
    return cost;
}

START_TEST(test_audit_cost_shows)
{
    ck_assert_int_eq(g_calls_of_step("0", 10), 1);
    ck_assert_int_eq(g_calls_of_step("1", 10), 11);
    ck_assert_int_eq(g_calls_of_step("1", 50), 51);
}
END_TEST

START_TEST(test_audit_off)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t p[] = {1, 2, 3};
    itest_session_t t;

    itest_session_init(&t, "t", "tiny", p, 3);
    itest_session_start(c, &t);
    itest_session_step(c, &t, 2);
    itest_session_step(c, &t, 3);
    ck_assert_int_eq(itest_metric(d, "slotd_cache_audits_total"), 0);
    ck_assert_int_eq(itest_metric(d, "slotd_cache_divergence_total"), 0);
    itest_session_free(&t);
    itest_close(c);
}
END_TEST

#define LOAD_CONNS 3
#define LOAD_SESSIONS 6

/* Pipelined steps of many sessions on several connections, sampled at
 * 0.5 on two workers: every reply is still the reference; about half the
 * step requests were audited. */
START_TEST(test_audit_under_load)
{
    itest_daemon_t *d = itest_daemon_start("--audit-rate", "0.5", "--threads", "2", NULL);
    itest_conn_t *c[LOAD_CONNS];
    itest_session_t s[LOAD_CONNS][LOAD_SESSIONS];
    int requests = 0;

    for (int i = 0; i < LOAD_CONNS; i++) {
        c[i] = itest_connect(d);
        for (int j = 0; j < LOAD_SESSIONS; j++) {
            int64_t p[4] = {i, j, (i + j) % 6, 5};
            char id[16];
            snprintf(id, sizeof(id), "s%d", j);
            itest_session_init(&s[i][j], id, j % 2 == 0 ? "hash" : "tiny", p, 2 + (size_t)(j % 3));
            itest_session_start(c[i], &s[i][j]);
        }
    }
    /* Tiny holds at most 8: each session steps while it has room. */
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < LOAD_CONNS; i++)
            for (int j = 0; j < LOAD_SESSIONS; j++)
                ck_assert(itest_sendf(c[i], "{\"op\":\"step\",\"id\":\"s%d\"}\n", j));
        for (int i = 0; i < LOAD_CONNS; i++) {
            for (int j = 0; j < LOAD_SESSIONS; j++) {
                cJSON *r = itest_read_reply(c[i]);
                itest_session_check_step(&s[i][j], r, itest_last_line(c[i]), 1, NULL);
                cJSON_Delete(r);
                requests++;
            }
        }
    }
    int64_t audits = itest_metric(d, "slotd_cache_audits_total");
    ck_assert_msg(audits > 0 && audits < requests, "%lld audits of %d step requests",
                  (long long)audits, requests);
    ck_assert_int_eq(itest_metric(d, "slotd_cache_divergence_total"), 0);
    for (int i = 0; i < LOAD_CONNS; i++) {
        for (int j = 0; j < LOAD_SESSIONS; j++) {
            if (j % 2 == 0)
                itest_session_finish(c[i], &s[i][j]); /* the others go with the connection */
            itest_session_free(&s[i][j]);
        }
        itest_close(c[i]);
    }
}
END_TEST

START_TEST(test_audit_rate_refused)
{
    static const char *const cases[][3] = {
        {"--audit-rate", "2", NULL},
        {"--audit-rate", "-0.5", NULL},
        {"--audit-rate", "often", NULL},
        {"--audit-rate", "nan", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        expect_refused(cases[i], "--audit-rate");
}
END_TEST

/* ---- Small fixes ---- */

START_TEST(test_hash_only)
{
    itest_daemon_t *d = itest_daemon_start("--models", "hash", "--default-model", "hash", NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t p[] = {7, 8, 9};
    itest_session_t s;

    /* No model named: the default, hash. */
    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"d\",\"prompt\":[1,2]}");
    ck_assert_str_eq(itest_str(r, "model"), "hash");
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"d\",\"n\":3}");
    itest_expect_ok(r);
    ck_assert_int_eq(itest_int(r, "entries"), 5);
    cJSON_Delete(r);

    itest_session_init(&s, "a", "hash", p, 3);
    itest_session_start(c, &s);
    itest_session_step(c, &s, 1);
    itest_session_step(c, &s, 100);
    itest_session_finish(c, &s);
    itest_session_free(&s);

    /* The attn-only ops say so, and the daemon serves on. */
    r = itest_rpc(c, "{\"op\":\"logits\",\"tokens\":[1]}");
    itest_expect_error(r, NULL, "bad_request", "model", NULL);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"t\",\"model\":\"tiny\",\"prompt\":[1]}");
    itest_expect_error(r, NULL, "bad_request", "model", NULL);
    cJSON_Delete(r);
    ck_assert_int_eq(itest_stat(c, "live_sessions"), 1);
    itest_close(c);
}
END_TEST

START_TEST(test_hash_only_audited)
{
    itest_daemon_t *d = itest_daemon_start("--models", "hash", "--default-model", "hash",
                                           "--audit-rate", "1", NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t p[] = {999, 0};
    itest_session_t s;

    itest_session_init(&s, "a", "hash", p, 2);
    itest_session_start(c, &s);
    itest_session_step(c, &s, 3);
    itest_session_step(c, &s, 1);
    ck_assert_int_eq(itest_metric(d, "slotd_cache_audits_total"), 2);
    itest_session_free(&s);
    itest_close(c);
}
END_TEST

START_TEST(test_refused_counted)
{
    itest_daemon_t *d = itest_daemon_start("--max-connections", "1", NULL);
    itest_conn_t *c = NULL;

    /* The start-up probe may hold the one place for a moment. */
    for (int tries = 0; c == NULL && tries < itest_scale_ms(2000) / 20; tries++) {
        c = itest_connect(d);
        cJSON *r = itest_rpc(c, "{\"op\":\"stats\"}");
        if (itest_is_error(r, "too_many_connections")) {
            itest_close(c);
            c = NULL;
            itest_sleep_ms(20);
        }
        cJSON_Delete(r);
    }
    ck_assert_ptr_nonnull(c);
    int64_t base = itest_metric(d, "slotd_connections_refused_total");

    for (int k = 0; k < 3; k++) {
        itest_conn_t *x = itest_connect(d);
        cJSON *e = itest_read_reply(x);
        itest_expect_error(e, NULL, "too_many_connections", NULL);
        cJSON_Delete(e);
        ck_assert(itest_expect_closed(x, ITEST_REPLY_MS));
        itest_close(x);
    }
    ck_assert_int_eq(itest_metric(d, "slotd_connections_refused_total"), base + 3);
    /* The admin port is not a session connection: it counts nothing. */
    ck_assert_int_eq(itest_metric(d, "slotd_connections_refused_total"), base + 3);
    cJSON *r = itest_rpc(c, "{\"op\":\"stats\"}");
    ck_assert_int_eq(itest_int(r, "connections"), 1);
    cJSON_Delete(r);
    itest_close(c);
}
END_TEST

START_TEST(test_cache_mb_past_memory)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    unsigned long long mb = (unsigned long long)pages * (unsigned long long)page >> 20;
    char past[32];

    ck_assert_int_gt(pages, 0);
    snprintf(past, sizeof(past), "%llu", mb + 1);
    if (mb + 1 <= (1ull << 24)) {
        const char *flags[] = {"--cache-mb", past, NULL};
        expect_refused(flags, "physical memory");
    }
    const char *huge[] = {"--cache-mb", "16777216", NULL};
    if (mb < 16777216ull)
        expect_refused(huge, "--cache-mb");
    /* One within memory still starts. */
    itest_daemon_t *d = itest_daemon_start("--cache-mb", "64", NULL);
    (void)d;
}
END_TEST

START_TEST(test_fault_flags_only_in_test_builds)
{
    const char *corrupt[] = {"--fault-corrupt-after", "1", NULL};
    const char *wedge[] = {"--fault-wedge-after=1", NULL};
#if SLOTD_FAULT_INJECTION
    const char *help[] = {itest_slotd_bin(), "--help", NULL};
    char *out = NULL;
    ck_assert_int_eq(itest_run(help, "", 0, &out, NULL, ITEST_REPLY_MS), 0);
    ck_assert_ptr_nonnull(strstr(out, "--fault-corrupt-after"));
    ck_assert_ptr_nonnull(strstr(out, "--fault-wedge-after"));
    free(out);
    /* Off by default even here: 0. */
    itest_daemon_t *d = itest_daemon_start(corrupt[0], "0", "--fault-wedge-after", "0", NULL);
    (void)d;
    (void)wedge;
#else
    const char *help[] = {itest_slotd_bin(), "--help", NULL};
    char *out = NULL;
    expect_refused(corrupt, "unknown flag");
    expect_refused(wedge, "unknown flag");
    ck_assert_int_eq(itest_run(help, "", 0, &out, NULL, ITEST_REPLY_MS), 0);
    ck_assert_ptr_null(strstr(out, "--fault-"));
    free(out);
#endif
}
END_TEST

int main(void)
{
    Suite *s = suite_create("integration_hardening");
    ITEST_ADD(s, test_audit_all_exact);
    ITEST_ADD(s, test_audit_cost_shows);
    ITEST_ADD(s, test_audit_off);
    ITEST_ADD(s, test_audit_under_load);
    ITEST_ADD(s, test_audit_rate_refused);
    ITEST_ADD(s, test_hash_only);
    ITEST_ADD(s, test_hash_only_audited);
    ITEST_ADD(s, test_refused_counted);
    ITEST_ADD(s, test_cache_mb_past_memory);
    ITEST_ADD(s, test_fault_flags_only_in_test_builds);
    return itest_main(s);
}
