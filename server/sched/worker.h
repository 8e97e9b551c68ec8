/*
 * worker.h: the daemon's worker threads, a job queue the loop thread fills
 * and one completion queue it drains.
 *
 * A job is a worker_job_t embedded in the caller's record (recovered with
 * container_of).  The loop thread collects jobs in a worker_batch_t and
 * hands a whole batch over with worker_pool_submit(): one lock, one
 * wake-up at most.  A worker takes a share of the queue at a time, runs
 * the pool's `run` callback on each job, then pushes each to the
 * completion queue as it finishes; the loop thread gets every completed
 * job, in completion order, through the pool's `done` callback, called
 * from one uv_async_t.  Between submit and `done` the job belongs to the
 * pool and the worker running it; the loop thread must not touch it.
 */
#ifndef SLOTD_SERVER_WORKER_H
#define SLOTD_SERVER_WORKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "sched_int.h"

/** Ranges of memory a job names for prefetching (worker_job_t.hint). */
#define WORKER_HINTS 6

typedef struct worker_job worker_job_t;

/** A flow: the jobs of one client, queued in submission order and served
 * fairly against the other flows (worker.c, "Fairness").  Embedded in the
 * caller's record and initialised by worker_flow_init(); its fields are
 * the pool's, under its lock.  The record must outlive every job naming
 * the flow that is submitted and not yet done. */
typedef struct worker_flow {
    sched_flow_t _sched;
    worker_job_t *_head, *_tail; /* its queued jobs */
    /* A capped flow (worker_flow_set_capped()): its jobs taken off the
     * queue and not back yet, and its link in the pool's list of capped
     * flows with jobs queued or taken. */
    uint32_t _taken;
    uint32_t _peak;    /* the most taken at once since it became busy */
    uint64_t _idle_at; /* uv_hrtime() it last had nothing queued or taken */
    uint64_t _served;  /* jobs taken, in TENANTCAP_UNIT per unit of weight */
    bool _capped, _busy;
    struct worker_flow *_bnext, *_bprev;
} worker_flow_t;

/** Embedded in the caller's record, at its start; `next` belongs to the
 * pool or the batch the job is in.  Before submitting, the caller sets
 * `flow` (NULL: the pool's own flow), the cost (worker_job_set_cost()),
 * and `hint` and `hint_lines`: up to WORKER_HINTS ranges of hint_lines[i]
 * 64-byte lines from hint[i] (0: unused) that the job will read.  A
 * worker prefetches them, with the first record_bytes of the record
 * (worker_pool_config_t), while it runs the job before this one.  Hints
 * only: never read through, so they may name memory that has moved or
 * been freed since (a prefetch never faults).  What a worker reads under
 * the queue's lock fills the first 64 bytes; `flow` is read on submit. */
struct worker_job {
    struct worker_job *next;
    const void *hint[WORKER_HINTS];
    uint8_t hint_lines[WORKER_HINTS];
    uint16_t _cost; /* worker_job_set_cost() */
    worker_flow_t *flow;
    bool lone;     /* the caller's: never leads a batch (the group callback is not asked) */
    bool _early;   /* handed back by worker_job_handoff(): not counted out */
    bool _requeue; /* worker_job_requeue(): back to its flow when the run ends */
    bool _capped;  /* its flow is capped (set when queued): counted in its flow's _taken */
};

/* A cost in 16 bits: an 11-bit mantissa shifted left by a 5-bit exponent. */
#define WORKER_COST_MANT_BITS 11u
#define WORKER_COST_MANT_MAX ((1u << WORKER_COST_MANT_BITS) - 1)
#define WORKER_COST_EXP_MAX 31u

/** The 16-bit form worker_job_set_cost() keeps `ns` in (never 0 for a
 * cost that is not): for a caller that gives many jobs one cost, encoded
 * once, with worker_job_set_cost_code(). */
static inline uint16_t worker_cost_code(uint64_t ns)
{
    unsigned bits = ns == 0 ? 0 : 64u - (unsigned)__builtin_clzll(ns), e;

    if (bits <= WORKER_COST_MANT_BITS)
        return (uint16_t)ns;
    /* ns / 2^e rounded up (a cost is never kept as 0, nor made cheaper),
     * with e as small as keeps it in the mantissa. */
    e = bits - WORKER_COST_MANT_BITS;
    ns = (ns >> e) + ((ns & (((uint64_t)1 << e) - 1)) != 0);
    if (ns > WORKER_COST_MANT_MAX) {
        ns = (ns + 1) >> 1;
        e++;
    }
    if (e > WORKER_COST_EXP_MAX) {
        e = WORKER_COST_EXP_MAX;
        ns = WORKER_COST_MANT_MAX;
    }
    return (uint16_t)(e << WORKER_COST_MANT_BITS | ns);
}

static inline void worker_job_set_cost_code(worker_job_t *job, uint16_t code)
{
    job->_cost = code;
}

/** Sets the job's estimated run time, `ns` nanoseconds, which the
 * fairness between flows and the pool's batch_ns count (0 counts as
 * nothing).  Kept to about 0.1 %, in 16 bits. */
static inline void worker_job_set_cost(worker_job_t *job, uint64_t ns)
{
    job->_cost = worker_cost_code(ns);
}

/** The cost worker_job_set_cost() set, as kept. */
static inline uint64_t worker_job_cost(const worker_job_t *job)
{
    return (uint64_t)(job->_cost & WORKER_COST_MANT_MAX) << (job->_cost >> WORKER_COST_MANT_BITS);
}

/** A FIFO of jobs not yet submitted (or taken back).  A plain value owned
 * by the loop thread; it does not own the jobs. */
typedef struct worker_batch {
    worker_job_t *head;
    worker_job_t *tail;
    size_t n;
} worker_batch_t;

#define WORKER_BATCH_INIT                                                                          \
    {                                                                                              \
        NULL, NULL, 0                                                                              \
    }

typedef struct worker worker_t;
typedef struct worker_pool worker_pool_t;

/** Runs `job` on worker `w`.  May use the worker's scratch and buffers;
 * must touch no libuv handle and nothing outside the job but what is
 * thread-safe. */
typedef void (*worker_run_cb)(worker_t *w, worker_job_t *job, void *arg);

/** Hands a completed job back, on the loop thread; the job is the
 * caller's again. */
typedef void (*worker_done_cb)(worker_job_t *job, void *arg);

/** Whether job `cand` may run in one batch with `first`; with `cand`
 * NULL, whether `first` may lead a batch at all.  Called by a worker, with
 * the queue's lock held for a queued `cand`: it may read only what the
 * jobs' submitter set before submitting (and atomics), and must be quick. */
typedef bool (*worker_group_cb)(const worker_job_t *first, const worker_job_t *cand, void *arg);

/** Runs jobs[0 .. n-1] (n >= 2, each admitted by the group callback with
 * jobs[0] as `first`) on worker `w`, as `run` would run each. */
typedef void (*worker_run_batch_cb)(worker_t *w, worker_job_t **jobs, size_t n, void *arg);

typedef struct worker_pool_config {
    unsigned threads;     /* at least 1 */
    size_t scratch_bytes; /* per worker, for the model (may be 0) */
    size_t tokens_cap;    /* uint32_t tokens each worker keeps ready */
    size_t logits_cap;    /* doubles each worker keeps ready */
    worker_run_cb run;
    worker_done_cb done;
    void *arg; /* passed to both callbacks */
    /* While some worker is awake to take them, a sleeping one is woken for
     * jobs left unstarted only if, at the measured mean time per job, they
     * would keep the awake ones busy for more than this many nanoseconds,
     * or if the awake ones have been in their current job that long (a
     * long or wedged job).  A sleeper is always woken when no worker is
     * awake.  0 wakes one whenever jobs are left unstarted.  worker.c says
     * why, and what bounds the wait. */
    uint64_t wake_ns;
    /* Bytes of the record a job is embedded in, from the job, that a
     * worker prefetches with the job's hints (0: the job alone). */
    size_t record_bytes;
    /* Batches (worker.c, "Batches"): a worker that claims a job `group`
     * admits gathers up to max_batch - 1 more that `group` admits with it,
     * from its local batch and from the queue (at most its fair share of
     * the queue), and runs them all with one `run_batch`.  max_batch 0 or
     * 1, or `group` NULL: every job runs alone. */
    worker_group_cb group;
    worker_run_batch_cb run_batch;
    size_t max_batch;
    /* A batch gathers jobs only while their costs add up to at most this
     * many nanoseconds (its first job whatever its cost), so that a job of
     * another flow waits about one batch.  0: no bound but max_batch. */
    uint64_t batch_ns;
    /* Run the threads under SCHED_BATCH (Linux): the kernel never lets a
     * worker it wakes preempt the thread running on a core, so a worker
     * woken for a cheap job does not stop another mid-batch (worker.c,
     * "Threads").  worker_pool_sched_error() says if it was refused. */
    bool sched_batch;
} worker_pool_config_t;

/** Initialises a flow (worker_flow_t). */
void worker_flow_init(worker_flow_t *f);

/** Makes `f` a capped flow (a tenant's), before it is ever submitted to:
 * while another capped flow has jobs queued or taken, `f` may have at most
 * its weight's part of the jobs taken by workers (a job taken is a
 * session's chain of steps, which in a batch advances one step a round),
 * so that batches step tenants' sessions in proportion to their weights,
 * not to their numbers of sessions.  Uncapped flows (a connection's) are
 * not counted and not held back.  Any thread. */
void worker_flow_set_capped(worker_flow_t *f);

/** Takes capped flow `f`, with no job queued or out, off the pool's list of
 * busy flows before its record is freed.  Loop thread. */
void worker_pool_flow_forget(worker_pool_t *wp, worker_flow_t *f);

/** Sets the weight of flow `f` (sched_flow_set_weight()) before it is
 * ever submitted to.  Any thread. */
void worker_flow_set_weight(worker_flow_t *f, uint32_t weight);

/** Sets the weight of flow `f`, which jobs of `wp` may be queued in or
 * running from, under the pool's queue lock: it counts from the next job
 * served.  Loop thread. */
void worker_pool_flow_set_weight(worker_pool_t *wp, worker_flow_t *f, uint32_t weight);

/** The cost served from `f` so far, in its jobs' cost units.  Any thread
 * while no job of `f` is out; for tests. */
uint64_t worker_flow_served(const worker_flow_t *f);

/** Appends `job` to `b`. */
void worker_batch_push(worker_batch_t *b, worker_job_t *job);

/** Starts the threads, and initialises on `loop` the completion handle
 * and the wake-up rule's timer (which worker_pool_submit() starts).  *out is owned
 * by the caller until worker_pool_close(), which frees it.  Returns 0, or
 * a negative libuv error (UV_ENOMEM, or the thread creation failure). */
int worker_pool_create(uv_loop_t *loop, const worker_pool_config_t *cfg, worker_pool_t **out);

/** 0, or the error (an errno value) setting cfg.sched_batch gave: the
 * threads then run under the policy they were started with. */
int worker_pool_sched_error(const worker_pool_t *wp);

/** Moves every job of `b` to the end of its flow's queue (one lock, and
 * one signal if a worker must be woken) and empties `b`.  Workers take
 * jobs from the flow that has been served least (worker.c, "Fairness"),
 * each flow's in submission order.  Loop thread. */
void worker_pool_submit(worker_pool_t *wp, worker_batch_t *b);

/** Takes every job that no worker has started, queued or taken by a
 * worker but not begun, and appends it to `out`, each flow's in
 * submission order (those taken by workers first, in the order taken);
 * they are the caller's again and will never be run or passed to `done`.
 * Loop thread. */
void worker_pool_take_back(worker_pool_t *wp, worker_batch_t *out);

/** True if some worker is wedged at monotonic time `now_ns`
 * (uv_hrtime()): in a job, and has made no progress for more than
 * `bound_ns`, neither begun a job (nor a chain's next step) nor counted
 * positions (worker_progress()) since.  A long job that counts its
 * positions as it runs is not wedged however long it takes.  Any thread. */
bool worker_pool_wedged(const worker_pool_t *wp, uint64_t now_ns, uint64_t bound_ns);

/** Positions the workers have counted (worker_progress()), ever.  Any
 * thread. */
uint64_t worker_pool_positions(const worker_pool_t *wp);

/** Jobs completed and not yet handed to `done`, plus jobs queued or
 * running.  Loop thread; for tests and assertions. */
size_t worker_pool_pending(worker_pool_t *wp);

/** Workers asleep, waiting for a wake-up.  Any thread; for tests. */
unsigned worker_pool_asleep(worker_pool_t *wp);

/** Lets the workers finish what is queued, joins them, hands every
 * remaining completion to `done`, closes both handles and frees the pool
 * in the last close callback (the loop must run once more).  Loop
 * thread. */
void worker_pool_close(worker_pool_t *wp);

/** uv_hrtime() when the worker started its current job (from within `run`). */
uint64_t worker_job_start(const worker_t *w);

/** The worker's number, 0 .. cfg.threads - 1: an index for per-worker
 * state the caller keeps (from within `run`). */
unsigned worker_index(const worker_t *w);

/* Chains.  A `run` or `run_batch` may go on from a job to others the
 * caller linked to it (steps of one session, say), handing each back as
 * it finishes: worker_job_handoff() sends the finished one to `done` at
 * once and puts the next in its place in the run, the job the pool hands
 * back when the run returns; worker_job_requeue() instead puts a job of
 * the run back in its flow's queue, to go on later (the end of a fair
 * slice).  The jobs of a chain count as one job out: only the one
 * submitted is counted, so the others must never be submitted
 * themselves. */

/** From within `run` or `run_batch`: hands `done`, a job of the run,
 * finished, to `done` now, and puts `next` (a job of the caller's, not
 * submitted) in its place, started now for worker_job_start() and the
 * wedge clock. */
void worker_job_handoff(worker_t *w, worker_job_t *done, worker_job_t *next);

/** From within `run` or `run_batch`: when the run returns, `job`, one of
 * its jobs, goes back to the end of its flow's queue, unfinished, instead
 * of to `done`; it is run again later (or taken back), with the cost it
 * has then. */
void worker_job_requeue(worker_t *w, worker_job_t *job);

/* Long jobs.  A job that runs for long (many positions of a model) runs
 * in slices: after each, it counts its progress (worker_progress()) and
 * lets the worker run other flows' cheap jobs that the scheduler would
 * serve before the rest of it (worker_yield()), then goes on.  It stays
 * the worker's current job throughout, and goes to `done` once, when its
 * `run` returns. */

/** Where a job running in slices stands among the flows: a value of the
 * job's `run`, zeroed before its first slice; its fields are the pool's. */
typedef struct worker_slices {
    uint64_t _vbase; /* the scheduler's virtual time at its first yield */
    bool _based;
} worker_slices_t;

/** From within `run`: the current job has computed `positions` more
 * positions: progress, for worker_pool_wedged().  One clock reading;
 * meant once a slice, not once a position. */
void worker_progress(worker_t *w, uint64_t positions);

/** From within `run` (not from a job worker_yield() runs, where it does
 * nothing): `job`, running in slices (`sl`), has done `done_ns` of work.
 * Runs here, for `budget_ns` at most in all, jobs that would otherwise
 * wait for it: first those the worker took with `job` and has not begun,
 * in order, while each costs at most `light_ns`; then, unless another
 * worker is free to take them, while the scheduler would serve another
 * flow's next job before the rest of `job` (as if each slice were a job
 * of its flow: sched_int.h), that job, if it costs at most `light_ns`.  `job`'s own flow's queued jobs wait.  Each
 * runs alone, with token and logit buffers of its own (the scratch is
 * shared: the caller must hold nothing in it across the call), and goes
 * to `done` at once.  Returns the nanoseconds spent on them. */
uint64_t worker_yield(worker_t *w, const worker_job_t *job, worker_slices_t *sl, uint64_t done_ns,
                      uint64_t light_ns, uint64_t budget_ns);

/** The worker's scratch, cfg.scratch_bytes bytes, owned by the worker. */
void *worker_scratch(worker_t *w);

/** The worker's token buffer with room for `n` values, grown if needed
 * (and shrunk back after the job); NULL if it cannot grow.  Owned by the
 * worker, valid until the job's `run` returns. */
uint32_t *worker_tokens(worker_t *w, size_t n);

/** As worker_tokens(), for `n` doubles of logits. */
double *worker_logits(worker_t *w, size_t n);

#endif
