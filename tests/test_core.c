/*
 * test_core.c: the Check suite of core/, the models.
 *
 * It holds the model code to docs/models.md: the golden values, the work counts
 * (rows and g calls) of every operation, the validation errors and the
 * fields they name, bit-identical logits from the cached and the uncached
 * path, chains that cross many blocks, the counters under concurrent use,
 * and model_round6() against printf("%.6f").  It includes the module's
 * private header to reach the mixer and the block layout.
 */
#include "test_util.h"
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/model.h"
#include "core/model_int.h"
#include "test_model_util.h"

/* ---- Golden values ---- */

START_TEST(test_golden_mix)
{
    model_t *m = create("hash");
    int64_t tok[] = {1};
    uint32_t out[2];
    uint64_t rows = 0;

    ck_assert_uint_eq(model__mix64(0), UINT64_C(0xe220a8397b1dcdaf));
    ck_assert_uint_eq(model__hash_g(1, 0), UINT64_C(0xc42c5a1aa3820138));
    /* One token: the pick is g(1, 0) mod 1000. */
    ck_assert_int_eq(model_generate(m, tok, 1, 1, true, NULL, NULL, out, NULL, &rows, NULL),
                     SLOTD_OK);
    ck_assert_uint_eq(out[1], UINT64_C(0xc42c5a1aa3820138) % 1000);
    ck_assert_uint_eq(rows, 1);
    model_destroy(m);
}
END_TEST

START_TEST(test_golden_tiny)
{
    static const uint32_t want[] = {0, 1, 2, 4, 0, 0, 0, 0};
    static const char *first[] = {"-0.215893", "0.026816", "-0.396466",
                                  "0.115424",  "0.344289", "0.245721"};
    model_t *m = create("tiny");
    int64_t tok[] = {0, 1, 2};

    for (int cached = 0; cached <= 1; cached++) {
        uint32_t out[8];
        double logits[5 * 6];
        uint64_t rows = 0, before = model_rows(m);
        ck_assert_int_eq(model_generate(m, tok, 3, 5, cached, NULL, NULL, out, logits, &rows, NULL),
                         SLOTD_OK);
        ck_assert_mem_eq(out, want, sizeof(want));
        ck_assert_uint_eq(rows, cached ? 14 : 50);
        ck_assert_uint_eq(model_rows(m) - before, rows);
        ck_assert_uint_eq(model_g_calls(m), 0);
        for (int c = 0; c < 6; c++) {
            double w = strtod(first[c], NULL);
            ck_assert_mem_eq(&logits[c], &w, sizeof(w));
        }
    }
    model_destroy(m);
}
END_TEST

/* Unrounded logits, every bit, as the independent Python reference
 * (tests/ref/slotd_ref.py) computes them: tiny after [0, 1, 2], and a
 * digest of small's 512 logits after the tokens 1 .. 40 (three blocks). */
START_TEST(test_golden_bits)
{
    static const double tiny_want[] = {-0x1.ba26354f87217p-3, 0x1.b75b3fc021c72p-6,
                                       -0x1.95fb1b7fa9a87p-2, 0x1.d8c694ad6ef67p-4,
                                       0x1.608d54125178dp-2,  0x1.f73ca9c331400p-3};
    model_t *tiny = create("tiny"), *small = create("small");
    model_kv_t kv;
    void *scratch = malloc(model_scratch_size(small));
    double state[512];
    uint64_t digest = 0;

    ck_assert_int_eq(model_kv_heap_alloc(tiny, 3, &kv), SLOTD_OK);
    for (uint32_t t = 0; t < 3; t++) {
        model_run(tiny, &kv, t, scratch);
    }
    ck_assert_uint_eq(model_pick_raw(tiny, &kv, state), 4);
    ck_assert_mem_eq(state, tiny_want, sizeof(tiny_want));
    model_kv_heap_free(&kv);

    ck_assert_int_eq(model_kv_heap_alloc(small, 40, &kv), SLOTD_OK);
    for (uint32_t t = 1; t <= 40; t++) {
        model_run(small, &kv, t, scratch);
    }
    ck_assert_uint_eq(model_pick_raw(small, &kv, state), 241);
    for (int c = 0; c < 512; c++) {
        uint64_t b;
        memcpy(&b, &state[c], sizeof(b));
        digest = digest * 31 + b;
    }
    ck_assert_uint_eq(digest, UINT64_C(0xccc82e219e2632dc));
    ck_assert(state[0] == 0x1.125265de289eep-1);
    ck_assert(state[511] == -0x1.3120c104764c7p-4);
    ck_assert_uint_eq(model_pick(small, &kv, NULL), 241);
    ck_assert_uint_eq(model_rows(small), 160);
    model_kv_heap_free(&kv);
    free(scratch);
    model_destroy(tiny);
    model_destroy(small);
}
END_TEST

/* The weight stream of docs/models.md, drawn here by hand, against the model's. */
START_TEST(test_weights_order)
{
    model_t *m = create("tiny");
    const uint64_t s = 1, step = UINT64_C(0x9E3779B97F4A7C15);
    size_t v = 6, d = 8, ctx = 8, l = 2;
    size_t total = v * d + ctx * d + l * 4 * d * d + d * v;

    for (size_t i = 0; i < total; i++) {
        uint64_t draw = model__mix64(s + i * step);
        double scale = i < v * d + ctx * d ? 1.0 : 1.0 / sqrt(8.0);
        double w = (2.0 * ((double)(draw >> 11) * 0x1p-53) - 1.0) * scale;
        ck_assert_mem_eq(&m->weights[i], &w, sizeof(w));
    }
    ck_assert_ptr_eq(m->pos, m->emb + v * d);
    ck_assert_ptr_eq(m->layer, m->pos + ctx * d);
    ck_assert_ptr_eq(m->unemb, m->layer + l * 4 * d * d);
    model_destroy(m);
}
END_TEST

/* ---- Shapes and accessors ---- */

START_TEST(test_accessors)
{
    static const struct {
        const char *name;
        model_family_t family;
        uint32_t vocab, max_ctx, layers, per;
        size_t entry, state, scratch;
    } want[] = {
        {"hash", MODEL_FAMILY_HASH, 1000, 4096, 1, 254, 8, 8, 0},
        {"tiny", MODEL_FAMILY_ATTN, 6, 8, 2, 2, 2 * 2 * 8 * 8, 8 * 8, (5 * 8 + 8) * 8},
        {"small", MODEL_FAMILY_ATTN, 512, 1024, 4, 16, 2 * 4 * 64 * 8, 64 * 8,
         (6 * 64 * 64 + 1024 + 64 * 64 + 64 * 64) * 8},
        {"base", MODEL_FAMILY_ATTN, 4096, 4096, 8, 16, 2 * 8 * 256 * 8, 256 * 8,
         (6 * 64 * 256 + 4096 + 64 * 64 + 64 * 64) * 8},
    };
    model_t *m = NULL;

    ck_assert_str_eq(model_presets(), "hash,tiny,small,base");
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        m = create(want[i].name);
        ck_assert_str_eq(model_name(m), want[i].name);
        ck_assert_int_eq(model_family(m), want[i].family);
        ck_assert_uint_eq(model_vocab(m), want[i].vocab);
        ck_assert_uint_eq(model_max_ctx(m), want[i].max_ctx);
        ck_assert_uint_eq(model_layers(m), want[i].layers);
        ck_assert_uint_eq(model_block_positions(m), want[i].per);
        ck_assert_uint_eq(model_entry_size(m), want[i].entry);
        ck_assert_uint_eq(model_block_bytes(m), 16 + want[i].per * want[i].entry);
        ck_assert_uint_eq(model_block_bytes_for(m, 3), 16 + 3 * want[i].entry);
        ck_assert_uint_eq(model_state_size(m), want[i].state);
        ck_assert_uint_eq(model_scratch_size(m), want[i].scratch);
        ck_assert_uint_eq(model_g_calls(m), 0);
        ck_assert_uint_eq(model_rows(m), 0);
        model_destroy(m);
    }
    m = (model_t *)1;
    ck_assert_int_eq(model_create("huge", &m), SLOTD_EINVAL);
    ck_assert_ptr_null(m);
    ck_assert_int_eq(model_create("", &m), SLOTD_EINVAL);
    ck_assert_int_eq(model_create(NULL, &m), SLOTD_EINVAL);
    model_destroy(NULL);
}
END_TEST

/* ---- Work counts ---- */

START_TEST(test_rows_formulas)
{
    static const char *names[] = {"hash", "tiny", "small"};

    for (size_t i = 0; i < 3; i++) {
        model_t *m = create(names[i]);
        uint64_t l = model_layers(m), rows, before;
        int64_t tok[20];
        uint32_t out[40];
        double *logits = malloc(20 * model_vocab(m) * sizeof(double));
        size_t maxn = model_family(m) == MODEL_FAMILY_HASH ? 20 : 8;

        for (size_t k = 0; k < 20; k++) {
            tok[k] = (int64_t)((k * 7 + 1) % model_vocab(m));
        }
        for (size_t n = 1; n <= maxn; n++) {
            for (int64_t steps = 0; (size_t)steps + n <= maxn; steps++) {
                uint64_t sum = 0;
                for (int64_t k = 0; k < steps; k++) {
                    sum += n + (uint64_t)k;
                }
                before = work(m);
                rows = 12345;
                ck_assert_int_eq(
                    model_generate(m, tok, n, steps, true, NULL, NULL, out, logits, &rows, NULL),
                    SLOTD_OK);
                ck_assert_uint_eq(rows, steps == 0 ? 0 : l * (n + (uint64_t)steps - 1));
                ck_assert_uint_eq(work(m) - before, rows);

                before = work(m);
                rows = 12345;
                ck_assert_int_eq(
                    model_generate(m, tok, n, steps, false, NULL, NULL, out, logits, &rows, NULL),
                    SLOTD_OK);
                ck_assert_uint_eq(rows, l * sum);
                ck_assert_uint_eq(work(m) - before, rows);
                for (size_t k = 0; k < n; k++) {
                    ck_assert_uint_eq(out[k], (uint32_t)tok[k]);
                }
            }
            if (model_family(m) == MODEL_FAMILY_ATTN) {
                before = model_rows(m);
                ck_assert_int_eq(model_logits(m, tok, n, NULL, NULL, logits, &rows, NULL),
                                 SLOTD_OK);
                ck_assert_uint_eq(rows, l * n);
                ck_assert_uint_eq(model_rows(m) - before, rows);
                ck_assert_uint_eq(model_g_calls(m), 0);
            } else {
                ck_assert_uint_eq(model_rows(m), 0);
            }
        }
        free(logits);
        model_destroy(m);
    }
}
END_TEST

/* ---- Validation ---- */

static void expect_error(int rc, const slotd_error_t *err, int code, const char *field)
{
    ck_assert_int_eq(rc, code);
    ck_assert_int_eq(err->code, code);
    ck_assert_msg(strstr(err->message, field) != NULL, "message '%s' does not name '%s'",
                  err->message, field);
}

START_TEST(test_validation)
{
    model_t *tiny = create("tiny"), *hash = create("hash");
    int64_t ok[8] = {0, 1, 2, 3, 4, 5, 0, 1}, nine[9] = {0};
    int64_t neg[] = {1, -1}, big[] = {0, 6}, huge[] = {INT64_MAX};
    uint32_t out[16];
    double logits[64];
    uint64_t rows;
    slotd_error_t err;

    /* Prompts. */
    ck_assert_int_eq(model_check_prompt(tiny, ok, 8, &err), SLOTD_OK);
    ck_assert_int_eq(model_check_prompt(tiny, ok, 1, NULL), SLOTD_OK);
    expect_error(model_check_prompt(tiny, ok, 0, &err), &err, SLOTD_EBAD_REQUEST, "prompt");
    expect_error(model_check_prompt(tiny, neg, 2, &err), &err, SLOTD_EBAD_REQUEST, "prompt");
    expect_error(model_check_prompt(tiny, big, 2, &err), &err, SLOTD_EBAD_REQUEST, "prompt");
    expect_error(model_check_prompt(tiny, huge, 1, &err), &err, SLOTD_EBAD_REQUEST, "prompt");
    expect_error(model_check_prompt(tiny, nine, 9, &err), &err, SLOTD_ETOO_LONG, "length");
    ck_assert_int_eq(model_check_prompt(tiny, nine, 9, NULL), SLOTD_ETOO_LONG);
    ck_assert_int_eq(model_check_prompt(hash, big, 2, &err), SLOTD_OK);

    /* Tokens, steps, length. */
    ck_assert_int_eq(model_check_generate(tiny, ok, 3, 5, &err), SLOTD_OK);
    ck_assert_int_eq(model_check_generate(tiny, ok, 8, 0, &err), SLOTD_OK);
    expect_error(model_check_generate(tiny, ok, 0, 1, &err), &err, SLOTD_EBAD_REQUEST, "tokens");
    expect_error(model_check_generate(tiny, neg, 2, 1, &err), &err, SLOTD_EBAD_REQUEST, "tokens");
    expect_error(model_check_generate(tiny, big, 2, 1, &err), &err, SLOTD_EBAD_REQUEST, "tokens");
    expect_error(model_check_generate(tiny, ok, 3, -1, &err), &err, SLOTD_EBAD_REQUEST, "steps");
    expect_error(model_check_generate(tiny, ok, 3, INT64_MIN, &err), &err, SLOTD_EBAD_REQUEST,
                 "steps");
    expect_error(model_check_generate(tiny, ok, 3, 6, &err), &err, SLOTD_ETOO_LONG, "length");
    expect_error(model_check_generate(tiny, ok, 8, 1, &err), &err, SLOTD_ETOO_LONG, "length");
    expect_error(model_check_generate(tiny, nine, 9, 0, &err), &err, SLOTD_ETOO_LONG, "length");
    expect_error(model_check_generate(tiny, ok, 1, INT64_MAX, &err), &err, SLOTD_ETOO_LONG,
                 "length");
    /* The first error met: a bad token before a bad step count or length. */
    expect_error(model_check_generate(tiny, big, 2, -1, &err), &err, SLOTD_EBAD_REQUEST, "tokens");
    expect_error(model_check_generate(tiny, ok, 3, -7, &err), &err, SLOTD_EBAD_REQUEST, "steps");

    /* The operations validate the same way and do no work on an error. */
    expect_error(model_generate(tiny, ok, 0, 1, true, NULL, NULL, out, logits, &rows, &err), &err,
                 SLOTD_EBAD_REQUEST, "tokens");
    expect_error(model_generate(tiny, ok, 3, -1, false, NULL, NULL, out, logits, &rows, &err), &err,
                 SLOTD_EBAD_REQUEST, "steps");
    expect_error(model_generate(tiny, ok, 3, 6, true, NULL, NULL, out, logits, &rows, &err), &err,
                 SLOTD_ETOO_LONG, "length");
    expect_error(model_generate(hash, big, 2, 4095, true, NULL, NULL, out, NULL, &rows, &err), &err,
                 SLOTD_ETOO_LONG, "length");
    expect_error(model_logits(tiny, ok, 0, NULL, NULL, logits, &rows, &err), &err,
                 SLOTD_EBAD_REQUEST, "tokens");
    expect_error(model_logits(tiny, neg, 2, NULL, NULL, logits, &rows, &err), &err,
                 SLOTD_EBAD_REQUEST, "tokens");
    expect_error(model_logits(tiny, nine, 9, NULL, NULL, logits, &rows, &err), &err,
                 SLOTD_ETOO_LONG, "length");
    expect_error(model_logits(hash, ok, 3, NULL, NULL, logits, &rows, &err), &err,
                 SLOTD_EBAD_REQUEST, "model");
    ck_assert_uint_eq(model_rows(tiny), 0);
    ck_assert_uint_eq(model_g_calls(hash), 0);

    /* Generate works for hash, and leaves `logits` alone there. */
    for (size_t i = 0; i < 64; i++) {
        logits[i] = 42.0;
    }
    ck_assert_int_eq(model_generate(hash, big, 2, 3, true, NULL, NULL, out, logits, &rows, &err),
                     SLOTD_OK);
    for (size_t i = 0; i < 64; i++) {
        ck_assert(logits[i] == 42.0);
    }
    model_destroy(tiny);
    model_destroy(hash);
}
END_TEST

/* ---- Cached against uncached ---- */

/* Runs one random case both ways and compares tokens and logits bit for
 * bit; the cached way also on a caller's chain with room for exactly
 * n + steps positions. */
static void compare_case(const model_t *m, size_t n, int64_t steps)
{
    size_t v = model_vocab(m), total = n + (size_t)steps;
    int64_t *tok = malloc(n * sizeof(*tok));
    uint32_t *out_c = malloc(total * sizeof(uint32_t)), *out_u = malloc(total * sizeof(uint32_t));
    uint32_t *out_k = malloc(total * sizeof(uint32_t));
    double *lg_c = calloc((size_t)steps * v + 1, sizeof(double));
    double *lg_u = calloc((size_t)steps * v + 1, sizeof(double));
    double *lg_k = calloc((size_t)steps * v + 1, sizeof(double));
    void *scratch = malloc(model_scratch_size(m) + 1);
    uint64_t rows_c, rows_u, rows_k, before;
    model_kv_t kv;

    for (size_t i = 0; i < n; i++) {
        tok[i] = rng_below((uint32_t)v);
    }
    before = work(m);
    ck_assert_int_eq(model_generate(m, tok, n, steps, true, NULL, NULL, out_c, lg_c, &rows_c, NULL),
                     SLOTD_OK);
    ck_assert_int_eq(
        model_generate(m, tok, n, steps, false, NULL, NULL, out_u, lg_u, &rows_u, NULL), SLOTD_OK);
    ck_assert_int_eq(model_kv_heap_alloc(m, (uint32_t)total, &kv), SLOTD_OK);
    ck_assert_int_eq(
        model_generate(m, tok, n, steps, true, &kv, scratch, out_k, lg_k, &rows_k, NULL), SLOTD_OK);
    ck_assert_uint_eq(work(m) - before, rows_c + rows_u + rows_k);
    ck_assert_uint_eq(rows_k, rows_c);
    ck_assert_uint_eq(kv.len, steps == 0 ? 0 : total - 1);
    model_kv_heap_free(&kv);

    ck_assert_mem_eq(out_c, out_u, total * sizeof(uint32_t));
    ck_assert_mem_eq(out_c, out_k, total * sizeof(uint32_t));
    ck_assert_mem_eq(lg_c, lg_u, (size_t)steps * v * sizeof(double));
    ck_assert_mem_eq(lg_c, lg_k, (size_t)steps * v * sizeof(double));
    free(tok);
    free(out_c);
    free(out_u);
    free(out_k);
    free(lg_c);
    free(lg_u);
    free(lg_k);
    free(scratch);
}

START_TEST(test_cached_equals_uncached)
{
    static const struct {
        const char *name;
        int cases;
        uint32_t max_total;
    } runs[] = {{"hash", 300, 300}, {"tiny", 400, 8}, {"small", 12, 40}};

    rng_state = 12345;
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        model_t *m = create(runs[i].name);
        for (int c = 0; c < SLOTD_TEST_SCALED(runs[i].cases); c++) {
            size_t total = 1 + rng_below(runs[i].max_total);
            size_t n = 1 + rng_below((uint32_t)total);
            compare_case(m, n, (int64_t)(total - n));
        }
        model_destroy(m);
    }
}
END_TEST

/* The unrounded state after each position of a cached run equals the state
 * of a fresh chain that reruns the same prefix: every bit, every prefix. */
START_TEST(test_state_every_prefix)
{
    static const char *names[] = {"hash", "tiny", "small"};

    rng_state = 777;
    for (size_t i = 0; i < 3; i++) {
        model_t *m = create(names[i]);
        uint32_t len = model_family(m) == MODEL_FAMILY_HASH ? 200 : model_max_ctx(m) < 48 ? 8 : 48;
        uint32_t *tok = malloc(len * sizeof(uint32_t));
        void *scratch = malloc(model_scratch_size(m) + 1);
        model_kv_t inc, fresh;

        ck_assert_int_eq(model_kv_heap_alloc(m, len, &inc), SLOTD_OK);
        ck_assert_int_eq(model_kv_heap_alloc(m, len, &fresh), SLOTD_OK);
        for (uint32_t p = 0; p < len; p++) {
            tok[p] = rng_below(model_vocab(m));
            model_run(m, &inc, tok[p], scratch);
            model_kv_rewind(&fresh);
            for (uint32_t q = 0; q <= p; q++) {
                model_run(m, &fresh, tok[q], scratch);
            }
            ck_assert_mem_eq(inc.state, fresh.state, model_state_size(m));
            ck_assert_uint_eq(model_pick(m, &inc, NULL), model_pick(m, &fresh, NULL));
        }
        model_kv_heap_free(&inc);
        model_kv_heap_free(&fresh);
        free(tok);
        free(scratch);
        model_destroy(m);
    }
}
END_TEST

/* ---- Chains ---- */

START_TEST(test_hash_blocks)
{
    model_t *m = create("hash");
    uint32_t total = 2000;
    model_kv_t kv;
    uint64_t sum = 0;

    ck_assert_int_eq(model_kv_heap_alloc(m, total, &kv), SLOTD_OK);
    ck_assert_uint_eq(kv.len, 0);
    ck_assert_ptr_eq(kv.tail, kv.head);
    for (uint32_t p = 0; p < total; p++) {
        model_block_t *b = kv.tail;
        uint32_t t = (p * 37 + 11) % 1000;
        ck_assert_uint_eq((uintptr_t)b % 64, 0);
        model_run(m, &kv, t, NULL);
        sum += model__hash_g(t, p);
        ck_assert_uint_eq(((const uint64_t *)(const void *)b->data)[p - b->first],
                          model__hash_g(t, p));
        ck_assert_uint_eq(*(const uint64_t *)kv.state, sum);
        ck_assert_uint_eq(model_pick(m, &kv, NULL), sum % 1000);
        ck_assert_uint_eq(kv.len, p + 1);
        if (p + 1 - b->first == b->capacity) {
            ck_assert_ptr_eq(kv.tail, b->next);
        } else {
            ck_assert_ptr_eq(kv.tail, b);
        }
    }
    ck_assert(kv.tail == NULL ||
              (kv.tail->first <= total && total - kv.tail->first < kv.tail->capacity));
    ck_assert_uint_eq(model_g_calls(m), total);
    /* Rewound, the chain is reused and position 0 overwrites the state. */
    model_kv_rewind(&kv);
    ck_assert_uint_eq(kv.len, 0);
    ck_assert_ptr_eq(kv.tail, kv.head);
    model_run(m, &kv, 5, NULL);
    ck_assert_uint_eq(*(const uint64_t *)kv.state, model__hash_g(5, 0));
    model_kv_heap_free(&kv);
    ck_assert_ptr_null(kv.head);
    model_destroy(m);
}
END_TEST

/* attn K/V land where the layout comment of attn.c says: K transposed, V
 * row major, per layer; a chain of several blocks. */
START_TEST(test_attn_blocks)
{
    model_t *m = create("small");
    uint32_t total = 230, d = 64, l = 4;
    void *scratch = malloc(model_scratch_size(m));
    double *x = scratch, *k = x + 2 * d;
    model_kv_t kv;
    int64_t tok[230];
    double logits[2][512];
    uint64_t rows;
    bool seen[32] = {false};
    uint32_t nb = 0;

    ck_assert_int_eq(model_kv_heap_alloc(m, total, &kv), SLOTD_OK);
    for (uint32_t p = 0; p < total; p++) {
        model_block_t *b = kv.tail;
        const double *data = (const double *)(const void *)b->data;
        tok[p] = (p * 101 + 3) % 512;
        const uint32_t per = b->capacity, slot = p - b->first;
        ck_assert_uint_eq(b->capacity, model_block_capacity(m, nb));
        model_run(m, &kv, (uint32_t)tok[p], scratch);
        /* The last layer's k is still in scratch: its transposed copy. */
        for (uint32_t j = 0; j < d; j++) {
            const double *kt = data + (size_t)(l - 1) * 2 * per * d;
            ck_assert_mem_eq(&kt[(size_t)j * per + slot], &k[j], sizeof(double));
        }
        ck_assert_ptr_eq(kv.tail, slot + 1 == per ? b->next : b);
        if (slot + 1 == per) {
            ck_assert(b->next == NULL || b->next->first == p + 1);
            seen[per < 32 ? per : 0] = true;
            nb++;
        }
    }
    /* The run crossed blocks of every capacity small's chains use. */
    for (uint32_t i = 0; i < model_chain_blocks(m, total, 1, NULL); i++) {
        ck_assert(seen[model_block_capacity(m, i)]);
    }
    ck_assert_uint_eq(kv.len, total);
    ck_assert_uint_eq(model_rows(m), (uint64_t)l * total);
    model_pick(m, &kv, logits[0]);
    model_kv_heap_free(&kv);

    /* The same logits from model_logits on a caller's chain, left holding
     * every position. */
    ck_assert_int_eq(model_kv_heap_alloc(m, total, &kv), SLOTD_OK);
    ck_assert_int_eq(model_logits(m, tok, total, &kv, scratch, logits[1], &rows, NULL), SLOTD_OK);
    ck_assert_uint_eq(rows, (uint64_t)l * total);
    ck_assert_uint_eq(kv.len, total);
    ck_assert_mem_eq(logits[0], logits[1], sizeof(logits[0]));
    model_kv_heap_free(&kv);
    free(scratch);
    model_destroy(m);
}
END_TEST

/* Cached equals uncached across block boundaries of every capacity a
 * chain uses: hash past its blocks of 30 and into 62 and 126; small past
 * 1, 2, 4, 8 and two blocks of 16 (which start at 157); tiny over its
 * whole context.  Few steps after a long prompt keep the uncached runs
 * short while every attention row spans every block size. */
START_TEST(test_cached_equals_uncached_across_blocks)
{
    static const struct {
        const char *name;
        size_t n;
        int64_t steps;
    } runs[] = {{"hash", 1500, 60}, {"small", 178, 4}, {"tiny", 1, 7}, {"tiny", 3, 5}};

    rng_state = 4242;
    for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
        model_t *m = create(runs[i].name);
        uint32_t total = (uint32_t)(runs[i].n + (size_t)runs[i].steps);
        bool seen[512] = {false};

        /* The premise: the run crosses every capacity the plan uses up to it. */
        for (uint32_t b = 0; b < model_chain_blocks(m, total, 1, NULL); b++) {
            seen[model_block_capacity(m, b)] = true;
        }
        for (uint32_t b = 0; b < model_chain_blocks(m, model_max_ctx(m), 1, NULL); b++) {
            uint32_t cap = model_block_capacity(m, b);
            ck_assert_msg(seen[cap] || cap >= 64 || model_family(m) == MODEL_FAMILY_HASH,
                          "%s: capacity %u not crossed", runs[i].name, cap);
        }
        compare_case(m, runs[i].n, runs[i].steps);
        model_destroy(m);
    }
}
END_TEST

/* Builds a heap chain by hand whose blocks have the capacities
 * caps[0], caps[1], ... (the last repeated) up to `positions`. */
static model_block_t *chain_by_hand(const model_t *m, const uint32_t *caps, size_t ncaps,
                                    uint32_t positions)
{
    model_block_t *head = NULL, **link = &head;
    uint32_t room = 0;

    for (size_t i = 0; room < positions; i++) {
        uint32_t cap = caps[i < ncaps ? i : ncaps - 1];
        model_block_t *b = aligned_alloc(64, (model_block_bytes_for(m, cap) + 63) / 64 * 64);
        ck_assert_ptr_nonnull(b);
        b->next = NULL;
        b->capacity = cap;
        b->first = room;
        *link = b;
        link = &b->next;
        room += cap;
    }
    return head;
}

static void chain_free(model_block_t *b)
{
    while (b != NULL) {
        model_block_t *next = b->next;
        free(b);
        b = next;
    }
}

/* The kernel's results do not depend on how the chain is cut: the same
 * tokens run on chains of blocks of 1, of 3, of mixed odd sizes, of 9, of
 * 16, and of one block holding everything give the same state, entries'
 * picks and unrounded logits, bit for bit, after every position.  Every
 * sum keeps its one order whatever the blocks. */
START_TEST(test_any_block_layout)
{
    static const uint32_t c1[] = {1}, c3[] = {3}, cmix[] = {1, 5, 2, 7, 1, 13, 4, 9, 11},
                          c9[] = {9}, c16[] = {16}, call[] = {100};
    static const struct {
        const uint32_t *caps;
        size_t n;
    } layouts[] = {{c1, 1}, {c3, 1}, {cmix, 9}, {c9, 1}, {c16, 1}, {call, 1}};
    static const char *names[] = {"small", "tiny", "hash"};

    rng_state = 99;
    for (size_t mi = 0; mi < 3; mi++) {
        model_t *m = create(names[mi]);
        /* Under valgrind 40 positions: still two and a half blocks of 16. */
        uint32_t most = SLOTD_UNDER_VALGRIND() ? 40 : 100;
        uint32_t len = model_max_ctx(m) < most ? model_max_ctx(m) : most;
        size_t v = model_vocab(m), ssz = model_state_size(m);
        void *scratch = malloc(model_scratch_size(m) + 1);
        double *want = malloc(v * sizeof(double)), *got = malloc(v * sizeof(double));
        unsigned char *want_state = malloc(ssz);
        uint32_t tok[100];
        model_kv_t ref;

        for (uint32_t p = 0; p < len; p++) {
            tok[p] = rng_below((uint32_t)v);
        }
        /* The reference: the model's own planned chain. */
        ck_assert_int_eq(model_kv_heap_alloc(m, len, &ref), SLOTD_OK);
        for (size_t li = 0; li < sizeof(layouts) / sizeof(layouts[0]); li++) {
            model_kv_t kv = {0};
            kv.head = kv.tail = chain_by_hand(m, layouts[li].caps, layouts[li].n, len);
            kv.state = malloc(ssz);
            model_kv_rewind(&ref);
            for (uint32_t p = 0; p < len; p++) {
                model_run(m, &ref, tok[p], scratch);
                memcpy(want_state, ref.state, ssz);
                uint32_t pw = model_pick_raw(m, &ref, want);
                model_run(m, &kv, tok[p], scratch);
                ck_assert_uint_eq(model_pick_raw(m, &kv, got), pw);
                ck_assert_mem_eq(kv.state, want_state, ssz);
                if (model_family(m) == MODEL_FAMILY_ATTN) {
                    ck_assert_mem_eq(got, want, v * sizeof(double));
                }
            }
            chain_free(kv.head);
            free(kv.state);
        }
        model_kv_heap_free(&ref);
        free(scratch);
        free(want);
        free(got);
        free(want_state);
        model_destroy(m);
    }
}
END_TEST

/* The memory bound of model.h, from the plan alone: a chain of E entries
 * (the blocks model_chain_blocks() gives, each rounded to 64 bytes) plus
 * the state rounded to 64 bytes is at most 1.10 x E x entry size + 512
 * bytes, for every E up to max_ctx and every preset.  The pool's own
 * figures are checked against the same bound in test_cache. */
START_TEST(test_block_plan_bound)
{
    static const char *names[] = {"hash", "tiny", "small", "base"};

    for (size_t i = 0; i < 4; i++) {
        model_t *m = create(names[i]);
        uint64_t es = model_entry_size(m), state = (model_state_size(m) + 63) / 64 * 64;
        uint32_t prev_blocks = 0, room = 0;

        ck_assert_uint_eq(model_block_capacity(m, 0), model_block_capacity(m, 0));
        for (uint32_t e = 1; e <= model_max_ctx(m); e++) {
            size_t bytes = 0;
            uint32_t nb = model_chain_blocks(m, e, 64, &bytes);
            ck_assert_msg(10 * (state + bytes) <= 11 * e * es + 5120,
                          "%s: %u entries hold %zu bytes", names[i], e, state + bytes);
            /* A chain only grows: one more entry takes at most one block. */
            ck_assert_uint_le(nb - prev_blocks, 1);
            if (nb > prev_blocks) {
                room += model_block_capacity(m, nb - 1);
            }
            ck_assert_uint_ge(room, e);
            ck_assert_uint_le(model_block_capacity(m, nb - 1), model_block_positions(m));
            prev_blocks = nb;
        }
        /* The exact byte count: header plus entries per block. */
        {
            size_t exact = 0;
            uint32_t nb = model_chain_blocks(m, model_max_ctx(m), 1, &exact);
            size_t want = 0;
            for (uint32_t b = 0; b < nb; b++) {
                want += 16 + model_block_capacity(m, b) * es;
            }
            ck_assert_uint_eq(exact, want);
            ck_assert_uint_eq(model_block_capacity(m, nb + 5), model_block_capacity(m, nb - 1));
        }
        model_destroy(m);
    }
}
END_TEST

/* A full tiny context, and a hash generate across many blocks, with
 * chains sized exactly. */
START_TEST(test_full_context)
{
    model_t *tiny = create("tiny"), *hash = create("hash");
    int64_t tok[8] = {5, 4, 3, 2, 1, 0, 1, 2};
    uint32_t out[4096];
    double logits[8 * 6];
    uint64_t rows;
    int64_t *htok = malloc(4000 * sizeof(int64_t));
    model_kv_t kv;

    ck_assert_int_eq(model_logits(tiny, tok, 8, NULL, NULL, logits, &rows, NULL), SLOTD_OK);
    ck_assert_uint_eq(rows, 16);
    ck_assert_int_eq(model_generate(tiny, tok, 1, 7, true, NULL, NULL, out, logits, &rows, NULL),
                     SLOTD_OK);
    ck_assert_uint_eq(rows, 14);

    for (size_t i = 0; i < 4000; i++) {
        htok[i] = (int64_t)((i * 31) % 1000);
    }
    ck_assert_int_eq(model_kv_heap_alloc(hash, 4096, &kv), SLOTD_OK);
    ck_assert_int_eq(model_generate(hash, htok, 4000, 96, true, &kv, NULL, out, NULL, &rows, NULL),
                     SLOTD_OK);
    ck_assert_uint_eq(rows, 4095);
    ck_assert_uint_eq(kv.len, 4095);
    {
        uint64_t sum = 0;
        for (uint32_t p = 0; p < 4096; p++) {
            if (p >= 4000) {
                ck_assert_uint_eq(out[p], sum % 1000);
            }
            sum += model__hash_g(out[p], p);
        }
    }
    model_kv_heap_free(&kv);
    free(htok);
    model_destroy(tiny);
    model_destroy(hash);
}
END_TEST

/* ---- Threads ---- */

#define N_THREADS 4
#define PER_THREAD 20

typedef struct worker_arg {
    const model_t *m;
    uint32_t out[PER_THREAD][16];
    uint64_t rows;
} worker_arg_t;

static void *worker(void *p)
{
    worker_arg_t *w = p;

    for (int i = 0; i < PER_THREAD; i++) {
        int64_t tok[] = {i % 6, (i / 6) % 6};
        uint64_t rows;
        ck_assert_int_eq(
            model_generate(w->m, tok, 2, 6, true, NULL, NULL, w->out[i], NULL, &rows, NULL),
            SLOTD_OK);
        w->rows += rows;
    }
    return NULL;
}

START_TEST(test_threads)
{
    model_t *m = create("tiny");
    static worker_arg_t args[N_THREADS];
    pthread_t th[N_THREADS];
    uint64_t sum = 0;

    for (int i = 0; i < N_THREADS; i++) {
        memset(&args[i], 0, sizeof(args[i]));
        args[i].m = m;
        ck_assert_int_eq(pthread_create(&th[i], NULL, worker, &args[i]), 0);
    }
    for (int i = 0; i < N_THREADS; i++) {
        ck_assert_int_eq(pthread_join(th[i], NULL), 0);
        sum += args[i].rows;
        ck_assert_mem_eq(args[i].out, args[0].out, sizeof(args[0].out));
    }
    ck_assert_uint_eq(sum, (uint64_t)N_THREADS * PER_THREAD * 2 * 7);
    ck_assert_uint_eq(model_rows(m), sum);
    model_destroy(m);
}
END_TEST

/* The greedy pick: the largest unrounded logit, the lowest index on a
 * tie; the logits written are the unrounded ones rounded.  U is replaced
 * by the identity (8 x 6), so that the logits are the state's first six
 * values (an exact sum: every other term is a zero). */
START_TEST(test_pick_ties)
{
    model_t *m = create("tiny");
    double state[8] = {0}, out[6], raw[6], unit[8 * 6] = {0};
    const double *saved = m->unemb;
    model_kv_t kv = {.len = 1, .state = state};
    static const struct {
        double s[6];
        uint32_t want;
    } cases[] = {
        {{1, 3, 3, 0, 2, 3}, 1},          {{-1, -1, -1, -1, -1, -1}, 0},
        {{0, 0, 0, 0, 0, 0x1p-60}, 5},    {{0.3000004, 0.3000001, 0.3, 0.3000004, 0, 0}, 0},
        {{-0.0, 0.0, -5, -5, -5, -5}, 0}, {{-7, 0.0, -0.0, -5, 0x1p-1074, -5}, 4},
    };

    for (int c = 0; c < 6; c++) {
        unit[c * 6 + c] = 1.0;
    }
    m->unemb = unit;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memcpy(state, cases[i].s, sizeof(cases[i].s));
        ck_assert_uint_eq(model_pick(m, &kv, out), cases[i].want);
        ck_assert_uint_eq(model_pick(m, &kv, NULL), cases[i].want);
        ck_assert_uint_eq(model_pick_raw(m, &kv, raw), cases[i].want);
        for (int c = 0; c < 6; c++) {
            double r = model_round6(raw[c]);
            ck_assert(raw[c] == state[c]);
            ck_assert_mem_eq(&out[c], &r, sizeof(r));
        }
    }
    m->unemb = saved;
    ck_assert_uint_eq(model_rows(m), 0);
    model_destroy(m);
}
END_TEST

/* ---- Allocation failure ---- */

/* Fails the k-th allocation for k = 1, 2, ... until the call needs fewer:
 * each failure is SLOTD_ENOMEM, leaks nothing (the sanitizer and valgrind
 * runs see to that) and does no work. */
/* A model made in two parts (the shape, then the weights) is the model
 * model_create() makes: the same accessors before its weights exist, the
 * same tokens and logits bit for bit after; a failed build leaves it
 * without weights and may be retried.  The names come from the table
 * (model_preset_name()) and agree with model_presets(). */
START_TEST(test_shape_then_build)
{
    char joined[64] = "";
    size_t i;

    for (i = 0; model_preset_name(i) != NULL; i++) {
        const char *name = model_preset_name(i);
        model_t *whole = create(name), *m = NULL;
        int64_t tok[] = {1, 2, 3};
        uint32_t out_a[6], out_b[6];
        double la[3 * 4096], lb[3 * 4096];
        uint64_t rows_a, rows_b;
        slotd_error_t err;
        int rc;

        if (i > 0)
            strcat(joined, ",");
        strcat(joined, name);
        ck_assert_int_eq(model_create_shape(name, &m), SLOTD_OK);
        ck_assert(!model_built(m));
        ck_assert(model_built(whole));
        ck_assert_str_eq(model_name(m), name);
        ck_assert_uint_eq(model_max_ctx(m), model_max_ctx(whole));
        ck_assert_uint_eq(model_entry_size(m), model_entry_size(whole));
        ck_assert_uint_eq(model_state_size(m), model_state_size(whole));
        ck_assert_uint_eq(model_scratch_size(m), model_scratch_size(whole));
        ck_assert_uint_eq(model_block_positions(m), model_block_positions(whole));
        for (uint32_t b = 0; b < 300; b++)
            ck_assert_uint_eq(model_block_capacity(m, b), model_block_capacity(whole, b));

        if (model_family(m) == MODEL_FAMILY_ATTN) {
            model__alloc_fail_in = 1;
            ck_assert_int_eq(model_build(m), SLOTD_ENOMEM);
            model__alloc_fail_in = 0;
            ck_assert(!model_built(m));
        }
        ck_assert_int_eq(model_build(m), SLOTD_OK);
        ck_assert(model_built(m));
        ck_assert_int_eq(model_build(m), SLOTD_OK); /* once */

        rc = model_generate(whole, tok, 3, 3, true, NULL, NULL, out_a, la, &rows_a, &err);
        ck_assert_int_eq(rc, SLOTD_OK);
        rc = model_generate(m, tok, 3, 3, true, NULL, NULL, out_b, lb, &rows_b, &err);
        ck_assert_int_eq(rc, SLOTD_OK);
        ck_assert_mem_eq(out_a, out_b, sizeof(out_a));
        ck_assert_uint_eq(rows_a, rows_b);
        if (model_family(m) == MODEL_FAMILY_ATTN)
            ck_assert_mem_eq(la, lb, 3 * model_vocab(m) * sizeof(double));
        model_destroy(m);
        model_destroy(whole);
    }
    ck_assert_uint_eq(i, 4);
    ck_assert_str_eq(joined, model_presets());
    ck_assert_int_eq(model_create_shape("huge", &(model_t *){NULL}), SLOTD_EINVAL);
}
END_TEST

START_TEST(test_alloc_failure)
{
    static const char *names[] = {"hash", "tiny", "small"};
    int k;

    for (size_t i = 0; i < 3; i++) {
        model_t *m = NULL;
        int64_t tok[] = {1, 2, 3};
        uint32_t out[8];
        double logits[5 * 512];
        uint64_t rows;
        slotd_error_t err;
        model_kv_t kv;
        int rc;

        for (k = 1;; k++) {
            model__alloc_fail_in = k;
            rc = model_create(names[i], &m);
            if (rc == SLOTD_OK) {
                break;
            }
            ck_assert_int_eq(rc, SLOTD_ENOMEM);
            ck_assert_ptr_null(m);
        }
        model__alloc_fail_in = 0;
        ck_assert_int_eq(k, model_family(m) == MODEL_FAMILY_HASH ? 2 : 3);

        for (k = 1;; k++) {
            model__alloc_fail_in = k;
            rc = model_kv_heap_alloc(m, 40, &kv);
            if (rc == SLOTD_OK) {
                break;
            }
            ck_assert_int_eq(rc, SLOTD_ENOMEM);
            ck_assert_ptr_null(kv.head);
            ck_assert_ptr_null(kv.state);
        }
        model__alloc_fail_in = 0;
        ck_assert_int_gt(k, 2);
        model_kv_heap_free(&kv);

        for (int cached = 0; cached <= 1; cached++) {
            for (k = 1;; k++) {
                model__alloc_fail_in = k;
                rc = model_generate(m, tok, 3, 5, cached, NULL, NULL, out, logits, &rows, &err);
                if (rc == SLOTD_OK) {
                    break;
                }
                ck_assert_int_eq(rc, SLOTD_ENOMEM);
                ck_assert_int_eq(err.code, SLOTD_ENOMEM);
                ck_assert_uint_eq(work(m), 0);
            }
            model__alloc_fail_in = 0;
            ck_assert_int_gt(k, 1);
            ck_assert_uint_eq(work(m), rows);
            model_destroy(m);
            ck_assert_int_eq(model_create(names[i], &m), SLOTD_OK);
        }
        if (model_family(m) == MODEL_FAMILY_ATTN) {
            for (k = 1;; k++) {
                model__alloc_fail_in = k;
                rc = model_logits(m, tok, 3, NULL, NULL, logits, &rows, &err);
                if (rc == SLOTD_OK) {
                    break;
                }
                ck_assert_int_eq(rc, SLOTD_ENOMEM);
                ck_assert_uint_eq(model_rows(m), 0);
            }
            model__alloc_fail_in = 0;
            ck_assert_int_gt(k, 2);
        }
        model_destroy(m);
    }
}
END_TEST

/* ---- model_round6 ---- */

static void check_round6(double x)
{
    char want[512], got[512];
    double r = model_round6(x), def;

    snprintf(want, sizeof(want), "%.6f", x);
    snprintf(got, sizeof(got), "%.6f", r);
    def = strtod(want, NULL);
    ck_assert_msg(strcmp(want, got) == 0, "round6(%a): printf gives %s, round6 prints %s", x, want,
                  got);
    if (isnan(x)) {
        ck_assert(isnan(r));
    } else {
        ck_assert_msg(memcmp(&r, &def, sizeof(r)) == 0, "round6(%a) = %a, strtod(\"%s\") = %a", x,
                      r, want, def);
    }
}

START_TEST(test_round6)
{
    static const double fixed[] = {0.0,
                                   -0.0,
                                   -1e-9,
                                   -4.9999999e-7,
                                   -5e-7,
                                   -5.000001e-7,
                                   5e-7,
                                   1e-300,
                                   -1e-300,
                                   0x1p-1074,
                                   -0x1p-1074,
                                   0.0000005,
                                   0.0078125,
                                   -0.0078125,
                                   0.0234375,
                                   1.0078125,
                                   -3.9921875,
                                   0.0000015,
                                   0.0000025,
                                   1.0000005,
                                   -2.5000005,
                                   0.1234565,
                                   -0.215893,
                                   123456.7890125,
                                   1099511.6277765,
                                   1099511.6277775,
                                   4503599627.3704965,
                                   1e15 + 0.3,
                                   -1e22,
                                   1e300,
                                   -1.7976931348623157e308,
                                   INFINITY,
                                   -INFINITY,
                                   NAN};

    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) {
        check_round6(fixed[i]);
    }
    rng_state = 99;
    for (int i = 0; i < SLOTD_TEST_SCALED(200000); i++) {
        uint64_t r = rng_next();
        double x;
        switch (i % 5) {
        case 0: /* uniform in (-4, 4): the logits' range */
            x = ((double)(r >> 11) * 0x1p-53 - 0.5) * 8.0;
            break;
        case 1: /* near a six-decimal halfway point, a few ulps either side */
            x = ((double)(int64_t)(r % 20000000) - 10000000.0 + 0.5) / 1e6;
            memcpy(&r, &x, sizeof(x));
            r += (uint64_t)((int)(rng_next() % 9) - 4);
            memcpy(&x, &r, sizeof(x));
            break;
        case 2: /* small negatives, most of them printing as -0.000000, and exact
                 * ties: odd multiples of 1/128, where x * 10^6 ends in .5 */
            if (i % 10 == 7) {
                x = (double)(int64_t)((r % 2000001) * 2 + 1 - 2000000) / 128.0;
                break;
            }
            x = -((double)(r >> 11) * 0x1p-53) * 1e-6;
            break;
        case 3: /* every magnitude, every sign */
            x = (double)(int64_t)r * exp2((double)(int)(rng_next() % 120) - 100.0);
            break;
        default: /* any bit pattern */
            memcpy(&x, &r, sizeof(x));
            break;
        }
        check_round6(x);
    }
    {
        double nz = model_round6(-1e-9);
        ck_assert(nz == 0.0 && signbit(nz));
        ck_assert(signbit(model_round6(-0.0)));
        ck_assert(!signbit(model_round6(1e-9)));
    }
}
END_TEST

static Suite *core_suite(void)
{
    Suite *s = suite_create("core");
    TCase *tc = tcase_create("model");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_golden_mix);
    tcase_add_test(tc, test_golden_tiny);
    tcase_add_test(tc, test_golden_bits);
    tcase_add_test(tc, test_weights_order);
    tcase_add_test(tc, test_accessors);
    tcase_add_test(tc, test_rows_formulas);
    tcase_add_test(tc, test_validation);
    tcase_add_test(tc, test_cached_equals_uncached);
    tcase_add_test(tc, test_state_every_prefix);
    tcase_add_test(tc, test_hash_blocks);
    tcase_add_test(tc, test_attn_blocks);
    tcase_add_test(tc, test_cached_equals_uncached_across_blocks);
    tcase_add_test(tc, test_any_block_layout);
    tcase_add_test(tc, test_block_plan_bound);
    tcase_add_test(tc, test_full_context);
    tcase_add_test(tc, test_threads);
    tcase_add_test(tc, test_pick_ties);
    tcase_add_test(tc, test_alloc_failure);
    tcase_add_test(tc, test_shape_then_build);
    tcase_add_test(tc, test_round6);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(core_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
