/*
 * job_int.h: the worker side of a job (job.c), for server.c, which hands
 * these to the worker pool, and the cost of a job, for launch.c, which
 * submits it.  Worker threads, as worker.h says, but the costs: the loop.
 */
#ifndef SLOTD_SERVER_JOB_INT_H
#define SLOTD_SERVER_JOB_INT_H

#include "server_int.h"

/** The estimated run time of `r`'s job in nanoseconds, from its op, its
 * counts and its model's measured times: its cost for the workers'
 * fairness and batch bound (worker_job_set_cost()).  Loop thread; for a
 * `generate` (which reads no session) also its worker, to decide whether
 * it runs in slices. */
uint64_t job_cost(const server_t *s, const req_t *r);

/* What any job costs besides its positions: its hand-offs, its reply. */
#define JOB_COST_FIXED_NS 1000u

/** The measured times of model `m` (not NULL).  Loop thread. */
static inline const job_costs_t *job__costs(const server_t *s, const model_t *m)
{
    return &s->costs[model_preset_index(m)];
}

/** job_cost() of a step of `n` positions of a model with times `c`,
 * without looking at the op: the common case, inline.  Loop thread. */
static inline uint64_t job__step_cost(const job_costs_t *c, uint32_t n)
{
    return JOB_COST_FIXED_NS + (uint64_t)n * atomic_load_explicit(&c->step_ns, memory_order_relaxed);
}

/** The cost of a step of one position encoded (worker_cost_code()), as
 * the workers keep it beside the mean: set on a job without encoding
 * again.  0 until the first step is timed.  It may lag step_ns by an
 * update that raced with another: an estimate either way.  Loop thread. */
static inline uint16_t job__step1_code(const job_costs_t *c)
{
    return atomic_load_explicit(&c->step1_code, memory_order_relaxed);
}

/* A chain's slice: JOB_CHAIN_SLICE_NS, or --batch-us if less; none with
 * --batch-us 0.  Shorter than a batch: a chain shares no weights, and what
 * it saves, a loop round trip of some microseconds per step, half a
 * millisecond already saves for all but a few steps, while a light
 * request waits for the slice of the chain ahead of it. */
#define JOB_CHAIN_SLICE_NS 500000u

static inline uint64_t job__chain_slice(const server_t *s)
{
    uint64_t batch = (uint64_t)s->cfg->batch_us * 1000u;

    return batch < JOB_CHAIN_SLICE_NS ? batch : JOB_CHAIN_SLICE_NS;
}

/** The most a step may cost (job_cost()) and still run in a chain: a
 * quarter of a chain's slice (none with --batch-us 0).  A chain saves a
 * loop round trip per step, some microseconds: worth it for cheap steps;
 * a dear step (`base`) gains nothing by it, and a light request on another
 * connection would wait for the chain's step instead of finding a worker
 * free between two of them.  Loop thread. */
static inline uint64_t job_chain_step_max(const server_t *s)
{
    uint64_t slice = job__chain_slice(s);

    return slice == 0 ? UINT64_MAX : slice / 4;
}

/** The cost of the chain of steps from `r` on (r->chain_next), up to one
 * slice (job__chain_slice()): what a worker runs of it at once.  Loop
 * thread. */
uint64_t job_chain_cost(const server_t *s, const req_t *r);

/** The worker side of a job: runs the model call of `job` (a req_t) and
 * formats its reply into the record.  `arg` is the server_t. */
void job_run(worker_t *w, worker_job_t *job, void *arg);

/** The pool's batch callbacks (worker.h): whether `cand` may join the
 * batch `first` leads (single steps of one batching model), and the run of
 * such a batch, each job answered and counted as job_run() would. */
bool job_group(const worker_job_t *first, const worker_job_t *cand, void *arg);
void job_run_batch(worker_t *w, worker_job_t **jobs, size_t n, void *arg);

#if SLOTD_FAULT_INJECTION
/** Test builds only: lets a job wedged by --fault-wedge-after go on (and
 * any later one through at once).  Any thread. */
void job_fault_release(void);
#endif

#endif
