/*
 * error.h: the one list of slotd error codes.
 *
 * Every failure that crosses a module boundary is a negative code from
 * SLOTD_ERRNO_MAP.  The list generates the enum, slotd_strerror() and
 * slotd_err_name(); the wire codes of the protocol ("bad_json", ...) are the
 * `wire` column of the same list, so a code cannot reach a client under a
 * name the protocol does not define.  Internal codes (a stale handle, an
 * allocation failure) have a wire name too, but reaching a client with one
 * of them is a bug.
 */
#ifndef SLOTD_CORE_ERROR_H
#define SLOTD_CORE_ERROR_H

#include <stddef.h>

/* XX(NAME, "wire_code", "description") */
#define SLOTD_ERRNO_MAP(XX)                                                                        \
    XX(BAD_JSON, "bad_json", "the line is not a JSON object")                                     \
    XX(UNKNOWN_OP, "unknown_op", "op missing or not known")                                       \
    XX(BAD_REQUEST, "bad_request", "a field is missing, of the wrong type or out of range")       \
    XX(TOO_LONG, "too_long", "longer than the model's max_ctx")                                   \
    XX(UNKNOWN_ID, "unknown_id", "no live session with that id on this connection")               \
    XX(DUPLICATE_ID, "duplicate_id", "the id is live on this connection")                         \
    XX(CONTEXT_FULL, "context_full", "the step would pass max_ctx")                               \
    XX(CACHE_FULL, "cache_full", "the pool has no room for the slot or the entry")                \
    XX(LINE_TOO_LONG, "line_too_long", "the line is longer than the limit")                       \
    XX(SHUTTING_DOWN, "shutting_down", "the daemon is draining")                                  \
    XX(TOO_MANY_CONNECTIONS, "too_many_connections", "no room for one more connection")           \
    XX(AUTH_REQUIRED, "auth_required", "the connection has not authenticated yet")                \
    XX(AUTH_FAILED, "auth_failed", "the token is wrong")                                          \
    XX(AUTH_REVOKED, "auth_revoked", "the connection's tenant was removed or its token changed") \
    XX(STALE, "internal", "stale cache handle: the slot was released or reused")                  \
    XX(NOMEM, "internal", "out of memory")                                                        \
    XX(INVAL, "internal", "invalid argument")

enum slotd_err {
    SLOTD_OK = 0,
#define SLOTD__ERR_ENUM(name, wire, desc) SLOTD__ERR_IDX_##name,
    SLOTD_ERRNO_MAP(SLOTD__ERR_ENUM)
#undef SLOTD__ERR_ENUM
    SLOTD__ERR_COUNT
};

/* The codes themselves are negative: SLOTD_E<NAME> == -(index + 1). */
#define SLOTD__ERR_CODE(name, wire, desc) SLOTD_E##name = -(SLOTD__ERR_IDX_##name + 1),
enum slotd_err_code { SLOTD_ERRNO_MAP(SLOTD__ERR_CODE) SLOTD__ERR_CODE_END = 0 };
#undef SLOTD__ERR_CODE

/** The wire code of `code` ("bad_json", ...); "ok" for 0, "internal" if unknown.
 * Returns a static string. */
const char *slotd_err_name(int code);

/** A one-line description of `code`.  Returns a static string. */
const char *slotd_strerror(int code);

/** A failure with its reply text: the code and a message naming the field
 * or id involved.  Plain value type, no owned memory. */
typedef struct slotd_error {
    int code;
    char message[256];
} slotd_error_t;

/** Sets `err` (if not NULL) to `code` and a printf-formatted message, and
 * returns `code`, so that `return slotd_error_set(err, ...)` reads well. */
int slotd_error_set(slotd_error_t *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/** Makes `err` "no error" (SLOTD_OK, empty message) without zeroing all of
 * it: the message is only ever read up to its NUL, and the hot paths clear
 * one per request. */
static inline void slotd_error_clear(slotd_error_t *err)
{
    err->code = SLOTD_OK;
    err->message[0] = '\0';
}

#endif
