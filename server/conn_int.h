/*
 * conn_int.h: a session connection's socket (conn.c), for the other files
 * of server/.  Loop thread only.
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

#endif
