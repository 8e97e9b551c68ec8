/*
 * pool.c: the slot pool's slots, their owners and the public calls.  Owns
 * the slot table's contents (each slot's tenancy: generation and owner;
 * its chain of blocks and its state), the entry total, the room figures
 * and the prefetch hints.  The pool is made and unmade in create.c.
 *
 * Threads.  Any thread may call any function; one slot is used by one
 * thread at a time (the caller's rule, pool.h).
 *
 * Lock.  p->lock guards every field marked (lock) (pool_int.h).  It is
 * held for the table work of one call, never while a model runs; it is
 * taken to acquire, to release, and to add blocks that are not parked in
 * the caller's thread cache.  A step whose room the slot already holds, or
 * whose missing blocks are parked in its thread's cache, takes no lock: it
 * touches only fields marked (user), its thread's magazines and the atomic
 * entry total.  Fast paths match the handle against the slot's generation
 * (release store when a tenancy begins, acquire load), so a stale handle
 * fails before anything else is read.  The prefetch hints take no lock and
 * read the slot's own fields only.
 *
 * Calls prefix.c (the prefix cache), tcache.c (parking, stealing) and
 * slab.c (objects, pages); none calls back.
 *
 * Design: docs/design.md, "The pool", "The allocator and per-thread
 * caches", "Prefetch hints", "Blocks of growing capacity" and "Shared
 * blocks and zero-copy fork".
 */
#include "cache/pool_int.h"

#include <assert.h>
#include <string.h>
#include <sys/mman.h>

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

/* Hands slot `si`'s objects back (`head` the chain, linked through the
 * first word of each block) to the caller's thread cache `tc` (may be
 * NULL) or their pages, and puts the slot on the free stack. */
static void do_slot_free(cache_pool_t *p, cache__tcache_t *tc, uint32_t si,
                         model_block_t *const *gone, uint32_t ngone, void *state)
{
    cache__slot_t *s = &p->slots[si];

    for (uint32_t i = 0; i < ngone; i++)
        cache__do_obj_give(p, tc, gone[i]);
    if (state != NULL)
        cache__do_obj_give(p, NULL, state); /* to its page: states are not parked */
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
static void cache__poison_slot(const cache_pool_t *p, const cache__model_t *md,
                               model_block_t *const *gone, uint32_t ngone, void *state)
{
    for (uint32_t i = 0; i < ngone; i++) {
        size_t bstride =
            cache__round_up(model_block_bytes_for(md->m, gone[i]->capacity), CACHE__ALIGN);

        cache__poison(gone[i], bstride, NULL);
    }
    if (state != NULL)
        cache__poison(state, p->classes[md->state_cls].stride, NULL);
}
#endif

/* Appends block `b` of `cap` positions, just taken for slot `s`, to its
 * chain.  The slot's user, with or without the lock. */
static void cache__slot_append(const cache_pool_t *p, cache__slot_t *s, model_block_t *b,
                               uint32_t cap)
{
    __atomic_store_n(&b->provider, 1, __ATOMIC_RELAXED); /* its slot's alone */
    b->capacity = cap;
    b->first = s->room;
    if (s->last == NULL)
        s->head = b;
    s->last = b;
    assert(s->nblocks < p->table_len);
    cache__table(p, (uint32_t)(s - p->slots))[s->nblocks] = b;
    if (s->nblocks < CACHE__SLOT_BLOCKS)
        s->blocks[s->nblocks] = b;
    if (s->tail == NULL)
        s->tail = b; /* entries was == room: position `entries` is here */
    s->nblocks++;
    s->room += cap;
}

/* ---- Prefetch hints ---- */

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
 * false, with nothing changed, unless they are all parked there. */
static bool cache__reserve_parked(cache_pool_t *p, const cache__model_t *md, cache__slot_t *s,
                                  cache__tcache_t *tc, uint64_t want)
{
    uint32_t cls[CACHE__FAST_BLOCKS], caps[CACHE__FAST_BLOCKS], need = 0;
    model_block_t *got[CACHE__FAST_BLOCKS];

    for (uint64_t r = s->room; r < want; need++) {
        uint32_t cap;

        if (need == CACHE__FAST_BLOCKS)
            return false;
        cap = model_block_capacity(md->m, s->nblocks + need);
        caps[need] = cap;
        cls[need] = md->caps_cls[cache__cap_index(md, cap)];
        r += cap;
    }
    if (!cache__take_parked(p, tc, cls, need, got))
        return false;
    for (uint32_t i = 0; i < need; i++) {
        cache__slot_append(p, s, got[i], caps[i]);
        s->bytes += p->classes[cls[i]].stride;
    }
    return true;
}

/* Whether the blocks count[k] (per capacity index k of `md`) can be had,
 * taking first what the caller's thread cache `tc` (may be NULL) parks of
 * each class and the rest from the pages: the byte rule and the pages'
 * supply, as cache__do_classes_can(). */
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
            left[k] = cache__do_mag_count(&tc->mags[ci]);
        take = count[k] < left[first] ? count[k] : left[first];
        left[first] -= take;
        pages[k] = count[k] - take;
        bytes += pages[k] * p->classes[ci].stride;
    }
    return p->bytes_taken + bytes <= p->capacity && cache__do_classes_can(p, md, pages);
}

/* Takes one holder off block b (the lock held): true when that was the
 * last, and b is to go back to its page.  A cached block whose last slot
 * lets go stays, held by the prefix cache alone. */
static bool do_unhold(cache_pool_t *p, model_block_t *b)
{
    uint64_t left;

    assert(cache__holders(b) >= 1);
    left = cache__do_hold(b, -1);
    if (left == 1) {
        p->shared_blocks--;
        if (cache__prefix_node_of(p, b) != NULL)
            cache__do_prefix_unheld(p, b);
    }
    return left == 0;
}

/* Makes the shared block i of slot si's chain its own (pool_int.h, Shared
 * blocks): a new block of its class gets its bytes and takes its place in
 * the chain, and the old one loses a holder.  SLOTD_ECACHE_FULL (nothing
 * changes) when there is no room for the block.  The lock is held on entry
 * and on return, and let go for the copy: the old block stays (this slot
 * holds it) and nobody writes into it (it is shared), and only this slot's
 * user, the caller, changes the slot. */
static int do_block_copy(cache_pool_t *p, const cache__model_t *md, cache__slot_t *s, uint32_t si,
                         uint32_t i)
{
    model_block_t **t = cache__table(p, si), *old = t[i], *b;
    const uint32_t ci = md->caps_cls[cache__cap_index(md, old->capacity)];
    const size_t stride = p->classes[ci].stride;

    if (p->bytes_taken + stride > p->capacity || !cache__do_class_can(p, ci, 1)) {
        /* Not refused while a thread cache parks what would do. */
        cache__do_steal_all(p);
        while ((p->bytes_taken + stride > p->capacity || !cache__do_class_can(p, ci, 1)) &&
               cache__do_prefix_evict(p))
            ;
        if (p->bytes_taken + stride > p->capacity || !cache__do_class_can(p, ci, 1))
            return SLOTD_ECACHE_FULL;
    }
    b = cache__do_obj_alloc(p, ci);
    p->bytes_taken += stride;
    cache__unlock(p);
    memcpy(b->data, old->data, model_block_bytes_for(md->m, old->capacity) - MODEL_BLOCK_HEADER);
    pthread_mutex_lock(&p->lock);
    __atomic_store_n(&b->provider, 1, __ATOMIC_RELAXED);
    b->capacity = old->capacity;
    b->first = old->first;
    t[i] = b;
    if (i < CACHE__SLOT_BLOCKS)
        s->blocks[i] = b;
    if (s->head == old)
        s->head = b;
    if (s->last == old)
        s->last = b;
    if (s->tail == old)
        s->tail = b;
    p->tail_copies++;
    /* The other holders may have let go while the lock was free. */
    if (do_unhold(p, old)) {
#if CACHE__DEBUG
        cache__poison(old, stride, NULL);
#endif
        cache__do_obj_give(p, NULL, old);
    }
    return SLOTD_OK;
}

/* Takes a free slot for model `mi` with its state, if the model has one:
 * SLOTD_ECACHE_FULL when no slot is free or the state finds no room, even
 * after the thread caches are drained and cached prefixes evicted.  The
 * slot's tenancy has not begun (do_tenancy_begin). */
static int do_slot_take(cache_pool_t *p, uint32_t mi, uint32_t *si_out)
{
    const cache__model_t *md = &p->models[mi];
    cache__slot_t *s;
    uint32_t si;

    if (p->free_slot == CACHE__NONE)
        return SLOTD_ECACHE_FULL;
    if (md->state_bytes > 0 && (p->bytes_taken + md->state_bytes > p->capacity ||
                                !cache__do_class_can(p, md->state_cls, 1))) {
        /* Not refused while a thread cache parks what would do. */
        cache__do_steal_all(p);
        while ((p->bytes_taken + md->state_bytes > p->capacity ||
                !cache__do_class_can(p, md->state_cls, 1)) &&
               cache__do_prefix_evict(p))
            ;
        if (p->bytes_taken + md->state_bytes > p->capacity ||
            !cache__do_class_can(p, md->state_cls, 1))
            return SLOTD_ECACHE_FULL;
    }
    si = p->free_slot;
    s = &p->slots[si];
    p->free_slot = s->next_free;
    s->next_free = CACHE__NONE;
    assert((atomic_load_explicit(&s->gen, memory_order_relaxed) & 1) == 0 && s->head == NULL &&
           s->state == NULL && s->entries == 0);
    s->model = mi;
    /* A state is never parked: the take holds the lock anyway. */
    if (md->state_bytes > 0) {
        s->state = cache__do_obj_alloc(p, md->state_cls);
        p->bytes_taken += md->state_bytes;
    }
    *si_out = si;
    return SLOTD_OK;
}

/* Slot `si`'s tenancy begins for `owner`: everything written to the slot
 * before is published with its new generation, which `h` carries. */
static void do_tenancy_begin(cache_pool_t *p, uint32_t si, const cache_owner_t *owner,
                             cache_handle_t *h)
{
    cache__slot_t *s = &p->slots[si];

    do_owner_set(s, owner);
    h->gen = atomic_load_explicit(&s->gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&s->gen, h->gen, memory_order_release);
    p->live_slots++;
    h->slot = si;
}

/* ---- The public calls ---- */

int cache_pool_acquire(cache_pool_t *p, const model_t *m, const cache_owner_t *owner,
                       cache_handle_t *h)
{
    uint32_t si;
    int mi;
    int rc;

    if (p == NULL || owner == NULL || h == NULL || (mi = cache__model_index(p, m)) < 0)
        return SLOTD_EINVAL;

    pthread_mutex_lock(&p->lock);
    rc = do_slot_take(p, (uint32_t)mi, &si);
    if (rc == SLOTD_OK)
        do_tenancy_begin(p, si, owner, h);
    cache__unlock(p);
    return rc;
}

int cache_pool_fork(cache_pool_t *p, cache_handle_t from, const cache_owner_t *from_owner,
                    const cache_owner_t *owner, cache_handle_t *h, uint32_t *shared)
{
    const cache__model_t *md;
    cache__slot_t *src, *s;
    model_block_t *const *st;
    model_block_t **dt;
    const void *src_state = NULL;
    uint32_t si, nshare;
    int rc = SLOTD_OK;

    if (p == NULL || from_owner == NULL || owner == NULL || h == NULL)
        return SLOTD_EINVAL;

    pthread_mutex_lock(&p->lock);
    src = do_slot_get(p, from, from_owner);
    if (src == NULL) {
        rc = SLOTD_ESTALE;
        goto out;
    }
    md = &p->models[src->model];
    st = cache__table(p, from.slot);
    /* The blocks that hold an entry: every one before the tail, and the
     * tail when it holds one. */
    nshare = src->nblocks;
    if (src->tail != NULL)
        nshare = cache__block_index(st, src->nblocks, src->tail->first) +
                 (src->entries > src->tail->first);
    rc = do_slot_take(p, src->model, &si);
    if (rc != SLOTD_OK)
        goto out;
    s = &p->slots[si];
    if (md->state_bytes > 0)
        src_state = src->state;
    dt = cache__table(p, si);
    for (uint32_t i = 0; i < nshare; i++) {
        model_block_t *b = st[i];

        if (cache__do_hold(b, +1) == 2)
            p->shared_blocks++;
        dt[i] = b;
        if (i < CACHE__SLOT_BLOCKS)
            s->blocks[i] = b;
        s->bytes += p->classes[md->caps_cls[cache__cap_index(md, b->capacity)]].stride;
        s->room += b->capacity;
    }
    s->nblocks = nshare;
    s->head = nshare > 0 ? dt[0] : NULL;
    s->last = nshare > 0 ? dt[nshare - 1] : NULL;
    s->tail = s->room > src->entries ? s->last : NULL;
    s->entries = src->entries;
    atomic_fetch_add_explicit(&p->entries, s->entries, memory_order_relaxed);
    p->shared_forks++;
    do_tenancy_begin(p, si, owner, h);
    if (shared != NULL)
        *shared = nshare;
    /* The state is the new slot's, not yet handed to anyone, and `from`
     * does not run meanwhile (the caller's rule): copied without the lock. */
    cache__unlock(p);
    if (src_state != NULL)
        memcpy(s->state, src_state, md->state_bytes);
    return SLOTD_OK;
out:
    cache__unlock(p);
    return rc;
}

int cache_pool_prefix_attach(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner,
                             uint64_t scope, const uint32_t *tokens, uint32_t n, uint32_t *reused)
{
    cache__slot_t *s;
    uint64_t serial;
    int rc = SLOTD_OK;

    *reused = 0;
    if (p == NULL || owner == NULL || (n > 0 && tokens == NULL))
        return SLOTD_EINVAL;
    if (!p->prefix.on)
        return SLOTD_OK;
    pthread_mutex_lock(&p->lock);
    s = do_slot_get(p, h, owner);
    if (s == NULL)
        rc = SLOTD_ESTALE;
    else if (s->entries != 0 || s->nblocks != 0)
        rc = SLOTD_EINVAL;
    else
        *reused = cache__do_prefix_attach(p, s, h.slot, scope, tokens, n, &serial);
    cache__unlock(p);
    return rc;
}

int cache_pool_prefix_publish(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner,
                              uint64_t scope, const uint32_t *tokens, uint32_t n, bool *stuck)
{
    cache__slot_t *s;
    bool ignored = false;
    int rc = SLOTD_OK;

    if (stuck == NULL)
        stuck = &ignored;
    *stuck = false;
    if (p == NULL || owner == NULL || (n > 0 && tokens == NULL))
        return SLOTD_EINVAL;
    if (!p->prefix.on)
        return SLOTD_OK;
    pthread_mutex_lock(&p->lock);
    s = do_slot_get(p, h, owner);
    if (s == NULL)
        rc = SLOTD_ESTALE;
    else
        (void)cache__do_prefix_publish(p, s, h.slot, scope, tokens, n, stuck);
    cache__unlock(p);
    return rc;
}

int cache_pool_prefix_extend(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner,
                             uint64_t scope, const uint32_t *tokens, uint32_t n, uint32_t *reused)
{
    cache__slot_t *s;
    int rc = SLOTD_OK;

    *reused = 0;
    if (p == NULL || owner == NULL || (n > 0 && tokens == NULL))
        return SLOTD_EINVAL;
    if (!p->prefix.on)
        return SLOTD_OK;
    pthread_mutex_lock(&p->lock);
    s = do_slot_get(p, h, owner);
    if (s == NULL)
        rc = SLOTD_ESTALE;
    else
        *reused = cache__do_prefix_extend(p, s, h.slot, scope, tokens, n);
    cache__unlock(p);
    return rc;
}

int cache_pool_prefix_detach(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner,
                             uint32_t entries)
{
    model_block_t **t;
    cache__slot_t *s;
    int rc = SLOTD_OK;

    if (p == NULL || owner == NULL)
        return SLOTD_EINVAL;
    pthread_mutex_lock(&p->lock);
    s = do_slot_get(p, h, owner);
    if (s == NULL || entries > s->entries || s->entries != s->room) {
        rc = s == NULL ? SLOTD_ESTALE : SLOTD_EINVAL;
        goto out;
    }
    t = cache__table(p, h.slot);
    while (s->nblocks > 0 && t[s->nblocks - 1]->first >= entries) {
        const cache__model_t *md = &p->models[s->model];
        model_block_t *b = t[--s->nblocks];
        bool last = do_unhold(p, b);

        /* Blocks an extend took: the cache still holds each. */
        assert(!last);
        (void)last;
        s->room -= b->capacity;
        s->bytes -= p->classes[md->caps_cls[cache__cap_index(md, b->capacity)]].stride;
        t[s->nblocks] = NULL;
    }
    s->last = s->nblocks > 0 ? t[s->nblocks - 1] : NULL;
    if (s->nblocks == 0)
        s->head = NULL;
    s->tail = NULL;
    atomic_fetch_sub_explicit(&p->entries, s->entries - entries, memory_order_relaxed);
    s->entries = entries;
out:
    cache__unlock(p);
    return rc;
}

int cache_pool_prefix_forget(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner,
                             uint32_t *forgotten)
{
    cache__slot_t *s;
    int rc = SLOTD_OK;

    *forgotten = 0;
    if (p == NULL || owner == NULL)
        return SLOTD_EINVAL;
    pthread_mutex_lock(&p->lock);
    s = do_slot_get(p, h, owner);
    if (s == NULL)
        rc = SLOTD_ESTALE;
    else if (p->prefix.on)
        *forgotten = cache__do_prefix_forget(p, s, h.slot);
    cache__unlock(p);
    return rc;
}

uint64_t cache_pool_prefix_flush(cache_pool_t *p)
{
    uint64_t n = 0;

    pthread_mutex_lock(&p->lock);
    while (cache__do_prefix_evict(p))
        n++;
    cache__unlock(p);
    return n;
}

int cache_pool_unshare(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner)
{
    cache__slot_t *s;
    int rc = SLOTD_OK;

    if (p == NULL || owner == NULL)
        return SLOTD_EINVAL;
    pthread_mutex_lock(&p->lock);
    s = do_slot_get(p, h, owner);
    if (s == NULL) {
        rc = SLOTD_ESTALE;
        goto out;
    }
    for (uint32_t i = 0; i < s->nblocks && rc == SLOTD_OK; i++)
        if (cache__holders(cache__table(p, h.slot)[i]) > 1)
            rc = do_block_copy(p, &p->models[s->model], s, h.slot, i);
out:
    cache__unlock(p);
    return rc;
}

int cache_pool_shared_entries(cache_pool_t *p, cache_handle_t h, const cache_owner_t *owner,
                              uint32_t *out)
{
    cache__slot_t *s;
    model_block_t **t;
    uint32_t n = 0;

    if (p == NULL || owner == NULL || out == NULL)
        return SLOTD_EINVAL;
    pthread_mutex_lock(&p->lock);
    s = do_slot_get(p, h, owner);
    if (s == NULL) {
        cache__unlock(p);
        return SLOTD_ESTALE;
    }
    t = cache__table(p, h.slot);
    for (uint32_t i = 0; i < s->nblocks && t[i]->first < s->entries; i++)
        if (cache__holders(t[i]) > 1)
            n += s->entries - t[i]->first < t[i]->capacity ? s->entries - t[i]->first
                                                           : t[i]->capacity;
    cache__unlock(p);
    *out = n;
    return SLOTD_OK;
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
    if (s != NULL && (n == 0 || s->tail == NULL || cache__holders(s->tail) == 1)) {
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
            kv->blocks = cache__table(p, h.slot);
            kv->nblocks = s->nblocks;
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
    /* Entries are about to be written into the tail: it must be the
     * slot's own. */
    if (n > 0 && s->tail != NULL && cache__holders(s->tail) > 1 &&
        (rc = do_block_copy(p, md, s, h.slot,
                            cache__block_index(cache__table(p, h.slot), s->nblocks,
                                               s->tail->first))) != SLOTD_OK)
        goto out;
    if (want > room) {
        uint64_t count[CACHE__MAX_CAPS] = {0}, bytes = 0;
        uint32_t need = 0;

        /* The blocks the chain's next indices hold, counted per capacity. */
        for (uint64_t r = room; r < want; need++) {
            uint32_t cap = model_block_capacity(md->m, s->nblocks + need);

            count[cache__cap_index(md, cap)]++;
            bytes += p->classes[md->caps_cls[cache__cap_index(md, cap)]].stride;
            r += cap;
        }
        tc = cache__do_tcache_claim(p);
        if (!do_reserve_can(p, md, tc, count)) {
            /* Not refused while a thread cache parks what would do. */
            cache__do_steal_all(p);
            /* Then what only the prefix cache holds (free room). */
            while (!do_reserve_can(p, md, tc, count) && cache__do_prefix_evict(p))
                ;
            if (!do_reserve_can(p, md, tc, count)) {
                rc = SLOTD_ECACHE_FULL;
                goto out;
            }
        }
        from = s->nblocks;
        for (uint32_t i = 0; i < need; i++) {
            uint32_t cap = model_block_capacity(md->m, s->nblocks);
            uint32_t ci = md->caps_cls[cache__cap_index(md, cap)];
            model_block_t *b = tc != NULL ? cache__mag_pop(p, &tc->mags[ci], ci) : NULL;

            if (b == NULL) {
                b = cache__do_obj_alloc(p, ci);
                p->bytes_taken += p->classes[ci].stride;
            }
            cache__slot_append(p, s, b, cap);
        }
        s->bytes += bytes;
        /* Park what the next reserves of this and other slots will want:
         * the classes of these blocks and of the block after them. */
        if (tc != NULL) {
            for (uint32_t i = from; i <= s->nblocks; i++) {
                uint32_t ci = md->caps_cls[cache__cap_index(md, model_block_capacity(md->m, i))];

                if (p->classes[ci].mag_cap > 0)
                    cache__do_mag_fill(p, &tc->mags[ci], ci);
            }
        }
    }
    kv->head = s->head;
    kv->tail = s->tail;
    kv->len = s->entries;
    kv->state = s->state;
    kv->blocks = cache__table(p, h.slot);
    kv->nblocks = s->nblocks;
out:
    cache__unlock(p);
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
        cache__unlock(p);
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
    /* Move the tail forward over the blocks the new entries filled: at
     * most the blocks the last reserves took, so amortised O(1) per
     * entry. */
    b = s->tail;
    if (b != NULL && kv->len - b->first >= b->capacity) {
        model_block_t *const *t = cache__table(p, h.slot);
        uint32_t i = cache__block_index(t, s->nblocks, b->first);

        while (b != NULL && kv->len - b->first >= b->capacity)
            b = ++i < s->nblocks ? t[i] : NULL;
    }
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
    model_block_t **gone;
    uint32_t ngone = 0;
    void *state;

    if (p == NULL || owner == NULL)
        return SLOTD_EINVAL;

    pthread_mutex_lock(&p->lock);
    s = do_slot_get(p, h, owner);
    if (s == NULL) {
        cache__unlock(p);
        return SLOTD_ESTALE;
    }
    /* From here the handle is stale; the slot is on no free list until
     * do_slot_free(), so nobody can acquire it in between. */
    atomic_fetch_add_explicit(&s->gen, 1, memory_order_relaxed);
    if (entries != NULL)
        *entries = s->entries;
    /* The blocks this slot alone held go back; the table, the slot's own
     * and dead now, lists them.  A block another slot holds stays. */
    gone = cache__table(p, h.slot);
    for (uint32_t i = 0; i < s->nblocks; i++) {
        model_block_t *b = gone[i];

        if (do_unhold(p, b))
            gone[ngone++] = b;
    }
    state = s->state;
#if CACHE__DEBUG
    {
        const cache__model_t *md = &p->models[s->model];

        cache__unlock(p);
        cache__poison_slot(p, md, gone, ngone, state);
        pthread_mutex_lock(&p->lock);
    }
#endif
    /* The table's pages this tenancy wrote, for cache_pool_trim_tables(). */
    if (s->nblocks > 0) {
        size_t from = (size_t)h.slot * p->table_len * sizeof(*p->tables);
        size_t to = from + (size_t)s->nblocks * sizeof(*p->tables) - 1;

        for (size_t pg = from / p->sys_page; pg <= to / p->sys_page; pg++)
            p->tables_dirty[pg / 64] |= UINT64_C(1) << (pg % 64);
    }
    do_slot_free(p, cache__do_tcache_claim(p), h.slot, gone, ngone, state);
    cache__unlock(p);
    return SLOTD_OK;
}

uint64_t cache_pool_trim_tables(cache_pool_t *p)
{
    const size_t per = (size_t)p->table_len * sizeof(*p->tables);
    uint64_t given = 0;

    pthread_mutex_lock(&p->lock);
    for (size_t w = 0; w < (p->tables_pages + 63) / 64; w++) {
        while (p->tables_dirty[w] != 0) {
            size_t pg = w * 64 + (size_t)__builtin_ctzll(p->tables_dirty[w]);
            size_t lo = pg * p->sys_page / per;
            size_t hi = ((pg + 1) * p->sys_page - 1) / per;
            bool all_free = true;

            p->tables_dirty[w] &= p->tables_dirty[w] - 1;
            for (size_t si = lo; si <= hi && si < p->max_slots; si++)
                if (atomic_load_explicit(&p->slots[si].gen, memory_order_relaxed) & 1)
                    all_free = false;
            /* A page a live slot uses is marked again when it is released;
             * under the lock no slot is acquired meanwhile. */
            if (all_free &&
                madvise((char *)p->tables + pg * p->sys_page, p->sys_page, MADV_DONTNEED) == 0)
                given += p->sys_page;
        }
    }
    cache__unlock(p);
    return given;
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

uint64_t cache_pool_block_bytes(const model_t *m, uint32_t index, uint32_t *cap)
{
    *cap = model_block_capacity(m, index);
    return cache__round_up(model_block_bytes_for(m, *cap), CACHE__ALIGN);
}

uint64_t cache_pool_slot_bytes(const model_t *m, uint32_t positions)
{
    size_t chain = 0;

    model_chain_blocks(m, positions, CACHE__ALIGN, &chain);
    return chain + cache__round_up(model_state_size(m), CACHE__ALIGN);
}

void cache_pool_stats(cache_pool_t *p, cache_pool_stats_t *st)
{
    pthread_mutex_lock(&p->lock);
    /* Parked objects are free: with them back on their pages, bytes_taken
     * is what live slots hold, and stays so while the lock is held. */
    cache__do_steal_all(p);
    st->entries = atomic_load_explicit(&p->entries, memory_order_relaxed);
    st->live_slots = p->live_slots;
    st->max_slots = p->max_slots;
    st->bytes_capacity = p->capacity;
    st->bytes_used = p->bytes_taken;
    st->bytes_free = p->capacity - p->bytes_taken;
    st->shared_blocks = p->shared_blocks;
    st->prefix_entries = p->prefix.lru_entries;
    st->prefix_bytes = p->prefix.lru_bytes;
    st->prefix_hit_entries = p->prefix.hit_entries;
    st->prefix_query_entries = p->prefix.query_entries;
    st->prefix_evicted_entries = p->prefix.evicted_entries;
    st->forks = p->shared_forks;
    st->tail_copies = p->tail_copies;
    cache__unlock(p);
}
