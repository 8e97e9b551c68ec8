/*
 * tenancy_int.h: the tenants a daemon serves (--tenants-file), as records
 * the connections point at: each tenant's limits, its flow in the workers'
 * fair queue, and what it holds now.  server/tenants.h reads the file;
 * server/tenancy.c keeps these records, attaches connections to them at
 * their auth, and reconciles them with the file at each reload.
 *
 * DESIGN.  Loop thread only, except `flow`, which the workers read and
 * write under the pool's queue_lock while the tenant's jobs are queued
 * (worker.c).  A record is owned by its references: one while it is in
 * server->tenants (until a reload drops it), one per connection attached
 * to it (from its auth until the connection struct is freed, which is
 * after its last job is back), so a job's flow never outlives its tenant.
 * Without a tenants file there are no records, c->tenant is NULL, and
 * each connection is its own tenant, with its own flow, as before.
 */
#ifndef SLOTD_SERVER_TENANCY_INT_H
#define SLOTD_SERVER_TENANCY_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"
#include "server_int.h"
#include "tenants.h"

/** One tenant. */
struct tenant {
    char name[TENANT_NAME_MAX + 1];
    char *token; /* owned; wiped and freed with the record */
    size_t token_len;
    uint64_t key;             /* tenancy_scope_key() of its connections; never reused */
    server_t *server;
    double share;             /* of the pool, (0, 1] */
    uint32_t weight;          /* its flow's (sched_int.h) */
    uint32_t max_sessions;    /* 0: none of its own */
    uint32_t max_connections; /* 0: none of its own */
    bool admin;
    bool gone;          /* dropped or its token changed by a reload: its connections are revoked */
    unsigned refs;      /* see DESIGN */
    worker_flow_t flow; /* every job of its connections */
    uint64_t share_cap; /* 1 + its bound in pool bytes; 0 until computed */
    /* What it holds now. */
    uint32_t connections; /* attached and open */
    uint32_t sessions;    /* in its connections' maps */
    uint64_t pool_bytes;  /* charged to them (session.c's share, summed) */
    /* Since it was first read (kept across reloads that keep its token). */
    uint64_t requests_total, errors_total, refused_total;
    uint64_t released[4]; /* sessions released, by metrics_release_t */
    uint64_t errors[SLOTD__ERR_COUNT]; /* error replies by code: index -code - 1 */
    uint64_t steps_total;              /* positions its step requests picked */
    uint64_t wait_ns, waits;           /* its jobs' waits, read to a worker beginning them */
    uint64_t scratch_entries;          /* inspect.c: summed while rendering the metrics */
    tenant_t *next; /* in server->tenants while not gone */
};

/** Loads --tenants-file (if given) into server->tenants at start.
 * Returns 0, or -1 having logged why (the daemon then exits 2). */
int tenancy__start(server_t *s);

/** Rereads the file (SIGHUP, POST /tenants/reload): tenants kept with
 * their token take the new limits at once (the next request), new ones can
 * connect, and a tenant dropped or whose token changed is marked gone, its
 * connections to be revoked by the caller (dispatch__revoke()).  A file
 * that fails to load changes nothing; it is logged and counted, and the
 * reason written to `why` (why_size bytes, NULL for none).  Returns the
 * number of connections now attached to a gone tenant, -1 if the file was
 * refused, -2 without memory. */
long tenancy__reload(server_t *s, char *why, size_t why_size);

/** The tenants listed now (those a token can authenticate as). */
size_t tenancy__count(const server_t *s);

/** Frees every record at the end of server_run() (no connection left). */
void tenancy__stop(server_t *s);

/** The tenant a token names, or NULL.  Constant time in the token. */
tenant_t *tenancy__find(server_t *s, const char *token, size_t len);

/** Attaches `c` to `t` after a successful auth: SLOTD_OK, or
 * SLOTD_ETOO_MANY_CONNECTIONS with `err` naming the tenant's limit. */
int tenancy__attach(conn_t *c, tenant_t *t, slotd_error_t *err);

/** conn_hooks_t: `c` stops serving; its tenant counts one connection less. */
void tenancy__conn_closing(conn_t *c);

/** conn_hooks_t: `c`'s struct is about to be freed; drops its reference. */
void tenancy__conn_freed(conn_t *c);

/** The key the prefix cache's `tenant` scope shares blocks by: the same for
 * every connection of one tenant, different between tenants, and, without
 * a tenants file (c->tenant NULL), the connection's own (its serial, which
 * the `connection` scope uses), as each connection is its own tenant.
 * Tenant keys have the top bit set and serials do not, so the two never
 * meet.  Loop thread. */
uint64_t tenancy_scope_key(const conn_t *c);

/** The prefix cache's scope for `c`'s requests under --prefix-scope `sc`
 * (cache/prefix.c): 0 for global, else a key + 1 that no other connection
 * or tenant has. */
uint64_t tenancy__prefix_scope(const conn_t *c, config_prefix_scope_t sc);

/** The flow `c`'s jobs join: its tenant's, or its own without one. */
static inline worker_flow_t *tenancy__flow(conn_t *c)
{
    return c->tenant != NULL ? &c->tenant->flow : &c->flow;
}

/** The tenant's share of the pool in bytes (share of --cache-mb). */
static inline uint64_t tenancy__share_cap(tenant_t *t, uint64_t cache_mb)
{
    if (t->share_cap == 0)
        t->share_cap = (uint64_t)((double)(cache_mb << 20) * t->share) + 1;
    return t->share_cap - 1;
}

/** Whether `c`'s tenant has room for `bytes` more of the pool (always true
 * without a tenant or with a share of 1). */
static inline bool tenancy__bytes_fit(conn_t *c, uint64_t bytes)
{
    tenant_t *t = c->tenant;
    return t == NULL || t->share >= 1.0 ||
           t->pool_bytes + bytes <= tenancy__share_cap(t, c->server->cfg->cache_mb);
}

/** Adds `bytes` (may wrap: a negative change) and `sessions` to what `c`'s
 * tenant holds. */
static inline void tenancy__charge(conn_t *c, int64_t bytes, int sessions)
{
    if (c->tenant != NULL) {
        c->tenant->pool_bytes += (uint64_t)bytes;
        c->tenant->sessions += (uint32_t)sessions;
    }
}

#endif
