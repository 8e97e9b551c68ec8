/*
 * test_integration_malformed.c: malformed input sent to the live daemon.
 *
 * Each malformed line goes to the daemon followed by a stats request on the
 * same connection, so every case proves two things: the line got exactly
 * the error docs/protocol.md gives it, and the daemon still answers.  The
 * battery: text that is not JSON, JSON that is not an object, NUL bytes,
 * invalid UTF-8 of several kinds (and valid UTF-8, split across writes,
 * which must pass), wrong types and huge numbers, deep nesting, random
 * binary, a line split into single bytes, blank lines (no reply at all),
 * "\r\n" endings, and lines over the limit with and without a newline
 * (line_too_long, then the connection is closed, while others serve on).
 * A session lives beside the battery and is checked against the uncached
 * reference at the end: no malformed line may touch it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "itest.h"

typedef struct mal_case {
    const char *bytes;
    size_t len; /* 0: strlen(bytes) */
    const char *code;
    const char *word; /* in the message, or NULL */
} mal_case_t;

#define B(s) s, sizeof(s) - 1

static const mal_case_t battery[] = {
    /* Not JSON at all. */
    {B("not json"), "bad_json", NULL},
    {B("{"), "bad_json", NULL},
    {B("}"), "bad_json", NULL},
    {B("{\"op\":\"stats\""), "bad_json", NULL},
    {B("{\"op\":\"stats\"}}"), "bad_json", NULL},
    {B("{\"op\":\"stats\"} {\"op\":\"stats\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\"}{\"op\":\"stats\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\"}x"), "bad_json", NULL},
    {B("{\"op\":\"stats\"},"), "bad_json", NULL},
    {B("{'op':'stats'}"), "bad_json", NULL},
    {B("{op:\"stats\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":NaN}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":Infinity}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":-Infinity}"), "bad_json", NULL},
    {B("{\"op\":\"stats\"} // comment"), "bad_json", NULL},
    {B("/* c */ {\"op\":\"stats\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":[1,2}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":\"unterminated}"), "bad_json", NULL},
    {B("{\"op\" \"stats\"}"), "bad_json", NULL},
    {B("{\"op\"::\"stats\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":tru}"), "bad_json", NULL},
    {B("GET / HTTP/1.1"), "bad_json", NULL},
    /* JSON, but not an object. */
    {B("[]"), "bad_json", NULL},
    {B("[{\"op\":\"stats\"}]"), "bad_json", NULL},
    {B("\"stats\""), "bad_json", NULL},
    {B("\"{\\\"op\\\":\\\"stats\\\"}\""), "bad_json", NULL},
    {B("42"), "bad_json", NULL},
    {B("-1.5e3"), "bad_json", NULL},
    {B("true"), "bad_json", NULL},
    {B("false"), "bad_json", NULL},
    {B("null"), "bad_json", NULL},
    /* NUL bytes. */
    {B("\0"), "bad_json", NULL},
    {B("{\"op\":\"stats\"}\0"), "bad_json", NULL},
    {B("\0{\"op\":\"stats\"}"), "bad_json", NULL},
    {B("{\"op\":\"st\0ats\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":\"a\0b\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\"\0}"), "bad_json", NULL},
    {B("{\"op\":\"start\",\"id\":\"n\0\",\"prompt\":[1]}"), "bad_json", NULL},
    /* Invalid UTF-8, in an ignored member, in a key, in the op, in an id. */
    {B("{\"op\":\"stats\",\"x\":\"\x80\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":\"\xbf\xbf\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":\"\xc0\xaf\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":\"\xc1\xbf\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":\"\xe0\x80\xaf\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":\"\xf0\x80\x80\xaf\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":\"\xe2\x82\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":\"\xe2\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":\"\xf0\x9d\x84\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":\"\xed\xa0\x80\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":\"\xed\xbf\xbf\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":\"\xf4\x90\x80\x80\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":\"\xf5\x80\x80\x80\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":\"\xf8\x88\x80\x80\x80\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":\"\xfe\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":\"\xff\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"x\":\"\xc3\x28\"}"), "bad_json", NULL},
    {B("{\"op\":\"stats\",\"\x80\":1}"), "bad_json", NULL},
    {B("{\"op\":\"stats\x80\"}"), "bad_json", NULL},
    {B("{\"op\":\"nope\xff\"}"), "bad_json", NULL},
    {B("{\"op\":\"start\",\"id\":\"a\xc3\",\"prompt\":[1]}"), "bad_json", NULL},
    {B("{\"op\":\"stats\"}\xff"), "bad_json", NULL},
    {B("\xef\xbb"), "bad_json", NULL},
    /* Valid JSON objects with wrong types: bad_request naming the field. */
    {B("{\"op\":\"start\",\"id\":\"m\",\"prompt\":[1,\"2\"]}"), "bad_request", "prompt"},
    {B("{\"op\":\"start\",\"id\":\"m\",\"prompt\":[1,-2]}"), "bad_request", "prompt"},
    {B("{\"op\":\"start\",\"id\":\"m\",\"prompt\":[0.5]}"), "bad_request", "prompt"},
    {B("{\"op\":\"start\",\"id\":\"m\",\"prompt\":[1e400]}"), "bad_request", "prompt"},
    {B("{\"op\":\"start\",\"id\":\"m\",\"prompt\":[1e20]}"), "bad_request", "prompt"},
    {B("{\"op\":\"start\",\"id\":\"m\",\"prompt\":[9007199254740993]}"), "bad_request", "prompt"},
    {B("{\"op\":\"start\",\"id\":\"m\",\"prompt\":null}"), "bad_request", "prompt"},
    {B("{\"op\":\"step\",\"id\":\"s\",\"n\":null}"), "bad_request", "n"},
    {B("{\"op\":\"step\",\"id\":\"s\",\"n\":-0.5}"), "bad_request", "n"},
    {B("{\"op\":\"step\",\"id\":\"s\",\"n\":1e400}"), "bad_request", "n"},
    {B("{\"op\":\"generate\",\"tokens\":[1],\"steps\":null}"), "bad_request", "steps"},
    {B("{\"op\":\"generate\",\"tokens\":[1],\"steps\":1,\"use_cache\":\"yes\"}"), "bad_request",
     "use_cache"},
    {B("{\"op\":\"logits\",\"tokens\":[1,[2]]}"), "bad_request", "tokens"},
    {B("{\"op\":\"start\",\"id\":"
       "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
       "xxxxxxxxxxxxxxxxxxx\",\"prompt\":[1]}"),
     "bad_request", "id"},
    {B("{\"op\":\"start\",\"id\":\"<script>\",\"prompt\":[1]}"), "bad_request", "id"},
    {B("{\"op\":\"start\",\"id\":\"a\\\"b\",\"prompt\":[1]}"), "bad_request", "id"},
    /* An escaped NUL anywhere is bad_json (docs/protocol.md): ids and names
     * are C strings, and a NUL would silently cut them short. */
    {B("{\"op\":\"start\",\"id\":\"a\\u0000b\",\"prompt\":[1]}"), "bad_json", NULL},
    {B("{\"op\":\"start\",\"id\":\"s\\u0000\",\"prompt\":[1]}"), "bad_json", NULL},
    {B("{\"op\":\"stats\\u0000\"}"), "bad_json", NULL},
    {B("{\"op\":\"start\",\"id\":\"m\",\"model\":7,\"prompt\":[1]}"), "bad_request", "model"},
    {B("{\"op\":\"stats\",\"tag\":1.25}"), "bad_request", "tag"},
    {B("{\"op\":\"stats\",\"tag\":[\"x\"]}"), "bad_request", "tag"},
    {B("{\"op\":\"stats\",\"tag\":{\"x\":1}}"), "bad_request", "tag"},
    {B("{\"op\":\"stats\",\"tag\":null}"), "bad_request", "tag"},
    {B("{\"op\":\"stats\",\"tag\":false}"), "bad_request", "tag"},
    /* No op, or not a string. */
    {B("{\"op\":null}"), "unknown_op", "op"},
    {B("{\"op\":[]}"), "unknown_op", "op"},
    {B("{\"id\":\"a\"}"), "unknown_op", "op"},
};

/* Sends the case, a newline and a tagged stats request; checks the error,
 * then that the stats request is answered. */
static void probe(itest_conn_t *c, const char *bytes, size_t len, const char *code,
                  const char *word, int i)
{
    ck_assert(itest_send(c, bytes, len));
    ck_assert(itest_sendf(c, "\n{\"op\":\"stats\",\"tag\":\"after%d\"}\n", i));
    cJSON *r = itest_read_reply(c);
    char why[800], shown[200];
    if (!itest_error_is(r, NULL, code, why, sizeof(why), word, NULL)) {
        size_t k = 0;
        for (size_t j = 0; j < len && k + 5 < sizeof(shown); j++) {
            unsigned char ch = (unsigned char)bytes[j];
            k += (size_t)(ch >= 0x20 && ch < 0x7f
                              ? snprintf(shown + k, sizeof(shown) - k, "%c", ch)
                              : snprintf(shown + k, sizeof(shown) - k, "\\x%02x", ch));
        }
        itest_soft_fail("case %d, line \"%s\": %s", i, shown, why);
    }
    cJSON_Delete(r);
    r = itest_read_reply(c);
    char tag[32];
    snprintf(tag, sizeof(tag), "\"after%d\"", i);
    itest_check_stats_shape(r);
    itest_expect_tag(r, tag);
    cJSON_Delete(r);
}

START_TEST(test_battery)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    int64_t p[] = {1, 5};
    itest_session_t s;
    itest_session_init(&s, "s", "tiny", p, 2);
    itest_session_start(c, &s);
    itest_session_step(c, &s, 1);
    int64_t err0 = itest_stat(c, "errors_total");
    int n = (int)(sizeof(battery) / sizeof(battery[0]));
    for (int i = 0; i < n; i++) {
        probe(c, battery[i].bytes, battery[i].len, battery[i].code, battery[i].word, i);
    }
    cJSON *st = itest_stats(c);
    ck_assert_int_eq(itest_int(st, "errors_total") - err0, n);
    ck_assert_int_eq(itest_int(st, "live_sessions"), 1);
    ck_assert_int_eq(itest_int(st, "cache_entries"), 3);
    cJSON_Delete(st);
    itest_session_step(c, &s, 3);
    itest_session_finish(c, &s);
    itest_session_free(&s);
    itest_close(c);
}
END_TEST

START_TEST(test_strict_json_grammar)
{
    /* Lines a lenient parser may take but RFC 8259 does not: still "not
     * one JSON object", so bad_json. */
    static const mal_case_t strict[] = {
        {B("{\"op\":\"stats\",\"x\":01}"), "bad_json", NULL},
        {B("{\"op\":\"stats\",\"x\":-}"), "bad_json", NULL},
        {B("{\"op\":\"stats\",\"x\":1.}"), "bad_json", NULL},
        {B("{\"op\":\"stats\",\"x\":.5}"), "bad_json", NULL},
        {B("{\"op\":\"stats\",\"x\":+1}"), "bad_json", NULL},
        {B("{\"op\":\"stats\",\"x\":0x10}"), "bad_json", NULL},
        {B("{\"op\":\"stats\",\"x\":1e}"), "bad_json", NULL},
        {B("{\"op\":\"stats\",\"x\":[1,]}"), "bad_json", NULL},
        {B("{\"op\":\"stats\",\"x\":[1 2]}"), "bad_json", NULL},
        {B("{\"op\":\"stats\",\"x\":\"\\x41\"}"), "bad_json", NULL},
        {B("{\"op\":\"stats\",\"x\":\"\\u12\"}"), "bad_json", NULL},
        {B("{\"op\":\"stats\",\"x\":\"a\tb\"}"), "bad_json", NULL},
        {B("{\"op\":\"stats\",\"x\":\"a\x01"
           "b\"}"),
         "bad_json", NULL},
        {B("{\"op\":\"stats\",\"x\":TRUE}"), "bad_json", NULL},
        {B("{\"op\":\"stats\",\"x\":nul}"), "bad_json", NULL},
        {B("{\"op\":\"stats\"}\x0b"), "bad_json", NULL},
        {B("\x0c{\"op\":\"stats\"}"), "bad_json", NULL},
    };
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    int n = (int)(sizeof(strict) / sizeof(strict[0]));
    for (int i = 0; i < n; i++) {
        probe(c, strict[i].bytes, strict[i].len, strict[i].code, strict[i].word, 1000 + i);
    }
    itest_close(c);
}
END_TEST

START_TEST(test_valid_utf8_and_escapes)
{
    /* Valid UTF-8 anywhere a string may be, also split across writes in
     * the middle of a character, is not an error. */
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    cJSON *r = itest_rpc(c, "{\"op\":\"stats\",\"x\":\"h\xc3\xa9llo \xe2\x82\xac \xf0\x9d\x84\x9e "
                            "\xef\xbf\xbf \xf4\x8f\xbf\xbf\",\"\xe2\x98\x83\":1}");
    itest_check_stats_shape(r);
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"stats\",\"x\":\"\\u00e9\\ud834\\udd1e\\n\\t\\\\\\\"\\/\"}");
    itest_check_stats_shape(r);
    cJSON_Delete(r);
    r = itest_rpc(c, "{ \"op\" : \"stats\" , \"tag\" : \"sp\" }");
    itest_check_stats_shape(r);
    itest_expect_tag(r, "\"sp\"");
    cJSON_Delete(r);
    r = itest_rpc(c, "\t{\"op\":\"stats\"\r}\t ");
    itest_check_stats_shape(r);
    cJSON_Delete(r);

    /* An escaped NUL is refused even in a member stats does not know
     * (docs/protocol.md), while an escaped backslash before "u0000" is not
     * an escaped NUL at all. */
    r = itest_rpc(c, "{\"op\":\"stats\",\"x\":\"a\\u0000b\",\"tag\":\"esc0\"}");
    if (itest_error_code(r) == NULL || strcmp(itest_error_code(r), "bad_json") != 0) {
        itest_soft_fail("{\"op\":\"stats\",\"x\":\"a\\u0000b\"} (an escaped NUL) got %s",
                        itest_last_line(c));
    }
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"stats\",\"x\":\"a\\\\u0000b\",\"tag\":\"esc1\"}");
    if (itest_error_code(r) != NULL) {
        itest_soft_fail("{\"op\":\"stats\",\"x\":\"a\\\\u0000b\"} (an escaped backslash) got %s",
                        itest_last_line(c));
    }
    cJSON_Delete(r);

    ck_assert(itest_send_str(c, "{\"op\":\"stats\",\"x\":\"\xe2"));
    itest_sleep_ms(50);
    ck_assert(itest_send_str(c, "\x82"));
    itest_sleep_ms(50);
    ck_assert(itest_send_str(c, "\xac\",\"tag\":\"split\"}\n"));
    r = itest_read_reply(c);
    itest_check_stats_shape(r);
    itest_expect_tag(r, "\"split\"");
    cJSON_Delete(r);
    itest_close(c);
}
END_TEST

START_TEST(test_byte_at_a_time)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    const char *msg = "{\"op\":\"start\",\"id\":\"b\",\"prompt\":[1,2],\"tag\":\"one\"}\n"
                      "{\"op\":\"step\",\"id\":\"b\",\"n\":2,\"tag\":\"two\"}\n";
    for (const char *p = msg; *p != '\0'; p++) {
        ck_assert(itest_send(c, p, 1));
        if ((p - msg) % 8 == 0) {
            itest_sleep_ms(1);
        }
    }
    cJSON *r = itest_read_reply(c);
    itest_expect_ok(r);
    itest_expect_tag(r, "\"one\"");
    cJSON_Delete(r);
    int64_t p[] = {1, 2};
    itest_session_t s;
    itest_session_init(&s, "b", "tiny", p, 2);
    r = itest_read_reply(c);
    itest_session_check_step(&s, r, itest_last_line(c), 2, "\"two\"");
    cJSON_Delete(r);
    itest_session_free(&s);
    itest_close(c);
}
END_TEST

START_TEST(test_blank_lines_ignored)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    ck_assert(itest_send_str(c, "\n\n   \n\t\n\r\n \r\n\t \t\r\n\n"));
    ck_assert_msg(itest_expect_silence(c, 300), "a blank line got a reply");
    ck_assert(itest_send_str(
        c, "\n  \n{\"op\":\"stats\",\"tag\":1}\n\n\n{\"op\":\"stats\",\"tag\":2}\n\n"));
    cJSON *r = itest_read_reply(c);
    itest_expect_tag(r, "1");
    cJSON_Delete(r);
    r = itest_read_reply(c);
    itest_expect_tag(r, "2");
    cJSON_Delete(r);
    ck_assert_msg(itest_expect_silence(c, 300), "a blank line got a reply");
    /* Blank lines are not requests and not errors. */
    ck_assert_int_eq(itest_stat(c, "errors_total"), 0);
    itest_close(c);
}
END_TEST

START_TEST(test_crlf_lines)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    ck_assert(itest_send_str(c, "{\"op\":\"start\",\"id\":\"c\",\"prompt\":[3],\"tag\":1}\r\n"
                                "{\"op\":\"step\",\"id\":\"c\",\"tag\":2}\r\n"
                                "{\"op\":\"stats\",\"tag\":3}\r\n"
                                "{\"op\":\"nope\",\"tag\":4}\r\n"
                                "{\"op\":\"finish\",\"id\":\"c\",\"tag\":5}\r\n"));
    int64_t p[] = {3};
    itest_session_t s;
    itest_session_init(&s, "c", "tiny", p, 1);
    for (int i = 1; i <= 5; i++) {
        size_t len;
        char *raw = itest_read_line(c, ITEST_REPLY_MS, &len);
        ck_assert_msg(raw != NULL, "no reply to CRLF line %d", i);
        ck_assert_msg(memchr(raw, '\r', len) == NULL, "reply %d holds a \\r: %s", i, raw);
        cJSON *r = cJSON_Parse(raw);
        ck_assert_msg(r != NULL, "reply %d is not JSON: %s", i, raw);
        char tag[8];
        snprintf(tag, sizeof(tag), "%d", i);
        if (i == 2) {
            itest_session_check_step(&s, r, raw, 1, tag);
        } else if (i == 4) {
            itest_expect_error(r, tag, "unknown_op", "op", NULL);
        } else {
            itest_expect_ok(r);
            itest_expect_tag(r, tag);
        }
        if (i == 5) {
            ck_assert_int_eq(itest_int(r, "released"), 2);
        }
        cJSON_Delete(r);
        free(raw);
    }
    itest_session_free(&s);
    itest_close(c);
}
END_TEST

/* A stats line padded with an ignored member to exactly `len` bytes. */
static char *padded_stats(size_t len)
{
    const char *head = "{\"op\":\"stats\",\"tag\":\"pad\",\"pad\":\"";
    const char *tail = "\"}";
    size_t fixed = strlen(head) + strlen(tail);
    ck_assert_uint_ge(len, fixed);
    char *s = malloc(len + 1);
    strcpy(s, head);
    memset(s + strlen(head), 'p', len - fixed);
    strcpy(s + len - strlen(tail), tail);
    ck_assert_uint_eq(strlen(s), len);
    return s;
}

/* Sends `len` bytes of `fill` (and a newline if `newline`), after `before`,
 * and expects the replies to `before` (n_before stats), then line_too_long
 * with no tag, then the connection closed. */
static void expect_too_long(const itest_daemon_t *d, const char *before, int n_before, size_t len,
                            char fill, bool newline)
{
    itest_conn_t *c = itest_connect(d);
    if (before != NULL) {
        ck_assert(itest_send_str(c, before));
    }
    char *buf = malloc(len + 1);
    memset(buf, fill, len);
    buf[len] = '\n';
    /* The daemon may close before taking every byte: a failed send is fine. */
    itest_send(c, buf, len + (newline ? 1 : 0));
    free(buf);
    for (int i = 0; i < n_before; i++) {
        cJSON *r = itest_read_reply(c);
        itest_check_stats_shape(r);
        cJSON_Delete(r);
    }
    cJSON *r = itest_read_reply(c);
    itest_expect_error(r, NULL, "line_too_long", NULL);
    cJSON_Delete(r);
    ck_assert_msg(itest_expect_closed(c, ITEST_REPLY_MS),
                  "the connection stayed open (or sent more) after line_too_long (%zu bytes, %s)",
                  len, newline ? "with newline" : "no newline");
    itest_close(c);
}

START_TEST(test_line_too_long_default)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *keep = itest_connect(d);
    /* 65536 bytes is the limit itself: fine. */
    itest_conn_t *c = itest_connect(d);
    char *line = padded_stats(65536);
    cJSON *r = itest_rpc(c, "%s", line);
    itest_check_stats_shape(r);
    itest_expect_tag(r, "\"pad\"");
    cJSON_Delete(r);
    free(line);
    /* One more byte is too long: with a newline, without one, and with
     * earlier lines on the connection answered first. */
    line = padded_stats(65537);
    ck_assert(itest_send_str(c, line));
    ck_assert(itest_send_str(c, "\n"));
    free(line);
    r = itest_read_reply(c);
    itest_expect_error(r, NULL, "line_too_long", NULL);
    cJSON_Delete(r);
    ck_assert(itest_expect_closed(c, ITEST_REPLY_MS));
    itest_close(c);
    expect_too_long(d, NULL, 0, 65537, 'x', false);
    expect_too_long(d, NULL, 0, 65537, '{', true);
    expect_too_long(d, "{\"op\":\"stats\"}\n{\"op\":\"stats\"}\n", 2, 200000, 'y', false);
    expect_too_long(d, NULL, 0, 1000000, ' ', false);

    /* Others serve on. */
    cJSON *st = itest_stats(keep);
    ck_assert_int_ge(itest_int(st, "errors_total"), 5);
    cJSON_Delete(st);
    itest_close(keep);
}
END_TEST

START_TEST(test_line_too_long_small_limit)
{
    itest_daemon_t *d = itest_daemon_start("--max-line", "100", NULL);
    itest_conn_t *c = itest_connect(d);
    char *line = padded_stats(100);
    cJSON *r = itest_rpc(c, "%s", line);
    itest_check_stats_shape(r);
    cJSON_Delete(r);
    /* 100 bytes without a newline wait for it. */
    ck_assert(itest_send_str(c, line));
    ck_assert_msg(itest_expect_silence(c, 300), "a line was answered before its newline");
    ck_assert(itest_send_str(c, "\n"));
    r = itest_read_reply(c);
    itest_check_stats_shape(r);
    cJSON_Delete(r);
    free(line);
    itest_close(c);
    expect_too_long(d, NULL, 0, 101, 'x', false);
    expect_too_long(d, NULL, 0, 101, 'x', true);
    expect_too_long(d, "{\"op\":\"stats\"}\n", 1, 5000, '[', true);

    /* Over the limit in small pieces. */
    c = itest_connect(d);
    for (int i = 0; i < 11; i++) {
        ck_assert(itest_send_str(c, "xxxxxxxxxx"));
        itest_sleep_ms(5);
    }
    r = itest_read_reply(c);
    itest_expect_error(r, NULL, "line_too_long", NULL);
    cJSON_Delete(r);
    ck_assert(itest_expect_closed(c, ITEST_REPLY_MS));
    itest_close(c);

    c = itest_connect(d);
    r = itest_rpc(c, "{\"op\":\"stats\"}");
    itest_check_stats_shape(r);
    cJSON_Delete(r);
    itest_close(c);
}
END_TEST

START_TEST(test_deep_nesting)
{
    itest_daemon_t *d = itest_daemon_start("--max-line", "262144", NULL);
    itest_conn_t *c = itest_connect(d);
    size_t n = 100000;
    char *buf = malloc(2 * n + 64);

    memset(buf, '[', n);
    probe(c, buf, n, "bad_json", NULL, 1);

    memset(buf + n, ']', n);
    probe(c, buf, 2 * n, "bad_json", NULL, 2);

    size_t o = 0;
    for (size_t i = 0; i < 20000; i++) {
        memcpy(buf + o, "{\"a\":", 5);
        o += 5;
    }
    probe(c, buf, o, "bad_json", NULL, 3);

    /* A well-formed object holding deep arrays: a valid stats request or,
     * past a parser's nesting limit, bad_json; either way an answer. */
    o = (size_t)sprintf(buf, "{\"op\":\"stats\",\"tag\":\"deep\",\"x\":");
    memset(buf + o, '[', 50000);
    memset(buf + o + 50000, ']', 50000);
    o += 100000;
    buf[o++] = '}';
    buf[o++] = '\n';
    ck_assert(itest_send(c, buf, o));
    cJSON *r = itest_read_reply(c);
    if (itest_error_code(r) != NULL) {
        itest_expect_error(r, NULL, "bad_json", NULL);
    } else {
        itest_check_stats_shape(r);
    }
    cJSON_Delete(r);
    r = itest_rpc(c, "{\"op\":\"stats\"}");
    itest_check_stats_shape(r);
    cJSON_Delete(r);
    free(buf);
    itest_close(c);

    /* Within the default limit too. */
    itest_daemon_t *d2 = itest_daemon_start(NULL);
    c = itest_connect(d2);
    buf = malloc(60000);
    memset(buf, '[', 60000);
    probe(c, buf, 60000, "bad_json", NULL, 4);
    memset(buf, '{', 60000);
    probe(c, buf, 60000, "bad_json", NULL, 5);
    free(buf);
    itest_close(c);
}
END_TEST

START_TEST(test_random_binary)
{
    itest_daemon_t *d = itest_daemon_start(NULL);
    itest_conn_t *c = itest_connect(d);
    uint64_t seed = 1234;
    char line[600];
    for (int i = 0; i < 200; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        size_t len = 1 + (seed >> 33) % 500;
        for (size_t k = 0; k < len; k++) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            char ch = (char)(seed >> 56);
            if (ch == '\n') {
                ch = 'n';
            }
            line[k] = ch;
        }
        /* Not blank: the first and last bytes are no white space. */
        line[0] = (char)0xfe;
        line[len - 1] = (char)0x01;
        ck_assert(itest_send(c, line, len));
        ck_assert(itest_send_str(c, "\n"));
    }
    for (int i = 0; i < 200; i++) {
        cJSON *r = itest_read_reply(c);
        itest_expect_error(r, NULL, "bad_json", NULL);
        cJSON_Delete(r);
    }
    ck_assert_int_eq(itest_stat(c, "errors_total"), 200);
    itest_close(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("integration_malformed");
    ITEST_ADD(s, test_battery);
    ITEST_ADD(s, test_strict_json_grammar);
    ITEST_ADD(s, test_valid_utf8_and_escapes);
    ITEST_ADD(s, test_byte_at_a_time);
    ITEST_ADD(s, test_blank_lines_ignored);
    ITEST_ADD(s, test_crlf_lines);
    ITEST_ADD(s, test_line_too_long_default);
    ITEST_ADD(s, test_line_too_long_small_limit);
    ITEST_ADD(s, test_deep_nesting);
    ITEST_ADD(s, test_random_binary);
    return itest_main(s);
}
