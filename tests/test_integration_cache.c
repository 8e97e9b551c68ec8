/*
 * test_integration_cache.c: the cache invariants, seen from the wire.
 *
 * A session's tokens and logits must be exactly what the uncached reference
 * (the library's model_generate with use_cache false) gives for its prompt,
 * whatever else happens around it: other sessions on the same connection,
 * another connection using the same id at the same time, a restart of a
 * finished id, hundreds of pipelined requests answered by several worker
 * threads.  The accounting must be exact too: a live session holds prompt
 * plus generated entries, cache_entries returns to 0 when sessions end, and
 * the model counters grow by exactly one g call (hash) or L rows (tiny) per
 * step and by the prompt length (times L) on start.  Pipelining changes
 * nothing of this: a pipelined stats request reports what the lines before
 * it left behind, exactly as if each line had waited for the previous reply.
 *
 * Memory follows use: after 50,000 live tiny sessions have come and gone,
 * the daemon's resident memory comes back within 25 % of its idle figure
 * plus 8 MiB (plain builds only: a sanitizer's or valgrind's own memory
 * says nothing of the daemon's).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "itest.h"

/* A deterministic generator for the test's choices. */
static uint64_t rng_next(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

START_TEST(test_reference_every_prompt)
{
    /* tiny: every prompt length, stepped to max_ctx in mixed n; hash: a
     * long run.  Each step is compared with the uncached reference. */
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    uint64_t seed = 42;
    for (int len = 1; len <= 7; len++) {
        for (int rep = 0; rep < 3; rep++) {
            int64_t p[8];
            for (int i = 0; i < len; i++) {
                p[i] = (int64_t)(rng_next(&seed) % 6);
            }
            char id[32];
            snprintf(id, sizeof(id), "t%d_%d", len, rep);
            itest_session_t s;
            itest_session_init(&s, id, "tiny", p, (size_t)len);
            itest_session_start(c, &s);
            while (itest_session_entries(&s) < 8) {
                uint32_t room = (uint32_t)(8 - itest_session_entries(&s));
                uint32_t n = 1 + (uint32_t)(rng_next(&seed) % room);
                itest_session_step(c, &s, n);
            }
            itest_session_finish(c, &s);
            itest_session_free(&s);
        }
    }
    int64_t hp[16];
    for (int i = 0; i < 16; i++) {
        hp[i] = (int64_t)(rng_next(&seed) % 1000);
    }
    itest_session_t h;
    itest_session_init(&h, "hash-long", "hash", hp, 16);
    itest_session_start(c, &h);
    for (int i = 0; i < 20; i++) {
        itest_session_step(c, &h, 1 + (uint32_t)(rng_next(&seed) % 40));
    }
    itest_session_finish(c, &h);
    itest_session_free(&h);
    ck_assert_int_eq(itest_stat(c, "cache_entries"), 0);
    itest_close(c);
}
END_TEST

START_TEST(test_isolation_one_connection)
{
    /* Four sessions, two per model, stepped in an interleaved order: each
     * sees only its own cache. */
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t p0[] = {0, 1, 2}, p1[] = {0, 1, 3}, p2[] = {7, 7}, p3[] = {7, 8};
    itest_session_t s[4];
    itest_session_init(&s[0], "a", "tiny", p0, 3);
    itest_session_init(&s[1], "b", "tiny", p1, 3);
    itest_session_init(&s[2], "c", "hash", p2, 2);
    itest_session_init(&s[3], "d", "hash", p3, 2);
    for (int i = 0; i < 4; i++) {
        itest_session_start(c, &s[i]);
    }
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < 4; i++) {
            itest_session_step(c, &s[(i + round) % 4], 1);
        }
    }
    cJSON *st = itest_stats(c);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 4);
    ck_assert_int_eq(itest_int(st, "cache_entries"), 8 + 8 + 7 + 7);
    cJSON_Delete(st);
    /* Finishing one leaves the others as they were. */
    itest_session_finish(c, &s[0]);
    itest_session_step(c, &s[2], 5);
    itest_session_step(c, &s[3], 5);
    for (int i = 1; i < 4; i++) {
        itest_session_finish(c, &s[i]);
    }
    for (int i = 0; i < 4; i++) {
        itest_session_free(&s[i]);
    }
    ck_assert_int_eq(itest_stat(c, "cache_entries"), 0);
    itest_close(c);
}
END_TEST

START_TEST(test_isolation_two_connections_same_id)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *a = itest_connect(d);
    itest_conn_t *b = itest_connect(d);
    int64_t pa[] = {1, 2}, pb[] = {4, 3};
    itest_session_t sa, sb;
    itest_session_init(&sa, "x", "tiny", pa, 2);
    itest_session_init(&sb, "x", "tiny", pb, 2);
    itest_session_start(a, &sa);
    itest_session_start(b, &sb); /* the same id on another connection is not a duplicate */
    for (int i = 0; i < 3; i++) {
        itest_session_step(a, &sa, 1);
        itest_session_step(b, &sb, 1);
    }

    /* hash sessions with one id on both connections, pipelined on both at
     * once so that the workers interleave them. */
    int64_t ha[] = {11, 12, 13}, hb[] = {11, 12, 14};
    itest_session_t xa, xb;
    itest_session_init(&xa, "y", "hash", ha, 3);
    itest_session_init(&xb, "y", "hash", hb, 3);
    itest_session_start(a, &xa);
    itest_session_start(b, &xb);
    const int K = 40;
    for (int i = 0; i < K; i++) {
        ck_assert(itest_send_str(a, "{\"op\":\"step\",\"id\":\"y\",\"n\":3}\n"));
        ck_assert(itest_send_str(b, "{\"op\":\"step\",\"id\":\"y\",\"n\":2}\n"));
    }
    for (int i = 0; i < K; i++) {
        cJSON *r = itest_read_reply(a);
        itest_session_check_step(&xa, r, itest_last_line(a), 3, NULL);
        cJSON_Delete(r);
        r = itest_read_reply(b);
        itest_session_check_step(&xb, r, itest_last_line(b), 2, NULL);
        cJSON_Delete(r);
    }

    /* b cannot finish a's session: finishing its own leaves a's alive, and
     * a second finish on b is unknown_id. */
    itest_session_finish(b, &sb);
    cJSON *r = itest_rpc(b, "{\"op\":\"finish\",\"id\":\"x\"}");
    itest_expect_error(r, NULL, "unknown_id", "x", NULL);
    cJSON_Delete(r);
    r = itest_rpc(b, "{\"op\":\"step\",\"id\":\"x\"}");
    itest_expect_error(r, NULL, "unknown_id", "x", NULL);
    cJSON_Delete(r);
    itest_session_step(a, &sa, 1);
    cJSON *st = itest_stats(b);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 3);
    ck_assert_int_eq(itest_int(st, "cache_entries"),
                     (int64_t)(itest_session_entries(&sa) + itest_session_entries(&xa) +
                               itest_session_entries(&xb)));
    cJSON_Delete(st);
    /* An id live only on a is unknown on b. */
    r = itest_rpc(b, "{\"op\":\"start\",\"id\":\"only_a\",\"prompt\":[1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_rpc(a, "{\"op\":\"step\",\"id\":\"only_a\"}");
    itest_expect_error(r, NULL, "unknown_id", "only_a", NULL);
    cJSON_Delete(r);
    r = itest_rpc(a, "{\"op\":\"finish\",\"id\":\"only_a\"}");
    itest_expect_error(r, NULL, "unknown_id", "only_a", NULL);
    cJSON_Delete(r);

    itest_session_finish(a, &sa);
    itest_session_finish(a, &xa);
    itest_session_finish(b, &xb);
    r = itest_rpc(b, "{\"op\":\"finish\",\"id\":\"only_a\"}");
    itest_expect_ok(r);
    ck_assert_int_eq(itest_int(r, "released"), 1);
    cJSON_Delete(r);
    ck_assert_int_eq(itest_stat(a, "cache_entries"), 0);
    itest_session_free(&sa);
    itest_session_free(&sb);
    itest_session_free(&xa);
    itest_session_free(&xb);
    itest_close(a);
    itest_close(b);
}
END_TEST

START_TEST(test_restart_after_finish)
{
    /* A finished id starts clean: the new prompt's reference, and the old
     * entries are gone from the accounting. */
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    /* The same id four times: again under tiny, under another model, and
     * once more with the very first prompt (same as the first time). */
    static const int64_t p1[] = {1, 2, 3}, p2[] = {5, 4}, p3[] = {999, 0, 500};
    static const struct {
        const char *model;
        const int64_t *prompt;
        size_t n;
        uint32_t steps[2]; /* 0: no more steps */
    } runs[] = {
        {"tiny", p1, 3, {3, 0}},
        {"tiny", p2, 2, {1, 5}},
        {"hash", p3, 3, {10, 0}},
        {"tiny", p1, 3, {5, 0}},
    };
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        itest_session_t s;
        itest_session_init(&s, "r", runs[i].model, runs[i].prompt, runs[i].n);
        itest_session_start(c, &s);
        ck_assert_int_eq(itest_stat(c, "cache_entries"), (int64_t)itest_session_entries(&s));
        for (size_t k = 0; k < 2 && runs[i].steps[k] != 0; k++)
            itest_session_step(c, &s, runs[i].steps[k]);
        itest_session_finish(c, &s);
        itest_session_free(&s);
    }
    cJSON *st = itest_stats(c);
    ck_assert_int_eq(itest_int(st, "cache_entries"), 0);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 0);
    ck_assert_int_eq(itest_int(st, "released.finish"), 4);
    cJSON_Delete(st);
    itest_close(c);
}
END_TEST

START_TEST(test_entries_accounting)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    itest_conn_t *c2 = itest_connect(d);
    int64_t p[] = {1, 2, 3, 4, 5};
    itest_session_t a, b, h;
    itest_session_init(&a, "a", "tiny", p, 5);
    itest_session_init(&b, "b", "tiny", p, 1);
    itest_session_init(&h, "h", "hash", p, 4);
    itest_session_start(c, &a);
    ck_assert_int_eq(itest_stat(c, "cache_entries"), 5);
    itest_session_start(c, &b);
    itest_session_start(c2, &h);
    ck_assert_int_eq(itest_stat(c2, "cache_entries"), 10);
    itest_session_step(c, &a, 2);
    itest_session_step(c2, &h, 30);
    cJSON *st = itest_stats(c);
    ck_assert_int_eq(itest_int(st, "cache_entries"), 7 + 1 + 34);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 3);
    ck_assert_int_eq(itest_int(st, "pool_slots_used"), 3);
    ck_assert_int_gt(itest_int(st, "pool_bytes_used"), 0);
    cJSON_Delete(st);

    /* Stateless ops hold nothing once answered. */
    cJSON *r =
        itest_rpc(c, "{\"op\":\"generate\",\"tokens\":[1,2],\"steps\":4,\"use_cache\":true}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"logits\",\"tokens\":[1,2,3]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    ck_assert_int_eq(itest_stat(c, "cache_entries"), 42);

    itest_session_finish(c, &a);
    ck_assert_int_eq(itest_stat(c, "cache_entries"), 35);
    itest_session_finish(c, &b);
    itest_session_finish(c2, &h);
    st = itest_stats(c);
    ck_assert_int_eq(itest_int(st, "cache_entries"), 0);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 0);
    ck_assert_int_eq(itest_int(st, "pool_slots_used"), 0);
    ck_assert_int_eq(itest_int(st, "pool_bytes_used"), 0);
    ck_assert_int_eq(itest_int(st, "released.finish"), 3);
    cJSON_Delete(st);
    itest_session_free(&a);
    itest_session_free(&b);
    itest_session_free(&h);
    itest_close(c);
    itest_close(c2);
}
END_TEST

/* Stats figures before and after, for counter deltas. */
static void counters(itest_conn_t *c, int64_t *g, int64_t *rows)
{
    cJSON *st = itest_stats(c);
    *g = itest_int(st, "g_calls");
    *rows = itest_int(st, "rows");
    cJSON_Delete(st);
}

#define EXPECT_DELTA(what, dg, drows)                                                              \
    do {                                                                                           \
        int64_t g1_, r1_;                                                                          \
        counters(c, &g1_, &r1_);                                                                   \
        ck_assert_msg(g1_ - g0 == (dg) && r1_ - r0 == (drows),                                     \
                      "%s: g_calls +%lld rows +%lld, expected +%lld and +%lld", what,              \
                      (long long)(g1_ - g0), (long long)(r1_ - r0), (long long)(dg),               \
                      (long long)(drows));                                                         \
        g0 = g1_;                                                                                  \
        r0 = r1_;                                                                                  \
    } while (0)

START_TEST(test_counters_exact)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t g0, r0;
    counters(c, &g0, &r0);
    cJSON *r;

    /* hash: the prompt length on start, one g per step. */
    int64_t hp[] = {1, 2, 3, 4, 5, 6, 7};
    itest_session_t h;
    itest_session_init(&h, "h", "hash", hp, 7);
    itest_session_start(c, &h);
    EXPECT_DELTA("hash start of 7", 7, 0);
    itest_session_step(c, &h, 1);
    EXPECT_DELTA("hash step", 1, 0);
    itest_session_step(c, &h, 25);
    EXPECT_DELTA("hash step n=25", 25, 0);

    /* tiny: L = 2 rows per position. */
    int64_t tp[] = {0, 1, 2};
    itest_session_t t;
    itest_session_init(&t, "t", "tiny", tp, 3);
    itest_session_start(c, &t);
    EXPECT_DELTA("tiny start of 3", 0, 6);
    itest_session_step(c, &t, 1);
    EXPECT_DELTA("tiny step", 0, 2);
    itest_session_step(c, &t, 3);
    EXPECT_DELTA("tiny step n=3", 0, 6);

    /* Stateless ops count what their reply says; errors run nothing. */
    static const struct {
        const char *req;
        const char *code; /* NULL: an ok reply */
        const char *word; /* a word the error message names, or NULL */
        int64_t rows;
    } ops[] = {
        {"{\"op\":\"logits\",\"tokens\":[1,2,3,4]}", NULL, NULL, 8},
        {"{\"op\":\"generate\",\"tokens\":[0,1,2],\"steps\":5,\"use_cache\":true}", NULL, NULL, 14},
        {"{\"op\":\"generate\",\"tokens\":[0,1,2],\"steps\":5}", NULL, NULL, 50},
        {"{\"op\":\"generate\",\"tokens\":[0,1,2],\"steps\":0,\"use_cache\":true}", NULL, NULL, 0},
        {"{\"op\":\"step\",\"id\":\"t\",\"n\":2}", "context_full", NULL, 0},
        {"{\"op\":\"start\",\"id\":\"t\",\"prompt\":[1]}", "duplicate_id", "t", 0},
        {"{\"op\":\"generate\",\"tokens\":[0,1,2],\"steps\":6}", "too_long", "length", 0},
        {"{\"op\":\"start\",\"id\":\"bad\",\"prompt\":[1,6]}", "bad_request", "prompt", 0},
    };
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        r = itest_rpc(c, "%s", ops[i].req);
        if (ops[i].code == NULL)
            itest_expect_ok(r);
        else
            itest_expect_error(r, NULL, ops[i].code, ops[i].word, NULL);
        cJSON_Delete(r);
        EXPECT_DELTA(ops[i].req, 0, ops[i].rows);
    }
    itest_session_finish(c, &t);
    itest_session_finish(c, &h);
    EXPECT_DELTA("finish", 0, 0);

    itest_session_free(&h);
    itest_session_free(&t);
    itest_close(c);
}
END_TEST

/* ---- Pipelines ---- */

enum expect_kind {
    EX_START,
    EX_STEP,
    EX_FINISH,
    EX_STATS,
    EX_DUPLICATE,
    EX_UNKNOWN_ID,
    EX_UNKNOWN_OP,
    EX_BAD_JSON,
    EX_BAD_REQUEST,
    EX_CONTEXT_FULL,
};

/* What one request line must get back. */
typedef struct expect {
    enum expect_kind kind;
    char tag[24]; /* JSON text, "" for none */
    int session;
    uint32_t n;        /* step */
    int64_t prompt[9]; /* start */
    size_t nprompt;
    int64_t entries; /* finish: released; stats: cache_entries */
    int64_t live;    /* stats: live sessions */
} expect_t;

#define NSESS 6

typedef struct pipeline {
    char *out; /* the request lines */
    size_t len, cap;
    expect_t *ex;
    int nex;
    int errors;        /* error replies expected */
    int64_t hash_work; /* g calls the successful requests make */
    int64_t tiny_rows; /* rows they make */
} pipeline_t;

static void emit(pipeline_t *pl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void emit(pipeline_t *pl, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    ck_assert_int_lt(n, (int)sizeof(line) - 1);
    if (pl->len + (size_t)n + 2 > pl->cap) {
        pl->cap = (pl->cap + (size_t)n + 2) * 2;
        pl->out = realloc(pl->out, pl->cap);
        ck_assert_ptr_nonnull(pl->out);
    }
    memcpy(pl->out + pl->len, line, (size_t)n);
    pl->len += (size_t)n;
    pl->out[pl->len++] = '\n';
}

static const char *session_model(int k)
{
    return k < 3 ? "hash" : "tiny";
}

/* Builds `count` request lines over sessions p0..p5 (three hash, three
 * tiny) with the reply each must get, simulating the sessions. */
static void build_pipeline(pipeline_t *pl, int count, uint64_t seed, const char *tag_prefix)
{
    bool live[NSESS] = {false};
    size_t entries[NSESS] = {0};
    memset(pl, 0, sizeof(*pl));
    pl->ex = calloc((size_t)count, sizeof(expect_t));
    ck_assert_ptr_nonnull(pl->ex);
    for (int i = 0; i < count; i++) {
        expect_t *e = &pl->ex[pl->nex++];
        if (i % 2 == 0) {
            snprintf(e->tag, sizeof(e->tag), "%d", i);
        } else {
            snprintf(e->tag, sizeof(e->tag), "\"%s%d\"", tag_prefix, i);
        }
        uint64_t r = rng_next(&seed) % 100;
        if (r < 8) {
            e->kind = EX_STATS;
            for (int k = 0; k < NSESS; k++) {
                e->live += live[k];
                e->entries += live[k] ? (int64_t)entries[k] : 0;
            }
            emit(pl, "{\"op\":\"stats\",\"tag\":%s}", e->tag);
            continue;
        }
        if (r < 20) {
            pl->errors++;
            if (r < 11) {
                e->kind = EX_BAD_JSON;
                e->tag[0] = '\0';
                emit(pl, "{\"op\":\"step\",\"tag\":%d,", i);
            } else if (r < 14) {
                e->kind = EX_UNKNOWN_OP;
                emit(pl, "{\"op\":\"fly\",\"tag\":%s}", e->tag);
            } else if (r < 17) {
                e->kind = EX_UNKNOWN_ID;
                emit(pl, "{\"op\":\"step\",\"id\":\"ghost\",\"tag\":%s}", e->tag);
            } else {
                e->kind = EX_BAD_REQUEST;
                emit(pl, "{\"op\":\"step\",\"id\":\"p0\",\"n\":0,\"tag\":%s}", e->tag);
            }
            continue;
        }
        int k = (int)(rng_next(&seed) % NSESS);
        bool tiny = k >= 3;
        e->session = k;
        if (!live[k]) {
            e->kind = EX_START;
            e->nprompt = 1 + rng_next(&seed) % (tiny ? 4 : 9);
            for (size_t j = 0; j < e->nprompt; j++) {
                e->prompt[j] = (int64_t)(rng_next(&seed) % (tiny ? 6 : 1000));
            }
            char *arr = itest_json_tokens(e->prompt, e->nprompt);
            emit(pl, "{\"op\":\"start\",\"id\":\"p%d\",\"model\":\"%s\",\"prompt\":%s,\"tag\":%s}",
                 k, session_model(k), arr, e->tag);
            free(arr);
            live[k] = true;
            entries[k] = e->nprompt;
            if (tiny) {
                pl->tiny_rows += 2 * (int64_t)e->nprompt;
            } else {
                pl->hash_work += (int64_t)e->nprompt;
            }
            continue;
        }
        uint64_t what = rng_next(&seed) % 100;
        if (what < 5) {
            e->kind = EX_DUPLICATE;
            pl->errors++;
            emit(pl, "{\"op\":\"start\",\"id\":\"p%d\",\"prompt\":[1],\"tag\":%s}", k, e->tag);
        } else if (what < 15 || (tiny && entries[k] == 8 && what < 60)) {
            e->kind = EX_FINISH;
            e->entries = (int64_t)entries[k];
            live[k] = false;
            emit(pl, "{\"op\":\"finish\",\"id\":\"p%d\",\"tag\":%s}", k, e->tag);
        } else if (tiny && entries[k] == 8) {
            e->kind = EX_CONTEXT_FULL;
            pl->errors++;
            emit(pl, "{\"op\":\"step\",\"id\":\"p%d\",\"tag\":%s}", k, e->tag);
        } else {
            uint32_t room = tiny ? (uint32_t)(8 - entries[k]) : 3;
            uint32_t n = 1 + (uint32_t)(rng_next(&seed) % (room < 3 ? room : 3));
            e->kind = EX_STEP;
            e->n = n;
            if (n == 1 && what % 2 == 0) {
                emit(pl, "{\"op\":\"step\",\"id\":\"p%d\",\"tag\":%s}", k, e->tag);
            } else {
                emit(pl, "{\"tag\":%s,\"op\":\"step\",\"id\":\"p%d\",\"n\":%u}", e->tag, k, n);
            }
            entries[k] += n;
            if (tiny) {
                pl->tiny_rows += 2 * (int64_t)n;
            } else {
                pl->hash_work += n;
            }
        }
    }
}

static void free_pipeline(pipeline_t *pl)
{
    free(pl->out);
    free(pl->ex);
}

/* Reads the pipeline's replies one by one, in order, checking each (steps
 * against the uncached reference).  `cur` gets the sessions as they stand at
 * the end.  Stats figures are checked only if `track_stats` (they are
 * global: another connection running at once changes them). */
static void check_pipeline(itest_conn_t *c, const pipeline_t *pl, bool track_stats,
                           itest_session_t *cur)
{
    for (int k = 0; k < NSESS; k++) {
        char id[8];
        snprintf(id, sizeof(id), "p%d", k);
        itest_session_init(&cur[k], id, session_model(k), NULL, 0);
    }
    for (int i = 0; i < pl->nex; i++) {
        const expect_t *e = &pl->ex[i];
        const char *tag = e->tag[0] != '\0' ? e->tag : NULL;
        cJSON *r = itest_read_reply(c);
        const char *line = itest_last_line(c);
        itest_session_t *s = &cur[e->session];
        switch (e->kind) {
        case EX_START:
            itest_session_free(s);
            itest_session_init(s, s->id, session_model(e->session), e->prompt, e->nprompt);
            itest_expect_ok(r);
            itest_expect_tag(r, tag);
            ck_assert_str_eq(itest_str(r, "id"), s->id);
            ck_assert_str_eq(itest_str(r, "model"), s->model);
            ck_assert_msg(itest_int(r, "entries") == (int64_t)e->nprompt, "line %d: %s", i, line);
            break;
        case EX_STEP:
            itest_session_check_step(s, r, line, e->n, tag);
            break;
        case EX_FINISH:
            itest_expect_ok(r);
            itest_expect_tag(r, tag);
            ck_assert_str_eq(itest_str(r, "id"), s->id);
            ck_assert_msg(itest_int(r, "released") == e->entries, "line %d: %s, expected %lld", i,
                          line, (long long)e->entries);
            break;
        case EX_STATS:
            itest_check_stats_shape(r);
            itest_expect_tag(r, tag);
            /* A stats request sees what every earlier line left behind and
             * nothing of a later one (collected, so that the rest of the
             * pipeline is still checked). */
            if (track_stats && (itest_int(r, "cache_entries") != e->entries ||
                                itest_int(r, "live_sessions") != e->live)) {
                itest_soft_fail("line %d stats: %s; the lines before it leave cache_entries "
                                "%lld in %lld live sessions",
                                i, line, (long long)e->entries, (long long)e->live);
            }
            break;
        case EX_BAD_JSON:
            itest_expect_error(r, NULL, "bad_json", NULL);
            break;
        case EX_UNKNOWN_OP:
            itest_expect_error(r, tag, "unknown_op", "op", NULL);
            break;
        case EX_UNKNOWN_ID:
            itest_expect_error(r, tag, "unknown_id", "ghost", NULL);
            break;
        case EX_BAD_REQUEST:
            itest_expect_error(r, tag, "bad_request", "n", NULL);
            break;
        case EX_DUPLICATE:
            itest_expect_error(r, tag, "duplicate_id", s->id, NULL);
            break;
        case EX_CONTEXT_FULL:
            itest_expect_error(r, tag, "context_full", NULL);
            break;
        }
        cJSON_Delete(r);
    }
    ck_assert_msg(itest_expect_silence(c, 200), "more replies than request lines");
}

/* Finishes whichever of the sessions are still live. */
static void finish_live(itest_conn_t *c, itest_session_t *cur, const pipeline_t *pl)
{
    bool live[NSESS] = {false};
    for (int i = 0; i < pl->nex; i++) {
        if (pl->ex[i].kind == EX_START) {
            live[pl->ex[i].session] = true;
        } else if (pl->ex[i].kind == EX_FINISH) {
            live[pl->ex[i].session] = false;
        }
    }
    for (int k = 0; k < NSESS; k++) {
        if (live[k]) {
            itest_session_finish(c, &cur[k]);
        }
        itest_session_free(&cur[k]);
    }
}

START_TEST(test_pipeline_600)
{
    /* 600 mixed lines in one write on one connection: exactly one reply per
     * line, in order (the tags), each one right.  The work counts below are
     * those of every prompt computed: the prefix cache, which would reuse
     * some of the repeated prompts' entries, is off. */
    itest_daemon_t *d = itest_daemon_start("--threads", "4", "--prefix-cache", "off", NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t g0, r0;
    counters(c, &g0, &r0);
    int64_t err0 = itest_stat(c, "errors_total");

    pipeline_t pl;
    build_pipeline(&pl, 600, 7, "s");
    ck_assert(itest_send(c, pl.out, pl.len));
    itest_session_t cur[NSESS];
    check_pipeline(c, &pl, true, cur);
    finish_live(c, cur, &pl);

    cJSON *st = itest_stats(c);
    ck_assert_int_eq(itest_int(st, "cache_entries"), 0);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 0);
    ck_assert_int_eq(itest_int(st, "errors_total") - err0, pl.errors);
    ck_assert_msg(itest_int(st, "g_calls") - g0 == pl.hash_work,
                  "g_calls grew by %lld over the pipeline; its hash prompts and steps are %lld",
                  (long long)(itest_int(st, "g_calls") - g0), (long long)pl.hash_work);
    ck_assert_msg(itest_int(st, "rows") - r0 == pl.tiny_rows,
                  "rows grew by %lld over the pipeline; its tiny prompts and steps need %lld",
                  (long long)(itest_int(st, "rows") - r0), (long long)pl.tiny_rows);
    cJSON_Delete(st);
    free_pipeline(&pl);
    itest_close(c);
    itest_soft_verdict();
}
END_TEST

START_TEST(test_pipeline_two_connections)
{
    /* Two connections, the same ids, 300 lines each, both written before
     * either is read: the worker threads interleave them, and each
     * connection still gets its own results in its own order. */
    itest_daemon_t *d = itest_daemon_start("--threads", "4", NULL);
    itest_conn_t *a = itest_connect(d);
    itest_conn_t *b = itest_connect(d);
    pipeline_t pa, pb;
    build_pipeline(&pa, 300, 11, "a");
    build_pipeline(&pb, 300, 12, "b");
    size_t half_a = pa.len / 2, half_b = pb.len / 2;
    ck_assert(itest_send(a, pa.out, half_a));
    ck_assert(itest_send(b, pb.out, half_b));
    ck_assert(itest_send(a, pa.out + half_a, pa.len - half_a));
    ck_assert(itest_send(b, pb.out + half_b, pb.len - half_b));
    itest_session_t ca[NSESS], cb[NSESS];
    check_pipeline(a, &pa, false, ca);
    check_pipeline(b, &pb, false, cb);
    finish_live(a, ca, &pa);
    finish_live(b, cb, &pb);
    cJSON *st = itest_stats(a);
    ck_assert_int_eq(itest_int(st, "cache_entries"), 0);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 0);
    cJSON_Delete(st);
    free_pipeline(&pa);
    free_pipeline(&pb);
    itest_close(a);
    itest_close(b);
}
END_TEST

START_TEST(test_stats_sees_request_order)
{
    /* A pipelined stats sees every earlier line's effect and nothing of a
     * later one: here a slow step runs ahead of it and an independent start
     * and finish come after it. */
    itest_daemon_t *d = itest_daemon_start("--models", "tiny,hash,small", "--threads", "2", NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t g0, r0;
    counters(c, &g0, &r0);
    ck_assert(
        itest_send_str(c, "{\"op\":\"start\",\"id\":\"a\",\"model\":\"small\",\"prompt\":[1]}\n"
                          "{\"op\":\"step\",\"id\":\"a\",\"n\":600}\n"
                          "{\"op\":\"stats\",\"tag\":\"mid\"}\n"
                          "{\"op\":\"start\",\"id\":\"b\",\"model\":\"hash\",\"prompt\":[1,2,3]}\n"
                          "{\"op\":\"finish\",\"id\":\"b\"}\n"));
    for (int i = 0; i < 5; i++) {
        cJSON *r = itest_read_reply(c);
        if (i == 2) {
            itest_expect_tag(r, "\"mid\"");
            itest_check_stats_shape(r);
            ck_assert_msg(itest_int(r, "live_sessions") == 1 &&
                              itest_int(r, "cache_entries") == 601 &&
                              itest_int(r, "g_calls") == g0 && itest_int(r, "released.finish") == 0,
                          "stats after start a + step a n=600, before start b and finish b: %s "
                          "(expected live_sessions 1, cache_entries 601, g_calls %lld, "
                          "released.finish 0)",
                          itest_last_line(c), (long long)g0);
        } else {
            itest_expect_ok(r);
        }
        cJSON_Delete(r);
    }
    itest_close(c);
}
END_TEST

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif

/* The part "unwrapped": resident memory means nothing under a sanitizer's
 * or valgrind's allocator. */
START_TEST(test_memory_given_back)
{
    /* Without the prefix cache, which keeps the blocks of finished
     * sessions' prompts (as free room, given up when needed). */
    enum { CONNS = 50, PER = 1000 };
    itest_daemon_t *d = itest_daemon_start("--prefix-cache", "off", NULL);
    itest_conn_t *c[CONNS];
    int64_t idle = itest_daemon_rss_kib(d);
    ck_assert_int_gt(idle, 0);

    static char lines[PER * 64];
    for (int k = 0; k < CONNS; k++) {
        size_t len = 0;
        for (int i = 0; i < PER; i++)
            len += (size_t)snprintf(lines + len, sizeof(lines) - len,
                                    "{\"op\":\"start\",\"id\":\"s%d\",\"prompt\":[1,2,3]}\n", i);
        c[k] = itest_connect(d);
        ck_assert(itest_send(c[k], lines, len));
    }
    for (int k = 0; k < CONNS; k++)
        for (int i = 0; i < PER; i++) {
            char *line = itest_read_line(c[k], ITEST_REPLY_MS, NULL);
            ck_assert_msg(line != NULL && strstr(line, "\"entries\":3") != NULL,
                          "start %d on connection %d: %s", i, k, line ? line : "no reply");
            free(line);
        }
    int64_t peak = itest_daemon_rss_kib(d);
    cJSON *st = itest_stats(c[0]);
    ck_assert_int_eq(itest_int(st, "live_sessions"), CONNS * PER);
    cJSON_Delete(st);
    for (int k = 0; k < CONNS; k++)
        itest_close(c[k]);

    /* The sessions did cost memory, so that its return means something. */
    ck_assert_msg(peak > idle + 32 * 1024, "idle %lld KiB, with the sessions only %lld KiB",
                  (long long)idle, (long long)peak);
    int64_t bound = idle + idle / 4 + 8 * 1024, now = peak;
    int64_t deadline = itest_now_ms() + itest_scale_ms(30000);
    while ((now = itest_daemon_rss_kib(d)) > bound && itest_now_ms() < deadline)
        itest_sleep_ms(100);
    fprintf(stderr,
            "test_memory_given_back: RSS idle %lld KiB, 50,000 sessions %lld KiB, after "
            "%lld KiB (bound %lld KiB)\n",
            (long long)idle, (long long)peak, (long long)now, (long long)bound);
    ck_assert_msg(now <= bound, "RSS %lld KiB 30 s after the sessions ended; idle %lld KiB",
                  (long long)now, (long long)idle);
}
END_TEST

int main(int argc, char **argv)
{
    if (itest_is_part(argc, argv, "unwrapped")) {
#ifdef SANITIZED
        return itest_skip("a sanitizer build: its allocator keeps what slotd gives back");
#endif
        if (itest_wrapped())
            return itest_skip("under SLOTD_WRAPPER (valgrind): its allocator keeps what slotd gives back");
    }
    Suite *s = suite_create("integration_cache");

    if (itest_is_part(argc, argv, "unwrapped")) {
        ITEST_ADD_TIMEOUT(s, test_memory_given_back, 120);
        return itest_main(s);
    }
    ITEST_ADD(s, test_reference_every_prompt);
    ITEST_ADD(s, test_isolation_one_connection);
    ITEST_ADD(s, test_isolation_two_connections_same_id);
    ITEST_ADD(s, test_restart_after_finish);
    ITEST_ADD(s, test_entries_accounting);
    ITEST_ADD(s, test_counters_exact);
    ITEST_ADD(s, test_stats_sees_request_order);
    ITEST_ADD(s, test_pipeline_600);
    ITEST_ADD(s, test_pipeline_two_connections);
    return itest_main(s);
}
