/*
 * flat.c: the one-pass path of proto_request_parse(), which reads the
 * usual requests in one pass over the line without building a tree.
 *
 * It reads only what it can read exactly as the tree path does, and leaves
 * the rest to it (declines): a member name with an escape (it might spell a
 * known name), a known member's string with an escape, a number that is not
 * a plain integer of at most 15 digits where an integer is read (1.0, 1e2
 * and 16-digit literals need the exact rule of scan_int.h), and any line the
 * rules (rules.c) refuse, so that error messages are made once, by the tree
 * path.  Everything else in the line -- unknown members, later duplicates,
 * known members the op does not use -- is only checked, with
 * proto__scan_value() and the UTF-8 scan.  It holds no rule of a member of
 * its own: the values it notes go back to the driver (request.c), which
 * hands them to the same proto__request_fill() as the tree path's.
 *
 * Cost (it runs on the loop thread for every request): the place in the
 * line is a local; white space is skipped only where the next byte is not
 * the one expected; a member name that is one of the table's, spelled out,
 * is found with one load of the 8 bytes after its quote; and the usual
 * values (a printable ASCII string, a positive plain integer) are read in
 * the main loop.  Whatever those fast reads do not take is read again from
 * its start by the general readers, so they decide nothing of their own.
 *
 * Threads: any thread; it touches only its arguments and its stack.
 *
 * Design: docs/design.md, "Parsing a request line".
 */
#include "proto/scan_int.h"

#include <stdlib.h>

/* The bytes a string holds as they are: printable ASCII and DEL, but the
 * quote and the backslash. */
static const unsigned char str_plain[256] = {
    [0x20] = 1, [0x21] = 1, [0x23] = 1, [0x24] = 1, [0x25] = 1, [0x26] = 1, [0x27] = 1, [0x28] = 1,
    [0x29] = 1, [0x2A] = 1, [0x2B] = 1, [0x2C] = 1, [0x2D] = 1, [0x2E] = 1, [0x2F] = 1, [0x30] = 1,
    [0x31] = 1, [0x32] = 1, [0x33] = 1, [0x34] = 1, [0x35] = 1, [0x36] = 1, [0x37] = 1, [0x38] = 1,
    [0x39] = 1, [0x3A] = 1, [0x3B] = 1, [0x3C] = 1, [0x3D] = 1, [0x3E] = 1, [0x3F] = 1, [0x40] = 1,
    [0x41] = 1, [0x42] = 1, [0x43] = 1, [0x44] = 1, [0x45] = 1, [0x46] = 1, [0x47] = 1, [0x48] = 1,
    [0x49] = 1, [0x4A] = 1, [0x4B] = 1, [0x4C] = 1, [0x4D] = 1, [0x4E] = 1, [0x4F] = 1, [0x50] = 1,
    [0x51] = 1, [0x52] = 1, [0x53] = 1, [0x54] = 1, [0x55] = 1, [0x56] = 1, [0x57] = 1, [0x58] = 1,
    [0x59] = 1, [0x5A] = 1, [0x5B] = 1, [0x5D] = 1, [0x5E] = 1, [0x5F] = 1, [0x60] = 1, [0x61] = 1,
    [0x62] = 1, [0x63] = 1, [0x64] = 1, [0x65] = 1, [0x66] = 1, [0x67] = 1, [0x68] = 1, [0x69] = 1,
    [0x6A] = 1, [0x6B] = 1, [0x6C] = 1, [0x6D] = 1, [0x6E] = 1, [0x6F] = 1, [0x70] = 1, [0x71] = 1,
    [0x72] = 1, [0x73] = 1, [0x74] = 1, [0x75] = 1, [0x76] = 1, [0x77] = 1, [0x78] = 1, [0x79] = 1,
    [0x7A] = 1, [0x7B] = 1, [0x7C] = 1, [0x7D] = 1, [0x7E] = 1, [0x7F] = 1,
};

/* At the opening quote: a string with no escape in it, whose bytes are
 * valid UTF-8 (the check the tree path makes of the whole line first).
 * Its bytes are [*b, *e) of the line, *high tells whether one is >= 0x80,
 * and j->i is past the closing quote.  -1 for anything else: a backslash,
 * a control character, ill-formed UTF-8, no closing quote. */
static int flat_string(proto__scan_t *j, size_t *b, size_t *e, bool *high)
{
    const unsigned char *s = j->s;
    size_t i = j->i + 1, n = j->n, k;

    *b = i;
    *high = false;
    for (;;) {
        while (i < n && str_plain[s[i]])
            i++;
        if (i >= n)
            return -1;
        if (s[i] == '"')
            break;
        if (s[i] < 0x80 || (k = proto__utf8_seq(s + i, n - i)) == 0)
            return -1;
        *high = true;
        i += k;
    }
    *e = i;
    j->i = i + 1;
    return 0;
}

/* Any well-formed value at j->i, read by the syntax check itself (at the
 * depth of a member of the line's object), whose strings are valid UTF-8. */
static int flat_skip(proto__scan_t *j)
{
    size_t start = j->i;

    if (proto__scan_value(j, 1) != 0)
        return -1;
    return proto__utf8_scan((const char *)j->s + start, j->i - start) == j->i - start ? 0 : -1;
}

/* At '-' or a digit.  0: a plain literal (no fraction, no exponent, at most
 * 15 digits, so cJSON's double holds it exactly), its value in *v; 1:
 * another well-formed literal; -1: not a number. */
static int flat_number(proto__scan_t *j, int64_t *v)
{
    const unsigned char *s = j->s;
    size_t i = j->i, n = j->n, digits;
    bool neg = s[i] == '-';
    uint64_t u = 0;

    if (neg)
        i++;
    if (i >= n || !proto__is_digit(s[i]))
        return -1;
    digits = i;
    if (s[i] == '0')
        i++;
    else
        for (; i < n && proto__is_digit(s[i]) && i - digits < 16; i++)
            u = u * 10 + (unsigned)(s[i] - '0');
    if (i - digits > 15 ||
        (i < n && (s[i] == '.' || s[i] == 'e' || s[i] == 'E' || proto__is_digit(s[i])))) {
        /* The syntax check reads the rest. */
        return proto__scan_number(j) == 0 ? 1 : -1;
    }
    j->i = i;
    *v = neg ? -(int64_t)u : (int64_t)u;
    return 0;
}

static int flat_push(proto__flat_ints_t *t, int64_t v)
{
    if (t->n == t->cap) {
        size_t cap = t->cap * 2;
        int64_t *p;
        if (cap > SIZE_MAX / sizeof(*p))
            return -1;
        p = proto__realloc(t->v == t->local ? NULL : t->v, cap * sizeof(*p));
        if (p == NULL)
            return -1;
        if (t->v == t->local)
            memcpy(p, t->local, t->n * sizeof(*p));
        t->v = p;
        t->cap = cap;
    }
    t->v[t->n++] = v;
    return 0;
}

/* At the '[' of a prompt or tokens member: PROTO__INTS if it is a non-empty
 * array of plain integer literals, which go into `t`; otherwise the array
 * is read again as any value, PROTO__OTHER. */
static int flat_array(proto__scan_t *j, proto__flat_ints_t *t, proto__value_t *out)
{
    size_t start = j->i, first = t->n;
    int64_t v;

    j->i++;
    for (;;) {
        int rc;
        proto__scan_ws(j);
        if (j->i >= j->n || (j->s[j->i] != '-' && !proto__is_digit(j->s[j->i])))
            goto other;
        if ((rc = flat_number(j, &v)) < 0)
            return -1;
        if (rc > 0)
            goto other;
        if (flat_push(t, v) != 0)
            return -1;
        proto__scan_ws(j);
        if (j->i < j->n && j->s[j->i] == ']')
            break;
        if (j->i >= j->n || j->s[j->i] != ',')
            return -1;
        j->i++;
    }
    j->i++;
    out->kind = PROTO__INTS;
    out->v = (int64_t)first; /* where they are in t->v */
    out->ints = t->v + first;
    out->n = out->bad = t->n - first;
    return 0;

other:
    t->n = first;
    j->i = start;
    out->kind = PROTO__OTHER;
    return flat_skip(j);
}

/* The first value of known member `k`, at j->i (not white space). */
static int flat_value(proto__scan_t *j, int k, proto__value_t *out, proto__flat_ints_t *t)
{
    unsigned char c = j->s[j->i];
    size_t b, e;
    int rc;

    switch (c) {
    case '"':
        out->kind = PROTO__STRING;
        if (flat_string(j, &b, &e, &out->high) != 0)
            return -1;
        out->s = (const char *)j->s + b;
        out->len = e - b;
        return 0;
    case 't':
        out->kind = PROTO__TRUE;
        return proto__scan_literal(j, "true", 4);
    case 'f':
        out->kind = PROTO__FALSE;
        return proto__scan_literal(j, "false", 5);
    case '[':
        if (proto_fields[k].type == PROTO_TYPE_INTS)
            return flat_array(j, t, out);
        break;
    default:
        if (c == '-' || proto__is_digit(c)) {
            if ((rc = flat_number(j, &out->v)) < 0)
                return -1;
            out->kind = rc == 0 ? PROTO__INT : PROTO__OTHER;
            return 0;
        }
        break;
    }
    out->kind = PROTO__OTHER;
    return flat_skip(j);
}

/* Past the JSON white space at s[i] (most lines have none). */
static inline size_t flat_ws(const unsigned char *s, size_t i, size_t n)
{
    while (i < n && s[i] <= ' ' && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
        i++;
    return i;
}

/* At the opening quote of a member name at s[i]: the known member it names
 * when the name is one of the table's spelled out (no escape), read with
 * one load of the 8 bytes after the quote, with *end past its closing
 * quote; -1 when that load cannot tell (a longer name, an unknown one, an
 * escape, too few bytes left), and the caller reads the name byte by byte. */
static inline int flat_key_fast(const unsigned char *s, size_t i, size_t n, size_t *end)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const uint64_t ones = 0x0101010101010101u;
    uint64_t w, z;
    size_t len;
    unsigned k;

    if (n - i < 9)
        return -1;
    memcpy(&w, s + i + 1, 8);
    z = w ^ (ones * '"');
    z = (z - ones) & ~z & (ones * 0x80); /* the first quote's byte, exactly */
    if (z == 0)
        return -1;
    len = (size_t)__builtin_ctzll(z) >> 3;
    if (len == 0 || (k = proto__field_first[len][w & 31]) == 0 ||
        (w & proto__name_mask[len]) != proto__field_word[k - 1])
        return -1;
    *end = i + len + 2;
    return (int)k - 1;
#else
    (void)s, (void)i, (void)n, (void)end;
    return -1;
#endif
}

/* The whole line, once: one object, every byte checked as the tree path
 * checks it, and the first value of each known member noted in f[].  The
 * place in the line is kept in `i` and handed to the readers in j->i. */
static int flat_scan(proto__scan_t *j, proto__value_t *f, proto__flat_ints_t *t)
{
    const unsigned char *s = j->s;
    size_t n = j->n, i = flat_ws(s, 0, n);

    if (i >= n || s[i] != '{')
        return -1;
    i++;
    for (;;) {
        size_t b, e;
        bool high;
        int k;

        if (i < n && s[i] != '"')
            i = flat_ws(s, i, n);
        if (i >= n || s[i] != '"')
            return -1;
        if ((k = flat_key_fast(s, i, n, &e)) >= 0) {
            i = e;
        } else {
            j->i = i;
            if (flat_string(j, &b, &e, &high) != 0)
                return -1;
            i = j->i;
            k = high ? -1 : proto__field_index((const char *)s + b, e - b, n - b);
        }
        if (i < n && s[i] != ':')
            i = flat_ws(s, i, n);
        if (i >= n || s[i] != ':')
            return -1;
        i = flat_ws(s, i + 1, n);
        if (i >= n)
            return -1;
        if (k >= 0 && f[k].kind == PROTO__ABSENT && proto__is_raw(k)) {
            /* A decoding control: its text, for decode.c. */
            j->i = i;
            if (flat_skip(j) != 0)
                return -1;
            f[k].kind = PROTO__RAW;
            f[k].s = (const char *)s + i;
            f[k].len = j->i - i;
        } else if (k >= 0 && f[k].kind == PROTO__ABSENT) {
            proto__value_t *v = &f[k];
            size_t q = i + 1;

            /* The usual values, read here as flat_value() would read
             * them: a string of printable ASCII with no escape, a positive
             * plain integer.  Anything else, from the start, by it. */
            if (s[i] == '"') {
                while (q < n && str_plain[s[q]])
                    q++;
                if (q < n && s[q] == '"') {
                    v->kind = PROTO__STRING;
                    v->high = false;
                    v->s = (const char *)s + i + 1;
                    v->len = q - i - 1;
                    i = q + 1;
                    goto next;
                }
            } else if (s[i] >= '1' && s[i] <= '9') {
                uint64_t u = (unsigned)(s[i] - '0');
                for (; q < n && proto__is_digit(s[q]) && q - i < 16; q++)
                    u = u * 10 + (unsigned)(s[q] - '0');
                if (q - i <= 15 && (q >= n || (s[q] != '.' && s[q] != 'e' && s[q] != 'E' &&
                                               !proto__is_digit(s[q])))) {
                    v->kind = PROTO__INT;
                    v->v = (int64_t)u;
                    i = q;
                    goto next;
                }
            }
            j->i = i;
            if (flat_value(j, k, v, t) != 0)
                return -1;
        } else {
            j->i = i;
            if (flat_skip(j) != 0)
                return -1;
        }
        i = j->i;
    next:
        if (i < n && s[i] != ',' && s[i] != '}')
            i = flat_ws(s, i, n);
        if (i >= n)
            return -1;
        if (s[i] == '}')
            break;
        if (s[i] != ',')
            return -1;
        i++;
    }
    return flat_ws(s, i + 1, n) == n ? 0 : -1;
}

int proto__flat_read(const char *line, size_t len, proto__value_t *f, proto__flat_ints_t *t)
{
    proto__scan_t j = {.s = (const unsigned char *)line, .n = len};

    for (int k = 0; k < PROTO_FIELD__COUNT; k++)
        f[k].kind = PROTO__ABSENT;
    t->v = t->local;
    t->n = 0;
    t->cap = PROTO__FLAT_LOCAL_INTS;
    if (flat_scan(&j, f, t) != 0)
        return -1;
    /* Arrays point into t->local, which stays put; only memory that
     * replaced it may have moved since. */
    if (t->v != t->local) {
        for (int k = 0; k < PROTO_FIELD__COUNT; k++) {
            if (f[k].kind == PROTO__INTS)
                f[k].ints = t->v + f[k].v;
        }
    }
    return 0;
}
