/*
 * utf8_int.h: the strict UTF-8 check shared by the request parser (the
 * tree path checks every line first; the one-pass path each string it
 * reads) and the reply writers (every string they echo).  Inline, so that
 * each stage of a line's walk checks its bytes itself rather than calling
 * across files.  Pure functions of their arguments: any thread, no lock.
 *
 * Design: docs/design.md, "Parsing a request line".
 */
#ifndef SLOTD_PROTO_UTF8_INT_H
#define SLOTD_PROTO_UTF8_INT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/** The length of the well-formed UTF-8 sequence that starts at `p`, of the
 * `n` bytes available, or 0 if none starts there.  Well-formed is strict:
 * no overlong forms, no surrogates (U+D800..U+DFFF), nothing above
 * U+10FFFF.  Requires n >= 1. */
static inline size_t proto__utf8_seq(const unsigned char *p, size_t n)
{
    unsigned char c = p[0], lo = 0x80, hi = 0xBF;

    if (c < 0x80)
        return 1;
    if (c < 0xC2)
        return 0;
    if (c < 0xE0)
        return n >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c < 0xF0) {
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
        return n >= 3 && p[1] >= lo && p[1] <= hi && (p[2] & 0xC0) == 0x80 ? 3 : 0;
    }
    if (c < 0xF5) {
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
        return n >= 4 && p[1] >= lo && p[1] <= hi && (p[2] & 0xC0) == 0x80 && (p[3] & 0xC0) == 0x80
                   ? 4
                   : 0;
    }
    return 0;
}

/** The offset of the first byte of `s` that is NUL or does not start a
 * well-formed UTF-8 sequence, or `n` if there is none.  Eight bytes at a
 * time over ASCII. */
static inline size_t proto__utf8_scan(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    const uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
    size_t i = 0, k;

    while (i < n) {
        if (n - i >= 8) {
            uint64_t w;
            memcpy(&w, u + i, 8);
            /* No byte with its high bit set, and no zero byte. */
            if (((w | ((w - ones) & ~w)) & highs) == 0) {
                i += 8;
                continue;
            }
        }
        if (u[i] == 0)
            return i;
        if ((k = proto__utf8_seq(u + i, n - i)) == 0)
            return i;
        i += k;
    }
    return n;
}

#endif
