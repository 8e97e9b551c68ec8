/*
 * audit.c: the cache audit's worker side (see audit.h): the recorded token
 * arrays, the per-worker sampling PRNG, and the uncached recompute and
 * comparison of one step request.
 *
 * It owns, per worker, one heap chain per model (model_kv_heap_alloc()
 * with room for that model's max_ctx), the int64 input and uint32 output
 * token arrays of the uncached call, and a buffer of reference logits
 * kept at 16 rows of the largest vocabulary (grown for one larger request,
 * then trimmed back).
 *
 * DESIGN.  Every field of an audit_worker_t is used by its worker only;
 * the rest of the audit_t is immutable after audit_create().  The parts
 * are cache-line aligned so that workers never share a line.  Nothing here
 * takes a lock or touches the pool: the recompute runs on the worker's own
 * chain, so an audit never competes with clients for pool memory.
 */
#include "audit.h"

#include <stdlib.h>
#include <string.h>

/* Rows of reference logits each worker keeps ready. */
#define AUDIT_BASE_ROWS 16

typedef struct audit_worker {
    uint64_t rng;       /* xorshift64* state, never 0 */
    model_kv_t *chains; /* one per model, a->models order */
    int64_t *input;     /* a->max_ctx values */
    uint32_t *output;   /* a->max_ctx values */
    double *logits;     /* logits_len values */
    size_t logits_len;
} __attribute__((aligned(64))) audit_worker_t;

struct audit {
    uint64_t threshold; /* audit when the PRNG's draw is below; unused when `always` */
    bool always;        /* rate 1 */
    const model_t *const *models;
    size_t nmodels;
    uint32_t max_ctx;   /* the largest of the models */
    size_t base_logits; /* AUDIT_BASE_ROWS * the largest vocabulary (at least 1) */
    size_t worker_bytes;
    unsigned nworkers;
    audit_worker_t *workers; /* nworkers, aligned */
};

/* ---- Recorded tokens ---- */

int audit_tokens_grow(audit_tokens_t *t, uint32_t more)
{
    uint64_t want = (uint64_t)t->len + more;
    uint64_t cap = t->cap > 0 ? t->cap : 64;
    uint32_t *v;

    if (want <= t->cap)
        return SLOTD_OK;
    while (cap < want)
        cap *= 2;
    if (cap > UINT32_MAX) {
        if (want > UINT32_MAX)
            return SLOTD_ENOMEM;
        cap = want;
    }
    v = realloc(t->v, (size_t)cap * sizeof(*v));
    if (v == NULL)
        return SLOTD_ENOMEM;
    t->v = v;
    t->cap = (uint32_t)cap;
    return SLOTD_OK;
}

void audit_tokens_free(audit_tokens_t *t)
{
    free(t->v);
    t->v = NULL;
    t->len = t->cap = 0;
}

/* ---- Set-up ---- */

static uint64_t splitmix(uint64_t x)
{
    uint64_t z = x + UINT64_C(0x9E3779B97F4A7C15);
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static void worker_free(const audit_t *a, audit_worker_t *w)
{
    if (w->chains != NULL)
        for (size_t i = 0; i < a->nmodels; i++)
            model_kv_heap_free(&w->chains[i]);
    free(w->chains);
    free(w->input);
    free(w->output);
    free(w->logits);
}

static int worker_init(const audit_t *a, audit_worker_t *w, unsigned index)
{
    memset(w, 0, sizeof(*w));
    w->rng = splitmix(index) | 1; /* a fixed stream per worker: runs repeat */
    w->chains = calloc(a->nmodels, sizeof(*w->chains));
    w->input = malloc((size_t)a->max_ctx * sizeof(*w->input));
    w->output = malloc((size_t)a->max_ctx * sizeof(*w->output));
    w->logits = malloc(a->base_logits * sizeof(*w->logits));
    w->logits_len = a->base_logits;
    if (w->chains == NULL || w->input == NULL || w->output == NULL || w->logits == NULL)
        return SLOTD_ENOMEM;
    for (size_t i = 0; i < a->nmodels; i++)
        if (model_kv_heap_alloc(a->models[i], model_max_ctx(a->models[i]), &w->chains[i]) !=
            SLOTD_OK)
            return SLOTD_ENOMEM;
    return SLOTD_OK;
}

int audit_create(double rate, unsigned threads, const model_t *const *models, size_t nmodels,
                 audit_t **out)
{
    audit_t *a;
    size_t max_vocab = 1;

    if (!(rate > 0.0 && rate <= 1.0) || threads == 0)
        return SLOTD_EINVAL;
    a = calloc(1, sizeof(*a));
    if (a == NULL)
        return SLOTD_ENOMEM;
    a->always = rate >= 1.0;
    a->threshold = a->always ? UINT64_MAX : (uint64_t)(rate * 0x1p64);
    a->models = models;
    a->nmodels = nmodels;
    a->max_ctx = 1;
    for (size_t i = 0; i < nmodels; i++) {
        const model_t *m = models[i];
        size_t chain_bytes = 0;
        model_chain_blocks(m, model_max_ctx(m), 1, &chain_bytes);
        if (model_max_ctx(m) > a->max_ctx)
            a->max_ctx = model_max_ctx(m);
        if (model_family(m) == MODEL_FAMILY_ATTN && model_vocab(m) > max_vocab)
            max_vocab = model_vocab(m);
        a->worker_bytes += chain_bytes + model_state_size(m);
    }
    a->base_logits = AUDIT_BASE_ROWS * max_vocab;
    a->worker_bytes +=
        (size_t)a->max_ctx * (sizeof(int64_t) + sizeof(uint32_t)) + a->base_logits * sizeof(double);

    a->nworkers = threads;
    a->workers = aligned_alloc(64, (size_t)threads * sizeof(audit_worker_t));
    if (a->workers == NULL) {
        free(a);
        return SLOTD_ENOMEM;
    }
    for (unsigned i = 0; i < threads; i++) {
        if (worker_init(a, &a->workers[i], i) != SLOTD_OK) {
            for (unsigned j = 0; j <= i; j++)
                worker_free(a, &a->workers[j]);
            free(a->workers);
            free(a);
            return SLOTD_ENOMEM;
        }
    }
    *out = a;
    return SLOTD_OK;
}

void audit_destroy(audit_t *a)
{
    if (a == NULL)
        return;
    for (unsigned i = 0; i < a->nworkers; i++)
        worker_free(a, &a->workers[i]);
    free(a->workers);
    free(a);
}

size_t audit_worker_bytes(const audit_t *a)
{
    return a->worker_bytes;
}

/* ---- The worker side ---- */

bool audit_due(audit_t *a, unsigned worker)
{
    audit_worker_t *w = &a->workers[worker];
    uint64_t x = w->rng;

    if (a->always)
        return true;
    x ^= x >> 12; /* xorshift64* */
    x ^= x << 25;
    x ^= x >> 27;
    w->rng = x;
    return x * UINT64_C(0x2545F4914F6CDD1D) < a->threshold;
}

int audit_check(audit_t *a, unsigned worker, const model_t *m, const uint32_t *history,
                uint32_t len, uint32_t n, void *scratch, uint32_t *tokens, double *logits,
                uint32_t *first_bad)
{
    audit_worker_t *w = &a->workers[worker];
    bool attn = model_family(m) == MODEL_FAMILY_ATTN && logits != NULL;
    size_t vocab = model_vocab(m), need = attn ? (size_t)n * vocab : 0;
    model_kv_t *chain = NULL;
    slotd_error_t err;
    int rc;

    *first_bad = UINT32_MAX;
    for (size_t i = 0; i < a->nmodels; i++)
        if (a->models[i] == m)
            chain = &w->chains[i];
    if (chain == NULL || len == 0 || n == 0 || (uint64_t)len + n > model_max_ctx(m))
        return SLOTD_EINVAL;
    if (need > w->logits_len) {
        double *grown = malloc(need * sizeof(*grown));
        if (grown == NULL)
            return SLOTD_ENOMEM;
        free(w->logits);
        w->logits = grown;
        w->logits_len = need;
    }

    for (uint32_t i = 0; i < len; i++)
        w->input[i] = history[i];
    model_kv_rewind(chain);
    rc = model_generate(m, w->input, len, n, false, chain, scratch, w->output,
                        attn ? w->logits : NULL, NULL, &err);
    if (rc != SLOTD_OK)
        return rc; /* the history holds a token out of range: a bug upstream */

    for (uint32_t i = 0; i < n; i++) {
        if (w->output[len + i] != tokens[i] ||
            (attn &&
             memcmp(w->logits + i * vocab, logits + i * vocab, vocab * sizeof(double)) != 0)) {
            *first_bad = i;
            break;
        }
    }
    if (*first_bad != UINT32_MAX) {
        memcpy(tokens, w->output + len, (size_t)n * sizeof(*tokens));
        if (attn)
            memcpy(logits, w->logits, need * sizeof(*logits));
    }

    if (w->logits_len > a->base_logits) { /* give back what a large n took */
        double *base = realloc(w->logits, a->base_logits * sizeof(*base));
        if (base != NULL) {
            w->logits = base;
            w->logits_len = a->base_logits;
        }
    }
    return SLOTD_OK;
}
