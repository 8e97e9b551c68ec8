/*
 * simd.c: which variant of the kernels (kern.h) core/ uses.
 *
 * The build is one portable binary: kern.c is compiled once per variant,
 * and the choice is made here, once, at the first call of model__kern()
 * (model_create() makes it): the widest variant the CPU and the operating
 * system support (__builtin_cpu_supports() reads cpuid and, for AVX and
 * AVX-512, whether the OS saves those registers), unless the environment
 * variable SLOTD_SIMD names another the machine supports.  Every variant
 * gives the same bits (kern.h), so the choice is one of speed only.
 * model_simd_force() changes it, for the tests that run every variant.
 *
 * Threads: the choice is an atomic pointer.  The first choice is made
 * under pthread_once; model_simd_force() may be called while no model call
 * runs (a call running then would use either variant, each exact).
 */
#include "core/kern.h"
#include "core/model.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static _Atomic(const model__kern_t *) kern_in_use;
static pthread_once_t kern_once = PTHREAD_ONCE_INIT;

/* The variants the machine runs, narrowest first. */
static size_t kern_supported(const model__kern_t **out)
{
    size_t n = 0;

    out[n++] = &model__kern_scalar;
#if SLOTD_KERN_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
        out[n++] = &model__kern_avx2;
    }
    if (__builtin_cpu_supports("avx512f")) {
        out[n++] = &model__kern_avx512;
    }
#endif
    return n;
}

static const model__kern_t *kern_find(const char *name)
{
    const model__kern_t *v[3];
    size_t n = kern_supported(v);

    for (size_t i = 0; i < n; i++) {
        if (strcmp(v[i]->name, name) == 0) {
            return v[i];
        }
    }
    return NULL;
}

static void kern_choose(void)
{
    const model__kern_t *v[3], *k;
    const char *env = getenv("SLOTD_SIMD");
    size_t n = kern_supported(v);

    k = v[n - 1];
    if (env != NULL && env[0] != '\0' && kern_find(env) != NULL) {
        k = kern_find(env);
    }
    atomic_store_explicit(&kern_in_use, k, memory_order_release);
}

const model__kern_t *model__kern(void)
{
    const model__kern_t *k = atomic_load_explicit(&kern_in_use, memory_order_acquire);

    if (k == NULL) {
        pthread_once(&kern_once, kern_choose);
        k = atomic_load_explicit(&kern_in_use, memory_order_acquire);
    }
    return k;
}

const char *model_simd(void)
{
    return model__kern()->name;
}

const char *model_simd_supported(size_t i)
{
    const model__kern_t *v[3];
    size_t n = kern_supported(v);

    return i < n ? v[i]->name : NULL;
}

int model_simd_force(const char *name)
{
    const model__kern_t *k = name != NULL ? kern_find(name) : NULL;

    if (k == NULL) {
        return SLOTD_EINVAL;
    }
    (void)model__kern(); /* the first choice is made, so that it cannot undo this one */
    atomic_store_explicit(&kern_in_use, k, memory_order_release);
    return SLOTD_OK;
}
