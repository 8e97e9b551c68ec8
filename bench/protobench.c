/*
 * protobench.c: the loop thread's cost of parsing one request line.
 *
 * Parses a fixed mix of request lines, the shape slotd-bench and ordinary
 * clients send (per session: one start with a short prompt, several steps,
 * one finish; now and then a generate, a logits and a stats; short ids,
 * some lines tagged), through proto_request_parse() over and over, and
 * prints the time per line: the median and the minimum of R rounds, on the
 * wall clock and on the thread's CPU clock, for the whole mix and for each
 * kind of line alone.  It also checks that every line parses to what it
 * should, so a broken parser cannot look fast.
 *
 *   protobench [-r ROUNDS] [-n LINES_PER_ROUND] [-k KIND]
 *
 * With -k only that kind of line is run ("mix" for the whole mix), so that
 * an instruction count of the process (cachegrind) divided by the lines
 * parsed is the cost of one line: the difference of two runs with
 * different -n takes out the start-up.  Every round, and the warm-up, then
 * parses LINES_PER_ROUND lines of that kind.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "proto/proto.h"

typedef struct line {
    const char *kind;
    char text[512];
    size_t len;
    proto_op_t op;
    size_t ntokens;
} line_t;

#define MAX_LINES 4096

static line_t lines[MAX_LINES];
static size_t nlines;

static void add(const char *kind, proto_op_t op, size_t ntokens, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void add(const char *kind, proto_op_t op, size_t ntokens, const char *fmt, ...)
{
    va_list ap;
    line_t *l;
    int k;

    if (nlines == MAX_LINES) {
        fprintf(stderr, "protobench: too many lines\n");
        exit(2);
    }
    l = &lines[nlines++];
    va_start(ap, fmt);
    k = vsnprintf(l->text, sizeof(l->text), fmt, ap);
    va_end(ap);
    if (k < 0 || (size_t)k >= sizeof(l->text)) {
        fprintf(stderr, "protobench: line too long\n");
        exit(2);
    }
    l->kind = kind;
    l->len = (size_t)k;
    l->op = op;
    l->ntokens = ntokens;
}

/* The mix: 64 sessions, each a start (prompt of 3 to 10 tokens), six steps
 * (a third of them with "n") and a finish; every eighth session also a
 * generate and a logits, every sixteenth a stats; every fourth session's
 * lines carry a tag. */
static void build_mix(void)
{
    unsigned seed = 12345;

    for (int s = 0; s < 64; s++) {
        char tag[32] = "";
        char prompt[256];
        size_t plen = 3 + (size_t)(s % 8), o = 0;

        if (s % 4 == 0)
            snprintf(tag, sizeof(tag), ",\"tag\":%d", 1000 + s);
        for (size_t k = 0; k < plen; k++) {
            seed = seed * 1103515245u + 12345u;
            o += (size_t)snprintf(prompt + o, sizeof(prompt) - o, "%s%u", k ? "," : "",
                                  (seed >> 16) % 64);
        }
        add("start", PROTO_OP_START, plen,
            "{\"op\":\"start\",\"id\":\"s%d\",\"model\":\"tiny\",\"prompt\":[%s]%s}", s, prompt,
            tag);
        for (int k = 0; k < 6; k++) {
            if (k % 3 == 2)
                add("step", PROTO_OP_STEP, 0, "{\"op\":\"step\",\"id\":\"s%d\",\"n\":%d%s}", s,
                    1 + k, tag);
            else
                add("step", PROTO_OP_STEP, 0, "{\"op\":\"step\",\"id\":\"s%d\"%s}", s, tag);
        }
        add("finish", PROTO_OP_FINISH, 0, "{\"op\":\"finish\",\"id\":\"s%d\"%s}", s, tag);
        if (s % 8 == 0) {
            add("generate", PROTO_OP_GENERATE, 4,
                "{\"op\":\"generate\",\"model\":\"tiny\",\"tokens\":[1,2,3,%d],\"steps\":3,"
                "\"use_cache\":true%s}",
                s % 64, tag);
            add("logits", PROTO_OP_LOGITS, 3, "{\"op\":\"logits\",\"tokens\":[0,1,%d]%s}", s % 64,
                tag);
        }
        if (s % 16 == 0)
            add("stats", PROTO_OP_STATS, 0, "{\"op\":\"stats\"%s}", tag);
    }
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

/* Parses the lines whose kind is `kind` (all when NULL) until `total`
 * lines were parsed; returns wall and CPU ns per line. */
static void run(const char *kind, size_t total, proto_request_t *r, double *wall, double *cpu)
{
    static size_t pick[MAX_LINES];
    size_t npick = 0, done = 0;
    double w0, c0;
    slotd_error_t err;

    for (size_t i = 0; i < nlines; i++)
        if (kind == NULL || strcmp(lines[i].kind, kind) == 0)
            pick[npick++] = i;
    w0 = now_ns(CLOCK_MONOTONIC);
    c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    while (done < total) {
        for (size_t k = 0; k < npick && done < total; k++, done++) {
            const line_t *l = &lines[pick[k]];
            if (proto_request_parse(l->text, l->len, r, &err) != SLOTD_OK) {
                fprintf(stderr, "protobench: %s: %s\n", l->text, err.message);
                exit(1);
            }
        }
    }
    *cpu = (now_ns(CLOCK_THREAD_CPUTIME_ID) - c0) / (double)total;
    *wall = (now_ns(CLOCK_MONOTONIC) - w0) / (double)total;
}

static void check_all(proto_request_t *r)
{
    slotd_error_t err;

    for (size_t i = 0; i < nlines; i++) {
        int rc = proto_request_parse(lines[i].text, lines[i].len, r, &err);
        if (rc != SLOTD_OK || r->op != lines[i].op || r->ntokens != lines[i].ntokens ||
            ((r->op == PROTO_OP_START || r->op == PROTO_OP_STEP || r->op == PROTO_OP_FINISH) &&
             r->id[0] != 's')) {
            fprintf(stderr, "protobench: wrong parse of %s\n", lines[i].text);
            exit(1);
        }
    }
}

int main(int argc, char **argv)
{
    static const char *const kinds[] = {NULL, "start", "step", "finish", "generate", "stats"};
    enum { NKINDS = sizeof(kinds) / sizeof(kinds[0]) };
    int rounds = 9, opt, only = -1;
    size_t per_round = 400000;
    proto_request_t r;
    double wall[NKINDS][64], cpu[NKINDS][64];
    size_t bytes = 0;

    while ((opt = getopt(argc, argv, "r:n:k:")) != -1) {
        if (opt == 'r') {
            rounds = atoi(optarg);
        } else if (opt == 'n') {
            per_round = (size_t)strtoull(optarg, NULL, 10);
        } else if (opt == 'k') {
            for (int i = 0; i < NKINDS; i++)
                if (strcmp(optarg, kinds[i] != NULL ? kinds[i] : "mix") == 0)
                    only = i;
            if (only < 0) {
                fprintf(stderr, "protobench: -k mix, start, step, finish, generate or stats\n");
                return 2;
            }
        } else {
            fprintf(stderr, "usage: protobench [-r ROUNDS] [-n LINES_PER_ROUND] [-k KIND]\n");
            return 2;
        }
    }
    if (rounds < 1 || rounds > 64 || per_round < 1) {
        fprintf(stderr, "protobench: -r 1..64, -n >= 1\n");
        return 2;
    }
    build_mix();
    for (size_t i = 0; i < nlines; i++)
        bytes += lines[i].len;
    proto_request_init(&r);
    check_all(&r);
    /* Warm up, then the kinds in turn within each round. */
    if (only >= 0) {
        run(kinds[only], per_round, &r, &wall[only][0], &cpu[only][0]);
        for (int k = 0; k < rounds; k++)
            run(kinds[only], per_round, &r, &wall[only][k], &cpu[only][k]);
    } else {
        run(NULL, per_round / 4, &r, &wall[0][0], &cpu[0][0]);
        for (int k = 0; k < rounds; k++)
            for (int i = 0; i < NKINDS; i++)
                run(kinds[i], i == 0 ? per_round : per_round / 4, &r, &wall[i][k], &cpu[i][k]);
    }
    proto_request_free(&r);

    printf("protobench: %zu lines in the mix, %.1f bytes per line on average; %d rounds\n", nlines,
           (double)bytes / (double)nlines, rounds);
    printf("%-10s %12s %12s %12s %12s\n", "lines", "wall median", "wall min", "cpu median",
           "cpu min");
    for (int i = 0; i < NKINDS; i++) {
        if (only >= 0 && i != only)
            continue;
        qsort(wall[i], (size_t)rounds, sizeof(double), cmp_double);
        qsort(cpu[i], (size_t)rounds, sizeof(double), cmp_double);
        printf("%-10s %9.1f ns %9.1f ns %9.1f ns %9.1f ns\n", kinds[i] ? kinds[i] : "mix",
               wall[i][rounds / 2], wall[i][0], cpu[i][rounds / 2], cpu[i][0]);
    }
    return 0;
}
