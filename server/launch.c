/*
 * launch.c: a job on its way to the workers.  It owns the output bound on
 * jobs: the most bytes a job's reply can take (req_reply_bound()), which
 * jobs of a connection to park because its unwritten output with the
 * replies of its jobs out would pass CONN_MAX_PENDING_BYTES (the parked
 * list itself is conn.c's: conn__park()), and the submit into this loop turn's batch, which server.c hands
 * to the workers at the end of the turn.
 *
 * It also links the steps queued behind a step submitted into a chain
 * that one job runs (launch__chain_return() undoes what did not run), and
 * sets each job's flow and cost for the workers' fair queue.
 *
 * DESIGN.  Loop thread only; no lock.  A submitted record is the workers'
 * (REQ_RUNNING) until it comes back to dispatch.c; its connection counts
 * it in `refs` and its reply bound in its reserved bytes meanwhile
 * (conn__reserve()).  conn.c calls back through conn_hooks_t.run_parked.
 *
 * Design: docs/design.md, "Pipelining", "Scheduler" and "server/ layout".
 */
#include "launch_int.h"

#include <assert.h>
#include <string.h>

#include "conn_int.h"
#include "jobcost_int.h"
#include "req_int.h"
#include "tenancy_int.h"

/* Reply sizes, for the output bound.  A token prints in at most 10
 * digits and a comma; a logit in at most 18 characters and a comma while
 * its magnitude is below 1e9, far above any the models produce (larger
 * ones are printed in full and may pass the bound).  REPLY_FIXED covers
 * the members around them: id, model, entries, rows, or an error message. */
#define REPLY_TOKEN_BYTES 11u
#define REPLY_LOGIT_BYTES 19u
#define REPLY_FIXED (sizeof(((slotd_error_t *)0)->message) * 6 + 256)

/* The most bytes the reply of `r`'s job can take, from its op, model and
 * counts alone, before it runs.  A step past max_ctx, which gets a short
 * context_full, counts as that. */
static size_t req_reply_bound(const req_t *r)
{
    const model_t *m = req__on_slot(r) ? r->session->cs.model : r->model;
    size_t tag = r->rq.tag != NULL ? strlen(r->rq.tag) : 0;
    size_t row =
        model_family(m) == MODEL_FAMILY_ATTN ? (size_t)model_vocab(m) * REPLY_LOGIT_BYTES + 3 : 0;
    size_t picks = 0, tokens = 0;

    switch (r->rq.op) {
    case PROTO_OP_STEP: {
        uint32_t have = r->session->cs.entries, max = model_max_ctx(m);
        picks = have <= max && r->rq.n <= max - have ? r->rq.n : 0;
        tokens = picks;
        break;
    }
    case PROTO_OP_LOGITS:
        picks = 1;
        break;
    case PROTO_OP_GENERATE: /* validated: tokens plus steps within max_ctx */
        picks = (size_t)r->rq.steps;
        tokens = r->rq.ntokens + picks;
        break;
    case PROTO_OP_START:
    case PROTO_OP_FORK:
    case PROTO_OP_APPEND: /* id, model, entries, cached: in REPLY_FIXED */
    case PROTO_OP_NONE:
    case PROTO_OP_FINISH:
    case PROTO_OP_STATS:
    case PROTO_OP_AUTH:
    case PROTO_OP__COUNT: /* no job */
        break;
    }
    return REPLY_FIXED + tag + tokens * REPLY_TOKEN_BYTES + picks * row;
}

_Static_assert(WORKER_HINTS == CACHE_HINTS, "a session's hint fills a job's");
_Static_assert(sizeof(((cache_owner_t *)0)->id) == sizeof(((proto_request_t *)0)->id),
               "a session's owner holds any id");

/* Adds the job of `r` to this loop turn's batch (server.c submits it at
 * the end of the turn). */
static void batch_push(server_t *s, req_t *r)
{
    if (r->rq.op == PROTO_OP_STEP)
        metrics_step_out();
    metrics_job_out();
    worker_batch_push(&s->batch, &r->job);
}

static bool conn_may_run(conn_t *c, size_t bound);

/* ---- Coalesced runs (docs/design.md, "Scheduler") ----
 *
 * A cheap step (job_chain_step_max()), or a single step of a model that
 * batches, submitted while more steps of its session wait right behind it
 * in the session's FIFO takes them along: they are linked to it
 * (chain_next) and leave the FIFO as jobs out (REQ_RUNNING, reserved,
 * counted in refs and in the steps out), as far as the output bound lets
 * each run.  The worker runs them back to back and hands each back as it
 * is answered (job.c: job_run()).  So dispatch__job_done() sees a chain's
 * steps come back one by one: a step that succeeded with a successor
 * leaves the successor as the session's running request; one that did
 * not, or was canceled or taken back, brings its unrun successors back to
 * the front of the FIFO (launch__chain_return()), where they wait as
 * before. */
#define LAUNCH_CHAIN_MAX 256

static void req_chain(req_t *r)
{
    conn_t *c = r->conn;
    session_t *sess = r->session;
    req_t *tail = r, *q;

    for (size_t n = 1; n < LAUNCH_CHAIN_MAX && !c->server->draining && c->park_head == NULL &&
                       (q = sess->fifo_head) != NULL && q->rq.op == PROTO_OP_STEP;
         n++) {
        q->reply_bound = req_reply_bound(q);
        if (!conn_may_run(c, q->reply_bound))
            break;
        sess->fifo_head = q->session_next;
        if (sess->fifo_head == NULL)
            sess->fifo_tail = NULL;
        q->session_next = NULL;
        q->chain_next = NULL;
        q->job.flow = tenancy__flow(c);
        q->job.lone = r->job.lone; /* a step of the same session */
        q->state = REQ_RUNNING;
        conn__reserve(c, q->reply_bound);
        c->refs++;
        metrics_step_out();
        metrics_job_out();
        tail->chain_next = q;
        tail = q;
    }
}

void launch__chain_return(req_t *r)
{
    conn_t *c = r->conn;
    session_t *sess = r->session;
    req_t *q = r->chain_next, *next, **link = &sess->fifo_head, *last = NULL;

    r->chain_next = NULL;
    for (; q != NULL; q = next) {
        next = q->chain_next;
        q->chain_next = NULL;
        metrics_step_back();
        metrics_job_back(false);
        assert(c->refs > 1); /* r's own ref stays */
        c->refs--;
        if (c->closed) {
            req__put(c->server, q);
            continue;
        }
        conn__unreserve(c, q->reply_bound);
        q->state = REQ_WAITING;
        q->session_next = *link;
        *link = q;
        link = &q->session_next;
        last = q;
    }
    if (last != NULL && last->session_next == NULL)
        sess->fifo_tail = last;
}

/* Sends `r`'s job to the workers at the end of this loop turn. */
static inline void req_submit(req_t *r)
{
    conn_t *c = r->conn;
    bool step = r->session != NULL && r->rq.op == PROTO_OP_STEP;
    const job_costs_t *jc = NULL;
    uint64_t cost;
    uint16_t code;

    if (step && r->session->evicted) {
        /* Rebuilt first (job.c): run alone, never batched or chained. */
        r->cs = r->session->cs;
        r->toks = r->session->toks; /* the job's until it comes back */
        r->rebuild = true;
        memset(r->job.hint_lines, 0, sizeof(r->job.hint_lines));
        r->job.lone = true;
        cost = job_cost(c->server, r);
        step = false;
    } else if (step) {
        r->cs = r->session->cs;
        r->toks = r->session->toks; /* the job's until it comes back */
        /* Where the step will read first, as the last start or step of
         * the session left it: the worker prefetches it (worker.h). */
        memcpy(r->job.hint, r->cs.hint.addr, sizeof(r->job.hint));
        memcpy(r->job.hint_lines, r->cs.hint.lines, sizeof(r->job.hint_lines));
        jc = jobcost__of(c->server, r->cs.model);
        /* job_group() turns down every job but steps of a model whose
         * batches share weights: the worker need not ask it about others. */
        r->job.lone = jc->lone;
        cost = jobcost__step(jc, r->rq.n);
    } else if (r->session != NULL && req__on_slot(r)) {
        /* An append: the session's slot as well, costed as a prompt, run
         * alone and never the head of a chain. */
        r->cs = r->session->cs;
        r->toks = r->session->toks; /* the job's until it comes back */
        r->rebuild = r->session->evicted; /* rebuilt first (job.c) */
        memset(r->job.hint_lines, 0, sizeof(r->job.hint_lines));
        r->job.lone = true;
        cost = job_cost(c->server, r);
    } else {
        memset(r->job.hint_lines, 0, sizeof(r->job.hint_lines));
        r->job.lone = true;
        cost = job_cost(c->server, r);
        if (r->fork_from != NULL)
            r->fork_from->forks_out++; /* read by the job: kept until it is back */
    }
    r->job.flow = tenancy__flow(c);
    r->state = REQ_RUNNING;
    conn__reserve(c, r->reply_bound);
    c->refs++;
    r->chain_next = NULL;
    /* Cheap steps chain; so do single steps of a model that batches,
     * whose chains run as batches (job.c: job_run_batch()), charged a
     * step at a time. */
    if (step && r->session->fifo_head != NULL &&
        (cost <= job_chain_step_max(c->server) || (!jc->lone && r->rq.n == 1)))
        req_chain(r);
    if (r->chain_next != NULL && jc->lone)
        worker_job_set_cost(&r->job, job_chain_cost(c->server, r));
    else if (jc != NULL && r->rq.n == 1 && (code = jobcost__step1_code(jc)) != 0)
        worker_job_set_cost_code(&r->job, code); /* = worker_job_set_cost(cost), encoded */
    else
        worker_job_set_cost(&r->job, cost);
    batch_push(c->server, r);
}

/* Whether a job with a reply of up to `bound` bytes may run now. */
static bool conn_may_run(conn_t *c, size_t bound)
{
    size_t unwritten = conn__unwritten(c);

    if (unwritten == 0 && c->reserved == 0)
        return true;
    return unwritten + c->held_bytes + c->reserved + bound <= CONN_MAX_PENDING_BYTES;
}

/* Submits `r`'s job, or parks it (in read order) while the connection's
 * output is over its bound. */
void launch__req(req_t *r)
{
    conn_t *c = r->conn;

    r->reply_bound = req_reply_bound(r);
    if (c->park_head == NULL && conn_may_run(c, r->reply_bound)) {
        req_submit(r);
        return;
    }
    r->state = REQ_PARKED;
    conn__park(c, r);
}

/* launch__run_parked() when something is parked: apart, so that the
 * common call, with nothing parked, does not pay for req_submit()'s
 * registers. */
__attribute__((noinline)) static void run_parked(conn_t *c)
{
    req_t *r;

    while ((r = c->park_head) != NULL && conn_may_run(c, r->reply_bound))
        req_submit(conn__park_pop(c));
}

/* conn_hooks_t.run_parked: submits the parked jobs, oldest first, while
 * the bound allows. */
void launch__run_parked(conn_t *c)
{
    if (c->park_head != NULL)
        run_parked(c);
}
