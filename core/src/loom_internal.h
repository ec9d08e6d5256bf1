/* loom core — contracts between the core's own modules. Not installed.
 *
 * Error convention inside the core: a function returns a loom_status; on
 * failure it has recorded one line of detail with loom_fail(), which the CLI
 * prints as it is. The detail says what is wrong, where, and what to do. */
#ifndef LOOM_INTERNAL_H
#define LOOM_INTERNAL_H

#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>

#include "loom/comm.h"
#include "loom/memtier.h"
#include "loom/plugin.h"
#include "loom/strategy.h"

#define LOOM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---------------------------------------------------------------- log.c */

void loom_log_set_rank(int rank);            /* prefix for every line; -1: none */
void loom_log_set_level(loom_log_level level);
loom_log_level loom_log_get_level(void);
void loom_log(loom_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void loom_vlog(loom_log_level level, const char *who, const char *fmt, va_list ap);
/* Record the calling thread's error detail (one line) and return status. */
int loom_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int loom_vfail(int status, const char *fmt, va_list ap);
const char *loom_last_error(void); /* "" when none */
void loom_clear_error(void);
uint64_t loom_now_ns(void); /* CLOCK_MONOTONIC */

/* ------------------------------------------------------------- config.c */

/* A parsed, validated job config (DESIGN §9). Every setting the core knows
 * has a schema entry (type, default, allowed values); groups owned by
 * plugins (comm.<backend>, the extra settings of parallel.<axis>,
 * memory.offload) are validated when the plugin loads, against its
 * loom_setting_spec list. Paths use dots: "parallel.dp.size". */
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
/* "examples/bench.cfg:12", "--set bench.iters=5", or "default". Static
 * buffer per thread. */
const char *loom_config_where(const loom_config *cfg, const char *path);
const char *loom_config_file(const loom_config *cfg); /* NULL without a file */

/* Validate the group at group_path against a plugin's settings (unknown
 * names, types; "did you mean"), remembering specs so the typed reads below
 * return the defaults of unset settings. An absent group is all defaults.
 * skip lists names in the group the core owns ("size", "strategy"). */
int loom_config_check_group(loom_config *cfg, const char *group_path,
                            const loom_setting_spec *specs, const char *const *skip);

/* ---------------------------------------------------------- bootstrap.c */

/* Rank and size from the launcher's environment: LOOM_RANK/LOOM_WORLD_SIZE,
 * OMPI_COMM_WORLD_*, PMI_RANK/PMI_SIZE, SLURM_PROCID/SLURM_NTASKS,
 * RANK/WORLD_SIZE; a lone process is rank 0 of 1. */
typedef struct loom_launch_env {
    int rank, world_size, local_rank, local_size;
    const char *source; /* "LOOM", "OMPI", "PMI", "SLURM", "torchrun", "none" */
} loom_launch_env;
int loom_bootstrap_detect(loom_launch_env *out);

/* The TCP key-value store rank 0 serves (a thread in rank 0). The address is
 * MASTER_ADDR/MASTER_PORT, else LOOM_STORE_ADDR/LOOM_STORE_PORT, else
 * 127.0.0.1 and a port derived from the launcher's job id (20000-31999,
 * below the ephemeral range). Every blocking call takes a timeout and, on
 * expiry, says what it waited for and which ranks did not arrive. */
typedef struct loom_store loom_store;
int loom_store_open(const loom_launch_env *env, double timeout_s, loom_store **out);
void loom_store_close(loom_store *store);
int loom_store_put(loom_store *s, const char *key, const void *value, size_t len);
/* Waits until key exists. *len gets the stored length (even if > cap). */
int loom_store_get(loom_store *s, const char *key, void *buf, size_t cap, size_t *len,
                   double timeout_s);
int loom_store_add(loom_store *s, const char *key, int64_t delta, int64_t *result);
/* All world ranks; a timeout names the ranks that did not arrive. */
int loom_store_barrier(loom_store *s, const char *name, double timeout_s);
/* "rank 2" or "ranks 0, 1, 3" (long lists end in "... (N more)"), the one
 * way every message names a set of ranks. Returns n. */
int loom_format_ranks(char *buf, size_t cap, const int *ranks, int n);

/* ------------------------------------------------------------- loader.c */

typedef struct loom_plugin {
    void *dl;
    char *path;
    loom_plugin_kind kind;
    const loom_plugin_header *header; /* also the vtable: cast by kind */
} loom_plugin;

/* The directories plugins are looked up in, in order: plugins.path from the
 * config, then LOOM_PLUGIN_PATH (colon-separated), then the folder "loom"
 * next to libloom.so (build/lib/loom, <prefix>/lib/loom), then the install
 * dir. */
typedef struct loom_search_path {
    int count;
    char **dirs;
} loom_search_path;
int loom_search_path_init(loom_search_path *sp, const loom_config *cfg /* nullable */);
void loom_search_path_free(loom_search_path *sp);

/* Find and check a plugin; name is a short name ("mpi") or, with a '/', a
 * file path. Every refusal is one line naming the file, what was found and
 * what was wanted. */
int loom_plugin_load(const loom_search_path *sp, loom_plugin_kind kind, const char *name,
                     loom_plugin **out);
void loom_plugin_unload(loom_plugin *p);
/* Whether the optional op at byte offset `offset` of the plugin struct is
 * present (offset < struct_size and the pointer non-NULL). */
int loom_plugin_has_op(const loom_plugin *p, size_t offset);
#define LOOM_HAS_OP(plugin, type, member)                                             \
    loom_plugin_has_op((plugin), offsetof(type, member))

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
/* Load the file at path as a plugin of kind, every check of DESIGN §2 in
 * turn. expect_name NULL: the name the file's name carries, when it reads
 * libloom-<kind>-<name>.so. checks is nullable. */
int loom_plugin_load_file(const char *path, loom_plugin_kind kind, const char *expect_name,
                          loom_plugin_checks *checks, loom_plugin **out);
/* Split a file name (any directory part is ignored) that reads
 * libloom-<kind>-<name>.so into its kind and name texts; 0 when it does not.
 * loom_plugin_kind_of maps "comm" to LOOM_PLUGIN_COMM, and so on; 0 for a
 * kind loom does not know. */
int loom_plugin_parse_file_name(const char *path, char *kind, size_t kind_cap, char *name,
                                size_t name_cap);
uint32_t loom_plugin_kind_of(const char *kind_name);

/* ------------------------------------------------------------ runtime.c */

/* One per process: config, launch env, bootstrap store, search path, the
 * loaded plugins, memory accounting, trace. */
typedef struct loom_runtime loom_runtime;
int loom_runtime_create(loom_config *cfg, loom_runtime **out);
void loom_runtime_destroy(loom_runtime *rt);
const loom_launch_env *loom_runtime_env(const loom_runtime *rt);
loom_config *loom_runtime_config(loom_runtime *rt);
loom_store *loom_runtime_store(loom_runtime *rt); /* NULL for a world of one */
const loom_search_path *loom_runtime_search_path(const loom_runtime *rt);
double loom_runtime_timeout(const loom_runtime *rt); /* comm.timeout_s */
/* A host table for a plugin instance, its settings read from config group
 * group_path (validated there against the plugin's specs). Owned by rt. */
int loom_runtime_host(loom_runtime *rt, const loom_plugin *plugin, const char *group_path,
                      const loom_host **out);
/* Load a plugin once per runtime (cached by kind and name; unloaded at
 * destroy). */
int loom_runtime_plugin(loom_runtime *rt, loom_plugin_kind kind, const char *name,
                        const loom_plugin **out);

/* -------------------------------------------------------------- group.c */

/* The world group over backend `name` ("mpi", "ucx", "nccl", "self"). */
int loom_group_world(loom_runtime *rt, const char *backend, loom_group **out);
/* Collective over parent: see loom_comm_plugin_v1_t.create_subgroup. A list
 * of one rank gives a self group without calling the backend. */
int loom_group_subgroup(loom_group *parent, const int *ranks, int nranks, loom_group **out);
/* A group of this rank alone, over the built-in self communicator. */
int loom_group_self(loom_runtime *rt, loom_group **out);
void loom_group_destroy(loom_group *g);
extern const loom_comm_api loom_core_comm_api;

/* Bytes this rank sent per op since the group was made (payload bytes the
 * algorithm-independent way: what the op's definition moves). */
typedef struct loom_comm_counters {
    uint64_t calls[LOOM_OP_COUNT];
    uint64_t bytes[LOOM_OP_COUNT];
} loom_comm_counters;
void loom_group_counters(const loom_group *g, loom_comm_counters *out);

/* --------------------------------------------------------------- mesh.c */

typedef struct loom_mesh {
    int sizes[LOOM_AXIS_COUNT];
    int coords[LOOM_AXIS_COUNT];
    loom_group *world;
    loom_group *groups[LOOM_AXIS_COUNT];
} loom_mesh;
/* From parallel.<axis>.size and comm.default / comm.<axis>. */
int loom_mesh_create(loom_runtime *rt, loom_mesh **out);
void loom_mesh_destroy(loom_mesh *mesh);
/* Pure layout helpers (tp innermost, then sp, pp, dp). */
int loom_mesh_rank_of(const int sizes[LOOM_AXIS_COUNT], const int coords[LOOM_AXIS_COUNT]);
void loom_mesh_coords_of(const int sizes[LOOM_AXIS_COUNT], int rank, int coords[LOOM_AXIS_COUNT]);

/* ------------------------------------------------------------- memory.c */

/* Accounted allocation by tier and purpose, for the core and (through the
 * host table) plugins. */
int loom_mem_alloc(loom_tier tier, loom_purpose purpose, size_t bytes, void **out);
void loom_mem_free(void *ptr);
typedef struct loom_mem_usage {
    uint64_t current[LOOM_TIER_COUNT][LOOM_PURPOSE_COUNT];
    uint64_t peak[LOOM_TIER_COUNT][LOOM_PURPOSE_COUNT];
    uint64_t peak_total[LOOM_TIER_COUNT]; /* peak of the tier's sum, not a sum of peaks */
} loom_mem_usage;
void loom_mem_usage_get(loom_mem_usage *out);
void loom_mem_usage_reset_peak(void);

/* ------------------------------------------------------------- device.c */

/* The CUDA device tier (DESIGN §6), defined only in builds with CUDA
 * (LOOM_HAVE_CUDA); callers guard their use with that macro. Device and
 * pinned blocks live on the calling thread's current CUDA device (comm-nccl
 * selects it when it makes its world: the local rank, or comm.nccl.device).
 * Without a usable GPU every call fails with one line that says why. */

/* LOOM_OK when a CUDA device is visible, else fails with "no CUDA device
 * visible (cudaGetDeviceCount: <CUDA's text>)" or why the runtime did not load. */
int loom_device_available(void);
/* Raw device (cudaMalloc) or pinned host (cudaMallocHost) memory; memory.c
 * does the accounting. loom_device_free releases a block of ours and says
 * what it was (returns 1), or returns 0 for a pointer it does not know. */
int loom_device_alloc(loom_tier tier, loom_purpose purpose, size_t bytes, void **out);
int loom_device_free(void *ptr, loom_tier *tier, loom_purpose *purpose, uint64_t *bytes);

/* Asynchronous copies between host and device memory (either way, or device
 * to device), ordered on a stream, each with a completion event. A NULL
 * stream is CUDA's default stream. */
typedef struct loom_device_stream loom_device_stream;
typedef struct loom_device_event loom_device_event;
int loom_device_stream_create(loom_device_stream **out);
void loom_device_stream_destroy(loom_device_stream *stream);
int loom_device_copy_async(void *dst, const void *src, size_t bytes, loom_device_stream *stream,
                           loom_device_event **done);
/* LOOM_OK when the copy is done (the event is released), LOOM_IN_PROGRESS,
 * or an error (released). wait polls until done or timeout_s. */
int loom_device_event_test(loom_device_event *event);
int loom_device_event_wait(loom_device_event *event, double timeout_s);
/* copy_async + wait on the default stream, bounded by timeout_s. */
int loom_device_copy(void *dst, const void *src, size_t bytes, double timeout_s);

/* -------------------------------------------------------------- trace.c */

/* Spans on the Chrome/Perfetto timeline (one process per rank, one thread
 * per lane), recorded only after loom_trace_enable(). */
void loom_trace_enable(int rank);
void loom_trace_span(loom_trace_lane lane, const char *name, uint64_t start_ns,
                     uint64_t end_ns, uint64_t bytes);
/* Each rank writes its part (one event per line); rank 0 merges the parts
 * into one Chrome/Perfetto JSON file and removes them. */
int loom_trace_write_part(const char *path);
int loom_trace_merge(const char *path, const char *const *parts, int nparts);

/* ----------------------------------------------------------- commands */

int loom_cmd_plugins(int argc, char **argv);
int loom_cmd_launch(int argc, char **argv);
int loom_cmd_bench(int argc, char **argv);
int loom_cmd_ckpt(int argc, char **argv);
int loom_cmd_settings(int argc, char **argv);
int loom_cmd_train(int argc, char **argv);

#endif
