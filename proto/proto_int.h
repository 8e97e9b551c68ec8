/*
 * proto_int.h: names shared between the files of proto/ (and its
 * tests) that are not part of the module's interface.
 */
#ifndef SLOTD_PROTO_PROTO_INT_H
#define SLOTD_PROTO_PROTO_INT_H

#include <stddef.h>

#include "proto/proto.h"
#include "proto/utf8_int.h"

/** The allocator of proto/: proto__realloc(NULL, n) allocates, and memory
 * from it is released with free().  It is realloc unless a test replaces it
 * to make allocations fail on purpose; nothing else may change it. */
extern void *(*proto__realloc)(void *ptr, size_t size);

/** proto_request_parse() is two paths (see request.c): a one-pass reader
 * for the common flat requests, and the tree path (UTF-8 check, syntax
 * check, cJSON tree) for every line the first declines.  Each is here on
 * its own, for tests and the fuzz harness to compare; both free `r` first,
 * as proto_request_parse() does.
 *
 * proto__request_parse_flat() returns PROTO__DECLINED, with `r` as
 * proto_request_init() leaves it and `err` untouched, for a line it leaves
 * to the tree path (every line the tree path refuses is one), and
 * otherwise exactly what the tree path would: SLOTD_OK, or SLOTD_ENOMEM when
 * an allocation fails. */
#define PROTO__DECLINED 1
int proto__request_parse_flat(const char *line, size_t len, proto_request_t *r, slotd_error_t *err);

/** The tree path alone: proto_request_parse() as it was before the
 * one-pass path, the reference the one-pass path is held to. */
int proto__request_parse_tree(const char *line, size_t len, proto_request_t *r, slotd_error_t *err);

/** What the cJSON arena of the calling thread served during the last
 * proto_request_parse() on that thread that got as far as cJSON (a line
 * taken by the one-pass path, or refused by the UTF-8 or syntax check,
 * never does; see request.c):
 * allocations, bytes of the static block used, and overflow chunks and
 * their bytes (already released when the parse returned).  For tests. */
typedef struct proto__arena_stats {
    size_t allocs;
    size_t block_bytes;
    size_t chunks;
    size_t chunk_bytes;
} proto__arena_stats_t;

void proto__arena_last(proto__arena_stats_t *out);

/** Installs proto/'s cJSON allocation hooks again, unconditionally: for a
 * test that replaced them (cJSON_InitHooks) and wants them back.  Not
 * thread-safe: no other thread may use cJSON meanwhile. */
void proto__json_hooks_install(void);

/** Room proto__fmt6() may need, the terminating NUL included: "%.6f" of
 * -DBL_MAX is 317 characters. */
#define PROTO__FMT6_MAX 336

/** Appends `s` (`n` bytes) as a JSON string, quotes included: `"` and `\`
 * and control characters are escaped, and each byte that is not part of a
 * well-formed UTF-8 sequence becomes \ufffd, so the output is always valid
 * JSON in valid UTF-8.  SLOTD_OK or SLOTD_ENOMEM (then `b` is unchanged). */
int proto__put_json_string(proto_buf_t *b, const char *s, size_t n);

/** The text proto__put_json_string() writes for `s`, NUL-terminated, in
 * memory from proto__realloc() that the caller frees; NULL when memory
 * ran out.  A request's tag (rules.c), so that the rules enter reply.c
 * once and never buf.c. */
char *proto__json_string_text(const char *s, size_t n);

/** Writes `v` exactly as snprintf(out, PROTO__FMT6_MAX, "%.6f", v) does
 * (under the default rounding mode), NUL-terminated, and returns its length.
 * `out` has PROTO__FMT6_MAX bytes.  Fast for |v| < 1e9. */
size_t proto__fmt6(char *out, double v);

#endif
