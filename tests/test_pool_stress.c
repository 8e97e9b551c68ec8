/*
 * test_pool_stress.c: the slot pool under concurrent use.
 *
 * DESIGN.  THREADS workers share one pool (models "hash" and "tiny", so two
 * block sizes compete for pages) that is too small, in slots and in pages,
 * for what they ask: each keeps up to SLOTS slots, and at random acquires,
 * grows a slot (reserve, write a pattern into the new positions without the
 * lock, commit), checks a slot, or checks and releases it.  Every position
 * and every state carries a tag unique to its tenancy, so a block handed to
 * two slots at once, or a slot that sees another's memory, shows as a
 * wrong tag.  A reader thread snapshots the figures and trims the free
 * pages (cache_pool_trim(): a page given back while in use would lose its
 * tags) all along, resting
 * between every other snapshot: a snapshot takes back every block parked
 * in the workers' caches, so that both the workers' lock-free takes from
 * their caches and those takes racing a snapshot get their share of the
 * run.  Workers do
 * not call Check (its assertions are not thread-safe): they count failures
 * and the main thread asserts.  Meant to pass under SANITIZER=thread too.
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cache/pool.h"
#include "cache/pool_check_int.h"
#include "core/model.h"

enum { THREADS = 4, SLOTS = 4, ITERS = 50000, MAX_SLOTS = 12 };

static cache_pool_t *pool;
static model_t *models[2];
static atomic_uint failures;
static atomic_bool done;
static atomic_ulong refusals, releases, positions_written;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        if (atomic_fetch_add(&failures, 1) < 10)                                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
    } while (0)

typedef struct slot {
    bool live;
    const model_t *m;
    cache_handle_t h;
    cache_owner_t owner;
    uint32_t entries;
    uint64_t tag;
} slot_t;

typedef struct worker {
    pthread_t thread;
    uint32_t index;
    uint64_t rng;
    uint32_t serial;
    slot_t slots[SLOTS];
} worker_t;

static uint64_t mix(uint64_t x)
{
    uint64_t z = x + UINT64_C(0x9E3779B97F4A7C15);
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static uint32_t below(worker_t *w, uint32_t n)
{
    w->rng = mix(w->rng);
    return (uint32_t)(w->rng % n);
}

static uint64_t pattern(const slot_t *s, uint32_t pos)
{
    return s->tag ^ mix(pos);
}

/* The first and last word of position `pos`'s entry in block `b`, which
 * holds it (its header says which positions it holds). */
static unsigned char *entry_at(const slot_t *s, model_block_t *b, uint32_t pos)
{
    return b->data + (size_t)(pos - b->first) * model_entry_size(s->m);
}

static void entry_write(const slot_t *s, model_block_t *b, uint32_t pos)
{
    uint64_t v = pattern(s, pos);
    unsigned char *e = entry_at(s, b, pos);

    memcpy(e, &v, sizeof v);
    memcpy(e + model_entry_size(s->m) - sizeof v, &v, sizeof v);
}

static bool entry_ok(const slot_t *s, model_block_t *b, uint32_t pos)
{
    uint64_t want = pattern(s, pos), first, last;
    const unsigned char *e = entry_at(s, b, pos);

    memcpy(&first, e, sizeof first);
    memcpy(&last, e + model_entry_size(s->m) - sizeof last, sizeof last);
    return first == want && last == want;
}

/* The block after b in kv's chain, through its table, or NULL. */
static model_block_t *next_block(const model_kv_t *kv, const model_block_t *b)
{
    for (uint32_t i = 0; i + 1 < kv->nblocks; i++)
        if (kv->blocks[i] == b)
            return kv->blocks[i + 1];
    return NULL;
}

/* Reads back every position and the state of a live slot. */
static void verify(worker_t *w, slot_t *s)
{
    model_kv_t kv;
    model_block_t *b;
    uint64_t tag;
    int rc = cache_pool_reserve(pool, s->h, &s->owner, 0, &kv);

    if (rc != SLOTD_OK) {
        FAIL("worker %u: reserve(0) on its own slot: %d\n", w->index, rc);
        return;
    }
    if (kv.len != s->entries)
        FAIL("worker %u: slot has %u entries, expected %u\n", w->index, kv.len, s->entries);
    memcpy(&tag, kv.state, sizeof tag);
    if (tag != s->tag)
        FAIL("worker %u: state holds another tenancy's tag\n", w->index);
    b = kv.head;
    for (uint32_t pos = 0, bi = 0; pos < s->entries; pos++) {
        if (b != NULL && pos - b->first == b->capacity)
            b = ++bi < kv.nblocks ? kv.blocks[bi] : NULL;
        if (b == NULL || !entry_ok(s, b, pos)) {
            FAIL("worker %u: position %u of its slot is not its own\n", w->index, pos);
            return;
        }
    }
}

static void do_acquire(worker_t *w, slot_t *s)
{
    int rc;

    s->m = models[below(w, 2)];
    s->owner.key = w->index;
    snprintf(s->owner.id, sizeof s->owner.id, "w%u-%u", w->index, w->serial++);
    rc = cache_pool_acquire(pool, s->m, &s->owner, &s->h);
    if (rc == SLOTD_ECACHE_FULL) {
        atomic_fetch_add(&refusals, 1);
        return;
    }
    if (rc != SLOTD_OK) {
        FAIL("worker %u: acquire: %d\n", w->index, rc);
        return;
    }
    {
        model_kv_t kv;
        s->live = true;
        s->entries = 0;
        s->tag = mix(((uint64_t)w->index << 40) ^ w->serial ^ w->rng);
        if (cache_pool_reserve(pool, s->h, &s->owner, 0, &kv) != SLOTD_OK || kv.len != 0 ||
            kv.head != NULL) {
            FAIL("worker %u: a new slot is not empty\n", w->index);
            return;
        }
        memcpy(kv.state, &s->tag, sizeof s->tag);
    }
}

static void do_grow(worker_t *w, slot_t *s)
{
    uint32_t max = model_max_ctx(s->m), per = model_block_positions(s->m);
    uint32_t n, pos;
    model_kv_t kv;
    model_block_t *b;
    int rc;

    if (s->entries == max)
        return;
    n = 1 + below(w, (max - s->entries) < 3 * per ? max - s->entries : 3 * per);
    rc = cache_pool_reserve(pool, s->h, &s->owner, n, &kv);
    if (rc == SLOTD_ECACHE_FULL) {
        atomic_fetch_add(&refusals, 1);
        return;
    }
    if (rc != SLOTD_OK || kv.len != s->entries) {
        FAIL("worker %u: reserve: %d\n", w->index, rc);
        return;
    }
    /* Written without the pool's lock, as a model would. */
    b = kv.tail;
    /* The pool's chains are walked through their tables (core/model.h). */
    for (pos = s->entries; pos < s->entries + n; pos++) {
        if (b != NULL && pos - b->first == b->capacity)
            b = next_block(&kv, b);
        if (b == NULL) {
            FAIL("worker %u: the chain has no room at %u\n", w->index, pos);
            return;
        }
        entry_write(s, b, pos);
    }
    kv.len = s->entries + n;
    if ((rc = cache_pool_commit(pool, s->h, &s->owner, &kv)) != SLOTD_OK) {
        FAIL("worker %u: commit: %d\n", w->index, rc);
        return;
    }
    s->entries += n;
    atomic_fetch_add(&positions_written, n);
}

static void do_release(worker_t *w, slot_t *s)
{
    uint32_t had = 0;
    int rc;

    verify(w, s);
    rc = cache_pool_release(pool, s->h, &s->owner, &had);
    if (rc != SLOTD_OK || had != s->entries)
        FAIL("worker %u: release: %d, %u entries for %u\n", w->index, rc, had, s->entries);
    /* The handle is stale from now on, on the unlocked paths of reserve
     * and commit too (while other workers may be acquiring the slot). */
    if (cache_pool_release(pool, s->h, &s->owner, NULL) != SLOTD_ESTALE)
        FAIL("worker %u: a second release went through\n", w->index);
    {
        model_kv_t kv;

        memset(&kv, 0, sizeof kv);
        if (cache_pool_reserve(pool, s->h, &s->owner, 0, &kv) != SLOTD_ESTALE ||
            cache_pool_commit(pool, s->h, &s->owner, &kv) != SLOTD_ESTALE || kv.head != NULL)
            FAIL("worker %u: a stale handle reached a slot\n", w->index);
    }
    s->live = false;
    atomic_fetch_add(&releases, 1);
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;

    for (int i = 0; i < ITERS; i++) {
        slot_t *s = &w->slots[below(w, SLOTS)];
        uint32_t dice = below(w, 100);

        if (!s->live)
            do_acquire(w, s);
        else if (dice < 70)
            do_grow(w, s);
        else if (dice < 88)
            verify(w, s);
        else
            do_release(w, s);
    }
    for (int i = 0; i < SLOTS; i++)
        if (w->slots[i].live)
            do_release(w, &w->slots[i]);
    return NULL;
}

static void *reader_main(void *arg)
{
    const struct timespec rest = {0, 50 * 1000};
    unsigned k = 0;

    (void)arg;
    while (!atomic_load(&done)) {
        cache_pool_stats_t st;

        cache_pool_stats(pool, &st);
        if (st.bytes_used + st.bytes_free != st.bytes_capacity || st.live_slots > MAX_SLOTS)
            FAIL("reader: inconsistent snapshot\n");
        (void)cache_pool_entries(pool);
        /* Pages given back to the kernel while the workers take and fill
         * them: a page trimmed in use would fail their verify(). */
        (void)cache_pool_trim(pool, 0);
        if (++k % 2 == 0)
            nanosleep(&rest, NULL);
    }
    return NULL;
}

START_TEST(test_pool_threads)
{
    const model_t *cfg_models[2];
    cache_pool_config_t cfg;
    worker_t *workers = calloc(THREADS, sizeof *workers);
    pthread_t reader;
    cache_pool_stats_t st;

    memset(&cfg, 0, sizeof(cfg)); /* every member set below; the prefix cache off */
    ck_assert_ptr_nonnull(workers);
    ck_assert_int_eq(model_create("hash", &models[0]), SLOTD_OK);
    ck_assert_int_eq(model_create("tiny", &models[1]), SLOTD_OK);
    cfg_models[0] = models[0];
    cfg_models[1] = models[1];
    cfg.max_slots = MAX_SLOTS;
    cfg.models = cfg_models;
    cfg.nmodels = 2;
    cfg.arena_factor = 2; /* as the daemon maps it */
    /* Three pages (one of them for the states): less than even one worker's
     * slots take at their usual length, so that refusals come whether the
     * workers run at once or, as under valgrind, one after another.  A
     * first pool tells the page size. */
    cfg.capacity_bytes = (size_t)1 << 30;
    ck_assert_int_eq(cache_pool_create(&cfg, &pool), SLOTD_OK);
    cfg.capacity_bytes = 3 * cache__pool_page_size(pool);
    cache_pool_destroy(pool);
    ck_assert_int_eq(cache_pool_create(&cfg, &pool), SLOTD_OK);

    atomic_store(&done, false);
    ck_assert_int_eq(pthread_create(&reader, NULL, reader_main, NULL), 0);
    for (uint32_t i = 0; i < THREADS; i++) {
        workers[i].index = i + 1;
        workers[i].rng = mix(i + 1000);
        ck_assert_int_eq(pthread_create(&workers[i].thread, NULL, worker_main, &workers[i]), 0);
    }
    for (uint32_t i = 0; i < THREADS; i++)
        ck_assert_int_eq(pthread_join(workers[i].thread, NULL), 0);
    atomic_store(&done, true);
    ck_assert_int_eq(pthread_join(reader, NULL), 0);

    printf("pool stress: %lu positions written, %lu releases, %lu refusals\n",
           atomic_load(&positions_written), atomic_load(&releases), atomic_load(&refusals));
    ck_assert_uint_eq(atomic_load(&failures), 0);
    /* The contention was real: the pool refused some requests. */
    ck_assert_uint_gt(atomic_load(&refusals), 0);
    ck_assert_uint_gt(atomic_load(&releases), THREADS * 100);

    cache_pool_stats(pool, &st);
    ck_assert_uint_eq(st.entries, 0);
    ck_assert_uint_eq(st.live_slots, 0);
    ck_assert_uint_eq(st.bytes_used, 0);
    ck_assert_uint_eq(st.bytes_free, st.bytes_capacity);
    ck_assert_uint_eq(cache_pool_entries(pool), 0);
    ck_assert_uint_eq(cache__pool_pages_free(pool), cache__pool_pages(pool));
    ck_assert_int_eq(cache__pool_check(pool), 0);

    cache_pool_destroy(pool);
    model_destroy(models[0]);
    model_destroy(models[1]);
    free(workers);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("pool_stress");
    TCase *tc = tcase_create("threads");
    SRunner *sr;
    int failed;

    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_pool_threads);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
