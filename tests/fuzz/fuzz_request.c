/*
 * fuzz_request.c: the fuzz harness of the request parser and validator and
 * of the reply writers.
 *
 * An input is one line.  It is parsed, and then:
 *   - an error has one of the three codes a line can earn, a message that
 *     names what it should, no tokens left behind, and a tag only if the
 *     line was JSON; its error reply is checked like any other reply;
 *   - an accepted request holds only valid values (an id of 1-64 allowed
 *     characters, a model of 1-32 or none, a non-empty token list, n >= 1,
 *     steps >= 0), is written back as a canonical line that must parse to
 *     the same request, and every reply kind is written from it;
 *   - every reply is exactly one line, valid UTF-8, one JSON object that
 *     cJSON reads back, echoing the tag as the request carried it;
 *   - every eight bytes of the input, read as a double, print through
 *     proto__fmt6() exactly as through snprintf("%.6f");
 *   - the parser's two paths agree: the line parsed by the tree path alone
 *     (the UTF-8 and syntax checks, then cJSON) gives the same code, the
 *     same message and the same request, every member of it, as
 *     proto_request_parse(); and the one-pass path alone either declines
 *     the line, touching nothing, or gives that same result.  So does the
 *     canonical line of an accepted request.
 * Memory never runs out here, so SLOTD_ENOMEM from the parser means it took
 * a line that cJSON then refused: a bug.
 */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "proto/proto.h"
#include "proto/proto_int.h"
#include "tests/fuzz/fuzz.h"

/* Checks the reply at b->data + from and returns the parsed object. */
static cJSON *check_reply(const proto_buf_t *b, size_t from, const char *tag)
{
    const char *s = b->data + from;
    size_t n = b->len - from;
    const cJSON *m;
    cJSON *j;

    FUZZ_CHECK(n >= 3 && s[0] == '{' && s[n - 1] == '\n');
    FUZZ_CHECK(memchr(s, '\n', n) == s + n - 1);
    FUZZ_CHECK(proto__utf8_scan(s, n) == n);
    j = cJSON_ParseWithLength(s, n);
    FUZZ_CHECK(j != NULL && cJSON_IsObject(j));
    m = cJSON_GetObjectItemCaseSensitive(j, "tag");
    if (tag == NULL) {
        FUZZ_CHECK(m == NULL);
    } else {
        cJSON *want = cJSON_Parse(tag);
        FUZZ_CHECK(want != NULL);
        FUZZ_CHECK(m != NULL && cJSON_Compare(m, want, 1));
        cJSON_Delete(want);
    }
    return j;
}

static int name_ok(const char *s, size_t max)
{
    size_t n = strlen(s);

    if (n < 1 || n > max)
        return 0;
    return strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-") == n;
}

static void check_fmt6(const uint8_t *data, size_t size)
{
    for (size_t i = 0; i + 8 <= size && i < 256; i += 8) {
        char got[PROTO__FMT6_MAX], want[PROTO__FMT6_MAX];
        double v;
        memcpy(&v, data + i, sizeof(v));
        proto__fmt6(got, v);
        snprintf(want, sizeof(want), "%.6f", v);
        FUZZ_CHECK(strcmp(got, want) == 0);
    }
}

/* The same code, the same error (code and message) if it is one, and the
 * same request, member by member. */
static void check_same(int rc_a, const proto_request_t *a, const slotd_error_t *ea, int rc_b,
                       const proto_request_t *b, const slotd_error_t *eb)
{
    FUZZ_CHECK(rc_a == rc_b);
    if (rc_a != SLOTD_OK) {
        FUZZ_CHECK(ea->code == eb->code);
        FUZZ_CHECK(strcmp(ea->message, eb->message) == 0);
    }
    FUZZ_CHECK(a->op == b->op);
    FUZZ_CHECK((a->tag == NULL) == (b->tag == NULL));
    FUZZ_CHECK(a->tag == NULL || strcmp(a->tag, b->tag) == 0);
    FUZZ_CHECK(strcmp(a->id, b->id) == 0);
    FUZZ_CHECK(strcmp(a->model, b->model) == 0);
    FUZZ_CHECK(a->ntokens == b->ntokens);
    FUZZ_CHECK((a->tokens == NULL) == (b->tokens == NULL));
    FUZZ_CHECK(a->ntokens == 0 ||
               memcmp(a->tokens, b->tokens, a->ntokens * sizeof(*a->tokens)) == 0);
    FUZZ_CHECK(a->steps == b->steps);
    FUZZ_CHECK(a->use_cache == b->use_cache);
    FUZZ_CHECK(a->n == b->n);
}

/* Parses the line with each path alone and checks both against what
 * proto_request_parse() gave (`rc`, `r`, `err`). */
static void check_paths(const char *line, size_t len, int rc, const proto_request_t *r,
                        const slotd_error_t *err)
{
    proto_request_t other;
    slotd_error_t e;
    int rc2;

    proto_request_init(&other);
    memset(&e, 0, sizeof(e));
    rc2 = proto__request_parse_tree(line, len, &other, &e);
    check_same(rc, r, err, rc2, &other, &e);

    memset(&e, 0, sizeof(e));
    rc2 = proto__request_parse_flat(line, len, &other, &e);
    if (rc2 == PROTO__DECLINED) {
        proto_request_t empty;
        slotd_error_t none;
        proto_request_init(&empty);
        memset(&none, 0, sizeof(none));
        check_same(SLOTD_OK, &other, &e, SLOTD_OK, &empty, &none);
        FUZZ_CHECK(e.code == 0 && e.message[0] == '\0');
    } else {
        check_same(rc, r, err, rc2, &other, &e);
    }
    proto_request_free(&other);
    {
        /* Freed, a request is byte for byte a new one (proto_request_free()
         * puts back only what a parse can have stored). */
        proto_request_t blank;
        proto_request_init(&blank);
        FUZZ_CHECK(memcmp(&other, &blank, sizeof(blank)) == 0);
    }
}

/* Writes `r` back as a line and checks that it parses to the same. */
/* Appends what snprintf() wrote to `num`, which must have been all of it. */
static void append_num(proto_buf_t *b, const char *num, size_t cap, int k)
{
    FUZZ_CHECK(k > 0 && (size_t)k < cap);
    FUZZ_CHECK(proto_buf_append(b, num, (size_t)k) == SLOTD_OK);
}

static void check_round_trip(const proto_request_t *r)
{
    proto_buf_t b;
    proto_request_t again;
    slotd_error_t err;
    char num[64];

    proto_buf_init(&b);
    FUZZ_CHECK(proto_buf_append(&b, "{\"op\":\"", 7) == SLOTD_OK);
    FUZZ_CHECK(proto_buf_append(&b, proto_op_name(r->op), strlen(proto_op_name(r->op))) ==
               SLOTD_OK);
    FUZZ_CHECK(proto_buf_append(&b, "\"", 1) == SLOTD_OK);
    if (r->tag != NULL) {
        FUZZ_CHECK(proto_buf_append(&b, ",\"tag\":", 7) == SLOTD_OK);
        FUZZ_CHECK(proto_buf_append(&b, r->tag, strlen(r->tag)) == SLOTD_OK);
    }
    if (r->id[0] != '\0') {
        FUZZ_CHECK(proto_buf_append(&b, ",\"id\":", 6) == SLOTD_OK);
        FUZZ_CHECK(proto__put_json_string(&b, r->id, strlen(r->id)) == SLOTD_OK);
    }
    if (r->model[0] != '\0') {
        FUZZ_CHECK(proto_buf_append(&b, ",\"model\":", 9) == SLOTD_OK);
        FUZZ_CHECK(proto__put_json_string(&b, r->model, strlen(r->model)) == SLOTD_OK);
    }
    if (r->tokens != NULL) {
        const char *key = r->op == PROTO_OP_START ? ",\"prompt\":[" : ",\"tokens\":[";
        FUZZ_CHECK(proto_buf_append(&b, key, strlen(key)) == SLOTD_OK);
        for (size_t i = 0; i < r->ntokens; i++) {
            int k = snprintf(num, sizeof(num), "%s%" PRId64, i > 0 ? "," : "", r->tokens[i]);
            append_num(&b, num, sizeof(num), k);
        }
        FUZZ_CHECK(proto_buf_append(&b, "]", 1) == SLOTD_OK);
    }
    if (r->op == PROTO_OP_STEP) {
        int k = snprintf(num, sizeof(num), ",\"n\":%" PRIu32, r->n);
        append_num(&b, num, sizeof(num), k);
    }
    if (r->op == PROTO_OP_GENERATE) {
        int k = snprintf(num, sizeof(num), ",\"steps\":%" PRId64 ",\"use_cache\":%s", r->steps,
                         r->use_cache ? "true" : "false");
        append_num(&b, num, sizeof(num), k);
    }
    FUZZ_CHECK(proto_buf_append(&b, "}", 1) == SLOTD_OK);

    proto_request_init(&again);
    memset(&err, 0, sizeof(err));
    FUZZ_CHECK(proto_request_parse(b.data, b.len, &again, &err) == SLOTD_OK);
    check_paths(b.data, b.len, SLOTD_OK, &again, &err);
    FUZZ_CHECK(again.op == r->op);
    FUZZ_CHECK((again.tag == NULL) == (r->tag == NULL));
    FUZZ_CHECK(r->tag == NULL || strcmp(again.tag, r->tag) == 0);
    FUZZ_CHECK(strcmp(again.id, r->id) == 0);
    FUZZ_CHECK(strcmp(again.model, r->model) == 0);
    FUZZ_CHECK(again.ntokens == r->ntokens);
    FUZZ_CHECK(r->ntokens == 0 ||
               memcmp(again.tokens, r->tokens, r->ntokens * sizeof(*r->tokens)) == 0);
    FUZZ_CHECK(again.n == r->n);
    FUZZ_CHECK(again.steps == r->steps);
    FUZZ_CHECK(again.use_cache == r->use_cache);
    proto_request_free(&again);
    proto_buf_free(&b);
}

/* Every reply kind, from values taken from the request and the input. */
static void check_replies(const proto_request_t *r, const uint8_t *data, size_t size)
{
    enum { V = 6, ROWS = 3 };
    proto_buf_t b;
    uint32_t toks[8];
    double logits[ROWS * V];
    size_t ntoks = r->ntokens < 8 ? r->ntokens : 8;
    uint32_t n = ntoks > 0 ? (uint32_t)(ntoks < ROWS ? ntoks : ROWS) : 1;
    const char *id = r->id[0] != '\0' ? r->id : "a";
    const char *model = r->model[0] != '\0' ? r->model : "tiny";
    proto_stats_t st;
    slotd_error_t err;
    size_t from;
    cJSON *j;

    for (size_t i = 0; i < 8; i++)
        toks[i] = i < ntoks ? (uint32_t)r->tokens[i] : (uint32_t)i;
    for (size_t i = 0; i < ROWS * V; i++) {
        uint64_t bits = 0;
        /* Some logits are the input's own bytes as doubles (any value,
         * infinities and NaNs included), the others ordinary. */
        if (size >= 8 * (i + 1)) {
            memcpy(&bits, data + 8 * i, 8);
            memcpy(&logits[i], &bits, sizeof(bits));
        } else {
            logits[i] = (double)(int64_t)(toks[i % 8] * 2654435761u) / 1e6;
        }
    }
    memset(&st, 0, sizeof(st));
    st.cache_entries = r->ntokens;
    st.rows = (uint64_t)r->steps;
    st.threads = r->n;

    proto_buf_init(&b);
    from = b.len;
    FUZZ_CHECK(proto_reply_start(&b, r->tag, id, model, (uint32_t)r->ntokens, 0) == SLOTD_OK);
    cJSON_Delete(check_reply(&b, from, r->tag));
    from = b.len;
    FUZZ_CHECK(proto_reply_step(&b, r->tag, id, toks, n, logits, V, r->n) == SLOTD_OK);
    j = check_reply(&b, from, r->tag);
    FUZZ_CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(j, "logits")) == (int)n);
    cJSON_Delete(j);
    from = b.len;
    FUZZ_CHECK(proto_reply_step(&b, r->tag, id, toks, n, NULL, V, r->n) == SLOTD_OK);
    j = check_reply(&b, from, r->tag);
    FUZZ_CHECK(cJSON_GetObjectItem(j, "logits") == NULL);
    cJSON_Delete(j);
    from = b.len;
    FUZZ_CHECK(proto_reply_finish(&b, r->tag, id, r->n) == SLOTD_OK);
    cJSON_Delete(check_reply(&b, from, r->tag));
    from = b.len;
    FUZZ_CHECK(proto_reply_logits(&b, r->tag, logits, V, (uint64_t)r->steps) == SLOTD_OK);
    cJSON_Delete(check_reply(&b, from, r->tag));
    from = b.len;
    FUZZ_CHECK(proto_reply_generate(&b, r->tag, toks, ntoks, logits, n, V, 99) == SLOTD_OK);
    cJSON_Delete(check_reply(&b, from, r->tag));
    from = b.len;
    FUZZ_CHECK(proto_reply_stats(&b, r->tag, &st) == SLOTD_OK);
    cJSON_Delete(check_reply(&b, from, r->tag));

    /* An error whose message is the raw input, cut to fit: any bytes. */
    err.code = SLOTD_EUNKNOWN_ID;
    memset(err.message, 0, sizeof(err.message));
    memcpy(err.message, data, size < sizeof(err.message) - 1 ? size : sizeof(err.message) - 1);
    from = b.len;
    FUZZ_CHECK(proto_reply_error(&b, r->tag, &err) == SLOTD_OK);
    cJSON_Delete(check_reply(&b, from, r->tag));
    proto_buf_free(&b);
}

static void check_accepted(const proto_request_t *r)
{
    FUZZ_CHECK(r->op > PROTO_OP_NONE && r->op < PROTO_OP__COUNT);
    FUZZ_CHECK(r->model[0] == '\0' || name_ok(r->model, PROTO_MODEL_MAX));
    switch (r->op) {
    case PROTO_OP_START:
    case PROTO_OP_STEP:
    case PROTO_OP_FINISH:
    case PROTO_OP_APPEND:
    case PROTO_OP_FORK:
        FUZZ_CHECK(name_ok(r->id, PROTO_ID_MAX));
        break;
    case PROTO_OP_LOGITS:
    case PROTO_OP_GENERATE:
    case PROTO_OP_STATS:
    case PROTO_OP_AUTH:
    case PROTO_OP_NONE:
    case PROTO_OP__COUNT: /* refused above */
        FUZZ_CHECK(r->id[0] == '\0');
        break;
    }
    switch (r->op) {
    case PROTO_OP_START:
    case PROTO_OP_LOGITS:
    case PROTO_OP_GENERATE:
    case PROTO_OP_APPEND:
        FUZZ_CHECK(r->ntokens > 0 && r->tokens != NULL);
        for (size_t i = 0; i < r->ntokens; i++)
            FUZZ_CHECK(r->tokens[i] >= -INT64_C(9007199254740992) &&
                       r->tokens[i] <= INT64_C(9007199254740992));
        break;
    case PROTO_OP_STEP:
    case PROTO_OP_FINISH:
    case PROTO_OP_FORK:
    case PROTO_OP_STATS:
    case PROTO_OP_AUTH:
    case PROTO_OP_NONE:
    case PROTO_OP__COUNT:
        FUZZ_CHECK(r->ntokens == 0 && r->tokens == NULL);
        break;
    }
    FUZZ_CHECK(r->n >= 1);
    FUZZ_CHECK(r->steps >= 0);
    FUZZ_CHECK(r->op == PROTO_OP_GENERATE || !r->use_cache);
}

static void check_error(const proto_request_t *r, int rc, const slotd_error_t *err)
{
    static const char *const fields[] = {"`tag`",    "`id`", "`model`", "`prompt`",
                                         "`tokens`", "`n`",  "`steps`", "`use_cache`"};
    int named = 0;

    FUZZ_CHECK(rc == SLOTD_EBAD_JSON || rc == SLOTD_EUNKNOWN_OP || rc == SLOTD_EBAD_REQUEST);
    FUZZ_CHECK(err->code == rc);
    FUZZ_CHECK(memchr(err->message, '\0', sizeof(err->message)) != NULL);
    FUZZ_CHECK(r->tokens == NULL && r->ntokens == 0);
    if (rc == SLOTD_EBAD_JSON)
        FUZZ_CHECK(r->tag == NULL);
    if (rc == SLOTD_EUNKNOWN_OP)
        FUZZ_CHECK(strstr(err->message, "`op`") != NULL);
    if (rc == SLOTD_EBAD_REQUEST) {
        for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
            named |= strstr(err->message, fields[i]) != NULL;
        FUZZ_CHECK(named);
        FUZZ_CHECK(r->op != PROTO_OP_NONE);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    proto_request_t r;
    slotd_error_t err;
    int rc;

    check_fmt6(data, size);

    proto_request_init(&r);
    memset(&err, 0, sizeof(err));
    rc = proto_request_parse((const char *)data, size, &r, &err);
    FUZZ_CHECK(rc != SLOTD_ENOMEM);
    check_paths((const char *)data, size, rc, &r, &err);
    if (rc == SLOTD_OK) {
        check_accepted(&r);
        check_round_trip(&r);
        check_replies(&r, data, size);
    } else {
        proto_buf_t b;
        check_error(&r, rc, &err);
        proto_buf_init(&b);
        FUZZ_CHECK(proto_reply_error(&b, r.tag, &err) == SLOTD_OK);
        cJSON_Delete(check_reply(&b, 0, r.tag));
        proto_buf_free(&b);
    }
    proto_request_free(&r);
    return 0;
}
