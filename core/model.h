/*
 * model.h: the model interface that cache/ and server/ use without knowing
 * which family is behind it.
 *
 * A model_t is immutable after model_create() (weights, shape), apart from
 * its two counters, which are atomics (a model from model_create_shape()
 * gets its weights once, from model_build()): any thread may run positions of
 * different sequences on one model at once, and any thread may read the
 * counters while workers run.  Two families exist (see docs/models.md):
 * `hash` (preset "hash") and `attn` (presets "tiny", "small", "base").
 *
 * Cache memory.  A sequence's cached entries live in a chain of blocks of
 * growing capacity: the i-th block of every chain of a model holds
 * model_block_capacity(m, i) consecutive positions, a sequence the model
 * fixes at creation so that a chain (with its state) never holds more than
 * 1.10 x entries x entry size + 512 bytes, counting each block and the
 * state as a multiple of 64 bytes (see model_block_capacity()).  The chain
 * is owned by whoever provides it (the slot pool in cache/, or a heap chain
 * from model_kv_heap_alloc()); the provider fills in each block's header.
 * The model owns the layout of the bytes inside a block's `data`; nobody
 * else reads them.
 */
#ifndef SLOTD_CORE_MODEL_H
#define SLOTD_CORE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

typedef enum model_family {
    MODEL_FAMILY_HASH = 1,
    MODEL_FAMILY_ATTN = 2,
} model_family_t;

typedef struct model model_t;

/** A block of cached positions.  The 16-byte header is followed by
 * capacity * model_entry_size() bytes of `data`, laid out as the model
 * chooses (model_block_bytes_for(m, capacity) bytes in all).  A block is at
 * least 64-byte aligned, so `data` is 16-byte aligned.  The provider of
 * the chain writes the header: `capacity` is model_block_capacity() of the
 * block's index, `first` the sum of the capacities of the blocks before it. */
typedef struct model_block {
    union {
        /* A chain without a block table (model_kv_t.blocks NULL): the
         * block holding the following positions, or NULL. */
        struct model_block *next;
        /* A chain with a table: the provider's own word (the slot pool
         * counts there the chains that hold the block).  The model never
         * reads or writes it. */
        uint64_t provider;
    };
    uint32_t capacity;        /* positions this block holds */
    uint32_t first;           /* the position of its first entry */
    unsigned char data[];
} model_block_t;

/** Bytes of a block header: `data` starts this far into a block. */
#define MODEL_BLOCK_HEADER 16

/** A sequence's cache as the model sees it.  The memory it points to is not
 * the model's: the provider guarantees that the chain from `tail` has room
 * for every position the caller is about to run. */
typedef struct model_kv {
    model_block_t *head; /* first block of the chain (NULL only if no room at all) */
    model_block_t *tail; /* the block that holds position `len`, where the next entry goes */
    uint32_t len;        /* entries held: positions 0 .. len-1 are valid */
    void *state;         /* model_state_size() bytes the model keeps between calls, 8-byte aligned */
    /* The block table, or NULL: blocks[i] is the chain's i-th block, for i
     * < nblocks, which cover every position the caller is about to run.
     * With a table the model finds blocks through it and never through
     * `next`, so that one full block may sit in several chains (the slot
     * pool shares the full blocks of a prefix between sessions); without
     * one it follows `next`.  The table is the provider's; the model only
     * reads it.  The model writes only into the blocks from `tail` on, at
     * positions `len` and after; blocks before the tail are only read. */
    model_block_t *const *blocks;
    uint32_t nblocks;
} model_kv_t;

/** Creates the model for `preset` ("hash", "tiny", "small", "base"),
 * generating its weights: model_create_shape() then model_build().  On
 * success *out is owned by the caller and freed with model_destroy().
 * Returns SLOTD_OK, SLOTD_EINVAL for an unknown preset, or SLOTD_ENOMEM. */
int model_create(const char *preset, model_t **out);

/** Creates the model for `preset` without its weights: its shape and block
 * plan only, so that every accessor below answers (sizes, block
 * capacities, max_ctx), as a pool being sized needs, but no model call may
 * run until model_build() has succeeded.  Cheap (no weights: about 2 KiB).
 * Ownership and returns as model_create(). */
int model_create_shape(const char *preset, model_t **out);

/** Generates the weights of a model from model_create_shape() (the first
 * call; later ones return SLOTD_OK at once).  Writes only the weights and
 * `built`, never what the accessors read, so other threads may read the
 * shape meanwhile; no model call may run on `m` until it returns, and a
 * thread that runs calls on `m` afterwards must have been told of its
 * success through a release/acquire pair (the server publishes it so).
 * SLOTD_OK or SLOTD_ENOMEM (then `m` stays without weights, and the call
 * may be made again). */
int model_build(model_t *m);

/** Whether model_build() has succeeded on `m`: true for every model from
 * model_create().  Read under the rule of model_build(). */
bool model_built(const model_t *m);

/** Frees a model from model_create() or model_create_shape(), weights and
 * all.  No call may be running on it. */
void model_destroy(model_t *m);

/* The presets, one row each: name, family, V, d, L, max_ctx, seed, the
 * candidate capacities.  Everything else about a preset (its entry in
 * model_presets(), model_preset_name(), the configuration's list of names)
 * derives from this list (core/model.c), so adding a preset is adding a
 * row.  The capacities are model.c's block plan candidates. */
#define MODEL__PRESETS(X)                                                                          \
    X("hash", MODEL_FAMILY_HASH, 1000, 0, 1, 4096, 0, {6, 14, 30, 62, 126, 254, 510})              \
    X("tiny", MODEL_FAMILY_ATTN, 6, 8, 2, 8, 1, {1, 2, 4, 8})                                      \
    X("small", MODEL_FAMILY_ATTN, 512, 64, 4, 1024, 2, {1, 2, 4, 8, 16})                           \
    X("base", MODEL_FAMILY_ATTN, 4096, 256, 8, 4096, 3, {1, 2, 4, 8, 16})

#define MODEL__PRESET_ONE(name, ...) +1
/** How many presets there are (the rows of MODEL__PRESETS), for tables
 * indexed as model_preset_name(). */
#define MODEL_NPRESETS (0 MODEL__PRESETS(MODEL__PRESET_ONE))

/** The preset names, comma separated, in table order:
 * "hash,tiny,small,base".  Static. */
const char *model_presets(void);

/** The name of the i-th preset in the same order, or NULL past the last.
 * Static. */
const char *model_preset_name(size_t i);

/** The preset name, static for the model's lifetime. */
const char *model_name(const model_t *m);
/** Its preset's index in table order (model_preset_name(i) is its name):
 * less than MODEL_NPRESETS, for tables kept per preset. */
size_t model_preset_index(const model_t *m);
model_family_t model_family(const model_t *m);
uint32_t model_vocab(const model_t *m);
uint32_t model_max_ctx(const model_t *m);
/** Layers L for attn; 1 for hash (one g call plays the part of one row). */
uint32_t model_layers(const model_t *m);
/** Bytes of one cache entry: 8 for hash, 2*L*d*8 for attn. */
size_t model_entry_size(const model_t *m);
/** Positions of the largest block of any chain (hash 254, tiny 2, small
 * and base 16): a chain's last blocks have this capacity. */
uint32_t model_block_positions(const model_t *m);
/** Bytes of the largest block including its header:
 * model_block_bytes_for(m, model_block_positions(m)). */
size_t model_block_bytes(const model_t *m);
/** Bytes of a block of `capacity` positions: 16 + capacity * entry size. */
size_t model_block_bytes_for(const model_t *m, uint32_t capacity);
/** The capacity of the index-th block (0-based) of every chain of `m`.
 * The sequence grows with the room already held: each block is the
 * largest of the model's candidate capacities with which a chain holding
 * one entry past the blocks before it, plus its state, stays within
 * 1.10 x entries x entry size + 512 bytes (blocks and state rounded up to
 * 64 bytes).  Past the blocks that reach max_ctx it stays at the last one's
 * capacity.  Pure; O(1). */
uint32_t model_block_capacity(const model_t *m, uint32_t index);
/** The number of blocks a chain needs for `positions` positions, and
 * (if `bytes` is not NULL) their bytes with each block rounded up to
 * `align` (a power of two; 1 for the exact sizes).  O(blocks). */
uint32_t model_chain_blocks(const model_t *m, uint32_t positions, size_t align, size_t *bytes);
/** Bytes of per-sequence state (hash: the running sum; attn: the residual
 * stream x after the last position, from which model_pick() computes the
 * logits). */
size_t model_state_size(const model_t *m);
/** Bytes of scratch any call needs, a batch of MODEL_BATCH_MAX
 * (model_run_batch(), model_pick_batch(), model_prefill()) included; a
 * worker keeps one buffer per thread. */
size_t model_scratch_size(const model_t *m);

/** Runs `token` at position kv->len: writes that position's entry into the
 * chain, updates kv->state (so that model_pick() gives the token that
 * follows), and advances kv (len + 1, and tail to the next block when this
 * one is full; kv->tail->first == kv->len when a run starts a block).  Exactly one g call (hash) or L attention rows (attn),
 * counted.  Requires token < vocab, kv->len < max_ctx, room in the chain,
 * and `scratch` of model_scratch_size() bytes; these are asserted, not
 * checked: callers validate first. */
void model_run(const model_t *m, model_kv_t *kv, uint32_t token, void *scratch);

/** The greedy pick after the last position run (kv->len >= 1): the index of
 * the largest logit, lowest on a tie (attn), or the running sum mod V
 * (hash).  If `logits` is not NULL and the family is attn, writes the V
 * logits behind the pick, rounded to six decimals.  No attention row and no
 * g call is counted; for attn the logits are computed here from the state
 * (sum over i of x[i] * U[i][c]), which is why a pick reads U. */
uint32_t model_pick(const model_t *m, const model_kv_t *kv, double *logits);

/** model_pick(), writing the V logits unrounded into `raw` (attn; not
 * written for hash).  `raw` may be NULL. */
uint32_t model_pick_raw(const model_t *m, const model_kv_t *kv, double *raw);

/* ---- Batches: many sequences' positions in one pass over the weights ---- */

/** The most sequences (or prompt positions) one batch call takes. */
#define MODEL_BATCH_MAX 64

/** Bytes of scratch a batch call of `nb` (1 .. MODEL_BATCH_MAX) sequences
 * needs, at most model_scratch_size(m) (which a prefill needs), and enough
 * for any single call. */
size_t model_batch_scratch_size(const model_t *m, size_t nb);

/** model_run(m, kv[b], tokens[b], ...) for each b < nb, as one call: every
 * weight the products read is loaded once for the whole batch (attn), and
 * each sequence's attention runs on its own chain.  The sequences are of
 * model `m`, all different chains (they may share the blocks before their
 * tails, but not a tail or a state), at any lengths; the entries, states and
 * counters afterwards are bit for bit those of the nb single runs (nb * L
 * rows, or nb g calls).  Preconditions as model_run(), for each; nb <=
 * MODEL_BATCH_MAX; `scratch` of model_batch_scratch_size(m, nb) bytes. */
void model_run_batch(const model_t *m, model_kv_t *const *kv, const uint32_t *tokens, size_t nb,
                     void *scratch);

/** model_pick(m, kv[b], logits[b]) for each b < nb, as one call (attn: U
 * is loaded once for the batch): tokens[b] gets the pick.  `logits` may be
 * NULL (no logits), and so may each logits[b].  Nothing is counted.
 * `scratch` of model_batch_scratch_size(m, nb) bytes. */
void model_pick_batch(const model_t *m, const model_kv_t *const *kv, size_t nb, uint32_t *tokens,
                      double *const *logits, void *scratch);

/** model_pick_batch(), writing each sequence's logits unrounded to
 * raw[b] and rounded to logits[b], each when asked for: either array, and
 * any of their rows, may be NULL. */
void model_pick_batch_rows(const model_t *m, const model_kv_t *const *kv, size_t nb,
                           uint32_t *tokens, double *const *logits, double *const *raw,
                           void *scratch);

/** Runs tokens[0 .. n-1] at positions kv->len .. kv->len + n - 1: the
 * same entries, state and counters as n model_run() calls, computed layer
 * by layer over up to MODEL_BATCH_MAX positions at a time (the products
 * for all of them at once, then each position's causal attention).  Room
 * in the chain for n positions; `scratch` of model_scratch_size(m)
 * bytes. */
void model_prefill(const model_t *m, model_kv_t *kv, const uint32_t *tokens, size_t n,
                   void *scratch);

/** Whether the batch calls of `m` share weight loads across the batch
 * (attn models wider than tiny); otherwise they are loops of single calls,
 * correct but no faster. */
bool model_batch_shares(const model_t *m);

/** The SIMD variant the batch kernels use ("scalar", "avx2", "avx512"):
 * chosen once, the widest the CPU supports, or the one the environment
 * variable SLOTD_SIMD names if the CPU supports it. */
const char *model_simd(void);

/** The i-th variant this machine supports, narrowest first ("scalar" is
 * always 0), or NULL past the last. */
const char *model_simd_supported(size_t i);

/** Makes variant `name` the one in use (tests compare them): SLOTD_OK, or
 * SLOTD_EINVAL if the machine does not support it.  Only while no model
 * call runs. */
int model_simd_force(const char *name);

/** Rounds to six decimals exactly as printf("%.6f") does. */
double model_round6(double x);

/** Counters since creation: g calls (hash) and attention rows (attn).
 * Safe from any thread. */
uint64_t model_g_calls(const model_t *m);
uint64_t model_rows(const model_t *m);

/* ---- Validation, shared by the library calls and the server ---- */

/** A prompt for `start`: 1..max_ctx integers in [0, V).  Empty or a value
 * out of range is SLOTD_EBAD_REQUEST naming `prompt`; longer than max_ctx
 * is SLOTD_ETOO_LONG naming `length`. */
int model_check_prompt(const model_t *m, const int64_t *prompt, size_t n, slotd_error_t *err);

/** Arguments of generate: tokens 1..max_ctx integers in [0, V)
 * (SLOTD_EBAD_REQUEST naming `tokens`), steps >= 0 (`steps`), tokens plus
 * steps at most max_ctx (SLOTD_ETOO_LONG naming `length`). */
int model_check_generate(const model_t *m, const int64_t *tokens, size_t n, int64_t steps,
                         slotd_error_t *err);

/** Arguments of logits: model_check_generate() with no steps, whose
 * too_long message speaks of tokens alone. */
int model_check_logits(const model_t *m, const int64_t *tokens, size_t n, slotd_error_t *err);

/* ---- The stateless operations ---- */

/** Scores for the token after `tokens`: runs every position once; writes V
 * rounded logits and *rows = L * n.  attn only (hash: SLOTD_EBAD_REQUEST
 * naming `model`).  `kv`: NULL, and the call uses a heap chain of its own;
 * or an empty chain (len 0) with room for n positions, which it leaves
 * holding them.  `scratch`: NULL (allocated here) or model_scratch_size()
 * bytes.  Validates as model_check_logits(). */
int model_logits(const model_t *m, const int64_t *tokens, size_t n, model_kv_t *kv, void *scratch,
                 double *logits, uint64_t *rows, slotd_error_t *err);

/** The input followed by `steps` greedy picks, and the rounded logits behind
 * each pick (attn; `logits` may be NULL, and is not written for hash).
 * Cached: each position runs once, work L*(n+steps-1) for steps >= 1 and 0
 * for steps 0.  Uncached: every pick reruns every position from an empty
 * chain, work L * sum_{k<steps} (n+k).  *rows is that work (for hash, in g
 * calls).  Both give identical tokens and bit-identical logits.
 * `out_tokens` has room for n + steps, `logits` for steps * V.  `kv` and
 * `scratch` as for model_logits(), with room for n + steps positions.
 * Validates as model_check_generate(); works for both families. */
int model_generate(const model_t *m, const int64_t *tokens, size_t n, int64_t steps, bool use_cache,
                   model_kv_t *kv, void *scratch, uint32_t *out_tokens, double *logits,
                   uint64_t *rows, slotd_error_t *err);

typedef struct model_decode model_decode_t;

/** model_generate() under decoding controls `dc` (core/sample.h; NULL is
 * model_generate()): each pick is model_decode_pick()'s, and the picks end
 * early after the first of dc's stop tokens, which is kept.  *picked (if
 * not NULL) gets the number of picks made, and the work counts only
 * those.  `logits` may be NULL only when dc does not sample; when it
 * samples without dc->logits, `logits` is work memory. */
int model_generate_decode(const model_t *m, const int64_t *tokens, size_t n, int64_t steps,
                          bool use_cache, const model_decode_t *dc, model_kv_t *kv, void *scratch,
                          uint32_t *out_tokens, double *logits, size_t *picked, uint64_t *rows,
                          slotd_error_t *err);

/* ---- A heap chain, for callers without a pool (tests, bench, references) ---- */

/** Allocates a chain with room for `positions` and state; *kv is empty.
 * Freed with model_kv_heap_free().  Returns SLOTD_OK or SLOTD_ENOMEM. */
int model_kv_heap_alloc(const model_t *m, uint32_t positions, model_kv_t *kv);
void model_kv_heap_free(model_kv_t *kv);

/** Empties a chain for reuse: len 0, tail = head.  The state is left as is
 * (the next model_run at position 0 overwrites it). */
void model_kv_rewind(model_kv_t *kv);

/** Makes kv->state what running the kv->len entries the chain holds would
 * have left, where the state follows from the entries alone: hash, the
 * sum of their g.  For attn the state is the last position's residual
 * stream, which no entry holds: it is left as is, and a caller must run at
 * least one position before a pick (the prefix cache reuses entries only
 * before a sequence's last position).  No model call; nothing counted. */
void model_kv_resume(const model_t *m, model_kv_t *kv);

#if SLOTD_FAULT_INJECTION
/* ---- Test builds only (-DSLOTD_FAULT_INJECTION=ON) ---- */

/** Damages the cached entry at position `pos` (< kv->len) so that the
 * positions run after it compute from a wrong value, as a memory fault
 * would: hash flips bits of the entry's g and carries the change into the
 * running sum (the state is the sum of the entries, and no later call
 * reads an entry back); attn flips the sign and one exponent bit of the
 * first V value of layer 0.  No model call; nothing is counted. */
void model_fault_corrupt(const model_t *m, model_kv_t *kv, uint32_t pos);
#endif

#endif
