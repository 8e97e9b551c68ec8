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
 * That bounds what each holds at once, not what each gets: the heavy
 * tenant also takes the moments the light one's replies travel.  So each
 * flow counts its jobs taken per unit of weight (_served), and a flow more
 * than TENANTCAP_AHEAD jobs' worth ahead of another busy flow waits for
 * it, as virtual time does in fair queueing (VTC); a flow that becomes
 * busy starts level with the least served busy flow, so that time away
 * is not credit.  A flow with none taken may always take one.  Uncapped
 * flows are not counted.
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
#include <stdint.h>

/* How long a capped flow counts as busy after it last had a job in the
 * pool (tenantcap__do_busy_update()). */
#define TENANTCAP_LINGER_NS 2000000u

/* _served counts a job as TENANTCAP_UNIT / weight (weights are at most
 * 1000); a flow may be this many jobs of weight 1 ahead of the least
 * served busy flow before it waits. */
#define TENANTCAP_UNIT 1000000u
#define TENANTCAP_AHEAD 4u

/* Brings f, about to be listed busy, level with the least served busy
 * flow: time away is not credit. */
static void level(const tenantcap_t *tc, worker_flow_t *f)
{
    uint64_t least = UINT64_MAX;

    for (const worker_flow_t *g = tc->busy; g != NULL; g = g->_bnext)
        if (g->_served < least)
            least = g->_served;
    if (least != UINT64_MAX && f->_served < least)
        f->_served = least;
}

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
    level(tc, f);
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
    uint64_t least = UINT64_MAX;

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
        if (g != f && g->_served < least)
            least = g->_served;
    }
    /* No other capped flow busy: nothing to hold back for. */
    if (best_n == 0)
        return false;
    return ((uint64_t)f->_taken + 1) * best_w > best_n * wf ||
           f->_served >= least + (uint64_t)TENANTCAP_AHEAD * TENANTCAP_UNIT;
}

/* Counts `n` jobs of capped flow f taken (n may be negative: given back);
 * tenantcap__do_taken_add() passes over the others. */
void tenantcap__do_count(tenantcap_t *tc, worker_flow_t *f, int n)
{
    assert(n > 0 || f->_taken >= (uint32_t)-n);
    f->_taken = (uint32_t)((int64_t)f->_taken + n);
    if (n > 0) {
        if (!f->_busy)
            level(tc, f);
        f->_served += (uint64_t)n * TENANTCAP_UNIT / sched_flow_weight(&f->_sched);
    }
    tenantcap__do_busy_update(tc, f);
}
