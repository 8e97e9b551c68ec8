/*
 * server.c: the daemon's life, from start-up to the end of a drain.  It
 * owns the loop and every handle that is not a connection's (listener,
 * signals, timers, the end-of-turn check, the admin port), the slot pool
 * and the worker pool (the models are models.c's); and this turn's batch
 * of jobs and of connections to write.  With --audit-rate above 0 it also owns the audit
 * (audit.h), created with the workers and freed after they are joined.
 * It sits on top of the other files of server/: it calls them, they reach
 * it only through conn_hooks_t.freed (docs/design.md, "server/ layout").
 *
 * DESIGN.  Everything here runs on the loop thread, so nothing here takes
 * a lock; the workers see only the request records submitted to them (see
 * job.c) and the immutable pointers of this struct (`pool`).  One
 * uv_check_t at the end of every loop turn starts the turn's writes and
 * submits its jobs in one batch.  The trim timer sheds the free lists of
 * records (req.c, session.c) that sat unused for a period.  The
 * session port is accepted by hand, with a reserve descriptor for running
 * out.  SIGTERM or SIGINT starts a drain, SIGHUP (and POST /tenants/reload)
 * rereads --tenants-file, or is logged and ignored without one; test builds
 * (SLOTD_FAULT_INJECTION) add a SIGUSR1 handle that releases a worker
 * wedged by --fault-wedge-after.
 *
 * Design: docs/design.md, "The loop thread".
 */
#define _GNU_SOURCE /* accept4 */
#include "server.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <malloc.h>

#include "server/admin/admin.h"
#include "conn_int.h"
#include "dispatch_int.h"
#include "evict_int.h"
#include "handshake_int.h"
#include "inspect_int.h"
#include "job_int.h"
#include "jobfault_int.h"
#include "launch_int.h"
#include "server/base/log.h"
#include "models_int.h"
#include "req_int.h"
#include "session_int.h"
#include "tenancy_int.h"

/* Accepting: connections taken per wake-up at most (the socket is polled
 * level-triggered: the rest come on the next turn); the least time between
 * two warnings about failed accepts; the pause when no descriptor is left
 * even to turn a connection away. */
#define ACCEPT_BATCH 64
#define ACCEPT_WARN_MS 10000
#define ACCEPT_PAUSE_MS 100

/* Every TRIM_MS the pool gives the kernel back the pages that have stayed
 * free since the last time, but for the TRIM_KEEP_BYTES most recently
 * freed (at most a sixteenth of the pool), kept for the next sessions. */
#define TRIM_MS 1000
#define TRIM_KEEP_BYTES ((uint64_t)4 << 20)

/* ---- The end of a loop turn ---- */

static void server_job_back(req_t *r)
{
    if (r->rq.op == PROTO_OP_STEP)
        metrics_step_back();
    dispatch__job_done(r);
}

/* Only makes a loop turn: flush_check_cb() ends it. */
static void hold_timer_cb(uv_timer_t *h)
{
    (void)h;
}

static void flush_check_cb(uv_check_t *h)
{
    server_t *s = container_of(h, server_t, flush_check);
    conn_t *c, *held = NULL;
    uint64_t now = 0, first = UINT64_MAX;

    /* Writes first: one that completes at once may let parked jobs go.
     * Output held back stays on the list for a later turn. */
    while ((c = s->dirty) != NULL) {
        s->dirty = c->dirty_next;
        if (conn__hold_output(c, &now)) {
            c->dirty_next = held;
            held = c;
            if (c->held_since < first)
                first = c->held_since;
            continue;
        }
        c->dirty = false;
        conn__write(c);
    }
    s->dirty = held;
    if (held != NULL && !uv_is_active((uv_handle_t *)&s->hold_timer)) {
        /* A turn by the end of the oldest hold.  libuv's timers count whole
         * milliseconds from the loop's clock, so the turn may come up to a
         * millisecond early; the hold then sets the timer again.  (While a
         * job is out the worker pool's timer makes turns too, but the
         * bound does not rest on another module's timer.) */
        uint64_t end = first + (uint64_t)s->cfg->reply_hold_us * 1000u;
        uint64_t ms = end > now ? (end - now + 999999u) / 1000000u : 0;
        uv_update_time(&s->loop);
        uv_timer_start(&s->hold_timer, hold_timer_cb, ms, 0);
    }
    if (s->batch.n > 0)
        worker_pool_submit(s->workers, &s->batch);
    dispatch__observe_replies(s);
    s->turn_ns = 0; /* the next turn's reads read the clock again */
}

static void job_done_cb(worker_job_t *job, void *arg)
{
    (void)arg;
    server_job_back(container_of(job, req_t, job));
}

static void admin_stats_cb(void *arg, proto_stats_t *out)
{
    inspect__stats(arg, out);
}

/* POST /prefix-cache/flush (admin.h): the entries given up, from the
 * pool's figures before and after (blocks that live sessions hold stay). */
static uint64_t admin_prefix_flush_cb(void *arg)
{
    server_t *s = arg;
    cache_pool_stats_t before, after;

    cache_pool_stats(s->pool, &before);
    (void)cache_pool_prefix_flush(s->pool);
    cache_pool_stats(s->pool, &after);
    log_info("admin: the prefix cache gave up %" PRIu64 " entries",
             before.prefix_entries - after.prefix_entries);
    return before.prefix_entries - after.prefix_entries;
}

static void trim_timer_cb(uv_timer_t *h)
{
    server_t *s = container_of(h, server_t, trim_timer);
    uint64_t keep = ((uint64_t)s->cfg->cache_mb << 20) / 16;

    bool shed = s->low_free_reqs > 0 || s->low_free_sessions > 0;

    (void)cache_pool_trim(s->pool, keep < TRIM_KEEP_BYTES ? keep : TRIM_KEEP_BYTES);
    (void)cache_pool_trim_tables(s->pool);
    /* Records no request needed for a whole period go back to malloc, and
     * malloc gives what it then holds free back to the kernel. */
    req__shed(s, s->low_free_reqs);
    session__shed(s, s->low_free_sessions);
    if (shed)
        malloc_trim(0);
}

static bool admin_healthy_cb(void *arg, const char **why)
{
    server_t *s = arg;

    if (s->draining) {
        *why = "draining";
        return false;
    }
    /* No progress, not a long job: a job counts its positions as it runs
     * (worker_pool_wedged()). */
    if (worker_pool_wedged(s->workers, uv_hrtime(),
                           (uint64_t)s->cfg->wedge_timeout * 1000000000u)) {
        *why = "a worker is stuck on one job";
        return false;
    }
    return true;
}

/* ---- Accept ---- */

static void listen_cb(uv_poll_t *h, int status, int events);

static int reserve_open(void)
{
    return open("/dev/null", O_RDONLY | O_CLOEXEC);
}

static void accept_resume_cb(uv_timer_t *h)
{
    server_t *s = container_of(h, server_t, accept_timer);

    if (s->reserve_fd < 0)
        s->reserve_fd = reserve_open();
    if (s->listen_fd >= 0 && !s->draining)
        uv_poll_start(&s->listen_poll, UV_READABLE, listen_cb);
}

/* Stops polling the socket for ACCEPT_PAUSE_MS. */
static void accept_pause(server_t *s)
{
    uv_poll_stop(&s->listen_poll);
    uv_timer_start(&s->accept_timer, accept_resume_cb, ACCEPT_PAUSE_MS, 0);
}

/* Counts one failed accept (a connection turned away, or a pause with no
 * reserve descriptor to turn one away with) and warns now and then. */
static void accept_count(server_t *s, int err)
{
    uint64_t now = uv_now(&s->loop);

    metrics_count_accept_error();
    s->accept_unwarned++;
    if (s->accept_warned_ms == 0 || now - s->accept_warned_ms >= ACCEPT_WARN_MS) {
        log_warn("accept: %s (%" PRIu64 " failed since the last warning); %zu connections open; "
                 "new ones are turned away until descriptors free up",
                 strerror(err), s->accept_unwarned, s->nconns);
        s->accept_warned_ms = now != 0 ? now : 1;
        s->accept_unwarned = 0;
    }
}

typedef enum accept_outcome {
    ACCEPT_TURNED_AWAY, /* one connection told too_many_connections: go on */
    ACCEPT_NONE_LEFT,   /* nothing pending after all (Linux fails accept() with
                           EMFILE before it looks at the queue) */
    ACCEPT_REST,        /* nothing to accept with: pause */
} accept_outcome_t;

/* accept() failed with `err` (no descriptor or no memory): turns the
 * pending connection away through the reserve descriptor, and counts it. */
static accept_outcome_t accept_failed(server_t *s, int err)
{
    int fd, accept_err;

    if (s->reserve_fd < 0) {
        accept_count(s, err);
        return ACCEPT_REST;
    }
    close(s->reserve_fd);
    fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    accept_err = errno;
    if (fd >= 0) {
        accept_count(s, err);
        conn__turn_away(fd, err == ENOMEM || err == ENOBUFS
                                ? "the daemon is out of memory"
                                : "the daemon is out of file descriptors");
    }
    s->reserve_fd = reserve_open();
    if (s->reserve_fd < 0)
        return ACCEPT_REST;
    if (fd >= 0)
        return ACCEPT_TURNED_AWAY;
    return accept_err == EAGAIN || accept_err == EWOULDBLOCK ? ACCEPT_NONE_LEFT : ACCEPT_REST;
}

static void listen_cb(uv_poll_t *h, int status, int events)
{
    server_t *s = container_of(h, server_t, listen_poll);

    (void)events;
    if (status < 0) {
        log_warn("accept: %s", uv_strerror(status));
        accept_pause(s);
        return;
    }
    for (int i = 0; i < ACCEPT_BATCH && !s->draining; i++) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            conn__accept(s, fd);
            continue;
        }
        switch (errno) {
        case EINTR:
        case ECONNABORTED:
        case EPROTO:
            continue;
        case EAGAIN:
#if EWOULDBLOCK != EAGAIN
        case EWOULDBLOCK:
#endif
            return;
        case EMFILE:
        case ENFILE:
        case ENOBUFS:
        case ENOMEM:
            switch (accept_failed(s, errno)) {
            case ACCEPT_TURNED_AWAY:
                continue;
            case ACCEPT_NONE_LEFT:
                return; /* level-triggered: the next connection wakes us */
            case ACCEPT_REST:
                accept_pause(s);
                return;
            }
            return;
        default:
            log_warn("accept: %s", strerror(errno));
            accept_pause(s);
            return;
        }
    }
}

/* ---- Shutdown ---- */

static void close_quietly(uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* Stops accepting: closes the poll handle and the socket (the poll no
 * longer watches it once uv_close() returns). */
static void listener_close(server_t *s)
{
    if (s->listen_fd < 0)
        return;
    close_quietly((uv_handle_t *)&s->listen_poll);
    close(s->listen_fd);
    s->listen_fd = -1;
}

/* The drain is over (or start-up failed): closes every handle that is
 * still open; uv_run() returns once their callbacks have run. */
static void server_finish(server_t *s)
{
    if (s->finished)
        return;
    s->finished = true;
    if (s->workers != NULL) {
        worker_pool_close(s->workers);
        s->workers = NULL;
        if (s->draining)
            log_info("shutdown: workers joined");
    }
    if (s->admin != NULL) {
        admin_close(s->admin);
        s->admin = NULL;
    }
    listener_close(s);
    close_quietly((uv_handle_t *)&s->accept_timer);
    close_quietly((uv_handle_t *)&s->quiet_timer);
    close_quietly((uv_handle_t *)&s->linger_timer);
    close_quietly((uv_handle_t *)&s->handshake_timer);
    close_quietly((uv_handle_t *)&s->deliver_timer);
    if (s->reserve_fd >= 0) {
        close(s->reserve_fd);
        s->reserve_fd = -1;
    }
    close_quietly((uv_handle_t *)&s->sigterm);
    close_quietly((uv_handle_t *)&s->sigint);
    close_quietly((uv_handle_t *)&s->sighup);
    signal(SIGHUP, SIG_IGN); /* libuv put back the default action, which would end us */
#if SLOTD_FAULT_INJECTION
    close_quietly((uv_handle_t *)&s->sigusr1);
#endif
    close_quietly((uv_handle_t *)&s->idle_timer);
    close_quietly(evict__timer(s));
    close_quietly((uv_handle_t *)&s->shutdown_timer);
    close_quietly((uv_handle_t *)&s->flush_check);
    close_quietly((uv_handle_t *)&s->hold_timer);
    close_quietly((uv_handle_t *)&s->trim_timer);
}

/* conn_hooks_t.freed: a connection struct was freed. */
/* conn_hooks_t.closing: `c` leaves its handshake and its tenant's count. */
static void server_conn_closing(conn_t *c)
{
    handshake__end(c);
    tenancy__conn_closing(c);
}

static void server_conn_freed(server_t *s)
{
    if (s->draining && s->nconns_alive == 0) {
        log_info("shutdown: every connection closed");
        server_finish(s);
    }
}

static void shutdown_timer_cb(uv_timer_t *h)
{
    server_t *s = container_of(h, server_t, shutdown_timer);

    log_error("shutdown: not done after %u s (%zu connections left); exiting with status 1",
              s->cfg->shutdown_timeout, s->nconns_alive);
    _exit(1);
}

static void server_drain(server_t *s)
{
    worker_batch_t back = WORKER_BATCH_INIT;
    worker_job_t *job, *next;
    conn_t *c, *cnext;

    s->draining = true;
#if SLOTD_FAULT_INJECTION
    jobfault__release(); /* a wedged job must not hold the drain */
#endif
    listener_close(s);
    uv_timer_stop(&s->accept_timer);
    uv_timer_stop(&s->idle_timer);
    uv_timer_stop(&s->room_timer); /* its requests are answered below (dispatch__drain()) */
    uv_timer_stop(&s->quiet_timer);
    while (!TAILQ_EMPTY(&s->quiet)) /* a drain closes them anyway */
        conn__wait_remove(s, TAILQ_FIRST(&s->quiet));
    uv_timer_start(&s->shutdown_timer, shutdown_timer_cb, (uint64_t)s->cfg->shutdown_timeout * 1000,
                   0);
    s->drain_deadline = uv_now(&s->loop) + (uint64_t)s->cfg->shutdown_timeout * 1000;
    conn__linger_cap(s);

    /* Jobs no worker has started: this turn's batch and the queue; and
     * whatever a worker has yet to begin, a chain's next steps included. */
    atomic_store_explicit(&s->stop_jobs, true, memory_order_relaxed);
    back = s->batch;
    s->batch = (worker_batch_t)WORKER_BATCH_INIT;
    worker_pool_take_back(s->workers, &back);
    log_info("shutdown: stopped accepting; %zu connections, %zu queued jobs answered "
             "shutting_down, %zu running",
             s->nconns, back.n, worker_pool_pending(s->workers));
    for (job = back.head; job != NULL; job = next) {
        req_t *r = container_of(job, req_t, job);
        next = job->next;
        if (req__set_error(r, SLOTD_ESHUTTING_DOWN, SERVER_SHUTTING_DOWN_MSG) != SLOTD_OK)
            r->rc = SLOTD_ENOMEM; /* closes the connection */
        server_job_back(r);
    }
    for (c = s->conns; c != NULL; c = cnext) {
        cnext = c->next;
        dispatch__drain(c);
    }
    server_conn_freed(s); /* maybe nothing was open */
}

static void signal_cb(uv_signal_t *h, int signum)
{
    server_t *s = h->data;

    if (s->draining) {
        log_info("signal %d: already shutting down", signum);
        return;
    }
    log_info("signal %d: shutting down", signum);
    server_drain(s);
}

/* Rereads --tenants-file (tenancy.c) and revokes the connections of the
 * tenants it dropped or gave a new token: SIGHUP and POST /tenants/reload.
 * Returns what tenancy__reload() returns. */
static long server_reload_tenants(server_t *s, char *why, size_t why_size)
{
    long revoked = tenancy__reload(s, why, why_size);

    if (revoked <= 0)
        return revoked;
    for (conn_t *c = s->conns, *next; c != NULL; c = next) {
        next = c->next; /* a revoked connection leaves the list only once answered */
        dispatch__revoke(c);
    }
    return revoked;
}

/* SIGHUP reloads the tenants file.  Without one it would end the process
 * (its default action), and a terminal closing or a reload by habit sends
 * it: logged and ignored, drain or not. */
static void sighup_cb(uv_signal_t *h, int signum)
{
    server_t *s = h->data;

    if (s->cfg->tenants_file[0] == '\0') {
        log_info("signal %d: ignored (no --tenants-file to reload; SIGTERM drains)", signum);
        return;
    }
    log_info("signal %d: reloading %s", signum, s->cfg->tenants_file);
    (void)server_reload_tenants(s, NULL, 0);
}

/* POST /tenants/reload (admin.h): as SIGHUP, with the outcome for the
 * response. */
static int admin_tenants_reload_cb(void *arg, admin_reload_t *out)
{
    server_t *s = arg;
    long rc;

    if (s->cfg->tenants_file[0] == '\0')
        return ADMIN_RELOAD_NO_FILE;
    log_info("admin: reloading %s", s->cfg->tenants_file);
    rc = server_reload_tenants(s, out->why, sizeof(out->why));
    if (rc < 0)
        return rc == -1 ? ADMIN_RELOAD_REFUSED : ADMIN_RELOAD_NO_MEMORY;
    out->tenants = tenancy__count(s);
    out->revoked = (uint64_t)rc;
    return ADMIN_RELOAD_APPLIED;
}

/* admin_hooks_t.admin_token: a tenant's token, one with the admin right. */
static bool server_admin_token(void *arg, const char *token, size_t len)
{
    tenant_t *t = tenancy__find(arg, token, len);
    return t != NULL && t->admin;
}

/* ---- Start-up ---- */

/* worker_pool_config_t.wake_ns: a sleeping worker is woken while another
 * is awake only for jobs worth more than this (worker.c, DESIGN).  Above a
 * `tiny` loop turn's batch at pipeline depth 1 (64 jobs of about a
 * microsecond), below two `small` steps. */
#define SERVER_WAKE_NS 100000u

static int start_workers(server_t *s)
{
    worker_pool_config_t wc;
    int rc;

    if (s->cfg->audit_rate > 0) {
        rc = audit_create(s->cfg->audit_rate, s->cfg->threads, (const model_t *const *)s->models,
                          s->nmodels, &s->audit);
        if (rc != SLOTD_OK) {
            log_error("audit: %s", slotd_strerror(rc));
            s->audit = NULL;
            return rc;
        }
        log_info("audit: %g of step requests recomputed without the cache; %zu bytes per worker",
                 s->cfg->audit_rate, audit_worker_bytes(s->audit));
    }

    /* An evicted session is rebuilt from its tokens (evict.c); the blocks a
     * session fills are named by them in the prefix cache (job.c). */
    s->keep_toks = s->audit != NULL || s->cfg->on_full == CONFIG_ON_FULL_EVICT ||
                   s->cfg->prefix_cache;

    memset(&wc, 0, sizeof(wc));
    wc.threads = s->cfg->threads;
    for (size_t i = 0; i < s->nmodels; i++) {
        const model_t *m = s->models[i];
        size_t ctx = model_max_ctx(m);
        /* Room for 16 steps' logits; more only for an unusually large n. */
        size_t rows = ctx < 16 ? ctx : 16;
        if (model_scratch_size(m) > wc.scratch_bytes)
            wc.scratch_bytes = model_scratch_size(m);
        if (ctx > wc.tokens_cap)
            wc.tokens_cap = ctx;
        if (model_family(m) == MODEL_FAMILY_ATTN && rows * model_vocab(m) > wc.logits_cap)
            wc.logits_cap = rows * model_vocab(m);
    }
    wc.run = job_run;
    wc.group = job_group;
    wc.run_batch = job_run_batch;
    wc.max_batch = s->cfg->max_batch;
    wc.batch_ns = (uint64_t)s->cfg->batch_us * 1000u;
    wc.record_bytes = sizeof(req_t);
    wc.done = job_done_cb;
    wc.arg = s;
    wc.wake_ns = SERVER_WAKE_NS;
    wc.sched_batch = s->cfg->worker_sched_batch;
    rc = worker_pool_create(&s->loop, &wc, &s->workers);
    if (rc != 0)
        log_error("worker threads: %s", uv_strerror(rc));
    else if (wc.sched_batch && worker_pool_sched_error(s->workers) != 0)
        log_warn("worker threads: SCHED_BATCH refused (%s); they run under the default policy",
                 strerror(worker_pool_sched_error(s->workers)));
    return rc;
}

static int listen_parse_addr(const char *host, int port, struct sockaddr_storage *addr)
{
    if (strchr(host, ':') != NULL)
        return uv_ip6_addr(host, port, (struct sockaddr_in6 *)addr);
    return uv_ip4_addr(host, port, (struct sockaddr_in *)addr);
}

static int start_listener(server_t *s)
{
    struct sockaddr_storage addr;
    socklen_t len = sizeof(addr);
    char host[64];
    int rc, one = 1;

    memset(&addr, 0, sizeof(addr));
    rc = listen_parse_addr(s->cfg->listen, s->cfg->port, &addr);
    if (rc == 0) {
        s->listen_fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (s->listen_fd < 0 ||
            setsockopt(s->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
            bind(s->listen_fd, (struct sockaddr *)&addr,
                 addr.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                            : sizeof(struct sockaddr_in)) != 0 ||
            listen(s->listen_fd, 511) != 0)
            rc = uv_translate_sys_error(errno);
    }
    if (rc == 0)
        rc = uv_poll_init_socket(&s->loop, &s->listen_poll, s->listen_fd);
    if (rc != 0) {
        log_error("listen on %s:%d: %s", s->cfg->listen, s->cfg->port, uv_strerror(rc));
        if (s->listen_fd >= 0)
            close(s->listen_fd);
        s->listen_fd = -1;
        return rc;
    }
    uv_poll_start(&s->listen_poll, UV_READABLE, listen_cb);
    s->reserve_fd = reserve_open();
    if (s->reserve_fd < 0)
        log_warn("no descriptor in reserve (/dev/null: %s)", strerror(errno));
    getsockname(s->listen_fd, (struct sockaddr *)&addr, &len);
    uv_ip_name((struct sockaddr *)&addr, host, sizeof(host));
    log_info("listening on %s:%d", host,
             ntohs(addr.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&addr)->sin6_port
                                              : ((struct sockaddr_in *)&addr)->sin_port));
    return 0;
}

#if SLOTD_FAULT_INJECTION
static void sigusr1_cb(uv_signal_t *h, int signum)
{
    log_info("signal %d: fault: releasing a wedged job", signum);
    jobfault__release();
}
#endif

static int start_signals(server_t *s)
{
    int rc;

    s->sigterm.data = s;
    s->sigint.data = s;
    s->sighup.data = s;
    rc = uv_signal_start(&s->sigterm, signal_cb, SIGTERM);
    if (rc == 0)
        rc = uv_signal_start(&s->sigint, signal_cb, SIGINT);
    if (rc == 0)
        rc = uv_signal_start(&s->sighup, sighup_cb, SIGHUP);
#if SLOTD_FAULT_INJECTION
    if (rc == 0)
        rc = uv_signal_start(&s->sigusr1, sigusr1_cb, SIGUSR1);
#endif
    if (rc != 0)
        log_error("signals: %s", uv_strerror(rc));
    return rc;
}

int server_run(const server_config_t *cfg)
{
    server_t *s;
    cache_pool_config_t pc;
    admin_hooks_t hooks;
    int rc;

    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        log_error("no memory");
        return 1;
    }
    s->cfg = cfg;
    TAILQ_INIT(&s->quiet);
    TAILQ_INIT(&s->linger);
    TAILQ_INIT(&s->deliver);
    TAILQ_INIT(&s->lru);
    s->hooks.line = dispatch__on_line;
    s->hooks.drain_line = dispatch__on_drain_line;
    s->hooks.line_too_long = dispatch__line_too_long;
    s->hooks.detach = session__detach;
    s->hooks.freed = server_conn_freed;
    s->hooks.model_built = dispatch__model_built;
    s->hooks.accepted = handshake__begin;
    s->hooks.preamble = handshake__proxy_read;
    s->hooks.make_room = handshake__make_room;
    s->hooks.closing = server_conn_closing;
    s->hooks.run_parked = launch__run_parked;
    s->hooks.freeing = tenancy__conn_freed;
    s->start_ns = uv_hrtime();
    metrics_init(s->start_ns);
    log_info("slotd %s starting: %u worker threads, %" PRIu64 " MiB pool, at most %u sessions "
             "and %u connections",
             config_version(), cfg->threads, cfg->cache_mb, cfg->max_sessions,
             cfg->max_connections);

    rc = uv_loop_init(&s->loop);
    if (rc != 0) {
        log_error("event loop: %s", uv_strerror(rc));
        goto fail_loop;
    }
    /* Every handle is initialised up front, so that one unwinding path
     * can close them all whatever failed. */
    s->listen_fd = -1; /* its poll handle is made with the socket */
    s->reserve_fd = -1;
    uv_timer_init(&s->loop, &s->accept_timer);
    uv_timer_init(&s->loop, &s->quiet_timer);
    uv_timer_init(&s->loop, &s->linger_timer);
    handshake__init(s);
    uv_timer_init(&s->loop, &s->deliver_timer);
    uv_signal_init(&s->loop, &s->sigterm);
    uv_signal_init(&s->loop, &s->sigint);
    uv_signal_init(&s->loop, &s->sighup);
#if SLOTD_FAULT_INJECTION
    uv_signal_init(&s->loop, &s->sigusr1);
    log_warn("built with fault injection (SLOTD_FAULT_INJECTION): a test build, not for service");
#endif
    uv_timer_init(&s->loop, &s->idle_timer);
    evict__init(s);
    uv_timer_init(&s->loop, &s->shutdown_timer);
    uv_check_init(&s->loop, &s->flush_check);
    uv_timer_init(&s->loop, &s->hold_timer);
    uv_unref((uv_handle_t *)&s->hold_timer);
    uv_timer_init(&s->loop, &s->trim_timer);
    uv_unref((uv_handle_t *)&s->trim_timer);

    if (models__load(s) != SLOTD_OK)
        goto fail;
    if (tenancy__start(s) != 0) {
        rc = 2;
        goto fail_tenants;
    }

    memset(&pc, 0, sizeof(pc));
    pc.capacity_bytes = (size_t)cfg->cache_mb << 20;
    pc.max_slots = cfg->max_sessions + cfg->threads;
    pc.models = (const model_t *const *)s->models;
    pc.nmodels = s->nmodels;
    /* Refusals by bytes and slots alone, never by the holes freed blocks
     * leave: the outcome of a request then depends on what is live, not on
     * the order concurrent requests took and gave back blocks. */
    pc.arena_factor = 2;
    pc.prefix_cache = cfg->prefix_cache;
    rc = cache_pool_create(&pc, &s->pool);
    if (rc != SLOTD_OK) {
        log_error("cache pool of %" PRIu64 " MiB: %s", cfg->cache_mb, slotd_strerror(rc));
        s->pool = NULL;
        goto fail;
    }
    log_info("cache pool: %" PRIu64 " MiB, %u slots", cfg->cache_mb, pc.max_slots);
    uv_timer_start(&s->trim_timer, trim_timer_cb, TRIM_MS, TRIM_MS);

    if (start_workers(s) != 0 || start_listener(s) != 0 || start_signals(s) != 0)
        goto fail;
    memset(&hooks, 0, sizeof(hooks));
    hooks.stats = admin_stats_cb;
    hooks.healthy = admin_healthy_cb;
    hooks.sessions = inspect__sessions;
    hooks.sessions_cancel = inspect__sessions_cancel;
    hooks.health = inspect__health;
    hooks.prefix_flush = admin_prefix_flush_cb;
    hooks.tenants_reload = admin_tenants_reload_cb;
    hooks.arg = s;
    hooks.token = cfg->auth_token;
    hooks.token_len = cfg->auth_token_len;
    if (cfg->tenants_file[0] != '\0') {
        hooks.admin_token = server_admin_token;
        hooks.metrics_more = inspect__tenant_metrics;
    }
    rc = admin_start(&s->loop, cfg->admin_listen, cfg->admin_port, cfg->admin_idle_timeout * 1000u,
                     &hooks, &s->admin);
    if (rc != 0) {
        log_error("admin port %s:%d: %s", cfg->admin_listen, cfg->admin_port, uv_strerror(rc));
        s->admin = NULL;
        goto fail;
    }
    log_info("admin port on %s:%d", cfg->admin_listen, admin_port(s->admin));
    if (cfg->tenants_file[0] != '\0')
        log_info("auth: clients present a tenant's token of %s (admin port: all but /health, "
                 "tenants with admin)",
                 cfg->tenants_file);
    else if (cfg->auth_token_len > 0)
        log_info("auth: clients present the token of %s (admin port: all but /health)",
                 cfg->auth_token_file);
    else if (!cfg->protected_mode)
        log_warn("auth: no token and --protected-mode no: both ports serve whoever reaches them");
    uv_check_start(&s->flush_check, flush_check_cb);
    uv_unref((uv_handle_t *)&s->flush_check);

    uv_run(&s->loop, UV_RUN_DEFAULT);
    rc = 0;
    log_info("shutdown: complete");
    goto done;

fail:
    /* Closes whatever was opened (the workers too); the frees below
     * skip what was not. */
    rc = 1;
fail_tenants:
    server_finish(s);
    uv_run(&s->loop, UV_RUN_DEFAULT);
done:
    if (uv_loop_close(&s->loop) != 0)
        log_warn("event loop: handles left open at exit");
    audit_destroy(s->audit); /* the workers are joined */
    if (s->pool != NULL)
        cache_pool_destroy(s->pool);
    models__free(s);
    req__shed(s, SIZE_MAX);
    session__shed(s, SIZE_MAX);
    tenancy__stop(s);
fail_loop:
    free(s);
    return rc == 2 ? 2 : rc != 0 ? 1 : 0;
}
