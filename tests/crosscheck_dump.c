/*
 * crosscheck_dump.c: prints what the C models compute, for the Python
 * reference (tests/crosscheck.py) to compare against its own reading of
 * docs/models.md.
 *
 * Input, one case a line on stdin: `<preset> <steps> <token> <token> ...`.
 * Output, one JSON object a line on stdout, in input order:
 *
 *   {"model": ..., "input": [...], "steps": n,
 *    "cached": {"tokens": [...], "rows": r, "logits": [[...], ...]},
 *    "uncached": {...},
 *    "raw": [[...], ...]}
 *
 * "cached" and "uncached" are model_generate()'s results; each logit is a
 * pair [printf("%.6f"), printf("%a")] of the rounded double it returned.
 * "raw" is, for each pick of a cached run driven by model_run() and
 * model_pick_raw(), the unrounded logits as pairs
 * [printf("%.6f"), printf("%a")]; it is empty for hash.  Exit status 0, or
 * 1 on a malformed line or a failed call.
 *
 * A line `batch ...` (dump_batch()) answers what a batch of sequences
 * stepped together computes.
 *
 * Sampling (core/sample.h), against docs/models.md's sampler:
 *   `rawvec <preset> <token> ...` runs the tokens and keeps the unrounded
 *   logits after them as the next vector, answering {"raw": ["%a", ...]};
 *   `vec <x> <x> ...` keeps the given values (as "%a") as the next vector,
 *   answering {"vec": V};
 *   `sample <vector> <T> <K> <P> <seed> <position> ...` answers
 *   {"picks": [...]}, model_sample_pick() of that vector (numbered from 0
 *   in input order) for each (seed, position) pair.
 *
 * A line `round6 <x> <x> ...` (each x as C's "%a" or Python's float.hex()
 * writes it) answers {"round6": [[printf("%.6f", x), printf("%a",
 * model_round6(x))], ...]}, to set model_round6() beside Python's round().
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/model.h"
#include "core/sample.h"

#define MAX_MODELS 4

static model_t *models[MAX_MODELS];

static model_t *find_model(const char *name)
{
    for (int i = 0; i < MAX_MODELS; i++) {
        if (models[i] == NULL) {
            if (model_create(name, &models[i]) != SLOTD_OK) {
                return NULL;
            }
            return models[i];
        }
        if (strcmp(model_name(models[i]), name) == 0) {
            return models[i];
        }
    }
    return NULL;
}

static void print_pair(double x)
{
    printf("[\"%.6f\",\"%a\"]", x, x);
}

static void print_result(const model_t *m, const uint32_t *tokens, size_t total, int64_t steps,
                         const double *logits, uint64_t rows)
{
    size_t v = model_vocab(m);

    printf("{\"tokens\":[");
    for (size_t i = 0; i < total; i++) {
        printf("%s%u", i ? "," : "", tokens[i]);
    }
    printf("],\"rows\":%llu,\"logits\":[", (unsigned long long)rows);
    if (model_family(m) == MODEL_FAMILY_ATTN) {
        for (int64_t k = 0; k < steps; k++) {
            printf("%s[", k ? "," : "");
            for (size_t c = 0; c < v; c++) {
                if (c) {
                    putchar(',');
                }
                print_pair(logits[(size_t)k * v + c]);
            }
            putchar(']');
        }
    }
    printf("]}");
}

static int dump_case(model_t *m, const int64_t *in, size_t n, int64_t steps)
{
    size_t v = model_vocab(m), total = n + (size_t)steps;
    uint32_t *tokens = malloc(total * sizeof(uint32_t));
    double *logits = malloc(((size_t)steps * v + 1) * sizeof(double));
    double *raw = malloc(v * sizeof(double));
    void *scratch = malloc(model_scratch_size(m) + 1);
    uint64_t rows;
    model_kv_t kv;
    slotd_error_t err;
    int rc = 1;

    if (tokens == NULL || logits == NULL || raw == NULL || scratch == NULL ||
        model_kv_heap_alloc(m, (uint32_t)total, &kv) != SLOTD_OK) {
        fprintf(stderr, "crosscheck_dump: out of memory\n");
        goto out;
    }
    printf("{\"model\":\"%s\",\"input\":[", model_name(m));
    for (size_t i = 0; i < n; i++) {
        printf("%s%lld", i ? "," : "", (long long)in[i]);
    }
    printf("],\"steps\":%lld", (long long)steps);
    for (int cached = 1; cached >= 0; cached--) {
        if (model_generate(m, in, n, steps, cached, NULL, NULL, tokens, logits, &rows, &err) !=
            SLOTD_OK) {
            fprintf(stderr, "crosscheck_dump: %s\n", err.message);
            goto out_kv;
        }
        printf(",\"%s\":", cached ? "cached" : "uncached");
        print_result(m, tokens, total, steps, logits, rows);
    }

    /* The unrounded logits behind each pick, from a run driven by hand. */
    printf(",\"raw\":[");
    for (size_t i = 0; model_family(m) == MODEL_FAMILY_ATTN && steps > 0 && i < total - 1; i++) {
        model_run(m, &kv, i < n ? (uint32_t)in[i] : tokens[i], scratch);
        if (i + 1 >= n) {
            (void)model_pick_raw(m, &kv, raw);
            printf("%s[", i + 1 > n ? "," : "");
            for (size_t c = 0; c < v; c++) {
                if (c) {
                    putchar(',');
                }
                print_pair(raw[c]);
            }
            putchar(']');
        }
    }
    printf("]}\n");
    rc = 0;
out_kv:
    model_kv_heap_free(&kv);
out:
    free(tokens);
    free(logits);
    free(raw);
    free(scratch);
    return rc;
}

/* A line `batch <preset> <steps> <k> <n1> <tokens...> <n2> <tokens...> ...`:
 * k sequences, each prompt run by model_prefill(), then `steps` rounds of
 * model_pick_batch() (rounded logits) and model_run_batch() of the picks,
 * all k together.  Answers {"batch": preset, "steps": s, "seqs": [{"input":
 * [...], "tokens": [...], "logits": [[pair, ...], ...]}, ...]}, each
 * sequence's tokens its input followed by its picks. */
static int dump_batch(const char *args)
{
    char name[16];
    long long steps, k, t;
    int used;
    const char *p = args;
    model_t *m;
    model_kv_t kv[MODEL_BATCH_MAX], *pkv[MODEL_BATCH_MAX];
    uint32_t *in[MODEL_BATCH_MAX], len[MODEL_BATCH_MAX], picks[MODEL_BATCH_MAX];
    double *lg[MODEL_BATCH_MAX];
    uint32_t *out[MODEL_BATCH_MAX];
    void *scratch;
    size_t v;

    if (sscanf(p, "%15s %lld %lld%n", name, &steps, &k, &used) != 3 || k < 1 ||
        k > MODEL_BATCH_MAX || steps < 1 || (m = find_model(name)) == NULL ||
        model_family(m) != MODEL_FAMILY_ATTN) {
        fprintf(stderr, "crosscheck_dump: malformed batch line\n");
        return 1;
    }
    p += used;
    v = model_vocab(m);
    scratch = malloc(model_scratch_size(m));
    for (long long b = 0; b < k; b++) {
        long long n;
        if (sscanf(p, "%lld%n", &n, &used) != 1 || n < 1 || n + steps > model_max_ctx(m)) {
            fprintf(stderr, "crosscheck_dump: malformed batch line\n");
            return 1;
        }
        p += used;
        len[b] = (uint32_t)n;
        in[b] = malloc((size_t)(n + steps) * sizeof(uint32_t));
        out[b] = in[b] + n;
        lg[b] = malloc((size_t)steps * v * sizeof(double));
        if (in[b] == NULL || lg[b] == NULL || scratch == NULL ||
            model_kv_heap_alloc(m, (uint32_t)(n + steps), &kv[b]) != SLOTD_OK) {
            fprintf(stderr, "crosscheck_dump: out of memory\n");
            return 1;
        }
        for (long long i = 0; i < n; i++) {
            if (sscanf(p, "%lld%n", &t, &used) != 1 || t < 0 || t >= (long long)v) {
                fprintf(stderr, "crosscheck_dump: malformed batch line\n");
                return 1;
            }
            p += used;
            in[b][i] = (uint32_t)t;
        }
        model_prefill(m, &kv[b], in[b], len[b], scratch);
        pkv[b] = &kv[b];
    }
    for (long long r = 0; r < steps; r++) {
        double *rows[MODEL_BATCH_MAX];
        for (long long b = 0; b < k; b++) {
            rows[b] = lg[b] + (size_t)r * v;
        }
        model_pick_batch(m, (const model_kv_t *const *)pkv, (size_t)k, picks, rows, scratch);
        for (long long b = 0; b < k; b++) {
            out[b][r] = picks[b];
        }
        if (r + 1 < steps) {
            model_run_batch(m, pkv, picks, (size_t)k, scratch);
        }
    }
    printf("{\"batch\":\"%s\",\"steps\":%lld,\"seqs\":[", model_name(m), steps);
    for (long long b = 0; b < k; b++) {
        printf("%s{\"input\":[", b ? "," : "");
        for (uint32_t i = 0; i < len[b]; i++) {
            printf("%s%u", i ? "," : "", in[b][i]);
        }
        printf("],\"tokens\":[");
        for (uint32_t i = 0; i < len[b] + steps; i++) {
            printf("%s%u", i ? "," : "", in[b][i]);
        }
        printf("],\"logits\":[");
        for (long long r = 0; r < steps; r++) {
            printf("%s[", r ? "," : "");
            for (size_t c = 0; c < v; c++) {
                if (c) {
                    putchar(',');
                }
                print_pair(lg[b][(size_t)r * v + c]);
            }
            putchar(']');
        }
        printf("]}");
        model_kv_heap_free(&kv[b]);
        free(in[b]);
        free(lg[b]);
    }
    printf("]}\n");
    free(scratch);
    return 0;
}

/* The vectors of `rawvec` and `vec` lines, kept for `sample` lines. */
#define MAX_VECS 64
static double *vecs[MAX_VECS];
static uint32_t vec_len[MAX_VECS];
static size_t nvecs;

static int keep_vec(double *v, uint32_t n)
{
    if (nvecs == MAX_VECS) {
        fprintf(stderr, "crosscheck_dump: too many vectors\n");
        free(v);
        return 1;
    }
    vecs[nvecs] = v;
    vec_len[nvecs++] = n;
    return 0;
}

static int dump_rawvec(const char *args)
{
    char name[16];
    int used;
    long long t;
    size_t n = 0;
    int64_t in[4096];
    model_t *m;
    model_kv_t kv;
    void *scratch;
    double *raw;

    if (sscanf(args, "%15s%n", name, &used) != 1 || (m = find_model(name)) == NULL) {
        fprintf(stderr, "crosscheck_dump: bad rawvec line\n");
        return 1;
    }
    args += used;
    while (n < 4096 && sscanf(args, "%lld%n", &t, &used) == 1) {
        in[n++] = t;
        args += used;
    }
    raw = malloc(model_vocab(m) * sizeof(double));
    scratch = malloc(model_scratch_size(m) + 1);
    if (raw == NULL || scratch == NULL || n == 0 ||
        model_kv_heap_alloc(m, (uint32_t)n, &kv) != SLOTD_OK) {
        fprintf(stderr, "crosscheck_dump: rawvec failed\n");
        free(raw);
        free(scratch);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        model_run(m, &kv, (uint32_t)in[i], scratch);
    }
    (void)model_pick_raw(m, &kv, raw);
    model_kv_heap_free(&kv);
    free(scratch);
    printf("{\"raw\":[");
    for (uint32_t c = 0; c < model_vocab(m); c++) {
        printf("%s\"%a\"", c ? "," : "", raw[c]);
    }
    printf("]}\n");
    return keep_vec(raw, model_vocab(m));
}

static int dump_vec(const char *args)
{
    double *v = malloc(4096 * sizeof(double));
    uint32_t n = 0;
    char *end;

    if (v == NULL) {
        return 1;
    }
    for (;;) {
        double x = strtod(args, &end);
        if (end == args || n == 4096) {
            break;
        }
        v[n++] = x;
        args = end;
    }
    printf("{\"vec\":%u}\n", n);
    return keep_vec(v, n);
}

static int dump_sample(const char *args)
{
    unsigned long long k, seed, pos;
    unsigned long id;
    char ts[64], ps[64];
    int used, first = 1;
    model_sample_t sp;
    void *work;

    if (sscanf(args, "%lu %63s %llu %63s%n", &id, ts, &k, ps, &used) != 4 || id >= nvecs) {
        fprintf(stderr, "crosscheck_dump: bad sample line\n");
        return 1;
    }
    args += used;
    sp.temperature = strtod(ts, NULL);
    sp.top_p = strtod(ps, NULL);
    sp.top_k = k < vec_len[id] ? (uint32_t)k : vec_len[id];
    if ((work = malloc(model_sample_work_size(vec_len[id]))) == NULL) {
        return 1;
    }
    printf("{\"picks\":[");
    while (sscanf(args, "%llu %llu%n", &seed, &pos, &used) == 2) {
        sp.seed = seed;
        printf("%s%u", first ? "" : ",", model_sample_pick(&sp, vecs[id], vec_len[id], pos, work));
        first = 0;
        args += used;
    }
    printf("]}\n");
    free(work);
    return 0;
}

static int dump_round6(const char *args)
{
    const char *p = args;
    char *end;
    int first = 1;

    printf("{\"round6\":[");
    for (;;) {
        double x = strtod(p, &end);
        if (end == p) {
            break;
        }
        printf("%s[\"%.6f\",\"%a\"]", first ? "" : ",", x, model_round6(x));
        first = 0;
        p = end;
    }
    printf("]}\n");
    return 0;
}

int main(void)
{
    char line[65536];
    int rc = 0;

    while (rc == 0 && fgets(line, sizeof(line), stdin) != NULL) {
        char name[16];
        long long steps, t;
        int used, off = 0;
        int64_t in[4096];
        size_t n = 0;
        model_t *m;

        if (sscanf(line, "%15s%n", name, &used) == 1 && strcmp(name, "round6") == 0) {
            rc = dump_round6(line + used);
            continue;
        }
        if (sscanf(line, "%15s%n", name, &used) == 1 &&
            (strcmp(name, "rawvec") == 0 || strcmp(name, "vec") == 0 ||
             strcmp(name, "sample") == 0)) {
            rc = name[0] == 'r'   ? dump_rawvec(line + used)
                 : name[0] == 'v' ? dump_vec(line + used)
                                  : dump_sample(line + used);
            fflush(stdout);
            continue;
        }
        if (sscanf(line, "%15s%n", name, &used) == 1 && strcmp(name, "batch") == 0) {
            rc = dump_batch(line + used);
            fflush(stdout);
            continue;
        }
        if (sscanf(line, "%15s %lld%n", name, &steps, &used) != 2) {
            fprintf(stderr, "crosscheck_dump: malformed line: %s", line);
            return 1;
        }
        off = used;
        while (n < 4096 && sscanf(line + off, "%lld%n", &t, &used) == 1) {
            in[n++] = t;
            off += used;
        }
        m = find_model(name);
        if (m == NULL) {
            fprintf(stderr, "crosscheck_dump: unknown model '%s'\n", name);
            return 1;
        }
        rc = dump_case(m, in, n, steps);
        fflush(stdout);
    }
    for (int i = 0; i < MAX_MODELS; i++) {
        model_destroy(models[i]);
    }
    for (size_t i = 0; i < nvecs; i++) {
        free(vecs[i]);
    }
    return rc;
}
