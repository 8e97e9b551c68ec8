/*
 * test_model_util.h: the helpers the suites of core/ (test_core.c,
 * test_batch.c) share: a seeded generator, model creation that fails the
 * test on error, and the family's work counter.  Include after <check.h>
 * and core/model_int.h; each suite has its own generator state.
 */
#ifndef SLOTD_TESTS_TEST_MODEL_UTIL_H
#define SLOTD_TESTS_TEST_MODEL_UTIL_H

#include <check.h>
#include <stdint.h>

#include "core/model.h"
#include "core/model_int.h"

/* A small deterministic generator for the random cases; a suite seeds it
 * by assigning rng_state. */
static uint64_t rng_state;

static inline uint64_t rng_next(void)
{
    rng_state += UINT64_C(0x9E3779B97F4A7C15);
    return model__mix64(rng_state);
}

static inline uint32_t rng_below(uint32_t n)
{
    return (uint32_t)(rng_next() % n);
}

/* A double in [-1, 1). */
static inline double rng_double(void)
{
    return 2.0 * ((double)(rng_next() >> 11) * 0x1p-53) - 1.0;
}

/* A model of `preset`, or the test fails.  Freed with model_destroy(). */
static inline model_t *create(const char *preset)
{
    model_t *m = NULL;

    ck_assert_int_eq(model_create(preset, &m), SLOTD_OK);
    ck_assert_ptr_nonnull(m);
    return m;
}

/* The work counter of the family: g calls for hash, rows for attn. */
static inline uint64_t work(const model_t *m)
{
    return model_family(m) == MODEL_FAMILY_HASH ? model_g_calls(m) : model_rows(m);
}

#endif
