/*
 * kern.c: the matrix product of a batch, model__mm_fn (kern.h), compiled
 * once per SIMD variant.  The build compiles this file three times on
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
 * weight serves KERN_NB sequences.  Each lane is one sum of MODELS.md,
 * 0.0 then += x[b][i] * w[i][c] with i ascending, a multiply then an add
 * (-ffp-contract=off), so the bits are those of the scalar loop.  The
 * tiles walk the columns outermost, so a strip of w (rows x tile width)
 * stays in the near caches while every tile of sequences reads it.
 * Columns left over after the last whole tile are summed one at a time.
 */
#include "core/kern.h"

#include <string.h>

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
    for (; c < c1; c++) {
        for (size_t b = 0; b < nb; b++) {
            double acc = 0.0;
            for (size_t i = 0; i < rows; i++) {
                acc += x[b * ldx + i] * w[i * ldw + c];
            }
            out[b * ldo + (c - c0)] = acc;
        }
    }
}

const model__kern_t KERN_CAT(model__kern_, KERN_NAME) = {
    .name = KERN_STR(KERN_NAME),
    .mm = KERN_FN(mm),
};
