/*
 * bench.h: what the parts of slotd-bench share: the run's configuration, the
 * control block the main thread uses to steer the generator threads, the
 * figures each thread gathers, and the generator thread's interface.
 */
#ifndef SLOTD_BENCH_BENCH_H
#define SLOTD_BENCH_BENCH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include "hist.h"

#include "core/model.h"

/** How the run proceeds, set by the main thread (and by a thread that runs
 * out of --requests budget: it moves WARM/MEASURE to STOP). */
enum bench_phase {
    PHASE_WARM = 0,    /* running, not measuring (--live-sessions opening, --warmup) */
    PHASE_MEASURE = 1, /* the measured window */
    PHASE_STOP = 2,    /* window closed: finish every session and disconnect */
};

/** The run's configuration.  Filled by the main thread before any generator
 * thread starts, read-only afterwards. */
typedef struct bench_config {
    char host[256];
    uint16_t port;
    struct sockaddr_storage addr;
    bool redis; /* drive Redis with INCR instead of slotd */

    uint32_t conns;         /* -c */
    uint32_t sessions;      /* -s: sessions per connection (when not live) */
    uint64_t live_sessions; /* --live-sessions: total, spread over the connections */
    uint32_t steps;         /* -n: steps per session */
    uint32_t pipeline;      /* -P: requests outstanding per connection */
    uint32_t sess_pipeline; /* --session-pipeline: requests in flight per session (1) */
    uint32_t threads;       /* --threads */
    uint32_t prompt_len;    /* a start's whole prompt: --shared-prefix plus --prompt-len */
    uint32_t shared_prefix; /* --shared-prefix: leading tokens every prompt has in common */
    int64_t *shared_toks;   /* those tokens (fixed seed); owned by main, NULL without */
    uint32_t step_n;        /* --step-n: tokens asked for per step request */
    double duration;        /* --duration, seconds; 0 = unbounded */
    uint64_t requests;      /* --requests: budget for the window; 0 = unbounded */
    double warmup;          /* --warmup, seconds */
    double open_timeout;    /* --open-timeout, seconds (live mode) */
    double disconnect_rate; /* --disconnect-rate, 0..1 */
    uint64_t seed;          /* --seed */
    uint32_t max_report;    /* --max-report: mismatch lines printed */
    bool verify;            /* --verify */
    bool json;              /* --json */
    bool quiet;             /* --quiet */
    bool check_drain;       /* not --no-check-drain */

    /* With a token (--auth-token-file, or SLOTD_AUTH_TOKEN_FILE): the line
     * {"op":"auth","token":"..."} and its "\n", which every connection
     * writes first; NULL without one.  Owned by main, wiped and freed at
     * its exit, after the workers are joined. */
    char *auth_line;
    size_t auth_line_len;

    const char *model_name;
    model_t *model; /* owned by main; immutable apart from its atomic counters */
    uint32_t vocab;
    uint32_t max_ctx;
    bool has_logits;
    /* --temperature, --top-k, --top-p, --sample-seed, --scores: the members
     * every step request carries after its id and n (",\"sample\":{...}"),
     * "" for none; `scores_all` when the replies carry every logit. */
    char decode[256];
    bool scores_all;
    bool samples;
} bench_config_t;

/** The control block shared by all threads.  Every field is atomic. */
typedef struct bench_ctl {
    _Atomic int phase;           /* enum bench_phase */
    _Atomic int64_t budget;      /* requests left in the window when --requests is set */
    _Atomic uint64_t live_open;  /* sessions that have opened at least once */
    _Atomic int fatal;           /* a thread met an error that ends the run */
    _Atomic int printed_reports; /* mismatch lines printed so far, across threads */
} bench_ctl_t;

#define BENCH_MAX_CODES 24

/** Error replies by wire code (Redis: by the first word of the error). */
typedef struct bench_codes {
    uint32_t n;
    char name[BENCH_MAX_CODES][32];
    uint64_t count[BENCH_MAX_CODES];
} bench_codes_t;

/** Figures of one thread.  Written only by that thread's loop; read by the
 * main thread after joining it (apart from the progress copies below). */
typedef struct bench_stats {
    /* The measured window only. */
    uint64_t win_steps;
    uint64_t win_requests;
    uint64_t win_errors;
    hist_t win_step_lat; /* step requests (Redis: INCR) */
    hist_t win_req_lat;  /* every request */
    uint64_t mark_ns;    /* window opened (uv_hrtime) */
    uint64_t freeze_ns;  /* window closed */
    uint64_t cpu_ns;     /* this thread's CPU time in the window */

    /* The whole run, warm-up and final finishes included. */
    uint64_t steps;
    uint64_t requests;
    uint64_t starts;
    uint64_t finishes;
    uint64_t errors;
    bench_codes_t codes;
    uint64_t mismatches;
    uint64_t checked_tokens; /* tokens (Redis: INCR values) compared */
    uint64_t checked_logits;
    uint64_t protocol_errors; /* replies the generator could not make sense of */
    uint64_t conn_errors;     /* connections lost or refused, not by our choice */
    uint64_t disconnects;     /* connections we reset on purpose (--disconnect-rate) */
    uint64_t reconnects;
    uint64_t ref_hits;
    uint64_t ref_misses;
    uint64_t prompt_entries; /* prompt positions of the starts answered */
    uint64_t cached_entries; /* the sum of their replies' `cached` */
} bench_stats_t;

typedef struct worker worker_t;

/** Creates generator thread `index` of `cfg->threads`, with the connections
 * whose index i satisfies i % threads == index.  `cfg` and `ctl` are
 * borrowed and must outlive the worker.  Returns NULL and writes `err` on
 * failure. */
worker_t *worker_create(const bench_config_t *cfg, bench_ctl_t *ctl, uint32_t index, char *err,
                        size_t errlen);

/** Starts the thread; it connects and runs until every connection is done
 * after PHASE_STOP. */
int worker_start(worker_t *w);

/** Wakes the thread to look at ctl->phase.  Safe from any thread. */
void worker_wake(worker_t *w);

/** Whether the thread has finished its loop.  Safe from any thread. */
bool worker_done(worker_t *w);

/** Progress figures, safe from any thread (relaxed copies, updated by the
 * thread about once per read). */
void worker_progress(worker_t *w, uint64_t *steps, uint64_t *requests, uint64_t *errors,
                     uint32_t *open_conns);

/** Joins the thread; afterwards worker_stats() may be read.  Returns the
 * thread's fatal message, or NULL if none (valid until worker_destroy()). */
const char *worker_join(worker_t *w);

/** The thread's figures; valid after worker_join() until worker_destroy(). */
const bench_stats_t *worker_stats(const worker_t *w);

/** Frees a joined (or never started) worker. */
void worker_destroy(worker_t *w);

/** Adds `n` to the count of error `code` (len bytes) in `c`. */
void bench_codes_add(bench_codes_t *c, const char *code, size_t len, uint64_t n);

#endif
