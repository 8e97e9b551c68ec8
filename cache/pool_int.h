/*
 * pool_int.h: what the files of the slot pool share and nobody else sees.
 *
 * The pool is six files; calls go down this list, never up:
 *
 *   check.c   the checker the tests use (pool_check_int.h)  -> prefix.c, tcache.c, slab.c
 *   create.c  making and unmaking a pool               -> prefix.c, tcache.c, slab.c
 *   pool.c    slots, ownership, prefetch, the API      -> prefix.c, tcache.c, slab.c
 *   prefix.c  the prefix cache's nodes and LRU list    -> tcache.c, slab.c
 *   tcache.c  the per-thread caches and the stealing   -> slab.c
 *   slab.c    the arena, its pages and size classes    -> nothing
 *
 * This header holds the pool's record and the records of its parts, each
 * field marked with what guards it: (lock) p->lock; (user) the slot's one
 * user (pool.h); no mark: set at creation, read-only after.  A `cache__do_`
 * function assumes p->lock is held.
 *
 * Design: docs/design.md, "The pool", "The allocator and per-thread
 * caches", "Prefetch hints" and "Blocks of growing capacity".
 */
#ifndef SLOTD_CACHE_POOL_INT_H
#define SLOTD_CACHE_POOL_INT_H

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/queue.h>

#include "cache/pool.h"
#include "cache/pool_check_int.h"
#include "core/util.h"

#ifdef NDEBUG
#define CACHE__DEBUG 0
#else
#define CACHE__DEBUG 1
#endif

#define CACHE__NONE UINT32_MAX

/* ---- slab.c: pages and size classes ---- */

/* A page descriptor.  A page is either on the free-page list (cls NONE) or
 * assigned to a class: then it is on the class's partial list exactly when
 * 0 < nfree < per_page (a full page is on no list; an empty one goes back to
 * the free-page list at once).  `link` serves whichever list it is on. */
typedef struct cache__page {
    uint32_t cls;                 /* (lock) class index, or NONE while free */
    uint32_t nfree;               /* (lock) free objects, on the free list or not yet carved */
    uint32_t carved;              /* (lock) objects handed out since the page was assigned */
    uint32_t freed;               /* (lock) while free: the trim epoch it was freed in; 0 while
                                     the kernel has its memory back (never written, or trimmed) */
    LIST_ENTRY(cache__page) link; /* (lock) the class's partial list, or the free-page list */
    void *free;                   /* (lock) freed objects, linked through their first word */
} cache__page_t;

LIST_HEAD(cache__pages, cache__page);

/* A size class: objects of one stride. */
typedef struct cache__class {
    size_t stride;               /* object size rounded up to CACHE__ALIGN */
    uint32_t per_page;           /* objects one page holds */
    uint32_t mag_cap;            /* objects a thread cache parks of this class (0: none) */
    bool blocks;                 /* the class holds blocks, not only states */
    struct cache__pages partial; /* (lock) pages with both free and used objects */
    uint64_t nfree;              /* (lock) free objects on this class's pages, carved or not */
} cache__class_t;

/* ---- tcache.c: the per-thread caches ---- */

/* A thread cache parks at most this many objects of one class, and at most
 * CACHE__MAG_BYTES of them by their strides; a class that would get fewer
 * than two gets none (its objects are large, and the model's work per
 * block dwarfs the lock). */
#define CACHE__MAG_MAX 16
#define CACHE__MAG_BYTES ((size_t)16 * 1024)

/* Thread caches per pool: threads beyond this many use the lock for every
 * block. */
#define CACHE__TCACHES 64

/* A magazine's count while a lock holder has taken its objects back. */
#define CACHE__STOLEN UINT32_MAX

/* One thread's parked objects of one class.  `obj` is written only by the
 * owning thread with the lock held; `n` grows only then too, and shrinks
 * either by the owner's lock-free pop (a compare-and-swap from k to k - 1,
 * after reading obj[k - 1]) or by a lock holder's steal (an exchange to
 * CACHE__STOLEN, after which it hands obj[0 .. k-1] back to their pages).
 * The two cannot both get one object: n changes by atomic read-modify-
 * writes only.  The owner sets a stolen magazine back to 0 under the lock,
 * after the steal (whose lock it waited for) is over. */
typedef struct cache__mag {
    _Atomic uint32_t n;
    void *obj[CACHE__MAG_MAX];
} cache__mag_t;

/* One thread's cache in one pool: a magazine per class.  `thread` names
 * the thread that claimed it (the address of its thread-local record,
 * unique among live threads); a claim is never undone while the pool
 * lives, and a new thread that happens to get a dead one's address simply
 * inherits its cache. */
typedef struct cache__tcache {
    const void *thread; /* (lock) NULL while unclaimed */
    cache__mag_t *mags; /* nclasses magazines */
} cache__tcache_t;

/* ---- pool.c and create.c: models and slots ---- */

/* Bytes of a block, from its start, that a reserve prefetches. */
#define CACHE__PREFETCH_BYTES 640

/* Words of an id of CACHE_ID_MAX bytes (the NUL not included). */
#define CACHE__ID_WORDS ((CACHE_ID_MAX + 7) / 8)

/* Blocks of a chain a slot names besides head, tail and last. */
#define CACHE__SLOT_BLOCKS 4

/* Most distinct block capacities one model's chains use. */
#define CACHE__MAX_CAPS 16

/* What the pool needs of one configured model. */
typedef struct cache__model {
    const model_t *m;
    uint32_t max_ctx;
    uint32_t ncaps;                     /* distinct block capacities */
    uint32_t caps[CACHE__MAX_CAPS];     /* each capacity ... */
    uint32_t caps_cls[CACHE__MAX_CAPS]; /* ... and its class */
    size_t state_bytes; /* the state's stride, counted per slot; 0: no state object */
    uint32_t state_cls; /* NONE when state_bytes is 0 */
    bool reads_chain;   /* a step reads every block (attn), not only the tail (hash) */
    /* Lines of the i-th block of a chain that a step's prefetch asks for
     * (at most CACHE__PREFETCH_BYTES of it), and of the state. */
    uint8_t block_lines[CACHE__SLOT_BLOCKS];
    uint8_t state_lines;
} cache__model_t;

/* One slot.  (user) fields are written by the slot's user, with or without
 * the lock, and read by that thread without it; other threads read them
 * only under the lock and only while no user can run (acquire, release and
 * the checker).  `gen` is written under the lock and read by the unlocked
 * fast paths of reserve and commit.
 *
 * Three aligned cache lines: every call reads the first (the chain) and the
 * second (the owner: key, length, tail mask and the first five id words,
 * so an id of up to 40 bytes is checked there); only a longer id reaches
 * the third, and a reserve for a model that reads its whole chain (attn),
 * which reads the chain's first blocks there to prefetch them.  The free
 * stack is an index, not a pointer, so that `state` stays on line one. */
typedef struct cache__slot {
    _Atomic uint32_t gen; /* odd while live; (lock) to write */
    uint32_t next_free;   /* (lock) the free-slot stack, while free */
    uint32_t model;       /* (lock) index into p->models, set before gen goes odd */
    uint32_t entries;     /* (user) committed positions */
    uint32_t nblocks;     /* (user) blocks in the chain */
    uint32_t room;        /* (user) positions they hold: the sum of their capacities */
    uint64_t bytes;       /* (user) their strides (a shared block counted in each holder) */
    model_block_t *head;  /* (user) first block, or NULL with no room */
    model_block_t *tail;  /* (user) the block holding `entries`; NULL when entries == room */
    model_block_t *last;  /* (user) last block of the chain, where reserve appends */
    void *state;          /* (lock) state_bytes bytes, or NULL; set before gen goes odd */
    /* The owner, set before gen goes odd and fixed while live, (lock): its
     * key, and its id as whole words, zero past the id's end, so that the
     * check on every call compares a few words instead of a string. */
    uint64_t owner_key;
    uint32_t id_len;                    /* bytes before the id's NUL: 0 to CACHE_ID_MAX */
    uint64_t id_tail_mask;              /* selects the id's bytes of its last, partial word */
    uint64_t id_words[CACHE__ID_WORDS]; /* the id's bytes, zero-padded */
    /* (user) the first min(nblocks, CACHE__SLOT_BLOCKS) blocks of the
     * chain, so that a prefetch need not follow `next` to find them; in
     * the room the alignment leaves anyway. */
    model_block_t *blocks[CACHE__SLOT_BLOCKS];
} __attribute__((aligned(CACHE__ALIGN))) cache__slot_t;

_Static_assert(sizeof(cache__slot_t) == 3 * CACHE__ALIGN, "a slot is three cache lines");

/* Shared blocks.  A block of a live slot's chain counts in its header's
 * `provider` word (core/model.h) the chains that hold it: 1 for a block
 * that only its slot holds; more after cache_pool_fork() gave it to
 * another slot too.  The count changes only under p->lock (atomically, as
 * a slot's user reads it without the lock).  Nobody writes into a block
 * whose count is above 1: the blocks a fork shares are the full ones and
 * the partly filled tail, and a slot whose tail is shared first makes it
 * its own (cache_pool_reserve() copies it, "copy on write") before it
 * writes there.  A count of 1 that the slot's user reads stays 1 until it
 * forks the slot itself, so its writes need no lock.  A block goes back to
 * its page (or a thread cache) exactly when a release takes its count to
 * 0. */
static inline uint64_t cache__holders(const model_block_t *b)
{
    return __atomic_load_n(&b->provider, __ATOMIC_RELAXED) & UINT32_MAX;
}

/* Changes b's count by `delta` (p->lock held); returns the new count.  The
 * count is the word's low half; the high half names the block's node in
 * the prefix cache (prefix.c), 0 for none. */
static inline uint64_t cache__do_hold(model_block_t *b, int delta)
{
    return __atomic_add_fetch(&b->provider, (uint64_t)(int64_t)delta, __ATOMIC_RELAXED) &
           UINT32_MAX;
}

/* The index of the block of table t (n blocks, ascending firsts) that
 * starts at position `first`: a binary search; the block must be there. */
static inline uint32_t cache__block_index(model_block_t *const *t, uint32_t n, uint32_t first)
{
    uint32_t lo = 0, hi = n;

    while (lo + 1 < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (t[mid]->first <= first)
            lo = mid;
        else
            hi = mid;
    }
    assert(lo < n && t[lo]->first == first);
    return lo;
}

_Static_assert(SIZE_MAX / sizeof(cache__slot_t) >= UINT32_MAX,
               "a table of any uint32_t count of slots has a size_t size");
_Static_assert(offsetof(cache__slot_t, id_words) + 5 * sizeof(uint64_t) <= 2 * CACHE__ALIGN,
               "the owner check of an id of up to 40 bytes reads two lines");

/* ---- prefix.c: the prefix cache ---- */

typedef struct cache__pnode cache__pnode_t;
TAILQ_HEAD(cache__pnodes, cache__pnode);

/* The prefix cache's bookkeeping, all (lock) but `on` and `key` (set at
 * creation). */
typedef struct cache__prefix {
    bool on;
    uint64_t key[2];               /* the hash's per-process key */
    cache__pnode_t **buckets;      /* nbuckets (a power of two) chains */
    uint32_t nbuckets;
    cache__pnode_t **nodes;        /* node index -> node (NULL: free), nnodes_cap of them */
    uint32_t *free_ix;             /* free node indices, nfree_ix of them */
    uint32_t nnodes_cap, nfree_ix;
    uint64_t nnodes;               /* nodes in the cache */
    uint64_t next_serial;          /* the next node's serial (from 1; 0: no parent) */
    struct cache__pnodes lru;      /* nodes whose block only the cache holds, oldest first */
    uint64_t lru_entries;          /* their entries */
    uint64_t lru_bytes;            /* and their strides */
    uint64_t hit_entries, query_entries, evicted_entries; /* since creation */
} cache__prefix_t;

/* ---- The pool ---- */

struct cache_pool {
    /* Set at creation, then read-only: no lock needed. */
    unsigned char *arena;
    size_t arena_bytes; /* npages * page_size: arena_factor x the budget's pages */
    size_t page_size;
    size_t sys_page; /* the system's page size: cache_pool_trim() gives whole ones back */
    uint32_t npages;
    uint32_t max_slots;
    uint64_t capacity;
    cache__model_t *models;
    size_t nmodels;
    cache__class_t *classes; /* stride, per_page, mag_cap read-only; the rest (lock) */
    uint32_t nclasses;
    cache__slot_t *slots;     /* max_slots entries, (lock); mapped, unmapped by destroy */
    size_t slots_bytes;       /* the mapping's length */
    /* Each slot's block table, table_len entries a slot (the most blocks
     * any model's chain has at max_ctx), slot i's from tables + i *
     * table_len: entry k is the chain's k-th block, for k < nblocks.
     * (user) as the slot's chain fields.  Mapped (touched as used),
     * unmapped by destroy. */
    model_block_t **tables;
    size_t tables_bytes;
    uint32_t table_len;
    /* (lock) one bit per system page of the tables: a released slot wrote
     * there since cache_pool_trim_tables() last gave it back.  calloc'd at
     * creation, freed by destroy. */
    uint64_t *tables_dirty;
    size_t tables_pages;
    cache__page_t *pages;     /* npages entries, (lock) */
    uint64_t serial;          /* this pool's number, never reused: names it to thread caches */
    cache__tcache_t *tcaches; /* CACHE__TCACHES; `thread` (lock), magazines see cache__mag_t */

    /* Three groups on cache lines of their own: the read-only fields
     * above, which every lock-free reserve and commit reads; the lock and
     * what it guards, which every acquisition writes; and `entries`, which
     * every commit writes (bench/RESULTS.md, "Conclusions that still
     * hold").  Padding rather than _Alignas: the pool comes from calloc(),
     * aligned to 16 bytes only, and a line between two fields puts them on
     * different lines whatever the base. */
    char pad_ro[SLOTD_CACHE_LINE];

    /* Guards every (lock) field: the slot table, the page descriptors, the
     * class lists, the thread caches' claims and objects, and the counts
     * below.  Held for O(1) table work per call, plus one object per object
     * a reserve takes or parks or a release returns, and one per parked
     * object a steal takes back; never while a model runs or while a slot's
     * bytes are written or poisoned.  No other lock is taken while it is
     * held. */
    pthread_mutex_t lock;
    uint32_t free_slot;             /* (lock) free-slot stack, through next_free */
    struct cache__pages free_pages; /* (lock) free-page stack, changed only at its top */
    uint32_t pages_free;            /* (lock) pages on that stack */
    uint32_t pages_held;            /* (lock) of those, pages the kernel still backs */
    uint32_t trim_epoch;            /* (lock) cache_pool_trim() calls so far, plus 1 */
    uint64_t live_slots;            /* (lock) */
    cache__prefix_t prefix;         /* (lock) prefix.c */
    uint64_t shared_forks;          /* (lock) cache_pool_fork() calls that succeeded */
    uint64_t shared_blocks;         /* (lock) blocks whose count of holders is 2 or more */
    uint64_t tail_copies;           /* (lock) shared blocks made a slot's own (do_block_copy()) */
    /* (lock) objects off the pages' free lists, at their strides: those
     * live slots hold, plus those parked in thread caches (and, for the
     * moment between its pops and its return, those a lock-free reserve
     * is handing to its slot).  Right after cache__do_steal_all(), with the
     * lock still held, it is exactly the bytes live slots hold. */
    uint64_t bytes_taken;

    char pad_lock[SLOTD_CACHE_LINE];

    /* Entries committed by all live slots: written under the lock, or by
     * a commit without it, read without it (cache_pool_entries()). */
    _Atomic uint64_t entries;
    /* bytes_taken and live_slots as of the last unlock (cache__unlock()),
     * for cache_pool_room(): read without the lock. */
    _Atomic uint64_t room_taken;
    _Atomic uint64_t room_live;
    char pad_end[SLOTD_CACHE_LINE - 3 * sizeof(uint64_t)];
};

/* The index of capacity `cap` among md's capacities. */
static inline uint32_t cache__cap_index(const cache__model_t *md, uint32_t cap)
{
    uint32_t k = 0;

    while (md->caps[k] != cap) {
        k++;
        assert(k < md->ncaps && "cache pool: a capacity the model does not use");
    }
    return k;
}

/* Slot si's block table (cache_pool.tables). */
static inline model_block_t **cache__table(const cache_pool_t *p, uint32_t si)
{
    return p->tables + (size_t)si * p->table_len;
}

/* Releases p->lock, first publishing the room figures it guards for
 * cache_pool_room(). */
static inline void cache__unlock(cache_pool_t *p)
{
    /* Blocks only the prefix cache holds are free room. */
    atomic_store_explicit(&p->room_taken, p->bytes_taken - p->prefix.lru_bytes,
                          memory_order_relaxed);
    atomic_store_explicit(&p->room_live, p->live_slots, memory_order_relaxed);
    pthread_mutex_unlock(&p->lock);
}

static inline size_t cache__round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

/* A free object's or a block's link: its first word. */
static inline void *cache__link_get(const void *obj)
{
    void *link;
    memcpy(&link, obj, sizeof link);
    return link;
}

static inline void cache__link_set(void *obj, void *link)
{
    memcpy(obj, &link, sizeof link);
}

/* The index of page `pg`, and the page holding `obj` (in the arena). */
static inline uint32_t cache__page_index(const cache_pool_t *p, const cache__page_t *pg)
{
    return (uint32_t)(pg - p->pages);
}

static inline cache__page_t *cache__page_at(const cache_pool_t *p, const void *obj)
{
    return &p->pages[(size_t)((const unsigned char *)obj - p->arena) / p->page_size];
}

/* ---- slab.c ---- */

/* The calloc() of the pool's tables (pool_check_int.h, cache__pool_set_calloc()). */
extern void *(*cache__calloc)(size_t nmemb, size_t size);

#if CACHE__DEBUG
void cache__poison(void *obj, size_t stride, void *link);
void cache__poison_fresh(void *obj, size_t stride);
bool cache__poison_intact(const void *obj, size_t stride);
#endif

/* The page size for the configured models; 0 if one is unfit. */
size_t cache__slab_page_size(const model_t *const *models, size_t nmodels);
/* The class of objects of `size` bytes, added if new (creation only). */
uint32_t cache__slab_class_for(cache_pool_t *p, size_t size);
/* Sizes the classes, maps the arena of `npages` and allocates its page
 * table; both are released by cache__slab_fini() (on failure, nothing is
 * left to release). */
int cache__slab_init(cache_pool_t *p, size_t npages);
void cache__slab_fini(cache_pool_t *p);

bool cache__do_class_can(const cache_pool_t *p, uint32_t ci, uint64_t n);
bool cache__do_classes_can(const cache_pool_t *p, const cache__model_t *md, const uint64_t *count);
void *cache__do_obj_take(cache_pool_t *p, uint32_t ci, bool *fresh);
void cache__do_obj_free(cache_pool_t *p, void *obj);

/* ---- tcache.c ---- */

/* Allocates the pool's thread caches (classes made first), released by
 * cache__tcache_fini() (on failure, nothing is left to release). */
int cache__tcache_init(cache_pool_t *p);
void cache__tcache_fini(cache_pool_t *p);
cache__tcache_t *cache__tcache_mine(const cache_pool_t *p);
cache__tcache_t *cache__do_tcache_claim(cache_pool_t *p);
uint32_t cache__do_mag_count(cache__mag_t *m);
void *cache__mag_pop(cache_pool_t *p, cache__mag_t *m, uint32_t ci);
void cache__do_mag_fill(cache_pool_t *p, cache__mag_t *m, uint32_t ci);
void *cache__do_obj_alloc(cache_pool_t *p, uint32_t ci);
void cache__do_obj_give(cache_pool_t *p, cache__tcache_t *tc, void *obj);
void cache__do_steal_all(cache_pool_t *p);
bool cache__take_parked(cache_pool_t *p, cache__tcache_t *tc, const uint32_t *cls, uint32_t need,
                        model_block_t **got);

/* ---- prefix.c ---- */

/* Sets the cache up (on: with its key and buckets), released by
 * cache__prefix_fini() (on failure too). */
int cache__prefix_init(cache_pool_t *p, bool on);
void cache__prefix_fini(cache_pool_t *p);
/* The node of a block, or NULL if the cache does not hold it. */
cache__pnode_t *cache__prefix_node_of(const cache_pool_t *p, const model_block_t *b);
/* Block b, cached, has just lost its last slot: onto the LRU list. */
void cache__do_prefix_unheld(cache_pool_t *p, model_block_t *b);
/* Takes every block slot si holds out of the cache (they stay the
 * slot's); returns how many. */
uint32_t cache__do_prefix_forget(cache_pool_t *p, cache__slot_t *s, uint32_t si);
/* Gives up the least recently used cached-only block: false if none. */
bool cache__do_prefix_evict(cache_pool_t *p);
/* Gives the empty slot si the cached blocks of the longest cached prefix
 * of tok[0 .. n-1] that ends before position n - 1; returns the positions
 * they hold (the slot's entries now). */
uint32_t cache__do_prefix_attach(cache_pool_t *p, cache__slot_t *s, uint32_t si, uint64_t scope,
                                 const uint32_t *tok, uint32_t n, uint64_t *last_serial);
/* Slot si, whose blocks are exactly full and are tok[0 .. entries-1],
 * grows by the cached blocks that follow them in tok[0 .. n-1] and end
 * before position n - 1; returns the positions added (to its entries). */
uint32_t cache__do_prefix_extend(cache_pool_t *p, cache__slot_t *s, uint32_t si, uint64_t scope,
                                 const uint32_t *tok, uint32_t n);
/* Caches the full blocks of slot si that tok[0 .. n-1] made and the cache
 * lacks; returns how many.  *stuck is set when it stopped at a block whose
 * equal another chain keeps: no later block of the slot can be cached. */
uint32_t cache__do_prefix_publish(cache_pool_t *p, cache__slot_t *s, uint32_t si, uint64_t scope,
                                  const uint32_t *tok, uint32_t n, bool *stuck);
/* The checker's part: returns the violations; *lru_bytes gets the bytes of
 * the cached-only blocks. */
int cache__prefix_check(cache_pool_t *p, uint64_t *lru_bytes, uint64_t *nodes_on_lru);

#endif
