/*
 * test_integration_ops.c: every op of docs/protocol.md and the shape of every
 * reply, seen from a client of the real daemon.
 *
 * Each test starts a daemon on free loopback ports and sends it JSON lines:
 * start (entries, the model echoed, the default model), step (n absent and
 * n = 3, tokens, logits as V six-decimal numbers per step for attn models and
 * absent for hash, entries), finish (released), the stateless logits and
 * generate (rows by the formulas of docs/models.md, tokens including the input,
 * the golden values of docs/models.md, cached equal to uncached), stats (every
 * member docs/protocol.md names), the tag echoed as given on success and error
 * replies, and members an op does not know being ignored.  Token and logit
 * values are checked against the library's uncached model_generate().
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "itest.h"

static const double golden_first_logits[6] = {-0.215893, 0.026816, -0.396466,
                                              0.115424,  0.344289, 0.245721};

/* Polls stats until "connections" equals `want` (the readiness probes of
 * the start-up close asynchronously). */
static void await_connections(itest_conn_t *c, int64_t want)
{
    int64_t got = -1;
    for (int i = 0; i < 200; i++) {
        got = itest_stat(c, "connections");
        if (got == want) {
            return;
        }
        itest_sleep_ms(10);
    }
    ck_abort_msg("stats connections stayed %lld, expected %lld", (long long)got, (long long)want);
}

/* `req` is answered ok, with the integer `member` == `want`. */
static void expect_ok_int(itest_conn_t *c, const char *req, const char *member, int64_t want)
{
    cJSON *r = itest_rpc(c, "%s", req);
    itest_expect_ok(r);
    ck_assert_int_eq(itest_int(r, member), want);
    cJSON_Delete(r);
}

START_TEST(test_start_reply)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);

    /* The default model is tiny, echoed in the reply. */
    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1,2,3]}");
    itest_expect_ok(r);
    ck_assert_str_eq(itest_str(r, "id"), "a");
    ck_assert_str_eq(itest_str(r, "model"), "tiny");
    ck_assert_int_eq(itest_int(r, "entries"), 3);
    itest_expect_tag(r, NULL);
    cJSON_Delete(r);

    /* A named model; entries = prompt length, for lengths 1 and max_ctx. */
    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"h\",\"model\":\"hash\",\"prompt\":[999]}");
    itest_expect_ok(r);
    ck_assert_str_eq(itest_str(r, "id"), "h");
    ck_assert_str_eq(itest_str(r, "model"), "hash");
    ck_assert_int_eq(itest_int(r, "entries"), 1);
    cJSON_Delete(r);

    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"full\",\"model\":\"tiny\",\"prompt\":[0,1,2,3,4,5,"
                     "0,1]}");
    itest_expect_ok(r);
    ck_assert_str_eq(itest_str(r, "model"), "tiny");
    ck_assert_int_eq(itest_int(r, "entries"), 8);
    cJSON_Delete(r);

    /* Ids use the whole alphabet and the full 64 characters. */
    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"Az09_.:-\",\"prompt\":[5]}");
    itest_expect_ok(r);
    ck_assert_str_eq(itest_str(r, "id"), "Az09_.:-");
    cJSON_Delete(r);
    char id64[65];
    memset(id64, 'x', 64);
    id64[64] = '\0';
    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"%s\",\"prompt\":[5]}", id64);
    itest_expect_ok(r);
    ck_assert_str_eq(itest_str(r, "id"), id64);
    cJSON_Delete(r);

    cJSON *st = itest_stats(c);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 5);
    ck_assert_int_eq(itest_int(st, "cache_entries"), 3 + 1 + 8 + 1 + 1);
    cJSON_Delete(st);
    itest_close(c);
}
END_TEST

START_TEST(test_step_reply)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);

    /* tiny: n absent is one step; n = 3 gives three tokens and three rows of
     * six logits; entries grows by n. */
    int64_t p[] = {0, 1, 2};
    itest_session_t s;
    itest_session_init(&s, "a", "tiny", p, 3);
    itest_session_start(c, &s);
    itest_session_step(c, &s, 1);
    itest_session_step(c, &s, 3);
    ck_assert_int_eq(itest_session_entries(&s), 7);

    /* The first pick of [0,1,2] is docs/models.md's golden one. */
    itest_session_t g;
    itest_session_init(&g, "golden", "tiny", p, 3);
    itest_session_start(c, &g);
    cJSON *r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"golden\"}");
    itest_expect_ok(r);
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(r, "tokens");
    ck_assert(cJSON_IsArray(tk) && cJSON_GetArraySize(tk) == 1);
    ck_assert_int_eq((int)cJSON_GetArrayItem(tk, 0)->valuedouble, 4);
    itest_expect_logits(itest_last_line(c), golden_first_logits, 6);
    ck_assert_int_eq(itest_int(r, "entries"), 4);
    cJSON_Delete(r);

    /* hash: tokens, entries, and no logits member at all. */
    int64_t hp[] = {1, 2, 3, 4};
    itest_session_t h;
    itest_session_init(&h, "h", "hash", hp, 4);
    itest_session_start(c, &h);
    itest_session_step(c, &h, 1);
    itest_session_step(c, &h, 3);
    itest_session_step(c, &h, 50);
    ck_assert_int_eq(itest_session_entries(&h), 58);

    itest_session_finish(c, &s);
    itest_session_finish(c, &h);
    itest_session_free(&s);
    itest_session_free(&g);
    itest_session_free(&h);
    itest_close(c);
}
END_TEST

START_TEST(test_finish_reply)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t p[] = {3, 1};
    itest_session_t s;
    itest_session_init(&s, "f", "tiny", p, 2);
    itest_session_start(c, &s);
    itest_session_step(c, &s, 2);

    cJSON *r = itest_rpc(c, "{\"op\":\"finish\",\"id\":\"f\"}");
    itest_expect_ok(r);
    ck_assert_str_eq(itest_str(r, "id"), "f");
    ck_assert_int_eq(itest_int(r, "released"), 4);
    itest_expect_tag(r, NULL);
    cJSON_Delete(r);

    /* A second finish, and a step after finish, are unknown_id. */
    r = itest_rpc(c, "{\"op\":\"finish\",\"id\":\"f\"}");
    itest_expect_error(r, NULL, "unknown_id", "f", NULL);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"f\"}");
    itest_expect_error(r, NULL, "unknown_id", "f", NULL);
    cJSON_Delete(r);

    cJSON *st = itest_stats(c);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 0);
    ck_assert_int_eq(itest_int(st, "cache_entries"), 0);
    ck_assert_int_eq(itest_int(st, "released.finish"), 1);
    cJSON_Delete(st);
    itest_session_free(&s);
    itest_close(c);
}
END_TEST

START_TEST(test_logits_op)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);

    /* docs/models.md's golden first logits; rows = L * n. */
    cJSON *r = itest_rpc(c, "{\"op\":\"logits\",\"tokens\":[0,1,2]}");
    itest_expect_ok(r);
    const cJSON *lg = cJSON_GetObjectItemCaseSensitive(r, "logits");
    ck_assert_msg(cJSON_IsArray(lg) && cJSON_GetArraySize(lg) == 6,
                  "logits is not a flat array of V=6: %s", itest_last_line(c));
    for (int i = 0; i < 6; i++) {
        ck_assert(cJSON_IsNumber(cJSON_GetArrayItem(lg, i)));
    }
    itest_expect_logits(itest_last_line(c), golden_first_logits, 6);
    ck_assert_int_eq(itest_int(r, "rows"), 6);
    cJSON_Delete(r);

    /* Other lengths, model named, against the reference. */
    const int64_t seqs[][8] = {{5}, {0, 0}, {1, 2, 3, 4, 5}, {5, 4, 3, 2, 1, 0, 1, 2}};
    const size_t lens[] = {1, 2, 5, 8};
    for (int k = 0; k < 4; k++) {
        double ref[6];
        itest_reference_logits("tiny", seqs[k], lens[k], ref);
        char *arr = itest_json_tokens(seqs[k], lens[k]);
        r = itest_rpc(c, "{\"op\":\"logits\",\"model\":\"tiny\",\"tokens\":%s}", arr);
        free(arr);
        itest_expect_ok(r);
        itest_expect_logits(itest_last_line(c), ref, 6);
        ck_assert_int_eq(itest_int(r, "rows"), 2 * (int64_t)lens[k]);
        cJSON_Delete(r);
    }
    itest_close(c);
}
END_TEST

/* Checks a generate reply against the reference: tokens (input included),
 * steps rows of V logits, and rows. */
static void check_generate(itest_conn_t *c, const int64_t *tokens, size_t n, int steps,
                           bool use_cache, int64_t want_rows)
{
    char *arr = itest_json_tokens(tokens, n);
    cJSON *r = itest_rpc(c, "{\"op\":\"generate\",\"tokens\":%s,\"steps\":%d,\"use_cache\":%s}",
                         arr, steps, use_cache ? "true" : "false");
    free(arr);
    itest_expect_ok(r);
    uint32_t want_tokens[16];
    double ref[16 * 6];
    itest_reference("tiny", tokens, n, steps, want_tokens, ref);
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(r, "tokens");
    ck_assert_msg(cJSON_IsArray(tk) && cJSON_GetArraySize(tk) == (int)n + steps,
                  "generate tokens must be the input plus %d picks: %s", steps, itest_last_line(c));
    for (size_t i = 0; i < n + (size_t)steps; i++) {
        ck_assert_msg(cJSON_GetArrayItem(tk, (int)i)->valuedouble == (double)want_tokens[i],
                      "generate token %zu differs from the reference: %s", i, itest_last_line(c));
    }
    const cJSON *lg = cJSON_GetObjectItemCaseSensitive(r, "logits");
    ck_assert_msg(cJSON_IsArray(lg) && cJSON_GetArraySize(lg) == steps,
                  "generate logits must be %d rows: %s", steps, itest_last_line(c));
    for (int i = 0; i < steps; i++) {
        const cJSON *row = cJSON_GetArrayItem(lg, i);
        ck_assert(cJSON_IsArray(row) && cJSON_GetArraySize(row) == 6);
    }
    itest_expect_logits(itest_last_line(c), ref, (size_t)steps * 6);
    ck_assert_msg(itest_int(r, "rows") == want_rows,
                  "generate %s n=%zu steps=%d: rows %lld, want %lld",
                  use_cache ? "cached" : "uncached", n, steps, (long long)itest_int(r, "rows"),
                  (long long)want_rows);
    cJSON_Delete(r);
}

START_TEST(test_generate_op)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);

    /* The golden example of docs/models.md. */
    int64_t g[] = {0, 1, 2};
    cJSON *r =
        itest_rpc(c, "{\"op\":\"generate\",\"tokens\":[0,1,2],\"steps\":5,\"use_cache\":true}");
    itest_expect_ok(r);
    char *cached = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(r, "tokens"));
    ck_assert_str_eq(cached, "[0,1,2,4,0,0,0,0]");
    free(cached);
    ck_assert_int_eq(itest_int(r, "rows"), 14);
    char(*cached_raw)[64] = malloc(30 * sizeof(*cached_raw));
    ck_assert_int_eq(itest_raw_numbers(itest_last_line(c), "logits", cached_raw, 30), 30);
    cJSON_Delete(r);

    r = itest_rpc(c, "{\"op\":\"generate\",\"tokens\":[0,1,2],\"steps\":5,\"use_cache\":false}");
    itest_expect_ok(r);
    ck_assert_int_eq(itest_int(r, "rows"), 50);
    char(*uncached_raw)[64] = malloc(30 * sizeof(*uncached_raw));
    ck_assert_int_eq(itest_raw_numbers(itest_last_line(c), "logits", uncached_raw, 30), 30);
    for (int i = 0; i < 30; i++) {
        ck_assert_msg(strcmp(cached_raw[i], uncached_raw[i]) == 0,
                      "cached and uncached logit %d differ: %s vs %s", i, cached_raw[i],
                      uncached_raw[i]);
    }
    free(cached_raw);
    free(uncached_raw);
    cJSON_Delete(r);

    /* use_cache absent is uncached. */
    expect_ok_int(c, "{\"op\":\"generate\",\"tokens\":[0,1,2],\"steps\":5}", "rows", 50);

    /* Rows formulas: cached L*(n+steps-1), uncached L*sum(n+k), 0 for 0 steps. */
    check_generate(c, g, 3, 5, true, 14);
    check_generate(c, g, 3, 5, false, 50);
    int64_t one[] = {3};
    check_generate(c, one, 1, 4, true, 2 * (1 + 4 - 1));
    check_generate(c, one, 1, 4, false, 2 * (1 + 2 + 3 + 4));
    check_generate(c, one, 1, 7, true, 2 * 7);
    check_generate(c, one, 1, 7, false, 2 * (1 + 2 + 3 + 4 + 5 + 6 + 7));
    int64_t four[] = {5, 5, 1, 0};
    check_generate(c, four, 4, 1, true, 2 * 4);
    check_generate(c, four, 4, 1, false, 2 * 4);
    check_generate(c, four, 4, 0, true, 0);
    check_generate(c, four, 4, 0, false, 0);
    int64_t eight[] = {0, 1, 2, 3, 4, 5, 0, 1};
    check_generate(c, eight, 8, 0, true, 0);

    /* A cached generate returns its borrowed slot before replying. */
    cJSON *st = itest_stats(c);
    ck_assert_int_eq(itest_int(st, "pool_slots_used"), 0);
    ck_assert_int_eq(itest_int(st, "cache_entries"), 0);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 0);
    cJSON_Delete(st);
    itest_close(c);
}
END_TEST

START_TEST(test_stats_op)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    await_connections(c, 1);

    cJSON *st = itest_stats(c);
    ck_assert_int_eq(itest_int(st, "cache_entries"), 0);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 0);
    ck_assert_int_eq(itest_int(st, "pool_slots_used"), 0);
    ck_assert_int_eq(itest_int(st, "pool_bytes_used"), 0);
    ck_assert_int_gt(itest_int(st, "pool_slots_total"), 0);
    ck_assert_int_gt(itest_int(st, "pool_bytes_total"), 0);
    ck_assert_int_eq(itest_int(st, "errors_total"), 0);
    const cJSON *rel = cJSON_GetObjectItemCaseSensitive(st, "released");
    ck_assert(cJSON_IsObject(rel));
    ck_assert_int_eq(itest_int(st, "released.finish"), 0);
    ck_assert_int_eq(itest_int(st, "released.disconnect"), 0);
    ck_assert_int_eq(itest_int(st, "released.idle"), 0);
    ck_assert_int_eq(itest_int(st, "released.shutdown"), 0);
    int64_t req0 = itest_int(st, "requests_total");
    cJSON_Delete(st);

    /* A second connection is counted; requests and errors are counted. */
    itest_conn_t *c2 = itest_connect(d);
    await_connections(c, 2);
    cJSON *r = itest_rpc(c2, "{\"op\":\"nope\"}");
    itest_expect_error(r, NULL, "unknown_op", "op", NULL);
    cJSON_Delete(r);
    r = itest_rpc(c2, "{\"op\":\"start\",\"id\":\"s\",\"prompt\":[1,2]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    st = itest_stats(c);
    ck_assert_int_eq(itest_int(st, "connections"), 2);
    ck_assert_int_eq(itest_int(st, "errors_total"), 1);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 1);
    ck_assert_int_eq(itest_int(st, "cache_entries"), 2);
    ck_assert_int_eq(itest_int(st, "pool_slots_used"), 1);
    ck_assert_int_gt(itest_int(st, "pool_bytes_used"), 0);
    ck_assert_msg(itest_int(st, "requests_total") >= req0 + 3,
                  "requests_total %lld did not count the requests since %lld",
                  (long long)itest_int(st, "requests_total"), (long long)req0);
    cJSON_Delete(st);
    itest_close(c2);
    await_connections(c, 1);
    itest_close(c);
}
END_TEST

START_TEST(test_tag_echo)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    const char *tags[] = {"\"x1\"",
                          "7",
                          "0",
                          "-12",
                          "123456789012",
                          "\"\"",
                          "\"sp ace\\\"q\\\\\"",
                          "\"\\u00e9\\u20ac\"",
                          "\"\xc3\xa9\"",
                          "9007199254740991"};
    /* Each request, in order (start, step and finish act on one session),
     * with the tag as its %s: the reply echoes it, ok or an error. */
    static const struct {
        const char *fmt;
        const char *code; /* NULL: an ok reply */
        const char *word; /* a word the error message names */
    } reqs[] = {
        {"{\"tag\":%s,\"op\":\"start\",\"id\":\"t\",\"prompt\":[1]}", NULL, NULL},
        {"{\"op\":\"step\",\"id\":\"t\",\"tag\":%s}", NULL, NULL},
        {"{\"op\":\"finish\",\"id\":\"t\",\"tag\":%s}", NULL, NULL},
        {"{\"op\":\"stats\",\"tag\":%s}", NULL, NULL},
        {"{\"op\":\"logits\",\"tokens\":[1],\"tag\":%s}", NULL, NULL},
        {"{\"op\":\"generate\",\"tokens\":[1],\"steps\":1,\"tag\":%s}", NULL, NULL},
        {"{\"op\":\"finish\",\"id\":\"t\",\"tag\":%s}", "unknown_id", "t"},
        {"{\"op\":\"launch\",\"tag\":%s}", "unknown_op", "op"},
        {"{\"tag\":%s}", "unknown_op", "op"},
        {"{\"op\":\"step\",\"id\":\"t\",\"n\":0,\"tag\":%s}", "bad_request", "n"},
        {"{\"op\":\"logits\",\"tokens\":[0,1,2,3,4,5,0,1,2],\"tag\":%s}", "too_long", "length"},
    };
    for (size_t i = 0; i < sizeof(tags) / sizeof(tags[0]); i++) {
        const char *t = tags[i];
        for (size_t k = 0; k < sizeof(reqs) / sizeof(reqs[0]); k++) {
            cJSON *r = itest_rpc(c, reqs[k].fmt, t);
            if (reqs[k].code == NULL) {
                itest_expect_ok(r);
                itest_expect_tag(r, t);
            } else {
                itest_expect_error(r, t, reqs[k].code, reqs[k].word, NULL);
            }
            if (strstr(reqs[k].fmt, "\"op\":\"stats\"") != NULL)
                itest_check_stats_shape(r);
            cJSON_Delete(r);
        }
    }
    /* Without a tag, no tag in the reply (success and error). */
    cJSON *r = itest_rpc(c, "{\"op\":\"stats\"}");
    itest_expect_tag(r, NULL);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"zz\"}");
    itest_expect_error(r, NULL, "unknown_id", "zz", NULL);
    cJSON_Delete(r);
    itest_close(c);
}
END_TEST

START_TEST(test_unknown_members_ignored)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t p[] = {2, 4};
    itest_session_t s;
    itest_session_init(&s, "u", "tiny", p, 2);

    cJSON *r = itest_rpc(c, "{\"op\":\"stats\",\"foo\":[1,{\"x\":null}],\"id\":5,\"prompt\":\"x\","
                            "\"n\":\"many\",\"steps\":null}");
    itest_check_stats_shape(r);
    cJSON_Delete(r);

    /* Members of other ops are unknown to this one, whatever their type. */
    r = itest_rpc(c, "{\"zz\":{\"deep\":[[[]]]},\"op\":\"start\",\"id\":\"u\",\"prompt\":[2,4],"
                     "\"n\":\"x\",\"steps\":-1,\"use_cache\":7,\"tokens\":\"no\"}");
    itest_expect_ok(r);
    ck_assert_int_eq(itest_int(r, "entries"), 2);
    ck_assert_str_eq(itest_str(r, "model"), "tiny");
    cJSON_Delete(r);

    r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"u\",\"prompt\":null,\"model\":5,\"extra\":true}");
    itest_session_check_step(&s, r, itest_last_line(c), 1, NULL);
    cJSON_Delete(r);

    expect_ok_int(c, "{\"op\":\"logits\",\"tokens\":[1],\"id\":[],\"n\":0,\"prompt\":{}}", "rows",
                  2);

    expect_ok_int(c, "{\"op\":\"generate\",\"tokens\":[1],\"steps\":2,\"id\":\"bad id\",\"n\":-3}",
                  "rows", 2 * (1 + 2));

    expect_ok_int(c, "{\"op\":\"finish\",\"id\":\"u\",\"prompt\":[99],\"n\":0,\"unknown\":\"\"}",
                  "released", 3);
    itest_session_free(&s);
    itest_close(c);
}
END_TEST

START_TEST(test_default_model_flag)
{
    itest_daemon_t *d = itest_daemon_start("--default-model", "hash", NULL);
    itest_conn_t *c = itest_connect(d);
    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"a\",\"prompt\":[10,20,30]}");
    itest_expect_ok(r);
    ck_assert_str_eq(itest_str(r, "model"), "hash");
    cJSON_Delete(r);
    int64_t p[] = {10, 20, 30};
    itest_session_t s;
    itest_session_init(&s, "a", "hash", p, 3);
    itest_session_step(c, &s, 2);
    itest_session_free(&s);

    /* The other served model stays reachable by name. */
    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"b\",\"model\":\"tiny\",\"prompt\":[1]}");
    itest_expect_ok(r);
    ck_assert_str_eq(itest_str(r, "model"), "tiny");
    cJSON_Delete(r);
    itest_close(c);
}
END_TEST

START_TEST(test_integral_numbers)
{
    /* "Integers are JSON numbers with an integral value": 2.0, 2e0 and
     * 20e-1 are the integer 2. */
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    expect_ok_int(c, "{\"op\":\"start\",\"id\":\"i\",\"prompt\":[1.0,2e0,20e-1,3E0]}", "entries",
                  4);
    int64_t p[] = {1, 2, 2, 3};
    itest_session_t s;
    itest_session_init(&s, "i", "tiny", p, 4);
    cJSON *r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"i\",\"n\":2.0}");
    itest_session_check_step(&s, r, itest_last_line(c), 2, NULL);
    cJSON_Delete(r);
    expect_ok_int(c, "{\"op\":\"generate\",\"tokens\":[1.0],\"steps\":1e0}", "rows", 2);
    itest_session_free(&s);
    itest_close(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("integration_ops");
    ITEST_ADD(s, test_start_reply);
    ITEST_ADD(s, test_step_reply);
    ITEST_ADD(s, test_finish_reply);
    ITEST_ADD(s, test_logits_op);
    ITEST_ADD(s, test_generate_op);
    ITEST_ADD(s, test_stats_op);
    ITEST_ADD(s, test_tag_echo);
    ITEST_ADD(s, test_unknown_members_ignored);
    ITEST_ADD(s, test_default_model_flag);
    ITEST_ADD(s, test_integral_numbers);
    return itest_main(s);
}
