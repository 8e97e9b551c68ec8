/*
 * tcache.c: the per-thread caches of free objects (magazines) and the
 * stealing that keeps them invisible.  Owns the pool's thread caches (one
 * per calling thread, up to CACHE__TCACHES, allocated at creation, freed by
 * cache_pool_destroy()), each thread's record of its cache, and the rule
 * that a parked object is free: every refusal, snapshot and new page of a
 * class first takes parked objects back (cache__do_steal_all(), and the
 * class's own steal in cache__do_obj_alloc()).
 *
 * Threads and lock.  Any thread, on its own cache: a release parks objects
 * and a locked reserve tops magazines up, both under p->lock; a lock-free
 * reserve pops from its own magazines (cache__take_parked()); any lock
 * holder may steal any thread's magazines.  The pop and the steal meet only
 * on a magazine's atomic count (cache__mag_t, pool_int.h).  Every
 * cache__do_ function assumes p->lock is held.
 *
 * Calls slab.c; called by pool.c, create.c and check.c.
 *
 * Design: docs/design.md, "The allocator and per-thread caches"
 * (Per-thread caches, What the caches must not change).
 */
#include "cache/pool_int.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

/* Pools are numbered so that a thread's record of its cache never names a
 * destroyed pool whose memory a new pool happens to reuse. */
static _Atomic uint64_t cache__pool_serial;

/* The calling thread's cache in the pool it used last: `pool` is that
 * pool's serial (0: none yet), `tc` its cache there, or NULL if the pool
 * had none left to give.  Only this thread reads or writes it. */
static _Thread_local struct cache__tls {
    uint64_t pool;
    cache__tcache_t *tc;
} cache__tls;

/* Gives each class its magazine size and the pool its thread caches and
 * serial; the classes are sized (cache__slab_init()). */
int cache__tcache_init(cache_pool_t *p)
{
    for (uint32_t i = 0; i < p->nclasses; i++) {
        cache__class_t *c = &p->classes[i];
        size_t fit = CACHE__MAG_BYTES / c->stride;

        /* States are not parked: acquire holds the lock anyway. */
        c->mag_cap = !c->blocks || fit < 2  ? 0
                     : fit > CACHE__MAG_MAX ? CACHE__MAG_MAX
                                            : (uint32_t)fit;
    }
    p->tcaches = cache__calloc(CACHE__TCACHES, sizeof *p->tcaches);
    if (p->tcaches == NULL)
        return SLOTD_ENOMEM;
    p->tcaches[0].mags = cache__calloc((size_t)CACHE__TCACHES * p->nclasses, sizeof(cache__mag_t));
    if (p->tcaches[0].mags == NULL) {
        free(p->tcaches);
        return SLOTD_ENOMEM;
    }
    for (uint32_t i = 0; i < CACHE__TCACHES; i++) {
        p->tcaches[i].mags = p->tcaches[0].mags + (size_t)i * p->nclasses;
        for (uint32_t ci = 0; ci < p->nclasses; ci++)
            atomic_init(&p->tcaches[i].mags[ci].n, 0);
    }
    p->serial = atomic_fetch_add(&cache__pool_serial, 1) + 1;
    return SLOTD_OK;
}

void cache__tcache_fini(cache_pool_t *p)
{
    free(p->tcaches[0].mags);
    free(p->tcaches);
}

/* The calling thread's cache in `p`, if it has claimed one; no lock.  NULL
 * sends the caller to the lock (cache__do_tcache_claim()). */
cache__tcache_t *cache__tcache_mine(const cache_pool_t *p)
{
    return cache__tls.pool == p->serial ? cache__tls.tc : NULL;
}

/* The calling thread's cache in `p`, claimed now if it has none and one is
 * left; NULL if none is. */
cache__tcache_t *cache__do_tcache_claim(cache_pool_t *p)
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
uint32_t cache__do_mag_count(cache__mag_t *m)
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
    uint32_t k = cache__do_mag_count(m);

    if (k >= p->classes[ci].mag_cap)
        return false;
    m->obj[k] = obj;
    atomic_store_explicit(&m->n, k + 1, memory_order_relaxed);
    return true;
}

/* Takes the last object of the owner's magazine, or NULL if it is empty
 * or being stolen; with or without the lock.  The object's first two words
 * are zeroed, as cache__do_obj_alloc() does. */
void *cache__mag_pop(cache_pool_t *p, cache__mag_t *m, uint32_t ci)
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
 * marks it stolen for its owner to reset. */
static void do_steal_mag(cache_pool_t *p, cache__mag_t *m, uint32_t ci)
{
    uint32_t k = atomic_exchange_explicit(&m->n, CACHE__STOLEN, memory_order_acq_rel);

    if (k == CACHE__STOLEN)
        return;
    for (uint32_t j = 0; j < k; j++)
        cache__do_obj_free(p, m->obj[j]);
    p->bytes_taken -= (uint64_t)k * p->classes[ci].stride;
}

/* Hands every object parked in every thread cache back to its page.  After
 * it, with the lock still held, bytes_taken is what live slots hold and
 * the pages are as if there were no thread caches: a lock holder calls it
 * before refusing anything, so that a parked object never makes a request
 * fail, and before reporting figures, so that they are exact. */
void cache__do_steal_all(cache_pool_t *p)
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

/* Takes back every thread's parked objects of class `ci`. */
static void do_steal_class(cache_pool_t *p, uint32_t ci)
{
    for (uint32_t i = 0; i < CACHE__TCACHES; i++) {
        cache__mag_t *m = &p->tcaches[i].mags[ci];

        /* Only the owner adds to its magazine, under the lock we hold: an
         * empty one stays empty, and is left unmarked. */
        if (p->tcaches[i].thread != NULL && atomic_load_explicit(&m->n, memory_order_relaxed) != 0)
            do_steal_mag(p, m, ci);
    }
}

/* Takes one object of class `ci` for a slot (the caller has checked
 * cache__do_class_can()), its first two words zeroed (a block's `next` and
 * the debug magic).  Objects of the class parked in threads' caches are
 * taken back before a page is given to the class: otherwise the new page
 * would stay split off while those holes sit parked, and a later request
 * of another class could be refused where a pool without caches has a free
 * page (tests/test_cache.c, test_parked_blocks_keep_pages_whole). */
void *cache__do_obj_alloc(cache_pool_t *p, uint32_t ci)
{
    bool fresh;
    void *obj;

    if (LIST_EMPTY(&p->classes[ci].partial) && p->classes[ci].mag_cap > 0)
        do_steal_class(p, ci);
    obj = cache__do_obj_take(p, ci, &fresh);
    memset(obj, 0, 16);
    return obj;
}

/* Tops the owner's magazine of class `ci` up from the class's partial
 * pages, never assigning a page to the class for it (so that parking
 * changes which pages a class holds as little as possible), and never past
 * the budget: a parked object counts as taken, and a lock-free reserve
 * takes it without another look at the bytes. */
void cache__do_mag_fill(cache_pool_t *p, cache__mag_t *m, uint32_t ci)
{
    cache__class_t *c = &p->classes[ci];

    while (!LIST_EMPTY(&c->partial) && cache__do_mag_count(m) < c->mag_cap &&
           p->bytes_taken + c->stride <= p->capacity) {
        bool fresh;
        void *obj = cache__do_obj_take(p, ci, &fresh);

#if CACHE__DEBUG
        /* A parked object looks like a freed one: the pop checks its poison. */
        if (fresh)
            cache__poison_fresh(obj, c->stride);
#else
        (void)fresh;
#endif
        (void)do_mag_push(p, m, ci, obj);
        p->bytes_taken += c->stride;
    }
}

/* Gives back an object of a released slot: parked in thread cache `tc`
 * (may be NULL) if its class's magazine has room, else to its page. */
void cache__do_obj_give(cache_pool_t *p, cache__tcache_t *tc, void *obj)
{
    uint32_t ci = cache__page_at(p, obj)->cls;

    assert(ci < p->nclasses && "cache pool: object on a free page");
    if (tc != NULL && do_mag_push(p, &tc->mags[ci], ci, obj))
        return;
    cache__do_obj_free(p, obj);
    assert(p->bytes_taken >= p->classes[ci].stride);
    p->bytes_taken -= p->classes[ci].stride;
}

/* Pops `need` objects of classes cls[0 .. need-1] from the caller's own
 * cache `tc` into got[], without the lock: true if they were all parked
 * there, else false with nothing taken.  A steal between the count and the
 * pops is the one way a pop fails; the objects popped before it are then
 * parked again under the lock. */
bool cache__take_parked(cache_pool_t *p, cache__tcache_t *tc, const uint32_t *cls, uint32_t need,
                        model_block_t **got)
{
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
        if (got[i] != NULL)
            continue;
        pthread_mutex_lock(&p->lock);
        for (uint32_t j = 0; j < i; j++) {
#if CACHE__DEBUG
            /* Popped objects are zeroed at the head: poison them again. */
            cache__poison_fresh(got[j], p->classes[cls[j]].stride);
#endif
            if (!do_mag_push(p, &tc->mags[cls[j]], cls[j], got[j])) {
                cache__do_obj_free(p, got[j]);
                p->bytes_taken -= p->classes[cls[j]].stride;
            }
        }
        cache__unlock(p);
        return false;
    }
    return true;
}
