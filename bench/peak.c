/*
 * peak.c: the multiply-then-add loop of bench/roofline.c, compiled once per
 * SIMD variant (PEAK_NAME, PEAK_VW doubles per vector) with that variant's
 * instruction set and -ffp-contract=off, as core/kern.c is; roofline.c
 * calls a variant only once the CPU has said it has it.  Single thread.
 *
 * PEAK_ACC independent chains, each acc = acc * y + x per iteration (a
 * multiply, then an add: the two operations of a kernel's term): enough
 * chains that their latency never stalls the pipes, few enough that they
 * stay in registers.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define PEAK_CAT2(a, b) a##b
#define PEAK_CAT(a, b) PEAK_CAT2(a, b)

#if PEAK_VW == 1
typedef double vd;
#define PEAK_ACC 12
#else
typedef double vd __attribute__((vector_size(PEAK_VW * sizeof(double))));
#define PEAK_ACC (PEAK_VW == 8 ? 24 : 12)
#endif

uint64_t PEAK_CAT(roofline_peak_, PEAK_NAME)(uint64_t iters, const double *in, double *out);

/* Runs `iters` iterations; returns the multiply-adds done.  in[0..1] are
 * the factors (the caller reads them from a volatile, so the compiler
 * cannot fold the loop); out[0] gets a sum of the results. */
uint64_t PEAK_CAT(roofline_peak_, PEAK_NAME)(uint64_t iters, const double *in, double *out)
{
    vd acc[PEAK_ACC], x, y;
    double s = 0.0;

    x = (vd){0} + in[0];
    y = (vd){0} + in[1];
    for (int k = 0; k < PEAK_ACC; k++) {
        acc[k] = (vd){0} + (double)k;
    }
    /* acc = acc * y + x: a product and a sum on every sum's chain, each
     * chain's latency hidden behind the others'; with 0 < y < 1 the sums
     * settle at x / (1 - y), never denormal nor infinite. */
    for (uint64_t i = 0; i < iters; i++) {
        for (int k = 0; k < PEAK_ACC; k++) {
            acc[k] = acc[k] * y + x;
        }
    }
    for (int k = 0; k < PEAK_ACC; k++) {
        double lanes[PEAK_VW];
        memcpy(lanes, &acc[k], sizeof(lanes));
        for (int l = 0; l < PEAK_VW; l++) {
            s += lanes[l];
        }
    }
    out[0] = s;
    return iters * PEAK_ACC * PEAK_VW;
}
