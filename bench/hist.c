/*
 * hist.c: the log-linear latency histogram of hist.h.  Bucket i < 128 holds
 * exactly the value i; above that, the values [2^e, 2^(e+1)) share 64
 * buckets of width 2^(e-6).  Recording is a count-leading-zeros and a shift.
 */
#include "hist.h"

#include <string.h>

static unsigned bucket_of(uint64_t v)
{
    unsigned e;

    if (v < HIST_EXACT) {
        return (unsigned)v;
    }
    if (v >= (UINT64_C(1) << HIST_MAX_EXP)) {
        v = (UINT64_C(1) << HIST_MAX_EXP) - 1;
    }
    e = 63u - (unsigned)__builtin_clzll(v);
    return HIST_EXACT + (e - 7u) * HIST_SUB + (unsigned)((v >> (e - 6u)) - HIST_SUB);
}

static uint64_t bucket_upper(unsigned i)
{
    unsigned e;
    uint64_t sub;

    if (i < HIST_EXACT) {
        return i;
    }
    e = (i - HIST_EXACT) / HIST_SUB + 7u;
    sub = (i - HIST_EXACT) % HIST_SUB + HIST_SUB;
    return ((sub + 1) << (e - 6u)) - 1;
}

void hist_reset(hist_t *h)
{
    memset(h, 0, sizeof(*h));
    h->min = UINT64_MAX;
}

void hist_record(hist_t *h, uint64_t us)
{
    h->counts[bucket_of(us)]++;
    h->total++;
    h->sum += us;
    if (us < h->min) {
        h->min = us;
    }
    if (us > h->max) {
        h->max = us;
    }
}

void hist_merge(hist_t *dst, const hist_t *src)
{
    for (unsigned i = 0; i < HIST_BUCKETS; i++) {
        dst->counts[i] += src->counts[i];
    }
    dst->total += src->total;
    dst->sum += src->sum;
    if (src->min < dst->min) {
        dst->min = src->min;
    }
    if (src->max > dst->max) {
        dst->max = src->max;
    }
}

uint64_t hist_percentile(const hist_t *h, double pct)
{
    uint64_t rank;
    uint64_t seen = 0;
    double want;

    if (h->total == 0) {
        return 0;
    }
    if (pct >= 100.0) {
        return h->max;
    }
    want = pct / 100.0 * (double)h->total;
    rank = (uint64_t)want;
    if ((double)rank < want) {
        rank++;
    }
    if (rank == 0) {
        rank = 1;
    }
    for (unsigned i = 0; i < HIST_BUCKETS; i++) {
        seen += h->counts[i];
        if (seen >= rank) {
            uint64_t up = bucket_upper(i);
            return up < h->max ? up : h->max;
        }
    }
    return h->max;
}

double hist_mean(const hist_t *h)
{
    return h->total == 0 ? 0.0 : (double)h->sum / (double)h->total;
}
