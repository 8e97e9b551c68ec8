/*
 * framer.c: proto_framer_t, which cuts a connection's byte stream into
 * request lines under a length limit.
 *
 * A line that lies wholly inside the bytes of one feed is handed to the
 * callback straight from the caller's buffer; only the start of a line that
 * a feed leaves unfinished is copied, into the framer's carry buffer, and
 * completed from the following feeds.  The carry never holds more than
 * max_line + 1 bytes: the longest line allowed plus a "\r" that may turn out
 * to be the first half of its "\r\n".  A line is too long as soon as that
 * bound is passed, whether or not its "\n" has arrived.
 *
 * Running out of memory is reported before anything of the feed is used: the
 * carry is grown to what the whole feed will need first, so on SLOTD_ENOMEM
 * no line was delivered and the framer is as it was (unless a callback
 * raised the limit: proto_framer_raise_limit()).  When the callback
 * returns non-zero, the feed stops right after that line: the rest of the
 * feed is dropped unread and the framer stands at the start of a line.
 * After a line too long, the carry is freed and every feed is refused with
 * SLOTD_ELINE_TOO_LONG.
 */
#include "proto/proto_int.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#define PROTO_FRAMER_MIN_CAP 256

void proto_framer_init(proto_framer_t *f, size_t max_line)
{
    assert(max_line > 0 && max_line < SIZE_MAX / 2);
    f->buf = NULL;
    f->len = 0;
    f->cap = 0;
    f->max_line = max_line;
    f->failed = false;
}

void proto_framer_free(proto_framer_t *f)
{
    free(f->buf);
    f->buf = NULL;
    f->len = 0;
    f->cap = 0;
}

void proto_framer_raise_limit(proto_framer_t *f, size_t max_line)
{
    assert(max_line >= f->max_line && max_line < SIZE_MAX / 2);
    f->max_line = max_line;
}

/* Marks the stream as failed for good and lets the carry go. */
static int framer_fail(proto_framer_t *f)
{
    f->failed = true;
    free(f->buf);
    f->buf = NULL;
    f->len = 0;
    f->cap = 0;
    return SLOTD_ELINE_TOO_LONG;
}

/* Whether `n` bytes without their "\n" are known to be too long a start of
 * a line: more than max_line bytes, unless the last extra one is a "\r". */
static bool framer_partial_too_long(const proto_framer_t *f, const char *last, size_t n)
{
    return n > f->max_line + 1 || (n == f->max_line + 1 && *last != '\r');
}

static bool framer_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    }
    return true;
}

/* Hands out one complete line (without its "\n"). */
static int framer_deliver(proto_framer_t *f, const char *line, size_t n, proto_line_cb cb,
                          void *arg)
{
    if (n > 0 && line[n - 1] == '\r')
        n--;
    if (n > f->max_line)
        return framer_fail(f);
    if (framer_blank(line, n))
        return SLOTD_OK;
    return cb(arg, line, n);
}

static int framer_grow(proto_framer_t *f, size_t need)
{
    size_t cap;
    char *buf;

    if (need > f->max_line + 1)
        need = f->max_line + 1;
    if (need <= f->cap)
        return SLOTD_OK;
    cap = f->cap < PROTO_FRAMER_MIN_CAP ? PROTO_FRAMER_MIN_CAP : f->cap;
    while (cap < need)
        cap *= 2;
    if (cap > f->max_line + 1)
        cap = f->max_line + 1;
    buf = proto__realloc(f->buf, cap);
    if (buf == NULL)
        return SLOTD_ENOMEM;
    f->buf = buf;
    f->cap = cap;
    return SLOTD_OK;
}

int proto_framer_feed(proto_framer_t *f, const char *data, size_t len, proto_line_cb cb, void *arg)
{
    const char *p = data, *end = data + len, *nl, *last_nl;
    size_t need = 0;
    int rc;

    if (f->failed)
        return SLOTD_ELINE_TOO_LONG;
    if (len == 0)
        return SLOTD_OK;

    /* Size the carry for this feed before touching anything. */
    nl = memchr(p, '\n', len);
    if (f->len > 0)
        need = f->len + (size_t)((nl != NULL ? nl : end) - p);
    if (end[-1] != '\n') {
        size_t tail = len;
        if (nl != NULL) {
            last_nl = end - 1;
            while (*last_nl != '\n')
                last_nl--;
            tail = (size_t)(end - last_nl - 1);
        }
        if (tail > need)
            need = tail;
    }
    if (need > 0 && (rc = framer_grow(f, need)) != SLOTD_OK)
        return rc;

    /* Complete the carried line first. */
    if (f->len > 0) {
        size_t take = (size_t)((nl != NULL ? nl : end) - p);
        if (take > f->max_line + 1 - f->len)
            return framer_fail(f);
        memcpy(f->buf + f->len, p, take);
        f->len += take;
        if (nl == NULL) {
            if (framer_partial_too_long(f, f->buf + f->len - 1, f->len))
                return framer_fail(f);
            return SLOTD_OK;
        }
        p = nl + 1;
        take = f->len;
        f->len = 0;
        if ((rc = framer_deliver(f, f->buf, take, cb, arg)) != SLOTD_OK)
            return rc;
        nl = p < end ? memchr(p, '\n', (size_t)(end - p)) : NULL;
    }

    /* Lines wholly inside the caller's buffer go out from there. */
    while (nl != NULL) {
        if ((rc = framer_deliver(f, p, (size_t)(nl - p), cb, arg)) != SLOTD_OK)
            return rc;
        p = nl + 1;
        nl = p < end ? memchr(p, '\n', (size_t)(end - p)) : NULL;
    }

    /* Carry the unfinished tail. */
    if (p < end) {
        size_t tail = (size_t)(end - p);
        if (framer_partial_too_long(f, end - 1, tail))
            return framer_fail(f);
        /* Sized above, unless a callback raised the limit since. */
        if (tail > f->cap && (rc = framer_grow(f, tail)) != SLOTD_OK)
            return rc;
        memcpy(f->buf, p, tail);
        f->len = tail;
    }
    return SLOTD_OK;
}
