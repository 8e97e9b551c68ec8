/*
 * request.c: proto_request_parse(), from one line to a validated request:
 * the driver that runs the stages of a line in order, the tree path it
 * falls back to, proto_init(), and a request's life (init, free).
 *
 * A line is read by one of two paths that give the same result on every
 * input, both driven by the op table (ops.c) through one rule set
 * (rules.c): the one-pass path (flat.c), which takes the usual requests
 * without building a tree and declines any other line before changing
 * anything, and the tree path here (UTF-8 scan, strict syntax check with
 * scan_int.h, then cJSON), which reads every line, and so makes every error.
 * Each path only reads the line into values (proto__value_t); the driver
 * then hands them to the rules, so a line enters each file once.
 *
 * Threads.  Any thread may parse.  cJSON's allocations during a parse are
 * cut from a bump arena of the parsing thread (arena.c; thread-local, so
 * no lock).
 *
 * Design: docs/design.md, "Parsing a request line".
 */
#include "proto/scan_int.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* A JSON number with an integral value within +-2^53.  (Literals that a
 * double would misjudge were replaced before cJSON saw them.) */
static bool json_int(const cJSON *it, int64_t *out)
{
    double v;
    int64_t i;

    if (!cJSON_IsNumber(it))
        return false;
    v = it->valuedouble;
    if (!(v >= -PROTO__INT_LIMIT && v <= PROTO__INT_LIMIT))
        return false;
    i = (int64_t)v;
    if ((double)i != v)
        return false;
    *out = i;
    return true;
}

/* The proto__ints_reader of the tree path: the integers of a cJSON array
 * that tree_value() found to hold only integers. */
static void tree_ints(const void *first, int64_t *out, size_t n)
{
    const cJSON *el = first;

    for (size_t k = 0; k < n; k++, el = el->next) {
        bool ok = json_int(el, &out[k]);
        assert(ok);
        (void)ok;
    }
}

/* Member `it` of field `k` as the rules see it. */
static void tree_value(const cJSON *it, int k, proto__value_t *v)
{
    v->kind = PROTO__OTHER;
    if (cJSON_IsString(it)) {
        v->kind = PROTO__STRING;
        v->s = it->valuestring;
        v->len = strlen(it->valuestring);
    } else if (json_int(it, &v->v)) {
        v->kind = PROTO__INT;
    } else if (cJSON_IsBool(it)) {
        v->kind = cJSON_IsTrue(it) ? PROTO__TRUE : PROTO__FALSE;
    } else if (cJSON_IsArray(it) && proto_fields[k].type == PROTO_TYPE_INTS) {
        int64_t x;
        v->kind = PROTO__INTS;
        v->ints = NULL;
        v->tree = it->child;
        v->n = 0;
        v->bad = SIZE_MAX;
        for (const cJSON *el = it->child; el != NULL; el = el->next, v->n++) {
            if (v->bad == SIZE_MAX && !json_int(el, &x))
                v->bad = v->n;
        }
        if (v->bad == SIZE_MAX)
            v->bad = v->n;
    }
}

/* The JSON text of the value of the `index`-th member (0-based, duplicates
 * counted) of the object that the syntax-checked line holds: the tree
 * path's way to the text of a member cJSON read.  False if there are not
 * that many. */
static bool member_span(const char *line, size_t len, size_t index, const char **s, size_t *n)
{
    proto__scan_t j = {.s = (const unsigned char *)line, .n = len};
    size_t k = 0;

    proto__scan_ws(&j);
    if (j.i >= j.n || j.s[j.i] != '{')
        return false;
    j.i++;
    for (;;) {
        size_t b;

        proto__scan_ws(&j);
        if (j.i >= j.n || j.s[j.i] != '"')
            return false;
        (void)json_scan_string(&j);
        proto__scan_ws(&j);
        j.i++; /* ':' */
        proto__scan_ws(&j);
        b = j.i;
        (void)proto__scan_value(&j, 1);
        if (k++ == index) {
            *s = line + b;
            *n = j.i - b;
            return true;
        }
        proto__scan_ws(&j);
        if (j.i >= j.n || j.s[j.i++] != ',')
            return false;
    }
}

/* The request from the tree of a line: the tag first, so that even an
 * unknown_op reply can echo it; then the rules. */
static int tree_fill(const cJSON *root, const char *line, size_t len, proto_request_t *r,
                     slotd_error_t *err)
{
    proto__value_t f[PROTO_FIELD__COUNT];
    size_t index = 0;

    for (int k = 0; k < PROTO_FIELD__COUNT; k++)
        f[k].kind = PROTO__ABSENT;
    for (const cJSON *it = root->child; it != NULL; it = it->next, index++) {
        size_t n = strlen(it->string);
        int k = proto__field_index(it->string, n, n + 1);
        if (k < 0 || f[k].kind != PROTO__ABSENT)
            continue;
        /* A decoding control is read from the line's own text: the
         * members of the tree are those of the line, in its order. */
        if (proto__is_raw(k) && member_span(line, len, index, &f[k].s, &f[k].len))
            f[k].kind = PROTO__RAW;
        else
            tree_value(it, k, &f[k]);
    }
    return proto__request_fill(f, tree_ints, r, err);
}

/* ---- The tree path and the entry points ---- */

/* The tree path, on a request as proto_request_init() left it. */
static int parse_tree(const char *line, size_t len, proto_request_t *r, slotd_error_t *err)
{
    proto__scan_t j = {.s = (const unsigned char *)line, .n = len};
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
    if ((rc = proto__scan_line(&j, err)) != SLOTD_OK)
        return rc;

    proto__arena_begin();
    if (j.rewrites > 0) {
        char *copy;
        if (j.rewrites > (SIZE_MAX - len - 1) / PROTO__NUMBER_GROWTH ||
            (copy = proto__arena_alloc(len + j.rewrites * PROTO__NUMBER_GROWTH + 1)) == NULL) {
            proto__arena_end();
            return slotd_error_set(err, SLOTD_ENOMEM, "out of memory");
        }
        j = (proto__scan_t){.s = (const unsigned char *)line, .n = len, .out = copy};
        rc = proto__scan_line(&j, err);
        assert(rc == SLOTD_OK && j.outlen <= len + j.rewrites * PROTO__NUMBER_GROWTH);
        text = copy;
        textlen = j.outlen;
    }

    /* The line is known to be one well-formed object, so cJSON can only fail
     * for want of memory. */
    served = proto__arena_allocs();
    root = cJSON_ParseWithLengthOpts(text, textlen, NULL, 0);
    /* When the arena served none of the tree, cJSON's hooks are not ours
     * (something replaced them): the tree is freed as it was allocated. */
    own_tree = proto__arena_allocs() > served;
    if (root == NULL) {
        proto__arena_end();
        return slotd_error_set(err, SLOTD_ENOMEM, "out of memory");
    }
    rc = tree_fill(root, line, len, r, err);
    if (!own_tree)
        cJSON_Delete(root);
    proto__arena_end();
    if (rc != SLOTD_OK) {
        free(r->tokens);
        r->tokens = NULL;
        r->ntokens = 0;
    }
    return rc;
}

/* The one-pass path: its read, then the rules (inline in the entry: its
 * call cost a step line 2 % of its parse).  PROTO__DECLINED, with `r`
 * as it was, for a line the read leaves or the rules refuse: the tree path
 * makes every error. */
static inline __attribute__((always_inline)) int parse_flat(const char *line, size_t len,
                                                            proto_request_t *r, slotd_error_t *err)
{
    proto__value_t f[PROTO_FIELD__COUNT];
    proto__flat_ints_t t;
    slotd_error_t e;
    int rc = PROTO__DECLINED;

    if (proto__flat_read(line, len, f, &t) == 0) {
        rc = proto__request_fill(f, NULL, r, &e);
        if (rc == SLOTD_ENOMEM) {
            *err = e;
        } else if (rc != SLOTD_OK) {
            proto_request_free(r);
            rc = PROTO__DECLINED;
        }
    }
    if (t.v != t.local)
        free(t.v);
    return rc;
}

int proto__request_parse_flat(const char *line, size_t len, proto_request_t *r, slotd_error_t *err)
{
    proto_init();
    proto_request_free(r);
    return parse_flat(line, len, r, err);
}

int proto__request_parse_tree(const char *line, size_t len, proto_request_t *r, slotd_error_t *err)
{
    proto_init();
    proto_request_free(r);
    return parse_tree(line, len, r, err);
}

/* The stages in order, each file entered once: flat.c (or, for a line it
 * leaves, the UTF-8 and syntax checks inline and the tree), then rules.c. */
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

/* ---- The module's start and a request's life ---- */

static pthread_once_t init_once_flag = PTHREAD_ONCE_INIT;

/* Set once init_once() is done: the parse's own call skips pthread_once. */
static atomic_bool init_done;

static void init_once(void)
{
    proto__ops_init();
    proto__json_hooks_install();
    atomic_store_explicit(&init_done, true, memory_order_release);
}

void proto_init(void)
{
    if (!atomic_load_explicit(&init_done, memory_order_acquire))
        pthread_once(&init_once_flag, init_once);
}

void proto_request_init(proto_request_t *r)
{
    memset(r, 0, sizeof(*r));
    r->op = PROTO_OP_NONE;
    r->n = 1;
}

/* Zeroes a name of a request (`size` bytes) that name_copy() wrote, 16
 * bytes at a time up to the block that holds its NUL: every byte past the
 * NUL is 0 already. */
static inline void name_clear(char *c, size_t size)
{
    size_t k = 0;

    for (; k + 16 <= size; k += 16) {
        bool done = c[k + 15] == '\0';
        memset(c + k, 0, 16);
        if (done)
            return;
    }
    memset(c + k, 0, size - k);
}

/* Only proto__request_fill() writes a request, and it stores nothing but
 * the tag before r->op is set, and the name members (id, model) with
 * name_copy(), which leaves every byte past the name's NUL 0.  So a request
 * with no op holds at most a tag, and a name is cleared up to its NUL: a
 * step's request is put back with a few stores rather than all of it.  A
 * new member of proto_request_t is put back here too. */
void proto_request_free(proto_request_t *r)
{
    if (r->tag != NULL) {
        free(r->tag);
        r->tag = NULL;
    }
    if (r->op == PROTO_OP_NONE)
        return;
    if (r->tokens != NULL) {
        free(r->tokens);
        r->tokens = NULL;
    }
    if (r->token != NULL) {
        free(r->token);
        r->token = NULL;
    }
    if (r->dec.set)
        memset(&r->dec, 0, sizeof(r->dec));
    name_clear(r->id, sizeof(r->id));
    name_clear(r->model, sizeof(r->model));
    r->ntokens = 0;
    r->token_len = 0;
    r->steps = 0;
    r->use_cache = false;
    r->n = 1;
    r->op = PROTO_OP_NONE;
}
