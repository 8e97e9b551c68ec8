/*
 * test_integration_append.c: `append`, seen from a client of the real
 * daemon.
 *
 * A session that is started, then grown by appends and steps in any
 * order, must answer every step as the uncached reference does for its
 * whole sequence (prompt, picks and appended tokens, in order): token and
 * printed logits, on tiny, small and hash, one request at a time and
 * pipelined.  Every error (a bad `tokens`, an unknown id, context_full at
 * the worker and on the loop, cache_full) changes nothing: cache_entries
 * and pool_bytes_used stay, and the next step still follows the
 * reference.  context_full comes before cache_full for an append that
 * could fit neither.  With --audit-rate 1, steps after appends are audited
 * against the reference and none diverges.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "itest.h"

/* Turns of appends and steps of `model`, one request at a time, then the
 * same pattern pipelined (every line sent before any reply is read). */
static void turns(itest_conn_t *c, const char *model, size_t prompt, size_t add, uint32_t n,
                  int rounds)
{
    itest_seq_t *s = calloc(1, sizeof(*s));
    ck_assert_ptr_nonnull(s);
    itest_seq_start(c, s, "one", model, prompt);
    for (int k = 0; k < rounds; k++) {
        itest_seq_append(c, s, add + (size_t)k, 100 + (size_t)k * 50);
        itest_seq_step(c, s, n);
    }
    /* An append right after the start, and two appends in a row. */
    itest_seq_t *p = calloc(1, sizeof(*p));
    ck_assert_ptr_nonnull(p);
    itest_seq_start(c, p, "two", model, prompt);
    itest_seq_append(c, p, 1, 900);
    itest_seq_append(c, p, add, 901);
    itest_seq_step(c, p, 1);

    /* Pipelined: every line out first, then the replies in order. */
    itest_seq_t *q = calloc(1, sizeof(*q));
    ck_assert_ptr_nonnull(q);
    itest_seq_start(c, q, "three", model, prompt);
    int64_t(*toks)[4096] = calloc(8, sizeof(*toks));
    ck_assert_ptr_nonnull(toks);
    for (int k = 0; k < rounds; k++) {
        char *line = itest_seq_append_line(q, add + (size_t)k, 2000 + (size_t)k * 50, toks[k % 8]);
        ck_assert(itest_send_str(c, line));
        free(line);
        ck_assert(itest_sendf(c, "{\"op\":\"step\",\"id\":\"three\",\"n\":%u}\n", n));
    }
    for (int k = 0; k < rounds; k++) {
        cJSON *r = itest_read_reply(c);
        itest_seq_check_append(q, r, toks[k % 8], add + (size_t)k);
        cJSON_Delete(r);
        r = itest_read_reply(c);
        itest_seq_check_step(q, r, itest_last_line(c), n);
        cJSON_Delete(r);
    }
    cJSON *st = itest_stats(c);
    ck_assert_int_eq(itest_int(st, "cache_entries"), (int64_t)(s->len + p->len + q->len));
    cJSON_Delete(st);
    free(toks);
    free(s);
    free(p);
    free(q);
}

START_TEST(test_append_tiny)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    /* tiny holds 8: a prompt of 1, appends of 1 and 2, steps of 1. */
    turns(c, "tiny", 1, 1, 1, 2);
    itest_close(c);
}
END_TEST

START_TEST(test_append_small)
{
    itest_daemon_t *d = itest_daemon_start("--models", "small,tiny", NULL);
    itest_conn_t *c = itest_connect(d);
    /* Appends of 70 and more: past MODEL_BATCH_MAX, and across blocks. */
    turns(c, "small", 5, 70, 3, 4);
    itest_close(c);
}
END_TEST

START_TEST(test_append_hash)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    turns(c, "hash", 3, 20, 4, 5);
    itest_close(c);
}
END_TEST

/* The error changed nothing the stats show (pool_bytes_used: unless -1). */
static void expect_unchanged(itest_conn_t *c, int64_t entries, int64_t bytes)
{
    cJSON *st = itest_stats(c);
    ck_assert_int_eq(itest_int(st, "cache_entries"), entries);
    if (bytes >= 0)
        ck_assert_int_eq(itest_int(st, "pool_bytes_used"), bytes);
    cJSON_Delete(st);
}

START_TEST(test_append_errors)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    itest_seq_t *s = calloc(1, sizeof(*s));
    ck_assert_ptr_nonnull(s);
    cJSON *r;

    itest_seq_start(c, s, "a", "tiny", 3);
    int64_t bytes = itest_stat(c, "pool_bytes_used");
    static const char *const bad[] = {
        "{\"op\":\"append\",\"id\":\"a\"}",
        "{\"op\":\"append\",\"id\":\"a\",\"tokens\":[]}",
        "{\"op\":\"append\",\"id\":\"a\",\"tokens\":[6]}",
        "{\"op\":\"append\",\"id\":\"a\",\"tokens\":[0,-1]}",
        "{\"op\":\"append\",\"id\":\"a\",\"tokens\":[1.5]}",
        "{\"op\":\"append\",\"id\":\"a\",\"tokens\":[\"1\"]}",
        "{\"op\":\"append\",\"id\":\"a\",\"tokens\":null}",
        "{\"op\":\"append\",\"id\":\"a\",\"tokens\":7}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        r = itest_rpc(c, "%s", bad[i]);
        itest_expect_error(r, NULL, "bad_request", "tokens", NULL);
        cJSON_Delete(r);
        expect_unchanged(c, 3, bytes);
    }
    r = itest_rpc(c, "{\"op\":\"append\",\"tokens\":[1]}");
    itest_expect_error(r, NULL, "bad_request", "id", NULL);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"append\",\"id\":\"b\",\"tokens\":[1],\"tag\":7}");
    itest_expect_error(r, "7", "unknown_id", "b", NULL);
    cJSON_Delete(r);

    /* 3 + 6 passes max_ctx 8: context_full, found on the loop (idle). */
    r = itest_rpc(c, "{\"op\":\"append\",\"id\":\"a\",\"tokens\":[1,2,3,4,5,0]}");
    itest_expect_error(r, NULL, "context_full", "a", NULL);
    cJSON_Delete(r);
    expect_unchanged(c, 3, bytes);
    itest_seq_step(c, s, 1);
    /* Found by the worker: a step in flight before it, then 5 + 4 > 8. */
    ck_assert(itest_sendf(c, "{\"op\":\"step\",\"id\":\"a\"}\n"
                             "{\"op\":\"append\",\"id\":\"a\",\"tokens\":[1,2,3,4]}\n"));
    r = itest_read_reply(c);
    itest_seq_check_step(s, r, itest_last_line(c), 1);
    cJSON_Delete(r);
    r = itest_read_reply(c);
    itest_expect_error(r, NULL, "context_full", "a", NULL);
    cJSON_Delete(r);
    bytes = itest_stat(c, "pool_bytes_used");
    expect_unchanged(c, 5, bytes);
    /* Exactly max_ctx fits; one more does not. */
    itest_seq_append(c, s, 3, 40);
    r = itest_rpc(c, "{\"op\":\"append\",\"id\":\"a\",\"tokens\":[0]}");
    itest_expect_error(r, NULL, "context_full", NULL);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"a\"}");
    itest_expect_error(r, NULL, "context_full", NULL);
    cJSON_Delete(r);
    expect_unchanged(c, 8, -1);

    /* After finish, and behind a start that fails, the id is unknown. */
    r = itest_rpc(c, "{\"op\":\"finish\",\"id\":\"a\"}");
    itest_expect_ok(r);
    ck_assert_int_eq(itest_int(r, "released"), 8);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"append\",\"id\":\"a\",\"tokens\":[1]}");
    itest_expect_error(r, NULL, "unknown_id", "a", NULL);
    cJSON_Delete(r);
    expect_unchanged(c, 0, -1);
    free(s);
    itest_close(c);
}
END_TEST

/* A pool of 1 MiB: an append whose entries do not fit is cache_full and
 * changes nothing; one past max_ctx is context_full first. */
START_TEST(test_append_cache_full)
{
    static const char *const share[] = {"1", "0.5"};
    for (int k = 0; k < 2; k++) {
        itest_daemon_t *d =
            itest_daemon_start("--cache-mb", "1", "--models", "small", "--default-model", "small",
                               "--preload", "small", "--max-connection-share", share[k], NULL);
        itest_conn_t *c = itest_connect(d);
        itest_seq_t *s = calloc(1, sizeof(*s));
        ck_assert_ptr_nonnull(s);
        cJSON *r;
        int64_t toks[4096];

        itest_seq_start(c, s, "a", "small", 4);
        int64_t bytes = itest_stat(c, "pool_bytes_used");
        /* 1000 entries of small (4 KiB each) are four times the pool. */
        char *line = itest_seq_append_line(s, 1000, 10, toks);
        ck_assert(itest_send_str(c, line));
        free(line);
        r = itest_read_reply(c);
        itest_expect_error(r, NULL, "cache_full", NULL);
        cJSON_Delete(r);
        expect_unchanged(c, 4, bytes);
        /* 1021 more pass max_ctx 1024: context_full, not cache_full. */
        line = itest_seq_append_line(s, 1021, 10, toks);
        ck_assert(itest_send_str(c, line));
        free(line);
        r = itest_read_reply(c);
        itest_expect_error(r, NULL, "context_full", NULL);
        cJSON_Delete(r);
        expect_unchanged(c, 4, bytes);
        itest_seq_step(c, s, 2);
        itest_seq_append(c, s, 40, 77);
        itest_seq_step(c, s, 2);
        free(s);
        itest_close(c);
        itest_teardown();
    }
}
END_TEST

/* Every step after appends is audited against the reference of the whole
 * sequence (the appended tokens recorded with the picks): none diverges. */
START_TEST(test_append_audit)
{
    itest_daemon_t *d =
        itest_daemon_start("--audit-rate", "1", "--models", "small,tiny,hash", NULL);
    itest_conn_t *c = itest_connect(d);
    itest_seq_t *s = calloc(1, sizeof(*s));
    ck_assert_ptr_nonnull(s);
    static const char *const models[] = {"tiny", "small", "hash"};

    for (int m = 0; m < 3; m++) {
        itest_seq_start(c, s, models[m], models[m], 2);
        itest_seq_append(c, s, 1, 3);
        itest_seq_step(c, s, 1);
        itest_seq_append(c, s, 2, 5);
        itest_seq_step(c, s, 1);
    }
    ck_assert_int_eq(itest_metric(d, "slotd_cache_audits_total"), 6);
    ck_assert_int_eq(itest_metric(d, "slotd_cache_divergence_total"), 0);
    free(s);
    itest_close(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("integration_append");
    itest_add(s, "append_tiny", test_append_tiny);
    itest_add(s, "append_small", test_append_small);
    itest_add(s, "append_hash", test_append_hash);
    itest_add(s, "append_errors", test_append_errors);
    itest_add(s, "append_cache_full", test_append_cache_full);
    itest_add(s, "append_audit", test_append_audit);
    return itest_main(s);
}
