/*
 * kern.h: the SIMD kernels of core/ and their runtime dispatch (kern.c is
 * compiled once per variant; simd.c picks one).  Names carry `model__`.
 *
 * A kernel computes many independent sums of docs/models.md side by side, one
 * per (sequence, column), each starting at 0.0 and adding its terms in
 * ascending index order, every product and every addition a separate IEEE
 * operation (the variants are compiled with -ffp-contract=off).  The
 * vectors only put different sums in different lanes, so every variant
 * gives the bits of the plain loop.
 */
#ifndef SLOTD_CORE_KERN_H
#define SLOTD_CORE_KERN_H

#include <stddef.h>

#include "core/model.h"

/* out[b * ldo + (c - c0)] = sum over i < rows ascending of
 * x[b * ldx + i] * w[i * ldw + c], for b < nb and c0 <= c < c1. */
typedef void (*model__mm_fn)(const double *x, size_t ldx, size_t nb, const double *w, size_t ldw,
                             size_t rows, size_t c0, size_t c1, double *out, size_t ldo);

/* A chain as the attention kernels walk it: its first nbl (>= 1) blocks
 * in order, bl[0] the head; past bl[nbl - 1] the chain goes on through
 * `next`, unless bl is a block table (core/model.h) that holds every
 * block with one of the n rows: then nothing past them is read, as their
 * `next` is not a link.  With the blocks' addresses known up front, their
 * headers load side by side rather than one `next` after another. */

/* An attention row's dot products: s[r] = sum over j < d ascending of
 * q[j] * K[r][j], for r < n, K being layer l's keys of the chain `bl`
 * (attn.c's block layout: Kt, d rows of the block's capacity, then V). */
typedef void (*model__scores_fn)(const double *q, const model_block_t *const *bl, size_t nbl,
                                 size_t n, size_t l, size_t d, double *s);

/* An attention row's sum of values: a[j] = sum over r < n ascending of
 * f[r] * V[r][j], for j < d, V being layer l's values of the chain `bl`. */
typedef void (*model__mix_fn)(const double *f, const model_block_t *const *bl, size_t nbl, size_t n,
                              size_t l, size_t d, double *a);

typedef struct model__kern {
    const char *name; /* "scalar", "avx2", "avx512" */
    model__mm_fn mm;
    model__scores_fn scores;
    model__mix_fn mix;
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
