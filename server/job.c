/*
 * job.c: what a worker thread does with a request record: the model call
 * of a start (prefill), a step, a logits or a generate, and the formatting
 * of its reply line into the record.
 *
 * DESIGN.  Runs on the worker threads only, one record per call.  It reads
 * the record's request and input fields and writes only its result fields
 * (cs, rc, reply); the server's pool pointer is immutable after start-up,
 * and the pool and the models are thread-safe.  It never touches the
 * connection, the session record or any libuv handle.  Token and logit
 * buffers are the worker's own (worker_tokens(), worker_logits()).
 */
#include <string.h>

#include "log.h"
#include "server_int.h"

#if SLOTD_FAULT_INJECTION
/* Test-only faults (a wedged worker, a corrupted slot) hook in here, at the
 * start of every job a worker runs; see SLOTD_FAULT_INJECTION in
 * cmake/flags.cmake.  None is defined yet. */
static void job_fault(req_t *r)
{
    (void)r;
}
#define JOB_FAULT_POINT(r) job_fault(r)
#else
#define JOB_FAULT_POINT(r) ((void)0)
#endif

static int run_start(server_t *s, worker_t *w, req_t *r, slotd_error_t *err)
{
    cache_owner_t owner;
    int rc;

    owner.key = r->owner_key;
    memcpy(owner.id, r->rq.id, sizeof(owner.id));
    rc = cache_session_start(s->pool, r->model, &owner, r->rq.tokens, r->rq.ntokens,
                             worker_scratch(w), &r->cs, err);
    if (rc != SLOTD_OK)
        return rc;
    rc = proto_reply_start(&r->reply, r->rq.tag, r->rq.id, model_name(r->model), r->cs.entries);
    if (rc != SLOTD_OK) /* no reply, no session: give the slot back */
        (void)cache_session_finish(s->pool, &r->cs, &(uint32_t){0});
    return rc;
}

static int run_step(server_t *s, worker_t *w, req_t *r, slotd_error_t *err)
{
    const model_t *m = r->cs.model;
    uint32_t n = r->rq.n, vocab = model_vocab(m), max_ctx = model_max_ctx(m);
    bool attn = model_family(m) == MODEL_FAMILY_ATTN;
    uint32_t *tokens;
    double *logits = NULL;
    int rc;

    /* Checked before the buffers are sized: n comes from the client. */
    if (r->cs.entries > max_ctx || n > max_ctx - r->cs.entries)
        return slotd_error_set(
            err, SLOTD_ECONTEXT_FULL,
            "step: %u more entries would pass max_ctx %u (session '%s' holds %u)", n, max_ctx,
            r->rq.id, r->cs.entries);
    tokens = worker_tokens(w, n);
    if (attn)
        logits = worker_logits(w, (size_t)n * vocab);
    if (tokens == NULL || (attn && logits == NULL))
        return SLOTD_ENOMEM;
    rc = cache_session_step(s->pool, &r->cs, n, worker_scratch(w), tokens, logits, err);
    if (rc != SLOTD_OK)
        return rc;
    return proto_reply_step(&r->reply, r->rq.tag, r->rq.id, tokens, n, logits, vocab,
                            r->cs.entries);
}

static int run_logits(server_t *s, worker_t *w, req_t *r, slotd_error_t *err)
{
    uint32_t vocab = model_vocab(r->model);
    double *logits = worker_logits(w, vocab);
    uint64_t rows = 0;
    int rc;

    if (logits == NULL)
        return SLOTD_ENOMEM;
    rc = cache_session_logits(s->pool, r->model, r->rq.tokens, r->rq.ntokens, worker_scratch(w),
                              logits, &rows, err);
    if (rc != SLOTD_OK)
        return rc;
    return proto_reply_logits(&r->reply, r->rq.tag, logits, vocab, rows);
}

static int run_generate(server_t *s, worker_t *w, req_t *r, slotd_error_t *err)
{
    uint32_t vocab = model_vocab(r->model);
    size_t steps = (size_t)r->rq.steps; /* validated on the loop: n + steps <= max_ctx */
    size_t total = r->rq.ntokens + steps;
    uint32_t *tokens = worker_tokens(w, total);
    double *logits = worker_logits(w, steps * vocab);
    uint64_t rows = 0;
    int rc;

    if (tokens == NULL || logits == NULL)
        return SLOTD_ENOMEM;
    rc = cache_session_generate(s->pool, r->model, r->rq.tokens, r->rq.ntokens, r->rq.steps,
                                r->rq.use_cache, worker_scratch(w), tokens, logits, &rows, err);
    if (rc != SLOTD_OK)
        return rc;
    return proto_reply_generate(&r->reply, r->rq.tag, tokens, total, logits, steps, vocab, rows);
}

void job_run(worker_t *w, worker_job_t *job, void *arg)
{
    server_t *s = arg;
    req_t *r = container_of(job, req_t, job);
    slotd_error_t err = {SLOTD_OK, ""};
    int rc;

    if (atomic_load_explicit(&r->canceled, memory_order_relaxed)) {
        r->rc = SLOTD_ESHUTTING_DOWN; /* the connection is gone: nobody reads it */
        return;
    }
    JOB_FAULT_POINT(r);

    switch (r->rq.op) {
    case PROTO_OP_START:
        rc = run_start(s, w, r, &err);
        break;
    case PROTO_OP_STEP:
        rc = run_step(s, w, r, &err);
        break;
    case PROTO_OP_LOGITS:
        rc = run_logits(s, w, r, &err);
        break;
    case PROTO_OP_GENERATE:
        rc = run_generate(s, w, r, &err);
        break;
    default:
        rc = SLOTD_EINVAL; /* only these four ops are ever submitted */
        break;
    }

    /* A wire error gets its reply here; an internal one (no memory, a
     * stale handle) reaches no client: the loop thread closes the
     * connection instead. */
    if (rc < 0 && rc != SLOTD_ENOMEM && rc != SLOTD_ESTALE && rc != SLOTD_EINVAL) {
        r->reply.len = 0;
        if (proto_reply_error(&r->reply, r->rq.tag, &err) != SLOTD_OK)
            rc = SLOTD_ENOMEM;
    }
    r->rc = rc;
    if (r->rq.op == PROTO_OP_STEP) {
        uint64_t now = uv_hrtime();
        metrics_observe_step(now - worker_job_start(w), now);
    }
}
