/*
 * test_integration_listing.c: GET /sessions with many sessions live does
 * not hold up the session port.
 *
 * 50,000 `hash` sessions are opened on one connection; then, on the admin
 * port, GET /sessions is asked for, and a `stats` line is sent on the
 * session connection right after the request.  The stats reply must come
 * before the listing's last byte: the listing is gathered a piece per
 * loop turn and sorted and written off the loop thread, so the session
 * port is served meanwhile.  (Built in one loop turn, the listing of the
 * default limit is written whole before the loop reads the stats line.)
 * The whole listing (limit 1000000) is then read and checked: every
 * session once, largest first, and `pool_bytes` of a session equal to
 * the pool bytes the pool reports for it alone.
 *
 * Sessions that finish and connections that close while a listing is
 * gathered leave every other session listed (the cursor moves off them;
 * under ASan a cursor left behind is a use after free).
 *
 * The order of the two replies is what is asserted, never a time; the
 * stall itself is measured by bench/listing.
 */
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "itest.h"

#define NSESSIONS 50000

/* Opens `n` hash sessions s0.. on `c`, pipelined in batches. */
static void open_sessions(itest_conn_t *c, int n)
{
    char *buf = malloc(80 * 1000);
    ck_assert_ptr_nonnull(buf);
    for (int i = 0; i < n;) {
        size_t len = 0;
        int k = 0;
        for (; k < 1000 && i + k < n; k++)
            len += (size_t)sprintf(buf + len,
                                   "{\"op\":\"start\",\"id\":\"s%d\",\"model\":\"hash\","
                                   "\"prompt\":[%d]}\n",
                                   i + k, 1 + (i + k) % 7);
        ck_assert(itest_send(c, buf, len));
        for (int j = 0; j < k; j++) {
            char *line = itest_read_line(c, itest_scale_ms(10000), NULL);
            ck_assert_msg(line != NULL && strstr(line, "\"entries\"") != NULL, "start: %s",
                          line ? line : "(nothing)");
            free(line);
        }
        i += k;
    }
    free(buf);
}

static int admin_connect(const itest_daemon_t *d)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)d->admin_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

/* Sends GET `path` on a new admin connection, then a stats line on `c`;
 * returns true if the stats reply came before the response's last byte.
 * The response is read whole into *body. */
static bool stats_first(const itest_daemon_t *d, itest_conn_t *c, const char *path, char **body,
                        size_t *body_len)
{
    char req[256];
    int fd = admin_connect(d);
    int n =
        snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path);
    ck_assert_int_eq(write(fd, req, (size_t)n), n);
    ck_assert(itest_send_str(c, "{\"op\":\"stats\",\"tag\":1}\n"));

    /* Whichever ends first: the stats line, or the admin response (its
     * last byte, then the close it asked for). */
    size_t got = 0, cap = 1 << 20;
    char *b = malloc(cap + 1);
    ck_assert_ptr_nonnull(b);
    bool stats_done = false, admin_done = false, stats_won = false;
    while (!stats_done || !admin_done) {
        struct pollfd p[2] = {{.fd = itest_conn_fd(c), .events = POLLIN},
                              {.fd = fd, .events = POLLIN}};
        /* A reply already buffered by itest_send_str() is ready too. */
        bool buffered = !stats_done && itest_pending(c) > 0;
        int r = poll(p, 2, buffered ? 0 : itest_scale_ms(30000));
        ck_assert_msg(r > 0 || buffered, "neither the stats reply nor the listing came");
        if (!stats_done && (buffered || (p[0].revents & (POLLIN | POLLHUP | POLLERR)))) {
            cJSON *st = itest_read_reply(c);
            ck_assert_ptr_nonnull(st);
            ck_assert_int_eq(itest_int(st, "live_sessions"), NSESSIONS);
            cJSON_Delete(st);
            stats_done = true;
            stats_won = !admin_done;
        }
        if (!admin_done && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
            if (got == cap) {
                cap *= 2;
                b = realloc(b, cap + 1);
                ck_assert_ptr_nonnull(b);
            }
            ssize_t k = read(fd, b + got, cap - got);
            ck_assert_int_ge(k, 0);
            got += (size_t)k;
            admin_done = k == 0;
        }
    }
    close(fd);
    b[got] = '\0';
    char *head_end = strstr(b, "\r\n\r\n");
    ck_assert_ptr_nonnull(head_end);
    ck_assert_msg(strncmp(b, "HTTP/1.1 200", 12) == 0, "GET %s: %.40s", path, b);
    *body_len = got - (size_t)(head_end + 4 - b);
    *body = malloc(*body_len + 1);
    ck_assert_ptr_nonnull(*body);
    memcpy(*body, head_end + 4, *body_len);
    (*body)[*body_len] = '\0';
    free(b);
    return stats_won;
}

START_TEST(test_listing_leaves_the_port_served)
{
    itest_daemon_t *d = itest_daemon_start("--models", "hash", "--default-model", "hash",
                                           "--max-sessions-per-connection", "100000",
                                           "--max-connection-share", "1", NULL);
    itest_conn_t *c = itest_connect(d);
    open_sessions(c, NSESSIONS);

    char *body;
    size_t len;
    /* The default limit: a short body, written at once when built. */
    bool won = stats_first(d, c, "/sessions", &body, &len);
    ck_assert_msg(won, "the stats reply came after the whole listing");
    cJSON *j = cJSON_Parse(body);
    ck_assert_ptr_nonnull(j);
    ck_assert_int_eq(itest_int(j, "total"), NSESSIONS);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "sessions")), 100);
    cJSON_Delete(j);
    free(body);

    /* Everything: each session once, largest first. */
    won = stats_first(d, c, "/sessions?limit=1000000", &body, &len);
    ck_assert_msg(won, "the stats reply came after the whole listing");
    j = cJSON_Parse(body);
    ck_assert_ptr_nonnull(j);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "sessions");
    ck_assert_int_eq(cJSON_GetArraySize(list), NSESSIONS);
    char *seen = calloc(NSESSIONS, 1);
    ck_assert_ptr_nonnull(seen);
    int64_t prev = INT64_MAX;
    const cJSON *e;
    cJSON_ArrayForEach(e, list)
    {
        const char *id = itest_str(e, "id");
        int k = atoi(id + 1);
        ck_assert_msg(id[0] == 's' && k >= 0 && k < NSESSIONS && !seen[k], "id %s", id);
        seen[k] = 1;
        int64_t bytes = itest_int(e, "pool_bytes");
        ck_assert_int_le(bytes, prev);
        prev = bytes;
    }
    free(seen);
    cJSON_Delete(j);
    free(body);
    itest_close(c);
}
END_TEST

/* A session's pool_bytes is what the pool holds for it: with one session
 * live, the pool's bytes in use, for each model and a few lengths. */
START_TEST(test_listing_pool_bytes)
{
    itest_daemon_t *d = itest_daemon_start("--models", "hash,tiny,small", NULL);
    static const struct {
        const char *model;
        int ntokens;
    } cases[] = {{"tiny", 1},   {"tiny", 3},  {"tiny", 8},  {"hash", 1},
                 {"hash", 300}, {"small", 1}, {"small", 17}};
    itest_conn_t *c = itest_connect(d);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char prompt[4096];
        size_t len = 0;
        for (int t = 0; t < cases[i].ntokens; t++)
            len +=
                (size_t)snprintf(prompt + len, sizeof(prompt) - len, "%s%d", t ? "," : "", t % 5);
        cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"x\",\"model\":\"%s\",\"prompt\":[%s]}",
                             cases[i].model, prompt);
        itest_expect_ok(r);
        cJSON_Delete(r);
        int64_t used = itest_stat(c, "pool_bytes_used");
        itest_http_t h;
        itest_http_get(d, "/sessions", &h);
        cJSON *j = cJSON_Parse(h.body);
        ck_assert_ptr_nonnull(j);
        const cJSON *s0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "sessions"), 0);
        ck_assert_ptr_nonnull(s0);
        ck_assert_msg(itest_int(s0, "pool_bytes") == used,
                      "%s with %d entries: /sessions says %lld pool bytes, the pool %lld",
                      cases[i].model, cases[i].ntokens, (long long)itest_int(s0, "pool_bytes"),
                      (long long)used);
        cJSON_Delete(j);
        itest_http_free(&h);
        r = itest_rpc(c, "{\"op\":\"finish\",\"id\":\"x\"}");
        itest_expect_ok(r);
        cJSON_Delete(r);
    }
    itest_close(c);
}
END_TEST

/* Sessions and connections that go away while a listing is gathered:
 * the cursor moves off them.  Without that, a cursor left on a closed
 * connection reads it after it is freed (ASan), and one left on a
 * finished session walks the free list of records and misses the rest of
 * its connection.  So every session that stays is listed, whatever left
 * around it, and the daemon serves on. */
START_TEST(test_listing_while_sessions_go)
{
    enum { NCONNS = 8, PER = NSESSIONS / NCONNS };
    itest_daemon_t *d =
        itest_daemon_start("--models", "hash", "--default-model", "hash",
                           "--max-sessions-per-connection", "100000", "--max-connection-share",
                           "1", NULL);
    itest_conn_t *c[NCONNS];
    for (int i = 0; i < NCONNS; i++) {
        c[i] = itest_connect(d);
        open_sessions(c[i], PER);
    }
    for (int round = 0; round < 2; round++) {
        int fd = admin_connect(d);
        static const char req[] =
            "GET /sessions?limit=1000000 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        ck_assert_int_eq(write(fd, req, sizeof(req) - 1), (ssize_t)(sizeof(req) - 1));
        /* Round 0: half the connections close, reset, under the listing;
         * round 1: the others finish their even-numbered sessions. */
        for (int i = 0; i < NCONNS; i++) {
            if (round == 0 && i % 2 == 0) {
                itest_close_reset(c[i]);
                c[i] = NULL;
            } else if (round == 1 && c[i] != NULL) {
                char *buf = malloc((size_t)PER * 40);
                size_t len = 0;
                ck_assert_ptr_nonnull(buf);
                for (int k = 0; k < PER; k += 2)
                    len += (size_t)sprintf(buf + len, "{\"op\":\"finish\",\"id\":\"s%d\"}\n", k);
                ck_assert(itest_send(c[i], buf, len));
                free(buf);
            }
        }
        size_t got = 0, cap = 1 << 20;
        char *b = malloc(cap + 1);
        ck_assert_ptr_nonnull(b);
        for (;;) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            ck_assert_msg(poll(&p, 1, itest_scale_ms(30000)) == 1, "the listing did not come");
            if (got == cap) {
                cap *= 2;
                b = realloc(b, cap + 1);
                ck_assert_ptr_nonnull(b);
            }
            ssize_t k = read(fd, b + got, cap - got);
            ck_assert_int_ge(k, 0);
            if (k == 0)
                break;
            got += (size_t)k;
        }
        close(fd);
        b[got] = '\0';
        char *body = strstr(b, "\r\n\r\n");
        ck_assert_ptr_nonnull(body);
        cJSON *j = cJSON_Parse(body + 4);
        ck_assert_msg(j != NULL, "round %d: the listing is not JSON", round);
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(j, "sessions");
        ck_assert_int_eq(cJSON_GetArraySize(list), itest_int(j, "total"));
        /* Per connection number: its sessions listed that stay (round 0:
         * all; round 1: the odd-numbered). */
        int64_t num[NCONNS * 2];
        int kept[NCONNS * 2], nnum = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, list)
        {
            int64_t n = itest_int(cJSON_GetObjectItemCaseSensitive(e, "connection"), "number");
            int k = atoi(itest_str(e, "id") + 1), x = 0;
            while (x < nnum && num[x] != n)
                x++;
            if (x == nnum) {
                ck_assert_int_lt(nnum, NCONNS * 2);
                num[nnum] = n;
                kept[nnum++] = 0;
            }
            kept[x] += round == 0 || k % 2 == 1;
        }
        int whole = 0;
        for (int x = 0; x < nnum; x++) {
            ck_assert_int_le(kept[x], round == 0 ? PER : PER / 2);
            whole += kept[x] == (round == 0 ? PER : PER / 2);
        }
        ck_assert_msg(whole >= NCONNS / 2,
                      "round %d: %d connections have every session that stays listed, not %d",
                      round, whole, NCONNS / 2);
        cJSON_Delete(j);
        free(b);
        for (int i = 0; round == 1 && i < NCONNS; i++)
            for (int k = 0; c[i] != NULL && k < PER; k += 2) {
                char *line = itest_read_line(c[i], itest_scale_ms(10000), NULL);
                ck_assert_msg(line != NULL && strstr(line, "\"released\"") != NULL, "finish: %s",
                              line ? line : "(nothing)");
                free(line);
            }
    }
    /* Still serving, with what is left. */
    for (int i = 0; i < NCONNS; i++)
        if (c[i] != NULL)
            ck_assert_int_eq(itest_stat(c[i], "live_sessions"), NCONNS / 2 * (PER / 2));
    for (int i = 0; i < NCONNS; i++)
        itest_close(c[i]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("integration_listing");
    itest_add_timeout(s, "listing_leaves_the_port_served", test_listing_leaves_the_port_served,
                      240);
    itest_add(s, "listing_pool_bytes", test_listing_pool_bytes);
    itest_add_timeout(s, "listing_while_sessions_go", test_listing_while_sessions_go, 240);
    return itest_main(s);
}
