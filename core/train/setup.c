/* loom train — The trainer's set-up and teardown: settings, mesh shape, data, the
 * strategies of every axis, the model, the initial parameters placed by the
 * data strategy. */
#include <stdlib.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "model/gemm.h"
#include "model/kernels.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "train/trainer.h"

/* ---- set-up ---- */

int trainer_read_int(const loom_config *cfg, const char *path, int *out)
{
    int64_t v = 0;
    int rc = loom_config_int(cfg, path, &v);
    *out = (int)v;
    return rc;
}

loom_dtype trainer_read_precision(const loom_config *cfg)
{
    const char *precision = "fp32";
    loom_config_string(cfg, "train.precision", &precision);
    return !strcmp(precision, "bf16")   ? LOOM_BF16
           : !strcmp(precision, "fp16") ? LOOM_F16
                                        : LOOM_F32;
}

float trainer_read_float(const loom_config *cfg, const char *path)
{
    double v = 0;
    loom_config_float(cfg, path, &v);
    return (float)v;
}

/* The library of the matrix products (model.gemm) and the dtype they
 * multiply in (the run's precision), and the peak MFU is measured against:
 * train.peak_gflops, or that library's rate on this rank measured at start
 * on the model's MLP-up product of one micro-batch (rows x 4C x C). */
static int choose_gemm(trainer *t)
{
    const char *name = "auto";
    loom_config_string(t->job.cfg, "model.gemm", &name);
    int rc = loom_gemm_select((loom_gemm_library)loom_gemm_library_parse(name), t->job.dtype);
    if (rc != LOOM_OK)
        return trainer_fail_at(t, rc, "model.gemm");
    return trainer_measure_peak(t);
}

/* model.device's backend, served to the strategies (loom_host's compute). */
static int open_backend(trainer *t)
{
    const char *device = "cpu";
    loom_config_string(t->job.cfg, "model.device", &device);
    loom_compute_setup setup = {.struct_size = sizeof setup,
                                .device = loom_runtime_env(t->job.rt)->local_rank,
                                .threads = loom_kernels_threads(),
                                .precision = t->job.dtype,
                                .deterministic = 1};
    int rc = loom_backend_open(t->job.rt, device, &setup, &t->job.backend, t->job.device_why,
                               sizeof t->job.device_why);
    if (rc != LOOM_OK)
        return trainer_fail_at(t, rc, "model.device");
    int on_device = t->job.backend->ops->tier == LOOM_TIER_DEVICE;
    /* ZeRO-Offload: the optimizer state may leave the device (the step
     * runs the CPU's AdamW on it); the parameters and gradients the
     * kernels compute on may not. */
    if (on_device &&
        loom_tiers_offload(t->job.tiers, LOOM_PURPOSE_PARAMS) != LOOM_OFFLOAD_NONE)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED,
                         "%s: moving parameters and gradients out of the %s backend's device "
                         "memory is not supported yet (only the optimizer state can move: "
                         "memory.offload.optimizer); set memory.offload.params = \"none\", or "
                         "model.device = \"cpu\"",
                         loom_config_where(t->job.cfg, "memory.offload.params"),
                         t->job.backend->name);
    loom_tiers_set_device(t->job.tiers, on_device ? t->job.backend->name : NULL);
    return loom_backend_install(t->job.rt, t->job.backend);
}

/* The mesh's shape against the job, before any group is made, so the
 * message can name the settings. */
static int check_mesh_shape(const trainer *t)
{
    static const char *const paths[LOOM_AXIS_COUNT] = {"parallel.tp.size", "parallel.sp.size",
                                                       "parallel.pp.size", "parallel.dp.size"};
    int sizes[LOOM_AXIS_COUNT], product = 1;
    const char *where = NULL;
    for (int a = 0; a < LOOM_AXIS_COUNT; a++) {
        trainer_read_int(t->job.cfg, paths[a], &sizes[a]);
        product *= sizes[a];
        if (!where && loom_config_is_set(t->job.cfg, paths[a]))
            where = loom_config_where(t->job.cfg, paths[a]);
    }
    if (product != t->job.world) {
        char at[512];
        snprintf(at, sizeof at, "%s", where ? where : "parallel");
        return loom_fail(LOOM_ERR_INVALID,
                         "%s: mesh tp × sp × pp × dp = %d × %d × %d × %d = %d, but the job has %d "
                         "ranks; set parallel.<axis>.size so the product is %d",
                         at, sizes[LOOM_AXIS_TP], sizes[LOOM_AXIS_SP], sizes[LOOM_AXIS_PP],
                         sizes[LOOM_AXIS_DP], product, t->job.world, t->job.world);
    }
    return LOOM_OK;
}

/* Initial parameters in llm.c's order: the checkpoint, or seeded random. */
static int initial_params(trainer *t, float **out)
{
    const char *init = "random", *path = "";
    loom_config_string(t->job.cfg, "model.init", &init);
    loom_config_string(t->job.cfg, "model.checkpoint", &path);
    if (!strcmp(init, "checkpoint")) {
        loom_gpt2_shape got;
        return loom_checkpoint_read(path, &t->job.shape, &got, out);
    }
    int64_t seed = 1337;
    loom_config_int(t->job.cfg, "model.seed", &seed);
    float *p = malloc(loom_gpt2_param_count(&t->job.shape) * sizeof(float));
    if (!p)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: cannot allocate the initial parameters");
    loom_gpt2_init_random(&t->job.shape, (uint64_t)seed, p);
    *out = p;
    return LOOM_OK;
}

static void fill_setup(const trainer *t, loom_axis axis, loom_strategy_setup *setup)
{
    memset(setup, 0, sizeof *setup);
    setup->struct_size = sizeof *setup;
    setup->axis = axis;
    for (int a = 0; a < LOOM_AXIS_COUNT; a++) {
        setup->sizes[a] = t->job.mesh->sizes[a];
        setup->coords[a] = t->job.mesh->coords[a];
        setup->groups[a] = t->job.mesh->groups[a];
    }
    setup->layers = t->job.shape.layers;
    setup->heads = t->job.shape.heads;
    setup->channels = t->job.shape.channels;
    setup->vocab = t->job.shape.vocab;
    setup->padded_vocab = t->job.shape.padded_vocab;
    setup->max_seq = t->job.shape.max_seq;
    setup->micro_batch = t->job.micro_batch;
    setup->seq = t->job.seq;
    setup->micro_batches = t->job.micro_batches;
    setup->compute_dtype = t->job.dtype;
}

/* What a data strategy's capabilities require of the job (strategy.h),
 * against what this job does. */
static int check_requirements(const trainer *t, const char *name)
{
    int pp = t->job.mesh->sizes[LOOM_AXIS_PP];
    const struct {
        uint64_t bit;
        const char *bit_name, *requires;
        int broken;          /* the job cannot honour it */
        const char *setting; /* where the job says so */
        const char *what;
    } rules[] = {
        {LOOM_STRATEGY_PARAMS_SHARDED, "LOOM_STRATEGY_PARAMS_SHARDED",
         "parameters complete only between its forward and backward hooks", pp > 1,
         "parallel.pp.size", "a pipeline keeps each stage's parameters whole at rest"},
        {LOOM_STRATEGY_ONE_MICROBATCH, "LOOM_STRATEGY_ONE_MICROBATCH", "one micro-batch per step",
         t->job.micro_batches > 1, pp > 1 ? "parallel.pp.microbatches" : "train.grad_accum",
         "this job accumulates several micro-batches per step"},
        {LOOM_STRATEGY_GRADS_IN_ORDER, "LOOM_STRATEGY_GRADS_IN_ORDER",
         "gradients reported unit by unit in reverse order, one micro-batch at a time", pp > 1,
         "parallel.pp.size", "a pipeline interleaves micro-batches and splits the backward"},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(rules); i++)
        if ((t->data_axis.ops->capabilities & rules[i].bit) && rules[i].broken)
            return loom_fail(LOOM_ERR_NOT_SUPPORTED,
                             "%s: strategy %s requires %s (it declares %s), but %s; change the "
                             "setting or the strategy",
                             loom_config_where(t->job.cfg, rules[i].setting), name,
                             rules[i].requires, rules[i].bit_name, rules[i].what);
    return LOOM_OK;
}

/* A strategy built before ABI 1.9 reads and writes the model's buffers on
 * the host, which only the cpu backend's memory allows. */
int trainer_check_residency(const trainer *t, const loom_plugin *plugin, const char *path)
{
    if (t->job.backend->ops->tier == LOOM_TIER_HOST ||
        loom_plugin_has_feature(plugin, LOOM_FEATURE_DEVICE_BUFFERS))
        return LOOM_OK;
    return loom_fail(LOOM_ERR_NOT_SUPPORTED,
                     "%s: strategy %s was built for %s (%s), before the model's buffers could "
                     "live on a device; with model.device = \"%s\" a strategy must be built for "
                     "loom plugin ABI 1.9 or later (it reaches them through host->compute): "
                     "rebuild it against this loom, or set model.device = \"cpu\"",
                     loom_config_where(t->job.cfg, path), plugin->header->name, plugin->built_for,
                     plugin->path, t->job.backend->name);
}

static int create_strategy(trainer *t)
{
    const char *name = NULL;
    loom_config_string(t->job.cfg, "parallel.dp.strategy", &name);
    int rc = loom_runtime_plugin(t->job.rt, LOOM_PLUGIN_STRATEGY, name, &t->data_axis.plugin);
    if (rc != LOOM_OK)
        return rc;
    t->data_axis.ops = &t->data_axis.plugin->ops.strategy;
    if (t->data_axis.ops->axis != LOOM_AXIS_DP)
        return loom_fail(LOOM_ERR_INVALID,
                         "%s: parallel.dp.strategy = \"%s\" is a strategy for the %s axis, not dp",
                         loom_config_where(t->job.cfg, "parallel.dp.strategy"), name,
                         loom_axis_name((loom_axis)t->data_axis.ops->axis));
    if ((rc = loom_plugin_check_dp_size(t->data_axis.plugin, t->job.mesh->sizes[LOOM_AXIS_DP])) !=
        LOOM_OK)
        return trainer_fail_at(t, rc, "parallel.dp.size");
    if ((rc = check_requirements(t, name)) != LOOM_OK ||
        (rc = trainer_check_residency(t, t->data_axis.plugin, "parallel.dp.strategy")) != LOOM_OK)
        return rc;
    /* Before 1.6 a strategy steps through update, which cannot tell a
     * unit's tensors apart. */
    if (t->opt.decay_matrices &&
        !loom_plugin_has_feature(t->data_axis.plugin, LOOM_FEATURE_UPDATE_RANGE))
        return loom_fail(LOOM_ERR_NOT_SUPPORTED,
                         "%s: train.decay = \"matrices\" needs a data strategy built for loom "
                         "plugin ABI 1.6 or later (it steps ranges through update_range), but "
                         "%s was built for %s (%s); rebuild it against this loom or set "
                         "train.decay = \"all\"",
                         loom_config_where(t->job.cfg, "train.decay"), name,
                         t->data_axis.plugin->built_for, t->data_axis.plugin->path);
    const loom_host *host;
    if ((rc = loom_runtime_host(t->job.rt, t->data_axis.plugin, "parallel.dp", &host)) != LOOM_OK)
        return rc;
    loom_strategy_setup setup;
    fill_setup(t, LOOM_AXIS_DP, &setup);
    return t->data_axis.ops->create(host, &setup, &t->data_axis.strategy);
}

/* ---- the tensor and sequence axes (docs/parallelism.md) ---- */

/* A strategy's own error, prefixed with the config line it is about. */
int trainer_fail_at(const trainer *t, int rc, const char *path)
{
    char detail[1024];
    snprintf(detail, sizeof detail, "%s", loom_last_error());
    return loom_fail(rc, "%s: %s", loom_config_where(t->job.cfg, path), detail);
}

static const char *axis_group(loom_axis axis)
{
    return axis == LOOM_AXIS_TP   ? "parallel.tp"
           : axis == LOOM_AXIS_PP ? "parallel.pp"
                                  : "parallel.sp";
}

static const char *axis_strategy_path(loom_axis axis)
{
    return axis == LOOM_AXIS_TP   ? "parallel.tp.strategy"
           : axis == LOOM_AXIS_PP ? "parallel.pp.schedule"
                                  : "parallel.sp.strategy";
}

/* The plugin the config names for a tp, sp or pp axis, a strategy of that
 * axis (a schedule for pp), with its settings group checked. */
static int load_axis_plugin(trainer *t, loom_axis axis, const loom_plugin **plugin,
                            const loom_host **host)
{
    const char *strategy_path = axis_strategy_path(axis);
    const char *name = NULL;
    loom_config_string(t->job.cfg, strategy_path, &name);
    loom_plugin_kind kind = axis == LOOM_AXIS_PP ? LOOM_PLUGIN_SCHEDULE : LOOM_PLUGIN_STRATEGY;
    int rc = loom_runtime_plugin(t->job.rt, kind, name, plugin);
    if (rc != LOOM_OK)
        return trainer_fail_at(t, rc, strategy_path);
    uint32_t its_axis = kind == LOOM_PLUGIN_SCHEDULE ? LOOM_AXIS_PP : (*plugin)->ops.strategy.axis;
    if (its_axis != (uint32_t)axis)
        return loom_fail(LOOM_ERR_INVALID, "%s: %s = \"%s\" is a strategy for the %s axis, not %s",
                         loom_config_where(t->job.cfg, strategy_path), strategy_path, name,
                         loom_axis_name((loom_axis)its_axis), loom_axis_name(axis));
    return loom_runtime_host(t->job.rt, *plugin, axis_group(axis), host);
}

int trainer_create_axis(trainer *t, loom_axis axis, axis_strategy *a)
{
    const char *size_path = axis == LOOM_AXIS_TP   ? "parallel.tp.size"
                            : axis == LOOM_AXIS_PP ? "parallel.pp.size"
                                                   : "parallel.sp.size";
    const loom_host *host;
    int rc = load_axis_plugin(t, axis, &a->plugin, &host);
    if (rc != LOOM_OK)
        return rc;
    a->ops = &a->plugin->ops.strategy;
    if ((rc = trainer_check_residency(t, a->plugin, axis_strategy_path(axis))) != LOOM_OK)
        return rc;
    loom_strategy_setup setup;
    fill_setup(t, axis, &setup);
    if ((rc = a->ops->create(host, &setup, &a->s)) != LOOM_OK) {
        a->s = NULL;
        return trainer_fail_at(t, rc, size_path);
    }
    return LOOM_OK;
}

/* An axis of one rank loads no strategy, but what the config names for it
 * is checked all the same (the plugin, its axis, its settings), so that a
 * job fails the same way at one rank as at many. A default nobody named is
 * left alone. */
static int check_unused_axes(trainer *t)
{
    static const loom_axis axes[] = {LOOM_AXIS_TP, LOOM_AXIS_SP, LOOM_AXIS_PP};
    for (size_t i = 0; i < LOOM_ARRAY_LEN(axes); i++) {
        loom_axis axis = axes[i];
        if (t->job.mesh->sizes[axis] > 1)
            continue;
        int named = loom_config_is_set(t->job.cfg, axis_strategy_path(axis));
        const char *setting;
        for (int k = 0;
             !named && (setting = loom_config_child_name(t->job.cfg, axis_group(axis), k)); k++) {
            char path[128];
            snprintf(path, sizeof path, "%s.%s", axis_group(axis), setting);
            named = !loom_config_core_owns(path); /* the plugin's own setting */
        }
        const loom_plugin *plugin;
        const loom_host *host;
        int rc = named ? load_axis_plugin(t, axis, &plugin, &host) : LOOM_OK;
        if (rc != LOOM_OK)
            return rc;
    }
    return LOOM_OK;
}

/* The training settings of train.* (the model's shape is loom_train_model_shape's). */
static void read_settings(trainer *t)
{
    trainer_read_int(t->job.cfg, "train.batch", &t->job.batch);
    trainer_read_int(t->job.cfg, "train.seq", &t->job.seq);
    trainer_read_int(t->job.cfg, "train.grad_accum", &t->job.grad_accum);
    loom_config_int(t->job.cfg, "train.steps", &t->job.steps);
    const char *lr_shape = "constant";
    loom_config_string(t->job.cfg, "train.schedule", &lr_shape);
    t->job.dtype = trainer_read_precision(t->job.cfg);
    t->opt.lr_schedule.lr = trainer_read_float(t->job.cfg, "train.lr");
    loom_config_int(t->job.cfg, "train.warmup", &t->opt.lr_schedule.warmup);
    t->opt.lr_schedule.steps = t->job.steps;
    t->opt.lr_schedule.cosine = !strcmp(lr_shape, "cosine");
    t->opt.lr_schedule.final_frac = trainer_read_float(t->job.cfg, "train.lr_final_frac");
    t->opt.beta1 = trainer_read_float(t->job.cfg, "train.beta1");
    t->opt.beta2 = trainer_read_float(t->job.cfg, "train.beta2");
    t->opt.eps = trainer_read_float(t->job.cfg, "train.eps");
    t->opt.weight_decay = trainer_read_float(t->job.cfg, "train.weight_decay");
    const char *decay = "all";
    loom_config_string(t->job.cfg, "train.decay", &decay);
    t->opt.decay_matrices = !strcmp(decay, "matrices");
    t->opt.clip = trainer_read_float(t->job.cfg, "train.clip");
    trainer_setup_scaler(t);
    int threads = 1;
    trainer_read_int(t->job.cfg, "train.threads", &threads);
    loom_kernels_set_threads(threads);
}

/* A setting of files (data.train, data.val): one path or pattern, or a list
 * of them; *out (malloc'd) borrows the config's strings. */
int trainer_read_files(const loom_config *cfg, const char *setting, const char ***out, int *count)
{
    int listed = loom_config_list_len(cfg, setting), n = listed > 0 ? listed : 1;
    const char **patterns = malloc((size_t)n * sizeof *patterns);
    if (!patterns)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    if (listed >= 0) {
        for (int i = 0; i < listed; i++)
            patterns[i] = loom_config_list_string(cfg, setting, i);
        n = listed;
    } else {
        patterns[0] = "";
        loom_config_string(cfg, setting, &patterns[0]);
        n = patterns[0][0] ? 1 : 0; /* "": none given */
    }
    *out = patterns;
    *count = n;
    return LOOM_OK;
}

/* The token shards, and the batch split into micro-batches per dp rank (a
 * pipeline's micro-batches are its accumulation). */
static int open_data(trainer *t)
{
    const char **patterns = NULL;
    int npatterns = 0, rc;
    if ((rc = trainer_read_files(t->job.cfg, "data.train", &patterns, &npatterns)) != LOOM_OK)
        return rc;
    rc = loom_dataset_open(&t->data.set, "data.train", loom_config_where(t->job.cfg, "data.train"),
                           patterns, npatterns, t->job.shape.vocab);
    free(patterns);
    if (rc != LOOM_OK)
        return rc;
    int dp = t->job.mesh->sizes[LOOM_AXIS_DP], pp = t->job.mesh->sizes[LOOM_AXIS_PP];
    t->job.micro_batches = t->job.grad_accum;
    if (pp > 1) {
        /* a pipeline's micro-batches are its accumulation */
        trainer_read_int(t->job.cfg, "parallel.pp.microbatches", &t->job.micro_batches);
        if (t->job.grad_accum != 1)
            return loom_fail(LOOM_ERR_INVALID,
                             "%s: with a pipeline, parallel.pp.microbatches is "
                             "the gradient accumulation; set train.grad_accum = 1",
                             loom_config_where(t->job.cfg, "train.grad_accum"));
        if (t->job.batch % (dp * t->job.micro_batches) != 0)
            return loom_fail(LOOM_ERR_INVALID,
                             "%s: train.batch %d does not divide by "
                             "parallel.dp.size %d × parallel.pp.microbatches %d",
                             loom_config_where(t->job.cfg, "parallel.pp.microbatches"),
                             t->job.batch, dp, t->job.micro_batches);
    }
    loom_data_order order = {.batch = t->job.batch, .seq = t->job.seq};
    loom_config_bool(t->job.cfg, "data.shuffle", &order.shuffle);
    trainer_read_int(t->job.cfg, "data.readers", &order.readers);
    trainer_read_int(t->job.cfg, "data.read_batch", &order.read_batch);
    if ((rc = loom_dataloader_init(&t->data.loader, &t->data.set, &order,
                                   t->job.mesh->coords[LOOM_AXIS_DP], dp, t->job.micro_batches)) !=
        LOOM_OK)
        return rc;
    t->job.micro_batch = t->job.batch / (dp * t->job.micro_batches);
    return LOOM_OK;
}

/* Whole units from llm.c's order, then this tp rank's slices of them,
 * handed to the data strategy to place (and shard) as it keeps them. */
static int place_initial_params(trainer *t)
{
    int rc;
    float *llmc = NULL;
    if ((rc = initial_params(t, &llmc)) != LOOM_OK)
        return rc;
    float **init = calloc((size_t)t->job.nunits, sizeof *init);
    float **whole = calloc((size_t)t->job.nunits, sizeof *whole);
    rc = init && whole ? LOOM_OK : loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    for (int i = 0; i < t->job.nunits && rc == LOOM_OK; i++)
        if (!(init[i] = malloc(t->job.units[i].numel * sizeof(float))) ||
            !(whole[i] = malloc(loom_model_full_numel(t->job.model, i) * sizeof(float))))
            rc = loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    float **held = calloc((size_t)t->job.nunits, sizeof *held);
    if (rc == LOOM_OK && !held)
        rc = loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    if (rc == LOOM_OK) {
        loom_model_split_params(t->job.model, llmc, whole);
        for (int i = 0; i < t->job.nunits; i++)
            loom_model_slice(t->job.model, i, whole[i], init[i]);
        for (int i = 0; i < t->data_axis.nunits; i++)
            held[i] = init[t->data_axis.units[i].index];
        rc = t->data_axis.ops->data_setup(t->data_axis.strategy, t->data_axis.units,
                                          t->data_axis.nunits, held);
        loom_mem_defer_limit(0);
        trainer_sync_units(t);
        if (rc == LOOM_OK)
            rc = trainer_check_resident(t);
        const char *name = NULL;
        loom_config_string(t->job.cfg, "parallel.dp.strategy", &name);
        if (rc == LOOM_OK)
            rc = loom_tiers_check_used(t->job.tiers, name);
        if (rc == LOOM_OK)
            rc = loom_tiers_settle_budget(t->job.tiers);
    }
    if (rc == LOOM_OK && t->job.mesh->sizes[LOOM_AXIS_PP] > 1)
        rc = trainer_setup_pipeline(t, init[0]);
    free(held);
    for (int i = 0; whole && i < t->job.nunits; i++)
        free(whole[i]);
    free(whole);
    for (int i = 0; init && i < t->job.nunits; i++)
        free(init[i]);
    free(init);
    free(llmc);
    return rc;
}

int trainer_setup(trainer *t, const loom_train_options *o)
{
    int rc = loom_config_load(o->config, o->overrides, o->noverrides, &t->job.cfg);
    if (rc != LOOM_OK)
        return rc;
    /* a shape loom plans but cannot train, said before anything else */
    if ((rc = loom_train_model_shape(t->job.cfg, &t->job.shape)) != LOOM_OK)
        return rc;
    if ((rc = loom_runtime_create(t->job.cfg, &t->job.rt)) != LOOM_OK)
        return rc;
    t->job.rank = loom_runtime_env(t->job.rt)->rank;
    t->job.world = loom_runtime_env(t->job.rt)->world_size;
    /* memory.offload and memory.host_limit hold from the first allocation;
     * the limit weighs the activations and the model state together once
     * both are placed (place_initial_params) */
    if ((rc = loom_runtime_tiers(t->job.rt, &t->job.tiers)) != LOOM_OK)
        return rc;
    loom_mem_defer_limit(1);
    /* the backend before the mesh: comm "auto" chooses for its memory */
    if ((rc = check_mesh_shape(t)) != LOOM_OK)
        return rc;
    read_settings(t);
    if ((rc = open_backend(t)) != LOOM_OK ||
        (rc = loom_mesh_create(t->job.rt, &t->job.mesh)) != LOOM_OK ||
        (rc = check_unused_axes(t)) != LOOM_OK)
        return rc;
    if ((rc = open_data(t)) != LOOM_OK || (rc = choose_gemm(t)) != LOOM_OK)
        return rc;
    int pp = t->job.mesh->sizes[LOOM_AXIS_PP];
    if (pp > 1 && (rc = trainer_plan_pipeline(t)) != LOOM_OK)
        return rc;
    if ((rc = trainer_check_machine(t, o->check_machine)) != LOOM_OK)
        return rc;
    const char *recompute = NULL;
    loom_config_string(t->job.cfg, "train.recompute", &recompute);
    if ((rc = trainer_setup_parallel_model(t, !strcmp(recompute, "block"))) != LOOM_OK)
        return rc;
    size_t N = (size_t)t->job.micro_batch * t->job.seq;
    t->data.inputs = malloc(N * sizeof(int));
    t->data.targets = malloc(N * sizeof(int));
    if (!t->data.inputs || !t->data.targets)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    if ((rc = trainer_choose_units(t)) != LOOM_OK || (rc = create_strategy(t)) != LOOM_OK)
        return rc;
    if ((rc = place_initial_params(t)) != LOOM_OK)
        return rc;
    return trainer_setup_eval(t);
}

/* The data axis: the strategy (before the runtime unloads its plugin) and
 * the units it was given. */
static void teardown_data_axis(trainer *t)
{
    trainer_data_axis *d = &t->data_axis;
    if (d->strategy)
        d->ops->destroy(d->strategy);
    if (d->units != t->job.units)
        free(d->units);
    free(d->index);
}

static void teardown_data(trainer *t)
{
    trainer_data *d = &t->data;
    loom_dataloader_free(&d->loader);
    loom_dataset_close(&d->set);
    free(d->inputs);
    free(d->targets);
}

void trainer_teardown(trainer *t)
{
    /* plugins' objects before the runtime unloads them */
    trainer_teardown_pipeline(t);
    teardown_data_axis(t);
    trainer_teardown_model_axes(t);
    trainer_teardown_eval(t);
    trainer_close_reporting(t);
    teardown_data(t);
    loom_model_destroy(t->job.model);
    loom_backend_close(t->job.backend);
    loom_mesh_destroy(t->job.mesh);
    loom_runtime_destroy(t->job.rt);
    loom_config_free(t->job.cfg);
    trainer_unlock_checkpoints(t->ckpt.lock_fd);
}
