/*
 * worker.c: one generator thread of slotd-bench and everything its event
 * loop drives: the connections, the sessions on each connection, the
 * requests written and the replies read, the checks of --verify, and the
 * figures of bench_stats_t.
 *
 * A connection keeps up to -P requests outstanding.  Each session has at
 * most one request in flight (--session-pipeline K: up to K, of which only
 * steps and a finish behind them may overlap; a start goes alone), so a
 * session's start, steps and finish follow one another; the pipeline is
 * filled from different sessions, taken in round-robin order from a ring of
 * sessions that are ready for their next request (a session is in it at
 * most once, and only while it may write another request).  Replies come
 * back in request order (the protocol's promise), so a second ring of
 * pending requests, in the order written, says what each reply line answers
 * and when it was sent.  A session's life is start, -n steps (in requests
 * of --step-n), finish, and again with a new prompt; in Redis mode it is
 * one INCR after another on its own key.  With a token (--auth-token-file),
 * every connection, and every reconnection, writes cfg->auth_line first;
 * its reply takes a place in the pending ring like a request, and the
 * sessions' requests follow it without waiting (the daemon answers in
 * order).  Any auth_required or auth_failed ends the run: a generator that
 * went on would only measure refusals.  With
 * --live-sessions, a finished session restarts next rather than after a
 * whole round, and each session's first life is cut to a random length, so
 * that N sessions stay open and do not finish in waves.
 *
 * DESIGN.  A worker owns one libuv loop, run by its own thread, and every
 * handle, connection, session, buffer and figure in it; nothing here is
 * touched by another thread, with these exceptions.  The main thread wakes
 * the loop through `wake` (uv_async_send) after changing ctl->phase, and the
 * loop reads the phase in on_wake.  The loop publishes progress copies
 * (p_steps, p_requests, p_errors, p_open) with relaxed atomic stores that
 * the main thread reads for its progress line.  The --requests budget,
 * ctl->live_open and ctl->printed_reports are atomics shared by all
 * workers.  After `done` is set and the thread joined, the main thread
 * reads `st` and `fatal`.
 */
#include "bench.h"
#include "ref.h"
#include "scan.h"
#include "core/util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <uv.h>

#define READ_MIN_ROOM 16384u
#define READ_MAX_LINE (64u << 20) /* a reply longer than this is a protocol error */
#define REF_CACHE_BYTES (64u << 20)
#define MAX_LOST_IN_ROW 3

enum sess_state {
    S_IDLE,      /* nothing on the server; next: start */
    S_STARTING,  /* start in flight */
    S_ACTIVE,    /* open on the server, nothing in flight; next: step or finish */
    S_STEPPING,  /* steps (or INCRs) in flight, at most --session-pipeline */
    S_FINISHING, /* finish in flight */
    S_DONE,      /* the run is over for this session */
};

enum op { OP_START, OP_STEP, OP_FINISH, OP_INCR, OP_AUTH };

enum conn_state { C_NEW, C_CONNECTING, C_OPEN, C_CLOSING, C_DONE };

typedef struct session {
    uint8_t state;
    uint8_t opened_once;
    uint8_t queued;      /* in the ready ring */
    uint32_t inflight;   /* requests written and not yet answered */
    uint32_t sent;       /* steps asked for in this life (written) */
    uint32_t steps_done; /* steps answered in this life: the next reply's position */
    uint32_t target;     /* steps in this life of the session */
    uint32_t entries;
    ref_t *ref;         /* --verify: the uncached reference for this prompt */
    int64_t redis_last; /* Redis --verify: last INCR value, 0 if unknown */
} session_t;

typedef struct pending {
    uint32_t sess;
    uint8_t op;
    uint32_t n; /* steps asked for */
    uint64_t sent_ns;
    uint64_t tag;
} pending_t;

typedef struct conn {
    uv_tcp_t tcp; /* first: the handle's address is the connection's */
    uv_connect_t connect_req;
    uv_write_t write_req;
    worker_t *w;
    uint32_t index; /* global connection number */
    uint8_t state;
    bool writing;   /* write_req in flight, holding wbuf */
    bool reconnect; /* connect again once closed */
    bool in_pump;
    uint32_t lost_in_row;

    uint32_t nsess;
    session_t *sess;
    int64_t *prompts; /* nsess * prompt_len */

    uint32_t *ready; /* ring of sessions ready for their next request */
    uint32_t ready_head;
    uint32_t ready_count;

    pending_t *pend; /* ring of requests written, in order; capacity -P */
    uint32_t pend_head;
    uint32_t pend_count;

    char *rbuf; /* bytes read: [rstart, rend) not yet consumed */
    size_t rcap;
    size_t rstart;
    size_t rend;

    char *obuf; /* requests being built */
    size_t olen;
    size_t ocap;
    char *wbuf; /* requests being written (while `writing`) */
    size_t wcap;

    uint64_t tag_next;
} conn_t;

struct worker {
    const bench_config_t *cfg;
    bench_ctl_t *ctl;
    uint32_t index;
    uv_thread_t thread;
    bool started;
    bool loop_ready;
    uv_loop_t loop;
    uv_async_t wake;
    bool wake_closed;

    conn_t *conns;
    uint32_t nconns;
    uint32_t conns_live; /* not C_DONE */
    uint32_t conns_open; /* C_OPEN */

    uint64_t rng;
    ref_cache_t *refs;
    bool measuring;
    bool stopping;
    uint64_t cpu_mark;

    bench_stats_t st;
    char fatal[256];

    _Atomic uint64_t p_steps;
    _Atomic uint64_t p_requests;
    _Atomic uint64_t p_errors;
    _Atomic uint32_t p_open;
    _Atomic int done;
};

static void pump(conn_t *c);
static void conn_connect(conn_t *c);

/* ---- small helpers ---- */

static uint64_t rng_next(worker_t *w)
{
    uint64_t z = (w->rng += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static double rng_unit(worker_t *w)
{
    return (double)(rng_next(w) >> 11) * 0x1.0p-53;
}

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) {
        return 0;
    }
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static char *put_u64(char *p, uint64_t v)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    while (n > 0) {
        *p++ = tmp[--n];
    }
    return p;
}

static char *put_str(char *p, const char *s, size_t n)
{
    memcpy(p, s, n);
    return p + n;
}

#define PUT_LIT(p, lit) put_str((p), (lit), sizeof(lit) - 1)

void bench_codes_add(bench_codes_t *c, const char *code, size_t len, uint64_t n)
{
    uint32_t i;

    if (len >= sizeof(c->name[0])) {
        len = sizeof(c->name[0]) - 1;
    }
    for (i = 0; i < c->n; i++) {
        if (strlen(c->name[i]) == len && memcmp(c->name[i], code, len) == 0) {
            c->count[i] += n;
            return;
        }
    }
    if (c->n == BENCH_MAX_CODES - 1 && !(len == 5 && memcmp(code, "other", 5) == 0)) {
        bench_codes_add(c, "other", 5, n); /* the last slot collects the rest */
        return;
    }
    memcpy(c->name[c->n], code, len);
    c->name[c->n][len] = '\0';
    c->count[c->n] = n;
    c->n++;
}

/* A diagnostic line on stderr, at most --max-report of them in the run. */
static void report(worker_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void report(worker_t *w, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    int k = atomic_fetch_add_explicit(&w->ctl->printed_reports, 1, memory_order_relaxed);

    if ((uint32_t)k >= w->cfg->max_report) {
        if ((uint32_t)k == w->cfg->max_report) {
            fprintf(stderr, "slotd-bench: further reports suppressed (--max-report %u)\n",
                    w->cfg->max_report);
        }
        return;
    }
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "slotd-bench: %s\n", line);
}

static void worker_begin_stop(worker_t *w);

static void worker_fatal(worker_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void worker_fatal(worker_t *w, const char *fmt, ...)
{
    va_list ap;

    if (w->fatal[0] == '\0') {
        va_start(ap, fmt);
        vsnprintf(w->fatal, sizeof(w->fatal), fmt, ap);
        va_end(ap);
    }
    atomic_store(&w->ctl->fatal, 1);
    atomic_store(&w->ctl->phase, PHASE_STOP);
    worker_begin_stop(w);
}

static bool in_window(const worker_t *w)
{
    return w->measuring && !w->stopping;
}

static void publish_progress(worker_t *w)
{
    atomic_store_explicit(&w->p_steps, w->st.steps, memory_order_relaxed);
    atomic_store_explicit(&w->p_requests, w->st.requests, memory_order_relaxed);
    atomic_store_explicit(&w->p_errors, w->st.errors, memory_order_relaxed);
    atomic_store_explicit(&w->p_open, w->conns_open, memory_order_relaxed);
}

/* ---- rings ---- */

static void ready_push(conn_t *c, uint32_t i)
{
    uint32_t at = c->ready_head + c->ready_count;
    if (at >= c->nsess) {
        at -= c->nsess;
    }
    c->sess[i].queued = 1;
    c->ready[at] = i;
    c->ready_count++;
}

/* For a session that must go next: in --live-sessions mode a finished
 * session restarts at once, so that N sessions stay open. */
static void ready_push_front(conn_t *c, uint32_t i)
{
    c->sess[i].queued = 1;
    c->ready_head = c->ready_head == 0 ? c->nsess - 1 : c->ready_head - 1;
    c->ready[c->ready_head] = i;
    c->ready_count++;
}

static uint32_t ready_pop(conn_t *c)
{
    uint32_t i = c->ready[c->ready_head];
    if (++c->ready_head == c->nsess) {
        c->ready_head = 0;
    }
    c->ready_count--;
    c->sess[i].queued = 0;
    return i;
}

/* Whether session `i` may write its next request now: a start only when
 * nothing of it is in flight, a step or finish while fewer than
 * --session-pipeline requests are. */
static bool sess_can_send(const conn_t *c, uint32_t i)
{
    const session_t *s = &c->sess[i];

    switch (s->state) {
    case S_IDLE:
        return s->inflight == 0;
    case S_ACTIVE:
    case S_STEPPING:
        return s->inflight < c->w->cfg->sess_pipeline;
    default:
        return false;
    }
}

/* After a reply: the session goes back into the ready ring (at the back, or
 * with `front` at the front) unless it is there already or may not write. */
static void sess_requeue(conn_t *c, uint32_t i, bool front)
{
    if (c->sess[i].queued || !sess_can_send(c, i)) {
        return;
    }
    if (front) {
        ready_push_front(c, i);
    } else {
        ready_push(c, i);
    }
}

static pending_t *pend_push(conn_t *c)
{
    uint32_t cap = c->w->cfg->pipeline;
    uint32_t at = c->pend_head + c->pend_count;
    if (at >= cap) {
        at -= cap;
    }
    c->pend_count++;
    return &c->pend[at];
}

static pending_t pend_pop(conn_t *c)
{
    pending_t p = c->pend[c->pend_head];
    if (++c->pend_head == c->w->cfg->pipeline) {
        c->pend_head = 0;
    }
    c->pend_count--;
    return p;
}

/* ---- connection life ---- */

static void session_drop_ref(worker_t *w, session_t *s)
{
    if (s->ref != NULL) {
        ref_put(w->refs, s->ref);
        s->ref = NULL;
    }
}

/* Forgets everything the server held for this connection's sessions. */
static void conn_forget_sessions(conn_t *c, bool done)
{
    worker_t *w = c->w;

    for (uint32_t i = 0; i < c->nsess; i++) {
        session_t *s = &c->sess[i];
        session_drop_ref(w, s);
        if (done) {
            s->state = S_DONE;
        } else if (s->state != S_DONE) {
            s->state = w->cfg->redis ? S_ACTIVE : S_IDLE;
        }
        s->steps_done = 0;
        s->sent = 0;
        s->inflight = 0;
        s->queued = 0;
        s->entries = 0;
        s->redis_last = 0;
    }
    c->ready_count = 0;
    c->ready_head = 0;
    c->pend_count = 0;
    c->pend_head = 0;
}

static void maybe_finish_worker(worker_t *w)
{
    if (w->stopping && w->conns_live == 0 && !w->wake_closed) {
        w->wake_closed = true;
        uv_close((uv_handle_t *)&w->wake, NULL);
    }
}

static void on_closed(uv_handle_t *h)
{
    conn_t *c = container_of(h, conn_t, tcp);
    worker_t *w = c->w;

    if (c->reconnect && !w->stopping) {
        w->st.reconnects++;
        conn_connect(c);
        return;
    }
    conn_forget_sessions(c, true);
    c->state = C_DONE;
    w->conns_live--;
    publish_progress(w);
    maybe_finish_worker(w);
}

/* Closes the connection: gracefully (FIN) or abruptly (RST, SO_LINGER 0).
 * With `reconnect`, a new connection with fresh sessions follows unless the
 * run is stopping by then. */
static void conn_close(conn_t *c, bool reset, bool reconnect)
{
    worker_t *w = c->w;

    if (c->state == C_CLOSING || c->state == C_DONE) {
        return;
    }
    if (c->state == C_OPEN) {
        w->conns_open--;
        uv_read_stop((uv_stream_t *)&c->tcp);
    }
    c->state = C_CLOSING;
    c->reconnect = reconnect;
    conn_forget_sessions(c, false);
    if (!reset || uv_tcp_close_reset(&c->tcp, on_closed) != 0) {
        uv_close((uv_handle_t *)&c->tcp, on_closed);
    }
}

/* The connection went away, or became unusable, without our asking. */
static void conn_lost(conn_t *c, const char *why)
{
    worker_t *w = c->w;
    bool expected = w->stopping && c->pend_count == 0;

    if (!expected) {
        w->st.conn_errors++;
        report(w, "connection %u lost: %s (%u requests outstanding)", c->index, why, c->pend_count);
        if (++c->lost_in_row >= MAX_LOST_IN_ROW) {
            conn_close(c, false, false);
            worker_fatal(w, "connection %u lost %u times in a row: %s", c->index, c->lost_in_row,
                         why);
            return;
        }
    }
    conn_close(c, false, !w->stopping);
}

static void on_write(uv_write_t *req, int status)
{
    conn_t *c = container_of(req, conn_t, write_req);

    c->writing = false;
    if (status == UV_ECANCELED || c->state != C_OPEN) {
        return;
    }
    if (status < 0) {
        conn_lost(c, uv_strerror(status));
        return;
    }
    pump(c);
}

static void flush(conn_t *c)
{
    uv_buf_t b;
    char *tmp;
    size_t cap;
    int rc;

    if (c->writing || c->olen == 0 || c->state != C_OPEN) {
        return;
    }
    tmp = c->wbuf;
    cap = c->wcap;
    c->wbuf = c->obuf;
    c->wcap = c->ocap;
    c->obuf = tmp;
    c->ocap = cap;
    b = uv_buf_init(c->wbuf, (unsigned)c->olen);
    c->olen = 0;
    rc = uv_write(&c->write_req, (uv_stream_t *)&c->tcp, &b, 1, on_write);
    if (rc != 0) {
        conn_lost(c, uv_strerror(rc));
        return;
    }
    c->writing = true;
}

static char *out_reserve(conn_t *c, size_t need)
{
    if (c->olen + need > c->ocap) {
        size_t cap = c->ocap * 2;
        char *p;
        while (cap < c->olen + need) {
            cap *= 2;
        }
        p = realloc(c->obuf, cap);
        if (p == NULL) {
            return NULL;
        }
        c->obuf = p;
        c->ocap = cap;
    }
    return c->obuf + c->olen;
}

/* ---- requests ---- */

static char *put_id(char *p, uint32_t i)
{
    p = PUT_LIT(p, "\"id\":\"s");
    p = put_u64(p, i);
    return PUT_LIT(p, "\"");
}

static char *put_tail(conn_t *c, char *p, pending_t *pd)
{
    if (c->w->cfg->verify) {
        pd->tag = c->tag_next++;
        p = PUT_LIT(p, ",\"tag\":");
        p = put_u64(p, pd->tag);
    }
    return PUT_LIT(p, "}\n");
}

static int send_start(conn_t *c, uint32_t i, uint64_t now)
{
    worker_t *w = c->w;
    const bench_config_t *cfg = w->cfg;
    session_t *s = &c->sess[i];
    int64_t *prompt = c->prompts + (size_t)i * cfg->prompt_len;
    size_t mlen = strlen(cfg->model_name);
    pending_t *pd;
    char *p;

    /* --shared-prefix: the common tokens, then this session's own. */
    for (uint32_t k = 0; k < cfg->prompt_len; k++) {
        prompt[k] = k < cfg->shared_prefix ? cfg->shared_toks[k]
                                           : (int64_t)(rng_next(w) % cfg->vocab);
    }
    s->steps_done = 0;
    s->sent = 0;
    s->entries = 0;
    s->target = cfg->steps;
    if (cfg->live_sessions > 0 && !s->opened_once) {
        /* Cut the first life short at random, so that the sessions do not
         * finish and restart in one wave, all together, every -n steps. */
        s->target = 1 + (uint32_t)(rng_next(w) % cfg->steps);
    }
    if (cfg->verify) {
        char err[256];
        s->ref = ref_get(w->refs, prompt, cfg->prompt_len, cfg->steps, err, sizeof(err));
        if (s->ref == NULL) {
            worker_fatal(w, "%s", err);
            return -1;
        }
    }
    p = out_reserve(c, 96 + mlen + (size_t)cfg->prompt_len * 21);
    if (p == NULL) {
        worker_fatal(w, "out of memory");
        return -1;
    }
    p = PUT_LIT(p, "{\"op\":\"start\",");
    p = put_id(p, i);
    p = PUT_LIT(p, ",\"model\":\"");
    p = put_str(p, cfg->model_name, mlen);
    p = PUT_LIT(p, "\",\"prompt\":[");
    for (uint32_t k = 0; k < cfg->prompt_len; k++) {
        if (k > 0) {
            *p++ = ',';
        }
        p = put_u64(p, (uint64_t)prompt[k]);
    }
    *p++ = ']';
    pd = pend_push(c);
    *pd = (pending_t){.sess = i, .op = OP_START, .n = 0, .sent_ns = now};
    p = put_tail(c, p, pd);
    c->olen = (size_t)(p - c->obuf);
    s->state = S_STARTING;
    s->inflight++;
    return 0;
}

static int send_step(conn_t *c, uint32_t i, uint64_t now)
{
    const bench_config_t *cfg = c->w->cfg;
    session_t *s = &c->sess[i];
    uint32_t k = s->target - s->sent;
    pending_t *pd;
    char *p;

    if (k > cfg->step_n) {
        k = cfg->step_n;
    }
    p = out_reserve(c, 96 + sizeof(cfg->decode));
    if (p == NULL) {
        worker_fatal(c->w, "out of memory");
        return -1;
    }
    p = PUT_LIT(p, "{\"op\":\"step\",");
    p = put_id(p, i);
    if (cfg->step_n > 1) {
        p = PUT_LIT(p, ",\"n\":");
        p = put_u64(p, k);
    }
    if (cfg->decode[0] != '\0') {
        size_t n = strlen(cfg->decode);
        memcpy(p, cfg->decode, n);
        p += n;
    }
    pd = pend_push(c);
    *pd = (pending_t){.sess = i, .op = OP_STEP, .n = k, .sent_ns = now};
    p = put_tail(c, p, pd);
    c->olen = (size_t)(p - c->obuf);
    s->state = S_STEPPING;
    s->sent += k;
    s->inflight++;
    return 0;
}

static int send_finish(conn_t *c, uint32_t i, uint64_t now)
{
    session_t *s = &c->sess[i];
    pending_t *pd;
    char *p = out_reserve(c, 96);

    if (p == NULL) {
        worker_fatal(c->w, "out of memory");
        return -1;
    }
    p = PUT_LIT(p, "{\"op\":\"finish\",");
    p = put_id(p, i);
    pd = pend_push(c);
    *pd = (pending_t){.sess = i, .op = OP_FINISH, .n = 0, .sent_ns = now};
    p = put_tail(c, p, pd);
    c->olen = (size_t)(p - c->obuf);
    s->state = S_FINISHING;
    s->inflight++;
    return 0;
}

static int send_incr(conn_t *c, uint32_t i, uint64_t now)
{
    session_t *s = &c->sess[i];
    pending_t *pd;
    char *p = out_reserve(c, 64);

    if (p == NULL) {
        worker_fatal(c->w, "out of memory");
        return -1;
    }
    p = PUT_LIT(p, "INCR slotd-bench:");
    p = put_u64(p, c->index);
    *p++ = ':';
    p = put_u64(p, i);
    p = PUT_LIT(p, "\r\n");
    c->olen = (size_t)(p - c->obuf);
    pd = pend_push(c);
    *pd = (pending_t){.sess = i, .op = OP_INCR, .n = 1, .sent_ns = now};
    s->state = S_STEPPING;
    s->inflight++;
    return 0;
}

/* Takes one request from the --requests budget; false when it is spent. */
static bool budget_take(worker_t *w)
{
    if (w->cfg->requests == 0 || !w->measuring) {
        return true;
    }
    if (atomic_fetch_sub_explicit(&w->ctl->budget, 1, memory_order_relaxed) > 0) {
        return true;
    }
    atomic_store(&w->ctl->phase, PHASE_STOP);
    worker_begin_stop(w);
    return false;
}

/* Fills the pipeline from the ready sessions, then writes. */
static void pump(conn_t *c)
{
    worker_t *w = c->w;
    const bench_config_t *cfg = w->cfg;
    uint64_t now;

    if (c->state != C_OPEN || c->in_pump) {
        return;
    }
    c->in_pump = true;
    now = uv_hrtime();
    while (c->pend_count < cfg->pipeline && c->ready_count > 0 && c->state == C_OPEN) {
        uint32_t i = ready_pop(c);
        session_t *s = &c->sess[i];
        int rc = 0;

        if (!w->stopping) {
            (void)budget_take(w);
        }
        if (cfg->redis) {
            if (w->stopping) {
                s->state = S_DONE;
                continue;
            }
            rc = send_incr(c, i, now);
        } else if (s->state == S_IDLE) {
            if (w->stopping) {
                s->state = S_DONE;
                continue;
            }
            rc = send_start(c, i, now);
        } else if (s->state == S_ACTIVE || s->state == S_STEPPING) {
            /* S_STEPPING here: steps in flight, fewer than --session-pipeline. */
            if (w->stopping || s->sent >= s->target) {
                rc = send_finish(c, i, now);
            } else {
                rc = send_step(c, i, now);
            }
        } else {
            abort(); /* only idle and open sessions are ever ready */
        }
        if (rc != 0) {
            s->state = S_DONE;
        } else if (sess_can_send(c, i)) {
            ready_push(c, i); /* --session-pipeline: its next request, after the others' */
        }
    }
    c->in_pump = false;
    flush(c);
    if (w->stopping && c->state == C_OPEN && c->pend_count == 0 && !c->writing) {
        conn_close(c, false, false);
    }
}

/* ---- replies ---- */

static void fmt_prompt(const conn_t *c, uint32_t i, char *buf, size_t len)
{
    const bench_config_t *cfg = c->w->cfg;
    const int64_t *prompt = c->prompts + (size_t)i * cfg->prompt_len;
    size_t at = 0;

    buf[0] = '\0';
    for (uint32_t k = 0; k < cfg->prompt_len && at + 24 < len; k++) {
        at +=
            (size_t)snprintf(buf + at, len - at, "%s%lld", k > 0 ? "," : "", (long long)prompt[k]);
    }
    if (at + 24 >= len) {
        snprintf(buf + at, len - at, ",...");
    }
}

/* Records a mismatch: `step` is the 1-based step of the session (0 for a
 * start or finish reply), `what` the field. */
static void mismatch(conn_t *c, uint32_t i, uint32_t step, const char *what, const char *expected,
                     const char *got, size_t got_len)
{
    char prompt[256];

    c->w->st.mismatches++;
    if (got == NULL) {
        got = "(absent)";
        got_len = 8;
    }
    fmt_prompt(c, i, prompt, sizeof(prompt));
    report(c->w, "MISMATCH connection %u session s%u prompt [%s] step %u %s: expected %s, got %.*s",
           c->index, i, prompt, step, what, expected, (int)(got_len > 300 ? 300 : got_len), got);
}

static void check_int(conn_t *c, uint32_t i, uint32_t step, const char *what, span_t got,
                      int64_t want)
{
    int64_t v;
    char exp[32];

    if (scan_int(got, &v) == 0 && v == want) {
        return;
    }
    snprintf(exp, sizeof(exp), "%lld", (long long)want);
    mismatch(c, i, step, what, exp, got.p, got.n);
}

static void check_id(conn_t *c, uint32_t i, uint32_t step, span_t got)
{
    char exp[16];
    snprintf(exp, sizeof(exp), "s%u", i);
    if (!scan_eq(got, exp)) {
        mismatch(c, i, step, "id", exp, got.p, got.n);
    }
}

static void verify_step(conn_t *c, uint32_t i, const pending_t *pd, const scan_reply_t *r)
{
    worker_t *w = c->w;
    session_t *s = &c->sess[i];
    const ref_t *ref = s->ref;
    uint32_t first = s->steps_done; /* 0-based pick of the first token in this reply */
    scan_iter_t it;
    span_t e;
    uint32_t j = 0;
    char what[64];
    char exp[32];

    check_id(c, i, first + 1, r->id);
    check_int(c, i, first + pd->n, "entries", r->entries, (int64_t)s->entries + pd->n);
    if (w->cfg->samples) /* the reference is greedy: the sampled picks are not its */
        return;

    if (scan_iter_init(&it, r->tokens) != 0) {
        mismatch(c, i, first + 1, "tokens", "an array", r->tokens.p, r->tokens.n);
    } else {
        int more;
        while ((more = scan_iter_next(&it, &e)) == 1 && j < pd->n) {
            int64_t v;
            uint32_t want = ref->tokens[first + j];
            w->st.checked_tokens++;
            if (scan_int(e, &v) != 0 || v != (int64_t)want) {
                snprintf(exp, sizeof(exp), "%u", want);
                mismatch(c, i, first + j + 1, "token", exp, e.p, e.n);
            }
            j++;
        }
        if (more != 0 || j != pd->n) {
            snprintf(exp, sizeof(exp), "%u tokens", pd->n);
            mismatch(c, i, first + 1, "tokens", exp, r->tokens.p, r->tokens.n);
        }
    }

    if (!w->cfg->scores_all) { /* --scores none or K: no logits member */
        if (r->logits.p != NULL)
            mismatch(c, i, first + 1, "logits", "(absent under --scores)", r->logits.p,
                     r->logits.n);
        return;
    }
    if (!w->cfg->has_logits) {
        if (r->logits.p != NULL) {
            mismatch(c, i, first + 1, "logits", "(absent for a hash model)", r->logits.p,
                     r->logits.n);
        }
        return;
    }
    if (scan_iter_init(&it, r->logits) != 0) {
        mismatch(c, i, first + 1, "logits", "an array of arrays", r->logits.p, r->logits.n);
        return;
    }
    for (j = 0; j < pd->n; j++) {
        scan_iter_t row;
        span_t rs;
        uint32_t k = 0;
        int more;

        if (scan_iter_next(&it, &rs) != 1 || scan_iter_init(&row, rs) != 0) {
            snprintf(exp, sizeof(exp), "%u rows of logits", pd->n);
            mismatch(c, i, first + j + 1, "logits", exp, r->logits.p, r->logits.n);
            return;
        }
        while ((more = scan_iter_next(&row, &e)) == 1 && k < ref->vocab) {
            const char *want = ref->text + ref->offsets[(size_t)(first + j) * ref->vocab + k];
            w->st.checked_logits++;
            if (strlen(want) != e.n || memcmp(want, e.p, e.n) != 0) {
                snprintf(what, sizeof(what), "logits[%u]", k);
                mismatch(c, i, first + j + 1, what, want, e.p, e.n);
            }
            k++;
        }
        if (more != 0 || k != ref->vocab) {
            snprintf(exp, sizeof(exp), "%u logits", ref->vocab);
            mismatch(c, i, first + j + 1, "logits", exp, rs.p, rs.n);
        }
    }
    if (scan_iter_next(&it, &e) != 0) {
        snprintf(exp, sizeof(exp), "%u rows of logits", pd->n);
        mismatch(c, i, first + 1, "logits", exp, r->logits.p, r->logits.n);
    }
}

static void count_error(worker_t *w, const char *code, size_t len)
{
    w->st.errors++;
    if (in_window(w)) {
        w->st.win_errors++;
    }
    bench_codes_add(&w->st.codes, code, len, 1);
}

static const char *op_name(int op)
{
    switch (op) {
    case OP_START:
        return "start";
    case OP_STEP:
        return "step";
    case OP_FINISH:
        return "finish";
    case OP_AUTH:
        return "auth";
    default:
        return "INCR";
    }
}

/* Returns true if the connection was closed (nothing more to read). */
static bool maybe_disconnect(conn_t *c)
{
    worker_t *w = c->w;

    if (w->cfg->disconnect_rate <= 0.0 || w->stopping || rng_unit(w) >= w->cfg->disconnect_rate) {
        return false;
    }
    w->st.disconnects++;
    conn_close(c, true, true);
    return true;
}

static bool handle_redis(conn_t *c, const pending_t *pd, const char *line, size_t len)
{
    worker_t *w = c->w;
    session_t *s = &c->sess[pd->sess];

    if (s->inflight == 0) {
        s->state = S_ACTIVE;
    }
    if (len > 0 && line[0] == ':') {
        int64_t v;
        span_t sp = {line + 1, len - 1};
        if (scan_int(sp, &v) != 0) {
            w->st.protocol_errors++;
            report(w, "connection %u: unreadable Redis reply '%.*s'", c->index,
                   (int)(len > 200 ? 200 : len), line);
        } else {
            if (w->cfg->verify) {
                w->st.checked_tokens++;
                if (s->redis_last != 0 && v != s->redis_last + 1) {
                    char exp[32];
                    snprintf(exp, sizeof(exp), "%lld", (long long)(s->redis_last + 1));
                    mismatch(c, pd->sess, 0, "INCR value", exp, sp.p, sp.n);
                }
                s->redis_last = v;
            }
            w->st.steps++;
            if (in_window(w)) {
                w->st.win_steps++;
            }
        }
    } else if (len > 0 && line[0] == '-') {
        size_t n = 1;
        while (n < len && line[n] != ' ') {
            n++;
        }
        count_error(w, line + 1, n - 1);
        report(w, "connection %u: Redis error '%.*s'", c->index, (int)(len > 200 ? 200 : len),
               line);
    } else {
        w->st.protocol_errors++;
        report(w, "connection %u: unexpected Redis reply '%.*s'", c->index,
               (int)(len > 200 ? 200 : len), line);
    }
    sess_requeue(c, pd->sess, false);
    return maybe_disconnect(c);
}

/* One reply line.  Returns true if the connection was closed. */
static bool handle_line(conn_t *c, const char *line, size_t len, uint64_t now)
{
    worker_t *w = c->w;
    const bench_config_t *cfg = w->cfg;
    scan_reply_t r;
    pending_t pd;
    session_t *s;
    uint64_t us;
    int parsed;

    parsed = cfg->redis ? -1 : scan_reply(line, len, &r);
    if (parsed == 0 && r.has_error && scan_eq(r.error_code, "too_many_connections")) {
        /* The one line that answers no request: the daemon turns the
         * connection away.  The run cannot have the connections it asks
         * for, so it ends. */
        count_error(w, r.error_code.p, r.error_code.n);
        conn_close(c, false, false);
        worker_fatal(w,
                     "the daemon turned connection %u away: too_many_connections (is its "
                     "--max-connections below -c?)",
                     c->index);
        return true;
    }
    if (parsed == 0 && r.has_error &&
        (scan_eq(r.error_code, "auth_required") || scan_eq(r.error_code, "auth_failed"))) {
        bool required = scan_eq(r.error_code, "auth_required");
        count_error(w, r.error_code.p, r.error_code.n);
        conn_close(c, false, false);
        if (required) {
            worker_fatal(w,
                         "the daemon wants a token (auth_required on connection %u): give "
                         "--auth-token-file PATH or set SLOTD_AUTH_TOKEN_FILE",
                         c->index);
        } else {
            worker_fatal(w,
                         "the daemon refused the token (auth_failed on connection %u): is it "
                         "the daemon's own --auth-token-file?",
                         c->index);
        }
        return true;
    }
    if (c->pend_count == 0) {
        if (parsed == 0 && r.has_error && r.error_code.p != NULL) {
            count_error(w, r.error_code.p, r.error_code.n);
        } else {
            w->st.protocol_errors++;
        }
        report(w, "connection %u: a line that answers no request: %.*s", c->index,
               (int)(len > 300 ? 300 : len), line);
        return false;
    }
    pd = pend_pop(c);
    if (pd.op == OP_AUTH) {
        /* Not a request of the run: neither counted nor timed. */
        if (parsed != 0 || r.has_error || !scan_eq(r.ok, "true")) {
            w->st.protocol_errors++;
            conn_close(c, false, false);
            worker_fatal(w, "connection %u: auth answered '%.*s'", c->index,
                         (int)(len > 200 ? 200 : len), line);
            return true;
        }
        return false;
    }
    s = &c->sess[pd.sess];
    s->inflight--;
    us = now > pd.sent_ns ? (now - pd.sent_ns + 500) / 1000 : 0;
    c->lost_in_row = 0;
    w->st.requests++;
    if (in_window(w)) {
        w->st.win_requests++;
        hist_record(&w->st.win_req_lat, us);
        if (pd.op == OP_STEP || pd.op == OP_INCR) {
            hist_record(&w->st.win_step_lat, us);
        }
    }
    if (cfg->redis) {
        return handle_redis(c, &pd, line, len);
    }

    if (cfg->verify && parsed == 0) {
        cJSON *j = cJSON_ParseWithLength(line, len);
        if (j == NULL || !cJSON_IsObject(j)) {
            parsed = -1;
        }
        cJSON_Delete(j);
    }
    if (parsed != 0) {
        w->st.protocol_errors++;
        report(w, "connection %u session s%u: %s reply is not a JSON object: %.*s", c->index,
               pd.sess, op_name(pd.op), (int)(len > 300 ? 300 : len), line);
        /* The session's state on the server is unknown: finish it if it may
         * be open, forget it otherwise.  No step of it is checked again. */
        if (pd.op == OP_FINISH) {
            s->state = S_IDLE;
        } else {
            if (pd.op == OP_START || s->inflight == 0) {
                s->state = S_ACTIVE; /* unless a finish is in flight behind it */
            }
            s->sent = s->target;
            if (pd.op == OP_START) {
                s->entries = cfg->prompt_len;
            }
        }
        session_drop_ref(w, s);
        sess_requeue(c, pd.sess, false);
        return false;
    }
    if (cfg->verify) {
        char exp[32];
        snprintf(exp, sizeof(exp), "%llu", (unsigned long long)pd.tag);
        if (!scan_eq(r.tag, exp)) {
            mismatch(c, pd.sess, 0, "tag (reply order)", exp, r.tag.p, r.tag.n);
        }
    }

    if (r.has_error) {
        const char *code = r.error_code.p != NULL ? r.error_code.p : "?";
        size_t clen = r.error_code.p != NULL ? r.error_code.n : 1;
        count_error(w, code, clen);
        if (cfg->verify) {
            report(w, "connection %u session s%u: %s answered with error %.*s: %.*s", c->index,
                   pd.sess, op_name(pd.op), (int)clen, code,
                   (int)(r.error_msg.n > 200 ? 200 : r.error_msg.n),
                   r.error_msg.p != NULL ? r.error_msg.p : "");
        }
        switch (pd.op) {
        case OP_START:
        case OP_FINISH:
            s->state = S_IDLE;
            session_drop_ref(w, s);
            break;
        default: /* a failed step leaves the session as it was: finish it */
            if (s->state == S_STEPPING && s->inflight == 0) {
                s->state = S_ACTIVE;
            }
            s->sent = s->target; /* steps still in flight are answered and checked */
            break;
        }
        sess_requeue(c, pd.sess, false);
        return false;
    }

    switch (pd.op) {
    case OP_START: {
        int64_t cached = 0;
        if (r.cached.n > 0 && scan_int(r.cached, &cached) != 0) {
            cached = -1;
        }
        if (cfg->verify) {
            check_id(c, pd.sess, 0, r.id);
            check_int(c, pd.sess, 0, "entries", r.entries, cfg->prompt_len);
            /* The last prompt position is always computed (docs/protocol.md). */
            if (cached < 0 || cached >= (int64_t)cfg->prompt_len) {
                char exp[48];
                snprintf(exp, sizeof(exp), "0 to %u", cfg->prompt_len - 1);
                mismatch(c, pd.sess, 0, "cached", exp, r.cached.p, r.cached.n);
            }
            if (!scan_eq(r.model, cfg->model_name)) {
                mismatch(c, pd.sess, 0, "model", cfg->model_name, r.model.p, r.model.n);
            }
        }
        if (cached > 0) {
            w->st.cached_entries += (uint64_t)cached;
        }
        w->st.prompt_entries += cfg->prompt_len;
        s->state = S_ACTIVE;
        s->entries = cfg->prompt_len;
        w->st.starts++;
        if (!s->opened_once) {
            s->opened_once = 1;
            atomic_fetch_add_explicit(&w->ctl->live_open, 1, memory_order_relaxed);
        }
        break;
    }
    case OP_STEP:
        if (cfg->verify && s->ref != NULL) {
            verify_step(c, pd.sess, &pd, &r);
        }
        if (s->state == S_STEPPING && s->inflight == 0) {
            s->state = S_ACTIVE; /* not when a finish is in flight behind it */
        }
        s->steps_done += pd.n;
        s->entries += pd.n;
        w->st.steps += pd.n;
        if (in_window(w)) {
            w->st.win_steps += pd.n;
        }
        sess_requeue(c, pd.sess, false);
        return maybe_disconnect(c);
    case OP_FINISH:
        if (cfg->verify) {
            check_id(c, pd.sess, 0, r.id);
            check_int(c, pd.sess, 0, "released", r.released, s->entries);
        }
        s->state = S_IDLE;
        session_drop_ref(w, s);
        w->st.finishes++;
        if (cfg->live_sessions > 0) {
            sess_requeue(c, pd.sess, true);
            return false;
        }
        break;
    default:
        abort();
    }
    sess_requeue(c, pd.sess, false);
    return false;
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf)
{
    conn_t *c = container_of(h, conn_t, tcp);

    if (c->rstart == c->rend) {
        c->rstart = c->rend = 0;
    }
    if (c->rcap - c->rend < READ_MIN_ROOM && c->rstart > 0) {
        memmove(c->rbuf, c->rbuf + c->rstart, c->rend - c->rstart);
        c->rend -= c->rstart;
        c->rstart = 0;
    }
    if (c->rcap - c->rend < READ_MIN_ROOM && c->rcap < READ_MAX_LINE) {
        char *p = realloc(c->rbuf, c->rcap * 2);
        if (p != NULL) {
            c->rbuf = p;
            c->rcap *= 2;
        }
    }
    *buf = uv_buf_init(c->rbuf + c->rend, (unsigned)(c->rcap - c->rend));
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    conn_t *c = container_of(stream, conn_t, tcp);
    worker_t *w = c->w;
    uint64_t now;

    if (nread == 0) {
        return;
    }
    if (nread < 0) {
        conn_lost(c, nread == UV_EOF ? "closed by the server" : uv_strerror((int)nread));
        publish_progress(w);
        return;
    }
    c->rend += (size_t)nread;
    now = uv_hrtime();
    while (c->state == C_OPEN) {
        char *start = c->rbuf + c->rstart;
        char *nl = memchr(start, '\n', c->rend - c->rstart);
        size_t len;

        if (nl == NULL) {
            if (c->rend - c->rstart >= READ_MAX_LINE) {
                w->st.protocol_errors++;
                conn_lost(c, "a reply line longer than 64 MiB");
            }
            break;
        }
        len = (size_t)(nl - start);
        c->rstart += len + 1;
        if (len > 0 && start[len - 1] == '\r') {
            len--;
        }
        if (len == 0) {
            continue;
        }
        if (handle_line(c, start, len, now)) {
            break;
        }
    }
    if (c->state == C_OPEN) {
        pump(c);
    }
    publish_progress(w);
}

static void on_connect(uv_connect_t *req, int status)
{
    conn_t *c = container_of(req, conn_t, connect_req);
    worker_t *w = c->w;

    if (status == UV_ECANCELED) {
        return;
    }
    if (status < 0) {
        w->st.conn_errors++;
        c->reconnect = false;
        c->state = C_CLOSING;
        uv_close((uv_handle_t *)&c->tcp, on_closed);
        worker_fatal(w, "connect to %s:%u: %s", w->cfg->host, w->cfg->port, uv_strerror(status));
        return;
    }
    (void)uv_tcp_nodelay(&c->tcp, 1);
    c->state = C_OPEN;
    w->conns_open++;
    c->rstart = c->rend = 0;
    c->olen = 0;
    c->writing = false;
    c->pend_count = c->pend_head = 0;
    c->ready_count = c->ready_head = 0;
    for (uint32_t i = 0; i < c->nsess; i++) {
        if (c->sess[i].state != S_DONE) {
            ready_push(c, i);
        }
    }
    if (w->cfg->auth_line != NULL) {
        char *p = out_reserve(c, w->cfg->auth_line_len);
        if (p == NULL) {
            conn_close(c, false, false);
            worker_fatal(w, "out of memory");
            return;
        }
        memcpy(p, w->cfg->auth_line, w->cfg->auth_line_len);
        c->olen += w->cfg->auth_line_len;
        *pend_push(c) = (pending_t){.op = OP_AUTH, .sent_ns = uv_hrtime()};
    }
    status = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (status != 0) {
        conn_lost(c, uv_strerror(status));
        return;
    }
    pump(c);
    publish_progress(w);
}

static void conn_connect(conn_t *c)
{
    worker_t *w = c->w;
    int rc;

    rc = uv_tcp_init(&w->loop, &c->tcp);
    if (rc != 0) {
        c->state = C_DONE;
        w->conns_live--;
        worker_fatal(w, "uv_tcp_init: %s", uv_strerror(rc));
        return;
    }
    c->state = C_CONNECTING;
    rc = uv_tcp_connect(&c->connect_req, &c->tcp, (const struct sockaddr *)&w->cfg->addr,
                        on_connect);
    if (rc != 0) {
        w->st.conn_errors++;
        c->reconnect = false;
        c->state = C_CLOSING;
        uv_close((uv_handle_t *)&c->tcp, on_closed);
        worker_fatal(w, "connect to %s:%u: %s", w->cfg->host, w->cfg->port, uv_strerror(rc));
    }
}

/* ---- phases ---- */

static void worker_mark(worker_t *w)
{
    w->measuring = true;
    w->st.mark_ns = uv_hrtime();
    w->st.win_steps = 0;
    w->st.win_requests = 0;
    w->st.win_errors = 0;
    hist_reset(&w->st.win_step_lat);
    hist_reset(&w->st.win_req_lat);
    w->cpu_mark = thread_cpu_ns();
}

static void worker_begin_stop(worker_t *w)
{
    if (w->stopping) {
        return;
    }
    if (!w->measuring) {
        worker_mark(w);
    }
    w->stopping = true;
    w->st.freeze_ns = uv_hrtime();
    w->st.cpu_ns = thread_cpu_ns() - w->cpu_mark;
    for (uint32_t k = 0; k < w->nconns; k++) {
        pump(&w->conns[k]);
    }
    maybe_finish_worker(w);
}

static void on_wake(uv_async_t *a)
{
    worker_t *w = container_of(a, worker_t, wake);
    int phase = atomic_load(&w->ctl->phase);

    if (phase >= PHASE_MEASURE && !w->measuring) {
        worker_mark(w);
    }
    if (phase >= PHASE_STOP) {
        worker_begin_stop(w);
    }
}

static void worker_main(void *arg)
{
    worker_t *w = arg;

    for (uint32_t k = 0; k < w->nconns; k++) {
        conn_t *c = &w->conns[k];
        if (!w->stopping) {
            conn_connect(c);
        } else if (c->state == C_NEW) {
            /* A fatal error came first: this one is never opened. */
            conn_forget_sessions(c, true);
            c->state = C_DONE;
            w->conns_live--;
        }
    }
    maybe_finish_worker(w);
    on_wake(&w->wake); /* the phase may have moved before the loop ran */
    uv_run(&w->loop, UV_RUN_DEFAULT);
    if (w->refs != NULL) {
        ref_cache_counts(w->refs, &w->st.ref_hits, &w->st.ref_misses);
    }
    publish_progress(w);
    atomic_store(&w->done, 1);
}

/* ---- the interface ---- */

static void conn_free(conn_t *c)
{
    free(c->sess);
    free(c->prompts);
    free(c->ready);
    free(c->pend);
    free(c->rbuf);
    free(c->obuf);
    free(c->wbuf);
}

worker_t *worker_create(const bench_config_t *cfg, bench_ctl_t *ctl, uint32_t index, char *err,
                        size_t errlen)
{
    worker_t *w = calloc(1, sizeof(*w));
    uint32_t n = 0;

    if (w == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    w->cfg = cfg;
    w->ctl = ctl;
    w->index = index;
    w->rng = cfg->seed * UINT64_C(0x2545F4914F6CDD1D) + index;
    hist_reset(&w->st.win_step_lat);
    hist_reset(&w->st.win_req_lat);
    for (uint32_t i = index; i < cfg->conns; i += cfg->threads) {
        n++;
    }
    w->nconns = n;
    w->conns = calloc(n > 0 ? n : 1, sizeof(*w->conns));
    if (w->conns == NULL) {
        goto nomem;
    }
    for (uint32_t k = 0; k < n; k++) {
        conn_t *c = &w->conns[k];
        uint32_t i = index + k * cfg->threads;
        uint32_t ns = cfg->sessions;

        if (cfg->live_sessions > 0) {
            ns = (uint32_t)(cfg->live_sessions / cfg->conns +
                            (i < cfg->live_sessions % cfg->conns ? 1 : 0));
        }
        c->w = w;
        c->index = i;
        c->state = C_DONE;
        c->nsess = ns;
        c->sess = calloc(ns, sizeof(*c->sess));
        c->prompts = calloc((size_t)ns * cfg->prompt_len, sizeof(*c->prompts));
        c->ready = calloc(ns, sizeof(*c->ready));
        c->pend = calloc(cfg->pipeline, sizeof(*c->pend));
        c->rcap = 65536;
        c->rbuf = malloc(c->rcap);
        c->ocap = c->wcap = 4096;
        c->obuf = malloc(c->ocap);
        c->wbuf = malloc(c->wcap);
        if (c->sess == NULL || c->prompts == NULL || c->ready == NULL || c->pend == NULL ||
            c->rbuf == NULL || c->obuf == NULL || c->wbuf == NULL) {
            goto nomem;
        }
        for (uint32_t s = 0; s < ns; s++) {
            c->sess[s].state = cfg->redis ? S_ACTIVE : S_IDLE;
        }
        c->state = C_NEW;
        w->conns_live++;
    }
    if (cfg->verify && !cfg->redis) {
        if (ref_cache_create(cfg->model, REF_CACHE_BYTES, &w->refs) != 0) {
            goto nomem;
        }
    }
    if (uv_loop_init(&w->loop) != 0) {
        snprintf(err, errlen, "uv_loop_init failed");
        goto fail;
    }
    w->loop_ready = true;
    if (uv_async_init(&w->loop, &w->wake, on_wake) != 0) {
        snprintf(err, errlen, "uv_async_init failed");
        goto fail;
    }
    return w;

nomem:
    snprintf(err, errlen, "out of memory");
fail:
    worker_destroy(w);
    return NULL;
}

int worker_start(worker_t *w)
{
    int rc = uv_thread_create(&w->thread, worker_main, w);
    if (rc == 0) {
        w->started = true;
    }
    return rc;
}

void worker_wake(worker_t *w)
{
    (void)uv_async_send(&w->wake);
}

bool worker_done(worker_t *w)
{
    return atomic_load(&w->done) != 0;
}

void worker_progress(worker_t *w, uint64_t *steps, uint64_t *requests, uint64_t *errors,
                     uint32_t *open_conns)
{
    *steps = atomic_load_explicit(&w->p_steps, memory_order_relaxed);
    *requests = atomic_load_explicit(&w->p_requests, memory_order_relaxed);
    *errors = atomic_load_explicit(&w->p_errors, memory_order_relaxed);
    *open_conns = atomic_load_explicit(&w->p_open, memory_order_relaxed);
}

const char *worker_join(worker_t *w)
{
    if (w->started) {
        uv_thread_join(&w->thread);
        w->started = false;
    }
    return w->fatal[0] != '\0' ? w->fatal : NULL;
}

const bench_stats_t *worker_stats(const worker_t *w)
{
    return &w->st;
}

void worker_destroy(worker_t *w)
{
    if (w == NULL) {
        return;
    }
    if (w->loop_ready) {
        if (!w->wake_closed && w->wake.loop != NULL) {
            uv_close((uv_handle_t *)&w->wake, NULL);
        }
        uv_run(&w->loop, UV_RUN_NOWAIT);
        (void)uv_loop_close(&w->loop);
    }
    for (uint32_t k = 0; w->conns != NULL && k < w->nconns; k++) {
        for (uint32_t s = 0; w->conns[k].sess != NULL && s < w->conns[k].nsess; s++) {
            session_drop_ref(w, &w->conns[k].sess[s]);
        }
        conn_free(&w->conns[k]);
    }
    free(w->conns);
    ref_cache_destroy(w->refs);
    free(w);
}
