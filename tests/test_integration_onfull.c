/*
 * test_integration_onfull.c: the real daemon when its pool is full, under
 * each --on-full policy (docs/protocol.md, "When the pool is full").
 *
 * The pool is 2 MiB of `small` sessions of 90 entries (4 KiB an entry),
 * which holds five of them.  refuse (the default) answers the sixth start
 * cache_full and evicts nothing.  evict lets every start in, evicts the
 * least recently used idle sessions, and every step of an evicted session
 * (rebuilt first) is the uncached reference, bit for bit: each reply is
 * checked against model_generate(use_cache = false), computed here.  An
 * append to an evicted session likewise, and a fork of one (started from
 * its tokens: cached is what the prefix cache still kept); a rebuild
 * computes only what the cache does not keep.  wait holds a request until a
 * finish makes room (and it then succeeds, the line sent after it
 * answered after it), answers it cache_full once
 * --full-wait-ms has passed and not before, and a drain answers it
 * shutting_down.  Seven starts and their steps on one connection get the
 * same replies pipelined in one write as sent one at a time, none refused.
 * A connection over its equal part of the pool makes room from its own
 * sessions, not from a connection under it.  Evicted sessions are released by a disconnect and by
 * the idle timeout like any other, and the counters come back to 0.
 *
 * The part "faults" (a CTest entry of its own, skipped in builds without
 * the fault hooks) holds one session's step in flight with
 * --fault-wedge-after while other clients need room: it must not be
 * evicted, and its step, once released, is the reference.
 */
#define _GNU_SOURCE /* asprintf */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "itest.h"

#define PROMPT 90
#define NSESS 8
#define STEPS 4

static void make_prompt(int64_t *p, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (int64_t)(x % 512); /* small's V */
    }
}

static itest_daemon_t *start_daemon(const char *on_full, const char *extra, const char *value)
{
    return itest_daemon_start("--cache-mb", "2", "--models", "small", "--preload", "small",
                              "--max-connection-share", "1", "--threads", "2", "--on-full", on_full,
                              extra, value, NULL);
}

/* A reference session `id` of `small`, on a prompt of PROMPT tokens made
 * from `seed`, for `steps` steps. */
static void ref_init_seeded(itest_ref_t *ref, const char *id, uint64_t seed, size_t steps)
{
    int64_t p[PROMPT];

    make_prompt(p, PROMPT, seed);
    itest_ref_init(ref, id, "small", p, PROMPT, steps);
}

/* Sends the start of `ref` on `c`; *sent_at (if not NULL) is when. */
static void send_start(itest_conn_t *c, const itest_ref_t *ref, int64_t *sent_at)
{
    char *line = itest_ref_start_line(ref);
    if (sent_at != NULL)
        *sent_at = itest_now_ms();
    ck_assert(itest_send_str(c, line));
    free(line);
}

/* Sends the start of `ref` on `c` and returns its reply. */
static cJSON *start_ref(itest_conn_t *c, const itest_ref_t *ref)
{
    send_start(c, ref, NULL);
    return itest_read_reply(c);
}

static void start_ok(itest_conn_t *c, const itest_ref_t *ref)
{
    char why[256];
    cJSON *r = start_ref(c, ref);
    ck_assert_msg(itest_ref_start_ok(ref, r, itest_last_line(c), why, sizeof(why)), "%s", why);
    cJSON_Delete(r);
}

/* NSESS connections, one session of PROMPT tokens each. */
typedef struct fleet {
    itest_conn_t *c[NSESS];
    itest_ref_t ref[NSESS];
} fleet_t;

static void fleet_init(fleet_t *f, itest_daemon_t *d)
{
    for (int i = 0; i < NSESS; i++) {
        f->c[i] = itest_connect(d);
        ref_init_seeded(&f->ref[i], "s", (uint64_t)i + 1, 16);
    }
}

/* Every session of the fleet started, each a success. */
static void fleet_start(fleet_t *f)
{
    for (int i = 0; i < NSESS; i++)
        start_ok(f->c[i], &f->ref[i]);
}

/* `n` sessions PREFIX0 .. on `c`, seeded from `seed`, each started: a
 * success. */
static void start_many(itest_conn_t *c, itest_ref_t *refs, int n, const char *prefix, uint64_t seed,
                       size_t steps)
{
    for (int i = 0; i < n; i++) {
        char id[16];
        snprintf(id, sizeof(id), "%s%d", prefix, i);
        ref_init_seeded(&refs[i], id, (uint64_t)i + seed, steps);
        start_ok(c, &refs[i]);
    }
}

static void fleet_free(fleet_t *f)
{
    for (int i = 0; i < NSESS; i++) {
        itest_ref_free(&f->ref[i]);
        itest_close(f->c[i]);
    }
}

START_TEST(test_refuse_by_default)
{
    itest_daemon_t *d = itest_daemon_start("--cache-mb", "2", "--models", "small", "--preload",
                                           "small", "--max-connection-share", "1", NULL);
    fleet_t f;
    int ok = 0, full = 0;

    fleet_init(&f, d);
    for (int i = 0; i < NSESS; i++) {
        cJSON *r = start_ref(f.c[i], &f.ref[i]);
        if (itest_is_error(r, "cache_full"))
            full++;
        else
            ok++;
        cJSON_Delete(r);
    }
    ck_assert_int_eq(ok, 5);
    ck_assert_int_eq(full, NSESS - 5);
    ck_assert_int_eq(itest_stat(f.c[0], "evictions_total"), 0);
    ck_assert_int_eq(itest_stat(f.c[0], "evicted_sessions"), 0);
    ck_assert_int_eq(itest_stat(f.c[0], "live_sessions"), 5);
    fleet_free(&f);
}
END_TEST

START_TEST(test_evict_every_step_exact)
{
    itest_daemon_t *d = start_daemon("evict", NULL, NULL);
    fleet_t f;
    int64_t evicted, live;

    fleet_init(&f, d);
    fleet_start(&f);
    evicted = itest_stat(f.c[0], "evicted_sessions");
    live = itest_stat(f.c[0], "live_sessions");
    ck_assert_int_eq(live, NSESS);
    ck_assert_int_ge(evicted, NSESS - 5);
    ck_assert_int_ge(itest_stat(f.c[0], "evictions_total"), evicted);
    /* An evicted session holds no entry of the pool. */
    ck_assert_int_eq(itest_stat(f.c[0], "cache_entries"), PROMPT * (NSESS - evicted));
    /* GET /sessions lists them, holding no pool bytes. */
    {
        itest_http_t h;
        itest_http_get(d, "/sessions", &h);
        ck_assert_int_eq(h.status, 200);
        ck_assert_msg(strstr(h.body, "\"pool_bytes\":0,") != NULL &&
                          strstr(h.body, "\"state\":\"evicted\"") != NULL,
                      "no evicted session in %s", h.body);
        itest_http_free(&h);
    }

    /* Round after round, each session's step finds it evicted (the
     * oldest idle ones go first) and rebuilds it: every reply is the
     * uncached reference. */
    /* SLOTD_TEST_REPEATS=1 (the sanitizer and valgrind stages): one
     * round of single steps, then the last round's double steps; plain
     * runs all STEPS. */
    int rounds = 1 + itest_repeats(STEPS - 1);
    for (int round = 0; round < rounds; round++)
        for (int i = 0; i < NSESS; i++)
            itest_ref_step(f.c[i], &f.ref[i], round == rounds - 1 ? 2 : 1);
    ck_assert_int_ge(itest_stat(f.c[0], "rebuilt_entries_total"), PROMPT);
    ck_assert_int_ge(itest_metric(d, "slotd_evictions_total"), NSESS);
    ck_assert_int_ge(itest_metric(d, "slotd_rebuilt_entries_total"), PROMPT);

    /* Finishing every session, evicted or not, empties the pool. */
    for (int i = 0; i < NSESS; i++) {
        cJSON *r = itest_rpc(f.c[i], "{\"op\":\"finish\",\"id\":\"s\"}");
        ck_assert_int_eq(itest_int(r, "released"), (int64_t)itest_ref_entries(&f.ref[i]));
        cJSON_Delete(r);
    }
    ck_assert_int_eq(itest_stat(f.c[0], "live_sessions"), 0);
    ck_assert_int_eq(itest_stat(f.c[0], "evicted_sessions"), 0);
    ck_assert_int_eq(itest_stat(f.c[0], "pool_bytes_used"), 0);
    ck_assert_int_eq(itest_metric(d, "slotd_evicted_token_bytes"), 0);
    fleet_free(&f);
}
END_TEST

START_TEST(test_evict_append_exact)
{
    itest_daemon_t *d = start_daemon("evict", NULL, NULL);
    itest_conn_t *a = itest_connect(d);
    itest_seq_t *s = malloc(sizeof(*s));
    fleet_t f;

    ck_assert_ptr_nonnull(s);
    itest_seq_start(a, s, "a", "small", PROMPT);
    itest_seq_step(a, s, 1);
    /* Others fill the pool: "a", the least recently used, goes first. */
    fleet_init(&f, d);
    fleet_start(&f);
    ck_assert_int_ge(itest_stat(a, "evicted_sessions"), 1);
    itest_seq_append(a, s, 5, 1000);
    itest_seq_step(a, s, 2);
    /* Evicted again by more starts, and continued again. */
    for (int i = 0; i < NSESS; i++)
        itest_ref_step(f.c[i], &f.ref[i], 1);
    itest_seq_step(a, s, 1);
    itest_seq_append(a, s, 3, 2000);
    itest_seq_step(a, s, 1);

    /* A fork of "a" while it is evicted: the new session starts from a's
     * tokens (nothing copied: cached counts only what the prefix cache
     * still kept, the rest is rebuilt), and both go on exact. */
    for (int i = 0; i < NSESS; i++)
        itest_ref_step(f.c[i], &f.ref[i], 1);
    {
        char want[128];
        itest_http_t h;
        snprintf(want, sizeof(want),
                 "\"id\":\"a\",\"model\":\"small\",\"entries\":%zu,\"pool_bytes\":0,", s->len);
        itest_http_get(d, "/sessions", &h);
        ck_assert_msg(strstr(h.body, want) != NULL, "'a' not evicted: %s", h.body);
        itest_http_free(&h);
    }
    itest_seq_t *b = malloc(sizeof(*b));
    ck_assert_ptr_nonnull(b);
    memcpy(b, s, sizeof(*b));
    snprintf(b->id, sizeof(b->id), "b");
    int64_t rebuilt0 = itest_stat(a, "rebuilt_entries_total");
    cJSON *r = itest_rpc(a, "{\"op\":\"fork\",\"id\":\"b\",\"from\":\"a\"}");
    ck_assert_int_eq(itest_int(r, "entries"), (int64_t)s->len);
    ck_assert_int_eq(itest_int(r, "cached") + itest_stat(a, "rebuilt_entries_total") - rebuilt0,
                     (int64_t)s->len);
    cJSON_Delete(r);
    itest_seq_step(a, b, 2);
    itest_seq_step(a, s, 1);
    itest_seq_step(a, b, 1);
    free(b);
    free(s);
    fleet_free(&f);
    itest_close(a);
}
END_TEST

START_TEST(test_evicted_released_like_others)
{
    /* Long enough for the starts to finish before any session idles out,
     * under valgrind too. */
    int idle_s = (int)(2 * itest_time_scale());
    char idle[16];
    snprintf(idle, sizeof(idle), "%d", idle_s);
    itest_daemon_t *d = start_daemon("evict", "--idle-timeout", idle);
    fleet_t f;
    itest_conn_t *w;
    int64_t evicted, until;

    fleet_init(&f, d);
    fleet_start(&f);
    evicted = itest_stat(f.c[NSESS - 1], "evicted_sessions");
    ck_assert_int_ge(evicted, 1);
    /* The first sessions started are the ones evicted: close their
     * connections. */
    for (int i = 0; i < evicted; i++) {
        itest_close(f.c[i]);
        f.c[i] = NULL;
    }
    w = itest_connect(d);
    until = itest_now_ms() + itest_scale_ms(2000);
    while (itest_stat(w, "live_sessions") != NSESS - evicted && itest_now_ms() < until)
        itest_sleep_ms(20);
    ck_assert_int_eq(itest_stat(w, "live_sessions"), NSESS - evicted);
    ck_assert_int_eq(itest_stat(w, "evicted_sessions"), 0);
    /* The rest go idle. */
    until = itest_now_ms() + (idle_s + 5) * 1000;
    while (itest_stat(w, "live_sessions") != 0 && itest_now_ms() < until)
        itest_sleep_ms(20);
    ck_assert_int_eq(itest_stat(w, "live_sessions"), 0);
    ck_assert_int_eq(itest_stat(w, "pool_bytes_used"), 0);
    for (int i = 0; i < NSESS; i++) {
        itest_ref_free(&f.ref[i]);
        if (f.c[i] != NULL)
            itest_close(f.c[i]);
    }
    itest_close(w);
}
END_TEST

START_TEST(test_evict_fair_between_connections)
{
    itest_daemon_t *d = start_daemon("evict", NULL, NULL);
    itest_conn_t *a = itest_connect(d), *b = itest_connect(d);
    itest_ref_t rb, ra[6];
    itest_http_t h;
    char want[128];

    /* b's one session, the least recently used of all, holds less than an
     * equal part of the pool (2 MiB over 2 connections); a, which holds
     * more, makes its room from its own sessions, never from b's. */
    ref_init_seeded(&rb, "b", 99, 2);
    start_ok(b, &rb);
    start_many(a, ra, 6, "a", 200, 2);
    ck_assert_int_ge(itest_stat(a, "evicted_sessions"), 1);
    itest_http_get(d, "/sessions", &h);
    snprintf(want, sizeof(want),
             "\"id\":\"b\",\"model\":\"small\",\"entries\":%d,\"pool_bytes\":0,", PROMPT);
    ck_assert_msg(strstr(h.body, want) == NULL, "b's session was evicted: %s", h.body);
    itest_http_free(&h);
    /* a's evicted sessions come back exact, and so does b. */
    for (int i = 0; i < 6; i++) {
        itest_ref_step(a, &ra[i], 1);
        itest_ref_free(&ra[i]);
    }
    itest_ref_step(b, &rb, 1);
    itest_ref_free(&rb);
    itest_close(a);
    itest_close(b);
}
END_TEST

/* Five sessions of PROMPT on `a`: the pool is full, and checked to be:
 * what is left of it holds less than one more such session, so that the
 * next start of PROMPT cannot find room (four would leave room for a
 * fifth, and the wait tests would then prove nothing). */
static void fill(itest_conn_t *a)
{
    itest_ref_t refs[5];
    int64_t used, total;
    cJSON *st;

    start_many(a, refs, 5, "f", 100, 1);
    for (int i = 0; i < 5; i++)
        itest_ref_free(&refs[i]);
    st = itest_stats(a);
    used = itest_int(st, "pool_bytes_used");
    total = itest_int(st, "pool_bytes_total");
    ck_assert_msg(itest_int(st, "live_sessions") == 5 && total - used < used / 5,
                  "setup: the pool is not full: %lld of %lld bytes used by %lld sessions of %d "
                  "entries",
                  (long long)used, (long long)total, (long long)itest_int(st, "live_sessions"),
                  PROMPT);
    cJSON_Delete(st);
}

/* The wait tests' scene: under --on-full wait with --full-wait-ms
 * `wait_ms`, `a` fills the pool and `b` sends the start of `ref`, a
 * session "b" of `steps` steps, at `sent_at`. */
typedef struct waiting {
    itest_daemon_t *d;
    itest_conn_t *a, *b;
    itest_ref_t ref;
    int64_t sent_at;
} waiting_t;

static void waiting_begin(waiting_t *w, const char *wait_ms, size_t steps)
{
    w->d = start_daemon("wait", "--full-wait-ms", wait_ms);
    w->a = itest_connect(w->d);
    w->b = itest_connect(w->d);
    fill(w->a);
    ref_init_seeded(&w->ref, "b", 7, steps);
    send_start(w->b, &w->ref, &w->sent_at);
}

static void waiting_end(waiting_t *w)
{
    itest_ref_free(&w->ref);
    itest_close(w->a);
    itest_close(w->b);
}

START_TEST(test_wait_until_room_frees)
{
    waiting_t w;
    char why[256];
    cJSON *r;

    waiting_begin(&w, "20000", 2);
    itest_daemon_t *d = w.d;
    itest_conn_t *a = w.a, *b = w.b;
    /* The line after it, sent at once, is answered after it. */
    ck_assert(itest_send_str(b, "{\"op\":\"stats\"}\n"));
    /* No room: it waits, unanswered. */
    ck_assert_msg(itest_expect_silence(b, 500), "answered before room freed: %s",
                  itest_last_line(b));
    ck_assert_int_ge(itest_metric(d, "slotd_room_waits_total"), 1);
    r = itest_rpc(a, "{\"op\":\"finish\",\"id\":\"f0\"}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_read_reply(b);
    ck_assert_msg(itest_ref_start_ok(&w.ref, r, itest_last_line(b), why, sizeof(why)), "%s", why);
    cJSON_Delete(r);
    r = itest_read_reply(b);
    ck_assert_int_eq(itest_int(r, "live_sessions"), 5);
    ck_assert_int_eq(itest_int(r, "cache_entries"), 5 * PROMPT);
    cJSON_Delete(r);
    itest_ref_step(b, &w.ref, 2);
    ck_assert_int_eq(itest_stat(b, "evictions_total"), 0);
    waiting_end(&w);
}
END_TEST

START_TEST(test_wait_times_out)
{
    waiting_t w;
    int64_t took;
    cJSON *r;

    waiting_begin(&w, "600", 1);
    itest_conn_t *b = w.b;
    r = itest_read_reply(b);
    took = itest_now_ms() - w.sent_at;
    itest_expect_error(r, NULL, "cache_full", NULL);
    ck_assert_msg(took >= 600, "refused after %lld ms, before --full-wait-ms 600", (long long)took);
    cJSON_Delete(r);
    /* Its connection serves on; the lines after it kept their order. */
    r = itest_rpc(b, "{\"op\":\"stats\"}");
    ck_assert_int_eq(itest_int(r, "live_sessions"), 5);
    cJSON_Delete(r);
    ck_assert_int_ge(itest_metric(w.d, "slotd_room_wait_seconds_count"), 1);
    waiting_end(&w);
}
END_TEST

START_TEST(test_wait_drain_answers)
{
    waiting_t w;
    cJSON *r;

    waiting_begin(&w, "60000", 1);
    ck_assert(itest_expect_silence(w.b, 300));
    itest_daemon_signal(w.d, SIGTERM);
    r = itest_read_reply(w.b);
    itest_expect_error(r, NULL, "shutting_down", NULL);
    cJSON_Delete(r);
    ck_assert_int_eq(itest_daemon_wait(w.d, ITEST_STOP_MS), 0);
    waiting_end(&w);
}
END_TEST

/* The lines of test_evict_pipelined_as_one_at_a_time(): seven starts on
 * one connection (five fit), then steps of each, then steps again. */
#define PIPE_LINES (NSESS - 1) * 3

static void pipe_lines(char **v)
{
    int k = 0;
    for (int i = 0; i < NSESS - 1; i++) {
        int64_t p[PROMPT];
        char *toks;
        make_prompt(p, PROMPT, (uint64_t)i + 50);
        toks = itest_json_tokens(p, PROMPT);
        ck_assert_int_ge(
            asprintf(&v[k++], "{\"op\":\"start\",\"id\":\"p%d\",\"prompt\":%s}\n", i, toks), 0);
        free(toks);
    }
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < NSESS - 1; i++)
            ck_assert_int_ge(
                asprintf(&v[k++], "{\"op\":\"step\",\"id\":\"p%d\",\"n\":%d}\n", i, round + 1), 0);
    ck_assert_int_eq(k, PIPE_LINES);
}

static void pipe_run(char **v, bool pipelined, char **out)
{
    itest_daemon_t *d = start_daemon("evict", NULL, NULL);
    itest_conn_t *c = itest_connect(d);

    for (int i = 0; pipelined && i < PIPE_LINES; i++)
        ck_assert(itest_send_str(c, v[i]));
    for (int i = 0; i < PIPE_LINES; i++) {
        if (!pipelined)
            ck_assert(itest_send_str(c, v[i]));
        out[i] = itest_read_line(c, ITEST_REPLY_MS, NULL);
        ck_assert_msg(out[i] != NULL, "line %d: no reply", i);
    }
    itest_close(c);
    ck_assert_int_eq(itest_daemon_stop(d), 0);
}

START_TEST(test_evict_pipelined_as_one_at_a_time)
{
    char *v[PIPE_LINES], *one[PIPE_LINES], *pipe[PIPE_LINES];

    pipe_lines(v);
    pipe_run(v, false, one);
    pipe_run(v, true, pipe);
    for (int i = 0; i < PIPE_LINES; i++) {
        ck_assert_msg(strstr(one[i], "\"error\"") == NULL, "line %d refused: %s", i, one[i]);
        ck_assert_msg(strcmp(one[i], pipe[i]) == 0,
                      "line %d: %s\n one at a time: %.200s\n pipelined: %.200s", i, v[i], one[i],
                      pipe[i]);
        free(v[i]);
        free(one[i]);
        free(pipe[i]);
    }
}
END_TEST

/* ---- Part "faults" ---- */

START_TEST(test_evict_never_in_flight)
{
    /* Job 1 is a's start, job 2 its step, held by a worker. */
    itest_daemon_t *d = start_daemon("evict", "--fault-wedge-after", "2");
    itest_conn_t *a = itest_connect(d), *b = itest_connect(d), *idle[8];
    itest_ref_t ref, others[6];
    char why[256];
    cJSON *r;

    /* Open connections holding nothing make a's fair share of the pool
     * (2 MiB over 10) less than its session: a would be the first victim,
     * least recently used and over its share, were it not in flight. */
    for (int i = 0; i < 8; i++)
        idle[i] = itest_connect(d);

    ref_init_seeded(&ref, "a", 42, 2);
    start_ok(a, &ref);
    ck_assert(itest_send_str(a, "{\"op\":\"step\",\"id\":\"a\"}\n"));
    ck_assert(itest_expect_silence(a, 200));
    /* b needs more room than a leaves: it may evict only its own idle
     * sessions, never a. */
    start_many(b, others, 6, "b", 7, 1);
    ck_assert_int_ge(itest_stat(b, "evictions_total"), 1);
    itest_daemon_signal(d, SIGUSR1);
    r = itest_read_reply(a);
    ck_assert_msg(itest_ref_step_ok(&ref, r, itest_last_line(a), 1, why, sizeof(why)), "%s", why);
    cJSON_Delete(r);
    itest_ref_step(a, &ref, 1);
    /* b's evicted sessions come back exact. */
    for (int i = 0; i < 6; i++) {
        itest_ref_step(b, &others[i], 1);
        itest_ref_free(&others[i]);
    }
    itest_ref_free(&ref);
    itest_close(a);
    itest_close(b);
    for (int i = 0; i < 8; i++)
        itest_close(idle[i]);
}
END_TEST

START_TEST(test_evict_rebuild_reuses_shared)
{
    /* "a" and "b" hold one prompt, b's start reusing a's full blocks.
     * Short sessions then fill the pool; on one connection the least
     * recently used idle session goes first: "a", whose shared blocks "b"
     * still holds.  a's rebuild is a cached start of its sequence: it
     * computes only what the cache keeps (the entries rebuilt are PROMPT
     * less b's cached), and its steps, and b's after it, are exact. */
    enum { SHORT = 8, MAXSHORT = 64 };
    itest_daemon_t *d = start_daemon("evict", NULL, NULL);
    itest_conn_t *c = itest_connect(d);
    itest_ref_t a, b, *more = calloc(MAXSHORT, sizeof(*more));
    int64_t cached, rebuilt0;
    int n = 0;

    ck_assert_ptr_nonnull(more);
    ref_init_seeded(&a, "a", 100, 4);
    ref_init_seeded(&b, "b", 100, 4);
    start_ok(c, &a);
    {
        cJSON *r = start_ref(c, &b);
        cached = itest_int(r, "cached");
        cJSON_Delete(r);
    }
    ck_assert_msg(cached > 0 && cached < PROMPT, "b reused %lld of a's entries", (long long)cached);
    itest_ref_step(c, &b, 1); /* b more recent than a */
    while (itest_stat(c, "evicted_sessions") == 0) {
        char id[16];
        int64_t p[SHORT];
        ck_assert_int_lt(n, MAXSHORT);
        snprintf(id, sizeof(id), "m%d", n);
        make_prompt(p, SHORT, (uint64_t)n + 200);
        itest_ref_init(&more[n], id, "small", p, SHORT, 4);
        start_ok(c, &more[n]);
        n++;
    }
    {
        char want[128];
        itest_http_t h;
        snprintf(want, sizeof(want),
                 "\"id\":\"a\",\"model\":\"small\",\"entries\":%d,\"pool_bytes\":0,", PROMPT);
        itest_http_get(d, "/sessions", &h);
        ck_assert_msg(strstr(h.body, want) != NULL, "'a' not evicted: %s", h.body);
        itest_http_free(&h);
    }
    rebuilt0 = itest_stat(c, "rebuilt_entries_total");
    itest_ref_step(c, &a, 2);
    ck_assert_int_eq(itest_stat(c, "rebuilt_entries_total") - rebuilt0, PROMPT - cached);
    itest_ref_step(c, &b, 1);
    itest_ref_step(c, &a, 1);
    for (int i = 0; i < n; i++)
        itest_ref_free(&more[i]);
    free(more);
    itest_ref_free(&a);
    itest_ref_free(&b);
    itest_close(c);
}
END_TEST

int main(int argc, char **argv)
{
    if (itest_is_part(argc, argv, "faults") && !itest_fault_hooks())
        return itest_skip("slotd built without the fault hooks (the plain stage has them)");
    Suite *s = suite_create("integration_onfull");

    if (itest_is_part(argc, argv, "faults")) {
        ITEST_ADD(s, test_evict_never_in_flight);
        return itest_main(s);
    }
    ITEST_ADD(s, test_refuse_by_default);
    ITEST_ADD(s, test_evict_every_step_exact);
    ITEST_ADD(s, test_evict_append_exact);
    ITEST_ADD(s, test_evict_rebuild_reuses_shared);
    ITEST_ADD(s, test_evict_pipelined_as_one_at_a_time);
    ITEST_ADD(s, test_evict_fair_between_connections);
    ITEST_ADD(s, test_evicted_released_like_others);
    ITEST_ADD(s, test_wait_until_room_frees);
    ITEST_ADD(s, test_wait_times_out);
    ITEST_ADD(s, test_wait_drain_answers);
    return itest_main(s);
}
