/* loom runtime — The job config: schema, typed reads, plugin settings groups. */
#ifndef LOOM_RUNTIME_CONFIG_H
#define LOOM_RUNTIME_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "loom/plugin.h"

/* A parsed, validated job config (the README's Configuration). Every setting the core knows
 * has a schema entry (type, default, allowed values): the runtime's own
 * below, and those each layer above adds for itself (loom_config_add_settings).
 * Groups owned by plugins (comm.<backend>, the extra settings of
 * parallel.<axis>) are validated when the plugin loads, against its
 * loom_setting_spec list. Settings reserved for a later release are refused
 * when a config sets them. Paths use dots: "parallel.dp.size". */
typedef struct loom_config loom_config;

/* ------------------------------------------------------------ schemas */

typedef enum loom_config_type {
    LOOM_CFG_INT = 1,
    LOOM_CFG_FLOAT,
    LOOM_CFG_BOOL,
    LOOM_CFG_STRING,
    LOOM_CFG_STRINGS, /* a list of strings: [ "a", "b" ] */
    LOOM_CFG_INTS,    /* a list of integers */
    LOOM_CFG_GLOBS,   /* files: a path or glob pattern, or a list of them */
} loom_config_type;

/* The rules of a setting (its flags). */
enum {
    LOOM_CFG_NONEMPTY = 1 << 0, /* strings (and list elements) must not be "" */
    LOOM_CFG_REQUIRED = 1 << 1, /* no default: the user must give it */
    LOOM_CFG_GE = 1 << 2,       /* value >= lo (for lists: each element) */
    LOOM_CFG_GT = 1 << 3,       /* value > lo */
    LOOM_CFG_LE = 1 << 4,       /* value <= hi */
    LOOM_CFG_LT = 1 << 5,       /* value < hi */
    LOOM_CFG_SOME = 1 << 6,     /* a list with at least one element */
    LOOM_CFG_WIDE = 1 << 7,     /* an integer read into int64_t; without it, into int */
};

typedef struct loom_config_setting {
    const char *path;
    loom_config_type type;
    /* The default as a user would write it; strings need no quotes and lists
     * of strings may be written "a, b". NULL for a required setting. */
    const char *def;
    const char *const *choices; /* NULL-ended; for strings and string-list elements */
    double lo, hi;
    int flags;
    const char *help;
} loom_config_setting;

#define LOOM_CFG_SETTING(path_, type_, def_, ...)                                                  \
    {                                                                                              \
        .path = (path_), .type = (type_), .def = (def_), __VA_ARGS__                               \
    }

/* The settings of one layer, and the relations between them that no single
 * value shows: check runs once every value of the config is valid, and
 * refuses with loom_config_fail_relation (NULL: no relations). */
typedef struct loom_config_settings {
    const loom_config_setting *settings;
    size_t count;
    int (*check)(const loom_config *cfg);
} loom_config_settings;

/* The runtime's own settings: where plugins are found (plugins.*), and how
 * the job runs (parallel.*, comm.*, memory.*). Every config has them; a
 * program that adds them itself chooses where they are listed. */
extern const loom_config_settings loom_config_plugin_settings;
extern const loom_config_settings loom_config_runtime_settings;

/* Add a layer's settings to every config loaded from now on, listed after
 * those added before (adding them again changes nothing). Call it before
 * the first config is loaded, from one thread. */
int loom_config_add_settings(const loom_config_settings *settings);

/* Refuse path for its relation to other: "where: path: detail", where is
 * the place path was set, else the place other was (a default has none),
 * else the config itself. Returns LOOM_ERR_INVALID. */
int loom_config_fail_relation(const loom_config *cfg, const char *path, const char *other,
                              const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* ------------------------------------------------------------ configs */

/* path may be NULL: only defaults and overrides. overrides are "path=value"
 * strings from --set, parsed as libconfig values (a bare word is a string). */
int loom_config_load(const char *path, const char *const *overrides, int noverrides,
                     loom_config **out);
/* The same from text in memory; name is used in messages in place of a file. */
int loom_config_parse(const char *text, const char *name, const char *const *overrides,
                      int noverrides, loom_config **out);
void loom_config_free(loom_config *cfg);

/* Typed reads; a path the schema knows always succeeds (default if unset).
 * LOOM_ERR_NOT_FOUND for a path neither set nor in the schema. */
int loom_config_int(const loom_config *cfg, const char *path, int64_t *out);
int loom_config_float(const loom_config *cfg, const char *path, double *out);
int loom_config_bool(const loom_config *cfg, const char *path, int *out);
int loom_config_string(const loom_config *cfg, const char *path, const char **out);
/* Lists of strings ("plugins.path"): -1 when absent. */
int loom_config_list_len(const loom_config *cfg, const char *path);
const char *loom_config_list_string(const loom_config *cfg, const char *path, int index);
int loom_config_is_set(const loom_config *cfg, const char *path);
/* Every setting the core knows: path, type, default, help, allowed values
 * (`loom settings`). */
void loom_config_print_schema(FILE *f);
/* Why path (a setting or a group) is refused for now, e.g. "offload-nvme is
 * a later release"; NULL for a path that is implemented. */
const char *loom_config_not_implemented(const char *path);
/* "examples/bench.cfg:12", "--set comm.timeout_s=30", the source of a derived
 * value ("gpt2.bin's header"), or "default". Static buffer per thread. */
const char *loom_config_where(const loom_config *cfg, const char *path);
const char *loom_config_file(const loom_config *cfg); /* NULL without a file */
/* An integer setting the config leaves unset takes value from elsewhere
 * (model.layers from a checkpoint's header): reads return it, is_set stays
 * false, and where names source. */
int loom_config_derive_int(loom_config *cfg, const char *path, int64_t value, const char *source);
/* Every setting's value as the job sees it, and where it comes from (`loom
 * settings CONFIG`). */
void loom_config_print_values(const loom_config *cfg, FILE *f);

/* A plugin setting's rules as `loom settings` prints them: "a | b",
 * ">= 1", "0 <= x < 1"; "" when it has none. */
void loom_config_spec_rules(const loom_setting_spec *spec, char *buf, size_t cap);
/* The names the file and --set give directly under group_path, in order
 * (index 0, 1, ...; NULL past the last, or when there is no such group). */
const char *loom_config_child_name(const loom_config *cfg, const char *group_path, int index);
/* Whether path (a setting or a group) is the core's own, so that no plugin
 * may declare a setting of that name. */
int loom_config_core_owns(const char *path);

/* Refuse the first setting of the group at group_path that the core does
 * not own, for a plugin group whose plugin the job does not load: why says
 * so ("only the nvme tier reads it, and nothing is offloaded to nvme"). */
int loom_config_refuse_unused_group(const loom_config *cfg, const char *group_path,
                                    const char *why);
/* Validate the group at group_path against a plugin's settings (unknown
 * names, types; "did you mean"), remembering specs so the typed reads below
 * return the defaults of unset settings. An absent group is all defaults.
 * skip lists names in the group the core owns ("size", "strategy"). */
int loom_config_check_group(loom_config *cfg, const char *group_path,
                            const loom_setting_spec *specs, const char *const *skip);

#endif
