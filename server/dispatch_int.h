/*
 * dispatch_int.h: request dispatch (dispatch.c), for the other files of
 * server/.  Loop thread only.
 */
#ifndef SLOTD_SERVER_DISPATCH_INT_H
#define SLOTD_SERVER_DISPATCH_INT_H

#include "server_int.h"

/** conn_hooks_t.line: one complete line read on the connection `arg`.
 * 0, or SLOTD_ENOMEM when the connection closed. */
int dispatch__on_line(void *arg, const char *line, size_t len);

/** Tells `c`, whose tenant a reload marked gone, with one auth_revoked
 * line after the replies to every line it read, and closes it then.  Loop
 * thread. */
void dispatch__revoke(conn_t *c);
/** conn_hooks_t.drain_line: one complete line the peer had sent before a
 * drain, answered shutting_down. */
int dispatch__on_drain_line(void *arg, const char *line, size_t len);
/** conn_hooks_t.line_too_long: answers line_too_long and ends the input. */
void dispatch__line_too_long(conn_t *c);
/** Takes back a job that came back from the workers (or was taken back
 * unstarted, with its result set by req__set_error()): the record is the
 * loop's again. */
void dispatch__job_done(req_t *r);

/* Observes the request durations of the replies moved to output since the
 * last call (server->replied), ending now; the loop calls it at the end of
 * every turn. */
void dispatch__observe_replies(server_t *s);
/** Shutdown: stops reading `c` past what its socket holds, answers its
 * waiting requests with shutting_down, and closes it once the running
 * ones are answered. */
void dispatch__drain(conn_t *c);
/** conn_hooks_t.model_built: a build of `m` ended with `rc`.  The request
 * of `c` waiting for it (REQ_BUILD, its barrier), if any, is applied as if
 * just read, or answered with the error; the lines behind it follow in
 * order. */
void dispatch__model_built(conn_t *c, const model_t *m, int rc);

#endif
