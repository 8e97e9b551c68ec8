/*
 * controls.c: the decoding controls of a request on the worker
 * (controls.h): their checks against the request's model, the
 * model_decode_t the model calls take, and the reply under them, whose
 * top K scores are chosen here (model_top_scores()) into memory held for
 * the reply's formatting only.
 *
 * DESIGN.  Worker threads only, one request per call; it reads the
 * request and the model (immutable) and writes the caller's controls_t
 * and reply buffer.  No lock.
 *
 * Design: docs/design.md, "Decoding controls".
 */
#include "controls.h"

#include <stdlib.h>
#include <string.h>

int controls__check(controls_t *c, const proto_request_t *rq, const model_t *m, slotd_error_t *err)
{
    const proto_decode_t *d = &rq->dec;
    const uint32_t vocab = model_vocab(m);
    const char *op = proto_op_name(rq->op);
    const bool attn = model_family(m) == MODEL_FAMILY_ATTN;

    if (d->has_sample && !attn)
        return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                               "%s: `sample` needs an attn model; '%s' has no logits to sample", op,
                               model_name(m));
    if (d->scores == PROTO_SCORES_TOP && !attn)
        return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                               "%s: `scores` as a number needs an attn model; '%s' has no logits",
                               op, model_name(m));
    for (uint32_t i = 0; i < d->nstop; i++)
        if (d->stop[i] >= vocab)
            return slotd_error_set(err, SLOTD_EBAD_REQUEST,
                                   "%s: `stop` element %u (%u) is not a token of '%s' (0 to %u)",
                                   op, i, d->stop[i], model_name(m), vocab - 1);
    c->sample.temperature = d->temperature;
    c->sample.top_p = d->top_p;
    c->sample.seed = d->seed;
    c->sample.top_k = d->top_k < vocab ? (uint32_t)d->top_k : vocab;
    c->dc.sample = d->has_sample ? &c->sample : NULL;
    c->dc.logits = d->scores != PROTO_SCORES_NONE;
    c->dc.nstop = d->nstop;
    memcpy(c->dc.stop, d->stop, d->nstop * sizeof(d->stop[0]));
    return SLOTD_OK;
}

/* The reply's view of the controls, with the top K of each of `rows`
 * picks chosen into *top (malloc'd; the caller frees it) when asked for.
 * SLOTD_OK or SLOTD_ENOMEM. */
static int picks_of(const controls_t *c, const model_t *m, const double *logits, size_t rows,
                    bool stopped, void *scratch, proto_picks_t *pk, uint32_t **top)
{
    const uint32_t vocab = model_vocab(m);

    *top = NULL;
    pk->scores = c->rq->scores;
    pk->has_stop = c->rq->has_stop;
    pk->stopped = stopped;
    pk->k = 0;
    pk->top = NULL;
    if (pk->scores != PROTO_SCORES_TOP || logits == NULL || rows == 0)
        return SLOTD_OK;
    pk->k = c->rq->top < vocab ? (uint32_t)c->rq->top : vocab;
    if ((*top = malloc(rows * pk->k * sizeof(**top))) == NULL)
        return SLOTD_ENOMEM;
    for (size_t r = 0; r < rows; r++)
        model_top_scores(logits + r * vocab, vocab, pk->k, *top + r * pk->k, scratch);
    pk->top = *top;
    return SLOTD_OK;
}

int controls__reply_step(const controls_t *c, proto_buf_t *b, const proto_request_t *rq,
                         const model_t *m, const uint32_t *tokens, uint32_t n, const double *logits,
                         uint32_t entries, void *scratch)
{
    proto_picks_t pk;
    uint32_t *top;
    int rc;

    rc = picks_of(c, m, logits, n, n > 0 && model_decode_stops(&c->dc, tokens[n - 1]), scratch, &pk,
                  &top);
    if (rc == SLOTD_OK)
        rc = proto_reply_step_picks(b, rq->tag, rq->id, tokens, n, logits, model_vocab(m), entries,
                                    &pk);
    free(top);
    return rc;
}

int controls_reply_generate(const controls_t *c, proto_buf_t *b, const proto_request_t *rq,
                            const model_t *m, const uint32_t *tokens, size_t ntokens,
                            const double *logits, size_t picked, uint64_t rows, void *scratch)
{
    proto_picks_t pk;
    uint32_t *top;
    int rc;

    if (!c->on)
        return proto_reply_generate(b, rq->tag, tokens, ntokens, logits, picked, model_vocab(m),
                                    rows);
    rc =
        picks_of(c, m, logits, picked,
                 picked > 0 && model_decode_stops(&c->dc, tokens[ntokens - 1]), scratch, &pk, &top);
    if (rc == SLOTD_OK)
        rc = proto_reply_generate_picks(b, rq->tag, tokens, ntokens, logits, picked, model_vocab(m),
                                        rows, &pk);
    free(top);
    return rc;
}
