/*
 * check.c: what the cache tests see of the pool's insides (pool_check_int.h):
 * its pages, the page an object lives on, a second free on demand, and the
 * checker that walks every table and list and counts broken invariants
 * (shared blocks' holder counts and the prefix cache's included; the
 * checker's sorted list of blocks is malloc'd and freed by it).
 * Nothing in the daemon calls it.
 *
 * Threads and lock.  Any thread; each call takes p->lock for its whole
 * walk (the checker: O(slots + pages + blocks + parked objects)), and
 * those that look at pages first take every parked object back, so that
 * the pages look as they would without thread caches.
 *
 * Calls tcache.c (the steal) and slab.c (a free, the poison); nothing
 * calls back.
 *
 * Design: docs/design.md, "How the cached path is checked" and "The
 * allocator and per-thread caches".
 */
#include "cache/pool_int.h"

#include <stdio.h>
#include <stdlib.h>

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
    cache__do_steal_all(p);
    n = p->pages_free;
    cache__unlock(p);
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
    cache__do_steal_all(p);
    if (page < p->npages && p->pages[page].cls != CACHE__NONE)
        stride = p->classes[p->pages[page].cls].stride;
    cache__unlock(p);
    return stride;
}

void cache__pool_debug_free(cache_pool_t *p, void *obj)
{
    size_t off = (size_t)((unsigned char *)obj - p->arena);
    size_t stride;

    pthread_mutex_lock(&p->lock);
    stride = p->classes[p->pages[off / p->page_size].cls].stride;
    cache__unlock(p);
#if CACHE__DEBUG
    cache__poison(obj, stride, NULL);
#else
    (void)stride;
#endif
    pthread_mutex_lock(&p->lock);
    cache__do_obj_free(p, obj);
    cache__unlock(p);
}

#define CACHE__CHECK(cond, ...)                                                                    \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "cache__pool_check: " __VA_ARGS__);                                    \
            fputc('\n', stderr);                                                                   \
            bad++;                                                                                 \
        }                                                                                          \
    } while (0)

/* A block of a live slot's chain as the checker saw it: each occurrence
 * once, sorted by address so that a block's occurrences sit together. */
typedef struct cache__seen {
    const model_block_t *b;
    uint64_t stride;
} cache__seen_t;

static int cache__seen_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const cache__seen_t *)a)->b;
    uintptr_t y = (uintptr_t)((const cache__seen_t *)b)->b;

    return x < y ? -1 : x > y;
}

int cache__pool_check(cache_pool_t *p)
{
    uint64_t used = 0, entries = 0, live = 0, nfree_slots = 0, room, bytes;
    cache__seen_t *seen = NULL;
    size_t nseen = 0, seen_cap = 0;
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
        cache__do_steal_all(p);

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
        CACHE__CHECK(s->nblocks <= p->table_len, "slot %u has %u blocks, tables hold %u", i,
                     s->nblocks, p->table_len);
        for (; n < s->nblocks && n < p->table_len; n++) {
            int64_t pg;
            size_t stride;

            b = cache__table(p, i)[n];
            pg = cache__pool_page_of(p, b);
            stride = cache__round_up(model_block_bytes_for(md->m, b->capacity), CACHE__ALIGN);
            /* A shared block holds only entries the slot has; the tail's
             * positions from `entries` on are written only when it is the
             * slot's own. */
            CACHE__CHECK(cache__holders(b) >= 1, "slot %u block %u has no holder", i, n);
            CACHE__CHECK(cache__holders(b) == 1 || b->first < s->entries,
                         "slot %u block %u shared past its entries", i, n);
            if (nseen == seen_cap) {
                size_t cap = seen_cap != 0 ? 2 * seen_cap : 256;
                cache__seen_t *more = realloc(seen, cap * sizeof *more);

                if (more == NULL) {
                    bad++;
                    break;
                }
                seen = more;
                seen_cap = cap;
            }
            seen[nseen].b = b;
            seen[nseen++].stride = stride;
            CACHE__CHECK(pg >= 0, "slot %u block outside arena", i);
            CACHE__CHECK(n == 0 || b != cache__table(p, i)[n - 1], "slot %u block %u twice", i,
                         n);
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
        }
        CACHE__CHECK(s->head == (s->nblocks > 0 ? cache__table(p, i)[0] : NULL), "slot %u head",
                     i);
        CACHE__CHECK(n == s->nblocks, "slot %u chain has %u blocks, nblocks %u", i, n, s->nblocks);
        CACHE__CHECK(room == s->room, "slot %u room %u, counted %llu", i, s->room,
                     (unsigned long long)room);
        CACHE__CHECK(bytes == s->bytes, "slot %u bytes", i);
        CACHE__CHECK(last == s->last, "slot %u last", i);
        CACHE__CHECK(tail == s->tail, "slot %u tail", i);
        CACHE__CHECK(s->entries <= s->room, "slot %u entries past room", i);
        CACHE__CHECK((s->state != NULL) == (md->state_bytes > 0), "slot %u state", i);
        used += s->state != NULL ? md->state_bytes : 0;
        entries += s->entries;
    }
    /* Each block once in the bytes, and as many holders as chains hold it. */
    if (nseen > 0)
        qsort(seen, nseen, sizeof *seen, cache__seen_cmp);
    {
        uint64_t shared = 0;

        for (size_t k = 0; k < nseen;) {
            size_t run = 1;

            while (k + run < nseen && seen[k + run].b == seen[k].b)
                run++;
            /* The prefix cache holds a block it keeps, besides the slots. */
            size_t cached = cache__prefix_node_of(p, seen[k].b) != NULL;

            CACHE__CHECK(cache__holders(seen[k].b) == run + cached,
                         "block %p counts %llu holders, %zu chains and %zu cache hold it",
                         (const void *)seen[k].b, (unsigned long long)cache__holders(seen[k].b),
                         run, cached);
            used += seen[k].stride;
            shared += run + cached > 1;
            k += run;
        }
        /* Blocks only the cache holds: on its LRU list, and taken. */
        {
            uint64_t lru_bytes = 0, on_lru = 0;

            bad += cache__prefix_check(p, &lru_bytes, &on_lru);
            used += lru_bytes;
        }
        CACHE__CHECK(shared == p->shared_blocks, "shared blocks %llu, counted %llu",
                     (unsigned long long)p->shared_blocks, (unsigned long long)shared);
    }
    free(seen);
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
    const cache__page_t *pg;
    LIST_FOREACH(pg, &p->free_pages, link)
    {
        uint32_t i = cache__page_index(p, pg);

        CACHE__CHECK(pg->cls == CACHE__NONE, "free page %u has class", i);
        CACHE__CHECK(pg->freed <= p->trim_epoch, "free page %u freed in the future", i);
        CACHE__CHECK(*pg->link.le_prev == pg, "free page %u link", i);
        held += pg->freed != 0;
        if (++n > p->npages)
            break;
    }
    CACHE__CHECK(n == p->pages_free, "free pages %u, counted %u", p->pages_free, n);
    CACHE__CHECK(held == p->pages_held, "held free pages %u, counted %u", p->pages_held, held);
    for (uint32_t i = 0; i < p->npages; i++) {
        uint32_t listed = 0;

        pg = &p->pages[i];

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
        CACHE__CHECK(cls_free[c] == p->classes[c].nfree, "class %u nfree %llu, counted %llu", c,
                     (unsigned long long)p->classes[c].nfree, (unsigned long long)cls_free[c]);
        n = 0;
        LIST_FOREACH(pg, &p->classes[c].partial, link)
        {
            uint32_t i = cache__page_index(p, pg);

            CACHE__CHECK(pg->cls == c && pg->nfree > 0, "partial page %u", i);
            CACHE__CHECK(*pg->link.le_prev == pg, "partial page %u link", i);
            cls_objs[i] = 1;
            if (++n > p->npages)
                break;
        }
    }
    for (uint32_t i = 0; i < p->npages; i++) {
        bool partial = p->pages[i].cls != CACHE__NONE && p->pages[i].nfree > 0;

        CACHE__CHECK(partial == (cls_objs[i] == 1), "page %u partial-list membership", i);
    }

    cache__unlock(p);
    free(cls_free);
    free(cls_objs);
    return bad;
}
