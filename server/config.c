/*
 * config.c: the table of settings, and the parsing of flags and SLOTD_*
 * environment variables into a server_config_t.
 *
 * Each setting is one row of `options`: its flag name, how to parse a value
 * and where the value goes.  The environment variable is derived from the
 * flag (--cache-mb is SLOTD_CACHE_MB).  Values are checked as they are
 * parsed; settings that depend on each other (the default model and the
 * preloaded ones among --models, two distinct ports) or on the machine (the pool within
 * physical memory and the cgroup's memory limit) are checked once
 * everything is read.
 *
 * Defaults follow the limits the process actually runs under, not the
 * machine's: --threads is the smallest of the online cores, the CPU
 * affinity mask and the cgroup's CPU quota; --cache-mb is 256 MiB or half
 * the cgroup's memory limit if that is smaller.  Both cgroup v2 (cpu.max,
 * memory.max) and v1 (cpu.cfs_quota_us / cpu.cfs_period_us,
 * memory.limit_in_bytes) are read.
 *
 * Test builds (SLOTD_FAULT_INJECTION) add the --fault-* rows; elsewhere
 * those flags do not exist and are refused as unknown.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "config.h"

#include "core/model.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "core/model.h"

#ifndef SLOTD_VERSION
#define SLOTD_VERSION "0.0.0"
#endif

typedef enum opt_kind {
    OPT_HOST,
    OPT_UINT,
    OPT_MODELS,
    OPT_PRELOAD,
    OPT_MODEL,
    OPT_LEVEL,
    OPT_RATE,
    OPT_PATH,
    OPT_YESNO,
    OPT_FLAG,
    OPT_NETS,
    OPT_ONFULL,
    OPT_ONOFF,
    OPT_SCOPE,
} opt_kind_t;

typedef struct option {
    const char *name; /* without the leading "--" */
    opt_kind_t kind;
    uint64_t min, max; /* OPT_UINT: accepted range */
    size_t offset;     /* of the field in server_config_t */
    size_t size;       /* OPT_UINT: bytes of the field */
    const char *help;
} option_t;

#define FIELD(f) offsetof(server_config_t, f), sizeof(((server_config_t *)0)->f)

static const option_t options[] = {
    {"listen", OPT_HOST, 0, 0, FIELD(listen), "address of the session port (127.0.0.1)"},
    {"port", OPT_UINT, 0, 65535, FIELD(port), "session port, 0 for any (7070)"},
    {"admin-listen", OPT_HOST, 0, 0, FIELD(admin_listen),
     "address of the admin port, whatever --listen says (127.0.0.1)"},
    {"admin-port", OPT_UINT, 0, 65535, FIELD(admin_port), "admin HTTP port, 0 for any (7071)"},
    {"admin-idle-timeout", OPT_UINT, 1, 86400, FIELD(admin_idle_timeout),
     "seconds before an admin connection with nothing answered is closed (5)"},
    {"threads", OPT_UINT, 1, 1024, FIELD(threads), "worker threads (cores available)"},
    {"cache-mb", OPT_UINT, 1, UINT64_C(1) << 24, FIELD(cache_mb), "cache pool size in MiB (256)"},
    {"max-sessions", OPT_UINT, 1, 100000000, FIELD(max_sessions), "live sessions (100000)"},
    {"max-connections", OPT_UINT, 1, 1000000, FIELD(max_connections), "open connections (10000)"},
    {"max-sessions-per-connection", OPT_UINT, 1, 100000000, FIELD(max_sessions_per_conn),
     "live sessions one connection may hold (10000)"},
    {"max-connection-share", OPT_RATE, 0, 0, FIELD(max_conn_share),
     "fraction above 0 and up to 1 of the pool's bytes and slots one connection may hold (0.5)"},
    {"max-line", OPT_UINT, 16, UINT64_C(1) << 30, FIELD(max_line),
     "longest request line in bytes (65536)"},
    {"idle-timeout", OPT_UINT, 0, 100000000, FIELD(idle_timeout),
     "seconds before an idle session is released, 0 for never (300)"},
    {"conn-timeout", OPT_UINT, 0, 100000000, FIELD(conn_timeout),
     "seconds before a silent connection without sessions is closed, 0 for never (0)"},
    {"shutdown-timeout", OPT_UINT, 1, 86400, FIELD(shutdown_timeout),
     "seconds a shutdown may take (10)"},
    {"wedge-timeout", OPT_UINT, 1, 86400, FIELD(wedge_timeout),
     "seconds a worker in a job may make no progress before /health fails (10)"},
    {"reply-hold-us", OPT_UINT, 0, 10000000, FIELD(reply_hold_us),
     "microseconds replies may wait for more of their connection's jobs, 0 for never (100)"},
    {"models", OPT_MODELS, 0, 0, 0, 0,
     "presets that may be served, comma separated, each built on first use (every preset)"},
    {"preload", OPT_PRELOAD, 0, 0, 0, 0,
     "presets built at start, comma separated, or none; by default those of tiny,hash that "
     "--models allows (tiny,hash)"},
    {"default-model", OPT_MODEL, 0, 0, FIELD(default_model),
     "model of a request that names none; the first of --models if tiny is not among them (tiny)"},
    {"log-level", OPT_LEVEL, 0, 0, FIELD(log_level), "debug, info, warn or error (info)"},
    {"audit-rate", OPT_RATE, 0, 0, FIELD(audit_rate),
     "fraction 0..1 of step requests checked against an uncached recompute (0)"},
    {"auth-token-file", OPT_PATH, 0, 0, FIELD(auth_token_file),
     "file holding the token clients must present, readable by its owner only (none)"},
    {"tenants-file", OPT_PATH, 0, 0, FIELD(tenants_file),
     "file of tenants, one per line (NAME TOKEN [share=F] [weight=W] [sessions=N] "
     "[connections=N] [admin]), readable by its owner only; reread on SIGHUP or POST "
     "/tenants/reload (none)"},
    {"protected-mode", OPT_YESNO, 0, 0, FIELD(protected_mode),
     "yes: refuse a non-loopback --listen or --admin-listen without a token (yes)"},
    {"max-batch", OPT_UINT, 1, MODEL_BATCH_MAX, FIELD(max_batch),
     "single steps of one model a worker runs as one batch, 1 for none (32)"},
    {"batch-us", OPT_UINT, 0, 10000000, FIELD(batch_us),
     "estimated microseconds a batch may take, so other clients wait about one; 0 for no bound "
     "(10000)"},
    {"worker-sched-batch", OPT_YESNO, 0, 0, FIELD(worker_sched_batch),
     "yes: worker threads run under SCHED_BATCH, so that a worker woken for a job does not "
     "preempt a thread mid-batch (yes)"},
    {"auth-timeout", OPT_UINT, 0, 86400, FIELD(auth_timeout),
     "seconds from a connection's accept to its auth (with a token) and its PROXY header (from "
     "a --proxy-from peer) before it is closed, 0 for never (5)"},
    {"prefix-cache", OPT_ONOFF, 0, 0, FIELD(prefix_cache),
     "on: a start (or an append at a block's end) reuses the cached entries an earlier session "
     "of the same model and scope computed for the same leading tokens (on)"},
    {"prefix-scope", OPT_SCOPE, 0, 0, FIELD(prefix_scope),
     "global (every connection shares), connection (each its own) or tenant (each tenant its "
     "own; without a tenants file, each connection) (global; tenant with --tenants-file)"},
    {"proxy-from", OPT_NETS, 0, 0, 0, 0,
     "addresses or CIDR networks, comma separated, whose connections begin with a PROXY "
     "protocol header (v1 or v2) naming the client, or none (none)"},
    {"on-full", OPT_ONFULL, 0, 0, FIELD(on_full),
     "a request the pool has no room for: refuse (cache_full at once), wait (for room, up to "
     "--full-wait-ms) or evict (idle sessions, least recently used first, rebuilt when next "
     "used) (refuse)"},
    {"full-wait-ms", OPT_UINT, 1, 3600000, FIELD(full_wait_ms),
     "--on-full wait: milliseconds a request waits for room before cache_full; evict: for an "
     "idle session to evict when none is (1000)"},
#if SLOTD_FAULT_INJECTION
    {"fault-corrupt-after", OPT_UINT, 0, UINT64_MAX, FIELD(fault_corrupt_after),
     "test build: damage the slot of the N-th step job (0, off)"},
    {"fault-wedge-after", OPT_UINT, 0, UINT64_MAX, FIELD(fault_wedge_after),
     "test build: the N-th job holds its worker until SIGUSR1 (0, off)"},
    {"fault-build-delay-ms", OPT_UINT, 0, 600000, FIELD(fault_build_delay_ms),
     "test build: each preset built on demand takes N ms longer (0, off)"},
#endif
    {"help", OPT_FLAG, 0, 0, 0, 0, "print this help and exit"},
    {"version", OPT_FLAG, 0, 0, 0, 0, "print the version and exit"},
};

#define NOPTIONS (sizeof(options) / sizeof(options[0]))

/* Reads the first unsigned integer of `dir`/`file` into *v (0 on success).
 * "max" (cgroup v2's "no limit") is UINT64_MAX. */
static int read_limit(const char *dir, const char *file, uint64_t *v)
{
    char path[4096], buf[64];
    FILE *f;
    size_t n;

    if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, file) >= sizeof(path) ||
        (f = fopen(path, "re")) == NULL)
        return -1;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    if (strncmp(buf, "max", 3) == 0) {
        *v = UINT64_MAX;
        return 0;
    }
    if (buf[0] == '-') { /* v1's cfs_quota_us of -1: no quota */
        *v = UINT64_MAX;
        return 0;
    }
    errno = 0;
    char *end;
    unsigned long long x = strtoull(buf, &end, 10);
    if (end == buf || errno != 0)
        return -1;
    *v = (uint64_t)x;
    return 0;
}

/* The directory of a controller: `root`/`mount``path` if it exists (a
 * host's view), else `root`/`mount` (a container whose cgroup is mounted
 * as the root of its hierarchy). */
static void cgroup_dir(char *out, size_t outlen, const char *root, const char *mount,
                       const char *path)
{
    if ((size_t)snprintf(out, outlen, "%s/%s%s", root, mount, path) < outlen &&
        access(out, F_OK) == 0)
        return;
    snprintf(out, outlen, "%s/%s", root, mount);
}

void config_cgroup_limits(const char *cgroup_file, const char *root, config_limits_t *out)
{
    char line[4096], dir[4096];
    FILE *f;
    uint64_t quota, period, mem;

    out->cpus = 0;
    out->memory_mb = 0;
    if ((f = fopen(cgroup_file, "re")) == NULL)
        return;
    while (fgets(line, sizeof(line), f) != NULL) {
        char *ctrl = strchr(line, ':'), *path;
        if (ctrl == NULL || (path = strchr(++ctrl, ':')) == NULL)
            continue;
        *path++ = '\0';
        path[strcspn(path, "\n")] = '\0';
        if (strcmp(path, "/") == 0)
            path[0] = '\0';
        if (ctrl[0] == '\0') { /* v2: "0::/path" */
            cgroup_dir(dir, sizeof(dir), root, "", path);
            char v2[4096];
            if ((size_t)snprintf(v2, sizeof(v2), "%s/cpu.max", dir) < sizeof(v2)) {
                FILE *c = fopen(v2, "re");
                unsigned long long q, per;
                char word[16];
                if (c != NULL) {
                    if (fscanf(c, "%15s %llu", word, &per) == 2 && strcmp(word, "max") != 0 &&
                        sscanf(word, "%llu", &q) == 1 && per > 0)
                        out->cpus = (unsigned)((q + per - 1) / per);
                    fclose(c);
                }
            }
            if (read_limit(dir, "memory.max", &mem) == 0 && mem != UINT64_MAX)
                out->memory_mb = mem >> 20;
            continue;
        }
        /* v1: "N:cpu,cpuacct:/path", "N:memory:/path" */
        char *save = NULL;
        for (char *tok = strtok_r(ctrl, ",", &save); tok != NULL;
             tok = strtok_r(NULL, ",", &save)) {
            if (strcmp(tok, "memory") == 0) {
                cgroup_dir(dir, sizeof(dir), root, "memory", path);
                /* v1 reports "no limit" as a huge page-rounded number. */
                if (read_limit(dir, "memory.limit_in_bytes", &mem) == 0 &&
                    mem < (UINT64_C(1) << 62))
                    out->memory_mb = mem >> 20;
            } else if (strcmp(tok, "cpu") == 0) {
                cgroup_dir(dir, sizeof(dir), root, "cpu", path);
                if (read_limit(dir, "cpu.cfs_quota_us", &quota) == 0 && quota != UINT64_MAX &&
                    read_limit(dir, "cpu.cfs_period_us", &period) == 0 && period > 0)
                    out->cpus = (unsigned)((quota + period - 1) / period);
            }
        }
    }
    fclose(f);
}

void config_defaults_for(server_config_t *cfg, long online_cores, long affinity_cores,
                         const config_limits_t *lim)
{
    long cores = online_cores;

    if (affinity_cores > 0 && affinity_cores < cores)
        cores = affinity_cores;
    if (lim->cpus > 0 && (long)lim->cpus < cores)
        cores = (long)lim->cpus;
    memset(cfg, 0, sizeof(*cfg));
    strcpy(cfg->listen, "127.0.0.1");
    strcpy(cfg->admin_listen, "127.0.0.1");
    cfg->port = 7070;
    cfg->admin_port = 7071;
    cfg->admin_idle_timeout = 5;
    cfg->threads = cores < 1 ? 1 : cores > 1024 ? 1024 : (unsigned)cores;
    cfg->cache_mb = 256;
    if (lim->memory_mb != 0 && lim->memory_mb / 2 < cfg->cache_mb)
        cfg->cache_mb = lim->memory_mb / 2 > 0 ? lim->memory_mb / 2 : 1;
    cfg->max_sessions = 100000;
    cfg->max_connections = 10000;
    cfg->max_sessions_per_conn = 10000;
    cfg->max_conn_share = 0.5;
    cfg->max_line = PROTO_DEFAULT_MAX_LINE;
    cfg->idle_timeout = 300;
    cfg->shutdown_timeout = 10;
    cfg->wedge_timeout = 10;
    cfg->reply_hold_us = 100;
    cfg->max_batch = 32;
    cfg->batch_us = 10000;
    cfg->on_full = CONFIG_ON_FULL_REFUSE;
    cfg->full_wait_ms = 1000;
    /* Every preset of the table (core/model.c), up to CONFIG_MAX_MODELS. */
    for (cfg->nmodels = 0;
         cfg->nmodels < CONFIG_MAX_MODELS && model_preset_name(cfg->nmodels) != NULL;
         cfg->nmodels++)
        strcpy(cfg->models[cfg->nmodels], model_preset_name(cfg->nmodels));
    cfg->npreload = 2;
    strcpy(cfg->preload[0], "tiny");
    strcpy(cfg->preload[1], "hash");
    cfg->preload_given = false;
    strcpy(cfg->default_model, "tiny");
    cfg->default_model_from[0] = '\0';
    cfg->log_level = LOG_LEVEL_INFO;
    cfg->protected_mode = true;
    cfg->worker_sched_batch = true;
    cfg->prefix_cache = true;
    cfg->prefix_scope = CONFIG_SCOPE_GLOBAL;
    cfg->auth_timeout = 5;
    cfg->nproxy_from = 0;
}

void config_defaults(server_config_t *cfg)
{
    config_limits_t lim;
    cpu_set_t set;
    long affinity = 0;

    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        affinity = CPU_COUNT(&set);
    config_cgroup_limits("/proc/self/cgroup", "/sys/fs/cgroup", &lim);
    config_defaults_for(cfg, sysconf(_SC_NPROCESSORS_ONLN), affinity, &lim);
}

static config_result_t config_fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static config_result_t config_fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return CONFIG_ERROR;
}

/* True if `name` is one of the presets (model_preset_name()). */
static bool preset_known(const char *name, size_t len)
{
    const char *p;

    for (size_t i = 0; (p = model_preset_name(i)) != NULL; i++)
        if (strlen(p) == len && strncmp(p, name, len) == 0)
            return true;
    return false;
}

static bool host_valid(const char *s)
{
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1;
}

/* True for 127.0.0.0/8, ::1 and ::ffff:127.0.0.0/104 (`s` is host_valid()). */
static bool host_loopback(const char *s)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, s, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, s, &a6) != 1)
        return false;
    return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
}

/* Parses a decimal unsigned integer with nothing around it. */
static int parse_uint(const char *s, uint64_t *out)
{
    char *end;
    unsigned long long v;

    if (!isdigit((unsigned char)s[0]))
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

/* Parses a fraction in 0..1 written in decimal ("0", "1", "0.25", "1e-3"):
 * no sign, no hexadecimal, no inf or nan, nothing around it. */
static int parse_rate(const char *s, double *out)
{
    char *end;
    double v;

    if (!isdigit((unsigned char)s[0]) && s[0] != '.')
        return -1;
    if (s[strspn(s, "0123456789.eE+-")] != '\0')
        return -1;
    errno = 0;
    v = strtod(s, &end);
    if (errno != 0 || *end != '\0' || !(v >= 0.0 && v <= 1.0))
        return -1;
    *out = v;
    return 0;
}

/* Stores `v` (already within the row's range) into a field of 4 or 8
 * bytes: int, unsigned, uint32_t, uint64_t or size_t. */
static void store_uint(server_config_t *cfg, const option_t *o, uint64_t v)
{
    char *field = (char *)cfg + o->offset;
    switch (o->size) {
    case sizeof(uint64_t): {
        uint64_t x = v;
        memcpy(field, &x, sizeof(x));
        break;
    }
    case sizeof(uint32_t): {
        uint32_t x = (uint32_t)v;
        memcpy(field, &x, sizeof(x));
        break;
    }
    default:
        abort(); /* a row of `options` names a field of another size */
    }
}

/* Parses the comma-separated presets `v` into names[], *n of them. */
static config_result_t set_models(char (*names)[PROTO_MODEL_MAX + 1], size_t *count,
                                  const char *src, const char *v, char *err, size_t errlen)
{
    size_t n = 0;
    const char *p = v;

    for (;;) {
        size_t len = strcspn(p, ",");
        if (len == 0)
            return config_fail(err, errlen, "%s: empty model name in '%s'", src, v);
        if (!preset_known(p, len))
            return config_fail(err, errlen, "%s: unknown model '%.*s' (known: %s)", src, (int)len,
                               p, model_presets());
        for (size_t i = 0; i < n; i++)
            if (strlen(names[i]) == len && strncmp(names[i], p, len) == 0)
                return config_fail(err, errlen, "%s: model '%.*s' listed twice", src, (int)len, p);
        if (n == CONFIG_MAX_MODELS || len > PROTO_MODEL_MAX)
            return config_fail(err, errlen, "%s: too many models in '%s'", src, v);
        memcpy(names[n], p, len);
        names[n][len] = '\0';
        n++;
        p += len;
        if (*p == '\0')
            break;
        p++; /* the comma */
    }
    *count = n;
    return CONFIG_OK;
}

/* Whether `name` is among --models. */
static bool model_allowed(const server_config_t *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->nmodels; i++)
        if (strcmp(cfg->models[i], name) == 0)
            return true;
    return false;
}

/* --preload against --models: a name given must be allowed; the default
 * keeps those of its names that are. */
static config_result_t check_preload(server_config_t *cfg, char *err, size_t errlen)
{
    size_t n = 0;

    for (size_t i = 0; i < cfg->npreload; i++) {
        if (model_allowed(cfg, cfg->preload[i]))
            memmove(cfg->preload[n++], cfg->preload[i], sizeof(cfg->preload[i]));
        else if (cfg->preload_given)
            return config_fail(err, errlen, "--preload: '%s' is not among --models",
                               cfg->preload[i]);
    }
    cfg->npreload = n;
    return CONFIG_OK;
}

/* Parses --proxy-from: "none", or comma-separated ADDR or ADDR/PREFIX,
 * numeric IPv4 or IPv6. */
static config_result_t set_nets(server_config_t *cfg, const char *src, const char *v, char *err,
                                size_t errlen)
{
    const char *p = v;
    size_t n = 0;

    if (strcmp(v, "none") == 0) {
        cfg->nproxy_from = 0;
        return CONFIG_OK;
    }
    for (;;) {
        size_t len = strcspn(p, ","), alen = strcspn(p, ",/");
        char addr[INET6_ADDRSTRLEN];
        config_net_t *net = &cfg->proxy_from[n];
        uint64_t prefix;
        unsigned bits;

        if (n == CONFIG_MAX_PROXY_FROM)
            return config_fail(err, errlen, "%s: more than %d networks in '%s'", src,
                               CONFIG_MAX_PROXY_FROM, v);
        if (alen == 0 || alen >= sizeof(addr))
            return config_fail(err, errlen, "%s: '%.*s' is not an address or ADDRESS/PREFIX", src,
                               (int)len, p);
        memcpy(addr, p, alen);
        addr[alen] = '\0';
        memset(net, 0, sizeof(*net));
        if (inet_pton(AF_INET, addr, net->addr) == 1)
            net->family = AF_INET;
        else if (inet_pton(AF_INET6, addr, net->addr) == 1)
            net->family = AF_INET6;
        else
            return config_fail(err, errlen, "%s: '%s' is not a numeric IPv4 or IPv6 address", src,
                               addr);
        bits = net->family == AF_INET ? 32 : 128;
        net->prefix = bits;
        if (alen < len) {
            char num[8];
            size_t nlen = len - alen - 1;
            if (nlen == 0 || nlen >= sizeof(num))
                return config_fail(err, errlen, "%s: '%.*s' has no prefix length in 0..%u", src,
                                   (int)len, p, bits);
            memcpy(num, p + alen + 1, nlen);
            num[nlen] = '\0';
            if (parse_uint(num, &prefix) != 0 || prefix > bits)
                return config_fail(err, errlen, "%s: '%.*s' has no prefix length in 0..%u", src,
                                   (int)len, p, bits);
            net->prefix = (unsigned)prefix;
        }
        /* The host bits must be zero, so that 10.0.0.5/8 is not taken for
         * 10.0.0.0/8 by mistake. */
        for (unsigned b = net->prefix; b < bits; b++)
            if (net->addr[b / 8] & (0x80u >> (b % 8)))
                return config_fail(err, errlen, "%s: '%.*s' has host bits set past /%u", src,
                                   (int)len, p, net->prefix);
        n++;
        p += len;
        if (*p == '\0')
            break;
        p++; /* the comma */
    }
    cfg->nproxy_from = n;
    return CONFIG_OK;
}

/* A setting that takes one of a few words: each word's value, and how the
 * error names them all. */
typedef struct word {
    const char *word;
    int value;
} word_t;

typedef struct words {
    const word_t *words;
    size_t n;
    const char *expected; /* "'%s' is not <expected>" */
} words_t;

#define WORDS(name, expected, ...)                                                                 \
    static const word_t name##_list[] = {__VA_ARGS__};                                             \
    static const words_t name = {name##_list, sizeof(name##_list) / sizeof(name##_list[0]),        \
                                 expected}

WORDS(yesno_words, "yes or no", {"yes", true}, {"no", false});
WORDS(onoff_words, "on or off", {"on", true}, {"off", false});
WORDS(onfull_words, "one of refuse, wait, evict", {"refuse", CONFIG_ON_FULL_REFUSE},
      {"wait", CONFIG_ON_FULL_WAIT}, {"evict", CONFIG_ON_FULL_EVICT});
WORDS(scope_words, "global, connection or tenant", {"global", CONFIG_SCOPE_GLOBAL},
      {"connection", CONFIG_SCOPE_CONNECTION}, {"tenant", CONFIG_SCOPE_TENANT});
_Static_assert(sizeof(config_on_full_t) == sizeof(int) &&
                   sizeof(config_prefix_scope_t) == sizeof(int),
               "set_word() stores an enum as an int");

/* Sets option `o`'s field, a bool or an enum, to the value of the word of
 * `t` that `value` is; refuses any other word and leaves the field as it
 * was. */
static config_result_t set_word(server_config_t *cfg, const option_t *o, const words_t *t,
                                const char *src, const char *value, char *err, size_t errlen)
{
    char *field = (char *)cfg + o->offset;

    for (size_t i = 0; i < t->n; i++) {
        if (strcmp(value, t->words[i].word) != 0)
            continue;
        if (o->size == sizeof(bool)) {
            *(bool *)field = t->words[i].value != 0;
        } else {
            assert(o->size == sizeof(int)); /* an enum of config.h (above) */
            memcpy(field, &t->words[i].value, sizeof(int));
        }
        return CONFIG_OK;
    }
    return config_fail(err, errlen, "%s: '%s' is not %s", src, value, t->expected);
}

/* Sets option `o` from `value`; `src` names where it came from ("--port",
 * "SLOTD_PORT") for the error message. */
static config_result_t set_option(server_config_t *cfg, const option_t *o, const char *src,
                                  const char *value, char *err, size_t errlen)
{
    uint64_t v;

    switch (o->kind) {
    case OPT_HOST:
        if (strlen(value) > CONFIG_HOST_MAX || !host_valid(value))
            return config_fail(err, errlen, "%s: '%s' is not a numeric IPv4 or IPv6 address", src,
                               value);
        strcpy((char *)cfg + o->offset, value);
        return CONFIG_OK;
    case OPT_UINT:
        if (parse_uint(value, &v) != 0 || v < o->min || v > o->max)
            return config_fail(err, errlen, "%s: '%s' is not an integer in %" PRIu64 "..%" PRIu64,
                               src, value, o->min, o->max);
        store_uint(cfg, o, v);
        return CONFIG_OK;
    case OPT_MODELS:
        return set_models(cfg->models, &cfg->nmodels, src, value, err, errlen);
    case OPT_PRELOAD:
        cfg->preload_given = true;
        if (strcmp(value, "none") == 0) {
            cfg->npreload = 0;
            return CONFIG_OK;
        }
        return set_models(cfg->preload, &cfg->npreload, src, value, err, errlen);
    case OPT_MODEL:
        if (strlen(value) > PROTO_MODEL_MAX || !preset_known(value, strlen(value)))
            return config_fail(err, errlen, "%s: unknown model '%s' (known: %s)", src, value,
                               model_presets());
        strcpy(cfg->default_model, value);
        snprintf(cfg->default_model_from, sizeof(cfg->default_model_from), "%s", src);
        return CONFIG_OK;
    case OPT_LEVEL:
        if (log_level_parse(value, &cfg->log_level) != 0)
            return config_fail(err, errlen, "%s: '%s' is not one of debug, info, warn, error", src,
                               value);
        return CONFIG_OK;
    case OPT_RATE: {
        double r;
        if (parse_rate(value, &r) != 0)
            return config_fail(err, errlen, "%s: '%s' is not a number in 0..1", src, value);
        memcpy((char *)cfg + o->offset, &r, sizeof(r));
        return CONFIG_OK;
    }
    case OPT_PATH:
        if (value[0] == '\0' || strlen(value) > CONFIG_PATH_MAX)
            return config_fail(err, errlen, "%s: '%.64s' is not a file path", src, value);
        strcpy((char *)cfg + o->offset, value);
        return CONFIG_OK;
    case OPT_YESNO:
        return set_word(cfg, o, &yesno_words, src, value, err, errlen);
    case OPT_NETS:
        return set_nets(cfg, src, value, err, errlen);
    case OPT_ONFULL:
        return set_word(cfg, o, &onfull_words, src, value, err, errlen);
    case OPT_ONOFF:
        return set_word(cfg, o, &onoff_words, src, value, err, errlen);
    case OPT_SCOPE:
        if (set_word(cfg, o, &scope_words, src, value, err, errlen) != CONFIG_OK)
            return CONFIG_ERROR;
        cfg->prefix_scope_given = true;
        return CONFIG_OK;
    case OPT_FLAG:
        break;
    }
    return config_fail(err, errlen, "%s takes no value", src);
}

/* "cache-mb" -> "SLOTD_CACHE_MB". */
static void env_name(const option_t *o, char *out, size_t outlen)
{
    size_t n = (size_t)snprintf(out, outlen, "SLOTD_%s", o->name);
    for (size_t i = 6; i < n && i < outlen; i++)
        out[i] = out[i] == '-' ? '_' : (char)toupper((unsigned char)out[i]);
}

static const char *env_lookup(char *const *envp, const char *name)
{
    size_t len = strlen(name);
    for (; envp != NULL && *envp != NULL; envp++)
        if (strncmp(*envp, name, len) == 0 && (*envp)[len] == '=')
            return *envp + len + 1;
    return NULL;
}

static const option_t *option_find(const char *name, size_t len)
{
    for (size_t i = 0; i < NOPTIONS; i++)
        if (strlen(options[i].name) == len && strncmp(options[i].name, name, len) == 0)
            return &options[i];
    return NULL;
}

config_result_t config_parse(server_config_t *cfg, int argc, char *const *argv, char *const *envp,
                             char *err, size_t errlen)
{
    config_result_t rc;
    bool help = false, version = false;
    bool given[NOPTIONS] = {false};

    config_defaults(cfg);

    /* The flags' syntax first, so that a variable whose flag is given is
     * never read: a flag replaces its variable, even a malformed one. */
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *eq;
        const option_t *o;
        size_t len;

        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0')
            return config_fail(err, errlen, "unexpected argument '%s' (see --help)", arg);
        arg += 2;
        eq = strchr(arg, '=');
        len = eq != NULL ? (size_t)(eq - arg) : strlen(arg);
        o = option_find(arg, len);
        if (o == NULL)
            return config_fail(err, errlen, "unknown flag '--%.*s' (see --help)", (int)len, arg);
        given[o - options] = true;
        if (o->kind == OPT_FLAG) {
            if (eq != NULL)
                return config_fail(err, errlen, "--%s takes no value", o->name);
            if (strcmp(o->name, "help") == 0)
                help = true;
            else
                version = true;
            continue;
        }
        if (eq == NULL && ++i >= argc)
            return config_fail(err, errlen, "--%s needs a value", o->name);
    }

    for (size_t i = 0; i < NOPTIONS; i++) {
        char name[64];
        const char *v;
        if (options[i].kind == OPT_FLAG || given[i])
            continue;
        env_name(&options[i], name, sizeof(name));
        v = env_lookup(envp, name);
        if (v != NULL && (rc = set_option(cfg, &options[i], name, v, err, errlen)) != CONFIG_OK)
            return rc;
    }

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i] + 2;
        const char *eq = strchr(arg, '=');
        size_t len = eq != NULL ? (size_t)(eq - arg) : strlen(arg);
        const option_t *o = option_find(arg, len);
        const char *value;
        char src[64];

        if (o->kind == OPT_FLAG)
            continue;
        value = eq != NULL ? eq + 1 : argv[++i];
        snprintf(src, sizeof(src), "--%s", o->name);
        if ((rc = set_option(cfg, o, src, value, err, errlen)) != CONFIG_OK)
            return rc;
    }

    if (help)
        return CONFIG_HELP;
    if (version)
        return CONFIG_VERSION;

    /* tiny unless named: the first of --models when tiny is not among them. */
    if (!model_allowed(cfg, cfg->default_model) && cfg->default_model_from[0] == '\0')
        strcpy(cfg->default_model, cfg->models[0]);
    if (!model_allowed(cfg, cfg->default_model))
        return config_fail(
            err, errlen, "%s: '%s' is not among --models; add it to --models, or name one of them",
            cfg->default_model_from, cfg->default_model);
    if ((rc = check_preload(cfg, err, errlen)) != CONFIG_OK)
        return rc;
    if (cfg->port != 0 && cfg->port == cfg->admin_port)
        return config_fail(err, errlen, "--port and --admin-port are both %d", cfg->port);
    if (!(cfg->max_conn_share > 0.0))
        return config_fail(err, errlen, "--max-connection-share: 0 leaves no connection any share");
    cfg->auth_token[0] = '\0';
    cfg->auth_token_len = 0;
    if (cfg->auth_token_file[0] != '\0' &&
        auth_load(cfg->auth_token_file, cfg->auth_token, &cfg->auth_token_len, err, errlen) != 0)
        return CONFIG_ERROR;
    if (cfg->tenants_file[0] != '\0' && !cfg->prefix_scope_given)
        cfg->prefix_scope = CONFIG_SCOPE_TENANT; /* a tenant's prefixes are its own */
    if (cfg->tenants_file[0] != '\0') {
        tenants_file_t tf = {NULL, 0};
        if (cfg->auth_token_len > 0)
            return config_fail(err, errlen,
                        "--auth-token-file and --tenants-file: give one; a token file is a "
                        "tenants file of one line with admin");
        if (tenants_load(cfg->tenants_file, &tf, err, errlen) != 0)
            return CONFIG_ERROR;
        tenants_free(&tf);
    }
    if (cfg->protected_mode && !config_auth_on(cfg)) {
        const char *open = !host_loopback(cfg->listen)         ? cfg->listen
                           : !host_loopback(cfg->admin_listen) ? cfg->admin_listen
                                                               : NULL;
        if (open != NULL)
            return config_fail(err, errlen,
                               "protected mode: refusing to listen on %s without a token; give "
                               "--auth-token-file PATH, or --protected-mode no to serve it open",
                               open);
    }
    uint64_t phys = config_physical_mb();
    if (phys != 0 && cfg->cache_mb > phys)
        return config_fail(err, errlen,
                           "--cache-mb: %" PRIu64 " MiB is more than this machine's %" PRIu64
                           " MiB of physical memory",
                           cfg->cache_mb, phys);
    config_limits_t lim;
    config_cgroup_limits("/proc/self/cgroup", "/sys/fs/cgroup", &lim);
    if (lim.memory_mb != 0 && cfg->cache_mb > lim.memory_mb)
        return config_fail(err, errlen,
                           "--cache-mb: %" PRIu64 " MiB is more than this process's cgroup memory "
                           "limit of %" PRIu64 " MiB",
                           cfg->cache_mb, lim.memory_mb);
    return CONFIG_OK;
}

uint64_t config_physical_mb(void)
{
    long pages = sysconf(_SC_PHYS_PAGES);
    long page_size = sysconf(_SC_PAGESIZE);

    if (pages <= 0 || page_size <= 0)
        return 0;
    return (uint64_t)pages / (UINT64_C(1) << 20) * (uint64_t)page_size +
           (uint64_t)pages % (UINT64_C(1) << 20) * (uint64_t)page_size / (UINT64_C(1) << 20);
}

void config_usage(FILE *out)
{
    fprintf(out, "usage: slotd [--flag value | --flag=value]...\n\n"
                 "Serves decode sessions over JSON lines (see the protocol) and an admin\n"
                 "HTTP port.  Every flag can also be set from the environment variable\n"
                 "SLOTD_<FLAG> (--cache-mb is SLOTD_CACHE_MB); flags win.\n\n");
    for (size_t i = 0; i < NOPTIONS; i++) {
        char name[64];
        snprintf(name, sizeof(name), "--%s%s", options[i].name,
                 options[i].kind == OPT_FLAG ? "" : " V");
        fprintf(out, "  %-22s %s\n", name, options[i].help);
    }
}

const char *config_version(void)
{
    return SLOTD_VERSION;
}
