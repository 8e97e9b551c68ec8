/*
 * launch_int.h: a job on its way to the workers (launch.c), for the other
 * files of server/.  Loop thread only.
 */
#ifndef SLOTD_SERVER_LAUNCH_INT_H
#define SLOTD_SERVER_LAUNCH_INT_H

#include "server_int.h"

/** Submits `r`'s job at the end of this loop turn, or parks it (in read
 * order) while its connection's output is over its bound.  The record is
 * the workers' from its submit until it comes back. */
void launch__req(req_t *r);
/** `r`, a step that headed a chain (launch.c), came back failed, canceled
 * or taken back: the steps chained after it did not run.  They go back to
 * the front of its session's FIFO, in order, or are freed if the
 * connection has closed. */
void launch__chain_return(req_t *r);
/** conn_hooks_t.run_parked: submits the parked jobs of `c`, oldest
 * first, while the bound allows. */
void launch__run_parked(conn_t *c);

#endif
