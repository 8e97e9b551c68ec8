/*
 * test_session_map.c: the Check suite of server/session_map.c, the
 * per-connection map of session ids: insert, find, remove, growth and
 * shrinking over many ids, iteration (also removing as it goes), ids that
 * differ only in their last byte or length, long random sequences checked
 * against a plain array, and the same with a weak hash that makes ids
 * collide (in every bit, or in a few values, or in slots that wrap around
 * the end of the array), so that the probe runs, the id comparison behind
 * a full-hash match and the backward shift of removal are all exercised.
 */
#include "test_util.h"
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/session_map.h"

/* A node and its id in one allocation, as the server's record keeps them. */
static session_map_node_t *node_new(const char *id)
{
    session_map_node_t *n = calloc(1, sizeof(*n) + PROTO_ID_MAX + 1);
    char *copy = (char *)(n + 1);
    ck_assert_ptr_nonnull(n);
    snprintf(copy, PROTO_ID_MAX + 1, "%s", id);
    n->id = copy;
    return n;
}

START_TEST(test_insert_find_remove)
{
    session_map_t m;
    session_map_node_t *a = node_new("a"), *b = node_new("b"), *c = node_new("a.b:c-d_9");

    ck_assert_int_eq(session_map_init(&m), 0);
    ck_assert_ptr_null(session_map_find(&m, "a"));
    ck_assert_int_eq(session_map_insert(&m, a), 0);
    ck_assert_int_eq(session_map_insert(&m, b), 0);
    ck_assert_int_eq(session_map_insert(&m, c), 0);
    ck_assert_uint_eq(m.count, 3);
    ck_assert_ptr_eq(session_map_find(&m, "a"), a);
    ck_assert_ptr_eq(session_map_find(&m, "b"), b);
    ck_assert_ptr_eq(session_map_find(&m, "a.b:c-d_9"), c);
    ck_assert_ptr_null(session_map_find(&m, "c"));
    ck_assert_ptr_null(session_map_find(&m, "a.b:c-d_"));

    session_map_remove(&m, a);
    ck_assert_ptr_null(session_map_find(&m, "a"));
    ck_assert_ptr_eq(session_map_find(&m, "b"), b);
    ck_assert_uint_eq(m.count, 2);
    /* The same id again, as after finish then start. */
    ck_assert_int_eq(session_map_insert(&m, a), 0);
    ck_assert_ptr_eq(session_map_find(&m, "a"), a);
    session_map_remove(&m, a);
    session_map_remove(&m, b);
    session_map_remove(&m, c);
    ck_assert_uint_eq(m.count, 0);
    session_map_free(&m);
    free(a);
    free(b);
    free(c);
}
END_TEST

START_TEST(test_long_and_similar_ids)
{
    session_map_t m;
    char id[65];
    session_map_node_t *n[64];

    ck_assert_int_eq(session_map_init(&m), 0);
    /* Prefixes of one 64-byte id: every length, every tail of the hash. */
    memset(id, 'x', 64);
    for (int len = 1; len <= 64; len++) {
        id[len] = '\0';
        n[len - 1] = node_new(id);
        ck_assert_int_eq(session_map_insert(&m, n[len - 1]), 0);
        id[len] = 'x';
    }
    for (int len = 1; len <= 64; len++) {
        id[len] = '\0';
        ck_assert_ptr_eq(session_map_find(&m, id), n[len - 1]);
        id[len] = 'x';
    }
    for (int i = 0; i < 64; i++) {
        session_map_remove(&m, n[i]);
        free(n[i]);
    }
    ck_assert_uint_eq(m.count, 0);
    session_map_free(&m);
}
END_TEST

#define MANY SLOTD_TEST_SCALED(100000)

START_TEST(test_many_ids)
{
    session_map_t m;
    session_map_node_t **n = calloc(MANY, sizeof(*n));
    char id[32];

    ck_assert_int_eq(session_map_init(&m), 0);
    for (int i = 0; i < MANY; i++) {
        snprintf(id, sizeof(id), "s%d", i);
        n[i] = node_new(id);
        ck_assert_int_eq(session_map_insert(&m, n[i]), 0);
    }
    ck_assert_uint_eq(m.count, MANY);
    ck_assert_uint_ge(m.nbuckets, MANY); /* load factor at most 1 */
    for (int i = 0; i < MANY; i++) {
        snprintf(id, sizeof(id), "s%d", i);
        ck_assert_ptr_eq(session_map_find(&m, id), n[i]);
    }
    ck_assert_ptr_null(session_map_find(&m, "s100000"));
    /* Remove the even ones; the odd ones stay found. */
    for (int i = 0; i < MANY; i += 2)
        session_map_remove(&m, n[i]);
    for (int i = 0; i < MANY; i++) {
        snprintf(id, sizeof(id), "s%d", i);
        ck_assert_ptr_eq(session_map_find(&m, id), i % 2 ? n[i] : NULL);
    }
    for (int i = 1; i < MANY; i += 2)
        session_map_remove(&m, n[i]);
    ck_assert_uint_eq(m.count, 0);
    /* Inserts after a drain shrink the bucket array back. */
    for (int i = 0; i < 20; i++)
        ck_assert_int_eq(session_map_insert(&m, n[i]), 0);
    ck_assert_uint_lt(m.nbuckets, 1024);
    for (int i = 0; i < 20; i++)
        ck_assert_ptr_eq(session_map_find(&m, n[i]->id), n[i]);
    for (int i = 0; i < 20; i++)
        session_map_remove(&m, n[i]);
    for (int i = 0; i < MANY; i++)
        free(n[i]);
    free(n);
    session_map_free(&m);
}
END_TEST

START_TEST(test_iteration)
{
    session_map_t m;
    session_map_iter_t it = SESSION_MAP_ITER_INIT;
    session_map_node_t *n[1000], *x;
    char id[32], *seen = calloc(1000, 1);
    int count = 0;

    ck_assert_int_eq(session_map_init(&m), 0);
    /* Empty map: nothing. */
    ck_assert_ptr_null(session_map_next(&m, &it));
    for (int i = 0; i < 1000; i++) {
        snprintf(id, sizeof(id), "%d", i);
        n[i] = node_new(id);
        ck_assert_int_eq(session_map_insert(&m, n[i]), 0);
    }
    /* Every node exactly once. */
    it = (session_map_iter_t)SESSION_MAP_ITER_INIT;
    while ((x = session_map_next(&m, &it)) != NULL) {
        int i = atoi(x->id);
        ck_assert_ptr_eq(x, n[i]);
        ck_assert_int_eq(seen[i], 0);
        seen[i] = 1;
        count++;
    }
    ck_assert_int_eq(count, 1000);

    /* Removing each node as it is visited empties the map. */
    count = 0;
    it = (session_map_iter_t)SESSION_MAP_ITER_INIT;
    while ((x = session_map_next(&m, &it)) != NULL) {
        session_map_remove(&m, x);
        count++;
    }
    ck_assert_int_eq(count, 1000);
    ck_assert_uint_eq(m.count, 0);
    it = (session_map_iter_t)SESSION_MAP_ITER_INIT;
    ck_assert_ptr_null(session_map_next(&m, &it));
    for (int i = 0; i < 1000; i++)
        free(n[i]);
    free(seen);
    session_map_free(&m);
}
END_TEST

/* ---- Randomised, against a reference ---- */

static uint64_t rng_state = 42;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Weak hashes for the collision tests. */
static uint64_t hash_constant(const unsigned char *id, size_t len)
{
    (void)id;
    (void)len;
    return 5;
}

static uint64_t hash_three(const unsigned char *id, size_t len)
{
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++)
        v += id[i];
    return v % 3; /* 0, 1 or 2: three neighbouring home slots */
}

static uint64_t hash_top(const unsigned char *id, size_t len)
{
    /* Home in the last two slots of any array: runs wrap around to 0. */
    return UINT64_MAX - (len & 1);
}

/* Id number k: short and long ones, some differing only at the end. */
static void id_of(char *out, size_t cap, int k)
{
    if (k % 5 == 4)
        snprintf(out, cap, "a-long-session-id.with:every_allowed-char-%021d", k);
    else
        snprintf(out, cap, "s%d", k);
    out[PROTO_ID_MAX] = '\0';
}

/* Fills the bytes of `id` (PROTO_ID_MAX + 1) past its NUL with noise, as
 * a request record's id holds what earlier ids left there.  A generator
 * of its own: the random tests' sequence of operations stays what it was
 * without the noise (their checks of how full the map got depend on it). */
static void id_noise(char *id)
{
    static uint64_t noise = 0x2545F4914F6CDD1Dull;

    for (size_t j = strlen(id) + 1; j < PROTO_ID_MAX + 1; j++) {
        noise ^= noise << 13;
        noise ^= noise >> 7;
        noise ^= noise << 17;
        id[j] = (char)(noise & 0xff);
    }
}

/* `ops` random inserts, removals and finds over `universe` ids, each
 * checked against in_map[]; the map's invariants are checked every
 * `check_every` operations and at the end. */
static void random_ops(int universe, long ops, long check_every)
{
    session_map_t m;
    session_map_node_t **n = calloc((size_t)universe, sizeof(*n));
    bool *in_map = calloc((size_t)universe, sizeof(*in_map));
    size_t live = 0, max_live = 0;
    char id[PROTO_ID_MAX + 1];

    ck_assert_ptr_nonnull(n);
    ck_assert_ptr_nonnull(in_map);
    ck_assert_int_eq(session_map_init(&m), 0);
    for (int k = 0; k < universe; k++) {
        id_of(id, sizeof(id), k);
        n[k] = node_new(id);
    }
    for (long op = 0; op < ops; op++) {
        int k = (int)(rng_next() % (uint64_t)universe);
        /* Phases that fill up and drain, so that the array grows and
         * shrinks back and forth. */
        bool filling = (op / (universe * 4L)) % 2 == 0;
        unsigned what = (unsigned)(rng_next() % 8);
        if (what < 3) {
            id_of(id, sizeof(id), k);
            id_noise(id);
            ck_assert_ptr_eq(session_map_find(&m, id), in_map[k] ? n[k] : NULL);
            ck_assert_ptr_eq(session_map_find_idbuf(&m, id), in_map[k] ? n[k] : NULL);
        } else if (!in_map[k] && (filling || what == 3)) {
            ck_assert_int_eq(session_map_insert(&m, n[k]), 0);
            in_map[k] = true;
            live++;
        } else if (in_map[k]) {
            session_map_remove(&m, n[k]);
            in_map[k] = false;
            live--;
        }
        if (live > max_live)
            max_live = live;
        ck_assert_uint_eq(m.count, live);
        if (check_every > 0 && op % check_every == 0)
            ck_assert_int_eq(session_map_check(&m), 0);
    }
    ck_assert_uint_gt(max_live, (size_t)universe / 2);
    ck_assert_int_eq(session_map_check(&m), 0);
    /* Every id, present or not. */
    for (int k = 0; k < universe; k++) {
        id_of(id, sizeof(id), k);
        ck_assert_ptr_eq(session_map_find(&m, id), in_map[k] ? n[k] : NULL);
    }
    ck_assert_ptr_null(session_map_find(&m, "never-inserted"));
    for (int k = 0; k < universe; k++) {
        if (in_map[k])
            session_map_remove(&m, n[k]);
        free(n[k]);
    }
    ck_assert_uint_eq(m.count, 0);
    session_map_free(&m);
    free(n);
    free(in_map);
}

/* session_map_find_idbuf() finds what session_map_find() finds, for ids
 * of every length (either side of a word, of the inline copy, of the
 * longest) followed by noise: bytes that are NUL, 0x80 or 0xff, and the
 * id's own bytes again; and the id cut one byte short is not found. */
START_TEST(test_find_idbuf)
{
    session_map_t m;
    session_map_node_t *n[PROTO_ID_MAX + 1] = {NULL};
    char id[PROTO_ID_MAX + 1];
    const int fills[] = {0, 0x80, 0xff, 'a', -1};

    ck_assert_int_eq(session_map_init(&m), 0);
    for (size_t len = 1; len <= PROTO_ID_MAX; len++) {
        for (size_t j = 0; j < len; j++)
            id[j] = "abcdefghijklmnopqrstuvwxyz0123456789.:_-"[(len * 7 + j * 13) % 40];
        id[len] = '\0';
        n[len] = node_new(id);
        if (len % 2 == 1) /* every other length: the others are looked for absent */
            ck_assert_int_eq(session_map_insert(&m, n[len]), 0);
    }
    for (size_t f = 0; f < sizeof(fills) / sizeof(fills[0]); f++) {
        for (size_t len = 1; len <= PROTO_ID_MAX; len++) {
            memset(id, 0, sizeof(id));
            memcpy(id, n[len]->id, len + 1);
            if (fills[f] >= 0)
                memset(id + len + 1, fills[f], sizeof(id) - len - 1);
            else
                id_noise(id);
            ck_assert_ptr_eq(session_map_find_idbuf(&m, id), len % 2 == 1 ? n[len] : NULL);
            ck_assert_ptr_eq(session_map_find_idbuf(&m, id), session_map_find(&m, id));
            /* One byte shorter: another id, present or not by its length. */
            if (len > 1) {
                id[len - 1] = '\0';
                ck_assert_ptr_null(session_map_find_idbuf(&m, id));
            }
        }
    }
    for (size_t len = 1; len <= PROTO_ID_MAX; len++) {
        if (len % 2 == 1)
            session_map_remove(&m, n[len]);
        free(n[len]);
    }
    session_map_free(&m);
}
END_TEST

START_TEST(test_random_against_reference)
{
    random_ops(3000, SLOTD_TEST_SCALED(400000), 997);
}
END_TEST

/* The same with every id's hash equal, with three hashes, and with homes
 * at the end of the array: every find goes past full-hash matches of other
 * ids to the id comparison, and removals shift long runs, across the end
 * of the array too. */
START_TEST(test_colliding_hashes)
{
    uint64_t (*const weak[])(const unsigned char *, size_t) = {hash_constant, hash_three, hash_top};
    uint64_t (*saved)(const unsigned char *, size_t) = session_map__hash;

    for (size_t i = 0; i < sizeof(weak) / sizeof(weak[0]); i++) {
        session_map__hash = weak[i];
        random_ops(300, SLOTD_TEST_SCALED(60000), 1);
    }
    session_map__hash = saved;
}
END_TEST

/* Iteration removing every other node it visits, with runs that wrap
 * around the end of the array: each node is visited exactly once, and the
 * ones left are still found. */
START_TEST(test_iteration_removal_wraps)
{
    uint64_t (*saved)(const unsigned char *, size_t) = session_map__hash;
    uint64_t (*const hashes[])(const unsigned char *, size_t) = {hash_top, hash_three, saved};

    for (size_t h = 0; h < sizeof(hashes) / sizeof(hashes[0]); h++) {
        for (int total = 1; total <= 200; total += 13) {
            session_map_t m;
            session_map_iter_t it = SESSION_MAP_ITER_INIT;
            session_map_node_t *n[200], *x;
            char id[32], seen[200] = {0}, removed[200] = {0};
            int count = 0;

            session_map__hash = hashes[h];
            ck_assert_int_eq(session_map_init(&m), 0);
            for (int i = 0; i < total; i++) {
                snprintf(id, sizeof(id), "%d", i);
                n[i] = node_new(id);
                ck_assert_int_eq(session_map_insert(&m, n[i]), 0);
            }
            while ((x = session_map_next(&m, &it)) != NULL) {
                int i = atoi(x->id);
                ck_assert_ptr_eq(x, n[i]);
                ck_assert_int_eq(seen[i], 0);
                seen[i] = 1;
                if (count++ % 2 == 0) {
                    session_map_remove(&m, x);
                    removed[i] = 1;
                }
            }
            ck_assert_int_eq(count, total);
            ck_assert_int_eq(session_map_check(&m), 0);
            for (int i = 0; i < total; i++) {
                snprintf(id, sizeof(id), "%d", i);
                ck_assert_ptr_eq(session_map_find(&m, id), removed[i] ? NULL : n[i]);
                if (!removed[i])
                    session_map_remove(&m, n[i]);
                free(n[i]);
            }
            ck_assert_uint_eq(m.count, 0);
            session_map_free(&m);
            session_map__hash = saved;
        }
    }
}
END_TEST

/* The array grows by doubling before it is more than 3/4 full, and
 * shrinks on inserts once less than 1/8 full. */
START_TEST(test_growth_and_load)
{
    session_map_t m;
    session_map_node_t *n[5000];
    char id[32];
    size_t last = 0, grew = 0;

    ck_assert_int_eq(session_map_init(&m), 0);
    for (int i = 0; i < 5000; i++) {
        snprintf(id, sizeof(id), "g%d", i);
        n[i] = node_new(id);
        ck_assert_int_eq(session_map_insert(&m, n[i]), 0);
        ck_assert_uint_eq(m.nbuckets & (m.nbuckets - 1), 0);
        ck_assert_uint_le(m.count * 4, m.nbuckets * 3);
        if (m.nbuckets != last) {
            if (last != 0)
                ck_assert_uint_eq(m.nbuckets, last * 2);
            last = m.nbuckets;
            grew++;
        }
    }
    ck_assert_uint_ge(grew, 10);
    ck_assert_int_eq(session_map_check(&m), 0);
    for (int i = 0; i < 4990; i++)
        session_map_remove(&m, n[i]);
    /* Removal never shrinks (an iteration may be removing). */
    ck_assert_uint_eq(m.nbuckets, last);
    ck_assert_int_eq(session_map_check(&m), 0);
    for (int i = 0; i < 4990; i += 1000)
        ck_assert_int_eq(session_map_insert(&m, n[i]), 0);
    ck_assert_uint_lt(m.nbuckets, last);
    ck_assert_int_eq(session_map_check(&m), 0);
    for (int i = 4990; i < 5000; i++)
        ck_assert_ptr_eq(session_map_find(&m, n[i]->id), n[i]);
    for (int i = 0; i < 4990; i++)
        ck_assert_ptr_eq(session_map_find(&m, n[i]->id), i % 1000 == 0 ? n[i] : NULL);
    for (int i = 0; i < 5000; i++) {
        if (i >= 4990 || i % 1000 == 0)
            session_map_remove(&m, n[i]);
        free(n[i]);
    }
    ck_assert_uint_eq(m.count, 0);
    session_map_free(&m);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("session_map");
    TCase *tc = tcase_create("map");
    tcase_add_test(tc, test_insert_find_remove);
    tcase_add_test(tc, test_long_and_similar_ids);
    tcase_add_test(tc, test_many_ids);
    tcase_add_test(tc, test_iteration);
    tcase_add_test(tc, test_find_idbuf);
    tcase_add_test(tc, test_random_against_reference);
    tcase_add_test(tc, test_colliding_hashes);
    tcase_add_test(tc, test_iteration_removal_wraps);
    tcase_add_test(tc, test_growth_and_load);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    int failed;
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
