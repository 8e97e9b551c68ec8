/*
 * conn.c: a session connection, from accept to free.  It owns the
 * connection's framer, its order FIFO of request records, its map of live
 * ids and every session record started on it, and its output buffers.
 *
 * It reads and frames lines, parses and validates each into a request
 * record in read order, runs each session's FIFO one request at a time,
 * parks jobs over the output bound (conn_update()), copies ready replies
 * to `out` in request order, holds output back for a pipelined burst
 * (conn_hold_output()), and closes, lingering when its input may not be
 * all read; a drain answers the lines already in the socket shutting_down
 * (conn_drain_input()).  With --conn-timeout, server.c keeps quiet
 * connections on a list by deadline.
 *
 * DESIGN.  Loop thread only; no lock.  A record whose job is out
 * (REQ_RUNNING) belongs to the workers until conn_job_done(); the
 * connection counts it in `refs`, so the struct outlives the handle until
 * the last job is back.
 *
 * Design: docs/design.md, "Connections at their edges" and "Pipelining".
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "auth.h"
#include "log.h"
#include "server_int.h"

static void conn_close(conn_t *c);
static void conn_update(conn_t *c);
static void release_barrier(conn_t *c, req_t *r);
static bool req_apply(conn_t *c, req_t *r);
static void session_kick(session_t *sess);
static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void conn_close_lingering(conn_t *c);
static void read_cb(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf);

/* ---- Records ---- */

int req_set_error(req_t *r, int code, const char *fmt, ...)
{
    slotd_error_t err;
    va_list ap;

    err.code = code;
    va_start(ap, fmt);
    vsnprintf(err.message, sizeof(err.message), fmt, ap);
    va_end(ap);
    r->rc = code;
    r->reply.len = 0;
    return proto_reply_error(&r->reply, r->rq.tag, &err);
}

/* The record's reply is ready: it now counts against the output bound,
 * and the room it might have taken no longer counts as pending. */
static void req_done(req_t *r)
{
    conn_t *c = r->conn;

    r->state = REQ_DONE;
    c->held_bytes += r->reply.len;
    c->pending_bytes -= r->need_bytes;
    c->pending_slots -= r->need_slots;
    r->need_bytes = 0;
    r->need_slots = 0;
}

/* Finishes `r` with an error reply; false (and the connection closed) if
 * there was no memory for it. */
static bool req_fail(req_t *r, const slotd_error_t *err)
{
    r->rc = err->code;
    r->reply.len = 0;
    if (proto_reply_error(&r->reply, r->rq.tag, err) != SLOTD_OK) {
        log_error("connection %" PRIu64 ": no memory for a reply; closing it", r->conn->serial);
        conn_close(r->conn);
        return false;
    }
    req_done(r);
    return true;
}

static void order_append(conn_t *c, req_t *r)
{
    r->order_next = NULL;
    r->seq = c->next_seq++;
    if (c->order_tail != NULL)
        c->order_tail->order_next = r;
    else
        c->order_head = r;
    c->order_tail = r;
    c->outstanding++;
}

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

static size_t conn_unwritten(conn_t *c);
static bool conn_may_run(conn_t *c, size_t bound);

/* ---- Coalesced runs (docs/design.md, "Scheduler") ----
 *
 * A step submitted while more steps of its session wait right behind it
 * in the session's FIFO takes them along: they are linked to it
 * (chain_next) and leave the FIFO as jobs out (REQ_RUNNING, reserved,
 * counted in refs and in the steps out), as far as the output bound lets
 * each run.  The worker runs them back to back and hands each back as it
 * is answered (job.c: job_run()).  So conn_job_done() sees a chain's steps
 * come back one by one: a step that succeeded with a successor leaves the
 * successor as the session's running request; one that did not, or was
 * canceled or taken back, brings its unrun successors back to the front
 * of the FIFO (chain_return()), where they wait as before. */
#define CONN_CHAIN_MAX 256

static void req_chain(req_t *r)
{
    conn_t *c = r->conn;
    session_t *sess = r->session;
    req_t *tail = r, *q;

    for (size_t n = 1; n < CONN_CHAIN_MAX && !c->server->draining && c->park_head == NULL &&
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
        q->job.flow = &c->flow;
        q->state = REQ_RUNNING;
        c->reserved += q->reply_bound;
        c->refs++;
        metrics_step_out();
        tail->chain_next = q;
        tail = q;
    }
}

/* `r` came back unanswered or failed: its successors in the chain did not
 * run.  They go back to the front of the session's FIFO, in order (or, the
 * connection closed, are freed). */
static void chain_return(req_t *r)
{
    conn_t *c = r->conn;
    session_t *sess = r->session;
    req_t *q = r->chain_next, *next, **link = &sess->fifo_head, *last = NULL;

    r->chain_next = NULL;
    for (; q != NULL; q = next) {
        next = q->chain_next;
        q->chain_next = NULL;
        metrics_step_back();
        assert(c->refs > 1); /* r's own ref stays */
        c->refs--;
        if (c->closed) {
            server_req_put(c->server, q);
            continue;
        }
        c->reserved -= q->reply_bound;
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
    r->job.flow = &c->flow;
    r->state = REQ_RUNNING;
    c->reserved += r->reply_bound;
    c->refs++;
    r->chain_next = NULL;
    if (r->session != NULL && r->rq.op == PROTO_OP_STEP)
        req_chain(r);
    worker_job_set_cost(&r->job, r->chain_next != NULL ? job_chain_cost(c->server, r)
                                                       : job_cost(c->server, r));
    server_submit(c->server, r);
}

/* Reply bytes the connection has not written yet: in `out` and in the
 * write in flight. */
static size_t conn_unwritten(conn_t *c)
{
    return uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) + c->out.len;
}

/* Whether a job with a reply of up to `bound` bytes may run now. */
static bool conn_may_run(conn_t *c, size_t bound)
{
    size_t unwritten = conn_unwritten(c);

    if (unwritten == 0 && c->reserved == 0)
        return true;
    return unwritten + c->held_bytes + c->reserved + bound <= CONN_MAX_PENDING_BYTES;
}

/* Submits `r`'s job, or parks it (in read order) while the connection's
 * output is over its bound. */
static void req_launch(req_t *r)
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
static void conn_run_parked(conn_t *c)
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
 * start and for the borrowed slot of logits and generate; a step of n adds
 * at most n entries' blocks, and one more block. */
static void req_need(const req_t *r, const model_t *m, uint64_t *bytes, uint64_t *slots)
{
    size_t chain = 0;
    uint32_t positions;

    switch (r->rq.op) {
    case PROTO_OP_STEP:
        if (r->rq.n <= 1)
            chain = model_block_bytes(m);
        else
            model_chain_blocks(m, r->rq.n + model_block_positions(m), 64, &chain);
        *bytes = chain + 64;
        *slots = 0;
        return;
    case PROTO_OP_GENERATE:
        positions = (uint32_t)(r->rq.ntokens + (size_t)r->rq.steps);
        break;
    default: /* start, logits */
        positions = (uint32_t)r->rq.ntokens;
        break;
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
    c->pending_bytes += bytes;
    c->pending_slots += slots;
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
        req_launch(r);
    } else {
        r->state = REQ_NEW;
        if (!req_apply(c, r))
            return; /* closed */
    }
    release_barrier(c, r);
}

/* ---- The connection's lifetime ---- */

static void conn_free(conn_t *c)
{
    server_t *s = c->server;

    assert(c->closed && c->refs == 0 && c->sessions == NULL && c->order_head == NULL);
    assert(!c->dirty && c->wait == CONN_WAIT_NONE);
    proto_framer_free(&c->framer);
    session_map_free(&c->map);
    proto_buf_free(&c->out);
    proto_buf_free(&c->wbuf);
    free(c);
    s->nconns_alive--;
    server_conn_freed(s);
}

static void conn_unref(conn_t *c)
{
    assert(c->refs > 0);
    if (--c->refs == 0)
        conn_free(c);
}

static void conn_close_cb(uv_handle_t *h)
{
    conn_t *c = container_of((uv_tcp_t *)h, conn_t, tcp);

    c->server->nsockets--;
    conn_unref(c);
}

static void conn_close_handle(conn_t *c)
{
    if (c->handle_closing)
        return;
    c->handle_closing = true;
    server_wait_remove(c->server, c);
    uv_close((uv_handle_t *)&c->tcp, conn_close_cb);
}

void conn_linger_end(conn_t *c)
{
    log_debug("connection %" PRIu64 ": closed after lingering (%zu bytes discarded)", c->serial,
              c->linger_bytes);
    conn_close_handle(c);
}

static void linger_read_cb(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    conn_t *c = container_of((uv_tcp_t *)stream, conn_t, tcp);

    (void)buf;
    if (nread > 0)
        c->linger_bytes += (size_t)nread;
    if (nread < 0 || c->linger_bytes >= CONN_LINGER_MAX_BYTES)
        conn_linger_end(c);
}

static void linger_shutdown_cb(uv_shutdown_t *req, int status)
{
    conn_t *c = container_of(req, conn_t, shutdown_req);

    if (status < 0 && !c->handle_closing)
        conn_linger_end(c);
}

/* Gives the session's slot back to the pool, counted under `why`; the
 * entries it held, or 0 if it held no slot. */
static uint32_t session_release(session_t *sess, metrics_release_t why)
{
    server_t *s = sess->conn->server;
    uint32_t released = 0;

    if (!sess->has_slot)
        return 0;
    if (cache_session_finish(s->pool, &sess->cs, &released) != SLOTD_OK)
        log_error("session '%s': release failed (stale handle)", sess->node.id);
    sess->has_slot = false;
    audit_tokens_free(&sess->toks);
    s->live_sessions--;
    metrics_count_release(why);
    return released;
}

/* Releases the session's slot (if it holds one) for the reason its
 * connection closed, and frees the record.  It must have no job out. */
static void session_discard(session_t *sess)
{
    conn_t *c = sess->conn;
    server_t *s = c->server;

    assert(sess->running == NULL && !sess->in_map && !sess->in_lru);
    session_release(sess, c->release_reason);
    if (sess->prev != NULL)
        sess->prev->next = sess->next;
    else
        c->sessions = sess->next;
    if (sess->next != NULL)
        sess->next->prev = sess->prev;
    server_session_put(s, sess);
}

static void session_unmap(session_t *sess)
{
    server_t *s = sess->conn->server;

    if (sess->in_lru)
        server_lru_remove(s, sess);
    if (sess->in_map) {
        session_map_remove(&sess->conn->map, &sess->node);
        sess->in_map = false;
        s->admitted--;
        sess->conn->share_sessions--;
        sess->conn->share_bytes -= sess->charged;
        sess->charged = 0;
    }
}

/* One connection's share of the pool (--max-connection-share,
 * --max-sessions-per-connection).  Bytes are counted as entries x entry
 * size plus the model's state, charged when a start or step is read and
 * given back when it fails or its session leaves the map: so a client
 * that pipelines cannot pass its share before its requests have run. */
static int share_charge(conn_t *c, session_t *sess, const model_t *m, uint64_t entries, bool start,
                        bool new_session, slotd_error_t *err)
{
    const server_config_t *cfg = c->server->cfg;
    uint64_t need =
        m == NULL ? 0 : entries * model_entry_size(m) + (start ? model_state_size(m) : 0);
    uint64_t cap = (uint64_t)((double)(cfg->cache_mb << 20) * cfg->max_conn_share);
    const char *op = start ? "start" : "step";

    if (new_session) {
        uint64_t most = (uint64_t)((double)cfg->max_sessions * cfg->max_conn_share);
        if (most > cfg->max_sessions_per_conn)
            most = cfg->max_sessions_per_conn;
        if (c->share_sessions >= (most > 0 ? most : 1))
            return slotd_error_set(err, SLOTD_ECACHE_FULL,
                                   "start: this connection's share is used up: it holds %u "
                                   "sessions (--max-sessions-per-connection, "
                                   "--max-connection-share)",
                                   c->share_sessions);
    }
    /* A share of the whole pool is no limit of its own: the pool refuses,
     * and says so, when the bytes run out. */
    if (cfg->max_conn_share < 1.0 && c->share_bytes + need > cap)
        return slotd_error_set(err, SLOTD_ECACHE_FULL,
                               "%s: this connection's share of the pool is used up: %" PRIu64
                               " of its %" PRIu64 " bytes (--max-connection-share)",
                               op, c->share_bytes, cap);
    if (sess != NULL) {
        sess->charged += need;
        c->share_bytes += need;
    }
    return SLOTD_OK;
}

/* Gives back what `r` (a start or step of `sess`, which failed or never
 * ran) had charged to its connection's share. */
static void share_give_back(session_t *sess, const req_t *r)
{
    /* A start charged its own model (a start queued behind another of the
     * same id may name another one). */
    const model_t *m = r->rq.op == PROTO_OP_START ? r->model : sess->cs.model;
    uint64_t back;

    if (!sess->in_map || m == NULL)
        return; /* session_unmap() gave everything back */
    back = r->rq.op == PROTO_OP_START
               ? (uint64_t)r->rq.ntokens * model_entry_size(m) + model_state_size(m)
               : (uint64_t)r->rq.n * model_entry_size(m);
    back = back < sess->charged ? back : sess->charged;
    sess->charged -= back;
    sess->conn->share_bytes -= back;
}

/* Ends the connection's service: drops every request not yet started,
 * releases every session with no job out (the others when their job comes
 * back).  The handle is closed by the caller. */
static void conn_detach(conn_t *c)
{
    server_t *s = c->server;
    req_t *r, *rnext;
    session_t *sess, *snext;

    c->closed = true;
    server_wait_remove(s, c);
    c->reading = false;
    c->release_reason = s->draining ? METRICS_RELEASE_SHUTDOWN : METRICS_RELEASE_DISCONNECT;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    s->nconns--;

    for (r = c->order_head; r != NULL; r = rnext) {
        rnext = r->order_next;
        if (r->uncounted) /* read behind a barrier that never lifted */
            metrics_count_request(r->rq.op);
        if (r->state == REQ_RUNNING) {
            atomic_store_explicit(&r->canceled, true, memory_order_relaxed);
            continue;
        }
        if ((r->state == REQ_PARKED || r->state == REQ_DEFER) && r->session != NULL &&
            r->session->running == r)
            r->session->running = NULL; /* not out */
        server_req_put(s, r);
    }
    c->order_head = c->order_tail = NULL;
    c->park_head = c->park_tail = NULL;
    c->barrier = NULL;
    c->outstanding = 0;
    c->held_bytes = 0;
    c->reserved = 0;
    c->pending_bytes = 0;
    c->pending_slots = 0;

    for (sess = c->sessions; sess != NULL; sess = snext) {
        snext = sess->next;
        sess->fifo_head = sess->fifo_tail = NULL;
        session_unmap(sess);
        if (sess->running == NULL)
            session_discard(sess);
    }
}

/* Closes at once: conn_detach(), then the handle.  Idempotent. */
static void conn_close(conn_t *c)
{
    if (c->closed)
        return;
    conn_detach(c);
    log_debug("connection %" PRIu64 ": closed", c->serial);
    conn_close_handle(c);
}

/* Whether the peer may have sent input the daemon has not read: always
 * after line_too_long (the rest of the line is likely still coming), never
 * after its EOF, and otherwise if the socket holds unread bytes.  (A drain
 * closes an idle connection at once.) */
static bool conn_input_left(conn_t *c)
{
    uv_os_fd_t fd;
    int unread = 0;

    if (c->peer_eof)
        return false;
    if (c->line_too_long)
        return true;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0 || ioctl(fd, FIONREAD, &unread) != 0)
        return true;
    return unread > 0;
}

/* Everything is answered and written, and the peer's input may not have
 * been read to its end: closes lingering (see the top of the file). */
static void conn_close_lingering(conn_t *c)
{
    server_t *s = c->server;
    uint64_t now = uv_now(&s->loop), until = server_linger_until(s);

    conn_detach(c);
    uv_read_stop((uv_stream_t *)&c->tcp);
    if (until <= now ||
        uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->tcp, linger_shutdown_cb) != 0 ||
        uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, linger_read_cb) != 0) {
        log_debug("connection %" PRIu64 ": closed", c->serial);
        conn_close_handle(c);
        return;
    }
    server_wait_add(s, c, CONN_WAIT_LINGER, until);
    log_debug("connection %" PRIu64 ": closed; lingering for its input", c->serial);
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
            if (r->rq.op != PROTO_OP_STATS || r->state != REQ_WAITING)
                break;
            if (s->draining) {
                rc = req_set_error(r, SLOTD_ESHUTTING_DOWN, SERVER_SHUTTING_DOWN_MSG);
            } else {
                server_stats(s, &st);
                rc = proto_reply_stats(&r->reply, r->rq.tag, &st);
            }
            if (rc != SLOTD_OK)
                goto nomem;
            req_done(r);
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
        c->held_bytes -= r->reply.len;
        if (r->rc != SLOTD_OK)
            metrics_count_error(r->rc);
        if (c->barrier == r) /* a deferred request that a drain failed */
            release_barrier(c, r);
        server_req_put(s, r);
        moved = true;
    }
    if (moved)
        server_mark_dirty(s, c);
    return;

nomem:
    log_error("connection %" PRIu64 ": no memory for output; closing it", c->serial);
    conn_close(c);
}

/* After any progress: closes a connection whose input is over once all is
 * answered and written; otherwise stops or resumes reading by the bounds. */
static void conn_update(conn_t *c)
{
    server_t *s = c->server;
    size_t pending;

    if (c->closed)
        return;
    if (!s->draining)
        conn_run_parked(c);
    if (c->input_done) {
        if (c->order_head == NULL && !c->writing && c->out.len == 0) {
            if (conn_input_left(c))
                conn_close_lingering(c);
            else
                conn_close(c);
        }
        return;
    }
    /* Quiet: no session, nothing to answer or write.  Its clock starts
     * when it becomes quiet; a byte read takes it off the list (read_cb())
     * and the clock starts again after. */
    if (s->cfg->conn_timeout > 0 && !s->draining) {
        bool quiet = c->sessions == NULL && c->order_head == NULL && !c->writing && c->out.len == 0;
        if (quiet && c->wait != CONN_WAIT_QUIET)
            server_wait_add(s, c, CONN_WAIT_QUIET,
                            uv_now(&s->loop) + (uint64_t)s->cfg->conn_timeout * 1000);
        else if (!quiet && c->wait == CONN_WAIT_QUIET)
            server_wait_remove(s, c);
    }
    pending = conn_unwritten(c) + c->held_bytes;
    if (c->reading) {
        if (c->outstanding >= CONN_MAX_OUTSTANDING || pending >= CONN_MAX_PENDING_BYTES) {
            uv_read_stop((uv_stream_t *)&c->tcp);
            c->reading = false;
        }
    } else if (c->outstanding < CONN_MAX_OUTSTANDING / 2 && pending < CONN_MAX_PENDING_BYTES / 2) {
        c->reading = true;
        uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
    }
}

/* Ends the input: nothing more is read; the connection closes once every
 * request already read is answered and written. */
static void conn_end_input(conn_t *c)
{
    if (c->reading)
        uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = false;
    c->input_done = true;
    c->drain_left = 0;
}

static void write_cb(uv_write_t *req, int status)
{
    conn_t *c = container_of(req, conn_t, write_req);

    c->writing = false;
    c->wbuf.len = 0;
    if (c->wbuf.cap > CONN_MAX_PENDING_BYTES / 4) {
        proto_buf_free(&c->wbuf);
        proto_buf_init(&c->wbuf);
    }
    if (status < 0) {
        if (!c->closed)
            log_debug("connection %" PRIu64 ": write failed: %s", c->serial, uv_strerror(status));
        conn_close(c);
        return;
    }
    if (c->out.len > 0)
        server_mark_dirty(c->server, c);
    conn_update(c);
}

bool conn_hold_output(conn_t *c, uint64_t *now_ns)
{
    uint64_t hold_ns = (uint64_t)c->server->cfg->reply_hold_us * 1000u;

    if (hold_ns == 0 || c->refs <= 1 || c->closed || c->writing || c->out.len == 0 ||
        c->out.len >= CONN_HOLD_MAX_BYTES)
        return false;
    if (*now_ns == 0)
        *now_ns = uv_hrtime();
    if (c->held_since == 0)
        c->held_since = *now_ns;
    return *now_ns - c->held_since < hold_ns;
}

void conn_write(conn_t *c)
{
    proto_buf_t t;
    uv_buf_t b;
    int n, rc;

    if (c->closed || c->writing || c->out.len == 0)
        return;
    c->held_since = 0;
    metrics_count_socket_write();
    /* What the socket takes at once costs one write(); a uv_write (which
     * also arms the poller) only for the rest. */
    b = uv_buf_init(c->out.data, (unsigned)c->out.len);
    n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    if (n < 0 && n != UV_EAGAIN) {
        log_debug("connection %" PRIu64 ": write failed: %s", c->serial, uv_strerror(n));
        conn_close(c);
        return;
    }
    if (n == (int)c->out.len) {
        c->out.len = 0;
        if (c->out.cap > CONN_MAX_PENDING_BYTES / 4) { /* as write_cb() does */
            proto_buf_free(&c->out);
            proto_buf_init(&c->out);
        }
        conn_update(c);
        return;
    }
    t = c->wbuf;
    c->wbuf = c->out;
    c->out = t;
    n = n > 0 ? n : 0;
    b = uv_buf_init(c->wbuf.data + n, (unsigned)(c->wbuf.len - (size_t)n));
    rc = uv_write(&c->write_req, (uv_stream_t *)&c->tcp, &b, 1, write_cb);
    if (rc != 0) {
        log_debug("connection %" PRIu64 ": write failed: %s", c->serial, uv_strerror(rc));
        c->wbuf.len = 0;
        conn_close(c);
        return;
    }
    c->writing = true;
}

/* ---- Sessions ---- */

/* The session has nothing queued or running: it goes on the idle list if
 * it is live, or is freed if nothing can reach it any more. */
static void session_settle(session_t *sess)
{
    conn_t *c = sess->conn;
    server_t *s = c->server;

    assert(sess->running == NULL && sess->fifo_head == NULL);
    if (sess->in_map && !sess->has_slot) /* its starts failed: the id is free again */
        session_unmap(sess);
    if (!sess->in_map && !sess->has_slot)
        session_discard(sess);
    else if (sess->in_map && sess->has_slot && !sess->in_lru && !s->draining &&
             s->cfg->idle_timeout > 0)
        server_lru_add(s, sess);
}

/* Runs a finish that reached the front of its session's FIFO. */
static bool session_finish(session_t *sess, req_t *r)
{
    uint32_t released;
    slotd_error_t err;

    if (!sess->has_slot) { /* its start failed */
        slotd_error_set(&err, SLOTD_EUNKNOWN_ID, "finish: no live session '%s' on this connection",
                        r->rq.id);
        return req_fail(r, &err);
    }
    released = session_release(sess, METRICS_RELEASE_FINISH);
    r->rc = SLOTD_OK;
    if (proto_reply_finish(&r->reply, r->rq.tag, r->rq.id, released) != SLOTD_OK) {
        log_error("connection %" PRIu64 ": no memory for a reply; closing it", sess->conn->serial);
        conn_close(sess->conn);
        return false;
    }
    req_done(r);
    return true;
}

/* Starts the session's next requests until one is out with the workers
 * or the FIFO is empty. */
static void session_kick(session_t *sess)
{
    conn_t *c = sess->conn;
    req_t *r;
    slotd_error_t err;

    while (sess->running == NULL && (r = sess->fifo_head) != NULL) {
        bool ok = true;
        sess->fifo_head = r->session_next;
        if (sess->fifo_head == NULL)
            sess->fifo_tail = NULL;

        if (c->server->draining) {
            slotd_error_set(&err, SLOTD_ESHUTTING_DOWN, SERVER_SHUTTING_DOWN_MSG);
            ok = req_fail(r, &err);
        } else if (r->rq.op == PROTO_OP_FINISH) {
            ok = session_finish(sess, r);
        } else if (r->rq.op == PROTO_OP_STEP && !sess->has_slot) {
            share_give_back(sess, r);
            slotd_error_set(&err, SLOTD_EUNKNOWN_ID,
                            "step: no live session '%s' on this connection", r->rq.id);
            ok = req_fail(r, &err);
        } else if (r->rq.op == PROTO_OP_START && sess->has_slot) { /* the one before it succeeded */
            share_give_back(sess, r);
            slotd_error_set(&err, SLOTD_EDUPLICATE_ID,
                            "start: session '%s' is already live on this connection", r->rq.id);
            ok = req_fail(r, &err);
        } else {
            sess->running = r;
            req_launch(r);
        }
        if (!ok) /* the connection closed under us */
            return;
    }
    if (sess->running == NULL)
        session_settle(sess);
}

static void session_enqueue(session_t *sess, req_t *r)
{
    r->session = sess;
    r->state = REQ_WAITING;
    r->session_next = NULL;
    if (sess->fifo_tail != NULL)
        sess->fifo_tail->session_next = r;
    else
        sess->fifo_head = r;
    sess->fifo_tail = r;
    if (sess->in_lru)
        server_lru_remove(sess->conn->server, sess);
    session_kick(sess);
}

void conn_expire_session(session_t *sess)
{
    conn_t *c = sess->conn;

    log_debug("connection %" PRIu64 ": session '%s' idle for %u s, released", c->serial,
              sess->node.id, c->server->cfg->idle_timeout);
    session_unmap(sess);
    session_release(sess, METRICS_RELEASE_IDLE);
    session_discard(sess);
    conn_update(c); /* maybe quiet now */
}

/* ---- Requests as they are read ---- */

static session_t *find_session(conn_t *c, const char *id)
{
    session_map_node_t *n = session_map_find(&c->map, id);
    return n != NULL ? container_of(n, session_t, node) : NULL;
}

/* The model a start, logits or generate names (or the default one). */
static const model_t *resolve_model(conn_t *c, req_t *r, slotd_error_t *err)
{
    server_t *s = c->server;
    const model_t *m;

    if (r->rq.model[0] == '\0')
        return s->default_model;
    m = server_model(s, r->rq.model);
    if (m == NULL)
        slotd_error_set(err, SLOTD_EBAD_REQUEST, "model: '%s' is not loaded", r->rq.model);
    return m;
}

#define ROOM_DEFERRED 1 /* room_check(): `r` waits (REQ_DEFER) */

/* The capacity checks of a start or step of `entries` positions of `m`,
 * in order: the connection's share (a refusal waits while an earlier line
 * is pending, whose charge may come back), then the pool's room
 * (conn_must_wait()).  SLOTD_OK with the room `r` may take in *bytes and
 * *slots; ROOM_DEFERRED when `r` was deferred; or the code of the error
 * set in `err`. */
static int room_check(conn_t *c, req_t *r, const model_t *m, uint64_t entries, bool start,
                      bool new_session, uint64_t *bytes, uint64_t *slots, slotd_error_t *err)
{
    if (share_charge(c, NULL, m, entries, start, new_session, err) != SLOTD_OK) {
        if (!earlier_pending(c, r))
            return err->code;
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

/* Validates a start against the model, the map and the session limit, and
 * queues it on a new session record.  Returns SLOTD_OK, the code of the
 * error set in `err`, or SLOTD_ENOMEM. */
static int read_start(conn_t *c, req_t *r, slotd_error_t *err)
{
    server_t *s = c->server;
    const model_t *m = resolve_model(c, r, err);
    session_t *sess;
    uint64_t bytes, slots;
    int rc;

    if (m == NULL)
        return err->code;
    if (model_check_prompt(m, r->rq.tokens, r->rq.ntokens, err) != SLOTD_OK)
        return err->code;
    sess = find_session(c, r->rq.id);
    if (sess != NULL && sess->has_slot)
        return slotd_error_set(err, SLOTD_EDUPLICATE_ID,
                               "start: session '%s' is already live on this connection", r->rq.id);
    if (sess == NULL && s->admitted >= s->cfg->max_sessions) {
        if (earlier_pending(c, r)) { /* an earlier finish or failed start may make room */
            req_defer(c, r, false);
            return SLOTD_OK;
        }
        return slotd_error_set(err, SLOTD_ECACHE_FULL,
                               "start: the daemon holds %u sessions, its limit (--max-sessions)",
                               s->cfg->max_sessions);
    }
    rc = room_check(c, r, m, r->rq.ntokens, true, sess == NULL, &bytes, &slots, err);
    if (rc != SLOTD_OK)
        return rc == ROOM_DEFERRED ? SLOTD_OK : rc;
    r->model = m;
    r->owner_key = c->serial;
    if (sess != NULL) {
        /* The id's start has not succeeded yet: this one is decided after
         * it, duplicate_id if it succeeds, run if it fails. */
        (void)share_charge(c, sess, m, r->rq.ntokens, true, false, err); /* checked above */
        req_count_need(c, r, bytes, slots);
        session_enqueue(sess, r);
        return SLOTD_OK;
    }

    sess = server_session_get(s);
    if (sess == NULL)
        return SLOTD_ENOMEM;
    /* The id is kept once, in the owner its slot will have; the map's
     * node points at it. */
    sess->cs.owner.key = c->serial;
    memcpy(sess->cs.owner.id, r->rq.id, sizeof(sess->cs.owner.id));
    sess->node.id = sess->cs.owner.id;
    if (session_map_insert(&c->map, &sess->node) != SLOTD_OK) {
        server_session_put(s, sess);
        return SLOTD_ENOMEM;
    }
    sess->in_map = true;
    sess->born = uv_now(&s->loop);
    s->admitted++;
    (void)share_charge(c, sess, m, r->rq.ntokens, true, true, err); /* checked above */
    c->share_sessions++;
    sess->conn = c;
    sess->cs.model = m; /* for the room its steps may take, before it has a slot */
    sess->prev = NULL;
    sess->next = c->sessions;
    if (c->sessions != NULL)
        c->sessions->prev = sess;
    c->sessions = sess;

    req_count_need(c, r, bytes, slots);
    session_enqueue(sess, r);
    return SLOTD_OK;
}

/* The session's model: its slot's, or its start's while that has not run. */
static const model_t *session_model(const session_t *sess)
{
    if (sess->cs.model != NULL)
        return sess->cs.model;
    if (sess->running != NULL)
        return sess->running->model;
    return sess->fifo_head != NULL ? sess->fifo_head->model : NULL;
}

static int read_session_op(conn_t *c, req_t *r, slotd_error_t *err)
{
    session_t *sess = find_session(c, r->rq.id);

    if (sess == NULL)
        return slotd_error_set(err, SLOTD_EUNKNOWN_ID,
                               "%s: no live session '%s' on this connection",
                               proto_op_name(r->rq.op), r->rq.id);
    if (r->rq.op == PROTO_OP_FINISH) {
        /* Its room must not reach an earlier request that may not fit
         * without it. */
        if (conn_must_wait(c, r, 0, 0)) {
            req_defer(c, r, false);
            return SLOTD_OK;
        }
        session_unmap(sess); /* later lines no longer see the id */
    } else {
        const model_t *m = session_model(sess);
        uint64_t bytes, slots;
        int rc = room_check(c, r, m, r->rq.n, false, false, &bytes, &slots, err);

        if (rc != SLOTD_OK)
            return rc == ROOM_DEFERRED ? SLOTD_OK : rc;
        (void)share_charge(c, sess, m, r->rq.n, false, false, err); /* checked above */
        req_count_need(c, r, bytes, slots);
    }
    session_enqueue(sess, r);
    return SLOTD_OK;
}

static int read_stateless(conn_t *c, req_t *r, slotd_error_t *err)
{
    const model_t *m = resolve_model(c, r, err);
    int64_t steps = r->rq.op == PROTO_OP_GENERATE ? r->rq.steps : 0;
    uint64_t bytes, slots;

    if (m == NULL)
        return err->code;
    if (model_family(m) != MODEL_FAMILY_ATTN)
        return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                               "model: '%s' is a hash model; %s needs an attn model", model_name(m),
                               proto_op_name(r->rq.op));
    if (model_check_generate(m, r->rq.tokens, r->rq.ntokens, steps, err) != SLOTD_OK)
        return err->code;
    req_need(r, m, &bytes, &slots);
    if (conn_must_wait(c, r, bytes, slots)) {
        req_defer(c, r, false);
        return SLOTD_OK;
    }
    req_count_need(c, r, bytes, slots);
    r->model = m;
    req_launch(r);
    return SLOTD_OK;
}

/* Applies a parsed request, already in the order FIFO, to the
 * connection's state: the model's ranges, the session map, the session's
 * FIFO or the workers.  False if the connection had to close (no memory). */
static bool req_apply(conn_t *c, req_t *r)
{
    slotd_error_t err;
    int rc = SLOTD_OK;

    slotd_error_clear(&err);

    switch (r->rq.op) {
    case PROTO_OP_START:
        rc = read_start(c, r, &err);
        break;
    case PROTO_OP_STEP:
    case PROTO_OP_FINISH:
        rc = read_session_op(c, r, &err);
        break;
    case PROTO_OP_LOGITS:
    case PROTO_OP_GENERATE:
        rc = read_stateless(c, r, &err);
        break;
    case PROTO_OP_STATS:
        /* Answered at the head of the order FIFO; the lines after it wait
         * until then, so that it shows nothing of them. */
        r->state = REQ_WAITING;
        c->barrier = r;
        break;
    default:
        rc = slotd_error_set(&err, SLOTD_EUNKNOWN_OP, "op: not known");
        break;
    }
    if (rc == SLOTD_ENOMEM) {
        log_error("connection %" PRIu64 ": no memory for a request; closing it", c->serial);
        conn_close(c);
        return false;
    }
    return rc == SLOTD_OK || req_fail(r, &err);
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

/* An auth request: with no token set, or the right one, the connection is
 * open from now on; a wrong one is auth_failed, counted and logged (not
 * the token), and the connection closes after the reply.  False if the
 * connection had to close (no memory). */
static bool req_auth(conn_t *c, req_t *r)
{
    const server_config_t *cfg = c->server->cfg;
    struct sockaddr_storage peer;
    int plen = sizeof(peer);
    char host[64] = "?";
    slotd_error_t err;

    if (cfg->auth_token_len == 0 ||
        auth_equal(r->rq.token, r->rq.token_len, cfg->auth_token, cfg->auth_token_len)) {
        c->authed = true;
        r->rc = SLOTD_OK;
        r->reply.len = 0;
        if (proto_reply_auth(&r->reply, r->rq.tag) != SLOTD_OK) {
            conn_close(c);
            return false;
        }
        req_done(r);
        return true;
    }
    metrics_count_auth_failure();
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&peer, &plen) == 0)
        uv_ip_name((struct sockaddr *)&peer, host, sizeof(host));
    log_warn("connection %" PRIu64 " from %s: auth with a wrong token; closing it", c->serial,
             host);
    slotd_error_set(&err, SLOTD_EAUTH_FAILED, "auth: wrong token; the connection is closed");
    if (!req_fail(r, &err))
        return false;
    conn_end_input(c);
    return true;
}

/* proto_framer_feed() callback: one complete line. */
static int on_line(void *arg, const char *line, size_t len)
{
    conn_t *c = arg;
    slotd_error_t err;
    req_t *r;
    int rc;

    if (c->input_done) /* after auth_failed: the rest of this read is dropped */
        return 0;
    if ((r = server_req_get(c->server)) == NULL)
        return SLOTD_ENOMEM;
    slotd_error_clear(&err);
    r->conn = c;
    order_append(c, r);
    rc = proto_request_parse(line, len, &r->rq, &err);
    /* A line behind a barrier is counted when the barrier goes, so that a
     * stats shows nothing of the lines after it. */
    if (c->barrier == NULL)
        metrics_count_request(r->rq.op);
    else
        r->uncounted = true;
    if (r->rq.op == PROTO_OP_AUTH && rc == SLOTD_OK) {
        if (!req_auth(c, r))
            return SLOTD_ENOMEM;
    } else if (r->rq.op != PROTO_OP_AUTH && !c->authed && c->server->cfg->auth_token_len > 0) {
        slotd_error_set(&err, SLOTD_EAUTH_REQUIRED,
                        "authenticate first: {\"op\":\"auth\",\"token\":\"...\"}");
        if (!req_fail(r, &err))
            return SLOTD_ENOMEM;
    } else if (rc != SLOTD_OK) {
        if (!req_fail(r, &err))
            return SLOTD_ENOMEM;
    } else if (c->barrier != NULL) {
        r->state = REQ_HELD;
    } else if (!req_apply(c, r)) {
        return SLOTD_ENOMEM;
    }
    conn_advance(c);
    return c->closed ? SLOTD_ENOMEM : 0;
}

/* proto_framer_feed() callback in a drain: one complete line the peer had
 * sent before it, answered shutting_down (its tag echoed if it has one). */
static int on_drain_line(void *arg, const char *line, size_t len)
{
    conn_t *c = arg;
    slotd_error_t err;
    req_t *r = server_req_get(c->server);

    if (r == NULL)
        return SLOTD_ENOMEM;
    slotd_error_clear(&err);
    r->conn = c;
    order_append(c, r);
    (void)proto_request_parse(line, len, &r->rq, &err); /* for the op and the tag */
    metrics_count_request(r->rq.op);
    slotd_error_set(&err, SLOTD_ESHUTTING_DOWN, SERVER_SHUTTING_DOWN_MSG);
    if (!req_fail(r, &err))
        return SLOTD_ENOMEM;
    conn_advance(c);
    return c->closed ? SLOTD_ENOMEM : 0;
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn_t *c = container_of((uv_tcp_t *)h, conn_t, tcp);

    buf->base = c->server->readbuf;
    buf->len = sizeof(c->server->readbuf);
    if (c->drain_left > 0 && c->drain_left < buf->len)
        buf->len = c->drain_left; /* not a byte sent after the drain */
}

static void read_cb(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    conn_t *c = container_of((uv_tcp_t *)stream, conn_t, tcp);
    int rc;

    if (nread == 0)
        return;
    if (nread < 0) {
        if (nread == UV_EOF) {
            log_debug("connection %" PRIu64 ": end of input", c->serial);
            c->peer_eof = true;
            conn_end_input(c);
            conn_update(c);
        } else {
            log_debug("connection %" PRIu64 ": read failed: %s", c->serial,
                      uv_strerror((int)nread));
            conn_close(c);
        }
        return;
    }

    metrics_count_socket_read();
    if (c->wait == CONN_WAIT_QUIET)
        server_wait_remove(c->server, c); /* not quiet: conn_update() starts the clock again */
    if (c->drain_left > 0) {
        rc = proto_framer_feed(&c->framer, buf->base, (size_t)nread, on_drain_line, c);
        if (c->closed)
            return;
        c->drain_left -= (size_t)nread < c->drain_left ? (size_t)nread : c->drain_left;
        if (c->drain_left == 0 && rc == SLOTD_OK)
            conn_end_input(c);
    } else {
        rc = proto_framer_feed(&c->framer, buf->base, (size_t)nread, on_line, c);
    }
    if (c->closed)
        return;
    if (rc == SLOTD_ELINE_TOO_LONG) {
        req_t *r = server_req_get(c->server);
        log_debug("connection %" PRIu64 ": line longer than %zu bytes", c->serial,
                  c->framer.max_line);
        if (r == NULL) {
            conn_close(c);
            return;
        }
        r->conn = c;
        order_append(c, r);
        if (c->barrier == NULL) /* as on_line() counts */
            metrics_count_request(PROTO_OP_NONE);
        else
            r->uncounted = true;
        if (req_set_error(r, SLOTD_ELINE_TOO_LONG, "line longer than %zu bytes",
                          c->framer.max_line) != SLOTD_OK) {
            conn_close(c);
            return;
        }
        req_done(r);
        c->line_too_long = true;
        conn_end_input(c);
        conn_advance(c);
    } else if (rc != SLOTD_OK) {
        log_error("connection %" PRIu64 ": no memory for a request; closing it", c->serial);
        conn_close(c);
        return;
    }
    conn_update(c);
}

/* ---- Jobs coming back ---- */

void conn_job_done(req_t *r)
{
    conn_t *c = r->conn;
    server_t *s = c->server;
    session_t *sess = r->session;

    if (!c->closed)
        c->reserved -= r->reply_bound;
    if (r->chain_next != NULL && r->rc != SLOTD_OK)
        chain_return(r);
    /* Refused for room while an earlier line has yet to take effect, which
     * may make room: not answered, but run again once they all have. */
    if (r->rc == SLOTD_ECACHE_FULL && !c->closed && !s->draining && earlier_pending(c, r)) {
        if (sess != NULL && r->rq.op == PROTO_OP_STEP) {
            /* The step may have moved the audit's recording (realloc) before
             * the pool refused it: the session keeps what the job left. */
            sess->cs = r->cs;
            sess->toks = r->toks;
        }
        req_defer(c, r, true);
        conn_update(c);
        conn_unref(c);
        return;
    }
    /* The session takes the result first; it keeps `running` until the
     * end, so that a close here leaves it for the code below. */
    if (sess != NULL) {
        assert(sess->running == r);
        if (r->rq.op == PROTO_OP_START && r->rc == SLOTD_OK) {
            sess->cs = r->cs;
            sess->toks = r->toks;
            sess->has_slot = true;
            s->live_sessions++;
        } else if (r->rq.op == PROTO_OP_START) {
            /* No trace: the steps and finish queued behind it get
             * unknown_id, a start queued behind it runs, and with nothing
             * queued the id is free again (session_settle()). */
            share_give_back(sess, r);
        } else {
            sess->cs = r->cs; /* a failed step left it as it was */
            sess->toks = r->toks;
            if (r->rc != SLOTD_OK)
                share_give_back(sess, r);
        }
    }
    if (!c->closed && (r->rc == SLOTD_ENOMEM || r->rc == SLOTD_ESTALE || r->rc == SLOTD_EINVAL)) {
        log_error("connection %" PRIu64 ": %s failed: %s; closing it", c->serial,
                  proto_op_name(r->rq.op), slotd_strerror(r->rc));
        conn_close(c);
    }
    if (sess != NULL)
        sess->running = r->chain_next; /* a chain's next step runs on */
    r->chain_next = NULL;

    if (c->closed) {
        if (sess != NULL && sess->running == NULL)
            session_discard(sess); /* conn_close() unmapped it */
        server_req_put(s, r);
    } else {
        req_done(r);
        if (sess != NULL && sess->running == NULL)
            session_kick(sess);
        conn_advance(c);
        conn_update(c);
    }
    conn_unref(c);
}

/* ---- Accept, drain ---- */

void conn_turn_away(int fd, const char *why)
{
    char line[200];
    int n = snprintf(line, sizeof(line),
                     "{\"error\":{\"code\":\"too_many_connections\",\"message\":\"%s\"}}\n", why);

    /* Best effort: the socket is fresh, its buffer empty.  What the client
     * already sent is read and dropped before the close (up to 64 KiB,
     * without waiting): closing with input unread would send a reset, and
     * the reset could destroy the line before the client reads it. */
    if (n > 0 && (size_t)n < sizeof(line) && write(fd, line, (size_t)n) < 0)
        log_debug("turning a connection away: %s", strerror(errno));
    else
        metrics_count_error(SLOTD_ETOO_MANY_CONNECTIONS); /* an error reply sent */
    shutdown(fd, SHUT_WR);
    for (int i = 0; i < 16; i++) {
        char sink[4096];
        if (recv(fd, sink, sizeof(sink), MSG_DONTWAIT) <= 0)
            break;
    }
    close(fd);
}

void conn_accept(server_t *s, int fd)
{
    char why[120];
    conn_t *c;
    int rc;

    /* Lingering sockets count: each holds a descriptor until it ends. */
    if (s->nsockets >= s->cfg->max_connections) {
        metrics_count_refused();
        snprintf(why, sizeof(why), "the daemon serves at most %u connections",
                 s->cfg->max_connections);
        conn_turn_away(fd, why);
        log_debug("connection turned away: %u open", s->cfg->max_connections);
        return;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL || session_map_init(&c->map) != SLOTD_OK) {
        free(c);
        log_error("no memory for a connection; turning it away");
        conn_turn_away(fd, "the daemon is out of memory");
        return;
    }
    uv_tcp_init(&s->loop, &c->tcp);
    c->server = s;
    c->refs = 1;
    c->serial = ++s->next_serial;
    worker_flow_init(&c->flow);
    proto_framer_init(&c->framer, s->cfg->max_line);
    proto_buf_init(&c->out);
    proto_buf_init(&c->wbuf);
    c->next = s->conns;
    if (s->conns != NULL)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    s->nconns_alive++;
    s->nsockets++;

    rc = uv_tcp_open(&c->tcp, (uv_os_sock_t)fd);
    if (rc != 0)
        close(fd); /* the handle did not take it */
    else
        rc = uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
    if (rc != 0) {
        log_debug("accept failed: %s", uv_strerror(rc));
        conn_close(c);
        return;
    }
    c->reading = true;
    uv_tcp_nodelay(&c->tcp, 1);
    if (log_enabled(LOG_LEVEL_DEBUG)) {
        struct sockaddr_storage peer;
        int len = sizeof(peer);
        char host[64] = "?";
        if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&peer, &len) == 0)
            uv_ip_name((struct sockaddr *)&peer, host, sizeof(host));
        log_debug("connection %" PRIu64 ": accepted from %s", c->serial, host);
    }
    conn_update(c); /* quiet from the start */
}

void conn_expire_quiet(conn_t *c)
{
    log_debug("connection %" PRIu64 ": quiet for %u s with nothing to do; closing it", c->serial,
              c->server->cfg->conn_timeout);
    metrics_count_conn_timeout();
    conn_close(c);
}

/* A drain ends the input, but not before every complete line the peer
 * had sent by then is answered: what the socket holds at this moment is
 * still read, by read_cb() under the usual bounds (so only as fast as the
 * client reads its answers), and not a byte more (alloc_cb()); each line
 * in it is answered shutting_down.  What the peer sends after the drain
 * began is discarded by the lingering close. */
static void conn_drain_input(conn_t *c)
{
    uv_os_fd_t fd;
    int unread = 0;

    if (!c->input_done && uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0 &&
        ioctl(fd, FIONREAD, &unread) == 0 && unread > 0)
        c->drain_left = (size_t)unread;
    else
        conn_end_input(c);
}

void conn_drain(conn_t *c)
{
    session_t *sess;
    slotd_error_t err;

    if (c->closed)
        return;
    conn_drain_input(c);
    slotd_error_set(&err, SLOTD_ESHUTTING_DOWN, SERVER_SHUTTING_DOWN_MSG);
    for (req_t *r = c->order_head; r != NULL; r = r->order_next) {
        if (r->state != REQ_HELD && r->state != REQ_DEFER)
            continue;
        if (r->session != NULL && r->session->running == r)
            r->session->running = NULL; /* deferred after its job ran: not out */
        if (!req_fail(r, &err))
            return;
    }
    while (c->park_head != NULL) { /* never submitted */
        req_t *r = c->park_head;
        c->park_head = r->park_next;
        r->park_next = NULL;
        if (r->session != NULL && r->session->running == r)
            r->session->running = NULL;
        if (!req_fail(r, &err))
            return;
    }
    c->park_tail = NULL;
    for (sess = c->sessions; sess != NULL; sess = sess->next) {
        req_t *r;
        while ((r = sess->fifo_head) != NULL) {
            sess->fifo_head = r->session_next;
            if (!req_fail(r, &err))
                return;
        }
        sess->fifo_tail = NULL;
        if (sess->in_lru)
            server_lru_remove(c->server, sess);
    }
    conn_advance(c);
    conn_update(c);
}
