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
 */
#include <pthread.h>
#include <stdatomic.h>
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

int main(void)
{
    Suite *s = suite_create("integration_sched");

    itest_add(s, "noisy_neighbour_sessions", test_noisy_neighbour_sessions);
    itest_add(s, "noisy_neighbour_pipelined", test_noisy_neighbour_pipelined);
    return itest_main(s);
}
