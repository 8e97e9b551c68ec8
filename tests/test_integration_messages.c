/*
 * test_integration_messages.c: which error a request gets when it is
 * wrong in more than one way, and what the message says, against the
 * live daemon.
 *
 * A step past max_ctx is context_full (session state) before any
 * cache_full (capacity), however large its n: read at once, pipelined
 * behind its session's start, on the default daemon and under a share
 * smaller than the step would need.  A cache_full says what the request
 * needed against what was free, in the bytes /stats counts, and whether a
 * retry can succeed; the figures are checked against /stats, and a
 * refusal said to be retryable succeeds once room is made.  Refusals are
 * counted by reason in slotd_refusals_total.  The messages of steps and
 * tag out of range, and of a logits too long, say what is wrong.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "itest.h"

/* Sends `line`, expects error `code`, and returns its message (owned by
 * the caller). */
static char *error_message(itest_conn_t *c, const char *line, const char *code)
{
    cJSON *r = itest_rpc(c, "%s", line);
    const char *got = itest_error_code(r);
    char *msg;

    ck_assert_msg(got != NULL && strcmp(got, code) == 0, "request %s: expected %s, got %s", line,
                  code, itest_last_line(c));
    msg = strdup(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "error"), "message")->valuestring);
    cJSON_Delete(r);
    return msg;
}

/* The number right after `before` in `msg`; fails if there is none. */
static int64_t number_after(const char *msg, const char *before)
{
    const char *p = strstr(msg, before);
    ck_assert_msg(p != NULL, "'%s' not in message: %s", before, msg);
    return strtoll(p + strlen(before), NULL, 10);
}

/* The pool bytes a slot of `name` holding `positions` entries takes: its
 * blocks and state, each at a 64-byte stride, as /stats counts them. */
static int64_t slot_bytes(const char *name, uint32_t positions)
{
    const model_t *m = itest_model(name);
    size_t chain = 0;
    model_chain_blocks(m, positions, 64, &chain);
    return (int64_t)chain + (int64_t)((model_state_size(m) + 63) & ~(size_t)63);
}

/* As error_message() without its message, but a mismatch is recorded and
 * the test goes on (itest_soft_fail()), so that one run names every case
 * that fails. */
static void soft_error(itest_conn_t *c, const char *line, const char *code)
{
    char why[800];
    cJSON *r = itest_rpc(c, "%s", line);
    if (!itest_error_is(r, NULL, code, why, sizeof(why), NULL))
        itest_soft_fail("request %s: %s", line, why);
    cJSON_Delete(r);
}

START_TEST(test_context_before_share)
{
    /* The default daemon: a connection's share is half the pool. */
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    cJSON *r;
    char *m;

    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"t\",\"prompt\":[1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    soft_error(c, "{\"op\":\"step\",\"id\":\"t\",\"n\":400000}", "context_full");
    soft_error(c, "{\"op\":\"step\",\"id\":\"t\",\"n\":600000}", "context_full");
    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"h\",\"model\":\"hash\",\"prompt\":[1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    soft_error(c, "{\"op\":\"step\",\"id\":\"h\",\"n\":20000000}", "context_full");
    itest_soft_verdict();
    m = error_message(c, "{\"op\":\"step\",\"id\":\"t\",\"n\":4294967295}", "context_full");
    ck_assert_msg(strstr(m, "4294967295 more entries would pass max_ctx 8 (session 't' holds 1)") != NULL, "%s", m);
    free(m);

    /* Pipelined behind the start of its session: decided once the start
     * has taken effect, context_full all the same. */
    ck_assert(itest_send_str(c, "{\"op\":\"start\",\"id\":\"p\",\"prompt\":[1,2]}\n"
                                "{\"op\":\"step\",\"id\":\"p\",\"n\":600000}\n"
                                "{\"op\":\"step\",\"id\":\"p\",\"n\":6}\n"
                                "{\"op\":\"step\",\"id\":\"p\",\"n\":1}\n"));
    r = itest_read_reply(c);
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_read_reply(c);
    itest_expect_error(r, NULL, "context_full", NULL);
    cJSON_Delete(r);
    r = itest_read_reply(c);
    itest_expect_ok(r);
    ck_assert_int_eq(itest_int(r, "entries"), 8);
    cJSON_Delete(r);
    r = itest_read_reply(c);
    itest_expect_error(r, NULL, "context_full", NULL);
    cJSON_Delete(r);
    /* Nothing was refused for room. */
    ck_assert_int_eq(itest_metric(d, "slotd_errors_total{code=\"cache_full\"}"), 0);
    ck_assert_int_eq(itest_metric(d, "slotd_errors_total{code=\"context_full\"}"), 6);
    itest_close(c);
}
END_TEST

START_TEST(test_context_before_small_share)
{
    /* A 1 MiB pool: a small session of 3 entries, n 1022 passes max_ctx
     * 1024 (context_full) and its share (512 KiB) too; n 1021 fits the
     * context but never the share. */
    itest_daemon_t *d = itest_daemon_start("--cache-mb", "1", NULL);
    itest_conn_t *c = itest_connect(d);
    cJSON *r =
        itest_rpc(c, "{\"op\":\"start\",\"id\":\"s\",\"model\":\"small\",\"prompt\":[1,2,3]}");
    char *m;

    itest_expect_ok(r);
    cJSON_Delete(r);
    m = error_message(c, "{\"op\":\"step\",\"id\":\"s\",\"n\":1022}", "context_full");
    ck_assert_msg(strstr(m, "1022 more entries would pass max_ctx 1024 (session 's' holds 3)") != NULL, "%s", m);
    free(m);
    m = error_message(c, "{\"op\":\"step\",\"id\":\"s\",\"n\":1021}", "cache_full");
    ck_assert_msg(strstr(m, "can never fit") != NULL, "%s", m);
    ck_assert_int_eq(number_after(m, "'s' needs "), slot_bytes("small", 1024));
    ck_assert_int_eq(number_after(m, "whole share of the pool, "), 524288);
    free(m);
    ck_assert_int_eq(itest_metric(d, "slotd_refusals_total{reason=\"share\"}"), 1);
    ck_assert_int_eq(itest_metric(d, "slotd_refusals_total{reason=\"pool\"}"), 0);
    itest_close(c);
}
END_TEST

START_TEST(test_share_message_figures)
{
    /* One connection fills its share (512 KiB of a 1 MiB pool) with
     * small sessions: the refusal's figures are /stats's, and the retry it
     * advises succeeds once a session is finished.  Every session has
     * the same prompt: the prefix cache, which would share their blocks
     * and so change the figures, is off. */
    itest_daemon_t *d = itest_daemon_start("--cache-mb", "1", "--prefix-cache", "off", NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t need = slot_bytes("small", 40), started = 0;
    char *m = NULL;

    for (int i = 0; i < 200 && m == NULL; i++) {
        cJSON *r = itest_rpc(c,
                             "{\"op\":\"start\",\"id\":\"s%d\",\"model\":\"small\",\"prompt\":"
                             "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,1,2,3,4,5,6,7,"
                             "8,9,10,11,12,13,14,15,16,17,18,19,20]}",
                             i);
        if (itest_error_code(r) != NULL) {
            itest_expect_error(r, NULL, "cache_full", NULL);
            m = strdup(
                cJSON_GetObjectItem(cJSON_GetObjectItem(r, "error"), "message")->valuestring);
        } else {
            started++;
        }
        cJSON_Delete(r);
    }
    ck_assert_ptr_nonnull(m);
    ck_assert_int_ge(started, 1);
    ck_assert_msg(strstr(m, "this connection's share of the pool is in use") != NULL &&
                      strstr(m, "retry") != NULL && strstr(m, "never") == NULL,
                  "%s", m);
    cJSON *st = itest_stats(c);
    int64_t used = itest_int(st, "pool_bytes_used");
    cJSON_Delete(st);
    ck_assert_int_eq(used, started * need);
    ck_assert_int_eq(number_after(m, "needs "), need);
    ck_assert_int_eq(number_after(m, " of its "), 524288);
    ck_assert_int_eq(number_after(m, "more bytes, "), 524288 - used);
    free(m);

    cJSON *r = itest_rpc(c, "{\"op\":\"finish\",\"id\":\"s0\"}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"again\",\"model\":\"small\",\"prompt\":"
                     "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,1,2,3,4,5,6,7,"
                     "8,9,10,11,12,13,14,15,16,17,18,19,20]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    ck_assert_int_eq(itest_stat(c, "pool_bytes_used"), used);

    /* Another connection has a share of its own. */
    itest_conn_t *c2 = itest_connect(d);
    r = itest_rpc(c2, "{\"op\":\"start\",\"id\":\"s0\",\"model\":\"small\",\"prompt\":[1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    ck_assert_int_eq(itest_metric(d, "slotd_refusals_total{reason=\"share\"}"), 1);
    ck_assert_int_eq(itest_metric(d, "slotd_refusals_total{reason=\"pool\"}"), 0);
    itest_close(c2);
    itest_close(c);
}
END_TEST

START_TEST(test_pool_message_figures)
{
    /* Without a share the pool refuses: its figures are /stats's; a
     * request bigger than the whole pool never fits; the session limit
     * is a refusal of its own.  The prefix cache, which would share the
     * sessions' equal prompts, is off. */
    itest_daemon_t *d = itest_daemon_start("--cache-mb", "1", "--max-connection-share", "1",
                                           "--max-sessions", "40", "--prefix-cache", "off", NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t need = slot_bytes("small", 64), started = 0;
    char *m = NULL;
    char prompt[512];
    size_t len = 0;

    len += (size_t)snprintf(prompt + len, sizeof(prompt) - len, "[0");
    for (int i = 1; i < 64; i++)
        len += (size_t)snprintf(prompt + len, sizeof(prompt) - len, ",%d", i % 20);
    snprintf(prompt + len, sizeof(prompt) - len, "]");
    for (int i = 0; i < 40 && m == NULL; i++) {
        cJSON *r = itest_rpc(
            c, "{\"op\":\"start\",\"id\":\"s%d\",\"model\":\"small\",\"prompt\":%s}", i, prompt);
        if (itest_error_code(r) != NULL) {
            itest_expect_error(r, NULL, "cache_full", NULL);
            m = strdup(
                cJSON_GetObjectItem(cJSON_GetObjectItem(r, "error"), "message")->valuestring);
        } else {
            started++;
        }
        cJSON_Delete(r);
    }
    ck_assert_ptr_nonnull(m);
    ck_assert_msg(strstr(m, "the pool's memory is full") != NULL && strstr(m, "retry") != NULL, "%s", m);
    cJSON *st = itest_stats(c);
    int64_t used = itest_int(st, "pool_bytes_used"), total = itest_int(st, "pool_bytes_total");
    cJSON_Delete(st);
    ck_assert_int_eq(used, started * need);
    ck_assert_int_eq(number_after(m, "needs "), need);
    ck_assert_int_eq(number_after(m, " of its "), total);
    ck_assert_int_eq(number_after(m, "more bytes, "), total - used);
    free(m);
    ck_assert_int_eq(itest_metric(d, "slotd_refusals_total{reason=\"pool\"}"), 1);

    /* Bigger than the whole pool: never. */
    m = error_message(c, "{\"op\":\"generate\",\"model\":\"small\",\"tokens\":[1],\"steps\":1000}",
                      "cache_full");
    ck_assert_msg(strstr(m, "can never fit") != NULL, "%s", m);
    ck_assert_int_eq(number_after(m, "needs "), slot_bytes("small", 1001));
    ck_assert_int_eq(number_after(m, "pool's whole memory, "), total);
    free(m);
    ck_assert_int_eq(itest_metric(d, "slotd_refusals_total{reason=\"pool\"}"), 2);

    /* The session limit. */
    for (int i = 0; i < 40; i++) {
        cJSON *r =
            itest_rpc(c, "{\"op\":\"start\",\"id\":\"h%d\",\"model\":\"hash\",\"prompt\":[1]}", i);
        bool refused = itest_error_code(r) != NULL;
        cJSON_Delete(r);
        if (refused)
            break;
    }
    m = error_message(c, "{\"op\":\"start\",\"id\":\"x\",\"model\":\"hash\",\"prompt\":[1]}",
                      "cache_full");
    ck_assert_msg(strstr(m, "--max-sessions") != NULL && strstr(m, "retry") != NULL, "%s", m);
    free(m);
    ck_assert_int_ge(itest_metric(d, "slotd_refusals_total{reason=\"slots\"}"), 1);
    ck_assert_int_eq(itest_metric(d, "slotd_refusals_total{reason=\"share\"}"), 0);
    itest_close(c);
}
END_TEST

START_TEST(test_field_messages)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    char *m;

    m = error_message(c, "{\"op\":\"generate\",\"tokens\":[1],\"steps\":99999999999999999999}",
                      "bad_request");
    ck_assert_msg(strstr(m, "`steps` must be an integer from 0 to 9007199254740992") != NULL, "%s",
                  m);
    free(m);
    m = error_message(c, "{\"op\":\"stats\",\"tag\":9007199254740993}", "bad_request");
    ck_assert_msg(strstr(m, "`tag` must be a string or an integer from -9007199254740992 to "
                            "9007199254740992") != NULL,
                  "%s", m);
    free(m);
    m = error_message(c, "{\"op\":\"logits\",\"tokens\":[1,2,3,4,5,0,1,2,3]}", "too_long");
    ck_assert_msg(strstr(m, "length: 9 tokens pass max_ctx 8") != NULL &&
                      strstr(m, "steps") == NULL,
                  "%s", m);
    free(m);
    m = error_message(c, "{\"op\":\"generate\",\"tokens\":[1,2,3,4,5,0,1,2,3],\"steps\":0}",
                      "too_long");
    ck_assert_msg(strstr(m, "9 tokens plus 0 steps pass max_ctx 8") != NULL, "%s", m);
    free(m);
    itest_close(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("integration_messages");
    ITEST_ADD(s, test_context_before_share);
    ITEST_ADD(s, test_context_before_small_share);
    ITEST_ADD(s, test_share_message_figures);
    ITEST_ADD(s, test_pool_message_figures);
    ITEST_ADD(s, test_field_messages);
    return itest_main(s);
}
