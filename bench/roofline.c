/*
 * roofline: this machine's read bandwidth and peak rate of double
 * multiply-then-add, and each batch kernel's fraction of them.
 *
 *   roofline [--quick] [--seconds S] [--max-mib N] [--bw-mib N]
 *            [--model NAME] [--n N] [--batch B] [--no-prefill]
 *
 * --model, --n and --batch keep only the cells of that model, context
 * and batch size (for a profile of one kernel); --no-prefill skips part 5.
 *
 * Single thread, on the calling core.  Times are the thread's CPU time
 * (CLOCK_THREAD_CPUTIME_ID), so that time the shared machine gives to
 * others does not count; the wall clock is printed beside the rates.
 *
 * 1. Read bandwidth: a streaming sum over --bw-mib MiB (default 512), best
 *    of five passes.
 * 2. Peak multiply-then-add: bench/peak.c on every SIMD variant the CPU has
 *    (acc = acc * y + x on enough independent chains to fill the pipes; a
 *    multiply and an add, as the kernels do; no FMA), best of five runs.
 *    The widest variant's rate is "the peak".
 * 3. Batched steps: for `small` and `base` at context n = 64, 512, 4096
 *    (where max_ctx allows), batch sizes 1 to 64: B chains holding n - 1
 *    random entries each, and a step is model_pick_batch() then
 *    model_run_batch() of the picks (what the daemon's batched step does),
 *    the position then rewound so that the step repeats.  B = 1 is the
 *    single path (model_pick(), model_run()).  Per step: multiply-adds
 *    L*4*d*d + d*V (products) + L*2*n*d (attention: scores and the sum of
 *    values), and bytes: the weights once per batch, each chain's n
 *    entries.  Printed: steps/s, the fraction of the peak, and the
 *    fraction of the bandwidth.  A cell whose chains would pass --max-mib
 *    (default 2048) is not measured, and says so.
 * 4. The product kernel alone: model_pick_batch() of B sequences (the d x V
 *    unembedding, no attention), multiply-adds per second and the fraction
 *    of the peak.
 * 5. Prefill of 512 and 4096 tokens (where max_ctx allows): model_prefill()
 *    against position-by-position model_run(), on an empty chain; the same
 *    fractions.  Multiply-adds L*4*d*d per position plus L*2*d*(p+1) for
 *    position p's attention.
 *
 * The SIMD variant of the kernels is the one core/ chose (SLOTD_SIMD may
 * force another); its name is printed.  Figures only: nothing is asserted.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/model.h"

uint64_t roofline_peak_scalar(uint64_t iters, const double *in, double *out);
#if SLOTD_KERN_X86
uint64_t roofline_peak_avx2(uint64_t iters, const double *in, double *out);
uint64_t roofline_peak_avx512(uint64_t iters, const double *in, double *out);
#endif

static double cpu_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double wall_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng = 1;

static uint64_t rnd(void)
{
    uint64_t z = (rng += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static double seconds = 0.3;
static size_t max_mib = 2048;

static double bandwidth(size_t mib)
{
    size_t n = mib * 1024 * 1024 / sizeof(uint64_t);
    uint64_t *buf = malloc(n * sizeof(uint64_t));
    volatile uint64_t sink;
    double best = 0;

    if (buf == NULL) {
        fprintf(stderr, "roofline: no memory for %zu MiB\n", mib);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) {
        buf[i] = i;
    }
    for (int pass = 0; pass < 5; pass++) {
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        double t0 = cpu_now(), t;
        for (size_t i = 0; i + 4 <= n; i += 4) {
            s0 += buf[i];
            s1 += buf[i + 1];
            s2 += buf[i + 2];
            s3 += buf[i + 3];
        }
        t = cpu_now() - t0;
        sink = s0 + s1 + s2 + s3;
        if (n * sizeof(uint64_t) / t > best) {
            best = (double)(n * sizeof(uint64_t)) / t;
        }
    }
    (void)sink;
    free(buf);
    return best;
}

typedef uint64_t (*peak_fn)(uint64_t, const double *, double *);

static double peak_of(peak_fn fn)
{
    static volatile double factors[2] = {1e-3, 0.999};
    double in[2] = {factors[0], factors[1]}, out[1], best = 0;
    uint64_t iters = 1 << 20;

    for (int run = 0; run < 5; run++) {
        double t0 = cpu_now(), t;
        uint64_t ops = fn(iters, in, out);
        t = cpu_now() - t0;
        if (t < 0.1) {
            iters *= 2;
            run--;
            continue;
        }
        if ((double)ops / t > best) {
            best = (double)ops / t;
        }
    }
    return best;
}

/* Chains of n - 1 random entries (room for n) and random states. */
static int chains_make(const model_t *m, model_kv_t *kv, size_t nb, uint32_t n)
{
    for (size_t b = 0; b < nb; b++) {
        if (model_kv_heap_alloc(m, n, &kv[b]) != SLOTD_OK) {
            return -1;
        }
        for (model_block_t *blk = kv[b].head; blk != NULL; blk = blk->next) {
            double *v = (double *)(void *)blk->data;
            for (size_t i = 0; i < blk->capacity * model_entry_size(m) / sizeof(double); i++) {
                v[i] = (double)(rnd() >> 11) * 0x1p-53 - 0.5;
            }
        }
        for (size_t i = 0; i < model_state_size(m) / sizeof(double); i++) {
            ((double *)kv[b].state)[i] = (double)(rnd() >> 11) * 0x1p-53 - 0.5;
        }
        kv[b].len = n - 1;
        kv[b].tail = kv[b].head;
        while (kv[b].len - kv[b].tail->first >= kv[b].tail->capacity) {
            kv[b].tail = kv[b].tail->next;
        }
    }
    return 0;
}

static void step_cell(const model_t *m, uint32_t n, size_t nb, double peak, double bw, void *scratch)
{
    const double d = (double)(model_state_size(m) / sizeof(double));
    const double L = model_layers(m), V = model_vocab(m);
    const double ma = L * 4 * d * d + d * V + L * 2 * n * d;
    const double weights = (L * 4 * d * d + d * V) * 8, kvbytes = (double)model_entry_size(m) * n;
    size_t chain_bytes = 0;
    model_kv_t kv[MODEL_BATCH_MAX], *pkv[MODEL_BATCH_MAX];
    model_block_t *tail0[MODEL_BATCH_MAX];
    uint32_t tok[MODEL_BATCH_MAX];
    double t0, w0, t, w, rate;
    unsigned reps = 0;

    model_chain_blocks(m, n, 64, &chain_bytes);
    if (chain_bytes * nb > max_mib * 1024 * 1024) {
        printf("| %s | %u | %zu | not measured: %zu MiB of chains pass --max-mib %zu | | | |\n",
               model_name(m), n, nb, chain_bytes * nb >> 20, max_mib);
        return;
    }
    if (chains_make(m, kv, nb, n) != 0) {
        printf("| %s | %u | %zu | not measured: no memory | | | |\n", model_name(m), n, nb);
        return;
    }
    for (size_t b = 0; b < nb; b++) {
        pkv[b] = &kv[b];
        tail0[b] = kv[b].tail;
    }
    t0 = cpu_now();
    w0 = wall_now();
    do {
        model_pick_batch(m, (const model_kv_t *const *)pkv, nb, tok, NULL, scratch);
        model_run_batch(m, pkv, tok, nb, scratch);
        for (size_t b = 0; b < nb; b++) {
            kv[b].len = n - 1;
            kv[b].tail = tail0[b];
        }
        reps++;
        t = cpu_now() - t0;
    } while (t < seconds || reps < 3);
    w = wall_now() - w0;
    rate = (double)reps * (double)nb / t;
    printf("| %s | %u | %zu | %.0f | %.1f | %.1f %% | %.1f %% | %.0f |\n", model_name(m), n, nb,
           rate, 1e6 / rate, 100.0 * ma * rate / peak,
           100.0 * (weights / (double)nb + kvbytes) * rate / bw, (double)reps * (double)nb / w);
    for (size_t b = 0; b < nb; b++) {
        model_kv_heap_free(&kv[b]);
    }
}

/* The product kernel alone: model_pick_batch() of nb sequences, the
 * d x V product of the unembedding shared by the batch (no attention,
 * no entry written), as a fraction of the peak. */
static void pick_cell(const model_t *m, size_t nb, double peak, void *scratch)
{
    const double d = (double)(model_state_size(m) / sizeof(double)), V = model_vocab(m);
    model_kv_t kv[MODEL_BATCH_MAX], *pkv[MODEL_BATCH_MAX];
    uint32_t tok[MODEL_BATCH_MAX];
    double t0 = 0, t;
    unsigned reps = 0;

    if (chains_make(m, kv, nb, 2) != 0) {
        printf("| %s | %zu | not measured: no memory | | |\n", model_name(m), nb);
        return;
    }
    for (size_t b = 0; b < nb; b++) {
        pkv[b] = &kv[b];
    }
    t0 = cpu_now();
    do {
        model_pick_batch(m, (const model_kv_t *const *)pkv, nb, tok, NULL, scratch);
        reps++;
        t = cpu_now() - t0;
    } while (t < seconds || reps < 3);
    printf("| %s | %zu | %.1f | %.1f | %.1f %% |\n", model_name(m), nb, t / reps * 1e6,
           d * V * (double)nb * reps / t / 1e9, 100.0 * d * V * (double)nb * reps / t / peak);
    for (size_t b = 0; b < nb; b++) {
        model_kv_heap_free(&kv[b]);
    }
}

static void prefill_cell(const model_t *m, uint32_t n, double peak, void *scratch)
{
    const double d = (double)(model_state_size(m) / sizeof(double)), L = model_layers(m);
    double ma = 0, t_single, t_batch, t0;
    uint32_t *tok = malloc(n * sizeof(uint32_t));
    model_kv_t kv;

    if (n > model_max_ctx(m)) {
        printf("| %s | %u | not measured: past max_ctx %u | | | |\n", model_name(m), n,
               model_max_ctx(m));
        free(tok);
        return;
    }
    for (uint32_t p = 0; p < n; p++) {
        tok[p] = (uint32_t)(rnd() % model_vocab(m));
        ma += L * 4 * d * d + L * 2 * d * (p + 1);
    }
    if (tok == NULL || model_kv_heap_alloc(m, n, &kv) != SLOTD_OK) {
        printf("| %s | %u | not measured: no memory | | | |\n", model_name(m), n);
        free(tok);
        return;
    }
    t0 = cpu_now();
    for (uint32_t p = 0; p < n; p++) {
        model_run(m, &kv, tok[p], scratch);
    }
    t_single = cpu_now() - t0;
    model_kv_rewind(&kv);
    t0 = cpu_now();
    model_prefill(m, &kv, tok, n, scratch);
    t_batch = cpu_now() - t0;
    printf("| %s | %u | %.1f | %.1f | %.2f | %.1f %% |\n", model_name(m), n, t_single * 1e3,
           t_batch * 1e3, t_single / t_batch, 100.0 * ma / t_batch / peak);
    model_kv_heap_free(&kv);
    free(tok);
}

int main(int argc, char **argv)
{
    static const char *names[] = {"small", "base"};
    static const uint32_t ctxs[] = {64, 512, 4096};
    static const size_t sizes[] = {1, 2, 4, 8, 16, 32, 64};
    size_t bw_mib = 512, only_batch = 0;
    uint32_t only_n = 0;
    const char *only_model = NULL;
    bool quick = false, prefill = true;
    double bw, peak = 0;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = true;
            seconds = 0.05;
        } else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
            seconds = atof(argv[++i]);
        } else if (strcmp(argv[i], "--max-mib") == 0 && i + 1 < argc) {
            max_mib = (size_t)atol(argv[++i]);
        } else if (strcmp(argv[i], "--bw-mib") == 0 && i + 1 < argc) {
            bw_mib = (size_t)atol(argv[++i]);
        } else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc) {
            only_model = argv[++i];
        } else if (strcmp(argv[i], "--n") == 0 && i + 1 < argc) {
            only_n = (uint32_t)atol(argv[++i]);
        } else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
            only_batch = (size_t)atol(argv[++i]);
        } else if (strcmp(argv[i], "--no-prefill") == 0) {
            prefill = false;
        } else {
            fprintf(stderr, "usage: roofline [--quick] [--seconds S] [--max-mib N] [--bw-mib N]\n"
                            "                [--model NAME] [--n N] [--batch B] [--no-prefill]\n");
            return 2;
        }
    }
    if (quick) {
        bw_mib = 128;
    }

    bw = bandwidth(bw_mib);
    printf("read bandwidth: %.2f GB/s (best of 5 passes over %zu MiB)\n", bw / 1e9, bw_mib);
    for (size_t i = 0; model_simd_supported(i) != NULL; i++) {
        const char *v = model_simd_supported(i);
        peak_fn fn = roofline_peak_scalar;
#if SLOTD_KERN_X86
        if (strcmp(v, "avx2") == 0) {
            fn = roofline_peak_avx2;
        } else if (strcmp(v, "avx512") == 0) {
            fn = roofline_peak_avx512;
        }
#endif
        double r = peak_of(fn);
        printf("peak multiply-then-add, %s: %.2f G/s\n", v, r / 1e9);
        if (strcmp(v, model_simd()) == 0) {
            peak = r;
        }
    }
    printf("kernels: %s (the peak below is that variant's)\n\n", model_simd());

    printf("| model | n | B | steps/s | us/step | of peak | of bandwidth | steps/s wall |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (size_t k = 0; k < 2; k++) {
        model_t *m = NULL;
        void *scratch;
        if (only_model != NULL && strcmp(only_model, names[k]) != 0) {
            continue;
        }
        if (model_create(names[k], &m) != SLOTD_OK) {
            return 1;
        }
        scratch = malloc(model_scratch_size(m));
        for (size_t c = 0; c < 3; c++) {
            if (only_n != 0 && only_n != ctxs[c]) {
                continue;
            }
            if (ctxs[c] > model_max_ctx(m)) {
                printf("| %s | %u | | not measured: past max_ctx %u | | | | |\n", names[k], ctxs[c],
                       model_max_ctx(m));
                continue;
            }
            for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
                if ((quick && sizes[s] != 1 && sizes[s] != 32) ||
                    (only_batch != 0 && only_batch != sizes[s])) {
                    continue;
                }
                step_cell(m, ctxs[c], sizes[s], peak, bw, scratch);
            }
        }
        free(scratch);
        model_destroy(m);
    }

    printf("\n| model | B | us per batch pick | G multiply-adds/s | of peak |\n");
    printf("|---|---:|---:|---:|---:|\n");
    for (size_t k = 0; k < 2; k++) {
        model_t *m = NULL;
        void *scratch;
        if ((only_model != NULL && strcmp(only_model, names[k]) != 0) ||
            model_create(names[k], &m) != SLOTD_OK) {
            continue;
        }
        scratch = malloc(model_scratch_size(m));
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
            if ((quick && sizes[s] != 1 && sizes[s] != 32) ||
                (only_batch != 0 && only_batch != sizes[s])) {
                continue;
            }
            pick_cell(m, sizes[s], peak, scratch);
        }
        free(scratch);
        model_destroy(m);
    }

    if (!prefill) {
        return 0;
    }
    printf("\n| model | prompt | ms position by position | ms prefill | speed-up | of peak |\n");
    printf("|---|---:|---:|---:|---:|---:|\n");
    for (size_t k = 0; k < 2; k++) {
        model_t *m = NULL;
        void *scratch;
        if (only_model != NULL && strcmp(only_model, names[k]) != 0) {
            continue;
        }
        if (model_create(names[k], &m) != SLOTD_OK) {
            return 1;
        }
        scratch = malloc(model_scratch_size(m));
        prefill_cell(m, 512, peak, scratch);
        if (!quick) {
            prefill_cell(m, 4096, peak, scratch);
        }
        free(scratch);
        model_destroy(m);
    }
    return 0;
}
