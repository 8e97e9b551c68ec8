/*
 * buf.c: proto_buf_t, the growable byte buffer that replies are written
 * into and that the server drains to the socket.
 *
 * The buffer grows geometrically (doubling from a small first size), so
 * appending n bytes one reply at a time costs O(n) copies in all.
 * proto_buf_consume() drops a written-out prefix by moving the rest down;
 * the capacity is kept for the next replies.
 */
#include "proto/proto_int.h"

#include <assert.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define PROTO_BUF_MIN_CAP 256

void *(*proto__realloc)(void *ptr, size_t size) = realloc;

void proto_buf_init(proto_buf_t *b)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

void proto_buf_free(proto_buf_t *b)
{
    free(b->data);
    proto_buf_init(b);
}

int proto_buf_reserve(proto_buf_t *b, size_t extra)
{
    size_t need, cap;
    char *data;

    if (extra <= b->cap - b->len)
        return SLOTD_OK;
    /* No object is larger than PTRDIFF_MAX bytes. */
    if (extra > (size_t)PTRDIFF_MAX - b->len)
        return SLOTD_ENOMEM;
    need = b->len + extra;
    cap = b->cap < PROTO_BUF_MIN_CAP ? PROTO_BUF_MIN_CAP : b->cap;
    while (cap < need)
        cap = cap > (size_t)PTRDIFF_MAX / 2 ? need : cap * 2;
    data = proto__realloc(b->data, cap);
    if (data == NULL)
        return SLOTD_ENOMEM;
    b->data = data;
    b->cap = cap;
    return SLOTD_OK;
}

int proto_buf_append(proto_buf_t *b, const void *data, size_t len)
{
    if (len == 0)
        return SLOTD_OK;
    /* Most appends fit in the room kept from earlier ones: no call then. */
    if (len > b->cap - b->len && proto_buf_reserve(b, len) != SLOTD_OK)
        return SLOTD_ENOMEM;
    memcpy(b->data + b->len, data, len);
    b->len += len;
    return SLOTD_OK;
}

void proto_buf_consume(proto_buf_t *b, size_t n)
{
    assert(n <= b->len);
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
}
