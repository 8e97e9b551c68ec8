/*
 * test_config.c: the Check suite of server/config.c: the defaults, every
 * flag in both spellings, every SLOTD_* variable, flags over the
 * environment, and the values and flags that must be refused; the cgroup
 * limits the defaults follow; --audit-rate, the test build's --fault-*
 * flags, and --cache-mb refused past physical memory.
 */
#include <check.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server/config.h"

static char err[256];

/* Parses a NULL-terminated list of arguments (after argv[0]) with `env`. */
static config_result_t parse_env(server_config_t *cfg, char *const *env, ...)
{
    char *argv[64];
    int argc = 0;
    va_list ap;

    argv[argc++] = "slotd";
    va_start(ap, env);
    for (char *a; (a = va_arg(ap, char *)) != NULL;)
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;
    err[0] = '\0';
    return config_parse(cfg, argc, argv, env, err, sizeof(err));
}

static char *const no_env[] = {NULL};

#define parse(cfg, ...) parse_env(cfg, no_env, __VA_ARGS__, (char *)NULL)

START_TEST(test_defaults)
{
    server_config_t cfg;

    ck_assert_int_eq(parse_env(&cfg, no_env, (char *)NULL), CONFIG_OK);
    ck_assert_str_eq(cfg.listen, "127.0.0.1");
    ck_assert_str_eq(cfg.admin_listen, "127.0.0.1");
    ck_assert_int_eq(cfg.port, 7070);
    ck_assert_int_eq(cfg.admin_port, 7071);
    ck_assert_uint_eq(cfg.admin_idle_timeout, 5);
    ck_assert_uint_ge(cfg.threads, 1);
    ck_assert_uint_eq(cfg.cache_mb, 256);
    ck_assert_uint_eq(cfg.max_sessions, 100000);
    ck_assert_uint_eq(cfg.max_connections, 10000);
    ck_assert_uint_eq(cfg.max_line, 65536);
    ck_assert_uint_eq(cfg.idle_timeout, 300);
    ck_assert_uint_eq(cfg.shutdown_timeout, 10);
    ck_assert_uint_eq(cfg.wedge_timeout, 10);
    ck_assert_uint_eq(cfg.reply_hold_us, 100);
    /* Every preset may be served; tiny and hash are built at start. */
    ck_assert_uint_eq(cfg.nmodels, 4);
    ck_assert_str_eq(cfg.models[0], "hash");
    ck_assert_str_eq(cfg.models[1], "tiny");
    ck_assert_str_eq(cfg.models[2], "small");
    ck_assert_str_eq(cfg.models[3], "base");
    ck_assert_uint_eq(cfg.npreload, 2);
    ck_assert_str_eq(cfg.preload[0], "tiny");
    ck_assert_str_eq(cfg.preload[1], "hash");
    ck_assert_str_eq(cfg.default_model, "tiny");
    ck_assert_int_eq(cfg.log_level, LOG_LEVEL_INFO);
}
END_TEST

START_TEST(test_every_flag)
{
    server_config_t cfg;

    ck_assert_int_eq(parse(&cfg, "--listen", "::1", "--port", "0", "--admin-port=9", "--threads",
                           "3", "--cache-mb=17", "--max-sessions", "5", "--max-connections=6",
                           "--max-line", "100", "--idle-timeout=0", "--shutdown-timeout", "2",
                           "--wedge-timeout=4", "--reply-hold-us", "0", "--models", "small,hash,tiny",
                           "--default-model=small", "--log-level", "debug"),
                     CONFIG_OK);
    ck_assert_str_eq(cfg.listen, "::1");
    ck_assert_int_eq(cfg.port, 0);
    ck_assert_int_eq(cfg.admin_port, 9);
    ck_assert_uint_eq(cfg.threads, 3);
    ck_assert_uint_eq(cfg.cache_mb, 17);
    ck_assert_uint_eq(cfg.max_sessions, 5);
    ck_assert_uint_eq(cfg.max_connections, 6);
    ck_assert_uint_eq(cfg.max_line, 100);
    ck_assert_uint_eq(cfg.idle_timeout, 0);
    ck_assert_uint_eq(cfg.shutdown_timeout, 2);
    ck_assert_uint_eq(cfg.wedge_timeout, 4);
    ck_assert_uint_eq(cfg.reply_hold_us, 0);
    ck_assert_uint_eq(cfg.nmodels, 3);
    ck_assert_str_eq(cfg.models[0], "small");
    ck_assert_str_eq(cfg.models[1], "hash");
    ck_assert_str_eq(cfg.models[2], "tiny");
    ck_assert_str_eq(cfg.default_model, "small");
    ck_assert_int_eq(cfg.log_level, LOG_LEVEL_DEBUG);

    /* The last occurrence wins. */
    ck_assert_int_eq(parse(&cfg, "--port", "1", "--port=2"), CONFIG_OK);
    ck_assert_int_eq(cfg.port, 2);
}
END_TEST

START_TEST(test_admin_listen)
{
    server_config_t cfg;
    char *const env[] = {"SLOTD_ADMIN_LISTEN=10.1.2.3", "SLOTD_ADMIN_IDLE_TIMEOUT=9",
                         "SLOTD_PROTECTED_MODE=no", NULL};

    /* --listen moves the session port only. */
    ck_assert_int_eq(parse(&cfg, "--listen", "0.0.0.0", "--protected-mode", "no"), CONFIG_OK);
    ck_assert_str_eq(cfg.listen, "0.0.0.0");
    ck_assert_str_eq(cfg.admin_listen, "127.0.0.1");
    ck_assert_int_eq(
        parse(&cfg, "--admin-listen", "::", "--admin-idle-timeout=1", "--protected-mode=no"),
        CONFIG_OK);
    ck_assert_str_eq(cfg.listen, "127.0.0.1");
    ck_assert_str_eq(cfg.admin_listen, "::");
    ck_assert_uint_eq(cfg.admin_idle_timeout, 1);
    ck_assert_int_eq(parse_env(&cfg, env, (char *)NULL), CONFIG_OK);
    ck_assert_str_eq(cfg.admin_listen, "10.1.2.3");
    ck_assert_uint_eq(cfg.admin_idle_timeout, 9);

    ck_assert_int_eq(parse(&cfg, "--admin-listen", "localhost"), CONFIG_ERROR);
    ck_assert_str_eq(err, "--admin-listen: 'localhost' is not a numeric IPv4 or IPv6 address");
    ck_assert_int_eq(parse(&cfg, "--admin-idle-timeout", "0"), CONFIG_ERROR);
    ck_assert_str_eq(err, "--admin-idle-timeout: '0' is not an integer in 1..86400");
}
END_TEST

START_TEST(test_protected_mode)
{
    server_config_t cfg;
    char path[] = "/tmp/slotd-config-token.XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "0123456789abcdef\n", 17), 17);
    close(fd);
    ck_assert_int_eq(chmod(path, 0600), 0);

    ck_assert(parse(&cfg, "--listen", "127.0.0.2") == CONFIG_OK && cfg.protected_mode);
    ck_assert_uint_eq(cfg.auth_token_len, 0);
    ck_assert_int_eq(parse(&cfg, "--listen", "::1", "--admin-listen", "::ffff:127.0.0.1"),
                     CONFIG_OK);
    static const char *const open_hosts[] = {"0.0.0.0", "::", "10.0.0.5", "::ffff:10.0.0.1",
                                             "128.0.0.1"};
    for (size_t i = 0; i < sizeof(open_hosts) / sizeof(open_hosts[0]); i++) {
        ck_assert_int_eq(parse(&cfg, "--listen", open_hosts[i]), CONFIG_ERROR);
        ck_assert_msg(strstr(err, "--auth-token-file PATH") && strstr(err, "--protected-mode no"),
                      "%s", err);
        ck_assert_int_eq(parse(&cfg, "--admin-listen", open_hosts[i]), CONFIG_ERROR);
        ck_assert_int_eq(parse(&cfg, "--listen", open_hosts[i], "--protected-mode=no"), CONFIG_OK);
        ck_assert(!cfg.protected_mode);
        ck_assert_int_eq(parse(&cfg, "--listen", open_hosts[i], "--auth-token-file", path),
                         CONFIG_OK);
        ck_assert_str_eq(cfg.auth_token, "0123456789abcdef");
        ck_assert_uint_eq(cfg.auth_token_len, 16);
    }
    ck_assert_int_eq(parse(&cfg, "--protected-mode", "off"), CONFIG_ERROR);
    ck_assert_str_eq(err, "--protected-mode: 'off' is not yes or no");

    ck_assert_int_eq(chmod(path, 0604), 0);
    ck_assert_int_eq(parse(&cfg, "--auth-token-file", path), CONFIG_ERROR);
    ck_assert_msg(strstr(err, "chmod 600") != NULL, "%s", err);
    unlink(path);
}
END_TEST

/* --tenants-file and SLOTD_TENANTS_FILE: a good file is taken (and then
 * counts as a token for protected mode), a bad one refused with its line,
 * one that others may read refused, and not together with
 * --auth-token-file. */
START_TEST(test_tenants_flag)
{
    server_config_t cfg;
    char path[] = "/tmp/slotd-config-tenants.XXXXXX";
    char tok[] = "/tmp/slotd-config-token.XXXXXX";
    int fd = mkstemp(path), tfd = mkstemp(tok);
    static const char good[] = "alice aaaaaaaaaaaaaaaa-token admin\n";
    static const char bad[] = "alice aaaaaaaaaaaaaaaa-token\nbob bbbbbbbbbbbbbbbb-token weight=0\n";

    ck_assert_int_ge(fd, 0);
    ck_assert_int_ge(tfd, 0);
    ck_assert_int_eq(write(tfd, "0123456789abcdef\n", 17), 17);
    close(tfd);
    ck_assert_int_eq(write(fd, good, sizeof(good) - 1), (ssize_t)sizeof(good) - 1);
    close(fd);
    ck_assert_int_eq(chmod(path, 0600), 0);
    ck_assert_int_eq(chmod(tok, 0600), 0);
    ck_assert_int_eq(parse(&cfg, "--tenants-file", path, "--listen", "0.0.0.0"), CONFIG_OK);
    ck_assert_str_eq(cfg.tenants_file, path);
    ck_assert(config_auth_on(&cfg));
    char var[80];
    snprintf(var, sizeof(var), "SLOTD_TENANTS_FILE=%s", path);
    char *const env[] = {var, NULL};
    ck_assert_int_eq(parse_env(&cfg, env, (char *)NULL), CONFIG_OK);
    ck_assert_str_eq(cfg.tenants_file, path);
    ck_assert_int_eq(parse(&cfg, "--tenants-file", path, "--auth-token-file", tok), CONFIG_ERROR);
    ck_assert_msg(strstr(err, "give one") != NULL, "%s", err);
    ck_assert_int_eq(parse_env(&cfg, no_env, (char *)NULL), CONFIG_OK);
    ck_assert(!config_auth_on(&cfg));

    fd = open(path, O_WRONLY | O_TRUNC);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, bad, sizeof(bad) - 1), (ssize_t)sizeof(bad) - 1);
    close(fd);
    ck_assert_int_eq(parse(&cfg, "--tenants-file", path), CONFIG_ERROR);
    ck_assert_msg(strstr(err, "line 2") != NULL && strstr(err, "weight=0") != NULL, "%s", err);
    ck_assert_int_eq(chmod(path, 0640), 0);
    ck_assert_int_eq(parse(&cfg, "--tenants-file", path), CONFIG_ERROR);
    ck_assert_msg(strstr(err, "chmod 600") != NULL, "%s", err);
    unlink(path);
    unlink(tok);
}
END_TEST

START_TEST(test_environment)
{
    server_config_t cfg;
    char *const env[] = {"PATH=/bin",
                         "SLOTD_LISTEN=0.0.0.0",
                         "SLOTD_PROTECTED_MODE=no",
                         "SLOTD_PORT=1234",
                         "SLOTD_ADMIN_PORT=1235",
                         "SLOTD_THREADS=7",
                         "SLOTD_CACHE_MB=64",
                         "SLOTD_MAX_SESSIONS=10",
                         "SLOTD_MAX_CONNECTIONS=11",
                         "SLOTD_MAX_LINE=4096",
                         "SLOTD_IDLE_TIMEOUT=12",
                         "SLOTD_SHUTDOWN_TIMEOUT=13",
                         "SLOTD_WEDGE_TIMEOUT=14",
                         "SLOTD_REPLY_HOLD_US=10000000",
                         "SLOTD_MODELS=hash",
                         "SLOTD_DEFAULT_MODEL=hash",
                         "SLOTD_LOG_LEVEL=warn",
                         "SLOTD_PORTX=1",
                         NULL};

    ck_assert_int_eq(parse_env(&cfg, env, (char *)NULL), CONFIG_OK);
    ck_assert_str_eq(cfg.listen, "0.0.0.0");
    ck_assert_int_eq(cfg.port, 1234);
    ck_assert_int_eq(cfg.admin_port, 1235);
    ck_assert_uint_eq(cfg.threads, 7);
    ck_assert_uint_eq(cfg.cache_mb, 64);
    ck_assert_uint_eq(cfg.max_sessions, 10);
    ck_assert_uint_eq(cfg.max_connections, 11);
    ck_assert_uint_eq(cfg.max_line, 4096);
    ck_assert_uint_eq(cfg.idle_timeout, 12);
    ck_assert_uint_eq(cfg.shutdown_timeout, 13);
    ck_assert_uint_eq(cfg.wedge_timeout, 14);
    ck_assert_uint_eq(cfg.reply_hold_us, 10000000);
    ck_assert_uint_eq(cfg.nmodels, 1);
    ck_assert_str_eq(cfg.models[0], "hash");
    ck_assert_str_eq(cfg.default_model, "hash");
    ck_assert_int_eq(cfg.log_level, LOG_LEVEL_WARN);

    /* Flags win over the environment. */
    ck_assert_int_eq(parse_env(&cfg, env, "--port", "99", "--models=tiny,hash", "--default-model",
                               "tiny", "--log-level=error", (char *)NULL),
                     CONFIG_OK);
    ck_assert_int_eq(cfg.port, 99);
    ck_assert_uint_eq(cfg.nmodels, 2);
    ck_assert_str_eq(cfg.default_model, "tiny");
    ck_assert_int_eq(cfg.log_level, LOG_LEVEL_ERROR);
    ck_assert_int_eq(cfg.admin_port, 1235); /* not overridden */
}
END_TEST

START_TEST(test_bad_environment)
{
    server_config_t cfg;
    char *const env[] = {"SLOTD_PORT=seven", NULL};

    ck_assert_int_eq(parse_env(&cfg, env, (char *)NULL), CONFIG_ERROR);
    ck_assert_ptr_nonnull(strstr(err, "SLOTD_PORT"));
    /* A flag replaces its variable, even a malformed one: it is never read. */
    ck_assert_int_eq(parse_env(&cfg, env, "--port", "1", (char *)NULL), CONFIG_OK);
    ck_assert_int_eq(cfg.port, 1);
    ck_assert_int_eq(parse_env(&cfg, env, "--port=2", (char *)NULL), CONFIG_OK);
    ck_assert_int_eq(cfg.port, 2);
    /* Another flag does not: the bad variable is still read. */
    ck_assert_int_eq(parse_env(&cfg, env, "--admin-port", "1", (char *)NULL), CONFIG_ERROR);
    ck_assert_ptr_nonnull(strstr(err, "SLOTD_PORT"));
    /* A command line with a syntax error is refused before any variable. */
    ck_assert_int_eq(parse_env(&cfg, env, "--bogus", (char *)NULL), CONFIG_ERROR);
    ck_assert_ptr_nonnull(strstr(err, "bogus"));
}
END_TEST

/* Writes `text` to `dir`/`name`, making `dir` first. */
static void put(const char *dir, const char *name, const char *text)
{
    char path[512];
    FILE *f;

    snprintf(path, sizeof(path), "mkdir -p '%s'", dir);
    ck_assert_int_eq(system(path), 0);
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    ck_assert_ptr_nonnull(f = fopen(path, "w"));
    fputs(text, f);
    fclose(f);
}

static void rmtree(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* A cgroup layout under a fresh root: the process's cgroup file ("self")
 * and the files below the root, with the limits they must give. */
static const struct cgroup_case {
    const char *what;
    const char *self;
    struct {
        const char *dir, *name, *text;
    } files[4];
    unsigned cpus;
    uint64_t memory_mb;
} cgroup_cases[] = {
    {"v2",
     "0::/svc/slotd.service\n",
     {{"svc/slotd.service", "cpu.max", "150000 100000\n"},
      {"svc/slotd.service", "memory.max", "536870912\n"}},
     2, /* 1.5 CPUs, rounded up */
     512},
    {"v2 without limits",
     "0::/svc/slotd.service\n",
     {{"svc/slotd.service", "cpu.max", "max 100000\n"},
      {"svc/slotd.service", "memory.max", "max\n"}},
     0,
     0},
    /* A container: its cgroup is the root of the mounted hierarchy. */
    {"v2 at the root",
     "0::/\n",
     {{".", "cpu.max", "100000 100000\n"}, {".", "memory.max", "134217728\n"}},
     1,
     128},
    {"v1",
     "4:memory:/box\n3:cpuset:/\n1:cpu,cpuacct:/box\n0::/\n",
     {{"memory/box", "memory.limit_in_bytes", "1073741824\n"},
      {"cpu/box", "cpu.cfs_quota_us", "300000\n"},
      {"cpu/box", "cpu.cfs_period_us", "100000\n"}},
     3,
     1024},
    /* v1's "no limit": a quota of -1, a huge memory limit. */
    {"v1 without limits",
     "4:memory:/box\n3:cpuset:/\n1:cpu,cpuacct:/box\n0::/\n",
     {{"memory/box", "memory.limit_in_bytes", "9223372036854771712\n"},
      {"cpu/box", "cpu.cfs_quota_us", "-1\n"},
      {"cpu/box", "cpu.cfs_period_us", "100000\n"}},
     0,
     0},
};

START_TEST(test_cgroup)
{
    const struct cgroup_case *cc = &cgroup_cases[_i];
    char root[] = "/tmp/slotd-cgroup.XXXXXX", dir[256], file[256];
    config_limits_t lim;

    ck_assert_ptr_nonnull(mkdtemp(root));
    snprintf(file, sizeof(file), "%s/self", root);
    put(root, "self", cc->self);
    for (size_t i = 0; i < sizeof(cc->files) / sizeof(cc->files[0]) && cc->files[i].dir; i++) {
        snprintf(dir, sizeof(dir), "%s/%s", root, cc->files[i].dir);
        put(dir, cc->files[i].name, cc->files[i].text);
    }
    config_cgroup_limits(file, root, &lim);
    ck_assert_msg(lim.cpus == cc->cpus, "%s: %u CPUs", cc->what, lim.cpus);
    ck_assert_msg(lim.memory_mb == cc->memory_mb, "%s: %llu MiB", cc->what,
                  (unsigned long long)lim.memory_mb);

    /* Nothing readable: no limits. */
    config_cgroup_limits("/nonexistent/cgroup", root, &lim);
    ck_assert_uint_eq(lim.cpus, 0);
    ck_assert_uint_eq(lim.memory_mb, 0);
    rmtree(root);
}
END_TEST

START_TEST(test_defaults_follow_limits)
{
    server_config_t cfg;
    config_limits_t none = {0, 0}, lim = {2, 300};

    config_defaults_for(&cfg, 8, 0, &none);
    ck_assert_uint_eq(cfg.threads, 8);
    ck_assert_uint_eq(cfg.cache_mb, 256);
    config_defaults_for(&cfg, 8, 4, &none); /* taskset to 4 cores */
    ck_assert_uint_eq(cfg.threads, 4);
    config_defaults_for(&cfg, 8, 4, &lim); /* a quota of 2 CPUs, 300 MiB */
    ck_assert_uint_eq(cfg.threads, 2);
    ck_assert_uint_eq(cfg.cache_mb, 150);
    lim.memory_mb = 4096; /* roomy: the default stands */
    config_defaults_for(&cfg, 8, 0, &lim);
    ck_assert_uint_eq(cfg.cache_mb, 256);
    lim.memory_mb = 1;
    config_defaults_for(&cfg, 1, 0, &lim);
    ck_assert_uint_eq(cfg.cache_mb, 1);
    ck_assert_uint_eq(cfg.threads, 1);
}
END_TEST

/* Each bad command line, and a word its message must contain. */
static const struct {
    const char *args[3];
    const char *says;
} bad[] = {
    {{"--prefix-cache", "yes"}, "not on or off"},
    {{"--prefix-scope", "user"}, "not global, connection or tenant"},
    {{"--port", "65536"}, "--port"},
    {{"--port", "-1"}, "--port"},
    {{"--port", ""}, "--port"},
    {{"--port", "12x"}, "--port"},
    {{"--port", " 12"}, "--port"},
    {{"--port"}, "needs a value"},
    {{"--admin-port=99999"}, "--admin-port"},
    {{"--threads", "0"}, "--threads"},
    {{"--threads", "1025"}, "--threads"},
    {{"--cache-mb", "0"}, "--cache-mb"},
    {{"--max-sessions", "0"}, "--max-sessions"},
    {{"--max-connections", "0"}, "--max-connections"},
    {{"--max-line", "15"}, "--max-line"},
    {{"--idle-timeout", "1.5"}, "--idle-timeout"},
    {{"--shutdown-timeout", "0"}, "--shutdown-timeout"},
    {{"--wedge-timeout", "0"}, "--wedge-timeout"},
    {{"--reply-hold-us", "10000001"}, "--reply-hold-us"},
    {{"--models", "tiny,bogus"}, "bogus"},
    {{"--models", "tiny,,hash"}, "empty"},
    {{"--models", "tiny,tiny"}, "twice"},
    {{"--models", ""}, "empty"},
    {{"--default-model", "bogus"}, "bogus"},
    {{"--models=tiny,hash", "--default-model", "small"},
     "--default-model: 'small' is not among --models; add it to --models, or name one of them"},
    {{"--models=tiny,hash", "--preload", "small"}, "--preload"},
    {{"--preload", "tiny,bogus"}, "bogus"},
    {{"--preload", "tiny,tiny"}, "twice"},
    {{"--preload", ""}, "empty"},
    {{"--log-level", "loud"}, "--log-level"},
    {{"--listen", "localhost"}, "--listen"},
    {{"--listen", "1.2.3.4.5"}, "--listen"},
    {{"--bogus"}, "unknown flag"},
    {{"--bogus=1"}, "unknown flag"},
    {{"-p", "1"}, "unexpected"},
    {{"stray"}, "unexpected"},
    {{"--"}, "unexpected"},
    {{"--help=yes"}, "no value"},
    {{"--port", "7", "--admin-port=7"}, "both"},
    {{"--port", "99999999999999999999999"}, "--port"},
};

START_TEST(test_bad_values)
{
    server_config_t cfg;
    char *argv[5] = {"slotd"};
    int argc = 1;

    for (int j = 0; j < 3 && bad[_i].args[j] != NULL; j++)
        argv[argc++] = (char *)bad[_i].args[j];
    argv[argc] = NULL;
    err[0] = '\0';
    ck_assert_msg(config_parse(&cfg, argc, argv, no_env, err, sizeof(err)) == CONFIG_ERROR,
                  "case %d (%s) was accepted", _i, bad[_i].args[0]);
    ck_assert_msg(strstr(err, bad[_i].says) != NULL, "case %d: '%s' does not say '%s'", _i, err,
                  bad[_i].says);
    ck_assert_ptr_null(strchr(err, '\n'));
}
END_TEST

START_TEST(test_help_version)
{
    server_config_t cfg;

    ck_assert_int_eq(parse(&cfg, "--help"), CONFIG_HELP);
    ck_assert_int_eq(parse(&cfg, "--port", "1", "--version"), CONFIG_VERSION);
    /* A bad flag before --help is still an error. */
    ck_assert_int_eq(parse(&cfg, "--port", "x", "--help"), CONFIG_ERROR);
}
END_TEST

START_TEST(test_edges)
{
    server_config_t cfg;

    ck_assert_int_eq(parse(&cfg, "--port", "65535", "--admin-port", "0"), CONFIG_OK);
    ck_assert_int_eq(cfg.port, 65535);
    /* Both ephemeral is fine. */
    ck_assert_int_eq(parse(&cfg, "--port=0", "--admin-port=0"), CONFIG_OK);
    /* A value that starts with "--" is still the value of --listen (and bad). */
    ck_assert_int_eq(parse(&cfg, "--listen", "--port"), CONFIG_ERROR);
    ck_assert_int_eq(parse(&cfg, "--models=base,small,tiny,hash", "--default-model=base"),
                     CONFIG_OK);
    ck_assert_uint_eq(cfg.nmodels, 4);
}
END_TEST

/* ---- The hardening settings: --audit-rate, --fault-*, --cache-mb ---- */

START_TEST(test_default_model_follows_models)
{
    /* Without --default-model: tiny while --models lists it, else the
     * first model --models lists. */
    server_config_t cfg;
    char *env[] = {"SLOTD_DEFAULT_MODEL=small", NULL};
    char *argv[] = {"slotd", "--models", "tiny,hash", NULL};

    ck_assert_int_eq(parse(&cfg, "--models", "small"), CONFIG_OK);
    ck_assert_str_eq(cfg.default_model, "small");
    ck_assert_int_eq(parse(&cfg, "--models", "hash,small"), CONFIG_OK);
    ck_assert_str_eq(cfg.default_model, "hash");
    ck_assert_int_eq(parse(&cfg, "--models", "hash,tiny"), CONFIG_OK);
    ck_assert_str_eq(cfg.default_model, "tiny");
    ck_assert_int_eq(parse(&cfg, "--models", "small", "--default-model", "small"), CONFIG_OK);
    ck_assert_str_eq(cfg.default_model, "small");
    /* Named and not listed: an error naming where it was named. */
    ck_assert_int_eq(config_parse(&cfg, 3, argv, env, err, sizeof(err)), CONFIG_ERROR);
    ck_assert_msg(strstr(err, "SLOTD_DEFAULT_MODEL: 'small' is not among --models; add it") != NULL,
                  "%s", err);
}
END_TEST

START_TEST(test_audit_rate_accepted)
{
    static const struct {
        const char *text;
        double value;
    } good[] = {
        {"0", 0.0},     {"1", 1.0},     {"0.25", 0.25}, {".5", 0.5},   {"1e-3", 0.001},
        {"0.01", 0.01}, {"1.000", 1.0}, {"0E0", 0.0},   {"5e-1", 0.5}, {"0.999999", 0.999999},
        {"00.5", 0.5},  {"1e+0", 1.0},
    };
    server_config_t cfg;

    ck_assert_int_eq(parse_env(&cfg, no_env, (char *)NULL), CONFIG_OK);
    ck_assert(cfg.audit_rate == 0.0);
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        char flag[64];
        ck_assert_msg(parse(&cfg, "--audit-rate", good[i].text) == CONFIG_OK, "'%s': %s",
                      good[i].text, err);
        ck_assert_msg(cfg.audit_rate == good[i].value, "'%s' gave %g", good[i].text,
                      cfg.audit_rate);
        snprintf(flag, sizeof(flag), "--audit-rate=%s", good[i].text);
        ck_assert_int_eq(parse(&cfg, flag), CONFIG_OK);
        ck_assert(cfg.audit_rate == good[i].value);
    }
}
END_TEST

START_TEST(test_audit_rate_environment)
{
    server_config_t cfg;
    char *const env[] = {"SLOTD_AUDIT_RATE=0.125", NULL};
    char *const bad_env[] = {"SLOTD_AUDIT_RATE=2", NULL};

    ck_assert_int_eq(parse_env(&cfg, env, (char *)NULL), CONFIG_OK);
    ck_assert(cfg.audit_rate == 0.125);
    /* The flag wins. */
    ck_assert_int_eq(parse_env(&cfg, env, "--audit-rate", "1", (char *)NULL), CONFIG_OK);
    ck_assert(cfg.audit_rate == 1.0);
    ck_assert_int_eq(parse_env(&cfg, bad_env, (char *)NULL), CONFIG_ERROR);
    ck_assert_ptr_nonnull(strstr(err, "SLOTD_AUDIT_RATE"));
}
END_TEST

/* --on-full and --full-wait-ms: refuse and 1000 by default; the three
 * policies by flag and variable, the flag winning; anything else refused
 * with its source named. */
START_TEST(test_on_full)
{
    server_config_t cfg;
    char *const env[] = {"SLOTD_ON_FULL=evict", "SLOTD_FULL_WAIT_MS=250", NULL};

    ck_assert_int_eq(parse_env(&cfg, no_env, (char *)NULL), CONFIG_OK);
    ck_assert_int_eq(cfg.on_full, CONFIG_ON_FULL_REFUSE);
    ck_assert_uint_eq(cfg.full_wait_ms, 1000);
    ck_assert_int_eq(parse_env(&cfg, env, (char *)NULL), CONFIG_OK);
    ck_assert_int_eq(cfg.on_full, CONFIG_ON_FULL_EVICT);
    ck_assert_uint_eq(cfg.full_wait_ms, 250);
    ck_assert_int_eq(parse_env(&cfg, env, "--on-full", "wait", (char *)NULL), CONFIG_OK);
    ck_assert_int_eq(cfg.on_full, CONFIG_ON_FULL_WAIT);
    ck_assert_int_eq(parse_env(&cfg, no_env, "--on-full=refuse", (char *)NULL), CONFIG_OK);
    ck_assert_int_eq(cfg.on_full, CONFIG_ON_FULL_REFUSE);
    ck_assert_int_eq(parse_env(&cfg, no_env, "--on-full", "drop", (char *)NULL), CONFIG_ERROR);
    ck_assert_msg(strstr(err, "--on-full: 'drop' is not one of refuse, wait, evict") != NULL, "%s",
                  err);
    ck_assert_int_eq(parse_env(&cfg, (char *const[]){"SLOTD_ON_FULL=Evict", NULL}, (char *)NULL),
                     CONFIG_ERROR);
    ck_assert_ptr_nonnull(strstr(err, "SLOTD_ON_FULL"));
    ck_assert_int_eq(parse_env(&cfg, no_env, "--full-wait-ms", "0", (char *)NULL), CONFIG_ERROR);
    ck_assert_ptr_nonnull(strstr(err, "--full-wait-ms"));
}
END_TEST

static const char *const bad_rates[] = {
    "1.5",  "-0",   "-0.1", "+0.5",  "nan",    "NAN", "inf", "infinity", "0x1p-2", "",
    " 0.5", "0.5 ", "0.5x", "1e400", "1e-400", "e5",  "..5", "1,5",      "2",      "1.0000001",
};

START_TEST(test_audit_rate_refused)
{
    server_config_t cfg;

    ck_assert_msg(parse(&cfg, "--audit-rate", bad_rates[_i]) == CONFIG_ERROR, "'%s' was accepted",
                  bad_rates[_i]);
    ck_assert_msg(strstr(err, "--audit-rate") != NULL, "'%s': %s", bad_rates[_i], err);
    ck_assert_ptr_null(strchr(err, '\n'));
}
END_TEST

/* --auth-timeout and --proxy-from: defaults 5 s and no one; addresses and
 * CIDR networks of both families parsed to bytes and a prefix; the host
 * bits past the prefix, a prefix out of range, a name or an empty entry
 * refused; SLOTD_PROXY_FROM. */
START_TEST(test_handshake_flags)
{
    static const char *const bad_nets[] = {"",           "10.0.0.1,",  ",10.0.0.1",  "10.0.0.1/33",
                                           "10.0.0.5/8", "10.0.0.0/",  "10.0.0.0/x", "fd00::/129",
                                           "fd00::1/64", "example.org"};
    server_config_t cfg;

    ck_assert_int_eq(parse(&cfg, "--port", "1"), CONFIG_OK);
    ck_assert_uint_eq(cfg.auth_timeout, 5);
    ck_assert_uint_eq(cfg.nproxy_from, 0);
    ck_assert_int_eq(parse(&cfg, "--auth-timeout", "0", "--proxy-from",
                           "10.0.0.1,10.1.0.0/16,fd00::/64,::ffff:10.0.0.0/104,0.0.0.0/0"),
                     CONFIG_OK);
    ck_assert_uint_eq(cfg.auth_timeout, 0);
    ck_assert_uint_eq(cfg.nproxy_from, 5);
    ck_assert_int_eq(cfg.proxy_from[0].family, AF_INET);
    ck_assert_uint_eq(cfg.proxy_from[0].prefix, 32);
    ck_assert_mem_eq(cfg.proxy_from[0].addr, "\x0a\x00\x00\x01", 4);
    ck_assert_uint_eq(cfg.proxy_from[1].prefix, 16);
    ck_assert_int_eq(cfg.proxy_from[2].family, AF_INET6);
    ck_assert_uint_eq(cfg.proxy_from[2].prefix, 64);
    ck_assert_uint_eq(cfg.proxy_from[2].addr[0], 0xfd);
    ck_assert_uint_eq(cfg.proxy_from[4].prefix, 0);
    ck_assert_int_eq(parse(&cfg, "--proxy-from", "none"), CONFIG_OK);
    ck_assert_uint_eq(cfg.nproxy_from, 0);
    for (size_t i = 0; i < sizeof(bad_nets) / sizeof(bad_nets[0]); i++) {
        ck_assert_msg(parse(&cfg, "--proxy-from", bad_nets[i]) == CONFIG_ERROR, "'%s' was accepted",
                      bad_nets[i]);
        ck_assert_msg(strstr(err, "--proxy-from") != NULL, "'%s': %s", bad_nets[i], err);
    }
    ck_assert_int_eq(parse(&cfg, "--proxy-from",
                           "1.1.1.1,2.2.2.2,3.3.3.3,4.4.4.4,5.5.5.5,6.6.6.6,"
                           "7.7.7.7,8.8.8.8,9.9.9.9,1.0.0.1,1.0.0.2,1.0.0.3,"
                           "1.0.0.4,1.0.0.5,1.0.0.6,1.0.0.7,1.0.0.8"),
                     CONFIG_ERROR);
    ck_assert_int_eq(parse(&cfg, "--auth-timeout", "86401"), CONFIG_ERROR);
    char *const env[] = {"SLOTD_PROXY_FROM=192.0.2.0/24", "SLOTD_AUTH_TIMEOUT=30", NULL};
    ck_assert_int_eq(parse_env(&cfg, env, (char *)NULL), CONFIG_OK);
    ck_assert_uint_eq(cfg.nproxy_from, 1);
    ck_assert_uint_eq(cfg.proxy_from[0].prefix, 24);
    ck_assert_uint_eq(cfg.auth_timeout, 30);
}
END_TEST

/* --preload: its default keeps the names --models allows; a name given
 * must be allowed; "none" builds nothing at start; SLOTD_PRELOAD. */
START_TEST(test_preload)
{
    server_config_t cfg;
    char *const env[] = {"SLOTD_PRELOAD=base,small", NULL};

    ck_assert_int_eq(parse(&cfg, "--models", "small", "--default-model", "small"), CONFIG_OK);
    ck_assert_uint_eq(cfg.npreload, 0);
    ck_assert_int_eq(parse(&cfg, "--models", "small,hash", "--default-model", "small"), CONFIG_OK);
    ck_assert_uint_eq(cfg.npreload, 1);
    ck_assert_str_eq(cfg.preload[0], "hash");
    ck_assert_int_eq(parse(&cfg, "--preload", "none"), CONFIG_OK);
    ck_assert_uint_eq(cfg.npreload, 0);
    ck_assert_int_eq(parse(&cfg, "--preload=base"), CONFIG_OK);
    ck_assert_uint_eq(cfg.npreload, 1);
    ck_assert_str_eq(cfg.preload[0], "base");
    ck_assert_int_eq(parse_env(&cfg, env, (char *)NULL), CONFIG_OK);
    ck_assert_uint_eq(cfg.npreload, 2);
    ck_assert_str_eq(cfg.preload[0], "base");
    ck_assert_str_eq(cfg.preload[1], "small");
    ck_assert_int_eq(parse_env(&cfg, env, "--models=tiny,small,base", (char *)NULL), CONFIG_OK);
    ck_assert_uint_eq(cfg.npreload, 2);
    ck_assert_int_eq(parse_env(&cfg, env, "--models=tiny,small", (char *)NULL), CONFIG_ERROR);
    ck_assert_ptr_nonnull(strstr(err, "--preload: 'base' is not among --models"));
    ck_assert_int_eq(parse_env(&cfg, env, "--preload=tiny", "--models=tiny", (char *)NULL),
                     CONFIG_OK);
    ck_assert_uint_eq(cfg.npreload, 1);
}
END_TEST

START_TEST(test_fault_flags)
{
    server_config_t cfg;

#if SLOTD_FAULT_INJECTION
    ck_assert_int_eq(parse(&cfg, "--fault-corrupt-after", "3", "--fault-wedge-after=5"), CONFIG_OK);
    ck_assert_uint_eq(cfg.fault_corrupt_after, 3);
    ck_assert_uint_eq(cfg.fault_wedge_after, 5);
    ck_assert_int_eq(parse(&cfg, "--fault-build-delay-ms", "250"), CONFIG_OK);
    ck_assert_uint_eq(cfg.fault_build_delay_ms, 250);
    ck_assert_int_eq(parse(&cfg, "--audit-rate", "1"), CONFIG_OK);
    ck_assert_uint_eq(cfg.fault_build_delay_ms, 0);
    ck_assert_uint_eq(cfg.fault_corrupt_after, 0); /* off unless asked */
    ck_assert_uint_eq(cfg.fault_wedge_after, 0);
    ck_assert_int_eq(parse(&cfg, "--fault-wedge-after", "x"), CONFIG_ERROR);
#else
    /* A normal build has no such flags. */
    ck_assert_int_eq(parse(&cfg, "--fault-corrupt-after", "3"), CONFIG_ERROR);
    ck_assert_ptr_nonnull(strstr(err, "unknown flag"));
    ck_assert_int_eq(parse(&cfg, "--fault-wedge-after=1"), CONFIG_ERROR);
    ck_assert_ptr_nonnull(strstr(err, "unknown flag"));
#endif
}
END_TEST

START_TEST(test_cache_mb_cap)
{
    server_config_t cfg;
    uint64_t phys = config_physical_mb();
    char v[32];

    ck_assert_uint_gt(phys, 0);
    if (phys <= (UINT64_C(1) << 24)) {
        snprintf(v, sizeof(v), "%llu", (unsigned long long)phys);
        ck_assert_msg(parse(&cfg, "--cache-mb", v) == CONFIG_OK, "%s", err);
        ck_assert_uint_eq(cfg.cache_mb, phys);
    }
    snprintf(v, sizeof(v), "%llu", (unsigned long long)phys + 1);
    if (phys + 1 <= (UINT64_C(1) << 24)) {
        ck_assert_int_eq(parse(&cfg, "--cache-mb", v), CONFIG_ERROR);
        ck_assert_msg(strstr(err, "--cache-mb") != NULL && strstr(err, "physical memory") != NULL,
                      "%s", err);
        ck_assert_ptr_null(strchr(err, '\n'));
    }
    /* Past the range as before. */
    ck_assert_int_eq(parse(&cfg, "--cache-mb", "16777217"), CONFIG_ERROR);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_every_flag);
    tcase_add_test(tc, test_admin_listen);
    tcase_add_test(tc, test_protected_mode);
    tcase_add_test(tc, test_environment);
    tcase_add_test(tc, test_bad_environment);
    tcase_add_loop_test(tc, test_cgroup, 0, (int)(sizeof(cgroup_cases) / sizeof(cgroup_cases[0])));
    tcase_add_test(tc, test_defaults_follow_limits);
    tcase_add_loop_test(tc, test_bad_values, 0, (int)(sizeof(bad) / sizeof(bad[0])));
    tcase_add_test(tc, test_help_version);
    tcase_add_test(tc, test_default_model_follows_models);
    tcase_add_test(tc, test_edges);
    tcase_add_test(tc, test_audit_rate_accepted);
    tcase_add_test(tc, test_audit_rate_environment);
    tcase_add_loop_test(tc, test_audit_rate_refused, 0,
                        (int)(sizeof(bad_rates) / sizeof(bad_rates[0])));
    tcase_add_test(tc, test_on_full);
    tcase_add_test(tc, test_preload);
    tcase_add_test(tc, test_fault_flags);
    tcase_add_test(tc, test_cache_mb_cap);
    tcase_add_test(tc, test_handshake_flags);
    tcase_add_test(tc, test_tenants_flag);
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
