/*
 * tenantcap.c: the capping of tenants' flows in the worker queue.  Owns
 * the list of busy capped flows (tenantcap_t) and the capping fields of
 * each flow once worker_flow_init() set them up (worker.h: _taken, _peak,
 * _idle_at, _busy, _bnext, _bprev).  worker.c calls it as its queue moves
 * jobs; a flow is capped by worker_flow_set_capped() (tenancy.c, one flow
 * a tenant).
 *
 * The rule.  A batch of chains steps each chain once a round (job.c), so a
 * tenant with 32 sessions stepping beside one with 4 gets 8 times the
 * steps whatever the order the queue serves them in.  A capped flow may
 * therefore have taken at most as many jobs, per unit of weight, as the
 * busiest other capped flow (at least one for a flow with jobs queued):
 * (taken + 1) / weight <= max over the others of max(taken, 1) / weight.
 * A flow with none taken may always take one.  Uncapped flows are not
 * counted.
 *
 * Threads and lock.  Whichever thread holds the worker pool's queue_lock:
 * the loop thread queuing or taking jobs back, a worker taking or giving
 * back jobs.  Every function here assumes it held (do_); no lock of its
 * own.  Calls sched.c only.
 *
 * Design: docs/design.md, "Tenants: who a connection is, and what it may
 * take".
 */
#include "tenantcap_int.h"

#include <assert.h>

/* How long a capped flow counts as busy after it last had a job in the
 * pool (tenantcap__do_busy_update()). */
#define TENANTCAP_LINGER_NS 2000000u

/* Keeps f's place in tc->busy: listed while it has jobs queued or taken,
 * and for TENANTCAP_LINGER_NS after (tenantcap__do_over() drops it then): a
 * client that pipelines a few requests has none in the daemon for the
 * moment its replies travel and its next requests come back, and it is
 * still as busy as one with many. */
void tenantcap__do_busy_update(tenantcap_t *tc, worker_flow_t *f)
{
    bool busy = f->_head != NULL || f->_taken > 0;

    if (f->_taken > f->_peak)
        f->_peak = f->_taken;
    if (!busy) {
        f->_idle_at = uv_hrtime();
        return;
    }
    f->_idle_at = 0;
    if (f->_busy)
        return;
    f->_busy = true;
    f->_bprev = NULL;
    f->_bnext = tc->busy;
    if (tc->busy != NULL)
        tc->busy->_bprev = f;
    tc->busy = f;
}

void tenantcap__do_busy_remove(tenantcap_t *tc, worker_flow_t *f)
{
    if (f->_bprev != NULL)
        f->_bprev->_bnext = f->_bnext;
    else
        tc->busy = f->_bnext;
    if (f->_bnext != NULL)
        f->_bnext->_bprev = f->_bprev;
    f->_bnext = f->_bprev = NULL;
    f->_busy = false;
    f->_peak = 0;
}

/* Whether capped flow f, with jobs taken, may not take one more job now
 * (tenantcap__do_held_back() checks the rest).  Each other busy flow
 * counts the most jobs it had taken at once since it became busy. */
bool tenantcap__do_over(tenantcap_t *tc, const worker_flow_t *f)
{
    uint64_t wf = sched_flow_weight(&f->_sched), best_n = 0, best_w = 1, now = 0;

    for (worker_flow_t *g = tc->busy, *next; g != NULL; g = next) {
        uint64_t n = g->_peak > 0 ? g->_peak : 1, w = sched_flow_weight(&g->_sched);
        next = g->_bnext;
        if (g->_idle_at != 0) {
            if (now == 0)
                now = uv_hrtime();
            if (now - g->_idle_at > TENANTCAP_LINGER_NS) {
                tenantcap__do_busy_remove(tc, g);
                continue;
            }
        }
        /* A tenant with one job at a time gains nothing from holding the
         * others to one: its job is served first by the queue's order
         * (and worker_yield()), and a cap of one would break every batch
         * of the others into single jobs. */
        if (g->_peak < 2)
            continue;
        if (g != f && n * best_w > best_n * w) {
            best_n = n;
            best_w = w;
        }
    }
    /* No other capped flow busy: nothing to hold back for. */
    return best_n > 0 && ((uint64_t)f->_taken + 1) * best_w > best_n * wf;
}

/* Counts `n` jobs of capped flow f taken (n may be negative: given back);
 * tenantcap__do_taken_add() passes over the others. */
void tenantcap__do_count(tenantcap_t *tc, worker_flow_t *f, int n)
{
    assert(n > 0 || f->_taken >= (uint32_t)-n);
    f->_taken = (uint32_t)((int64_t)f->_taken + n);
    tenantcap__do_busy_update(tc, f);
}
