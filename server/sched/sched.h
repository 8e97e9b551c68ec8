/*
 * sched.h: the sched room's one header for the other rooms
 * (server/sched/): the worker pool, its queue and its jobs' buffers
 * (worker.h; the queue's fair-share policy, sched_int.h, and the tenants'
 * caps, tenantcap_int.h, stay inside), and the cache audit the workers
 * run (audit.h).  The room calls nothing of the daemon outside it: what a
 * job does comes in through the pool's callbacks (worker_pool_create()),
 * which the loop fills with job.c's functions.
 *
 * DESIGN.  No code of its own; the threads and locks are worker.h's and
 * audit.h's.
 */
#ifndef SLOTD_SERVER_SCHED_H
#define SLOTD_SERVER_SCHED_H

#include "audit.h"
#include "worker.h"

#endif
