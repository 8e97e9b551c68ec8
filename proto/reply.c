/*
 * reply.c: the proto_reply_*() writers, which append one JSON reply line to
 * a proto_buf_t, and the JSON string and number formatting they share.
 *
 * Replies are on the hot path (a step reply of an attn model carries V
 * logits per step), so they are written directly, without building a tree.
 * Every writer either appends one whole line ending "\n" or, when memory
 * runs out, leaves the buffer exactly as it found it: a partial line never
 * reaches a client.  A tag, when given, is the first member.
 *
 * Logits are printed as printf("%.6f") prints them, by proto__fmt6(): for
 * |v| < 1e9 it rounds v * 10^6 to an integer exactly (near a halfway point
 * the product's rounding error is recovered with fma(), and halfway cases
 * go to even, as glibc's printf does under the default rounding mode), then
 * writes the digits; it falls back to snprintf() beyond that.  "%.6f" of an
 * infinity or a NaN is not JSON, so such a value is written as null.
 */
#include "proto/proto_int.h"

#include <assert.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* In a proto_reply_*() writer, which keeps where its line starts in
 * `start`: appends with `expr`, or when that runs out of memory, puts the
 * buffer back as it was at `start` and returns SLOTD_ENOMEM. */
#define TRY(expr)                                                                                  \
    do {                                                                                           \
        if ((expr) != SLOTD_OK) {                                                                  \
            b->len = start;                                                                        \
            return SLOTD_ENOMEM;                                                                   \
        }                                                                                          \
    } while (0)

#define PUT_LIT(b, lit) put_bytes((b), (lit), sizeof(lit) - 1)

/* A member of a reply: `key`, a literal with its quotes, colon and any comma
 * before it, then the value put_value(b, ...) writes. */
#define PUT_MEMBER(b, key, put_value, ...)                                                         \
    (PUT_LIT(b, key) != SLOTD_OK ? SLOTD_ENOMEM : put_value((b), __VA_ARGS__))

/* Longest fast-path "%.6f" text: "-1000000000.000000". */
#define FMT6_FAST_MAX 18

/* Makes room for `n` more bytes; inline for the common case of room. */
static inline int room(proto_buf_t *b, size_t n)
{
    return n <= b->cap - b->len ? SLOTD_OK : proto_buf_reserve(b, n);
}

static inline int put_bytes(proto_buf_t *b, const char *s, size_t n)
{
    if (room(b, n) != SLOTD_OK)
        return SLOTD_ENOMEM;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    return SLOTD_OK;
}

static const char digit_pairs[201] = "00010203040506070809"
                                     "10111213141516171819"
                                     "20212223242526272829"
                                     "30313233343536373839"
                                     "40414243444546474849"
                                     "50515253545556575859"
                                     "60616263646566676869"
                                     "70717273747576777879"
                                     "80818283848586878889"
                                     "90919293949596979899";

/* Writes the decimal digits of `v` >= 100 to `out` (room for 20) and
 * returns how many. */
static size_t fmt_u64_long(char *out, uint64_t v)
{
    char tmp[20];
    size_t i = sizeof(tmp);

    while (v >= 100) {
        unsigned d = (unsigned)(v % 100) * 2;
        v /= 100;
        tmp[--i] = digit_pairs[d + 1];
        tmp[--i] = digit_pairs[d];
    }
    if (v >= 10) {
        unsigned d = (unsigned)v * 2;
        tmp[--i] = digit_pairs[d + 1];
        tmp[--i] = digit_pairs[d];
    } else {
        tmp[--i] = (char)('0' + v);
    }
    memcpy(out, tmp + i, sizeof(tmp) - i);
    return sizeof(tmp) - i;
}

/* Writes the decimal digits of `v` to `out` (room for 20) and returns how
 * many.  Tokens, counts and the integer parts of logits are mostly below
 * 100: those are written here, inline. */
static inline size_t fmt_u64(char *out, uint64_t v)
{
    if (v < 10) {
        out[0] = (char)('0' + v);
        return 1;
    }
    if (v < 100) {
        memcpy(out, digit_pairs + v * 2, 2);
        return 2;
    }
    return fmt_u64_long(out, v);
}

/* fmt6_fast()'s rounding of a * 10^6 when the product p is within 1/4 of
 * a halfway point k + 1/2 (d = (p - k) - 1/2, exact there): the product's
 * error, recovered with fma() (10^6 is a double, and the error of one
 * product is one too), decides.  The rounded sum has the sign of the exact
 * one, and is zero only when that is: d > 0 means round up, d == 0 an exact
 * halfway case, which goes to even.  Kept out of line: it is rare, and the
 * call would make every value pay for saving registers. */
static __attribute__((noinline)) uint64_t round_near_half(double a, double p, double d, uint64_t k)
{
    d += fma(a, 1e6, -p);
    return d > 0 || (d == 0 && (k & 1) != 0) ? k + 1 : k;
}

/* "%.6f" of a finite v with |v| < 1e9: at most FMT6_FAST_MAX bytes, not
 * NUL-terminated.  Returns the length.  Always inlined: a call per logit
 * costs as much as a third of the formatting. */
static inline __attribute__((always_inline)) size_t fmt6_fast(char *out, double v)
{
    double a = fabs(v), p, fl, d;
    uint64_t k, q, t;
    uint32_t frac;
    char *o = out;

    /* k = a * 10^6 rounded to an integer, halfway cases to even.  p is the
     * product rounded, k its floor (0 <= p < 2^50) and d = (p - fl) - 0.5:
     * p - fl is exact, and so is d when p >= 1/4 (p's ulp is at most 1/8);
     * below 1/4, d is at most -1/4 whatever its rounding.  The product's
     * rounding error err (a * 10^6 == p + err) is at most half of p's ulp,
     * 1/16, so when |d| > 1/4 the sign of d alone says which way to round.
     * That is nearly every value, and the models' logits, already rounded
     * to six decimals, always: they sit next to an integer.  Otherwise
     * round_near_half() decides. */
    p = a * 1e6;
    k = (uint64_t)(int64_t)p; /* the signed conversions are single instructions */
    fl = (double)(int64_t)k;
    d = (p - fl) - 0.5;
    if (d > 0.25) {
        k++;
    } else if (d >= -0.25) {
        k = round_near_half(a, p, d, k);
    }

    if (signbit(v))
        *o++ = '-';
    q = k / 1000000;
    frac = (uint32_t)(k - q * 1000000);
    o += fmt_u64(o, q);
    /* The six decimals, two at a time: t / 2^32 is frac / 10^4 in fixed
     * point (429497 is 2^32 / 10^4 rounded up; the excess stays below
     * 10^-4 over frac < 10^6, so no digit is ever off), and each * 100
     * moves the next two digits above the point. */
    t = (uint64_t)frac * 429497u;
    o[0] = '.';
    memcpy(o + 1, digit_pairs + (t >> 32) * 2, 2);
    t = (t & 0xffffffffu) * 100;
    memcpy(o + 3, digit_pairs + (t >> 32) * 2, 2);
    t = (t & 0xffffffffu) * 100;
    memcpy(o + 5, digit_pairs + (t >> 32) * 2, 2);
    return (size_t)(o + 7 - out);
}

size_t proto__fmt6(char *out, double v)
{
    size_t n;

    if (!(fabs(v) < 1e9))
        return (size_t)snprintf(out, PROTO__FMT6_MAX, "%.6f", v);
    n = fmt6_fast(out, v);
    out[n] = '\0';
    return n;
}

int proto__put_json_string(proto_buf_t *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    size_t need = 2, i, k;
    char *o;

    /* Most strings (ids, model names, most messages) need no escape: one
     * pass copies them, and the first byte that would need care sends the
     * string to the general path below, which writes over what this pass
     * left past b->len (it needs at least this room too). */
    if (room(b, n + 2) != SLOTD_OK)
        return SLOTD_ENOMEM;
    o = b->data + b->len + 1;
    for (i = 0; i < n; i++) {
        unsigned char c = u[i];
        if (c < 0x20 || c >= 0x80 || c == '"' || c == '\\')
            break;
        o[i] = (char)c;
    }
    if (i == n) {
        o[-1] = '"';
        o[n] = '"';
        b->len += n + 2;
        return SLOTD_OK;
    }

    /* First the exact length, then one reservation and the bytes. */
    for (i = 0; i < n; i += k) {
        unsigned char c = u[i];
        k = 1;
        if (c == '"' || c == '\\')
            need += 2;
        else if (c < 0x20)
            need += (c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t') ? 2 : 6;
        else if (c < 0x80)
            need += 1;
        else if ((k = proto__utf8_seq(u + i, n - i)) != 0)
            need += k;
        else
            need += 6, k = 1;
    }
    if (room(b, need) != SLOTD_OK)
        return SLOTD_ENOMEM;

    o = b->data + b->len;
    *o++ = '"';
    for (i = 0; i < n; i += k) {
        unsigned char c = u[i];
        k = 1;
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
            *o++ = (char)c;
            continue;
        }
        if (c >= 0x80) {
            if ((k = proto__utf8_seq(u + i, n - i)) != 0) {
                memcpy(o, u + i, k);
                o += k;
            } else {
                memcpy(o, "\\ufffd", 6);
                o += 6;
                k = 1;
            }
            continue;
        }
        *o++ = '\\';
        switch (c) {
        case '"':
        case '\\':
            *o++ = (char)c;
            break;
        case '\b':
            *o++ = 'b';
            break;
        case '\f':
            *o++ = 'f';
            break;
        case '\n':
            *o++ = 'n';
            break;
        case '\r':
            *o++ = 'r';
            break;
        case '\t':
            *o++ = 't';
            break;
        default:
            memcpy(o, "u00", 3);
            o[3] = hex[c >> 4];
            o[4] = hex[c & 15];
            o += 5;
            break;
        }
    }
    *o++ = '"';
    assert((size_t)(o - (b->data + b->len)) == need);
    b->len += need;
    return SLOTD_OK;
}

char *proto__json_string_text(const char *s, size_t n)
{
    proto_buf_t b;
    char *t;

    proto_buf_init(&b);
    if (proto__put_json_string(&b, s, n) != SLOTD_OK || proto_buf_append(&b, "", 1) != SLOTD_OK) {
        proto_buf_free(&b);
        return NULL;
    }
    /* Keep only what the text needs: a request's tag is held until it is
     * answered. */
    t = proto__realloc(b.data, b.len);
    return t != NULL ? t : b.data;
}

static int put_str(proto_buf_t *b, const char *s)
{
    return proto__put_json_string(b, s, strlen(s));
}

static int put_u64(proto_buf_t *b, uint64_t v)
{
    if (room(b, 20) != SLOTD_OK)
        return SLOTD_ENOMEM;
    b->len += fmt_u64(b->data + b->len, v);
    return SLOTD_OK;
}

/* A value off the fast path: large, infinite or NaN. */
static int put_f6_slow(proto_buf_t *b, double v)
{
    char *o;
    size_t n, w = 0;
    bool point = false;

    if (!isfinite(v))
        return PUT_LIT(b, "null");
    if (room(b, PROTO__FMT6_MAX) != SLOTD_OK)
        return SLOTD_ENOMEM;
    o = b->data + b->len;
    n = proto__fmt6(o, v);
    /* snprintf() writes the locale's decimal point, which may not be '.'
     * (nor one byte); JSON's is '.'. */
    for (size_t i = 0; i < n; i++) {
        if (o[i] == '-' || (o[i] >= '0' && o[i] <= '9')) {
            o[w++] = o[i];
        } else if (!point) {
            o[w++] = '.';
            point = true;
        }
    }
    b->len += w;
    return SLOTD_OK;
}

/* "[v0,v1,...]": room for the whole row at once, unless a value is off the
 * fast path. */
static int put_f6_row(proto_buf_t *b, const double *v, uint32_t n)
{
    char *o;

    if (room(b, 2 + (size_t)n * (FMT6_FAST_MAX + 1)) != SLOTD_OK)
        return SLOTD_ENOMEM;
    o = b->data + b->len;
    *o++ = '[';
    for (uint32_t i = 0; i < n; i++) {
        if (i > 0)
            *o++ = ',';
        if (fabs(v[i]) < 1e9) {
            o += fmt6_fast(o, v[i]);
            continue;
        }
        b->len = (size_t)(o - b->data);
        if (put_f6_slow(b, v[i]) != SLOTD_OK ||
            room(b, 1 + (size_t)(n - i - 1) * (FMT6_FAST_MAX + 1)) != SLOTD_OK)
            return SLOTD_ENOMEM;
        o = b->data + b->len;
    }
    *o++ = ']';
    b->len = (size_t)(o - b->data);
    return SLOTD_OK;
}

/* "[[row0],[row1],...]": `rows` rows of `vocab` values. */
static int put_f6_rows(proto_buf_t *b, const double *v, uint64_t rows, uint32_t vocab)
{
    if (PUT_LIT(b, "[") != SLOTD_OK)
        return SLOTD_ENOMEM;
    for (uint64_t r = 0; r < rows; r++) {
        if ((r > 0 && PUT_LIT(b, ",") != SLOTD_OK) ||
            put_f6_row(b, v + r * vocab, vocab) != SLOTD_OK)
            return SLOTD_ENOMEM;
    }
    return PUT_LIT(b, "]");
}

/* "[t0,t1,...]" */
static int put_u32_array(proto_buf_t *b, const uint32_t *v, size_t n)
{
    char *o;

    if (n > ((size_t)PTRDIFF_MAX - 2) / 11 || room(b, 2 + n * 11) != SLOTD_OK)
        return SLOTD_ENOMEM;
    o = b->data + b->len;
    *o++ = '[';
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            *o++ = ',';
        o += fmt_u64(o, v[i]);
    }
    *o++ = ']';
    b->len = (size_t)(o - b->data);
    return SLOTD_OK;
}

/* "{" and, with a tag, "\"tag\":<tag>,". */
static int put_open(proto_buf_t *b, const char *tag)
{
    if (PUT_LIT(b, "{") != SLOTD_OK)
        return SLOTD_ENOMEM;
    if (tag == NULL)
        return SLOTD_OK;
    if (PUT_LIT(b, "\"tag\":") != SLOTD_OK || put_bytes(b, tag, strlen(tag)) != SLOTD_OK)
        return SLOTD_ENOMEM;
    return PUT_LIT(b, ",");
}

/* Ends the reply line begun at `start` with "}\n", or when that does not
 * fit, puts the buffer back as it was at `start`. */
static int put_close(proto_buf_t *b, size_t start)
{
    if (PUT_LIT(b, "}\n") == SLOTD_OK)
        return SLOTD_OK;
    b->len = start;
    return SLOTD_ENOMEM;
}

int proto_reply_error(proto_buf_t *b, const char *tag, const slotd_error_t *err)
{
    size_t start = b->len;

    TRY(put_open(b, tag));
    TRY(PUT_MEMBER(b, "\"error\":{\"code\":", put_str, slotd_err_name(err->code)));
    TRY(PUT_MEMBER(b, ",\"message\":", proto__put_json_string, err->message,
                   strnlen(err->message, sizeof(err->message))));
    TRY(PUT_LIT(b, "}"));
    return put_close(b, start);
}

int proto_reply_start(proto_buf_t *b, const char *tag, const char *id, const char *model,
                      uint32_t entries, uint32_t cached)
{
    size_t start = b->len;

    TRY(put_open(b, tag));
    TRY(PUT_MEMBER(b, "\"id\":", put_str, id));
    TRY(PUT_MEMBER(b, ",\"model\":", put_str, model));
    TRY(PUT_MEMBER(b, ",\"entries\":", put_u64, entries));
    TRY(PUT_MEMBER(b, ",\"cached\":", put_u64, cached));
    return put_close(b, start);
}

int proto_reply_step(proto_buf_t *b, const char *tag, const char *id, const uint32_t *tokens,
                     uint32_t n, const double *logits, uint32_t vocab, uint32_t entries)
{
    size_t start = b->len;

    TRY(put_open(b, tag));
    TRY(PUT_MEMBER(b, "\"id\":", put_str, id));
    TRY(PUT_MEMBER(b, ",\"tokens\":", put_u32_array, tokens, n));
    if (logits != NULL)
        TRY(PUT_MEMBER(b, ",\"logits\":", put_f6_rows, logits, n, vocab));
    TRY(PUT_MEMBER(b, ",\"entries\":", put_u64, entries));
    return put_close(b, start);
}

int proto_reply_append(proto_buf_t *b, const char *tag, const char *id, uint32_t entries,
                       uint32_t cached)
{
    size_t start = b->len;

    TRY(put_open(b, tag));
    TRY(PUT_MEMBER(b, "\"id\":", put_str, id));
    TRY(PUT_MEMBER(b, ",\"entries\":", put_u64, entries));
    TRY(PUT_MEMBER(b, ",\"cached\":", put_u64, cached));
    return put_close(b, start);
}

int proto_reply_fork(proto_buf_t *b, const char *tag, const char *id, const char *model,
                     uint32_t entries, uint32_t cached)
{
    size_t start = b->len;

    TRY(put_open(b, tag));
    TRY(PUT_MEMBER(b, "\"id\":", put_str, id));
    TRY(PUT_MEMBER(b, ",\"model\":", put_str, model));
    TRY(PUT_MEMBER(b, ",\"entries\":", put_u64, entries));
    TRY(PUT_MEMBER(b, ",\"cached\":", put_u64, cached));
    return put_close(b, start);
}

int proto_reply_finish(proto_buf_t *b, const char *tag, const char *id, uint32_t released)
{
    size_t start = b->len;

    TRY(put_open(b, tag));
    TRY(PUT_MEMBER(b, "\"id\":", put_str, id));
    TRY(PUT_MEMBER(b, ",\"released\":", put_u64, released));
    return put_close(b, start);
}

int proto_reply_logits(proto_buf_t *b, const char *tag, const double *logits, uint32_t vocab,
                       uint64_t rows)
{
    size_t start = b->len;

    assert(logits != NULL || vocab == 0);
    TRY(put_open(b, tag));
    TRY(PUT_MEMBER(b, "\"logits\":", put_f6_row, logits, logits != NULL ? vocab : 0));
    TRY(PUT_MEMBER(b, ",\"rows\":", put_u64, rows));
    return put_close(b, start);
}

int proto_reply_generate(proto_buf_t *b, const char *tag, const uint32_t *tokens, size_t ntokens,
                         const double *logits, uint64_t steps, uint32_t vocab, uint64_t rows)
{
    size_t start = b->len;

    assert(logits != NULL || steps == 0 || vocab == 0);
    TRY(put_open(b, tag));
    TRY(PUT_MEMBER(b, "\"tokens\":", put_u32_array, tokens, ntokens));
    TRY(PUT_MEMBER(b, ",\"logits\":", put_f6_rows, logits, logits != NULL ? steps : 0, vocab));
    TRY(PUT_MEMBER(b, ",\"rows\":", put_u64, rows));
    return put_close(b, start);
}

/* "[[[t,s],[t,s],...],...]": for each of `rows` picks, its k pairs of a
 * token and its score in that pick's row of `v`. */
static int put_top_rows(proto_buf_t *b, const double *v, uint64_t rows, uint32_t vocab,
                        const uint32_t *top, uint32_t k)
{
    if (PUT_LIT(b, "[") != SLOTD_OK)
        return SLOTD_ENOMEM;
    for (uint64_t r = 0; r < rows; r++) {
        if (put_bytes(b, &",["[r == 0], 2 - (r == 0)) != SLOTD_OK)
            return SLOTD_ENOMEM;
        for (uint32_t i = 0; i < k; i++) {
            const uint32_t t = top[r * k + i];
            if (put_bytes(b, &",["[i == 0], 2 - (i == 0)) != SLOTD_OK ||
                put_u64(b, t) != SLOTD_OK || PUT_LIT(b, ",") != SLOTD_OK ||
                room(b, FMT6_FAST_MAX) != SLOTD_OK)
                return SLOTD_ENOMEM;
            if (fabs(v[r * vocab + t]) < 1e9)
                b->len += fmt6_fast(b->data + b->len, v[r * vocab + t]);
            else if (put_f6_slow(b, v[r * vocab + t]) != SLOTD_OK)
                return SLOTD_ENOMEM;
            if (PUT_LIT(b, "]") != SLOTD_OK)
                return SLOTD_ENOMEM;
        }
        if (PUT_LIT(b, "]") != SLOTD_OK)
            return SLOTD_ENOMEM;
    }
    return PUT_LIT(b, "]");
}

/* The scores of `rows` picks under `pk` (with the comma before them),
 * then "stopped" when asked for. */
static int put_picks(proto_buf_t *b, const double *logits, uint64_t rows, uint32_t vocab,
                     const proto_picks_t *pk)
{
    if (logits != NULL) {
        switch (pk->scores) {
        case PROTO_SCORES_ALL:
            if (PUT_MEMBER(b, ",\"logits\":", put_f6_rows, logits, rows, vocab) != SLOTD_OK)
                return SLOTD_ENOMEM;
            break;
        case PROTO_SCORES_NONE:
            break;
        case PROTO_SCORES_TOP:
            if (PUT_MEMBER(b, ",\"top\":", put_top_rows, logits, rows, vocab, pk->top, pk->k) !=
                SLOTD_OK)
                return SLOTD_ENOMEM;
            break;
        }
    }
    if (!pk->has_stop)
        return SLOTD_OK;
    return pk->stopped ? PUT_LIT(b, ",\"stopped\":true") : PUT_LIT(b, ",\"stopped\":false");
}

int proto_reply_step_picks(proto_buf_t *b, const char *tag, const char *id, const uint32_t *tokens,
                           uint32_t n, const double *logits, uint32_t vocab, uint32_t entries,
                           const proto_picks_t *pk)
{
    size_t start = b->len;

    if (pk == NULL)
        return proto_reply_step(b, tag, id, tokens, n, logits, vocab, entries);
    TRY(put_open(b, tag));
    TRY(PUT_MEMBER(b, "\"id\":", put_str, id));
    TRY(PUT_MEMBER(b, ",\"tokens\":", put_u32_array, tokens, n));
    TRY(put_picks(b, logits, n, vocab, pk));
    TRY(PUT_MEMBER(b, ",\"entries\":", put_u64, entries));
    return put_close(b, start);
}

int proto_reply_generate_picks(proto_buf_t *b, const char *tag, const uint32_t *tokens,
                               size_t ntokens, const double *logits, uint64_t steps, uint32_t vocab,
                               uint64_t rows, const proto_picks_t *pk)
{
    size_t start = b->len;

    if (pk == NULL)
        return proto_reply_generate(b, tag, tokens, ntokens, logits, steps, vocab, rows);
    assert(logits != NULL || steps == 0 || vocab == 0 || pk->scores == PROTO_SCORES_NONE);
    TRY(put_open(b, tag));
    TRY(PUT_MEMBER(b, "\"tokens\":", put_u32_array, tokens, ntokens));
    if (logits == NULL && pk->scores == PROTO_SCORES_ALL)
        TRY(PUT_LIT(b, ",\"logits\":[]")); /* as proto_reply_generate() of no steps */
    TRY(put_picks(b, logits, steps, vocab, pk));
    TRY(PUT_MEMBER(b, ",\"rows\":", put_u64, rows));
    return put_close(b, start);
}

int proto_reply_stats(proto_buf_t *b, const char *tag, const proto_stats_t *st)
{
    return proto_reply_stats_tenant(b, tag, st, NULL);
}

int proto_reply_stats_tenant(proto_buf_t *b, const char *tag, const proto_stats_t *st,
                             const char *tenant)
{
    const struct {
        const char *key; /* with its quotes, colon and any comma before it */
        size_t len;
        uint64_t value;
    } members[] = {
#define M(key, value) {key, sizeof(key) - 1, (value)}
        M("\"cache_entries\":", st->cache_entries),
        M(",\"live_sessions\":", st->live_sessions),
        M(",\"g_calls\":", st->g_calls),
        M(",\"rows\":", st->rows),
        M(",\"connections\":", st->connections),
        M(",\"requests_total\":", st->requests_total),
        M(",\"errors_total\":", st->errors_total),
        M(",\"pool_bytes_total\":", st->pool_bytes_total),
        M(",\"pool_bytes_used\":", st->pool_bytes_used),
        M(",\"pool_slots_total\":", st->pool_slots_total),
        M(",\"pool_slots_used\":", st->pool_slots_used),
        M(",\"released\":{\"finish\":", st->released_finish),
        M(",\"disconnect\":", st->released_disconnect),
        M(",\"idle\":", st->released_idle),
        M(",\"shutdown\":", st->released_shutdown),
        M("},\"uptime_seconds\":", st->uptime_seconds),
        M(",\"threads\":", st->threads),
        M(",\"evicted_sessions\":", st->evicted_sessions),
        M(",\"evictions_total\":", st->evictions_total),
        M(",\"rebuilt_entries_total\":", st->rebuilt_entries_total),
        M(",\"prefix_cache\":{\"entries\":", st->prefix_entries),
        M(",\"hit_entries\":", st->prefix_hit_entries),
        M(",\"query_entries\":", st->prefix_query_entries),
        M(",\"evicted_entries\":", st->prefix_evicted_entries),
#undef M
    };
    size_t start = b->len;

    TRY(put_open(b, tag));
    for (size_t i = 0; i < sizeof(members) / sizeof(members[0]); i++) {
        TRY(put_bytes(b, members[i].key, members[i].len));
        TRY(put_u64(b, members[i].value));
    }
    TRY(PUT_LIT(b, "}")); /* prefix_cache */
    if (tenant != NULL) {
        TRY(PUT_LIT(b, ",\"tenant\":"));
        TRY(put_str(b, tenant));
    }
    return put_close(b, start);
}

int proto_reply_auth(proto_buf_t *b, const char *tag)
{
    return proto_reply_auth_tenant(b, tag, NULL);
}

int proto_reply_auth_tenant(proto_buf_t *b, const char *tag, const char *tenant)
{
    size_t start = b->len;

    TRY(put_open(b, tag));
    TRY(PUT_LIT(b, "\"ok\":true"));
    if (tenant != NULL) {
        TRY(PUT_LIT(b, ",\"tenant\":"));
        TRY(put_str(b, tenant));
    }
    return put_close(b, start);
}
