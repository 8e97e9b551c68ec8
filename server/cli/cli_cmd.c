/*
 * cli_cmd.c: slotd-cli's command table.  One row per command gives its
 * name, its arguments, one line of help and the function that turns the
 * typed words into a request: a JSON line for the session port, a path on
 * the admin port, or something done here (help, quit).  Adding a command
 * is adding a row; `help`, Tab completion and the check of the first
 * argument all read the table.
 *
 * A line that starts with "{" is sent as it is, for the daemon to judge;
 * any other line whose first word is not a command is refused here
 * ("unknown command; type help") and never reaches the daemon.
 *
 * Words are split at blanks and commas ("start a 1,2,3").  Integers are
 * checked here and written back as the integer they denote, so "007" goes
 * out as 7 and a word that is not an integer never leaves the client.  A
 * command given too few or too many words is refused here, with a message
 * that names what is missing or the first word too many, and its usage:
 * an extra word is never dropped in silence ("health stats" is not
 * health).
 * Single-threaded; no state beyond the constant table.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli_int.h"
#include "core/model.h"

typedef struct cmd_args {
    char **w; /* the words after the command name */
    int n;
    const cli_out_t *o;
} cmd_args_t;

typedef struct cli_cmd {
    const char *name;
    const char *args;
    const char *summary;
    /* Fills req (json, path, pattern) and returns its kind, or prints why
     * not and returns CLI_LOCAL_ERR. */
    cli_kind_t (*build)(const struct cli_cmd *cmd, cmd_args_t *a, cli_req_t *req);
} cli_cmd_t;

static cli_kind_t build_start(const cli_cmd_t *, cmd_args_t *, cli_req_t *);
static cli_kind_t build_step(const cli_cmd_t *, cmd_args_t *, cli_req_t *);
static cli_kind_t build_finish(const cli_cmd_t *, cmd_args_t *, cli_req_t *);
static cli_kind_t build_append(const cli_cmd_t *, cmd_args_t *, cli_req_t *);
static cli_kind_t build_fork(const cli_cmd_t *, cmd_args_t *, cli_req_t *);
static cli_kind_t build_logits(const cli_cmd_t *, cmd_args_t *, cli_req_t *);
static cli_kind_t build_generate(const cli_cmd_t *, cmd_args_t *, cli_req_t *);
static cli_kind_t build_stats(const cli_cmd_t *, cmd_args_t *, cli_req_t *);
static cli_kind_t build_health(const cli_cmd_t *, cmd_args_t *, cli_req_t *);
static cli_kind_t build_metrics(const cli_cmd_t *, cmd_args_t *, cli_req_t *);
static cli_kind_t build_auth(const cli_cmd_t *, cmd_args_t *, cli_req_t *);
static cli_kind_t build_help(const cli_cmd_t *, cmd_args_t *, cli_req_t *);
static cli_kind_t build_quit(const cli_cmd_t *, cmd_args_t *, cli_req_t *);

static const cli_cmd_t cmds[] = {
    {"start", "ID [-m MODEL] TOKEN...", "start session ID with the prompt TOKEN...", build_start},
    {"step", "ID [N] [DECODE...]", "N steps of session ID (default 1), greedy unless DECODE says",
     build_step},
    {"finish", "ID", "release session ID", build_finish},
    {"append", "ID TOKEN...", "run TOKEN... into session ID after its entries", build_append},
    {"fork", "ID FROM", "start session ID holding session FROM's sequence", build_fork},
    {"logits", "[-m MODEL] TOKEN...", "the scores of the token after TOKEN...", build_logits},
    {"generate", "[-m MODEL] [--cache] [DECODE...] STEPS TOKEN...",
     "STEPS tokens after TOKEN..., no session; DECODE as for step", build_generate},
    {"stats", "", "the daemon's figures", build_stats},
    {"health", "", "admin /health", build_health},
    {"metrics", "[PATTERN]", "admin /metrics, the lines holding PATTERN", build_metrics},
    {"auth", "TOKEN", "present TOKEN; both ports use it once accepted", build_auth},
    {"help", "[COMMAND]", "this list, or one command's usage", build_help},
    {"quit", "", "leave (also: exit, end of input)", build_quit},
    {"exit", "", "leave", build_quit},
};
#define NCMDS (sizeof(cmds) / sizeof(cmds[0]))

static const cli_cmd_t *find(const char *name)
{
    for (size_t i = 0; i < NCMDS; i++)
        if (strcasecmp(name, cmds[i].name) == 0)
            return &cmds[i];
    return NULL;
}

bool cli_cmd_is_name(const char *word)
{
    return find(word) != NULL;
}

const char *cli_cmd_name(size_t i)
{
    return i < NCMDS ? cmds[i].name : NULL;
}

/* "  name args   summary", the summary on a line of its own when the
 * usage is too wide for its column. */
static void print_usage(FILE *f, const cli_cmd_t *c)
{
    char head[64];
    snprintf(head, sizeof(head), "%s%s%s", c->name, c->args[0] ? " " : "", c->args);
    if (strlen(head) > 30)
        fprintf(f, "  %s\n  %-30s %s\n", head, "", c->summary);
    else
        fprintf(f, "  %-30s %s\n", head, c->summary);
}

void cli_cmd_help_all(FILE *f)
{
    fprintf(f, "Commands (a line starting with '{' is sent as a JSON request):\n");
    for (size_t i = 0; i < NCMDS; i++)
        if (strcmp(cmds[i].name, "exit") != 0)
            print_usage(f, &cmds[i]);
    /* The presets as core/model.h lists them: the daemon's names. */
    fprintf(f, "MODEL: ");
    for (size_t i = 0; model_preset_name(i) != NULL; i++)
        fprintf(f, "%s%s", i > 0 ? ", " : "", model_preset_name(i));
    fprintf(f, "\n"
               "Tokens are integers, separated by blanks or commas.\n"
               "DECODE: --temp T --top-k K --top-p P --seed S (sampling), --stop TOKEN (each\n"
               "  token its own --stop), --scores all|none|K (K: the K best [token, score])\n"
               "Example: start a -m small 1 2 3, then step a 4, then finish a\n");
}

void cli_req_clear(cli_req_t *req)
{
    /* An auth request holds a token: wiped before it is freed. */
    if (req->json != NULL)
        explicit_bzero(req->json, strlen(req->json));
    if (req->token != NULL)
        explicit_bzero(req->token, strlen(req->token));
    free(req->json);
    free(req->pattern);
    free(req->token);
    *req = (cli_req_t){.kind = CLI_NONE};
}

/* ---- Building requests ---- */

/* "step: missing ID; usage: step ID [N]". */
static cli_kind_t missing(const cli_cmd_t *c, const cmd_args_t *a, const char *what)
{
    cli_out_error(a->o, "%s: missing %s; usage: %s %s", c->name, what, c->name, c->args);
    return CLI_LOCAL_ERR;
}

/* The words from a->w[from] on are more than the command takes: names the
 * first of them.  "health: takes no arguments, got 'stats'" (with a hint
 * when that word is a command of its own), or "step: one argument too
 * many, '2'; usage: step ID [N]". */
static cli_kind_t too_many(const cli_cmd_t *c, const cmd_args_t *a, int from)
{
    const char *word = a->w[from];
    if (c->args[0] == '\0')
        cli_out_error(a->o, "%s: takes no arguments, got '%s'%s", c->name, word,
                      find(word) != NULL ? " (two commands? give each its own line)" : "");
    else if (a->n - from == 1)
        cli_out_error(a->o, "%s: one argument too many, '%s'; usage: %s %s", c->name, word, c->name,
                      c->args);
    else
        cli_out_error(a->o, "%s: %d arguments too many, from '%s'; usage: %s %s", c->name,
                      a->n - from, word, c->name, c->args);
    return CLI_LOCAL_ERR;
}

/* Adds `word` to `to` (an array, or an object under `key`) as the JSON
 * integer it denotes.  Prints why not and returns false if it is not one. */
static bool add_int(const cmd_args_t *a, const char *cmd, const char *what, cJSON *to,
                    const char *key, const char *word)
{
    char *end;
    errno = 0;
    long long v = strtoll(word, &end, 10);
    if (errno != 0 || end == word || *end != '\0') {
        cli_out_error(a->o, "%s: %s '%s' is not an integer", cmd, what, word);
        return false;
    }
    char text[32];
    snprintf(text, sizeof(text), "%lld", v);
    cJSON *num = cJSON_CreateRaw(text);
    if (num == NULL)
        return false;
    if (key != NULL)
        cJSON_AddItemToObject(to, key, num);
    else
        cJSON_AddItemToArray(to, num);
    return true;
}

/* Takes "-m MODEL" (also --model) and, if `cache` is non-NULL, "--cache"
 * from the front of the words, in any order.  A word of "-" and a digit is
 * a (negative) token, for the daemon to refuse.  Prints why and returns
 * false on a bad option. */
static bool take_options(const cli_cmd_t *c, cmd_args_t *a, const char **model, bool *cache)
{
    while (a->n > 0 && a->w[0][0] == '-' && a->w[0][1] != '\0' &&
           (a->w[0][1] < '0' || a->w[0][1] > '9')) {
        if (strcmp(a->w[0], "-m") == 0 || strcmp(a->w[0], "--model") == 0) {
            if (a->n < 2) {
                missing(c, a, "MODEL after -m");
                return false;
            }
            *model = a->w[1];
            a->w += 2;
            a->n -= 2;
        } else if (cache != NULL && strcmp(a->w[0], "--cache") == 0) {
            *cache = true;
            a->w++;
            a->n--;
        } else {
            cli_out_error(a->o, "%s: unknown option '%s'", c->name, a->w[0]);
            return false;
        }
    }
    return true;
}

/* Whether `word` is a JSON number literal (sent as it is, for the daemon
 * to judge its value). */
static bool json_number(const char *word)
{
    char *end;

    if (word[0] == '\0' || word[0] == '+' || word[0] == '.' ||
        strspn(word, "0123456789.eE+-") != strlen(word))
        return false;
    (void)strtod(word, &end);
    return *end == '\0';
}

/* Adds `word` under `key` of `to` as the JSON number it spells. */
static bool add_number(const cmd_args_t *a, const char *cmd, cJSON *to, const char *key,
                       const char *word)
{
    cJSON *num;

    if (!json_number(word)) {
        cli_out_error(a->o, "%s: %s '%s' is not a number", cmd, key, word);
        return false;
    }
    if ((num = cJSON_CreateRaw(word)) == NULL)
        return false;
    cJSON_AddItemToObject(to, key, num);
    return true;
}

/* One decoding option, taken from the front of the words into `o`:
 * --temp T, --top-k K, --top-p P, --seed S (together the "sample" object),
 * --stop T (repeated for more tokens: words are split at commas too) and
 * --scores all|none|K.  Returns 1 if it took one, 0 if the front word is
 * none of them, -1 after printing why a value is bad. */
static int take_decode(const cli_cmd_t *c, cmd_args_t *a, cJSON *o)
{
    static const char *const sample_opts[][2] = {
        {"--temp", "temperature"}, {"--top-k", "top_k"}, {"--top-p", "top_p"}, {"--seed", "seed"}};
    const char *opt = a->n > 0 ? a->w[0] : "";
    cJSON *to;

    if (a->n < 2)
        return 0;
    for (size_t k = 0; k < sizeof(sample_opts) / sizeof(sample_opts[0]); k++) {
        if (strcmp(opt, sample_opts[k][0]) != 0)
            continue;
        to = cJSON_GetObjectItemCaseSensitive(o, "sample");
        if (to == NULL && (to = cJSON_AddObjectToObject(o, "sample")) == NULL)
            return -1;
        cJSON_DeleteItemFromObjectCaseSensitive(to, sample_opts[k][1]);
        if (!add_number(a, c->name, to, sample_opts[k][1], a->w[1]))
            return -1;
        a->w += 2;
        a->n -= 2;
        return 1;
    }
    if (strcmp(opt, "--stop") == 0) {
        to = cJSON_GetObjectItemCaseSensitive(o, "stop");
        if (to == NULL && (to = cJSON_AddArrayToObject(o, "stop")) == NULL)
            return -1;
        if (!add_int(a, c->name, "stop token", to, NULL, a->w[1]))
            return -1;
    } else if (strcmp(opt, "--scores") == 0) {
        cJSON_DeleteItemFromObjectCaseSensitive(o, "scores");
        if (strcmp(a->w[1], "all") == 0 || strcmp(a->w[1], "none") == 0) {
            if (cJSON_AddStringToObject(o, "scores", a->w[1]) == NULL)
                return -1;
        } else if (!add_int(a, c->name, "scores", o, "scores", a->w[1])) {
            return -1;
        }
    } else {
        return 0;
    }
    a->w += 2;
    a->n -= 2;
    return 1;
}

/* Appends the remaining words to obj[key] as integers. */
static bool add_tokens(const cli_cmd_t *c, cmd_args_t *a, cJSON *obj, const char *key)
{
    cJSON *arr = cJSON_AddArrayToObject(obj, key);
    if (arr == NULL)
        return false;
    for (int i = 0; i < a->n; i++)
        if (!add_int(a, c->name, "token", arr, NULL, a->w[i]))
            return false;
    return true;
}

/* The request text of `o` into req->json; `o` stays the caller's. */
static cli_kind_t finish_json_keep(const cJSON *o, cli_req_t *req, const cmd_args_t *a)
{
    req->json = cJSON_PrintUnformatted(o);
    if (req->json == NULL) {
        cli_out_error(a->o, "out of memory");
        return CLI_LOCAL_ERR;
    }
    return CLI_SEND;
}

/* Ends a build: the request text into req->json, and `o` freed. */
static cli_kind_t finish_json(cJSON *o, cli_req_t *req, const cmd_args_t *a)
{
    cli_kind_t k = finish_json_keep(o, req, a);
    cJSON_Delete(o);
    return k;
}

static cJSON *new_request(const char *op)
{
    cJSON *o = cJSON_CreateObject();
    if (o != NULL && cJSON_AddStringToObject(o, "op", op) == NULL) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static cli_kind_t build_start(const cli_cmd_t *c, cmd_args_t *a, cli_req_t *req)
{
    const char *model = NULL;
    /* -m may come before or after the id. */
    if (!take_options(c, a, &model, NULL))
        return CLI_LOCAL_ERR;
    if (a->n < 1)
        return missing(c, a, "ID");
    const char *id = a->w[0];
    a->w++;
    a->n--;
    if (!take_options(c, a, &model, NULL))
        return CLI_LOCAL_ERR;
    cJSON *o = new_request("start");
    if (o == NULL || cJSON_AddStringToObject(o, "id", id) == NULL ||
        (model != NULL && cJSON_AddStringToObject(o, "model", model) == NULL) ||
        !add_tokens(c, a, o, "prompt")) {
        cJSON_Delete(o);
        return CLI_LOCAL_ERR;
    }
    return finish_json(o, req, a);
}

static cli_kind_t build_step(const cli_cmd_t *c, cmd_args_t *a, cli_req_t *req)
{
    const char *pos[2] = {NULL, NULL}; /* ID and N; the options anywhere around them */
    int npos = 0, rc;
    cJSON *o = new_request("step");

    if (o == NULL)
        return CLI_LOCAL_ERR;
    while (a->n > 0) {
        if ((rc = take_decode(c, a, o)) < 0) {
            cJSON_Delete(o);
            return CLI_LOCAL_ERR;
        }
        if (rc > 0)
            continue;
        if (npos == 2) {
            cJSON_Delete(o);
            return too_many(c, a, 0);
        }
        pos[npos++] = a->w[0];
        a->w++;
        a->n--;
    }
    if (npos == 0) {
        cJSON_Delete(o);
        return missing(c, a, "ID");
    }
    if (cJSON_AddStringToObject(o, "id", pos[0]) == NULL ||
        (pos[1] != NULL && !add_int(a, c->name, "N", o, "n", pos[1]))) {
        cJSON_Delete(o);
        return CLI_LOCAL_ERR;
    }
    return finish_json(o, req, a);
}

static cli_kind_t build_finish(const cli_cmd_t *c, cmd_args_t *a, cli_req_t *req)
{
    if (a->n < 1)
        return missing(c, a, "ID");
    if (a->n > 1)
        return too_many(c, a, 1);
    cJSON *o = new_request("finish");
    if (o == NULL || cJSON_AddStringToObject(o, "id", a->w[0]) == NULL) {
        cJSON_Delete(o);
        return CLI_LOCAL_ERR;
    }
    return finish_json(o, req, a);
}

static cli_kind_t build_append(const cli_cmd_t *c, cmd_args_t *a, cli_req_t *req)
{
    if (a->n < 1)
        return missing(c, a, "ID");
    if (a->n < 2)
        return missing(c, a, "TOKEN");
    const char *id = a->w[0];
    a->w++;
    a->n--;
    cJSON *o = new_request("append");
    if (o == NULL || cJSON_AddStringToObject(o, "id", id) == NULL ||
        !add_tokens(c, a, o, "tokens")) {
        cJSON_Delete(o);
        return CLI_LOCAL_ERR;
    }
    return finish_json(o, req, a);
}

static cli_kind_t build_fork(const cli_cmd_t *c, cmd_args_t *a, cli_req_t *req)
{
    if (a->n < 1)
        return missing(c, a, "ID");
    if (a->n < 2)
        return missing(c, a, "FROM");
    if (a->n > 2)
        return too_many(c, a, 2);
    cJSON *o = new_request("fork");
    if (o == NULL || cJSON_AddStringToObject(o, "id", a->w[0]) == NULL ||
        cJSON_AddStringToObject(o, "from", a->w[1]) == NULL) {
        cJSON_Delete(o);
        return CLI_LOCAL_ERR;
    }
    return finish_json(o, req, a);
}

static cli_kind_t build_logits(const cli_cmd_t *c, cmd_args_t *a, cli_req_t *req)
{
    const char *model = NULL;
    if (!take_options(c, a, &model, NULL))
        return CLI_LOCAL_ERR;
    cJSON *o = new_request("logits");
    if (o == NULL || (model != NULL && cJSON_AddStringToObject(o, "model", model) == NULL) ||
        !add_tokens(c, a, o, "tokens")) {
        cJSON_Delete(o);
        return CLI_LOCAL_ERR;
    }
    return finish_json(o, req, a);
}

static cli_kind_t build_generate(const cli_cmd_t *c, cmd_args_t *a, cli_req_t *req)
{
    const char *model = NULL;
    bool cache = false;
    int rc = 0;
    cJSON *o = new_request("generate");
    if (o == NULL)
        return CLI_LOCAL_ERR;
    /* The decoding options mixed with -m and --cache, in any order. */
    do {
        if ((rc = take_decode(c, a, o)) < 0) {
            cJSON_Delete(o);
            return CLI_LOCAL_ERR;
        }
        if (rc == 0 && a->n > 0 &&
            (strcmp(a->w[0], "-m") == 0 || strcmp(a->w[0], "--model") == 0 ||
             strcmp(a->w[0], "--cache") == 0)) {
            cmd_args_t one = {.w = a->w, .n = strcmp(a->w[0], "--cache") == 0 ? 1 : 2, .o = a->o};
            if (one.n > a->n || !take_options(c, &one, &model, &cache)) {
                cJSON_Delete(o);
                return one.n > a->n ? missing(c, a, "MODEL after -m") : CLI_LOCAL_ERR;
            }
            a->n -= (int)(one.w - a->w);
            a->w = one.w;
            rc = 1;
        }
    } while (rc > 0);
    if (!take_options(c, a, &model, &cache)) {
        cJSON_Delete(o);
        return CLI_LOCAL_ERR;
    }
    if (a->n < 1) {
        cJSON_Delete(o);
        return missing(c, a, "STEPS");
    }
    if ((model != NULL && cJSON_AddStringToObject(o, "model", model) == NULL) ||
        !add_int(a, c->name, "STEPS", o, "steps", a->w[0]) ||
        (cache && cJSON_AddTrueToObject(o, "use_cache") == NULL)) {
        cJSON_Delete(o);
        return CLI_LOCAL_ERR;
    }
    a->w++;
    a->n--;
    if (!add_tokens(c, a, o, "tokens")) {
        cJSON_Delete(o);
        return CLI_LOCAL_ERR;
    }
    return finish_json(o, req, a);
}

static cli_kind_t build_stats(const cli_cmd_t *c, cmd_args_t *a, cli_req_t *req)
{
    if (a->n != 0)
        return too_many(c, a, 0);
    cJSON *o = new_request("stats");
    if (o == NULL)
        return CLI_LOCAL_ERR;
    return finish_json(o, req, a);
}

static cli_kind_t build_health(const cli_cmd_t *c, cmd_args_t *a, cli_req_t *req)
{
    if (a->n != 0)
        return too_many(c, a, 0);
    req->path = "/health";
    return CLI_HTTP;
}

static cli_kind_t build_metrics(const cli_cmd_t *c, cmd_args_t *a, cli_req_t *req)
{
    if (a->n > 1)
        return too_many(c, a, 1);
    req->path = "/metrics";
    if (a->n == 1 && (req->pattern = strdup(a->w[0])) == NULL) {
        cli_out_error(a->o, "out of memory");
        return CLI_LOCAL_ERR;
    }
    return CLI_HTTP;
}

/* The token is never echoed: the usage errors do not name a word.  The
 * token rides along in req->token, for cli.c to keep once the daemon
 * accepts it. */
static cli_kind_t build_auth(const cli_cmd_t *c, cmd_args_t *a, cli_req_t *req)
{
    if (a->n < 1)
        return missing(c, a, "TOKEN");
    if (a->n > 1) {
        cli_out_error(a->o, "auth: takes one TOKEN, got %d words; usage: auth TOKEN", a->n);
        return CLI_LOCAL_ERR;
    }
    cJSON *o = new_request("auth");
    if (o == NULL || cJSON_AddStringToObject(o, "token", a->w[0]) == NULL ||
        (req->token = strdup(a->w[0])) == NULL) {
        if (o != NULL) {
            cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "token");
            if (cJSON_IsString(t))
                explicit_bzero(t->valuestring, strlen(t->valuestring));
        }
        cJSON_Delete(o);
        cli_out_error(a->o, "out of memory");
        return CLI_LOCAL_ERR;
    }
    /* cJSON keeps its copy of the token in the item: wiped too. */
    cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "token");
    cli_kind_t k = finish_json_keep(o, req, a);
    explicit_bzero(t->valuestring, strlen(t->valuestring));
    cJSON_Delete(o);
    return k;
}

static cli_kind_t build_help(const cli_cmd_t *c, cmd_args_t *a, cli_req_t *req)
{
    (void)req;
    if (a->n > 1)
        return too_many(c, a, 1);
    if (a->n == 0) {
        cli_cmd_help_all(stdout);
        return CLI_LOCAL;
    }
    const cli_cmd_t *which = find(a->w[0]);
    if (which == NULL) {
        cli_out_error(a->o, "unknown command '%s'; type help", a->w[0]);
        return CLI_LOCAL_ERR;
    }
    print_usage(stdout, which);
    return CLI_LOCAL;
}

static cli_kind_t build_quit(const cli_cmd_t *c, cmd_args_t *a, cli_req_t *req)
{
    (void)req;
    return a->n == 0 ? CLI_QUIT : too_many(c, a, 0);
}

/* ---- Lines ---- */

bool cli_cmd_is_secret(const char *line)
{
    const char *p = line + strspn(line, " \t\r");
    if (*p == '{')
        return strstr(p, "\"token\"") != NULL;
    size_t n = strcspn(p, " \t\r,");
    return n == 4 && strncasecmp(p, "auth", 4) == 0;
}

cli_kind_t cli_cmd_parse(const char *line, cli_req_t *req, const cli_out_t *o)
{
    cli_req_clear(req);
    const char *p = line + strspn(line, " \t\r");
    if (*p == '\0')
        return req->kind = CLI_NONE;
    if (*p == '{') {
        req->json = strdup(line);
        if (req->json == NULL) {
            cli_out_error(o, "out of memory");
            return req->kind = CLI_LOCAL_ERR;
        }
        return req->kind = CLI_SEND;
    }
    /* At most one word per two bytes of the line, plus one. */
    size_t max = strlen(p) / 2 + 2;
    char *copy = strdup(p);
    char **w = calloc(max, sizeof(*w));
    if (copy == NULL || w == NULL) {
        free(w);
        free(copy);
        cli_out_error(o, "out of memory");
        return req->kind = CLI_LOCAL_ERR;
    }
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(copy, " \t\r,", &save); tok != NULL && (size_t)n < max;
         tok = strtok_r(NULL, " \t\r,", &save))
        w[n++] = tok;
    const cli_cmd_t *c = find(w[0]);
    if (c == NULL) {
        cli_out_error(o, "unknown command '%s'; type help", w[0]);
        req->kind = CLI_LOCAL_ERR;
    } else {
        cmd_args_t a = {.w = w + 1, .n = n - 1, .o = o};
        req->kind = c->build(c, &a, req);
    }
    if (req->kind == CLI_LOCAL_ERR || req->kind == CLI_LOCAL || req->kind == CLI_QUIT) {
        cli_kind_t k = req->kind;
        cli_req_clear(req);
        req->kind = k;
    }
    free(w);
    free(copy);
    return req->kind;
}
