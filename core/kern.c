/*
 * kern.c: the matrix product of a batch, model__mm_fn, and the attention
 * kernels (kern.h), compiled once per SIMD variant.  The build compiles this file three times on
 * x86-64 (once elsewhere), each time with its own instruction set and
 * these macros: KERN_NAME (the variant's name and suffix), KERN_VW (doubles
 * per vector: 1 for scalar, 4 for AVX2, 8 for AVX-512), KERN_NV (vectors
 * of columns per tile) and KERN_NB (sequences per tile).  Only simd.c's
 * dispatch calls into a variant, and only once the CPU has said it has
 * the instructions.  Pure functions; any thread.
 *
 * A tile is KERN_NB sequences by KERN_NV * KERN_VW columns: KERN_NB *
 * KERN_NV running sums held in vector registers, one lane per (sequence,
 * column).  For each i ascending, the tile loads the KERN_NV vectors of
 * row i of w once, and for each sequence multiplies them by x[b][i] in
 * every lane and adds the products to that sequence's sums: one load of a
 * weight serves KERN_NB sequences.  Each lane is one sum of docs/models.md,
 * 0.0 then += x[b][i] * w[i][c] with i ascending, a multiply then an add
 * (-ffp-contract=off), so the bits are those of the scalar loop.  The
 * tiles walk the columns outermost, so a strip of w (rows x tile width)
 * stays in the near caches while every tile of sequences reads it.
 * Columns left over after the last whole tile are summed one at a time.
 * The w rows a tile reaches next are prefetched.
 *
 * The attention's kernels (scores, mix) are the same kind of sums over a
 * chain's blocks, given as addresses (kern.h): the scores of KERN_NC-row
 * tiles of large blocks, of whole small blocks a vector at a time, and of
 * what is left one lane a row; the sum of values in passes of up to
 * KERN_MIX_NV vectors of columns.
 */
#include "core/kern.h"
#include "core/model.h"

#include <string.h>

#if KERN_VW > 1
#include <immintrin.h>
#endif

#ifndef KERN_NAME
#error "kern.c is compiled with KERN_NAME, KERN_VW, KERN_NV and KERN_NB (core/CMakeLists.txt)"
#endif

#define KERN_CAT2(a, b) a##b
#define KERN_CAT(a, b) KERN_CAT2(a, b)
#define KERN_STR2(a) #a
#define KERN_STR(a) KERN_STR2(a)
#define KERN_FN(f) KERN_CAT(f##_, KERN_NAME)

#define KERN_NC (KERN_NV * KERN_VW)

#if KERN_VW == 1
typedef double vd;

static inline vd vload(const double *p)
{
    return *p;
}

static inline void vstore(double *p, vd v)
{
    *p = v;
}

static inline vd vsplat(double x)
{
    return x;
}
#else
typedef double vd __attribute__((vector_size(KERN_VW * sizeof(double))));

/* Unaligned loads and stores: memcpy is one vector move. */
static inline vd vload(const double *p)
{
    vd v;

    memcpy(&v, p, sizeof(v));
    return v;
}

static inline void vstore(double *p, vd v)
{
    memcpy(p, &v, sizeof(v));
}

static inline vd vsplat(double x)
{
    return x - (vd){0}; /* x in every lane: the scalar is widened, then x - 0.0 == x */
}
#endif

/* Rows of w a tile asks for ahead of the one it multiplies. */
#define KERN_PF 16

/* One tile of `nb` (<= KERN_NB, a constant where it is inlined)
 * sequences by KERN_NC columns starting at w's column 0. */
static inline __attribute__((always_inline)) void tile(const double *restrict x, size_t ldx,
                                                      size_t nb, const double *restrict w,
                                                      size_t ldw, size_t rows,
                                                      double *restrict out, size_t ldo)
{
    vd acc[KERN_NB][KERN_NV];

    for (size_t b = 0; b < nb; b++) {
        for (size_t v = 0; v < KERN_NV; v++) {
            acc[b][v] = vsplat(0.0);
        }
    }
    for (size_t i = 0; i < rows; i++) {
        vd wv[KERN_NV];
        /* Row i + KERN_PF of the strip, asked for now: the rows are ldw
         * apart, and the first tile of sequences finds them in memory.  A
         * prefetch past the end of w never faults and changes nothing. */
        __builtin_prefetch(w + (i + KERN_PF) * ldw);
        __builtin_prefetch(w + (i + KERN_PF) * ldw + KERN_NC - 1);
        for (size_t v = 0; v < KERN_NV; v++) {
            wv[v] = vload(w + i * ldw + v * KERN_VW);
        }
        for (size_t b = 0; b < nb; b++) {
            const vd xb = vsplat(x[b * ldx + i]);
            for (size_t v = 0; v < KERN_NV; v++) {
                acc[b][v] += xb * wv[v];
            }
        }
    }
    for (size_t b = 0; b < nb; b++) {
        for (size_t v = 0; v < KERN_NV; v++) {
            vstore(out + b * ldo + v * KERN_VW, acc[b][v]);
        }
    }
}

/* tile() with nb a constant, for each nb the remainder may take. */
#define KERN_TILE_CASE(n)                                                                          \
    case n:                                                                                        \
        tile(x, ldx, n, w, ldw, rows, out, ldo);                                                   \
        break;

static void tile_rest(const double *restrict x, size_t ldx, size_t nb, const double *restrict w,
                      size_t ldw, size_t rows, double *restrict out, size_t ldo)
{
    switch (nb) {
        KERN_TILE_CASE(1)
#if KERN_NB > 1
        KERN_TILE_CASE(2)
#endif
#if KERN_NB > 2
        KERN_TILE_CASE(3)
#endif
#if KERN_NB > 3
        KERN_TILE_CASE(4)
#endif
#if KERN_NB > 4
        KERN_TILE_CASE(5)
#endif
#if KERN_NB > 5
        KERN_TILE_CASE(6)
#endif
#if KERN_NB > 6
        KERN_TILE_CASE(7)
#endif
#if KERN_NB > 7
        KERN_TILE_CASE(8)
#endif
#if KERN_NB > 8
        KERN_TILE_CASE(9)
#endif
#if KERN_NB > 9
        KERN_TILE_CASE(10)
#endif
#if KERN_NB > 10
        KERN_TILE_CASE(11)
#endif
#if KERN_NB > 11
#error "KERN_NB is at most 11 (add cases)"
#endif
    default:
        break;
    }
}

static void KERN_FN(mm)(const double *x, size_t ldx, size_t nb, const double *w, size_t ldw,
                        size_t rows, size_t c0, size_t c1, double *out, size_t ldo)
{
    size_t c = c0;

    for (; c + KERN_NC <= c1; c += KERN_NC) {
        size_t b = 0;
        for (; b + KERN_NB <= nb; b += KERN_NB) {
            tile(x + b * ldx, ldx, KERN_NB, w + c, ldw, rows, out + b * ldo + (c - c0), ldo);
        }
        if (b < nb) {
            tile_rest(x + b * ldx, ldx, nb - b, w + c, ldw, rows, out + b * ldo + (c - c0), ldo);
        }
    }
    /* The columns after the last whole tile: their sums side by side, i
     * outermost, so that they do not wait on one another. */
    if (c < c1) {
        for (size_t b = 0; b < nb; b++) {
            double acc[KERN_NC];
            for (size_t k = 0; k < c1 - c; k++) {
                acc[k] = 0.0;
            }
            for (size_t i = 0; i < rows; i++) {
                const double xi = x[b * ldx + i];
                for (size_t k = 0; k < c1 - c; k++) {
                    acc[k] += xi * w[i * ldw + c + k];
                }
            }
            for (size_t k = 0; k < c1 - c; k++) {
                out[b * ldo + (c + k - c0)] = acc[k];
            }
        }
    }
}

/* Layer l's area of block b: Kt (d rows of the capacity), then V. */
static inline const double *area(const model_block_t *b, size_t l, size_t d)
{
    return (const double *)(const void *)b->data + l * 2 * b->capacity * d;
}

/* The block after `b`, the i-th of the chain `bl` (kern.h), i then
 * counting it. */
static inline const model_block_t *chain_next(const model_block_t *b,
                                              const model_block_t *const *bl, size_t nbl, size_t *i)
{
    return ++*i < nbl ? bl[*i] : b->next;
}

/* Tiles of KERN_NC rows whose dot products score_tiles() computes side
 * by side: enough running sums that no add waits on the one before. */
#define KERN_SCORE_TILES 4

/* s[t * KERN_NC + c] = sum over j < d ascending of q[j] * kp[t][j * ld[t]
 * + c], for t < nt (<= KERN_SCORE_TILES) and c < KERN_NC: the dot products
 * of nt tiles of rows, each tile KERN_NC consecutive rows of one block's
 * Kt.  The missing tiles read a zero tile with stride 0 and are not
 * stored. */
static void score_tiles(const double *restrict q, const double *const *kp_in, const size_t *ld_in,
                        size_t nt, size_t d, double *restrict s)
{
    static const double zero[KERN_NC];
    const double *kp[KERN_SCORE_TILES];
    size_t ld[KERN_SCORE_TILES];
    vd acc[KERN_SCORE_TILES][KERN_NV];

    for (size_t t = 0; t < KERN_SCORE_TILES; t++) {
        kp[t] = t < nt ? kp_in[t] : zero;
        ld[t] = t < nt ? ld_in[t] : 0;
        for (size_t v = 0; v < KERN_NV; v++) {
            acc[t][v] = vsplat(0.0);
        }
    }
    for (size_t j = 0; j < d; j++) {
        const vd qj = vsplat(q[j]);
        for (size_t t = 0; t < KERN_SCORE_TILES; t++) {
            for (size_t v = 0; v < KERN_NV; v++) {
                acc[t][v] += qj * vload(kp[t] + j * ld[t] + v * KERN_VW);
            }
        }
    }
    for (size_t t = 0; t < nt; t++) {
        for (size_t v = 0; v < KERN_NV; v++) {
            vstore(s + t * KERN_NC + v * KERN_VW, acc[t][v]);
        }
    }
}

/* Zeros for the padding blocks of a vector of pieces (below): column j of
 * a block of capacity c is read at j * c, so d * c of them. */
#define KERN_ZERO_LEN 2048
static const double kern_zero[KERN_ZERO_LEN];

/* Vectors of rows score_pieces() carries at once: enough running sums
 * that no add waits on the one before. */
#define KERN_PIECE_VECS 4

/* The KERN_VW values of column j of Kt of the blocks p[0 .. KERN_VW / c -
 * 1], each of capacity c (c divides KERN_VW): lane g * c + k is row k of
 * block p[g], p[g][j * c + k].  Loads and lane moves only: no arithmetic. */
static inline __attribute__((always_inline)) vd pieces(const double *const *p, size_t c, size_t j)
{
#if KERN_VW == 8
    switch (c) {
    case 8:
        return vload(p[0] + j * 8);
    case 4:
        return _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_loadu_pd(p[0] + j * 4)),
                                  _mm256_loadu_pd(p[1] + j * 4), 1);
    case 2: {
        const __m256d lo = _mm256_insertf128_pd(_mm256_castpd128_pd256(_mm_loadu_pd(p[0] + j * 2)),
                                                _mm_loadu_pd(p[1] + j * 2), 1);
        const __m256d hi = _mm256_insertf128_pd(_mm256_castpd128_pd256(_mm_loadu_pd(p[2] + j * 2)),
                                                _mm_loadu_pd(p[3] + j * 2), 1);
        return _mm512_insertf64x4(_mm512_castpd256_pd512(lo), hi, 1);
    }
    default:
        return _mm512_set_pd(p[7][j], p[6][j], p[5][j], p[4][j], p[3][j], p[2][j], p[1][j],
                             p[0][j]);
    }
#elif KERN_VW == 4
    switch (c) {
    case 4:
        return vload(p[0] + j * 4);
    case 2:
        return _mm256_insertf128_pd(_mm256_castpd128_pd256(_mm_loadu_pd(p[0] + j * 2)),
                                    _mm_loadu_pd(p[1] + j * 2), 1);
    default:
        return _mm256_set_pd(p[3][j], p[2][j], p[1][j], p[0][j]);
    }
#else
    (void)c;
    return p[0][j];
#endif
}

/* s[v * KERN_VW + lane] = sum over j < d ascending of q[j] * pieces(p + v
 * * (KERN_VW / c), c, j)[lane], for v < nv: the dot products of nv *
 * KERN_VW rows of whole blocks of capacity c, in chain order.  c and nv
 * are constants where it is inlined. */
static inline __attribute__((always_inline)) void score_pieces(const double *restrict q,
                                                              const double *const *p, size_t c,
                                                              size_t nv, size_t d,
                                                              double *restrict s)
{
    const size_t g = KERN_VW / c;
    vd acc[KERN_PIECE_VECS];

    for (size_t v = 0; v < nv; v++) {
        acc[v] = vsplat(0.0);
    }
    for (size_t j = 0; j < d; j++) {
        const vd qj = vsplat(q[j]);
        for (size_t v = 0; v < nv; v++) {
            acc[v] += qj * pieces(p + v * g, c, j);
        }
    }
    for (size_t v = 0; v < nv; v++) {
        vstore(s + v * KERN_VW, acc[v]);
    }
}

/* score_pieces() with c and nv (KERN_PIECE_VECS or 1) constants. */
#define KERN_PIECES_C(cc)                                                                          \
    case cc:                                                                                       \
        if (nv == KERN_PIECE_VECS) {                                                               \
            score_pieces(q, p, cc, KERN_PIECE_VECS, d, s);                                         \
        } else {                                                                                   \
            score_pieces(q, p, cc, 1, d, s);                                                       \
        }                                                                                          \
        break;

static void score_pieces_any(const double *restrict q, const double *const *p, size_t c, size_t nv,
                             size_t d, double *restrict s)
{
    switch (c) {
        KERN_PIECES_C(1)
#if KERN_VW >= 2
        KERN_PIECES_C(2)
#endif
#if KERN_VW >= 4
        KERN_PIECES_C(4)
#endif
#if KERN_VW >= 8
        KERN_PIECES_C(8)
#endif
    default:
        break;
    }
}

/* Rows of the small blocks' path, one per lane. */
#define KERN_SMALL_LANES 8

static void KERN_FN(scores)(const double *q, const model_block_t *const *bl, size_t nbl, size_t n,
                            size_t l, size_t d, double *s)
{
    static const double zero = 0.0; /* the padding lanes' key, read with stride 0 */
    const model_block_t *b = bl[0];
    size_t r = 0, bi = 0;

    while (r < n) {
        const size_t cnt0 = n - r < b->capacity ? n - r : b->capacity;
        if (b->capacity >= KERN_NC && cnt0 >= KERN_NC) {
            /* Up to KERN_SCORE_TILES whole tiles of KERN_NC rows, from this
             * block and the next ones, side by side. */
            const double *kp[KERN_SCORE_TILES];
            size_t ld[KERN_SCORE_TILES], t = 0, col = 0;

            while (t < KERN_SCORE_TILES && r + t * KERN_NC + KERN_NC <= n &&
                   b->capacity >= KERN_NC && col + KERN_NC <= b->capacity) {
                kp[t] = area(b, l, d) + col;
                ld[t] = b->capacity;
                t++;
                col += KERN_NC;
                if (col + KERN_NC > b->capacity) {
                    /* The block's last whole tile; a capacity that is not a
                     * multiple of the tile leaves its tail to mm() below. */
                    if (col < b->capacity) {
                        break;
                    }
                    b = chain_next(b, bl, nbl, &bi);
                    col = 0;
                }
            }
            score_tiles(q, kp, ld, t, d, s + r);
            r += t * KERN_NC;
            if (col != 0) {
                /* Stopped inside a block: the rest of it by mm(). */
                const size_t rest = (n - r < b->capacity - col ? n - r : b->capacity - col);
                KERN_FN(mm)(q, d, 1, area(b, l, d) + col, b->capacity, d, 0, rest, s + r, rest);
                r += rest;
                b = chain_next(b, bl, nbl, &bi);
            }
            continue;
        }
        if (b->capacity >= KERN_NC || b->capacity > KERN_SMALL_LANES) {
            /* A block's last rows, short of a tile: its rows are the
             * columns of Kt. */
            KERN_FN(mm)(q, d, 1, area(b, l, d), b->capacity, d, 0, cnt0, s + r, cnt0);
            r += cnt0;
            b = chain_next(b, bl, nbl, &bi);
            continue;
        }
        if (KERN_VW % b->capacity == 0) {
            /* Whole blocks of one capacity c that divides KERN_VW (the
             * first of a chain): KERN_VW / c blocks a vector, vectors of
             * KERN_VW rows side by side (KERN_PIECE_VECS, or one). */
            const size_t c = b->capacity, g = KERN_VW / c;
            const double *p[KERN_PIECE_VECS * KERN_VW];
            const model_block_t *at = b;
            size_t k = 0, nv, ai = bi;

            /* Rows first: a chain given whole by its table (core/model.h)
             * has no block past the one holding row n - 1. */
            while (k < KERN_PIECE_VECS * g && r + (k + 1) * c <= n && at != NULL &&
                   at->capacity == c) {
                p[k++] = area(at, l, d);
                at = chain_next(at, bl, nbl, &ai);
            }
            nv = k / g >= KERN_PIECE_VECS ? KERN_PIECE_VECS : (k >= g ? 1 : 0);
            if (nv == 0 && k > 0 && d * c <= KERN_ZERO_LEN) {
                /* Fewer whole blocks than a vector takes (the last of their
                 * capacity): the rest of the vector reads zeros, and only
                 * the k * c rows of the blocks are kept.  Lanes never mix,
                 * so the padding changes no bit of them. */
                double row[KERN_VW];
                for (size_t i = k; i < g; i++) {
                    p[i] = kern_zero;
                }
                score_pieces_any(q, p, c, 1, d, row);
                memcpy(s + r, row, k * c * sizeof(double));
                r += k * c;
                for (size_t i = 0; i < k; i++) {
                    b = chain_next(b, bl, nbl, &bi);
                }
                continue;
            }
            if (nv > 0) {
                score_pieces_any(q, p, c, nv, d, s + r);
                r += nv * KERN_VW;
                for (size_t i = 0; i < nv * g; i++) {
                    b = chain_next(b, bl, nbl, &bi);
                }
                continue;
            }
        }
        /* Small blocks (the first of a chain): the rows of as many whole
         * small blocks as fit in KERN_SMALL_LANES lanes, each lane walking
         * its own row's column of Kt. */
        const double *kp[KERN_SMALL_LANES];
        size_t st[KERN_SMALL_LANES], k = 0;
        double acc[KERN_SMALL_LANES];

        while (r + k < n && b->capacity < KERN_NC && k + b->capacity <= KERN_SMALL_LANES) {
            const size_t cnt = n - r - k < b->capacity ? n - r - k : b->capacity;
            for (size_t slot = 0; slot < cnt; slot++) {
                kp[k] = area(b, l, d) + slot;
                st[k] = b->capacity;
                k++;
            }
            b = chain_next(b, bl, nbl, &bi);
        }
        for (size_t i = k; i < KERN_SMALL_LANES; i++) {
            kp[i] = &zero;
            st[i] = 0;
        }
        for (size_t i = 0; i < KERN_SMALL_LANES; i++) {
            acc[i] = 0.0;
        }
        for (size_t j = 0; j < d; j++) {
            const double qj = q[j];
            for (size_t i = 0; i < KERN_SMALL_LANES; i++) {
                acc[i] += qj * *kp[i];
                kp[i] += st[i];
            }
        }
        for (size_t i = 0; i < k; i++) {
            s[r + i] = acc[i];
        }
        r += k;
    }
}

/* Vectors of columns the widest pass of the sum of values carries: as
 * many running sums as leave registers for the factor and the loads. */
#if KERN_VW == 8
#define KERN_MIX_NV 16
#else
#define KERN_MIX_NV 8
#endif

/* a[j0 + c] = sum over r < n ascending of f[r] * V[r][j0 + c], for c < nv
 * * KERN_VW: one pass over the chain's rows, each row's nv vectors read in
 * one run.  nv is a constant where it is inlined. */
static inline __attribute__((always_inline)) void mix_pass(const double *restrict f,
                                                          const model_block_t *const *bl,
                                                          size_t nbl, size_t n, size_t l, size_t d,
                                                          size_t j0, size_t nv, double *restrict a)
{
    vd acc[KERN_MIX_NV];
    size_t r = 0, bi = 0;

    for (size_t v = 0; v < nv; v++) {
        acc[v] = vsplat(0.0);
    }
    for (const model_block_t *b = bl[0]; r < n; b = chain_next(b, bl, nbl, &bi)) {
        const size_t cnt = n - r < b->capacity ? n - r : b->capacity;
        const double *vb = area(b, l, d) + b->capacity * d + j0;
        for (size_t i = 0; i < cnt; i++) {
            const vd fr = vsplat(f[r + i]);
            for (size_t v = 0; v < nv; v++) {
                acc[v] += fr * vload(vb + i * d + v * KERN_VW);
            }
        }
        r += cnt;
    }
    for (size_t v = 0; v < nv; v++) {
        vstore(a + j0 + v * KERN_VW, acc[v]);
    }
}

static void KERN_FN(mix)(const double *f, const model_block_t *const *bl, size_t nbl, size_t n,
                         size_t l, size_t d, double *a)
{
    size_t j = 0;

    /* Passes of KERN_MIX_NV vectors of columns, then of halves of that,
     * down to one vector; each column's sum is the same whatever its pass. */
    for (; j + KERN_MIX_NV * KERN_VW <= d; j += KERN_MIX_NV * KERN_VW) {
        mix_pass(f, bl, nbl, n, l, d, j, KERN_MIX_NV, a);
    }
    if (j + (KERN_MIX_NV / 2) * KERN_VW <= d) {
        mix_pass(f, bl, nbl, n, l, d, j, KERN_MIX_NV / 2, a);
        j += (KERN_MIX_NV / 2) * KERN_VW;
    }
    if (j + (KERN_MIX_NV / 4) * KERN_VW <= d) {
        mix_pass(f, bl, nbl, n, l, d, j, KERN_MIX_NV / 4, a);
        j += (KERN_MIX_NV / 4) * KERN_VW;
    }
    for (; j + KERN_VW <= d; j += KERN_VW) {
        mix_pass(f, bl, nbl, n, l, d, j, 1, a);
    }
    for (; j < d; j++) {
        double acc = 0.0;
        size_t r = 0, bi = 0;
        for (const model_block_t *b = bl[0]; r < n; b = chain_next(b, bl, nbl, &bi)) {
            const size_t cnt = n - r < b->capacity ? n - r : b->capacity;
            const double *vb = area(b, l, d) + b->capacity * d + j;
            for (size_t i = 0; i < cnt; i++) {
                acc += f[r + i] * vb[i * d];
            }
            r += cnt;
        }
        a[j] = acc;
    }
}

const model__kern_t KERN_CAT(model__kern_, KERN_NAME) = {
    .name = KERN_STR(KERN_NAME),
    .mm = KERN_FN(mm),
    .scores = KERN_FN(scores),
    .mix = KERN_FN(mix),
};
