/*
 * test_integration_drain.c: what a client reads when the daemon drains
 * while it is sending (docs/protocol.md, "Reading late"; docs/operations.md,
 * "Draining it").
 *
 * A late reader: 1,000 stats lines pipelined and answered but not read,
 * then SIGTERM, then one more line once the drain has begun; the client
 * must then read all 1,000 answers and an EOF, never a reset.  The same
 * with a client that keeps writing after the signal, past the 32 MiB the
 * daemon discards before it stops waiting for the client's EOF.
 *
 * A deep pipeline: one thread writes numbered lines as fast as the socket
 * takes them, the test reads in parallel, SIGTERM comes once some thousands
 * are answered, and the writer goes on.  Every line read must be whole and
 * in order, a result (its job had started) or shutting_down, and the last
 * one must be followed by an EOF (or, for a client that goes on sending
 * past the bound, a reset after a shutting_down).
 * Run directly against the daemon, and (`test_integration_drain proxy`, a
 * CTest entry of its own that is skipped where haproxy is not installed)
 * through HAProxy on the committed deploy/haproxy.cfg.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "itest.h"

#define LATE_LINES 1000
#define STATS_LINE "{\"op\":\"stats\"}\n"

/* Lines of the daemon's log that contain `text`. */
static int log_count(const itest_daemon_t *d, const char *text)
{
    FILE *f = fopen(d->log, "r");
    char line[2048];
    int n = 0;

    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f) != NULL)
        n += strstr(line, text) != NULL;
    fclose(f);
    return n;
}

/* SIGTERM, then waits (bounded) until the daemon has begun the drain:
 * every connection has then been told, and closed if it had nothing left
 * to write. */
static void drain_begun(itest_daemon_t *d)
{
    itest_daemon_signal(d, SIGTERM);
    for (int64_t deadline = itest_now_ms() + ITEST_REPLY_MS; itest_now_ms() < deadline;) {
        if (log_count(d, "shutdown: stopped accepting") > 0)
            return;
        itest_sleep_ms(5);
    }
    ck_abort_msg("the daemon did not log the start of its drain");
}

/* Waits until the bytes waiting in `c`'s socket stop growing (five looks
 * 10 ms apart see the same count): the daemon has written every answer
 * that the buffers between can hold. */
static void await_output_settled(itest_conn_t *c)
{
    int last = -1, same = 0;

    for (int64_t deadline = itest_now_ms() + ITEST_REPLY_MS; itest_now_ms() < deadline;) {
        int n = 0;
        ck_assert_int_eq(ioctl(itest_conn_fd(c), FIONREAD, &n), 0);
        same = n > 0 && n == last ? same + 1 : 0;
        last = n;
        if (same >= 5)
            return;
        itest_sleep_ms(10);
    }
    ck_abort_msg("the answers never came");
}

/* Pipelines LATE_LINES stats lines on a connection to `port` (the
 * daemon's, or a proxy's in front of it) and waits until the daemon
 * answered them all, without reading a byte. */
static itest_conn_t *late_reader(itest_daemon_t *d, int port)
{
    itest_conn_t *c = itest_try_connect(port);
    size_t len = strlen(STATS_LINE);
    char *buf = malloc(LATE_LINES * len);

    ck_assert_ptr_nonnull(c);
    for (int i = 0; i < LATE_LINES; i++)
        memcpy(buf + (size_t)i * len, STATS_LINE, len);
    ck_assert(itest_send(c, buf, LATE_LINES * len));
    free(buf);
    itest_await_metric(d, "slotd_requests_total{op=\"stats\"}", LATE_LINES, ITEST_REPLY_MS);
    await_output_settled(c);
    return c;
}

/* Reads `want` stats answers, then expects the daemon's EOF. */
static void read_every_answer(itest_conn_t *c, int want)
{
    for (int i = 0; i < want; i++) {
        size_t len = 0;
        char *line = itest_read_line(c, ITEST_REPLY_MS, &len);
        ck_assert_msg(line != NULL, "answer %d of %d: %s", i + 1, want,
                      itest_last_io(c) == ITEST_IO_RESET ? "connection reset"
                      : itest_last_io(c) == ITEST_IO_EOF ? "EOF"
                                                         : "timed out");
        cJSON *r = cJSON_ParseWithLength(line, len);
        ck_assert_msg(r != NULL, "answer %d is not JSON: %s", i + 1, line);
        itest_check_stats_shape(r);
        cJSON_Delete(r);
        free(line);
    }
    ck_assert_msg(itest_expect_closed(c, ITEST_REPLY_MS), "bytes after the last answer");
    ck_assert_msg(itest_last_io(c) == ITEST_IO_EOF, "a reset after the last answer, not an EOF");
}

START_TEST(test_drain_late_line)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = late_reader(d, d->port);

    drain_begun(d);
    ck_assert(itest_send_str(c, STATS_LINE)); /* sent after the drain began: not answered */
    read_every_answer(c, LATE_LINES);
    itest_close(c);
    ck_assert_int_eq(itest_daemon_wait(d, ITEST_STOP_MS), 0);
}
END_TEST

/* A late reader on a connection to `port` that writes `more` bytes after
 * the drain began, then reads. */
static void keeps_writing(itest_daemon_t *d, int port, size_t more)
{
    itest_conn_t *c = late_reader(d, port);
    size_t len = strlen(STATS_LINE), n = more / len;
    char *buf = malloc(n * len);
    bool stalled = false;

    for (size_t i = 0; i < n; i++)
        memcpy(buf + i * len, STATS_LINE, len);
    drain_begun(d);
    size_t sent = itest_send_noread(c, buf, n * len, itest_scale_ms(5000), &stalled);
    free(buf);
    ck_assert_msg(sent == n * len, "sent %zu of %zu bytes after the drain began (%s)", sent,
                  n * len, stalled ? "stalled" : "closed or reset");
    read_every_answer(c, LATE_LINES);
    itest_close(c);
    ck_assert_int_eq(itest_daemon_wait(d, ITEST_STOP_MS), 0);
}

START_TEST(test_drain_keeps_writing)
{
    itest_daemon_t *d = itest_daemon_start(NULL);

    keeps_writing(d, d->port, (size_t)40 << 20); /* past the 32 MiB the daemon discards */
}
END_TEST

/* ---- A deep pipeline ---- */

#define DEEP_SIGNAL_AT 20000          /* answers read before SIGTERM */
#define DEEP_AFTER ((size_t)64 << 20) /* bytes the writer sends after it */

typedef struct deep {
    int fd;
    bool polite; /* stops writing at the first shutting_down, as a client should */
    pthread_t thread;
    _Atomic bool signalled; /* SIGTERM sent */
    _Atomic bool stop;      /* the reader is done */
    _Atomic bool refused;   /* the reader saw a shutting_down */
    _Atomic long lines;     /* lines sent */
    int send_errno;         /* what ended the writing, 0 if it stopped itself */
} deep_t;

#define DEEP_LINE "{\"op\":\"generate\",\"tokens\":[1,2,3],\"steps\":2,\"tag\":%ld}\n"

/* Writes numbered lines as fast as the socket takes them, until the
 * reader is done, the socket fails, DEEP_AFTER bytes went after the
 * signal, or (polite) a shutting_down was read; then ends its side. */
static void *deep_write(void *arg)
{
    deep_t *w = arg;
    char buf[1 << 16];
    size_t after = 0;
    long next = 0;

    while (!atomic_load(&w->stop) && after < DEEP_AFTER &&
           !(w->polite && atomic_load(&w->refused))) {
        size_t o = 0;
        while (o + 128 < sizeof(buf))
            o += (size_t)snprintf(buf + o, sizeof(buf) - o, DEEP_LINE, next++);
        for (size_t put = 0; put < o && !atomic_load(&w->stop);) {
            struct pollfd p = {.fd = w->fd, .events = POLLOUT};
            if (poll(&p, 1, 100) <= 0)
                continue;
            ssize_t k = send(w->fd, buf + put, o - put, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (k < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            if (k < 0) {
                w->send_errno = errno;
                return NULL;
            }
            put += (size_t)k;
            if (atomic_load(&w->signalled))
                after += (size_t)k;
        }
        atomic_store(&w->lines, next);
    }
    shutdown(w->fd, SHUT_WR);
    return NULL;
}

/* Drives a deep pipeline on a connection to `port` and drains `d` in the
 * middle; checks every line read. */
static void deep_pipeline(itest_daemon_t *d, int port, bool polite)
{
    itest_conn_t *c = itest_try_connect(port);
    deep_t w = {.fd = -1, .polite = polite};
    char *buf = malloc(1 << 20);
    size_t have = 0, cap = 1 << 20;
    long answered = 0, results = 0, refused = 0;
    bool eof = false;

    ck_assert_ptr_nonnull(c);
    w.fd = itest_conn_fd(c);
    ck_assert_int_eq(pthread_create(&w.thread, NULL, deep_write, &w), 0);
    for (;;) {
        struct pollfd p = {.fd = w.fd, .events = POLLIN};
        int ready = poll(&p, 1, ITEST_REPLY_MS);
        ck_assert_msg(ready > 0, "no answer for %d ms after %ld answers", ITEST_REPLY_MS,
                      answered);
        ssize_t k = recv(w.fd, buf + have, cap - have, MSG_DONTWAIT);
        if (k < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (k <= 0) {
            eof = k == 0;
            break;
        }
        have += (size_t)k;
        char *line = buf, *nl;
        while ((nl = memchr(line, '\n', have - (size_t)(line - buf))) != NULL) {
            cJSON *r = cJSON_ParseWithLength(line, (size_t)(nl - line));
            char tag[32];
            ck_assert_msg(r != NULL, "answer %ld is not JSON: %.*s", answered, (int)(nl - line),
                          line);
            snprintf(tag, sizeof(tag), "%ld", answered);
            itest_expect_tag(r, tag);
            if (itest_error_code(r) != NULL) {
                itest_expect_error(r, tag, "shutting_down", NULL);
                atomic_store(&w.refused, true);
                refused++;
            } else {
                ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(r, "tokens")), 5);
                results++;
            }
            cJSON_Delete(r);
            answered++;
            line = nl + 1;
        }
        have -= (size_t)(line - buf);
        memmove(buf, line, have);
        ck_assert_msg(have < cap, "a line of %zu bytes", have);
        if (answered >= DEEP_SIGNAL_AT && !atomic_load(&w.signalled)) {
            itest_daemon_signal(d, SIGTERM);
            atomic_store(&w.signalled, true);
        }
    }
    atomic_store(&w.stop, true);
    pthread_join(w.thread, NULL);
    fprintf(stderr,
            "deep pipeline: %ld lines sent, %ld answered (%ld results, %ld shutting_down), "
            "then %s; the writer %s\n",
            atomic_load(&w.lines), answered, results, refused, eof ? "EOF" : "a reset",
            w.send_errno != 0 ? strerror(w.send_errno) : "stopped");
    ck_assert_msg(atomic_load(&w.signalled), "the connection ended before the drain");
    ck_assert_msg(have == 0, "a torn line of %zu bytes before the %s: %.*s", have,
                  eof ? "EOF" : "reset", (int)(have < 200 ? have : 200), buf);
    ck_assert_msg(eof || (!polite && refused > 0), "a reset after %ld answers", answered);
    free(buf);
    itest_close(c);
    ck_assert_int_eq(itest_daemon_wait(d, ITEST_STOP_MS), 0);
}

START_TEST(test_drain_deep_pipeline)
{
    itest_daemon_t *d = itest_daemon_start(NULL);

    deep_pipeline(d, d->port, false);
}
END_TEST

/* ---- Through HAProxy ---- */

static pid_t haproxy_pid = -1;

static void haproxy_stop(void)
{
    if (haproxy_pid <= 0)
        return;
    kill(haproxy_pid, SIGKILL);
    waitpid(haproxy_pid, NULL, 0);
    haproxy_pid = -1;
}

/* Starts HAProxy on deploy/haproxy.cfg with all three servers the one
 * daemon `d`, and waits (bounded) until a request goes through it.
 * Returns the port clients connect to. */
static int haproxy_start(itest_daemon_t *d)
{
    char env[12][320], *envp[13], self[64], admin[64];
    int lb = itest_free_port(), stats = itest_free_port(), n = 0;

    snprintf(self, sizeof(self), "127.0.0.1:%d", d->port);
    snprintf(admin, sizeof(admin), "%d", d->admin_port);
    for (int i = 1; i <= 3; i++) {
        snprintf(env[n++], sizeof(env[0]), "SLOTD_S%d=%s", i, self);
        snprintf(env[n++], sizeof(env[0]), "SLOTD_S%d_ADMIN_ADDR=127.0.0.1", i);
        snprintf(env[n++], sizeof(env[0]), "SLOTD_S%d_ADMIN_PORT=%s", i, admin);
    }
    snprintf(env[n++], sizeof(env[0]), "SLOTD_LB_BIND=127.0.0.1:%d", lb);
    snprintf(env[n++], sizeof(env[0]), "SLOTD_LB_STATS=127.0.0.1:%d", stats);
    snprintf(env[n++], sizeof(env[0]), "SLOTD_LB_SOCKET=%s/haproxy.sock", d->dir);
    for (int i = 0; i < n; i++)
        envp[i] = env[i];
    envp[n] = NULL;

    char cfg[512], log[320];
    snprintf(cfg, sizeof(cfg), "%s/deploy/haproxy.cfg", SLOTD_SOURCE_DIR);
    snprintf(log, sizeof(log), "%s/haproxy.log", d->dir);
    haproxy_pid = fork();
    ck_assert_int_ge(haproxy_pid, 0);
    if (haproxy_pid == 0) {
        FILE *f = freopen(log, "w", stdout);
        (void)f;
        dup2(STDOUT_FILENO, STDERR_FILENO);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execle("/bin/sh", "sh", "-c", "exec haproxy -db -f \"$0\"", cfg, (char *)NULL, envp);
        _exit(127);
    }
    for (int64_t deadline = itest_now_ms() + ITEST_REPLY_MS; itest_now_ms() < deadline;
         itest_sleep_ms(50)) {
        itest_conn_t *c = itest_try_connect(lb);
        if (c == NULL)
            continue;
        char *line = itest_send_str(c, STATS_LINE) ? itest_read_line(c, 1000, NULL) : NULL;
        itest_close(c);
        if (line != NULL) {
            free(line);
            return lb;
        }
    }
    haproxy_stop();
    ck_abort_msg("HAProxy did not pass a request on (its log: %s)", log);
    return -1;
}

START_TEST(test_drain_deep_pipeline_proxy)
{
    /* deploy/haproxy.cfg sends a PROXY header (send-proxy-v2). */
    itest_daemon_t *d = itest_daemon_start("--proxy-from", "127.0.0.1", NULL);
    int lb = haproxy_start(d);

    /* A client that goes on sending past the daemon's bound may lose
     * answers HAProxy holds when the daemon closes; one that stops at
     * shutting_down, as docs/protocol.md asks, loses none. */
    deep_pipeline(d, lb, true);
    haproxy_stop();
}
END_TEST

START_TEST(test_drain_keeps_writing_proxy)
{
    /* deploy/haproxy.cfg sends a PROXY header (send-proxy-v2). */
    itest_daemon_t *d = itest_daemon_start("--proxy-from", "127.0.0.1", NULL);
    int lb = haproxy_start(d);

    /* Within the 32 MiB: past them the daemon closes once its send queue
     * is empty, and HAProxy may still hold answers then. */
    keeps_writing(d, lb, (size_t)24 << 20);
    haproxy_stop();
}
END_TEST

static bool have_haproxy(void)
{
    return system("command -v haproxy >/dev/null 2>&1") == 0;
}

int main(int argc, char **argv)
{
    Suite *s = suite_create("integration_drain");

    if (argc > 1 && strcmp(argv[1], "proxy") == 0) {
        if (!have_haproxy()) {
            fprintf(stderr, "SKIP: haproxy is not installed (scripts/deps.sh --test)\n");
            return 77;
        }
        ITEST_ADD(s, test_drain_keeps_writing_proxy);
        ITEST_ADD(s, test_drain_deep_pipeline_proxy);
        return itest_main(s);
    }
    ITEST_ADD(s, test_drain_late_line);
    ITEST_ADD(s, test_drain_keeps_writing);
    ITEST_ADD(s, test_drain_deep_pipeline);
    return itest_main(s);
}
