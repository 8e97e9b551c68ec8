/*
 * jobcost_int.h: the cost model of jobs (jobcost.c): a job's estimated
 * run time, for launch.c, which sets it on a job it submits, and the
 * notes of measured times, for job.c, which runs the jobs.  Costs are
 * read on the loop thread, noted on the workers; relaxed atomics, no lock.
 */
#ifndef SLOTD_SERVER_JOBCOST_INT_H
#define SLOTD_SERVER_JOBCOST_INT_H

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
static inline const job_costs_t *jobcost__of(const server_t *s, const model_t *m)
{
    return &s->costs[model_preset_index(m)];
}

/** job_cost() of a step of `n` positions of a model with times `c`,
 * without looking at the op: the common case, inline.  Loop thread. */
static inline uint64_t jobcost__step(const job_costs_t *c, uint32_t n)
{
    return JOB_COST_FIXED_NS + (uint64_t)n * atomic_load_explicit(&c->step_ns, memory_order_relaxed);
}

/** The cost of a step of one position encoded (worker_cost_code()), as
 * the workers keep it beside the mean: set on a job without encoding
 * again.  0 until the first step is timed.  It may lag step_ns by an
 * update that raced with another: an estimate either way.  Loop thread. */
static inline uint16_t jobcost__step1_code(const job_costs_t *c)
{
    return atomic_load_explicit(&c->step1_code, memory_order_relaxed);
}

/* A chain's slice: JOB_CHAIN_SLICE_NS, or --batch-us if less; none with
 * --batch-us 0.  Shorter than a batch: a chain shares no weights, and what
 * it saves, a loop round trip of some microseconds per step, half a
 * millisecond already saves for all but a few steps, while a light
 * request waits for the slice of the chain ahead of it. */
#define JOB_CHAIN_SLICE_NS 500000u

static inline uint64_t jobcost__chain_slice(const server_t *s)
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
    uint64_t slice = jobcost__chain_slice(s);

    return slice == 0 ? UINT64_MAX : slice / 4;
}

/** The cost of the chain of steps from `r` on (r->chain_next), up to one
 * slice (jobcost__chain_slice()): what a worker runs of it at once.  Loop
 * thread. */
uint64_t job_chain_cost(const server_t *s, const req_t *r);

/** The cost of the chain from `r` on, of model `m`, counted to `slice`
 * at most (0: no bound): what a worker runs of it before it goes back to
 * its flow.  Worker threads. */
uint64_t jobcost__chain(const server_t *s, const req_t *r, const model_t *m, uint64_t slice);

/** Whether a step like `r` now costs more than job_chain_step_max().
 * Worker threads. */
bool jobcost__chain_too_dear(const server_t *s, const req_t *r);

/** The calling thread's CPU time in nanoseconds (0 if unreadable). */
uint64_t jobcost__cpu_ns(void);

/** Notes the time `ns` of job `r` that ran alone in its model's means
 * (a step's per position, a prefill's per token; other ops are not
 * noted).  Worker threads. */
void jobcost__measured(server_t *s, const req_t *r, uint64_t ns);

/** Notes `ns` as the time of one single step of model `m` (NULL: none),
 * a batch's share.  Worker threads. */
void jobcost__note_step(const server_t *s, const model_t *m, uint64_t ns);

#endif
