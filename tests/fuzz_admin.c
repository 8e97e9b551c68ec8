/*
 * fuzz_admin.c: libFuzzer harness for admin_http, the admin port's HTTP
 * handling, with fixed hooks and a fixed clock.
 *
 * Each input is fed twice: whole, and cut into pieces whose sizes come from
 * the input's first byte; after ADMIN_HTTP_FULL the output is "written"
 * (kept aside) and the handler resumed, as admin.c does.  The two runs must
 * produce byte-identical output and the same final result, every response
 * must start with a status line and carry a Content-Length that matches
 * its body, and nothing may follow ADMIN_HTTP_CLOSE.
 *
 * Built with -fsanitize=fuzzer when SLOTD_FUZZ is on; otherwise the main()
 * below replays files and directories given on the command line (the seed
 * corpus, in CTest) through the same function.
 */
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "server/admin/admin_http_int.h"
#include "server/admin/metrics.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void stats(void *arg, proto_stats_t *out)
{
    (void)arg;
    memset(out, 0, sizeof(*out));
    out->cache_entries = 3;
    out->live_sessions = 1;
    out->pool_bytes_total = 4096;
    out->pool_bytes_used = 512;
    out->pool_slots_total = 4;
    out->pool_slots_used = 1;
    out->threads = 2;
}

static bool healthy(void *arg, const char **why)
{
    (void)arg;
    *why = "draining";
    return false;
}

static uint64_t fixed_clock(void)
{
    return 5000000000ull;
}

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz_admin: check failed: %s (line %d)\n", #cond, __LINE__);          \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* Checks that `out` is a sequence of whole responses, the last one saying
 * "Connection: close" if the result was ADMIN_HTTP_CLOSE. */
static void check_responses(const proto_buf_t *out, int rc, uint64_t nresp)
{
    size_t off = 0;
    uint64_t seen = 0;
    bool last_close = false;
    while (off < out->len) {
        const char *p = out->data + off;
        size_t left = out->len - off;
        CHECK(left > 13 && memcmp(p, "HTTP/1.1 ", 9) == 0);
        const char *end = NULL;
        for (size_t i = 0; i + 4 <= left; i++)
            if (memcmp(p + i, "\r\n\r\n", 4) == 0) {
                end = p + i + 4;
                break;
            }
        CHECK(end != NULL);
        size_t hlen = (size_t)(end - p);
        const char *cl = NULL;
        for (size_t i = 0; i + 16 <= hlen; i++)
            if (memcmp(p + i, "\r\nContent-Length:", 17) == 0) {
                cl = p + i + 17;
                break;
            }
        CHECK(cl != NULL);
        size_t blen = strtoul(cl, NULL, 10);
        /* A HEAD reply has a length and no body.  No body of ours starts
         * like a status line, so what follows tells them apart. */
        size_t rest = left - hlen;
        bool head_reply =
            blen > 0 && (rest == 0 || (rest >= 9 && memcmp(end, "HTTP/1.1 ", 9) == 0));
        CHECK(head_reply || rest >= blen);
        last_close = false;
        for (size_t i = 0; i + 19 <= hlen; i++)
            if (memcmp(p + i, "\r\nConnection: close", 19) == 0)
                last_close = true;
        off += hlen + (head_reply ? 0 : blen);
        seen++;
    }
    CHECK(off == out->len);
    CHECK(seen == nresp);
    if (rc == ADMIN_HTTP_CLOSE && nresp > 0)
        CHECK(last_close);
}

/* Feeds `data` in pieces of sizes from `cuts` (0: all at once), draining
 * into `all` after every FULL.  Returns the last result. */
static int run(const uint8_t *data, size_t size, uint8_t cuts, proto_buf_t *all, uint64_t *nresp)
{
    static const admin_hooks_t hooks = {.stats = stats, .healthy = healthy};
    admin_http_t *h = admin_http_new(&hooks, fixed_clock);
    proto_buf_t out;
    proto_buf_init(&out);
    int rc = ADMIN_HTTP_MORE;
    size_t off = 0;
    unsigned k = 0;
    CHECK(h != NULL);
    while (off < size || (size == 0 && k == 0)) {
        size_t n = size - off;
        if (cuts != 0) {
            size_t piece = 1 + ((cuts >> (k % 8)) & 0x1f) * ((k & 1) ? 7 : 1);
            if (piece < n)
                n = piece;
        }
        k++;
        rc = admin_http_feed(h, (const char *)data + off, n, &out);
        off += n;
        while (rc == ADMIN_HTTP_FULL) {
            CHECK(out.len >= ADMIN_HTTP_OUT_HIGH);
            proto_buf_append(all, out.data, out.len);
            out.len = 0;
            rc = admin_http_resume(h, &out);
        }
        CHECK(rc == ADMIN_HTTP_MORE || rc == ADMIN_HTTP_CLOSE);
        if (rc == ADMIN_HTTP_CLOSE) {
            /* Closed: nothing more comes out. */
            size_t before = out.len;
            CHECK(admin_http_feed(h, "GET / HTTP/1.1\r\n\r\n", 18, &out) == ADMIN_HTTP_CLOSE);
            CHECK(admin_http_resume(h, &out) == ADMIN_HTTP_CLOSE);
            CHECK(out.len == before);
            break;
        }
    }
    proto_buf_append(all, out.data, out.len);
    *nresp = admin_http_responses(h);
    proto_buf_free(&out);
    admin_http_free(h);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool inited;
    if (!inited) {
        metrics_init(1000000000ull);
        metrics_process_figures(false); /* the same bytes for both runs */
        metrics_observe_step(0, 12345, 2000000000ull, 0);
        inited = true;
    }
    proto_buf_t whole, split;
    uint64_t nwhole, nsplit;
    proto_buf_init(&whole);
    proto_buf_init(&split);
    int a = run(data, size, 0, &whole, &nwhole);
    int b = run(data, size, size > 0 ? (uint8_t)(data[0] | 1) : 1, &split, &nsplit);
    CHECK(a == b);
    CHECK(nwhole == nsplit);
    CHECK(whole.len == split.len);
    CHECK(whole.len == 0 || memcmp(whole.data, split.data, whole.len) == 0);
    check_responses(&whole, a, nwhole);
    proto_buf_free(&whole);
    proto_buf_free(&split);
    return 0;
}

#ifndef SLOTD_LIBFUZZER

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        return 1;
    }
    size_t cap = 4096, len = 0;
    uint8_t *buf = malloc(cap);
    size_t n;
    while (buf != NULL && (n = fread(buf + len, 1, cap - len, f)) > 0) {
        len += n;
        if (len == cap) {
            uint8_t *nb = realloc(buf, cap * 2);
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
    if (buf == NULL) {
        fprintf(stderr, "%s: out of memory\n", path);
        return 1;
    }
    LLVMFuzzerTestOneInput(buf, len);
    free(buf);
    return 0;
}

static int replay(const char *path, int *count)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        perror(path);
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
        (*count)++;
        return replay_file(path);
    }
    struct dirent **names;
    int n = scandir(path, &names, NULL, alphasort);
    if (n < 0) {
        perror(path);
        return 1;
    }
    int bad = 0;
    for (int i = 0; i < n; i++) {
        if (names[i]->d_name[0] != '.') {
            char sub[4096];
            snprintf(sub, sizeof(sub), "%s/%s", path, names[i]->d_name);
            bad |= replay(sub, count);
        }
        free(names[i]);
    }
    free(names);
    return bad;
}

int main(int argc, char **argv)
{
    int count = 0, bad = 0;
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
        return 2;
    }
    for (int i = 1; i < argc; i++)
        bad |= replay(argv[i], &count);
    printf("fuzz_admin: replayed %d inputs\n", count);
    if (count == 0) {
        fprintf(stderr, "fuzz_admin: no inputs found\n");
        return 1;
    }
    return bad;
}

#endif
