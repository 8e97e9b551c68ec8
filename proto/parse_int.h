/*
 * parse_int.h: what the files of the request parser share, and
 * nothing else includes.  Who calls whom (never back):
 *
 *   request.c  -> flat.c, arena.c, rules.c, ops.c (proto_init())
 *   rules.c    -> decode.c, reply.c (proto__put_json_string), buf.c
 *   flat.c, decode.c, ops.c -> nothing in proto/
 * and all of them read the table of ops.c.  The scanner (scan_int.h) and
 * the UTF-8 check (utf8_int.h) are inline in the files that use them, so
 * that a line's walk enters each file once.
 *
 * Design: docs/design.md, "Parsing a request line".
 */
#ifndef SLOTD_PROTO_PARSE_INT_H
#define SLOTD_PROTO_PARSE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "proto/proto_int.h"

#define PROTO__JSON_MAX_DEPTH 128
#define PROTO__INT_LIMIT 9007199254740992.0 /* 2^53 */
/* Longest replacement of a number literal ("-9007199254740992") less the
 * shortest literal that is replaced ("1.0", "1e5"), rounded up. */
#define PROTO__NUMBER_GROWTH 16

/* ---- arena.c: cJSON's memory during a parse ---- */

/** Opens the calling thread's arena; the cJSON hooks serve from it until
 * proto__arena_end(), which lets go of all of it at once. */
void proto__arena_begin(void);
/** `n` bytes aligned like malloc's from the open arena, or NULL. */
void *proto__arena_alloc(size_t n);
void proto__arena_end(void);
/** Allocations the open arena served so far. */
size_t proto__arena_allocs(void);

/* ---- rules.c: the one rule set, from the table in ops.c ---- */

/** A member's value as the rules see it, whichever path read it. */
typedef enum proto__kind {
    PROTO__ABSENT = 0,
    PROTO__STRING, /* s, len: its bytes, unescaped; high: one is >= 0x80 */
    PROTO__INT,    /* an integral number within +-2^53: v */
    PROTO__INTS,   /* an array of n elements, the first not an integer at `bad` (n if none) */
    PROTO__TRUE,
    PROTO__FALSE,
    PROTO__OTHER, /* anything else (the one-pass path: anything it did not read) */
    PROTO__RAW    /* a decoding control's value (proto__is_raw()): s, len, its JSON text */
} proto__kind_t;

typedef struct proto__value {
    proto__kind_t kind;
    bool high;
    const char *s;
    size_t len;
    int64_t v;
    size_t n, bad;
    const int64_t *ints; /* PROTO__INTS: the n integers, or NULL: read them from `tree` */
    const void *tree;    /* PROTO__INTS without ints: the array's first cJSON element */
} proto__value_t;

/** Reads the n integers of a cJSON array into `out`: the tree path's,
 * given to proto__request_fill() so that rules.c needs no cJSON. */
typedef void (*proto__ints_reader)(const void *first, int64_t *out, size_t n);

/** The request whose members are f[] (indexed by proto_field_t) into
 * `r` (as proto_request_init() left it), by the rules of the op table:
 * the tag's JSON text first, when it is a string or an integer, so that
 * any error reply can echo it; then the errors in the order they win:
 * unknown_op (op), bad_request (tag, then the op's members in table order,
 * with r->op set); then what the members allocate (ENOMEM).  `rd` reads an
 * array of the tree path (`tree`).  SLOTD_OK or the code set in `err`. */
int proto__request_fill(const proto__value_t *f, proto__ints_reader rd, proto_request_t *r,
                        slotd_error_t *err);

/* ---- decode.c: the decoding controls, from their JSON text ---- */

/** Whether field `k`'s value goes to the rules as its JSON text
 * (PROTO__RAW) rather than read by either path: the decoding controls. */
static inline bool proto__is_raw(int k)
{
    return proto_fields[k].type >= PROTO_TYPE_SAMPLE;
}

/** Reads the value of a member of `type` (SAMPLE, STOP, SCORES) from its
 * JSON text, the `n` bytes at `s` (syntax-checked), into `dec` (setting
 * its defaults first, once).  NULL, or the words of its error: `must`
 * (the field's) or a more precise text written into `words` (`cap`
 * bytes). */
const char *proto__decode_read(proto_type_t type, const char *must, const char *s, size_t n,
                               proto_decode_t *dec, char *words, size_t cap);

/* ---- ops.c: the table ---- */

/** Builds the indexes below; proto_init() calls it once. */
void proto__ops_init(void);
/** The member-name index: by a name's length and first byte, the first
 * field with them, plus one (0: none); then the next such in
 * proto__field_next[].  proto__field_word[k] is the first 8 bytes of field
 * k's name, zero-padded, as a load from memory reads them, and
 * proto__name_mask[n] keeps the first n bytes of such a load.  Written by
 * proto__ops_init() only. */
#define PROTO__FIELD_INDEX_LEN 16
extern unsigned char proto__field_first[PROTO__FIELD_INDEX_LEN][32];
extern unsigned char proto__field_next[PROTO_FIELD__COUNT];
extern uint64_t proto__field_word[PROTO_FIELD__COUNT];
extern uint64_t proto__name_mask[9];

/** The proto_field_t of the `n` bytes of a member name at `s`, or -1;
 * `avail` bytes from `s` may be read (n or more). */
static inline int proto__field_index(const char *s, size_t n, size_t avail)
{
    unsigned k;

    if (n == 0 || n >= PROTO__FIELD_INDEX_LEN)
        return -1;
    for (k = proto__field_first[n][s[0] & 31]; k != 0; k = proto__field_next[k - 1]) {
        const char *name = proto_fields[k - 1].name;
        size_t i = 0;
        if (n <= 8 && avail >= 8) { /* one load, no call to memcmp() */
            uint64_t w;
            memcpy(&w, s, 8);
            if ((w & proto__name_mask[n]) == proto__field_word[k - 1])
                return (int)k - 1;
            continue;
        }
        while (i < n && s[i] == name[i])
            i++;
        if (i == n)
            return (int)k - 1;
    }
    return -1;
}

/** The same index of op names: proto__op_first[][] and proto__op_next[]. */
extern unsigned char proto__op_first[PROTO__FIELD_INDEX_LEN][32];
extern unsigned char proto__op_next[PROTO_OP__COUNT];

/** The op named by the `n` bytes at `s`, or PROTO_OP_NONE. */
static inline proto_op_t proto__op_lookup(const char *s, size_t n)
{
    unsigned k;

    if (n == 0 || n >= PROTO__FIELD_INDEX_LEN)
        return PROTO_OP_NONE;
    for (k = proto__op_first[n][s[0] & 31]; k != 0; k = proto__op_next[k]) {
        const char *name = proto_ops[k].name;
        size_t i = 0;
        if (n >= 4 && n <= 8) { /* two loads of 4 bytes, which may overlap */
            uint32_t a, b, c, d;
            memcpy(&a, s, 4);
            memcpy(&b, name, 4);
            memcpy(&c, s + n - 4, 4);
            memcpy(&d, name + n - 4, 4);
            if (a == b && c == d)
                return (proto_op_t)k;
            continue;
        }
        while (i < n && s[i] == name[i])
            i++;
        if (i == n)
            return (proto_op_t)k;
    }
    return PROTO_OP_NONE;
}

/* ---- flat.c: the one-pass path ---- */

/** The integers of prompt and tokens arrays, read before the op is known.
 * `v` is `local` until it outgrows it, then memory from proto__realloc(),
 * which the caller frees (free(t->v) when t->v != t->local). */
#define PROTO__FLAT_LOCAL_INTS 256
typedef struct proto__flat_ints {
    int64_t *v;
    size_t n, cap;
    int64_t local[PROTO__FLAT_LOCAL_INTS];
} proto__flat_ints_t;

/** Reads the line in one pass, checking every byte as the tree path does,
 * and notes the first value of each known member in f[] (its integers in
 * `t`), for the rules.  0, or -1: the line is left to the tree path. */
int proto__flat_read(const char *line, size_t len, proto__value_t *f, proto__flat_ints_t *t);

#endif
