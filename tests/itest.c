/*
 * itest.c: the helper library of the integration tests (see itest.h).
 *
 * It owns the daemons a test starts (a small table per test process), the
 * client side of session and admin connections, and the models used for
 * the uncached reference.  Check forks each test, and each forked test
 * starts, talks to and stops its own daemons; the parent only makes each
 * case's temporary directory before the fork and inspects it after.  A
 * daemon stays in the test's process group and gets PR_SET_PDEATHSIG, so
 * that neither a failed assertion nor a Check timeout (which kills the test
 * with SIGKILL) can leave one running; it writes its pid and ports into its
 * directory, so that the parent can print its log afterwards.
 *
 * SLOTD_TIME_SCALE stretches every wait, for a slow daemon.  With
 * SLOTD_WRAPPER set, the daemon's command line starts with the wrapper's
 * words (valgrind and its options), and a non-zero exit status (the
 * wrapper's verdict) is printed with the wrapper's log and fails the test.
 */
#include "itest.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ITEST_MAX_DAEMONS 8
#define ITEST_MAX_FLAGS 64
#define ITEST_START_MS 15000
#define ITEST_START_ATTEMPTS 5

/* ---- Small utilities ---- */

double itest_time_scale(void)
{
    const char *v = getenv("SLOTD_TIME_SCALE");
    if (v == NULL || v[0] == '\0') {
        return 1.0;
    }
    char *end = NULL;
    double f = strtod(v, &end);
    return end != v && *end == '\0' && isfinite(f) && f >= 1.0 && f <= 1000.0 ? f : 1.0;
}

int itest_scale_ms(int ms)
{
    double v = (double)ms * itest_time_scale();
    return v > 2e9 ? 2000000000 : (int)v;
}

bool itest_wrapped(void)
{
    const char *w = getenv("SLOTD_WRAPPER");
    return w != NULL && strspn(w, " \t") < strlen(w);
}

int64_t itest_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void itest_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    ck_assert_ptr_nonnull(p);
    memcpy(p, s, n);
    return p;
}

static char *vformat(const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    ck_assert_int_ge(n, 0);
    char *s = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(s);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

/* Reads a whole file into a malloc'd NUL-terminated string; NULL if absent. */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf != NULL && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            char *nb = realloc(buf, cap * 2);
            if (nb == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf != NULL) {
        buf[n] = '\0';
    }
    if (len != NULL) {
        *len = n;
    }
    return buf;
}

/* The first occurrence of `needle` in the `len` bytes at `hay`, or NULL. */
static const char *find_bytes(const char *hay, size_t len, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = 0; n <= len && i <= len - n; i++) {
        if (memcmp(hay + i, needle, n) == 0) {
            return hay + i;
        }
    }
    return NULL;
}

/* True if `needle` occurs in `hay`, ignoring ASCII case. */
static bool contains_nocase(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (const char *p = hay; *p != '\0'; p++) {
        if (strncasecmp(p, needle, n) == 0) {
            return true;
        }
    }
    return false;
}

/* Shows at most `max` bytes of `s` with control bytes escaped, for messages. */
static const char *shown(const char *s, size_t len, char *buf, size_t size)
{
    size_t o = 0;
    for (size_t i = 0; i < len && o + 8 < size; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x20 && ch < 0x7f) {
            buf[o++] = (char)ch;
        } else {
            o += (size_t)snprintf(buf + o, size - o, "\\x%02x", ch);
        }
    }
    if (o + 8 >= size) {
        o = size - 8;
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
    return buf;
}

/* ---- The daemons of this process ---- */

static itest_daemon_t *g_daemons[ITEST_MAX_DAEMONS];
static int g_ndaemons;
static pid_t g_owner;
static bool g_atexit_set;

const char *itest_slotd_bin(void)
{
    const char *bin = getenv("SLOTD_BIN");
    ck_assert_msg(bin != NULL && bin[0] != '\0',
                  "SLOTD_BIN is not set (CTest sets it to the built slotd)");
    return bin;
}

void itest_daemon_print_log(const itest_daemon_t *d, const char *why)
{
    size_t len = 0;
    char *text = slurp(d->log, &len);
    fprintf(stderr, "---- slotd log (pid %d, port %d, admin %d): %s ----\n", (int)d->pid, d->port,
            d->admin_port, why);
    if (text != NULL) {
        fwrite(text, 1, len, stderr);
        if (len > 0 && text[len - 1] != '\n') {
            fputc('\n', stderr);
        }
    } else {
        fprintf(stderr, "(no log at %s)\n", d->log);
    }
    fprintf(stderr, "---- end of slotd log ----\n");
    free(text);

    /* A wrapper's log (valgrind --log-file=%q{SLOTD_ITEST_DIR}/...) beside it. */
    char dir[sizeof(d->log)];
    snprintf(dir, sizeof(dir), "%s", d->log);
    char *slash = strrchr(dir, '/');
    DIR *dh = NULL;
    if (slash != NULL) {
        *slash = '\0';
        dh = opendir(dir);
    }
    struct dirent *e;
    while (dh != NULL && (e = readdir(dh)) != NULL) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, "pid") == 0 ||
            strcmp(e->d_name, "slotd.log") == 0) {
            continue;
        }
        char path[600];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        size_t n = 0;
        char *other = slurp(path, &n);
        fprintf(stderr, "---- %s ----\n", e->d_name);
        if (other != NULL) {
            fwrite(other, 1, n, stderr);
            if (n > 0 && other[n - 1] != '\n') {
                fputc('\n', stderr);
            }
        }
        fprintf(stderr, "---- end of %s ----\n", e->d_name);
        free(other);
    }
    if (dh != NULL) {
        closedir(dh);
    }
    fflush(stderr);
}

int64_t itest_daemon_rss_kib(const itest_daemon_t *d)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)d->pid);
    char *text = slurp(path, NULL);
    if (text == NULL) {
        return -1;
    }
    int64_t kib = -1;
    const char *p = strstr(text, "\nVmRSS:");
    if (p != NULL) {
        long long v = 0;
        if (sscanf(p + 7, " %lld", &v) == 1) {
            kib = v;
        }
    }
    free(text);
    return kib;
}

/* The directory of this test case, made by the parent before the fork
 * (case_setup), so that it can clean up after a child that died. */
static char g_run_dir[200];

/* A new directory "<run dir>/<prefix>XXXXXX" into `out`. */
static void make_dir(char *out, size_t size, const char *prefix)
{
    const char *tmp = getenv("TMPDIR");
    if (g_run_dir[0] != '\0') {
        snprintf(out, size, "%s/%sXXXXXX", g_run_dir, prefix);
    } else {
        snprintf(out, size, "%s/slotd-itest-%sXXXXXX", tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp",
                 prefix);
    }
    ck_assert_msg(mkdtemp(out) != NULL, "mkdtemp(%s): %s", out, strerror(errno));
}

/* Removes the files of a directory (one level) and the directory. */
static void remove_dir(const char *path)
{
    DIR *dir = opendir(path);
    if (dir != NULL) {
        struct dirent *e;
        while ((e = readdir(dir)) != NULL) {
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
                char file[512];
                snprintf(file, sizeof(file), "%s/%s", path, e->d_name);
                unlink(file);
            }
        }
        closedir(dir);
    }
    rmdir(path);
}

static void remove_files(itest_daemon_t *d)
{
    if (d->dir[0] == '\0') {
        return;
    }
    remove_dir(d->dir);
    d->dir[0] = '\0';
}

static void reap(itest_daemon_t *d, int status)
{
    d->reaped = true;
    d->status = status;
}

/* At exit of the test process: a daemon still running means the test did
 * not get to its teardown.  In fork mode a failed assertion leaves with
 * _exit and the parent's case_teardown() does this; without fork (CK_FORK=no)
 * the process exits normally at the end and this hook does it. */
static void kill_leftovers(void)
{
    if (getpid() != g_owner) {
        return;
    }
    for (int i = 0; i < g_ndaemons; i++) {
        itest_daemon_t *d = g_daemons[i];
        if (d == NULL) {
            continue;
        }
        if (!d->reaped) {
            kill(d->pid, SIGKILL);
            int status = 0;
            while (waitpid(d->pid, &status, 0) < 0 && errno == EINTR) {
            }
            reap(d, status);
            itest_daemon_print_log(d, "the test ended with the daemon running (killed)");
        }
        remove_files(d);
    }
}

static void register_daemon(itest_daemon_t *d)
{
    if (!g_atexit_set || g_owner != getpid()) {
        g_owner = getpid();
        g_ndaemons = 0;
        if (!g_atexit_set) {
            atexit(kill_leftovers);
            g_atexit_set = true;
        }
    }
    ck_assert_msg(g_ndaemons < ITEST_MAX_DAEMONS, "too many daemons in one test");
    g_daemons[g_ndaemons++] = d;
}

/* A free loopback port: bind port 0, read it back, close.  The daemon binds
 * it a moment later; a collision in between is retried by the caller. */
int itest_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = 0;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    socklen_t sl = sizeof(sa);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

static bool port_accepts(int port)
{
    itest_conn_t *c = itest_try_connect(port);
    if (c == NULL) {
        return false;
    }
    itest_close(c);
    return true;
}

/* RLIMIT_NOFILE of the daemons started next; 0 for the test's own. */
static long daemon_nofile;

void itest_daemon_nofile(long n)
{
    daemon_nofile = n;
}

/* Runs argv[0] with the given descriptors as 0, 1 and 2 and, if `nofile` is
 * above 0, that RLIMIT_NOFILE (soft and hard). */
static pid_t spawn(const char *const *argv, int in_fd, int out_fd, int err_fd, long nofile)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) {
            _exit(126);
        }
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        if (in_fd >= 0) {
            dup2(in_fd, 0);
        }
        dup2(out_fd, 1);
        dup2(err_fd, 2);
        for (int fd = 3; fd < 1024; fd++) {
            close(fd);
        }
        if (nofile > 0) {
            struct rlimit rl = {.rlim_cur = (rlim_t)nofile, .rlim_max = (rlim_t)nofile};
            if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
                _exit(125);
            }
        }
        execvp(argv[0], (char *const *)argv); /* a path, or a wrapper found on PATH */
        _exit(127);
    }
    return pid;
}

/* The probes of start_once() are connections too: a slow daemon (under
 * valgrind) may not have seen them close yet, and they would count against
 * a small --max-connections.  Waits (until `deadline` at most) for the
 * admin port's /stats to show no session connection.  Best effort: a test
 * that cares about the figure checks it itself. */
static void settle_probes(const itest_daemon_t *d, int64_t deadline)
{
    static const char req[] = "GET /stats HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    int64_t cap = itest_now_ms() + itest_scale_ms(2000);
    if (cap < deadline) {
        deadline = cap;
    }
    while (itest_now_ms() < deadline) {
        itest_http_t r;
        bool ok = itest_http_raw(d->admin_port, req, sizeof(req) - 1, &r);
        cJSON *st = ok && r.status == 200 ? cJSON_ParseWithLength(r.body, r.body_len) : NULL;
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(st, "connections");
        /* 401: a daemon with a token (--auth-token-file) keeps its
         * figures to itself; there is nothing to wait for. */
        bool settled = (cJSON_IsNumber(n) && n->valuedouble == 0) || r.status == 401;
        cJSON_Delete(st);
        itest_http_free(&r);
        if (settled || !ok) {
            return;
        }
        itest_sleep_ms(10);
    }
}

/* One attempt.  Returns the daemon, or NULL after a port collision (the
 * daemon exited on its own and said so); fails the test otherwise. */
static itest_daemon_t *start_once(const char *const *flags, bool last_attempt)
{
    (void)itest_slotd_bin(); /* fails before any directory is made */
    itest_daemon_t *d = calloc(1, sizeof(*d));
    ck_assert_ptr_nonnull(d);
    make_dir(d->dir, sizeof(d->dir), "d-");
    snprintf(d->log, sizeof(d->log), "%s/slotd.log", d->dir);

    d->port = itest_free_port();
    do {
        d->admin_port = itest_free_port();
    } while (d->admin_port == d->port);

    char port[16], admin[16];
    snprintf(port, sizeof(port), "%d", d->port);
    snprintf(admin, sizeof(admin), "%d", d->admin_port);
    const char *argv[2 * ITEST_MAX_FLAGS + 8];
    int argc = 0;
    /* SLOTD_WRAPPER's words first (valgrind and its options). */
    char wrapper[1024] = "";
    if (itest_wrapped()) {
        snprintf(wrapper, sizeof(wrapper), "%s", getenv("SLOTD_WRAPPER"));
        char *save = NULL;
        for (char *w = strtok_r(wrapper, " \t", &save); w != NULL;
             w = strtok_r(NULL, " \t", &save)) {
            ck_assert_msg(argc < ITEST_MAX_FLAGS, "SLOTD_WRAPPER has too many words");
            argv[argc++] = w;
        }
    }
    setenv("SLOTD_ITEST_DIR", d->dir, 1); /* inherited by the daemon (and its wrapper) */
    argv[argc++] = itest_slotd_bin();
    argv[argc++] = "--listen";
    argv[argc++] = "127.0.0.1";
    argv[argc++] = "--port";
    argv[argc++] = port;
    argv[argc++] = "--admin-port";
    argv[argc++] = admin;
    for (int i = 0; flags != NULL && flags[i] != NULL; i++) {
        ck_assert_int_lt(argc, 2 * ITEST_MAX_FLAGS);
        argv[argc++] = flags[i];
    }
    argv[argc] = NULL;

    int log_fd = open(d->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ck_assert_int_ge(log_fd, 0);
    int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    ck_assert_int_ge(null_fd, 0);
    d->pid = spawn(argv, null_fd, log_fd, log_fd, daemon_nofile);
    close(log_fd);
    close(null_fd);
    register_daemon(d);
    /* For the parent's clean-up, should this process die first. */
    char pid_path[400];
    snprintf(pid_path, sizeof(pid_path), "%s/pid", d->dir);
    FILE *pf = fopen(pid_path, "w");
    if (pf != NULL) {
        fprintf(pf, "%d %d %d\n", (int)d->pid, d->port, d->admin_port);
        fclose(pf);
    }

    int64_t deadline = itest_now_ms() + itest_scale_ms(ITEST_START_MS);
    while (itest_now_ms() < deadline) {
        if (!itest_daemon_alive(d)) {
            char *text = slurp(d->log, NULL);
            bool collision = text != NULL && (contains_nocase(text, "in use") ||
                                              contains_nocase(text, "EADDRINUSE"));
            free(text);
            if (collision && !last_attempt) {
                remove_files(d);
                return NULL;
            }
            itest_daemon_print_log(d, "the daemon exited while starting");
            remove_files(d);
            ck_abort_msg("slotd exited while starting (wait status 0x%x)", (unsigned)d->status);
        }
        if (port_accepts(d->port) && port_accepts(d->admin_port)) {
            settle_probes(d, deadline);
            return d;
        }
        itest_sleep_ms(20);
    }
    kill(d->pid, SIGKILL);
    int status = 0;
    while (waitpid(d->pid, &status, 0) < 0 && errno == EINTR) {
    }
    reap(d, status);
    itest_daemon_print_log(d, "the daemon did not accept connections in time (killed)");
    remove_files(d);
    ck_abort_msg("slotd did not accept on ports %d and %d within %d ms", d->port, d->admin_port,
                 itest_scale_ms(ITEST_START_MS));
    return NULL;
}

itest_daemon_t *itest_daemon_startv(const char *const *flags)
{
    for (int attempt = 0; attempt < ITEST_START_ATTEMPTS; attempt++) {
        itest_daemon_t *d = start_once(flags, attempt == ITEST_START_ATTEMPTS - 1);
        if (d != NULL) {
            return d;
        }
    }
    ck_abort_msg("slotd could not be started");
    return NULL;
}

itest_daemon_t *itest_daemon_start(const char *flag, ...)
{
    const char *flags[ITEST_MAX_FLAGS + 1];
    int n = 0;
    va_list ap;
    va_start(ap, flag);
    for (const char *f = flag; f != NULL; f = va_arg(ap, const char *)) {
        ck_assert_int_lt(n, ITEST_MAX_FLAGS);
        flags[n++] = f;
    }
    va_end(ap);
    flags[n] = NULL;
    return itest_daemon_startv(flags);
}

bool itest_daemon_alive(itest_daemon_t *d)
{
    if (d->reaped) {
        return false;
    }
    int status = 0;
    pid_t r = waitpid(d->pid, &status, WNOHANG);
    if (r == d->pid) {
        reap(d, status);
        return false;
    }
    return true;
}

void itest_daemon_signal(itest_daemon_t *d, int sig)
{
    if (itest_daemon_alive(d)) {
        kill(d->pid, sig);
    }
}

static int exit_code(int status)
{
    if (WIFEXITED(status)) {
        return WEXITSTATUS(status);
    }
    if (WIFSIGNALED(status)) {
        return 128 + WTERMSIG(status);
    }
    return -1;
}

int itest_daemon_wait(itest_daemon_t *d, int timeout_ms)
{
    int64_t deadline = itest_now_ms() + timeout_ms;
    while (itest_daemon_alive(d)) {
        if (itest_now_ms() >= deadline) {
            kill(d->pid, SIGKILL);
            int status = 0;
            while (waitpid(d->pid, &status, 0) < 0 && errno == EINTR) {
            }
            reap(d, status);
            itest_daemon_print_log(d, "the daemon hung and was killed");
            remove_files(d);
            ck_abort_msg("slotd (pid %d) did not exit within %d ms; killed with SIGKILL",
                         (int)d->pid, timeout_ms);
        }
        itest_sleep_ms(10);
    }
    int code = exit_code(d->status);
    if (code != 0 && itest_wrapped()) {
        /* Under valgrind (--error-exitcode) a non-zero status is its verdict. */
        itest_daemon_print_log(d, "the daemon, run under SLOTD_WRAPPER, exited with a non-zero "
                                  "status");
    }
    return code;
}

int itest_daemon_stop(itest_daemon_t *d)
{
    itest_daemon_signal(d, SIGTERM);
    return itest_daemon_wait(d, ITEST_STOP_MS);
}

void itest_teardown(void)
{
    int bad = 0;
    char what[256] = "";
    if (g_owner != getpid()) {
        return;
    }
    for (int i = 0; i < g_ndaemons; i++) {
        itest_daemon_t *d = g_daemons[i];
        if (d == NULL) {
            continue;
        }
        if (!d->reaped) {
            int code = itest_daemon_stop(d);
            if (code != 0) {
                if (!itest_wrapped()) { /* itest_daemon_wait() printed it then */
                    itest_daemon_print_log(d, "the daemon did not exit with status 0 on SIGTERM");
                }
                if (bad++ == 0) {
                    snprintf(what, sizeof(what),
                             "slotd (pid %d) exited with %d on SIGTERM at teardown, not 0",
                             (int)d->pid, code);
                }
            }
        }
        remove_files(d);
        free(d);
        g_daemons[i] = NULL;
    }
    g_ndaemons = 0;
    ck_assert_msg(bad == 0, "%s", what);
    itest_soft_verdict();
}

/* Unchecked setup, in the parent: the case's directory. */
static void case_setup(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(g_run_dir, sizeof(g_run_dir), "%s/slotd-itest-XXXXXX",
             tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    if (mkdtemp(g_run_dir) == NULL) {
        g_run_dir[0] = '\0';
    }
}

/* True if `pid` runs the slotd executable (so that a reused pid is left
 * alone). */
static bool is_our_daemon(pid_t pid)
{
    char path[64], exe[512];
    snprintf(path, sizeof(path), "/proc/%d/exe", (int)pid);
    ssize_t n = readlink(path, exe, sizeof(exe) - 1);
    if (n <= 0) {
        return false;
    }
    exe[n] = '\0';
    const char *bin = getenv("SLOTD_BIN");
    char real[512];
    if (bin != NULL && realpath(bin, real) != NULL && strcmp(real, exe) == 0) {
        return true;
    }
    if (bin == NULL || !itest_wrapped()) {
        return false;
    }
    /* Under a wrapper the executable is the wrapper's: look for SLOTD_BIN
     * among the arguments. */
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    size_t len = 0;
    char *cmd = slurp(path, &len);
    bool found = false;
    for (size_t o = 0; cmd != NULL && o < len; o += strlen(cmd + o) + 1) {
        found = found || strcmp(cmd + o, bin) == 0;
    }
    free(cmd);
    return found;
}

/* Unchecked teardown, in the parent, after the forked test ended however it
 * ended.  A daemon directory still there belongs to a test that did not
 * reach its teardown (a failed assertion leaves with _exit, a timeout with
 * SIGKILL): the daemon has been killed with its test (PR_SET_PDEATHSIG) or
 * is killed here; its log is printed; the files go. */
static void case_teardown(void)
{
    if (g_run_dir[0] == '\0') {
        return;
    }
    DIR *dir = opendir(g_run_dir);
    struct dirent *e;
    while (dir != NULL && (e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.') {
            continue;
        }
        char sub[256], path[300];
        snprintf(sub, sizeof(sub), "%.150s/%.100s", g_run_dir, e->d_name);
        if (strncmp(e->d_name, "d-", 2) == 0) {
            itest_daemon_t d;
            memset(&d, 0, sizeof(d));
            snprintf(path, sizeof(path), "%.256s/pid", sub);
            char *pid_text = slurp(path, NULL);
            int pid = 0;
            if (pid_text != NULL) {
                sscanf(pid_text, "%d %d %d", &pid, &d.port, &d.admin_port);
            }
            d.pid = (pid_t)pid;
            free(pid_text);
            for (int i = 0; d.pid > 0 && i < 200 && kill(d.pid, 0) == 0; i++) {
                itest_sleep_ms(10);
            }
            if (d.pid > 0 && kill(d.pid, 0) == 0 && is_our_daemon(d.pid)) {
                kill(d.pid, SIGKILL);
            }
            snprintf(d.log, sizeof(d.log), "%.256s/slotd.log", sub);
            itest_daemon_print_log(&d, "the test ended without stopping this daemon");
        }
        remove_dir(sub);
    }
    if (dir != NULL) {
        closedir(dir);
    }
    rmdir(g_run_dir);
    g_run_dir[0] = '\0';
}

void itest_fixtures(TCase *tc)
{
    tcase_add_unchecked_fixture(tc, case_setup, case_teardown);
    tcase_add_checked_fixture(tc, NULL, itest_teardown);
}

int itest_repeats(int all)
{
    const char *v = getenv("SLOTD_TEST_REPEATS");
    char *end;
    long n;

    if (v == NULL)
        return all;
    n = strtol(v, &end, 10);
    ck_assert_msg(end != v && *end == '\0' && n > 0,
                  "SLOTD_TEST_REPEATS must be a positive number, not \"%s\"", v);
    return n < all ? (int)n : all;
}

TCase *itest_add_timeout(Suite *s, const char *name, const TTest *fn, int seconds)
{
    TCase *tc = tcase_create(name);
    itest_fixtures(tc);
    tcase_set_timeout(tc, seconds * itest_time_scale());
    tcase_add_test(tc, fn);
    suite_add_tcase(s, tc);
    return tc;
}

TCase *itest_add(Suite *s, const char *name, const TTest *fn)
{
    return itest_add_timeout(s, name, fn, ITEST_CASE_TIMEOUT);
}

long itest_raise_nofile(long want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        return -1;
    }
    if (rl.rlim_cur != RLIM_INFINITY && (long)rl.rlim_cur < want) {
        rlim_t target = (rlim_t)want;
        if (rl.rlim_max != RLIM_INFINITY && target > rl.rlim_max) {
            target = rl.rlim_max;
        }
        rl.rlim_cur = target;
        setrlimit(RLIMIT_NOFILE, &rl);
        getrlimit(RLIMIT_NOFILE, &rl);
    }
    return rl.rlim_cur == RLIM_INFINITY ? want : (long)rl.rlim_cur;
}

int itest_main(Suite *s)
{
    signal(SIGPIPE, SIG_IGN);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}

/* ---- Connections ---- */

struct itest_conn {
    int fd;
    char *buf; /* bytes received, not yet returned */
    size_t len;
    size_t cap;
    bool closed; /* the peer closed or reset: no more bytes will come */
    itest_io_t io;
    char *last; /* the last line handed out by itest_rpc()/itest_read_reply() */
};

itest_conn_t *itest_try_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return NULL;
    }
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons((uint16_t)port);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return NULL;
    }
    itest_conn_t *c = calloc(1, sizeof(*c));
    ck_assert_ptr_nonnull(c);
    c->fd = fd;
    c->cap = 65536;
    c->buf = malloc(c->cap);
    ck_assert_ptr_nonnull(c->buf);
    return c;
}

itest_conn_t *itest_connect(const itest_daemon_t *d)
{
    itest_conn_t *c = itest_try_connect(d->port);
    ck_assert_msg(c != NULL, "connect to 127.0.0.1:%d: %s", d->port, strerror(errno));
    return c;
}

void itest_close(itest_conn_t *c)
{
    if (c == NULL) {
        return;
    }
    close(c->fd);
    free(c->buf);
    free(c->last);
    free(c);
}

void itest_close_reset(itest_conn_t *c)
{
    if (c == NULL) {
        return;
    }
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    itest_close(c);
}

void itest_shutdown_write(itest_conn_t *c)
{
    shutdown(c->fd, SHUT_WR);
}

int itest_conn_fd(const itest_conn_t *c)
{
    return c->fd;
}

itest_io_t itest_last_io(const itest_conn_t *c)
{
    return c->io;
}

size_t itest_pending(const itest_conn_t *c)
{
    return c->len;
}

/* Reads what is available (the socket is readable) into the buffer. */
static void fill(itest_conn_t *c)
{
    if (c->cap - c->len < 16384) {
        size_t ncap = c->cap * 2;
        char *nb = realloc(c->buf, ncap);
        ck_assert_ptr_nonnull(nb);
        c->buf = nb;
        c->cap = ncap;
    }
    ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, MSG_DONTWAIT);
    if (n > 0) {
        c->len += (size_t)n;
    } else if (n == 0) {
        c->closed = true;
        c->io = ITEST_IO_EOF;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        c->closed = true;
        c->io = ITEST_IO_RESET;
    }
}

bool itest_send(itest_conn_t *c, const void *data, size_t len)
{
    const char *p = data;
    size_t off = 0;
    int64_t deadline = itest_now_ms() + ITEST_REPLY_MS;
    while (off < len) {
        int64_t left = deadline - itest_now_ms();
        if (left <= 0) {
            return false;
        }
        struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
        if (!c->closed) {
            pfd.events |= POLLIN;
        }
        int r = poll(&pfd, 1, (int)left);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            continue;
        }
        if ((pfd.revents & (POLLIN | POLLHUP | POLLERR)) && !c->closed) {
            fill(c);
        }
        if (pfd.revents & POLLOUT) {
            ssize_t n = send(c->fd, p + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
                off += (size_t)n;
                deadline = itest_now_ms() + ITEST_REPLY_MS;
            } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                return false;
            }
        } else if (pfd.revents & (POLLERR | POLLHUP)) {
            return false;
        }
    }
    return true;
}

itest_conn_t *itest_stall_with_stats(itest_daemon_t *d, int n, int pad, int64_t *read_lines)
{
    itest_conn_t *h = itest_connect(d);
    itest_conn_buffers(h, 0, 65536);
    size_t cap = (size_t)n * (40 + (size_t)(pad > 0 ? pad : 0)), o = 0;
    char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    for (int i = 0; i < n; i++) {
        o += (size_t)snprintf(buf + o, cap - o, "{\"op\":\"stats\",\"pad\":\"%0*d\"}\n", pad, i);
    }
    bool stalled = false;
    itest_send_noread(h, buf, o, itest_scale_ms(1000), &stalled);
    free(buf);
    ck_assert_msg(stalled, "the daemon read all %d lines of a client that does not read", n);
    itest_conn_t *watch = itest_connect(d);
    *read_lines = itest_stat(watch, "requests_total") - 1;
    itest_close(watch);
    return h;
}

size_t itest_send_noread(itest_conn_t *c, const void *data, size_t len, int stall_ms, bool *stalled)
{
    const char *p = data;
    size_t off = 0;
    int64_t last = itest_now_ms();
    if (stalled != NULL) {
        *stalled = false;
    }
    while (off < len) {
        ssize_t n = send(c->fd, p + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            last = itest_now_ms();
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            c->closed = true;
            c->io = ITEST_IO_RESET;
            break;
        }
        int64_t left = last + stall_ms - itest_now_ms();
        if (left <= 0) {
            if (stalled != NULL) {
                *stalled = true;
            }
            break;
        }
        struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
        poll(&pfd, 1, (int)(left < 50 ? left : 50));
    }
    return off;
}

void itest_conn_buffers(itest_conn_t *c, int rcvbuf, int sndbuf)
{
    if (rcvbuf > 0) {
        setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    }
    if (sndbuf > 0) {
        setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    }
}

bool itest_send_str(itest_conn_t *c, const char *s)
{
    return itest_send(c, s, strlen(s));
}

bool itest_sendf(itest_conn_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = vformat(fmt, ap);
    va_end(ap);
    bool ok = itest_send(c, s, strlen(s));
    free(s);
    return ok;
}

char *itest_read_line(itest_conn_t *c, int timeout_ms, size_t *len)
{
    int64_t deadline = itest_now_ms() + timeout_ms;
    size_t scanned = 0;
    for (;;) {
        char *nl = memchr(c->buf + scanned, '\n', c->len - scanned);
        if (nl != NULL) {
            size_t n = (size_t)(nl - c->buf);
            char *line = malloc(n + 1);
            ck_assert_ptr_nonnull(line);
            memcpy(line, c->buf, n);
            line[n] = '\0';
            memmove(c->buf, nl + 1, c->len - n - 1);
            c->len -= n + 1;
            if (len != NULL) {
                *len = n;
            }
            c->io = ITEST_IO_OK;
            return line;
        }
        scanned = c->len;
        if (c->closed) {
            return NULL;
        }
        int64_t left = deadline - itest_now_ms();
        if (left <= 0) {
            c->io = ITEST_IO_TIMEOUT;
            return NULL;
        }
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        int r = poll(&pfd, 1, (int)left);
        if (r > 0) {
            fill(c);
        }
    }
}

bool itest_expect_closed(itest_conn_t *c, int timeout_ms)
{
    int64_t deadline = itest_now_ms() + timeout_ms;
    size_t before = c->len;
    while (!c->closed) {
        int64_t left = deadline - itest_now_ms();
        if (left <= 0) {
            c->io = ITEST_IO_TIMEOUT;
            return false;
        }
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        if (poll(&pfd, 1, (int)left) > 0) {
            fill(c);
        }
        if (c->len != before) {
            return false;
        }
    }
    return c->len == before;
}

bool itest_expect_silence(itest_conn_t *c, int ms)
{
    int64_t deadline = itest_now_ms() + ms;
    size_t before = c->len;
    while (!c->closed && c->len == before) {
        int64_t left = deadline - itest_now_ms();
        if (left <= 0) {
            break;
        }
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        if (poll(&pfd, 1, (int)left) > 0) {
            fill(c);
        }
    }
    return c->len == before;
}

const char *itest_last_line(const itest_conn_t *c)
{
    return c->last != NULL ? c->last : "";
}

static cJSON *read_reply_after(itest_conn_t *c, const char *request, size_t reqlen)
{
    size_t len = 0;
    char *line = itest_read_line(c, ITEST_REPLY_MS, &len);
    char shown_req[400];
    if (request != NULL) {
        shown(request, reqlen, shown_req, sizeof(shown_req));
    } else {
        snprintf(shown_req, sizeof(shown_req), "(earlier request)");
    }
    if (line == NULL) {
        char partial[200];
        ck_abort_msg("no reply line to %s: %s (partial bytes: \"%s\")", shown_req,
                     c->io == ITEST_IO_TIMEOUT ? "timed out"
                     : c->io == ITEST_IO_EOF   ? "connection closed"
                                               : "connection reset",
                     shown(c->buf, c->len, partial, sizeof(partial)));
    }
    free(c->last);
    c->last = line;
    cJSON *j = cJSON_ParseWithLength(line, len);
    char shown_line[400];
    ck_assert_msg(j != NULL && cJSON_IsObject(j), "reply to %s is not a JSON object: \"%s\"",
                  shown_req, shown(line, len, shown_line, sizeof(shown_line)));
    return j;
}

cJSON *itest_read_reply(itest_conn_t *c)
{
    return read_reply_after(c, NULL, 0);
}

cJSON *itest_rpc(itest_conn_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *req = vformat(fmt, ap);
    va_end(ap);
    size_t n = strlen(req);
    char *line = malloc(n + 2);
    ck_assert_ptr_nonnull(line);
    memcpy(line, req, n);
    line[n] = '\n';
    line[n + 1] = '\0';
    char shown_req[400];
    ck_assert_msg(itest_send(c, line, n + 1), "could not send %s",
                  shown(req, n, shown_req, sizeof(shown_req)));
    free(line);
    cJSON *j = read_reply_after(c, req, n);
    free(req);
    return j;
}

/* ---- Checking replies ---- */

static const cJSON *member_path(const cJSON *obj, const char *name)
{
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", name);
    const cJSON *cur = obj;
    char *save = NULL;
    for (char *part = strtok_r(buf, ".", &save); part != NULL; part = strtok_r(NULL, ".", &save)) {
        if (!cJSON_IsObject(cur)) {
            return NULL;
        }
        cur = cJSON_GetObjectItemCaseSensitive(cur, part);
        if (cur == NULL) {
            return NULL;
        }
    }
    return cur;
}

static const char *printed(const cJSON *j, char *buf, size_t size)
{
    char *s = j != NULL ? cJSON_PrintUnformatted(j) : NULL;
    snprintf(buf, size, "%s", s != NULL ? s : "(null)");
    if (strlen(buf) == size - 1 && size > 4) {
        memcpy(buf + size - 4, "...", 4);
    }
    free(s);
    return buf;
}

int64_t itest_int(const cJSON *obj, const char *name)
{
    const cJSON *v = member_path(obj, name);
    char buf[600];
    ck_assert_msg(v != NULL, "reply has no \"%s\": %s", name, printed(obj, buf, sizeof(buf)));
    ck_assert_msg(cJSON_IsNumber(v) && isfinite(v->valuedouble) &&
                      v->valuedouble == floor(v->valuedouble),
                  "\"%s\" is not an integer in %s", name, printed(obj, buf, sizeof(buf)));
    return (int64_t)v->valuedouble;
}

const char *itest_str(const cJSON *obj, const char *name)
{
    const cJSON *v = member_path(obj, name);
    char buf[600];
    ck_assert_msg(cJSON_IsString(v), "reply has no string \"%s\": %s", name,
                  printed(obj, buf, sizeof(buf)));
    return v->valuestring;
}

const char *itest_error_code(const cJSON *reply)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(reply, "error");
    if (!cJSON_IsObject(e)) {
        return NULL;
    }
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(e, "code");
    return cJSON_IsString(code) ? code->valuestring : "(code not a string)";
}

bool itest_is_error(const cJSON *reply, const char *code)
{
    const char *got = itest_error_code(reply);
    return got != NULL && strcmp(got, code) == 0;
}

void itest_expect_tag(const cJSON *reply, const char *tag_json)
{
    const cJSON *tag = cJSON_GetObjectItemCaseSensitive(reply, "tag");
    char buf[600];
    if (tag_json == NULL) {
        ck_assert_msg(tag == NULL, "reply has a tag but the request had none: %s",
                      printed(reply, buf, sizeof(buf)));
        return;
    }
    cJSON *want = cJSON_Parse(tag_json);
    ck_assert_ptr_nonnull(want);
    ck_assert_msg(tag != NULL && cJSON_Compare(tag, want, true),
                  "reply does not echo the tag %s: %s", tag_json, printed(reply, buf, sizeof(buf)));
    cJSON_Delete(want);
}

static bool word_char(char ch)
{
    return isalnum((unsigned char)ch) || ch == '_';
}

/* True if `msg` contains `w`; a name of one or two characters ("n", "op",
 * an id "a") must stand as a word of its own, or any message would do. */
static bool message_names(const char *msg, const char *w)
{
    size_t n = strlen(w);
    for (const char *p = strstr(msg, w); p != NULL; p = strstr(p + 1, w)) {
        if (n > 2) {
            return true;
        }
        bool left = p == msg || !word_char(p[-1]);
        bool right = !word_char(p[n]);
        if (left && right) {
            return true;
        }
    }
    return false;
}

/* The checks of itest_expect_error(): true, or false with the reason. */
static bool check_error_v(const cJSON *reply, const char *tag_json, const char *code, va_list ap,
                          char *why, size_t size)
{
    char buf[600];
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(reply, "error");
    if (!cJSON_IsObject(e)) {
        snprintf(why, size, "expected error %s, got %s", code, printed(reply, buf, sizeof(buf)));
        return false;
    }
    const char *got = itest_error_code(reply);
    if (strcmp(got, code) != 0) {
        snprintf(why, size, "expected error %s, got %s", code, printed(reply, buf, sizeof(buf)));
        return false;
    }
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(e, "message");
    if (!cJSON_IsString(msg)) {
        snprintf(why, size, "error reply without a string message: %s",
                 printed(reply, buf, sizeof(buf)));
        return false;
    }
    for (const char *w = va_arg(ap, const char *); w != NULL; w = va_arg(ap, const char *)) {
        if (!message_names(msg->valuestring, w)) {
            snprintf(why, size, "%s message does not name \"%s\": %s", code, w,
                     printed(reply, buf, sizeof(buf)));
            return false;
        }
    }
    const cJSON *tag = cJSON_GetObjectItemCaseSensitive(reply, "tag");
    if (tag_json == NULL && tag != NULL) {
        snprintf(why, size, "reply has a tag but the request had no valid one: %s",
                 printed(reply, buf, sizeof(buf)));
        return false;
    }
    if (tag_json != NULL) {
        cJSON *want = cJSON_Parse(tag_json);
        bool same = want != NULL && tag != NULL && cJSON_Compare(tag, want, true);
        cJSON_Delete(want);
        if (!same) {
            snprintf(why, size, "reply does not echo the tag %s: %s", tag_json,
                     printed(reply, buf, sizeof(buf)));
            return false;
        }
    }
    if (cJSON_GetArraySize(reply) != (tag_json != NULL ? 2 : 1)) {
        snprintf(why, size, "an error reply holds \"error\" and the tag only: %s",
                 printed(reply, buf, sizeof(buf)));
        return false;
    }
    return true;
}

void itest_expect_error(const cJSON *reply, const char *tag_json, const char *code, ...)
{
    char why[800];
    va_list ap;
    va_start(ap, code);
    bool ok = check_error_v(reply, tag_json, code, ap, why, sizeof(why));
    va_end(ap);
    ck_assert_msg(ok, "%s", why);
}

bool itest_error_is(const cJSON *reply, const char *tag_json, const char *code, char *why,
                    size_t size, ...)
{
    va_list ap;
    va_start(ap, size);
    bool ok = check_error_v(reply, tag_json, code, ap, why, size);
    va_end(ap);
    return ok;
}

/* ---- Failures collected over a test ---- */

static char g_soft[6000];
static size_t g_soft_len;
static int g_nsoft;

void itest_soft_fail(const char *fmt, ...)
{
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "FAILED CHECK: %s\n", msg);
    fflush(stderr);
    g_nsoft++;
    if (g_soft_len + strlen(msg) + 4 < sizeof(g_soft)) {
        g_soft_len +=
            (size_t)snprintf(g_soft + g_soft_len, sizeof(g_soft) - g_soft_len, "\n  %s", msg);
    }
}

void itest_soft_verdict(void)
{
    int n = g_nsoft;
    g_nsoft = 0;
    g_soft_len = 0;
    if (n == 0) {
        return;
    }
    /* Check carries a message of limited size: the first failures only. */
    ck_assert_msg(n == 0, "%d checks failed (each printed on stderr); the first:%.1400s", n,
                  g_soft);
}

void itest_expect_ok(const cJSON *reply)
{
    char buf[600];
    ck_assert_msg(cJSON_GetObjectItemCaseSensitive(reply, "error") == NULL,
                  "unexpected error reply: %s", printed(reply, buf, sizeof(buf)));
}

static const char *const stats_members[] = {
    "cache_entries",       "live_sessions",    "g_calls",           "rows",
    "connections",         "requests_total",   "errors_total",      "pool_bytes_total",
    "pool_bytes_used",     "pool_slots_total", "pool_slots_used",   "released.finish",
    "released.disconnect", "released.idle",    "released.shutdown", NULL,
};

void itest_check_stats_shape(const cJSON *st)
{
    itest_expect_ok(st);
    for (int i = 0; stats_members[i] != NULL; i++) {
        int64_t v = itest_int(st, stats_members[i]);
        ck_assert_msg(v >= 0, "stats member %s is negative: %lld", stats_members[i], (long long)v);
    }
    ck_assert_int_le(itest_int(st, "pool_bytes_used"), itest_int(st, "pool_bytes_total"));
    ck_assert_int_le(itest_int(st, "pool_slots_used"), itest_int(st, "pool_slots_total"));
}

cJSON *itest_stats(itest_conn_t *c)
{
    cJSON *st = itest_rpc(c, "{\"op\":\"stats\"}");
    itest_check_stats_shape(st);
    return st;
}

cJSON *itest_admin_stats(const itest_daemon_t *d)
{
    itest_http_t r;
    itest_http_get(d, "/stats", &r);
    ck_assert_msg(r.status == 200, "GET /stats: status %d, body %s", r.status, r.body);
    cJSON *st = cJSON_ParseWithLength(r.body, r.body_len);
    ck_assert_msg(cJSON_IsObject(st), "GET /stats: not a JSON object: %s", r.body);
    itest_http_free(&r);
    itest_check_stats_shape(st);
    return st;
}

int64_t itest_await_metric(const itest_daemon_t *d, const char *name, int64_t min, int timeout_ms)
{
    int64_t deadline = itest_now_ms() + itest_scale_ms(timeout_ms);
    int64_t v;
    while ((v = itest_metric(d, name)) < min) {
        ck_assert_msg(itest_now_ms() < deadline, "%s stayed at %lld < %lld for %d ms", name,
                      (long long)v, (long long)min, itest_scale_ms(timeout_ms));
        itest_sleep_ms(5);
    }
    return v;
}

cJSON *itest_await_drained(itest_conn_t *c, int timeout_ms)
{
    int64_t deadline = itest_now_ms() + itest_scale_ms(timeout_ms);
    cJSON *st = NULL;
    for (;;) {
        cJSON_Delete(st);
        st = itest_stats(c);
        if (itest_int(st, "live_sessions") == 0 && itest_int(st, "cache_entries") == 0 &&
            itest_int(st, "pool_slots_used") == 0 && itest_int(st, "pool_bytes_used") == 0) {
            return st;
        }
        if (itest_now_ms() >= deadline) {
            break;
        }
        itest_sleep_ms(10);
    }
    ck_abort_msg("the daemon did not release every session within %d ms: %s",
                 itest_scale_ms(timeout_ms), itest_last_line(c));
    return st;
}

int64_t itest_stat(itest_conn_t *c, const char *name)
{
    cJSON *st = itest_stats(c);
    int64_t v = itest_int(st, name);
    cJSON_Delete(st);
    return v;
}

int itest_raw_numbers(const char *line, const char *key, char (*out)[64], int max)
{
    char pat[80];
    snprintf(pat, sizeof(pat), "\"%s\"", key);
    const char *p = strstr(line, pat);
    if (p == NULL) {
        return -1;
    }
    p += strlen(pat);
    while (*p == ' ' || *p == '\t') {
        p++;
    }
    if (*p++ != ':') {
        return -1;
    }
    while (*p == ' ' || *p == '\t') {
        p++;
    }
    int depth = 0, count = 0;
    do {
        if (*p == '[') {
            depth++;
            p++;
        } else if (*p == ']') {
            depth--;
            p++;
        } else if (*p == ',' || *p == ' ' || *p == '\t') {
            p++;
        } else if (*p == '-' || isdigit((unsigned char)*p)) {
            size_t n = strspn(p, "-+0123456789.eE");
            if (count < max) {
                size_t k = n < 63 ? n : 63;
                memcpy(out[count], p, k);
                out[count][k] = '\0';
            }
            count++;
            p += n;
        } else {
            return -1;
        }
    } while (depth > 0);
    return count;
}

bool itest_is_six_decimals(const char *s)
{
    if (*s == '-') {
        s++;
    }
    size_t digits = strspn(s, "0123456789");
    if (digits == 0 || (digits > 1 && s[0] == '0')) {
        return false;
    }
    s += digits;
    if (*s++ != '.') {
        return false;
    }
    return strspn(s, "0123456789") == 6 && s[6] == '\0';
}

/* ---- The admin port ---- */

void itest_http_free(itest_http_t *r)
{
    free(r->head);
    free(r->body);
    memset(r, 0, sizeof(*r));
}

bool itest_http_header(const itest_http_t *r, const char *name, char *buf, size_t size)
{
    if (r->head == NULL) {
        return false;
    }
    size_t nlen = strlen(name);
    const char *line = strstr(r->head, "\r\n");
    while (line != NULL) {
        line += 2;
        if (strncasecmp(line, name, nlen) == 0 && line[nlen] == ':') {
            const char *v = line + nlen + 1;
            while (*v == ' ' || *v == '\t') {
                v++;
            }
            const char *end = strstr(v, "\r\n");
            size_t n = end != NULL ? (size_t)(end - v) : strlen(v);
            while (n > 0 && (v[n - 1] == ' ' || v[n - 1] == '\t')) {
                n--;
            }
            snprintf(buf, size, "%.*s", (int)n, v);
            return true;
        }
        line = strstr(line, "\r\n");
    }
    return false;
}

bool itest_http_raw(int port, const void *req, size_t len, itest_http_t *out)
{
    memset(out, 0, sizeof(*out));
    itest_conn_t *c = itest_try_connect(port);
    if (c == NULL) {
        return false;
    }
    itest_send(c, req, len);
    int64_t deadline = itest_now_ms() + ITEST_REPLY_MS;
    const char *end = NULL;
    size_t want = 0;
    bool have_length = false;
    for (;;) {
        if (end == NULL && c->len > 0) {
            end = find_bytes(c->buf, c->len, "\r\n\r\n");
            if (end != NULL) {
                size_t hlen = (size_t)(end - c->buf) + 2;
                out->head = malloc(hlen + 1);
                ck_assert_ptr_nonnull(out->head);
                memcpy(out->head, c->buf, hlen);
                out->head[hlen] = '\0';
                char cl[32];
                if (itest_http_header(out, "Content-Length", cl, sizeof(cl))) {
                    have_length = true;
                    want = (size_t)strtoull(cl, NULL, 10);
                }
                sscanf(out->head, "HTTP/1.%*d %d", &out->status);
            }
        }
        if (end != NULL) {
            size_t body_off = (size_t)(end - c->buf) + 4;
            if ((have_length && c->len - body_off >= want) || c->closed) {
                size_t blen = have_length && c->len - body_off >= want ? want : c->len - body_off;
                out->body = malloc(blen + 1);
                ck_assert_ptr_nonnull(out->body);
                memcpy(out->body, c->buf + body_off, blen);
                out->body[blen] = '\0';
                out->body_len = blen;
                break;
            }
        } else if (c->closed) {
            break;
        }
        int64_t left = deadline - itest_now_ms();
        if (left <= 0) {
            break;
        }
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        if (poll(&pfd, 1, (int)left) > 0) {
            /* fill() may move the buffer: `end` is kept as an offset. */
            size_t end_off = end != NULL ? (size_t)(end - c->buf) : 0;
            fill(c);
            if (end != NULL) {
                end = c->buf + end_off;
            }
        }
    }
    itest_close(c);
    if (out->body == NULL) {
        out->body = xstrdup("");
    }
    return out->status != 0;
}

void itest_http_get(const itest_daemon_t *d, const char *path, itest_http_t *out)
{
    char req[512];
    int n = snprintf(req, sizeof(req),
                     "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n", path,
                     d->admin_port);
    ck_assert_msg(itest_http_raw(d->admin_port, req, (size_t)n, out),
                  "no HTTP response to GET %s on the admin port %d", path, d->admin_port);
}

/* ---- Other processes ---- */

int itest_run(const char *const *argv, const void *input, size_t len, char **out, char **err,
              int timeout_ms)
{
    char dir[256];
    make_dir(dir, sizeof(dir), "r-");
    char in_path[300], out_path[300], err_path[300];
    snprintf(in_path, sizeof(in_path), "%s/stdin", dir);
    snprintf(out_path, sizeof(out_path), "%s/stdout", dir);
    snprintf(err_path, sizeof(err_path), "%s/stderr", dir);

    int in_fd = open(in_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ck_assert_int_ge(in_fd, 0);
    if (len > 0) {
        ck_assert_int_eq(write(in_fd, input, len), (ssize_t)len);
    }
    lseek(in_fd, 0, SEEK_SET);
    int out_fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int err_fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ck_assert_int_ge(out_fd, 0);
    ck_assert_int_ge(err_fd, 0);
    pid_t pid = spawn(argv, in_fd, out_fd, err_fd, 0);
    close(in_fd);
    close(out_fd);
    close(err_fd);

    int status = 0, code = -1;
    int64_t deadline = itest_now_ms() + timeout_ms;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            code = exit_code(status);
            break;
        }
        if (itest_now_ms() >= deadline) {
            kill(pid, SIGKILL);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
            }
            code = -1;
            break;
        }
        itest_sleep_ms(10);
    }
    if (out != NULL) {
        *out = slurp(out_path, NULL);
        if (*out == NULL) {
            *out = xstrdup("");
        }
    }
    if (err != NULL) {
        *err = slurp(err_path, NULL);
        if (*err == NULL) {
            *err = xstrdup("");
        }
    }
    remove_dir(dir);
    return code;
}

/* ---- The uncached reference ---- */

const model_t *itest_model(const char *preset)
{
    static struct {
        char name[16];
        model_t *m;
    } cache[8];
    for (int i = 0; i < 8; i++) {
        if (cache[i].m != NULL && strcmp(cache[i].name, preset) == 0) {
            return cache[i].m;
        }
    }
    for (int i = 0; i < 8; i++) {
        if (cache[i].m == NULL) {
            int rc = model_create(preset, &cache[i].m);
            ck_assert_msg(rc == SLOTD_OK, "model_create(%s): %s", preset, slotd_strerror(rc));
            snprintf(cache[i].name, sizeof(cache[i].name), "%s", preset);
            return cache[i].m;
        }
    }
    ck_abort_msg("too many models");
    return NULL;
}

void itest_reference(const char *preset, const int64_t *tokens, size_t n, int64_t steps,
                     uint32_t *out_tokens, double *logits)
{
    const model_t *m = itest_model(preset);
    slotd_error_t err = {0};
    uint64_t rows = 0;
    double *lg = model_family(m) == MODEL_FAMILY_ATTN ? logits : NULL;
    int rc = model_generate(m, tokens, n, steps, false, NULL, NULL, out_tokens, lg, &rows, &err);
    ck_assert_msg(rc == SLOTD_OK, "reference model_generate(%s, n=%zu, steps=%lld): %s (%s)",
                  preset, n, (long long)steps, slotd_err_name(rc), err.message);
}

void itest_expect_logits(const char *line, const double *ref, size_t count)
{
    char buf[300];
    char(*raw)[64] = malloc((count > 0 ? count : 1) * sizeof(*raw));
    ck_assert_ptr_nonnull(raw);
    int got = itest_raw_numbers(line, "logits", raw, (int)count);
    ck_assert_msg(got == (int)count, "expected %zu logits, the reply has %d: %s", count, got,
                  shown(line, strlen(line), buf, sizeof(buf)));
    for (size_t i = 0; i < count; i++) {
        char want[64];
        snprintf(want, sizeof(want), "%.6f", ref[i]);
        ck_assert_msg(itest_is_six_decimals(raw[i]), "logit %zu \"%s\" is not printed %%.6f", i,
                      raw[i]);
        ck_assert_msg(strcmp(raw[i], want) == 0, "logit %zu: wire %s, uncached reference %s, in %s",
                      i, raw[i], want, shown(line, strlen(line), buf, sizeof(buf)));
    }
    free(raw);
}

void itest_reference_logits(const char *preset, const int64_t *tokens, size_t n, double *logits)
{
    const model_t *m = itest_model(preset);
    slotd_error_t err = {0};
    uint64_t rows = 0;
    int rc = model_logits(m, tokens, n, NULL, NULL, logits, &rows, &err);
    ck_assert_msg(rc == SLOTD_OK, "reference model_logits(%s, n=%zu): %s (%s)", preset, n,
                  slotd_err_name(rc), err.message);
}

void itest_session_init(itest_session_t *s, const char *id, const char *model,
                        const int64_t *prompt, size_t n)
{
    char idbuf[sizeof(s->id)];
    snprintf(idbuf, sizeof(idbuf), "%s", id); /* `id` may be s->id */
    memset(s, 0, sizeof(*s));
    memcpy(s->id, idbuf, sizeof(idbuf));
    s->model = model;
    s->prompt = malloc((n > 0 ? n : 1) * sizeof(int64_t));
    ck_assert_ptr_nonnull(s->prompt);
    if (n > 0) {
        memcpy(s->prompt, prompt, n * sizeof(int64_t));
    }
    s->nprompt = n;
}

void itest_session_free(itest_session_t *s)
{
    free(s->prompt);
    s->prompt = NULL;
}

size_t itest_session_entries(const itest_session_t *s)
{
    return s->nprompt + s->steps;
}

char *itest_json_tokens(const int64_t *tokens, size_t n)
{
    size_t cap = n * 24 + 3;
    char *s = malloc(cap);
    ck_assert_ptr_nonnull(s);
    size_t o = 0;
    s[o++] = '[';
    for (size_t i = 0; i < n; i++) {
        o += (size_t)snprintf(s + o, cap - o, "%s%lld", i > 0 ? "," : "", (long long)tokens[i]);
    }
    s[o++] = ']';
    s[o] = '\0';
    return s;
}

void itest_session_start(itest_conn_t *c, const itest_session_t *s)
{
    char *prompt = itest_json_tokens(s->prompt, s->nprompt);
    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"%s\",\"model\":\"%s\",\"prompt\":%s}",
                         s->id, s->model, prompt);
    free(prompt);
    itest_expect_ok(r);
    ck_assert_str_eq(itest_str(r, "id"), s->id);
    ck_assert_str_eq(itest_str(r, "model"), s->model);
    ck_assert_int_eq(itest_int(r, "entries"), (int64_t)s->nprompt);
    itest_expect_tag(r, NULL);
    cJSON_Delete(r);
}

void itest_session_check_step(itest_session_t *s, const cJSON *reply, const char *line, uint32_t n,
                              const char *tag_json)
{
    const model_t *m = itest_model(s->model);
    uint32_t V = model_vocab(m);
    size_t total = s->steps + n;
    uint32_t *tokens = malloc((s->nprompt + total) * sizeof(uint32_t));
    double *logits = malloc(total * V * sizeof(double));
    ck_assert_ptr_nonnull(tokens);
    ck_assert_ptr_nonnull(logits);
    itest_reference(s->model, s->prompt, s->nprompt, (int64_t)total, tokens, logits);

    char buf[300];
    itest_expect_ok(reply);
    ck_assert_msg(strcmp(itest_str(reply, "id"), s->id) == 0, "step reply for the wrong id: %s",
                  shown(line, strlen(line), buf, sizeof(buf)));
    itest_expect_tag(reply, tag_json);
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(reply, "tokens");
    ck_assert_msg(cJSON_IsArray(tk) && cJSON_GetArraySize(tk) == (int)n,
                  "step n=%u: \"tokens\" is not an array of %u: %s", n, n,
                  shown(line, strlen(line), buf, sizeof(buf)));
    for (uint32_t i = 0; i < n; i++) {
        const cJSON *t = cJSON_GetArrayItem(tk, (int)i);
        uint32_t want = tokens[s->nprompt + s->steps + i];
        ck_assert_msg(cJSON_IsNumber(t) && t->valuedouble == (double)want,
                      "session %s (%s) step %zu: token %s, the uncached reference says %u: %s",
                      s->id, s->model, s->steps + i + 1, cJSON_IsNumber(t) ? "differs" : "missing",
                      want, shown(line, strlen(line), buf, sizeof(buf)));
    }
    const cJSON *lg = cJSON_GetObjectItemCaseSensitive(reply, "logits");
    if (model_family(m) == MODEL_FAMILY_HASH) {
        ck_assert_msg(lg == NULL, "a hash step reply has \"logits\": %s",
                      shown(line, strlen(line), buf, sizeof(buf)));
    } else {
        ck_assert_msg(cJSON_IsArray(lg) && cJSON_GetArraySize(lg) == (int)n,
                      "step n=%u: \"logits\" is not an array of %u rows: %s", n, n,
                      shown(line, strlen(line), buf, sizeof(buf)));
        for (uint32_t i = 0; i < n; i++) {
            const cJSON *row = cJSON_GetArrayItem(lg, (int)i);
            ck_assert_msg(cJSON_IsArray(row) && cJSON_GetArraySize(row) == (int)V,
                          "logits row %u is not an array of V=%u numbers: %s", i, V,
                          shown(line, strlen(line), buf, sizeof(buf)));
        }
        size_t cnt = (size_t)n * V;
        char(*raw)[64] = malloc(cnt * sizeof(*raw));
        ck_assert_ptr_nonnull(raw);
        int got = itest_raw_numbers(line, "logits", raw, (int)cnt);
        ck_assert_int_eq(got, (int)cnt);
        for (size_t i = 0; i < cnt; i++) {
            char want[64];
            snprintf(want, sizeof(want), "%.6f", logits[s->steps * V + i]);
            ck_assert_msg(itest_is_six_decimals(raw[i]), "logit \"%s\" is not printed %%.6f",
                          raw[i]);
            ck_assert_msg(strcmp(raw[i], want) == 0,
                          "session %s step %zu logit %zu: wire %s, uncached reference %s", s->id,
                          s->steps + i / V + 1, i % V, raw[i], want);
        }
        free(raw);
    }
    ck_assert_msg(itest_int(reply, "entries") == (int64_t)(s->nprompt + total),
                  "session %s: entries %lld after %zu steps on a prompt of %zu", s->id,
                  (long long)itest_int(reply, "entries"), total, s->nprompt);
    s->steps = total;
    free(tokens);
    free(logits);
}

void itest_session_step(itest_conn_t *c, itest_session_t *s, uint32_t n)
{
    cJSON *r = n == 1 ? itest_rpc(c, "{\"op\":\"step\",\"id\":\"%s\"}", s->id)
                      : itest_rpc(c, "{\"op\":\"step\",\"id\":\"%s\",\"n\":%u}", s->id, n);
    itest_session_check_step(s, r, itest_last_line(c), n, NULL);
    cJSON_Delete(r);
}

void itest_session_finish(itest_conn_t *c, const itest_session_t *s)
{
    cJSON *r = itest_rpc(c, "{\"op\":\"finish\",\"id\":\"%s\"}", s->id);
    itest_expect_ok(r);
    ck_assert_str_eq(itest_str(r, "id"), s->id);
    ck_assert_int_eq(itest_int(r, "released"), (int64_t)itest_session_entries(s));
    cJSON_Delete(r);
}

/* ---- Sessions against a reference computed once ---- */

void itest_ref_init(itest_ref_t *r, const char *id, const char *model, const int64_t *prompt,
                    size_t n, size_t max_steps)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->id, sizeof(r->id), "%s", id);
    r->model = model;
    r->nprompt = n;
    r->max_steps = max_steps;
    r->prompt = malloc((n > 0 ? n : 1) * sizeof(int64_t));
    ck_assert_ptr_nonnull(r->prompt);
    memcpy(r->prompt, prompt, n * sizeof(int64_t));
    const model_t *m = itest_model(model);
    r->vocab = model_vocab(m);
    r->tokens = malloc((n + max_steps) * sizeof(uint32_t));
    ck_assert_ptr_nonnull(r->tokens);
    if (model_family(m) == MODEL_FAMILY_ATTN) {
        r->logits = malloc((max_steps > 0 ? max_steps : 1) * r->vocab * sizeof(double));
        ck_assert_ptr_nonnull(r->logits);
    }
    itest_reference(model, prompt, n, (int64_t)max_steps, r->tokens, r->logits);
}

void itest_ref_init_like(itest_ref_t *r, const char *id, const itest_ref_t *like)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->id, sizeof(r->id), "%s", id);
    r->model = like->model;
    r->nprompt = like->nprompt;
    r->max_steps = like->max_steps;
    r->vocab = like->vocab;
    r->prompt = malloc((like->nprompt > 0 ? like->nprompt : 1) * sizeof(int64_t));
    r->tokens = malloc((like->nprompt + like->max_steps) * sizeof(uint32_t));
    ck_assert_ptr_nonnull(r->prompt);
    ck_assert_ptr_nonnull(r->tokens);
    memcpy(r->prompt, like->prompt, like->nprompt * sizeof(int64_t));
    memcpy(r->tokens, like->tokens, (like->nprompt + like->max_steps) * sizeof(uint32_t));
    if (like->logits != NULL) {
        size_t nl = (like->max_steps > 0 ? like->max_steps : 1) * like->vocab;
        r->logits = malloc(nl * sizeof(double));
        ck_assert_ptr_nonnull(r->logits);
        memcpy(r->logits, like->logits, nl * sizeof(double));
    }
}

void itest_ref_free(itest_ref_t *r)
{
    free(r->prompt);
    free(r->tokens);
    free(r->logits);
    memset(r, 0, sizeof(*r));
}

size_t itest_ref_entries(const itest_ref_t *r)
{
    return r->nprompt + r->steps;
}

char *itest_ref_start_line(const itest_ref_t *r)
{
    char *prompt = itest_json_tokens(r->prompt, r->nprompt);
    size_t cap = strlen(prompt) + strlen(r->id) + strlen(r->model) + 64;
    char *line = malloc(cap);
    ck_assert_ptr_nonnull(line);
    snprintf(line, cap, "{\"op\":\"start\",\"id\":\"%s\",\"model\":\"%s\",\"prompt\":%s}\n", r->id,
             r->model, prompt);
    free(prompt);
    return line;
}

bool itest_ref_start_ok(const itest_ref_t *r, const cJSON *reply, const char *line, char *why,
                        size_t size)
{
    char buf[300];
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(reply, "id");
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(reply, "model");
    const cJSON *entries = cJSON_GetObjectItemCaseSensitive(reply, "entries");
    if (cJSON_GetObjectItemCaseSensitive(reply, "error") != NULL || !cJSON_IsString(id) ||
        strcmp(id->valuestring, r->id) != 0 || !cJSON_IsString(model) ||
        strcmp(model->valuestring, r->model) != 0 || !cJSON_IsNumber(entries) ||
        entries->valuedouble != (double)r->nprompt ||
        cJSON_GetObjectItemCaseSensitive(reply, "tag") != NULL) {
        snprintf(why, size, "start of '%s' (%s, prompt of %zu): reply %s", r->id, r->model,
                 r->nprompt, shown(line, strlen(line), buf, sizeof(buf)));
        return false;
    }
    return true;
}

bool itest_ref_step_ok(itest_ref_t *r, const cJSON *reply, const char *line, uint32_t n, char *why,
                       size_t size)
{
    char buf[300];
    const char *sl = shown(line, strlen(line), buf, sizeof(buf));
    if (r->steps + n > r->max_steps) {
        snprintf(why, size, "session '%s': %zu steps taken, %u more pass the reference's %zu",
                 r->id, r->steps, n, r->max_steps);
        return false;
    }
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(reply, "id");
    if (cJSON_GetObjectItemCaseSensitive(reply, "error") != NULL || !cJSON_IsString(id) ||
        strcmp(id->valuestring, r->id) != 0 ||
        cJSON_GetObjectItemCaseSensitive(reply, "tag") != NULL) {
        snprintf(why, size, "session '%s' step %zu (n=%u): reply %s", r->id, r->steps + 1, n, sl);
        return false;
    }
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(reply, "tokens");
    if (!cJSON_IsArray(tk) || cJSON_GetArraySize(tk) != (int)n) {
        snprintf(why, size, "session '%s' step %zu: \"tokens\" is not an array of %u: %s", r->id,
                 r->steps + 1, n, sl);
        return false;
    }
    for (uint32_t i = 0; i < n; i++) {
        const cJSON *t = cJSON_GetArrayItem(tk, (int)i);
        uint32_t want = r->tokens[r->nprompt + r->steps + i];
        if (!cJSON_IsNumber(t) || t->valuedouble != (double)want) {
            snprintf(why, size,
                     "session '%s' (%s) step %zu: token differs from the uncached reference %u: %s",
                     r->id, r->model, r->steps + i + 1, want, sl);
            return false;
        }
    }
    const cJSON *entries = cJSON_GetObjectItemCaseSensitive(reply, "entries");
    if (!cJSON_IsNumber(entries) || entries->valuedouble != (double)(r->nprompt + r->steps + n)) {
        snprintf(why, size, "session '%s': entries should be %zu: %s", r->id,
                 r->nprompt + r->steps + n, sl);
        return false;
    }
    const cJSON *lg = cJSON_GetObjectItemCaseSensitive(reply, "logits");
    if (r->logits == NULL) {
        if (lg != NULL) {
            snprintf(why, size, "a hash step reply has \"logits\": %s", sl);
            return false;
        }
    } else {
        size_t cnt = (size_t)n * r->vocab;
        char(*raw)[64] = malloc(cnt * sizeof(*raw));
        ck_assert_ptr_nonnull(raw);
        int got = itest_raw_numbers(line, "logits", raw, (int)cnt);
        bool ok = cJSON_IsArray(lg) && cJSON_GetArraySize(lg) == (int)n && got == (int)cnt;
        if (!ok) {
            snprintf(why, size, "session '%s' step %zu: expected %u rows of %u logits: %s", r->id,
                     r->steps + 1, n, r->vocab, sl);
        }
        for (size_t i = 0; ok && i < cnt; i++) {
            char want[64];
            snprintf(want, sizeof(want), "%.6f", r->logits[r->steps * r->vocab + i]);
            if (strcmp(raw[i], want) != 0) {
                snprintf(why, size,
                         "session '%s' step %zu logit %zu: wire %s, uncached reference %s", r->id,
                         r->steps + i / r->vocab + 1, i % r->vocab, raw[i], want);
                ok = false;
            }
        }
        free(raw);
        if (!ok) {
            return false;
        }
    }
    r->steps += n;
    return true;
}

void itest_ref_step(itest_conn_t *c, itest_ref_t *r, uint32_t n)
{
    cJSON *reply = itest_rpc(c, "{\"op\":\"step\",\"id\":\"%s\",\"n\":%u}", r->id, n);
    char why[600];
    ck_assert_msg(itest_ref_step_ok(r, reply, itest_last_line(c), n, why, sizeof(why)), "%s", why);
    cJSON_Delete(reply);
}

int64_t itest_metric(const itest_daemon_t *d, const char *name)
{
    itest_http_t h;
    size_t n = strlen(name);
    int64_t v = -1;

    itest_http_get(d, "/metrics", &h);
    ck_assert_msg(h.status == 200, "GET /metrics: %d", h.status);
    int64_t sum = 0;
    bool labelled = false;
    for (const char *p = h.body; p != NULL && *p != '\0';) {
        const char *eol = strchr(p, '\n');
        if (strncmp(p, name, n) == 0 && p[n] == ' ') {
            v = strtoll(p + n + 1, NULL, 10);
            break;
        }
        /* `name{...} v`: summed, for a family whose samples all carry
         * labels (slotd_step_seconds_count by model). */
        if (strchr(name, '{') == NULL && strncmp(p, name, n) == 0 && p[n] == '{') {
            const char *sp = strchr(p + n, ' ');
            if (sp != NULL && (eol == NULL || sp < eol)) {
                sum += strtoll(sp + 1, NULL, 10);
                labelled = true;
            }
        }
        p = eol != NULL ? eol + 1 : NULL;
    }
    if (v < 0 && labelled)
        v = sum;
    ck_assert_msg(v >= 0, "no sample %s in /metrics:\n%s", name, h.body);
    itest_http_free(&h);
    return v;
}

/* ---- Sessions grown by steps, appends and forks ---- */

int64_t itest_seq_token(const char *model, size_t k)
{
    uint32_t v = model_vocab(itest_model(model));
    return (int64_t)((k * 2654435761u + 12345u) % v);
}

void itest_seq_start(itest_conn_t *c, itest_seq_t *s, const char *id, const char *model, size_t n)
{
    snprintf(s->id, sizeof(s->id), "%s", id);
    s->model = model;
    s->len = 0;
    for (size_t i = 0; i < n; i++)
        s->tok[s->len++] = itest_seq_token(model, i + 7);
    char *p = itest_json_tokens(s->tok, s->len);
    cJSON *r = itest_rpc(c, "{\"op\":\"start\",\"id\":\"%s\",\"model\":\"%s\",\"prompt\":%s}", id,
                         model, p);
    free(p);
    itest_expect_ok(r);
    ck_assert_int_eq(itest_int(r, "entries"), (int64_t)n);
    cJSON_Delete(r);
}

char *itest_seq_append_line(const itest_seq_t *s, size_t n, size_t k0, int64_t *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = itest_seq_token(s->model, k0 + i);
    char *t = itest_json_tokens(out, n);
    size_t cap = strlen(t) + 128;
    char *line = malloc(cap);
    ck_assert_ptr_nonnull(line);
    snprintf(line, cap, "{\"op\":\"append\",\"id\":\"%s\",\"tokens\":%s}\n", s->id, t);
    free(t);
    return line;
}

void itest_seq_check_append(itest_seq_t *s, const cJSON *r, const int64_t *toks, size_t n)
{
    itest_expect_ok(r);
    ck_assert_str_eq(itest_str(r, "id"), s->id);
    ck_assert_int_eq(itest_int(r, "entries"), (int64_t)(s->len + n));
    int64_t cached = itest_int(r, "cached");
    ck_assert(cached >= 0 && cached <= (int64_t)n);
    memcpy(s->tok + s->len, toks, n * sizeof(int64_t));
    s->len += n;
}

void itest_seq_append(itest_conn_t *c, itest_seq_t *s, size_t n, size_t k0)
{
    int64_t toks[ITEST_SEQ_MAX];
    char *line = itest_seq_append_line(s, n, k0, toks);
    ck_assert(itest_send_str(c, line));
    free(line);
    cJSON *r = itest_read_reply(c);
    itest_seq_check_append(s, r, toks, n);
    cJSON_Delete(r);
}

void itest_seq_check_step(itest_seq_t *s, const cJSON *r, const char *line, uint32_t n)
{
    const model_t *m = itest_model(s->model);
    uint32_t V = model_vocab(m);
    uint32_t *want = malloc((s->len + n) * sizeof(uint32_t));
    double *lg = malloc((size_t)n * V * sizeof(double));
    ck_assert(want != NULL && lg != NULL);
    itest_reference(s->model, s->tok, s->len, n, want, lg);

    itest_expect_ok(r);
    ck_assert_str_eq(itest_str(r, "id"), s->id);
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(r, "tokens");
    ck_assert(cJSON_IsArray(tk) && cJSON_GetArraySize(tk) == (int)n);
    for (uint32_t i = 0; i < n; i++) {
        const cJSON *t = cJSON_GetArrayItem(tk, (int)i);
        ck_assert_msg(cJSON_IsNumber(t) && t->valuedouble == (double)want[s->len + i],
                      "session %s (%s) after %zu entries: pick %u is not the reference's %u: %s",
                      s->id, s->model, s->len, i, want[s->len + i], line);
    }
    if (model_family(m) == MODEL_FAMILY_ATTN)
        itest_expect_logits(line, lg, (size_t)n * V);
    ck_assert_int_eq(itest_int(r, "entries"), (int64_t)(s->len + n));
    for (uint32_t i = 0; i < n; i++)
        s->tok[s->len + i] = want[s->len + i];
    s->len += n;
    free(want);
    free(lg);
}

void itest_seq_step(itest_conn_t *c, itest_seq_t *s, uint32_t n)
{
    cJSON *r = itest_rpc(c, "{\"op\":\"step\",\"id\":\"%s\",\"n\":%u}", s->id, n);
    itest_seq_check_step(s, r, itest_last_line(c), n);
    cJSON_Delete(r);
}

bool itest_is_part(int argc, char **argv, const char *part)
{
    return argc > 1 && strcmp(argv[1], part) == 0;
}

int itest_skip(const char *why)
{
    fprintf(stderr, "SKIP: %s\n", why);
    return ITEST_SKIP;
}

bool itest_fault_hooks(void)
{
    const char *bin = getenv("SLOTD_BIN");
    char cmd[4200], line[512];
    bool have = false;
    FILE *f;

    if (bin == NULL || bin[0] == '\0' || strchr(bin, '\'') != NULL)
        return false;
    snprintf(cmd, sizeof(cmd), "'%s' --help 2>&1", bin);
    if ((f = popen(cmd, "r")) == NULL)
        return false;
    while (fgets(line, sizeof(line), f) != NULL)
        have = have || strstr(line, "--fault-wedge-after") != NULL;
    pclose(f);
    return have;
}
