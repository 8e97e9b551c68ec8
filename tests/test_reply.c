/*
 * test_reply.c: the reply writers' number and string output, byte for byte,
 * against references built independently of proto/reply.c.
 *
 * Logits go through proto_reply_logits() and proto_reply_step(), whose rows
 * are formatted in place, and every value must come out exactly as
 * snprintf("%.6f") prints it: every six-decimal fraction with several
 * integer parts and both signs, the halfway point after each and the
 * doubles on either side of it (the model's logits are doubles nearest
 * to k / 10^6; a formatter that rounds a halfway case the wrong way, or
 * trusts the product a * 10^6 too far, prints a different last digit),
 * negative zero, tiny and huge magnitudes, and random bit patterns; a few
 * million values in all.  Strings (ids, tags, messages) are compared with
 * a reference escaper: every byte value at the start, middle and end of a
 * string, since the writer copies plain strings in one pass and sends the
 * others to the escaping path.
 */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"
#include "proto/proto_int.h"
#include "test_util.h"

/* A small deterministic generator for the random cases. */
static uint64_t rng_state = 7;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* ---- Logits against snprintf("%.6f") ---- */

#define ROW 64
#define LOGITS_HEAD "{\"logits\":["
#define LOGITS_TAIL "],\"rows\":9}\n"
#define STEP_HEAD "{\"tag\":5,\"id\":\"s-1\",\"tokens\":[3],\"logits\":[["
#define STEP_TAIL "]],\"entries\":4}\n"

static double row[ROW];
static uint32_t nrow;
static long values_checked;

/* The reference text of a value in a reply: "%.6f", or null for what JSON
 * cannot hold. */
static size_t ref_f6(char *out, size_t cap, double v)
{
    int n = isfinite(v) ? snprintf(out, cap, "%.6f", v) : snprintf(out, cap, "null");

    if (n <= 0 || (size_t)n >= cap)
        ck_abort_msg("%a: no room for the reference", v);
    return (size_t)n;
}

/* Writes the buffered row as a logits reply and as a step reply and
 * compares both with the reference, value by value on a mismatch. */
static void flush_row(void)
{
    static char want[ROW * 340 + 64];
    static const uint32_t tokens[1] = {3};
    proto_buf_t b;
    size_t n = 0, head, body;

    if (nrow == 0)
        return;
    n += (size_t)snprintf(want + n, sizeof(want) - n, LOGITS_HEAD);
    for (uint32_t i = 0; i < nrow; i++) {
        if (i > 0)
            want[n++] = ',';
        n += ref_f6(want + n, sizeof(want) - n, row[i]);
    }
    n += (size_t)snprintf(want + n, sizeof(want) - n, LOGITS_TAIL);

    proto_buf_init(&b);
    if (proto_reply_logits(&b, NULL, row, nrow, 9) != SLOTD_OK)
        ck_abort_msg("proto_reply_logits failed");
    if (b.len != n || memcmp(b.data, want, n) != 0) {
        for (uint32_t i = 0; i < nrow; i++) {
            char one[PROTO__FMT6_MAX], got[PROTO__FMT6_MAX + 64];
            proto_buf_t c;
            proto_buf_init(&c);
            ck_assert_int_eq(proto_reply_logits(&c, NULL, &row[i], 1, 0), SLOTD_OK);
            snprintf(got, sizeof(got), "%.*s", (int)c.len, c.data);
            ref_f6(one, sizeof(one), row[i]);
            proto_buf_free(&c);
            if (strstr(got, one) == NULL || strlen(got) != strlen(one) + 23)
                ck_abort_msg("%a: got %s, want %s", row[i], got, one);
        }
        ck_abort_msg("a row of %u values differs:\n got %.*s\nwant %s", nrow, (int)b.len, b.data,
                     want);
    }

    /* The step reply: the same row (want's, between "{\"logits\":[" and
     * "],\"rows\":9}\n") after the id and tokens, then the entries. */
    b.len = 0;
    if (proto_reply_step(&b, "5", "s-1", tokens, 1, row, nrow, 4) != SLOTD_OK)
        ck_abort_msg("proto_reply_step failed");
    head = strlen(STEP_HEAD);
    body = n - strlen(LOGITS_HEAD) - strlen(LOGITS_TAIL);
    if (b.len != head + body + strlen(STEP_TAIL) || memcmp(b.data, STEP_HEAD, head) != 0 ||
        memcmp(b.data + head, want + strlen(LOGITS_HEAD), body) != 0 ||
        memcmp(b.data + head + body, STEP_TAIL, strlen(STEP_TAIL)) != 0)
        ck_abort_msg("the step reply differs:\n got %.*s\nwant %s", (int)b.len, b.data, want);
    proto_buf_free(&b);
    values_checked += nrow;
    nrow = 0;
}

static void ck_value(double v)
{
    row[nrow++] = v;
    if (nrow == ROW)
        flush_row();
}

static void ck_value_around(double v)
{
    ck_value(v);
    ck_value(nextafter(v, INFINITY));
    ck_value(nextafter(v, -INFINITY));
}

/* Every fraction k / 10^6 below 1 after each of several integer parts (one
 * digit, two, the carries from 9.9999995 and 99.9999995 into one more),
 * with either sign, and the halfway point after it with its neighbours:
 * the digits, the carry into the integer part and the rounding of each
 * last digit. */
START_TEST(test_f6_every_fraction)
{
    static const double ints[] = {0, 9, 99, 123456, 999999999};
    const int64_t step = SLOTD_UNDER_VALGRIND() ? 97 : 1;

    values_checked = 0;
    for (size_t q = 0; q < sizeof(ints) / sizeof(ints[0]); q++) {
        /* The large integer parts only every 7th fraction, to keep the run
         * short: their fractions are coarser anyway. */
        int64_t by = (ints[q] >= 1000 ? 7 : 1) * step;
        for (int64_t k = 0; k < 1000000; k += by) {
            double v = (ints[q] * 1e6 + (double)k) / 1e6;
            double h = (ints[q] * 1e6 + (double)k + 0.5) / 1e6;
            double s = (k & 1) ? -1.0 : 1.0;
            ck_value(s * v);
            ck_value_around(s * h);
        }
    }
    flush_row();
    ck_assert_int_gt(values_checked, SLOTD_UNDER_VALGRIND() ? 100000 : 12000000);
}
END_TEST

/* Values that sit on or next to an exact halfway point (m / 2^j for odd m
 * has a decimal expansion ending in 5 at position j), signed zeros, the
 * edges of the fast range and the slow path, infinities and NaNs. */
START_TEST(test_f6_edges)
{
    static const double special[] = {0.0,
                                     -0.0,
                                     5e-7,
                                     -5e-7,
                                     4.9999999999999998e-7,
                                     5.0000000000000004e-7,
                                     1.5e-6,
                                     2.5e-6,
                                     0.0000005,
                                     0.9999995,
                                     9.9999995,
                                     0.1234565,
                                     2.0000005,
                                     999999999.9999995,
                                     999999999.9999994,
                                     999999999.999999,
                                     999999999.5,
                                     1e9,
                                     -1e9,
                                     1e9 + 0.5,
                                     4503599627.3704955,
                                     1e15,
                                     1e300,
                                     DBL_MAX,
                                     DBL_MIN,
                                     DBL_TRUE_MIN,
                                     INFINITY,
                                     NAN};
    const int lim = SLOTD_UNDER_VALGRIND() ? 20000 : 1500000;

    values_checked = 0;
    for (size_t i = 0; i < sizeof(special) / sizeof(special[0]); i++) {
        ck_value_around(special[i]);
        ck_value_around(-special[i]);
    }
    /* Exact halfway cases m / 2^j, j = 7..20 (halfway at the 7th decimal
     * exactly only for j = 7; the others round at their own digits). */
    for (int j = 7; j <= 20; j++)
        for (int64_t m = 1; m < lim / 14; m += 2)
            ck_value(((m & 2) ? -1.0 : 1.0) * ldexp((double)m, -j));
    /* Random bit patterns in and around the fast range (|v| < 1e9), and
     * anywhere. */
    for (int i = 0; i < lim; i++) {
        uint64_t bits = rng_next();
        double v;
        if (i % 8 != 0)
            bits = (bits & UINT64_C(0x800FFFFFFFFFFFFF)) |
                   ((uint64_t)(1023 - 40 + (int)(rng_next() % 72)) << 52);
        memcpy(&v, &bits, sizeof(v));
        ck_value(v);
    }
    flush_row();
    ck_assert_int_gt(values_checked, SLOTD_UNDER_VALGRIND() ? 30000 : 2000000);
}
END_TEST

/* ---- Strings against a reference escaper ---- */

/* JSON text of `n` bytes of `s` as docs/protocol.md has replies carry them. */
static size_t ref_string(char *out, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0, k;

    out[o++] = '"';
    for (size_t i = 0; i < n; i += k) {
        unsigned char c = u[i];
        k = 1;
        if (c == '"' || c == '\\') {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t') {
            out[o++] = '\\';
            out[o++] = c == '\b' ? 'b' : c == '\f' ? 'f' : c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
        } else if (c < 0x20) {
            o += (size_t)sprintf(out + o, "\\u%04x", c);
        } else if (c < 0x80) {
            out[o++] = (char)c;
        } else if ((k = proto__utf8_seq(u + i, n - i)) != 0) {
            memcpy(out + o, u + i, k);
            o += k;
        } else {
            memcpy(out + o, "\\ufffd", 6);
            o += 6;
            k = 1;
        }
    }
    out[o++] = '"';
    return o;
}

static void ck_string(const char *s, size_t n)
{
    char id[PROTO_ID_MAX * 8 + 1], want[PROTO_ID_MAX * 8 * 6 + 64];
    slotd_error_t err;
    proto_buf_t b;
    size_t w;

    /* As an id (NUL-terminated). */
    ck_assert_uint_lt(n, sizeof(id));
    memcpy(id, s, n);
    id[n] = '\0';
    if (memchr(s, '\0', n) == NULL) {
        w = (size_t)sprintf(want, "{\"id\":");
        w += ref_string(want + w, s, n);
        w += (size_t)sprintf(want + w, ",\"released\":3}\n");
        proto_buf_init(&b);
        ck_assert_int_eq(proto_reply_finish(&b, NULL, id, 3), SLOTD_OK);
        ck_assert_msg(b.len == w && memcmp(b.data, want, w) == 0, "got %.*s\nwant %.*s", (int)b.len,
                      b.data, (int)w, want);
        proto_buf_free(&b);
    }
    /* As an error message (up to its NUL). */
    if (n < sizeof(err.message)) {
        size_t len;
        err.code = SLOTD_EBAD_REQUEST;
        memset(err.message, 0, sizeof(err.message));
        memcpy(err.message, s, n);
        len = strnlen(err.message, sizeof(err.message));
        w = (size_t)sprintf(want, "{\"tag\":1,\"error\":{\"code\":\"bad_request\",\"message\":");
        w += ref_string(want + w, err.message, len);
        w += (size_t)sprintf(want + w, "}}\n");
        proto_buf_init(&b);
        ck_assert_int_eq(proto_reply_error(&b, "1", &err), SLOTD_OK);
        ck_assert_msg(b.len == w && memcmp(b.data, want, w) == 0, "got %.*s\nwant %.*s", (int)b.len,
                      b.data, (int)w, want);
        proto_buf_free(&b);
    }
}

START_TEST(test_strings_every_byte)
{
    static const char *const utf8[] = {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
                                       "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                                       "\xe2\x82", "\xff"};
    char s[64];

    ck_string("", 0);
    ck_string("s-1", 3);
    ck_string("abcdefghijklmnopqrstuvwxyz0123456789_.:-ABCDEFGHIJKLMNOPQRSTUVWXYZ", 66);
    /* Every byte value alone, first, in the middle and last. */
    for (int c = 1; c < 256; c++) {
        s[0] = (char)c;
        ck_string(s, 1);
        snprintf(s, sizeof(s), "%cabc", c);
        ck_string(s, 4);
        snprintf(s, sizeof(s), "ab%ccd", c);
        ck_string(s, 5);
        snprintf(s, sizeof(s), "abcd%c", c);
        ck_string(s, 5);
    }
    /* Sequences of two or more bytes, well-formed and not, at each place. */
    for (size_t i = 0; i < sizeof(utf8) / sizeof(utf8[0]); i++) {
        size_t k = strlen(utf8[i]);
        ck_string(utf8[i], k);
        snprintf(s, sizeof(s), "x%sy", utf8[i]);
        ck_string(s, k + 2);
        snprintf(s, sizeof(s), "xyz%s", utf8[i]);
        ck_string(s, k + 3);
        snprintf(s, sizeof(s), "%s\"q", utf8[i]);
        ck_string(s, k + 2);
    }
}
END_TEST

/* A string written into a buffer with bytes already in it, and just at
 * the edge of its capacity: the one-pass copy must not leave a partial
 * string behind when it falls back, nor write past the room it made. */
START_TEST(test_strings_after_prefix)
{
    for (size_t pre = 0; pre < 300; pre += 7) {
        for (int esc = 0; esc < 2; esc++) {
            const char *id = esc ? "ab\"cd" : "abcde";
            char want[600];
            proto_buf_t b;
            size_t w;

            proto_buf_init(&b);
            for (size_t i = 0; i < pre; i++)
                if (proto_buf_append(&b, "p", 1) != SLOTD_OK)
                    ck_abort_msg("proto_buf_append failed");
            memset(want, 'p', pre);
            w = pre + (size_t)sprintf(want + pre, "{\"id\":");
            w += ref_string(want + w, id, 5);
            w += (size_t)sprintf(want + w, ",\"released\":0}\n");
            ck_assert_int_eq(proto_reply_finish(&b, NULL, id, 0), SLOTD_OK);
            ck_assert(b.len == w && memcmp(b.data, want, w) == 0);
            proto_buf_free(&b);
        }
    }
}
END_TEST

static Suite *reply_suite(void)
{
    Suite *s = suite_create("reply");
    TCase *tc = tcase_create("logits");

    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_f6_every_fraction);
    tcase_add_test(tc, test_f6_edges);
    suite_add_tcase(s, tc);

    tc = tcase_create("strings");
    tcase_add_test(tc, test_strings_every_byte);
    tcase_add_test(tc, test_strings_after_prefix);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(reply_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
