/*
 * launch.c: a job on its way to the workers.  It owns the output bound on
 * jobs: the most bytes a job's reply can take (req_reply_bound()), the
 * parked jobs of a connection whose unwritten output with the replies of
 * its jobs out would pass CONN_MAX_PENDING_BYTES (conn->park_head, in read
 * order), and the submit into this loop turn's batch, which server.c hands
 * to the workers at the end of the turn.
 *
 * DESIGN.  Loop thread only; no lock.  A submitted record is the workers'
 * (REQ_RUNNING) until it comes back to dispatch.c; its connection counts
 * it in `refs` and its reply bound in `reserved` meanwhile.
 *
 * Design: docs/design.md, "Pipelining" and "server/ layout".
 */
#include "launch_int.h"

#include <string.h>

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
    const model_t *m = r->rq.op == PROTO_OP_STEP ? r->session->cs.model : r->model;
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
    default: /* start */
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
    worker_batch_push(&s->batch, &r->job);
}

/* Sends `r`'s job to the workers at the end of this loop turn. */
static void req_submit(req_t *r)
{
    conn_t *c = r->conn;

    if (r->session != NULL && r->rq.op == PROTO_OP_STEP) {
        r->cs = r->session->cs;
        r->toks = r->session->toks; /* the job's until it comes back */
        /* Where the step will read first, as the last start or step of
         * the session left it: the worker prefetches it (worker.h). */
        memcpy(r->job.hint, r->cs.hint.addr, sizeof(r->job.hint));
        memcpy(r->job.hint_lines, r->cs.hint.lines, sizeof(r->job.hint_lines));
    } else {
        memset(r->job.hint_lines, 0, sizeof(r->job.hint_lines));
    }
    r->state = REQ_RUNNING;
    c->reserved += r->reply_bound;
    c->refs++;
    batch_push(c->server, r);
}

/* Whether a job with a reply of up to `bound` bytes may run now. */
static bool conn_may_run(conn_t *c, size_t bound)
{
    size_t unwritten = launch__unwritten(c);

    if (unwritten == 0 && c->reserved == 0)
        return true;
    return unwritten + c->held_bytes + c->reserved + bound <= CONN_MAX_PENDING_BYTES;
}

/* Submits `r`'s job, or parks it (in read order) while the connection's
 * output is over its bound. */
void launch__req(req_t *r)
{
    conn_t *c = r->conn;
    req_t **p;

    r->reply_bound = req_reply_bound(r);
    if (c->park_head == NULL && conn_may_run(c, r->reply_bound)) {
        req_submit(r);
        return;
    }
    r->state = REQ_PARKED;
    if (c->park_tail == NULL || c->park_tail->seq < r->seq) {
        r->park_next = NULL;
        if (c->park_tail != NULL)
            c->park_tail->park_next = r;
        else
            c->park_head = r;
        c->park_tail = r;
        return;
    }
    /* A session's request whose turn came after later lines were parked. */
    for (p = &c->park_head; (*p)->seq < r->seq; p = &(*p)->park_next)
        ;
    r->park_next = *p;
    *p = r;
}

/* Submits the parked jobs, oldest first, while the bound allows. */
void launch__run_parked(conn_t *c)
{
    req_t *r;

    while ((r = c->park_head) != NULL && conn_may_run(c, r->reply_bound)) {
        c->park_head = r->park_next;
        if (c->park_head == NULL)
            c->park_tail = NULL;
        r->park_next = NULL;
        req_submit(r);
    }
}
