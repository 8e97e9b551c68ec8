/*
 * test_integration_presets.c: every preset available by default, its
 * weights built the first time a request names it (docs/operations.md,
 * "Presets built on first use").
 *
 * A start on base without --models works and steps as the reference does;
 * two connections asking for a preset at once build it once (the build
 * counter, slotd_model_builds_total); --models still excludes a preset,
 * with the error of a model not loaded; --preload builds at start, and
 * --preload none builds nothing until asked; while a preset is being
 * built (made slow with --fault-build-delay-ms in test builds) the loop
 * keeps answering other connections and the admin port, and the lines
 * pipelined behind the waiting request on its own connection take effect
 * after it, in order.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "itest.h"

/* The sample slotd_model_builds_total{model="<preset>"} of GET /metrics;
 * fails the test if it is missing. */
static int64_t builds(const itest_daemon_t *d, const char *preset)
{
    char key[96];
    itest_http_t r;
    const char *p;
    long long n = -1;

    snprintf(key, sizeof(key), "\nslotd_model_builds_total{model=\"%s\"} ", preset);
    itest_http_get(d, "/metrics", &r);
    ck_assert_int_eq(r.status, 200);
    p = strstr(r.body, key);
    ck_assert_msg(p != NULL, "no sample %s", key + 1);
    ck_assert_int_eq(sscanf(p + strlen(key), "%lld", &n), 1);
    itest_http_free(&r);
    return n;
}

/* The default daemon serves base: a start, two steps checked against the
 * uncached reference, a stateless generate, and one build counted. */
START_TEST(test_base_without_models)
{
    itest_daemon_t *d = itest_daemon_start("--threads", "2", NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t prompt[] = {1, 2, 3};
    itest_session_t s;
    cJSON *r;

    ck_assert_int_eq(builds(d, "tiny"), 1); /* --preload's default */
    ck_assert_int_eq(builds(d, "hash"), 1);
    ck_assert_int_eq(builds(d, "small"), 0);
    ck_assert_int_eq(builds(d, "base"), 0);
    itest_session_init(&s, "b", "base", prompt, 3);
    itest_session_start(c, &s);
    itest_session_step(c, &s, 2);
    r = itest_rpc(c, "{\"op\":\"generate\",\"model\":\"base\",\"tokens\":[4,5],\"steps\":1}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    itest_session_finish(c, &s);
    ck_assert_int_eq(builds(d, "base"), 1);
    ck_assert_int_eq(builds(d, "small"), 0);
    itest_session_free(&s);
    itest_close(c);
}
END_TEST

/* Two connections name small at once (both lines sent before either reply
 * is read; in a test build the build is slowed so that both surely wait
 * for it): both sessions start, and small is built once. */
START_TEST(test_two_at_once_build_once)
{
    char delay[16];
    const char *flags[] = {"--threads", "2", NULL, NULL, NULL};
    itest_daemon_t *d;
    itest_conn_t *a, *b;
    int64_t prompt[] = {7, 8};
    itest_session_t sa, sb;
    cJSON *r;

#if SLOTD_FAULT_INJECTION
    snprintf(delay, sizeof(delay), "%d", itest_scale_ms(500));
    flags[2] = "--fault-build-delay-ms";
    flags[3] = delay;
#else
    (void)delay;
#endif
    d = itest_daemon_startv(flags);
    a = itest_connect(d);
    b = itest_connect(d);
    itest_session_init(&sa, "x", "small", prompt, 2);
    itest_session_init(&sb, "x", "small", prompt, 2);
    ck_assert(itest_send_str(
        a, "{\"op\":\"start\",\"id\":\"x\",\"model\":\"small\",\"prompt\":[7,8]}\n"));
    ck_assert(itest_send_str(
        b, "{\"op\":\"start\",\"id\":\"x\",\"model\":\"small\",\"prompt\":[7,8]}\n"));
    /* Whichever start runs second may reuse the first's entry 0 (the
     * prefix cache): `cached` 0 or 1, the rest byte for byte. */
    r = itest_read_reply(a);
    ck_assert_msg(
        strcmp(itest_last_line(a), "{\"id\":\"x\",\"model\":\"small\",\"entries\":2,\"cached\":0}") == 0 ||
            strcmp(itest_last_line(a), "{\"id\":\"x\",\"model\":\"small\",\"entries\":2,\"cached\":1}") == 0,
        "%s", itest_last_line(a));
    cJSON_Delete(r);
    r = itest_read_reply(b);
    ck_assert_msg(
        strcmp(itest_last_line(b), "{\"id\":\"x\",\"model\":\"small\",\"entries\":2,\"cached\":0}") == 0 ||
            strcmp(itest_last_line(b), "{\"id\":\"x\",\"model\":\"small\",\"entries\":2,\"cached\":1}") == 0,
        "%s", itest_last_line(b));
    cJSON_Delete(r);
    itest_session_step(a, &sa, 3);
    itest_session_step(b, &sb, 1);
    ck_assert_int_eq(builds(d, "small"), 1);
    ck_assert_int_eq(builds(d, "base"), 0);
    itest_session_free(&sa);
    itest_session_free(&sb);
    itest_close(a);
    itest_close(b);
}
END_TEST

/* --models still limits the presets: one left out is refused as before,
 * and never built. */
START_TEST(test_models_excludes)
{
    itest_daemon_t *d = itest_daemon_start("--models", "tiny,hash,small", NULL);
    itest_conn_t *c = itest_connect(d);
    cJSON *r;

    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"b\",\"model\":\"base\",\"prompt\":[1]}");
    itest_expect_error(r, NULL, "bad_request", "model", "'base'", "not", "loaded", NULL);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"tag\":3,\"op\":\"logits\",\"model\":\"base\",\"tokens\":[1]}");
    itest_expect_error(r, "3", "bad_request", "model", "'base'", "not", "loaded", NULL);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"s\",\"model\":\"small\",\"prompt\":[1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    ck_assert_int_eq(builds(d, "base"), 0);
    ck_assert_int_eq(builds(d, "small"), 1);
    ck_assert_int_eq(itest_stat(c, "live_sessions"), 1);
    itest_close(c);
}
END_TEST

/* --preload builds the named presets at start; none builds nothing, and
 * the default model is then built by its first start. */
START_TEST(test_preload)
{
    itest_daemon_t *d = itest_daemon_start("--preload", "small,hash", NULL);
    itest_daemon_t *e = itest_daemon_start("--preload", "none", NULL);
    itest_conn_t *c;
    cJSON *r;

    ck_assert_int_eq(builds(d, "small"), 1);
    ck_assert_int_eq(builds(d, "hash"), 1);
    ck_assert_int_eq(builds(d, "tiny"), 0);
    ck_assert_int_eq(builds(e, "tiny"), 0);
    ck_assert_int_eq(builds(e, "hash"), 0);
    c = itest_connect(e);
    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"t\",\"prompt\":[1,2]}");
    ck_assert_str_eq(itest_last_line(c), "{\"id\":\"t\",\"model\":\"tiny\",\"entries\":2,\"cached\":0}");
    cJSON_Delete(r);
    ck_assert_int_eq(builds(e, "tiny"), 1);
    itest_close(c);
}
END_TEST

#if SLOTD_FAULT_INJECTION
/* While base is being built (slowed down to seconds), its connection's
 * later lines wait behind the start that named it, and everything else is
 * served: another connection's stats and tiny sessions, the admin port.
 * Then the waiting lines take effect in the order sent. */
START_TEST(test_served_while_building)
{
    char delay[16];
    itest_daemon_t *d;
    itest_conn_t *a, *b;
    int64_t tp[] = {1, 2}, bp[] = {3, 4, 5};
    itest_session_t t, bs, u;
    cJSON *r, *st;

    snprintf(delay, sizeof(delay), "%d", itest_scale_ms(3000));
    d = itest_daemon_start("--threads", "2", "--fault-build-delay-ms", delay, NULL);
    a = itest_connect(d);
    b = itest_connect(d);
    itest_session_init(&t, "t", "tiny", tp, 2);
    itest_session_init(&bs, "b", "base", bp, 3);
    itest_session_init(&u, "u", "tiny", tp, 2);
    /* On a: a tiny session, then base, then lines behind it. */
    ck_assert(
        itest_send_str(a, "{\"op\":\"start\",\"id\":\"t\",\"model\":\"tiny\",\"prompt\":[1,2]}\n"
                          "{\"op\":\"start\",\"id\":\"b\",\"model\":\"base\",\"prompt\":[3,4,5]}\n"
                          "{\"op\":\"step\",\"id\":\"t\"}\n"
                          "{\"tag\":\"s\",\"op\":\"stats\"}\n"
                          "{\"op\":\"step\",\"id\":\"b\",\"n\":2}\n"
                          "{\"op\":\"finish\",\"id\":\"t\"}\n"));
    r = itest_read_reply(a);
    ck_assert_str_eq(itest_last_line(a), "{\"id\":\"t\",\"model\":\"tiny\",\"entries\":2,\"cached\":0}");
    cJSON_Delete(r);

    /* The build is under way: b is served meanwhile, the admin port too. */
    itest_session_start(b, &u);
    itest_session_step(b, &u, 3);
    st = itest_stats(b);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 2); /* t and u, not yet base's */
    cJSON_Delete(st);
    st = itest_admin_stats(d);
    cJSON_Delete(st);
    ck_assert_int_eq(builds(d, "base"), 0);
    ck_assert_msg(itest_expect_silence(a, 100),
                  "a line behind the waiting start was answered early");

    /* Then a's lines, in order. */
    r = itest_read_reply(a);
    ck_assert_str_eq(itest_last_line(a), "{\"id\":\"b\",\"model\":\"base\",\"entries\":3,\"cached\":0}");
    cJSON_Delete(r);
    r = itest_read_reply(a);
    itest_session_check_step(&t, r, itest_last_line(a), 1, NULL);
    cJSON_Delete(r);
    r = itest_read_reply(a);
    itest_expect_tag(r, "\"s\"");
    ck_assert_int_eq(itest_int(r, "live_sessions"), 3);
    cJSON_Delete(r);
    r = itest_read_reply(a);
    itest_session_check_step(&bs, r, itest_last_line(a), 2, NULL);
    cJSON_Delete(r);
    r = itest_read_reply(a);
    ck_assert_str_eq(itest_last_line(a), "{\"id\":\"t\",\"released\":3}");
    cJSON_Delete(r);
    ck_assert_int_eq(builds(d, "base"), 1);
    itest_session_finish(a, &bs);
    itest_session_finish(b, &u);
    itest_session_free(&t);
    itest_session_free(&bs);
    itest_session_free(&u);
    itest_close(a);
    itest_close(b);
}
END_TEST

/* A drain while a preset is being built answers the waiting request and
 * the lines behind it shutting_down, and the daemon exits 0 once the
 * build is over. */
START_TEST(test_drain_while_building)
{
    char delay[16];
    itest_daemon_t *d;
    itest_conn_t *a;
    cJSON *r;

    snprintf(delay, sizeof(delay), "%d", itest_scale_ms(1500));
    d = itest_daemon_start("--fault-build-delay-ms", delay, NULL);
    a = itest_connect(d);
    ck_assert(itest_send_str(a,
                             "{\"op\":\"start\",\"id\":\"b\",\"model\":\"base\",\"prompt\":[1]}\n"
                             "{\"op\":\"stats\"}\n"));
    ck_assert(itest_expect_silence(a, itest_scale_ms(200)));
    itest_daemon_signal(d, SIGTERM);
    for (int i = 0; i < 2; i++) {
        r = itest_read_reply(a);
        itest_expect_error(r, NULL, "shutting_down", NULL);
        cJSON_Delete(r);
    }
    ck_assert_int_eq(itest_daemon_wait(d, ITEST_STOP_MS), 0);
    itest_close(a);
}
END_TEST
#endif

int main(void)
{
    Suite *s = suite_create("integration_presets");
    ITEST_ADD(s, test_base_without_models);
    ITEST_ADD(s, test_two_at_once_build_once);
    ITEST_ADD(s, test_models_excludes);
    ITEST_ADD(s, test_preload);
#if SLOTD_FAULT_INJECTION
    ITEST_ADD(s, test_served_while_building);
    ITEST_ADD(s, test_drain_while_building);
#endif
    return itest_main(s);
}
