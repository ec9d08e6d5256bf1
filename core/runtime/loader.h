/* loom runtime — Finding, loading and checking plugins. */
#ifndef LOOM_RUNTIME_LOADER_H
#define LOOM_RUNTIME_LOADER_H

#include <stddef.h>
#include <stdint.h>
#include "loom/plugin.h"
#include "runtime/config.h"

/* The core's one view of each kind of plugin: the newest ABI's struct,
 * filled at load from whatever minor the plugin was built for. Members past
 * an older plugin's struct_size are zero (an absent optional op is NULL),
 * and optional ops whose absence means "nothing to do" hold the core's
 * no-op, so callers call them unconditionally. A strategy's
 * data_grad_norm_sq and data_zero_grads stay NULL when absent: their
 * default works on the units, which only the trainer has. Only the loader names the
 * versioned types; a new major adds an adapter here and nowhere else (as
 * NCCL's ncclNet_t stands for its newest ncclNet_vN_t). */
#include "loom/comm.h"
#include "loom/compute.h"
#include "loom/memtier.h"
#include "loom/schedule.h"
#include "loom/strategy.h"
typedef loom_comm_plugin_v1_t loom_comm_ops;
typedef loom_strategy_plugin_v1_t loom_strategy_ops;
typedef loom_memtier_plugin_v1_t loom_memtier_ops;
typedef loom_schedule_plugin_v1_t loom_schedule_ops;
typedef loom_compute_plugin_v1_t loom_compute_ops;

/* The optional ops, one bit each in loom_plugin.provided: set when the
 * plugin's own struct has the op non-NULL within its struct_size. The ops
 * table cannot say, since the loader puts the core's defaults where a
 * plugin has none. */
typedef enum loom_optional_op {
    LOOM_OPTIONAL_COMM_GROUP_START,
    LOOM_OPTIONAL_COMM_GROUP_END,
    LOOM_OPTIONAL_COMM_MEM_REGISTER,
    LOOM_OPTIONAL_COMM_MEM_DEREGISTER,
    LOOM_OPTIONAL_COMM_ABORT,
    LOOM_OPTIONAL_COMM_INNER,
    LOOM_OPTIONAL_DATA_BEFORE_FORWARD,
    LOOM_OPTIONAL_DATA_AFTER_FORWARD,
    LOOM_OPTIONAL_DATA_BEFORE_BACKWARD,
    LOOM_OPTIONAL_DATA_GRADS_READY,
    LOOM_OPTIONAL_DATA_FINISH_BACKWARD,
    LOOM_OPTIONAL_DATA_GRAD_NORM_SQ,
    LOOM_OPTIONAL_DATA_ZERO_GRADS,
    LOOM_OPTIONAL_DATA_GET_STATE,
    LOOM_OPTIONAL_DATA_SET_STATE,
    LOOM_OPTIONAL_DATA_GET_SHARD,
    LOOM_OPTIONAL_DATA_EVAL,
    LOOM_OPTIONAL_DATA_REPLICA_STATE,
    LOOM_OPTIONAL_SEQUENCE_POSITIONS,
    LOOM_OPTIONAL_PIPELINE_BUBBLE,
    LOOM_OPTIONAL_MEMTIER_ADDRESS,
    LOOM_OPTIONAL_MEMTIER_PREFETCH,
    LOOM_OPTIONAL_SCHEDULE_BUBBLE,
    LOOM_OPTIONAL_SCHEDULE_BUBBLE_WITH_SETTINGS,
    LOOM_OPTIONAL_COMPUTE_PROBE,
    LOOM_OPTIONAL_COMPUTE_NATIVE_QUEUE,
    LOOM_OPTIONAL_COUNT
} loom_optional_op;

/* What the ABI minor a plugin was built for promises beyond its ops, one bit
 * each in loom_plugin.features. */
typedef enum loom_plugin_feature {
    /* 1.3: its settings list carries allowed values and bounds */
    LOOM_FEATURE_SETTING_RULES = 1u << 0,
    /* 1.6, a strategy: it steps master weights through update_range (or,
     * 1.7, update_range_store), which tell the core which tensors a range
     * holds; before, through update, which cannot */
    LOOM_FEATURE_UPDATE_RANGE = 1u << 1,
    /* 1.9, a strategy: it reaches the model's buffers only through
     * host->compute and host->comm, so they may live on a device */
    LOOM_FEATURE_DEVICE_BUFFERS = 1u << 2,
} loom_plugin_feature;

typedef struct loom_plugin {
    void *dl; /* NULL for a plugin only read (loom_plugin_read_file) */
    /* A plugin only read: its file's segments, copied and relocated into
     * memory that is never executable. Its ops describe the plugin (NULL or
     * not, and the data members) but must never be called. */
    void *image;
    size_t image_size;
    char *path;
    loom_plugin_kind kind;
    /* The kind of struct the file exports: kind, or LOOM_PLUGIN_STRATEGY
     * for a schedule built before ABI 1.8 as a strategy of the pp axis,
     * which the loader adapts (loom_plugin_schedule_build). */
    loom_plugin_kind built_as;
    /* The plugin's own struct, as exported; the loader's alone: what
     * others need of it is recorded below. */
    const loom_plugin_header *exported;
    /* The normalised copy; header is &ops.<kind>.header. */
    const loom_plugin_header *header;
    /* 1 << loom_optional_op for each optional op the plugin provides. */
    uint64_t provided;
    uint32_t features; /* loom_plugin_feature bits */
    char built_for[16]; /* the ABI it was built for, as "1.7", for messages */
    /* The settings list, checked and copied as this loom's loom_setting_spec
     * array ended by {0} (header->settings points here). */
    loom_setting_spec *settings;
    union {
        loom_comm_ops comm;
        loom_strategy_ops strategy;
        loom_memtier_ops memtier;
        loom_schedule_ops schedule;
        loom_compute_ops compute;
    } ops;
    /* A schedule built as a strategy: that struct, normalised, which the
     * adapter calls (ops.schedule has its header and bubble, no build). */
    loom_strategy_ops adapted;
} loom_plugin;

static inline int loom_plugin_provides(const loom_plugin *p, loom_optional_op op)
{
    return (unsigned)op < LOOM_OPTIONAL_COUNT && ((p->provided >> op) & 1u);
}

static inline int loom_plugin_has_feature(const loom_plugin *p, loom_plugin_feature feature)
{
    return (p->features & (uint32_t)feature) != 0;
}

/* "group_start", "data_eval", ...: the op's name in its struct. */
const char *loom_optional_op_name(loom_optional_op op);

/* "1.7" for an abi_version, "-" for 0 (not known). */
void loom_plugin_abi_text(uint32_t abi_version, char *buf, size_t cap);

/* Run a schedule plugin (kind LOOM_PLUGIN_SCHEDULE): its build op, or for
 * one built as a strategy its create (given the shape's pp size and
 * micro-batches), pipeline_schedule and destroy. Every caller goes through
 * this, never ops.schedule.build. */
int loom_plugin_schedule_build(const loom_plugin *p, const loom_host *host,
                               const loom_pipeline_shape *shape);

/* The directories plugins are looked up in, in order: plugins.path from the
 * config (a relative entry taken from the folder of the config file that
 * sets it), then LOOM_PLUGIN_PATH (colon-separated, relative to the current
 * directory), then the folder "loom" beside the running program
 * (build/lib/loom, <prefix>/lib/loom), then the install dir. notes[i] says
 * where a relative entry was taken from (NULL for an absolute one). */
typedef struct loom_search_path {
    int count;
    char **dirs;
    char **notes;
} loom_search_path;
int loom_search_path_init(loom_search_path *sp, const loom_config *cfg /* nullable */);
void loom_search_path_free(loom_search_path *sp);

/* Find and check a plugin; name is a short name ("mpi") or, with a '/', a
 * file path. Every refusal is one line naming the file, what was found and
 * what was wanted. A schedule is looked for in each folder as
 * libloom-schedule-<name>.so, then as libloom-strategy-<name>.so (one built
 * before ABI 1.8, adapted). A plugin that crashes the process while it loads (a
 * corrupt file, or its constructor) is named in one line on stderr before
 * the process dies of the signal. */
int loom_plugin_load(const loom_search_path *sp, loom_plugin_kind kind, const char *name,
                     loom_plugin **out);
void loom_plugin_unload(loom_plugin *p);

/* What one load found, for `loom plugins` and `loom plugins --check`.
 * report (nullable) hears every check as it runs, failure NULL when it
 * passed. After a refusal, reason is the bare cause (no file, no name) and
 * abi_version what the file says it was built for (0: not known). */
typedef struct loom_plugin_checks {
    void (*report)(void *ctx, const char *check, const char *failure);
    void *ctx;
    uint32_t abi_version;
    char reason[768];
} loom_plugin_checks;
/* Load the file at path as a plugin of kind, every check of docs/plugin-guide.md in
 * turn. expect_name NULL: the name the file's name carries, when it reads
 * libloom-<kind>-<name>.so. checks is nullable. */
int loom_plugin_load_file(const char *path, loom_plugin_kind kind, const char *expect_name,
                          loom_plugin_checks *checks, loom_plugin **out);
/* For a process whose parent reports a crash itself (loom plugins --check):
 * no line of its own when a plugin crashes it while loading. */
void loom_plugin_quiet_load_crashes(void);
/* The same checks on the file's own bytes, without dlopen: the exported
 * struct, the strings and the settings list it points to are read from the
 * ELF file's segments, copied and relocated into memory that is never
 * executable, so no code of the file runs (its constructors included). What
 * only the dynamic loader can tell is checked as far as a file can say: an
 * undefined symbol is refused when every library the plugin needs is
 * already loaded and none defines it. The plugin it gives describes the
 * file (for `loom plugins` and `loom settings`); its ops are never to be
 * called. loom_plugin_unload frees it. */
int loom_plugin_read_file(const char *path, loom_plugin_kind kind, const char *expect_name,
                          loom_plugin_checks *checks, loom_plugin **out);
/* The kind of the loom_<kind>_plugin_v1 symbol a file exports, read from its
 * ELF symbol table without loading it; 0 when it exports none. */
uint32_t loom_plugin_kind_in_file(const char *path);
/* A plugin file, and every folder on the way to it, must be writable by its
 * owner only: 0, or -1 with why filled in (the path, its mode and owner,
 * and what to do). */
int loom_plugin_check_permissions(const char *path, char *why, size_t cap);
/* Split a file name (any directory part is ignored) that reads
 * libloom-<kind>-<name>.so into its kind and name texts; 0 when it does not.
 * loom_plugin_kind_of maps "comm" to LOOM_PLUGIN_COMM, and so on; 0 for a
 * kind loom does not know. */
int loom_plugin_parse_file_name(const char *path, char *kind, size_t kind_cap, char *name,
                                size_t name_cap);
uint32_t loom_plugin_kind_of(const char *kind_name);
/* A data strategy serving dp_size > 1 ranks must implement every hook whose
 * core default (no communication) would be wrong there; the refusal names
 * the hook. LOOM_OK for any other plugin or a group of one. */
int loom_plugin_check_dp_size(const loom_plugin *p, int dp_size);
/* The config group a plugin's settings live in: comm.<name> for a
 * communicator, parallel.<axis> for a strategy, parallel.pp for a schedule,
 * memory.offload for a tier, compute.<name> for a compute backend. */
void loom_plugin_settings_group(const loom_plugin *p, char *buf, size_t cap);

/* How the loader tells whether the dynamic loader would find a library a
 * plugin needs, exposed for its tests: whether the system's library cache
 * at cache_path names lib; and adding dir to a colon-separated list of
 * folders of capacity cap unless the list has it already. */
int loom_ld_cache_names(const char *cache_path, const char *lib);
void loom_folder_list_add(char *folders, size_t cap, const char *dir);

#endif
