/*
 * sample.h: decoding controls on top of a model's logits: the seeded
 * sampler (temperature, top-k, top-p, seed), stop tokens, and the top
 * scores a reply may carry instead of all of them.  docs/models.md,
 * "Sampling", specifies the sampler bit for bit; this is its one C
 * implementation, and tests/crosscheck.py holds an independent one.
 *
 * Pure functions of their arguments: any thread, no lock.  No call
 * allocates: the caller lends the work memory (model_sample_work_size()).
 */
#ifndef SLOTD_CORE_SAMPLE_H
#define SLOTD_CORE_SAMPLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "model.h"

/** The most stop tokens one request may carry. */
#define MODEL_STOP_MAX 16

/** The sampler's parameters, as a request gives them. */
typedef struct model_sample {
    double temperature; /* >= 0, finite; 0 is the greedy pick */
    double top_p;       /* in (0, 1]; 1 cuts nothing */
    uint64_t seed;      /* any value */
    uint32_t top_k;     /* >= 1; V or more cuts nothing; 1 is the greedy pick */
} model_sample_t;

/** How a request picks and when it stops: what core/ and cache/ take from
 * it.  A value the caller owns; `sample` NULL is the greedy pick.  (Its
 * name is declared in model.h.) */
struct model_decode {
    const model_sample_t *sample;  /* NULL: greedy (also when model_sample_greedy()) */
    bool logits;                   /* whether a pick's row gets its rounded logits */
    uint32_t nstop;                /* 0 .. MODEL_STOP_MAX */
    uint32_t stop[MODEL_STOP_MAX]; /* each < V: the request ends after picking one */
};

/** Whether `sp` picks exactly as the greedy pick does (temperature 0 or
 * top_k 1), so that the caller takes the greedy path, bit for bit. */
static inline bool model_sample_greedy(const model_sample_t *sp)
{
    return sp == NULL || sp->temperature == 0.0 || sp->top_k == 1;
}

/** Whether `token` is one of dc's stop tokens (dc may be NULL). */
static inline bool model_decode_stops(const model_decode_t *dc, uint32_t token)
{
    if (dc == NULL)
        return false;
    for (uint32_t i = 0; i < dc->nstop; i++)
        if (dc->stop[i] == token)
            return true;
    return false;
}

/** Bytes of work memory model_sample_pick() and model_top_scores() need
 * for `vocab` logits, 8-byte aligned.  The model's scratch
 * (model_scratch_size()) holds at least this for its vocabulary. */
size_t model_sample_work_size(uint32_t vocab);

/** The pick docs/models.md specifies from the `vocab` unrounded logits
 * `raw` (model_pick_raw()), for the token at position `position` of its
 * sequence (the number of tokens before it).  Requires
 * !model_sample_greedy(sp) and finite logits; `work` of
 * model_sample_work_size(vocab) bytes, borrowed for the call. */
uint32_t model_sample_pick(const model_sample_t *sp, const double *raw, uint32_t vocab,
                           uint64_t position, void *work);

/** The `k` (1 .. vocab) highest of the `vocab` scores `scores`, score
 * descending, ties by token ascending: tokens[i] gets the i-th.  `work`
 * of model_sample_work_size(vocab) bytes. */
void model_top_scores(const double *scores, uint32_t vocab, uint32_t k, uint32_t *tokens,
                      void *work);

/** One pick after the last position run, under `dc`.  dc NULL is
 * model_pick(m, kv, row).  Otherwise the greedy pick (model_pick(), with
 * `row` getting the rounded logits when dc->logits), or the sampled one:
 * the unrounded logits go to `row`, the sampler picks at position
 * kv->len, and `row` is rounded in place when dc->logits.  `row`: V
 * doubles, NULL only for hash or a greedy dc without logits.  `scratch`:
 * the model's (free between a pick and a run).  Nothing is counted. */
uint32_t model_decode_pick(const model_t *m, const model_kv_t *kv, const model_decode_t *dc,
                           double *row, void *scratch);

/** model_decode_pick(m, kv[b], dc[b], rows[b], ...) for each b < nb as
 * one batch call (model_pick_batch_rows()).  `dc` may be NULL (all
 * greedy, rows rounded), and so may each dc[b].  Bits as the single
 * calls. */
void model_decode_pick_batch(const model_t *m, const model_kv_t *const *kv, size_t nb,
                             const model_decode_t *const *dc, uint32_t *tokens, double *const *rows,
                             void *scratch);

#endif
