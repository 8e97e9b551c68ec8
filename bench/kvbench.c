/*
 * kvbench: what one cached step costs against the machine's memory
 * bandwidth, and how cached and uncached step times grow with the context.
 *
 *   kvbench [--quick] [--bw-mib N] [--rounds N] [--reps N]
 *           [--uncached-runs N] [--uncached-budget SEC] [--max-n N]
 *           [--clock cpu|wall] [--seed N]
 *
 * Three parts, all on the calling thread (single-threaded by design):
 *
 * 1. Read bandwidth.  A streaming sum of 64-bit words over a buffer of
 *    --bw-mib MiB (default 1024, far beyond the last-level cache), best and
 *    median of several passes.
 *
 * 2. Bandwidth of a cached `base` step.  A heap chain (core/model.h) is
 *    prefilled with the same random tokens as the uncached reference; the
 *    cached step at context n is model_run() of position n-1 on the chain
 *    holding n-1 entries, then model_pick() (which computes the logits from
 *    the state; a session's step does both), and rerunning a position
 *    rewrites its entry with the same bits, so the step can be timed again
 *    and again.  Bytes read per
 *    step: K/V 2*L*d*8*n, plus the weights the position touches: Wq, Wk,
 *    Wv, Wo of every layer (d*d*8 each), U (d*V*8) and one row each of E
 *    and P.  Each round is one bandwidth pass over the big buffer, then one
 *    step right after it ("cold": the pass has just evicted the caches, so
 *    K/V come from DRAM), then back-to-back steps ("warm").  The fraction of
 *    each round is computed from that round's own bandwidth pass, and the
 *    medians over the rounds are reported.
 *
 * 3. Cached against uncached.  For `small` and `base` at n = 64 ... max:
 *    the cached step as above (warm, median of --reps) and the uncached
 *    step: model_logits() over all n tokens on an empty preallocated chain,
 *    which is what an uncached generate does for every pick.  Cached and
 *    uncached runs alternate.  Every uncached run is checked bit for bit
 *    against the cached step (the V unrounded logits of model_pick_raw(),
 *    and the six-decimal logits).  An uncached cell is measured
 *    (at least one whole run) or printed as not measured with the reason;
 *    nothing is extrapolated.
 *
 * Clocks.  Every time is taken on two clocks: the wall clock and the
 * thread's CPU time.  On a shared machine the CPU time leaves out the
 * moments other processes held the CPU (memory stalls count in both), so
 * the growth table uses it unless --clock wall; part 2 prints both.
 *
 * Output is markdown, for bench/RESULTS.md.
 */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "core/model.h"

#define MIB ((size_t)1 << 20)
#define MAX_NS 16

typedef struct opts {
    bool quick;
    size_t bw_mib;
    unsigned bw_passes;       /* passes for part 1 */
    unsigned rounds;          /* rounds of part 2 */
    unsigned reps;            /* warm cached steps per measurement */
    unsigned uncached_runs;   /* uncached runs per cell at most */
    double uncached_budget;   /* seconds of uncached runs in all, then stop */
    uint32_t max_n;           /* largest context of part 3 */
    uint32_t min_n;           /* smallest context of part 3 */
    uint64_t seed;
} opts_t;

/* A moment on both clocks: wall (CLOCK_MONOTONIC) and this thread's CPU
 * time (CLOCK_THREAD_CPUTIME_ID).  On a shared machine the thread's CPU
 * time leaves out the time other processes held the CPU; memory stalls
 * count in both. */
typedef struct tm2 {
    double wall, cpu;
} tm2_t;

static bool use_wall; /* --wall: report wall-clock figures in the growth table */

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double now_s(void)
{
    return clock_s(CLOCK_MONOTONIC);
}

static tm2_t now2(void)
{
    tm2_t t = {clock_s(CLOCK_MONOTONIC), clock_s(CLOCK_THREAD_CPUTIME_ID)};
    return t;
}

static tm2_t since(tm2_t t0)
{
    tm2_t t = now2();
    t.wall -= t0.wall;
    t.cpu -= t0.cpu;
    return t;
}

/* The figure the growth table reports. */
static double pick_clock(tm2_t t)
{
    return use_wall ? t.wall : t.cpu;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, size_t n)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double minimum(const double *v, size_t n)
{
    double m = INFINITY;
    for (size_t i = 0; i < n; i++)
        if (v[i] < m)
            m = v[i];
    return m;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* ---- Part 1: read bandwidth ---- */

static volatile uint64_t sink;

typedef struct bwbuf {
    uint64_t *w;
    size_t words;
} bwbuf_t;

/* One streaming pass: the sum of every word, eight independent sums so
 * that the loads, not the adds, set the pace.  Returns bytes per second on
 * both clocks. */
static tm2_t bw_pass(const bwbuf_t *b)
{
    const uint64_t *restrict w = b->w;
    uint64_t acc[8] = {0};
    double bytes = (double)(b->words * sizeof(uint64_t));
    tm2_t t0 = now2(), t;

    for (size_t i = 0; i + 8 <= b->words; i += 8)
        for (int k = 0; k < 8; k++)
            acc[k] += w[i + k];
    t = since(t0);
    sink = acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
    t.wall = bytes / t.wall;
    t.cpu = bytes / t.cpu;
    return t;
}

static int bw_alloc(bwbuf_t *b, size_t mib)
{
    b->words = mib * MIB / sizeof(uint64_t);
    b->w = aligned_alloc(4096, b->words * sizeof(uint64_t));
    if (b->w == NULL)
        return -1;
    for (size_t i = 0; i < b->words; i++) /* touch every page: no faults in the timed passes */
        b->w[i] = i;
    return 0;
}

/* ---- A model with its cached chain ---- */

typedef struct bench_model {
    model_t *m;
    const char *name;
    uint32_t V, d, L, max_ctx, per;
    size_t entry, state_bytes;
    int64_t *tokens;   /* max_ctx random tokens */
    model_kv_t kv;     /* the cached chain, prefilled to max_ctx - 1 entries */
    model_kv_t ukv;    /* the uncached runs' chain */
    void *scratch;
    double *raw;       /* V unrounded logits of an uncached run */
    uint32_t filled;   /* entries prefilled: steps up to n = filled + 1 can be timed */
    double prefill_s;  /* seconds to prefill the cached chain */
} bench_model_t;

/* Bytes one cached step at context n reads, as the issue counts them. */
static double step_bytes(const bench_model_t *b, uint32_t n)
{
    double kv = 2.0 * b->L * b->d * 8.0 * n;
    double w = 4.0 * b->L * b->d * b->d * 8.0 + (double)b->d * b->V * 8.0 + 2.0 * b->d * 8.0;
    return kv + w;
}

static int bm_open(bench_model_t *b, const char *preset, uint64_t seed, uint32_t upto)
{
    uint64_t s = seed;
    double t0;

    memset(b, 0, sizeof(*b));
    if (model_create(preset, &b->m) != SLOTD_OK) {
        fprintf(stderr, "kvbench: model_create(%s) failed\n", preset);
        return -1;
    }
    b->name = preset;
    b->V = model_vocab(b->m);
    b->L = model_layers(b->m);
    b->max_ctx = model_max_ctx(b->m);
    b->per = model_block_positions(b->m);
    b->entry = model_entry_size(b->m);
    b->d = (uint32_t)(b->entry / (2 * (size_t)b->L * 8));
    b->state_bytes = model_state_size(b->m);
    b->tokens = malloc(b->max_ctx * sizeof(*b->tokens));
    b->scratch = malloc(model_scratch_size(b->m));
    b->raw = malloc(b->V * sizeof(double));
    if (b->tokens == NULL || b->scratch == NULL || b->raw == NULL ||
        model_kv_heap_alloc(b->m, b->max_ctx, &b->kv) != SLOTD_OK ||
        model_kv_heap_alloc(b->m, b->max_ctx, &b->ukv) != SLOTD_OK) {
        fprintf(stderr, "kvbench: no memory for %s\n", preset);
        return -1;
    }
    for (uint32_t i = 0; i < b->max_ctx; i++)
        b->tokens[i] = (int64_t)(splitmix(&s) % b->V);
    /* Touch the uncached chain once so that its first timed run pays no
     * page faults (the same for the cached one, prefilled below). */
    for (model_block_t *blk = b->ukv.head; blk != NULL; blk = blk->next)
        memset(blk->data, 0, model_block_bytes_for(b->m, blk->capacity) - sizeof(model_block_t));
    if (upto > b->max_ctx)
        upto = b->max_ctx;
    b->filled = upto - 1;
    t0 = now_s();
    for (uint32_t p = 0; p < b->filled; p++)
        model_run(b->m, &b->kv, (uint32_t)b->tokens[p], b->scratch);
    b->prefill_s = now_s() - t0;
    return 0;
}

static void bm_close(bench_model_t *b)
{
    if (b->m == NULL)
        return;
    model_kv_heap_free(&b->kv);
    model_kv_heap_free(&b->ukv);
    free(b->tokens);
    free(b->scratch);
    free(b->raw);
    model_destroy(b->m);
    b->m = NULL;
}

/* Sets the cached chain to hold n-1 entries (it holds at least that many
 * valid ones), ready to run position n-1. */
static void bm_seek(bench_model_t *b, uint32_t n)
{
    model_block_t *blk = b->kv.head;
    while (n - 1 - blk->first >= blk->capacity)
        blk = blk->next;
    b->kv.len = n - 1;
    b->kv.tail = blk;
}

/* One cached step at context n; returns its time in seconds on both
 * clocks.  The model's state then holds position n-1's residual x. */
static tm2_t bm_cached_step(bench_model_t *b, uint32_t n)
{
    tm2_t t0;

    bm_seek(b, n);
    t0 = now2();
    model_run(b->m, &b->kv, (uint32_t)b->tokens[n - 1], b->scratch);
    (void)model_pick(b->m, &b->kv, NULL);
    return since(t0);
}

/* One uncached step at context n: every position from an empty chain, as
 * model_logits() does.  Returns its wall time; *identical tells whether
 * its unrounded and rounded logits equal those of the cached step (whose
 * state the caller saved in `want`, `want_rounded`). */
static tm2_t bm_uncached_step(bench_model_t *b, uint32_t n, const double *want,
                              const double *want_rounded, double *logits, bool *identical)
{
    slotd_error_t err;
    uint64_t rows = 0;
    tm2_t t0, t;
    int rc;

    model_kv_rewind(&b->ukv);
    t0 = now2();
    rc = model_logits(b->m, b->tokens, n, &b->ukv, b->scratch, logits, &rows, &err);
    t = since(t0);
    if (rc != SLOTD_OK) {
        fprintf(stderr, "kvbench: model_logits(%s, n=%u) failed: %s\n", b->name, n, err.message);
        exit(2);
    }
    (void)model_pick_raw(b->m, &b->ukv, b->raw);
    *identical = rows == (uint64_t)b->L * n && b->ukv.len == n &&
                 memcmp(b->raw, want, b->V * sizeof(double)) == 0 &&
                 memcmp(logits, want_rounded, b->V * sizeof(double)) == 0;
    return t;
}

/* ---- Part 2 ---- */

/* Median, min and max of v[0..n-1] (sorts v). */
static void stats3(double *v, size_t n, double *med, double *mn, double *mx)
{
    *med = median(v, n);
    *mn = v[0];
    *mx = v[n - 1];
}

static void part_bandwidth_step(const opts_t *o, const bwbuf_t *bw, bench_model_t *b,
                                const uint32_t *ns, size_t nn, tm2_t bw_best)
{
    printf("\n## Cached `%s` step against read bandwidth\n\n", b->name);
    printf("%u rounds per n. A round: one %zu MiB bandwidth pass, one step right after it "
           "(*cold*: the pass has evicted the caches, K/V and weights come from DRAM), then %u "
           "back-to-back steps (*warm*, their median). Fraction = (bytes read per step / step "
           "time) / the bandwidth of the same round's pass; the table gives the median over "
           "the rounds and [min - max]. `cpu` rows use the thread's CPU time, `wall` rows the "
           "wall clock (both for the pass and for the step). Last column: the cold rate over "
           "the best pass of part 1 (cpu %.2f GB/s, wall %.2f GB/s).\n\n",
           o->rounds, o->bw_mib, o->reps, bw_best.cpu / 1e9, bw_best.wall / 1e9);
    printf("| n | MiB read per step (K/V + weights) | clock | pass GB/s | cold step ms | cold "
           "GB/s | cold fraction | warm step ms | warm GB/s | warm fraction | cold / best "
           "pass |\n");
    printf("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (size_t k = 0; k < nn; k++) {
        uint32_t n = ns[k];
        double bytes = step_bytes(b, n), kvb = 2.0 * b->L * b->d * 8.0 * n;
        unsigned R = o->rounds;
        double *v = calloc((size_t)R * 10 + (size_t)o->reps * 2, sizeof(double));
        double *bwv[2], *cold[2], *warm[2], *fc[2], *fw[2], *rep[2];

        if (v == NULL) {
            fprintf(stderr, "kvbench: no memory\n");
            exit(2);
        }
        for (int c = 0; c < 2; c++) {
            bwv[c] = v + (size_t)R * (5 * c + 0);
            cold[c] = v + (size_t)R * (5 * c + 1);
            warm[c] = v + (size_t)R * (5 * c + 2);
            fc[c] = v + (size_t)R * (5 * c + 3);
            fw[c] = v + (size_t)R * (5 * c + 4);
            rep[c] = v + (size_t)R * 10 + (size_t)o->reps * c;
        }
        for (unsigned r = 0; r < R; r++) {
            tm2_t p = bw_pass(bw), t = bm_cached_step(b, n);
            bwv[0][r] = p.cpu;
            bwv[1][r] = p.wall;
            cold[0][r] = t.cpu;
            cold[1][r] = t.wall;
            for (unsigned i = 0; i < o->reps; i++) {
                t = bm_cached_step(b, n);
                rep[0][i] = t.cpu;
                rep[1][i] = t.wall;
            }
            for (int c = 0; c < 2; c++) {
                warm[c][r] = median(rep[c], o->reps);
                fc[c][r] = bytes / cold[c][r] / bwv[c][r];
                fw[c][r] = bytes / warm[c][r] / bwv[c][r];
            }
        }
        for (int c = 0; c < 2; c++) {
            double best = c ? bw_best.wall : bw_best.cpu;
            double bwm = median(bwv[c], R), coldm = median(cold[c], R), warmm = median(warm[c], R);
            double fcm, fcn, fcx, fwm, fwn, fwx;
            stats3(fc[c], R, &fcm, &fcn, &fcx);
            stats3(fw[c], R, &fwm, &fwn, &fwx);
            printf("| %u | %.1f (%.1f + %.1f) | %s | %.2f | %.2f | %.2f | **%.2f** [%.2f - %.2f] "
                   "| %.2f | %.2f | %.2f [%.2f - %.2f] | %.2f |\n",
                   n, bytes / MIB, kvb / MIB, (bytes - kvb) / MIB, c ? "wall" : "cpu", bwm / 1e9,
                   coldm * 1e3, bytes / coldm / 1e9, fcm, fcn, fcx, warmm * 1e3,
                   bytes / warmm / 1e9, fwm, fwn, fwx, bytes / coldm / best);
        }
        fflush(stdout);
        free(v);
    }
}

/* ---- Part 3 ---- */

typedef struct cell {
    uint32_t n;
    uint64_t hash; /* FNV-1a of the cached step's unrounded logits: compares builds */
    double cached_med, cached_min; /* seconds */
    double unc_med, unc_min;
    unsigned unc_runs;
    int identical; /* 1 yes, 0 no, -1 not checked */
    char why[160];  /* why the uncached cell was not measured */
} cell_t;

static void part_growth(const opts_t *o, bench_model_t *b, double *budget_left)
{
    uint32_t ns[MAX_NS];
    cell_t cells[MAX_NS];
    size_t nn = 0;
    double *want = malloc(b->V * sizeof(double)), *want_r = malloc(b->V * sizeof(double));
    double *logits = malloc(b->V * sizeof(double));
    double *rep = calloc(o->reps * (o->uncached_runs + 1), sizeof(double));
    double *unc = calloc(o->uncached_runs, sizeof(double));

    if (!want || !want_r || !logits || !rep || !unc) {
        fprintf(stderr, "kvbench: no memory\n");
        exit(2);
    }
    for (uint32_t n = o->min_n; n <= b->filled + 1 && n <= o->max_n && nn < MAX_NS; n *= 2)
        ns[nn++] = n;

    for (size_t k = 0; k < nn; k++) {
        cell_t *c = &cells[k];
        uint32_t n = ns[k];
        size_t nrep = 0;

        memset(c, 0, sizeof(*c));
        c->n = n;
        c->identical = -1;
        /* The cached step's logits, the reference of the bit check. */
        (void)bm_cached_step(b, n);
        (void)model_pick_raw(b->m, &b->kv, want);
        (void)model_pick(b->m, &b->kv, want_r);
        c->hash = UINT64_C(0xcbf29ce484222325);
        for (size_t i = 0; i < b->V * sizeof(double); i++)
            c->hash = (c->hash ^ ((const unsigned char *)want)[i]) * UINT64_C(0x100000001b3);

        /* cached reps, then one uncached run, alternating */
        for (unsigned round = 0;; round++) {
            for (unsigned i = 0; i < o->reps; i++)
                rep[nrep++] = pick_clock(bm_cached_step(b, n));
            if (round >= o->uncached_runs)
                break;
            if (*budget_left <= 0) {
                if (c->unc_runs == 0)
                    snprintf(c->why, sizeof(c->why),
                             "not measured: the uncached budget (--uncached-budget %.0f s) "
                             "was spent on smaller n",
                             o->uncached_budget);
                break;
            }
            {
                bool same;
                tm2_t t = bm_uncached_step(b, n, want, want_r, logits, &same);
                unc[c->unc_runs++] = pick_clock(t);
                *budget_left -= t.wall;
                c->identical = (c->identical != 0 && same) ? 1 : 0;
            }
        }
        c->cached_min = minimum(rep, nrep);
        c->cached_med = median(rep, nrep);
        if (c->unc_runs > 0) {
            c->unc_min = minimum(unc, c->unc_runs);
            c->unc_med = median(unc, c->unc_runs);
        }
        fprintf(stderr, "kvbench: %s n=%u cached %.1f us, uncached %u run(s) %.3f s\n", b->name,
                n, c->cached_med * 1e6, c->unc_runs, c->unc_med);
    }

    printf("\n## `%s`: cached against uncached step time\n\n", b->name);
    printf("Times on the %s. Prefill of %u positions (cached, once): %.2f s wall. "
           "Cached: median [min] of the warm "
           "steps (%u per round, the rounds alternating with the uncached runs). Uncached: "
           "model_logits() over n tokens from an empty chain, median [min] of the runs. "
           "\"x prev\" is the growth from the row above (n doubles): about 2 for linear, "
           "4 for quadratic.\n\n",
           use_wall ? "wall clock" : "thread's CPU clock", b->filled, b->prefill_s, o->reps);
    printf("| n | cached step µs | x prev | uncached step ms | runs | x prev | uncached / cached | "
           "rows uncached / cached | bit-identical | logits FNV-1a |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n");
    for (size_t k = 0; k < nn; k++) {
        cell_t *c = &cells[k];
        char cx[32] = "", ux[32] = "";
        if (k > 0)
            snprintf(cx, sizeof(cx), "%.2f", c->cached_med / cells[k - 1].cached_med);
        if (k > 0 && c->unc_runs > 0 && cells[k - 1].unc_runs > 0)
            snprintf(ux, sizeof(ux), "%.2f", c->unc_med / cells[k - 1].unc_med);
        if (c->unc_runs > 0)
            printf("| %u | %.1f [%.1f] | %s | %.2f [%.2f] | %u | %s | %.0f | %u | %s | %016" PRIx64
                   " |\n",
                   c->n, c->cached_med * 1e6, c->cached_min * 1e6, cx, c->unc_med * 1e3,
                   c->unc_min * 1e3, c->unc_runs, ux, c->unc_med / c->cached_med, c->n,
                   c->identical == 1 ? "yes" : "**NO**", c->hash);
        else
            printf("| %u | %.1f [%.1f] | %s | %s | 0 | | | %u | | %016" PRIx64 " |\n", c->n,
                   c->cached_med * 1e6, c->cached_min * 1e6, cx, c->why, c->n, c->hash);
    }
    fflush(stdout);
    for (size_t k = 0; k < nn; k++)
        if (cells[k].identical == 0) {
            fprintf(stderr, "kvbench: %s n=%u: uncached logits differ from cached\n", b->name,
                    cells[k].n);
            exit(1);
        }
    free(want);
    free(want_r);
    free(logits);
    free(rep);
    free(unc);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvbench [--quick] [--bw-mib N] [--rounds N] [--reps N] [--uncached-runs N]\n"
            "               [--uncached-budget SEC] [--min-n N] [--max-n N] [--clock cpu|wall]\n"
            "               [--seed N]\n"
            "  --quick             fewer rounds and reps, n up to 1024, a 20 s uncached budget\n"
            "  --bw-mib N          bandwidth buffer in MiB (1024)\n"
            "  --rounds N          rounds of the bandwidth/step interleave (7; quick 3)\n"
            "  --reps N            warm cached steps per measurement (15; quick 5)\n"
            "  --uncached-runs N   uncached runs per cell at most (3; quick 1)\n"
            "  --uncached-budget S seconds of uncached runs in all (600; quick 20)\n"
            "  --max-n N           largest context of the growth table (4096; quick 1024)\n"
            "  --min-n N           smallest context of the growth table (64; doubled up)\n"
            "  --clock cpu|wall    clock of the growth table (cpu: the thread's CPU time)\n"
            "  --seed N            seed of the random tokens (1)\n");
}

int main(int argc, char **argv)
{
    opts_t o = {false, 1024, 7, 7, 15, 3, 600, 4096, 64, 1};
    bool set_rounds = false, set_reps = false, set_runs = false, set_budget = false,
         set_maxn = false;
    bwbuf_t bw;
    double *pass, budget_left;
    tm2_t bw_best;
    bench_model_t b;
    struct utsname un;
    char host[256] = "?";
    static const uint32_t base_ns[] = {256, 1024, 2048, 4096};
    static const uint32_t base_ns_quick[] = {1024};

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quick") == 0) {
            o.quick = true;
            continue;
        }
        if (strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (v == NULL) {
            usage(stderr);
            return 2;
        }
        i++;
        if (strcmp(a, "--bw-mib") == 0)
            o.bw_mib = strtoull(v, NULL, 10);
        else if (strcmp(a, "--rounds") == 0)
            o.rounds = (unsigned)strtoul(v, NULL, 10), set_rounds = true;
        else if (strcmp(a, "--reps") == 0)
            o.reps = (unsigned)strtoul(v, NULL, 10), set_reps = true;
        else if (strcmp(a, "--uncached-runs") == 0)
            o.uncached_runs = (unsigned)strtoul(v, NULL, 10), set_runs = true;
        else if (strcmp(a, "--uncached-budget") == 0)
            o.uncached_budget = strtod(v, NULL), set_budget = true;
        else if (strcmp(a, "--min-n") == 0)
            o.min_n = (uint32_t)strtoul(v, NULL, 10);
        else if (strcmp(a, "--max-n") == 0)
            o.max_n = (uint32_t)strtoul(v, NULL, 10), set_maxn = true;
        else if (strcmp(a, "--clock") == 0)
            use_wall = strcmp(v, "wall") == 0;
        else if (strcmp(a, "--seed") == 0)
            o.seed = strtoull(v, NULL, 10);
        else {
            usage(stderr);
            return 2;
        }
    }
    if (o.quick) {
        o.bw_passes = 3;
        if (!set_rounds)
            o.rounds = 3;
        if (!set_reps)
            o.reps = 5;
        if (!set_runs)
            o.uncached_runs = 1;
        if (!set_budget)
            o.uncached_budget = 20;
        if (!set_maxn)
            o.max_n = 1024;
    }
    if (o.bw_mib == 0 || o.rounds == 0 || o.reps == 0 || o.min_n < 1 || o.max_n < o.min_n) {
        usage(stderr);
        return 2;
    }

    gethostname(host, sizeof(host));
    uname(&un);
    {
        time_t t = time(NULL);
        char date[64];
        strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", gmtime(&t));
        printf("# kvbench%s (%s)\n\n", o.quick ? " --quick" : "", date);
    }
    printf("- %ld CPUs online, kernel %s %s; one thread; each figure says its clock: the "
           "thread's CPU time (CLOCK_THREAD_CPUTIME_ID) or the wall clock (CLOCK_MONOTONIC)\n",
           sysconf(_SC_NPROCESSORS_ONLN), un.sysname, un.release);

    /* Part 1 */
    if (bw_alloc(&bw, o.bw_mib) != 0) {
        fprintf(stderr, "kvbench: no memory for the %zu MiB buffer\n", o.bw_mib);
        return 2;
    }
    pass = calloc(2 * (size_t)o.bw_passes, sizeof(double));
    if (pass == NULL)
        return 2;
    for (unsigned i = 0; i < o.bw_passes; i++) {
        tm2_t t = bw_pass(&bw);
        pass[i] = t.cpu;
        pass[o.bw_passes + i] = t.wall;
    }
    printf("\n## Single-thread read bandwidth\n\n");
    printf("Sum of 64-bit words (8 independent sums) over a %zu MiB buffer, %u passes "
           "(GB = 10^9 bytes):\n\n"
           "| clock | best GB/s | median GB/s | worst GB/s |\n|---|---:|---:|---:|\n",
           o.bw_mib, o.bw_passes);
    for (int c = 0; c < 2; c++) {
        double med, mn, mx;
        stats3(pass + (size_t)c * o.bw_passes, o.bw_passes, &med, &mn, &mx);
        if (c == 0)
            bw_best.cpu = mx;
        else
            bw_best.wall = mx;
        printf("| %s | **%.2f** | %.2f | %.2f |\n", c ? "wall" : "cpu", mx / 1e9, med / 1e9,
               mn / 1e9);
    }
    fflush(stdout);

    /* Part 2: base */
    fprintf(stderr, "kvbench: prefilling base...\n");
    if (bm_open(&b, "base", o.seed, o.max_n > 1024 ? o.max_n : 1024) != 0)
        return 2;
    fprintf(stderr, "kvbench: base prefill %.1f s\n", b.prefill_s);
    if (o.quick)
        part_bandwidth_step(&o, &bw, &b, base_ns_quick, 1, bw_best);
    else
    {
        uint32_t ns[4];
        size_t nn = 0;
        for (size_t k = 0; k < sizeof(base_ns) / sizeof(base_ns[0]); k++)
            if (base_ns[k] <= b.filled + 1)
                ns[nn++] = base_ns[k];
        part_bandwidth_step(&o, &bw, &b, ns, nn, bw_best);
    }
    free(bw.w);
    free(pass);

    /* Part 3: small, then base (already prefilled) */
    budget_left = o.uncached_budget;
    {
        bench_model_t sm;
        if (bm_open(&sm, "small", o.seed, o.max_n) != 0)
            return 2;
        part_growth(&o, &sm, &budget_left);
        bm_close(&sm);
    }
    part_growth(&o, &b, &budget_left);
    bm_close(&b);

    printf("\nCommand: `kvbench");
    for (int i = 1; i < argc; i++)
        printf(" %s", argv[i]);
    printf("`\n");
    return 0;
}
