/*
 * sample.c: the seeded sampler and the top-scores selection (sample.h),
 * exactly as docs/models.md, "Sampling", writes them: the candidates are
 * the first top_k tokens in the order (logit descending, token ascending);
 * their weights exp((l - max) / T); the nucleus the shortest prefix of
 * that order whose running sum reaches top_p times the candidates' sum;
 * and the draw, from the splitmix64 stream of the seed at the pick's
 * position, walks the nucleus in token order.  Compiled with the model's
 * flags (-ffp-contract=off): every sum is taken in the order written, so
 * that the Python implementation in tests/crosscheck.py agrees pick for
 * pick.
 *
 * A pick with neither cut sorts nothing; with top_k K it pops K tokens
 * off a binary heap (heapify O(V)); with top_p alone it sorts every token
 * (a radix sort, order_all()).  Any correct ordering gives the same
 * result: the order is total (ties by token).
 *
 * Pure functions of their arguments and the work memory the caller lends:
 * any thread, no lock, no allocation.
 */
#include "sample.h"

#include <assert.h>
#include <math.h>
#include <string.h>

/* The work memory: w[V] weights, key[2][V] sort keys, heap[V] and
 * tok[V] tokens, in[V] flags. */
typedef struct sample_work {
    double *w;
    uint64_t *key[2];
    uint32_t *heap, *tok;
    unsigned char *in;
} sample_work_t;

size_t model_sample_work_size(uint32_t vocab)
{
    size_t n = (size_t)vocab * (sizeof(double) + 2 * sizeof(uint64_t) + 2 * sizeof(uint32_t) + 1);

    return (n + 7) / 8 * 8;
}

static sample_work_t work_of(void *work, uint32_t vocab)
{
    sample_work_t sw;

    sw.w = work;
    sw.key[0] = (uint64_t *)(sw.w + vocab);
    sw.key[1] = sw.key[0] + vocab;
    sw.heap = (uint32_t *)(sw.key[1] + vocab);
    sw.tok = sw.heap + vocab;
    sw.in = (unsigned char *)(sw.tok + vocab);
    return sw;
}

/* Every token in the order into sw->heap: a stable radix sort, least
 * significant byte first, of keys that put a higher score first (the
 * double's bits made to sort as unsigned integers, then inverted; -0.0 as
 * 0.0), the tokens starting in ascending order so that equal scores keep
 * it.  A pick with top_p and no top_k walks most of the order: this is
 * several times cheaper than popping the heap for each token. */
static void order_all(const double *l, uint32_t vocab, sample_work_t *sw)
{
    uint64_t *k = sw->key[0], *k2 = sw->key[1];
    uint32_t *t = sw->heap, *t2 = sw->tok;

    for (uint32_t c = 0; c < vocab; c++) {
        double x = l[c] == 0.0 ? 0.0 : l[c];
        uint64_t u;
        memcpy(&u, &x, sizeof(u));
        u = (u >> 63) ? ~u : u | 0x8000000000000000u;
        k[c] = ~u;
        t[c] = c;
    }
    for (unsigned shift = 0; shift < 64; shift += 8) {
        size_t count[257] = {0};
        for (uint32_t i = 0; i < vocab; i++)
            count[((k[i] >> shift) & 0xFF) + 1]++;
        if (count[((k[0] >> shift) & 0xFF) + 1] == vocab)
            continue; /* one byte value throughout: this pass would change nothing */
        for (int b = 0; b < 256; b++)
            count[b + 1] += count[b];
        for (uint32_t i = 0; i < vocab; i++) {
            size_t at = count[(k[i] >> shift) & 0xFF]++;
            k2[at] = k[i];
            t2[at] = t[i];
        }
        uint64_t *sk = k;
        uint32_t *st = t;
        k = k2, k2 = sk;
        t = t2, t2 = st;
    }
    if (t != sw->heap)
        memcpy(sw->heap, t, vocab * sizeof(*t));
}

/* Whether token a comes before token b: higher score, or the same score
 * and a lower token. */
static inline bool ranks_before(const double *l, uint32_t a, uint32_t b)
{
    return l[a] > l[b] || (l[a] == l[b] && a < b);
}

static void sift_down(const double *l, uint32_t *h, size_t n, size_t i)
{
    for (;;) {
        size_t c = 2 * i + 1, best = i;
        if (c < n && ranks_before(l, h[c], h[best]))
            best = c;
        if (c + 1 < n && ranks_before(l, h[c + 1], h[best]))
            best = c + 1;
        if (best == i)
            return;
        uint32_t t = h[i];
        h[i] = h[best];
        h[best] = t;
        i = best;
    }
}

/* A heap of every token, the first in the order at its root. */
static void heap_build(const double *l, uint32_t *h, uint32_t vocab)
{
    for (uint32_t c = 0; c < vocab; c++)
        h[c] = c;
    for (size_t i = vocab / 2; i-- > 0;)
        sift_down(l, h, vocab, i);
}

/* Takes the heap's first token; *n is its size. */
static uint32_t heap_pop(const double *l, uint32_t *h, size_t *n)
{
    uint32_t top = h[0];

    h[0] = h[--*n];
    sift_down(l, h, *n, 0);
    return top;
}

/* The splitmix64 output for position p of the stream seeded with `seed`,
 * as a double in [0, 1). */
static double draw_unit(uint64_t seed, uint64_t position)
{
    uint64_t z = seed + position * 0x9E3779B97F4A7C15u;

    z += 0x9E3779B97F4A7C15u; /* mix64() as docs/models.md writes it */
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    z ^= z >> 31;
    return (double)(z >> 11) * 0x1p-53;
}

uint32_t model_sample_pick(const model_sample_t *sp, const double *raw, uint32_t vocab,
                           uint64_t position, void *work)
{
    sample_work_t sw = work_of(work, vocab);
    const double t = sp->temperature;
    const bool cut_k = sp->top_k < vocab, cut_p = sp->top_p < 1.0;
    size_t nheap = vocab;
    double mx, z, zn, target, acc;
    uint32_t last = 0;

    assert(!model_sample_greedy(sp) && vocab >= 1);
    /* The candidates, flagged in sw.in, and the largest logit; the order,
     * when the nucleus needs it, in sw.heap: from its end for top_k (as
     * heap_pop() leaves it), from its start without. */
    if (cut_k)
        heap_build(raw, sw.heap, vocab);
    else if (cut_p)
        order_all(raw, vocab, &sw);
    if (cut_k) {
        memset(sw.in, 0, vocab);
        mx = raw[sw.heap[0]];
        for (uint32_t i = 0; i < sp->top_k; i++) {
            uint32_t c = heap_pop(raw, sw.heap, &nheap);
            sw.in[c] = 1;
            sw.heap[vocab - 1 - i] = c; /* the candidates in order, from the end */
        }
    } else {
        memset(sw.in, 1, vocab);
        mx = raw[0];
        for (uint32_t c = 1; c < vocab; c++)
            if (raw[c] > mx)
                mx = raw[c];
    }
    /* Weights and their sum, in token order. */
    z = 0.0;
    for (uint32_t c = 0; c < vocab; c++) {
        if (sw.in[c]) {
            sw.w[c] = exp((raw[c] - mx) / t);
            z += sw.w[c];
        }
    }
    /* The nucleus: the candidates in order until their sum reaches
     * top_p * z; the others lose their flag. */
    if (cut_p) {
        const double bound = sp->top_p * z;
        size_t taken = 0, ncand = cut_k ? sp->top_k : vocab;
        acc = 0.0;
        while (taken < ncand) {
            uint32_t c = sw.heap[cut_k ? vocab - 1 - taken : taken];
            taken++;
            acc += sw.w[c];
            sw.in[c] = 2;
            if (acc >= bound)
                break;
        }
        for (uint32_t c = 0; c < vocab; c++)
            sw.in[c] = sw.in[c] == 2;
    }
    /* The draw, walking the nucleus in token order. */
    zn = 0.0;
    for (uint32_t c = 0; c < vocab; c++)
        if (sw.in[c])
            zn += sw.w[c];
    target = draw_unit(sp->seed, position) * zn;
    acc = 0.0;
    for (uint32_t c = 0; c < vocab; c++) {
        if (!sw.in[c])
            continue;
        acc += sw.w[c];
        if (target < acc)
            return c;
        if (sw.w[c] > 0.0)
            last = c;
    }
    return last;
}

void model_top_scores(const double *scores, uint32_t vocab, uint32_t k, uint32_t *tokens,
                      void *work)
{
    sample_work_t sw = work_of(work, vocab);
    size_t nheap = vocab;

    assert(k >= 1 && k <= vocab);
    heap_build(scores, sw.heap, vocab);
    for (uint32_t i = 0; i < k; i++)
        tokens[i] = heap_pop(scores, sw.heap, &nheap);
}

/* ---- Picks under decoding controls ---- */

/* Whether dc samples (rather than picking greedily). */
static inline bool decode_samples(const model_decode_t *dc)
{
    return dc != NULL && !model_sample_greedy(dc->sample);
}

/* Rounds a row of logits in place, as model_pick() rounds them. */
static void round_row(double *row, uint32_t vocab)
{
    for (uint32_t c = 0; c < vocab; c++)
        row[c] = model_round6(row[c]);
}

uint32_t model_decode_pick(const model_t *m, const model_kv_t *kv, const model_decode_t *dc,
                           double *row, void *scratch)
{
    const uint32_t vocab = model_vocab(m);
    uint32_t t;

    if (dc == NULL)
        return model_pick(m, kv, row);
    if (!decode_samples(dc))
        return model_pick(m, kv, dc->logits ? row : NULL);
    assert(model_family(m) == MODEL_FAMILY_ATTN && row != NULL);
    (void)model_pick_raw(m, kv, row);
    t = model_sample_pick(dc->sample, row, vocab, kv->len, scratch);
    if (dc->logits)
        round_row(row, vocab);
    return t;
}

void model_decode_pick_batch(const model_t *m, const model_kv_t *const *kv, size_t nb,
                             const model_decode_t *const *dc, uint32_t *tokens, double *const *rows,
                             void *scratch)
{
    const uint32_t vocab = model_vocab(m);
    double *lg[MODEL_BATCH_MAX], *raw[MODEL_BATCH_MAX];
    bool any = false;

    assert(nb <= MODEL_BATCH_MAX);
    if (dc == NULL) {
        model_pick_batch(m, kv, nb, tokens, rows, scratch);
        return;
    }
    for (size_t b = 0; b < nb; b++) {
        double *row = rows != NULL ? rows[b] : NULL;
        const bool samples = decode_samples(dc[b]);
        lg[b] = samples || (dc[b] != NULL && !dc[b]->logits) ? NULL : row;
        raw[b] = samples ? row : NULL;
        assert(!samples || row != NULL);
        any = any || samples;
    }
    model_pick_batch_rows(m, kv, nb, tokens, lg, any ? raw : NULL, scratch);
    if (!any)
        return;
    for (size_t b = 0; b < nb; b++) {
        if (raw[b] == NULL)
            continue;
        tokens[b] = model_sample_pick(dc[b]->sample, raw[b], vocab, kv[b]->len, scratch);
        if (dc[b]->logits)
            round_row(raw[b], vocab);
    }
}
