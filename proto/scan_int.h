/*
 * scan_int.h: the JSON scanner, as inline functions of whichever stage
 * reads a line: the tree path's strict syntax check (request.c) walks a
 * whole line with them before cJSON reads it, the one-pass path (flat.c)
 * the values it does not read itself, and decode.c and the tree path skip
 * a checked value.  In a header, not
 * called across files, so that a line's walk enters each file of proto/
 * once (docs/design.md, "Parsing a request line").  RFC 8259, a bounded
 * depth, no "\u0000", no unpaired surrogate escape; a number literal that
 * is not a plain integer of at most 15 digits is counted (j->rewrites) and,
 * with j->out, replaced by its exact value in the copy being written.
 * Pure functions of their arguments: any thread, no lock.
 */
#ifndef SLOTD_PROTO_SCAN_INT_H
#define SLOTD_PROTO_SCAN_INT_H

#include "proto/parse_int.h"

typedef struct proto__scan {
    const unsigned char *s;
    size_t n;
    size_t i;        /* the next byte to look at */
    size_t rewrites; /* number literals that the copy replaces */
    char *out;       /* when not NULL: the copy being written */
    size_t outlen;   /* bytes written to `out` */
    size_t copied;   /* bytes of `s` accounted for in `out` */
    const char *why; /* what was wrong, at byte `i` */
} proto__scan_t;

static inline bool proto__is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static inline int proto__scan_fail(proto__scan_t *j, const char *why)
{
    j->why = why;
    return -1;
}

static inline void proto__scan_ws(proto__scan_t *j)
{
    while (j->i < j->n) {
        unsigned char c = j->s[j->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        j->i++;
    }
}

static inline int proto__scan_literal(proto__scan_t *j, const char *word, size_t len)
{
    if (j->n - j->i < len || memcmp(j->s + j->i, word, len) != 0)
        return proto__scan_fail(j, "unexpected character");
    j->i += len;
    return 0;
}

static inline int scan_container(proto__scan_t *j, int depth);
static inline int proto__scan_value(proto__scan_t *j, int depth);

static inline int json_scan_hex4(proto__scan_t *j, unsigned *out)
{
    unsigned v = 0;

    if (j->n - j->i < 4)
        return proto__scan_fail(j, "truncated \\u escape");
    for (int k = 0; k < 4; k++) {
        unsigned char c = j->s[j->i + (size_t)k];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return proto__scan_fail(j, "bad hex digit in a \\u escape");
    }
    j->i += 4;
    *out = v;
    return 0;
}

/* At the opening quote. */
static inline int json_scan_string(proto__scan_t *j)
{
    unsigned u, lo;

    j->i++;
    for (;;) {
        unsigned char c;
        while (j->i < j->n && (c = j->s[j->i]) >= 0x20 && c != '"' && c != '\\')
            j->i++;
        if (j->i >= j->n)
            return proto__scan_fail(j, "unterminated string");
        c = j->s[j->i];
        if (c == '"') {
            j->i++;
            return 0;
        }
        if (c < 0x20)
            return proto__scan_fail(j, "control character in a string");
        /* A backslash. */
        if (j->i + 1 >= j->n)
            return proto__scan_fail(j, "unterminated string");
        c = j->s[j->i + 1];
        if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
            c == 't') {
            j->i += 2;
            continue;
        }
        if (c != 'u')
            return proto__scan_fail(j, "invalid escape in a string");
        j->i += 2;
        if (json_scan_hex4(j, &u) != 0)
            return -1;
        if (u == 0)
            return proto__scan_fail(j, "\\u0000 in a string");
        if (u >= 0xDC00 && u <= 0xDFFF)
            return proto__scan_fail(j, "unpaired surrogate escape");
        if (u >= 0xD800 && u <= 0xDBFF) {
            if (j->n - j->i < 2 || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u')
                return proto__scan_fail(j, "unpaired surrogate escape");
            j->i += 2;
            if (json_scan_hex4(j, &lo) != 0)
                return -1;
            if (lo < 0xDC00 || lo > 0xDFFF)
                return proto__scan_fail(j, "unpaired surrogate escape");
        }
    }
}

/* A number literal's parts, as offsets into the line. */
typedef struct json_number {
    bool neg, eneg;
    size_t ib, ie; /* integer digits */
    size_t fb, fe; /* fraction digits (empty when fb == fe) */
    size_t eb, ee; /* exponent digits (empty when eb == ee) */
} json_number_t;

/* Digit k of the literal's integer digits followed by its fraction digits. */
static inline unsigned json_number_digit(const unsigned char *s, const json_number_t *nm, size_t k)
{
    size_t ni = nm->ie - nm->ib;

    return (unsigned)(k < ni ? s[nm->ib + k] : s[nm->fb + (k - ni)]) - '0';
}

/* Writes the replacement of a literal: its exact value if that is an integer
 * within +-2^53, else "0.5".  `out` has room for 24 bytes.  Returns the
 * length written. */
static inline size_t json_number_canon(const unsigned char *s, const json_number_t *nm, char *out)
{
    size_t ni = nm->ie - nm->ib, len = ni + (nm->fe - nm->fb), first = 0, last;
    int64_t e = 0, first_place, last_place;
    uint64_t v = 0;
    char digits[24];
    size_t nd = 0, o = 0;

    while (first < len && json_number_digit(s, nm, first) == 0)
        first++;
    if (first == len) {
        out[0] = '0';
        return 1;
    }
    last = len - 1;
    while (json_number_digit(s, nm, last) == 0)
        last--;
    for (size_t k = nm->eb; k < nm->ee; k++) {
        if (e < 1000000000)
            e = e * 10 + (s[k] - '0');
    }
    if (nm->eneg)
        e = -e;
    /* Digit k stands for its value times 10^(ni - 1 - k + e). */
    first_place = (int64_t)ni - 1 - (int64_t)first + e;
    last_place = (int64_t)ni - 1 - (int64_t)last + e;
    if (last_place < 0 || first_place > 15)
        goto not_an_integer;
    for (size_t k = first; k <= last; k++)
        v = v * 10 + json_number_digit(s, nm, k);
    for (int64_t k = 0; k < last_place; k++)
        v *= 10;
    if (v > (uint64_t)PROTO__INT_LIMIT)
        goto not_an_integer;
    do {
        digits[nd++] = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0);
    if (nm->neg)
        out[o++] = '-';
    while (nd > 0)
        out[o++] = digits[--nd];
    return o;

not_an_integer:
    memcpy(out, "0.5", 3);
    return 3;
}

/** A number literal at j->i ('-' or a digit); counts (and, with j->out,
 * replaces) one that is not a plain integer of at most 15 digits. */
static inline int proto__scan_number(proto__scan_t *j)
{
    json_number_t nm = {0};
    size_t start = j->i;
    bool plain = true;

    if (j->s[j->i] == '-') {
        nm.neg = true;
        j->i++;
    }
    if (j->i >= j->n || !proto__is_digit(j->s[j->i]))
        return proto__scan_fail(j, "invalid number");
    nm.ib = j->i;
    if (j->s[j->i] == '0')
        j->i++;
    else
        while (j->i < j->n && proto__is_digit(j->s[j->i]))
            j->i++;
    nm.ie = j->i;
    if (j->i < j->n && j->s[j->i] == '.') {
        nm.fb = ++j->i;
        while (j->i < j->n && proto__is_digit(j->s[j->i]))
            j->i++;
        nm.fe = j->i;
        if (nm.fe == nm.fb)
            return proto__scan_fail(j, "invalid number");
        plain = false;
    }
    if (j->i < j->n && (j->s[j->i] == 'e' || j->s[j->i] == 'E')) {
        j->i++;
        if (j->i < j->n && (j->s[j->i] == '+' || j->s[j->i] == '-'))
            nm.eneg = j->s[j->i++] == '-';
        nm.eb = j->i;
        while (j->i < j->n && proto__is_digit(j->s[j->i]))
            j->i++;
        nm.ee = j->i;
        if (nm.ee == nm.eb)
            return proto__scan_fail(j, "invalid number");
        plain = false;
    }
    if (nm.ie - nm.ib > 15)
        plain = false;
    if (!plain) {
        j->rewrites++;
        if (j->out != NULL) {
            memcpy(j->out + j->outlen, j->s + j->copied, start - j->copied);
            j->outlen += start - j->copied;
            j->outlen += json_number_canon(j->s, &nm, j->out + j->outlen);
            j->copied = j->i;
        }
    }
    return 0;
}
/* At '{' or '['. */
static inline int scan_container(proto__scan_t *j, int depth)
{
    unsigned char close = j->s[j->i] == '{' ? '}' : ']';

    if (depth > PROTO__JSON_MAX_DEPTH)
        return proto__scan_fail(j, "nested deeper than 128 levels");
    j->i++;
    proto__scan_ws(j);
    if (j->i < j->n && j->s[j->i] == close) {
        j->i++;
        return 0;
    }
    for (;;) {
        if (close == '}') {
            proto__scan_ws(j);
            if (j->i >= j->n || j->s[j->i] != '"')
                return proto__scan_fail(j, "expected a member name");
            if (json_scan_string(j) != 0)
                return -1;
            proto__scan_ws(j);
            if (j->i >= j->n || j->s[j->i] != ':')
                return proto__scan_fail(j, "expected ':'");
            j->i++;
        }
        if (proto__scan_value(j, depth) != 0)
            return -1;
        proto__scan_ws(j);
        if (j->i >= j->n)
            return proto__scan_fail(j, close == '}' ? "unterminated object" : "unterminated array");
        if (j->s[j->i] == close) {
            j->i++;
            return 0;
        }
        if (j->s[j->i] != ',')
            return proto__scan_fail(j,
                                    close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
        j->i++;
    }
}

/** Any value at j->i (white space first), nested `depth` levels deep:
 * 0, with j->i past it, or -1 with j->why set. */
static inline int proto__scan_value(proto__scan_t *j, int depth)
{
    proto__scan_ws(j);
    if (j->i >= j->n)
        return proto__scan_fail(j, "unexpected end of line");
    switch (j->s[j->i]) {
    case '{':
    case '[':
        return scan_container(j, depth + 1);
    case '"':
        return json_scan_string(j);
    case 't':
        return proto__scan_literal(j, "true", 4);
    case 'f':
        return proto__scan_literal(j, "false", 5);
    case 'n':
        return proto__scan_literal(j, "null", 4);
    default:
        if (j->s[j->i] == '-' || proto__is_digit(j->s[j->i]))
            return proto__scan_number(j);
        return proto__scan_fail(j, "unexpected character");
    }
}

/** Checks that the line is one JSON object and nothing else (bad_json in
 * `err` if not).  With j->out set, also writes the copy with its number
 * literals replaced. */
static inline int proto__scan_line(proto__scan_t *j, slotd_error_t *err)
{
    proto__scan_ws(j);
    if (j->i >= j->n || j->s[j->i] != '{')
        return slotd_error_set(err, SLOTD_EBAD_JSON, "the line is not a JSON object");
    if (proto__scan_value(j, 0) != 0)
        return slotd_error_set(err, SLOTD_EBAD_JSON, "the line is not valid JSON: %s at byte %zu",
                               j->why, j->i);
    proto__scan_ws(j);
    if (j->i != j->n)
        return slotd_error_set(err, SLOTD_EBAD_JSON,
                               "the line is not one JSON object: more follows it at byte %zu",
                               j->i);
    if (j->out != NULL) {
        memcpy(j->out + j->outlen, j->s + j->copied, j->n - j->copied);
        j->outlen += j->n - j->copied;
        j->copied = j->n;
    }
    return SLOTD_OK;
}

#endif
