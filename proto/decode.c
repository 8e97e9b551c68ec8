/*
 * decode.c: the values of the decoding controls, `sample`, `stop` and
 * `scores` (proto_decode_t), read from their JSON text.  Both request
 * paths hand rules.c the text of such a value (a span of the line), not a
 * tree: a seed up to 2^64 - 1 and a temperature such as 0.7 must be read
 * exactly, and the tree path's copy of the line replaces such literals
 * (scan_int.h).  The line has passed the syntax check (scan_int.h) by then, so
 * the readers here only walk it.  Numbers: a real is strtod()'s reading
 * of the literal; an integer is exact, any literal with an integral value
 * (1, 1.0, 1e2), as everywhere in the protocol.
 *
 * Pure functions of their arguments: any thread, no lock, no allocation.
 *
 * Design: docs/design.md, "Parsing a request line"; the wire:
 * docs/protocol.md, "Decoding controls".
 */
#include "proto/scan_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* The longest number literal read as a real; longer ones are refused. */
#define DEC_REAL_MAX 400

/* A walk over a syntax-checked value. */
typedef struct dec {
    const unsigned char *s;
    size_t n, i;
} dec_t;

static void dec_ws(dec_t *d)
{
    while (d->i < d->n &&
           (d->s[d->i] == ' ' || d->s[d->i] == '\t' || d->s[d->i] == '\n' || d->s[d->i] == '\r'))
        d->i++;
}

static unsigned dec_hex4(const unsigned char *p)
{
    unsigned v = 0;

    for (int k = 0; k < 4; k++) {
        unsigned char c = p[k];
        v = v * 16 + (unsigned)(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
}

/* At a string's opening quote: its first `cap` unescaped bytes into `out`
 * (a character beyond ASCII becomes 0xFF: no name here has one), its
 * length in *len (cap + 1 when longer); d->i past the closing quote. */
static void dec_string(dec_t *d, char *out, size_t cap, size_t *len)
{
    size_t o = 0;

    d->i++;
    while (d->i < d->n && d->s[d->i] != '"') {
        unsigned char c = d->s[d->i++];
        if (c == '\\') {
            c = d->s[d->i++];
            switch (c) {
            case 'b':
                c = '\b';
                break;
            case 'f':
                c = '\f';
                break;
            case 'n':
                c = '\n';
                break;
            case 'r':
                c = '\r';
                break;
            case 't':
                c = '\t';
                break;
            case 'u': {
                unsigned u = dec_hex4(d->s + d->i);
                d->i += 4;
                if (u >= 0xD800 && u <= 0xDBFF)
                    d->i += 6; /* its low half (the syntax check saw the pair) */
                c = u < 0x80 ? (unsigned char)u : 0xFF;
                break;
            }
            default:
                break; /* '"', '\\', '/' stand for themselves */
            }
        } else if (c >= 0x80) {
            while (d->i < d->n && (d->s[d->i] & 0xC0) == 0x80)
                d->i++;
            c = 0xFF;
        }
        if (o < cap)
            out[o] = (char)c;
        o += o <= cap;
    }
    d->i++;
    *len = o;
}

/* At '-' or a digit: the literal's extent [*b, d->i). */
static void dec_number(dec_t *d, size_t *b)
{
    *b = d->i;
    while (d->i < d->n && (proto__is_digit(d->s[d->i]) || d->s[d->i] == '-' || d->s[d->i] == '+' ||
                           d->s[d->i] == '.' || d->s[d->i] == 'e' || d->s[d->i] == 'E'))
        d->i++;
}

/* The integer a number literal's `n` bytes at `p` stand for: 0 with *out
 * set; -1 if its value is not an integer; -2 if it is one but negative
 * (not zero) or above 2^64 - 1, *neg telling which. */
static int dec_uint(const unsigned char *p, size_t n, uint64_t *out, bool *neg)
{
    size_t i = 0, ib, ie, fb = 0, fe = 0, nd, first, keep;
    int64_t e = 0, shift;
    uint64_t v = 0;
    bool eneg = false;

    *neg = n > 0 && p[0] == '-';
    i = *neg;
    ib = i;
    while (i < n && proto__is_digit(p[i]))
        i++;
    ie = i;
    if (i < n && p[i] == '.') {
        fb = ++i;
        while (i < n && proto__is_digit(p[i]))
            i++;
        fe = i;
    }
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        i++;
        if (i < n && (p[i] == '+' || p[i] == '-'))
            eneg = p[i++] == '-';
        for (; i < n && proto__is_digit(p[i]); i++)
            if (e < 100000)
                e = e * 10 + (p[i] - '0');
        if (eneg)
            e = -e;
    }
    /* The digits, integer part then fraction, as one string D: the value
     * is D * 10^shift. */
    nd = (ie - ib) + (fe - fb);
    shift = e - (int64_t)(fe - fb);
#define DIGIT(k) ((k) < ie - ib ? p[ib + (k)] : p[fb + (k) - (ie - ib)])
    for (first = 0; first < nd && DIGIT(first) == '0'; first++)
        ;
    if (first == nd) { /* zero, -0 included */
        *out = 0;
        *neg = false;
        return 0;
    }
    keep = nd;
    if (shift < 0) {
        /* The last -shift digits must be zeros. */
        if ((uint64_t)-shift > nd - first) {
            return -1;
        }
        keep = nd - (size_t)-shift;
        for (size_t k = keep; k < nd; k++)
            if (DIGIT(k) != '0')
                return -1;
        shift = 0;
    }
    if (*neg)
        return -2;
    if ((int64_t)(keep - first) + shift > 20)
        return -2;
    for (size_t k = first; k < keep; k++) {
        unsigned dg = (unsigned)(DIGIT(k) - '0');
        if (v > (UINT64_MAX - dg) / 10)
            return -2;
        v = v * 10 + dg;
    }
    for (; shift > 0; shift--) {
        if (v > UINT64_MAX / 10)
            return -2;
        v *= 10;
    }
#undef DIGIT
    *out = v;
    return 0;
}

/* A number literal's `n` bytes at `p` as strtod() reads them (the line
 * is UTF-8 JSON, so the C locale's '.' is its decimal point); false for
 * one too long to copy. */
static bool dec_real(const unsigned char *p, size_t n, double *out)
{
    char buf[DEC_REAL_MAX + 1];

    if (n > DEC_REAL_MAX)
        return false;
    memcpy(buf, p, n);
    buf[n] = '\0';
    *out = strtod(buf, NULL);
    return true;
}

static bool dec_is_number(const dec_t *d)
{
    return d->i < d->n && (d->s[d->i] == '-' || proto__is_digit(d->s[d->i]));
}

/* Skips the value at d->i (checked already). */
static void dec_skip(dec_t *d)
{
    proto__scan_t j = {.s = d->s, .n = d->n, .i = d->i};
    int rc = proto__scan_value(&j, 1);

    (void)rc;
    d->i = j.i;
}

/* One member of `sample`, its name `name` (len bytes), its value at d->i:
 * NULL, or the words of its error. */
static const char *sample_member(dec_t *d, const char *name, size_t len, unsigned *seen,
                                 proto_decode_t *dec)
{
    static const char *const names[4] = {"temperature", "top_k", "top_p", "seed"};
    static const char *const words[4] = {"temperature must be a number >= 0",
                                         "top_k must be an integer >= 1",
                                         "top_p must be a number in (0, 1]",
                                         "seed must be an integer from 0 to 18446744073709551615"};
    unsigned k = 0;
    size_t b;
    uint64_t u;
    double x;
    bool neg;
    int rc;

    while (k < 4 && (strlen(names[k]) != len || memcmp(names[k], name, len) != 0))
        k++;
    if (k == 4 || (*seen & (1u << k))) { /* unknown, or a later duplicate */
        dec_skip(d);
        return NULL;
    }
    *seen |= 1u << k;
    if (!dec_is_number(d))
        return words[k];
    dec_number(d, &b);
    switch (k) {
    case 0:
    case 2:
        if (!dec_real(d->s + b, d->i - b, &x) || !isfinite(x))
            return words[k];
        if (k == 0 && !(x >= 0.0))
            return words[k];
        if (k == 2 && !(x > 0.0 && x <= 1.0))
            return words[k];
        if (k == 0)
            dec->temperature = x;
        else
            dec->top_p = x;
        return NULL;
    case 1:
        rc = dec_uint(d->s + b, d->i - b, &u, &neg);
        if (rc == -1 || (rc == -2 && neg) || (rc == 0 && u == 0))
            return words[k];
        dec->top_k = rc == 0 ? u : UINT64_MAX; /* past 2^64 - 1 cuts nothing either */
        return NULL;
    default:
        if (dec_uint(d->s + b, d->i - b, &u, &neg) != 0)
            return words[k];
        dec->seed = u;
        return NULL;
    }
}

static const char *read_sample(dec_t *d, const char *must, proto_decode_t *dec)
{
    unsigned seen = 0;

    dec->has_sample = true;
    if (d->s[d->i] != '{')
        return must;
    d->i++;
    dec_ws(d);
    if (d->s[d->i] == '}')
        return NULL;
    for (;;) {
        char name[16];
        size_t len;
        const char *why;

        dec_ws(d);
        dec_string(d, name, sizeof(name), &len);
        dec_ws(d);
        d->i++; /* ':' */
        dec_ws(d);
        if ((why = sample_member(d, name, len, &seen, dec)) != NULL)
            return why;
        dec_ws(d);
        if (d->s[d->i++] == '}')
            return NULL;
    }
}

static const char *read_stop_tokens(dec_t *d, const char *must, proto_decode_t *dec, char *words,
                                    size_t cap)
{
    size_t k = 0, b;
    uint64_t u;
    bool neg;
    int rc;

    dec->has_stop = true;
    if (d->s[d->i] != '[')
        return must;
    d->i++;
    dec_ws(d);
    if (d->s[d->i] == ']')
        return NULL;
    for (;; k++) {
        dec_ws(d);
        if (k == PROTO_STOP_MAX)
            return must;
        if (!dec_is_number(d)) {
            snprintf(words, cap, "%s (element %zu is not an integer)", must, k);
            return words;
        }
        dec_number(d, &b);
        rc = dec_uint(d->s + b, d->i - b, &u, &neg);
        if (rc == -1) {
            snprintf(words, cap, "%s (element %zu is not an integer)", must, k);
            return words;
        }
        if (rc != 0 || u > UINT32_MAX) {
            snprintf(words, cap, "%s (element %zu is not a token)", must, k);
            return words;
        }
        dec->stop[dec->nstop++] = (uint32_t)u;
        dec_ws(d);
        if (d->s[d->i++] == ']')
            return NULL;
    }
}

static const char *read_scores(dec_t *d, const char *must, proto_decode_t *dec)
{
    size_t b, len;
    uint64_t u;
    bool neg;
    int rc;

    if (d->s[d->i] == '"') {
        char word[8];
        dec_string(d, word, sizeof(word), &len);
        if (len == 3 && memcmp(word, "all", 3) == 0) {
            dec->scores = PROTO_SCORES_ALL;
            return NULL;
        }
        if (len == 4 && memcmp(word, "none", 4) == 0) {
            dec->scores = PROTO_SCORES_NONE;
            return NULL;
        }
        return must;
    }
    if (!dec_is_number(d))
        return must;
    dec_number(d, &b);
    rc = dec_uint(d->s + b, d->i - b, &u, &neg);
    if (rc == -1 || (rc == -2 && neg) || (rc == 0 && u == 0))
        return must;
    dec->scores = PROTO_SCORES_TOP;
    dec->top = rc == 0 ? u : UINT64_MAX;
    return NULL;
}

const char *proto__decode_read(proto_type_t type, const char *must, const char *s, size_t n,
                               proto_decode_t *dec, char *words, size_t cap)
{
    dec_t d = {.s = (const unsigned char *)s, .n = n, .i = 0};

    if (!dec->set) {
        dec->set = true;
        dec->temperature = 1.0;
        dec->top_p = 1.0;
        dec->top_k = UINT64_MAX;
    }
    switch (type) {
    case PROTO_TYPE_SAMPLE:
        return read_sample(&d, must, dec);
    case PROTO_TYPE_STOP:
        return read_stop_tokens(&d, must, dec, words, cap);
    case PROTO_TYPE_SCORES:
        return read_scores(&d, must, dec);
    case PROTO_TYPE_TAG:
    case PROTO_TYPE_OP:
    case PROTO_TYPE_NAME:
    case PROTO_TYPE_BYTES:
    case PROTO_TYPE_INTS:
    case PROTO_TYPE_INT:
    case PROTO_TYPE_BOOL:
        break;
    }
    return must;
}
