/*
 * worker.c: the worker threads, their job queue and the completion queue
 * (see worker.h).  It owns the threads, each worker's local batch, scratch
 * and token/logit buffers (workbuf_int.h), the uv_async_t that wakes the
 * loop, and the timer (`nudge`) of the wake-up rule.
 *
 * Threads.  The loop thread submits jobs, runs the nudge timer and the
 * async callback that calls `done` on finished jobs; each worker thread
 * claims and runs jobs (alone or gathered into a batch) and pushes them
 * back.  A job belongs to the worker running it, and scratch and buffers
 * to their worker.  `outstanding` is touched by the loop thread only.
 * The workers may run under SCHED_BATCH (cfg.sched_batch), so that waking
 * one never preempts a thread mid-batch.
 *
 * Fairness.  Queued jobs wait in their flow's FIFO (a client's: worker.h),
 * and the flows in sched.c's start-time fair queue: a worker takes the
 * next job of the flow served least so far, by cost, and fills a batch
 * the same way, within batch_ns.
 *
 * Locks.  `queue_lock` guards the flows and the scheduler, the
 * `sleepers` stack, the filling and emptying of each worker's local batch,
 * the stop flag, and every move of another worker's `claim`; a worker claims its own local
 * jobs with a compare-and-swap on `claim`, without the lock, and whoever
 * moves `claim` past a job owns it.  A sleeping worker waits on its own
 * semaphore, posted after the lock is released.  Completions go on
 * `done_top`, a lock-free stack (pushes and whole-stack takes only, both
 * acquire and release); a push that finds it empty sends the async.  Each
 * worker publishes its current job's start time in an atomic (0 when
 * idle) for worker_pool_wedged() and worker_job_start(), and the time a
 * long job last counted positions (worker_progress()).  A long job's
 * worker_yield() takes other flows' cheap jobs under queue_lock and runs
 * each inside it, with swapped-in buffers, on the worker's own thread.
 * The flows of tenants are capped (tenantcap.c, under queue_lock too).
 *
 * Design: docs/design.md, "The worker queue and its wake-up rule",
 * "Prefetch hints", "Batches", "Scheduler" and "Long jobs".
 */
#define _GNU_SOURCE /* SCHED_BATCH */
#include "worker.h"

#include <assert.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "tenantcap_int.h"
#include "workbuf_int.h"

/* The cache line, as hints count it (worker.h). */
#define WORKER_LINE 64

/* The most jobs a worker takes per queue_lock acquisition. */
#define WORKER_TAKE_MAX 16u

/* The most queued jobs a worker looks at for its batch per gathering:
 * jobs the group callback turns down are passed over, but not without
 * end. */
#define WORKER_GATHER_SCAN 256u

/* How often, while jobs are out, the loop looks for jobs left behind a
 * long one (see DESIGN). */
#define WORKER_NUDGE_MS 1

struct worker {
    _Alignas(64) pthread_t thread; /* workers do not share cache lines */
    worker_pool_t *pool;
    unsigned index;             /* in pool->workers; kept here, off the pool's busy lines */
    void *scratch;              /* owned; pool->scratch_bytes */
    workbuf_t tokens;           /* owned; uint32_t values */
    workbuf_t logits;           /* owned; doubles */
    _Atomic uint64_t job_start; /* uv_hrtime() when the current job started; 0 if idle */
    _Atomic uint64_t job_ns;    /* running mean of its jobs' time; written by the worker only */
    /* Progress within a job (worker_progress()); written by the worker only. */
    _Atomic uint64_t progress_ns; /* uv_hrtime() when it last counted positions */
    _Atomic uint64_t positions;   /* positions counted, ever */

    /* The local batch: jobs taken and not started are local[claim ..
     * nlocal).  local, local_seq and nlocal are written by the worker under
     * queue_lock, only while the batch is empty; `claim` moves up by the
     * worker's compare-and-swap (without the lock), by a stealer's (under
     * it), or to nlocal by take_back's exchange (under it). */
    worker_job_t *local[WORKER_TAKE_MAX];
    unsigned nlocal;
    _Atomic unsigned claim;
    uint64_t local_seq[WORKER_TAKE_MAX]; /* as `local`: each job's place in submission order */
    /* As `local`: copies of each job's hints, taken with the job. */
    const void *local_hint[WORKER_TAKE_MAX][WORKER_HINTS];
    uint8_t local_lines[WORKER_TAKE_MAX][WORKER_HINTS];
    unsigned back;        /* queue_lock: take_back's cursor in `local` */
    worker_job_t **batch; /* owned; pool->max_batch: the jobs of the batch running */
    size_t nbatch;        /* jobs in `batch`: gathered, then running */
    unsigned nrequeue;    /* jobs of `batch` marked by worker_job_requeue() */

    /* A job run by worker_yield() inside a long one: its batch of one and
     * its token and logit buffers (owned, grown on first use), swapped in
     * for those of the long job while it runs.  The worker's only. */
    bool nested;
    worker_job_t *nest_batch[1];
    workbuf_t nest_tokens, nest_logits;

    uv_sem_t wake;          /* the worker sleeps on it; posted once per wake-up */
    bool asleep;            /* queue_lock: on the sleepers stack, not yet woken */
    worker_t *next_sleeper; /* queue_lock */
};

struct worker_pool {
    uv_async_t async;    /* loop thread; workers only uv_async_send() it */
    uv_timer_t nudge;    /* loop thread: runs while jobs are out, if wake_ns > 0 */
    unsigned handles;    /* loop thread: of the two above, those not yet closed */
    uint64_t wake_ns;    /* immutable */
    size_t record_bytes; /* immutable */
    worker_run_cb run;
    worker_done_cb done;
    worker_group_cb group;         /* immutable; NULL: no batches */
    worker_run_batch_cb run_batch; /* immutable */
    size_t max_batch;              /* immutable; at least 1 */
    uint64_t batch_ns;             /* immutable; 0: no bound */
    void *arg;
    size_t scratch_bytes, tokens_cap, logits_cap; /* immutable */
    size_t outstanding;                           /* loop thread: submitted, not yet done */

    pthread_mutex_t queue_lock; /* guards the fields down to `stopping`, and every flow */
    sched_t sched;              /* queue_lock: the flows with queued jobs */
    worker_flow_t own_flow;     /* queue_lock: the flow of jobs that name none */
    size_t queued;              /* queue_lock: jobs in the flows */
    worker_t *sleepers;         /* queue_lock: stack of workers waiting for a wake-up */
    unsigned waking;            /* queue_lock: woken, not yet back at the queue */
    unsigned nsleeping;         /* queue_lock: workers on the sleepers stack */
    uint64_t taken;             /* queue_lock: jobs ever taken off the queue */
    tenantcap_t caps;           /* queue_lock: the busy capped flows (tenantcap.c) */
    bool stopping;              /* queue_lock */

    /* Completed jobs, the latest first (DESIGN), on a line of its own:
     * both workers and the loop write it, and nothing else near. */
    char pad_done[64];
    _Atomic(worker_job_t *) done_top;
    char pad_done_end[64];

    int sched_err;     /* worker_pool_sched_error() */
    unsigned nworkers; /* cfg.threads */
    unsigned nthreads; /* threads started and not yet joined */
    unsigned nsems;    /* workers whose `wake` is initialised */
    worker_t *workers; /* nworkers of them, owned, cache-line aligned */
};

void worker_flow_init(worker_flow_t *f)
{
    sched_flow_init(&f->_sched);
    f->_head = f->_tail = NULL;
    f->_taken = f->_peak = 0;
    f->_idle_at = f->_served = 0;
    f->_capped = f->_busy = false;
    f->_bnext = f->_bprev = NULL;
}

void worker_flow_set_capped(worker_flow_t *f)
{
    f->_capped = true;
}

static worker_t *do_pick_sleeper(worker_pool_t *wp, size_t unstarted);

/* jobs[0 .. n-1] are back (done, or about to be): their capped flows'
 * counts drop, and a sleeper is woken if queued jobs held back may now
 * run.  Worker w, without queue_lock. */
static void untake(worker_pool_t *wp, worker_job_t *const *jobs, size_t n)
{
    worker_t *wake;

    if (!tenantcap__any(jobs, n))
        return;
    pthread_mutex_lock(&wp->queue_lock);
    for (size_t i = 0; i < n; i++)
        if (jobs[i]->_capped)
            tenantcap__do_taken_add(&wp->caps, jobs[i]->flow, -1);
    wake = wp->queued > 0 ? do_pick_sleeper(wp, wp->queued) : NULL;
    pthread_mutex_unlock(&wp->queue_lock);
    if (wake != NULL)
        uv_sem_post(&wake->wake);
}

void worker_flow_set_weight(worker_flow_t *f, uint32_t weight)
{
    sched_flow_set_weight(&f->_sched, weight);
}

void worker_pool_flow_set_weight(worker_pool_t *wp, worker_flow_t *f, uint32_t weight)
{
    pthread_mutex_lock(&wp->queue_lock);
    sched_flow_set_weight(&f->_sched, weight);
    pthread_mutex_unlock(&wp->queue_lock);
}

void worker_pool_flow_forget(worker_pool_t *wp, worker_flow_t *f)
{
    pthread_mutex_lock(&wp->queue_lock);
    assert(f->_head == NULL && f->_taken == 0);
    if (f->_busy)
        tenantcap__do_busy_remove(&wp->caps, f);
    pthread_mutex_unlock(&wp->queue_lock);
}

uint64_t worker_flow_served(const worker_flow_t *f)
{
    return sched_served(&f->_sched);
}

/* Appends `job` to its flow's queue, which becomes active if it was empty.
 * Called with queue_lock held. */
static void do_enqueue(worker_pool_t *wp, worker_job_t *job)
{
    worker_flow_t *f = job->flow != NULL ? job->flow : &wp->own_flow;

    job->next = NULL;
    job->_capped = f->_capped;
    if (f->_tail != NULL) {
        f->_tail->next = job;
    } else {
        f->_head = job;
        sched_activate(&wp->sched, &f->_sched);
    }
    f->_tail = job;
    wp->queued++;
    if (f->_capped)
        tenantcap__do_busy_update(&wp->caps, f);
}

/* Takes the head of the queue of flow `f`, the one the scheduler serves
 * next, and charges its cost.  Called with queue_lock held. */
static worker_job_t *do_dequeue(worker_pool_t *wp, worker_flow_t *f)
{
    worker_job_t *job = f->_head;

    assert(job != NULL && sched_peek(&wp->sched) == &f->_sched);
    f->_head = job->next;
    if (f->_head == NULL)
        f->_tail = NULL;
    sched_serve(&wp->sched, worker_job_cost(job), f->_head != NULL);
    wp->queued--;
    tenantcap__do_taken_add(&wp->caps, f, 1);
    return job;
}

/* The flow the scheduler serves next; NULL if nothing is queued.  Called
 * with queue_lock held. */
static worker_flow_t *do_next_flow(worker_pool_t *wp)
{
    sched_flow_t *sf = sched_peek(&wp->sched);

    return sf != NULL ? container_of(sf, worker_flow_t, _sched) : NULL;
}

void worker_batch_push(worker_batch_t *b, worker_job_t *job)
{
    job->next = NULL;
    if (b->tail != NULL)
        b->tail->next = job;
    else
        b->head = job;
    b->tail = job;
    b->n++;
}

uint64_t worker_job_start(const worker_t *w)
{
    return atomic_load_explicit(&w->job_start, memory_order_relaxed);
}

unsigned worker_index(const worker_t *w)
{
    return w->index;
}

void *worker_scratch(worker_t *w)
{
    return w->scratch;
}

uint32_t *worker_tokens(worker_t *w, size_t n)
{
    return workbuf_room(&w->tokens, n, sizeof(uint32_t));
}

double *worker_logits(worker_t *w, size_t n)
{
    return workbuf_room(&w->logits, n, sizeof(double));
}

/* Prefetches what job i of w's local batch will read (see DESIGN), if
 * there is such a job.  Addresses only: the job may be another worker's
 * by now (stolen), or done and its record freed, and a prefetch neither
 * reads nor faults.  Worker w. */
static void prefetch_local(const worker_t *w, unsigned i)
{
    const char *rec;
    size_t bytes;

    if (i >= w->nlocal)
        return;
    /* Bounds and addresses in locals: read once, not at every turn of
     * the loops. */
    rec = (const char *)w->local[i];
    bytes = w->pool->record_bytes;
    /* The job's first line is the one take_jobs() read. */
    for (size_t off = WORKER_LINE; off < bytes; off += WORKER_LINE)
        __builtin_prefetch(rec + off);
    for (unsigned h = 0; h < WORKER_HINTS; h++) {
        const char *p = w->local_hint[i][h];
        for (unsigned l = w->local_lines[i][h]; l > 0; l--, p += WORKER_LINE)
            __builtin_prefetch(p);
    }
}

/* Claims the next job of w's local batch, and prefetches for the one
 * after it; NULL if none is left (or take_back took them).  Worker w. */
static worker_job_t *claim_local(worker_t *w)
{
    unsigned i = atomic_load_explicit(&w->claim, memory_order_relaxed);

    while (i < w->nlocal)
        if (atomic_compare_exchange_weak_explicit(&w->claim, &i, i + 1, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            prefetch_local(w, i + 1);
            return w->local[i];
        }
    return NULL;
}

/* Whether `unstarted` jobs are worth waking a worker for (see DESIGN):
 * no worker is awake, none of the awake ones has been in its current job
 * for less than wake_ns, one that has holds unstarted jobs of its local
 * batch, or the jobs, after the current jobs of the young ones, would keep
 * those busy for longer than wake_ns.  Called with queue_lock held, which
 * keeps the sleepers' `asleep` flags and the local batches still. */
static bool worth_waking(const worker_pool_t *wp, size_t unstarted)
{
    uint64_t now, per_job = 0, avail = 0, ahead = 0;

    if (wp->wake_ns == 0 || wp->nsleeping == wp->nworkers)
        return true;
    now = uv_hrtime();
    for (unsigned i = 0; i < wp->nworkers; i++) {
        const worker_t *v = &wp->workers[i];
        uint64_t t, mean;

        if (v->asleep)
            continue;
        /* Idle (between jobs, or not started yet) or in a young job: it
         * will be at the queue soon. */
        t = atomic_load_explicit(&v->job_start, memory_order_relaxed);
        if (t == 0 || now < t || now - t < wp->wake_ns) {
            avail++;
            ahead += t != 0; /* its current job comes first */
        } else if (atomic_load_explicit(&v->claim, memory_order_relaxed) < v->nlocal) {
            return true; /* stuck with jobs of its batch unstarted */
        }
        mean = atomic_load_explicit(&v->job_ns, memory_order_relaxed);
        if (mean > per_job)
            per_job = mean;
    }
    if (avail == 0)
        return true;
    /* In doubles: wake_ns may be any value, and this is an estimate. */
    return per_job > 0 &&
           (double)(unstarted + ahead) * (double)per_job > (double)wp->wake_ns * (double)avail;
}

/* Pops a sleeping worker and marks it woken, if one is needed: some
 * sleep, `unstarted` jobs (queued, or waiting in a local batch) are left
 * for them and worth a wake-up, and no worker woken earlier is still on
 * its way to the queue (that one fans out further).  The caller signals
 * the worker's `wake` after it releases queue_lock.  Called with
 * queue_lock held. */
static worker_t *do_pick_sleeper(worker_pool_t *wp, size_t unstarted)
{
    worker_t *w = wp->sleepers;

    if (w == NULL || wp->waking > 0 || unstarted == 0 || !worth_waking(wp, unstarted))
        return NULL;
    wp->sleepers = w->next_sleeper;
    w->next_sleeper = NULL;
    w->asleep = false;
    wp->nsleeping--;
    wp->waking++;
    return w;
}

/* Moves the first half (rounded up) of the unstarted jobs of another
 * worker's local batch into w's empty one, so that a job never waits
 * behind a long one while a worker is free; the first is claimed.  With
 * `stuck_before` not 0, only from a worker whose current job began before
 * that uv_hrtime().  Returns false if no such worker holds unstarted jobs.
 * Called with queue_lock held, which keeps every local batch from being
 * refilled. */
static bool do_steal(worker_t *w, uint64_t stuck_before)
{
    worker_pool_t *wp = w->pool;

    /* nworkers, not nthreads: the loop thread may still be starting them. */
    for (unsigned k = 0; k < wp->nworkers; k++) {
        worker_t *v = &wp->workers[k];
        unsigned i = atomic_load_explicit(&v->claim, memory_order_relaxed), n;
        uint64_t t;

        if (stuck_before != 0) {
            t = atomic_load_explicit(&v->job_start, memory_order_relaxed);
            if (t == 0 || t >= stuck_before)
                continue;
        }

        while (v != w && i < v->nlocal) {
            n = (v->nlocal - i + 1) / 2;
            if (atomic_compare_exchange_weak_explicit(&v->claim, &i, i + n, memory_order_relaxed,
                                                      memory_order_relaxed)) {
                memcpy(w->local, &v->local[i], n * sizeof(w->local[0]));
                memcpy(w->local_seq, &v->local_seq[i], n * sizeof(w->local_seq[0]));
                memcpy(w->local_hint, &v->local_hint[i], n * sizeof(w->local_hint[0]));
                memcpy(w->local_lines, &v->local_lines[i], n * sizeof(w->local_lines[0]));
                w->nlocal = n;
                atomic_store_explicit(&w->claim, 1, memory_order_relaxed);
                return true;
            }
        }
    }
    return false;
}

/* Whether a local batch of a worker stuck in a long job (one begun more
 * than wake_ns ago) has unstarted jobs that w can steal; if so w steals
 * them.  Called with queue_lock held. */
static bool do_steal_stuck(worker_t *w)
{
    worker_pool_t *wp = w->pool;
    bool others = false;
    uint64_t now;

    /* No clock reading unless some other worker holds unstarted jobs. */
    for (unsigned k = 0; k < wp->nworkers && !others; k++) {
        const worker_t *v = &wp->workers[k];
        others = v != w && atomic_load_explicit(&v->claim, memory_order_relaxed) < v->nlocal;
    }
    if (wp->wake_ns == 0 || !others)
        return false;
    now = uv_hrtime();
    return now > wp->wake_ns && do_steal(w, now - wp->wake_ns);
}

static size_t gather(worker_t *w, worker_job_t *first, bool locked);

/* Ends a take: w's local batch is filled and its first job claimed.  The
 * batch that job leads is gathered (w->nbatch) before queue_lock goes, so
 * that a worker free at that moment cannot split it: two `base` steps run
 * alone on two cores went at 0.73-0.87 times the speed of the two as one
 * batch on one (see DESIGN).  Then a sleeper is woken for what is left,
 * `queued` (wp->queued, or 0 to leave the queue out) and w's unclaimed
 * jobs, if it is worth it.  Returns the first job.  Called with
 * queue_lock held; releases it.  Worker w. */
static worker_job_t *took(worker_t *w, size_t queued)
{
    worker_pool_t *wp = w->pool;
    worker_job_t *first = w->local[0];
    worker_t *wake;
    unsigned claim;

    w->batch[0] = first;
    w->nbatch = first->lone ? 1 : gather(w, first, true);
    claim = atomic_load_explicit(&w->claim, memory_order_relaxed);
    wake = do_pick_sleeper(wp, queued + w->nlocal - claim);
    pthread_mutex_unlock(&wp->queue_lock);
    if (wake != NULL)
        uv_sem_post(&wake->wake);
    prefetch_local(w, claim);
    return first;
}

/* Fills w's (empty) local batch with jobs stolen from a stuck worker's
 * local batch, else its share of the queue, else jobs stolen from another
 * local batch, sleeping until there are some; returns the first job of it,
 * already claimed and with its batch gathered (took()), or NULL when the
 * pool stops and nothing is left to take.  Worker w. */
static worker_job_t *take_jobs(worker_t *w)
{
    worker_pool_t *wp = w->pool;
    worker_flow_t *skipped[WORKER_GATHER_SCAN];
    worker_job_t *job;
    uint64_t sum, bound;
    size_t n, nskip;
    bool held = false;

    pthread_mutex_lock(&wp->queue_lock);
again:
    for (;;) {
        /* Jobs in the local batch of a stuck worker were taken off the
         * queue before anything still in it: they come first, or a queue
         * the loop keeps busy would leave them there for good. */
        if (wp->queued > 0 ? do_steal_stuck(w) : do_steal(w, 0))
            return took(w, 0);
        if (wp->queued > 0 && !held)
            break;
        /* Every queued job held back (capped flows): sleep until one of
         * theirs comes back (untake() wakes a sleeper). */
        held = false;
        if (wp->queued == 0 && wp->stopping) { /* nothing left to run but what others hold */
            pthread_mutex_unlock(&wp->queue_lock);
            return NULL;
        }
        w->asleep = true;
        w->next_sleeper = wp->sleepers;
        wp->sleepers = w;
        wp->nsleeping++;
        pthread_mutex_unlock(&wp->queue_lock);
        uv_sem_wait(&w->wake);
        pthread_mutex_lock(&wp->queue_lock);
        assert(!w->asleep && wp->waking > 0);
        wp->waking--;
    }
    /* The fair share, rounded up so that one job is never left behind. */
    n = (wp->queued + wp->nworkers - 1) / wp->nworkers;
    if (n > WORKER_TAKE_MAX)
        n = WORKER_TAKE_MAX;
    /* Within `bound` of work too: the local batch saves lock round trips
     * on cheap jobs; a job dearer than wake_ns is worth a trip of its
     * own, and a cheap one taken behind it would wait for it even with
     * another worker free (a gather runs the dear one as a batch first).
     * Nor does a job that does not fit join jobs taken before it: a
     * `base` step behind a `tiny` one would run apart from the `base`
     * step queued with it, not as one batch with it.  The jobs of one
     * flow are taken in a run and charged at once: one operation of the
     * scheduler's heap per run, not per job. */
    bound = wp->batch_ns;
    if (wp->wake_ns > 0 && (bound == 0 || wp->wake_ns < bound))
        bound = wp->wake_ns;
    for (w->nlocal = 0, sum = 0, nskip = 0; w->nlocal < n;) {
        worker_flow_t *f = do_next_flow(wp);
        uint64_t run = 0, cost;
        unsigned first = w->nlocal;
        if (f == NULL)
            break;
        if (tenantcap__do_held_back(&wp->caps, f)) {
            if (nskip == WORKER_GATHER_SCAN)
                break;
            (void)sched_pop(&wp->sched);
            skipped[nskip++] = f;
            continue;
        }
        cost = worker_job_cost(f->_head);
        if (w->nlocal > 0 && bound > 0 && sum + cost > bound)
            break;
        for (;;) {
            job = f->_head;
            f->_head = job->next;
            tenantcap__do_taken_add(&wp->caps, f, 1);
            run += cost;
            w->local[w->nlocal] = job;
            w->local_seq[w->nlocal] = ++wp->taken;
            memcpy(w->local_hint[w->nlocal], job->hint, sizeof(job->hint));
            memcpy(w->local_lines[w->nlocal], job->hint_lines, sizeof(job->hint_lines));
            if (++w->nlocal == n || f->_head == NULL || tenantcap__do_held_back(&wp->caps, f))
                break;
            cost = worker_job_cost(f->_head);
            if (bound > 0 && sum + run + cost > bound)
                break;
        }
        if (f->_head == NULL)
            f->_tail = NULL;
        sched_serve(&wp->sched, run, f->_head != NULL);
        wp->queued -= w->nlocal - first;
        if (f->_capped)
            tenantcap__do_busy_update(&wp->caps, f);
        sum += run;
    }
    while (nskip > 0)
        sched_put_back(&wp->sched, &skipped[--nskip]->_sched);
    if (w->nlocal == 0) {
        held = true;
        goto again;
    }
    atomic_store_explicit(&w->claim, 1, memory_order_relaxed);
    return took(w, wp->queued);
}

/* Adds a job's time `ns` to w's running mean, over about its last eight
 * jobs.  Worker w. */
static void note_job_ns(worker_t *w, uint64_t ns)
{
    uint64_t mean = atomic_load_explicit(&w->job_ns, memory_order_relaxed);

    atomic_store_explicit(&w->job_ns, mean - mean / 8 + ns / 8, memory_order_relaxed);
}

/* Whether a job of cost `cost` fits in a batch whose jobs cost `sum`
 * (the batch_ns bound; a sum that is still 0 admits anything). */
static bool batch_fits(const worker_pool_t *wp, uint64_t sum, uint64_t cost)
{
    return wp->batch_ns == 0 || sum == 0 || sum + cost <= wp->batch_ns;
}

/* Gathers the batch that `first` (just claimed, and in w->batch[0])
 * leads into w->batch: first, then the jobs the group callback admits
 * with it, up to max_batch in all and while their costs fit in batch_ns:
 * the unstarted jobs of w's local batch that follow at once (claimed as
 * claim_local() claims), then queued jobs in the order the scheduler
 * serves them, at most w's fair share of the queue (its jobs over the
 * workers, rounded up), passing over the flows whose next job the
 * callback turns down, WORKER_GATHER_SCAN at most.  Returns how many.
 * `locked`: the caller holds queue_lock (and keeps it), else gather()
 * takes it for the queue.  Worker w. */
static size_t gather(worker_t *w, worker_job_t *first, bool locked)
{
    worker_pool_t *wp = w->pool;
    worker_flow_t *skipped[WORKER_GATHER_SCAN], *f;
    size_t n = 1, share, nskip = 0;
    uint64_t sum = worker_job_cost(first);
    unsigned i;

    if (wp->max_batch < 2 || !wp->group(first, NULL, wp->arg))
        return 1;
    i = atomic_load_explicit(&w->claim, memory_order_relaxed);
    while (n < wp->max_batch && i < w->nlocal && wp->group(first, w->local[i], wp->arg) &&
           batch_fits(wp, sum, worker_job_cost(w->local[i]))) {
        if (atomic_compare_exchange_weak_explicit(&w->claim, &i, i + 1, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            sum += worker_job_cost(w->local[i]);
            w->batch[n++] = w->local[i++];
        }
    }
    if (n == wp->max_batch)
        return n;

    if (!locked)
        pthread_mutex_lock(&wp->queue_lock);
    share = (wp->queued + wp->nworkers - 1) / wp->nworkers;
    for (unsigned k = 0, idle = 0; k < wp->nworkers; k++) {
        /* Nobody else free to take the rest: take what is ready. */
        idle += &wp->workers[k] != w &&
                atomic_load_explicit(&wp->workers[k].job_start, memory_order_relaxed) == 0;
        if (k + 1 == wp->nworkers && idle == 0)
            share = wp->queued;
    }
    if (share > wp->max_batch - n)
        share = wp->max_batch - n;
    /* The flows least served first; one whose next job cannot join is
     * set aside, its place kept, and put back after. */
    for (size_t took = 0; took < share && (f = do_next_flow(wp)) != NULL;) {
        worker_job_t *job = f->_head;
        if (tenantcap__do_held_back(&wp->caps, f) || !wp->group(first, job, wp->arg)) {
            if (nskip == WORKER_GATHER_SCAN)
                break;
            (void)sched_pop(&wp->sched);
            skipped[nskip++] = f;
            continue;
        }
        if (!batch_fits(wp, sum, worker_job_cost(job)))
            break;
        w->batch[n++] = do_dequeue(wp, f);
        sum += worker_job_cost(job);
        wp->taken++;
        took++;
    }
    while (nskip > 0)
        sched_put_back(&wp->sched, &skipped[--nskip]->_sched);
    if (!locked)
        pthread_mutex_unlock(&wp->queue_lock);
    return n;
}

/* Pushes jobs[0 .. n-1] on the completion stack in that order, with one
 * exchange, linked so that the drain, which reverses the stack, sees them
 * in that order.  Worker w. */
static void push_done(worker_pool_t *wp, worker_job_t **jobs, size_t n)
{
    worker_job_t *top;

    for (size_t k = 0; k + 1 < n; k++)
        jobs[k + 1]->next = jobs[k];
    top = atomic_load_explicit(&wp->done_top, memory_order_relaxed);
    do
        jobs[0]->next = top;
    while (!atomic_compare_exchange_weak_explicit(&wp->done_top, &top, jobs[n - 1],
                                                  memory_order_acq_rel, memory_order_relaxed));
    if (top == NULL)
        uv_async_send(&wp->async);
}

void worker_job_handoff(worker_t *w, worker_job_t *done, worker_job_t *next)
{
    size_t i = 0;

    while (w->batch[i] != done)
        i++;
    assert(i < w->nbatch);
    done->_early = true;
    next->_capped = done->_capped; /* counted in place of `done` */
    w->batch[i] = next;
    push_done(w->pool, &done, 1);
    atomic_store_explicit(&w->job_start, uv_hrtime(), memory_order_relaxed);
}

void worker_job_requeue(worker_t *w, worker_job_t *job)
{
    job->_requeue = true;
    w->nrequeue++;
}

static void requeue(worker_t *w, size_t n);

void worker_progress(worker_t *w, uint64_t positions)
{
    /* One writer: no read-modify-write needed. */
    atomic_store_explicit(&w->positions,
                          atomic_load_explicit(&w->positions, memory_order_relaxed) + positions,
                          memory_order_relaxed);
    atomic_store_explicit(&w->progress_ns, uv_hrtime(), memory_order_relaxed);
}

/* Takes the next queued job worker_yield() may run: from the flow the
 * scheduler serves first, if that flow is not `mine` and its head starts
 * before `vpos` and costs at most `light_ns`; flows that fail only the
 * last two tests are passed over (WORKER_GATHER_SCAN at most) and put
 * back after.  NULL if there is none.  Called with queue_lock held. */
static worker_job_t *do_take_light(worker_t *w, const worker_flow_t *mine, uint64_t vpos,
                                   uint64_t light_ns)
{
    worker_pool_t *wp = w->pool;
    worker_flow_t *skipped[WORKER_GATHER_SCAN], *f;
    worker_job_t *job = NULL;
    size_t nskip = 0;

    while ((f = do_next_flow(wp)) != NULL && sched_flow_start(&f->_sched) < vpos) {
        if (f != mine && worker_job_cost(f->_head) <= light_ns &&
            !tenantcap__do_held_back(&wp->caps, f)) {
            job = do_dequeue(wp, f);
            wp->taken++;
            break;
        }
        if (nskip == WORKER_GATHER_SCAN)
            break;
        (void)sched_pop(&wp->sched);
        skipped[nskip++] = f;
    }
    while (nskip > 0)
        sched_put_back(&wp->sched, &skipped[--nskip]->_sched);
    return job;
}

/* Runs `job`, taken by do_take_light(), inside the long job w is running,
 * and hands it on as worker_main() would; the long job's batch, buffers
 * and start time are put back after.  Worker w. */
static void run_nested(worker_t *w, worker_job_t *job)
{
    worker_pool_t *wp = w->pool;
    worker_job_t **outer = w->batch;
    size_t outer_n = w->nbatch;
    unsigned outer_requeue = w->nrequeue;
    uint64_t outer_start = atomic_load_explicit(&w->job_start, memory_order_relaxed);
    workbuf_t tokens = w->tokens, logits = w->logits;

    w->nested = true;
    w->batch = w->nest_batch;
    w->batch[0] = job;
    w->nbatch = 1;
    w->nrequeue = 0;
    w->tokens = w->nest_tokens;
    w->logits = w->nest_logits;
    atomic_store_explicit(&w->job_start, uv_hrtime(), memory_order_relaxed);
    wp->run(w, job, wp->arg);
    workbuf_trim(&w->tokens, wp->tokens_cap, sizeof(uint32_t));
    workbuf_trim(&w->logits, wp->logits_cap, sizeof(double));
    w->nest_tokens = w->tokens;
    w->nest_logits = w->logits;
    w->tokens = tokens;
    w->logits = logits;
    if (w->nrequeue > 0) {
        requeue(w, 1);
    } else {
        untake(wp, w->batch, 1);
        push_done(wp, w->batch, 1);
    }
    w->batch = outer;
    w->nbatch = outer_n;
    w->nrequeue = outer_requeue;
    atomic_store_explicit(&w->job_start, outer_start, memory_order_relaxed);
    w->nested = false;
}

/* Whether a worker other than w is in no job (asleep, or on its way to
 * the queue).  Worker w. */
static bool other_idle(const worker_t *w)
{
    const worker_pool_t *wp = w->pool;

    for (unsigned k = 0; k < wp->nworkers; k++)
        if (&wp->workers[k] != w &&
            atomic_load_explicit(&wp->workers[k].job_start, memory_order_relaxed) == 0)
            return true;
    return false;
}

uint64_t worker_yield(worker_t *w, const worker_job_t *job, worker_slices_t *sl, uint64_t done_ns,
                      uint64_t light_ns, uint64_t budget_ns)
{
    worker_pool_t *wp = w->pool;
    const worker_flow_t *mine = job->flow != NULL ? job->flow : &wp->own_flow;
    uint64_t t0, now;
    worker_job_t *other;

    if (w->nested)
        return 0;
    t0 = now = uv_hrtime();
    do {
        /* The unstarted jobs of w's local batch first, cheap ones, in
         * order: they were taken off the queue, and charged, before
         * anything still in it, and no one else runs them while w is in
         * this job but a stealer.  A job is claimed only after its cost
         * was read: a compare-and-swap on exactly its index. */
        unsigned i = atomic_load_explicit(&w->claim, memory_order_relaxed);
        if (i < w->nlocal && worker_job_cost(w->local[i]) <= light_ns &&
            atomic_compare_exchange_strong_explicit(&w->claim, &i, i + 1, memory_order_relaxed,
                                                    memory_order_relaxed)) {
            run_nested(w, w->local[i]);
            now = uv_hrtime();
            continue;
        }
        /* Queued jobs are left to another worker that is free: it is
         * woken for them (the wake-up rule counts a long job as stuck). */
        if (other_idle(w))
            break;
        pthread_mutex_lock(&wp->queue_lock);
        /* The job's slices count from the virtual time it was first seen
         * at: its flow's start then was no later. */
        if (!sl->_based) {
            sl->_vbase = sched_vtime(&wp->sched);
            sl->_based = true;
        }
        other = wp->queued > 0 ? do_take_light(w, mine, sl->_vbase + done_ns, light_ns) : NULL;
        pthread_mutex_unlock(&wp->queue_lock);
        if (other == NULL)
            break;
        run_nested(w, other);
        now = uv_hrtime();
    } while (now - t0 < budget_ns);
    return now - t0;
}

/* Ends a run of n jobs some of which go back to their flows' queues
 * (worker_job_requeue()), in one hold of the lock, so that the chains of
 * a batch are queued together and a worker taking one gathers the rest;
 * the others go to `done`.  Nobody is woken for them: w goes back to the
 * queue next, unless unstarted jobs of its local batch come first.
 * Worker w. */
static void requeue(worker_t *w, size_t n)
{
    worker_pool_t *wp = w->pool;
    worker_t *wake;
    size_t k = 0;
    unsigned claim;

    pthread_mutex_lock(&wp->queue_lock);
    for (size_t i = 0; i < n; i++) {
        worker_job_t *job = w->batch[i];
        if (job->_capped)
            tenantcap__do_taken_add(&wp->caps, job->flow, -1);
        if (job->_requeue) {
            job->_requeue = false;
            do_enqueue(wp, job);
        } else {
            w->batch[k++] = job;
        }
    }
    w->nrequeue = 0;
    claim = atomic_load_explicit(&w->claim, memory_order_relaxed);
    wake = do_pick_sleeper(wp, claim < w->nlocal ? wp->queued + w->nlocal - claim : 0);
    pthread_mutex_unlock(&wp->queue_lock);
    if (wake != NULL)
        uv_sem_post(&wake->wake);
    if (k > 0)
        push_done(wp, w->batch, k);
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    worker_pool_t *wp = w->pool;
    worker_job_t *job;
    uint64_t t0, last = 0; /* when the job before began, if this one follows it at once */
    size_t n = 1, last_n = 1;

    for (;;) {
        /* A job's time, for job_ns, runs from its start to the start of
         * the next (its completion included), or to the moment the worker
         * goes back to the queue: one clock reading per job. */
        job = claim_local(w);
        if (job != NULL) {
            w->batch[0] = job;
            n = w->nbatch = job->lone ? 1 : gather(w, job, false);
        } else {
            if (last != 0)
                note_job_ns(w, uv_hrtime() - last);
            last = 0;
            if ((job = take_jobs(w)) == NULL)
                break;
            n = w->nbatch;
        }
        t0 = uv_hrtime();
        /* A batch's time counts as its jobs' mean. */
        if (last != 0)
            note_job_ns(w, last_n == 1 ? t0 - last : (t0 - last) / last_n);
        last = t0;

        atomic_store_explicit(&w->job_start, t0, memory_order_relaxed);
        if (n == 1)
            wp->run(w, job, wp->arg);
        else
            wp->run_batch(w, w->batch, n, wp->arg);
        atomic_store_explicit(&w->job_start, 0, memory_order_relaxed);
        last_n = n;
        workbuf_trim(&w->tokens, wp->tokens_cap, sizeof(uint32_t));
        workbuf_trim(&w->logits, wp->logits_cap, sizeof(double));

        /* The batch's jobs go on the stack in batch order, one exchange;
         * a job may have become another (a chain), or go back to its
         * flow. */
        if (w->nrequeue > 0) {
            requeue(w, n);
        } else {
            untake(wp, w->batch, n);
            push_done(wp, w->batch, n);
        }
    }
    return NULL;
}

/* Hands every completed job to `done`, in completion order.  Loop thread. */
static void drain_completions(worker_pool_t *wp)
{
    worker_job_t *job, *next, *first = NULL;

    /* The stack holds them latest first: reverse it. */
    job = atomic_exchange_explicit(&wp->done_top, NULL, memory_order_acq_rel);
    for (; job != NULL; job = next) {
        next = job->next;
        job->next = first;
        first = job;
    }
    for (job = first; job != NULL; job = next) {
        next = job->next;
        if (job->_early) { /* a chain's: the chain counts once */
            job->_early = false;
        } else {
            assert(wp->outstanding > 0);
            wp->outstanding--;
        }
        wp->done(job, wp->arg);
    }
}

static void async_cb(uv_async_t *h)
{
    drain_completions(container_of(h, worker_pool_t, async));
}

/* Jobs unstarted: queued, or in a local batch.  Called with queue_lock
 * held, which keeps every local batch from being refilled. */
static size_t do_unstarted(const worker_pool_t *wp)
{
    size_t n = wp->queued;

    for (unsigned i = 0; i < wp->nworkers; i++) {
        const worker_t *v = &wp->workers[i];
        unsigned c = atomic_load_explicit(&v->claim, memory_order_relaxed);
        if (c < v->nlocal)
            n += v->nlocal - c;
    }
    return n;
}

/* The timer of DESIGN: wakes a sleeper for jobs left behind a long one;
 * stops once no job is out.  Loop thread. */
static void nudge_cb(uv_timer_t *h)
{
    worker_pool_t *wp = container_of(h, worker_pool_t, nudge);
    worker_t *wake;

    if (wp->outstanding == 0) {
        uv_timer_stop(h);
        return;
    }
    pthread_mutex_lock(&wp->queue_lock);
    wake = wp->sleepers != NULL && wp->waking == 0 ? do_pick_sleeper(wp, do_unstarted(wp)) : NULL;
    pthread_mutex_unlock(&wp->queue_lock);
    if (wake != NULL)
        uv_sem_post(&wake->wake);
}

/* Stops and joins the started threads. */
static void stop_threads(worker_pool_t *wp)
{
    worker_t *w, *next;

    pthread_mutex_lock(&wp->queue_lock);
    wp->stopping = true;
    w = wp->sleepers; /* woken all, as do_pick_sleeper() would */
    wp->sleepers = NULL;
    wp->nsleeping = 0;
    for (next = w; next != NULL; next = next->next_sleeper) {
        next->asleep = false;
        wp->waking++;
    }
    pthread_mutex_unlock(&wp->queue_lock);
    for (; w != NULL; w = next) {
        next = w->next_sleeper;
        uv_sem_post(&w->wake);
    }
    for (unsigned i = 0; i < wp->nthreads; i++)
        pthread_join(wp->workers[i].thread, NULL);
    wp->nthreads = 0;
}

/* Frees the workers' memory and the pool's locks, and the pool. */
static void free_pool(worker_pool_t *wp)
{
    for (unsigned i = 0; i < wp->nworkers; i++) {
        free(wp->workers[i].scratch);
        free(wp->workers[i].batch);
        workbuf_free(&wp->workers[i].tokens);
        workbuf_free(&wp->workers[i].logits);
        workbuf_free(&wp->workers[i].nest_tokens);
        workbuf_free(&wp->workers[i].nest_logits);
    }
    for (unsigned i = 0; i < wp->nsems; i++)
        uv_sem_destroy(&wp->workers[i].wake);
    free(wp->workers);
    pthread_mutex_destroy(&wp->queue_lock);
    free(wp);
}

int worker_pool_create(uv_loop_t *loop, const worker_pool_config_t *cfg, worker_pool_t **out)
{
    worker_pool_t *wp;
    unsigned n = cfg->threads;
    int rc = UV_ENOMEM;

    assert(n >= 1);
    wp = calloc(1, sizeof(*wp));
    if (wp == NULL)
        return UV_ENOMEM;
    if (pthread_mutex_init(&wp->queue_lock, NULL) != 0) {
        free(wp);
        return UV_ENOMEM;
    }
    atomic_init(&wp->done_top, NULL);
    /* From here free_pool() undoes whatever was done. */
    /* sizeof(worker_t) is a multiple of its alignment, as aligned_alloc()
     * wants of the size. */
    wp->workers = aligned_alloc(_Alignof(worker_t), (size_t)n * sizeof(worker_t));
    if (wp->workers == NULL)
        goto fail;
    memset(wp->workers, 0, n * sizeof(worker_t));
    wp->nworkers = n;
    wp->run = cfg->run;
    wp->done = cfg->done;
    wp->group = cfg->run_batch != NULL ? cfg->group : NULL;
    wp->run_batch = cfg->run_batch;
    wp->max_batch = cfg->max_batch > 1 && wp->group != NULL ? cfg->max_batch : 1;
    wp->batch_ns = cfg->batch_ns;
    sched_init(&wp->sched);
    worker_flow_init(&wp->own_flow);
    wp->arg = cfg->arg;
    wp->wake_ns = cfg->wake_ns;
    wp->record_bytes = cfg->record_bytes;
    wp->scratch_bytes = cfg->scratch_bytes;
    /* At least one element, so that a buffer is never NULL. */
    wp->tokens_cap = cfg->tokens_cap > 0 ? cfg->tokens_cap : 1;
    wp->logits_cap = cfg->logits_cap > 0 ? cfg->logits_cap : 1;

    for (unsigned i = 0; i < n; i++) {
        worker_t *w = &wp->workers[i];
        w->pool = wp;
        w->index = i;
        atomic_init(&w->job_start, 0);
        atomic_init(&w->job_ns, 0);
        atomic_init(&w->progress_ns, 0);
        atomic_init(&w->positions, 0);
        atomic_init(&w->claim, 0);
        w->scratch = malloc(cfg->scratch_bytes > 0 ? cfg->scratch_bytes : 1);
        w->batch = malloc(wp->max_batch * sizeof(w->batch[0]));
        if (w->scratch == NULL || w->batch == NULL || worker_tokens(w, wp->tokens_cap) == NULL ||
            worker_logits(w, wp->logits_cap) == NULL)
            goto fail;
        if (uv_sem_init(&w->wake, 0) != 0)
            goto fail;
        wp->nsems++;
    }
    for (; wp->nthreads < n; wp->nthreads++) {
        int err = pthread_create(&wp->workers[wp->nthreads].thread, NULL, worker_main,
                                 &wp->workers[wp->nthreads]);
        if (err != 0) {
            rc = -err;
            goto fail_threads;
        }
        if (cfg->sched_batch &&
            (err = pthread_setschedparam(wp->workers[wp->nthreads].thread, SCHED_BATCH,
                                         &(struct sched_param){0})))
            wp->sched_err = err;
    }
    /* Last, so that no failure after it needs the loop to close it; the
     * timer's initialisation cannot fail. */
    rc = uv_async_init(loop, &wp->async, async_cb);
    if (rc != 0)
        goto fail_threads;
    rc = uv_timer_init(loop, &wp->nudge);
    assert(rc == 0);
    wp->async.data = wp->nudge.data = wp;
    wp->handles = 2;
    *out = wp;
    return 0;

fail_threads:
    stop_threads(wp);
fail:
    free_pool(wp);
    return rc;
}

void worker_pool_submit(worker_pool_t *wp, worker_batch_t *b)
{
    worker_t *wake;

    if (b->n == 0)
        return;
    wp->outstanding += b->n;
    pthread_mutex_lock(&wp->queue_lock);
    for (worker_job_t *job = b->head, *next; job != NULL; job = next) {
        next = job->next;
        do_enqueue(wp, job);
    }
    wake = do_pick_sleeper(wp, wp->queued);
    pthread_mutex_unlock(&wp->queue_lock);
    if (wake != NULL)
        uv_sem_post(&wake->wake);
    b->head = b->tail = NULL;
    b->n = 0;
    if (wp->wake_ns > 0 && !uv_is_active((uv_handle_t *)&wp->nudge))
        uv_timer_start(&wp->nudge, nudge_cb, WORKER_NUDGE_MS, WORKER_NUDGE_MS);
}

void worker_pool_take_back(worker_pool_t *wp, worker_batch_t *out)
{
    worker_job_t *job = NULL, **tail = &job;
    sched_flow_t *sf;

    pthread_mutex_lock(&wp->queue_lock);
    /* The unstarted jobs of the local batches first: they were taken off
     * the queue before anything still in it.  Among themselves they go
     * back in the order they were taken (a steal may have moved some to
     * another worker), a few per worker, so the smallest is picked each
     * time. */
    for (unsigned i = 0; i < wp->nworkers; i++) {
        worker_t *w = &wp->workers[i];
        w->back = atomic_exchange_explicit(&w->claim, w->nlocal, memory_order_relaxed);
    }
    for (;;) {
        worker_t *first = NULL;
        for (unsigned i = 0; i < wp->nworkers; i++) {
            worker_t *w = &wp->workers[i];
            if (w->back < w->nlocal &&
                (first == NULL || w->local_seq[w->back] < first->local_seq[first->back]))
                first = w;
        }
        if (first == NULL)
            break;
        assert(wp->outstanding > 0);
        wp->outstanding--;
        if (first->local[first->back]->_capped)
            tenantcap__do_taken_add(&wp->caps, first->local[first->back]->flow, -1);
        worker_batch_push(out, first->local[first->back++]);
    }
    /* Then every flow's queue, whole, the flows in the order they would
     * have been served; each keeps its finish, so none gains by it. */
    while ((sf = sched_pop(&wp->sched)) != NULL) {
        worker_flow_t *f = container_of(sf, worker_flow_t, _sched);
        *tail = f->_head;
        tail = &f->_tail->next;
        f->_head = f->_tail = NULL;
        if (f->_capped)
            tenantcap__do_busy_update(&wp->caps, f);
    }
    wp->queued = 0;
    pthread_mutex_unlock(&wp->queue_lock);

    while (job != NULL) {
        worker_job_t *next = job->next;
        assert(wp->outstanding > 0);
        wp->outstanding--;
        worker_batch_push(out, job);
        job = next;
    }
}

int worker_pool_sched_error(const worker_pool_t *wp)
{
    return wp->sched_err;
}

bool worker_pool_wedged(const worker_pool_t *wp, uint64_t now_ns, uint64_t bound_ns)
{
    for (unsigned i = 0; i < wp->nthreads; i++) {
        uint64_t t = atomic_load_explicit(&wp->workers[i].job_start, memory_order_relaxed);
        uint64_t p = atomic_load_explicit(&wp->workers[i].progress_ns, memory_order_relaxed);
        if (t != 0 && p > t)
            t = p; /* a long job, counting its positions as it runs */
        if (t != 0 && now_ns > t && now_ns - t > bound_ns)
            return true;
    }
    return false;
}

uint64_t worker_pool_positions(const worker_pool_t *wp)
{
    uint64_t n = 0;

    for (unsigned i = 0; i < wp->nworkers; i++)
        n += atomic_load_explicit(&wp->workers[i].positions, memory_order_relaxed);
    return n;
}

size_t worker_pool_pending(worker_pool_t *wp)
{
    return wp->outstanding;
}

unsigned worker_pool_asleep(worker_pool_t *wp)
{
    unsigned n;

    pthread_mutex_lock(&wp->queue_lock);
    n = wp->nsleeping;
    pthread_mutex_unlock(&wp->queue_lock);
    return n;
}

static void close_cb(uv_handle_t *h)
{
    worker_pool_t *wp = h->data;

    if (--wp->handles == 0)
        free_pool(wp);
}

void worker_pool_close(worker_pool_t *wp)
{
    stop_threads(wp);
    drain_completions(wp);
    uv_close((uv_handle_t *)&wp->async, close_cb);
    uv_close((uv_handle_t *)&wp->nudge, close_cb);
}
