/*
 * test_session_map.c: the Check suite of server/session_map.c, the
 * per-connection map of session ids: insert, find, remove, growth and
 * shrinking over many ids, iteration (also removing as it goes), and ids
 * that differ only in their last byte or length.
 */
#include "test_util.h"
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/session_map.h"

static session_map_node_t *node_new(const char *id)
{
    session_map_node_t *n = calloc(1, sizeof(*n));
    ck_assert_ptr_nonnull(n);
    snprintf(n->id, sizeof(n->id), "%s", id);
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

static Suite *suite(void)
{
    Suite *s = suite_create("session_map");
    TCase *tc = tcase_create("map");
    tcase_add_test(tc, test_insert_find_remove);
    tcase_add_test(tc, test_long_and_similar_ids);
    tcase_add_test(tc, test_many_ids);
    tcase_add_test(tc, test_iteration);
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
