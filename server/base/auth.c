/*
 * auth.c: the token file of --auth-token-file, read once at start-up, and
 * the constant-time comparison used by the session port's `auth` op and
 * the admin port's Bearer check.
 *
 * The file is refused unless only its owner can read it, like ssh's keys:
 * a token others can read is not a secret.  The comparison walks the whole
 * secret whatever is presented, and folds every difference (lengths
 * included) into one accumulator, so that neither the length nor the
 * position of the first wrong byte shows in the time it takes.
 *
 * DESIGN.  No state: auth_load() runs on the main thread before any other
 * exists; auth_equal() is pure and runs on the loop thread.
 */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int auth_fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int auth_fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

int auth_load(const char *path, char *out, size_t *len, char *err, size_t errlen)
{
    char buf[AUTH_TOKEN_MAX + 3]; /* the token, "\r\n", and one byte too many */
    struct stat st;
    size_t n = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);

    if (fd < 0)
        return auth_fail(err, errlen, "--auth-token-file: cannot open '%s': %s", path,
                         strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return auth_fail(err, errlen, "--auth-token-file: '%s' is not a regular file", path);
    }
    if ((st.st_mode & (S_IRGRP | S_IROTH | S_IWGRP | S_IWOTH)) != 0) {
        close(fd);
        return auth_fail(err, errlen,
                         "--auth-token-file: '%s' may be read or written by others than its owner "
                         "(mode %03o); chmod 600 it",
                         path, (unsigned)(st.st_mode & 0777));
    }
    for (;;) {
        ssize_t got = read(fd, buf + n, sizeof(buf) - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            int e = errno;
            close(fd);
            return auth_fail(err, errlen, "--auth-token-file: cannot read '%s': %s", path,
                             strerror(e));
        }
        if (got == 0 || (n += (size_t)got) == sizeof(buf))
            break;
    }
    close(fd);
    if (n > 0 && buf[n - 1] == '\n')
        n--;
    if (n > 0 && buf[n - 1] == '\r')
        n--;
    if (n < AUTH_TOKEN_MIN || n > AUTH_TOKEN_MAX)
        return auth_fail(err, errlen, "--auth-token-file: '%s' must hold %d to %d bytes, not %s%zu",
                         path, AUTH_TOKEN_MIN, AUTH_TOKEN_MAX,
                         n > AUTH_TOKEN_MAX ? "more than " : "",
                         n > AUTH_TOKEN_MAX ? (size_t)AUTH_TOKEN_MAX : n);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)buf[i] < 0x20 || (unsigned char)buf[i] > 0x7e)
            return auth_fail(err, errlen,
                             "--auth-token-file: '%s' holds a byte that is not printable ASCII at "
                             "offset %zu",
                             path, i);
    memcpy(out, buf, n);
    out[n] = '\0';
    *len = n;
    memset(buf, 0, sizeof(buf));
    return 0;
}

bool auth_equal(const char *a, size_t alen, const char *b, size_t blen)
{
    /* volatile: the compiler may not stop at the first difference. */
    volatile unsigned char diff = alen != blen;
    for (size_t i = 0; i < blen; i++)
        diff |= (unsigned char)(b[i] ^ (i < alen ? a[i] : 0));
    return diff == 0;
}
