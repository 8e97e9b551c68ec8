/*
 * tenants.h: the tenants file of --tenants-file: reading it, checking
 * every line, and finding the tenant a presented token names.
 *
 * DESIGN.  A parsed file is a value (tenants_file_t) that its loader owns:
 * no lock and no thread of its own.  server.c loads one at start and at
 * each reload on the loop thread; a file that fails to load leaves the
 * caller's current one as it was (nothing is written to `out` but on
 * success).
 */
#ifndef SLOTD_SERVER_TENANTS_H
#define SLOTD_SERVER_TENANTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/** The longest name, in bytes (1 to this many of [A-Za-z0-9_.-]). */
#define TENANT_NAME_MAX 64
/** The longest line of the file, its newline aside: a name, a token of
 * AUTH_TOKEN_MAX bytes and every option, with room to spare. */
#define TENANTS_LINE_MAX 8192
/** The most tenants one file may name (bounds the figures' cardinality). */
#define TENANTS_MAX 1024
/** The largest weight. */
#define TENANT_WEIGHT_MAX 1000

/** One line of the file. */
typedef struct tenant_def {
    char name[TENANT_NAME_MAX + 1];
    char *token; /* owned by the tenants_file_t; NUL-terminated */
    size_t token_len;
    double share;         /* (0, 1]: of the pool; 1 by default */
    uint32_t weight;      /* 1..TENANT_WEIGHT_MAX; 1 by default */
    uint32_t sessions;    /* 0: the daemon's own limit */
    uint32_t connections; /* 0: the daemon's own limit */
    bool admin;
} tenant_def_t;

/** A parsed file: `n` tenants in file order.  Owned by whoever filled it
 * (tenants_parse() or tenants_load()); released by tenants_free(). */
typedef struct tenants_file {
    tenant_def_t *t; /* owned; NULL when n is 0 */
    size_t n;
} tenants_file_t;

/** Parses the `len` bytes at `text` (the file's contents; `path` only
 * names it in errors) into *out, which the caller then owns.  Returns 0, or
 * -1 with one line in `err` naming the path, the line number and what is
 * wrong; *out is then untouched and nothing is allocated. */
int tenants_parse(const char *text, size_t len, const char *path, tenants_file_t *out, char *err,
                  size_t errlen);

/** Reads the file at `path` and parses it as tenants_parse() does.  The
 * file must be a regular file that only its owner may read or write.
 * Returns 0, or -1 with a one-line reason in `err` (*out untouched). */
int tenants_load(const char *path, tenants_file_t *out, char *err, size_t errlen);

/** Releases what *f owns (wiping the tokens) and empties it. */
void tenants_free(tenants_file_t *f);

/** The tenant whose token is the `len` bytes at `token`, or NULL.  Every
 * token is compared in constant time (auth_equal()), all of them, so the
 * time taken says nothing of which matched.  Valid while *f is. */
const tenant_def_t *tenants_find_token(const tenants_file_t *f, const char *token, size_t len);

/** The tenant named `name`, or NULL.  Valid while *f is. */
const tenant_def_t *tenants_find_name(const tenants_file_t *f, const char *name);

#endif
