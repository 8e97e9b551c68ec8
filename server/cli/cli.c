/*
 * cli.c: slotd-cli, a command-line client for the session and admin ports.
 *
 *   slotd-cli [-h host] [-p port] [-a [host:]port] [-t seconds]
 *             [--auth-token-file PATH] [--raw] [--full] [COMMAND|JSON]...
 *
 * As with redis-cli, words make one command: `slotd-cli start a 1 2 3`.
 * When the first argument is a lone command word, all the arguments are
 * joined into that one command line; otherwise each argument is one
 * command line (`slotd-cli 'start a 1 2' 'step a 3' stats`, or JSON
 * lines).  With no argument the lines come from stdin: at a terminal
 * through libedit, with line editing, history (~/.slotd_history, or
 * $SLOTD_HISTFILE; empty: none) and Tab completion of command names; from
 * a pipe or a file, plainly, with no prompt.  cli_cmd.c turns each line
 * into a request and cli_out.c prints the reply.
 *
 * Session commands share one connection to the session port, opened at the
 * first of them, and each reply is printed before the next line is sent.
 * health and metrics open one HTTP/1.1 connection each to the admin port.
 * Every wait (connect, send, each reply) is bounded by -t seconds.
 *
 * With a token (--auth-token-file, or $SLOTD_AUTH_TOKEN_FILE as the daemon
 * reads it; the file checked by auth.c as the daemon checks it), every
 * session connection starts with {"op":"auth"} and goes on only after its
 * ok, and admin requests carry "Authorization: Bearer".  `auth TOKEN`, once
 * the daemon answers ok, sets the token the same way from then on.  The
 * token is never printed, and lines that carry one (auth TOKEN) stay out
 * of the history; other lines are kept trimmed, as they would be typed.
 *
 * Exit status: 0; 1 if any command got an error reply (from the daemon, an
 * admin answer other than 200, or refused here); 2 for a bad option; 3 if
 * a connection failed, was lost or timed out, or the token was refused
 * (auth_failed; the commands stop there).
 * At the terminal's prompt a failed connection is reported and retried at
 * the next command, and errors do not change the status.
 *
 * Non-blocking POSIX sockets and poll(); single-threaded.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <editline/readline.h>

#include "server/base/auth.h"
#include "cli_int.h"

#define CLI_DEFAULT_HOST "127.0.0.1"
#define CLI_DEFAULT_PORT "7070"
#define CLI_DEFAULT_ADMIN_PORT "7071"
#define CLI_DEFAULT_TIMEOUT 30
#define CLI_HISTORY_LINES 1000
#define CLI_MAX_HTTP (64u << 20) /* an admin answer larger than this is refused */

enum { EXIT_REPLY_ERROR = 1, EXIT_USAGE = 2, EXIT_CONNECTION = 3 };

typedef struct cli {
    int fd;         /* the session connection, or -1 until needed */
    int timeout_ms; /* per wait; -1 for none */
    const char *host;
    const char *port;
    char admin_host[256];
    char admin_port[8];
    cli_out_t out;
    bool interactive;
    unsigned errors; /* error replies and refused commands */
    char *in;        /* bytes received and not yet returned as lines (malloc) */
    size_t in_len;
    size_t in_cap;
    size_t line_len; /* the line last returned, consumed on the next read */

    char token[AUTH_TOKEN_MAX + 1]; /* --auth-token-file's, wiped at exit */
    size_t token_len;               /* 0: no token */
} cli_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: slotd-cli [-h host] [-p port] [-a [host:]port] [-t seconds]\n"
            "                 [--auth-token-file PATH] [--raw] [--full] [COMMAND|JSON]...\n"
            "\n"
            "  -h host            server address (default " CLI_DEFAULT_HOST ")\n"
            "  -p port            session port (default " CLI_DEFAULT_PORT ")\n"
            "  -a [host:]port     admin HTTP port, for health and metrics (default: the\n"
            "                     server address, port " CLI_DEFAULT_ADMIN_PORT ")\n"
            "  -t seconds         limit on each wait for the server (default %d, 0: none)\n"
            "  --auth-token-file PATH\n"
            "                     the daemon's token, in a file only its owner may read\n"
            "                     (default: $SLOTD_AUTH_TOKEN_FILE); sent as auth on each\n"
            "                     session connection and as a Bearer token to the admin port;\n"
            "                     the auth command, once accepted, does the same from then on\n"
            "  --raw              print the daemon's replies byte for byte (for scripts)\n"
            "  --full             print logits in full, not shortened\n"
            "  --help             this text\n"
            "\n"
            "Arguments: a lone command word joins every argument into one command\n"
            "(slotd-cli start a 1 2 3); otherwise each argument is one command line\n"
            "(slotd-cli 'start a 1 2 3' 'step a 2' 'finish a').  With none, lines are\n"
            "read from stdin; at a terminal with line editing, history (~/.slotd_history,\n"
            "or $SLOTD_HISTFILE) and Tab completion.  Colour only at a terminal, never\n"
            "with NO_COLOR set.\n"
            "\n",
            CLI_DEFAULT_TIMEOUT);
    cli_cmd_help_all(f);
    fprintf(f, "\n"
               "Output: one line per reply (id: a  tokens: [1 0]  logits: 2 × 6, first [...]),\n"
               "errors as (error) code: message.\n"
               "\n"
               "Exit status: 0 if every command succeeded; 1 if any got an error reply\n"
               "(or was refused here: unknown command, bad usage); 2 for a bad option;\n"
               "3 if a connection failed, was lost or timed out, or the token was refused.\n");
}

/* ---- Connections ---- */

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

static int64_t deadline_of(const cli_t *c)
{
    return c->timeout_ms < 0 ? -1 : now_ms() + c->timeout_ms;
}

/* Opens a non-blocking connection to host:port.  Returns the socket, or -1
 * after printing why. */
static int dial(const cli_t *c, const char *host, const char *port)
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
            int w = wait_fd(fd, POLLOUT, deadline_of(c));
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

static int send_all(const cli_t *c, int fd, const char *what, const char *data, size_t len)
{
    int64_t deadline = deadline_of(c);
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
static ssize_t recv_some(const cli_t *c, int fd, const char *what, char **buf, size_t *len,
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

static void session_close(cli_t *c)
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
    int64_t deadline = deadline_of(c);
    size_t scanned = 0;
    for (;;) {
        char *nl = c->in_len > scanned ? memchr(c->in + scanned, '\n', c->in_len - scanned) : NULL;
        if (nl != NULL) {
            *len = (size_t)(nl - c->in);
            c->line_len = *len + 1;
            return c->in;
        }
        scanned = c->in_len;
        ssize_t n = recv_some(c, c->fd, what, &c->in, &c->in_len, &c->in_cap, SIZE_MAX, deadline);
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
        rc = send_all(c, c->fd, what, line, len + 1);
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
static int session_call(cli_t *c, const char *json, bool *ok)
{
    *ok = false;
    char what[300];
    snprintf(what, sizeof(what), "%s:%s", c->host, c->port);
    if (c->fd < 0) {
        if ((c->fd = dial(c, c->host, c->port)) < 0)
            return -1;
        if (c->token_len > 0 && session_auth(c, what) != 0) {
            session_close(c);
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
    int rc = send_all(c, c->fd, what, line, len + 1);
    free(line);
    size_t rlen;
    char *reply = rc == 0 ? read_line(c, &rlen) : NULL;
    if (reply == NULL) {
        session_close(c);
        return -1;
    }
    if (cli_out_reply(&c->out, reply, rlen))
        c->errors++;
    else
        *ok = true;
    /* A wrong token (auth TOKEN): the daemon has closed the connection. */
    if (reply_is(reply, rlen, "auth_failed")) {
        session_close(c);
        return -1;
    }
    return 0;
}

/* GET `path` on the admin port over a connection of its own, and prints
 * the answer.  Returns 0, or -1 if the connection failed. */
static int http_call(cli_t *c, const char *path, const char *pattern)
{
    char what[300];
    snprintf(what, sizeof(what), "%s:%s", c->admin_host, c->admin_port);
    int fd = dial(c, c->admin_host, c->admin_port);
    if (fd < 0)
        return -1;
    char req[512 + AUTH_TOKEN_MAX];
    int n = snprintf(req, sizeof(req),
                     "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: slotd-cli\r\n"
                     "%s%s%s"
                     "Connection: close\r\n\r\n",
                     path, c->admin_host, c->token_len > 0 ? "Authorization: Bearer " : "",
                     c->token, c->token_len > 0 ? "\r\n" : "");
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = send_all(c, fd, what, req, (size_t)n);
    explicit_bzero(req, sizeof(req));
    /* Read to EOF: the request asked the daemon to close. */
    int64_t deadline = deadline_of(c);
    ssize_t got = 1;
    while (rc == 0 && got > 0) {
        got = recv_some(c, fd, what, &buf, &len, &cap, CLI_MAX_HTTP, deadline);
        if (got < 0)
            rc = -1;
    }
    close(fd);
    if (rc == 0) {
        buf[len] = '\0';
        int status = 0;
        char *body = strstr(buf, "\r\n\r\n");
        if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1 || body == NULL) {
            fprintf(stderr, "slotd-cli: %s did not answer in HTTP\n", what);
            rc = -1;
        } else {
            body += 4;
            /* Content-Length, when given, ends the body. */
            size_t blen = len - (size_t)(body - buf);
            for (char *h = strstr(buf, "\r\n"); h != NULL && h + 2 < body;
                 h = strstr(h + 2, "\r\n")) {
                unsigned long long cl;
                if (strncasecmp(h + 2, "Content-Length:", 15) == 0 &&
                    sscanf(h + 17, "%llu", &cl) == 1 && cl < blen)
                    blen = (size_t)cl;
            }
            if (cli_out_http(&c->out, path, status, body, blen, pattern))
                c->errors++;
        }
    }
    free(buf);
    return rc;
}

/* ---- Lines ---- */

/* The token of an `auth TOKEN` the daemon accepted: from now on the admin
 * port gets it as Bearer, and a new session connection presents it first,
 * as with --auth-token-file.  Only a token a token file could hold is kept
 * (printable ASCII, at most AUTH_TOKEN_MAX bytes): a daemon without a token
 * accepts any, and no other byte may go into a header. */
static void keep_token(cli_t *c, const char *token)
{
    size_t len = strlen(token);
    if (len > AUTH_TOKEN_MAX)
        return;
    for (size_t i = 0; i < len; i++)
        if (token[i] < ' ' || token[i] > '~')
            return;
    explicit_bzero(c->token, sizeof(c->token));
    memcpy(c->token, token, len + 1);
    c->token_len = len;
}

/* Runs one line of input: returns 0 to go on, 1 to stop (quit), -1 if a
 * connection failed. */
static int run_line(cli_t *c, const char *line)
{
    cli_req_t req = {.kind = CLI_NONE};
    int rc = 0;
    switch (cli_cmd_parse(line, &req, &c->out)) {
    case CLI_NONE:
    case CLI_LOCAL:
        break;
    case CLI_LOCAL_ERR:
        c->errors++;
        break;
    case CLI_QUIT:
        rc = 1;
        break;
    case CLI_SEND: {
        bool ok;
        rc = session_call(c, req.json, &ok);
        if (rc == 0 && ok && req.token != NULL)
            keep_token(c, req.token);
        break;
    }
    case CLI_HTTP:
        rc = http_call(c, req.path, req.pattern);
        break;
    }
    cli_req_clear(&req);
    return rc;
}

/* An argument may hold several lines; each is one command. */
static int run_arg(cli_t *c, const char *arg)
{
    char *copy = strdup(arg);
    if (copy == NULL)
        return -1;
    int rc = 0;
    char *save = NULL;
    for (char *l = strtok_r(copy, "\n", &save); l != NULL && rc == 0;
         l = strtok_r(NULL, "\n", &save))
        rc = run_line(c, l);
    free(copy);
    return rc;
}

/* Joins `n` words with spaces into one command line and runs it. */
static int run_words(cli_t *c, char **words, int n)
{
    size_t len = 1;
    for (int i = 0; i < n; i++)
        len += strlen(words[i]) + 1;
    char *line = malloc(len);
    if (line == NULL)
        return -1;
    line[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (i > 0)
            strcat(line, " ");
        strcat(line, words[i]);
    }
    int rc = run_line(c, line);
    free(line);
    return rc;
}

/* Lines from a pipe or a file: no prompt, no editing. */
static int run_stdin(cli_t *c)
{
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    ssize_t n;
    while (rc == 0 && (n = getline(&line, &cap, stdin)) >= 0) {
        if (n > 0 && line[n - 1] == '\n')
            line[n - 1] = '\0';
        rc = run_line(c, line);
    }
    free(line);
    return rc < 0 ? -1 : 0;
}

/* ---- At a terminal ---- */

/* Where history is kept: $SLOTD_HISTFILE (empty: nowhere), else
 * ~/.slotd_history.  NULL for nowhere; the caller frees the rest. */
static char *history_path(void)
{
    const char *env = getenv("SLOTD_HISTFILE");
    if (env != NULL)
        return env[0] != '\0' ? strdup(env) : NULL;
    const char *home = getenv("HOME");
    if (home == NULL || home[0] == '\0')
        return NULL;
    size_t len = strlen(home) + sizeof("/.slotd_history");
    char *p = malloc(len);
    if (p != NULL)
        snprintf(p, len, "%s/.slotd_history", home);
    return p;
}

/* Completion: command names for the first word, nothing after it (libedit
 * would offer file names otherwise). */
static char *complete_name(const char *text, int state)
{
    static size_t i;
    if (state == 0)
        i = 0;
    for (const char *name; (name = cli_cmd_name(i)) != NULL;) {
        i++;
        if (strncasecmp(name, text, strlen(text)) == 0)
            return strdup(name);
    }
    return NULL;
}

static char **complete(const char *text, int start, int end)
{
    (void)end;
    rl_attempted_completion_over = 1;
    return start == 0 ? rl_completion_matches(text, complete_name) : NULL;
}

static int run_terminal(cli_t *c)
{
    char *hist = history_path();
    rl_readline_name = "slotd-cli";
    rl_attempted_completion_function = complete;
    using_history();
    stifle_history(CLI_HISTORY_LINES);
    if (hist != NULL)
        read_history(hist); /* none yet is fine */
    int rc = 0;
    char *line;
    while (rc != 1 && (line = readline("slotd> ")) != NULL) {
        /* Kept as it would be typed again: without the blank Tab
         * completion leaves after a command name, or any other at either
         * end. */
        char *first = line + strspn(line, " \t");
        size_t len = strlen(first);
        while (len > 0 && (first[len - 1] == ' ' || first[len - 1] == '\t'))
            len--;
        if (len > 0 && !cli_cmd_is_secret(line)) {
            char *kept = strndup(first, len);
            if (kept != NULL)
                add_history(kept);
            free(kept);
            /* Saved at every line, so that a ^C or a lost terminal keeps it. */
            if (hist != NULL && write_history(hist) == 0)
                chmod(hist, 0600);
        }
        rc = run_line(c, line);
        free(line);
        /* At the prompt, a lost connection is retried at the next command. */
        if (rc < 0)
            session_close(c);
    }
    if (rc != 1)
        putchar('\n');
    clear_history();
    free(hist);
    return 0;
}

/* ---- Options ---- */

static bool parse_port(const char *s)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    return errno == 0 && end != s && *end == '\0' && v >= 1 && v <= 65535;
}

/* -a [host:]port; a bracketed IPv6 host ([::1]:7071) or just a port. */
static bool parse_admin(cli_t *c, const char *arg)
{
    const char *colon = strrchr(arg, ':');
    const char *port = colon != NULL ? colon + 1 : arg;
    if (!parse_port(port) || strlen(port) >= sizeof(c->admin_port))
        return false;
    snprintf(c->admin_port, sizeof(c->admin_port), "%s", port);
    if (colon != NULL) {
        const char *h = arg;
        size_t hl = (size_t)(colon - arg);
        if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
            h++;
            hl -= 2;
        }
        if (hl == 0 || hl >= sizeof(c->admin_host))
            return false;
        memcpy(c->admin_host, h, hl);
        c->admin_host[hl] = '\0';
    }
    return true;
}

static bool colour_on(int fd)
{
    const char *no = getenv("NO_COLOR");
    const char *term = getenv("TERM");
    return isatty(fd) && (no == NULL || no[0] == '\0') &&
           (term == NULL || strcmp(term, "dumb") != 0);
}

int main(int argc, char **argv)
{
    cli_t c = {.fd = -1, .host = CLI_DEFAULT_HOST, .port = CLI_DEFAULT_PORT};
    const char *admin = NULL;
    const char *token_file = NULL;
    int timeout = CLI_DEFAULT_TIMEOUT;
    static const struct option longopts[] = {
        {"raw", no_argument, NULL, 'r'},
        {"full", no_argument, NULL, 'f'},
        {"admin", required_argument, NULL, 'a'},
        {"help", no_argument, NULL, 'H'},
        {"auth-token-file", required_argument, NULL, 'T'},
        {NULL, 0, NULL, 0},
    };
    int opt;
    /* "+": stop at the first command, so JSON and command arguments are
     * never taken for options. */
    while ((opt = getopt_long(argc, argv, "+h:p:a:t:", longopts, NULL)) != -1) {
        switch (opt) {
        case 'h':
            c.host = optarg;
            break;
        case 'p':
            if (!parse_port(optarg)) {
                fprintf(stderr, "slotd-cli: bad port '%s'\n", optarg);
                return EXIT_USAGE;
            }
            c.port = optarg;
            break;
        case 'a':
            admin = optarg;
            break;
        case 't': {
            char *end;
            errno = 0;
            long v = strtol(optarg, &end, 10);
            if (errno != 0 || end == optarg || *end != '\0' || v < 0 || v > INT_MAX / 1000) {
                fprintf(stderr, "slotd-cli: bad timeout '%s'\n", optarg);
                return EXIT_USAGE;
            }
            timeout = (int)v;
            break;
        }
        case 'r':
            c.out.raw = true;
            break;
        case 'f':
            c.out.full = true;
            break;
        case 'T':
            token_file = optarg;
            break;
        case 'H':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return EXIT_USAGE;
        }
    }
    /* The admin host follows -h unless -a names one. */
    snprintf(c.admin_host, sizeof(c.admin_host), "%s", c.host);
    snprintf(c.admin_port, sizeof(c.admin_port), "%s", CLI_DEFAULT_ADMIN_PORT);
    if (admin != NULL && !parse_admin(&c, admin)) {
        fprintf(stderr, "slotd-cli: bad admin address '%s' (want [host:]port)\n", admin);
        return EXIT_USAGE;
    }
    /* The same variable as the daemon's, so that one export serves both. */
    const char *token_env = getenv("SLOTD_AUTH_TOKEN_FILE");
    if (token_file == NULL && token_env != NULL)
        token_file = token_env;
    if (token_file != NULL) {
        char err[512];
        if (auth_load(token_file, c.token, &c.token_len, err, sizeof(err)) != 0) {
            fprintf(stderr, "slotd-cli: %s%s\n", err,
                    token_file == token_env ? " (from SLOTD_AUTH_TOKEN_FILE)" : "");
            return EXIT_USAGE;
        }
    }
    c.timeout_ms = timeout == 0 ? -1 : timeout * 1000;
    c.out.colour = colour_on(STDOUT_FILENO);
    c.out.colour_err = colour_on(STDERR_FILENO);

    int rc = 0;
    if (optind < argc && cli_cmd_is_name(argv[optind])) {
        rc = run_words(&c, argv + optind, argc - optind);
    } else if (optind < argc) {
        for (int i = optind; i < argc && rc == 0; i++)
            rc = run_arg(&c, argv[i]);
    } else if (isatty(STDIN_FILENO)) {
        c.interactive = true;
        rc = run_terminal(&c);
    } else {
        rc = run_stdin(&c);
    }
    session_close(&c);
    free(c.in);
    explicit_bzero(c.token, sizeof(c.token));
    if (rc < 0)
        return EXIT_CONNECTION;
    return c.errors > 0 && !c.interactive ? EXIT_REPLY_ERROR : 0;
}
