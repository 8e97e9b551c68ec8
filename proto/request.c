/*
 * request.c: proto_request_parse(), from one line to a validated request,
 * and the strict UTF-8 check it shares with the reply writers.
 *
 * A line goes through three stages, each of which can only reject it:
 *   1. a scan for NUL bytes and ill-formed UTF-8 (overlong forms, surrogates
 *      and code points above U+10FFFF are ill-formed), eight bytes at a time
 *      over ASCII;
 *   2. a strict RFC 8259 syntax check (json_scan_*), which also bounds the
 *      nesting depth, refuses "\u0000" and unpaired surrogate escapes, and
 *      counts the number literals that are not plain integers of at most 15
 *      digits;
 *   3. cJSON builds the tree, and the op and its fields are validated.
 *
 * cJSON alone is more lenient than JSON (it takes leading zeros, "1.",
 * control bytes as white space, raw control characters in strings, a
 * byte-order mark) and cannot apply the integer rule exactly: it reads a
 * number through a 63-byte buffer into a double, so a long literal fails
 * and 1.0000000000000001 or 9007199254740993 would pass as integers.  So a
 * line with any number literal that is not a plain short integer is parsed
 * from a copy in which each such literal is replaced by its exact value when
 * that is an integer within +-2^53, and by 0.5 when it is not.  Numbers are
 * only ever read as integers, so nothing else can tell the difference.
 *
 * A "\u0000" escape is refused as a NUL in the line: cJSON's strings are
 * NUL-terminated, so {"op\u0000":...} would otherwise read as "op".  Of
 * duplicate members the first counts (as cJSON's lookups do).
 */
#include "proto/proto__internal.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROTO_JSON_MAX_DEPTH 128
#define PROTO_INT_LIMIT 9007199254740992.0 /* 2^53 */
/* Longest replacement of a number literal ("-9007199254740992") less the
 * shortest literal that is replaced ("1.0", "1e5"), rounded up. */
#define PROTO_NUMBER_GROWTH 16

/* ---- Ops ---- */

static const char *const op_names[PROTO_OP__COUNT] = {
    [PROTO_OP_NONE] = "none",     [PROTO_OP_START] = "start",   [PROTO_OP_STEP] = "step",
    [PROTO_OP_FINISH] = "finish", [PROTO_OP_LOGITS] = "logits", [PROTO_OP_GENERATE] = "generate",
    [PROTO_OP_STATS] = "stats",
};

const char *proto_op_name(proto_op_t op)
{
    if ((unsigned)op >= PROTO_OP__COUNT)
        return "none";
    return op_names[op];
}

/* ---- UTF-8 ---- */

size_t proto__utf8_seq(const unsigned char *p, size_t n)
{
    unsigned char c = p[0], lo = 0x80, hi = 0xBF;

    if (c < 0x80)
        return 1;
    if (c < 0xC2)
        return 0;
    if (c < 0xE0)
        return n >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c < 0xF0) {
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
        return n >= 3 && p[1] >= lo && p[1] <= hi && (p[2] & 0xC0) == 0x80 ? 3 : 0;
    }
    if (c < 0xF5) {
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
        return n >= 4 && p[1] >= lo && p[1] <= hi && (p[2] & 0xC0) == 0x80 && (p[3] & 0xC0) == 0x80
                   ? 4
                   : 0;
    }
    return 0;
}

size_t proto__utf8_scan(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    const uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
    size_t i = 0, k;

    while (i < n) {
        if (n - i >= 8) {
            uint64_t w;
            memcpy(&w, u + i, 8);
            /* No byte with its high bit set, and no zero byte. */
            if (((w | ((w - ones) & ~w)) & highs) == 0) {
                i += 8;
                continue;
            }
        }
        if (u[i] == 0)
            return i;
        if ((k = proto__utf8_seq(u + i, n - i)) == 0)
            return i;
        i += k;
    }
    return n;
}

/* ---- Strict JSON syntax ---- */

typedef struct json_scan {
    const unsigned char *s;
    size_t n;
    size_t i;        /* the next byte to look at */
    size_t rewrites; /* number literals that the copy replaces */
    char *out;       /* when not NULL: the copy being written */
    size_t outlen;   /* bytes written to `out` */
    size_t copied;   /* bytes of `s` accounted for in `out` */
    const char *why; /* what was wrong, at byte `i` */
} json_scan_t;

static int json_scan_value(json_scan_t *j, int depth);

static int json_scan_fail(json_scan_t *j, const char *why)
{
    j->why = why;
    return -1;
}

static void json_scan_ws(json_scan_t *j)
{
    while (j->i < j->n) {
        unsigned char c = j->s[j->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        j->i++;
    }
}

static int json_scan_hex4(json_scan_t *j, unsigned *out)
{
    unsigned v = 0;

    if (j->n - j->i < 4)
        return json_scan_fail(j, "truncated \\u escape");
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
            return json_scan_fail(j, "bad hex digit in a \\u escape");
    }
    j->i += 4;
    *out = v;
    return 0;
}

/* At the opening quote. */
static int json_scan_string(json_scan_t *j)
{
    unsigned u, lo;

    j->i++;
    for (;;) {
        unsigned char c;
        while (j->i < j->n && (c = j->s[j->i]) >= 0x20 && c != '"' && c != '\\')
            j->i++;
        if (j->i >= j->n)
            return json_scan_fail(j, "unterminated string");
        c = j->s[j->i];
        if (c == '"') {
            j->i++;
            return 0;
        }
        if (c < 0x20)
            return json_scan_fail(j, "control character in a string");
        /* A backslash. */
        if (j->i + 1 >= j->n)
            return json_scan_fail(j, "unterminated string");
        c = j->s[j->i + 1];
        if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
            c == 't') {
            j->i += 2;
            continue;
        }
        if (c != 'u')
            return json_scan_fail(j, "invalid escape in a string");
        j->i += 2;
        if (json_scan_hex4(j, &u) != 0)
            return -1;
        if (u == 0)
            return json_scan_fail(j, "\\u0000 in a string");
        if (u >= 0xDC00 && u <= 0xDFFF)
            return json_scan_fail(j, "unpaired surrogate escape");
        if (u >= 0xD800 && u <= 0xDBFF) {
            if (j->n - j->i < 2 || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u')
                return json_scan_fail(j, "unpaired surrogate escape");
            j->i += 2;
            if (json_scan_hex4(j, &lo) != 0)
                return -1;
            if (lo < 0xDC00 || lo > 0xDFFF)
                return json_scan_fail(j, "unpaired surrogate escape");
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
static unsigned json_number_digit(const unsigned char *s, const json_number_t *nm, size_t k)
{
    size_t ni = nm->ie - nm->ib;

    return (unsigned)(k < ni ? s[nm->ib + k] : s[nm->fb + (k - ni)]) - '0';
}

/* Writes the replacement of a literal: its exact value if that is an integer
 * within +-2^53, else "0.5".  `out` has room for 24 bytes.  Returns the
 * length written. */
static size_t json_number_canon(const unsigned char *s, const json_number_t *nm, char *out)
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
    if (v > (uint64_t)PROTO_INT_LIMIT)
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

static bool json_is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static int json_scan_number(json_scan_t *j)
{
    json_number_t nm = {0};
    size_t start = j->i;
    bool plain = true;

    if (j->s[j->i] == '-') {
        nm.neg = true;
        j->i++;
    }
    if (j->i >= j->n || !json_is_digit(j->s[j->i]))
        return json_scan_fail(j, "invalid number");
    nm.ib = j->i;
    if (j->s[j->i] == '0')
        j->i++;
    else
        while (j->i < j->n && json_is_digit(j->s[j->i]))
            j->i++;
    nm.ie = j->i;
    if (j->i < j->n && j->s[j->i] == '.') {
        nm.fb = ++j->i;
        while (j->i < j->n && json_is_digit(j->s[j->i]))
            j->i++;
        nm.fe = j->i;
        if (nm.fe == nm.fb)
            return json_scan_fail(j, "invalid number");
        plain = false;
    }
    if (j->i < j->n && (j->s[j->i] == 'e' || j->s[j->i] == 'E')) {
        j->i++;
        if (j->i < j->n && (j->s[j->i] == '+' || j->s[j->i] == '-'))
            nm.eneg = j->s[j->i++] == '-';
        nm.eb = j->i;
        while (j->i < j->n && json_is_digit(j->s[j->i]))
            j->i++;
        nm.ee = j->i;
        if (nm.ee == nm.eb)
            return json_scan_fail(j, "invalid number");
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

static int json_scan_literal(json_scan_t *j, const char *word, size_t len)
{
    if (j->n - j->i < len || memcmp(j->s + j->i, word, len) != 0)
        return json_scan_fail(j, "unexpected character");
    j->i += len;
    return 0;
}

/* At '{' or '['. */
static int json_scan_container(json_scan_t *j, int depth)
{
    unsigned char close = j->s[j->i] == '{' ? '}' : ']';

    if (depth > PROTO_JSON_MAX_DEPTH)
        return json_scan_fail(j, "nested deeper than 128 levels");
    j->i++;
    json_scan_ws(j);
    if (j->i < j->n && j->s[j->i] == close) {
        j->i++;
        return 0;
    }
    for (;;) {
        if (close == '}') {
            json_scan_ws(j);
            if (j->i >= j->n || j->s[j->i] != '"')
                return json_scan_fail(j, "expected a member name");
            if (json_scan_string(j) != 0)
                return -1;
            json_scan_ws(j);
            if (j->i >= j->n || j->s[j->i] != ':')
                return json_scan_fail(j, "expected ':'");
            j->i++;
        }
        if (json_scan_value(j, depth) != 0)
            return -1;
        json_scan_ws(j);
        if (j->i >= j->n)
            return json_scan_fail(j, close == '}' ? "unterminated object" : "unterminated array");
        if (j->s[j->i] == close) {
            j->i++;
            return 0;
        }
        if (j->s[j->i] != ',')
            return json_scan_fail(j, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
        j->i++;
    }
}

static int json_scan_value(json_scan_t *j, int depth)
{
    json_scan_ws(j);
    if (j->i >= j->n)
        return json_scan_fail(j, "unexpected end of line");
    switch (j->s[j->i]) {
    case '{':
    case '[':
        return json_scan_container(j, depth + 1);
    case '"':
        return json_scan_string(j);
    case 't':
        return json_scan_literal(j, "true", 4);
    case 'f':
        return json_scan_literal(j, "false", 5);
    case 'n':
        return json_scan_literal(j, "null", 4);
    default:
        if (j->s[j->i] == '-' || json_is_digit(j->s[j->i]))
            return json_scan_number(j);
        return json_scan_fail(j, "unexpected character");
    }
}

/* Checks that the line is one JSON object and nothing else.  With j->out
 * set, also writes the copy with its number literals replaced. */
static int json_scan_line(json_scan_t *j, slotd_error_t *err)
{
    json_scan_ws(j);
    if (j->i >= j->n || j->s[j->i] != '{')
        return slotd_error_set(err, SLOTD_EBAD_JSON, "the line is not a JSON object");
    if (json_scan_value(j, 0) != 0)
        return slotd_error_set(err, SLOTD_EBAD_JSON, "the line is not valid JSON: %s at byte %zu",
                               j->why, j->i);
    json_scan_ws(j);
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

/* ---- Fields ---- */

enum {
    FIELD_TAG,
    FIELD_OP,
    FIELD_ID,
    FIELD_MODEL,
    FIELD_PROMPT,
    FIELD_TOKENS,
    FIELD_N,
    FIELD_STEPS,
    FIELD_USE_CACHE,
    FIELD__COUNT
};

static const char *const field_names[FIELD__COUNT] = {
    "tag", "op", "id", "model", "prompt", "tokens", "n", "steps", "use_cache",
};

/* A JSON number with an integral value within +-2^53.  (Literals that a
 * double would misjudge were replaced before cJSON saw them.) */
static bool json_int(const cJSON *it, int64_t *out)
{
    double v;
    int64_t i;

    if (!cJSON_IsNumber(it))
        return false;
    v = it->valuedouble;
    if (!(v >= -PROTO_INT_LIMIT && v <= PROTO_INT_LIMIT))
        return false;
    i = (int64_t)v;
    if ((double)i != v)
        return false;
    *out = i;
    return true;
}

/* 1..max bytes of [A-Za-z0-9_.:-]. */
static bool name_ok(const char *s, size_t max)
{
    size_t n = 0;

    for (; s[n] != '\0'; n++) {
        char c = s[n];
        if (n >= max)
            return false;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == ':' || c == '-'))
            return false;
    }
    return n > 0;
}

static int field_id(const cJSON *it, proto_request_t *r, slotd_error_t *err)
{
    const char *op = proto_op_name(r->op);

    if (it == NULL)
        return slotd_error_set(err, SLOTD_EBAD_REQUEST, "%s: `id` is required", op);
    if (!cJSON_IsString(it) || !name_ok(it->valuestring, PROTO_ID_MAX))
        return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                               "%s: `id` must be a string of 1-64 characters from "
                               "[A-Za-z0-9_.:-]",
                               op);
    strcpy(r->id, it->valuestring);
    return SLOTD_OK;
}

static int field_model(const cJSON *it, proto_request_t *r, slotd_error_t *err)
{
    if (it == NULL)
        return SLOTD_OK;
    if (!cJSON_IsString(it) || !name_ok(it->valuestring, PROTO_MODEL_MAX))
        return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                               "%s: `model` must be a string of 1-32 characters from "
                               "[A-Za-z0-9_.:-]",
                               proto_op_name(r->op));
    strcpy(r->model, it->valuestring);
    return SLOTD_OK;
}

/* A required, non-empty array of integers into r->tokens. */
static int field_ints(const cJSON *it, const char *name, proto_request_t *r, slotd_error_t *err)
{
    const char *op = proto_op_name(r->op);
    const cJSON *el;
    size_t n = 0;

    if (it == NULL || !cJSON_IsArray(it) || it->child == NULL)
        return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                               "%s: `%s` must be a non-empty array of integers", op, name);
    for (el = it->child; el != NULL; el = el->next)
        n++;
    r->tokens = proto__realloc(NULL, n * sizeof(*r->tokens));
    if (r->tokens == NULL)
        return slotd_error_set(err, SLOTD_ENOMEM, "out of memory");
    n = 0;
    for (el = it->child; el != NULL; el = el->next, n++) {
        if (!json_int(el, &r->tokens[n]))
            return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                                   "%s: `%s` must be a non-empty array of integers (element %zu "
                                   "is not an integer)",
                                   op, name, n);
    }
    r->ntokens = n;
    return SLOTD_OK;
}

static int field_n(const cJSON *it, proto_request_t *r, slotd_error_t *err)
{
    int64_t v;

    if (it == NULL)
        return SLOTD_OK;
    if (!json_int(it, &v) || v < 1 || v > (int64_t)UINT32_MAX)
        return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                               "step: `n` must be an integer from 1 to %" PRIu32, UINT32_MAX);
    r->n = (uint32_t)v;
    return SLOTD_OK;
}

static int field_steps(const cJSON *it, proto_request_t *r, slotd_error_t *err)
{
    if (it == NULL)
        return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                               "generate: `steps` is required (a non-negative integer)");
    if (!json_int(it, &r->steps) || r->steps < 0)
        return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                               "generate: `steps` must be a non-negative integer");
    return SLOTD_OK;
}

static int field_use_cache(const cJSON *it, proto_request_t *r, slotd_error_t *err)
{
    if (it == NULL)
        return SLOTD_OK;
    if (!cJSON_IsBool(it))
        return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                               "generate: `use_cache` must be true or false");
    r->use_cache = cJSON_IsTrue(it);
    return SLOTD_OK;
}

/* The tag's JSON text into r->tag.  Returns SLOTD_OK, SLOTD_EBAD_REQUEST
 * (not a string or an integer; `err` untouched) or SLOTD_ENOMEM. */
static int field_tag(const cJSON *it, proto_request_t *r)
{
    proto_buf_t b;
    int64_t v;
    char *tag;

    proto_buf_init(&b);
    if (cJSON_IsString(it)) {
        if (proto__put_json_string(&b, it->valuestring, strlen(it->valuestring)) != SLOTD_OK)
            goto nomem;
    } else if (json_int(it, &v)) {
        char num[24];
        int k = snprintf(num, sizeof(num), "%" PRId64, v);
        if (proto_buf_append(&b, num, (size_t)k) != SLOTD_OK)
            goto nomem;
    } else {
        return SLOTD_EBAD_REQUEST;
    }
    if (proto_buf_append(&b, "", 1) != SLOTD_OK)
        goto nomem;
    /* Keep only what the text needs: the request holds it until it is
     * answered. */
    tag = proto__realloc(b.data, b.len);
    r->tag = tag != NULL ? tag : b.data;
    return SLOTD_OK;

nomem:
    proto_buf_free(&b);
    return SLOTD_ENOMEM;
}

/* Copies up to 32 bytes of `s` for a message, printable ASCII only. */
static void message_safe(char *out, size_t cap, const char *s)
{
    size_t i = 0;

    for (; s[i] != '\0' && i + 4 < cap && i < 32; i++) {
        unsigned char c = (unsigned char)s[i];
        out[i] = c >= 0x20 && c < 0x7F && c != '"' && c != '\\' ? (char)c : '?';
    }
    if (s[i] != '\0') {
        memcpy(out + i, "...", 3);
        i += 3;
    }
    out[i] = '\0';
}

static int request_fill(const cJSON *root, proto_request_t *r, slotd_error_t *err)
{
    const cJSON *f[FIELD__COUNT] = {0};
    const cJSON *it;
    bool tag_bad = false;
    int rc;

    for (it = root->child; it != NULL; it = it->next) {
        for (int k = 0; k < FIELD__COUNT; k++) {
            if (strcmp(it->string, field_names[k]) == 0) {
                if (f[k] == NULL)
                    f[k] = it;
                break;
            }
        }
    }

    /* The tag first, so that even an unknown_op reply can echo it; a bad
     * tag is a field error and so comes after the op. */
    if (f[FIELD_TAG] != NULL) {
        rc = field_tag(f[FIELD_TAG], r);
        if (rc == SLOTD_ENOMEM)
            return slotd_error_set(err, rc, "out of memory");
        tag_bad = rc != SLOTD_OK;
    }

    it = f[FIELD_OP];
    if (it == NULL)
        return slotd_error_set(err, SLOTD_EUNKNOWN_OP, "`op` is missing");
    if (!cJSON_IsString(it))
        return slotd_error_set(err, SLOTD_EUNKNOWN_OP, "`op` must be a string");
    for (int k = PROTO_OP_NONE + 1; k < PROTO_OP__COUNT; k++) {
        if (strcmp(it->valuestring, op_names[k]) == 0) {
            r->op = (proto_op_t)k;
            break;
        }
    }
    if (r->op == PROTO_OP_NONE) {
        char safe[40];
        message_safe(safe, sizeof(safe), it->valuestring);
        return slotd_error_set(err, SLOTD_EUNKNOWN_OP,
                               "unknown `op` \"%s\" (start, step, finish, logits, generate, stats)",
                               safe);
    }

    if (tag_bad)
        return slotd_error_set(err, SLOTD_EBAD_REQUEST, "`tag` must be a string or an integer");

    switch (r->op) {
    case PROTO_OP_START:
        if ((rc = field_id(f[FIELD_ID], r, err)) != SLOTD_OK ||
            (rc = field_model(f[FIELD_MODEL], r, err)) != SLOTD_OK ||
            (rc = field_ints(f[FIELD_PROMPT], "prompt", r, err)) != SLOTD_OK)
            return rc;
        break;
    case PROTO_OP_STEP:
        if ((rc = field_id(f[FIELD_ID], r, err)) != SLOTD_OK ||
            (rc = field_n(f[FIELD_N], r, err)) != SLOTD_OK)
            return rc;
        break;
    case PROTO_OP_FINISH:
        if ((rc = field_id(f[FIELD_ID], r, err)) != SLOTD_OK)
            return rc;
        break;
    case PROTO_OP_LOGITS:
        if ((rc = field_ints(f[FIELD_TOKENS], "tokens", r, err)) != SLOTD_OK ||
            (rc = field_model(f[FIELD_MODEL], r, err)) != SLOTD_OK)
            return rc;
        break;
    case PROTO_OP_GENERATE:
        if ((rc = field_ints(f[FIELD_TOKENS], "tokens", r, err)) != SLOTD_OK ||
            (rc = field_steps(f[FIELD_STEPS], r, err)) != SLOTD_OK ||
            (rc = field_use_cache(f[FIELD_USE_CACHE], r, err)) != SLOTD_OK ||
            (rc = field_model(f[FIELD_MODEL], r, err)) != SLOTD_OK)
            return rc;
        break;
    case PROTO_OP_STATS:
    default:
        break;
    }
    return SLOTD_OK;
}

/* ---- Requests ---- */

void proto_request_init(proto_request_t *r)
{
    memset(r, 0, sizeof(*r));
    r->op = PROTO_OP_NONE;
    r->n = 1;
}

void proto_request_free(proto_request_t *r)
{
    free(r->tag);
    free(r->tokens);
    proto_request_init(r);
}

int proto_request_parse(const char *line, size_t len, proto_request_t *r, slotd_error_t *err)
{
    json_scan_t j = {.s = (const unsigned char *)line, .n = len};
    char *copy = NULL;
    const char *text = line;
    size_t off, textlen = len;
    cJSON *root;
    int rc;

    proto_request_free(r);

    off = proto__utf8_scan(line, len);
    if (off < len) {
        if (line[off] == '\0')
            return slotd_error_set(err, SLOTD_EBAD_JSON, "the line holds a NUL byte at byte %zu",
                                   off);
        return slotd_error_set(err, SLOTD_EBAD_JSON, "the line is not valid UTF-8 at byte %zu",
                               off);
    }
    if ((rc = json_scan_line(&j, err)) != SLOTD_OK)
        return rc;

    if (j.rewrites > 0) {
        if (j.rewrites > (SIZE_MAX - len - 1) / PROTO_NUMBER_GROWTH)
            return slotd_error_set(err, SLOTD_ENOMEM, "out of memory");
        copy = proto__realloc(NULL, len + j.rewrites * PROTO_NUMBER_GROWTH + 1);
        if (copy == NULL)
            return slotd_error_set(err, SLOTD_ENOMEM, "out of memory");
        j = (json_scan_t){.s = (const unsigned char *)line, .n = len, .out = copy};
        rc = json_scan_line(&j, err);
        assert(rc == SLOTD_OK && j.outlen <= len + j.rewrites * PROTO_NUMBER_GROWTH);
        text = copy;
        textlen = j.outlen;
    }

    /* The line is known to be one well-formed object, so cJSON can only fail
     * for want of memory. */
    root = cJSON_ParseWithLengthOpts(text, textlen, NULL, 0);
    free(copy);
    if (root == NULL)
        return slotd_error_set(err, SLOTD_ENOMEM, "out of memory");
    rc = request_fill(root, r, err);
    cJSON_Delete(root);
    if (rc != SLOTD_OK) {
        free(r->tokens);
        r->tokens = NULL;
        r->ntokens = 0;
    }
    return rc;
}
