/* The command line's settings and the whole schema (settings.h). */
#include "cli/settings.h"
#include "loom/status.h"
#include "model/model_settings.h"
#include "runtime/config.h"
#include "runtime/log.h"
#include "train/train_settings.h"

static const char *const bench_ops[] = {"allreduce",     "broadcast", "reduce",   "allgather",
                                        "reducescatter", "alltoall",  "sendrecv", NULL};
static const char *const mem_kinds[] = {"host", "device", NULL};
static const char *const bench_tiers[] = {"host", "nvme", NULL};
static const char *const dtypes[] = {"f32", "bf16", "f16", "f64", "i32", "i64", "u8", NULL};
static const char *const redops[] = {"sum", "max", "min", "avg", NULL};

#define S(path_, type_, def_, ...) LOOM_CFG_SETTING(path_, type_, def_, __VA_ARGS__)

static const loom_config_setting settings[] = {
    S("bench.comms", LOOM_CFG_STRINGS, "auto", .flags = LOOM_CFG_NONEMPTY | LOOM_CFG_SOME,
      .help = "comm plugins to compare; \"auto\": the one comm.default = \"auto\" picks for "
      "bench.memory"),
    S("bench.ops", LOOM_CFG_STRINGS,
      "allreduce, broadcast, reduce, allgather, reducescatter, alltoall, sendrecv",
      .choices = bench_ops, .flags = LOOM_CFG_SOME, .help = "operations to time"),
    S("bench.min_bytes", LOOM_CFG_INT, "4", .lo = 0, .flags = LOOM_CFG_GE | LOOM_CFG_WIDE,
      .help = "smallest message"),
    S("bench.max_bytes", LOOM_CFG_INT, "67108864", .lo = 0, .flags = LOOM_CFG_GE | LOOM_CFG_WIDE,
      .help = "largest message (sizes double from min_bytes)"),
    S("bench.iters", LOOM_CFG_INT, "20", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "timed iterations per size"),
    S("bench.warmup", LOOM_CFG_INT, "5", .lo = 0, .flags = LOOM_CFG_GE,
      .help = "untimed iterations per size"),
    S("bench.barrier", LOOM_CFG_BOOL, "false",
      .help = "true: a barrier before every timed iteration, each timed alone (as ucc_perftest "
      "and the OSU benchmarks time); false: back to back (as nccl-tests)"),
    S("bench.memory", LOOM_CFG_STRING, "host", .choices = mem_kinds, .help = "buffer memory kind"),
    S("bench.dtype", LOOM_CFG_STRING, "f32", .choices = dtypes, .help = "element type"),
    S("bench.redop", LOOM_CFG_STRING, "sum", .choices = redops,
      .help = "reduction of reducing ops"),
    S("bench.tiers", LOOM_CFG_STRINGS, "", .choices = bench_tiers,
      .help = "memory tiers to time (the nvme tier's settings are memory.offload's); given, "
      "bench.comms runs only when set too"),
    S("bench.tier_block_bytes", LOOM_CFG_INTS, "65536, 1048576, 4194304", .lo = 4096,
      .flags = LOOM_CFG_GE | LOOM_CFG_WIDE,
      .help = "the nvme tier's block sizes (memory.offload.block_bytes) to time"),
    S("bench.tier_queue_depths", LOOM_CFG_INTS, "1, 4, 16", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "the nvme tier's queue depths (memory.offload.queue_depth) to time"),
    S("bench.tier_bytes", LOOM_CFG_INT, "268435456", .lo = 4096,
      .flags = LOOM_CFG_GE | LOOM_CFG_WIDE,
      .help = "bytes each tier measurement writes and reads back"),
    S("bench.tier_repeats", LOOM_CFG_INT, "3", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "measurements per point (the median is reported)"),
};

#undef S

static int check_relations(const loom_config *cfg)
{
    int64_t lo = 0, hi = 0;
    loom_config_int(cfg, "bench.min_bytes", &lo);
    loom_config_int(cfg, "bench.max_bytes", &hi);
    if (lo <= hi)
        return LOOM_OK;
    if (loom_config_is_set(cfg, "bench.max_bytes"))
        return loom_config_fail_relation(cfg, "bench.max_bytes", "bench.min_bytes",
                                         "expected an integer >= bench.min_bytes (%lld), found "
                                         "%lld",
                                         (long long)lo, (long long)hi);
    return loom_config_fail_relation(cfg, "bench.min_bytes", "bench.max_bytes",
                                     "expected an integer <= bench.max_bytes (%lld), found %lld",
                                     (long long)hi, (long long)lo);
}

const loom_config_settings loom_bench_settings = {
    .settings = settings,
    .count = LOOM_ARRAY_LEN(settings),
    .check = check_relations,
};

int loom_cli_add_settings(void)
{
    /* Where plugins are found, what the job trains and on what, how it
     * runs, and the benchmarks. */
    const loom_config_settings *const all[] = {
        &loom_config_plugin_settings, &loom_model_settings, &loom_train_settings,
        &loom_config_runtime_settings, &loom_bench_settings,
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(all); i++) {
        int rc = loom_config_add_settings(all[i]);
        if (rc != LOOM_OK)
            return rc;
    }
    return LOOM_OK;
}
