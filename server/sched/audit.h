/*
 * audit.h: the cache audit (--audit-rate R).  A sampled fraction R of step
 * requests is recomputed on the worker that ran it, without the cache: the
 * session's whole sequence (prompt and picks so far) goes through the
 * uncached reference, model_generate(use_cache = false), on a heap chain
 * of the worker's own, and the picks and the rounded logits, as the reply
 * would carry them, are compared bit for bit with what the cached step
 * produced.  On a mismatch the caller replies with the reference instead,
 * counts a divergence, logs it and rebuilds the slot (jobaudit.c).
 *
 * Memory.  With the audit on, every session records its tokens: an
 * audit_tokens_t in the session record, 4 bytes an entry, grown by
 * doubling (so 4 to 8 bytes an entry, plus one malloc block), outside the
 * pool's budget: next to a hash entry (8 bytes) the recording costs 50 to
 * 100 % of what the slot holds, next to an attn entry (tiny 256 bytes,
 * small 4 KiB, base 32 KiB) at most 3 %.  Each
 * worker keeps, from start-up, one heap chain per loaded model with room
 * for its max_ctx (hash 36 KiB, tiny 2 KiB, small 4 MiB, base 128 MiB),
 * the input and output token arrays of the largest max_ctx, and 16 rows of
 * reference logits; audit_worker_bytes() gives the figure.  With R = 0
 * none of it exists: no audit_t, no recorded token, and the step path
 * pays one test of a NULL pointer.
 *
 * Cost.  Auditing a step request of n picks at length len runs
 * sum_{k<n} (len + k) positions, against n for the cached step: R = 1
 * makes every step as dear as the uncached model.
 *
 * DESIGN.  The audit_t is immutable after audit_create() apart from its
 * per-worker parts; worker i touches only part i (its PRNG, chains and
 * buffers), from within its job.  audit_tokens_t values travel with the
 * request record like the session's cache_session_t: the loop thread owns
 * them while no job of the session is out, the worker running its job
 * while one is.
 */
#ifndef SLOTD_SERVER_AUDIT_H
#define SLOTD_SERVER_AUDIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/model.h"

/** The tokens of a session, prompt then picks, in order.  A plain value;
 * `v` is owned by whoever holds the value (the session record, or the
 * request record of its running job) and freed by audit_tokens_free(). */
typedef struct audit_tokens {
    uint32_t *v;  /* `cap` values, the first `len` valid; NULL when cap is 0 */
    uint32_t len; /* == the session's entries */
    uint32_t cap;
} audit_tokens_t;

/** audit_tokens_reserve()'s growth: `v` grown by doubling (from 64) to
 * hold `more` values after `len`.  SLOTD_OK, or SLOTD_ENOMEM (and `t` as
 * it was). */
int audit_tokens_grow(audit_tokens_t *t, uint32_t more);

/** Makes room for `more` values after `len`, growing `v` by doubling.
 * SLOTD_OK, or SLOTD_ENOMEM (and `t` as it was).  Inline: every step of
 * every session records its picks whenever the prefix cache is on. */
static inline int audit_tokens_reserve(audit_tokens_t *t, uint32_t more)
{
    return (uint64_t)t->len + more <= t->cap ? SLOTD_OK : audit_tokens_grow(t, more);
}

/** Appends `n` values; the room must have been reserved. */
static inline void audit_tokens_append(audit_tokens_t *t, const uint32_t *v, uint32_t n)
{
    if (n > 0) {
        memcpy(t->v + t->len, v, (size_t)n * sizeof(*v));
        t->len += n;
    }
}

/** Frees `v`; `t` is empty afterwards. */
void audit_tokens_free(audit_tokens_t *t);

typedef struct audit audit_t;

/** Sets up the audit at `rate` (0 < rate <= 1) for `threads` workers
 * serving `models` (not owned; they must outlive the audit): allocates
 * every worker's chains and buffers now.  *out is owned by the caller,
 * freed by audit_destroy().  SLOTD_EINVAL for a rate outside (0, 1] or no
 * worker, SLOTD_ENOMEM. */
int audit_create(double rate, unsigned threads, const model_t *const *models, size_t nmodels,
                 audit_t **out);

/** Frees the audit.  No worker may be using it. */
void audit_destroy(audit_t *a);

/** Bytes one worker holds for the audit (chains and buffers). */
size_t audit_worker_bytes(const audit_t *a);

/** Whether worker `worker` audits its current step request: true with
 * probability `rate` (always at rate 1), from the worker's own PRNG. */
bool audit_due(audit_t *a, unsigned worker);

/** Recomputes the `n` picks that follow history[0 .. len-1] without the
 * cache and compares them with `tokens` (n picks) and, for attn when
 * `logits` is not NULL, with the n * V rounded logits behind them.  If
 * they all agree, *first_bad = UINT32_MAX and nothing is written;
 * otherwise *first_bad = the index (0 .. n-1) of the first pick that
 * differs in its token or any bit of its logits, and `tokens` and
 * `logits` are overwritten with the reference's.  `scratch` is the
 * worker's model scratch.  SLOTD_OK; SLOTD_EINVAL for a model the audit
 * was not set up for or a length past its max_ctx; SLOTD_ENOMEM when the
 * reference logits of an unusually large n have no room (nothing
 * compared). */
int audit_check(audit_t *a, unsigned worker, const model_t *m, const uint32_t *history,
                uint32_t len, uint32_t n, void *scratch, uint32_t *tokens, double *logits,
                uint32_t *first_bad);

#endif
