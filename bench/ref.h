/*
 * ref.h: the uncached reference a --verify run compares the daemon against.
 *
 * A reference is what model_generate(prompt, steps, use_cache=false) gives:
 * the greedy picks after the prompt and, for attn models, the logits behind
 * each pick, already printed with "%.6f" so that they compare as text.  A
 * cache keyed by (prompt, steps) computes each distinct one once.  A cache
 * belongs to one thread.
 */
#ifndef SLOTD_BENCH_REF_H
#define SLOTD_BENCH_REF_H

#include <stddef.h>
#include <stdint.h>

#include "core/model.h"

/** One reference.  Read-only for its users; owned by the cache (if it was
 * kept there) or by the holders of its references. */
typedef struct ref {
    uint32_t steps;    /* picks */
    uint32_t vocab;    /* logits per pick; 0 for hash models (no logits) */
    uint32_t *tokens;  /* `steps` picks */
    uint32_t *offsets; /* steps * vocab offsets into text */
    char *text;        /* NUL-terminated "%.6f" strings */
    /* private */
    uint32_t _refs;
    uint32_t _prompt_len;
    uint64_t _hash;
    int64_t *_prompt;
    size_t _bytes;
    int _cached;
} ref_t;

typedef struct ref_cache ref_cache_t;

/** Creates a cache for model `m` (borrowed: it must outlive the cache) that
 * keeps at most about `max_bytes` of references.  Returns 0, or -1 when out
 * of memory.  *out is freed with ref_cache_destroy(). */
int ref_cache_create(const model_t *m, size_t max_bytes, ref_cache_t **out);

/** Frees the cache and every reference it keeps.  Every reference taken
 * with ref_get() must have been put back with ref_put() first. */
void ref_cache_destroy(ref_cache_t *rc);

/** The reference for `prompt` (n tokens) and `steps` picks, computed with
 * the uncached model_generate() if it is not cached.  The caller holds it
 * until ref_put().  Returns NULL on out-of-memory or if the model rejects
 * the arguments (the message is written to `err`, at least 128 bytes). */
ref_t *ref_get(ref_cache_t *rc, const int64_t *prompt, uint32_t n, uint32_t steps, char *err,
               size_t errlen);

/** Gives back a reference from ref_get(); NULL is ignored. */
void ref_put(ref_cache_t *rc, ref_t *r);

/** How many ref_get() calls were answered from the cache, and how many had
 * to compute. */
void ref_cache_counts(const ref_cache_t *rc, uint64_t *hits, uint64_t *misses);

#endif
