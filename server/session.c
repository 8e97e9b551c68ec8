/*
 * session.c: session records and their lifetimes.  It owns the free list
 * of records; a record from its start's parse until its last request has
 * run and its slot is released: its FIFO of requests run one at a time
 * (session__kick()), a finish run at the FIFO's head, the release of its
 * slot (finish, idle, the connection's close), its place in its
 * connection's map and its charge against the connection's share of the
 * pool; and the idle list of sessions with its timer (--idle-timeout).
 * It also drops a closing connection's requests and sessions
 * (session__detach(), called through conn_hooks_t).
 *
 * DESIGN.  Loop thread only; no lock.  While a session's request is out
 * with the workers (`running`), the record stays even if its connection
 * closes: dispatch.c discards it when the job comes back.
 *
 * Design: docs/design.md, "How long a slot lives", "Pipelining" and
 * "server/ layout".
 */
#include "session_int.h"

#include <assert.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "conn_int.h"
#include "evict_int.h"
#include "inspect_int.h"
#include "launch_int.h"
#include "server/base/log.h"
#include "req_int.h"

/* Records kept for reuse at most; beyond, they go back to malloc. */
#define MAX_FREE_SESSIONS 16384

/* ---- Free list ---- */

session_t *session__get(server_t *s)
{
    session_t *sess = s->free_sessions;

    if (sess == NULL)
        return calloc(1, sizeof(*sess));
    s->free_sessions = sess->next;
    s->nfree_sessions--;
    if (s->nfree_sessions < s->low_free_sessions)
        s->low_free_sessions = s->nfree_sessions;
    memset(sess, 0, sizeof(*sess));
    return sess;
}

void session__put(server_t *s, session_t *sess)
{
    audit_tokens_free(&sess->toks); /* released with its slot already, but never leaked */
    if (s->nfree_sessions >= MAX_FREE_SESSIONS) {
        free(sess);
        return;
    }
    sess->next = s->free_sessions;
    s->free_sessions = sess;
    s->nfree_sessions++;
}

void session__shed(server_t *s, size_t n)
{
    for (; n > 0 && s->free_sessions != NULL; n--) {
        session_t *sess = s->free_sessions;
        s->free_sessions = sess->next;
        s->nfree_sessions--;
        free(sess);
    }
    s->low_free_sessions = s->nfree_sessions;
}

/* ---- Idle sessions ---- */

static void idle_timer_cb(uv_timer_t *h);
static void session_expire(session_t *sess);

static void idle_timer_arm(server_t *s)
{
    uint64_t timeout = (uint64_t)s->cfg->idle_timeout * 1000;
    uint64_t now = uv_now(&s->loop);
    session_t *oldest = TAILQ_FIRST(&s->lru);
    uint64_t due;

    if (oldest == NULL || timeout == 0) /* the list is evict.c's alone (--idle-timeout 0) */
        return;
    due = oldest->idle_since + timeout;
    uv_timer_start(&s->idle_timer, idle_timer_cb, due > now ? due - now : 0, 0);
}

static void lru_add(server_t *s, session_t *sess)
{
    bool first = TAILQ_EMPTY(&s->lru);

    assert(!sess->in_lru);
    sess->idle_since = uv_now(&s->loop);
    sess->in_lru = true;
    TAILQ_INSERT_TAIL(&s->lru, sess, lru);
    /* While the list holds a session the timer is armed (idle_timer_cb()
     * arms it again for the oldest; only a drain stops it, and a drain
     * adds none): only the first may find it stopped. */
    if (first && !uv_is_active((uv_handle_t *)&s->idle_timer))
        idle_timer_arm(s);
}

void session__lru_remove(server_t *s, session_t *sess)
{
    assert(sess->in_lru);
    TAILQ_REMOVE(&s->lru, sess, lru);
    sess->in_lru = false;
}

static void idle_timer_cb(uv_timer_t *h)
{
    server_t *s = container_of(h, server_t, idle_timer);
    uint64_t timeout = (uint64_t)s->cfg->idle_timeout * 1000;
    uint64_t now = uv_now(&s->loop);
    session_t *sess;

    while ((sess = TAILQ_FIRST(&s->lru)) != NULL && sess->idle_since + timeout <= now)
        session_expire(sess);
    idle_timer_arm(s);
}

/* ---- Slots, the map and the connection's share ---- */

/* Gives the session's slot back to the pool, counted under `why`; the
 * entries it held, or 0 if it held no slot. */
static uint32_t session_release(session_t *sess, metrics_release_t why)
{
    server_t *s = sess->conn->server;
    uint32_t released = 0;

    if (!sess->has_slot)
        return 0;
    if (sess->evicted) { /* its slot went already: it held its entries outside the pool */
        released = sess->cs.entries;
        evict__forget(sess);
    } else if (cache_session_finish(s->pool, &sess->cs, &released) != SLOTD_OK) {
        log_error("session '%s': release failed (stale handle)", sess->node.id);
    } else if (s->room_head != NULL) {
        evict__room_freed(s); /* requests wait for room (evict.c) */
    }
    sess->has_slot = false;
    audit_tokens_free(&sess->toks);
    s->live_sessions--;
    metrics_count_release(why);
    if (sess->conn->tenant != NULL && (unsigned)why < 4)
        sess->conn->tenant->released[why]++;
    return released;
}

/* Releases the session's slot (if it holds one) for the reason its
 * connection closed, and frees the record.  It must have no job out. */
void session__discard(session_t *sess)
{
    conn_t *c = sess->conn;
    server_t *s = c->server;

    assert(sess->running == NULL && !sess->in_map && !sess->in_lru);
    inspect__session_gone(sess);
    session_release(sess, c->release_reason);
    if (sess->prev != NULL)
        sess->prev->next = sess->next;
    else
        c->sessions = sess->next;
    if (sess->next != NULL)
        sess->next->prev = sess->prev;
    session__put(s, sess);
}

void session__unmap(session_t *sess)
{
    server_t *s = sess->conn->server;

    if (sess->in_lru)
        session__lru_remove(s, sess);
    if (sess->in_map) {
        session_map_remove(&sess->conn->map, &sess->node);
        sess->in_map = false;
        s->admitted--;
        sess->conn->share_sessions--;
        sess->conn->share_bytes -= sess->charged;
        tenancy__charge(sess->conn, -(int64_t)sess->charged, -1);
        sess->charged = 0;
    }
}

/* One connection's share of the pool (--max-connection-share,
 * --max-sessions-per-connection), in the bytes the pool counts for the
 * slots: charged when a start or step is read, with what it adds to the
 * chain its session's charged requests build, so that a client that
 * pipelines cannot pass its share before its requests have run.  A
 * request that fails leaves its charge until its session settles, which
 * makes the charge what the slot holds (share_resync()): until then the
 * share counts at most what it may come to, and a refusal is answered
 * only once every earlier line has settled (dispatch.c). */
void session__grow_start(const model_t *m, uint32_t n, session_grow_t *g)
{
    uint32_t cap;

    g->bytes = cache_pool_slot_bytes(m, 0);
    g->entries = n;
    g->room = 0;
    g->blocks = 0;
    while (g->room < n) {
        g->bytes += cache_pool_block_bytes(m, g->blocks++, &cap);
        g->room += cap;
    }
}

int session__share_check_full(conn_t *c, const req_t *r, const session_t *sess,
                              const session_grow_t *g, bool new_session, slotd_error_t *err)
{
    const server_config_t *cfg = c->server->cfg;
    const char *op = proto_op_name(r->rq.op);
    tenant_t *t = c->tenant;
    uint64_t cap, whole;

    if (new_session && t != NULL && t->max_sessions > 0 && t->sessions >= t->max_sessions)
        return slotd_error_set(err, SLOTD_ECACHE_FULL,
                               "%s: tenant '%s' holds its %" PRIu32
                               " sessions (sessions= in the tenants file); retry after it "
                               "finishes one",
                               op, t->name, t->max_sessions);
    if (!tenancy__bytes_fit(c, g->bytes)) {
        uint64_t tcap = tenancy__share_cap(t, cfg->cache_mb);
        if (g->bytes > tcap)
            return slotd_error_set(err, SLOTD_ECACHE_FULL,
                                   "%s: '%s' needs %" PRIu64
                                   " bytes, more than tenant '%s''s whole share of the pool, "
                                   "%" PRIu64 " (share= in the tenants file): it can never fit",
                                   op, r->rq.id, g->bytes, t->name, tcap);
        return slotd_error_set(err, SLOTD_ECACHE_FULL,
                               "%s: tenant '%s''s share of the pool is in use: '%s' needs %" PRIu64
                               " more bytes, %" PRIu64 " of its %" PRIu64
                               " are free (share= in the tenants file); retry after it finishes "
                               "sessions",
                               op, t->name, r->rq.id, g->bytes,
                               t->pool_bytes < tcap ? tcap - t->pool_bytes : 0, tcap);
    }
    if (new_session) {
        uint64_t most = (uint64_t)((double)cfg->max_sessions * cfg->max_conn_share);
        if (most > cfg->max_sessions_per_conn)
            most = cfg->max_sessions_per_conn;
        if (c->share_sessions >= (most > 0 ? most : 1))
            return slotd_error_set(err, SLOTD_ECACHE_FULL,
                                   "%s: this connection's share of sessions is in use: it "
                                   "holds %u (--max-sessions-per-connection, "
                                   "--max-connection-share); retry after it finishes one",
                                   op, c->share_sessions);
    }
    /* A share of the whole pool is no limit of its own: the pool refuses,
     * and says so, when the bytes run out. */
    if (cfg->max_conn_share >= 1.0 || c->share_bytes + g->bytes <= session__share_cap(c))
        return SLOTD_OK;
    cap = session__share_cap(c);
    whole = (sess != NULL && req__on_slot(r) ? sess->charged : 0) + g->bytes;
    if (whole > cap)
        return slotd_error_set(err, SLOTD_ECACHE_FULL,
                               "%s: '%s' needs %" PRIu64 " bytes, more than this connection's "
                               "whole share of the pool, %" PRIu64
                               " (--max-connection-share): it can never fit",
                               op, r->rq.id, whole, cap);
    return slotd_error_set(err, SLOTD_ECACHE_FULL,
                           "%s: this connection's share of the pool is in use: '%s' needs %" PRIu64
                           " more bytes, %" PRIu64 " of its %" PRIu64
                           " are free (--max-connection-share); retry after it finishes sessions",
                           op, r->rq.id, g->bytes, c->share_bytes < cap ? cap - c->share_bytes : 0,
                           cap);
}

/* Makes the charge of a settled session, one of whose requests failed,
 * what its slot holds. */
static void share_resync(session_t *sess)
{
    conn_t *c = sess->conn;
    session_grow_t g;

    if (sess->evicted) /* it holds nothing until it is rebuilt */
        memset(&g, 0, sizeof(g));
    else
        session__grow_start(sess->cs.model, sess->cs.entries, &g);
    c->share_bytes = c->share_bytes - sess->charged + g.bytes;
    tenancy__charge(c, (int64_t)g.bytes - (int64_t)sess->charged, 0);
    sess->charged = g.bytes;
    sess->share_entries = g.entries;
    sess->share_room = g.room;
    sess->share_blocks = g.blocks;
    sess->share_stale = false;
}

/* ---- A connection's close ---- */

/* conn_hooks_t.detach: a closing connection's requests and sessions.
 * Drops every request not yet started, releases every session with no job
 * out (the others when their job comes back, dispatch.c). */
void session__detach(conn_t *c)
{
    server_t *s = c->server;
    req_t *r, *rnext;
    session_t *sess, *snext;

    inspect__conn_gone(c);
    for (r = c->order_head; r != NULL; r = rnext) {
        rnext = r->order_next;
        if (r->uncounted) /* read behind a barrier that never lifted */
            metrics_count_request(r->rq.op);
        if (r->state == REQ_RUNNING) {
            atomic_store_explicit(&r->canceled, true, memory_order_relaxed);
            continue;
        }
        if (r->state == REQ_ROOM)
            evict__unwait(s, r);
        if ((r->state == REQ_PARKED || r->state == REQ_DEFER || r->state == REQ_WAITING) &&
            r->session != NULL && r->session->running == r)
            r->session->running = NULL; /* not out */
        req__put(s, r);
    }
    c->order_head = c->order_tail = NULL;
    c->barrier = NULL;
    c->outstanding = 0;

    for (sess = c->sessions; sess != NULL; sess = snext) {
        snext = sess->next;
        sess->fifo_head = sess->fifo_tail = NULL;
        session__unmap(sess);
        if (sess->running == NULL && sess->forks_out == 0) /* else when they come back */
            session__discard(sess);
    }
}

/* ---- The session's FIFO ---- */

void session__settle(session_t *sess)
{
    server_t *s = sess->conn->server;

    assert(sess->running == NULL && sess->fifo_head == NULL);
    if (sess->in_map && sess->has_slot) { /* live: after most steps */
        if (sess->share_stale)
            share_resync(sess);
        if (!sess->in_lru && !s->draining &&
            (s->cfg->idle_timeout > 0 || s->cfg->on_full == CONFIG_ON_FULL_EVICT) &&
            sess->forks_out == 0) {
            lru_add(s, sess);
            if (s->room_head != NULL && s->cfg->on_full == CONFIG_ON_FULL_EVICT)
                evict__room_freed(s); /* a victim now, for a request waiting for room */
        }
        return;
    }
    if (sess->in_map) /* its starts failed: the id is free again */
        session__unmap(sess);
    if (!sess->has_slot)
        session__discard(sess);
}

/* Runs a finish that reached the front of its session's FIFO. */
static bool session_finish(session_t *sess, req_t *r)
{
    uint32_t released;
    slotd_error_t err;

    if (!sess->has_slot) { /* its start failed */
        slotd_error_set(&err, SLOTD_EUNKNOWN_ID, "finish: no live session '%s' on this connection",
                        r->rq.id);
        return req__fail(r, &err);
    }
    released = session_release(sess, METRICS_RELEASE_FINISH);
    r->rc = SLOTD_OK;
    if (proto_reply_finish(&r->reply, r->rq.tag, r->rq.id, released) != SLOTD_OK) {
        log_error("connection %" PRIu64 ": no memory for a reply; closing it", sess->conn->serial);
        conn__close(sess->conn);
        return false;
    }
    req__done(r);
    return true;
}

/* Answers `r`, taken from the head of the session's FIFO, which does not
 * run as a job: a drain, a finish, a step or append with no live session, a start
 * of an id already live.  False if the connection closed (no memory).  Out
 * of line: session__run_fifo() stays small for the jobs, most requests. */
static __attribute__((noinline)) bool session_answer(session_t *sess, req_t *r)
{
    slotd_error_t err;

    if (sess->conn->server->draining) {
        slotd_error_set(&err, SLOTD_ESHUTTING_DOWN, SERVER_SHUTTING_DOWN_MSG);
        return req__fail(r, &err);
    }
    if (r->rq.op == PROTO_OP_FINISH)
        return session_finish(sess, r);
    session__give_back(sess);
    if (req__on_slot(r)) { /* its start failed */
        slotd_error_set(&err, SLOTD_EUNKNOWN_ID, "%s: no live session '%s' on this connection",
                        proto_op_name(r->rq.op), r->rq.id);
    } else { /* a start: the one before it succeeded */
        assert(r->rq.op == PROTO_OP_START && sess->has_slot);
        slotd_error_set(&err, SLOTD_EDUPLICATE_ID,
                        "start: session '%s' is already live on this connection", r->rq.id);
    }
    return req__fail(r, &err);
}

/* Starts the session's next requests until one is out with the workers
 * or the FIFO is empty. */
void session__run_fifo(session_t *sess)
{
    req_t *r;

    while (sess->running == NULL && (r = sess->fifo_head) != NULL) {
        sess->fifo_head = r->session_next;
        if (sess->fifo_head == NULL)
            sess->fifo_tail = NULL;
        if (session__runs(sess, r)) {
            sess->running = r;
            launch__req(r);
        } else if (!session_answer(sess, r)) {
            return; /* the connection closed under us */
        }
    }
    if (sess->running == NULL)
        session__settle(sess);
}

static void session_expire(session_t *sess)
{
    conn_t *c = sess->conn;

    log_debug("connection %" PRIu64 ": session '%s' idle for %u s, released", c->serial,
              sess->node.id, c->server->cfg->idle_timeout);
    session__unmap(sess);
    session_release(sess, METRICS_RELEASE_IDLE);
    session__discard(sess);
    conn__update(c); /* maybe quiet now */
}

session_t *session__find(conn_t *c, const char id[PROTO_ID_MAX + 1])
{
    session_map_node_t *n = session_map_find_idbuf(&c->map, id);
    return n != NULL ? container_of(n, session_t, node) : NULL;
}
