/*
 * cli.c: slotd-cli, a command-line client for the session port.
 *
 *   slotd-cli [-h host] [-p port] [-t seconds] [--raw] [COMMAND|JSON]...
 *
 * As with redis-cli, words make one command: `slotd-cli start a 1 2 3`.
 * When the first argument is a lone shortcut word, all the arguments are
 * joined into that one command line; otherwise each argument is one command
 * line, as it would be typed at the prompt (`slotd-cli 'start a 1 2'
 * 'step a 3' stats`, or JSON lines).  All of them go over one connection
 * and each reply is printed before the next line is sent.  With no argument the lines come from stdin (with a
 * "slotd> " prompt when stdin is a terminal).  A line whose first word is
 * one of the shortcuts below is turned into its JSON request; any other
 * line is sent as it is, so the server judges it:
 *
 *   stats                  {"op":"stats"}
 *   start ID TOKEN...      {"op":"start","id":ID,"prompt":[TOKEN,...]}
 *   step ID [N]            {"op":"step","id":ID[,"n":N]}
 *   finish ID              {"op":"finish","id":ID}
 *   help, quit (exit)      local
 *
 * Replies are pretty-printed (cJSON, errors as "(error) code: message")
 * when stdout is a terminal, and printed as the raw line otherwise or with
 * --raw.  Server errors are printed as they come and do not change the exit
 * status: 0, or 1 if the connection fails or is lost (with a message on
 * stderr), or 2 for a bad option.  Every wait on the server (connect, send,
 * each reply) is bounded by -t seconds (default 30; 0 waits for ever).
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
#include <time.h>
#include <unistd.h>

#define CLI_DEFAULT_HOST "127.0.0.1"
#define CLI_DEFAULT_PORT "7070"
#define CLI_DEFAULT_TIMEOUT 30

typedef struct cli {
    int fd;
    int timeout_ms; /* per wait; -1 for none */
    bool pretty;
    const char *host;
    const char *port;
    char *in; /* bytes received and not yet returned as lines */
    size_t in_len;
    size_t in_cap;
    size_t line_len; /* the line last returned, consumed on the next read */
} cli_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: slotd-cli [-h host] [-p port] [-t seconds] [--raw] [COMMAND|JSON]...\n"
            "\n"
            "  -h host     server address (default " CLI_DEFAULT_HOST ")\n"
            "  -p port     session port (default " CLI_DEFAULT_PORT ")\n"
            "  -t seconds  limit on each wait for the server (default %d, 0: none)\n"
            "  --raw       print replies as received, even on a terminal\n"
            "  --help      this text\n"
            "\n"
            "Each argument is one command line; with none, lines are read from stdin.\n"
            "Type 'help' at the prompt for the commands.\n",
            CLI_DEFAULT_TIMEOUT);
}

static void help(void)
{
    printf("Commands (anything else is sent as a JSON request line):\n"
           "  stats                 daemon figures\n"
           "  start ID TOKEN...     start session ID with the prompt TOKEN...\n"
           "  step ID [N]           N greedy steps (default 1)\n"
           "  finish ID             release session ID\n"
           "  help                  this text\n"
           "  quit                  leave (also: exit, end of input)\n"
           "Example: {\"op\":\"logits\",\"tokens\":[0,1,2]}\n");
}

/* ---- Connection ---- */

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

/* Connects to c->host:c->port.  Returns 0, or -1 after printing why. */
static int cli_connect(cli_t *c)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res;
    int rc = getaddrinfo(c->host, c->port, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "slotd-cli: cannot resolve %s:%s: %s\n", c->host, c->port,
                gai_strerror(rc));
        return -1;
    }
    int err = 0;
    bool timed_out = false;
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            c->fd = fd;
            break;
        }
        if (errno == EINPROGRESS) {
            int w = wait_fd(fd, POLLOUT, deadline_of(c));
            socklen_t len = sizeof(err);
            if (w == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
                c->fd = fd;
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
    if (c->fd >= 0)
        return 0;
    fprintf(stderr, "slotd-cli: cannot connect to %s:%s: %s\n", c->host, c->port,
            timed_out ? "timed out" : strerror(err));
    return -1;
}

static int send_all(cli_t *c, const char *data, size_t len)
{
    int64_t deadline = deadline_of(c);
    while (len > 0) {
        ssize_t n = send(c->fd, data, len, MSG_NOSIGNAL);
        if (n > 0) {
            data += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int w = wait_fd(c->fd, POLLOUT, deadline);
            if (w == 1)
                continue;
            fprintf(stderr, "slotd-cli: sending to %s:%s: %s\n", c->host, c->port,
                    w == 0 ? "timed out" : strerror(errno));
            return -1;
        }
        fprintf(stderr, "slotd-cli: connection to %s:%s lost: %s\n", c->host, c->port,
                strerror(errno));
        return -1;
    }
    return 0;
}

/* Returns the next line from the server (without "\n"), valid until the
 * next call, or NULL after printing why (closed, timed out, error). */
static char *read_line(cli_t *c, size_t *len)
{
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
            *nl = '\0';
            *len = (size_t)(nl - c->in);
            c->line_len = *len + 1;
            if (*len > 0 && c->in[*len - 1] == '\r')
                c->in[--*len] = '\0';
            return c->in;
        }
        scanned = c->in_len;
        if (c->in_cap - c->in_len < 4096) {
            size_t cap = c->in_cap ? c->in_cap * 2 : 65536;
            char *p = realloc(c->in, cap);
            if (p == NULL) {
                fprintf(stderr, "slotd-cli: out of memory\n");
                return NULL;
            }
            c->in = p;
            c->in_cap = cap;
        }
        ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len - 1, 0);
        if (n > 0) {
            c->in_len += (size_t)n;
            continue;
        }
        if (n == 0) {
            fprintf(stderr, "slotd-cli: %s:%s closed the connection\n", c->host, c->port);
            return NULL;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int w = wait_fd(c->fd, POLLIN, deadline);
            if (w == 1)
                continue;
            if (w == 0)
                fprintf(stderr, "slotd-cli: no reply from %s:%s within %d s\n", c->host, c->port,
                        c->timeout_ms / 1000);
            else
                fprintf(stderr, "slotd-cli: %s\n", strerror(errno));
            return NULL;
        }
        fprintf(stderr, "slotd-cli: connection to %s:%s lost: %s\n", c->host, c->port,
                strerror(errno));
        return NULL;
    }
}

/* ---- Output ---- */

static void print_reply(const cli_t *c, const char *line, size_t len)
{
    cJSON *j = c->pretty ? cJSON_ParseWithLength(line, len) : NULL;
    if (j == NULL) {
        fwrite(line, 1, len, stdout);
        fputc('\n', stdout);
    } else {
        cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
        cJSON *code = cJSON_GetObjectItemCaseSensitive(err, "code");
        cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
        if (cJSON_IsString(code) && cJSON_IsString(msg)) {
            printf("(error) %s: %s\n", code->valuestring, msg->valuestring);
        } else {
            char *s = cJSON_Print(j);
            if (s != NULL)
                printf("%s\n", s);
            else
                printf("%.*s\n", (int)len, line);
            cJSON_free(s);
        }
        cJSON_Delete(j);
    }
    fflush(stdout);
}

/* ---- Commands ---- */

enum { CMD_SEND, CMD_LOCAL, CMD_QUIT };

/* Splits `s` in place into at most `max` words; returns the count. */
static int split_words(char *s, char **w, int max)
{
    int n = 0;
    for (char *tok = strtok(s, " \t\r,"); tok != NULL && n < max; tok = strtok(NULL, " \t\r,"))
        w[n++] = tok;
    return n;
}

static bool parse_int(const char *s, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0')
        return false;
    *out = v;
    return true;
}

/* Builds the request for a shortcut in `words` into *json (malloc), or
 * prints a usage line and returns CMD_LOCAL. */
static int shortcut(char **w, int n, char **json)
{
    cJSON *o = cJSON_CreateObject();
    int rc = CMD_SEND;
    long long v;

    if (strcasecmp(w[0], "stats") == 0 && n == 1) {
        cJSON_AddStringToObject(o, "op", "stats");
    } else if (strcasecmp(w[0], "start") == 0 && n >= 2) {
        cJSON_AddStringToObject(o, "op", "start");
        cJSON_AddStringToObject(o, "id", w[1]);
        cJSON *prompt = cJSON_AddArrayToObject(o, "prompt");
        for (int i = 2; i < n && rc == CMD_SEND; i++) {
            if (!parse_int(w[i], &v)) {
                fprintf(stderr, "(error) start: token '%s' is not an integer\n", w[i]);
                rc = CMD_LOCAL;
            } else {
                cJSON_AddItemToArray(prompt, cJSON_CreateNumber((double)v));
            }
        }
    } else if (strcasecmp(w[0], "step") == 0 && (n == 2 || n == 3)) {
        cJSON_AddStringToObject(o, "op", "step");
        cJSON_AddStringToObject(o, "id", w[1]);
        if (n == 3) {
            if (parse_int(w[2], &v)) {
                cJSON_AddNumberToObject(o, "n", (double)v);
            } else {
                fprintf(stderr, "(error) step: N '%s' is not an integer\n", w[2]);
                rc = CMD_LOCAL;
            }
        }
    } else if (strcasecmp(w[0], "finish") == 0 && n == 2) {
        cJSON_AddStringToObject(o, "op", "finish");
        cJSON_AddStringToObject(o, "id", w[1]);
    } else {
        fprintf(stderr, "(error) usage: %s\n",
                strcasecmp(w[0], "stats") == 0   ? "stats"
                : strcasecmp(w[0], "start") == 0 ? "start ID TOKEN..."
                : strcasecmp(w[0], "step") == 0  ? "step ID [N]"
                                                 : "finish ID");
        rc = CMD_LOCAL;
    }
    if (rc == CMD_SEND) {
        *json = cJSON_PrintUnformatted(o);
        if (*json == NULL) {
            fprintf(stderr, "slotd-cli: out of memory\n");
            rc = CMD_LOCAL;
        }
    }
    cJSON_Delete(o);
    return rc;
}

static bool is_blank(const char *s)
{
    return s[strspn(s, " \t\r")] == '\0';
}

/* Turns one command line into the request to send (*json, malloc'd), or
 * handles it locally. */
static int translate(const char *line, char **json)
{
    char first[16];
    const char *p = line + strspn(line, " \t");
    size_t wl = strcspn(p, " \t\r");
    *json = NULL;
    if (wl < sizeof(first)) {
        memcpy(first, p, wl);
        first[wl] = '\0';
        if (strcasecmp(first, "help") == 0) {
            help();
            return CMD_LOCAL;
        }
        if (strcasecmp(first, "quit") == 0 || strcasecmp(first, "exit") == 0)
            return CMD_QUIT;
        if (strcasecmp(first, "stats") == 0 || strcasecmp(first, "start") == 0 ||
            strcasecmp(first, "step") == 0 || strcasecmp(first, "finish") == 0) {
            char *copy = strdup(line);
            char **w = calloc(strlen(line) / 2 + 2, sizeof(*w));
            int rc = CMD_LOCAL;
            if (copy != NULL && w != NULL)
                rc = shortcut(w, split_words(copy, w, (int)(strlen(line) / 2 + 2)), json);
            free(w);
            free(copy);
            return rc;
        }
    }
    *json = strdup(line);
    return *json != NULL ? CMD_SEND : CMD_LOCAL;
}

/* Runs one line of input: returns 0 to go on, 1 to stop (quit), -1 if the
 * connection failed. */
static int run_line(cli_t *c, const char *line)
{
    if (is_blank(line))
        return 0;
    char *json;
    int what = translate(line, &json);
    if (what == CMD_QUIT)
        return 1;
    if (what == CMD_LOCAL)
        return 0;
    size_t len = strlen(json);
    json[len] = '\n';
    int rc = send_all(c, json, len + 1);
    free(json);
    if (rc != 0)
        return -1;
    size_t rlen;
    char *reply = read_line(c, &rlen);
    if (reply == NULL)
        return -1;
    print_reply(c, reply, rlen);
    return 0;
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

/* True for an argument that is exactly one shortcut word ("start"). */
static bool is_shortcut_word(const char *arg)
{
    static const char *const words[] = {"stats", "start", "step", "finish", "help"};
    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
        if (strcasecmp(arg, words[i]) == 0)
            return true;
    return false;
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

static int run_stdin(cli_t *c)
{
    bool tty = isatty(STDIN_FILENO);
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    for (;;) {
        if (tty) {
            fputs("slotd> ", stdout);
            fflush(stdout);
        }
        ssize_t n = getline(&line, &cap, stdin);
        if (n < 0) {
            if (tty)
                fputc('\n', stdout);
            break;
        }
        if (n > 0 && line[n - 1] == '\n')
            line[n - 1] = '\0';
        rc = run_line(c, line);
        if (rc != 0)
            break;
    }
    free(line);
    return rc < 0 ? -1 : 0;
}

int main(int argc, char **argv)
{
    cli_t c = {.fd = -1, .host = CLI_DEFAULT_HOST, .port = CLI_DEFAULT_PORT};
    int timeout = CLI_DEFAULT_TIMEOUT;
    bool raw = false;
    static const struct option longopts[] = {
        {"raw", no_argument, NULL, 'r'},
        {"help", no_argument, NULL, 'H'},
        {NULL, 0, NULL, 0},
    };
    int opt;
    long long v;
    /* "+": stop at the first command, so JSON and shortcut arguments are
     * never taken for options. */
    while ((opt = getopt_long(argc, argv, "+h:p:t:", longopts, NULL)) != -1) {
        switch (opt) {
        case 'h':
            c.host = optarg;
            break;
        case 'p':
            if (!parse_int(optarg, &v) || v < 1 || v > 65535) {
                fprintf(stderr, "slotd-cli: bad port '%s'\n", optarg);
                return 2;
            }
            c.port = optarg;
            break;
        case 't':
            if (!parse_int(optarg, &v) || v < 0 || v > INT_MAX / 1000) {
                fprintf(stderr, "slotd-cli: bad timeout '%s'\n", optarg);
                return 2;
            }
            timeout = (int)v;
            break;
        case 'r':
            raw = true;
            break;
        case 'H':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    c.timeout_ms = timeout == 0 ? -1 : timeout * 1000;
    c.pretty = !raw && isatty(STDOUT_FILENO);

    if (cli_connect(&c) != 0)
        return 1;
    int rc = 0;
    if (optind < argc && is_shortcut_word(argv[optind])) {
        rc = run_words(&c, argv + optind, argc - optind);
    } else if (optind < argc) {
        for (int i = optind; i < argc && rc == 0; i++)
            rc = run_arg(&c, argv[i]);
    } else {
        rc = run_stdin(&c);
    }
    close(c.fd);
    free(c.in);
    return rc < 0 ? 1 : 0;
}
