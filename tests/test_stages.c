/*
 * test_stages.c: the stale-cache stages, the engine's error paths, and the
 * session calls of cache/session.
 *
 * The five stages are written against stage_engine.h, each its own test
 * case, each run on the "hash" and the "tiny" model:
 *   stage1  a cached request equals the uncached reference, token for token
 *           and logit for logit, bit for bit;
 *   stage2  interleaved requests never see each other's entries;
 *   stage3  a start after a finish starts clean;
 *   stage4  memory is bounded: finished requests hold nothing, a live one
 *           holds exactly its prompt and its picks;
 *   stage5  one model call per step, and one per prompt token.
 * The reference is model_generate(..., use_cache = false) on a heap chain
 * of a model object of the test's own, so nothing the engine does can
 * change it.
 *
 * Every assertion that states a stage's property starts its message with
 * the stage's tag ("[stage1] ...").  A check inside a stage that states
 * another property carries that one's tag: stage 3's first request, on a
 * fresh engine, is a stage-1 check, and stage 5's picks are
 * "[stage5:picks]".  Assertions that only prepare the ground (an engine
 * call that must succeed, a premise about the model) start with "setup:"
 * or "premise:".  `--expect-fail N` relies on that: it runs stage N alone
 * on a chosen engine and exits 0 only if Check reports every run of it as
 * an assertion failure (CK_FAILURE, not an error, a crash or a timeout)
 * whose message carries stage N's tag, i.e. the engine was caught for the
 * reason the stage is about.
 *
 * Usage: test_stages [--engine real|vuln|recompute] [--stage N]...
 *                    [--expect-fail N]
 * With no option: every test case on the real engine.  Built with
 * STAGES_DAEMON (test_stages_evict) it also has `--engine daemon`, the real
 * daemon under --on-full evict (engine_daemon.c), where stage 4 reads an
 * evicted request as holding nothing, as docs/protocol.md says.
 */
#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/session.h"
#include "core/model.h"
#include "stage_engine.h"
#ifdef STAGES_DAEMON
#include "itest.h"
#endif

#define NSTAGES 5
#define MAX_REFS 16

static const char *const stage_models[] = {"hash", "tiny"};
#define NMODELS ((int)(sizeof(stage_models) / sizeof(stage_models[0])))

static const stage_engine_ops_t *const engines[] = {
    &stage_engine_real,
    &stage_engine_vuln,
    &stage_engine_recompute,
#ifdef STAGES_DAEMON
    &stage_engine_daemon,
#endif
};

/* The engine under test, chosen on the command line before any test runs. */
static const stage_engine_ops_t *engine = &stage_engine_real;

/* One test's world, torn down by teardown() whatever the test's outcome. */
static void *eng;           /* the engine instance */
static model_t *ref_model;  /* the reference's own model object */
static const char *preset;  /* the model's name, for messages */
static double *step_logits; /* V doubles: the logits of one step */
static struct ref *refs[MAX_REFS];
static int nrefs;

/* ---- The reference ---- */

/** An uncached run: the prompt followed by `steps` picks, and for attn the
 * V logits behind each pick. */
typedef struct ref {
    size_t n;
    uint32_t steps;
    uint32_t *tokens; /* n + steps */
    double *logits;   /* steps * V (attn), NULL (hash) */
} ref_t;

static bool is_attn(void)
{
    return model_family(ref_model) == MODEL_FAMILY_ATTN;
}

static const ref_t *ref_make(const int64_t *prompt, size_t n, uint32_t steps)
{
    uint32_t vocab = model_vocab(ref_model);
    uint64_t rows = 0, work = 0;
    slotd_error_t err = {0};
    model_kv_t kv;
    ref_t *r;
    int rc;

    ck_assert_msg(nrefs < MAX_REFS, "setup: too many references");
    r = calloc(1, sizeof(*r));
    ck_assert_msg(r != NULL, "setup: out of memory");
    refs[nrefs++] = r;
    r->n = n;
    r->steps = steps;
    r->tokens = calloc(n + steps, sizeof(*r->tokens));
    ck_assert_msg(r->tokens != NULL, "setup: out of memory");
    if (is_attn()) {
        r->logits = calloc((size_t)steps * vocab + 1, sizeof(*r->logits));
        ck_assert_msg(r->logits != NULL, "setup: out of memory");
    }
    rc = model_kv_heap_alloc(ref_model, (uint32_t)(n + steps), &kv);
    ck_assert_msg(rc == SLOTD_OK, "setup: heap chain: %s", slotd_err_name(rc));
    rc = model_generate(ref_model, prompt, n, steps, false, &kv, NULL, r->tokens, r->logits, &rows,
                        &err);
    model_kv_heap_free(&kv);
    ck_assert_msg(rc == SLOTD_OK, "setup: uncached reference: %s", err.message);
    for (uint32_t k = 0; k < steps; k++) {
        work += n + k;
    }
    ck_assert_msg(rows == model_layers(ref_model) * work,
                  "premise: the reference is not uncached (%" PRIu64 " rows, %" PRIu64 " expected)",
                  rows, model_layers(ref_model) * work);
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg(r->tokens[i] == (uint32_t)prompt[i],
                      "premise: the reference lost its prompt");
    }
    return r;
}

/* ---- Fixture ---- */

static void teardown(void)
{
    if (eng != NULL) {
        engine->close(eng);
        eng = NULL;
    }
    for (int i = 0; i < nrefs; i++) {
        free(refs[i]->tokens);
        free(refs[i]->logits);
        free(refs[i]);
    }
    nrefs = 0;
    free(step_logits);
    step_logits = NULL;
    model_destroy(ref_model);
    ref_model = NULL;
}

/* Opens the engine and the reference model for stage_models[i]. */
static void open_engine(int i, const stage_limits_t *lim)
{
    int rc;

    preset = stage_models[i];
    rc = model_create(preset, &ref_model);
    ck_assert_msg(rc == SLOTD_OK, "setup: model_create(%s): %s", preset, slotd_err_name(rc));
    step_logits = calloc(model_vocab(ref_model), sizeof(*step_logits));
    ck_assert_msg(step_logits != NULL, "setup: out of memory");
    rc = engine->open(preset, lim, &eng);
    ck_assert_msg(rc == SLOTD_OK, "setup: engine %s on %s: %s", engine->name, preset,
                  slotd_err_name(rc));
}

/* ---- Engine calls ---- */

static void start_ok(const char *id, const int64_t *prompt, size_t n)
{
    slotd_error_t err = {0};
    int rc = engine->start(eng, id, prompt, n, &err);

    ck_assert_msg(rc == SLOTD_OK, "setup: %s: start '%s' (%zu tokens): %s: %s", preset, id, n,
                  slotd_err_name(rc), err.message);
}

static void finish_ok(const char *id, uint32_t *released)
{
    slotd_error_t err = {0};
    int rc = engine->finish(eng, id, released, &err);

    ck_assert_msg(rc == SLOTD_OK, "setup: %s: finish '%s': %s: %s", preset, id, slotd_err_name(rc),
                  err.message);
}

/* One step of `id`, which must succeed; returns the pick, logits in
 * step_logits. */
static uint32_t step_ok(const char *id)
{
    slotd_error_t err = {0};
    uint32_t token = UINT32_MAX;
    int rc = engine->step(eng, id, &token, step_logits, &err);

    ck_assert_msg(rc == SLOTD_OK, "setup: %s: step '%s': %s: %s", preset, id, slotd_err_name(rc),
                  err.message);
    return token;
}

/* Asserts, under `tag`, that pick k (0-based) of `id` equals the
 * reference's, and for attn that its logits are bit for bit the same. */
static void expect_pick(const char *tag, const char *id, const ref_t *r, uint32_t k, uint32_t token)
{
    uint32_t vocab = model_vocab(ref_model);
    const double *want;

    ck_assert_msg(k < r->steps, "setup: step %u past the reference", k + 1);
    ck_assert_msg(token == r->tokens[r->n + k],
                  "%s %s: '%s' step %u picked %u, the uncached reference picks %u", tag, preset, id,
                  k + 1, token, r->tokens[r->n + k]);
    if (!is_attn()) {
        return;
    }
    want = r->logits + (size_t)k * vocab;
    for (uint32_t c = 0; c < vocab; c++) {
        ck_assert_msg(memcmp(&step_logits[c], &want[c], sizeof(double)) == 0,
                      "%s %s: '%s' step %u logit %u is %.17g, the uncached reference has %.17g",
                      tag, preset, id, k + 1, c, step_logits[c], want[c]);
    }
}

/* Steps `id` for picks from .. from+count-1 of `r`, checking each. */
static void step_and_compare(const char *tag, const char *id, const ref_t *r, uint32_t from,
                             uint32_t count)
{
    for (uint32_t k = from; k < from + count; k++) {
        uint32_t token = step_ok(id);
        expect_pick(tag, id, r, k, token);
    }
}

/* A whole request: start, every step of the reference, finish. */
static void run_request(const char *tag, const char *id, const int64_t *prompt, const ref_t *r)
{
    start_ok(id, prompt, r->n);
    step_and_compare(tag, id, r, 0, r->steps);
    finish_ok(id, NULL);
}

static void fill_prompt(int64_t *p, size_t n, uint64_t seed)
{
    uint32_t vocab = model_vocab(ref_model);

    for (size_t i = 0; i < n; i++) {
        p[i] = (int64_t)((seed * 7919 + i * 37 + 11) % vocab);
    }
}

/* ---- Stage 1: cached equals uncached ---- */

static const int64_t prompt_abc[] = {0, 1, 2};
static const int64_t prompt_cba[] = {2, 1, 0};

/* The reference itself: positions matter (the same tokens in another order
 * score differently), and tiny reproduces docs/models.md's golden values. */
static void check_premises(void)
{
    static const uint32_t golden_tokens[] = {0, 1, 2, 4, 0, 0, 0, 0};
    static const double golden_logits[] = {-0.215893, 0.026816, -0.396466,
                                           0.115424,  0.344289, 0.245721};
    const ref_t *abc = ref_make(prompt_abc, 3, 5);
    const ref_t *cba = ref_make(prompt_cba, 3, 5);
    bool differ = false;

    if (is_attn()) {
        differ = memcmp(abc->logits, cba->logits, model_vocab(ref_model) * sizeof(double)) != 0;
    } else {
        for (uint32_t k = 0; k < 5; k++) {
            differ = differ || abc->tokens[3 + k] != cba->tokens[3 + k];
        }
    }
    ck_assert_msg(differ, "premise: %s scores [0,1,2] and [2,1,0] alike", preset);
    if (strcmp(preset, "tiny") == 0) {
        for (int i = 0; i < 8; i++) {
            ck_assert_msg(abc->tokens[i] == golden_tokens[i], "premise: tiny golden token %d", i);
        }
        for (int c = 0; c < 6; c++) {
            ck_assert_msg(fabs(abc->logits[c] - golden_logits[c]) < 1e-9,
                          "premise: tiny golden logit %d is %.17g", c, abc->logits[c]);
        }
    }
}

START_TEST(stage1_cached_equals_uncached)
{
    int64_t longp[40];
    const ref_t *r1, *r2, *r3;

    open_engine(_i, NULL);
    check_premises();
    /* Requests one after another, each against its own reference: the
     * first shows the cached path on a fresh engine, the later ones that
     * it stays right once other requests have come and gone.  On tiny
     * (max_ctx 8) the first request is short, so that an engine which
     * piled every request into one array could still take the second. */
    if (is_attn()) {
        int64_t p3[] = {3, 5};

        r1 = ref_make(prompt_cba, 3, 1);
        r2 = ref_make(prompt_abc, 3, 5);
        r3 = ref_make(p3, 2, 6);
        run_request("[stage1]", "r1", prompt_cba, r1);
        run_request("[stage1]", "r2", prompt_abc, r2);
        run_request("[stage1]", "r3", p3, r3);
    } else {
        fill_prompt(longp, 40, 1);
        r1 = ref_make(prompt_abc, 3, 16);
        r2 = ref_make(prompt_cba, 3, 16);
        r3 = ref_make(longp, 40, 24);
        run_request("[stage1]", "r1", prompt_abc, r1);
        run_request("[stage1]", "r2", prompt_cba, r2);
        run_request("[stage1]", "r3", longp, r3);
    }
}
END_TEST

/* ---- Stage 2: interleaved requests are isolated ---- */

START_TEST(stage2_interleaved_isolated)
{
    static const int64_t pa[] = {7, 8, 9, 10}, pb[] = {10, 9, 8, 7};
    const int64_t *a, *b;
    size_t n;
    uint32_t steps;
    const ref_t *ra, *rb;

    open_engine(_i, NULL);
    /* Same tokens, other order: isolation cannot pass by luck. */
    a = is_attn() ? prompt_abc : pa;
    b = is_attn() ? prompt_cba : pb;
    n = is_attn() ? 3 : 4;
    steps = is_attn() ? 4 : 12;
    ra = ref_make(a, n, steps);
    rb = ref_make(b, n, steps + 1);

    start_ok("a", a, n);
    start_ok("b", b, n);
    for (uint32_t k = 0; k < steps; k++) {
        expect_pick("[stage2]", "a", ra, k, step_ok("a"));
        expect_pick("[stage2]", "b", rb, k, step_ok("b"));
    }
    /* One ends; the other goes on, untouched by the release. */
    finish_ok("a", NULL);
    step_and_compare("[stage2]", "b", rb, steps, 1);
    finish_ok("b", NULL);
}
END_TEST

/* ---- Stage 3: a start after a finish starts clean ---- */

START_TEST(stage3_start_after_finish_clean)
{
    open_engine(_i, NULL);
    if (is_attn()) {
        static const int64_t px[] = {4, 5};
        const ref_t *rx = ref_make(px, 2, 1);
        const ref_t *ry = ref_make(prompt_abc, 3, 5);
        const ref_t *rx2 = ref_make(px, 2, 6);

        run_request("[stage1]", "a", px, rx);
        /* The same id again, after its finish. */
        run_request("[stage3]", "a", prompt_abc, ry);
        /* The first prompt again, under a new id: the very same run. */
        run_request("[stage3]", "c", px, rx2);
    } else {
        static const int64_t p1[] = {1, 2, 3, 4, 5}, p2[] = {9, 9, 9}, p3[] = {5, 4, 3, 2, 1};
        const ref_t *r1 = ref_make(p1, 5, 10);
        const ref_t *r2 = ref_make(p2, 3, 10);
        const ref_t *r3 = ref_make(p3, 5, 10);

        run_request("[stage1]", "a", p1, r1);
        run_request("[stage3]", "b", p2, r2);
        run_request("[stage3]", "a", p3, r3);
        run_request("[stage3]", "c", p1, r1);
    }
}
END_TEST

/* ---- Stage 4: memory is bounded ---- */

/* What 'keep' holds in the pool: `held`, or 0 while the engine has it
 * evicted (docs/protocol.md, "When the pool is full": an evicted session
 * counts 0 in cache_entries). */
static uint64_t keep_held(uint64_t held)
{
    return engine->evicted != NULL && engine->evicted(eng, "keep") ? 0 : held;
}

/* Stage 4's finished requests: 200, their prompt and step counts a cycle
 * of 35 (3 for attn).  On the daemon with SLOTD_TEST_REPEATS=1 (the
 * sanitizer and valgrind stages, where every request is a round trip to a
 * slower daemon), one cycle: each length once. */
static uint32_t stage4_requests(void)
{
#ifdef STAGES_DAEMON
    if (engine == &stage_engine_daemon)
        return (uint32_t)(35 * itest_repeats(6) < 200 ? 35 * itest_repeats(6) : 200);
#endif
    return 200;
}

START_TEST(stage4_memory_bounded)
{
    static const int64_t keep_prompt[] = {1, 2};
    uint64_t bytes0, held;
    uint32_t released = UINT32_MAX;

    open_engine(_i, NULL);
    bytes0 = engine->bytes_used(eng);
    ck_assert_msg(engine->cache_entries(eng) == 0, "setup: a fresh engine holds entries");

    /* One request stays live throughout and holds exactly its own. */
    start_ok("keep", keep_prompt, 2);
    step_ok("keep");
    held = 3;
    ck_assert_msg(engine->cache_entries(eng) == keep_held(held),
                  "[stage4] %s: a live request of 2 + 1 holds %" PRIu64 " entries", preset,
                  engine->cache_entries(eng));

    for (uint32_t i = 0; i < stage4_requests(); i++) {
        char id[16];
        int64_t prompt[8];
        size_t n = 1 + i % (is_attn() ? 3 : 7);
        uint32_t steps = i % (is_attn() ? 3 : 5);

        snprintf(id, sizeof(id), "r%u", i);
        fill_prompt(prompt, n, i);
        start_ok(id, prompt, n);
        ck_assert_msg(engine->cache_entries(eng) == keep_held(held) + n,
                      "[stage4] %s: request %u after a %zu-token prompt: %" PRIu64
                      " entries, %" PRIu64 " expected",
                      preset, i, n, engine->cache_entries(eng), keep_held(held) + n);
        for (uint32_t k = 0; k < steps; k++) {
            step_ok(id);
            ck_assert_msg(
                engine->cache_entries(eng) == keep_held(held) + n + k + 1,
                "[stage4] %s: request %u after step %u: %" PRIu64 " entries, %" PRIu64 " expected",
                preset, i, k + 1, engine->cache_entries(eng), keep_held(held) + n + k + 1);
        }
        finish_ok(id, &released);
        ck_assert_msg(engine->cache_entries(eng) == keep_held(held),
                      "[stage4] %s: %" PRIu64 " entries held after request %u finished, %" PRIu64
                      " expected (the live 'keep' alone)",
                      preset, engine->cache_entries(eng), i, keep_held(held));
        ck_assert_msg(released == n + steps,
                      "[stage4] %s: finishing request %u released %u entries of %zu", preset, i,
                      released, n + steps);
    }
    finish_ok("keep", &released);
    ck_assert_msg(released == 3, "[stage4] %s: 'keep' released %u entries of 3", preset, released);
    ck_assert_msg(engine->cache_entries(eng) == 0,
                  "[stage4] %s: %" PRIu64 " entries left after %u finished requests", preset,
                  engine->cache_entries(eng), stage4_requests() + 1);
    ck_assert_msg(engine->bytes_used(eng) == bytes0,
                  "[stage4] %s: %" PRIu64 " bytes held after every request finished, %" PRIu64
                  " before",
                  preset, engine->bytes_used(eng), bytes0);
}
END_TEST

/* ---- Stage 5: one model call per step ---- */

/* Asserts the counters moved by exactly `positions` runs since g0/r0. */
static void expect_calls(const char *what, uint64_t g0, uint64_t r0, uint64_t positions)
{
    uint64_t dg = engine->g_calls(eng) - g0;
    uint64_t dr = engine->rows(eng) - r0;
    uint64_t want_g = is_attn() ? 0 : positions;
    uint64_t want_r = is_attn() ? positions * model_layers(ref_model) : 0;

    ck_assert_msg(dg == want_g && dr == want_r,
                  "[stage5] %s: %s made %" PRIu64 " g calls and %" PRIu64 " rows, expected %" PRIu64
                  " and %" PRIu64,
                  preset, what, dg, dr, want_g, want_r);
}

START_TEST(stage5_one_call_per_step)
{
    static const int64_t ph[] = {3, 1, 4, 1, 5, 9, 2, 6};
    static const int64_t pb[] = {5, 4};
    const int64_t *pa;
    size_t n;
    uint32_t steps;
    uint64_t g0, r0;
    const ref_t *ra, *rb;
    char what[64];

    open_engine(_i, NULL);
    /* Prompts of two tokens or more: with one, a rerun of the prefix
     * would cost exactly one call and hide. */
    pa = is_attn() ? prompt_abc : ph;
    n = is_attn() ? 3 : 8;
    steps = is_attn() ? 4 : 20;
    ra = ref_make(pa, n, steps + 1);
    rb = ref_make(pb, 2, is_attn() ? 2 : 10);

    g0 = engine->g_calls(eng);
    r0 = engine->rows(eng);
    start_ok("a", pa, n);
    expect_calls("the prefill of 'a'", g0, r0, n);
    for (uint32_t k = 0; k < steps; k++) {
        uint32_t token;

        g0 = engine->g_calls(eng);
        r0 = engine->rows(eng);
        token = step_ok("a");
        snprintf(what, sizeof(what), "step %u of 'a'", k + 1);
        expect_calls(what, g0, r0, 1);
        expect_pick("[stage5:picks]", "a", ra, k, token);
    }
    /* A second request's prefill and steps cost the same while 'a' lives. */
    g0 = engine->g_calls(eng);
    r0 = engine->rows(eng);
    start_ok("b", pb, 2);
    expect_calls("the prefill of 'b'", g0, r0, 2);
    for (uint32_t k = 0; k < rb->steps; k++) {
        uint32_t token;

        g0 = engine->g_calls(eng);
        r0 = engine->rows(eng);
        token = step_ok("b");
        snprintf(what, sizeof(what), "step %u of 'b'", k + 1);
        expect_calls(what, g0, r0, 1);
        expect_pick("[stage5:picks]", "b", rb, k, token);
    }
    g0 = engine->g_calls(eng);
    r0 = engine->rows(eng);
    finish_ok("b", NULL);
    expect_calls("finishing 'b'", g0, r0, 0);
    expect_pick("[stage5:picks]", "a", ra, steps, step_ok("a"));
    finish_ok("a", NULL);
}
END_TEST

/* ---- Errors: each one refused, and nothing changed ---- */

/** What an engine holds and has done, to show that an error changed nothing. */
typedef struct snap {
    uint64_t entries;
    uint64_t bytes;
    uint64_t g_calls;
    uint64_t rows;
} snap_t;

static snap_t snap_take(void)
{
    snap_t s = {engine->cache_entries(eng), engine->bytes_used(eng), engine->g_calls(eng),
                engine->rows(eng)};
    return s;
}

static void expect_unchanged(const char *what, const snap_t *before)
{
    snap_t now = snap_take();

    ck_assert_msg(memcmp(&now, before, sizeof(now)) == 0,
                  "[errors] %s: %s changed the engine: entries %" PRIu64 " -> %" PRIu64
                  ", bytes %" PRIu64 " -> %" PRIu64 ", g calls %" PRIu64 " -> %" PRIu64
                  ", rows %" PRIu64 " -> %" PRIu64,
                  preset, what, before->entries, now.entries, before->bytes, now.bytes,
                  before->g_calls, now.g_calls, before->rows, now.rows);
}

static void expect_code(const char *what, int rc, int want, const slotd_error_t *err)
{
    ck_assert_msg(rc == want, "[errors] %s: %s gave %s (%s), expected %s", preset, what,
                  slotd_err_name(rc), err->message, slotd_err_name(want));
}

START_TEST(errors_step_unknown_id)
{
    slotd_error_t err = {0};
    uint32_t token;
    const ref_t *ra;
    snap_t s0;
    int rc;

    open_engine(_i, NULL);
    ra = ref_make(prompt_abc, 3, 4);
    start_ok("a", prompt_abc, 3);
    expect_pick("[errors]", "a", ra, 0, step_ok("a"));

    s0 = snap_take();
    rc = engine->step(eng, "nobody", &token, step_logits, &err);
    expect_code("a step on an unknown id", rc, SLOTD_EUNKNOWN_ID, &err);
    ck_assert_msg(strstr(err.message, "nobody") != NULL, "[errors] the message names no id: %s",
                  err.message);
    rc = engine->finish(eng, "nobody", NULL, &err);
    expect_code("a finish of an unknown id", rc, SLOTD_EUNKNOWN_ID, &err);
    expect_unchanged("an unknown id", &s0);
    step_and_compare("[errors]", "a", ra, 1, 3);
}
END_TEST

START_TEST(errors_prompt_too_long)
{
    slotd_error_t err = {0};
    uint32_t token;
    int64_t *longp;
    int64_t bad[2];
    size_t n;
    const ref_t *ra;
    snap_t s0;
    int rc;

    open_engine(_i, NULL);
    n = (size_t)model_max_ctx(ref_model) + 1;
    ra = ref_make(prompt_abc, 3, 4);
    start_ok("a", prompt_abc, 3);
    s0 = snap_take();

    longp = calloc(n, sizeof(*longp));
    ck_assert_msg(longp != NULL, "setup: out of memory");
    fill_prompt(longp, n, 3);
    rc = engine->start(eng, "b", longp, n, &err);
    free(longp);
    expect_code("a prompt of max_ctx + 1 tokens", rc, SLOTD_ETOO_LONG, &err);
    ck_assert_msg(strstr(err.message, "length") != NULL,
                  "[errors] the too_long message names no length: %s", err.message);
    rc = engine->start(eng, "b", prompt_abc, 0, &err);
    expect_code("an empty prompt", rc, SLOTD_EBAD_REQUEST, &err);
    bad[0] = 0;
    bad[1] = model_vocab(ref_model);
    rc = engine->start(eng, "b", bad, 2, &err);
    expect_code("a token of V", rc, SLOTD_EBAD_REQUEST, &err);
    rc = engine->start(eng, "a", prompt_abc, 3, &err);
    expect_code("a start on a live id", rc, SLOTD_EDUPLICATE_ID, &err);
    rc = engine->step(eng, "b", &token, step_logits, &err);
    expect_code("a step of the refused id", rc, SLOTD_EUNKNOWN_ID, &err);
    expect_unchanged("refused starts", &s0);
    step_and_compare("[errors]", "a", ra, 0, 4);
}
END_TEST

START_TEST(errors_finish_twice)
{
    slotd_error_t err = {0};
    uint32_t released = 0, token;
    const ref_t *ra, *rb;
    snap_t s0;
    int rc;

    open_engine(_i, NULL);
    ra = ref_make(prompt_abc, 3, 1);
    rb = ref_make(prompt_cba, 3, 4);
    start_ok("a", prompt_abc, 3);
    start_ok("b", prompt_cba, 3);
    expect_pick("[errors]", "a", ra, 0, step_ok("a"));
    expect_pick("[errors]", "b", rb, 0, step_ok("b"));
    finish_ok("a", &released);
    ck_assert_msg(released == 4, "[errors] %s: 'a' released %u entries of 4", preset, released);

    s0 = snap_take();
    rc = engine->finish(eng, "a", &released, &err);
    expect_code("a second finish", rc, SLOTD_EUNKNOWN_ID, &err);
    rc = engine->step(eng, "a", &token, step_logits, &err);
    expect_code("a step after finish", rc, SLOTD_EUNKNOWN_ID, &err);
    expect_unchanged("a second finish", &s0);
    ck_assert_msg(engine->cache_entries(eng) == 4, "[errors] %s: %" PRIu64 " entries, 'b' holds 4",
                  preset, engine->cache_entries(eng));
    step_and_compare("[errors]", "b", rb, 1, 3);
}
END_TEST

START_TEST(errors_slots_exhausted)
{
    const stage_limits_t lim = {.capacity_bytes = 0, .max_slots = 2};
    slotd_error_t err = {0};
    uint32_t token;
    const ref_t *ra, *rb, *rc3;
    snap_t s0;
    int rc;

    open_engine(_i, &lim);
    ra = ref_make(prompt_abc, 3, 1);
    rb = ref_make(prompt_cba, 3, 4);
    rc3 = ref_make(prompt_abc, 3, 5);
    start_ok("a", prompt_abc, 3);
    start_ok("b", prompt_cba, 3);
    expect_pick("[errors]", "b", rb, 0, step_ok("b"));

    s0 = snap_take();
    rc = engine->start(eng, "c", prompt_abc, 3, &err);
    expect_code("a start past max_slots", rc, SLOTD_ECACHE_FULL, &err);
    rc = engine->step(eng, "c", &token, step_logits, &err);
    expect_code("a step of the refused id", rc, SLOTD_EUNKNOWN_ID, &err);
    expect_unchanged("a start past max_slots", &s0);

    expect_pick("[errors]", "a", ra, 0, step_ok("a"));
    finish_ok("a", NULL);
    start_ok("c", prompt_abc, 3);
    step_and_compare("[errors]", "c", rc3, 0, 5);
    step_and_compare("[errors]", "b", rb, 1, 3);
}
END_TEST

START_TEST(errors_bytes_exhausted)
{
    const stage_limits_t lim = {.capacity_bytes = 256 * 1024, .max_slots = 4096};
    uint32_t bp, max_ctx, nf = 0, token;
    slotd_error_t err = {0};
    const int64_t *pa;
    int64_t *pbuf, *pf;
    size_t na;
    const ref_t *ra;
    snap_t s0;
    int rc;

    open_engine(_i, &lim);
    /* The capacity of a chain's first block: a start of bp tokens holds
     * exactly one full block. */
    bp = model_block_capacity(ref_model, 0);
    max_ctx = model_max_ctx(ref_model);
    pbuf = calloc(max_ctx, sizeof(*pbuf));
    pf = calloc(max_ctx, sizeof(*pf));
    ck_assert_msg(pbuf != NULL && pf != NULL, "setup: out of memory");
    /* 'a' ends on a block boundary where it can, so that its next step
     * needs a new block. */
    if (bp < max_ctx) {
        fill_prompt(pbuf, bp, 5);
        pa = pbuf;
        na = bp;
    } else {
        pa = prompt_abc;
        na = 3;
    }
    ra = ref_make(pa, na, 3);
    start_ok("a", pa, na);

    /* Requests of one full block each, until the pool refuses a start. */
    fill_prompt(pf, bp, 6);
    for (;;) {
        char id[16];

        ck_assert_msg(nf < 100000, "setup: the pool never filled up");
        snprintf(id, sizeof(id), "f%u", nf);
        s0 = snap_take();
        rc = engine->start(eng, id, pf, bp, &err);
        if (rc != SLOTD_OK) {
            expect_code("a start into a full pool", rc, SLOTD_ECACHE_FULL, &err);
            expect_unchanged("a start into a full pool", &s0);
            rc = engine->step(eng, id, &token, step_logits, &err);
            expect_code("a step of the refused id", rc, SLOTD_EUNKNOWN_ID, &err);
            break;
        }
        nf++;
    }
    ck_assert_msg(nf > 0, "setup: not one request fits the pool");

    if (bp < max_ctx) {
        /* Let the fillers take whatever blocks are left, then 'a', on its
         * boundary, cannot grow. */
        bool progress = true;
        bool *done = calloc(nf, sizeof(*done));

        ck_assert_msg(done != NULL, "setup: out of memory");
        while (progress) {
            progress = false;
            for (uint32_t f = 0; f < nf; f++) {
                char id[16];

                if (done[f]) {
                    continue;
                }
                snprintf(id, sizeof(id), "f%u", f);
                rc = engine->step(eng, id, &token, step_logits, &err);
                if (rc == SLOTD_OK) {
                    progress = true;
                } else {
                    done[f] = true;
                    ck_assert_msg(rc == SLOTD_ECACHE_FULL || rc == SLOTD_ECONTEXT_FULL,
                                  "setup: filler step: %s", slotd_err_name(rc));
                }
            }
        }
        free(done);
        s0 = snap_take();
        rc = engine->step(eng, "a", &token, step_logits, &err);
        expect_code("a step needing a block of a full pool", rc, SLOTD_ECACHE_FULL, &err);
        expect_unchanged("a step refused for want of a block", &s0);
        /* Finishing fillers gives back blocks of the class 'a' needs (every
         * filler holds at least its first block): as many as its three
         * steps take. */
        {
            uint32_t need = model_chain_blocks(ref_model, (uint32_t)na + 3, 1, NULL) -
                            model_chain_blocks(ref_model, (uint32_t)na, 1, NULL);
            ck_assert_msg(need <= nf, "setup: %u fillers cannot free %u blocks", nf, need);
            for (uint32_t f = 0; f < need; f++) {
                char id[16];
                snprintf(id, sizeof(id), "f%u", f);
                finish_ok(id, NULL);
            }
        }
        step_and_compare("[errors]", "a", ra, 0, 3);
    } else {
        const ref_t *rl = ref_make(prompt_cba, 3, 5);

        finish_ok("f0", NULL);
        start_ok("late", prompt_cba, 3);
        step_and_compare("[errors]", "late", rl, 0, 5);
        step_and_compare("[errors]", "a", ra, 0, 3);
    }
    free(pbuf);
    free(pf);
}
END_TEST

/* ---- cache/session itself, on a pool of the test's own ---- */

static cache_pool_t *spool;
static model_t *smodel;
static void *sscratch;

static void session_teardown(void)
{
    cache_pool_destroy(spool);
    spool = NULL;
    model_destroy(smodel);
    smodel = NULL;
    free(sscratch);
    sscratch = NULL;
    teardown();
}

/* A pool of `slots` slots serving a model of stages_models[i], and the
 * reference model beside it. */
static void session_open(int i, size_t capacity, uint32_t slots)
{
    const model_t *models[1];
    cache_pool_config_t cfg;
    int rc;

    memset(&cfg, 0, sizeof(cfg)); /* every member set below; the prefix cache off */
    preset = stage_models[i];
    rc = model_create(preset, &ref_model);
    ck_assert_msg(rc == SLOTD_OK, "setup: model_create(%s)", preset);
    rc = model_create(preset, &smodel);
    ck_assert_msg(rc == SLOTD_OK, "setup: model_create(%s)", preset);
    sscratch = malloc(model_scratch_size(smodel) + 1);
    ck_assert_msg(sscratch != NULL, "setup: out of memory");
    models[0] = smodel;
    cfg.capacity_bytes = capacity;
    cfg.max_slots = slots;
    cfg.models = models;
    cfg.nmodels = 1;
    cfg.arena_factor = 2; /* as the daemon maps it */
    rc = cache_pool_create(&cfg, &spool);
    ck_assert_msg(rc == SLOTD_OK, "setup: cache_pool_create: %s", slotd_err_name(rc));
}

static cache_owner_t owner_of(const char *id)
{
    cache_owner_t o = {.key = 1};

    snprintf(o.id, sizeof(o.id), "%s", id);
    return o;
}

static void expect_pool_empty(const char *what)
{
    cache_pool_stats_t st;

    cache_pool_stats(spool, &st);
    ck_assert_msg(st.entries == 0 && st.live_slots == 0 && st.bytes_used == 0,
                  "[session] %s: %s left %" PRIu64 " entries, %" PRIu64 " slots, %" PRIu64 " bytes",
                  preset, what, st.entries, st.live_slots, st.bytes_used);
}

static void expect_pool_same(const char *what, const cache_pool_stats_t *before)
{
    cache_pool_stats_t st;

    cache_pool_stats(spool, &st);
    ck_assert_msg(st.entries == before->entries && st.live_slots == before->live_slots &&
                      st.bytes_used == before->bytes_used,
                  "[session] %s: %s changed the pool", preset, what);
}

START_TEST(session_steps_and_context_full)
{
    cache_owner_t oa = owner_of("a");
    slotd_error_t err = {0};
    cache_session_t s;
    cache_pool_stats_t st0;
    uint32_t max_ctx, vocab, steps, *tokens, released = 0;
    double *logits;
    int64_t *prompt;
    size_t n;
    const ref_t *r;
    int rc;

    session_open(_i, 64u << 20, 8);
    max_ctx = model_max_ctx(ref_model);
    vocab = model_vocab(ref_model);
    steps = 5;
    n = max_ctx - steps; /* the request ends exactly at max_ctx */
    prompt = calloc(max_ctx, sizeof(*prompt));
    tokens = calloc(steps + 1, sizeof(*tokens));
    logits = calloc((size_t)(steps + 1) * vocab, sizeof(*logits));
    ck_assert_msg(prompt && tokens && logits, "setup: out of memory");
    fill_prompt(prompt, n, 9);
    r = ref_make(prompt, n, steps);

    rc = cache_session_start(spool, smodel, &oa, prompt, n, sscratch, &s, &err);
    ck_assert_msg(rc == SLOTD_OK, "setup: start: %s", err.message);
    ck_assert_msg(s.entries == n && cache_pool_entries(spool) == n,
                  "[session] %s: a prompt of %zu holds %u", preset, n, s.entries);
    cache_pool_stats(spool, &st0);

    rc = cache_session_step(spool, &s, steps + 1, sscratch, tokens, logits, &err);
    ck_assert_msg(rc == SLOTD_ECONTEXT_FULL, "[session] %s: a step past max_ctx gave %s", preset,
                  slotd_err_name(rc));
    rc = cache_session_step(spool, &s, 0, sscratch, tokens, logits, &err);
    ck_assert_msg(rc == SLOTD_EBAD_REQUEST, "[session] %s: zero steps gave %s", preset,
                  slotd_err_name(rc));
    ck_assert_msg(s.entries == n, "[session] %s: a refused step moved entries", preset);
    expect_pool_same("refused steps", &st0);

    /* n steps in one call are the reference's n picks; hash writes no logits. */
    for (size_t i = 0; i < (size_t)steps * vocab; i++) {
        logits[i] = -7.0;
    }
    rc = cache_session_step(spool, &s, steps, sscratch, tokens, logits, &err);
    ck_assert_msg(rc == SLOTD_OK, "[session] %s: %u steps to max_ctx: %s", preset, steps,
                  err.message);
    for (uint32_t k = 0; k < steps; k++) {
        ck_assert_msg(tokens[k] == r->tokens[n + k], "[session] %s: pick %u is %u, reference %u",
                      preset, k + 1, tokens[k], r->tokens[n + k]);
    }
    if (is_attn()) {
        ck_assert_msg(memcmp(logits, r->logits, (size_t)steps * vocab * sizeof(double)) == 0,
                      "[session] %s: logits differ from the reference", preset);
    } else {
        for (size_t i = 0; i < (size_t)steps * vocab; i++) {
            ck_assert_msg(logits[i] == -7.0, "[session] hash wrote logits");
        }
    }
    ck_assert_msg(s.entries == max_ctx && cache_pool_entries(spool) == max_ctx,
                  "[session] %s: %u entries at the end, %u expected", preset, s.entries, max_ctx);
    rc = cache_session_step(spool, &s, 1, sscratch, tokens, NULL, &err);
    ck_assert_msg(rc == SLOTD_ECONTEXT_FULL, "[session] %s: a step at max_ctx gave %s", preset,
                  slotd_err_name(rc));
    rc = cache_session_finish(spool, &s, &released);
    ck_assert_msg(rc == SLOTD_OK && released == max_ctx, "[session] %s: finish released %u", preset,
                  released);
    expect_pool_empty("finish");
    free(prompt);
    free(tokens);
    free(logits);
}
END_TEST

START_TEST(session_stale_after_finish)
{
    cache_owner_t oa = owner_of("a"), ob = owner_of("b");
    slotd_error_t err = {0};
    cache_session_t sa, sb;
    uint32_t tokens[4];
    double logits[4 * 6];
    const ref_t *rb;
    int rc;

    session_open(_i, 64u << 20, 1);
    rb = ref_make(prompt_cba, 3, 4);
    rc = cache_session_start(spool, smodel, &oa, prompt_abc, 3, sscratch, &sa, &err);
    ck_assert_msg(rc == SLOTD_OK, "setup: start: %s", err.message);
    rc = cache_session_finish(spool, &sa, NULL);
    ck_assert_msg(rc == SLOTD_OK, "setup: finish");
    rc = cache_session_finish(spool, &sa, NULL);
    ck_assert_msg(rc == SLOTD_ESTALE, "[session] %s: a second finish gave %s", preset,
                  slotd_err_name(rc));

    /* The one slot goes to 'b'; the dead session value must not reach it. */
    rc = cache_session_start(spool, smodel, &ob, prompt_cba, 3, sscratch, &sb, &err);
    ck_assert_msg(rc == SLOTD_OK, "setup: start b: %s", err.message);
    rc = cache_session_step(spool, &sa, 1, sscratch, tokens, logits, &err);
    ck_assert_msg(rc == SLOTD_ESTALE, "[session] %s: a step of a finished session gave %s", preset,
                  slotd_err_name(rc));
    rc = cache_session_finish(spool, &sa, NULL);
    ck_assert_msg(rc == SLOTD_ESTALE, "[session] %s: a stale finish gave %s", preset,
                  slotd_err_name(rc));
    ck_assert_msg(cache_pool_entries(spool) == 3, "[session] %s: stale calls changed 'b'", preset);
    rc = cache_session_step(spool, &sb, 4, sscratch, tokens, is_attn() ? logits : NULL, &err);
    ck_assert_msg(rc == SLOTD_OK, "setup: step b: %s", err.message);
    for (uint32_t k = 0; k < 4; k++) {
        ck_assert_msg(tokens[k] == rb->tokens[3 + k], "[session] %s: 'b' pick %u differs", preset,
                      k + 1);
    }
    if (is_attn()) {
        ck_assert_msg(memcmp(logits, rb->logits, sizeof(logits)) == 0,
                      "[session] %s: 'b' logits differ", preset);
    }
    rc = cache_session_finish(spool, &sb, NULL);
    ck_assert_msg(rc == SLOTD_OK, "setup: finish b");
    expect_pool_empty("finish");
}
END_TEST

START_TEST(session_failed_start_holds_nothing)
{
    cache_owner_t oa = owner_of("a"), ob = owner_of("b");
    slotd_error_t err = {0};
    cache_session_t sa, sb;
    cache_pool_stats_t st0;
    int64_t *longp, bad[2];
    size_t n;
    int rc;

    session_open(_i, 64u << 20, 1);
    rc = cache_session_start(spool, smodel, &oa, prompt_abc, 3, sscratch, &sa, &err);
    ck_assert_msg(rc == SLOTD_OK, "setup: start: %s", err.message);
    cache_pool_stats(spool, &st0);

    n = (size_t)model_max_ctx(ref_model) + 1;
    longp = calloc(n, sizeof(*longp));
    ck_assert_msg(longp != NULL, "setup: out of memory");
    rc = cache_session_start(spool, smodel, &ob, longp, n, sscratch, &sb, &err);
    free(longp);
    ck_assert_msg(rc == SLOTD_ETOO_LONG, "[session] %s: too long gave %s", preset,
                  slotd_err_name(rc));
    rc = cache_session_start(spool, smodel, &ob, prompt_abc, 0, sscratch, &sb, &err);
    ck_assert_msg(rc == SLOTD_EBAD_REQUEST && strstr(err.message, "prompt") != NULL,
                  "[session] %s: empty prompt gave %s (%s)", preset, slotd_err_name(rc),
                  err.message);
    bad[0] = -1;
    bad[1] = 0;
    rc = cache_session_start(spool, smodel, &ob, bad, 2, sscratch, &sb, &err);
    ck_assert_msg(rc == SLOTD_EBAD_REQUEST, "[session] %s: token -1 gave %s", preset,
                  slotd_err_name(rc));
    rc = cache_session_start(spool, smodel, &ob, prompt_abc, 3, sscratch, &sb, &err);
    ck_assert_msg(rc == SLOTD_ECACHE_FULL, "[session] %s: no free slot gave %s", preset,
                  slotd_err_name(rc));
    expect_pool_same("refused starts", &st0);
    rc = cache_session_finish(spool, &sa, NULL);
    ck_assert_msg(rc == SLOTD_OK, "setup: finish");
    expect_pool_empty("finish");
}
END_TEST

START_TEST(session_borrowed_slots)
{
    static const uint32_t golden_tokens[] = {0, 1, 2, 4, 0, 0, 0, 0};
    static const double golden_logits[] = {-0.215893, 0.026816, -0.396466,
                                           0.115424,  0.344289, 0.245721};
    cache_owner_t oa = owner_of("a");
    slotd_error_t err = {0};
    uint32_t cached[64], uncached[64];
    double lc[64 * 6], lu[64 * 6], l1[6];
    uint64_t rows = 0;
    cache_session_t sa;
    int rc;

    session_open(_i, 64u << 20, 1);
    if (is_attn()) {
        rc = cache_session_logits(spool, smodel, prompt_abc, 3, sscratch, l1, &rows, &err);
        ck_assert_msg(rc == SLOTD_OK, "[session] logits: %s", err.message);
        ck_assert_msg(rows == 6, "[session] logits rows %" PRIu64, rows);
        for (int c = 0; c < 6; c++) {
            ck_assert_msg(fabs(l1[c] - golden_logits[c]) < 1e-9, "[session] logit %d: %.17g", c,
                          l1[c]);
        }
        expect_pool_empty("logits");
        rc = cache_session_generate(spool, smodel, prompt_abc, 3, 5, true, sscratch, cached, lc,
                                    &rows, &err);
        ck_assert_msg(rc == SLOTD_OK && rows == 14, "[session] cached generate: %s, rows %" PRIu64,
                      err.message, rows);
        expect_pool_empty("a cached generate");
        rc = cache_session_generate(spool, smodel, prompt_abc, 3, 5, false, sscratch, uncached, lu,
                                    &rows, &err);
        ck_assert_msg(rc == SLOTD_OK && rows == 50,
                      "[session] uncached generate: %s, rows %" PRIu64, err.message, rows);
        expect_pool_empty("an uncached generate");
        for (int i = 0; i < 8; i++) {
            ck_assert_msg(cached[i] == golden_tokens[i] && uncached[i] == golden_tokens[i],
                          "[session] generate token %d", i);
        }
        ck_assert_msg(memcmp(lc, lu, 5 * 6 * sizeof(double)) == 0,
                      "[session] cached and uncached logits differ");
        ck_assert_msg(memcmp(lc, l1, sizeof(l1)) == 0, "[session] logits and generate differ");
        rc = cache_session_generate(spool, smodel, prompt_abc, 3, 6, true, sscratch, cached, lc,
                                    &rows, &err);
        ck_assert_msg(rc == SLOTD_ETOO_LONG, "[session] 3 + 6 on tiny gave %s", slotd_err_name(rc));
    } else {
        rc = cache_session_logits(spool, smodel, prompt_abc, 3, sscratch, l1, &rows, &err);
        ck_assert_msg(rc == SLOTD_EBAD_REQUEST && strstr(err.message, "model") != NULL,
                      "[session] hash logits gave %s (%s)", slotd_err_name(rc), err.message);
        rc = cache_session_generate(spool, smodel, prompt_abc, 3, 20, true, sscratch, cached, NULL,
                                    &rows, &err);
        ck_assert_msg(rc == SLOTD_OK && rows == 22, "[session] hash cached generate rows %" PRIu64,
                      rows);
        rc = cache_session_generate(spool, smodel, prompt_abc, 3, 20, false, sscratch, uncached,
                                    NULL, &rows, &err);
        ck_assert_msg(rc == SLOTD_OK && rows == 250,
                      "[session] hash uncached generate rows %" PRIu64, rows);
        ck_assert_msg(memcmp(cached, uncached, 23 * sizeof(uint32_t)) == 0,
                      "[session] hash cached and uncached tokens differ");
        expect_pool_empty("generate");
    }

    /* With the only slot taken, nothing can be borrowed, and the live
     * session is left as it was. */
    rc = cache_session_start(spool, smodel, &oa, prompt_cba, 3, sscratch, &sa, &err);
    ck_assert_msg(rc == SLOTD_OK, "setup: start: %s", err.message);
    rc = cache_session_generate(spool, smodel, prompt_abc, 3, 1, true, sscratch, cached, lc, &rows,
                                &err);
    ck_assert_msg(rc == SLOTD_ECACHE_FULL, "[session] %s: a borrow from a full pool gave %s",
                  preset, slotd_err_name(rc));
    ck_assert_msg(cache_pool_entries(spool) == 3, "[session] a refused borrow changed 'a'");
    rc = cache_session_finish(spool, &sa, NULL);
    ck_assert_msg(rc == SLOTD_OK, "setup: finish");
    expect_pool_empty("finish");
}
END_TEST

/* ---- The runner ---- */

static TCase *stage_tcase(int stage)
{
    const TTest *tests[NSTAGES] = {
        stage1_cached_equals_uncached, stage2_interleaved_isolated, stage3_start_after_finish_clean,
        stage4_memory_bounded,         stage5_one_call_per_step,
    };
    static const char *const names[NSTAGES] = {"stage1", "stage2", "stage3", "stage4", "stage5"};
    TCase *tc = tcase_create(names[stage - 1]);

    tcase_set_timeout(tc, 60);
#ifdef STAGES_DAEMON
    if (engine == &stage_engine_daemon) {
        /* The daemon's: its directory, its stop and exit status.  Check
         * runs checked teardowns last added first: this one after
         * teardown() has closed the engine. */
        itest_fixtures(tc);
        tcase_set_timeout(tc, 60 * itest_time_scale());
    }
#endif
    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_add_loop_test(tc, tests[stage - 1], 0, NMODELS);
    return tc;
}

static TCase *errors_tcase(void)
{
    TCase *tc = tcase_create("errors");

    tcase_add_checked_fixture(tc, NULL, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, errors_step_unknown_id, 0, NMODELS);
    tcase_add_loop_test(tc, errors_prompt_too_long, 0, NMODELS);
    tcase_add_loop_test(tc, errors_finish_twice, 0, NMODELS);
    tcase_add_loop_test(tc, errors_slots_exhausted, 0, NMODELS);
    tcase_add_loop_test(tc, errors_bytes_exhausted, 0, NMODELS);
    return tc;
}

static TCase *session_tcase(void)
{
    TCase *tc = tcase_create("session");

    tcase_add_checked_fixture(tc, NULL, session_teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, session_steps_and_context_full, 0, NMODELS);
    tcase_add_loop_test(tc, session_stale_after_finish, 0, NMODELS);
    tcase_add_loop_test(tc, session_failed_start_holds_nothing, 0, NMODELS);
    tcase_add_loop_test(tc, session_borrowed_slots, 0, NMODELS);
    return tc;
}

static const char *rtype_name(int rtype)
{
    switch (rtype) {
    case CK_PASS:
        return "pass";
    case CK_FAILURE:
        return "assertion failure";
    case CK_ERROR:
        return "error (crash, signal or timeout)";
    default:
        return "unknown";
    }
}

/* Runs stage `stage` alone; 0 only if every run of it failed an assertion
 * carrying the stage's own tag. */
static int run_expect_fail(int stage)
{
    Suite *s = suite_create("stages");
    SRunner *sr;
    TestResult **results;
    char tag[16];
    int n, honest = 0;

    snprintf(tag, sizeof(tag), "[stage%d]", stage);
    suite_add_tcase(s, stage_tcase(stage));
    sr = srunner_create(s);
    srunner_run_all(sr, CK_SILENT);
    n = srunner_ntests_run(sr);
    results = srunner_results(sr);
    for (int i = 0; i < n; i++) {
        TestResult *tr = results[i];
        const char *msg = tr_msg(tr) != NULL ? tr_msg(tr) : "";
        bool ok = tr_rtype(tr) == CK_FAILURE && strncmp(msg, tag, strlen(tag)) == 0;

        printf("stage%d on engine %s: %s at %s:%d: %s%s\n", stage, engine->name,
               rtype_name(tr_rtype(tr)), tr_lfile(tr) ? tr_lfile(tr) : "?", tr_lno(tr), msg,
               ok ? "" : "  <- not the stage's own assertion failure");
        honest += ok;
    }
    free(results);
    srunner_free(sr);
    if (n == NMODELS && honest == n) {
        printf("expected failure: stage%d caught engine %s on every model (%d of %d)\n", stage,
               engine->name, honest, n);
        return 0;
    }
    printf("UNEXPECTED: stage%d on engine %s: %d of %d runs failed for the stage's reason\n", stage,
           engine->name, honest, n);
    return 1;
}

static int usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--engine real|vuln|recompute] [--stage N]... [--expect-fail N]\n"
            "  --stage N        run only stage N (1..%d); repeatable\n"
            "  --expect-fail N  run stage N alone; exit 0 only if it fails an assertion\n",
            argv0, NSTAGES);
    return 2;
}

int main(int argc, char **argv)
{
    unsigned stages = 0;
    int expect_fail = 0;
    Suite *s;
    SRunner *sr;
    int failed;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--engine") == 0 && i + 1 < argc) {
            const char *name = argv[++i];

            engine = NULL;
            for (size_t e = 0; e < sizeof(engines) / sizeof(engines[0]); e++) {
                if (strcmp(engines[e]->name, name) == 0) {
                    engine = engines[e];
                }
            }
            if (engine == NULL) {
                return usage(argv[0]);
            }
        } else if ((strcmp(argv[i], "--stage") == 0 || strcmp(argv[i], "--expect-fail") == 0) &&
                   i + 1 < argc) {
            int n = atoi(argv[i + 1]);

            if (n < 1 || n > NSTAGES) {
                return usage(argv[0]);
            }
            if (strcmp(argv[i], "--stage") == 0) {
                stages |= 1u << n;
            } else {
                expect_fail = n;
            }
            i++;
        } else {
            return usage(argv[0]);
        }
    }
    if (expect_fail) {
        return stages != 0 ? usage(argv[0]) : run_expect_fail(expect_fail);
    }
#ifdef STAGES_DAEMON
    /* test_stages_evict alone: the five stages on the daemon. */
    if (argc == 1) {
        engine = &stage_engine_daemon;
        stages = ((1u << (NSTAGES + 1)) - 1) & ~1u;
    }
#endif

    s = suite_create("stages");
    for (int n = 1; n <= NSTAGES; n++) {
        if (stages == 0 || (stages & (1u << n))) {
            suite_add_tcase(s, stage_tcase(n));
        }
    }
    if (stages == 0) {
        suite_add_tcase(s, errors_tcase());
        suite_add_tcase(s, session_tcase());
    }
    sr = srunner_create(s);
    srunner_run_all(sr, CK_ENV);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
