/*
 * engine_daemon.c: the stage engine over a running daemon under
 * `--on-full evict`, so that the seed stages run against evictions.
 *
 * open() starts slotd (tests/itest.c: free loopback ports, stopped and
 * checked to exit 0 by itest_teardown()) with a 1 MiB pool and
 * --prefix-cache off.  The stage's connection also holds the ballast (one
 * connection, so that eviction takes the least recently used of all,
 * docs/protocol.md): idle `small` sessions of BALLAST_TOKENS (400 KiB
 * each), two of which fit.  Before each of the stage's first
 * TOPUP_STARTS starts the ballast starts sessions until the daemon has
 * evicted three (least recently used first: the older ballast, then any
 * idle session of the stage's, which its next step must rebuild), then
 * finishes its evicted ones.  The
 * stage's counters are the daemon's (`stats`) less the ballast's: what its
 * live sessions hold in the pool (GET /sessions) and the model work of its
 * starts (measured around each, while the stage's connection is idle).
 * close() fails the test unless the daemon evicted during the stage, so
 * that a run cannot pass without eviction.
 *
 * Used by one thread of one test process (the forked Check test), no
 * lock; close() releases what open() took, the daemon is
 * itest_teardown()'s.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "itest.h"
#include "stage_engine.h"

/* A ballast session: `small`, 4 KiB an entry. */
#define BALLAST_TOKENS 100
/* Evictions one top-up makes: one more than the ballast sessions the pool
 * holds, so that an idle session of the stage's older than the top-up is
 * evicted too. */
#define TOPUP_EVICTIONS 3
/* The stage's starts that a top-up precedes: all but stage 4's 200 (whose
 * long-lived session is evicted within its first few). */
#define TOPUP_STARTS 10
/* Starts one top-up may take. */
#define BALLAST_MAX 12

typedef struct daemon_engine {
    itest_daemon_t *d;
    itest_conn_t *c;      /* the stage's requests and the ballast's */
    int nballast;         /* ballast sessions started: the next id */
    int nstarts;          /* starts of the stage's so far */
    int64_t ballast_g;    /* g calls of the ballast's starts */
    int64_t ballast_rows; /* attention rows of the ballast's starts */
    int64_t evictions0;   /* evictions_total once the pool was full */
    int64_t rebuilt0;     /* rebuilt_entries_total then */
    char model[16];       /* the preset every start names */
} daemon_engine_t;

/* The slotd code of wire code `wire`, or SLOTD_EINVAL. */
static int code_of(const char *wire)
{
    for (int c = -1; c >= -(int)SLOTD__ERR_COUNT; c--) {
        if (strcmp(slotd_err_name(c), wire) == 0) {
            return c;
        }
    }
    return SLOTD_EINVAL;
}

/* 0 for a reply that is no error; otherwise its code, `err` filled. */
static int reply_rc(const cJSON *reply, slotd_error_t *err)
{
    const char *code = itest_error_code(reply);
    const cJSON *e;

    if (code == NULL) {
        return SLOTD_OK;
    }
    e = cJSON_GetObjectItemCaseSensitive(reply, "error");
    return slotd_error_set(err, code_of(code), "%s",
                           cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "message")));
}

/* Parses GET /sessions (owned by the caller). */
static cJSON *sessions_get(const daemon_engine_t *e)
{
    itest_http_t h;
    cJSON *body;

    itest_http_get(e->d, "/sessions?limit=1000", &h);
    ck_assert_msg(h.status == 200, "setup: GET /sessions: %d", h.status);
    body = cJSON_Parse(h.body);
    ck_assert_msg(body != NULL && itest_int(body, "total") <= 1000, "setup: GET /sessions: %s",
                  h.body);
    itest_http_free(&h);
    return body;
}

static bool is_ballast(const cJSON *s)
{
    return strncmp(itest_str(s, "id"), "ballast", 7) == 0;
}

/* One more ballast session; its model work is counted as the ballast's. */
static void ballast_start(daemon_engine_t *e)
{
    char prompt[BALLAST_TOKENS * 8];
    size_t len = 0;
    int64_t g = itest_stat(e->c, "g_calls"), rows = itest_stat(e->c, "rows");
    int id = e->nballast++;
    cJSON *r;

    for (int k = 0; k < BALLAST_TOKENS; k++) {
        len += (size_t)snprintf(prompt + len, sizeof(prompt) - len, "%s%d", k ? "," : "",
                                (id * 7919 + k * 31) % 512);
    }
    r = itest_rpc(e->c,
                  "{\"op\":\"start\",\"id\":\"ballast%d\",\"model\":\"small\",\"prompt\":[%s]}", id,
                  prompt);
    itest_expect_ok(r);
    cJSON_Delete(r);
    e->ballast_g += itest_stat(e->c, "g_calls") - g;
    e->ballast_rows += itest_stat(e->c, "rows") - rows;
}

/* Ballast until the daemon has evicted TOPUP_EVICTIONS sessions to make
 * room, then the evicted ballast sessions finished (they hold nothing in
 * the pool). */
static void top_up(daemon_engine_t *e)
{
    int64_t ev = itest_stat(e->c, "evictions_total");
    cJSON *body, *s;

    for (int i = 0; itest_stat(e->c, "evictions_total") < ev + TOPUP_EVICTIONS; i++) {
        ck_assert_msg(i < BALLAST_MAX, "setup: %d ballast sessions and too few evictions", i);
        ballast_start(e);
    }
    body = sessions_get(e);
    cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(body, "sessions"))
    {
        if (is_ballast(s) && strcmp(itest_str(s, "state"), "evicted") == 0) {
            cJSON *r = itest_rpc(e->c, "{\"op\":\"finish\",\"id\":\"%s\"}", itest_str(s, "id"));
            itest_expect_ok(r);
            cJSON_Delete(r);
        }
    }
    cJSON_Delete(body);
}

static int daemon_open(const char *preset, const stage_limits_t *lim, void **self)
{
    daemon_engine_t *e = calloc(1, sizeof(*e));

    (void)lim;
    if (e == NULL) {
        return SLOTD_ENOMEM;
    }
    snprintf(e->model, sizeof(e->model), "%s", preset);
    e->d = itest_daemon_start("--cache-mb", "1", "--models", "hash,tiny,small", "--preload",
                              "hash,tiny,small", "--max-connection-share", "1", "--on-full",
                              "evict", "--prefix-cache", "off", "--threads", "2", NULL);
    e->c = itest_connect(e->d);
    top_up(e);
    e->evictions0 = itest_stat(e->c, "evictions_total");
    e->rebuilt0 = itest_stat(e->c, "rebuilt_entries_total");
    *self = e;
    return SLOTD_OK;
}

static void daemon_close(void *self)
{
    daemon_engine_t *e = self;
    int64_t ev = itest_stat(e->c, "evictions_total") - e->evictions0;
    int64_t rebuilt = itest_stat(e->c, "rebuilt_entries_total") - e->rebuilt0;

    printf("%s: %" PRId64 " evictions, %" PRId64 " entries rebuilt\n", e->model, ev, rebuilt);
    itest_close(e->c);
    free(e);
    ck_assert_msg(ev > 0, "[evict] no eviction during the stage: it proved nothing about them");
}

static int daemon_start(void *self, const char *id, const int64_t *prompt, size_t n,
                        slotd_error_t *err)
{
    daemon_engine_t *e = self;
    size_t cap = n * 24 + 1, len = 0;
    char *text = malloc(cap);
    cJSON *r;
    int rc;

    ck_assert_ptr_nonnull(text);
    text[0] = '\0';
    if (e->nstarts++ < TOPUP_STARTS)
        top_up(e);
    for (size_t i = 0; i < n; i++) {
        len += (size_t)snprintf(text + len, cap - len, "%s%" PRId64, i ? "," : "", prompt[i]);
    }
    r = itest_rpc(e->c, "{\"op\":\"start\",\"id\":\"%s\",\"model\":\"%s\",\"prompt\":[%s]}", id,
                  e->model, text);
    free(text);
    rc = reply_rc(r, err);
    cJSON_Delete(r);
    return rc;
}

static int daemon_step(void *self, const char *id, uint32_t *token, double *logits,
                       slotd_error_t *err)
{
    daemon_engine_t *e = self;
    cJSON *r = itest_rpc(e->c, "{\"op\":\"step\",\"id\":\"%s\"}", id);
    int rc = reply_rc(r, err);

    if (rc == SLOTD_OK) {
        const cJSON *toks = cJSON_GetObjectItemCaseSensitive(r, "tokens");
        const cJSON *lg = cJSON_GetObjectItemCaseSensitive(r, "logits");
        const cJSON *v;
        size_t i = 0;

        ck_assert_msg(cJSON_GetArraySize(toks) == 1, "step reply: %s", itest_last_line(e->c));
        *token = (uint32_t)cJSON_GetArrayItem(toks, 0)->valuedouble;
        if (logits != NULL && lg != NULL) {
            cJSON_ArrayForEach(v, cJSON_GetArrayItem(lg, 0))
            {
                logits[i++] = v->valuedouble;
            }
        }
    }
    cJSON_Delete(r);
    return rc;
}

static int daemon_finish(void *self, const char *id, uint32_t *released, slotd_error_t *err)
{
    daemon_engine_t *e = self;
    cJSON *r = itest_rpc(e->c, "{\"op\":\"finish\",\"id\":\"%s\"}", id);
    int rc = reply_rc(r, err);

    if (rc == SLOTD_OK && released != NULL) {
        *released = (uint32_t)itest_int(r, "released");
    }
    cJSON_Delete(r);
    return rc;
}

/* Member `name` summed over the ballast's sessions in the pool (not
 * evicted: an evicted session counts 0, docs/protocol.md). */
static int64_t ballast_sum(const daemon_engine_t *e, const char *name)
{
    cJSON *body = sessions_get(e), *s;
    int64_t sum = 0;

    cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(body, "sessions"))
    {
        if (is_ballast(s) && strcmp(itest_str(s, "state"), "evicted") != 0) {
            sum += itest_int(s, name);
        }
    }
    cJSON_Delete(body);
    return sum;
}

/* stats' cache_entries less the ballast's. */
static uint64_t daemon_cache_entries(void *self)
{
    daemon_engine_t *e = self;

    return (uint64_t)(itest_stat(e->c, "cache_entries") - ballast_sum(e, "entries"));
}

static uint64_t daemon_bytes_used(void *self)
{
    daemon_engine_t *e = self;

    return (uint64_t)(itest_stat(e->c, "pool_bytes_used") - ballast_sum(e, "pool_bytes"));
}

static bool daemon_evicted(void *self, const char *id)
{
    daemon_engine_t *e = self;
    cJSON *body = sessions_get(e), *s;
    bool evicted = false;

    cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(body, "sessions"))
    {
        if (strcmp(itest_str(s, "id"), id) == 0) {
            evicted = strcmp(itest_str(s, "state"), "evicted") == 0;
        }
    }
    cJSON_Delete(body);
    return evicted;
}

static uint64_t daemon_g_calls(void *self)
{
    daemon_engine_t *e = self;
    return (uint64_t)(itest_stat(e->c, "g_calls") - e->ballast_g);
}

static uint64_t daemon_rows(void *self)
{
    daemon_engine_t *e = self;
    return (uint64_t)(itest_stat(e->c, "rows") - e->ballast_rows);
}

const stage_engine_ops_t stage_engine_daemon = {
    .name = "daemon",
    .open = daemon_open,
    .close = daemon_close,
    .start = daemon_start,
    .step = daemon_step,
    .finish = daemon_finish,
    .cache_entries = daemon_cache_entries,
    .bytes_used = daemon_bytes_used,
    .g_calls = daemon_g_calls,
    .rows = daemon_rows,
    .evicted = daemon_evicted,
};
