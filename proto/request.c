/*
 * request.c: proto_request_parse(), from one line to a validated request,
 * and the strict UTF-8 check it shares with the reply writers.
 *
 * A line is read by one of two paths that give the same result on every
 * input: the one-pass path ("flat", at the end of the file), which takes
 * the usual requests without building a tree and declines any other line
 * before changing anything, and the tree path (UTF-8 scan, strict syntax
 * check with json_scan_*, then cJSON and field validation), the one source
 * of error codes and messages.
 *
 * Threads.  Any thread may parse.  cJSON's allocations during a parse are
 * cut from a bump arena of the parsing thread (thread-local, so no lock);
 * the hooks are installed once per process by proto_init() and are malloc
 * and free outside a parse.
 *
 * Design: docs/design.md, "Parsing a request line".
 */
#include "proto/proto__internal.h"

#include <assert.h>
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__)
#define PROTO_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PROTO_ASAN 1
#endif
#endif
#ifdef PROTO_ASAN
#include <sanitizer/asan_interface.h>
#define ARENA_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define ARENA_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#define ARENA_REDZONE 16 /* poisoned bytes after each allocation */
#else
#define ARENA_POISON(p, n) ((void)(p), (void)(n))
#define ARENA_UNPOISON(p, n) ((void)(p), (void)(n))
#define ARENA_REDZONE 0
#endif

#define PROTO_JSON_MAX_DEPTH 128
#define PROTO_INT_LIMIT 9007199254740992.0 /* 2^53 */
/* Longest replacement of a number literal ("-9007199254740992") less the
 * shortest literal that is replaced ("1.0", "1e5"), rounded up. */
#define PROTO_NUMBER_GROWTH 16

/* The arena: a static block per thread (a start with a prompt of about 200
 * tokens fits), then overflow chunks of at least ARENA_CHUNK_MIN bytes,
 * each twice the last. */
#define ARENA_BLOCK 16384
#define ARENA_CHUNK_MIN 65536
#define ARENA_ALIGN (alignof(max_align_t))

/* ---- Ops ---- */

static const char *const op_names[PROTO_OP__COUNT] = {
    [PROTO_OP_NONE] = "none",     [PROTO_OP_START] = "start",   [PROTO_OP_STEP] = "step",
    [PROTO_OP_FINISH] = "finish", [PROTO_OP_LOGITS] = "logits", [PROTO_OP_GENERATE] = "generate",
    [PROTO_OP_STATS] = "stats",   [PROTO_OP_AUTH] = "auth",
};

const char *proto_op_name(proto_op_t op)
{
    if ((unsigned)op >= PROTO_OP__COUNT)
        return "none";
    return op_names[op];
}

/* The op named by the `n` bytes at `s`, or PROTO_OP_NONE. */
static proto_op_t op_lookup(const char *s, size_t n)
{
    static const unsigned char lens[PROTO_OP__COUNT] = {4, 5, 4, 6, 6, 8, 5, 4};

    for (int k = PROTO_OP_NONE + 1; n > 0 && k < PROTO_OP__COUNT; k++) {
        if (s[0] == op_names[k][0] && n == lens[k] && memcmp(s, op_names[k], n) == 0)
            return (proto_op_t)k;
    }
    return PROTO_OP_NONE;
}

/* ---- cJSON's memory: a bump arena per thread ---- */

/* An overflow chunk, from proto__realloc(); freed by arena_end(). */
typedef struct arena_chunk {
    struct arena_chunk *prev; /* the chunk before it, NULL for the first */
    size_t cap;               /* bytes in data */
    max_align_t data[];
} arena_chunk_t;

/* One thread's arena.  Active only inside proto_request_parse(), and
 * nothing allocated from it outlives that call. */
typedef struct arena {
    unsigned char *cur;    /* the block or the newest chunk */
    size_t used, cap;      /* of cur */
    size_t block_used;     /* of the block, once a chunk took over */
    arena_chunk_t *chunks; /* overflow chunks, newest first; owned */
    size_t allocs;         /* allocations served since arena_begin() */
    bool active;
    bool poisoned; /* ASan: the block was poisoned once */
    proto__arena_stats_t last;
} arena_t;

static _Thread_local arena_t arena;
static _Thread_local max_align_t arena_block[ARENA_BLOCK / sizeof(max_align_t)];

static void arena_begin(void)
{
    arena_t *a = &arena;

    assert(!a->active && a->chunks == NULL);
    if (!a->poisoned) {
        ARENA_POISON(arena_block, sizeof(arena_block));
        a->poisoned = true;
    }
    a->cur = (unsigned char *)arena_block;
    a->used = 0;
    a->cap = sizeof(arena_block);
    a->block_used = 0;
    a->allocs = 0;
    a->active = true;
}

/* `n` bytes aligned like malloc's, or NULL when no chunk could be had. */
static void *arena_alloc(size_t n)
{
    arena_t *a = &arena;
    size_t need = (n + ARENA_REDZONE + ARENA_ALIGN) & ~(ARENA_ALIGN - 1);
    unsigned char *p;

    assert(a->active);
    if (need < n || need > (size_t)PTRDIFF_MAX - sizeof(arena_chunk_t))
        return NULL;
    if (a->cap - a->used < need) {
        size_t size = a->chunks != NULL ? a->chunks->cap * 2 : ARENA_CHUNK_MIN;
        arena_chunk_t *c;
        if (size < need)
            size = need;
        c = proto__realloc(NULL, sizeof(*c) + size);
        if (c == NULL)
            return NULL;
        if (a->chunks == NULL)
            a->block_used = a->used;
        c->prev = a->chunks;
        c->cap = size;
        a->chunks = c;
        a->cur = (unsigned char *)c->data;
        a->used = 0;
        a->cap = size;
        ARENA_POISON(c->data, size);
    }
    p = a->cur + a->used;
    a->used += need;
    a->allocs++;
    ARENA_UNPOISON(p, n);
    return p;
}

/* Whether `p` points into this thread's active arena. */
static bool arena_owns(const void *p)
{
    const arena_t *a = &arena;
    uintptr_t u = (uintptr_t)p, b = (uintptr_t)arena_block;

    if (!a->active)
        return false;
    if (u >= b && u < b + sizeof(arena_block))
        return true;
    for (const arena_chunk_t *c = a->chunks; c != NULL; c = c->prev) {
        b = (uintptr_t)c->data;
        if (u >= b && u < b + c->cap)
            return true;
    }
    return false;
}

/* Lets go of everything the arena handed out since arena_begin(). */
static void arena_end(void)
{
    arena_t *a = &arena;
    arena_chunk_t *c = a->chunks, *prev;

    assert(a->active);
    if (c == NULL)
        a->block_used = a->used;
    a->last = (proto__arena_stats_t){.allocs = a->allocs, .block_bytes = a->block_used};
    for (; c != NULL; c = prev) {
        prev = c->prev;
        a->last.chunks++;
        a->last.chunk_bytes += c->cap;
        ARENA_UNPOISON(c->data, c->cap);
        free(c);
    }
    a->chunks = NULL;
#ifdef PROTO_ASAN
    ARENA_POISON(arena_block, a->block_used);
#elif !defined(NDEBUG)
    /* A pointer kept past the parse reads garbage at once. */
    memset(arena_block, 0xA5, a->block_used);
#endif
    a->active = false;
}

static void *json_malloc(size_t n)
{
    return arena.active ? arena_alloc(n) : malloc(n);
}

static void json_free(void *p)
{
    if (!arena_owns(p))
        free(p);
}

static pthread_once_t hooks_once = PTHREAD_ONCE_INIT;

void proto__json_hooks_install(void)
{
    cJSON_Hooks hooks = {json_malloc, json_free};
    cJSON_InitHooks(&hooks);
}

void proto_init(void)
{
    pthread_once(&hooks_once, proto__json_hooks_install);
}

void proto__arena_last(proto__arena_stats_t *out)
{
    *out = arena.last;
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
    FIELD_TOKEN,
    FIELD__COUNT
};

static const char *const field_names[FIELD__COUNT] = {
    "tag", "op", "id", "model", "prompt", "tokens", "n", "steps", "use_cache", "token",
};

/* The FIELD_ of the `n` bytes of a member name at `s`, or -1: one
 * comparison at most. */
static int field_index(const char *s, size_t n)
{
    int k;

    switch (n) {
    case 1:
        k = FIELD_N;
        break;
    case 2:
        k = s[0] == 'o' ? FIELD_OP : FIELD_ID;
        break;
    case 3:
        k = FIELD_TAG;
        break;
    case 5:
        k = s[0] == 'm' ? FIELD_MODEL : s[0] == 's' ? FIELD_STEPS : FIELD_TOKEN;
        break;
    case 6:
        k = s[0] == 'p' ? FIELD_PROMPT : FIELD_TOKENS;
        break;
    case 9:
        k = FIELD_USE_CACHE;
        break;
    default:
        return -1;
    }
    return memcmp(s, field_names[k], n) == 0 ? k : -1;
}

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

/* Whether the `n` bytes at `s` are 1..max bytes of [A-Za-z0-9_.:-]. */
static bool name_ok(const char *s, size_t n, size_t max)
{
    if (n == 0 || n > max)
        return false;
    for (size_t k = 0; k < n; k++) {
        if (!name_chars[(unsigned char)s[k]])
            return false;
    }
    return true;
}

/* Copies the `n` bytes at `s` into `out` (max + 1 bytes) if name_ok();
 * otherwise leaves `out` empty. */
static bool name_copy(char *out, const char *s, size_t n, size_t max)
{
    if (!name_ok(s, n, max)) {
        out[0] = '\0';
        return false;
    }
    memcpy(out, s, n);
    out[n] = '\0';
    return true;
}

static int field_id(const cJSON *it, proto_request_t *r, slotd_error_t *err)
{
    const char *op = proto_op_name(r->op);

    if (it == NULL)
        return slotd_error_set(err, SLOTD_EBAD_REQUEST, "%s: `id` is required", op);
    if (!cJSON_IsString(it) ||
        !name_copy(r->id, it->valuestring, strlen(it->valuestring), PROTO_ID_MAX))
        return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                               "%s: `id` must be a string of 1-64 characters from "
                               "[A-Za-z0-9_.:-]",
                               op);
    return SLOTD_OK;
}

static int field_model(const cJSON *it, proto_request_t *r, slotd_error_t *err)
{
    if (it == NULL)
        return SLOTD_OK;
    if (!cJSON_IsString(it) ||
        !name_copy(r->model, it->valuestring, strlen(it->valuestring), PROTO_MODEL_MAX))
        return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                               "%s: `model` must be a string of 1-32 characters from "
                               "[A-Za-z0-9_.:-]",
                               proto_op_name(r->op));
    return SLOTD_OK;
}

/* auth's required `token`: a string of 1..PROTO_AUTH_TOKEN_MAX bytes. */
static int field_token(const cJSON *it, proto_request_t *r, slotd_error_t *err)
{
    size_t n;

    if (it == NULL)
        return slotd_error_set(err, SLOTD_EBAD_REQUEST, "auth: `token` is required");
    if (!cJSON_IsString(it) || (n = strlen(it->valuestring)) == 0 || n > PROTO_AUTH_TOKEN_MAX)
        return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                               "auth: `token` must be a string of 1-%d bytes",
                               PROTO_AUTH_TOKEN_MAX);
    r->token = proto__realloc(NULL, n + 1);
    if (r->token == NULL)
        return slotd_error_set(err, SLOTD_ENOMEM, "out of memory");
    memcpy(r->token, it->valuestring, n + 1);
    r->token_len = n;
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

/* Writes `v` in decimal to `out` (24 bytes); returns the length. */
static size_t fmt_i64(char *out, int64_t v)
{
    char d[20];
    size_t nd = 0, o = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;

    do {
        d[nd++] = (char)('0' + u % 10);
        u /= 10;
    } while (u > 0);
    if (v < 0)
        out[o++] = '-';
    while (nd > 0)
        out[o++] = d[--nd];
    return o;
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
    char num[24];

    r->tag = tag_text(num, fmt_i64(num, v), false);
    return r->tag != NULL ? SLOTD_OK : SLOTD_ENOMEM;
}

/* A string tag's JSON text into r->tag, from the string's `n` bytes at `s`
 * (unescaped; no NUL).  SLOTD_OK or SLOTD_ENOMEM. */
static int tag_from_string(proto_request_t *r, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    proto_buf_t b;
    size_t k = 0;
    char *tag;

    /* Printable ASCII other than '"' and '\\' is written as it is. */
    while (k < n && u[k] >= 0x20 && u[k] < 0x80 && u[k] != '"' && u[k] != '\\')
        k++;
    if (k == n) {
        r->tag = tag_text(s, n, true);
        return r->tag != NULL ? SLOTD_OK : SLOTD_ENOMEM;
    }
    proto_buf_init(&b);
    if (proto__put_json_string(&b, s, n) != SLOTD_OK || proto_buf_append(&b, "", 1) != SLOTD_OK) {
        proto_buf_free(&b);
        return SLOTD_ENOMEM;
    }
    /* Keep only what the text needs: the request holds it until it is
     * answered. */
    tag = proto__realloc(b.data, b.len);
    r->tag = tag != NULL ? tag : b.data;
    return SLOTD_OK;
}

/* The tag's JSON text into r->tag, one allocation of its exact size.
 * Returns SLOTD_OK, SLOTD_EBAD_REQUEST (not a string or an integer; `err`
 * untouched) or SLOTD_ENOMEM. */
static int field_tag(const cJSON *it, proto_request_t *r)
{
    int64_t v;

    if (json_int(it, &v))
        return tag_from_int(r, v);
    if (!cJSON_IsString(it))
        return SLOTD_EBAD_REQUEST;
    return tag_from_string(r, it->valuestring, strlen(it->valuestring));
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
        int k = field_index(it->string, strlen(it->string));
        if (k >= 0 && f[k] == NULL)
            f[k] = it;
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
    r->op = op_lookup(it->valuestring, strlen(it->valuestring));
    if (r->op == PROTO_OP_NONE) {
        char safe[40];
        message_safe(safe, sizeof(safe), it->valuestring);
        return slotd_error_set(err, SLOTD_EUNKNOWN_OP,
                               "unknown `op` \"%s\" (start, step, finish, logits, generate, "
                               "stats, auth)",
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
    case PROTO_OP_AUTH:
        if ((rc = field_token(f[FIELD_TOKEN], r, err)) != SLOTD_OK)
            return rc;
        break;
    case PROTO_OP_STATS:
    default:
        break;
    }
    return SLOTD_OK;
}

/* ---- The one-pass path ---- */

/*
 * It reads only what it can read exactly as the tree path does, and leaves
 * the rest to it (declines): a member name with an escape (it might spell a
 * known name), a known member's string with an escape, a number that is not
 * a plain integer of at most 15 digits where an integer is read (1.0, 1e2
 * and 16-digit literals need the exact rule of json_number_canon()), and any
 * line the tree path would refuse.  Everything else in the line -- unknown
 * members, later duplicates, known members the op does not use -- is only
 * checked, with json_scan_value() and the UTF-8 scan.  A declined line costs
 * this pass, as far as it got, on top of the tree path's: declined lines are
 * the unusual ones (a line with an error among them).
 */

/* What the first value of a known member is. */
typedef enum flat_kind {
    FLAT_ABSENT = 0,
    FLAT_STRING, /* with no escape: bytes [b, e) of the line are its value */
    FLAT_INT,    /* a plain integer literal: its value is v */
    FLAT_INTS,   /* a non-empty array of plain integer literals: [b, e) of the scratch */
    FLAT_TRUE,
    FLAT_FALSE,
    FLAT_OTHER /* anything else, well-formed; the tree path reads it */
} flat_kind_t;

typedef struct flat_value {
    flat_kind_t kind;
    bool high; /* FLAT_STRING: it holds a byte >= 0x80 */
    size_t b, e;
    int64_t v;
} flat_value_t;

/* The integers of prompt and tokens arrays, read before the op is known.
 * `v` is `local` until it outgrows it, then memory of the parse's own, from
 * proto__realloc() and freed before the parse returns. */
#define FLAT_LOCAL_INTS 256
typedef struct flat_ints {
    int64_t *v;
    size_t n, cap;
    int64_t local[FLAT_LOCAL_INTS];
} flat_ints_t;

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
static int flat_string(json_scan_t *j, size_t *b, size_t *e, bool *high)
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
static int flat_skip(json_scan_t *j)
{
    size_t start = j->i;

    if (json_scan_value(j, 1) != 0)
        return -1;
    return proto__utf8_scan((const char *)j->s + start, j->i - start) == j->i - start ? 0 : -1;
}

/* At '-' or a digit.  0: a plain literal (no fraction, no exponent, at most
 * 15 digits, so cJSON's double holds it exactly), its value in *v; 1:
 * another well-formed literal; -1: not a number. */
static int flat_number(json_scan_t *j, int64_t *v)
{
    const unsigned char *s = j->s;
    size_t i = j->i, n = j->n, digits;
    bool neg = s[i] == '-';
    uint64_t u = 0;

    if (neg)
        i++;
    if (i >= n || !json_is_digit(s[i]))
        return -1;
    digits = i;
    if (s[i] == '0')
        i++;
    else
        for (; i < n && json_is_digit(s[i]) && i - digits < 16; i++)
            u = u * 10 + (unsigned)(s[i] - '0');
    if (i - digits > 15 ||
        (i < n && (s[i] == '.' || s[i] == 'e' || s[i] == 'E' || json_is_digit(s[i])))) {
        /* The syntax check reads the rest. */
        return json_scan_number(j) == 0 ? 1 : -1;
    }
    j->i = i;
    *v = neg ? -(int64_t)u : (int64_t)u;
    return 0;
}

static int flat_push(flat_ints_t *t, int64_t v)
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

/* At the '[' of a prompt or tokens member: FLAT_INTS if it is a non-empty
 * array of plain integer literals, which go into `t`; otherwise the array
 * is read again as any value, FLAT_OTHER. */
static int flat_array(json_scan_t *j, flat_ints_t *t, flat_value_t *out)
{
    size_t start = j->i, first = t->n;
    int64_t v;

    j->i++;
    for (;;) {
        int rc;
        json_scan_ws(j);
        if (j->i >= j->n || (j->s[j->i] != '-' && !json_is_digit(j->s[j->i])))
            goto other;
        if ((rc = flat_number(j, &v)) < 0)
            return -1;
        if (rc > 0)
            goto other;
        if (flat_push(t, v) != 0)
            return -1;
        json_scan_ws(j);
        if (j->i < j->n && j->s[j->i] == ']')
            break;
        if (j->i >= j->n || j->s[j->i] != ',')
            return -1;
        j->i++;
    }
    j->i++;
    out->kind = FLAT_INTS;
    out->b = first;
    out->e = t->n;
    return 0;

other:
    t->n = first;
    j->i = start;
    out->kind = FLAT_OTHER;
    return flat_skip(j);
}

/* The first value of known member `k`, at j->i (not white space). */
static int flat_value(json_scan_t *j, int k, flat_value_t *out, flat_ints_t *t)
{
    unsigned char c = j->s[j->i];
    int rc;

    switch (c) {
    case '"':
        out->kind = FLAT_STRING;
        return flat_string(j, &out->b, &out->e, &out->high);
    case 't':
        out->kind = FLAT_TRUE;
        return json_scan_literal(j, "true", 4);
    case 'f':
        out->kind = FLAT_FALSE;
        return json_scan_literal(j, "false", 5);
    case '[':
        if (k == FIELD_PROMPT || k == FIELD_TOKENS)
            return flat_array(j, t, out);
        break;
    default:
        if (c == '-' || json_is_digit(c)) {
            if ((rc = flat_number(j, &out->v)) < 0)
                return -1;
            out->kind = rc == 0 ? FLAT_INT : FLAT_OTHER;
            return 0;
        }
        break;
    }
    out->kind = FLAT_OTHER;
    return flat_skip(j);
}

/* The whole line, once: one object, every byte checked as the tree path
 * checks it, and the first value of each known member noted in f[]. */
static int flat_scan(json_scan_t *j, flat_value_t *f, flat_ints_t *t)
{
    json_scan_ws(j);
    if (j->i >= j->n || j->s[j->i] != '{')
        return -1;
    j->i++;
    for (;;) {
        size_t b, e;
        bool high;
        int k;

        json_scan_ws(j);
        if (j->i >= j->n || j->s[j->i] != '"' || flat_string(j, &b, &e, &high) != 0)
            return -1;
        k = high ? -1 : field_index((const char *)j->s + b, e - b);
        json_scan_ws(j);
        if (j->i >= j->n || j->s[j->i] != ':')
            return -1;
        j->i++;
        json_scan_ws(j);
        if (j->i >= j->n)
            return -1;
        if (k >= 0 && f[k].kind == FLAT_ABSENT) {
            if (flat_value(j, k, &f[k], t) != 0)
                return -1;
        } else if (flat_skip(j) != 0) {
            return -1;
        }
        json_scan_ws(j);
        if (j->i >= j->n)
            return -1;
        if (j->s[j->i] == '}')
            break;
        if (j->s[j->i] != ',')
            return -1;
        j->i++;
    }
    j->i++;
    json_scan_ws(j);
    return j->i == j->n ? 0 : -1;
}

/* Whether f is absent (when it may be) or a string name_ok() takes. */
static bool flat_name_ok(const flat_value_t *f, const char *line, size_t max, bool required)
{
    if (f->kind == FLAT_ABSENT)
        return !required;
    return f->kind == FLAT_STRING && name_ok(line + f->b, f->e - f->b, max);
}

/* Copies the name `f` holds (flat_name_ok()) into `out`, if it is there. */
static void flat_name_copy(char *out, const flat_value_t *f, const char *line)
{
    if (f->kind == FLAT_STRING) {
        memcpy(out, line + f->b, f->e - f->b);
        out[f->e - f->b] = '\0';
    }
}

/* The request from what flat_scan() noted, if it is valid; the tree path
 * has the last word on everything else. */
static int flat_fill(const flat_value_t *f, const flat_ints_t *t, const char *line,
                     proto_request_t *r, slotd_error_t *err)
{
    const flat_value_t *tag = &f[FIELD_TAG], *op = &f[FIELD_OP], *ints = NULL;
    proto_op_t o;
    int rc = SLOTD_OK;

    /* First everything request_fill() checks, so that a line it would
     * refuse changes nothing here. */
    if (tag->kind != FLAT_ABSENT && tag->kind != FLAT_INT && tag->kind != FLAT_STRING)
        return PROTO__DECLINED;
    if (op->kind != FLAT_STRING || op->high ||
        (o = op_lookup(line + op->b, op->e - op->b)) == PROTO_OP_NONE)
        return PROTO__DECLINED;
    switch (o) {
    case PROTO_OP_START:
        ints = &f[FIELD_PROMPT];
        if (!flat_name_ok(&f[FIELD_ID], line, PROTO_ID_MAX, true) ||
            !flat_name_ok(&f[FIELD_MODEL], line, PROTO_MODEL_MAX, false) || ints->kind != FLAT_INTS)
            return PROTO__DECLINED;
        break;
    case PROTO_OP_STEP:
        if (!flat_name_ok(&f[FIELD_ID], line, PROTO_ID_MAX, true) ||
            (f[FIELD_N].kind != FLAT_ABSENT && (f[FIELD_N].kind != FLAT_INT || f[FIELD_N].v < 1 ||
                                                f[FIELD_N].v > (int64_t)UINT32_MAX)))
            return PROTO__DECLINED;
        break;
    case PROTO_OP_FINISH:
        if (!flat_name_ok(&f[FIELD_ID], line, PROTO_ID_MAX, true))
            return PROTO__DECLINED;
        break;
    case PROTO_OP_LOGITS:
        ints = &f[FIELD_TOKENS];
        if (ints->kind != FLAT_INTS || !flat_name_ok(&f[FIELD_MODEL], line, PROTO_MODEL_MAX, false))
            return PROTO__DECLINED;
        break;
    case PROTO_OP_GENERATE:
        ints = &f[FIELD_TOKENS];
        if (ints->kind != FLAT_INTS || f[FIELD_STEPS].kind != FLAT_INT || f[FIELD_STEPS].v < 0 ||
            (f[FIELD_USE_CACHE].kind != FLAT_ABSENT && f[FIELD_USE_CACHE].kind != FLAT_TRUE &&
             f[FIELD_USE_CACHE].kind != FLAT_FALSE) ||
            !flat_name_ok(&f[FIELD_MODEL], line, PROTO_MODEL_MAX, false))
            return PROTO__DECLINED;
        break;
    case PROTO_OP_AUTH: /* rare, once per connection: the tree path reads it */
        return PROTO__DECLINED;
    case PROTO_OP_STATS:
    default:
        break;
    }

    /* Then the request, in request_fill()'s order, so that running out of
     * memory leaves behind what it would. */
    if (tag->kind == FLAT_INT)
        rc = tag_from_int(r, tag->v);
    else if (tag->kind == FLAT_STRING)
        rc = tag_from_string(r, line + tag->b, tag->e - tag->b);
    if (rc != SLOTD_OK)
        return slotd_error_set(err, rc, "out of memory");
    r->op = o;
    if (o == PROTO_OP_START || o == PROTO_OP_STEP || o == PROTO_OP_FINISH)
        flat_name_copy(r->id, &f[FIELD_ID], line);
    if (o == PROTO_OP_START)
        flat_name_copy(r->model, &f[FIELD_MODEL], line);
    if (ints != NULL) {
        size_t n = ints->e - ints->b;
        r->tokens = proto__realloc(NULL, n * sizeof(*r->tokens));
        if (r->tokens == NULL)
            return slotd_error_set(err, SLOTD_ENOMEM, "out of memory");
        memcpy(r->tokens, t->v + ints->b, n * sizeof(*r->tokens));
        r->ntokens = n;
    }
    if (o == PROTO_OP_STEP && f[FIELD_N].kind == FLAT_INT)
        r->n = (uint32_t)f[FIELD_N].v;
    if (o == PROTO_OP_GENERATE) {
        r->steps = f[FIELD_STEPS].v;
        r->use_cache = f[FIELD_USE_CACHE].kind == FLAT_TRUE;
    }
    if (o == PROTO_OP_LOGITS || o == PROTO_OP_GENERATE)
        flat_name_copy(r->model, &f[FIELD_MODEL], line);
    return SLOTD_OK;
}

/* The one-pass path, on a request as proto_request_init() left it. */
static int parse_flat(const char *line, size_t len, proto_request_t *r, slotd_error_t *err)
{
    json_scan_t j = {.s = (const unsigned char *)line, .n = len};
    flat_value_t f[FIELD__COUNT];
    flat_ints_t t;
    int rc = PROTO__DECLINED;

    for (int k = 0; k < FIELD__COUNT; k++)
        f[k].kind = FLAT_ABSENT;
    t.v = t.local;
    t.n = 0;
    t.cap = FLAT_LOCAL_INTS;
    if (flat_scan(&j, f, &t) == 0)
        rc = flat_fill(f, &t, line, r, err);
    if (t.v != t.local)
        free(t.v);
    return rc;
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
    free(r->token);
    proto_request_init(r);
}

/* The tree path, on a request as proto_request_init() left it. */
static int parse_tree(const char *line, size_t len, proto_request_t *r, slotd_error_t *err)
{
    json_scan_t j = {.s = (const unsigned char *)line, .n = len};
    const char *text = line;
    size_t off, textlen = len, served;
    bool own_tree;
    cJSON *root;
    int rc;

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

    arena_begin();
    if (j.rewrites > 0) {
        char *copy;
        if (j.rewrites > (SIZE_MAX - len - 1) / PROTO_NUMBER_GROWTH ||
            (copy = arena_alloc(len + j.rewrites * PROTO_NUMBER_GROWTH + 1)) == NULL) {
            arena_end();
            return slotd_error_set(err, SLOTD_ENOMEM, "out of memory");
        }
        j = (json_scan_t){.s = (const unsigned char *)line, .n = len, .out = copy};
        rc = json_scan_line(&j, err);
        assert(rc == SLOTD_OK && j.outlen <= len + j.rewrites * PROTO_NUMBER_GROWTH);
        text = copy;
        textlen = j.outlen;
    }

    /* The line is known to be one well-formed object, so cJSON can only fail
     * for want of memory. */
    served = arena.allocs;
    root = cJSON_ParseWithLengthOpts(text, textlen, NULL, 0);
    /* When the arena served none of the tree, cJSON's hooks are not ours
     * (something replaced them): the tree is freed as it was allocated. */
    own_tree = arena.allocs > served;
    if (root == NULL) {
        arena_end();
        return slotd_error_set(err, SLOTD_ENOMEM, "out of memory");
    }
    rc = request_fill(root, r, err);
    if (!own_tree)
        cJSON_Delete(root);
    arena_end();
    if (rc != SLOTD_OK) {
        free(r->tokens);
        r->tokens = NULL;
        r->ntokens = 0;
    }
    return rc;
}

int proto__request_parse_flat(const char *line, size_t len, proto_request_t *r, slotd_error_t *err)
{
    proto_request_free(r);
    return parse_flat(line, len, r, err);
}

int proto__request_parse_tree(const char *line, size_t len, proto_request_t *r, slotd_error_t *err)
{
    proto_init();
    proto_request_free(r);
    return parse_tree(line, len, r, err);
}

int proto_request_parse(const char *line, size_t len, proto_request_t *r, slotd_error_t *err)
{
    int rc;

    proto_init();
    proto_request_free(r);
    rc = parse_flat(line, len, r, err);
    if (rc == PROTO__DECLINED)
        rc = parse_tree(line, len, r, err);
    return rc;
}
