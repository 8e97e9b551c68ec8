/*
 * jobaudit.c: the audit of a step that a worker just ran (--audit-every):
 * the recording of its picks after the session's tokens, and for a
 * sampled step the check against the uncached reference (audit.h), with
 * what a divergence does: the reference's picks and logits in the reply,
 * the slot's blocks dropped from the prefix cache, the slot rebuilt.
 *
 * DESIGN.  Worker threads only, from job.c's run of a step or a batch,
 * on the job's own record (its cs and toks) and the audit's part of this
 * worker (audit_due(), audit_check() by worker_index()); no lock.  It
 * never touches the connection or the session record.
 */
#include <assert.h>
#include <inttypes.h>

#include "jobaudit_int.h"
#include "server/base/log.h"

/* The audit of a step that just ran: records its n picks after the
 * session's tokens, and if this request is sampled, checks them (and
 * their logits) against the uncached reference.  On a mismatch the picks
 * and logits become the reference's, and the slot is rebuilt from the
 * corrected tokens so that later steps continue the right sequence. */
void jobaudit__step(server_t *s, worker_t *w, req_t *r, uint32_t n, uint32_t *tokens,
                       double *logits, const controls_t *ctl)
{
    unsigned wi = worker_index(w);
    uint32_t len = r->toks.len, bad;
    int rc;

    assert(len + n == r->cs.entries); /* the recording follows the slot */

    /* The reference picks greedily: sampled picks are recorded only. */
    logits = controls_logits(ctl, logits);
    if (!audit_due(s->audit, wi) || controls_samples(ctl)) {
        audit_tokens_append(&r->toks, tokens, n);
        return;
    }
    metrics_count_audit();
    rc = audit_check(s->audit, wi, r->cs.model, r->toks.v, len, n, worker_scratch(w), tokens,
                     logits, &bad);
    if (rc != SLOTD_OK) {
        log_warn("audit: connection %" PRIu64 " session '%s': not checked: %s", r->cs.owner.key,
                 r->rq.id, slotd_strerror(rc));
        bad = UINT32_MAX;
    }
    audit_tokens_append(&r->toks, tokens, n);
    if (bad == UINT32_MAX)
        return;

    metrics_count_divergence();
    log_warn("audit: connection %" PRIu64 " session '%s' position %" PRIu32
             ": the cached step diverges from the uncached reference; replying with the "
             "reference and rebuilding the slot",
             r->cs.owner.key, r->rq.id, len + bad);
    {
        /* Blocks it may have taken from, or given to, the prefix cache are
         * suspect: no later start reuses them. */
        uint32_t forgotten = 0;
        if (cache_pool_prefix_forget(s->pool, r->cs.handle, &r->cs.owner, &forgotten) ==
                SLOTD_OK &&
            forgotten > 0)
            log_warn("audit: connection %" PRIu64 " session '%s': %" PRIu32
                     " blocks dropped from the prefix cache",
                     r->cs.owner.key, r->rq.id, forgotten);
    }
    rc = cache_session_rebuild(s->pool, &r->cs, r->toks.v, r->toks.len, worker_scratch(w));
    if (rc != SLOTD_OK)
        log_error("audit: connection %" PRIu64 " session '%s': rebuild failed: %s", r->cs.owner.key,
                  r->rq.id, slotd_strerror(rc));
}
