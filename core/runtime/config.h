/* loom runtime — The job config: schema, typed reads, plugin settings groups. */
#ifndef LOOM_RUNTIME_CONFIG_H
#define LOOM_RUNTIME_CONFIG_H

#include <stdint.h>
#include <stdio.h>
#include "loom/plugin.h"

/* A parsed, validated job config (the README's Configuration). Every setting the core knows
 * has a schema entry (type, default, allowed values); groups owned by
 * plugins (comm.<backend>, the extra settings of parallel.<axis>) are
 * validated when the plugin loads, against its loom_setting_spec list.
 * Settings reserved for a later release (data.val) are
 * refused when a config sets them. Paths use dots: "parallel.dp.size". */
typedef struct loom_config loom_config;

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
/* Lists of strings ("plugins.path", "bench.comms"): -1 when absent. */
int loom_config_list_len(const loom_config *cfg, const char *path);
const char *loom_config_list_string(const loom_config *cfg, const char *path, int index);
int loom_config_is_set(const loom_config *cfg, const char *path);
/* Every setting the core knows: path, type, default, help, allowed values
 * (`loom settings`). */
void loom_config_print_schema(FILE *f);
/* Why path (a setting or a group) is refused for now, e.g. "offload-nvme is
 * a later release"; NULL for a path that is implemented. */
const char *loom_config_not_implemented(const char *path);
/* "examples/bench.cfg:12", "--set bench.iters=5", the source of a derived
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
