/*
 * models_int.h: the presets the daemon may serve and the building of their
 * weights (models.c), for the other files of server/.  Loop thread only.
 */
#ifndef SLOTD_SERVER_MODELS_INT_H
#define SLOTD_SERVER_MODELS_INT_H

#include "server_int.h"

/** Start-up: the model of every --models preset, from its shape (the pool
 * and the workers are sized from these), and the weights of the --preload
 * ones.  SLOTD_OK, or the error, logged. */
int models__load(server_t *s);
/** The model called `name` among --models (built or not), or NULL. */
const model_t *models__find(const server_t *s, const char *name);
/** Whether `m` (one of server->models) is built.  If not, starts its build
 * on another thread unless one is under way; its end calls
 * conn_hooks_t.model_built on every connection. */
bool models__ready(server_t *s, const model_t *m);
/** Frees every model; no build may be under way. */
void models__free(server_t *s);

#endif
