/*
 * proxy.c: proto_proxy_t, the reader of the PROXY protocol header (HAProxy's
 * "PROXY protocol", versions 1 and 2) that a balancer sends at the start of
 * a connection to say whose connection it carries.
 *
 * The header is read as it arrives, in feeds of any size: the reader keeps
 * what it needs of it (at most a version 1 line, or the 16 bytes of a
 * version 2 head and its 36 bytes of addresses) and skips the rest of a
 * version 2 header (its TLVs) without storing it, so a connection costs the
 * struct and nothing more however long the header says it is.  The first
 * byte that cannot begin or continue a valid header ends the reading as
 * malformed; a header is never guessed at.  What follows the header in the
 * last feed is the caller's: *used says where the header ended.
 *
 * Version 1 is one line of at most 107 bytes, "\r\n" included:
 * "PROXY TCP4|TCP6 SRC DST SPORT DPORT\r\n", or "PROXY UNKNOWN...\r\n".
 * Version 2 is a 12-byte signature, a version/command byte (2, then LOCAL
 * or PROXY), a family/transport byte, a 16-bit length and that many bytes.
 * LOCAL, UNKNOWN, AF_UNSPEC and AF_UNIX say that the connection's own
 * address stands (PROTO_PROXY_LOCAL): a balancer's health check, or a
 * client it cannot name.  A datagram transport is malformed on a stream.
 *
 * No state outside the struct; the caller's thread only.
 */
#include "proto/proto_int.h"

#include <arpa/inet.h>
#include <string.h>

static const unsigned char proxy_v2_sig[12] = {0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d,
                                               0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a};
static const char proxy_v1_prefix[] = "PROXY ";

#define PROXY_V2_HEAD 16
#define PROXY_V2_INET_LEN 12
#define PROXY_V2_INET6_LEN 36

void proto_proxy_init(proto_proxy_t *p)
{
    memset(p, 0, sizeof(*p));
}

/* Parses a port of a version 1 header: 1 to 5 digits, no leading zero
 * (but "0"), at most 65535. */
static bool proxy_v1_port(const char *s, size_t n, uint16_t *out)
{
    unsigned v = 0;

    if (n == 0 || n > 5 || (n > 1 && s[0] == '0'))
        return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    if (v > 65535)
        return false;
    *out = (uint16_t)v;
    return true;
}

/* Parses the version 1 line in p->_buf (p->_len bytes, "\r\n" included). */
static int proxy_v1_parse(proto_proxy_t *p, slotd_error_t *err)
{
    const char *s = (const char *)p->_buf + sizeof(proxy_v1_prefix) - 1;
    const char *end = (const char *)p->_buf + p->_len - 2; /* before "\r\n" */
    const char *field[4];
    size_t flen[4];
    char addr[2][INET6_ADDRSTRLEN];
    int af;

    p->version = 1;
    if (end - s >= 7 && memcmp(s, "UNKNOWN", 7) == 0 && (end - s == 7 || s[7] == ' ')) {
        p->family = PROTO_PROXY_LOCAL;
        return SLOTD_OK;
    }
    if (end - s >= 5 && memcmp(s, "TCP4 ", 5) == 0) {
        af = AF_INET;
        p->family = PROTO_PROXY_INET;
    } else if (end - s >= 5 && memcmp(s, "TCP6 ", 5) == 0) {
        af = AF_INET6;
        p->family = PROTO_PROXY_INET6;
    } else {
        return slotd_error_set(err, SLOTD_EINVAL,
                               "PROXY v1: the protocol is not TCP4, TCP6 or UNKNOWN");
    }
    s += 5;
    /* Four fields, each followed by one space but the last. */
    for (int i = 0; i < 4; i++) {
        const char *sp = i < 3 ? memchr(s, ' ', (size_t)(end - s)) : end;
        if (sp == NULL)
            return slotd_error_set(err, SLOTD_EINVAL, "PROXY v1: fewer than four fields");
        field[i] = s;
        flen[i] = (size_t)(sp - s);
        s = sp < end ? sp + 1 : end;
    }
    if (memchr(field[3], ' ', flen[3]) != NULL)
        return slotd_error_set(err, SLOTD_EINVAL, "PROXY v1: more than four fields");
    for (int i = 0; i < 2; i++) {
        if (flen[i] == 0 || flen[i] >= sizeof(addr[i]))
            return slotd_error_set(err, SLOTD_EINVAL, "PROXY v1: an address is malformed");
        memcpy(addr[i], field[i], flen[i]);
        addr[i][flen[i]] = '\0';
        if (inet_pton(af, addr[i], i == 0 ? p->src : p->dst) != 1)
            return slotd_error_set(err, SLOTD_EINVAL, "PROXY v1: '%s' is not an %s address",
                                   addr[i], af == AF_INET ? "IPv4" : "IPv6");
    }
    if (!proxy_v1_port(field[2], flen[2], &p->src_port) ||
        !proxy_v1_port(field[3], flen[3], &p->dst_port))
        return slotd_error_set(err, SLOTD_EINVAL, "PROXY v1: a port is not an integer 0..65535");
    return SLOTD_OK;
}

/* Reads version 1 bytes until the line's "\n". */
static int proxy_v1_feed(proto_proxy_t *p, const unsigned char *d, size_t len, size_t *used,
                         slotd_error_t *err)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = d[i];
        size_t at = p->_len;

        if (at < sizeof(proxy_v1_prefix) - 1 && ch != (unsigned char)proxy_v1_prefix[at])
            return slotd_error_set(err, SLOTD_EINVAL, "not a PROXY header");
        if (at == PROTO_PROXY_V1_MAX)
            return slotd_error_set(err, SLOTD_EINVAL, "PROXY v1: longer than %d bytes",
                                   PROTO_PROXY_V1_MAX);
        p->_buf[p->_len++] = ch;
        if (ch == '\n') {
            *used = i + 1;
            if (p->_len < 2 || p->_buf[p->_len - 2] != '\r')
                return slotd_error_set(err, SLOTD_EINVAL,
                                       "PROXY v1: the line does not end "
                                       "with \\r\\n");
            return proxy_v1_parse(p, err);
        }
        if (ch < 0x20 && ch != '\r')
            return slotd_error_set(err, SLOTD_EINVAL, "PROXY v1: a control byte in the line");
    }
    *used = len;
    return PROTO_PROXY_MORE;
}

/* The 16-byte head of version 2 is in p->_buf: checks it and sets how many
 * more bytes are kept (_want) and skipped (_skip). */
static int proxy_v2_head(proto_proxy_t *p, slotd_error_t *err)
{
    unsigned ver_cmd = p->_buf[12], fam = p->_buf[13];
    size_t len = (size_t)p->_buf[14] << 8 | p->_buf[15];
    size_t need = 0;

    p->version = 2;
    if (ver_cmd >> 4 != 2)
        return slotd_error_set(err, SLOTD_EINVAL, "PROXY v2: version %u, not 2", ver_cmd >> 4);
    if ((ver_cmd & 0xf) > 1)
        return slotd_error_set(err, SLOTD_EINVAL, "PROXY v2: command %u is neither LOCAL nor PROXY",
                               ver_cmd & 0xf);
    if ((fam >> 4) > 3 || (fam & 0xf) > 2)
        return slotd_error_set(err, SLOTD_EINVAL, "PROXY v2: unknown family byte 0x%02x", fam);
    p->family = PROTO_PROXY_LOCAL;
    if ((ver_cmd & 0xf) == 1 && (fam >> 4) != 0 && (fam & 0xf) != 1)
        return slotd_error_set(err, SLOTD_EINVAL, "PROXY v2: not a stream transport");
    if ((ver_cmd & 0xf) == 1 && (fam >> 4) == 1) {
        p->family = PROTO_PROXY_INET;
        need = PROXY_V2_INET_LEN;
    } else if ((ver_cmd & 0xf) == 1 && (fam >> 4) == 2) {
        p->family = PROTO_PROXY_INET6;
        need = PROXY_V2_INET6_LEN;
    } else if ((ver_cmd & 0xf) == 1 && (fam >> 4) == 3 && len < 216) {
        return slotd_error_set(err, SLOTD_EINVAL, "PROXY v2: %zu bytes hold no AF_UNIX addresses",
                               len);
    }
    if (len < need)
        return slotd_error_set(err, SLOTD_EINVAL, "PROXY v2: %zu bytes hold no %s addresses", len,
                               need == PROXY_V2_INET_LEN ? "IPv4" : "IPv6");
    p->_want = PROXY_V2_HEAD + need;
    p->_skip = len - need;
    return PROTO_PROXY_MORE;
}

/* The addresses of version 2 are in p->_buf after the head. */
static void proxy_v2_addresses(proto_proxy_t *p)
{
    const unsigned char *a = p->_buf + PROXY_V2_HEAD;
    size_t n = p->family == PROTO_PROXY_INET ? 4 : p->family == PROTO_PROXY_INET6 ? 16 : 0;

    if (n == 0)
        return;
    memcpy(p->src, a, n);
    memcpy(p->dst, a + n, n);
    p->src_port = (uint16_t)(a[2 * n] << 8 | a[2 * n + 1]);
    p->dst_port = (uint16_t)(a[2 * n + 2] << 8 | a[2 * n + 3]);
}

static int proxy_v2_feed(proto_proxy_t *p, const unsigned char *d, size_t len, size_t *used,
                         slotd_error_t *err)
{
    size_t i = 0;
    int rc;

    while (i < len) {
        if (p->_len < sizeof(proxy_v2_sig)) {
            if (d[i] != proxy_v2_sig[p->_len])
                return slotd_error_set(err, SLOTD_EINVAL, "not a PROXY header");
            p->_buf[p->_len++] = d[i++];
        } else if (p->_len < PROXY_V2_HEAD) {
            p->_buf[p->_len++] = d[i++];
            if (p->_len == PROXY_V2_HEAD && (rc = proxy_v2_head(p, err)) != PROTO_PROXY_MORE)
                return rc;
        } else if (p->_len < p->_want) {
            size_t take = p->_want - p->_len < len - i ? p->_want - p->_len : len - i;
            memcpy(p->_buf + p->_len, d + i, take);
            p->_len += take;
            i += take;
        } else {
            size_t take = p->_skip < len - i ? p->_skip : len - i;
            p->_skip -= take;
            i += take;
        }
        if (p->_len >= PROXY_V2_HEAD && p->_len == p->_want && p->_skip == 0) {
            proxy_v2_addresses(p);
            *used = i;
            return SLOTD_OK;
        }
    }
    *used = len;
    return PROTO_PROXY_MORE;
}

int proto_proxy_feed(proto_proxy_t *p, const char *data, size_t len, size_t *used,
                     slotd_error_t *err)
{
    const unsigned char *d = (const unsigned char *)data;

    *used = 0;
    if (p->_done || p->_failed)
        return slotd_error_set(err, SLOTD_EINVAL, "the PROXY header was read already");
    if (len == 0)
        return PROTO_PROXY_MORE;
    if (p->_len == 0 && d[0] != (unsigned char)proxy_v1_prefix[0] && d[0] != proxy_v2_sig[0]) {
        p->_failed = true;
        return slotd_error_set(err, SLOTD_EINVAL, "not a PROXY header");
    }
    int rc = (p->_len > 0 ? p->_buf[0] : d[0]) == proxy_v2_sig[0]
                 ? proxy_v2_feed(p, d, len, used, err)
                 : proxy_v1_feed(p, d, len, used, err);
    if (rc == SLOTD_OK)
        p->_done = true;
    else if (rc != PROTO_PROXY_MORE)
        p->_failed = true;
    return rc;
}
