/*
 * authreq_int.h: the auth request and a tenant's revocation (authreq.c),
 * for dispatch.c.  Loop thread only.
 */
#ifndef SLOTD_SERVER_AUTHREQ_INT_H
#define SLOTD_SERVER_AUTHREQ_INT_H

#include <stdbool.h>

#include "server_int.h"

/** Applies the parsed auth request `r` of `c`: the connection is open from
 * now on, or `r` is answered with the error (auth_failed also ends the
 * connection's input, so it closes after the reply).  False if the
 * connection had to close (no memory). */
bool authreq__auth(conn_t *c, req_t *r);

/** If a reload marked c's tenant gone: appends one auth_revoked answer at
 * the end of c's order FIFO and ends its input, and returns true (the
 * caller moves the ready replies out).  False if there was nothing to do
 * or the connection had to close. */
bool authreq__revoke(conn_t *c);

#endif
