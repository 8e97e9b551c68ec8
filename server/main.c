/*
 * main.c: slotd's entry point.  It reads the settings (flags over SLOTD_*
 * environment variables), sets the log level, and runs the daemon.  Exit
 * status: 0 after a clean shutdown (and for --help, --version), 1 if
 * start-up failed or a shutdown overran its timeout, 2 for a bad flag or
 * value.
 */
#include <signal.h>
#include <stdio.h>

#include "config.h"
#include "server/base/log.h"
#include "proto/proto.h"
#include "server.h"

extern char **environ;

int main(int argc, char **argv)
{
    static server_config_t cfg; /* outlives server_run() */
    char err[256];

    switch (config_parse(&cfg, argc, argv, environ, err, sizeof(err))) {
    case CONFIG_OK:
        break;
    case CONFIG_HELP:
        config_usage(stdout);
        return 0;
    case CONFIG_VERSION:
        printf("slotd %s\n", config_version());
        return 0;
    case CONFIG_ERROR:
        fprintf(stderr, "slotd: %s\n", err);
        return 2;
    }
    log_set_level(cfg.log_level);
    /* A peer that resets the connection must not kill the daemon: libuv
     * reports EPIPE from the write instead. */
    signal(SIGPIPE, SIG_IGN);
    /* The parser's cJSON hooks are set before any other thread exists. */
    proto_init();
    return server_run(&cfg);
}
