/* The job config (the README's Configuration): libconfig reads the syntax, the schema gives it
 * meaning: the runtime's own settings below, and those each layer above adds
 * with loom_config_add_settings. A loaded config holds two libconfig trees:
 * what the user wrote (file, then --set overrides on top) and the defaults
 * (from the schema, plus the defaults of plugin settings once a plugin's
 * group has been checked). A read looks in the first tree, then the second,
 * so every module asks for "parallel.dp.size" and never handles "unset"
 * itself.
 *
 * Every complaint is one line: where (file:line, or the --set that said it),
 * the setting's dotted path, what was expected and what was found. */
#include <ctype.h>
#include <errno.h>
#include <libconfig.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "runtime/config.h"
#include "runtime/files.h"
#include "runtime/log.h"

#define PATH_MAX_LEN 256
#define NAME_MAX_LEN 64

/* ------------------------------------------------------------- schema */

static const char *const offload_targets[] = {"none", "host", "nvme", NULL};

#define S(path_, type_, def_, ...) LOOM_CFG_SETTING(path_, type_, def_, __VA_ARGS__)

/* The runtime's own settings (config.h); the layers above add theirs.
 * Strategy and pipeline-schedule names are plugin names, so any non-empty
 * string passes here; the loader says later whether such a plugin exists. */
static const loom_config_setting plugin_settings[] = {
    S("plugins.path", LOOM_CFG_STRINGS, "", .flags = LOOM_CFG_NONEMPTY,
      .help = "directories searched for plugins before LOOM_PLUGIN_PATH; a relative one is taken "
      "from the folder of the config file that sets it"),
};

static const loom_config_setting runtime_settings[] = {
    S("parallel.dp.size", LOOM_CFG_INT, "1", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "data-parallel ranks"),
    S("parallel.dp.strategy", LOOM_CFG_STRING, "ddp", .flags = LOOM_CFG_NONEMPTY,
      .help = "data-parallel strategy plugin: ddp, zero1, zero2, zero3, ..."),
    S("parallel.tp.size", LOOM_CFG_INT, "1", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "tensor-parallel ranks"),
    S("parallel.tp.strategy", LOOM_CFG_STRING, "tp", .flags = LOOM_CFG_NONEMPTY,
      .help = "tensor-parallel strategy plugin"),
    S("parallel.sp.size", LOOM_CFG_INT, "1", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "sequence-parallel ranks"),
    S("parallel.sp.strategy", LOOM_CFG_STRING, "ulysses", .flags = LOOM_CFG_NONEMPTY,
      .help = "sequence-parallel strategy plugin: ulysses, ring, ..."),
    S("parallel.pp.size", LOOM_CFG_INT, "1", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "pipeline stages"),
    S("parallel.pp.schedule", LOOM_CFG_STRING, "1f1b", .flags = LOOM_CFG_NONEMPTY,
      .help = "pipeline schedule plugin: gpipe, 1f1b, interleaved, zb-h1, ..."),
    S("parallel.pp.microbatches", LOOM_CFG_INT, "1", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "micro-batches per step"),
    S("parallel.pp.virtual_stages", LOOM_CFG_INT, "1", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "model chunks per pipeline rank (interleaved pipeline schedules)"),
    S("parallel.pp.stage_layers", LOOM_CFG_INTS, "", .lo = 0, .flags = LOOM_CFG_GE,
      .help = "layers per stage; empty = split evenly"),

    S("comm.default", LOOM_CFG_STRING, "auto", .flags = LOOM_CFG_NONEMPTY,
      .help = "comm plugin of every axis not named below; \"auto\": comm-ucx for host memory "
      "when it loads on every rank, comm-nccl for device memory, else comm-mpi"),
    S("comm.timeout_s", LOOM_CFG_FLOAT, "60.0", .lo = 0, .flags = LOOM_CFG_GT,
      .help = "no communication waits longer than this"),
    S("comm.tp", LOOM_CFG_STRING, "", .help = "comm plugin of the tp axis; empty = comm.default"),
    S("comm.sp", LOOM_CFG_STRING, "", .help = "comm plugin of the sp axis; empty = comm.default"),
    S("comm.pp", LOOM_CFG_STRING, "", .help = "comm plugin of the pp axis; empty = comm.default"),
    S("comm.dp", LOOM_CFG_STRING, "", .help = "comm plugin of the dp axis; empty = comm.default"),

    S("memory.offload.optimizer", LOOM_CFG_STRING, "none", .choices = offload_targets,
      .help = "tier of the fp32 master weights and Adam moments of each rank's shard "
      "(ZeRO-Offload)"),
    S("memory.offload.params", LOOM_CFG_STRING, "none", .choices = offload_targets,
      .help = "tier of zero3's parameter and gradient shards (ZeRO-Infinity)"),
    S("memory.host_limit", LOOM_CFG_INT, "0", .lo = 0, .flags = LOOM_CFG_GE | LOOM_CFG_WIDE,
      .help = "host bytes per rank the accounting may hold; 0: no limit"),
};

#undef S

const loom_config_settings loom_config_plugin_settings = {
    .settings = plugin_settings,
    .count = LOOM_ARRAY_LEN(plugin_settings),
};

const loom_config_settings loom_config_runtime_settings = {
    .settings = runtime_settings,
    .count = LOOM_ARRAY_LEN(runtime_settings),
};

/* Groups where names the core does not know belong to a plugin (the
 * strategy of that axis, the offload tier): they are checked by
 * loom_config_check_group when the plugin loads. Besides these, any group
 * directly under comm is the comm plugin of that name's (comm.ucx = {...}),
 * and any directly under compute the compute backend's (compute.sim). */
static const char *const plugin_groups[] = {"parallel.dp", "parallel.tp", "parallel.sp",
                                            "parallel.pp", "memory.offload"};

/* Settings the schema reserves for a later release. A config that sets one
 * (or anything in such a group) is refused, not accepted and ignored; the
 * schema keeps them so that their defaults read and a typo near them is
 * still recognised. */
typedef struct unimplemented {
    const char *path;
    const char *why;
} unimplemented;

static const unimplemented not_yet[] = {
    {NULL, NULL}, /* none today; the end */
};

static const unimplemented *not_yet_find(const char *path)
{
    for (size_t i = 0; not_yet[i].path; i++) {
        size_t n = strlen(not_yet[i].path);
        if (!strncmp(path, not_yet[i].path, n) && (path[n] == '\0' || path[n] == '.'))
            return &not_yet[i];
    }
    return NULL;
}

/* The layers' settings added so far, in order. */
#define MAX_LAYER_SETTINGS 8
static const loom_config_settings *added[MAX_LAYER_SETTINGS];
static int nadded;

static int was_added(const loom_config_settings *settings)
{
    for (int i = 0; i < nadded; i++)
        if (added[i] == settings)
            return 1;
    return 0;
}

int loom_config_add_settings(const loom_config_settings *settings)
{
    if (!settings || was_added(settings))
        return LOOM_OK;
    if (nadded == MAX_LAYER_SETTINGS)
        return loom_fail(LOOM_ERR_INTERNAL, "config: more than %d tables of settings added",
                         MAX_LAYER_SETTINGS);
    added[nadded++] = settings;
    return LOOM_OK;
}

/* The tables a config is checked against: those added, then the runtime's
 * own where no one added them. Returns how many. */
static int schema_tables(const loom_config_settings *out[MAX_LAYER_SETTINGS + 2])
{
    int n = 0;
    for (int i = 0; i < nadded; i++)
        out[n++] = added[i];
    if (!was_added(&loom_config_plugin_settings))
        out[n++] = &loom_config_plugin_settings;
    if (!was_added(&loom_config_runtime_settings))
        out[n++] = &loom_config_runtime_settings;
    return n;
}

/* The index-th setting of the schema, NULL past the last. */
static const loom_config_setting *schema_at(size_t index)
{
    const loom_config_settings *tables[MAX_LAYER_SETTINGS + 2];
    int n = schema_tables(tables);
    for (int t = 0; t < n; t++) {
        if (index < tables[t]->count)
            return &tables[t]->settings[index];
        index -= tables[t]->count;
    }
    return NULL;
}

static const loom_config_setting *schema_find(const char *path)
{
    const loom_config_setting *e;
    for (size_t i = 0; (e = schema_at(i)); i++)
        if (!strcmp(e->path, path))
            return e;
    return NULL;
}

/* "" is the root group. */
static int schema_is_group(const char *path)
{
    size_t n = strlen(path);
    if (n == 0)
        return 1;
    const loom_config_setting *e;
    for (size_t i = 0; (e = schema_at(i)); i++)
        if (!strncmp(e->path, path, n) && e->path[n] == '.')
            return 1;
    return 0;
}

/* ------------------------------------------------------------ config */

struct loom_config {
    config_t tree;     /* what the file and the overrides say */
    config_t defaults; /* schema defaults, plus checked plugin groups' defaults */
    char *file;        /* the path loaded, NULL for text or no file */
    char *name;        /* stands for the file in messages */
    char **overrides;  /* "path=value" as given; the hooks of overridden settings point here */
    int noverrides;
    char **sources;    /* where derived defaults came from; their hooks point here */
    int nsources;
};

/* ------------------------------------------------------------ paths */

/* snprintf for text where cutting a too-long line short is fine. */
static void say(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
}

static void join_path(char *out, size_t cap, const char *group, const char *name)
{
    if (group[0])
        say(out, cap, "%s.%s", group, name);
    else
        say(out, cap, "%s", name);
}

static int valid_name(const char *s, size_t n)
{
    if (n == 0 || n >= NAME_MAX_LEN || !isalpha((unsigned char)s[0]))
        return 0;
    for (size_t i = 1; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-')
            return 0;
    return 1;
}

static int valid_path(const char *path)
{
    const char *p = path;
    for (;;) {
        size_t n = strcspn(p, ".");
        if (!valid_name(p, n))
            return 0;
        if (!p[n])
            return 1;
        p += n + 1;
    }
}

/* Walk a dotted path ("plugins.path", "parallel.pp.stage_layers[1]") from
 * root. *blocked is set when the walk stopped at something that exists but
 * cannot hold the rest (an index past a list's end, a name under a scalar):
 * then the defaults must not answer either. */
static config_setting_t *find_setting(const config_t *c, const char *path, int *blocked)
{
    config_setting_t *s = config_root_setting(c);
    const char *p = path;
    *blocked = 0;
    if (!*p)
        return NULL;
    while (*p) {
        if (*p == '[') {
            char *end;
            long i = strtol(p + 1, &end, 10);
            if (end == p + 1 || *end != ']' || i < 0)
                return NULL;
            if (!config_setting_is_array(s) && !config_setting_is_list(s)) {
                *blocked = 1;
                return NULL;
            }
            config_setting_t *e = config_setting_get_elem(s, (unsigned)i);
            if (!e) {
                *blocked = 1;
                return NULL;
            }
            s = e;
            p = end + 1;
        } else {
            size_t n = strcspn(p, ".[");
            if (n == 0 || n >= NAME_MAX_LEN)
                return NULL;
            char name[NAME_MAX_LEN];
            memcpy(name, p, n);
            name[n] = '\0';
            if (!config_setting_is_group(s)) {
                *blocked = 1;
                return NULL;
            }
            s = config_setting_get_member(s, name);
            if (!s)
                return NULL;
            p += n;
        }
        if (*p == '.')
            p++;
    }
    return s;
}

/* The dotted path of a setting in its tree: "parallel.pp.stage_layers[2]". */
static void setting_path(const config_setting_t *s, char *out, size_t cap)
{
    if (!s || config_setting_is_root(s)) {
        out[0] = '\0';
        return;
    }
    char parent[PATH_MAX_LEN];
    setting_path(config_setting_parent(s), parent, sizeof parent);
    if (s->name)
        join_path(out, cap, parent, s->name);
    else
        say(out, cap, "%s[%d]", parent, config_setting_index(s));
}

/* ------------------------------------------------------------ messages */

/* "file:line" of a setting, "--set path=value" when an override made it
 * (the hook of the override's setting points at its text; its children
 * inherit it), or the source of a derived default ("gpt2.bin's header"). */
static const char *origin(const loom_config *cfg, const config_setting_t *s, char *buf, size_t cap)
{
    for (const config_setting_t *p = s; p; p = p->parent)
        if (p->hook) {
            for (int i = 0; i < cfg->nsources; i++)
                if (p->hook == cfg->sources[i]) {
                    snprintf(buf, cap, "%s", cfg->sources[i]);
                    return buf;
                }
            snprintf(buf, cap, "--set %s", (const char *)p->hook);
            return buf;
        }
    const char *file = s->file ? s->file : cfg->name;
    if (s->line > 0)
        snprintf(buf, cap, "%s:%u", file, (unsigned)s->line);
    else
        snprintf(buf, cap, "%s", file);
    return buf;
}

static int fail_at(const loom_config *cfg, const config_setting_t *s, const char *path,
                   const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail_at(const loom_config *cfg, const config_setting_t *s, const char *path,
                   const char *fmt, ...)
{
    char where[PATH_MAX_LEN + 64], detail[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return loom_fail(LOOM_ERR_INVALID, "%s: %s: %s", origin(cfg, s, where, sizeof where), path,
                     detail);
}

int loom_config_fail_relation(const loom_config *cfg, const char *path, const char *other,
                              const char *fmt, ...)
{
    char detail[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    const char *where = loom_config_where(cfg, loom_config_is_set(cfg, path) ? path : other);
    if (!strcmp(where, "default"))
        where = cfg->name;
    return loom_fail(LOOM_ERR_INVALID, "%s: %s: %s", where, path, detail);
}

static long long int_of(const config_setting_t *s)
{
    return config_setting_get_int64(s);
}

/* libconfig converts int to float only with autoconvert on; do it here. */
static double number_of(const config_setting_t *s)
{
    if (config_setting_type(s) == CONFIG_TYPE_FLOAT)
        return config_setting_get_float(s);
    return (double)config_setting_get_int64(s);
}

static const char *expected_name(loom_config_type t)
{
    switch (t) {
    case LOOM_CFG_INT: return "an integer";
    case LOOM_CFG_FLOAT: return "a number";
    case LOOM_CFG_BOOL: return "a boolean (true or false)";
    case LOOM_CFG_STRING: return "a string";
    case LOOM_CFG_STRINGS: return "a list of strings";
    case LOOM_CFG_INTS: return "a list of integers";
    case LOOM_CFG_GLOBS: return "a path or glob pattern (a string), or a list of them";
    }
    return "?";
}

/* What a setting holds, for "found ...": a string ("eight"), an integer (5). */
static const char *describe(const config_setting_t *s, char *buf, size_t cap)
{
    switch (config_setting_type(s)) {
    case CONFIG_TYPE_INT:
    case CONFIG_TYPE_INT64: snprintf(buf, cap, "an integer (%lld)", int_of(s)); break;
    case CONFIG_TYPE_FLOAT: snprintf(buf, cap, "a float (%g)", config_setting_get_float(s)); break;
    case CONFIG_TYPE_BOOL:
        snprintf(buf, cap, "a boolean (%s)", config_setting_get_bool(s) ? "true" : "false");
        break;
    case CONFIG_TYPE_STRING: {
        /* One line, and not a novel. */
        const char *v = config_setting_get_string(s);
        char shown[64];
        size_t n = 0;
        for (; v[n] && n < 48; n++)
            shown[n] = isprint((unsigned char)v[n]) ? v[n] : '?';
        shown[n] = '\0';
        snprintf(buf, cap, "a string (\"%s%s\")", shown, v[n] ? "..." : "");
        break;
    }
    case CONFIG_TYPE_GROUP: snprintf(buf, cap, "a group"); break;
    default: snprintf(buf, cap, "a list"); break;
    }
    return buf;
}

/* ------------------------------------------------------------ did you mean */

/* Edit distance counting a swap of neighbours as one edit (Damerau, the
 * optimal-string-alignment variant), ignoring case. */
static int edit_distance(const char *a, const char *b)
{
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la >= NAME_MAX_LEN || lb >= NAME_MAX_LEN)
        return INT_MAX;
    int d[NAME_MAX_LEN + 1][NAME_MAX_LEN + 1];
    for (int i = 0; i <= la; i++)
        d[i][0] = i;
    for (int j = 0; j <= lb; j++)
        d[0][j] = j;
    for (int i = 1; i <= la; i++)
        for (int j = 1; j <= lb; j++) {
            int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
            int best = d[i - 1][j - 1] + (ca != cb);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[la][lb];
}

/* Short names allow one edit, longer ones two, long ones a third of them. */
static int close_enough(const char *typed, int dist)
{
    int n = (int)strlen(typed);
    int limit = n <= 3 ? 1 : n <= 8 ? 2 : n / 3;
    return dist <= limit;
}

typedef struct name_list {
    int count;
    char names[64][NAME_MAX_LEN];
} name_list;

static void names_add(name_list *l, const char *name, size_t n)
{
    if (n >= NAME_MAX_LEN || l->count >= (int)LOOM_ARRAY_LEN(l->names))
        return;
    for (int i = 0; i < l->count; i++)
        if (strlen(l->names[i]) == n && !strncmp(l->names[i], name, n))
            return;
    memcpy(l->names[l->count], name, n);
    l->names[l->count][n] = '\0';
    l->count++;
}

/* The names the schema knows directly under group ("" = root). */
static void schema_children(const char *group, name_list *l)
{
    size_t g = strlen(group);
    const loom_config_setting *e;
    for (size_t i = 0; (e = schema_at(i)); i++) {
        const char *p = e->path;
        if (g) {
            if (strncmp(p, group, g) || p[g] != '.')
                continue;
            p += g + 1;
        }
        names_add(l, p, strcspn(p, "."));
    }
}

/* An unknown name in group: suggest a close name of the group, else the
 * same name where it lives elsewhere (train.dp -> parallel.dp), else list
 * what the group takes. `extra` are valid names the schema does not know
 * (a plugin's settings); `note` is appended to the list of valid names. */
static int unknown_setting(const loom_config *cfg, const config_setting_t *s, const char *group,
                           const name_list *extra, const char *note)
{
    char path[PATH_MAX_LEN];
    const char *name = config_setting_name(s);
    join_path(path, sizeof path, group, name);
    const char *what = config_setting_is_group(s) ? "group" : "setting";

    name_list valid = {0};
    schema_children(group, &valid);
    for (int i = 0; extra && i < extra->count; i++)
        names_add(&valid, extra->names[i], strlen(extra->names[i]));

    int best = -1, best_dist = INT_MAX;
    for (int i = 0; i < valid.count; i++) {
        int d = edit_distance(name, valid.names[i]);
        if (d < best_dist && close_enough(name, d)) {
            best = i;
            best_dist = d;
        }
    }
    if (best < 0 && strlen(name) >= 3) /* "micro" for "microbatches" */
        for (int i = 0; i < valid.count && best < 0; i++)
            if (!strncasecmp(valid.names[i], name, strlen(name)))
                best = i;
    /* A near miss here beats the exact name elsewhere, except that a
     * two-edit miss loses to it ("batch" at the top is train.batch, not
     * bench). */
    if (best >= 0 && best_dist <= 1) {
        char want[PATH_MAX_LEN];
        join_path(want, sizeof want, group, valid.names[best]);
        return fail_at(cfg, s, path, "unknown %s; did you mean '%s'?", what, want);
    }

    /* The same name in another group, preferring places of the same shape
     * (a group where a group was written). */
    char found[4][PATH_MAX_LEN];
    int nfound = 0;
    const loom_config_setting *e;
    for (int pass = 0; pass < 2 && nfound == 0; pass++)
        for (size_t i = 0; (e = schema_at(i)) && nfound < 4; i++) {
            const char *p = e->path;
            for (const char *c = p; *c;) {
                size_t n = strcspn(c, ".");
                if (n == strlen(name) && !strncasecmp(c, name, n)) {
                    char full[PATH_MAX_LEN], grp[PATH_MAX_LEN];
                    snprintf(full, sizeof full, "%.*s", (int)(c - p + (ptrdiff_t)n), p);
                    snprintf(grp, sizeof grp, "%.*s", c > p ? (int)(c - p - 1) : 0, p);
                    int is_group = c[n] == '.';
                    int dup = 0;
                    for (int k = 0; k < nfound; k++)
                        dup |= !strcmp(found[k], full);
                    if (!dup && strcmp(grp, group) &&
                        (pass == 1 || is_group == config_setting_is_group(s)))
                        snprintf(found[nfound++], PATH_MAX_LEN, "%s", full);
                }
                c += n;
                if (*c == '.')
                    c++;
            }
        }
    if (nfound > 0) {
        char list[4 * (PATH_MAX_LEN + 8)] = "";
        for (int k = 0; k < nfound; k++) {
            size_t len = strlen(list);
            snprintf(list + len, sizeof list - len, "%s'%s'",
                     k == 0            ? ""
                     : k == nfound - 1 ? " or "
                                       : ", ",
                     found[k]);
        }
        return fail_at(cfg, s, path, "unknown %s; did you mean %s?", what, list);
    }
    if (best >= 0) {
        char want[PATH_MAX_LEN];
        join_path(want, sizeof want, group, valid.names[best]);
        return fail_at(cfg, s, path, "unknown %s; did you mean '%s'?", what, want);
    }

    char list[1024] = "";
    for (int i = 0; i < valid.count; i++) {
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", valid.names[i]);
    }
    const char *more = note ? note : "";
    if (!list[0] && !strncmp(more, "; or ", 5))
        more += 5; /* a group of plugins' groups alone, as compute is */
    return fail_at(cfg, s, path, "unknown %s (valid here: %s%s)", what, list, more);
}

/* ------------------------------------------------------------ checking values */

static int check_range(const loom_config *cfg, const config_setting_t *s, const char *path,
                       const loom_config_setting *e, double v)
{
    int ok = 1;
    if ((e->flags & LOOM_CFG_GE) && !(v >= e->lo))
        ok = 0;
    if ((e->flags & LOOM_CFG_GT) && !(v > e->lo))
        ok = 0;
    if ((e->flags & LOOM_CFG_LE) && !(v <= e->hi))
        ok = 0;
    if ((e->flags & LOOM_CFG_LT) && !(v < e->hi))
        ok = 0;
    if (ok)
        return LOOM_OK;

    char want[96], got[64];
    int has_lo = e->flags & (LOOM_CFG_GE | LOOM_CFG_GT);
    int has_hi = e->flags & (LOOM_CFG_LE | LOOM_CFG_LT);
    if (has_lo && has_hi)
        snprintf(want, sizeof want, "in %c%g, %g%c", (e->flags & LOOM_CFG_GE) ? '[' : '(', e->lo,
                 e->hi, (e->flags & LOOM_CFG_LE) ? ']' : ')');
    else if (has_lo)
        snprintf(want, sizeof want, "%s %g", (e->flags & LOOM_CFG_GE) ? ">=" : ">", e->lo);
    else
        snprintf(want, sizeof want, "%s %g", (e->flags & LOOM_CFG_LE) ? "<=" : "<", e->hi);
    if (config_setting_type(s) == CONFIG_TYPE_FLOAT)
        snprintf(got, sizeof got, "%g", v);
    else
        snprintf(got, sizeof got, "%lld", int_of(s));
    return fail_at(cfg, s, path, "expected %s %s, found %s",
                   e->type == LOOM_CFG_INT || e->type == LOOM_CFG_INTS ? "an integer" : "a number",
                   want, got);
}

/* Whether s holds a value of type t; an integer is a fine number. */
static int holds(const config_setting_t *s, loom_config_type t)
{
    int found = config_setting_type(s);
    switch (t) {
    case LOOM_CFG_INT: return found == CONFIG_TYPE_INT || found == CONFIG_TYPE_INT64;
    case LOOM_CFG_FLOAT: return config_setting_is_number(s);
    case LOOM_CFG_BOOL: return found == CONFIG_TYPE_BOOL;
    case LOOM_CFG_STRING: return found == CONFIG_TYPE_STRING;
    default: return 0;
    }
}

static int check_value(const loom_config *cfg, const config_setting_t *s, const char *path,
                       const loom_config_setting *e)
{
    char found[128];
    int t = config_setting_type(s);
    switch (e->type) {
    case LOOM_CFG_INT:
        if (!holds(s, LOOM_CFG_INT))
            break;
    {
        int rc = check_range(cfg, s, path, e, (double)int_of(s));
        /* Most settings are read into an int: a bigger value would be cut
         * to 32 bits without a word (4294967304 would train with 8). */
        if (rc == LOOM_OK && !(e->flags & LOOM_CFG_WIDE) &&
            (int_of(s) > INT_MAX || int_of(s) < INT_MIN))
            return fail_at(cfg, s, path, "expected an integer %s %d (the limit of the C int it "
                           "is read into), found %lld", int_of(s) > 0 ? "<=" : ">=",
                           int_of(s) > 0 ? INT_MAX : INT_MIN, int_of(s));
        return rc;
    }
    case LOOM_CFG_FLOAT:
        if (!holds(s, LOOM_CFG_FLOAT))
            break;
        if (!isfinite(number_of(s)))
            return fail_at(cfg, s, path, "expected a finite number, found %g", number_of(s));
        return check_range(cfg, s, path, e, number_of(s));
    case LOOM_CFG_BOOL:
        if (!holds(s, LOOM_CFG_BOOL))
            break;
        return LOOM_OK;
    case LOOM_CFG_STRING: {
        if (!holds(s, LOOM_CFG_STRING))
            break;
        const char *v = config_setting_get_string(s);
        if ((e->flags & LOOM_CFG_NONEMPTY) && !v[0])
            return fail_at(cfg, s, path, "expected a non-empty string, found \"\"");
        if (!e->choices)
            return LOOM_OK;
        char list[512] = "";
        int best = -1, best_dist = INT_MAX;
        for (int i = 0; e->choices[i]; i++) {
            if (!strcmp(v, e->choices[i]))
                return LOOM_OK;
            size_t len = strlen(list);
            snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", e->choices[i]);
            int d = edit_distance(v, e->choices[i]);
            if (d < best_dist && close_enough(v, d)) {
                best = i;
                best_dist = d;
            }
        }
        if (best >= 0)
            return fail_at(cfg, s, path, "expected one of %s; found \"%s\" (did you mean \"%s\"?)",
                           list, v, e->choices[best]);
        return fail_at(cfg, s, path, "expected one of %s; found \"%s\"", list, v);
    }
    case LOOM_CFG_GLOBS: {
        if (holds(s, LOOM_CFG_STRING))
            return LOOM_OK; /* "" is unset; the command that needs files says so */
        if (t != CONFIG_TYPE_ARRAY && t != CONFIG_TYPE_LIST)
            break;
        loom_config_setting list = *e;
        list.type = LOOM_CFG_STRINGS;
        list.flags |= LOOM_CFG_NONEMPTY | LOOM_CFG_SOME;
        return check_value(cfg, s, path, &list);
    }
    case LOOM_CFG_STRINGS:
    case LOOM_CFG_INTS: {
        if (t != CONFIG_TYPE_ARRAY && t != CONFIG_TYPE_LIST) {
            if (e->type == LOOM_CFG_STRINGS && t == CONFIG_TYPE_STRING)
                return fail_at(cfg, s, path, "expected a list of strings, found %s; write [\"%s\"]",
                               describe(s, found, sizeof found), config_setting_get_string(s));
            break;
        }
        loom_config_setting elem = *e;
        elem.type = e->type == LOOM_CFG_STRINGS ? LOOM_CFG_STRING : LOOM_CFG_INT;
        int n = config_setting_length(s);
        if ((e->flags & LOOM_CFG_SOME) && n == 0)
            return fail_at(cfg, s, path, "expected a non-empty list, found []");
        for (int i = 0; i < n; i++) {
            char epath[PATH_MAX_LEN + 16];
            snprintf(epath, sizeof epath, "%s[%d]", path, i);
            int rc = check_value(cfg, config_setting_get_elem(s, (unsigned)i), epath, &elem);
            if (rc)
                return rc;
        }
        return LOOM_OK;
    }
    }
    return fail_at(cfg, s, path, "expected %s, found %s", expected_name(e->type),
                   describe(s, found, sizeof found));
}

static int owned_by_plugin(const char *group, const config_setting_t *s)
{
    for (size_t i = 0; i < LOOM_ARRAY_LEN(plugin_groups); i++)
        if (!strcmp(group, plugin_groups[i]))
            return 1;
    return (!strcmp(group, "comm") || !strcmp(group, "compute")) && config_setting_is_group(s);
}

static int validate_group(const loom_config *cfg, const config_setting_t *g, const char *group)
{
    int n = config_setting_length(g);
    for (int i = 0; i < n; i++) {
        const config_setting_t *s = config_setting_get_elem(g, (unsigned)i);
        char path[PATH_MAX_LEN], found[128];
        join_path(path, sizeof path, group, config_setting_name(s));
        const loom_config_setting *e = schema_find(path);
        int rc;
        if (e)
            rc = check_value(cfg, s, path, e);
        else if (schema_is_group(path) || !strcmp(path, "compute"))
            rc = config_setting_is_group(s)
                     ? validate_group(cfg, s, path)
                     : fail_at(cfg, s, path, "expected a group ({ ... }), found %s",
                               describe(s, found, sizeof found));
        else if (owned_by_plugin(group, s))
            rc = LOOM_OK;
        else
            rc =
                unknown_setting(cfg, s, group, NULL,
                                !strcmp(group, "comm")
                                    ? "; or a group of a comm plugin's settings, e.g. ucx = { ... }"
                                : !strcmp(group, "compute")
                                    ? "; or a group of a compute backend's settings, e.g. "
                                      "sim = { ... }"
                                    : NULL);
        if (rc)
            return rc;
    }
    return LOOM_OK;
}

/* Relations between settings that no single value shows: each layer's. */
static int check_relations(const loom_config *cfg)
{
    const loom_config_settings *tables[MAX_LAYER_SETTINGS + 2];
    int n = schema_tables(tables);
    for (int t = 0; t < n; t++) {
        int rc = tables[t]->check ? tables[t]->check(cfg) : LOOM_OK;
        if (rc != LOOM_OK)
            return rc;
    }
    return LOOM_OK;
}

static int check_required(const loom_config *cfg)
{
    const loom_config_setting *e;
    for (size_t i = 0; (e = schema_at(i)); i++)
        if ((e->flags & LOOM_CFG_REQUIRED) && !loom_config_is_set(cfg, e->path))
            return loom_fail(LOOM_ERR_INVALID,
                             "%s: %s: required setting is missing (it has no default); set it "
                             "in the config or with --set %s=VALUE",
                             cfg->name, e->path, e->path);
    return LOOM_OK;
}

/* Placed at the first thing set in it, where the user will look. */
static int refuse_unimplemented(const loom_config *cfg)
{
    for (size_t i = 0; not_yet[i].path; i++) {
        int blocked;
        const config_setting_t *s = find_setting(&cfg->tree, not_yet[i].path, &blocked);
        if (!s)
            continue;
        while (config_setting_is_group(s) && config_setting_length(s) > 0)
            s = config_setting_get_elem(s, 0);
        return fail_at(cfg, s, not_yet[i].path, "not implemented yet (%s); remove it",
                       not_yet[i].why);
    }
    return LOOM_OK;
}

/* ------------------------------------------------------------ wide integers */

/* libconfig 1.5 keeps an integer literal without the L suffix in 32 bits and
 * silently wraps bigger ones (4294967296 reads as 0). Find such a literal so
 * the user gets an error instead of a wrong number. Returns its line (0 if
 * none) and copies the literal. */
static int find_wide_int(const char *text, char *lit, size_t cap)
{
    int line = 1;
    const char *p = text;
    while (*p) {
        if (*p == '\n') {
            line++;
            p++;
        } else if (*p == '"') {
            for (p++; *p && *p != '"'; p++) {
                if (*p == '\\' && p[1])
                    p++;
                if (*p == '\n')
                    line++;
            }
            if (*p)
                p++;
        } else if (*p == '#' || (p[0] == '/' && p[1] == '/')) {
            while (*p && *p != '\n')
                p++;
        } else if (p[0] == '/' && p[1] == '*') {
            for (p += 2; *p && !(p[0] == '*' && p[1] == '/'); p++)
                if (*p == '\n')
                    line++;
            if (*p)
                p += 2;
        } else if (isalpha((unsigned char)*p) || *p == '_' || *p == '*') {
            while (isalnum((unsigned char)*p) || *p == '_' || *p == '*' || *p == '-')
                p++;
        } else if (isdigit((unsigned char)*p) ||
                   ((*p == '-' || *p == '+') && isdigit((unsigned char)p[1]))) {
            const char *start = p;
            if (*p == '-' || *p == '+')
                p++;
            int hex = p[0] == '0' && (p[1] == 'x' || p[1] == 'X');
            if (hex)
                p += 2;
            while (hex ? isxdigit((unsigned char)*p) : isdigit((unsigned char)*p))
                p++;
            if (!hex && (*p == '.' || *p == 'e' || *p == 'E')) { /* a float */
                while (isalnum((unsigned char)*p) || *p == '.' || *p == '-' || *p == '+')
                    p++;
                continue;
            }
            int suffixed = *p == 'L';
            while (*p == 'L')
                p++;
            errno = 0;
            long long v = strtoll(start, NULL, 0);
            int wide = errno == ERANGE || (!suffixed && (hex ? (unsigned long long)v > UINT32_MAX
                                                             : (v > INT32_MAX || v < INT32_MIN)));
            if (wide) {
                snprintf(lit, cap, "%.*s", (int)(p - start), start);
                return line;
            }
        } else {
            p++;
        }
    }
    return 0;
}

/* The first integer setting on a line, for naming a wide literal. */
static const config_setting_t *setting_on_line(const config_setting_t *g, int line)
{
    int n = config_setting_length(g);
    for (int i = 0; i < n; i++) {
        const config_setting_t *s = config_setting_get_elem(g, (unsigned)i);
        if (config_setting_is_aggregate(s)) {
            const config_setting_t *r = setting_on_line(s, line);
            if (r)
                return r;
        } else if ((int)s->line == line && !s->file &&
                   (config_setting_type(s) == CONFIG_TYPE_INT ||
                    config_setting_type(s) == CONFIG_TYPE_INT64)) {
            return s;
        }
    }
    return NULL;
}

static int check_wide_ints(const loom_config *cfg, const char *text)
{
    char lit[64];
    int line = find_wide_int(text, lit, sizeof lit);
    if (!line)
        return LOOM_OK;
    const char *fix = "the number is out of range even for 64 bits";
    char want[160];
    if (lit[strlen(lit) - 1] != 'L') {
        say(want, sizeof want,
            "write %sL (libconfig reads numbers above 2^31 only with the L suffix)", lit);
        fix = want;
    }
    const config_setting_t *s = setting_on_line(config_root_setting(&cfg->tree), line);
    if (s) {
        char path[PATH_MAX_LEN];
        setting_path(s, path, sizeof path);
        return loom_fail(LOOM_ERR_INVALID, "%s:%d: %s: integer %s does not fit; %s", cfg->name,
                         line, path, lit, fix);
    }
    return loom_fail(LOOM_ERR_INVALID, "%s:%d: integer %s does not fit; %s", cfg->name, line, lit,
                     fix);
}

/* ------------------------------------------------------------ values from text */

static config_setting_t *copy_setting(config_setting_t *parent, const char *name,
                                      const config_setting_t *src)
{
    int t = config_setting_type(src);
    config_setting_t *d = config_setting_add(parent, name, t);
    if (!d)
        return NULL;
    int ok = CONFIG_TRUE;
    switch (t) {
    case CONFIG_TYPE_INT: ok = config_setting_set_int(d, config_setting_get_int(src)); break;
    case CONFIG_TYPE_INT64: ok = config_setting_set_int64(d, config_setting_get_int64(src)); break;
    case CONFIG_TYPE_FLOAT: ok = config_setting_set_float(d, config_setting_get_float(src)); break;
    case CONFIG_TYPE_BOOL: ok = config_setting_set_bool(d, config_setting_get_bool(src)); break;
    case CONFIG_TYPE_STRING:
        ok = config_setting_set_string(d, config_setting_get_string(src));
        break;
    default:
        for (int i = 0; i < config_setting_length(src); i++) {
            const config_setting_t *e = config_setting_get_elem(src, (unsigned)i);
            if (!copy_setting(d, t == CONFIG_TYPE_GROUP ? e->name : NULL, e))
                return NULL;
        }
    }
    return ok ? d : NULL;
}

static config_setting_t *add_string(config_setting_t *parent, const char *name, const char *v)
{
    config_setting_t *s = config_setting_add(parent, name, CONFIG_TYPE_STRING);
    if (s && !config_setting_set_string(s, v))
        return NULL;
    return s;
}

static config_setting_t *add_int(config_setting_t *parent, const char *name, long long v)
{
    int wide = v > INT32_MAX || v < INT32_MIN;
    config_setting_t *s =
        config_setting_add(parent, name, wide ? CONFIG_TYPE_INT64 : CONFIG_TYPE_INT);
    if (s && !(wide ? config_setting_set_int64(s, v) : config_setting_set_int(s, (int)v)))
        return NULL;
    return s;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* Add parent.name from the text of a value, as --set and defaults give it.
 * hint (0 = unknown) is the type the schema wants there; it lets a user
 * skip the quotes a config file would need:
 *   string:          --set comm.default=ucx
 *   list of strings: --set plugins.path=lib,more  (or ["lib","more"])
 *   list of ints:    --set parallel.pp.stage_layers=2,2
 *   files:           --set PATH=data/train_*.bin (one path or pattern, so
 *                    it may hold commas; a list as ["a.bin","b.bin"])
 * Anything else is read as a libconfig value; a bare word that is not one
 * becomes a string. On failure err says why. */
static config_setting_t *add_from_text(config_setting_t *parent, const char *name, const char *text,
                                       int hint, char *err, size_t errcap)
{
    int open = text[0] == '"' || text[0] == '[' || text[0] == '(' || text[0] == '{';
    if (hint == LOOM_CFG_GLOBS) /* a bare word is one path: paths may hold commas */
        hint = text[0] == '[' || text[0] == '(' ? LOOM_CFG_STRINGS : LOOM_CFG_STRING;
    if (hint == LOOM_CFG_STRING && text[0] != '"')
        return add_string(parent, name, text);
    if (hint == LOOM_CFG_STRINGS && !open) {
        config_setting_t *list = config_setting_add(parent, name, CONFIG_TYPE_ARRAY);
        char *copy = strdup(text);
        if (!list || !copy) {
            free(copy);
            return NULL;
        }
        for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok;
             tok = strtok_r(NULL, ",", &save))
            if (!add_string(list, NULL, trim(tok))) {
                free(copy);
                return NULL;
            }
        free(copy);
        return list;
    }
    if (hint == LOOM_CFG_INTS && !text[0])
        return config_setting_add(parent, name, CONFIG_TYPE_ARRAY);
    if (hint == LOOM_CFG_INT && text[0]) {
        char *end;
        errno = 0;
        long long v = strtoll(text, &end, 0);
        if (!*end && errno == 0)
            return add_int(parent, name, v);
    }

    size_t cap = strlen(text) + 16;
    char *src = malloc(cap);
    if (!src)
        return NULL;
    if (hint == LOOM_CFG_INTS && text[0] && !open)
        snprintf(src, cap, "v = [%s];", text);
    else
        snprintf(src, cap, "v = %s;", text);

    config_t scratch;
    config_init(&scratch);
    config_setting_t *out = NULL;
    char lit[64];
    int parsed = config_read_string(&scratch, src) &&
                 config_setting_length(config_root_setting(&scratch)) == 1;
    const config_setting_t *v = parsed ? config_lookup(&scratch, "v") : NULL;
    if (v && find_wide_int(src, lit, sizeof lit)) {
        snprintf(err, errcap, "integer %s does not fit in 32 bits; write %sL", lit, lit);
    } else if (v) {
        int t = config_setting_type(v);
        if ((hint == LOOM_CFG_STRINGS && t == CONFIG_TYPE_STRING) ||
            (hint == LOOM_CFG_INTS && (t == CONFIG_TYPE_INT || t == CONFIG_TYPE_INT64))) {
            config_setting_t *list = config_setting_add(parent, name, CONFIG_TYPE_ARRAY);
            out = list && copy_setting(list, NULL, v) ? list : NULL;
        } else {
            out = copy_setting(parent, name, v);
        }
    } else if (!open) {
        out = add_string(parent, name, text);
    } else {
        snprintf(err, errcap, "libconfig: %s",
                 parsed ? "more than one value" : config_error_text(&scratch));
    }
    config_destroy(&scratch);
    free(src);
    return out;
}

/* The group at path, made (empty) where missing; `hook` marks the groups it
 * makes. NULL if something that is not a group is in the way. */
static config_setting_t *make_groups(config_t *c, const char *path, void *hook,
                                     config_setting_t **in_the_way)
{
    config_setting_t *g = config_root_setting(c);
    const char *p = path;
    *in_the_way = NULL;
    while (*p) {
        size_t n = strcspn(p, ".");
        char name[NAME_MAX_LEN];
        snprintf(name, sizeof name, "%.*s", (int)n, p);
        config_setting_t *s = config_setting_get_member(g, name);
        if (!s) {
            s = config_setting_add(g, name, CONFIG_TYPE_GROUP);
            if (!s)
                return NULL;
            config_setting_set_hook(s, hook);
        } else if (!config_setting_is_group(s)) {
            *in_the_way = s;
            return NULL;
        }
        g = s;
        p += n;
        if (*p == '.')
            p++;
    }
    return g;
}

/* Set path (replacing whatever is there) from text; hook marks an override. */
static int set_from_text(config_t *c, const char *path, const char *text, int hint, void *hook,
                         char *err, size_t errcap)
{
    char group[PATH_MAX_LEN];
    const char *dot = strrchr(path, '.');
    const char *leaf = dot ? dot + 1 : path;
    snprintf(group, sizeof group, "%.*s", dot ? (int)(dot - path) : 0, path);
    config_setting_t *in_the_way;
    config_setting_t *g = make_groups(c, group, hook, &in_the_way);
    if (!g) {
        if (in_the_way) {
            char p[PATH_MAX_LEN], found[128];
            setting_path(in_the_way, p, sizeof p);
            say(err, errcap, "%s is %s, not a group", p, describe(in_the_way, found, sizeof found));
            return LOOM_ERR_INVALID;
        }
        snprintf(err, errcap, "out of memory");
        return LOOM_ERR_NO_MEMORY;
    }
    if (config_setting_get_member(g, leaf))
        config_setting_remove(g, leaf);
    err[0] = '\0';
    config_setting_t *s = add_from_text(g, leaf, text, hint, err, errcap);
    if (!s) {
        if (!err[0])
            snprintf(err, errcap, "out of memory");
        return LOOM_ERR_INVALID;
    }
    config_setting_set_hook(s, hook);
    return LOOM_OK;
}

/* "path=value" -> path and value, trimmed. */
static int split_override(const char *text, char *path, size_t pcap, const char **value)
{
    const char *eq = strchr(text, '=');
    if (!eq)
        return 0;
    char tmp[PATH_MAX_LEN];
    snprintf(tmp, sizeof tmp, "%.*s", (int)(eq - text), text);
    snprintf(path, pcap, "%s", trim(tmp));
    for (*value = eq + 1; isspace((unsigned char)**value); (*value)++) {
    }
    return 1;
}

static int apply_override(loom_config *cfg, int i)
{
    const char *text = cfg->overrides[i];
    char path[PATH_MAX_LEN], err[256];
    const char *value;
    if (!split_override(text, path, sizeof path, &value))
        return loom_fail(LOOM_ERR_INVALID,
                         "--set %s: expected path=value, e.g. --set train.lr=3e-4", text);
    if (!valid_path(path))
        return loom_fail(LOOM_ERR_INVALID,
                         "--set %s: '%s' is not a setting path (names joined by dots, e.g. "
                         "parallel.dp.size)",
                         text, path);
    char *v = strdup(value);
    if (!v)
        return loom_fail(LOOM_ERR_NO_MEMORY, "--set %s: out of memory", text);
    const loom_config_setting *e = schema_find(path);
    int rc = set_from_text(&cfg->tree, path, trim(v), e ? (int)e->type : 0, cfg->overrides[i], err,
                           sizeof err);
    free(v);
    if (rc)
        return loom_fail(rc, "--set %s: %s", text, err);
    return LOOM_OK;
}

/* ------------------------------------------------------------ load */

static int build_defaults(loom_config *cfg)
{
    char err[256];
    const loom_config_setting *e;
    for (size_t i = 0; (e = schema_at(i)); i++) {
        if (!e->def)
            continue;
        int rc =
            set_from_text(&cfg->defaults, e->path, e->def, (int)e->type, NULL, err, sizeof err);
        if (rc)
            return loom_fail(LOOM_ERR_INTERNAL, "config schema: default of %s: %s", e->path, err);
        int blocked;
        rc = check_value(cfg, find_setting(&cfg->defaults, e->path, &blocked), e->path, e);
        if (rc) {
            char why[512];
            say(why, sizeof why, "%s", loom_last_error());
            return loom_fail(LOOM_ERR_INTERNAL, "config schema: bad default: %s", why);
        }
    }
    return LOOM_OK;
}

static loom_config *config_new(const char *file, const char *name, const char *const *overrides,
                               int noverrides)
{
    loom_config *cfg = calloc(1, sizeof *cfg);
    if (!cfg)
        return NULL;
    config_init(&cfg->tree);
    config_init(&cfg->defaults);
    cfg->file = file ? strdup(file) : NULL;
    cfg->name = strdup(name ? name : "config");
    if (!overrides)
        noverrides = 0;
    cfg->overrides = noverrides > 0 ? calloc((size_t)noverrides, sizeof(char *)) : NULL;
    int ok = cfg->name && (!file || cfg->file) && (noverrides <= 0 || cfg->overrides);
    for (int i = 0; ok && i < noverrides; i++) {
        cfg->overrides[i] = strdup(overrides[i] ? overrides[i] : "");
        ok = cfg->overrides[i] != NULL;
        cfg->noverrides = i + 1;
    }
    if (!ok) {
        loom_config_free(cfg);
        return NULL;
    }
    return cfg;
}

/* Parse text into cfg->tree, then overrides, then every check. */
static int config_fill(loom_config *cfg, const char *text)
{
    int rc = build_defaults(cfg);
    if (rc)
        return rc;
    if (text) {
        if (!config_read_string(&cfg->tree, text)) {
            const char *file = config_error_file(&cfg->tree);
            return loom_fail(LOOM_ERR_INVALID, "%s:%d: syntax error (libconfig: %s)",
                             file ? file : cfg->name, config_error_line(&cfg->tree),
                             config_error_text(&cfg->tree));
        }
        rc = check_wide_ints(cfg, text);
        if (rc)
            return rc;
    }
    for (int i = 0; i < cfg->noverrides; i++) {
        rc = apply_override(cfg, i);
        if (rc)
            return rc;
    }
    rc = refuse_unimplemented(cfg);
    if (!rc)
        rc = validate_group(cfg, config_root_setting(&cfg->tree), "");
    if (!rc)
        rc = check_required(cfg);
    if (!rc)
        rc = check_relations(cfg);
    return rc;
}

/* A new config handed out filled, or freed with the failure returned. */
static int config_finish(loom_config *cfg, const char *text, loom_config **out)
{
    int rc = config_fill(cfg, text);
    if (rc) {
        loom_config_free(cfg);
        return rc;
    }
    *out = cfg;
    return LOOM_OK;
}

/* why: set when the file could not be opened (a FIFO is refused, not waited on) */
static char *read_text(const char *path, const char **why)
{
    FILE *f = loom_fopen_regular(path, why);
    if (!f)
        return NULL;
    size_t cap = 4096, len = 0;
    char *buf = NULL;
    int err = 0;
    for (;;) {
        char *bigger = realloc(buf, cap);
        if (!bigger) {
            err = ENOMEM;
            break;
        }
        buf = bigger;
        len += fread(buf + len, 1, cap - 1 - len, f);
        if (ferror(f)) {
            err = errno; /* EISDIR for a directory */
            break;
        }
        if (len < cap - 1)
            break;
        cap *= 2;
    }
    fclose(f);
    if (err) {
        free(buf);
        errno = err;
        return NULL;
    }
    buf[len] = '\0';
    return buf;
}

/* libconfig opens @include files itself, and would wait forever on a
 * FIFO: each one the text (and the files it includes) names is checked to
 * be a regular file first. libconfig takes every relative @include from
 * the top file's folder, and refuses more than 10 levels itself. */
static int check_includes(const char *text, const char *file, const char *dir, int depth)
{
    int line = 1;
    for (const char *p = text; p && *p && depth < 10; p = strchr(p, '\n'), line++) {
        if (*p == '\n')
            p++;
        while (*p == ' ' || *p == '\t')
            p++;
        if (strncmp(p, "@include", 8) != 0)
            continue;
        const char *open = strchr(p + 8, '"'), *eol = strchr(p, '\n');
        const char *close = open ? strchr(open + 1, '"') : NULL;
        if (!close || (eol && close > eol))
            continue; /* libconfig says what is wrong with the line */
        char name[PATH_MAX_LEN], path[2 * PATH_MAX_LEN];
        say(name, sizeof name, "%.*s", (int)(close - open - 1), open + 1);
        if (name[0] == '/' || !strcmp(dir, "."))
            say(path, sizeof path, "%s", name);
        else
            say(path, sizeof path, "%s/%s", dir, name);
        const char *why = NULL;
        char *included = read_text(path, &why);
        if (!included)
            return loom_fail(LOOM_ERR_INVALID, "%s:%d: @include \"%s\": cannot read '%s': %s",
                             file, line, name, path, why ? why : strerror(errno));
        int rc = check_includes(included, path, dir, depth + 1);
        free(included);
        if (rc != LOOM_OK)
            return rc;
    }
    return LOOM_OK;
}

int loom_config_load(const char *path, const char *const *overrides, int noverrides,
                     loom_config **out)
{
    *out = NULL;
    char *text = NULL;
    if (path) {
        const char *why = NULL;
        text = read_text(path, &why);
        if (!text)
            return loom_fail(LOOM_ERR_INVALID, "cannot read config '%s': %s", path,
                             why ? why : strerror(errno));
    }
    loom_config *cfg = config_new(path, path, overrides, noverrides);
    if (!cfg) {
        free(text);
        return loom_fail(LOOM_ERR_NO_MEMORY, "config: out of memory");
    }
    if (path) {
        /* @include "x.cfg" is relative to the including file. */
        char dir[PATH_MAX_LEN];
        const char *slash = strrchr(path, '/');
        if (!slash)
            say(dir, sizeof dir, ".");
        else
            say(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
        config_set_include_dir(&cfg->tree, dir);
        int rc = check_includes(text, path, dir, 0);
        if (rc != LOOM_OK) {
            loom_config_free(cfg);
            free(text);
            return rc;
        }
    }
    int rc = config_finish(cfg, text, out);
    free(text);
    return rc;
}

int loom_config_parse(const char *text, const char *name, const char *const *overrides,
                      int noverrides, loom_config **out)
{
    *out = NULL;
    if (!text)
        return loom_fail(LOOM_ERR_INVALID, "config: no text to parse");
    loom_config *cfg = config_new(NULL, name, overrides, noverrides);
    if (!cfg)
        return loom_fail(LOOM_ERR_NO_MEMORY, "config: out of memory");
    return config_finish(cfg, text, out);
}

void loom_config_free(loom_config *cfg)
{
    if (!cfg)
        return;
    config_destroy(&cfg->tree);
    config_destroy(&cfg->defaults);
    for (int i = 0; i < cfg->noverrides; i++)
        free(cfg->overrides[i]);
    free(cfg->overrides);
    for (int i = 0; i < cfg->nsources; i++)
        free(cfg->sources[i]);
    free(cfg->sources);
    free(cfg->file);
    free(cfg->name);
    free(cfg);
}

/* ------------------------------------------------------------ reads */

/* The user's setting, else the default; NULL if neither exists. Records
 * nothing: asking whether an optional list exists is not an error. */
static const config_setting_t *lookup(const loom_config *cfg, const char *path)
{
    if (!cfg || !path)
        return NULL;
    int blocked;
    const config_setting_t *s = find_setting(&cfg->tree, path, &blocked);
    if (!s && !blocked)
        s = find_setting(&cfg->defaults, path, &blocked);
    return s;
}

static int not_found(const char *path)
{
    return loom_fail(LOOM_ERR_NOT_FOUND,
                     "config: no setting '%s' (not set, and not a known setting)",
                     path ? path : "(null)");
}

/* A typed read: out points at the C type of want (int64_t, double, int,
 * const char *). */
static int read_typed(const loom_config *cfg, const char *path, loom_config_type want, void *out)
{
    const config_setting_t *s = lookup(cfg, path);
    if (!s)
        return not_found(path);
    if (!holds(s, want)) {
        char found[128];
        return fail_at(cfg, s, path, "expected %s, found %s", expected_name(want),
                       describe(s, found, sizeof found));
    }
    switch (want) {
    case LOOM_CFG_INT: *(int64_t *)out = (int64_t)int_of(s); break;
    case LOOM_CFG_FLOAT: *(double *)out = number_of(s); break;
    case LOOM_CFG_BOOL: *(int *)out = config_setting_get_bool(s) != 0; break;
    case LOOM_CFG_STRING: *(const char **)out = config_setting_get_string(s); break;
    default: break;
    }
    return LOOM_OK;
}

int loom_config_int(const loom_config *cfg, const char *path, int64_t *out)
{
    return read_typed(cfg, path, LOOM_CFG_INT, out);
}

int loom_config_float(const loom_config *cfg, const char *path, double *out)
{
    return read_typed(cfg, path, LOOM_CFG_FLOAT, out);
}

int loom_config_bool(const loom_config *cfg, const char *path, int *out)
{
    return read_typed(cfg, path, LOOM_CFG_BOOL, out);
}

int loom_config_string(const loom_config *cfg, const char *path, const char **out)
{
    return read_typed(cfg, path, LOOM_CFG_STRING, out);
}

int loom_config_list_len(const loom_config *cfg, const char *path)
{
    const config_setting_t *s = lookup(cfg, path);
    if (!s || (!config_setting_is_array(s) && !config_setting_is_list(s)))
        return -1;
    return config_setting_length(s);
}

const char *loom_config_list_string(const loom_config *cfg, const char *path, int index)
{
    const config_setting_t *s = lookup(cfg, path);
    if (!s || index < 0 || (!config_setting_is_array(s) && !config_setting_is_list(s)))
        return NULL;
    const config_setting_t *e = config_setting_get_elem(s, (unsigned)index);
    if (!e || config_setting_type(e) != CONFIG_TYPE_STRING)
        return NULL;
    return config_setting_get_string(e);
}

int loom_config_is_set(const loom_config *cfg, const char *path)
{
    int blocked;
    return cfg && path && find_setting(&cfg->tree, path, &blocked) != NULL;
}

const char *loom_config_where(const loom_config *cfg, const char *path)
{
    static _Thread_local char buf[PATH_MAX_LEN + 64];
    int blocked;
    const config_setting_t *s = cfg && path ? find_setting(&cfg->tree, path, &blocked) : NULL;
    if (!s) {
        /* a derived default says where it came from */
        const config_setting_t *d = cfg && path ? find_setting(&cfg->defaults, path, &blocked) : NULL;
        return d && d->hook ? (const char *)d->hook : "default";
    }
    return origin(cfg, s, buf, sizeof buf);
}

int loom_config_derive_int(loom_config *cfg, const char *path, int64_t value, const char *source)
{
    const loom_config_setting *e = schema_find(path);
    if (!e || e->type != LOOM_CFG_INT || loom_config_is_set(cfg, path))
        return loom_fail(LOOM_ERR_INTERNAL, "config: %s is not an unset integer setting to derive",
                         path);
    char **grown = realloc(cfg->sources, (size_t)(cfg->nsources + 1) * sizeof *grown);
    if (!grown)
        return loom_fail(LOOM_ERR_NO_MEMORY, "config: out of memory");
    cfg->sources = grown;
    if (!(cfg->sources[cfg->nsources] = strdup(source)))
        return loom_fail(LOOM_ERR_NO_MEMORY, "config: out of memory");
    char *hook = cfg->sources[cfg->nsources++];
    char text[32], err[256];
    snprintf(text, sizeof text, "%lld", (long long)value);
    int rc = set_from_text(&cfg->defaults, path, text, LOOM_CFG_INT, hook, err, sizeof err);
    if (rc)
        return loom_fail(rc, "config: %s = %s from %s: %s", path, text, source, err);
    int blocked;
    return check_value(cfg, find_setting(&cfg->defaults, path, &blocked), path, e);
}

const char *loom_config_file(const loom_config *cfg)
{
    return cfg ? cfg->file : NULL;
}

/* ------------------------------------------------------------ plugin groups */

static loom_config_type spec_type(loom_setting_type t)
{
    switch (t) {
    case LOOM_SETTING_INT: return LOOM_CFG_INT;
    case LOOM_SETTING_FLOAT: return LOOM_CFG_FLOAT;
    case LOOM_SETTING_BOOL: return LOOM_CFG_BOOL;
    case LOOM_SETTING_STRING: return LOOM_CFG_STRING;
    }
    return 0;
}

/* A plugin's setting as a schema entry: its type and rules. */
static loom_config_setting spec_entry(const char *path, const loom_setting_spec *sp)
{
    loom_config_setting e = {.path = path, .type = spec_type(sp->type), .choices = sp->allowed,
                      .lo = sp->min, .hi = sp->max};
    /* host->config_int hands a plugin an int64_t */
    e.flags = LOOM_CFG_WIDE | ((sp->bounds & LOOM_SETTING_MIN) ? LOOM_CFG_GE : 0) |
              ((sp->bounds & LOOM_SETTING_ABOVE_MIN) ? LOOM_CFG_GT : 0) |
              ((sp->bounds & LOOM_SETTING_MAX) ? LOOM_CFG_LE : 0) |
              ((sp->bounds & LOOM_SETTING_BELOW_MAX) ? LOOM_CFG_LT : 0);
    return e;
}

static const loom_setting_spec *spec_find(const loom_setting_spec *specs, const char *name)
{
    for (const loom_setting_spec *sp = specs; sp && sp->name; sp++)
        if (!strcmp(sp->name, name))
            return sp;
    return NULL;
}

static int in_list(const char *const *list, const char *name)
{
    for (; list && *list; list++)
        if (!strcmp(*list, name))
            return 1;
    return 0;
}

/* An override written before the plugin's types were known was read
 * without a hint (--set comm.ucx.device=0 gave an integer); now that the
 * spec says what it is, read its text again. */
static int reread_override(loom_config *cfg, config_setting_t *s, const char *path,
                           loom_config_type type)
{
    const char *hook = s->hook;
    char opath[PATH_MAX_LEN], err[256];
    const char *value;
    /* A setting that already fits is left alone, so that strings handed out
     * stay valid when a second instance of the plugin checks the group. */
    if (holds(s, type) || !hook || !split_override(hook, opath, sizeof opath, &value) || strcmp(opath, path))
        return LOOM_OK;
    char *v = strdup(value);
    if (!v)
        return loom_fail(LOOM_ERR_NO_MEMORY, "config: out of memory");
    int rc = set_from_text(&cfg->tree, path, trim(v), (int)type, s->hook, err, sizeof err);
    free(v);
    return rc ? loom_fail(rc, "--set %s: %s", hook, err) : LOOM_OK;
}

int loom_config_check_group(loom_config *cfg, const char *group_path,
                            const loom_setting_spec *specs, const char *const *skip)
{
    if (!cfg || !group_path || !valid_path(group_path))
        return loom_fail(LOOM_ERR_INVALID, "config: bad group path '%s'",
                         group_path ? group_path : "");
    char path[PATH_MAX_LEN], err[256], found[128];

    /* Remember the defaults first: reads of unset settings answer from them. */
    for (const loom_setting_spec *sp = specs; sp && sp->name; sp++) {
        join_path(path, sizeof path, group_path, sp->name);
        if (!valid_name(sp->name, strlen(sp->name)) || !spec_type(sp->type))
            return loom_fail(LOOM_ERR_INVALID,
                             "%s: the plugin declares a setting with a bad name or type (%d)", path,
                             (int)sp->type);
        int blocked;
        /* Checked before (another instance of the plugin): keep the first
         * default, strings read from it may be held. */
        if (!sp->default_value || find_setting(&cfg->defaults, path, &blocked))
            continue;
        loom_config_setting e = spec_entry(path, sp);
        int rc = set_from_text(&cfg->defaults, path, sp->default_value, (int)e.type, NULL, err,
                               sizeof err);
        const config_setting_t *d = rc ? NULL : find_setting(&cfg->defaults, path, &blocked);
        if (!d || check_value(cfg, d, path, &e))
            return loom_fail(LOOM_ERR_INVALID,
                             "%s: the plugin's default \"%s\" is not %s (a bug in the plugin)",
                             path, sp->default_value, expected_name(e.type));
    }

    int blocked;
    config_setting_t *g = find_setting(&cfg->tree, group_path, &blocked);
    if (g && !config_setting_is_group(g))
        return fail_at(cfg, g, group_path, "expected a group of settings ({ ... }), found %s",
                       describe(g, found, sizeof found));

    /* The names the core owns in this group were checked at load. */
    name_list extra = {0};
    for (const loom_setting_spec *sp = specs; sp && sp->name; sp++)
        names_add(&extra, sp->name, strlen(sp->name));
    for (const char *const *k = skip; k && *k; k++)
        names_add(&extra, *k, strlen(*k));

    int n = g ? config_setting_length(g) : 0;
    for (int i = 0; i < n; i++) {
        const config_setting_t *s = config_setting_get_elem(g, (unsigned)i);
        const char *name = config_setting_name(s);
        join_path(path, sizeof path, group_path, name);
        if (!in_list(skip, name) && !schema_find(path) && !schema_is_group(path) &&
            !spec_find(specs, name))
            return unknown_setting(cfg, s, group_path, &extra, NULL);
    }
    /* Rereading replaces a setting (at the end of the group), so go by name. */
    for (const loom_setting_spec *sp = specs; g && sp && sp->name; sp++) {
        config_setting_t *s = config_setting_get_member(g, sp->name);
        join_path(path, sizeof path, group_path, sp->name);
        if (!s || in_list(skip, sp->name) || schema_find(path))
            continue;
        int rc = reread_override(cfg, s, path, spec_type(sp->type));
        if (rc)
            return rc;
    }
    /* Rereading may have replaced settings: check types on a fresh walk. */
    for (int i = 0; g && i < config_setting_length(g); i++) {
        const config_setting_t *s = config_setting_get_elem(g, (unsigned)i);
        const loom_setting_spec *sp = spec_find(specs, config_setting_name(s));
        join_path(path, sizeof path, group_path, config_setting_name(s));
        if (!sp || in_list(skip, sp->name) || schema_find(path))
            continue;
        loom_config_setting e = spec_entry(path, sp);
        int rc = check_value(cfg, s, path, &e);
        if (rc)
            return rc;
    }

    for (const loom_setting_spec *sp = specs; sp && sp->name; sp++) {
        join_path(path, sizeof path, group_path, sp->name);
        if (!sp->default_value && !in_list(skip, sp->name) && !loom_config_is_set(cfg, path))
            return loom_fail(LOOM_ERR_INVALID,
                             "%s: %s: required setting is missing (it has no default); set it "
                             "in the config or with --set %s=VALUE",
                             cfg->name, path, path);
    }
    return LOOM_OK;
}

/* ------------------------------------------------------ loom settings */

static const char *type_name(loom_config_type t)
{
    switch (t) {
    case LOOM_CFG_INT: return "int";
    case LOOM_CFG_FLOAT: return "float";
    case LOOM_CFG_BOOL: return "bool";
    case LOOM_CFG_STRING: return "string";
    case LOOM_CFG_STRINGS: return "strings";
    case LOOM_CFG_INTS: return "ints";
    case LOOM_CFG_GLOBS: return "globs";
    }
    return "?";
}

int loom_config_refuse_unused_group(const loom_config *cfg, const char *group_path,
                                    const char *why)
{
    int blocked;
    const config_setting_t *g = find_setting(&cfg->tree, group_path, &blocked);
    if (!g || !config_setting_is_group(g))
        return LOOM_OK;
    int n = config_setting_length(g);
    for (int i = 0; i < n; i++) {
        const config_setting_t *s = config_setting_get_elem(g, (unsigned)i);
        char path[PATH_MAX_LEN];
        join_path(path, sizeof path, group_path, config_setting_name(s));
        if (!schema_find(path))
            return fail_at(cfg, s, path, "%s; remove it", why);
    }
    return LOOM_OK;
}

const char *loom_config_child_name(const loom_config *cfg, const char *group_path, int index)
{
    int blocked;
    const config_setting_t *g = cfg && group_path ? find_setting(&cfg->tree, group_path, &blocked)
                                                  : NULL;
    if (!g || !config_setting_is_group(g) || index < 0 || index >= config_setting_length(g))
        return NULL;
    return config_setting_name(config_setting_get_elem(g, (unsigned)index));
}

int loom_config_core_owns(const char *path)
{
    return schema_find(path) || schema_is_group(path);
}

const char *loom_config_not_implemented(const char *path)
{
    const unimplemented *u = path ? not_yet_find(path) : NULL;
    return u ? u->why : NULL;
}

/* "a | b | c", "0 <= x < 1", ">= 1", or "" when anything goes. */
static void rules_text(const loom_config_setting *e, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int k = 0; e->choices && e->choices[k] && n < cap; k++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", k ? " | " : "", e->choices[k]);
    if (e->choices)
        return;
    int has_lo = e->flags & (LOOM_CFG_GE | LOOM_CFG_GT);
    int has_hi = e->flags & (LOOM_CFG_LE | LOOM_CFG_LT);
    if (has_lo && has_hi)
        snprintf(buf, cap, "%g %s x %s %g", e->lo, e->flags & LOOM_CFG_GE ? "<=" : "<",
                 e->flags & LOOM_CFG_LE ? "<=" : "<", e->hi);
    else if (has_lo)
        snprintf(buf, cap, "%s %g", e->flags & LOOM_CFG_GE ? ">=" : ">", e->lo);
    else if (has_hi)
        snprintf(buf, cap, "%s %g", e->flags & LOOM_CFG_LE ? "<=" : "<", e->hi);
}

void loom_config_spec_rules(const loom_setting_spec *spec, char *buf, size_t cap)
{
    loom_config_setting e = spec_entry(spec->name, spec);
    rules_text(&e, buf, cap);
}

void loom_config_print_schema(FILE *f)
{
    fprintf(f, "%-30s %-8s %-12s %s\n", "setting", "type", "default", "what (allowed)");
    const loom_config_setting *e;
    for (size_t i = 0; (e = schema_at(i)); i++) {
        char allowed[256];
        rules_text(e, allowed, sizeof allowed);
        const char *def = e->def ? (e->def[0] ? e->def : "\"\"") : "(required)";
        const unimplemented *later = not_yet_find(e->path);
        fprintf(f, "%-30s %-8s %-12s %s%s%s%s%s%s%s\n", e->path, type_name(e->type), def,
                e->help ? e->help : "", allowed[0] ? " (" : "", allowed, allowed[0] ? ")" : "",
                later ? " [not implemented yet: " : "", later ? later->why : "",
                later ? "]" : "");
    }
}

/* A value as a config would write it: 4, 0.001, true, "ddp", ["mpi", "ucx"]. */
static void value_text(const config_setting_t *s, char *buf, size_t cap)
{
    switch (config_setting_type(s)) {
    case CONFIG_TYPE_INT:
    case CONFIG_TYPE_INT64: snprintf(buf, cap, "%lld", int_of(s)); return;
    case CONFIG_TYPE_FLOAT: snprintf(buf, cap, "%g", config_setting_get_float(s)); return;
    case CONFIG_TYPE_BOOL: snprintf(buf, cap, "%s", config_setting_get_bool(s) ? "true" : "false"); return;
    case CONFIG_TYPE_STRING: snprintf(buf, cap, "\"%s\"", config_setting_get_string(s)); return;
    case CONFIG_TYPE_GROUP: snprintf(buf, cap, "{ ... }"); return;
    default: break;
    }
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < config_setting_length(s) && n < cap; i++) {
        char elem[256];
        value_text(config_setting_get_elem(s, (unsigned)i), elem, sizeof elem);
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", elem);
    }
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

static void print_value(const loom_config *cfg, FILE *f, const char *path,
                        const config_setting_t *s)
{
    char value[512];
    value_text(s, value, sizeof value);
    fprintf(f, "%-30s %-24s %s\n", path, value, loom_config_where(cfg, path));
}

/* The settings the file or --set gave that the schema does not know: a
 * plugin's. */
static void print_plugin_values(const loom_config *cfg, FILE *f, const config_setting_t *g,
                                const char *group)
{
    for (int i = 0; i < config_setting_length(g); i++) {
        const config_setting_t *s = config_setting_get_elem(g, (unsigned)i);
        char path[PATH_MAX_LEN];
        join_path(path, sizeof path, group, config_setting_name(s));
        if (schema_find(path))
            continue;
        if (config_setting_is_group(s))
            print_plugin_values(cfg, f, s, path);
        else
            print_value(cfg, f, path, s);
    }
}

void loom_config_print_values(const loom_config *cfg, FILE *f)
{
    fprintf(f, "%-30s %-24s %s\n", "setting", "value", "from");
    const loom_config_setting *e;
    for (size_t i = 0; (e = schema_at(i)); i++) {
        const config_setting_t *s = lookup(cfg, e->path);
        if (s)
            print_value(cfg, f, e->path, s);
    }
    print_plugin_values(cfg, f, config_root_setting(&cfg->tree), "");
}
