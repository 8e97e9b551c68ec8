/*
 * config.h: the daemon's settings, from command-line flags and SLOTD_*
 * environment variables (flags win over the environment, the environment
 * over the defaults).
 */
#ifndef SLOTD_SERVER_CONFIG_H
#define SLOTD_SERVER_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "server/base/auth.h"
#include "tenants.h"
#include "server/base/log.h"
#include "proto/proto.h"

#define CONFIG_MAX_MODELS 8
#define CONFIG_HOST_MAX 63
#define CONFIG_PATH_MAX 4095

#define CONFIG_MAX_PROXY_FROM 16

/** One network of --proxy-from: an address and how many of its leading
 * bits a peer's must share (32 or 128 for one address). */
typedef struct config_net {
    int family;       /* AF_INET or AF_INET6 */
    uint8_t addr[16]; /* network order; 4 bytes for AF_INET, the host bits zero */
    unsigned prefix;  /* 0..32 or 0..128 */
} config_net_t;

/** What a request that finds the pool full does (--on-full): refused at
 * once, waits for room up to --full-wait-ms, or makes room by evicting
 * idle sessions (server/evict.c). */
typedef enum config_on_full {
    CONFIG_ON_FULL_REFUSE = 0,
    CONFIG_ON_FULL_WAIT,
    CONFIG_ON_FULL_EVICT,
} config_on_full_t;

/** Every setting.  A plain value with no owned memory. */
/* Which requests may share cached blocks (--prefix-scope). */
typedef enum config_prefix_scope {
    CONFIG_SCOPE_GLOBAL = 0,     /* every connection: one scope */
    CONFIG_SCOPE_CONNECTION = 1, /* each connection its own */
    CONFIG_SCOPE_TENANT = 2,     /* each tenant its own (a connection without tenants) */
} config_prefix_scope_t;

typedef struct server_config {
    char listen[CONFIG_HOST_MAX + 1];       /* numeric IPv4 or IPv6 address of the session port */
    char admin_listen[CONFIG_HOST_MAX + 1]; /* the same for the admin port */
    int port;                               /* session port; 0 = ephemeral */
    int admin_port;                         /* admin HTTP port; 0 = ephemeral */
    uint32_t admin_idle_timeout;            /* seconds an admin connection may go unanswered */
    unsigned threads;                       /* worker threads */
    uint64_t cache_mb;                      /* pool budget in MiB */
    uint32_t max_sessions;                  /* live sessions, all connections together */
    uint32_t max_connections;               /* open session connections */
    uint32_t max_sessions_per_conn;         /* live sessions one connection may hold */
    double max_conn_share;                  /* fraction (0, 1] of the pool's bytes and slots one
                                               connection may hold */
    size_t max_line;                        /* longest request line, without "\n" */
    uint32_t idle_timeout;                  /* seconds a session may sit idle; 0 = forever */
    uint32_t conn_timeout;                  /* seconds a connection with no live session and no
                                               request in flight may sit silent; 0 = forever */
    uint32_t shutdown_timeout;              /* seconds a drain may take before exit 1 */
    uint32_t wedge_timeout;                 /* seconds a worker in a job may make no progress
                                               before /health fails (a long job counts its) */
    uint32_t reply_hold_us;                 /* microseconds a connection's replies may wait for
                                               its other jobs out; 0 = never */
    size_t nmodels;                         /* presets that may be served, in the order given */
    char models[CONFIG_MAX_MODELS][PROTO_MODEL_MAX + 1];
    size_t npreload;                        /* presets built at start, each among `models` */
    char preload[CONFIG_MAX_MODELS][PROTO_MODEL_MAX + 1];
    bool preload_given;                     /* --preload or SLOTD_PRELOAD was set */
    char default_model[PROTO_MODEL_MAX + 1]; /* one of `models` */
    char default_model_from[32];             /* the flag or variable that named it; "" if none did */
    log_level_t log_level;
    double audit_rate; /* fraction of step requests recomputed uncached, 0..1 */
    char auth_token_file[CONFIG_PATH_MAX + 1]; /* "" for none */
    char tenants_file[CONFIG_PATH_MAX + 1];    /* --tenants-file; "" for none */
    char auth_token[AUTH_TOKEN_MAX + 1];       /* read from it by config_parse(); "" for none */
    size_t auth_token_len;                     /* 0: no token, both ports open */
    bool protected_mode;                       /* refuse a non-loopback address without a token */
    uint32_t max_batch; /* single steps of one model a worker runs as one batch, 1..64 */
    uint32_t batch_us;  /* estimated microseconds a batch may take; 0 = only max_batch bounds it */
    bool worker_sched_batch; /* worker threads under SCHED_BATCH (worker.h) */
    config_on_full_t on_full; /* a request the pool has no room for (evict.c) */
    uint32_t full_wait_ms;    /* --on-full wait: the most a request waits for room */
    /* The prefix cache (cache/prefix.c): on by default; the scope of its
     * sharing. */
    bool prefix_cache;
    config_prefix_scope_t prefix_scope;
    bool prefix_scope_given; /* set by flag or environment; else tenant with a tenants file */
    /* A connection before it is served (handshake.c). */
    uint32_t auth_timeout; /* seconds from accept to auth (and PROXY header); 0 = forever */
    size_t nproxy_from;    /* peers that must send a PROXY header: none by default */
    config_net_t proxy_from[CONFIG_MAX_PROXY_FROM];
#if SLOTD_FAULT_INJECTION
    /* Test builds only: the hooks of jobfault.c (0 = off). */
    uint64_t fault_corrupt_after; /* damage the slot of the N-th step job, after it ran */
    uint64_t fault_wedge_after;   /* the N-th job holds its worker until released */
    uint32_t fault_build_delay_ms; /* a preset built on demand takes this much longer */
#endif
} server_config_t;

typedef enum config_result {
    CONFIG_OK = 0,  /* run the daemon */
    CONFIG_HELP,    /* --help was given: print config_usage(), exit 0 */
    CONFIG_VERSION, /* --version was given: print the version, exit 0 */
    CONFIG_ERROR,   /* `err` holds one line saying what is wrong: exit 2 */
} config_result_t;

/** Resource limits of the process's cgroup; 0 means none found. */
typedef struct config_limits {
    unsigned cpus;      /* CPU quota / period, rounded up */
    uint64_t memory_mb; /* memory limit in MiB */
} config_limits_t;

/** Reads the limits of the cgroup named in `cgroup_file` (normally
 * "/proc/self/cgroup") under the hierarchy mounted at `root` (normally
 * "/sys/fs/cgroup"); v2 and v1 layouts.  Anything unreadable or unlimited
 * leaves its field 0. */
void config_cgroup_limits(const char *cgroup_file, const char *root, config_limits_t *out);

/** Fills `cfg` with the defaults for a process that sees `online_cores`
 * cores, may run on `affinity_cores` of them (0: unknown) and has the
 * cgroup limits `lim`: threads is the smallest of the three, cache_mb 256
 * or half the memory limit if that is smaller. */
void config_defaults_for(server_config_t *cfg, long online_cores, long affinity_cores,
                         const config_limits_t *lim);

/** Fills `cfg` with the defaults for this process (config_defaults_for()
 * with sysconf, sched_getaffinity and the process's own cgroup). */
void config_defaults(server_config_t *cfg);

/** Parses the environment, then argv[1..argc-1] over it.  `envp` is a
 * NULL-terminated array of "NAME=value" strings (`environ`, or a test's
 * own), not kept.  Flags are `--name value` or `--name=value`.  On
 * CONFIG_ERROR, `err` (errlen bytes) gets a message without a newline. */
config_result_t config_parse(server_config_t *cfg, int argc, char *const *argv, char *const *envp,
                             char *err, size_t errlen);

/** This machine's physical memory in MiB (sysconf(_SC_PHYS_PAGES) times the
 * page size), or 0 if it cannot be read.  --cache-mb may not exceed it. */
uint64_t config_physical_mb(void);

/** Whether connections must authenticate: a token file or a tenants file
 * was given. */
static inline bool config_auth_on(const server_config_t *cfg)
{
    return cfg->auth_token_len > 0 || cfg->tenants_file[0] != '\0';
}

/** Writes the --help text to `out`. */
void config_usage(FILE *out);

/** The daemon's version ("0.1.0").  Static. */
const char *config_version(void);

#endif
