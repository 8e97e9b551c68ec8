/*
 * pool.h: the slot pool, a fixed budget of cache memory shared by every
 * live request.
 *
 * The pool owns one arena of `capacity_bytes`, reserved at creation and
 * touched lazily, carved into fixed pages and the pages into blocks of the
 * sizes each model's chains need (model_block_bytes_for() of each
 * model_block_capacity()), plus each slot's state (model_state_size()).
 * A slot's blocks grow with its entries (core/model.h), never sized to
 * max_ctx up front.  The pool writes each block's header (next, capacity,
 * first).  The step path appends into blocks the pool already owns; the
 * pool never calls malloc after creation.  Each calling thread gets a
 * small cache of free blocks that the pool owns (allocated at creation,
 * freed by cache_pool_destroy(); a thread needs no set-up or clean-up).
 *
 * Ownership.  A slot belongs to one owner from cache_pool_acquire() until
 * cache_pool_release(); its handle carries a generation, and every call
 * checks handle and owner, so a stale handle to a released (and perhaps
 * reused) slot gets SLOTD_ESTALE, never another request's entries.  Released
 * memory is poisoned in debug builds (NDEBUG unset).
 *
 * Threads and lock.  Any thread may call; a slot is used by one thread at a
 * time (the caller guarantees it: the server runs one call per session at
 * once).  One mutex guards the shared bookkeeping (slot tenancies, free
 * lists, byte counts), held only for O(1) work plus one object per object
 * taken or returned, never while a model runs; it is taken to acquire, to
 * release, and to add blocks not parked in the caller's cache.  A step
 * that fits in the slot's room takes no lock: cache_pool_reserve() then
 * reads, and cache_pool_commit() always writes, only the slot's own record
 * and the atomic entry total; between the two the caller writes into the
 * slot's blocks without the lock.  Refusals
 * (SLOTD_ECACHE_FULL) and cache_pool_stats() are exactly those of a pool
 * without the thread caches.  cache_pool_entries() is an atomic read.
 *
 * Design: docs/design.md, "The pool" and "The allocator and per-thread
 * caches".
 */
#ifndef SLOTD_CACHE_POOL_H
#define SLOTD_CACHE_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "core/model.h"

#define CACHE_ID_MAX 64

typedef struct cache_pool cache_pool_t;

typedef struct cache_pool_config {
    size_t capacity_bytes;          /* the budget: blocks and per-slot state */
    uint32_t max_slots;             /* at most this many live slots */
    const model_t *const *models;   /* every model the pool will serve; not owned, must outlive the pool */
    size_t nmodels;
    /* Address space mapped per byte of budget (0 counts as 1).  With 1,
     * pages run out before the budget's bytes do, so a refusal also
     * depends on how freed blocks left pages partly used; with F >= 2 the
     * arena holds F x (the budget's pages + one per size class), and only
     * the bytes and slots refuse until fragmentation wastes about (F - 1)
     * budgets (docs/design.md, Accounting). */
    unsigned arena_factor;
    /* Keep full blocks by their tokens for later starts to reuse (the
     * prefix cache, cache_pool_prefix_attach()); false: none is kept. */
    bool prefix_cache;
} cache_pool_config_t;

/** Who a slot belongs to: an opaque key (the server uses its connection's
 * serial number) and the request id: the bytes before the first NUL, at
 * most CACHE_ID_MAX (what follows the NUL is not part of it and may be
 * anything).  A plain value, copied into the slot. */
typedef struct cache_owner {
    uint64_t key;
    char id[CACHE_ID_MAX + 1];
} cache_owner_t;

/** Names a slot for one tenancy: index and generation.  A plain value. */
typedef struct cache_handle {
    uint32_t slot;
    uint32_t gen;
} cache_handle_t;

/** Where a slot's memory was, for a caller that will prefetch it before
 * the slot's next use: up to CACHE_HINTS ranges, each `lines[i]` cache
 * lines (SLOTD_CACHE_LINE bytes, core/util.h) from addr[i] (0 lines:
 * unused).  A plain value and a hint only: nothing may read through it,
 * as the slot may have changed, or been released, by the time it is used;
 * a prefetch never faults. */
#define CACHE_HINTS 6

typedef struct cache_hint {
    const void *addr[CACHE_HINTS];
    uint8_t lines[CACHE_HINTS];
} cache_hint_t;

typedef struct cache_pool_stats {
    uint64_t entries; /* entries held by all live slots */
    uint64_t live_slots;
    uint64_t max_slots;
    uint64_t bytes_capacity; /* == bytes_used + bytes_free, always */
    uint64_t bytes_used;     /* blocks and state held by live slots, at their 64-byte strides */
    uint64_t bytes_free;
    uint64_t shared_blocks; /* blocks of live slots held by more than one slot now */
    uint64_t forks;         /* cache_pool_fork() calls that succeeded, since creation */
    uint64_t tail_copies;   /* shared blocks copied before a write, since creation */
    /* The prefix cache (all 0 when it is off): entries and bytes of the
     * blocks it alone holds now (free room, in bytes_used until given up),
     * and, since creation, entries reused, entries looked up, and
     * cached-only entries given up for room. */
    uint64_t prefix_entries;
    uint64_t prefix_bytes;
    uint64_t prefix_hit_entries;
    uint64_t prefix_query_entries;
    uint64_t prefix_evicted_entries;
} cache_pool_stats_t;

/** Creates a pool.  *out is owned by the caller, freed by
 * cache_pool_destroy().  SLOTD_EINVAL for a zero slot count or a budget
 * that cannot hold one page (pages are sized to hold, for each block
 * capacity of each configured model, the blocks one largest block's
 * positions make: 16 blocks of one position for small and base);
 * SLOTD_ENOMEM.  Free bytes are an upper bound on what
 * can be had: an object needs a free object of its class or a free page. */
int cache_pool_create(const cache_pool_config_t *cfg, cache_pool_t **out);

/** Frees the pool and its arena; any slot still live is gone with it. */
void cache_pool_destroy(cache_pool_t *p);

/** Gives the memory of free pages back to the kernel (madvise
 * MADV_DONTNEED), so that resident memory follows the pool's use: every
 * page that has stayed free since the previous call, except the most
 * recently freed ones, up to `keep_bytes` of them, which stay ready for
 * reuse.  A page given back costs its next user zeroed pages from the
 * kernel (page faults on first write), nothing else.  Meant to be called
 * periodically (the daemon: every second, from the loop thread); takes the
 * lock for at most 32 pages at a time.  Returns the bytes given back. */
uint64_t cache_pool_trim(cache_pool_t *p, uint64_t keep_bytes);

/** Gives back to the kernel the pages of the slots' block tables (a
 * mapping outside the budget, pool_int.h) that only free slots use and a
 * released slot wrote since the last call: the tables of many short
 * sessions otherwise stay resident.  Meant to be called with
 * cache_pool_trim(); takes the lock for one pass over a bitmap of the
 * tables' pages.  Returns the bytes given back. */
uint64_t cache_pool_trim_tables(cache_pool_t *p);

/** Bytes of free pages whose memory the kernel still backs (written since
 * they were last given back). */
uint64_t cache_pool_held_free_bytes(cache_pool_t *p);

/** Gives `owner` an empty slot for model `m` (one of the config's models):
 * no entries, state allocated.  SLOTD_ECACHE_FULL when the slot count or
 * the budget is exhausted (nothing changes); SLOTD_EINVAL for an unknown
 * model. */
int cache_pool_acquire(cache_pool_t *p, const model_t *m, const cache_owner_t *owner,
                       cache_handle_t *h);

/** Makes room for `n` positions after the slot's entries, taking blocks as
 * needed, all or nothing (SLOTD_ECACHE_FULL, and nothing changes), and
 * fills `kv` with the slot's chain, entries and state.  The caller may then
 * model_run() up to `n` positions on `kv` and cache_pool_commit() it.
 * SLOTD_ESTALE if `h` or `owner` does not match the live slot; SLOTD_EINVAL
 * if entries + n would pass the model's max_ctx.  kv->tail is NULL when
 * the slot's blocks are exactly full (the next reserve adds a block). */
int cache_pool_reserve(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner, uint32_t n,
                       model_kv_t *kv);

/** Gives `owner` a new slot holding exactly the sequence of the live slot
 * `from` (of `from_owner`), sharing its blocks rather than copying them:
 * every block of from that holds an entry gains a holder and sits in both
 * chains (its capacity and first position are the same in every chain of
 * the model), and the state is copied.  No entry is copied, so the pool's
 * bytes grow by one state.  A shared block is never written: a reserve of
 * n >= 1 positions on a slot whose tail (a partly filled block) is shared
 * first gives the slot a copy of it ("copy on write"; that reserve may then
 * be refused with SLOTD_ECACHE_FULL).  A block goes back to the pool when
 * its last holder is released.  `from` must not run meanwhile (the
 * caller's rule).  *shared (if not NULL) gets the blocks shared.
 * SLOTD_ESTALE if from or from_owner does not match a live slot;
 * SLOTD_ECACHE_FULL (no slot or no room for the state; nothing changes). */
int cache_pool_fork(cache_pool_t *p, cache_handle_t from, const cache_owner_t *from_owner,
                    const cache_owner_t *owner, cache_handle_t *h, uint32_t *shared);

/** The prefix cache.  A full block can be kept by the identity of what
 * made it: the model, a `scope` (the caller's: sequences of different
 * scopes never share), the block before it, and its tokens, compared in
 * full on every hit.  cache_pool_prefix_publish() keeps the full blocks of
 * a slot whose first n entries are `tokens`; cache_pool_prefix_attach()
 * gives an empty slot (just acquired) the kept blocks of the longest kept
 * prefix of tokens[0 .. n-1] that ends before position n - 1 (the last
 * position is always run: its state is what a pick reads) and sets its
 * entries to the positions they hold (*reused); the caller then runs the
 * rest (model_kv_resume() first, for hash's state).  An entry depends only
 * on the tokens at and before it, so a reused block holds exactly what
 * the slot would have computed.  A kept block that no slot holds any more
 * stays in the cache, counted as free room (cache_pool_room()) and given
 * up, least recently used first, before any request is refused.  Both
 * calls: SLOTD_ESTALE as above; a no-op with the cache off (the config's
 * prefix_cache).  attach: SLOTD_EINVAL for a slot that holds anything.
 * publish: *stuck (may be NULL) is set when it stopped at a block whose
 * equal another chain keeps, after which no block of the slot can be kept
 * (its successors' parent is not a kept block). */
int cache_pool_prefix_attach(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner,
                             uint64_t scope, const uint32_t *tokens, uint32_t n, uint32_t *reused);
int cache_pool_prefix_publish(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner,
                              uint64_t scope, const uint32_t *tokens, uint32_t n, bool *stuck);

/** The prefix cache for a slot that grows: a slot whose blocks are exactly
 * full (entries == room) and hold tokens[0 .. entries-1] takes the kept
 * blocks that follow them in tokens[0 .. n-1] (n > entries), in `scope`,
 * up to the first not kept and never the one holding position n - 1, as
 * cache_pool_prefix_attach() does for an empty slot; its entries grow by
 * *reused (0 for a slot with a partly filled or empty reserved block, or
 * whose own blocks are not kept).  cache_pool_prefix_detach() undoes it
 * (entries: the slot's before the extend), for a caller whose next step
 * failed.  SLOTD_ESTALE as above; extend is a no-op with the cache off;
 * detach is SLOTD_EINVAL for entries past the slot's or a slot that is not
 * exactly full. */
int cache_pool_prefix_extend(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner,
                             uint64_t scope, const uint32_t *tokens, uint32_t n, uint32_t *reused);
int cache_pool_prefix_detach(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner,
                             uint32_t entries);

/** Takes every block the slot holds out of the prefix cache (the slot
 * keeps them), so that no later start reuses them: for a slot whose
 * entries were found wrong.  *forgotten gets how many.  SLOTD_ESTALE as
 * above. */
int cache_pool_prefix_forget(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner,
                             uint32_t *forgotten);

/** Gives up every block only the prefix cache holds; returns how many.
 * Blocks that live slots hold stay cached. */
uint64_t cache_pool_prefix_flush(cache_pool_t *p);

/** Makes every block of the slot that another slot holds too the slot's
 * own, by copying it (as the copy on write of cache_pool_fork()), so that
 * the slot's user may write anywhere in its chain (a rebuild, which
 * rewrites every entry).  Some blocks may have been copied when it fails.
 * SLOTD_ESTALE as above; SLOTD_ECACHE_FULL with no room for a copy. */
int cache_pool_unshare(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner);

/** Records kv->len (at least the slot's entries, within its room and the
 * model's max_ctx) as the slot's entries.  SLOTD_ESTALE as above; a length
 * outside those bounds is a bug: asserted, and SLOTD_EINVAL when
 * assertions are off. */
int cache_pool_commit(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner,
                      const model_kv_t *kv);

/** Returns every block and the state of the slot at once; the handle is
 * stale from then on.  *entries (if not NULL) gets the entries it held.
 * SLOTD_ESTALE as above (a second release of one handle is caught). */
int cache_pool_release(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner,
                       uint32_t *entries);

/** Fills *out with the memory the slot's next step reads first: the slot's
 * record, its state and, for a model whose step reads the whole chain
 * (attn), the first blocks of the chain, as cache_pool_reserve()
 * prefetches them; for hash, the tail's header.  The slot's user, with a
 * live handle (asserted), right after a commit; takes no lock. */
void cache_pool_hint(const cache_pool_t *p, cache_handle_t h, cache_hint_t *out);

/** The committed entries of slot `h` that lie in blocks another holder
 * (another slot, or the prefix cache) holds too, into *out: SLOTD_OK, or
 * SLOTD_ESTALE if `owner` does not hold `h`.  Takes the lock; any thread,
 * while no user of the slot can run (it reads the slot's chain). */
int cache_pool_shared_entries(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner,
                              uint32_t *out);

/** Entries held by all live slots.  Lock-free; any thread. */
uint64_t cache_pool_entries(const cache_pool_t *p);

/** The pool's free bytes and free slots as of the last call that held its
 * lock: an estimate, read without the lock (any thread), for a caller
 * deciding whether requests may compete for room.  Bytes parked in thread
 * caches count as taken, so the bytes are never more than
 * cache_pool_stats() would say; either figure may be stale by the calls
 * under way.  A request may still be refused with more free bytes than it
 * needs (pool.h, cache_pool_create()). */
void cache_pool_room(const cache_pool_t *p, uint64_t *bytes_free, uint64_t *slots_free);

/** The bytes the pool counts for block `index` (0-based) of a chain of
 * `m`, at its 64-byte stride, and the block's capacity in *cap.  Pure;
 * O(1). */
uint64_t cache_pool_block_bytes(const model_t *m, uint32_t index, uint32_t *cap);

/** The bytes the pool counts for a slot of `m` holding `positions`
 * entries (at most max_ctx): its state and its chain's blocks, at their
 * strides, as cache_pool_stats() counts them in bytes_used.  Pure;
 * O(blocks). */
uint64_t cache_pool_slot_bytes(const model_t *m, uint32_t positions);

/** A consistent snapshot of the figures (taken under the lock, with every
 * thread's parked blocks taken back first, which costs each thread one
 * more lock for its next block). */
void cache_pool_stats(cache_pool_t *p, cache_pool_stats_t *st);

#endif
