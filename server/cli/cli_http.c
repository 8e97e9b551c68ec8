/*
 * cli_http.c: slotd-cli's HTTP/1.1 client for the admin port: GET of
 * /health or /metrics over a connection of its own, with the token as
 * Bearer, read to the end, its status and body (to Content-Length) handed
 * to cli_out_http().
 *
 * DESIGN.  slotd-cli's one thread, on main()'s cli_t (the admin address,
 * the token, the error count); no lock.  The sockets are cli_net.c's.  An
 * answer larger than CLI_MAX_HTTP is refused.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli_int.h"

#define CLI_MAX_HTTP (64u << 20) /* an admin answer larger than this is refused */

/* GET `path` on the admin port over a connection of its own, and prints
 * the answer.  Returns 0, or -1 if the connection failed. */
int cli_http_get(cli_t *c, const char *path, const char *pattern)
{
    char what[300];
    snprintf(what, sizeof(what), "%s:%s", c->admin_host, c->admin_port);
    int fd = cli_net_dial(c, c->admin_host, c->admin_port);
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
    int rc = cli_net_send(c, fd, what, req, (size_t)n);
    explicit_bzero(req, sizeof(req));
    /* Read to EOF: the request asked the daemon to close. */
    int64_t deadline = cli_net_deadline(c);
    ssize_t got = 1;
    while (rc == 0 && got > 0) {
        got = cli_net_recv(c, fd, what, &buf, &len, &cap, CLI_MAX_HTTP, deadline);
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
