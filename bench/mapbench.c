/*
 * mapbench.c: the cost of session_map_find() with few and with many live
 * sessions, random access.
 *
 * Each session is a record of the size of the server's (the map's node
 * first, then the fields a lookup's caller reads next), allocated one by
 * one and in shuffled order, so records lie scattered in memory as they do
 * in the daemon.  Ids are "s<number>", as slotd-bench names them.  A timed
 * find picks a random (map, id) pair from a precomputed list, finds it and
 * reads one field of the record it got, as the caller does.  Setups:
 *   - one map of 1,000 and one of 100,000 ids;
 *   - 1,000 maps (connections) of 1 and of 100 ids each: the daemon's
 *     1,000-connection runs with 1,000 and with 100,000 live sessions;
 *   - finds of ids that are not there (a start's duplicate check), in the
 *     1,000 x 100 setup.
 * Prints the median and minimum ns per find of R rounds, wall clock and
 * thread CPU clock.
 *
 *   mapbench [-r ROUNDS] [-n FINDS_PER_ROUND] [-s SETUP]
 *
 * -s runs only the setup of that number (0-4, in the order above).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "server/session_map.h"

/* About the size of the server's session record. */
typedef struct record {
    session_map_node_t node;
    char id[PROTO_ID_MAX + 1]; /* node.id points here */
    uint64_t payload[16];
} record_t;

typedef struct setup {
    const char *name;
    size_t nmaps, per_map;
    int miss; /* look up ids that are not in the map */
} setup_t;

static uint64_t rng_state = 0x853c49e6748fea9bu;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static double now_ns(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (p == NULL) {
        fprintf(stderr, "mapbench: out of memory\n");
        exit(1);
    }
    return p;
}

/* One query: the map and the id's text. */
typedef struct query {
    uint32_t map;
    char id[24];
} query_t;

static void bench(const setup_t *st, int rounds, size_t finds, double *wall_med, double *wall_min,
                  double *cpu_med, double *cpu_min)
{
    size_t total = st->nmaps * st->per_map;
    session_map_t *maps = xmalloc(st->nmaps * sizeof(*maps));
    record_t **recs = xmalloc(total * sizeof(*recs));
    size_t *order = xmalloc(total * sizeof(*order));
    query_t *q = xmalloc(finds * sizeof(*q));
    double *wall = xmalloc((size_t)rounds * sizeof(double));
    double *cpu = xmalloc((size_t)rounds * sizeof(double));
    volatile uint64_t sink = 0;

    for (size_t i = 0; i < st->nmaps; i++)
        if (session_map_init(&maps[i]) != SLOTD_OK) {
            fprintf(stderr, "mapbench: out of memory\n");
            exit(1);
        }
    /* Allocate the records in shuffled order, and insert in another. */
    for (size_t i = 0; i < total; i++)
        order[i] = i;
    for (size_t i = total; i > 1; i--) {
        size_t j = rng_next() % i, t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
    for (size_t i = 0; i < total; i++) {
        record_t *r = xmalloc(sizeof(*r));
        memset(r, 0, sizeof(*r));
        r->payload[3] = order[i];
        snprintf(r->id, sizeof(r->id), "s%zu", order[i] % st->per_map);
        r->node.id = r->id;
        recs[order[i]] = r;
    }
    for (size_t i = 0; i < total; i++) {
        size_t k = order[(i * 7919) % total];
        if (session_map_insert(&maps[k / st->per_map], &recs[k]->node) != SLOTD_OK) {
            fprintf(stderr, "mapbench: insert failed\n");
            exit(1);
        }
    }
    for (size_t i = 0; i < finds; i++) {
        size_t k = rng_next() % total;
        q[i].map = (uint32_t)(k / st->per_map);
        snprintf(q[i].id, sizeof(q[i].id), "s%zu",
                 st->miss ? st->per_map + k % st->per_map : k % st->per_map);
    }

    for (int r = 0; r < rounds; r++) {
        double w0 = now_ns(CLOCK_MONOTONIC), c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
        uint64_t acc = 0;
        for (size_t i = 0; i < finds; i++) {
            session_map_node_t *n = session_map_find(&maps[q[i].map], q[i].id);
            if (n != NULL)
                acc += ((record_t *)(void *)n)->payload[3];
            else
                acc++;
        }
        cpu[r] = (now_ns(CLOCK_THREAD_CPUTIME_ID) - c0) / (double)finds;
        wall[r] = (now_ns(CLOCK_MONOTONIC) - w0) / (double)finds;
        sink += acc;
        if (st->miss ? acc != finds : acc == finds) {
            fprintf(stderr, "mapbench: wrong results\n");
            exit(1);
        }
    }
    qsort(wall, (size_t)rounds, sizeof(double), cmp_double);
    qsort(cpu, (size_t)rounds, sizeof(double), cmp_double);
    *wall_med = wall[rounds / 2];
    *wall_min = wall[0];
    *cpu_med = cpu[rounds / 2];
    *cpu_min = cpu[0];

    for (size_t i = 0; i < total; i++) {
        session_map_remove(&maps[i / st->per_map], &recs[i]->node);
        free(recs[i]);
    }
    for (size_t i = 0; i < st->nmaps; i++)
        session_map_free(&maps[i]);
    free(maps);
    free(recs);
    free(order);
    free(q);
    free(wall);
    free(cpu);
    (void)sink;
}

int main(int argc, char **argv)
{
    static const setup_t setups[] = {
        {"1 map x 1,000", 1, 1000, 0},       {"1 map x 100,000", 1, 100000, 0},
        {"1,000 maps x 1", 1000, 1, 0},      {"1,000 maps x 100", 1000, 100, 0},
        {"1,000 x 100, miss", 1000, 100, 1},
    };
    int rounds = 7, opt, only = -1;
    size_t finds = 2000000;

    while ((opt = getopt(argc, argv, "r:n:s:")) != -1) {
        if (opt == 'r')
            rounds = atoi(optarg);
        else if (opt == 'n')
            finds = (size_t)strtoull(optarg, NULL, 10);
        else if (opt == 's')
            only = atoi(optarg);
        else {
            fprintf(stderr, "usage: mapbench [-r ROUNDS] [-n FINDS_PER_ROUND] [-s SETUP]\n");
            return 2;
        }
    }
    if (rounds < 1 || finds < 1) {
        fprintf(stderr, "mapbench: -r >= 1, -n >= 1\n");
        return 2;
    }
    printf("mapbench: %zu random finds per round, %d rounds, record %zu bytes\n", finds, rounds,
           sizeof(record_t));
    printf("%-20s %12s %12s %12s %12s\n", "setup", "wall median", "wall min", "cpu median",
           "cpu min");
    for (size_t i = 0; i < sizeof(setups) / sizeof(setups[0]); i++) {
        double wm, wn, cm, cn;
        if (only >= 0 && (size_t)only != i)
            continue;
        bench(&setups[i], rounds, finds, &wm, &wn, &cm, &cn);
        printf("%-20s %9.1f ns %9.1f ns %9.1f ns %9.1f ns\n", setups[i].name, wm, wn, cm, cn);
    }
    return 0;
}
