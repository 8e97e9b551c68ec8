/*
 * test_integration_errors.c: every error code of docs/protocol.md, sent to the
 * live daemon.
 *
 * Each error is provoked on purpose and its reply checked: the code, the
 * word the table says the message contains (op, the field's name, length,
 * the id), the tag echoed when the request carried a valid one, and nothing
 * else in the reply.  bad_request is provoked for every field (tokens,
 * steps, use_cache, id, prompt, model, n, tag) in every wrong way; too_long,
 * unknown_id, duplicate_id, context_full and cache_full (by slot count and
 * by bytes) at their boundaries; a daemon serving only the hash model
 * answers the attn-only ops with bad_request naming model.  The precedence order (framing, JSON,
 * op, fields, session state, capacity) is checked with lines that are wrong in two ways at once.
 * Every error must leave every session exactly as it was: live sessions sit beside the errors, the
 * stats figures are compared after each one, and the sessions are stepped afterwards and compared
 * with the uncached reference.  (bad_json and line_too_long are exercised at length in
 * test_integration_malformed.c, shutting_down in test_integration_shutdown.c.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "itest.h"

/* Sends `line` and checks the error; `word` may be NULL. */
static void expect_err(itest_conn_t *c, const char *line, const char *tag, const char *code,
                       const char *word)
{
    cJSON *r = itest_rpc(c, "%s", line);
    if (itest_error_code(r) == NULL || strcmp(itest_error_code(r), code) != 0) {
        fprintf(stderr, "request: %s\nreply:   %s\n", line, itest_last_line(c));
    }
    itest_expect_error(r, tag, code, word, NULL);
    cJSON_Delete(r);
}

/* As expect_err(), but a mismatch is collected and the test goes on. */
static void soft_err(itest_conn_t *c, const char *line, const char *tag, const char *code,
                     const char *word)
{
    char why[800];
    cJSON *r = itest_rpc(c, "%s", line);
    if (!itest_error_is(r, tag, code, why, sizeof(why), word, NULL)) {
        itest_soft_fail("request %s: %s", line, why);
    }
    cJSON_Delete(r);
}

/* Fails unless the stats show `entries` cache entries in `live` sessions. */
static void expect_unchanged(itest_conn_t *c, int64_t entries, int64_t live, const char *after)
{
    cJSON *st = itest_stats(c);
    ck_assert_msg(itest_int(st, "cache_entries") == entries &&
                      itest_int(st, "live_sessions") == live,
                  "after %s: cache_entries %lld live %lld, expected %lld and %lld", after,
                  (long long)itest_int(st, "cache_entries"),
                  (long long)itest_int(st, "live_sessions"), (long long)entries, (long long)live);
    cJSON_Delete(st);
}

typedef struct bad_case {
    const char *line;
    const char *field; /* the name the message contains */
} bad_case_t;

/* Lines that are bad_request naming a field.  The sessions "s" (tiny) and
 * "h" (hash) are live when they are sent, so state errors cannot mask them. */
static const bad_case_t bad_cases[] = {
    /* prompt (start) */
    {"{\"op\":\"start\",\"id\":\"n1\"}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"prompt\":[]}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"prompt\":null}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"prompt\":\"1,2\"}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"prompt\":5}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"prompt\":{}}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"prompt\":true}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"prompt\":[[1]]}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"prompt\":[\"1\"]}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"prompt\":[true]}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"prompt\":[null]}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"prompt\":[{}]}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"prompt\":[-1]}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"prompt\":[1.5]}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"prompt\":[1,2,-0.5]}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"prompt\":[6]}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"model\":\"hash\",\"prompt\":[1000]}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"prompt\":[1e400]}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"prompt\":[-1e400]}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"prompt\":[1e20]}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"model\":\"hash\",\"prompt\":[9007199254740993]}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"model\":\"hash\",\"prompt\":[4294967296]}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"model\":\"hash\",\"prompt\":[4294967297]}", "prompt"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"model\":\"hash\",\"prompt\":[18446744073709551617]}",
     "prompt"},
    /* id (start, step, finish) */
    {"{\"op\":\"start\",\"prompt\":[1]}", "id"},
    {"{\"op\":\"start\",\"id\":null,\"prompt\":[1]}", "id"},
    {"{\"op\":\"start\",\"id\":5,\"prompt\":[1]}", "id"},
    {"{\"op\":\"start\",\"id\":true,\"prompt\":[1]}", "id"},
    {"{\"op\":\"start\",\"id\":[\"a\"],\"prompt\":[1]}", "id"},
    {"{\"op\":\"start\",\"id\":\"\",\"prompt\":[1]}", "id"},
    {"{\"op\":\"start\",\"id\":\"a b\",\"prompt\":[1]}", "id"},
    {"{\"op\":\"start\",\"id\":\"a/b\",\"prompt\":[1]}", "id"},
    {"{\"op\":\"start\",\"id\":\"a\\nb\",\"prompt\":[1]}", "id"},
    {"{\"op\":\"start\",\"id\":\"\\u00e9\",\"prompt\":[1]}", "id"},
    {"{\"op\":\"start\",\"id\":\"\xc3\xa9\",\"prompt\":[1]}", "id"},
    {"{\"op\":\"start\",\"id\":"
     "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\","
     "\"prompt\":[1]}",
     "id"},
    {"{\"op\":\"step\"}", "id"},
    {"{\"op\":\"step\",\"id\":null}", "id"},
    {"{\"op\":\"step\",\"id\":7}", "id"},
    {"{\"op\":\"step\",\"id\":\"s s\"}", "id"},
    {"{\"op\":\"finish\"}", "id"},
    {"{\"op\":\"finish\",\"id\":{}}", "id"},
    {"{\"op\":\"finish\",\"id\":\"\"}", "id"},
    {"{\"op\":\"finish\",\"id\":\"s*\"}", "id"},
    /* model (start, logits, generate) */
    {"{\"op\":\"start\",\"id\":\"n1\",\"model\":5,\"prompt\":[1]}", "model"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"model\":null,\"prompt\":[1]}", "model"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"model\":true,\"prompt\":[1]}", "model"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"model\":[\"tiny\"],\"prompt\":[1]}", "model"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"model\":\"\",\"prompt\":[1]}", "model"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"model\":\"nosuch\",\"prompt\":[1]}", "model"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"model\":\"TINY\",\"prompt\":[1]}", "model"},
    {"{\"op\":\"start\",\"id\":\"n1\",\"model\":\"small\",\"prompt\":[1]}", "model"},
    {"{\"op\":\"logits\",\"model\":\"hash\",\"tokens\":[1]}", "model"},
    {"{\"op\":\"logits\",\"model\":\"nosuch\",\"tokens\":[1]}", "model"},
    {"{\"op\":\"logits\",\"model\":0,\"tokens\":[1]}", "model"},
    {"{\"op\":\"generate\",\"model\":\"hash\",\"tokens\":[1],\"steps\":1}", "model"},
    {"{\"op\":\"generate\",\"model\":null,\"tokens\":[1],\"steps\":1}", "model"},
    {"{\"op\":\"generate\",\"model\":\"base\",\"tokens\":[1],\"steps\":1}", "model"},
    /* n (step) */
    {"{\"op\":\"step\",\"id\":\"s\",\"n\":0}", "n"},
    {"{\"op\":\"step\",\"id\":\"s\",\"n\":-1}", "n"},
    {"{\"op\":\"step\",\"id\":\"s\",\"n\":1.5}", "n"},
    {"{\"op\":\"step\",\"id\":\"s\",\"n\":0.999}", "n"},
    {"{\"op\":\"step\",\"id\":\"s\",\"n\":\"1\"}", "n"},
    {"{\"op\":\"step\",\"id\":\"s\",\"n\":null}", "n"},
    {"{\"op\":\"step\",\"id\":\"s\",\"n\":true}", "n"},
    {"{\"op\":\"step\",\"id\":\"s\",\"n\":[1]}", "n"},
    {"{\"op\":\"step\",\"id\":\"s\",\"n\":{}}", "n"},
    {"{\"op\":\"step\",\"id\":\"s\",\"n\":1e400}", "n"},
    {"{\"op\":\"step\",\"id\":\"s\",\"n\":-1e400}", "n"},
    {"{\"op\":\"step\",\"id\":\"h\",\"n\":-9007199254740993}", "n"},
    /* tokens (logits, generate) */
    {"{\"op\":\"logits\"}", "tokens"},
    {"{\"op\":\"logits\",\"tokens\":[]}", "tokens"},
    {"{\"op\":\"logits\",\"tokens\":null}", "tokens"},
    {"{\"op\":\"logits\",\"tokens\":\"012\"}", "tokens"},
    {"{\"op\":\"logits\",\"tokens\":{\"0\":1}}", "tokens"},
    {"{\"op\":\"logits\",\"tokens\":[6]}", "tokens"},
    {"{\"op\":\"logits\",\"tokens\":[-1]}", "tokens"},
    {"{\"op\":\"logits\",\"tokens\":[0.5]}", "tokens"},
    {"{\"op\":\"logits\",\"tokens\":[[0]]}", "tokens"},
    {"{\"op\":\"logits\",\"tokens\":[\"0\"]}", "tokens"},
    {"{\"op\":\"logits\",\"tokens\":[1e400]}", "tokens"},
    {"{\"op\":\"generate\",\"steps\":1}", "tokens"},
    {"{\"op\":\"generate\",\"tokens\":[],\"steps\":1}", "tokens"},
    {"{\"op\":\"generate\",\"tokens\":[0,1,7],\"steps\":1}", "tokens"},
    {"{\"op\":\"generate\",\"tokens\":[0,false],\"steps\":1}", "tokens"},
    /* steps (generate) */
    {"{\"op\":\"generate\",\"tokens\":[1]}", "steps"},
    {"{\"op\":\"generate\",\"tokens\":[1],\"steps\":null}", "steps"},
    {"{\"op\":\"generate\",\"tokens\":[1],\"steps\":-1}", "steps"},
    {"{\"op\":\"generate\",\"tokens\":[1],\"steps\":1.5}", "steps"},
    {"{\"op\":\"generate\",\"tokens\":[1],\"steps\":\"2\"}", "steps"},
    {"{\"op\":\"generate\",\"tokens\":[1],\"steps\":true}", "steps"},
    {"{\"op\":\"generate\",\"tokens\":[1],\"steps\":[2]}", "steps"},
    {"{\"op\":\"generate\",\"tokens\":[1],\"steps\":1e400}", "steps"},
    {"{\"op\":\"generate\",\"tokens\":[1],\"steps\":-1e400}", "steps"},
    /* use_cache (generate) */
    {"{\"op\":\"generate\",\"tokens\":[1],\"steps\":1,\"use_cache\":1}", "use_cache"},
    {"{\"op\":\"generate\",\"tokens\":[1],\"steps\":1,\"use_cache\":0}", "use_cache"},
    {"{\"op\":\"generate\",\"tokens\":[1],\"steps\":1,\"use_cache\":\"true\"}", "use_cache"},
    {"{\"op\":\"generate\",\"tokens\":[1],\"steps\":1,\"use_cache\":null}", "use_cache"},
    {"{\"op\":\"generate\",\"tokens\":[1],\"steps\":1,\"use_cache\":[]}", "use_cache"},
    {"{\"op\":\"generate\",\"tokens\":[1],\"steps\":1,\"use_cache\":{}}", "use_cache"},
};

/* bad_request naming `tag`: the tag is invalid, so nothing is echoed. */
static const char *const bad_tags[] = {
    "true", "false", "null", "1.5", "-0.5", "[]", "[1]", "{}", "{\"a\":1}", "1e400", "-1e400",
};

START_TEST(test_bad_request_every_field)
{
    /* small and base left out, so that naming them is the error of a
     * model --models does not allow. */
    itest_daemon_t *d = itest_daemon_start("--models", "tiny,hash", NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t sp[] = {0, 1}, hp[] = {5, 6, 7};
    itest_session_t s, h;
    itest_session_init(&s, "s", "tiny", sp, 2);
    itest_session_init(&h, "h", "hash", hp, 3);
    itest_session_start(c, &s);
    itest_session_start(c, &h);
    itest_session_step(c, &h, 4);
    int64_t err0 = itest_stat(c, "errors_total");
    int errors = 0;

    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
        const bad_case_t *bc = &bad_cases[i];
        /* Once as is, once with a valid tag in front, which is echoed. */
        soft_err(c, bc->line, NULL, "bad_request", bc->field);
        char tagged[512], tag[32];
        snprintf(tag, sizeof(tag), "\"e%zu\"", i);
        snprintf(tagged, sizeof(tagged), "{\"tag\":%s,%s", tag, bc->line + 1);
        soft_err(c, tagged, tag, "bad_request", bc->field);
        errors += 2;
        expect_unchanged(c, 9, 2, bc->line);
    }
    for (size_t i = 0; i < sizeof(bad_tags) / sizeof(bad_tags[0]); i++) {
        char line[256];
        snprintf(line, sizeof(line), "{\"op\":\"stats\",\"tag\":%s}", bad_tags[i]);
        soft_err(c, line, NULL, "bad_request", "tag");
        snprintf(line, sizeof(line), "{\"op\":\"step\",\"id\":\"s\",\"tag\":%s}", bad_tags[i]);
        soft_err(c, line, NULL, "bad_request", "tag");
        snprintf(line, sizeof(line), "{\"op\":\"finish\",\"id\":\"h\",\"tag\":%s}", bad_tags[i]);
        soft_err(c, line, NULL, "bad_request", "tag");
        errors += 3;
        expect_unchanged(c, 9, 2, line);
    }
    ck_assert_int_eq(itest_stat(c, "errors_total") - err0, errors);

    /* The sessions are exactly as they were. */
    itest_session_step(c, &s, 3);
    itest_session_step(c, &h, 10);
    itest_session_finish(c, &s);
    itest_session_finish(c, &h);
    itest_session_free(&s);
    itest_session_free(&h);
    itest_close(c);
}
END_TEST

START_TEST(test_huge_integers)
{
    /* Integral but beyond any count: for n and steps a client may read them
     * as out of range (bad_request naming the field) or as asking too much
     * (context_full, too_long naming length); either way, nothing changes. */
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t sp[] = {0, 1};
    itest_session_t s;
    itest_session_init(&s, "s", "tiny", sp, 2);
    itest_session_start(c, &s);
    const char *huge[] = {"1e20",       "9007199254740993",     "4294967296",
                          "4294967297", "18446744073709551617", "1e300"};
    for (size_t i = 0; i < sizeof(huge) / sizeof(huge[0]); i++) {
        cJSON *r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"s\",\"n\":%s}", huge[i]);
        if (itest_is_error(r, "bad_request")) {
            itest_expect_error(r, NULL, "bad_request", "n", NULL);
        } else {
            itest_expect_error(r, NULL, "context_full", NULL);
        }
        cJSON_Delete(r);
        r = itest_rpc(c, "{\"op\":\"generate\",\"tokens\":[1],\"steps\":%s}", huge[i]);
        if (itest_is_error(r, "bad_request")) {
            itest_expect_error(r, NULL, "bad_request", "steps", NULL);
        } else {
            itest_expect_error(r, NULL, "too_long", "length", NULL);
        }
        cJSON_Delete(r);
        expect_unchanged(c, 2, 1, huge[i]);
    }
    itest_session_step(c, &s, 6);
    itest_session_free(&s);
    itest_close(c);
}
END_TEST

START_TEST(test_unknown_op)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    const char *lines[] = {
        "{}",
        "{\"id\":\"a\",\"prompt\":[1]}",
        "{\"op\":null}",
        "{\"op\":5}",
        "{\"op\":true}",
        "{\"op\":[\"start\"]}",
        "{\"op\":{\"name\":\"start\"}}",
        "{\"op\":\"\"}",
        "{\"op\":\"START\"}",
        "{\"op\":\"Stats\"}",
        "{\"op\":\"stats \"}",
        "{\"op\":\" stats\"}",
        "{\"op\":\"stat\"}",
        "{\"op\":\"statsx\"}",
        "{\"op\":\"none\"}",
        "{\"op\":\"fly\",\"id\":\"a\"}",
        "{\"OP\":\"stats\"}",
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
        soft_err(c, lines[i], NULL, "unknown_op", "op");
        char tagged[256];
        snprintf(tagged, sizeof(tagged), "{\"tag\":%zu,%s", i, lines[i] + 1);
        if (strcmp(lines[i], "{}") == 0) {
            snprintf(tagged, sizeof(tagged), "{\"tag\":%zu}", i);
        }
        char tag[16];
        snprintf(tag, sizeof(tag), "%zu", i);
        soft_err(c, tagged, tag, "unknown_op", "op");
    }
    /* An escaped op name is the same name. */
    cJSON *r = itest_rpc(c, "{\"op\":\"st\\u0061ts\"}");
    itest_check_stats_shape(r);
    cJSON_Delete(r);
    itest_close(c);
}
END_TEST

START_TEST(test_too_long)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    /* tiny: max_ctx 8. */
    static const struct {
        const char *line, *tag;
    } over[] = {
        {"{\"op\":\"start\",\"id\":\"a\",\"prompt\":[0,1,2,3,4,5,0,1,2]}", NULL},
        {"{\"op\":\"logits\",\"tokens\":[0,1,2,3,4,5,0,1,2]}", NULL},
        {"{\"op\":\"generate\",\"tokens\":[0,1,2,3,4],\"steps\":4}", NULL},
        {"{\"op\":\"generate\",\"tokens\":[0,1,2,3,4,5,0,1],\"steps\":1,\"use_cache\":true}", NULL},
        {"{\"op\":\"generate\",\"tokens\":[0],\"steps\":8}", NULL},
        {"{\"op\":\"generate\",\"tokens\":[0],\"steps\":1000000}", NULL},
        {"{\"tag\":\"t\",\"op\":\"generate\",\"tokens\":[0],\"steps\":8}", "\"t\""},
    };
    for (size_t i = 0; i < sizeof(over) / sizeof(over[0]); i++)
        expect_err(c, over[i].line, over[i].tag, "too_long", "length");

    /* The boundaries themselves are fine. */
    cJSON *r = itest_rpc(c, "{\"op\":\"generate\",\"tokens\":[0],\"steps\":7,\"use_cache\":true}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"logits\",\"tokens\":[0,1,2,3,4,5,0,1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);

    /* hash: max_ctx 4096. */
    size_t n = 4097;
    int64_t *p = malloc(n * sizeof(int64_t));
    for (size_t i = 0; i < n; i++) {
        p[i] = (int64_t)(i % 1000);
    }
    char *arr = itest_json_tokens(p, n);
    char *line = malloc(strlen(arr) + 128);
    sprintf(line, "{\"op\":\"start\",\"id\":\"h\",\"model\":\"hash\",\"prompt\":%s}", arr);
    expect_err(c, line, NULL, "too_long", "length");
    free(arr);
    arr = itest_json_tokens(p, 4096);
    sprintf(line, "{\"op\":\"start\",\"id\":\"h\",\"model\":\"hash\",\"prompt\":%s}", arr);
    r = itest_rpc(c, "%s", line);
    itest_expect_ok(r);
    ck_assert_int_eq(itest_int(r, "entries"), 4096);
    cJSON_Delete(r);
    expect_unchanged(c, 4096, 1, "too_long");
    free(arr);
    free(line);
    free(p);
    itest_close(c);
}
END_TEST

START_TEST(test_unknown_id)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    const char *ids[] = {"a", "ghost", "Z9", "x.y:z-w_v", "0"};
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        char line[128];
        snprintf(line, sizeof(line), "{\"op\":\"step\",\"id\":\"%s\"}", ids[i]);
        expect_err(c, line, NULL, "unknown_id", ids[i]);
        snprintf(line, sizeof(line), "{\"op\":\"step\",\"id\":\"%s\",\"n\":3}", ids[i]);
        expect_err(c, line, NULL, "unknown_id", ids[i]);
        snprintf(line, sizeof(line), "{\"op\":\"finish\",\"id\":\"%s\",\"tag\":-1}", ids[i]);
        expect_err(c, line, "-1", "unknown_id", ids[i]);
    }
    /* Ids are case-sensitive. */
    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"Case\",\"prompt\":[1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    expect_err(c, "{\"op\":\"step\",\"id\":\"case\"}", NULL, "unknown_id", "case");
    expect_err(c, "{\"op\":\"finish\",\"id\":\"CASE\"}", NULL, "unknown_id", "CASE");
    expect_unchanged(c, 1, 1, "unknown_id");
    itest_close(c);
}
END_TEST

START_TEST(test_duplicate_id)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t p[] = {2, 3, 4};
    itest_session_t s;
    itest_session_init(&s, "dup", "tiny", p, 3);
    itest_session_start(c, &s);
    itest_session_step(c, &s, 1);
    /* Same prompt, another prompt, another model: all duplicate_id. */
    expect_err(c, "{\"op\":\"start\",\"id\":\"dup\",\"prompt\":[2,3,4]}", NULL, "duplicate_id",
               "dup");
    expect_err(c, "{\"op\":\"start\",\"id\":\"dup\",\"prompt\":[0]}", NULL, "duplicate_id", "dup");
    expect_err(c, "{\"tag\":9,\"op\":\"start\",\"id\":\"dup\",\"model\":\"hash\",\"prompt\":[1]}",
               "9", "duplicate_id", "dup");
    expect_unchanged(c, 4, 1, "duplicate_id");
    itest_session_step(c, &s, 2);
    itest_session_finish(c, &s);
    itest_session_free(&s);
    itest_close(c);
}
END_TEST

START_TEST(test_context_full)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t p[] = {0, 1, 2, 3, 4, 5, 0};
    itest_session_t s;
    itest_session_init(&s, "cf", "tiny", p, 7);
    itest_session_start(c, &s);
    expect_err(c, "{\"op\":\"step\",\"id\":\"cf\",\"n\":2}", NULL, "context_full", NULL);
    expect_err(c, "{\"op\":\"step\",\"id\":\"cf\",\"n\":100}", NULL, "context_full", NULL);
    expect_unchanged(c, 7, 1, "context_full");
    itest_session_step(c, &s, 1); /* the last position there is room for */
    expect_err(c, "{\"op\":\"step\",\"id\":\"cf\"}", NULL, "context_full", NULL);
    expect_err(c, "{\"op\":\"step\",\"id\":\"cf\",\"tag\":\"z\"}", "\"z\"", "context_full", NULL);
    expect_unchanged(c, 8, 1, "context_full");
    itest_session_finish(c, &s);
    itest_session_free(&s);

    /* A prompt of max_ctx: not one step. */
    int64_t full[] = {5, 4, 3, 2, 1, 0, 1, 2};
    itest_session_init(&s, "cf", "tiny", full, 8);
    itest_session_start(c, &s);
    expect_err(c, "{\"op\":\"step\",\"id\":\"cf\"}", NULL, "context_full", NULL);
    itest_session_finish(c, &s);
    itest_session_free(&s);

    /* hash at 4096. */
    int64_t *hp = malloc(4000 * sizeof(int64_t));
    for (int i = 0; i < 4000; i++) {
        hp[i] = (i * 7) % 1000;
    }
    itest_session_t h;
    itest_session_init(&h, "hf", "hash", hp, 4000);
    itest_session_start(c, &h);
    expect_err(c, "{\"op\":\"step\",\"id\":\"hf\",\"n\":97}", NULL, "context_full", NULL);
    expect_unchanged(c, 4000, 1, "context_full");
    itest_session_step(c, &h, 95);
    itest_session_step(c, &h, 1);
    expect_err(c, "{\"op\":\"step\",\"id\":\"hf\"}", NULL, "context_full", NULL);
    itest_session_finish(c, &h);
    itest_session_free(&h);
    free(hp);
    itest_close(c);
}
END_TEST

START_TEST(test_cache_full_slots)
{
    /* The daemon's limit, not a connection's share of it. */
    itest_daemon_t *d =
        itest_daemon_start("--max-sessions", "2", "--max-connection-share", "1", NULL);
    itest_conn_t *c = itest_connect(d);
    itest_conn_t *c2 = itest_connect(d);
    int64_t p[] = {1, 2};
    itest_session_t a, b;
    itest_session_init(&a, "a", "tiny", p, 2);
    itest_session_init(&b, "b", "hash", p, 2);
    itest_session_start(c, &a);
    itest_session_start(c2, &b);
    cJSON *st = itest_stats(c);
    bool pool_full = itest_int(st, "pool_slots_used") == itest_int(st, "pool_slots_total");
    cJSON_Delete(st);

    expect_err(c, "{\"op\":\"start\",\"id\":\"c\",\"prompt\":[1]}", NULL, "cache_full", NULL);
    expect_err(c2, "{\"tag\":\"q\",\"op\":\"start\",\"id\":\"c\",\"prompt\":[1]}", "\"q\"",
               "cache_full", NULL);
    /* A cached generate borrows a slot from the same pool (when the pool
     * itself is out of slots it cannot); uncached needs none. */
    if (pool_full) {
        expect_err(c, "{\"op\":\"generate\",\"tokens\":[1],\"steps\":2,\"use_cache\":true}", NULL,
                   "cache_full", NULL);
    }
    cJSON *r = itest_rpc(c, "{\"op\":\"generate\",\"tokens\":[1],\"steps\":2}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    /* Precedence: session state before capacity, fields before both. */
    expect_err(c, "{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1]}", NULL, "duplicate_id", "a");
    expect_err(c, "{\"op\":\"start\",\"id\":\"c\",\"prompt\":[]}", NULL, "bad_request", "prompt");
    expect_err(c, "{\"op\":\"start\",\"id\":\"c\",\"prompt\":[0,1,2,3,4,5,0,1,2]}", NULL,
               "too_long", "length");
    expect_err(c, "{\"op\":\"generate\",\"tokens\":[1],\"steps\":9,\"use_cache\":true}", NULL,
               "too_long", "length");
    expect_unchanged(c, 4, 2, "cache_full");
    itest_session_step(c, &a, 2);
    itest_session_step(c2, &b, 2);

    /* Room again once one finishes. */
    itest_session_finish(c2, &b);
    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"c\",\"prompt\":[1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    expect_err(c2, "{\"op\":\"start\",\"id\":\"b\",\"prompt\":[1]}", NULL, "cache_full", NULL);
    itest_session_step(c, &a, 1);
    itest_session_free(&a);
    itest_session_free(&b);
    itest_close(c);
    itest_close(c2);
}
END_TEST

/* Starts hash sessions "<prefix><i>" with `prompt` (JSON text), one at a
 * time, until the first cache_full, at most `max`.  Returns how many
 * started. */
static int fill(itest_conn_t *c, const char *prefix, const char *prompt, int max)
{
    for (int i = 0; i < max; i++) {
        cJSON *r =
            itest_rpc(c, "{\"op\":\"start\",\"id\":\"%s%d\",\"model\":\"hash\",\"prompt\":%s}",
                      prefix, i, prompt);
        bool full = itest_error_code(r) != NULL;
        if (full) {
            itest_expect_error(r, NULL, "cache_full", NULL);
        }
        cJSON_Delete(r);
        if (full) {
            /* Full it stays: nothing was released. */
            r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"%sx\",\"model\":\"hash\",\"prompt\":%s}",
                          prefix, prompt);
            itest_expect_error(r, NULL, "cache_full", NULL);
            cJSON_Delete(r);
            return i;
        }
    }
    ck_abort_msg("no cache_full after %d sessions of %s...", max, prefix);
    return max;
}

START_TEST(test_cache_full_bytes)
{
    /* A 1 MiB pool of hash sessions: starts fail with cache_full once the
     * bytes run out (not the slot count), change nothing, and succeed again
     * after a finish; a step that needs new blocks fails the same way. */
    itest_daemon_t *d = itest_daemon_start("--cache-mb", "1", "--max-sessions", "4096", NULL);
    itest_conn_t *c = itest_connect(d);
    const model_t *m = itest_model("hash");
    int64_t sp[] = {3};
    itest_session_t s;
    itest_session_init(&s, "s", "hash", sp, 1);
    itest_session_start(c, &s);

    cJSON *st = itest_stats(c);
    int64_t total = itest_int(st, "pool_bytes_total");
    cJSON_Delete(st);
    ck_assert_int_gt(total, 0);
    ck_assert_msg(total <= 2 * 1024 * 1024, "--cache-mb 1 gave a pool of %lld bytes",
                  (long long)total);

    int64_t *big = malloc(4000 * sizeof(int64_t));
    for (int i = 0; i < 4000; i++) {
        big[i] = (i * 31) % 1000;
    }
    char *bigp = itest_json_tokens(big, 4000);
    int nbig = fill(c, "big", bigp, (int)(total / (4000 * 8)) + 4);
    ck_assert_int_ge(nbig, 1);
    int64_t entries = 1 + 4000 * (int64_t)nbig;
    expect_unchanged(c, entries, 1 + nbig, "cache_full on start");
    int nsmall = fill(c, "small", "[1]", 4000);
    entries += nsmall;
    int live = 1 + nbig + nsmall;
    expect_unchanged(c, entries, live, "cache_full on start");
    st = itest_stats(c);
    ck_assert_int_lt(itest_int(st, "pool_slots_used"), 4096);
    cJSON_Delete(st);

    /* The pool is full to the last small session.  A step that needs new
     * blocks cannot have them. */
    if (model_block_positions(m) < 4096) {
        expect_err(c, "{\"op\":\"step\",\"id\":\"s\",\"n\":4095}", NULL, "cache_full", NULL);
        expect_unchanged(c, entries, live, "cache_full on step");
    }

    /* A finish makes room: start and step work again, and s is as it was. */
    cJSON *r = itest_rpc(c, "{\"op\":\"finish\",\"id\":\"big0\"}");
    itest_expect_ok(r);
    ck_assert_int_eq(itest_int(r, "released"), 4000);
    cJSON_Delete(r);
    itest_session_step(c, &s, 1);
    itest_session_step(c, &s, 100);
    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"again\",\"model\":\"hash\",\"prompt\":[1,2,3]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    itest_session_free(&s);
    free(bigp);
    free(big);
    itest_close(c);

    /* Closing the connection returns everything. */
    itest_conn_t *c2 = itest_connect(d);
    int64_t left = -1;
    for (int i = 0; i < 300 && left != 0; i++) {
        left = itest_stat(c2, "pool_bytes_used");
        if (left != 0) {
            itest_sleep_ms(10);
        }
    }
    ck_assert_int_eq(left, 0);
    itest_close(c2);
}
END_TEST

START_TEST(test_hash_only_daemon)
{
    /* A daemon serving the hash model alone starts and serves it; the
     * stateless ops, which need an attn model, are bad_request naming
     * model. */
    itest_daemon_t *d = itest_daemon_start("--models", "hash", "--default-model", "hash", NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t p[] = {7, 8, 9};
    itest_session_t s;
    itest_session_init(&s, "h", "hash", p, 3);
    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"h\",\"prompt\":[7,8,9]}");
    itest_expect_ok(r);
    ck_assert_str_eq(itest_str(r, "model"), "hash");
    cJSON_Delete(r);
    itest_session_step(c, &s, 5);
    expect_err(c, "{\"op\":\"start\",\"id\":\"t\",\"model\":\"tiny\",\"prompt\":[1]}", NULL,
               "bad_request", "model");
    expect_err(c, "{\"op\":\"logits\",\"tokens\":[1]}", NULL, "bad_request", "model");
    expect_err(c, "{\"op\":\"generate\",\"tokens\":[1],\"steps\":1}", NULL, "bad_request", "model");
    itest_session_finish(c, &s);
    itest_session_free(&s);
    itest_close(c);
}
END_TEST

START_TEST(test_precedence)
{
    /* framing, JSON, op, fields, session state, capacity. */
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t p[] = {1, 2};
    itest_session_t live, full;
    itest_session_init(&live, "live", "tiny", p, 2);
    int64_t fp[] = {0, 1, 2, 3, 4, 5, 0, 1};
    itest_session_init(&full, "full", "tiny", fp, 8);
    itest_session_start(c, &live);
    itest_session_start(c, &full);

    /* JSON before op. */
    expect_err(c, "{\"op\":\"nope\",", NULL, "bad_json", NULL);
    expect_err(c, "[{\"op\":\"nope\"}]", NULL, "bad_json", NULL);
    /* op before fields (an invalid tag included). */
    expect_err(c, "{\"op\":\"nope\",\"id\":5,\"prompt\":\"x\",\"n\":0}", NULL, "unknown_op", "op");
    expect_err(c, "{\"op\":\"nope\",\"tag\":true}", NULL, "unknown_op", "op");
    expect_err(c, "{\"id\":5,\"n\":-1,\"tag\":[]}", NULL, "unknown_op", "op");
    expect_err(c, "{\"op\":7,\"id\":\"live\"}", NULL, "unknown_op", "op");
    /* fields before session state. */
    expect_err(c, "{\"op\":\"step\",\"id\":\"ghost\",\"n\":0}", NULL, "bad_request", "n");
    expect_err(c, "{\"op\":\"step\",\"id\":\"ghost\",\"tag\":1.5}", NULL, "bad_request", "tag");
    expect_err(c, "{\"op\":\"start\",\"id\":\"live\",\"prompt\":[]}", NULL, "bad_request",
               "prompt");
    expect_err(c, "{\"op\":\"start\",\"id\":\"live\",\"prompt\":[6]}", NULL, "bad_request",
               "prompt");
    expect_err(c, "{\"op\":\"start\",\"id\":\"live\",\"prompt\":[1],\"model\":\"nosuch\"}", NULL,
               "bad_request", "model");
    expect_err(c, "{\"op\":\"finish\",\"id\":\"live\",\"tag\":1.5}", NULL, "bad_request", "tag");
    expect_err(c, "{\"op\":\"step\",\"id\":\"full\",\"n\":0}", NULL, "bad_request", "n");
    expect_err(c, "{\"op\":\"step\",\"id\":\"full\",\"tag\":{}}", NULL, "bad_request", "tag");
    expect_err(c, "{\"op\":\"finish\",\"id\":\"ghost\",\"tag\":null}", NULL, "bad_request", "tag");
    /* session state before capacity. */
    expect_err(c, "{\"op\":\"step\",\"id\":\"ghost\",\"n\":100}", NULL, "unknown_id", "ghost");
    expect_unchanged(c, 10, 2, "precedence");
    /* The finish with a bad tag did not finish. */
    itest_session_step(c, &live, 1);
    itest_session_finish(c, &live);
    itest_session_finish(c, &full);
    itest_session_free(&live);
    itest_session_free(&full);
    itest_close(c);
}
END_TEST

START_TEST(test_errors_leave_sessions)
{
    /* Sessions of both models, mid-way; a storm of every error, pipelined
     * between their steps; their results still equal the reference. */
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t tp[] = {4, 2}, hp[] = {100, 200, 300};
    itest_session_t t, h;
    itest_session_init(&t, "t", "tiny", tp, 2);
    itest_session_init(&h, "h", "hash", hp, 3);
    itest_session_start(c, &t);
    itest_session_start(c, &h);
    itest_session_step(c, &t, 1);
    itest_session_step(c, &h, 5);
    const char *storm[] = {
        "{\"op\":\"step\",\"id\":\"t\",\"n\":0}",
        "{\"op\":\"step\",\"id\":\"t\",\"n\":6}",
        "{\"op\":\"start\",\"id\":\"t\",\"prompt\":[1]}",
        "{\"op\":\"start\",\"id\":\"h\",\"model\":\"hash\",\"prompt\":[1]}",
        "{\"op\":\"finish\",\"id\":\"t\",\"tag\":true}",
        "{\"op\":\"finish\",\"id\":\"h\",\"tag\":1.5}",
        "{\"op\":\"step\",\"id\":\"h\",\"n\":\"2\"}",
        "{\"op\":\"step\",\"id\":\"h\",\"n\":4089}",
        "{\"op\":\"step\",\"id\":\"t \"}",
        "{\"op\":\"step\",\"id\":\"T\"}",
        "{\"op\":\"nope\",\"id\":\"t\"}",
        "{\"op\":\"step\",\"id\":\"t\"",
        "{\"op\":\"logits\",\"tokens\":[9]}",
        "{\"op\":\"generate\",\"tokens\":[1],\"steps\":8}",
    };
    size_t n = sizeof(storm) / sizeof(storm[0]);
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < n; i++) {
            ck_assert(itest_sendf(c, "%s\n", storm[i]));
        }
        for (size_t i = 0; i < n; i++) {
            cJSON *r = itest_read_reply(c);
            ck_assert_msg(itest_error_code(r) != NULL, "%s got %s", storm[i], itest_last_line(c));
            cJSON_Delete(r);
        }
        expect_unchanged(c, 3 + 8, 2, "the error storm");
    }
    itest_session_step(c, &t, 3);
    itest_session_step(c, &h, 20);
    itest_session_finish(c, &t);
    itest_session_finish(c, &h);
    itest_session_free(&t);
    itest_session_free(&h);
    itest_close(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("integration_errors");
    ITEST_ADD(s, test_bad_request_every_field);
    ITEST_ADD(s, test_huge_integers);
    ITEST_ADD(s, test_unknown_op);
    ITEST_ADD(s, test_too_long);
    ITEST_ADD(s, test_unknown_id);
    ITEST_ADD(s, test_duplicate_id);
    ITEST_ADD(s, test_context_full);
    ITEST_ADD(s, test_cache_full_slots);
    ITEST_ADD(s, test_cache_full_bytes);
    ITEST_ADD(s, test_hash_only_daemon);
    ITEST_ADD(s, test_precedence);
    ITEST_ADD(s, test_errors_leave_sessions);
    return itest_main(s);
}
