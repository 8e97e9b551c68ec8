/*
 * sched_int.h: the policy of the worker queue, alone: which flow of work is
 * served next.  Start-time fair queuing (Goyal et al., 1996) over flows of
 * jobs with costs: each flow's head has a virtual start, the flow with the
 * least is served, and serving a job of cost c moves its flow's next start
 * c further on.  The system's virtual time is the start of the job last
 * served; a flow that becomes active starts at the later of its own finish
 * and that time, so a flow that was idle banks no credit.
 *
 * A pure data structure: no lock, no thread, no allocation.  The flows are
 * the caller's, in a pairing heap threaded through them while active; the
 * caller keeps each flow's jobs and tells the scheduler only when a flow
 * becomes active and what the job it serves cost.  worker.c uses it under
 * its queue_lock; docs/design.md, "Scheduler", says why this policy.
 */
#ifndef SLOTD_SERVER_SCHED_INT_H
#define SLOTD_SERVER_SCHED_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** A flow: embedded in the caller's record, initialised by
 * sched_flow_init(); the fields are the scheduler's.  It must outlive its
 * time in the scheduler (from sched_activate() until it is served with
 * `more` false, or taken by sched_pop()). */
typedef struct sched_flow {
    uint64_t _start;  /* while active: the virtual start of its head */
    uint64_t _finish; /* the virtual finish of the last job served */
    uint64_t _order;  /* while active: ties between equal starts go to the older */
    uint64_t _served; /* the cost of every job served */
    uint32_t _weight; /* 1..: a job of cost c moves the flow c / weight on */
    uint32_t _carry;  /* cost short of one unit of virtual time, carried on */
    struct sched_flow *_child, *_sibling; /* the pairing heap (_sibling: or a FIFO's link) */
    bool _active;
} sched_flow_t;

/** The scheduler: a value owned by its user. */
typedef struct sched {
    sched_flow_t *_root;              /* active flows starting after the virtual time */
    sched_flow_t *_run, *_run_tail;   /* more of them, sorted as they came (sched.c) */
    sched_flow_t *_ties, *_ties_tail; /* active flows starting at it, in order */
    uint64_t _vtime;                  /* the start of the job last served */
    uint64_t _order;                  /* activations so far */
    size_t _active;                   /* flows in the heap */
} sched_t;

void sched_init(sched_t *s);
/** Initialises `f` with weight 1. */
void sched_flow_init(sched_flow_t *f);

/** Sets the weight of `f` (at least 1): from its next job served, a job of
 * cost c moves it c / weight on in virtual time, so that of flows that
 * stay active each is served cost in proportion to its weight.  A tenant's
 * flow (server/tenancy.c) has its tenant's weight. */
void sched_flow_set_weight(sched_flow_t *f, uint32_t weight);

/** Makes inactive flow `f` (one with jobs now) eligible: its head starts
 * at the later of its finish and the virtual time. */
void sched_activate(sched_t *s, sched_flow_t *f);

/** The active flow to serve next (least start, the older of equal ones),
 * or NULL if none is active. */
sched_flow_t *sched_peek(const sched_t *s);

/** Serves one job of cost `cost` from the flow sched_peek() names: the
 * virtual time moves to its start, its finish to start + cost / weight
 * (the remainder carried to its next job); with `more`
 * (the flow has further jobs) it stays active, its next job starting at
 * that finish, else it leaves the heap. */
void sched_serve(sched_t *s, uint64_t cost, bool more);

/** Takes the flow sched_peek() names out of the heap without serving it,
 * its start kept (sched_put_back() returns it); NULL if none is active. */
sched_flow_t *sched_pop(sched_t *s);

/** Returns a flow sched_pop() took, with its start and order as they were. */
void sched_put_back(sched_t *s, sched_flow_t *f);

/** Active flows. */
size_t sched_active(const sched_t *s);

/** The weight of `f` (sched_flow_set_weight()). */
uint32_t sched_flow_weight(const sched_flow_t *f);

/** The cost served from `f` so far. */
uint64_t sched_served(const sched_flow_t *f);

/** Whether `f` is in the heap. */
bool sched_flow_active(const sched_flow_t *f);

/** The virtual start of active flow `f`'s head. */
uint64_t sched_flow_start(const sched_flow_t *f);

/** The system's virtual time: the start of the job last served. */
uint64_t sched_vtime(const sched_t *s);

#endif
