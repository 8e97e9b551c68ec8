/*
 * model.c: the family-independent half of the model interface.
 *
 * It owns the preset table (made from MODEL__PRESETS, model.h), model
 * creation in two parts (the shape and block plan, then the weights) and
 * destruction, the accessors and counters, the validation of requests
 * (model_check_prompt(), model_check_generate(), model_check_logits()),
 * the stateless operations built on model_run() and model_pick()
 * (model_logits(), model_generate()),
 * the heap chain, model_round6(), and model__alloc(), through which core/
 * allocates.  The arithmetic of each family, and the bytes inside a block,
 * belong to hash.c and attn.c, reached through the table of functions a
 * model points to.
 */
#include "model_int.h"
#include "sample.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(offsetof(model_block_t, data) == MODEL_BLOCK_HEADER,
               "a block's data starts MODEL_BLOCK_HEADER bytes in");

#define BLOCK_ALIGN 64

/* The memory bound the block sequence keeps (model.h): a chain and its
 * state, each object rounded up to PLAN_ALIGN bytes, hold at most
 * PLAN_NUM / PLAN_DEN x entries x entry size + PLAN_ALLOWANCE bytes. */
#define PLAN_NUM 11
#define PLAN_DEN 10
#define PLAN_ALLOWANCE 512
#define PLAN_ALIGN 64

/*
 * Candidate capacities.  hash: 16 + 8c a power of two (64 B ... 4 KiB), so
 * that no byte is lost to rounding.  attn: powers of two up to 16 (tiny: up
 * to its max_ctx), so that a pool page of 16 blocks of one position holds
 * exactly 16 / c blocks of c positions with at most 15 x 64 bytes left over
 * (the pool sizes its pages so, cache/pool.c); few sizes, so few classes.
 */
/* The presets: MODEL__PRESETS, model.h. */
#define PRESET_ROW(name, ...) {name, __VA_ARGS__},
static const model__shape_t presets[] = {MODEL__PRESETS(PRESET_ROW)};
#undef PRESET_ROW

/* "hash,tiny,small,base", a string literal made from the names (the
 * leading comma is skipped). */
#define PRESET_NAME(name, ...) "," name
static const char preset_names[] = MODEL__PRESETS(PRESET_NAME);
#undef PRESET_NAME

#define NPRESETS (sizeof(presets) / sizeof(presets[0]))
_Static_assert(NPRESETS == MODEL_NPRESETS, "MODEL_NPRESETS counts the rows");

static uint64_t plan_round(uint64_t n)
{
    return (n + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN;
}

/* Fixes the capacity of every block of a chain of max_ctx positions: each
 * block the largest candidate with which the chain holding one entry past
 * the blocks before it stays within the bound (the worst moment: a block
 * just added, one entry in it).  Greedy largest keeps the block count, and
 * so the headers, low.  Where no candidate fits, the smallest is taken
 * (no preset reaches that; the unit tests check the bound at every
 * length). */
static void plan_blocks(model_t *m)
{
    const uint64_t S = m->entry_size;
    uint64_t used = plan_round(m->state_size), room = 0;

    m->nblocks = 0;
    m->block_max = 0;
    while (room < m->shape.max_ctx) {
        uint64_t limit = PLAN_NUM * (room + 1) * S + PLAN_DEN * (uint64_t)PLAN_ALLOWANCE;
        uint32_t cap = m->shape.candidates[0];

        for (size_t i = 1; i < MODEL__MAX_CANDIDATES && m->shape.candidates[i] != 0; i++) {
            uint32_t c = m->shape.candidates[i];
            if (PLAN_DEN * (used + plan_round(MODEL_BLOCK_HEADER + c * S)) <= limit) {
                cap = c;
            }
        }
        if (m->nblocks == MODEL__MAX_BLOCKS) {
            /* No preset comes near; later blocks repeat the last one. */
            assert(!"model: more blocks than MODEL__MAX_BLOCKS");
            break;
        }
        m->block_cap[m->nblocks++] = cap;
        used += plan_round(MODEL_BLOCK_HEADER + cap * S);
        room += cap;
        if (cap > m->block_max) {
            m->block_max = cap;
        }
    }
}

_Atomic int model__alloc_fail_in = 0;

void *model__alloc(size_t align, size_t size)
{
    if (atomic_load_explicit(&model__alloc_fail_in, memory_order_relaxed) > 0 &&
        atomic_fetch_sub_explicit(&model__alloc_fail_in, 1, memory_order_relaxed) == 1) {
        return NULL;
    }
    if (align == 0) {
        return malloc(size);
    }
    return aligned_alloc(align, (size + align - 1) / align * align);
}

int model_create_shape(const char *preset, model_t **out)
{
    const model__shape_t *shape = NULL;
    size_t row = 0;
    model_t *m;

    assert(out != NULL);
    *out = NULL;
    for (size_t i = 0; preset != NULL && i < NPRESETS; i++) {
        if (strcmp(presets[i].name, preset) == 0) {
            shape = &presets[i];
            row = i;
        }
    }
    if (shape == NULL) {
        return SLOTD_EINVAL;
    }

    m = model__alloc(0, sizeof(*m));
    if (m == NULL) {
        return SLOTD_ENOMEM;
    }
    memset(m, 0, sizeof(*m));
    m->shape = *shape;
    m->preset = row;
    m->ops = shape->family == MODEL_FAMILY_HASH ? &model__hash_ops : model__attn_ops_for(shape->d);
    atomic_init(&m->g_calls, 0);
    atomic_init(&m->rows, 0);
    m->ops->sizes(m);
    plan_blocks(m);
    *out = m;
    return SLOTD_OK;
}

int model_build(model_t *m)
{
    int rc;

    assert(m != NULL);
    if (m->built) {
        return SLOTD_OK;
    }
    if (m->ops->init != NULL) {
        rc = m->ops->init(m);
        if (rc != SLOTD_OK) {
            return rc;
        }
    }
    m->built = true;
    return SLOTD_OK;
}

bool model_built(const model_t *m)
{
    return m->built;
}

int model_create(const char *preset, model_t **out)
{
    int rc = model_create_shape(preset, out);

    if (rc == SLOTD_OK && (rc = model_build(*out)) != SLOTD_OK) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

void model_destroy(model_t *m)
{
    if (m == NULL) {
        return;
    }
    if (m->built && m->ops->fini != NULL) {
        m->ops->fini(m);
    }
    free(m);
}

const char *model_presets(void)
{
    return preset_names + 1;
}

const char *model_preset_name(size_t i)
{
    return i < NPRESETS ? presets[i].name : NULL;
}

const char *model_name(const model_t *m)
{
    return m->shape.name;
}

size_t model_preset_index(const model_t *m)
{
    return m->preset;
}

model_family_t model_family(const model_t *m)
{
    return m->shape.family;
}

uint32_t model_vocab(const model_t *m)
{
    return m->shape.vocab;
}

uint32_t model_max_ctx(const model_t *m)
{
    return m->shape.max_ctx;
}

uint32_t model_layers(const model_t *m)
{
    return m->shape.layers;
}

size_t model_entry_size(const model_t *m)
{
    return m->entry_size;
}

uint32_t model_block_positions(const model_t *m)
{
    return m->block_max;
}

size_t model_block_bytes(const model_t *m)
{
    return model_block_bytes_for(m, m->block_max);
}

size_t model_block_bytes_for(const model_t *m, uint32_t capacity)
{
    return offsetof(model_block_t, data) + (size_t)capacity * m->entry_size;
}

uint32_t model_block_capacity(const model_t *m, uint32_t index)
{
    return m->block_cap[index < m->nblocks ? index : m->nblocks - 1];
}

uint32_t model_chain_blocks(const model_t *m, uint32_t positions, size_t align, size_t *bytes)
{
    uint64_t room = 0;
    size_t total = 0;
    uint32_t n = 0;

    assert(align > 0 && (align & (align - 1)) == 0);
    for (; room < positions; n++) {
        uint32_t cap = model_block_capacity(m, n);
        total += (model_block_bytes_for(m, cap) + align - 1) & ~(align - 1);
        room += cap;
    }
    if (bytes != NULL) {
        *bytes = total;
    }
    return n;
}

size_t model_state_size(const model_t *m)
{
    return m->state_size;
}

size_t model_scratch_size(const model_t *m)
{
    return m->scratch_size;
}

uint64_t model_g_calls(const model_t *m)
{
    return atomic_load_explicit(&((model_t *)m)->g_calls, memory_order_relaxed);
}

uint64_t model_rows(const model_t *m)
{
    return atomic_load_explicit(&((model_t *)m)->rows, memory_order_relaxed);
}

void model_run(const model_t *m, model_kv_t *kv, uint32_t token, void *scratch)
{
    assert(m != NULL && kv != NULL && m->built);
    assert(token < m->shape.vocab);
    assert(kv->len < m->shape.max_ctx);
    assert(kv->tail != NULL);
    assert(kv->state != NULL && (uintptr_t)kv->state % sizeof(uint64_t) == 0);
    assert(scratch != NULL || m->scratch_size == 0);
    m->ops->run(m, kv, token, scratch);
}

uint32_t model_pick(const model_t *m, const model_kv_t *kv, double *logits)
{
    assert(m != NULL && m->built && kv != NULL && kv->state != NULL);
    assert(kv->len >= 1);
    return m->ops->pick(m, kv, logits, NULL);
}

uint32_t model_pick_raw(const model_t *m, const model_kv_t *kv, double *raw)
{
    assert(m != NULL && kv != NULL && kv->state != NULL);
    assert(kv->len >= 1);
    return m->ops->pick(m, kv, NULL, raw);
}

/* ---- Batches ---- */

size_t model_batch_scratch_size(const model_t *m, size_t nb)
{
    size_t n;

    assert(nb >= 1 && nb <= MODEL_BATCH_MAX);
    if (m->ops->batch_scratch == NULL) {
        return m->scratch_size;
    }
    n = m->ops->batch_scratch(m, nb) * sizeof(double);
    assert(n <= m->scratch_size);
    return n;
}

void model_run_batch(const model_t *m, model_kv_t *const *kv, const uint32_t *tokens, size_t nb,
                     void *scratch)
{
    assert(m != NULL && m->built && nb <= MODEL_BATCH_MAX);
    for (size_t b = 0; b < nb; b++) {
        assert(tokens[b] < m->shape.vocab);
        assert(kv[b]->len < m->shape.max_ctx && kv[b]->tail != NULL && kv[b]->state != NULL);
        for (size_t c = 0; c < b; c++) {
            /* Chains may share the blocks before their tails (core/model.h);
             * the blocks written, and the states, are each one's own. */
            assert(kv[c] != kv[b] && kv[c]->tail != kv[b]->tail && kv[c]->state != kv[b]->state);
        }
    }
    if (m->ops->run_batch == NULL || nb == 1) {
        for (size_t b = 0; b < nb; b++) {
            m->ops->run(m, kv[b], tokens[b], scratch);
        }
        return;
    }
    m->ops->run_batch(m, kv, tokens, nb, scratch);
}

void model_pick_batch(const model_t *m, const model_kv_t *const *kv, size_t nb, uint32_t *tokens,
                      double *const *logits, void *scratch)
{
    assert(m != NULL && nb <= MODEL_BATCH_MAX);
    for (size_t b = 0; b < nb; b++) {
        assert(kv[b]->len >= 1 && kv[b]->state != NULL);
    }
    model_pick_batch_rows(m, kv, nb, tokens, logits, NULL, scratch);
}

void model_pick_batch_rows(const model_t *m, const model_kv_t *const *kv, size_t nb,
                           uint32_t *tokens, double *const *logits, double *const *raw,
                           void *scratch)
{
    assert(m != NULL && nb <= MODEL_BATCH_MAX);
    if (m->ops->pick_batch == NULL || nb == 1) {
        for (size_t b = 0; b < nb; b++) {
            tokens[b] = m->ops->pick(m, kv[b], logits != NULL ? logits[b] : NULL,
                                     raw != NULL ? raw[b] : NULL);
        }
        return;
    }
    m->ops->pick_batch(m, kv, nb, tokens, logits, raw, scratch);
}

void model_prefill(const model_t *m, model_kv_t *kv, const uint32_t *tokens, size_t n,
                   void *scratch)
{
    assert(m != NULL && m->built && kv != NULL && kv->state != NULL);
    assert(n <= m->shape.max_ctx - kv->len);
    for (size_t i = 0; i < n; i++) {
        assert(tokens[i] < m->shape.vocab);
    }
    if (n == 0) {
        return;
    }
    assert(kv->tail != NULL);
    if (m->ops->prefill == NULL || n == 1) {
        for (size_t i = 0; i < n; i++) {
            m->ops->run(m, kv, tokens[i], scratch);
        }
        return;
    }
    m->ops->prefill(m, kv, tokens, n, scratch);
}

bool model_batch_shares(const model_t *m)
{
    return m->ops->run_batch != NULL;
}

/* The definition: print as printf("%.6f") does, and read the decimal back
 * (strtod is correctly rounded, so this is the double nearest to it). */
static double round6_printf(double x)
{
    char buf[512];

    snprintf(buf, sizeof(buf), "%.6f", x);
    return strtod(buf, NULL);
}

/* The fast path (model__round6_fast(), which says why it is exact) where it
 * answers, else the definition. */
double model_round6(double x)
{
    double r;

    if (model__round6_fast(x, &r)) {
        return r;
    }
    return round6_printf(x);
}

/* ---- Validation ---- */

static int check_tokens(const model_t *m, const char *field, const int64_t *tokens, size_t n,
                        slotd_error_t *err)
{
    if (n == 0) {
        return slotd_error_set(err, SLOTD_EBAD_REQUEST, "%s: must hold at least one token", field);
    }
    assert(tokens != NULL);
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= (int64_t)m->shape.vocab) {
            return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                                   "%s: token %lld at index %zu is not in [0, %u) for model '%s'",
                                   field, (long long)tokens[i], i, m->shape.vocab, m->shape.name);
        }
    }
    return SLOTD_OK;
}

int model_check_prompt(const model_t *m, const int64_t *prompt, size_t n, slotd_error_t *err)
{
    int rc = check_tokens(m, "prompt", prompt, n, err);

    if (rc != SLOTD_OK) {
        return rc;
    }
    if (n > m->shape.max_ctx) {
        return slotd_error_set(err, SLOTD_ETOO_LONG,
                               "length: the prompt's %zu tokens pass max_ctx %u of model '%s'", n,
                               m->shape.max_ctx, m->shape.name);
    }
    return SLOTD_OK;
}

int model_check_generate(const model_t *m, const int64_t *tokens, size_t n, int64_t steps,
                         slotd_error_t *err)
{
    int rc = check_tokens(m, "tokens", tokens, n, err);

    if (rc != SLOTD_OK) {
        return rc;
    }
    if (steps < 0) {
        return slotd_error_set(err, SLOTD_EBAD_REQUEST, "steps: %lld is negative",
                               (long long)steps);
    }
    if (n > m->shape.max_ctx || (uint64_t)steps > m->shape.max_ctx - n) {
        return slotd_error_set(err, SLOTD_ETOO_LONG,
                               "length: %zu tokens plus %lld steps pass max_ctx %u of model '%s'",
                               n, (long long)steps, m->shape.max_ctx, m->shape.name);
    }
    return SLOTD_OK;
}

int model_check_logits(const model_t *m, const int64_t *tokens, size_t n, slotd_error_t *err)
{
    int rc = check_tokens(m, "tokens", tokens, n, err);

    if (rc != SLOTD_OK) {
        return rc;
    }
    if (n > m->shape.max_ctx) {
        return slotd_error_set(err, SLOTD_ETOO_LONG,
                               "length: %zu tokens pass max_ctx %u of model '%s'", n,
                               m->shape.max_ctx, m->shape.name);
    }
    return SLOTD_OK;
}

/* ---- The stateless operations ---- */

/* The chain and scratch one stateless call works with: the caller's, or
 * its own from the heap, freed by call_end(). */
typedef struct call {
    model_kv_t *kv;
    void *scratch;
    model_kv_t own_kv;
    void *own_scratch;
} call_t;

static int call_begin(const model_t *m, call_t *c, model_kv_t *kv, void *scratch,
                      uint32_t positions, slotd_error_t *err)
{
    memset(c, 0, sizeof(*c));
    if (kv == NULL) {
        if (model_kv_heap_alloc(m, positions, &c->own_kv) != SLOTD_OK) {
            return slotd_error_set(err, SLOTD_ENOMEM, "model '%s': no memory for %u positions",
                                   m->shape.name, positions);
        }
        kv = &c->own_kv;
    }
    assert(kv->len == 0 && kv->tail == kv->head);
    c->kv = kv;
    if (scratch == NULL && m->scratch_size > 0) {
        c->own_scratch = model__alloc(0, m->scratch_size);
        if (c->own_scratch == NULL) {
            model_kv_heap_free(&c->own_kv);
            return slotd_error_set(err, SLOTD_ENOMEM, "model '%s': no memory for scratch",
                                   m->shape.name);
        }
        scratch = c->own_scratch;
    }
    c->scratch = scratch;
    return SLOTD_OK;
}

static void call_end(call_t *c)
{
    free(c->own_scratch);
    if (c->kv == &c->own_kv) {
        model_kv_heap_free(&c->own_kv);
    }
}

/* model_prefill() of validated 64-bit tokens, MODEL_BATCH_MAX at a time. */
static void prefill_i64(const model_t *m, model_kv_t *kv, const int64_t *tokens, size_t n,
                        void *scratch)
{
    uint32_t chunk[MODEL_BATCH_MAX];

    for (size_t i = 0; i < n;) {
        size_t k = 0;
        for (; k < MODEL_BATCH_MAX && i + k < n; k++) {
            chunk[k] = (uint32_t)tokens[i + k];
        }
        model_prefill(m, kv, chunk, k, scratch);
        i += k;
    }
}

int model_logits(const model_t *m, const int64_t *tokens, size_t n, model_kv_t *kv, void *scratch,
                 double *logits, uint64_t *rows, slotd_error_t *err)
{
    call_t c;
    int rc;

    if (m->shape.family != MODEL_FAMILY_ATTN) {
        return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                               "model: '%s' has no logits; logits needs an attn model",
                               m->shape.name);
    }
    rc = model_check_logits(m, tokens, n, err);
    if (rc != SLOTD_OK) {
        return rc;
    }
    rc = call_begin(m, &c, kv, scratch, (uint32_t)n, err);
    if (rc != SLOTD_OK) {
        return rc;
    }
    prefill_i64(m, c.kv, tokens, n, c.scratch);
    model_pick(m, c.kv, logits);
    call_end(&c);
    if (rows != NULL) {
        *rows = (uint64_t)m->shape.layers * n;
    }
    return SLOTD_OK;
}

int model_generate(const model_t *m, const int64_t *tokens, size_t n, int64_t steps, bool use_cache,
                   model_kv_t *kv, void *scratch, uint32_t *out_tokens, double *logits,
                   uint64_t *rows, slotd_error_t *err)
{
    return model_generate_decode(m, tokens, n, steps, use_cache, NULL, kv, scratch, out_tokens,
                                 logits, NULL, rows, err);
}

int model_generate_decode(const model_t *m, const int64_t *tokens, size_t n, int64_t steps,
                          bool use_cache, const model_decode_t *dc, model_kv_t *kv, void *scratch,
                          uint32_t *out_tokens, double *logits, size_t *picked, uint64_t *rows,
                          slotd_error_t *err)
{
    size_t vocab = m->shape.vocab, k = 0;
    uint64_t runs = 0;
    call_t c;
    int rc;

    rc = model_check_generate(m, tokens, n, steps, err);
    if (rc != SLOTD_OK) {
        return rc;
    }
    rc = call_begin(m, &c, kv, scratch, (uint32_t)(n + (size_t)steps), err);
    if (rc != SLOTD_OK) {
        return rc;
    }
    assert(out_tokens != NULL);
    for (size_t i = 0; i < n; i++) {
        out_tokens[i] = (uint32_t)tokens[i];
    }

    if (use_cache && steps > 0) {
        /* Each position runs once; the last pick is never run. */
        model_prefill(m, c.kv, out_tokens, n, c.scratch);
        runs = n;
        while (k < (size_t)steps) {
            double *row = logits != NULL ? logits + k * vocab : NULL;
            out_tokens[n + k] = model_decode_pick(m, c.kv, dc, row, c.scratch);
            k++;
            if (model_decode_stops(dc, out_tokens[n + k - 1]))
                break;
            if (k < (size_t)steps) {
                model_run(m, c.kv, out_tokens[n + k - 1], c.scratch);
                runs++;
            }
        }
    } else if (!use_cache) {
        /* Every pick starts from an empty chain and reruns every position. */
        while (k < (size_t)steps) {
            double *row = logits != NULL ? logits + k * vocab : NULL;
            model_kv_rewind(c.kv);
            model_prefill(m, c.kv, out_tokens, n + k, c.scratch);
            runs += n + k;
            out_tokens[n + k] = model_decode_pick(m, c.kv, dc, row, c.scratch);
            k++;
            if (model_decode_stops(dc, out_tokens[n + k - 1]))
                break;
        }
    }
    if (picked != NULL) {
        *picked = k;
    }
    call_end(&c);
    if (rows != NULL) {
        *rows = (uint64_t)m->shape.layers * runs;
    }
    return SLOTD_OK;
}

/* ---- The heap chain ---- */

int model_kv_heap_alloc(const model_t *m, uint32_t positions, model_kv_t *kv)
{
    model_block_t **link = &kv->head;
    uint32_t i = 0;

    memset(kv, 0, sizeof(*kv));
    kv->state = model__alloc(0, m->state_size);
    if (kv->state == NULL) {
        return SLOTD_ENOMEM;
    }
    for (uint64_t have = 0; have < positions; i++) {
        uint32_t cap = model_block_capacity(m, i);
        model_block_t *b = model__alloc(BLOCK_ALIGN, model_block_bytes_for(m, cap));
        if (b == NULL) {
            model_kv_heap_free(kv);
            return SLOTD_ENOMEM;
        }
        b->next = NULL;
        b->capacity = cap;
        b->first = (uint32_t)have;
        *link = b;
        link = &b->next;
        have += cap;
    }
    kv->tail = kv->head;
    return SLOTD_OK;
}

void model_kv_heap_free(model_kv_t *kv)
{
    model_block_t *b = kv->head;

    while (b != NULL) {
        model_block_t *next = b->next;
        free(b);
        b = next;
    }
    free(kv->state);
    memset(kv, 0, sizeof(*kv));
}

void model_kv_rewind(model_kv_t *kv)
{
    kv->len = 0;
    kv->tail = kv->head;
}

void model_kv_resume(const model_t *m, model_kv_t *kv)
{
    const model_block_t *b = kv->head;
    uint64_t sum = 0;
    uint32_t bi = 0;

    if (m->shape.family != MODEL_FAMILY_HASH || kv->len == 0) {
        return;
    }
    /* hash: the state is the sum (mod 2^64) of the entries, in order. */
    for (uint32_t p = 0; p < kv->len; p++) {
        if (p - b->first == b->capacity) {
            b = model__kv_next(kv, b, &bi);
        }
        sum += ((const uint64_t *)(const void *)b->data)[model__block_slot(b, p)];
    }
    memcpy(kv->state, &sum, sizeof(sum));
}

#if SLOTD_FAULT_INJECTION
/* ---- Fault injection (test builds only) ---- */

void model_fault_corrupt(const model_t *m, model_kv_t *kv, uint32_t pos)
{
    model_block_t *b = kv->head;
    uint32_t per, slot, bi = 0;

    assert(pos < kv->len);
    while (pos - b->first >= b->capacity) {
        b = model__kv_next(kv, b, &bi);
    }
    per = b->capacity;
    slot = model__block_slot(b, pos);
    if (m->shape.family == MODEL_FAMILY_HASH) {
        uint64_t *entry = (uint64_t *)(void *)b->data + slot;
        uint64_t old = *entry, bad = old ^ UINT64_C(0x8000000100000001);
        uint64_t *sum = kv->state;

        *entry = bad;
        *sum = *sum - old + bad;
    } else {
        /* Layer 0's area: Kt (d rows of `per`), then V row major. */
        double *v =
            (double *)(void *)b->data + (size_t)per * m->shape.d + (size_t)slot * m->shape.d;
        uint64_t bits;

        memcpy(&bits, v, sizeof(bits));
        bits ^= UINT64_C(0x8010000000000000); /* the sign, and the exponent's lowest bit */
        memcpy(v, &bits, sizeof(bits));
    }
}
#endif
