/*
 * job_int.h: the worker side of a job (job.c), for server.c, which hands
 * these to the worker pool.  Worker threads, as worker.h says.  A job's
 * cost is jobcost_int.h's.
 */
#ifndef SLOTD_SERVER_JOB_INT_H
#define SLOTD_SERVER_JOB_INT_H

#include "server_int.h"

/** The worker side of a job: runs the model call of `job` (a req_t) and
 * formats its reply into the record.  `arg` is the server_t. */
void job_run(worker_t *w, worker_job_t *job, void *arg);

/** The pool's batch callbacks (worker.h): whether `cand` may join the
 * batch `first` leads (single steps of one batching model), and the run of
 * such a batch, each job answered and counted as job_run() would. */
bool job_group(const worker_job_t *first, const worker_job_t *cand, void *arg);
void job_run_batch(worker_t *w, worker_job_t **jobs, size_t n, void *arg);

#endif
