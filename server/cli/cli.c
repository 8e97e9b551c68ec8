/*
 * cli.c: slotd-cli, a command-line client for the session and admin ports:
 * its options, the lines it reads (arguments, stdin, the terminal) and
 * main().  The sockets are cli_net.c's, the admin port's HTTP cli_http.c's.
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
 * Non-blocking POSIX sockets and poll() (cli_net.c); single-threaded.
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

enum { EXIT_REPLY_ERROR = 1, EXIT_USAGE = 2, EXIT_CONNECTION = 3 };

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
        rc = cli_net_call(c, req.json, &ok);
        if (rc == 0 && ok && req.token != NULL)
            keep_token(c, req.token);
        break;
    }
    case CLI_HTTP:
        rc = cli_http_get(c, req.path, req.pattern);
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
            cli_net_close(c);
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
    cli_net_close(&c);
    free(c.in);
    explicit_bzero(c.token, sizeof(c.token));
    if (rc < 0)
        return EXIT_CONNECTION;
    return c.errors > 0 && !c.interactive ? EXIT_REPLY_ERROR : 0;
}
