/*
 * worker.c: the worker threads, their job queue and the completion queue
 * (see worker.h).  It owns the threads, each worker's scratch and
 * token/logit buffers, and the uv_async_t that wakes the loop.
 *
 * DESIGN.  Two locks, never held together.
 *
 * `queue_lock` guards the job FIFO, the count of idle workers and the stop
 * flag.  The loop thread appends a whole batch under it and signals
 * `queue_cond` once if a worker is idle; a worker that takes a job and sees
 * more queued while others sleep signals once more, so wake-ups fan out
 * along the batch (libuv threadpool.c does the same).  Workers leave when
 * the stop flag is set and the queue is empty.
 *
 * `done_lock` guards the completion FIFO.  A worker appends its finished
 * job and calls uv_async_send() only if the FIFO was empty: the loop is
 * then certain to drain it, and every later append before that drain
 * rides on the same wake-up.  The async callback (loop thread) swaps the
 * whole FIFO out under the lock and calls `done` on each job unlocked.
 *
 * Each worker publishes the monotonic start time of its current job in an
 * atomic (0 when idle) for worker_pool_wedged().  Nothing else is shared:
 * a job belongs to the worker running it, and scratch and buffers to their
 * worker.  `outstanding` is touched by the loop thread only.
 */
#include "worker.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

struct worker {
    pthread_t thread;
    worker_pool_t *pool;
    void *scratch;    /* owned; pool->scratch_bytes */
    uint32_t *tokens; /* owned; tokens_len values */
    size_t tokens_len;
    double *logits; /* owned; logits_len values */
    size_t logits_len;
    _Atomic uint64_t job_start; /* uv_hrtime() when the current job started; 0 if idle */
};

struct worker_pool {
    uv_async_t async; /* loop thread; workers only uv_async_send() it */
    worker_run_cb run;
    worker_done_cb done;
    void *arg;
    size_t scratch_bytes, tokens_cap, logits_cap; /* immutable */
    size_t outstanding;                           /* loop thread: submitted, not yet done */

    pthread_mutex_t queue_lock; /* guards the fields down to `stopping` */
    pthread_cond_t queue_cond;  /* jobs arrived, or stopping */
    worker_job_t *queue_head;   /* queue_lock */
    worker_job_t *queue_tail;   /* queue_lock */
    unsigned idle;              /* queue_lock: workers waiting on queue_cond */
    bool stopping;              /* queue_lock */

    pthread_mutex_t done_lock; /* guards the completion FIFO */
    worker_job_t *done_head;   /* done_lock */
    worker_job_t *done_tail;   /* done_lock */

    unsigned nworkers;  /* cfg.threads */
    unsigned nthreads;  /* threads started and not yet joined */
    worker_t workers[]; /* nworkers of them */
};

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

/* Grows *buf to `n` elements of `size` bytes; the old contents are not kept. */
static void *buf_room(void **buf, size_t *len, size_t n, size_t size)
{
    void *p;

    if (n <= *len)
        return *buf;
    if (n > SIZE_MAX / size || (p = malloc(n * size)) == NULL)
        return NULL;
    free(*buf);
    *buf = p;
    *len = n;
    return p;
}

/* Gives back what an unusually large job made a buffer grow by. */
static void buf_trim(void **buf, size_t *len, size_t base, size_t size)
{
    void *p;

    if (*len <= base)
        return;
    p = realloc(*buf, (base > 0 ? base : 1) * size);
    if (p != NULL) {
        *buf = p;
        *len = base;
    }
}

uint64_t worker_job_start(const worker_t *w)
{
    return atomic_load_explicit(&w->job_start, memory_order_relaxed);
}

unsigned worker_index(const worker_t *w)
{
    return (unsigned)(w - w->pool->workers);
}

void *worker_scratch(worker_t *w)
{
    return w->scratch;
}

uint32_t *worker_tokens(worker_t *w, size_t n)
{
    return buf_room((void **)&w->tokens, &w->tokens_len, n, sizeof(uint32_t));
}

double *worker_logits(worker_t *w, size_t n)
{
    return buf_room((void **)&w->logits, &w->logits_len, n, sizeof(double));
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    worker_pool_t *wp = w->pool;
    worker_job_t *job;
    bool was_empty;

    for (;;) {
        pthread_mutex_lock(&wp->queue_lock);
        while (wp->queue_head == NULL && !wp->stopping) {
            wp->idle++;
            pthread_cond_wait(&wp->queue_cond, &wp->queue_lock);
            wp->idle--;
        }
        job = wp->queue_head;
        if (job == NULL) { /* stopping, and nothing left to run */
            pthread_mutex_unlock(&wp->queue_lock);
            break;
        }
        wp->queue_head = job->next;
        if (wp->queue_head == NULL)
            wp->queue_tail = NULL;
        else if (wp->idle > 0)
            pthread_cond_signal(&wp->queue_cond);
        pthread_mutex_unlock(&wp->queue_lock);

        atomic_store_explicit(&w->job_start, uv_hrtime(), memory_order_relaxed);
        wp->run(w, job, wp->arg);
        atomic_store_explicit(&w->job_start, 0, memory_order_relaxed);
        buf_trim((void **)&w->tokens, &w->tokens_len, wp->tokens_cap, sizeof(uint32_t));
        buf_trim((void **)&w->logits, &w->logits_len, wp->logits_cap, sizeof(double));

        job->next = NULL;
        pthread_mutex_lock(&wp->done_lock);
        was_empty = wp->done_head == NULL;
        if (was_empty)
            wp->done_head = job;
        else
            wp->done_tail->next = job;
        wp->done_tail = job;
        pthread_mutex_unlock(&wp->done_lock);
        if (was_empty)
            uv_async_send(&wp->async);
    }
    return NULL;
}

/* Hands every completed job to `done`, in completion order.  Loop thread. */
static void drain_completions(worker_pool_t *wp)
{
    worker_job_t *job, *next;

    pthread_mutex_lock(&wp->done_lock);
    job = wp->done_head;
    wp->done_head = wp->done_tail = NULL;
    pthread_mutex_unlock(&wp->done_lock);

    for (; job != NULL; job = next) {
        next = job->next;
        assert(wp->outstanding > 0);
        wp->outstanding--;
        wp->done(job, wp->arg);
    }
}

static void async_cb(uv_async_t *h)
{
    drain_completions(container_of(h, worker_pool_t, async));
}

/* Stops and joins the started threads, frees the workers' memory. */
static void stop_threads(worker_pool_t *wp)
{
    pthread_mutex_lock(&wp->queue_lock);
    wp->stopping = true;
    pthread_cond_broadcast(&wp->queue_cond);
    pthread_mutex_unlock(&wp->queue_lock);
    for (unsigned i = 0; i < wp->nthreads; i++)
        pthread_join(wp->workers[i].thread, NULL);
    wp->nthreads = 0;
}

static void free_buffers(worker_pool_t *wp)
{
    for (unsigned i = 0; i < wp->nworkers; i++) {
        free(wp->workers[i].scratch);
        free(wp->workers[i].tokens);
        free(wp->workers[i].logits);
    }
}

int worker_pool_create(uv_loop_t *loop, const worker_pool_config_t *cfg, worker_pool_t **out)
{
    worker_pool_t *wp;
    unsigned n = cfg->threads;
    int rc = UV_ENOMEM;

    assert(n >= 1);
    wp = calloc(1, sizeof(*wp) + n * sizeof(worker_t));
    if (wp == NULL)
        return UV_ENOMEM;
    wp->nworkers = n;
    wp->run = cfg->run;
    wp->done = cfg->done;
    wp->arg = cfg->arg;
    wp->scratch_bytes = cfg->scratch_bytes;
    /* At least one element, so that a buffer is never NULL. */
    wp->tokens_cap = cfg->tokens_cap > 0 ? cfg->tokens_cap : 1;
    wp->logits_cap = cfg->logits_cap > 0 ? cfg->logits_cap : 1;
    if (pthread_mutex_init(&wp->queue_lock, NULL) != 0)
        goto fail_queue_lock;
    if (pthread_cond_init(&wp->queue_cond, NULL) != 0)
        goto fail_queue_cond;
    if (pthread_mutex_init(&wp->done_lock, NULL) != 0)
        goto fail_done_lock;

    for (unsigned i = 0; i < n; i++) {
        worker_t *w = &wp->workers[i];
        w->pool = wp;
        w->scratch = malloc(cfg->scratch_bytes > 0 ? cfg->scratch_bytes : 1);
        if (w->scratch == NULL || worker_tokens(w, wp->tokens_cap) == NULL ||
            worker_logits(w, wp->logits_cap) == NULL)
            goto fail_workers;
    }
    for (; wp->nthreads < n; wp->nthreads++) {
        int err = pthread_create(&wp->workers[wp->nthreads].thread, NULL, worker_main,
                                 &wp->workers[wp->nthreads]);
        if (err != 0) {
            rc = -err;
            goto fail_threads;
        }
    }
    /* Last, so that no failure after it needs the loop to close it. */
    rc = uv_async_init(loop, &wp->async, async_cb);
    if (rc != 0)
        goto fail_threads;
    *out = wp;
    return 0;

fail_threads:
    stop_threads(wp);
fail_workers:
    free_buffers(wp);
    pthread_mutex_destroy(&wp->done_lock);
fail_done_lock:
    pthread_cond_destroy(&wp->queue_cond);
fail_queue_cond:
    pthread_mutex_destroy(&wp->queue_lock);
fail_queue_lock:
    free(wp);
    return rc;
}

void worker_pool_submit(worker_pool_t *wp, worker_batch_t *b)
{
    if (b->n == 0)
        return;
    wp->outstanding += b->n;
    pthread_mutex_lock(&wp->queue_lock);
    if (wp->queue_tail != NULL)
        wp->queue_tail->next = b->head;
    else
        wp->queue_head = b->head;
    wp->queue_tail = b->tail;
    if (wp->idle > 0)
        pthread_cond_signal(&wp->queue_cond);
    pthread_mutex_unlock(&wp->queue_lock);
    b->head = b->tail = NULL;
    b->n = 0;
}

void worker_pool_take_back(worker_pool_t *wp, worker_batch_t *out)
{
    worker_job_t *job;

    pthread_mutex_lock(&wp->queue_lock);
    job = wp->queue_head;
    wp->queue_head = wp->queue_tail = NULL;
    pthread_mutex_unlock(&wp->queue_lock);

    while (job != NULL) {
        worker_job_t *next = job->next;
        assert(wp->outstanding > 0);
        wp->outstanding--;
        worker_batch_push(out, job);
        job = next;
    }
}

bool worker_pool_wedged(const worker_pool_t *wp, uint64_t now_ns, uint64_t bound_ns)
{
    for (unsigned i = 0; i < wp->nthreads; i++) {
        uint64_t t = atomic_load_explicit(&wp->workers[i].job_start, memory_order_relaxed);
        if (t != 0 && now_ns > t && now_ns - t > bound_ns)
            return true;
    }
    return false;
}

size_t worker_pool_pending(worker_pool_t *wp)
{
    return wp->outstanding;
}

static void close_cb(uv_handle_t *h)
{
    worker_pool_t *wp = container_of((uv_async_t *)h, worker_pool_t, async);

    free_buffers(wp);
    pthread_mutex_destroy(&wp->done_lock);
    pthread_cond_destroy(&wp->queue_cond);
    pthread_mutex_destroy(&wp->queue_lock);
    free(wp);
}

void worker_pool_close(worker_pool_t *wp)
{
    stop_threads(wp);
    drain_completions(wp);
    uv_close((uv_handle_t *)&wp->async, close_cb);
}
