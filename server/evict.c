/*
 * evict.c: what a request does when the pool has no room for it
 * (--on-full refuse|wait|evict, docs/design.md "When the pool is full").
 *
 * It owns the wait list (server->room_head, REQ_ROOM requests) and its
 * timer (server->room_timer), the choice of the sessions to evict, the
 * eviction itself (a session's slot goes back to the pool while the
 * session stays live, with its id, its entries count and its recorded
 * tokens: session_t.evicted), and the counters of both (server->
 * evicted_sessions, evictions_total, evicted_token_bytes; the rebuild
 * counters below).  The rebuild of an evicted session, a prefill of its
 * recorded tokens before its next request runs, is the worker's (job.c,
 * rebuild_slot()); dispatch.c calls evict__on_full() for a refusal and
 * evict__job_back() for every job back; session.c evict__room_freed()
 * and evict__forget() as a slot is released.
 *
 * Victims: live sessions on the idle list (server->lru: no request of
 * theirs running, queued or gathered in a batch, no fork reading them),
 * not evicted already, not the session of the request that needs the
 * room, of an open connection.  First those of connections holding more
 * than a fair share of the pool's bytes (total over open connections),
 * least recently used first, then the others least recently used first;
 * with none to evict, it waits as under wait (below) for the sessions
 * whose requests are out to come back idle, up to --full-wait-ms;
 * a connection over its fair share never takes from one at or under its
 * own fair share.  A session runs its request right after its rebuild,
 * in the same job, and goes to the idle list's tail only when that is
 * back: rebuilt work always gets used before the session can go again.
 *
 * DESIGN.  Loop thread only, no lock; but the rebuild counters, which the
 * workers add to (relaxed atomics).  Memory: none of its own; a waiting
 * request stays its connection's (req__put() frees it), the wait list
 * only links it (room_prev, room_next), and detach and drain take it off
 * (evict__unwait()) before they answer or free it.
 */
#include "evict_int.h"

#include <assert.h>
#include <inttypes.h>

#include "launch_int.h"
#include "server/base/log.h"
#include "session_int.h"

/* A request refused while the pool's counts say it fits (the room went to
 * a concurrent request) runs again at most this many times with nothing
 * evicted for it. */
#define ROOM_TRIES_MAX 8

static void room_timer_cb(uv_timer_t *h);

void evict__init(server_t *s)
{
    s->room_head = s->room_tail = NULL;
    uv_timer_init(&s->loop, &s->room_timer);
}

uv_handle_t *evict__timer(server_t *s)
{
    return (uv_handle_t *)&s->room_timer;
}

/* ---- Evicting ---- */

/* The pool bytes `r` needs to run: its whole slot if it opens one or its
 * session is evicted (the rebuild), else what its positions add. */
static uint64_t room_need(const req_t *r, uint64_t *slots)
{
    const session_t *sess = r->session;
    const model_t *m;
    uint64_t pos = 0; /* every case sets it or returns (gcc -O2 cannot tell) */

    *slots = 1;
    switch (r->rq.op) {
    case PROTO_OP_STEP:
    case PROTO_OP_APPEND:
        m = sess->cs.model;
        pos = (uint64_t)sess->cs.entries + req__adds(r);
        if (pos > model_max_ctx(m))
            pos = model_max_ctx(m);
        if (sess->evicted)
            return cache_pool_slot_bytes(m, (uint32_t)pos);
        *slots = 0;
        return cache_pool_slot_bytes(m, (uint32_t)pos) - cache_pool_slot_bytes(m, sess->cs.entries);
    case PROTO_OP_FORK:
        return cache_pool_slot_bytes(r->from_cs.model, r->from_cs.entries);
    case PROTO_OP_GENERATE:
        pos = r->rq.ntokens + (uint64_t)r->rq.steps;
        break;
    case PROTO_OP_START:
    case PROTO_OP_LOGITS:
        pos = r->rq.ntokens;
        break;
    case PROTO_OP_NONE:
    case PROTO_OP_FINISH:
    case PROTO_OP_STATS:
    case PROTO_OP_AUTH:
    case PROTO_OP__COUNT: /* take no room, so are never refused for it */
        *slots = 0;
        return 0;
    }
    m = r->model;
    if (pos > model_max_ctx(m))
        pos = model_max_ctx(m);
    return cache_pool_slot_bytes(m, (uint32_t)pos);
}

/* The session to evict for `r`, or NULL: see the header comment. */
static session_t *victim(server_t *s, const req_t *r)
{
    uint64_t fair = ((uint64_t)s->cfg->cache_mb << 20) / (s->nconns > 0 ? s->nconns : 1);
    bool over = r->conn->share_bytes > fair;
    session_t *v, *other = NULL;

    TAILQ_FOREACH(v, &s->lru, lru)
    {
        if (v->evicted || v == r->session || v->running != NULL || v->fifo_head != NULL ||
            v->forks_out > 0 || !v->has_slot || !v->in_map || v->conn->closed)
            continue;
        if (v->conn->share_bytes > fair)
            return v;
        if (other == NULL && (!over || v->conn == r->conn))
            other = v;
    }
    return other;
}

/* A session of r's connection that is idle but for requests read after
 * `r` and deferred behind it (REQ_DEFER: none out with the workers), or
 * NULL.  Run one at a time, those lines would not have been sent yet when
 * `r` runs, and their session would be a victim: so it is one here too,
 * or a pipelined connection could be refused where the same lines sent one
 * at a time are not (docs/design.md, "Pipelining").  The deferred request
 * copies the session's slot at its submit (launch.c), so it finds it
 * evicted and rebuilds it. */
static session_t *victim_behind(const req_t *r)
{
    for (const req_t *q = r->order_next; q != NULL; q = q->order_next) {
        session_t *v = q->session;
        if (q->state != REQ_DEFER || v == NULL || v->running != q || v == r->session ||
            v->evicted || !v->has_slot || v->forks_out > 0 || !req__on_slot(q))
            continue;
        return v;
    }
    return NULL;
}

/* Gives the slot of idle session `v` back to the pool; it stays live. */
static void evict_session(server_t *s, session_t *v)
{
    cache_session_t keep = v->cs;
    conn_t *c = v->conn;
    uint32_t released = 0;

    assert((v->in_lru || (v->running != NULL && v->running->state == REQ_DEFER)) && !v->evicted &&
           v->toks.len == v->cs.entries);
    if (cache_session_finish(s->pool, &v->cs, &released) != SLOTD_OK)
        log_error("session '%s': eviction failed (stale handle)", v->node.id);
    v->cs = keep; /* model, owner and entries; its handle is stale now, and never used */
    v->evicted = true;
    s->evicted_sessions++;
    s->evictions_total++;
    s->evicted_token_bytes += (uint64_t)v->toks.cap * sizeof(uint32_t);
    metrics_evicted_token_bytes_set(s->evicted_token_bytes);
    /* It holds nothing of its connection's share until it is rebuilt. */
    c->share_bytes -= v->charged;
    v->charged = 0;
    v->share_entries = v->share_room = v->share_blocks = 0;
    v->share_stale = true;
    metrics_count_eviction();
    log_debug("connection %" PRIu64 ": session '%s' evicted (%" PRIu32 " entries)", c->serial,
              v->node.id, released);
}

/* Evicts for `r` until the pool's counts cover what it needs or nothing
 * more can go; true if `r` is worth running again. */
static bool make_room(server_t *s, req_t *r)
{
    uint64_t slots, need = room_need(r, &slots), free_bytes, free_slots;
    unsigned evicted = 0;
    session_t *v;

    for (;;) {
        cache_pool_room(s->pool, &free_bytes, &free_slots);
        if (free_bytes >= need && free_slots >= slots)
            break;
        if ((v = victim(s, r)) == NULL && (v = victim_behind(r)) == NULL)
            break;
        evict_session(s, v);
        evicted++;
    }
    if (evicted > 0)
        return true;
    /* Nothing evicted: worth another run only if the counts say it fits. */
    return free_bytes >= need && free_slots >= slots && r->room_tries++ < ROOM_TRIES_MAX;
}

void evict__forget(session_t *sess)
{
    server_t *s = sess->conn->server;

    assert(sess->evicted && s->evicted_sessions > 0);
    sess->evicted = false;
    s->evicted_sessions--;
    s->evicted_token_bytes -= (uint64_t)sess->toks.cap * sizeof(uint32_t);
    metrics_evicted_token_bytes_set(s->evicted_token_bytes);
}

void evict__job_back(req_t *r)
{
    session_t *sess = r->session;

    /* A step or append of an evicted session whose job rebuilt it (the
     * worker clears `rebuild` once the slot is back): its recording is
     * counted as it stood while evicted. */
    if (sess != NULL && sess->evicted && req__on_slot(r) && !r->rebuild) {
        evict__forget(sess);
        log_debug("connection %" PRIu64 ": session '%s' rebuilt (%" PRIu32 " entries)",
                  r->conn->serial, sess->node.id, r->cs.entries);
    }
}

/* ---- Waiting ---- */

/* Links `r` in the wait list, which is kept in the order the waits end
 * (the order they began, as every wait is --full-wait-ms long): a request
 * that ran again and still found no room goes back to its place, near the
 * head, not behind those that began to wait after it. */
static void room_link(server_t *s, req_t *r)
{
    req_t *after = s->room_tail;

    while (after != NULL && after->room_until > r->room_until)
        after = after->room_prev;
    r->room_prev = after;
    r->room_next = after != NULL ? after->room_next : s->room_head;
    if (r->room_next != NULL)
        r->room_next->room_prev = r;
    else
        s->room_tail = r;
    if (after != NULL)
        after->room_next = r;
    else
        s->room_head = r;
}

/* A fork coming off the workers or the wait list: the session it forks,
 * which it keeps from running, evicting and release while out
 * (forks_out), is counted free of it, as dispatch__job_done() counts it;
 * run again, the fork is counted out again (launch.c). */
static void fork_back(req_t *r)
{
    if (r->fork_from != NULL) {
        assert(r->fork_from->forks_out > 0);
        r->fork_from->forks_out--;
    }
}

void evict__unwait(server_t *s, req_t *r)
{
    assert(r->state == REQ_ROOM);
    fork_back(r);
    if (r->room_prev != NULL)
        r->room_prev->room_next = r->room_next;
    else
        s->room_head = r->room_next;
    if (r->room_next != NULL)
        r->room_next->room_prev = r->room_prev;
    else
        s->room_tail = r->room_prev;
    r->room_prev = r->room_next = NULL;
    r->state = REQ_WAITING;
}

/* Arms the timer for the earliest end of a wait (0: at once). */
static void room_arm(server_t *s, uint64_t due)
{
    uint64_t now = uv_now(&s->loop);

    if (due == UINT64_MAX)
        for (req_t *r = s->room_head; r != NULL; r = r->room_next)
            if (r->room_until < due)
                due = r->room_until;
    if (due == UINT64_MAX) {
        uv_timer_stop(&s->room_timer);
        return;
    }
    uv_timer_start(&s->room_timer, room_timer_cb, due > now ? due - now : 0, 0);
}

/* Runs a refused request again, as a deferred one is (dispatch.c). */
static void rerun(req_t *r)
{
    r->rc = SLOTD_OK;
    r->reply.len = 0;
    launch__req(r);
}

/* The waiting requests whose wait is over run again, and as many of the
 * others, oldest first, as room freed since the last run (room_kicks:
 * each release or, under evict, each session gone idle, may let one
 * in): those that find no room come back to wait in their place, but
 * those whose wait is over, which are answered cache_full.  The workers'
 * flows then share the workers between their connections (the
 * scheduler). */
static void room_timer_cb(uv_timer_t *h)
{
    server_t *s = container_of(h, server_t, room_timer);
    uint64_t now = uv_now(&s->loop);
    uint32_t kicks = s->room_kicks;
    req_t *r, *next, *run = NULL, **tail = &run;

    s->room_kick = false;
    s->room_kicks = 0;
    /* Taken off first: a request run again may come back to the list. */
    for (r = s->room_head; r != NULL; r = next) {
        next = r->room_next;
        if (kicks == 0 && r->room_until > now)
            continue;
        if (r->room_until > now)
            kicks--;
        evict__unwait(s, r);
        *tail = r;
        tail = &r->room_next;
    }
    *tail = NULL;
    for (r = run; r != NULL; r = next) {
        next = r->room_next;
        r->room_next = NULL;
        rerun(r);
    }
    room_arm(s, UINT64_MAX);
}

void evict__room_freed(server_t *s)
{
    if (s->room_head == NULL)
        return;
    if (s->room_kicks < UINT32_MAX)
        s->room_kicks++;
    if (s->room_kick)
        return;
    s->room_kick = true;
    uv_timer_start(&s->room_timer, room_timer_cb, 0, 0);
}

void evict__room_done(req_t *r)
{
    server_t *s = r->conn->server;
    uint64_t began, now;

    if (r->room_until == 0)
        return;
    began = r->room_until - s->cfg->full_wait_ms;
    now = uv_now(&s->loop);
    metrics_observe_room_wait_seconds(METRICS_LOOP_SHARD,
                                      (now > began ? now - began : 0) * 1000000u);
    r->room_until = 0;
}

/* ---- A refusal ---- */

/* Puts `r` on the wait list until room frees or its wait is over: false
 * once it is over (`r` is then answered cache_full). */
static bool room_wait(server_t *s, req_t *r)
{
    uint64_t now = uv_now(&s->loop);

    if (r->room_until == 0) {
        r->room_until = now + s->cfg->full_wait_ms;
        metrics_count_room_wait();
    } else if (now >= r->room_until) {
        evict__room_done(r);
        return false;
    }
    r->state = REQ_ROOM;
    room_link(s, r);
    if (!s->room_kick)
        room_arm(s, UINT64_MAX);
    return true;
}

bool evict__on_full(req_t *r)
{
    server_t *s = r->conn->server;

    switch (s->cfg->on_full) {
    case CONFIG_ON_FULL_REFUSE:
        return false;
    case CONFIG_ON_FULL_EVICT:
        if (make_room(s, r)) {
            fork_back(r);
            rerun(r);
            return true;
        }
        /* Nothing idle to evict now: sessions with requests out become
         * victims as those come back (session__settle() calls
         * evict__room_freed()), so it waits for them as under wait. */
        return room_wait(s, r);
    case CONFIG_ON_FULL_WAIT:
        return room_wait(s, r);
    }
    return false;
}
