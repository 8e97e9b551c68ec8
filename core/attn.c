/*
 * attn.c: the `attn` family, the decoding-cache model of MODELS.md.
 *
 * It owns the attn weights, the layout of an attn block, the state of an
 * attn sequence and the arithmetic of one position.  Every floating-point
 * sum is evaluated as MODELS.md writes it: acc = 0.0, then acc += term with
 * the index ascending.  Loops are arranged so that the compiler may run
 * several independent sums side by side (one per output index), but no
 * single sum is ever split or reordered, so every bit is the specified one.
 *
 * Weights.  One allocation holding, in draw order, E[V][d], P[max_ctx][d],
 * then for each layer Wq, Wk, Wv, Wo ([d][d] each), then U[d][V], all row
 * major: the i-th double is the weight of the i-th draw.
 *
 * Block layout.  With B = model_block_positions() and d the width, a
 * block's data is L layer areas of 2 * B * d doubles, layer l first at
 * double offset l * 2 * B * d.  Each area holds K transposed, Kt[j][b] at
 * j * B + b (d rows of B), then V row major, V[b][j] at B * d + b * d + j
 * (B rows of d), where b is the position's slot in its block.  Transposing K
 * lets the scores of a block's B rows be computed together from contiguous
 * loads (one lane per row, each lane still summing j ascending); keeping V
 * row major lets a[j] be accumulated for all j together (one lane per j,
 * each still summing r ascending).
 *
 * State.  The V unrounded logits of the last position run, as doubles; a
 * pick reads them and rounds on the way out.
 *
 * Scratch.  5 * d + max_ctx doubles: x, q, k, a, o, then one attention
 * row's scores s[r], which become e[r] and then the factors e[r] / z.
 */
#include "model_impl.h"

#include <math.h>
#include <stdlib.h>

/* Doubles of the four [d][d] matrices of one layer. */
static size_t layer_doubles(const model_t *m)
{
    return (size_t)4 * m->shape.d * m->shape.d;
}

static void attn_sizes(model_t *m)
{
    size_t d = m->shape.d;

    m->entry_size = 2 * (size_t)m->shape.layers * d * sizeof(double);
    m->state_size = (size_t)m->shape.vocab * sizeof(double);
    m->scratch_size = (5 * d + m->shape.max_ctx) * sizeof(double);
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

/* One attention row of layer `l` over positions 0 .. n-1 of the chain from
 * `block`: writes a[0 .. d-1].  `s` has room for n doubles. */
static void attend(const model_t *m, const model_block_t *block, uint32_t n, uint32_t l,
                   const double *restrict q, double *restrict s, double *restrict a)
{
    const size_t d = m->shape.d, per = m->shape.block_positions;
    const size_t area = (size_t)l * 2 * per * d;
    const double inv_sqrt_d = m->inv_sqrt_d;
    const model_block_t *b;
    double mx, z;
    size_t r0;

    /* s[r] = (sum over j of q[j] * K[r][j]) * (1 / sqrt(d)): the rows of a
     * block side by side, K being stored transposed. */
    for (b = block, r0 = 0; r0 < n; b = b->next, r0 += per) {
        const double *restrict kt = (const double *)(const void *)b->data + area;
        size_t cnt = n - r0 < per ? n - r0 : per, r = 0;
        for (; r + LANES <= cnt; r += LANES) {
            double acc[LANES] = {0.0};
            for (size_t j = 0; j < d; j++) {
                lanes_axpy(acc, q[j], kt + j * per + r);
            }
            for (int k = 0; k < LANES; k++) {
                s[r0 + r + k] = acc[k] * inv_sqrt_d;
            }
        }
        for (; r < cnt; r++) {
            double acc = 0.0;
            for (size_t j = 0; j < d; j++) {
                acc += q[j] * kt[j * per + r];
            }
            s[r0 + r] = acc * inv_sqrt_d;
        }
    }

    /* e[r] = exp(s[r] - m), z = sum of e[r], then s[r] = e[r] / z: the
     * factor of every term of row r, divided once and used for every j. */
    mx = s[0];
    for (size_t r = 1; r < n; r++) {
        if (s[r] > mx) {
            mx = s[r];
        }
    }
    z = 0.0;
    for (size_t r = 0; r < n; r++) {
        s[r] = exp(s[r] - mx);
        z += s[r];
    }
    for (size_t r = 0; r < n; r++) {
        s[r] = s[r] / z;
    }

    /* a[j] = sum over r ascending of (e[r] / z) * V[r][j]: each block adds
     * its rows, in order, to the running sums, LANES values of j at a time. */
    for (size_t j = 0; j < d; j++) {
        a[j] = 0.0;
    }
    for (b = block, r0 = 0; r0 < n; b = b->next, r0 += per) {
        const double *restrict vb = (const double *)(const void *)b->data + area + per * d;
        const double *restrict w = s + r0;
        size_t cnt = n - r0 < per ? n - r0 : per, j = 0;
        for (; j + LANES <= d; j += LANES) {
            double acc[LANES];
            for (int k = 0; k < LANES; k++) {
                acc[k] = a[j + k];
            }
            for (size_t r = 0; r < cnt; r++) {
                lanes_axpy(acc, w[r], vb + r * d + j);
            }
            for (int k = 0; k < LANES; k++) {
                a[j + k] = acc[k];
            }
        }
        for (; j < d; j++) {
            double acc = a[j];
            for (size_t r = 0; r < cnt; r++) {
                acc += w[r] * vb[r * d + j];
            }
            a[j] = acc;
        }
    }
}

static void attn_run(const model_t *m, model_kv_t *kv, uint32_t token, void *scratch)
{
    const size_t d = m->shape.d, per = m->shape.block_positions;
    const uint32_t p = kv->len;
    const size_t slot = model__block_slot(m, p);
    double *x = scratch, *q = x + d, *k = q + d, *a = k + d, *o = a + d, *s = o + d;
    double *data = (double *)(void *)kv->tail->data;
    const double *emb = m->emb + (size_t)token * d, *pos = m->pos + (size_t)p * d;

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
        attend(m, kv->head, p + 1, l, q, s, a);
        matvec(a, wo, o, d, d);
        for (size_t j = 0; j < d; j++) {
            x[j] = x[j] + o[j];
        }
    }
    matvec(x, m->unemb, kv->state, d, m->shape.vocab);
    model__count_rows(m, m->shape.layers);
    model__kv_advance(m, kv);
}

static uint32_t attn_pick(const model_t *m, const model_kv_t *kv, double *logits)
{
    const double *state = kv->state;
    uint32_t best = 0;

    for (uint32_t c = 1; c < m->shape.vocab; c++) {
        if (state[c] > state[best]) {
            best = c;
        }
    }
    if (logits != NULL) {
        for (uint32_t c = 0; c < m->shape.vocab; c++) {
            logits[c] = model_round6(state[c]);
        }
    }
    return best;
}

const model__ops_t model__attn_ops = {
    .sizes = attn_sizes,
    .init = attn_init,
    .fini = attn_fini,
    .run = attn_run,
    .pick = attn_pick,
};
