/*
 * test_integration_pressure.c: the cache pool under memory pressure.
 *
 * The daemon runs with a pool of 1 MiB (--cache-mb 1), which holds about
 * fifteen `small` blocks of 16 positions, or some 1800 `hash` blocks of 64.
 * The tests fill it and then check the rules of running out: a start past
 * the budget gets cache_full; a step that needs a new block gets cache_full
 * and changes nothing, so that the same session, continued once room is
 * made, gives exactly the uncached reference (model_generate with
 * use_cache=false, computed here); a step that needs several blocks when
 * only some are free takes none (all or nothing); no other session is
 * touched; finishing sessions gives their bytes back and the next start
 * succeeds; and at the end the pool is empty.
 *
 * Throughout, the test keeps its own books: the sessions it believes live,
 * their entries, and the pool bytes each holds (the change of
 * pool_bytes_used seen when it started or grew, the test being the only
 * client).  After every operation the daemon's figures must match them:
 * cache_entries, live_sessions and pool_slots_used equal the books,
 * pool_bytes_used equals the sum of the sessions' bytes, never passes
 * pool_bytes_total, a failed operation moves nothing, a finish frees
 * exactly what its session held; the stats op, the admin port's /stats and
 * /metrics (whose used and free bytes must add up to the total) agree.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "itest.h"

#define MAX_TRACKED 256

/* Deterministic prompt tokens in [0, V). */
static void make_prompt(int64_t *p, size_t n, uint32_t vocab, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (int64_t)(x % vocab);
    }
}

/* ---- The books ---- */

typedef struct tracked {
    itest_ref_t ref;
    itest_conn_t *c; /* the connection it lives on */
    int64_t bytes;   /* pool bytes it holds, as seen when it started and grew */
    bool live;
} tracked_t;

typedef struct books {
    itest_daemon_t *d;
    itest_conn_t *watch; /* asks stats; holds no session */
    int64_t total;       /* pool_bytes_total: never changes */
    tracked_t s[MAX_TRACKED];
    int n;
} books_t;

static int64_t books_bytes(const books_t *b)
{
    int64_t sum = 0;
    for (int i = 0; i < b->n; i++) {
        if (b->s[i].live) {
            sum += b->s[i].bytes;
        }
    }
    return sum;
}

static int64_t books_entries(const books_t *b)
{
    int64_t sum = 0;
    for (int i = 0; i < b->n; i++) {
        if (b->s[i].live) {
            sum += (int64_t)itest_ref_entries(&b->s[i].ref);
        }
    }
    return sum;
}

static int64_t books_live(const books_t *b)
{
    int64_t n = 0;
    for (int i = 0; i < b->n; i++) {
        n += b->s[i].live;
    }
    return n;
}

/* The value of the first sample line of /metrics that starts with `name`. */
static double metric(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; p != NULL && *p != '\0'; p = strchr(p, '\n'), p = p ? p + 1 : p) {
        if (strncmp(p, name, n) == 0 && p[n] == ' ') {
            return strtod(p + n + 1, NULL);
        }
    }
    ck_abort_msg("/metrics has no sample %s", name);
    return 0;
}

/* One stats object against the books. */
static void check_figures(const books_t *b, const cJSON *st, const char *where)
{
    int64_t total = itest_int(st, "pool_bytes_total"), used = itest_int(st, "pool_bytes_used");
    ck_assert_msg(total == b->total, "%s: pool_bytes_total changed from %lld to %lld", where,
                  (long long)b->total, (long long)total);
    ck_assert_msg(used >= 0 && used <= total, "%s: pool_bytes_used %lld is outside 0..%lld", where,
                  (long long)used, (long long)total);
    ck_assert_msg(used == books_bytes(b),
                  "%s: pool_bytes_used %lld, but the live sessions' bytes add up to %lld", where,
                  (long long)used, (long long)books_bytes(b));
    ck_assert_msg(itest_int(st, "cache_entries") == books_entries(b),
                  "%s: cache_entries %lld, the live sessions hold %lld", where,
                  (long long)itest_int(st, "cache_entries"), (long long)books_entries(b));
    ck_assert_msg(itest_int(st, "live_sessions") == books_live(b),
                  "%s: live_sessions %lld, the test knows %lld", where,
                  (long long)itest_int(st, "live_sessions"), (long long)books_live(b));
    ck_assert_msg(itest_int(st, "pool_slots_used") == books_live(b),
                  "%s: pool_slots_used %lld, the test knows %lld live sessions", where,
                  (long long)itest_int(st, "pool_slots_used"), (long long)books_live(b));
}

/* After an operation on session `idx` (-1: one that must have changed
 * nothing): credits the change of pool_bytes_used to it, then checks every
 * figure against the books, on the session port, /stats and /metrics.
 * Returns the bytes the operation took (negative: freed). */
static int64_t settle(books_t *b, int idx, const char *where)
{
    cJSON *st = itest_stats(b->watch);
    int64_t delta = itest_int(st, "pool_bytes_used") - books_bytes(b);
    if (idx < 0) {
        ck_assert_msg(delta == 0, "%s: pool_bytes_used moved by %lld", where, (long long)delta);
    } else {
        b->s[idx].bytes += delta;
    }
    check_figures(b, st, where);
    cJSON_Delete(st);

    cJSON *ad = itest_admin_stats(b->d);
    check_figures(b, ad, where);
    cJSON_Delete(ad);

    itest_http_t m;
    itest_http_get(b->d, "/metrics", &m);
    ck_assert_int_eq(m.status, 200);
    double used = metric(m.body, "slotd_pool_bytes{state=\"used\"}");
    double free_bytes = metric(m.body, "slotd_pool_bytes{state=\"free\"}");
    ck_assert_msg(used == (double)books_bytes(b) && used + free_bytes == (double)b->total,
                  "%s: /metrics says %.0f used + %.0f free, the total is %lld and the sessions "
                  "hold %lld",
                  where, used, free_bytes, (long long)b->total, (long long)books_bytes(b));
    itest_http_free(&m);
    return delta;
}

/* Opens the books on daemon `d`, started with --cache-mb `mb`. */
static void books_open(books_t *b, itest_daemon_t *d, int64_t mb)
{
    memset(b, 0, sizeof(*b));
    b->d = d;
    b->watch = itest_connect(d);
    cJSON *st = itest_stats(b->watch);
    b->total = itest_int(st, "pool_bytes_total");
    ck_assert_int_eq(b->total, mb << 20);
    ck_assert_int_eq(itest_int(st, "pool_bytes_used"), 0);
    cJSON_Delete(st);
}

/* Sends the start of a new tracked session.  Returns its index, or -1 after
 * a cache_full reply (checked: the right error, and nothing moved). */
static int try_start_ref(books_t *b, itest_conn_t *c, const itest_ref_t *ref)
{
    ck_assert_int_lt(b->n, MAX_TRACKED);
    tracked_t *t = &b->s[b->n];
    t->ref = *ref; /* takes it over */
    char *line = itest_ref_start_line(&t->ref);
    line[strlen(line) - 1] = '\0';
    cJSON *r = itest_rpc(c, "%s", line);
    free(line);
    char why[600];
    if (itest_is_error(r, "cache_full")) {
        itest_expect_error(r, NULL, "cache_full", NULL);
        cJSON_Delete(r);
        itest_ref_free(&t->ref);
        settle(b, -1, "a start that got cache_full");
        return -1;
    }
    ck_assert_msg(itest_ref_start_ok(&t->ref, r, itest_last_line(c), why, sizeof(why)), "%s", why);
    cJSON_Delete(r);
    t->c = c;
    t->live = true;
    int idx = b->n++;
    int64_t took = settle(b, idx, "after a start");
    ck_assert_msg(took > 0, "a start took %lld pool bytes", (long long)took);
    return idx;
}

static int try_start(books_t *b, itest_conn_t *c, const char *id, const char *model,
                     const int64_t *prompt, size_t n, size_t max_steps)
{
    itest_ref_t ref;
    itest_ref_init(&ref, id, model, prompt, n, max_steps);
    return try_start_ref(b, c, &ref);
}

/* Steps session `idx` by `n`.  Returns true if it stepped (checked against
 * the reference), false after cache_full (checked: nothing moved). */
static bool try_step(books_t *b, int idx, uint32_t n)
{
    tracked_t *t = &b->s[idx];
    size_t before = itest_ref_entries(&t->ref);
    cJSON *r = itest_rpc(t->c, "{\"op\":\"step\",\"id\":\"%s\",\"n\":%u}", t->ref.id, n);
    char why[600];
    if (itest_is_error(r, "cache_full")) {
        itest_expect_error(r, NULL, "cache_full", t->ref.id, NULL);
        cJSON_Delete(r);
        settle(b, -1, "a step that got cache_full");
        ck_assert_int_eq(itest_ref_entries(&t->ref), before);
        return false;
    }
    ck_assert_msg(itest_ref_step_ok(&t->ref, r, itest_last_line(t->c), n, why, sizeof(why)), "%s",
                  why);
    cJSON_Delete(r);
    settle(b, idx, "after a step");
    return true;
}

static void finish(books_t *b, int idx)
{
    tracked_t *t = &b->s[idx];
    cJSON *r = itest_rpc(t->c, "{\"op\":\"finish\",\"id\":\"%s\"}", t->ref.id);
    itest_expect_ok(r);
    ck_assert_int_eq(itest_int(r, "released"), (int64_t)itest_ref_entries(&t->ref));
    cJSON_Delete(r);
    t->live = false; /* settle() then checks that exactly its bytes came back */
    settle(b, -1, "after a finish");
}

static void books_close(books_t *b)
{
    for (int i = 0; i < b->n; i++) {
        if (b->s[i].live) {
            finish(b, i);
        }
    }
    cJSON *st = itest_stats(b->watch);
    ck_assert_int_eq(itest_int(st, "pool_bytes_used"), 0);
    ck_assert_int_eq(itest_int(st, "cache_entries"), 0);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 0);
    ck_assert_int_eq(itest_int(st, "pool_slots_used"), 0);
    cJSON_Delete(st);
    for (int i = 0; i < b->n; i++) {
        itest_ref_free(&b->s[i].ref);
    }
    itest_close(b->watch);
}

/* A stateless op under a full pool: either cache_full (and nothing moved)
 * or the uncached reference. */
static void stateless_under_pressure(books_t *b, itest_conn_t *c, bool use_cache)
{
    int64_t toks[] = {3, 1, 4, 1, 5};
    const int64_t steps = 20;
    uint32_t ref[5 + 20];
    uint32_t vocab = model_vocab(itest_model("small"));
    double *lg = malloc((size_t)steps * vocab * sizeof(double));
    ck_assert_ptr_nonnull(lg);
    itest_reference("small", toks, 5, steps, ref, lg);
    cJSON *r =
        itest_rpc(c,
                  "{\"op\":\"generate\",\"model\":\"small\",\"tokens\":[3,1,4,1,5],\"steps\":%lld,"
                  "\"use_cache\":%s}",
                  (long long)steps, use_cache ? "true" : "false");
    if (itest_error_code(r) != NULL) {
        itest_expect_error(r, NULL, "cache_full", NULL);
    } else {
        const cJSON *tk = cJSON_GetObjectItemCaseSensitive(r, "tokens");
        ck_assert(cJSON_IsArray(tk) && cJSON_GetArraySize(tk) == 25);
        for (int i = 0; i < 25; i++) {
            ck_assert_int_eq((int64_t)cJSON_GetArrayItem(tk, i)->valuedouble, ref[i]);
        }
        itest_expect_logits(itest_last_line(c), lg, (size_t)steps * vocab);
    }
    cJSON_Delete(r);
    free(lg);
    settle(b, -1, "a generate under a full pool");
}

/* The positions held by the first `k` blocks of a chain of `m`. */
static uint32_t chain_room(const model_t *m, uint32_t k)
{
    uint32_t room = 0;
    for (uint32_t i = 0; i < k; i++) {
        room += model_block_capacity(m, i);
    }
    return room;
}

START_TEST(test_pressure_small_fill_and_recover)
{
    /* Chains grow by blocks of 1, 2, 4, 8 and then 16 positions, each size
     * a class of its own.  The sessions that fill the pool have a prompt of
     * exactly P positions, where the blocks of 16 begin: every next block
     * they need is a 16-position block, one to a page, so a step of theirs
     * gets cache_full exactly when no page is free.  The sessions repeat
     * three prompts: the prefix cache, which would share their blocks, is
     * off, so that every session holds its own. */
    itest_daemon_t *d =
        itest_daemon_start("--max-connection-share", "1", "--cache-mb", "8", "--models", "small",
                           "--default-model", "small", "--threads", "2", "--prefix-cache", "off",
                           NULL);
    const model_t *m = itest_model("small");
    const uint32_t B = model_block_positions(m), V = model_vocab(m);
    uint32_t k16 = 0;
    while (model_block_capacity(m, k16) < B) {
        k16++;
    }
    const uint32_t P = chain_room(m, k16);
    ck_assert_uint_ge(B, 2);
    ck_assert_uint_ge(P, 2);
    books_t *b = calloc(1, sizeof(*b));
    ck_assert_ptr_nonnull(b);
    books_open(b, d, 8);
    itest_conn_t *a = itest_connect(d);
    itest_conn_t *other = itest_connect(d);
    int64_t *prompt = malloc((P + 1) * sizeof(int64_t));
    ck_assert_ptr_nonnull(prompt);

    /* A session on another connection with room left in its last block. */
    make_prompt(prompt, P + 1, V, 1);
    int roomy = try_start(b, other, "roomy", "small", prompt, P + 1, 8);
    ck_assert_int_ge(roomy, 0);
    ck_assert(try_step(b, roomy, 1));

    /* Sessions of P positions until a start gets cache_full.  Three
     * prompts, each reference computed once. */
    itest_ref_t like[3];
    for (int i = 0; i < 3; i++) {
        make_prompt(prompt, P, V, 100 + (uint64_t)i);
        itest_ref_init(&like[i], "like", "small", prompt, P, 2 * (size_t)B + 8);
    }
    int full[64], nfull = 0;
    for (int i = 0; i < 64; i++) {
        itest_ref_t ref;
        itest_ref_init_like(&ref, "", &like[i % 3]);
        snprintf(ref.id, sizeof(ref.id), "full%d", i);
        int idx = try_start_ref(b, a, &ref);
        if (idx < 0) {
            break;
        }
        full[nfull++] = idx;
    }
    ck_assert_msg(nfull >= 4 && nfull < 64, "%d starts of %u positions fit in 8 MiB", nfull, P);
    /* All chains alike: every such session holds the same bytes. */
    for (int i = 1; i < nfull; i++) {
        ck_assert_int_eq(b->s[full[i]].bytes, b->s[full[0]].bytes);
    }
    /* A start takes all it needs or nothing, so pages may be left: starts
     * of one position (one block of 1, one state) take them, until one
     * fails too; after that at most one page can be free (a start that
     * needed a page for its block and one for its state), which full0
     * takes by growing one block of 16.  Then no page is free. */
    itest_ref_t one;
    make_prompt(prompt, 1, V, 9);
    itest_ref_init(&one, "one", "small", prompt, 1, 1);
    int nsmall = 0;
    for (;;) {
        itest_ref_t ref;
        itest_ref_init_like(&ref, "", &one);
        snprintf(ref.id, sizeof(ref.id), "one%d", nsmall);
        if (try_start_ref(b, other, &ref) < 0) {
            break;
        }
        ck_assert_int_lt(++nsmall, MAX_TRACKED - 80);
    }
    int grown = 0;
    while (try_step(b, full[0], B)) {
        ck_assert_int_lt(++grown, 2);
    }
    /* A step needing a new block: cache_full, the session as it was, and
     * again (the failure had no side effect). */
    for (int i = 1; i < nfull && i < 4; i++) {
        ck_assert(!try_step(b, full[i], 1));
        ck_assert(!try_step(b, full[i], 1));
        ck_assert(!try_step(b, full[i], 2 * B));
    }
    /* Starts past the budget: cache_full, on either connection. */
    make_prompt(prompt, P, V, 7);
    ck_assert_int_lt(try_start(b, a, "late", "small", prompt, P, 8), 0);
    ck_assert_int_lt(try_start(b, other, "late", "small", prompt, P, 8), 0);
    /* The session with room is untouched and still steps, to the reference. */
    ck_assert(try_step(b, roomy, 2));
    /* Stateless ops borrow from the same pool: cache_full or right. */
    stateless_under_pressure(b, other, true);
    stateless_under_pressure(b, other, false);

    /* Room comes back with a finish: exactly the bytes of the session. */
    finish(b, full[nfull - 1]);
    /* The sessions whose steps failed go on as if nothing had happened:
     * their next picks are the reference's (position P + 1 onwards). */
    ck_assert(try_step(b, full[1], 1));
    ck_assert(try_step(b, full[1], 3));
    /* With one more finish, the start that failed succeeds. */
    finish(b, full[nfull - 2]);
    int late = try_start(b, a, "late", "small", prompt, P, 8);
    ck_assert_int_ge(late, 0);
    ck_assert(try_step(b, late, 4));
    for (int i = 2; i < nfull - 2 && i < 4; i++) {
        while (!try_step(b, full[i], 1)) {
            /* Each failure here means the pool is full again: make room. */
            int victim = full[nfull - 3];
            ck_assert(b->s[victim].live);
            finish(b, victim);
            nfull--;
        }
    }
    ck_assert(try_step(b, roomy, 1));
    books_close(b);
    free(b);
    for (int i = 0; i < 3; i++) {
        itest_ref_free(&like[i]);
    }
    itest_ref_free(&one);
    free(prompt);
    itest_close(a);
    itest_close(other);
}
END_TEST

START_TEST(test_pressure_hash_all_or_nothing)
{
    /* hash: blocks of 30 to 254 positions, max_ctx 4096: a step of n=4095
     * needs every block of the chain but the first at once. */
    itest_daemon_t *d =
        itest_daemon_start("--max-connection-share", "1", "--cache-mb", "1", "--models", "hash",
                           "--default-model", "hash", "--threads", "2", NULL);
    const model_t *m = itest_model("hash");
    const uint32_t V = model_vocab(m), C = model_max_ctx(m);
    books_t *b = calloc(1, sizeof(*b));
    ck_assert_ptr_nonnull(b);
    books_open(b, d, 1);
    itest_conn_t *c = itest_connect(d);
    int64_t prompt[4];
    int idx[64], n = 0, failed = -1;
    /* Three prompts, each reference computed once. */
    itest_ref_t like[3];
    for (int i = 0; i < 3; i++) {
        make_prompt(prompt, 1, V, 200 + (uint64_t)i);
        itest_ref_init(&like[i], "like", "hash", prompt, 1, C - 1);
    }
    for (int i = 0; i < 64; i++) {
        char id[32];
        snprintf(id, sizeof(id), "h%d", i);
        itest_ref_t ref;
        itest_ref_init_like(&ref, id, &like[i % 3]);
        int k = try_start_ref(b, c, &ref);
        if (k < 0) {
            break;
        }
        idx[n++] = k;
        if (!try_step(b, k, C - 1)) {
            failed = k; /* some blocks were free, not 63: it took none */
            break;
        }
    }
    ck_assert_msg(failed >= 0, "1 MiB held %d full hash sessions", n);
    ck_assert_int_eq(itest_ref_entries(&b->s[failed].ref), 1);
    /* The free blocks are still there: the session grows one block at a
     * time (blocks of growing capacity, a class each) until the next one
     * it needs is not to be had, each step the reference's. */
    uint32_t k = 0, entries = 1;
    ck_assert(try_step(b, failed, model_block_capacity(m, 0) - 1)); /* fills its first block */
    entries = model_block_capacity(m, 0);
    while (try_step(b, failed, model_block_capacity(m, ++k))) {
        entries += model_block_capacity(m, k);
        ck_assert_uint_lt(k, 64);
    }
    ck_assert_msg(k > 1, "no block was free after the all-or-nothing step failed");
    ck_assert_int_eq(itest_ref_entries(&b->s[failed].ref), entries);
    /* Again: the failure changed nothing.  A finish makes room for it. */
    ck_assert(!try_step(b, failed, model_block_capacity(m, k)));
    finish(b, idx[0]);
    ck_assert(try_step(b, failed, model_block_capacity(m, k)));
    books_close(b);
    free(b);
    for (int i = 0; i < 3; i++) {
        itest_ref_free(&like[i]);
    }
    itest_close(c);
}
END_TEST

/* Eight connections, five hash sessions each, pipelining steps of n=256 (4
 * blocks) at once until the pool's bytes run out in the middle of the race
 * (40 sessions of up to 3841 entries need more than 1 MiB).  Each
 * reply is either the reference's next 256 picks or cache_full; the daemon's
 * figures then match the books; half the connections finish their sessions,
 * the others reset, and the pool drains to 0. */
START_TEST(test_pressure_race)
{
    enum { NCONN = 8, NSESS = 5, ROUNDS = 15, N = 256 };
    itest_daemon_t *d =
        itest_daemon_start("--max-connection-share", "1", "--cache-mb", "1", "--models", "hash",
                           "--default-model", "hash", "--threads", "2", NULL);
    const uint32_t V = model_vocab(itest_model("hash"));
    itest_conn_t *watch = itest_connect(d);
    itest_conn_t *c[NCONN];
    itest_ref_t *ref = calloc(NCONN * NSESS, sizeof(*ref));
    ck_assert_ptr_nonnull(ref);
    itest_ref_t like[5]; /* five prompts, each reference computed once */
    for (int i = 0; i < 5; i++) {
        int64_t p[1];
        make_prompt(p, 1, V, 300 + (uint64_t)i);
        itest_ref_init(&like[i], "like", "hash", p, 1, ROUNDS * N);
    }
    for (int i = 0; i < NCONN; i++) {
        c[i] = itest_connect(d);
        for (int j = 0; j < NSESS; j++) {
            char id[16];
            snprintf(id, sizeof(id), "r%d", j);
            itest_ref_t *r = &ref[i * NSESS + j];
            itest_ref_init_like(r, id, &like[(i * NSESS + j) % 5]);
            char *line = itest_ref_start_line(r);
            ck_assert(itest_send_str(c[i], line));
            free(line);
        }
    }
    /* The whole race goes out before any reply is read. */
    for (int i = 0; i < NCONN; i++) {
        char *buf = malloc(ROUNDS * NSESS * 64);
        size_t o = 0;
        for (int k = 0; k < ROUNDS; k++) {
            for (int j = 0; j < NSESS; j++) {
                o += (size_t)sprintf(buf + o, "{\"op\":\"step\",\"id\":\"r%d\",\"n\":%d}\n", j, N);
            }
        }
        ck_assert(itest_send(c[i], buf, o));
        free(buf);
    }
    int ok = 0, full = 0;
    char why[600];
    for (int i = 0; i < NCONN; i++) {
        for (int j = 0; j < NSESS; j++) {
            cJSON *r = itest_read_reply(c[i]);
            ck_assert_msg(
                itest_ref_start_ok(&ref[i * NSESS + j], r, itest_last_line(c[i]), why, sizeof(why)),
                "%s", why);
            cJSON_Delete(r);
        }
        for (int k = 0; k < ROUNDS; k++) {
            for (int j = 0; j < NSESS; j++) {
                cJSON *r = itest_read_reply(c[i]);
                if (itest_is_error(r, "cache_full")) {
                    itest_expect_error(r, NULL, "cache_full", ref[i * NSESS + j].id, NULL);
                    full++;
                } else {
                    ck_assert_msg(itest_ref_step_ok(&ref[i * NSESS + j], r, itest_last_line(c[i]),
                                                    N, why, sizeof(why)),
                                  "connection %d: %s", i, why);
                    ok++;
                }
                cJSON_Delete(r);
            }
        }
    }
    ck_assert_msg(full > 0 && ok > 0, "the race had %d steps and %d cache_full", ok, full);
    int64_t entries = 0;
    for (int i = 0; i < NCONN * NSESS; i++) {
        entries += (int64_t)itest_ref_entries(&ref[i]);
    }
    cJSON *st = itest_stats(watch);
    ck_assert_int_eq(itest_int(st, "cache_entries"), entries);
    ck_assert_int_eq(itest_int(st, "live_sessions"), NCONN * NSESS);
    ck_assert_int_le(itest_int(st, "pool_bytes_used"), itest_int(st, "pool_bytes_total"));
    fprintf(stderr,
            "pressure race: %d steps of n=%d served, %d cache_full, %lld entries, "
            "%lld of %lld pool bytes used\n",
            ok, N, full, (long long)entries, (long long)itest_int(st, "pool_bytes_used"),
            (long long)itest_int(st, "pool_bytes_total"));
    cJSON_Delete(st);

    /* Half finish (released = their entries), half reset. */
    for (int i = 0; i < NCONN; i++) {
        if (i % 2 == 0) {
            for (int j = 0; j < NSESS; j++) {
                cJSON *r = itest_rpc(c[i], "{\"op\":\"finish\",\"id\":\"r%d\"}", j);
                ck_assert_int_eq(itest_int(r, "released"),
                                 (int64_t)itest_ref_entries(&ref[i * NSESS + j]));
                cJSON_Delete(r);
            }
            itest_close(c[i]);
        } else {
            itest_close_reset(c[i]);
        }
    }
    st = itest_await_drained(watch, 10000);
    ck_assert_int_eq(itest_int(st, "released.finish"), NCONN / 2 * NSESS);
    ck_assert_int_eq(itest_int(st, "released.disconnect"), NCONN / 2 * NSESS);
    cJSON_Delete(st);
    for (int i = 0; i < NCONN * NSESS; i++) {
        itest_ref_free(&ref[i]);
    }
    for (int i = 0; i < 5; i++) {
        itest_ref_free(&like[i]);
    }
    free(ref);
    itest_close(watch);
}
END_TEST

START_TEST(test_pressure_max_sessions)
{
    /* The other budget: --max-sessions.  The start past it is cache_full;
     * a finish or a closed connection makes room at once. */
    itest_daemon_t *d =
        itest_daemon_start("--max-connection-share", "1", "--max-sessions", "3", NULL);
    itest_conn_t *c1 = itest_connect(d), *c2 = itest_connect(d);
    const char *ok[] = {"{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1]}",
                        "{\"op\":\"start\",\"id\":\"b\",\"prompt\":[2]}"};
    for (int i = 0; i < 2; i++) {
        cJSON *r = itest_rpc(c1, "%s", ok[i]);
        itest_expect_ok(r);
        cJSON_Delete(r);
    }
    cJSON *r = itest_rpc(c2, "{\"op\":\"start\",\"id\":\"a\",\"prompt\":[3]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    for (int i = 0; i < 3; i++) {
        r = itest_rpc(i % 2 ? c1 : c2, "{\"op\":\"start\",\"id\":\"z\",\"prompt\":[1]}");
        itest_expect_error(r, NULL, "cache_full", NULL);
        cJSON_Delete(r);
    }
    ck_assert_int_eq(itest_stat(c1, "live_sessions"), 3);
    r = itest_rpc(c1, "{\"op\":\"finish\",\"id\":\"b\"}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    int64_t p[] = {4, 5};
    itest_session_t z;
    itest_session_init(&z, "z", "tiny", p, 2);
    itest_session_start(c2, &z);
    itest_session_step(c2, &z, 3);
    r = itest_rpc(c1, "{\"op\":\"start\",\"id\":\"y\",\"prompt\":[1]}");
    itest_expect_error(r, NULL, "cache_full", NULL);
    cJSON_Delete(r);
    itest_close(c2); /* two sessions go with it */
    itest_conn_t *watch = itest_connect(d);
    for (int i = 0; i < 500 && itest_stat(watch, "live_sessions") != 1; i++) {
        itest_sleep_ms(10);
    }
    r = itest_rpc(c1, "{\"op\":\"start\",\"id\":\"y\",\"prompt\":[1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    itest_session_free(&z);
    itest_close(c1);
    cJSON_Delete(itest_await_drained(watch, 5000));
    itest_close(watch);
}
END_TEST

/* One connection's share (--max-connection-share 0.5, the default): a
 * connection that starts `small` sessions until it is refused holds about
 * half the pool and is told its share is used up, while a second
 * connection still starts and steps sessions; when the first goes, the
 * figures come back to the second's, then to zero. */
START_TEST(test_pressure_connection_share)
{
    /* Without the prefix cache: the figures are those of sessions that
     * each hold their own blocks. */
    itest_daemon_t *d = itest_daemon_start("--cache-mb", "8", "--models", "small",
                                           "--default-model", "small", "--prefix-cache", "off",
                                           NULL);
    const model_t *m = itest_model("small");
    const uint64_t half = (uint64_t)8 << 19;
    itest_conn_t *a = itest_connect(d), *b = itest_connect(d);
    int n = 0;
    for (;; n++) {
        cJSON *r =
            itest_rpc(a, "{\"op\":\"start\",\"id\":\"a%d\",\"prompt\":[1,2,3,4,5,6,7,8]}", n);
        bool full = cJSON_GetObjectItemCaseSensitive(r, "error") != NULL;
        if (full)
            itest_expect_error(r, NULL, "cache_full", "connection's", "share", NULL);
        cJSON_Delete(r);
        if (full)
            break;
        ck_assert_int_lt(n, 100000);
    }
    /* It holds its share, counted in the pool's bytes: blocks and state,
     * each at its 64-byte stride. */
    size_t chain = 0;
    model_chain_blocks(m, 8, 64, &chain);
    uint64_t each = chain + ((model_state_size(m) + 63) & ~(size_t)63);
    ck_assert_uint_eq((uint64_t)itest_stat(b, "pool_bytes_used"), (uint64_t)n * each);
    ck_assert_uint_le((uint64_t)n * each, half);
    ck_assert_uint_gt((uint64_t)(n + 1) * each, half);
    cJSON *st = itest_stats(b);
    int64_t used = itest_int(st, "pool_bytes_used");
    ck_assert_int_lt(used, itest_int(st, "pool_bytes_total"));
    cJSON_Delete(st);
    /* A step of its own is refused for the same reason, and changes nothing. */
    cJSON *r = itest_rpc(a, "{\"op\":\"step\",\"id\":\"a0\",\"n\":%u}", model_max_ctx(m) - 8);
    itest_expect_error(r, NULL, "cache_full", "connection's", "share", NULL);
    cJSON_Delete(r);

    /* The other connection works: starts, steps, finishes. */
    for (int i = 0; i < 8; i++) {
        r = itest_rpc(b, "{\"op\":\"start\",\"id\":\"b%d\",\"prompt\":[1,2,3,4,5,6,7,8]}", i);
        ck_assert_msg(itest_int(r, "entries") == 8, "b%d: %s", i, itest_last_line(b));
        cJSON_Delete(r);
        r = itest_rpc(b, "{\"op\":\"step\",\"id\":\"b%d\",\"n\":4}", i);
        ck_assert_msg(itest_int(r, "entries") == 12, "b%d: %s", i, itest_last_line(b));
        cJSON_Delete(r);
    }
    st = itest_stats(b);
    ck_assert_int_eq(itest_int(st, "live_sessions"), n + 8);
    cJSON_Delete(st);

    /* The first connection goes: its share comes back. */
    itest_close(a);
    for (int tries = 0;; tries++) {
        st = itest_stats(b);
        int64_t live = itest_int(st, "live_sessions");
        cJSON_Delete(st);
        if (live == 8)
            break;
        ck_assert_int_lt(tries, itest_scale_ms(5000) / 10);
        itest_sleep_ms(10);
    }
    for (int i = 0; i < 8; i++) {
        r = itest_rpc(b, "{\"op\":\"finish\",\"id\":\"b%d\"}", i);
        ck_assert_int_eq(itest_int(r, "released"), 12);
        cJSON_Delete(r);
    }
    st = itest_stats(b);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 0);
    ck_assert_int_eq(itest_int(st, "cache_entries"), 0);
    ck_assert_int_eq(itest_int(st, "pool_bytes_used"), 0);
    cJSON_Delete(st);
    itest_close(b);
}
END_TEST

/* --max-sessions-per-connection, and the share of --max-sessions. */
START_TEST(test_pressure_sessions_per_connection)
{
    itest_daemon_t *d = itest_daemon_start("--max-sessions-per-connection", "3", NULL);
    itest_conn_t *a = itest_connect(d), *b = itest_connect(d);
    for (int i = 0; i < 4; i++) {
        cJSON *r = itest_rpc(a, "{\"op\":\"start\",\"id\":\"s%d\",\"prompt\":[1]}", i);
        if (i < 3)
            ck_assert_int_eq(itest_int(r, "entries"), 1);
        else
            itest_expect_error(r, NULL, "cache_full", "connection's", "share", "3", NULL);
        cJSON_Delete(r);
    }
    cJSON *r = itest_rpc(b, "{\"op\":\"start\",\"id\":\"s0\",\"prompt\":[1]}");
    ck_assert_int_eq(itest_int(r, "entries"), 1);
    cJSON_Delete(r);
    /* A finish makes room on the connection at once. */
    r = itest_rpc(a, "{\"op\":\"finish\",\"id\":\"s0\"}");
    cJSON_Delete(r);
    r = itest_rpc(a, "{\"op\":\"start\",\"id\":\"s9\",\"prompt\":[1]}");
    ck_assert_int_eq(itest_int(r, "entries"), 1);
    cJSON_Delete(r);
    itest_close(a);
    itest_close(b);
    itest_daemon_stop(d);

    /* --max-sessions 10 at the default share: 5 a connection. */
    d = itest_daemon_start("--max-sessions", "10", NULL);
    a = itest_connect(d);
    for (int i = 0; i < 6; i++) {
        r = itest_rpc(a, "{\"op\":\"start\",\"id\":\"s%d\",\"prompt\":[1]}", i);
        if (i < 5)
            ck_assert_int_eq(itest_int(r, "entries"), 1);
        else
            itest_expect_error(r, NULL, "cache_full", "connection's", "share", NULL);
        cJSON_Delete(r);
    }
    itest_close(a);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("integration_pressure");
    ITEST_ADD(s, test_pressure_small_fill_and_recover);
    ITEST_ADD(s, test_pressure_hash_all_or_nothing);
    ITEST_ADD(s, test_pressure_race);
    ITEST_ADD(s, test_pressure_max_sessions);
    ITEST_ADD(s, test_pressure_connection_share);
    ITEST_ADD(s, test_pressure_sessions_per_connection);
    return itest_main(s);
}
