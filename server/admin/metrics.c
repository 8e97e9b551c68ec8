/*
 * metrics.c: the storage, counting, reading and Prometheus text rendering
 * (format 0.0.4) of every metric of METRICS_MAP (metrics.h), all generated
 * from that list, plus the time of the last completed step and the
 * daemon's start time.
 *
 * This file owns one static set of counters and gauges (`m`) and
 * METRICS_SHARDS copies of every histogram (`shards`) for the workers, and
 * one for the loop thread.  The label sets a
 * metric can carry are METRICS_LABEL_SETS below; the histogram bucket sets
 * METRICS_BUCKET_SETS.
 *
 * DESIGN.  Every value is a C11 atomic updated and read with relaxed
 * ordering; there is no lock.  Any thread counts; readers (metrics_render()
 * and the accessors, on the loop thread) see each value whole but may see
 * a mix of values from either side of a concurrent update.  A histogram
 * keeps per-bucket (non-cumulative) counts and derives both the cumulative
 * buckets and _count from one read of them, so a rendering is always
 * self-consistent (+Inf bucket == _count) even while workers observe; only
 * _sum may be a step ahead or behind.  Each histogram copy sits on cache
 * lines of its own and each worker observes into the copy of its number,
 * so workers do not move the same lines between cores (docs/design.md,
 * "Metrics").
 */
#include "metrics.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "core/model.h"
#include "core/util.h"
#include "procstat_int.h"

/* ---- Bucket sets ---- */

/* Upper bounds of the step latency buckets, in nanoseconds, with their `le`
 * labels spelled exactly; an implicit +Inf bucket follows.  In a Release
 * build a `hash` step takes 50 to 250 ns, a `tiny` one 250 ns to 1 us, a
 * `small` one 25 to 100 us, a `base` one of 500 tokens 2 s: 1-2.5-5 per
 * decade from 25 ns to 10 s resolves each (bench/RESULTS.md). */
#define METRICS_BUCKETS_seconds(BOUND)                                                             \
    BOUND(25u, "2.5e-08")                                                                          \
    BOUND(50u, "5e-08")                                                                            \
    BOUND(100u, "1e-07")                                                                           \
    BOUND(250u, "2.5e-07")                                                                         \
    BOUND(500u, "5e-07")                                                                           \
    BOUND(1000u, "1e-06")                                                                          \
    BOUND(2500u, "2.5e-06")                                                                        \
    BOUND(5000u, "5e-06")                                                                          \
    BOUND(10000u, "1e-05")                                                                         \
    BOUND(25000u, "2.5e-05")                                                                       \
    BOUND(50000u, "5e-05")                                                                         \
    BOUND(100000u, "0.0001")                                                                       \
    BOUND(250000u, "0.00025")                                                                      \
    BOUND(500000u, "0.0005")                                                                       \
    BOUND(1000000u, "0.001")                                                                       \
    BOUND(2500000u, "0.0025")                                                                      \
    BOUND(5000000u, "0.005")                                                                       \
    BOUND(10000000u, "0.01")                                                                       \
    BOUND(25000000u, "0.025")                                                                      \
    BOUND(50000000u, "0.05")                                                                       \
    BOUND(100000000u, "0.1")                                                                       \
    BOUND(250000000u, "0.25")                                                                      \
    BOUND(500000000u, "0.5")                                                                       \
    BOUND(1000000000u, "1")                                                                        \
    BOUND(2500000000u, "2.5")                                                                      \
    BOUND(5000000000u, "5")                                                                        \
    BOUND(10000000000u, "10")

/* Every bucket set: its name (METRICS_BUCKETS_<name> lists its bounds) and
 * the divisor from an observed value to the unit rendered (1e9: ns to
 * seconds; 1: render counts as they are).  first_<name>[k] is the first
 * bucket whose bound is at least 2^(k-1) (0 for k = 0), so that a value
 * of bit length k starts its search there: with bounds at least twice
 * apart, as in both sets, one comparison at most follows.  Filled by
 * metrics_init(); all zeros is correct too, only slower. */
/* Batch sizes: 1 (a step alone) to MODEL_BATCH_MAX (64). */
#define METRICS_BUCKETS_steps(BOUND)                                                               \
    BOUND(1u, "1")                                                                                 \
    BOUND(2u, "2")                                                                                 \
    BOUND(4u, "4")                                                                                 \
    BOUND(8u, "8")                                                                                 \
    BOUND(16u, "16")                                                                               \
    BOUND(32u, "32")                                                                               \
    BOUND(64u, "64")

#define METRICS_BUCKET_SETS(XX) XX(seconds, 1e9) XX(steps, 1)

#define BOUND_NS(ns, label) (uint64_t)(ns),
#define BOUND_LABEL(ns, label) label,
#define XX(set, scale)                                                                             \
    static const uint64_t bounds_##set[] = {METRICS_BUCKETS_##set(BOUND_NS)};                      \
    static const char *const le_##set[] = {METRICS_BUCKETS_##set(BOUND_LABEL)};                    \
    enum { NB_##set = sizeof(bounds_##set) / sizeof(bounds_##set[0]) };                            \
    static const double scale_##set = (scale);                                                     \
    static uint8_t first_##set[65];
METRICS_BUCKET_SETS(XX)
#undef XX
#undef BOUND_NS
#undef BOUND_LABEL

/* ---- Label sets ---- */

/* Each code's position in SLOTD_ERRNO_MAP, whatever the numbering. */
enum error_pos {
#define XX(name, wire, desc) ERRPOS_##name,
    SLOTD_ERRNO_MAP(XX)
#undef XX
        NERRORS
};

/* The wire code at each position; several positions share "internal". */
static const char *const error_wire[NERRORS] = {
#define XX(name, wire, desc) wire,
    SLOTD_ERRNO_MAP(XX)
#undef XX
};

static const char *const release_name[METRICS_RELEASE__COUNT] = {
    [METRICS_RELEASE_FINISH] = "finish",
    [METRICS_RELEASE_DISCONNECT] = "disconnect",
    [METRICS_RELEASE_IDLE] = "idle",
    [METRICS_RELEASE_SHUTDOWN] = "shutdown",
};

static const char *const refusal_name[METRICS_REFUSAL__COUNT] = {
    [METRICS_REFUSAL_POOL] = "pool",
    [METRICS_REFUSAL_SLOTS] = "slots",
    [METRICS_REFUSAL_SHARE] = "share",
};

static const char *const close_name[METRICS_CLOSE__COUNT] = {
    [METRICS_CLOSE_TIMEOUT] = "timeout",
    [METRICS_CLOSE_AUTH_TIMEOUT] = "auth_timeout",
    [METRICS_CLOSE_ROOM] = "room",
    [METRICS_CLOSE_PROXY_HEADER] = "proxy_header",
};

static size_t index_op(proto_op_t op)
{
    return (unsigned)op < PROTO_OP__COUNT ? (size_t)op : PROTO_OP_NONE;
}

static size_t index_code(int code)
{
    switch (code) {
#define XX(name, wire, desc)                                                                       \
    case SLOTD_E##name:                                                                            \
        return ERRPOS_##name;
        SLOTD_ERRNO_MAP(XX)
#undef XX
    default:
        /* Codes outside the list are bugs; count them as internal errors
         * rather than lose them. */
        return ERRPOS_INVAL;
    }
}

static const char *name_op(size_t i)
{
    return i == PROTO_OP_NONE ? "invalid" : proto_op_name((proto_op_t)i);
}

static const char *name_code(size_t i)
{
    return error_wire[i];
}

static const char *name_release(size_t i)
{
    return release_name[i];
}

static const char *name_refusal(size_t i)
{
    return refusal_name[i];
}

static const char *name_close(size_t i)
{
    return close_name[i];
}

/* Label indexes of metrics_op_model(). */
#define OP_MODEL_COUNT (PROTO_OP__COUNT * (MODEL_NPRESETS + 1))

/* The pair (op, model) of metrics_op_model() is rendered with the one key
 * "op" and a value that closes its quote and adds the model's:
 * `step",model="tiny` makes `op="step",model="tiny"`.  Filled by
 * metrics_init(). */
static char op_model_text[OP_MODEL_COUNT][48];

static const char *name_op_model(size_t i)
{
    return op_model_text[i];
}

static void fill_op_model_text(void)
{
    for (size_t i = 0; i < OP_MODEL_COUNT; i++) {
        size_t model = i % (MODEL_NPRESETS + 1);
        if (model < MODEL_NPRESETS)
            snprintf(op_model_text[i], sizeof(op_model_text[i]), "%s\",model=\"%s",
                     name_op(i / (MODEL_NPRESETS + 1)), model_preset_name(model));
        else
            snprintf(op_model_text[i], sizeof(op_model_text[i]), "%s",
                     name_op(i / (MODEL_NPRESETS + 1)));
    }
}

/* Every label set: its name, the label's key, how many values it has and
 * the value at an index; INDEX_<set>(label) gives the index of a label
 * argument (the count or beyond: not counted).  Samples whose values are
 * spelled alike are rendered as one, summed (several error codes share
 * "internal"). */
#define METRICS_LABEL_SETS(XX)                                                                     \
    XX(NONE, NULL, 1, NULL)                                                                        \
    XX(op, "op", PROTO_OP__COUNT, name_op)                                                         \
    XX(code, "code", NERRORS, name_code)                                                           \
    XX(release, "reason", METRICS_RELEASE__COUNT, name_release)                                    \
    XX(refusal, "reason", METRICS_REFUSAL__COUNT, name_refusal)                                    \
    XX(close, "reason", METRICS_CLOSE__COUNT, name_close)                                          \
    XX(model, "model", MODEL_NPRESETS, model_preset_name)                                          \
    XX(op_model, "op", OP_MODEL_COUNT, name_op_model)                                              \
    XX(op_model_all, "op", OP_MODEL_COUNT, name_op_model)

#define INDEX_NONE(label) ((size_t)0)
#define INDEX_op(label) index_op(label)
#define INDEX_code(label) index_code(label)
#define INDEX_release(label) ((size_t)(unsigned)(label))
#define INDEX_refusal(label) ((size_t)(unsigned)(label))
#define INDEX_close(label) ((size_t)(unsigned)(label))
#define INDEX_model(label) ((size_t)(label))
#define INDEX_op_model(label) ((size_t)(label))
#define INDEX_op_model_all(label) ((size_t)(label))

/* metrics_model_served(): the presets --models allows. */
static bool model_served[MODEL_NPRESETS];

/* Whether a histogram renders the series of label index l: every one but
 * the model label's presets not served, and of (op, model) the ops workers
 * run with the models served. */
static bool shown_op_model(size_t l)
{
    size_t op = l / (MODEL_NPRESETS + 1), model = l % (MODEL_NPRESETS + 1);
    bool worker_op = proto_op_on_worker((proto_op_t)op);
    return worker_op && model < MODEL_NPRESETS && model_served[model];
}

/* Of (op, model) for every op: each op with no model (the requests that
 * named none, found none, or have none: stats, auth, invalid lines), and
 * the ops that act on a model with each model served; at most
 * PROTO_OP__COUNT + 5 * (models served) series. */
static bool shown_op_model_all(size_t l)
{
    size_t op = l / (MODEL_NPRESETS + 1), model = l % (MODEL_NPRESETS + 1);
    bool model_op = op != PROTO_OP_NONE && op != PROTO_OP_STATS && op != PROTO_OP_AUTH;
    return model == MODEL_NPRESETS || (model_op && model_served[model]);
}

#define SHOWN_NONE(l) true
#define SHOWN_op(l) true
#define SHOWN_code(l) true
#define SHOWN_release(l) true
#define SHOWN_close(l) true
#define SHOWN_model(l) model_served[(l)]
#define SHOWN_op_model(l) shown_op_model(l)
#define SHOWN_op_model_all(l) shown_op_model_all(l)

#define XX(set, key, count, name)                                                                  \
    enum { NL_##set = (count) };                                                                   \
    static const char *const key_##set = key;                                                      \
    static const char *(*const lname_##set)(size_t) = name;
METRICS_LABEL_SETS(XX)
#undef XX

/* ---- Storage ---- */

#define METRICS_SHARDS 16

/* One copy of every histogram: buckets[l][i] counts observations with
 * label l in (bound[i-1], bound[i]]; buckets[l][NB] those above the last
 * bound. */
typedef struct metrics_shard {
    _Alignas(SLOTD_CACHE_LINE) _Atomic uint64_t last_step_ns;
#define SHARD_HISTOGRAM(stem, labels, arg)                                                         \
    struct {                                                                                       \
        _Atomic uint64_t buckets[NL_##labels][NB_##arg + 1];                                       \
        _Atomic uint64_t sum[NL_##labels];                                                         \
    } stem;
#define SHARD_COUNTER(stem, labels, arg)
#define SHARD_GAUGE(stem, labels, arg)
#define SHARD_STAT_GAUGE(stem, labels, arg)
#define SHARD_STAT_COUNTER(stem, labels, arg)
#define SHARD_DERIVED_GAUGE(stem, labels, arg)
#define XX(kind, stem, labels, arg, name, help) SHARD_##kind(stem, labels, arg)
    METRICS_MAP(XX)
#undef XX
} metrics_shard_t;

static struct {
    _Atomic uint64_t start_ns;
#define FIELD_COUNTER(stem, labels) _Atomic uint64_t stem[NL_##labels];
#define FIELD_GAUGE(stem, labels) _Atomic uint64_t stem[NL_##labels];
#define FIELD_HISTOGRAM(stem, labels)
#define FIELD_STAT_GAUGE(stem, labels)
#define FIELD_STAT_COUNTER(stem, labels)
#define FIELD_DERIVED_GAUGE(stem, labels)
#define XX(kind, stem, labels, arg, name, help) FIELD_##kind(stem, labels)
    METRICS_MAP(XX)
#undef XX
} m;

/* The workers' copies, then the loop thread's own (METRICS_LOOP_SHARD),
 * which only the loop writes. */
#define METRICS_COPIES (METRICS_SHARDS + 1)
static metrics_shard_t shards[METRICS_COPIES];

/* The copy of histograms that `shard` (a worker's number, or
 * METRICS_LOOP_SHARD) writes. */
static inline metrics_shard_t *shard_of(unsigned shard)
{
    return &shards[shard == METRICS_LOOP_SHARD ? METRICS_SHARDS : shard % METRICS_SHARDS];
}

/* Jobs handed to the workers, and back begun or not (metrics_job_out()):
 * written by the loop thread only, so on a line of their own away from
 * what workers write. */
static struct {
    _Alignas(SLOTD_CACHE_LINE) _Atomic uint64_t out;
    _Atomic uint64_t back_started, back_unstarted;
} jobs;

/* metrics_process_figures(); set before any thread renders. */
static bool process_figures = true;

#define LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define STORE(x, v) atomic_store_explicit(&(x), (v), memory_order_relaxed)
#define BUMP(x, v) atomic_fetch_add_explicit(&(x), (v), memory_order_relaxed)
/* An add by the only thread that writes x: a load and a store, without
 * BUMP's locked instruction (4 ns against 1 here), readers still seeing
 * whole values. */
#define BUMP1(x, v) STORE(x, LOAD(x) + (v))
#define DROP(x, v) atomic_fetch_sub_explicit(&(x), (v), memory_order_relaxed)
#define ZERO(arr)                                                                                  \
    for (size_t z_ = 0; z_ < sizeof(arr) / sizeof((arr)[0]); z_++)                                 \
    STORE((arr)[z_], 0)

/* ---- Rendering ---- */

__attribute__((format(printf, 2, 3))) static int metrics_put(proto_buf_t *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    /* Every line written here is short and fixed in shape. */
    if (n < 0 || (size_t)n >= sizeof(tmp))
        return SLOTD_EINVAL;
    return proto_buf_append(b, tmp, (size_t)n);
}

static double seconds(uint64_t ns)
{
    return (double)ns / 1e9;
}

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        int rc_ = (expr);                                                                          \
        if (rc_ != SLOTD_OK)                                                                       \
            return rc_;                                                                            \
    } while (0)

/* Whether the label value at `i` is spelled as one before it (its sample
 * was then rendered with that one's). */
static bool seen_before(const char *(*lname)(size_t), size_t i)
{
    for (size_t j = 0; j < i; j++)
        if (strcmp(lname(j), lname(i)) == 0)
            return true;
    return false;
}

/* One sample of a counter or gauge, `lab` its "" or `{key="value"}`: a
 * count, or with a `scale` (UNIT_<arg>) not 0, the count divided by it. */
static int put_sample(proto_buf_t *b, const char *name, const char *lab, uint64_t v, double scale)
{
    if (scale == 0)
        return metrics_put(b, "%s%s %" PRIu64 "\n", name, lab, v);
    return metrics_put(b, "%s%s %.9f\n", name, lab, (double)v / scale);
}

/* The samples of a counter or gauge: one per distinct label value, in
 * list order, summing the indexes that share it. */
static int render_values(proto_buf_t *b, const char *name, const _Atomic uint64_t *v, size_t n,
                         const char *key, const char *(*lname)(size_t), double scale)
{
    if (key == NULL)
        return put_sample(b, name, "", LOAD(v[0]), scale);
    for (size_t i = 0; i < n; i++) {
        if (seen_before(lname, i))
            continue;
        uint64_t sum = 0;
        for (size_t j = i; j < n; j++)
            if (strcmp(lname(j), lname(i)) == 0)
                sum += LOAD(v[j]);
        char lab[128];
        snprintf(lab, sizeof(lab), "{%s=\"%s\"}", key, lname(i));
        TRY(put_sample(b, name, lab, sum, scale));
    }
    return SLOTD_OK;
}

/* The samples of one label value of a histogram: `counts` holds nb + 1
 * per-bucket counts summed over the copies; `lab` is "" or `key="value",`. */
static int render_buckets(proto_buf_t *b, const char *name, const char *lab, const uint64_t *counts,
                          const char *const *le, size_t nb, uint64_t sum, double scale)
{
    uint64_t cum = 0;
    for (size_t i = 0; i < nb; i++) {
        cum += counts[i];
        TRY(metrics_put(b, "%s_bucket{%sle=\"%s\"} %" PRIu64 "\n", name, lab, le[i], cum));
    }
    cum += counts[nb];
    TRY(metrics_put(b, "%s_bucket{%sle=\"+Inf\"} %" PRIu64 "\n", name, lab, cum));
    /* `lab` ends in a comma; the _sum and _count labels do not. */
    int ll = *lab ? (int)strlen(lab) - 1 : 0;
    const char *open = *lab ? "{" : "", *close = *lab ? "}" : "";
    if (scale == 1)
        TRY(metrics_put(b, "%s_sum%s%.*s%s %" PRIu64 "\n", name, open, ll, lab, close, sum));
    else
        TRY(metrics_put(b, "%s_sum%s%.*s%s %.9f\n", name, open, ll, lab, close,
                        (double)sum / scale));
    return metrics_put(b, "%s_count%s%.*s%s %" PRIu64 "\n", name, open, ll, lab, close, cum);
}

/* ---- Counting and reading, generated ---- */

#define DEF_COUNTER(stem, labels, arg)                                                             \
    void metrics_count_##stem##_n(uint64_t n METRICS_LABEL_PARAMC_##labels)                        \
    {                                                                                              \
        size_t i_ = INDEX_##labels(label);                                                         \
        if (i_ < NL_##labels)                                                                      \
            BUMP(m.stem[i_], n);                                                                   \
    }                                                                                              \
    void metrics_count_##stem(METRICS_LABEL_PARAM_##labels)                                        \
    {                                                                                              \
        size_t i_ = INDEX_##labels(label);                                                         \
        if (i_ < NL_##labels)                                                                      \
            BUMP(m.stem[i_], 1);                                                                   \
    }                                                                                              \
    DEF_READERS(stem, labels)

#define DEF_GAUGE(stem, labels, arg)                                                               \
    void metrics_##stem##_inc(METRICS_LABEL_PARAM_##labels)                                        \
    {                                                                                              \
        size_t i_ = INDEX_##labels(label);                                                         \
        if (i_ < NL_##labels)                                                                      \
            BUMP(m.stem[i_], 1);                                                                   \
    }                                                                                              \
    void metrics_##stem##_dec(METRICS_LABEL_PARAM_##labels)                                        \
    {                                                                                              \
        size_t i_ = INDEX_##labels(label);                                                         \
        if (i_ < NL_##labels)                                                                      \
            DROP(m.stem[i_], 1);                                                                   \
    }                                                                                              \
    void metrics_##stem##_set(uint64_t v METRICS_LABEL_PARAMC_##labels)                            \
    {                                                                                              \
        size_t i_ = INDEX_##labels(label);                                                         \
        if (i_ < NL_##labels)                                                                      \
            STORE(m.stem[i_], v);                                                                  \
    }                                                                                              \
    DEF_READERS(stem, labels)

#define DEF_READERS(stem, labels)                                                                  \
    uint64_t metrics_##stem##_value(void)                                                          \
    {                                                                                              \
        uint64_t n_ = 0;                                                                           \
        for (size_t i_ = 0; i_ < NL_##labels; i_++)                                                \
            n_ += LOAD(m.stem[i_]);                                                                \
        return n_;                                                                                 \
    }                                                                                              \
    uint64_t metrics_##stem##_value_at(METRICS_LABEL_PARAM_##labels)                               \
    {                                                                                              \
        size_t i_ = INDEX_##labels(label);                                                         \
        return i_ < NL_##labels ? LOAD(m.stem[i_]) : 0;                                            \
    }

/* The histogram's readers count observations.  The bucket is the first
 * whose bound is at least the value (NB: +Inf), searched from where the
 * value's bit length puts it (first_<set>): every request is observed two
 * to four times, and halving over a few dozen bounds cost more than the
 * rest of the observation. */
#define DEF_HISTOGRAM(stem, labels, arg)                                                           \
    static inline size_t bucket_##stem(uint64_t v)                                                 \
    {                                                                                              \
        size_t i_ = first_##arg[v == 0 ? 0 : 64 - __builtin_clzll(v)];                             \
        while (i_ < NB_##arg && v > bounds_##arg[i_])                                              \
            i_++;                                                                                  \
        return i_;                                                                                 \
    }                                                                                              \
    static inline void observe_##stem(metrics_shard_t *s_, uint64_t v, size_t l_)                  \
    {                                                                                              \
        BUMP(s_->stem.buckets[l_][bucket_##stem(v)], 1);                                           \
        BUMP(s_->stem.sum[l_], v);                                                                 \
    }                                                                                              \
    /* The same into the loop thread's own copy, by the loop thread. */                            \
    __attribute__((unused)) static inline void observe_loop_##stem(uint64_t v, size_t l_)          \
    {                                                                                              \
        metrics_shard_t *s_ = &shards[METRICS_SHARDS];                                             \
        BUMP1(s_->stem.buckets[l_][bucket_##stem(v)], 1);                                          \
        BUMP1(s_->stem.sum[l_], v);                                                                \
    }                                                                                              \
    void metrics_observe_##stem(unsigned shard, uint64_t v METRICS_LABEL_PARAMC_##labels)          \
    {                                                                                              \
        size_t l_ = INDEX_##labels(label);                                                         \
        if (l_ < NL_##labels)                                                                      \
            observe_##stem(shard_of(shard), v, l_);                                                \
    }                                                                                              \
    static uint64_t stem##_count(size_t l)                                                         \
    {                                                                                              \
        uint64_t n_ = 0;                                                                           \
        for (size_t k_ = 0; k_ < METRICS_COPIES; k_++)                                             \
            for (size_t i_ = 0; i_ <= NB_##arg; i_++)                                              \
                n_ += LOAD(shards[k_].stem.buckets[l][i_]);                                        \
        return n_;                                                                                 \
    }                                                                                              \
    uint64_t metrics_##stem##_value(void)                                                          \
    {                                                                                              \
        uint64_t n_ = 0;                                                                           \
        for (size_t l_ = 0; l_ < NL_##labels; l_++)                                                \
            n_ += stem##_count(l_);                                                                \
        return n_;                                                                                 \
    }                                                                                              \
    uint64_t metrics_##stem##_value_at(METRICS_LABEL_PARAM_##labels)                               \
    {                                                                                              \
        size_t l_ = INDEX_##labels(label);                                                         \
        return l_ < NL_##labels ? stem##_count(l_) : 0;                                            \
    }                                                                                              \
    static int render_##stem(proto_buf_t *b, const char *name)                                     \
    {                                                                                              \
        for (size_t l_ = 0; l_ < NL_##labels; l_++) {                                              \
            if (!SHOWN_##labels(l_))                                                               \
                continue;                                                                          \
            uint64_t counts_[NB_##arg + 1] = {0}, sum_ = 0;                                        \
            for (size_t k_ = 0; k_ < METRICS_COPIES; k_++) {                                       \
                for (size_t i_ = 0; i_ <= NB_##arg; i_++)                                          \
                    counts_[i_] += LOAD(shards[k_].stem.buckets[l_][i_]);                          \
                sum_ += LOAD(shards[k_].stem.sum[l_]);                                             \
            }                                                                                      \
            char lab_[128] = "";                                                                   \
            if (key_##labels != NULL) {                                                            \
                int n_ = snprintf(lab_, sizeof(lab_), "%s=\"%s\",", key_##labels,                  \
                                  lname_##labels(l_));                                             \
                if (n_ < 0 || (size_t)n_ >= sizeof(lab_))                                          \
                    return SLOTD_EINVAL;                                                           \
            }                                                                                      \
            TRY(render_buckets(b, name, lab_, counts_, le_##arg, NB_##arg, sum_, scale_##arg));    \
        }                                                                                          \
        return SLOTD_OK;                                                                           \
    }

#define DEF_STAT_GAUGE(stem, labels, arg)
#define DEF_STAT_COUNTER(stem, labels, arg)
#define DEF_DERIVED_GAUGE(stem, labels, arg)

#define XX(kind, stem, labels, arg, name, help) DEF_##kind(stem, labels, arg)
METRICS_MAP(XX)
#undef XX

/* Fills first[] for the bounds b[0 .. nb-1] (see first_<set>).  Writes
 * only what differs: a later metrics_init() (tests make several) then
 * writes nothing that a thread observing at the time could be reading. */
static void fill_first(uint8_t first[65], const uint64_t *b, size_t nb)
{
    for (unsigned k = 0; k < 65; k++) {
        uint64_t low = k == 0 ? 0 : (uint64_t)1 << (k - 1);
        size_t i = 0;
        while (i < nb && b[i] < low)
            i++;
        if (first[k] != i)
            first[k] = (uint8_t)i;
    }
}

void metrics_init(uint64_t now_ns)
{
#define XX(set, scale) fill_first(first_##set, bounds_##set, NB_##set);
    METRICS_BUCKET_SETS(XX)
#undef XX
    STORE(m.start_ns, now_ns);
    memset(model_served, 0, sizeof(model_served));
    fill_op_model_text();
#define INIT_COUNTER(stem, labels) ZERO(m.stem);
#define INIT_GAUGE(stem, labels) ZERO(m.stem);
#define INIT_HISTOGRAM(stem, labels)                                                               \
    for (size_t k_ = 0; k_ < METRICS_COPIES; k_++) {                                               \
        for (size_t l_ = 0; l_ < NL_##labels; l_++)                                                \
            ZERO(shards[k_].stem.buckets[l_]);                                                     \
        ZERO(shards[k_].stem.sum);                                                                 \
    }
#define INIT_STAT_GAUGE(stem, labels)
#define INIT_STAT_COUNTER(stem, labels)
#define INIT_DERIVED_GAUGE(stem, labels)
#define XX(kind, stem, labels, arg, name, help) INIT_##kind(stem, labels)
    METRICS_MAP(XX)
#undef XX
    for (size_t k = 0; k < METRICS_COPIES; k++)
        STORE(shards[k].last_step_ns, 0);
    STORE(jobs.out, 0);
    STORE(jobs.back_started, 0);
    STORE(jobs.back_unstarted, 0);
}

/* Stamps `now_ns` as the last step's time in shard `s`, keeping the
 * latest when workers sharing a copy finish out of order. */
static void stamp_step(metrics_shard_t *s, uint64_t now_ns)
{
    uint64_t last = LOAD(s->last_step_ns);
    while (last < now_ns &&
           !atomic_compare_exchange_weak_explicit(&s->last_step_ns, &last, now_ns,
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

void metrics_observe_step(unsigned shard, uint64_t duration_ns, uint64_t now_ns, size_t model)
{
    metrics_shard_t *s = shard_of(shard);

    if (model < NL_model)
        observe_step_seconds(s, duration_ns, model);
    stamp_step(s, now_ns);
}

void metrics_observe_step_alone(unsigned shard, uint64_t duration_ns, uint64_t now_ns, size_t model)
{
    metrics_shard_t *s = shard_of(shard);

    if (model < NL_model)
        observe_step_seconds(s, duration_ns, model);
    observe_batch_size(s, 1, 0);
    stamp_step(s, now_ns);
}

void metrics_model_served(size_t model)
{
    if (model < MODEL_NPRESETS)
        model_served[model] = true;
}

void metrics_observe_loop_request_durations(uint64_t now_ns, const uint64_t *read_ns,
                                            const uint16_t *op_models, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        size_t l = op_models[i];
        if (l < NL_op_model_all)
            observe_loop_request_duration(now_ns > read_ns[i] ? now_ns - read_ns[i] : 0, l);
    }
}

uint64_t metrics_last_step_ns(void)
{
    uint64_t last = 0;
    for (size_t k = 0; k < METRICS_COPIES; k++) {
        uint64_t t = LOAD(shards[k].last_step_ns);
        if (t > last)
            last = t;
    }
    return last;
}

/* A counter's or gauge's unit (its `arg`): _ a count, ns nanoseconds
 * rendered as seconds. */
#define UNIT__ 0.0
#define UNIT_ns 1e9
#define RENDER_COUNTER(stem, labels, arg, name)                                                    \
    render_values(b, name, m.stem, NL_##labels, key_##labels, lname_##labels, UNIT_##arg)
#define RENDER_GAUGE RENDER_COUNTER
#define RENDER_HISTOGRAM(stem, labels, arg, name) render_##stem(b, name)
#define RENDER_STAT_GAUGE(stem, labels, arg, name)                                                 \
    metrics_put(b, "%s %" PRIu64 "\n", name, (uint64_t)st->arg)
#define RENDER_STAT_COUNTER RENDER_STAT_GAUGE
#define RENDER_DERIVED_GAUGE(stem, labels, arg, name) arg(b, name, st, now_ns)

#define TYPE_COUNTER "counter"
#define TYPE_GAUGE "gauge"
#define TYPE_HISTOGRAM "histogram"
#define TYPE_STAT_GAUGE "gauge"
#define TYPE_STAT_COUNTER "counter"
#define TYPE_DERIVED_GAUGE "gauge"

/* The DERIVED_GAUGE renderers: the samples of family `name`. */

/* A family by state: used, and free as total - used (0 when figures read
 * at different instants give more used than total). */
static int used_and_free(proto_buf_t *b, const char *name, uint64_t used, uint64_t total)
{
    TRY(metrics_put(b, "%s{state=\"used\"} %" PRIu64 "\n", name, used));
    return metrics_put(b, "%s{state=\"free\"} %" PRIu64 "\n", name,
                       total > used ? total - used : 0);
}

static int render_pool_bytes(proto_buf_t *b, const char *name, const proto_stats_t *st,
                             uint64_t now_ns)
{
    (void)now_ns;
    return used_and_free(b, name, st->pool_bytes_used, st->pool_bytes_total);
}

static int render_pool_slots(proto_buf_t *b, const char *name, const proto_stats_t *st,
                             uint64_t now_ns)
{
    (void)now_ns;
    return used_and_free(b, name, st->pool_slots_used, st->pool_slots_total);
}

/* Before the first completed step there is no age to report: the family is
 * announced but has no sample, so an alert on it stays quiet on an idle
 * daemon, and absent() tells "never stepped" apart. */
static int render_last_step_age(proto_buf_t *b, const char *name, const proto_stats_t *st,
                                uint64_t now_ns)
{
    (void)st;
    uint64_t last = metrics_last_step_ns();
    if (last == 0)
        return SLOTD_OK;
    return metrics_put(b, "%s %.9f\n", name, seconds(now_ns > last ? now_ns - last : 0));
}

void metrics_job_out(void)
{
    BUMP1(jobs.out, 1);
}

void metrics_job_back(bool started)
{
    if (started)
        BUMP1(jobs.back_started, 1);
    else
        BUMP1(jobs.back_unstarted, 1);
}

/* The gauges of jobs out: begun is what slotd_request_wait_seconds has
 * observed.  The counts are read one after the other while workers count
 * on, so a reading may be off by the jobs begun in between: clamped at 0. */
static int render_requests_waiting(proto_buf_t *b, const char *name, const proto_stats_t *st,
                                   uint64_t now_ns)
{
    (void)st;
    (void)now_ns;
    uint64_t begun = metrics_request_wait_value();
    uint64_t gone = LOAD(jobs.back_unstarted) + begun, out = LOAD(jobs.out);
    return metrics_put(b, "%s %" PRIu64 "\n", name, out > gone ? out - gone : 0);
}

static int render_requests_running(proto_buf_t *b, const char *name, const proto_stats_t *st,
                                   uint64_t now_ns)
{
    (void)st;
    (void)now_ns;
    uint64_t back = LOAD(jobs.back_started), begun = metrics_request_wait_value();
    return metrics_put(b, "%s %" PRIu64 "\n", name, begun > back ? begun - back : 0);
}

static int render_uptime(proto_buf_t *b, const char *name, const proto_stats_t *st, uint64_t now_ns)
{
    (void)st;
    uint64_t start = LOAD(m.start_ns);
    return metrics_put(b, "%s %.9f\n", name, seconds(now_ns > start ? now_ns - start : 0));
}

int metrics_render(proto_buf_t *b, const proto_stats_t *st, uint64_t now_ns)
{
#define XX(kind, stem, labels, arg, name, help)                                                    \
    TRY(metrics_put(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, TYPE_##kind));            \
    TRY(RENDER_##kind(stem, labels, arg, name));
    METRICS_MAP(XX)
#undef XX
    return procstat_render(b, process_figures);
}

void metrics_process_figures(bool on)
{
    process_figures = on;
}
