/*
 * itest.h: the helper library of the integration tests.
 *
 * The integration tests run the real daemon (the `slotd` executable named by
 * the SLOTD_BIN environment variable) on free loopback ports and talk to it
 * over TCP, as a client would.  This header gives them the few verbs they
 * need: start and stop a daemon, open a connection, send raw bytes, read one
 * reply line with a timeout, send a JSON request and get the reply parsed,
 * make an HTTP request to the admin port, run a program to completion, and
 * compute the uncached reference of a model with the library's
 * model_generate().
 *
 * Every wait is bounded.  A daemon started here belongs to the test process
 * that started it: it dies with that process (PR_SET_PDEATHSIG, and Check
 * kills the test's process group); itest_teardown(), the checked teardown of
 * every test case, stops it with SIGTERM and fails the test unless it exits
 * with status 0; and the unchecked teardown, run by the parent after the
 * forked test ended however it ended (a failed assertion leaves with _exit,
 * a timeout with SIGKILL), prints the log of any daemon the test did not
 * stop, makes sure it is gone and removes the temporary files.
 *
 * Functions that can only fail because the daemon misbehaved fail the
 * current test themselves (ck_assert), with the bytes involved in the
 * message; functions whose failure a test may want to observe return it.
 */
#ifndef SLOTD_TESTS_ITEST_H
#define SLOTD_TESTS_ITEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <check.h>
#include <cjson/cJSON.h>

#include "core/model.h"

/** How long a read waits for a reply before the test gives up (ms),
 * multiplied by itest_time_scale(). */
#define ITEST_REPLY_MS itest_scale_ms(10000)
/** How long a daemon gets to exit after SIGTERM before it is killed (ms),
 * multiplied by itest_time_scale(). */
#define ITEST_STOP_MS itest_scale_ms(15000)
/** The Check timeout of every integration test case (s); itest_add()
 * multiplies it by itest_time_scale(). */
#define ITEST_CASE_TIMEOUT 60

/* ---- Running under a wrapper (valgrind) ---- */

/** The factor of SLOTD_TIME_SCALE (a number >= 1; 1 when unset or not a
 * number): every wait of this library is multiplied by it, for a daemon
 * that runs slower than usual (under valgrind, 10 is about right). */
double itest_time_scale(void);
/** `ms` multiplied by itest_time_scale(). */
int itest_scale_ms(int ms);

/** True when SLOTD_WRAPPER is set.  Its words (split at white space, no
 * quoting) then go before the daemon's command line, as in
 * SLOTD_WRAPPER="valgrind -q --error-exitcode=99 --log-file=%q{SLOTD_ITEST_DIR}/valgrind.log".
 * The daemon is started with SLOTD_ITEST_DIR set to its own temporary
 * directory, and every file there besides its log (a valgrind log) is
 * printed with the log whenever the daemon's exit status is not 0, which
 * fails the test (itest_teardown(), or the test's own check). */
bool itest_wrapped(void);

/** SLOTD_TEST_REPEATS (scripts/test.sh sets 1 in the sanitizer and
 * valgrind stages): how many rounds of a check a case makes that it has
 * made once already, at most `all`; `all` when unset.  A value that is not
 * a positive number fails the test. */
int itest_repeats(int all);

/* ---- The daemon ---- */

/** A running (or exited) daemon.  Owned by the library from
 * itest_daemon_start() until itest_teardown() or process exit. */
typedef struct itest_daemon {
    pid_t pid;
    int port;       /* the session port */
    int admin_port; /* the admin (HTTP) port */
    char dir[256];  /* temporary directory holding the log */
    char log[320];  /* the daemon's stdout and stderr */
    bool reaped;    /* waitpid() has collected it */
    int status;     /* its wait status once reaped */
} itest_daemon_t;

/** Starts the daemon with `--listen 127.0.0.1 --port P --admin-port A`
 * followed by the given extra flags (a NULL-terminated list), and waits
 * (bounded) until both ports accept connections.  Fails the test if it
 * does not come up.  The result is valid until the test process ends. */
itest_daemon_t *itest_daemon_start(const char *flag, ...);
/** Same, with the extra flags as a NULL-terminated array (NULL for none). */
itest_daemon_t *itest_daemon_startv(const char *const *flags);

/** Gives the daemons this test process starts from now on an
 * RLIMIT_NOFILE (soft and hard) of `n`, set in the child before it runs
 * the daemon (or its wrapper); 0, the default, leaves them the test's own
 * limit.  For tests of running out of file descriptors. */
void itest_daemon_nofile(long n);

/** A loopback port that was free a moment ago (bind port 0, read it back,
 * close). */
int itest_free_port(void);

/** Sends `sig` to the daemon (unless it was reaped already). */
void itest_daemon_signal(itest_daemon_t *d, int sig);

/** Waits up to `timeout_ms` for the daemon to exit.  If it does not, kills
 * it with SIGKILL, prints its log and fails the test.  Returns its exit
 * status, or 128 + the signal number if a signal killed it. */
int itest_daemon_wait(itest_daemon_t *d, int timeout_ms);

/** SIGTERM, then itest_daemon_wait(d, ITEST_STOP_MS). */
int itest_daemon_stop(itest_daemon_t *d);

/** True while the daemon has not exited (reaps it if it has). */
bool itest_daemon_alive(itest_daemon_t *d);

/** The value of the unlabelled sample `name` in the daemon's GET /metrics,
 * or without one, the sum of its samples `name{...}` over every label;
 * fails the test if there is neither, or the value is negative. */
int64_t itest_metric(const itest_daemon_t *d, const char *name);

/** Waits until itest_metric(d, name) is at least `min`, polling; fails the
 * test if it is not within `timeout_ms` (multiplied by itest_time_scale()).
 * `name` may carry labels spelled as rendered: `slotd_x{op="step"}`.
 * Returns the value seen. */
int64_t itest_await_metric(const itest_daemon_t *d, const char *name, int64_t min, int timeout_ms);

/** Prints the daemon's log on stderr, framed, with `why` as a heading,
 * followed by any other log in its directory (a wrapper's). */
void itest_daemon_print_log(const itest_daemon_t *d, const char *why);

/** The daemon's resident memory (VmRSS of /proc/<pid>/status) in KiB, or
 * -1 if it cannot be read.  Under a wrapper this is the wrapper's. */
int64_t itest_daemon_rss_kib(const itest_daemon_t *d);

/** The checked teardown of every integration test case: stops every daemon
 * this test started that still runs and fails the test unless each exits
 * with status 0 (its log is printed if not); removes the temporary files. */
void itest_teardown(void);

/** Adds a test case `name` with function `fn`, the fixtures above and
 * ITEST_CASE_TIMEOUT to `s`.  Returns the case (owned by `s`), for
 * tcase_set_tags(): a stage leaves a tag out with CK_EXCLUDE_TAGS
 * (scripts/test.sh). */
TCase *itest_add(Suite *s, const char *name, const TTest *fn);
#define ITEST_ADD(suite, fn) itest_add((suite), #fn, fn)
/** Adds to `tc` the fixtures itest_add() gives a case (a directory per
 * case, itest_teardown() checked, the clean-up after a crash), for a
 * suite that makes its own test cases (tests/test_stages.c). */
void itest_fixtures(TCase *tc);
/** As itest_add(), with a Check timeout of `seconds` (multiplied by
 * itest_time_scale()) for a case that needs more than ITEST_CASE_TIMEOUT. */
TCase *itest_add_timeout(Suite *s, const char *name, const TTest *fn, int seconds);
#define ITEST_ADD_TIMEOUT(suite, fn, seconds) itest_add_timeout((suite), #fn, fn, (seconds))

/** Runs the suite (CK_ENV verbosity, fork mode from CK_FORK, default fork)
 * and returns the process exit code: 0 when every test passed. */
int itest_main(Suite *s);

/** CTest's code for a test that cannot run here (SKIP_RETURN_CODE). */
#define ITEST_SKIP 77
/** Whether this run is the part `part` of its suite: the cases that need
 * what this machine or build may lack, run as a CTest entry of their own
 * (`NAME PART`, tests/CMakeLists.txt's slotd_test_part()). */
bool itest_is_part(int argc, char **argv, const char *part);
/** Says on stderr that the part cannot run here, and why; returns
 * ITEST_SKIP, for main() to return, so that CTest counts it skipped. */
int itest_skip(const char *why);
/** Whether $SLOTD_BIN was built with the test-only fault hooks (its
 * --help names --fault-wedge-after).  Safe outside a test case. */
bool itest_fault_hooks(void);

/* ---- Connections ---- */

typedef struct itest_conn itest_conn_t;

/** What the last read or wait on a connection met. */
typedef enum itest_io {
    ITEST_IO_OK = 0,
    ITEST_IO_TIMEOUT,
    ITEST_IO_EOF,   /* orderly close by the peer */
    ITEST_IO_RESET, /* connection reset or another socket error */
} itest_io_t;

/** Connects to 127.0.0.1:`port`; NULL (and errno) if refused.  The result
 * is owned by the caller and freed by itest_close(). */
itest_conn_t *itest_try_connect(int port);
/** Connects to the daemon's session port; fails the test if refused. */
itest_conn_t *itest_connect(const itest_daemon_t *d);
/** Closes the socket (an orderly close) and frees `c`.  NULL is fine. */
void itest_close(itest_conn_t *c);
/** Closes with SO_LINGER 0, so the peer sees a reset, and frees `c`. */
void itest_close_reset(itest_conn_t *c);
/** Half-closes the sending side (shutdown SHUT_WR). */
void itest_shutdown_write(itest_conn_t *c);
int itest_conn_fd(const itest_conn_t *c);

/** Sends all `len` bytes, reading whatever the peer sends meanwhile into the
 * connection's buffer (so a large pipeline cannot deadlock).  Returns false
 * if the peer closed or reset, or after ITEST_REPLY_MS without progress. */
bool itest_send(itest_conn_t *c, const void *data, size_t len);
bool itest_send_str(itest_conn_t *c, const char *s);
bool itest_sendf(itest_conn_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/** Reads one line, waiting up to `timeout_ms`.  Returns it without its "\n"
 * (malloc, owned by the caller; *len gets its length if len is not NULL),
 * or NULL on timeout, close or error: see itest_last_io().  A "\r" or any
 * other byte is kept as received. */
char *itest_read_line(itest_conn_t *c, int timeout_ms, size_t *len);
itest_io_t itest_last_io(const itest_conn_t *c);
/** Bytes received and not yet returned as a line (a partial line). */
size_t itest_pending(const itest_conn_t *c);

/** Sends from `data` without reading anything, as a client that never reads
 * its replies: writes until all `len` bytes are out or the socket has
 * accepted nothing for `stall_ms` (the peer stopped reading and every
 * buffer between is full).  Returns the bytes sent; sets *stalled (if not
 * NULL) to whether it stopped on a stall; stops early, returning what was
 * sent, if the peer closed or reset. */
size_t itest_send_noread(itest_conn_t *c, const void *data, size_t len, int stall_ms,
                         bool *stalled);

/** Sets SO_RCVBUF and SO_SNDBUF of the connection's socket (0 leaves one
 * as it is), so that a client that does not read fills its buffers soon. */
void itest_conn_buffers(itest_conn_t *c, int rcvbuf, int sndbuf);

/** Connects to `d` with a 64 KiB send buffer and pipelines up to `n`
 * `stats` requests, each with a `pad` member of at least `pad` digits,
 * never reading, until the daemon stops reading it (asserted).  Returns
 * the connection; *read_lines gets how many of its requests the daemon had
 * read by then (from `requests_total`, asked on another connection). */
itest_conn_t *itest_stall_with_stats(itest_daemon_t *d, int n, int pad, int64_t *read_lines);

/** Waits up to `timeout_ms` for the peer to close.  Returns true if it
 * closed (or reset) with no further bytes; false if bytes came or it stayed
 * open.  Bytes received are kept. */
bool itest_expect_closed(itest_conn_t *c, int timeout_ms);

/** True if no byte at all arrives within `ms`. */
bool itest_expect_silence(itest_conn_t *c, int ms);

/** Sends the printf-formatted request followed by "\n", reads one reply line
 * and parses it; fails the test if no line comes or it is not a JSON
 * object.  Returns the parsed reply, owned by the caller (cJSON_Delete).
 * The raw reply line stays readable with itest_last_line() until the next
 * read on `c`. */
cJSON *itest_rpc(itest_conn_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** Reads one reply line (no send) and parses it, as itest_rpc(). */
cJSON *itest_read_reply(itest_conn_t *c);
/** The last line returned by itest_rpc() or itest_read_reply(). */
const char *itest_last_line(const itest_conn_t *c);

/* ---- Checking replies ---- */

/** Fails the test unless `reply` is an error reply: exactly one member
 * "error" (plus "tag" when `tag_json` is not NULL), an object with a string
 * "code" equal to `code` and a string "message" containing every one of the
 * NULL-terminated words that follow (a word of one or two characters, such
 * as the field `n` or an id "a", must stand as a word of its own).  `tag_json` is the tag as JSON
 * text
 * ("7", "\"x\"") that the reply must echo, or NULL for no tag. */
void itest_expect_error(const cJSON *reply, const char *tag_json, const char *code, ...);
/** The checks of itest_expect_error() without failing: true, or false with
 * the reason in `why`.  The words follow `size`, NULL-terminated. */
bool itest_error_is(const cJSON *reply, const char *tag_json, const char *code, char *why,
                    size_t size, ...);

/** Records a failed check and goes on, so that one run of a battery lists
 * every case that fails; itest_soft_verdict() (also run by the teardown)
 * then fails the test with all of them. */
void itest_soft_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void itest_soft_verdict(void);

/** Fails the test unless `reply` is not an error reply. */
void itest_expect_ok(const cJSON *reply);
/** True if `reply` is an error reply with code `code`. */
bool itest_is_error(const cJSON *reply, const char *code);
/** The error code of `reply`, or NULL if it is not an error reply. */
const char *itest_error_code(const cJSON *reply);
/** Fails the test unless `reply` echoes `tag_json` exactly (or has no
 * "tag" when `tag_json` is NULL). */
void itest_expect_tag(const cJSON *reply, const char *tag_json);

/** Member `name` of `obj` as an integer; fails the test unless it is
 * present, a number and integral.  `name` may be "released.idle". */
int64_t itest_int(const cJSON *obj, const char *name);
/** Member `name` as a string; fails the test unless present and a string. */
const char *itest_str(const cJSON *obj, const char *name);

/** Sends {"op":"stats"} and returns the reply, checked to be a stats object
 * naming every member of docs/protocol.md.  Owned by the caller. */
cJSON *itest_stats(itest_conn_t *c);
/** One stats figure (as itest_int()). */
int64_t itest_stat(itest_conn_t *c, const char *name);
/** Fails the test unless `st` has every stats member of docs/protocol.md, each a
 * non-negative integer, and the released object with its four reasons. */
void itest_check_stats_shape(const cJSON *st);

/** GET /stats on the admin port, checked as itest_check_stats_shape().
 * Owned by the caller (cJSON_Delete). */
cJSON *itest_admin_stats(const itest_daemon_t *d);

/** Polls stats on `c` every 10 ms until cache_entries, live_sessions and
 * pool_slots_used are all 0 (and pool_bytes_used too), for up to
 * `timeout_ms` (scaled); fails the test with the last stats line if they
 * are not.  Returns the last stats, owned by the caller. */
cJSON *itest_await_drained(itest_conn_t *c, int timeout_ms);

/** Raises the soft RLIMIT_NOFILE towards `want` (at most the hard limit)
 * and returns the soft limit in force afterwards.  Daemons started later
 * inherit it. */
long itest_raise_nofile(long want);

/** Collects the numbers of member `key` of the raw JSON line as printed (the
 * first occurrence of "key" in the line), in order, into `out` (up to `max`
 * strings of up to 63 characters).  Returns how many, or -1 if the member
 * is not there or the value is not a number or nested arrays of numbers. */
int itest_raw_numbers(const char *line, const char *key, char (*out)[64], int max);
/** True if `s` is printed as printf("%.6f") prints: -?digits.dddddd. */
bool itest_is_six_decimals(const char *s);

/** Fails the test unless the raw line's "logits" member holds exactly
 * `count` numbers (flattened), each printed as printf("%.6f") prints the
 * corresponding reference value. */
void itest_expect_logits(const char *line, const double *ref, size_t count);

/* ---- The admin port ---- */

typedef struct itest_http {
    int status;      /* 0 if no status line was read */
    char *head;      /* status line and headers, NUL-terminated */
    char *body;      /* NUL-terminated (the body may hold NULs: see body_len) */
    size_t body_len; /* bytes of body */
} itest_http_t;

/** Sends `len` raw bytes to 127.0.0.1:`port` on a new connection and reads
 * one response (Content-Length or until the peer closes), waiting up to
 * ITEST_REPLY_MS.  Returns false if nothing parsable came back.  *out is
 * filled in either case; free it with itest_http_free(). */
bool itest_http_raw(int port, const void *req, size_t len, itest_http_t *out);
/** GET `path` on the admin port with "Connection: close"; fails the test if
 * no response comes. */
void itest_http_get(const itest_daemon_t *d, const char *path, itest_http_t *out);
/** The value of header `name` (case-insensitive) into `buf`; false if absent. */
bool itest_http_header(const itest_http_t *r, const char *name, char *buf, size_t size);
void itest_http_free(itest_http_t *r);

/* ---- Other processes ---- */

/** Runs argv[0] (a path) with `input` (len bytes) on its stdin, collecting
 * stdout and stderr (malloc, NUL-terminated, owned by the caller; either
 * pointer may be NULL).  Waits up to `timeout_ms`, then kills it.  Returns
 * its exit status, 128 + signal if killed by one, or -1 on timeout. */
int itest_run(const char *const *argv, const void *input, size_t len, char **out, char **err,
              int timeout_ms);

/** The slotd executable (SLOTD_BIN); fails the test if unset. */
const char *itest_slotd_bin(void);

/* ---- The uncached reference ---- */

/** The library's model for `preset`, created once per process. */
const model_t *itest_model(const char *preset);

/** The uncached reference: model_generate(tokens, steps, use_cache=false).
 * `out_tokens` gets n + steps tokens, `logits` (may be NULL; ignored for
 * hash) steps * V rounded logits.  Fails the test if the call fails. */
void itest_reference(const char *preset, const int64_t *tokens, size_t n, int64_t steps,
                     uint32_t *out_tokens, double *logits);

/** The reference scores after `tokens` (model_logits(): V rounded logits). */
void itest_reference_logits(const char *preset, const int64_t *tokens, size_t n, double *logits);

/** A session as the test believes it to be: its model, prompt and the
 * steps taken so far.  A plain value. */
typedef struct itest_session {
    char id[80];
    const char *model; /* preset name */
    int64_t *prompt;   /* malloc, owned */
    size_t nprompt;
    size_t steps; /* greedy steps taken */
} itest_session_t;

void itest_session_init(itest_session_t *s, const char *id, const char *model,
                        const int64_t *prompt, size_t n);
void itest_session_free(itest_session_t *s);
/** Entries the session holds: prompt plus steps. */
size_t itest_session_entries(const itest_session_t *s);

/** Sends start for `s` (naming its model) and checks the reply. */
void itest_session_start(itest_conn_t *c, const itest_session_t *s);

/** Checks `reply` (raw line `line`) against the next `n` steps of `s`:
 * id, the tokens and the printed logits of the reference, and entries;
 * then counts the steps into `s`.  `tag_json` as for itest_expect_tag(). */
void itest_session_check_step(itest_session_t *s, const cJSON *reply, const char *line, uint32_t n,
                              const char *tag_json);

/** Sends step (n) for `s` and checks the reply as above. */
void itest_session_step(itest_conn_t *c, itest_session_t *s, uint32_t n);

/** Sends finish for `s` and checks released == its entries. */
void itest_session_finish(itest_conn_t *c, const itest_session_t *s);

/** A session checked against a reference computed once, up front, for up
 * to `max_steps` steps (itest_session_check_step() recomputes the reference
 * at every step, which is quadratic for long hash sessions).  Owns its
 * buffers; freed by itest_ref_free(). */
typedef struct itest_ref {
    char id[80];
    const char *model; /* preset name */
    int64_t *prompt;
    size_t nprompt;
    size_t max_steps;
    uint32_t *tokens; /* nprompt + max_steps: the uncached reference */
    double *logits;   /* max_steps * V (attn), NULL for hash */
    uint32_t vocab;
    size_t steps; /* steps taken so far */
} itest_ref_t;

void itest_ref_init(itest_ref_t *r, const char *id, const char *model, const int64_t *prompt,
                    size_t n, size_t max_steps);
/** As itest_ref_init(), for id `id`, with the model, prompt and reference
 * of `like` (copied; no recomputation), and no steps taken. */
void itest_ref_init_like(itest_ref_t *r, const char *id, const itest_ref_t *like);
void itest_ref_free(itest_ref_t *r);
/** Entries the session holds: prompt plus steps. */
size_t itest_ref_entries(const itest_ref_t *r);
/** The start request line of `r` (with "\n"), malloc'd, owned by the caller. */
char *itest_ref_start_line(const itest_ref_t *r);
/** True if `reply` (raw `line`) is the right start reply for `r`; otherwise
 * false with the reason in `why`. */
bool itest_ref_start_ok(const itest_ref_t *r, const cJSON *reply, const char *line, char *why,
                        size_t size);
/** True if `reply` (raw `line`) is the right reply to the next `n` steps of
 * `r`: id, no tag, the reference tokens, each logit printed as "%.6f"
 * prints the reference (attn) or no logits (hash), and entries; then
 * counts the steps into `r`.  Otherwise false with the reason in `why`,
 * and `r` unchanged. */
bool itest_ref_step_ok(itest_ref_t *r, const cJSON *reply, const char *line, uint32_t n, char *why,
                       size_t size);
/** Sends step n for `r`, reads the reply and fails the test unless
 * itest_ref_step_ok(). */
void itest_ref_step(itest_conn_t *c, itest_ref_t *r, uint32_t n);

/** Formats `n` tokens as a JSON array "[1,2,3]" into a malloc'd string. */
char *itest_json_tokens(const int64_t *tokens, size_t n);

/** Monotonic milliseconds. */
int64_t itest_now_ms(void);
void itest_sleep_ms(int ms);

/* ---- Sessions grown by steps, appends and forks ---- */

/** A session as the test believes it to be: its whole sequence (prompt,
 * picks and appended tokens, in order), checked at every step against the
 * uncached reference of that sequence.  A plain value. */
#define ITEST_SEQ_MAX 4096
typedef struct itest_seq {
    char id[80];
    const char *model; /* preset name */
    int64_t tok[ITEST_SEQ_MAX];
    size_t len;
} itest_seq_t;

/** A deterministic token of `model` in [0, V), the k-th of a test. */
int64_t itest_seq_token(const char *model, size_t k);
/** Starts `s` as session `id` of `model` with a prompt of `n` tokens
 * (itest_seq_token(model, 7..)) and checks the reply. */
void itest_seq_start(itest_conn_t *c, itest_seq_t *s, const char *id, const char *model, size_t n);
/** The append line of `n` tokens itest_seq_token(k0..), malloc'd (with
 * "\n"); the tokens go to `out`. */
char *itest_seq_append_line(const itest_seq_t *s, size_t n, size_t k0, int64_t *out);
/** Checks an append reply of the `n` tokens `toks` (id, entries, 0 <=
 * cached <= n) and counts them into `s`. */
void itest_seq_check_append(itest_seq_t *s, const cJSON *r, const int64_t *toks, size_t n);
/** Sends an append of `n` tokens from k0 on and checks the reply. */
void itest_seq_append(itest_conn_t *c, itest_seq_t *s, size_t n, size_t k0);
/** Checks a step reply of `n` picks (raw `line`) against the reference:
 * id, tokens, printed logits (attn), entries; counts the picks into `s`. */
void itest_seq_check_step(itest_seq_t *s, const cJSON *r, const char *line, uint32_t n);
/** Sends step n for `s` and checks the reply. */
void itest_seq_step(itest_conn_t *c, itest_seq_t *s, uint32_t n);

#endif
