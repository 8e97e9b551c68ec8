/*
 * rules.c: the one rule set of a request, driven by the op table (ops.c):
 * which errors a request's members earn and in which order, and how their
 * values go into a proto_request_t.  The driver (request.c) calls it with
 * the members either path read (proto__value_t), so that neither path
 * holds a rule of its own.  Pure functions of their arguments and the table: any thread, no
 * lock.
 *
 * Design: docs/design.md, "Parsing a request line".
 */
#include "proto/parse_int.h"

#include <stdio.h>
#include <stdlib.h>

/* The bytes of ids and model names: [A-Za-z0-9_.:-]. */
static const unsigned char name_chars[256] = {
    ['-'] = 1, ['.'] = 1, [':'] = 1, ['_'] = 1, ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1,
    ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1, ['8'] = 1, ['9'] = 1, ['A'] = 1, ['B'] = 1,
    ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1, ['H'] = 1, ['I'] = 1, ['J'] = 1,
    ['K'] = 1, ['L'] = 1, ['M'] = 1, ['N'] = 1, ['O'] = 1, ['P'] = 1, ['Q'] = 1, ['R'] = 1,
    ['S'] = 1, ['T'] = 1, ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1, ['Y'] = 1, ['Z'] = 1,
    ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1, ['g'] = 1, ['h'] = 1,
    ['i'] = 1, ['j'] = 1, ['k'] = 1, ['l'] = 1, ['m'] = 1, ['n'] = 1, ['o'] = 1, ['p'] = 1,
    ['q'] = 1, ['r'] = 1, ['s'] = 1, ['t'] = 1, ['u'] = 1, ['v'] = 1, ['w'] = 1, ['x'] = 1,
    ['y'] = 1, ['z'] = 1,
};

/* Copies the `n` bytes at `s` into `out` (max + 1 bytes), NUL-terminated,
 * if they are 1..max bytes of [A-Za-z0-9_.:-]; otherwise leaves `out`
 * empty and returns false. */
static bool name_copy(char *out, const char *s, size_t n, size_t max)
{
    if (n == 0 || n > max) {
        out[0] = '\0';
        return false;
    }
    for (size_t k = 0; k < n; k++) {
        if (!name_chars[(unsigned char)s[k]]) {
            memset(out, 0, k); /* as it was: proto_request_free() clears up to the NUL */
            return false;
        }
        out[k] = s[k];
    }
    out[n] = '\0';
    return true;
}

/* Writes `v` in decimal to end at `end` (with 20 bytes before it); returns
 * where it starts. */
static char *fmt_i64(char *end, int64_t v)
{
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    char *p = end;

    do {
        *--p = (char)('0' + u % 10);
        u /= 10;
    } while (u > 0);
    if (v < 0)
        *--p = '-';
    return p;
}

/* A malloc'd, NUL-terminated copy of `n` bytes of `s`, quoted when `quote`. */
static char *tag_text(const char *s, size_t n, bool quote)
{
    char *t = proto__realloc(NULL, n + (quote ? 3 : 1));
    size_t o = 0;

    if (t == NULL)
        return NULL;
    if (quote)
        t[o++] = '"';
    memcpy(t + o, s, n);
    o += n;
    if (quote)
        t[o++] = '"';
    t[o] = '\0';
    return t;
}

/* An integer tag's JSON text into r->tag.  SLOTD_OK or SLOTD_ENOMEM. */
static int tag_from_int(proto_request_t *r, int64_t v)
{
    char num[24], *p = fmt_i64(num + sizeof(num), v);

    r->tag = tag_text(p, (size_t)(num + sizeof(num) - p), false);
    return r->tag != NULL ? SLOTD_OK : SLOTD_ENOMEM;
}

/* A string tag's JSON text into r->tag, from the string's `n` bytes at `s`
 * (unescaped; no NUL).  SLOTD_OK or SLOTD_ENOMEM. */
static int tag_from_string(proto_request_t *r, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t k = 0;

    /* Printable ASCII other than '"' and '\\' is written as it is. */
    while (k < n && u[k] >= 0x20 && u[k] < 0x80 && u[k] != '"' && u[k] != '\\')
        k++;
    if (k == n) {
        r->tag = tag_text(s, n, true);
        return r->tag != NULL ? SLOTD_OK : SLOTD_ENOMEM;
    }
    r->tag = proto__json_string_text(s, n);
    return r->tag != NULL ? SLOTD_OK : SLOTD_ENOMEM;
}
/* Copies up to 32 of the `n` bytes at `s` for a message, printable ASCII
 * only. */
static void message_safe(char *out, size_t cap, const char *s, size_t n)
{
    size_t i = 0;

    for (; i < n && i + 4 < cap && i < 32; i++) {
        unsigned char c = (unsigned char)s[i];
        out[i] = c >= 0x20 && c < 0x7F && c != '"' && c != '\\' ? (char)c : '?';
    }
    if (i < n) {
        memcpy(out + i, "...", 3);
        i += 3;
    }
    out[i] = '\0';
}

/* The unknown_op error, which lists the ops of the table. */
static int unknown_op(const proto__value_t *op, slotd_error_t *err)
{
    char safe[40], list[256];
    size_t o = 0;

    message_safe(safe, sizeof(safe), op->s, op->len);
    for (int k = PROTO_OP_NONE + 1; k < PROTO_OP__COUNT; k++) {
        size_t len = proto_ops[k].len;
        if (o + len + 3 > sizeof(list))
            break;
        if (o > 0) {
            memcpy(list + o, ", ", 2);
            o += 2;
        }
        memcpy(list + o, proto_ops[k].name, len);
        o += len;
    }
    list[o] = '\0';
    return slotd_error_set(err, SLOTD_EUNKNOWN_OP, "unknown `op` \"%s\" (%s)", safe, list);
}

/* The bad_request of member `d` of op `o`: "<op>: `<name>` <words>". */
static __attribute__((noinline, cold)) int member_error(proto_op_t o, const proto_field_def_t *d,
                                                        const char *words, slotd_error_t *err)
{
    return slotd_error_set(err, SLOTD_EBAD_REQUEST, "%s: `%s` %s", proto_ops[o].name, d->name,
                           words);
}

/* Stores what member `d` (checked) allocates: a BYTES or INTS value. */
static int member_alloc(const proto_field_def_t *d, const proto__value_t *v, proto__ints_reader rd,
                        char *base)
{
    void *p;

    if (d->type == PROTO_TYPE_BYTES) {
        if ((p = proto__realloc(NULL, v->len + 1)) == NULL)
            return SLOTD_ENOMEM;
        memcpy(p, v->s, v->len);
        ((char *)p)[v->len] = '\0';
        memcpy(base + d->at_len, &v->len, sizeof(v->len));
    } else {
        if ((p = proto__realloc(NULL, v->n * sizeof(int64_t))) == NULL)
            return SLOTD_ENOMEM;
        if (v->ints != NULL)
            memcpy(p, v->ints, v->n * sizeof(int64_t));
        else
            rd(v->tree, p, v->n);
        memcpy(base + d->at_len, &v->n, sizeof(v->n));
    }
    memcpy(base + d->at, &p, sizeof(p));
    return SLOTD_OK;
}

int proto__request_fill(const proto__value_t *f, proto__ints_reader rd, proto_request_t *r,
                        slotd_error_t *err)
{
    const proto__value_t *opv = &f[PROTO_FIELD_OP], *tag = &f[PROTO_FIELD_TAG];
    const proto_op_def_t *def;
    const proto_member_t *end;
    char *base = (char *)r;
    const proto_member_t *later[PROTO_OP_MEMBERS_MAX]; /* what allocates */
    unsigned nlater = 0;
    proto_op_t o;
    int rc = SLOTD_OK;

    /* The tag first, so that even an unknown_op reply can echo it. */
    if (tag->kind == PROTO__INT)
        rc = tag_from_int(r, tag->v);
    else if (tag->kind == PROTO__STRING)
        rc = tag_from_string(r, tag->s, tag->len);
    if (rc != SLOTD_OK)
        return slotd_error_set(err, rc, "out of memory");

    if (opv->kind == PROTO__ABSENT)
        return slotd_error_set(err, SLOTD_EUNKNOWN_OP, "`op` is missing");
    if (opv->kind != PROTO__STRING)
        return slotd_error_set(err, SLOTD_EUNKNOWN_OP, "`op` must be a string");
    if ((o = proto__op_lookup(opv->s, opv->len)) == PROTO_OP_NONE)
        return unknown_op(opv, err);
    r->op = o;
    /* A bad tag is a field error and so comes after the op. */
    if (tag->kind != PROTO__ABSENT && tag->kind != PROTO__INT && tag->kind != PROTO__STRING)
        return slotd_error_set(err, SLOTD_EBAD_REQUEST, "`tag` %s",
                               proto_fields[PROTO_FIELD_TAG].must);

    /* Every member's check, in table order, storing what needs no memory;
     * then what does, so that a refused line allocates nothing more. */
    def = &proto_ops[o];
    end = def->members + def->nmembers;
    for (const proto_member_t *m = def->members; m < end; m++) {
        const proto_field_def_t *d = &proto_fields[m->field];
        const proto__value_t *v = &f[m->field];

        if (v->kind == PROTO__ABSENT) {
            if (m->required)
                return member_error(o, d, d->missing != NULL ? d->missing : d->must, err);
            continue;
        }
        switch (d->type) {
        case PROTO_TYPE_NAME:
            if (v->kind != PROTO__STRING || !name_copy(base + d->at, v->s, v->len, (size_t)d->hi))
                return member_error(o, d, d->must, err);
            break;
        case PROTO_TYPE_BYTES:
            if (v->kind != PROTO__STRING || v->len < (uint64_t)d->lo || v->len > (uint64_t)d->hi)
                return member_error(o, d, d->must, err);
            later[nlater++] = m;
            break;
        case PROTO_TYPE_INTS:
            if (v->kind != PROTO__INTS || v->n == 0)
                return member_error(o, d, d->must, err);
            if (v->bad < v->n)
                return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                                       "%s: `%s` %s (element %zu is not an integer)",
                                       proto_ops[o].name, d->name, d->must, v->bad);
            later[nlater++] = m;
            break;
        case PROTO_TYPE_INT:
            if (v->kind != PROTO__INT || v->v < d->lo || v->v > d->hi)
                return member_error(o, d, d->must, err);
            if (d->width == sizeof(uint32_t)) {
                uint32_t u = (uint32_t)v->v;
                memcpy(base + d->at, &u, sizeof(u));
            } else {
                memcpy(base + d->at, &v->v, sizeof(v->v));
            }
            break;
        case PROTO_TYPE_BOOL:
            if (v->kind != PROTO__TRUE && v->kind != PROTO__FALSE)
                return member_error(o, d, d->must, err);
            base[d->at] = v->kind == PROTO__TRUE;
            break;
        case PROTO_TYPE_TAG: /* tag and op are no op's members; */
        case PROTO_TYPE_OP:
        case PROTO_TYPE_SAMPLE: /* the decoding controls are read below */
        case PROTO_TYPE_STOP:
        case PROTO_TYPE_SCORES:
            return member_error(o, d, "is not a member", err);
        }
    }
    /* The decoding controls, after the members, when any was given. */
    if (def->decodes && (f[PROTO_FIELD_SAMPLE].kind | f[PROTO_FIELD_STOP].kind |
                         f[PROTO_FIELD_SCORES].kind) != PROTO__ABSENT) {
        for (int k = PROTO_FIELD_SAMPLE; k <= PROTO_FIELD_SCORES; k++) {
            const proto_field_def_t *d = &proto_fields[k];
            char words[128];
            const char *why;
            if (f[k].kind == PROTO__ABSENT)
                continue;
            if (f[k].kind != PROTO__RAW)
                return member_error(o, d, d->must, err);
            why = proto__decode_read(d->type, d->must, f[k].s, f[k].len, &r->dec, words,
                                     sizeof(words));
            if (why != NULL)
                return member_error(o, d, why, err);
        }
    }
    for (unsigned k = 0; k < nlater; k++) {
        const proto_member_t *m = later[k];
        if (member_alloc(&proto_fields[m->field], &f[m->field], rd, base) != SLOTD_OK)
            return slotd_error_set(err, SLOTD_ENOMEM, "out of memory");
    }
    return SLOTD_OK;
}
