/*
 * jobfault.c: the test-only fault hooks of jobs, built only with
 * SLOTD_FAULT_INJECTION (cmake/flags.cmake; never in what
 * scripts/build.sh makes by default): a wedged worker and a damaged cache
 * entry, for the tests of /health's wedge and of the audit.
 *
 * DESIGN.  jobfault__point() and jobfault__after_step() run on the worker
 * threads, from job.c, at a job's start and after a step; jobfault__release()
 * on the loop thread (SIGUSR1, a drain's start).  No lock: the counters and
 * the release flag are atomics.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "jobfault_int.h"
#include "server/base/log.h"

/*
 * --fault-wedge-after N: the N-th job any worker starts holds its worker
 * (so that /health reports it past --wedge-timeout) until
 * jobfault__release() (SIGUSR1, or the start of a shutdown) or for
 * FAULT_WEDGE_MAX_MS at most, then runs as usual.
 *
 * --fault-corrupt-after N: right after the N-th step job that ran (counted
 * as each finishes its step, audit included) the worker damages the most
 * recent entry of that job's slot (cache_session_fault_corrupt()), so the
 * session's later cached steps diverge from the uncached reference.
 */
#define FAULT_WEDGE_MAX_MS 30000

static _Atomic uint64_t fault_jobs;  /* jobs started */
static _Atomic uint64_t fault_steps; /* step jobs done */
static _Atomic bool fault_released;

void jobfault__release(void)
{
    atomic_store_explicit(&fault_released, true, memory_order_release);
}

void jobfault__point(server_t *s, req_t *r)
{
    uint64_t k = atomic_fetch_add_explicit(&fault_jobs, 1, memory_order_relaxed) + 1;
    struct timespec tick = {0, 10 * 1000000L};

    if (s->cfg->fault_wedge_after == 0 || k != s->cfg->fault_wedge_after)
        return;
    log_warn("fault: job %" PRIu64 " (%s) wedges its worker until SIGUSR1 or shutdown", k,
             proto_op_name(r->rq.op));
    for (int ms = 0; ms < FAULT_WEDGE_MAX_MS; ms += 10) {
        if (atomic_load_explicit(&fault_released, memory_order_acquire))
            break;
        nanosleep(&tick, NULL);
    }
    log_warn("fault: job %" PRIu64 " released", k);
}

void jobfault__after_step(server_t *s, req_t *r)
{
    uint64_t k = atomic_fetch_add_explicit(&fault_steps, 1, memory_order_relaxed) + 1;

    if (s->cfg->fault_corrupt_after == 0 || k != s->cfg->fault_corrupt_after)
        return;
    if (cache_session_fault_corrupt(s->pool, &r->cs) == SLOTD_OK)
        log_warn("fault: step job %" PRIu64
                 ": damaged entry %u of session '%s' (connection %" PRIu64 ")",
                 k, r->cs.entries - 1, r->rq.id, r->cs.owner.key);
}
