/* loom plan — cluster files: what a cluster offers each rank (memory, peak
 * rates, links), read from and written to libconfig (docs/plan.md, "The
 * cluster file").
 *
 * Sizes, rates and times are strings with their unit, parsed exactly:
 * "80 GiB" is 80·2^30 bytes, "80 GB" 80·10^9, "400 Gb/s" 400·10^9 bits a
 * second (50·10^9 bytes), "989 TFLOP/s", "2.5 us". A bare number is taken
 * only for a memory size, in bytes; a rate or a time without its unit is
 * refused, since "450" could mean anything. Every field missing, unknown or
 * out of range is refused with the file's line and what to write instead:
 * a setting that did nothing would plan a cluster nobody described. */
#include <errno.h>
#include <libconfig.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/status.h"
#include "runtime/log.h"
#include "plan/plan.h"

/* ---- quantities with units ---- */

typedef enum quantity_kind {
    Q_BYTES,     /* memory: B, KiB, GB, ... */
    Q_BYTE_RATE, /* bandwidth: GB/s, GiB/s, and bits: Gb/s */
    Q_FLOP_RATE, /* GFLOP/s, TFLOP/s */
    Q_TIME,      /* latency: s, ms, us, ns */
} quantity_kind;

/* value = number·10^exp10·2^exp2. The decimal part is applied by strtod
 * to the number's own digits ("9.162 us" reads as 9.162e-6, rounded
 * once), the binary part exactly, so "80 GiB", "400 Gb/s" and "2.5 us"
 * are the doubles nearest their values. writes: the units a written file
 * uses, smallest first within a kind. */
typedef struct unit {
    const char *name;
    quantity_kind kind;
    int exp10, exp2;
    int writes;
} unit;

static const unit units[] = {
    {"B", Q_BYTES, 0, 0, 1},
    {"KiB", Q_BYTES, 0, 10, 1},
    {"MiB", Q_BYTES, 0, 20, 1},
    {"GiB", Q_BYTES, 0, 30, 1},
    {"TiB", Q_BYTES, 0, 40, 1},
    {"PiB", Q_BYTES, 0, 50, 1},
    {"kB", Q_BYTES, 3, 0, 0},
    {"KB", Q_BYTES, 3, 0, 0},
    {"MB", Q_BYTES, 6, 0, 0},
    {"GB", Q_BYTES, 9, 0, 0},
    {"TB", Q_BYTES, 12, 0, 0},
    {"PB", Q_BYTES, 15, 0, 0},

    {"B/s", Q_BYTE_RATE, 0, 0, 1},
    {"kB/s", Q_BYTE_RATE, 3, 0, 1},
    {"MB/s", Q_BYTE_RATE, 6, 0, 1},
    {"GB/s", Q_BYTE_RATE, 9, 0, 1},
    {"TB/s", Q_BYTE_RATE, 12, 0, 1},
    {"KB/s", Q_BYTE_RATE, 3, 0, 0},
    {"PB/s", Q_BYTE_RATE, 15, 0, 0},
    {"KiB/s", Q_BYTE_RATE, 0, 10, 0},
    {"MiB/s", Q_BYTE_RATE, 0, 20, 0},
    {"GiB/s", Q_BYTE_RATE, 0, 30, 0},
    {"TiB/s", Q_BYTE_RATE, 0, 40, 0},
    /* bits, as links are sold: 8 bits a byte */
    {"b/s", Q_BYTE_RATE, 0, -3, 0},
    {"kb/s", Q_BYTE_RATE, 3, -3, 0},
    {"Kb/s", Q_BYTE_RATE, 3, -3, 0},
    {"Mb/s", Q_BYTE_RATE, 6, -3, 0},
    {"Gb/s", Q_BYTE_RATE, 9, -3, 0},
    {"Tb/s", Q_BYTE_RATE, 12, -3, 0},

    {"FLOP/s", Q_FLOP_RATE, 0, 0, 1},
    {"kFLOP/s", Q_FLOP_RATE, 3, 0, 0},
    {"MFLOP/s", Q_FLOP_RATE, 6, 0, 1},
    {"GFLOP/s", Q_FLOP_RATE, 9, 0, 1},
    {"TFLOP/s", Q_FLOP_RATE, 12, 0, 1},
    {"PFLOP/s", Q_FLOP_RATE, 15, 0, 1},

    {"ns", Q_TIME, -9, 0, 1},
    {"us", Q_TIME, -6, 0, 1},
    {"µs", Q_TIME, -6, 0, 0},
    {"ms", Q_TIME, -3, 0, 1},
    {"s", Q_TIME, 0, 0, 1},
};

static const char *const kind_example[] = {
    [Q_BYTES] = "\"80 GiB\" (KiB/MiB/GiB/TiB are powers of 2, kB/MB/GB/TB of 10)",
    [Q_BYTE_RATE] = "\"450 GB/s\" (bytes), \"400 Gb/s\" (bits) or \"3.5 GiB/s\"",
    [Q_FLOP_RATE] = "\"989 TFLOP/s\" (or GFLOP/s, PFLOP/s)",
    [Q_TIME] = "\"2.5 us\" (or ns, ms, s)",
};

/* "80 GiB" -> 85899345920. 0 when text is a finite number >= 0 and a unit
 * of kind; -1 otherwise. */
static int parse_quantity(const char *text, quantity_kind kind, double *out)
{
    text += strspn(text, " \t");
    char *end;
    errno = 0;
    double x = strtod(text, &end);
    int digits = (int)(end - text);
    if (digits == 0 || digits > 40 || (int)strspn(text, "0123456789.eE+-") != digits || errno ||
        !isfinite(x) || x < 0)
        return -1;
    const char *unit_text = end + strspn(end, " \t");
    size_t len = strlen(unit_text);
    while (len > 0 && (unit_text[len - 1] == ' ' || unit_text[len - 1] == '\t'))
        len--;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(units); i++)
        if (units[i].kind == kind && strlen(units[i].name) == len &&
            !strncmp(units[i].name, unit_text, len)) {
            /* the unit's power of ten added to the number's own exponent,
             * so strtod rounds once */
            const char *e = memchr(text, 'e', (size_t)digits);
            if (!e)
                e = memchr(text, 'E', (size_t)digits);
            int mantissa = e ? (int)(e - text) : digits;
            long exponent = e ? strtol(e + 1, NULL, 10) : 0;
            char scaled[64];
            snprintf(scaled, sizeof scaled, "%.*se%ld", mantissa, text,
                     exponent + units[i].exp10);
            *out = ldexp(strtod(scaled, NULL), units[i].exp2);
            return isfinite(*out) ? 0 : -1;
        }
    return -1;
}

static double in_unit(double v, const unit *u)
{
    double x = ldexp(v, -u->exp2);
    return u->exp10 >= 0 ? x / pow(10, u->exp10) : x * pow(10, -u->exp10);
}

/* The shortest text in the largest unit that reads back as exactly v; else
 * v in the base unit, to the last digit. */
static void format_quantity(double v, quantity_kind kind, char *buf, size_t cap)
{
    size_t pick = 0, base = 0, zero = 0;
    int found = 0;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(units); i++) {
        const unit *u = &units[i];
        if (u->kind != kind || !u->writes)
            continue;
        if (u->exp10 == 0 && u->exp2 == 0)
            base = i;
        if (!strcmp(u->name, "us"))
            zero = i; /* "0 us" reads better than "0 ns" */
        /* the smallest unit, or a larger one v holds at least once */
        if (!found || in_unit(v, u) >= 1)
            pick = i;
        found = 1;
    }
    if (kind == Q_TIME && v == 0)
        pick = zero;
    /* fewest digits first; among as few, the largest unit */
    for (int digits = 1; digits <= 9; digits++)
        for (size_t i = pick + 1; i-- > 0;) {
            const unit *u = &units[i];
            if (u->kind != kind || !u->writes)
                continue;
            char number[32];
            snprintf(number, sizeof number, "%.*g", digits, in_unit(v, u));
            if (strchr(number, 'e')) /* "1e+02 us" reads back, but "100 us" reads better */
                continue;
            snprintf(buf, cap, "%s %s", number, u->name);
            double back;
            if (!parse_quantity(buf, kind, &back) && back == v)
                return;
        }
    if (kind == Q_BYTES && v == floor(v) && v < 9e15)
        snprintf(buf, cap, "%.0f %s", v, units[base].name);
    else
        snprintf(buf, cap, "%.17g %s", v, units[base].name);
}

/* ---- reading ---- */

typedef struct reader {
    const char *path;
    char *text; /* the file, for what libconfig hides (see int_as_written) */
    config_t cfg;
} reader;

static int line_of(const config_setting_t *s)
{
    int line = s ? (int)config_setting_source_line(s) : 0;
    return line > 0 ? line : 1;
}

/* "FILE:LINE: cluster.X: detail" — the one line every refusal is. */
static int fail_at(const reader *r, const config_setting_t *s, const char *path, const char *fmt,
                   ...) __attribute__((format(printf, 4, 5)));
static int fail_at(const reader *r, const config_setting_t *s, const char *path, const char *fmt,
                   ...)
{
    char detail[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return loom_fail(LOOM_ERR_INVALID, "%s:%d: %s: %s", r->path, line_of(s), path, detail);
}

static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return 99;
    int row[64];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* Refuse any member of group (at path) not in names[] (NULL-terminated). */
static int check_names(const reader *r, const config_setting_t *group, const char *path,
                       const char *const *names)
{
    for (int i = 0; i < config_setting_length(group); i++) {
        const config_setting_t *s = config_setting_get_elem(group, (unsigned)i);
        const char *name = config_setting_name(s);
        int known = 0, best = 99;
        const char *near = NULL;
        for (int k = 0; names[k] && !known; k++) {
            known = !strcmp(name, names[k]);
            int d = edit_distance(name, names[k]);
            if (d < best) {
                best = d;
                near = names[k];
            }
        }
        if (known)
            continue;
        char list[512] = "";
        for (int k = 0; names[k]; k++) {
            size_t n = strlen(list);
            snprintf(list + n, sizeof list - n, "%s%s", k ? ", " : "", names[k]);
        }
        char full[256];
        snprintf(full, sizeof full, "%s.%s", path, name);
        if (near && best <= 2)
            return fail_at(r, s, full, "unknown setting (did you mean %s.%s?); a setting loom "
                           "does not read would change nothing, so remove or rename it",
                           path, near);
        return fail_at(r, s, full, "unknown setting; %s takes %s", path, list);
    }
    return LOOM_OK;
}

static const char *type_name(const config_setting_t *s)
{
    switch (config_setting_type(s)) {
    case CONFIG_TYPE_INT:
    case CONFIG_TYPE_INT64: return "an integer";
    case CONFIG_TYPE_FLOAT: return "a number";
    case CONFIG_TYPE_STRING: return "a string";
    case CONFIG_TYPE_BOOL: return "a boolean";
    case CONFIG_TYPE_GROUP: return "a group";
    case CONFIG_TYPE_ARRAY: return "an array";
    case CONFIG_TYPE_LIST: return "a list";
    default: return "something else";
    }
}

/* Member name of group, or a refusal naming what to add (hint). */
static int require(const reader *r, const config_setting_t *group, const char *path,
                   const char *name, const char *hint, config_setting_t **out)
{
    *out = config_setting_get_member(group, name);
    if (*out)
        return LOOM_OK;
    char full[256];
    snprintf(full, sizeof full, "%s.%s", path, name);
    return fail_at(r, group, full, "missing; add %s", hint);
}

/* libconfig 1.5 reads an integer above 2^31 written without L as its low
 * 32 bits, silently. The literal on the setting's line says what was
 * meant; a mismatch is refused. */
static int int_as_written(const reader *r, const config_setting_t *s, const char *path,
                          double value, int size)
{
    const char *line = r->text;
    for (int n = 1; line && n < line_of(s); n++)
        if ((line = strchr(line, '\n')))
            line++;
    const char *name = config_setting_name(s);
    const char *at = line ? strstr(line, name) : NULL;
    const char *eol = line ? strchr(line, '\n') : NULL;
    if (!at || (eol && at > eol))
        return LOOM_OK;
    at += strlen(name);
    while (*at == ' ' || *at == '\t')
        at++;
    if (*at != '=' && *at != ':')
        return LOOM_OK;
    double literal = strtod(at + 1, NULL);
    if (literal == value)
        return LOOM_OK;
    if (!size)
        return fail_at(r, s, path, "%.0f does not fit a 32-bit integer, and libconfig read it as "
                       "%.0f; write a number below 2^31", literal, value);
    return fail_at(r, s, path, "%.0f does not fit a 32-bit integer, and libconfig read it as "
                   "%.0f; write %.0fL, or the size with its unit (%s)",
                   literal, value, literal, kind_example[Q_BYTES]);
}

/* A quantity of kind at member name of group: a string with its unit (or,
 * for a memory size, a number of bytes). positive: 0 is refused. */
static int read_quantity(const reader *r, const config_setting_t *group, const char *path,
                         const char *name, quantity_kind kind, int positive, double *out)
{
    char full[256];
    snprintf(full, sizeof full, "%s.%s", path, name);
    config_setting_t *s = config_setting_get_member(group, name);
    if (!s)
        return LOOM_ERR_NOT_FOUND;
    int type = config_setting_type(s);
    if (type == CONFIG_TYPE_STRING) {
        const char *text = config_setting_get_string(s);
        if (parse_quantity(text, kind, out))
            return fail_at(r, s, full, "cannot read \"%s\"; write a number and its unit, e.g. %s",
                           text, kind_example[kind]);
    } else if (kind == Q_BYTES && (type == CONFIG_TYPE_INT || type == CONFIG_TYPE_INT64 ||
                                   type == CONFIG_TYPE_FLOAT)) {
        *out = type == CONFIG_TYPE_FLOAT ? config_setting_get_float(s)
                                         : (double)config_setting_get_int64(s);
        if (type == CONFIG_TYPE_INT) {
            int rc = int_as_written(r, s, full, *out, 1);
            if (rc)
                return rc;
        }
        if (!isfinite(*out) || *out < 0)
            return fail_at(r, s, full, "%g bytes is not a size; write e.g. %s", *out,
                           kind_example[kind]);
    } else if (type == CONFIG_TYPE_INT || type == CONFIG_TYPE_INT64 || type == CONFIG_TYPE_FLOAT) {
        return fail_at(r, s, full, "a bare number has no unit; write it as a string with its "
                       "unit, e.g. %s", kind_example[kind]);
    } else {
        return fail_at(r, s, full, "expected a string with a unit, e.g. %s; found %s",
                       kind_example[kind], type_name(s));
    }
    if (positive && *out <= 0)
        return fail_at(r, s, full, "must be more than 0; write e.g. %s", kind_example[kind]);
    return LOOM_OK;
}

static int read_required_quantity(const reader *r, const config_setting_t *group,
                                  const char *path, const char *name, quantity_kind kind,
                                  int positive, const char *hint, double *out)
{
    config_setting_t *s;
    int rc = require(r, group, path, name, hint, &s);
    return rc ? rc : read_quantity(r, group, path, name, kind, positive, out);
}

static int read_int(const reader *r, const config_setting_t *group, const char *path,
                    const char *name, const char *hint, int min, int *out)
{
    config_setting_t *s;
    int rc = require(r, group, path, name, hint, &s);
    if (rc)
        return rc;
    char full[256];
    snprintf(full, sizeof full, "%s.%s", path, name);
    int type = config_setting_type(s);
    if (type != CONFIG_TYPE_INT && type != CONFIG_TYPE_INT64)
        return fail_at(r, s, full, "expected an integer; found %s", type_name(s));
    long long v = config_setting_get_int64(s);
    if (type == CONFIG_TYPE_INT && (rc = int_as_written(r, s, full, (double)v, 0)))
        return rc;
    if (v < min || v > 1000000000)
        return fail_at(r, s, full, "%lld is out of range; it must be %d or more (up to 10^9)", v,
                       min);
    *out = (int)v;
    return LOOM_OK;
}

/* A link: { latency = "2 us"; bandwidth = "450 GB/s"; }. */
static int read_link(const reader *r, const config_setting_t *cluster, const char *name,
                     const char *hint, loom_plan_link *out)
{
    config_setting_t *g;
    int rc = require(r, cluster, "cluster", name, hint, &g);
    if (rc)
        return rc;
    char path[64];
    snprintf(path, sizeof path, "cluster.%s", name);
    if (!config_setting_is_group(g))
        return fail_at(r, g, path, "expected a group, found %s; write %s", type_name(g), hint);
    static const char *const names[] = {"latency", "bandwidth", NULL};
    if ((rc = check_names(r, g, path, names)))
        return rc;
    if ((rc = read_required_quantity(r, g, path, "latency", Q_TIME, 0,
                                     "latency = \"2 us\"; (per message)", &out->latency_s)))
        return rc;
    return read_required_quantity(r, g, path, "bandwidth", Q_BYTE_RATE, 1,
                                  "bandwidth = \"450 GB/s\"; (per rank, each direction)",
                                  &out->bytes_per_s);
}

/* peak = { fp32 = "67 TFLOP/s"; bf16 = "989 TFLOP/s"; fp16 = "989 TFLOP/s"; } */
static const char *const peak_names[] = {"fp32", "bf16", "fp16", NULL};
static const loom_dtype peak_dtypes[] = {LOOM_F32, LOOM_BF16, LOOM_F16};

static int read_peak(const reader *r, const config_setting_t *cluster, loom_plan_cluster *out)
{
    static const char hint[] = "each rank's dense peak by precision, e.g. peak = { fp32 = "
                               "\"67 TFLOP/s\"; bf16 = \"989 TFLOP/s\"; };";
    config_setting_t *g;
    int rc = require(r, cluster, "cluster", "peak", hint, &g);
    if (rc)
        return rc;
    if (!config_setting_is_group(g))
        return fail_at(r, g, "cluster.peak", "expected a group, found %s; write %s",
                       type_name(g), hint);
    if ((rc = check_names(r, g, "cluster.peak", peak_names)))
        return rc;
    config_setting_t *fp32;
    if ((rc = require(r, g, "cluster.peak", "fp32", "fp32 = \"67 TFLOP/s\"; (every precision "
                      "left out runs at fp32's rate)", &fp32)))
        return rc;
    for (int i = 0; peak_names[i]; i++) {
        rc = read_quantity(r, g, "cluster.peak", peak_names[i], Q_FLOP_RATE, 1,
                           &out->flops[peak_dtypes[i]]);
        if (rc && rc != LOOM_ERR_NOT_FOUND)
            return rc;
    }
    return LOOM_OK;
}

/* measured = { allreduce = ( { ranks = 2; latency = "12 us"; bandwidth = "3 GB/s"; }, ... ); } */
static int read_measured(const reader *r, const config_setting_t *cluster, loom_plan_cluster *out)
{
    config_setting_t *g = config_setting_get_member(cluster, "measured");
    if (!g)
        return LOOM_OK;
    if (!config_setting_is_group(g))
        return fail_at(r, g, "cluster.measured", "expected a group of ops, measured = { "
                       "allreduce = ( { ranks = 2; latency = \"12 us\"; bandwidth = \"3 GB/s\"; "
                       "} ); }; found %s", type_name(g));
    const char *names[LOOM_OP_COUNT + 1];
    int n = 0;
    for (int op = 0; op < LOOM_OP_COUNT; op++)
        if (op != LOOM_OP_BARRIER) /* moves no bytes: nothing to fit */
            names[n++] = loom_comm_op_name((loom_comm_op)op);
    names[n] = NULL;
    int rc = check_names(r, g, "cluster.measured", names);
    if (rc)
        return rc;
    for (int op = 0; op < LOOM_OP_COUNT; op++) {
        config_setting_t *list = config_setting_get_member(g, loom_comm_op_name((loom_comm_op)op));
        if (!list)
            continue;
        char path[96];
        snprintf(path, sizeof path, "cluster.measured.%s", loom_comm_op_name((loom_comm_op)op));
        if (!config_setting_is_list(list) || config_setting_length(list) == 0)
            return fail_at(r, list, path, "expected a list of fits, ( { ranks = 2; latency = "
                           "\"12 us\"; bandwidth = \"3 GB/s\"; }, ... ); found %s",
                           config_setting_is_list(list) ? "an empty list" : type_name(list));
        if (config_setting_length(list) > LOOM_PLAN_MEASURED_MAX)
            return fail_at(r, list, path, "%d fits; loom keeps at most %d rank counts per op",
                           config_setting_length(list), LOOM_PLAN_MEASURED_MAX);
        for (int i = 0; i < config_setting_length(list); i++) {
            config_setting_t *e = config_setting_get_elem(list, (unsigned)i);
            char epath[112];
            snprintf(epath, sizeof epath, "%s[%d]", path, i);
            if (!config_setting_is_group(e))
                return fail_at(r, e, epath, "expected { ranks = 2; latency = \"12 us\"; "
                               "bandwidth = \"3 GB/s\"; }; found %s", type_name(e));
            static const char *const fields[] = {"ranks", "latency", "bandwidth", NULL};
            if ((rc = check_names(r, e, epath, fields)))
                return rc;
            loom_plan_measured *m = &out->measured[op][i];
            if ((rc = read_int(r, e, epath, "ranks", "ranks = 2; (the ranks it was measured on)",
                               2, &m->ranks)))
                return rc;
            /* more ranks than ranks_per_node is allowed: CPU ranks may share
             * a node's cores (--calibrate times 4 ranks on 2 cores) */
            for (int k = 0; k < i; k++)
                if (out->measured[op][k].ranks == m->ranks) {
                    char rpath[128];
                    snprintf(rpath, sizeof rpath, "%s.ranks", epath);
                    return fail_at(r, config_setting_get_member(e, "ranks"), rpath,
                                   "%s[%d] is of %d ranks already; keep one fit per rank count",
                                   path, k, m->ranks);
                }
            if ((rc = read_required_quantity(r, e, epath, "latency", Q_TIME, 0,
                                             "latency = \"12 us\"; (the fit's seconds at 0 "
                                             "bytes)", &m->latency_s)))
                return rc;
            if ((rc = read_required_quantity(r, e, epath, "bandwidth", Q_BYTE_RATE, 1,
                                             "bandwidth = \"3 GB/s\"; (payload bytes a second)",
                                             &m->bytes_per_s)))
                return rc;
        }
        out->nmeasured[op] = config_setting_length(list);
    }
    return LOOM_OK;
}

static const char *const cluster_names[] = {
    "name",     "nodes",            "ranks_per_node", "device", "device_memory",
    "host_memory", "peak",          "memory_bandwidth", "intra", "inter",
    "nvme_bandwidth", "measured",   NULL};

static int read_cluster(reader *r, loom_plan_cluster *out)
{
    const config_setting_t *root = config_root_setting(&r->cfg);
    static const char *const top[] = {"cluster", NULL};
    int rc = check_names(r, root, "(top level)", top);
    if (rc)
        return rc;
    config_setting_t *c = config_setting_get_member(root, "cluster");
    if (!c || !config_setting_is_group(c))
        return fail_at(r, c, "cluster", "%s; a cluster file is one group, cluster = { name = "
                       "\"...\"; ... }; (see docs/plan.md)",
                       c ? "is not a group" : "missing");
    if ((rc = check_names(r, c, "cluster", cluster_names)))
        return rc;

    config_setting_t *s;
    if ((rc = require(r, c, "cluster", "name", "name = \"what the cluster is\";", &s)))
        return rc;
    if (config_setting_type(s) != CONFIG_TYPE_STRING || !*config_setting_get_string(s) ||
        strlen(config_setting_get_string(s)) >= sizeof out->name)
        return fail_at(r, s, "cluster.name", "expected a string of 1 to %zu characters; found %s",
                       sizeof out->name - 1,
                       config_setting_type(s) == CONFIG_TYPE_STRING ? "an empty or longer one"
                                                                    : type_name(s));
    snprintf(out->name, sizeof out->name, "%s", config_setting_get_string(s));

    if ((rc = read_int(r, c, "cluster", "nodes", "nodes = 1; (0: as many as the mesh needs)", 0,
                       &out->nodes)) ||
        (rc = read_int(r, c, "cluster", "ranks_per_node",
                       "ranks_per_node = 8; (GPUs per node, or CPU ranks)", 1,
                       &out->ranks_per_node)))
        return rc;

    if ((rc = require(r, c, "cluster", "device",
                      "device = true; (ranks compute on GPUs) or device = false; (on host cores)",
                      &s)))
        return rc;
    if (config_setting_type(s) != CONFIG_TYPE_BOOL)
        return fail_at(r, s, "cluster.device", "expected true or false; found %s", type_name(s));
    out->device = config_setting_get_bool(s);

    s = config_setting_get_member(c, "device_memory");
    if (out->device) {
        if ((rc = read_required_quantity(r, c, "cluster", "device_memory", Q_BYTES, 1,
                                         "device_memory = \"80 GiB\"; (memory per GPU)",
                                         &out->device_bytes)))
            return rc;
    } else if (s) {
        return fail_at(r, s, "cluster.device_memory", "does nothing when cluster.device = false "
                       "(ranks on host cores keep everything in host_memory); remove it, or set "
                       "device = true");
    }
    if ((rc = read_required_quantity(r, c, "cluster", "host_memory", Q_BYTES, 1,
                                     "host_memory = \"2 TiB\"; (memory per node)",
                                     &out->host_bytes)))
        return rc;
    if ((rc = read_peak(r, c, out)))
        return rc;
    if ((rc = read_required_quantity(r, c, "cluster", "memory_bandwidth", Q_BYTE_RATE, 1,
                                     "memory_bandwidth = \"3.35 TB/s\"; (per rank, reads + "
                                     "writes)",
                                     &out->memory_bytes_per_s)))
        return rc;
    if ((rc = read_link(r, c, "intra", "intra = { latency = \"2 us\"; bandwidth = \"450 GB/s\"; "
                        "}; (inside a node)", &out->intra)) ||
        (rc = read_link(r, c, "inter", "inter = { latency = \"5 us\"; bandwidth = \"50 GB/s\"; "
                        "}; (across nodes, per rank; on one node, the same as intra)",
                        &out->inter)))
        return rc;
    rc = read_quantity(r, c, "cluster", "nvme_bandwidth", Q_BYTE_RATE, 1, &out->nvme_bytes_per_s);
    if (rc && rc != LOOM_ERR_NOT_FOUND)
        return rc;
    return read_measured(r, c, out);
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *grown = realloc(text, cap);
            if (!grown) {
                free(text);
                fclose(f);
                errno = ENOMEM;
                return NULL;
            }
            text = grown;
        }
        size_t got = fread(text + len, 1, 4096, f);
        len += got;
        if (got < 4096)
            break;
    }
    int failed = ferror(f);
    fclose(f);
    if (failed) {
        free(text);
        errno = EIO;
        return NULL;
    }
    text[len] = '\0';
    return text;
}

int loom_plan_cluster_read(const char *path, loom_plan_cluster *out)
{
    memset(out, 0, sizeof *out);
    reader r = {.path = path};
    if (!(r.text = read_text(path)))
        return loom_fail(LOOM_ERR_NOT_FOUND, "cannot read cluster file '%s': %s; give a file "
                         "like examples/clusters/dgx-h100.cfg", path, strerror(errno));
    config_init(&r.cfg);
    int rc;
    if (!config_read_string(&r.cfg, r.text))
        rc = loom_fail(LOOM_ERR_INVALID, "%s:%d: syntax error (libconfig: %s)", path,
                       config_error_line(&r.cfg), config_error_text(&r.cfg));
    else
        rc = read_cluster(&r, out);
    config_destroy(&r.cfg);
    free(r.text);
    if (rc == LOOM_OK)
        snprintf(out->path, sizeof out->path, "%s", path);
    else
        memset(out, 0, sizeof *out);
    return rc;
}

/* ---- writing ---- */

static const char *note_for(const loom_plan_cluster_note *notes, int nnotes, const char *field)
{
    for (int i = 0; i < nnotes; i++)
        if (notes[i].field && notes[i].text && !strcmp(notes[i].field, field))
            return notes[i].text;
    return NULL;
}

/* text as "# " lines at indent: a field's meaning, then its note. */
static void comment(FILE *f, const char *indent, const char *text)
{
    while (text && *text) {
        const char *eol = strchr(text, '\n');
        int len = eol ? (int)(eol - text) : (int)strlen(text);
        fprintf(f, "%s#%s%.*s\n", indent, len ? " " : "", len, text);
        text = eol ? eol + 1 : NULL;
    }
}

typedef struct writer {
    FILE *f;
    const loom_plan_cluster_note *notes;
    int nnotes;
} writer;

static void field_comment(const writer *w, const char *indent, const char *field,
                          const char *meaning)
{
    comment(w->f, indent, meaning);
    comment(w->f, indent, note_for(w->notes, w->nnotes, field));
}

static void quantity_line(const writer *w, const char *field, const char *meaning, double v,
                          quantity_kind kind)
{
    char text[96];
    format_quantity(v, kind, text, sizeof text);
    field_comment(w, "  ", field, meaning);
    fprintf(w->f, "  %s = \"%s\";\n", field, text);
}

static void link_lines(const writer *w, const char *field, const char *meaning,
                       const loom_plan_link *l)
{
    char latency[96], bandwidth[96];
    format_quantity(l->latency_s, Q_TIME, latency, sizeof latency);
    format_quantity(l->bytes_per_s, Q_BYTE_RATE, bandwidth, sizeof bandwidth);
    field_comment(w, "  ", field, meaning);
    fprintf(w->f, "  %s = { latency = \"%s\"; bandwidth = \"%s\"; };\n", field, latency,
            bandwidth);
}

/* The name, quoted for libconfig: quotes and backslashes escaped,
 * control characters as spaces. */
static void write_name(const writer *w, const loom_plan_cluster *c)
{
    char name[2 * sizeof c->name];
    size_t n = 0;
    for (const char *p = c->name; *p && n + 2 < sizeof name; p++) {
        if (*p == '"' || *p == '\\')
            name[n++] = '\\';
        name[n++] = (unsigned char)*p < 0x20 ? ' ' : *p;
    }
    name[n] = '\0';
    field_comment(w, "  ", "name", NULL);
    fprintf(w->f, "  name = \"%s\";\n", name);
}

/* The peak rates by precision, those the cluster has. */
static void write_peak(const writer *w, const double *flops)
{
    fprintf(w->f, "  peak = {");
    for (int i = 0; peak_names[i]; i++) {
        double v = flops[peak_dtypes[i]];
        if (v <= 0)
            continue;
        char text[96];
        format_quantity(v, Q_FLOP_RATE, text, sizeof text);
        fprintf(w->f, " %s = \"%s\";", peak_names[i], text);
    }
    fprintf(w->f, " };\n");
}

/* The collectives --calibrate measured, by op and ranks; none: nothing. */
static void write_measured(const writer *w, const loom_plan_cluster *c)
{
    FILE *f = w->f;
    int any = 0;
    for (int op = 0; op < LOOM_OP_COUNT; op++)
        any |= c->nmeasured[op] > 0;
    if (!any)
        return;
    field_comment(w, "  ", "measured",
                  "Collectives measured inside one node: seconds = latency + bytes / "
                  "bandwidth, bytes\nbeing the payload as loom's comm counters count it. "
                  "They replace the link model\nfor that op inside a node.");
    fprintf(f, "  measured = {\n");
    for (int op = 0; op < LOOM_OP_COUNT; op++) {
        if (c->nmeasured[op] <= 0)
            continue;
        const char *opname = loom_comm_op_name((loom_comm_op)op);
        char field[64];
        snprintf(field, sizeof field, "measured.%s", opname);
        field_comment(w, "    ", field, NULL);
        fprintf(f, "    %s = (", opname);
        for (int i = 0; i < c->nmeasured[op] && i < LOOM_PLAN_MEASURED_MAX; i++) {
            const loom_plan_measured *m = &c->measured[op][i];
            char latency[96], bandwidth[96];
            format_quantity(m->latency_s, Q_TIME, latency, sizeof latency);
            format_quantity(m->bytes_per_s, Q_BYTE_RATE, bandwidth, sizeof bandwidth);
            fprintf(f, "%s{ ranks = %d; latency = \"%s\"; bandwidth = \"%s\"; }",
                    i ? ",\n      " : " ", m->ranks, latency, bandwidth);
        }
        fprintf(f, " );\n");
    }
    fprintf(f, "  };\n");
}

int loom_plan_cluster_write_notes(const loom_plan_cluster *c, const char *path,
                                  const loom_plan_cluster_note *notes, int nnotes)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return loom_fail(LOOM_ERR_INVALID, "cannot write cluster file '%s': %s", path,
                         strerror(errno));
    writer w = {f, notes, notes ? nnotes : 0};
    comment(f, "", "A cluster for `loom plan --cluster FILE` (docs/plan.md, \"The cluster "
                   "file\").");
    comment(f, "", note_for(w.notes, w.nnotes, "cluster"));
    fprintf(f, "cluster = {\n");

    write_name(&w, c);
    field_comment(&w, "  ", "nodes", "Nodes; 0: as many as the mesh needs.");
    fprintf(f, "  nodes = %d;\n", c->nodes);
    field_comment(&w, "  ", "ranks_per_node", "Ranks per node: GPUs, or CPU ranks.");
    fprintf(f, "  ranks_per_node = %d;\n", c->ranks_per_node);
    field_comment(&w, "  ", "device",
                  "true: ranks compute on GPUs (device_memory each); false: on host cores.");
    fprintf(f, "  device = %s;\n", c->device ? "true" : "false");
    if (c->device)
        quantity_line(&w, "device_memory", "Memory per GPU.", c->device_bytes, Q_BYTES);
    quantity_line(&w, "host_memory", "Host memory per node.", c->host_bytes, Q_BYTES);

    field_comment(&w, "  ", "peak", "Dense peak per rank by compute precision (train.precision): "
                                    "the rate of the GEMMs.\nA precision left out runs at "
                                    "fp32's rate.");
    write_peak(&w, c->flops);
    quantity_line(&w, "memory_bandwidth",
                  "Bytes per second a rank's non-GEMM kernels read plus write (the roof of "
                  "everything\nbut the matrix products).",
                  c->memory_bytes_per_s, Q_BYTE_RATE);
    link_lines(&w, "intra", "Inside a node: latency per message, bandwidth per rank in each "
                            "direction.", &c->intra);
    link_lines(&w, "inter", "Across nodes: latency per message, bandwidth per rank in each "
                            "direction.", &c->inter);
    if (c->nvme_bytes_per_s > 0)
        quantity_line(&w, "nvme_bandwidth", "NVMe bandwidth per node (memory.offload = "
                      "\"nvme\").", c->nvme_bytes_per_s, Q_BYTE_RATE);

    write_measured(&w, c);
    fprintf(f, "};\n");
    if (fclose(f))
        return loom_fail(LOOM_ERR_INVALID, "cannot write cluster file '%s': %s", path,
                         strerror(errno));
    return LOOM_OK;
}

int loom_plan_cluster_write(const loom_plan_cluster *c, const char *path)
{
    return loom_plan_cluster_write_notes(c, path, NULL, 0);
}
