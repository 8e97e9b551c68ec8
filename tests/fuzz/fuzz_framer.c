/*
 * fuzz_framer.c: the fuzz harness of proto_framer_t.
 *
 * An input is a three-byte header and a byte stream.  The header picks the
 * line limit, the seed of the places where the stream is cut into feeds
 * (empty feeds included), and a line on which the callback asks to stop.
 * The stream goes through the framer feed by feed, and what comes out is
 * held to a reference framer that reads the whole stream at once, byte by
 * byte, straight from docs/protocol.md:
 *   - the same lines, in order, each in the feed that holds its "\n", and
 *     straight from the caller's buffer when it lies wholly inside the feed;
 *   - line_too_long from exactly the feed that holds the byte that settles
 *     it, after every earlier line, and from every feed after;
 *   - the callback's stop value from the feed it stopped;
 *   - a carry that never holds more than max_line + 1 bytes.
 */
#include <string.h>

#include "proto/proto.h"
#include "tests/fuzz/fuzz.h"

typedef struct ref_line {
    size_t start; /* offset in the stream */
    size_t len;   /* without "\r\n" or "\n" */
    size_t nl;    /* offset of its "\n" */
} ref_line_t;

typedef struct ref {
    ref_line_t *lines;
    size_t count;
    size_t settle; /* offset of the byte that makes a line too long, or SIZE_MAX */
    size_t tail;   /* bytes after the last "\n" (when nothing is too long) */
} ref_t;

static int ref_blank(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return 0;
    }
    return 1;
}

static void ref_run(ref_t *r, const uint8_t *s, size_t n, size_t max_line)
{
    size_t k = 0, start = 0;

    r->lines = malloc((n + 1) * sizeof(*r->lines));
    FUZZ_CHECK(r->lines != NULL);
    r->count = 0;
    r->settle = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\n') {
            size_t len = k;
            if (len > 0 && s[i - 1] == '\r')
                len--;
            FUZZ_CHECK(len <= max_line);
            if (!ref_blank(s + start, len))
                r->lines[r->count++] = (ref_line_t){start, len, i};
            k = 0;
            start = i + 1;
            continue;
        }
        k++;
        /* k bytes with no "\n" yet: too long once past max_line + 1, or at
         * max_line + 1 unless the last may be the "\r" of "\r\n". */
        if (k > max_line + 1 || (k == max_line + 1 && s[i] != '\r')) {
            r->settle = i;
            return;
        }
    }
    r->tail = k;
}

typedef struct run {
    const ref_t *ref;
    const uint8_t *s;
    size_t feed_start, feed_end;
    size_t got;
    size_t stop_at;
} run_t;

static int on_line(void *arg, const char *line, size_t len)
{
    run_t *run = arg;
    const ref_line_t *want;

    FUZZ_CHECK(run->got < run->ref->count);
    want = &run->ref->lines[run->got];
    FUZZ_CHECK(len == want->len);
    FUZZ_CHECK(memcmp(line, run->s + want->start, len) == 0);
    FUZZ_CHECK(want->nl >= run->feed_start && want->nl < run->feed_end);
    if (want->start >= run->feed_start)
        FUZZ_CHECK((const uint8_t *)line == run->s + want->start);
    run->got++;
    return run->got == run->stop_at ? 5 : 0;
}

static uint32_t next_rand(uint32_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 17;
    *state ^= *state << 5;
    return *state;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    proto_framer_t f;
    ref_t ref;
    run_t run;
    const uint8_t *s;
    size_t n, max_line, pos = 0;
    uint32_t seed;
    int failed = 0;

    if (size < 3)
        return 0;
    max_line = 1 + data[0] % 48;
    seed = 0x9E3779B9u ^ ((uint32_t)data[1] << 8) ^ (uint32_t)size;
    if (seed == 0)
        seed = 1;
    s = data + 3;
    n = size - 3;

    ref_run(&ref, s, n, max_line);
    run = (run_t){.ref = &ref, .s = s, .stop_at = data[2] < 32 ? data[2] : 0};
    proto_framer_init(&f, max_line);

    while (pos < n || pos == 0) {
        size_t chunk, before = run.got, want_got, nl_before;
        int rc;
        switch (next_rand(&seed) % 4) {
        case 0:
            chunk = 0;
            break;
        case 1:
            chunk = 1;
            break;
        case 2:
            chunk = next_rand(&seed) % (max_line + 3);
            break;
        default:
            chunk = next_rand(&seed) % (n + 1);
            break;
        }
        if (chunk > n - pos)
            chunk = n - pos;
        run.feed_start = pos;
        run.feed_end = pos + chunk;
        rc = proto_framer_feed(&f, (const char *)s + pos, chunk, on_line, &run);

        if (failed) {
            FUZZ_CHECK(rc == SLOTD_ELINE_TOO_LONG);
            FUZZ_CHECK(run.got == before);
        } else if (run.stop_at != 0 && run.got == run.stop_at && before < run.stop_at) {
            FUZZ_CHECK(rc == 5);
            break; /* the rest of that feed is dropped; the run ends here */
        } else {
            /* Every line whose "\n" came before the end of this feed (and
             * before the byte that settles a too-long line) is out. */
            want_got = 0;
            while (want_got < ref.count && ref.lines[want_got].nl < pos + chunk)
                want_got++;
            FUZZ_CHECK(run.got == want_got);
            if (ref.settle >= pos && ref.settle < pos + chunk) {
                FUZZ_CHECK(rc == SLOTD_ELINE_TOO_LONG);
                FUZZ_CHECK(f.failed);
                failed = 1;
            } else {
                FUZZ_CHECK(rc == SLOTD_OK);
                FUZZ_CHECK(!f.failed);
                /* The carry holds the bytes since the last "\n". */
                nl_before = pos + chunk;
                while (nl_before > 0 && s[nl_before - 1] != '\n')
                    nl_before--;
                FUZZ_CHECK(f.len == pos + chunk - nl_before);
                FUZZ_CHECK(f.len <= max_line + 1);
                FUZZ_CHECK(f.cap <= max_line + 1);
            }
        }
        pos += chunk;
        if (n == 0)
            break;
    }
    if (pos == n && !failed && ref.settle == SIZE_MAX &&
        (run.stop_at == 0 || run.got < run.stop_at)) {
        FUZZ_CHECK(run.got == ref.count);
        FUZZ_CHECK(f.len == ref.tail);
    }
    if (ref.settle != SIZE_MAX && pos == n && (run.stop_at == 0 || run.got < run.stop_at))
        FUZZ_CHECK(failed);

    proto_framer_free(&f);
    free(ref.lines);
    return 0;
}
