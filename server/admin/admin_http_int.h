/*
 * admin_http_int.h: the HTTP side of one admin connection, without
 * sockets or a loop.  Private to the admin room (admin.c) and its tests
 * and fuzz harness.
 *
 * Bytes read from the connection go in; complete responses, in request
 * order, come out appended to a proto_buf_t the caller writes to the
 * socket.  Keep-alive and pipelining are supported.  The caller learns after
 * each call whether to keep reading, to write out what it has before going
 * on (pipelined input is held back while the output is large), or to close
 * once the output is written.
 *
 * DESIGN.  Not thread-safe: one admin_http_t belongs to one connection and
 * is used on one thread (in the daemon, the loop thread).  The hooks are
 * called synchronously from admin_http_feed() and admin_http_resume(),
 * except the sessions hook, which the caller calls on ADMIN_HTTP_WAIT.
 */
#ifndef SLOTD_SERVER_ADMIN_HTTP_INT_H
#define SLOTD_SERVER_ADMIN_HTTP_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"
#include "admin.h"

/** Bytes of request line plus headers; more is answered 431 and closes.
 * Enforced by http-parser, whose limit is process-wide: the first
 * admin_http_new() sets it. */
#define ADMIN_HTTP_MAX_HEADER 8192
/** A longer request target is answered 414 and closes. */
#define ADMIN_HTTP_MAX_URL 2048
/** Request bodies are read and ignored; a longer one is answered 413 and
 * closes. */
#define ADMIN_HTTP_MAX_BODY 65536
/** GET /sessions lists this many sessions unless ?limit=N says otherwise,
 * and never more than ADMIN_HTTP_SESSIONS_MAX. */
#define ADMIN_HTTP_SESSIONS_DEFAULT 100
#define ADMIN_HTTP_SESSIONS_MAX 1000000
/** Once the output holds this many bytes, the next pipelined request waits
 * for admin_http_resume(). */
#define ADMIN_HTTP_OUT_HIGH 65536
/** A body longer than this (GET /sessions) goes to the output this many
 * bytes per admin_http_resume(), so that no call copies much at once. */
#define ADMIN_HTTP_SLICE (256u << 10)

typedef struct admin_http admin_http_t;

/** What the caller does next; negative values are SLOTD_E* errors (only
 * SLOTD_ENOMEM), after which the caller closes the connection at once. */
typedef enum admin_http_next {
    /** Write out whatever was appended and keep reading. */
    ADMIN_HTTP_MORE = 0,
    /** Input is held back: stop reading, write the output out, then call
     * admin_http_resume(). */
    ADMIN_HTTP_FULL = 1,
    /** The last response has been appended: stop reading, write the output
     * out, then close.  Every later call returns ADMIN_HTTP_CLOSE and
     * appends nothing. */
    ADMIN_HTTP_CLOSE = 2,
    /** A response waits for a body built elsewhere (GET /sessions): stop
     * reading, write the output out, begin the body with
     * admin_http_wait_limit() and hand it to admin_http_complete(). */
    ADMIN_HTTP_WAIT = 3,
} admin_http_next_t;

/** A clock in monotonic nanoseconds (the time base of metrics_init()). */
typedef uint64_t (*admin_http_clock_fn)(void);

/** Returns a new connection state, or NULL when out of memory.  `hooks` is
 * copied; a NULL `stats` hook reports zeros and a NULL `healthy` hook
 * reports healthy.  `now_ns` NULL means CLOCK_MONOTONIC.  Freed by
 * admin_http_free(). */
admin_http_t *admin_http_new(const admin_hooks_t *hooks, admin_http_clock_fn now_ns);

/** Frees `h` and any input it held back.  NULL is allowed. */
void admin_http_free(admin_http_t *h);

/** Parses `len` bytes (not kept after the call, except the part held back
 * on ADMIN_HTTP_FULL, which is copied) and appends a response to `out` for
 * every complete request.  `out` is only appended to.  Responses always
 * carry Content-Length; the last one before ADMIN_HTTP_CLOSE carries
 * "Connection: close".  A malformed request gets 400 and ADMIN_HTTP_CLOSE.
 * Feeding while ADMIN_HTTP_FULL is pending holds the bytes back too. */
int admin_http_feed(admin_http_t *h, const char *data, size_t len, proto_buf_t *out);

/** Goes on with the rest of a long body and input held back by
 * ADMIN_HTTP_FULL; returns as feed does.
 * When nothing is held back it appends nothing and returns ADMIN_HTTP_MORE
 * (or ADMIN_HTTP_CLOSE after a close). */
int admin_http_resume(admin_http_t *h, proto_buf_t *out);

/** The `limit` of the GET /sessions that ADMIN_HTTP_WAIT waits for. */
size_t admin_http_wait_limit(const admin_http_t *h);

/** Answers the request ADMIN_HTTP_WAIT waits for with `body` (rc
 * SLOTD_OK; takes its bytes, leaving `body` empty) or fails it (rc
 * SLOTD_ENOMEM: returns SLOTD_ENOMEM, the caller closes), then goes on as
 * admin_http_resume() does.  A body longer than ADMIN_HTTP_SLICE is
 * appended a slice per call, returning ADMIN_HTTP_FULL until the last. */
int admin_http_complete(admin_http_t *h, int rc, proto_buf_t *body, proto_buf_t *out);

/** True between requests: no byte of a next request has been read and
 * none is held back. */
bool admin_http_idle(const admin_http_t *h);

/** Number of responses appended so far (for tests). */
uint64_t admin_http_responses(const admin_http_t *h);

#endif
