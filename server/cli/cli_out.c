/*
 * cli_out.c: how slotd-cli prints what comes back.
 *
 * A reply of the session port is printed on one line, its members in the
 * order the daemon wrote them, as "key: value" separated by two spaces:
 *
 *   id: a  tokens: [1 0]  logits: 2 × 6, first [-0.125467 0.468642 …]  entries: 5
 *
 * Strings lose their quotes, arrays are "[a b c]", objects "{k: v, k: v}".
 * Logits are shortened to their shape and first two scores unless --full
 * is given, and are written with six decimals as the daemon writes them.
 * An error reply is "(error) code: message".  With --raw the daemon's
 * line is printed byte for byte instead.  Colour (keys, errors) only when
 * the stream is a terminal and NO_COLOR is unset; cli.c decides that.
 *
 * The admin port's answers: /health as a reply is ("status: ok"), /metrics
 * as its sample lines (without the # HELP and # TYPE comments unless
 * --raw), only those holding PATTERN when one is given.
 *
 * Single-threaded; everything goes to stdout (local errors to stderr) and
 * is flushed at the end of each reply.
 */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_int.h"

#define KEY_ON "\033[36m"
#define ERR_ON "\033[1;31m"
#define OFF "\033[0m"

/* How many scores of the first row a shortened logits member shows. */
#define LOGITS_SHOWN 2

static void put_key(const cli_out_t *o, const char *key)
{
    if (o->colour)
        printf(KEY_ON "%s:" OFF " ", key);
    else
        printf("%s: ", key);
}

/* An integral value as an integer, anything else in the fewest digits
 * that read back as the same double. */
static void put_number(double d)
{
    if (d > -9007199254740992.0 && d < 9007199254740992.0 && d == (double)(int64_t)d) {
        printf("%lld", (long long)d);
        return;
    }
    char buf[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof(buf), "%.*g", prec, d);
        if (strtod(buf, NULL) == d)
            break;
    }
    fputs(buf, stdout);
}

static void put_value(const cli_out_t *o, const cJSON *v, bool logits);

/* Scores as the daemon writes them, six decimals. */
static void put_score(const cJSON *v)
{
    if (cJSON_IsNumber(v))
        printf("%.6f", v->valuedouble);
    else
        fputs("?", stdout);
}

static void put_array(const cli_out_t *o, const cJSON *arr, bool logits)
{
    putchar('[');
    for (const cJSON *e = arr->child; e != NULL; e = e->next) {
        if (e != arr->child)
            putchar(' ');
        if (logits && !cJSON_IsArray(e))
            put_score(e);
        else
            put_value(o, e, logits);
    }
    putchar(']');
}

/* "6 × 6, first [a b …]" for rows of scores, "6, first [a b …]" for one
 * vector. */
static void put_logits_short(const cJSON *arr)
{
    int n = cJSON_GetArraySize(arr);
    const cJSON *row = arr;
    printf("%d", n);
    if (n > 0 && cJSON_IsArray(arr->child)) {
        row = arr->child;
        printf(" × %d", cJSON_GetArraySize(row));
    }
    if (row->child == NULL)
        return;
    fputs(", first [", stdout);
    int i = 0;
    for (const cJSON *e = row->child; e != NULL; e = e->next, i++) {
        if (i == LOGITS_SHOWN) {
            fputs(" …", stdout);
            break;
        }
        if (i > 0)
            putchar(' ');
        put_score(e);
    }
    putchar(']');
}

static void put_members(const cli_out_t *o, const cJSON *obj, const char *sep, const char *skip)
{
    bool first = true;
    for (const cJSON *m = obj->child; m != NULL; m = m->next) {
        if (skip != NULL && m->string != NULL && strcmp(m->string, skip) == 0)
            continue;
        if (!first)
            fputs(sep, stdout);
        first = false;
        put_key(o, m->string != NULL ? m->string : "?");
        bool logits = m->string != NULL && strcmp(m->string, "logits") == 0;
        if (logits && cJSON_IsArray(m) && !o->full)
            put_logits_short(m);
        else
            put_value(o, m, logits);
    }
}

static void put_value(const cli_out_t *o, const cJSON *v, bool logits)
{
    if (cJSON_IsString(v)) {
        fputs(v->valuestring, stdout);
    } else if (cJSON_IsNumber(v)) {
        put_number(v->valuedouble);
    } else if (cJSON_IsBool(v)) {
        fputs(cJSON_IsTrue(v) ? "true" : "false", stdout);
    } else if (cJSON_IsNull(v)) {
        fputs("null", stdout);
    } else if (cJSON_IsArray(v)) {
        put_array(o, v, logits);
    } else if (cJSON_IsObject(v)) {
        putchar('{');
        put_members(o, v, ", ", NULL);
        putchar('}');
    }
}

/* "(error) code: message", in red at a terminal. */
static void put_error_head(bool colour, FILE *f)
{
    fputs(colour ? ERR_ON "(error)" OFF " " : "(error) ", f);
}

bool cli_out_reply(const cli_out_t *o, const char *line, size_t len)
{
    cJSON *j = cJSON_ParseWithLength(line, len);
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(j, "error");
    bool is_error = cJSON_IsObject(j) && err != NULL;
    if (o->raw || !cJSON_IsObject(j)) {
        fwrite(line, 1, len, stdout);
        putchar('\n');
    } else if (is_error) {
        const cJSON *code = cJSON_GetObjectItemCaseSensitive(err, "code");
        const cJSON *msg = cJSON_GetObjectItemCaseSensitive(err, "message");
        put_error_head(o->colour, stdout);
        printf("%s: %s", cJSON_IsString(code) ? code->valuestring : "?",
               cJSON_IsString(msg) ? msg->valuestring : "?");
        if (cJSON_GetArraySize(j) > 1) {
            fputs("  ", stdout);
            put_members(o, j, "  ", "error");
        }
        putchar('\n');
    } else {
        put_members(o, j, "  ", NULL);
        putchar('\n');
    }
    cJSON_Delete(j);
    fflush(stdout);
    return is_error;
}

/* Prints the lines of body[0..len) that hold `pattern` (all if NULL),
 * without comment lines unless `comments`.  Returns how many. */
static size_t put_lines(const char *body, size_t len, const char *pattern, bool comments)
{
    size_t shown = 0;
    size_t plen = pattern != NULL ? strlen(pattern) : 0;
    const char *p = body, *end = body + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t l = nl != NULL ? (size_t)(nl - p) : (size_t)(end - p);
        bool keep = comments || l == 0 || p[0] != '#';
        if (keep && pattern != NULL) {
            keep = false;
            for (size_t i = 0; i + plen <= l && !keep; i++)
                keep = memcmp(p + i, pattern, plen) == 0;
        }
        if (keep) {
            fwrite(p, 1, l + (nl != NULL), stdout);
            shown++;
        }
        p += l + (nl != NULL);
    }
    return shown;
}

bool cli_out_http(const cli_out_t *o, const char *path, int status, const char *body, size_t len,
                  const char *pattern)
{
    bool ok = status == 200;
    if (o->raw) {
        put_lines(body, len, pattern, true);
    } else if (strcmp(path, "/metrics") == 0 && ok) {
        if (put_lines(body, len, pattern, false) == 0 && pattern != NULL)
            printf("(no metric matches '%s')\n", pattern);
    } else {
        cJSON *j = cJSON_ParseWithLength(body, len);
        if (!ok) {
            put_error_head(o->colour, stdout);
            printf("http %d: ", status);
        }
        if (cJSON_IsObject(j)) {
            put_members(o, j, "  ", NULL);
        } else {
            /* Not JSON: its first line. */
            const char *nl = memchr(body, '\n', len);
            fwrite(body, 1, nl != NULL ? (size_t)(nl - body) : len, stdout);
        }
        putchar('\n');
        cJSON_Delete(j);
    }
    fflush(stdout);
    return !ok;
}

void cli_out_error(const cli_out_t *o, const char *fmt, ...)
{
    va_list ap;
    fflush(stdout);
    put_error_head(o->colour_err, stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
}
