/*
 * test_metrics.c: Check suite for server/admin/metrics.c: the counters, the step
 * histogram, and the Prometheus text they render to.
 *
 * `test_metrics --dump FILE` writes one rendering with known counters to
 * FILE and exits, `--dump-fresh FILE` one right after metrics_init(); CTest
 * feeds both to `promtool check metrics`.
 */
#include <check.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/model.h"
#include "proto/proto.h"
#include "server/config.h"
#include "server/admin/metrics.h"
#include "server/admin/procstat_int.h"

#define SEC 1000000000ull

static const proto_stats_t known_stats = {
    .cache_entries = 7,
    .live_sessions = 3,
    .g_calls = 120,
    .rows = 456,
    .connections = 2,
    .requests_total = 0, /* render takes the labelled counts from metrics */
    .errors_total = 0,
    .pool_bytes_total = 1 << 20,
    .pool_bytes_used = 4096,
    .pool_slots_total = 16,
    .pool_slots_used = 3,
    .uptime_seconds = 5,
    .threads = 4,
    .prefix_entries = 31,
    .prefix_hit_entries = 32,
    .prefix_query_entries = 33,
    .prefix_evicted_entries = 34,
    .shared_blocks = 35,
};

/* Durations observed by fill(), in ns, with the bucket each lands in. */
static const uint64_t observed[] = {
    1,             /* le 2.5e-08 */
    30,            /* le 5e-08 */
    100,           /* le 1e-07: the bound is inclusive */
    101,           /* le 2.5e-07 */
    750,           /* le 1e-06 */
    5000,          /* le 5e-06 */
    5001,          /* le 1e-05 */
    3000000,       /* le 0.005 */
    10 * SEC,      /* le 10 */
    10 * SEC + 1,  /* +Inf only */
    3600ull * SEC, /* +Inf only */
};
#define NOBSERVED (sizeof(observed) / sizeof(observed[0]))

/* A rendering of known counters at t = 100 s, started at t = 1 s. */
static void fill(void)
{
    metrics_init(1 * SEC);
    metrics_model_served(0); /* hash */
    for (int op = 0; op < PROTO_OP__COUNT; op++)
        for (int i = 0; i <= op; i++)
            metrics_count_request((proto_op_t)op); /* op k counted k+1 times */
    metrics_count_error(SLOTD_EBAD_JSON);
    metrics_count_error(SLOTD_EUNKNOWN_ID);
    metrics_count_error(SLOTD_EUNKNOWN_ID);
    metrics_count_error(SLOTD_ENOMEM);
    metrics_count_error(SLOTD_ESTALE);
    metrics_count_error(-1000); /* not in the list: internal */
    metrics_count_release(METRICS_RELEASE_FINISH);
    metrics_count_release(METRICS_RELEASE_DISCONNECT);
    metrics_count_release(METRICS_RELEASE_DISCONNECT);
    metrics_count_release(METRICS_RELEASE_IDLE);
    metrics_count_release(METRICS_RELEASE_IDLE);
    metrics_count_release(METRICS_RELEASE_IDLE);
    metrics_count_divergence();
    metrics_count_audit();
    metrics_count_audit();
    metrics_count_refused();
    metrics_count_refused();
    metrics_count_refused();
    for (int i = 0; i < 5; i++)
        metrics_count_socket_read();
    for (int i = 0; i < 4; i++)
        metrics_count_socket_write();
    metrics_count_batch(5);
    metrics_count_batch(3);
    for (int i = 0; i < 6; i++)
        metrics_count_accept_error();
    for (int i = 0; i < 7; i++)
        metrics_count_conn_timeout();
    for (int i = 0; i < 8; i++)
        metrics_count_auth_failure();
    for (size_t i = 0; i < NOBSERVED; i++)
        /* Out of order stamps, several copies. */
        metrics_observe_step((unsigned)i * 7, observed[i], 90 * SEC - i, 0);
}

static char *render(const proto_stats_t *st, uint64_t now_ns)
{
    proto_buf_t b;
    proto_buf_init(&b);
    ck_assert_int_eq(metrics_render(&b, st, now_ns), SLOTD_OK);
    ck_assert_int_eq(proto_buf_append(&b, "", 1), SLOTD_OK);
    return b.data; /* NUL-terminated; the caller frees */
}

/* The value of the sample line starting with `prefix` (name and labels, no
 * trailing space), or fails the test. */
static double sample(const char *text, const char *prefix)
{
    size_t n = strlen(prefix);
    for (const char *p = text; *p;) {
        const char *eol = strchr(p, '\n');
        ck_assert_ptr_nonnull(eol);
        if (strncmp(p, prefix, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
        p = eol + 1;
    }
    ck_abort_msg("no sample '%s'", prefix);
    return 0;
}

static int has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; *p;) {
        const char *eol = strchr(p, '\n');
        if (eol == NULL)
            return 0;
        if ((size_t)(eol - p) == n && memcmp(p, line, n) == 0)
            return 1;
        p = eol + 1;
    }
    return 0;
}

static void assert_family(const char *text, const char *name, const char *type)
{
    char line[256];
    snprintf(line, sizeof(line), "# TYPE %s %s", name, type);
    ck_assert_msg(has_line(text, line), "missing '%s'", line);
    snprintf(line, sizeof(line), "# HELP %s ", name);
    ck_assert_msg(strstr(text, line) != NULL, "missing '%s'", line);
}

START_TEST(test_every_family)
{
    fill();
    char *t = render(&known_stats, 100 * SEC);
    static const struct {
        const char *name, *type;
    } fam[] = {
        {"slotd_cache_entries", "gauge"},
        {"slotd_live_sessions", "gauge"},
        {"slotd_pool_bytes", "gauge"},
        {"slotd_pool_slots", "gauge"},
        {"slotd_g_calls_total", "counter"},
        {"slotd_attention_rows_total", "counter"},
        {"slotd_requests_total", "counter"},
        {"slotd_errors_total", "counter"},
        {"slotd_refusals_total", "counter"},
        {"slotd_sessions_released_total", "counter"},
        {"slotd_connections", "gauge"},
        {"slotd_connections_refused_total", "counter"},
        {"slotd_accept_errors_total", "counter"},
        {"slotd_connections_closed_total", "counter"},
        {"slotd_auth_failures_total", "counter"},
        {"slotd_tenants_reloads_total", "counter"},
        {"slotd_tenants_reload_failures_total", "counter"},
        {"slotd_socket_reads_total", "counter"},
        {"slotd_socket_writes_total", "counter"},
        {"slotd_step_seconds", "histogram"},
        {"slotd_steps_in_flight", "gauge"},
        {"slotd_requests_waiting", "gauge"},
        {"slotd_requests_running", "gauge"},
        {"slotd_request_wait_seconds", "histogram"},
        {"slotd_request_duration_seconds", "histogram"},
        {"slotd_batch_size", "histogram"},
        {"slotd_last_step_age_seconds", "gauge"},
        {"slotd_cache_divergence_total", "counter"},
        {"slotd_cache_audits_total", "counter"},
        {"slotd_model_builds_total", "counter"},
        {"slotd_model_build_seconds_total", "counter"},
        {"slotd_evicted_sessions", "gauge"},
        {"slotd_evicted_token_bytes", "gauge"},
        {"slotd_evictions_total", "counter"},
        {"slotd_rebuilt_entries_total", "counter"},
        {"slotd_rebuild_seconds_total", "counter"},
        {"slotd_room_waits_total", "counter"},
        {"slotd_room_wait_seconds", "histogram"},
        {"slotd_step_batches_total", "counter"},
        {"slotd_batched_steps_total", "counter"},
        {"slotd_uptime_seconds", "gauge"},
        {"slotd_healthy", "gauge"},
        {"slotd_draining", "gauge"},
        {"slotd_wedged", "gauge"},
        {"slotd_threads", "gauge"},
        {"slotd_prefix_cache_entries", "gauge"},
        {"slotd_prefix_cache_hit_entries_total", "counter"},
        {"slotd_prefix_cache_lookup_entries_total", "counter"},
        {"slotd_prefix_cache_evicted_entries_total", "counter"},
        {"slotd_shared_blocks", "gauge"},
        {"process_cpu_seconds_total", "counter"},
        {"process_resident_memory_bytes", "gauge"},
        {"process_virtual_memory_bytes", "gauge"},
        {"process_open_fds", "gauge"},
        {"process_max_fds", "gauge"},
        {"process_start_time_seconds", "gauge"},
        {"slotd_build_info", "gauge"},
    };
    for (size_t i = 0; i < sizeof(fam) / sizeof(fam[0]); i++)
        assert_family(t, fam[i].name, fam[i].type);

    /* Exactly one HELP and one TYPE per family, every sample named after a
     * family declared before it, no trailing white space. */
    size_t ntype = 0;
    for (const char *p = t; *p;) {
        const char *eol = strchr(p, '\n');
        ck_assert_ptr_nonnull(eol);
        ck_assert_msg(eol > p && eol[-1] != ' ', "blank or trailing space");
        if (strncmp(p, "# TYPE ", 7) == 0)
            ntype++;
        else if (*p != '#')
            ck_assert_msg(strncmp(p, "slotd_", 6) == 0 || strncmp(p, "process_", 8) == 0,
                          "sample without the prefix");
        p = eol + 1;
    }
    ck_assert_uint_eq(ntype, sizeof(fam) / sizeof(fam[0]));
    free(t);
}
END_TEST

START_TEST(test_process_figures)
{
    proto_stats_t st = {.threads = 1};
    /* Ten descriptors more than before, 8 MiB more resident memory. */
    char *before = render(&st, 1 * SEC);
    double fds0 = sample(before, "process_open_fds");
    double rss0 = sample(before, "process_resident_memory_bytes");
    int fds[10];
    for (int i = 0; i < 10; i++)
        ck_assert_int_ge(fds[i] = open("/dev/null", O_RDONLY), 0);
    size_t big = 8u << 20;
    char *mem = malloc(big);
    ck_assert_ptr_nonnull(mem);
    memset(mem, 1, big);
    /* Keeps an optimising compiler from dropping the unread block. */
    __asm__ volatile("" : : "r"(mem) : "memory");
    char *t = render(&st, 2 * SEC);
    ck_assert_double_eq(sample(t, "process_open_fds"), fds0 + 10);
    ck_assert_double_ge(sample(t, "process_resident_memory_bytes"), rss0 + big / 2);
    ck_assert_double_ge(sample(t, "process_virtual_memory_bytes"),
                        sample(t, "process_resident_memory_bytes"));
    struct rlimit rl;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    ck_assert_double_eq(sample(t, "process_max_fds"), (double)rl.rlim_cur);
    ck_assert_double_ge(sample(t, "process_cpu_seconds_total"), 0);
    /* Started before now and after 2020, in seconds since the epoch. */
    double started = sample(t, "process_start_time_seconds");
    ck_assert_double_le(started, (double)time(NULL) + 1);
    ck_assert_double_gt(started, 1577836800.0);
    char want[256];
    snprintf(want, sizeof(want), "slotd_build_info{version=\"%s\",commit=\"%s\"} 1",
             config_version(), procstat_commit());
    ck_assert_msg(has_line(t, want), "no '%s'", want);
    ck_assert_str_ne(procstat_commit(), "");
    for (int i = 0; i < 10; i++)
        close(fds[i]);
    free(mem);
    free(before);
    free(t);
}
END_TEST

START_TEST(test_stats_figures)
{
    fill();
    char *t = render(&known_stats, 100 * SEC);
    static const char *const lines[] = {
        "slotd_cache_entries 7",
        "slotd_live_sessions 3",
        "slotd_g_calls_total 120",
        "slotd_attention_rows_total 456",
        "slotd_connections 2",
        "slotd_pool_bytes{state=\"used\"} 4096",
        "slotd_pool_bytes{state=\"free\"} 1044480",
        "slotd_pool_slots{state=\"used\"} 3",
        "slotd_pool_slots{state=\"free\"} 13",
        "slotd_threads 4",
        "slotd_prefix_cache_entries 31",
        "slotd_prefix_cache_hit_entries_total 32",
        "slotd_prefix_cache_lookup_entries_total 33",
        "slotd_prefix_cache_evicted_entries_total 34",
        "slotd_shared_blocks 35",
        "slotd_cache_divergence_total 1",
        "slotd_cache_audits_total 2",
        "slotd_connections_refused_total 3",
        "slotd_socket_reads_total 5",
        "slotd_socket_writes_total 4",
        "slotd_step_batches_total 2",
        "slotd_batched_steps_total 8",
        "slotd_accept_errors_total 6",
        "slotd_connections_closed_total{reason=\"timeout\"} 7",
        "slotd_auth_failures_total 8",
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
        ck_assert_msg(has_line(t, lines[i]), "missing '%s'", lines[i]);
    ck_assert_uint_eq(metrics_audit_value(), 2);
    ck_assert_uint_eq(metrics_refused_value(), 3);
    ck_assert_uint_eq(metrics_socket_read_value(), 5);
    ck_assert_uint_eq(metrics_socket_write_value(), 4);
    ck_assert_double_eq_tol(sample(t, "slotd_uptime_seconds"), 99.0, 1e-9);
    free(t);

    /* More used than total (figures read at different instants): free is 0. */
    proto_stats_t odd = known_stats;
    odd.pool_bytes_used = odd.pool_bytes_total + 1;
    odd.pool_slots_used = odd.pool_slots_total + 1;
    t = render(&odd, 100 * SEC);
    ck_assert(has_line(t, "slotd_pool_bytes{state=\"free\"} 0"));
    ck_assert(has_line(t, "slotd_pool_slots{state=\"free\"} 0"));
    free(t);
}
END_TEST

START_TEST(test_requests_by_op)
{
    fill();
    char *t = render(&known_stats, 100 * SEC);
    uint64_t total = 0;
    for (int op = 0; op < PROTO_OP__COUNT; op++) {
        char line[128];
        snprintf(line, sizeof(line), "slotd_requests_total{op=\"%s\"} %d",
                 op == PROTO_OP_NONE ? "invalid" : proto_op_name((proto_op_t)op), op + 1);
        ck_assert_msg(has_line(t, line), "missing '%s'", line);
        total += (uint64_t)op + 1;
    }
    ck_assert_uint_eq(metrics_requests_total(), total);
    /* An op out of range counts as invalid. */
    metrics_count_request((proto_op_t)PROTO_OP__COUNT);
    ck_assert_uint_eq(metrics_requests_total(), total + 1);
    free(t);
    t = render(&known_stats, 100 * SEC);
    ck_assert(has_line(t, "slotd_requests_total{op=\"invalid\"} 2"));
    free(t);
}
END_TEST

START_TEST(test_errors_by_code)
{
    fill();
    char *t = render(&known_stats, 100 * SEC);
    static const char *const wire[] = {
#define XX(name, w, desc) w,
        SLOTD_ERRNO_MAP(XX)
#undef XX
    };
    for (size_t i = 0; i < sizeof(wire) / sizeof(wire[0]); i++) {
        char prefix[128];
        snprintf(prefix, sizeof(prefix), "slotd_errors_total{code=\"%s\"} ", wire[i]);
        const char *first = strstr(t, prefix);
        ck_assert_msg(first != NULL, "missing code %s", wire[i]);
        ck_assert_msg(strstr(first + 1, prefix) == NULL, "code %s twice", wire[i]);
    }
    ck_assert(has_line(t, "slotd_errors_total{code=\"bad_json\"} 1"));
    ck_assert(has_line(t, "slotd_errors_total{code=\"unknown_id\"} 2"));
    ck_assert(has_line(t, "slotd_errors_total{code=\"shutting_down\"} 0"));
    ck_assert(has_line(t, "slotd_errors_total{code=\"internal\"} 3"));
    ck_assert_uint_eq(metrics_errors_total(), 6);
    free(t);
}
END_TEST

START_TEST(test_released_by_reason)
{
    fill();
    char *t = render(&known_stats, 100 * SEC);
    ck_assert(has_line(t, "slotd_sessions_released_total{reason=\"finish\"} 1"));
    ck_assert(has_line(t, "slotd_sessions_released_total{reason=\"disconnect\"} 2"));
    ck_assert(has_line(t, "slotd_sessions_released_total{reason=\"idle\"} 3"));
    ck_assert(has_line(t, "slotd_sessions_released_total{reason=\"shutdown\"} 0"));
    ck_assert_uint_eq(metrics_released(METRICS_RELEASE_FINISH), 1);
    ck_assert_uint_eq(metrics_released(METRICS_RELEASE_IDLE), 3);
    ck_assert_uint_eq(metrics_released(METRICS_RELEASE__COUNT), 0);
    ck_assert_uint_eq(metrics_divergence_value(), 1);
    free(t);
}
END_TEST

START_TEST(test_refusals_by_reason)
{
    /* Every reason rendered, counted apart: a share's refusal is not the
     * pool's. */
    fill();
    metrics_count_refusal(METRICS_REFUSAL_SHARE);
    metrics_count_refusal(METRICS_REFUSAL_SHARE);
    metrics_count_refusal(METRICS_REFUSAL_POOL);
    char *t = render(&known_stats, 100 * SEC);
    ck_assert(has_line(t, "slotd_refusals_total{reason=\"pool\"} 1"));
    ck_assert(has_line(t, "slotd_refusals_total{reason=\"slots\"} 0"));
    ck_assert(has_line(t, "slotd_refusals_total{reason=\"share\"} 2"));
    ck_assert_uint_eq(metrics_refusal_value(), 3);
    free(t);
}
END_TEST

START_TEST(test_histogram)
{
    fill();
    char *t = render(&known_stats, 100 * SEC);
    static const char *const le[] = {"2.5e-08", "5e-08",  "1e-07", "2.5e-07", "5e-07", "1e-06",
                                     "2.5e-06", "5e-06",  "1e-05", "2.5e-05", "5e-05", "0.0001",
                                     "0.00025", "0.0005", "0.001", "0.0025",  "0.005", "0.01",
                                     "0.025",   "0.05",   "0.1",   "0.25",    "0.5",   "1",
                                     "2.5",     "5",      "10",    "+Inf"};
    static const double expect[] = {1, 2, 3, 4, 4, 5, 5, 6, 7, 7, 7, 7, 7, 7,
                                    7, 7, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 9, 11};
    double prev = 0;
    for (size_t i = 0; i < sizeof(le) / sizeof(le[0]); i++) {
        char prefix[96];
        snprintf(prefix, sizeof(prefix), "slotd_step_seconds_bucket{model=\"hash\",le=\"%s\"}",
                 le[i]);
        double v = sample(t, prefix);
        ck_assert_msg(v >= prev, "bucket %s not cumulative", le[i]);
        ck_assert_double_eq(v, expect[i]);
        prev = v;
    }
    ck_assert_double_eq(sample(t, "slotd_step_seconds_count{model=\"hash\"}"), (double)NOBSERVED);
    double sum = 0;
    for (size_t i = 0; i < NOBSERVED; i++)
        sum += (double)observed[i] / 1e9;
    ck_assert_double_eq_tol(sample(t, "slotd_step_seconds_sum{model=\"hash\"}"), sum, 1e-6);
    free(t);
}
END_TEST

/* Every bucket boundary of both bucket sets, and every power of two: each
 * value in the bucket a scan of the rendered bounds puts it in (the
 * observation starts its search from the value's bit length). */
static void check_placement(const char *name, const char *lab, double scale,
                            void (*observe)(unsigned, uint64_t))
{
    char prefix[128], *t;
    double bound[64];
    size_t nb = 0;
    uint64_t vals[64 * 3 + 64 * 3], nv = 0;

    metrics_init(1 * SEC);

    metrics_model_served(0); /* hash */
    t = render(&known_stats, 2 * SEC);
    /* The bounds, from the rendering: `name_bucket{le="X"}` lines. */
    snprintf(prefix, sizeof(prefix), "%s_bucket{%sle=\"", name, lab);
    for (const char *p = strstr(t, prefix); p != NULL && nb < 64; p = strstr(p + 1, prefix)) {
        const char *x = p + strlen(prefix);
        if (strncmp(x, "+Inf", 4) != 0)
            bound[nb++] = strtod(x, NULL);
    }
    free(t);
    ck_assert_uint_gt(nb, 4);
    for (size_t i = 0; i < nb; i++) {
        uint64_t b = (uint64_t)(bound[i] * scale + 0.5);
        vals[nv++] = b - 1;
        vals[nv++] = b;
        vals[nv++] = b + 1;
    }
    for (unsigned k = 0; k < 64; k++) {
        vals[nv++] = ((uint64_t)1 << k) - 1;
        vals[nv++] = (uint64_t)1 << k;
        vals[nv++] = ((uint64_t)1 << k) + 1;
    }
    for (size_t i = 0; i < nv; i++)
        observe(0, vals[i]);
    t = render(&known_stats, 2 * SEC);
    for (size_t i = 0; i < nb; i++) {
        uint64_t b = (uint64_t)(bound[i] * scale + 0.5), want = 0;
        char line[160];
        for (size_t j = 0; j < nv; j++)
            want += vals[j] <= b;
        snprintf(line, sizeof(line), "%s_bucket{%sle=\"", name, lab);
        /* The i-th bound's line: found again by its position. */
        const char *p = strstr(t, line);
        for (size_t j = 0; j < i; j++)
            p = strstr(p + 1, line);
        ck_assert_ptr_nonnull(p);
        p = strchr(p, '}');
        ck_assert_msg(strtoull(p + 2, NULL, 10) == want, "%s: %llu at or under bound %zu, not %llu",
                      name, strtoull(p + 2, NULL, 10), i, (unsigned long long)want);
    }
    if (*lab)
        snprintf(prefix, sizeof(prefix), "%s_count{%.*s}", name, (int)strlen(lab) - 1, lab);
    else
        snprintf(prefix, sizeof(prefix), "%s_count", name);
    ck_assert_double_eq(sample(t, prefix), (double)nv);
    free(t);
}

static void observe_step_seconds(unsigned shard, uint64_t v)
{
    metrics_observe_step_seconds(shard, v, 0);
}

static void observe_batch_size(unsigned shard, uint64_t v)
{
    metrics_observe_batch_size(shard, v);
}

START_TEST(test_histogram_placement)
{
    check_placement("slotd_step_seconds", "model=\"hash\",", 1e9, observe_step_seconds);
    check_placement("slotd_batch_size", "", 1, observe_batch_size);
}
END_TEST

/* The loop's replies of one turn, observed at once: each from its read,
 * by its op and model; a request with no model (a stats, or a step that
 * found no session) in the op's series with no model label; an op outside
 * the table counts as invalid; series only for the models served. */
START_TEST(test_request_durations)
{
    const uint64_t read[] = {1 * SEC,       2 * SEC - 1000, 2 * SEC + 5, 2 * SEC - 30,
                             2 * SEC - 200, 2 * SEC - 3000, 2 * SEC - 40};
    const uint16_t labels[] = {
        metrics_op_model(PROTO_OP_STEP, 0),
        metrics_op_model(PROTO_OP_FINISH, 0),
        metrics_op_model(PROTO_OP_STEP, 0),
        metrics_op_model((proto_op_t)999, MODEL_NPRESETS),
        metrics_op_model(PROTO_OP_STEP, 1),
        metrics_op_model(PROTO_OP_STATS, MODEL_NPRESETS),
        metrics_op_model(PROTO_OP_STEP, MODEL_NPRESETS),
    };

    metrics_init(1 * SEC);

    metrics_model_served(0); /* hash */
    metrics_model_served(1); /* tiny */
    metrics_observe_loop_request_durations(2 * SEC, read, labels, 7);
    /* step of hash: 1 s, and 0 for a read stamped after the end (clamped,
     * not wrapped); finish: 1 us; step of tiny: 200 ns. */
    static const char *const want[] = {
        "count{op=\"step\",model=\"hash\"} 2",
        "bucket{op=\"step\",model=\"hash\",le=\"2.5e-08\"} 1",
        "bucket{op=\"step\",model=\"hash\",le=\"0.5\"} 1",
        "bucket{op=\"step\",model=\"hash\",le=\"1\"} 2",
        "bucket{op=\"finish\",model=\"hash\",le=\"5e-07\"} 0",
        "bucket{op=\"finish\",model=\"hash\",le=\"1e-06\"} 1",
        "count{op=\"step\",model=\"tiny\"} 1",
        "bucket{op=\"step\",model=\"tiny\",le=\"1e-07\"} 0",
        "bucket{op=\"step\",model=\"tiny\",le=\"2.5e-07\"} 1",
        "count{op=\"finish\",model=\"tiny\"} 0",
        "count{op=\"step\"} 1",
        "count{op=\"stats\"} 1",
        "count{op=\"invalid\"} 1",
        "count{op=\"auth\"} 0",
    };
    char *t = render(&known_stats, 2 * SEC), line[160];
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        snprintf(line, sizeof(line), "slotd_request_duration_seconds_%s", want[i]);
        ck_assert_msg(has_line(t, line), "no line %s", line);
    }
    /* No series of a model not served, nor of a model for an op that has
     * none. */
    ck_assert_ptr_null(
        strstr(t, "slotd_request_duration_seconds_count{op=\"step\",model=\"small\"}"));
    ck_assert_ptr_null(strstr(t, "slotd_request_duration_seconds_count{op=\"stats\",model="));
    ck_assert_ptr_null(strstr(t, "slotd_request_duration_seconds_count{op=\"invalid\",model="));
    ck_assert_uint_eq(metrics_request_duration_value(), 7);
    ck_assert_uint_eq(metrics_request_duration_value_at(metrics_op_model(PROTO_OP_STEP, 1)), 1);
    free(t);
}
END_TEST

START_TEST(test_last_step)
{
    metrics_init(1 * SEC);
    metrics_model_served(0); /* hash */
    ck_assert_uint_eq(metrics_last_step_ns(), 0);
    char *t = render(&known_stats, 2 * SEC);
    /* Announced, but no sample before the first step. */
    assert_family(t, "slotd_last_step_age_seconds", "gauge");
    ck_assert_ptr_null(strstr(t, "\nslotd_last_step_age_seconds "));
    ck_assert(has_line(t, "slotd_step_seconds_count{model=\"hash\"} 0"));
    ck_assert(has_line(t, "slotd_step_seconds_bucket{model=\"hash\",le=\"+Inf\"} 0"));
    free(t);

    metrics_observe_step(0, 1000, 50 * SEC, 0);
    metrics_observe_step(1, 1000, 40 * SEC, 0);  /* finished earlier, reported later */
    metrics_observe_step(16, 1000, 45 * SEC, 0); /* the copy of worker 0 again */
    ck_assert_uint_eq(metrics_last_step_ns(), 50 * SEC);
    t = render(&known_stats, 52 * SEC + SEC / 2);
    ck_assert_double_eq_tol(sample(t, "slotd_last_step_age_seconds"), 2.5, 1e-9);
    free(t);
    /* A clock read before the stamp gives age 0, never a huge number. */
    t = render(&known_stats, 49 * SEC);
    ck_assert_double_eq(sample(t, "slotd_last_step_age_seconds"), 0);
    free(t);

    /* metrics_init() resets everything. */
    metrics_count_refused();
    metrics_count_audit();
    metrics_init(0);
    metrics_model_served(0); /* hash */
    ck_assert_uint_eq(metrics_last_step_ns(), 0);
    ck_assert_uint_eq(metrics_requests_total(), 0);
    ck_assert_uint_eq(metrics_refused_value(), 0);
    ck_assert_uint_eq(metrics_audit_value(), 0);
}
END_TEST

/* The scheduler's figures: the gauges of jobs waiting and running, from
 * the jobs out and back and the waits observed as workers begin them; the
 * waits and durations by op; batch sizes in counts, not seconds. */
START_TEST(test_requests_waiting_running)
{
    metrics_init(1 * SEC);
    metrics_model_served(0); /* hash */
    for (int i = 0; i < 5; i++)
        metrics_job_out();
    metrics_observe_request_wait(0, 2000000, metrics_op_model(PROTO_OP_STEP, 0)); /* 2 ms */
    metrics_observe_request_wait(1, 1000, metrics_op_model(PROTO_OP_STEP, 0));
    metrics_observe_request_wait(1, 30000, metrics_op_model(PROTO_OP_START, 0));
    metrics_job_back(true);
    metrics_job_back(false); /* taken back, never begun */
    metrics_observe_request_duration(METRICS_LOOP_SHARD, 3000000,
                                     metrics_op_model(PROTO_OP_FINISH, 0));
    metrics_observe_batch_size(0, 1);
    metrics_observe_batch_size(1, 32);
    metrics_observe_batch_size(1, 20);
    char *t = render(&known_stats, 2 * SEC);
    ck_assert(has_line(t, "slotd_requests_waiting 1")); /* 5 out - 1 back unbegun - 3 begun */
    ck_assert(has_line(t, "slotd_requests_running 2")); /* 3 begun - 1 back */
    ck_assert(has_line(t, "slotd_request_wait_seconds_count{op=\"step\",model=\"hash\"} 2"));
    ck_assert(has_line(
        t, "slotd_request_wait_seconds_bucket{op=\"step\",model=\"hash\",le=\"0.001\"} 1"));
    ck_assert(has_line(
        t, "slotd_request_wait_seconds_bucket{op=\"step\",model=\"hash\",le=\"0.0025\"} 2"));
    ck_assert(has_line(t, "slotd_request_wait_seconds_count{op=\"start\",model=\"hash\"} 1"));
    /* Only the ops workers run, with the models served. */
    ck_assert(has_line(t, "slotd_request_wait_seconds_count{op=\"logits\",model=\"hash\"} 0"));
    ck_assert_ptr_null(strstr(t, "slotd_request_wait_seconds_count{op=\"stats\""));
    ck_assert_ptr_null(strstr(t, "slotd_request_wait_seconds_count{op=\"finish\""));
    ck_assert_ptr_null(strstr(t, "slotd_request_wait_seconds_count{op=\"step\",model=\"tiny\"}"));
    ck_assert(has_line(t, "slotd_request_duration_seconds_count{op=\"finish\",model=\"hash\"} 1"));
    ck_assert(has_line(t, "slotd_batch_size_bucket{le=\"1\"} 1"));
    ck_assert(has_line(t, "slotd_batch_size_bucket{le=\"16\"} 1"));
    ck_assert(has_line(t, "slotd_batch_size_bucket{le=\"32\"} 3"));
    ck_assert(has_line(t, "slotd_batch_size_count 3"));
    free(t);
    metrics_job_back(true);
    metrics_job_back(true);
    metrics_job_back(false);
    t = render(&known_stats, 2 * SEC);
    ck_assert(has_line(t, "slotd_requests_waiting 0"));
    ck_assert(has_line(t, "slotd_requests_running 0"));
    free(t);
}
END_TEST

START_TEST(test_steps_in_flight)
{
    metrics_init(1 * SEC);
    metrics_model_served(0); /* hash */
    char *t = render(&known_stats, 2 * SEC);
    ck_assert(has_line(t, "slotd_steps_in_flight 0"));
    free(t);
    metrics_step_out();
    metrics_step_out();
    metrics_step_out();
    metrics_step_back();
    t = render(&known_stats, 2 * SEC);
    ck_assert(has_line(t, "slotd_steps_in_flight 2"));
    free(t);
    metrics_init(0);
    metrics_model_served(0); /* hash */
    t = render(&known_stats, 2 * SEC);
    ck_assert(has_line(t, "slotd_steps_in_flight 0"));
    free(t);
}
END_TEST

#define NTHREADS 8
#define PER_THREAD 20000

static void *observer(void *arg)
{
    uintptr_t k = (uintptr_t)arg;
    for (uint64_t i = 0; i < PER_THREAD; i++) {
        /* Two threads to a copy of the histogram. */
        metrics_observe_step((unsigned)(k / 2), (i * 7919 + k) % (20 * SEC), i + 1, 0);
        metrics_count_request(PROTO_OP_STEP);
        metrics_count_error(SLOTD_ECONTEXT_FULL);
    }
    return NULL;
}

START_TEST(test_concurrent)
{
    metrics_init(0);
    metrics_model_served(0); /* hash */
    pthread_t th[NTHREADS];
    for (uintptr_t i = 0; i < NTHREADS; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, observer, (void *)i), 0);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);
    ck_assert_uint_eq(metrics_requests_total(), NTHREADS * PER_THREAD);
    ck_assert_uint_eq(metrics_errors_total(), NTHREADS * PER_THREAD);
    ck_assert_uint_eq(metrics_last_step_ns(), PER_THREAD);
    char *t = render(&known_stats, SEC);
    ck_assert_double_eq(sample(t, "slotd_step_seconds_count{model=\"hash\"}"),
                        NTHREADS * PER_THREAD);
    ck_assert_double_eq(sample(t, "slotd_step_seconds_bucket{model=\"hash\",le=\"+Inf\"}"),
                        NTHREADS * PER_THREAD);
    free(t);
}
END_TEST

/* slotd_step_seconds by model: a step of one model is not in another's
 * series, and a preset not served has none at all. */
START_TEST(test_step_seconds_by_model)
{
    metrics_init(1 * SEC);
    metrics_model_served(0); /* hash */
    metrics_model_served(3); /* base */
    metrics_observe_step(0, 50, 2 * SEC, 0);
    metrics_observe_step(0, 60, 2 * SEC, 0);
    metrics_observe_step_alone(1, 2 * SEC, 3 * SEC, 3);
    metrics_observe_step(2, 1000, 3 * SEC, MODEL_NPRESETS); /* no preset: not counted */
    char *t = render(&known_stats, 4 * SEC);
    ck_assert_double_eq(sample(t, "slotd_step_seconds_count{model=\"hash\"}"), 2);
    ck_assert_double_eq(sample(t, "slotd_step_seconds_bucket{model=\"hash\",le=\"1e-07\"}"), 2);
    ck_assert_double_eq(sample(t, "slotd_step_seconds_count{model=\"base\"}"), 1);
    ck_assert_double_eq(sample(t, "slotd_step_seconds_bucket{model=\"base\",le=\"1\"}"), 0);
    ck_assert_double_eq(sample(t, "slotd_step_seconds_bucket{model=\"base\",le=\"2.5\"}"), 1);
    ck_assert_ptr_null(strstr(t, "slotd_step_seconds_count{model=\"tiny\"}"));
    ck_assert_ptr_null(strstr(t, "slotd_step_seconds_count{model=\"small\"}"));
    ck_assert_ptr_null(strstr(t, "slotd_step_seconds_count "));
    ck_assert_uint_eq(metrics_step_seconds_value(), 3);
    free(t);
}
END_TEST

static Suite *metrics_suite(void)
{
    Suite *s = suite_create("metrics");
    TCase *tc = tcase_create("render");
    tcase_add_test(tc, test_every_family);
    tcase_add_test(tc, test_step_seconds_by_model);
    tcase_add_test(tc, test_stats_figures);
    tcase_add_test(tc, test_process_figures);
    tcase_add_test(tc, test_requests_by_op);
    tcase_add_test(tc, test_errors_by_code);
    tcase_add_test(tc, test_released_by_reason);
    tcase_add_test(tc, test_refusals_by_reason);
    tcase_add_test(tc, test_histogram);
    tcase_add_test(tc, test_histogram_placement);
    tcase_add_test(tc, test_request_durations);
    tcase_add_test(tc, test_last_step);
    tcase_add_test(tc, test_steps_in_flight);
    tcase_add_test(tc, test_requests_waiting_running);
    tcase_add_test(tc, test_concurrent);
    suite_add_tcase(s, tc);
    return s;
}

static int dump(const char *path, bool fresh)
{
    if (fresh) {
        metrics_init(1 * SEC);   /* no step yet: no age sample */
        metrics_model_served(0); /* hash */
    } else
        fill();
    proto_buf_t b;
    proto_buf_init(&b);
    if (metrics_render(&b, &known_stats, 100 * SEC) != SLOTD_OK) {
        fprintf(stderr, "metrics_render failed\n");
        return 1;
    }
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        perror(path);
        return 1;
    }
    size_t n = fwrite(b.data, 1, b.len, f);
    int bad = fclose(f) != 0 || n != b.len;
    proto_buf_free(&b);
    if (bad) {
        perror(path);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--dump") == 0)
        return dump(argv[2], false);
    if (argc == 3 && strcmp(argv[1], "--dump-fresh") == 0)
        return dump(argv[2], true);
    SRunner *sr = srunner_create(metrics_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
