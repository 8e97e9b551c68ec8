/*
 * stage_engine.h: the small engine interface the stage tests are written
 * against.
 *
 * An engine serves one model to many request ids at once: start a request
 * with its prompt, step it one greedy token at a time, finish it.  It also
 * reports what it holds (cache entries, bytes) and how many model calls it
 * made.  The stage tests (test_stages.c) know nothing else about an engine,
 * so one suite runs against the real one (engine_real.c, cache/session on
 * a slot pool) and against the deliberately broken ones of vuln_cache.c,
 * which the suite must catch.
 *
 * Every call returns SLOTD_OK or a negative slotd code, and fills `err`
 * (which may be NULL) on failure.  An engine instance is used by one thread.
 */
#ifndef SLOTD_TESTS_STAGE_ENGINE_H
#define SLOTD_TESTS_STAGE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/** Limits an engine may be opened with; a zero field means the engine's
 * default.  Engines without a pool ignore them. */
typedef struct stage_limits {
    size_t capacity_bytes; /* the pool's budget */
    uint32_t max_slots;    /* live requests at most */
} stage_limits_t;

/** One engine: a table of functions on an instance it creates.  The
 * instance (`self`) is owned by the caller from open() until close(). */
typedef struct stage_engine_ops {
    /** The name the test binary selects it by ("real", "vuln", ...). */
    const char *name;
    /** Creates an instance serving the model `preset` with its own model
     * object (and so its own call counters).  `lim` may be NULL. */
    int (*open)(const char *preset, const stage_limits_t *lim, void **self);
    /** Frees the instance and everything it still holds. */
    void (*close)(void *self);
    /** Starts request `id` (1..64 characters, copied) and runs its prompt
     * (`n` tokens, read during the call only).  SLOTD_EDUPLICATE_ID for a
     * live id; the prompt's and the capacity's errors as session.h says. */
    int (*start)(void *self, const char *id, const int64_t *prompt, size_t n, slotd_error_t *err);
    /** One greedy step of `id`: *token gets the pick and, for attn models
     * when `logits` is not NULL, `logits` the V rounded scores behind it.
     * SLOTD_EUNKNOWN_ID, SLOTD_ECONTEXT_FULL, SLOTD_ECACHE_FULL. */
    int (*step)(void *self, const char *id, uint32_t *token, double *logits, slotd_error_t *err);
    /** Ends `id`; *released (may be NULL) gets the entries given back.
     * SLOTD_EUNKNOWN_ID for an id that is not live. */
    int (*finish)(void *self, const char *id, uint32_t *released, slotd_error_t *err);
    /** Entries held for all requests now. */
    uint64_t (*cache_entries)(void *self);
    /** Bytes of cache memory held for requests now. */
    uint64_t (*bytes_used)(void *self);
    /** The model's counters since open(): g calls and attention rows. */
    uint64_t (*g_calls)(void *self);
    uint64_t (*rows)(void *self);
    /** Whether live request `id` is evicted now (it then holds nothing in
     * the pool, docs/protocol.md "When the pool is full"); NULL for an
     * engine that never evicts. */
    bool (*evicted)(void *self, const char *id);
} stage_engine_ops_t;

/** The real engine: cache/session on a slot pool (engine_real.c). */
extern const stage_engine_ops_t stage_engine_real;

/** One process-wide cache array, never reset, never released, shared by
 * every request: the stale-cache bug (vuln_cache.c). */
extern const stage_engine_ops_t stage_engine_vuln;

/** Correct results, but every step reruns the whole prefix (vuln_cache.c). */
extern const stage_engine_ops_t stage_engine_recompute;

/** The real daemon under --on-full evict over a pool kept full
 * (engine_daemon.c; only in test_stages_evict, which links tests/itest.c). */
extern const stage_engine_ops_t stage_engine_daemon;

#endif
