/*
 * pool_check_int.h: what the pool's files share with the cache tests and nobody else.
 *
 * The pool's layout constants, the debug poison, an allocator hook for
 * testing allocation failure, and read-only views of the page bookkeeping
 * so that a test can see which page an object lives on and check every
 * internal invariant.  Nothing here is part of the pool's contract.
 */
#ifndef SLOTD_CACHE_POOL_CHECK_INT_H
#define SLOTD_CACHE_POOL_CHECK_INT_H

#include <stddef.h>
#include <stdint.h>

#include "cache/pool.h"
#include "core/util.h"

/* Every object (block or state) starts on a multiple of this. */
#define CACHE__ALIGN SLOTD_CACHE_LINE

/* A page is the smallest multiple of the largest page unit (slab.c,
 * cache__page_unit()) or state that reaches this. */
#define CACHE__PAGE_MIN ((size_t)64 * 1024)

/* The largest cache_pool_config_t.arena_factor. */
#define CACHE__ARENA_FACTOR_MAX 8

/* Debug builds fill a released object with this byte; its first word keeps
 * a list link and its second word holds CACHE__FREE_MAGIC. */
#define CACHE__POISON 0xDB
#define CACHE__FREE_MAGIC UINT64_C(0xF4EEF4EEDBDBF4EE)

/** Replaces the calloc() the pool uses for its tables (NULL restores
 * calloc).  For allocation-failure tests; not thread-safe, set it while no
 * pool is being created. */
void cache__pool_set_calloc(void *(*fn)(size_t nmemb, size_t size));

/** Bytes of one page of `p`'s arena. */
size_t cache__pool_page_size(cache_pool_t *p);

/** Pages in the arena, and pages on the free-page list right now (with
 * every object parked in a thread cache taken back first, so that the
 * pages look as they would without thread caches). */
uint32_t cache__pool_pages(cache_pool_t *p);
uint32_t cache__pool_pages_free(cache_pool_t *p);

/** The page that holds `obj`, or -1 if `obj` is not in the arena. */
int64_t cache__pool_page_of(cache_pool_t *p, const void *obj);

/** The object size (stride) of the class page `page` is assigned to, or 0
 * while the page is free (parked objects taken back first, as above). */
size_t cache__pool_page_stride(cache_pool_t *p, uint32_t page);

/** Walks every table and list and checks the invariants the O(1) paths
 * rely on (byte and entry totals, chain lengths and tails, per-page and
 * per-class free counts, list membership), and every object parked in a
 * thread cache (in the arena, of its class, poisoned in debug builds)
 * before taking them all back.  Returns the number of violations found, 0
 * for a sound pool; prints each one to stderr.  Takes the lock; O(slots +
 * pages + blocks + parked objects). */
int cache__pool_check(cache_pool_t *p);

/** Returns `obj` to its page as a release does, guard checks included.
 * Only for the test that proves a second free of one object trips the
 * guard (debug builds). */
void cache__pool_debug_free(cache_pool_t *p, void *obj);

#if SLOTD_FAULT_INJECTION
/** Test builds only: with `on`, every block's hash in the prefix cache is
 * the same, so that every lookup meets every cached block of every model
 * and scope, and only the comparison of the identities (tokens included)
 * tells them apart.  Not thread-safe; set it while no pool is in use. */
void cache__prefix_force_collisions(bool on);
#endif

#endif
