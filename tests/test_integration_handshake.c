/*
 * test_integration_handshake.c: a session connection before it is served,
 * on the real daemon: the bounds on connections that have not
 * authenticated, and the PROXY protocol header of --proxy-from peers.
 *
 * With a token, connections that never authenticate cannot lock a client
 * out: at --max-connections the oldest of them makes room for the new
 * connection (one too_many_connections line, then the close), while
 * authenticated connections are never closed for room.  One that does not
 * authenticate within --auth-timeout gets one auth_required line and is
 * closed; one that authenticated stays.  Before the auth a line may not
 * pass HANDSHAKE_LINE_MAX (8704) bytes, so a partial line cannot pin
 * --max-line of memory; after it --max-line applies again, from the line
 * after the auth in the same read.  A connection closed before its auth
 * that still lingers gives its place up to a new one.
 *
 * A peer --proxy-from lists must begin with a PROXY header, v1 or v2, in
 * any number of pieces; the client it names is the peer GET /sessions
 * shows (LOCAL leaves the socket's).  A listed peer whose first bytes are
 * not a header is closed with a log line; from any other peer a header is
 * just a line that is not JSON, as before.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "itest.h"

#define TOKEN "handshake-token-0123456789abcdef"
#define AUTH "{\"op\":\"auth\",\"token\":\"" TOKEN "\"}\n"

static char token_path[64];

static const char *token_file(void)
{
    snprintf(token_path, sizeof(token_path), "/tmp/slotd-token.XXXXXX");
    int fd = mkstemp(token_path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, TOKEN, strlen(TOKEN)), (ssize_t)strlen(TOKEN));
    close(fd);
    ck_assert_int_eq(chmod(token_path, 0600), 0);
    return token_path;
}

static void token_unlink(void)
{
    if (token_path[0] != '\0')
        unlink(token_path);
    token_path[0] = '\0';
}

static bool log_contains(const itest_daemon_t *d, const char *text)
{
    FILE *f = fopen(d->log, "r");
    char line[2048];
    bool found = false;

    ck_assert_ptr_nonnull(f);
    while (!found && fgets(line, sizeof(line), f) != NULL)
        found = strstr(line, text) != NULL;
    fclose(f);
    return found;
}

static void authenticate(itest_conn_t *c)
{
    cJSON *r = itest_rpc(c, "{\"op\":\"auth\",\"token\":\"%s\"}", TOKEN);
    itest_expect_ok(r);
    cJSON_Delete(r);
}

/* GET /stats, with the token. */
static int64_t admin_connections(const itest_daemon_t *d)
{
    const char *req = "GET /stats HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " TOKEN
                      "\r\nConnection: close\r\n\r\n";
    itest_http_t h;
    ck_assert(itest_http_raw(d->admin_port, req, strlen(req), &h));
    ck_assert_int_eq(h.status, 200);
    cJSON *st = cJSON_Parse(h.body);
    ck_assert_ptr_nonnull(st);
    int64_t n = itest_int(st, "connections");
    cJSON_Delete(st);
    itest_http_free(&h);
    return n;
}

/* The sample `name` of GET /metrics, with the token. */
static long admin_metric(const itest_daemon_t *d, const char *name)
{
    const char *req = "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " TOKEN
                      "\r\nConnection: close\r\n\r\n";
    char needle[256];
    itest_http_t h;
    ck_assert(itest_http_raw(d->admin_port, req, strlen(req), &h));
    ck_assert_int_eq(h.status, 200);
    snprintf(needle, sizeof(needle), "\n%s ", name);
    const char *p = strstr(h.body, needle);
    ck_assert_msg(p != NULL, "no %s in /metrics", name);
    long v = strtol(p + strlen(needle), NULL, 10);
    itest_http_free(&h);
    return v;
}

#define CLOSED(reason) "slotd_connections_closed_total{reason=\"" reason "\"}"

/* Polls GET /stats until `connections` is `n`. */
static void await_connections(const itest_daemon_t *d, int64_t n)
{
    int64_t got = -1;
    for (int i = 0; i < itest_scale_ms(10000) / 10; i++) {
        got = admin_connections(d);
        if (got == n)
            return;
        itest_sleep_ms(10);
    }
    ck_abort_msg("connections is %lld, not %lld", (long long)got, (long long)n);
}

/* ---- Connections that never authenticate ---- */

START_TEST(test_idle_unauthenticated_cannot_lock_out)
{
    enum { MAX = 50 };
    itest_conn_t *idle[MAX];
    itest_daemon_t *d = itest_daemon_start("--auth-token-file", token_file(), "--max-connections",
                                           "50", "--auth-timeout", "600", NULL);

    for (int i = 0; i < MAX; i++)
        idle[i] = itest_connect(d);
    await_connections(d, MAX);

    /* A client arrives: the oldest idle socket makes room for it. */
    itest_conn_t *client = itest_connect(d);
    authenticate(client);
    itest_session_t s;
    int64_t p[] = {3, 1, 4};
    itest_session_init(&s, "a", "tiny", p, 3);
    itest_session_start(client, &s);
    itest_session_step(client, &s, 2);
    cJSON *r = itest_read_reply(idle[0]);
    itest_expect_error(r, NULL, "too_many_connections", "50", "authenticated", NULL);
    cJSON_Delete(r);
    ck_assert(itest_expect_closed(idle[0], ITEST_REPLY_MS));
    /* The others are still open, and it is the next oldest that goes. */
    ck_assert(itest_expect_silence(idle[1], 50));
    itest_conn_t *second = itest_connect(d);
    r = itest_read_reply(idle[1]);
    itest_expect_error(r, NULL, "too_many_connections", NULL);
    cJSON_Delete(r);
    authenticate(second);

    /* Authenticated connections are never closed for room: with every
     * one authenticated, a new connection is turned away. */
    for (int i = 2; i < MAX; i++)
        authenticate(idle[i]);
    itest_conn_t *extra = itest_connect(d);
    r = itest_read_reply(extra);
    itest_expect_error(r, NULL, "too_many_connections", "50", NULL);
    cJSON_Delete(r);
    itest_session_step(client, &s, 1);
    ck_assert_int_eq(admin_metric(d, CLOSED("room")), 2);
    for (int i = 2; i < MAX; i++)
        cJSON_Delete(itest_stats(idle[i]));
    itest_session_finish(client, &s);
    itest_session_free(&s);

    itest_close(extra);
    itest_close(second);
    itest_close(client);
    for (int i = 0; i < MAX; i++)
        itest_close(idle[i]);
    token_unlink();
}
END_TEST

START_TEST(test_auth_timeout)
{
    itest_daemon_t *d = itest_daemon_start("--auth-token-file", token_file(), "--auth-timeout", "1",
                                           "--log-level", "debug", NULL);
    itest_conn_t *quiet = itest_connect(d);
    itest_conn_t *partial = itest_connect(d);
    itest_conn_t *authed = itest_connect(d);

    ck_assert(itest_send_str(partial, "{\"op\":\"auth\",\"tok"));
    authenticate(authed);
    cJSON *r = itest_read_reply(quiet);
    itest_expect_error(r, NULL, "auth_required", "no", "auth", "within", "1", NULL);
    cJSON_Delete(r);
    ck_assert(itest_expect_closed(quiet, ITEST_REPLY_MS));
    r = itest_read_reply(partial);
    itest_expect_error(r, NULL, "auth_required", NULL);
    cJSON_Delete(r);
    ck_assert(itest_expect_closed(partial, ITEST_REPLY_MS));
    ck_assert(log_contains(d, "no auth within 1 s; closing it"));
    /* Past its deadline, the authenticated one serves on. */
    cJSON_Delete(itest_stats(authed));
    ck_assert_int_eq(admin_connections(d), 1);
    ck_assert_int_eq(admin_metric(d, CLOSED("auth_timeout")), 2);

    itest_close(quiet);
    itest_close(partial);
    itest_close(authed);
    token_unlink();
}
END_TEST

/* A line of `len` bytes: a stats with a pad member, "\n" not included. */
static char *padded_stats(size_t len)
{
    const char *head = "{\"op\":\"stats\",\"pad\":\"";
    char *line = malloc(len + 1);
    ck_assert_ptr_nonnull(line);
    memset(line, 'x', len);
    memcpy(line, head, strlen(head));
    memcpy(line + len - 2, "\"}", 2);
    line[len] = '\0';
    return line;
}

START_TEST(test_line_limit_before_auth)
{
    itest_daemon_t *d = itest_daemon_start("--auth-token-file", token_file(), NULL);
    char *big = padded_stats(20000);

    /* A partial line past the limit, no "\n": refused at once. */
    itest_conn_t *c = itest_connect(d);
    ck_assert(itest_send(c, big, 12000));
    cJSON *r = itest_read_reply(c);
    itest_expect_error(r, NULL, "line_too_long", "8704", NULL);
    cJSON_Delete(r);
    ck_assert(itest_expect_closed(c, ITEST_REPLY_MS));
    itest_close(c);

    /* After the auth, --max-line: also for the line right behind the auth
     * in the same write. */
    c = itest_connect(d);
    size_t n = strlen(AUTH) + strlen(big) + 1;
    char *both = malloc(n + 1);
    ck_assert_ptr_nonnull(both);
    snprintf(both, n + 1, "%s%s\n", AUTH, big);
    ck_assert(itest_send(c, both, n));
    r = itest_read_reply(c);
    itest_expect_ok(r);
    cJSON_Delete(r);
    r = itest_read_reply(c);
    itest_expect_ok(r);
    ck_assert_ptr_nonnull(cJSON_GetObjectItem(r, "live_sessions"));
    cJSON_Delete(r);
    ck_assert(itest_send_str(c, big));
    ck_assert(itest_send_str(c, "\n"));
    r = itest_read_reply(c);
    itest_expect_ok(r);
    cJSON_Delete(r);
    itest_close(c);

    /* Without a token, --max-line from the start. */
    itest_daemon_t *open = itest_daemon_start(NULL);
    c = itest_connect(open);
    ck_assert(itest_send_str(c, big));
    ck_assert(itest_send_str(c, "\n"));
    r = itest_read_reply(c);
    itest_expect_ok(r);
    cJSON_Delete(r);
    itest_close(c);
    free(both);
    free(big);
    token_unlink();
}
END_TEST

/* A connection closed before its auth for a line too long lingers (its
 * reply is not lost to a reset), but it does not keep a client out. */
START_TEST(test_lingering_unauthenticated_makes_room)
{
    itest_daemon_t *d = itest_daemon_start("--auth-token-file", token_file(), "--max-connections",
                                           "2", "--log-level", "debug", NULL);
    char *big = padded_stats(20000);
    itest_conn_t *authed = itest_connect(d);
    authenticate(authed);
    itest_conn_t *flood = itest_connect(d);
    ck_assert(itest_send(flood, big, 12000));
    cJSON *r = itest_read_reply(flood);
    itest_expect_error(r, NULL, "line_too_long", NULL);
    cJSON_Delete(r);
    /* It lingers, still open, reading what comes. */
    ck_assert(itest_send(flood, big, 100));
    ck_assert(itest_expect_silence(flood, 50));

    itest_conn_t *client = itest_connect(d);
    authenticate(client);
    ck_assert(itest_expect_closed(flood, ITEST_REPLY_MS));
    ck_assert(log_contains(d, "lingering ended before its auth"));
    cJSON_Delete(itest_stats(authed));
    itest_close(client);
    itest_close(flood);
    itest_close(authed);
    free(big);
    token_unlink();
}
END_TEST

/* ---- The PROXY protocol ---- */

/* The "peer" of the only session GET /sessions lists. */
static char *sessions_peer(const itest_daemon_t *d)
{
    itest_http_t h;
    itest_http_get(d, "/sessions", &h);
    ck_assert_int_eq(h.status, 200);
    cJSON *j = cJSON_Parse(h.body);
    ck_assert_ptr_nonnull(j);
    cJSON *list = cJSON_GetObjectItem(j, "sessions");
    ck_assert_int_eq(cJSON_GetArraySize(list), 1);
    cJSON *conn = cJSON_GetObjectItem(cJSON_GetArrayItem(list, 0), "connection");
    char *peer = strdup(itest_str(conn, "peer"));
    cJSON_Delete(j);
    itest_http_free(&h);
    return peer;
}

/* Sends `header` (`len` bytes) in pieces of `piece` bytes, then starts a
 * session and returns the peer /sessions shows for it. */
static char *peer_after(const itest_daemon_t *d, const void *header, size_t len, size_t piece)
{
    itest_conn_t *c = itest_connect(d);
    const char *h = header;

    for (size_t at = 0; at < len; at += piece) {
        size_t n = len - at < piece ? len - at : piece;
        ck_assert(itest_send(c, h + at, n));
        if (n < len)
            ck_assert(itest_expect_silence(c, 20));
    }
    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"p\",\"prompt\":[1,2]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    char *peer = sessions_peer(d);
    itest_close(c);
    await_connections(d, 0);
    return peer;
}

static size_t v2_header(unsigned char *out, unsigned ver_cmd, unsigned fam,
                        const unsigned char *body, size_t blen)
{
    static const unsigned char sig[12] = {0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d,
                                          0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a};
    memcpy(out, sig, 12);
    out[12] = (unsigned char)ver_cmd;
    out[13] = (unsigned char)fam;
    out[14] = (unsigned char)(blen >> 8);
    out[15] = (unsigned char)blen;
    if (blen > 0)
        memcpy(out + 16, body, blen);
    return 16 + blen;
}

START_TEST(test_proxy_trusted)
{
    itest_daemon_t *d =
        itest_daemon_start("--proxy-from", "10.1.2.3,127.0.0.0/8", "--log-level", "debug", NULL);
    const char *v1 = "PROXY TCP4 192.0.2.7 127.0.0.1 56324 7070\r\n";
    char *peer;

    peer = peer_after(d, v1, strlen(v1), strlen(v1));
    ck_assert_str_eq(peer, "192.0.2.7:56324");
    free(peer);
    peer = peer_after(d, v1, strlen(v1), 5); /* split across reads */
    ck_assert_str_eq(peer, "192.0.2.7:56324");
    free(peer);
    const char *v1_6 = "PROXY TCP6 2001:db8::7 ::1 40000 7070\r\n";
    peer = peer_after(d, v1_6, strlen(v1_6), strlen(v1_6));
    ck_assert_str_eq(peer, "[2001:db8::7]:40000");
    free(peer);

    unsigned char body[36] = {0}, h[64];
    body[0] = 198, body[1] = 51, body[2] = 100, body[3] = 9; /* 198.51.100.9 */
    body[4] = 127, body[7] = 1;
    body[8] = 0x30, body[9] = 0x39; /* 12345 */
    body[10] = 0x1b, body[11] = 0x9e;
    size_t n = v2_header(h, 0x21, 0x11, body, 12);
    peer = peer_after(d, h, n, n);
    ck_assert_str_eq(peer, "198.51.100.9:12345");
    free(peer);
    peer = peer_after(d, h, n, 7);
    ck_assert_str_eq(peer, "198.51.100.9:12345");
    free(peer);
    /* LOCAL: the socket's own peer stands. */
    n = v2_header(h, 0x20, 0x00, NULL, 0);
    peer = peer_after(d, h, n, n);
    ck_assert_msg(strncmp(peer, "127.0.0.1:", 10) == 0, "peer %s", peer);
    free(peer);
    ck_assert(log_contains(d, "PROXY v2 header from 127.0.0.1:"));

    /* No header, or a malformed one, from a listed peer: closed, logged. */
    itest_conn_t *c = itest_connect(d);
    ck_assert(itest_send_str(c, "{\"op\":\"stats\"}\n"));
    ck_assert(itest_expect_closed(c, ITEST_REPLY_MS));
    itest_close(c);
    c = itest_connect(d);
    ck_assert(itest_send_str(c, "PROXY TCP4 192.0.2.777 127.0.0.1 1 2\r\n{\"op\":\"stats\"}\n"));
    ck_assert(itest_expect_closed(c, ITEST_REPLY_MS));
    itest_close(c);
    ck_assert(log_contains(d, "not a PROXY header; --proxy-from lists this peer"));
    ck_assert(log_contains(d, "'192.0.2.777' is not an IPv4 address"));
    ck_assert_int_eq(itest_metric(d, CLOSED("proxy_header")), 2);
    /* The daemon serves on. */
    peer = peer_after(d, v1, strlen(v1), strlen(v1));
    ck_assert_str_eq(peer, "192.0.2.7:56324");
    free(peer);
}
END_TEST

/* A listed peer that sends no header, or half of one, within
 * --auth-timeout is closed, without a token as with one. */
START_TEST(test_proxy_timeout)
{
    itest_daemon_t *d =
        itest_daemon_start("--proxy-from", "127.0.0.1", "--auth-timeout", "1", NULL);
    itest_conn_t *none = itest_connect(d);
    itest_conn_t *half = itest_connect(d);
    ck_assert(itest_send_str(half, "PROXY TCP4 192.0.2."));
    ck_assert(itest_expect_closed(none, ITEST_REPLY_MS));
    ck_assert(itest_expect_closed(half, ITEST_REPLY_MS));
    ck_assert(log_contains(d, "no PROXY header within 1 s"));
    ck_assert_int_eq(itest_metric(d, CLOSED("proxy_header")), 2);
    itest_close(none);
    itest_close(half);
}
END_TEST

START_TEST(test_proxy_untrusted)
{
    /* 127.0.0.2 is not the test's address: its header is not JSON. */
    itest_daemon_t *d = itest_daemon_start("--proxy-from", "127.0.0.2", NULL);
    itest_conn_t *c = itest_connect(d);
    cJSON *r = itest_rpc(c, "PROXY TCP4 192.0.2.7 127.0.0.1 56324 7070\r");
    itest_expect_error(r, NULL, "bad_json", NULL);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"p\",\"prompt\":[1,2]}");
    itest_expect_ok(r);
    cJSON_Delete(r);
    char *peer = sessions_peer(d);
    ck_assert_msg(strncmp(peer, "127.0.0.1:", 10) == 0, "peer %s", peer);
    free(peer);
    itest_close(c);

    /* A bad --proxy-from stops the start with status 2. */
    const char *bad[] = {"10.0.0.1/33", "10.0.0.5/8", "fd00::/129", "host.example", "", NULL};
    for (int i = 0; bad[i] != NULL; i++) {
        const char *argv[] = {itest_slotd_bin(), "--proxy-from", bad[i], "--port", "0", NULL};
        char *out = NULL, *err = NULL;
        int status = itest_run(argv, NULL, 0, &out, &err, ITEST_REPLY_MS);
        ck_assert_msg(status == 2, "--proxy-from '%s': status %d", bad[i], status);
        ck_assert_msg(strstr(err, "--proxy-from") != NULL, "--proxy-from '%s': %s", bad[i], err);
        free(out);
        free(err);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("integration_handshake");
    ITEST_ADD(s, test_idle_unauthenticated_cannot_lock_out);
    ITEST_ADD(s, test_auth_timeout);
    ITEST_ADD(s, test_line_limit_before_auth);
    ITEST_ADD(s, test_lingering_unauthenticated_makes_room);
    ITEST_ADD(s, test_proxy_trusted);
    ITEST_ADD(s, test_proxy_timeout);
    ITEST_ADD(s, test_proxy_untrusted);
    return itest_main(s);
}
