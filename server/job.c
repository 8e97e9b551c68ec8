/*
 * job.c: what a worker thread does with a request record: the model call
 * of a start (prefill), a step, an append, a logits or a generate, the
 * copy of a fork, and the formatting
 * of its reply line into the record; the recording of a session's tokens
 * (audit, --on-full evict, the prefix cache), the publishing of the blocks
 * its steps and appends fill; the batches of single steps of one model
 * (job_group(), job_run_batch(), --max-batch), whose records each get
 * their own reply; and long jobs (a step of many positions, a generate)
 * run in slices, between which the worker counts its progress and serves
 * other flows (worker_yield()).  What it calls for the rest: jobcost.c
 * (a job's cost, the times it notes), jobaudit.c (a step's audit),
 * jobfault.c (test builds' fault hooks).
 *
 * DESIGN.  Runs on the worker threads only, one record per call.  It reads
 * the record's request and input fields and writes only its result fields
 * (cs, toks, rc, reply); the server's pool and audit pointers are
 * immutable after start-up, the pool and the models are thread-safe, and
 * the audit's per-worker part belongs to this worker.  It never touches
 * the connection, the session record or any libuv handle.  Token and logit
 * buffers are the worker's own (worker_tokens(), worker_logits()); a job
 * that worker_yield() runs inside a long one gets buffers of its own.
 */
#include <assert.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "controls.h"
#include "job_int.h"
#include "jobaudit_int.h"
#include "jobcost_int.h"
#include "jobfault_int.h"
#include "server/base/log.h"

/* ---- Long jobs, in slices (worker.h, "Long jobs") ----
 *
 * A step of many positions or a generate estimated dearer than a slice
 * (long_slice_ns(); or of more than a batch call's positions while its
 * model is not timed yet) makes the model calls cache_session_step() and
 * model_generate() would, in the same order on the same slot, but a few
 * positions at a time: picks and runs one by one, a prompt or a rerun
 * prefix through model_prefill() a batch call at a time (which gives the
 * entries, state and counters of one call over them all); a slice is at
 * least one such call.  The result is bit for bit theirs.  At the end of
 * each slice the job counts its positions (worker_progress(), which is
 * what keeps /health at 200) and lets the worker run jobs that would wait
 * for it (worker_yield()).  Nothing lives in the scratch between two calls, so
 * those jobs may use it; the slot is reserved before the first position,
 * so a refusal changes nothing, and then the unsliced call is made for
 * its error. */

/* Others' jobs may run for up to this many slices at one yield, each
 * estimated at this many slices at most (an estimate: a `tiny` step's,
 * timed by the wall clock, grows on a loaded machine). */
#define JOB_YIELD_SLICES 8

/* The time of others' jobs run within this thread's current job, for
 * cost_measured(). */
static _Thread_local uint64_t job_lent_ns;

/* A long job's slice: the chain's, or JOB_CHAIN_SLICE_NS with --batch-us
 * 0 (a long job runs in slices whatever the batch bound). */
static uint64_t long_slice_ns(const server_t *s)
{
    uint64_t slice = jobcost__chain_slice(s);

    return slice > 0 ? slice : JOB_CHAIN_SLICE_NS;
}

/* Whether a job of `positions` model positions and estimated `cost`, of a
 * model whose mean per position is `mean` (0: not timed yet), runs in
 * slices. */
static bool cost_is_long(const server_t *s, uint64_t cost, uint64_t mean, uint64_t positions)
{
    return cost > long_slice_ns(s) || (mean == 0 && positions > MODEL_BATCH_MAX);
}

/* Whether a step of `n` positions of model `m` runs in slices. */
static bool step_is_long(const server_t *s, const model_t *m, uint32_t n)
{
    const job_costs_t *c = jobcost__of(s, m);

    return cost_is_long(s, jobcost__step(c, n),
                        atomic_load_explicit(&c->step_ns, memory_order_relaxed), n);
}

/* Whether generate `r` runs in slices. */
static bool generate_is_long(const server_t *s, const req_t *r)
{
    const job_costs_t *c = jobcost__of(s, r->model);
    uint64_t n = r->rq.ntokens, steps = (uint64_t)r->rq.steps;
    /* Positions run: uncached, each pick runs its whole prefix again. */
    uint64_t positions = r->rq.use_cache ? n + steps : steps * n + steps * (steps - 1) / 2;

    return cost_is_long(s, job_cost(s, r),
                        atomic_load_explicit(&c->prefill_ns, memory_order_relaxed), positions);
}

typedef struct job_slicer {
    worker_t *w;
    const worker_job_t *job;
    worker_slices_t place; /* worker_yield()'s */
    uint64_t slice_ns;
    uint64_t t0;        /* the current slice's start */
    uint64_t own_ns;    /* the job's own time, its slices' */
    uint64_t positions; /* done in the current slice */
} job_slicer_t;

static void slicer_begin(job_slicer_t *sl, const server_t *s, worker_t *w, const req_t *r)
{
    memset(sl, 0, sizeof(*sl));
    sl->w = w;
    sl->job = &r->job;
    sl->slice_ns = long_slice_ns(s);
    sl->t0 = uv_hrtime();
}

/* `positions` more are done; at the end of a slice, counts the slice's
 * and yields. */
static void slicer_tick(job_slicer_t *sl, uint64_t positions)
{
    uint64_t now = uv_hrtime();

    sl->positions += positions;
    if (now - sl->t0 < sl->slice_ns)
        return;
    sl->own_ns += now - sl->t0;
    worker_progress(sl->w, sl->positions);
    sl->positions = 0;
    job_lent_ns += worker_yield(sl->w, sl->job, &sl->place, sl->own_ns,
                                JOB_YIELD_SLICES * sl->slice_ns, JOB_YIELD_SLICES * sl->slice_ns);
    sl->t0 = uv_hrtime();
}

static void slicer_end(job_slicer_t *sl)
{
    if (sl->positions > 0)
        worker_progress(sl->w, sl->positions);
}

/* model_prefill() of tokens[0 .. n-1] on `kv`, in chunks of a batch
 * call's MODEL_BATCH_MAX positions: what the one call would do, at the
 * same cost.  Smaller chunks would end slices sooner, but a position run
 * alone reads every weight for itself and costs many times more. */
static void prefill_sliced(job_slicer_t *sl, const model_t *m, model_kv_t *kv,
                           const uint32_t *tokens, size_t n, void *scratch)
{
    while (n > 0) {
        size_t k = n < MODEL_BATCH_MAX ? n : MODEL_BATCH_MAX;

        model_prefill(m, kv, tokens, k, scratch);
        tokens += k;
        n -= k;
        slicer_tick(sl, k);
    }
}

/* cache_session_decode() of `n` positions in slices: the same picks under
 * the same controls `dc` (NULL: greedy), ending after a stop token; the
 * picks made in *picked. */
static int step_sliced(server_t *s, worker_t *w, req_t *r, uint32_t n, const model_decode_t *dc,
                       uint32_t *tokens, double *logits, uint32_t *picked, slotd_error_t *err)
{
    const model_t *m = r->cs.model;
    size_t vocab = model_vocab(m);
    bool want_logits = logits != NULL && model_family(m) == MODEL_FAMILY_ATTN;
    void *scratch = worker_scratch(w);
    uint32_t i = 0;
    job_slicer_t sl;
    model_kv_t kv;
    int rc;

    if (cache_pool_reserve(s->pool, r->cs.handle, &r->cs.owner, n, &kv) != SLOTD_OK)
        return cache_session_decode(s->pool, &r->cs, n, dc, scratch, tokens, logits, picked, err);
    slicer_begin(&sl, s, w, r);
    while (i < n) {
        double *row = want_logits ? logits + (size_t)i * vocab : NULL;
        uint32_t t = model_decode_pick(m, &kv, dc, row, scratch);

        tokens[i++] = t;
        model_run(m, &kv, t, scratch);
        slicer_tick(&sl, 1);
        if (dc != NULL && model_decode_stops(dc, t))
            break;
    }
    slicer_end(&sl);
    rc = cache_pool_commit(s->pool, r->cs.handle, &r->cs.owner, &kv);
    if (rc != SLOTD_OK) /* as cache_session_decode(): a released slot, a bug */
        return slotd_error_set(err, rc, "step: %s ('%s')", slotd_strerror(rc), r->rq.id);
    r->cs.entries = kv.len;
    cache_pool_hint(s->pool, r->cs.handle, &r->cs.hint);
    *picked = i;
    return SLOTD_OK;
}

/* cache_session_generate_decode() in slices, into `tokens` (room for n +
 * steps) and `logits` (steps rows): the same picks under the same controls
 * `dc` (NULL: greedy), ending after a stop token, as model_generate_decode()
 * makes them; the picks made in *picked.  steps >= 1. */
static int generate_sliced(server_t *s, worker_t *w, req_t *r, const model_decode_t *dc,
                           uint32_t *tokens, double *logits, size_t *picked, uint64_t *rows,
                           slotd_error_t *err)
{
    /* The owner of a borrowed slot, as cache/session.c's: no client's. */
    static const cache_owner_t borrower = {.key = 0, .id = ""};
    const model_t *m = r->model;
    size_t n = r->rq.ntokens, steps = (size_t)r->rq.steps, vocab = model_vocab(m), k = 0;
    void *scratch = worker_scratch(w);
    uint64_t runs = 0;
    cache_handle_t h;
    job_slicer_t sl;
    model_kv_t kv;
    int rc;

    rc = model_check_generate(m, r->rq.tokens, n, r->rq.steps, err);
    if (rc != SLOTD_OK)
        return rc;
    if (cache_pool_acquire(s->pool, m, &borrower, &h) != SLOTD_OK)
        goto unsliced;
    if (cache_pool_reserve(s->pool, h, &borrower, (uint32_t)(n + steps), &kv) != SLOTD_OK) {
        (void)cache_pool_release(s->pool, h, &borrower, NULL);
        goto unsliced;
    }
    for (size_t i = 0; i < n; i++)
        tokens[i] = (uint32_t)r->rq.tokens[i]; /* validated: in [0, V) */
    slicer_begin(&sl, s, w, r);
    if (r->rq.use_cache) {
        /* Each position runs once; the last pick is never run. */
        prefill_sliced(&sl, m, &kv, tokens, n, scratch);
        runs = n;
        while (k < steps) {
            double *row = logits != NULL ? logits + k * vocab : NULL;
            tokens[n + k] = model_decode_pick(m, &kv, dc, row, scratch);
            k++;
            if (dc != NULL && model_decode_stops(dc, tokens[n + k - 1]))
                break;
            if (k < steps) {
                model_run(m, &kv, tokens[n + k - 1], scratch);
                runs++;
                slicer_tick(&sl, 1);
            }
        }
    } else {
        /* Every pick starts from an empty chain and reruns every position. */
        while (k < steps) {
            double *row = logits != NULL ? logits + k * vocab : NULL;
            model_kv_rewind(&kv);
            prefill_sliced(&sl, m, &kv, tokens, n + k, scratch);
            runs += n + k;
            tokens[n + k] = model_decode_pick(m, &kv, dc, row, scratch);
            k++;
            if (dc != NULL && model_decode_stops(dc, tokens[n + k - 1]))
                break;
        }
    }
    slicer_end(&sl);
    rc = cache_pool_release(s->pool, h, &borrower, NULL);
    assert(rc == SLOTD_OK);
    *rows = (uint64_t)model_layers(m) * runs;
    *picked = k;
    return SLOTD_OK;

unsliced: /* no room: the one call says so, in its words */
    return cache_session_generate_decode(s->pool, m, r->rq.tokens, n, r->rq.steps,
                                         r->rq.use_cache, dc, scratch, tokens, logits, picked,
                                         rows, err);
}

/* Starts a slot of `m` for `owner` holding the sequence `t` (a prefill of
 * its tokens, as a start with them as its prompt runs it) into *out: how
 * an evicted session is rebuilt (evict.c).  Its entries are then those a
 * start with the whole sequence computes, which are those the session's
 * own start, steps and appends computed (docs/design.md, "What one cache
 * entry holds"), bit for bit.  On an error nothing is held and *out is as
 * it was.  *reused gets the entries the prefix cache gave (0 for a
 * session started without it).  The int64 copy of the tokens is this
 * call's, freed before it returns. */
static int rebuild_slot(server_t *s, worker_t *w, const req_t *r, const model_t *m,
                        const cache_owner_t *owner, const audit_tokens_t *t, cache_session_t *out,
                        uint32_t *reused, slotd_error_t *err)
{
    uint64_t t0 = uv_hrtime();
    const cache_session_t *was = r->rq.op == PROTO_OP_FORK ? &r->from_cs : &r->cs;
    cache_session_t cs;
    uint32_t cached = 0;
    int64_t *prompt;
    int rc;

    assert(t->len > 0);
    prompt = malloc((size_t)t->len * sizeof(*prompt));
    if (prompt == NULL)
        return SLOTD_ENOMEM;
    for (uint32_t i = 0; i < t->len; i++)
        prompt[i] = t->v[i];
    /* A session that shared blocks rebuilds as a cached start of its whole
     * sequence in its own scope: the blocks still kept (its own, given up
     * at the eviction, or another's equal ones) are reused, exact because
     * an entry depends only on the tokens at and before it. */
    if (was->shared)
        rc = cache_session_start_shared(s->pool, m, owner, was->scope, prompt, t->len,
                                        worker_scratch(w), &cs, &cached, err);
    else
        rc = cache_session_start(s->pool, m, owner, prompt, t->len, worker_scratch(w), &cs, err);
    free(prompt);
    if (rc == SLOTD_ECACHE_FULL)
        return slotd_error_set(err, SLOTD_ECACHE_FULL,
                               "%s: no room in the pool to rebuild evicted session '%s' (%" PRIu32
                               " entries)",
                               proto_op_name(r->rq.op), owner->id, t->len);
    if (rc != SLOTD_OK)
        return rc;
    /* The session's prefix-cache scope stays its own (a fork's: from's). */
    cs.scope = was->scope;
    *out = cs;
    *reused = cached;
    metrics_count_rebuilt_entry_n(t->len - cached); /* a rebuild, for --on-full evict */
    metrics_count_rebuild_ns_n(uv_hrtime() - t0);
    return SLOTD_OK;
}

/* A step or append of an evicted session: its slot back first (the
 * loop sees `rebuild` cleared and counts the session as holding one). */
static int rebuild_session(server_t *s, worker_t *w, req_t *r, slotd_error_t *err)
{
    cache_owner_t owner = r->cs.owner;
    int rc;

    assert(r->toks.len == r->cs.entries);
    rc = rebuild_slot(s, w, r, r->cs.model, &owner, &r->toks, &r->cs, &(uint32_t){0}, err);
    if (rc == SLOTD_OK)
        r->rebuild = false;
    return rc;
}

static int run_start(server_t *s, worker_t *w, req_t *r, slotd_error_t *err)
{
    cache_owner_t owner;
    uint32_t cached = 0;
    int rc;

    owner.key = r->owner_key;
    memcpy(owner.id, r->rq.id, sizeof(owner.id));
    /* The recorded prompt first: nothing to undo if there is no room. */
    if (s->keep_toks) {
        if (audit_tokens_reserve(&r->toks, (uint32_t)r->rq.ntokens) != SLOTD_OK)
            return SLOTD_ENOMEM;
        for (size_t i = 0; i < r->rq.ntokens; i++)
            r->toks.v[i] = (uint32_t)r->rq.tokens[i]; /* validated on the loop: in [0, V) */
        r->toks.len = (uint32_t)r->rq.ntokens;
    }
    rc = cache_session_start_shared(s->pool, r->model, &owner, r->scope_key, r->rq.tokens,
                                    r->rq.ntokens, worker_scratch(w), &r->cs, &cached, err);
    if (rc == SLOTD_OK) {
        rc = proto_reply_start(&r->reply, r->rq.tag, r->rq.id, model_name(r->model), r->cs.entries,
                               cached);
        if (rc != SLOTD_OK) /* no reply, no session: give the slot back */
            (void)cache_session_finish(s->pool, &r->cs, &(uint32_t){0});
    }
    if (rc != SLOTD_OK) /* no session: nobody else will free them */
        audit_tokens_free(&r->toks);
    return rc;
}

/* The blocks that a step or an append of `r` just filled go to the prefix
 * cache, named by the session's recorded tokens (kept whenever the cache
 * is on). */
static inline void publish_blocks(server_t *s, req_t *r)
{
    if (r->cs.entries >= r->cs.full_at && s->keep_toks && r->toks.len == r->cs.entries)
        cache_session_publish(s->pool, &r->cs, r->toks.v, r->toks.len);
}

static int run_step(server_t *s, worker_t *w, req_t *r, slotd_error_t *err)
{
    const model_t *m = r->cs.model;
    uint32_t n = r->rq.n, vocab = model_vocab(m), max_ctx = model_max_ctx(m);
    bool attn = model_family(m) == MODEL_FAMILY_ATTN;
    uint32_t *tokens, picked = 0;
    double *logits = NULL;
    controls_t ctl;
    int rc;

    if ((rc = controls_prepare(&ctl, &r->rq, m, err)) != SLOTD_OK)
        return rc;
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
    /* The recording's room first, so that a step that ran can always be recorded. */
    if (s->keep_toks && audit_tokens_reserve(&r->toks, n) != SLOTD_OK)
        return SLOTD_ENOMEM;
    if (n > 1 && step_is_long(s, m, n))
        rc = step_sliced(s, w, r, n, controls_dc(&ctl), tokens, logits, &picked, err);
    else
        rc = cache_session_decode(s->pool, &r->cs, n, controls_dc(&ctl), worker_scratch(w), tokens,
                                  logits, &picked, err);
    if (rc != SLOTD_OK)
        return rc;
    if (s->audit != NULL)
        jobaudit__step(s, w, r, picked, tokens, logits, &ctl);
    else if (s->keep_toks)
        audit_tokens_append(&r->toks, tokens, picked);
    publish_blocks(s, r);
    JOB_FAULT_AFTER_STEP(s, r);
    return controls_reply_step(&ctl, &r->reply, &r->rq, m, tokens, picked,
                               controls_logits(&ctl, logits), r->cs.entries, worker_scratch(w));
}

/* An append: the tokens run into the session's slot as a prefill does,
 * and recorded after its tokens for the audit (whose room comes first, so
 * that an append that ran can always be recorded).  Its entries are
 * checked with the next sampled step, which compares the whole sequence
 * with the uncached reference. */
static int run_append(server_t *s, worker_t *w, req_t *r, slotd_error_t *err)
{
    uint32_t cached = 0, len = r->toks.len;
    const uint32_t *seq = NULL;
    int rc;

    if (s->keep_toks && r->rq.ntokens <= model_max_ctx(r->cs.model)) {
        if (audit_tokens_reserve(&r->toks, (uint32_t)r->rq.ntokens) != SLOTD_OK)
            return SLOTD_ENOMEM;
        /* Written past the recording's end, which moves only on success:
         * the whole sequence the prefix cache is looked up with (the
         * append checks the tokens before it reads them). */
        for (size_t i = 0; i < r->rq.ntokens; i++)
            r->toks.v[len + i] = (uint32_t)r->rq.tokens[i];
        if (len == r->cs.entries)
            seq = r->toks.v;
    }
    rc = cache_session_append_shared(s->pool, &r->cs, r->rq.tokens, r->rq.ntokens, seq,
                                     worker_scratch(w), &cached, err);
    if (rc != SLOTD_OK)
        return rc;
    if (s->keep_toks) {
        assert(len + r->rq.ntokens == r->cs.entries); /* the recording follows the slot */
        r->toks.len = r->cs.entries; /* the tokens are in place, checked: in [0, V) */
    }
    publish_blocks(s, r);
    return proto_reply_append(&r->reply, r->rq.tag, r->rq.id, r->cs.entries, cached);
}

/* A fork: a new slot holding a copy of the forked session's entries and
 * state (cache_session_fork(), no model call), and a copy of its recorded
 * tokens for the audit, which comes first so that nothing is undone if
 * there is no memory. */
static int run_fork(server_t *s, worker_t *w, req_t *r, slotd_error_t *err)
{
    cache_owner_t owner;
    uint32_t reused = 0;
    int rc;

    (void)w;
    owner.key = r->owner_key;
    memcpy(owner.id, r->rq.id, sizeof(owner.id));
    if (s->keep_toks) {
        if (audit_tokens_reserve(&r->toks, r->from_toks.len) != SLOTD_OK)
            return SLOTD_ENOMEM;
        audit_tokens_append(&r->toks, r->from_toks.v, r->from_toks.len);
    }
    if (r->from_evicted) /* no slot to copy: its tokens run into a new one */
        rc = rebuild_slot(s, w, r, r->from_cs.model, &owner, &r->from_toks, &r->cs, &reused,
                          err);
    else
        rc = cache_session_fork(s->pool, &r->from_cs, &owner, &r->cs, err);
    if (rc == SLOTD_OK) {
        /* Every entry was reused (copied), none computed; or, rebuilt,
         * those the prefix cache still kept. */
        rc = proto_reply_fork(&r->reply, r->rq.tag, r->rq.id, model_name(r->model), r->cs.entries,
                              r->from_evicted ? reused : r->cs.entries);
        if (rc != SLOTD_OK) /* no reply, no session: give the slot back */
            (void)cache_session_finish(s->pool, &r->cs, &(uint32_t){0});
    }
    if (rc != SLOTD_OK) /* no session: nobody else will free them */
        audit_tokens_free(&r->toks);
    return rc;
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
    size_t picked = steps;
    controls_t ctl;
    int rc;

    if ((rc = controls_prepare(&ctl, &r->rq, r->model, err)) != SLOTD_OK)
        return rc;
    if (tokens == NULL || logits == NULL)
        return SLOTD_ENOMEM;
    if (steps > 0 && generate_is_long(s, r))
        rc = generate_sliced(s, w, r, controls_dc(&ctl), tokens, logits, &picked, &rows, err);
    else
        rc = cache_session_generate_decode(s->pool, r->model, r->rq.tokens, r->rq.ntokens,
                                           r->rq.steps, r->rq.use_cache, controls_dc(&ctl),
                                           worker_scratch(w), tokens, logits, &picked, &rows, err);
    if (rc != SLOTD_OK)
        return rc;
    return controls_reply_generate(&ctl, &r->reply, &r->rq, r->model, tokens,
                                   r->rq.ntokens + picked, controls_logits(&ctl, logits), picked,
                                   rows, worker_scratch(w));
}

/* Worker `shard` begins `r` at `t` (its job's start): its wait, from its
 * line's read, is observed. */
static void job_begun(unsigned shard, uint64_t t, req_t *r)
{
    r->begun_ns = t; /* a tenant's wait, summed when the job is back (dispatch.c) */
    const model_t *m = req__on_slot(r) ? r->cs.model : r->model;
    metrics_observe_request_wait(
        shard, t > r->read_ns ? t - r->read_ns : 0,
        metrics_op_model(r->rq.op, m != NULL ? model_preset_index(m) : MODEL_NPRESETS));
}

/* Whether step job `cand` may join the batch `first` leads (worker.h's
 * group callback): both single steps (n = 1) of sessions of one model whose
 * batch calls share the weights (model_batch_shares()), not canceled; a
 * chain's head may (job_run_batch() runs a batch of chains in rounds).
 * Reads only what the loop set before submitting: op, n and the session's
 * model in `cs`, and the atomic `canceled`. */
bool job_group(const worker_job_t *first, const worker_job_t *cand, void *arg)
{
    const req_t *f = container_of(first, req_t, job), *c;

    (void)arg;
    if (f->rq.op != PROTO_OP_STEP || f->rq.n != 1 || f->rebuild || !model_batch_shares(f->cs.model))
        return false;
    if (cand == NULL)
        return true;
    c = container_of(cand, req_t, job);
    return c->rq.op == PROTO_OP_STEP && c->rq.n == 1 && !c->rebuild && c->cs.model == f->cs.model &&
           !atomic_load_explicit(&c->canceled, memory_order_relaxed);
}

/* The wire reply of a step job that ended with rc (job_run()'s rule). */
static void job_finish(req_t *r, int rc, slotd_error_t *err)
{
    if (rc < 0 && rc != SLOTD_ENOMEM && rc != SLOTD_ESTALE && rc != SLOTD_EINVAL) {
        r->reply.len = 0;
        if (proto_reply_error(&r->reply, r->rq.tag, err) != SLOTD_OK)
            rc = SLOTD_ENOMEM;
    }
    r->rc = rc;
}

/* One round of a batch: n step jobs that job_group() admitted together,
 * each checked, recorded and answered as run_step() would, but their model
 * calls are one batch (cache_session_step_batch()).  Steps are n = 1, so
 * each job's tokens and logits are one pick and one row. */
static void batch_round(server_t *s, worker_t *w, worker_job_t **jobs, size_t n)
{
    const model_t *m = container_of(jobs[0], req_t, job)->cs.model;
    const uint32_t vocab = model_vocab(m);
    cache_session_t *cs[MODEL_BATCH_MAX];
    req_t *rs[MODEL_BATCH_MAX];
    double *lg[MODEL_BATCH_MAX];
    uint32_t picks[MODEL_BATCH_MAX];
    int rc[MODEL_BATCH_MAX];
    bool ran[MODEL_BATCH_MAX], any_ctl = false;
    slotd_error_t err[MODEL_BATCH_MAX];
    controls_t ctl[MODEL_BATCH_MAX];
    const model_decode_t *dc[MODEL_BATCH_MAX];
    double *logits = worker_logits(w, n * vocab);
    size_t k = 0;
    uint64_t now, cpu0 = jobcost__cpu_ns();

    assert(n <= MODEL_BATCH_MAX);
    for (size_t i = 0; i < n; i++) {
        req_t *r = container_of(jobs[i], req_t, job);

        ran[i] = !atomic_load_explicit(&r->canceled, memory_order_relaxed);
        if (!ran[i]) {
            r->rc = SLOTD_ESHUTTING_DOWN; /* the connection is gone: nobody reads it */
            continue;
        }
        atomic_store_explicit(&r->started, true, memory_order_relaxed);
        job_begun(worker_index(w), worker_job_start(w), r);
        JOB_FAULT_POINT(s, r);
        if (logits == NULL || (s->keep_toks && audit_tokens_reserve(&r->toks, 1) != SLOTD_OK)) {
            r->rc = SLOTD_ENOMEM;
            continue;
        }
        slotd_error_clear(&err[k]);
        if (controls_prepare(&ctl[k], &r->rq, m, &err[k]) != SLOTD_OK) {
            job_finish(r, err[k].code, &err[k]);
            continue;
        }
        dc[k] = controls_dc(&ctl[k]);
        any_ctl = any_ctl || dc[k] != NULL;
        cs[k] = &r->cs;
        lg[k] = logits + k * vocab;
        rs[k++] = r;
    }
    if (k > 0) {
        cache_session_decode_batch(s->pool, cs, k, any_ctl ? dc : NULL, worker_scratch(w), picks,
                                   lg, rc, err);
        metrics_observe_batch_size(worker_index(w), k);
    }
    if (k > 1)
        metrics_count_batch(k);
    for (size_t i = 0; i < k; i++) {
        req_t *r = rs[i];

        if (rc[i] == SLOTD_OK) {
            if (s->audit != NULL)
                jobaudit__step(s, w, r, 1, &picks[i], lg[i], &ctl[i]);
            else if (s->keep_toks)
                audit_tokens_append(&r->toks, &picks[i], 1);
            publish_blocks(s, r);
            JOB_FAULT_AFTER_STEP(s, r);
            rc[i] = controls_reply_step(&ctl[i], &r->reply, &r->rq, m, &picks[i], 1,
                                        controls_logits(&ctl[i], lg[i]), r->cs.entries,
                                        worker_scratch(w));
        }
        job_finish(r, rc[i], &err[i]);
    }
    now = uv_hrtime();
    for (size_t i = 0; i < n; i++)
        if (ran[i])
            metrics_observe_step(worker_index(w), now - worker_job_start(w), now,
                                 model_preset_index(m));
    /* Each step's share of the batch's time. */
    if (k > 0)
        jobcost__note_step(s, m, (jobcost__cpu_ns() - cpu0) / k);
}

/* Hands `r`, a step of a chain that succeeded, back to the loop and puts
 * its successor, from the state it left, in its place.  Returns that. */
static req_t *pass_on(worker_t *w, req_t *r)
{
    req_t *next = r->chain_next;

    next->cs = r->cs;
    next->toks = r->toks; /* the job's until it comes back */
    worker_job_handoff(w, &r->job, &next->job);
    return next;
}

/* A batch runs in rounds while every job in it is a chain (launch.c:
 * steps of one session queued behind each other) with a single step next:
 * each round answers each job's step and hands it back
 * (worker_job_handoff()), and the next round runs their successors, with
 * no trip to the loop between.  Rounds end with the batch bound
 * (--batch-us, as a batch's cost is bounded), with a drain, or when some
 * job has no step next; the chains that go on then go back to their flows
 * (worker_job_requeue(), charged one step), together. */
void job_run_batch(worker_t *w, worker_job_t **jobs, size_t n, void *arg)
{
    server_t *s = arg;
    uint64_t begin = worker_job_start(w), bound = (uint64_t)s->cfg->batch_us * 1000u;
    bool on;

    for (;;) {
        batch_round(s, w, jobs, n);
        on = !atomic_load_explicit(&s->stop_jobs, memory_order_relaxed);
        for (size_t i = 0; i < n && on; i++) {
            const req_t *r = container_of(jobs[i], req_t, job);
            on = r->rc == SLOTD_OK && r->chain_next != NULL && r->chain_next->rq.n == 1;
        }
        if (!on || (bound > 0 && uv_hrtime() - begin >= bound))
            break;
        for (size_t i = 0; i < n; i++)
            (void)pass_on(w, container_of(jobs[i], req_t, job));
    }
    for (size_t i = 0; i < n; i++) {
        req_t *r = container_of(jobs[i], req_t, job);
        if (r->rc != SLOTD_OK || r->chain_next == NULL)
            continue;
        if (atomic_load_explicit(&s->stop_jobs, memory_order_relaxed)) {
            r->chain_cut = true; /* the rest waits in the session's queue */
            continue;
        }
        r = pass_on(w, r);
        worker_job_set_cost(&r->job, jobcost__step(jobcost__of(s, r->cs.model), 1));
        worker_job_requeue(w, &r->job);
    }
}

/* The run function of each op that runs on a worker (proto_ops[op].on_worker
 * in proto/ops.c): adding such an op adds its row here. */
typedef int (*job_run_fn)(server_t *s, worker_t *w, req_t *r, slotd_error_t *err);
static const job_run_fn job_runs[PROTO_OP__COUNT] = {
    [PROTO_OP_START] = run_start,
    [PROTO_OP_STEP] = run_step,
    [PROTO_OP_LOGITS] = run_logits,
    [PROTO_OP_GENERATE] = run_generate,
    [PROTO_OP_APPEND] = run_append,
    [PROTO_OP_FORK] = run_fork,
};

/* job_run() of one request. */
static void run_one(server_t *s, worker_t *w, req_t *r)
{
    const model_t *m = req__on_slot(r) ? r->cs.model : r->model;
    bool cpu_timed = m != NULL && model_batch_shares(m);
    uint64_t cpu0 = 0, t0 = worker_job_start(w); /* this step's start, in a chain */
    uint64_t lent = job_lent_ns;                 /* others' time in this job, from here */
    unsigned shard = worker_index(w);
    slotd_error_t err;
    bool rebuilt;
    int rc;

    slotd_error_clear(&err);

    if (atomic_load_explicit(&r->canceled, memory_order_relaxed)) {
        r->rc = SLOTD_ESHUTTING_DOWN; /* the connection is gone: nobody reads it */
        return;
    }
    if (atomic_load_explicit(&s->stop_jobs, memory_order_relaxed)) {
        /* A drain began before this job did: not run, as if taken back. */
        slotd_error_set(&err, SLOTD_ESHUTTING_DOWN, SERVER_SHUTTING_DOWN_MSG);
        r->reply.len = 0;
        r->rc = proto_reply_error(&r->reply, r->rq.tag, &err) == SLOTD_OK ? SLOTD_ESHUTTING_DOWN
                                                                          : SLOTD_ENOMEM;
        return;
    }
    atomic_store_explicit(&r->started, true, memory_order_relaxed);
    job_begun(shard, t0, r);
    JOB_FAULT_POINT(s, r);
    if (cpu_timed)
        cpu0 = jobcost__cpu_ns();

    assert(proto_op_on_worker(r->rq.op) && job_runs[r->rq.op] != NULL);
    rebuilt = r->rebuild;
    if (rebuilt && (rc = rebuild_session(s, w, r, &err)) != SLOTD_OK)
        ; /* answered as the request's own error: the session stays evicted */
    else if ((unsigned)r->rq.op < PROTO_OP__COUNT && job_runs[r->rq.op] != NULL)
        rc = job_runs[r->rq.op](s, w, r, &err);
    else
        rc = SLOTD_EINVAL; /* only ops with proto_ops[op].on_worker are submitted */

    /* A wire error gets its reply here; an internal one (no memory, a
     * stale handle) reaches no client: the loop thread closes the
     * connection instead. */
    if (rc < 0 && rc != SLOTD_ENOMEM && rc != SLOTD_ESTALE && rc != SLOTD_EINVAL) {
        r->reply.len = 0;
        if (proto_reply_error(&r->reply, r->rq.tag, &err) != SLOTD_OK)
            rc = SLOTD_ENOMEM;
    }
    r->rc = rc;
    {
        uint64_t now = uv_hrtime();
        /* The jobs a long one ran inside it (worker_yield()) are observed
         * and measured as their own, not again as part of it. */
        lent = job_lent_ns - lent;
        if (r->rq.op == PROTO_OP_STEP)
            metrics_observe_step_alone(shard, now - t0 > lent ? now - t0 - lent : 0, now,
                                       m != NULL ? model_preset_index(m) : MODEL_NPRESETS);
        uint64_t ns = cpu_timed ? jobcost__cpu_ns() - cpu0 : now - t0;

        if (!rebuilt) /* a rebuild's prefill is not the op's cost */
            jobcost__measured(s, r, ns > lent ? ns - lent : 0);
    }
}

/* A chain (launch.c: steps of one session queued behind each other) runs
 * step after step in this one job: each step's record goes back to the
 * loop as soon as it is answered (worker_job_handoff()), the next starting
 * from the state it left.  It stops at the first step that does not
 * succeed (or is canceled), the rest going back with it unrun; and at the
 * end of its slice (jobcost__chain_slice()) the rest goes back to its
 * connection's flow (worker_job_requeue()), so that other connections get
 * their turn. */
void job_run(worker_t *w, worker_job_t *job, void *arg)
{
    server_t *s = arg;
    req_t *r = container_of(job, req_t, job);
    uint64_t slice = jobcost__chain_slice(s), begin = worker_job_start(w);

    for (;;) {
        req_t *next = r->chain_next;
        run_one(s, w, r);
        if (next == NULL || r->rc != SLOTD_OK)
            return;
        if (jobcost__chain_too_dear(s, r)) {
            /* Measured dearer than a chain is for (a chain begun before
             * its model's steps were timed): the rest waits as one at a
             * time. */
            r->chain_cut = true;
            return;
        }
        r = pass_on(w, r);
        if (slice > 0 && worker_job_start(w) - begin >= slice) {
            worker_job_set_cost(&r->job, jobcost__chain(s, r, r->cs.model, slice));
            worker_job_requeue(w, &r->job);
            return;
        }
    }
}
