/*
 * server.h: the daemon as a whole, for main().
 */
#ifndef SLOTD_SERVER_SERVER_H
#define SLOTD_SERVER_SERVER_H

#include "config.h"

/** Loads the models, opens the pool, starts the workers and both ports,
 * and serves until SIGTERM or SIGINT has drained everything.  `cfg` must
 * stay valid until it returns.  Returns the exit status: 0 after a clean
 * shutdown, 1 if start-up failed (logged).  A drain that overruns
 * cfg->shutdown_timeout ends the process with status 1 from within. */
int server_run(const server_config_t *cfg);

#endif
