/*
 * hist.h: a log-linear latency histogram in microseconds, in the manner of
 * HdrHistogram: exact below 128 µs, then 64 sub-buckets per power of two, so
 * that any recorded value is known to within 1/64 (1.6 %) of itself.
 */
#ifndef SLOTD_BENCH_HIST_H
#define SLOTD_BENCH_HIST_H

#include <stdint.h>

#define HIST_EXACT 128u
#define HIST_SUB 64u
#define HIST_MAX_EXP 46u
#define HIST_BUCKETS (HIST_EXACT + HIST_SUB * (HIST_MAX_EXP - 6u))

/** A histogram.  Plain value type, no owned memory; about 21 KiB. */
typedef struct hist {
    uint64_t counts[HIST_BUCKETS];
    uint64_t total;
    uint64_t min;
    uint64_t max;
    uint64_t sum;
} hist_t;

/** Empties `h`. */
void hist_reset(hist_t *h);

/** Records one value in microseconds (values past 2^46 µs are clamped). */
void hist_record(hist_t *h, uint64_t us);

/** Adds every count of `src` to `dst`. */
void hist_merge(hist_t *dst, const hist_t *src);

/** The value at percentile `pct` (0..100): the upper edge of the bucket that
 * holds the ceil(pct/100 * total)-th smallest value, never above the exact
 * maximum.  0 for an empty histogram. */
uint64_t hist_percentile(const hist_t *h, double pct);

/** The exact mean of the recorded values, 0 for an empty histogram. */
double hist_mean(const hist_t *h);

#endif
