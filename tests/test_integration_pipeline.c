/*
 * test_integration_pipeline.c: pipelined lines take effect as if they ran
 * one at a time, in the order sent (docs/protocol.md, "Pipelining").
 *
 * Every case runs the same lines twice, each time against a fresh daemon
 * with the same flags: once one at a time (send a line, read its reply),
 * once pipelined (every line in one write, then every reply read).  The
 * two reply sequences must be equal, member for member; only the
 * uptime_seconds of a stats reply may differ.  The cases are those where
 * concurrency could show: a pool of 1 MiB (about fifteen `small` blocks of
 * 16 positions) or a small session limit, so that requests fail for room
 * when run one at a time after another, and would take room or see it
 * taken out of order when pipelined.  A case also checks the replies
 * themselves where the outcome is known (a failed start leaves no trace,
 * a finish makes room for the start after it, the error names what ran
 * out).  SLOTD_TEST_REPEATS trims the random mixes to fewer seeds per
 * set-up (main(): the sanitizer stages).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "itest.h"

#define MAX_LINES 512

typedef struct lines {
    char *v[MAX_LINES];
    int n;
} lines_t;

static void lines_add(lines_t *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void lines_add(lines_t *l, const char *fmt, ...)
{
    va_list ap;
    char *s;
    int n;

    ck_assert_int_lt(l->n, MAX_LINES);
    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    ck_assert_int_ge(n, 0);
    s = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(s);
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    l->v[l->n++] = s;
}

static void lines_free(lines_t *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->v[i]);
    l->n = 0;
}

/* A JSON array of `n` tokens in [0, vocab), from `seed`. */
static char *tokens_json(int n, uint32_t vocab, uint64_t seed)
{
    size_t cap = (size_t)n * 12 + 3, len = 0;
    char *s = malloc(cap);
    uint64_t x = seed * 0x9E3779B97F4A7C15u + 1;

    ck_assert_ptr_nonnull(s);
    s[len++] = '[';
    for (int i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        len += (size_t)snprintf(s + len, cap - len, "%s%u", i ? "," : "", (unsigned)(x % vocab));
    }
    s[len++] = ']';
    s[len] = '\0';
    return s;
}

/* The replies of `l` from a fresh daemon started with `flags`: one at a
 * time, or all lines in one write.  Without the prefix cache: which start
 * reuses another's entries depends on the order the workers run them in,
 * and with it `cached`, `rows` and the pool's figures in `stats`. */
static void run_lines(const char *const *flags, const lines_t *l, bool pipelined, char **out)
{
    const char *all[64];
    size_t nf = 0;

    for (; flags[nf] != NULL; nf++) {
        ck_assert_uint_lt(nf, 61);
        all[nf] = flags[nf];
    }
    all[nf++] = "--prefix-cache";
    all[nf++] = "off";
    all[nf] = NULL;
    itest_daemon_t *d = itest_daemon_startv(all);
    itest_conn_t *c = itest_connect(d);

    if (pipelined) {
        size_t total = 0, off = 0;
        char *buf;
        for (int i = 0; i < l->n; i++)
            total += strlen(l->v[i]) + 1;
        buf = malloc(total + 1);
        ck_assert_ptr_nonnull(buf);
        for (int i = 0; i < l->n; i++)
            off += (size_t)sprintf(buf + off, "%s\n", l->v[i]);
        ck_assert(itest_send(c, buf, off));
        free(buf);
    }
    for (int i = 0; i < l->n; i++) {
        /* One write a line: the line and its newline in two would wait
         * for the daemon's delayed ack (Nagle), some 40 ms a line, 8 s of
         * a random mix's 10. */
        if (!pipelined) {
            size_t len = strlen(l->v[i]);
            char *one = malloc(len + 2);
            ck_assert_ptr_nonnull(one);
            memcpy(one, l->v[i], len);
            one[len] = '\n';
            one[len + 1] = '\0';
            ck_assert(itest_send(c, one, len + 1));
            free(one);
        }
        out[i] = itest_read_line(c, ITEST_REPLY_MS, NULL);
        ck_assert_msg(out[i] != NULL, "line %d (%s): no reply (%s)", i, l->v[i],
                      pipelined ? "pipelined" : "one at a time");
    }
    itest_close(c);
    ck_assert_int_eq(itest_daemon_stop(d), 0);
}

/* Whether two reply lines are the same reply, uptime_seconds aside. */
static bool same_reply(const char *a, const char *b)
{
    cJSON *ja, *jb;
    bool same;

    if (strcmp(a, b) == 0)
        return true;
    ja = cJSON_Parse(a);
    jb = cJSON_Parse(b);
    if (ja != NULL)
        cJSON_DeleteItemFromObjectCaseSensitive(ja, "uptime_seconds");
    if (jb != NULL)
        cJSON_DeleteItemFromObjectCaseSensitive(jb, "uptime_seconds");
    same = ja != NULL && jb != NULL && cJSON_Compare(ja, jb, true);
    cJSON_Delete(ja);
    cJSON_Delete(jb);
    return same;
}

/* Runs `l` both ways and fails unless the replies are equal.  `seq` (if
 * not NULL) gets the one-at-a-time replies, owned by the caller. */
static void expect_same(const char *const *flags, const lines_t *l, char **seq)
{
    char *one[MAX_LINES], *pipe[MAX_LINES];

    run_lines(flags, l, false, one);
    run_lines(flags, l, true, pipe);
    for (int i = 0; i < l->n; i++) {
        ck_assert_msg(same_reply(one[i], pipe[i]),
                      "line %d: %s\n one at a time: %.300s\n pipelined:     %.300s", i, l->v[i],
                      one[i], pipe[i]);
        if (seq != NULL)
            seq[i] = one[i];
        else
            free(one[i]);
        free(pipe[i]);
    }
}

static void replies_free(char **r, int n)
{
    for (int i = 0; i < n; i++)
        free(r[i]);
}

/* Whether reply line `line` is an error with `code` whose message holds `word`. */
static bool is_error(const char *line, const char *code, const char *word)
{
    cJSON *j = cJSON_Parse(line);
    const char *got = j != NULL ? itest_error_code(j) : NULL;
    const cJSON *e = j != NULL ? cJSON_GetObjectItemCaseSensitive(j, "error") : NULL;
    const cJSON *m = e != NULL ? cJSON_GetObjectItemCaseSensitive(e, "message") : NULL;
    bool ok = got != NULL && strcmp(got, code) == 0 &&
              (word == NULL || (cJSON_IsString(m) && strstr(m->valuestring, word) != NULL));

    cJSON_Delete(j);
    return ok;
}

static bool is_ok(const char *line)
{
    cJSON *j = cJSON_Parse(line);
    bool ok = j != NULL && itest_error_code(j) == NULL;

    cJSON_Delete(j);
    return ok;
}

/* One connection may use the whole pool (--max-connection-share 1), so
 * that the pool's own room is what runs out; the share is the default's
 * (half the pool) where the flags say so. */
static const char *const small_pool[] = {
    "--cache-mb", "1", "--models", "tiny,hash,small", "--max-connection-share", "1", NULL};
static const char *const small_pool_shared[] = {"--cache-mb", "1", "--models", "tiny,hash,small",
                                                NULL};

/* A start refused for room leaves no trace: the same id starts with a
 * shorter prompt, also with steps and generates between the two. */
START_TEST(test_failed_start_leaves_no_trace)
{
    char *p300 = tokens_json(300, 512, 1), *p200 = tokens_json(200, 512, 2);
    char *g = tokens_json(8, 512, 3);
    char *r[MAX_LINES];
    lines_t l = {0};

    lines_add(&l, "{\"op\":\"start\",\"id\":\"s\",\"model\":\"small\",\"prompt\":%s}", p300);
    lines_add(&l, "{\"op\":\"start\",\"id\":\"s\",\"model\":\"small\",\"prompt\":%s}", p200);
    expect_same(small_pool, &l, r);
    ck_assert_msg(is_error(r[0], "cache_full", "memory"), "%s", r[0]);
    ck_assert_msg(strstr(r[1], "\"entries\":200") != NULL, "%s", r[1]);
    replies_free(r, l.n);
    lines_free(&l);

    lines_add(&l, "{\"op\":\"start\",\"id\":\"s\",\"model\":\"small\",\"prompt\":%s}", p300);
    lines_add(&l, "{\"op\":\"step\",\"id\":\"s\",\"n\":2}");
    lines_add(&l, "{\"op\":\"generate\",\"model\":\"small\",\"tokens\":%s,\"steps\":2}", g);
    lines_add(&l, "{\"op\":\"finish\",\"id\":\"s\"}");
    lines_add(&l, "{\"op\":\"start\",\"id\":\"s\",\"model\":\"small\",\"prompt\":%s}", p200);
    lines_add(&l, "{\"op\":\"step\",\"id\":\"s\",\"n\":2}");
    lines_add(&l, "{\"op\":\"stats\"}");
    lines_add(&l, "{\"op\":\"finish\",\"id\":\"s\"}");
    lines_add(&l, "{\"op\":\"stats\"}");
    expect_same(small_pool, &l, r);
    ck_assert_msg(is_error(r[0], "cache_full", NULL), "%s", r[0]);
    ck_assert_msg(is_error(r[1], "unknown_id", "s"), "%s", r[1]);
    ck_assert_msg(is_ok(r[2]), "%s", r[2]);
    ck_assert_msg(is_error(r[3], "unknown_id", "s"), "%s", r[3]);
    ck_assert_msg(strstr(r[4], "\"entries\":200") != NULL, "%s", r[4]);
    ck_assert_msg(strstr(r[5], "\"entries\":202") != NULL, "%s", r[5]);
    ck_assert_msg(strstr(r[6], "\"live_sessions\":1") != NULL, "%s", r[6]);
    ck_assert_msg(strstr(r[7], "\"released\":202") != NULL, "%s", r[7]);
    ck_assert_msg(strstr(r[8], "\"cache_entries\":0") != NULL, "%s", r[8]);
    replies_free(r, l.n);
    lines_free(&l);

    /* Retried by hand after cache_full, with a shorter prompt. */
    lines_add(&l, "{\"op\":\"start\",\"id\":\"s\",\"model\":\"small\",\"prompt\":%s}", p300);
    lines_add(&l, "{\"op\":\"start\",\"id\":\"s\",\"model\":\"small\",\"prompt\":[1,2,3]}");
    lines_add(&l, "{\"op\":\"step\",\"id\":\"s\"}");
    lines_add(&l, "{\"op\":\"start\",\"id\":\"s\",\"model\":\"small\",\"prompt\":[4]}");
    lines_add(&l, "{\"op\":\"finish\",\"id\":\"s\"}");
    expect_same(small_pool, &l, r);
    ck_assert_msg(is_error(r[0], "cache_full", NULL), "%s", r[0]);
    ck_assert_msg(strstr(r[1], "\"entries\":3") != NULL, "%s", r[1]);
    ck_assert_msg(strstr(r[2], "\"entries\":4") != NULL, "%s", r[2]);
    ck_assert_msg(is_error(r[3], "duplicate_id", "s"), "%s", r[3]);
    ck_assert_msg(strstr(r[4], "\"released\":4") != NULL, "%s", r[4]);
    replies_free(r, l.n);
    lines_free(&l);
    free(p300);
    free(p200);
    free(g);
}
END_TEST

/* A finish makes room for the start after it. */
START_TEST(test_finish_makes_room)
{
    char *p0 = tokens_json(200, 512, 4), *p1 = tokens_json(200, 512, 5);
    char *r[MAX_LINES];
    lines_t l = {0};

    lines_add(&l, "{\"op\":\"start\",\"id\":\"p0\",\"model\":\"small\",\"prompt\":%s}", p0);
    lines_add(&l, "{\"op\":\"finish\",\"id\":\"p0\"}");
    lines_add(&l, "{\"op\":\"start\",\"id\":\"p1\",\"model\":\"small\",\"prompt\":%s}", p1);
    lines_add(&l, "{\"op\":\"finish\",\"id\":\"p1\"}");
    expect_same(small_pool, &l, r);
    for (int i = 0; i < l.n; i++)
        ck_assert_msg(is_ok(r[i]), "line %d: %s", i, r[i]);
    replies_free(r, l.n);
    lines_free(&l);
    free(p0);
    free(p1);
}
END_TEST

/* A step past max_ctx is context_full, with the same words, whether its
 * session has requests pending or not, and under a share smaller than
 * the step would need; a step bigger than the share never fits. */
START_TEST(test_context_before_share)
{
    char *r[MAX_LINES];
    lines_t l = {0};

    lines_add(&l, "{\"op\":\"start\",\"id\":\"s\",\"model\":\"small\",\"prompt\":[1,2,3]}");
    lines_add(&l, "{\"op\":\"step\",\"id\":\"s\",\"n\":1022}");
    lines_add(&l, "{\"op\":\"step\",\"id\":\"s\",\"n\":1021}");
    lines_add(&l, "{\"op\":\"step\",\"id\":\"s\",\"n\":2}");
    lines_add(&l, "{\"op\":\"start\",\"id\":\"t\",\"model\":\"tiny\",\"prompt\":[1,2]}");
    lines_add(&l, "{\"op\":\"step\",\"id\":\"t\",\"n\":600000}");
    lines_add(&l, "{\"op\":\"step\",\"id\":\"t\",\"n\":6}");
    lines_add(&l, "{\"op\":\"step\",\"id\":\"t\"}");
    lines_add(&l, "{\"op\":\"stats\"}");
    expect_same(small_pool_shared, &l, r);
    ck_assert_msg(is_error(r[1], "context_full", "max_ctx 1024"), "%s", r[1]);
    ck_assert_msg(is_error(r[2], "cache_full", "never"), "%s", r[2]);
    ck_assert_msg(is_ok(r[3]), "%s", r[3]);
    ck_assert_msg(is_error(r[5], "context_full", "max_ctx 8"), "%s", r[5]);
    ck_assert_msg(is_ok(r[6]), "%s", r[6]);
    ck_assert_msg(is_error(r[7], "context_full", "max_ctx 8"), "%s", r[7]);
    replies_free(r, l.n);
    lines_free(&l);
}
END_TEST

/* Start and finish pairs past --max-sessions, never more than one live. */
START_TEST(test_pairs_past_session_limit)
{
    static const char *const flags[] = {"--max-sessions",         "4", "--threads", "2",
                                        "--max-connection-share", "1", NULL};
    char *r[MAX_LINES];
    lines_t l = {0};

    for (int i = 0; i < 12; i++) {
        lines_add(&l, "{\"op\":\"start\",\"id\":\"h%d\",\"model\":\"hash\",\"prompt\":[%d,7]}", i,
                  i);
        lines_add(&l, "{\"op\":\"finish\",\"id\":\"h%d\"}", i);
    }
    expect_same(flags, &l, r);
    for (int i = 0; i < l.n; i++)
        ck_assert_msg(is_ok(r[i]), "line %d: %s", i, r[i]);
    replies_free(r, l.n);
    lines_free(&l);

    /* Past the limit for real: the error names it. */
    for (int i = 0; i < 5; i++)
        lines_add(&l, "{\"op\":\"start\",\"id\":\"k%d\",\"model\":\"hash\",\"prompt\":[1]}", i);
    lines_add(&l, "{\"op\":\"finish\",\"id\":\"k0\"}");
    lines_add(&l, "{\"op\":\"start\",\"id\":\"k5\",\"model\":\"hash\",\"prompt\":[1]}");
    expect_same(flags, &l, r);
    for (int i = 0; i < 4; i++)
        ck_assert_msg(is_ok(r[i]), "line %d: %s", i, r[i]);
    ck_assert_msg(is_error(r[4], "cache_full", "--max-sessions"), "%s", r[4]);
    ck_assert_msg(is_ok(r[5]) && is_ok(r[6]), "%s %s", r[5], r[6]);
    replies_free(r, l.n);
    lines_free(&l);
}
END_TEST

/* Uncached generates borrow room: three that each fit alone. */
START_TEST(test_generates_borrow_in_order)
{
    char *t = tokens_json(120, 512, 6);
    char *r[MAX_LINES];
    lines_t l = {0};

    for (int i = 0; i < 3; i++)
        lines_add(&l, "{\"op\":\"generate\",\"model\":\"small\",\"tokens\":%s,\"steps\":10}", t);
    expect_same(small_pool, &l, r);
    for (int i = 0; i < l.n; i++)
        ck_assert_msg(is_ok(r[i]), "line %d: %.200s", i, r[i]);
    replies_free(r, l.n);
    lines_free(&l);
    free(t);
}
END_TEST

static uint64_t next(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* 200 random lines for 5 ids from `seed`, with a pool (or a share of it)
 * small enough that some fail. */
/* The models a mix starts sessions of: `small` alone, or every preset
 * (prompts of `base`, 32 KiB an entry, kept short). */
typedef struct mix_model {
    const char *name;
    uint32_t vocab, longest;
} mix_model_t;

static const mix_model_t mix_small[] = {{"small", 512, 120}, {NULL, 0, 0}};
static const mix_model_t mix_all[] = {
    {"small", 512, 120}, {"tiny", 6, 8}, {"hash", 1000, 300}, {"base", 4096, 12}, {NULL, 0, 0}};

static void random_mix(uint64_t seed, const char *const *flags, const mix_model_t *models)
{
    uint64_t x = 0x5107D15EEDu + seed;
    char *r[MAX_LINES];
    int failed = 0, ok = 0, nmodels = 0;
    lines_t l = {0};

    while (models[nmodels].name != NULL)
        nmodels++;
    for (int i = 0; i < 200; i++) {
        unsigned id = (unsigned)(next(&x) % 5), op = (unsigned)(next(&x) % 100);
        char *t;
        if (op < 30) {
            const mix_model_t *m = &models[next(&x) % (uint64_t)nmodels];
            t = tokens_json(1 + (int)(next(&x) % m->longest), m->vocab, next(&x));
            lines_add(&l, "{\"op\":\"start\",\"id\":\"r%u\",\"model\":\"%s\",\"prompt\":%s}", id,
                      m->name, t);
            free(t);
        } else if (op < 65) {
            lines_add(&l, "{\"op\":\"step\",\"id\":\"r%u\",\"n\":%u,\"tag\":%d}", id,
                      1 + (unsigned)(next(&x) % 24), i);
        } else if (op < 82) {
            lines_add(&l, "{\"op\":\"finish\",\"id\":\"r%u\"}", id);
        } else if (op < 94) {
            t = tokens_json(1 + (int)(next(&x) % 90), 512, next(&x));
            lines_add(&l,
                      "{\"op\":\"generate\",\"model\":\"small\",\"tokens\":%s,\"steps\":%u,"
                      "\"use_cache\":%s}",
                      t, (unsigned)(next(&x) % 6), next(&x) % 2 ? "true" : "false");
            free(t);
        } else {
            lines_add(&l, "{\"op\":\"stats\"}");
        }
    }
    expect_same(flags, &l, r);
    for (int i = 0; i < l.n; i++) {
        if (is_error(r[i], "cache_full", NULL))
            failed++;
        else if (is_ok(r[i]))
            ok++;
    }
    /* The mix is only worth running if room ran out and many lines worked. */
    ck_assert_msg(failed > 0 && ok > l.n / 4, "cache_full %d, ok %d of %d", failed, ok, l.n);
    replies_free(r, l.n);
    lines_free(&l);
}

/* Every preset loaded (a `base` page is 513 KiB), in a 2 MiB pool with the
 * default share; and the cache audit on, which records a session's tokens
 * in the step's job. */
static const char *const all_models[] = {"--cache-mb", "2", "--models", "tiny,hash,small,base",
                                         NULL};
static const char *const small_audited[] = {
    "--cache-mb",   "1", "--models", "tiny,hash,small", "--max-connection-share", "1",
    "--audit-rate", "1", NULL};

/* Each case one seed; SLOTD_MIX_SEED moves them all, for a longer hunt by
 * hand (for k in $(seq 0 8 600); do SLOTD_MIX_SEED=$k ...; done).  The
 * first three let the connection use the whole pool, the next three run
 * into the connection's share of it as well. */
#define MIX_CASE(k)                                                                                \
    START_TEST(test_random_mix_##k)                                                                \
    {                                                                                              \
        const char *e = getenv("SLOTD_MIX_SEED");                                                  \
        random_mix((e != NULL ? strtoull(e, NULL, 10) : 0) + (k),                                  \
                   (k) < 3   ? small_pool                                                          \
                   : (k) < 6 ? small_pool_shared                                                   \
                   : (k) < 7 ? all_models                                                          \
                             : small_audited,                                                      \
                   (k) == 6 ? mix_all : mix_small);                                                \
    }                                                                                              \
    END_TEST
MIX_CASE(0)
MIX_CASE(1)
MIX_CASE(2)
MIX_CASE(3)
MIX_CASE(4)
MIX_CASE(5)
MIX_CASE(6)
MIX_CASE(7)

/* SLOTD_TEST_REPEATS=N: only the first N seeds of each pool set-up (all
 * when unset).  The seeds of one set-up check the same rules on other
 * lines; the ASan and TSan stages (scripts/test.sh) set 1, where each
 * further seed costs some 20 s and takes the daemon through no path
 * (threads, allocations) that the set-up's first seed does not; the
 * plain stage runs all eight.  0 if the value is not a positive number. */
static int mix_repeats(void)
{
    const char *v = getenv("SLOTD_TEST_REPEATS");
    char *end;
    long n;

    if (v == NULL)
        return 3;
    n = strtol(v, &end, 10);
    return end != v && *end == '\0' && n > 0 ? (int)(n < 3 ? n : 3) : 0;
}

int main(void)
{
    int repeats = mix_repeats();
    Suite *s;

    if (repeats == 0) {
        fprintf(stderr, "SLOTD_TEST_REPEATS must be a positive number, not \"%s\"\n",
                getenv("SLOTD_TEST_REPEATS"));
        return EXIT_FAILURE;
    }
    s = suite_create("pipeline");
    ITEST_ADD(s, test_failed_start_leaves_no_trace);
    ITEST_ADD(s, test_finish_makes_room);
    ITEST_ADD(s, test_pairs_past_session_limit);
    ITEST_ADD(s, test_context_before_share);
    ITEST_ADD(s, test_generates_borrow_in_order);
    ITEST_ADD(s, test_random_mix_0);
    if (repeats > 1)
        ITEST_ADD(s, test_random_mix_1);
    if (repeats > 2)
        ITEST_ADD(s, test_random_mix_2);
    ITEST_ADD(s, test_random_mix_3);
    if (repeats > 1)
        ITEST_ADD(s, test_random_mix_4);
    if (repeats > 2)
        ITEST_ADD(s, test_random_mix_5);
    ITEST_ADD(s, test_random_mix_6);
    ITEST_ADD(s, test_random_mix_7);
    return itest_main(s);
}
