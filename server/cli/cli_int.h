/*
 * cli_int.h: what the files of slotd-cli share.  cli.c owns the options
 * and the input loop (libedit at a terminal); cli_net.c the sockets and
 * the session port's lines; cli_http.c the admin port's HTTP client;
 * cli_cmd.c the command table, which turns a typed line into a request;
 * cli_out.c how replies are printed.  Single-threaded, no lock.
 */
#ifndef SLOTD_SERVER_CLI_CLI_INT_H
#define SLOTD_SERVER_CLI_CLI_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "server/base/auth.h"

/** What a command line turned into. */
typedef enum cli_kind {
    CLI_NONE,      /* a blank line: nothing to do */
    CLI_SEND,      /* send req.json on the session port and print the reply */
    CLI_HTTP,      /* GET req.path on the admin port and print the answer */
    CLI_LOCAL,     /* handled here (help); nothing to send */
    CLI_LOCAL_ERR, /* refused here (unknown command, bad usage), error printed */
    CLI_QUIT,      /* quit or exit */
} cli_kind_t;

/** One translated line.  Owns json, pattern and token; cli_req_clear()
 * wipes the secrets and frees them. */
typedef struct cli_req {
    cli_kind_t kind;
    char *json;       /* CLI_SEND: the request, without "\n" (malloc) */
    const char *path; /* CLI_HTTP: "/health" or "/metrics" (static) */
    char *pattern;    /* CLI_HTTP: keep only the lines holding it, or NULL (malloc) */
    char *token;      /* CLI_SEND of the auth command: its token, which the
                       * client keeps for both ports once the daemon answers
                       * ok (malloc), else NULL */
} cli_req_t;

/** How replies are printed. */
typedef struct cli_out {
    bool raw;        /* the daemon's bytes as they came */
    bool full;       /* logits in full rather than shortened */
    bool colour;     /* ANSI colour on stdout */
    bool colour_err; /* ANSI colour on stderr */
} cli_out_t;

/** The client: its connections, its settings and its token.  main()'s
 * (cli.c); one thread. */
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

/* ---- cli_net.c ---- */

/** The deadline of a wait that starts now: ms, or -1 for none. */
int64_t cli_net_deadline(const cli_t *c);

/** A non-blocking connection to host:port within the timeout: the socket,
 * or -1 after printing why. */
int cli_net_dial(const cli_t *c, const char *host, const char *port);

/** Sends all of `data` on `fd` (`what` names the peer in messages): 0, or
 * -1 after printing why. */
int cli_net_send(const cli_t *c, int fd, const char *what, const char *data, size_t len);

/** Receives into *buf (grown, at most `max` bytes) until `deadline`: the
 * bytes read (0 at EOF), or -1 after printing why. */
ssize_t cli_net_recv(const cli_t *c, int fd, const char *what, char **buf, size_t *len,
                     size_t *cap, size_t max, int64_t deadline);

/** Sends one request line on the session connection (opened, and
 * authenticated with a token, at need) and prints its reply; *ok says
 * whether it was not an error.  0, or -1 if the connection failed or the
 * daemon refused a token (closed then). */
int cli_net_call(cli_t *c, const char *json, bool *ok);

/** Closes the session connection, if open, and drops its buffered bytes. */
void cli_net_close(cli_t *c);

/* ---- cli_http.c ---- */

/** GET `path` on the admin port and prints the answer (lines holding
 * `pattern` only, if not NULL).  0, or -1 if the connection failed. */
int cli_http_get(cli_t *c, const char *path, const char *pattern);

/* ---- cli_cmd.c ---- */

/** Translates one typed line into *req (cleared first).  Prints help and
 * local errors itself (errors on stderr, through `o`).  Returns req->kind. */
cli_kind_t cli_cmd_parse(const char *line, cli_req_t *req, const cli_out_t *o);

/** Frees what *req owns and sets it to CLI_NONE. */
void cli_req_clear(cli_req_t *req);

/** True if `word` names a command (any case). */
bool cli_cmd_is_name(const char *word);

/** True if `line` carries a token (an auth command, or a JSON line with a
 * "token" member): such a line is kept out of the history. */
bool cli_cmd_is_secret(const char *line);

/** The name of the i-th command, for completion; NULL past the last.
 * Static strings. */
const char *cli_cmd_name(size_t i);

/** Prints the command list to `f`. */
void cli_cmd_help_all(FILE *f);

/* ---- cli_out.c ---- */

/** Prints one reply line of the session port (`len` bytes, no "\n") to
 * stdout.  Returns true if it is an error reply. */
bool cli_out_reply(const cli_out_t *o, const char *line, size_t len);

/** Prints the answer to GET `path` on the admin port: HTTP status `status`,
 * body `body` of `len` bytes; with `pattern`, only the body's lines that
 * hold it.  Returns true if the status is not 200. */
bool cli_out_http(const cli_out_t *o, const char *path, int status, const char *body, size_t len,
                  const char *pattern);

/** Prints "(error) " and the formatted message on stderr, in red at a
 * terminal. */
void cli_out_error(const cli_out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
