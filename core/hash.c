/*
 * hash.c: the `hash` family, the stale-cache model of docs/models.md.
 *
 * It owns the layout of a hash block and of a hash sequence's state.  A
 * block's data is `capacity` entries of one uint64_t each: entry b holds
 * g(tokens[p], p) for the block's b-th position p (p = first + b).  The state
 * is one uint64_t, the running sum (mod 2^64) of g over positions
 * 0 .. len-1, so that a pick is the sum mod V with no call of g, and a run
 * makes exactly one call.
 */
#include "model_int.h"

static void hash_sizes(model_t *m)
{
    m->entry_size = sizeof(uint64_t);
    m->state_size = sizeof(uint64_t);
    m->scratch_size = 0;
}

static void hash_run(const model_t *m, model_kv_t *kv, uint32_t token, void *scratch)
{
    uint32_t p = kv->len;
    uint64_t g = model__hash_g(token, p);
    uint64_t *entries = (uint64_t *)(void *)kv->tail->data;
    uint64_t *sum = kv->state;

    (void)scratch;
    entries[model__block_slot(kv->tail, p)] = g;
    *sum = p == 0 ? g : *sum + g;
    model__count_g_calls(m, 1);
    model__kv_advance(kv);
}

static uint32_t hash_pick(const model_t *m, const model_kv_t *kv, double *logits, double *raw)
{
    const uint64_t *sum = kv->state;

    (void)logits;
    (void)raw;
    return (uint32_t)(*sum % m->shape.vocab);
}

const model__ops_t model__hash_ops = {
    .sizes = hash_sizes,
    .init = NULL,
    .fini = NULL,
    .run = hash_run,
    .pick = hash_pick,
};
