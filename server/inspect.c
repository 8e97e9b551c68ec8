/*
 * inspect.c: what the daemon shows of itself: the figures of the stats op
 * and of the admin port (inspect__stats()), and GET /sessions, the list of
 * live sessions for an operator hunting a leak or a stuck client
 * (llama.cpp's server has /slots).
 *
 * Owns nothing past one call: it walks every open connection and every
 * session record on it that the client can still name (in its map),
 * gathers them in one array, sorts them largest first and writes the first
 * `limit` as JSON:
 *
 *   {"total":N,"limit":L,"sessions":[{"connection":{"number":K,
 *    "peer":"ADDR:PORT"},"id":"a","model":"tiny","entries":5,
 *    "pool_bytes":1792,"age_seconds":1.5,"idle_seconds":0.25,
 *    "state":"idle","outstanding":0},...]}
 *
 * `pool_bytes` is what the session's entries and model state take
 * (entries x model_entry_size() + model_state_size()); the slot's blocks
 * hold up to 10 % more (cache/pool.h).  It is read from the loop's copy
 * of the session, never from the slot a worker may be using.  The state is
 * "running" while a worker runs a job of the session, "queued" while its
 * requests wait (in its FIFO, or with the workers for a free thread),
 * "idle" otherwise; `outstanding` counts its requests not yet answered by
 * the model, the running one included.  Ties in size go to the older
 * session.
 *
 * DESIGN.  Loop thread only (the admin port's hook): the connections, the
 * session records and their FIFOs are the loop's; no lock.  Cost: O(n log
 * n) in the live sessions per request, about 20 ms for 100,000.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inspect_int.h"

typedef struct listed {
    const session_t *sess;
    uint64_t bytes;
    const char *peer; /* the connection's, in `peers` */
} listed_t;

static int by_size(const void *a, const void *b)
{
    const listed_t *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? 1 : -1;
    if (x->sess->born != y->sess->born)
        return x->sess->born < y->sess->born ? -1 : 1;
    return 0;
}

static const model_t *session_model(const session_t *sess)
{
    if (sess->cs.model != NULL)
        return sess->cs.model;
    return sess->fifo_head != NULL ? sess->fifo_head->model : NULL;
}

int inspect__sessions(server_t *s, size_t limit, proto_buf_t *out)
{
    size_t n = 0, cap = s->admitted + 1, npeers = s->nconns + 1, k = 0;
    listed_t *v = malloc(cap * sizeof(*v));
    char(*peers)[64] = malloc(npeers * sizeof(*peers));
    uint64_t now = uv_now(&s->loop);
    int rc = SLOTD_OK;
    char line[512];

    if (v == NULL || peers == NULL) {
        free(v);
        free(peers);
        return SLOTD_ENOMEM;
    }
    for (conn_t *c = s->conns; c != NULL && k < npeers; c = c->next, k++) {
        /* The client's address (handshake.c): behind a balancer that sends
         * a PROXY header, the client's, not the balancer's. */
        snprintf(peers[k], sizeof(peers[k]), "%s", c->peer);
        for (const session_t *sess = c->sessions; sess != NULL; sess = sess->next) {
            if (!sess->in_map || n == cap)
                continue;
            const model_t *m = session_model(sess);
            v[n].sess = sess;
            v[n].peer = peers[k];
            v[n].bytes = m == NULL ? 0
                                   : (uint64_t)sess->cs.entries * model_entry_size(m) +
                                         (sess->has_slot ? model_state_size(m) : 0);
            n++;
        }
    }
    qsort(v, n, sizeof(*v), by_size);

    int w = snprintf(line, sizeof(line), "{\"total\":%zu,\"limit\":%zu,\"sessions\":[", n, limit);
    rc = proto_buf_append(out, line, (size_t)w);
    for (size_t i = 0; i < n && i < limit && rc == SLOTD_OK; i++) {
        const session_t *sess = v[i].sess;
        const model_t *m = session_model(sess);
        size_t outstanding = 0;
        /* The running request and the steps chained to it (launch.c). */
        for (const req_t *r = sess->running; r != NULL; r = r->chain_next)
            outstanding++;
        for (const req_t *r = sess->fifo_head; r != NULL; r = r->session_next)
            outstanding++;
        bool started = sess->running != NULL &&
                       atomic_load_explicit(&sess->running->started, memory_order_relaxed);
        const char *state = started                                            ? "running"
                            : sess->running != NULL || sess->fifo_head != NULL ? "queued"
                                                                               : "idle";
        double age = (double)(now - sess->born) / 1000.0;
        double idle = sess->in_lru ? (double)(now - sess->idle_since) / 1000.0 : 0.0;
        w = snprintf(line, sizeof(line),
                     "%s{\"connection\":{\"number\":%" PRIu64 ",\"peer\":\"%s\"},\"id\":\"%s\","
                     "\"model\":\"%s\",\"entries\":%" PRIu32 ",\"pool_bytes\":%" PRIu64 ","
                     "\"age_seconds\":%.3f,\"idle_seconds\":%.3f,\"state\":\"%s\","
                     "\"outstanding\":%zu}",
                     i > 0 ? "," : "", sess->conn->serial, v[i].peer, sess->cs.owner.id,
                     m != NULL ? model_name(m) : "", sess->cs.entries, v[i].bytes, age, idle, state,
                     outstanding);
        rc = w > 0 && (size_t)w < sizeof(line) ? proto_buf_append(out, line, (size_t)w)
                                               : SLOTD_EINVAL;
    }
    if (rc == SLOTD_OK)
        rc = proto_buf_append(out, "]}\n", 3);
    free(v);
    free(peers);
    return rc;
}

/* ---- The stats op ---- */

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
    st->pool_bytes_used = ps.bytes_used;
    st->pool_slots_total = ps.max_slots;
    st->pool_slots_used = ps.live_slots;
    st->released_finish = metrics_released(METRICS_RELEASE_FINISH);
    st->released_disconnect = metrics_released(METRICS_RELEASE_DISCONNECT);
    st->released_idle = metrics_released(METRICS_RELEASE_IDLE);
    st->released_shutdown = metrics_released(METRICS_RELEASE_SHUTDOWN);
    st->uptime_seconds = (uv_hrtime() - s->start_ns) / 1000000000u;
    st->threads = s->cfg->threads;
}
