/* loom — the plugin ABI: the header every plugin struct starts with, the
 * export convention, and the host table the core hands to each plugin.
 *
 * A plugin file is libloom-<kind>-<name>.so and exports exactly one const
 * data symbol, loom_<kind>_plugin_v<MAJOR> (e.g. loom_comm_plugin_v1), whose
 * type is the frozen struct of comm.h, strategy.h, schedule.h, memtier.h or
 * compute.h. Structs only
 * grow at their end (minor versions); the core calls an op only when
 * offsetof(op) < header.struct_size and the pointer is non-NULL. A new major
 * gets a new struct type and symbol name.
 *
 * Plugins link no loom library. Everything they need from the core arrives
 * through the loom_host table passed to their create op.
 *
 * The plugin author's guide — the order of every hook in a step, lifetimes,
 * progress and timeouts, testing and shipping — is docs/plugin-guide.md in
 * the source tree, installed as share/doc/loom/plugin-guide.md. */
#ifndef LOOM_PLUGIN_H
#define LOOM_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "loom/status.h"
#include "loom/tensor.h"

#define LOOM_ABI_MAJOR 1
#define LOOM_ABI_MINOR 10
#define LOOM_ABI_VERSION(major, minor) (((uint32_t)(major) << 16) | (uint32_t)(minor))
#define LOOM_ABI_VERSION_MAJOR(v) ((uint32_t)(v) >> 16)
#define LOOM_ABI_VERSION_MINOR(v) ((uint32_t)(v)&0xffffu)

/* Put this on the one exported symbol; build everything else with
 * -fvisibility=hidden. */
#if defined(__GNUC__)
#define LOOM_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define LOOM_PLUGIN_EXPORT
#endif

typedef enum loom_plugin_kind {
    LOOM_PLUGIN_COMM = 1,
    LOOM_PLUGIN_STRATEGY = 2,
    LOOM_PLUGIN_MEMTIER = 3,
    LOOM_PLUGIN_SCHEDULE = 4, /* since ABI 1.8: pipeline schedules (schedule.h) */
    LOOM_PLUGIN_COMPUTE = 5,  /* since ABI 1.9: compute backends (compute.h) */
} loom_plugin_kind;

static inline const char *loom_plugin_kind_name(uint32_t kind)
{
    switch (kind) {
    case LOOM_PLUGIN_COMM: return "comm";
    case LOOM_PLUGIN_STRATEGY: return "strategy";
    case LOOM_PLUGIN_MEMTIER: return "memtier";
    case LOOM_PLUGIN_SCHEDULE: return "schedule";
    case LOOM_PLUGIN_COMPUTE: return "compute";
    default: return "?";
    }
}

/* A setting a plugin accepts in its own config group (comm.ucx = { ... },
 * parallel.dp = { ... } for a data strategy). The core validates the group
 * against this list before create: unknown names are errors with a
 * suggestion, values are type-checked and held to the rules below (the
 * error names the config file and line), and missing ones take
 * default_value. A name the core itself uses in that group (parallel.dp's
 * size and strategy, say) is refused at load. */
typedef enum loom_setting_type {
    LOOM_SETTING_INT = 1,
    LOOM_SETTING_FLOAT = 2,
    LOOM_SETTING_BOOL = 3,
    LOOM_SETTING_STRING = 4,
} loom_setting_type;

/* loom_setting_spec.bounds: which of min and max hold, and how. */
#define LOOM_SETTING_MIN 1u       /* value >= min */
#define LOOM_SETTING_ABOVE_MIN 2u /* value > min */
#define LOOM_SETTING_MAX 4u       /* value <= max */
#define LOOM_SETTING_BELOW_MAX 8u /* value < max */

/* Write entries with designated initializers and end the list with {0}:
 *   {.name = "servers", .type = LOOM_SETTING_STRING, .default_value = "one",
 *    .help = "who serves the parameters",
 *    .allowed = (const char *const[]){"one", "sharded", NULL}},
 *   {.name = "buckets", .type = LOOM_SETTING_INT, .default_value = "4",
 *    .help = "gradient buckets", .bounds = LOOM_SETTING_MIN, .min = 1},
 *   {0}
 * The struct grows at its end; the header's settings_stride (set by
 * LOOM_PLUGIN_HEADER) tells the core how big it was when the plugin was
 * built, so older plugins keep loading. */
typedef struct loom_setting_spec {
    const char *name;          /* NULL ends the list */
    loom_setting_type type;
    /* the value as text: "4", "0.5", "true", a string bare ("one"; a
     * quoted "\"one\"" reads the same); NULL: required */
    const char *default_value;
    const char *help;          /* one line */
    /* ---- since ABI 1.3: rules the core checks ---- */
    const char *const *allowed; /* STRING: the values allowed, NULL-ended; NULL: any */
    uint32_t bounds;            /* INT, FLOAT: LOOM_SETTING_MIN | ..., 0: any */
    uint32_t reserved;
    double min, max;            /* the bounds' values */
} loom_setting_spec;

/* The first member of every plugin struct. */
typedef struct loom_plugin_header {
    uint32_t abi_version;  /* LOOM_ABI_VERSION(MAJOR, MINOR) the plugin was built with */
    uint32_t struct_size;  /* sizeof the whole plugin struct at build time */
    uint32_t kind;         /* loom_plugin_kind */
    /* Since ABI 1.3: sizeof(loom_setting_spec) as built, the stride of the
     * settings list. 0 (older plugins): the 4-member spec of ABI 1.0-1.2. */
    uint32_t settings_stride;
    const char *name;        /* must match the file: libloom-<kind>-<name>.so */
    const char *description; /* one line, required */
    const loom_setting_spec *settings; /* NULL or a list ended by a NULL name */
} loom_plugin_header;

#define LOOM_PLUGIN_HEADER(kind_, struct_type, name_, description_, settings_)      \
    {                                                                                \
        LOOM_ABI_VERSION(LOOM_ABI_MAJOR, LOOM_ABI_MINOR), (uint32_t)sizeof(struct_type), \
            (uint32_t)(kind_), (uint32_t)sizeof(loom_setting_spec), (name_), (description_), \
            (settings_)                                                              \
    }

typedef enum loom_log_level {
    LOOM_LOG_ERROR = 0,
    LOOM_LOG_WARN = 1,
    LOOM_LOG_INFO = 2,
    LOOM_LOG_DEBUG = 3,
} loom_log_level;

/* Memory purposes: every byte the core, a strategy or the model keeps is
 * accounted under one of these, per tier. */
typedef enum loom_purpose {
    LOOM_PURPOSE_PARAMS = 0,
    LOOM_PURPOSE_GRADS = 1,
    LOOM_PURPOSE_OPTIMIZER = 2,
    LOOM_PURPOSE_ACTIVATIONS = 3,
    LOOM_PURPOSE_COMM = 4,
    LOOM_PURPOSE_OTHER = 5,
    LOOM_PURPOSE_COUNT
} loom_purpose;

static inline const char *loom_purpose_name(loom_purpose p)
{
    static const char *names[LOOM_PURPOSE_COUNT] = {
        "params", "grads", "optimizer", "activations", "comm", "other"};
    return (unsigned)p < LOOM_PURPOSE_COUNT ? names[p] : "?";
}

/* Storage tiers, fastest first. */
typedef enum loom_tier {
    LOOM_TIER_DEVICE = 0,
    LOOM_TIER_HOST = 1,
    LOOM_TIER_PINNED = 2, /* page-locked host memory, for async device copies */
    LOOM_TIER_NVME = 3,
    LOOM_TIER_COUNT
} loom_tier;

static inline const char *loom_tier_name(loom_tier t)
{
    static const char *names[LOOM_TIER_COUNT] = {"device", "host", "pinned", "nvme"};
    return (unsigned)t < LOOM_TIER_COUNT ? names[t] : "?";
}

/* Trace lanes of the Chrome/Perfetto timeline. */
typedef enum loom_trace_lane {
    LOOM_LANE_COMPUTE = 0,
    LOOM_LANE_COMM = 1,
    LOOM_LANE_MEMORY = 2,
} loom_trace_lane;

struct loom_comm_api;
struct loom_comm;
struct loom_compute_api;
struct loom_comm_plugin_v1_t;

/* Model state whose home tier memory.offload chooses by purpose, for
 * ZeRO-Offload and ZeRO-Infinity: OPTIMIZER (fp32 master weights and Adam
 * moments) by memory.offload.optimizer, PARAMS and GRADS (zero3's shards)
 * by memory.offload.params — host memory, or a memtier plugin's tier
 * (nvme). A buffer is a list of segments, one per unit say; a segment is in
 * host memory between its acquire and its release. fetch starts reading a
 * segment ahead of its acquire (read ahead); releasing a dirty segment
 * writes it back while the caller goes on (write behind). At home in host
 * memory a segment is acquired in place and fetch and release cost
 * nothing, so one code path serves every placement. The core accounts the
 * tier's bytes and the host staging under the buffer's purpose, traces
 * every transfer on the memory lane and counts the bytes of each step. */
typedef struct loom_tiered loom_tiered;

/* acquire's mode */
#define LOOM_TIERED_READ 0u      /* the segment's contents */
#define LOOM_TIERED_OVERWRITE 1u /* the caller writes all of it before reading: nothing is read */

/* Version 4 (ABI 1.6) adds no member: it says the loom_optimizer_step the
 * core passes has update_range; version 5 (ABI 1.7), update_range_store;
 * version 6 (ABI 1.8) adds crc32c and copy_crc32c; version 7 (ABI 1.9),
 * compute; version 8 (ABI 1.10), comm_open. */
#define LOOM_HOST_VERSION 8

/* The core's services, one table per plugin instance (its config group and
 * its key prefix in the bootstrap store are bound into it). Grows at its end;
 * check struct_size before using a member added after LOOM_HOST_VERSION 1. */
typedef struct loom_host {
    uint32_t struct_size;
    uint32_t version;

    /* Who we are in the job. */
    int rank;
    int world_size;
    int local_rank; /* rank among the processes on this machine */
    int local_size;
    double timeout_s; /* comm.timeout_s: no wait may exceed it */

    /* Logging; lines are prefixed with the rank and the plugin's name. */
    void (*log)(const struct loom_host *host, loom_log_level level, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));
    /* Records the calling thread's error detail and returns status, so a
     * plugin can write: return host->error(host, LOOM_ERR_INVALID, "..."). */
    int (*error)(const struct loom_host *host, int status, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

    /* The plugin's own config group, already validated against its
     * loom_setting_spec list, defaults filled in. LOOM_ERR_NOT_FOUND for a
     * name the plugin did not declare. */
    int (*config_int)(const struct loom_host *host, const char *name, int64_t *out);
    int (*config_float)(const struct loom_host *host, const char *name, double *out);
    int (*config_bool)(const struct loom_host *host, const char *name, int *out);
    int (*config_string)(const struct loom_host *host, const char *name, const char **out);

    /* The bootstrap key-value store served by rank 0. Keys are private to
     * the plugin (the core prefixes them). get waits until the key exists or
     * timeout_s passes (LOOM_ERR_TIMEOUT). add atomically adds to an integer
     * key (created as 0) and returns the new value. barrier waits for every
     * rank of the world under the given name. */
    int (*kv_put)(const struct loom_host *host, const char *key, const void *value, size_t len);
    int (*kv_get)(const struct loom_host *host, const char *key, void *buf, size_t cap,
                  size_t *len, double timeout_s);
    int (*kv_add)(const struct loom_host *host, const char *key, int64_t delta, int64_t *result);
    int (*kv_barrier)(const struct loom_host *host, const char *name, double timeout_s);

    /* Accounted memory. tier is LOOM_TIER_HOST, LOOM_TIER_PINNED or
     * LOOM_TIER_DEVICE (addressable tiers); alignment is at least 64. The
     * memory is not zeroed. The core frees nothing a plugin allocated: free
     * it with mem_free, at the latest in destroy. */
    int (*mem_alloc)(const struct loom_host *host, loom_tier tier, loom_purpose purpose,
                     size_t bytes, void **out);
    void (*mem_free)(const struct loom_host *host, void *ptr);

    /* Timeline: a span [start_ns, end_ns] of now_ns() times on a lane. */
    uint64_t (*now_ns)(void);
    void (*trace)(const struct loom_host *host, loom_trace_lane lane, const char *name,
                  uint64_t start_ns, uint64_t end_ns, uint64_t bytes);

    /* Collectives on the core's groups (with byte accounting and tracing);
     * strategies reach other ranks through this and nothing else. */
    const struct loom_comm_api *comm;

    /* Since LOOM_HOST_VERSION 2. A comm backend blocked long on an op of
     * comm calls it so the core reports this rank's arrival on the group:
     * the rank whose wait times out then names the ranks that did not
     * arrive without waiting for the others to time out too. */
    void (*comm_waiting)(const struct loom_host *host, struct loom_comm *comm);

    /* Since LOOM_HOST_VERSION 3 (ABI 1.4): tiered model state (loom_tiered
     * above). alloc: nsegments segments of the given sizes, zeroed; name
     * labels its transfers ("zero3 m"). acquire may nest (each with its
     * release); the pointer stays valid until the last release. A segment
     * acquired for reading while its write-back is in flight waits for it.
     * A strategy that does not use these keeps its state where mem_alloc
     * puts it, and the core refuses memory.offload settings for purposes it
     * never placed here. */
    int (*tiered_alloc)(const struct loom_host *host, loom_purpose purpose, const char *name,
                        int nsegments, const size_t *segment_bytes, loom_tiered **out);
    void (*tiered_free)(const struct loom_host *host, loom_tiered *t);
    int (*tiered_fetch)(const struct loom_host *host, loom_tiered *t, int segment);
    int (*tiered_acquire)(const struct loom_host *host, loom_tiered *t, int segment,
                          unsigned mode, void **ptr);
    int (*tiered_release)(const struct loom_host *host, loom_tiered *t, int segment, int dirty);

    /* Since LOOM_HOST_VERSION 6 (ABI 1.8): the core's CRC32C (Castagnoli,
     * the checksum of its checkpoint files), with the CPU's instruction
     * where it has one. crc32c gives the CRC32C of what crc was the CRC32C
     * of followed by n bytes more (crc 0 to start: crc32c(0, "123456789",
     * 9) = 0xE3069283); copy_crc32c copies n bytes and gives the CRC32C of
     * them, computed while they are in cache. */
    uint32_t (*crc32c)(uint32_t crc, const void *data, size_t n);
    uint32_t (*copy_crc32c)(void *dst, const void *src, size_t n);

    /* Since LOOM_HOST_VERSION 7 (ABI 1.9): the run's compute backend
     * (loom/compute.h), where the model's buffers live and the only way to
     * touch them. A strategy built before 1.9 is refused with a backend
     * whose memory the host cannot address. */
    const struct loom_compute_api *compute;

    /* Since LOOM_HOST_VERSION 8 (ABI 1.10), for a comm plugin that wraps
     * another (a tracer, a compressor, a fault injector): open the comm
     * backend `name` (a short name or a file path, as comm.default takes
     * it) to forward to. Its settings are its own group, comm.<name>,
     * validated as if the config had chosen it directly; *inner_host is the
     * table to create its communicators with, *ops its plugin struct, to be
     * called as the core would (comm.h). The core keeps it loaded until the
     * end of the job; opening the same name again gives the same two. NULL
     * in every host table but a comm plugin's. */
    int (*comm_open)(const struct loom_host *host, const char *name,
                     const struct loom_comm_plugin_v1_t **ops,
                     const struct loom_host **inner_host);
} loom_host;

#endif
