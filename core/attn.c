/*
 * attn.c: the `attn` family, the decoding-cache model of docs/models.md.
 *
 * It owns the attn weights (one allocation, in draw order), the layout of
 * an attn block (per layer, K transposed then V row major), the state of
 * an attn sequence (x, d doubles) and the arithmetic of one position,
 * single, batched and prefilled, plus the width-8 kernels of `tiny`.
 * Every floating-point sum is evaluated as docs/models.md writes it:
 * acc = 0.0, then acc += term with the index ascending; no single sum is
 * ever split or reordered, so every bit is the specified one.
 *
 * Threads.  No lock.  The weights are written at creation and read-only
 * after, so any threads may run positions of different sequences on one
 * model at once; a call writes only its sequences' chains and states, the
 * scratch it is given, and the model's atomic row counter (core/model.h).
 *
 * Design: docs/design.md, "The attn family's layout", "Blocks of growing
 * capacity" and "Batches".
 */
#include "model_int.h"
#include "kern.h"
#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Doubles of the four [d][d] matrices of one layer. */
static size_t layer_doubles(const model_t *m)
{
    return (size_t)4 * m->shape.d * m->shape.d;
}

static size_t batch_scratch_doubles(const model_t *m, size_t nb);

/* The scratch of a single run (below), or of a batch of MODEL_BATCH_MAX
 * where the family batches (not width 8), whichever is larger: any call
 * fits in model_scratch_size(). */
static void attn_sizes(model_t *m)
{
    size_t d = m->shape.d, single = 5 * d + m->shape.max_ctx;
    size_t batch = d == 8 ? 0 : batch_scratch_doubles(m, MODEL_BATCH_MAX);

    m->entry_size = 2 * (size_t)m->shape.layers * d * sizeof(double);
    m->state_size = d * sizeof(double);
    m->scratch_size = (single > batch ? single : batch) * sizeof(double);
    /* A pick's sampler (sample.h) borrows the scratch between the pick and the run. */
    if (m->scratch_size < model_sample_work_size(m->shape.vocab))
        m->scratch_size = model_sample_work_size(m->shape.vocab);
}

/* The i-th draw of the weight stream, turned into a weight of `scale`. */
static double draw_weight(uint64_t seed, uint64_t i, double scale)
{
    uint64_t draw = model__mix64(seed + i * UINT64_C(0x9E3779B97F4A7C15));

    return (2.0 * ((double)(draw >> 11) * 0x1p-53) - 1.0) * scale;
}

static int attn_init(model_t *m)
{
    size_t v = m->shape.vocab, d = m->shape.d, ctx = m->shape.max_ctx;
    size_t n_emb = v * d, n_pos = ctx * d, n_layers = m->shape.layers * layer_doubles(m);
    size_t total = n_emb + n_pos + n_layers + d * v;
    double scale = 1.0 / sqrt((double)d); /* the weights' scale, and 1.0 / sqrt(d) */
    double *w;
    size_t i = 0;

    w = model__alloc(64, total * sizeof(double));
    if (w == NULL) {
        return SLOTD_ENOMEM;
    }
    for (; i < n_emb + n_pos; i++) {
        w[i] = draw_weight(m->shape.seed, i, 1.0);
    }
    for (; i < total; i++) {
        w[i] = draw_weight(m->shape.seed, i, scale);
    }
    m->weights = w;
    m->emb = w;
    m->pos = w + n_emb;
    m->layer = w + n_emb + n_pos;
    m->unemb = w + n_emb + n_pos + n_layers;
    m->inv_sqrt_d = scale;
    return SLOTD_OK;
}

static void attn_fini(model_t *m)
{
    free(m->weights);
    m->weights = NULL;
}

/*
 * The kernels.  Each computes many independent sums at once, LANES of them
 * in a group held in a small local array (which the compiler keeps in
 * registers and may vectorise), walking the index of the sum in its one
 * ascending order; what does not fill a group runs one sum at a time.
 * Every sum starts at 0.0 and adds its terms in order, so every lane gives
 * the bits a plain loop gives.
 */
#define LANES 8

/* acc[l] += x * row[l] for each lane l, written out so that the array
 * stays in registers. */
static inline void lanes_axpy(double *restrict acc, double x, const double *restrict row)
{
    acc[0] += x * row[0];
    acc[1] += x * row[1];
    acc[2] += x * row[2];
    acc[3] += x * row[3];
    acc[4] += x * row[4];
    acc[5] += x * row[5];
    acc[6] += x * row[6];
    acc[7] += x * row[7];
}

/* out[c] = sum over i ascending of x[i] * w[i][c], for c < cols; w is
 * [rows][cols] row major. */
static void matvec(const double *restrict x, const double *restrict w, double *restrict out,
                   size_t rows, size_t cols)
{
    size_t c = 0;

    for (; c + LANES <= cols; c += LANES) {
        double acc[LANES] = {0.0};
        for (size_t i = 0; i < rows; i++) {
            lanes_axpy(acc, x[i], w + i * cols + c);
        }
        for (int l = 0; l < LANES; l++) {
            out[c + l] = acc[l];
        }
    }
    for (; c < cols; c++) {
        double acc = 0.0;
        for (size_t i = 0; i < rows; i++) {
            acc += x[i] * w[i * cols + c];
        }
        out[c] = acc;
    }
}

/* Layer l's K area (Kt, d rows of the block's capacity) of block b. */
static inline const double *block_kt(const model_block_t *b, size_t l, size_t d)
{
    return (const double *)(const void *)b->data + l * 2 * b->capacity * d;
}

/* The scores s[0 .. n-1] become the factors of the attention row: e[r] =
 * exp(s[r] - m), z = sum of e[r] (r ascending), then s[r] = e[r] / z, the
 * factor of every term of row r, divided once and used for every j.  Where
 * s[r] - m is zero (the row of the largest score, at least) e[r] is 1.0
 * without a call: that is what exp(+-0) returns, so no bit changes; a NaN
 * is not zero and still goes through exp. */
static void attend_factors(double *restrict s, size_t n)
{
    double mx = s[0], z = 0.0;

    for (size_t r = 1; r < n; r++) {
        if (s[r] > mx) {
            mx = s[r];
        }
    }
    for (size_t r = 0; r < n; r++) {
        const double t = s[r] - mx;
        s[r] = t == 0.0 ? 1.0 : exp(t);
        z += s[r];
    }
    for (size_t r = 0; r < n; r++) {
        s[r] = s[r] / z;
    }
}

/* One attention row of layer `l` over positions 0 .. n-1 of the chain
 * `bl` (its first nbl blocks, kern.h): writes a[0 .. d-1].  `s` has room
 * for n doubles.  The dot products and the sum of values are the kernels'
 * (kern.h: each s[r] and each a[j] one sum, in its order, whatever the
 * variant); s[r] is then multiplied by 1 / sqrt(d), as docs/models.md
 * writes it. */
static void attend(const model_t *m, const model_block_t *const *bl, size_t nbl, uint32_t n,
                   uint32_t l, const double *restrict q, double *restrict s, double *restrict a)
{
    const model__kern_t *k = model__kern();
    const double inv_sqrt_d = m->inv_sqrt_d;

    k->scores(q, bl, nbl, n, l, m->shape.d, s);
    for (size_t r = 0; r < n; r++) {
        s[r] = s[r] * inv_sqrt_d;
    }
    attend_factors(s, n);
    k->mix(s, bl, nbl, n, l, m->shape.d, a);
}

/* Keeps `best` the index of the largest logit seen, the lowest on a tie:
 * logits are offered in ascending index order. */
static inline void pick_offer(double v, uint32_t c, double *best_v, uint32_t *best)
{
    if (c == 0 || v > *best_v) {
        *best_v = v;
        *best = c;
    }
}

/* Writes logit v unrounded to raw[c] and rounded to logits[c], each when
 * asked for (not NULL), rounding through the inline fast path: for tiny's
 * six logits the call per logit of model_round6() is a good part of a
 * pick.  (attn_pick() calls model_round6(): with V in the thousands, the
 * inline path's registers cost its loop of sums more than the calls.) */
static inline void pick_write(double v, size_t c, double *logits, double *raw)
{
    if (raw != NULL) {
        raw[c] = v;
    }
    if (logits != NULL && !model__round6_fast(v, &logits[c])) {
        logits[c] = model_round6(v);
    }
}

/*
 * Width 8, the `tiny` preset.  The same sums in the same order as the
 * general code above, with d a constant and the lanes written out as
 * vectors of two doubles (the GNU vector extension gcc and clang share:
 * each lane is an IEEE add or multiply of its own, exactly the scalar
 * operation).  gcc does vectorise the general kernels, but not these loops
 * once it has unrolled them whole: it then multiplies in pairs and adds one
 * lane at a time, three times the instructions.  So the eight running sums
 * of a vector are four v2d in registers (one lane per output index), the
 * vectors of a position live in locals rather than in scratch, and a
 * block's scores are computed two rows at a time (one lane per row): tiny's
 * blocks hold two positions, so the general kernel's groups of LANES rows
 * never fill inside one.
 */
#define D8 8
#define D8_PAIRS (D8 / 2)

typedef double v2d __attribute__((vector_size(2 * sizeof(double))));

/* Two doubles from p, which need only be 8-byte aligned. */
static inline v2d v2d_load(const double *p)
{
    v2d v;

    memcpy(&v, p, sizeof(v));
    return v;
}

static inline void v2d_store(double *p, v2d v)
{
    memcpy(p, &v, sizeof(v));
}

static inline v2d v2d_splat(double x)
{
    return (v2d){x, x};
}

/* acc[c] += x * row[c] for the eight lanes c: one term of eight sums. */
static inline void d8_axpy(v2d acc[D8_PAIRS], double x, const double *restrict row)
{
    const v2d xx = v2d_splat(x);

    for (size_t c = 0; c < D8_PAIRS; c++) {
        acc[c] += xx * v2d_load(row + 2 * c);
    }
}

static inline void d8_store(double *restrict out, const v2d acc[D8_PAIRS])
{
    for (size_t c = 0; c < D8_PAIRS; c++) {
        v2d_store(out + 2 * c, acc[c]);
    }
}

/* out[c] = sum over i ascending of x[i] * w[i][c], for c < 8. */
static inline void d8_matvec(const double *restrict x, const double *restrict w,
                             double *restrict out)
{
    v2d acc[D8_PAIRS] = {{0.0, 0.0}, {0.0, 0.0}, {0.0, 0.0}, {0.0, 0.0}};

    for (size_t i = 0; i < D8; i++) {
        d8_axpy(acc, x[i], w + i * D8);
    }
    d8_store(out, acc);
}

/* s[r] = (sum over j ascending of q[j] * K[r][j]) * inv_sqrt_d, for the n
 * rows of layer l of kv's chain. */
static inline void d8_scores(const model_kv_t *kv, size_t l, uint32_t n, const double *restrict q,
                             double inv_sqrt_d, double *restrict s)
{
    const model_block_t *b = kv->head;
    uint32_t bi = 0;

    for (uint32_t r = 0; r < n; b = model__kv_next(kv, b, &bi)) {
        const size_t cap = b->capacity;
        const double *restrict kt = block_kt(b, l, D8);
        const uint32_t cnt = n - r < cap ? n - r : (uint32_t)cap;
        uint32_t i = 0;

        for (; i + 2 <= cnt; i += 2) {
            v2d acc = {0.0, 0.0};
            for (size_t j = 0; j < D8; j++) {
                acc += v2d_splat(q[j]) * v2d_load(kt + j * cap + i);
            }
            v2d_store(s + r + i, acc * v2d_splat(inv_sqrt_d));
        }
        if (i < cnt) {
            double acc = 0.0;
            for (size_t j = 0; j < D8; j++) {
                acc += q[j] * kt[j * cap + i];
            }
            s[r + i] = acc * inv_sqrt_d;
        }
        r += cnt;
    }
}

/* a[j] = sum over r ascending of f[r] * V[r][j], for the n rows of layer l
 * of kv's chain. */
static inline void d8_mix(const model_kv_t *kv, size_t l, uint32_t n, const double *restrict f,
                          double *restrict a)
{
    v2d acc[D8_PAIRS] = {{0.0, 0.0}, {0.0, 0.0}, {0.0, 0.0}, {0.0, 0.0}};
    const model_block_t *b = kv->head;
    uint32_t bi = 0;

    for (uint32_t r = 0; r < n; b = model__kv_next(kv, b, &bi)) {
        const size_t cap = b->capacity;
        const double *restrict vb = block_kt(b, l, D8) + cap * D8;
        const uint32_t cnt = n - r < cap ? n - r : (uint32_t)cap;

        for (uint32_t i = 0; i < cnt; i++) {
            d8_axpy(acc, f[r + i], vb + i * D8);
        }
        r += cnt;
    }
    d8_store(a, acc);
}

/* attn_run() for d = 8.  Of the scratch it uses only the scores s, max_ctx
 * doubles 5 * d in, where attn_run() keeps them. */
static void d8_run(const model_t *m, model_kv_t *kv, uint32_t token, void *scratch)
{
    double *restrict s = (double *)scratch + 5 * D8;
    const size_t per = kv->tail->capacity;
    const uint32_t p = kv->len;
    const size_t slot = model__block_slot(kv->tail, p);
    double *data = (double *)(void *)kv->tail->data;
    const double *restrict emb = m->emb + (size_t)token * D8;
    const double *restrict pos = m->pos + (size_t)p * D8;
    double x[D8], q[D8], k[D8], a[D8], o[D8];

    for (size_t i = 0; i < D8; i++) {
        x[i] = emb[i] + pos[i];
    }
    for (uint32_t l = 0; l < m->shape.layers; l++) {
        const double *wq = m->layer + l * 4 * D8 * D8;
        const double *wk = wq + D8 * D8, *wv = wk + D8 * D8, *wo = wv + D8 * D8;
        double *kt = data + l * 2 * per * D8;

        d8_matvec(x, wq, q);
        d8_matvec(x, wk, k);
        d8_matvec(x, wv, kt + per * D8 + slot * D8);
        for (size_t j = 0; j < D8; j++) {
            kt[j * per + slot] = k[j];
        }
        d8_scores(kv, l, p + 1, q, m->inv_sqrt_d, s);
        attend_factors(s, p + 1);
        d8_mix(kv, l, p + 1, s, a);
        d8_matvec(a, wo, o);
        for (size_t j = 0; j < D8; j++) {
            x[j] = x[j] + o[j];
        }
    }
    memcpy(kv->state, x, sizeof(x));
    model__count_rows(m, m->shape.layers);
    model__kv_advance(kv);
}

/* attn_pick() for d = 8: logits[c] = sum over i ascending of x[i] *
 * U[i][c], two columns at a time (one lane per column). */
static uint32_t d8_pick(const model_t *m, const model_kv_t *kv, double *logits, double *raw)
{
    const size_t cols = m->shape.vocab;
    const double *restrict x = kv->state;
    const double *restrict u = m->unemb;
    double best_v = 0.0;
    uint32_t best = 0;
    size_t c = 0;
    v2d xx[D8]; /* x[i] in both lanes, made once for every pair of columns */

    for (size_t i = 0; i < D8; i++) {
        xx[i] = v2d_splat(x[i]);
    }
    for (; c + 2 <= cols; c += 2) {
        v2d acc = {0.0, 0.0};
        for (size_t i = 0; i < D8; i++) {
            acc += xx[i] * v2d_load(u + i * cols + c);
        }
        for (size_t l = 0; l < 2; l++) {
            pick_offer(acc[l], (uint32_t)(c + l), &best_v, &best);
            pick_write(acc[l], c + l, logits, raw);
        }
    }
    if (c < cols) {
        double acc = 0.0;
        for (size_t i = 0; i < D8; i++) {
            acc += x[i] * u[i * cols + c];
        }
        pick_offer(acc, (uint32_t)c, &best_v, &best);
        pick_write(acc, c, logits, raw);
    }
    return best;
}

static void attn_run(const model_t *m, model_kv_t *kv, uint32_t token, void *scratch)
{
    const size_t d = m->shape.d, per = kv->tail->capacity;
    const uint32_t p = kv->len;
    const size_t slot = model__block_slot(kv->tail, p);
    double *x = scratch, *q = x + d, *k = q + d, *a = k + d, *o = a + d, *s = o + d;
    double *data = (double *)(void *)kv->tail->data;
    const double *emb = m->emb + (size_t)token * d, *pos = m->pos + (size_t)p * d;
    double *state = kv->state;
    const model_block_t *head = kv->head;
    /* The chain as attend() takes it: the table, or the head and `next`. */
    const model_block_t *const *bl =
        kv->blocks != NULL ? (const model_block_t *const *)kv->blocks : &head;
    const size_t nbl = kv->blocks != NULL ? kv->nblocks : 1;

    for (size_t i = 0; i < d; i++) {
        x[i] = emb[i] + pos[i];
    }
    for (uint32_t l = 0; l < m->shape.layers; l++) {
        const double *wq = m->layer + l * layer_doubles(m);
        const double *wk = wq + d * d, *wv = wk + d * d, *wo = wv + d * d;
        double *kt = data + l * 2 * per * d;
        double *vrow = kt + per * d + slot * d;

        matvec(x, wq, q, d, d);
        matvec(x, wk, k, d, d);
        matvec(x, wv, vrow, d, d);
        for (size_t j = 0; j < d; j++) {
            kt[j * per + slot] = k[j];
        }
        attend(m, bl, nbl, p + 1, l, q, s, a);
        matvec(a, wo, o, d, d);
        for (size_t j = 0; j < d; j++) {
            x[j] = x[j] + o[j];
        }
    }
    for (size_t i = 0; i < d; i++) {
        state[i] = x[i];
    }
    model__count_rows(m, m->shape.layers);
    model__kv_advance(kv);
}

/* logits[c] = sum over i ascending of x[i] * U[i][c], LANES columns at a
 * time (as matvec() computes them), each offered to the pick as it is
 * done and written unrounded to `raw` and rounded to `logits` when asked. */
static uint32_t attn_pick(const model_t *m, const model_kv_t *kv, double *logits, double *raw)
{
    const size_t d = m->shape.d, cols = m->shape.vocab;
    const double *restrict x = kv->state;
    const double *restrict u = m->unemb;
    double best_v = 0.0;
    uint32_t best = 0;
    size_t c = 0;

    for (; c + LANES <= cols; c += LANES) {
        double acc[LANES] = {0.0};
        for (size_t i = 0; i < d; i++) {
            lanes_axpy(acc, x[i], u + i * cols + c);
        }
        for (int l = 0; l < LANES; l++) {
            pick_offer(acc[l], (uint32_t)(c + l), &best_v, &best);
            if (raw != NULL) {
                raw[c + l] = acc[l];
            }
            if (logits != NULL) {
                logits[c + l] = model_round6(acc[l]);
            }
        }
    }
    for (; c < cols; c++) {
        double acc = 0.0;
        for (size_t i = 0; i < d; i++) {
            acc += x[i] * u[i * cols + c];
        }
        pick_offer(acc, (uint32_t)c, &best_v, &best);
        if (raw != NULL) {
            raw[c] = acc;
        }
        if (logits != NULL) {
            logits[c] = model_round6(acc);
        }
    }
    return best;
}

/*
 * Batches.  A batch is up to MODEL_BATCH_MAX positions, each of its own
 * sequence (model_run_batch()) or consecutive positions of one sequence
 * (model_prefill()).  Layer by layer, the products of every position are
 * one call of the kernel (kern.h), which loads each weight once for the
 * whole batch; then each position attends on its own chain, in batch
 * order, with attend() as a single run calls it.  Every position's every
 * sum is the one attn_run() computes, term for term, so the bits are the
 * same; only the order in which different sums are computed changes.  In
 * a prefill, position p + 1's key and value are written before position
 * p attends, but attend() reads rows 0 .. p only.
 *
 * Batch scratch (batch_scratch_doubles()): X, Q, K, Vv, A, O, each nb rows
 * of d (one row per position), then the scores s (max_ctx), then a strip of
 * PICK_STRIP logits per sequence for model_pick_batch(), then BATCH_BL
 * block addresses per sequence: the first blocks of its chain, collected
 * once for the whole batch (kern.h).  Every layer's attention walks each
 * chain again, and by the next layer the batch's keys and values have
 * pushed the headers out of the caches: walked by `next`, each header
 * waits for the one before; by address, they load side by side, and the
 * next sequence's are prefetched while one attends.
 */
#define PICK_STRIP 64
#define BATCH_BL 64

_Static_assert(sizeof(void *) <= sizeof(double), "a block address fits a double's room");

/* One position of a batch: the chain it attends over (its first nbl
 * blocks, kern.h), the block and slot its entry goes to, and the position. */
typedef struct batch_item {
    const model_block_t *const *bl;
    size_t nbl;
    model_block_t *blk;
    uint32_t slot;
    uint32_t p;
} batch_item_t;

static size_t batch_scratch_doubles(const model_t *m, size_t nb)
{
    return 6 * nb * m->shape.d + m->shape.max_ctx + nb * PICK_STRIP + nb * BATCH_BL;
}

/* The block addresses of a batch's scratch: BATCH_BL for each of nb. */
static const model_block_t **batch_bl(const model_t *m, size_t nb, void *scratch)
{
    return (const model_block_t **)(void *)((double *)scratch + 6 * nb * m->shape.d +
                                            m->shape.max_ctx + nb * PICK_STRIP);
}

/* Writes to bl the first blocks of the chain from `head` that hold
 * positions 0 .. n-1, at most BATCH_BL; returns how many (>= 1). */
static size_t collect_blocks(const model_block_t *head, uint32_t n, const model_block_t **bl)
{
    size_t k = 0;
    uint32_t held = 0;

    for (const model_block_t *b = head; k < BATCH_BL && (k == 0 || held < n); b = b->next) {
        bl[k++] = b;
        held += b->capacity;
    }
    return k;
}

/* Runs tokens[b] at it[b] for b < nb: writes each entry and leaves each
 * position's x in X's row b (scratch).  Counts nothing. */
static void batch_positions(const model_t *m, const batch_item_t *it, const uint32_t *tokens,
                            size_t nb, double *scratch)
{
    const size_t d = m->shape.d;
    const model__mm_fn mm = model__kern()->mm;
    double *X = scratch, *Q = X + nb * d, *K = Q + nb * d, *Vv = K + nb * d, *A = Vv + nb * d;
    double *O = A + nb * d, *s = O + nb * d;

    assert(nb <= MODEL_BATCH_MAX);
    for (size_t b = 0; b < nb; b++) {
        const double *emb = m->emb + (size_t)tokens[b] * d, *pos = m->pos + (size_t)it[b].p * d;
        for (size_t i = 0; i < d; i++) {
            X[b * d + i] = emb[i] + pos[i];
        }
    }
    for (uint32_t l = 0; l < m->shape.layers; l++) {
        const double *wq = m->layer + l * layer_doubles(m);
        const double *wk = wq + d * d, *wv = wk + d * d, *wo = wv + d * d;

        mm(X, d, nb, wq, d, d, 0, d, Q, d);
        mm(X, d, nb, wk, d, d, 0, d, K, d);
        mm(X, d, nb, wv, d, d, 0, d, Vv, d);
        for (size_t b = 0; b < nb; b++) {
            const size_t per = it[b].blk->capacity, slot = it[b].slot;
            double *kt = (double *)(void *)it[b].blk->data + l * 2 * per * d;
            for (size_t j = 0; j < d; j++) {
                kt[j * per + slot] = K[b * d + j];
            }
            memcpy(kt + per * d + slot * d, Vv + b * d, d * sizeof(double));
        }
        for (size_t b = 0; b < nb; b++) {
            if (b + 1 < nb && it[b + 1].bl != it[b].bl) {
                for (size_t i = 0; i < it[b + 1].nbl; i++) {
                    __builtin_prefetch(it[b + 1].bl[i]);
                }
            }
            attend(m, it[b].bl, it[b].nbl, it[b].p + 1, l, Q + b * d, s, A + b * d);
        }
        mm(A, d, nb, wo, d, d, 0, d, O, d);
        for (size_t i = 0; i < nb * d; i++) {
            X[i] = X[i] + O[i];
        }
    }
}

static void attn_run_batch(const model_t *m, model_kv_t *const *kv, const uint32_t *tokens,
                           size_t nb, void *scratch)
{
    const size_t d = m->shape.d;
    batch_item_t it[MODEL_BATCH_MAX] = {{0}}; /* all written before use; gcc cannot tell */
    double *X = scratch;
    const model_block_t **bl = batch_bl(m, nb, scratch);

    for (size_t b = 0; b < nb; b++) {
        if (kv[b]->blocks != NULL) {
            it[b].bl = (const model_block_t *const *)kv[b]->blocks;
            it[b].nbl = kv[b]->nblocks;
        } else {
            it[b].bl = bl + b * BATCH_BL;
            it[b].nbl = collect_blocks(kv[b]->head, kv[b]->len + 1, bl + b * BATCH_BL);
        }
        it[b].blk = kv[b]->tail;
        it[b].p = kv[b]->len;
        it[b].slot = model__block_slot(kv[b]->tail, kv[b]->len);
    }
    batch_positions(m, it, tokens, nb, scratch);
    for (size_t b = 0; b < nb; b++) {
        memcpy(kv[b]->state, X + b * d, d * sizeof(double));
        model__kv_advance(kv[b]);
    }
    model__count_rows(m, (uint64_t)m->shape.layers * nb);
}

static void attn_prefill(const model_t *m, model_kv_t *kv, const uint32_t *tokens, size_t n,
                         void *scratch)
{
    const size_t d = m->shape.d;
    batch_item_t it[MODEL_BATCH_MAX] = {{0}}; /* all written before use; gcc cannot tell */
    double *X = scratch;

    for (size_t done = 0; done < n;) {
        size_t nb = n - done < MODEL_BATCH_MAX ? n - done : MODEL_BATCH_MAX;
        model_block_t *blk = kv->tail;
        uint32_t p = kv->len, slot = model__block_slot(blk, p);
        const model_block_t **own = batch_bl(m, nb, scratch);
        const model_block_t *const *bl =
            kv->blocks != NULL ? (const model_block_t *const *)kv->blocks : own;
        const size_t nbl =
            kv->blocks != NULL ? kv->nblocks : collect_blocks(kv->head, p + (uint32_t)nb, own);
        uint32_t bi = kv->blocks != NULL ? model__kv_index_at(kv, blk->first) : 0;

        for (size_t b = 0; b < nb; b++, p++, slot++) {
            if (slot == blk->capacity) {
                blk = model__kv_next(kv, blk, &bi);
                slot = 0;
            }
            it[b].bl = bl;
            it[b].nbl = nbl;
            it[b].blk = blk;
            it[b].p = p;
            it[b].slot = slot;
        }
        batch_positions(m, it, tokens + done, nb, scratch);
        memcpy(kv->state, X + (nb - 1) * d, d * sizeof(double));
        for (size_t b = 0; b < nb; b++) {
            model__kv_advance(kv);
        }
        model__count_rows(m, (uint64_t)m->shape.layers * nb);
        done += nb;
    }
}

/* attn_pick() for each sequence, U's columns PICK_STRIP at a time for the
 * whole batch: each sequence's logits reach pick_offer() in ascending
 * order, as in attn_pick(). */
static void attn_pick_batch(const model_t *m, const model_kv_t *const *kv, size_t nb,
                            uint32_t *tokens, double *const *logits, double *const *raw,
                            void *scratch)
{
    const size_t d = m->shape.d, cols = m->shape.vocab;
    const model__mm_fn mm = model__kern()->mm;
    double *X = scratch, *strip = X + 6 * nb * d + m->shape.max_ctx;
    double best_v[MODEL_BATCH_MAX];

    assert(nb <= MODEL_BATCH_MAX);
    for (size_t b = 0; b < nb; b++) {
        memcpy(X + b * d, kv[b]->state, d * sizeof(double));
        best_v[b] = 0.0;
        tokens[b] = 0;
    }
    for (size_t c0 = 0; c0 < cols; c0 += PICK_STRIP) {
        const size_t c1 = cols - c0 < PICK_STRIP ? cols : c0 + PICK_STRIP;
        mm(X, d, nb, m->unemb, cols, d, c0, c1, strip, PICK_STRIP);
        for (size_t b = 0; b < nb; b++) {
            double *out = logits != NULL ? logits[b] : NULL;
            double *rout = raw != NULL ? raw[b] : NULL;
            for (size_t c = c0; c < c1; c++) {
                const double v = strip[b * PICK_STRIP + (c - c0)];
                pick_offer(v, (uint32_t)c, &best_v[b], &tokens[b]);
                pick_write(v, c, out, rout);
            }
        }
    }
}

/* A batch's scratch, or a single run's if that is larger (a small batch
 * of a model with a long context). */
static size_t attn_batch_scratch(const model_t *m, size_t nb)
{
    size_t batch = batch_scratch_doubles(m, nb), single = 5 * m->shape.d + m->shape.max_ctx;

    return batch > single ? batch : single;
}

static const model__ops_t attn_ops = {
    .sizes = attn_sizes,
    .init = attn_init,
    .fini = attn_fini,
    .run = attn_run,
    .pick = attn_pick,
    .run_batch = attn_run_batch,
    .pick_batch = attn_pick_batch,
    .prefill = attn_prefill,
    .batch_scratch = attn_batch_scratch,
};

static const model__ops_t attn_d8_ops = {
    .sizes = attn_sizes,
    .init = attn_init,
    .fini = attn_fini,
    .run = d8_run,
    .pick = d8_pick,
};

const model__ops_t *model__attn_ops_for(uint32_t d)
{
    return d == D8 ? &attn_d8_ops : &attn_ops;
}
