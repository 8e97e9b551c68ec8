/*
 * workbuf_int.h: a worker's growable buffer (the token and logit buffers of
 * worker.c): grown for an unusually large job, its old contents dropped,
 * and trimmed back to its usual size once the job is done, so that one
 * large request does not keep its memory for the worker's life.
 *
 * A plain value with no lock: its owner (one worker thread, or the loop
 * thread while the pool is created and freed) is its only user.  The
 * memory is the buffer's, released by workbuf_free().
 */
#ifndef SLOTD_SERVER_WORKBUF_INT_H
#define SLOTD_SERVER_WORKBUF_INT_H

#include <stddef.h>

typedef struct workbuf {
    void *p;    /* owned; NULL until first grown */
    size_t len; /* elements it holds room for */
} workbuf_t;

/** Room for `n` elements of `size` bytes: the buffer, grown if needed
 * (its contents are then lost; room for none still gives a buffer of
 * one); NULL only if it cannot grow, the buffer kept. */
void *workbuf_room(workbuf_t *b, size_t n, size_t size);

/** Shrinks a buffer that grew past `base` elements back to `base` (at
 * least one), keeping it as it is if the shrink fails. */
void workbuf_trim(workbuf_t *b, size_t base, size_t size);

/** Releases the memory; the buffer is then empty. */
void workbuf_free(workbuf_t *b);

#endif
