/*
 * test_integration_fork.c: `fork`, seen from a client of the real daemon.
 *
 * A fork holds exactly its parent's sequence: its first step is the
 * parent's next one, token and printed logits, and both follow the
 * uncached reference of their own sequence from then on.  No model call
 * is made (rows and g_calls do not move).  Nothing done to one changes the
 * other's replies, each way round: steps, appends, finish, the idle
 * timeout; a fork and its parent stepped alternately, pipelined on a
 * daemon with two workers; a connection closed while its forks are in
 * flight (the sanitizer builds would see a forked slot read after its
 * release).  Errors change nothing: from missing or unknown, id live, the
 * pool too small (cache_full); a fork pipelined behind its parent's start
 * waits for it.  With --audit-rate 1 the steps of forks are audited and
 * none diverges.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "itest.h"

static itest_seq_t *seq_new(void)
{
    itest_seq_t *s = calloc(1, sizeof(*s));
    ck_assert_ptr_nonnull(s);
    return s;
}

/* Sends fork `id` from `from` and checks the reply; `child` becomes a
 * copy of `from` under its new id. */
static void seq_fork(itest_conn_t *c, itest_seq_t *child, const itest_seq_t *from, const char *id)
{
    cJSON *r = itest_rpc(c, "{\"op\":\"fork\",\"id\":\"%s\",\"from\":\"%s\"}", id, from->id);
    itest_expect_ok(r);
    ck_assert_str_eq(itest_str(r, "id"), id);
    ck_assert_str_eq(itest_str(r, "model"), from->model);
    ck_assert_int_eq(itest_int(r, "entries"), (int64_t)from->len);
    ck_assert_int_eq(itest_int(r, "cached"), (int64_t)from->len);
    cJSON_Delete(r);
    *child = *from;
    snprintf(child->id, sizeof(child->id), "%s", id);
}

static void expect_live(itest_conn_t *c, int64_t sessions, int64_t entries)
{
    cJSON *st = itest_stats(c);
    ck_assert_int_eq(itest_int(st, "live_sessions"), sessions);
    ck_assert_int_eq(itest_int(st, "cache_entries"), entries);
    cJSON_Delete(st);
}

/* The fork's first step is the parent's next, and no model call is made. */
START_TEST(test_fork_reference)
{
    static const char *const models[] = {"tiny", "small", "hash"};
    itest_daemon_t *d = itest_daemon_start("--models", "tiny,small,hash", NULL);
    itest_conn_t *c = itest_connect(d);
    itest_seq_t *a = seq_new(), *b = seq_new();

    for (int k = 0; k < 3; k++) {
        const char *m = models[k];
        itest_seq_start(c, a, "a", m, k == 0 ? 1 : 40);
        itest_seq_step(c, a, 2);
        int64_t rows = itest_stat(c, "rows"), g = itest_stat(c, "g_calls");
        seq_fork(c, b, a, "b");
        ck_assert_int_eq(itest_stat(c, "rows"), rows);
        ck_assert_int_eq(itest_stat(c, "g_calls"), g);
        expect_live(c, 2, (int64_t)(a->len + b->len));
        itest_seq_step(c, b, 1);
        itest_seq_step(c, a, 1);
        /* Apart from here on: different appends, then steps. */
        itest_seq_append(c, a, 1, 300);
        itest_seq_append(c, b, 2, 400);
        itest_seq_step(c, a, 1);
        itest_seq_step(c, b, 1);
        /* A fork of a fork. */
        itest_seq_t *e = seq_new();
        seq_fork(c, e, b, "e");
        itest_seq_step(c, e, 1);
        itest_seq_step(c, b, 1);
        expect_live(c, 3, (int64_t)(a->len + b->len + e->len));
        for (const itest_seq_t *s = a; s != NULL; s = s == a ? b : s == b ? e : NULL) {
            cJSON *r = itest_rpc(c, "{\"op\":\"finish\",\"id\":\"%s\"}", s->id);
            itest_expect_ok(r);
            ck_assert_int_eq(itest_int(r, "released"), (int64_t)s->len);
            cJSON_Delete(r);
        }
        expect_live(c, 0, 0);
        ck_assert_int_eq(itest_stat(c, "pool_bytes_used"), 0);
        free(e);
    }
    free(a);
    free(b);
    itest_close(c);
}
END_TEST

/* Finishing one, either way round, leaves the other's replies as they
 * were: the survivor keeps stepping and appending by the reference. */
START_TEST(test_fork_finish_either)
{
    itest_daemon_t *d = itest_daemon_start("--models", "small,tiny", NULL);
    itest_conn_t *c = itest_connect(d);

    for (int way = 0; way < 2; way++) {
        itest_seq_t *a = seq_new(), *b = seq_new();
        itest_seq_start(c, a, "a", "small", 30);
        itest_seq_step(c, a, 3);
        seq_fork(c, b, a, "b");
        itest_seq_t *gone = way == 0 ? a : b, *kept = way == 0 ? b : a;
        itest_seq_step(c, gone, 2);
        cJSON *r = itest_rpc(c, "{\"op\":\"finish\",\"id\":\"%s\"}", gone->id);
        itest_expect_ok(r);
        cJSON_Delete(r);
        itest_seq_step(c, kept, 3);
        itest_seq_append(c, kept, 5, 77);
        itest_seq_step(c, kept, 2);
        expect_live(c, 1, (int64_t)kept->len);
        r = itest_rpc(c, "{\"op\":\"finish\",\"id\":\"%s\"}", kept->id);
        itest_expect_ok(r);
        cJSON_Delete(r);
        free(a);
        free(b);
    }
    itest_close(c);
}
END_TEST

/* The idle timeout of one, either way round: the other, kept busy, goes
 * on by the reference.  Waits for the release, polling. */
START_TEST(test_fork_idle_either)
{
    itest_daemon_t *d = itest_daemon_start("--idle-timeout", "1", "--models", "hash,tiny", NULL);
    itest_conn_t *c = itest_connect(d);

    for (int way = 0; way < 2; way++) {
        itest_seq_t *a = seq_new(), *b = seq_new();
        itest_seq_start(c, a, "a", "hash", 10);
        itest_seq_step(c, a, 2);
        seq_fork(c, b, a, "b");
        itest_seq_t *idle = way == 0 ? a : b, *busy = way == 0 ? b : a;
        int64_t idled = itest_stat(c, "released.idle");
        int64_t deadline = itest_now_ms() + itest_scale_ms(20000);
        while (itest_stat(c, "released.idle") == idled) {
            ck_assert_msg(itest_now_ms() < deadline, "the idle session was never released");
            itest_seq_step(c, busy, 1);
            itest_sleep_ms(50);
        }
        cJSON *r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"%s\"}", idle->id);
        itest_expect_error(r, NULL, "unknown_id", NULL);
        cJSON_Delete(r);
        itest_seq_append(c, busy, 3, 11);
        itest_seq_step(c, busy, 2);
        expect_live(c, 1, (int64_t)busy->len);
        r = itest_rpc(c, "{\"op\":\"finish\",\"id\":\"%s\"}", busy->id);
        itest_expect_ok(r);
        cJSON_Delete(r);
        free(a);
        free(b);
    }
    itest_close(c);
}
END_TEST

/* A fork and its parent stepped alternately, pipelined, on two workers:
 * several pairs at once, so that a fork's step and its parent's run on
 * different workers at the same time. */
START_TEST(test_fork_alternate)
{
    enum { PAIRS = 4, ROUNDS = 12 };
    itest_daemon_t *d = itest_daemon_start("--threads", "2", "--models", "small,tiny", NULL);
    itest_conn_t *c = itest_connect(d);
    itest_seq_t *s[2 * PAIRS];

    for (int p = 0; p < PAIRS; p++) {
        char id[16];
        s[2 * p] = seq_new();
        s[2 * p + 1] = seq_new();
        snprintf(id, sizeof(id), "p%d", p);
        itest_seq_start(c, s[2 * p], id, "small", 20 + (size_t)p);
        snprintf(id, sizeof(id), "f%d", p);
        seq_fork(c, s[2 * p + 1], s[2 * p], id);
    }
    for (int k = 0; k < ROUNDS; k++)
        for (int i = 0; i < 2 * PAIRS; i++)
            ck_assert(itest_sendf(c, "{\"op\":\"step\",\"id\":\"%s\"}\n", s[i]->id));
    for (int k = 0; k < ROUNDS; k++)
        for (int i = 0; i < 2 * PAIRS; i++) {
            cJSON *r = itest_read_reply(c);
            itest_seq_check_step(s[i], r, itest_last_line(c), 1);
            cJSON_Delete(r);
        }
    /* Both of a pair picked the same tokens: they hold one sequence. */
    for (int p = 0; p < PAIRS; p++) {
        ck_assert_uint_eq(s[2 * p]->len, s[2 * p + 1]->len);
        ck_assert(memcmp(s[2 * p]->tok, s[2 * p + 1]->tok, s[2 * p]->len * sizeof(int64_t)) == 0);
    }
    for (int i = 0; i < 2 * PAIRS; i++)
        free(s[i]);
    itest_close(c);
}
END_TEST

/* Forks, steps and appends pipelined, then the connection closed before
 * the replies are read: every slot is released (on another connection,
 * cache_entries goes back to 0), and the daemon serves on. */
START_TEST(test_fork_disconnect)
{
    itest_daemon_t *d = itest_daemon_start("--threads", "2", "--models", "small,tiny", NULL);
    itest_conn_t *o = itest_connect(d);
    itest_seq_t *keep = seq_new(), *kf = seq_new();

    /* A pair on the connection that stays. */
    itest_seq_start(o, keep, "k", "small", 16);
    seq_fork(o, kf, keep, "kf");
    for (int round = 0; round < 5; round++) {
        itest_conn_t *c = itest_connect(d);
        int64_t p[40];
        for (int i = 0; i < 40; i++)
            p[i] = itest_seq_token("small", (size_t)i);
        char *pj = itest_json_tokens(p, 40);
        ck_assert(itest_sendf(
            c, "{\"op\":\"start\",\"id\":\"a\",\"model\":\"small\",\"prompt\":%s}\n", pj));
        free(pj);
        for (int i = 0; i < 20; i++)
            ck_assert(itest_sendf(c,
                                  "{\"op\":\"fork\",\"id\":\"b%d\",\"from\":\"a\"}\n"
                                  "{\"op\":\"step\",\"id\":\"b%d\",\"n\":2}\n"
                                  "{\"op\":\"append\",\"id\":\"a\",\"tokens\":[1,2]}\n",
                                  i, i));
        if (round % 2 == 0)
            itest_close_reset(c);
        else
            itest_close(c);
        itest_seq_step(o, kf, 1);
        itest_seq_step(o, keep, 1);
    }
    int64_t deadline = itest_now_ms() + itest_scale_ms(20000);
    while (itest_stat(o, "live_sessions") != 2) {
        ck_assert_msg(itest_now_ms() < deadline, "the closed connections' sessions stayed");
        itest_sleep_ms(20);
    }
    expect_live(o, 2, (int64_t)(keep->len + kf->len));
    free(keep);
    free(kf);
    itest_close(o);
}
END_TEST

START_TEST(test_fork_errors)
{
    itest_daemon_t *d = itest_daemon_start("--models", "small,tiny", NULL);
    itest_conn_t *c = itest_connect(d);
    itest_seq_t *a = seq_new(), *b = seq_new();
    cJSON *r;

    itest_seq_start(c, a, "a", "tiny", 3);
    int64_t bytes = itest_stat(c, "pool_bytes_used");
    static const struct {
        const char *line, *code, *word;
    } bad[] = {
        {"{\"op\":\"fork\",\"id\":\"b\"}", "bad_request", "from"},
        {"{\"op\":\"fork\",\"from\":\"a\"}", "bad_request", "id"},
        {"{\"op\":\"fork\",\"id\":\"b\",\"from\":7}", "bad_request", "from"},
        {"{\"op\":\"fork\",\"id\":\"b\",\"from\":\"\"}", "bad_request", "from"},
        {"{\"op\":\"fork\",\"id\":\"b\",\"from\":\"a b\"}", "bad_request", "from"},
        {"{\"op\":\"fork\",\"id\":\"b\",\"from\":\"z\"}", "unknown_id", "z"},
        {"{\"op\":\"fork\",\"id\":\"a\",\"from\":\"a\"}", "duplicate_id", "a"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        r = itest_rpc(c, "%s", bad[i].line);
        itest_expect_error(r, NULL, bad[i].code, bad[i].word, NULL);
        cJSON_Delete(r);
        expect_live(c, 1, 3);
        ck_assert_int_eq(itest_stat(c, "pool_bytes_used"), bytes);
    }
    /* A live fork's id is taken too; a finished one's is free again. */
    seq_fork(c, b, a, "b");
    r = itest_rpc(c, "{\"op\":\"fork\",\"id\":\"b\",\"from\":\"a\",\"tag\":3}");
    itest_expect_error(r, "3", "duplicate_id", "b", NULL);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"finish\",\"id\":\"b\"}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    seq_fork(c, b, a, "b");
    itest_seq_step(c, b, 1);
    itest_seq_step(c, a, 1);

    /* Pipelined behind its parent's start, and behind a start that
     * fails (unknown_id then), and then a step of the fork. */
    ck_assert(itest_sendf(c, "{\"op\":\"start\",\"id\":\"p\",\"model\":\"tiny\",\"prompt\":[1,2]}\n"
                             "{\"op\":\"fork\",\"id\":\"q\",\"from\":\"p\"}\n"
                             "{\"op\":\"step\",\"id\":\"q\"}\n"
                             "{\"op\":\"start\",\"id\":\"x\",\"model\":\"tiny\",\"prompt\":[9]}\n"
                             "{\"op\":\"fork\",\"id\":\"y\",\"from\":\"x\"}\n"));
    r = itest_read_reply(c);
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_read_reply(c);
    itest_expect_ok(r);
    ck_assert_int_eq(itest_int(r, "entries"), 2);
    cJSON_Delete(r);
    itest_seq_t *q = seq_new();
    snprintf(q->id, sizeof(q->id), "q");
    q->model = "tiny";
    q->tok[0] = 1;
    q->tok[1] = 2;
    q->len = 2;
    r = itest_read_reply(c);
    itest_seq_check_step(q, r, itest_last_line(c), 1);
    cJSON_Delete(r);
    r = itest_read_reply(c);
    itest_expect_error(r, NULL, "bad_request", "prompt", NULL);
    cJSON_Delete(r);
    r = itest_read_reply(c);
    itest_expect_error(r, NULL, "unknown_id", "x", NULL);
    cJSON_Delete(r);
    free(q);
    free(a);
    free(b);
    itest_close(c);
}
END_TEST

/* A pool of 1 MiB: a fork copies no entry, so the fork of a 150-entry
 * session fits where a copy would not (the pool's bytes grow by less than
 * a block).  Its first step must first copy the partly filled block it
 * shares with its parent: with the pool full (another session took the
 * rest) that step is cache_full and changes nothing; with room again, the
 * fork and its parent pick the same tokens. */
START_TEST(test_fork_cache_full)
{
    itest_daemon_t *d =
        itest_daemon_start("--cache-mb", "1", "--models", "small", "--default-model", "small",
                           "--preload", "small", "--max-connection-share", "1", NULL);
    itest_conn_t *c = itest_connect(d);
    itest_seq_t *a = seq_new(), *b = seq_new(), *x = seq_new();
    int64_t bytes, block;
    cJSON *r;

    itest_seq_start(c, a, "a", "small", 150);
    bytes = itest_stat(c, "pool_bytes_used");
    seq_fork(c, b, a, "b");
    expect_live(c, 2, 300);
    block = 16 * 2 * 4 * 64 * 8; /* a block of small's largest capacity: 16 entries of 4 KiB */
    ck_assert_int_lt(itest_stat(c, "pool_bytes_used") - bytes, block);
    ck_assert_int_gt(itest_stat(c, "pool_bytes_used"), bytes);
    /* x takes what is left. */
    itest_seq_start(c, x, "x", "small", 1);
    for (;;) {
        r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"x\"}");
        if (cJSON_GetObjectItem(r, "error") != NULL) {
            itest_expect_error(r, NULL, "cache_full", NULL);
            cJSON_Delete(r);
            break;
        }
        cJSON_Delete(r);
    }
    bytes = itest_stat(c, "pool_bytes_used");
    r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"b\"}");
    itest_expect_error(r, NULL, "cache_full", NULL);
    cJSON_Delete(r);
    ck_assert_int_eq(itest_stat(c, "pool_bytes_used"), bytes);
    r = itest_rpc(c, "{\"op\":\"finish\",\"id\":\"x\"}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    expect_live(c, 2, 300);
    itest_seq_step(c, b, 2);
    itest_seq_step(c, a, 2);
    ck_assert(memcmp(a->tok, b->tok, a->len * sizeof(int64_t)) == 0);
    free(a);
    free(b);
    free(x);
    itest_close(c);
}
END_TEST

/* Steps of forks are audited against the reference of their sequence,
 * which the fork copied from its parent's recording. */
START_TEST(test_fork_audit)
{
    itest_daemon_t *d = itest_daemon_start("--audit-rate", "1", "--models", "small,tiny", NULL);
    itest_conn_t *c = itest_connect(d);
    itest_seq_t *a = seq_new(), *b = seq_new();

    itest_seq_start(c, a, "a", "small", 12);
    itest_seq_step(c, a, 1);
    itest_seq_append(c, a, 3, 8);
    seq_fork(c, b, a, "b");
    itest_seq_step(c, b, 2);
    itest_seq_append(c, b, 1, 9);
    itest_seq_step(c, b, 1);
    itest_seq_step(c, a, 1);
    ck_assert_int_eq(itest_metric(d, "slotd_cache_audits_total"), 4);
    ck_assert_int_eq(itest_metric(d, "slotd_cache_divergence_total"), 0);
    free(a);
    free(b);
    itest_close(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("integration_fork");
    itest_add(s, "fork_reference", test_fork_reference);
    itest_add(s, "fork_finish_either", test_fork_finish_either);
    itest_add_timeout(s, "fork_idle_either", test_fork_idle_either, 60);
    itest_add(s, "fork_alternate", test_fork_alternate);
    itest_add(s, "fork_disconnect", test_fork_disconnect);
    itest_add(s, "fork_errors", test_fork_errors);
    itest_add(s, "fork_cache_full", test_fork_cache_full);
    itest_add(s, "fork_audit", test_fork_audit);
    return itest_main(s);
}
