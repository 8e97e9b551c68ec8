/*
 * inspect.c: what the daemon shows of itself: the figures of the stats op
 * and of the admin port (inspect__stats(), inspect__health()), with a
 * tenants file the slotd_tenant_* families of /metrics, and GET /sessions,
 * the live sessions for an operator hunting a leak or a stuck client.
 *
 * A listing (inspect_listing_t, one per GET /sessions) is built in three
 * steps so that no step holds the loop thread for long: on the loop, a
 * piece of at most INSPECT_PIECE session records per loop turn is copied
 * into the listing's own array (connections and sessions are walked with
 * a cursor that inspect__conn_gone() and inspect__session_gone() move on
 * when what it points at goes away); on libuv's thread pool, the copies are
 * sorted largest first and written as JSON:
 *
 *   {"total":N,"limit":L,"sessions":[{"connection":{"number":K,
 *    "peer":"ADDR:PORT"},"tenant":"alice","id":"a","model":"tiny",
 *    "entries":5,"pool_bytes":1792,"shared_entries":0,"age_seconds":1.5,
 *    "idle_seconds":0.25,"state":"idle","outstanding":0},...]}
 *
 * and back on the loop the body goes to the admin port's callback, which
 * sends it out in slices.  `pool_bytes` is what the pool holds for the
 * session: its chain's blocks and its state, each at its 64-byte stride,
 * as the pool counts them (cache_pool_slot_bytes()).  The state is "running"
 * while a worker runs a job of the session, "queued" while its requests
 * wait, "evicted" while idle with its slot evicted (--on-full evict:
 * pool_bytes 0), "idle" otherwise; `outstanding` counts its requests not yet
 * answered by the model, the running one included.  `tenant` is there
 * with a tenants file.  `shared_entries` counts the entries in blocks that
 * another holder (a fork, another session, the prefix cache) holds too,
 * read from the pool under its lock; null while a request of the session
 * is out to the workers, whose user may be changing the chain.
 *
 * DESIGN.  The loop thread owns the server's records, every listing while
 * it gathers (server->listings, a FIFO of which only the head gathers, so
 * that many listings cost no more per turn than one) and its idle handle.
 * Once gathered, a listing's copies and body belong to the thread-pool
 * job until its after-work callback runs on the loop again; the copies
 * point at nothing of the server's.  No lock.  A listing is freed when its
 * handle is closed and its job is back, whether delivered or canceled.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inspect_int.h"
#include "session_int.h"
#include "tenancy_int.h"

/* Session records (and connections) a listing copies per loop turn: about
 * 0.2 ms of the loop's time with records out of cache. */
#define INSPECT_PIECE 1024

typedef enum listed_state {
    LISTED_IDLE = 0,
    LISTED_QUEUED,
    LISTED_RUNNING,
    LISTED_EVICTED,
} listed_state_t;

/* One session as copied on the loop: nothing here points into the
 * server (model names are the presets' static strings). */
typedef struct listed {
    uint64_t serial; /* its connection's */
    uint64_t bytes;
    uint64_t born;
    double age, idle;
    const char *model;
    uint32_t peer; /* index in the listing's peers */
    uint32_t entries;
    int64_t shared; /* entries in blocks held by others too; -1: a worker may hold it */
    uint32_t outstanding;
    listed_state_t state;
    char id[PROTO_ID_MAX + 1];
} listed_t;

/* A listed connection: its address and its tenant's name ("" without). */
typedef struct peer {
    char addr[64];
    char tenant[TENANT_NAME_MAX + 1];
} peer_t;

struct inspect_listing {
    server_t *s;
    size_t limit;
    admin_body_cb done;
    void *ctx;
    struct inspect_listing *next; /* s->listings while gathering */
    /* The cursor (loop): the connection being walked, or NULL at the end;
     * `sess` the next of its records to look at once `entered`. */
    conn_t *conn;
    session_t *sess;
    bool entered;
    uint64_t now; /* uv_now() when it was asked for */
    listed_t *v;  /* owned: the copies */
    size_t n, cap;
    peer_t *peers; /* owned: one per connection with a session listed */
    size_t npeers, peers_cap;
    proto_buf_t body; /* owned until handed to `done` */
    int rc;
    uv_idle_t idle; /* gathers one piece per loop turn while the FIFO's head */
    uv_work_t work; /* sorts and writes, on libuv's thread pool */
    bool handle_open, work_out, canceled;
};

/* ---- Copying on the loop ---- */

/* The client's address as the handshake recorded it (handshake.c): behind
 * a balancer that sends a PROXY header, the client's, not the balancer's. */
static int peer_add(inspect_listing_t *l, conn_t *c)
{
    if (l->npeers == l->peers_cap) {
        size_t cap = l->peers_cap ? 2 * l->peers_cap : 16;
        peer_t *p = realloc(l->peers, cap * sizeof(*p));
        if (p == NULL)
            return SLOTD_ENOMEM;
        l->peers = p;
        l->peers_cap = cap;
    }
    snprintf(l->peers[l->npeers].addr, sizeof(l->peers[0].addr), "%s", c->peer);
    snprintf(l->peers[l->npeers].tenant, sizeof(l->peers[0].tenant), "%s",
             c->tenant != NULL ? c->tenant->name : "");
    l->npeers++;
    return SLOTD_OK;
}

static int listed_add(inspect_listing_t *l, const session_t *sess)
{
    if (l->n == l->cap) {
        /* Sessions started since the listing began: rare, and a realloc
         * of megabytes may copy them, so the array is sized at the start. */
        size_t cap = l->cap + l->cap / 4 + 256;
        listed_t *v = realloc(l->v, cap * sizeof(*v));
        if (v == NULL)
            return SLOTD_ENOMEM;
        l->v = v;
        l->cap = cap;
    }
    listed_t *e = &l->v[l->n++];
    const model_t *m = session__model(sess);
    uint32_t outstanding = 0;
    /* The running request and the steps chained to it (launch.c). */
    for (const req_t *r = sess->running; r != NULL; r = r->chain_next)
        outstanding++;
    for (const req_t *r = sess->fifo_head; r != NULL; r = r->session_next)
        outstanding++;
    bool started = sess->running != NULL &&
                   atomic_load_explicit(&sess->running->started, memory_order_relaxed);
    e->serial = sess->conn->serial;
    e->bytes = m != NULL && sess->has_slot && !sess->evicted
                   ? cache_pool_slot_bytes(m, sess->cs.entries)
                   : 0;
    e->born = sess->born;
    e->age = (double)(l->now - sess->born) / 1000.0;
    e->idle = sess->in_lru ? (double)(l->now - sess->idle_since) / 1000.0 : 0.0;
    e->model = m != NULL ? model_name(m) : "";
    e->peer = (uint32_t)(l->npeers - 1);
    e->entries = sess->cs.entries;
    /* The chain is read only while no worker may be the slot's user. */
    e->shared = 0;
    if (sess->running != NULL) {
        e->shared = -1;
    } else if (sess->has_slot && !sess->evicted) {
        uint32_t shared;
        if (cache_pool_shared_entries(l->s->pool, sess->cs.handle, &sess->cs.owner, &shared) ==
            SLOTD_OK)
            e->shared = shared;
    }
    e->outstanding = outstanding;
    e->state = started                                            ? LISTED_RUNNING
               : sess->running != NULL || sess->fifo_head != NULL ? LISTED_QUEUED
               : sess->evicted                                    ? LISTED_EVICTED
                                                                  : LISTED_IDLE;
    snprintf(e->id, sizeof(e->id), "%s", sess->cs.owner.id);
    return SLOTD_OK;
}

/* Copies up to INSPECT_PIECE records from the cursor on.  SLOTD_OK with
 * l->conn NULL once every connection has been walked. */
static int gather_piece(inspect_listing_t *l)
{
    for (unsigned budget = INSPECT_PIECE; budget > 0 && l->conn != NULL; budget--) {
        conn_t *c = l->conn;
        if (!l->entered) {
            l->entered = true;
            l->sess = c->sessions;
            if (l->sess != NULL && peer_add(l, c) != SLOTD_OK)
                return SLOTD_ENOMEM;
            continue;
        }
        session_t *sess = l->sess;
        if (sess == NULL) {
            l->conn = c->next;
            l->entered = false;
            continue;
        }
        l->sess = sess->next;
        if (sess->in_map && listed_add(l, sess) != SLOTD_OK)
            return SLOTD_ENOMEM;
    }
    return SLOTD_OK;
}

/* ---- Sorting and writing on the thread pool ---- */

static int by_size(const void *a, const void *b)
{
    const listed_t *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? 1 : -1;
    if (x->born != y->born)
        return x->born < y->born ? -1 : 1;
    return 0;
}

static const char *const state_name[] = {
    [LISTED_IDLE] = "idle",
    [LISTED_QUEUED] = "queued",
    [LISTED_RUNNING] = "running",
    [LISTED_EVICTED] = "evicted",
};

static int write_body(inspect_listing_t *l)
{
    proto_buf_t *out = &l->body;
    char line[768];
    int rc;

    if (l->n > 0) /* l->v is NULL with nothing listed */
        qsort(l->v, l->n, sizeof(*l->v), by_size);
    int w =
        snprintf(line, sizeof(line), "{\"total\":%zu,\"limit\":%zu,\"sessions\":[", l->n, l->limit);
    rc = proto_buf_append(out, line, (size_t)w);
    for (size_t i = 0; i < l->n && i < l->limit && rc == SLOTD_OK; i++) {
        const listed_t *e = &l->v[i];
        char shared[24] = "null", tenant[TENANT_NAME_MAX + 16] = "";
        const peer_t *pe = &l->peers[e->peer];
        if (e->shared >= 0)
            snprintf(shared, sizeof(shared), "%" PRId64, e->shared);
        if (pe->tenant[0] != '\0') /* names are [A-Za-z0-9_.-]: no escape needed */
            snprintf(tenant, sizeof(tenant), ",\"tenant\":\"%s\"", pe->tenant);
        w = snprintf(line, sizeof(line),
                     "%s{\"connection\":{\"number\":%" PRIu64 ",\"peer\":\"%s\"}%s,\"id\":\"%s\","
                     "\"model\":\"%s\",\"entries\":%" PRIu32 ",\"pool_bytes\":%" PRIu64 ","
                     "\"shared_entries\":%s,\"age_seconds\":%.3f,\"idle_seconds\":%.3f,"
                     "\"state\":\"%s\",\"outstanding\":%" PRIu32 "}",
                     i > 0 ? "," : "", e->serial, pe->addr, tenant, e->id, e->model, e->entries,
                     e->bytes, shared, e->age, e->idle, state_name[e->state], e->outstanding);
        rc = w > 0 && (size_t)w < sizeof(line) ? proto_buf_append(out, line, (size_t)w)
                                               : SLOTD_EINVAL;
    }
    if (rc == SLOTD_OK)
        rc = proto_buf_append(out, "]}\n", 3);
    return rc;
}

static void work_cb(uv_work_t *w)
{
    inspect_listing_t *l = container_of(w, inspect_listing_t, work);
    l->rc = write_body(l);
}

/* ---- The listing's life (loop) ---- */

static void listing_free_if_done(inspect_listing_t *l)
{
    if (l->handle_open || l->work_out)
        return;
    free(l->v);
    free(l->peers);
    proto_buf_free(&l->body);
    free(l);
}

static void idle_closed(uv_handle_t *h)
{
    inspect_listing_t *l = container_of(h, inspect_listing_t, idle);
    l->handle_open = false;
    listing_free_if_done(l);
}

static void after_work_cb(uv_work_t *w, int status)
{
    inspect_listing_t *l = container_of(w, inspect_listing_t, work);
    l->work_out = false;
    if (!l->canceled) {
        l->canceled = true; /* delivered: nothing more to cancel */
        l->done(l->ctx, status == 0 ? l->rc : SLOTD_ENOMEM, &l->body);
    }
    listing_free_if_done(l);
}

static void idle_cb(uv_idle_t *h);

/* Takes `l` off the FIFO (it need not be the head) and starts the next. */
static void listing_unqueue(inspect_listing_t *l)
{
    server_t *s = l->s;
    inspect_listing_t **pp = &s->listings;
    while (*pp != NULL && *pp != l)
        pp = &(*pp)->next;
    if (*pp == NULL)
        return;
    bool head = pp == &s->listings;
    *pp = l->next;
    l->next = NULL;
    uv_idle_stop(&l->idle);
    if (l->handle_open)
        uv_close((uv_handle_t *)&l->idle, idle_closed);
    if (head && s->listings != NULL)
        uv_idle_start(&s->listings->idle, idle_cb);
}

static void idle_cb(uv_idle_t *h)
{
    inspect_listing_t *l = container_of(h, inspect_listing_t, idle);
    int rc = gather_piece(l);
    if (rc == SLOTD_OK && l->conn != NULL)
        return;
    listing_unqueue(l);
    l->rc = rc;
    if (rc == SLOTD_OK && uv_queue_work(&l->s->loop, &l->work, work_cb, after_work_cb) == 0) {
        l->work_out = true;
        return;
    }
    l->canceled = true;
    l->done(l->ctx, SLOTD_ENOMEM, &l->body);
    listing_free_if_done(l);
}

void *inspect__sessions(void *arg, size_t limit, admin_body_cb done, void *ctx)
{
    server_t *s = arg;
    inspect_listing_t *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return NULL;
    l->s = s;
    l->limit = limit;
    l->done = done;
    l->ctx = ctx;
    /* Room for every session in a map now, in one allocation: growing it
     * piece by piece would copy what was gathered (a few ms for 50,000). */
    l->cap = s->admitted + 64;
    l->v = malloc(l->cap * sizeof(*l->v));
    if (l->v == NULL) {
        free(l);
        return NULL;
    }
    l->conn = s->conns;
    l->now = uv_now(&s->loop);
    proto_buf_init(&l->body);
    uv_idle_init(&s->loop, &l->idle);
    l->handle_open = true;
    inspect_listing_t **pp = &s->listings;
    while (*pp != NULL)
        pp = &(*pp)->next;
    *pp = l;
    if (s->listings == l)
        uv_idle_start(&l->idle, idle_cb);
    return l;
}

void inspect__sessions_cancel(void *listing)
{
    inspect_listing_t *l = listing;
    if (l == NULL || l->canceled)
        return;
    l->canceled = true;
    listing_unqueue(l);
    /* A job on the thread pool cannot be called back: it finishes, and
     * after_work_cb() frees the listing. */
    listing_free_if_done(l);
}

void inspect__conn_gone(conn_t *c)
{
    inspect_listing_t *l = c->server->listings;
    if (l != NULL && l->conn == c) {
        l->conn = c->next;
        l->sess = NULL;
        l->entered = false;
    }
}

void inspect__session_gone(session_t *sess)
{
    inspect_listing_t *l = sess->conn->server->listings;
    if (l != NULL && l->sess == sess)
        l->sess = sess->next;
}

/* ---- The stats op and the health gauges ---- */

void inspect__stats(server_t *s, proto_stats_t *st)
{
    cache_pool_stats_t ps;

    memset(st, 0, sizeof(*st));
    cache_pool_stats(s->pool, &ps);
    for (size_t i = 0; i < s->nmodels; i++) {
        st->g_calls += model_g_calls(s->models[i]);
        st->rows += model_rows(s->models[i]);
    }
    st->cache_entries = ps.entries;
    st->live_sessions = s->live_sessions;
    st->connections = s->nconns;
    st->requests_total = metrics_requests_total();
    st->errors_total = metrics_errors_total();
    st->pool_bytes_total = ps.bytes_capacity;
    /* Blocks only the prefix cache holds are free room, not used. */
    st->pool_bytes_used = ps.bytes_used - ps.prefix_bytes;
    st->pool_slots_total = ps.max_slots;
    st->pool_slots_used = ps.live_slots;
    st->released_finish = metrics_released(METRICS_RELEASE_FINISH);
    st->released_disconnect = metrics_released(METRICS_RELEASE_DISCONNECT);
    st->released_idle = metrics_released(METRICS_RELEASE_IDLE);
    st->released_shutdown = metrics_released(METRICS_RELEASE_SHUTDOWN);
    st->uptime_seconds = (uv_hrtime() - s->start_ns) / 1000000000u;
    st->threads = s->cfg->threads;
    st->evicted_sessions = s->evicted_sessions;
    st->evictions_total = metrics_eviction_value();
    st->rebuilt_entries_total = metrics_rebuilt_entry_value();
    st->prefix_entries = ps.prefix_entries;
    st->prefix_hit_entries = ps.prefix_hit_entries;
    st->prefix_query_entries = ps.prefix_query_entries;
    st->prefix_evicted_entries = ps.prefix_evicted_entries;
    st->shared_blocks = ps.shared_blocks;
}

void inspect__tenant_stats(server_t *s, const tenant_t *t, proto_stats_t *st)
{
    cache_pool_stats_t ps;
    uint64_t entries = 0;

    memset(st, 0, sizeof(*st));
    cache_pool_stats(s->pool, &ps);
    /* Its sessions' entries as the loop counts them (share_entries: what
     * their requests read so far come to; what the slot holds once they
     * settle). */
    for (const conn_t *c = s->conns; c != NULL; c = c->next)
        if (c->tenant == t)
            for (const session_t *sess = c->sessions; sess != NULL; sess = sess->next)
                if (sess->in_map)
                    entries += sess->share_entries;
    st->pool_bytes_total = (uint64_t)((double)ps.bytes_capacity * t->share);
    st->pool_slots_total = t->max_sessions > 0 && t->max_sessions < ps.max_slots
                               ? t->max_sessions
                               : ps.max_slots;
    st->uptime_seconds = (uv_hrtime() - s->start_ns) / 1000000000u;
    st->threads = s->cfg->threads;
    st->live_sessions = t->sessions;
    st->connections = t->connections;
    st->requests_total = t->requests_total;
    st->errors_total = t->errors_total;
    st->pool_bytes_used = t->pool_bytes;
    st->pool_slots_used = t->sessions;
    st->released_finish = t->released[METRICS_RELEASE_FINISH];
    st->released_disconnect = t->released[METRICS_RELEASE_DISCONNECT];
    st->released_idle = t->released[METRICS_RELEASE_IDLE];
    st->released_shutdown = t->released[METRICS_RELEASE_SHUTDOWN];
    st->cache_entries = entries;
}

void inspect__health(void *arg, bool *draining, bool *wedged)
{
    server_t *s = arg;

    *draining = s->draining;
    *wedged =
        s->workers != NULL &&
        worker_pool_wedged(s->workers, uv_hrtime(), (uint64_t)s->cfg->wedge_timeout * 1000000000u);
}

/* ---- Per-tenant metric families (GET /metrics with a tenants file) ---- */

static int put(proto_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int put(proto_buf_t *b, const char *fmt, ...)
{
    char line[256];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(line))
        return SLOTD_EINVAL;
    return proto_buf_append(b, line, (size_t)n);
}

/* One family of one sample per listed tenant `t`: `expr` of it. */
#define TENANT_FAMILY(fam, kind, what, expr)                                                       \
    do {                                                                                           \
        TRY(put(b, "# HELP " fam " " what "\n# TYPE " fam " " kind "\n"));                          \
        for (t = s->tenants; t != NULL; t = t->next)                                               \
            TRY(put(b, fam "{tenant=\"%s\"} %" PRIu64 "\n", t->name, (uint64_t)(expr)));           \
    } while (0)
#define TRY(call)                                                                                  \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != SLOTD_OK)                                                                       \
            return rc_;                                                                            \
    } while (0)

int inspect__tenant_metrics(void *arg, proto_buf_t *b)
{
    server_t *s = arg;
    tenant_t *t;

    /* Entries held, summed in one pass as inspect__tenant_stats() sums them. */
    for (t = s->tenants; t != NULL; t = t->next)
        t->scratch_entries = 0;
    for (const conn_t *c = s->conns; c != NULL; c = c->next)
        if (c->tenant != NULL)
            for (const session_t *sess = c->sessions; sess != NULL; sess = sess->next)
                if (sess->in_map)
                    c->tenant->scratch_entries += sess->share_entries;

    TENANT_FAMILY("slotd_tenant_requests_total", "counter",
                  "Request lines read on the tenant's connections.", t->requests_total);
    /* Errors by wire code; the codes spelled "internal" are summed, and a
     * code the tenant never had is left out. */
    TRY(put(b, "# HELP slotd_tenant_errors_total Error replies to the tenant, by code.\n"
               "# TYPE slotd_tenant_errors_total counter\n"));
    for (t = s->tenants; t != NULL; t = t->next)
        for (int i = 0; i < SLOTD__ERR_COUNT; i++) {
            const char *code = slotd_err_name(-(i + 1));
            uint64_t n = 0;
            bool first = true;
            for (int j = 0; j < SLOTD__ERR_COUNT; j++)
                if (strcmp(slotd_err_name(-(j + 1)), code) == 0) {
                    first = first && j >= i;
                    n += t->errors[j];
                }
            if (first && n > 0)
                TRY(put(b, "slotd_tenant_errors_total{tenant=\"%s\",code=\"%s\"} %" PRIu64 "\n",
                        t->name, code, n));
        }
    TENANT_FAMILY("slotd_tenant_steps_total", "counter",
                  "Positions picked by the tenant's step requests.", t->steps_total);
    TRY(put(b, "# HELP slotd_tenant_request_wait_seconds Time from reading a request of the "
               "tenant to a worker beginning it.\n"
               "# TYPE slotd_tenant_request_wait_seconds summary\n"));
    for (t = s->tenants; t != NULL; t = t->next) {
        TRY(put(b, "slotd_tenant_request_wait_seconds_sum{tenant=\"%s\"} %.9f\n", t->name,
                (double)t->wait_ns / 1e9));
        TRY(put(b, "slotd_tenant_request_wait_seconds_count{tenant=\"%s\"} %" PRIu64 "\n",
                t->name, t->waits));
    }
    TENANT_FAMILY("slotd_tenant_cache_entries", "gauge",
                  "Entries held by the tenant's live sessions (its stats' cache_entries).",
                  t->scratch_entries);
    TENANT_FAMILY("slotd_tenant_pool_bytes", "gauge",
                  "Pool bytes charged to the tenant (its stats' pool_bytes_used).", t->pool_bytes);
    TENANT_FAMILY("slotd_tenant_live_sessions", "gauge", "The tenant's live sessions.",
                  t->sessions);
    TENANT_FAMILY("slotd_tenant_connections", "gauge", "The tenant's open connections.",
                  t->connections);
    return SLOTD_OK;
}
#undef TRY
#undef TENANT_FAMILY
