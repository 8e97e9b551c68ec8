/*
 * conn_int.h: a session connection's socket (conn.c), for the other files
 * of server/.  Loop thread only.
 *
 * The connection's bounds are conn.c's fields: the reply bytes held in its
 * order FIFO (held_bytes), the reply bounds of its jobs out (reserved), the
 * pool room its pending lines may take (pending_bytes, pending_slots) and
 * its parked jobs (park_head, park_tail).  The other files change them only
 * through the functions below (the counters' are inline here, so that the
 * hot path pays no call); scripts/writers.sh checks it.
 */
#ifndef SLOTD_SERVER_CONN_INT_H
#define SLOTD_SERVER_CONN_INT_H

#include "server_int.h"

/** Serves the connection accepted on descriptor `fd` (non-blocking), or
 * turns it away when the connection limit is reached.  Takes ownership
 * of `fd`; the struct is freed by conn.c once closed and no job is out. */
void conn__accept(server_t *s, int fd);
/** Writes one too_many_connections line saying `why` to the fresh socket
 * `fd` (best effort) and closes it. */
void conn__turn_away(int fd, const char *why);

/** Closes at once: `c` no longer serves (conn_hooks_t.detach drops its
 * requests and sessions), then its handle.  Idempotent. */
void conn__close(conn_t *c);
/** After any progress: closes a connection whose input is over once all
 * is answered and written; otherwise runs its parked jobs and stops or
 * resumes reading by the bounds, and keeps its place on the quiet list. */
void conn__update(conn_t *c);
/** Ends the input: nothing more is read; the connection closes once every
 * request already read is answered and written. */
void conn__end_input(conn_t *c);
/** Drops one reference of a job that came back (or of the handle); frees
 * the struct at the last. */
void conn__unref(conn_t *c);
/** A drain: reads what the socket holds now and not a byte more (its
 * lines are answered shutting_down), or ends the input if it holds none. */
void conn__drain_input(conn_t *c);

/** Has `c` written at the end of this loop turn. */
void conn__mark_dirty(server_t *s, conn_t *c);
/** Whether the end of this loop turn should leave `c`'s new output for a
 * later turn rather than write it: true while more of its jobs are out
 * (their replies would follow in a write of their own), since less than
 * --reply-hold-us ago and below CONN_HOLD_MAX_BYTES, so that a pipelining
 * client's replies leave together.  *now_ns is the turn's uv_hrtime(), 0
 * until someone needs it: read here only for a connection that may be
 * held, so a turn with none reads no clock.  The caller keeps `c` dirty,
 * and makes sure of another turn within the time left. */
bool conn__hold_output(conn_t *c, uint64_t *now_ns);
/** Starts the write of whatever `c` has accumulated. */
void conn__write(conn_t *c);

/** Ends the lingering close of `c` now, if it is lingering: its socket is
 * closed with its input unread.  For a connection that never
 * authenticated, whose place a new connection takes (handshake.c). */
void conn__linger_cut(conn_t *c);
/** Takes `c` off its timed list, if it is on one. */
void conn__wait_remove(server_t *s, conn_t *c);
/** A drain began: no lingering close may outlast it (the ones that begin
 * later are capped the same way). */
void conn__linger_cap(server_t *s);

/* ---- The bounds ---- */

/** Reply bytes `c` has not written yet: in `out` and in the write in
 * flight. */
static inline size_t conn__unwritten(const conn_t *c)
{
    return uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp) + c->out.len;
}

/** A line of `c` applied may take `bytes` and `slots` of the pool: pending
 * until conn__need_drop(). */
static inline void conn__need_add(conn_t *c, uint64_t bytes, uint64_t slots)
{
    c->pending_bytes += bytes;
    c->pending_slots += slots;
}

/** The line that counted `bytes` and `slots` in conn__need_add() is done. */
static inline void conn__need_drop(conn_t *c, uint64_t bytes, uint64_t slots)
{
    c->pending_bytes -= bytes;
    c->pending_slots -= slots;
}

/** A reply of `len` bytes is ready in the order FIFO (REQ_DONE). */
static inline void conn__held_add(conn_t *c, size_t len)
{
    c->held_bytes += len;
}

/** A reply of `len` bytes left the order FIFO for `out`. */
static inline void conn__held_drop(conn_t *c, size_t len)
{
    c->held_bytes -= len;
}

/** A job whose reply takes at most `bound` bytes goes out. */
static inline void conn__reserve(conn_t *c, size_t bound)
{
    c->reserved += bound;
}

/** A job that reserved `bound` came back, or did not run.  Nothing is
 * reserved once `c` has closed (conn_detach() zeroes the bounds). */
static inline void conn__unreserve(conn_t *c, size_t bound)
{
    if (!c->closed)
        c->reserved -= bound;
}

/** Parks the job of `r` in read order (`seq`): after every parked job read
 * before it.  The record stays its owner's; the list only links it
 * (park_next). */
void conn__park(conn_t *c, req_t *r);
/** The oldest parked job of `c`, taken off the list, or NULL. */
req_t *conn__park_pop(conn_t *c);

#endif
