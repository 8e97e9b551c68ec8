/*
 * scan.h: a small hand-written scanner for the reply lines of slotd.
 *
 * It walks one JSON object without building a tree and records, for the few
 * members a load generator reads, the raw text of the value.  Numbers stay as
 * the daemon printed them, so a logit can be compared as text.  Spans point
 * into the caller's line and are valid as long as it is.
 */
#ifndef SLOTD_BENCH_SCAN_H
#define SLOTD_BENCH_SCAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** Raw text of a JSON value inside a line; `n` 0 means the member is absent.
 * A string's span excludes its quotes. */
typedef struct span {
    const char *p;
    size_t n;
} span_t;

/** The members of a reply that the generator reads. */
typedef struct scan_reply {
    span_t id;         /* string */
    span_t model;      /* string */
    span_t tokens;     /* array, brackets included */
    span_t logits;     /* array, brackets included */
    span_t entries;    /* number */
    span_t released;   /* number */
    span_t cached;     /* number (start, append, fork) */
    span_t tag;        /* number or string (quotes excluded) */
    span_t error_code; /* string inside "error" */
    span_t error_msg;  /* string inside "error" */
    span_t ok;         /* literal: true (the reply to auth) */
    bool has_error;    /* an "error" member is present */
} scan_reply_t;

/** Scans `line` (`len` bytes, no newline) as one JSON object.  Returns 0 and
 * fills `r`, or -1 if the line is not a well-formed object. */
int scan_reply(const char *line, size_t len, scan_reply_t *r);

/** Parses a span holding a JSON integer.  Returns 0, or -1 if it is absent
 * or not a plain integer. */
int scan_int(span_t s, int64_t *out);

/** Whether span `s` holds exactly the text `lit` (NUL-terminated). */
bool scan_eq(span_t s, const char *lit);

/** An iterator over the elements of an array span. */
typedef struct scan_iter {
    const char *p;
    const char *end;
} scan_iter_t;

/** Starts iterating `arr` (a span from scan_reply that begins with '[').
 * Returns -1 if it is not an array. */
int scan_iter_init(scan_iter_t *it, span_t arr);

/** The next element's raw text (strings keep their quotes here).  Returns 1
 * with *elem set, 0 at the end, -1 on malformed input. */
int scan_iter_next(scan_iter_t *it, span_t *elem);

#endif
