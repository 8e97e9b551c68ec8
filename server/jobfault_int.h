/*
 * jobfault_int.h: the test-only fault hooks of jobs (jobfault.c), for
 * job.c (its two points, no-ops in other builds) and server.c (the
 * release).  Worker threads, but the release: the loop.  Atomics, no lock.
 */
#ifndef SLOTD_SERVER_JOBFAULT_INT_H
#define SLOTD_SERVER_JOBFAULT_INT_H

#include "server_int.h"

#if SLOTD_FAULT_INJECTION
/** --fault-wedge-after: at a job's start, the N-th job holds its worker
 * until jobfault__release().  Worker threads. */
void jobfault__point(server_t *s, req_t *r);
/** --fault-corrupt-after: after the N-th step job, damages its slot's
 * newest entry.  Worker threads. */
void jobfault__after_step(server_t *s, req_t *r);
/** Lets a job wedged by --fault-wedge-after go on (and any later one
 * through at once).  Any thread. */
void jobfault__release(void);
#define JOB_FAULT_POINT(s, r) jobfault__point(s, r)
#define JOB_FAULT_AFTER_STEP(s, r) jobfault__after_step(s, r)
#else
#define JOB_FAULT_POINT(s, r) ((void)0)
#define JOB_FAULT_AFTER_STEP(s, r) ((void)0)
#endif

#endif
