/*
 * metrics.h: the daemon's counters, its step latency histogram, and their
 * Prometheus text rendering.
 *
 * DESIGN.  One process-wide set of counters, all C11 atomics with relaxed
 * ordering: the loop thread counts requests, errors, releases, refused
 * connections, failed accepts, connections closed for their timeout and
 * the steps out with the workers;
 * worker threads record step latencies, the time of their last completed
 * step, audits, divergences and batches.
 * Readers (the stats op, the admin port) read them on the loop thread
 * without a lock; a reading may mix counts from either side of a concurrent
 * update, never a torn value.
 */
#ifndef SLOTD_SERVER_METRICS_H
#define SLOTD_SERVER_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

typedef enum metrics_release {
    METRICS_RELEASE_FINISH = 0,
    METRICS_RELEASE_DISCONNECT,
    METRICS_RELEASE_IDLE,
    METRICS_RELEASE_SHUTDOWN,
    METRICS_RELEASE__COUNT
} metrics_release_t;

/** Resets every counter; `now_ns` is the monotonic start time.  Call once at
 * start-up, before any thread runs. */
void metrics_init(uint64_t now_ns);

void metrics_count_request(proto_op_t op);
/** Counts one error reply with wire code of `code` (see core/error.h). */
void metrics_count_error(int code);
void metrics_count_release(metrics_release_t why);
void metrics_count_divergence(void);
/** Counts one step request recomputed by the cache audit.  Any thread. */
void metrics_count_audit(void);
/** Counts one batch of `steps` (>= 2) steps run as one.  Any thread. */
void metrics_count_batch(uint64_t steps);
/** Counts one connection turned away with too_many_connections. */
void metrics_count_refused(void);
/** Counts one failed accept on the session port (no descriptor or no
 * memory left). */
void metrics_count_accept_error(void);
/** Counts one connection closed for --conn-timeout. */
void metrics_count_conn_timeout(void);
/** Counts one wrong token presented, on either port. */
void metrics_count_auth_failure(void);
uint64_t metrics_auth_failures_total(void);
/** Counts one build of a preset's weights (`preset`: its index in
 * model_preset_name() order) that took `ns`.  Loop thread. */
void metrics_count_model_build(size_t preset, uint64_t ns);
uint64_t metrics_model_builds_total(size_t preset);
/** Counts one read that took bytes from a session connection. */
void metrics_count_socket_read(void);
/** Counts one write of replies begun on a session connection. */
void metrics_count_socket_write(void);

/** Counts one step request handed to the workers, and one back from them
 * (run, or taken back unrun by a drain): their difference is the gauge
 * slotd_steps_in_flight.  Loop thread. */
void metrics_step_out(void);
void metrics_step_back(void);

/** Records one model request's latency (a step request, whatever its n)
 * and stamps `now_ns` as the time of the last completed step.  Any thread;
 * `shard` picks the copy of the histogram it goes to (any number does):
 * give each thread its own, such as its worker number, and threads do not
 * share the histogram's cache lines. */
void metrics_observe_step(unsigned shard, uint64_t duration_ns, uint64_t now_ns);

uint64_t metrics_requests_total(void);
uint64_t metrics_errors_total(void);
uint64_t metrics_released(metrics_release_t why);
uint64_t metrics_divergence_total(void);
uint64_t metrics_audits_total(void);
uint64_t metrics_batches_total(void);
uint64_t metrics_batched_steps_total(void);
uint64_t metrics_refused_total(void);
uint64_t metrics_accept_errors_total(void);
uint64_t metrics_conn_timeouts_total(void);
uint64_t metrics_socket_reads_total(void);
uint64_t metrics_socket_writes_total(void);
/** Monotonic ns of the last completed step; 0 if none yet. */
uint64_t metrics_last_step_ns(void);

/** Whether metrics_render() appends the process_* families (procstat.h),
 * which change from one rendering to the next; on unless a test that
 * compares renderings turns it off.  Call before any thread renders. */
void metrics_process_figures(bool on);

/** Appends the Prometheus text exposition (format 0.0.4) of `st` and of
 * every counter and the histogram.  `now_ns` is the monotonic time now. */
int metrics_render(proto_buf_t *out, const proto_stats_t *st, uint64_t now_ns);

#endif
