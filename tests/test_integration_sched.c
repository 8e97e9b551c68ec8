/*
 * test_integration_sched.c: the fair worker queue through the real daemon
 * (docs/design.md, "Scheduler").
 *
 * The noisy neighbour: one connection floods the daemon with `base` steps
 * (64 sessions, 4 steps each, all pipelined), and a thread reads its
 * replies as they come, counting them.  A light client on another
 * connection then runs a `tiny` session, start, 5 steps and finish, one
 * request at a time.  With one worker and one job queue for everyone,
 * each light request would wait behind the 64 steps queued ahead of it,
 * and the flood would be over before the light session; with fair flows
 * each waits about one batch.  The test asserts on counts only: when the
 * light client has its last reply, fewer than half of the flood's replies
 * have come.  The same with the flood as one session's 256 pipelined steps.
 *
 * Coalesced runs: one session's pipelined steps run as one job (a chain),
 * replies leaving one by one, with disconnects, drains, finish,
 * cache_full and context_full in the middle; two sessions' chains run as
 * one batch in rounds, each reply still the reference's.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "itest.h"

#define FLOOD_SESSIONS 64
#define FLOOD_STEPS 4
#define FLOOD_TOTAL (FLOOD_SESSIONS * FLOOD_STEPS)
#define DEEP_STEPS 256

/* A reader of the flood's replies, on a thread of its own. */
typedef struct flood {
    itest_conn_t *c;
    int expect;
    _Atomic int got;    /* replies read */
    _Atomic int errors; /* of them, error replies */
    pthread_t thread;
} flood_t;

static void *flood_read(void *arg)
{
    flood_t *f = arg;

    while (atomic_load(&f->got) < f->expect) {
        char *line = itest_read_line(f->c, itest_scale_ms(ITEST_REPLY_MS), NULL);
        if (line == NULL)
            break;
        if (strncmp(line, "{\"error\"", 8) == 0)
            atomic_fetch_add(&f->errors, 1);
        atomic_fetch_add(&f->got, 1);
        free(line);
    }
    return NULL;
}

/* Sends `lines` on f->c (one write), then reads the replies on a thread. */
static void flood_begin(flood_t *f, const char *lines, int expect)
{
    f->expect = expect;
    atomic_store(&f->got, 0);
    atomic_store(&f->errors, 0);
    ck_assert(itest_send_str(f->c, lines));
    ck_assert_int_eq(pthread_create(&f->thread, NULL, flood_read, f), 0);
}

/* Waits for every reply of the flood; none is an error. */
static void flood_end(flood_t *f)
{
    ck_assert_int_eq(pthread_join(f->thread, NULL), 0);
    ck_assert_int_eq(atomic_load(&f->got), f->expect);
    ck_assert_int_eq(atomic_load(&f->errors), 0);
}

/* The light client: a tiny session of start, 5 steps and finish, one at a
 * time.  Returns how many of the flood's replies had come when it had its
 * last reply. */
static int light_session(const itest_daemon_t *d, flood_t *f)
{
    itest_conn_t *c = itest_connect(d);
    cJSON *r;
    int seen;

    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"l\",\"model\":\"tiny\",\"prompt\":[1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    for (int k = 0; k < 5; k++) {
        r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"l\",\"n\":1}");
        itest_expect_ok(r);
        ck_assert_int_eq(itest_int(r, "entries"), 2 + k);
        cJSON_Delete(r);
    }
    r = itest_rpc(c, "{\"op\":\"finish\",\"id\":\"l\"}");
    seen = atomic_load(&f->got);
    fprintf(stderr, "the light session ended after %d of the flood's %d replies\n", seen,
            f->expect);
    itest_expect_ok(r);
    cJSON_Delete(r);
    itest_close(c);
    return seen;
}

/* One worker, batches of at most 4: a light request waits behind at most
 * the worker's local jobs and one batch. */
static itest_daemon_t *daemon_start(void)
{
    return itest_daemon_start("--models", "tiny,base", "--threads", "1", "--max-batch", "4", NULL);
}

START_TEST(test_noisy_neighbour_sessions)
{
    itest_daemon_t *d = daemon_start();
    flood_t f = {.c = itest_connect(d)};
    size_t cap = (size_t)FLOOD_TOTAL * 64 + FLOOD_SESSIONS * 96, len = 0;
    char *buf = malloc(cap);
    int seen;

    for (int s = 0; s < FLOOD_SESSIONS; s++)
        len += (size_t)snprintf(buf + len, cap - len,
                                "{\"op\":\"start\",\"id\":\"h%d\",\"model\":\"base\","
                                "\"prompt\":[%d]}\n",
                                s, s % 100);
    ck_assert(itest_send_str(f.c, buf));
    for (int s = 0; s < FLOOD_SESSIONS; s++) {
        cJSON *r = itest_read_reply(f.c);
        itest_expect_ok(r);
        cJSON_Delete(r);
    }
    len = 0;
    for (int k = 0; k < FLOOD_STEPS; k++)
        for (int s = 0; s < FLOOD_SESSIONS; s++)
            len += (size_t)snprintf(buf + len, cap - len,
                                    "{\"op\":\"step\",\"id\":\"h%d\",\"n\":1}\n", s);
    flood_begin(&f, buf, FLOOD_TOTAL);
    seen = light_session(d, &f);
    flood_end(&f);
    ck_assert_msg(seen < FLOOD_TOTAL / 2,
                  "the light session ended after %d of the flood's %d steps: it waited behind them",
                  seen, FLOOD_TOTAL);
    itest_close(f.c);
    free(buf);
}
END_TEST

START_TEST(test_noisy_neighbour_pipelined)
{
    itest_daemon_t *d = daemon_start();
    flood_t f = {.c = itest_connect(d)};
    size_t cap = (size_t)DEEP_STEPS * 48, len = 0;
    char *buf = malloc(cap);
    cJSON *r;
    int seen;

    r = itest_rpc(f.c, "{\"op\":\"start\",\"id\":\"deep\",\"model\":\"base\",\"prompt\":[7]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    for (int k = 0; k < DEEP_STEPS; k++)
        len +=
            (size_t)snprintf(buf + len, cap - len, "{\"op\":\"step\",\"id\":\"deep\",\"n\":1}\n");
    flood_begin(&f, buf, DEEP_STEPS);
    seen = light_session(d, &f);
    flood_end(&f);
    ck_assert_msg(seen < DEEP_STEPS / 2,
                  "the light session ended after %d of the flood's %d steps: it waited behind them",
                  seen, DEEP_STEPS);
    itest_close(f.c);
    free(buf);
}
END_TEST

/* ---- Coalesced runs: one session's pipelined steps in one job ---- */

/* Sends the line `fmt` (a printf format given the line's number) `n` times, after
 * `head` and before `tail` (either may be NULL), in one write. */
static void send_pipelined(itest_conn_t *c, const char *head, const char *fmt, int n,
                           const char *tail)
{
    size_t cap = 4096 + (size_t)n * 96, len = 0;
    char *buf = malloc(cap);

    buf[0] = '\0';
    if (head != NULL)
        len += (size_t)snprintf(buf + len, cap - len, "%s", head);
    for (int k = 0; k < n; k++)
        len += (size_t)snprintf(buf + len, cap - len, fmt, k);
    if (tail != NULL)
        len += (size_t)snprintf(buf + len, cap - len, "%s", tail);
    ck_assert(itest_send_str(c, buf));
    free(buf);
}

/* 50 pipelined steps of one session, run as one chain (--batch-us 0: no
 * slice): every reply is the uncached reference's, in order; for `small`
 * (logits) and `hash` (none). */
START_TEST(test_chain_replies_in_order)
{
    static const char *const models[] = {"small", "hash"};
    itest_daemon_t *d = itest_daemon_start("--models", "tiny,hash,small", "--threads", "1",
                                           "--batch-us", "0", NULL);
    itest_conn_t *c = itest_connect(d);

    for (int m = 0; m < 2; m++) {
        itest_ref_t ref;
        int64_t prompt[3] = {3, 1, 4};
        char *start, id[16], fmt[64], why[600];
        cJSON *r;

        snprintf(id, sizeof(id), "c%d", m);
        itest_ref_init(&ref, id, models[m], prompt, 3, 50);
        start = itest_ref_start_line(&ref);
        snprintf(fmt, sizeof(fmt), "{\"op\":\"step\",\"id\":\"%s\",\"n\":1}\n", id);
        send_pipelined(c, start, fmt, 50, NULL);
        free(start);
        r = itest_read_reply(c);
        ck_assert_msg(itest_ref_start_ok(&ref, r, itest_last_line(c), why, sizeof(why)), "%s", why);
        cJSON_Delete(r);
        for (int k = 0; k < 50; k++) {
            r = itest_read_reply(c);
            ck_assert_msg(itest_ref_step_ok(&ref, r, itest_last_line(c), 1, why, sizeof(why)),
                          "%s step %d: %s", models[m], k + 1, why);
            cJSON_Delete(r);
        }
        itest_ref_free(&ref);
    }
    itest_close(c);
}
END_TEST


/* A single-worker daemon whose job number `wedge_after` wedges, and a
 * connection that has pipelined a `base` start of id "b" and `steps` single
 * steps of it, which run as one chain (--batch-us 0).  The part "faults"
 * only: it needs the fault hooks. */
static itest_conn_t *wedged_chain(const char *wedge_after, int steps, itest_daemon_t **d)
{
    itest_conn_t *c;

    *d = itest_daemon_start("--models", "tiny,base", "--threads", "1", "--batch-us", "0",
                            "--fault-wedge-after", wedge_after, NULL);
    c = itest_connect(*d);
    send_pipelined(c, "{\"op\":\"start\",\"id\":\"b\",\"model\":\"base\",\"prompt\":[5]}\n",
                   "{\"op\":\"step\",\"id\":\"b\",\"n\":1}\n", steps, NULL);
    return c;
}

/* Each reply leaves as its step is answered, not when the run ends: of 50
 * pipelined `base` steps run as one chain, the 11th wedges the worker
 * (job 12, after the start), and the first ten replies are read while it
 * is wedged, with 40 steps still out; released, the rest follow in order. */
START_TEST(test_chain_replies_before_run_ends)
{
    itest_daemon_t *d;
    itest_conn_t *c;
    cJSON *r;

    c = wedged_chain("12", 50, &d);
    r = itest_read_reply(c);
    itest_expect_ok(r);
    cJSON_Delete(r);
    for (int k = 0; k < 10; k++) {
        r = itest_read_reply(c);
        ck_assert_int_eq(itest_int(r, "entries"), 2 + k);
        cJSON_Delete(r);
    }
    ck_assert_int_eq(itest_metric(d, "slotd_steps_in_flight"), 40);
    /* The 11th step running, the 39 behind it in its chain waiting. */
    ck_assert_int_eq(itest_metric(d, "slotd_requests_running"), 1);
    ck_assert_int_eq(itest_metric(d, "slotd_requests_waiting"), 39);
    itest_daemon_signal(d, SIGUSR1);
    for (int k = 10; k < 50; k++) {
        r = itest_read_reply(c);
        ck_assert_int_eq(itest_int(r, "entries"), 2 + k);
        cJSON_Delete(r);
    }
    ck_assert_int_eq(itest_metric(d, "slotd_steps_in_flight"), 0);
    ck_assert_int_eq(itest_metric(d, "slotd_requests_running"), 0);
    ck_assert_int_eq(itest_metric(d, "slotd_requests_waiting"), 0);
    ck_assert_int_eq(itest_metric(d, "slotd_batch_size_count"), 50); /* each step alone */
    itest_close(c);
}
END_TEST

/* A disconnect in the middle of a run: the step in flight (wedged) ends,
 * no further step of the chain runs (8 attention rows, one base step,
 * after the disconnect), and the slot is released. */
START_TEST(test_chain_disconnect)
{
    itest_daemon_t *d;
    itest_conn_t *c;
    int64_t rows0, rows1 = -1, live = -1;
    cJSON *r;

    c = wedged_chain("6", 50, &d);
    for (int k = 0; k < 5; k++) { /* the start and four steps; the fifth wedges */
        r = itest_read_reply(c);
        itest_expect_ok(r);
        cJSON_Delete(r);
    }
    rows0 = itest_metric(d, "slotd_attention_rows_total");
    ck_assert_int_eq(itest_metric(d, "slotd_live_sessions"), 1);
    itest_close_reset(c);
    itest_daemon_signal(d, SIGUSR1);
    for (int tries = 0; tries < itest_scale_ms(10000) / 10; tries++) {
        live = itest_metric(d, "slotd_live_sessions");
        if (live == 0 && itest_metric(d, "slotd_steps_in_flight") == 0)
            break;
        usleep(10000);
    }
    ck_assert_int_eq(live, 0);
    rows1 = itest_metric(d, "slotd_attention_rows_total");
    ck_assert_int_le(rows1 - rows0, 8);
    ck_assert_int_eq(itest_metric(d, "slotd_cache_entries"), 0);
}
END_TEST

/* A finish queued behind a chain of steps, and steps past the context in
 * the middle of one: tiny holds 8 entries, so of 10 steps after a prompt
 * of 1, seven succeed and three get context_full, in order; the finish
 * after them releases 8. */
START_TEST(test_chain_finish_and_context_full)
{
    itest_daemon_t *d = itest_daemon_start("--threads", "1", "--batch-us", "0", NULL);
    itest_conn_t *c = itest_connect(d);
    cJSON *r;

    send_pipelined(c, "{\"op\":\"start\",\"id\":\"t\",\"prompt\":[1]}\n",
                   "{\"op\":\"step\",\"id\":\"t\",\"n\":1}\n", 10,
                   "{\"op\":\"finish\",\"id\":\"t\"}\n");
    r = itest_read_reply(c);
    itest_expect_ok(r);
    cJSON_Delete(r);
    for (int k = 0; k < 10; k++) {
        r = itest_read_reply(c);
        if (k < 7)
            ck_assert_int_eq(itest_int(r, "entries"), 2 + k);
        else
            ck_assert(itest_is_error(r, "context_full"));
        cJSON_Delete(r);
    }
    r = itest_read_reply(c);
    ck_assert_int_eq(itest_int(r, "released"), 8);
    cJSON_Delete(r);
    itest_close(c);
}
END_TEST

/* A stats behind a chain is a barrier still: pipelined after a start and
 * 30 `hash` steps of one session (one chain) and before 5 more, it comes
 * after the 30 step replies and shows the 31 entries they leave, none of
 * the 5 after it. */
START_TEST(test_chain_stats_barrier)
{
    itest_daemon_t *d = itest_daemon_start("--threads", "2", "--batch-us", "0", NULL);
    itest_conn_t *c = itest_connect(d);
    char *buf = malloc(64 * 40);
    size_t len = 0;
    cJSON *r;

    len += (size_t)sprintf(buf + len, "{\"op\":\"start\",\"id\":\"h\",\"model\":\"hash\","
                                      "\"prompt\":[1]}\n");
    for (int k = 0; k < 35; k++) {
        if (k == 30)
            len += (size_t)sprintf(buf + len, "{\"op\":\"stats\"}\n");
        len += (size_t)sprintf(buf + len, "{\"op\":\"step\",\"id\":\"h\",\"n\":1}\n");
    }
    ck_assert(itest_send_str(c, buf));
    r = itest_read_reply(c);
    itest_expect_ok(r);
    cJSON_Delete(r);
    for (int k = 0; k < 30; k++) {
        r = itest_read_reply(c);
        ck_assert_int_eq(itest_int(r, "entries"), 2 + k);
        cJSON_Delete(r);
    }
    r = itest_read_reply(c);
    ck_assert_int_eq(itest_int(r, "cache_entries"), 31);
    cJSON_Delete(r);
    for (int k = 30; k < 35; k++) {
        r = itest_read_reply(c);
        ck_assert_int_eq(itest_int(r, "entries"), 2 + k);
        cJSON_Delete(r);
    }
    free(buf);
    itest_close(c);
}
END_TEST

/* cache_full in the middle of a run: one `small` session in a 1 MiB pool
 * pipelines 400 steps; the first ones succeed, entries growing by one,
 * and once the pool is full every later one is refused cache_full, in
 * order, as one at a time; the finish releases exactly what succeeded. */
START_TEST(test_chain_cache_full)
{
    itest_daemon_t *d =
        itest_daemon_start("--models", "tiny,small", "--threads", "1", "--batch-us", "0",
                           "--cache-mb", "1", "--max-connection-share", "1", NULL);
    itest_conn_t *c = itest_connect(d);
    int ok = 0, full = 0;
    cJSON *r;

    send_pipelined(c, "{\"op\":\"start\",\"id\":\"s\",\"model\":\"small\",\"prompt\":[1]}\n",
                   "{\"op\":\"step\",\"id\":\"s\",\"n\":1}\n", 400,
                   "{\"op\":\"finish\",\"id\":\"s\"}\n");
    r = itest_read_reply(c);
    itest_expect_ok(r);
    cJSON_Delete(r);
    for (int k = 0; k < 400; k++) {
        r = itest_read_reply(c);
        if (itest_is_error(r, "cache_full")) {
            full++;
        } else {
            ck_assert_int_eq(full, 0); /* no success after a refusal */
            ck_assert_int_eq(itest_int(r, "entries"), 2 + ok);
            ok++;
        }
        cJSON_Delete(r);
    }
    ck_assert_int_gt(ok, 0);
    ck_assert_int_gt(full, 0);
    r = itest_read_reply(c);
    ck_assert_int_eq(itest_int(r, "released"), 1 + ok);
    cJSON_Delete(r);
    itest_close(c);
}
END_TEST

/* A drain in the middle of a run: of 30 pipelined `base` steps run as
 * one chain, the third wedges its worker (job 4); SIGTERM releases it and
 * it is answered, and the 27 steps after it, never begun, are answered
 * shutting_down, in order, before the connection closes. */
START_TEST(test_chain_drain)
{
    itest_daemon_t *d;
    itest_conn_t *c;
    cJSON *r;

    c = wedged_chain("4", 30, &d);
    for (int k = 0; k < 3; k++) { /* the start and two steps; the third wedges */
        r = itest_read_reply(c);
        itest_expect_ok(r);
        cJSON_Delete(r);
    }
    ck_assert_int_eq(itest_metric(d, "slotd_steps_in_flight"), 28);
    itest_daemon_signal(d, SIGTERM);
    r = itest_read_reply(c);
    ck_assert_int_eq(itest_int(r, "entries"), 4);
    cJSON_Delete(r);
    for (int k = 0; k < 27; k++) {
        r = itest_read_reply(c);
        ck_assert_msg(itest_is_error(r, "shutting_down"), "step %d: %s", k + 4, itest_last_line(c));
        cJSON_Delete(r);
    }
    ck_assert(itest_expect_closed(c, itest_scale_ms(10000)));
    ck_assert_int_eq(itest_daemon_wait(d, itest_scale_ms(10000)), 0);
    itest_close(c);
}
END_TEST

/* ---- Batches of chains: two sessions' pipelined steps in rounds ---- */

#define ROUNDS 40

/* Starts sessions "a" and "b" of `small` on `c` and sends their ROUNDS
 * steps each, interleaved (a, b, a, b, ...), in one write: the first two
 * run as a batch, and then each session's other steps as a chain, the two
 * chains one batch in rounds (job.c: job_run_batch()).  `ref` gets the
 * sessions' references. */
static void two_chains(itest_conn_t *c, itest_ref_t ref[2])
{
    int64_t prompt[3] = {2, 7, 1};
    size_t cap = (size_t)ROUNDS * 2 * 48, len = 0;
    char *buf = malloc(cap), *line, why[600];
    cJSON *r;

    itest_ref_init(&ref[0], "a", "small", prompt, 3, ROUNDS);
    itest_ref_init_like(&ref[1], "b", &ref[0]);
    for (int i = 0; i < 2; i++) {
        line = itest_ref_start_line(&ref[i]);
        line[strlen(line) - 1] = '\0';
        r = itest_rpc(c, "%s", line);
        ck_assert_msg(itest_ref_start_ok(&ref[i], r, itest_last_line(c), why, sizeof(why)), "%s",
                      why);
        cJSON_Delete(r);
        free(line);
    }
    for (int k = 0; k < ROUNDS; k++)
        len += (size_t)snprintf(buf + len, cap - len,
                                "{\"op\":\"step\",\"id\":\"a\",\"n\":1}\n"
                                "{\"op\":\"step\",\"id\":\"b\",\"n\":1}\n");
    ck_assert(itest_send_str(c, buf));
    free(buf);
}

/* Every reply is the uncached reference's, in order, and every step ran
 * in a batch of two: ROUNDS batches, with no trip to the loop between the
 * rounds of the chains. */
START_TEST(test_chain_batches)
{
    itest_daemon_t *d = itest_daemon_start("--models", "tiny,small", "--threads", "1", NULL);
    itest_conn_t *c = itest_connect(d);
    itest_ref_t ref[2];
    char why[600];

    two_chains(c, ref);
    for (int k = 0; k < 2 * ROUNDS; k++) {
        cJSON *r = itest_read_reply(c);
        ck_assert_msg(itest_ref_step_ok(&ref[k % 2], r, itest_last_line(c), 1, why, sizeof(why)),
                      "session %c step %d: %s", "ab"[k % 2], k / 2 + 1, why);
        cJSON_Delete(r);
    }
    ck_assert_int_eq(itest_metric(d, "slotd_step_batches_total"), ROUNDS);
    ck_assert_int_eq(itest_metric(d, "slotd_batched_steps_total"), 2 * ROUNDS);
    ck_assert_int_eq(itest_metric(d, "slotd_steps_in_flight"), 0);
    itest_ref_free(&ref[0]);
    itest_ref_free(&ref[1]);
    itest_close(c);
}
END_TEST

/* A drain in the middle of the rounds: job 13 (the starts are jobs 1 and
 * 2, then each round, the first batch included, is two jobs: a's k-th
 * step is job 2k + 1) is a's 6th step, and wedges its worker; SIGTERM
 * releases it, the round ends (a and b's 6th steps answered), and every
 * later step, never begun, is answered shutting_down, in order, before
 * the connection closes. */
START_TEST(test_chain_batch_drain)
{
    itest_daemon_t *d;
    itest_conn_t *c;
    itest_ref_t ref[2];
    char why[600];

    d = itest_daemon_start("--models", "tiny,small", "--threads", "1", "--fault-wedge-after", "13",
                           NULL);
    c = itest_connect(d);
    two_chains(c, ref);
    for (int k = 0; k < 10; k++) {
        cJSON *r = itest_read_reply(c);
        ck_assert_msg(itest_ref_step_ok(&ref[k % 2], r, itest_last_line(c), 1, why, sizeof(why)),
                      "session %c step %d: %s", "ab"[k % 2], k / 2 + 1, why);
        cJSON_Delete(r);
    }
    itest_daemon_signal(d, SIGTERM);
    for (int k = 10; k < 2 * ROUNDS; k++) {
        cJSON *r = itest_read_reply(c);
        if (k < 12)
            ck_assert_msg(
                itest_ref_step_ok(&ref[k % 2], r, itest_last_line(c), 1, why, sizeof(why)),
                "session %c step %d: %s", "ab"[k % 2], k / 2 + 1, why);
        else
            ck_assert_msg(itest_is_error(r, "shutting_down"), "reply %d: %s", k + 1,
                          itest_last_line(c));
        cJSON_Delete(r);
    }
    ck_assert(itest_expect_closed(c, itest_scale_ms(10000)));
    ck_assert_int_eq(itest_daemon_wait(d, itest_scale_ms(10000)), 0);
    itest_ref_free(&ref[0]);
    itest_ref_free(&ref[1]);
    itest_close(c);
}
END_TEST

int main(int argc, char **argv)
{
    if (itest_is_part(argc, argv, "faults") && !itest_fault_hooks())
        return itest_skip("slotd built without the fault hooks (the plain stage has them)");
    Suite *s = suite_create("integration_sched");

    /* The cases that wedge a worker on purpose (--fault-wedge-after). */
    if (itest_is_part(argc, argv, "faults")) {
        itest_add(s, "chain_replies_before_run_ends", test_chain_replies_before_run_ends);
        itest_add(s, "chain_disconnect", test_chain_disconnect);
        itest_add(s, "chain_drain", test_chain_drain);
        itest_add(s, "chain_batch_drain", test_chain_batch_drain);
        return itest_main(s);
    }
    itest_add(s, "noisy_neighbour_sessions", test_noisy_neighbour_sessions);
    itest_add(s, "noisy_neighbour_pipelined", test_noisy_neighbour_pipelined);
    itest_add(s, "chain_replies_in_order", test_chain_replies_in_order);
    itest_add(s, "chain_finish_and_context_full", test_chain_finish_and_context_full);
    itest_add(s, "chain_cache_full", test_chain_cache_full);
    itest_add(s, "chain_stats_barrier", test_chain_stats_barrier);
    itest_add(s, "chain_batches", test_chain_batches);
    return itest_main(s);
}
