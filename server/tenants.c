/*
 * tenants.c: the tenants file of --tenants-file (format: the protocol's
 * "Tenants"): read with the same care as the token file, every line
 * checked, and a token looked up in constant time.
 *
 *     NAME TOKEN [share=F] [weight=W] [sessions=N] [connections=N] [admin]
 *
 * `#` starts a comment line; blank lines are skipped.  Any fault (a line
 * too long, a bad name or token, a duplicate name or token, an option out
 * of range, named twice or unknown) refuses the whole file with its line
 * number: a daemon either serves the file as written or keeps what it had.
 * Parsing is two passes over the text: the first checks everything and
 * counts, the second allocates once and fills, so a refused file
 * allocates nothing.
 *
 * DESIGN.  No state: the caller owns each tenants_file_t (tenants.h);
 * server.c calls in on the loop thread at start and at each reload.
 */
#include "tenants.h"

#include "server/base/auth.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The biggest file read: every tenant's line at its longest. */
#define TENANTS_FILE_MAX ((size_t)TENANTS_MAX * (TENANTS_LINE_MAX + 1) + 65536)

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static bool name_byte(unsigned char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_' || ch == '.' || ch == '-';
}

/* The next space-separated word of [*p, end): its start and length; 0 at
 * the end of the line. */
static size_t next_word(const char **p, const char *end, const char **word)
{
    const char *s = *p;
    while (s < end && (*s == ' ' || *s == '\t'))
        s++;
    *word = s;
    while (s < end && *s != ' ' && *s != '\t')
        s++;
    *p = s;
    return (size_t)(s - *word);
}

/* Parses an unsigned decimal in [lo, hi] from the `n` bytes at `s`. */
static bool tenants_parse_uint(const char *s, size_t n, uint32_t lo, uint32_t hi, uint32_t *out)
{
    uint64_t v = 0;
    if (n == 0 || n > 10)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v < lo || v > hi)
        return false;
    *out = (uint32_t)v;
    return true;
}

/* Parses a share in (0, 1] from the `n` bytes at `s`. */
static bool parse_share(const char *s, size_t n, double *out)
{
    char buf[32], *e;
    double v;
    if (n == 0 || n >= sizeof(buf))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || s[i] == '.'))
            return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    errno = 0;
    v = strtod(buf, &e);
    if (errno != 0 || *e != '\0' || !isfinite(v) || !(v > 0.0) || v > 1.0)
        return false;
    *out = v;
    return true;
}

/* Checks one line (`n` bytes at `s`, no newline) into *t (its token
 * pointing into the text).  Returns 1 for a tenant, 0 for a blank or
 * comment line, -1 with `err` set. */
static int parse_line(const char *s, size_t n, const char *path, size_t lineno, tenant_def_t *t,
                      char *err, size_t errlen)
{
    const char *p = s, *end = s + n, *w;
    size_t wn;
    bool seen[5] = {false};

    if (n > 0 && s[n - 1] == '\r')
        end--;
    if ((wn = next_word(&p, end, &w)) == 0 || *w == '#')
        return 0;
    memset(t, 0, sizeof(*t));
    t->share = 1.0;
    t->weight = 1;
    if (wn > TENANT_NAME_MAX)
        return fail(err, errlen, "--tenants-file: %s line %zu: the name is longer than %d bytes",
                    path, lineno, TENANT_NAME_MAX);
    for (size_t i = 0; i < wn; i++)
        if (!name_byte((unsigned char)w[i]))
            return fail(err, errlen,
                        "--tenants-file: %s line %zu: the name may hold only A-Z a-z 0-9 _ . -",
                        path, lineno);
    memcpy(t->name, w, wn);
    t->name[wn] = '\0';
    if ((wn = next_word(&p, end, &w)) == 0)
        return fail(err, errlen, "--tenants-file: %s line %zu: tenant '%s' has no token", path,
                    lineno, t->name);
    if (wn < AUTH_TOKEN_MIN || wn > AUTH_TOKEN_MAX)
        return fail(err, errlen,
                    "--tenants-file: %s line %zu: tenant '%s': the token must be %d to %d bytes",
                    path, lineno, t->name, AUTH_TOKEN_MIN, AUTH_TOKEN_MAX);
    for (size_t i = 0; i < wn; i++)
        if ((unsigned char)w[i] <= 0x20 || (unsigned char)w[i] > 0x7e)
            return fail(err, errlen,
                        "--tenants-file: %s line %zu: tenant '%s': the token holds a byte that "
                        "is not printable ASCII",
                        path, lineno, t->name);
    t->token = (char *)w;
    t->token_len = wn;
    while ((wn = next_word(&p, end, &w)) != 0) {
        static const char *const keys[] = {
            "share=", "weight=", "sessions=", "connections=", "admin"};
        size_t k, kl = 0;
        bool ok;
        for (k = 0; k < 5; k++) {
            kl = strlen(keys[k]);
            if (k == 4 ? wn == kl && memcmp(w, keys[k], kl) == 0
                       : wn >= kl && memcmp(w, keys[k], kl) == 0)
                break;
        }
        if (k == 5)
            return fail(err, errlen,
                        "--tenants-file: %s line %zu: tenant '%s': unknown option '%.*s' (share=, "
                        "weight=, sessions=, connections=, admin)",
                        path, lineno, t->name, (int)(wn > 64 ? 64 : wn), w);
        if (seen[k])
            return fail(err, errlen, "--tenants-file: %s line %zu: tenant '%s': %.*s given twice",
                        path, lineno, t->name, (int)(k == 4 ? kl : kl - 1), keys[k]);
        seen[k] = true;
        switch (k) {
        case 0:
            ok = parse_share(w + kl, wn - kl, &t->share);
            break;
        case 1:
            ok = tenants_parse_uint(w + kl, wn - kl, 1, TENANT_WEIGHT_MAX, &t->weight);
            break;
        case 2:
            ok = tenants_parse_uint(w + kl, wn - kl, 1, UINT32_MAX, &t->sessions);
            break;
        case 3:
            ok = tenants_parse_uint(w + kl, wn - kl, 1, UINT32_MAX, &t->connections);
            break;
        default:
            ok = true;
            t->admin = true;
            break;
        }
        if (!ok)
            return fail(err, errlen,
                        "--tenants-file: %s line %zu: tenant '%s': %.*s out of range (share in "
                        "(0, 1], weight 1-%d, sessions and connections positive integers)",
                        path, lineno, t->name, (int)(wn > 64 ? 64 : wn), w, TENANT_WEIGHT_MAX);
    }
    return 1;
}

/* Walks the text's lines into `defs` (room for `cap`; NULL only counts). */
static int walk(const char *text, size_t len, const char *path, tenant_def_t *defs, size_t cap,
                size_t *count, char *err, size_t errlen)
{
    size_t n = 0, lineno = 0;
    const char *p = text, *end = text + len;

    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t ln = (nl != NULL ? nl : end) - p;
        tenant_def_t t;
        int rc;

        lineno++;
        if (ln > TENANTS_LINE_MAX)
            return fail(err, errlen, "--tenants-file: %s line %zu is longer than %d bytes", path,
                        lineno, TENANTS_LINE_MAX);
        if (memchr(p, '\0', ln) != NULL)
            return fail(err, errlen, "--tenants-file: %s line %zu holds a NUL byte", path, lineno);
        rc = parse_line(p, ln, path, lineno, &t, err, errlen);
        p += ln + (nl != NULL);
        if (rc < 0)
            return -1;
        if (rc == 0)
            continue;
        for (size_t i = 0; defs != NULL && i < n; i++) {
            if (strcmp(defs[i].name, t.name) == 0)
                return fail(err, errlen, "--tenants-file: %s line %zu: tenant '%s' named twice",
                            path, lineno, t.name);
            if (auth_equal(t.token, t.token_len, defs[i].token, defs[i].token_len))
                return fail(err, errlen,
                            "--tenants-file: %s line %zu: tenant '%s' has the token of '%s'", path,
                            lineno, t.name, defs[i].name);
        }
        if (n == TENANTS_MAX)
            return fail(err, errlen, "--tenants-file: %s line %zu: more than %d tenants", path,
                        lineno, TENANTS_MAX);
        if (defs != NULL && n < cap)
            defs[n] = t;
        n++;
    }
    *count = n;
    return 0;
}

int tenants_parse(const char *text, size_t len, const char *path, tenants_file_t *out, char *err,
                  size_t errlen)
{
    size_t n = 0, got = 0;
    tenant_def_t *defs;

    if (walk(text, len, path, NULL, 0, &n, err, errlen) != 0)
        return -1;
    if (n == 0)
        return fail(err, errlen, "--tenants-file: %s names no tenant", path);
    if ((defs = calloc(n, sizeof(*defs))) == NULL)
        return fail(err, errlen, "--tenants-file: %s: out of memory", path);
    /* The second pass also checks duplicates (it has the earlier lines). */
    if (walk(text, len, path, defs, n, &got, err, errlen) != 0) {
        free(defs);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        char *tok = malloc(defs[i].token_len + 1);
        if (tok == NULL) {
            for (size_t j = 0; j < i; j++)
                free(defs[j].token);
            free(defs);
            return fail(err, errlen, "--tenants-file: %s: out of memory", path);
        }
        memcpy(tok, defs[i].token, defs[i].token_len);
        tok[defs[i].token_len] = '\0';
        defs[i].token = tok;
    }
    out->t = defs;
    out->n = n;
    return 0;
}

int tenants_load(const char *path, tenants_file_t *out, char *err, size_t errlen)
{
    struct stat st;
    char *buf;
    size_t n = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY), rc;

    if (fd < 0)
        return fail(err, errlen, "--tenants-file: cannot open '%s': %s", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return fail(err, errlen, "--tenants-file: '%s' is not a regular file", path);
    }
    if ((st.st_mode & (S_IRGRP | S_IROTH | S_IWGRP | S_IWOTH)) != 0) {
        close(fd);
        return fail(err, errlen,
                    "--tenants-file: '%s' may be read or written by others than its owner "
                    "(mode %03o); chmod 600 it",
                    path, (unsigned)(st.st_mode & 0777));
    }
    if ((uint64_t)st.st_size > TENANTS_FILE_MAX) {
        close(fd);
        return fail(err, errlen, "--tenants-file: '%s' is larger than %zu bytes", path,
                    (size_t)TENANTS_FILE_MAX);
    }
    if ((buf = malloc((size_t)st.st_size + 1)) == NULL) {
        close(fd);
        return fail(err, errlen, "--tenants-file: '%s': out of memory", path);
    }
    while (n < (size_t)st.st_size) {
        ssize_t got = read(fd, buf + n, (size_t)st.st_size - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            int e = errno;
            close(fd);
            free(buf);
            return fail(err, errlen, "--tenants-file: cannot read '%s': %s", path, strerror(e));
        }
        if (got == 0)
            break;
        n += (size_t)got;
    }
    close(fd);
    rc = tenants_parse(buf, n, path, out, err, errlen);
    memset(buf, 0, n);
    free(buf);
    return rc;
}

void tenants_free(tenants_file_t *f)
{
    for (size_t i = 0; i < f->n; i++) {
        memset(f->t[i].token, 0, f->t[i].token_len);
        free(f->t[i].token);
    }
    free(f->t);
    f->t = NULL;
    f->n = 0;
}

const tenant_def_t *tenants_find_token(const tenants_file_t *f, const char *token, size_t len)
{
    const tenant_def_t *hit = NULL;
    for (size_t i = 0; i < f->n; i++)
        if (auth_equal(token, len, f->t[i].token, f->t[i].token_len) && hit == NULL)
            hit = &f->t[i];
    return hit;
}

const tenant_def_t *tenants_find_name(const tenants_file_t *f, const char *name)
{
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0)
            return &f->t[i];
    return NULL;
}
