/*
 * test_hardening.c: the Check suite of the daemon's hardening pieces that
 * can be tested without a daemon.
 *
 * The audit (server/sched/audit.c): the recorded token array, the
 * sampling rate of its PRNG, and audit_check() against the uncached
 * reference on both families: agreement leaves the reply alone, a changed
 * pick or a single flipped logit bit is found at its index and replaced by
 * the reference.  cache_session_rebuild(): a rebuilt slot continues
 * exactly as the reference does, and in a test build a slot damaged by
 * cache_session_fault_corrupt() diverges until it is rebuilt.
 */
#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/pool.h"
#include "cache/session.h"
#include "core/model.h"
#include "server/sched/audit.h"

/* ---- The recorded tokens ---- */

START_TEST(test_tokens)
{
    audit_tokens_t t = {NULL, 0, 0};
    uint32_t v[100];

    for (uint32_t i = 0; i < 100; i++)
        v[i] = i * 7;
    ck_assert_int_eq(audit_tokens_reserve(&t, 0), SLOTD_OK);
    for (uint32_t i = 0; i < 100; i += 10) {
        ck_assert_int_eq(audit_tokens_reserve(&t, 10), SLOTD_OK);
        ck_assert_uint_ge(t.cap, t.len + 10);
        audit_tokens_append(&t, v + i, 10);
    }
    ck_assert_uint_eq(t.len, 100);
    ck_assert_uint_le(t.cap, 2 * 100); /* grown by doubling */
    ck_assert_mem_eq(t.v, v, sizeof(v));
    audit_tokens_append(&t, v, 0);
    ck_assert_uint_eq(t.len, 100);
    audit_tokens_free(&t);
    ck_assert_ptr_null(t.v);
    ck_assert_uint_eq(t.len, 0);
    ck_assert_uint_eq(t.cap, 0);
    audit_tokens_free(&t); /* twice is fine */
    t.len = UINT32_MAX - 1;
    ck_assert_int_eq(audit_tokens_reserve(&t, 2), SLOTD_ENOMEM);
    ck_assert_ptr_null(t.v);
}
END_TEST

/* ---- The audit ---- */

static model_t *models[2]; /* hash, tiny */

static void models_setup(void)
{
    ck_assert_int_eq(model_create("hash", &models[0]), SLOTD_OK);
    ck_assert_int_eq(model_create("tiny", &models[1]), SLOTD_OK);
}

static void models_teardown(void)
{
    model_destroy(models[0]);
    model_destroy(models[1]);
}

static const model_t *const *model_list(void)
{
    return (const model_t *const *)models;
}

START_TEST(test_audit_create)
{
    audit_t *a = NULL;

    ck_assert_int_eq(audit_create(0.0, 2, model_list(), 2, &a), SLOTD_EINVAL);
    ck_assert_int_eq(audit_create(1.5, 2, model_list(), 2, &a), SLOTD_EINVAL);
    ck_assert_int_eq(audit_create(-1.0, 2, model_list(), 2, &a), SLOTD_EINVAL);
    ck_assert_int_eq(audit_create(0.5, 0, model_list(), 2, &a), SLOTD_EINVAL);
    ck_assert_int_eq(audit_create(0.5, 3, model_list(), 2, &a), SLOTD_OK);
    /* A whole chain of each (hash: 4096 entries of 8 bytes; tiny: 8 of 256,
     * each with its block headers), the two states, 4096 tokens in and
     * out, 16 rows of 6 logits. */
    size_t hash_chain = 0, tiny_chain = 0;
    model_chain_blocks(models[0], 4096, 1, &hash_chain);
    model_chain_blocks(models[1], 8, 1, &tiny_chain);
    ck_assert_uint_ge(hash_chain, 4096 * 8 + 16);
    ck_assert_uint_le(hash_chain, 4096 * 8 * 11 / 10 + 512);
    ck_assert_uint_ge(tiny_chain, 8 * 256 + 16);
    ck_assert_uint_le(tiny_chain, 8 * 256 * 11 / 10 + 512);
    size_t expect = hash_chain + model_state_size(models[0]) + tiny_chain +
                    model_state_size(models[1]) + 4096 * 12 + 16 * 6 * 8;
    ck_assert_uint_eq(audit_worker_bytes(a), expect);
    audit_destroy(a);
    audit_destroy(NULL);
}
END_TEST

START_TEST(test_audit_sampling)
{
    audit_t *a;
    int hits = 0;

    ck_assert_int_eq(audit_create(1.0, 2, model_list(), 2, &a), SLOTD_OK);
    for (int i = 0; i < 1000; i++) {
        ck_assert(audit_due(a, 0));
        ck_assert(audit_due(a, 1));
    }
    audit_destroy(a);

    ck_assert_int_eq(audit_create(0.25, 2, model_list(), 2, &a), SLOTD_OK);
    for (int i = 0; i < 100000; i++)
        hits += audit_due(a, (unsigned)i & 1);
    ck_assert_msg(hits > 24000 && hits < 26000, "rate 0.25: %d of 100000", hits);
    audit_destroy(a);

    hits = 0;
    ck_assert_int_eq(audit_create(0.001, 1, model_list(), 2, &a), SLOTD_OK);
    for (int i = 0; i < 100000; i++)
        hits += audit_due(a, 0);
    ck_assert_msg(hits > 50 && hits < 160, "rate 0.001: %d of 100000", hits);
    audit_destroy(a);
}
END_TEST

/* The reference picks and logits that follow `prefix`. */
static void reference(const model_t *m, const uint32_t *prefix, uint32_t len, uint32_t n,
                      uint32_t *picks, double *logits)
{
    int64_t in[4096];
    uint32_t out[4096];
    slotd_error_t e;

    for (uint32_t i = 0; i < len; i++)
        in[i] = prefix[i];
    ck_assert_int_eq(model_generate(m, in, len, n, false, NULL, NULL, out, logits, NULL, &e),
                     SLOTD_OK);
    memcpy(picks, out + len, n * sizeof(*picks));
}

START_TEST(test_audit_check_attn)
{
    const model_t *m = models[1];
    uint32_t hist[3] = {0, 1, 2}, picks[5], ref_picks[5], bad;
    double logits[5 * 6], ref_logits[5 * 6];
    void *scratch = malloc(model_scratch_size(m));
    audit_t *a;

    ck_assert_int_eq(audit_create(1.0, 1, model_list(), 2, &a), SLOTD_OK);
    reference(m, hist, 3, 5, ref_picks, ref_logits);
    ck_assert_uint_eq(ref_picks[0], 4); /* docs/models.md's golden values */
    ck_assert(ref_logits[0] == -0.215893);

    /* Agreement: nothing written. */
    memcpy(picks, ref_picks, sizeof(picks));
    memcpy(logits, ref_logits, sizeof(logits));
    ck_assert_int_eq(audit_check(a, 0, m, hist, 3, 5, scratch, picks, logits, &bad), SLOTD_OK);
    ck_assert_uint_eq(bad, UINT32_MAX);
    ck_assert_mem_eq(picks, ref_picks, sizeof(picks));

    /* One bit of one logit of the third pick. */
    uint64_t bits;
    memcpy(&bits, &logits[2 * 6 + 4], sizeof(bits));
    bits ^= 1;
    memcpy(&logits[2 * 6 + 4], &bits, sizeof(bits));
    ck_assert_int_eq(audit_check(a, 0, m, hist, 3, 5, scratch, picks, logits, &bad), SLOTD_OK);
    ck_assert_uint_eq(bad, 2);
    ck_assert_mem_eq(logits, ref_logits, sizeof(logits));

    /* A pick. */
    picks[4] = (picks[4] + 1) % 6;
    ck_assert_int_eq(audit_check(a, 0, m, hist, 3, 5, scratch, picks, logits, &bad), SLOTD_OK);
    ck_assert_uint_eq(bad, 4);
    ck_assert_mem_eq(picks, ref_picks, sizeof(picks));

    /* -0.0 against 0.0 is a difference of bits. */
    logits[0] = ref_logits[0] == 0.0 ? -0.0 : -ref_logits[0];
    ck_assert_int_eq(audit_check(a, 0, m, hist, 3, 5, scratch, picks, logits, &bad), SLOTD_OK);
    ck_assert_uint_eq(bad, 0);

    /* Later in the sequence: the history grows, the chain is reused. */
    uint32_t hist2[6] = {0, 1, 2, ref_picks[0], ref_picks[1], ref_picks[2]};
    memcpy(picks, ref_picks + 3, 2 * sizeof(*picks));
    memcpy(logits, ref_logits + 3 * 6, 2 * 6 * sizeof(*logits));
    ck_assert_int_eq(audit_check(a, 0, m, hist2, 6, 2, scratch, picks, logits, &bad), SLOTD_OK);
    ck_assert_uint_eq(bad, UINT32_MAX);

    /* Refused: past max_ctx, nothing to start from, a model not set up. */
    ck_assert_int_eq(audit_check(a, 0, m, hist2, 6, 3, scratch, picks, logits, &bad), SLOTD_EINVAL);
    ck_assert_int_eq(audit_check(a, 0, m, hist2, 0, 1, scratch, picks, logits, &bad), SLOTD_EINVAL);
    model_t *other;
    ck_assert_int_eq(model_create("tiny", &other), SLOTD_OK);
    ck_assert_int_eq(audit_check(a, 0, other, hist, 3, 1, scratch, picks, logits, &bad),
                     SLOTD_EINVAL);
    model_destroy(other);
    audit_destroy(a);
    free(scratch);
}
END_TEST

START_TEST(test_audit_check_hash)
{
    const model_t *m = models[0];
    uint32_t hist[4] = {5, 6, 7, 999}, picks[40], ref_picks[40], bad;
    audit_t *a;

    ck_assert_int_eq(audit_create(0.5, 2, model_list(), 2, &a), SLOTD_OK);
    reference(m, hist, 4, 40, ref_picks, NULL);
    memcpy(picks, ref_picks, sizeof(picks));
    ck_assert_int_eq(audit_check(a, 1, m, hist, 4, 40, NULL, picks, NULL, &bad), SLOTD_OK);
    ck_assert_uint_eq(bad, UINT32_MAX);
    picks[17] ^= 1;
    picks[30] ^= 1;
    ck_assert_int_eq(audit_check(a, 1, m, hist, 4, 40, NULL, picks, NULL, &bad), SLOTD_OK);
    ck_assert_uint_eq(bad, 17);
    ck_assert_mem_eq(picks, ref_picks, sizeof(picks));
    audit_destroy(a);
}
END_TEST

/* A large n on a model with a large vocabulary: the reference logits grow
 * past the 16 rows kept, and shrink back. */
START_TEST(test_audit_check_large_n)
{
    model_t *small;
    const model_t *list[1];
    uint32_t hist[2] = {3, 4}, *picks = malloc(40 * sizeof(*picks)), *ref = malloc(40 * 4);
    double *logits = malloc(40 * 512 * sizeof(double)), *ref_logits = malloc(40 * 512 * 8);
    uint32_t bad;
    audit_t *a;

    ck_assert_int_eq(model_create("small", &small), SLOTD_OK);
    list[0] = small;
    void *scratch = malloc(model_scratch_size(small));
    ck_assert_int_eq(audit_create(1.0, 1, list, 1, &a), SLOTD_OK);
    reference(small, hist, 2, 40, ref, ref_logits);
    memcpy(picks, ref, 40 * sizeof(*picks));
    memcpy(logits, ref_logits, 40 * 512 * sizeof(double));
    logits[39 * 512 + 511] += 1.0;
    ck_assert_int_eq(audit_check(a, 0, small, hist, 2, 40, scratch, picks, logits, &bad), SLOTD_OK);
    ck_assert_uint_eq(bad, 39);
    ck_assert_mem_eq(logits, ref_logits, 40 * 512 * sizeof(double));
    ck_assert_int_eq(audit_check(a, 0, small, hist, 2, 3, scratch, picks, logits, &bad), SLOTD_OK);
    ck_assert_uint_eq(bad, UINT32_MAX);
    audit_destroy(a);
    model_destroy(small);
    free(scratch);
    free(picks);
    free(ref);
    free(logits);
    free(ref_logits);
}
END_TEST

/* ---- Rebuilding a slot ---- */

static cache_pool_t *pool_for(const model_t *m)
{
    cache_pool_config_t pc = {1 << 20, 4, (const model_t *const *)&m, 1, 1, false};
    cache_pool_t *p;

    ck_assert_int_eq(cache_pool_create(&pc, &p), SLOTD_OK);
    return p;
}

/* Starts [1, 2, 3] on `m`, steps 2, and returns the session; `seq` gets
 * the five tokens. */
static cache_session_t started(cache_pool_t *p, const model_t *m, void *scratch, uint32_t *seq)
{
    const int64_t prompt[3] = {1, 2, 3};
    cache_owner_t owner = {42, "s"};
    cache_session_t s;
    slotd_error_t e;

    ck_assert_int_eq(cache_session_start(p, m, &owner, prompt, 3, scratch, &s, &e), SLOTD_OK);
    ck_assert_int_eq(cache_session_step(p, &s, 2, scratch, seq + 3, NULL, &e), SLOTD_OK);
    seq[0] = 1;
    seq[1] = 2;
    seq[2] = 3;
    return s;
}

static void rebuild_case(const model_t *m)
{
    cache_pool_t *p = pool_for(m);
    void *scratch = malloc(model_scratch_size(m) + 1);
    uint32_t seq[8], picks[3], ref[3], wrong[5];
    double logits[3 * 6], ref_logits[3 * 6];
    double *lg = model_family(m) == MODEL_FAMILY_ATTN ? logits : NULL;
    slotd_error_t e;
    cache_session_t s = started(p, m, scratch, seq);
    uint32_t released;

    /* A rebuild from the right tokens changes nothing that shows. */
    ck_assert_int_eq(cache_session_rebuild(p, &s, seq, 5, scratch), SLOTD_OK);
    ck_assert_uint_eq(s.entries, 5);
    reference(m, seq, 5, 3, ref, lg != NULL ? ref_logits : NULL);
    ck_assert_int_eq(cache_session_step(p, &s, 3, scratch, picks, lg, &e), SLOTD_OK);
    ck_assert_mem_eq(picks, ref, sizeof(picks));
    if (lg != NULL)
        ck_assert_mem_eq(logits, ref_logits, sizeof(logits));
    ck_assert_int_eq(cache_session_finish(p, &s, &released), SLOTD_OK);

    /* From other tokens, the slot continues those instead. */
    s = started(p, m, scratch, seq);
    memcpy(wrong, seq, sizeof(wrong));
    wrong[3] = (wrong[3] + 1) % model_vocab(m);
    ck_assert_int_eq(cache_session_rebuild(p, &s, wrong, 5, scratch), SLOTD_OK);
    reference(m, wrong, 5, 3, ref, lg != NULL ? ref_logits : NULL);
    ck_assert_int_eq(cache_session_step(p, &s, 3, scratch, picks, lg, &e), SLOTD_OK);
    ck_assert_mem_eq(picks, ref, sizeof(picks));
    if (lg != NULL)
        ck_assert_mem_eq(logits, ref_logits, sizeof(logits));

    /* Refused: a length that is not the slot's, a token out of range, a
     * finished session; none changes the slot. */
    ck_assert_int_eq(cache_session_rebuild(p, &s, wrong, 5, scratch), SLOTD_EINVAL);
    wrong[0] = model_vocab(m);
    uint32_t eight[8] = {0};
    memcpy(eight, wrong, sizeof(wrong));
    ck_assert_int_eq(cache_session_rebuild(p, &s, eight, 8, scratch), SLOTD_EINVAL);
    ck_assert_uint_eq(s.entries, 8);
    cache_session_t old = s;
    ck_assert_int_eq(cache_session_finish(p, &s, &released), SLOTD_OK);
    ck_assert_uint_eq(released, 8);
    old.entries = 0;
    ck_assert_int_eq(cache_session_rebuild(p, &old, NULL, 0, scratch), SLOTD_EINVAL);
    old.entries = 5;
    ck_assert_int_eq(cache_session_rebuild(p, &old, seq, 5, scratch), SLOTD_ESTALE);

    cache_pool_destroy(p);
    free(scratch);
}

START_TEST(test_rebuild)
{
    rebuild_case(models[0]);
    rebuild_case(models[1]);
}
END_TEST

#if SLOTD_FAULT_INJECTION
/* The fault hook's damage shows in a later step, and a rebuild heals it. */
static void corrupt_case(const model_t *m)
{
    cache_pool_t *p = pool_for(m);
    void *scratch = malloc(model_scratch_size(m) + 1);
    uint32_t seq[8], picks[3], ref[3];
    double logits[3 * 6], ref_logits[3 * 6];
    bool attn = model_family(m) == MODEL_FAMILY_ATTN;
    slotd_error_t e;
    cache_session_t s = started(p, m, scratch, seq);
    uint32_t released;

    reference(m, seq, 5, 3, ref, attn ? ref_logits : NULL);
    ck_assert_int_eq(cache_session_fault_corrupt(p, &s), SLOTD_OK);
    ck_assert_int_eq(cache_session_step(p, &s, 3, scratch, picks, attn ? logits : NULL, &e),
                     SLOTD_OK);
    if (attn) /* the first pick comes from the state, the later ones from the damage */
        ck_assert(memcmp(logits + 6, ref_logits + 6, 2 * 6 * sizeof(double)) != 0);
    else /* the running sum carries the damage into the very next pick */
        ck_assert(memcmp(picks, ref, sizeof(picks)) != 0);

    /* Rebuilt from the right sequence, it continues as the reference. */
    memcpy(seq + 5, ref, sizeof(ref));
    ck_assert_int_eq(cache_session_rebuild(p, &s, seq, 8, scratch), SLOTD_OK);
    if (attn) { /* tiny is full at 8 */
        ck_assert_int_eq(cache_session_finish(p, &s, &released), SLOTD_OK);
        s = started(p, m, scratch, seq);
        ck_assert_int_eq(cache_session_fault_corrupt(p, &s), SLOTD_OK);
        ck_assert_int_eq(cache_session_rebuild(p, &s, seq, 5, scratch), SLOTD_OK);
        ck_assert_int_eq(cache_session_step(p, &s, 3, scratch, picks, logits, &e), SLOTD_OK);
        ck_assert_mem_eq(picks, ref, sizeof(picks));
        ck_assert_mem_eq(logits, ref_logits, sizeof(logits));
    } else {
        uint32_t more[3], ref_more[3];
        reference(m, seq, 8, 3, ref_more, NULL);
        ck_assert_int_eq(cache_session_step(p, &s, 3, scratch, more, NULL, &e), SLOTD_OK);
        ck_assert_mem_eq(more, ref_more, sizeof(more));
    }
    ck_assert_int_eq(cache_session_finish(p, &s, &released), SLOTD_OK);
    ck_assert_int_eq(cache_session_fault_corrupt(p, &s), SLOTD_ESTALE);
    cache_pool_destroy(p);
    free(scratch);
}

START_TEST(test_fault_corrupt)
{
    corrupt_case(models[0]);
    corrupt_case(models[1]);
}
END_TEST
#endif

static Suite *suite(void)
{
    Suite *s = suite_create("hardening");
    TCase *tc = tcase_create("audit");
    tcase_add_checked_fixture(tc, models_setup, models_teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_tokens);
    tcase_add_test(tc, test_audit_create);
    tcase_add_test(tc, test_audit_sampling);
    tcase_add_test(tc, test_audit_check_attn);
    tcase_add_test(tc, test_audit_check_hash);
    tcase_add_test(tc, test_audit_check_large_n);
    tcase_add_test(tc, test_rebuild);
#if SLOTD_FAULT_INJECTION
    tcase_add_test(tc, test_fault_corrupt);
#endif
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
