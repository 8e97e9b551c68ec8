/*
 * test_integration_decode.c: the decoding controls (`sample`, `stop`,
 * `scores`) through the real daemon.
 *
 * - Greedy equivalents: temperature 0, top_k 1, scores "all" and an empty
 *   sample's greedy cousins give replies byte for byte those of a request
 *   without the members, on step and generate.
 * - Batched against alone: sessions stepping sampled single steps
 *   together on a daemon that batches them (slotd_step_batches_total
 *   shows it did) give the tokens that the same sessions give one at a
 *   time, in one request of n steps each, on a daemon with one worker, no
 *   batches and the scalar kernels; and cached and uncached generate agree.
 * - Stop tokens end a step or a generate after the first one picked, keep
 *   it, and say so; the session goes on from there.
 * - Scores: none leaves the logits out; K gives the K best pairs of the
 *   full logits, score descending, ties by token ascending.
 * - Every bad value is bad_request naming its field and changes nothing:
 *   the session's next step is what it would have been.
 * - With --audit-rate 1, replies are those of a daemon without the audit:
 *   sampled steps are not "corrected" to the greedy reference.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "itest.h"

/* The reply line `line` with its "id" member's value replaced by "_", so
 * that replies of two sessions compare byte for byte. */
static char *without_id(const char *line)
{
    char *out = strdup(line), *p = strstr(out, "\"id\":\"");

    ck_assert_ptr_nonnull(out);
    if (p != NULL) {
        char *q = strchr(p + 6, '"');
        ck_assert_ptr_nonnull(q);
        memmove(p + 7, q, strlen(q) + 1);
        p[6] = '_';
    }
    return out;
}

/* Sends `line` on `c` and returns its reply line without its id. */
static char *reply_of(itest_conn_t *c, const char *line)
{
    cJSON *r = itest_rpc(c, "%s", line);
    char *out = without_id(itest_last_line(c));

    cJSON_Delete(r);
    return out;
}

static void start(itest_conn_t *c, const char *id, const char *model, const char *prompt)
{
    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"%s\",\"model\":\"%s\",\"prompt\":%s}", id,
                         model, prompt);
    itest_expect_ok(r);
    cJSON_Delete(r);
}

/* The tokens member of `r` as a string ("[1,2]"), malloc'd. */
static char *tokens_of(const cJSON *r)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(r, "tokens");

    ck_assert_msg(cJSON_IsArray(t), "no tokens in the reply");
    return cJSON_PrintUnformatted(t);
}

START_TEST(test_greedy_equivalents)
{
    itest_daemon_t *d = itest_daemon_start("--models", "tiny,small", "--threads", "2", NULL);
    itest_conn_t *c = itest_connect(d);
    static const char *const extras[] = {
        "",
        ",\"sample\":{\"temperature\":0}",
        ",\"sample\":{\"temperature\":0,\"top_p\":0.3,\"seed\":99}",
        ",\"sample\":{\"top_k\":1,\"temperature\":1.7,\"seed\":5}",
        ",\"sample\":{\"temperature\":0.0,\"top_k\":7}",
        ",\"scores\":\"all\"",
    };
    char *want = NULL, *want_gen = NULL;

    for (size_t i = 0; i < sizeof(extras) / sizeof(extras[0]); i++) {
        char id[16], line[256];
        char *got;

        snprintf(id, sizeof(id), "g%zu", i);
        start(c, id, "small", "[5,6,7]");
        snprintf(line, sizeof(line), "{\"op\":\"step\",\"id\":\"%s\",\"n\":5%s}", id, extras[i]);
        got = reply_of(c, line);
        if (want == NULL)
            want = got;
        else {
            ck_assert_msg(strcmp(got, want) == 0, "%s:\n%.300s\nnot\n%.300s", extras[i], got, want);
            free(got);
        }
        snprintf(line, sizeof(line),
                 "{\"op\":\"generate\",\"model\":\"tiny\",\"tokens\":[0,1,2],\"steps\":5%s}",
                 extras[i]);
        got = reply_of(c, line);
        if (want_gen == NULL)
            want_gen = got;
        else {
            ck_assert_msg(strcmp(got, want_gen) == 0, "%s:\n%.300s\nnot\n%.300s", extras[i], got,
                          want_gen);
            free(got);
        }
    }
    /* The seed's golden pick: generate([0,1,2], 5) is [0,1,2,4,0,0,0,0]. */
    ck_assert_ptr_nonnull(strstr(want_gen, "\"tokens\":[0,1,2,4,0,0,0,0]"));
    free(want);
    free(want_gen);
    itest_close(c);
}
END_TEST

#define NSESS 24
#define NSTEPS 6

/* Session i's sample: seeds across the 64-bit range (pairs of sessions
 * share a seed and a prompt), and settings that vary. */
static void sample_of(size_t i, char *out, size_t size)
{
    static const char *const cuts[] = {"", ",\"top_k\":40", ",\"top_p\":0.9",
                                       ",\"top_k\":5,\"top_p\":0.5"};
    static const double temps[] = {0.1, 0.7, 1.0, 2.0};

    snprintf(out, size, "\"sample\":{\"temperature\":%g,\"seed\":%llu%s}", temps[i % 4],
             (unsigned long long)((i / 2) * 0x9E3779B97F4A7C15ull), cuts[(i / 4) % 4]);
}

static void prompt_of(size_t i, char *out, size_t size)
{
    snprintf(out, size, "[%zu,%zu,%zu]", (i / 2) * 31 % 512, (i / 2) * 97 % 512, i % 3);
}

/* Every session's tokens on a batching daemon: NSTEPS rounds of single
 * steps, each round's lines for all sessions sent before any reply is
 * read. */
static void run_batched(itest_daemon_t *d, char *tokens[NSESS])
{
    itest_conn_t *conn[4];
    char line[256], smp[160], prompt[64];

    for (size_t k = 0; k < 4; k++)
        conn[k] = itest_connect(d);
    for (size_t i = 0; i < NSESS; i++) {
        char id[16];
        snprintf(id, sizeof(id), "s%zu", i);
        prompt_of(i, prompt, sizeof(prompt));
        start(conn[i % 4], id, "small", prompt);
        tokens[i] = calloc(1, 1024);
        ck_assert_ptr_nonnull(tokens[i]);
    }
    for (int step = 0; step < NSTEPS; step++) {
        for (size_t i = 0; i < NSESS; i++) {
            sample_of(i, smp, sizeof(smp));
            snprintf(line, sizeof(line),
                     "{\"op\":\"step\",\"id\":\"s%zu\",%s,\"scores\":\"none\"}\n", i, smp);
            ck_assert(itest_send_str(conn[i % 4], line));
        }
        for (size_t i = 0; i < NSESS; i++) {
            /* Replies come in order on each connection. */
            cJSON *r = itest_read_reply(conn[i % 4]);
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(r, "tokens");
            itest_expect_ok(r);
            ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(r, "logits"));
            ck_assert_int_eq(cJSON_GetArraySize(t), 1);
            snprintf(tokens[i] + strlen(tokens[i]), 16, "%s%d", step > 0 ? "," : "",
                     (int)cJSON_GetArrayItem(t, 0)->valuedouble);
            cJSON_Delete(r);
        }
    }
    for (size_t k = 0; k < 4; k++)
        itest_close(conn[k]);
}

START_TEST(test_batched_vs_alone)
{
    itest_daemon_t *d =
        itest_daemon_start("--models", "tiny,small", "--preload", "small", "--threads", "2",
                           "--max-batch", "64", "--batch-us", "0", NULL);
    char *batched[NSESS], line[256], smp[160], prompt[64];
    itest_daemon_t *alone;
    itest_conn_t *c;
    int64_t batches;

    run_batched(d, batched);
    batches = itest_metric(d, "slotd_step_batches_total");
    ck_assert_msg(batches > 0, "no batch ran");

    /* One worker, no batches, the scalar kernels, and n steps at once. */
    setenv("SLOTD_SIMD", "scalar", 1);
    alone =
        itest_daemon_start("--models", "tiny,small", "--threads", "1", "--max-batch", "1", NULL);
    unsetenv("SLOTD_SIMD");
    c = itest_connect(alone);
    for (size_t i = 0; i < NSESS; i++) {
        char id[16], want[1100];
        cJSON *r;
        char *t;

        snprintf(id, sizeof(id), "s%zu", i);
        prompt_of(i, prompt, sizeof(prompt));
        start(c, id, "small", prompt);
        sample_of(i, smp, sizeof(smp));
        snprintf(line, sizeof(line), "{\"op\":\"step\",\"id\":\"%s\",\"n\":%d,%s}", id, NSTEPS,
                 smp);
        r = itest_rpc(c, "%s", line);
        itest_expect_ok(r);
        t = tokens_of(r);
        snprintf(want, sizeof(want), "[%s]", batched[i]);
        ck_assert_msg(strcmp(t, want) == 0, "session %zu: batched %s, alone %s", i, want, t);
        free(t);
        cJSON_Delete(r);
        free(batched[i]);
    }
    /* Cached and uncached sampled generate give the same tokens. */
    {
        cJSON *a = itest_rpc(c, "{\"op\":\"generate\",\"model\":\"small\",\"tokens\":[3,4],"
                                "\"steps\":6,\"use_cache\":true,\"sample\":{\"seed\":12}}");
        char *ta = tokens_of(a);
        cJSON *b = itest_rpc(c, "{\"op\":\"generate\",\"model\":\"small\",\"tokens\":[3,4],"
                                "\"steps\":6,\"sample\":{\"seed\":12}}");
        char *tb = tokens_of(b);
        ck_assert_str_eq(ta, tb);
        free(ta);
        free(tb);
        cJSON_Delete(a);
        cJSON_Delete(b);
    }
    itest_close(c);
}
END_TEST

/* Long jobs run in slices (--batch-us 2: every position ends one) under
 * decoding controls: a sampled step of n with a stop list, and sampled
 * generates with a stop list and top scores, each giving the picks and
 * scores of single steps on another daemon (a single step never runs in
 * slices, and a draw depends on the seed and the position only). */
START_TEST(test_sliced_under_controls)
{
    static const char *const smp = "\"sample\":{\"temperature\":0.9,\"top_p\":0.95,\"seed\":31}";
    itest_daemon_t *sliced = itest_daemon_start("--models", "tiny,small", "--threads", "1",
                                                "--batch-us", "2", NULL);
    itest_daemon_t *whole = itest_daemon_start("--models", "tiny,small", "--threads", "1", NULL);
    itest_conn_t *a = itest_connect(sliced), *b = itest_connect(whole);
    char line[512];
    cJSON *r;
    int stop = -1;

    /* The step: 24 picks in slices against 24 single steps. */
    start(a, "x", "small", "[5,6,7]");
    start(b, "y", "small", "[5,6,7]");
    {
        char want[4096] = "", *got;
        size_t len = 0;

        for (int k = 0; k < 24; k++) {
            snprintf(line, sizeof(line), "{\"op\":\"step\",\"id\":\"y\",%s}", smp);
            r = itest_rpc(b, "%s", line);
            itest_expect_ok(r);
            len += (size_t)snprintf(
                want + len, sizeof(want) - len, "%s%d", k ? "," : "[",
                cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r, "tokens"), 0)->valueint);
            cJSON_Delete(r);
        }
        snprintf(want + len, sizeof(want) - len, "]");
        snprintf(line, sizeof(line), "{\"op\":\"step\",\"id\":\"x\",\"n\":24,%s}", smp);
        r = itest_rpc(a, "%s", line);
        itest_expect_ok(r);
        got = tokens_of(r);
        ck_assert_msg(strcmp(got, want) == 0, "sliced step: %s, single steps: %s", got, want);
        free(got);
        cJSON_Delete(r);
    }
    /* Then 40 more with a stop list: the single steps' 11th pick is the
     * stop token, so the sliced step must end at its first occurrence. */
    {
        int seq[40];
        char want[4096] = "", *got;
        size_t len = 0;

        for (int k = 0; k < 40; k++) {
            snprintf(line, sizeof(line), "{\"op\":\"step\",\"id\":\"y\",%s}", smp);
            r = itest_rpc(b, "%s", line);
            itest_expect_ok(r);
            seq[k] = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r, "tokens"), 0)->valueint;
            cJSON_Delete(r);
        }
        stop = seq[10];
        for (int k = 0; k < 40; k++) {
            len += (size_t)snprintf(want + len, sizeof(want) - len, "%s%d", k ? "," : "[", seq[k]);
            if (seq[k] == stop)
                break;
        }
        snprintf(want + len, sizeof(want) - len, "]");
        snprintf(line, sizeof(line),
                 "{\"op\":\"step\",\"id\":\"x\",\"n\":40,\"stop\":[%d],\"scores\":2,%s}", stop,
                 smp);
        r = itest_rpc(a, "%s", line);
        itest_expect_ok(r);
        got = tokens_of(r);
        ck_assert_msg(strcmp(got, want) == 0, "sliced step to stop %d: %s, single steps: %s", stop,
                      got, want);
        ck_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "stopped")));
        free(got);
        cJSON_Delete(r);
    }

    /* Generates, cached and uncached, with a stop list and top scores
     * (`tiny`'s max_ctx is 8), against single steps of a session started
     * with the same tokens: single steps never run in slices, and a
     * generate's picks are a session's (the same positions, the same
     * draws).  The first generate of each model times it, so that the
     * next ones are known to be long. */
    for (int m = 0; m < 2; m++) {
        snprintf(line, sizeof(line),
                 "{\"op\":\"generate\",\"model\":\"%s\",\"tokens\":[1,2,3],\"steps\":4}",
                 m ? "small" : "tiny");
        free(reply_of(a, line));
    }
    for (int cached = 0; cached < 2; cached++) {
        for (int m = 0; m < 2; m++) {
            const int steps = m ? 30 : 5, at = m ? stop : 4;
            cJSON *want = cJSON_CreateArray(), *gen;
            char *wj, *gj;
            int k;

            snprintf(line, sizeof(line), "g%d%d", cached, m);
            start(b, line, m ? "small" : "tiny", "[1,2,3]");
            for (k = 0; k < steps; k++) {
                snprintf(line, sizeof(line),
                         "{\"op\":\"step\",\"id\":\"g%d%d\",\"scores\":3,%s}", cached, m, smp);
                r = itest_rpc(b, "%s", line);
                itest_expect_ok(r);
                int t = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r, "tokens"), 0)->valueint;
                cJSON_AddItemToArray(want, cJSON_Duplicate(cJSON_GetArrayItem(
                                                   cJSON_GetObjectItemCaseSensitive(r, "top"), 0),
                                               true));
                cJSON_Delete(r);
                if (t == at)
                    break;
            }
            snprintf(line, sizeof(line),
                     "{\"op\":\"generate\",\"model\":\"%s\",\"tokens\":[1,2,3],\"steps\":%d,"
                     "\"use_cache\":%s,\"stop\":[%d],\"scores\":3,%s}",
                     m ? "small" : "tiny", steps, cached ? "true" : "false", at, smp);
            gen = itest_rpc(a, "%s", line);
            ck_assert_msg(cJSON_GetObjectItemCaseSensitive(gen, "error") == NULL,
                          "generate failed: %s", itest_last_line(a));
            wj = cJSON_PrintUnformatted(want);
            gj = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(gen, "top"));
            ck_assert_msg(strcmp(wj, gj) == 0, "%s generate%s: top %.300s\nsingle steps: %.300s",
                          m ? "small" : "tiny", cached ? " (cached)" : "", gj, wj);
            ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(gen, "tokens")),
                             3 + cJSON_GetArraySize(want));
            free(wj);
            free(gj);
            cJSON_Delete(want);
            cJSON_Delete(gen);
        }
    }
    itest_close(a);
    itest_close(b);
}
END_TEST

START_TEST(test_stop_tokens)
{
    itest_daemon_t *d = itest_daemon_start("--models", "tiny,small,hash", "--threads", "2", NULL);
    itest_conn_t *c = itest_connect(d);
    const cJSON *t;
    cJSON *r, *full;
    int64_t toks[20], stop_at = -1;
    char line[256];

    start(c, "ref", "small", "[9,8,7]");
    full = itest_rpc(c, "{\"op\":\"step\",\"id\":\"ref\",\"n\":20,\"scores\":\"none\"}");
    t = cJSON_GetObjectItemCaseSensitive(full, "tokens");
    ck_assert_int_eq(cJSON_GetArraySize(t), 20);
    for (int i = 0; i < 20; i++)
        toks[i] = (int64_t)cJSON_GetArrayItem(t, i)->valuedouble;
    /* The first token past the fourth pick not picked before it. */
    for (int i = 4; i < 20 && stop_at < 0; i++) {
        bool seen = false;
        for (int k = 0; k < i; k++)
            seen = seen || toks[k] == toks[i];
        if (!seen)
            stop_at = i;
    }
    ck_assert_msg(stop_at > 0, "no fresh token in the greedy run");

    start(c, "a", "small", "[9,8,7]");
    snprintf(line, sizeof(line),
             "{\"op\":\"step\",\"id\":\"a\",\"n\":20,\"stop\":[511,%lld],\"scores\":\"none\"}",
             (long long)toks[stop_at]);
    r = itest_rpc(c, "%s", line);
    itest_expect_ok(r);
    t = cJSON_GetObjectItemCaseSensitive(r, "tokens");
    ck_assert_int_eq(cJSON_GetArraySize(t), stop_at + 1);
    ck_assert_int_eq((int64_t)cJSON_GetArrayItem(t, (int)stop_at)->valuedouble, toks[stop_at]);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "stopped")));
    ck_assert_int_eq(itest_int(r, "entries"), 3 + stop_at + 1);
    cJSON_Delete(r);
    /* The session goes on from the stop token. */
    r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"a\",\"stop\":[]}");
    ck_assert_int_eq(
        (int64_t)cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r, "tokens"), 0)->valuedouble,
        toks[stop_at + 1]);
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(r, "stopped")));
    cJSON_Delete(r);
    cJSON_Delete(full);

    /* generate stops the same way; its rows count only what ran. */
    r = itest_rpc(c,
                  "{\"op\":\"generate\",\"model\":\"small\",\"tokens\":[9,8,7],\"steps\":20,"
                  "\"use_cache\":true,\"stop\":[%lld]}",
                  (long long)toks[stop_at]);
    t = cJSON_GetObjectItemCaseSensitive(r, "tokens");
    ck_assert_int_eq(cJSON_GetArraySize(t), 3 + stop_at + 1);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(r, "logits")),
                     stop_at + 1);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "stopped")));
    ck_assert_int_eq(itest_int(r, "rows"), 4 * (3 + stop_at));
    cJSON_Delete(r);

    /* hash: stop works (a stop list no pick meets runs the full length). */
    start(c, "h", "hash", "[1,2,3]");
    r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"h\",\"n\":3}");
    t = cJSON_GetObjectItemCaseSensitive(r, "tokens");
    snprintf(line, sizeof(line),
             "{\"op\":\"start\",\"id\":\"h2\",\"model\":\"hash\",\"prompt\":[1,2,3]}");
    cJSON_Delete(itest_rpc(c, "%s", line));
    {
        cJSON *s = itest_rpc(c, "{\"op\":\"step\",\"id\":\"h2\",\"n\":3,\"stop\":[%d]}",
                             (int)cJSON_GetArrayItem(t, 1)->valuedouble);
        ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(s, "tokens")), 2);
        ck_assert(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "stopped")));
        ck_assert_int_eq(itest_int(s, "entries"), 5);
        cJSON_Delete(s);
    }
    cJSON_Delete(r);
    itest_close(c);
}
END_TEST

START_TEST(test_scores)
{
    itest_daemon_t *d = itest_daemon_start("--models", "tiny,small", "--threads", "2", NULL);
    itest_conn_t *c = itest_connect(d);
    const char *sampled = ",\"sample\":{\"temperature\":1.2,\"seed\":3}";

    for (int smp = 0; smp < 2; smp++) {
        cJSON *all, *none, *top;
        const cJSON *lg, *tp;
        char *ta, *tn, *tt;

        start(c, "a", "small", "[1,2]");
        start(c, "b", "small", "[1,2]");
        start(c, "t", "small", "[1,2]");
        all = itest_rpc(c, "{\"op\":\"step\",\"id\":\"a\",\"n\":3%s}", smp ? sampled : "");
        none = itest_rpc(c, "{\"op\":\"step\",\"id\":\"b\",\"n\":3,\"scores\":\"none\"%s}",
                         smp ? sampled : "");
        ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(none, "logits"));
        ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(none, "top"));
        top = itest_rpc(c, "{\"op\":\"step\",\"id\":\"t\",\"n\":3,\"scores\":5%s}",
                        smp ? sampled : "");
        ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(top, "logits"));
        ta = tokens_of(all);
        tn = tokens_of(none);
        tt = tokens_of(top);
        ck_assert_str_eq(ta, tn);
        ck_assert_str_eq(ta, tt);
        ck_assert_int_eq(itest_int(none, "entries"), 5);
        lg = cJSON_GetObjectItemCaseSensitive(all, "logits");
        tp = cJSON_GetObjectItemCaseSensitive(top, "top");
        ck_assert_int_eq(cJSON_GetArraySize(tp), 3);
        for (int k = 0; k < 3; k++) {
            const cJSON *row = cJSON_GetArrayItem(lg, k), *pairs = cJSON_GetArrayItem(tp, k);
            double prev = INFINITY;
            int prev_tok = -1;
            ck_assert_int_eq(cJSON_GetArraySize(pairs), 5);
            for (int i = 0; i < 5; i++) {
                const cJSON *pair = cJSON_GetArrayItem(pairs, i);
                int tok = (int)cJSON_GetArrayItem(pair, 0)->valuedouble;
                double sc = cJSON_GetArrayItem(pair, 1)->valuedouble;
                int above = 0;
                ck_assert(sc == cJSON_GetArrayItem(row, tok)->valuedouble);
                ck_assert(sc < prev || (sc == prev && tok > prev_tok));
                /* Exactly i scores of the row come before it. */
                for (int v = 0; v < 512; v++) {
                    double x = cJSON_GetArrayItem(row, v)->valuedouble;
                    above += x > sc || (x == sc && v < tok);
                }
                ck_assert_int_eq(above, i);
                prev = sc;
                prev_tok = tok;
            }
        }
        free(ta);
        free(tn);
        free(tt);
        cJSON_Delete(all);
        cJSON_Delete(none);
        cJSON_Delete(top);
        cJSON_Delete(itest_rpc(c, "{\"op\":\"finish\",\"id\":\"a\"}"));
        cJSON_Delete(itest_rpc(c, "{\"op\":\"finish\",\"id\":\"b\"}"));
        cJSON_Delete(itest_rpc(c, "{\"op\":\"finish\",\"id\":\"t\"}"));
    }
    itest_close(c);
}
END_TEST

START_TEST(test_bad_values)
{
    itest_daemon_t *d = itest_daemon_start("--models", "tiny,small,hash", "--threads", "2", NULL);
    itest_conn_t *c = itest_connect(d);
    static const struct {
        const char *members, *field;
    } bad[] = {
        {"\"sample\":{\"temperature\":-0.5}", "sample"},
        {"\"sample\":{\"temperature\":\"1\"}", "sample"},
        {"\"sample\":{\"temperature\":null}", "sample"},
        {"\"sample\":{\"temperature\":1e999}", "sample"},
        {"\"sample\":{\"top_p\":0}", "sample"},
        {"\"sample\":{\"top_p\":1.0000001}", "sample"},
        {"\"sample\":{\"top_p\":-1}", "sample"},
        {"\"sample\":{\"top_k\":0}", "sample"},
        {"\"sample\":{\"top_k\":2.5}", "sample"},
        {"\"sample\":{\"seed\":18446744073709551616}", "sample"},
        {"\"sample\":{\"seed\":-1}", "sample"},
        {"\"sample\":{\"seed\":1.5}", "sample"},
        {"\"sample\":{\"seed\":\"7\"}", "sample"},
        {"\"sample\":[]", "sample"},
        {"\"sample\":null", "sample"},
        {"\"stop\":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]", "stop"},
        {"\"stop\":[512]", "stop"},
        {"\"stop\":[-1]", "stop"},
        {"\"stop\":[1.5]", "stop"},
        {"\"stop\":3", "stop"},
        {"\"stop\":null", "stop"},
        {"\"scores\":\"some\"", "scores"},
        {"\"scores\":0", "scores"},
        {"\"scores\":-3", "scores"},
        {"\"scores\":1.5", "scores"},
        {"\"scores\":true", "scores"},
        {"\"scores\":null", "scores"},
    };
    char *want;

    /* What the session's next step must be after every refused request. */
    start(c, "ref", "small", "[4,4,4]");
    want = reply_of(c, "{\"op\":\"step\",\"id\":\"ref\"}");
    start(c, "a", "small", "[4,4,4]");
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char why[512];
        cJSON *r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"a\",\"n\":2,%s}", bad[i].members);
        if (!itest_error_is(r, NULL, "bad_request", why, sizeof(why), bad[i].field, NULL))
            itest_soft_fail("step %s: %s", bad[i].members, why);
        cJSON_Delete(r);
        r = itest_rpc(c, "{\"op\":\"generate\",\"model\":\"small\",\"tokens\":[1],\"steps\":2,%s}",
                      bad[i].members);
        if (!itest_error_is(r, NULL, "bad_request", why, sizeof(why), bad[i].field, NULL))
            itest_soft_fail("generate %s: %s", bad[i].members, why);
        cJSON_Delete(r);
    }
    /* hash has no logits: no sample, no top K (but stop and none). */
    start(c, "h", "hash", "[1,2]");
    {
        char why[512];
        cJSON *r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"h\",\"sample\":{\"temperature\":0}}");
        if (!itest_error_is(r, NULL, "bad_request", why, sizeof(why), "sample", NULL))
            itest_soft_fail("hash sample: %s", why);
        cJSON_Delete(r);
        r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"h\",\"scores\":2}");
        if (!itest_error_is(r, NULL, "bad_request", why, sizeof(why), "scores", NULL))
            itest_soft_fail("hash scores: %s", why);
        cJSON_Delete(r);
        r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"h\",\"scores\":\"none\",\"stop\":[999]}");
        itest_expect_ok(r);
        ck_assert_int_eq(itest_int(r, "entries"), 3);
        cJSON_Delete(r);
    }
    itest_soft_verdict();
    {
        char *got = reply_of(c, "{\"op\":\"step\",\"id\":\"a\"}");
        ck_assert_msg(strcmp(got, want) == 0, "after the refusals:\n%s\nnot\n%s", got, want);
        free(got);
    }
    free(want);
    itest_close(c);
}
END_TEST

/* With every step audited, sampled steps are recorded but not held to the
 * greedy reference (no divergence, and their tokens stand), and greedy
 * steps under the controls are checked as usual. */
START_TEST(test_audited)
{
    itest_daemon_t *d =
        itest_daemon_start("--models", "tiny,small", "--threads", "2", "--audit-rate", "1", NULL);
    itest_daemon_t *plain = itest_daemon_start("--models", "tiny,small", "--threads", "2", NULL);
    static const char *const steps[] = {
        "{\"op\":\"step\",\"id\":\"a\",\"n\":4,\"sample\":{\"temperature\":1.5,\"seed\":8}}",
        "{\"op\":\"step\",\"id\":\"a\",\"n\":3,\"scores\":\"none\",\"stop\":[511]}",
        "{\"op\":\"step\",\"id\":\"a\",\"scores\":2,\"sample\":{\"temperature\":0.9,\"seed\":2}}",
        "{\"op\":\"step\",\"id\":\"a\",\"n\":2,\"scores\":3}",
    };
    itest_conn_t *c = itest_connect(d), *p = itest_connect(plain);

    start(c, "a", "small", "[3,1,4]");
    start(p, "a", "small", "[3,1,4]");
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        char *got = reply_of(c, steps[i]), *want = reply_of(p, steps[i]);
        ck_assert_msg(strcmp(got, want) == 0, "%s:\n%.300s\nnot\n%.300s", steps[i], got, want);
        free(got);
        free(want);
    }
    ck_assert_int_eq(itest_metric(d, "slotd_cache_divergence_total"), 0);
    ck_assert_int_ge(itest_metric(d, "slotd_cache_audits_total"), 2);
    itest_close(c);
    itest_close(p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("integration_decode");

    itest_add(s, "greedy_equivalents", test_greedy_equivalents);
    itest_add_timeout(s, "batched_vs_alone", test_batched_vs_alone, 240);
    itest_add(s, "stop_tokens", test_stop_tokens);
    itest_add_timeout(s, "sliced_under_controls", test_sliced_under_controls, 240);
    itest_add(s, "scores", test_scores);
    itest_add(s, "bad_values", test_bad_values);
    itest_add(s, "audited", test_audited);
    return itest_main(s);
}
