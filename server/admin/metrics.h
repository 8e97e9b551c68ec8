/*
 * metrics.h: the daemon's metrics as one list, METRICS_MAP, from which
 * metrics.c generates the storage, the counting and reading functions and
 * the Prometheus text rendering (format 0.0.4), in list order.
 *
 * ADDING A METRIC.  Add one line to METRICS_MAP below and call the function
 * the line generates where the event happens.  A line is
 * XX(kind, stem, labels, arg, "name", "help") and generates, for `stem`:
 *   COUNTER    metrics_count_<stem>(label), metrics_count_<stem>_n(n, label),
 *              metrics_<stem>_value() (the sum over labels) and
 *              metrics_<stem>_value_at(label); `arg` is _, or ns for a
 *              count of nanoseconds rendered as seconds;
 *   GAUGE      metrics_<stem>_inc(label), metrics_<stem>_dec(label),
 *              metrics_<stem>_set(v, label) and the two readers;
 *   HISTOGRAM  metrics_observe_<stem>(shard, v, label) into the bucket set
 *              `arg` (metrics.c: METRICS_BUCKET_SETS) and the two readers
 *              (counts of observations); `shard` picks a per-thread copy;
 *   STAT_GAUGE, STAT_COUNTER  rendered from the proto_stats_t field `arg`;
 *   DERIVED_GAUGE  rendered by the function `arg` in metrics.c.
 * `labels` is NONE (the functions then take no label) or a label set of
 * METRICS_LABEL_SETS in metrics.c (op, code, release, refusal, close, model,
 * op_model, op_model_all); a new
 * set is one line there plus its two METRICS_LABEL_PARAM macros here.
 *
 * DESIGN.  Counters and gauges are C11 atomics updated and read with
 * relaxed ordering, no lock; histograms are kept in METRICS_SHARDS copies
 * on cache lines of their own and readers add the copies up (see
 * docs/design.md, "Metrics").  The loop thread counts requests, errors,
 * releases, connections and steps out; workers observe step latencies and
 * count audits, divergences and batches.  Readers run on the loop thread;
 * a reading may mix counts from either side of a concurrent update, never
 * a torn value.
 */
#ifndef SLOTD_SERVER_METRICS_H
#define SLOTD_SERVER_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/model.h"
#include "proto/proto.h"

typedef enum metrics_release {
    METRICS_RELEASE_FINISH = 0,
    METRICS_RELEASE_DISCONNECT,
    METRICS_RELEASE_IDLE,
    METRICS_RELEASE_SHUTDOWN,
    METRICS_RELEASE__COUNT
} metrics_release_t;

/* What a cache_full refusal ran out of: the label `reason` of
 * slotd_refusals_total, and what the operator can change. */
typedef enum metrics_refusal {
    METRICS_REFUSAL_POOL = 0, /* the pool's bytes (--cache-mb) */
    METRICS_REFUSAL_SLOTS,    /* the session limit (--max-sessions) */
    METRICS_REFUSAL_SHARE,    /* one connection's share (--max-connection-share,
                                 --max-sessions-per-connection) */
    METRICS_REFUSAL__COUNT
} metrics_refusal_t;

typedef enum metrics_close {
    METRICS_CLOSE_TIMEOUT = 0,  /* --conn-timeout */
    METRICS_CLOSE_AUTH_TIMEOUT, /* --auth-timeout: no auth (or PROXY header) in time */
    METRICS_CLOSE_ROOM,         /* not authenticated yet, made room at --max-connections */
    METRICS_CLOSE_PROXY_HEADER, /* a --proxy-from peer without a valid PROXY header */
    METRICS_CLOSE__COUNT
} metrics_close_t;

/* The label argument of each label set's functions: _PARAM alone, _PARAMC
 * after other parameters. */
#define METRICS_LABEL_PARAM_NONE void
#define METRICS_LABEL_PARAMC_NONE
#define METRICS_LABEL_PARAM_op proto_op_t label /* PROTO_OP_NONE: op="invalid" */
#define METRICS_LABEL_PARAMC_op , proto_op_t label
#define METRICS_LABEL_PARAM_code int label /* a SLOTD_E* code (core/error.h) */
#define METRICS_LABEL_PARAMC_code , int label
#define METRICS_LABEL_PARAM_release metrics_release_t label
#define METRICS_LABEL_PARAMC_release , metrics_release_t label
#define METRICS_LABEL_PARAM_refusal metrics_refusal_t label
#define METRICS_LABEL_PARAMC_refusal , metrics_refusal_t label
#define METRICS_LABEL_PARAM_close metrics_close_t label
#define METRICS_LABEL_PARAMC_close , metrics_close_t label
#define METRICS_LABEL_PARAM_model size_t label /* a preset's index, as model_preset_name() */
#define METRICS_LABEL_PARAMC_model , size_t label
#define METRICS_LABEL_PARAM_op_model size_t label /* metrics_op_model() */
#define METRICS_LABEL_PARAMC_op_model , size_t label
#define METRICS_LABEL_PARAM_op_model_all size_t label /* metrics_op_model() */
#define METRICS_LABEL_PARAMC_op_model_all , size_t label

/** The index of the label pair (op, model) of slotd_request_wait_seconds
 * and slotd_request_duration_seconds: `model` a preset's index
 * (model_preset_index()), MODEL_NPRESETS or more for none (rendered with
 * no model label).  An index, so that an observation costs no lookup. */
static inline size_t metrics_op_model(proto_op_t op, size_t model)
{
    size_t o = (unsigned)op < PROTO_OP__COUNT ? (size_t)op : (size_t)PROTO_OP_NONE;
    return o * (MODEL_NPRESETS + 1) + (model < MODEL_NPRESETS ? model : MODEL_NPRESETS);
}

/* Every metric, in rendering order.  Names, types, help texts and labels
 * are part of the operator contract (docs/operations.md, deploy/ alerts). */
#define METRICS_MAP(XX)                                                                            \
    XX(STAT_GAUGE, cache_entries, NONE, cache_entries, "slotd_cache_entries",                      \
       "Entries held by all live cache slots.")                                                    \
    XX(STAT_GAUGE, live_sessions, NONE, live_sessions, "slotd_live_sessions",                      \
       "Live sessions across all connections.")                                                    \
    XX(DERIVED_GAUGE, pool_bytes, NONE, render_pool_bytes, "slotd_pool_bytes",                     \
       "Cache pool bytes by state.")                                                               \
    XX(DERIVED_GAUGE, pool_slots, NONE, render_pool_slots, "slotd_pool_slots",                     \
       "Cache pool slots by state.")                                                               \
    XX(STAT_COUNTER, g_calls, NONE, g_calls, "slotd_g_calls_total",                                \
       "Calls of g by hash models, prefill and stateless ops included.")                           \
    XX(STAT_COUNTER, rows, NONE, rows, "slotd_attention_rows_total",                               \
       "Attention rows computed by attn models, prefill and stateless ops included.")              \
    XX(STAT_GAUGE, connections, NONE, connections, "slotd_connections",                            \
       "Open session port connections.")                                                           \
    XX(COUNTER, refused, NONE, _, "slotd_connections_refused_total",                               \
       "Connections turned away with too_many_connections (--max-connections).")                   \
    XX(COUNTER, accept_error, NONE, _, "slotd_accept_errors_total",                                \
       "Failed accepts on the session port: no file descriptor (or memory) left.")                 \
    XX(COUNTER, conn_closed, close, _, "slotd_connections_closed_total",                           \
       "Session connections closed by the daemon, by reason.")                                     \
    XX(COUNTER, auth_failure, NONE, _, "slotd_auth_failures_total",                                \
       "Wrong tokens presented: auth ops on the session port, Bearer tokens on the admin port.")   \
    XX(COUNTER, tenants_reload, NONE, _, "slotd_tenants_reloads_total",                            \
       "Reloads of --tenants-file applied (SIGHUP).")                                              \
    XX(COUNTER, tenants_reload_failure, NONE, _, "slotd_tenants_reload_failures_total",            \
       "Reloads of --tenants-file refused, changing nothing: the file did not load or parse.")     \
    XX(COUNTER, model_build, model, _, "slotd_model_builds_total",                                 \
       "Presets whose weights were built (at start for --preload, else on first use).")            \
    XX(COUNTER, model_build_ns, model, ns, "slotd_model_build_seconds_total",                      \
       "Seconds spent building presets' weights.")                                                 \
    XX(COUNTER, socket_read, NONE, _, "slotd_socket_reads_total",                                  \
       "Reads that took request bytes from session connections.")                                  \
    XX(COUNTER, socket_write, NONE, _, "slotd_socket_writes_total",                                \
       "Writes of replies begun on session connections (one write attempt each; what a full "      \
       "socket does not take is written later and not counted again).")                            \
    XX(COUNTER, request, op, _, "slotd_requests_total",                                            \
       "Request lines by op; op=\"invalid\" counts lines with no valid op.")                       \
    XX(COUNTER, error, code, _, "slotd_errors_total", "Error replies sent, by wire error code.")   \
    XX(COUNTER, refusal, refusal, _, "slotd_refusals_total",                                       \
       "cache_full replies sent, by what ran out: pool, slots or share.")                          \
    XX(COUNTER, release, release, _, "slotd_sessions_released_total",                              \
       "Sessions released, by reason.")                                                            \
    XX(COUNTER, divergence, NONE, _, "slotd_cache_divergence_total",                               \
       "Cached decodes found to diverge from the uncached result.")                                \
    XX(COUNTER, audit, NONE, _, "slotd_cache_audits_total",                                        \
       "Step requests recomputed without the cache and compared (--audit-rate).")                  \
    XX(STAT_GAUGE, evicted_sessions, NONE, evicted_sessions, "slotd_evicted_sessions",             \
       "Live sessions holding no pool memory: evicted, rebuilt at their next request "             \
       "(--on-full evict).")                                                                       \
    XX(GAUGE, evicted_token_bytes, NONE, _, "slotd_evicted_token_bytes",                           \
       "Bytes of the recorded tokens that evicted sessions keep outside the pool.")                \
    XX(COUNTER, eviction, NONE, _, "slotd_evictions_total",                                        \
       "Idle sessions whose slot was given back to make room (--on-full evict).")                  \
    XX(COUNTER, rebuilt_entry, NONE, _, "slotd_rebuilt_entries_total",                             \
       "Entries recomputed by the prefill that rebuilds an evicted session.")                      \
    XX(COUNTER, rebuild_ns, NONE, ns, "slotd_rebuild_seconds_total",                               \
       "Seconds workers spent rebuilding evicted sessions.")                                       \
    XX(COUNTER, room_wait, NONE, _, "slotd_room_waits_total",                                      \
       "Requests that found the pool full and waited for room (--on-full wait).")                  \
    XX(HISTOGRAM, room_wait_seconds, NONE, seconds, "slotd_room_wait_seconds",                     \
       "Time a request waited for room (--on-full wait), until it ran or was refused.")            \
    XX(COUNTER, step_batch, NONE, _, "slotd_step_batches_total",                                   \
       "Batches of two or more single steps of one model run as one (--max-batch).")               \
    XX(COUNTER, batched_step, NONE, _, "slotd_batched_steps_total",                                \
       "Steps that ran in such batches.")                                                          \
    XX(HISTOGRAM, step_seconds, model, seconds, "slotd_step_seconds",                              \
       "Latency of step requests by model (one observation per request, whatever its n).")         \
    XX(GAUGE, steps_in_flight, NONE, _, "slotd_steps_in_flight",                                   \
       "Step requests handed to the workers and not back yet: queued or running.")                 \
    XX(DERIVED_GAUGE, requests_waiting, NONE, render_requests_waiting, "slotd_requests_waiting",   \
       "Requests handed to the workers that no worker has begun: queued, or chained behind a "     \
       "step of their session.")                                                                   \
    XX(DERIVED_GAUGE, requests_running, NONE, render_requests_running, "slotd_requests_running",   \
       "Requests a worker has begun and not handed back yet.")                                     \
    XX(HISTOGRAM, request_wait, op_model, seconds, "slotd_request_wait_seconds",                   \
       "Time from reading a request to a worker beginning it, by op (the ops workers run) and "    \
       "model.")                                                                                   \
    XX(HISTOGRAM, request_duration, op_model_all, seconds, "slotd_request_duration_seconds",       \
       "Time from reading a request to its reply going to the connection's output, by op and "     \
       "model (no model label for a request that found no model).")                                \
    XX(HISTOGRAM, batch_size, NONE, steps, "slotd_batch_size",                                     \
       "Steps a worker ran in one pass of a model: 1 for a step run alone.")                       \
    XX(DERIVED_GAUGE, last_step_age, NONE, render_last_step_age, "slotd_last_step_age_seconds",    \
       "Seconds since the last completed step; no sample before the first step.")                  \
    XX(DERIVED_GAUGE, uptime, NONE, render_uptime, "slotd_uptime_seconds",                         \
       "Seconds since the daemon started.")                                                        \
    XX(GAUGE, healthy, NONE, _, "slotd_healthy",                                                   \
       "1 while GET /health answers 200, else 0 (draining, or a worker wedged).")                  \
    XX(GAUGE, draining, NONE, _, "slotd_draining",                                                 \
       "1 while the daemon drains (SIGTERM or SIGINT received), else 0.")                          \
    XX(GAUGE, wedged, NONE, _, "slotd_wedged",                                                     \
       "1 while a worker is wedged (--wedge-timeout), else 0.")                                    \
    XX(STAT_GAUGE, threads, NONE, threads, "slotd_threads", "Worker threads.")                     \
    XX(STAT_GAUGE, prefix_entries, NONE, prefix_entries, "slotd_prefix_cache_entries",             \
       "Entries only the prefix cache holds (free room).")                                         \
    XX(STAT_COUNTER, prefix_hits, NONE, prefix_hit_entries, "slotd_prefix_cache_hit_entries_total", \
       "Prompt entries taken over from the prefix cache instead of computed.")                     \
    XX(STAT_COUNTER, prefix_queries, NONE, prefix_query_entries,                                   \
       "slotd_prefix_cache_lookup_entries_total", "Prompt entries looked up in the prefix cache.") \
    XX(STAT_COUNTER, prefix_evictions, NONE, prefix_evicted_entries,                               \
       "slotd_prefix_cache_evicted_entries_total",                                                 \
       "Entries only the prefix cache held, given up for room or by a flush.")                     \
    XX(STAT_GAUGE, shared_blocks, NONE, shared_blocks, "slotd_shared_blocks",                      \
       "Cache blocks held by more than one holder (sessions or the prefix cache).")

/* The declarations each kind generates (see ADDING A METRIC).  Any thread
 * may count; the readers are for the loop thread and tests. */
#define METRICS__DECL_COUNTER(stem, labels)                                                        \
    void metrics_count_##stem(METRICS_LABEL_PARAM_##labels);                                       \
    void metrics_count_##stem##_n(uint64_t n METRICS_LABEL_PARAMC_##labels);                       \
    uint64_t metrics_##stem##_value(void);                                                         \
    uint64_t metrics_##stem##_value_at(METRICS_LABEL_PARAM_##labels);
#define METRICS__DECL_GAUGE(stem, labels)                                                          \
    void metrics_##stem##_inc(METRICS_LABEL_PARAM_##labels);                                       \
    void metrics_##stem##_dec(METRICS_LABEL_PARAM_##labels);                                       \
    void metrics_##stem##_set(uint64_t v METRICS_LABEL_PARAMC_##labels);                           \
    uint64_t metrics_##stem##_value(void);                                                         \
    uint64_t metrics_##stem##_value_at(METRICS_LABEL_PARAM_##labels);
#define METRICS__DECL_HISTOGRAM(stem, labels)                                                      \
    void metrics_observe_##stem(unsigned shard, uint64_t v METRICS_LABEL_PARAMC_##labels);         \
    uint64_t metrics_##stem##_value(void);                                                         \
    uint64_t metrics_##stem##_value_at(METRICS_LABEL_PARAM_##labels);
#define METRICS__DECL_STAT_GAUGE(stem, labels)
#define METRICS__DECL_STAT_COUNTER(stem, labels)
#define METRICS__DECL_DERIVED_GAUGE(stem, labels)

#define XX(kind, stem, labels, arg, name, help) METRICS__DECL_##kind(stem, labels)
METRICS_MAP(XX)
#undef XX

/** Resets every metric; `now_ns` is the monotonic start time.  Call once at
 * start-up, before any thread runs. */
void metrics_init(uint64_t now_ns);

/** Records one model request's latency (a step request, whatever its n)
 * in slotd_step_seconds under its model's preset index `model`
 * (model_preset_index()) and stamps `now_ns` as the time of the last
 * completed step.  Any thread; `shard` picks the copy of the histogram it
 * goes to (any number does): give each thread its own, such as its worker
 * number, and threads do not share the histogram's cache lines. */
void metrics_observe_step(unsigned shard, uint64_t duration_ns, uint64_t now_ns, size_t model);

/** The same for a step request a worker ran alone, not in a batch: with
 * it one observation of 1 in slotd_batch_size. */
void metrics_observe_step_alone(unsigned shard, uint64_t duration_ns, uint64_t now_ns,
                                size_t model);

/** Marks the preset of index `model` as served (--models): histograms
 * with a model label render its series, and only the served presets', so
 * that their series are there from the start and their number is bounded
 * by the configuration.  Call after metrics_init(), before any thread
 * renders. */
void metrics_model_served(size_t model);

/** Observes n request durations in slotd_request_duration_seconds, each
 * from read_ns[i] to now_ns, with labels op_models[i] (metrics_op_model()):
 * the replies of one loop turn at once (dispatch.c).  Loop thread only: it
 * writes the loop's copy (METRICS_LOOP_SHARD) without locked instructions. */
void metrics_observe_loop_request_durations(uint64_t now_ns, const uint64_t *read_ns,
                                            const uint16_t *op_models, size_t n);

/** Monotonic ns of the last completed step; 0 if none yet. */
uint64_t metrics_last_step_ns(void);

/* Names the callers have always used, over the generated functions. */

/** Counts one batch of `steps` (>= 2) steps run as one.  Any thread. */
static inline void metrics_count_batch(uint64_t steps)
{
    metrics_count_step_batch();
    metrics_count_batched_step_n(steps);
}

/** Counts one connection closed for --conn-timeout. */
static inline void metrics_count_conn_timeout(void)
{
    metrics_count_conn_closed(METRICS_CLOSE_TIMEOUT);
}

/** Counts one job handed to the workers (a chain counts each step), and
 * one back, begun (`started`) or not (taken back, canceled, or a chain's
 * step left unrun): with the observations of slotd_request_wait_seconds,
 * which a worker makes as it begins a job, they give the gauges
 * slotd_requests_waiting and slotd_requests_running.  Loop thread only
 * (its counts are added without locked instructions). */
void metrics_job_out(void);
void metrics_job_back(bool started);

/** The shard the loop thread observes into (metrics_observe_*()): a copy
 * of its own, which no worker's number maps to. */
#define METRICS_LOOP_SHARD 0xffffffffu

/** Counts one step request handed to the workers, and one back from them
 * (run, or taken back unrun by a drain): their difference is the gauge
 * slotd_steps_in_flight.  Loop thread. */
static inline void metrics_step_out(void)
{
    metrics_steps_in_flight_inc();
}

static inline void metrics_step_back(void)
{
    metrics_steps_in_flight_dec();
}

static inline uint64_t metrics_requests_total(void)
{
    return metrics_request_value();
}

static inline uint64_t metrics_errors_total(void)
{
    return metrics_error_value();
}

static inline uint64_t metrics_released(metrics_release_t why)
{
    return metrics_release_value_at(why);
}

/** Whether metrics_render() appends the process_* families (procstat_int.h),
 * which change from one rendering to the next; on unless a test that
 * compares renderings turns it off.  Call before any thread renders. */
void metrics_process_figures(bool on);

/** Appends the Prometheus text exposition (format 0.0.4) of every metric
 * in METRICS_MAP, the figures of `st` included, then the process_*
 * families.  `now_ns` is the monotonic time now. */
int metrics_render(proto_buf_t *out, const proto_stats_t *st, uint64_t now_ns);

#endif
