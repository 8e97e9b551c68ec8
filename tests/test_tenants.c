/*
 * test_tenants.c: the Check suite of server/tenants.c: a good file with
 * every option, its defaults, the token lookup; every kind of bad file
 * refused with its line number and nothing filled in; the file's mode
 * refused as the token file's is.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/tenants.h"

static char err[512];

#define TOK_A "aaaaaaaaaaaaaaaa-token-a"
#define TOK_B "bbbbbbbbbbbbbbbb-token-b"

static int parse(const char *text, tenants_file_t *f)
{
    err[0] = '\0';
    return tenants_parse(text, strlen(text), "t.conf", f, err, sizeof(err));
}

START_TEST(test_good_file)
{
    tenants_file_t f = {NULL, 0};
    const char *text = "# tenants\n"
                       "\n"
                       "alice " TOK_A " share=0.25 weight=3 sessions=10 connections=4 admin\n"
                       "   bob.b-2_x\t" TOK_B "\r\n";
    ck_assert_int_eq(parse(text, &f), 0);
    ck_assert_uint_eq(f.n, 2);
    ck_assert_str_eq(f.t[0].name, "alice");
    ck_assert_str_eq(f.t[0].token, TOK_A);
    ck_assert(f.t[0].share == 0.25);
    ck_assert_uint_eq(f.t[0].weight, 3);
    ck_assert_uint_eq(f.t[0].sessions, 10);
    ck_assert_uint_eq(f.t[0].connections, 4);
    ck_assert(f.t[0].admin);
    ck_assert_str_eq(f.t[1].name, "bob.b-2_x");
    ck_assert_str_eq(f.t[1].token, TOK_B);
    ck_assert(f.t[1].share == 1.0);
    ck_assert_uint_eq(f.t[1].weight, 1);
    ck_assert_uint_eq(f.t[1].sessions, 0);
    ck_assert_uint_eq(f.t[1].connections, 0);
    ck_assert(!f.t[1].admin);
    ck_assert_ptr_eq(tenants_find_token(&f, TOK_B, strlen(TOK_B)), &f.t[1]);
    ck_assert_ptr_eq(tenants_find_token(&f, TOK_A, strlen(TOK_A)), &f.t[0]);
    ck_assert_ptr_null(tenants_find_token(&f, TOK_A, strlen(TOK_A) - 1));
    ck_assert_ptr_null(tenants_find_token(&f, "", 0));
    ck_assert_ptr_eq(tenants_find_name(&f, "alice"), &f.t[0]);
    ck_assert_ptr_null(tenants_find_name(&f, "carol"));
    tenants_free(&f);
    ck_assert_uint_eq(f.n, 0);
    ck_assert_ptr_null(f.t);
}
END_TEST

/* Each bad file: refused, naming its line and the fault, *out untouched. */
static const struct {
    const char *text, *want;
} bad[] = {
    {"a " TOK_A "\nb " TOK_A "\n", "line 2: tenant 'b' has the token of 'a'"},
    {"a " TOK_A "\n\na " TOK_B "\n", "line 3: tenant 'a' named twice"},
    {"a short\n", "line 1: tenant 'a': the token must be 16 to 4096 bytes"},
    {"a\n", "line 1: tenant 'a' has no token"},
    {"a/b " TOK_A "\n", "line 1: the name may hold only"},
    {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa " TOK_A "\n",
     "line 1: the name is longer than 64 bytes"},
    {"a " TOK_A " share=0\n", "line 1: tenant 'a': share=0 out of range"},
    {"a " TOK_A " share=1.5\n", "share=1.5 out of range"},
    {"a " TOK_A " share=-1\n", "share=-1 out of range"},
    {"a " TOK_A " share=nan\n", "share=nan out of range"},
    {"a " TOK_A " weight=0\n", "weight=0 out of range"},
    {"a " TOK_A " weight=1001\n", "weight=1001 out of range"},
    {"a " TOK_A " sessions=0\n", "sessions=0 out of range"},
    {"a " TOK_A " connections=x\n", "connections=x out of range"},
    {"a " TOK_A " connections=99999999999\n", "out of range"},
    {"a " TOK_A " weight=2 weight=3\n", "tenant 'a': weight given twice"},
    {"a " TOK_A " admin admin\n", "tenant 'a': admin given twice"},
    {"a " TOK_A " root\n", "tenant 'a': unknown option 'root'"},
    {"a " TOK_A " admins\n", "unknown option 'admins'"},
    {"# only comments\n\n", "names no tenant"},
    {"", "names no tenant"},
};

START_TEST(test_bad_file)
{
    tenants_file_t f = {(tenant_def_t *)&f, 77};
    ck_assert_int_eq(parse(bad[_i].text, &f), -1);
    ck_assert_msg(strstr(err, bad[_i].want) != NULL, "file %d: '%s' lacks '%s'", _i, err,
                  bad[_i].want);
    ck_assert_msg(strstr(err, "t.conf") != NULL, "'%s' does not name the file", err);
    ck_assert_ptr_eq(f.t, (tenant_def_t *)&f);
    ck_assert_uint_eq(f.n, 77);
}
END_TEST

/* A line past TENANTS_LINE_MAX is refused, one at it is read; a NUL byte
 * and a control byte in a token are refused. */
START_TEST(test_line_limits)
{
    tenants_file_t f = {NULL, 0};
    size_t tok = 4096, pad = TENANTS_LINE_MAX - 2 - tok;
    char *text = malloc(TENANTS_LINE_MAX + 64);
    size_t n = 0;

    ck_assert_ptr_nonnull(text);
    text[n++] = 'a';
    text[n++] = ' ';
    memset(text + n, 'x', tok);
    n += tok;
    /* Spaces up to the limit exactly: the line is read. */
    memset(text + n, ' ', pad);
    n += pad;
    text[n++] = '\n';
    text[n] = '\0';
    ck_assert_int_eq(parse(text, &f), 0);
    ck_assert_uint_eq(f.t[0].token_len, tok);
    tenants_free(&f);
    text[n - 1] = ' ';
    text[n++] = '\n';
    text[n] = '\0';
    ck_assert_int_eq(parse(text, &f), -1);
    ck_assert_msg(strstr(err, "line 1 is longer than 8192 bytes") != NULL, "%s", err);
    ck_assert_ptr_null(f.t);
    free(text);

    /* Too long a token. */
    text = malloc(4200);
    ck_assert_ptr_nonnull(text);
    memcpy(text, "a ", 2);
    memset(text + 2, 'y', 4097);
    text[4099] = '\0';
    ck_assert_int_eq(parse(text, &f), -1);
    ck_assert_msg(strstr(err, "the token must be 16 to 4096 bytes") != NULL, "%s", err);
    free(text);

    static const char nul[] = "a " TOK_A "\nb bbbbbbbbbbbbbbbbbbbbbb\0bb\n";
    ck_assert_int_eq(tenants_parse(nul, sizeof(nul) - 1, "t.conf", &f, err, sizeof(err)), -1);
    ck_assert_msg(strstr(err, "line 2 holds a NUL byte") != NULL, "%s", err);
    ck_assert_int_eq(parse("a aaaaaaaaaaaaaaaaaaaaa\x01\n", &f), -1);
    ck_assert_msg(strstr(err, "not printable ASCII") != NULL, "%s", err);
    ck_assert_ptr_null(f.t);
}
END_TEST

/* The file itself: refused when others may read it, read when they may
 * not; a missing file is named. */
START_TEST(test_load_mode)
{
    char path[] = "/tmp/slotd-tenants-XXXXXX";
    int fd = mkstemp(path);
    tenants_file_t f = {NULL, 0};
    const char text[] = "alice " TOK_A " admin\n";

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, sizeof(text) - 1), (ssize_t)sizeof(text) - 1);
    close(fd);
    ck_assert_int_eq(chmod(path, 0644), 0);
    ck_assert_int_eq(tenants_load(path, &f, err, sizeof(err)), -1);
    ck_assert_msg(strstr(err, "chmod 600") != NULL, "%s", err);
    ck_assert_ptr_null(f.t);
    ck_assert_int_eq(chmod(path, 0600), 0);
    ck_assert_int_eq(tenants_load(path, &f, err, sizeof(err)), 0);
    ck_assert_uint_eq(f.n, 1);
    ck_assert(f.t[0].admin);
    tenants_free(&f);
    unlink(path);
    ck_assert_int_eq(tenants_load(path, &f, err, sizeof(err)), -1);
    ck_assert_msg(strstr(err, "cannot open") != NULL, "%s", err);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("tenants");
    TCase *tc = tcase_create("file");
    tcase_add_test(tc, test_good_file);
    tcase_add_loop_test(tc, test_bad_file, 0, (int)(sizeof(bad) / sizeof(bad[0])));
    tcase_add_test(tc, test_line_limits);
    tcase_add_test(tc, test_load_mode);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    int failed;
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
