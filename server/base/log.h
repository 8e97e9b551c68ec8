/*
 * log.h: the daemon's log lines on stderr.
 *
 * One line per call: an ISO-8601 UTC timestamp with milliseconds, the level
 * and the message, written with a single write(2) so that lines from
 * different threads never interleave.  Lines below the level set with
 * log_set_level() are dropped before any formatting.
 */
#ifndef SLOTD_SERVER_LOG_H
#define SLOTD_SERVER_LOG_H

#include <stdbool.h>

typedef enum log_level {
    LOG_LEVEL_DEBUG = 0,
    LOG_LEVEL_INFO,
    LOG_LEVEL_WARN,
    LOG_LEVEL_ERROR,
} log_level_t;

/** Sets the lowest level written.  Any thread; takes effect at once. */
void log_set_level(log_level_t level);

/** True if a line at `level` would be written. */
bool log_enabled(log_level_t level);

/** Parses "debug", "info", "warn" or "error" into *out.  Returns 0, or -1
 * for any other string (then *out is unchanged). */
int log_level_parse(const char *s, log_level_t *out);

/** The level's name ("debug", ...).  Static. */
const char *log_level_name(log_level_t level);

/** Writes one line at `level` (a newline is added).  Any thread. */
void log_write(log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_debug(...) log_write(LOG_LEVEL_DEBUG, __VA_ARGS__)
#define log_info(...) log_write(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_warn(...) log_write(LOG_LEVEL_WARN, __VA_ARGS__)
#define log_error(...) log_write(LOG_LEVEL_ERROR, __VA_ARGS__)

#endif
