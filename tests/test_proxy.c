/*
 * test_proxy.c: proto_proxy_t, the reader of the PROXY protocol header
 * (proto/proxy.c), against headers written here byte by byte from
 * HAProxy's specification of versions 1 and 2.
 *
 * Every valid header is read whole, followed by the stream's first bytes
 * (which must be left to the caller), and again cut at every place into
 * two feeds, and one byte per feed: the result must be the same each way.
 * A header cut short must ask for more and nothing else; a malformed one
 * must be refused, and as early as its first wrong byte where the format
 * makes that certain (a JSON line from a peer that sends no header is
 * refused at its first byte).
 */
#include <arpa/inet.h>
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"

#define STREAM "{\"op\":\"auth\"}\n"

static const unsigned char v2_sig[12] = {0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d,
                                         0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a};

/* A version 2 header: the signature, `ver_cmd`, `fam`, then `body`
 * (`blen` bytes) and its length.  Returns its size in `out`. */
static size_t v2_header(unsigned char *out, unsigned ver_cmd, unsigned fam,
                        const unsigned char *body, size_t blen)
{
    memcpy(out, v2_sig, 12);
    out[12] = (unsigned char)ver_cmd;
    out[13] = (unsigned char)fam;
    out[14] = (unsigned char)(blen >> 8);
    out[15] = (unsigned char)blen;
    if (blen > 0)
        memcpy(out + 16, body, blen);
    return 16 + blen;
}

/* Feeds `data` in pieces cut at `cuts` (ascending offsets, `ncuts` of
 * them); returns the result of the last feed, and in *used the offset in
 * `data` where the header ended. */
static int feed_cut(proto_proxy_t *p, const unsigned char *data, size_t len, const size_t *cuts,
                    size_t ncuts, size_t *end, slotd_error_t *err)
{
    size_t at = 0;
    int rc = PROTO_PROXY_MORE;

    proto_proxy_init(p);
    for (size_t i = 0; i <= ncuts && rc == PROTO_PROXY_MORE; i++) {
        size_t to = i < ncuts ? cuts[i] : len, used = 99999;
        rc = proto_proxy_feed(p, (const char *)data + at, to - at, &used, err);
        ck_assert_uint_le(used, to - at);
        if (rc == PROTO_PROXY_MORE)
            ck_assert_uint_eq(used, to - at);
        at += used;
    }
    *end = at;
    return rc;
}

/* Reads the header at the start of `data` whole, in two feeds cut at every
 * place, and one byte at a time; each must end at `hlen` with the same
 * result, which is left in *out. */
static void read_every_way(const unsigned char *data, size_t len, size_t hlen, proto_proxy_t *out)
{
    slotd_error_t err;
    proto_proxy_t p;
    size_t end, cuts[1024];

    ck_assert_int_eq(feed_cut(out, data, len, NULL, 0, &end, &err), SLOTD_OK);
    ck_assert_uint_eq(end, hlen);
    for (size_t c = 0; c <= len; c++) {
        cuts[0] = c;
        ck_assert_int_eq(feed_cut(&p, data, len, cuts, 1, &end, &err), SLOTD_OK);
        ck_assert_uint_eq(end, hlen);
        ck_assert_int_eq(p.family, out->family);
        ck_assert_mem_eq(p.src, out->src, 16);
        ck_assert_mem_eq(p.dst, out->dst, 16);
        ck_assert_uint_eq(p.src_port, out->src_port);
        ck_assert_uint_eq(p.dst_port, out->dst_port);
    }
    ck_assert_uint_lt(len, 1024);
    for (size_t c = 0; c < len; c++)
        cuts[c] = c + 1;
    ck_assert_int_eq(feed_cut(&p, data, len, cuts, len, &end, &err), SLOTD_OK);
    ck_assert_uint_eq(end, hlen);
    ck_assert_int_eq(p.family, out->family);
    ck_assert_mem_eq(p.src, out->src, 16);
    ck_assert_uint_eq(p.src_port, out->src_port);
    /* Cut short anywhere, it asks for more. */
    for (size_t c = 0; c < hlen; c++)
        ck_assert_int_eq(feed_cut(&p, data, c, NULL, 0, &end, &err), PROTO_PROXY_MORE);
}

static void expect_addr(const uint8_t *bytes, int af, const char *text)
{
    char got[INET6_ADDRSTRLEN];
    ck_assert_ptr_nonnull(inet_ntop(af, bytes, got, sizeof(got)));
    ck_assert_str_eq(got, text);
}

/* A header followed by the stream, as one buffer. */
static size_t with_stream(unsigned char *out, const void *header, size_t hlen)
{
    memcpy(out, header, hlen);
    memcpy(out + hlen, STREAM, strlen(STREAM));
    return hlen + strlen(STREAM);
}

START_TEST(test_v1_tcp4)
{
    const char *h = "PROXY TCP4 192.0.2.7 10.0.0.5 56324 7070\r\n";
    unsigned char buf[256];
    size_t len = with_stream(buf, h, strlen(h));
    proto_proxy_t p;

    read_every_way(buf, len, strlen(h), &p);
    ck_assert_int_eq(p.version, 1);
    ck_assert_int_eq(p.family, PROTO_PROXY_INET);
    expect_addr(p.src, AF_INET, "192.0.2.7");
    expect_addr(p.dst, AF_INET, "10.0.0.5");
    ck_assert_uint_eq(p.src_port, 56324);
    ck_assert_uint_eq(p.dst_port, 7070);
}
END_TEST

START_TEST(test_v1_tcp6)
{
    /* The longest TCP6 header there is: 104 bytes. */
    const char *longest = "PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff "
                          "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n";
    const char *h = "PROXY TCP6 2001:db8::1 ::1 0 7070\r\n";
    unsigned char buf[256];
    size_t len = with_stream(buf, h, strlen(h));
    proto_proxy_t p;

    read_every_way(buf, len, strlen(h), &p);
    ck_assert_int_eq(p.family, PROTO_PROXY_INET6);
    expect_addr(p.src, AF_INET6, "2001:db8::1");
    expect_addr(p.dst, AF_INET6, "::1");
    ck_assert_uint_eq(p.src_port, 0);
    ck_assert_uint_eq(p.dst_port, 7070);

    ck_assert_uint_eq(strlen(longest), 104);
    len = with_stream(buf, longest, strlen(longest));
    read_every_way(buf, len, strlen(longest), &p);
    ck_assert_uint_eq(p.src_port, 65535);
}
END_TEST

START_TEST(test_v1_unknown)
{
    const char *hs[] = {"PROXY UNKNOWN\r\n",
                        "PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n"};
    for (size_t i = 0; i < 2; i++) {
        unsigned char buf[256];
        size_t len = with_stream(buf, hs[i], strlen(hs[i]));
        proto_proxy_t p;
        read_every_way(buf, len, strlen(hs[i]), &p);
        ck_assert_int_eq(p.family, PROTO_PROXY_LOCAL);
    }
}
END_TEST

START_TEST(test_v2_proxy_inet)
{
    const unsigned char body[12] = {192, 0, 2, 7, 10, 0, 0, 5, 0xdc, 0x04, 0x1b, 0x9e};
    unsigned char h[64], buf[128];
    size_t hlen = v2_header(h, 0x21, 0x11, body, sizeof(body));
    size_t len = with_stream(buf, h, hlen);
    proto_proxy_t p;

    read_every_way(buf, len, hlen, &p);
    ck_assert_int_eq(p.version, 2);
    ck_assert_int_eq(p.family, PROTO_PROXY_INET);
    expect_addr(p.src, AF_INET, "192.0.2.7");
    expect_addr(p.dst, AF_INET, "10.0.0.5");
    ck_assert_uint_eq(p.src_port, 56324);
    ck_assert_uint_eq(p.dst_port, 7070);
}
END_TEST

START_TEST(test_v2_proxy_inet6_tlvs)
{
    unsigned char body[36 + 300], h[400], buf[512];
    proto_proxy_t p;

    memset(body, 0, sizeof(body));
    ck_assert_int_eq(inet_pton(AF_INET6, "2001:db8::7", body), 1);
    ck_assert_int_eq(inet_pton(AF_INET6, "fd00::5", body + 16), 1);
    body[32] = 0xdc, body[33] = 0x04, body[34] = 0x1b, body[35] = 0x9e;
    /* TLVs after the addresses (a PP2_TYPE_NOOP of 297 bytes): skipped. */
    body[36] = 0x04, body[37] = 0x01, body[38] = 0x29;
    memset(body + 39, 'x', 297);
    size_t hlen = v2_header(h, 0x21, 0x21, body, sizeof(body));
    size_t len = with_stream(buf, h, hlen);

    read_every_way(buf, len, hlen, &p);
    ck_assert_int_eq(p.family, PROTO_PROXY_INET6);
    expect_addr(p.src, AF_INET6, "2001:db8::7");
    expect_addr(p.dst, AF_INET6, "fd00::5");
    ck_assert_uint_eq(p.src_port, 56324);
}
END_TEST

START_TEST(test_v2_local)
{
    unsigned char h[400], buf[512], body[216] = {0};
    proto_proxy_t p;
    size_t hlen, len;

    /* LOCAL (a balancer's own check), with and without addresses. */
    hlen = v2_header(h, 0x20, 0x00, NULL, 0);
    len = with_stream(buf, h, hlen);
    read_every_way(buf, len, hlen, &p);
    ck_assert_int_eq(p.family, PROTO_PROXY_LOCAL);
    hlen = v2_header(h, 0x20, 0x11, body, 12);
    len = with_stream(buf, h, hlen);
    read_every_way(buf, len, hlen, &p);
    ck_assert_int_eq(p.family, PROTO_PROXY_LOCAL);
    /* PROXY of AF_UNSPEC, and of AF_UNIX: the socket's peer stands. */
    hlen = v2_header(h, 0x21, 0x00, NULL, 0);
    len = with_stream(buf, h, hlen);
    read_every_way(buf, len, hlen, &p);
    ck_assert_int_eq(p.family, PROTO_PROXY_LOCAL);
    hlen = v2_header(h, 0x21, 0x31, body, 216);
    len = with_stream(buf, h, hlen);
    read_every_way(buf, len, hlen, &p);
    ck_assert_int_eq(p.family, PROTO_PROXY_LOCAL);
}
END_TEST

/* Refused, with the refusal coming no later than byte `by` (1-based: the
 * first `by - 1` bytes alone still ask for more). */
static void expect_bad(const void *data, size_t len, size_t by)
{
    slotd_error_t err;
    proto_proxy_t p;
    size_t end;

    slotd_error_clear(&err);
    ck_assert_msg(feed_cut(&p, data, len, NULL, 0, &end, &err) == SLOTD_EINVAL, "accepted: %.*s",
                  (int)len, (const char *)data);
    ck_assert_int_eq(err.code, SLOTD_EINVAL);
    ck_assert_uint_gt(strlen(err.message), 0);
    /* Once refused, it stays refused. */
    size_t used;
    ck_assert_int_eq(proto_proxy_feed(&p, "x", 1, &used, &err), SLOTD_EINVAL);
    if (by > 0) {
        ck_assert_int_eq(feed_cut(&p, data, by, NULL, 0, &end, &err), SLOTD_EINVAL);
        ck_assert_int_eq(feed_cut(&p, data, by - 1, NULL, 0, &end, &err), PROTO_PROXY_MORE);
    }
}

START_TEST(test_v1_malformed)
{
    const char *bad[] = {
        "PROXY TCP4 192.0.2.7 10.0.0.5 56324 7070\n",    /* no \r */
        "PROXY TCP4 192.0.2.7 10.0.0.5 56324 70700\r\n", /* port */
        "PROXY TCP4 192.0.2.7 10.0.0.5 056324 7070\r\n", /* leading zero */
        "PROXY TCP4 192.0.2.7 10.0.0.5 -1 7070\r\n",     /* sign */
        "PROXY TCP4 192.0.2.777 10.0.0.5 1 7070\r\n",    /* address */
        "PROXY TCP4 2001:db8::1 10.0.0.5 1 7070\r\n",    /* family */
        "PROXY TCP6 192.0.2.7 10.0.0.5 1 7070\r\n",      /* family */
        "PROXY TCP4 192.0.2.7 10.0.0.5 1\r\n",           /* three fields */
        "PROXY TCP4 192.0.2.7 10.0.0.5 1 2 3\r\n",       /* five */
        "PROXY TCP4  192.0.2.7 10.0.0.5 1 2\r\n",        /* two spaces */
        "PROXY TCP4 192.0.2.7 10.0.0.5 1 2 \r\n",        /* trailing space */
        "PROXY UDP4 192.0.2.7 10.0.0.5 1 2\r\n",         /* protocol */
        "PROXY TCP4 192.0.2.7\t10.0.0.5 1 2\r\n",        /* a tab */
        "PROXY UNKNOWNX\r\n",                            /* protocol */
        "PROXY \r\n",                                    /* empty */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect_bad(bad[i], strlen(bad[i]), 0);

    /* Refused at the first byte that cannot be a header. */
    expect_bad(STREAM, strlen(STREAM), 1);
    expect_bad("proxy TCP4 1.2.3.4 1.2.3.4 1 2\r\n", 31, 1);
    expect_bad("PROXYTCP4", 9, 6);
    /* 107 bytes and no "\n": refused at the 108th. */
    char lng[200];
    memset(lng, '1', sizeof(lng));
    memcpy(lng, "PROXY UNKNOWN ", 14);
    expect_bad(lng, sizeof(lng), PROTO_PROXY_V1_MAX + 1);
}
END_TEST

START_TEST(test_v2_malformed)
{
    unsigned char h[128], body[36] = {0};
    size_t n;

    n = v2_header(h, 0x11, 0x11, body, 12); /* version 1 in a v2 header */
    expect_bad(h, n, 16);
    n = v2_header(h, 0x22, 0x11, body, 12); /* command 2 */
    expect_bad(h, n, 16);
    n = v2_header(h, 0x21, 0x12, body, 12); /* a datagram */
    expect_bad(h, n, 16);
    n = v2_header(h, 0x21, 0x41, body, 12); /* family 4 */
    expect_bad(h, n, 16);
    n = v2_header(h, 0x21, 0x11, body, 11); /* too short for IPv4 */
    expect_bad(h, n, 16);
    n = v2_header(h, 0x21, 0x21, body, 35); /* too short for IPv6 */
    expect_bad(h, n, 16);
    n = v2_header(h, 0x21, 0x11, body, 12); /* a bad signature byte */
    h[7] = 'q';
    expect_bad(h, n, 8);
    /* A truncated one asks for more, never refuses. */
    n = v2_header(h, 0x21, 0x21, body, 36);
    slotd_error_t err;
    proto_proxy_t p;
    size_t end;
    for (size_t c = 0; c < n; c++)
        ck_assert_int_eq(feed_cut(&p, h, c, NULL, 0, &end, &err), PROTO_PROXY_MORE);
}
END_TEST

START_TEST(test_empty_feed)
{
    proto_proxy_t p;
    slotd_error_t err;
    size_t used = 5;

    proto_proxy_init(&p);
    ck_assert_int_eq(proto_proxy_feed(&p, "", 0, &used, &err), PROTO_PROXY_MORE);
    ck_assert_uint_eq(used, 0);
    ck_assert_int_eq(proto_proxy_feed(&p, "PROXY UNKNOWN\r\nabc", 18, &used, &err), SLOTD_OK);
    ck_assert_uint_eq(used, 15);
    /* Read already: more bytes are not a header's. */
    ck_assert_int_eq(proto_proxy_feed(&p, "abc", 3, &used, &err), SLOTD_EINVAL);
}
END_TEST

static Suite *proxy_suite(void)
{
    Suite *s = suite_create("proxy");
    TCase *tc = tcase_create("v1");

    tcase_add_test(tc, test_v1_tcp4);
    tcase_add_test(tc, test_v1_tcp6);
    tcase_add_test(tc, test_v1_unknown);
    tcase_add_test(tc, test_v1_malformed);
    suite_add_tcase(s, tc);
    tc = tcase_create("v2");
    tcase_add_test(tc, test_v2_proxy_inet);
    tcase_add_test(tc, test_v2_proxy_inet6_tlvs);
    tcase_add_test(tc, test_v2_local);
    tcase_add_test(tc, test_v2_malformed);
    tcase_add_test(tc, test_empty_feed);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(proxy_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
