/*
 * dispatch.c: request dispatch, a line in and a job or an answer out.  It
 * parses each line read into a request record in read order (the order
 * FIFO), checks it (auth, through authreq.c; the model, the map, a step's
 * context, the session limit, the connection's share, the pool's room)
 * and applies it: to a session's FIFO (session.c), to the workers
 * (launch.c), or answered at once; a stats waits for the head of the
 * FIFO, with the lines after it held behind it (the barrier), and a
 * request for a model not built yet waits for its build likewise
 * (REQ_BUILD; models.c builds it, dispatch__model_built() resumes it).
 * It keeps the pipelining rule (below: "Pipelined order under pressure",
 * REQ_DEFER), takes back jobs from the workers (dispatch__job_done()),
 * moves ready replies to the connection's output in read order
 * (conn_advance()), and answers a drain shutting_down.
 *
 * DESIGN.  Loop thread only; no lock.  A record whose job is out
 * (REQ_RUNNING) belongs to the workers until dispatch__job_done(); conn.c
 * and models.c reach this file only through conn_hooks_t.
 *
 * Design: docs/design.md, "Pipelining" and "server/ layout".
 */
#include "dispatch_int.h"

#include <assert.h>
#include <inttypes.h>
#include <string.h>

#include "authreq_int.h"
#include "conn_int.h"
#include "evict_int.h"
#include "handshake_int.h"
#include "inspect_int.h"
#include "launch_int.h"
#include "server/base/log.h"
#include "models_int.h"
#include "req_int.h"
#include "session_int.h"
#include "tenancy_int.h"

static bool req_apply(conn_t *c, req_t *r);
static void release_barrier(conn_t *c, req_t *r);
static bool fork_apply(conn_t *c, req_t *r);

/* ---- Pipelined order under pressure (docs/design.md, "Pipelining") ----
 *
 * Lines take effect as if run one at a time in the order read.  Work for
 * different sessions runs concurrently; only room in the pool can make
 * the outcome depend on timing.  So a request that takes room is held
 * back (REQ_DEFER, with the lines after it held as behind a stats)
 * when it could take room an earlier request of its connection may still
 * need; and a request refused for room while earlier requests of its
 * connection have not all taken effect (a finish not yet run, a start
 * that may fail) is not answered: it runs again once they have.  Neither
 * costs anything while the pool has room for every request in flight. */

/* Whether a line read before `r` on its connection has not taken effect. */
static bool earlier_pending(const conn_t *c, const req_t *r)
{
    for (const req_t *h = c->order_head; h != r; h = h->order_next)
        if (h->state != REQ_DONE)
            return true;
    return false;
}

/* An upper bound on the pool room `r` may take with model `m`: bytes of
 * state and blocks, and slots.  The slot's chain grows from empty for a
 * start and for the borrowed slot of logits and generate; a step of n, or
 * an append of n tokens, adds at most n entries' blocks, and one more
 * block. */
static void req_need(const req_t *r, const model_t *m, uint64_t *bytes, uint64_t *slots)
{
    size_t chain = 0;
    uint32_t positions = 0;

    switch (r->rq.op) {
    case PROTO_OP_STEP:
    case PROTO_OP_APPEND:
        if (req__adds(r) <= 1)
            chain = model_block_bytes(m);
        else
            model_chain_blocks(m, (uint32_t)req__adds(r) + model_block_positions(m), 64, &chain);
        *bytes = chain + 64;
        *slots = 0;
        return;
    case PROTO_OP_GENERATE:
        positions = (uint32_t)(r->rq.ntokens + (size_t)r->rq.steps);
        break;
    case PROTO_OP_FORK: /* a slot holding the parent's sequence */
        positions = r->from_cs.entries;
        break;
    case PROTO_OP_START:
    case PROTO_OP_LOGITS:
        positions = (uint32_t)r->rq.ntokens;
        break;
    case PROTO_OP_NONE:
    case PROTO_OP_FINISH:
    case PROTO_OP_STATS:
    case PROTO_OP_AUTH:
    case PROTO_OP__COUNT: /* an op that takes no room never asks */
        assert(!"req_need() of an op that takes no pool room");
        *bytes = 0;
        *slots = 0;
        return;
    }
    model_chain_blocks(m, positions, 64, &chain);
    *bytes = chain + model_state_size(m) + 128;
    *slots = 1;
}

/* Whether `r`, which may take `bytes` and `slots` of the pool, must wait
 * for the earlier lines of its connection: when the pool may not hold it
 * and every earlier request still pending, it could take room one of them
 * needs, which one at a time it would not have had.  A finish (no need)
 * waits likewise while the earlier requests may not all fit: its room
 * could let one of them succeed that one at a time would have failed. */
static bool conn_must_wait(conn_t *c, const req_t *r, uint64_t bytes, uint64_t slots)
{
    uint64_t free_bytes, free_slots;

    if (c->pending_bytes == 0 && c->pending_slots == 0)
        return false;
    cache_pool_room(c->server->pool, &free_bytes, &free_slots);
    if (free_bytes >= c->pending_bytes + bytes && free_slots >= c->pending_slots + slots)
        return false;
    return earlier_pending(c, r);
}

/* `r` may take `bytes` and `slots`: pending until it is done. */
static void req_count_need(conn_t *c, req_t *r, uint64_t bytes, uint64_t slots)
{
    r->need_bytes = bytes;
    r->need_slots = (uint32_t)slots;
    conn__need_add(c, bytes, slots);
}

/* Makes `r` wait until every earlier line of its connection has taken
 * effect: applied then (again false), or its job run again (true).  The
 * lines read after it are held, unless a later barrier holds them already;
 * conn_advance() resumes it when it reaches the head. */
static void req_defer(conn_t *c, req_t *r, bool again)
{
    r->state = REQ_DEFER;
    r->again = again;
    if (c->barrier == NULL)
        c->barrier = r;
}

/* `r`, deferred, is at the head: nothing before it is pending any more. */
static void req_resume(conn_t *c, req_t *r)
{
    if (r->again) {
        r->again = false;
        r->rc = SLOTD_OK;
        r->reply.len = 0;
        launch__req(r);
    } else {
        r->state = REQ_NEW;
        if (!req_apply(c, r))
            return; /* closed */
        if (r->state == REQ_BUILD)
            return; /* still the barrier (its model was ready when it deferred, so not expected) */
    }
    release_barrier(c, r);
}

/* ---- Replies in read order ---- */

_Static_assert(PROTO_OP__COUNT * (MODEL_NPRESETS + 1) <= UINT16_MAX && MODEL_NPRESETS < UINT8_MAX,
               "a reply's (op, model) fits replied_label, its model req_t's model_label");

void dispatch__observe_replies(server_t *s)
{
    if (s->nreplied == 0)
        return;
    metrics_observe_loop_request_durations(uv_hrtime(), s->replied_ns, s->replied_label,
                                           s->nreplied);
    s->nreplied = 0;
}

/* Moves every answered record at the head of the order FIFO to `out`
 * (answering a stats that reached the head), in order. */
static void conn_advance(conn_t *c)
{
    server_t *s = c->server;
    bool moved = false;
    req_t *r;

    while ((r = c->order_head) != NULL && !c->closed) {
        if (r->state == REQ_DEFER) {
            req_resume(c, r);
            if (c->closed)
                return;
            continue;
        }
        if (r->state != REQ_DONE) {
            proto_stats_t st;
            int rc;
            if (r->rq.op == PROTO_OP_FORK && r->state == REQ_WAITING && r->session == NULL) {
                /* Every earlier line has taken effect: the fork runs now. */
                if (!fork_apply(c, r))
                    return; /* closed */
                continue;
            }
            if (r->rq.op != PROTO_OP_STATS || r->state != REQ_WAITING)
                break;
            if (s->draining) {
                rc = req__set_error(r, SLOTD_ESHUTTING_DOWN, SERVER_SHUTTING_DOWN_MSG);
            } else {
                if (c->tenant != NULL && !c->tenant->admin) {
                    inspect__tenant_stats(s, c->tenant, &st);
                    rc = proto_reply_stats_tenant(&r->reply, r->rq.tag, &st, c->tenant->name);
                } else {
                    inspect__stats(s, &st);
                    rc = proto_reply_stats(&r->reply, r->rq.tag, &st);
                }
            }
            if (rc != SLOTD_OK)
                goto nomem;
            req__done(r);
            release_barrier(c, r);
            if (c->closed)
                return;
        }
        if (proto_buf_append(&c->out, r->reply.data, r->reply.len) != SLOTD_OK)
            goto nomem;
        c->order_head = r->order_next;
        if (c->order_head == NULL)
            c->order_tail = NULL;
        c->outstanding--;
        conn__held_drop(c, r->reply.len);
        if (r->rc != SLOTD_OK) {
            metrics_count_error(r->rc);
            if (c->tenant != NULL) {
                c->tenant->errors_total++;
                if (r->rc < 0 && r->rc >= -SLOTD__ERR_COUNT)
                    c->tenant->errors[-r->rc - 1]++;
            }
        }
        if (r->rc == SLOTD_ECACHE_FULL)
            metrics_count_refusal((metrics_refusal_t)r->refusal);
        if (s->nreplied == SERVER_REPLIED_MAX)
            dispatch__observe_replies(s);
        s->replied_ns[s->nreplied] = r->read_ns;
        s->replied_label[s->nreplied++] = (uint16_t)metrics_op_model(
            r->rq.op, r->model_label != 0 ? (size_t)r->model_label - 1 : MODEL_NPRESETS);
        if (c->barrier == r) /* a deferred request that a drain failed */
            release_barrier(c, r);
        req__put(s, r);
        moved = true;
    }
    if (moved)
        conn__mark_dirty(s, c);
    return;

nomem:
    log_error("connection %" PRIu64 ": no memory for output; closing it", c->serial);
    conn__close(c);
}

/* ---- Requests as they are read ---- */

/* Notes `m`, the model `r` named or its session's, as the model label of
 * its duration (conn_advance()), whatever its reply turns out to be. */
static void req_model_found(req_t *r, const model_t *m)
{
    if (m != NULL)
        r->model_label = (uint8_t)(model_preset_index(m) + 1);
}

/* The model a start, logits or generate names (or the default one).  One
 * not built yet makes `r` wait for its build (REQ_BUILD) as the
 * connection's barrier: NULL with `err` left clear, which its caller
 * returns as SLOTD_OK; dispatch__model_built() applies it again. */
static const model_t *resolve_model(conn_t *c, req_t *r, slotd_error_t *err)
{
    server_t *s = c->server;
    const model_t *m;

    m = r->rq.model[0] == '\0' ? s->default_model : models__find(s, r->rq.model);
    if (m == NULL) {
        slotd_error_set(err, SLOTD_EBAD_REQUEST, "model: '%s' is not loaded", r->rq.model);
        return NULL;
    }
    req_model_found(r, m);
    if (!models__ready(s, m)) {
        assert(c->barrier == NULL || c->barrier == r); /* r is being applied */
        r->model = m;
        r->state = REQ_BUILD;
        c->barrier = r;
        return NULL;
    }
    return m;
}

#define ROOM_DEFERRED 1 /* room_check(): `r` waits (REQ_DEFER) */

/* The capacity checks of a start or step that grows its session by `g`
 * (`sess`: a step's session; NULL for a start), in order: the
 * connection's share (a refusal waits while an earlier line is pending,
 * whose charge may come back), then the pool's room (conn_must_wait()).
 * SLOTD_OK with the room `r` may take in *bytes and *slots; ROOM_DEFERRED
 * when `r` was deferred; or the code of the error set in `err`. */
static int room_check(conn_t *c, req_t *r, const model_t *m, const session_t *sess,
                      const session_grow_t *g, bool new_session, uint64_t *bytes, uint64_t *slots,
                      slotd_error_t *err)
{
    if (session__share_check(c, r, sess, g, new_session, err) != SLOTD_OK) {
        if (!earlier_pending(c, r)) {
            r->refusal = METRICS_REFUSAL_SHARE;
            return err->code;
        }
        req_defer(c, r, false);
        return ROOM_DEFERRED;
    }
    req_need(r, m, bytes, slots);
    if (conn_must_wait(c, r, *bytes, *slots)) {
        req_defer(c, r, false);
        return ROOM_DEFERRED;
    }
    return SLOTD_OK;
}

/* The context check of a step or an append of `sess` (model `m`), which
 * comes before its capacity checks.  On a session with nothing pending, context_full
 * now.  On one with requests pending, the worker checks it first when the
 * step runs: the step is charged to its connection's share as if it
 * filled the session's context at most (`g`), so that a refusal for the
 * share waits for the pending requests (room_check()) and the step is
 * then decided here, context first.  SLOTD_OK with `g` set, or the code
 * of the error set in `err`. */
static int step_context(const req_t *r, const session_t *sess, const model_t *m, session_grow_t *g,
                        slotd_error_t *err)
{
    uint32_t max = model_max_ctx(m);
    uint64_t n = req__adds(r);

    if (sess->has_slot && sess->running == NULL && sess->fifo_head == NULL &&
        (sess->cs.entries > max || n > max - sess->cs.entries)) {
        /* In the words of the worker's check (job.c, cache/session.c),
         * which answers the same request when it runs behind pending ones. */
        if (r->rq.op == PROTO_OP_APPEND)
            return slotd_error_set(err, SLOTD_ECONTEXT_FULL,
                                   "append: '%s' holds %" PRIu32 " of %" PRIu32
                                   " positions, %zu more do not fit",
                                   r->rq.id, sess->cs.entries, max, r->rq.ntokens);
        return slotd_error_set(err, SLOTD_ECONTEXT_FULL,
                               "step: %" PRIu32 " more entries would pass max_ctx %" PRIu32
                               " (session '%s' holds %" PRIu32 ")",
                               r->rq.n, max, r->rq.id, sess->cs.entries);
    }
    if (sess->share_entries >= max)
        n = 0;
    else if (n > max - sess->share_entries)
        n = max - sess->share_entries;
    session__grow_step(sess, m, (uint32_t)n, g);
    return SLOTD_OK;
}

/* Validates a start against the model, the map and the session limit, and
 * queues it on a new session record.  Returns SLOTD_OK, the code of the
 * error set in `err`, or SLOTD_ENOMEM. */
static int read_open(conn_t *c, req_t *r, slotd_error_t *err)
{
    server_t *s = c->server;
    const model_t *m = resolve_model(c, r, err);
    session_t *sess;
    session_grow_t g;
    uint64_t bytes, slots;
    int rc;

    if (m == NULL)
        return err->code;
    if (model_check_prompt(m, r->rq.tokens, r->rq.ntokens, err) != SLOTD_OK)
        return err->code;
    sess = session__find(c, r->rq.id);
    if (sess != NULL && sess->has_slot)
        return slotd_error_set(err, SLOTD_EDUPLICATE_ID,
                               "start: session '%s' is already live on this connection", r->rq.id);
    if (sess == NULL && s->admitted >= s->cfg->max_sessions) {
        if (earlier_pending(c, r)) { /* an earlier finish or failed start may make room */
            req_defer(c, r, false);
            return SLOTD_OK;
        }
        r->refusal = METRICS_REFUSAL_SLOTS;
        return slotd_error_set(err, SLOTD_ECACHE_FULL,
                               "start: the daemon holds %u sessions, its limit (--max-sessions); "
                               "retry when sessions finish",
                               s->cfg->max_sessions);
    }
    session__grow_start(m, (uint32_t)r->rq.ntokens, &g);
    rc = room_check(c, r, m, NULL, &g, sess == NULL, &bytes, &slots, err);
    if (rc != SLOTD_OK)
        return rc == ROOM_DEFERRED ? SLOTD_OK : rc;
    r->model = m;
    r->owner_key = c->serial;
    r->scope_key = tenancy__prefix_scope(c, s->cfg->prefix_scope);
    if (sess != NULL) {
        /* The id's start has not succeeded yet: this one is decided after
         * it, duplicate_id if it succeeds, run if it fails. */
        session__share_take(c, sess, &g, true);
        req_count_need(c, r, bytes, slots);
        session__enqueue(sess, r);
        return SLOTD_OK;
    }

    sess = session__get(s);
    if (sess == NULL)
        return SLOTD_ENOMEM;
    /* The id is kept once, in the owner its slot will have; the map's
     * node points at it. */
    sess->cs.owner.key = c->serial;
    memcpy(sess->cs.owner.id, r->rq.id, sizeof(sess->cs.owner.id));
    sess->node.id = sess->cs.owner.id;
    if (session_map_insert(&c->map, &sess->node) != SLOTD_OK) {
        session__put(s, sess);
        return SLOTD_ENOMEM;
    }
    sess->in_map = true;
    sess->born = uv_now(&s->loop);
    s->admitted++;
    session__share_take(c, sess, &g, false); /* room_check() admitted it */
    c->share_sessions++;
    tenancy__charge(c, 0, 1);
    sess->conn = c;
    sess->cs.model = m; /* for the room its steps may take, before it has a slot */
    sess->prev = NULL;
    sess->next = c->sessions;
    if (c->sessions != NULL)
        c->sessions->prev = sess;
    c->sessions = sess;

    req_count_need(c, r, bytes, slots);
    session__enqueue(sess, r);
    return SLOTD_OK;
}

/* The field check of an append against its session's model `m`: every
 * token in [0, V).  Its length against max_ctx is step_context()'s, as a
 * step's n is. */
static int append_check(const model_t *m, const req_t *r, slotd_error_t *err)
{
    for (size_t i = 0; m != NULL && i < r->rq.ntokens; i++)
        if (r->rq.tokens[i] < 0 || r->rq.tokens[i] >= (int64_t)model_vocab(m))
            return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                                   "append: `tokens` must hold integers from 0 to %" PRIu32
                                   " (model '%s'); element %zu is %" PRId64,
                                   model_vocab(m) - 1, model_name(m), i, r->rq.tokens[i]);
    return SLOTD_OK;
}

static int read_session_op(conn_t *c, req_t *r, slotd_error_t *err)
{
    session_t *sess = session__find(c, r->rq.id);

    if (sess == NULL)
        return slotd_error_set(err, SLOTD_EUNKNOWN_ID,
                               "%s: no live session '%s' on this connection",
                               proto_op_name(r->rq.op), r->rq.id);
    req_model_found(r, session__model(sess));
    if (r->rq.op == PROTO_OP_FINISH) {
        /* Its room must not reach an earlier request that may not fit
         * without it. */
        if (conn_must_wait(c, r, 0, 0)) {
            req_defer(c, r, false);
            return SLOTD_OK;
        }
        session__unmap(sess); /* later lines no longer see the id */
    } else {
        const model_t *m = session__model(sess);
        session_grow_t g;
        uint64_t bytes, slots;
        int rc = SLOTD_OK;

        if (r->rq.op == PROTO_OP_APPEND)
            rc = append_check(m, r, err);
        if (rc == SLOTD_OK)
            rc = step_context(r, sess, m, &g, err);
        if (rc == SLOTD_OK)
            rc = room_check(c, r, m, sess, &g, false, &bytes, &slots, err);
        if (rc != SLOTD_OK)
            return rc == ROOM_DEFERRED ? SLOTD_OK : rc;
        session__share_take(c, sess, &g, false); /* room_check() admitted it */
        req_count_need(c, r, bytes, slots);
    }
    session__enqueue(sess, r);
    return SLOTD_OK;
}

static int read_stateless(conn_t *c, req_t *r, slotd_error_t *err)
{
    const model_t *m = resolve_model(c, r, err);
    uint64_t bytes, slots;
    int rc;

    if (m == NULL)
        return err->code;
    if (model_family(m) != MODEL_FAMILY_ATTN)
        return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                               "model: '%s' is a hash model; %s needs an attn model", model_name(m),
                               proto_op_name(r->rq.op));
    rc = r->rq.op == PROTO_OP_GENERATE
             ? model_check_generate(m, r->rq.tokens, r->rq.ntokens, r->rq.steps, err)
             : model_check_logits(m, r->rq.tokens, r->rq.ntokens, err);
    if (rc != SLOTD_OK)
        return rc;
    req_need(r, m, &bytes, &slots);
    if (conn_must_wait(c, r, bytes, slots)) {
        req_defer(c, r, false);
        return SLOTD_OK;
    }
    req_count_need(c, r, bytes, slots);
    r->model = m;
    launch__req(r);
    return SLOTD_OK;
}

/* A stats: answered at the head of the order FIFO; the lines after it
 * wait until then, so that it shows nothing of them. */
static int read_barrier(conn_t *c, req_t *r, slotd_error_t *err)
{
    (void)err;
    r->state = REQ_WAITING;
    c->barrier = r;
    return SLOTD_OK;
}

/* A fork that reached the head of its connection's order FIFO: every
 * earlier line has taken effect, and the later ones are held behind it
 * until its job is back (dispatch__job_done()), so the session it forks
 * runs nothing meanwhile and its slot is what the worker copies.  The
 * checks, in the protocol's order: `from` live on this connection
 * (unknown_id), `id` not (duplicate_id), the session limit and the
 * connection's share (cache_full).  Then the new session's record is made
 * as a start's, with the fork as its first request.  The forked session is
 * taken off the idle list until the job is back, and is not released
 * while the job reads it (session_t.forks_out, counted at submit).  False
 * if the connection closed. */
static bool fork_apply(conn_t *c, req_t *r)
{
    server_t *s = c->server;
    session_t *from, *sess;
    const model_t *m;
    slotd_error_t err;
    session_grow_t g;
    uint64_t need, need_slots;

    slotd_error_clear(&err);
    if (s->draining) {
        slotd_error_set(&err, SLOTD_ESHUTTING_DOWN, SERVER_SHUTTING_DOWN_MSG);
        goto fail;
    }
    from = session__find(c, r->rq.from);
    if (from == NULL || !from->has_slot) {
        slotd_error_set(&err, SLOTD_EUNKNOWN_ID, "fork: no live session '%s' on this connection",
                        r->rq.from);
        goto fail;
    }
    assert(from->running == NULL && from->fifo_head == NULL); /* nothing earlier pending */
    if (session__find(c, r->rq.id) != NULL) {
        slotd_error_set(&err, SLOTD_EDUPLICATE_ID,
                        "fork: session '%s' is already live on this connection", r->rq.id);
        goto fail;
    }
    if (s->admitted >= s->cfg->max_sessions) {
        r->refusal = METRICS_REFUSAL_SLOTS;
        slotd_error_set(&err, SLOTD_ECACHE_FULL,
                        "fork: the daemon holds %u sessions, its limit (--max-sessions); "
                        "retry when sessions finish",
                        s->cfg->max_sessions);
        goto fail;
    }
    m = from->cs.model;
    session__grow_start(m, from->cs.entries, &g);
    if (session__share_check(c, r, NULL, &g, true, &err) != SLOTD_OK) {
        r->refusal = METRICS_REFUSAL_SHARE;
        goto fail;
    }

    sess = session__get(s);
    if (sess == NULL)
        goto nomem;
    sess->cs.owner.key = c->serial;
    memcpy(sess->cs.owner.id, r->rq.id, sizeof(sess->cs.owner.id));
    sess->node.id = sess->cs.owner.id;
    if (session_map_insert(&c->map, &sess->node) != SLOTD_OK) {
        session__put(s, sess);
        goto nomem;
    }
    sess->in_map = true;
    sess->born = uv_now(&s->loop);
    s->admitted++;
    session__share_take(c, sess, &g, false);
    c->share_sessions++;
    tenancy__charge(c, 0, 1);
    sess->conn = c;
    sess->cs.model = m;
    sess->prev = NULL;
    sess->next = c->sessions;
    if (c->sessions != NULL)
        c->sessions->prev = sess;
    c->sessions = sess;

    if (from->in_lru)
        session__lru_remove(s, from);
    r->fork_from = from;
    r->from_cs = from->cs;
    r->from_toks = from->toks;
    r->from_evicted = from->evicted; /* the job starts it from the tokens instead (job.c) */
    r->model = m;
    req_model_found(r, m);
    r->owner_key = c->serial;
    req_need(r, m, &need, &need_slots);
    req_count_need(c, r, need, need_slots);
    session__enqueue(sess, r);
    return !c->closed;

fail:
    if (!req__fail(r, &err))
        return false;
    release_barrier(c, r);
    return !c->closed;
nomem:
    log_error("connection %" PRIu64 ": no memory for a request; closing it", c->serial);
    conn__close(c);
    return false;
}

/* How a request is applied, by what its op acts on (proto/ops.c's table):
 * a new op of a kind already here needs no edit in this file. */
static int (*const read_kind[])(conn_t *, req_t *, slotd_error_t *) = {
    [PROTO_KIND_OPEN] = read_open,           [PROTO_KIND_SESSION] = read_session_op,
    [PROTO_KIND_STATELESS] = read_stateless, [PROTO_KIND_BARRIER] = read_barrier,
    [PROTO_KIND_BRANCH] = read_barrier, /* applied at the head: fork_apply() */
};

/* Applies a parsed request, already in the order FIFO, to the
 * connection's state: the model's ranges, the session map, the session's
 * FIFO or the workers.  False if the connection had to close (no memory). */
static bool req_apply(conn_t *c, req_t *r)
{
    proto_op_kind_t kind = proto_op_kind(r->rq.op);
    slotd_error_t err;
    int rc;

    slotd_error_clear(&err);
    if ((size_t)kind < sizeof(read_kind) / sizeof(read_kind[0]) && read_kind[kind] != NULL)
        rc = read_kind[kind](c, r, &err);
    else
        rc = slotd_error_set(&err, SLOTD_EUNKNOWN_OP, "op: not known");
    if (rc == SLOTD_ENOMEM) {
        log_error("connection %" PRIu64 ": no memory for a request; closing it", c->serial);
        conn__close(c);
        return false;
    }
    return rc == SLOTD_OK || req__fail(r, &err);
}

/* If `r` is the barrier (a stats answered, a deferred request resumed or
 * failed by a drain), lifts it: counts and applies the lines held behind
 * it, in order, up to the next barrier. */
static void release_barrier(conn_t *c, req_t *r)
{
    req_t *h;

    if (c->barrier != r)
        return;
    c->barrier = NULL;
    for (h = r->order_next; h != NULL && c->barrier == NULL; h = h->order_next) {
        if (h->uncounted) {
            h->uncounted = false;
            metrics_count_request(h->rq.op);
        }
        if (h->state == REQ_HELD && !req_apply(c, h))
            return;
    }
}

/* A reload marked c's tenant gone: its auth_revoked line goes out after
 * the replies to every line it read (authreq.c). */
void dispatch__revoke(conn_t *c)
{
    if (authreq__revoke(c) && c->order_head != NULL && c->order_head->state != REQ_RUNNING)
        conn_advance(c);
}

/* conn_hooks_t.line, a proto_framer_feed() callback: one complete line. */
int dispatch__on_line(void *arg, const char *line, size_t len)
{
    conn_t *c = arg;
    slotd_error_t err;
    req_t *r;
    int rc;

    if (c->input_done) /* after auth_failed: the rest of this read is dropped */
        return 0;
    if ((r = req__get(c->server)) == NULL)
        return SLOTD_ENOMEM;
    slotd_error_clear(&err);
    r->conn = c;
    r->read_ns = c->read_ns;
    req__order_append(c, r);
    rc = proto_request_parse(line, len, &r->rq, &err);
    if (c->tenant != NULL)
        c->tenant->requests_total++;
    /* A line behind a barrier is counted when the barrier goes, so that a
     * stats shows nothing of the lines after it. */
    if (c->barrier == NULL)
        metrics_count_request(r->rq.op);
    else
        r->uncounted = true;
    if (r->rq.op == PROTO_OP_AUTH && rc == SLOTD_OK) {
        if (!authreq__auth(c, r))
            return SLOTD_ENOMEM;
    } else if (r->rq.op != PROTO_OP_AUTH && !c->authed && config_auth_on(c->server->cfg)) {
        slotd_error_set(&err, SLOTD_EAUTH_REQUIRED,
                        "authenticate first: {\"op\":\"auth\",\"token\":\"...\"}");
        if (!req__fail(r, &err))
            return SLOTD_ENOMEM;
    } else if (rc != SLOTD_OK) {
        if (!req__fail(r, &err))
            return SLOTD_ENOMEM;
    } else if (c->barrier != NULL) {
        r->state = REQ_HELD;
    } else if (!req_apply(c, r)) {
        return SLOTD_ENOMEM;
    }
    /* Nothing moves while the oldest line's job is out (most lines, when
     * the connection pipelines). */
    if (c->order_head != NULL && c->order_head->state != REQ_RUNNING)
        conn_advance(c);
    return c->closed ? SLOTD_ENOMEM : 0;
}

/* conn_hooks_t.drain_line, a proto_framer_feed() callback in a drain: one
 * complete line the peer had sent before it, answered shutting_down (its
 * tag echoed if it has one). */
int dispatch__on_drain_line(void *arg, const char *line, size_t len)
{
    conn_t *c = arg;
    slotd_error_t err;
    req_t *r = req__get(c->server);

    if (r == NULL)
        return SLOTD_ENOMEM;
    slotd_error_clear(&err);
    r->conn = c;
    r->read_ns = c->read_ns;
    req__order_append(c, r);
    (void)proto_request_parse(line, len, &r->rq, &err); /* for the op and the tag */
    metrics_count_request(r->rq.op);
    slotd_error_set(&err, SLOTD_ESHUTTING_DOWN, SERVER_SHUTTING_DOWN_MSG);
    if (!req__fail(r, &err))
        return SLOTD_ENOMEM;
    conn_advance(c);
    return c->closed ? SLOTD_ENOMEM : 0;
}

/* conn_hooks_t.line_too_long: the framer met a line longer than
 * --max-line.  It is answered line_too_long in its place, and the input
 * ends there (the connection closes lingering once all is answered). */
void dispatch__line_too_long(conn_t *c)
{
    req_t *r = req__get(c->server);
    log_debug("connection %" PRIu64 ": line longer than %zu bytes", c->serial, c->framer.max_line);
    if (r == NULL) {
        conn__close(c);
        return;
    }
    r->conn = c;
    r->read_ns = c->read_ns;
    req__order_append(c, r);
    if (c->barrier == NULL) /* as dispatch__on_line() counts */
        metrics_count_request(PROTO_OP_NONE);
    else
        r->uncounted = true;
    if (req__set_error(r, SLOTD_ELINE_TOO_LONG, "line longer than %zu bytes", c->framer.max_line) !=
        SLOTD_OK) {
        conn__close(c);
        return;
    }
    req__done(r);
    c->line_too_long = true;
    conn__end_input(c);
    conn_advance(c);
}

/* ---- Jobs coming back ---- */

void dispatch__job_done(req_t *r)
{
    conn_t *c = r->conn;
    server_t *s = c->server;
    session_t *sess = r->session, *from;

    conn__unreserve(c, r->reply_bound);
    metrics_job_back(atomic_load_explicit(&r->started, memory_order_relaxed));
    if (c->tenant != NULL && r->begun_ns != 0) {
        c->tenant->wait_ns += r->begun_ns > r->read_ns ? r->begun_ns - r->read_ns : 0;
        c->tenant->waits++;
        r->begun_ns = 0; /* a job run again is counted again only if begun again */
    }
    if (r->chain_next != NULL && (r->rc != SLOTD_OK || r->chain_cut))
        launch__chain_return(r);
    if (sess != NULL && sess->evicted) /* --on-full evict: maybe rebuilt */
        evict__job_back(r);
    /* Refused for room while an earlier line has yet to take effect, which
     * may make room: not answered, but run again once they all have.  With
     * nothing earlier pending, --on-full may make room or wait for it. */
    if (r->rc == SLOTD_ECACHE_FULL && !c->closed && !s->draining) {
        bool pending = earlier_pending(c, r);
        if (sess != NULL && req__on_slot(r)) {
            /* The step may have moved the audit's recording (realloc) before
             * the pool refused it: the session keeps what the job left. */
            sess->cs = r->cs;
            sess->toks = r->toks;
        }
        if (pending)
            req_defer(c, r, true);
        if (pending || evict__on_full(r)) {
            conn__update(c);
            conn__unref(c);
            return;
        }
    }
    if (r->room_until != 0) /* it waited for room (evict.c) */
        evict__room_done(r);
    if (r->rc == SLOTD_ECACHE_FULL) { /* the pool's: its bytes, or (an acquire) its slots */
        uint64_t free_bytes, free_slots;
        cache_pool_room(s->pool, &free_bytes, &free_slots);
        r->refusal = !req__on_slot(r) && free_slots == 0 ? METRICS_REFUSAL_SLOTS
                                                         : METRICS_REFUSAL_POOL;
    }
    /* The session takes the result first; it keeps `running` until the
     * end, so that a close here leaves it for the code below. */
    if (sess != NULL) {
        assert(sess->running == r);
        if (req__opens(r) && r->rc == SLOTD_OK) {
            sess->cs = r->cs;
            sess->toks = r->toks;
            sess->has_slot = true;
            s->live_sessions++;
        } else if (req__opens(r)) {
            /* No trace: the steps and finish queued behind it get
             * unknown_id, a start queued behind it runs, and with nothing
             * queued the id is free again (session.c: session__settle()). */
            session__give_back(sess);
        } else {
            if (c->tenant != NULL && r->rq.op == PROTO_OP_STEP && r->rc == SLOTD_OK &&
                r->cs.entries > sess->cs.entries)
                c->tenant->steps_total += r->cs.entries - sess->cs.entries;
            sess->cs = r->cs; /* a failed step left it as it was */
            sess->toks = r->toks;
            if (r->rc != SLOTD_OK)
                session__give_back(sess);
        }
    }
    if (!c->closed && (r->rc == SLOTD_ENOMEM || r->rc == SLOTD_ESTALE || r->rc == SLOTD_EINVAL)) {
        log_error("connection %" PRIu64 ": %s failed: %s; closing it", c->serial,
                  proto_op_name(r->rq.op), slotd_strerror(r->rc));
        conn__close(c);
    }
    if (sess != NULL)
        sess->running = r->chain_next; /* a chain's next step runs on */
    r->chain_next = NULL;
    if ((from = r->fork_from) != NULL) { /* the forked session is free to go on */
        r->fork_from = NULL;
        assert(from->forks_out > 0);
        from->forks_out--;
        if (c->closed && from->forks_out == 0 && from->running == NULL && !from->in_map)
            session__discard(from); /* conn__close() left it for now */
    }

    if (c->closed) {
        if (sess != NULL && sess->running == NULL)
            session__discard(sess); /* conn__close() unmapped it */
        req__put(s, r);
    } else {
        req__done(r);
        if (sess != NULL && sess->running == NULL)
            session__kick(sess);
        if (r->rq.op == PROTO_OP_FORK) {
            if (from != NULL && from->running == NULL)
                session__kick(from);
            release_barrier(c, r); /* the lines held behind it now apply */
        }
        conn_advance(c);
        conn__update(c);
    }
    conn__unref(c);
}

/* ---- Drain ---- */

void dispatch__drain(conn_t *c)
{
    session_t *sess;
    slotd_error_t err;

    if (c->closed)
        return;
    conn__drain_input(c);
    slotd_error_set(&err, SLOTD_ESHUTTING_DOWN, SERVER_SHUTTING_DOWN_MSG);
    for (req_t *r = c->order_head; r != NULL; r = r->order_next) {
        if (r->state == REQ_ROOM)
            evict__unwait(c->server, r); /* waiting for room (evict.c) */
        else if (r->state != REQ_HELD && r->state != REQ_DEFER && r->state != REQ_BUILD)
            continue;
        if (r->session != NULL && r->session->running == r)
            r->session->running = NULL; /* deferred after its job ran: not out */
        if (!req__fail(r, &err))
            return;
    }
    for (req_t *r; (r = conn__park_pop(c)) != NULL;) { /* never submitted */
        if (r->session != NULL && r->session->running == r)
            r->session->running = NULL;
        if (!req__fail(r, &err))
            return;
    }
    for (sess = c->sessions; sess != NULL; sess = sess->next) {
        req_t *r;
        while ((r = sess->fifo_head) != NULL) {
            sess->fifo_head = r->session_next;
            if (!req__fail(r, &err))
                return;
        }
        sess->fifo_tail = NULL;
        if (sess->in_lru)
            session__lru_remove(c->server, sess);
    }
    conn_advance(c);
    conn__update(c);
}

/* ---- Models built on first use ---- */

void dispatch__model_built(conn_t *c, const model_t *m, int rc)
{
    req_t *r = c->barrier;
    slotd_error_t err;

    if (c->closed || r == NULL || r->state != REQ_BUILD || r->model != m)
        return;
    slotd_error_clear(&err);
    if (rc == SLOTD_OK) {
        r->state = REQ_NEW;
        if (!req_apply(c, r))
            return; /* closed */
    } else {
        slotd_error_set(&err, rc, "model: '%s' could not be built: %s", model_name(m),
                        slotd_strerror(rc));
        if (!req__fail(r, &err))
            return;
    }
    if (r->state != REQ_DEFER) /* else it stays the barrier until it reaches the head */
        release_barrier(c, r);
    conn_advance(c);
    conn__update(c);
}
