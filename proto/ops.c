/*
 * ops.c: the op table: for each op its wire name, what it acts on (a new
 * session, an open one, none, the connection's order, the connection), its
 * members (required or optional, in the order their errors win) and
 * whether it runs on a worker; for each member its name, type, limits,
 * place in the request and the words of its errors.  Both request paths and every error message
 * read these rows, so a rule is written once, here.  Constant data, read
 * by any thread; the member-name index is built once, under proto_init()'s
 * pthread_once, before any parse reads it.
 *
 * Adding an op: a value of proto_op_t (proto.h), a row below, a reply
 * writer (reply.c) and its run function in server/job.c; the server
 * applies it by its kind.
 *
 * Design: docs/design.md, "Parsing a request line".
 */
#include "proto/parse_int.h"

#include <assert.h>
#include <stddef.h>

#define OP(nm, kd, worker, ...) OP_ROW(nm, kd, worker, false, __VA_ARGS__)
/* An op that also takes the decoding controls. */
#define OP_DECODING(nm, kd, worker, ...) OP_ROW(nm, kd, worker, true, __VA_ARGS__)
#define OP_ROW(nm, kd, worker, dec, ...)                                                           \
    {                                                                                              \
        .name = nm, .len = sizeof(nm) - 1, .kind = PROTO_KIND_##kd, .on_worker = worker,           \
        .decodes = dec,                                                                            \
        .nmembers = sizeof((proto_member_t[]){__VA_ARGS__}) / sizeof(proto_member_t),              \
        .members = {__VA_ARGS__},                                                                  \
    }
#define REQ(f) {PROTO_FIELD_##f, true}
#define OPT(f) {PROTO_FIELD_##f, false}

const proto_op_def_t proto_ops[PROTO_OP__COUNT] = {
    [PROTO_OP_NONE] = {.name = "none", .len = 4, .kind = PROTO_KIND_NONE, .on_worker = false},
    [PROTO_OP_START] = OP("start", OPEN, true, REQ(ID), OPT(MODEL), REQ(PROMPT)),
    [PROTO_OP_STEP] = OP_DECODING("step", SESSION, true, REQ(ID), OPT(N)),
    [PROTO_OP_FINISH] = OP("finish", SESSION, false, REQ(ID)),
    [PROTO_OP_LOGITS] = OP("logits", STATELESS, true, REQ(TOKENS), OPT(MODEL)),
    [PROTO_OP_GENERATE] =
        OP_DECODING("generate", STATELESS, true, REQ(TOKENS), REQ(STEPS), OPT(USE_CACHE),
                    OPT(MODEL)),
    [PROTO_OP_STATS] = {.name = "stats", .len = 5, .kind = PROTO_KIND_BARRIER}, /* no members */
    [PROTO_OP_AUTH] = OP("auth", CONN, false, REQ(TOKEN)),
    [PROTO_OP_APPEND] = OP("append", SESSION, true, REQ(ID), REQ(TOKENS)),
    [PROTO_OP_FORK] = OP("fork", BRANCH, true, REQ(ID), REQ(FROM)),
};

#define AT(m) offsetof(proto_request_t, m)
/* PROTO__INT_LIMIT: integers beyond it are no integers on the wire. */
#define INT_LIMIT "9007199254740992"
#define NAME_MUST(max) "must be a string of 1-" #max " characters from [A-Za-z0-9_.:-]"

#define FIELD(nm, ty, ...) {.name = nm, .len = sizeof(nm) - 1, .type = ty, __VA_ARGS__}

const proto_field_def_t proto_fields[PROTO_FIELD__COUNT] = {
    [PROTO_FIELD_TAG] =
        FIELD("tag", PROTO_TYPE_TAG,
              .must = "must be a string or an integer from -" INT_LIMIT " to " INT_LIMIT),
    [PROTO_FIELD_OP] = FIELD("op", PROTO_TYPE_OP, .must = "must be a string"),
    [PROTO_FIELD_ID] = FIELD("id", PROTO_TYPE_NAME, .lo = 1, .hi = PROTO_ID_MAX, .at = AT(id),
                             .must = NAME_MUST(64), .missing = "is required"),
    [PROTO_FIELD_MODEL] = FIELD("model", PROTO_TYPE_NAME, .lo = 1, .hi = PROTO_MODEL_MAX,
                                .at = AT(model), .must = NAME_MUST(32)),
    [PROTO_FIELD_PROMPT] = FIELD("prompt", PROTO_TYPE_INTS, .at = AT(tokens), .at_len = AT(ntokens),
                                 .must = "must be a non-empty array of integers"),
    [PROTO_FIELD_TOKENS] = FIELD("tokens", PROTO_TYPE_INTS, .at = AT(tokens), .at_len = AT(ntokens),
                                 .must = "must be a non-empty array of integers"),
    [PROTO_FIELD_N] = FIELD("n", PROTO_TYPE_INT, .lo = 1, .hi = UINT32_MAX, .at = AT(n), .width = 4,
                            .must = "must be an integer from 1 to 4294967295"),
    [PROTO_FIELD_STEPS] = FIELD("steps", PROTO_TYPE_INT, .lo = 0, .hi = INT64_MAX, .at = AT(steps),
                                .width = 8, .must = "must be an integer from 0 to " INT_LIMIT,
                                .missing = "is required (an integer from 0 to " INT_LIMIT ")"),
    [PROTO_FIELD_USE_CACHE] = FIELD("use_cache", PROTO_TYPE_BOOL, .at = AT(use_cache),
                                    .must = "must be true or false"),
    [PROTO_FIELD_TOKEN] = FIELD("token", PROTO_TYPE_BYTES, .lo = 1, .hi = PROTO_AUTH_TOKEN_MAX,
                                .at = AT(token), .at_len = AT(token_len),
                                .must = "must be a string of 1-4096 bytes", .missing = "is required"),
    /* The decoding controls: decode.c reads each value and words its
     * errors; `must` is what it says of a value of the wrong kind. */
    [PROTO_FIELD_SAMPLE] = FIELD("sample", PROTO_TYPE_SAMPLE, .at = AT(dec),
                                 .must = "must be an object {temperature, top_k, top_p, seed}"),
    [PROTO_FIELD_STOP] = FIELD("stop", PROTO_TYPE_STOP, .at = AT(dec),
                               .must = "must be an array of at most 16 tokens"),
    [PROTO_FIELD_SCORES] = FIELD("scores", PROTO_TYPE_SCORES, .at = AT(dec),
                                 .must = "must be \"all\", \"none\" or an integer >= 1"),
    [PROTO_FIELD_FROM] = FIELD("from", PROTO_TYPE_NAME, .lo = 1, .hi = PROTO_ID_MAX, .at = AT(from),
                               .must = NAME_MUST(64), .missing = "is required"),
};

_Static_assert(PROTO_ID_MAX == 64 && PROTO_MODEL_MAX == 32 && PROTO_AUTH_TOKEN_MAX == 4096 &&
                   (long long)PROTO__INT_LIMIT == 9007199254740992LL,
               "the limits are spelled out in the error words above");

const char *proto_op_name(proto_op_t op)
{
    if ((unsigned)op >= PROTO_OP__COUNT)
        return "none";
    return proto_ops[op].name;
}


unsigned char proto__field_first[PROTO__FIELD_INDEX_LEN][32];
unsigned char proto__field_next[PROTO_FIELD__COUNT];
uint64_t proto__field_word[PROTO_FIELD__COUNT];
uint64_t proto__name_mask[9];
unsigned char proto__op_first[PROTO__FIELD_INDEX_LEN][32];
unsigned char proto__op_next[PROTO_OP__COUNT];

void proto__ops_init(void)
{
    for (size_t n = 0; n <= 8; n++) {
        unsigned char bytes[8] = {0};
        memset(bytes, 0xFF, n);
        memcpy(&proto__name_mask[n], bytes, 8);
    }
    for (int k = PROTO_FIELD__COUNT - 1; k >= 0; k--) {
        const proto_field_def_t *d = &proto_fields[k];
        unsigned char *slot;
        assert(strlen(d->name) == d->len && d->len > 0 && d->len < PROTO__FIELD_INDEX_LEN);
        slot = &proto__field_first[d->len][d->name[0] & 31];
        proto__field_next[k] = *slot;
        *slot = (unsigned char)(k + 1);
        if (d->len <= 8) {
            unsigned char bytes[8] = {0};
            memcpy(bytes, d->name, d->len);
            memcpy(&proto__field_word[k], bytes, 8);
        }
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
