/*
 * pool.c: the slot pool.  Owns the arena every cached entry lives in, the
 * page descriptors that carve it, the size classes, the slot table that
 * says which owner holds which chain of blocks and which state object, and
 * the per-thread caches of free blocks (magazines).  The pool never calls
 * malloc after creation.
 *
 * Threads.  Any thread may call any function; one slot is used by one
 * thread at a time (the caller's rule, see pool.h).
 *
 * Locks.  p->lock guards every field marked (lock): the slot table's free
 * stack and tenancies, the page descriptors, the class lists, the byte and
 * slot counts, the claims of thread caches and every write of a magazine's
 * objects.  It is held for the table work of one call, never while a model
 * runs; it is taken to acquire, to release, and to add blocks that are not
 * parked in the caller's thread cache.  A step whose room the slot already
 * holds, or whose missing blocks are parked in its thread's cache, takes
 * no lock: it touches only fields marked (user), which the slot's one user
 * writes, its own magazines, and the atomic entry total.  Fast paths match
 * the handle against the slot's generation (release store when a tenancy
 * begins, acquire load), so a stale handle fails before anything else is
 * read.  Fields set at creation are read without the lock.
 *
 * Design: docs/design.md, "The pool", "The allocator and per-thread
 * caches" and "Prefetch hints".
 */
#include "cache/pool.h"
#include "cache/pool_impl.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef NDEBUG
#define CACHE__DEBUG 0
#else
#define CACHE__DEBUG 1
#endif

#define CACHE__NONE UINT32_MAX

/* A size class: objects of one stride. */
typedef struct cache__class {
    size_t stride;     /* object size rounded up to CACHE__ALIGN; immutable */
    uint32_t per_page; /* objects one page holds; immutable */
    uint32_t mag_cap;  /* objects a thread cache parks of this class (0: none); immutable */
    uint32_t partial;  /* (lock) head of the pages with both free and used objects */
    uint64_t nfree;    /* (lock) free objects on this class's pages, carved or not */
} cache__class_t;

/* A page descriptor.  A page is either on the free-page list (cls NONE) or
 * assigned to a class: then it is on the class's partial list exactly when
 * 0 < nfree < per_page (a full page is on no list; an empty one goes back to
 * the free-page list at once). */
typedef struct cache__page {
    uint32_t cls;    /* (lock) class index, or NONE while free */
    uint32_t nfree;  /* (lock) free objects, on the free list or not yet carved */
    uint32_t carved; /* (lock) objects handed out since the page was assigned */
    uint32_t prev;   /* (lock) partial list; unused on the free-page list */
    uint32_t next;   /* (lock) partial list, or the free-page list */
    uint32_t freed;  /* (lock) while free: the trim epoch it was freed in; 0 while
                        the kernel has its memory back (never written, or trimmed) */
    void *free;      /* (lock) freed objects, linked through their first word */
} cache__page_t;

/* Words of an id of CACHE_ID_MAX bytes (the NUL not included). */
#define CACHE__ID_WORDS ((CACHE_ID_MAX + 7) / 8)

/* Blocks of a chain a slot names besides head, tail and last. */
#define CACHE__SLOT_BLOCKS 4

/* Most distinct block capacities one model's chains use. */
#define CACHE__MAX_CAPS 16

/* What the pool needs of one configured model; immutable. */
typedef struct cache__model {
    const model_t *m;
    uint32_t max_ctx;
    uint32_t ncaps;                     /* distinct block capacities */
    uint32_t caps[CACHE__MAX_CAPS];     /* each capacity ... */
    uint32_t caps_cls[CACHE__MAX_CAPS]; /* ... and its class */
    size_t state_bytes; /* the state's stride, counted per slot; 0: no state object */
    uint32_t state_cls; /* NONE when state_bytes is 0 */
    bool reads_chain;   /* a step reads every block (attn), not only the tail (hash) */
    /* Lines of the i-th block of a chain that a step's prefetch asks for:
     * the block, at most CACHE__PREFETCH_BYTES of it; and of the state. */
    uint8_t block_lines[CACHE__SLOT_BLOCKS];
    uint8_t state_lines;
} cache__model_t;

/* Thread caches.  A thread cache parks at most this many objects of one
 * class, and at most CACHE__MAG_BYTES of them by their strides; a class
 * that would get fewer than two gets none (its objects are large, and the
 * model's work per block dwarfs the lock). */
#define CACHE__MAG_MAX 16
#define CACHE__MAG_BYTES ((size_t)16 * 1024)

/* Thread caches per pool: threads beyond this many use the lock for every
 * block, as all threads did before thread caches. */
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
    cache__mag_t *mags; /* nclasses magazines; immutable */
} cache__tcache_t;

/* One slot.  (lock): written only under the lock.  (user): written by
 * the slot's user, the one thread at a time the caller lets use the slot,
 * with or without the lock, and read by that thread without it; other
 * threads read these only under the lock and only while no user can run
 * (acquire, release and the test check).  `gen` is an atomic: written under
 * the lock, read by the unlocked fast paths of reserve and commit.
 *
 * A slot is 64-byte aligned (the table too, cache_pool_create()), three
 * cache lines: with many live slots each call finds its slot out of cache,
 * and every call reads the first line (the chain) and the second (the
 * owner: key, length, tail mask and the first five id words, so an id of
 * up to 40 bytes is checked there); only a longer id reaches the third,
 * and a reserve for a model that reads its whole chain (attn), which reads
 * the chain's first blocks there to prefetch them. */
typedef struct cache__slot {
    _Atomic uint32_t gen; /* odd while live; (lock) to write */
    uint32_t next_free;   /* (lock) the free-slot stack, while free */
    uint32_t model;       /* (lock) index into p->models, set before gen goes odd */
    uint32_t entries;     /* (user) committed positions */
    uint32_t nblocks;     /* (user) blocks in the chain */
    uint32_t room;        /* (user) positions they hold: the sum of their capacities */
    uint64_t bytes;       /* (user) their strides */
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
     * chain, so that cache__prefetch() need not follow `next` to find
     * them; in the room the alignment leaves anyway. */
    model_block_t *blocks[CACHE__SLOT_BLOCKS];
} __attribute__((aligned(CACHE__ALIGN))) cache__slot_t;

_Static_assert(sizeof(cache__slot_t) == 3 * CACHE__ALIGN, "a slot is three cache lines");
_Static_assert(SIZE_MAX / sizeof(cache__slot_t) >= UINT32_MAX,
               "a table of any uint32_t count of slots has a size_t size");
_Static_assert(offsetof(cache__slot_t, id_words) + 5 * sizeof(uint64_t) <= 2 * CACHE__ALIGN,
               "the owner check of an id of up to 40 bytes reads two lines");

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
    cache__class_t *classes; /* stride, per_page, mag_cap immutable; the rest (lock) */
    uint32_t nclasses;
    cache__slot_t *slots;     /* max_slots entries, (lock); mapped, unmapped by destroy */
    size_t slots_bytes;       /* the mapping's length */
    cache__page_t *pages;     /* npages entries, (lock) */
    uint64_t serial;          /* this pool's number, never reused: names it to thread caches */
    cache__tcache_t *tcaches; /* CACHE__TCACHES; `thread` (lock), magazines see cache__mag_t */

    /* Three groups on cache lines of their own: the read-only fields
     * above, which every lock-free reserve and commit reads; the lock and
     * what it guards, which every acquisition writes; and `entries`, which
     * every commit writes.  Sharing lines, each acquisition of the lock
     * and each commit cost the other threads a miss (C=64 P=16, 6
     * interleaved rounds: 3.37 -> 3.23 us of daemon CPU per step).  Padding
     * rather than _Alignas: the pool comes from calloc(), aligned to 16
     * bytes only, and 64 bytes between two fields put them on different
     * lines whatever the base. */
    char pad_ro[64];

    /* Guards every (lock) field: the slot table, the page descriptors, the
     * class lists, the thread caches' claims and objects, and the counts
     * below.  Held for O(1) table work per call, plus one object per object
     * a reserve takes or parks or a release returns, and one per parked
     * object a steal takes back; never while a model runs or while a slot's
     * bytes are written or poisoned.  No other lock is taken while it is
     * held. */
    pthread_mutex_t lock;
    uint32_t free_slot;  /* (lock) free-slot stack, through next_free */
    uint32_t free_page;  /* (lock) free-page stack, through next */
    uint32_t pages_free; /* (lock) pages on that stack */
    uint32_t pages_held; /* (lock) of those, pages whose memory the kernel still backs */
    uint32_t trim_epoch; /* (lock) cache_pool_trim() calls so far, plus 1 */
    uint64_t live_slots; /* (lock) */
    /* (lock) objects off the pages' free lists, at their strides: those
     * live slots hold, plus those parked in thread caches (and, for the
     * moment between its pops and its return, those a lock-free reserve
     * is handing to its slot).  Right after do_steal_all(), with the lock
     * still held, it is exactly the bytes live slots hold (those of such a
     * reserve counted as its slot's). */
    uint64_t bytes_taken;

    char pad_lock[64];

    /* Entries committed by all live slots: written under the lock, or by
     * a commit without it, read without it (cache_pool_entries()). */
    _Atomic uint64_t entries;
    /* bytes_taken and live_slots as of the last unlock (do_unlock()), for
     * cache_pool_room(): read without the lock. */
    _Atomic uint64_t room_taken;
    _Atomic uint64_t room_live;
    char pad_end[64 - 3 * sizeof(uint64_t)];
};

static void *(*cache__calloc)(size_t, size_t) = calloc;

/* Pools are numbered so that a thread's record of its cache never names a
 * destroyed pool whose memory a new pool happens to reuse. */
static _Atomic uint64_t cache__pool_serial;

/* Releases p->lock, first publishing the room figures it guards for
 * cache_pool_room(). */
static void do_unlock(cache_pool_t *p)
{
    atomic_store_explicit(&p->room_taken, p->bytes_taken, memory_order_relaxed);
    atomic_store_explicit(&p->room_live, p->live_slots, memory_order_relaxed);
    pthread_mutex_unlock(&p->lock);
}

/* The calling thread's cache in the pool it used last: `pool` is that
 * pool's serial (0: none yet), `tc` its cache there, or NULL if the pool
 * had none left to give.  Only this thread reads or writes it. */
static _Thread_local struct cache__tls {
    uint64_t pool;
    cache__tcache_t *tc;
} cache__tls;

void cache__pool_set_calloc(void *(*fn)(size_t, size_t))
{
    cache__calloc = fn != NULL ? fn : calloc;
}

static size_t cache__round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

static void *cache__link_get(const void *obj)
{
    void *link;
    memcpy(&link, obj, sizeof link);
    return link;
}

static void cache__link_set(void *obj, void *link)
{
    memcpy(obj, &link, sizeof link);
}

#if CACHE__DEBUG
static uint64_t cache__magic_get(const void *obj)
{
    uint64_t magic;
    memcpy(&magic, (const unsigned char *)obj + 8, sizeof magic);
    return magic;
}

/* Poisons a detached object, keeping `link` in its first word.  Runs
 * without the lock: the caller holds the only reference to `obj`. */
static void cache__poison(void *obj, size_t stride, void *link)
{
    const uint64_t magic = CACHE__FREE_MAGIC;

    /* The magic of a first free is still there at a second one. */
    assert(cache__magic_get(obj) != CACHE__FREE_MAGIC && "cache pool: object freed twice");
    memset(obj, CACHE__POISON, stride);
    cache__link_set(obj, link);
    memcpy((unsigned char *)obj + 8, &magic, sizeof magic);
}

/* A free object about to be handed out still carries its magic and its
 * poison (the first and last cache lines are checked): if not, someone
 * wrote to it after releasing it. */
static bool cache__poison_intact(const void *obj, size_t stride)
{
    const unsigned char *b = obj;
    size_t head_end = stride < 2 * CACHE__ALIGN ? stride : 2 * CACHE__ALIGN;
    size_t tail_start = stride - CACHE__ALIGN > head_end ? stride - CACHE__ALIGN : head_end;

    if (cache__magic_get(obj) != CACHE__FREE_MAGIC)
        return false;
    for (size_t i = 16; i < head_end; i++)
        if (b[i] != CACHE__POISON)
            return false;
    for (size_t i = tail_start; i < stride; i++)
        if (b[i] != CACHE__POISON)
            return false;
    return true;
}
#endif

/* ---- Pages and objects.  Everything from here to the public calls
 * assumes p->lock is held. ---- */

static void do_partial_push(cache_pool_t *p, uint32_t ci, uint32_t pi)
{
    cache__class_t *c = &p->classes[ci];
    cache__page_t *pg = &p->pages[pi];

    pg->prev = CACHE__NONE;
    pg->next = c->partial;
    if (c->partial != CACHE__NONE)
        p->pages[c->partial].prev = pi;
    c->partial = pi;
}

static void do_partial_remove(cache_pool_t *p, uint32_t ci, uint32_t pi)
{
    cache__class_t *c = &p->classes[ci];
    cache__page_t *pg = &p->pages[pi];

    if (pg->prev != CACHE__NONE)
        p->pages[pg->prev].next = pg->next;
    else
        c->partial = pg->next;
    if (pg->next != CACHE__NONE)
        p->pages[pg->next].prev = pg->prev;
    pg->prev = pg->next = CACHE__NONE;
}

/* Whether class `ci` can hand out `n` objects right now. */
static bool do_class_can(const cache_pool_t *p, uint32_t ci, uint64_t n)
{
    const cache__class_t *c = &p->classes[ci];

    return n <= c->nfree + (uint64_t)p->pages_free * c->per_page;
}

/* The index in md->caps of capacity `cap`, one the model's chains use. */
static uint32_t do_cap_index(const cache__model_t *md, uint32_t cap)
{
    uint32_t k = 0;

    while (md->caps[k] != cap) {
        k++;
        assert(k < md->ncaps && "cache pool: a capacity the model does not use");
    }
    return k;
}

/* Whether the classes of model `md` can hand out count[k] objects of
 * capacity md->caps[k], all at once: the free pages that classes short of
 * free objects need are counted together, as they compete for them. */
static bool do_classes_can(const cache_pool_t *p, const cache__model_t *md, const uint64_t *count)
{
    uint64_t want[CACHE__MAX_CAPS] = {0}, pages = 0;

    /* Capacities of one model may share a class (equal strides). */
    for (uint32_t k = 0; k < md->ncaps; k++) {
        uint32_t first = 0;

        while (md->caps_cls[first] != md->caps_cls[k])
            first++;
        want[first] += count[k];
    }
    for (uint32_t k = 0; k < md->ncaps; k++) {
        const cache__class_t *c = &p->classes[md->caps_cls[k]];

        if (want[k] > c->nfree)
            pages += (want[k] - c->nfree + c->per_page - 1) / c->per_page;
    }
    return pages <= p->pages_free;
}

static void do_steal_class(cache_pool_t *p, uint32_t ci);

/* Takes one object of class `ci`; the caller has checked do_class_can().
 * The object is left as the last user or the poison left it; *fresh says
 * whether it was never handed out since its page was assigned (then it
 * carries no poison). */
static void *do_obj_take(cache_pool_t *p, uint32_t ci, bool *fresh)
{
    cache__class_t *c = &p->classes[ci];
    uint32_t pi = c->partial;
    cache__page_t *pg;
    unsigned char *obj;

    if (pi == CACHE__NONE && c->mag_cap > 0) {
        /* Objects of the class parked in threads' caches are taken back
         * before a page is given to the class: otherwise the new page
         * would stay split off while those holes sit parked, and a later
         * request of another class could be refused where a pool without
         * caches has a free page (tests/test_cache.c,
         * test_parked_blocks_keep_pages_whole). */
        do_steal_class(p, ci);
        pi = c->partial;
    }
    if (pi == CACHE__NONE) {
        pi = p->free_page;
        assert(pi != CACHE__NONE && "cache pool: do_class_can() not checked");
        pg = &p->pages[pi];
        p->free_page = pg->next;
        p->pages_free--;
        if (pg->freed != 0)
            p->pages_held--;
        pg->freed = 0;
        pg->cls = ci;
        pg->nfree = c->per_page;
        pg->carved = 0;
        pg->free = NULL;
        c->nfree += c->per_page;
        do_partial_push(p, ci, pi);
    }
    pg = &p->pages[pi];
    assert(pg->cls == ci && pg->nfree > 0);
    if (pg->free != NULL) {
        obj = pg->free;
#if CACHE__DEBUG
        assert(cache__poison_intact(obj, c->stride) && "cache pool: write after release");
#endif
        pg->free = cache__link_get(obj);
        *fresh = false;
    } else {
        assert(pg->carved < c->per_page);
        obj = p->arena + (size_t)pi * p->page_size + (size_t)pg->carved * c->stride;
        pg->carved++;
        *fresh = true;
    }
    pg->nfree--;
    c->nfree--;
    if (pg->nfree == 0)
        do_partial_remove(p, ci, pi);
    return obj;
}

/* do_obj_take() for a slot: the object's first two words are zeroed (a
 * block's `next` and the debug magic). */
static void *do_obj_alloc(cache_pool_t *p, uint32_t ci)
{
    bool fresh;
    void *obj = do_obj_take(p, ci, &fresh);

    memset(obj, 0, 16);
    return obj;
}

/* Gives an object back to its page, and the page back to the free-page
 * list if that was its last object in use. */
static void do_obj_free(cache_pool_t *p, void *obj)
{
    size_t off = (size_t)((unsigned char *)obj - p->arena);
    uint32_t pi = (uint32_t)(off / p->page_size);
    cache__page_t *pg = &p->pages[pi];
    cache__class_t *c;

    assert((unsigned char *)obj >= p->arena && off < p->arena_bytes);
    assert(pg->cls < p->nclasses && "cache pool: object on a free page");
    c = &p->classes[pg->cls];
    assert((off - (size_t)pi * p->page_size) % c->stride == 0);
    assert((off - (size_t)pi * p->page_size) / c->stride < pg->carved);
#if CACHE__DEBUG
    assert(cache__magic_get(obj) == CACHE__FREE_MAGIC && "cache pool: freed unpoisoned");
#endif
    cache__link_set(obj, pg->free);
    pg->free = obj;
    if (pg->nfree == 0)
        do_partial_push(p, pg->cls, pi);
    pg->nfree++;
    c->nfree++;
    if (pg->nfree == c->per_page) {
        do_partial_remove(p, pg->cls, pi);
        c->nfree -= c->per_page;
        pg->cls = CACHE__NONE;
        pg->free = NULL;
        pg->next = p->free_page;
        p->free_page = pi;
        p->pages_free++;
        pg->freed = p->trim_epoch;
        p->pages_held++;
    }
}

/* ---- Thread caches ---- */

/* The calling thread's cache in `p`, if it has claimed one; no lock.  NULL
 * sends the caller to the lock (do_tcache_claim()). */
static cache__tcache_t *cache__tcache_mine(const cache_pool_t *p)
{
    return cache__tls.pool == p->serial ? cache__tls.tc : NULL;
}

/* The calling thread's cache in `p`, claimed now if it has none and one is
 * left; NULL if none is. */
static cache__tcache_t *do_tcache_claim(cache_pool_t *p)
{
    cache__tcache_t *free_tc = NULL;

    if (cache__tls.pool == p->serial)
        return cache__tls.tc;
    for (uint32_t i = 0; i < CACHE__TCACHES; i++) {
        cache__tcache_t *tc = &p->tcaches[i];

        if (tc->thread == &cache__tls) {
            free_tc = tc;
            break;
        }
        if (tc->thread == NULL && free_tc == NULL)
            free_tc = tc;
    }
    if (free_tc != NULL)
        free_tc->thread = &cache__tls;
    cache__tls.pool = p->serial;
    cache__tls.tc = free_tc;
    return free_tc;
}

/* Objects the owner's magazine holds, a stolen one reset to empty.  The
 * owner only, with the lock held (no steal can run). */
static uint32_t do_mag_count(cache__mag_t *m)
{
    uint32_t k = atomic_load_explicit(&m->n, memory_order_relaxed);

    if (k == CACHE__STOLEN) {
        atomic_store_explicit(&m->n, 0, memory_order_relaxed);
        k = 0;
    }
    return k;
}

/* Parks `obj` in the owner's magazine of class `ci` if it has room.  The
 * owner only, with the lock held; `obj` carries the debug poison. */
static bool do_mag_push(cache_pool_t *p, cache__mag_t *m, uint32_t ci, void *obj)
{
    uint32_t k = do_mag_count(m);

    if (k >= p->classes[ci].mag_cap)
        return false;
    m->obj[k] = obj;
    atomic_store_explicit(&m->n, k + 1, memory_order_relaxed);
    return true;
}

/* Takes the last object of the owner's magazine, or NULL if it is empty
 * or being stolen; with or without the lock.  The object's first two words
 * are zeroed, as do_obj_alloc() does. */
static void *cache__mag_pop(cache_pool_t *p, cache__mag_t *m, uint32_t ci)
{
    uint32_t k = atomic_load_explicit(&m->n, memory_order_relaxed);
    void *obj;

    if (k == 0 || k == CACHE__STOLEN)
        return NULL;
    /* Only the owner writes obj[], and only under the lock, so reading it
     * here races with nothing; the exchange below decides whose it is. */
    obj = m->obj[k - 1];
    if (!atomic_compare_exchange_strong_explicit(&m->n, &k, k - 1, memory_order_relaxed,
                                                 memory_order_relaxed))
        return NULL;
#if CACHE__DEBUG
    assert(cache__poison_intact(obj, p->classes[ci].stride) && "cache pool: write after release");
#else
    (void)p;
    (void)ci;
#endif
    memset(obj, 0, 16);
    return obj;
}

/* Takes back the objects parked in magazine `m` (of class `ci`), and
 * marks it stolen for its owner to reset.  Lock held. */
static void do_steal_mag(cache_pool_t *p, cache__mag_t *m, uint32_t ci)
{
    uint32_t k = atomic_exchange_explicit(&m->n, CACHE__STOLEN, memory_order_acq_rel);

    if (k == CACHE__STOLEN)
        return;
    for (uint32_t j = 0; j < k; j++)
        do_obj_free(p, m->obj[j]);
    p->bytes_taken -= (uint64_t)k * p->classes[ci].stride;
}

/* Hands every object parked in every thread cache back to its page.  After
 * it, with the lock still held, bytes_taken is what live slots hold and
 * the pages are as if there were no thread caches: a lock holder calls it
 * before refusing anything, so that a parked object never makes a request
 * fail, and before reporting figures, so that they are exact. */
static void do_steal_all(cache_pool_t *p)
{
    for (uint32_t i = 0; i < CACHE__TCACHES; i++) {
        cache__tcache_t *tc = &p->tcaches[i];

        if (tc->thread == NULL)
            continue;
        for (uint32_t ci = 0; ci < p->nclasses; ci++)
            if (p->classes[ci].mag_cap > 0)
                do_steal_mag(p, &tc->mags[ci], ci);
    }
}

/* Takes back every thread's parked objects of class `ci`, as
 * do_steal_all() does for every class.  Lock held. */
static void do_steal_class(cache_pool_t *p, uint32_t ci)
{
    for (uint32_t i = 0; i < CACHE__TCACHES; i++) {
        cache__mag_t *m = &p->tcaches[i].mags[ci];

        /* Only the owner adds to its magazine, under the lock we hold: an
         * empty one stays empty, and is left unmarked. */
        if (p->tcaches[i].thread != NULL &&
            atomic_load_explicit(&m->n, memory_order_relaxed) != 0)
            do_steal_mag(p, m, ci);
    }
}

/* Tops the owner's magazine of class `ci` up from the class's partial
 * pages, never assigning a page to the class for it (so that parking
 * changes which pages a class holds as little as possible), and never past
 * the budget: a parked object counts as taken, and a lock-free reserve
 * takes it without another look at the bytes. */
static void do_mag_fill(cache_pool_t *p, cache__mag_t *m, uint32_t ci)
{
    cache__class_t *c = &p->classes[ci];

    while (c->partial != CACHE__NONE && do_mag_count(m) < c->mag_cap &&
           p->bytes_taken + c->stride <= p->capacity) {
        bool fresh;
        void *obj = do_obj_take(p, ci, &fresh);

#if CACHE__DEBUG
        /* A parked object looks like a freed one: the pop checks its poison. */
        if (fresh) {
            const uint64_t magic = CACHE__FREE_MAGIC;

            memset(obj, CACHE__POISON, c->stride);
            memcpy((unsigned char *)obj + 8, &magic, sizeof magic);
        }
#else
        (void)fresh;
#endif
        (void)do_mag_push(p, m, ci, obj);
        p->bytes_taken += c->stride;
    }
}

/* ---- Slots ---- */

/* Records `owner` as slot `s`'s: the key, the id's length and its bytes in
 * whole words, zero after the id.  As before, an id is what precedes its
 * first NUL, at most CACHE_ID_MAX bytes. */
static void do_owner_set(cache__slot_t *s, const cache_owner_t *owner)
{
    unsigned char bytes[sizeof s->id_words] = {0}, mask[8] = {0};
    const char *nul = memchr(owner->id, '\0', CACHE_ID_MAX);
    size_t len = nul != NULL ? (size_t)(nul - owner->id) : CACHE_ID_MAX;

    memcpy(bytes, owner->id, len);
    memcpy(s->id_words, bytes, sizeof bytes);
    memset(mask, 0xFF, len % 8 != 0 ? len % 8 : 8);
    memcpy(&s->id_tail_mask, mask, sizeof mask);
    s->id_len = (uint32_t)len;
    s->owner_key = owner->key;
}

/* Whether `o` is slot `s`'s owner: the same key, and an id with the same
 * bytes followed by a NUL (what strncmp() over the whole array said).
 * Each word of o's id is read whole and compared with the stored one, the
 * last under a mask, as the bytes after o's NUL may be anything.  Every
 * byte read lies within o->id: the words end at id_len rounded up to a
 * word, at most CACHE_ID_MAX, and o->id[id_len] is at most o->id[CACHE_ID_MAX]. */
static bool cache__owner_eq(const cache__slot_t *s, const cache_owner_t *o)
{
    uint32_t len = s->id_len, nw = (len + 7) / 8;
    uint64_t w;

    if (o->key != s->owner_key || o->id[len] != '\0')
        return false;
    for (uint32_t i = 0; i + 1 < nw; i++) {
        memcpy(&w, o->id + 8 * i, sizeof w);
        if (w != s->id_words[i])
            return false;
    }
    if (nw > 0) {
        memcpy(&w, o->id + 8 * (nw - 1), sizeof w);
        if ((w & s->id_tail_mask) != s->id_words[nw - 1])
            return false;
    }
    return true;
}

/* The live slot `h` names, if `owner` holds it; NULL if the handle is stale
 * or the owner is not the slot's. */
static cache__slot_t *do_slot_get(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner)
{
    cache__slot_t *s;

    if (h.slot >= p->max_slots || (h.gen & 1) == 0)
        return NULL;
    s = &p->slots[h.slot];
    if (atomic_load_explicit(&s->gen, memory_order_relaxed) != h.gen || !cache__owner_eq(s, owner))
        return NULL;
    return s;
}

/* do_slot_get() without the lock, for the fast paths of reserve and
 * commit.  The generation is read first, with acquire order: it matches
 * only during the handle's own tenancy, and the owner, model and state were
 * written before that tenancy's generation was stored (release order, in
 * acquire) and do not change until its release.  A release can only come
 * from the slot's user, which is the caller (one user at a time), so the
 * owner read cannot race with the next acquire's write.  NULL sends the
 * caller to the locked path, which gives the definitive answer. */
static cache__slot_t *cache__slot_get_unlocked(cache_pool_t *p, cache_handle_t h,
                                               const cache_owner_t *owner)
{
    cache__slot_t *s;

    if (h.slot >= p->max_slots || (h.gen & 1) == 0)
        return NULL;
    s = &p->slots[h.slot];
    if (atomic_load_explicit(&s->gen, memory_order_acquire) != h.gen || !cache__owner_eq(s, owner))
        return NULL;
    return s;
}

static int cache__model_index(const cache_pool_t *p, const model_t *m)
{
    for (size_t i = 0; i < p->nmodels; i++)
        if (p->models[i].m == m)
            return (int)i;
    return -1;
}

/* Gives back an object of a released slot: parked in thread cache `tc`
 * (may be NULL) if its class's magazine has room, else to its page. */
static void do_obj_give(cache_pool_t *p, cache__tcache_t *tc, void *obj)
{
    uint32_t ci = p->pages[(size_t)((unsigned char *)obj - p->arena) / p->page_size].cls;

    assert(ci < p->nclasses && "cache pool: object on a free page");
    if (tc != NULL && do_mag_push(p, &tc->mags[ci], ci, obj))
        return;
    do_obj_free(p, obj);
    assert(p->bytes_taken >= p->classes[ci].stride);
    p->bytes_taken -= p->classes[ci].stride;
}

/* Hands slot `si`'s objects back (`head` the chain, linked through the
 * first word of each block) to the caller's thread cache `tc` (may be
 * NULL) or their pages, and puts the slot on the free stack. */
static void do_slot_free(cache_pool_t *p, cache__tcache_t *tc, uint32_t si, model_block_t *head,
                         void *state)
{
    cache__slot_t *s = &p->slots[si];

    while (head != NULL) {
        model_block_t *next = cache__link_get(head);
        do_obj_give(p, tc, head);
        head = next;
    }
    if (state != NULL)
        do_obj_give(p, tc, state);
    assert(p->live_slots > 0);
    p->live_slots--;
    atomic_fetch_sub_explicit(&p->entries, s->entries, memory_order_relaxed);
    s->entries = s->nblocks = s->room = 0;
    s->bytes = 0;
    s->head = s->tail = s->last = NULL;
    s->state = NULL;
    s->next_free = p->free_slot;
    p->free_slot = si;
}

#if CACHE__DEBUG
/* Poisons a detached chain and state, keeping the chain linked. */
static void cache__poison_slot(const cache_pool_t *p, const cache__model_t *md, model_block_t *head,
                               void *state)
{
    while (head != NULL) {
        model_block_t *next = head->next;
        size_t bstride = cache__round_up(model_block_bytes_for(md->m, head->capacity), CACHE__ALIGN);

        cache__poison(head, bstride, next);
        head = next;
    }
    if (state != NULL)
        cache__poison(state, p->classes[md->state_cls].stride, NULL);
}
#endif

/* Appends block `b` of `cap` positions, just taken for slot `s`, to its
 * chain.  The slot's user, with or without the lock. */
static void cache__slot_append(cache__slot_t *s, model_block_t *b, uint32_t cap)
{
    /* The taker zeroed b->next. */
    b->capacity = cap;
    b->first = s->room;
    if (s->last != NULL)
        s->last->next = b;
    else
        s->head = b;
    s->last = b;
    if (s->nblocks < CACHE__SLOT_BLOCKS)
        s->blocks[s->nblocks] = b;
    if (s->tail == NULL)
        s->tail = b; /* entries was == room: position `entries` is here */
    s->nblocks++;
    s->room += cap;
}

/* Bytes of a block, from its start, that a reserve prefetches. */
#define CACHE__PREFETCH_BYTES 640

/* Asks the CPU to start loading the first CACHE__PREFETCH_BYTES of block
 * `b`.  A prefetch never faults; `b` is one of the slot's own blocks. */
static inline void cache__prefetch_block(const model_block_t *b)
{
    for (size_t off = 0; off < CACHE__PREFETCH_BYTES; off += CACHE__ALIGN)
        __builtin_prefetch((const char *)b + off);
}

/* What a step of slot `s` reads first, as cache_pool_hint() describes it:
 * the slot's record, the state (the pick reads it first) and, for a model
 * whose step reads every block (attn), the chain's first
 * CACHE__SLOT_BLOCKS blocks; for hash, the tail's header.  Reads the
 * slot's own fields only, never a block.  The slot's user. */
static void cache__slot_hint(const cache__model_t *md, const cache__slot_t *s, cache_hint_t *out)
{
    size_t n = s->nblocks < CACHE__SLOT_BLOCKS ? s->nblocks : CACHE__SLOT_BLOCKS, k = 0;

    _Static_assert(CACHE_HINTS >= 2 + CACHE__SLOT_BLOCKS, "a hint names every line asked for");
    memset(out, 0, sizeof(*out));
    out->addr[k] = s;
    out->lines[k++] = sizeof(*s) / CACHE__ALIGN;
    if (s->state != NULL) {
        out->addr[k] = s->state;
        out->lines[k++] = md->state_lines;
    }
    if (!md->reads_chain) {
        if (s->tail != NULL) {
            out->addr[k] = s->tail;
            out->lines[k++] = 1;
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        out->addr[k] = s->blocks[i];
        out->lines[k++] = md->block_lines[i];
    }
}

/* Asks the CPU to start loading what the model reads right after a
 * reserve, while the caller is still on its way there: the lines of
 * cache__slot_hint() but the slot's record (the caller has it), and for a
 * chain longer than those blocks its tail and last block too (all of a
 * tiny chain).  With many live sessions all of it is out of cache, and
 * without this the model finds the blocks one `next` at a time.  A hint
 * only: it changes no byte.  The slot's user, on the fast path of
 * reserve. */
static void cache__prefetch(const cache__model_t *md, const cache__slot_t *s)
{
    cache_hint_t h;

    cache__slot_hint(md, s, &h);
    for (size_t k = 1; k < CACHE_HINTS; k++)
        for (size_t l = 0; l < h.lines[k]; l++)
            __builtin_prefetch((const char *)h.addr[k] + l * CACHE__ALIGN);
    if (md->reads_chain && s->nblocks > CACHE__SLOT_BLOCKS) {
        if (s->tail != NULL)
            cache__prefetch_block(s->tail);
        if (s->last != NULL && s->last != s->tail)
            cache__prefetch_block(s->last);
    }
}

void cache_pool_hint(const cache_pool_t *p, cache_handle_t h, cache_hint_t *out)
{
    const cache__slot_t *s;

    assert(p != NULL && out != NULL && h.slot < p->max_slots);
    s = &p->slots[h.slot];
    assert(atomic_load_explicit(&s->gen, memory_order_relaxed) == h.gen);
    cache__slot_hint(&p->models[s->model], s, out);
}

/* Most blocks a reserve takes from its thread cache without the lock. */
#define CACHE__FAST_BLOCKS 4

/* Adds the blocks that take slot `s` from its room to `want` positions
 * (within max_ctx) from the caller's thread cache `tc`, without the lock:
 * false, with nothing changed, unless they are all parked there.  A steal
 * between the count and the pops is the one way a pop fails; the objects
 * popped before it are then parked again under the lock. */
static bool cache__reserve_parked(cache_pool_t *p, const cache__model_t *md, cache__slot_t *s,
                                  cache__tcache_t *tc, uint64_t want)
{
    uint32_t cls[CACHE__FAST_BLOCKS], caps[CACHE__FAST_BLOCKS], need = 0;
    model_block_t *got[CACHE__FAST_BLOCKS];
    uint64_t bytes = 0;

    for (uint64_t r = s->room; r < want; need++) {
        uint32_t cap;

        if (need == CACHE__FAST_BLOCKS)
            return false;
        cap = model_block_capacity(md->m, s->nblocks + need);
        caps[need] = cap;
        cls[need] = md->caps_cls[do_cap_index(md, cap)];
        r += cap;
    }
    /* Enough of every class?  (A class may serve several of the blocks.) */
    for (uint32_t i = 0; i < need; i++) {
        uint32_t same = 0, k;

        for (uint32_t j = 0; j < need; j++)
            same += cls[j] == cls[i];
        k = atomic_load_explicit(&tc->mags[cls[i]].n, memory_order_relaxed);
        if (k == CACHE__STOLEN || k < same)
            return false;
    }
    for (uint32_t i = 0; i < need; i++) {
        got[i] = cache__mag_pop(p, &tc->mags[cls[i]], cls[i]);
        if (got[i] == NULL) {
            pthread_mutex_lock(&p->lock);
            for (uint32_t j = 0; j < i; j++) {
#if CACHE__DEBUG
                /* Popped objects are zeroed at the head: poison them again. */
                const uint64_t magic = CACHE__FREE_MAGIC;
                memset(got[j], CACHE__POISON, p->classes[cls[j]].stride);
                memcpy((unsigned char *)got[j] + 8, &magic, sizeof magic);
#endif
                if (!do_mag_push(p, &tc->mags[cls[j]], cls[j], got[j])) {
                    do_obj_free(p, got[j]);
                    p->bytes_taken -= p->classes[cls[j]].stride;
                }
            }
            do_unlock(p);
            return false;
        }
        bytes += p->classes[cls[i]].stride;
    }
    for (uint32_t i = 0; i < need; i++)
        cache__slot_append(s, got[i], caps[i]);
    s->bytes += bytes;
    return true;
}

/* Whether the blocks count[k] (per capacity index k of `md`) can be had,
 * taking first what the caller's thread cache `tc` (may be NULL) parks of
 * each class and the rest from the pages: the byte rule and the pages'
 * supply, as do_classes_can(). */
static bool do_reserve_can(cache_pool_t *p, const cache__model_t *md, cache__tcache_t *tc,
                           const uint64_t *count)
{
    uint64_t left[CACHE__MAX_CAPS] = {0}, pages[CACHE__MAX_CAPS] = {0}, bytes = 0;

    for (uint32_t k = 0; k < md->ncaps; k++) {
        uint32_t first = 0, ci = md->caps_cls[k];
        uint64_t take;

        while (md->caps_cls[first] != ci)
            first++;
        if (first == k && tc != NULL)
            left[k] = do_mag_count(&tc->mags[ci]);
        take = count[k] < left[first] ? count[k] : left[first];
        left[first] -= take;
        pages[k] = count[k] - take;
        bytes += pages[k] * p->classes[ci].stride;
    }
    return p->bytes_taken + bytes <= p->capacity && do_classes_can(p, md, pages);
}

/* ---- Creation ---- */

/* The page unit of model `m`: for each block capacity c its chains use,
 * ceil(largest / c) blocks of c positions at their stride; the largest of
 * these.  A page that is a multiple of it holds, of every capacity c, as
 * many blocks as one largest block has positions / c, less at most their
 * headers' rounding: with the models' power-of-two capacities (core/model.c)
 * a page's unused tail is under 1 KiB for small and base, where a page the
 * size of the largest block would leave up to half of it unused for blocks
 * of 8 positions (resident in part, and never usable). */
static size_t cache__page_unit(const model_t *m)
{
    uint32_t nb = model_chain_blocks(m, model_max_ctx(m), 1, NULL), big = model_block_positions(m);
    size_t unit = 0;

    for (uint32_t b = 0; b < nb; b++) {
        uint32_t cap = model_block_capacity(m, b);
        size_t u = cache__round_up(model_block_bytes_for(m, cap), CACHE__ALIGN) *
                   ((big + cap - 1) / cap);
        if (u > unit)
            unit = u;
    }
    return unit;
}

/* The class of objects of `size` bytes, added if new. */
static uint32_t cache__class_for(cache_pool_t *p, size_t size)
{
    size_t stride = cache__round_up(size, CACHE__ALIGN);

    for (uint32_t i = 0; i < p->nclasses; i++)
        if (p->classes[i].stride == stride)
            return i;
    p->classes[p->nclasses].stride = stride;
    p->classes[p->nclasses].partial = CACHE__NONE;
    return p->nclasses++;
}

int cache_pool_create(const cache_pool_config_t *cfg, cache_pool_t **out)
{
    cache_pool_t *p;
    size_t unit_max = 0;
    size_t npages;
    void *arena;
    int rc = SLOTD_ENOMEM;

    if (cfg == NULL || out == NULL || cfg->capacity_bytes == 0 || cfg->max_slots == 0 ||
        cfg->arena_factor > CACHE__ARENA_FACTOR_MAX || cfg->max_slots == CACHE__NONE ||
        cfg->models == NULL || cfg->nmodels == 0)
        return SLOTD_EINVAL;
    for (size_t i = 0; i < cfg->nmodels; i++) {
        const model_t *m = cfg->models[i];
        if (m == NULL || model_block_positions(m) == 0 ||
            model_block_bytes_for(m, model_block_capacity(m, 0)) < sizeof(model_block_t) + 8)
            return SLOTD_EINVAL;
        size_t unit = cache__page_unit(m);

        if (unit > unit_max)
            unit_max = unit;
        if (cache__round_up(model_state_size(m), CACHE__ALIGN) > unit_max)
            unit_max = cache__round_up(model_state_size(m), CACHE__ALIGN);
    }

    p = cache__calloc(1, sizeof *p);
    if (p == NULL)
        return SLOTD_ENOMEM;
    p->capacity = cfg->capacity_bytes;
    p->max_slots = cfg->max_slots;
    p->nmodels = cfg->nmodels;
    p->page_size = unit_max * ((CACHE__PAGE_MIN + unit_max - 1) / unit_max);
    long sys_page = sysconf(_SC_PAGESIZE);
    p->sys_page = sys_page > 0 ? (size_t)sys_page : 4096;
    if (p->page_size > cfg->capacity_bytes) {
        /* Not one page of the largest object fits the budget. */
        rc = SLOTD_EINVAL;
        goto fail_pool;
    }
    npages = cfg->capacity_bytes / p->page_size;
    if (npages >= CACHE__NONE)
        goto fail_pool;
    p->npages = (uint32_t)npages;
    p->arena_bytes = npages * p->page_size;

    p->models = cache__calloc(cfg->nmodels, sizeof *p->models);
    if (p->models == NULL)
        goto fail_pool;
    p->classes = cache__calloc((CACHE__MAX_CAPS + 1) * cfg->nmodels, sizeof *p->classes);
    if (p->classes == NULL)
        goto fail_models;
    for (size_t i = 0; i < cfg->nmodels; i++) {
        cache__model_t *md = &p->models[i];
        uint32_t nb;

        md->m = cfg->models[i];
        md->max_ctx = model_max_ctx(md->m);
        md->reads_chain = model_family(md->m) == MODEL_FAMILY_ATTN;
        nb = model_chain_blocks(md->m, md->max_ctx, 1, NULL);
        for (uint32_t b = 0; b < nb; b++) {
            uint32_t cap = model_block_capacity(md->m, b), k = 0;

            while (k < md->ncaps && md->caps[k] != cap)
                k++;
            if (k < md->ncaps)
                continue;
            if (md->ncaps == CACHE__MAX_CAPS) {
                rc = SLOTD_EINVAL;
                goto fail_classes;
            }
            md->caps[md->ncaps] = cap;
            md->caps_cls[md->ncaps++] = cache__class_for(p, model_block_bytes_for(md->m, cap));
        }
        md->state_bytes = cache__round_up(model_state_size(md->m), CACHE__ALIGN);
        md->state_cls = md->state_bytes > 0 ? cache__class_for(p, md->state_bytes) : CACHE__NONE;
        md->state_lines = (uint8_t)((md->state_bytes < 4 * CACHE__ALIGN ? md->state_bytes
                                                                       : 4 * CACHE__ALIGN) /
                                    CACHE__ALIGN);
        for (uint32_t b = 0; b < CACHE__SLOT_BLOCKS; b++) {
            size_t bytes = model_block_bytes_for(md->m, model_block_capacity(md->m, b));

            if (bytes > CACHE__PREFETCH_BYTES)
                bytes = CACHE__PREFETCH_BYTES;
            md->block_lines[b] = (uint8_t)(cache__round_up(bytes, CACHE__ALIGN) / CACHE__ALIGN);
        }
    }
    for (uint32_t i = 0; i < p->nclasses; i++) {
        cache__class_t *c = &p->classes[i];
        size_t fit = CACHE__MAG_BYTES / c->stride;

        c->per_page = (uint32_t)(p->page_size / c->stride);
        c->mag_cap = fit < 2 ? 0 : fit > CACHE__MAG_MAX ? CACHE__MAG_MAX : (uint32_t)fit;
    }
    /* For the counts to refuse first: the budget's pages, one more for each
     * class (which may hold one page that it fills only partly, however
     * large the page is against the budget), all of it times the factor
     * (Accounting above). */
    if (cfg->arena_factor > 1) {
        npages = (cfg->capacity_bytes / p->page_size + p->nclasses) * cfg->arena_factor;
        if (npages >= CACHE__NONE) {
            rc = SLOTD_EINVAL;
            goto fail_classes;
        }
        p->npages = (uint32_t)npages;
        p->arena_bytes = npages * p->page_size;
    }
    p->tcaches = cache__calloc(CACHE__TCACHES, sizeof *p->tcaches);
    if (p->tcaches == NULL)
        goto fail_classes;
    p->tcaches[0].mags = cache__calloc((size_t)CACHE__TCACHES * p->nclasses, sizeof(cache__mag_t));
    if (p->tcaches[0].mags == NULL)
        goto fail_tcaches;
    for (uint32_t i = 0; i < CACHE__TCACHES; i++) {
        p->tcaches[i].mags = p->tcaches[0].mags + (size_t)i * p->nclasses;
        for (uint32_t ci = 0; ci < p->nclasses; ci++)
            atomic_init(&p->tcaches[i].mags[ci].n, 0);
    }

    /* Mapped rather than allocated: page-aligned (a slot's lines are its
     * own), zeroed, and in huge pages where the system offers them on
     * request (THP "madvise"), since every call reads a slot anywhere in a
     * table of 19 MiB for 100,000 slots, all of it written just below. */
    p->slots_bytes = (size_t)cfg->max_slots * sizeof *p->slots;
    p->slots = mmap(NULL, p->slots_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
                    0);
    if (p->slots == MAP_FAILED)
        goto fail_mags;
    (void)madvise(p->slots, p->slots_bytes, MADV_HUGEPAGE);
    for (uint32_t i = 0; i < p->max_slots; i++)
        p->slots[i].next_free = i + 1 < p->max_slots ? i + 1 : CACHE__NONE;
    p->free_slot = 0;

    /* Address space only: pages are backed as they are first written.
     * Mapped before the page table, whose size follows it, so that a budget
     * beyond the address space fails here. */
    arena = mmap(NULL, p->arena_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (arena == MAP_FAILED)
        goto fail_slots;
    p->arena = arena;

    p->pages = cache__calloc(npages, sizeof *p->pages);
    if (p->pages == NULL)
        goto fail_arena;
    for (uint32_t i = 0; i < p->npages; i++) {
        p->pages[i].cls = CACHE__NONE;
        p->pages[i].prev = CACHE__NONE;
        p->pages[i].next = i + 1 < p->npages ? i + 1 : CACHE__NONE;
    }
    p->free_page = 0;
    p->pages_free = p->npages;
    p->trim_epoch = 1;

    if (pthread_mutex_init(&p->lock, NULL) != 0)
        goto fail_pages;
    atomic_init(&p->entries, 0);
    p->serial = atomic_fetch_add(&cache__pool_serial, 1) + 1;
    *out = p;
    return SLOTD_OK;

fail_pages:
    free(p->pages);
fail_arena:
    munmap(p->arena, p->arena_bytes);
fail_slots:
    munmap(p->slots, p->slots_bytes);
fail_mags:
    free(p->tcaches[0].mags);
fail_tcaches:
    free(p->tcaches);
fail_classes:
    free(p->classes);
fail_models:
    free(p->models);
fail_pool:
    free(p);
    return rc;
}

void cache_pool_destroy(cache_pool_t *p)
{
    if (p == NULL)
        return;
    pthread_mutex_destroy(&p->lock);
    munmap(p->arena, p->arena_bytes);
    free(p->pages);
    munmap(p->slots, p->slots_bytes);
    free(p->tcaches[0].mags);
    free(p->tcaches);
    free(p->classes);
    free(p->models);
    free(p);
}

/* ---- The public calls ---- */

int cache_pool_acquire(cache_pool_t *p, const model_t *m, const cache_owner_t *owner,
                       cache_handle_t *h)
{
    const cache__model_t *md;
    cache__tcache_t *tc;
    cache__slot_t *s;
    uint32_t si;
    int mi;
    int rc = SLOTD_OK;

    if (p == NULL || owner == NULL || h == NULL || (mi = cache__model_index(p, m)) < 0)
        return SLOTD_EINVAL;
    md = &p->models[mi];

    pthread_mutex_lock(&p->lock);
    if (p->free_slot == CACHE__NONE) {
        rc = SLOTD_ECACHE_FULL;
        goto out;
    }
    tc = do_tcache_claim(p);
    if (md->state_bytes > 0 && (tc == NULL || do_mag_count(&tc->mags[md->state_cls]) == 0) &&
        (p->bytes_taken + md->state_bytes > p->capacity || !do_class_can(p, md->state_cls, 1))) {
        /* Not refused while a thread cache parks what would do. */
        do_steal_all(p);
        if (p->bytes_taken + md->state_bytes > p->capacity || !do_class_can(p, md->state_cls, 1)) {
            rc = SLOTD_ECACHE_FULL;
            goto out;
        }
    }
    si = p->free_slot;
    s = &p->slots[si];
    p->free_slot = s->next_free;
    s->next_free = CACHE__NONE;
    assert((atomic_load_explicit(&s->gen, memory_order_relaxed) & 1) == 0 && s->head == NULL &&
           s->state == NULL && s->entries == 0);
    s->model = (uint32_t)mi;
    if (md->state_bytes > 0) {
        s->state = tc != NULL ? cache__mag_pop(p, &tc->mags[md->state_cls], md->state_cls) : NULL;
        if (s->state == NULL) {
            s->state = do_obj_alloc(p, md->state_cls);
            p->bytes_taken += md->state_bytes;
        }
    }
    do_owner_set(s, owner);
    /* The tenancy begins: everything above is published with it. */
    h->gen = atomic_load_explicit(&s->gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&s->gen, h->gen, memory_order_release);
    p->live_slots++;
    h->slot = si;
out:
    do_unlock(p);
    return rc;
}

int cache_pool_reserve(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner, uint32_t n,
                       model_kv_t *kv)
{
    const cache__model_t *md;
    cache__tcache_t *tc;
    cache__slot_t *s;
    uint64_t want, room;
    uint32_t from;
    int rc = SLOTD_OK;

    if (p == NULL || owner == NULL || kv == NULL)
        return SLOTD_EINVAL;

    /* The fast paths: the room is already the slot's, or the blocks it
     * lacks are parked in this thread's cache; only the slot's user and
     * this thread's magazines are touched. */
    s = cache__slot_get_unlocked(p, h, owner);
    if (s != NULL) {
        md = &p->models[s->model];
        want = (uint64_t)s->entries + n;
        if (want <= md->max_ctx &&
            (want <= s->room ||
             ((tc = cache__tcache_mine(p)) != NULL && cache__reserve_parked(p, md, s, tc, want)))) {
            cache__prefetch(md, s);
            kv->head = s->head;
            kv->tail = s->tail;
            kv->len = s->entries;
            kv->state = s->state;
            return SLOTD_OK;
        }
    }

    pthread_mutex_lock(&p->lock);
    s = do_slot_get(p, h, owner);
    if (s == NULL) {
        rc = SLOTD_ESTALE;
        goto out;
    }
    md = &p->models[s->model];
    want = (uint64_t)s->entries + n;
    room = s->room;
    if (want > md->max_ctx) {
        /* The caller checks max_ctx first (SLOTD_ECONTEXT_FULL). */
        rc = SLOTD_EINVAL;
        goto out;
    }
    if (want > room) {
        uint64_t count[CACHE__MAX_CAPS] = {0}, bytes = 0;
        uint32_t need = 0;

        /* The blocks the chain's next indices hold, counted per capacity. */
        for (uint64_t r = room; r < want; need++) {
            uint32_t cap = model_block_capacity(md->m, s->nblocks + need);

            count[do_cap_index(md, cap)]++;
            bytes += p->classes[md->caps_cls[do_cap_index(md, cap)]].stride;
            r += cap;
        }
        tc = do_tcache_claim(p);
        if (!do_reserve_can(p, md, tc, count)) {
            /* Not refused while a thread cache parks what would do. */
            do_steal_all(p);
            if (!do_reserve_can(p, md, tc, count)) {
                rc = SLOTD_ECACHE_FULL;
                goto out;
            }
        }
        from = s->nblocks;
        for (uint32_t i = 0; i < need; i++) {
            uint32_t cap = model_block_capacity(md->m, s->nblocks);
            uint32_t ci = md->caps_cls[do_cap_index(md, cap)];
            model_block_t *b = tc != NULL ? cache__mag_pop(p, &tc->mags[ci], ci) : NULL;

            if (b == NULL) {
                b = do_obj_alloc(p, ci);
                p->bytes_taken += p->classes[ci].stride;
            }
            cache__slot_append(s, b, cap);
        }
        s->bytes += bytes;
        /* Park what the next reserves of this and other slots will want:
         * the classes of these blocks and of the block after them. */
        if (tc != NULL) {
            for (uint32_t i = from; i <= s->nblocks; i++) {
                uint32_t ci = md->caps_cls[do_cap_index(md, model_block_capacity(md->m, i))];

                if (p->classes[ci].mag_cap > 0)
                    do_mag_fill(p, &tc->mags[ci], ci);
            }
        }
    }
    kv->head = s->head;
    kv->tail = s->tail;
    kv->len = s->entries;
    kv->state = s->state;
out:
    do_unlock(p);
    return rc;
}

int cache_pool_commit(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner,
                      const model_kv_t *kv)
{
    cache__slot_t *s;
    model_block_t *b;
    uint32_t room;

    if (p == NULL || owner == NULL || kv == NULL)
        return SLOTD_EINVAL;

    /* No lock: a commit takes nothing from the pool and changes only the
     * slot's own (user) fields and the atomic entry total.  A handle that
     * does not match goes to the lock for the definitive answer. */
    s = cache__slot_get_unlocked(p, h, owner);
    if (s == NULL) {
        pthread_mutex_lock(&p->lock);
        s = do_slot_get(p, h, owner);
        do_unlock(p);
        if (s == NULL)
            return SLOTD_ESTALE;
        /* Matched under the lock: the same answer as without it, as only
         * the slot's user (the caller) acquires or releases it. */
    }
    /* The last block may reach past max_ctx; entries never do. */
    room = s->room < p->models[s->model].max_ctx ? s->room : p->models[s->model].max_ctx;
    assert(kv->len >= s->entries && "cache pool: commit shrinks the slot");
    assert(kv->len <= room && "cache pool: commit past the reserved room");
    if (kv->len < s->entries || kv->len > room)
        return SLOTD_EINVAL;
    /* Walk the tail forward over the blocks the new entries filled: at most
     * the blocks the last reserves took, so amortised O(1) per entry. */
    b = s->tail;
    while (b != NULL && kv->len - b->first >= b->capacity)
        b = b->next;
    assert(kv->len < s->room ? b != NULL : b == NULL);
    s->tail = b;
    atomic_fetch_add_explicit(&p->entries, kv->len - s->entries, memory_order_relaxed);
    s->entries = kv->len;
    return SLOTD_OK;
}

int cache_pool_release(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner,
                       uint32_t *entries)
{
    cache__slot_t *s;
    model_block_t *head;
    void *state;

    if (p == NULL || owner == NULL)
        return SLOTD_EINVAL;

    pthread_mutex_lock(&p->lock);
    s = do_slot_get(p, h, owner);
    if (s == NULL) {
        do_unlock(p);
        return SLOTD_ESTALE;
    }
    /* From here the handle is stale; the slot is on no free list until
     * do_slot_free(), so nobody can acquire it in between. */
    atomic_fetch_add_explicit(&s->gen, 1, memory_order_relaxed);
    if (entries != NULL)
        *entries = s->entries;
    head = s->head;
    state = s->state;
#if CACHE__DEBUG
    {
        const cache__model_t *md = &p->models[s->model];

        do_unlock(p);
        cache__poison_slot(p, md, head, state);
        pthread_mutex_lock(&p->lock);
    }
#endif
    do_slot_free(p, do_tcache_claim(p), (uint32_t)(s - p->slots), head, state);
    do_unlock(p);
    return SLOTD_OK;
}

uint64_t cache_pool_entries(const cache_pool_t *p)
{
    return atomic_load_explicit(&p->entries, memory_order_relaxed);
}

void cache_pool_room(const cache_pool_t *p, uint64_t *bytes_free, uint64_t *slots_free)
{
    uint64_t taken = atomic_load_explicit(&p->room_taken, memory_order_relaxed);
    uint64_t live = atomic_load_explicit(&p->room_live, memory_order_relaxed);

    *bytes_free = taken < p->capacity ? p->capacity - taken : 0;
    *slots_free = live < p->max_slots ? p->max_slots - live : 0;
}

void cache_pool_stats(cache_pool_t *p, cache_pool_stats_t *st)
{
    pthread_mutex_lock(&p->lock);
    /* Parked objects are free: with them back on their pages, bytes_taken
     * is what live slots hold, and stays so while the lock is held. */
    do_steal_all(p);
    st->entries = atomic_load_explicit(&p->entries, memory_order_relaxed);
    st->live_slots = p->live_slots;
    st->max_slots = p->max_slots;
    st->bytes_capacity = p->capacity;
    st->bytes_used = p->bytes_taken;
    st->bytes_free = p->capacity - p->bytes_taken;
    do_unlock(p);
}

/* Pages given back per hold of the lock in cache_pool_trim(). */
#define CACHE__TRIM_BATCH 32

/* Gives the kernel the memory of up to CACHE__TRIM_BATCH free pages freed
 * before epoch `before`, walking the free-page stack from *at (CACHE__NONE:
 * its top) and leaving the first `keep` held pages met (*seen so far: the
 * most recently freed) as they are; the lock is held.  *at is left where
 * the walk stopped.  Returns the pages given back.
 *
 * Between two calls the lock is let go, and the stack changes only at its
 * top, so a page still free is still on it and its `next` still leads down
 * the stack; a page taken meanwhile (no longer free) sends the walk back to
 * the top. */
static uint32_t do_trim_batch(cache_pool_t *p, uint32_t *at, uint32_t *seen, uint32_t keep,
                              uint32_t before)
{
    uint32_t done = 0, pi = *at;

    if (pi == CACHE__NONE || p->pages[pi].cls != CACHE__NONE)
        pi = p->free_page;
    for (; pi != CACHE__NONE && done < CACHE__TRIM_BATCH && p->pages_held > keep;
         pi = p->pages[pi].next) {
        cache__page_t *pg = &p->pages[pi];
        if (pg->freed == 0)
            continue;
        if (*seen < keep) {
            ++*seen;
            continue;
        }
        if (pg->freed >= before)
            continue;
        /* The whole system pages inside the pool page: the kernel frees
         * them now (RSS drops) and hands zeroed ones back on the next
         * write.  A failure leaves the page as it was, still counted. */
        uintptr_t sys = (uintptr_t)p->sys_page;
        uintptr_t b = (uintptr_t)(p->arena + (size_t)pi * p->page_size);
        uintptr_t e = b + p->page_size;
        b = (b + sys - 1) & ~(sys - 1);
        e &= ~(sys - 1);
        if (e > b && madvise((void *)b, e - b, MADV_DONTNEED) != 0)
            continue;
        pg->freed = 0;
        p->pages_held--;
        done++;
    }
    *at = pi;
    return done;
}

uint64_t cache_pool_trim(cache_pool_t *p, uint64_t keep_bytes)
{
    uint64_t keep = keep_bytes / p->page_size, pages = 0;
    uint32_t before, n, at = CACHE__NONE, seen = 0;

    pthread_mutex_lock(&p->lock);
    before = p->trim_epoch++;
    pthread_mutex_unlock(&p->lock);
    do {
        pthread_mutex_lock(&p->lock);
        n = do_trim_batch(p, &at, &seen, keep > UINT32_MAX ? UINT32_MAX : (uint32_t)keep, before);
        pthread_mutex_unlock(&p->lock);
        pages += n;
    } while (n == CACHE__TRIM_BATCH && at != CACHE__NONE);
    return pages * p->page_size;
}

uint64_t cache_pool_held_free_bytes(cache_pool_t *p)
{
    uint64_t n;

    pthread_mutex_lock(&p->lock);
    n = p->pages_held;
    pthread_mutex_unlock(&p->lock);
    return n * p->page_size;
}

/* ---- For the tests (pool_impl.h) ---- */

size_t cache__pool_page_size(cache_pool_t *p)
{
    return p->page_size;
}

uint32_t cache__pool_pages(cache_pool_t *p)
{
    return p->npages;
}

uint32_t cache__pool_pages_free(cache_pool_t *p)
{
    uint32_t n;

    pthread_mutex_lock(&p->lock);
    do_steal_all(p);
    n = p->pages_free;
    do_unlock(p);
    return n;
}

int64_t cache__pool_page_of(cache_pool_t *p, const void *obj)
{
    const unsigned char *b = obj;

    if (b < p->arena || b >= p->arena + p->arena_bytes)
        return -1;
    return (int64_t)((size_t)(b - p->arena) / p->page_size);
}

size_t cache__pool_page_stride(cache_pool_t *p, uint32_t page)
{
    size_t stride = 0;

    pthread_mutex_lock(&p->lock);
    do_steal_all(p);
    if (page < p->npages && p->pages[page].cls != CACHE__NONE)
        stride = p->classes[p->pages[page].cls].stride;
    do_unlock(p);
    return stride;
}

void cache__pool_debug_free(cache_pool_t *p, void *obj)
{
    size_t off = (size_t)((unsigned char *)obj - p->arena);
    size_t stride;

    pthread_mutex_lock(&p->lock);
    stride = p->classes[p->pages[off / p->page_size].cls].stride;
    do_unlock(p);
#if CACHE__DEBUG
    cache__poison(obj, stride, NULL);
#else
    (void)stride;
#endif
    pthread_mutex_lock(&p->lock);
    do_obj_free(p, obj);
    do_unlock(p);
}

#define CACHE__CHECK(cond, ...)                                                                    \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "cache__pool_check: " __VA_ARGS__);                                    \
            fputc('\n', stderr);                                                                   \
            bad++;                                                                                 \
        }                                                                                          \
    } while (0)

int cache__pool_check(cache_pool_t *p)
{
    uint64_t used = 0, entries = 0, live = 0, nfree_slots = 0, room, bytes;
    uint64_t *cls_free;
    uint32_t *cls_objs;
    uint32_t n;
    int bad = 0;

    cls_free = calloc(p->nclasses, sizeof *cls_free);
    cls_objs = calloc(p->npages > 0 ? p->npages : 1, sizeof *cls_objs);
    if (cls_free == NULL || cls_objs == NULL) {
        free(cls_free);
        free(cls_objs);
        return 1;
    }
    pthread_mutex_lock(&p->lock);

    /* Parked objects: each in the arena, carved, on a page of its class, and
     * (debug builds) still poisoned.  Then back to their pages, so that the
     * rest is checked as if there were no thread caches. */
    for (uint32_t i = 0; i < CACHE__TCACHES; i++) {
        const cache__tcache_t *tc = &p->tcaches[i];

        if (tc->thread == NULL)
            continue;
        for (uint32_t ci = 0; ci < p->nclasses; ci++) {
            uint32_t k = atomic_load(&tc->mags[ci].n);

            if (k == CACHE__STOLEN)
                continue;
            CACHE__CHECK(k <= p->classes[ci].mag_cap, "thread cache %u class %u holds %u", i, ci,
                         k);
            for (uint32_t j = 0; j < k && j < CACHE__MAG_MAX; j++) {
                const unsigned char *o = tc->mags[ci].obj[j];
                int64_t pg = cache__pool_page_of(p, o);
                size_t off;

                CACHE__CHECK(pg >= 0, "thread cache %u: object outside arena", i);
                if (pg < 0)
                    continue;
                off = (size_t)(o - p->arena) - (size_t)pg * p->page_size;
                CACHE__CHECK(p->pages[pg].cls == ci && off % p->classes[ci].stride == 0 &&
                                 off / p->classes[ci].stride < p->pages[pg].carved,
                             "thread cache %u class %u: object not of its class", i, ci);
#if CACHE__DEBUG
                CACHE__CHECK(cache__poison_intact(o, p->classes[ci].stride),
                             "thread cache %u class %u: parked object written", i, ci);
#endif
            }
        }
    }
    if (bad == 0)
        do_steal_all(p);

    for (uint32_t i = p->free_slot; i != CACHE__NONE; i = p->slots[i].next_free) {
        CACHE__CHECK((atomic_load(&p->slots[i].gen) & 1) == 0, "free slot %u is live", i);
        if (++nfree_slots > p->max_slots)
            break;
    }
    for (uint32_t i = 0; i < p->max_slots; i++) {
        const cache__slot_t *s = &p->slots[i];
        const cache__model_t *md;
        const model_block_t *b, *last = NULL, *tail = NULL;

        if ((atomic_load(&s->gen) & 1) == 0) {
            CACHE__CHECK(s->head == NULL && s->state == NULL && s->entries == 0,
                         "free slot %u holds memory", i);
            continue;
        }
        live++;
        md = &p->models[s->model];
        n = 0;
        room = 0;
        bytes = 0;
        for (b = s->head; b != NULL && n <= s->nblocks; b = b->next) {
            int64_t pg = cache__pool_page_of(p, b);
            size_t stride = cache__round_up(model_block_bytes_for(md->m, b->capacity), CACHE__ALIGN);

            CACHE__CHECK(pg >= 0, "slot %u block outside arena", i);
            CACHE__CHECK(b->capacity == model_block_capacity(md->m, n),
                         "slot %u block %u capacity %u", i, n, b->capacity);
            CACHE__CHECK(b->first == room, "slot %u block %u first %u, room before %llu", i, n,
                         b->first, (unsigned long long)room);
            CACHE__CHECK(pg < 0 || (p->pages[pg].cls != CACHE__NONE &&
                                    p->classes[p->pages[pg].cls].stride == stride),
                         "slot %u block %u on a page of another class", i, n);
            CACHE__CHECK(n >= CACHE__SLOT_BLOCKS || s->blocks[n] == b,
                         "slot %u block %u not named in blocks[]", i, n);
            if (s->entries >= room && s->entries - room < b->capacity)
                tail = b;
            room += b->capacity;
            bytes += stride;
            last = b;
            n++;
        }
        CACHE__CHECK(n == s->nblocks, "slot %u chain has %u blocks, nblocks %u", i, n, s->nblocks);
        CACHE__CHECK(room == s->room, "slot %u room %u, counted %llu", i, s->room,
                     (unsigned long long)room);
        CACHE__CHECK(bytes == s->bytes, "slot %u bytes", i);
        CACHE__CHECK(last == s->last, "slot %u last", i);
        CACHE__CHECK(tail == s->tail, "slot %u tail", i);
        CACHE__CHECK(s->entries <= s->room, "slot %u entries past room", i);
        CACHE__CHECK((s->state != NULL) == (md->state_bytes > 0), "slot %u state", i);
        used += s->bytes + (s->state != NULL ? md->state_bytes : 0);
        entries += s->entries;
    }
    CACHE__CHECK(live == p->live_slots, "live %llu, counted %llu",
                 (unsigned long long)p->live_slots, (unsigned long long)live);
    CACHE__CHECK(live + nfree_slots == p->max_slots, "slots lost: %llu live, %llu free",
                 (unsigned long long)live, (unsigned long long)nfree_slots);
    CACHE__CHECK(p->bytes_taken <= p->capacity, "bytes_taken %llu past capacity %llu",
                 (unsigned long long)p->bytes_taken, (unsigned long long)p->capacity);
    CACHE__CHECK(used == p->bytes_taken, "bytes_taken %llu, counted %llu",
                 (unsigned long long)p->bytes_taken, (unsigned long long)used);
    CACHE__CHECK(used <= p->capacity, "used past capacity");
    CACHE__CHECK(entries == atomic_load(&p->entries), "entries %llu, counted %llu",
                 (unsigned long long)atomic_load(&p->entries), (unsigned long long)entries);

    n = 0;
    uint32_t held = 0;
    for (uint32_t i = p->free_page; i != CACHE__NONE && n <= p->npages; i = p->pages[i].next) {
        CACHE__CHECK(p->pages[i].cls == CACHE__NONE, "free page %u has class", i);
        CACHE__CHECK(p->pages[i].freed <= p->trim_epoch, "free page %u freed in the future", i);
        held += p->pages[i].freed != 0;
        n++;
    }
    CACHE__CHECK(n == p->pages_free, "free pages %u, counted %u", p->pages_free, n);
    CACHE__CHECK(held == p->pages_held, "held free pages %u, counted %u", p->pages_held, held);
    for (uint32_t i = 0; i < p->npages; i++) {
        const cache__page_t *pg = &p->pages[i];
        uint32_t listed = 0;

        if (pg->cls == CACHE__NONE)
            continue;
        CACHE__CHECK(pg->cls < p->nclasses, "page %u class", i);
        CACHE__CHECK(pg->nfree < p->classes[pg->cls].per_page, "page %u empty but assigned", i);
        for (const void *o = pg->free; o != NULL && listed <= pg->nfree; o = cache__link_get(o))
            listed++;
        CACHE__CHECK(listed + (p->classes[pg->cls].per_page - pg->carved) == pg->nfree,
                     "page %u free list %u + uncarved %u != nfree %u", i, listed,
                     p->classes[pg->cls].per_page - pg->carved, pg->nfree);
        cls_free[pg->cls] += pg->nfree;
    }
    for (uint32_t c = 0; c < p->nclasses; c++) {
        uint32_t prev = CACHE__NONE;

        CACHE__CHECK(cls_free[c] == p->classes[c].nfree, "class %u nfree %llu, counted %llu", c,
                     (unsigned long long)p->classes[c].nfree, (unsigned long long)cls_free[c]);
        n = 0;
        for (uint32_t i = p->classes[c].partial; i != CACHE__NONE && n <= p->npages;
             i = p->pages[i].next) {
            CACHE__CHECK(p->pages[i].cls == c && p->pages[i].nfree > 0, "partial page %u", i);
            CACHE__CHECK(p->pages[i].prev == prev, "partial page %u prev", i);
            cls_objs[i] = 1;
            prev = i;
            n++;
        }
    }
    for (uint32_t i = 0; i < p->npages; i++) {
        const cache__page_t *pg = &p->pages[i];
        bool partial = pg->cls != CACHE__NONE && pg->nfree > 0;

        CACHE__CHECK(partial == (cls_objs[i] == 1), "page %u partial-list membership", i);
    }

    do_unlock(p);
    free(cls_free);
    free(cls_objs);
    return bad;
}
