/*
 * fuzz_proxy.c: the fuzz harness of proto_proxy_t, the PROXY protocol
 * header reader.
 *
 * An input is a one-byte seed and a byte stream.  The stream is read once
 * whole and once in feeds cut at places the seed picks (empty feeds
 * included), and the two readings must agree: the same verdict (complete,
 * more wanted, or malformed), the header ending at the same offset and
 * naming the same addresses; no feed may claim more bytes than it was
 * given, and one that asks for more must have taken all of its bytes.
 */
#include <string.h>

#include "proto/proto.h"
#include "tests/fuzz/fuzz.h"

/* Feeds `s` cut by `seed`; returns the verdict, the header's end in *end. */
static int feed_pieces(proto_proxy_t *p, const uint8_t *s, size_t n, unsigned seed, size_t *end)
{
    slotd_error_t err;
    size_t at = 0;
    int rc = PROTO_PROXY_MORE;
    unsigned x = seed * 2654435761u + 1;

    proto_proxy_init(p);
    while (rc == PROTO_PROXY_MORE) {
        size_t used = SIZE_MAX, take;
        x = x * 1103515245u + 12345u;
        take = (x >> 16) % 9; /* 0 to 8 bytes: empty feeds too */
        if (take > n - at)
            take = n - at;
        rc = proto_proxy_feed(p, (const char *)s + at, take, &used, &err);
        FUZZ_CHECK(used <= take);
        FUZZ_CHECK(rc != PROTO_PROXY_MORE || used == take);
        FUZZ_CHECK(rc == SLOTD_OK || rc == PROTO_PROXY_MORE || rc == SLOTD_EINVAL);
        at += used;
        if (rc == PROTO_PROXY_MORE && at == n)
            break;
    }
    *end = at;
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    proto_proxy_t whole, cut;
    slotd_error_t err;
    size_t used = SIZE_MAX, end;
    int rc1, rc2;

    if (size < 1)
        return 0;
    proto_proxy_init(&whole);
    rc1 = proto_proxy_feed(&whole, (const char *)data + 1, size - 1, &used, &err);
    FUZZ_CHECK(used <= size - 1);
    rc2 = feed_pieces(&cut, data + 1, size - 1, data[0], &end);
    FUZZ_CHECK(rc1 == rc2);
    if (rc1 == SLOTD_OK) {
        FUZZ_CHECK(end == used);
        FUZZ_CHECK(whole.family == cut.family);
        FUZZ_CHECK(memcmp(whole.src, cut.src, 16) == 0 && memcmp(whole.dst, cut.dst, 16) == 0);
        FUZZ_CHECK(whole.src_port == cut.src_port && whole.dst_port == cut.dst_port);
        FUZZ_CHECK(whole.version == 1 ? used <= PROTO_PROXY_V1_MAX : used >= 16);
    }
    return 0;
}
