/*
 * test_integration_batch.c: batched steps (--max-batch) through the real
 * daemon, many sessions of mixed models at once.
 *
 * Sessions of tiny, hash, small and base, several on each of many
 * connections, step together: each round sends one single step for every
 * session still going, each connection's in one write, and only then reads
 * the replies, so that the workers find many steps of one model ready and
 * run them as batches.  Every reply is checked against the uncached
 * reference computed here (tokens, each printed logit, entries), so a
 * batch that mixed models or let an entry of one session reach another
 * would show.  Sessions come in groups of three with one prompt: the same
 * prompt stepped in one batch gives three identical answers, and other
 * groups their own.  slotd_step_batches_total shows that batches ran.
 * With --audit-rate 1 every batched step is audited and none diverges;
 * in builds with the fault hooks, a slot damaged after a batched step is
 * caught by the audit and its client still gets the reference.  With
 * --max-batch 1 no batch runs and the answers are the same.  Batches
 * are bounded by --max-batch alone (--batch-us 0): in slow builds
 * (sanitizers, audits) a step's measured time passes the time bound and
 * would keep every batch to one step.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "itest.h"

#define CONNS 12
#define PER_CONN 4
#define NSESS (CONNS * PER_CONN)

typedef struct plan {
    itest_ref_t ref[NSESS];
    itest_conn_t *conn[CONNS];
} plan_t;

static uint64_t rng = 5;

static uint32_t rnd_below(uint32_t n)
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)((rng >> 33) % n);
}

/* Session i's model, prompt length and steps: mostly small, some base,
 * tiny and hash among them; models alternate on a connection. */
static const char *model_of(size_t i, size_t *len, size_t *steps)
{
    static const char *const models[] = {"small", "base", "small", "tiny", "hash", "small"};
    const char *m = models[(i / 3) % 6];

    if (strcmp(m, "base") == 0) {
        *len = 1 + rnd_below(3);
        *steps = 4;
    } else if (strcmp(m, "tiny") == 0) {
        *len = 1 + rnd_below(3);
        *steps = 8 - *len;
    } else {
        *len = 1 + rnd_below(8);
        *steps = 12;
    }
    return m;
}

/* Sessions in groups of three with one prompt (the reference computed
 * once per group), spread so that each group's three sit on three
 * connections. */
static void plan_init(plan_t *p, const itest_daemon_t *d)
{
    size_t max_steps = 0;

    rng = 5;
    for (size_t g = 0; g < NSESS / 3; g++) {
        size_t len, steps;
        const char *m = model_of(g * 3, &len, &steps);
        int64_t prompt[8];
        char id[32];
        uint32_t vocab = model_vocab(itest_model(m));
        for (size_t k = 0; k < len; k++)
            prompt[k] = rnd_below(vocab);
        snprintf(id, sizeof(id), "g%zu-0", g);
        itest_ref_init(&p->ref[g * 3], id, m, prompt, len, steps);
        for (size_t k = 1; k < 3; k++) {
            snprintf(id, sizeof(id), "g%zu-%zu", g, k);
            itest_ref_init_like(&p->ref[g * 3 + k], id, &p->ref[g * 3]);
        }
        max_steps = steps > max_steps ? steps : max_steps;
    }
    for (size_t c = 0; c < CONNS; c++)
        p->conn[c] = itest_connect(d);
    (void)max_steps;
}

/* Session i lives on connection i % CONNS. */
static itest_conn_t *conn_of(plan_t *p, size_t i)
{
    return p->conn[i % CONNS];
}

static void plan_free(plan_t *p)
{
    for (size_t c = 0; c < CONNS; c++)
        itest_close(p->conn[c]);
    for (size_t i = 0; i < NSESS; i++)
        itest_ref_free(&p->ref[i]);
}

/* Starts every session, each connection's starts in one write. */
static void start_all(plan_t *p)
{
    for (size_t c = 0; c < CONNS; c++) {
        char *buf = calloc(1, 1);
        for (size_t i = c; i < NSESS; i += CONNS) {
            char *line = itest_ref_start_line(&p->ref[i]);
            buf = realloc(buf, strlen(buf) + strlen(line) + 1);
            strcat(buf, line);
            free(line);
        }
        ck_assert(itest_send_str(p->conn[c], buf));
        free(buf);
    }
    for (size_t c = 0; c < CONNS; c++) {
        for (size_t i = c; i < NSESS; i += CONNS) {
            char why[600];
            cJSON *reply = itest_read_reply(p->conn[c]);
            ck_assert_msg(itest_ref_start_ok(&p->ref[i], reply, itest_last_line(p->conn[c]), why,
                                             sizeof(why)),
                          "%s", why);
            cJSON_Delete(reply);
        }
    }
}

/* Rounds of one single step for every session with steps left: all the
 * rounds' lines sent before any reply is read, each checked against the
 * reference.  Returns the steps taken. */
static size_t step_all(plan_t *p)
{
    size_t total = 0;

    for (;;) {
        size_t sent = 0;
        for (size_t c = 0; c < CONNS; c++) {
            char buf[PER_CONN * 96] = "";
            for (size_t i = c; i < NSESS; i += CONNS) {
                if (p->ref[i].steps < p->ref[i].max_steps) {
                    size_t len = strlen(buf);
                    snprintf(buf + len, sizeof(buf) - len, "{\"op\":\"step\",\"id\":\"%s\"}\n",
                             p->ref[i].id);
                    sent++;
                }
            }
            if (buf[0] != '\0')
                ck_assert(itest_send_str(p->conn[c], buf));
        }
        if (sent == 0)
            return total;
        for (size_t c = 0; c < CONNS; c++) {
            /* This round's sessions of the connection, in the order sent
             * (steps are taken on each only once its reply checks). */
            size_t round[PER_CONN], nr = 0;
            for (size_t i = c; i < NSESS; i += CONNS)
                if (p->ref[i].steps < p->ref[i].max_steps)
                    round[nr++] = i;
            for (size_t k = 0; k < nr; k++) {
                char why[600];
                cJSON *reply = itest_read_reply(p->conn[c]);
                ck_assert_msg(itest_ref_step_ok(&p->ref[round[k]], reply,
                                                itest_last_line(p->conn[c]), 1, why, sizeof(why)),
                              "%s", why);
                cJSON_Delete(reply);
                total++;
            }
        }
    }
}

static void finish_all(plan_t *p)
{
    for (size_t i = 0; i < NSESS; i++) {
        cJSON *reply = itest_rpc(conn_of(p, i), "{\"op\":\"finish\",\"id\":\"%s\"}", p->ref[i].id);
        ck_assert_int_eq(itest_int(reply, "released"), (int64_t)itest_ref_entries(&p->ref[i]));
        cJSON_Delete(reply);
    }
}

static void run_plan(itest_daemon_t *d, bool expect_batches)
{
    plan_t p;
    size_t steps;
    int64_t batches, batched;

    memset(&p, 0, sizeof(p));
    plan_init(&p, d);
    start_all(&p);
    steps = step_all(&p);
    finish_all(&p);
    batches = itest_metric(d, "slotd_step_batches_total");
    batched = itest_metric(d, "slotd_batched_steps_total");
    if (expect_batches) {
        ck_assert_msg(batches > 0, "no batch ran in %zu steps", steps);
        ck_assert_int_ge(batched, 2 * batches);
        ck_assert_int_le(batched, (int64_t)steps);
    } else {
        ck_assert_int_eq(batches, 0);
        ck_assert_int_eq(batched, 0);
    }
    plan_free(&p);
}

START_TEST(test_batched_mixed_models)
{
    itest_daemon_t *d = itest_daemon_start("--models", "tiny,hash,small,base", "--threads", "2",
                                           "--max-batch", "64", "--batch-us", "0", NULL);
    run_plan(d, true);
}
END_TEST

START_TEST(test_no_batches)
{
    itest_daemon_t *d = itest_daemon_start("--models", "tiny,hash,small,base", "--threads", "2",
                                           "--max-batch", "1", NULL);
    run_plan(d, false);
}
END_TEST

START_TEST(test_batched_audited)
{
    /* Every step audited, batched or not: as many audits as steps (each
     * session's steps plus the starts are no audits), none diverging. */
    itest_daemon_t *d =
        itest_daemon_start("--models", "tiny,hash,small,base", "--threads", "2", "--max-batch", "8",
                           "--audit-rate", "1", "--batch-us", "0", NULL);
    plan_t p;
    size_t steps;

    memset(&p, 0, sizeof(p));
    plan_init(&p, d);
    start_all(&p);
    steps = step_all(&p);
    ck_assert_int_eq(itest_metric(d, "slotd_cache_audits_total"), (int64_t)steps);
    ck_assert_int_eq(itest_metric(d, "slotd_cache_divergence_total"), 0);
    ck_assert_int_gt(itest_metric(d, "slotd_step_batches_total"), 0);
    finish_all(&p);
    plan_free(&p);
}
END_TEST

#if SLOTD_FAULT_INJECTION
START_TEST(test_batched_damage_caught)
{
    /* The 30th step job's slot is damaged after it ran (in a batch or
     * not): the audit catches the divergence, and every reply the client
     * gets is still the reference (step_all() checks them all). */
    itest_daemon_t *d = itest_daemon_start("--models", "tiny,hash,small,base", "--threads", "2",
                                           "--max-batch", "64", "--audit-rate", "1",
                                           "--fault-corrupt-after", "30", "--batch-us", "0", NULL);
    plan_t p;

    memset(&p, 0, sizeof(p));
    plan_init(&p, d);
    start_all(&p);
    step_all(&p);
    ck_assert_int_ge(itest_metric(d, "slotd_cache_divergence_total"), 1);
    finish_all(&p);
    plan_free(&p);
}
END_TEST
#endif

int main(void)
{
    Suite *s = suite_create("integration_batch");

    itest_add_timeout(s, "batched_mixed_models", test_batched_mixed_models, 240);
    itest_add_timeout(s, "no_batches", test_no_batches, 240);
    itest_add_timeout(s, "batched_audited", test_batched_audited, 240);
#if SLOTD_FAULT_INJECTION
    itest_add_timeout(s, "batched_damage_caught", test_batched_damage_caught, 240);
#endif
    return itest_main(s);
}
