/*
 * scan.c: the reply scanner of scan.h.  It understands just enough JSON to
 * skip any value (strings with escapes, numbers, literals, nested arrays and
 * objects) and to pick out the top-level members a reply may carry.  It does
 * not validate string escapes or UTF-8; --verify mode additionally parses
 * every line with cJSON for that.
 */
#include "scan.h"

#include <string.h>

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')) {
        p++;
    }
    return p;
}

/* p at the opening quote; returns the position after the closing quote. */
static const char *skip_string(const char *p, const char *end)
{
    p++;
    while (p < end) {
        if (*p == '\\') {
            p += 2;
            continue;
        }
        if (*p == '"') {
            return p + 1;
        }
        p++;
    }
    return NULL;
}

/* The bytes that mean something inside an array or object; runs of any
 * other byte (the digits, signs and commas of the logits) are passed over
 * in a tight loop, which is most of what the scanner does with a reply. */
static const bool structural[256] = {['"'] = true, ['['] = true, [']'] = true,
                                     ['{'] = true, ['}'] = true};

static const char *skip_value(const char *p, const char *end)
{
    int depth = 0;

    if (p >= end) {
        return NULL;
    }
    if (*p == '"') {
        return skip_string(p, end);
    }
    if (*p != '[' && *p != '{') {
        const char *start = p;
        while (p < end &&
               (((unsigned char)*p >= '0' && (unsigned char)*p <= '9') || *p == '-' || *p == '+' ||
                *p == '.' || *p == 'e' || *p == 'E' || (*p >= 'a' && *p <= 'z'))) {
            p++;
        }
        return p == start ? NULL : p;
    }
    while (p < end) {
        while (!structural[(unsigned char)*p]) {
            if (++p == end) {
                return NULL;
            }
        }
        switch (*p) {
        case '"':
            p = skip_string(p, end);
            if (p == NULL) {
                return NULL;
            }
            continue;
        case '[':
        case '{':
            depth++;
            break;
        case ']':
        case '}':
            if (--depth == 0) {
                return p + 1;
            }
            break;
        default:
            break;
        }
        p++;
    }
    return NULL;
}

static bool key_is(const char *k, size_t n, const char *lit)
{
    size_t l = strlen(lit);
    return n == l && memcmp(k, lit, l) == 0;
}

static span_t value_span(const char *v, const char *after)
{
    span_t s;

    if (*v == '"') {
        /* An empty string keeps p non-NULL with n 0: present but empty. */
        s.p = v + 1;
        s.n = (size_t)(after - v) - 2;
    } else {
        s.p = v;
        s.n = (size_t)(after - v);
    }
    return s;
}

/* Walks the members of the object at p ('{'); calls back with key and value. */
typedef void (*member_fn)(void *ctx, const char *key, size_t klen, const char *v,
                          const char *after);

static const char *walk_object(const char *p, const char *end, member_fn fn, void *ctx)
{
    p = skip_ws(p, end);
    if (p >= end || *p != '{') {
        return NULL;
    }
    p = skip_ws(p + 1, end);
    if (p < end && *p == '}') {
        return p + 1;
    }
    for (;;) {
        const char *k;
        const char *kend;
        const char *v;
        const char *after;

        if (p >= end || *p != '"') {
            return NULL;
        }
        k = p + 1;
        kend = skip_string(p, end);
        if (kend == NULL) {
            return NULL;
        }
        p = skip_ws(kend, end);
        if (p >= end || *p != ':') {
            return NULL;
        }
        v = skip_ws(p + 1, end);
        after = skip_value(v, end);
        if (after == NULL) {
            return NULL;
        }
        fn(ctx, k, (size_t)(kend - 1 - k), v, after);
        p = skip_ws(after, end);
        if (p < end && *p == ',') {
            p = skip_ws(p + 1, end);
            continue;
        }
        if (p < end && *p == '}') {
            return p + 1;
        }
        return NULL;
    }
}

static void error_member(void *ctx, const char *key, size_t klen, const char *v, const char *after)
{
    scan_reply_t *r = ctx;

    if (*v != '"') {
        return;
    }
    if (key_is(key, klen, "code")) {
        r->error_code = value_span(v, after);
    } else if (key_is(key, klen, "message")) {
        r->error_msg = value_span(v, after);
    }
}

static void reply_member(void *ctx, const char *key, size_t klen, const char *v, const char *after)
{
    scan_reply_t *r = ctx;

    switch (klen) {
    case 2:
        if (key_is(key, klen, "id")) {
            r->id = value_span(v, after);
        } else if (key_is(key, klen, "ok")) {
            r->ok = value_span(v, after);
        }
        break;
    case 3:
        if (key_is(key, klen, "tag")) {
            r->tag = value_span(v, after);
        }
        break;
    case 5:
        if (key_is(key, klen, "model")) {
            r->model = value_span(v, after);
        } else if (key_is(key, klen, "error")) {
            r->has_error = true;
            if (*v == '{') {
                (void)walk_object(v, after, error_member, r);
            }
        }
        break;
    case 6:
        if (key_is(key, klen, "tokens")) {
            r->tokens = value_span(v, after);
        } else if (key_is(key, klen, "logits")) {
            r->logits = value_span(v, after);
        } else if (key_is(key, klen, "cached")) {
            r->cached = value_span(v, after);
        }
        break;
    case 7:
        if (key_is(key, klen, "entries")) {
            r->entries = value_span(v, after);
        }
        break;
    case 8:
        if (key_is(key, klen, "released")) {
            r->released = value_span(v, after);
        }
        break;
    default:
        break;
    }
}

int scan_reply(const char *line, size_t len, scan_reply_t *r)
{
    const char *end = line + len;
    const char *p;

    memset(r, 0, sizeof(*r));
    p = walk_object(line, end, reply_member, r);
    if (p == NULL) {
        return -1;
    }
    p = skip_ws(p, end);
    return p == end ? 0 : -1;
}

int scan_int(span_t s, int64_t *out)
{
    int64_t v = 0;
    size_t i = 0;
    bool neg = false;

    if (s.p == NULL || s.n == 0) {
        return -1;
    }
    if (s.p[0] == '-') {
        neg = true;
        i = 1;
    }
    if (i == s.n || s.n - i > 18) {
        return -1;
    }
    for (; i < s.n; i++) {
        if (s.p[i] < '0' || s.p[i] > '9') {
            return -1;
        }
        v = v * 10 + (s.p[i] - '0');
    }
    *out = neg ? -v : v;
    return 0;
}

bool scan_eq(span_t s, const char *lit)
{
    size_t l = strlen(lit);
    return s.p != NULL && s.n == l && memcmp(s.p, lit, l) == 0;
}

int scan_iter_init(scan_iter_t *it, span_t arr)
{
    if (arr.p == NULL || arr.n < 2 || arr.p[0] != '[' || arr.p[arr.n - 1] != ']') {
        return -1;
    }
    it->p = skip_ws(arr.p + 1, arr.p + arr.n - 1);
    it->end = arr.p + arr.n - 1;
    return 0;
}

int scan_iter_next(scan_iter_t *it, span_t *elem)
{
    const char *after;

    if (it->p >= it->end) {
        return 0;
    }
    after = skip_value(it->p, it->end);
    if (after == NULL) {
        return -1;
    }
    elem->p = it->p;
    elem->n = (size_t)(after - it->p);
    it->p = skip_ws(after, it->end);
    if (it->p < it->end) {
        if (*it->p != ',') {
            return -1;
        }
        it->p = skip_ws(it->p + 1, it->end);
        if (it->p >= it->end) {
            return -1; /* trailing comma */
        }
    }
    return 1;
}
