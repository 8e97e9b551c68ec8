/*
 * test_integration_lifetimes.c: how sessions and connections end.
 *
 * A session lives until finish, until its connection closes, or until it
 * has been idle longer than --idle-timeout; each releases its slot at once.
 * These tests close connections holding live sessions (orderly and with a
 * reset, idle and with steps still queued or a cached generate in flight)
 * and watch from another connection that every entry, slot and byte comes
 * back and that released.disconnect counts them; they leave one session
 * idle while another stays busy and check that only the idle one is reaped
 * (released.idle); and they fill --max-connections and check that the next
 * connection gets too_many_connections and is closed while the others serve
 * on.  Releases after a close happen on the daemon's own time, so the
 * figures are polled, within a bound.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "itest.h"

/* Polls stats on `c` until live_sessions and cache_entries are 0 and the
 * pool is empty; returns the last stats (owned by the caller). */
static cJSON *await_empty(itest_conn_t *c)
{
    cJSON *st = NULL;
    for (int i = 0; i < 500; i++) {
        cJSON_Delete(st);
        st = itest_stats(c);
        if (itest_int(st, "live_sessions") == 0 && itest_int(st, "cache_entries") == 0 &&
            itest_int(st, "pool_slots_used") == 0 && itest_int(st, "pool_bytes_used") == 0) {
            return st;
        }
        itest_sleep_ms(10);
    }
    ck_abort_msg("sessions of a closed connection were not released within 5 s: %s",
                 itest_last_line(c));
    return st;
}

static void await_connections(itest_conn_t *c, int64_t want)
{
    int64_t got = -1;
    for (int i = 0; i < 500; i++) {
        got = itest_stat(c, "connections");
        if (got == want) {
            return;
        }
        itest_sleep_ms(10);
    }
    ck_abort_msg("connections stayed %lld, expected %lld", (long long)got, (long long)want);
}

START_TEST(test_disconnect_releases)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *watch = itest_connect(d);
    itest_conn_t *c = itest_connect(d);
    int64_t p[] = {1, 2, 3};
    itest_session_t s[3];
    itest_session_init(&s[0], "a", "tiny", p, 3);
    itest_session_init(&s[1], "b", "hash", p, 2);
    itest_session_init(&s[2], "c", "tiny", p, 1);
    for (int i = 0; i < 3; i++) {
        itest_session_start(c, &s[i]);
    }
    itest_session_step(c, &s[0], 2);
    itest_session_step(c, &s[1], 10);
    cJSON *st = itest_stats(watch);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 3);
    ck_assert_int_eq(itest_int(st, "cache_entries"), 5 + 12 + 1);
    cJSON_Delete(st);

    /* The same ids live on the watching connection are not touched. */
    itest_session_t w;
    itest_session_init(&w, "a", "tiny", p, 2);
    itest_session_start(watch, &w);

    itest_close(c);
    st = NULL;
    for (int i = 0; i < 500; i++) {
        cJSON_Delete(st);
        st = itest_stats(watch);
        if (itest_int(st, "live_sessions") == 1) {
            break;
        }
        itest_sleep_ms(10);
    }
    ck_assert_int_eq(itest_int(st, "live_sessions"), 1);
    ck_assert_int_eq(itest_int(st, "cache_entries"), 2);
    ck_assert_int_eq(itest_int(st, "pool_slots_used"), 1);
    ck_assert_int_eq(itest_int(st, "released.disconnect"), 3);
    ck_assert_int_eq(itest_int(st, "released.finish"), 0);
    cJSON_Delete(st);
    itest_session_step(watch, &w, 2);
    itest_session_finish(watch, &w);
    st = itest_stats(watch);
    ck_assert_int_eq(itest_int(st, "pool_bytes_used"), 0);
    ck_assert_int_eq(itest_int(st, "released.finish"), 1);
    cJSON_Delete(st);
    for (int i = 0; i < 3; i++) {
        itest_session_free(&s[i]);
    }
    itest_session_free(&w);
    itest_close(watch);
}
END_TEST

/* Starts a hash session "q" on a new connection, queues `k` steps of n=20
 * and a few cached generates behind them, and closes at once (with a reset
 * if `reset`).  Returns after the daemon has released everything. */
static void close_with_queue(itest_daemon_t *d, itest_conn_t *watch, bool reset, int64_t *disc)
{
    itest_conn_t *c = itest_connect(d);
    cJSON *r =
        itest_rpc(c, "{\"op\":\"start\",\"id\":\"q\",\"model\":\"hash\",\"prompt\":[1,2,3]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"t\",\"prompt\":[1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    size_t cap = 200 * 80, o = 0;
    char *buf = malloc(cap);
    for (int i = 0; i < 200; i++) {
        if (i % 10 == 5) {
            o += (size_t)snprintf(
                buf + o, cap - o,
                "{\"op\":\"generate\",\"tokens\":[1],\"steps\":7,\"use_cache\":true}\n");
        } else if (i % 10 == 7) {
            o += (size_t)snprintf(buf + o, cap - o, "{\"op\":\"step\",\"id\":\"t\"}\n");
        } else {
            o += (size_t)snprintf(buf + o, cap - o, "{\"op\":\"step\",\"id\":\"q\",\"n\":20}\n");
        }
    }
    ck_assert(itest_send(c, buf, o));
    free(buf);
    if (reset) {
        itest_close_reset(c);
    } else {
        itest_close(c);
    }
    cJSON *st = await_empty(watch);
    ck_assert_int_eq(itest_int(st, "released.disconnect") - *disc, 2);
    *disc = itest_int(st, "released.disconnect");
    cJSON_Delete(st);
}

START_TEST(test_disconnect_with_queued_steps)
{
    itest_daemon_t *d = itest_daemon_start("--threads", "2", NULL);
    itest_conn_t *watch = itest_connect(d);
    int64_t disc = 0;
    for (int i = 0; i < 3; i++) {
        close_with_queue(d, watch, false, &disc);
        close_with_queue(d, watch, true, &disc);
    }
    /* The daemon serves on, and a new session with the old id starts clean. */
    itest_conn_t *c = itest_connect(d);
    int64_t p[] = {1, 2, 3};
    itest_session_t s;
    itest_session_init(&s, "q", "hash", p, 3);
    itest_session_start(c, &s);
    itest_session_step(c, &s, 20);
    itest_session_finish(c, &s);
    itest_session_free(&s);
    itest_close(c);
    itest_close(watch);
}
END_TEST

START_TEST(test_disconnect_half_sent_line)
{
    /* A connection that dies in the middle of a line, with a session. */
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *watch = itest_connect(d);
    itest_conn_t *c = itest_connect(d);
    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"h\",\"prompt\":[1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    ck_assert(itest_send_str(c, "{\"op\":\"step\",\"id\":\"h\""));
    itest_close(c);
    cJSON *st = await_empty(watch);
    ck_assert_int_eq(itest_int(st, "released.disconnect"), 1);
    cJSON_Delete(st);
    itest_close(watch);
}
END_TEST

START_TEST(test_connection_churn)
{
    /* 60 connections, each with a session, closed in turn (some with a
     * reset): every one is released and counted. */
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *watch = itest_connect(d);
    for (int i = 0; i < 60; i++) {
        itest_conn_t *c = itest_connect(d);
        cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"x\",\"prompt\":[%d,1]}", i % 6);
        itest_expect_ok(r);
        cJSON_Delete(r);
        if (i % 3 == 0) {
            itest_close_reset(c);
        } else {
            itest_close(c);
        }
    }
    cJSON *st = await_empty(watch);
    ck_assert_int_eq(itest_int(st, "released.disconnect"), 60);
    cJSON_Delete(st);
    await_connections(watch, 1);
    itest_close(watch);
}
END_TEST

START_TEST(test_idle_timeout)
{
    itest_daemon_t *d = itest_daemon_start("--idle-timeout", "1", NULL);
    itest_conn_t *c = itest_connect(d);
    itest_conn_t *quiet = itest_connect(d);
    int64_t p[] = {1, 2};
    itest_session_t busy;
    itest_session_init(&busy, "busy", "hash", p, 2);
    itest_session_start(c, &busy);
    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"idle\",\"prompt\":[1,2]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_rpc(quiet, "{\"op\":\"start\",\"id\":\"idle\",\"prompt\":[3]}");
    itest_expect_ok(r);
    cJSON_Delete(r);

    /* ~2.5 s: busy steps every 250 ms, idle and quiet's session do nothing. */
    int64_t end = itest_now_ms() + 2500;
    while (itest_now_ms() < end) {
        itest_session_step(c, &busy, 1);
        itest_sleep_ms(250);
    }
    r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"idle\"}");
    itest_expect_error(r, NULL, "unknown_id", "idle", NULL);
    cJSON_Delete(r);
    r = itest_rpc(quiet, "{\"op\":\"step\",\"id\":\"idle\"}");
    itest_expect_error(r, NULL, "unknown_id", "idle", NULL);
    cJSON_Delete(r);
    itest_session_step(c, &busy, 3);

    cJSON *st = itest_stats(c);
    ck_assert_int_eq(itest_int(st, "released.idle"), 2);
    ck_assert_int_eq(itest_int(st, "released.disconnect"), 0);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 1);
    ck_assert_int_eq(itest_int(st, "cache_entries"), (int64_t)itest_session_entries(&busy));
    ck_assert_int_eq(itest_int(st, "pool_slots_used"), 1);
    cJSON_Delete(st);

    /* A reaped id starts clean. */
    int64_t p2[] = {5};
    itest_session_t again;
    itest_session_init(&again, "idle", "tiny", p2, 1);
    itest_session_start(c, &again);
    itest_session_step(c, &again, 4);
    itest_session_finish(c, &again);
    itest_session_finish(c, &busy);
    itest_session_free(&again);
    itest_session_free(&busy);
    itest_close(c);
    itest_close(quiet);
}
END_TEST

START_TEST(test_max_connections)
{
    itest_daemon_t *d = itest_daemon_start("--max-connections", "2", NULL);
    itest_conn_t *c1 = itest_connect(d);
    /* The start-up probes may still count for a moment. */
    await_connections(c1, 1);
    itest_conn_t *c2 = itest_connect(d);
    cJSON *r = itest_rpc(c2, "{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    ck_assert_int_eq(itest_stat(c1, "connections"), 2);
    /* A start-up probe may have been turned away too (under valgrind the
     * probes linger): count from here. */
    int64_t errors0 = itest_metric(d, "slotd_errors_total{code=\"too_many_connections\"}");
    int64_t refused0 = itest_metric(d, "slotd_connections_refused_total");
    ck_assert_int_eq(errors0, refused0);

    for (int k = 0; k < 3; k++) {
        itest_conn_t *c3 = itest_connect(d);
        /* Whatever it sends, one line of too_many_connections, then closed. */
        itest_send_str(c3, "{\"op\":\"stats\"}\n");
        cJSON *e = itest_read_reply(c3);
        const cJSON *err = cJSON_GetObjectItemCaseSensitive(e, "error");
        ck_assert_msg(cJSON_IsObject(err), "the third connection was served: %s",
                      itest_last_line(c3));
        itest_expect_error(e, NULL, "too_many_connections", NULL);
        cJSON_Delete(e);
        ck_assert_msg(itest_expect_closed(c3, ITEST_REPLY_MS),
                      "the connection past --max-connections was not closed");
        itest_close(c3);
    }

    /* Each refusal is an error reply sent, and a refused connection. */
    ck_assert_int_eq(itest_metric(d, "slotd_errors_total{code=\"too_many_connections\"}") - errors0,
                     3);
    ck_assert_int_eq(itest_metric(d, "slotd_connections_refused_total") - refused0, 3);

    /* The two keep working. */
    int64_t p[] = {1};
    itest_session_t s;
    itest_session_init(&s, "a", "tiny", p, 1);
    itest_session_step(c2, &s, 2);
    cJSON *st = itest_stats(c1);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 1);
    cJSON_Delete(st);

    /* A slot frees when one closes. */
    itest_close(c2);
    await_connections(c1, 1);
    itest_conn_t *c4 = itest_connect(d);
    r = itest_rpc(c4, "{\"op\":\"stats\"}");
    itest_check_stats_shape(r);
    ck_assert_int_eq(itest_int(r, "connections"), 2);
    ck_assert_int_eq(itest_int(r, "live_sessions"), 0);
    cJSON_Delete(r);
    itest_session_free(&s);
    itest_close(c1);
    itest_close(c4);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("integration_lifetimes");
    ITEST_ADD(s, test_disconnect_releases);
    ITEST_ADD(s, test_disconnect_with_queued_steps);
    ITEST_ADD(s, test_disconnect_half_sent_line);
    ITEST_ADD(s, test_connection_churn);
    ITEST_ADD(s, test_idle_timeout);
    ITEST_ADD(s, test_max_connections);
    return itest_main(s);
}
