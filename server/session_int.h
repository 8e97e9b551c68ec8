/*
 * session_int.h: session records (session.c), for the other files of
 * server/.  Loop thread only.
 */
#ifndef SLOTD_SERVER_SESSION_INT_H
#define SLOTD_SERVER_SESSION_INT_H

#include "launch_int.h"
#include "server_int.h"
#include "tenancy_int.h"

/** A zeroed session record, or NULL (ENOMEM).  The caller owns it until
 * session__put(), or until it is linked in its connection's `sessions`:
 * then session.c frees it (session__discard()). */
session_t *session__get(server_t *s);
/** Takes a record back (unlinked, its slot released). */
void session__put(server_t *s, session_t *sess);
/** Frees `n` records of the free list (at most what it holds), and starts
 * counting its low mark again from what is left. */
void session__shed(server_t *s, size_t n);

/** The session record of `c` that the id names, or NULL.  `id` is a
 * parsed request's (rq.id: every byte initialised, past its NUL too). */
session_t *session__find(conn_t *c, const char id[PROTO_ID_MAX + 1]);
/** session__kick() with requests queued: runs them. */
void session__run_fifo(session_t *sess);
/** session__kick() with nothing queued or running: the session goes on
 * the idle list if it is live, or is freed if nothing can reach it. */
void session__settle(session_t *sess);
/** Runs the session's FIFO until a request is out with the workers or the
 * FIFO is empty; then settles the session (idle list, or freed).  Inline:
 * as a step's job comes back its session has mostly nothing queued. */
static inline void session__kick(session_t *sess)
{
    if (sess->running == NULL && sess->fifo_head == NULL)
        session__settle(sess);
    else
        session__run_fifo(sess);
}
/** Takes the session out of its connection's map and the idle list: later
 * lines no longer see its id; its share comes back. */
void session__unmap(session_t *sess);
/** Releases the session's slot (if it holds one) for the reason its
 * connection closed, and frees the record.  It must have no job out. */
void session__discard(session_t *sess);
/** Takes an idle session off the idle list. */
void session__lru_remove(server_t *s, session_t *sess);

/** Whether `r`, at the head of its session's FIFO, runs as a job: a
 * start of an id not live (yet), a step or append of a live session, no
 * drain.
 * session.c answers the others in the FIFO's order. */
static inline bool session__runs(const session_t *sess, const req_t *r)
{
    return !sess->conn->server->draining && r->rq.op != PROTO_OP_FINISH &&
           !(req__on_slot(r) && !sess->has_slot) && !(r->rq.op == PROTO_OP_START && sess->has_slot);
}

/** Queues `r` at the tail of the session's FIFO and runs the FIFO.
 * Inline: every start, step and finish is queued, and most find their
 * session idle with nothing queued: they go to launch__req() at once, as
 * session__kick() would send them. */
static inline void session__enqueue(session_t *sess, req_t *r)
{
    r->session = sess;
    r->state = REQ_WAITING;
    r->session_next = NULL;
    if (sess->in_lru)
        session__lru_remove(sess->conn->server, sess);
    if (sess->running == NULL && sess->fifo_head == NULL && session__runs(sess, r)) {
        sess->running = r;
        launch__req(r); /* which leaves it running (submitted or parked) */
        return;
    }
    if (sess->fifo_tail != NULL)
        sess->fifo_tail->session_next = r;
    else
        sess->fifo_head = r;
    sess->fifo_tail = r;
    session__kick(sess);
}

/** The connection share's bound in bytes (--max-connection-share of
 * --cache-mb), asked only when the share is less than the whole pool (so
 * that the bound plus one fits): computed once per connection. */
static inline uint64_t session__share_cap(conn_t *c)
{
    if (c->share_cap == 0) {
        const server_config_t *cfg = c->server->cfg;
        c->share_cap = (uint64_t)((double)(cfg->cache_mb << 20) * cfg->max_conn_share) + 1;
    }
    return c->share_cap - 1;
}

/** What a start or step adds to its session's part of its connection's
 * share, in the pool's bytes (cache_pool_slot_bytes()), and the chain its
 * session's charged requests then build: positions, room and blocks. */
typedef struct session_grow {
    uint64_t bytes;
    uint32_t entries, room, blocks;
} session_grow_t;

/** The growth of a start of `n` positions of `m`: its state and chain. */
void session__grow_start(const model_t *m, uint32_t n, session_grow_t *g);

/** The growth of a step of `n` of `sess` (model `m`), on the chain its
 * charged requests build; share_entries + n must be within max_ctx (a
 * step that may pass it is charged up to max_ctx, dispatch.c).  Inline:
 * most steps fit in the room of the chain's last block. */
static inline void session__grow_step(const session_t *sess, const model_t *m, uint32_t n,
                                      session_grow_t *g)
{
    g->bytes = 0;
    g->entries = sess->share_entries + n;
    g->room = sess->share_room;
    g->blocks = sess->share_blocks;
    while (g->room < g->entries) {
        uint32_t cap;
        g->bytes += cache_pool_block_bytes(m, g->blocks++, &cap);
        g->room += cap;
    }
}

/** session__share_check() past its fast path: the session count of a
 * new session and the refusals, with their messages. */
int session__share_check_full(conn_t *c, const req_t *r, const session_t *sess,
                              const session_grow_t *g, bool new_session, slotd_error_t *err);

/** Checks the growth `g` of `r` (a start or step; `sess` its session, or
 * NULL for a start) against the connection's share of the pool
 * (--max-connection-share, --max-sessions-per-connection; `new_session`: a
 * start of an id not in the map).  SLOTD_OK or the code of the cache_full
 * set in `err`, whose message says needed against available in pool bytes
 * and whether a retry can succeed.  Inline for what every step asks. */
static inline int session__share_check(conn_t *c, const req_t *r, const session_t *sess,
                                       const session_grow_t *g, bool new_session,
                                       slotd_error_t *err)
{
    if (!new_session && tenancy__bytes_fit(c, g->bytes) &&
        (c->server->cfg->max_conn_share >= 1.0 ||
         c->share_bytes + g->bytes <= session__share_cap(c)))
        return SLOTD_OK;
    return session__share_check_full(c, r, sess, g, new_session, err);
}

/** Charges `sess` with the growth `g` of a start or step that
 * session__share_check() admitted.  A start on a record whose earlier
 * start is still pending adds its bytes alone (one of the two will be
 * refused).  Inline: every step does it. */
static inline void session__share_take(conn_t *c, session_t *sess, const session_grow_t *g,
                                       bool restart)
{
    sess->charged += g->bytes;
    c->share_bytes += g->bytes;
    tenancy__charge(c, (int64_t)g->bytes, 0);
    if (restart) {
        sess->share_stale = true;
        return;
    }
    sess->share_entries = g->entries;
    sess->share_room = g->room;
    sess->share_blocks = g->blocks;
}

/** A start or step of `sess` failed or never ran: what it charged to its
 * connection's share comes back when the session settles (its charge is
 * then made exactly what its slot holds). */
static inline void session__give_back(session_t *sess)
{
    sess->share_stale = true;
}

/** conn_hooks_t.detach: drops the requests of a closing connection not
 * yet started and releases its sessions with no job out. */
void session__detach(conn_t *c);

/** The session's model: its slot's, or, while its start has not run, that
 * start's (running or first in its FIFO); NULL if it has none yet. */
static inline const model_t *session__model(const session_t *sess)
{
    if (sess->cs.model != NULL)
        return sess->cs.model;
    if (sess->running != NULL)
        return sess->running->model;
    return sess->fifo_head != NULL ? sess->fifo_head->model : NULL;
}

#endif
