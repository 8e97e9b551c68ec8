/*
 * ops.c: the op table: for each op its wire name, its members (required or
 * optional, in the order their errors win) and whether it runs on a
 * worker; for each member its name, type, limits, place in the request
 * and the words of its errors.  Both request paths and every error message
 * read these rows, so a rule is written once, here.  Constant data, read
 * by any thread; the member-name index is built once, under proto_init()'s
 * pthread_once, before any parse reads it.
 *
 * Adding an op: a value of proto_op_t (proto.h), a row below, a reply
 * writer (reply.c) and its run function in server/.
 *
 * Design: docs/design.md, "Parsing a request line".
 */
#include "proto/parse__internal.h"

#include <assert.h>
#include <stddef.h>

#define OP(nm, worker, ...)                                                                        \
    {                                                                                              \
        .name = nm, .len = sizeof(nm) - 1, .on_worker = worker,                                    \
        .nmembers = sizeof((proto_member_t[]){__VA_ARGS__}) / sizeof(proto_member_t),              \
        .members = {__VA_ARGS__},                                                                  \
    }
#define REQ(f) {PROTO_FIELD_##f, true}
#define OPT(f) {PROTO_FIELD_##f, false}

const proto_op_def_t proto_ops[PROTO_OP__COUNT] = {
    [PROTO_OP_NONE] = {.name = "none", .len = 4},
    [PROTO_OP_START] = OP("start", true, REQ(ID), OPT(MODEL), REQ(PROMPT)),
    [PROTO_OP_STEP] = OP("step", true, REQ(ID), OPT(N)),
    [PROTO_OP_FINISH] = OP("finish", false, REQ(ID)),
    [PROTO_OP_LOGITS] = OP("logits", true, REQ(TOKENS), OPT(MODEL)),
    [PROTO_OP_GENERATE] = OP("generate", true, REQ(TOKENS), REQ(STEPS), OPT(USE_CACHE), OPT(MODEL)),
    [PROTO_OP_STATS] = {.name = "stats", .len = 5},
    [PROTO_OP_AUTH] = OP("auth", false, REQ(TOKEN)),
};

#define AT(m) offsetof(proto_request_t, m)
#define NAME_MUST(max) "must be a string of 1-" #max " characters from [A-Za-z0-9_.:-]"

const proto_field_def_t proto_fields[PROTO_FIELD__COUNT] = {
    [PROTO_FIELD_TAG] = {"tag", 3, PROTO_TYPE_TAG, .must = "must be a string or an integer"},
    [PROTO_FIELD_OP] = {"op", 2, PROTO_TYPE_OP},
    [PROTO_FIELD_ID] = {"id", 2, PROTO_TYPE_NAME, 1, PROTO_ID_MAX, AT(id), .must = NAME_MUST(64),
                        .missing = "is required"},
    [PROTO_FIELD_MODEL] = {"model", 5, PROTO_TYPE_NAME, 1, PROTO_MODEL_MAX, AT(model),
                           .must = NAME_MUST(32)},
    [PROTO_FIELD_PROMPT] = {"prompt", 6, PROTO_TYPE_INTS, .at = AT(tokens), .at_len = AT(ntokens),
                            .must = "must be a non-empty array of integers"},
    [PROTO_FIELD_TOKENS] = {"tokens", 6, PROTO_TYPE_INTS, .at = AT(tokens), .at_len = AT(ntokens),
                            .must = "must be a non-empty array of integers"},
    [PROTO_FIELD_N] = {"n", 1, PROTO_TYPE_INT, 1, UINT32_MAX, AT(n), .width = 4,
                       .must = "must be an integer from 1 to 4294967295"},
    [PROTO_FIELD_STEPS] = {"steps", 5, PROTO_TYPE_INT, 0, INT64_MAX, AT(steps), .width = 8,
                           .must = "must be a non-negative integer",
                           .missing = "is required (a non-negative integer)"},
    [PROTO_FIELD_USE_CACHE] = {"use_cache", 9, PROTO_TYPE_BOOL, .at = AT(use_cache),
                               .must = "must be true or false"},
    [PROTO_FIELD_TOKEN] = {"token", 5, PROTO_TYPE_BYTES, 1, PROTO_AUTH_TOKEN_MAX, AT(token),
                           AT(token_len), .must = "must be a string of 1-4096 bytes",
                           .missing = "is required"},
};

_Static_assert(PROTO_ID_MAX == 64 && PROTO_MODEL_MAX == 32 && PROTO_AUTH_TOKEN_MAX == 4096,
               "the limits are spelled out in the error words above");

const char *proto_op_name(proto_op_t op)
{
    if ((unsigned)op >= PROTO_OP__COUNT)
        return "none";
    return proto_ops[op].name;
}

bool proto_op_on_worker(proto_op_t op)
{
    return (unsigned)op < PROTO_OP__COUNT && proto_ops[op].on_worker;
}

unsigned char proto__field_first[PROTO__FIELD_INDEX_LEN][32];
unsigned char proto__field_next[PROTO_FIELD__COUNT];
unsigned char proto__op_first[PROTO__FIELD_INDEX_LEN][32];
unsigned char proto__op_next[PROTO_OP__COUNT];

void proto__ops_init(void)
{
    for (int k = PROTO_FIELD__COUNT - 1; k >= 0; k--) {
        const proto_field_def_t *d = &proto_fields[k];
        unsigned char *slot;
        assert(strlen(d->name) == d->len && d->len > 0 && d->len < PROTO__FIELD_INDEX_LEN);
        slot = &proto__field_first[d->len][d->name[0] & 31];
        proto__field_next[k] = *slot;
        *slot = (unsigned char)(k + 1);
    }
    /* Ops by their own number (PROTO_OP_NONE, 0, is no op). */
    for (int k = PROTO_OP__COUNT - 1; k > PROTO_OP_NONE; k--) {
        const proto_op_def_t *d = &proto_ops[k];
        unsigned char *slot;
        assert(strlen(d->name) == d->len && d->len > 0 && d->len < PROTO__FIELD_INDEX_LEN);
        slot = &proto__op_first[d->len][d->name[0] & 31];
        proto__op_next[k] = *slot;
        *slot = (unsigned char)k;
    }
}
