/*
 * create.c: the making and unmaking of a slot pool.  Owns the order in
 * which a pool's parts are made and released: the pool record, the table
 * of configured models (and, through it, the size classes their blocks and
 * states need), the thread caches (tcache.c), the slot table and the
 * slots' block tables (mappings, the slot table
 * advised to use huge pages), the arena and its pages (slab.c) and the
 * lock.  Every part made here is released by cache_pool_destroy(), and on
 * a failure by the unwinding below, in reverse order.
 *
 * Threads and lock.  cache_pool_create() runs on one thread, before the
 * pool is shared; cache_pool_destroy() after its last use.  No lock.
 *
 * Calls tcache.c and slab.c; called by nothing in the pool.
 *
 * Design: docs/design.md, "The pool" (Arena, Pages) and "The allocator and
 * per-thread caches" (Size classes, Accounting).
 */
#include "cache/pool_int.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* The models' table, and with it the size classes their blocks and states
 * need. */
static int cache__models_init(cache_pool_t *p, const cache_pool_config_t *cfg)
{
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
            if (md->ncaps == CACHE__MAX_CAPS)
                return SLOTD_EINVAL;
            md->caps[md->ncaps] = cap;
            md->caps_cls[md->ncaps] = cache__slab_class_for(p, model_block_bytes_for(md->m, cap));
            p->classes[md->caps_cls[md->ncaps++]].blocks = true;
        }
        md->state_bytes = cache__round_up(model_state_size(md->m), CACHE__ALIGN);
        md->state_cls =
            md->state_bytes > 0 ? cache__slab_class_for(p, md->state_bytes) : CACHE__NONE;
        md->state_lines =
            (uint8_t)((md->state_bytes < 4 * CACHE__ALIGN ? md->state_bytes : 4 * CACHE__ALIGN) /
                      CACHE__ALIGN);
        for (uint32_t b = 0; b < CACHE__SLOT_BLOCKS; b++) {
            size_t bytes = model_block_bytes_for(md->m, model_block_capacity(md->m, b));

            if (bytes > CACHE__PREFETCH_BYTES)
                bytes = CACHE__PREFETCH_BYTES;
            md->block_lines[b] = (uint8_t)(cache__round_up(bytes, CACHE__ALIGN) / CACHE__ALIGN);
        }
    }
    return SLOTD_OK;
}

int cache_pool_create(const cache_pool_config_t *cfg, cache_pool_t **out)
{
    cache_pool_t *p;
    size_t page, npages;
    int rc = SLOTD_ENOMEM;

    if (cfg == NULL || out == NULL || cfg->capacity_bytes == 0 || cfg->max_slots == 0 ||
        cfg->arena_factor > CACHE__ARENA_FACTOR_MAX || cfg->max_slots == CACHE__NONE ||
        cfg->models == NULL || cfg->nmodels == 0)
        return SLOTD_EINVAL;
    page = cache__slab_page_size(cfg->models, cfg->nmodels);
    /* A model the pool cannot hold, or not one page of the largest object
     * in the budget. */
    if (page == 0 || page > cfg->capacity_bytes)
        return SLOTD_EINVAL;
    if (cfg->capacity_bytes / page >= CACHE__NONE)
        return SLOTD_ENOMEM;

    p = cache__calloc(1, sizeof *p);
    if (p == NULL)
        return SLOTD_ENOMEM;
    p->capacity = cfg->capacity_bytes;
    p->max_slots = cfg->max_slots;
    p->nmodels = cfg->nmodels;
    p->page_size = page;
    p->models = cache__calloc(cfg->nmodels, sizeof *p->models);
    if (p->models == NULL)
        goto fail_pool;
    p->classes = cache__calloc((CACHE__MAX_CAPS + 1) * cfg->nmodels, sizeof *p->classes);
    if (p->classes == NULL)
        goto fail_models;
    if ((rc = cache__models_init(p, cfg)) != SLOTD_OK)
        goto fail_classes;
    /* The budget's pages; for the counts to refuse first (docs/design.md,
     * Accounting), one more for each class (which may hold one page that it
     * fills only partly), all of it times the factor. */
    npages = cfg->capacity_bytes / page;
    if (cfg->arena_factor > 1)
        npages = (npages + p->nclasses) * cfg->arena_factor;
    if ((rc = cache__tcache_init(p)) != SLOTD_OK)
        goto fail_classes;

    /* Mapped rather than allocated: page-aligned (a slot's lines are its
     * own), zeroed, and in huge pages where the system offers them on
     * request (THP "madvise"), since every call reads a slot anywhere in a
     * table of 19 MiB for 100,000 slots, all of it written just below. */
    rc = SLOTD_ENOMEM;
    p->slots_bytes = (size_t)cfg->max_slots * sizeof *p->slots;
    p->slots =
        mmap(NULL, p->slots_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p->slots == MAP_FAILED)
        goto fail_tcaches;
    (void)madvise(p->slots, p->slots_bytes, MADV_HUGEPAGE);
    for (uint32_t i = 0; i < p->max_slots; i++)
        p->slots[i].next_free = i + 1 < p->max_slots ? i + 1 : CACHE__NONE;
    p->free_slot = 0;
    /* The block tables: as many entries a slot as the longest chain. */
    p->table_len = 1;
    for (size_t i = 0; i < cfg->nmodels; i++) {
        uint32_t nb = model_chain_blocks(cfg->models[i], model_max_ctx(cfg->models[i]), 1, NULL);
        if (nb > p->table_len)
            p->table_len = nb;
    }
    p->tables_bytes = (size_t)cfg->max_slots * p->table_len * sizeof *p->tables;
    p->tables =
        mmap(NULL, p->tables_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p->tables == MAP_FAILED)
        goto fail_slots;
    {
        long sp = sysconf(_SC_PAGESIZE); /* slab.c reads it again, the same */
        p->sys_page = sp > 0 ? (size_t)sp : 4096;
    }
    p->tables_pages = (p->tables_bytes + p->sys_page - 1) / p->sys_page;
    p->tables_dirty = calloc((p->tables_pages + 63) / 64, sizeof(uint64_t));
    if (p->tables_dirty == NULL) {
        munmap(p->tables, p->tables_bytes);
        goto fail_slots;
    }

    if ((rc = cache__slab_init(p, npages)) != SLOTD_OK)
        goto fail_tables;
    if ((rc = cache__prefix_init(p, cfg->prefix_cache)) != SLOTD_OK)
        goto fail_prefix;
    rc = SLOTD_ENOMEM;
    if (pthread_mutex_init(&p->lock, NULL) != 0)
        goto fail_slab;
    atomic_init(&p->entries, 0);
    *out = p;
    return SLOTD_OK;

fail_slab:
fail_prefix:
    cache__prefix_fini(p);
    cache__slab_fini(p);
fail_tables:
    munmap(p->tables, p->tables_bytes);
    free(p->tables_dirty);
fail_slots:
    munmap(p->slots, p->slots_bytes);
fail_tcaches:
    cache__tcache_fini(p);
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
    cache__prefix_fini(p);
    cache__slab_fini(p);
    munmap(p->slots, p->slots_bytes);
    munmap(p->tables, p->tables_bytes);
    free(p->tables_dirty);
    cache__tcache_fini(p);
    free(p->classes);
    free(p->models);
    free(p);
}
