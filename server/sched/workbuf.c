/*
 * workbuf.c: a worker's growable buffer (see workbuf_int.h).  Whichever thread
 * owns the buffer; no lock.
 */
#include "workbuf_int.h"

#include <stdint.h>
#include <stdlib.h>

void *workbuf_room(workbuf_t *b, size_t n, size_t size)
{
    void *p;

    /* Never NULL for room of none: callers read NULL as out of memory, and
     * a buffer not grown yet (a nested job's) has no pointer. */
    if (n <= b->len && b->p != NULL)
        return b->p;
    if (n < 1)
        n = 1;
    if (n > SIZE_MAX / size || (p = malloc(n * size)) == NULL)
        return NULL;
    free(b->p);
    b->p = p;
    b->len = n;
    return p;
}

void workbuf_trim(workbuf_t *b, size_t base, size_t size)
{
    void *p;

    if (b->len <= base)
        return;
    p = realloc(b->p, (base > 0 ? base : 1) * size);
    if (p != NULL) {
        b->p = p;
        b->len = base;
    }
}

void workbuf_free(workbuf_t *b)
{
    free(b->p);
    b->p = NULL;
    b->len = 0;
}
