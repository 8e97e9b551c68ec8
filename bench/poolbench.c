/*
 * poolbench: what the slot pool costs a decode step, without the model.
 *
 *   poolbench [--model hash|tiny|small] [--threads N] [--sessions N]
 *             [--steps N] [--rounds N]
 *
 * Each thread keeps --sessions slots of its own and steps them in turn, as
 * a worker serving pipelined sessions does: one step is
 * cache_pool_reserve(1) then cache_pool_commit() of one more entry (no
 * model call: only the pool's work is timed).  A slot that reaches max_ctx
 * is released and acquired again, inside the timed loop, so the figure
 * includes the block allocations and releases a real load would make
 * (tiny: a release every 8 steps; hash: a new block every 30 to 254).
 * Several threads share the one pool and its lock.
 *
 * Reported: ns per step on the wall clock and on the threads' CPU clock
 * (the sum over threads / steps), median and min over --rounds rounds.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/pool.h"
#include "core/model.h"

#define MAX_THREADS 16
#define MAX_SESSIONS 64

typedef struct worker {
    pthread_t th;
    cache_pool_t *pool;
    const model_t *m;
    unsigned index, sessions;
    uint64_t steps;
    double cpu; /* seconds of this thread's CPU time in the loop */
    int failed;
} worker_t;

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    cache_handle_t h[MAX_SESSIONS];
    cache_owner_t o[MAX_SESSIONS];
    uint32_t len[MAX_SESSIONS];
    uint32_t max = model_max_ctx(w->m);
    double t0;

    for (unsigned i = 0; i < w->sessions; i++) {
        memset(&o[i], 0, sizeof o[i]);
        o[i].key = w->index;
        snprintf(o[i].id, sizeof o[i].id, "w%u-s%u", w->index, i);
        if (cache_pool_acquire(w->pool, w->m, &o[i], &h[i]) != SLOTD_OK) {
            w->failed = 1;
            return NULL;
        }
        len[i] = 0;
    }
    t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    for (uint64_t k = 0; k < w->steps; k++) {
        unsigned i = (unsigned)(k % w->sessions);
        model_kv_t kv;

        if (len[i] == max) {
            if (cache_pool_release(w->pool, h[i], &o[i], NULL) != SLOTD_OK ||
                cache_pool_acquire(w->pool, w->m, &o[i], &h[i]) != SLOTD_OK) {
                w->failed = 1;
                break;
            }
            len[i] = 0;
        }
        if (cache_pool_reserve(w->pool, h[i], &o[i], 1, &kv) != SLOTD_OK) {
            w->failed = 1;
            break;
        }
        kv.len++;
        if (cache_pool_commit(w->pool, h[i], &o[i], &kv) != SLOTD_OK) {
            w->failed = 1;
            break;
        }
        len[i]++;
    }
    w->cpu = clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
    for (unsigned i = 0; i < w->sessions; i++)
        (void)cache_pool_release(w->pool, h[i], &o[i], NULL);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const char *preset = "tiny";
    unsigned threads = 1, sessions = 16, rounds = 7;
    uint64_t steps = 2000000;
    model_t *m;
    double wall[64], cpu[64];

    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0)
            preset = argv[i + 1];
        else if (strcmp(argv[i], "--threads") == 0)
            threads = (unsigned)strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--sessions") == 0)
            sessions = (unsigned)strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--steps") == 0)
            steps = strtoull(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--rounds") == 0)
            rounds = (unsigned)strtoul(argv[i + 1], NULL, 10);
        else {
            fprintf(stderr, "usage: poolbench [--model hash|tiny|small] [--threads N] "
                            "[--sessions N] [--steps N] [--rounds N]\n");
            return 2;
        }
    }
    if (threads == 0 || threads > MAX_THREADS || sessions == 0 || sessions > MAX_SESSIONS ||
        rounds == 0 || rounds > 64 || steps == 0) {
        fprintf(stderr, "poolbench: bad arguments\n");
        return 2;
    }
    if (model_create(preset, &m) != SLOTD_OK) {
        fprintf(stderr, "poolbench: unknown model %s\n", preset);
        return 2;
    }
    for (unsigned r = 0; r < rounds; r++) {
        const model_t *models[] = {m};
        cache_pool_config_t cfg = {(size_t)1 << 30, threads * sessions, models, 1, 1, false};
        cache_pool_t *p;
        worker_t w[MAX_THREADS];
        double t0, sum_cpu = 0;

        if (cache_pool_create(&cfg, &p) != SLOTD_OK) {
            fprintf(stderr, "poolbench: cache_pool_create failed\n");
            return 2;
        }
        t0 = clock_s(CLOCK_MONOTONIC);
        for (unsigned t = 0; t < threads; t++) {
            w[t] = (worker_t){.pool = p, .m = m, .index = t, .sessions = sessions,
                              .steps = steps / threads};
            pthread_create(&w[t].th, NULL, worker_main, &w[t]);
        }
        for (unsigned t = 0; t < threads; t++) {
            pthread_join(w[t].th, NULL);
            if (w[t].failed) {
                fprintf(stderr, "poolbench: a pool call failed\n");
                return 1;
            }
            sum_cpu += w[t].cpu;
        }
        wall[r] = (clock_s(CLOCK_MONOTONIC) - t0) / (double)(steps / threads * threads) * 1e9;
        cpu[r] = sum_cpu / (double)(steps / threads * threads) * 1e9;
        cache_pool_destroy(p);
    }
    qsort(wall, rounds, sizeof wall[0], cmp_double);
    qsort(cpu, rounds, sizeof cpu[0], cmp_double);
    printf("poolbench model=%s threads=%u sessions=%u steps=%llu rounds=%u: ns per step "
           "wall median %.1f min %.1f, cpu median %.1f min %.1f\n",
           preset, threads, sessions, (unsigned long long)steps, rounds, wall[rounds / 2],
           wall[0], cpu[rounds / 2], cpu[0]);
    model_destroy(m);
    return 0;
}
