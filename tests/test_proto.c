/*
 * test_proto.c: the Check suite of proto/, framing, request validation and
 * replies.
 *
 * It holds the module to docs/protocol.md: lines cut at every possible byte
 * boundary, the length limit with and without a newline, every parse error
 * with its code, the field its message names and the order in which errors
 * win, the integer rule on awkward literals, the tag echo, every reply shape
 * parsed back with cJSON member by member, and proto__fmt6() against
 * snprintf("%.6f") over a few million values, and the arena cJSON's tree
 * is built in (no allocation for a usual line, chunks for a large tree,
 * their failure, other code's cJSON alongside).  It includes the module's
 * private header to reach the formatter, the UTF-8 check and the allocator
 * hook that makes allocations fail on purpose.
 */
#include <check.h>
#include <cjson/cJSON.h>
#include <float.h>
#include <inttypes.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/proto.h"
#include "proto/proto_int.h"

/* Under valgrind the formatter check runs a tenth of its values. */
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define UNDER_VALGRIND() (RUNNING_ON_VALGRIND != 0)
#endif
#endif
#ifndef UNDER_VALGRIND
#define UNDER_VALGRIND() 0
#endif

/* A small deterministic generator for the random cases. */
static uint64_t rng_state = 1;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static double rng_unit(void)
{
    return (double)(rng_next() >> 11) * 0x1p-53;
}

/* ---- Allocation failure ---- */

/* Fails every allocation from the `fail_at`-th on (counting from 0), for
 * proto/ and for cJSON alike; -1 never fails. */
static long alloc_count, alloc_fail_at = -1;

static void *failing_realloc(void *p, size_t n)
{
    if (alloc_fail_at >= 0 && alloc_count++ >= alloc_fail_at)
        return NULL;
    return realloc(p, n);
}

static void *failing_malloc(size_t n)
{
    return failing_realloc(NULL, n);
}

static void alloc_fail_from(long k)
{
    static cJSON_Hooks hooks = {failing_malloc, free};
    alloc_count = 0;
    alloc_fail_at = k;
    proto__realloc = failing_realloc;
    cJSON_InitHooks(&hooks);
}

static void alloc_restore(void)
{
    alloc_fail_at = -1;
    proto__realloc = realloc;
    cJSON_InitHooks(NULL);
}

/* ---- Framing ---- */

/* Collects the delivered lines, each followed by "\n" (lines never hold
 * one), and notes which came straight from the caller's buffer. */
typedef struct collect {
    proto_buf_t out;
    size_t count;
    size_t direct;
    const char *feed;
    size_t feed_len;
    size_t stop_at; /* return 7 on this line (1-based), 0: never */
} collect_t;

static int collect_cb(void *arg, const char *line, size_t len)
{
    collect_t *c = arg;

    ck_assert_ptr_null(memchr(line, '\n', len));
    ck_assert_int_eq(proto_buf_append(&c->out, line, len), SLOTD_OK);
    ck_assert_int_eq(proto_buf_append(&c->out, "\n", 1), SLOTD_OK);
    c->count++;
    if (c->feed != NULL && line >= c->feed && line + len <= c->feed + c->feed_len)
        c->direct++;
    return c->count == c->stop_at ? 7 : 0;
}

/* The fixture of the framer tests: a framer `f` of `max_line` bytes and
 * `c`, empty, to collect what it hands out; collect_free() frees both. */
static void collect_init(collect_t *c, proto_framer_t *f, size_t max_line)
{
    proto_framer_init(f, max_line);
    memset(c, 0, sizeof(*c));
    proto_buf_init(&c->out);
    /* Room enough that collecting never allocates while allocations are
     * made to fail. */
    ck_assert_int_eq(proto_buf_reserve(&c->out, 4096), SLOTD_OK);
}

static void collect_free(collect_t *c, proto_framer_t *f)
{
    proto_framer_free(f);
    proto_buf_free(&c->out);
}

static int feed(proto_framer_t *f, collect_t *c, const char *data, size_t len)
{
    c->feed = data;
    c->feed_len = len;
    return proto_framer_feed(f, data, len, collect_cb, c);
}

static int feed_str(proto_framer_t *f, collect_t *c, const char *s)
{
    return feed(f, c, s, strlen(s));
}

static void ck_lines(const collect_t *c, const char *expect)
{
    ck_assert_uint_eq(c->out.len, strlen(expect));
    ck_assert(memcmp(c->out.data, expect, c->out.len) == 0);
}

START_TEST(test_framer_one_line_per_feed)
{
    proto_framer_t f;
    collect_t c;

    collect_init(&c, &f, 64);
    ck_assert_int_eq(feed_str(&f, &c, "{\"op\":\"stats\"}\n"), SLOTD_OK);
    ck_assert_int_eq(feed_str(&f, &c, "b\n"), SLOTD_OK);
    ck_assert_int_eq(feed_str(&f, &c, "c\r\n"), SLOTD_OK);
    ck_lines(&c, "{\"op\":\"stats\"}\nb\nc\n");
    ck_assert_uint_eq(c.direct, 3);
    ck_assert_uint_eq(f.len, 0);
    ck_assert_ptr_null(f.buf); /* nothing was ever carried */
    collect_free(&c, &f);
}
END_TEST

START_TEST(test_framer_many_lines_per_feed)
{
    proto_framer_t f;
    collect_t c;

    collect_init(&c, &f, 64);
    ck_assert_int_eq(feed_str(&f, &c, "a\nbb\r\nccc\n\ndddd\nee"), SLOTD_OK);
    ck_lines(&c, "a\nbb\nccc\ndddd\n");
    ck_assert_uint_eq(c.direct, 4);
    ck_assert_uint_eq(f.len, 2);
    ck_assert_int_eq(feed_str(&f, &c, "e\nf\n"), SLOTD_OK);
    ck_lines(&c, "a\nbb\nccc\ndddd\neee\nf\n");
    ck_assert_uint_eq(c.direct, 5); /* "eee" came from the carry */
    ck_assert_int_eq(feed(&f, &c, "", 0), SLOTD_OK);
    collect_free(&c, &f);
}
END_TEST

/* A stream cut at every pair of byte boundaries (three feeds, empty ones
 * included) gives the same lines. */
START_TEST(test_framer_every_split)
{
    static const char stream[] = "{\"op\":\"stats\"}\n\r\n  \nab\r\n\t\r\nxyz\r\r\n\n"
                                 " \t \r\n12345678\r\nlast";
    static const char expect[] = "{\"op\":\"stats\"}\nab\nxyz\r\n12345678\n";
    size_t n = sizeof(stream) - 1;

    for (size_t i = 0; i <= n; i++) {
        for (size_t j = i; j <= n; j++) {
            proto_framer_t f;
            collect_t c;
            collect_init(&c, &f, 14); /* the longest line, exactly */
            ck_assert_int_eq(feed(&f, &c, stream, i), SLOTD_OK);
            ck_assert_int_eq(feed(&f, &c, stream + i, j - i), SLOTD_OK);
            ck_assert_int_eq(feed(&f, &c, stream + j, n - j), SLOTD_OK);
            ck_lines(&c, expect);
            ck_assert_uint_eq(f.len, 4);
            ck_assert(memcmp(f.buf, "last", 4) == 0);
            ck_assert_int_eq(feed_str(&f, &c, "\n"), SLOTD_OK);
            ck_assert_uint_eq(c.count, 5);
            collect_free(&c, &f);
        }
    }
}
END_TEST

START_TEST(test_framer_byte_by_byte)
{
    static const char stream[] = "abc\r\n\ndef\n \n\r\r\ng\n";
    proto_framer_t f;
    collect_t c;

    collect_init(&c, &f, 3);
    for (size_t i = 0; i < sizeof(stream) - 1; i++)
        ck_assert_int_eq(feed(&f, &c, stream + i, 1), SLOTD_OK);
    ck_lines(&c, "abc\ndef\ng\n");
    ck_assert_uint_le(f.cap, 4);
    collect_free(&c, &f);
}
END_TEST

START_TEST(test_framer_crlf_and_blank)
{
    proto_framer_t f;
    collect_t c;

    collect_init(&c, &f, 64);
    /* One "\r" before the "\n" goes; another stays in the line; a "\r"
     * elsewhere is part of the line.  Blank lines of any JSON white space
     * are skipped; a form feed is not JSON white space. */
    ck_assert_int_eq(
        feed_str(&f, &c, "a\r\nb\r\r\nc\rd\n\n\r\n \n\t\n \t\r \r\n\r\r\n\f\n \x0b \n"), SLOTD_OK);
    ck_lines(&c, "a\nb\r\nc\rd\n\f\n \x0b \n");
    collect_free(&c, &f);
}
END_TEST

START_TEST(test_framer_exact_limit)
{
    proto_framer_t f;
    collect_t c;

    /* max_line bytes are fine, with "\n" or "\r\n", whole or carried. */
    collect_init(&c, &f, 8);
    ck_assert_int_eq(feed_str(&f, &c, "12345678\n12345678\r\n"), SLOTD_OK);
    ck_assert_int_eq(feed_str(&f, &c, "1234"), SLOTD_OK);
    ck_assert_int_eq(feed_str(&f, &c, "5678"), SLOTD_OK);
    ck_assert_int_eq(feed_str(&f, &c, "\r"), SLOTD_OK); /* may be the "\r" of "\r\n" */
    ck_assert_uint_eq(f.len, 9);
    ck_assert_uint_le(f.cap, 9);
    ck_assert_int_eq(feed_str(&f, &c, "\n"), SLOTD_OK);
    ck_assert_int_eq(feed_str(&f, &c, "12345678\r"), SLOTD_OK);
    ck_assert_int_eq(feed_str(&f, &c, "\n"), SLOTD_OK);
    ck_lines(&c, "12345678\n12345678\n12345678\n12345678\n");
    collect_free(&c, &f);
}
END_TEST

/* Lines over the limit of 8 bytes, fed in pieces: each piece's result, and
 * the lines delivered before the error.  The framer then refuses every
 * feed and holds no buffer. */
static const struct too_long_case {
    const char *what;
    struct {
        const char *data;
        int rc;
    } feeds[4];
    const char *lines;
} too_long_cases[] = {
    {"max_line + 1 with a newline, refused from then on",
     {{"a\nb\r\n123456789\nc\n", SLOTD_ELINE_TOO_LONG},
      {"d\n", SLOTD_ELINE_TOO_LONG},
      {"", SLOTD_ELINE_TOO_LONG}},
     "a\nb\n"},
    {"max_line + 1 without a newline: known at once",
     {{"a\n123456789", SLOTD_ELINE_TOO_LONG}},
     "a\n"},
    {"carried across feeds: fails in the feed that passes the limit",
     {{"a\n1234", SLOTD_OK},
      {"5678", SLOTD_OK},
      {"9", SLOTD_ELINE_TOO_LONG},
      {"\n", SLOTD_ELINE_TOO_LONG}},
     "a\n"},
    /* A "\r" past the limit that is not followed by "\n" is line. */
    {"a \\r past the limit, then a byte",
     {{"12345678\r", SLOTD_OK}, {"x", SLOTD_ELINE_TOO_LONG}},
     ""},
    {"a \\r past the limit, then a byte and a newline",
     {{"12345678\rx\n", SLOTD_ELINE_TOO_LONG}},
     ""},
    {"two \\r past the limit", {{"12345678\r\r\n", SLOTD_ELINE_TOO_LONG}}, ""},
    {"white space counts towards the limit too", {{"         \n", SLOTD_ELINE_TOO_LONG}}, ""},
};

START_TEST(test_framer_too_long)
{
    const struct too_long_case *tc = &too_long_cases[_i];
    proto_framer_t f;
    collect_t c;

    collect_init(&c, &f, 8);
    for (size_t i = 0; i < sizeof(tc->feeds) / sizeof(tc->feeds[0]) && tc->feeds[i].data; i++) {
        int rc = feed_str(&f, &c, tc->feeds[i].data);
        ck_assert_msg(rc == tc->feeds[i].rc, "%s: feed %zu gave %d", tc->what, i, rc);
    }
    ck_lines(&c, tc->lines);
    ck_assert_msg(f.failed, "%s: not failed", tc->what);
    ck_assert_ptr_null(f.buf);
    ck_assert_int_eq(feed_str(&f, &c, "e\n"), SLOTD_ELINE_TOO_LONG);
    ck_lines(&c, tc->lines);
    collect_free(&c, &f);
}
END_TEST

/* The error comes in the feed holding the byte that settles it, after every
 * earlier line, for every way of cutting the stream in two. */
START_TEST(test_framer_too_long_every_split)
{
    static const char stream[] = "ab\n\n12345\r\n123456\ncd\n";
    const size_t n = sizeof(stream) - 1, settled = 3 + 1 + 7 + 6; /* the '6' */

    for (size_t i = 0; i <= n; i++) {
        proto_framer_t f;
        collect_t c;
        int rc1, rc2;
        collect_init(&c, &f, 5);
        rc1 = feed(&f, &c, stream, i);
        rc2 = feed(&f, &c, stream + i, n - i);
        if (i >= settled)
            ck_assert_int_eq(rc1, SLOTD_ELINE_TOO_LONG);
        else
            ck_assert_int_eq(rc1, SLOTD_OK);
        ck_assert_int_eq(rc2, SLOTD_ELINE_TOO_LONG);
        ck_lines(&c, "ab\n12345\n");
        collect_free(&c, &f);
    }
}
END_TEST

START_TEST(test_framer_callback_stops)
{
    proto_framer_t f;
    collect_t c;

    collect_init(&c, &f, 64);
    c.stop_at = 2;
    ck_assert_int_eq(feed_str(&f, &c, "a\nb\nc\nd"), 7);
    ck_lines(&c, "a\nb\n");
    /* The framer is at a line boundary and goes on with the next feed. */
    ck_assert_uint_eq(f.len, 0);
    ck_assert_int_eq(feed_str(&f, &c, "e\n"), SLOTD_OK);
    ck_lines(&c, "a\nb\ne\n");
    collect_free(&c, &f);

    /* Also when the line that stops came from the carry. */
    collect_init(&c, &f, 64);
    c.stop_at = 1;
    ck_assert_int_eq(feed_str(&f, &c, "ab"), SLOTD_OK);
    ck_assert_int_eq(feed_str(&f, &c, "c\nd\n"), 7);
    ck_lines(&c, "abc\n");
    ck_assert_uint_eq(f.len, 0);
    collect_free(&c, &f);
}
END_TEST

/* A callback that raises the limit at its first line, as a connection
 * does at its auth. */
static proto_framer_t *raise_framer;

static int raise_cb(void *arg, const char *line, size_t len)
{
    collect_t *c = arg;
    if (c->count == 0)
        proto_framer_raise_limit(raise_framer, 4096);
    return collect_cb(arg, line, len);
}

START_TEST(test_framer_raise_limit)
{
    static char data[2000], expect[2000];
    proto_framer_t f;
    collect_t c;

    /* One feed: a short line, a line and a tail both past the old limit,
     * which the carry must grow for after the callback raised it. */
    collect_init(&c, &f, 16);
    raise_framer = &f;
    memset(data, 'x', sizeof(data));
    memcpy(data, "auth\n", 5);
    data[5 + 300] = '\n';
    ck_assert_int_eq(proto_framer_feed(&f, data, 5 + 301 + 500, raise_cb, &c), SLOTD_OK);
    ck_assert_uint_eq(c.count, 2);
    ck_assert_uint_eq(f.len, 500);
    ck_assert_int_eq(feed_str(&f, &c, "y\n"), SLOTD_OK);
    memset(expect, 'x', sizeof(expect));
    memcpy(expect, "auth\n", 5);
    expect[5 + 300] = '\n';
    memcpy(expect + 5 + 301 + 500, "y\n", 3);
    ck_lines(&c, expect);
    /* Past the new limit, too long as ever. */
    static char many[4200];
    memset(many, 'x', sizeof(many));
    ck_assert_int_eq(feed(&f, &c, many, sizeof(many)), SLOTD_ELINE_TOO_LONG);
    collect_free(&c, &f);

    /* Not raised: the same feed is too long at the old limit. */
    collect_init(&c, &f, 16);
    ck_assert_int_eq(feed(&f, &c, data, 5 + 301 + 500), SLOTD_ELINE_TOO_LONG);
    collect_free(&c, &f);
}
END_TEST

/* Running out of memory uses nothing of the feed: feeding it again once
 * memory is back gives what an undisturbed framer gives. */
static void framer_nomem_run(size_t max_line, const char *const *feeds, size_t nfeeds,
                             const char *expect_lines, size_t expect_carry)
{
    size_t failures = 0;

    for (size_t fail = 0; fail < nfeeds; fail++) {
        proto_framer_t f;
        collect_t c;
        collect_init(&c, &f, max_line);
        for (size_t i = 0; i < nfeeds; i++) {
            size_t before = c.out.len, carried = f.len;
            int rc;
            if (i == fail)
                alloc_fail_from(0);
            rc = feed_str(&f, &c, feeds[i]);
            alloc_restore();
            if (rc == SLOTD_ENOMEM) {
                failures++;
                ck_assert_uint_eq(c.out.len, before);
                ck_assert_uint_eq(f.len, carried);
                ck_assert(!f.failed);
                rc = feed_str(&f, &c, feeds[i]);
            }
            ck_assert_int_eq(rc, SLOTD_OK);
        }
        ck_lines(&c, expect_lines);
        ck_assert_uint_eq(f.len, expect_carry);
        collect_free(&c, &f);
    }
    ck_assert_uint_gt(failures, 0);
}

START_TEST(test_framer_nomem)
{
    static const char *const small[] = {"a\nbc", "d\ne\nfg", "h", "\nij\n", "k"};
    static char big[4][400];
    static char expect[1300];
    const char *feeds[4] = {big[0], big[1], big[2], big[3]};

    framer_nomem_run(64, small, 5, "a\nbcd\ne\nfgh\nij\n", 1);

    /* A carried line that outgrows the carry, in steps. */
    memset(big, 'x', sizeof(big));
    for (int i = 0; i < 4; i++)
        big[i][399] = '\0';
    big[0][0] = 'y';
    big[2][100] = '\n';
    big[3][0] = '\n';
    memset(expect, 0, sizeof(expect));
    memcpy(expect, big[0], 399);
    memcpy(expect + 399, big[1], 399);
    memcpy(expect + 798, big[2], 100);
    strcat(expect, "\n");
    memcpy(expect + 899, big[2] + 101, 298);
    strcat(expect, "\n");
    framer_nomem_run(4096, feeds, 4, expect, 398);
}
END_TEST

/* ---- Buffers ---- */

START_TEST(test_buf)
{
    proto_buf_t b;
    size_t cap;

    proto_buf_init(&b);
    ck_assert_int_eq(proto_buf_append(&b, "hello ", 6), SLOTD_OK);
    ck_assert_int_eq(proto_buf_append(&b, NULL, 0), SLOTD_OK);
    for (int i = 0; i < 1000; i++)
        ck_assert_int_eq(proto_buf_append(&b, "0123456789", 10), SLOTD_OK);
    ck_assert_uint_eq(b.len, 10006);
    ck_assert_uint_ge(b.cap, b.len);
    ck_assert_uint_lt(b.cap, 2 * b.len);
    proto_buf_consume(&b, 6);
    ck_assert_uint_eq(b.len, 10000);
    ck_assert(memcmp(b.data, "0123456789", 10) == 0);
    proto_buf_consume(&b, 9995);
    ck_assert(memcmp(b.data, "56789", 5) == 0);
    cap = b.cap;
    proto_buf_consume(&b, 5);
    ck_assert_uint_eq(b.len, 0);
    ck_assert_uint_eq(b.cap, cap);
    ck_assert_int_eq(proto_buf_reserve(&b, SIZE_MAX), SLOTD_ENOMEM);
    ck_assert_int_eq(proto_buf_append(&b, "x", 1), SLOTD_OK);
    ck_assert_int_eq(proto_buf_reserve(&b, SIZE_MAX), SLOTD_ENOMEM);
    ck_assert_uint_eq(b.len, 1);
    alloc_fail_from(0);
    ck_assert_int_eq(proto_buf_reserve(&b, b.cap), SLOTD_ENOMEM);
    alloc_restore();
    ck_assert_uint_eq(b.len, 1);
    ck_assert_uint_eq(b.cap, cap);
    proto_buf_free(&b);
    ck_assert_ptr_null(b.data);
    proto_buf_free(&b);
}
END_TEST

/* ---- Requests ---- */

static int parse(const char *line, proto_request_t *r, slotd_error_t *e)
{
    memset(e, 0, sizeof(*e));
    return proto_request_parse(line, strlen(line), r, e);
}

/* Parses `line`, expecting `code` and, on an error, `needle` in the
 * message. */
static void expect(const char *line, int code, const char *needle)
{
    proto_request_t r;
    slotd_error_t e;
    int rc;

    proto_request_init(&r);
    rc = parse(line, &r, &e);
    if (rc != code || (code != SLOTD_OK && strstr(e.message, needle) == NULL))
        ck_abort_msg("%s: got %s (%s), want %s naming %s", line, slotd_err_name(rc),
                     rc != SLOTD_OK ? e.message : "", slotd_err_name(code), needle);
    if (rc != SLOTD_OK) {
        ck_assert_int_eq(e.code, rc);
        ck_assert_ptr_null(r.tokens);
    }
    proto_request_free(&r);
}

static void expect_len(const char *line, size_t len, int code)
{
    proto_request_t r;
    slotd_error_t e;

    proto_request_init(&r);
    ck_assert_int_eq(proto_request_parse(line, len, &r, &e), code);
    proto_request_free(&r);
}

START_TEST(test_parse_ops)
{
    proto_request_t r;
    slotd_error_t e;

    proto_request_init(&r);
    ck_assert_int_eq(
        parse("{\"op\":\"start\",\"id\":\"a\",\"model\":\"tiny\",\"prompt\":[1,2,3]}", &r, &e),
        SLOTD_OK);
    ck_assert_int_eq(r.op, PROTO_OP_START);
    ck_assert_str_eq(r.id, "a");
    ck_assert_str_eq(r.model, "tiny");
    ck_assert_uint_eq(r.ntokens, 3);
    ck_assert_int_eq(r.tokens[0], 1);
    ck_assert_int_eq(r.tokens[2], 3);
    ck_assert_ptr_null(r.tag);

    ck_assert_int_eq(parse("{\"op\":\"start\",\"id\":\"Az09_.:-\",\"prompt\":[-7]}", &r, &e),
                     SLOTD_OK);
    ck_assert_str_eq(r.model, "");
    ck_assert_str_eq(r.id, "Az09_.:-");
    ck_assert_int_eq(r.tokens[0], -7);

    ck_assert_int_eq(parse("{\"op\":\"step\",\"id\":\"a\"}", &r, &e), SLOTD_OK);
    ck_assert_int_eq(r.op, PROTO_OP_STEP);
    ck_assert_uint_eq(r.n, 1);
    ck_assert_ptr_null(r.tokens);
    ck_assert_int_eq(parse("{\"op\":\"step\",\"id\":\"a\",\"n\":3}", &r, &e), SLOTD_OK);
    ck_assert_uint_eq(r.n, 3);
    ck_assert_int_eq(parse("{\"op\":\"step\",\"id\":\"a\",\"n\":4294967295}", &r, &e), SLOTD_OK);
    ck_assert_uint_eq(r.n, UINT32_MAX);

    ck_assert_int_eq(parse("{\"op\":\"finish\",\"id\":\"a\"}", &r, &e), SLOTD_OK);
    ck_assert_int_eq(r.op, PROTO_OP_FINISH);

    ck_assert_int_eq(parse("{\"op\":\"logits\",\"tokens\":[0,1,2]}", &r, &e), SLOTD_OK);
    ck_assert_int_eq(r.op, PROTO_OP_LOGITS);
    ck_assert_uint_eq(r.ntokens, 3);
    ck_assert_str_eq(r.model, "");

    ck_assert_int_eq(parse("{\"op\":\"generate\",\"tokens\":[0,1],\"steps\":3,\"use_cache\":true,"
                           "\"model\":\"small\"}",
                           &r, &e),
                     SLOTD_OK);
    ck_assert_int_eq(r.op, PROTO_OP_GENERATE);
    ck_assert_uint_eq(r.ntokens, 2);
    ck_assert_int_eq(r.steps, 3);
    ck_assert(r.use_cache);
    ck_assert_str_eq(r.model, "small");
    ck_assert_int_eq(parse("{\"op\":\"generate\",\"tokens\":[5],\"steps\":0}", &r, &e), SLOTD_OK);
    ck_assert_int_eq(r.steps, 0);
    ck_assert(!r.use_cache);

    ck_assert_int_eq(parse(" \t{ \"op\" : \"stats\" } \r", &r, &e), SLOTD_OK);
    ck_assert_int_eq(r.op, PROTO_OP_STATS);
    proto_request_free(&r);

    ck_assert_str_eq(proto_op_name(PROTO_OP_NONE), "none");
    ck_assert_str_eq(proto_op_name(PROTO_OP_GENERATE), "generate");
    ck_assert_str_eq(proto_op_name(PROTO_OP__COUNT), "none");
}
END_TEST

/* The op table (proto/ops.c): every row is found by its name on both
 * paths, a required member's absence and a wrong type name the member, and
 * the ops that run on workers are the six with a run function in
 * server/job.c. */
START_TEST(test_op_table)
{
    static const bool on_worker[PROTO_OP__COUNT] = {
        [PROTO_OP_START] = true,  [PROTO_OP_STEP] = true,   [PROTO_OP_LOGITS] = true,
        [PROTO_OP_GENERATE] = true, [PROTO_OP_APPEND] = true, [PROTO_OP_FORK] = true,
    };
    proto_request_t r;
    slotd_error_t e;
    char line[256], want[160];

    proto_init();
    proto_request_init(&r);
    for (int k = 0; k <= PROTO_OP__COUNT; k++)
        ck_assert_int_eq(proto_op_on_worker((proto_op_t)k), k < PROTO_OP__COUNT && on_worker[k]);
    /* What each op acts on decides how the server applies it. */
    static const proto_op_kind_t kind[PROTO_OP__COUNT] = {
        [PROTO_OP_START] = PROTO_KIND_OPEN,         [PROTO_OP_STEP] = PROTO_KIND_SESSION,
        [PROTO_OP_FINISH] = PROTO_KIND_SESSION,     [PROTO_OP_LOGITS] = PROTO_KIND_STATELESS,
        [PROTO_OP_GENERATE] = PROTO_KIND_STATELESS, [PROTO_OP_STATS] = PROTO_KIND_BARRIER,
        [PROTO_OP_AUTH] = PROTO_KIND_CONN,          [PROTO_OP_APPEND] = PROTO_KIND_SESSION,
        [PROTO_OP_FORK] = PROTO_KIND_BRANCH,
    };
    for (int k = 0; k <= PROTO_OP__COUNT; k++)
        ck_assert_int_eq(proto_op_kind((proto_op_t)k),
                         k < PROTO_OP__COUNT ? kind[k] : PROTO_KIND_NONE);
    for (int k = PROTO_OP_NONE + 1; k < PROTO_OP__COUNT; k++) {
        const proto_op_def_t *d = &proto_ops[k];
        ck_assert_str_eq(proto_op_name((proto_op_t)k), d->name);
        ck_assert_uint_eq(strlen(d->name), d->len);
        ck_assert_uint_le(d->nmembers, PROTO_OP_MEMBERS_MAX);
        for (unsigned m = 0; m < d->nmembers; m++) {
            const proto_field_def_t *f = &proto_fields[d->members[m].field];
            /* A wrong type (an object) names the op and the member. */
            snprintf(line, sizeof(line), "{\"op\":\"%s\",\"%s\":{}}", d->name, f->name);
            snprintf(want, sizeof(want), "%s: `%s` %s", d->name, f->name, f->must);
            ck_assert_int_eq(proto__request_parse_tree(line, strlen(line), &r, &e),
                             SLOTD_EBAD_REQUEST);
            if (m == 0)
                ck_assert_str_eq(e.message, want);
            ck_assert_int_eq(proto__request_parse_flat(line, strlen(line), &r, &e),
                             PROTO__DECLINED);
            if (m == 0 && d->members[m].required) {
                snprintf(line, sizeof(line), "{\"op\":\"%s\"}", d->name);
                ck_assert_int_eq(parse(line, &r, &e), SLOTD_EBAD_REQUEST);
                ck_assert_ptr_nonnull(strstr(e.message, f->name));
            }
        }
    }
    proto_request_free(&r);
}
END_TEST

START_TEST(test_parse_bad_json)
{
    static const char *const lines[] = {
        "",
        "   ",
        "not json",
        "[1]",
        "[{\"op\":\"stats\"}]",
        "\"stats\"",
        "1",
        "-0",
        "null",
        "true",
        "{",
        "{\"op\":\"stats\"",
        "{\"op\":\"stats\"}x",
        "{\"op\":\"stats\"} {}",
        "{\"op\":\"stats\"}{\"op\":\"stats\"}",
        "{\"op\":\"stats\",}",
        "{\"op\",\"stats\"}",
        "{\"op\":\"stats\" \"x\":1}",
        "{'op':'stats'}",
        "{op:\"stats\"}",
        "{\"op\":\"stats\",\"x\":[1,]}",
        "{\"op\":\"stats\",\"x\":[,1]}",
        "{\"op\":\"stats\",\"x\":01}",
        "{\"op\":\"stats\",\"x\":1.}",
        "{\"op\":\"stats\",\"x\":.5}",
        "{\"op\":\"stats\",\"x\":+1}",
        "{\"op\":\"stats\",\"x\":-}",
        "{\"op\":\"stats\",\"x\":1e}",
        "{\"op\":\"stats\",\"x\":1e+}",
        "{\"op\":\"stats\",\"x\":0x10}",
        "{\"op\":\"stats\",\"x\":NaN}",
        "{\"op\":\"stats\",\"x\":Infinity}",
        "{\"op\":\"stats\",\"x\":-Infinity}",
        "{\"op\":\"stats\",\"x\":tru}",
        "{\"op\":\"stats\",\"x\":nul}",
        "{\"op\":\"stats\",\"x\":True}",
        "{\"op\":\"stats\",\"x\":\"\\x41\"}",
        "{\"op\":\"stats\",\"x\":\"\\u12\"}",
        "{\"op\":\"stats\",\"x\":\"\\u12G4\"}",
        "{\"op\":\"stats\",\"x\":\"\\\"}",
        "{\"op\":\"stats\",\"x\":\"\\ud800\"}",
        "{\"op\":\"stats\",\"x\":\"\\udc00\"}",
        "{\"op\":\"stats\",\"x\":\"\\ud800\\u0041\"}",
        "{\"op\":\"stats\",\"x\":\"\\ud800\\ud800\"}",
        "{\"op\":\"stats\",\"x\":\"\\u0000\"}",
        "{\"op\\u0000\":\"stats\"}",
        "{\"op\":\"stats\\u0000\"}",
        "{\"op\":\"stats\",\"x\":\"a\tb\"}",
        "{\"op\":\"stats\",\"x\":\"a\x01\"}",
        "{\"op\":\"stats\",\"x\":\"a\x1f\"}",
        "\f{\"op\":\"stats\"}",
        "{\"op\":\"stats\"}\x0b",
        "{\x01\"op\":\"stats\"}",
        "\xef\xbb\xbf{\"op\":\"stats\"}",
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
        expect(lines[i], SLOTD_EBAD_JSON, "");
    expect("[1]", SLOTD_EBAD_JSON, "not a JSON object");
    expect("{\"op\":\"stats\"} {}", SLOTD_EBAD_JSON, "more follows");
    /* Escapes that are fine. */
    expect("{\"op\":\"stats\",\"x\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u0001\\uD83D\\uDE00\\u00e9\"}",
           SLOTD_OK, "");
    expect("{\"op\":\"stats\",\"x\":\"\x7f\"}", SLOTD_OK, "");
}
END_TEST

START_TEST(test_parse_nul_and_utf8)
{
    static const char *const bad[] = {
        "\x80",                     /* lone continuation */
        "\xbf",                     /* lone continuation */
        "\xc0\xaf",                 /* overlong "/" */
        "\xc1\xbf",                 /* overlong */
        "\xe0\x80\xaf",             /* overlong, three bytes */
        "\xe0\x9f\xbf",             /* overlong U+07FF */
        "\xf0\x80\x80\xaf",         /* overlong, four bytes */
        "\xf0\x8f\xbf\xbf",         /* overlong U+FFFF */
        "\xed\xa0\x80",             /* U+D800 */
        "\xed\xbf\xbf",             /* U+DFFF */
        "\xed\xa0\xbd\xed\xb8\x80", /* a surrogate pair in CESU-8 */
        "\xf4\x90\x80\x80",         /* U+110000 */
        "\xf5\x80\x80\x80",
        "\xf8\x88\x80\x80\x80", /* five bytes */
        "\xfc\x84\x80\x80\x80\x80",
        "\xfe",
        "\xff",
        "\xc3",         /* truncated */
        "\xe2\x82",     /* truncated */
        "\xf0\x9f\x98", /* truncated */
        "\xc3\x28",     /* bad continuation */
        "\xe2\x28\xa1",
        "\xe2\x82\x28",
        "\xf0\x28\x8c\xbc",
        "\xf0\x9f\x98\x28",
    };
    char line[128];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        /* Inside a string value, inside a member name, outside strings. */
        snprintf(line, sizeof(line), "{\"op\":\"stats\",\"x\":\"a%sb\"}", bad[i]);
        expect(line, SLOTD_EBAD_JSON, "UTF-8");
        snprintf(line, sizeof(line), "{\"op\":\"stats\",\"%s\":1}", bad[i]);
        expect(line, SLOTD_EBAD_JSON, "UTF-8");
        snprintf(line, sizeof(line), "{\"op\":\"stats\"}%s", bad[i]);
        expect(line, SLOTD_EBAD_JSON, "UTF-8");
        /* At every offset, across the eight-byte fast path. */
        for (size_t pad = 0; pad < 9; pad++) {
            snprintf(line, sizeof(line), "{\"op\":\"stats\",\"x\":\"%.*s%s\"}", (int)pad,
                     "01234567", bad[i]);
            expect(line, SLOTD_EBAD_JSON, "UTF-8");
        }
    }
    /* The boundaries that are fine. */
    expect("{\"op\":\"stats\",\"x\":\"\xc2\x80\xdf\xbf\xe0\xa0\x80\xed\x9f\xbf\xee\x80\x80"
           "\xef\xbf\xbf\xf0\x90\x80\x80\xf4\x8f\xbf\xbf\"}",
           SLOTD_OK, "");

    /* NUL bytes, anywhere. */
    expect_len("{\"op\":\"stats\"}\0", 15, SLOTD_EBAD_JSON);
    expect_len("\0{\"op\":\"stats\"}", 15, SLOTD_EBAD_JSON);
    expect_len("{\"op\":\"st\0ats\"}", 15, SLOTD_EBAD_JSON);
    expect_len("{\"op\":\"stats\",\"x\":\"0123456789\0\"}", 32, SLOTD_EBAD_JSON);
    expect_len("{\"op\":\"stats\"}", 14, SLOTD_OK);
    {
        proto_request_t r;
        slotd_error_t e;
        proto_request_init(&r);
        ck_assert_int_eq(proto_request_parse("{\"op\":\"st\0ats\"}", 15, &r, &e), SLOTD_EBAD_JSON);
        ck_assert_ptr_nonnull(strstr(e.message, "NUL"));
        proto_request_free(&r);
    }
}
END_TEST

/* The UTF-8 check agrees with a decoder written from the definition, on
 * every sequence of up to three bytes and a broad sample of four. */
static size_t utf8_reference(const unsigned char *p, size_t n)
{
    uint32_t cp;
    size_t len;

    if (p[0] < 0x80)
        return 1;
    if ((p[0] & 0xE0) == 0xC0)
        len = 2, cp = p[0] & 0x1F;
    else if ((p[0] & 0xF0) == 0xE0)
        len = 3, cp = p[0] & 0x0F;
    else if ((p[0] & 0xF8) == 0xF0)
        len = 4, cp = p[0] & 0x07;
    else
        return 0;
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000))
        return 0; /* overlong */
    if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
        return 0;
    return len;
}

START_TEST(test_utf8_exhaustive)
{
    unsigned char s[4];

    for (uint32_t v = 0; v < (1u << 24); v++) {
        s[0] = (unsigned char)(v >> 16);
        s[1] = (unsigned char)(v >> 8);
        s[2] = (unsigned char)v;
        for (size_t n = 1; n <= 3; n++) {
            if (n < 3 && (v & ((1u << (8 * (3 - n))) - 1)) != 0)
                continue;
            if (proto__utf8_seq(s, n) != utf8_reference(s, n))
                ck_abort_msg("%02x %02x %02x (n %zu)", s[0], s[1], s[2], n);
        }
    }
    for (uint32_t lead = 0xF0; lead <= 0xFF; lead++) {
        for (uint32_t v = 0; v < (1u << 16); v++) {
            s[0] = (unsigned char)lead;
            s[1] = (unsigned char)(v >> 8);
            s[2] = (unsigned char)v;
            s[3] = (unsigned char)(v * 7 + 0x80);
            if (proto__utf8_seq(s, 4) != utf8_reference(s, 4))
                ck_abort_msg("%02x %02x %02x %02x", s[0], s[1], s[2], s[3]);
        }
    }
}
END_TEST

START_TEST(test_parse_deep_and_huge)
{
    size_t n = 100000;
    char *line = malloc(2 * n + 64);
    char *p;

    memset(line, '[', n);
    line[n] = '\0';
    expect(line, SLOTD_EBAD_JSON, "");

    p = line + sprintf(line, "{\"op\":\"stats\",\"x\":");
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "[");
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "]");
    sprintf(p, "}");
    expect(line, SLOTD_EBAD_JSON, "nested");

    p = line;
    for (size_t i = 0; i < n / 8; i++)
        p += sprintf(p, "{\"a\":");
    expect(line, SLOTD_EBAD_JSON, "");

    /* 128 levels are fine; 129 are not. */
    for (int depth = 127; depth <= 128; depth++) {
        p = line + sprintf(line, "{\"op\":\"stats\",\"x\":");
        for (int i = 0; i < depth; i++)
            *p++ = '[';
        for (int i = 0; i < depth; i++)
            *p++ = ']';
        strcpy(p, "}");
        expect(line, depth == 127 ? SLOTD_OK : SLOTD_EBAD_JSON, "nested");
    }

    /* A long string and a long, many-membered object are fine. */
    p = line + sprintf(line, "{\"op\":\"stats\",\"x\":\"");
    memset(p, 'x', n);
    strcpy(p + n, "\"}");
    expect(line, SLOTD_OK, "");
    p = line + sprintf(line, "{\"op\":\"stats\"");
    for (int i = 0; i < 5000; i++)
        p += sprintf(p, ",\"m%d\":%d", i, i);
    strcpy(p, "}");
    expect(line, SLOTD_OK, "");

    /* A number literal far longer than 63 characters. */
    p = line + sprintf(line, "{\"op\":\"stats\",\"x\":1");
    memset(p, '0', 400);
    strcpy(p + 400, "}");
    expect(line, SLOTD_OK, "");
    free(line);
}
END_TEST

START_TEST(test_parse_unknown_op)
{
    expect("{}", SLOTD_EUNKNOWN_OP, "`op`");
    expect("{\"id\":\"a\"}", SLOTD_EUNKNOWN_OP, "`op`");
    expect("{\"op\":null}", SLOTD_EUNKNOWN_OP, "`op`");
    expect("{\"op\":1}", SLOTD_EUNKNOWN_OP, "`op`");
    expect("{\"op\":[\"stats\"]}", SLOTD_EUNKNOWN_OP, "`op`");
    expect("{\"op\":\"\"}", SLOTD_EUNKNOWN_OP, "`op`");
    expect("{\"op\":\"none\"}", SLOTD_EUNKNOWN_OP, "`op`");
    expect("{\"op\":\"Stats\"}", SLOTD_EUNKNOWN_OP, "`op`");
    expect("{\"op\":\"stats \"}", SLOTD_EUNKNOWN_OP, "`op`");
    expect("{\"op\":\"bogus\"}", SLOTD_EUNKNOWN_OP, "\"bogus\"");
    expect("{\"OP\":\"stats\"}", SLOTD_EUNKNOWN_OP, "`op`");
    /* A long or strange op name is cut and made printable in the message. */
    expect("{\"op\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}",
           SLOTD_EUNKNOWN_OP, "aaa...\"");
    expect("{\"op\":\"a\\\"b\\n\xc3\xa9\"}", SLOTD_EUNKNOWN_OP, "\"a?b???\"");
}
END_TEST

START_TEST(test_parse_bad_request)
{
    char line[512];

    /* start */
    expect("{\"op\":\"start\",\"prompt\":[1]}", SLOTD_EBAD_REQUEST, "`id`");
    expect("{\"op\":\"start\",\"id\":null,\"prompt\":[1]}", SLOTD_EBAD_REQUEST, "`id`");
    expect("{\"op\":\"start\",\"id\":1,\"prompt\":[1]}", SLOTD_EBAD_REQUEST, "`id`");
    expect("{\"op\":\"start\",\"id\":\"\",\"prompt\":[1]}", SLOTD_EBAD_REQUEST, "`id`");
    expect("{\"op\":\"start\",\"id\":\"a b\",\"prompt\":[1]}", SLOTD_EBAD_REQUEST, "`id`");
    expect("{\"op\":\"start\",\"id\":\"a/b\",\"prompt\":[1]}", SLOTD_EBAD_REQUEST, "`id`");
    expect("{\"op\":\"start\",\"id\":\"\xc3\xa9\",\"prompt\":[1]}", SLOTD_EBAD_REQUEST, "`id`");
    expect("{\"op\":\"start\",\"id\":[\"a\"],\"prompt\":[1]}", SLOTD_EBAD_REQUEST, "`id`");
    snprintf(line, sizeof(line), "{\"op\":\"start\",\"id\":\"%064d\",\"prompt\":[1]}", 7);
    expect(line, SLOTD_OK, "");
    snprintf(line, sizeof(line), "{\"op\":\"start\",\"id\":\"%065d\",\"prompt\":[1]}", 7);
    expect(line, SLOTD_EBAD_REQUEST, "`id`");
    expect("{\"op\":\"start\",\"id\":\"a\",\"model\":null,\"prompt\":[1]}", SLOTD_EBAD_REQUEST,
           "`model`");
    expect("{\"op\":\"start\",\"id\":\"a\",\"model\":1,\"prompt\":[1]}", SLOTD_EBAD_REQUEST,
           "`model`");
    expect("{\"op\":\"start\",\"id\":\"a\",\"model\":\"\",\"prompt\":[1]}", SLOTD_EBAD_REQUEST,
           "`model`");
    snprintf(line, sizeof(line),
             "{\"op\":\"start\",\"id\":\"a\",\"model\":\"%032d\",\"prompt\":[1]}", 7);
    expect(line, SLOTD_OK, "");
    snprintf(line, sizeof(line),
             "{\"op\":\"start\",\"id\":\"a\",\"model\":\"%033d\",\"prompt\":[1]}", 7);
    expect(line, SLOTD_EBAD_REQUEST, "`model`");
    expect("{\"op\":\"start\",\"id\":\"a\"}", SLOTD_EBAD_REQUEST, "`prompt`");
    expect("{\"op\":\"start\",\"id\":\"a\",\"prompt\":null}", SLOTD_EBAD_REQUEST, "`prompt`");
    expect("{\"op\":\"start\",\"id\":\"a\",\"prompt\":[]}", SLOTD_EBAD_REQUEST,
           "start: `prompt` must be a non-empty array of integers");
    expect("{\"op\":\"start\",\"id\":\"a\",\"prompt\":1}", SLOTD_EBAD_REQUEST, "`prompt`");
    expect("{\"op\":\"start\",\"id\":\"a\",\"prompt\":\"1\"}", SLOTD_EBAD_REQUEST, "`prompt`");
    expect("{\"op\":\"start\",\"id\":\"a\",\"prompt\":{}}", SLOTD_EBAD_REQUEST, "`prompt`");
    expect("{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1,1.5]}", SLOTD_EBAD_REQUEST, "`prompt`");
    expect("{\"op\":\"start\",\"id\":\"a\",\"prompt\":[true]}", SLOTD_EBAD_REQUEST, "`prompt`");
    expect("{\"op\":\"start\",\"id\":\"a\",\"prompt\":[\"1\"]}", SLOTD_EBAD_REQUEST, "`prompt`");
    expect("{\"op\":\"start\",\"id\":\"a\",\"prompt\":[null]}", SLOTD_EBAD_REQUEST, "`prompt`");
    expect("{\"op\":\"start\",\"id\":\"a\",\"prompt\":[[1]]}", SLOTD_EBAD_REQUEST, "`prompt`");
    expect("{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1e400]}", SLOTD_EBAD_REQUEST, "`prompt`");

    /* step */
    expect("{\"op\":\"step\"}", SLOTD_EBAD_REQUEST, "step: `id`");
    expect("{\"op\":\"step\",\"id\":\"a\",\"n\":0}", SLOTD_EBAD_REQUEST, "`n`");
    expect("{\"op\":\"step\",\"id\":\"a\",\"n\":-1}", SLOTD_EBAD_REQUEST, "`n`");
    expect("{\"op\":\"step\",\"id\":\"a\",\"n\":1.5}", SLOTD_EBAD_REQUEST, "`n`");
    expect("{\"op\":\"step\",\"id\":\"a\",\"n\":4294967296}", SLOTD_EBAD_REQUEST, "`n`");
    expect("{\"op\":\"step\",\"id\":\"a\",\"n\":\"1\"}", SLOTD_EBAD_REQUEST, "`n`");
    expect("{\"op\":\"step\",\"id\":\"a\",\"n\":null}", SLOTD_EBAD_REQUEST, "`n`");
    expect("{\"op\":\"step\",\"id\":\"a\",\"n\":true}", SLOTD_EBAD_REQUEST, "`n`");
    expect("{\"op\":\"step\",\"id\":\"a\",\"n\":[1]}", SLOTD_EBAD_REQUEST, "`n`");

    /* finish */
    expect("{\"op\":\"finish\"}", SLOTD_EBAD_REQUEST, "finish: `id`");
    expect("{\"op\":\"finish\",\"id\":7}", SLOTD_EBAD_REQUEST, "`id`");

    /* logits */
    expect("{\"op\":\"logits\"}", SLOTD_EBAD_REQUEST, "logits: `tokens`");
    expect("{\"op\":\"logits\",\"tokens\":[]}", SLOTD_EBAD_REQUEST, "`tokens`");
    expect("{\"op\":\"logits\",\"tokens\":null}", SLOTD_EBAD_REQUEST, "`tokens`");
    expect("{\"op\":\"logits\",\"tokens\":[0,\"1\"]}", SLOTD_EBAD_REQUEST, "`tokens`");
    expect("{\"op\":\"logits\",\"prompt\":[0]}", SLOTD_EBAD_REQUEST, "`tokens`");
    expect("{\"op\":\"logits\",\"tokens\":[0],\"model\":false}", SLOTD_EBAD_REQUEST, "`model`");

    /* generate */
    expect("{\"op\":\"generate\",\"steps\":1}", SLOTD_EBAD_REQUEST, "generate: `tokens`");
    expect("{\"op\":\"generate\",\"tokens\":[0]}", SLOTD_EBAD_REQUEST, "`steps`");
    expect("{\"op\":\"generate\",\"tokens\":[0],\"steps\":null}", SLOTD_EBAD_REQUEST, "`steps`");
    expect("{\"op\":\"generate\",\"tokens\":[0],\"steps\":-1}", SLOTD_EBAD_REQUEST, "`steps`");
    expect("{\"op\":\"generate\",\"tokens\":[0],\"steps\":0.5}", SLOTD_EBAD_REQUEST, "`steps`");
    expect("{\"op\":\"generate\",\"tokens\":[0],\"steps\":\"3\"}", SLOTD_EBAD_REQUEST, "`steps`");
    expect("{\"op\":\"generate\",\"tokens\":[0],\"steps\":1e300}", SLOTD_EBAD_REQUEST, "`steps`");
    expect("{\"op\":\"generate\",\"tokens\":[0],\"steps\":1,\"use_cache\":null}",
           SLOTD_EBAD_REQUEST, "`use_cache`");
    expect("{\"op\":\"generate\",\"tokens\":[0],\"steps\":1,\"use_cache\":1}", SLOTD_EBAD_REQUEST,
           "`use_cache`");
    expect("{\"op\":\"generate\",\"tokens\":[0],\"steps\":1,\"use_cache\":\"true\"}",
           SLOTD_EBAD_REQUEST, "`use_cache`");
    expect("{\"op\":\"generate\",\"tokens\":[0],\"steps\":1,\"use_cache\":false,\"model\":\"\"}",
           SLOTD_EBAD_REQUEST, "`model`");

    /* stats takes nothing, and ignores what it is given. */
    expect("{\"op\":\"stats\",\"id\":null,\"n\":\"x\",\"tokens\":[]}", SLOTD_OK, "");
}
END_TEST

/* The first error met wins: JSON, then op, then the fields in order. */
START_TEST(test_parse_precedence)
{
    expect("{\"op\":\"bogus\",\"tag\":[1],\"x\":01}", SLOTD_EBAD_JSON, "");
    expect("{\"op\":\"bogus\",\"tag\":[1],\"x\":\"\xff\"}", SLOTD_EBAD_JSON, "UTF-8");
    expect("{\"tag\":[1]}", SLOTD_EUNKNOWN_OP, "`op`");
    expect("{\"op\":\"bogus\",\"tag\":null,\"id\":1}", SLOTD_EUNKNOWN_OP, "`op`");
    expect("{\"op\":\"start\",\"tag\":null,\"id\":1,\"prompt\":[]}", SLOTD_EBAD_REQUEST, "`tag`");
    expect("{\"op\":\"start\",\"id\":1,\"model\":1,\"prompt\":[]}", SLOTD_EBAD_REQUEST, "`id`");
    expect("{\"op\":\"start\",\"id\":\"a\",\"model\":1,\"prompt\":[]}", SLOTD_EBAD_REQUEST,
           "`model`");
    expect("{\"prompt\":[],\"model\":1,\"id\":\"a\",\"op\":\"start\"}", SLOTD_EBAD_REQUEST,
           "`model`");
    expect("{\"op\":\"generate\",\"tokens\":[],\"steps\":-1}", SLOTD_EBAD_REQUEST, "`tokens`");
    expect("{\"op\":\"generate\",\"tokens\":[1],\"steps\":-1,\"use_cache\":0}", SLOTD_EBAD_REQUEST,
           "`steps`");
    expect("{\"op\":\"step\",\"n\":0}", SLOTD_EBAD_REQUEST, "`id`");
}
END_TEST

/* Integers: an integral value within +-2^53, however it is written. */
static void expect_n(const char *literal, int64_t want)
{
    char line[1024];
    proto_request_t r;
    slotd_error_t e;

    snprintf(line, sizeof(line), "{\"op\":\"start\",\"id\":\"a\",\"prompt\":[%s]}", literal);
    proto_request_init(&r);
    if (parse(line, &r, &e) != SLOTD_OK)
        ck_abort_msg("%s: %s", literal, e.message);
    ck_assert_uint_eq(r.ntokens, 1);
    if (r.tokens[0] != want)
        ck_abort_msg("%s: got %" PRId64 ", want %" PRId64, literal, r.tokens[0], want);
    proto_request_free(&r);
}

static void expect_not_int(const char *literal)
{
    char line[1024];

    snprintf(line, sizeof(line), "{\"op\":\"start\",\"id\":\"a\",\"prompt\":[%s]}", literal);
    expect(line, SLOTD_EBAD_REQUEST, "`prompt`");
}

START_TEST(test_parse_integers)
{
    char lit[512];

    expect_n("0", 0);
    expect_n("-0", 0);
    expect_n("-0.0", 0);
    expect_n("0e5", 0);
    expect_n("0.000e-5", 0);
    expect_n("1.0", 1);
    expect_n("1.000", 1);
    expect_n("1e0", 1);
    expect_n("1E2", 100);
    expect_n("1e+2", 100);
    expect_n("100e-2", 1);
    expect_n("0.5e1", 5);
    expect_n("-12.5e1", -125);
    expect_n("-5", -5);
    expect_n("123456789012345", 123456789012345);
    expect_n("1234567890123456", 1234567890123456);
    expect_n("9007199254740992", INT64_C(9007199254740992));
    expect_n("-9007199254740992", -INT64_C(9007199254740992));
    expect_n("9007199254740991", INT64_C(9007199254740991));
    expect_n("9.007199254740992e15", INT64_C(9007199254740992));
    expect_n("90071992547409920e-1", INT64_C(9007199254740992));
    expect_n("1000000000000000000000e-6", INT64_C(1000000000000000));
    expect_n("4294967296", INT64_C(4294967296));
    expect_n("1e-0", 1);
    expect_n("10e-1", 1);

    expect_not_int("0.5");
    expect_not_int("1.5");
    expect_not_int("-0.1");
    expect_not_int("1e-1");
    expect_not_int("1e-400");
    expect_not_int("1e300");
    expect_not_int("1e400");
    expect_not_int("-1e400");
    expect_not_int("1.0000000000000001");
    expect_not_int("0.99999999999999999");
    expect_not_int("9007199254740991.5");
    expect_not_int("9007199254740993");
    expect_not_int("-9007199254740993");
    expect_not_int("9007199254740992.0000001");
    expect_not_int("18446744073709551616");
    expect_not_int("123456789012345678901234567890e-20");
    expect_not_int("1e99999999999999999999999");
    expect_not_int("true");
    expect_not_int("\"1\"");
    expect_not_int("null");

    /* Literals longer than cJSON's 63-character number buffer. */
    memset(lit, 0, sizeof(lit));
    strcpy(lit, "1.");
    memset(lit + 2, '0', 300);
    expect_n(lit, 1);
    lit[150] = '1';
    expect_not_int(lit);
    memset(lit, 0, sizeof(lit));
    lit[0] = '7';
    memset(lit + 1, '0', 299);
    strcat(lit, "e-299");
    expect_n(lit, 7);
    memset(lit, 0, sizeof(lit));
    memset(lit, '9', 300);
    expect_not_int(lit);
    memset(lit, 0, sizeof(lit));
    strcpy(lit, "-0.");
    memset(lit + 3, '0', 300);
    expect_n(lit, 0);

    /* Many such literals in one line, next to short ones. */
    expect("{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1.0,2,3e0,4.00,1e1],\"x\":[1.5,2e-3,"
           "-0.25,1e400]}",
           SLOTD_OK, "");
    {
        proto_request_t r;
        slotd_error_t e;
        proto_request_init(&r);
        ck_assert_int_eq(parse("{\"x\":1.5e3,\"op\":\"start\",\"id\":\"a\",\"prompt\":[1.0,2,3e0,"
                               "4.00,1e1,-0.0e9,12345678901234567e-1]}",
                               &r, &e),
                         SLOTD_EBAD_REQUEST);
        ck_assert_ptr_nonnull(strstr(e.message, "element 6"));
        ck_assert_int_eq(parse("{\"x\":1.5e3,\"op\":\"start\",\"id\":\"a\",\"prompt\":[1.0,2,3e0,"
                               "4.00,1e1,-0.0e9,12345678901234560e-1]}",
                               &r, &e),
                         SLOTD_OK);
        ck_assert_uint_eq(r.ntokens, 7);
        ck_assert_int_eq(r.tokens[0], 1);
        ck_assert_int_eq(r.tokens[1], 2);
        ck_assert_int_eq(r.tokens[2], 3);
        ck_assert_int_eq(r.tokens[3], 4);
        ck_assert_int_eq(r.tokens[4], 10);
        ck_assert_int_eq(r.tokens[5], 0);
        ck_assert_int_eq(r.tokens[6], INT64_C(1234567890123456));
        proto_request_free(&r);
    }
    /* Other integer fields follow the same rule. */
    expect("{\"op\":\"step\",\"id\":\"a\",\"n\":1.0}", SLOTD_OK, "");
    expect("{\"op\":\"step\",\"id\":\"a\",\"n\":4294967295.0}", SLOTD_OK, "");
    expect("{\"op\":\"step\",\"id\":\"a\",\"n\":42949672950e-1}", SLOTD_OK, "");
    expect("{\"op\":\"step\",\"id\":\"a\",\"n\":4.294967296e9}", SLOTD_EBAD_REQUEST, "`n`");
    expect("{\"op\":\"generate\",\"tokens\":[1],\"steps\":2.0}", SLOTD_OK, "");
    expect("{\"op\":\"generate\",\"tokens\":[1],\"steps\":-0}", SLOTD_OK, "");
}
END_TEST

START_TEST(test_parse_members)
{
    proto_request_t r;
    slotd_error_t e;

    proto_request_init(&r);
    /* Unknown members are ignored, whatever they hold. */
    ck_assert_int_eq(
        parse("{\"op\":\"step\",\"id\":\"a\",\"x\":[1,{\"y\":null,\"z\":[true,false]}],"
              "\"Id\":\"b\",\"\":\"\",\"n \":7}",
              &r, &e),
        SLOTD_OK);
    ck_assert_str_eq(r.id, "a");
    ck_assert_uint_eq(r.n, 1);
    /* Of duplicate members the first counts. */
    ck_assert_int_eq(parse("{\"op\":\"stats\",\"op\":\"start\"}", &r, &e), SLOTD_OK);
    ck_assert_int_eq(r.op, PROTO_OP_STATS);
    ck_assert_int_eq(parse("{\"op\":\"step\",\"id\":\"a\",\"id\":\"b\",\"n\":2,\"n\":0}", &r, &e),
                     SLOTD_OK);
    ck_assert_str_eq(r.id, "a");
    ck_assert_uint_eq(r.n, 2);
    ck_assert_int_eq(parse("{\"op\":\"step\",\"id\":\"a\",\"n\":0,\"n\":2}", &r, &e),
                     SLOTD_EBAD_REQUEST);
    /* Member names are matched after unescaping, exactly. */
    ck_assert_int_eq(parse("{\"\\u006fp\":\"st\\u0061ts\"}", &r, &e), SLOTD_OK);
    ck_assert_int_eq(r.op, PROTO_OP_STATS);
    /* Reuse without proto_request_free() in between does not leak. */
    ck_assert_int_eq(parse("{\"op\":\"logits\",\"tag\":\"t\",\"tokens\":[1,2]}", &r, &e), SLOTD_OK);
    ck_assert_int_eq(parse("{\"op\":\"logits\",\"tag\":\"u\",\"tokens\":[3]}", &r, &e), SLOTD_OK);
    ck_assert_str_eq(r.tag, "\"u\"");
    ck_assert_uint_eq(r.ntokens, 1);
    proto_request_free(&r);
    proto_request_free(&r);
}
END_TEST

static void expect_tag(const char *line, int code, const char *tag)
{
    proto_request_t r;
    slotd_error_t e;
    int rc;

    proto_request_init(&r);
    rc = parse(line, &r, &e);
    if (rc != code)
        ck_abort_msg("%s: got %s (%s)", line, slotd_err_name(rc), e.message);
    if (tag == NULL) {
        if (r.tag != NULL)
            ck_abort_msg("%s: tag %s, want none", line, r.tag);
    } else {
        ck_assert_ptr_nonnull(r.tag);
        ck_assert_str_eq(r.tag, tag);
    }
    proto_request_free(&r);
}

START_TEST(test_parse_tag)
{
    expect_tag("{\"op\":\"stats\"}", SLOTD_OK, NULL);
    expect_tag("{\"op\":\"stats\",\"tag\":\"x\"}", SLOTD_OK, "\"x\"");
    expect_tag("{\"op\":\"stats\",\"tag\":\"\"}", SLOTD_OK, "\"\"");
    expect_tag("{\"op\":\"stats\",\"tag\":7}", SLOTD_OK, "7");
    expect_tag("{\"op\":\"stats\",\"tag\":-7}", SLOTD_OK, "-7");
    expect_tag("{\"op\":\"stats\",\"tag\":7.0}", SLOTD_OK, "7");
    expect_tag("{\"op\":\"stats\",\"tag\":7e2}", SLOTD_OK, "700");
    expect_tag("{\"op\":\"stats\",\"tag\":-0}", SLOTD_OK, "0");
    expect_tag("{\"op\":\"stats\",\"tag\":9007199254740992}", SLOTD_OK, "9007199254740992");
    expect_tag("{\"op\":\"stats\",\"tag\":\"a\\\"b\\\\c\\/d\\n\\t\\u0001\\u00e9\xc3\xa9\\ud83d"
               "\\ude00\\u2028\"}",
               SLOTD_OK,
               "\"a\\\"b\\\\c/d\\n\\t\\u0001\xc3\xa9\xc3\xa9\xf0\x9f\x98\x80\xe2\x80\xa8\"");
    /* A tag of another type is bad_request naming `tag`, with no tag. */
    expect("{\"op\":\"stats\",\"tag\":null}", SLOTD_EBAD_REQUEST, "`tag`");
    expect("{\"op\":\"stats\",\"tag\":true}", SLOTD_EBAD_REQUEST, "`tag`");
    expect("{\"op\":\"stats\",\"tag\":1.5}", SLOTD_EBAD_REQUEST, "`tag`");
    expect("{\"op\":\"stats\",\"tag\":1e20}", SLOTD_EBAD_REQUEST, "`tag`");
    expect("{\"op\":\"stats\",\"tag\":[1]}", SLOTD_EBAD_REQUEST, "`tag`");
    expect("{\"op\":\"stats\",\"tag\":{}}", SLOTD_EBAD_REQUEST, "`tag`");
    expect_tag("{\"op\":\"stats\",\"tag\":null}", SLOTD_EBAD_REQUEST, NULL);
    /* A valid tag is there for the error reply of an op or field error... */
    expect_tag("{\"op\":\"bogus\",\"tag\":\"t\"}", SLOTD_EUNKNOWN_OP, "\"t\"");
    expect_tag("{\"tag\":3}", SLOTD_EUNKNOWN_OP, "3");
    expect_tag("{\"op\":\"step\",\"tag\":\"t\",\"id\":\"\"}", SLOTD_EBAD_REQUEST, "\"t\"");
    expect_tag("{\"op\":\"step\",\"id\":\"a\",\"n\":0,\"tag\":5}", SLOTD_EBAD_REQUEST, "5");
    /* ...but not of a line that is not JSON. */
    expect_tag("{\"op\":\"stats\",\"tag\":\"t\"", SLOTD_EBAD_JSON, NULL);
    /* Duplicates: the first counts. */
    expect_tag("{\"op\":\"stats\",\"tag\":1,\"tag\":2}", SLOTD_OK, "1");
}
END_TEST

START_TEST(test_parse_nomem)
{
    static const char *const lines[] = {
        "{\"op\":\"start\",\"id\":\"a\",\"tag\":\"t\",\"prompt\":[1,2.0,3]}",
        "{\"op\":\"generate\",\"tag\":4,\"tokens\":[1,2],\"steps\":1e1}",
        "{\"op\":\"step\",\"tag\":\"t\",\"id\":\"a\",\"n\":0}",
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
        proto_request_t r, want;
        slotd_error_t e, want_e;
        int want_rc;
        bool done = false;
        proto_request_init(&r);
        proto_request_init(&want);
        want_rc = parse(lines[i], &want, &want_e);
        for (long k = 0; !done; k++) {
            int rc;
            alloc_fail_from(k);
            rc = parse(lines[i], &r, &e);
            alloc_restore();
            if (rc == SLOTD_ENOMEM) {
                ck_assert_int_eq(e.code, SLOTD_ENOMEM);
                ck_assert_ptr_null(r.tokens);
                continue;
            }
            done = true;
            ck_assert_int_eq(rc, want_rc);
            ck_assert_uint_eq(r.ntokens, want.ntokens);
            ck_assert_str_eq(r.tag, want.tag);
        }
        proto_request_free(&r);
        proto_request_free(&want);
    }
}
END_TEST

/* ---- The cJSON arena ---- */

/* The arena is the tree path's: these tests parse with it alone (the
 * one-pass path takes most of their lines without cJSON). */
static int parse_tree(const char *line, proto_request_t *r, slotd_error_t *e)
{
    memset(e, 0, sizeof(*e));
    return proto__request_parse_tree(line, strlen(line), r, e);
}

/* Counts proto/'s allocations without failing any. */
static long counted_allocs;

static void *counting_realloc(void *p, size_t n)
{
    counted_allocs++;
    return realloc(p, n);
}

/* A start line with `n` prompt tokens; the caller frees it. */
static char *long_start(size_t n)
{
    char *line = malloc(64 + n * 8), *p = line;
    ck_assert_ptr_nonnull(line);
    p += sprintf(p, "{\"op\":\"start\",\"id\":\"big\",\"tag\":\"t\",\"prompt\":[");
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "%s%zu", i ? "," : "", i % 1000);
    strcpy(p, "],\"x\":1.5e0}");
    return line;
}

/* A usual line builds its tree in the thread's static block: no chunk, and
 * no allocation of proto/'s but the request's own (tag, tokens). */
START_TEST(test_parse_arena_no_alloc)
{
    static const struct {
        const char *line;
        long allocs; /* proto/'s: tag and tokens */
    } cases[] = {
        {"{\"op\":\"step\",\"id\":\"s12\"}", 0},
        {"{\"op\":\"step\",\"id\":\"s12\",\"n\":4}", 0},
        {"{\"op\":\"finish\",\"id\":\"s12\",\"tag\":7}", 1},
        {"{\"op\":\"start\",\"id\":\"a\",\"model\":\"tiny\",\"prompt\":[1,2,3]}", 1},
        {"{\"op\":\"stats\",\"unknown\":{\"a\":[1,{\"b\":null}]}}", 0},
        /* A tag that needs escaping: its buffer, then trimmed; and tokens. */
        {"{\"op\":\"generate\",\"tokens\":[1,2],\"steps\":3.0,\"tag\":\"x\\\"y\"}", 3},
    };
    proto_request_t r;
    slotd_error_t e;
    proto__arena_stats_t st;

    proto__json_hooks_install();
    proto_request_init(&r);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        counted_allocs = 0;
        proto__realloc = counting_realloc;
        ck_assert_int_eq(parse_tree(cases[i].line, &r, &e), SLOTD_OK);
        proto__realloc = realloc;
        ck_assert_int_eq(counted_allocs, cases[i].allocs);
        proto__arena_last(&st);
        ck_assert_uint_gt(st.allocs, 2);
        ck_assert_uint_gt(st.block_bytes, 0);
        ck_assert_uint_eq(st.chunks, 0);
    }
    ck_assert_str_eq(r.tag, "\"x\\\"y\"");
    ck_assert_int_eq(r.steps, 3);
    proto_request_free(&r);
}
END_TEST

/* A tree larger than the block goes on in chunks, which are released by
 * the time the parse returns (ASan and valgrind see to that), and the
 * request is the same as it always was. */
START_TEST(test_parse_arena_chunks)
{
    proto_request_t r;
    slotd_error_t e;
    proto__arena_stats_t st;
    char *line = long_start(5000);

    proto__json_hooks_install();
    proto_request_init(&r);
    ck_assert_int_eq(parse_tree(line, &r, &e), SLOTD_OK);
    proto__arena_last(&st);
    ck_assert_uint_ge(st.chunks, 2);
    ck_assert_uint_gt(st.chunk_bytes, 5000 * 32);
    ck_assert_uint_eq(r.ntokens, 5000);
    for (size_t i = 0; i < 5000; i++)
        ck_assert_int_eq(r.tokens[i], (int64_t)(i % 1000));
    ck_assert_str_eq(r.tag, "\"t\"");
    ck_assert_str_eq(r.id, "big");
    /* And a small line after it is back in the block. */
    ck_assert_int_eq(parse_tree("{\"op\":\"step\",\"id\":\"big\"}", &r, &e), SLOTD_OK);
    proto__arena_last(&st);
    ck_assert_uint_eq(st.chunks, 0);
    proto_request_free(&r);
    free(line);
}
END_TEST

/* Chunks that cannot be had: the parse fails with ENOMEM, holds nothing,
 * and the next parse works. */
START_TEST(test_parse_arena_nomem)
{
    char *line = long_start(3000);
    proto_request_t r, want;
    slotd_error_t e;
    bool done = false;
    long failures = 0;

    proto__json_hooks_install();
    proto_request_init(&r);
    proto_request_init(&want);
    ck_assert_int_eq(parse_tree(line, &want, &e), SLOTD_OK);
    for (long k = 0; !done; k++) {
        int rc;
        alloc_count = 0;
        alloc_fail_at = k;
        proto__realloc = failing_realloc; /* cJSON's hooks stay proto/'s */
        rc = parse_tree(line, &r, &e);
        alloc_fail_at = -1;
        proto__realloc = realloc;
        if (rc == SLOTD_ENOMEM) {
            ck_assert_int_eq(e.code, SLOTD_ENOMEM);
            ck_assert_ptr_null(r.tokens);
            failures++;
            continue;
        }
        done = true;
        ck_assert_int_eq(rc, SLOTD_OK);
        ck_assert_uint_eq(r.ntokens, want.ntokens);
        ck_assert(memcmp(r.tokens, want.tokens, want.ntokens * sizeof(*r.tokens)) == 0);
    }
    ck_assert_int_ge(failures, 3); /* chunks, tag, tokens */
    proto_request_free(&r);
    proto_request_free(&want);
    free(line);
}
END_TEST

/* Other code's cJSON: outside a parse the hooks are malloc and free (a
 * tree built and deleted around parses, even one from before the hooks);
 * with the hooks replaced, parsing still works and frees its tree. */
START_TEST(test_parse_arena_other_cjson)
{
    static cJSON_Hooks plain = {malloc, free};
    proto_request_t r;
    slotd_error_t e;
    proto__arena_stats_t st;
    cJSON *before, *mine;
    char *text;

    cJSON_InitHooks(&plain);
    before = cJSON_Parse("{\"a\":[1,2,3],\"b\":\"x\"}");
    ck_assert_ptr_nonnull(before);
    proto__json_hooks_install();
    proto_request_init(&r);
    mine = cJSON_CreateObject();
    ck_assert_ptr_nonnull(cJSON_AddStringToObject(mine, "k", "v"));
    ck_assert_int_eq(parse_tree("{\"op\":\"step\",\"id\":\"q\"}", &r, &e), SLOTD_OK);
    /* Both trees are intact after the parse, and free as usual. */
    ck_assert_ptr_nonnull(cJSON_AddNumberToObject(mine, "n", 5));
    text = cJSON_PrintUnformatted(mine);
    ck_assert_str_eq(text, "{\"k\":\"v\",\"n\":5}");
    cJSON_free(text);
    cJSON_Delete(mine);
    cJSON_Delete(before);

    /* Hooks replaced by someone else: the arena serves nothing and the
     * tree is freed by cJSON_Delete (valgrind and ASan see no leak). */
    cJSON_InitHooks(&plain);
    ck_assert_int_eq(parse_tree("{\"op\":\"start\",\"id\":\"q\",\"prompt\":[1,2]}", &r, &e),
                     SLOTD_OK);
    proto__arena_last(&st);
    ck_assert_uint_eq(st.allocs, 0);
    ck_assert_uint_eq(r.ntokens, 2);
    proto__json_hooks_install();
    ck_assert_int_eq(parse_tree("{\"op\":\"start\",\"id\":\"q\",\"prompt\":[1,2]}", &r, &e),
                     SLOTD_OK);
    proto__arena_last(&st);
    ck_assert_uint_gt(st.allocs, 0);
    proto_request_free(&r);
}
END_TEST

/* ---- The two paths: one pass, and the tree ---- */

/* The same code, the same error (code and message) if it is one, and the
 * same request, member by member. */
static void ck_same(const char *what, int rc_a, const proto_request_t *a, const slotd_error_t *ea,
                    int rc_b, const proto_request_t *b, const slotd_error_t *eb)
{
    if (rc_a != rc_b ||
        (rc_a != SLOTD_OK && (ea->code != eb->code || strcmp(ea->message, eb->message) != 0)))
        ck_abort_msg("%s: %d \"%s\" against %d \"%s\"", what, rc_a, ea->message, rc_b, eb->message);
    if (a->op != b->op || (a->tag == NULL) != (b->tag == NULL) ||
        (a->tag != NULL && strcmp(a->tag, b->tag) != 0) || strcmp(a->id, b->id) != 0 ||
        strcmp(a->model, b->model) != 0 || a->ntokens != b->ntokens ||
        (a->tokens == NULL) != (b->tokens == NULL) ||
        (a->ntokens > 0 && memcmp(a->tokens, b->tokens, a->ntokens * sizeof(*a->tokens)) != 0) ||
        a->steps != b->steps || a->use_cache != b->use_cache || a->n != b->n ||
        memcmp(&a->dec, &b->dec, sizeof(a->dec)) != 0)
        ck_abort_msg("%s: the requests differ", what);
}

/* How the one-pass path is to treat a line. */
enum { TAKEN, DECLINED };

/* `len` bytes at `line` give the same through proto_request_parse() as
 * through the tree path alone, and the one-pass path alone takes the line
 * (with that same result) or declines it (leaving the request empty), as
 * `want` says. */
static void expect_paths_len(const char *line, size_t len, int want)
{
    proto_request_t r, tree, flat, empty;
    slotd_error_t e, te, fe;
    int rc, trc, frc;

    proto_request_init(&r);
    proto_request_init(&tree);
    proto_request_init(&flat);
    proto_request_init(&empty);
    memset(&e, 0, sizeof(e));
    memset(&te, 0, sizeof(te));
    memset(&fe, 0, sizeof(fe));
    rc = proto_request_parse(line, len, &r, &e);
    trc = proto__request_parse_tree(line, len, &tree, &te);
    frc = proto__request_parse_flat(line, len, &flat, &fe);
    ck_same(line, rc, &r, &e, trc, &tree, &te);
    if (want == TAKEN) {
        if (frc != SLOTD_OK)
            ck_abort_msg("%s: the one-pass path gave %d, want it taken", line, frc);
        ck_same(line, frc, &flat, &fe, trc, &tree, &te);
    } else {
        if (frc != PROTO__DECLINED)
            ck_abort_msg("%s: the one-pass path gave %d, want it declined", line, frc);
        ck_same(line, SLOTD_OK, &flat, &fe, SLOTD_OK, &empty, &fe);
        ck_assert_int_eq(fe.code, 0);
        ck_assert_str_eq(fe.message, "");
    }
    proto_request_free(&r);
    proto_request_free(&tree);
    proto_request_free(&flat);
}

static void expect_paths(const char *line, int want)
{
    expect_paths_len(line, strlen(line), want);
}

/* Counts cJSON's allocations. */
static long cjson_allocs;

static void *cjson_counting_malloc(size_t n)
{
    cjson_allocs++;
    return malloc(n);
}

/* The usual requests are read in one pass: no cJSON tree at all (cJSON's
 * allocator is never called), and the same request as the tree path. */
START_TEST(test_parse_flat_common)
{
    static const char *const lines[] = {
        "{\"op\":\"start\",\"id\":\"s12\",\"model\":\"tiny\",\"prompt\":[1,2,3]}",
        "{\"op\":\"start\",\"id\":\"s0\",\"model\":\"tiny\",\"prompt\":[38,7,0,63],\"tag\":1000}",
        "{\"op\":\"step\",\"id\":\"s12\"}",
        "{\"op\":\"step\",\"id\":\"s12\",\"n\":3,\"tag\":1004}",
        "{\"op\":\"finish\",\"id\":\"s12\",\"tag\":\"t-1\"}",
        "{\"op\":\"generate\",\"tokens\":[1,2,3,0],\"steps\":3,\"use_cache\":true}",
        "{\"op\":\"generate\",\"tokens\":[5],\"steps\":0,\"use_cache\":false}",
        "{\"op\":\"logits\",\"tokens\":[0,1,9],\"model\":\"small\"}",
        "{\"op\":\"stats\"}",
        "{\"op\":\"stats\",\"tag\":-12}",
        "{\"op\":\"append\",\"id\":\"s12\",\"tokens\":[7,8,9]}",
        "{\"tokens\":[0],\"tag\":\"x\",\"id\":\"a\",\"op\":\"append\"}",
        "{\"op\":\"fork\",\"id\":\"b\",\"from\":\"a\"}",
        "{\"from\":\"Az09_.:-\",\"op\":\"fork\",\"id\":\"b\",\"tag\":2}",
        " \t{ \"op\" : \"step\" , \"id\" : \"a\" , \"n\" : 2 } \r",
        "{\"id\":\"Az09_.:-\",\"prompt\":[ -7 , 0 ],\"op\":\"start\"}",
    };
    static cJSON_Hooks counting = {cjson_counting_malloc, free};
    proto_request_t r;
    slotd_error_t e;

    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
        expect_paths(lines[i], TAKEN);

    proto_request_init(&r);
    cJSON_InitHooks(&counting);
    cjson_allocs = 0;
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
        ck_assert_int_eq(parse(lines[i], &r, &e), SLOTD_OK);
    ck_assert_int_eq(cjson_allocs, 0);
    /* A line the one-pass path declines still goes through cJSON. */
    ck_assert_int_eq(parse("{\"op\":\"step\",\"id\":\"a\",\"n\":2.0}", &r, &e), SLOTD_OK);
    ck_assert_int_gt(cjson_allocs, 0);
    ck_assert_uint_eq(r.n, 2);
    proto__json_hooks_install();
    proto_request_free(&r);
}
END_TEST

/* The edge cases: whichever path reads the line, the request, the error
 * code and the message are what the tree path gives. */
START_TEST(test_parse_paths_agree)
{
    static const struct {
        const char *line;
        int want;
    } cases[] = {
        /* Duplicates: the first counts, whatever the later ones hold. */
        {"{\"op\":\"step\",\"op\":\"start\"}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"op\":\"start\"}", TAKEN},
        {"{\"op\":\"stats\",\"op\":\"start\",\"op\":[{}]}", TAKEN},
        {"{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1],\"prompt\":\"x\"}", TAKEN},
        {"{\"op\":\"start\",\"id\":\"a\",\"prompt\":\"x\",\"prompt\":[1]}", DECLINED},
        {"{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1],\"tokens\":[2,3]}", TAKEN},
        {"{\"op\":\"logits\",\"prompt\":[1],\"tokens\":[2,3]}", TAKEN},
        {"{\"op\":\"step\",\"id\":\"a\",\"id\":\"b c\",\"n\":2,\"n\":0}", TAKEN},
        {"{\"op\":\"step\",\"id\":\"a\",\"n\":0,\"n\":2}", DECLINED},
        /* append: its tokens as a prompt's, on either path. */
        {"{\"op\":\"append\",\"id\":\"a\",\"tokens\":[1,2.0,3]}", DECLINED},
        {"{\"op\":\"append\",\"id\":\"a\",\"tokens\":[]}", DECLINED},
        {"{\"op\":\"append\",\"id\":\"a\",\"tokens\":[1,\"2\"]}", DECLINED},
        {"{\"op\":\"append\",\"id\":\"a\",\"tokens\":null}", DECLINED},
        {"{\"op\":\"append\",\"id\":\"a\"}", DECLINED},
        {"{\"op\":\"append\",\"tokens\":[1]}", DECLINED},
        {"{\"op\":\"append\",\"id\":\"a\",\"tokens\":[-1,99999]}", TAKEN},
        {"{\"op\":\"app\\u0065nd\",\"id\":\"a\",\"tokens\":[4]}", DECLINED},
        /* fork: `from` is an id. */
        {"{\"op\":\"fork\",\"id\":\"b\"}", DECLINED},
        {"{\"op\":\"fork\",\"id\":\"b\",\"from\":\"\"}", DECLINED},
        {"{\"op\":\"fork\",\"id\":\"b\",\"from\":\"a b\"}", DECLINED},
        {"{\"op\":\"fork\",\"id\":\"b\",\"from\":\"\\u0061\"}", DECLINED},
        {"{\"op\":\"fork\",\"id\":\"b\",\"from\":1}", DECLINED},
        {"{\"op\":\"stats\",\"tag\":1,\"tag\":\"x\"}", TAKEN},
        {"{\"op\":\"step\",\"id\":\"a\",\"id\":\"\\u0000\"}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"id\":\"\xff\"}", DECLINED},
        /* Unknown members: ignored, but read for their syntax and UTF-8. */
        {"{\"op\":\"step\",\"id\":\"a\",\"x\":[1,{\"y\":null,\"z\":[true,false,\"\\u00e9\"]}],"
         "\"Id\":\"b\",\"\":\"\",\"n \":7,\"\xc3\xa9\":{}}",
         TAKEN},
        {"{\"op\":\"step\",\"id\":\"a\",\"x\":[1,{\"y\":nul}]}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"x\":\"\xc3\"}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"\xed\xa0\x80\":1}", DECLINED},
        {"{\"op\":\"stats\",\"x\":1.5e3,\"y\":-0.0,\"z\":1e400,\"w\":123456789012345678}", TAKEN},
        {"{\"op\":\"stats\",\"id\":null,\"n\":\"x\",\"tokens\":[],\"steps\":{}}", TAKEN},
        {"{\"op\":\"finish\",\"id\":\"a\",\"model\":7,\"prompt\":[[1]],\"use_cache\":0}", TAKEN},
        /* Numbers: plain short integers are read here, the rest by the
         * tree path. */
        {"{\"op\":\"step\",\"id\":\"a\",\"n\":1.0}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"n\":1e2}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"n\":-0}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"n\":4294967295}", TAKEN},
        {"{\"op\":\"step\",\"id\":\"a\",\"n\":4294967296}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"n\":01}", DECLINED},
        {"{\"op\":\"start\",\"id\":\"a\",\"prompt\":[-0,0,-1,123456789012345,-123456789012345]}",
         TAKEN},
        {"{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1234567890123456]}", DECLINED},
        {"{\"op\":\"start\",\"id\":\"a\",\"prompt\":[9007199254740993]}", DECLINED},
        {"{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1,2.0,3]}", DECLINED},
        {"{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1,2,]}", DECLINED},
        {"{\"op\":\"start\",\"id\":\"a\",\"prompt\":[1 2]}", DECLINED},
        {"{\"op\":\"start\",\"id\":\"a\",\"prompt\":[]}", DECLINED},
        {"{\"op\":\"start\",\"id\":\"a\",\"prompt\":[-]}", DECLINED},
        {"{\"op\":\"generate\",\"tokens\":[1],\"steps\":-0}", TAKEN},
        {"{\"op\":\"generate\",\"tokens\":[1],\"steps\":-1}", DECLINED},
        {"{\"op\":\"generate\",\"tokens\":[1],\"steps\":2,\"use_cache\":null}", DECLINED},
        /* Escapes: read by the tree path wherever they could matter. */
        {"{\"op\":\"\\u0073tep\",\"id\":\"a\"}", DECLINED},
        {"{\"\\u006fp\":\"step\",\"id\":\"a\"}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"\\u0061\"}", DECLINED},
        {"{\"op\":\"stats\",\"tag\":\"a\\\"b\"}", DECLINED},
        {"{\"op\":\"stats\",\"x\":\"a\\\"b\\n\\ud83d\\ude00\"}", TAKEN},
        {"{\"op\":\"stats\",\"x\":\"\\ud800\"}", DECLINED},
        /* UTF-8 in known members. */
        {"{\"op\":\"stats\",\"tag\":\"\xc3\xa9\xf0\x9f\x98\x80\x7f\"}", TAKEN},
        {"{\"op\":\"stats\",\"tag\":\"\x7f~ \"}", TAKEN},
        {"{\"op\":\"stats\",\"tag\":\"\xc0\xaf\"}", DECLINED},
        {"{\"op\":\"st\xc3\xa9ts\"}", DECLINED},
        {"{\"op\":\"start\",\"id\":\"\xc3\xa9\",\"prompt\":[1]}", DECLINED},
        {"{\"op\":\"stats\",\"tag\":\"a\tb\"}", DECLINED},
        /* Tags: the echo text. */
        {"{\"op\":\"stats\",\"tag\":-0}", TAKEN},
        {"{\"op\":\"stats\",\"tag\":0}", TAKEN},
        {"{\"op\":\"stats\",\"tag\":123456789012345}", TAKEN},
        {"{\"op\":\"stats\",\"tag\":9007199254740992}", DECLINED},
        {"{\"op\":\"stats\",\"tag\":7.0}", DECLINED},
        {"{\"op\":\"stats\",\"tag\":\"\"}", TAKEN},
        {"{\"op\":\"stats\",\"tag\":null}", DECLINED},
        {"{\"op\":\"stats\",\"tag\":[1]}", DECLINED},
        {"{\"op\":\"bogus\",\"tag\":\"t\"}", DECLINED},
        /* Ids and models at their limits. */
        {"{\"op\":\"finish\",\"id\":\"0123456789012345678901234567890123456789012345678901234567"
         "890123\"}",
         TAKEN},
        {"{\"op\":\"finish\",\"id\":\"0123456789012345678901234567890123456789012345678901234567"
         "8901234\"}",
         DECLINED},
        {"{\"op\":\"logits\",\"tokens\":[1],\"model\":\"01234567890123456789012345678901\"}",
         TAKEN},
        {"{\"op\":\"logits\",\"tokens\":[1],\"model\":\"012345678901234567890123456789012\"}",
         DECLINED},
        {"{\"op\":\"finish\",\"id\":\"\"}", DECLINED},
        /* Member names the one-pass path finds with one load of 8 bytes,
         * and those it reads byte by byte: near the end of the line, longer,
         * or only like a known one. */
        {"{\"op\":\"step\",\"idd\":\"b\",\"i\":1,\"tags\":2,\"o\":3,\"id\":\"a\"}", TAKEN},
        {"{\"op\":\"generate\",\"use_cac\":1,\"tokens\":[1],\"token\":\"x\",\"steps\":1,"
         "\"use_cache\":true}",
         TAKEN},
        {"{\"op\":\"auth\",\"tokens\":[1],\"token\":\"s e\\\"c\"}", DECLINED},
        {"{\"op\":\"auth\",\"tokens\":[1],\"token\":\"s\xc3\xa9" "c\"}", TAKEN},
        {"{\"id\":\"a\",\"op\":\"step\",\"n\":1}", TAKEN},
        {"{\"id\":\"a\",\"op\":\"step\",\"n\":1", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a", DECLINED},
        {"{\"op\":\"step\",\"i\\u0064\":\"a\"}", DECLINED},
        /* Values read in the main loop, and those left to flat_value(). */
        {"{\"op\":\"stats\",\"tag\":\"ab\xc3\xa9\"}", TAKEN},
        {"{\"op\":\"stats\",\"tag\":\"ab\\n\"}", DECLINED},
        {"{\"op\":\"stats\",\"tag\":1234567890123456}", DECLINED},
        {"{\"op\":\"stats\",\"tag\":12e1}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"n\":2E0}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"n\":2 }", TAKEN},
        {"{\"op\":\"step\",\"id\":\"a\",\"n\":999999999999999}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"n\":-3}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"n\":\"3\"}", DECLINED},
        /* The line as a whole. */
        {"{}", DECLINED},
        {"{\"op\":\"stats\"} x", DECLINED},
        {"{\"op\":\"stats\"},", DECLINED},
        {"{\"op\":\"stats\",}", DECLINED},
        {"{\"op\":\"stats\"", DECLINED},
        {"{\"op\" \"stats\"}", DECLINED},
        {"[{\"op\":\"stats\"}]", DECLINED},
        {"\xef\xbb\xbf{\"op\":\"stats\"}", DECLINED},
        {"{\"op\":\"stats\"}\xc3", DECLINED},
        {"{\"op\":\"stats\",\"x\":\"\x01\"}", DECLINED},
        {"\f{\"op\":\"stats\"}", DECLINED},
    };
    char line[1024], *p;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        expect_paths(cases[i].line, cases[i].want);

    /* NUL bytes. */
    expect_paths_len("{\"op\":\"stats\"}\0", 15, DECLINED);
    expect_paths_len("{\"op\":\"st\0ats\"}", 15, DECLINED);
    expect_paths_len("{\"op\":\"stats\",\"tag\":\"a\0\"}", 25, DECLINED);
    expect_paths_len("{\"op\":\"stats\",\"x\":[\"\0\"]}", 24, DECLINED);
    expect_paths_len("{\"op\":\"stats\"}", 14, TAKEN);
    expect_paths_len("{\"op\":\"stats\"}x", 14, TAKEN);
    expect_paths_len("{\"op\":\"stats\",\"x\":1}", 19, DECLINED);

    /* Nesting in an unknown member: 127 levels under the line's object are
     * fine, 128 are not. */
    for (int depth = 127; depth <= 128; depth++) {
        p = line + sprintf(line, "{\"op\":\"stats\",\"x\":");
        for (int i = 0; i < depth; i++)
            *p++ = '[';
        for (int i = 0; i < depth; i++)
            *p++ = ']';
        strcpy(p, "}");
        expect_paths(line, depth == 127 ? TAKEN : DECLINED);
    }

    /* Every prefix of a line with every kind of member. */
    {
        static const char full[] = "{\"op\":\"generate\",\"tag\":\"t\xc3\xa9\",\"tokens\":[1,-2,3],"
                                   "\"steps\":4,\"use_cache\":true,\"model\":\"m\",\"x\":[{}]}";
        for (size_t n = 0; n < sizeof(full) - 1; n++)
            expect_paths_len(full, n, DECLINED);
        expect_paths_len(full, sizeof(full) - 1, TAKEN);
    }
}
END_TEST

/* The decoding controls: both paths read their values from the line's
 * text, exactly (a seed up to 2^64 - 1, a temperature of 0.7), and give
 * the same request or the same error naming the member. */
START_TEST(test_parse_decode_controls)
{
    static const struct {
        const char *line;
        int want;
    } cases[] = {
        {"{\"op\":\"step\",\"id\":\"a\",\"sample\":{\"temperature\":0.7,\"top_k\":40,"
         "\"top_p\":0.9,\"seed\":18446744073709551615},\"stop\":[0,5],\"scores\":3}",
         TAKEN},
        {"{\"op\":\"generate\",\"tokens\":[1],\"steps\":2,\"scores\":\"none\",\"stop\":[]}", TAKEN},
        {"{\"op\":\"step\",\"id\":\"a\",\"sample\":{},\"scores\":\"all\"}", TAKEN},
        {"{\"op\":\"step\",\"id\":\"a\",\"sample\":{\"seed\":1e3,\"top_k\":2.0,\"x\":[1]}}", TAKEN},
        {"{\"op\":\"step\",\"id\":\"a\",\"sample\":{\"seed\":1,\"seed\":-1},\"stop\":[1.0]}",
         TAKEN},
        {"{\"op\":\"step\",\"id\":\"a\",\"scores\":\"\\u006eone\"}", TAKEN},
        {"{\"op\":\"step\",\"id\":\"a\",\"sampl\\u0065\":{\"t\\u0065mperature\":2}}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"n\":1.0,\"sample\":{\"temperature\":0.25}}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"sample\":{\"temperature\":-1}}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"sample\":{\"seed\":18446744073709551616}}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"sample\":{\"top_p\":0}}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"sample\":{\"top_k\":0}}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"sample\":null}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"stop\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}",
         DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"stop\":[-1]}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"stop\":[\"1\"]}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"scores\":0}", DECLINED},
        {"{\"op\":\"step\",\"id\":\"a\",\"scores\":\"some\"}", DECLINED},
        /* Not members of other ops: ignored there. */
        {"{\"op\":\"finish\",\"id\":\"a\",\"sample\":null,\"scores\":0}", TAKEN},
    };
    proto_request_t r;
    slotd_error_t e;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        expect_paths(cases[i].line, cases[i].want);

    proto_request_init(&r);
    ck_assert_int_eq(parse(cases[0].line, &r, &e), SLOTD_OK);
    ck_assert(r.dec.set && r.dec.has_sample && r.dec.has_stop);
    ck_assert(r.dec.temperature == 0.7 && r.dec.top_p == 0.9);
    ck_assert_uint_eq(r.dec.top_k, 40);
    ck_assert(r.dec.seed == UINT64_MAX);
    ck_assert_uint_eq(r.dec.nstop, 2);
    ck_assert_uint_eq(r.dec.stop[1], 5);
    ck_assert_int_eq(r.dec.scores, PROTO_SCORES_TOP);
    ck_assert_uint_eq(r.dec.top, 3);
    ck_assert_int_eq(parse(cases[4].line, &r, &e), SLOTD_OK);
    ck_assert(r.dec.seed == 1 && r.dec.temperature == 1.0 && r.dec.top_k == UINT64_MAX);
    ck_assert_uint_eq(r.dec.stop[0], 1);
    /* A request without them is as before: nothing set. */
    ck_assert_int_eq(parse("{\"op\":\"step\",\"id\":\"a\"}", &r, &e), SLOTD_OK);
    ck_assert(!r.dec.set && r.dec.scores == PROTO_SCORES_ALL);
    ck_assert_int_eq(parse(cases[8].line, &r, &e), SLOTD_EBAD_REQUEST);
    ck_assert_str_eq(e.message, "step: `sample` temperature must be a number >= 0");
    proto_request_free(&r);
}
END_TEST

/* A start line with `n` prompt tokens and an unknown member; the caller
 * frees it. */
static char *plain_start(size_t n)
{
    char *line = malloc(64 + n * 8), *p = line;
    ck_assert_ptr_nonnull(line);
    p += sprintf(p, "{\"op\":\"start\",\"id\":\"big\",\"tag\":\"t\",\"prompt\":[");
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "%s%zu", i ? "," : "", (i * 7919) % 100003);
    strcpy(p, "],\"x\":1.5e0}");
    return line;
}

/* proto_request_free() puts back only what a parse can have stored: after
 * any line, by any path, and after a run of lines through one request, the
 * request is byte for byte as proto_request_init() leaves it. */
START_TEST(test_request_free_restores)
{
    static const char *const lines[] = {
        "{\"op\":\"start\",\"id\":\"abcdef\",\"model\":\"tiny\",\"prompt\":[1,2],\"tag\":\"t\"}",
        "{\"op\":\"start\",\"id\":\"abc!\",\"prompt\":[1]}",
        "{\"op\":\"start\",\"id\":\"abc\",\"model\":\"ti!ny\",\"prompt\":[1]}",
        "{\"op\":\"start\",\"id\":\"abc\",\"model\":\"tiny\",\"prompt\":[1,2.5]}",
        "{\"op\":\"step\",\"id\":\"s1\",\"n\":7,\"tag\":3}",
        "{\"op\":\"step\",\"id\":\"s1\",\"n\":0}",
        "{\"op\":\"finish\",\"id\":\"0123456789012345678901234567890123456789\"}",
        "{\"op\":\"generate\",\"tokens\":[1],\"steps\":5,\"use_cache\":true,\"model\":\"m\"}",
        "{\"op\":\"generate\",\"tokens\":[1],\"steps\":5,\"use_cache\":1}",
        "{\"op\":\"logits\",\"tokens\":[1,2],\"model\":\"m.1\"}",
        "{\"op\":\"auth\",\"token\":\"secret\"}",
        "{\"op\":\"auth\",\"token\":\"\"}",
        "{\"op\":\"stats\",\"tag\":\"x\"}",
        "{\"op\":\"bogus\",\"tag\":\"x\"}",
        "{\"op\":\"step\",\"id\":\"a\"} x",
    };
    int (*const paths[])(const char *, size_t, proto_request_t *, slotd_error_t *) = {
        proto_request_parse, proto__request_parse_tree, proto__request_parse_flat};
    proto_request_t blank, r, run;
    slotd_error_t e;

    proto_request_init(&blank);
    proto_request_init(&run);
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
        for (size_t p = 0; p < sizeof(paths) / sizeof(paths[0]); p++) {
            proto_request_init(&r);
            (void)paths[p](lines[i], strlen(lines[i]), &r, &e);
            proto_request_free(&r);
            if (memcmp(&r, &blank, sizeof(r)) != 0)
                ck_abort_msg("%s: path %zu: the freed request is not blank", lines[i], p);
        }
        (void)proto_request_parse(lines[i], strlen(lines[i]), &run, &e);
    }
    proto_request_free(&run);
    ck_assert(memcmp(&run, &blank, sizeof(run)) == 0);
}
END_TEST

/* Long prompts: more integers than the one-pass path keeps at hand. */
START_TEST(test_parse_flat_long)
{
    static const size_t sizes[] = {255, 256, 257, 512, 513, 5000};

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        char *line = plain_start(sizes[i]);
        proto_request_t r;
        slotd_error_t e;

        expect_paths(line, TAKEN);
        proto_request_init(&r);
        ck_assert_int_eq(parse(line, &r, &e), SLOTD_OK);
        ck_assert_uint_eq(r.ntokens, sizes[i]);
        ck_assert_int_eq(r.tokens[sizes[i] - 1], (int64_t)(((sizes[i] - 1) * 7919) % 100003));
        proto_request_free(&r);
        free(line);
    }
}
END_TEST

/* Allocations that fail: the one-pass path leaves behind exactly what the
 * tree path does at the same failure (both allocate the tag, then the
 * tokens), and a long prompt, whose integers outgrow the path's own array,
 * fails cleanly too. */
START_TEST(test_parse_flat_nomem)
{
    static const char *const lines[] = {
        "{\"op\":\"start\",\"id\":\"a\",\"model\":\"tiny\",\"tag\":\"t\",\"prompt\":[1,2,3]}",
        "{\"op\":\"logits\",\"tag\":5,\"model\":\"m\",\"tokens\":[4]}",
        "{\"op\":\"generate\",\"tokens\":[1,2],\"tag\":\"\xc3\xa9\\u00e9\",\"steps\":1}",
        "{\"op\":\"generate\",\"tokens\":[1,2],\"tag\":\"\xc3\xa9\",\"steps\":1,\"model\":\"m\"}",
        "{\"op\":\"step\",\"tag\":\"x\",\"id\":\"a\",\"n\":7}",
    };
    char *big = plain_start(3000);
    proto_request_t r, want;
    slotd_error_t e, want_e;
    long failures = 0;

    proto__json_hooks_install();
    proto_request_init(&r);
    proto_request_init(&want);
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
        bool done = false;
        for (long k = 0; !done; k++) {
            int rc, want_rc;
            memset(&e, 0, sizeof(e));
            memset(&want_e, 0, sizeof(want_e));
            alloc_count = 0;
            alloc_fail_at = k;
            proto__realloc = failing_realloc; /* cJSON's hooks stay proto/'s */
            rc = proto__request_parse_flat(lines[i], strlen(lines[i]), &r, &e);
            alloc_count = 0;
            want_rc = proto__request_parse_tree(lines[i], strlen(lines[i]), &want, &want_e);
            alloc_fail_at = -1;
            proto__realloc = realloc;
            if (rc == PROTO__DECLINED) {
                /* Only the tag with an escape is left to the tree path. */
                ck_assert_uint_eq(i, 2);
                done = true;
                continue;
            }
            ck_same(lines[i], rc, &r, &e, want_rc, &want, &want_e);
            if (rc == SLOTD_ENOMEM)
                failures++;
            done = rc == SLOTD_OK;
        }
    }
    ck_assert_int_ge(failures, 7);

    for (long k = 0;; k++) {
        int rc;
        alloc_count = 0;
        alloc_fail_at = k;
        proto__realloc = failing_realloc;
        rc = proto__request_parse_flat(big, strlen(big), &r, &e);
        alloc_fail_at = -1;
        proto__realloc = realloc;
        if (rc == SLOTD_OK)
            break;
        ck_assert(rc == SLOTD_ENOMEM || rc == PROTO__DECLINED);
        ck_assert_ptr_null(r.tokens);
    }
    ck_assert_uint_eq(r.ntokens, 3000);
    proto_request_free(&r);
    proto_request_free(&want);
    free(big);
}
END_TEST

/* ---- Replies ---- */

/* The line written at b->data + from: exactly one line, valid UTF-8 and
 * one JSON object.  Returns the parsed object. */
static cJSON *reply_json(const proto_buf_t *b, size_t from)
{
    const char *s = b->data + from;
    size_t n = b->len - from;
    cJSON *j;

    ck_assert_uint_gt(n, 1);
    ck_assert_int_eq(s[n - 1], '\n');
    ck_assert_ptr_eq(memchr(s, '\n', n), s + n - 1);
    ck_assert_uint_eq(proto__utf8_scan(s, n), n);
    j = cJSON_ParseWithLength(s, n);
    ck_assert_ptr_nonnull(j);
    ck_assert(cJSON_IsObject(j));
    return j;
}

static void ck_member_u64(const cJSON *o, const char *name, double v)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, name);
    if (m == NULL || !cJSON_IsNumber(m) || m->valuedouble != v)
        ck_abort_msg("member %s: want %.0f", name, v);
}

static void ck_member_str(const cJSON *o, const char *name, const char *v)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, name);
    if (m == NULL || !cJSON_IsString(m) || strcmp(m->valuestring, v) != 0)
        ck_abort_msg("member %s: want \"%s\"", name, v);
}

static int member_count(const cJSON *o)
{
    return cJSON_GetArraySize(o);
}

/* Member "tag" is `tag` (JSON text) parsed, or absent. */
static void ck_tag(const cJSON *o, const char *tag)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "tag");
    if (tag == NULL) {
        ck_assert_ptr_null(m);
    } else {
        cJSON *want = cJSON_Parse(tag);
        ck_assert_ptr_nonnull(want);
        ck_assert_ptr_nonnull(m);
        ck_assert(cJSON_Compare(m, want, 1));
        cJSON_Delete(want);
    }
}

/* An array of `n` numbers that print as "%.6f" of `v`. */
static void ck_row(const cJSON *row, const double *v, uint32_t n, const char *text)
{
    const cJSON *el;
    uint32_t i = 0;

    ck_assert(cJSON_IsArray(row));
    ck_assert_int_eq(cJSON_GetArraySize(row), (int)n);
    cJSON_ArrayForEach(el, row)
    {
        char want[PROTO__FMT6_MAX];
        if (!isfinite(v[i])) {
            ck_assert(cJSON_IsNull(el));
        } else {
            snprintf(want, sizeof(want), "%.6f", v[i]);
            ck_assert(cJSON_IsNumber(el));
            ck_assert(el->valuedouble == strtod(want, NULL));
            ck_assert_ptr_nonnull(strstr(text, want));
        }
        i++;
    }
}

static const char *const tags[] = {NULL, "7", "\"t\\\"\\n\xc3\xa9\""};

START_TEST(test_reply_start_finish)
{
    for (size_t t = 0; t < 3; t++) {
        proto_buf_t b;
        cJSON *j;
        size_t from;
        proto_buf_init(&b);
        ck_assert_int_eq(proto_buf_append(&b, "previous\n", 9), SLOTD_OK);
        from = b.len;
        ck_assert_int_eq(proto_reply_start(&b, tags[t], "a", "tiny", 3, 0), SLOTD_OK);
        ck_assert(memcmp(b.data, "previous\n", 9) == 0);
        if (tags[t] == NULL)
            ck_assert(memcmp(b.data + from, "{\"id\":\"a\",\"model\":\"tiny\",\"entries\":3,\"cached\":0}\n",
                             b.len - from) == 0);
        j = reply_json(&b, from);
        ck_tag(j, tags[t]);
        ck_member_str(j, "id", "a");
        ck_member_str(j, "model", "tiny");
        ck_member_u64(j, "entries", 3);
        ck_member_u64(j, "cached", 0);
        ck_assert_int_eq(member_count(j), 4 + (tags[t] != NULL));
        cJSON_Delete(j);

        from = b.len;
        ck_assert_int_eq(proto_reply_finish(&b, tags[t], "a", UINT32_MAX), SLOTD_OK);
        j = reply_json(&b, from);
        ck_tag(j, tags[t]);
        ck_member_str(j, "id", "a");
        ck_member_u64(j, "released", UINT32_MAX);
        ck_assert_int_eq(member_count(j), 2 + (tags[t] != NULL));
        cJSON_Delete(j);
        proto_buf_free(&b);
    }
    {
        proto_buf_t b;
        proto_buf_init(&b);
        ck_assert_int_eq(proto_reply_finish(&b, NULL, "a", 4), SLOTD_OK);
        ck_assert_uint_eq(b.len, strlen("{\"id\":\"a\",\"released\":4}\n"));
        ck_assert(memcmp(b.data, "{\"id\":\"a\",\"released\":4}\n", b.len) == 0);
        proto_buf_free(&b);
    }
}
END_TEST

START_TEST(test_reply_step)
{
    const uint32_t toks[] = {4, 0, UINT32_MAX};
    double logits[3 * 6];

    for (int i = 0; i < 18; i++)
        logits[i] = (i - 9) * 0.1234567 + (i == 3 ? -1e-9 : 0);
    logits[5] = -0.0;
    logits[7] = 12345678901.5;
    logits[8] = INFINITY;
    logits[9] = NAN;
    logits[10] = 1e-300;
    for (size_t t = 0; t < 3; t++) {
        for (uint32_t n = 1; n <= 3; n++) {
            proto_buf_t b;
            cJSON *j;
            const cJSON *rows, *row, *el;
            uint32_t i = 0;
            proto_buf_init(&b);
            /* With logits (attn). */
            ck_assert_int_eq(proto_reply_step(&b, tags[t], "s1", toks, n, logits, 6, 4 + n),
                             SLOTD_OK);
            j = reply_json(&b, 0);
            ck_tag(j, tags[t]);
            ck_member_str(j, "id", "s1");
            ck_member_u64(j, "entries", 4 + n);
            ck_assert_int_eq(member_count(j), 4 + (tags[t] != NULL));
            ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "tokens")), (int)n);
            cJSON_ArrayForEach(el, cJSON_GetObjectItem(j, "tokens"))
            {
                ck_assert(el->valuedouble == toks[i]);
                i++;
            }
            rows = cJSON_GetObjectItemCaseSensitive(j, "logits");
            ck_assert(cJSON_IsArray(rows));
            ck_assert_int_eq(cJSON_GetArraySize(rows), (int)n);
            i = 0;
            cJSON_ArrayForEach(row, rows)
            {
                ck_row(row, logits + 6 * i, 6, b.data);
                i++;
            }
            cJSON_Delete(j);
            /* Without (hash): no logits member at all. */
            b.len = 0;
            ck_assert_int_eq(proto_reply_step(&b, tags[t], "s1", toks, n, NULL, 6, 9), SLOTD_OK);
            j = reply_json(&b, 0);
            ck_assert_ptr_null(cJSON_GetObjectItem(j, "logits"));
            ck_assert_int_eq(member_count(j), 3 + (tags[t] != NULL));
            cJSON_Delete(j);
            proto_buf_free(&b);
        }
    }
    {
        proto_buf_t b;
        const double one[6] = {0.5, -0.25, 1, 0, -0.0, 2.0000005};
        const char *want = "{\"id\":\"a\",\"tokens\":[4],\"logits\":[[0.500000,-0.250000,1.000000,"
                           "0.000000,-0.000000,2.000001]],\"entries\":4}\n";
        proto_buf_init(&b);
        ck_assert_int_eq(proto_reply_step(&b, NULL, "a", toks, 1, one, 6, 4), SLOTD_OK);
        ck_assert_uint_eq(b.len, strlen(want));
        ck_assert(memcmp(b.data, want, b.len) == 0);
        b.len = 0;
        ck_assert_int_eq(proto_reply_step(&b, NULL, "a", toks, 1, NULL, 6, 4), SLOTD_OK);
        want = "{\"id\":\"a\",\"tokens\":[4],\"entries\":4}\n";
        ck_assert_uint_eq(b.len, strlen(want));
        ck_assert(memcmp(b.data, want, b.len) == 0);
        proto_buf_free(&b);
    }
}
END_TEST

START_TEST(test_reply_logits_generate)
{
    const uint32_t toks[] = {0, 1, 5, 2, 3};
    double logits[3 * 6];

    for (int i = 0; i < 18; i++)
        logits[i] = sin(i) * 3;
    for (size_t t = 0; t < 3; t++) {
        proto_buf_t b;
        cJSON *j;
        const cJSON *row;
        uint32_t i = 0;
        proto_buf_init(&b);
        ck_assert_int_eq(proto_reply_logits(&b, tags[t], logits, 6, 6), SLOTD_OK);
        j = reply_json(&b, 0);
        ck_tag(j, tags[t]);
        ck_row(cJSON_GetObjectItemCaseSensitive(j, "logits"), logits, 6, b.data);
        ck_member_u64(j, "rows", 6);
        ck_assert_int_eq(member_count(j), 2 + (tags[t] != NULL));
        cJSON_Delete(j);

        b.len = 0;
        ck_assert_int_eq(proto_reply_generate(&b, tags[t], toks, 5, logits, 3, 6, 8), SLOTD_OK);
        j = reply_json(&b, 0);
        ck_tag(j, tags[t]);
        ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "tokens")), 5);
        ck_assert(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "tokens"), 2)->valuedouble == 5);
        ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "logits")), 3);
        cJSON_ArrayForEach(row, cJSON_GetObjectItem(j, "logits"))
        {
            ck_row(row, logits + 6 * i, 6, b.data);
            i++;
        }
        ck_member_u64(j, "rows", 8);
        ck_assert_int_eq(member_count(j), 3 + (tags[t] != NULL));
        cJSON_Delete(j);

        /* Zero steps: no rows. */
        b.len = 0;
        ck_assert_int_eq(proto_reply_generate(&b, tags[t], toks, 2, NULL, 0, 6, 2), SLOTD_OK);
        j = reply_json(&b, 0);
        ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "tokens")), 2);
        ck_assert(cJSON_IsArray(cJSON_GetObjectItem(j, "logits")));
        ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "logits")), 0);
        cJSON_Delete(j);
        proto_buf_free(&b);
    }
}
END_TEST

START_TEST(test_reply_stats)
{
    proto_stats_t st;
    uint64_t *fields[] = {
        &st.cache_entries,       &st.live_sessions,    &st.g_calls,           &st.rows,
        &st.connections,         &st.requests_total,   &st.errors_total,      &st.pool_bytes_total,
        &st.pool_bytes_used,     &st.pool_slots_total, &st.pool_slots_used,   &st.released_finish,
        &st.released_disconnect, &st.released_idle,    &st.released_shutdown, &st.uptime_seconds};
    static const char *const names[] = {
        "cache_entries",   "live_sessions",    "g_calls",         "rows",
        "connections",     "requests_total",   "errors_total",    "pool_bytes_total",
        "pool_bytes_used", "pool_slots_total", "pool_slots_used",
    };
    static const char *const released[] = {"finish", "disconnect", "idle", "shutdown"};

    for (size_t t = 0; t < 3; t++) {
        proto_buf_t b;
        cJSON *j;
        const cJSON *rel;
        proto_buf_init(&b);
        for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
            *fields[i] = 1000 * (i + 1) + t; /* every member distinct */
        st.threads = 8;
        st.evicted_sessions = 3 + t;
        st.evictions_total = 30 + t;
        st.rebuilt_entries_total = 300 + t;
        st.prefix_entries = 51 + t;
        st.prefix_hit_entries = 52 + t;
        st.prefix_query_entries = 53 + t;
        st.prefix_evicted_entries = 54 + t;
        ck_assert_int_eq(proto_reply_stats(&b, tags[t], &st), SLOTD_OK);
        j = reply_json(&b, 0);
        ck_tag(j, tags[t]);
        for (size_t i = 0; i < 11; i++)
            ck_member_u64(j, names[i], (double)*fields[i]);
        rel = cJSON_GetObjectItemCaseSensitive(j, "released");
        ck_assert(cJSON_IsObject(rel));
        ck_assert_int_eq(member_count(rel), 4);
        for (size_t i = 0; i < 4; i++)
            ck_member_u64(rel, released[i], (double)*fields[11 + i]);
        ck_member_u64(j, "uptime_seconds", (double)st.uptime_seconds);
        ck_member_u64(j, "threads", 8);
        ck_member_u64(j, "evicted_sessions", (double)st.evicted_sessions);
        ck_member_u64(j, "evictions_total", (double)st.evictions_total);
        ck_member_u64(j, "rebuilt_entries_total", (double)st.rebuilt_entries_total);
        {
            cJSON *pc = cJSON_GetObjectItemCaseSensitive(j, "prefix_cache");
            ck_assert(cJSON_IsObject(pc));
            ck_assert_int_eq(member_count(pc), 4);
            ck_member_u64(pc, "entries", (double)st.prefix_entries);
            ck_member_u64(pc, "hit_entries", (double)st.prefix_hit_entries);
            ck_member_u64(pc, "query_entries", (double)st.prefix_query_entries);
            ck_member_u64(pc, "evicted_entries", (double)st.prefix_evicted_entries);
        }
        ck_assert_int_eq(member_count(j), 18 + (tags[t] != NULL));
        cJSON_Delete(j);
        proto_buf_free(&b);
    }
    {
        proto_buf_t b;
        memset(&st, 0, sizeof(st));
        st.cache_entries = UINT64_MAX;
        proto_buf_init(&b);
        ck_assert_int_eq(proto_reply_stats(&b, NULL, &st), SLOTD_OK);
        const char *want = "{\"cache_entries\":18446744073709551615,\"live_sessions\":0,";
        ck_assert(strncmp(b.data, want, strlen(want)) == 0);
        proto_buf_free(&b);
    }
}
END_TEST

START_TEST(test_reply_error)
{
    proto_buf_t b;
    slotd_error_t e;
    cJSON *j;
    const cJSON *err;
    char msg[300];

    proto_buf_init(&b);
    for (size_t t = 0; t < 3; t++) {
        b.len = 0;
        slotd_error_set(&e, SLOTD_EUNKNOWN_ID, "step: no live session '%s' on this connection",
                        "a");
        ck_assert_int_eq(proto_reply_error(&b, tags[t], &e), SLOTD_OK);
        if (tags[t] == NULL) {
            const char *want = "{\"error\":{\"code\":\"unknown_id\",\"message\":\"step: no live "
                               "session 'a' on this connection\"}}\n";
            ck_assert_uint_eq(b.len, strlen(want));
            ck_assert(memcmp(b.data, want, b.len) == 0);
        }
        j = reply_json(&b, 0);
        ck_tag(j, tags[t]);
        ck_assert_int_eq(member_count(j), 1 + (tags[t] != NULL));
        err = cJSON_GetObjectItemCaseSensitive(j, "error");
        ck_assert(cJSON_IsObject(err));
        ck_assert_int_eq(member_count(err), 2);
        ck_member_str(err, "code", "unknown_id");
        ck_member_str(err, "message", e.message);
        cJSON_Delete(j);
    }
    /* Every code goes out under its wire name. */
    for (int code = SLOTD_EBAD_JSON; code >= SLOTD_EINVAL; code--) {
        b.len = 0;
        slotd_error_set(&e, code, "m");
        ck_assert_int_eq(proto_reply_error(&b, NULL, &e), SLOTD_OK);
        j = reply_json(&b, 0);
        ck_member_str(cJSON_GetObjectItem(j, "error"), "code", slotd_err_name(code));
        cJSON_Delete(j);
    }
    /* Quotes, backslashes, every control character, DEL, and bytes that are
     * not UTF-8 (which become U+FFFD). */
    for (int c = 1; c < 256; c++) {
        b.len = 0;
        snprintf(msg, sizeof(msg), "x%cy\"z\\", c);
        slotd_error_set(&e, SLOTD_EBAD_REQUEST, "%s", msg);
        ck_assert_int_eq(proto_reply_error(&b, NULL, &e), SLOTD_OK);
        j = reply_json(&b, 0);
        err = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message");
        ck_assert(cJSON_IsString(err));
        if (c < 0x80)
            ck_assert_str_eq(err->valuestring, msg);
        else
            ck_assert_str_eq(err->valuestring, "x\xef\xbf\xbdy\"z\\");
        cJSON_Delete(j);
    }
    /* A message cut inside a UTF-8 sequence, and a full-length message. */
    memset(e.message, 'a', sizeof(e.message));
    memcpy(e.message + sizeof(e.message) - 3, "\xe2\x82", 2);
    e.message[sizeof(e.message) - 1] = '\0';
    b.len = 0;
    ck_assert_int_eq(proto_reply_error(&b, NULL, &e), SLOTD_OK);
    cJSON_Delete(reply_json(&b, 0));
    memset(e.message, 'b', sizeof(e.message)); /* no NUL at all */
    b.len = 0;
    ck_assert_int_eq(proto_reply_error(&b, NULL, &e), SLOTD_OK);
    j = reply_json(&b, 0);
    err = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message");
    ck_assert_uint_eq(strlen(err->valuestring), sizeof(e.message));
    cJSON_Delete(j);
    proto_buf_free(&b);
}
END_TEST

START_TEST(test_reply_strings)
{
    proto_buf_t b;
    cJSON *j;

    /* Ids and model names are validated, but a writer escapes them anyway. */
    proto_buf_init(&b);
    ck_assert_int_eq(proto_reply_start(&b, NULL, "a\"b\n\xff", "m\\", 1, 0), SLOTD_OK);
    j = reply_json(&b, 0);
    ck_member_str(j, "id", "a\"b\n\xef\xbf\xbd");
    ck_member_str(j, "model", "m\\");
    cJSON_Delete(j);
    b.len = 0;
    ck_assert_int_eq(proto__put_json_string(&b, "\x01\x1f\x7f\b\f\r\t", 7), SLOTD_OK);
    ck_assert_uint_eq(b.len, strlen("\"\\u0001\\u001f\x7f\\b\\f\\r\\t\""));
    ck_assert(memcmp(b.data, "\"\\u0001\\u001f\x7f\\b\\f\\r\\t\"", b.len) == 0);
    b.len = 0;
    /* A truncated sequence at the very end of the input. */
    ck_assert_int_eq(proto__put_json_string(&b, "\xf0\x9f\x98", 3), SLOTD_OK);
    ck_assert(memcmp(b.data, "\"\\ufffd\\ufffd\\ufffd\"", b.len) == 0);
    proto_buf_free(&b);
}
END_TEST

/* Large values go through snprintf(), whose decimal point is the locale's;
 * the reply keeps JSON's.  (Skipped where no such locale is installed.) */
START_TEST(test_reply_locale)
{
    static const char *const locales[] = {"de_DE.UTF-8", "fr_FR.UTF-8", "ps_AF.UTF-8"};
    const double v[2] = {12345678901.25, -0.5};
    const char *want = "{\"logits\":[12345678901.250000,-0.500000],\"rows\":1}\n";

    for (size_t i = 0; i < sizeof(locales) / sizeof(locales[0]); i++) {
        proto_buf_t b;
        if (setlocale(LC_NUMERIC, locales[i]) == NULL)
            continue;
        proto_buf_init(&b);
        ck_assert_int_eq(proto_reply_logits(&b, NULL, v, 2, 1), SLOTD_OK);
        setlocale(LC_NUMERIC, "C");
        ck_assert_uint_eq(b.len, strlen(want));
        ck_assert(memcmp(b.data, want, b.len) == 0);
        proto_buf_free(&b);
    }
}
END_TEST

/* The replies under decoding controls: the scores left out, the top
 * pairs in the order given, `stopped`; without controls, the plain ones. */
START_TEST(test_reply_picks)
{
    const double logits[2 * 3] = {0.5, -1.25, 2.0, 0.0, 1e-7, -0.0000004};
    const uint32_t toks[] = {7, 2, 1}, top[] = {2, 0, 1, 0};
    const proto_picks_t top2 = {.scores = PROTO_SCORES_TOP,
                                .k = 2,
                                .top = top,
                                .has_stop = true,
                                .stopped = true},
                        none = {.scores = PROTO_SCORES_NONE, .has_stop = true},
                        all = {.scores = PROTO_SCORES_ALL};
    proto_buf_t b, plain;

    proto_buf_init(&b);
    proto_buf_init(&plain);
    ck_assert_int_eq(proto_reply_step_picks(&b, "3", "a", toks + 1, 2, logits, 3, 9, &top2),
                     SLOTD_OK);
    ck_assert_int_eq(proto_reply_step_picks(&b, NULL, "a", toks + 1, 2, logits, 3, 9, &none),
                     SLOTD_OK);
    ck_assert_int_eq(proto_reply_generate_picks(&b, NULL, toks, 3, logits, 2, 3, 4, &none),
                     SLOTD_OK);
    ck_assert_int_eq(proto_reply_step_picks(&b, NULL, "h", toks, 1, NULL, 3, 9, &top2), SLOTD_OK);
    ck_assert_int_eq(proto_buf_append(&b, "", 1), SLOTD_OK);
    ck_assert_str_eq(
        b.data, "{\"tag\":3,\"id\":\"a\",\"tokens\":[2,1],\"top\":[[[2,2.000000],[0,0.500000]],"
                "[[1,0.000000],[0,0.000000]]],\"stopped\":true,\"entries\":9}\n"
                "{\"id\":\"a\",\"tokens\":[2,1],\"stopped\":false,\"entries\":9}\n"
                "{\"tokens\":[7,2,1],\"stopped\":false,\"rows\":4}\n"
                "{\"id\":\"h\",\"tokens\":[7],\"stopped\":true,\"entries\":9}\n");
    /* scores all and no stop: byte for byte the plain writers. */
    b.len = 0;
    ck_assert_int_eq(proto_reply_step_picks(&b, "1", "a", toks, 2, logits, 3, 5, &all), SLOTD_OK);
    ck_assert_int_eq(proto_reply_generate_picks(&b, NULL, toks, 3, logits, 2, 3, 4, &all),
                     SLOTD_OK);
    ck_assert_int_eq(proto_reply_step(&plain, "1", "a", toks, 2, logits, 3, 5), SLOTD_OK);
    ck_assert_int_eq(proto_reply_generate(&plain, NULL, toks, 3, logits, 2, 3, 4), SLOTD_OK);
    ck_assert_uint_eq(b.len, plain.len);
    ck_assert(memcmp(b.data, plain.data, b.len) == 0);
    proto_buf_free(&b);
    proto_buf_free(&plain);
}
END_TEST

/* Out of memory anywhere in a writer leaves the buffer as it was. */
START_TEST(test_reply_nomem)
{
    double logits[2 * 6] = {0};
    const uint32_t toks[] = {1, 2, 3};
    proto_stats_t st = {0};
    slotd_error_t e;
    const uint32_t top[] = {5, 0, 1, 2};
    const proto_picks_t pk_top = {.scores = PROTO_SCORES_TOP,
                                  .k = 2,
                                  .top = top,
                                  .has_stop = true,
                                  .stopped = true},
                        pk_none = {.scores = PROTO_SCORES_NONE, .has_stop = true};

    slotd_error_set(&e, SLOTD_EBAD_REQUEST, "start: `prompt` must be a non-empty array");
    for (int kind = 0; kind < 9; kind++) {
        for (size_t prefill = 0; prefill < 600; prefill += 37) {
            proto_buf_t b;
            int rc;
            proto_buf_init(&b);
            for (size_t i = 0; i < prefill; i++)
                ck_assert_int_eq(proto_buf_append(&b, "p", 1), SLOTD_OK);
            alloc_fail_from(0);
            switch (kind) {
            case 0:
                rc = proto_reply_error(&b, "\"tag\"", &e);
                break;
            case 1:
                rc = proto_reply_start(&b, "1", "id", "tiny", 3, 0);
                break;
            case 2:
                rc = proto_reply_step(&b, "1", "id", toks, 2, logits, 6, 9);
                break;
            case 3:
                rc = proto_reply_finish(&b, "1", "id", 9);
                break;
            case 4:
                rc = proto_reply_logits(&b, "1", logits, 6, 6);
                break;
            case 5:
                rc = proto_reply_generate(&b, "1", toks, 3, logits, 2, 6, 9);
                break;
            case 6:
                rc = proto_reply_step_picks(&b, "1", "id", toks, 2, logits, 6, 9, &pk_top);
                break;
            case 7:
                rc = proto_reply_generate_picks(&b, "1", toks, 3, logits, 2, 6, 9, &pk_none);
                break;
            default:
                rc = proto_reply_stats(&b, "1", &st);
                break;
            }
            alloc_restore();
            if (rc == SLOTD_ENOMEM)
                ck_assert_uint_eq(b.len, prefill);
            else
                cJSON_Delete(reply_json(&b, prefill));
            proto_buf_free(&b);
        }
    }
}
END_TEST

/* ---- proto__fmt6() against snprintf("%.6f") ---- */

static long fmt6_checked;

static void ck_fmt6(double v)
{
    char got[PROTO__FMT6_MAX], want[PROTO__FMT6_MAX];
    size_t n = proto__fmt6(got, v);
    int k = snprintf(want, sizeof(want), "%.6f", v);

    fmt6_checked++;
    if ((size_t)k != n || strcmp(got, want) != 0)
        ck_abort_msg("%a: got %s, want %s", v, got, want);
}

static void ck_fmt6_around(double v)
{
    ck_fmt6(v);
    ck_fmt6(-v);
    ck_fmt6(nextafter(v, INFINITY));
    ck_fmt6(nextafter(v, -INFINITY));
    ck_fmt6(-nextafter(v, INFINITY));
    ck_fmt6(-nextafter(v, -INFINITY));
}

START_TEST(test_fmt6)
{
    const int scale = UNDER_VALGRIND() ? 10 : 1;
    static const double special[] = {0.0,
                                     -0.0,
                                     1e-9,
                                     -1e-9,
                                     4e-7,
                                     -4e-7,
                                     4.999999e-7,
                                     -4.999999e-7,
                                     5e-7,
                                     -5e-7,
                                     5.000001e-7,
                                     -5.000001e-7,
                                     1e-6,
                                     -1e-6,
                                     1.5e-6,
                                     2.5e-6,
                                     0.5,
                                     0.0000005,
                                     0.0000015,
                                     0.0000025,
                                     0.1234565,
                                     2.0000005,
                                     999999999.9999995,
                                     999999999.9999994,
                                     999999999.999999,
                                     1e9,
                                     -1e9,
                                     1e15,
                                     1e300,
                                     DBL_MAX,
                                     -DBL_MAX,
                                     DBL_MIN,
                                     -DBL_MIN,
                                     DBL_TRUE_MIN,
                                     -DBL_TRUE_MIN,
                                     INFINITY,
                                     -INFINITY,
                                     NAN,
                                     -NAN};

    fmt6_checked = 0;
    for (size_t i = 0; i < sizeof(special) / sizeof(special[0]); i++)
        ck_fmt6_around(special[i]);
    ck_fmt6(nextafter(1e9, 0));

    /* Exact halfway cases: m / 128 for odd m has seven decimals ending in 5;
     * glibc rounds those to even. */
    for (int64_t m = 1; m < 200000 / scale; m += 2)
        ck_fmt6_around((double)m / 128);
    for (int64_t m = 1; m < 2000; m += 2)
        ck_fmt6_around((double)(m + (int64_t)1e8 * 128) / 128);

    /* Values already rounded to six decimals (the model's output), and
     * their halfway points, with neighbours. */
    for (int i = 0; i < 200000 / scale; i++) {
        int64_t k = (int64_t)(rng_next() % 2000000001) - 1000000000;
        int range = (int)(rng_next() % 4);
        if (range == 1)
            k %= 10000000;
        else if (range == 2)
            k %= 1000;
        ck_fmt6_around((double)k / 1e6);
        ck_fmt6_around(((double)k + 0.5) / 1e6);
    }

    /* Random values at every magnitude from 1e-8 to 1e10. */
    for (int i = 0; i < 300000 / scale; i++) {
        double v = (rng_unit() * 2 - 1) * pow(10, (int)(rng_next() % 19) - 8);
        ck_fmt6(v);
    }

    /* Random bit patterns: every double, most of them huge or tiny. */
    for (int i = 0; i < 100000 / scale; i++) {
        uint64_t bits = rng_next();
        double v;
        memcpy(&v, &bits, sizeof(v));
        ck_fmt6(v);
    }
    /* Random bit patterns in the fast range. */
    for (int i = 0; i < 300000 / scale; i++) {
        uint64_t bits = rng_next();
        double v;
        /* Exponents from 2^-30 to 2^29. */
        bits = (bits & UINT64_C(0x800FFFFFFFFFFFFF)) |
               ((uint64_t)(1023 - 30 + (int)(rng_next() % 60)) << 52);
        memcpy(&v, &bits, sizeof(v));
        ck_fmt6(v);
    }
    ck_assert_int_gt(fmt6_checked, 3000000 / scale);
}
END_TEST

static Suite *proto_suite(void)
{
    Suite *s = suite_create("proto");
    TCase *tc;

    tc = tcase_create("framer");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_framer_one_line_per_feed);
    tcase_add_test(tc, test_framer_many_lines_per_feed);
    tcase_add_test(tc, test_framer_every_split);
    tcase_add_test(tc, test_framer_byte_by_byte);
    tcase_add_test(tc, test_framer_crlf_and_blank);
    tcase_add_test(tc, test_framer_exact_limit);
    tcase_add_loop_test(tc, test_framer_too_long, 0,
                        (int)(sizeof(too_long_cases) / sizeof(too_long_cases[0])));
    tcase_add_test(tc, test_framer_too_long_every_split);
    tcase_add_test(tc, test_framer_callback_stops);
    tcase_add_test(tc, test_framer_raise_limit);
    tcase_add_test(tc, test_framer_nomem);
    tcase_add_test(tc, test_buf);
    suite_add_tcase(s, tc);

    tc = tcase_create("request");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_parse_ops);
    tcase_add_test(tc, test_op_table);
    tcase_add_test(tc, test_parse_bad_json);
    tcase_add_test(tc, test_parse_nul_and_utf8);
    tcase_add_test(tc, test_utf8_exhaustive);
    tcase_add_test(tc, test_parse_deep_and_huge);
    tcase_add_test(tc, test_parse_unknown_op);
    tcase_add_test(tc, test_parse_bad_request);
    tcase_add_test(tc, test_parse_precedence);
    tcase_add_test(tc, test_parse_integers);
    tcase_add_test(tc, test_parse_members);
    tcase_add_test(tc, test_parse_tag);
    tcase_add_test(tc, test_parse_nomem);
    tcase_add_test(tc, test_parse_arena_no_alloc);
    tcase_add_test(tc, test_parse_arena_chunks);
    tcase_add_test(tc, test_parse_arena_nomem);
    tcase_add_test(tc, test_parse_arena_other_cjson);
    tcase_add_test(tc, test_parse_flat_common);
    tcase_add_test(tc, test_parse_paths_agree);
    tcase_add_test(tc, test_parse_decode_controls);
    tcase_add_test(tc, test_parse_flat_long);
    tcase_add_test(tc, test_request_free_restores);
    tcase_add_test(tc, test_parse_flat_nomem);
    suite_add_tcase(s, tc);

    tc = tcase_create("reply");
    tcase_set_timeout(tc, 100);
    tcase_add_test(tc, test_reply_start_finish);
    tcase_add_test(tc, test_reply_step);
    tcase_add_test(tc, test_reply_logits_generate);
    tcase_add_test(tc, test_reply_stats);
    tcase_add_test(tc, test_reply_error);
    tcase_add_test(tc, test_reply_strings);
    tcase_add_test(tc, test_reply_locale);
    tcase_add_test(tc, test_reply_nomem);
    tcase_add_test(tc, test_reply_picks);
    tcase_add_test(tc, test_fmt6);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(proto_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
