/*
 * session.h: a request's decode session on top of the pool and a model:
 * start (acquire + prefill), step, append, finish; and the stateless operations
 * run in a slot borrowed from the same pool.
 *
 * These are the calls a worker makes.  Each one either completes or fails
 * with the session exactly as before (the slot, its entries, its state):
 * an error never leaves half a prefill or half a step behind.
 *
 * Threads: a session is used by one thread at a time (the caller's rule);
 * different sessions may run on different threads at once.
 */
#ifndef SLOTD_CACHE_SESSION_H
#define SLOTD_CACHE_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/pool.h"
#include "core/model.h"
#include "core/sample.h"

/** A live session: its slot, model and owner.  A plain value the caller
 * keeps (the server embeds it in its session record); the memory it names
 * belongs to the pool until cache_session_finish(). */
typedef struct cache_session {
    cache_handle_t handle;
    const model_t *model;
    cache_owner_t owner;
    uint32_t entries;  /* entries the slot holds: prompt plus generated */
    cache_hint_t hint; /* set by start and step: what the next step reads first (pool.h) */
    uint64_t scope;    /* its prefix-cache scope (cache_session_start_shared()) */
    uint32_t full_at;  /* the entries at which its next block is full (cache_session_publish()) */
    bool shared;       /* started by cache_session_start_shared(): its blocks may be cached */
} cache_session_t;

/** Validates the prompt (model_check_prompt()), acquires a clean slot,
 * runs every prompt position and commits: s->entries == n.  On any error
 * (SLOTD_EBAD_REQUEST, SLOTD_ETOO_LONG, SLOTD_ECACHE_FULL) nothing is held.
 * `scratch`: model_scratch_size(m) bytes owned by the calling thread. */
int cache_session_start(cache_pool_t *p, const model_t *m, const cache_owner_t *owner,
                        const int64_t *prompt, size_t n, void *scratch, cache_session_t *s,
                        slotd_error_t *err);

/** cache_session_start() that first reuses the blocks the pool's prefix
 * cache keeps for the longest prefix of the prompt in `scope` (pool.h,
 * cache_pool_prefix_attach()), computes only the positions after them, and
 * then keeps the prompt's full blocks for later starts.  *cached (may be
 * NULL) gets the entries reused.  The slot afterwards holds exactly the
 * entries and state cache_session_start() would have left, and the
 * session's replies are the same bit for bit; `rows` and `g_calls` count
 * only what was computed.  Errors as cache_session_start(). */
int cache_session_start_shared(cache_pool_t *p, const model_t *m, const cache_owner_t *owner,
                               uint64_t scope, const int64_t *prompt, size_t n, void *scratch,
                               cache_session_t *s, uint32_t *cached, slotd_error_t *err);

/** Keeps the session's full blocks in the prefix cache (pool.h,
 * cache_pool_prefix_publish(), in the scope it started with), so that a
 * later start whose prompt opens with its sequence reuses them: a block
 * filled by an append or by picks is as immutable, once full, as one a
 * prompt filled.  `toks` is the session's whole sequence (n ==
 * s->entries); nothing is done (in O(1)) unless the session's entries
 * reached s->full_at, the end of the block that was filling, nor for a
 * session started without the prefix cache.  Then it takes the pool's
 * lock and allocates only the cache's nodes (none, and nothing kept, if
 * that fails), and moves s->full_at on. */
void cache_session_publish(cache_pool_t *p, cache_session_t *s, const uint32_t *toks, uint32_t n);

/** Runs `n` >= 1 greedy steps: each picks the next token from what the slot
 * holds and runs it (one g call, or L rows), growing the slot by one entry.
 * `tokens` gets the n picks; `logits` (attn, may be NULL) the n*V rounded
 * logits behind them.  SLOTD_ECONTEXT_FULL if entries + n > max_ctx,
 * SLOTD_ECACHE_FULL if the pool has no room, SLOTD_EBAD_REQUEST (naming
 * `n`) for n == 0, SLOTD_ESTALE for a finished session; none changes
 * anything. */
int cache_session_step(cache_pool_t *p, cache_session_t *s, uint32_t n, void *scratch,
                       uint32_t *tokens, double *logits, slotd_error_t *err);

/** cache_session_step() under decoding controls `dc` (core/sample.h; NULL
 * is cache_session_step()): each pick is model_decode_pick()'s, and the
 * steps end early after the first pick that is one of dc's stop tokens,
 * which is run and kept.  *picked (if not NULL) gets the number of picks
 * (and entries added); `tokens` and `logits` hold that many.  When dc
 * samples, `logits` (V doubles a step) must not be NULL: without
 * dc->logits it is work memory. */
int cache_session_decode(cache_pool_t *p, cache_session_t *s, uint32_t n, const model_decode_t *dc,
                         void *scratch, uint32_t *tokens, double *logits, uint32_t *picked,
                         slotd_error_t *err);

/** Runs `n` client-given tokens into the live session after its entries,
 * as if they had ended its prompt (model_prefill(), MODEL_BATCH_MAX
 * positions at a time): s->entries grows by n, and the next step picks
 * after the last of them.  The checks come first, in this order, and none
 * changes anything: SLOTD_EBAD_REQUEST naming `tokens` for n == 0 or a
 * token outside [0, V); SLOTD_ECONTEXT_FULL if entries + n > max_ctx;
 * SLOTD_ECACHE_FULL if the pool has no room for the n entries;
 * SLOTD_ESTALE for a finished session.  *cached (may be NULL) gets how
 * many of the n entries were reused rather than computed. */
int cache_session_append(cache_pool_t *p, cache_session_t *s, const int64_t *tokens, size_t n,
                         void *scratch, uint32_t *cached, slotd_error_t *err);

/** cache_session_append() that first reuses the prefix cache's kept
 * blocks (pool.h, cache_pool_prefix_extend()) that the tokens complete
 * after the session's blocks, when those are exactly full, in the scope
 * the session started with, and computes only the positions after them
 * (never the last: its state is what a pick reads).  `seq` (NULL: no
 * lookup) is the session's whole sequence after the append: its entries'
 * tokens, then `tokens`.  *cached gets the entries reused.  The slot
 * afterwards holds exactly what cache_session_append() would have left;
 * errors as it, none changing anything. */
int cache_session_append_shared(cache_pool_t *p, cache_session_t *s, const int64_t *tokens,
                                size_t n, const uint32_t *seq, void *scratch, uint32_t *cached,
                                slotd_error_t *err);

/** Starts session `s` for `owner` holding exactly the sequence of the live
 * session `from`, without a model call and without copying an entry: the
 * new slot holds from's blocks too (cache_pool_fork()), and only the state
 * is copied.  A shared block is never written: whichever of the two first
 * runs a position into a partly filled block they share makes it its own
 * first (one block copied, in its step's reserve).  from is only read, and
 * must not run meanwhile (the caller's rule).  Afterwards the two are
 * independent: nothing done to one changes the other.  SLOTD_ECACHE_FULL
 * (nothing held), SLOTD_ESTALE for a finished `from`. */
int cache_session_fork(cache_pool_t *p, const cache_session_t *from, const cache_owner_t *owner,
                       cache_session_t *s, slotd_error_t *err);

/** One greedy step (n = 1) of each of nb (1 .. MODEL_BATCH_MAX) sessions
 * of one model, as one batch: each is checked and reserved as
 * cache_session_step() would (rc[b] and err[b] get its error, and it
 * takes no part), then the sessions that passed are picked and run
 * together (model_pick_batch(), model_run_batch()) and committed.
 * tokens[b] gets session b's pick; logits[b] (may be NULL, and so may the
 * array) its V rounded logits.  Every session's result, entries and
 * counters are those of cache_session_step() with n = 1.  The sessions
 * must be live sessions of one model, all different; `scratch` of
 * model_scratch_size(). */
void cache_session_step_batch(cache_pool_t *p, cache_session_t *const *s, size_t nb,
                              void *scratch, uint32_t *tokens, double *const *logits, int *rc,
                              slotd_error_t *err);

/** cache_session_step_batch() under decoding controls: dc[b] (the array
 * may be NULL, and so may each) for session b, as cache_session_decode()
 * takes them; logits[b] must not be NULL for a session whose dc samples. */
void cache_session_decode_batch(cache_pool_t *p, cache_session_t *const *s, size_t nb,
                                const model_decode_t *const *dc, void *scratch, uint32_t *tokens,
                                double *const *logits, int *rc, slotd_error_t *err);

/** Releases the slot; *released gets the entries it held.  The session
 * value is dead afterwards (a second finish gets SLOTD_ESTALE from the pool). */
int cache_session_finish(cache_pool_t *p, cache_session_t *s, uint32_t *released);

/** Recomputes every entry of the slot from `tokens`, which must be the
 * session's whole sequence (n == s->entries: prompt plus picks), in place:
 * after it the slot holds exactly what a start with those tokens would
 * have left, whatever its entries held before.  This is how a slot found
 * to disagree with the uncached reference is repaired.  Costs n model
 * runs (counted as usual); allocates nothing, except a copy of each block
 * it shares with another session (cache_pool_unshare()), which it never
 * writes into: SLOTD_ECACHE_FULL if those do not fit.  SLOTD_ESTALE for a
 * finished session, SLOTD_EINVAL if n != s->entries or a token is out of
 * range; neither changes anything. */
int cache_session_rebuild(cache_pool_t *p, cache_session_t *s, const uint32_t *tokens, uint32_t n,
                          void *scratch);

#if SLOTD_FAULT_INJECTION
/** Test builds only: damages the slot's most recent entry through the
 * model (model_fault_corrupt()), so that the session's later cached steps
 * go wrong; a block it shares with another session is made its own first
 * (cache_pool_unshare()), so only this session is damaged.  SLOTD_ESTALE
 * for a finished session, SLOTD_EINVAL for one with no entries,
 * SLOTD_ECACHE_FULL with no room for the copies. */
int cache_session_fault_corrupt(cache_pool_t *p, cache_session_t *s);
#endif

/** model_logits() in a slot borrowed from the pool and returned before this
 * returns.  SLOTD_ECACHE_FULL if none can be had; SLOTD_EBAD_REQUEST naming
 * `model` for a hash model.  A borrowed slot's owner is key 0 with the
 * empty id, which no client id can equal (ids have 1 to 64 characters). */
int cache_session_logits(cache_pool_t *p, const model_t *m, const int64_t *tokens, size_t n,
                         void *scratch, double *logits, uint64_t *rows, slotd_error_t *err);

/** model_generate() in a borrowed slot, as cache_session_logits(). */
int cache_session_generate(cache_pool_t *p, const model_t *m, const int64_t *tokens, size_t n,
                           int64_t steps, bool use_cache, void *scratch, uint32_t *out_tokens,
                           double *logits, uint64_t *rows, slotd_error_t *err);

/** model_generate_decode() in a borrowed slot, as cache_session_logits(). */
int cache_session_generate_decode(cache_pool_t *p, const model_t *m, const int64_t *tokens,
                                  size_t n, int64_t steps, bool use_cache,
                                  const model_decode_t *dc, void *scratch, uint32_t *out_tokens,
                                  double *logits, size_t *picked, uint64_t *rows,
                                  slotd_error_t *err);

#endif
