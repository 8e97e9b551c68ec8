/*
 * test_cache.c: the Check suite of the slot pool (cache/pool.h).
 *
 * It holds the pool to pool.h with real models ("hash", "tiny", "small"):
 * empty slots, exact growth by blocks, tails at block boundaries, every byte
 * returned on release, refusals (slot count, budget, pages) that change
 * nothing, stale and foreign handles, two block sizes sharing pages, and a
 * randomized sequence checked against a plain model of the expected figures
 * after every call, and blocks parked in one thread's cache that must not
 * cost another thread a refusal; and the session calls on top of it that
 * grow or copy a slot (cache_session_append(), cache_session_fork()),
 * against the uncached reference.  Debug builds also check the poison and
 * the guards.  It
 * includes the pool's private header to see pages and run the full
 * invariant check.
 */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/pool.h"
#include "cache/pool_check_int.h"
#include "cache/session.h"
#include "core/model.h"

/* ---- Helpers ---- */

static uint64_t rng_state;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static uint32_t rng_below(uint32_t n)
{
    return (uint32_t)(rng_next() % n);
}

static model_t *model(const char *preset)
{
    model_t *m = NULL;

    ck_assert_int_eq(model_create(preset, &m), SLOTD_OK);
    ck_assert_ptr_nonnull(m);
    return m;
}

static cache_owner_t owner(uint64_t key, const char *id)
{
    cache_owner_t o;

    memset(&o, 0, sizeof o);
    o.key = key;
    snprintf(o.id, sizeof o.id, "%s", id);
    return o;
}

static cache_pool_t *pool(size_t capacity, uint32_t max_slots, const model_t *const *models,
                          size_t nmodels)
{
    cache_pool_config_t cfg = {capacity, max_slots, models, nmodels, 1, false};
    cache_pool_t *p = NULL;

    ck_assert_int_eq(cache_pool_create(&cfg, &p), SLOTD_OK);
    ck_assert_ptr_nonnull(p);
    return p;
}

static cache_pool_stats_t stats(cache_pool_t *p)
{
    cache_pool_stats_t st;

    cache_pool_stats(p, &st);
    return st;
}

/* The figures that hold after every call: used + free == capacity, the
 * lock-free entry count agrees with the snapshot, and the pool's own walk
 * of its tables finds nothing wrong. */
static void sound(cache_pool_t *p)
{
    cache_pool_stats_t st = stats(p);

    ck_assert_uint_eq(st.bytes_used + st.bytes_free, st.bytes_capacity);
    ck_assert_uint_le(st.bytes_used, st.bytes_capacity);
    ck_assert_uint_eq(cache_pool_entries(p), st.entries);
    ck_assert_int_eq(cache__pool_check(p), 0);
}

static void stats_eq(const cache_pool_stats_t *a, const cache_pool_stats_t *b)
{
    ck_assert_uint_eq(a->entries, b->entries);
    ck_assert_uint_eq(a->live_slots, b->live_slots);
    ck_assert_uint_eq(a->max_slots, b->max_slots);
    ck_assert_uint_eq(a->bytes_capacity, b->bytes_capacity);
    ck_assert_uint_eq(a->bytes_used, b->bytes_used);
    ck_assert_uint_eq(a->bytes_free, b->bytes_free);
}

/* What a slot looks like from outside: its kv (by a reserve of 0) and the
 * blocks of its chain. */
typedef struct view {
    model_kv_t kv;
    uint32_t nblocks;
} view_t;

/* The blocks of a pool chain, through its table (the pool's chains are
 * not linked by `next`: a shared block sits in several), checked to start
 * at the head and to hold ascending positions without a gap. */
static uint32_t chain_len(const model_kv_t *kv)
{
    uint32_t room = 0;

    if (kv->nblocks == 0) {
        ck_assert_ptr_null(kv->head);
        return 0;
    }
    ck_assert_ptr_nonnull(kv->blocks);
    ck_assert_ptr_eq(kv->blocks[0], kv->head);
    for (uint32_t i = 0; i < kv->nblocks; i++) {
        ck_assert_uint_eq(kv->blocks[i]->first, room);
        room += kv->blocks[i]->capacity;
    }
    return kv->nblocks;
}

static const model_block_t *chain_at(const model_kv_t *kv, uint32_t i)
{
    ck_assert_uint_lt(i, kv->nblocks);
    return kv->blocks[i];
}

static view_t view(cache_pool_t *p, cache_handle_t h, const cache_owner_t *o)
{
    view_t v;

    memset(&v, 0, sizeof v);
    ck_assert_int_eq(cache_pool_reserve(p, h, o, 0, &v.kv), SLOTD_OK);
    v.nblocks = chain_len(&v.kv);
    return v;
}

static void view_eq(const view_t *a, const view_t *b)
{
    ck_assert_ptr_eq(a->kv.head, b->kv.head);
    ck_assert_ptr_eq(a->kv.tail, b->kv.tail);
    ck_assert_uint_eq(a->kv.len, b->kv.len);
    ck_assert_ptr_eq(a->kv.state, b->kv.state);
    ck_assert_uint_eq(a->nblocks, b->nblocks);
}

/* Blocks a chain of `m` needs for `positions` (core/model.h). */
static uint32_t blocks_for(const model_t *m, uint32_t positions)
{
    return model_chain_blocks(m, positions, 1, NULL);
}

/* Positions the first `nblocks` blocks of a chain of `m` hold. */
static uint32_t room_of(const model_t *m, uint32_t nblocks)
{
    uint32_t room = 0;

    for (uint32_t i = 0; i < nblocks; i++)
        room += model_block_capacity(m, i);
    return room;
}

/* Grows a slot by n entries (reserve, then commit without running a model). */
static int grow(cache_pool_t *p, cache_handle_t h, const cache_owner_t *o, uint32_t n)
{
    model_kv_t kv;
    int rc = cache_pool_reserve(p, h, o, n, &kv);

    if (rc != SLOTD_OK)
        return rc;
    kv.len += n;
    return cache_pool_commit(p, h, o, &kv);
}

/* Fills one new slot of `m` with blocks, one block a reserve, until the
 * pool refuses or the next block would pass max_ctx; returns the blocks it
 * got.  *h is the slot (or, if even the acquire failed, left untouched and
 * 0 is returned). */
static uint32_t fill_slot(cache_pool_t *p, const model_t *m, const cache_owner_t *o,
                          cache_handle_t *h)
{
    uint32_t got = 0, room = 0;
    model_kv_t kv;

    if (cache_pool_acquire(p, m, o, h) != SLOTD_OK)
        return 0;
    for (;;) {
        uint32_t per = model_block_capacity(m, got);

        if (room + per > model_max_ctx(m) || cache_pool_reserve(p, *h, o, per, &kv) != SLOTD_OK)
            break;
        kv.len += per;
        ck_assert_int_eq(cache_pool_commit(p, *h, o, &kv), SLOTD_OK);
        room += per;
        got++;
    }
    return got;
}

static size_t round_align(size_t n)
{
    return (n + CACHE__ALIGN - 1) / CACHE__ALIGN * CACHE__ALIGN;
}

/* The pool bytes of a slot of `m` whose chain has `nblocks` blocks: the
 * state and each block at their strides. */
static uint64_t slot_bytes(const model_t *m, uint32_t nblocks)
{
    uint64_t bytes = round_align(model_state_size(m));

    for (uint32_t i = 0; i < nblocks; i++)
        bytes += round_align(model_block_bytes_for(m, model_block_capacity(m, i)));
    return bytes;
}

/* The page size the pool picks for `models` (pool_check_int.h): the smallest
 * multiple of the largest page unit (for each capacity c of a chain,
 * ceil(largest / c) blocks of c positions at their strides) or state that
 * reaches CACHE__PAGE_MIN. */
static size_t page_for(const model_t *const *models, size_t n)
{
    size_t big = 0;

    for (size_t i = 0; i < n; i++) {
        const model_t *m = models[i];
        uint32_t top = model_block_positions(m);

        for (uint32_t b = 0; b < blocks_for(m, model_max_ctx(m)); b++) {
            uint32_t c = model_block_capacity(m, b);
            size_t u = round_align(model_block_bytes_for(m, c)) * ((top + c - 1) / c);
            if (u > big)
                big = u;
        }
        if (round_align(model_state_size(m)) > big)
            big = round_align(model_state_size(m));
    }
    return (CACHE__PAGE_MIN + big - 1) / big * big;
}

/* ---- The fixture ---- */

/* The models and the pool of the running test: fx_model() and fx_pool()
 * make them, and fx_teardown(), a checked fixture, destroys them after the
 * test, passed or failed. */
static model_t *fx_models[4];
static const model_t *fx_list[4]; /* the same, for the pool's config */
static size_t fx_nmodels;
static cache_pool_t *fx_p;

/* The model of `preset`, one of the pool's models in the order made. */
static model_t *fx_model(const char *preset)
{
    ck_assert_uint_lt(fx_nmodels, 4);
    fx_models[fx_nmodels] = model(preset);
    fx_list[fx_nmodels] = fx_models[fx_nmodels];
    return fx_models[fx_nmodels++];
}

/* page_for() the models made so far. */
static size_t fx_page(void)
{
    return page_for(fx_list, fx_nmodels);
}

/* A pool of `capacity` bytes and `max_slots` slots over the models made. */
static cache_pool_t *fx_pool(size_t capacity, uint32_t max_slots)
{
    ck_assert_ptr_null(fx_p);
    fx_p = pool(capacity, max_slots, fx_list, fx_nmodels);
    return fx_p;
}

static void fx_teardown(void)
{
    if (fx_p != NULL)
        cache_pool_destroy(fx_p);
    fx_p = NULL;
    while (fx_nmodels > 0)
        model_destroy(fx_models[--fx_nmodels]);
}

/* ---- Creation ---- */

static int calloc_budget;

static void *failing_calloc(size_t n, size_t size)
{
    if (calloc_budget-- <= 0)
        return NULL;
    return calloc(n, size);
}

START_TEST(test_create_invalid)
{
    model_t *hash = fx_model("hash");
    const model_t *models[] = {hash};
    const model_t *none[] = {NULL};
    cache_pool_config_t cfg = {(size_t)4 << 20, 8, models, 1, 1, false};
    cache_pool_t *p = NULL;

    ck_assert_int_eq(cache_pool_create(NULL, &p), SLOTD_EINVAL);
    cfg.capacity_bytes = 0;
    ck_assert_int_eq(cache_pool_create(&cfg, &p), SLOTD_EINVAL);
    cfg.capacity_bytes = (size_t)4 << 20;
    cfg.max_slots = 0;
    ck_assert_int_eq(cache_pool_create(&cfg, &p), SLOTD_EINVAL);
    cfg.max_slots = 8;
    cfg.nmodels = 0;
    ck_assert_int_eq(cache_pool_create(&cfg, &p), SLOTD_EINVAL);
    cfg.nmodels = 1;
    cfg.models = none;
    ck_assert_int_eq(cache_pool_create(&cfg, &p), SLOTD_EINVAL);
    cfg.models = models;
    /* A budget smaller than one page of the model's blocks. */
    cfg.capacity_bytes = model_block_bytes(hash);
    ck_assert_int_eq(cache_pool_create(&cfg, &p), SLOTD_EINVAL);
    /* More pages than a page index holds, and (3e9 pages, some 200 TB)
     * more address space than the machine has. */
    cfg.capacity_bytes = SIZE_MAX / 4;
    ck_assert_int_eq(cache_pool_create(&cfg, &p), SLOTD_ENOMEM);
    cfg.capacity_bytes = (size_t)3000000000u * page_for(models, 1);
    ck_assert_int_eq(cache_pool_create(&cfg, &p), SLOTD_ENOMEM);
    ck_assert_ptr_null(p);
}
END_TEST

START_TEST(test_create_oom)
{
    model_t *hash = fx_model("hash");
    const model_t *models[] = {hash};
    cache_pool_config_t cfg = {(size_t)1 << 20, 8, models, 1, 1, false};
    cache_pool_t *p = NULL;
    int budget = 0;

    /* Fail the first, second, ... table allocation until creation succeeds;
     * each failure must leave nothing behind (ASan and valgrind see leaks). */
    cache__pool_set_calloc(failing_calloc);
    for (;; budget++) {
        calloc_budget = budget;
        if (cache_pool_create(&cfg, &p) == SLOTD_OK)
            break;
        ck_assert_ptr_null(p);
        ck_assert_int_lt(budget, 100);
    }
    cache__pool_set_calloc(NULL);
    ck_assert_int_gt(budget, 0);
    sound(p);
    cache_pool_destroy(p);
}
END_TEST

/* ---- Acquire, reserve, commit ---- */

START_TEST(test_acquire_empty)
{
    (void)fx_model("hash"); /* in the pool, never acquired */
    model_t *tiny = fx_model("tiny");
    cache_pool_t *p = fx_pool((size_t)2 << 20, 4);
    cache_owner_t o = owner(1, "a");
    cache_handle_t h;
    cache_pool_stats_t st;
    view_t v;

    st = stats(p);
    ck_assert_uint_eq(st.bytes_used, 0);
    ck_assert_uint_eq(st.live_slots, 0);
    ck_assert_uint_eq(st.max_slots, 4);
    ck_assert_uint_eq(st.bytes_capacity, (size_t)2 << 20);

    ck_assert_int_eq(cache_pool_acquire(p, tiny, &o, &h), SLOTD_OK);
    st = stats(p);
    ck_assert_uint_eq(st.live_slots, 1);
    ck_assert_uint_eq(st.entries, 0);
    ck_assert_uint_eq(st.bytes_used, slot_bytes(tiny, 0));
    v = view(p, h, &o);
    ck_assert_ptr_null(v.kv.head);
    ck_assert_ptr_null(v.kv.tail);
    ck_assert_uint_eq(v.kv.len, 0);
    ck_assert_ptr_nonnull(v.kv.state);
    ck_assert_uint_eq((uintptr_t)v.kv.state % CACHE__ALIGN, 0);
    sound(p);

    /* A model the pool was not configured with. */
    {
        model_t *small = model("small");
        cache_handle_t h2;
        ck_assert_int_eq(cache_pool_acquire(p, small, &o, &h2), SLOTD_EINVAL);
        ck_assert_int_eq(cache_pool_acquire(p, NULL, &o, &h2), SLOTD_EINVAL);
        model_destroy(small);
    }
    {
        cache_pool_stats_t after = stats(p);
        stats_eq(&st, &after);
    }

    ck_assert_int_eq(cache_pool_release(p, h, &o, NULL), SLOTD_OK);
    sound(p);
}
END_TEST

START_TEST(test_reserve_commit_grows_exactly)
{
    model_t *hash = fx_model("hash");
    cache_pool_t *p = fx_pool((size_t)4 << 20, 4);
    cache_owner_t o = owner(7, "grow");
    cache_handle_t h;
    uint32_t entries = 0, per = model_block_capacity(hash, 0), nb = 0;
    const uint32_t steps[] = {1, 1, per - 2, 1, 0, per, 3, 2 * per + 5, per - 1, 17, 700, 1};

    ck_assert_int_eq(cache_pool_acquire(p, hash, &o, &h), SLOTD_OK);
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        model_kv_t kv;
        cache_pool_stats_t st;

        ck_assert_int_eq(cache_pool_reserve(p, h, &o, steps[i], &kv), SLOTD_OK);
        ck_assert_uint_eq(kv.len, entries);
        /* Room for exactly what was asked, in whole blocks, or what was there. */
        if (blocks_for(hash, entries + steps[i]) > nb)
            nb = blocks_for(hash, entries + steps[i]);
        ck_assert_uint_eq(chain_len(&kv), nb);
        st = stats(p);
        ck_assert_uint_eq(st.bytes_used, slot_bytes(hash, nb));
        ck_assert_uint_eq(st.entries, entries); /* nothing committed yet */
        kv.len += steps[i];
        ck_assert_int_eq(cache_pool_commit(p, h, &o, &kv), SLOTD_OK);
        entries += steps[i];
        st = stats(p);
        ck_assert_uint_eq(st.entries, entries);
        ck_assert_uint_eq(cache_pool_entries(p), entries);
        sound(p);
    }
    /* Reserving what is already there takes nothing. */
    {
        cache_pool_stats_t before = stats(p), after;
        model_kv_t kv;
        uint32_t spare = room_of(hash, nb) - entries;

        ck_assert_int_eq(cache_pool_reserve(p, h, &o, spare, &kv), SLOTD_OK);
        after = stats(p);
        stats_eq(&before, &after);
    }
}
END_TEST

/* The hint names what the slot's next step reads first: its state and
 * the chain's first blocks (attn; each block's bytes up to the prefetch
 * cap, in whole lines), or the tail's header (hash); nothing else. */
START_TEST(test_hint_names_the_slot)
{
    model_t *tiny = fx_model("tiny"), *hash = fx_model("hash");
    cache_pool_t *p = fx_pool((size_t)4 << 20, 4);
    cache_owner_t o = owner(3, "hint");
    cache_handle_t h;
    cache_hint_t hint;
    model_kv_t kv;
    uint32_t nb;
    size_t k, used;

    /* tiny: grow entry by entry; after each commit the hint names the
     * state and then the chain's blocks, in chain order. */
    ck_assert_int_eq(cache_pool_acquire(p, tiny, &o, &h), SLOTD_OK);
    for (uint32_t e = 1; e <= model_max_ctx(tiny); e++) {
        ck_assert_int_eq(grow(p, h, &o, 1), SLOTD_OK);
        ck_assert_int_eq(cache_pool_reserve(p, h, &o, 0, &kv), SLOTD_OK);
        cache_pool_hint(p, h, &hint);
        nb = chain_len(&kv);
        ck_assert_uint_gt(hint.lines[0], 0); /* the slot's own record */
        ck_assert_ptr_eq(hint.addr[1], kv.state);
        ck_assert_uint_eq(hint.lines[1], 1); /* d = 8 doubles */
        used = 2;
        for (k = 2; k < CACHE_HINTS && k - 2 < nb; k++, used++) {
            const model_block_t *b = chain_at(&kv, (uint32_t)(k - 2));
            size_t bytes = model_block_bytes_for(tiny, b->capacity);
            ck_assert_ptr_eq(hint.addr[k], b);
            ck_assert_uint_ge((size_t)hint.lines[k] * 64, bytes < 640 ? bytes : 640);
            ck_assert_uint_lt((size_t)hint.lines[k] * 64, (bytes < 640 ? bytes : 640) + 64);
        }
        for (k = used; k < CACHE_HINTS; k++)
            ck_assert_uint_eq(hint.lines[k], 0);
    }
    ck_assert_int_eq(cache_pool_release(p, h, &o, NULL), SLOTD_OK);

    /* hash reads no chain: the state, if any, and the tail's header. */
    ck_assert_int_eq(cache_pool_acquire(p, hash, &o, &h), SLOTD_OK);
    ck_assert_int_eq(grow(p, h, &o, 3), SLOTD_OK);
    ck_assert_int_eq(cache_pool_reserve(p, h, &o, 0, &kv), SLOTD_OK);
    cache_pool_hint(p, h, &hint);
    k = kv.state != NULL ? 2 : 1;
    if (kv.state != NULL)
        ck_assert_ptr_eq(hint.addr[1], kv.state);
    ck_assert_ptr_eq(hint.addr[k], kv.tail);
    ck_assert_uint_eq(hint.lines[k], 1);
    for (k++; k < CACHE_HINTS; k++)
        ck_assert_uint_eq(hint.lines[k], 0);
    ck_assert_int_eq(cache_pool_release(p, h, &o, NULL), SLOTD_OK);
}
END_TEST

START_TEST(test_block_boundaries)
{
    model_t *hash = fx_model("hash");
    cache_pool_t *p = fx_pool((size_t)4 << 20, 4);
    cache_owner_t o = owner(3, "edge");
    cache_handle_t h;
    uint32_t per = model_block_capacity(hash, 0);
    model_kv_t kv;
    view_t v;

    ck_assert_int_eq(cache_pool_acquire(p, hash, &o, &h), SLOTD_OK);
    /* Exactly one block's worth: one block, and once committed the slot is
     * full, so the tail (the block of position `entries`) is NULL. */
    ck_assert_int_eq(cache_pool_reserve(p, h, &o, per, &kv), SLOTD_OK);
    ck_assert_uint_eq(chain_len(&kv), 1);
    ck_assert_ptr_eq(kv.tail, kv.head);
    ck_assert_uint_eq((uintptr_t)kv.head % CACHE__ALIGN, 0);
    kv.len = per;
    ck_assert_int_eq(cache_pool_commit(p, h, &o, &kv), SLOTD_OK);
    v = view(p, h, &o);
    ck_assert_ptr_null(v.kv.tail);
    ck_assert_uint_eq(v.kv.len, per);
    ck_assert_uint_eq(v.nblocks, 1);

    /* One more: a second block, which is the new tail. */
    ck_assert_int_eq(cache_pool_reserve(p, h, &o, 1, &kv), SLOTD_OK);
    ck_assert_uint_eq(chain_len(&kv), 2);
    ck_assert_ptr_eq(kv.tail, kv.blocks[1]);
    ck_assert_ptr_eq(kv.head, v.kv.head);
    kv.len = per + 1;
    ck_assert_int_eq(cache_pool_commit(p, h, &o, &kv), SLOTD_OK);
    v = view(p, h, &o);
    ck_assert_ptr_eq(v.kv.tail, v.kv.blocks[1]);

    /* Across several boundaries at once: tail is the block holding len. */
    ck_assert_int_eq(cache_pool_reserve(p, h, &o, room_of(hash, 5) - (per + 1), &kv), SLOTD_OK);
    ck_assert_uint_eq(chain_len(&kv), 5);
    for (uint32_t i = 0; i < 5; i++) {
        ck_assert_uint_eq(chain_at(&kv, i)->capacity, model_block_capacity(hash, i));
        ck_assert_uint_eq(chain_at(&kv, i)->first, room_of(hash, i));
    }
    kv.len = room_of(hash, 4);
    ck_assert_int_eq(cache_pool_commit(p, h, &o, &kv), SLOTD_OK);
    v = view(p, h, &o);
    ck_assert_ptr_eq(v.kv.tail, chain_at(&v.kv, 4));
    kv.len = room_of(hash, 4) + 1;
    ck_assert_int_eq(cache_pool_commit(p, h, &o, &kv), SLOTD_OK);
    v = view(p, h, &o);
    ck_assert_ptr_eq(v.kv.tail, chain_at(&v.kv, 4));
    kv.len = room_of(hash, 5);
    ck_assert_int_eq(cache_pool_commit(p, h, &o, &kv), SLOTD_OK);
    v = view(p, h, &o);
    ck_assert_ptr_null(v.kv.tail);
    sound(p);

    /* Up to max_ctx and not one past (the caller's SLOTD_ECONTEXT_FULL). */
    {
        uint32_t left = model_max_ctx(hash) - v.kv.len;
        cache_pool_stats_t before, after;

        ck_assert_int_eq(grow(p, h, &o, left), SLOTD_OK);
        before = stats(p);
        v = view(p, h, &o);
        ck_assert_uint_eq(v.kv.len, model_max_ctx(hash));
        ck_assert_uint_eq(v.nblocks, blocks_for(hash, model_max_ctx(hash)));
        ck_assert_int_eq(cache_pool_reserve(p, h, &o, 1, &kv), SLOTD_EINVAL);
        after = stats(p);
        stats_eq(&before, &after);
    }
    sound(p);
}
END_TEST

/* The real models write and read their entries through the pool's chain:
 * a hash sequence across many blocks, decoded step by step, matches the
 * uncached reference, and "tiny" reproduces the golden tokens. */
START_TEST(test_models_run_in_slots)
{
    model_t *hash = fx_model("hash"), *tiny = fx_model("tiny");
    cache_pool_t *p = fx_pool((size_t)4 << 20, 4);
    cache_owner_t o = owner(9, "run");
    cache_handle_t h;
    size_t scratch_size = model_scratch_size(hash) > model_scratch_size(tiny)
                              ? model_scratch_size(hash)
                              : model_scratch_size(tiny);
    void *scratch = malloc(scratch_size > 0 ? scratch_size : 1);
    enum { PROMPT = 5, STEPS = 300 };
    int64_t tokens[PROMPT + STEPS];
    uint32_t ref[PROMPT + STEPS];
    uint64_t rows;
    model_kv_t kv;

    for (int i = 0; i < PROMPT; i++)
        tokens[i] = 3 * i + 1;
    ck_assert_int_eq(
        model_generate(hash, tokens, PROMPT, STEPS, false, NULL, NULL, ref, NULL, &rows, NULL),
        SLOTD_OK);

    ck_assert_int_eq(cache_pool_acquire(p, hash, &o, &h), SLOTD_OK);
    ck_assert_int_eq(cache_pool_reserve(p, h, &o, PROMPT, &kv), SLOTD_OK);
    for (int i = 0; i < PROMPT; i++)
        model_run(hash, &kv, (uint32_t)tokens[i], scratch);
    ck_assert_int_eq(cache_pool_commit(p, h, &o, &kv), SLOTD_OK);
    for (int k = 0; k < STEPS - 1; k++) {
        uint32_t next;
        ck_assert_int_eq(cache_pool_reserve(p, h, &o, 1, &kv), SLOTD_OK);
        next = model_pick(hash, &kv, NULL);
        ck_assert_uint_eq(next, ref[PROMPT + k]);
        model_run(hash, &kv, next, scratch);
        ck_assert_int_eq(cache_pool_commit(p, h, &o, &kv), SLOTD_OK);
    }
    ck_assert_uint_eq(model_pick(hash, &kv, NULL), ref[PROMPT + STEPS - 1]);
    ck_assert_uint_eq(cache_pool_entries(p), PROMPT + STEPS - 1);
    sound(p);
    ck_assert_int_eq(cache_pool_release(p, h, &o, NULL), SLOTD_OK);

    /* tiny: generate([0,1,2], 5) gives [0,1,2,4,0,0,0,0] (docs/models.md). */
    {
        const uint32_t golden[] = {0, 1, 2, 4, 0, 0, 0, 0};
        const int64_t prompt[] = {0, 1, 2};
        const double first[] = {-0.215893, 0.026816, -0.396466, 0.115424, 0.344289, 0.245721};
        double logits[6];
        uint32_t got[8];
        uint32_t n = 3;

        ck_assert_int_eq(cache_pool_acquire(p, tiny, &o, &h), SLOTD_OK);
        ck_assert_int_eq(cache_pool_reserve(p, h, &o, 3, &kv), SLOTD_OK);
        for (int i = 0; i < 3; i++) {
            model_run(tiny, &kv, (uint32_t)prompt[i], scratch);
            got[i] = (uint32_t)prompt[i];
        }
        ck_assert_int_eq(cache_pool_commit(p, h, &o, &kv), SLOTD_OK);
        got[n] = model_pick(tiny, &kv, logits);
        for (int i = 0; i < 6; i++)
            ck_assert_double_eq_tol(logits[i], first[i], 1e-9);
        for (n = 4; n < 8; n++) {
            ck_assert_int_eq(cache_pool_reserve(p, h, &o, 1, &kv), SLOTD_OK);
            model_run(tiny, &kv, got[n - 1], scratch);
            ck_assert_int_eq(cache_pool_commit(p, h, &o, &kv), SLOTD_OK);
            got[n] = model_pick(tiny, &kv, NULL);
        }
        for (int i = 0; i < 8; i++)
            ck_assert_uint_eq(got[i], golden[i]);
        ck_assert_uint_eq(stats(p).bytes_used, slot_bytes(tiny, blocks_for(tiny, 8)));
        ck_assert_int_eq(cache_pool_release(p, h, &o, &n), SLOTD_OK);
        ck_assert_uint_eq(n, 7);
    }
    sound(p);
    free(scratch);
}
END_TEST

/* The reference picks after `seq` (n of them): model_generate() uncached. */
static void ref_picks(const model_t *m, const int64_t *seq, size_t len, uint32_t n, uint32_t *out)
{
    uint32_t *all = malloc((len + n) * sizeof(uint32_t));
    uint64_t rows;

    ck_assert_ptr_nonnull(all);
    ck_assert_int_eq(model_generate(m, seq, len, n, false, NULL, NULL, all, NULL, &rows, NULL),
                     SLOTD_OK);
    memcpy(out, all + len, n * sizeof(uint32_t));
    free(all);
}

/* A step of `s`, checked against the reference after `seq` (len tokens),
 * which it then extends. */
static void step_ref(cache_pool_t *p, cache_session_t *s, int64_t *seq, size_t *len, void *scratch)
{
    uint32_t want, got;
    double logits[512];
    slotd_error_t e;

    ref_picks(s->model, seq, *len, 1, &want);
    ck_assert_int_eq(cache_session_step(p, s, 1, scratch, &got, logits, &e), SLOTD_OK);
    ck_assert_uint_eq(got, want);
    seq[(*len)++] = got;
    ck_assert_uint_eq(s->entries, *len);
}

/* cache_session_append() runs tokens as a prefill would: the next pick is
 * the reference's for the whole sequence; its errors change nothing.
 * cache_session_fork() gives a slot of its own with the same entries and
 * state: both pick the reference's next token, then go apart; the pool
 * counts both, and the checker finds it sound. */
START_TEST(test_session_append_fork)
{
    model_t *small = fx_model("small");
    cache_pool_t *p = fx_pool((size_t)16 << 20, 8);
    void *scratch = malloc(model_scratch_size(small));
    int64_t a[1024], b[1024];
    size_t na = 0, nb;
    cache_owner_t oa = owner(1, "a"), ob = owner(1, "b");
    cache_session_t sa, sb;
    slotd_error_t e;
    uint64_t used;

    ck_assert_ptr_nonnull(scratch);
    for (; na < 10; na++)
        a[na] = (int64_t)((na * 37 + 5) % 512);
    ck_assert_int_eq(cache_session_start(p, small, &oa, a, na, scratch, &sa, &e), SLOTD_OK);
    /* 70 tokens: more than one prefill batch, across blocks. */
    {
        int64_t t[70];
        uint32_t cached = 99;
        for (int i = 0; i < 70; i++)
            t[i] = a[na + (size_t)i] = (int64_t)((i * 91 + 3) % 512);
        ck_assert_int_eq(cache_session_append(p, &sa, t, 70, scratch, &cached, &e), SLOTD_OK);
        ck_assert_uint_eq(cached, 0);
        na += 70;
        ck_assert_uint_eq(sa.entries, na);
    }
    step_ref(p, &sa, a, &na, scratch);

    /* Errors: nothing moves. */
    used = stats(p).bytes_used;
    {
        int64_t bad[2] = {3, 512};
        static int64_t many[1024];
        ck_assert_int_eq(cache_session_append(p, &sa, bad, 0, scratch, NULL, &e),
                         SLOTD_EBAD_REQUEST);
        ck_assert_int_eq(cache_session_append(p, &sa, bad, 2, scratch, NULL, &e),
                         SLOTD_EBAD_REQUEST);
        ck_assert_ptr_nonnull(strstr(e.message, "tokens"));
        ck_assert_int_eq(cache_session_append(p, &sa, many, 1024 - na + 1, scratch, NULL, &e),
                         SLOTD_ECONTEXT_FULL);
    }
    ck_assert_uint_eq(sa.entries, na);
    ck_assert_uint_eq(cache_pool_entries(p), na);
    ck_assert_uint_eq(stats(p).bytes_used, used);
    step_ref(p, &sa, a, &na, scratch);

    /* The fork: the same bytes again, no model call. */
    used = stats(p).bytes_used;
    {
        uint64_t rows = model_rows(small);
        ck_assert_int_eq(cache_session_fork(p, &sa, &ob, &sb, &e), SLOTD_OK);
        ck_assert_uint_eq(model_rows(small), rows);
    }
    ck_assert_uint_eq(sb.entries, na);
    /* No block copied: only b's state is new. */
    ck_assert_uint_eq(stats(p).bytes_used, used + cache_pool_slot_bytes(small, 0));
    ck_assert_uint_gt(stats(p).shared_blocks, 0);
    ck_assert_uint_eq(stats(p).live_slots, 2);
    sound(p);
    memcpy(b, a, na * sizeof(int64_t));
    nb = na;
    step_ref(p, &sb, b, &nb, scratch);
    step_ref(p, &sa, a, &na, scratch);
    ck_assert_int_eq(a[na - 1], b[nb - 1]);
    /* Apart: an append to one only. */
    {
        int64_t t[3] = {7, 8, 9};
        ck_assert_int_eq(cache_session_append(p, &sb, t, 3, scratch, NULL, &e), SLOTD_OK);
        memcpy(b + nb, t, sizeof(t));
        nb += 3;
    }
    step_ref(p, &sa, a, &na, scratch);
    step_ref(p, &sb, b, &nb, scratch);
    /* The parent gone, the fork goes on. */
    ck_assert_int_eq(cache_session_finish(p, &sa, NULL), SLOTD_OK);
    step_ref(p, &sb, b, &nb, scratch);
    sound(p);
    ck_assert_int_eq(cache_session_finish(p, &sb, NULL), SLOTD_OK);
    ck_assert_uint_eq(stats(p).bytes_used, 0);
    free(scratch);
}
END_TEST

/* A fork needs a slot and a state, nothing more: with the pool too full
 * for a state it is cache_full and holds nothing.  The first step of a
 * fork whose tail block is shared copies that block first: with no room
 * for it, that step is cache_full and changes nothing, and once room is
 * made it picks what the parent would. */
START_TEST(test_session_fork_full)
{
    model_t *small = fx_model("small");
    cache_pool_t *p = fx_pool((size_t)1 << 20, 8);
    void *scratch = malloc(model_scratch_size(small));
    int64_t a[1024], b[1024], c[1024];
    size_t na = 150, nb, nc = 1;
    cache_owner_t oa = owner(1, "a"), ob = owner(1, "b"), oc = owner(1, "c");
    cache_session_t sa, sb, sc;
    cache_pool_stats_t before;
    slotd_error_t e;
    uint32_t tok;
    int rc;

    ck_assert_ptr_nonnull(scratch);
    for (size_t i = 0; i < na; i++)
        a[i] = (int64_t)i;
    ck_assert_int_eq(cache_session_start(p, small, &oa, a, na, scratch, &sa, &e), SLOTD_OK);
    ck_assert_uint_ne(na % 16, 0); /* the tail is partly filled: shared by a fork */
    before = stats(p);
    ck_assert_int_eq(cache_session_fork(p, &sa, &ob, &sb, &e), SLOTD_OK);
    ck_assert_uint_eq(stats(p).bytes_used, before.bytes_used + cache_pool_slot_bytes(small, 0));
    memcpy(b, a, na * sizeof a[0]);
    nb = na;
    /* c takes every byte left. */
    c[0] = 1;
    ck_assert_int_eq(cache_session_start(p, small, &oc, c, nc, scratch, &sc, &e), SLOTD_OK);
    while ((rc = cache_session_step(p, &sc, 1, scratch, &tok, NULL, &e)) == SLOTD_OK)
        c[nc++] = tok;
    ck_assert_int_eq(rc, SLOTD_ECACHE_FULL);
    /* Forks until refused (the states no longer fit, or the slots run
     * out): the refusal changes nothing. */
    {
        cache_session_t sd[8];
        cache_owner_t od[8];
        int nd = 0;
        cache_pool_stats_t now;

        for (;;) {
            char id[8];

            snprintf(id, sizeof id, "d%d", nd);
            od[nd] = owner(1, id);
            before = stats(p);
            rc = cache_session_fork(p, &sa, &od[nd], &sd[nd], &e);
            if (rc != SLOTD_OK)
                break;
            nd++;
            ck_assert_int_lt(nd, 8);
        }
        ck_assert_int_eq(rc, SLOTD_ECACHE_FULL);
        now = stats(p);
        stats_eq(&before, &now);
        sound(p);
        while (nd > 0) {
            nd--;
            ck_assert_int_eq(cache_session_finish(p, &sd[nd], NULL), SLOTD_OK);
        }
        /* c takes back what the forks' states left. */
        while (cache_session_step(p, &sc, 1, scratch, &tok, NULL, &e) == SLOTD_OK)
            c[nc++] = tok;
        /* b's first step must copy the shared tail, a block of c's class:
         * no room, and nothing changes. */
        before = stats(p);
        ck_assert_int_eq(cache_session_step(p, &sb, 1, scratch, &tok, NULL, &e),
                         SLOTD_ECACHE_FULL);
        ck_assert_uint_eq(sb.entries, nb);
        now = stats(p);
        stats_eq(&before, &now);
        sound(p);
    }
    /* Room again: b and a each pick the reference's next token. */
    ck_assert_int_eq(cache_session_finish(p, &sc, NULL), SLOTD_OK);
    step_ref(p, &sb, b, &nb, scratch);
    step_ref(p, &sa, a, &na, scratch);
    ck_assert_int_eq(a[na - 1], b[nb - 1]);
    sound(p);
    ck_assert_uint_ge(stats(p).tail_copies, 1);
    ck_assert_int_eq(cache_session_finish(p, &sa, NULL), SLOTD_OK);
    ck_assert_int_eq(cache_session_finish(p, &sb, NULL), SLOTD_OK);
    ck_assert_uint_eq(stats(p).bytes_used, 0);
    sound(p);
    free(scratch);
}
END_TEST

/* A step of `s` checked against a fresh heap-chain computation of the
 * whole sequence (model_generate(), cached: each position run once):
 * the same pick and, for attn, bit for bit the same rounded logits. */
static void step_fresh(cache_pool_t *p, cache_session_t *s, int64_t *seq, size_t *len,
                       void *scratch)
{
    uint32_t V = model_vocab(s->model), got;
    uint32_t *all = malloc((*len + 1) * sizeof(uint32_t));
    double *want = calloc(V, sizeof(double)), *have = calloc(V, sizeof(double));
    slotd_error_t e;

    ck_assert(all != NULL && want != NULL && have != NULL);
    ck_assert_int_eq(
        model_generate(s->model, seq, *len, 1, true, NULL, NULL, all, want, NULL, NULL), SLOTD_OK);
    {
        int rc = cache_session_step(p, s, 1, scratch, &got, have, &e);
        ck_assert_msg(rc == SLOTD_OK, "step: %d %s", rc, e.message);
    }
    ck_assert_uint_eq(got, all[*len]);
    if (model_family(s->model) == MODEL_FAMILY_ATTN)
        ck_assert_mem_eq(want, have, V * sizeof(double));
    seq[(*len)++] = got;
    ck_assert_uint_eq(s->entries, *len);
    free(all);
    free(want);
    free(have);
}

/* A fork of a 1000-entry small session (and of shorter ones, of small and
 * hash): no model call, the pool's bytes grow by one state (less than one
 * block), every block that holds an entry is shared.  Then the parent, the fork and a fork of the fork are
 * stepped alternately against the reference, finished in every order of
 * three, the checker sound after each call, and every byte comes back. */
START_TEST(test_fork_shares_blocks)
{
    model_t *small = fx_model("small"), *hash = fx_model("hash");
    const model_t *ms[2] = {small, hash};
    cache_pool_t *p = fx_pool((size_t)64 << 20, 8);
    void *scratch = malloc(model_scratch_size(small) > model_scratch_size(hash)
                               ? model_scratch_size(small)
                               : model_scratch_size(hash));
    static const int order[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                    {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    static int64_t seq[3][1100];

    ck_assert_ptr_nonnull(scratch);
    for (int mi = 0; mi < 2; mi++) {
        const model_t *m = ms[mi];
        for (int o = 0; o < 6; o++) {
            cache_owner_t ow[3] = {owner(1, "a"), owner(1, "b"), owner(2, "c")};
            cache_session_t ss[3];
            size_t len[3];
            uint32_t V = model_vocab(m);
            /* 1000: the target's fork; then a partly filled tail, and a full one. */
            size_t n0 = o == 0 ? 1000 : o % 2 == 0 ? 200 : 192;
            uint64_t rows, g, used, nblocks;
            slotd_error_t e;
            model_kv_t kv;

            for (size_t i = 0; i < n0; i++)
                seq[0][i] = (int64_t)((i * 131 + 7) % V);
            ck_assert_int_eq(cache_session_start(p, m, &ow[0], seq[0], n0, scratch, &ss[0], &e),
                             SLOTD_OK);
            len[0] = n0;
            ck_assert_int_eq(cache_pool_reserve(p, ss[0].handle, &ow[0], 0, &kv), SLOTD_OK);
            nblocks = model_chain_blocks(m, (uint32_t)n0, 1, NULL);
            used = stats(p).bytes_used;
            rows = model_rows(m);
            g = model_g_calls(m);
            ck_assert_int_eq(cache_session_fork(p, &ss[0], &ow[1], &ss[1], &e), SLOTD_OK);
            ck_assert_uint_eq(model_rows(m), rows);
            ck_assert_uint_eq(model_g_calls(m), g);
            ck_assert_uint_eq(stats(p).bytes_used, used + cache_pool_slot_bytes(m, 0));
            ck_assert_uint_lt(stats(p).bytes_used - used, model_block_bytes(m));
            ck_assert_uint_eq(stats(p).shared_blocks, nblocks);
            ck_assert_uint_eq(stats(p).entries, 2 * n0);
            ck_assert_uint_eq(ss[1].entries, n0);
            sound(p);
            memcpy(seq[1], seq[0], n0 * sizeof seq[0][0]);
            len[1] = n0;
            step_fresh(p, &ss[1], seq[1], &len[1], scratch);
            /* A fork of the fork, on another connection's key. */
            ck_assert_int_eq(cache_session_fork(p, &ss[1], &ow[2], &ss[2], &e), SLOTD_OK);
            memcpy(seq[2], seq[1], len[1] * sizeof seq[0][0]);
            len[2] = len[1];
            sound(p);
            for (int k = 0; k < (o == 0 ? 2 : 10); k++) {
                int w = (k * 7 + o) % 3;
                step_fresh(p, &ss[w], seq[w], &len[w], scratch);
                if (k % 5 == 4) {
                    int64_t t[2] = {(int64_t)(k % V), (int64_t)((k * 3) % V)};
                    ck_assert_int_eq(cache_session_append(p, &ss[w], t, 2, scratch, NULL, &e),
                                     SLOTD_OK);
                    memcpy(seq[w] + len[w], t, sizeof t);
                    len[w] += 2;
                }
                sound(p);
            }
            for (int k = 0; k < 3; k++) {
                int w = order[o][k];
                ck_assert_int_eq(cache_session_finish(p, &ss[w], NULL), SLOTD_OK);
                sound(p);
                for (int r = k + 1; r < 3; r++)
                    step_fresh(p, &ss[order[o][r]], seq[order[o][r]], &len[order[o][r]], scratch);
                sound(p);
            }
            ck_assert_uint_eq(stats(p).bytes_used, 0);
            ck_assert_uint_eq(stats(p).shared_blocks, 0);
        }
    }
    free(scratch);
}
END_TEST

/* The memory target: the pool bytes a live slot holds (its blocks and its
 * state, at their strides, as cache_pool_stats() counts them) are at most
 * 1.10 x entries x entry size + 512 bytes at every length from 1 to
 * max_ctx, for every model; and they are exactly the blocks of the chain's
 * plan, so the figure is the memory the arena gives up. */
START_TEST(test_slot_bytes_bound)
{
    model_t *hash = fx_model("hash"), *tiny = fx_model("tiny"), *small = fx_model("small"),
            *base = fx_model("base");
    model_t *ms[] = {hash, tiny, small, base};
    cache_pool_t *p = fx_pool((size_t)160 << 20, 4);
    cache_owner_t o = owner(1, "bound");

    for (size_t i = 0; i < 4; i++) {
        const model_t *m = ms[i];
        uint64_t es = model_entry_size(m);
        cache_handle_t h;

        ck_assert_int_eq(cache_pool_acquire(p, m, &o, &h), SLOTD_OK);
        for (uint32_t e = 1; e <= model_max_ctx(m); e++) {
            cache_pool_stats_t st;

            ck_assert_int_eq(grow(p, h, &o, 1), SLOTD_OK);
            st = stats(p);
            ck_assert_uint_eq(st.entries, e);
            ck_assert_uint_eq(st.bytes_used, slot_bytes(m, blocks_for(m, e)));
            ck_assert_msg(10 * st.bytes_used <= 11 * (uint64_t)e * es + 5120,
                          "%s: %u entries of %llu bytes hold %llu pool bytes", model_name(m), e,
                          (unsigned long long)es, (unsigned long long)st.bytes_used);
            if (e % 512 == 0 || e == model_max_ctx(m))
                sound(p);
        }
        ck_assert_int_eq(cache_pool_release(p, h, &o, NULL), SLOTD_OK);
        ck_assert_uint_eq(stats(p).bytes_used, 0);
    }
    sound(p);
}
END_TEST

/* Pages hold whole blocks of every capacity a chain uses, with little
 * left over: nothing for hash (power-of-two strides), under 16 headers'
 * worth (1 KiB) for small and base, whose pages hold 16 one-position
 * blocks. */
START_TEST(test_pages_fit_blocks)
{
    static const char *names[] = {"hash", "tiny", "small", "base"};

    for (size_t i = 0; i < 4; i++) {
        model_t *m = model(names[i]);
        const model_t *models[] = {m};
        cache_pool_t *p = pool(4 * page_for(models, 1), 4, models, 1);
        size_t page = cache__pool_page_size(p);

        ck_assert_uint_eq(page, page_for(models, 1));
        for (uint32_t b = 0; b < blocks_for(m, model_max_ctx(m)); b++) {
            size_t stride = round_align(model_block_bytes_for(m, model_block_capacity(m, b)));
            size_t left = page % stride;
            ck_assert_msg(left < (model_family(m) == MODEL_FAMILY_HASH ? 1 : 1024),
                          "%s: blocks of %u positions leave %zu of a %zu-byte page", names[i],
                          model_block_capacity(m, b), left, page);
        }
        cache_pool_destroy(p);
        model_destroy(m);
    }
}
END_TEST

/* ---- Release ---- */

START_TEST(test_release_returns_everything)
{
    model_t *hash = fx_model("hash"), *tiny = fx_model("tiny"), *small = fx_model("small");
    cache_pool_t *p = fx_pool((size_t)8 << 20, 16);
    const model_t *use[] = {hash, tiny, small, hash, small, tiny};
    const uint32_t grow_by[] = {1000, 7, 100, 64, 16, 8};
    cache_handle_t h[6];
    cache_owner_t o[6];
    uint64_t total = 0;

    for (int i = 0; i < 6; i++) {
        char id[16];
        snprintf(id, sizeof id, "r%d", i);
        o[i] = owner((uint64_t)i, id);
        ck_assert_int_eq(cache_pool_acquire(p, use[i], &o[i], &h[i]), SLOTD_OK);
        ck_assert_int_eq(grow(p, h[i], &o[i], grow_by[i]), SLOTD_OK);
        total += grow_by[i];
        sound(p);
    }
    ck_assert_uint_eq(stats(p).entries, total);
    ck_assert_uint_lt(cache__pool_pages_free(p), cache__pool_pages(p));
    for (int i = 0; i < 6; i++) {
        uint32_t had = 0;
        ck_assert_int_eq(cache_pool_release(p, h[i], &o[i], &had), SLOTD_OK);
        ck_assert_uint_eq(had, grow_by[i]);
        total -= had;
        ck_assert_uint_eq(stats(p).entries, total);
        sound(p);
    }
    ck_assert_uint_eq(stats(p).bytes_used, 0);
    ck_assert_uint_eq(stats(p).bytes_free, (size_t)8 << 20);
    ck_assert_uint_eq(stats(p).live_slots, 0);
    ck_assert_uint_eq(cache_pool_entries(p), 0);
    /* Every page is back on the free-page list. */
    ck_assert_uint_eq(cache__pool_pages_free(p), cache__pool_pages(p));
}
END_TEST

START_TEST(test_trim_gives_pages_back)
{
    model_t *tiny = fx_model("tiny"), *small = fx_model("small");
    cache_pool_t *p = fx_pool((size_t)8 << 20, 64);
    size_t page = cache__pool_page_size(p);
    cache_handle_t h[8];
    cache_owner_t o[8];

    /* Never-written pages are not held: nothing to give back. */
    ck_assert_uint_eq(cache_pool_held_free_bytes(p), 0);
    ck_assert_uint_eq(cache_pool_trim(p, 0), 0);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 8; i++) {
            char id[16];
            snprintf(id, sizeof id, "t%d", i);
            o[i] = owner((uint64_t)i, id);
            ck_assert_int_eq(cache_pool_acquire(p, small, &o[i], &h[i]), SLOTD_OK);
            ck_assert_int_eq(grow(p, h[i], &o[i], 96), SLOTD_OK);
        }
        uint32_t used = cache__pool_pages(p) - cache__pool_pages_free(p);
        ck_assert_uint_gt(used, 4);
        /* A trim while they are live gives back only what is free. */
        uint64_t held0 = cache_pool_held_free_bytes(p);
        (void)cache_pool_trim(p, 0);
        ck_assert_uint_le(cache_pool_held_free_bytes(p), held0);
        sound(p);
        for (int i = 0; i < 8; i++) {
            uint32_t had;
            ck_assert_int_eq(cache_pool_release(p, h[i], &o[i], &had), SLOTD_OK);
        }
        /* (Blocks parked in this thread's cache keep their pages until
         * taken back, as cache__pool_pages_free() does.) */
        ck_assert_uint_eq(cache__pool_pages_free(p), cache__pool_pages(p));
        ck_assert_uint_eq(cache_pool_held_free_bytes(p), (uint64_t)used * page);
        /* Freed since the last trim: kept until the next one. */
        ck_assert_uint_eq(cache_pool_trim(p, 0), 0);
        ck_assert_uint_eq(cache_pool_held_free_bytes(p), (uint64_t)used * page);
        sound(p);
        /* The next keeps the `keep_bytes` most recent (round 1: 2 pages),
         * and gives the rest back. */
        uint64_t keep = round == 1 ? 2 * page : 0;
        ck_assert_uint_eq(cache_pool_trim(p, keep), (uint64_t)used * page - keep);
        ck_assert_uint_eq(cache_pool_held_free_bytes(p), keep);
        sound(p);
        ck_assert_uint_eq(cache_pool_trim(p, 0), keep);
        ck_assert_uint_eq(cache_pool_held_free_bytes(p), 0);
        sound(p);
    }
    /* Pages given back serve again, their models' results unchanged. */
    cache_owner_t ot = owner(99, "run");
    cache_handle_t ht;
    ck_assert_int_eq(cache_pool_acquire(p, tiny, &ot, &ht), SLOTD_OK);
    ck_assert_int_eq(grow(p, ht, &ot, 5), SLOTD_OK);
    sound(p);
    uint32_t had;
    ck_assert_int_eq(cache_pool_release(p, ht, &ot, &had), SLOTD_OK);
    ck_assert_uint_eq(had, 5);
}
END_TEST

/* ---- Refusals ---- */

START_TEST(test_slot_count_exhausted)
{
    model_t *hash = fx_model("hash");
    cache_pool_t *p = fx_pool((size_t)4 << 20, 3);
    cache_owner_t o[4] = {owner(1, "a"), owner(1, "b"), owner(2, "a"), owner(2, "b")};
    cache_handle_t h[4], spare = {77, 77};
    view_t before[3];
    cache_pool_stats_t st, after;

    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(cache_pool_acquire(p, hash, &o[i], &h[i]), SLOTD_OK);
        ck_assert_int_eq(grow(p, h[i], &o[i], 10u * (uint32_t)(i + 1)), SLOTD_OK);
        before[i] = view(p, h[i], &o[i]);
    }
    st = stats(p);
    ck_assert_uint_lt(st.bytes_used, st.bytes_capacity / 2); /* bytes are not the limit */
    h[3] = spare;
    ck_assert_int_eq(cache_pool_acquire(p, hash, &o[3], &h[3]), SLOTD_ECACHE_FULL);
    ck_assert_uint_eq(h[3].slot, 77);
    ck_assert_uint_eq(h[3].gen, 77);
    after = stats(p);
    stats_eq(&st, &after);
    for (int i = 0; i < 3; i++) {
        view_t v = view(p, h[i], &o[i]);
        view_eq(&before[i], &v);
    }
    sound(p);

    /* Freeing one makes room again. */
    ck_assert_int_eq(cache_pool_release(p, h[1], &o[1], NULL), SLOTD_OK);
    ck_assert_int_eq(cache_pool_acquire(p, hash, &o[3], &h[3]), SLOTD_OK);
    ck_assert_int_eq(grow(p, h[3], &o[3], 5), SLOTD_OK);
    sound(p);
}
END_TEST

/* The budget runs out through the pages (the arena is no larger than the
 * budget, so pages always give out before used + needed passes capacity).
 * With six pages, one slot of "small" grows block by block until a block's
 * class finds no object and no free page; every refusal is all or nothing,
 * room already held is still handed out, states run out the same way, and
 * releasing makes room again. */
START_TEST(test_budget_exhausted)
{
    model_t *small = fx_model("small");
    cache_pool_t *p;
    size_t page;
    cache_owner_t a = owner(1, "a"), b = owner(1, "b"), c = owner(2, "c");
    cache_handle_t ha, hb, hc, hs[160];
    cache_owner_t os[160];
    cache_pool_stats_t st, after;
    view_t va, vb;
    model_kv_t kv;
    uint32_t nstates = 0, na;

    page = fx_page();
    p = fx_pool(6 * page, 200);
    ck_assert_uint_eq(cache__pool_page_size(p), page);
    ck_assert_uint_eq(cache__pool_pages(p), 6);
    ck_assert_uint_eq(page / round_align(model_block_bytes(small)), 1);

    ck_assert_int_eq(cache_pool_acquire(p, small, &b, &hb), SLOTD_OK);
    ck_assert_int_eq(grow(p, hb, &b, 1), SLOTD_OK);
    vb = view(p, hb, &b);
    na = fill_slot(p, small, &a, &ha);
    ck_assert_uint_gt(na, 10);
    ck_assert_uint_lt(room_of(small, na), model_max_ctx(small));
    ck_assert_uint_eq(cache__pool_pages_free(p), 0);
    va = view(p, ha, &a);
    ck_assert_uint_eq(va.nblocks, na);
    ck_assert_uint_eq(va.kv.len, room_of(small, na));
    sound(p);

    /* On reserve, all or nothing: the next block, or several, do not fit. */
    st = stats(p);
    ck_assert_int_eq(cache_pool_reserve(p, ha, &a, 1, &kv), SLOTD_ECACHE_FULL);
    ck_assert_int_eq(cache_pool_reserve(p, ha, &a, 40, &kv), SLOTD_ECACHE_FULL);
    ck_assert_int_eq(cache_pool_reserve(p, hb, &b, 200, &kv), SLOTD_ECACHE_FULL);
    after = stats(p);
    stats_eq(&st, &after);
    {
        view_t v = view(p, ha, &a);
        view_eq(&va, &v);
        v = view(p, hb, &b);
        view_eq(&vb, &v);
    }
    ck_assert_uint_eq(cache__pool_pages_free(p), 0);
    /* Room already held is still handed out: b's first block is full, but
     * a reserve of nothing (and of its own room) succeeds. */
    ck_assert_int_eq(cache_pool_reserve(p, hb, &b, 0, &kv), SLOTD_OK);
    after = stats(p);
    stats_eq(&st, &after);
    sound(p);

    /* On acquire: states fill the state page, then there is none. */
    while (nstates < 160) {
        char id[16];
        snprintf(id, sizeof id, "s%u", nstates);
        os[nstates] = owner(5, id);
        if (cache_pool_acquire(p, small, &os[nstates], &hs[nstates]) != SLOTD_OK)
            break;
        nstates++;
    }
    ck_assert_uint_eq(nstates + 2, page / round_align(model_state_size(small)));
    st = stats(p);
    ck_assert_uint_lt(st.bytes_used, st.bytes_capacity); /* free bytes, none usable */
    ck_assert_uint_lt(st.live_slots, st.max_slots);
    hc.slot = 99;
    ck_assert_int_eq(cache_pool_acquire(p, small, &c, &hc), SLOTD_ECACHE_FULL);
    ck_assert_uint_eq(hc.slot, 99);
    after = stats(p);
    stats_eq(&st, &after);
    sound(p);

    /* Freeing makes room again: one state frees one state object... */
    ck_assert_int_eq(cache_pool_release(p, hs[0], &os[0], NULL), SLOTD_OK);
    ck_assert_int_eq(cache_pool_acquire(p, small, &c, &hc), SLOTD_OK);
    /* ...and a's blocks free the pages c's 40 positions need. */
    ck_assert_int_eq(cache_pool_reserve(p, hc, &c, 40, &kv), SLOTD_ECACHE_FULL);
    ck_assert_int_eq(cache_pool_release(p, ha, &a, NULL), SLOTD_OK);
    ck_assert_int_eq(grow(p, hc, &c, 40), SLOTD_OK);
    ck_assert_uint_eq(view(p, hc, &c).nblocks, blocks_for(small, 40));
    sound(p);
    for (uint32_t i = 1; i < nstates; i++)
        ck_assert_int_eq(cache_pool_release(p, hs[i], &os[i], NULL), SLOTD_OK);
    ck_assert_int_eq(cache_pool_release(p, hb, &b, NULL), SLOTD_OK);
    ck_assert_int_eq(cache_pool_release(p, hc, &c, NULL), SLOTD_OK);
    ck_assert_uint_eq(stats(p).bytes_used, 0);
    ck_assert_uint_eq(cache__pool_pages_free(p), 6);
    sound(p);
}
END_TEST

/* ---- Ownership ---- */

START_TEST(test_stale_handles)
{
    model_t *hash = fx_model("hash");
    cache_pool_t *p = fx_pool((size_t)2 << 20, 1);
    cache_owner_t a = owner(1, "req"), b = owner(2, "req");
    cache_handle_t ha, hb;
    model_kv_t kv, poisoned;
    view_t vb;
    cache_pool_stats_t st, after;

    ck_assert_int_eq(cache_pool_acquire(p, hash, &a, &ha), SLOTD_OK);
    ck_assert_int_eq(grow(p, ha, &a, 10), SLOTD_OK);
    ck_assert_int_eq(cache_pool_release(p, ha, &a, NULL), SLOTD_OK);

    /* Stale after release. */
    ck_assert_int_eq(cache_pool_reserve(p, ha, &a, 1, &kv), SLOTD_ESTALE);
    ck_assert_int_eq(cache_pool_commit(p, ha, &a, &kv), SLOTD_ESTALE);
    ck_assert_int_eq(cache_pool_release(p, ha, &a, NULL), SLOTD_ESTALE);

    /* Stale after reuse by another owner: one slot, so b gets the same one. */
    ck_assert_int_eq(cache_pool_acquire(p, hash, &b, &hb), SLOTD_OK);
    ck_assert_uint_eq(hb.slot, ha.slot);
    ck_assert_uint_ne(hb.gen, ha.gen);
    ck_assert_int_eq(grow(p, hb, &b, 100), SLOTD_OK);
    vb = view(p, hb, &b);
    st = stats(p);
    memset(&poisoned, 0xA5, sizeof poisoned);
    kv = poisoned;
    ck_assert_int_eq(cache_pool_reserve(p, ha, &a, 1, &kv), SLOTD_ESTALE);
    ck_assert_mem_eq(&kv, &poisoned, sizeof kv); /* nothing of b's handed out */
    /* The old handle with the new owner, and the new handle with the old. */
    ck_assert_int_eq(cache_pool_reserve(p, ha, &b, 1, &kv), SLOTD_ESTALE);
    ck_assert_int_eq(cache_pool_reserve(p, hb, &a, 1, &kv), SLOTD_ESTALE);
    ck_assert_mem_eq(&kv, &poisoned, sizeof kv);
    kv = vb.kv;
    kv.len += 1;
    ck_assert_int_eq(cache_pool_commit(p, ha, &a, &kv), SLOTD_ESTALE);
    ck_assert_int_eq(cache_pool_commit(p, hb, &a, &kv), SLOTD_ESTALE);
    ck_assert_int_eq(cache_pool_release(p, ha, &a, NULL), SLOTD_ESTALE);
    ck_assert_int_eq(cache_pool_release(p, ha, &b, NULL), SLOTD_ESTALE);
    ck_assert_int_eq(cache_pool_release(p, hb, &a, NULL), SLOTD_ESTALE);
    after = stats(p);
    stats_eq(&st, &after);
    {
        view_t v = view(p, hb, &b);
        view_eq(&vb, &v);
    }

    /* Handles that never named a tenancy. */
    ck_assert_int_eq(cache_pool_reserve(p, (cache_handle_t){5, hb.gen}, &b, 1, &kv), SLOTD_ESTALE);
    ck_assert_int_eq(cache_pool_reserve(p, (cache_handle_t){UINT32_MAX, hb.gen}, &b, 1, &kv),
                     SLOTD_ESTALE);
    ck_assert_int_eq(cache_pool_reserve(p, (cache_handle_t){hb.slot, hb.gen + 1}, &b, 1, &kv),
                     SLOTD_ESTALE);
    ck_assert_int_eq(cache_pool_reserve(p, (cache_handle_t){hb.slot, 0}, &b, 1, &kv), SLOTD_ESTALE);
    ck_assert_int_eq(cache_pool_release(p, hb, &b, NULL), SLOTD_OK);
    sound(p);
}
END_TEST

START_TEST(test_wrong_owner)
{
    model_t *hash = fx_model("hash");
    cache_pool_t *p = fx_pool((size_t)2 << 20, 4);
    char longid[CACHE_ID_MAX + 1];
    cache_owner_t o, wrong_key, wrong_id, prefix, longer;
    cache_handle_t h;
    model_kv_t kv;
    cache_pool_stats_t st, after;

    memset(longid, 'x', CACHE_ID_MAX);
    longid[CACHE_ID_MAX] = '\0';
    o = owner(42, longid);
    wrong_key = owner(43, longid);
    longid[CACHE_ID_MAX - 1] = 'y';
    wrong_id = owner(42, longid); /* differs in the last character only */
    longid[CACHE_ID_MAX - 1] = '\0';
    prefix = owner(42, longid);
    longer = o; /* the same id, junk after its end: still the same owner */
    ck_assert_int_eq(cache_pool_acquire(p, hash, &o, &h), SLOTD_OK);
    ck_assert_int_eq(grow(p, h, &o, 3), SLOTD_OK);
    st = stats(p);
    ck_assert_int_eq(cache_pool_reserve(p, h, &wrong_key, 1, &kv), SLOTD_ESTALE);
    ck_assert_int_eq(cache_pool_reserve(p, h, &wrong_id, 1, &kv), SLOTD_ESTALE);
    ck_assert_int_eq(cache_pool_reserve(p, h, &prefix, 1, &kv), SLOTD_ESTALE);
    ck_assert_int_eq(cache_pool_commit(p, h, &wrong_key, &kv), SLOTD_ESTALE);
    ck_assert_int_eq(cache_pool_commit(p, h, &wrong_id, &kv), SLOTD_ESTALE);
    ck_assert_int_eq(cache_pool_release(p, h, &wrong_key, NULL), SLOTD_ESTALE);
    ck_assert_int_eq(cache_pool_release(p, h, &wrong_id, NULL), SLOTD_ESTALE);
    after = stats(p);
    stats_eq(&st, &after);
    ck_assert_int_eq(cache_pool_reserve(p, h, &longer, 1, &kv), SLOTD_OK);
    ck_assert_uint_eq(kv.len, 3);
    ck_assert_int_eq(cache_pool_release(p, h, &o, NULL), SLOTD_OK);
    sound(p);
}
END_TEST

START_TEST(test_double_release)
{
    model_t *hash = fx_model("hash");
    cache_pool_t *p = fx_pool((size_t)2 << 20, 4);
    cache_owner_t a = owner(1, "a"), b = owner(1, "b");
    cache_handle_t ha, hb;
    cache_pool_stats_t st, after;
    uint32_t had = 1234;
    view_t vb;

    ck_assert_int_eq(cache_pool_acquire(p, hash, &a, &ha), SLOTD_OK);
    ck_assert_int_eq(grow(p, ha, &a, 70), SLOTD_OK);
    ck_assert_int_eq(cache_pool_acquire(p, hash, &b, &hb), SLOTD_OK);
    ck_assert_int_eq(grow(p, hb, &b, 5), SLOTD_OK);
    vb = view(p, hb, &b);
    ck_assert_int_eq(cache_pool_release(p, ha, &a, &had), SLOTD_OK);
    ck_assert_uint_eq(had, 70);
    st = stats(p);
    had = 1234;
    ck_assert_int_eq(cache_pool_release(p, ha, &a, &had), SLOTD_ESTALE);
    ck_assert_uint_eq(had, 1234);
    after = stats(p);
    stats_eq(&st, &after);
    /* The slot reused: the old handle still cannot release it. */
    ck_assert_int_eq(cache_pool_acquire(p, hash, &a, &ha), SLOTD_OK);
    {
        cache_handle_t old = {ha.slot, ha.gen - 2};
        ck_assert_int_eq(cache_pool_release(p, old, &a, NULL), SLOTD_ESTALE);
    }
    ck_assert_int_eq(cache_pool_release(p, ha, &a, NULL), SLOTD_OK);
    {
        view_t v = view(p, hb, &b);
        view_eq(&vb, &v);
    }
    ck_assert_int_eq(cache_pool_release(p, hb, &b, NULL), SLOTD_OK);
    ck_assert_uint_eq(stats(p).bytes_used, 0);
    sound(p);
}
END_TEST

/* Ids that match up to a word boundary, or differ only past it, or only in
 * their length, are told apart (the owner check compares whole words). */
START_TEST(test_owner_id_words)
{
    model_t *hash = fx_model("hash");
    cache_pool_t *p = fx_pool((size_t)2 << 20, 4);
    /* Lengths 0, 1, 7, 8, 9 and 15, 16: either side of the word boundaries. */
    static const char *ids[] = {"",
                                "a",
                                "abcdefg",
                                "abcdefgh",
                                "abcdefghi",
                                "abcdefgh\x01",
                                "abcdefghabcdefgh",
                                "abcdefghabcdefg"};
    const size_t nids = sizeof ids / sizeof ids[0];
    model_kv_t kv;

    for (size_t i = 0; i < nids; i++) {
        cache_owner_t o = owner(5, ids[i]);
        cache_handle_t h;

        /* Junk after the NUL of the acquiring id is not part of it. */
        memset(o.id + strlen(ids[i]) + 1, 'z', CACHE_ID_MAX - strlen(ids[i]));
        ck_assert_int_eq(cache_pool_acquire(p, hash, &o, &h), SLOTD_OK);
        for (size_t j = 0; j < nids; j++) {
            cache_owner_t q = owner(5, ids[j]);

            memset(q.id + strlen(ids[j]) + 1, j % 2 == 0 ? 0x7F : 'a',
                   CACHE_ID_MAX - strlen(ids[j]));
            ck_assert_msg(cache_pool_reserve(p, h, &q, 0, &kv) ==
                              (i == j ? SLOTD_OK : SLOTD_ESTALE),
                          "acquired as '%s', reserved as '%s'", ids[i], ids[j]);
        }
        ck_assert_int_eq(cache_pool_release(p, h, &o, NULL), SLOTD_OK);
    }
    sound(p);
}
END_TEST

/* ---- Thread caches ---- */

typedef struct filler {
    cache_pool_t *p;
    const model_t *m;
    uint64_t key;
    uint32_t blocks; /* blocks the slots got before the pool refused */
    uint32_t slots;
    uint64_t bytes_used;
    uint32_t bad; /* calls that failed (no Check assertions off the main thread) */
} filler_t;

/* Fills `f->p` with slots of `f->m`, one block a reserve, until the pool
 * refuses; notes what they got and the bytes used then; releases them. */
static void *fill_pool(void *arg)
{
    filler_t *f = arg;
    cache_handle_t h[256];
    cache_owner_t o[256];
    uint32_t n = 0;

    f->blocks = 0;
    for (;;) {
        char id[16];
        uint32_t got;

        if (n == 255) {
            f->bad++;
            break;
        }
        snprintf(id, sizeof id, "f%u", n);
        o[n] = owner(f->key, id);
        h[n] = (cache_handle_t){UINT32_MAX, 0}; /* stale, unless the acquire succeeds */
        got = fill_slot(f->p, f->m, &o[n], &h[n]);
        if (got == 0)
            break; /* h[n] is released below if the acquire succeeded */
        f->blocks += got;
        n++;
        if (room_of(f->m, got) + model_block_capacity(f->m, got) <= model_max_ctx(f->m))
            break; /* refused inside a slot */
    }
    f->slots = n;
    f->bytes_used = stats(f->p).bytes_used;
    for (uint32_t i = 0; i < n; i++)
        f->bad += cache_pool_release(f->p, h[i], &o[i], NULL) != SLOTD_OK;
    /* The last slot, if its acquire succeeded (else the handle is stale). */
    (void)cache_pool_release(f->p, h[n], &o[n], NULL);
    return NULL;
}

/* A thread that released its slots keeps some of their blocks parked in
 * its cache; another thread filling the pool must get every block the
 * budget holds all the same, and the figures must not count what is
 * parked. */
START_TEST(test_parked_blocks_do_not_refuse)
{
    model_t *tiny = fx_model("tiny");
    cache_pool_t *p = fx_pool(3 * fx_page(), 256);
    filler_t first = {p, tiny, 1, 0, 0, 0, 0}, second = {p, tiny, 2, 0, 0, 0, 0};
    pthread_t t;

    /* This thread fills the pool and releases: its cache keeps blocks. */
    fill_pool(&first);
    ck_assert_uint_gt(first.blocks, 0);
    sound(p);
    ck_assert_uint_eq(stats(p).bytes_used, 0);
    fill_pool(&first); /* parks again (sound() handed them back) */
    /* Another thread asks for the same: it gets as much. */
    ck_assert_int_eq(pthread_create(&t, NULL, fill_pool, &second), 0);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    ck_assert_uint_eq(first.bad + second.bad, 0);
    ck_assert_uint_eq(second.blocks, first.blocks);
    ck_assert_uint_eq(second.slots, first.slots);
    ck_assert_uint_eq(second.bytes_used, first.bytes_used);
    ck_assert_uint_eq(stats(p).bytes_used, 0);
    ck_assert_uint_eq(cache__pool_pages_free(p), cache__pool_pages(p));
    sound(p);
}
END_TEST

/* ---- Parked blocks and whole pages ---- */

typedef struct one_block {
    cache_pool_t *p;
    const model_t *m;
    cache_owner_t o;
    cache_handle_t h;
    int rc;
    const void *block;
} one_block_t;

/* On a thread of its own: a slot of one block, kept live. */
static void *take_one_block(void *arg)
{
    one_block_t *b = arg;
    model_kv_t kv;

    b->rc = cache_pool_acquire(b->p, b->m, &b->o, &b->h);
    if (b->rc == SLOTD_OK)
        b->rc = cache_pool_reserve(b->p, b->h, &b->o, model_block_capacity(b->m, 0), &kv);
    b->block = b->rc == SLOTD_OK ? kv.head : NULL;
    return NULL;
}

/* Runs the scenario; returns the hash reserve's answer.  This thread takes
 * tiny blocks until all but one object of their page are in its slots (the
 * last parked in its cache by the reserve's top-up); if `steal_first`,
 * a snapshot then takes parked blocks back.  Another thread takes one tiny
 * block and keeps it; then a hash block (another class) is asked for. */
static int frag_scenario(bool steal_first, bool *other_page)
{
    model_t *hash = model("hash"), *tiny = model("tiny");
    const model_t *models[] = {hash, tiny};
    cache_pool_t *p = pool(3 * page_for(models, 2), 64, models, 2);
    uint32_t per_page =
        (uint32_t)(cache__pool_page_size(p) / round_align(model_block_bytes_for(tiny, 2)));
    cache_handle_t h[64], hh;
    cache_owner_t o[64], ho = owner(9, "hash");
    one_block_t other = {p, tiny, owner(8, "other"), {0, 0}, 0, NULL};
    uint32_t nslots = 0, blocks = 0;
    int64_t page_a = -1;
    pthread_t t;
    model_kv_t kv;
    int rc;

    while (blocks < per_page - 1) {
        char id[16];

        snprintf(id, sizeof id, "t%u", nslots);
        o[nslots] = owner(1, id);
        ck_assert_int_eq(cache_pool_acquire(p, tiny, &o[nslots], &h[nslots]), SLOTD_OK);
        for (uint32_t i = 0; i < 4 && blocks < per_page - 1; i++, blocks++) {
            ck_assert_int_eq(grow(p, h[nslots], &o[nslots], 2), SLOTD_OK);
            ck_assert_int_eq(cache_pool_reserve(p, h[nslots], &o[nslots], 0, &kv), SLOTD_OK);
            if (page_a < 0)
                page_a = cache__pool_page_of(p, kv.head);
            ck_assert_int_eq(cache__pool_page_of(p, chain_at(&kv, i)), page_a);
        }
        nslots++;
    }
    if (steal_first)
        (void)stats(p);
    ck_assert_int_eq(pthread_create(&t, NULL, take_one_block, &other), 0);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    ck_assert_int_eq(other.rc, SLOTD_OK);
    *other_page = cache__pool_page_of(p, other.block) != page_a;

    ck_assert_int_eq(cache_pool_acquire(p, hash, &ho, &hh), SLOTD_OK);
    rc = cache_pool_reserve(p, hh, &ho, 30, &kv);
    if (rc != SLOTD_OK) {
        cache_pool_stats_t st = stats(p);
        fprintf(stderr, "frag: hash block refused: used %llu of %llu bytes, %u of %u pages free\n",
                (unsigned long long)st.bytes_used, (unsigned long long)st.bytes_capacity,
                cache__pool_pages_free(p), cache__pool_pages(p));
    }
    sound(p);
    cache_pool_destroy(p);
    model_destroy(hash);
    model_destroy(tiny);
    return rc;
}

/* A block parked in one thread's cache must not make another thread's
 * block take a fresh page that a pool without caches would have left free
 * (and so cost a third request, of another class, a refusal). */
START_TEST(test_parked_blocks_keep_pages_whole)
{
    bool other_page;

    /* Control: the parked block taken back first, as without caches. */
    ck_assert_int_eq(frag_scenario(true, &other_page), SLOTD_OK);
    ck_assert(!other_page);
    /* The same, with the block left parked. */
    ck_assert_int_eq(frag_scenario(false, &other_page), SLOTD_OK);
}
END_TEST

/* Random sessions of "small" and "tiny" grow and go in a pool of six
 * pages' budget.  With arena_factor 2 every refusal is one the counts
 * justify (used + needed > capacity), whatever holes the releases left;
 * with arena_factor 1 the same sequence meets refusals the bytes alone do
 * not justify, which is why the server maps the larger arena. */
static uint32_t refusals_beyond_bytes(unsigned factor)
{
    model_t *small = model("small"), *tiny = model("tiny");
    const model_t *models[] = {small, tiny};
    cache_pool_config_t cfg = {6 * page_for(models, 2), 256, models, 2, factor, false};
    cache_pool_t *p = NULL;
    struct {
        cache_handle_t h;
        cache_owner_t o;
        const model_t *m;
        uint32_t n;
        bool live;
    } s[64] = {{{0, 0}, {0, ""}, NULL, 0, false}};
    uint64_t x = 0x9E3779B97F4A7C15u;
    uint32_t beyond = 0, refused = 0;

    ck_assert_int_eq(cache_pool_create(&cfg, &p), SLOTD_OK);
    for (int op = 0; op < 4000; op++) {
        uint32_t i, add;
        cache_pool_stats_t st;
        uint64_t need;
        int rc;

        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        i = (uint32_t)(x % 64);
        if (!s[i].live) {
            char id[16];
            snprintf(id, sizeof id, "s%u", i);
            s[i].o = owner(1, id);
            s[i].m = x % 3 == 0 ? tiny : small;
            s[i].n = 0;
            st = stats(p);
            rc = cache_pool_acquire(p, s[i].m, &s[i].o, &s[i].h);
            need = round_align(model_state_size(s[i].m));
            s[i].live = rc == SLOTD_OK;
        } else if (x % 5 == 0) {
            ck_assert_int_eq(cache_pool_release(p, s[i].h, &s[i].o, NULL), SLOTD_OK);
            s[i].live = false;
            continue;
        } else {
            uint32_t max = model_max_ctx(s[i].m) - s[i].n;
            if (max == 0)
                continue;
            add = 1 + (uint32_t)((x >> 20) % (max < 40 ? max : 40));
            st = stats(p);
            need = slot_bytes(s[i].m, blocks_for(s[i].m, s[i].n + add)) -
                   slot_bytes(s[i].m, blocks_for(s[i].m, s[i].n));
            rc = grow(p, s[i].h, &s[i].o, add);
            if (rc == SLOTD_OK)
                s[i].n += add;
        }
        if (rc == SLOTD_OK)
            continue;
        ck_assert_int_eq(rc, SLOTD_ECACHE_FULL);
        refused++;
        if (st.bytes_used + need <= st.bytes_capacity && st.live_slots < st.max_slots)
            beyond++;
    }
    ck_assert_uint_gt(refused, 100); /* the sequence ran the pool out often */
    ck_assert_int_eq(cache__pool_check(p), 0);
    cache_pool_destroy(p);
    model_destroy(small);
    model_destroy(tiny);
    return beyond;
}

START_TEST(test_arena_factor_refuses_by_counts)
{
    ck_assert_uint_eq(refusals_beyond_bytes(2), 0);
    ck_assert_uint_gt(refusals_beyond_bytes(1), 0);
}
END_TEST

/* ---- Pages shared between classes ---- */

START_TEST(test_pages_move_between_classes)
{
    model_t *hash = fx_model("hash"), *small = fx_model("small");
    cache_pool_t *p = fx_pool(6 * fx_page(), 64);
    cache_owner_t a = owner(1, "small");
    cache_handle_t ha, hh[16];
    cache_owner_t oh[16];
    int64_t pages_of_small[64];
    uint32_t nsmall, nh = 0, nblocks_hash = 0;
    view_t va;

    ck_assert_uint_ne(model_block_bytes(hash), model_block_bytes(small));
    ck_assert_uint_eq(cache__pool_pages(p), 6);

    /* "small" takes every page: one for its state, the rest for blocks of
     * its first capacities. */
    nsmall = fill_slot(p, small, &a, &ha);
    ck_assert_uint_gt(nsmall, 5);
    ck_assert_uint_le(nsmall, 64);
    ck_assert_uint_eq(cache__pool_pages_free(p), 0);
    va = view(p, ha, &a);
    for (uint32_t i = 0; i < nsmall; i++) {
        const model_block_t *blk = chain_at(&va.kv, i);
        pages_of_small[i] = cache__pool_page_of(p, blk);
        ck_assert_int_ge(pages_of_small[i], 0);
        ck_assert_uint_eq(cache__pool_page_stride(p, (uint32_t)pages_of_small[i]),
                          round_align(model_block_bytes_for(small, blk->capacity)));
    }
    ck_assert_int_eq(cache_pool_release(p, ha, &a, NULL), SLOTD_OK);
    ck_assert_uint_eq(cache__pool_pages_free(p), 6);
    for (uint32_t i = 0; i < nsmall; i++)
        ck_assert_uint_eq(cache__pool_page_stride(p, (uint32_t)pages_of_small[i]), 0);

    /* "hash" now fills the same pages with its own, smaller blocks. */
    for (;;) {
        char id[16];
        uint32_t got;

        ck_assert_uint_lt(nh, 16);
        snprintf(id, sizeof id, "hash%u", nh);
        oh[nh] = owner(2, id);
        got = fill_slot(p, hash, &oh[nh], &hh[nh]);
        if (got == 0) {
            break;
        }
        nblocks_hash += got;
        nh++;
        if (got < blocks_for(hash, model_max_ctx(hash)) - 1)
            break;
    }
    ck_assert_uint_eq(cache__pool_pages_free(p), 0);
    ck_assert_uint_ge(nblocks_hash, 5 * (cache__pool_page_size(p) / model_block_bytes(hash)));
    for (uint32_t i = 0; i < nsmall; i++) {
        size_t stride = cache__pool_page_stride(p, (uint32_t)pages_of_small[i]);
        bool hash_class = stride == CACHE__ALIGN;
        for (uint32_t b = 0; b < blocks_for(hash, model_max_ctx(hash)); b++)
            hash_class |=
                stride == round_align(model_block_bytes_for(hash, model_block_capacity(hash, b)));
        ck_assert(hash_class);
    }
    sound(p);

    /* And back: with hash gone, small gets the same blocks again. */
    for (uint32_t i = 0; i < nh; i++)
        ck_assert_int_eq(cache_pool_release(p, hh[i], &oh[i], NULL), SLOTD_OK);
    ck_assert_uint_eq(fill_slot(p, small, &a, &ha), nsmall);
    ck_assert_int_eq(cache_pool_release(p, ha, &a, NULL), SLOTD_OK);
    ck_assert_uint_eq(stats(p).bytes_used, 0);
    sound(p);
}
END_TEST

/* ---- A randomized sequence against a model of the expected figures ---- */

typedef struct expect_slot {
    int live;
    const model_t *m;
    cache_owner_t owner;
    cache_handle_t h;
    uint32_t entries;
    uint32_t nblocks;
} expect_slot_t;

START_TEST(test_randomized)
{
    model_t *hash = fx_model("hash"), *tiny = fx_model("tiny"), *small = fx_model("small");
    const model_t *models[] = {hash, tiny, small};
    enum { NREC = 8, MAX_SLOTS = 6, OPS = 4000 };
    const size_t capacity = 14 * fx_page() + 12345;
    cache_pool_t *p = fx_pool(capacity, MAX_SLOTS);
    expect_slot_t rec[NREC];
    cache_handle_t dead[64];
    cache_owner_t dead_owner[64];
    uint32_t ndead = 0, live = 0, serial = 0;
    uint64_t used = 0, entries = 0;
    unsigned full_slots = 0, full_bytes = 0, full_pages = 0, oks = 0;

    memset(rec, 0, sizeof rec);
    rng_state = 12345;
    for (int op = 0; op < OPS; op++) {
        expect_slot_t *r = &rec[rng_below(NREC)];
        uint32_t dice = rng_below(100);
        cache_pool_stats_t before = stats(p), after;
        bool refused = false;
        int rc;

        if (!r->live) {
            char id[24];
            const model_t *m = models[rng_below(3)];
            bool slots_out = live == MAX_SLOTS;
            bool bytes_out = used + slot_bytes(m, 0) > capacity;

            snprintf(id, sizeof id, "op%u", serial++);
            r->owner = owner(rng_below(3), id);
            rc = cache_pool_acquire(p, m, &r->owner, &r->h);
            if (slots_out || bytes_out) {
                ck_assert_int_eq(rc, SLOTD_ECACHE_FULL);
            }
            if (rc == SLOTD_OK) {
                r->live = 1;
                r->m = m;
                r->entries = r->nblocks = 0;
                live++;
                used += slot_bytes(m, 0);
                oks++;
            } else {
                ck_assert_int_eq(rc, SLOTD_ECACHE_FULL);
                refused = true;
                full_slots += slots_out;
                full_bytes += bytes_out;
                full_pages += !slots_out && !bytes_out;
            }
        } else if (dice < 55) {
            uint32_t per = model_block_positions(r->m), max = model_max_ctx(r->m);
            uint32_t n = rng_below(dice < 5 ? max + 2 : 3 * per + 1);
            uint64_t want = (uint64_t)r->entries + n;
            uint32_t need = want > room_of(r->m, r->nblocks)
                                ? blocks_for(r->m, (uint32_t)want) - r->nblocks
                                : 0;
            uint64_t need_bytes =
                slot_bytes(r->m, r->nblocks + need) - slot_bytes(r->m, r->nblocks);
            model_kv_t kv;
            view_t vr = view(p, r->h, &r->owner);

            rc = cache_pool_reserve(p, r->h, &r->owner, n, &kv);
            if (want > max) {
                ck_assert_int_eq(rc, SLOTD_EINVAL);
            } else if (used + need_bytes > capacity) {
                ck_assert_int_eq(rc, SLOTD_ECACHE_FULL);
                full_bytes++;
            } else if (rc == SLOTD_ECACHE_FULL) {
                full_pages++;
            }
            if (rc != SLOTD_OK) {
                view_t v = view(p, r->h, &r->owner);
                view_eq(&vr, &v);
                refused = true;
            } else {
                uint32_t len;
                ck_assert_int_eq(rc, SLOTD_OK);
                ck_assert_uint_eq(kv.len, r->entries);
                r->nblocks += need;
                used += need_bytes;
                ck_assert_uint_eq(chain_len(&kv), r->nblocks);
                /* Commit anything from the entries to the room, usually all. */
                len = rng_below(4) == 0 ? r->entries + rng_below(n + 1) : r->entries + n;
                if (rng_below(3) == 0)
                    len = r->entries +
                          rng_below(
                              (room_of(r->m, r->nblocks) < max ? room_of(r->m, r->nblocks) : max) -
                              r->entries + 1);
                kv.len = len;
                ck_assert_int_eq(cache_pool_commit(p, r->h, &r->owner, &kv), SLOTD_OK);
                entries += len - r->entries;
                r->entries = len;
                oks++;
            }
        } else if (dice < 70 && ndead > 0) {
            uint32_t i = rng_below(ndead);
            model_kv_t kv;

            memset(&kv, 0, sizeof kv);
            ck_assert_int_eq(cache_pool_reserve(p, dead[i], &dead_owner[i], 1, &kv), SLOTD_ESTALE);
            ck_assert_int_eq(cache_pool_commit(p, dead[i], &dead_owner[i], &kv), SLOTD_ESTALE);
            ck_assert_int_eq(cache_pool_release(p, dead[i], &dead_owner[i], NULL), SLOTD_ESTALE);
            refused = true;
            /* A live slot with someone else's owner. */
            if (live > 0) {
                expect_slot_t *o = &rec[rng_below(NREC)];
                if (o->live && o != r)
                    ck_assert_int_eq(cache_pool_reserve(p, o->h, &r->owner, 0, &kv),
                                     strcmp(o->owner.id, r->owner.id) == 0 &&
                                             o->owner.key == r->owner.key
                                         ? SLOTD_OK
                                         : SLOTD_ESTALE);
            }
        } else if (dice >= 70) {
            uint32_t had = 0;

            ck_assert_int_eq(cache_pool_release(p, r->h, &r->owner, &had), SLOTD_OK);
            ck_assert_uint_eq(had, r->entries);
            live--;
            entries -= r->entries;
            used -= slot_bytes(r->m, r->nblocks);
            r->live = 0;
            dead[ndead % 64] = r->h;
            dead_owner[ndead % 64] = r->owner;
            if (ndead < 64)
                ndead++;
        }

        after = stats(p);
        if (refused)
            stats_eq(&before, &after);
        ck_assert_uint_eq(after.live_slots, live);
        ck_assert_uint_eq(after.entries, entries);
        ck_assert_uint_eq(after.bytes_used, used);
        ck_assert_uint_eq(after.bytes_free, capacity - used);
        ck_assert_uint_eq(after.bytes_used + after.bytes_free, capacity);
        ck_assert_uint_eq(cache_pool_entries(p), entries);
        ck_assert_int_eq(cache__pool_check(p), 0);
    }
    /* The sequence reached every kind of refusal it can. */
    ck_assert_uint_gt(oks, OPS / 4);
    ck_assert_uint_gt(full_slots, 0);
    ck_assert_uint_gt(full_pages, 0);

    for (int i = 0; i < NREC; i++)
        if (rec[i].live)
            ck_assert_int_eq(cache_pool_release(p, rec[i].h, &rec[i].owner, NULL), SLOTD_OK);
    ck_assert_uint_eq(stats(p).bytes_used, 0);
    ck_assert_uint_eq(stats(p).entries, 0);
    ck_assert_uint_eq(cache__pool_pages_free(p), cache__pool_pages(p));
}
END_TEST

/* ---- Debug poison and guards ---- */

#ifndef NDEBUG
START_TEST(test_poison_after_release)
{
    model_t *hash = fx_model("hash");
    cache_pool_t *p = fx_pool((size_t)2 << 20, 4);
    cache_owner_t a = owner(1, "a");
    cache_handle_t h;
    model_kv_t kv;
    const unsigned char *block, *state;
    size_t bb = model_block_bytes_for(hash, model_block_capacity(hash, 1)),
           sb = model_state_size(hash);

    ck_assert_int_eq(cache_pool_acquire(p, hash, &a, &h), SLOTD_OK);
    ck_assert_int_eq(cache_pool_reserve(p, h, &a, room_of(hash, 2), &kv), SLOTD_OK);
    memset(kv.head->data, 0x11,
           model_block_bytes_for(hash, model_block_capacity(hash, 0)) - sizeof(model_block_t));
    memset(kv.blocks[1]->data, 0x22, bb - sizeof(model_block_t));
    memset(kv.state, 0x33, sb);
    block = (const unsigned char *)kv.blocks[1];
    state = kv.state;
    ck_assert_int_eq(cache_pool_release(p, h, &a, NULL), SLOTD_OK);
    /* The arena stays mapped: the raw bytes show the poison.  The first 16
     * bytes of an object hold its free-list link and the free magic. */
    for (size_t i = 16; i < bb; i++)
        ck_assert_uint_eq(block[i], CACHE__POISON);
    for (size_t i = 16; i < CACHE__ALIGN; i++)
        ck_assert_uint_eq(state[i], CACHE__POISON);
    {
        uint64_t magic;
        memcpy(&magic, block + 8, sizeof magic);
        ck_assert_uint_eq(magic, CACHE__FREE_MAGIC);
    }
}
END_TEST

/* A block parked in a thread cache is checked like a free one: written
 * after its release, the pool's check reports it. */
START_TEST(test_check_finds_written_parked_block)
{
    model_t *tiny = fx_model("tiny");
    cache_pool_t *p = fx_pool((size_t)2 << 20, 4);
    cache_owner_t a = owner(1, "a");
    cache_handle_t h;
    model_kv_t kv;
    unsigned char *block;

    ck_assert_int_eq(cache_pool_acquire(p, tiny, &a, &h), SLOTD_OK);
    ck_assert_int_eq(grow(p, h, &a, 3), SLOTD_OK);
    ck_assert_int_eq(cache_pool_reserve(p, h, &a, 0, &kv), SLOTD_OK);
    block = (unsigned char *)kv.blocks[1];
    /* The reserve filled this thread's cache; emptied (the page count
     * takes parked blocks back), it parks the released ones. */
    (void)cache__pool_pages_free(p);
    ck_assert_int_eq(cache_pool_release(p, h, &a, NULL), SLOTD_OK);
    block[40] = 0; /* a use after release */
    ck_assert_int_gt(cache__pool_check(p), 0);
}
END_TEST

/* Runs in a forked child: the guard aborts. */
START_TEST(test_guard_double_free)
{
    model_t *hash = fx_model("hash");
    cache_pool_t *p = fx_pool((size_t)2 << 20, 4);
    cache_owner_t a = owner(1, "a"), keep = owner(1, "keep");
    cache_handle_t h, hk;
    model_kv_t kv;
    void *block;

    /* Another slot keeps the page assigned, so the object stays on the
     * page's free list rather than the page going back. */
    ck_assert_int_eq(cache_pool_acquire(p, hash, &keep, &hk), SLOTD_OK);
    ck_assert_int_eq(grow(p, hk, &keep, 1), SLOTD_OK);
    ck_assert_int_eq(cache_pool_acquire(p, hash, &a, &h), SLOTD_OK);
    ck_assert_int_eq(cache_pool_reserve(p, h, &a, 1, &kv), SLOTD_OK);
    block = kv.head;
    ck_assert_int_eq(cache_pool_release(p, h, &a, NULL), SLOTD_OK);
    cache__pool_debug_free(p, block); /* the second free: aborts */
}
END_TEST

START_TEST(test_guard_write_after_release)
{
    model_t *hash = fx_model("hash");
    cache_pool_t *p = fx_pool((size_t)2 << 20, 4);
    cache_owner_t a = owner(1, "a"), keep = owner(1, "keep");
    cache_handle_t h, hk;
    model_kv_t kv;
    unsigned char *block;

    ck_assert_int_eq(cache_pool_acquire(p, hash, &keep, &hk), SLOTD_OK);
    ck_assert_int_eq(grow(p, hk, &keep, 1), SLOTD_OK);
    ck_assert_int_eq(cache_pool_acquire(p, hash, &a, &h), SLOTD_OK);
    ck_assert_int_eq(cache_pool_reserve(p, h, &a, 1, &kv), SLOTD_OK);
    block = (unsigned char *)kv.head;
    ck_assert_int_eq(cache_pool_release(p, h, &a, NULL), SLOTD_OK);
    block[100] = 0; /* a use after release */
    ck_assert_int_eq(cache_pool_acquire(p, hash, &a, &h), SLOTD_OK);
    cache_pool_reserve(p, h, &a, 1, &kv); /* hands the block out again: aborts */
}
END_TEST

START_TEST(test_guard_commit_shrinks)
{
    model_t *hash = fx_model("hash");
    cache_pool_t *p = fx_pool((size_t)2 << 20, 4);
    cache_owner_t a = owner(1, "a");
    cache_handle_t h;
    model_kv_t kv;

    ck_assert_int_eq(cache_pool_acquire(p, hash, &a, &h), SLOTD_OK);
    ck_assert_int_eq(grow(p, h, &a, 5), SLOTD_OK);
    ck_assert_int_eq(cache_pool_reserve(p, h, &a, 0, &kv), SLOTD_OK);
    kv.len = 4;
    cache_pool_commit(p, h, &a, &kv); /* a broken invariant: aborts */
}
END_TEST
#endif

/* ---- The prefix cache ---- */

/* A pool of the fixture's models with the prefix cache on. */
static cache_pool_t *fx_pool_cached(size_t capacity, uint32_t max_slots)
{
    cache_pool_config_t cfg = {capacity, max_slots, fx_list, fx_nmodels, 1, true};

    ck_assert_ptr_null(fx_p);
    ck_assert_int_eq(cache_pool_create(&cfg, &fx_p), SLOTD_OK);
    return fx_p;
}

/* A prompt: `common` tokens from base seed 1, then its own from `own`. */
static void prompt_of(int64_t *t, size_t n, size_t common, uint32_t own, uint32_t V)
{
    for (size_t i = 0; i < n; i++)
        t[i] = (int64_t)(i < common ? (i * 7 + 3) % V : (i * 13 + own * 101 + 1) % V);
}

/* Starts `id` (scope `scope`) with t[0 .. n-1] through the prefix cache,
 * checks that it reused exactly `want_cached` entries and computed only
 * the rest, and that its next two steps are the fresh reference's, logits
 * bit for bit. */
static void start_cached(cache_pool_t *p, const model_t *m, cache_session_t *s, uint64_t key,
                         const char *id, uint64_t scope, int64_t *t, size_t n, uint32_t want_cached,
                         void *scratch)
{
    cache_owner_t o = owner(key, id);
    uint64_t rows = model_rows(m) + model_g_calls(m);
    uint32_t cached = 99;
    size_t len = n;
    slotd_error_t e;

    ck_assert_int_eq(cache_session_start_shared(p, m, &o, scope, t, n, scratch, s, &cached, &e),
                     SLOTD_OK);
    ck_assert_uint_eq(cached, want_cached);
    ck_assert_uint_eq(model_rows(m) + model_g_calls(m) - rows,
                      (uint64_t)model_layers(m) * (n - want_cached));
    ck_assert_uint_eq(s->entries, n);
    step_fresh(p, s, t, &len, scratch);
    step_fresh(p, s, t, &len, scratch);
    sound(p);
}

/* Entries of the whole blocks of `m` that end before position n - 1. */
static uint32_t reusable(const model_t *m, size_t n, size_t common)
{
    uint32_t pos = 0;

    for (uint32_t i = 0;; i++) {
        uint32_t cap = model_block_capacity(m, i);
        if (pos + cap > n - 1 || pos + cap > common)
            return pos;
        pos += cap;
    }
}

/* A start reuses the blocks an earlier start of the same model and scope
 * made, whether the earlier one is still live or finished, exactly up to
 * the block where the prompts diverge (inside it: that block and after
 * are computed), and the replies are the reference's bit for bit.  Run
 * with the hashes honest and, in test builds, all colliding, where only
 * the comparison of tokens and identities keeps the cache right. */
START_TEST(test_prefix_reuse_exact)
{
    model_t *small = fx_model("small"), *hash = fx_model("hash");
    const model_t *ms[2] = {small, hash};
    cache_pool_t *p = fx_pool_cached((size_t)64 << 20, 16);
    void *scratch = malloc(model_scratch_size(small));
    static int64_t t[4][210];

#if SLOTD_FAULT_INJECTION
    cache__prefix_force_collisions(_i == 1);
#else
    if (_i == 1) { /* no hook to force collisions in this build */
        free(scratch);
        return;
    }
#endif
    ck_assert_ptr_nonnull(scratch);
    for (int mi = 0; mi < 2; mi++) {
        const model_t *m = ms[mi];
        uint32_t V = model_vocab(m);
        for (int live = 0; live < 2; live++) {
            cache_session_t a, b, c, d;

            cache_pool_prefix_flush(p);
            /* a: 200 tokens, all new. */
            prompt_of(t[0], 200, 200, 0, V);
            start_cached(p, m, &a, 1, "a", 0, t[0], 200, 0, scratch);
            if (!live) {
                ck_assert_int_eq(cache_session_finish(p, &a, NULL), SLOTD_OK);
                ck_assert_uint_eq(stats(p).entries, 0);
                ck_assert_uint_gt(stats(p).prefix_entries, 0);
                sound(p);
            }
            /* b: a's first 160 and 16 of its own. */
            prompt_of(t[1], 176, 160, 1, V);
            start_cached(p, m, &b, 2, "b", 0, t[1], 176, reusable(m, 176, 160), scratch);
            /* c: diverges inside a block (position 100). */
            prompt_of(t[2], 140, 100, 2, V);
            ck_assert_uint_lt(reusable(m, 140, 100), 100); /* 100 is inside a block */
            start_cached(p, m, &c, 3, "c", 0, t[2], 140, reusable(m, 140, 100), scratch);
            /* d: the same as a but one token shorter: every block but the
             * one holding its last position. */
            prompt_of(t[3], 199, 200, 0, V);
            start_cached(p, m, &d, 4, "d", 0, t[3], 199, reusable(m, 199, 199), scratch);
            ck_assert_uint_gt(stats(p).prefix_hit_entries, 0);
            if (live)
                ck_assert_int_eq(cache_session_finish(p, &a, NULL), SLOTD_OK);
            ck_assert_int_eq(cache_session_finish(p, &b, NULL), SLOTD_OK);
            ck_assert_int_eq(cache_session_finish(p, &c, NULL), SLOTD_OK);
            ck_assert_int_eq(cache_session_finish(p, &d, NULL), SLOTD_OK);
            ck_assert_uint_eq(stats(p).entries, 0);
            sound(p);
        }
    }
#if SLOTD_FAULT_INJECTION
    cache__prefix_force_collisions(false);
#endif
    free(scratch);
}
END_TEST

/* A different model never shares, and a different scope never shares,
 * each paired with the same model and scope sharing (a test of "no reuse"
 * alone would pass with the cache off); both orders; the hashes honest
 * and, in test builds, all colliding. */
START_TEST(test_prefix_model_scope_apart)
{
    model_t *tiny = fx_model("tiny"), *small = fx_model("small");
    cache_pool_t *p = fx_pool_cached((size_t)32 << 20, 16);
    void *scratch = malloc(model_scratch_size(small));
    int64_t t[8]; /* 6 tokens and the two steps' picks */
    cache_session_t s1, s2, s3;

#if SLOTD_FAULT_INJECTION
    cache__prefix_force_collisions(_i >= 2);
#else
    if (_i >= 2) { /* no hook to force collisions in this build */
        free(scratch);
        return;
    }
#endif
    ck_assert_ptr_nonnull(scratch);
    /* Tokens every model takes (tiny's V is 6), and room for two steps in
     * tiny's max_ctx of 8. */
    for (int i = 0; i < 6; i++)
        t[i] = (i * 5 + 1) % 6;
    {
        /* Models: one order, then the other. */
        const model_t *first = _i % 2 == 0 ? tiny : small, *second = _i % 2 == 0 ? small : tiny;
        start_cached(p, first, &s1, 1, "m1", 0, t, 6, 0, scratch);
        start_cached(p, second, &s2, 1, "m2", 0, t, 6, 0, scratch);
        start_cached(p, first, &s3, 1, "m3", 0, t, 6, reusable(first, 6, 6), scratch);
        ck_assert_uint_gt(reusable(first, 6, 6), 0);
        ck_assert_int_eq(cache_session_finish(p, &s1, NULL), SLOTD_OK);
        ck_assert_int_eq(cache_session_finish(p, &s2, NULL), SLOTD_OK);
        ck_assert_int_eq(cache_session_finish(p, &s3, NULL), SLOTD_OK);
    }
    {
        /* Scopes: 1 then 2, or 2 then 1, then the first again. */
        uint64_t sa = _i % 2 == 0 ? 1 : 2, sb = _i % 2 == 0 ? 2 : 1;
        int64_t u[42]; /* 40 tokens and the two steps' picks */
        prompt_of(u, 40, 40, 7, 512);
        start_cached(p, small, &s1, 1, "s1", sa, u, 40, 0, scratch);
        start_cached(p, small, &s2, 2, "s2", sb, u, 40, 0, scratch);
        start_cached(p, small, &s3, 3, "s3", sa, u, 40, reusable(small, 40, 40), scratch);
        ck_assert_uint_gt(reusable(small, 40, 40), 0);
        ck_assert_int_eq(cache_session_finish(p, &s1, NULL), SLOTD_OK);
        ck_assert_int_eq(cache_session_finish(p, &s2, NULL), SLOTD_OK);
        ck_assert_int_eq(cache_session_finish(p, &s3, NULL), SLOTD_OK);
    }
    ck_assert_uint_eq(stats(p).entries, 0);
    sound(p);
#if SLOTD_FAULT_INJECTION
    cache__prefix_force_collisions(false);
#endif
    free(scratch);
}
END_TEST

/* Cached-only blocks are free room: a start that needs memory takes them
 * (least recently used first) before it is refused, and after 200
 * finished requests the pool's entries are 0 whatever the cache holds. */
START_TEST(test_prefix_free_room)
{
    model_t *small = fx_model("small");
    cache_pool_t *p = fx_pool_cached((size_t)2 << 20, 8);
    void *scratch = malloc(model_scratch_size(small));
    static int64_t t[300];
    cache_session_t s;
    uint64_t room_free, slots_free;

    ck_assert_ptr_nonnull(scratch);
    for (uint32_t r = 0; r < 200; r++) {
        size_t n = 40 + (r * 37) % 260;
        uint32_t cached = 0;
        cache_owner_t o = owner(r, "r");
        slotd_error_t e;
        uint32_t tok;

        prompt_of(t, n, (r % 3) * 100, r, 512);
        ck_assert_int_eq(
            cache_session_start_shared(p, small, &o, 0, t, n, scratch, &s, &cached, &e), SLOTD_OK);
        ck_assert_int_eq(cache_session_step(p, &s, 1, scratch, &tok, NULL, &e), SLOTD_OK);
        ck_assert_int_eq(cache_session_finish(p, &s, NULL), SLOTD_OK);
        ck_assert_uint_eq(stats(p).entries, 0);
        cache_pool_room(p, &room_free, &slots_free);
        ck_assert_uint_eq(room_free, stats(p).bytes_capacity);
        if (r % 20 == 0)
            sound(p);
    }
    ck_assert_uint_gt(stats(p).prefix_entries, 0);
    ck_assert_uint_gt(stats(p).prefix_evicted_entries, 0);
    ck_assert_uint_gt(stats(p).prefix_hit_entries, 0);
    sound(p);
    ck_assert_uint_gt(cache_pool_prefix_flush(p), 0);
    ck_assert_uint_eq(stats(p).prefix_entries, 0);
    ck_assert_uint_eq(stats(p).bytes_used, 0);
    sound(p);
    free(scratch);
}
END_TEST

/* The first position at or after `at` where a block of `m` ends, and its
 * block index + 1 in *idx. */
static uint32_t boundary(const model_t *m, uint32_t at, uint32_t *idx)
{
    uint32_t pos = 0, i = 0;

    while (pos < at)
        pos += model_block_capacity(m, i++);
    *idx = i;
    return pos;
}

/* An append whose tokens complete blocks another session kept (here its
 * parent, which ran them first, a fork sharing its full blocks) reuses
 * them but the block of its last position, computes the rest (hash's state
 * rebuilt from the entries), and the session's steps after it are the
 * reference's.  `small` also shows a refused append changing nothing: the
 * pool packed so that the rest's block cannot be had, the blocks taken go
 * back to the cache (entries, room and the checker as before), and the
 * same append succeeds once a filler lets go. */
START_TEST(test_prefix_append_reuses)
{
    model_t *m = fx_model(_i == 0 ? "small" : "hash");
    cache_pool_t *p = fx_pool_cached((size_t)2 << 20, 64);
    void *scratch = malloc(model_scratch_size(m));
    uint32_t V = model_vocab(m), bi, ei, base = boundary(m, 40, &bi), end, cached = 99;
    static int64_t t[600], u[600], sb[600];
    uint32_t seq[600];
    cache_session_t a, b, fill[64];
    cache_owner_t oa = owner(1, "a"), ob = owner(1, "b");
    size_t nfill = 0, len;
    slotd_error_t e;
    uint32_t want, tok;

    ck_assert_ptr_nonnull(scratch);
    boundary(m, base + 1, &ei);
    ei += 2; /* three blocks after base: the last holds the last position */
    end = base;
    for (uint32_t i = bi; i < ei; i++)
        end += model_block_capacity(m, i);
    want = end - model_block_capacity(m, ei - 1) - base;
    ck_assert_uint_gt(want, 0);
    prompt_of(t, base, 0, 1, V);
    prompt_of(u, end - base, 0, 7, V);
    for (uint32_t i = 0; i < base; i++)
        seq[i] = (uint32_t)t[i];
    for (uint32_t i = base; i < end; i++)
        seq[i] = (uint32_t)u[i - base];
    ck_assert_int_eq(cache_session_start_shared(p, m, &oa, 0, t, base, scratch, &a, &cached, &e),
                     SLOTD_OK);
    ck_assert_int_eq(cache_session_fork(p, &a, &ob, &b, &e), SLOTD_OK);
    ck_assert_int_eq(
        cache_session_append_shared(p, &a, u, end - base, seq, scratch, &cached, &e), SLOTD_OK);
    ck_assert_uint_eq(cached, 0); /* nothing kept yet past the prompt */
    cache_session_publish(p, &a, seq, end);
    sound(p);

    if (_i == 0) {
        /* Fillers ending where b's rest begins: each next step needs a
         * block of the class the rest needs, until none can be had. */
        int64_t *ft = calloc(end, sizeof(*ft));
        ck_assert_ptr_nonnull(ft);
        prompt_of(ft, base + want, 0, 99, V);
        for (;; nfill++) {
            cache_owner_t of = owner(2, "f");
            of.id[1] = (char)('a' + nfill);
            if (cache_session_start(p, m, &of, ft, base + want, scratch, &fill[nfill], &e) !=
                SLOTD_OK)
                break;
        }
        for (size_t i = 0; i < nfill; i++)
            if (cache_session_step(p, &fill[i], 1, scratch, &tok, NULL, &e) != SLOTD_OK)
                break;
        free(ft);
        ck_assert_uint_gt(nfill, 0);
        {
            cache_pool_stats_t st0 = stats(p);
            ck_assert_int_eq(
                cache_session_append_shared(p, &b, u, end - base, seq, scratch, &cached, &e),
                SLOTD_ECACHE_FULL);
            ck_assert_uint_eq(b.entries, base);
            ck_assert_uint_eq(stats(p).entries, st0.entries);
            ck_assert_uint_eq(stats(p).bytes_used, st0.bytes_used);
            sound(p);
        }
        ck_assert_int_eq(cache_session_finish(p, &fill[--nfill], NULL), SLOTD_OK);
    }
    ck_assert_int_eq(
        cache_session_append_shared(p, &b, u, end - base, seq, scratch, &cached, &e), SLOTD_OK);
    ck_assert_uint_eq(cached, want);
    ck_assert_uint_eq(b.entries, end);
    sound(p);
    for (uint32_t i = 0; i < end; i++)
        sb[i] = seq[i];
    len = end;
    step_fresh(p, &b, sb, &len, scratch);
    step_fresh(p, &b, sb, &len, scratch);
    sound(p);
    while (nfill > 0)
        ck_assert_int_eq(cache_session_finish(p, &fill[--nfill], NULL), SLOTD_OK);
    ck_assert_int_eq(cache_session_finish(p, &a, NULL), SLOTD_OK);
    ck_assert_int_eq(cache_session_finish(p, &b, NULL), SLOTD_OK);
    ck_assert_uint_eq(stats(p).entries, 0);
    sound(p);
    free(scratch);
}
END_TEST

#if SLOTD_FAULT_INJECTION
/* A cached block that is damaged (the fault hook, as a memory fault would)
 * damages every start that reuses it, which is what the audit catches; the
 * pool then forgets the blocks of the session found wrong, and the next
 * start of the same prompt computes everything and is right. */
START_TEST(test_prefix_damaged_block_forgotten)
{
    model_t *small = fx_model("small");
    cache_pool_t *p = fx_pool_cached((size_t)16 << 20, 8);
    void *scratch = malloc(model_scratch_size(small));
    static int64_t t[3][110];
    cache_session_t a, b, c;
    cache_owner_t oa = owner(1, "a"), ob = owner(2, "b"), oc = owner(3, "c");
    uint32_t cached = 0, forgotten = 0, got, want[101];
    double wl[512], hl[512];
    slotd_error_t e;
    model_kv_t kv;

    ck_assert_ptr_nonnull(scratch);
    for (int k = 0; k < 3; k++)
        prompt_of(t[k], 100, 100, 0, 512);
    ck_assert_int_eq(
        cache_session_start_shared(p, small, &oa, 0, t[0], 100, scratch, &a, &cached, &e), SLOTD_OK);
    ck_assert_int_eq(cache_pool_reserve(p, a.handle, &oa, 0, &kv), SLOTD_OK);
    model_fault_corrupt(small, &kv, 5);
    /* b reuses the damaged block, and goes wrong. */
    ck_assert_int_eq(
        cache_session_start_shared(p, small, &ob, 0, t[1], 100, scratch, &b, &cached, &e), SLOTD_OK);
    ck_assert_uint_gt(cached, 5);
    ck_assert_int_eq(model_generate(small, t[1], 100, 1, true, NULL, NULL, want, wl, NULL, NULL),
                     SLOTD_OK);
    ck_assert_int_eq(cache_session_step(p, &b, 1, scratch, &got, hl, &e), SLOTD_OK);
    ck_assert_msg(memcmp(wl, hl, sizeof(wl)) != 0, "the damage did not reach b");
    /* Found wrong: its blocks leave the cache. */
    ck_assert_int_eq(cache_pool_prefix_forget(p, b.handle, &ob, &forgotten), SLOTD_OK);
    ck_assert_uint_gt(forgotten, 0);
    sound(p);
    ck_assert_int_eq(
        cache_session_start_shared(p, small, &oc, 0, t[2], 100, scratch, &c, &cached, &e), SLOTD_OK);
    ck_assert_uint_eq(cached, 0);
    {
        size_t len = 100;
        step_fresh(p, &c, t[2], &len, scratch);
    }
    ck_assert_int_eq(cache_session_finish(p, &a, NULL), SLOTD_OK);
    ck_assert_int_eq(cache_session_finish(p, &b, NULL), SLOTD_OK);
    ck_assert_int_eq(cache_session_finish(p, &c, NULL), SLOTD_OK);
    sound(p);
    free(scratch);
}
END_TEST
#endif

static Suite *cache_suite(bool forking)
{
    Suite *s = suite_create("cache");
    TCase *tc = tcase_create("pool");

    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, NULL, fx_teardown);
    tcase_add_test(tc, test_create_invalid);
    tcase_add_test(tc, test_create_oom);
    tcase_add_test(tc, test_acquire_empty);
    tcase_add_test(tc, test_reserve_commit_grows_exactly);
    tcase_add_test(tc, test_hint_names_the_slot);
    tcase_add_test(tc, test_block_boundaries);
    tcase_add_test(tc, test_models_run_in_slots);
    tcase_add_test(tc, test_session_append_fork);
    tcase_add_test(tc, test_session_fork_full);
    tcase_add_test(tc, test_slot_bytes_bound);
    tcase_add_test(tc, test_pages_fit_blocks);
    tcase_add_test(tc, test_release_returns_everything);
    tcase_add_test(tc, test_trim_gives_pages_back);
    tcase_add_test(tc, test_slot_count_exhausted);
    tcase_add_test(tc, test_budget_exhausted);
    tcase_add_test(tc, test_stale_handles);
    tcase_add_test(tc, test_wrong_owner);
    tcase_add_test(tc, test_double_release);
    tcase_add_test(tc, test_owner_id_words);
    tcase_add_test(tc, test_parked_blocks_do_not_refuse);
    tcase_add_test(tc, test_parked_blocks_keep_pages_whole);
    tcase_add_test(tc, test_arena_factor_refuses_by_counts);
    tcase_add_test(tc, test_pages_move_between_classes);
    tcase_add_test(tc, test_randomized);
#ifndef NDEBUG
    tcase_add_test(tc, test_poison_after_release);
    tcase_add_test(tc, test_check_finds_written_parked_block);
    /* The guards abort the process: only in a forked child. */
    if (forking) {
        tcase_add_test_raise_signal(tc, test_guard_double_free, SIGABRT);
        tcase_add_test_raise_signal(tc, test_guard_write_after_release, SIGABRT);
        tcase_add_test_raise_signal(tc, test_guard_commit_shrinks, SIGABRT);
    }
#endif
    suite_add_tcase(s, tc);
    {
        TCase *pc = tcase_create("share");
        /* Its references are long `small` computations: hours under
         * memcheck, so the valgrind stage leaves it out (CK_EXCLUDE_TAGS in
         * scripts/test.sh).  Every call is on one thread: TSan would only
         * repeat, much slower, what the plain and ASan stages check, so
         * the TSan stage leaves it out too (tsan_slow).  Plain and ASan
         * run it. */
        tcase_set_tags(pc, "memcheck_slow tsan_slow");

        tcase_add_checked_fixture(pc, NULL, fx_teardown);
        tcase_set_timeout(pc, 300); /* sanitizer builds: the references are long */
        tcase_add_loop_test(pc, test_prefix_reuse_exact, 0, 2);
        tcase_add_loop_test(pc, test_prefix_model_scope_apart, 0, 4);
        tcase_add_test(pc, test_prefix_free_room);
        tcase_add_loop_test(pc, test_prefix_append_reuses, 0, 2);
        tcase_add_test(pc, test_fork_shares_blocks);
#if SLOTD_FAULT_INJECTION
        tcase_add_test(pc, test_prefix_damaged_block_forgotten);
#endif
        suite_add_tcase(s, pc);
    }
    return s;
}


int main(void)
{
    const char *fork_env = getenv("CK_FORK");
    bool forking = fork_env == NULL || strcmp(fork_env, "no") != 0;
    SRunner *sr = srunner_create(cache_suite(forking));
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
