/*
 * engine_real.c: the stage engine over the real cache code.
 *
 * It owns a model, a slot pool serving it, one scratch buffer and a map
 * from request id to cache_session_t, and nothing more: every decision
 * about slots and entries is cache/session's and cache/pool's.  The map
 * plays the server's part (one connection, owner key 1): it turns an id
 * into a live session, refuses a duplicate, and forgets an id on finish,
 * so that a second finish or a step on an unknown id never reaches the
 * pool.  It is a plain array searched in order; tests hold few sessions.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cache/session.h"
#include "stage_engine.h"

/* The owner key of every session of this engine, as one connection's. */
#define REAL_OWNER_KEY 1

typedef struct real_rec {
    bool live;
    cache_session_t s;
} real_rec_t;

typedef struct real_engine {
    model_t *model;
    cache_pool_t *pool;
    void *scratch;
    real_rec_t *recs; /* live and dead records; a dead one is reused */
    size_t nrecs;
    size_t cap;
} real_engine_t;

static real_rec_t *real_find(real_engine_t *e, const char *id)
{
    for (size_t i = 0; i < e->nrecs; i++) {
        if (e->recs[i].live && strcmp(e->recs[i].s.owner.id, id) == 0) {
            return &e->recs[i];
        }
    }
    return NULL;
}

/* A record to start a session in: a dead one, or a new one at the end. */
static real_rec_t *real_free_rec(real_engine_t *e)
{
    for (size_t i = 0; i < e->nrecs; i++) {
        if (!e->recs[i].live) {
            return &e->recs[i];
        }
    }
    if (e->nrecs == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 16;
        real_rec_t *recs = realloc(e->recs, cap * sizeof(*recs));
        if (recs == NULL) {
            return NULL;
        }
        e->recs = recs;
        e->cap = cap;
    }
    e->recs[e->nrecs].live = false;
    return &e->recs[e->nrecs++];
}

static void real_close(void *self)
{
    real_engine_t *e = self;

    if (e == NULL) {
        return;
    }
    if (e->pool != NULL) {
        for (size_t i = 0; i < e->nrecs; i++) {
            if (e->recs[i].live) {
                (void)cache_session_finish(e->pool, &e->recs[i].s, NULL);
            }
        }
        cache_pool_destroy(e->pool);
    }
    if (e->model != NULL) {
        model_destroy(e->model);
    }
    free(e->recs);
    free(e->scratch);
    free(e);
}

static int real_open(const char *preset, const stage_limits_t *lim, void **self)
{
    real_engine_t *e = calloc(1, sizeof(*e));
    cache_pool_config_t cfg;
    const model_t *models[1];
    int rc;

    memset(&cfg, 0, sizeof(cfg)); /* every member set below; the prefix cache off */
    if (e == NULL) {
        return SLOTD_ENOMEM;
    }
    rc = model_create(preset, &e->model);
    if (rc != SLOTD_OK) {
        goto fail;
    }
    e->scratch = malloc(model_scratch_size(e->model) + 1);
    if (e->scratch == NULL) {
        rc = SLOTD_ENOMEM;
        goto fail;
    }
    models[0] = e->model;
    cfg.capacity_bytes = lim != NULL && lim->capacity_bytes ? lim->capacity_bytes : 64u << 20;
    cfg.max_slots = lim != NULL && lim->max_slots ? lim->max_slots : 256;
    cfg.models = models;
    cfg.nmodels = 1;
    cfg.arena_factor = 2; /* as the daemon maps it */
    rc = cache_pool_create(&cfg, &e->pool);
    if (rc != SLOTD_OK) {
        goto fail;
    }
    *self = e;
    return SLOTD_OK;

fail:
    real_close(e);
    return rc;
}

static int real_start(void *self, const char *id, const int64_t *prompt, size_t n,
                      slotd_error_t *err)
{
    real_engine_t *e = self;
    cache_owner_t owner;
    real_rec_t *r;
    size_t len = strlen(id);
    int rc;

    if (len == 0 || len > CACHE_ID_MAX) {
        return slotd_error_set(err, SLOTD_EBAD_REQUEST, "id: 1 to %d characters", CACHE_ID_MAX);
    }
    if (real_find(e, id) != NULL) {
        return slotd_error_set(err, SLOTD_EDUPLICATE_ID, "start: '%s' is live", id);
    }
    r = real_free_rec(e);
    if (r == NULL) {
        return slotd_error_set(err, SLOTD_ENOMEM, "start: no memory for '%s'", id);
    }
    owner.key = REAL_OWNER_KEY;
    memcpy(owner.id, id, len + 1);
    rc = cache_session_start(e->pool, e->model, &owner, prompt, n, e->scratch, &r->s, err);
    if (rc != SLOTD_OK) {
        return rc;
    }
    r->live = true;
    return SLOTD_OK;
}

static int real_step(void *self, const char *id, uint32_t *token, double *logits,
                     slotd_error_t *err)
{
    real_engine_t *e = self;
    real_rec_t *r = real_find(e, id);

    if (r == NULL) {
        return slotd_error_set(err, SLOTD_EUNKNOWN_ID, "step: no live session '%s'", id);
    }
    return cache_session_step(e->pool, &r->s, 1, e->scratch, token, logits, err);
}

static int real_finish(void *self, const char *id, uint32_t *released, slotd_error_t *err)
{
    real_engine_t *e = self;
    real_rec_t *r = real_find(e, id);
    int rc;

    if (r == NULL) {
        return slotd_error_set(err, SLOTD_EUNKNOWN_ID, "finish: no live session '%s'", id);
    }
    rc = cache_session_finish(e->pool, &r->s, released);
    if (rc != SLOTD_OK) {
        return slotd_error_set(err, rc, "finish: '%s': %s", id, slotd_strerror(rc));
    }
    r->live = false;
    return SLOTD_OK;
}

static uint64_t real_cache_entries(void *self)
{
    real_engine_t *e = self;
    return cache_pool_entries(e->pool);
}

static uint64_t real_bytes_used(void *self)
{
    real_engine_t *e = self;
    cache_pool_stats_t st;

    cache_pool_stats(e->pool, &st);
    return st.bytes_used;
}

static uint64_t real_g_calls(void *self)
{
    real_engine_t *e = self;
    return model_g_calls(e->model);
}

static uint64_t real_rows(void *self)
{
    real_engine_t *e = self;
    return model_rows(e->model);
}

const stage_engine_ops_t stage_engine_real = {
    .name = "real",
    .open = real_open,
    .close = real_close,
    .start = real_start,
    .step = real_step,
    .finish = real_finish,
    .cache_entries = real_cache_entries,
    .bytes_used = real_bytes_used,
    .g_calls = real_g_calls,
    .rows = real_rows,
};
