/*
 * arena.c: the memory cJSON builds a request's tree in: a bump arena per
 * thread (a static block, then overflow chunks from proto__realloc()), and
 * the cJSON allocation hooks that serve from it during a parse and are
 * plain malloc and free outside one.
 *
 * Threads.  Each thread has its own arena (thread-local, so no lock); the
 * hooks are installed once per process by proto_init() (request.c).
 * Nothing cut from
 * an arena outlives the proto__arena_begin() ... proto__arena_end() pair
 * of the parse that cut it.
 *
 * Design: docs/design.md, "Parsing a request line" (cJSON's memory).
 */
#include "proto/parse_int.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define PROTO_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PROTO_ASAN 1
#endif
#endif
#ifdef PROTO_ASAN
#include <sanitizer/asan_interface.h>
#define ARENA_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define ARENA_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#define ARENA_REDZONE 16 /* poisoned bytes after each allocation */
#else
#define ARENA_POISON(p, n) ((void)(p), (void)(n))
#define ARENA_UNPOISON(p, n) ((void)(p), (void)(n))
#define ARENA_REDZONE 0
#endif

/* The arena: a static block per thread (a start with a prompt of about 200
 * tokens fits), then overflow chunks of at least ARENA_CHUNK_MIN bytes,
 * each twice the last. */
#define ARENA_BLOCK 16384
#define ARENA_CHUNK_MIN 65536
#define ARENA_ALIGN (alignof(max_align_t))

/* ---- cJSON's memory: a bump arena per thread ---- */

/* An overflow chunk, from proto__realloc(); freed by proto__arena_end(). */
typedef struct arena_chunk {
    struct arena_chunk *prev; /* the chunk before it, NULL for the first */
    size_t cap;               /* bytes in data */
    max_align_t data[];
} arena_chunk_t;

/* One thread's arena.  Active only inside proto_request_parse(), and
 * nothing allocated from it outlives that call. */
typedef struct arena {
    unsigned char *cur;    /* the block or the newest chunk */
    size_t used, cap;      /* of cur */
    size_t block_used;     /* of the block, once a chunk took over */
    arena_chunk_t *chunks; /* overflow chunks, newest first; owned */
    size_t allocs;         /* allocations served since proto__arena_begin() */
    bool active;
    bool poisoned; /* ASan: the block was poisoned once */
    proto__arena_stats_t last;
} arena_t;

static _Thread_local arena_t arena;
static _Thread_local max_align_t arena_block[ARENA_BLOCK / sizeof(max_align_t)];

void proto__arena_begin(void)
{
    arena_t *a = &arena;

    assert(!a->active && a->chunks == NULL);
    if (!a->poisoned) {
        ARENA_POISON(arena_block, sizeof(arena_block));
        a->poisoned = true;
    }
    a->cur = (unsigned char *)arena_block;
    a->used = 0;
    a->cap = sizeof(arena_block);
    a->block_used = 0;
    a->allocs = 0;
    a->active = true;
}

/* `n` bytes aligned like malloc's, or NULL when no chunk could be had. */
void *proto__arena_alloc(size_t n)
{
    arena_t *a = &arena;
    size_t need = (n + ARENA_REDZONE + ARENA_ALIGN) & ~(ARENA_ALIGN - 1);
    unsigned char *p;

    assert(a->active);
    if (need < n || need > (size_t)PTRDIFF_MAX - sizeof(arena_chunk_t))
        return NULL;
    if (a->cap - a->used < need) {
        size_t size = a->chunks != NULL ? a->chunks->cap * 2 : ARENA_CHUNK_MIN;
        arena_chunk_t *c;
        if (size < need)
            size = need;
        c = proto__realloc(NULL, sizeof(*c) + size);
        if (c == NULL)
            return NULL;
        if (a->chunks == NULL)
            a->block_used = a->used;
        c->prev = a->chunks;
        c->cap = size;
        a->chunks = c;
        a->cur = (unsigned char *)c->data;
        a->used = 0;
        a->cap = size;
        ARENA_POISON(c->data, size);
    }
    p = a->cur + a->used;
    a->used += need;
    a->allocs++;
    ARENA_UNPOISON(p, n);
    return p;
}

/* Whether `p` points into this thread's active arena. */
static bool arena_owns(const void *p)
{
    const arena_t *a = &arena;
    uintptr_t u = (uintptr_t)p, b = (uintptr_t)arena_block;

    if (!a->active)
        return false;
    if (u >= b && u < b + sizeof(arena_block))
        return true;
    for (const arena_chunk_t *c = a->chunks; c != NULL; c = c->prev) {
        b = (uintptr_t)c->data;
        if (u >= b && u < b + c->cap)
            return true;
    }
    return false;
}

/* Lets go of everything the arena handed out since proto__arena_begin(). */
void proto__arena_end(void)
{
    arena_t *a = &arena;
    arena_chunk_t *c = a->chunks, *prev;

    assert(a->active);
    if (c == NULL)
        a->block_used = a->used;
    a->last = (proto__arena_stats_t){.allocs = a->allocs, .block_bytes = a->block_used};
    for (; c != NULL; c = prev) {
        prev = c->prev;
        a->last.chunks++;
        a->last.chunk_bytes += c->cap;
        ARENA_UNPOISON(c->data, c->cap);
        free(c);
    }
    a->chunks = NULL;
#ifdef PROTO_ASAN
    ARENA_POISON(arena_block, a->block_used);
#elif !defined(NDEBUG)
    /* A pointer kept past the parse reads garbage at once. */
    memset(arena_block, 0xA5, a->block_used);
#endif
    a->active = false;
}

static void *json_malloc(size_t n)
{
    return arena.active ? proto__arena_alloc(n) : malloc(n);
}

static void json_free(void *p)
{
    if (!arena_owns(p))
        free(p);
}

void proto__json_hooks_install(void)
{
    cJSON_Hooks hooks = {json_malloc, json_free};
    cJSON_InitHooks(&hooks);
}

void proto__arena_last(proto__arena_stats_t *out)
{
    *out = arena.last;
}

size_t proto__arena_allocs(void)
{
    return arena.allocs;
}
