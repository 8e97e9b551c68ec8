/*
 * prefix.c: the pool's prefix cache: full blocks kept by the identity of
 * the tokens that made them, so that a later start of the same model and
 * scope whose prompt opens with the same tokens, or an append that
 * completes them after a session's full blocks, holds those blocks
 * instead of computing them.
 *
 * Owns the cache's nodes (one per cached block, from the heap: outside the
 * pool's budget, a few words and the block's tokens each, released when
 * the block leaves the cache or by cache_pool_destroy()), the hash table
 * of buckets and the node index (both grown by doubling, released with the
 * nodes), the least-recently-used list of blocks that only the cache holds,
 * and the per-process hash key (getrandom(2)).
 *
 * Identity of a block: the model, the scope (0 for the global scope, a
 * connection's key plus 1 for its own), the serial number of the node of
 * the block before it (0 for a chain's first block; serials are never
 * reused, so a node evicted and made again is another parent), the block's
 * index and its tokens.  The hash (SipHash-2-4 under the process's key) only
 * finds candidates: every field and every token is compared on each hit.
 *
 * A cached block counts one holder for the cache (pool_int.h, Shared
 * blocks), and the high half of its `provider` word names its node.  When
 * its last slot lets go it stays, held by the cache alone, on the LRU list:
 * free room, given up (cache__do_prefix_evict()) before the pool refuses
 * anything.  A block is published only when the block before it in the
 * same chain is its parent node's block, so a slot that holds a cached
 * block holds every cached block before it too, or (after an append's
 * lookup, cache__do_prefix_extend()) a block equal to it: a parent given
 * up while a slot holds its child only makes the child unfindable.
 *
 * Threads and lock: every function here runs with p->lock held (the
 * cache__do_ prefix), apart from init and fini, which run alone.
 *
 * Design: docs/design.md, "Shared blocks and zero-copy fork".
 */
#include "cache/pool_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>

struct cache__pnode {
    struct cache__pnode *hnext;    /* the bucket's chain */
    TAILQ_ENTRY(cache__pnode) lru; /* while on_lru */
    model_block_t *block;
    uint64_t hash, scope, serial, parent;
    uint32_t model, index, ntok, self; /* self: its index in the node table */
    bool on_lru;
    uint32_t tok[]; /* ntok tokens */
};

#if SLOTD_FAULT_INJECTION
static bool g_collide; /* every hash the same: the test of a forced collision */

void cache__prefix_force_collisions(bool on)
{
    g_collide = on;
}
#endif

static inline uint64_t rotl(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

#define SIPROUND                                                                                   \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v1 = rotl(v1, 13);                                                                         \
        v1 ^= v0;                                                                                  \
        v0 = rotl(v0, 32);                                                                         \
        v2 += v3;                                                                                  \
        v3 = rotl(v3, 16);                                                                         \
        v3 ^= v2;                                                                                  \
        v0 += v3;                                                                                  \
        v3 = rotl(v3, 21);                                                                         \
        v3 ^= v0;                                                                                  \
        v2 += v1;                                                                                  \
        v1 = rotl(v1, 17);                                                                         \
        v1 ^= v2;                                                                                  \
        v2 = rotl(v2, 32);                                                                         \
    } while (0)

/* SipHash-2-4 of the block's identity, one 64-bit word at a time. */
static uint64_t key_hash(const cache_pool_t *p, uint32_t model, uint64_t scope, uint64_t parent,
                         uint32_t index, const uint32_t *tok, uint32_t ntok)
{
    uint64_t v0 = p->prefix.key[0] ^ UINT64_C(0x736f6d6570736575);
    uint64_t v1 = p->prefix.key[1] ^ UINT64_C(0x646f72616e646f6d);
    uint64_t v2 = p->prefix.key[0] ^ UINT64_C(0x6c7967656e657261);
    uint64_t v3 = p->prefix.key[1] ^ UINT64_C(0x7465646279746573);
    uint64_t words = 0;

#define SIP_WORD(w)                                                                                \
    do {                                                                                           \
        uint64_t m_ = (w);                                                                         \
        v3 ^= m_;                                                                                  \
        SIPROUND;                                                                                  \
        SIPROUND;                                                                                  \
        v0 ^= m_;                                                                                  \
        words++;                                                                                   \
    } while (0)

    SIP_WORD(((uint64_t)model << 32) | index);
    SIP_WORD(scope);
    SIP_WORD(parent);
    for (uint32_t i = 0; i < ntok; i += 2)
        SIP_WORD((uint64_t)tok[i] | (i + 1 < ntok ? (uint64_t)tok[i + 1] << 32 : 0));
    SIP_WORD(words << 56);
#undef SIP_WORD
    v2 ^= 0xFF;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
#if SLOTD_FAULT_INJECTION
    if (g_collide)
        return 42;
#endif
    return v0 ^ v1 ^ v2 ^ v3;
}

int cache__prefix_init(cache_pool_t *p, bool on)
{
    cache__prefix_t *c = &p->prefix;

    memset(c, 0, sizeof(*c));
    TAILQ_INIT(&c->lru);
    c->on = on;
    c->next_serial = 1;
    if (!on)
        return SLOTD_OK;
    if (getrandom(c->key, sizeof(c->key), 0) != (ssize_t)sizeof(c->key))
        return SLOTD_ENOMEM; /* no key, no cache: never a predictable one */
    c->nbuckets = 1024;
    c->buckets = calloc(c->nbuckets, sizeof(*c->buckets));
    if (c->buckets == NULL)
        return SLOTD_ENOMEM;
    return SLOTD_OK;
}

void cache__prefix_fini(cache_pool_t *p)
{
    cache__prefix_t *c = &p->prefix;

    for (uint32_t i = 0; i < c->nnodes_cap; i++)
        free(c->nodes[i]);
    free(c->nodes);
    free(c->free_ix);
    free(c->buckets);
    memset(c, 0, sizeof(*c));
}

cache__pnode_t *cache__prefix_node_of(const cache_pool_t *p, const model_block_t *b)
{
    uint64_t ix = __atomic_load_n(&b->provider, __ATOMIC_RELAXED) >> 32;

    return ix == 0 ? NULL : p->prefix.nodes[ix - 1];
}

static cache__pnode_t *do_find(cache_pool_t *p, uint64_t hash, uint32_t model, uint64_t scope,
                               uint64_t parent, uint32_t index, const uint32_t *tok, uint32_t ntok)
{
    cache__pnode_t *n = p->prefix.buckets[hash & (p->prefix.nbuckets - 1)];

    for (; n != NULL; n = n->hnext)
        if (n->hash == hash && n->model == model && n->scope == scope && n->parent == parent &&
            n->index == index && n->ntok == ntok && memcmp(n->tok, tok, ntok * sizeof(*tok)) == 0)
            return n;
    return NULL;
}

static void do_lru_out(cache_pool_t *p, cache__pnode_t *n)
{
    if (!n->on_lru)
        return;
    TAILQ_REMOVE(&p->prefix.lru, n, lru);
    n->on_lru = false;
    p->prefix.lru_entries -= n->block->capacity;
    p->prefix.lru_bytes -= p->classes[cache__page_at(p, n->block)->cls].stride;
}

void cache__do_prefix_unheld(cache_pool_t *p, model_block_t *b)
{
    cache__pnode_t *n = cache__prefix_node_of(p, b);

    assert(n != NULL && !n->on_lru && cache__holders(b) == 1);
    TAILQ_INSERT_TAIL(&p->prefix.lru, n, lru);
    n->on_lru = true;
    p->prefix.lru_entries += b->capacity;
    p->prefix.lru_bytes += p->classes[cache__page_at(p, b)->cls].stride;
}

/* Takes cached node `node` into slot s (table t) as its block i, right
 * after its full blocks. */
static void do_take(cache_pool_t *p, cache__slot_t *s, model_block_t **t, uint32_t i,
                    cache__pnode_t *node)
{
    const cache__model_t *md = &p->models[s->model];
    uint32_t cap = node->block->capacity;

    if (cache__do_hold(node->block, +1) == 2)
        p->shared_blocks++;
    do_lru_out(p, node);
    t[i] = node->block;
    if (i < CACHE__SLOT_BLOCKS)
        s->blocks[i] = node->block;
    s->bytes += p->classes[md->caps_cls[cache__cap_index(md, cap)]].stride;
    s->room += cap;
    s->nblocks = i + 1;
}

/* Takes node n out of the cache: out of its bucket, its index freed, its
 * block without a node.  The caller drops the cache's holder. */
static void do_unlink(cache_pool_t *p, cache__pnode_t *n)
{
    cache__prefix_t *c = &p->prefix;
    cache__pnode_t **at = &c->buckets[n->hash & (c->nbuckets - 1)];

    while (*at != n)
        at = &(*at)->hnext;
    *at = n->hnext;
    do_lru_out(p, n);
    __atomic_store_n(&n->block->provider,
                     __atomic_load_n(&n->block->provider, __ATOMIC_RELAXED) & UINT32_MAX,
                     __ATOMIC_RELAXED);
    c->nodes[n->self] = NULL;
    c->free_ix[c->nfree_ix++] = n->self;
    c->nnodes--;
    free(n);
}

uint32_t cache__do_prefix_forget(cache_pool_t *p, cache__slot_t *s, uint32_t si)
{
    model_block_t **t = cache__table(p, si);
    uint32_t n = 0;

    for (uint32_t i = 0; i < s->nblocks; i++) {
        cache__pnode_t *node = cache__prefix_node_of(p, t[i]);

        if (node == NULL)
            continue;
        do_unlink(p, node);
        /* The slot still holds the block: the count stays at 1 or more. */
        if (cache__do_hold(t[i], -1) == 1)
            p->shared_blocks--;
        n++;
    }
    return n;
}

bool cache__do_prefix_evict(cache_pool_t *p)
{
    cache__pnode_t *n = TAILQ_FIRST(&p->prefix.lru);
    model_block_t *b;
    uint64_t left;

    if (n == NULL)
        return false;
    b = n->block;
    p->prefix.evicted_entries += b->capacity;
    do_unlink(p, n);
    left = cache__do_hold(b, -1);
    assert(left == 0);
    (void)left;
#if CACHE__DEBUG
    cache__poison(b, p->classes[cache__page_at(p, b)->cls].stride, NULL);
#endif
    cache__do_obj_give(p, NULL, b);
    return true;
}

uint32_t cache__do_prefix_attach(cache_pool_t *p, cache__slot_t *s, uint32_t si, uint64_t scope,
                                 const uint32_t *tok, uint32_t n, uint64_t *last_serial)
{
    const cache__model_t *md = &p->models[s->model];
    model_block_t **t = cache__table(p, si);
    uint64_t parent = 0;
    uint32_t pos = 0, reused = 0, looked = 0;

    assert(s->entries == 0 && s->nblocks == 0);
    *last_serial = 0;
    for (uint32_t i = 0;; i++) {
        uint32_t cap = model_block_capacity(md->m, i);
        cache__pnode_t *node;
        uint64_t h;

        /* Reused only before the last position: it is run, and its state
         * is what a pick reads. */
        if ((uint64_t)pos + cap > (uint64_t)n - 1 || n == 0)
            break;
        looked += cap;
        h = key_hash(p, s->model, scope, parent, i, tok + pos, cap);
        node = do_find(p, h, s->model, scope, parent, i, tok + pos, cap);
        if (node == NULL)
            break;
        do_take(p, s, t, i, node);
        parent = node->serial;
        pos += cap;
        reused = pos;
    }
    if (s->nblocks > 0) {
        s->head = t[0];
        s->last = t[s->nblocks - 1];
        s->tail = NULL; /* entries == room */
        s->entries = reused;
        atomic_fetch_add_explicit(&p->entries, reused, memory_order_relaxed);
    }
    p->prefix.query_entries += looked;
    p->prefix.hit_entries += reused;
    *last_serial = parent;
    return reused;
}

uint32_t cache__do_prefix_extend(cache_pool_t *p, cache__slot_t *s, uint32_t si, uint64_t scope,
                                 const uint32_t *tok, uint32_t n)
{
    const cache__model_t *md = &p->models[s->model];
    model_block_t **t = cache__table(p, si);
    uint64_t parent = 0;
    uint32_t pos = 0, reused = 0, looked = 0, i;

    if (s->entries != s->room || s->nblocks == 0 || n <= s->entries)
        return 0; /* a partly filled or reserved block comes first: computed */
    /* The chain's identity so far: each block's node, or the node of an
     * equal block (the same tokens after the same parent), which a slot
     * that computed what another had cached holds instead. */
    for (i = 0; i < s->nblocks; i++) {
        cache__pnode_t *node = cache__prefix_node_of(p, t[i]);
        uint32_t cap = t[i]->capacity;

        if (node == NULL || node->scope != scope) {
            uint64_t h = key_hash(p, s->model, scope, parent, i, tok + pos, cap);
            node = do_find(p, h, s->model, scope, parent, i, tok + pos, cap);
            if (node == NULL)
                return 0; /* nothing after an uncached block can be cached */
        }
        parent = node->serial;
        pos += cap;
    }
    for (;; i++) {
        uint32_t cap = model_block_capacity(md->m, i);
        cache__pnode_t *node;
        uint64_t h;

        /* As in attach: never the last position, whose state a pick reads. */
        if ((uint64_t)pos + cap > (uint64_t)n - 1)
            break;
        looked += cap;
        h = key_hash(p, s->model, scope, parent, i, tok + pos, cap);
        node = do_find(p, h, s->model, scope, parent, i, tok + pos, cap);
        if (node == NULL)
            break;
        do_take(p, s, t, i, node);
        parent = node->serial;
        pos += cap;
        reused += cap;
    }
    if (reused > 0) {
        s->last = t[s->nblocks - 1];
        s->tail = NULL; /* entries == room */
        s->entries += reused;
        atomic_fetch_add_explicit(&p->entries, reused, memory_order_relaxed);
    }
    p->prefix.query_entries += looked;
    p->prefix.hit_entries += reused;
    return reused;
}

static int do_grow_index(cache__prefix_t *c)
{
    uint32_t cap = c->nnodes_cap != 0 ? 2 * c->nnodes_cap : 256;
    cache__pnode_t **nodes;
    uint32_t *free_ix;

    if (cap >= UINT32_MAX / 2)
        return SLOTD_ENOMEM;
    nodes = realloc(c->nodes, cap * sizeof(*nodes));
    if (nodes == NULL)
        return SLOTD_ENOMEM;
    c->nodes = nodes;
    free_ix = realloc(c->free_ix, cap * sizeof(*free_ix));
    if (free_ix == NULL)
        return SLOTD_ENOMEM;
    c->free_ix = free_ix;
    for (uint32_t i = c->nnodes_cap; i < cap; i++) {
        c->nodes[i] = NULL;
        c->free_ix[c->nfree_ix++] = cap - 1 - (i - c->nnodes_cap);
    }
    c->nnodes_cap = cap;
    return SLOTD_OK;
}

static void do_grow_buckets(cache__prefix_t *c)
{
    uint32_t nb = 2 * c->nbuckets;
    cache__pnode_t **b = calloc(nb, sizeof(*b));

    if (b == NULL)
        return; /* longer chains, nothing worse */
    for (uint32_t i = 0; i < c->nbuckets; i++) {
        cache__pnode_t *n = c->buckets[i], *next;
        for (; n != NULL; n = next) {
            next = n->hnext;
            n->hnext = b[n->hash & (nb - 1)];
            b[n->hash & (nb - 1)] = n;
        }
    }
    free(c->buckets);
    c->buckets = b;
    c->nbuckets = nb;
}

uint32_t cache__do_prefix_publish(cache_pool_t *p, cache__slot_t *s, uint32_t si, uint64_t scope,
                                  const uint32_t *tok, uint32_t n, bool *stuck)
{
    cache__prefix_t *c = &p->prefix;
    model_block_t **t = cache__table(p, si);
    uint64_t parent = 0;
    uint32_t pos = 0, made = 0;
    uint32_t known = n < s->entries ? n : s->entries;

    for (uint32_t i = 0; i < s->nblocks; i++) {
        model_block_t *b = t[i];
        uint32_t cap = b->capacity;
        cache__pnode_t *node = cache__prefix_node_of(p, b);
        uint64_t h;

        if ((uint64_t)pos + cap > known)
            break;
        if (node != NULL) {
            parent = node->serial;
            pos += cap;
            continue;
        }
        h = key_hash(p, s->model, scope, parent, i, tok + pos, cap);
        if (do_find(p, h, s->model, scope, parent, i, tok + pos, cap) != NULL) {
            *stuck = true;
            break; /* another chain's equal block is cached: this chain's later
                      blocks cannot name theirs as parent */
        }
        if (c->nfree_ix == 0 && do_grow_index(c) != SLOTD_OK)
            break;
        node = malloc(sizeof(*node) + cap * sizeof(uint32_t));
        if (node == NULL)
            break;
        memset(node, 0, sizeof(*node));
        node->block = b;
        node->hash = h;
        node->scope = scope;
        node->serial = c->next_serial++;
        node->parent = parent;
        node->model = s->model;
        node->index = i;
        node->ntok = cap;
        memcpy(node->tok, tok + pos, cap * sizeof(uint32_t));
        node->self = c->free_ix[--c->nfree_ix];
        c->nodes[node->self] = node;
        node->hnext = c->buckets[h & (c->nbuckets - 1)];
        c->buckets[h & (c->nbuckets - 1)] = node;
        c->nnodes++;
        if (cache__do_hold(b, +1) == 2)
            p->shared_blocks++;
        __atomic_store_n(&b->provider,
                         (__atomic_load_n(&b->provider, __ATOMIC_RELAXED) & UINT32_MAX) |
                             ((uint64_t)(node->self + 1) << 32),
                         __ATOMIC_RELAXED);
        if (c->nnodes > 2 * (uint64_t)c->nbuckets)
            do_grow_buckets(c);
        parent = node->serial;
        pos += cap;
        made++;
    }
    return made;
}

int cache__prefix_check(cache_pool_t *p, uint64_t *lru_bytes, uint64_t *nodes_on_lru)
{
    const cache__prefix_t *c = &p->prefix;
    const cache__pnode_t *n;
    uint64_t entries = 0, count = 0, in_table = 0;
    int bad = 0;

    *lru_bytes = 0;
    TAILQ_FOREACH(n, &c->lru, lru)
    {
        if (!n->on_lru || cache__holders(n->block) != 1 || cache__prefix_node_of(p, n->block) != n) {
            fprintf(stderr, "cache__pool_check: a cached-only node that is not\n");
            bad++;
        }
        entries += n->block->capacity;
        *lru_bytes += p->classes[cache__page_at(p, n->block)->cls].stride;
        if (++count > c->nnodes)
            break;
    }
    if (entries != c->lru_entries) {
        fprintf(stderr, "cache__pool_check: cached-only entries %llu, counted %llu\n",
                (unsigned long long)c->lru_entries, (unsigned long long)entries);
        bad++;
    }
    for (uint32_t i = 0; i < c->nnodes_cap; i++)
        if (c->nodes[i] != NULL) {
            in_table++;
            if (c->nodes[i]->self != i || cache__prefix_node_of(p, c->nodes[i]->block) != c->nodes[i]) {
                fprintf(stderr, "cache__pool_check: node %u does not name its block\n", i);
                bad++;
            }
        }
    if (in_table != c->nnodes) {
        fprintf(stderr, "cache__pool_check: %llu nodes, counted %llu\n",
                (unsigned long long)c->nnodes, (unsigned long long)in_table);
        bad++;
    }
    *nodes_on_lru = count;
    return bad;
}
