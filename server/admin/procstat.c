/*
 * procstat.c: the process_* metrics of the Prometheus client libraries'
 * process collector, read from the kernel at each scrape, and
 * slotd_build_info.
 *
 * The figures come from where client_golang's collector takes them on
 * Linux: /proc/self/statm (resident and virtual memory, in pages),
 * getrusage() (user plus system CPU time), the entries of /proc/self/fd
 * less the one opendir() holds, RLIMIT_NOFILE's soft limit, and the
 * process's start time from /proc/self/stat (clock ticks after boot) plus
 * the boot time of /proc/stat.  A figure that cannot be read is left out,
 * family and all, rather than reported as 0.
 *
 * The version is the project's (SLOTD_VERSION, from CMake); the commit
 * comes from slotd_commit.h, which the build writes (cmake/commit.cmake),
 * or is "unknown" when the file is not there (the fuzz harness).
 *
 * DESIGN.  Loop thread (the admin port's /metrics); no state, no lock.
 */
#include "procstat_int.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include("slotd_commit.h")
#include "slotd_commit.h"
#endif
#endif
#ifndef SLOTD_COMMIT
#define SLOTD_COMMIT "unknown"
#endif
#ifndef SLOTD_VERSION
#define SLOTD_VERSION "0.0.0"
#endif

const char *procstat_commit(void)
{
    return SLOTD_COMMIT;
}

__attribute__((format(printf, 2, 3))) static int procstat_put(proto_buf_t *b, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(line))
        return SLOTD_EINVAL;
    return proto_buf_append(b, line, (size_t)n);
}

/* One family of one sample: HELP, TYPE and `name value`. */
static int one(proto_buf_t *b, const char *name, const char *type, const char *help,
               const char *value)
{
    return procstat_put(b, "# HELP %s %s\n# TYPE %s %s\n%s %s\n", name, help, name, type, name,
                        value);
}

/* Resident and virtual bytes from /proc/self/statm; 0 on success. */
static int read_statm(uint64_t *rss, uint64_t *vsize)
{
    unsigned long long size, resident;
    long page = sysconf(_SC_PAGESIZE);
    FILE *f = fopen("/proc/self/statm", "re");
    if (f == NULL)
        return -1;
    int n = fscanf(f, "%llu %llu", &size, &resident);
    fclose(f);
    if (n != 2 || page <= 0)
        return -1;
    *rss = (uint64_t)resident * (uint64_t)page;
    *vsize = (uint64_t)size * (uint64_t)page;
    return 0;
}

/* Open descriptors, less the one reading the directory; -1 if unknown. */
static long open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    long n = 0;
    if (d == NULL)
        return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n > 0 ? n - 1 : 0;
}

/* Seconds since the epoch at which the process started; 0 on success. */
static int start_time(double *out)
{
    char buf[1024];
    unsigned long long start_ticks = 0, btime = 0;
    long hz = sysconf(_SC_CLK_TCK);
    FILE *f = fopen("/proc/self/stat", "re");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* The name (field 2) may hold spaces and parentheses: fields 3 on
     * start after its last ')'.  starttime is field 22. */
    char *p = strrchr(buf, ')');
    if (p == NULL || hz <= 0)
        return -1;
    p++;
    for (int field = 3; field <= 22; field++) {
        char *end;
        while (*p == ' ')
            p++;
        if (field == 22) {
            start_ticks = strtoull(p, &end, 10);
            if (end == p)
                return -1;
            break;
        }
        p = strchr(p, ' ');
        if (p == NULL)
            return -1;
    }
    if ((f = fopen("/proc/stat", "re")) == NULL)
        return -1;
    char line[256];
    bool found = false;
    while (!found && fgets(line, sizeof(line), f) != NULL)
        found = sscanf(line, "btime %llu", &btime) == 1;
    fclose(f);
    if (!found)
        return -1;
    *out = (double)btime + (double)start_ticks / (double)hz;
    return 0;
}

#define TRY(x)                                                                                     \
    do {                                                                                           \
        int rc_ = (x);                                                                             \
        if (rc_ != SLOTD_OK)                                                                       \
            return rc_;                                                                            \
    } while (0)

int procstat_render(proto_buf_t *out, bool process)
{
    char v[64];
    struct rusage ru;
    struct rlimit rl;
    uint64_t rss, vsize;
    double started;
    long fds;

    if (!process)
        goto build;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        double cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                     (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
        snprintf(v, sizeof(v), "%.6f", cpu);
        TRY(one(out, "process_cpu_seconds_total", "counter",
                "Total user and system CPU time spent in seconds.", v));
    }
    if (read_statm(&rss, &vsize) == 0) {
        snprintf(v, sizeof(v), "%" PRIu64, rss);
        TRY(one(out, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
                v));
        snprintf(v, sizeof(v), "%" PRIu64, vsize);
        TRY(one(out, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", v));
    }
    if ((fds = open_fds()) >= 0) {
        snprintf(v, sizeof(v), "%ld", fds);
        TRY(one(out, "process_open_fds", "gauge", "Number of open file descriptors.", v));
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        snprintf(v, sizeof(v), "%llu", (unsigned long long)rl.rlim_cur);
        TRY(one(out, "process_max_fds", "gauge", "Maximum number of open file descriptors.", v));
    }
    if (start_time(&started) == 0) {
        snprintf(v, sizeof(v), "%.2f", started);
        TRY(one(out, "process_start_time_seconds", "gauge",
                "Start time of the process since unix epoch in seconds.", v));
    }
build:
    return procstat_put(
        out,
        "# HELP slotd_build_info The version and commit slotd was built from; always 1.\n"
        "# TYPE slotd_build_info gauge\n"
        "slotd_build_info{version=\"%s\",commit=\"%s\"} 1\n",
        SLOTD_VERSION, SLOTD_COMMIT);
}
