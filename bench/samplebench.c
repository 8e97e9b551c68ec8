/*
 * samplebench: what the sampler costs per pick, against the pick it
 * follows.
 *
 *   samplebench [--model NAME] [--picks N]
 *
 * On one thread: a heap chain of the model (default `base`, V = 4,096) is
 * prefilled with a few seeded tokens, and model_pick_raw() gives the row
 * of unrounded scores a sampled pick reads.  Then, each timed on the
 * thread's CPU clock over --picks picks (default 20,000; each pick at its
 * own position, so that the draws differ): model_sample_pick() with no
 * cut, top_k 40, top_p 0.9, both, and top_p 0.5 at temperature 2 (a wide
 * nucleus); the greedy pick's own cost (model_pick() with and without
 * rounded logits); and rounding a row in place, which a sampled pick with
 * scores pays.  Prints ns per pick, markdown, for bench/RESULTS.md.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/model.h"
#include "core/sample.h"

static double cpu_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const char *name = "base";
    long picks = 20000;
    model_t *m;
    model_kv_t kv;
    void *scratch;
    double *raw, *row, t0, dt;
    uint32_t vocab, sink = 0;
    static const struct {
        const char *what;
        model_sample_t sp;
    } cases[] = {
        {"T 0.8, no cut", {0.8, 1.0, 7, UINT32_MAX}},
        {"T 0.8, top_k 40", {0.8, 1.0, 7, 40}},
        {"T 0.8, top_p 0.9", {0.8, 0.9, 7, UINT32_MAX}},
        {"T 0.8, top_k 40, top_p 0.9", {0.8, 0.9, 7, 40}},
        {"T 2, top_p 0.5", {2.0, 0.5, 7, UINT32_MAX}},
    };

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            name = argv[++i];
        else if (strcmp(argv[i], "--picks") == 0 && i + 1 < argc)
            picks = atol(argv[++i]);
        else {
            fprintf(stderr, "usage: samplebench [--model NAME] [--picks N]\n");
            return 2;
        }
    }
    if (picks < 1 || model_create(name, &m) != SLOTD_OK || model_family(m) != MODEL_FAMILY_ATTN) {
        fprintf(stderr, "samplebench: an attn preset and --picks >= 1, please\n");
        return 2;
    }
    vocab = model_vocab(m);
    scratch = malloc(model_scratch_size(m));
    raw = malloc(vocab * sizeof(double));
    row = malloc(vocab * sizeof(double));
    if (scratch == NULL || raw == NULL || row == NULL ||
        model_kv_heap_alloc(m, 8, &kv) != SLOTD_OK) {
        fprintf(stderr, "samplebench: out of memory\n");
        return 1;
    }
    for (uint32_t t = 0; t < 8; t++)
        model_run(m, &kv, (t * 2654435761u) % vocab, scratch);
    (void)model_pick_raw(m, &kv, raw);

    printf("| %s, V = %u, %ld picks | ns per pick |\n|---|---:|\n", name, vocab, picks);
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        model_sample_t sp = cases[k].sp;
        t0 = cpu_now();
        for (long i = 0; i < picks; i++)
            sink += model_sample_pick(&sp, raw, vocab, (uint64_t)i, scratch);
        dt = cpu_now() - t0;
        printf("| model_sample_pick(), %s | %.0f |\n", cases[k].what, dt / (double)picks * 1e9);
    }
    t0 = cpu_now();
    for (long i = 0; i < picks; i++)
        sink += model_pick(m, &kv, NULL);
    dt = cpu_now() - t0;
    printf("| model_pick(), no logits (the greedy pick, scores none) | %.0f |\n",
           dt / (double)picks * 1e9);
    t0 = cpu_now();
    for (long i = 0; i < picks; i++)
        sink += model_pick(m, &kv, row);
    dt = cpu_now() - t0;
    printf("| model_pick(), rounded logits (the greedy pick, scores all) | %.0f |\n",
           dt / (double)picks * 1e9);
    t0 = cpu_now();
    for (long i = 0; i < picks; i++) {
        for (uint32_t c = 0; c < vocab; c++)
            row[c] = model_round6(raw[c]);
        sink += row[i % vocab] > 0.0;
    }
    dt = cpu_now() - t0;
    printf("| rounding a row of %u scores (a sampled pick with scores) | %.0f |\n", vocab,
           dt / (double)picks * 1e9);
    fprintf(stderr, "(%u)\n", sink);
    model_kv_heap_free(&kv);
    model_destroy(m);
    free(scratch);
    free(raw);
    free(row);
    return 0;
}
