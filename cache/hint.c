/*
 * hint.c: the prefetch hints.  Says, for a slot, which lines its next step
 * reads first (its record, its state, the first blocks of its chain or the
 * tail's header), and asks the CPU for them: on reserve's fast path
 * (cache__prefetch()), and one job ahead through cache_pool_hint(), whose
 * addresses the server carries to the worker that runs the next step.
 *
 * Threads and lock.  The slot's user, with a live handle; no lock.  It
 * reads the slot's own fields only, never a block, and changes no byte: a
 * prefetch of an address that is stale by then costs a wasted load and
 * nothing else.
 *
 * Called by pool.c; calls nothing else of the pool.
 *
 * Design: docs/design.md, "Prefetch hints".
 */
#include "cache/pool_int.h"

#include <assert.h>
#include <string.h>

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
void cache__prefetch(const cache__model_t *md, const cache__slot_t *s)
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
