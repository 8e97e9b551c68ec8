/*
 * req_int.h: request records (req.c), for the other files of server/.
 * Loop thread only.
 */
#ifndef SLOTD_SERVER_REQ_INT_H
#define SLOTD_SERVER_REQ_INT_H

#include "conn_int.h"
#include "server_int.h"

/** A clean request record, or NULL (ENOMEM).  The caller owns it until
 * req__put(). */
req_t *req__get(server_t *s);
/** Takes the record back (it must have no job out), freeing what its
 * request owns. */
void req__put(server_t *s, req_t *r);
/** Frees `n` records of the free list (at most what it holds), and starts
 * counting its low mark again from what is left. */
void req__shed(server_t *s, size_t n);

/** Sets `r`'s result to the error `code` with `message`, as its reply.
 * Returns SLOTD_OK or SLOTD_ENOMEM. */
int req__set_error(req_t *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/** Finishes `r` with an error reply; false (and the connection closed) if
 * there was no memory for it. */
bool req__fail(req_t *r, const slotd_error_t *err);

/* The record's reply is ready: it now counts against the output bound,
 * and the room it might have taken no longer counts as pending. */
static inline void req__done(req_t *r)
{
    conn_t *c = r->conn;

    r->state = REQ_DONE;
    conn__held_add(c, r->reply.len);
    conn__need_drop(c, r->need_bytes, r->need_slots);
    r->need_bytes = 0;
    r->need_slots = 0;
}

/** Puts `r` at the tail of its connection's order FIFO, numbered. */
static inline void req__order_append(conn_t *c, req_t *r)
{
    r->order_next = NULL;
    r->seq = c->next_seq++;
    if (c->order_tail != NULL)
        c->order_tail->order_next = r;
    else
        c->order_head = r;
    c->order_tail = r;
    c->outstanding++;
}

#endif
