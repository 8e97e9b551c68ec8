/*
 * proto.h: bytes to validated requests, and replies to bytes.
 *
 * Four parts, none of which knows threads, sockets or the cache:
 *   - proto_buf_t, a growable byte buffer replies are written into;
 *   - proto_framer_t, which cuts a byte stream into lines under a length
 *     limit, handing complete lines straight out of the caller's buffer
 *     when it can and copying only a line split across reads;
 *   - proto_proxy_t, which reads the PROXY protocol header a balancer
 *     sends before a connection's first line;
 *   - proto_request_parse(), which parses one line (the usual requests in
 *     one pass of its own, any other line with cJSON) and validates the op
 *     and every field's type and range by the op table, proto_ops[] and
 *     proto_fields[] (range against a model, such as a token below V, is
 *     the caller's: see model_check_prompt()); and
 *     the proto_reply_*() writers, each appending exactly one line.
 *
 * Memory: for a line the one-pass reader leaves to cJSON,
 * proto_request_parse() builds its cJSON tree in a bump arena of
 * the calling thread (a static block per thread, plus overflow chunks that
 * are freed before the call returns), through cJSON allocation hooks that
 * proto_init() installs for the whole process.  Outside a parse those hooks
 * are plain malloc and free, so other code may use cJSON as usual, on any
 * thread; it must not replace the hooks while a parse runs (if it replaces
 * them at another time, parsing still works, one malloc per node again).
 */
#ifndef SLOTD_PROTO_PROTO_H
#define SLOTD_PROTO_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define PROTO_ID_MAX 64
#define PROTO_MODEL_MAX 32
#define PROTO_DEFAULT_MAX_LINE 65536

/* ---- Output buffer ---- */

/** A growable buffer.  Owns `data` (malloc), freed by proto_buf_free(). */
typedef struct proto_buf {
    char *data;
    size_t len;
    size_t cap;
} proto_buf_t;

void proto_buf_init(proto_buf_t *b);
void proto_buf_free(proto_buf_t *b);
/** Ensures room for `extra` more bytes.  SLOTD_OK or SLOTD_ENOMEM. */
int proto_buf_reserve(proto_buf_t *b, size_t extra);
int proto_buf_append(proto_buf_t *b, const void *data, size_t len);
/** Drops the first `n` bytes (they were written out). */
void proto_buf_consume(proto_buf_t *b, size_t n);

/* ---- Framing ---- */

/** Called once per complete, non-blank line; `line` excludes the "\n" and
 * a "\r" before it, and is valid only during the call (it may point into
 * the buffer given to proto_framer_feed()).  Return 0 to go on. */
typedef int (*proto_line_cb)(void *arg, const char *line, size_t len);

/** Owns a carry-over buffer for a line split across feeds (at most
 * max_line + 1 bytes), freed by proto_framer_free(). */
typedef struct proto_framer {
    char *buf;
    size_t len;
    size_t cap;
    size_t max_line;
    bool failed;
} proto_framer_t;

void proto_framer_init(proto_framer_t *f, size_t max_line);
void proto_framer_free(proto_framer_t *f);
/** Raises the line limit to `max_line` (not below the current one), from
 * the next line on; may be called from the line callback, for the lines
 * after the one being delivered in the same feed. */
void proto_framer_raise_limit(proto_framer_t *f, size_t max_line);

/** Feeds bytes: `cb` gets every complete line in order; lines that are
 * empty or only JSON white space are skipped.  Returns SLOTD_OK, the
 * callback's non-zero value (feeding stops there), SLOTD_ELINE_TOO_LONG as
 * soon as a line is longer than max_line bytes (not counting "\n"), with or
 * without a newline, after every earlier line was delivered; or
 * SLOTD_ENOMEM (before any line was delivered, unless the callback raised
 * the limit).  After SLOTD_ELINE_TOO_LONG the framer refuses more input. */
int proto_framer_feed(proto_framer_t *f, const char *data, size_t len, proto_line_cb cb,
                      void *arg);

/* ---- Requests ---- */

typedef enum proto_op {
    PROTO_OP_NONE = 0,
    PROTO_OP_START,
    PROTO_OP_STEP,
    PROTO_OP_FINISH,
    PROTO_OP_LOGITS,
    PROTO_OP_GENERATE,
    PROTO_OP_STATS,
    PROTO_OP_AUTH,
    PROTO_OP_APPEND,
    PROTO_OP_FORK,
    PROTO_OP__COUNT
} proto_op_t;

/** The op's wire name ("start", ...); "none" for PROTO_OP_NONE.  Static. */
const char *proto_op_name(proto_op_t op);

/* ---- The op table (ops.c): what every op takes, one row each ---- */

/** The members a request may carry; the first value of each counts. */
typedef enum proto_field {
    PROTO_FIELD_TAG,
    PROTO_FIELD_OP,
    PROTO_FIELD_ID,
    PROTO_FIELD_MODEL,
    PROTO_FIELD_PROMPT,
    PROTO_FIELD_TOKENS,
    PROTO_FIELD_N,
    PROTO_FIELD_STEPS,
    PROTO_FIELD_USE_CACHE,
    PROTO_FIELD_TOKEN,
    PROTO_FIELD_SAMPLE,
    PROTO_FIELD_STOP,
    PROTO_FIELD_SCORES,
    PROTO_FIELD_FROM,
    PROTO_FIELD__COUNT
} proto_field_t;

/** A member's type, which names its validator (see rules.c). */
typedef enum proto_type {
    PROTO_TYPE_TAG,   /* a string or an integer, kept as JSON text */
    PROTO_TYPE_OP,    /* a string naming a row of proto_ops[] */
    PROTO_TYPE_NAME,  /* a string of 1..hi bytes of [A-Za-z0-9_.:-], copied */
    PROTO_TYPE_BYTES, /* a string of lo..hi bytes, malloc'd */
    PROTO_TYPE_INTS,  /* a non-empty array of integers, malloc'd */
    PROTO_TYPE_INT,   /* an integer from lo to hi */
    PROTO_TYPE_BOOL,
    /* Decoding controls (decode.c), read from the value's JSON text: */
    PROTO_TYPE_SAMPLE, /* {"temperature":T,"top_k":K,"top_p":P,"seed":S} */
    PROTO_TYPE_STOP,   /* an array of at most PROTO_STOP_MAX tokens */
    PROTO_TYPE_SCORES  /* "all", "none" or an integer >= 1 */
} proto_type_t;

/** One member: its wire name, its validator and limits, where its value
 * goes in proto_request_t, and the words of its errors, which read
 * "<op>: `<name>` <must>" (or <missing>, when it is required and absent;
 * NULL: <must> again). */
typedef struct proto_field_def {
    const char *name;
    unsigned char len;
    proto_type_t type;
    int64_t lo, hi;
    size_t at;           /* offsetof(proto_request_t, ...) of the value */
    size_t at_len;       /* BYTES, INTS: offsetof the size_t count */
    unsigned char width; /* INT: sizeof the value (4: uint32_t, 8: int64_t) */
    const char *must;
    const char *missing;
} proto_field_def_t;

#define PROTO_OP_MEMBERS_MAX 4

typedef struct proto_member {
    proto_field_t field;
    bool required;
} proto_member_t;

/** What an op acts on, which decides how the server applies it. */
typedef enum proto_op_kind {
    PROTO_KIND_NONE = 0,  /* no op */
    PROTO_KIND_OPEN,      /* opens a session under its id (start) */
    PROTO_KIND_SESSION,   /* acts on an open session, after its earlier requests */
    PROTO_KIND_STATELESS, /* no session: a slot borrowed for the call alone */
    PROTO_KIND_BARRIER,   /* answered once every earlier line of its connection is */
    PROTO_KIND_CONN,      /* about the connection itself (auth) */
    PROTO_KIND_BRANCH,    /* opens a session from an open one (fork), once every
                             earlier line of its connection has taken effect */
} proto_op_kind_t;

/** One op: its wire name, what it acts on, its members in the order their
 * errors win, whether it takes the decoding controls (`sample`, `stop`,
 * `scores`: optional, checked after its members, in that order), and
 * whether it runs on a worker (false: the loop thread answers it). */
typedef struct proto_op_def {
    const char *name;
    unsigned char len;
    proto_op_kind_t kind;
    bool on_worker;
    bool decodes;
    unsigned char nmembers;
    proto_member_t members[PROTO_OP_MEMBERS_MAX];
} proto_op_def_t;

/** Indexed by proto_op_t (row PROTO_OP_NONE is no op) and proto_field_t. */
extern const proto_op_def_t proto_ops[PROTO_OP__COUNT];
extern const proto_field_def_t proto_fields[PROTO_FIELD__COUNT];

/** Whether `op` runs on a worker; false for PROTO_OP_NONE or out of range. */
static inline bool proto_op_on_worker(proto_op_t op)
{
    return (unsigned)op < PROTO_OP__COUNT && proto_ops[op].on_worker;
}

/** What `op` acts on; PROTO_KIND_NONE for PROTO_OP_NONE or out of range.
 * Inline: the server asks it of every line. */
static inline proto_op_kind_t proto_op_kind(proto_op_t op)
{
    return (unsigned)op < PROTO_OP__COUNT ? proto_ops[op].kind : PROTO_KIND_NONE;
}

/** Installs proto/'s cJSON allocation hooks (see above) once per process;
 * later calls do nothing.  proto_request_parse() calls it itself; a program
 * that uses cJSON on more than one thread should call it before it starts
 * them, so that the hooks are never written while another thread reads
 * them.  Thread-safe. */
void proto_init(void);

/** The longest auth token, in bytes. */
#define PROTO_AUTH_TOKEN_MAX 4096

/** The most stop tokens a request may carry. */
#define PROTO_STOP_MAX 16

/** Which scores a step or generate reply carries. */
typedef enum proto_scores {
    PROTO_SCORES_ALL = 0, /* `logits`, every score of every pick (the default) */
    PROTO_SCORES_NONE,    /* no scores */
    PROTO_SCORES_TOP      /* `top`: the k best [token, score] pairs of each pick */
} proto_scores_t;

/** The decoding controls of a step or generate, as parsed: types and
 * ranges that need no model (a stop token's bound V is the caller's).
 * A plain value inside the request. */
typedef struct proto_decode {
    bool set;         /* any of the three members was given */
    bool has_sample;  /* `sample` was given */
    bool has_stop;    /* `stop` was given (the reply then says `stopped`) */
    double temperature; /* >= 0, finite; default 1 */
    double top_p;       /* in (0, 1]; default 1 */
    uint64_t seed;      /* default 0 */
    uint64_t top_k;     /* >= 1; default UINT64_MAX (no cut) */
    uint32_t nstop;
    uint32_t stop[PROTO_STOP_MAX]; /* < 2^32; checked against V by the caller */
    proto_scores_t scores;
    uint64_t top; /* PROTO_SCORES_TOP: k >= 1 */
} proto_decode_t;

/** A validated request.  Owns `tag`, `tokens` and `token` (malloc), freed
 * by proto_request_free(). */
typedef struct proto_request {
    proto_op_t op;
    char *tag;                       /* the tag as JSON text ("7", "\"x\""), NULL if absent */
    char id[PROTO_ID_MAX + 1];       /* start, step, finish, append: 1-64 of [A-Za-z0-9_.:-] */
    char model[PROTO_MODEL_MAX + 1]; /* start, logits, generate: "" when absent */
    char from[PROTO_ID_MAX + 1];     /* fork: the session forked, as `id` */
    int64_t *tokens;                 /* start: the prompt; logits, generate, append: the tokens */
    size_t ntokens;
    int64_t steps;  /* generate: required, >= 0 */
    bool use_cache; /* generate: default false */
    uint32_t n;     /* step: default 1, >= 1 */
    char *token;    /* auth: 1..PROTO_AUTH_TOKEN_MAX bytes, NUL-terminated */
    size_t token_len;
    proto_decode_t dec; /* step, generate: `sample`, `stop`, `scores` */
} proto_request_t;

void proto_request_init(proto_request_t *r);
/** Frees what `r` owns and leaves it as proto_request_init() does (the
 * server's request free list relies on this), on a request that only
 * proto_request_init() and proto_request_parse() wrote: it puts back only
 * the tag and the members of r->op's row, all a parse can have stored. */
void proto_request_free(proto_request_t *r);

/** Parses and validates one line into `r` (initialised).  Errors, the first
 * met in this order: bad_json (not valid UTF-8, a NUL byte, not one JSON
 * object), unknown_op (`op` missing, not a string, or unknown), bad_request
 * (naming the field: tag, id, model, prompt, tokens, n, steps, use_cache).
 * Integers must be numbers with an integral value within +-2^53; tokens and
 * prompts are arrays of such.  Unknown members are ignored.  On error,
 * r->tag is still set when the line was an object with a valid tag, so the
 * error reply can echo it.  Returns SLOTD_OK or the code set in `err`. */
int proto_request_parse(const char *line, size_t len, proto_request_t *r, slotd_error_t *err);

/* ---- Replies: each appends one line ending "\n"; SLOTD_OK or SLOTD_ENOMEM ---- */

/** The stats object, shared by the `stats` op and GET /stats. */
typedef struct proto_stats {
    uint64_t cache_entries;
    uint64_t live_sessions;
    uint64_t g_calls;
    uint64_t rows;
    uint64_t connections;
    uint64_t requests_total;
    uint64_t errors_total;
    uint64_t pool_bytes_total;
    uint64_t pool_bytes_used;
    uint64_t pool_slots_total;
    uint64_t pool_slots_used;
    uint64_t released_finish;
    uint64_t released_disconnect;
    uint64_t released_idle;
    uint64_t released_shutdown;
    uint64_t uptime_seconds;
    uint32_t threads;
    /* --on-full evict (docs/protocol.md, "When the pool is full"). */
    uint64_t evicted_sessions;      /* live sessions holding no pool memory now */
    uint64_t evictions_total;       /* sessions evicted since start */
    uint64_t rebuilt_entries_total; /* entries recomputed rebuilding them */
    /* The prefix cache: entries only it holds now; since start, entries
     * reused, looked up, and given up for room. */
    uint64_t prefix_entries;
    uint64_t prefix_hit_entries;
    uint64_t prefix_query_entries;
    uint64_t prefix_evicted_entries;
    uint64_t shared_blocks; /* blocks with two or more holders; in the metrics only */
} proto_stats_t;

/* `tag` is NULL or JSON text from proto_request_t.tag, echoed as "tag". */
int proto_reply_error(proto_buf_t *b, const char *tag, const slotd_error_t *err);
/** `cached`: the prompt's entries reused from the prefix cache. */
int proto_reply_start(proto_buf_t *b, const char *tag, const char *id, const char *model,
                      uint32_t entries, uint32_t cached);
/** `logits` is NULL (hash) or n*V values, printed "%.6f". */
int proto_reply_step(proto_buf_t *b, const char *tag, const char *id, const uint32_t *tokens,
                     uint32_t n, const double *logits, uint32_t vocab, uint32_t entries);
/** The reply to an append: the session's entries after it, and how many
 * of the appended ones were reused rather than computed. */
int proto_reply_append(proto_buf_t *b, const char *tag, const char *id, uint32_t entries,
                       uint32_t cached);
int proto_reply_finish(proto_buf_t *b, const char *tag, const char *id, uint32_t released);
/** The reply to a fork: the new session's id, model and entries, and how
 * many of them were reused rather than computed. */
int proto_reply_fork(proto_buf_t *b, const char *tag, const char *id, const char *model,
                     uint32_t entries, uint32_t cached);
int proto_reply_logits(proto_buf_t *b, const char *tag, const double *logits, uint32_t vocab,
                       uint64_t rows);
/** `tokens` holds ntokens (input plus picks); `logits` steps*V values. */
int proto_reply_generate(proto_buf_t *b, const char *tag, const uint32_t *tokens, size_t ntokens,
                         const double *logits, uint64_t steps, uint32_t vocab, uint64_t rows);

/** What a step or generate reply carries under decoding controls, besides
 * its tokens.  Borrowed for the call. */
typedef struct proto_picks {
    proto_scores_t scores; /* ALL: `logits`; NONE: no scores; TOP: `top` */
    uint32_t k;            /* TOP: pairs per pick */
    const uint32_t *top;   /* TOP: k tokens per pick, in the order written */
    bool has_stop;         /* write `stopped` */
    bool stopped;
} proto_picks_t;

/** proto_reply_step() under `pk`: `logits` (n*V rounded values, or NULL
 * for hash) are written whole (ALL), not at all (NONE), or as the pairs
 * [top[i], logits[top[i]]] of each pick (TOP); then "stopped" if
 * pk->has_stop.  pk NULL is proto_reply_step(). */
int proto_reply_step_picks(proto_buf_t *b, const char *tag, const char *id, const uint32_t *tokens,
                           uint32_t n, const double *logits, uint32_t vocab, uint32_t entries,
                           const proto_picks_t *pk);

/** proto_reply_generate() under `pk`, as proto_reply_step_picks(): `steps`
 * is the number of picks made. */
int proto_reply_generate_picks(proto_buf_t *b, const char *tag, const uint32_t *tokens,
                               size_t ntokens, const double *logits, uint64_t steps,
                               uint32_t vocab, uint64_t rows, const proto_picks_t *pk);
int proto_reply_stats(proto_buf_t *b, const char *tag, const proto_stats_t *st);
/** A tenant's own stats (`tenant`, not kept, NULL for the daemon's): the
 * same members, then "tenant":NAME. */
int proto_reply_stats_tenant(proto_buf_t *b, const char *tag, const proto_stats_t *st,
                             const char *tenant);
/** The reply to a successful auth: {"ok":true}. */
/** The reply to an auth with a tenant's token: {"ok":true,"tenant":NAME};
 * `tenant` (not kept) NULL gives proto_reply_auth()'s. */
int proto_reply_auth_tenant(proto_buf_t *b, const char *tag, const char *tenant);
int proto_reply_auth(proto_buf_t *b, const char *tag);

/* ---- The PROXY protocol ---- */

/** The longest version 1 header, "\r\n" included. */
#define PROTO_PROXY_V1_MAX 107
/** proto_proxy_feed(): the header is not complete yet. */
#define PROTO_PROXY_MORE 1

/** Whose connection a PROXY header names. */
typedef enum proto_proxy_family {
    PROTO_PROXY_LOCAL = 0, /* none (LOCAL, UNKNOWN, AF_UNSPEC, AF_UNIX): the socket's peer stands */
    PROTO_PROXY_INET,      /* an IPv4 client: 4 bytes of `src` and `dst` */
    PROTO_PROXY_INET6,     /* an IPv6 client: 16 bytes */
} proto_proxy_family_t;

/** The reader of one PROXY protocol header (v1 or v2), fed as bytes arrive
 * (proto/proxy.c).  A plain value: it owns no memory.  The public fields
 * are set once proto_proxy_feed() returned SLOTD_OK. */
typedef struct proto_proxy {
    int version; /* 1 or 2 */
    proto_proxy_family_t family;
    uint8_t src[16], dst[16];    /* the client's and the balancer's addresses, network order */
    uint16_t src_port, dst_port; /* their ports */
    unsigned char _buf[PROTO_PROXY_V1_MAX];
    size_t _len;  /* bytes of the header kept in _buf */
    size_t _want; /* v2: bytes to keep (head and addresses), once the head is read */
    size_t _skip; /* v2: bytes still to skip (TLVs) after them */
    bool _done, _failed;
} proto_proxy_t;

void proto_proxy_init(proto_proxy_t *p);
/** Reads the next `len` bytes of a connection that must begin with a
 * PROXY header.  Returns SLOTD_OK when the header is complete (*used is
 * how many of the bytes it took; the rest are the stream's),
 * PROTO_PROXY_MORE when all `len` bytes were taken and it is not complete
 * yet, or SLOTD_EINVAL with a one-line reason in `err` when the bytes are
 * not the start of a valid header (as soon as that is certain).  After
 * SLOTD_OK or SLOTD_EINVAL every feed is SLOTD_EINVAL. */
int proto_proxy_feed(proto_proxy_t *p, const char *data, size_t len, size_t *used,
                     slotd_error_t *err);

#endif
