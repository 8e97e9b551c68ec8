/*
 * authreq.c: the auth request and the revocation of a connection's
 * tenant.  It decides what an auth line does to its connection: open it
 * (with the one token, or a tenant's, within the tenant's connections),
 * refuse it and close the connection after the reply (auth_failed,
 * counted and logged without the token), or refuse it and leave the
 * connection as it was (another tenant's token); and, when a reload
 * removed a connection's tenant or changed its token, it appends the one
 * auth_revoked line after which the connection closes.
 *
 * DESIGN.  Loop thread only; no lock.  dispatch.c calls in (an auth line
 * parsed; a revocation, for server.c) and moves the replies to the output
 * itself; this file calls below it (req.c, conn.c, handshake.c,
 * tenancy.c), never back.
 *
 * Design: docs/design.md, "Tenants: who a connection is, and what it may
 * take" and "server/ layout".
 */
#include "authreq_int.h"

#include <inttypes.h>

#include "server/base/auth.h"
#include "conn_int.h"
#include "handshake_int.h"
#include "server/base/log.h"
#include "req_int.h"
#include "tenancy_int.h"

/* An auth request with a tenants file: a tenant's token makes the
 * connection that tenant's (once: another tenant's token later is
 * bad_request and changes nothing), within the tenant's connections.
 * SLOTD_OK with *t set, or an error in `err`; `close` when the connection
 * closes after the reply. */
static int auth_tenant(conn_t *c, req_t *r, tenant_t **t, bool *close, slotd_error_t *err)
{
    *close = true;
    if ((*t = tenancy__find(c->server, r->rq.token, r->rq.token_len)) == NULL) {
        if (c->tenant == NULL)
            return slotd_error_set(err, SLOTD_EAUTH_FAILED,
                                   "auth: wrong token; the connection is closed");
        *close = false;
        return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                               "auth: token names no tenant; the connection stays tenant '%s''s",
                               c->tenant->name);
    }
    if (c->tenant != NULL) {
        *close = false;
        if (*t == c->tenant)
            return SLOTD_OK;
        return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                               "auth: token is another tenant's; the connection stays tenant "
                               "'%s''s",
                               c->tenant->name);
    }
    return tenancy__attach(c, *t, err);
}

/* An auth request: with no token set, or the right one, the connection is
 * open from now on; a wrong one is auth_failed, counted and logged (not
 * the token), and the connection closes after the reply.  False if the
 * connection had to close (no memory). */
bool authreq__auth(conn_t *c, req_t *r)
{
    const server_config_t *cfg = c->server->cfg;
    slotd_error_t err;
    tenant_t *t = NULL;
    bool close = true;
    int rc = SLOTD_OK;

    slotd_error_clear(&err);
    if (cfg->tenants_file[0] != '\0')
        rc = auth_tenant(c, r, &t, &close, &err);
    else if (cfg->auth_token_len != 0 &&
             !auth_equal(r->rq.token, r->rq.token_len, cfg->auth_token, cfg->auth_token_len))
        rc = slotd_error_set(&err, SLOTD_EAUTH_FAILED,
                             "auth: wrong token; the connection is closed");
    if (rc == SLOTD_OK) {
        c->authed = true;
        handshake__authed(c);
        r->rc = SLOTD_OK;
        r->reply.len = 0;
        if (proto_reply_auth_tenant(&r->reply, r->rq.tag, t != NULL ? t->name : NULL) != SLOTD_OK) {
            conn__close(c);
            return false;
        }
        req__done(r);
        return true;
    }
    if (rc == SLOTD_EAUTH_FAILED) {
        metrics_count_auth_failure();
        log_warn("connection %" PRIu64 " from %s: auth with a wrong token; closing it", c->serial,
                 c->peer);
    } else {
        log_warn("connection %" PRIu64 " from %s: auth refused: %s", c->serial, c->peer,
                 err.message);
    }
    if (!req__fail(r, &err))
        return false;
    if (close)
        conn__end_input(c);
    return true;
}

bool authreq__revoke(conn_t *c)
{
    slotd_error_t err;
    req_t *r;

    if (c->closed || c->tenant == NULL || !c->tenant->gone)
        return false;
    log_info("connection %" PRIu64 " from %s: tenant '%s' revoked by a reload; closing it",
             c->serial, c->peer, c->tenant->name);
    /* A line of its own at the end of the order FIFO: every line read
     * before is answered first, then this one, then the connection closes
     * (no more input is read). */
    if ((r = req__get(c->server)) == NULL) {
        conn__close(c);
        return false;
    }
    r->conn = c;
    r->read_ns = uv_hrtime();
    req__order_append(c, r);
    slotd_error_set(&err, SLOTD_EAUTH_REVOKED,
                    "tenant '%s' was removed or its token changed; the connection is closed",
                    c->tenant->name);
    if (!req__fail(r, &err))
        return false;
    conn__end_input(c);
    return true;
}
