/*
 * slotd_bench.c: slotd-bench, a closed-loop load generator for slotd (and,
 * with --redis, for Redis, so that a baseline is measured by the same
 * client).  This file owns the command line, the run's phases (warm-up,
 * measured window, stop), the progress line, the `stats` queries to the
 * daemon (the drain check at the end), and the report, as a table or as one
 * JSON object.  The connections themselves live in worker.c.  With a token
 * (--auth-token-file, or SLOTD_AUTH_TOKEN_FILE as the daemon reads it; the
 * file checked by auth.c as the daemon checks it), this file builds the
 * auth line every connection sends first, the stats connections included,
 * and a refused token ends the run with status 2.
 *
 * DESIGN.  The main thread starts --threads generator threads (worker.c),
 * each with its own libuv loop and its share of the connections, and then
 * only watches: every 10 ms it looks at the clock, at the signals received,
 * at the shared control block (bench_ctl_t) and at the workers' progress
 * copies, moves ctl->phase from WARM to MEASURE to STOP and wakes every
 * worker (uv_async_send) after each move.  It joins the workers once all
 * have finished, and only then reads their figures.  It never touches a
 * worker's loop or handles.
 */
#include "bench.h"
#include "server/base/auth.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cjson/cJSON.h>
#include <uv.h>

#define EXIT_FAIL 1  /* the run completed but found something wrong */
#define EXIT_SETUP 2 /* usage, or the run could not be carried out */
#define STOP_GRACE_S 30.0
#define DRAIN_WAIT_S 2.0

static volatile sig_atomic_t got_signal;

static void on_signal(int sig)
{
    if (got_signal) {
        signal(sig, SIG_DFL);
        raise(sig);
    }
    got_signal = 1;
}

static uint64_t now_ns(void)
{
    return uv_hrtime();
}

static double secs(uint64_t ns)
{
    return (double)ns / 1e9;
}

/* Seconds from `t` to `now`, 0 if `t` is later (taken after `now`). */
static double since(uint64_t now, uint64_t t)
{
    return now > t ? secs(now - t) : 0.0;
}

/* ---- command line ---- */

static void usage(FILE *f)
{
    fprintf(f, "usage: slotd-bench [options]\n"
               "  -h, --host HOST          slotd host (default 127.0.0.1)\n"
               "  -p, --port PORT          slotd session port (default 7070)\n"
               "  -c, --connections N      connections (default 1)\n"
               "  -s, --sessions N         concurrent sessions per connection (default: -P)\n"
               "  -n, --steps N            steps per session (default: fill the context, at most "
               "64)\n"
               "  -P, --pipeline N         requests outstanding per connection (default 1)\n"
               "      --session-pipeline K steps in flight per session (default 1; -s then "
               "defaults to -P/K)\n"
               "  -t, --threads N          generator threads, each with its own loop (default 1)\n"
               "  -d, --duration SEC       length of the measured window (default 10 if no -r)\n"
               "  -r, --requests N         requests in the measured window, in total\n"
               "  -m, --model NAME         model preset (default tiny)\n"
               "      --prompt-len N       prompt length (default 3); with --shared-prefix, the\n"
               "                           length of each session's own tail\n"
               "      --shared-prefix N    every prompt opens with the same N tokens (drawn\n"
               "                           from a fixed seed), then its own --prompt-len\n"
               "      --step-n N           tokens asked for per step request (default 1)\n"
               "      --seed N             seed of the random prompts (default 1)\n"
               "      --verify             check every token and logit against the uncached "
               "reference\n"
               "      --live-sessions N    keep N sessions open over all connections, stepped "
               "round-robin\n"
               "      --open-timeout SEC   time allowed to open the --live-sessions (default 120)\n"
               "      --warmup SEC         run this long before the window opens (default 0)\n"
               "      --disconnect-rate R  reset the connection after a step reply with "
               "probability R\n"
               "      --auth-token-file PATH\n"
               "                           the daemon's token (default: $SLOTD_AUTH_TOKEN_FILE),\n"
               "                           sent as auth first on every connection; a refusal\n"
               "                           (auth_failed) or auth_required ends the run, status 2\n"
               "      --redis HOST:PORT    drive Redis with INCR (one key per session) instead\n"
               "      --no-check-drain     do not fail if the daemon holds entries at the end\n"
               "      --max-report N       diagnostic lines printed at most (default 20)\n"
               "      --temperature T      sample each step (with --top-k K, --top-p P and\n"
               "                           --sample-seed S as the protocol's sample object);\n"
               "                           --verify then checks no tokens\n"
               "      --scores all|none|K  which scores each step reply carries (default all)\n"
               "  -j, --json               print one JSON object instead of the table\n"
               "  -q, --quiet              no progress line on stderr\n"
               "      --help               this text\n");
}

static int parse_u64(const char *arg, const char *name, uint64_t min, uint64_t max, uint64_t *out)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(arg, &end, 10);
    if (errno != 0 || end == arg || *end != '\0' || arg[0] == '-' || v < min || v > max) {
        fprintf(stderr, "slotd-bench: %s must be an integer in [%llu, %llu], not '%s'\n", name,
                (unsigned long long)min, (unsigned long long)max, arg);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_u32(const char *arg, const char *name, uint32_t min, uint32_t max, uint32_t *out)
{
    uint64_t v;
    if (parse_u64(arg, name, min, max, &v) != 0) {
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

static int parse_double(const char *arg, const char *name, double min, double max, double *out)
{
    char *end;
    double v;

    errno = 0;
    v = strtod(arg, &end);
    if (errno != 0 || end == arg || *end != '\0' || !isfinite(v) || v < min || v > max) {
        fprintf(stderr, "slotd-bench: %s must be a number in [%g, %g], not '%s'\n", name, min, max,
                arg);
        return -1;
    }
    *out = v;
    return 0;
}

static int resolve(bench_config_t *cfg)
{
    struct addrinfo hints;
    struct addrinfo *res = NULL;
    char port[8];
    int rc;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(port, sizeof(port), "%u", cfg->port);
    rc = getaddrinfo(cfg->host, port, &hints, &res);
    if (rc != 0 || res == NULL) {
        fprintf(stderr, "slotd-bench: cannot resolve '%s': %s\n", cfg->host, gai_strerror(rc));
        return -1;
    }
    memcpy(&cfg->addr, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

enum {
    OPT_PROMPT_LEN = 256,
    OPT_STEP_N,
    OPT_SEED,
    OPT_VERIFY,
    OPT_LIVE,
    OPT_OPEN_TIMEOUT,
    OPT_WARMUP,
    OPT_DISCONNECT,
    OPT_REDIS,
    OPT_NO_DRAIN,
    OPT_MAX_REPORT,
    OPT_SESS_PIPELINE,
    OPT_AUTH_FILE,
    OPT_TEMPERATURE,
    OPT_TOP_K,
    OPT_TOP_P,
    OPT_SAMPLE_SEED,
    OPT_SCORES,
    OPT_SHARED_PREFIX,
    OPT_HELP,
};

static const struct option long_opts[] = {
    {"host", required_argument, NULL, 'h'},
    {"port", required_argument, NULL, 'p'},
    {"connections", required_argument, NULL, 'c'},
    {"sessions", required_argument, NULL, 's'},
    {"steps", required_argument, NULL, 'n'},
    {"pipeline", required_argument, NULL, 'P'},
    {"session-pipeline", required_argument, NULL, OPT_SESS_PIPELINE},
    {"threads", required_argument, NULL, 't'},
    {"duration", required_argument, NULL, 'd'},
    {"requests", required_argument, NULL, 'r'},
    {"model", required_argument, NULL, 'm'},
    {"prompt-len", required_argument, NULL, OPT_PROMPT_LEN},
    {"step-n", required_argument, NULL, OPT_STEP_N},
    {"seed", required_argument, NULL, OPT_SEED},
    {"verify", no_argument, NULL, OPT_VERIFY},
    {"live-sessions", required_argument, NULL, OPT_LIVE},
    {"open-timeout", required_argument, NULL, OPT_OPEN_TIMEOUT},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"disconnect-rate", required_argument, NULL, OPT_DISCONNECT},
    {"redis", required_argument, NULL, OPT_REDIS},
    {"auth-token-file", required_argument, NULL, OPT_AUTH_FILE},
    {"no-check-drain", no_argument, NULL, OPT_NO_DRAIN},
    {"max-report", required_argument, NULL, OPT_MAX_REPORT},
    {"temperature", required_argument, NULL, OPT_TEMPERATURE},
    {"top-k", required_argument, NULL, OPT_TOP_K},
    {"top-p", required_argument, NULL, OPT_TOP_P},
    {"sample-seed", required_argument, NULL, OPT_SAMPLE_SEED},
    {"scores", required_argument, NULL, OPT_SCORES},
    {"shared-prefix", required_argument, NULL, OPT_SHARED_PREFIX},
    {"json", no_argument, NULL, 'j'},
    {"quiet", no_argument, NULL, 'q'},
    {"help", no_argument, NULL, OPT_HELP},
    {NULL, 0, NULL, 0},
};

/* Reads the token file and builds cfg->auth_line, the token escaped as a
 * JSON string (a token file may hold '"' and '\\').  `from_env`: the path
 * came from SLOTD_AUTH_TOKEN_FILE, which the message then names.  Returns
 * 0, or -1 after saying why. */
static int load_auth(bench_config_t *cfg, const char *path, bool from_env)
{
    static const char head[] = "{\"op\":\"auth\",\"token\":\"";
    static const char tail[] = "\"}\n";
    char token[AUTH_TOKEN_MAX + 1];
    char err[512];
    size_t len;
    char *p;

    if (auth_load(path, token, &len, err, sizeof(err)) != 0) {
        fprintf(stderr, "slotd-bench: %s%s\n", err,
                from_env ? " (from SLOTD_AUTH_TOKEN_FILE)" : "");
        return -1;
    }
    cfg->auth_line = malloc(sizeof(head) + 2 * len + sizeof(tail));
    if (cfg->auth_line == NULL) {
        explicit_bzero(token, sizeof(token));
        fprintf(stderr, "slotd-bench: out of memory\n");
        return -1;
    }
    p = cfg->auth_line;
    memcpy(p, head, sizeof(head) - 1);
    p += sizeof(head) - 1;
    for (size_t i = 0; i < len; i++) {
        if (token[i] == '"' || token[i] == '\\') {
            *p++ = '\\';
        }
        *p++ = token[i];
    }
    memcpy(p, tail, sizeof(tail) - 1);
    p += sizeof(tail) - 1;
    cfg->auth_line_len = (size_t)(p - cfg->auth_line);
    explicit_bzero(token, sizeof(token));
    return 0;
}

/* Frees what parse_args() gave the configuration: the model, the shared
 * prefix, and the auth line, wiped first. */
static void config_release(bench_config_t *cfg)
{
    model_destroy(cfg->model);
    cfg->model = NULL;
    free(cfg->shared_toks);
    cfg->shared_toks = NULL;
    if (cfg->auth_line != NULL) {
        explicit_bzero(cfg->auth_line, cfg->auth_line_len);
        free(cfg->auth_line);
        cfg->auth_line = NULL;
    }
}

/* The decoding members of every step request, from the options: `sample`
 * holds the sample object's members written so far (",\"top_k\":5"...). */
static int decode_members(bench_config_t *cfg, const char *sample, const char *scores)
{
    int n = 0;

    if (sample[0] != '\0')
        n = snprintf(cfg->decode, sizeof(cfg->decode), ",\"sample\":{%s}", sample + 1);
    if (scores != NULL) {
        bool word = strcmp(scores, "all") == 0 || strcmp(scores, "none") == 0;
        uint64_t k;
        if (!word && parse_u64(scores, "--scores", 1, UINT32_MAX, &k) != 0)
            return -1;
        n += snprintf(cfg->decode + n, sizeof(cfg->decode) - (size_t)n,
                      word ? ",\"scores\":\"%s\"" : ",\"scores\":%s", scores);
        cfg->scores_all = strcmp(scores, "all") == 0;
    }
    cfg->samples = sample[0] != '\0';
    return n < (int)sizeof(cfg->decode) ? 0 : -1;
}

/* Appends `,"key":value` to the sample object's members. */
static int sample_member(char *sample, size_t size, const char *key, const char *value)
{
    size_t len = strlen(sample);
    char *end;

    (void)strtod(value, &end);
    if (*end != '\0' || value[0] == '\0' || strspn(value, "0123456789.eE+-") != strlen(value)) {
        fprintf(stderr, "slotd-bench: --%s needs a number\n", key);
        return -1;
    }
    return snprintf(sample + len, size - len, ",\"%s\":%s", key, value) < (int)(size - len) ? 0
                                                                                            : -1;
}

/* Returns 0, -1 on a usage error, or 1 after --help. */
static int parse_args(int argc, char **argv, bench_config_t *cfg)
{
    const char *token_file = NULL;
    char sample[200] = "";
    const char *scores = NULL;
    bool sessions_set = false;
    bool steps_set = false;
    uint32_t u32 = 0;
    int opt;

    memset(cfg, 0, sizeof(*cfg));
    snprintf(cfg->host, sizeof(cfg->host), "127.0.0.1");
    cfg->port = 7070;
    cfg->conns = 1;
    cfg->pipeline = 1;
    cfg->sess_pipeline = 1;
    cfg->threads = 1;
    cfg->prompt_len = 3;
    cfg->step_n = 1;
    cfg->seed = 1;
    cfg->open_timeout = 120.0;
    cfg->max_report = 20;
    cfg->check_drain = true;
    cfg->model_name = "tiny";
    cfg->scores_all = true;

    while ((opt = getopt_long(argc, argv, "h:p:c:s:n:P:t:d:r:m:jq", long_opts, NULL)) != -1) {
        int rc = 0;
        switch (opt) {
        case 'h':
            if (strlen(optarg) >= sizeof(cfg->host)) {
                fprintf(stderr, "slotd-bench: host name too long\n");
                return -1;
            }
            snprintf(cfg->host, sizeof(cfg->host), "%s", optarg);
            break;
        case 'p':
            rc = parse_u32(optarg, "--port", 1, 65535, &u32);
            cfg->port = (uint16_t)u32;
            break;
        case 'c':
            rc = parse_u32(optarg, "--connections", 1, 1000000, &cfg->conns);
            break;
        case 's':
            rc = parse_u32(optarg, "--sessions", 1, 10000000, &cfg->sessions);
            sessions_set = true;
            break;
        case 'n':
            rc = parse_u32(optarg, "--steps", 1, 1u << 30, &cfg->steps);
            steps_set = true;
            break;
        case 'P':
            rc = parse_u32(optarg, "--pipeline", 1, 1000000, &cfg->pipeline);
            break;
        case OPT_SESS_PIPELINE:
            rc = parse_u32(optarg, "--session-pipeline", 1, 1000000, &cfg->sess_pipeline);
            break;
        case 't':
            rc = parse_u32(optarg, "--threads", 1, 256, &cfg->threads);
            break;
        case 'd':
            rc = parse_double(optarg, "--duration", 0.0, 1e7, &cfg->duration);
            break;
        case 'r':
            rc = parse_u64(optarg, "--requests", 1, (uint64_t)INT64_MAX / 2, &cfg->requests);
            break;
        case 'm':
            cfg->model_name = optarg;
            break;
        case OPT_PROMPT_LEN:
            rc = parse_u32(optarg, "--prompt-len", 1, 1u << 20, &cfg->prompt_len);
            break;
        case OPT_STEP_N:
            rc = parse_u32(optarg, "--step-n", 1, 1u << 20, &cfg->step_n);
            break;
        case OPT_SEED:
            rc = parse_u64(optarg, "--seed", 0, UINT64_MAX, &cfg->seed);
            break;
        case OPT_VERIFY:
            cfg->verify = true;
            break;
        case OPT_LIVE:
            rc = parse_u64(optarg, "--live-sessions", 1, 100000000, &cfg->live_sessions);
            break;
        case OPT_OPEN_TIMEOUT:
            rc = parse_double(optarg, "--open-timeout", 0.1, 1e6, &cfg->open_timeout);
            break;
        case OPT_WARMUP:
            rc = parse_double(optarg, "--warmup", 0.0, 1e6, &cfg->warmup);
            break;
        case OPT_DISCONNECT:
            rc = parse_double(optarg, "--disconnect-rate", 0.0, 1.0, &cfg->disconnect_rate);
            break;
        case OPT_REDIS: {
            const char *colon = strrchr(optarg, ':');
            size_t hl = colon != NULL ? (size_t)(colon - optarg) : strlen(optarg);
            cfg->redis = true;
            if (hl == 0 || hl >= sizeof(cfg->host)) {
                fprintf(stderr, "slotd-bench: --redis wants HOST:PORT, not '%s'\n", optarg);
                return -1;
            }
            memcpy(cfg->host, optarg, hl);
            cfg->host[hl] = '\0';
            cfg->port = 6379;
            if (colon != NULL) {
                rc = parse_u32(colon + 1, "--redis port", 1, 65535, &u32);
                cfg->port = (uint16_t)u32;
            }
            break;
        }
        case OPT_NO_DRAIN:
            cfg->check_drain = false;
            break;
        case OPT_AUTH_FILE:
            token_file = optarg;
            break;
        case OPT_MAX_REPORT:
            rc = parse_u32(optarg, "--max-report", 0, 1u << 30, &cfg->max_report);
            break;
        case OPT_TEMPERATURE:
            rc = sample_member(sample, sizeof(sample), "temperature", optarg);
            break;
        case OPT_TOP_K:
            rc = sample_member(sample, sizeof(sample), "top_k", optarg);
            break;
        case OPT_TOP_P:
            rc = sample_member(sample, sizeof(sample), "top_p", optarg);
            break;
        case OPT_SAMPLE_SEED:
            rc = sample_member(sample, sizeof(sample), "seed", optarg);
            break;
        case OPT_SCORES:
            scores = optarg;
            break;
        case OPT_SHARED_PREFIX:
            rc = parse_u32(optarg, "--shared-prefix", 1, 1u << 20, &cfg->shared_prefix);
            break;
        case 'j':
            cfg->json = true;
            break;
        case 'q':
            cfg->quiet = true;
            break;
        case OPT_HELP:
            usage(stdout);
            return 1;
        default:
            usage(stderr);
            return -1;
        }
        if (rc != 0) {
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "slotd-bench: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (decode_members(cfg, sample, scores) != 0) {
        fprintf(stderr, "slotd-bench: bad --scores or sample options\n");
        return -1;
    }

    if (cfg->duration == 0.0 && cfg->requests == 0) {
        cfg->duration = 10.0;
    }
    if (!sessions_set) {
        /* Enough sessions to keep -P requests outstanding. */
        cfg->sessions = (cfg->pipeline + cfg->sess_pipeline - 1) / cfg->sess_pipeline;
    }
    if (cfg->live_sessions > 0) {
        if (cfg->live_sessions < cfg->conns) {
            fprintf(stderr, "slotd-bench: --live-sessions must be at least -c\n");
            return -1;
        }
        if (cfg->live_sessions / cfg->conns >= UINT32_MAX) {
            fprintf(stderr, "slotd-bench: too many sessions per connection\n");
            return -1;
        }
    }
    if (cfg->threads > cfg->conns) {
        cfg->threads = cfg->conns;
    }

    if (cfg->redis && token_file != NULL) {
        fprintf(stderr, "slotd-bench: --auth-token-file is for slotd, not --redis\n");
        return -1;
    }
    if (!cfg->redis) {
        /* The daemon's own variable, so that one export serves both. */
        const char *env = getenv("SLOTD_AUTH_TOKEN_FILE");
        bool from_env = token_file == NULL && env != NULL;
        if (from_env) {
            token_file = env;
        }
        if (token_file != NULL && load_auth(cfg, token_file, from_env) != 0) {
            return -1;
        }
    }

    if (cfg->redis && cfg->shared_prefix > 0) {
        fprintf(stderr, "slotd-bench: --shared-prefix is for slotd, not --redis\n");
        return -1;
    }
    if (cfg->redis) {
        cfg->model_name = "redis";
        cfg->steps = UINT32_MAX;
        cfg->check_drain = false;
        return 0;
    }
    if (model_create(cfg->model_name, &cfg->model) != SLOTD_OK) {
        fprintf(stderr, "slotd-bench: unknown model '%s' (known: %s)\n", cfg->model_name,
                model_presets());
        return -1;
    }
    cfg->vocab = model_vocab(cfg->model);
    cfg->max_ctx = model_max_ctx(cfg->model);
    cfg->has_logits = model_family(cfg->model) == MODEL_FAMILY_ATTN;
    if ((uint64_t)cfg->shared_prefix + cfg->prompt_len >= cfg->max_ctx) {
        fprintf(stderr,
                "slotd-bench: --prompt-len%s must be below the model's max_ctx (%u)\n",
                cfg->shared_prefix > 0 ? " plus --shared-prefix" : "", cfg->max_ctx);
        return -1;
    }
    if (cfg->shared_prefix > 0) {
        /* One fixed seed, whatever --seed: runs share the same prefix. */
        uint64_t x = UINT64_C(0x5107D5EED);
        cfg->shared_toks = malloc(cfg->shared_prefix * sizeof(*cfg->shared_toks));
        if (cfg->shared_toks == NULL) {
            fprintf(stderr, "slotd-bench: out of memory\n");
            return -1;
        }
        for (uint32_t k = 0; k < cfg->shared_prefix; k++) {
            /* splitmix64 */
            uint64_t z = (x += UINT64_C(0x9E3779B97F4A7C15));
            z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
            z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
            cfg->shared_toks[k] = (int64_t)((z ^ (z >> 31)) % cfg->vocab);
        }
        cfg->prompt_len += cfg->shared_prefix; /* the whole prompt from here on */
    }
    if (!steps_set) {
        cfg->steps = cfg->max_ctx - cfg->prompt_len;
        if (cfg->steps > 64) {
            cfg->steps = 64;
        }
    }
    if ((uint64_t)cfg->prompt_len + cfg->steps > cfg->max_ctx) {
        fprintf(stderr,
                "slotd-bench: --prompt-len %u plus -n %u is more than %s's max_ctx %u: a step "
                "would be context_full\n",
                cfg->prompt_len, cfg->steps, cfg->model_name, cfg->max_ctx);
        return -1;
    }
    if (cfg->step_n > cfg->steps) {
        cfg->step_n = cfg->steps;
    }
    return 0;
}

/* ---- the daemon's `stats` ---- */

typedef struct daemon_stats {
    bool ok;
    int64_t cache_entries;
    int64_t live_sessions;
    int64_t connections;
    int64_t requests_total;
    int64_t errors_total;
    char error[160];
} daemon_stats_t;

static int64_t json_int(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : -1;
}

/* Sends {"op":"stats"} on a fresh connection (after the auth line, with a
 * token) and reads the one-line reply. */
static daemon_stats_t query_stats(const bench_config_t *cfg)
{
    daemon_stats_t ds;
    struct timeval tv = {5, 0};
    static const char req[] = "{\"op\":\"stats\"}\n";
    char buf[8192];
    size_t len = 0;
    size_t want = cfg->auth_line != NULL ? 2 : 1; /* reply lines */
    char *line = buf;
    cJSON *j = NULL;
    int fd;

    memset(&ds, 0, sizeof(ds));
    fd = socket(cfg->addr.ss_family, SOCK_STREAM, 0);
    if (fd < 0) {
        snprintf(ds.error, sizeof(ds.error), "socket: %s", strerror(errno));
        return ds;
    }
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, (const struct sockaddr *)&cfg->addr,
                cfg->addr.ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                : sizeof(struct sockaddr_in)) != 0) {
        snprintf(ds.error, sizeof(ds.error), "connect: %s", strerror(errno));
        goto out;
    }
    if ((cfg->auth_line != NULL &&
         write(fd, cfg->auth_line, cfg->auth_line_len) != (ssize_t)cfg->auth_line_len) ||
        write(fd, req, sizeof(req) - 1) != (ssize_t)(sizeof(req) - 1)) {
        snprintf(ds.error, sizeof(ds.error), "write: %s", strerror(errno));
        goto out;
    }
    while (len < sizeof(buf) - 1) {
        ssize_t n = read(fd, buf + len, sizeof(buf) - 1 - len);
        if (n == 0 && want == 2 && len > 0) {
            break; /* closed after a refused token: its reply is read below */
        }
        if (n <= 0) {
            snprintf(ds.error, sizeof(ds.error), "read: %s",
                     n == 0 ? "connection closed" : strerror(errno));
            goto out;
        }
        len += (size_t)n;
        size_t lines = 0;
        for (const char *q = buf; (q = memchr(q, '\n', len - (size_t)(q - buf))) != NULL; q++) {
            lines++;
        }
        if (lines >= want) {
            break;
        }
    }
    buf[len] = '\0';
    if (cfg->auth_line != NULL) {
        char *nl = strchr(buf, '\n');
        if (nl != NULL) {
            *nl = '\0';
        }
        j = cJSON_Parse(buf);
        if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "ok"))) {
            snprintf(ds.error, sizeof(ds.error), "auth answered: %.100s", buf);
            goto out;
        }
        cJSON_Delete(j);
        line = nl != NULL ? nl + 1 : buf + len;
    }
    j = cJSON_Parse(line);
    if (!cJSON_IsObject(j) || cJSON_GetObjectItemCaseSensitive(j, "cache_entries") == NULL) {
        snprintf(ds.error, sizeof(ds.error), "unexpected stats reply: %.100s", line);
        goto out;
    }
    ds.cache_entries = json_int(j, "cache_entries");
    ds.live_sessions = json_int(j, "live_sessions");
    ds.connections = json_int(j, "connections");
    ds.requests_total = json_int(j, "requests_total");
    ds.errors_total = json_int(j, "errors_total");
    ds.ok = true;
out:
    cJSON_Delete(j);
    close(fd);
    return ds;
}

static void sleep_s(double s)
{
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !got_signal) {
    }
}

/* ---- the report ---- */

typedef struct totals {
    bench_stats_t st; /* sums; histograms merged */
    double window_s;
    double cpu_s; /* process CPU (getrusage) over the window */
    double cpu_user_s;
    double cpu_sys_s;
    double busiest_pct; /* the busiest generator thread's CPU over its window */
    double open_s;      /* --live-sessions: time to open them all */
    uint64_t live_open;
    daemon_stats_t at_mark;
    daemon_stats_t at_stop;
    daemon_stats_t drain_first;
    daemon_stats_t drain_last;
    double drain_wait_s;
    bool drain_checked;
    bool drained;
    const char *fatal;
    bool interrupted;
} totals_t;

static void merge(totals_t *t, const bench_stats_t *s)
{
    bench_stats_t *d = &t->st;

    d->win_steps += s->win_steps;
    d->win_requests += s->win_requests;
    d->win_errors += s->win_errors;
    hist_merge(&d->win_step_lat, &s->win_step_lat);
    hist_merge(&d->win_req_lat, &s->win_req_lat);
    if (s->mark_ns != 0 && (d->mark_ns == 0 || s->mark_ns < d->mark_ns)) {
        d->mark_ns = s->mark_ns;
    }
    if (s->freeze_ns > d->freeze_ns) {
        d->freeze_ns = s->freeze_ns;
    }
    if (s->freeze_ns > s->mark_ns + 10000000u) {
        double pct = 100.0 * (double)s->cpu_ns / (double)(s->freeze_ns - s->mark_ns);
        if (pct > t->busiest_pct) {
            t->busiest_pct = pct;
        }
    }
    d->steps += s->steps;
    d->requests += s->requests;
    d->starts += s->starts;
    d->finishes += s->finishes;
    d->errors += s->errors;
    for (uint32_t i = 0; i < s->codes.n; i++) {
        bench_codes_add(&d->codes, s->codes.name[i], strlen(s->codes.name[i]), s->codes.count[i]);
    }
    d->mismatches += s->mismatches;
    d->checked_tokens += s->checked_tokens;
    d->checked_logits += s->checked_logits;
    d->protocol_errors += s->protocol_errors;
    d->conn_errors += s->conn_errors;
    d->disconnects += s->disconnects;
    d->reconnects += s->reconnects;
    d->ref_hits += s->ref_hits;
    d->prompt_entries += s->prompt_entries;
    d->cached_entries += s->cached_entries;
    d->ref_misses += s->ref_misses;
}

static double rate(uint64_t n, double s)
{
    return s > 0 ? (double)n / s : 0.0;
}

static cJSON *lat_json(const hist_t *h)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "count", (double)h->total);
    cJSON_AddNumberToObject(o, "p50", (double)hist_percentile(h, 50.0));
    cJSON_AddNumberToObject(o, "p90", (double)hist_percentile(h, 90.0));
    cJSON_AddNumberToObject(o, "p99", (double)hist_percentile(h, 99.0));
    cJSON_AddNumberToObject(o, "p999", (double)hist_percentile(h, 99.9));
    cJSON_AddNumberToObject(o, "max", (double)(h->total ? h->max : 0));
    cJSON_AddNumberToObject(o, "mean", round(hist_mean(h) * 10.0) / 10.0);
    return o;
}

static cJSON *daemon_json(const daemon_stats_t *d)
{
    if (!d->ok) {
        return cJSON_CreateNull();
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "cache_entries", (double)d->cache_entries);
    cJSON_AddNumberToObject(o, "live_sessions", (double)d->live_sessions);
    cJSON_AddNumberToObject(o, "connections", (double)d->connections);
    return o;
}

static void print_json(const bench_config_t *cfg, const totals_t *t, int status)
{
    const bench_stats_t *s = &t->st;
    cJSON *o = cJSON_CreateObject();
    cJSON *cfgj;
    cJSON *errs;
    cJSON *cpu;
    cJSON *dm;
    char *text;

    cJSON_AddStringToObject(o, "target", cfg->redis ? "redis" : "slotd");
    cfgj = cJSON_AddObjectToObject(o, "config");
    cJSON_AddStringToObject(cfgj, "host", cfg->host);
    cJSON_AddNumberToObject(cfgj, "port", cfg->port);
    cJSON_AddStringToObject(cfgj, "model", cfg->model_name);
    cJSON_AddNumberToObject(cfgj, "connections", cfg->conns);
    cJSON_AddNumberToObject(cfgj, "sessions_per_connection",
                            cfg->live_sessions > 0 ? (double)cfg->live_sessions / cfg->conns
                                                   : (double)cfg->sessions);
    cJSON_AddNumberToObject(cfgj, "live_sessions", (double)cfg->live_sessions);
    cJSON_AddNumberToObject(cfgj, "pipeline", cfg->pipeline);
    if (cfg->sess_pipeline > 1) {
        cJSON_AddNumberToObject(cfgj, "session_pipeline", cfg->sess_pipeline);
    }
    cJSON_AddNumberToObject(cfgj, "threads", cfg->threads);
    if (!cfg->redis) {
        cJSON_AddNumberToObject(cfgj, "steps_per_session", cfg->steps);
        cJSON_AddNumberToObject(cfgj, "step_n", cfg->step_n);
        cJSON_AddNumberToObject(cfgj, "prompt_len", cfg->prompt_len);
        cJSON_AddNumberToObject(cfgj, "shared_prefix", cfg->shared_prefix);
    }
    cJSON_AddNumberToObject(cfgj, "seed", (double)cfg->seed);
    cJSON_AddNumberToObject(cfgj, "duration", cfg->duration);
    cJSON_AddNumberToObject(cfgj, "requests", (double)cfg->requests);
    cJSON_AddNumberToObject(cfgj, "disconnect_rate", cfg->disconnect_rate);
    cJSON_AddBoolToObject(cfgj, "verify", cfg->verify);

    cJSON_AddNumberToObject(o, "window_s", round(t->window_s * 1e6) / 1e6);
    cJSON_AddNumberToObject(o, "steps", (double)s->win_steps);
    cJSON_AddNumberToObject(o, "steps_per_s", round(rate(s->win_steps, t->window_s) * 10) / 10);
    cJSON_AddNumberToObject(o, "requests", (double)s->win_requests);
    cJSON_AddNumberToObject(o, "requests_per_s",
                            round(rate(s->win_requests, t->window_s) * 10) / 10);
    cJSON_AddItemToObject(o, "latency_us", lat_json(&s->win_step_lat));
    cJSON_AddItemToObject(o, "latency_all_us", lat_json(&s->win_req_lat));
    errs = cJSON_AddObjectToObject(o, "errors");
    cJSON_AddNumberToObject(errs, "total", (double)s->errors);
    cJSON_AddNumberToObject(errs, "in_window", (double)s->win_errors);
    {
        cJSON *by = cJSON_AddObjectToObject(errs, "by_code");
        for (uint32_t i = 0; i < s->codes.n; i++) {
            cJSON_AddNumberToObject(by, s->codes.name[i], (double)s->codes.count[i]);
        }
    }
    cJSON_AddNumberToObject(errs, "protocol", (double)s->protocol_errors);
    cJSON_AddNumberToObject(errs, "connection", (double)s->conn_errors);
    cJSON_AddNumberToObject(o, "mismatches", (double)s->mismatches);
    cJSON_AddNumberToObject(o, "checked_tokens", (double)s->checked_tokens);
    cJSON_AddNumberToObject(o, "checked_logits", (double)s->checked_logits);
    cJSON_AddNumberToObject(o, "run_steps", (double)s->steps);
    cJSON_AddNumberToObject(o, "run_requests", (double)s->requests);
    cJSON_AddNumberToObject(o, "sessions_started", (double)s->starts);
    cJSON_AddNumberToObject(o, "sessions_finished", (double)s->finishes);
    if (!cfg->redis) {
        cJSON_AddNumberToObject(o, "prompt_entries", (double)s->prompt_entries);
        cJSON_AddNumberToObject(o, "cached_entries", (double)s->cached_entries);
        cJSON_AddNumberToObject(o, "cached_ratio",
                                s->prompt_entries == 0 ? 0.0
                                                       : round(1e4 * (double)s->cached_entries /
                                                               (double)s->prompt_entries) /
                                                             1e4);
    }
    cJSON_AddNumberToObject(o, "disconnects", (double)s->disconnects);
    cJSON_AddNumberToObject(o, "reconnects", (double)s->reconnects);
    if (cfg->live_sessions > 0) {
        cJSON_AddNumberToObject(o, "live_sessions_opened", (double)t->live_open);
        cJSON_AddNumberToObject(o, "open_s", round(t->open_s * 1000) / 1000);
    }
    cpu = cJSON_AddObjectToObject(o, "client_cpu");
    cJSON_AddNumberToObject(cpu, "user_s", round(t->cpu_user_s * 1000) / 1000);
    cJSON_AddNumberToObject(cpu, "sys_s", round(t->cpu_sys_s * 1000) / 1000);
    cJSON_AddNumberToObject(cpu, "percent",
                            t->window_s >= 0.01 ? round(1000 * t->cpu_s / t->window_s) / 10 : 0);
    cJSON_AddNumberToObject(cpu, "busiest_thread_percent", round(t->busiest_pct * 10) / 10);
    if (!cfg->redis) {
        dm = cJSON_AddObjectToObject(o, "daemon");
        cJSON_AddItemToObject(dm, "window_start", daemon_json(&t->at_mark));
        cJSON_AddItemToObject(dm, "window_end", daemon_json(&t->at_stop));
        cJSON_AddItemToObject(dm, "end", daemon_json(&t->drain_last));
        cJSON_AddBoolToObject(dm, "drained", t->drained);
        cJSON_AddNumberToObject(dm, "drain_wait_s", round(t->drain_wait_s * 1000) / 1000);
    }
    if (t->fatal != NULL) {
        cJSON_AddStringToObject(o, "fatal", t->fatal);
    }
    cJSON_AddBoolToObject(o, "interrupted", t->interrupted);
    cJSON_AddNumberToObject(o, "exit_status", status);
    text = cJSON_PrintUnformatted(o);
    if (text != NULL) {
        printf("%s\n", text);
    }
    cJSON_free(text);
    cJSON_Delete(o);
}

static void print_lat(const char *name, const hist_t *h)
{
    printf(
        "%-22s p50 %7llu  p90 %7llu  p99 %7llu  p99.9 %7llu  max %8llu  mean %9.1f\n", name,
        (unsigned long long)hist_percentile(h, 50.0), (unsigned long long)hist_percentile(h, 90.0),
        (unsigned long long)hist_percentile(h, 99.0), (unsigned long long)hist_percentile(h, 99.9),
        (unsigned long long)(h->total ? h->max : 0), hist_mean(h));
}

static void print_table(const bench_config_t *cfg, const totals_t *t, int status)
{
    const bench_stats_t *s = &t->st;

    if (cfg->redis) {
        printf("target                 redis %s:%u, INCR, one key per session\n", cfg->host,
               cfg->port);
    } else {
        printf("target                 slotd %s:%u, model %s, prompt %u (%u shared), %u "
               "steps/session, step-n %u%s\n",
               cfg->host, cfg->port, cfg->model_name, cfg->prompt_len, cfg->shared_prefix,
               cfg->steps, cfg->step_n, cfg->verify ? ", verified" : "");
    }
    if (cfg->live_sessions > 0) {
        printf("load                   %u connections, %llu live sessions, pipeline %u, %u "
               "thread%s\n",
               cfg->conns, (unsigned long long)cfg->live_sessions, cfg->pipeline, cfg->threads,
               cfg->threads == 1 ? "" : "s");
        printf("opening                %llu sessions open in %.2f s\n",
               (unsigned long long)t->live_open, t->open_s);
    } else {
        printf("load                   %u connections x %u sessions, pipeline %u, %u thread%s",
               cfg->conns, cfg->sessions, cfg->pipeline, cfg->threads,
               cfg->threads == 1 ? "" : "s");
        if (cfg->sess_pipeline > 1) {
            printf(", session pipeline %u", cfg->sess_pipeline);
        }
        printf("\n");
    }
    printf("window                 %.3f s\n", t->window_s);
    printf("steps                  %12llu  %12.1f /s\n", (unsigned long long)s->win_steps,
           rate(s->win_steps, t->window_s));
    printf("requests               %12llu  %12.1f /s\n", (unsigned long long)s->win_requests,
           rate(s->win_requests, t->window_s));
    print_lat(cfg->redis ? "latency INCR (us)" : "latency step (us)", &s->win_step_lat);
    if (!cfg->redis) {
        print_lat("latency all (us)", &s->win_req_lat);
    }
    printf("errors                 %llu (in window %llu)", (unsigned long long)s->errors,
           (unsigned long long)s->win_errors);
    for (uint32_t i = 0; i < s->codes.n; i++) {
        printf("%s %s %llu", i == 0 ? ":" : ",", s->codes.name[i],
               (unsigned long long)s->codes.count[i]);
    }
    printf("\n");
    printf("protocol / connection  %llu unreadable replies, %llu connections lost\n",
           (unsigned long long)s->protocol_errors, (unsigned long long)s->conn_errors);
    if (cfg->disconnect_rate > 0) {
        printf("disconnects            %llu resets on purpose, %llu reconnects\n",
               (unsigned long long)s->disconnects, (unsigned long long)s->reconnects);
    }
    if (!cfg->redis) {
        printf("sessions               %llu started, %llu finished (whole run)\n",
               (unsigned long long)s->starts, (unsigned long long)s->finishes);
        printf("prefix cache           %llu of %llu prompt entries cached (%.1f%%)%s\n",
               (unsigned long long)s->cached_entries, (unsigned long long)s->prompt_entries,
               s->prompt_entries == 0
                   ? 0.0
                   : 100.0 * (double)s->cached_entries / (double)s->prompt_entries,
               cfg->shared_prefix > 0 ? ", shared prefix of every prompt" : "");
    }
    if (cfg->verify && cfg->redis) {
        printf("verify                 %llu mismatches; %llu INCR values checked\n",
               (unsigned long long)s->mismatches, (unsigned long long)s->checked_tokens);
    } else if (cfg->verify) {
        printf("verify                 %llu mismatches; %llu tokens and %llu logits checked\n",
               (unsigned long long)s->mismatches, (unsigned long long)s->checked_tokens,
               (unsigned long long)s->checked_logits);
    }
    if (t->window_s >= 0.01) {
        printf("client cpu             %.2f s user + %.2f s sys = %.1f%% of one core; busiest "
               "thread %.1f%%\n",
               t->cpu_user_s, t->cpu_sys_s, 100.0 * t->cpu_s / t->window_s, t->busiest_pct);
    }
    if (!cfg->redis) {
        if (t->at_mark.ok && t->at_stop.ok) {
            printf("daemon in window       live_sessions %lld -> %lld, cache_entries %lld -> "
                   "%lld, connections %lld\n",
                   (long long)t->at_mark.live_sessions, (long long)t->at_stop.live_sessions,
                   (long long)t->at_mark.cache_entries, (long long)t->at_stop.cache_entries,
                   (long long)t->at_stop.connections);
        }
        if (t->drain_last.ok) {
            printf("daemon at end          cache_entries %lld, live_sessions %lld%s",
                   (long long)t->drain_last.cache_entries, (long long)t->drain_last.live_sessions,
                   t->drained ? " (drained)" : " (NOT DRAINED)");
            if (t->drain_wait_s > 0) {
                printf(", after %.2f s (first answer: %lld, %lld)", t->drain_wait_s,
                       (long long)t->drain_first.cache_entries,
                       (long long)t->drain_first.live_sessions);
            }
            printf("\n");
        } else if (t->drain_checked) {
            printf("daemon at end          stats failed: %s\n", t->drain_last.error);
        }
    }
    if (t->fatal != NULL) {
        printf("fatal                  %s\n", t->fatal);
    }
    if (t->interrupted) {
        printf("interrupted            yes\n");
    }
    printf("exit status            %d\n", status);
}

/* ---- main ---- */

static void wake_all(worker_t **ws, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        worker_wake(ws[i]);
    }
}

static double ru_secs(const struct timeval *tv)
{
    return (double)tv->tv_sec + (double)tv->tv_usec / 1e6;
}

static void raise_fd_limit(uint32_t conns)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        return;
    }
    if (rl.rlim_cur < (rlim_t)conns + 64 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
        (void)getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur < (rlim_t)conns + 64) {
        fprintf(stderr, "slotd-bench: warning: open-file limit %llu is low for %u connections\n",
                (unsigned long long)rl.rlim_cur, conns);
    }
}

int main(int argc, char **argv)
{
    bench_config_t cfg;
    bench_ctl_t ctl;
    totals_t t;
    worker_t **ws = NULL;
    struct rusage ru_mark;
    struct rusage ru_stop;
    uint64_t t_start;
    uint64_t t_mark = 0;
    uint64_t t_stop = 0;
    uint64_t t_open = 0;
    uint64_t last_progress;
    uint64_t last_steps = 0;
    uint64_t last_requests = 0;
    bool progress;
    int status = 0;
    int rc;

    rc = parse_args(argc, argv, &cfg);
    if (rc != 0) {
        config_release(&cfg);
        return rc > 0 ? 0 : EXIT_SETUP;
    }
    if (resolve(&cfg) != 0) {
        config_release(&cfg);
        return EXIT_SETUP;
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    raise_fd_limit(cfg.conns);

    memset(&t, 0, sizeof(t));
    hist_reset(&t.st.win_step_lat);
    hist_reset(&t.st.win_req_lat);
    atomic_init(&ctl.phase, PHASE_WARM);
    atomic_init(&ctl.budget, (int64_t)cfg.requests);
    atomic_init(&ctl.live_open, 0);
    atomic_init(&ctl.fatal, 0);
    atomic_init(&ctl.printed_reports, 0);

    ws = calloc(cfg.threads, sizeof(*ws));
    if (ws == NULL) {
        fprintf(stderr, "slotd-bench: out of memory\n");
        config_release(&cfg);
        return EXIT_SETUP;
    }
    for (uint32_t i = 0; i < cfg.threads; i++) {
        char err[256];
        ws[i] = worker_create(&cfg, &ctl, i, err, sizeof(err));
        if (ws[i] == NULL) {
            fprintf(stderr, "slotd-bench: %s\n", err);
            status = EXIT_SETUP;
            goto out;
        }
    }

    progress = !cfg.quiet &&
               (cfg.duration == 0.0 || cfg.duration + cfg.warmup > 3.0 || cfg.live_sessions > 0);
    t_start = now_ns();
    last_progress = t_start;
    for (uint32_t i = 0; i < cfg.threads; i++) {
        if (worker_start(ws[i]) != 0) {
            fprintf(stderr, "slotd-bench: cannot start thread %u\n", i);
            atomic_store(&ctl.phase, PHASE_STOP);
            wake_all(ws, i);
            status = EXIT_SETUP;
            goto join;
        }
    }

    for (;;) {
        uint64_t now = now_ns();
        int phase = atomic_load(&ctl.phase);
        bool all_done = true;

        for (uint32_t i = 0; i < cfg.threads; i++) {
            all_done = all_done && worker_done(ws[i]);
        }
        if (all_done) {
            break;
        }
        if (got_signal && phase < PHASE_STOP) {
            t.interrupted = true;
            phase = PHASE_STOP;
        }
        if (phase == PHASE_WARM) {
            bool go = false;
            if (cfg.live_sessions > 0) {
                uint64_t open = atomic_load(&ctl.live_open);
                if (t_open == 0 && open >= cfg.live_sessions) {
                    t_open = now;
                } else if (t_open == 0 && since(now, t_start) >= cfg.open_timeout) {
                    fprintf(stderr,
                            "slotd-bench: only %llu of %llu sessions opened in %.0f s; "
                            "measuring anyway\n",
                            (unsigned long long)open, (unsigned long long)cfg.live_sessions,
                            cfg.open_timeout);
                    t_open = now;
                }
                go = t_open != 0 && since(now, t_open) >= cfg.warmup;
            } else {
                go = since(now, t_start) >= cfg.warmup;
            }
            if (go) {
                if (!cfg.redis) {
                    t.at_mark = query_stats(&cfg);
                }
                t.live_open = atomic_load(&ctl.live_open);
                t.open_s = t_open != 0 ? secs(t_open - t_start) : 0.0;
                getrusage(RUSAGE_SELF, &ru_mark);
                t_mark = now_ns();
                atomic_store(&ctl.phase, PHASE_MEASURE);
                wake_all(ws, cfg.threads);
                phase = PHASE_MEASURE;
            }
        }
        if (phase == PHASE_MEASURE && cfg.duration > 0 && since(now, t_mark) >= cfg.duration) {
            phase = PHASE_STOP;
        }
        if (phase == PHASE_STOP && t_stop == 0) {
            if (t_mark == 0) {
                getrusage(RUSAGE_SELF, &ru_mark);
                t_mark = now_ns();
            }
            if (!cfg.redis && atomic_load(&ctl.fatal) == 0) {
                t.at_stop = query_stats(&cfg);
            }
            getrusage(RUSAGE_SELF, &ru_stop);
            t_stop = now_ns();
            atomic_store(&ctl.phase, PHASE_STOP);
            wake_all(ws, cfg.threads);
        }
        if (t_stop != 0 && since(now, t_stop) > STOP_GRACE_S) {
            fprintf(stderr,
                    "slotd-bench: sessions still not finished %.0f s after the window closed; "
                    "giving up\n",
                    STOP_GRACE_S);
            fflush(NULL);
            _exit(EXIT_SETUP);
        }
        if (progress && now - last_progress >= 1000000000u) {
            uint64_t steps = 0;
            uint64_t reqs = 0;
            uint64_t errs = 0;
            uint32_t open = 0;
            double dt = secs(now - last_progress);
            for (uint32_t i = 0; i < cfg.threads; i++) {
                uint64_t a, b, e;
                uint32_t o;
                worker_progress(ws[i], &a, &b, &e, &o);
                steps += a;
                reqs += b;
                errs += e;
                open += o;
            }
            fprintf(stderr,
                    "[%6.1fs] %-8s steps/s %10.0f  req/s %10.0f  errors %llu  connections "
                    "%u/%u",
                    since(now, t_start),
                    phase == PHASE_WARM      ? "warm-up"
                    : phase == PHASE_MEASURE ? "measure"
                                             : "stop",
                    (double)(steps - last_steps) / dt, (double)(reqs - last_requests) / dt,
                    (unsigned long long)errs, open, cfg.conns);
            if (cfg.live_sessions > 0) {
                fprintf(stderr, "  opened %llu/%llu",
                        (unsigned long long)atomic_load(&ctl.live_open),
                        (unsigned long long)cfg.live_sessions);
            }
            fprintf(stderr, "\n");
            last_progress = now;
            last_steps = steps;
            last_requests = reqs;
        }
        sleep_s(0.01);
    }

join:
    for (uint32_t i = 0; i < cfg.threads; i++) {
        const char *fatal = worker_join(ws[i]);
        if (fatal != NULL && t.fatal == NULL) {
            t.fatal = fatal;
        }
        merge(&t, worker_stats(ws[i]));
    }
    if (status != 0) {
        goto out;
    }
    if (t_stop == 0) {
        getrusage(RUSAGE_SELF, &ru_stop);
    }
    t.window_s = t.st.freeze_ns > t.st.mark_ns ? secs(t.st.freeze_ns - t.st.mark_ns) : 0.0;
    t.cpu_user_s = ru_secs(&ru_stop.ru_utime) - ru_secs(&ru_mark.ru_utime);
    t.cpu_sys_s = ru_secs(&ru_stop.ru_stime) - ru_secs(&ru_mark.ru_stime);
    t.cpu_s = t.cpu_user_s + t.cpu_sys_s;

    /* The drain check: every session this run opened is finished or its
     * connection closed, so the daemon must hold nothing (when nobody else
     * uses it).  Slots of reset connections are released when the daemon
     * sees the reset, so allow it a moment. */
    if (!cfg.redis && t.fatal == NULL) {
        uint64_t d0 = now_ns();
        t.drain_checked = true;
        t.drain_first = query_stats(&cfg);
        t.drain_last = t.drain_first;
        while (t.drain_last.ok &&
               (t.drain_last.cache_entries != 0 || t.drain_last.live_sessions != 0) &&
               secs(now_ns() - d0) < DRAIN_WAIT_S && !got_signal) {
            sleep_s(0.05);
            t.drain_last = query_stats(&cfg);
        }
        t.drained =
            t.drain_last.ok && t.drain_last.cache_entries == 0 && t.drain_last.live_sessions == 0;
        if (t.drain_first.ok &&
            (t.drain_first.cache_entries != 0 || t.drain_first.live_sessions != 0)) {
            t.drain_wait_s = secs(now_ns() - d0);
        }
    }

    /* A window much shorter than asked means the generator's threads were
     * busy elsewhere (e.g. computing --verify references on long prompts)
     * when it should have opened: its rates would be meaningless. */
    bool short_window =
        cfg.duration > 0 && !got_signal && t.fatal == NULL && t.window_s < 0.5 * cfg.duration;
    if (t.fatal != NULL) {
        fprintf(stderr, "slotd-bench: %s\n", t.fatal);
        status = EXIT_SETUP;
    } else if (t.st.mismatches > 0 || t.st.protocol_errors > 0 || t.st.conn_errors > 0 ||
               (cfg.verify && t.st.errors > 0) || (cfg.check_drain && !t.drained) || short_window) {
        status = EXIT_FAIL;
    }
    if (cfg.json) {
        print_json(&cfg, &t, status);
    } else if (t.fatal == NULL || t.st.requests > 0) {
        print_table(&cfg, &t, status);
    }
    fflush(stdout);
    if (status == EXIT_FAIL) {
        if (t.st.mismatches > 0) {
            fprintf(stderr, "slotd-bench: %llu mismatches against the uncached reference\n",
                    (unsigned long long)t.st.mismatches);
        }
        if (short_window) {
            fprintf(stderr,
                    "slotd-bench: the measured window lasted %.3f s of the %.3f s asked: the "
                    "generator could not keep up (fewer sessions, a shorter --prompt-len or "
                    "--warmup help); its figures are not valid\n",
                    t.window_s, cfg.duration);
        }
        if (cfg.check_drain && !t.drained) {
            fprintf(stderr, "slotd-bench: the daemon did not drain: %s\n",
                    t.drain_last.ok ? "cache_entries or live_sessions not 0" : t.drain_last.error);
        }
    }

out:
    for (uint32_t i = 0; ws != NULL && i < cfg.threads; i++) {
        if (ws[i] != NULL) {
            (void)worker_join(ws[i]);
            worker_destroy(ws[i]);
        }
    }
    free(ws);
    config_release(&cfg);
    return status;
}
