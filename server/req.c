/*
 * req.c: request records, from the line read to the reply copied out.  It
 * owns the free list of records (and the reply buffers they keep), a
 * record's place in its connection's order FIFO, and a record answered:
 * with an error (req__set_error(), req__fail()) or done (req__done(),
 * req_int.h).
 *
 * DESIGN.  Loop thread only; no lock.  A record whose job is out
 * (REQ_RUNNING) is the workers' until it comes back (server_int.h); the
 * free list only ever holds records with no job out.
 *
 * Design: docs/design.md, "server/ layout".
 */
#include "req_int.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn_int.h"
#include "server/base/log.h"

/* Records kept for reuse at most; beyond, they go back to malloc. */
#define MAX_FREE_REQS 16384
/* A record's reply buffer larger than this is not kept for reuse, nor any
 * once the kept buffers add up to MAX_KEPT_REPLIES: the free list holds at
 * most 16 MiB of reply buffers, whatever replies were once written. */
#define MAX_KEPT_REPLY (64u << 10)
#define MAX_KEPT_REPLIES ((size_t)16 << 20)

/* A request record's alignment, a cache line, and its size rounded up
 * to it for aligned_alloc(). */
#define SERVER_REQ_ALIGN SLOTD_CACHE_LINE
#define SERVER_REQ_BYTES                                                                           \
    ((sizeof(req_t) + SERVER_REQ_ALIGN - 1) / SERVER_REQ_ALIGN * SERVER_REQ_ALIGN)

/* ---- Answers ---- */

int req__set_error(req_t *r, int code, const char *fmt, ...)
{
    slotd_error_t err;
    va_list ap;

    err.code = code;
    va_start(ap, fmt);
    vsnprintf(err.message, sizeof(err.message), fmt, ap);
    va_end(ap);
    r->rc = code;
    r->reply.len = 0;
    return proto_reply_error(&r->reply, r->rq.tag, &err);
}

/* Finishes `r` with an error reply; false (and the connection closed) if
 * there was no memory for it. */
bool req__fail(req_t *r, const slotd_error_t *err)
{
    r->rc = err->code;
    r->reply.len = 0;
    if (proto_reply_error(&r->reply, r->rq.tag, err) != SLOTD_OK) {
        log_error("connection %" PRIu64 ": no memory for a reply; closing it", r->conn->serial);
        conn__close(r->conn);
        return false;
    }
    req__done(r);
    return true;
}

/* ---- Free lists ---- */

req_t *req__get(server_t *s)
{
    req_t *r = s->free_reqs;

    if (r != NULL) {
        s->free_reqs = r->order_next;
        s->nfree_reqs--;
        s->free_reply_bytes -= r->reply.cap;
        if (s->nfree_reqs < s->low_free_reqs)
            s->low_free_reqs = s->nfree_reqs;
    } else {
        /* Line-aligned, so that the job (and its hints) is the one line a
         * worker reads under the queue's lock (worker.c, Prefetching). */
        r = aligned_alloc(SERVER_REQ_ALIGN, SERVER_REQ_BYTES);
        if (r == NULL)
            return NULL;
        memset(r, 0, sizeof(*r));
        proto_request_init(&r->rq);
        proto_buf_init(&r->reply);
    }
    r->order_next = NULL;
    return r;
}

_Static_assert(offsetof(req_t, job) == 0 && offsetof(worker_job_t, flow) <= SERVER_REQ_ALIGN,
               "what a worker reads of a request's job under the lock is its first line");

/* req__put() clears a record's fields in three runs: `job`, from
 * `session` to `conn`, and from `model` to `cs` (in pieces small enough
 * to be stored in line).  What lies outside them is set for
 * every line before it is read (conn .. read_ns), reset by
 * proto_request_free() (rq), written before it is read (cs), or kept
 * (reply). */
_Static_assert(offsetof(req_t, session) == sizeof(worker_job_t) &&
                   offsetof(req_t, conn) < offsetof(req_t, rq) &&
                   offsetof(req_t, read_ns) < offsetof(req_t, rq) &&
                   offsetof(req_t, rq) < offsetof(req_t, model) &&
                   offsetof(req_t, model) < offsetof(req_t, cs) &&
                   offsetof(req_t, cs) < offsetof(req_t, reply) &&
                   offsetof(req_t, reply) < offsetof(req_t, canceled),
               "req_t: job .. state, conn .. read_ns, rq, model .. chain_cut, cs, reply, canceled");

void req__put(server_t *s, req_t *r)
{
    proto_buf_t *reply = &r->reply;

    proto_request_free(&r->rq); /* which leaves it as proto_request_init() does */
    if (s->nfree_reqs >= MAX_FREE_REQS) {
        proto_buf_free(reply);
        free(r);
        return;
    }
    if (reply->cap > MAX_KEPT_REPLY || s->free_reply_bytes + reply->cap > MAX_KEPT_REPLIES) {
        proto_buf_free(reply);
        proto_buf_init(reply);
    }
    s->free_reply_bytes += reply->cap;
    reply->len = 0;
    /* A record is taken and given back for every line: only the fields
     * that a line may find set are cleared (server_int.h, struct req). */
    memset(&r->job, 0, sizeof(r->job));
    memset(&r->session, 0, offsetof(req_t, conn) - offsetof(req_t, session));
    memset((char *)r + offsetof(req_t, model), 0, offsetof(req_t, cs) - offsetof(req_t, model));
    atomic_store_explicit(&r->canceled, false, memory_order_relaxed);
    atomic_store_explicit(&r->started, false, memory_order_relaxed);
    r->order_next = s->free_reqs;
    s->free_reqs = r;
    s->nfree_reqs++;
}

void req__shed(server_t *s, size_t n)
{
    for (; n > 0 && s->free_reqs != NULL; n--) {
        req_t *r = s->free_reqs;
        s->free_reqs = r->order_next;
        s->nfree_reqs--;
        s->free_reply_bytes -= r->reply.cap;
        proto_buf_free(&r->reply);
        free(r);
    }
    s->low_free_reqs = s->nfree_reqs;
}
