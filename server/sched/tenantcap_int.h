/*
 * tenantcap_int.h: the capping of tenants' flows in the worker queue
 * (tenantcap.c), for worker.c.  Every call is made with the worker pool's
 * queue_lock held, by whichever thread holds it.
 */
#ifndef SLOTD_SERVER_TENANTCAP_INT_H
#define SLOTD_SERVER_TENANTCAP_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "worker.h"

/** The capped flows that are busy: with jobs queued or taken, or idle for
 * less than the linger.  Embedded in the worker pool; all zero is empty. */
typedef struct tenantcap {
    worker_flow_t *busy; /* queue_lock: linked through _bnext and _bprev */
} tenantcap_t;

/** Keeps capped flow f's place in the busy list after its jobs queued or
 * taken changed. */
void tenantcap__do_busy_update(tenantcap_t *tc, worker_flow_t *f);

/** Takes f, listed as busy, off the list (a flow forgotten or long idle). */
void tenantcap__do_busy_remove(tenantcap_t *tc, worker_flow_t *f);

/** Whether capped flow f, with jobs taken, is over its part (the slow half
 * of tenantcap__do_held_back()). */
bool tenantcap__do_over(tenantcap_t *tc, const worker_flow_t *f);

/** Counts `n` jobs of capped flow f taken (n < 0: given back). */
void tenantcap__do_count(tenantcap_t *tc, worker_flow_t *f, int n);

/* The two below are inline: without tenants no flow is capped, and the
 * queue's hot path pays no call. */

/** Whether flow f may not take one more job now. */
static inline bool tenantcap__do_held_back(tenantcap_t *tc, const worker_flow_t *f)
{
    return f->_capped && f->_taken > 0 && tenantcap__do_over(tc, f);
}

/** Counts `n` jobs of flow f taken (n may be negative: given back); only
 * capped flows count. */
static inline void tenantcap__do_taken_add(tenantcap_t *tc, worker_flow_t *f, int n)
{
    if (f != NULL && f->_capped)
        tenantcap__do_count(tc, f, n);
}

/** Whether any of jobs[0 .. n-1] is of a capped flow (read from the jobs,
 * not their flows: without tenants nothing more is touched).  Needs no
 * lock. */
static inline bool tenantcap__any(worker_job_t *const *jobs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (jobs[i]->_capped)
            return true;
    return false;
}

#endif
