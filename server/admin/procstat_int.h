/*
 * procstat_int.h: the metrics every Prometheus exporter has about its own
 * process (process_*), and slotd_build_info.
 *
 * DESIGN.  No state of its own beyond what the kernel keeps; called on the
 * loop thread by metrics_render() for each scrape, never on the step path.
 */
#ifndef SLOTD_SERVER_PROCSTAT_INT_H
#define SLOTD_SERVER_PROCSTAT_INT_H

#include <stdbool.h>

#include "proto/proto.h"

/** Appends, in the Prometheus text format 0.0.4: with `process` true,
 * process_cpu_seconds_total, process_resident_memory_bytes,
 * process_virtual_memory_bytes, process_open_fds, process_max_fds,
 * process_start_time_seconds (each only when this system lets it be
 * read); and slotd_build_info{version,commit} 1.  SLOTD_OK or
 * SLOTD_ENOMEM. */
int procstat_render(proto_buf_t *out, bool process);

/** The commit the daemon was built from ("unknown" if not known).  Static. */
const char *procstat_commit(void);

#endif
