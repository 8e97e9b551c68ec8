/*
 * cli_net.c: slotd-cli's sockets and the session port's lines: a
 * non-blocking connection dialled with a deadline, sending and receiving
 * under -t, the lines of the session port split out of what arrives, the
 * auth line a token makes first, and one request sent and its reply
 * printed (cli_net_call()).
 *
 * DESIGN.  slotd-cli is single-threaded: these run on its one thread, on
 * the cli_t that main() owns (its session socket and input buffer); no
 * lock.  Every wait is poll() until the deadline -t gives.  Errors are
 * printed here, on stderr, and the caller gets -1.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "cli_int.h"

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits for `events` on the socket until `deadline` (ms, or -1 for none).
 * Returns 1 when ready, 0 on timeout, -1 on error (errno set). */
static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int ms = -1;
        if (deadline >= 0) {
            int64_t left = deadline - now_ms();
            if (left <= 0)
                return 0;
            ms = left > INT_MAX ? INT_MAX : (int)left;
        }
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, ms);
        if (n > 0)
            return 1;
        if (n == 0)
            return 0;
        if (errno != EINTR)
            return -1;
    }
}

/* The deadline of a wait that starts now (ms, or -1 for none). */
int64_t cli_net_deadline(const cli_t *c)
{
    return c->timeout_ms < 0 ? -1 : now_ms() + c->timeout_ms;
}

/* Opens a non-blocking connection to host:port.  Returns the socket, or -1
 * after printing why. */
int cli_net_dial(const cli_t *c, const char *host, const char *port)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "slotd-cli: cannot resolve %s:%s: %s\n", host, port, gai_strerror(rc));
        return -1;
    }
    int err = 0, out = -1;
    bool timed_out = false;
    for (struct addrinfo *ai = res; ai != NULL && out < 0; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            out = fd;
            break;
        }
        if (errno == EINPROGRESS) {
            int w = wait_fd(fd, POLLOUT, cli_net_deadline(c));
            socklen_t len = sizeof(err);
            if (w == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
                out = fd;
                break;
            }
            if (w == 0)
                timed_out = true;
            else if (w < 0)
                err = errno;
        } else {
            err = errno;
        }
        close(fd);
    }
    freeaddrinfo(res);
    if (out < 0)
        fprintf(stderr, "slotd-cli: cannot connect to %s:%s: %s\n", host, port,
                timed_out ? "timed out" : strerror(err));
    return out;
}

/* Sends all `len` bytes of `data` on `fd` (to `what`, for messages) within
 * the timeout.  Returns 0, or -1 after printing why. */
int cli_net_send(const cli_t *c, int fd, const char *what, const char *data, size_t len)
{
    int64_t deadline = cli_net_deadline(c);
    while (len > 0) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL);
        if (n > 0) {
            data += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int w = wait_fd(fd, POLLOUT, deadline);
            if (w == 1)
                continue;
            fprintf(stderr, "slotd-cli: sending to %s: %s\n", what,
                    w == 0 ? "timed out" : strerror(errno));
            return -1;
        }
        fprintf(stderr, "slotd-cli: connection to %s lost: %s\n", what, strerror(errno));
        return -1;
    }
    return 0;
}

/* Receives into *buf (grown as needed, at most `max` bytes) until the
 * deadline.  Returns the bytes read (0 at EOF), or -1 after printing why. */
ssize_t cli_net_recv(const cli_t *c, int fd, const char *what, char **buf, size_t *len,
                     size_t *cap, size_t max, int64_t deadline)
{
    if (*cap - *len < 4096) {
        size_t ncap = *cap ? *cap * 2 : 65536;
        if (*len >= max) {
            fprintf(stderr, "slotd-cli: answer from %s larger than %zu bytes\n", what, max);
            return -1;
        }
        char *p = realloc(*buf, ncap);
        if (p == NULL) {
            fprintf(stderr, "slotd-cli: out of memory\n");
            return -1;
        }
        *buf = p;
        *cap = ncap;
    }
    for (;;) {
        ssize_t n = recv(fd, *buf + *len, *cap - *len - 1, 0);
        if (n >= 0) {
            *len += (size_t)n;
            return n;
        }
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            break;
        int w = wait_fd(fd, POLLIN, deadline);
        if (w == 1)
            continue;
        if (w == 0)
            fprintf(stderr, "slotd-cli: no answer from %s within %d s\n", what,
                    c->timeout_ms / 1000);
        else
            fprintf(stderr, "slotd-cli: %s: %s\n", what, strerror(errno));
        return -1;
    }
    fprintf(stderr, "slotd-cli: connection to %s lost: %s\n", what, strerror(errno));
    return -1;
}

/* Closes the session connection, if open, and drops what was buffered. */
void cli_net_close(cli_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->in_len = 0;
    c->line_len = 0;
}

/* Returns the next line from the session port (without "\n"), valid until
 * the next call, or NULL after printing why (closed, timed out, error). */
static char *read_line(cli_t *c, size_t *len)
{
    char what[300];
    snprintf(what, sizeof(what), "%s:%s", c->host, c->port);
    /* Drop the line returned last time. */
    if (c->line_len > 0) {
        memmove(c->in, c->in + c->line_len, c->in_len - c->line_len);
        c->in_len -= c->line_len;
        c->line_len = 0;
    }
    int64_t deadline = cli_net_deadline(c);
    size_t scanned = 0;
    for (;;) {
        char *nl = c->in_len > scanned ? memchr(c->in + scanned, '\n', c->in_len - scanned) : NULL;
        if (nl != NULL) {
            *len = (size_t)(nl - c->in);
            c->line_len = *len + 1;
            return c->in;
        }
        scanned = c->in_len;
        ssize_t n = cli_net_recv(c, c->fd, what, &c->in, &c->in_len, &c->in_cap, SIZE_MAX, deadline);
        if (n == 0)
            fprintf(stderr, "slotd-cli: %s closed the connection\n", what);
        if (n <= 0)
            return NULL;
    }
}

/* True if the reply line is an error whose code is `code`. */
static bool reply_is(const char *line, size_t len, const char *code)
{
    cJSON *j = cJSON_ParseWithLength(line, len);
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
    const cJSON *cj = cJSON_GetObjectItemCaseSensitive(err, "code");
    bool is = cJSON_IsString(cj) && strcmp(cj->valuestring, code) == 0;
    cJSON_Delete(j);
    return is;
}

/* The first line of a new session connection when a token is set: sends
 * {"op":"auth"} and waits for its ok.  Returns 0, or -1 after saying why
 * (an error reply as "(error) code: message", which never holds the
 * token). */
static int session_auth(cli_t *c, const char *what)
{
    cJSON *o = cJSON_CreateObject();
    char *json = NULL;
    if (o != NULL && cJSON_AddStringToObject(o, "op", "auth") != NULL &&
        cJSON_AddStringToObject(o, "token", c->token) != NULL)
        json = cJSON_PrintUnformatted(o);
    if (o != NULL) {
        /* cJSON keeps its copy of the token in the item: wipe it too. */
        cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "token");
        if (cJSON_IsString(t))
            explicit_bzero(t->valuestring, strlen(t->valuestring));
        cJSON_Delete(o);
    }
    if (json == NULL) {
        fprintf(stderr, "slotd-cli: out of memory\n");
        return -1;
    }
    size_t len = strlen(json);
    char *line = malloc(len + 1);
    int rc = -1;
    if (line == NULL) {
        fprintf(stderr, "slotd-cli: out of memory\n");
    } else {
        memcpy(line, json, len);
        line[len] = '\n';
        rc = cli_net_send(c, c->fd, what, line, len + 1);
        explicit_bzero(line, len + 1);
        free(line);
    }
    explicit_bzero(json, len);
    free(json);
    size_t rlen;
    char *reply = rc == 0 ? read_line(c, &rlen) : NULL;
    if (reply == NULL)
        return -1;
    cJSON *j = cJSON_ParseWithLength(reply, rlen);
    const cJSON *ok = cJSON_GetObjectItemCaseSensitive(j, "ok");
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(err, "code");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
    rc = 0;
    if (cJSON_IsString(code)) {
        cli_out_error(&c->out, "%s: %s", code->valuestring,
                      cJSON_IsString(msg) ? msg->valuestring : "?");
        rc = -1;
    } else if (!cJSON_IsTrue(ok)) {
        fprintf(stderr, "slotd-cli: %s answered auth with something else than ok\n", what);
        rc = -1;
    }
    cJSON_Delete(j);
    return rc;
}

/* Sends one request line and prints its reply; *ok says whether the reply
 * was not an error.  Returns 0, or -1 if the connection failed or the
 * daemon refused a token (it is closed then). */
int cli_net_call(cli_t *c, const char *json, bool *ok)
{
    *ok = false;
    char what[300];
    snprintf(what, sizeof(what), "%s:%s", c->host, c->port);
    if (c->fd < 0) {
        if ((c->fd = cli_net_dial(c, c->host, c->port)) < 0)
            return -1;
        if (c->token_len > 0 && session_auth(c, what) != 0) {
            cli_net_close(c);
            return -1;
        }
    }
    size_t len = strlen(json);
    char *line = malloc(len + 1);
    if (line == NULL) {
        fprintf(stderr, "slotd-cli: out of memory\n");
        return -1;
    }
    memcpy(line, json, len);
    line[len] = '\n';
    int rc = cli_net_send(c, c->fd, what, line, len + 1);
    free(line);
    size_t rlen;
    char *reply = rc == 0 ? read_line(c, &rlen) : NULL;
    if (reply == NULL) {
        cli_net_close(c);
        return -1;
    }
    if (cli_out_reply(&c->out, reply, rlen))
        c->errors++;
    else
        *ok = true;
    /* A wrong token (auth TOKEN): the daemon has closed the connection. */
    if (reply_is(reply, rlen, "auth_failed")) {
        cli_net_close(c);
        return -1;
    }
    return 0;
}
