/*
 * test_integration_conn.c: the life of a session connection at its edges,
 * against the real daemon: --conn-timeout (a connection with nothing to
 * do and no byte received for that long is closed, one with a session, a
 * request or an unsent reply is not); running out of file descriptors
 * (the daemon counts and logs failed accepts, turns the connection away,
 * serves the connections it has, does not spin, and accepts again once
 * descriptors free up); a drain whose lingering closes must end before
 * --shutdown-timeout; and the replies of a pipelined burst leaving in one
 * write (--reply-hold-us).
 *
 * Every wait is bounded and scaled by SLOTD_TIME_SCALE; no check is on
 * speed.  The descriptor case is left out under SLOTD_WRAPPER (valgrind
 * needs descriptors of its own).
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "itest.h"

#define TIMEOUT_METRIC "slotd_connections_closed_total{reason=\"timeout\"}"

/* Occurrences of `needle` in the daemon's log so far. */
static int log_count(const itest_daemon_t *d, const char *needle)
{
    FILE *f = fopen(d->log, "r");
    char line[1024];
    int n = 0;
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f) != NULL) {
        n += strstr(line, needle) != NULL;
    }
    fclose(f);
    return n;
}

/* True if the daemon has closed `c` (EOF or reset), waiting up to `ms`;
 * fails the test if a byte comes instead. */
static bool closed_within(itest_conn_t *c, int ms)
{
    size_t before = itest_pending(c);
    bool closed = itest_expect_closed(c, ms);
    ck_assert_msg(itest_pending(c) == before, "bytes came on a quiet connection");
    return closed;
}

/* ---- --conn-timeout ---- */

START_TEST(test_conn_timeout)
{
    /* 1 s, or the time scale's worth for a slow daemon. */
    int secs = (int)(itest_time_scale() + 0.5);
    char timeout[16], quiet_log[80];
    snprintf(timeout, sizeof(timeout), "%d", secs < 1 ? 1 : secs);
    snprintf(quiet_log, sizeof(quiet_log), "quiet for %s s with nothing to do; closing it",
             timeout);
    itest_daemon_t *d = itest_daemon_start("--conn-timeout", timeout, "--log-level", "debug",
                                           "--models", "tiny,hash,small", NULL);
    ck_assert_int_eq(itest_metric(d, TIMEOUT_METRIC), 0);

    itest_conn_t *quiet = itest_connect(d);   /* never sends */
    itest_conn_t *partial = itest_connect(d); /* half a line, then nothing */
    ck_assert(itest_send_str(partial, "{\"op\":\"sta"));
    itest_conn_t *busy = itest_connect(d); /* a stats every 300 ms, then nothing */
    itest_conn_t *live = itest_connect(d); /* a live session, then silence */
    int64_t p[] = {4, 2};
    itest_session_t s;
    itest_session_init(&s, "k", "hash", p, 2);
    itest_session_start(live, &s);
    /* A client that does not read: its jobs held back (about 1 MB of reply
     * each, 40 MB in all: more than the socket buffers between take), its
     * replies unsent; then silence. */
    itest_conn_t *held = itest_connect(d);
    enum { NGEN = 40 };
    for (int i = 0; i < NGEN; i++) {
        ck_assert(itest_send_str(held, "{\"op\":\"generate\",\"model\":\"small\",\"tokens\":[1],"
                                       "\"steps\":200,\"use_cache\":true}\n"));
    }

    /* 2.4 timeouts. */
    for (int i = 0; i < 8; i++) {
        cJSON_Delete(itest_stats(busy));
        itest_sleep_ms(itest_scale_ms(300));
    }
    /* The busy one and the one with a session are open (a stats answers
     * at once, with no worker), the quiet ones are gone. */
    cJSON_Delete(itest_stats(busy));
    cJSON_Delete(itest_stats(live));
    ck_assert_msg(closed_within(quiet, itest_scale_ms(2000)), "a quiet connection stayed open");
    ck_assert_msg(closed_within(partial, itest_scale_ms(2000)),
                  "a connection silent after half a line stayed open");
    ck_assert_int_eq(itest_metric(d, TIMEOUT_METRIC), 2);
    ck_assert_int_eq(log_count(d, quiet_log), 2);
    /* The session goes on (its step may wait for the workers). */
    itest_session_step(live, &s, 3);

    /* Every reply of the held one arrives. */
    char *first = NULL;
    for (int i = 0; i < NGEN; i++) {
        char *r = itest_read_line(held, ITEST_REPLY_MS, NULL);
        ck_assert_msg(r != NULL, "generate reply %d did not come", i);
        ck_assert_msg(strstr(r, "\"error\"") == NULL, "generate reply %d: %.200s", i, r);
        if (first == NULL) {
            first = r;
        } else {
            ck_assert_msg(strcmp(r, first) == 0, "generate reply %d differs from the first", i);
            free(r);
        }
    }
    free(first);

    /* Once each has nothing left to do, its timeout runs: the stats
     * stopped, the replies read, the session finished. */
    ck_assert_msg(closed_within(busy, itest_scale_ms(5000)),
                  "a connection that stopped sending stayed open");
    ck_assert_msg(closed_within(held, itest_scale_ms(5000)),
                  "a connection whose replies were all read stayed open");
    itest_session_finish(live, &s);
    itest_session_free(&s);
    ck_assert_msg(closed_within(live, itest_scale_ms(5000)),
                  "a connection whose session finished stayed open");
    ck_assert_int_eq(itest_metric(d, TIMEOUT_METRIC), 5);
    cJSON *st = itest_admin_stats(d);
    ck_assert_int_eq(itest_int(st, "connections"), 0);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 0);
    ck_assert_int_eq(itest_int(st, "released.disconnect"), 0);
    cJSON_Delete(st);
    itest_close(quiet);
    itest_close(partial);
    itest_close(busy);
    itest_close(live);
    itest_close(held);
}
END_TEST

/* Without --conn-timeout (0, the default) a quiet connection stays. */
START_TEST(test_conn_timeout_off)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *quiet = itest_connect(d);
    ck_assert_msg(!closed_within(quiet, itest_scale_ms(2500)), "a quiet connection was closed");
    cJSON_Delete(itest_stats(quiet));
    ck_assert_int_eq(itest_metric(d, TIMEOUT_METRIC), 0);
    itest_close(quiet);
}
END_TEST

/* ---- Out of file descriptors ---- */

/* An admin connection kept open (HTTP/1.1 keep-alive), to ask while the
 * daemon has no descriptor left for a new one. */
typedef struct keepalive {
    int fd;
    char buf[1 << 20]; /* /metrics is about 150 KB with four models served */
    size_t len;
} keepalive_t;

static void ka_open(keepalive_t *k, const itest_daemon_t *d)
{
    struct sockaddr_in sa;
    memset(k, 0, sizeof(*k));
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons((uint16_t)d->admin_port);
    k->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(k->fd, 0);
    ck_assert_int_eq(connect(k->fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
}

/* GET `path` on the kept connection; returns the status, and the body in
 * k->buf (NUL-terminated). */
static int ka_get(keepalive_t *k, const char *path)
{
    char req[256];
    int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path);
    ck_assert_int_eq(send(k->fd, req, (size_t)n, MSG_NOSIGNAL), n);
    k->len = 0;
    int64_t deadline = itest_now_ms() + ITEST_REPLY_MS;
    for (;;) {
        k->buf[k->len] = '\0';
        char *end = strstr(k->buf, "\r\n\r\n");
        char *cl = strstr(k->buf, "Content-Length: ");
        if (end != NULL && cl != NULL) {
            size_t want = (size_t)(end + 4 - k->buf) + (size_t)strtoul(cl + 16, NULL, 10);
            if (k->len >= want) {
                int status = atoi(k->buf + 9);
                memmove(k->buf, end + 4, k->len - (size_t)(end + 4 - k->buf) + 1);
                return status;
            }
        }
        int64_t left = deadline - itest_now_ms();
        ck_assert_msg(left > 0, "GET %s on the kept admin connection: no whole response", path);
        struct pollfd pfd = {.fd = k->fd, .events = POLLIN};
        if (poll(&pfd, 1, (int)left) <= 0) {
            continue;
        }
        ssize_t got = recv(k->fd, k->buf + k->len, sizeof(k->buf) - 1 - k->len, 0);
        ck_assert_msg(got > 0, "GET %s: the kept admin connection closed", path);
        k->len += (size_t)got;
    }
}

static int64_t ka_metric(keepalive_t *k, const char *name)
{
    ck_assert_int_eq(ka_get(k, "/metrics"), 200);
    size_t n = strlen(name);
    for (const char *p = k->buf; p != NULL && *p != '\0';) {
        if (strncmp(p, name, n) == 0 && p[n] == ' ') {
            return strtoll(p + n + 1, NULL, 10);
        }
        p = strchr(p, '\n');
        p = p != NULL ? p + 1 : NULL;
    }
    ck_abort_msg("no sample %s in /metrics", name);
    return -1;
}

/* CPU time the daemon has used (utime + stime), in clock ticks. */
static long daemon_cpu_ticks(const itest_daemon_t *d)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)d->pid);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* after the command name */
    ck_assert_ptr_nonnull(p);
    unsigned long ut = 0, st = 0;
    /* Fields 3.. after ")": state ppid pgrp session tty tpgid flags minflt
     * cminflt majflt cmajflt utime stime. */
    ck_assert_int_eq(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st),
                     2);
    return (long)(ut + st);
}

/* A new session connection: true if it was served (a stats reply), false if
 * it was turned away (the too_many_connections line, then the close). */
static bool try_session_conn(const itest_daemon_t *d, itest_conn_t **out)
{
    itest_conn_t *c = itest_connect(d);
    ck_assert(itest_send_str(c, "{\"op\":\"stats\"}\n"));
    char *line = itest_read_line(c, ITEST_REPLY_MS, NULL);
    ck_assert_msg(line != NULL, "a new connection got no line at all (%s)",
                  itest_last_io(c) == ITEST_IO_TIMEOUT ? "timeout" : "closed");
    if (strstr(line, "\"too_many_connections\"") != NULL) {
        ck_assert_msg(strstr(line, "file descriptors") != NULL, "turned away: %s", line);
        free(line);
        ck_assert(itest_expect_closed(c, ITEST_REPLY_MS));
        itest_close(c);
        *out = NULL;
        return false;
    }
    ck_assert_msg(strstr(line, "\"cache_entries\":") != NULL, "not stats: %s", line);
    free(line);
    *out = c;
    return true;
}

START_TEST(test_conn_out_of_fds)
{
    enum { NOFILE = 48, MAXC = NOFILE + 16 };
    itest_daemon_nofile(NOFILE);
    itest_daemon_t *d = itest_daemon_start("--threads", "1", NULL);
    itest_daemon_nofile(0);
    keepalive_t *k = malloc(sizeof(*k));
    ck_assert_ptr_nonnull(k);
    ka_open(k, d);
    ck_assert_int_eq(ka_metric(k, "slotd_accept_errors_total"), 0);

    /* Connections until one is turned away. */
    itest_conn_t *c[MAXC];
    int n = 0;
    while (n < MAXC && try_session_conn(d, &c[n])) {
        n++;
    }
    ck_assert_msg(n >= 10 && n < NOFILE, "%d connections served under RLIMIT_NOFILE %d", n, NOFILE);
    /* More, each turned away, while the daemon is watched for spinning. */
    long cpu0 = daemon_cpu_ticks(d);
    int64_t t0 = itest_now_ms();
    for (int i = 0; i < 5; i++) {
        itest_conn_t *x;
        ck_assert(!try_session_conn(d, &x));
        itest_sleep_ms(itest_scale_ms(200));
    }
    long ticks = daemon_cpu_ticks(d) - cpu0;
    int64_t span = itest_now_ms() - t0;
    long hz = sysconf(_SC_CLK_TCK);
    fprintf(stderr,
            "out of descriptors: %d connections served under RLIMIT_NOFILE %d; the daemon used "
            "%ld ms of CPU in %lld ms while turning 5 more away\n",
            n, NOFILE, ticks * 1000 / hz, (long long)span);
    ck_assert_msg(ticks * 1000 / hz < span / 2, "the daemon used %ld ms of CPU in %lld ms",
                  ticks * 1000 / hz, (long long)span);

    /* Counted, logged once (the warnings are at least 10 s apart), and
     * /health still answers on the kept admin connection. */
    int64_t errors = ka_metric(k, "slotd_accept_errors_total");
    ck_assert_msg(errors == 6, "slotd_accept_errors_total %lld after 6 connections turned away",
                  (long long)errors);
    ck_assert_int_eq(ka_get(k, "/health"), 200);
    ck_assert_int_eq(log_count(d, "warn  accept: "), 1);

    /* The connections it has are served: a session on the last one. */
    for (int i = 0; i < n; i++) {
        cJSON_Delete(itest_stats(c[i]));
    }
    int64_t p[] = {7};
    itest_ref_t r;
    itest_ref_init(&r, "f", "hash", p, 1, 20);
    char *line = itest_ref_start_line(&r);
    ck_assert(itest_send_str(c[n - 1], line));
    free(line);
    cJSON_Delete(itest_read_reply(c[n - 1]));
    itest_ref_step(c[n - 1], &r, 20);
    itest_ref_free(&r);
    cJSON *fin = itest_rpc(c[n - 1], "{\"op\":\"finish\",\"id\":\"f\"}");
    itest_expect_ok(fin);
    cJSON_Delete(fin);

    /* Three go: new connections are served again. */
    for (int i = 0; i < 3; i++) {
        itest_close(c[--n]);
    }
    itest_conn_t *again = NULL;
    int64_t deadline = itest_now_ms() + itest_scale_ms(5000);
    while (!try_session_conn(d, &again)) {
        ck_assert_msg(itest_now_ms() < deadline, "no connection accepted after three closed");
        itest_sleep_ms(50);
    }
    cJSON_Delete(itest_stats(again));
    itest_close(again);
    for (int i = 0; i < n; i++) {
        itest_close(c[i]);
    }
    close(k->fd);
    free(k);
}
END_TEST

/* ---- Replies held for the rest of a pipelined burst ---- */

/* Sixteen starts of `small` sessions with prompts of different lengths
 * (so that their jobs end at different times on the two workers), sent in
 * one write, are read in one read and answered in one write
 * (slotd_socket_*_total), in request order: with --reply-hold-us of 2 s,
 * finished replies wait while more jobs of the connection are out, and go
 * as soon as the last one is back, long before the hold would end.
 * A step of each then matches the uncached reference. */
START_TEST(test_conn_burst_one_write)
{
    char hold[24];
    int hold_ms = itest_scale_ms(2000) < 10000 ? itest_scale_ms(2000) : 10000; /* at most 10 s */
    snprintf(hold, sizeof(hold), "%d", hold_ms * 1000);
    itest_daemon_t *d = itest_daemon_start("--threads", "2", "--models", "tiny,small",
                                           "--reply-hold-us", hold, NULL);
    itest_conn_t *c = itest_connect(d);
    enum { N = 16, LEN0 = 24 };
    itest_session_t ss[N];
    static char buf[N * 8 * (LEN0 + 2 * N)];
    size_t len = 0;

    for (int i = 0; i < N; i++) {
        int64_t p[LEN0 + 2 * N];
        size_t n = LEN0 + 2 * (size_t)i;
        char id[16];
        snprintf(id, sizeof(id), "s%d", i);
        len += (size_t)snprintf(buf + len, sizeof(buf) - len,
                                "{\"op\":\"start\",\"id\":\"%s\",\"model\":\"small\",\"prompt\":[",
                                id);
        for (size_t j = 0; j < n; j++) {
            p[j] = (int64_t)((j * 37 + (size_t)i * 11) % 512);
            len += (size_t)snprintf(buf + len, sizeof(buf) - len, "%s%lld", j ? "," : "",
                                    (long long)p[j]);
        }
        len += (size_t)snprintf(buf + len, sizeof(buf) - len, "]}\n");
        itest_session_init(&ss[i], id, "small", p, n);
    }
    ck_assert_uint_lt(len, sizeof(buf) - 1);
    int64_t reads = itest_metric(d, "slotd_socket_reads_total");
    int64_t writes = itest_metric(d, "slotd_socket_writes_total");
    int64_t t0 = itest_now_ms();
    ck_assert(itest_send(c, buf, len));
    for (int i = 0; i < N; i++) {
        cJSON *r = itest_read_reply(c);
        ck_assert_str_eq(itest_str(r, "id"), ss[i].id);
        ck_assert_int_eq(itest_int(r, "entries"), (int64_t)ss[i].nprompt);
        cJSON_Delete(r);
    }
    int64_t took = itest_now_ms() - t0;
    reads = itest_metric(d, "slotd_socket_reads_total") - reads;
    writes = itest_metric(d, "slotd_socket_writes_total") - writes;
    fprintf(stderr, "a burst of %d starts (%zu bytes): %lld read(s), %lld write(s), answered in %lld ms\n",
            N, len, (long long)reads, (long long)writes, (long long)took);
    ck_assert_int_eq(reads, 1);
    ck_assert_int_eq(writes, 1);
    ck_assert_msg(took < hold_ms * 3 / 4,
                  "the burst took %lld ms: its replies waited for the %d ms hold to end",
                  (long long)took, hold_ms);
    for (int i = 0; i < N; i++) {
        itest_session_step(c, &ss[i], 1);
        itest_session_finish(c, &ss[i]);
        itest_session_free(&ss[i]);
    }
    itest_close(c);
}
END_TEST

/* ---- A drain's lingering closes end before --shutdown-timeout ---- */

/* A client pipelines stats without reading until the daemon stops reading
 * it, then SIGTERM: the daemon answers every line it read and every
 * complete line already in its socket (there are some: the client filled
 * it), shuts down its sending side and discards what comes after.  The client reads
 * every reply and the EOF but keeps its socket open, so the lingering
 * close can only end by its deadline: within --shutdown-timeout (1 s), for
 * the daemon to exit 0, though a lingering close otherwise waits 2 s. */
START_TEST(test_conn_drain_linger_bounded)
{
    char timeout[16];
    int secs = (int)(itest_time_scale() + 0.5);
    snprintf(timeout, sizeof(timeout), "%d", secs < 1 ? 1 : secs);
    itest_daemon_t *d = itest_daemon_start("--shutdown-timeout", timeout, NULL);
    int64_t read_lines;
    itest_conn_t *h = itest_stall_with_stats(d, 100000, 0, &read_lines);
    int64_t t0 = itest_now_ms();
    itest_daemon_signal(d, SIGTERM);
    long lines = 0;
    for (;;) {
        char *r = itest_read_line(h, ITEST_REPLY_MS, NULL);
        if (r == NULL) {
            break;
        }
        ck_assert_msg(strncmp(r, "{\"cache_entries\":", 17) == 0 ||
                          strstr(r, "\"shutting_down\"") != NULL,
                      "reply %ld: %.200s", lines, r);
        free(r);
        lines++;
    }
    ck_assert_msg(itest_last_io(h) == ITEST_IO_EOF, "the replies ended by %s, not EOF",
                  itest_last_io(h) == ITEST_IO_RESET ? "a reset" : "a timeout");
    ck_assert_msg(lines > read_lines && lines <= 100000,
                  "%ld replies: the daemon had read %lld lines, and more lay in its socket", lines,
                  (long long)read_lines);
    ck_assert_uint_eq(itest_pending(h), 0);
    int status = itest_daemon_wait(d, ITEST_STOP_MS);
    fprintf(stderr,
            "drain with a lingering close: %ld replies, then EOF; the daemon exited %d after "
            "%lld ms (--shutdown-timeout %s s)\n",
            lines, status, (long long)(itest_now_ms() - t0), timeout);
    ck_assert_msg(status == 0, "the daemon exited %d: its lingering close outlasted the drain",
                  status);
    itest_close(h);
}
END_TEST

/* A connection closed lingering still holds its socket, so it counts
 * against --max-connections until the linger ends: otherwise clients
 * sending overlong lines could hold any number of descriptors. */
START_TEST(test_conn_lingering_counts)
{
    itest_daemon_t *d = itest_daemon_start("--max-connections", "2", "--max-line", "100", NULL);
    char big[301];
    memset(big, 'x', 300);
    big[300] = '\0';
    itest_conn_t *a[2];
    for (int i = 0; i < 2; i++) {
        a[i] = itest_connect(d);
        ck_assert(itest_send_str(a[i], big));
        char *line = itest_read_line(a[i], ITEST_REPLY_MS, NULL);
        ck_assert_msg(line != NULL && strstr(line, "\"line_too_long\"") != NULL,
                      "not line_too_long: %s", line != NULL ? line : "(nothing)");
        free(line);
        /* The daemon's side is done (EOF); ours stays open: it lingers. */
        ck_assert(itest_expect_closed(a[i], ITEST_REPLY_MS));
    }
    cJSON *st = itest_admin_stats(d);
    ck_assert_int_eq(itest_int(st, "connections"), 0); /* none served */
    cJSON_Delete(st);
    itest_conn_t *c = itest_connect(d);
    char *line = itest_read_line(c, ITEST_REPLY_MS, NULL);
    ck_assert_msg(line != NULL && strstr(line, "\"too_many_connections\"") != NULL,
                  "a third socket while two linger got: %s", line != NULL ? line : "(nothing)");
    free(line);
    itest_close(c);
    /* Once the lingering ones end (our close is their EOF), room is back. */
    itest_close(a[0]);
    itest_close(a[1]);
    int64_t deadline = itest_now_ms() + itest_scale_ms(5000);
    for (;;) {
        c = itest_connect(d);
        ck_assert(itest_send_str(c, "{\"op\":\"stats\"}\n"));
        line = itest_read_line(c, ITEST_REPLY_MS, NULL);
        ck_assert_ptr_nonnull(line);
        bool served = strstr(line, "\"cache_entries\":") != NULL;
        free(line);
        itest_close(c);
        if (served) {
            break;
        }
        ck_assert_msg(itest_now_ms() < deadline, "no connection served after the lingerers left");
        itest_sleep_ms(50);
    }
}
END_TEST

int main(int argc, char **argv)
{
    if (itest_is_part(argc, argv, "unwrapped") && itest_wrapped())
        return itest_skip("under SLOTD_WRAPPER (valgrind), which takes descriptors of its own");
    Suite *s = suite_create("integration_conn");

    /* The part "unwrapped": a wrapper (valgrind) opens descriptors of its
     * own under the daemon's limit. */
    if (itest_is_part(argc, argv, "unwrapped")) {
        ITEST_ADD(s, test_conn_out_of_fds);
        return itest_main(s);
    }
    ITEST_ADD(s, test_conn_timeout);
    ITEST_ADD(s, test_conn_timeout_off);
    ITEST_ADD(s, test_conn_drain_linger_bounded);
    ITEST_ADD(s, test_conn_lingering_counts);
    ITEST_ADD(s, test_conn_burst_one_write);
    return itest_main(s);
}
