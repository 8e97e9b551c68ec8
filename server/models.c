/*
 * models.c: the presets the daemon may serve, and the building of their
 * weights.
 *
 * It owns one server_preset_t per --models preset (server->presets, with
 * server->models[] pointing at the same models): the model, made at start
 * from its shape and block plan only (model_create_shape()), so that the
 * pool, the workers' buffers and the audit are sized for every preset
 * before any weights exist; and the weights, made by model_build() the
 * first time a request names the preset, or at start for --preload.
 *
 * Threads.  Everything here runs on the loop thread except build_work(),
 * which runs on libuv's thread pool (uv_queue_work()), one build per preset
 * at a time (`building`).  The building thread writes the weights, then
 * `build_rc` and `build_ns`, then stores `ready` with release; the loop
 * thread reads `ready` with acquire (models__ready()), and the
 * others after build_done() (libuv hands the request back under its own
 * lock).  Workers only run a preset after the loop thread saw it ready and
 * handed them a job, so they see the weights complete.  No lock of its
 * own.
 *
 * A request for a preset not built yet waits on its connection as a
 * barrier (dispatch.c, REQ_BUILD): the connection's later lines wait
 * behind it, other connections and the admin port are served meanwhile,
 * and build_done() has each waiting request applied, in its connection's
 * order, through conn_hooks_t.model_built: dispatch.c calls this file, not
 * the other way (docs/design.md, "Presets built on first use", "server/
 * layout").
 */
#include "models_int.h"

#include <assert.h>
#include <inttypes.h>
#include <string.h>
#include <time.h>

#include "core/util.h"
#include "server/base/log.h"

/* Builds the weights of `p` and publishes them; any thread.  `delay_ms`
 * is a test build's fault (--fault-build-delay-ms), 0 otherwise. */
static void build_now(server_preset_t *p, uint32_t delay_ms)
{
    uint64_t t0 = uv_hrtime();

    if (delay_ms > 0) {
        struct timespec ts = {delay_ms / 1000, (long)(delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    p->build_rc = model_build(p->model);
    p->build_ns = uv_hrtime() - t0;
    if (p->build_rc == SLOTD_OK)
        atomic_store_explicit(&p->ready, true, memory_order_release);
}

/* Logs and counts a build that ended; loop thread (or start-up). */
static void build_report(const server_preset_t *p, const char *when)
{
    const model_t *m = p->model;

    if (p->build_rc != SLOTD_OK) {
        log_error("model %s: building its weights failed: %s", model_name(m),
                  slotd_strerror(p->build_rc));
        return;
    }
    metrics_count_model_build(p->index);
    metrics_count_model_build_ns_n(p->build_ns, p->index);
    log_info("model %s: built %s in %.3f s: %s, V=%u, max_ctx=%u, %zu bytes per entry",
             model_name(m), when, (double)p->build_ns / 1e9,
             model_family(m) == MODEL_FAMILY_ATTN ? "attn" : "hash", model_vocab(m),
             model_max_ctx(m), model_entry_size(m));
}

static void build_work(uv_work_t *w)
{
    server_preset_t *p = container_of(w, server_preset_t, work);
    uint32_t delay_ms = 0;

#if SLOTD_FAULT_INJECTION
    delay_ms = p->server->cfg->fault_build_delay_ms;
#endif
    build_now(p, delay_ms);
}

static void build_done(uv_work_t *w, int status)
{
    server_preset_t *p = container_of(w, server_preset_t, work);
    server_t *s = p->server;
    conn_t *c, *next;
    int rc;

    p->building = false;
    if (status != 0) /* canceled: nothing cancels a build */
        p->build_rc = SLOTD_EINVAL;
    rc = p->build_rc;
    build_report(p, "on first use");
    /* Each connection has at most one request waiting: its barrier. */
    for (c = s->conns; c != NULL; c = next) {
        next = c->next;
        s->hooks.model_built(c, p->model, rc);
    }
}

int models__load(server_t *s)
{
    const server_config_t *cfg = s->cfg;
    int rc;

    for (size_t i = 0; i < cfg->nmodels; i++) {
        server_preset_t *p = &s->presets[i];
        model_t *m;

        rc = model_create_shape(cfg->models[i], &m);
        if (rc != SLOTD_OK) {
            log_error("model %s: %s", cfg->models[i], slotd_strerror(rc));
            return rc;
        }
        s->models[s->nmodels++] = m;
        metrics_model_served(model_preset_index(m));
        p->model = m;
        p->server = s;
        p->index = model_preset_index(m);
        s->costs[p->index].lone = !model_batch_shares(m); /* known from the shape */
        atomic_init(&p->ready, false);
    }
    for (size_t i = 0; i < cfg->npreload; i++) {
        server_preset_t *p = &s->presets[0];

        while (strcmp(model_name(p->model), cfg->preload[i]) != 0)
            p++; /* config_parse() checked it is among --models */
        build_now(p, 0);
        build_report(p, "at start (--preload)");
        if (p->build_rc != SLOTD_OK)
            return p->build_rc;
    }
    for (size_t i = 0; i < s->nmodels; i++)
        if (!model_built(s->models[i]))
            log_info("model %s: allowed; its weights are built on first use",
                     model_name(s->models[i]));
    log_info("models: %s kernels, batches of up to %u steps", model_simd(), cfg->max_batch);
    s->default_model = models__find(s, cfg->default_model);
    assert(s->default_model != NULL); /* config_parse() checked it */
    return SLOTD_OK;
}

const model_t *models__find(const server_t *s, const char *name)
{
    for (size_t i = 0; i < s->nmodels; i++)
        if (strcmp(model_name(s->models[i]), name) == 0)
            return s->models[i];
    return NULL;
}

bool models__ready(server_t *s, const model_t *m)
{
    server_preset_t *p = s->presets;
    int rc;

    while (p->model != m)
        p++;
    if (atomic_load_explicit(&p->ready, memory_order_acquire))
        return true;
    if (!p->building) {
        rc = uv_queue_work(&s->loop, &p->work, build_work, build_done);
        assert(rc == 0); /* it fails only without a work callback */
        (void)rc;
        p->building = true;
        log_info("model %s: building its weights (first request naming it)", model_name(m));
    }
    return false;
}

void models__free(server_t *s)
{
    for (size_t i = 0; i < s->nmodels; i++)
        model_destroy(s->models[i]);
    s->nmodels = 0;
}
