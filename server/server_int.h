/*
 * server_int.h: the records the files of server/ share and nothing else
 * uses: the daemon's state, a connection, a session record and a request
 * record.  The functions each file offers the others are in its own
 * narrow header (req_int.h, session_int.h, ...; docs/design.md, "server/
 * layout").
 *
 * Everything here belongs to the loop thread, except a request record
 * while its job is with the workers (state REQ_RUNNING, submitted): then
 * the worker running it reads the request and writes the result fields,
 * and the loop thread touches neither until the record comes back through
 * the completion queue.
 */
#ifndef SLOTD_SERVER_SERVER_INT_H
#define SLOTD_SERVER_SERVER_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "cache/session.h"
#include "config.h"
#include "core/util.h"
#include "server/admin/admin.h"
#include "server/sched/sched.h"
#include "session_map.h"

/* A connection stops being read while it has this many requests waiting
 * for their reply, or this many reply bytes not yet written; it is read
 * again once both are below half.  The byte bound also holds its jobs
 * back: a job is submitted only while the connection's unwritten bytes,
 * plus the replies its running jobs may still produce (an upper bound per
 * job, launch.c: req_reply_bound()), plus the job's own, stay within it (or
 * when nothing is unwritten and nothing runs, so that one job larger than
 * the bound still runs). */
#define CONN_MAX_OUTSTANDING 1024
#define CONN_MAX_PENDING_BYTES (4u << 20)

/* The lingering close: once every reply of a connection whose input ended
 * (line_too_long; in a drain, every connection whose peer has not ended
 * its own) is written, its sending side is shut down and its input read
 * and discarded until the peer's EOF, this many bytes, or this long.
 * Closing with input unread would make the kernel reset the connection
 * and drop the replies still in its send queue.  Past the bytes or the
 * time, it is closed as soon as that queue is empty (every reply taken by
 * the peer: polled every CONN_DELIVER_POLL_MS, input still discarded),
 * but no later than CONN_LINGER_HARD_MS after the lingering began; in a
 * drain, both end before --shutdown-timeout. */
#define CONN_LINGER_MS 2000
#define CONN_LINGER_MAX_BYTES (32u << 20)
#define CONN_LINGER_HARD_MS 10000
#define CONN_DELIVER_POLL_MS 10

/* Holding replies (conn__hold_output()): a connection's new output waits
 * for more of its jobs out for at most --reply-hold-us, and only while it
 * is below this many bytes. */
#define CONN_HOLD_MAX_BYTES (16u << 10)

#define SERVER_READ_BUF (64u << 10)

/* A client's address as text: "[" INET6_ADDRSTRLEN "]:65535". */
#define SERVER_PEER_MAX 64

/* The message of every shutting_down reply. */
#define SERVER_SHUTTING_DOWN_MSG "the daemon is shutting down"

typedef struct admin admin_t;
typedef struct server server_t;
typedef struct conn conn_t;
typedef struct tenant tenant_t; /* tenancy_int.h */
typedef struct session session_t;
typedef struct req req_t;
typedef struct inspect_listing inspect_listing_t;

typedef enum req_state {
    REQ_NEW = 0, /* just taken from the free list */
    REQ_HELD,    /* parsed behind a stats not yet answered: not applied yet */
    REQ_WAITING, /* in its session's FIFO, or a stats waiting for the head */
    REQ_PARKED,  /* a job held back by its connection's output bound (conn__park()) */
    REQ_RUNNING, /* a job: in the batch, the workers' queue, or running */
    REQ_DONE,    /* `reply` holds its line */
    REQ_DEFER,   /* waits for its connection's earlier lines (dispatch.c, Pipelined order) */
    REQ_BUILD,   /* waits for the weights of its model (models.c); the connection's barrier */
    REQ_ROOM,    /* refused for room, waits for some under --on-full wait (evict.c) */
} req_state_t;

/** A request record: one line read, from parse until its reply is copied
 * to the connection's output.  Taken from the server's free list by
 * req__get() and given back by req__put(), which frees what the parsed
 * request owns. */
struct req {
    worker_job_t job; /* the pool's while REQ_RUNNING */

    /* Loop thread only.  Cleared by req__put(), with `job`. */
    session_t *session;  /* start, step, append, finish: the session acted on */
    req_t *session_next; /* the session's FIFO */
    req_t *park_next;    /* conn->park_head while REQ_PARKED */
    size_t reply_bound;  /* a job: its reply's most bytes; in conn->reserved while out */
    uint64_t need_bytes; /* pool room it may take, in conn->pending_bytes until REQ_DONE */
    uint32_t need_slots; /* slots likewise, in conn->pending_slots */
    bool again;          /* REQ_DEFER after its job ran: run it again, not apply it */
    uint8_t refusal;     /* a cache_full: what ran out (metrics_refusal_t), counted when answered */
    bool uncounted;      /* read behind a barrier: counted in requests_total when it lifts */
    uint64_t room_until; /* --on-full wait: uv_now() its wait for room ends; 0 before it began */
    uint8_t room_tries;  /* --on-full evict: runs again with nothing evicted for it (evict.c) */
    uint8_t model_label; /* model_preset_index() + 1 of the model it named or its session's,
                            once found (slotd_request_duration_seconds); 0: none */
    req_state_t state;

    /* Loop thread only.  Set for each line by whoever took the record
     * (req__get(), req__order_append()), not cleared. */
    conn_t *conn;
    req_t *order_next; /* the connection's order FIFO; the free list */
    uint64_t seq;      /* the line's number on its connection */
    uint64_t read_ns;  /* uv_hrtime() of the read its line came in (the wait metrics) */
    req_t *room_prev, *room_next; /* server->room_head while REQ_ROOM (evict.c sets them) */

    /* The job's input: set by the loop before submit, read-only after.
     * req__put() relies on the order of `rq`, `model`, `cs` and `reply`. */
    proto_request_t rq;   /* owns tag and tokens */
    const model_t *model; /* start, logits, generate */
    uint64_t owner_key;   /* the connection's serial number */
    uint64_t scope_key;   /* a start: its prefix-cache scope (tenancy__prefix_scope()) */
    req_t *chain_next;    /* a step: the next step of its session run in the same job (launch.c) */
    /* A fork: the session forked, its slot and its recorded tokens as they
     * stood when the fork was applied (dispatch.c: fork_apply()).  The
     * session runs nothing until the fork's job is back (the fork is its
     * connection's barrier), so they stay what the worker reads. */
    session_t *fork_from;
    cache_session_t from_cs;
    audit_tokens_t from_toks; /* a view of fork_from->toks: not owned */
    /* Set at submit (launch.c, fork_apply()): the session (a fork: the
     * session forked) is evicted, and the job first rebuilds it by a
     * prefill of its recorded tokens (evict.c, job.c). */
    bool rebuild, from_evicted;

    /* The job's result: written by its worker while REQ_RUNNING, by the
     * loop thread otherwise. */
    audit_tokens_t toks; /* keep_toks: the session's tokens, as `cs` (start: its prompt) */
    int rc;              /* SLOTD_OK, or the code of the error in `reply` */
    bool chain_cut;      /* ran, and its chain's later steps did not: they go back (launch.c) */
    uint64_t begun_ns;   /* the time its worker began it (job_begun()); 0 if none did */
    /* start: the new session; step: in and out.  Not cleared by
     * req__put(): every job that reads it writes it first (a step's is its
     * session's, copied at submit, launch.c; a start's worker fills it). */
    cache_session_t cs;
    proto_buf_t reply; /* owned; one reply line once REQ_DONE */

    /* Set by the loop thread when the connection has gone: a worker that
     * has not started the job skips it. */
    _Atomic bool canceled;
    /* Set by the worker as it begins the job; read by GET /sessions. */
    _Atomic bool started;
};

/** Whether `r` runs on its live session's slot, which its job copies from
 * the session record at submit and gives back when it comes back: a step
 * or an append. */
static inline bool req__on_slot(const req_t *r)
{
    return r->rq.op == PROTO_OP_STEP || r->rq.op == PROTO_OP_APPEND;
}

/** Whether `r` opens its session: a start, or a fork (whose slot is a copy
 * of another session's). */
static inline bool req__opens(const req_t *r)
{
    return r->rq.op == PROTO_OP_START || r->rq.op == PROTO_OP_FORK;
}

/** The positions a step or an append asks to add to its session's slot. */
static inline uint64_t req__adds(const req_t *r)
{
    return r->rq.op == PROTO_OP_APPEND ? (uint64_t)r->rq.ntokens : (uint64_t)r->rq.n;
}

/** A session record: one start on one connection, from its parse until
 * its last queued request has run and its slot is released.  Freed by
 * session__put().
 *
 * Laid out for a step, which with 100,000 live sessions finds its record
 * out of cache: what every step reads or writes on the loop thread comes
 * first, 59 bytes together (two cache lines at most), then `cs`, which a
 * step copies to its request and back; what only a start, a finish or a
 * close touches comes last.  The map's lookup of a short id reads no record
 * at all (session_map.h).  The record is not aligned to a cache line: with
 * malloc's aligned allocation each live session cost about 150 bytes more
 * of resident memory (bench/memory, part live), for a line at most saved. */
struct session {
    /* What a step touches: the FIFO, the idle list and the flags. */
    conn_t *conn;
    req_t *fifo_head, *fifo_tail;   /* requests waiting to run, in order */
    req_t *running;                 /* the request whose job is out, or NULL */
    TAILQ_ENTRY(session) lru;       /* server->lru while in_lru */
    uint64_t idle_since;            /* uv_now() when it went idle */
    bool in_map;                    /* the id names it: steps and finish can still reach it */
    bool has_slot;                  /* its start succeeded and it was not released yet */
    bool in_lru;                    /* idle: holds a slot, in the map, nothing queued or running */
    bool evicted; /* has_slot, but its slot went back to the pool (--on-full evict, evict.c):
                     `cs` keeps its model, owner and entries, `toks` its sequence */

    cache_session_t cs;  /* owner from the parse on (node.id is its id); the rest while has_slot */
    audit_tokens_t toks; /* keep_toks: its tokens while has_slot; owned, freed
                            with it */

    /* Start, finish and close only. */
    session_map_node_t node;        /* id: cs.owner.id; linked in conn->map while in_map */
    session_t *prev, *next;         /* conn->sessions: every record of the connection */

    /* GET /sessions and the connection's share (session.c). */
    uint64_t born;    /* uv_now() when its start was read */
    uint64_t charged; /* its part of conn->share_bytes while in_map, in pool bytes */
    /* The chain its charged requests build, if they all succeed: positions,
     * the blocks' room and their number (session__grow_step()). */
    uint32_t share_entries, share_room, share_blocks;
    bool share_stale; /* a charged request failed: made exact when it settles */
    uint32_t forks_out; /* fork jobs out reading its slot: it is not released while > 0 */
};

/** Which timed list of the server a connection is on (conn->wait_link). */
typedef enum conn_wait {
    CONN_WAIT_NONE = 0,
    CONN_WAIT_QUIET,   /* server->quiet: nothing to do, closed after --conn-timeout */
    CONN_WAIT_LINGER,  /* server->linger: closed, its input discarded until `wait_until` */
    CONN_WAIT_DELIVER, /* server->deliver: past that, its send queue not empty yet */
} conn_wait_t;

/** A list of connections in the order their deadlines fall (loop thread). */
typedef TAILQ_HEAD(conn_list, conn) conn_list_t;

/** One session connection.  Allocated on accept; freed by conn__unref()
 * when both the handle's close callback has run and no job of the
 * connection is out (`refs`).  Once closed it no longer serves, but its
 * handle may stay open for a lingering close (on server->linger, then
 * server->deliver) until the peer's EOF or its deadline. */
struct conn {
    uv_tcp_t tcp;
    uv_write_t write_req;
    uv_shutdown_t shutdown_req; /* the lingering close's shutdown(SHUT_WR) */
    server_t *server;
    uint64_t serial;               /* pool owner key; never reused */
    uint64_t read_ns;              /* uv_hrtime() of the read being framed */
    worker_flow_t flow;            /* the workers' (worker.h): its jobs' fair share */
    unsigned refs;                 /* the handle until its close callback, plus one per job out */
    conn_t *prev, *next;           /* server->conns while open */
    conn_t *dirty_next;            /* server->dirty while `dirty` */
    TAILQ_ENTRY(conn) wait_link;   /* the server's list named by `wait` */
    uint64_t wait_until;           /* uv_now() deadline on that list */
    conn_wait_t wait;
    proto_framer_t framer;
    session_map_t map;              /* live ids -> session records */
    session_t *sessions;            /* every session record of the connection */
    req_t *order_head, *order_tail; /* requests not yet answered, in read order */
    req_t *barrier;                 /* stats, REQ_DEFER, REQ_BUILD: later lines are REQ_HELD */
    size_t outstanding;             /* records in the order FIFO */
    size_t held_bytes;              /* reply bytes of REQ_DONE records in the FIFO */
    req_t *park_head, *park_tail;   /* REQ_PARKED jobs, in read order */
    size_t reserved;                /* reply_bound of every job of the connection out */
    uint64_t pending_bytes;         /* need_bytes of its lines applied and not yet done */
    uint64_t pending_slots;         /* need_slots likewise */
    uint64_t next_seq;              /* seq of the next line read */
    size_t linger_bytes;            /* input discarded while lingering */
    uint64_t linger_hard;           /* uv_now() after which a lingering close waits no more */
    size_t drain_left;              /* a drain: input bytes still to read and answer (conn.c) */
    proto_buf_t out;                /* replies for the next write */
    proto_buf_t wbuf;               /* the bytes of the write in flight */
    uint64_t held_since;            /* uv_hrtime() `out` was first held back; 0 when not */
    metrics_release_t release_reason; /* set when closed */
    bool dirty;                       /* `out` has bytes to write at the end of this loop turn */
    bool reading;                     /* uv_read_start() in force */
    bool writing;                     /* write_req in flight */
    bool input_done;                  /* EOF, line_too_long or drain: close once all is answered */
    bool peer_eof;                    /* the peer's EOF was read: no input is left unread */
    bool line_too_long;               /* input ended by line_too_long: close lingering */
    bool closed;         /* no longer serving; lingering while wait is LINGER or DELIVER */
    bool handle_closing; /* uv_close() called */

    /* Its share of the pool (--max-sessions-per-connection,
     * --max-connection-share, session.c) and its auth (dispatch.c). */
    uint32_t share_sessions; /* its sessions in its map */
    uint64_t share_bytes;    /* the pool bytes they hold, or will once their requests run (at most) */
    uint64_t share_cap;      /* 1 + its bound in bytes, once session__share_cap() computed it */
    bool authed;             /* presented the --auth-token-file token, or a tenant's */
    tenant_t *tenant;        /* its tenant's (a reference, tenancy.c); NULL without a tenants file */

    /* Before it is served: its client's address, the PROXY header it
     * must begin with, its place among the connections in their handshake
     * (handshake.c writes these). */
    char peer[SERVER_PEER_MAX];       /* "ADDR:PORT" or "[ADDR]:PORT" of the client */
    proto_proxy_t *proxy;             /* owned while its PROXY header is awaited */
    TAILQ_ENTRY(conn) handshake_link; /* server->handshake while in_handshake */
    uint64_t handshake_until;         /* uv_now() deadline of --auth-timeout; 0 none */
    bool in_handshake;                /* awaits its PROXY header or its auth */
};

/** A preset the daemon may serve (models.c): its model from start, shape
 * and block plan only, its weights once built.  Loop thread, except as
 * models.c says while a build runs. */
typedef struct server_preset {
    model_t *model;     /* owned (models__free()); also in server->models[] */
    server_t *server;
    size_t index;       /* in the preset table (model_preset_name()), for metrics */
    uv_work_t work;     /* the build on libuv's thread pool, while `building` */
    bool building;      /* a build is under way */
    _Atomic bool ready; /* weights built: release by the builder, acquire by the loop */
    int build_rc;       /* the last build's result; written by the builder */
    uint64_t build_ns;  /* its duration; likewise */
} server_preset_t;

/** A model's measured times, for the cost of its jobs (jobcost.c): running
 * means in nanoseconds per position, written by the workers, read by the
 * loop as it submits. */
typedef struct job_costs {
    _Atomic uint64_t step_ns;    /* a step's, in a batch or alone */
    _Atomic uint64_t prefill_ns; /* a prompt position's (start, logits) */
    _Atomic uint16_t step1_code; /* worker_cost_code() of a step of n = 1; 0 until step_ns is */
    bool lone;                   /* its steps never batch (!model_batch_shares()); set at load */
} job_costs_t;

/** What conn.c (and models.c) call in the files above them, through
 * pointers so that the calls between the files of server/ go one way
 * (docs/design.md, "server/ layout").  Set by server_run(). */
typedef struct conn_hooks {
    proto_line_cb line;               /* dispatch.c: a line read; `arg` is the conn_t */
    proto_line_cb drain_line;         /* dispatch.c: a line read in a drain */
    void (*line_too_long)(conn_t *c); /* dispatch.c: answers it; the input ends */
    void (*detach)(conn_t *c);        /* session.c: a closing connection's requests, sessions */
    void (*freed)(server_t *s);       /* server.c: a connection struct was freed */
    /* dispatch.c, from models.c: a build of `m` ended with `rc`; the
     * request of `c` waiting for it (its barrier), if any, goes on. */
    void (*model_built)(conn_t *c, const model_t *m, int rc);
    /* handshake.c: a connection before it is served (handshake_int.h). */
    void (*accepted)(conn_t *c);                                 /* may close `c` */
    size_t (*preamble)(conn_t *c, const char *data, size_t len); /* while c->proxy is set */
    bool (*make_room)(server_t *s); /* at --max-connections: true if one made room */
    void (*closing)(conn_t *c);     /* `c` stops serving */
    void (*run_parked)(conn_t *c);  /* launch.c: submits the parked jobs the bound allows */
    void (*freeing)(conn_t *c);     /* tenancy.c: `c`'s struct is about to be freed */
} conn_hooks_t;

/** Replies server->replied holds before they are measured early. */
#define SERVER_REPLIED_MAX 256

/** The daemon.  One, owned by server_run(). */
struct server {
    const server_config_t *cfg;
    conn_hooks_t hooks;
    uv_loop_t loop;
    /* The session port's listening socket, accepted from by hand (server.c:
     * listen_cb) so that running out of descriptors is seen, counted and
     * paced; `reserve_fd` is a descriptor kept to accept and turn away a
     * connection then.  Both descriptors are the server's, closed by
     * server_finish() (the listening one at the start of a drain). */
    int listen_fd;             /* -1 when not open */
    uv_poll_t listen_poll;     /* initialised while listen_fd >= 0 */
    uv_timer_t accept_timer;   /* restarts listen_poll after a pause */
    int reserve_fd;            /* /dev/null, or -1 */
    uint64_t accept_warned_ms; /* uv_now() of the last warning about accept; 0 none */
    uint64_t accept_unwarned;  /* accept failures since that warning */
    uv_signal_t sigterm, sigint;
    uv_signal_t sighup; /* ignored with a log line (server.c: sighup_cb) */
#if SLOTD_FAULT_INJECTION
    uv_signal_t sigusr1; /* test builds: jobfault__release() */
#endif
    uv_timer_t idle_timer, shutdown_timer;
    uv_timer_t quiet_timer;  /* --conn-timeout: the oldest quiet connection */
    uv_timer_t linger_timer; /* the oldest lingering connection */
    uv_timer_t deliver_timer; /* polls `deliver` while it is not empty */
    conn_list_t quiet;       /* CONN_WAIT_QUIET, by deadline */
    conn_list_t linger;      /* CONN_WAIT_LINGER, by deadline */
    /* Connections awaiting a PROXY header or their auth, in accept order
     * (which is the order of their --auth-timeout deadlines), and the
     * timer of the first deadline (handshake.c). */
    conn_list_t handshake;
    uv_timer_t handshake_timer;
    conn_list_t deliver;     /* CONN_WAIT_DELIVER, in no order */
    uint64_t drain_deadline; /* uv_now() at which a drain overruns --shutdown-timeout */
    uv_check_t flush_check;  /* end of each loop turn: write, then submit the batch */
    uv_timer_t hold_timer;   /* a turn for output held back (conn__hold_output()) */
    uv_timer_t trim_timer;   /* gives free pool pages back to the kernel (cache_pool_trim()) */
    admin_t *admin;
    worker_pool_t *workers; /* NULL once closed */
    cache_pool_t *pool;     /* immutable pointer: workers read it */
    audit_t *audit;         /* immutable pointer; NULL when --audit-rate is 0 */
    model_t *models[CONFIG_MAX_MODELS]; /* every --models preset, built or not (models.c) */
    job_costs_t costs[MODEL_NPRESETS];    /* measured times by model_preset_index() (jobcost.c) */
    size_t nmodels;
    server_preset_t presets[CONFIG_MAX_MODELS]; /* the same, with their build state */
    const model_t *default_model;
    uint64_t start_ns; /* uv_hrtime() at start-up */

    worker_batch_t batch; /* jobs to submit at the end of this loop turn */
    conn_t *dirty;        /* connections to write at the end of this loop turn */
    /* The loop's clock for the wait and duration metrics, read at most
     * once or twice a turn (a clock reading costs about as much as a
     * histogram observation): `turn_ns`, the moment the turn's first read
     * saw input, stamps every line the turn reads (0: not read yet this
     * turn); the replies moved to output this turn wait in `replied`
     * until the turn's end (dispatch__observe_replies()) measures them
     * all with one reading. */
    uint64_t turn_ns;
    uint64_t replied_ns[SERVER_REPLIED_MAX];   /* their lines' read_ns */
    uint16_t replied_label[SERVER_REPLIED_MAX]; /* and (op, model): metrics_op_model() */
    size_t nreplied;
    conn_t *conns;        /* open connections */
    size_t nconns;        /* open connections */
    size_t nconns_alive;  /* connection structs not yet freed */
    size_t nsockets;      /* session sockets open, lingering ones included: --max-connections */
    uint64_t next_serial;
    size_t admitted;                /* session records in some connection's map */
    size_t live_sessions;           /* session records holding a slot */
    struct inspect_listing *listings; /* GET /sessions being gathered, in order (inspect.c) */
    TAILQ_HEAD(, session) lru;      /* idle sessions, oldest first (session.c) */
    /* --on-full (evict.c).  Loop thread. */
    bool keep_toks; /* sessions record their tokens (audit on, evict, or the prefix cache) */
    req_t *room_head, *room_tail;   /* REQ_ROOM requests, in the order they began to wait */
    uv_timer_t room_timer;          /* the first wait's end, or a retry once room freed */
    bool room_kick;                 /* room_timer is set to run waiting requests again */
    uint32_t room_kicks;            /* room freed since: waiting requests to run again */
    size_t evicted_sessions;        /* live sessions whose slot was evicted */
    uint64_t evictions_total;       /* sessions evicted since start */
    uint64_t evicted_token_bytes;   /* bytes of the recorded tokens of evicted sessions */
    req_t *free_reqs;
    size_t nfree_reqs;
    size_t free_reply_bytes; /* capacity of the reply buffers the free list keeps */
    session_t *free_sessions;
    size_t nfree_sessions;
    /* The fewest records each free list held since the last trim: those
     * sat unused all along, and the trim timer frees them. */
    size_t low_free_reqs, low_free_sessions;
    /* --tenants-file's tenants (tenancy.c), and its reloads. */
    tenant_t *tenants;                /* each holds a reference while listed */
    uint64_t tenant_keys;             /* keys handed out (tenancy_scope_key()) */
    uint64_t tenants_reloads;         /* reloads applied */
    uint64_t tenants_reload_failures; /* reloads refused: the file did not parse */
    bool draining;
    /* Set by the loop at the start of a drain: a job a worker has not begun
     * yet (a chain's next step, or one claimed just before the take-back)
     * is answered shutting_down instead of run (job.c). */
    _Atomic bool stop_jobs;
    bool finished; /* every handle closed or closing */

    char readbuf[SERVER_READ_BUF]; /* reads are synchronous on the loop: one buffer */
};

/** The loop clock of this turn's reads (server->turn_ns), read now if
 * this is the turn's first.  Loop thread. */
static inline uint64_t server__turn_ns(server_t *s)
{
    if (s->turn_ns == 0)
        s->turn_ns = uv_hrtime();
    return s->turn_ns;
}

#endif
