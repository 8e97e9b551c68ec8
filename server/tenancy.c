/*
 * tenancy.c: the tenants' records (tenancy_int.h): built from
 * --tenants-file at start, reconciled with it at each reload, and the
 * connections attached to them at their auth.
 *
 * A reload matches the new file's lines to the records by name.  A name
 * kept with the same token keeps its record (its flow, its counts, its
 * connections) and takes the new limits, weight included, at once; a name
 * dropped, or whose token changed, has its record marked gone and taken
 * off the list, and server.c revokes its connections; a new name gets a
 * record.  The new file is parsed whole first: a file that does not parse
 * changes nothing.
 *
 * DESIGN.  Loop thread only; a weight is written into the flow under the
 * workers' queue_lock (worker_pool_flow_set_weight()).  Records are owned
 * by their references (tenancy_int.h) and freed at the last.
 */
#include "tenancy_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/base/auth.h"
#include "server/base/log.h"
#include "server/admin/admin.h"

/* The top bit marks a tenant's scope key apart from a connection serial. */
#define TENANT_KEY_BIT (UINT64_C(1) << 63)

static void tenant_unref(tenant_t *t)
{
    if (--t->refs > 0)
        return;
    if (t->server->workers != NULL)
        worker_pool_flow_forget(t->server->workers, &t->flow);
    memset(t->token, 0, t->token_len);
    free(t->token);
    free(t);
}

/* Copies the limits of `d` into `t`; the weight into its flow. */
static void tenant_set_limits(server_t *s, tenant_t *t, const tenant_def_t *d)
{
    t->share = d->share;
    t->share_cap = 0;
    t->max_sessions = d->sessions;
    t->max_connections = d->connections;
    t->admin = d->admin;
    if (t->weight != d->weight) {
        t->weight = d->weight;
        if (s->workers != NULL)
            worker_pool_flow_set_weight(s->workers, &t->flow, d->weight);
        else
            worker_flow_set_weight(&t->flow, d->weight);
    }
}

static tenant_t *tenant_new(server_t *s, const tenant_def_t *d)
{
    tenant_t *t = calloc(1, sizeof(*t));

    if (t == NULL || (t->token = malloc(d->token_len + 1)) == NULL) {
        free(t);
        return NULL;
    }
    memcpy(t->token, d->token, d->token_len + 1);
    t->token_len = d->token_len;
    memcpy(t->name, d->name, sizeof(t->name));
    t->key = TENANT_KEY_BIT | ++s->tenant_keys;
    t->server = s;
    t->refs = 1;
    t->weight = 1;
    worker_flow_init(&t->flow);
    worker_flow_set_capped(&t->flow);
    tenant_set_limits(s, t, d);
    return t;
}

int tenancy__start(server_t *s)
{
    tenants_file_t f = {NULL, 0};
    char err[512];
    tenant_t **tail = &s->tenants;

    if (s->cfg->tenants_file[0] == '\0')
        return 0;
    if (tenants_load(s->cfg->tenants_file, &f, err, sizeof(err)) != 0) {
        log_error("%s", err);
        return -1;
    }
    for (size_t i = 0; i < f.n; i++) {
        tenant_t *t = tenant_new(s, &f.t[i]);
        if (t == NULL) {
            log_error("--tenants-file: no memory");
            tenants_free(&f);
            return -1;
        }
        *tail = t;
        tail = &t->next;
    }
    log_info("tenants: %zu from %s", f.n, s->cfg->tenants_file);
    tenants_free(&f);
    return 0;
}

long tenancy__reload(server_t *s, char *why, size_t why_size)
{
    tenants_file_t f = {NULL, 0};
    char err[512];
    tenant_t **at, *t, *added = NULL, **added_tail = &added;
    size_t kept = 0, dropped = 0, changed = 0;
    long revoked = 0;
    bool *matched;

    if (s->cfg->tenants_file[0] == '\0')
        return 0;
    if (tenants_load(s->cfg->tenants_file, &f, err, sizeof(err)) != 0) {
        s->tenants_reload_failures++;
        metrics_count_tenants_reload_failure();
        log_error("tenants: reload refused, nothing changed: %s", err);
        if (why != NULL)
            snprintf(why, why_size, "%s", err);
        return -1;
    }
    /* Everything that can fail first: the new records. */
    if ((matched = calloc(f.n, sizeof(*matched))) == NULL)
        goto nomem;
    for (t = s->tenants; t != NULL; t = t->next) {
        const tenant_def_t *d = tenants_find_name(&f, t->name);
        if (d != NULL && auth_equal(d->token, d->token_len, t->token, t->token_len))
            matched[d - f.t] = true;
    }
    for (size_t i = 0; i < f.n; i++) {
        if (matched[i])
            continue;
        if ((t = tenant_new(s, &f.t[i])) == NULL) {
            while ((t = added) != NULL) {
                added = t->next;
                tenant_unref(t);
            }
            free(matched);
            goto nomem;
        }
        *added_tail = t;
        added_tail = &t->next;
    }
    free(matched);
    /* Then the reconciliation, which cannot fail. */
    for (at = &s->tenants; (t = *at) != NULL;) {
        const tenant_def_t *d = tenants_find_name(&f, t->name);
        if (d != NULL && auth_equal(d->token, d->token_len, t->token, t->token_len)) {
            tenant_set_limits(s, t, d);
            kept++;
            at = &t->next;
            continue;
        }
        if (d != NULL)
            changed++;
        else
            dropped++;
        t->gone = true;
        revoked += t->connections;
        *at = t->next;
        t->next = NULL;
        tenant_unref(t);
    }
    *at = added;
    s->tenants_reloads++;
    metrics_count_tenants_reload();
    log_info("tenants: reloaded %s: %zu kept, %zu new, %zu dropped, %zu with a new token; %ld "
             "connections to revoke",
             s->cfg->tenants_file, kept, f.n - kept, dropped, changed, revoked);
    tenants_free(&f);
    return revoked;
nomem:
    s->tenants_reload_failures++;
    metrics_count_tenants_reload_failure();
    log_error("tenants: reload refused, nothing changed: no memory");
    if (why != NULL)
        snprintf(why, why_size, "no memory");
    tenants_free(&f);
    return -2;
}

void tenancy__stop(server_t *s)
{
    tenant_t *t;

    while ((t = s->tenants) != NULL) {
        s->tenants = t->next;
        tenant_unref(t);
    }
}

size_t tenancy__count(const server_t *s)
{
    size_t n = 0;

    for (const tenant_t *t = s->tenants; t != NULL; t = t->next)
        n++;
    return n;
}

tenant_t *tenancy__find(server_t *s, const char *token, size_t len)
{
    tenant_t *hit = NULL;

    /* Every token compared, whichever matches. */
    for (tenant_t *t = s->tenants; t != NULL; t = t->next)
        if (auth_equal(token, len, t->token, t->token_len) && hit == NULL)
            hit = t;
    return hit;
}

int tenancy__attach(conn_t *c, tenant_t *t, slotd_error_t *err)
{
    uint32_t most = t->max_connections;

    if (most > 0 && t->connections >= most) {
        t->refused_total++;
        return slotd_error_set(err, SLOTD_ETOO_MANY_CONNECTIONS,
                               "auth: tenant '%s' has its %" PRIu32
                               " connections open (connections=%" PRIu32
                               " in the tenants file); the connection is closed",
                               t->name, t->connections, most);
    }
    c->tenant = t;
    t->refs++;
    t->connections++;
    return SLOTD_OK;
}

void tenancy__conn_closing(conn_t *c)
{
    if (c->tenant != NULL)
        c->tenant->connections--;
}

void tenancy__conn_freed(conn_t *c)
{
    if (c->tenant != NULL) {
        tenant_unref(c->tenant);
        c->tenant = NULL;
    }
}

uint64_t tenancy_scope_key(const conn_t *c)
{
    return c->tenant != NULL ? c->tenant->key : c->serial;
}

uint64_t tenancy__prefix_scope(const conn_t *c, config_prefix_scope_t sc)
{
    switch (sc) {
    case CONFIG_SCOPE_GLOBAL:
        return 0;
    case CONFIG_SCOPE_CONNECTION:
        return c->serial + 1;
    case CONFIG_SCOPE_TENANT:
        return tenancy_scope_key(c) + 1;
    }
    return 0;
}
