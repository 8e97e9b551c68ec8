/*
 * slab.c: the pool's arena, the pages that carve it and the size classes
 * that the pages serve.  Owns the arena mapping, the page descriptors, the
 * class table, the free-page stack, the objects' free lists and their
 * debug poison, and the giving back of free pages' memory to the kernel
 * (cache_pool_trim()).  It knows nothing of slots or thread caches: it
 * hands out and takes back objects of a class, and says whether a class
 * can supply some.
 *
 * Threads and lock.  Any thread.  Every cache__do_ function assumes
 * p->lock is held; cache_pool_trim() and cache_pool_held_free_bytes() take
 * it.  The poison helpers run without it, on objects the caller alone can
 * reach.  Calls nothing else of the pool (pool_int.h).
 *
 * The one place that chooses the page size is cache__slab_page_size(): a
 * page size per class would start there.
 *
 * Design: docs/design.md, "The pool" (Arena, Pages, Pages back to the
 * kernel) and "The allocator and per-thread caches" (Size classes,
 * Carving, Accounting, Generations and poison).
 */
#include "cache/pool_int.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void *(*cache__calloc)(size_t, size_t) = calloc;

void cache__pool_set_calloc(void *(*fn)(size_t, size_t))
{
    cache__calloc = fn != NULL ? fn : calloc;
}

#if CACHE__DEBUG
static uint64_t cache__magic_get(const void *obj)
{
    uint64_t magic;
    memcpy(&magic, (const unsigned char *)obj + 8, sizeof magic);
    return magic;
}

/* Poisons an object that was never handed out, so that it looks freed. */
void cache__poison_fresh(void *obj, size_t stride)
{
    const uint64_t magic = CACHE__FREE_MAGIC;

    memset(obj, CACHE__POISON, stride);
    memcpy((unsigned char *)obj + 8, &magic, sizeof magic);
}

/* Poisons a detached object, keeping `link` in its first word.  Runs
 * without the lock: the caller holds the only reference to `obj`. */
void cache__poison(void *obj, size_t stride, void *link)
{
    /* The magic of a first free is still there at a second one. */
    assert(cache__magic_get(obj) != CACHE__FREE_MAGIC && "cache pool: object freed twice");
    cache__poison_fresh(obj, stride);
    cache__link_set(obj, link);
}

/* A free object about to be handed out still carries its magic and its
 * poison (the first and last cache lines are checked): if not, someone
 * wrote to it after releasing it. */
bool cache__poison_intact(const void *obj, size_t stride)
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

/* ---- Creation ---- */

/* The page unit of model `m`: for each block capacity c its chains use,
 * ceil(largest / c) blocks of c positions at their stride; the largest of
 * these.  A page that is a multiple of it holds, of every capacity c, as
 * many blocks as one largest block has positions / c, less at most their
 * headers' rounding (docs/design.md, "The pool", Pages). */
static size_t cache__page_unit(const model_t *m)
{
    uint32_t nb = model_chain_blocks(m, model_max_ctx(m), 1, NULL), big = model_block_positions(m);
    size_t unit = 0;

    for (uint32_t b = 0; b < nb; b++) {
        uint32_t cap = model_block_capacity(m, b);
        size_t u =
            cache__round_up(model_block_bytes_for(m, cap), CACHE__ALIGN) * ((big + cap - 1) / cap);
        if (u > unit)
            unit = u;
    }
    return unit;
}

/* The one page size of a pool serving `models`: the smallest multiple of
 * the largest page unit or state stride that reaches CACHE__PAGE_MIN.
 * Every class's pages have this size; 0 for a model the pool cannot hold
 * (no blocks, or a first block too small for its header). */
size_t cache__slab_page_size(const model_t *const *models, size_t nmodels)
{
    size_t unit_max = 0;

    for (size_t i = 0; i < nmodels; i++) {
        const model_t *m = models[i];
        size_t unit, state;

        if (m == NULL || model_block_positions(m) == 0 ||
            model_block_bytes_for(m, model_block_capacity(m, 0)) < sizeof(model_block_t) + 8)
            return 0;
        unit = cache__page_unit(m);
        state = cache__round_up(model_state_size(m), CACHE__ALIGN);
        if (unit > unit_max)
            unit_max = unit;
        if (state > unit_max)
            unit_max = state;
    }
    return unit_max * ((CACHE__PAGE_MIN + unit_max - 1) / unit_max);
}

uint32_t cache__slab_class_for(cache_pool_t *p, size_t size)
{
    size_t stride = cache__round_up(size, CACHE__ALIGN);

    for (uint32_t i = 0; i < p->nclasses; i++)
        if (p->classes[i].stride == stride)
            return i;
    p->classes[p->nclasses].stride = stride;
    LIST_INIT(&p->classes[p->nclasses].partial);
    return p->nclasses++;
}

/* p->page_size, the classes' strides and the budget are set; maps an arena
 * of `npages` pages (address space only: pages are backed as they are
 * first written) and lays its pages on the free-page stack, page 0 on top.
 * The arena is mapped before the page table, whose size follows it, so that
 * a budget beyond the address space fails here. */
int cache__slab_init(cache_pool_t *p, size_t npages)
{
    long sys_page = sysconf(_SC_PAGESIZE);
    void *arena;

    if (npages >= CACHE__NONE)
        return SLOTD_EINVAL;
    p->sys_page = sys_page > 0 ? (size_t)sys_page : 4096;
    p->npages = (uint32_t)npages;
    p->arena_bytes = npages * p->page_size;
    for (uint32_t i = 0; i < p->nclasses; i++)
        p->classes[i].per_page = (uint32_t)(p->page_size / p->classes[i].stride);

    arena = mmap(NULL, p->arena_bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (arena == MAP_FAILED)
        return SLOTD_ENOMEM;
    p->arena = arena;
    p->pages = cache__calloc(npages, sizeof *p->pages);
    if (p->pages == NULL) {
        munmap(p->arena, p->arena_bytes);
        return SLOTD_ENOMEM;
    }
    LIST_INIT(&p->free_pages);
    for (uint32_t i = p->npages; i-- > 0;) {
        p->pages[i].cls = CACHE__NONE;
        LIST_INSERT_HEAD(&p->free_pages, &p->pages[i], link);
    }
    p->pages_free = p->npages;
    p->trim_epoch = 1;
    return SLOTD_OK;
}

void cache__slab_fini(cache_pool_t *p)
{
    munmap(p->arena, p->arena_bytes);
    free(p->pages);
}

/* ---- Pages and objects: p->lock held ---- */

/* Whether class `ci` can hand out `n` objects right now. */
bool cache__do_class_can(const cache_pool_t *p, uint32_t ci, uint64_t n)
{
    const cache__class_t *c = &p->classes[ci];

    return n <= c->nfree + (uint64_t)p->pages_free * c->per_page;
}

/* Whether the classes of model `md` can hand out count[k] objects of
 * capacity md->caps[k], all at once: the free pages that classes short of
 * free objects need are counted together, as they compete for them. */
bool cache__do_classes_can(const cache_pool_t *p, const cache__model_t *md, const uint64_t *count)
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

/* Takes one object of class `ci`, from a partial page, or from a free page
 * given to the class now; the caller has checked cache__do_class_can().
 * The object is left as the last user or the poison left it; *fresh says
 * whether it was never handed out since its page was assigned (then it
 * carries no poison). */
void *cache__do_obj_take(cache_pool_t *p, uint32_t ci, bool *fresh)
{
    cache__class_t *c = &p->classes[ci];
    cache__page_t *pg = LIST_FIRST(&c->partial);
    unsigned char *obj;

    if (pg == NULL) {
        pg = LIST_FIRST(&p->free_pages);
        assert(pg != NULL && "cache pool: cache__do_class_can() not checked");
        LIST_REMOVE(pg, link);
        p->pages_free--;
        if (pg->freed != 0)
            p->pages_held--;
        pg->freed = 0;
        pg->cls = ci;
        pg->nfree = c->per_page;
        pg->carved = 0;
        pg->free = NULL;
        c->nfree += c->per_page;
        LIST_INSERT_HEAD(&c->partial, pg, link);
    }
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
        obj = p->arena + (size_t)cache__page_index(p, pg) * p->page_size +
              (size_t)pg->carved * c->stride;
        pg->carved++;
        *fresh = true;
    }
    pg->nfree--;
    c->nfree--;
    if (pg->nfree == 0)
        LIST_REMOVE(pg, link);
    return obj;
}

/* Gives an object back to its page, and the page back to the free-page
 * stack if that was its last object in use. */
void cache__do_obj_free(cache_pool_t *p, void *obj)
{
    size_t off = (size_t)((unsigned char *)obj - p->arena);
    cache__page_t *pg = cache__page_at(p, obj);
    size_t in_page = off - (size_t)cache__page_index(p, pg) * p->page_size;
    cache__class_t *c;

    assert((unsigned char *)obj >= p->arena && off < p->arena_bytes);
    assert(pg->cls < p->nclasses && "cache pool: object on a free page");
    c = &p->classes[pg->cls];
    assert(in_page % c->stride == 0 && in_page / c->stride < pg->carved);
    (void)in_page;
#if CACHE__DEBUG
    assert(cache__magic_get(obj) == CACHE__FREE_MAGIC && "cache pool: freed unpoisoned");
#endif
    cache__link_set(obj, pg->free);
    pg->free = obj;
    if (pg->nfree == 0)
        LIST_INSERT_HEAD(&c->partial, pg, link);
    pg->nfree++;
    c->nfree++;
    if (pg->nfree == c->per_page) {
        LIST_REMOVE(pg, link);
        c->nfree -= c->per_page;
        pg->cls = CACHE__NONE;
        pg->free = NULL;
        LIST_INSERT_HEAD(&p->free_pages, pg, link);
        p->pages_free++;
        pg->freed = p->trim_epoch;
        p->pages_held++;
    }
}

/* ---- Pages back to the kernel ---- */

/* Pages given back per hold of the lock in cache_pool_trim(). */
#define CACHE__TRIM_BATCH 32

/* Gives the kernel the memory of up to CACHE__TRIM_BATCH free pages freed
 * before epoch `before`, walking the free-page stack from *at (NULL: its
 * top) and leaving the first `keep` held pages met (*seen so far: the most
 * recently freed) as they are; the lock is held.  *at is left where the
 * walk stopped.  Returns the pages given back.
 *
 * Between two calls the lock is let go, and the stack changes only at its
 * top, so a page still free is still on it and its link still leads down
 * the stack; a page taken meanwhile (no longer free) sends the walk back to
 * the top. */
static uint32_t do_trim_batch(cache_pool_t *p, cache__page_t **at, uint32_t *seen, uint32_t keep,
                              uint32_t before)
{
    uint32_t done = 0;
    cache__page_t *pg = *at;

    if (pg == NULL || pg->cls != CACHE__NONE)
        pg = LIST_FIRST(&p->free_pages);
    for (; pg != NULL && done < CACHE__TRIM_BATCH && p->pages_held > keep;
         pg = LIST_NEXT(pg, link)) {
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
        uintptr_t b = (uintptr_t)(p->arena + (size_t)cache__page_index(p, pg) * p->page_size);
        uintptr_t e = b + p->page_size;
        b = (b + sys - 1) & ~(sys - 1);
        e &= ~(sys - 1);
        if (e > b && madvise((void *)b, e - b, MADV_DONTNEED) != 0)
            continue;
        pg->freed = 0;
        p->pages_held--;
        done++;
    }
    *at = pg;
    return done;
}

uint64_t cache_pool_trim(cache_pool_t *p, uint64_t keep_bytes)
{
    uint64_t keep = keep_bytes / p->page_size, pages = 0;
    uint32_t before, n, seen = 0;
    cache__page_t *at = NULL;

    pthread_mutex_lock(&p->lock);
    before = p->trim_epoch++;
    pthread_mutex_unlock(&p->lock);
    do {
        pthread_mutex_lock(&p->lock);
        n = do_trim_batch(p, &at, &seen, keep > UINT32_MAX ? UINT32_MAX : (uint32_t)keep, before);
        pthread_mutex_unlock(&p->lock);
        pages += n;
    } while (n == CACHE__TRIM_BATCH && at != NULL);
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
