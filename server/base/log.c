/*
 * log.c: formats and writes the daemon's log lines (see log.h).
 *
 * It owns nothing but the current level, a relaxed atomic read by every
 * thread that logs.  A line is built in a stack buffer (long messages are
 * cut at 1 KiB and marked with "...") and goes out in one write(2) to
 * stderr, which POSIX keeps whole for pipes up to PIPE_BUF.
 */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Atomic int log_min_level = LOG_LEVEL_INFO;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void log_set_level(log_level_t level)
{
    atomic_store_explicit(&log_min_level, (int)level, memory_order_relaxed);
}

bool log_enabled(log_level_t level)
{
    return (int)level >= atomic_load_explicit(&log_min_level, memory_order_relaxed);
}

int log_level_parse(const char *s, log_level_t *out)
{
    for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (log_level_t)i;
            return 0;
        }
    }
    return -1;
}

const char *log_level_name(log_level_t level)
{
    if ((unsigned)level < sizeof(level_names) / sizeof(level_names[0]))
        return level_names[level];
    return "?";
}

void log_write(log_level_t level, const char *fmt, ...)
{
    char line[1200];
    struct timespec ts;
    struct tm tm;
    size_t len;
    int n;
    va_list ap;

    if (!log_enabled(level))
        return;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    len = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
    n = snprintf(line + len, sizeof(line) - len, ".%03ldZ %-5s ", ts.tv_nsec / 1000000L,
                 log_level_name(level));
    len += (size_t)n;

    va_start(ap, fmt);
    n = vsnprintf(line + len, 1024, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if (n >= 1024) {
        len += 1023;
        memcpy(line + len - 3, "...", 3);
    } else {
        len += (size_t)n;
    }
    line[len++] = '\n';

    /* Best effort: a log line that cannot be written is dropped. */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
