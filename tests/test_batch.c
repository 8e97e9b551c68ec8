/*
 * test_batch.c: the Check suite of core/'s batch calls (model_run_batch(),
 * model_pick_batch(), model_prefill()) against the single calls.
 *
 * Every variant the machine supports (model_simd_supported(), forced with
 * model_simd_force()) computes the scalar variant's bytes in a fixed
 * scenario of batches, single steps and a prefill.  Every case below runs
 * on every variant and compares with memcmp: picks, rounded logits, states and every byte of every
 * entry of a batch against the same sequences stepped one at a time; a
 * prefill against the same prompt run position by position; and the
 * counters (L rows or one g call per position, whatever the batch).
 * Sequences get histories of mixed lengths, up to max_ctx - 1, filled
 * with random entries and states: the batch must equal the singles for
 * any cache contents, and a random fill reaches base's 4,095 entries
 * without running them.  Histories run through the model are covered by
 * the prefill cases and the stepping of batches several times over.
 *
 * The decoding controls' batch pick (model_decode_pick_batch()) is held
 * to the single picks the same way, greedy and sampled members mixed.
 *
 * `test_batch` runs the light cases (label unit, also under valgrind);
 * `test_batch heavy` (label heavy) adds base at every batch size from 1
 * to 12 and 31 to 33 and 64, and the long prefills.
 */
#include "test_util.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/model.h"
#include "core/model_int.h"
#include "core/sample.h"
#include "test_model_util.h"

static bool heavy;

/* Points kv->tail at the block holding position kv->len (NULL if none). */
static void set_tail(model_kv_t *kv)
{
    model_block_t *b = kv->head;

    while (b != NULL && kv->len - b->first >= b->capacity) {
        b = b->next;
    }
    kv->tail = b;
}

/* A chain with room for `room` positions holding `len` random entries and
 * a random state (every byte of every block written, so that whole blocks
 * compare). */
static void fake_history(const model_t *m, model_kv_t *kv, uint32_t len, uint32_t room)
{
    ck_assert_int_eq(model_kv_heap_alloc(m, room, kv), SLOTD_OK);
    for (model_block_t *b = kv->head; b != NULL; b = b->next) {
        double *v = (double *)(void *)b->data;
        size_t n = b->capacity * model_entry_size(m) / sizeof(double);
        for (size_t i = 0; i < n; i++) {
            v[i] = rng_double();
        }
    }
    if (model_family(m) == MODEL_FAMILY_HASH) {
        *(uint64_t *)kv->state = rng_next();
    } else {
        for (size_t i = 0; i < model_state_size(m) / sizeof(double); i++) {
            ((double *)kv->state)[i] = rng_double();
        }
    }
    kv->len = len;
    set_tail(kv);
}

/* A chain of the same capacities and bytes as `src`. */
static void clone_chain(const model_t *m, const model_kv_t *src, model_kv_t *dst, uint32_t room)
{
    model_block_t *d;

    ck_assert_int_eq(model_kv_heap_alloc(m, room, dst), SLOTD_OK);
    d = dst->head;
    for (const model_block_t *s = src->head; s != NULL; s = s->next, d = d->next) {
        ck_assert_ptr_nonnull(d);
        ck_assert_uint_eq(d->capacity, s->capacity);
        memcpy(d->data, s->data, s->capacity * model_entry_size(m));
    }
    memcpy(dst->state, src->state, model_state_size(m));
    dst->len = src->len;
    set_tail(dst);
}

/* Every byte of the two chains' blocks and states, and their lengths. */
static void same_chain(const model_t *m, const model_kv_t *a, const model_kv_t *b)
{
    const model_block_t *y = b->head;

    ck_assert_uint_eq(a->len, b->len);
    ck_assert_int_eq(a->tail == NULL, b->tail == NULL);
    if (a->tail != NULL) {
        ck_assert_uint_eq(a->tail->first, b->tail->first);
    }
    for (const model_block_t *x = a->head; x != NULL; x = x->next, y = y->next) {
        ck_assert_int_eq(memcmp(x->data, y->data, x->capacity * model_entry_size(m)), 0);
    }
    ck_assert_int_eq(memcmp(a->state, b->state, model_state_size(m)), 0);
}

/* The entries 0 .. len-1 of two chains (of any capacities) and states. */
static void same_entries(const model_t *m, const model_kv_t *a, const model_kv_t *b)
{
    const size_t L = model_layers(m), es = model_entry_size(m);
    const size_t d = model_family(m) == MODEL_FAMILY_HASH ? 0 : es / (2 * L * sizeof(double));
    const model_block_t *x = a->head, *y = b->head;

    ck_assert_uint_eq(a->len, b->len);
    for (uint32_t p = 0; p < a->len; p++) {
        while (p - x->first >= x->capacity) {
            x = x->next;
        }
        while (p - y->first >= y->capacity) {
            y = y->next;
        }
        if (d == 0) {
            ck_assert_int_eq(
                memcmp(x->data + (p - x->first) * es, y->data + (p - y->first) * es, es), 0);
            continue;
        }
        for (size_t l = 0; l < L; l++) {
            const double *kx = (const double *)(const void *)x->data + l * 2 * x->capacity * d;
            const double *ky = (const double *)(const void *)y->data + l * 2 * y->capacity * d;
            for (size_t j = 0; j < d; j++) {
                ck_assert_int_eq(memcmp(&kx[j * x->capacity + (p - x->first)],
                                        &ky[j * y->capacity + (p - y->first)], sizeof(double)),
                                 0);
            }
            ck_assert_int_eq(memcmp(kx + x->capacity * d + (p - x->first) * d,
                                    ky + y->capacity * d + (p - y->first) * d, d * sizeof(double)),
                             0);
        }
    }
    ck_assert_int_eq(memcmp(a->state, b->state, model_state_size(m)), 0);
}

/* One batch of nb sequences of `m`, of mixed lengths (one at max_ctx - 1
 * when `full`), stepped `rounds` times: pick then run, as a step does,
 * batched against singles.  Compares everything after each round. */
static void batch_case(const model_t *m, size_t nb, bool full, unsigned rounds)
{
    const uint32_t ctx = model_max_ctx(m), V = model_vocab(m);
    const bool attn = model_family(m) == MODEL_FAMILY_ATTN;
    model_kv_t *one = calloc(nb, sizeof(*one)), *many = calloc(nb, sizeof(*many));
    model_kv_t *pmany[MODEL_BATCH_MAX];
    double *lg_one = malloc(nb * V * sizeof(double)), *lg_many = malloc(nb * V * sizeof(double));
    double *rows_many[MODEL_BATCH_MAX];
    uint32_t t_one[MODEL_BATCH_MAX], t_many[MODEL_BATCH_MAX];
    void *scratch = malloc(model_batch_scratch_size(m, nb));
    void *scratch1 = malloc(model_scratch_size(m) > 0 ? model_scratch_size(m) : 1);
    uint64_t w0;

    ck_assert(one != NULL && many != NULL && lg_one != NULL && lg_many != NULL);
    ck_assert(scratch != NULL && scratch1 != NULL);
    for (size_t b = 0; b < nb; b++) {
        /* Short, medium and (rarely) long histories; room for the rounds. */
        uint32_t cap = ctx - rounds, len;
        switch (rng_below(4)) {
        case 0:
            len = 1 + rng_below(cap < 4 ? cap : 4);
            break;
        case 1:
        case 2:
            len = 1 + rng_below(cap < 80 ? cap : 80);
            break;
        default:
            len = 1 + rng_below(cap < 300 ? cap : 300);
            break;
        }
        if (full && b == nb / 2) {
            len = ctx - rounds;
        }
        fake_history(m, &one[b], len, len + rounds);
        clone_chain(m, &one[b], &many[b], len + rounds);
        pmany[b] = &many[b];
        rows_many[b] = attn ? lg_many + b * V : NULL;
    }

    for (unsigned r = 0; r < rounds; r++) {
        /* The singles. */
        w0 = work(m);
        for (size_t b = 0; b < nb; b++) {
            t_one[b] = model_pick(m, &one[b], attn ? lg_one + b * V : NULL);
            model_run(m, &one[b], t_one[b], scratch1);
        }
        ck_assert_uint_eq(work(m) - w0, nb * (uint64_t)model_layers(m));
        /* The batch: the pick counts nothing, the run nb steps. */
        memset(lg_many, 0xa5, nb * V * sizeof(double));
        w0 = work(m);
        model_pick_batch(m, (const model_kv_t *const *)pmany, nb, t_many,
                         r % 2 == 0 ? rows_many : NULL, scratch);
        ck_assert_uint_eq(work(m), w0);
        model_run_batch(m, pmany, t_many, nb, scratch);
        ck_assert_uint_eq(work(m) - w0, nb * (uint64_t)model_layers(m));

        ck_assert_int_eq(memcmp(t_one, t_many, nb * sizeof(uint32_t)), 0);
        if (attn && r % 2 == 0) {
            ck_assert_int_eq(memcmp(lg_one, lg_many, nb * V * sizeof(double)), 0);
        }
        for (size_t b = 0; b < nb; b++) {
            same_chain(m, &one[b], &many[b]);
        }
    }
    for (size_t b = 0; b < nb; b++) {
        model_kv_heap_free(&one[b]);
        model_kv_heap_free(&many[b]);
    }
    free(one);
    free(many);
    free(lg_one);
    free(lg_many);
    free(scratch);
    free(scratch1);
}

/* `prompt` tokens run position by position against model_prefill(), after
 * `before` positions run singly into both; then one more step of each. */
static void prefill_case(const model_t *m, uint32_t before, uint32_t n)
{
    const uint32_t V = model_vocab(m);
    uint32_t *tok = malloc((before + n + 1) * sizeof(uint32_t));
    void *scratch = malloc(model_batch_scratch_size(m, MODEL_BATCH_MAX));
    model_kv_t a, b;
    uint64_t w0;

    ck_assert(tok != NULL && scratch != NULL);
    ck_assert_uint_le(before + n, model_max_ctx(m));
    for (uint32_t i = 0; i < before + n; i++) {
        tok[i] = rng_below(V);
    }
    ck_assert_int_eq(model_kv_heap_alloc(m, before + n, &a), SLOTD_OK);
    ck_assert_int_eq(model_kv_heap_alloc(m, before + n, &b), SLOTD_OK);
    for (uint32_t i = 0; i < before; i++) {
        model_run(m, &a, tok[i], scratch);
        model_run(m, &b, tok[i], scratch);
    }
    w0 = work(m);
    for (uint32_t i = before; i < before + n; i++) {
        model_run(m, &a, tok[i], scratch);
    }
    ck_assert_uint_eq(work(m) - w0, (uint64_t)n * model_layers(m));
    w0 = work(m);
    model_prefill(m, &b, tok + before, n, scratch);
    ck_assert_uint_eq(work(m) - w0, (uint64_t)n * model_layers(m));
    same_entries(m, &a, &b);
    if (a.len > 0) {
        double *la = malloc(V * sizeof(double)), *lb = malloc(V * sizeof(double));
        ck_assert(la != NULL && lb != NULL);
        ck_assert_uint_eq(model_pick(m, &a, la), model_pick(m, &b, lb));
        if (model_family(m) == MODEL_FAMILY_ATTN) {
            ck_assert_int_eq(memcmp(la, lb, V * sizeof(double)), 0);
        }
        free(la);
        free(lb);
    }
    model_kv_heap_free(&a);
    model_kv_heap_free(&b);
    free(tok);
    free(scratch);
}

/* Runs fn on every supported variant, then restores the one in use. */
#define EACH_VARIANT(body)                                                                         \
    do {                                                                                           \
        const char *was_ = model_simd();                                                           \
        for (size_t vi_ = 0; model_simd_supported(vi_) != NULL; vi_++) {                           \
            ck_assert_int_eq(model_simd_force(model_simd_supported(vi_)), SLOTD_OK);               \
            body;                                                                                  \
        }                                                                                          \
        ck_assert_int_eq(model_simd_force(was_), SLOTD_OK);                                        \
    } while (0)

/* What a fixed scenario computes, appended to `out` (which has room): a
 * batch of 13 sequences of random histories stepped twice (their rounded
 * and raw logits and states), a single step of each, and a prefill of 40
 * tokens followed by its raw logits.  The same seed gives the same
 * scenario, so two variants must fill `out` with the same bytes. */
static size_t scenario(const model_t *m, unsigned char *out)
{
    enum { NB = 13 };
    const uint32_t V = model_vocab(m);
    model_kv_t kv[NB], *pkv[NB], pre;
    double *lg = malloc((size_t)NB * V * sizeof(double)), *rows[NB];
    uint32_t tok[NB], ptok[40];
    void *scratch = malloc(model_scratch_size(m));
    size_t len = 0;

    ck_assert(lg != NULL && scratch != NULL);
    rng_state = 99;
    for (size_t b = 0; b < NB; b++) {
        uint32_t n = 1 + rng_below(b == 6 && !SLOTD_UNDER_VALGRIND() ? model_max_ctx(m) - 4 : 70);
        fake_history(m, &kv[b], n, n + 3);
        pkv[b] = &kv[b];
        rows[b] = lg + b * V;
    }
    for (int r = 0; r < 2; r++) {
        model_pick_batch(m, (const model_kv_t *const *)pkv, NB, tok, rows, scratch);
        model_run_batch(m, pkv, tok, NB, scratch);
        memcpy(out + len, lg, (size_t)NB * V * sizeof(double));
        len += (size_t)NB * V * sizeof(double);
        memcpy(out + len, tok, sizeof(tok));
        len += sizeof(tok);
    }
    for (size_t b = 0; b < NB; b++) {
        tok[b] = model_pick_raw(m, &kv[b], lg);
        model_run(m, &kv[b], tok[b], scratch);
        memcpy(out + len, lg, V * sizeof(double));
        len += V * sizeof(double);
        memcpy(out + len, kv[b].state, model_state_size(m));
        len += model_state_size(m);
        model_kv_heap_free(&kv[b]);
    }
    for (size_t i = 0; i < 40; i++) {
        ptok[i] = rng_below(V);
    }
    ck_assert_int_eq(model_kv_heap_alloc(m, 40, &pre), SLOTD_OK);
    model_prefill(m, &pre, ptok, 40, scratch);
    tok[0] = model_pick_raw(m, &pre, lg);
    memcpy(out + len, lg, V * sizeof(double));
    len += V * sizeof(double);
    model_kv_heap_free(&pre);
    free(lg);
    free(scratch);
    return len;
}

START_TEST(test_variants_agree)
{
    /* Every variant computes the scalar variant's bytes. */
    static const char *names[] = {"small", "base"};
    const char *was = model_simd();

    for (size_t k = 0; k < 2; k++) {
        model_t *m = create(names[k]);
        size_t room = 64 * (size_t)model_vocab(m) * sizeof(double) + 64 * model_state_size(m);
        unsigned char *ref = malloc(room), *got = malloc(room);
        size_t n_ref, n_got;

        ck_assert(ref != NULL && got != NULL);
        ck_assert_int_eq(model_simd_force("scalar"), SLOTD_OK);
        n_ref = scenario(m, ref);
        ck_assert_uint_le(n_ref, room);
        for (size_t i = 1; model_simd_supported(i) != NULL; i++) {
            ck_assert_int_eq(model_simd_force(model_simd_supported(i)), SLOTD_OK);
            memset(got, 0, room);
            n_got = scenario(m, got);
            ck_assert_uint_eq(n_got, n_ref);
            ck_assert_msg(memcmp(ref, got, n_ref) == 0, "%s: variant %s differs from scalar",
                          names[k], model_simd_supported(i));
        }
        free(ref);
        free(got);
        model_destroy(m);
    }
    ck_assert_int_eq(model_simd_force(was), SLOTD_OK);
}
END_TEST

START_TEST(test_variants)
{
    /* scalar is always there, the one in use is among those supported, and
     * an unknown or unsupported name changes nothing. */
    const char *in_use = model_simd();
    bool found = false;

    ck_assert_str_eq(model_simd_supported(0), "scalar");
    for (size_t i = 0; model_simd_supported(i) != NULL; i++) {
        found = found || strcmp(model_simd_supported(i), in_use) == 0;
    }
    ck_assert(found);
    ck_assert_int_eq(model_simd_force("sse9"), SLOTD_EINVAL);
    ck_assert_int_eq(model_simd_force(NULL), SLOTD_EINVAL);
    ck_assert_str_eq(model_simd(), in_use);
}
END_TEST

START_TEST(test_batch_tiny_hash)
{
    model_t *t = create("tiny"), *h = create("hash");

    rng_state = 11;
    EACH_VARIANT({
        for (size_t nb = 1; nb <= MODEL_BATCH_MAX; nb++) {
            batch_case(t, nb, nb % 5 == 0, 1);
        }
        for (size_t nb = 1; nb <= MODEL_BATCH_MAX; nb += 7) {
            batch_case(h, nb, nb % 2 == 1, 2);
        }
    });
    model_destroy(t);
    model_destroy(h);
}
END_TEST

START_TEST(test_batch_small)
{
    model_t *m = create("small");
    size_t step = SLOTD_UNDER_VALGRIND() ? 9 : 1;

    rng_state = 12;
    EACH_VARIANT({
        for (size_t nb = 1; nb <= MODEL_BATCH_MAX; nb += step) {
            batch_case(m, nb, nb % 4 == 1, nb <= 3 ? 3 : 1);
        }
        batch_case(m, MODEL_BATCH_MAX, true, 2);
    });
    model_destroy(m);
}
END_TEST

START_TEST(test_batch_base)
{
    model_t *m = create("base");
    static const size_t light[] = {1, 12, 2, 5};
    const size_t nlight = SLOTD_UNDER_VALGRIND() ? 2 : sizeof(light) / sizeof(light[0]);
    static const size_t all[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 31, 32, 33, 64};

    rng_state = 13;
    EACH_VARIANT({
        if (heavy) {
            for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
                batch_case(m, all[i], all[i] % 3 == 1, 1);
            }
        } else {
            for (size_t i = 0; i < nlight; i++) {
                batch_case(m, light[i], !SLOTD_UNDER_VALGRIND() && light[i] == 5, 1);
            }
        }
    });
    model_destroy(m);
}
END_TEST

START_TEST(test_prefill)
{
    model_t *t = create("tiny"), *h = create("hash"), *s = create("small"), *b = create("base");

    rng_state = 14;
    EACH_VARIANT({
        prefill_case(t, 0, 1);
        prefill_case(t, 0, 2);
        prefill_case(t, 0, 8);
        prefill_case(t, 3, 5);
        prefill_case(h, 0, 300);
        prefill_case(s, 0, 1);
        prefill_case(s, 0, 2);
        prefill_case(s, 0, 17);
        prefill_case(s, 5, 70);
        prefill_case(b, 0, 1);
        prefill_case(b, 0, 2);
        prefill_case(b, 0, 17);
        if (!SLOTD_UNDER_VALGRIND()) {
            prefill_case(s, 0, 512);
            prefill_case(s, 0, 1024);
            prefill_case(b, 3, 66);
        }
        if (heavy) {
            prefill_case(b, 0, 512);
        }
    });
    model_destroy(t);
    model_destroy(h);
    model_destroy(s);
    model_destroy(b);
}
END_TEST

START_TEST(test_batch_counters)
{
    /* One g call or L rows per position, whatever the batch; a pick
     * counts nothing; the scratch a batch needs grows with the batch. */
    model_t *s = create("small"), *h = create("hash");

    ck_assert_uint_ge(model_batch_scratch_size(s, 1), (5 * 64 + 1024) * sizeof(double));
    ck_assert_uint_gt(model_batch_scratch_size(s, 64), model_batch_scratch_size(s, 1));
    ck_assert_uint_eq(model_batch_scratch_size(s, 64), model_scratch_size(s));
    ck_assert_uint_eq(model_batch_scratch_size(h, 64), model_scratch_size(h));
    ck_assert(model_batch_shares(s));
    ck_assert(!model_batch_shares(h));
    rng_state = 15;
    batch_case(s, 7, false, 2);
    batch_case(h, 7, false, 2);
    ck_assert_uint_eq(model_rows(s), 2 * 2 * 7 * 4);
    ck_assert_uint_eq(model_g_calls(h), 2 * 2 * 7);
    model_destroy(s);
    model_destroy(h);
}
END_TEST

/* model_decode_pick_batch() of nb sequences with mixed decoding controls
 * (greedy with and without logits, sampled with and without logits, each
 * cut) against model_decode_pick() of each alone: the same picks and the
 * same bytes in every row that holds logits; and a greedy equivalent
 * (temperature 0, top_k 1) picks as model_pick() with its rounded row. */
static void decode_case(const model_t *m, size_t nb)
{
    const uint32_t v = model_vocab(m);
    void *scratch = malloc(model_scratch_size(m));
    model_kv_t a[MODEL_BATCH_MAX], b[MODEL_BATCH_MAX];
    const model_kv_t *pa[MODEL_BATCH_MAX];
    model_sample_t sp[MODEL_BATCH_MAX];
    model_decode_t dc[MODEL_BATCH_MAX];
    const model_decode_t *pdc[MODEL_BATCH_MAX];
    double *rows_a[MODEL_BATCH_MAX], *rows_b = malloc(v * sizeof(double));
    double *greedy = malloc(v * sizeof(double));
    uint32_t picks[MODEL_BATCH_MAX];
    static const double temps[] = {0.0, 0.1, 0.8, 2.0};
    static const uint32_t ks[] = {1, 3, 50, UINT32_MAX};

    ck_assert_ptr_nonnull(scratch);
    for (size_t i = 0; i < nb; i++) {
        uint32_t len = 1 + (uint32_t)(rng_next() % 40);
        fake_history(m, &a[i], len, len + 1);
        clone_chain(m, &a[i], &b[i], len + 1);
        memcpy(b[i].state, a[i].state, model_state_size(m));
        b[i].len = len;
        set_tail(&b[i]);
        pa[i] = &a[i];
        rows_a[i] = malloc(v * sizeof(double));
        sp[i].temperature = temps[i % 4];
        sp[i].top_k = ks[(i / 4) % 4] < v ? ks[(i / 4) % 4] : v;
        sp[i].top_p = i % 3 == 0 ? 1.0 : 0.9;
        sp[i].seed = rng_next();
        memset(&dc[i], 0, sizeof(dc[i]));
        dc[i].sample = i % 5 == 4 ? NULL : &sp[i];
        dc[i].logits = i % 2 == 0;
        pdc[i] = &dc[i];
    }
    model_decode_pick_batch(m, pa, nb, pdc, picks, rows_a, scratch);
    for (size_t i = 0; i < nb; i++) {
        uint32_t t = model_decode_pick(m, &b[i], &dc[i], rows_b, scratch);
        ck_assert_uint_eq(picks[i], t);
        if (dc[i].logits)
            ck_assert_int_eq(memcmp(rows_a[i], rows_b, v * sizeof(double)), 0);
        if (model_sample_greedy(dc[i].sample)) {
            ck_assert_uint_eq(t, model_pick(m, &b[i], greedy));
            if (dc[i].logits)
                ck_assert_int_eq(memcmp(greedy, rows_b, v * sizeof(double)), 0);
        }
        model_kv_heap_free(&a[i]);
        model_kv_heap_free(&b[i]);
        free(rows_a[i]);
    }
    free(rows_b);
    free(greedy);
    free(scratch);
}

START_TEST(test_decode_batch)
{
    model_t *m = create("small");

    rng_state = 31;
    EACH_VARIANT({
        decode_case(m, 1);
        decode_case(m, 13);
        decode_case(m, MODEL_BATCH_MAX);
    });
    model_destroy(m);
    m = create("tiny");
    EACH_VARIANT({ decode_case(m, 9); });
    model_destroy(m);
}
END_TEST

/* The top scores: score descending, ties by token ascending. */
START_TEST(test_top_scores)
{
    const double row[8] = {0.5, 2.0, -1.0, 2.0, 0.5, 3.0, 2.0, -0.0};
    const uint32_t want[8] = {5, 1, 3, 6, 0, 4, 7, 2};
    uint32_t got[8];
    void *work = malloc(model_sample_work_size(8));

    for (uint32_t k = 1; k <= 8; k++) {
        model_top_scores(row, 8, k, got, work);
        ck_assert_int_eq(memcmp(got, want, k * sizeof(uint32_t)), 0);
    }
    free(work);
}
END_TEST

static Suite *batch_suite(void)
{
    Suite *s = suite_create("batch");
    TCase *tc = tcase_create("batch");

    tcase_set_timeout(tc, heavy ? 900 : 300);
    tcase_add_test(tc, test_variants);
    tcase_add_test(tc, test_variants_agree);
    tcase_add_test(tc, test_batch_counters);
    tcase_add_test(tc, test_batch_tiny_hash);
    tcase_add_test(tc, test_batch_small);
    tcase_add_test(tc, test_batch_base);
    tcase_add_test(tc, test_prefill);
    tcase_add_test(tc, test_decode_batch);
    tcase_add_test(tc, test_top_scores);
    suite_add_tcase(s, tc);
    return s;
}

int main(int argc, char **argv)
{
    SRunner *sr;
    int failed;

    heavy = argc > 1 && strcmp(argv[1], "heavy") == 0;
    sr = srunner_create(batch_suite());
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
