/*
 * jobaudit_int.h: the audit of a step (jobaudit.c), for job.c, which runs
 * steps alone and in batches.  Worker threads; no lock.
 */
#ifndef SLOTD_SERVER_JOBAUDIT_INT_H
#define SLOTD_SERVER_JOBAUDIT_INT_H

#include "controls.h"
#include "server_int.h"

/** The audit of a step of `r` that just ran, on worker `w`: records its
 * `n` picks `tokens` after the session's tokens, and if the step is
 * sampled, checks them and their `logits` (under controls `ctl`) against
 * the uncached reference; on a mismatch they become the reference's and
 * the slot is rebuilt.  s->audit is not NULL.  Worker threads. */
void jobaudit__step(server_t *s, worker_t *w, req_t *r, uint32_t n, uint32_t *tokens,
                    double *logits, const controls_t *ctl);

#endif
