/*
 * kern.h: the SIMD kernels of core/ and their runtime dispatch (kern.c is
 * compiled once per variant; simd.c picks one).  Names carry `model__`.
 *
 * A kernel computes many independent sums of MODELS.md side by side, one
 * per (sequence, column), each starting at 0.0 and adding its terms in
 * ascending index order, every product and every addition a separate IEEE
 * operation (the variants are compiled with -ffp-contract=off).  The
 * vectors only put different sums in different lanes, so every variant
 * gives the bits of the plain loop.
 */
#ifndef SLOTD_CORE_KERN_H
#define SLOTD_CORE_KERN_H

#include <stddef.h>

/* out[b * ldo + (c - c0)] = sum over i < rows ascending of
 * x[b * ldx + i] * w[i * ldw + c], for b < nb and c0 <= c < c1. */
typedef void (*model__mm_fn)(const double *x, size_t ldx, size_t nb, const double *w, size_t ldw,
                             size_t rows, size_t c0, size_t c1, double *out, size_t ldo);

typedef struct model__kern {
    const char *name; /* "scalar", "avx2", "avx512" */
    model__mm_fn mm;
} model__kern_t;

/* The variants this build has (avx2 and avx512 only on x86-64). */
extern const model__kern_t model__kern_scalar;
#if SLOTD_KERN_X86
extern const model__kern_t model__kern_avx2;
extern const model__kern_t model__kern_avx512;
#endif

/* The variant in use: chosen once, at the first call (simd.c). */
const model__kern_t *model__kern(void);

#endif
