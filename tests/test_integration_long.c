/*
 * test_integration_long.c: long jobs through the real daemon
 * (docs/design.md, "Long jobs").
 *
 * A generate or a step of many positions runs in slices: its reply is bit
 * for bit the uncached reference's, for `small` and `base`, cached and
 * not, with every position its own slice (--batch-us 2).  On one worker, a
 * light `tiny` client on another connection is served while a long
 * generate runs (counted in replies read before the generate's, never in
 * time), whose reply is still the reference's and still comes before the
 * next line of its own connection.  A long generate keeps /health at 200
 * past a 1 s --wedge-timeout, while a worker that makes no progress (the
 * test build's --fault-wedge-after) still turns it to 503.  A step run
 * inside a long one counts in slotd_step_seconds once, not again in the
 * long step's.
 */
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "itest.h"

static const int64_t prompt[] = {1, 2, 3};
#define NPROMPT 3

/* Fails the test unless `reply` (raw `line`) is the uncached reference's
 * generate of `steps` picks after `prompt` on `preset`. */
static void expect_reference(const char *preset, const cJSON *reply, const char *line, int steps)
{
    uint32_t vocab = model_vocab(itest_model(preset));
    uint32_t *want = malloc((NPROMPT + (size_t)steps) * sizeof(*want));
    double *logits = malloc((size_t)steps * vocab * sizeof(*logits));
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(reply, "tokens");

    ck_assert(want != NULL && logits != NULL);
    itest_expect_ok(reply);
    itest_reference(preset, prompt, NPROMPT, steps, want, logits);
    ck_assert_msg(cJSON_IsArray(tk) && cJSON_GetArraySize(tk) == NPROMPT + steps,
                  "%s generate: want %d tokens: %.200s", preset, NPROMPT + steps, line);
    for (int i = 0; i < NPROMPT + steps; i++)
        ck_assert_msg(cJSON_GetArrayItem(tk, i)->valuedouble == (double)want[i],
                      "%s generate: token %d is not the reference's: %.200s", preset, i, line);
    itest_expect_logits(line, logits, (size_t)steps * vocab);
    free(want);
    free(logits);
}

/* Fails the test unless `reply` (raw `line`) is the first `steps` picks
 * of `ref`, the uncached reference: a generate's picks and logits are
 * those of a longer one's first steps, so one reference serves a case. */
static void expect_prefix(const itest_ref_t *ref, const cJSON *reply, const char *line, int steps)
{
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(reply, "tokens");
    size_t n = ref->nprompt + (size_t)steps;

    ck_assert((size_t)steps <= ref->max_steps);
    itest_expect_ok(reply);
    ck_assert_msg(cJSON_IsArray(tk) && cJSON_GetArraySize(tk) == (int)n,
                  "%s generate: want %zu tokens: %.200s", ref->model, n, line);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(cJSON_GetArrayItem(tk, (int)i)->valuedouble == (double)ref->tokens[i],
                      "%s generate: token %zu is not the reference's: %.200s", ref->model, i, line);
    itest_expect_logits(line, ref->logits, (size_t)steps * ref->vocab);
}

static void check_generate(itest_conn_t *c, const itest_ref_t *ref, int steps, bool use_cache)
{
    cJSON *r = itest_rpc(c,
                         "{\"op\":\"generate\",\"model\":\"%s\",\"tokens\":[1,2,3],\"steps\":%d,"
                         "\"use_cache\":%s}",
                         ref->model, steps, use_cache ? "true" : "false");

    expect_prefix(ref, r, itest_last_line(c), steps);
    cJSON_Delete(r);
}

/* A session `id` started on `c` with `like`'s prompt and stepped once by
 * `n`, against `like`'s reference. */
static void check_step(itest_conn_t *c, const char *id, const itest_ref_t *like, uint32_t n)
{
    itest_ref_t ref;
    char *start;
    char why[600];
    cJSON *r;

    itest_ref_init_like(&ref, id, like);
    start = itest_ref_start_line(&ref);
    ck_assert(itest_send_str(c, start));
    free(start);
    r = itest_read_reply(c);
    ck_assert_msg(itest_ref_start_ok(&ref, r, itest_last_line(c), why, sizeof(why)), "%s", why);
    cJSON_Delete(r);
    itest_ref_step(c, &ref, n);
    itest_ref_free(&ref);
}

/* Sliced results: with --batch-us 2 every position of these jobs ends a
 * slice, and each reply is still the reference's.  One case per preset,
 * one reference of the longest job per case (it was computed three times,
 * most of the suite's time under the sanitizers); TSan leaves `base` out
 * (main()). */
static void check_sliced(const char *preset, int cached, int uncached, int step_n)
{
    itest_daemon_t *d = itest_daemon_start("--models", preset, "--threads", "1",
                                           "--batch-us", "2", NULL);
    itest_conn_t *c = itest_connect(d);
    itest_ref_t ref;

    itest_ref_init(&ref, "ref", preset, prompt, NPROMPT, (size_t)(step_n > cached ? step_n : cached));
    check_generate(c, &ref, cached, true);
    check_generate(c, &ref, uncached, false);
    check_step(c, "s", &ref, (uint32_t)step_n);
    itest_ref_free(&ref);
    itest_close(c);
}

START_TEST(test_sliced_results)
{
    check_sliced("small", 200, 60, 200);
}
END_TEST

START_TEST(test_sliced_results_base)
{
    check_sliced("base", 24, 12, 24);
}
END_TEST

/* The light client: one `tiny` session of a start, 7 single steps and a
 * finish, each checked against the reference.  Returns the requests it
 * made before `watch` had a line to read (all 9 if it had none). */
typedef struct light {
    itest_conn_t *c;
    itest_ref_t ref;
    _Atomic int done;  /* requests answered */
    _Atomic bool stop; /* light_thread(): ends at the end of a request */
    pthread_t thread;
} light_t;

/* Whether `c` has a reply line, or part of one, to read, waiting up to
 * `ms` for one. */
static bool has_reply(itest_conn_t *c, int ms)
{
    struct pollfd p = {.fd = itest_conn_fd(c), .events = POLLIN};

    return itest_pending(c) > 0 || poll(&p, 1, ms) > 0;
}

/* One request of the light client's cycle (start, 7 steps, finish). */
static void light_next(light_t *l)
{
    int k = atomic_load(&l->done) % 9;
    char why[600];
    cJSON *r;

    if (k == 0) {
        char *start;
        itest_ref_free(&l->ref);
        itest_ref_init(&l->ref, "light", "tiny", prompt, 1, 7);
        start = itest_ref_start_line(&l->ref);
        ck_assert(itest_send_str(l->c, start));
        free(start);
        r = itest_read_reply(l->c);
        ck_assert_msg(itest_ref_start_ok(&l->ref, r, itest_last_line(l->c), why, sizeof(why)), "%s",
                      why);
        cJSON_Delete(r);
    } else if (k < 8) {
        itest_ref_step(l->c, &l->ref, 1);
    } else {
        r = itest_rpc(l->c, "{\"op\":\"finish\",\"id\":\"light\"}");
        itest_expect_ok(r);
        cJSON_Delete(r);
    }
    atomic_fetch_add(&l->done, 1);
}

/* The light client on a thread of its own, until l->stop. */
static void *light_thread(void *arg)
{
    light_t *l = arg;

    while (!atomic_load(&l->stop))
        light_next(l);
    return NULL;
}

/* On one worker, a long uncached `small` generate (not timed yet: it runs
 * in slices) with a `tiny` start pipelined behind it; a light client on
 * another connection makes requests until the generate's reply is there.
 * It must have had at least 3 answered first: with the generate holding
 * the worker, its first waits for the generate.  The generate is the
 * reference's though tiny jobs ran on its worker between its slices, and
 * its connection's start is answered after it. */
START_TEST(test_light_beside_long)
{
    itest_daemon_t *d = itest_daemon_start("--models", "tiny,small", "--preload", "tiny,small",
                                           "--threads", "1", NULL);
    itest_conn_t *a = itest_connect(d);
    light_t l = {.c = itest_connect(d)};
    const int steps = 100;
    cJSON *r;

    itest_ref_init(&l.ref, "light", "tiny", prompt, 1, 7);
    ck_assert(
        itest_sendf(a,
                    "{\"op\":\"generate\",\"model\":\"small\",\"tokens\":[1,2,3],\"steps\":%d,"
                    "\"tag\":1}\n"
                    "{\"op\":\"start\",\"id\":\"x\",\"model\":\"tiny\",\"prompt\":[1],"
                    "\"tag\":2}\n",
                    steps));
    ck_assert_int_ge(itest_await_metric(d, "slotd_requests_running", 1, itest_scale_ms(10000)), 1);
    while (!has_reply(a, 0))
        light_next(&l);
    ck_assert_msg(atomic_load(&l.done) >= 3,
                  "only %d light requests were answered before the long generate's reply",
                  atomic_load(&l.done));
    r = itest_read_reply(a);
    itest_expect_tag(r, "1");
    expect_reference("small", r, itest_last_line(a), steps);
    cJSON_Delete(r);
    r = itest_read_reply(a);
    itest_expect_tag(r, "2");
    itest_expect_ok(r);
    cJSON_Delete(r);
    itest_ref_free(&l.ref);
    itest_close(a);
    itest_close(l.c);
}
END_TEST

/* A generate of no steps, a job with no logits at all, run inside a long
 * one on its worker: it is answered like any other (the nested job's
 * buffers start empty, and a request for none of them is not a failure). */
START_TEST(test_nested_generate_no_steps)
{
    itest_daemon_t *d = itest_daemon_start("--models", "tiny,small", "--preload", "tiny,small",
                                           "--threads", "1", NULL);
    itest_conn_t *a = itest_connect(d), *b = itest_connect(d);
    int beside = 0;
    cJSON *r;

    ck_assert(itest_sendf(a, "{\"op\":\"generate\",\"model\":\"small\",\"tokens\":[1,2,3],"
                             "\"steps\":100,\"tag\":1}\n"));
    ck_assert_int_ge(itest_await_metric(d, "slotd_requests_running", 1, itest_scale_ms(10000)), 1);
    while (!has_reply(a, 0)) {
        r = itest_rpc(b, "{\"op\":\"generate\",\"model\":\"tiny\",\"tokens\":[1,2],\"steps\":0}");
        ck_assert_msg(r != NULL, "no reply to a generate of no steps beside the long one");
        ck_assert_msg(cJSON_GetObjectItem(r, "error") == NULL, "a generate of no steps failed: %s",
                      itest_last_line(b));
        ck_assert_str_eq(itest_last_line(b), "{\"tokens\":[1,2],\"logits\":[],\"rows\":0}");
        cJSON_Delete(r);
        beside++;
    }
    ck_assert_msg(beside >= 2, "only %d requests were answered beside the long generate", beside);
    r = itest_read_reply(a);
    itest_expect_tag(r, "1");
    expect_reference("small", r, itest_last_line(a), 100);
    cJSON_Delete(r);
    itest_close(a);
    itest_close(b);
}
END_TEST

/* GET /health's status. */
static int health(const itest_daemon_t *d)
{
    itest_http_t h;
    int status;

    itest_http_get(d, "/health", &h);
    status = h.status;
    itest_http_free(&h);
    return status;
}

/* The case on one worker with --wedge-timeout 1: a cached `base`
 * generate sized (from a short one) to run about 4 s.  /health is polled
 * while it runs, each time the light client has made a request, and must
 * answer 200 every time, including at least once past 1.5 s; the light
 * client must be served meanwhile (3 requests at least). */
START_TEST(test_long_generate_keeps_health)
{
    itest_daemon_t *d = itest_daemon_start("--models", "tiny,base", "--preload", "tiny,base",
                                           "--threads", "1", "--wedge-timeout", "1", NULL);
    itest_conn_t *a = itest_connect(d);
    light_t l = {.c = itest_connect(d)};
    int64_t t0, per, past = 0, polls = 0;
    int steps, code;
    cJSON *r;

    /* Sizing, not asserting: the time of 8 steps on this build. */
    t0 = itest_now_ms();
    r = itest_rpc(a, "{\"op\":\"generate\",\"model\":\"base\",\"tokens\":[1,2,3],\"steps\":8,"
                     "\"use_cache\":true}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    per = (itest_now_ms() - t0) / 8 + 1;
    steps = (int)(4000 / per);
    steps = steps < 64 ? 64 : steps > 4000 ? 4000 : steps;

    itest_ref_init(&l.ref, "light", "tiny", prompt, 1, 7);
    ck_assert(itest_sendf(a,
                          "{\"op\":\"generate\",\"model\":\"base\",\"tokens\":[1,2,3],\"steps\":%d,"
                          "\"use_cache\":true}\n",
                          steps));
    ck_assert_int_ge(itest_await_metric(d, "slotd_requests_running", 1, itest_scale_ms(10000)), 1);
    t0 = itest_now_ms();
    ck_assert_int_eq(pthread_create(&l.thread, NULL, light_thread, &l), 0);
    /* Paced by the wait for the generate's reply. */
    while (!has_reply(a, 50)) {
        code = health(d);
        polls++;
        ck_assert_msg(code == 200,
                      "/health answered %d %lld ms into a %d-step generate (poll %lld, %d light "
                      "requests answered)",
                      code, (long long)(itest_now_ms() - t0), steps, (long long)polls,
                      atomic_load(&l.done));
        if (itest_now_ms() - t0 > 1500)
            past++;
    }
    atomic_store(&l.stop, true);
    ck_assert_int_eq(pthread_join(l.thread, NULL), 0);
    ck_assert_msg(past > 0, "the generate (%d steps) ended before the wedge timeout: not a test",
                  steps);
    ck_assert_msg(atomic_load(&l.done) >= 3,
                  "only %d light requests were answered beside the long generate",
                  atomic_load(&l.done));
    r = itest_read_reply(a);
    itest_expect_ok(r);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(r, "tokens")),
                     NPROMPT + steps);
    cJSON_Delete(r);
    ck_assert_int_eq(health(d), 200);
    itest_ref_free(&l.ref);
    itest_close(a);
    itest_close(l.c);
}
END_TEST

/* The value of the sample `name` (labels as rendered) in GET /metrics, as
 * a double; fails the test if there is none. */
static double metric_double(const itest_daemon_t *d, const char *name)
{
    itest_http_t h;
    size_t len = strlen(name);
    const char *p;
    double v;

    itest_http_get(d, "/metrics", &h);
    for (p = h.body; p != NULL; p = strchr(p, '\n'), p = p != NULL ? p + 1 : NULL)
        if (strncmp(p, name, len) == 0 && p[len] == ' ')
            break;
    ck_assert_msg(p != NULL, "no sample %s in /metrics", name);
    v = strtod(p + len + 1, NULL);
    itest_http_free(&h);
    return v;
}

/* The jobs a long step runs inside it are timed as their own, not again
 * in its slotd_step_seconds.  On one worker a `small` step of 1000
 * positions yields to a light step of another connection, which the test
 * build holds (--fault-wedge-after 4: the starts are jobs 1 and 2, the
 * long step 3) until /health turns 503 and SIGUSR1 lets it go.  Every step
 * observed then ran apart from the others, so their times add up to no
 * more than the time from the long step's line to its reply; with the
 * held step counted twice, once in the long step's, they pass it by the
 * hold, a second or more. */
START_TEST(test_lent_time_observed_once)
{
    itest_daemon_t *d;
    itest_conn_t *a, *b;
    double sum0, sum;
    int64_t t0, t1;
    cJSON *r;

    d = itest_daemon_start("--models", "small", "--threads", "1", "--wedge-timeout", "1",
                           "--fault-wedge-after", "4", NULL);
    a = itest_connect(d);
    b = itest_connect(d);
    r = itest_rpc(a, "{\"op\":\"start\",\"id\":\"long\",\"prompt\":[1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_rpc(b, "{\"op\":\"start\",\"id\":\"q\",\"prompt\":[1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    sum0 = metric_double(d, "slotd_step_seconds_sum{model=\"small\"}");

    t0 = itest_now_ms();
    ck_assert(itest_send_str(a, "{\"op\":\"step\",\"id\":\"long\",\"n\":1000}\n"));
    ck_assert_int_ge(itest_await_metric(d, "slotd_requests_running", 1, itest_scale_ms(10000)), 1);
    ck_assert(itest_send_str(b, "{\"op\":\"step\",\"id\":\"q\"}\n"));
    while (health(d) != 503) {
        ck_assert_msg(itest_now_ms() - t0 < itest_scale_ms(15000),
                      "/health never turned 503 with the light step held");
        ck_assert(!has_reply(b, 20));
    }
    /* Held inside the long step, not after it: that one has not ended. */
    ck_assert_msg(!has_reply(a, 0), "the long step ended before the light one ran: not a test");
    itest_daemon_signal(d, SIGUSR1);
    r = itest_read_reply(b);
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_read_reply(a);
    itest_expect_ok(r);
    cJSON_Delete(r);
    t1 = itest_now_ms();

    sum = metric_double(d, "slotd_step_seconds_sum{model=\"small\"}") - sum0;
    ck_assert_msg(sum * 1000.0 <= (double)(t1 - t0) + 1.0,
                  "slotd_step_seconds_sum grew by %.3f s over the %lld ms of the two steps: the "
                  "held step's time counted twice",
                  sum, (long long)(t1 - t0));
    ck_assert_int_eq(health(d), 200);
    itest_close(a);
    itest_close(b);
}
END_TEST


/* A worker that makes no progress is still wedged: the first job holds
 * its worker (--fault-wedge-after 1), /health turns 503 past the 1 s
 * timeout, and 200 again once SIGUSR1 lets it go on. */
START_TEST(test_no_progress_is_wedged)
{
    itest_daemon_t *d;
    itest_conn_t *c;
    cJSON *r;
    int64_t t0;

    d = itest_daemon_start("--threads", "1", "--wedge-timeout", "1", "--fault-wedge-after", "1",
                           NULL);
    c = itest_connect(d);
    ck_assert(itest_send_str(c, "{\"op\":\"start\",\"id\":\"w\",\"prompt\":[1]}\n"));
    t0 = itest_now_ms();
    while (health(d) != 503) {
        ck_assert_msg(itest_now_ms() - t0 < itest_scale_ms(15000),
                      "/health never turned 503 with a wedged worker");
        ck_assert(!has_reply(c, 50)); /* the pace: no reply while it is wedged */
    }
    itest_daemon_signal(d, SIGUSR1);
    r = itest_read_reply(c);
    itest_expect_ok(r);
    cJSON_Delete(r);
    ck_assert_int_eq(health(d), 200);
    itest_close(c);
}
END_TEST

int main(int argc, char **argv)
{
    if (itest_is_part(argc, argv, "faults") && !itest_fault_hooks())
        return itest_skip("slotd built without the fault hooks (the plain stage has them)");
    Suite *s = suite_create("integration_long");

    /* The cases that hold a job on purpose (--fault-wedge-after). */
    if (itest_is_part(argc, argv, "faults")) {
        itest_add(s, "no_progress_is_wedged", test_no_progress_is_wedged);
        itest_add(s, "lent_time_observed_once", test_lent_time_observed_once);
        return itest_main(s);
    }
    itest_add(s, "sliced_results", test_sliced_results);
    /* The same slicing on `base`: the daemon's threads do what they do for
     * `small` above, the references (computed in this process, one
     * thread) are about 115 of the suite's 163 s under TSan.  Tag
     * tsan_slow, left out by the TSan stage; plain and ASan run it. */
    tcase_set_tags(itest_add(s, "sliced_results_base", test_sliced_results_base), "tsan_slow");
    itest_add(s, "light_beside_long", test_light_beside_long);
    itest_add(s, "nested_generate_no_steps", test_nested_generate_no_steps);
    itest_add(s, "long_generate_keeps_health", test_long_generate_keeps_health);
    return itest_main(s);
}
