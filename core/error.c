/*
 * error.c: names and descriptions for the codes of SLOTD_ERRNO_MAP.
 */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>

const char *slotd_err_name(int code)
{
    switch (code) {
    case SLOTD_OK:
        return "ok";
#define XX(name, wire, desc)                                                                       \
    case SLOTD_E##name:                                                                            \
        return wire;
        SLOTD_ERRNO_MAP(XX)
#undef XX
    default:
        return "internal";
    }
}

const char *slotd_strerror(int code)
{
    switch (code) {
    case SLOTD_OK:
        return "success";
#define XX(name, wire, desc)                                                                       \
    case SLOTD_E##name:                                                                            \
        return desc;
        SLOTD_ERRNO_MAP(XX)
#undef XX
    default:
        return "unknown error";
    }
}

int slotd_error_set(slotd_error_t *err, int code, const char *fmt, ...)
{
    if (err != NULL) {
        va_list ap;
        err->code = code;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof(err->message), fmt, ap);
        va_end(ap);
    }
    return code;
}
