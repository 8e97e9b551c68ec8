/*
 * model_int.h: what the files of core/ share about a model and nothing
 * else may use: the struct behind model_t, the per-family table of
 * functions, and the helpers every family needs (the mixer, the walk along
 * a chain).  Names here carry the `model__` prefix.
 */
#ifndef SLOTD_CORE_MODEL_INT_H
#define SLOTD_CORE_MODEL_INT_H

#include <assert.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model.h"

/* Most block capacities a preset may offer, and most blocks a chain of
 * max_ctx positions may take. */
#define MODEL__MAX_CANDIDATES 8
#define MODEL__MAX_BLOCKS 512

/* The shape of a preset: the parameters of docs/models.md plus the block
 * capacities a chain may use. */
typedef struct model__shape {
    const char *name;
    model_family_t family;
    uint32_t vocab;
    uint32_t d;      /* width (attn), 0 for hash */
    uint32_t layers; /* L (attn), 1 for hash */
    uint32_t max_ctx;
    uint64_t seed; /* weight seed S (attn), 0 for hash */
    /* The capacities a block may have, ascending, 0-terminated when fewer
     * than MODEL__MAX_CANDIDATES.  Chosen so that few size classes serve a
     * chain and each tiles a pool page of the largest block well (see
     * docs/design.md, "Blocks of growing capacity"). */
    uint32_t candidates[MODEL__MAX_CANDIDATES];
} model__shape_t;

/* One family's functions.  `sizes` fills in entry, state and scratch sizes
 * from the shape; `init` generates the weights (may be NULL) and `fini`
 * frees them.  `run` and `pick` implement model_run() and model_pick()
 * without the argument checks model.c already made. */
typedef struct model__ops {
    void (*sizes)(model_t *m);
    int (*init)(model_t *m);
    void (*fini)(model_t *m);
    void (*run)(const model_t *m, model_kv_t *kv, uint32_t token, void *scratch);
    uint32_t (*pick)(const model_t *m, const model_kv_t *kv, double *logits, double *raw);
    /* The batch calls (model_run_batch(), model_pick_batch(),
     * model_prefill()) where the family shares weight loads across a
     * batch; NULL where model.c's loop of single calls serves (hash, and
     * tiny, whose weights fit in the first-level cache). */
    void (*run_batch)(const model_t *m, model_kv_t *const *kv, const uint32_t *tokens, size_t nb,
                      void *scratch);
    void (*pick_batch)(const model_t *m, const model_kv_t *const *kv, size_t nb, uint32_t *tokens,
                       double *const *logits, double *const *raw, void *scratch);
    void (*prefill)(const model_t *m, model_kv_t *kv, const uint32_t *tokens, size_t n,
                    void *scratch);
    /* Doubles of scratch a batch of nb needs (NULL: model_scratch_size()). */
    size_t (*batch_scratch)(const model_t *m, size_t nb);
} model__ops_t;

struct model {
    const model__ops_t *ops;
    model__shape_t shape;
    size_t preset;       /* its row in MODEL__PRESETS, as model_preset_name() */
    size_t entry_size;   /* bytes of one position's entry */
    size_t state_size;   /* bytes of a sequence's state */
    size_t scratch_size; /* bytes of scratch a run needs */

    /* The capacity of every chain's i-th block, for i < nblocks (the blocks
     * that reach max_ctx); later blocks repeat the last.  block_max is the
     * largest.  Computed at creation from the sizes above. */
    uint32_t nblocks;
    uint32_t block_max;
    uint32_t block_cap[MODEL__MAX_BLOCKS];

    /* Weights of the attn family, one allocation owned by the model (NULL
     * for hash), made by model_build() (`built` then true) and immutable
     * after it. */
    bool built;
    double *weights;
    const double *emb;   /* E[V][d] */
    const double *pos;   /* P[max_ctx][d] */
    const double *layer; /* per layer Wq, Wk, Wv, Wo, each [d][d], layer after layer */
    const double *unemb; /* U[d][V] */
    double inv_sqrt_d;   /* 1.0 / sqrt(d), computed once */

    /* The counters: relaxed atomics, any thread adds and reads. */
    _Atomic uint64_t g_calls;
    _Atomic uint64_t rows;
};

/* Every allocation of core/ goes through model__alloc(): `align` 0 for
 * malloc's alignment, else a power of two (the size is rounded up to a
 * multiple of it).  Freed with free().  For the tests of allocation failure:
 * while model__alloc_fail_in is n > 0, each allocation counts it down and
 * the n-th one fails (a test sets it; nothing else does). */
extern _Atomic int model__alloc_fail_in;
void *model__alloc(size_t align, size_t size);

extern const model__ops_t model__hash_ops;

/* The functions of the attn family for width d: kernels of their own for
 * d = 8 (attn.c says why), the general ones otherwise. */
const model__ops_t *model__attn_ops_for(uint32_t d);

/* splitmix64's output function (docs/models.md, "The mixer"). */
static inline uint64_t model__mix64(uint64_t x)
{
    uint64_t z = x + UINT64_C(0x9E3779B97F4A7C15);
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* The contribution of token `t` at position `p` in the hash family. */
static inline uint64_t model__hash_g(uint32_t t, uint32_t p)
{
    return model__mix64(((uint64_t)t << 32) | p);
}

/* Adds to the counters.  The model is immutable apart from them, hence
 * the cast: every model_t comes from malloc(), never a const object. */
static inline void model__count_g_calls(const model_t *m, uint64_t n)
{
    atomic_fetch_add_explicit(&((model_t *)m)->g_calls, n, memory_order_relaxed);
}

static inline void model__count_rows(const model_t *m, uint64_t n)
{
    atomic_fetch_add_explicit(&((model_t *)m)->rows, n, memory_order_relaxed);
}

/* The slot of position `p` inside block `b`, which holds it. */
static inline uint32_t model__block_slot(const model_block_t *b, uint32_t p)
{
    assert(p >= b->first && p - b->first < b->capacity);
    return p - b->first;
}

/* Moves kv past the position just written: one more entry, and the tail on
 * to the next block (possibly NULL) when this one is full. */
/* The index in kv's block table of the block whose first position is
 * `pos`, or kv->nblocks if no block starts there: a binary search, as the
 * table's blocks start at ascending positions. */
static inline uint32_t model__kv_index_at(const model_kv_t *kv, uint32_t pos)
{
    uint32_t lo = 0, hi = kv->nblocks;

    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (kv->blocks[mid]->first < pos) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < kv->nblocks && kv->blocks[lo]->first == pos ? lo : kv->nblocks;
}

/* The block after `b` in kv's chain, through the table when there is one
 * (b the i-th, i then counting it), else through `next`. */
static inline model_block_t *model__kv_next(const model_kv_t *kv, const model_block_t *b,
                                            uint32_t *i)
{
    if (kv->blocks != NULL) {
        ++*i;
        return *i < kv->nblocks ? kv->blocks[*i] : NULL;
    }
    return b->next;
}

static inline void model__kv_advance(model_kv_t *kv)
{
    kv->len++;
    if (kv->len - kv->tail->first == kv->tail->capacity) {
        if (kv->blocks != NULL) {
            uint32_t i = model__kv_index_at(kv, kv->len);
            kv->tail = i < kv->nblocks ? kv->blocks[i] : NULL;
        } else {
            kv->tail = kv->tail->next;
        }
    }
}

/*
 * The fast path of model_round6(), inline so that a pick rounding V logits
 * pays no call per logit.  printf rounds the exact value X = x * 10^6 to an
 * integer N and prints N / 10^6; reading that back gives the double nearest
 * N / 10^6, which is what one correctly rounded division N / 1e6 gives, N
 * and 1e6 being exact doubles.  The product y = fl(X) cannot cross a
 * half-integer h: for |y| < 2^52 every h is a double, and rounding is
 * monotonic, so X < h gives y <= h and X > h gives y >= h.  Hence when y is
 * not itself a half-integer, the integer nearest y is N.
 *
 * That integer is found without a call: for 0 <= a < 2^52, a + 2^52 lies
 * where the doubles are the integers, so (a + 2^52) - 2^52 is the integer
 * nearest a (the subtraction is exact), in the default rounding mode, the
 * one all of the model's arithmetic assumes; core/ is built without
 * -ffast-math, so the compiler keeps both operations.  a - n is exact too
 * (both are multiples of a's unit in the last place, at most 0.5 apart),
 * so a is a half-integer exactly when |a - n| is 0.5.  copysign puts the
 * sign back, -0.0 included: round(-0.3) is -0.0, as "-0.000000" reads back.
 *
 * Stores the rounded value in *out and returns true, or returns false
 * (writing nothing) for a tie such as x = 1/128, where X = 7812.5 exactly,
 * a product that rounded onto a half-integer, and huge or non-finite x:
 * model_round6() then decides by the definition.
 */
static inline bool model__round6_fast(double x, double *out)
{
    const double y = x * 1e6, a = fabs(y);
    double n;

    if (!(a < 0x1p52)) {
        return false;
    }
    n = (a + 0x1p52) - 0x1p52;
    if (fabs(a - n) == 0.5) {
        return false;
    }
    *out = copysign(n, y) / 1e6;
    return true;
}

#endif
