/*
 * jobcost.c: the cost model of jobs.  A job's cost is its estimated run
 * time, from its op, its counts and its model's running means per
 * position (server_t.costs, job_costs_t), which the workers update as
 * they time the jobs they run; the loop reads them to set each job's cost
 * for the workers' fairness and batch bound (worker_job_set_cost()), and
 * to size a chain of steps.
 *
 * DESIGN.  job_cost() and job_chain_cost() run on the loop thread (and
 * job_cost() also on a worker, for a generate's slices); the jobcost__
 * functions that note a time run on the workers (job.c).  No lock: the
 * means are relaxed atomics, one writer at a time in the common case, and
 * a lost update only delays a mean by one job.  The hot inline parts
 * (jobcost__step(), jobcost__step1_code()) are in jobcost_int.h.
 */
#include <time.h>

#include "jobcost_int.h"

/* ---- Costs (worker.h: worker_job_set_cost()) ----
 *
 * A job's cost is its estimated run time: positions times its model's
 * running mean per position, measured by the workers as they run jobs,
 * plus JOB_COST_FIXED_NS for what any job costs (jobcost_int.h).  The models
 * whose steps batch (small, base) are timed in the thread's CPU time: on
 * a loaded machine the wall time of a batch grows with the preemptions
 * it suffers, and a bound in wall time would shrink
 * batches exactly when sharing the weights matters most.  tiny and hash
 * jobs take a microsecond or less, which the CPU clock's system call
 * would double: they are timed by the wall clock the worker reads anyway.
 * The means are relaxed atomics, one writer at a time in the common case;
 * a lost update only delays the mean by one job. */

uint64_t jobcost__cpu_ns(void)
{
    struct timespec ts;

    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The measured times of model `m`'s preset; NULL for no model. */
static job_costs_t *costs_of(const server_t *s, const model_t *m)
{
    return m != NULL ? (job_costs_t *)jobcost__of(s, m) : NULL;
}

/* Adds `ns` per position to the running mean *mean, over about its last
 * eight measurements; the first sets it.  A mean that moves by less than
 * a sixteenth is not written: every worker and the loop read it, and a
 * store per microsecond job would bounce its line between their cores. */
static bool cost_note(_Atomic uint64_t *mean, uint64_t ns)
{
    uint64_t m = atomic_load_explicit(mean, memory_order_relaxed);
    uint64_t next = m == 0 ? ns + 1 : m - m / 8 + ns / 8;

    if (m != 0 && (next > m ? next - m : m - next) <= m / 16)
        return false;
    atomic_store_explicit(mean, next, memory_order_relaxed);
    return true;
}

/* cost_note() of a step's time per position, with the encoded cost of a
 * one-position step kept beside the mean (jobcost__step1_code()). */
static void cost_note_step(job_costs_t *c, uint64_t ns)
{
    if (cost_note(&c->step_ns, ns))
        atomic_store_explicit(
            &c->step1_code,
            worker_cost_code(JOB_COST_FIXED_NS +
                             atomic_load_explicit(&c->step_ns, memory_order_relaxed)),
            memory_order_relaxed);
}

uint64_t job_cost(const server_t *s, const req_t *r)
{
    const model_t *m = req__on_slot(r) ? r->session->cs.model : r->model;
    const job_costs_t *c = costs_of(s, m);
    uint64_t step, prefill, n;

    if (c == NULL)
        return JOB_COST_FIXED_NS;
    step = atomic_load_explicit(&c->step_ns, memory_order_relaxed);
    prefill = atomic_load_explicit(&c->prefill_ns, memory_order_relaxed);
    switch (r->rq.op) {
    case PROTO_OP_STEP:
        return jobcost__step(c, r->rq.n);
    case PROTO_OP_GENERATE:
        /* Without the cache every step runs its whole prefix again. */
        n = (uint64_t)r->rq.steps;
        return JOB_COST_FIXED_NS + r->rq.ntokens * prefill +
               n * (r->rq.use_cache ? step : (r->rq.ntokens + n) * prefill);
    case PROTO_OP_FORK: /* a copy, no model call */
        return JOB_COST_FIXED_NS;
    case PROTO_OP_START:
    case PROTO_OP_LOGITS:
    case PROTO_OP_APPEND: /* a prompt */
    case PROTO_OP_NONE:
    case PROTO_OP_FINISH:
    case PROTO_OP_STATS:
    case PROTO_OP_AUTH:
    case PROTO_OP__COUNT:
        break;
    }
    return JOB_COST_FIXED_NS + r->rq.ntokens * prefill;
}

void jobcost__measured(server_t *s, const req_t *r, uint64_t ns)
{
    job_costs_t *c;

    switch (r->rq.op) {
    case PROTO_OP_STEP:
        if (r->rc == SLOTD_OK && r->rq.n > 0 && (c = costs_of(s, r->cs.model)) != NULL)
            cost_note_step(c, r->rq.n == 1 ? ns : ns / r->rq.n); /* no division, mostly */
        break;
    case PROTO_OP_START:
    case PROTO_OP_LOGITS:
        if (r->rc == SLOTD_OK && r->rq.ntokens > 0 && (c = costs_of(s, r->model)) != NULL)
            cost_note(&c->prefill_ns, ns / r->rq.ntokens);
        break;
    case PROTO_OP_APPEND:
        if (r->rc == SLOTD_OK && r->rq.ntokens > 0 && (c = costs_of(s, r->cs.model)) != NULL)
            cost_note(&c->prefill_ns, ns / r->rq.ntokens);
        break;
    case PROTO_OP_GENERATE: /* its own mix of prefill and steps: not a mean of either */
    case PROTO_OP_FORK:     /* a copy: no model call to time */
    case PROTO_OP_NONE:
    case PROTO_OP_FINISH:
    case PROTO_OP_STATS:
    case PROTO_OP_AUTH:
    case PROTO_OP__COUNT:
        break;
    }
}

void jobcost__note_step(const server_t *s, const model_t *m, uint64_t ns)
{
    job_costs_t *c = costs_of(s, m);

    if (c != NULL)
        cost_note_step(c, ns);
}

/* The cost of the chain from `r` on (launch.c links the steps of one
 * session), counted to the slice at most: what a worker runs of it before
 * it goes back to its flow. */
uint64_t jobcost__chain(const server_t *s, const req_t *r, const model_t *m, uint64_t slice)
{
    const job_costs_t *c = costs_of(s, m);
    uint64_t step = c != NULL ? atomic_load_explicit(&c->step_ns, memory_order_relaxed) : 0;
    uint64_t sum = 0;

    for (; r != NULL && (slice == 0 || sum < slice); r = r->chain_next)
        sum += JOB_COST_FIXED_NS + (uint64_t)r->rq.n * step;
    return slice > 0 && sum > slice ? slice : sum;
}

uint64_t job_chain_cost(const server_t *s, const req_t *r)
{
    return jobcost__chain(s, r, r->session->cs.model, jobcost__chain_slice(s));
}

bool jobcost__chain_too_dear(const server_t *s, const req_t *r)
{
    const job_costs_t *c = costs_of(s, r->cs.model);
    uint64_t step = c != NULL ? atomic_load_explicit(&c->step_ns, memory_order_relaxed) : 0;

    return JOB_COST_FIXED_NS + (uint64_t)r->rq.n * step > job_chain_step_max(s);
}
