/*
 * test_worker.c: the Check suite of server/sched/worker.c, the worker
 * pool: a batch submitted at once runs on every thread and comes back whole
 * through the completion callback; jobs not yet started are taken back in
 * queue order and never run; a job that counts no progress for too long
 * shows as wedged, one that counts its progress does not; closing the
 * pool runs what is queued and hands back every completion;
 * the per-worker buffers grow for a large job.  Workers take several jobs
 * at a time: two jobs submitted together still run on two workers, a job
 * taken by a worker that is stuck on another is run by an idle worker, and
 * take_back gives back what a worker has taken but not begun, in
 * submission order; under random batches and take-backs every job is run
 * once and completed once, or given back and never run.  With a wake-up
 * threshold, cheap jobs do not wake a second worker, jobs worth more than
 * the threshold do, and a job left behind a long one is run by a sleeper
 * that the pool's timer wakes once the long one has run past it, even
 * while the loop keeps the queue busy.  The jobs' prefetch hints are
 * never read through.  With batches, every batch holds jobs the group
 * callback admits together, within the limit, and every job still runs
 * once or is given back; two jobs that batch are not split between two
 * workers by a job beside them that does not; a batch of chains hands
 * each job back as it ends and its chains requeued together come back as
 * one batch.  Asked to, the workers run under SCHED_BATCH.  A long job
 * that counts its progress is not wedged, and between its slices it runs
 * other flows' cheap jobs, not its own flow's nor dear ones.
 */
#define _GNU_SOURCE /* SCHED_BATCH */
#include <check.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <uv.h>

#include "server/sched/tenantcap_int.h"
#include "server/sched/worker.h"

typedef struct test_job {
    worker_job_t job;
    int index;
    size_t buf_n;    /* > 0: fill worker_tokens()/worker_logits() of this size */
    size_t tok_room, logit_room; /* malloc_usable_size() of those buffers, as the job saw them */
    _Atomic int ran; /* times run */
    pthread_t thread;
    int done_order;
    bool slow;                   /* sleeps a little, so that other workers get their share */
    struct test_job *chain_next; /* chain_run_cb: the job it goes on with */
    bool requeue_after;          /* chain_run_cb: requeue the rest after this one */
    int policy;                  /* the scheduling policy of the thread that ran it */
} test_job_t;

/* Shared with the run callback. */
static _Atomic int started;
static _Atomic int gate_open;
static _Atomic int gated_index = -1; /* this job waits for gate_open; -2: every job */
static _Atomic int rendezvous;       /* > 0: every job waits until this many have started */
static int done_count;

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void run_cb(worker_t *w, worker_job_t *job, void *arg)
{
    test_job_t *t = (test_job_t *)job;

    (void)arg;
    atomic_fetch_add(&started, 1);
    if (t->index == atomic_load(&gated_index) || atomic_load(&gated_index) == -2)
        while (!atomic_load(&gate_open))
            sleep_ms(1);
    /* Bounded, so that a failure is an assertion and not a hang. */
    for (int ms = 0; atomic_load(&started) < atomic_load(&rendezvous); ms++) {
        ck_assert_msg(ms < 5000, "%d of %d jobs started: they did not run side by side",
                      atomic_load(&started), atomic_load(&rendezvous));
        sleep_ms(1);
    }
    if (t->slow) {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    if (t->buf_n > 0) {
        uint32_t *tok = worker_tokens(w, t->buf_n);
        double *lg = worker_logits(w, t->buf_n);
        ck_assert_ptr_nonnull(tok);
        ck_assert_ptr_nonnull(lg);
        for (size_t i = 0; i < t->buf_n; i++) {
            tok[i] = (uint32_t)i;
            lg[i] = (double)i;
        }
        ck_assert_uint_eq(tok[t->buf_n - 1], t->buf_n - 1);
        t->tok_room = malloc_usable_size(tok);
        t->logit_room = malloc_usable_size(lg);
    }
    ck_assert_ptr_nonnull(worker_scratch(w));
    memset(worker_scratch(w), 0xab, 64);
    t->thread = pthread_self();
    t->policy = sched_getscheduler(0);
    atomic_fetch_add(&t->ran, 1);
}

static void done_cb(worker_job_t *job, void *arg)
{
    test_job_t *t = (test_job_t *)job;
    (void)arg;
    ck_assert_int_eq(atomic_load(&t->ran), 1);
    ck_assert_int_eq(t->done_order, 0);
    t->done_order = ++done_count;
}

/* A pool's settings for these tests: `threads` workers running `run`,
 * and with `run_batch` batches of group_cb's kinds (BATCH_MAX at most,
 * within batch_ns); no wake-up threshold. */
static worker_pool_config_t test_config(unsigned threads, worker_run_cb run,
                                        worker_run_batch_cb run_batch, uint64_t batch_ns);

/* Whether the next pool_new_wake() asks for SCHED_BATCH threads. */
static bool sched_batch;

/* Clears what the run callback shares between tests (no gate, no
 * rendezvous, nothing done) and starts a pool of `cfg` on `loop`. */
static worker_pool_t *pool_start(uv_loop_t *loop, const worker_pool_config_t *cfg)
{
    worker_pool_t *wp = NULL;

    atomic_store(&started, 0);
    atomic_store(&gate_open, 0);
    atomic_store(&gated_index, -1);
    atomic_store(&rendezvous, 0);
    done_count = 0;
    ck_assert_int_eq(uv_loop_init(loop), 0);
    ck_assert_int_eq(worker_pool_create(loop, cfg, &wp), 0);
    return wp;
}

/* A pool whose sleepers are woken by the rule of `wake_ns` (worker.h). */
static worker_pool_t *pool_new_wake(uv_loop_t *loop, unsigned threads, uint64_t wake_ns)
{
    worker_pool_config_t cfg = test_config(threads, run_cb, NULL, 0);

    cfg.wake_ns = wake_ns;
    cfg.sched_batch = sched_batch;
    return pool_start(loop, &cfg);
}

/* A pool that wakes a sleeper whenever jobs are left unstarted. */
static worker_pool_t *pool_new(uv_loop_t *loop, unsigned threads)
{
    return pool_new_wake(loop, threads, 0);
}

static void pool_end(uv_loop_t *loop, worker_pool_t *wp)
{
    worker_pool_close(wp);
    ck_assert_int_eq(uv_run(loop, UV_RUN_DEFAULT), 0);
    ck_assert_int_eq(uv_loop_close(loop), 0);
}

#define NJOBS 2000

START_TEST(test_batch_and_completion)
{
    uv_loop_t loop;
    worker_pool_t *wp = pool_new(&loop, 4);
    test_job_t *jobs = calloc(NJOBS, sizeof(*jobs));
    worker_batch_t b = WORKER_BATCH_INIT;
    pthread_t first;
    bool several_threads = false;

    /* Two batches, the second submitted while the first may be running. */
    for (int i = 0; i < NJOBS / 2; i++) {
        jobs[i].index = i;
        jobs[i].slow = true;
        worker_batch_push(&b, &jobs[i].job);
    }
    ck_assert_uint_eq(b.n, NJOBS / 2);
    worker_pool_submit(wp, &b);
    ck_assert_uint_eq(b.n, 0);
    ck_assert_ptr_null(b.head);
    for (int i = NJOBS / 2; i < NJOBS; i++) {
        jobs[i].index = i;
        worker_batch_push(&b, &jobs[i].job);
    }
    worker_pool_submit(wp, &b);
    ck_assert_uint_eq(worker_pool_pending(wp), NJOBS);

    while (done_count < NJOBS)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert_uint_eq(worker_pool_pending(wp), 0);
    first = jobs[0].thread;
    for (int i = 0; i < NJOBS; i++) {
        ck_assert_int_eq(atomic_load(&jobs[i].ran), 1);
        ck_assert_int_gt(jobs[i].done_order, 0);
        several_threads = several_threads || !pthread_equal(jobs[i].thread, first);
    }
    ck_assert_msg(several_threads, "every job ran on one thread");
    pool_end(&loop, wp);
    free(jobs);
}
END_TEST

START_TEST(test_take_back)
{
    uv_loop_t loop;
    worker_pool_t *wp = pool_new(&loop, 1);
    test_job_t jobs[10];
    worker_batch_t b = WORKER_BATCH_INIT, back = WORKER_BATCH_INIT;
    int i = 1;

    memset(jobs, 0, sizeof(jobs));
    atomic_store(&gated_index, 0);
    for (int k = 0; k < 10; k++) {
        jobs[k].index = k;
        worker_batch_push(&b, &jobs[k].job);
    }
    worker_pool_submit(wp, &b);
    while (atomic_load(&started) == 0) /* job 0 holds the only worker */
        sleep_ms(1);

    worker_pool_take_back(wp, &back);
    ck_assert_uint_eq(back.n, 9);
    for (worker_job_t *j = back.head; j != NULL; j = j->next, i++)
        ck_assert_ptr_eq(j, &jobs[i].job); /* queue order */
    ck_assert_int_eq(i, 10);
    ck_assert_ptr_eq(back.tail, &jobs[9].job);
    ck_assert_uint_eq(worker_pool_pending(wp), 1);

    atomic_store(&gate_open, 1);
    while (done_count < 1)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert_int_eq(jobs[0].done_order, 1);
    /* Nothing taken back ever runs, even after close. */
    pool_end(&loop, wp);
    ck_assert_int_eq(atomic_load(&started), 1);
    for (int k = 1; k < 10; k++) {
        ck_assert_int_eq(atomic_load(&jobs[k].ran), 0);
        ck_assert_int_eq(jobs[k].done_order, 0);
    }
    /* An empty queue gives nothing back. */
}
END_TEST

START_TEST(test_wedged)
{
    uv_loop_t loop;
    worker_pool_t *wp = pool_new(&loop, 2);
    test_job_t job;
    worker_batch_t b = WORKER_BATCH_INIT;

    memset(&job, 0, sizeof(job));
    ck_assert(!worker_pool_wedged(wp, uv_hrtime(), 0)); /* idle workers are never wedged */
    atomic_store(&gated_index, 0);
    worker_batch_push(&b, &job.job);
    worker_pool_submit(wp, &b);
    while (atomic_load(&started) == 0)
        sleep_ms(1);
    sleep_ms(20);
    ck_assert(worker_pool_wedged(wp, uv_hrtime(), 5 * 1000000u));
    ck_assert(!worker_pool_wedged(wp, uv_hrtime(), 60 * 1000000000ull));
    atomic_store(&gate_open, 1);
    while (done_count < 1)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert(!worker_pool_wedged(wp, uv_hrtime(), 0));
    pool_end(&loop, wp);
}
END_TEST

START_TEST(test_close_runs_queued)
{
    uv_loop_t loop;
    worker_pool_t *wp = pool_new(&loop, 2);
    test_job_t jobs[50];
    worker_batch_t b = WORKER_BATCH_INIT;

    memset(jobs, 0, sizeof(jobs));
    for (int k = 0; k < 50; k++) {
        jobs[k].index = k;
        worker_batch_push(&b, &jobs[k].job);
    }
    worker_pool_submit(wp, &b);
    /* Close at once: the queue is run, and every completion handed back
     * before the handle closes, without another loop turn. */
    worker_pool_close(wp);
    ck_assert_int_eq(done_count, 50);
    ck_assert_int_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}
END_TEST

START_TEST(test_buffers_grow)
{
    uv_loop_t loop;
    worker_pool_t *wp = pool_new(&loop, 1);
    test_job_t jobs[3];
    worker_batch_t b = WORKER_BATCH_INIT;

    memset(jobs, 0, sizeof(jobs));
    jobs[0].buf_n = 8;       /* within the start-up size */
    jobs[1].buf_n = 1 << 20; /* grown for this job only */
    jobs[2].buf_n = 16;      /* the start-up size (test_config()) */
    for (int k = 0; k < 3; k++)
        worker_batch_push(&b, &jobs[k].job);
    worker_pool_submit(wp, &b);
    while (done_count < 3)
        uv_run(&loop, UV_RUN_ONCE);
    /* The large job had its room; the job after it on the one worker finds
     * the buffers back at their start-up size, not at the large job's. */
    ck_assert_uint_ge(jobs[1].tok_room, ((size_t)1 << 20) * sizeof(uint32_t));
    ck_assert_uint_ge(jobs[1].logit_room, ((size_t)1 << 20) * sizeof(double));
    ck_assert_int_gt(jobs[2].done_order, jobs[1].done_order);
    ck_assert_uint_lt(jobs[2].tok_room, 4096);
    ck_assert_uint_lt(jobs[2].logit_room, 4096);
    pool_end(&loop, wp);
}
END_TEST

/* Runs the loop until `n` jobs are done, failing after `ms` milliseconds. */
static void wait_done(uv_loop_t *loop, int n, long ms)
{
    uint64_t end = uv_hrtime() + (uint64_t)ms * 1000000u;

    while (done_count < n) {
        ck_assert_msg(uv_hrtime() < end, "%d of %d jobs done", done_count, n);
        uv_run(loop, UV_RUN_NOWAIT);
        sleep_ms(1);
    }
}

/* Jobs 1 and 2 of three are done while job 0 is held at its gate: they
 * must have run on one worker, and job 0, once let go, on the other. */
static void release_held(uv_loop_t *loop, test_job_t jobs[3])
{
    ck_assert_int_eq(atomic_load(&jobs[0].ran), 0);
    ck_assert(pthread_equal(jobs[1].thread, jobs[2].thread));
    atomic_store(&gate_open, 1);
    wait_done(loop, 3, 10000);
    ck_assert(!pthread_equal(jobs[0].thread, jobs[1].thread));
}

START_TEST(test_two_jobs_two_workers)
{
    uv_loop_t loop;
    worker_pool_t *wp = pool_new(&loop, 2);
    test_job_t jobs[2];
    worker_batch_t b = WORKER_BATCH_INIT;

    /* Each job waits until both have started: that takes both workers, so
     * one worker must not take both jobs of a batch of two. */
    memset(jobs, 0, sizeof(jobs));
    atomic_store(&rendezvous, 2);
    for (int k = 0; k < 2; k++) {
        jobs[k].index = k;
        worker_batch_push(&b, &jobs[k].job);
    }
    worker_pool_submit(wp, &b);
    wait_done(&loop, 2, 10000);
    ck_assert(!pthread_equal(jobs[0].thread, jobs[1].thread));
    pool_end(&loop, wp);
}
END_TEST

START_TEST(test_idle_worker_runs_taken_job)
{
    uv_loop_t loop;
    worker_pool_t *wp = pool_new(&loop, 2);
    test_job_t jobs[3];
    worker_batch_t b = WORKER_BATCH_INIT;

    /* Of three jobs, the first worker takes two; the first of all is
     * stuck.  The job taken with it must still run, on the other worker,
     * before the stuck one is let go. */
    memset(jobs, 0, sizeof(jobs));
    atomic_store(&gated_index, 0);
    for (int k = 0; k < 3; k++) {
        jobs[k].index = k;
        worker_batch_push(&b, &jobs[k].job);
    }
    worker_pool_submit(wp, &b);
    wait_done(&loop, 2, 10000);
    ck_assert(worker_pool_wedged(wp, uv_hrtime() + 1000000000u, 500000000u));
    release_held(&loop, jobs);
    pool_end(&loop, wp);
}
END_TEST

#define NHELD 20

START_TEST(test_take_back_taken)
{
    uv_loop_t loop;
    worker_pool_t *wp = pool_new(&loop, 2);
    test_job_t jobs[NHELD];
    worker_batch_t b = WORKER_BATCH_INIT, back = WORKER_BATCH_INIT;
    int last = -1;

    /* Every job is held at its start: each worker runs one and holds a
     * few more taken but not begun, the rest stay queued.  All but the
     * two running come back, in submission order. */
    memset(jobs, 0, sizeof(jobs));
    atomic_store(&gated_index, -2);
    for (int k = 0; k < NHELD; k++) {
        jobs[k].index = k;
        worker_batch_push(&b, &jobs[k].job);
    }
    worker_pool_submit(wp, &b);
    for (int ms = 0; atomic_load(&started) < 2; ms++) {
        ck_assert_msg(ms < 10000, "the second worker never started a job");
        sleep_ms(1);
    }
    worker_pool_take_back(wp, &back);
    ck_assert_uint_eq(back.n, NHELD - 2);
    ck_assert_uint_eq(worker_pool_pending(wp), 2);
    for (worker_job_t *j = back.head; j != NULL; j = j->next) {
        test_job_t *t = (test_job_t *)j;
        ck_assert_int_gt(t->index, last);
        last = t->index;
    }
    ck_assert_ptr_eq(back.tail, &jobs[last].job);

    atomic_store(&gate_open, 1);
    wait_done(&loop, 2, 10000);
    pool_end(&loop, wp);
    ck_assert_int_eq(atomic_load(&started), 2);
    for (worker_job_t *j = back.head; j != NULL; j = j->next)
        ck_assert_int_eq(atomic_load(&((test_job_t *)j)->ran), 0);
}
END_TEST

/* Waits until every one of `threads` workers is asleep, so that the next
 * submit finds none awake. */
static void wait_asleep(worker_pool_t *wp, unsigned threads)
{
    for (int ms = 0; worker_pool_asleep(wp) < threads; ms++) {
        ck_assert_msg(ms < 10000, "%u of %u workers asleep", worker_pool_asleep(wp), threads);
        sleep_ms(1);
    }
}

/* Once both workers sleep, submits jobs[0 .. n-1], zeroed and numbered
 * (and slow if asked), in one batch, so that the submit finds none awake.
 * Returns uv_hrtime() just before the submit. */
static uint64_t submit_to_sleepers(worker_pool_t *wp, test_job_t *jobs, int n, bool slow)
{
    worker_batch_t b = WORKER_BATCH_INIT;
    uint64_t t0;

    memset(jobs, 0, (size_t)n * sizeof(*jobs));
    wait_asleep(wp, 2);
    for (int k = 0; k < n; k++) {
        jobs[k].index = k;
        jobs[k].slow = slow;
        worker_batch_push(&b, &jobs[k].job);
    }
    t0 = uv_hrtime();
    worker_pool_submit(wp, &b);
    return t0;
}

#define NCHEAP 20

START_TEST(test_cheap_jobs_one_worker)
{
    uv_loop_t loop;
    worker_pool_t *wp = pool_new_wake(&loop, 2, 10000000000ull);
    test_job_t jobs[NCHEAP];

    /* With a 10 s threshold no batch of quick jobs is worth a second
     * worker: the one the submit wakes runs them all, while the loop (and
     * the pool's timer) runs. */
    submit_to_sleepers(wp, jobs, NCHEAP, false);
    wait_done(&loop, NCHEAP, 10000);
    for (int k = 1; k < NCHEAP; k++)
        ck_assert_msg(pthread_equal(jobs[k].thread, jobs[0].thread), "job %d ran on another worker",
                      k);
    pool_end(&loop, wp);
}
END_TEST

#define NWORTH 200

START_TEST(test_costly_jobs_wake_another)
{
    uv_loop_t loop;
    worker_pool_t *wp = pool_new_wake(&loop, 2, 2000000u);
    test_job_t jobs[NWORTH];
    int on_first = 0;

    /* Jobs of 50 us or more, 200 of them, are worth far more than 2 ms:
     * once the first worker has measured a few, it wakes the second. */
    submit_to_sleepers(wp, jobs, NWORTH, true);
    wait_done(&loop, NWORTH, 30000);
    for (int k = 0; k < NWORTH; k++)
        on_first += pthread_equal(jobs[k].thread, jobs[0].thread) != 0;
    ck_assert_msg(on_first < NWORTH, "all %d jobs ran on one worker", NWORTH);
    pool_end(&loop, wp);
}
END_TEST

START_TEST(test_long_job_nudges_sleeper)
{
    uv_loop_t loop;
    worker_pool_t *wp = pool_new_wake(&loop, 2, 2000000u);
    test_job_t jobs[3];
    uint64_t t0;

    /* The worker the submit wakes takes jobs 0 and 1 and is held in job 0;
     * job 2 is not worth a wake-up while job 0 is young.  Once job 0 has
     * run 2 ms the timer wakes the other worker, which runs job 2 and
     * takes job 1 from the held one. */
    atomic_store(&gated_index, 0);
    t0 = submit_to_sleepers(wp, jobs, 3, false);
    wait_done(&loop, 2, 10000);
    ck_assert_uint_ge(uv_hrtime() - t0, 2000000u);
    release_held(&loop, jobs);
    pool_end(&loop, wp);
}
END_TEST

#define NFILL 50000

START_TEST(test_stuck_batch_before_queue)
{
    uv_loop_t loop;
    worker_pool_t *wp = pool_new_wake(&loop, 2, 2000000u);
    test_job_t *jobs = calloc(8 + NFILL, sizeof(*jobs));
    worker_batch_t b = WORKER_BATCH_INIT;
    int nfill = 0;
    uint64_t end;

    /* The worker the submit wakes takes jobs 0-3 of 8 and is held in job
     * 0; the loop then keeps the queue full of short jobs.  Jobs 1-3 were
     * queued before all of those, so once job 0 has run past wake_ns the
     * other worker must take them from the held one's batch, busy queue or
     * not. */
    ck_assert_ptr_nonnull(jobs);
    atomic_store(&gated_index, 0);
    submit_to_sleepers(wp, jobs, 8, false);
    end = uv_hrtime() + 2000000000ull;
    while (atomic_load(&jobs[1].ran) + atomic_load(&jobs[2].ran) + atomic_load(&jobs[3].ran) < 3) {
        ck_assert_msg(uv_hrtime() < end && nfill + 32 <= NFILL,
                      "jobs behind the held one never ran while the queue was busy (%d run)",
                      atomic_load(&jobs[1].ran) + atomic_load(&jobs[2].ran) +
                          atomic_load(&jobs[3].ran));
        if (worker_pool_pending(wp) < 64) {
            for (int k = 0; k < 32; k++, nfill++) {
                jobs[8 + nfill].index = 8 + nfill;
                jobs[8 + nfill].slow = true;
                worker_batch_push(&b, &jobs[8 + nfill].job);
            }
            worker_pool_submit(wp, &b);
        }
        uv_run(&loop, UV_RUN_NOWAIT);
        sleep_ms(1);
    }
    ck_assert_int_eq(atomic_load(&jobs[0].ran), 0);
    atomic_store(&gate_open, 1);
    wait_done(&loop, 8 + nfill, 30000);
    pool_end(&loop, wp);
    free(jobs);
}
END_TEST

#define NSTRESS 6000

/* Submits NSTRESS jobs in batches of 1 to `most` at random (a quarter of
 * them slow), takes back what is unstarted after every fifth batch into
 * `back`, and runs the loop until nothing is pending.  Returns the jobs
 * given back. */
static int stress(uv_loop_t *loop, worker_pool_t *wp, test_job_t *jobs, int most, unsigned seed,
                  worker_batch_t *back)
{
    worker_batch_t b = WORKER_BATCH_INIT;
    int n = 0, given_back = 0, round = 0;

    while (n < NSTRESS) {
        int k = 1 + (int)(rand_r(&seed) % (unsigned)most);
        for (; k > 0 && n < NSTRESS; k--, n++) {
            jobs[n].index = n;
            jobs[n].slow = rand_r(&seed) % 4 == 0;
            worker_batch_push(&b, &jobs[n].job);
        }
        worker_pool_submit(wp, &b);
        if (++round % 5 == 0) {
            size_t before = back->n;
            worker_pool_take_back(wp, back);
            given_back += (int)(back->n - before);
        }
        uv_run(loop, UV_RUN_NOWAIT);
    }
    while (worker_pool_pending(wp) > 0)
        uv_run(loop, UV_RUN_ONCE);
    return given_back;
}

START_TEST(test_exactly_once)
{
    uv_loop_t loop;
    worker_pool_t *wp = pool_new(&loop, 3);
    test_job_t *jobs = calloc(NSTRESS, sizeof(*jobs));
    worker_batch_t back = WORKER_BATCH_INIT;

    /* Batches of random size, a take-back now and then while the workers
     * are busy: each job is either completed once after running once, or
     * given back and never run. */
    int given_back = stress(&loop, wp, jobs, 40, 7, &back);
    ck_assert_int_eq(done_count + given_back, NSTRESS);
    ck_assert_uint_eq(back.n, (size_t)given_back);
    pool_end(&loop, wp);
    for (worker_job_t *j = back.head; j != NULL; j = j->next)
        ((test_job_t *)j)->index = -1;
    for (int i = 0; i < NSTRESS; i++) {
        if (jobs[i].index == -1) {
            ck_assert_int_eq(atomic_load(&jobs[i].ran), 0);
            ck_assert_int_eq(jobs[i].done_order, 0);
        } else {
            ck_assert_int_eq(atomic_load(&jobs[i].ran), 1);
            ck_assert_int_gt(jobs[i].done_order, 0);
        }
    }
    free(jobs);
}
END_TEST

/* Batches: a job of kind index % 3; kind 0 runs alone, kinds 1 and 2
 * batch with their own kind. */
#define BATCH_MAX 5
static _Atomic int batches, batched_jobs;

static bool group_cb(const worker_job_t *first, const worker_job_t *cand, void *arg)
{
    const test_job_t *f = (const test_job_t *)first, *c = (const test_job_t *)cand;

    (void)arg;
    if (f->index % 3 == 0)
        return false;
    return c == NULL || c->index % 3 == f->index % 3;
}

static worker_pool_config_t test_config(unsigned threads, worker_run_cb run,
                                        worker_run_batch_cb run_batch, uint64_t batch_ns)
{
    worker_pool_config_t cfg = {.threads = threads,
                                .scratch_bytes = 64,
                                .tokens_cap = 16,
                                .logits_cap = 16,
                                .run = run,
                                .done = done_cb,
                                .record_bytes = sizeof(test_job_t),
                                .group = run_batch != NULL ? group_cb : NULL,
                                .run_batch = run_batch,
                                .max_batch = run_batch != NULL ? BATCH_MAX : 0,
                                .batch_ns = batch_ns};
    return cfg;
}

static void run_batch_cb(worker_t *w, worker_job_t **jobs, size_t n, void *arg)
{
    const int kind = ((test_job_t *)jobs[0])->index % 3;

    ck_assert_uint_ge(n, 2);
    ck_assert_uint_le(n, BATCH_MAX);
    ck_assert_int_ne(kind, 0);
    for (size_t i = 0; i < n; i++) {
        ck_assert_int_eq(((test_job_t *)jobs[i])->index % 3, kind);
        run_cb(w, jobs[i], arg);
    }
    atomic_fetch_add(&batches, 1);
    atomic_fetch_add(&batched_jobs, (int)n);
}

START_TEST(test_batches_exactly_once)
{
    /* As test_exactly_once, with batches: every batch holds one kind and
     * at most BATCH_MAX jobs, kind 0 never batches, and every job is run
     * once and completed once, or given back and never run. */
    uv_loop_t loop;
    worker_pool_config_t cfg = test_config(3, run_cb, run_batch_cb, 0);
    worker_pool_t *wp;
    test_job_t *jobs = calloc(NSTRESS, sizeof(*jobs));
    worker_batch_t back = WORKER_BATCH_INIT;
    int given_back;

    atomic_store(&batches, 0);
    atomic_store(&batched_jobs, 0);
    wp = pool_start(&loop, &cfg);
    given_back = stress(&loop, wp, jobs, 60, 9, &back);
    ck_assert_int_eq(done_count + given_back, NSTRESS);
    ck_assert_msg(atomic_load(&batches) > 0, "no batch formed");
    pool_end(&loop, wp);
    for (worker_job_t *j = back.head; j != NULL; j = j->next)
        ((test_job_t *)j)->index = -1;
    for (int i = 0; i < NSTRESS; i++) {
        ck_assert_int_eq(atomic_load(&jobs[i].ran), jobs[i].index == -1 ? 0 : 1);
        ck_assert_int_eq(jobs[i].done_order > 0, jobs[i].index != -1);
    }
    free(jobs);
}
END_TEST

/* Holds the only worker of `wp` in job x (gated) so that what is
 * submitted next queues, all of it, before anything runs. */
static void hold_worker(worker_pool_t *wp, test_job_t *x)
{
    worker_batch_t b = WORKER_BATCH_INIT;

    atomic_store(&gated_index, x->index);
    worker_batch_push(&b, &x->job);
    worker_pool_submit(wp, &b);
    while (atomic_load(&started) == 0)
        sleep_ms(1);
}

/* Fairness between flows (worker.c, "Fairness"): flow A queues 300 jobs,
 * then flow B 3 of the same cost; B's run among the first, interleaved
 * with A's, and each flow's run in the order submitted. */
START_TEST(test_flows_fair)
{
    uv_loop_t loop;
    worker_pool_t *wp = pool_new(&loop, 1);
    test_job_t *jobs = calloc(304, sizeof(*jobs));
    worker_flow_t fa, fb;
    worker_batch_t b = WORKER_BATCH_INIT;

    worker_flow_init(&fa);
    worker_flow_init(&fb);
    jobs[0].index = 0;
    hold_worker(wp, &jobs[0]);
    for (int i = 1; i < 304; i++) {
        jobs[i].index = i;
        jobs[i].job.flow = i <= 300 ? &fa : &fb;
        worker_job_set_cost(&jobs[i].job, 1000);
        worker_batch_push(&b, &jobs[i].job);
    }
    worker_pool_submit(wp, &b);
    atomic_store(&gate_open, 1);
    while (done_count < 304)
        uv_run(&loop, UV_RUN_ONCE);
    /* X, then at most one local batch of A's (a worker takes a run of
     * one flow's jobs at once, WORKER_TAKE_MAX 16), then B's three, long
     * before the rest of A's. */
    for (int k = 0; k < 3; k++)
        ck_assert_int_le(jobs[301 + k].done_order, 1 + 16 + 3);
    for (int i = 2; i < 304; i++)
        if (i != 301)
            ck_assert_int_gt(jobs[i].done_order, jobs[i - 1].done_order);
    ck_assert_uint_eq(worker_flow_served(&fa), 300 * 1000);
    ck_assert_uint_eq(worker_flow_served(&fb), 3 * 1000);
    pool_end(&loop, wp);
    free(jobs);
}
END_TEST

/* A cost is kept to about 0.1 %, never as 0 when it was not. */
START_TEST(test_cost_kept)
{
    worker_job_t j;
    uint64_t v[] = {0, 1, 2047, 2048, 2049, 4095, 100000, 123456789, UINT64_C(1) << 40};

    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        uint64_t got;
        worker_job_set_cost(&j, v[i]);
        got = worker_job_cost(&j);
        ck_assert_uint_eq(got == 0, v[i] == 0);
        ck_assert_msg((double)got >= (double)v[i] * 0.999 && (double)got <= (double)v[i] * 1.001,
                      "%llu kept as %llu", (unsigned long long)v[i], (unsigned long long)got);
    }
    /* Around every power of two the exponent reaches: never less than
     * the cost, never as much as 0.1 % more. */
    for (unsigned k = 0; k < 42; k++)
        for (int d = -1; d <= 1; d++) {
            uint64_t c = (UINT64_C(1) << k) + (uint64_t)(int64_t)d, got;
            if (c == 0)
                continue;
            worker_job_set_cost(&j, c);
            got = worker_job_cost(&j);
            ck_assert_msg(got >= c && (double)got <= (double)c * 1.001, "%llu kept as %llu",
                          (unsigned long long)c, (unsigned long long)got);
            /* The same, encoded once and set as a code. */
            worker_job_set_cost_code(&j, worker_cost_code(c));
            ck_assert_uint_eq(worker_job_cost(&j), got);
        }
    worker_job_set_cost(&j, UINT64_MAX); /* saturates */
    ck_assert_uint_gt(worker_job_cost(&j), UINT64_C(1) << 40);
}
END_TEST

/* take_back with several flows: every job, each flow's in the order
 * submitted. */
START_TEST(test_take_back_flows)
{
    uv_loop_t loop;
    worker_pool_t *wp = pool_new(&loop, 1);
    test_job_t jobs[21];
    worker_flow_t f[3];
    worker_batch_t b = WORKER_BATCH_INIT, back = WORKER_BATCH_INIT;
    int last[3] = {0, 0, 0};

    memset(jobs, 0, sizeof(jobs));
    for (int k = 0; k < 3; k++)
        worker_flow_init(&f[k]);
    hold_worker(wp, &jobs[0]);
    for (int i = 1; i < 21; i++) {
        jobs[i].index = i;
        jobs[i].job.flow = &f[(i * 7) % 3];
        worker_job_set_cost(&jobs[i].job, (uint64_t)i * 10);
        worker_batch_push(&b, &jobs[i].job);
    }
    worker_pool_submit(wp, &b);
    worker_pool_take_back(wp, &back);
    ck_assert_uint_eq(back.n, 20);
    for (worker_job_t *j = back.head; j != NULL; j = j->next) {
        test_job_t *t = (test_job_t *)j;
        int k = (t->index * 7) % 3;
        ck_assert_int_gt(t->index, last[k]);
        last[k] = t->index;
    }
    atomic_store(&gate_open, 1);
    pool_end(&loop, wp);
    for (int i = 1; i < 21; i++)
        ck_assert_int_eq(atomic_load(&jobs[i].ran), 0);
}
END_TEST

static _Atomic int max_batch_seen;

static void run_batch_max_cb(worker_t *w, worker_job_t **jobs, size_t n, void *arg)
{
    int seen = atomic_load(&max_batch_seen);

    while ((int)n > seen && !atomic_compare_exchange_weak(&max_batch_seen, &seen, (int)n))
        ;
    for (size_t i = 0; i < n; i++)
        run_cb(w, jobs[i], arg);
}

/* A pool of `threads` workers with batches (kinds 1 and 2, BATCH_MAX
 * at most, within batch_ns) that note their largest in max_batch_seen. */
static worker_pool_t *pool_new_batch(uv_loop_t *loop, unsigned threads, uint64_t batch_ns)
{
    worker_pool_config_t cfg = test_config(threads, run_cb, run_batch_max_cb, batch_ns);

    atomic_store(&max_batch_seen, 0);
    return pool_start(loop, &cfg);
}

/* Batches within batch_ns, filled fairly: jobs of cost 1000 with a bound
 * of 3000 make batches of 3 at most; the one job of flow B, queued after
 * 60 of flow A, runs in the second batch (the first was taken at once). */
START_TEST(test_batch_bound_fair)
{
    uv_loop_t loop;
    worker_pool_t *wp = pool_new_batch(&loop, 1, 3000);
    test_job_t *jobs = calloc(62, sizeof(*jobs));
    worker_flow_t fa, fb;
    worker_batch_t b = WORKER_BATCH_INIT;

    worker_flow_init(&fa);
    worker_flow_init(&fb);
    jobs[0].index = 0; /* kind 0: runs alone */
    hold_worker(wp, &jobs[0]);
    for (int i = 1; i < 62; i++) {
        jobs[i].index = 3 * i + 1; /* kind 1: batches */
        jobs[i].job.flow = i < 61 ? &fa : &fb;
        worker_job_set_cost(&jobs[i].job, 1000);
        worker_batch_push(&b, &jobs[i].job);
    }
    worker_pool_submit(wp, &b);
    atomic_store(&gate_open, 1);
    while (done_count < 62)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert_int_eq(atomic_load(&max_batch_seen), 3);
    ck_assert_int_le(jobs[61].done_order, 1 + 3 + 3);
    for (int i = 2; i < 61; i++)
        ck_assert_int_gt(jobs[i].done_order, jobs[i - 1].done_order);
    pool_end(&loop, wp);
    free(jobs);
}
END_TEST

/* Two jobs that batch stay one batch beside a job that does not
 * (worker.c, take_jobs() and took()): C (alone, dear, held) and D1, D2
 * (one kind, each on its own flow) are queued to two sleeping workers.
 * The worker that takes C must not take D1 behind it (C and D1 overrun
 * the bound, 2.1 ms), and the other takes D1 and gathers D2 while both
 * are still queued: D1 and D2 run as one batch of 2, while C is held. */
START_TEST(test_batch_not_split_beside_alone)
{
    uv_loop_t loop;
    worker_pool_t *wp = pool_new_batch(&loop, 2, 2100000);
    test_job_t jobs[3];
    worker_flow_t f[3];
    worker_batch_t b = WORKER_BATCH_INIT;

    memset(jobs, 0, sizeof(jobs));
    wait_asleep(wp, 2);
    for (int k = 0; k < 3; k++) {
        worker_flow_init(&f[k]);
        jobs[k].index = k == 0 ? 0 : 3 * k + 1; /* C kind 0 (alone), D1 and D2 kind 1 */
        jobs[k].job.flow = &f[k];
        worker_job_set_cost(&jobs[k].job, k == 0 ? 1200000 : 1000000);
        worker_batch_push(&b, &jobs[k].job);
    }
    atomic_store(&gated_index, 0);
    worker_pool_submit(wp, &b);
    for (int ms = 0; done_count < 2 && ms < 5000; ms++) {
        uv_run(&loop, UV_RUN_NOWAIT);
        sleep_ms(1);
    }
    ck_assert_msg(done_count == 2, "D1 and D2 not both done while C is held (%d done)", done_count);
    ck_assert_int_eq(atomic_load(&jobs[0].ran), 0);
    ck_assert_msg(atomic_load(&max_batch_seen) == 2, "D1 and D2 ran apart, not as one batch");
    atomic_store(&gate_open, 1);
    while (done_count < 3)
        uv_run(&loop, UV_RUN_ONCE);
    pool_end(&loop, wp);
}
END_TEST

/* A run that goes on along t->chain_next (worker.h, "Chains"). */
static void chain_run_cb(worker_t *w, worker_job_t *job, void *arg)
{
    test_job_t *t = (test_job_t *)job;

    for (;;) {
        run_cb(w, &t->job, arg);
        if (t->chain_next == NULL)
            return;
        worker_job_handoff(w, &t->job, &t->chain_next->job);
        if (t->requeue_after) {
            worker_job_requeue(w, &t->chain_next->job);
            return;
        }
        t = t->chain_next;
    }
}

/* A chain of ten jobs, submitted as one, requeued after its fifth: each
 * job is run and completed once, in chain order; a job of another flow
 * queued after the chain runs when the chain goes back to its flow; the
 * pool counts the chain as one job out. */
START_TEST(test_chain_handoff_requeue)
{
    uv_loop_t loop;
    worker_pool_config_t cfg = test_config(1, chain_run_cb, NULL, 0);
    worker_pool_t *wp;
    test_job_t jobs[12];
    worker_flow_t fa, fb;
    worker_batch_t b = WORKER_BATCH_INIT;

    memset(jobs, 0, sizeof(jobs));
    wp = pool_start(&loop, &cfg);
    worker_flow_init(&fa);
    worker_flow_init(&fb);
    hold_worker(wp, &jobs[0]);
    for (int i = 1; i <= 10; i++) {
        jobs[i].index = i;
        jobs[i].chain_next = i < 10 ? &jobs[i + 1] : NULL;
        jobs[i].job.flow = &fa;
    }
    jobs[5].requeue_after = true;
    worker_job_set_cost(&jobs[1].job, 1000);
    jobs[11].index = 11;
    jobs[11].job.flow = &fb;
    worker_job_set_cost(&jobs[11].job, 1000);
    worker_batch_push(&b, &jobs[1].job);
    worker_batch_push(&b, &jobs[11].job);
    worker_pool_submit(wp, &b);
    ck_assert_uint_eq(worker_pool_pending(wp), 3);
    atomic_store(&gate_open, 1);
    while (done_count < 12)
        uv_run(&loop, UV_RUN_ONCE);
    for (int i = 1; i <= 5; i++)
        ck_assert_int_eq(jobs[i].done_order, i + 1);
    ck_assert_int_eq(jobs[11].done_order, 7);
    for (int i = 6; i <= 10; i++)
        ck_assert_int_eq(jobs[i].done_order, i + 2);
    for (int i = 0; i < 12; i++)
        ck_assert_int_eq(atomic_load(&jobs[i].ran), 1);
    ck_assert_uint_eq(worker_pool_pending(wp), 0);
    pool_end(&loop, wp);
}
END_TEST

static _Atomic int batch_sizes[8], nbatches;

/* A run_batch that goes on along each job's chain_next in rounds, as
 * server/job.c runs a batch of chains: rounds while every job has a next
 * and none is marked requeue_after; then each job with a next hands it
 * over and requeues it. */
static void chain_batch_cb(worker_t *w, worker_job_t **jobs, size_t n, void *arg)
{
    bool on;

    atomic_store(&batch_sizes[atomic_fetch_add(&nbatches, 1) % 8], (int)n);
    for (;;) {
        on = true;
        for (size_t i = 0; i < n; i++) {
            test_job_t *t = (test_job_t *)jobs[i];
            run_cb(w, &t->job, arg);
            on = on && t->chain_next != NULL && !t->requeue_after;
        }
        if (!on)
            break;
        for (size_t i = 0; i < n; i++) /* jobs[i] becomes its next */
            worker_job_handoff(w, jobs[i], &((test_job_t *)jobs[i])->chain_next->job);
    }
    for (size_t i = 0; i < n; i++) {
        test_job_t *t = (test_job_t *)jobs[i];
        if (t->chain_next == NULL)
            continue;
        worker_job_handoff(w, &t->job, &t->chain_next->job);
        worker_job_requeue(w, &t->chain_next->job);
    }
}

/* A batch of three chains (worker.h, "Chains"), A: a1..a4, B: b1..b4,
 * C: c1, c2, on three flows, one worker: the first batch runs two rounds,
 * handing every job back as it finishes; C ends there and A and B go back
 * to their flows after their second job, together, and come back as one
 * batch of two.  Every job runs and completes once, each chain in order,
 * and the pool counts each chain as one job out. */
START_TEST(test_batch_chains_requeued_together)
{
    uv_loop_t loop;
    worker_pool_config_t cfg = test_config(1, run_cb, chain_batch_cb, 0);
    worker_pool_t *wp;
    test_job_t j[10];
    worker_flow_t f[3];
    worker_batch_t b = WORKER_BATCH_INIT;
    const int chain[3][4] = {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, -1, -1}};

    memset(j, 0, sizeof(j));
    atomic_store(&nbatches, 0);
    wp = pool_start(&loop, &cfg);
    for (int k = 0; k < 3; k++) {
        worker_flow_init(&f[k]);
        for (int i = 0; i < 4 && chain[k][i] >= 0; i++) {
            test_job_t *t = &j[chain[k][i]];
            t->index = 1; /* one kind: they batch */
            t->job.flow = &f[k];
            t->chain_next = i < 3 && chain[k][i + 1] >= 0 ? &j[chain[k][i + 1]] : NULL;
        }
        worker_job_set_cost(&j[chain[k][0]].job, 1000);
        worker_batch_push(&b, &j[chain[k][0]].job);
    }
    j[1].requeue_after = j[5].requeue_after = true;
    worker_job_set_cost(&j[2].job, 1000);
    worker_job_set_cost(&j[6].job, 1000);
    worker_pool_submit(wp, &b);
    ck_assert_uint_eq(worker_pool_pending(wp), 3);
    while (done_count < 10)
        uv_run(&loop, UV_RUN_ONCE);
    for (int i = 0; i < 10; i++)
        ck_assert_int_eq(atomic_load(&j[i].ran), 1);
    for (int k = 0; k < 3; k++)
        for (int i = 1; i < 4 && chain[k][i] >= 0; i++)
            ck_assert_int_gt(j[chain[k][i]].done_order, j[chain[k][i - 1]].done_order);
    ck_assert_int_lt(j[9].done_order, j[2].done_order); /* C ended in the first batch */
    ck_assert_int_eq(atomic_load(&nbatches), 2);
    ck_assert_int_eq(atomic_load(&batch_sizes[0]), 3);
    ck_assert_int_eq(atomic_load(&batch_sizes[1]), 2);
    ck_assert_uint_eq(worker_pool_pending(wp), 0);
    pool_end(&loop, wp);
}
END_TEST

/* With cfg.sched_batch every job runs on a SCHED_BATCH thread, unless
 * the pool reports the policy refused; without it, under the policy the
 * pool was created from (SCHED_OTHER here). */
START_TEST(test_sched_batch)
{
    for (int on = 0; on <= 1; on++) {
        uv_loop_t loop;
        worker_pool_t *wp;
        test_job_t jobs[64];
        worker_batch_t b = WORKER_BATCH_INIT;
        int want;

        sched_batch = on;
        wp = pool_new(&loop, 2);
        sched_batch = false;
        want = on && worker_pool_sched_error(wp) == 0 ? SCHED_BATCH : SCHED_OTHER;
        ck_assert_int_eq(sched_getscheduler(0), SCHED_OTHER);
        memset(jobs, 0, sizeof(jobs));
        for (int i = 0; i < 64; i++) {
            jobs[i].index = i;
            jobs[i].policy = -1;
            jobs[i].slow = true;
            worker_batch_push(&b, &jobs[i].job);
        }
        worker_pool_submit(wp, &b);
        while (done_count < 64)
            uv_run(&loop, UV_RUN_ONCE);
        for (int i = 0; i < 64; i++)
            ck_assert_int_eq(jobs[i].policy, want);
        pool_end(&loop, wp);
    }
}
END_TEST

/* Hints are prefetched, never read: jobs whose hints name memory that
 * faults on any access (mapped with no access, then unmapped, and NULL)
 * run and complete as any other. */
START_TEST(test_hints_never_read)
{
    uv_loop_t loop;
    worker_pool_t *wp = pool_new(&loop, 2);
    test_job_t *jobs = calloc(NJOBS, sizeof(*jobs));
    worker_batch_t b = WORKER_BATCH_INIT;
    size_t len = (size_t)1 << 20;
    char *none = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *gone = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    ck_assert_ptr_ne(none, MAP_FAILED);
    ck_assert_ptr_ne(gone, MAP_FAILED);
    ck_assert_int_eq(munmap(gone, len), 0);
    for (int i = 0; i < NJOBS; i++) {
        jobs[i].index = i;
        jobs[i].job.hint[0] = none + (size_t)(i % 256) * 4096;
        jobs[i].job.hint_lines[0] = 64;
        jobs[i].job.hint[1] = gone + (size_t)(i % 256) * 4096;
        jobs[i].job.hint_lines[1] = 255;
        jobs[i].job.hint[2] = NULL;
        jobs[i].job.hint_lines[2] = 8;
        worker_batch_push(&b, &jobs[i].job);
        if (i % 37 == 36)
            worker_pool_submit(wp, &b);
    }
    worker_pool_submit(wp, &b);
    while (done_count < NJOBS)
        uv_run(&loop, UV_RUN_ONCE);
    for (int i = 0; i < NJOBS; i++) {
        ck_assert_int_eq(atomic_load(&jobs[i].ran), 1);
        ck_assert_int_gt(jobs[i].done_order, 0);
    }
    pool_end(&loop, wp);
    ck_assert_int_eq(munmap(none, len), 0);
    free(jobs);
}
END_TEST

/* Shared with long_run_cb(). */
static _Atomic int long_phase; /* 1: the long job has run past LONG_MS */
#define LONG_MS 400

/* Job 0 is long: it counts a position (worker_progress()) and yields
 * (worker_yield(), others' jobs up to 1 ms each) every millisecond, says
 * when it has run past LONG_MS (long_phase), and ends at gate_open.  Any
 * other job just runs. */
static void long_run_cb(worker_t *w, worker_job_t *job, void *arg)
{
    test_job_t *t = (test_job_t *)job;
    worker_slices_t sl;
    uint64_t t0 = uv_hrtime(), done = 0;

    (void)arg;
    t->thread = pthread_self();
    if (t->index != 0) {
        atomic_fetch_add(&t->ran, 1);
        return;
    }
    memset(&sl, 0, sizeof(sl));
    atomic_fetch_add(&started, 1);
    while (!atomic_load(&gate_open)) {
        sleep_ms(1);
        done += 1000000;
        worker_progress(w, 1);
        if (uv_hrtime() - t0 > LONG_MS * 1000000ull)
            atomic_store(&long_phase, 1);
        (void)worker_yield(w, job, &sl, done, 1000000, 5000000);
    }
    atomic_fetch_add(&t->ran, 1);
}

/* A job that has run for long but counts its progress is not wedged; the
 * same job is wedged once it has counted none for longer than the bound
 * (a reading a second later). */
START_TEST(test_progress_not_wedged)
{
    uv_loop_t loop;
    worker_pool_config_t cfg = test_config(1, long_run_cb, NULL, 0);
    worker_pool_t *wp = pool_start(&loop, &cfg);
    worker_batch_t b = WORKER_BATCH_INIT;
    test_job_t job;
    uint64_t now;

    memset(&job, 0, sizeof(job));
    atomic_store(&long_phase, 0);
    worker_batch_push(&b, &job.job);
    worker_pool_submit(wp, &b);
    while (!atomic_load(&long_phase))
        sleep_ms(1);
    now = uv_hrtime();
    ck_assert(!worker_pool_wedged(wp, now, LONG_MS / 2 * 1000000ull));
    ck_assert(worker_pool_wedged(wp, now + 1000000000ull, LONG_MS / 2 * 1000000ull));
    ck_assert_uint_gt(worker_pool_positions(wp), 0);
    atomic_store(&gate_open, 1);
    while (done_count < 1)
        uv_run(&loop, UV_RUN_ONCE);
    pool_end(&loop, wp);
}
END_TEST

/* On one worker, a long job of flow A yields to B's cheap job, queued
 * after it began: that one runs, on the same thread, and is done before
 * the long one ends; A's own next job and B's job dearer than the bound
 * wait for the long one to end. */
/* The tenants' cap counts service, not only what a flow holds at once: a
 * heavy flow that holds one job at a time (never over the light flow's
 * peak of 4) is still held back once it has taken TENANTCAP_AHEAD (4) jobs
 * more than the light one, until the light one takes more; and a flow
 * that comes back after being away starts level, with no credit.  With
 * only the hold-at-once rule the heavy flow is never held back here. */
START_TEST(test_tenantcap_counts_service)
{
    tenantcap_t tc = {0};
    worker_flow_t light, heavy;
    int cycles = 0;

    worker_flow_init(&light);
    worker_flow_init(&heavy);
    worker_flow_set_capped(&light);
    worker_flow_set_capped(&heavy);
    /* The light flow had 4 at once, and keeps one (busy without the
     * linger, whatever the clock does under a sanitizer). */
    tenantcap__do_taken_add(&tc, &light, 4);
    tenantcap__do_taken_add(&tc, &light, -3);
    /* The heavy flow comes in level with it, then takes and gives back
     * one job at a time. */
    tenantcap__do_taken_add(&tc, &heavy, 1);
    while (!tenantcap__do_held_back(&tc, &heavy) && cycles < 100) {
        tenantcap__do_taken_add(&tc, &heavy, 1);
        tenantcap__do_taken_add(&tc, &heavy, -1);
        cycles++;
    }
    ck_assert_msg(cycles < 100, "a heavy flow a job at a time was never held back");
    ck_assert_int_le(cycles, 4);
    /* The light flow's next jobs let it go again. */
    tenantcap__do_taken_add(&tc, &light, 4);
    ck_assert(!tenantcap__do_held_back(&tc, &heavy));
    /* Away and back: no credit for the time away. */
    tenantcap__do_taken_add(&tc, &light, -5);
    tenantcap__do_busy_remove(&tc, &light);
    for (int i = 0; i < 50; i++) {
        tenantcap__do_taken_add(&tc, &heavy, 1);
        tenantcap__do_taken_add(&tc, &heavy, -1);
    }
    tenantcap__do_taken_add(&tc, &light, 1);
    ck_assert_uint_ge(light._served, heavy._served - 1000000u);
    tenantcap__do_taken_add(&tc, &light, -1);
    tenantcap__do_taken_add(&tc, &heavy, -1);
    tenantcap__do_busy_remove(&tc, &light);
    tenantcap__do_busy_remove(&tc, &heavy);
}
END_TEST

START_TEST(test_yield_to_other_flows)
{
    uv_loop_t loop;
    worker_pool_config_t cfg = test_config(1, long_run_cb, NULL, 0);
    worker_pool_t *wp = pool_start(&loop, &cfg);
    worker_batch_t b = WORKER_BATCH_INIT;
    worker_flow_t fa, fb;
    test_job_t jobs[4];
    const uint64_t cost[4] = {10000000, 1000, 1000, 10000000};

    worker_flow_init(&fa);
    worker_flow_init(&fb);
    memset(jobs, 0, sizeof(jobs));
    for (int i = 0; i < 4; i++) {
        jobs[i].index = i;
        jobs[i].job.flow = i == 0 || i == 2 ? &fa : &fb;
        worker_job_set_cost(&jobs[i].job, cost[i]);
    }
    worker_batch_push(&b, &jobs[0].job);
    worker_pool_submit(wp, &b);
    while (atomic_load(&started) == 0)
        sleep_ms(1);
    for (int i = 1; i < 4; i++)
        worker_batch_push(&b, &jobs[i].job);
    worker_pool_submit(wp, &b);
    while (done_count < 1)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert_int_eq(jobs[1].done_order, 1);
    ck_assert(pthread_equal(jobs[1].thread, jobs[0].thread));
    ck_assert_int_eq(atomic_load(&jobs[0].ran), 0);
    ck_assert_int_eq(atomic_load(&jobs[2].ran), 0);
    ck_assert_int_eq(atomic_load(&jobs[3].ran), 0);
    atomic_store(&gate_open, 1);
    while (done_count < 4)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert_int_eq(jobs[0].done_order, 2);
    pool_end(&loop, wp);
}
END_TEST

/* A cheap job taken with the long one into the worker's local batch (both
 * submitted together, one worker) runs between the long one's slices,
 * not after it. */
START_TEST(test_yield_runs_taken_jobs)
{
    uv_loop_t loop;
    worker_pool_config_t cfg = test_config(1, long_run_cb, NULL, 0);
    worker_pool_t *wp = pool_start(&loop, &cfg);
    worker_batch_t b = WORKER_BATCH_INIT;
    worker_flow_t fa, fb;
    test_job_t jobs[2];

    worker_flow_init(&fa);
    worker_flow_init(&fb);
    memset(jobs, 0, sizeof(jobs));
    for (int i = 0; i < 2; i++) {
        jobs[i].index = i;
        jobs[i].job.flow = i == 0 ? &fa : &fb;
        worker_job_set_cost(&jobs[i].job, 1000);
        worker_batch_push(&b, &jobs[i].job);
    }
    worker_pool_submit(wp, &b);
    while (done_count < 1)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert_int_eq(jobs[1].done_order, 1);
    ck_assert_int_eq(atomic_load(&jobs[0].ran), 0);
    atomic_store(&gate_open, 1);
    while (done_count < 2)
        uv_run(&loop, UV_RUN_ONCE);
    pool_end(&loop, wp);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("worker");
    TCase *tc = tcase_create("pool");
    tcase_add_test(tc, test_batch_and_completion);
    tcase_add_test(tc, test_take_back);
    tcase_add_test(tc, test_wedged);
    tcase_add_test(tc, test_close_runs_queued);
    tcase_add_test(tc, test_buffers_grow);
    tcase_add_test(tc, test_two_jobs_two_workers);
    tcase_add_test(tc, test_idle_worker_runs_taken_job);
    tcase_add_test(tc, test_take_back_taken);
    tcase_add_test(tc, test_exactly_once);
    tcase_add_test(tc, test_batches_exactly_once);
    tcase_add_test(tc, test_hints_never_read);
    tcase_add_test(tc, test_cheap_jobs_one_worker);
    tcase_add_test(tc, test_costly_jobs_wake_another);
    tcase_add_test(tc, test_long_job_nudges_sleeper);
    tcase_add_test(tc, test_stuck_batch_before_queue);
    tcase_add_test(tc, test_flows_fair);
    tcase_add_test(tc, test_cost_kept);
    tcase_add_test(tc, test_take_back_flows);
    tcase_add_test(tc, test_batch_bound_fair);
    tcase_add_test(tc, test_batch_not_split_beside_alone);
    tcase_add_test(tc, test_chain_handoff_requeue);
    tcase_add_test(tc, test_batch_chains_requeued_together);
    tcase_add_test(tc, test_sched_batch);
    tcase_add_test(tc, test_progress_not_wedged);
    tcase_add_test(tc, test_yield_to_other_flows);
    tcase_add_test(tc, test_tenantcap_counts_service);
    tcase_add_test(tc, test_yield_runs_taken_jobs);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    int failed;
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
