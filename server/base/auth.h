/*
 * auth.h: the shared secret of --auth-token-file: reading it from its file
 * and comparing a presented token with it.
 *
 * DESIGN.  No state and no lock: auth_load() runs once at start-up, before
 * any thread; auth_equal() is pure and safe on any thread.
 */
#ifndef SLOTD_SERVER_AUTH_H
#define SLOTD_SERVER_AUTH_H

#include <stdbool.h>
#include <stddef.h>

/** The shortest and longest token a file may hold, in bytes. */
#define AUTH_TOKEN_MIN 16
#define AUTH_TOKEN_MAX 4096

/** Reads the token in the file at `path` into `out` (at least
 * AUTH_TOKEN_MAX + 1 bytes; NUL-terminated) and its length into *len.  The
 * file must be a regular file that no one but its owner may read, and hold
 * AUTH_TOKEN_MIN..AUTH_TOKEN_MAX printable ASCII bytes (space to '~'), then
 * at most one "\n" (or "\r\n"), which is not part of the token.  Returns 0,
 * or -1 with a one-line reason (naming `path`) in `err`. */
int auth_load(const char *path, char *out, size_t *len, char *err, size_t errlen);

/** True if the `alen` bytes at `a` are the `blen` bytes at `b`.  Takes the
 * same time whatever the bytes are and wherever they first differ: it
 * reads every byte of `b` (the secret) whatever `alen` is. */
bool auth_equal(const char *a, size_t alen, const char *b, size_t blen);

#endif
