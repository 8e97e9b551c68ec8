/*
 * session_int.h: session records (session.c), for the other files of
 * server/.  Loop thread only.
 */
#ifndef SLOTD_SERVER_SESSION_INT_H
#define SLOTD_SERVER_SESSION_INT_H

#include "launch_int.h"
#include "server_int.h"

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

/** session__share_charge() in full: its admission of a new session, its
 * refusals with their messages. */
int session__share_charge_full(conn_t *c, session_t *sess, const model_t *m, uint64_t entries,
                               proto_op_t op, bool new_session, slotd_error_t *err);

/** Checks a start, step or append (`op`) of `entries` positions of `m` against the
 * connection's share of the pool (--max-connection-share,
 * --max-sessions-per-connection; `new_session`: a start of an id not in
 * the map), and with `sess` charges it.  SLOTD_OK or the code of the error
 * set in `err`.  Inline for what every step asks, the bytes admitted; the
 * rest in session__share_charge_full(). */
static inline int session__share_charge(conn_t *c, session_t *sess, const model_t *m,
                                        uint64_t entries, proto_op_t op, bool new_session,
                                        slotd_error_t *err)
{
    const bool start = op == PROTO_OP_START || op == PROTO_OP_FORK; /* the state too */
    const server_config_t *cfg = c->server->cfg;
    uint64_t need;

    if (new_session || m == NULL)
        return session__share_charge_full(c, sess, m, entries, op, new_session, err);
    need = entries * model_entry_size(m) + (start ? model_state_size(m) : 0);
    if (cfg->max_conn_share < 1.0 && c->share_bytes + need > session__share_cap(c))
        return session__share_charge_full(c, sess, m, entries, op, new_session, err);
    if (sess != NULL) {
        sess->charged += need;
        c->share_bytes += need;
    }
    return SLOTD_OK;
}
/** Charges `sess` with what a step of `entries` positions of `m`, which
 * session__share_charge() has admitted, adds to its connection's share.
 * Inline: every step does it. */
static inline void session__share_add(conn_t *c, session_t *sess, const model_t *m,
                                      uint64_t entries)
{
    uint64_t need = m == NULL ? 0 : entries * model_entry_size(m);

    sess->charged += need;
    c->share_bytes += need;
}
/** Gives back what `r` (a start or step of `sess`, which failed or never
 * ran) had charged to its connection's share. */
void session__give_back(session_t *sess, const req_t *r);

/** conn_hooks_t.detach: drops the requests of a closing connection not
 * yet started and releases its sessions with no job out. */
void session__detach(conn_t *c);

#endif
