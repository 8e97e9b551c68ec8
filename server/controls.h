/*
 * controls.h: a step's or generate's decoding controls on the worker: the
 * request's parsed `sample`, `stop` and `scores` (proto_decode_t) checked
 * against its model and turned into what core/ and cache/ take
 * (model_decode_t), and its reply written under them.
 *
 * Worker threads; a controls_t lives on the stack of the job that runs
 * its request.
 */
#ifndef SLOTD_SERVER_CONTROLS_H
#define SLOTD_SERVER_CONTROLS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/model.h"
#include "core/sample.h"
#include "proto/proto.h"

/** One request's controls, ready for the model calls.  A plain value. */
typedef struct controls {
    const proto_decode_t *rq; /* the request's, borrowed */
    model_sample_t sample;
    model_decode_t dc;
    bool on; /* the request carries a control: dc applies and the reply is written under it */
} controls_t;

/** controls_prepare() of a request that carries a control. */
int controls__check(controls_t *c, const proto_request_t *rq, const model_t *m, slotd_error_t *err);

/** Checks the controls of request `rq` against model `m` and fills `c`: a
 * stop token not below V is bad_request naming `stop`; a hash model takes
 * no `sample` (bad_request naming `sample`) and no top K scores
 * (`scores`), having no logits.  SLOTD_OK or the code set in `err`;
 * nothing else is touched.  Inline: a request without controls (most)
 * costs a load and a branch. */
static inline int controls_prepare(controls_t *c, const proto_request_t *rq, const model_t *m,
                                   slotd_error_t *err)
{
    c->rq = &rq->dec;
    c->on = rq->dec.set;
    return c->on ? controls__check(c, rq, m, err) : SLOTD_OK;
}

/** The decoding controls for the model calls: NULL when the request has
 * none (every call then is exactly as without controls). */
static inline const model_decode_t *controls_dc(const controls_t *c)
{
    return c->on ? &c->dc : NULL;
}

/** Whether the picks are sampled (not the greedy pick). */
static inline bool controls_samples(const controls_t *c)
{
    return c->on && !model_sample_greedy(c->dc.sample);
}

/** The rounded logits the model calls left in `logits` (n rows), or NULL
 * when they left none there (scores none, or hash). */
static inline double *controls_logits(const controls_t *c, double *logits)
{
    return c->on && !c->dc.logits ? NULL : logits;
}

/** The step reply of `n` picks under controls that are on. */
int controls__reply_step(const controls_t *c, proto_buf_t *b, const proto_request_t *rq,
                         const model_t *m, const uint32_t *tokens, uint32_t n, const double *logits,
                         uint32_t entries, void *scratch);

/** The step reply of `n` picks under the controls (proto_reply_step()
 * when there are none): `scratch` is the model's, free after the step.
 * SLOTD_OK or SLOTD_ENOMEM. */
static inline int controls_reply_step(const controls_t *c, proto_buf_t *b,
                                      const proto_request_t *rq, const model_t *m,
                                      const uint32_t *tokens, uint32_t n, const double *logits,
                                      uint32_t entries, void *scratch)
{
    if (!c->on)
        return proto_reply_step(b, rq->tag, rq->id, tokens, n, logits, model_vocab(m), entries);
    return controls__reply_step(c, b, rq, m, tokens, n, logits, entries, scratch);
}

/** The generate reply of `picked` picks after `ntokens` input tokens. */
int controls_reply_generate(const controls_t *c, proto_buf_t *b, const proto_request_t *rq,
                            const model_t *m, const uint32_t *tokens, size_t ntokens,
                            const double *logits, size_t picked, uint64_t rows, void *scratch);

#endif
