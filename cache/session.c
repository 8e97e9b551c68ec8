/*
 * session.c: a request's decode session, the calls a worker makes between
 * the slot pool and a model.
 *
 * It owns the order of those calls and the all-or-nothing rule of
 * session.h: every check that can fail (the prompt, the context limit, the
 * pool's room) is made before the first model_run(), and a start that fails
 * after acquiring its slot releases it before returning.  Once the pool has
 * reserved room, nothing on the path can fail: model_run() asserts its
 * preconditions instead of checking them, and those were checked here.
 * The step path allocates nothing: it writes into blocks the pool reserved.
 *
 * A rebuild (cache_session_rebuild()) reruns every position of a live slot
 * from the tokens the caller recorded, in the room the slot already has:
 * the repair the server's cache audit applies to a slot it found wrong.
 * Test builds (SLOTD_FAULT_INJECTION) add cache_session_fault_corrupt(),
 * which damages a slot on purpose so that the audit has something to find.
 *
 * The stateless operations (logits, generate) run in a slot borrowed under
 * an owner no client can name (key 0 and the empty id; request ids have at
 * least one character) and give it back before returning, so a borrowed
 * slot never outlives its call.
 */
#include "cache/session.h"

#include <assert.h>
#include <stdlib.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* The owner of borrowed slots: the empty id is not a valid request id. */
static const cache_owner_t slot_borrower = {.key = 0, .id = ""};

/* Fills `err` for a pool failure met by `op` on behalf of `id`.  A refusal
 * names what ran out: a slot (the table is as large as the session limit
 * allows), which only an acquire (`acquire`) can meet, or the pool's
 * bytes.  For bytes it says what the request needed more (`need`) against
 * what was free, in the bytes cache_pool_stats() counts, and whether a
 * retry can succeed: never when the slot would hold more (`whole`) than
 * the whole pool. */
static int pool_error(cache_pool_t *p, slotd_error_t *err, int rc, bool acquire, const char *op,
                      const char *id, uint64_t need, uint64_t whole)
{
    char who[CACHE_ID_MAX + 8] = "it";
    cache_pool_stats_t st;

    if (id[0] != '\0')
        snprintf(who, sizeof(who), "'%s'", id);
    if (rc != SLOTD_ECACHE_FULL)
        return slotd_error_set(err, rc, "%s: %s (%s)", op, slotd_strerror(rc), who);
    cache_pool_stats(p, &st);
    if (acquire && st.live_slots >= st.max_slots)
        return slotd_error_set(err, rc,
                               "%s: no free slot for %s: every slot is taken (--max-sessions); "
                               "retry when sessions finish",
                               op, who);
    if (whole > st.bytes_capacity)
        return slotd_error_set(err, rc,
                               "%s: %s needs %" PRIu64 " bytes, more than the pool's whole "
                               "memory, %" PRIu64 " (--cache-mb): it can never fit",
                               op, who, whole, st.bytes_capacity);
    return slotd_error_set(err, rc,
                           "%s: the pool's memory is full: %s needs %" PRIu64
                           " more bytes, %" PRIu64 " of its %" PRIu64
                           " are free%s (--cache-mb); retry when sessions finish",
                           op, who, need, st.bytes_free, st.bytes_capacity,
                           st.bytes_free >= need ? ", in pages of other sizes" : "");
}

/* pool_error() for a step of `n` that the pool refused: it needed
 * the blocks between the slot's entries and `n` more (the state it has). */
static int step_error(cache_pool_t *p, const cache_session_t *s, uint32_t n, int rc,
                      slotd_error_t *err)
{
    uint64_t before = cache_pool_slot_bytes(s->model, s->entries);
    uint64_t after = cache_pool_slot_bytes(s->model, s->entries + n);

    return pool_error(p, err, rc, false, "step", s->owner.id, after - before, after);
}

/* The end of the block of `m` that holds position n: the entries at which
 * a chain of n entries next fills a block.  O(blocks), once a block. */
static uint32_t full_after(const model_t *m, uint32_t n)
{
    uint64_t end = 0;

    for (uint32_t i = 0; end <= n; i++)
        end += model_block_capacity(m, i);
    return end > UINT32_MAX ? UINT32_MAX : (uint32_t)end;
}

/* cache_session_start(), and with `toks` (the prompt as uint32_t, NULL:
 * no prefix cache) its reuse of cached blocks of `scope`. */
static int session__start(cache_pool_t *p, const model_t *m, const cache_owner_t *owner,
                          const int64_t *prompt, size_t n, const uint32_t *toks, uint64_t scope,
                          void *scratch, cache_session_t *s, uint32_t *cached, slotd_error_t *err)
{
    cache_handle_t h;
    model_kv_t kv;
    uint32_t reused = 0;
    bool stuck = false;
    int rc;

    rc = cache_pool_acquire(p, m, owner, &h);
    if (rc != SLOTD_OK) {
        return pool_error(p, err, rc, true, "start", owner->id,
                          cache_pool_slot_bytes(m, (uint32_t)n),
                          cache_pool_slot_bytes(m, (uint32_t)n));
    }
    if (toks != NULL) {
        rc = cache_pool_prefix_attach(p, h, owner, scope, toks, (uint32_t)n, &reused);
        if (rc != SLOTD_OK) {
            goto fail_release;
        }
    }
    rc = cache_pool_reserve(p, h, owner, (uint32_t)(n - reused), &kv);
    if (rc != SLOTD_OK) {
        goto fail_release;
    }
    assert(kv.len == reused && reused < n);
    if (reused > 0) {
        model_kv_resume(m, &kv);
    }
    /* Layer by layer over MODEL_BATCH_MAX positions at a time (validated:
     * every token is in [0, V)). */
    for (size_t i = reused; i < n;) {
        uint32_t chunk[MODEL_BATCH_MAX];
        size_t k = 0;
        for (; k < MODEL_BATCH_MAX && i + k < n; k++) {
            chunk[k] = (uint32_t)prompt[i + k];
        }
        model_prefill(m, &kv, chunk, k, scratch);
        i += k;
    }
    rc = cache_pool_commit(p, h, owner, &kv);
    if (rc != SLOTD_OK) {
        goto fail_release;
    }
    if (toks != NULL) {
        (void)cache_pool_prefix_publish(p, h, owner, scope, toks, (uint32_t)n, &stuck);
    }

    s->handle = h;
    s->model = m;
    s->owner = *owner;
    s->entries = kv.len;
    s->scope = scope;
    s->shared = toks != NULL;
    /* Stuck behind another chain's equal block: nothing more to publish. */
    s->full_at = stuck ? UINT32_MAX : full_after(m, kv.len);
    cache_pool_hint(p, h, &s->hint);
    if (cached != NULL) {
        *cached = reused;
    }
    return SLOTD_OK;

fail_release:
    (void)cache_pool_release(p, h, owner, NULL);
    return pool_error(p, err, rc, false, "start", owner->id, cache_pool_slot_bytes(m, (uint32_t)n),
                      cache_pool_slot_bytes(m, (uint32_t)n));
}

int cache_session_start(cache_pool_t *p, const model_t *m, const cache_owner_t *owner,
                        const int64_t *prompt, size_t n, void *scratch, cache_session_t *s,
                        slotd_error_t *err)
{
    int rc = model_check_prompt(m, prompt, n, err);

    if (rc != SLOTD_OK) {
        return rc;
    }
    return session__start(p, m, owner, prompt, n, NULL, 0, scratch, s, NULL, err);
}

int cache_session_start_shared(cache_pool_t *p, const model_t *m, const cache_owner_t *owner,
                               uint64_t scope, const int64_t *prompt, size_t n, void *scratch,
                               cache_session_t *s, uint32_t *cached, slotd_error_t *err)
{
    uint32_t *toks;
    int rc = model_check_prompt(m, prompt, n, err);

    if (cached != NULL) {
        *cached = 0;
    }
    if (rc != SLOTD_OK) {
        return rc;
    }
    toks = malloc(n * sizeof(*toks));
    if (toks == NULL) {
        /* Without its tokens the start simply computes everything. */
        return session__start(p, m, owner, prompt, n, NULL, 0, scratch, s, cached, err);
    }
    for (size_t i = 0; i < n; i++) {
        toks[i] = (uint32_t)prompt[i];
    }
    rc = session__start(p, m, owner, prompt, n, toks, scope, scratch, s, cached, err);
    free(toks);
    return rc;
}

void cache_session_publish(cache_pool_t *p, cache_session_t *s, const uint32_t *toks, uint32_t n)
{
    bool stuck = false;

    if (!s->shared || n != s->entries || n < s->full_at)
        return;
    (void)cache_pool_prefix_publish(p, s->handle, &s->owner, s->scope, toks, n, &stuck);
    s->full_at = stuck ? UINT32_MAX : full_after(s->model, n);
}

int cache_session_step(cache_pool_t *p, cache_session_t *s, uint32_t n, void *scratch,
                       uint32_t *tokens, double *logits, slotd_error_t *err)
{
    return cache_session_decode(p, s, n, NULL, scratch, tokens, logits, NULL, err);
}

int cache_session_decode(cache_pool_t *p, cache_session_t *s, uint32_t n, const model_decode_t *dc,
                         void *scratch, uint32_t *tokens, double *logits, uint32_t *picked,
                         slotd_error_t *err)
{
    const model_t *m = s->model;
    uint32_t vocab = model_vocab(m), i = 0;
    bool want_logits = logits != NULL && model_family(m) == MODEL_FAMILY_ATTN;
    model_kv_t kv;
    int rc;

    if (n == 0) {
        return slotd_error_set(err, SLOTD_EBAD_REQUEST, "n: at least one step is needed");
    }
    if ((uint64_t)s->entries + n > model_max_ctx(m)) {
        return slotd_error_set(err, SLOTD_ECONTEXT_FULL,
                               "step: '%s' holds %" PRIu32 " of %" PRIu32 " positions, %" PRIu32
                               " more do not fit",
                               s->owner.id, s->entries, model_max_ctx(m), n);
    }
    rc = cache_pool_reserve(p, s->handle, &s->owner, n, &kv);
    if (rc != SLOTD_OK) {
        return step_error(p, s, n, rc, err);
    }
    assert(kv.len == s->entries);

    while (i < n) {
        double *row = want_logits ? logits + (size_t)i * vocab : NULL;
        uint32_t t =
            dc == NULL ? model_pick(m, &kv, row) : model_decode_pick(m, &kv, dc, row, scratch);
        tokens[i++] = t;
        model_run(m, &kv, t, scratch);
        if (dc != NULL && model_decode_stops(dc, t)) {
            break;
        }
    }
    rc = cache_pool_commit(p, s->handle, &s->owner, &kv);
    if (rc != SLOTD_OK) {
        /* Only a broken one-thread-per-session rule gets here: the slot was
         * released while this step ran.  Not a safety net: commit takes no
         * lock, and may catch such a release or not; the rule (a session's
         * slot is released only when no call on it is running) is what
         * keeps a released slot unwritten. */
        return pool_error(p, err, rc, false, "step", s->owner.id, 0, 0);
    }
    s->entries = kv.len;
    cache_pool_hint(p, s->handle, &s->hint);
    if (picked != NULL) {
        *picked = i;
    }
    return SLOTD_OK;
}

int cache_session_append(cache_pool_t *p, cache_session_t *s, const int64_t *tokens, size_t n,
                         void *scratch, uint32_t *cached, slotd_error_t *err)
{
    return cache_session_append_shared(p, s, tokens, n, NULL, scratch, cached, err);
}

int cache_session_append_shared(cache_pool_t *p, cache_session_t *s, const int64_t *tokens,
                                size_t n, const uint32_t *seq, void *scratch, uint32_t *cached,
                                slotd_error_t *err)
{
    const model_t *m = s->model;
    uint32_t max_ctx = model_max_ctx(m), before = s->entries, reused = 0;
    model_kv_t kv;
    int rc;

    if (n == 0) {
        return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                               "append: `tokens` must be a non-empty array of integers");
    }
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= (int64_t)model_vocab(m)) {
            return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                                   "append: `tokens` must hold integers from 0 to %" PRIu32
                                   " (model '%s'); element %zu is %" PRId64,
                                   model_vocab(m) - 1, model_name(m), i, tokens[i]);
        }
    }
    if (s->entries > max_ctx || n > (size_t)(max_ctx - s->entries)) {
        return slotd_error_set(err, SLOTD_ECONTEXT_FULL,
                               "append: '%s' holds %" PRIu32 " of %" PRIu32 " positions, %zu more "
                               "do not fit",
                               s->owner.id, s->entries, max_ctx, n);
    }
    /* The kept blocks that the tokens complete after the slot's own. */
    if (seq != NULL && s->shared) {
        rc = cache_pool_prefix_extend(p, s->handle, &s->owner, s->scope, seq,
                                      before + (uint32_t)n, &reused);
        if (rc != SLOTD_OK)
            return pool_error(p, err, rc, false, "append", s->owner.id, 0, 0);
        assert(reused < n);
    }
    rc = cache_pool_reserve(p, s->handle, &s->owner, (uint32_t)(n - reused), &kv);
    if (rc != SLOTD_OK) {
        /* It needed the blocks between the slot's entries and n more. */
        uint64_t bytes0 = cache_pool_slot_bytes(m, before);
        uint64_t after = cache_pool_slot_bytes(m, before + (uint32_t)n);
        if (reused > 0) /* nothing changes: the kept blocks go back */
            (void)cache_pool_prefix_detach(p, s->handle, &s->owner, before);
        return pool_error(p, err, rc, false, "append", s->owner.id, after - bytes0, after);
    }
    assert(kv.len == before + reused);
    if (reused > 0) {
        model_kv_resume(m, &kv);
    }
    for (size_t i = reused; i < n;) {
        uint32_t chunk[MODEL_BATCH_MAX];
        size_t k = 0;
        for (; k < MODEL_BATCH_MAX && i + k < n; k++) {
            chunk[k] = (uint32_t)tokens[i + k];
        }
        model_prefill(m, &kv, chunk, k, scratch);
        i += k;
    }
    rc = cache_pool_commit(p, s->handle, &s->owner, &kv);
    if (rc != SLOTD_OK) {
        /* As in cache_session_step(): only a broken one-thread-per-session
         * rule gets here. */
        return pool_error(p, err, rc, false, "append", s->owner.id, 0, 0);
    }
    s->entries = kv.len;
    cache_pool_hint(p, s->handle, &s->hint);
    if (cached != NULL) {
        *cached = reused;
    }
    return SLOTD_OK;
}

int cache_session_fork(cache_pool_t *p, const cache_session_t *from, const cache_owner_t *owner,
                       cache_session_t *s, slotd_error_t *err)
{
    const model_t *m = from->model;
    cache_handle_t h;
    int rc;

    /* No entry is copied: the new slot holds from's blocks too (pool.h,
     * cache_pool_fork()), and only its state is its own. */
    rc = cache_pool_fork(p, from->handle, &from->owner, owner, &h, NULL);
    if (rc != SLOTD_OK) {
        uint64_t need = cache_pool_slot_bytes(m, 0);
        return pool_error(p, err, rc, rc == SLOTD_ECACHE_FULL, "fork", owner->id, need, need);
    }
    s->handle = h;
    s->model = m;
    s->owner = *owner;
    s->entries = from->entries;
    s->scope = from->scope;
    s->shared = from->shared;
    s->full_at = from->full_at;
    cache_pool_hint(p, h, &s->hint);
    return SLOTD_OK;
}

void cache_session_step_batch(cache_pool_t *p, cache_session_t *const *s, size_t nb,
                              void *scratch, uint32_t *tokens, double *const *logits, int *rc,
                              slotd_error_t *err)
{
    cache_session_decode_batch(p, s, nb, NULL, scratch, tokens, logits, rc, err);
}

void cache_session_decode_batch(cache_pool_t *p, cache_session_t *const *s, size_t nb,
                                const model_decode_t *const *dc, void *scratch, uint32_t *tokens,
                                double *const *logits, int *rc, slotd_error_t *err)
{
    const model_decode_t *dk[MODEL_BATCH_MAX];
    model_kv_t kv[MODEL_BATCH_MAX], *run[MODEL_BATCH_MAX];
    double *lg[MODEL_BATCH_MAX];
    uint32_t picks[MODEL_BATCH_MAX];
    size_t idx[MODEL_BATCH_MAX], k = 0;
    const model_t *m;

    assert(nb >= 1 && nb <= MODEL_BATCH_MAX);
    m = s[0]->model;
    for (size_t b = 0; b < nb; b++) {
        const bool want = logits != NULL && logits[b] != NULL;
        assert(s[b]->model == m);
        rc[b] = SLOTD_OK;
        if ((uint64_t)s[b]->entries + 1 > model_max_ctx(m)) {
            rc[b] = slotd_error_set(&err[b], SLOTD_ECONTEXT_FULL,
                                    "step: '%s' holds %" PRIu32 " of %" PRIu32
                                    " positions, 1 more does not fit",
                                    s[b]->owner.id, s[b]->entries, model_max_ctx(m));
            continue;
        }
        rc[b] = cache_pool_reserve(p, s[b]->handle, &s[b]->owner, 1, &kv[k]);
        if (rc[b] != SLOTD_OK) {
            rc[b] = step_error(p, s[b], 1, rc[b], &err[b]);
            continue;
        }
        assert(kv[k].len == s[b]->entries);
        run[k] = &kv[k];
        lg[k] = want && model_family(m) == MODEL_FAMILY_ATTN ? logits[b] : NULL;
        dk[k] = dc != NULL ? dc[b] : NULL;
        idx[k++] = b;
    }
    if (k == 0) {
        return;
    }
    model_decode_pick_batch(m, (const model_kv_t *const *)run, k, dc != NULL ? dk : NULL, picks, lg,
                            scratch);
    model_run_batch(m, run, picks, k, scratch);
    for (size_t i = 0; i < k; i++) {
        const size_t b = idx[i];
        tokens[b] = picks[i];
        rc[b] = cache_pool_commit(p, s[b]->handle, &s[b]->owner, &kv[i]);
        if (rc[b] != SLOTD_OK) {
            /* As in cache_session_step(): only a broken one-thread-per-
             * session rule gets here. */
            rc[b] = pool_error(p, &err[b], rc[b], false, "step", s[b]->owner.id, 0, 0);
            continue;
        }
        s[b]->entries = kv[i].len;
        cache_pool_hint(p, s[b]->handle, &s[b]->hint);
    }
}

int cache_session_finish(cache_pool_t *p, cache_session_t *s, uint32_t *released)
{
    uint32_t held = 0;
    int rc;

    rc = cache_pool_release(p, s->handle, &s->owner, &held);
    if (rc != SLOTD_OK) {
        return rc;
    }
    s->entries = 0;
    if (released != NULL) {
        *released = held;
    }
    return SLOTD_OK;
}

int cache_session_rebuild(cache_pool_t *p, cache_session_t *s, const uint32_t *tokens, uint32_t n,
                          void *scratch)
{
    const model_t *m = s->model;
    model_kv_t kv;
    int rc;

    if (n != s->entries || n == 0) {
        return SLOTD_EINVAL;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (tokens[i] >= model_vocab(m)) {
            return SLOTD_EINVAL;
        }
    }
    /* Every entry is rewritten: no block may be another slot's too. */
    rc = cache_pool_unshare(p, s->handle, &s->owner);
    if (rc != SLOTD_OK) {
        return rc;
    }
    /* A reserve of nothing: the slot's chain as it stands, no block taken. */
    rc = cache_pool_reserve(p, s->handle, &s->owner, 0, &kv);
    if (rc != SLOTD_OK) {
        return rc;
    }
    assert(kv.len == n);
    model_kv_rewind(&kv);
    model_prefill(m, &kv, tokens, n, scratch);
    /* Same length: the commit only confirms the handle. */
    return cache_pool_commit(p, s->handle, &s->owner, &kv);
}

#if SLOTD_FAULT_INJECTION
int cache_session_fault_corrupt(cache_pool_t *p, cache_session_t *s)
{
    model_kv_t kv;
    int rc;

    /* The damage is this session's alone: a block it shares is copied
     * first, and the copy damaged. */
    rc = cache_pool_unshare(p, s->handle, &s->owner);
    if (rc != SLOTD_OK) {
        return rc;
    }
    rc = cache_pool_reserve(p, s->handle, &s->owner, 0, &kv);
    if (rc != SLOTD_OK) {
        return rc;
    }
    if (kv.len == 0) {
        return SLOTD_EINVAL;
    }
    model_fault_corrupt(s->model, &kv, kv.len - 1);
    return SLOTD_OK;
}
#endif

/* Borrows an empty slot of `m` with room for `positions`: on success the
 * caller owns *h until slot_give_back(), and *kv is the slot's chain. */
static int slot_borrow(cache_pool_t *p, const model_t *m, uint32_t positions, const char *op,
                       cache_handle_t *h, model_kv_t *kv, slotd_error_t *err)
{
    int rc;

    uint64_t need = cache_pool_slot_bytes(m, positions);

    rc = cache_pool_acquire(p, m, &slot_borrower, h);
    if (rc != SLOTD_OK) {
        return pool_error(p, err, rc, true, op, "", need, need);
    }
    rc = cache_pool_reserve(p, *h, &slot_borrower, positions, kv);
    if (rc != SLOTD_OK) {
        (void)cache_pool_release(p, *h, &slot_borrower, NULL);
        return pool_error(p, err, rc, false, op, "", need, need);
    }
    assert(kv->len == 0);
    return SLOTD_OK;
}

static void slot_give_back(cache_pool_t *p, cache_handle_t h)
{
    int rc = cache_pool_release(p, h, &slot_borrower, NULL);
    assert(rc == SLOTD_OK);
    (void)rc;
}

int cache_session_logits(cache_pool_t *p, const model_t *m, const int64_t *tokens, size_t n,
                         void *scratch, double *logits, uint64_t *rows, slotd_error_t *err)
{
    cache_handle_t h;
    model_kv_t kv;
    int rc;

    rc = model_check_logits(m, tokens, n, err);
    if (rc != SLOTD_OK) {
        return rc;
    }
    if (model_family(m) != MODEL_FAMILY_ATTN) {
        return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                               "model: '%s' has no logits (an attn model is needed)",
                               model_name(m));
    }
    rc = slot_borrow(p, m, (uint32_t)n, "logits", &h, &kv, err);
    if (rc != SLOTD_OK) {
        return rc;
    }
    rc = model_logits(m, tokens, n, &kv, scratch, logits, rows, err);
    slot_give_back(p, h);
    return rc;
}

int cache_session_generate(cache_pool_t *p, const model_t *m, const int64_t *tokens, size_t n,
                           int64_t steps, bool use_cache, void *scratch, uint32_t *out_tokens,
                           double *logits, uint64_t *rows, slotd_error_t *err)
{
    return cache_session_generate_decode(p, m, tokens, n, steps, use_cache, NULL, scratch,
                                         out_tokens, logits, NULL, rows, err);
}

int cache_session_generate_decode(cache_pool_t *p, const model_t *m, const int64_t *tokens,
                                  size_t n, int64_t steps, bool use_cache,
                                  const model_decode_t *dc, void *scratch, uint32_t *out_tokens,
                                  double *logits, size_t *picked, uint64_t *rows,
                                  slotd_error_t *err)
{
    cache_handle_t h;
    model_kv_t kv;
    int rc;

    rc = model_check_generate(m, tokens, n, steps, err);
    if (rc != SLOTD_OK) {
        return rc;
    }
    rc = slot_borrow(p, m, (uint32_t)(n + (uint64_t)steps), "generate", &h, &kv, err);
    if (rc != SLOTD_OK) {
        return rc;
    }
    rc = model_generate_decode(m, tokens, n, steps, use_cache, dc, &kv, scratch, out_tokens, logits,
                               picked, rows, err);
    slot_give_back(p, h);
    return rc;
}
