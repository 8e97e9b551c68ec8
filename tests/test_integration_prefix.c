/*
 * test_integration_prefix.c: the prefix cache through the daemon: `cached`
 * in start replies, the `prefix_cache` object of `stats`, and
 * --prefix-cache / --prefix-scope; the blocks a session fills by appends
 * and picks, reused by a later start of its whole history and by an
 * append of another session that completes them.
 *
 * Owns nothing beyond each test's daemon and connections (tests/itest.c),
 * released at each test's end.  One thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/model.h"
#include "itest.h"

#define PROMPT 40

/* The entries a start of n tokens reuses at most: small's whole blocks
 * that end before the prompt's last position (core/model.h's block plan). */
static int64_t reused_n(uint32_t n)
{
    const model_t *m = itest_model("small");
    uint32_t pos = 0;

    for (uint32_t i = 0; pos + model_block_capacity(m, i) <= n - 1; i++)
        pos += model_block_capacity(m, i);
    return pos;
}
#define REUSED reused_n(PROMPT)

/* Starts `s` with the PROMPT tokens itest_seq_token(k0..) and checks
 * `cached`. */
static void start_from(itest_conn_t *c, itest_seq_t *s, const char *id, int64_t cached, size_t k0)
{
    snprintf(s->id, sizeof(s->id), "%s", id);
    s->model = "small";
    s->len = 0;
    for (size_t i = 0; i < PROMPT; i++)
        s->tok[s->len++] = itest_seq_token("small", i + k0);
    char *p = itest_json_tokens(s->tok, s->len);
    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"%s\",\"model\":\"small\",\"prompt\":%s}",
                         id, p);
    free(p);
    itest_expect_ok(r);
    ck_assert_int_eq(itest_int(r, "entries"), PROMPT);
    ck_assert_int_eq(itest_int(r, "cached"), cached);
    cJSON_Delete(r);
}

static void start_expect(itest_conn_t *c, itest_seq_t *s, const char *id, int64_t cached)
{
    start_from(c, s, id, cached, 7);
}

static int64_t prefix_stat(itest_conn_t *c, const char *name)
{
    cJSON *st = itest_stats(c);
    const cJSON *pc = cJSON_GetObjectItemCaseSensitive(st, "prefix_cache");
    int64_t v;

    ck_assert(cJSON_IsObject(pc));
    v = itest_int(pc, name);
    cJSON_Delete(st);
    return v;
}

/* On by default: the second start of a prompt reuses its whole blocks
 * before the last position, computes only the rest (rows), and its steps
 * are the reference's; once both finish, cache_entries and
 * pool_bytes_used are 0 while the cache keeps the blocks. */
START_TEST(test_prefix_default_on)
{
    itest_daemon_t *d = itest_daemon_start("--models", "small,tiny", NULL);
    itest_conn_t *c = itest_connect(d);
    itest_seq_t *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
    int64_t rows;

    ck_assert(a != NULL && b != NULL);
    start_expect(c, a, "a", 0);
    rows = itest_stat(c, "rows");
    start_expect(c, b, "b", REUSED);
    ck_assert_int_eq(itest_stat(c, "rows") - rows, 4 * (PROMPT - REUSED));
    itest_seq_step(c, b, 3);
    itest_seq_step(c, a, 3);
    ck_assert(memcmp(a->tok, b->tok, a->len * sizeof(int64_t)) == 0);
    ck_assert_int_eq(prefix_stat(c, "hit_entries"), REUSED);
    ck_assert_int_eq(itest_metric(d, "slotd_prefix_cache_hit_entries_total"), REUSED);
    ck_assert_int_gt(itest_metric(d, "slotd_shared_blocks"), 0);
    /* The first start looked up its first block and missed. */
    ck_assert_int_gt(prefix_stat(c, "query_entries"), REUSED);
    cJSON_Delete(itest_rpc(c, "{\"op\":\"finish\",\"id\":\"a\"}"));
    cJSON_Delete(itest_rpc(c, "{\"op\":\"finish\",\"id\":\"b\"}"));
    ck_assert_int_eq(itest_stat(c, "cache_entries"), 0);
    ck_assert_int_eq(itest_stat(c, "pool_bytes_used"), 0);
    ck_assert_int_gt(prefix_stat(c, "entries"), 0);
    /* After the holders finished: still reused. */
    start_expect(c, a, "c", REUSED);
    itest_seq_step(c, a, 2);
    free(a);
    free(b);
    itest_close(c);
}
END_TEST

/* --prefix-scope connection: another connection never shares, paired with
 * the same connection sharing; both orders of the two connections. */
START_TEST(test_prefix_scope_connection)
{
    itest_daemon_t *d =
        itest_daemon_start("--models", "small,tiny", "--prefix-scope", "connection", NULL);
    itest_conn_t *x = itest_connect(d), *y = itest_connect(d);
    itest_seq_t *s = calloc(1, sizeof(*s));

    ck_assert_ptr_nonnull(s);
    for (int order = 0; order < 2; order++) {
        itest_conn_t *first = order == 0 ? x : y, *second = order == 0 ? y : x;
        size_t k0 = order == 0 ? 7 : 500; /* a prompt of its own each round */
        char id[4][8];

        for (int i = 0; i < 4; i++)
            snprintf(id[i], sizeof(id[i]), "%c%d", 'a' + i, order);
        start_from(first, s, id[0], 0, k0);
        start_from(second, s, id[1], 0, k0);
        start_from(first, s, id[2], REUSED, k0);
        itest_seq_step(first, s, 2);
        start_from(second, s, id[3], REUSED, k0);
        itest_seq_step(second, s, 2);
    }
    free(s);
    itest_close(x);
    itest_close(y);
}
END_TEST

/* POST /prefix-cache/flush on the admin port empties the cache (with the
 * token when one is set): a start afterwards computes everything. */
START_TEST(test_prefix_flush)
{
    itest_daemon_t *d = itest_daemon_start("--models", "small,tiny", NULL);
    itest_conn_t *c = itest_connect(d);
    itest_seq_t *s = calloc(1, sizeof(*s));
    static const char req[] = "POST /prefix-cache/flush HTTP/1.1\r\nHost: x\r\n"
                              "Content-Length: 0\r\nConnection: close\r\n\r\n";
    itest_http_t r;

    ck_assert_ptr_nonnull(s);
    start_expect(c, s, "a", 0);
    cJSON_Delete(itest_rpc(c, "{\"op\":\"finish\",\"id\":\"a\"}"));
    ck_assert_int_gt(prefix_stat(c, "entries"), 0);
    ck_assert(itest_http_raw(d->admin_port, req, sizeof(req) - 1, &r));
    ck_assert_int_eq(r.status, 200);
    ck_assert_ptr_nonnull(strstr(r.body, "\"flushed_entries\":"));
    ck_assert_int_eq(atoll(strstr(r.body, ":") + 1), prefix_stat(c, "evicted_entries"));
    itest_http_free(&r);
    ck_assert_int_eq(prefix_stat(c, "entries"), 0);
    start_expect(c, s, "b", 0);
    itest_seq_step(c, s, 1);
    free(s);
    itest_close(c);
}
END_TEST

/* Starts `s` as `id` with the whole sequence of `from` as its prompt and
 * checks `cached`. */
static void start_history(itest_conn_t *c, itest_seq_t *s, const char *id,
                          const itest_seq_t *from, int64_t cached)
{
    char *p = itest_json_tokens(from->tok, from->len);
    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"%s\",\"model\":\"small\",\"prompt\":%s}",
                         id, p);

    free(p);
    itest_expect_ok(r);
    ck_assert_int_eq(itest_int(r, "entries"), (int64_t)from->len);
    ck_assert_int_eq(itest_int(r, "cached"), cached);
    cJSON_Delete(r);
    memcpy(s->tok, from->tok, from->len * sizeof(int64_t));
    s->len = from->len;
    snprintf(s->id, sizeof(s->id), "%s", id);
    s->model = "small";
}

/* The blocks a session fills by appends and by its picks are published
 * like a prompt's: a later start with the whole history (prompt, appended
 * and generated tokens) reuses every whole block before its last position,
 * while the session is live and after it finished, and every step of both
 * is the uncached reference's; both orders of what runs next. */
START_TEST(test_prefix_history)
{
    itest_daemon_t *d = itest_daemon_start("--models", "small,tiny", NULL);
    itest_conn_t *c = itest_connect(d);
    itest_seq_t *a = calloc(1, sizeof(*a)), *h = calloc(1, sizeof(*h));

    ck_assert(a != NULL && h != NULL);
    for (int order = 0; order < 2; order++) {
        size_t k0 = order == 0 ? 7 : 900;
        char ida[8], idh[8], idl[8];
        int64_t want;

        snprintf(ida, sizeof(ida), "a%d", order);
        snprintf(idh, sizeof(idh), "h%d", order);
        snprintf(idl, sizeof(idl), "l%d", order);
        start_from(c, a, ida, 0, k0);
        itest_seq_append(c, a, 30, k0 + 3000);
        itest_seq_step(c, a, 40);
        itest_seq_append(c, a, 20, k0 + 5000);
        itest_seq_step(c, a, 11);
        want = reused_n((uint32_t)a->len);
        ck_assert_int_gt(want, REUSED); /* blocks past the prompt's */
        if (order == 0) {
            /* The history while a is live, then a steps on, then h. */
            start_history(c, h, idh, a, want);
            itest_seq_step(c, a, 3);
            itest_seq_step(c, h, 3);
        } else {
            /* h first, then a, then a start after both finished. */
            start_history(c, h, idh, a, want);
            itest_seq_step(c, h, 3);
            itest_seq_step(c, a, 3);
        }
        cJSON_Delete(itest_rpc(c, "{\"op\":\"finish\",\"id\":\"%s\"}", ida));
        cJSON_Delete(itest_rpc(c, "{\"op\":\"finish\",\"id\":\"%s\"}", idh));
        /* The cache keeps them once no session holds them. */
        start_history(c, h, idl, a, reused_n((uint32_t)a->len));
        itest_seq_step(c, h, 2);
        cJSON_Delete(itest_rpc(c, "{\"op\":\"finish\",\"id\":\"%s\"}", idl));
    }
    ck_assert_int_eq(itest_stat(c, "cache_entries"), 0);
    free(a);
    free(h);
    itest_close(c);
}
END_TEST

/* --prefix-scope connection and the blocks a session filled: another
 * connection's start of the same history reuses nothing, paired with the
 * same connection's reusing them all; both orders of the two connections. */
START_TEST(test_prefix_history_scope)
{
    itest_daemon_t *d =
        itest_daemon_start("--models", "small,tiny", "--prefix-scope", "connection", NULL);
    itest_conn_t *x = itest_connect(d), *y = itest_connect(d);
    itest_seq_t *a = calloc(1, sizeof(*a)), *h = calloc(1, sizeof(*h));

    ck_assert(a != NULL && h != NULL);
    for (int order = 0; order < 2; order++) {
        itest_conn_t *own = order == 0 ? x : y, *other = order == 0 ? y : x;
        size_t k0 = order == 0 ? 11 : 700;
        char ida[8], ido[8], ids[8];

        snprintf(ida, sizeof(ida), "a%d", order);
        snprintf(ido, sizeof(ido), "o%d", order);
        snprintf(ids, sizeof(ids), "s%d", order);
        start_from(own, a, ida, 0, k0);
        itest_seq_append(own, a, 30, k0 + 3000);
        itest_seq_step(own, a, 50);
        if (order == 0) {
            start_history(other, h, ido, a, 0);
            itest_seq_step(other, h, 2);
            start_history(own, h, ids, a, reused_n((uint32_t)a->len));
            itest_seq_step(own, h, 2);
        } else {
            start_history(own, h, ids, a, reused_n((uint32_t)a->len));
            itest_seq_step(own, h, 2);
            start_history(other, h, ido, a, 0);
            itest_seq_step(other, h, 2);
        }
    }
    free(a);
    free(h);
    itest_close(x);
    itest_close(y);
}
END_TEST

#define BASE 41 /* a boundary of small's blocks (37, 41, 45 ... 69, 73) */
#define TURN 32 /* BASE + TURN = 73, the next boundary but 7 */

/* Sends an append of the TURN tokens itest_seq_token(k0..) to `s` on `c`
 * and checks the reply, `cached` included. */
static void append_expect(itest_conn_t *c, itest_seq_t *s, size_t k0, int64_t cached)
{
    int64_t toks[TURN];
    char *line = itest_seq_append_line(s, TURN, k0, toks);
    cJSON *r;

    ck_assert(itest_send_str(c, line));
    free(line);
    r = itest_read_reply(c);
    ck_assert_int_eq(itest_int(r, "cached"), cached);
    itest_seq_check_append(s, r, toks, TURN);
    cJSON_Delete(r);
}

/* The entries an append of TURN tokens after BASE reuses: small's whole
 * blocks after BASE that end before the last appended position. */
#define APPEND_REUSED (reused_n(BASE + TURN) - BASE)

/* An append looks up the prefix cache: a session whose blocks are exactly
 * full and whose next TURN tokens another session already ran (a fork of
 * it, or a start of the same prompt, whose last prompt block is its own,
 * equal to the cached one) reuses the blocks they fill but the last, and
 * `cached` counts them; every step after is the uncached reference's, and
 * the session that ran them first is unchanged; both orders of which
 * session appends first. */
START_TEST(test_prefix_append)
{
    itest_daemon_t *d = itest_daemon_start("--models", "small,tiny", NULL);
    itest_conn_t *c = itest_connect(d);
    itest_seq_t *p = calloc(1, sizeof(*p)), *a = calloc(1, sizeof(*a)),
                *b = calloc(1, sizeof(*b)), *e = calloc(1, sizeof(*e));

    ck_assert(p != NULL && a != NULL && b != NULL && e != NULL);
    ck_assert_int_gt(APPEND_REUSED, 0);
    for (int order = 0; order < 2; order++) {
        size_t k0 = order == 0 ? 20 : 2000;
        itest_seq_t *first = order == 0 ? a : b, *second = order == 0 ? b : a;
        char ida[8], idb[8], ide[8];
        cJSON *r;

        snprintf(ida, sizeof(ida), "a%d", order);
        snprintf(idb, sizeof(idb), "b%d", order);
        snprintf(ide, sizeof(ide), "e%d", order);
        p->model = "small";
        p->len = 0;
        for (size_t i = 0; i < BASE; i++)
            p->tok[p->len++] = itest_seq_token("small", k0 + i);
        start_history(c, a, ida, p, 0);
        r = itest_rpc(c, "{\"op\":\"fork\",\"id\":\"%s\",\"from\":\"%s\"}", idb, ida);
        itest_expect_ok(r);
        cJSON_Delete(r);
        *b = *a;
        snprintf(b->id, sizeof(b->id), "%s", idb);
        /* e computed its last prompt block: an equal block is cached. */
        start_history(c, e, ide, p, reused_n(BASE));

        append_expect(c, first, k0 + 500, 0);
        append_expect(c, second, k0 + 500, APPEND_REUSED);
        append_expect(c, e, k0 + 500, APPEND_REUSED);
        itest_seq_step(c, second, 5);
        itest_seq_step(c, first, 5);
        itest_seq_step(c, e, 5);
        ck_assert(memcmp(a->tok, b->tok, a->len * sizeof(int64_t)) == 0);
        ck_assert(memcmp(a->tok, e->tok, a->len * sizeof(int64_t)) == 0);
        cJSON_Delete(itest_rpc(c, "{\"op\":\"finish\",\"id\":\"%s\"}", ida));
        cJSON_Delete(itest_rpc(c, "{\"op\":\"finish\",\"id\":\"%s\"}", idb));
        cJSON_Delete(itest_rpc(c, "{\"op\":\"finish\",\"id\":\"%s\"}", ide));
    }
    ck_assert_int_eq(itest_stat(c, "cache_entries"), 0);
    free(p);
    free(a);
    free(b);
    free(e);
    itest_close(c);
}
END_TEST

/* --prefix-scope connection and appends: another connection's session
 * appending the same tokens after the same prompt reuses nothing, paired
 * with a session of the same connection reusing them; both orders of the
 * two connections. */
START_TEST(test_prefix_append_scope)
{
    itest_daemon_t *d =
        itest_daemon_start("--models", "small,tiny", "--prefix-scope", "connection", NULL);
    itest_conn_t *x = itest_connect(d), *y = itest_connect(d);
    itest_seq_t *p = calloc(1, sizeof(*p)), *s = calloc(1, sizeof(*s));

    ck_assert(p != NULL && s != NULL);
    for (int order = 0; order < 2; order++) {
        itest_conn_t *own = order == 0 ? x : y, *other = order == 0 ? y : x;
        size_t k0 = order == 0 ? 30 : 3000;
        char id[3][8];

        for (int i = 0; i < 3; i++)
            snprintf(id[i], sizeof(id[i]), "%c%d", 'a' + i, order);
        p->model = "small";
        p->len = 0;
        for (size_t i = 0; i < BASE; i++)
            p->tok[p->len++] = itest_seq_token("small", k0 + i);
        start_history(own, s, id[0], p, 0);
        append_expect(own, s, k0 + 500, 0);
        if (order == 0) {
            start_history(other, s, id[1], p, 0);
            append_expect(other, s, k0 + 500, 0);
            itest_seq_step(other, s, 2);
            start_history(own, s, id[2], p, reused_n(BASE));
            append_expect(own, s, k0 + 500, APPEND_REUSED);
            itest_seq_step(own, s, 2);
        } else {
            start_history(own, s, id[2], p, reused_n(BASE));
            append_expect(own, s, k0 + 500, APPEND_REUSED);
            itest_seq_step(own, s, 2);
            start_history(other, s, id[1], p, 0);
            append_expect(other, s, k0 + 500, 0);
            itest_seq_step(other, s, 2);
        }
    }
    free(p);
    free(s);
    itest_close(x);
    itest_close(y);
}
END_TEST

/* --prefix-cache off: nothing is reused, and the counts stay 0. */
START_TEST(test_prefix_off)
{
    itest_daemon_t *d = itest_daemon_start("--models", "small,tiny", "--prefix-cache", "off", NULL);
    itest_conn_t *c = itest_connect(d);
    itest_seq_t *s = calloc(1, sizeof(*s));

    ck_assert_ptr_nonnull(s);
    start_expect(c, s, "a", 0);
    start_expect(c, s, "b", 0);
    itest_seq_step(c, s, 2);
    ck_assert_int_eq(prefix_stat(c, "hit_entries"), 0);
    ck_assert_int_eq(prefix_stat(c, "query_entries"), 0);
    ck_assert_int_eq(prefix_stat(c, "entries"), 0);
    free(s);
    itest_close(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("integration_prefix");
    itest_add(s, "prefix_default_on", test_prefix_default_on);
    itest_add(s, "prefix_scope_connection", test_prefix_scope_connection);
    itest_add(s, "prefix_off", test_prefix_off);
    itest_add(s, "prefix_flush", test_prefix_flush);
    itest_add(s, "prefix_history", test_prefix_history);
    itest_add(s, "prefix_history_scope", test_prefix_history_scope);
    itest_add(s, "prefix_append", test_prefix_append);
    itest_add(s, "prefix_append_scope", test_prefix_append_scope);
    return itest_main(s);
}
