/*
 * metrics.c: the daemon's process-wide counters, the step latency
 * histogram, and their Prometheus text exposition (format 0.0.4).
 *
 * This file owns one static set of counters: requests by op (PROTO_OP_NONE
 * counts lines that had no valid op and is rendered as op="invalid"), error
 * replies by position in SLOTD_ERRNO_MAP, released sessions by reason, cache
 * audits and divergences, refused connections, failed accepts, connections
 * closed for --conn-timeout, the step requests out with the workers, and a
 * fixed-bucket histogram
 * of step request latencies with the time of the last completed step.
 *
 * DESIGN.  Every counter is a C11 atomic updated and read with relaxed
 * ordering; there is no lock.  The loop thread counts requests, errors,
 * releases and refused connections; worker threads call
 * metrics_observe_step() and count audits and divergences; readers
 * (metrics_render() and the accessors, on the loop thread) see each value
 * whole but may see a mix of values from either side of a concurrent
 * update.  The histogram keeps per-bucket (non-cumulative) counts and
 * derives both the cumulative buckets and _count from one read of them, so a
 * rendering is always self-consistent (+Inf bucket == _count) even while
 * workers are observing; only _sum may be a step ahead or behind.
 *
 * The histogram is kept in METRICS_SHARDS copies, each on cache lines of
 * its own, and each worker observes into the copy of its number: with one
 * copy, every step moved the same lines between the workers' cores (perf
 * showed metrics_observe_step at about 2 % of the daemon at pipeline 16).
 * Readers add the copies up.
 */
#include "metrics.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "core/model.h"
#include "procstat.h"

/* Upper bounds of the histogram buckets, in nanoseconds, with their `le`
 * labels spelled exactly; an implicit +Inf bucket follows.  In a Release
 * build a `hash` step takes 50 to 250 ns, a `tiny` one 250 ns to 1 us, a
 * `small` one 25 to 100 us, a `base` one of 500 tokens 2 s: 1-2.5-5 per
 * decade from 25 ns to 10 s resolves each (bench/RESULTS.md). */
#define METRICS_BUCKETS(XX)                                                                        \
    XX(25u, "2.5e-08")                                                                             \
    XX(50u, "5e-08")                                                                               \
    XX(100u, "1e-07")                                                                              \
    XX(250u, "2.5e-07")                                                                            \
    XX(500u, "5e-07")                                                                              \
    XX(1000u, "1e-06")                                                                             \
    XX(2500u, "2.5e-06")                                                                           \
    XX(5000u, "5e-06")                                                                             \
    XX(10000u, "1e-05")                                                                            \
    XX(25000u, "2.5e-05")                                                                          \
    XX(50000u, "5e-05")                                                                            \
    XX(100000u, "0.0001")                                                                          \
    XX(250000u, "0.00025")                                                                         \
    XX(500000u, "0.0005")                                                                          \
    XX(1000000u, "0.001")                                                                          \
    XX(2500000u, "0.0025")                                                                         \
    XX(5000000u, "0.005")                                                                          \
    XX(10000000u, "0.01")                                                                          \
    XX(25000000u, "0.025")                                                                         \
    XX(50000000u, "0.05")                                                                          \
    XX(100000000u, "0.1")                                                                          \
    XX(250000000u, "0.25")                                                                         \
    XX(500000000u, "0.5")                                                                          \
    XX(1000000000u, "1")                                                                           \
    XX(2500000000u, "2.5")                                                                         \
    XX(5000000000u, "5")                                                                           \
    XX(10000000000u, "10")

static const uint64_t bucket_ns[] = {
#define XX(ns, label) (uint64_t)(ns),
    METRICS_BUCKETS(XX)
#undef XX
};

static const char *const bucket_label[] = {
#define XX(ns, label) label,
    METRICS_BUCKETS(XX)
#undef XX
};

#define NBUCKETS (sizeof(bucket_ns) / sizeof(bucket_ns[0]))

/* Each code's position in SLOTD_ERRNO_MAP, whatever the numbering. */
enum error_pos {
#define XX(name, wire, desc) ERRPOS_##name,
    SLOTD_ERRNO_MAP(XX)
#undef XX
        NERRORS
};

/* The wire code at each position; several positions share "internal". */
static const char *const error_wire[NERRORS] = {
#define XX(name, wire, desc) wire,
    SLOTD_ERRNO_MAP(XX)
#undef XX
};

static const char *const release_name[METRICS_RELEASE__COUNT] = {
    [METRICS_RELEASE_FINISH] = "finish",
    [METRICS_RELEASE_DISCONNECT] = "disconnect",
    [METRICS_RELEASE_IDLE] = "idle",
    [METRICS_RELEASE_SHUTDOWN] = "shutdown",
};

/* One copy of the step histogram (see DESIGN). */
typedef struct step_shard {
    /* buckets[i] counts observations in (bucket_ns[i-1], bucket_ns[i]];
     * buckets[NBUCKETS] those above the last bound. */
    _Alignas(64) _Atomic uint64_t buckets[NBUCKETS + 1];
    _Atomic uint64_t sum_ns;
    _Atomic uint64_t last_step_ns;
} step_shard_t;

#define METRICS_SHARDS 16

/* Presets counted by slotd_model_builds_total (model_preset_name()). */
#define METRICS_MODELS 8

static struct {
    _Atomic uint64_t start_ns;
    _Atomic uint64_t requests[PROTO_OP__COUNT];
    _Atomic uint64_t errors[NERRORS];
    _Atomic uint64_t released[METRICS_RELEASE__COUNT];
    _Atomic uint64_t divergence;
    _Atomic uint64_t audits;
    _Atomic uint64_t batches;       /* batches of two steps or more run */
    _Atomic uint64_t batched_steps; /* the steps in them */
    _Atomic uint64_t refused;
    _Atomic uint64_t accept_errors;
    _Atomic uint64_t conn_timeouts;
    _Atomic uint64_t auth_failures;
    _Atomic uint64_t model_builds[METRICS_MODELS];   /* by preset index */
    _Atomic uint64_t model_build_ns[METRICS_MODELS]; /* their time */
    _Atomic uint64_t socket_reads;
    _Atomic uint64_t socket_writes;
    _Atomic uint64_t steps_out; /* handed to the workers, not back yet */
    step_shard_t steps[METRICS_SHARDS];
} m;

/* metrics_process_figures(); set before any thread renders. */
static bool process_figures = true;

#define LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define STORE(x, v) atomic_store_explicit(&(x), (v), memory_order_relaxed)
#define BUMP(x, v) atomic_fetch_add_explicit(&(x), (v), memory_order_relaxed)

void metrics_init(uint64_t now_ns)
{
    STORE(m.start_ns, now_ns);
    for (size_t i = 0; i < PROTO_OP__COUNT; i++)
        STORE(m.requests[i], 0);
    for (size_t i = 0; i < NERRORS; i++)
        STORE(m.errors[i], 0);
    for (size_t i = 0; i < METRICS_RELEASE__COUNT; i++)
        STORE(m.released[i], 0);
    STORE(m.divergence, 0);
    STORE(m.audits, 0);
    STORE(m.batches, 0);
    STORE(m.batched_steps, 0);
    STORE(m.refused, 0);
    STORE(m.accept_errors, 0);
    STORE(m.conn_timeouts, 0);
    STORE(m.auth_failures, 0);
    for (size_t i = 0; i < METRICS_MODELS; i++) {
        STORE(m.model_builds[i], 0);
        STORE(m.model_build_ns[i], 0);
    }
    STORE(m.socket_reads, 0);
    STORE(m.socket_writes, 0);
    STORE(m.steps_out, 0);
    for (size_t k = 0; k < METRICS_SHARDS; k++) {
        for (size_t i = 0; i <= NBUCKETS; i++)
            STORE(m.steps[k].buckets[i], 0);
        STORE(m.steps[k].sum_ns, 0);
        STORE(m.steps[k].last_step_ns, 0);
    }
}

void metrics_count_request(proto_op_t op)
{
    if ((unsigned)op >= PROTO_OP__COUNT)
        op = PROTO_OP_NONE;
    BUMP(m.requests[op], 1);
}

static enum error_pos error_pos(int code)
{
    switch (code) {
#define XX(name, wire, desc)                                                                       \
    case SLOTD_E##name:                                                                            \
        return ERRPOS_##name;
        SLOTD_ERRNO_MAP(XX)
#undef XX
    default:
        /* Codes outside the list are bugs; count them as internal errors
         * rather than lose them. */
        return ERRPOS_INVAL;
    }
}

void metrics_count_error(int code)
{
    BUMP(m.errors[error_pos(code)], 1);
}

void metrics_count_release(metrics_release_t why)
{
    if ((unsigned)why >= METRICS_RELEASE__COUNT)
        return;
    BUMP(m.released[why], 1);
}

void metrics_count_divergence(void)
{
    BUMP(m.divergence, 1);
}

void metrics_count_audit(void)
{
    BUMP(m.audits, 1);
}

void metrics_count_batch(uint64_t steps)
{
    BUMP(m.batches, 1);
    BUMP(m.batched_steps, steps);
}

void metrics_count_refused(void)
{
    BUMP(m.refused, 1);
}

void metrics_count_accept_error(void)
{
    BUMP(m.accept_errors, 1);
}

void metrics_count_conn_timeout(void)
{
    BUMP(m.conn_timeouts, 1);
}

void metrics_count_auth_failure(void)
{
    BUMP(m.auth_failures, 1);
}

uint64_t metrics_auth_failures_total(void)
{
    return LOAD(m.auth_failures);
}

void metrics_count_model_build(size_t preset, uint64_t ns)
{
    if (preset < METRICS_MODELS) {
        BUMP(m.model_builds[preset], 1);
        BUMP(m.model_build_ns[preset], ns);
    }
}

uint64_t metrics_model_builds_total(size_t preset)
{
    return preset < METRICS_MODELS ? LOAD(m.model_builds[preset]) : 0;
}

void metrics_count_socket_read(void)
{
    BUMP(m.socket_reads, 1);
}

void metrics_count_socket_write(void)
{
    BUMP(m.socket_writes, 1);
}

void metrics_step_out(void)
{
    BUMP(m.steps_out, 1);
}

void metrics_step_back(void)
{
    atomic_fetch_sub_explicit(&m.steps_out, 1, memory_order_relaxed);
}

void metrics_observe_step(unsigned shard, uint64_t duration_ns, uint64_t now_ns)
{
    step_shard_t *h = &m.steps[shard % METRICS_SHARDS];
    size_t i = 0;
    while (i < NBUCKETS && duration_ns > bucket_ns[i])
        i++;
    BUMP(h->buckets[i], 1);
    BUMP(h->sum_ns, duration_ns);

    /* Keep the latest stamp when workers sharing a copy finish out of
     * order. */
    uint64_t last = LOAD(h->last_step_ns);
    while (last < now_ns &&
           !atomic_compare_exchange_weak_explicit(&h->last_step_ns, &last, now_ns,
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

uint64_t metrics_requests_total(void)
{
    uint64_t n = 0;
    for (size_t i = 0; i < PROTO_OP__COUNT; i++)
        n += LOAD(m.requests[i]);
    return n;
}

uint64_t metrics_errors_total(void)
{
    uint64_t n = 0;
    for (size_t i = 0; i < NERRORS; i++)
        n += LOAD(m.errors[i]);
    return n;
}

uint64_t metrics_released(metrics_release_t why)
{
    if ((unsigned)why >= METRICS_RELEASE__COUNT)
        return 0;
    return LOAD(m.released[why]);
}

uint64_t metrics_divergence_total(void)
{
    return LOAD(m.divergence);
}

uint64_t metrics_audits_total(void)
{
    return LOAD(m.audits);
}

uint64_t metrics_batches_total(void)
{
    return LOAD(m.batches);
}

uint64_t metrics_batched_steps_total(void)
{
    return LOAD(m.batched_steps);
}

uint64_t metrics_refused_total(void)
{
    return LOAD(m.refused);
}

uint64_t metrics_accept_errors_total(void)
{
    return LOAD(m.accept_errors);
}

uint64_t metrics_conn_timeouts_total(void)
{
    return LOAD(m.conn_timeouts);
}

uint64_t metrics_socket_reads_total(void)
{
    return LOAD(m.socket_reads);
}

uint64_t metrics_socket_writes_total(void)
{
    return LOAD(m.socket_writes);
}

uint64_t metrics_last_step_ns(void)
{
    uint64_t last = 0;
    for (size_t k = 0; k < METRICS_SHARDS; k++) {
        uint64_t t = LOAD(m.steps[k].last_step_ns);
        if (t > last)
            last = t;
    }
    return last;
}

/* ---- Rendering ---- */

__attribute__((format(printf, 2, 3))) static int put(proto_buf_t *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    /* Every line written here is short and fixed in shape. */
    if (n < 0 || (size_t)n >= sizeof(tmp))
        return SLOTD_EINVAL;
    return proto_buf_append(b, tmp, (size_t)n);
}

static int family(proto_buf_t *b, const char *name, const char *type, const char *help)
{
    return put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static int simple(proto_buf_t *b, const char *name, const char *type, const char *help, uint64_t v)
{
    int rc = family(b, name, type, help);
    if (rc == SLOTD_OK)
        rc = put(b, "%s %" PRIu64 "\n", name, v);
    return rc;
}

static double seconds(uint64_t ns)
{
    return (double)ns / 1e9;
}

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != SLOTD_OK)                                                                       \
            return rc_;                                                                            \
    } while (0)

static int render_requests(proto_buf_t *b)
{
    TRY(family(b, "slotd_requests_total", "counter",
               "Request lines by op; op=\"invalid\" counts lines with no valid op."));
    for (size_t i = 0; i < PROTO_OP__COUNT; i++) {
        const char *op = i == PROTO_OP_NONE ? "invalid" : proto_op_name((proto_op_t)i);
        TRY(put(b, "slotd_requests_total{op=\"%s\"} %" PRIu64 "\n", op, LOAD(m.requests[i])));
    }
    return SLOTD_OK;
}

static int render_errors(proto_buf_t *b)
{
    TRY(family(b, "slotd_errors_total", "counter", "Error replies sent, by wire error code."));
    /* One sample per distinct wire code, in list order, summing the
     * indexes that share it. */
    for (size_t i = 0; i < NERRORS; i++) {
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++)
            seen = strcmp(error_wire[j], error_wire[i]) == 0;
        if (seen)
            continue;
        uint64_t n = 0;
        for (size_t j = i; j < NERRORS; j++)
            if (strcmp(error_wire[j], error_wire[i]) == 0)
                n += LOAD(m.errors[j]);
        TRY(put(b, "slotd_errors_total{code=\"%s\"} %" PRIu64 "\n", error_wire[i], n));
    }
    return SLOTD_OK;
}

static int render_histogram(proto_buf_t *b)
{
    uint64_t counts[NBUCKETS + 1] = {0}, sum_ns = 0;
    for (size_t k = 0; k < METRICS_SHARDS; k++) {
        for (size_t i = 0; i <= NBUCKETS; i++)
            counts[i] += LOAD(m.steps[k].buckets[i]);
        sum_ns += LOAD(m.steps[k].sum_ns);
    }

    TRY(family(b, "slotd_step_seconds", "histogram",
               "Latency of step requests (one observation per request, whatever its n)."));
    uint64_t cum = 0;
    for (size_t i = 0; i < NBUCKETS; i++) {
        cum += counts[i];
        TRY(put(b, "slotd_step_seconds_bucket{le=\"%s\"} %" PRIu64 "\n", bucket_label[i], cum));
    }
    cum += counts[NBUCKETS];
    TRY(put(b, "slotd_step_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n", cum));
    TRY(put(b, "slotd_step_seconds_sum %.9f\n", seconds(sum_ns)));
    TRY(put(b, "slotd_step_seconds_count %" PRIu64 "\n", cum));
    return SLOTD_OK;
}

int metrics_render(proto_buf_t *out, const proto_stats_t *st, uint64_t now_ns)
{
    uint64_t bytes_free =
        st->pool_bytes_total > st->pool_bytes_used ? st->pool_bytes_total - st->pool_bytes_used : 0;
    uint64_t slots_free =
        st->pool_slots_total > st->pool_slots_used ? st->pool_slots_total - st->pool_slots_used : 0;

    TRY(simple(out, "slotd_cache_entries", "gauge", "Entries held by all live cache slots.",
               st->cache_entries));
    TRY(simple(out, "slotd_live_sessions", "gauge", "Live sessions across all connections.",
               st->live_sessions));

    TRY(family(out, "slotd_pool_bytes", "gauge", "Cache pool bytes by state."));
    TRY(put(out, "slotd_pool_bytes{state=\"used\"} %" PRIu64 "\n", st->pool_bytes_used));
    TRY(put(out, "slotd_pool_bytes{state=\"free\"} %" PRIu64 "\n", bytes_free));
    TRY(family(out, "slotd_pool_slots", "gauge", "Cache pool slots by state."));
    TRY(put(out, "slotd_pool_slots{state=\"used\"} %" PRIu64 "\n", st->pool_slots_used));
    TRY(put(out, "slotd_pool_slots{state=\"free\"} %" PRIu64 "\n", slots_free));

    TRY(simple(out, "slotd_g_calls_total", "counter",
               "Calls of g by hash models, prefill and stateless ops included.", st->g_calls));
    TRY(simple(out, "slotd_attention_rows_total", "counter",
               "Attention rows computed by attn models, prefill and stateless ops included.",
               st->rows));
    TRY(simple(out, "slotd_connections", "gauge", "Open session port connections.",
               st->connections));
    TRY(simple(out, "slotd_connections_refused_total", "counter",
               "Connections turned away with too_many_connections (--max-connections).",
               LOAD(m.refused)));
    TRY(simple(out, "slotd_accept_errors_total", "counter",
               "Failed accepts on the session port: no file descriptor (or memory) left.",
               LOAD(m.accept_errors)));
    TRY(family(out, "slotd_connections_closed_total", "counter",
               "Session connections closed by the daemon, by reason."));
    TRY(put(out, "slotd_connections_closed_total{reason=\"timeout\"} %" PRIu64 "\n",
            LOAD(m.conn_timeouts)));
    TRY(simple(out, "slotd_auth_failures_total", "counter",
               "Wrong tokens presented: auth ops on the session port, Bearer tokens on the "
               "admin port.",
               LOAD(m.auth_failures)));
    TRY(family(out, "slotd_model_builds_total", "counter",
               "Presets whose weights were built (at start for --preload, else on first use)."));
    for (size_t i = 0; i < METRICS_MODELS && model_preset_name(i) != NULL; i++)
        TRY(put(out, "slotd_model_builds_total{model=\"%s\"} %" PRIu64 "\n", model_preset_name(i),
                LOAD(m.model_builds[i])));
    TRY(family(out, "slotd_model_build_seconds_total", "counter",
               "Seconds spent building presets' weights."));
    for (size_t i = 0; i < METRICS_MODELS && model_preset_name(i) != NULL; i++)
        TRY(put(out, "slotd_model_build_seconds_total{model=\"%s\"} %.9f\n", model_preset_name(i),
                seconds(LOAD(m.model_build_ns[i]))));
    TRY(simple(out, "slotd_socket_reads_total", "counter",
               "Reads that took request bytes from session connections.", LOAD(m.socket_reads)));
    TRY(simple(out, "slotd_socket_writes_total", "counter",
               "Writes of replies begun on session connections (one write attempt each; what "
               "a full socket does not take is written later and not counted again).",
               LOAD(m.socket_writes)));

    TRY(render_requests(out));
    TRY(render_errors(out));

    TRY(family(out, "slotd_sessions_released_total", "counter", "Sessions released, by reason."));
    for (size_t i = 0; i < METRICS_RELEASE__COUNT; i++)
        TRY(put(out, "slotd_sessions_released_total{reason=\"%s\"} %" PRIu64 "\n", release_name[i],
                LOAD(m.released[i])));

    TRY(simple(out, "slotd_cache_divergence_total", "counter",
               "Cached decodes found to diverge from the uncached result.", LOAD(m.divergence)));
    TRY(simple(out, "slotd_cache_audits_total", "counter",
               "Step requests recomputed without the cache and compared (--audit-rate).",
               LOAD(m.audits)));
    TRY(simple(out, "slotd_step_batches_total", "counter",
               "Batches of two or more single steps of one model run as one (--max-batch).",
               LOAD(m.batches)));
    TRY(simple(out, "slotd_batched_steps_total", "counter",
               "Steps that ran in such batches.", LOAD(m.batched_steps)));

    TRY(render_histogram(out));
    TRY(simple(out, "slotd_steps_in_flight", "gauge",
               "Step requests handed to the workers and not back yet: queued or running.",
               LOAD(m.steps_out)));

    /* Before the first completed step there is no age to report: the family
     * is announced but has no sample, so an alert on it stays quiet on an
     * idle daemon, and absent() tells "never stepped" apart. */
    TRY(family(out, "slotd_last_step_age_seconds", "gauge",
               "Seconds since the last completed step; no sample before the first step."));
    uint64_t last = metrics_last_step_ns();
    if (last != 0)
        TRY(put(out, "slotd_last_step_age_seconds %.9f\n",
                seconds(now_ns > last ? now_ns - last : 0)));

    uint64_t start = LOAD(m.start_ns);
    TRY(family(out, "slotd_uptime_seconds", "gauge", "Seconds since the daemon started."));
    TRY(put(out, "slotd_uptime_seconds %.9f\n", seconds(now_ns > start ? now_ns - start : 0)));
    TRY(simple(out, "slotd_threads", "gauge", "Worker threads.", st->threads));
    return procstat_render(out, process_figures);
}

void metrics_process_figures(bool on)
{
    process_figures = on;
}
