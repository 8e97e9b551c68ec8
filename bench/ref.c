/*
 * ref.c: the reference cache of ref.h.  An open-addressing table of pointers
 * to references, keyed by a hash of (prompt, steps), grown at half load.  A
 * reference that no longer fits the byte budget is computed, handed out and
 * freed when its last holder puts it back; cached references stay until the
 * cache is destroyed.  Single-threaded: each generator thread has its own.
 */
#include "ref.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ref_cache {
    const model_t *model;
    size_t max_bytes;
    size_t bytes;
    ref_t **slots; /* power-of-two table, NULL = empty */
    size_t cap;
    size_t count;
    uint64_t hits;
    uint64_t misses;
};

static uint64_t mix(uint64_t x)
{
    x += UINT64_C(0x9E3779B97F4A7C15);
    x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
    return x ^ (x >> 31);
}

static uint64_t key_hash(const int64_t *prompt, uint32_t n, uint32_t steps)
{
    uint64_t h = mix(((uint64_t)n << 32) | steps);
    for (uint32_t i = 0; i < n; i++) {
        h = mix(h ^ (uint64_t)prompt[i]);
    }
    return h;
}

static int key_eq(const ref_t *r, uint64_t h, const int64_t *prompt, uint32_t n, uint32_t steps)
{
    return r->_hash == h && r->_prompt_len == n && r->steps == steps &&
           memcmp(r->_prompt, prompt, n * sizeof(*prompt)) == 0;
}

static void ref_free(ref_t *r)
{
    if (r == NULL) {
        return;
    }
    free(r->tokens);
    free(r->offsets);
    free(r->text);
    free(r->_prompt);
    free(r);
}

int ref_cache_create(const model_t *m, size_t max_bytes, ref_cache_t **out)
{
    ref_cache_t *rc = calloc(1, sizeof(*rc));

    *out = NULL;
    if (rc == NULL) {
        return -1;
    }
    rc->model = m;
    rc->max_bytes = max_bytes;
    rc->cap = 256;
    rc->slots = calloc(rc->cap, sizeof(*rc->slots));
    if (rc->slots == NULL) {
        free(rc);
        return -1;
    }
    *out = rc;
    return 0;
}

void ref_cache_destroy(ref_cache_t *rc)
{
    if (rc == NULL) {
        return;
    }
    for (size_t i = 0; i < rc->cap; i++) {
        ref_free(rc->slots[i]);
    }
    free(rc->slots);
    free(rc);
}

static int grow(ref_cache_t *rc)
{
    size_t cap = rc->cap * 2;
    ref_t **slots = calloc(cap, sizeof(*slots));

    if (slots == NULL) {
        return -1;
    }
    for (size_t i = 0; i < rc->cap; i++) {
        ref_t *r = rc->slots[i];
        if (r != NULL) {
            size_t j = (size_t)r->_hash & (cap - 1);
            while (slots[j] != NULL) {
                j = (j + 1) & (cap - 1);
            }
            slots[j] = r;
        }
    }
    free(rc->slots);
    rc->slots = slots;
    rc->cap = cap;
    return 0;
}

/* Runs the uncached reference and prints its logits. */
static ref_t *compute(const model_t *m, const int64_t *prompt, uint32_t n, uint32_t steps,
                      uint64_t h, char *err, size_t errlen)
{
    uint32_t vocab = model_family(m) == MODEL_FAMILY_ATTN ? model_vocab(m) : 0;
    size_t nlog = (size_t)steps * vocab;
    uint32_t *all = malloc(((size_t)n + steps) * sizeof(*all));
    double *logits = nlog > 0 ? malloc(nlog * sizeof(*logits)) : NULL;
    ref_t *r = calloc(1, sizeof(*r));
    slotd_error_t e;
    uint64_t rows = 0;
    size_t len = 0;
    int rc;

    if (all == NULL || r == NULL || (nlog > 0 && logits == NULL)) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    rc = model_generate(m, prompt, n, steps, false, NULL, NULL, all, logits, &rows, &e);
    if (rc != SLOTD_OK) {
        snprintf(err, errlen, "reference: %s: %s", slotd_err_name(rc), e.message);
        goto fail;
    }
    r->steps = steps;
    r->vocab = vocab;
    r->tokens = malloc((steps > 0 ? steps : 1) * sizeof(*r->tokens));
    r->offsets = malloc((nlog > 0 ? nlog : 1) * sizeof(*r->offsets));
    r->text = malloc(nlog * 24 + 1);
    r->_prompt = malloc((size_t)n * sizeof(*r->_prompt));
    if (r->tokens == NULL || r->offsets == NULL || r->text == NULL || r->_prompt == NULL) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    memcpy(r->tokens, all + n, (size_t)steps * sizeof(*r->tokens));
    memcpy(r->_prompt, prompt, (size_t)n * sizeof(*prompt));
    r->text[0] = '\0';
    for (size_t i = 0; i < nlog; i++) {
        int w = snprintf(r->text + len, 24, "%.6f", logits[i]);
        if (w < 0 || w >= 24) {
            snprintf(err, errlen, "reference: logit %zu does not print in 23 bytes", i);
            goto fail;
        }
        r->offsets[i] = (uint32_t)len;
        len += (size_t)w + 1;
    }
    r->_prompt_len = n;
    r->_hash = h;
    r->_bytes = sizeof(*r) + (size_t)steps * 4 + nlog * 4 + len + (size_t)n * 8;
    free(all);
    free(logits);
    return r;

fail:
    free(all);
    free(logits);
    ref_free(r);
    return NULL;
}

ref_t *ref_get(ref_cache_t *rc, const int64_t *prompt, uint32_t n, uint32_t steps, char *err,
               size_t errlen)
{
    uint64_t h = key_hash(prompt, n, steps);
    size_t j = (size_t)h & (rc->cap - 1);
    ref_t *r;

    while (rc->slots[j] != NULL) {
        if (key_eq(rc->slots[j], h, prompt, n, steps)) {
            rc->hits++;
            rc->slots[j]->_refs++;
            return rc->slots[j];
        }
        j = (j + 1) & (rc->cap - 1);
    }
    rc->misses++;
    r = compute(rc->model, prompt, n, steps, h, err, errlen);
    if (r == NULL) {
        return NULL;
    }
    r->_refs = 1;
    if (rc->bytes + r->_bytes <= rc->max_bytes) {
        if ((rc->count + 1) * 2 > rc->cap) {
            if (grow(rc) != 0) {
                return r; /* not kept; freed by its last ref_put() */
            }
            j = (size_t)h & (rc->cap - 1);
            while (rc->slots[j] != NULL) {
                j = (j + 1) & (rc->cap - 1);
            }
        }
        rc->slots[j] = r;
        rc->count++;
        rc->bytes += r->_bytes;
        r->_cached = 1;
    }
    return r;
}

void ref_put(ref_cache_t *rc, ref_t *r)
{
    (void)rc;
    if (r == NULL) {
        return;
    }
    r->_refs--;
    if (r->_refs == 0 && !r->_cached) {
        ref_free(r);
    }
}

void ref_cache_counts(const ref_cache_t *rc, uint64_t *hits, uint64_t *misses)
{
    *hits = rc->hits;
    *misses = rc->misses;
}
