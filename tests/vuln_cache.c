/*
 * vuln_cache.c: two deliberately wrong stage engines, kept so that the
 * stage tests are seen to fail.  Neither is used outside the tests.
 *
 * "vuln" is the stale-cache bug in its plainest form: ONE cache array for
 * the whole process (a heap chain of the real model), never rewound
 * between prompts, never released on finish, and shared by every request
 * in flight.  A start runs its prompt at whatever position the array has
 * reached, so it continues the previous requests' sequence instead of
 * beginning its own; a step picks from everything the array holds.  Its
 * id bookkeeping is correct (unknown and duplicate ids are refused): the
 * bug is only in the cache.  The array is made afresh when an engine is
 * opened, which stands for a fresh process; it has room for max_ctx
 * positions, and a request that would pass that gets SLOTD_ECACHE_FULL.
 *
 * "recompute" gives correct tokens and logits and holds exactly what a
 * request owns, but it keeps only the tokens: every step rewinds the
 * request's private chain and reruns the whole prefix before it picks, so
 * a step costs len calls instead of one.  Only the count of model calls
 * (stage 5) tells it apart from the real engine.
 *
 * Both run the real model through its public interface; nothing here
 * computes a token by itself.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/model.h"
#include "stage_engine.h"

#define VULN_ID_MAX 64

/* ---- Shared id bookkeeping ---- */

typedef struct vuln_rec {
    bool live;
    char id[VULN_ID_MAX + 1];
    int64_t *tokens;  /* recompute: the request's tokens, max_ctx of room */
    uint32_t len;     /* recompute: tokens held */
    model_kv_t chain; /* recompute: a private chain, rerun on every step */
} vuln_rec_t;

typedef struct vuln_engine {
    model_t *model;
    void *scratch;
    vuln_rec_t *recs;
    size_t nrecs;
    size_t cap;
} vuln_engine_t;

static vuln_rec_t *vuln_find(vuln_engine_t *e, const char *id)
{
    for (size_t i = 0; i < e->nrecs; i++) {
        if (e->recs[i].live && strcmp(e->recs[i].id, id) == 0) {
            return &e->recs[i];
        }
    }
    return NULL;
}

/* A record for `id` (checked: not live, 1..64 characters), not yet live. */
static int vuln_new_rec(vuln_engine_t *e, const char *id, vuln_rec_t **out, slotd_error_t *err)
{
    size_t len = strlen(id);

    if (len == 0 || len > VULN_ID_MAX) {
        return slotd_error_set(err, SLOTD_EBAD_REQUEST, "id: 1 to %d characters", VULN_ID_MAX);
    }
    if (vuln_find(e, id) != NULL) {
        return slotd_error_set(err, SLOTD_EDUPLICATE_ID, "start: '%s' is live", id);
    }
    for (size_t i = 0; i < e->nrecs; i++) {
        if (!e->recs[i].live && e->recs[i].tokens == NULL) {
            *out = &e->recs[i];
            memcpy((*out)->id, id, len + 1);
            return SLOTD_OK;
        }
    }
    if (e->nrecs == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 16;
        vuln_rec_t *recs = realloc(e->recs, cap * sizeof(*recs));
        if (recs == NULL) {
            return slotd_error_set(err, SLOTD_ENOMEM, "start: no memory for '%s'", id);
        }
        e->recs = recs;
        e->cap = cap;
    }
    *out = &e->recs[e->nrecs++];
    memset(*out, 0, sizeof(**out));
    memcpy((*out)->id, id, len + 1);
    return SLOTD_OK;
}

static void vuln_rec_free(vuln_rec_t *r)
{
    if (r->tokens != NULL) {
        model_kv_heap_free(&r->chain);
        free(r->tokens);
        r->tokens = NULL;
    }
    r->live = false;
    r->len = 0;
}

static void engine_close(void *self)
{
    vuln_engine_t *e = self;

    if (e == NULL) {
        return;
    }
    for (size_t i = 0; i < e->nrecs; i++) {
        vuln_rec_free(&e->recs[i]);
    }
    free(e->recs);
    free(e->scratch);
    if (e->model != NULL) {
        model_destroy(e->model);
    }
    free(e);
}

static int engine_open(const char *preset, vuln_engine_t **out)
{
    vuln_engine_t *e = calloc(1, sizeof(*e));
    int rc;

    if (e == NULL) {
        return SLOTD_ENOMEM;
    }
    rc = model_create(preset, &e->model);
    if (rc != SLOTD_OK) {
        free(e);
        return rc;
    }
    e->scratch = malloc(model_scratch_size(e->model) + 1);
    if (e->scratch == NULL) {
        engine_close(e);
        return SLOTD_ENOMEM;
    }
    *out = e;
    return SLOTD_OK;
}

static uint64_t engine_g_calls(void *self)
{
    vuln_engine_t *e = self;
    return model_g_calls(e->model);
}

static uint64_t engine_rows(void *self)
{
    vuln_engine_t *e = self;
    return model_rows(e->model);
}

/* ---- vuln: one process-wide array ---- */

/* The cache of the whole process: every request reads and appends here. */
static model_kv_t vuln_cache;
static bool vuln_cache_allocated;

static void vuln_close(void *self)
{
    if (vuln_cache_allocated) {
        model_kv_heap_free(&vuln_cache);
        vuln_cache_allocated = false;
    }
    engine_close(self);
}

static int vuln_open(const char *preset, const stage_limits_t *lim, void **self)
{
    vuln_engine_t *e;
    int rc;

    (void)lim;
    rc = engine_open(preset, &e);
    if (rc != SLOTD_OK) {
        return rc;
    }
    if (vuln_cache_allocated) {
        model_kv_heap_free(&vuln_cache);
        vuln_cache_allocated = false;
    }
    rc = model_kv_heap_alloc(e->model, model_max_ctx(e->model), &vuln_cache);
    if (rc != SLOTD_OK) {
        engine_close(e);
        return rc;
    }
    vuln_cache_allocated = true;
    *self = e;
    return SLOTD_OK;
}

static int vuln_start(void *self, const char *id, const int64_t *prompt, size_t n,
                      slotd_error_t *err)
{
    vuln_engine_t *e = self;
    vuln_rec_t *r;
    int rc;

    rc = model_check_prompt(e->model, prompt, n, err);
    if (rc != SLOTD_OK) {
        return rc;
    }
    rc = vuln_new_rec(e, id, &r, err);
    if (rc != SLOTD_OK) {
        return rc;
    }
    if (vuln_cache.len + n > model_max_ctx(e->model)) {
        return slotd_error_set(err, SLOTD_ECACHE_FULL, "start: the shared array is full");
    }
    /* The bug: no rewind.  The prompt continues whatever is there. */
    for (size_t i = 0; i < n; i++) {
        model_run(e->model, &vuln_cache, (uint32_t)prompt[i], e->scratch);
    }
    r->live = true;
    return SLOTD_OK;
}

static int vuln_step(void *self, const char *id, uint32_t *token, double *logits,
                     slotd_error_t *err)
{
    vuln_engine_t *e = self;
    uint32_t t;

    if (vuln_find(e, id) == NULL) {
        return slotd_error_set(err, SLOTD_EUNKNOWN_ID, "step: no live session '%s'", id);
    }
    if (vuln_cache.len + 1 > model_max_ctx(e->model)) {
        return slotd_error_set(err, SLOTD_ECACHE_FULL, "step: the shared array is full");
    }
    /* The bug: the pick reads every request's entries. */
    t = model_pick(e->model, &vuln_cache,
                   model_family(e->model) == MODEL_FAMILY_ATTN ? logits : NULL);
    model_run(e->model, &vuln_cache, t, e->scratch);
    *token = t;
    return SLOTD_OK;
}

static int vuln_finish(void *self, const char *id, uint32_t *released, slotd_error_t *err)
{
    vuln_engine_t *e = self;
    vuln_rec_t *r = vuln_find(e, id);

    if (r == NULL) {
        return slotd_error_set(err, SLOTD_EUNKNOWN_ID, "finish: no live session '%s'", id);
    }
    /* The bug: the id is forgotten, its entries stay in the array. */
    r->live = false;
    if (released != NULL) {
        *released = 0;
    }
    return SLOTD_OK;
}

static uint64_t vuln_cache_entries(void *self)
{
    (void)self;
    return vuln_cache.len;
}

static uint64_t vuln_bytes_used(void *self)
{
    vuln_engine_t *e = self;
    return (uint64_t)vuln_cache.len * model_entry_size(e->model);
}

const stage_engine_ops_t stage_engine_vuln = {
    .name = "vuln",
    .open = vuln_open,
    .close = vuln_close,
    .start = vuln_start,
    .step = vuln_step,
    .finish = vuln_finish,
    .cache_entries = vuln_cache_entries,
    .bytes_used = vuln_bytes_used,
    .g_calls = engine_g_calls,
    .rows = engine_rows,
};

/* ---- recompute: correct, one full prefix per step ---- */

static int recompute_open(const char *preset, const stage_limits_t *lim, void **self)
{
    vuln_engine_t *e;
    int rc;

    (void)lim;
    rc = engine_open(preset, &e);
    if (rc != SLOTD_OK) {
        return rc;
    }
    *self = e;
    return SLOTD_OK;
}

static int recompute_start(void *self, const char *id, const int64_t *prompt, size_t n,
                           slotd_error_t *err)
{
    vuln_engine_t *e = self;
    uint32_t max_ctx = model_max_ctx(e->model);
    vuln_rec_t *r;
    int rc;

    rc = model_check_prompt(e->model, prompt, n, err);
    if (rc != SLOTD_OK) {
        return rc;
    }
    rc = vuln_new_rec(e, id, &r, err);
    if (rc != SLOTD_OK) {
        return rc;
    }
    r->tokens = malloc(max_ctx * sizeof(*r->tokens));
    if (r->tokens == NULL) {
        return slotd_error_set(err, SLOTD_ENOMEM, "start: no memory for '%s'", id);
    }
    rc = model_kv_heap_alloc(e->model, max_ctx, &r->chain);
    if (rc != SLOTD_OK) {
        free(r->tokens);
        r->tokens = NULL;
        return slotd_error_set(err, rc, "start: no memory for '%s'", id);
    }
    memcpy(r->tokens, prompt, n * sizeof(*prompt));
    r->len = (uint32_t)n;
    /* The prefill, run once like the real engine's; a step reruns it all. */
    for (size_t i = 0; i < n; i++) {
        model_run(e->model, &r->chain, (uint32_t)prompt[i], e->scratch);
    }
    r->live = true;
    return SLOTD_OK;
}

static int recompute_step(void *self, const char *id, uint32_t *token, double *logits,
                          slotd_error_t *err)
{
    vuln_engine_t *e = self;
    vuln_rec_t *r = vuln_find(e, id);
    uint32_t t;

    if (r == NULL) {
        return slotd_error_set(err, SLOTD_EUNKNOWN_ID, "step: no live session '%s'", id);
    }
    if (r->len + 1 > model_max_ctx(e->model)) {
        return slotd_error_set(err, SLOTD_ECONTEXT_FULL, "step: '%s' is full", id);
    }
    /* The waste: nothing of the last step is kept but the tokens. */
    model_kv_rewind(&r->chain);
    for (uint32_t i = 0; i < r->len; i++) {
        model_run(e->model, &r->chain, (uint32_t)r->tokens[i], e->scratch);
    }
    t = model_pick(e->model, &r->chain,
                   model_family(e->model) == MODEL_FAMILY_ATTN ? logits : NULL);
    r->tokens[r->len++] = t;
    *token = t;
    return SLOTD_OK;
}

static int recompute_finish(void *self, const char *id, uint32_t *released, slotd_error_t *err)
{
    vuln_engine_t *e = self;
    vuln_rec_t *r = vuln_find(e, id);

    if (r == NULL) {
        return slotd_error_set(err, SLOTD_EUNKNOWN_ID, "finish: no live session '%s'", id);
    }
    if (released != NULL) {
        *released = r->len;
    }
    vuln_rec_free(r);
    return SLOTD_OK;
}

static uint64_t recompute_cache_entries(void *self)
{
    vuln_engine_t *e = self;
    uint64_t n = 0;

    for (size_t i = 0; i < e->nrecs; i++) {
        if (e->recs[i].live) {
            n += e->recs[i].len;
        }
    }
    return n;
}

static uint64_t recompute_bytes_used(void *self)
{
    vuln_engine_t *e = self;
    return recompute_cache_entries(self) * model_entry_size(e->model);
}

const stage_engine_ops_t stage_engine_recompute = {
    .name = "recompute",
    .open = recompute_open,
    .close = engine_close,
    .start = recompute_start,
    .step = recompute_step,
    .finish = recompute_finish,
    .cache_entries = recompute_cache_entries,
    .bytes_used = recompute_bytes_used,
    .g_calls = engine_g_calls,
    .rows = engine_rows,
};
