/* loom train CONFIG: the training loop of DESIGN §7. The model is a list of
 * units; the data-axis strategy owns where their parameters, gradients and
 * optimizer state live and hooks every unit's forward and backward. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cblas.h>

#include "loom/comm.h"
#include "loom/plugin.h"
#include "loom/status.h"
#include "loom/strategy.h"
#include "loom/tensor.h"
#include "model/formats.h"
#include "model/kernels.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "runtime/bootstrap.h"
#include "runtime/config.h"
#include "runtime/group.h"
#include "runtime/loader.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/mesh.h"
#include "runtime/runtime.h"
#include "runtime/trace.h"
#include "train/ckpt.h"
#include "train/pipeline.h"
#include "train/schedule.h"
#include "train/train.h"


/* A strategy of the tensor or sequence axis. */
typedef struct axis_strategy {
    const loom_plugin *plugin;
    const loom_strategy_ops *ops;
    loom_strategy *s;
} axis_strategy;

typedef struct trainer {
    loom_runtime *rt;
    loom_config *cfg;
    loom_mesh *mesh;
    const loom_plugin *dp_plugin;
    const loom_strategy_ops *dp;
    loom_strategy *strategy;
    loom_model *model;
    loom_unit *units;
    int nunits;
    loom_gpt2_shape shape;
    loom_token_shard shard;
    loom_dataloader loader;
    int batch, seq, grad_accum, micro_batch, rank, world;
    int64_t steps, step; /* step: the next step to run, 0-based */
    loom_dtype dtype;
    loom_lr_schedule schedule;
    float beta1, beta2, eps, weight_decay, clip;
    float loss_scale;    /* fp16 only; 1 otherwise */
    int64_t good_steps, scale_window;
    double peak_flops;   /* per rank */
    int *inputs, *targets;
    /* The tensor and sequence axes (loaded when their size is > 1). */
    axis_strategy tp, sp;
    int seqpar;            /* the tp strategy splits the residual regions' rows */
    int *positions;        /* the positions of each sequence this rank holds */
    int npositions;
    loom_param_shard **tp_shards; /* per unit: every tp rank's slices, rank-major */
    float *repl_grads;     /* the step's gradients of tp-replicated tensors, for the norm */
    size_t *repl_offset;   /* per unit, into repl_grads */
    size_t repl_count;
    loom_comm_counters comm_start[LOOM_AXIS_COUNT], comm_step[LOOM_AXIS_COUNT];
    /* The units the data strategy was given: the model's own, or on a
     * pipeline the copies of this rank's (dp_units[dp_index[u]], -1: not
     * here). Hooks see the strategy's structs; the model's follow them. */
    loom_unit *dp_units;
    int ndp_units;
    int *dp_index;
    /* The pipeline axis (pp > 1). */
    axis_strategy pp;
    loom_schedule pipe_schedule;
    loom_pipeline *pipeline;
    int *stage_first, *stage_last; /* units of each stage */
    unsigned char *runs;           /* per unit: one of this rank's stages holds it */
    int micro_batches;             /* per step on this rank: grad_accum or pp.microbatches */
    int **mb_inputs, **mb_targets; /* the step's micro-batches (pipeline) */
    double bubble;                 /* the last step's idle share, averaged over the pp ranks */
    int64_t *stage_peaks;          /* per pp rank: peak activation bytes, live micro-batches */
} trainer;

/* ---- strategy hooks ---- */

/* The strategy's struct of model unit u, and the model's kept in step with it. */
static loom_unit *dp_unit(const trainer *t, int u) { return &t->dp_units[t->dp_index[u]]; }
static int holds(const trainer *t, int u) { return t->dp_index[u] >= 0; }

static void sync_unit(trainer *t, int u)
{
    const loom_unit *su = dp_unit(t, u);
    t->units[u].params = su->params;
    t->units[u].grads = su->grads;
}

static void sync_units(trainer *t)
{
    for (int u = 0; u < t->nunits; u++)
        if (holds(t, u))
            sync_unit(t, u);
}

/* A data-axis unit hook (absent ones are the loader's no-op), keeping the
 * model's unit in step with the strategy's. */
static int hook_unit(trainer *t, int (*hook)(loom_strategy *, loom_unit *), int u)
{
    int rc = hook(t->strategy, dp_unit(t, u));
    sync_unit(t, u);
    return rc;
}
#define HOOK(t, op, u) hook_unit((t), (t)->dp->op, (u))

static int grads_ready(trainer *t, int u, int last_micro)
{
    int rc = t->dp->data_grads_ready(t->strategy, dp_unit(t, u), last_micro);
    sync_unit(t, u);
    return rc;
}

/* ---- set-up ---- */

static int read_int(const loom_config *cfg, const char *path, int *out)
{
    int64_t v = 0;
    int rc = loom_config_int(cfg, path, &v);
    *out = (int)v;
    return rc;
}

static float read_float(const loom_config *cfg, const char *path)
{
    double v = 0;
    loom_config_float(cfg, path, &v);
    return (float)v;
}

/* sgemm on this rank, for MFU when the config states no peak. */
static double measure_peak_flops(void)
{
    /* GPT-2 small's QKV product at 1024 tokens: big enough for every
     * thread to have work, best of a few so a busy moment does not count. */
    enum { M = 1024, K = 768, N = 2304, REPS = 10 };
    float *a = calloc((size_t)M * K, 4), *b = calloc((size_t)K * N, 4), *c = calloc((size_t)M * N, 4);
    double best = 0;
    if (a && b && c) {
        /* one untimed call: thread start-up and first touch of the pages */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
        for (int r = 0; r < REPS; r++) {
            uint64_t t0 = loom_now_ns();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f,
                        c, N);
            double s = (double)(loom_now_ns() - t0) / 1e9;
            double flops = 2.0 * M * N * K / s;
            if (flops > best)
                best = flops;
        }
    }
    free(a);
    free(b);
    free(c);
    return best;
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
        read_int(t->cfg, paths[a], &sizes[a]);
        product *= sizes[a];
        if (!where && loom_config_is_set(t->cfg, paths[a]))
            where = loom_config_where(t->cfg, paths[a]);
    }
    if (product != t->world) {
        char at[512];
        snprintf(at, sizeof at, "%s", where ? where : "parallel");
        return loom_fail(LOOM_ERR_INVALID,
                         "%s: mesh tp × sp × pp × dp = %d × %d × %d × %d = %d, but the job has %d "
                         "ranks; set parallel.<axis>.size so the product is %d",
                         at, sizes[LOOM_AXIS_TP], sizes[LOOM_AXIS_SP], sizes[LOOM_AXIS_PP],
                         sizes[LOOM_AXIS_DP], product, t->world, t->world);
    }
    return LOOM_OK;
}

static int load_shape(trainer *t)
{
    const loom_config *cfg = t->cfg;
    read_int(cfg, "model.layers", &t->shape.layers);
    read_int(cfg, "model.heads", &t->shape.heads);
    read_int(cfg, "model.channels", &t->shape.channels);
    read_int(cfg, "model.vocab", &t->shape.vocab);
    read_int(cfg, "model.padded_vocab", &t->shape.padded_vocab);
    read_int(cfg, "model.max_seq", &t->shape.max_seq);
    return LOOM_OK;
}

/* Initial parameters in llm.c's order: the checkpoint, or seeded random. */
static int initial_params(trainer *t, float **out)
{
    const char *init = "random", *path = "";
    loom_config_string(t->cfg, "model.init", &init);
    loom_config_string(t->cfg, "model.checkpoint", &path);
    if (!strcmp(init, "checkpoint")) {
        loom_gpt2_shape got;
        return loom_checkpoint_read(path, &t->shape, &got, out);
    }
    int64_t seed = 1337;
    loom_config_int(t->cfg, "model.seed", &seed);
    float *p = malloc(loom_gpt2_param_count(&t->shape) * sizeof(float));
    if (!p)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: cannot allocate the initial parameters");
    loom_gpt2_init_random(&t->shape, (uint64_t)seed, p);
    *out = p;
    return LOOM_OK;
}

static void fill_setup(const trainer *t, loom_axis axis, loom_strategy_setup *setup)
{
    memset(setup, 0, sizeof *setup);
    setup->struct_size = sizeof *setup;
    setup->axis = axis;
    for (int a = 0; a < LOOM_AXIS_COUNT; a++) {
        setup->sizes[a] = t->mesh->sizes[a];
        setup->coords[a] = t->mesh->coords[a];
        setup->groups[a] = t->mesh->groups[a];
    }
    setup->layers = t->shape.layers;
    setup->heads = t->shape.heads;
    setup->channels = t->shape.channels;
    setup->vocab = t->shape.vocab;
    setup->padded_vocab = t->shape.padded_vocab;
    setup->max_seq = t->shape.max_seq;
    setup->micro_batch = t->micro_batch;
    setup->seq = t->seq;
    setup->grad_accum = t->micro_batches;
    setup->compute_dtype = t->dtype;
}

static int create_strategy(trainer *t)
{
    const char *name = NULL;
    loom_config_string(t->cfg, "parallel.dp.strategy", &name);
    int rc = loom_runtime_plugin(t->rt, LOOM_PLUGIN_STRATEGY, name, &t->dp_plugin);
    if (rc != LOOM_OK)
        return rc;
    t->dp = &t->dp_plugin->ops.strategy;
    if (t->dp->axis != LOOM_AXIS_DP)
        return loom_fail(LOOM_ERR_INVALID,
                         "%s: parallel.dp.strategy = \"%s\" is a strategy for the %s axis, not dp",
                         loom_config_where(t->cfg, "parallel.dp.strategy"), name,
                         loom_axis_name((loom_axis)t->dp->axis));
    int pp = t->mesh->sizes[LOOM_AXIS_PP];
    if (pp > 1 && (t->dp->capabilities & LOOM_STRATEGY_PARAMS_SHARDED))
        return loom_fail(LOOM_ERR_NOT_SUPPORTED,
                         "%s: a pipeline (parallel.pp.size = %d) composes with the data "
                         "strategies that keep a stage's parameters whole at rest; %s keeps them "
                         "sharded between steps",
                         loom_config_where(t->cfg, "parallel.dp.strategy"), pp, name);
    const loom_host *host;
    if ((rc = loom_runtime_host(t->rt, t->dp_plugin, "parallel.dp", &host)) != LOOM_OK)
        return rc;
    loom_strategy_setup setup;
    fill_setup(t, LOOM_AXIS_DP, &setup);
    return t->dp->create(host, &setup, &t->strategy);
}

/* ---- the tensor and sequence axes (DESIGN §5.1) ---- */

/* A strategy's own error, prefixed with the config line it is about. */
static int fail_at(const trainer *t, int rc, const char *path)
{
    char detail[1024];
    snprintf(detail, sizeof detail, "%s", loom_last_error());
    return loom_fail(rc, "%s: %s", loom_config_where(t->cfg, path), detail);
}

static int create_axis(trainer *t, loom_axis axis, axis_strategy *a)
{
    int tp = axis == LOOM_AXIS_TP, pp = axis == LOOM_AXIS_PP;
    const char *strategy_path = tp ? "parallel.tp.strategy"
                                : pp ? "parallel.pp.schedule" : "parallel.sp.strategy";
    const char *group = tp ? "parallel.tp" : pp ? "parallel.pp" : "parallel.sp";
    const char *size_path = tp ? "parallel.tp.size" : pp ? "parallel.pp.size" : "parallel.sp.size";
    const char *name = NULL;
    loom_config_string(t->cfg, strategy_path, &name);
    int rc = loom_runtime_plugin(t->rt, LOOM_PLUGIN_STRATEGY, name, &a->plugin);
    if (rc != LOOM_OK)
        return rc;
    a->ops = &a->plugin->ops.strategy;
    if (a->ops->axis != (uint32_t)axis)
        return loom_fail(LOOM_ERR_INVALID,
                         "%s: %s = \"%s\" is a strategy for the %s axis, not %s",
                         loom_config_where(t->cfg, strategy_path), strategy_path, name,
                         loom_axis_name((loom_axis)a->ops->axis), loom_axis_name(axis));
    const loom_host *host;
    if ((rc = loom_runtime_host(t->rt, a->plugin, group, &host)) != LOOM_OK)
        return rc;
    loom_strategy_setup setup;
    fill_setup(t, axis, &setup);
    if ((rc = a->ops->create(host, &setup, &a->s)) != LOOM_OK) {
        a->s = NULL;
        return fail_at(t, rc, size_path);
    }
    return LOOM_OK;
}

/* This rank's positions of each sequence: the sequence strategy's (a
 * contiguous block by default). Every sp rank must hold the same number
 * and together they must cover the sequence once: the loss averages over
 * them with equal weights. */
static int sequence_positions(trainer *t)
{
    int s = t->mesh->sizes[LOOM_AXIS_SP], r = t->mesh->coords[LOOM_AXIS_SP];
    t->positions = malloc((size_t)t->seq * sizeof(int));
    int *all = malloc((size_t)t->seq * (size_t)s * sizeof(int));
    int *counts = malloc((size_t)s * sizeof(int));
    char *seen = calloc((size_t)t->seq, 1);
    int rc = t->positions && all && counts && seen
                 ? LOOM_OK
                 : loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    int count = 0;
    if (rc == LOOM_OK && t->sp.ops->sequence_positions) {
        if ((rc = t->sp.ops->sequence_positions(t->sp.s, t->seq, t->positions, &count)) != LOOM_OK)
            rc = fail_at(t, rc, "train.seq");
    } else if (rc == LOOM_OK) {
        if (t->seq % s != 0)
            rc = loom_fail(LOOM_ERR_INVALID,
                           "%s: train.seq = %d does not divide by parallel.sp.size = %d",
                           loom_config_where(t->cfg, "train.seq"), t->seq, s);
        count = t->seq / s;
        for (int i = 0; rc == LOOM_OK && i < count; i++)
            t->positions[i] = r * count + i;
    }
    const loom_comm_api *C = &loom_core_comm_api;
    loom_group *g = t->mesh->groups[LOOM_AXIS_SP];
    loom_request *req = NULL;
    if (rc == LOOM_OK && (rc = C->allgather(g, &count, counts, 1, LOOM_I32, &req)) == LOOM_OK)
        rc = C->wait(req);
    for (int i = 0; rc == LOOM_OK && i < s; i++)
        if (counts[i] != t->seq / s || t->seq % s != 0)
            rc = loom_fail(LOOM_ERR_INVALID,
                           "%s: sp rank %d holds %d of the %d positions; every rank of "
                           "parallel.sp.size = %d must hold seq/size of them",
                           loom_config_where(t->cfg, "parallel.sp.strategy"), i, counts[i], t->seq, s);
    if (rc == LOOM_OK &&
        (rc = C->allgather(g, t->positions, all, (size_t)count, LOOM_I32, &req)) == LOOM_OK)
        rc = C->wait(req);
    for (int i = 0; rc == LOOM_OK && i < count * s; i++) {
        if (all[i] < 0 || all[i] >= t->seq || seen[all[i]]++)
            rc = loom_fail(LOOM_ERR_INVALID,
                           "%s: the sequence strategy gave position %d %s; the sp ranks must "
                           "hold each position of the sequence once",
                           loom_config_where(t->cfg, "parallel.sp.strategy"), all[i],
                           all[i] < 0 || all[i] >= t->seq ? "outside the sequence" : "twice");
    }
    t->npositions = count;
    free(all);
    free(counts);
    free(seen);
    return rc;
}

/* The model's parallel ops: the strategies' hooks behind the model's
 * signatures. */
static int op_attention_forward(void *ctx, const loom_attention *a)
{
    trainer *t = ctx;
    return t->sp.ops->attention_forward(t->sp.s, a);
}

static int op_attention_backward(void *ctx, const loom_attention *a)
{
    trainer *t = ctx;
    return t->sp.ops->attention_backward(t->sp.s, a);
}

static int op_enter(void *ctx, loom_region r, const loom_tensor *x, loom_tensor *out)
{
    trainer *t = ctx;
    return t->tp.ops->tensor_enter(t->tp.s, r, x, out);
}

static int op_exit(void *ctx, loom_region r, const loom_tensor *partial, loom_tensor *out)
{
    trainer *t = ctx;
    return t->tp.ops->tensor_exit(t->tp.s, r, partial, out);
}

static int op_exit_backward(void *ctx, loom_region r, const loom_tensor *dout, loom_tensor *dpartial)
{
    trainer *t = ctx;
    return t->tp.ops->tensor_exit_backward(t->tp.s, r, dout, dpartial);
}

static int op_enter_backward(void *ctx, loom_region r, const loom_tensor *din, loom_tensor *dx)
{
    trainer *t = ctx;
    return t->tp.ops->tensor_enter_backward(t->tp.s, r, din, dx);
}

static int op_shard(void *ctx, const loom_param_desc *param, loom_param_shard *out)
{
    trainer *t = ctx;
    return t->tp.ops->tensor_shard(t->tp.s, param, out);
}

static int group_allreduce(loom_group *g, void *data, size_t count, loom_dtype dtype, loom_redop op)
{
    const loom_comm_api *C = &loom_core_comm_api;
    loom_request *req = NULL;
    int rc = C->allreduce(g, data, data, count, dtype, op, &req);
    return rc == LOOM_OK ? C->wait(req) : rc;
}

static int op_vocab_reduce(void *ctx, float *data, size_t count, loom_redop op)
{
    trainer *t = ctx;
    return group_allreduce(t->mesh->groups[LOOM_AXIS_TP], data, count, LOOM_F32, op);
}

/* A unit's gradients of one micro-batch, before the data strategy sees
 * them: every sp rank saw other tokens, so all of them sum over the sp
 * group; under sequence parallelism each tp rank saw only its rows in the
 * replicated tensors (LayerNorms, row-parallel biases, wpe), which sum
 * over the tp group. The tp-replicated part is also kept for the norm. */
static int op_reduce_grads(void *ctx, const loom_unit *unit, float *grads)
{
    trainer *t = ctx;
    int rc = LOOM_OK;
    if (t->mesh->sizes[LOOM_AXIS_SP] > 1 &&
        (rc = group_allreduce(t->mesh->groups[LOOM_AXIS_SP], grads, unit->numel, LOOM_F32,
                              LOOM_SUM)) != LOOM_OK)
        return rc;
    if (t->mesh->sizes[LOOM_AXIS_TP] == 1)
        return LOOM_OK;
    float *keep = t->repl_grads + t->repl_offset[unit->index];
    for (int i = 0; i < unit->ntensors;) {
        if (unit->tensors[i].split != LOOM_SPLIT_REPLICATED) {
            i++;
            continue;
        }
        /* a run of consecutive replicated tensors: one reduction */
        size_t off = unit->tensors[i].offset, n = 0;
        while (i < unit->ntensors && unit->tensors[i].split == LOOM_SPLIT_REPLICATED)
            n += unit->tensors[i++].count;
        if (t->seqpar && (rc = group_allreduce(t->mesh->groups[LOOM_AXIS_TP], grads + off, n,
                                               LOOM_F32, LOOM_SUM)) != LOOM_OK)
            return rc;
        for (size_t j = 0; j < n; j++)
            keep[j] += grads[off + j];
        keep += n;
    }
    return LOOM_OK;
}

/* Every tp rank's slices of every unit, for checkpoints; and the room for
 * the replicated gradients. */
static int setup_tp_state(trainer *t)
{
    int tp = t->mesh->sizes[LOOM_AXIS_TP];
    t->tp_shards = calloc((size_t)t->nunits, sizeof *t->tp_shards);
    t->repl_offset = calloc((size_t)t->nunits, sizeof *t->repl_offset);
    if (!t->tp_shards || !t->repl_offset)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    const loom_comm_api *C = &loom_core_comm_api;
    for (int u = 0; u < t->nunits; u++) {
        const loom_unit *unit = &t->units[u];
        size_t n = (size_t)unit->ntensors;
        const loom_param_shard *mine = loom_model_shards(t->model, u);
        if (!(t->tp_shards[u] = malloc((size_t)tp * n * sizeof(loom_param_shard))))
            return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
        loom_request *req = NULL;
        int rc = C->allgather(t->mesh->groups[LOOM_AXIS_TP], mine, t->tp_shards[u],
                              n * sizeof(loom_param_shard) / sizeof(int64_t), LOOM_I64, &req);
        if (rc == LOOM_OK)
            rc = C->wait(req);
        if (rc != LOOM_OK)
            return rc;
        for (int r = 0; r < tp; r++)
            for (size_t i = 0; i < n; i++)
                if (t->tp_shards[u][(size_t)r * n + i].count != mine[i].count)
                    return loom_fail(LOOM_ERR_INVALID,
                                     "%s: the tp strategy gives %s %lld rows/columns on tp rank "
                                     "%d but %lld on this one; checkpoints need equal slices",
                                     loom_config_where(t->cfg, "parallel.tp.strategy"),
                                     unit->tensors[i].name,
                                     (long long)t->tp_shards[u][(size_t)r * n + i].count, r,
                                     (long long)mine[i].count);
        t->repl_offset[u] = t->repl_count;
        for (size_t i = 0; i < n; i++)
            if (unit->tensors[i].split == LOOM_SPLIT_REPLICATED)
                t->repl_count += unit->tensors[i].count;
    }
    t->repl_grads = calloc(t->repl_count ? t->repl_count : 1, sizeof(float));
    return t->repl_grads ? LOOM_OK : loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
}

/* Load the tp and sp strategies the mesh needs, find this rank's
 * positions, and create the model with its local shapes and hooks. */
static int setup_parallel_model(trainer *t, int recompute)
{
    int tp = t->mesh->sizes[LOOM_AXIS_TP], sp = t->mesh->sizes[LOOM_AXIS_SP], rc;
    if (tp > 1) {
        if ((rc = create_axis(t, LOOM_AXIS_TP, &t->tp)) != LOOM_OK)
            return rc;
        loom_config_bool(t->cfg, "parallel.tp.sequence_parallel", &t->seqpar);
    }
    if (sp > 1 && (rc = create_axis(t, LOOM_AXIS_SP, &t->sp)) != LOOM_OK)
        return rc;
    if (sp > 1) {
        if ((rc = sequence_positions(t)) != LOOM_OK)
            return rc;
        if ((rc = loom_dataloader_set_positions(&t->loader, t->positions, t->npositions)) !=
            LOOM_OK)
            return rc;
    }
    loom_model_setup ms = {t->shape, t->micro_batch, t->seq, t->dtype, recompute};
    loom_model_layout lay;
    memset(&lay, 0, sizeof lay);
    lay.tp_size = tp;
    lay.tp_rank = t->mesh->coords[LOOM_AXIS_TP];
    lay.sequence_parallel = t->seqpar;
    lay.tensor_shard = tp > 1 ? op_shard : NULL;
    lay.shard_ctx = t;
    lay.sp_size = sp;
    lay.positions = sp > 1 ? t->positions : NULL;
    lay.npositions = sp > 1 ? t->npositions : t->seq;
    lay.runs_unit = t->runs; /* NULL without a pipeline: every unit */
    if ((rc = loom_model_create_parallel(&ms, &lay, &t->model)) != LOOM_OK)
        return t->seqpar ? fail_at(t, rc, "parallel.tp.sequence_parallel") : rc;
    t->units = loom_model_units(t->model, &t->nunits);
    if (tp == 1 && sp == 1)
        return LOOM_OK;
    loom_model_ops ops;
    memset(&ops, 0, sizeof ops);
    ops.ctx = t;
    if (sp > 1) {
        ops.attention_forward = op_attention_forward;
        ops.attention_backward = op_attention_backward;
    }
    if (tp > 1) {
        ops.region_enter = op_enter;
        ops.region_exit = op_exit;
        ops.region_exit_backward = op_exit_backward;
        ops.region_enter_backward = op_enter_backward;
        ops.vocab_reduce = op_vocab_reduce;
    }
    ops.reduce_grads = op_reduce_grads;
    loom_model_set_ops(t->model, &ops);
    return tp > 1 ? setup_tp_state(t) : LOOM_OK;
}

/* The global gradient norm's square: the data strategy's sum covers this
 * tp rank's slices (once over the dp group) and the replicated tensors,
 * which every tp rank holds alike; sum over tp and count those once. */
static int tp_norm_sq(trainer *t, double *norm_sq)
{
    int tp = t->mesh->sizes[LOOM_AXIS_TP], rc;
    if ((rc = group_allreduce(t->mesh->groups[LOOM_AXIS_TP], norm_sq, 1, LOOM_F64, LOOM_SUM)) !=
        LOOM_OK)
        return rc;
    /* the replicated gradients as the data strategy holds them: averaged over dp */
    if (t->mesh->sizes[LOOM_AXIS_DP] > 1 &&
        (rc = group_allreduce(t->mesh->groups[LOOM_AXIS_DP], t->repl_grads, t->repl_count,
                              LOOM_F32, LOOM_AVG)) != LOOM_OK)
        return rc;
    double repl = 0;
    for (size_t i = 0; i < t->repl_count; i++)
        repl += (double)t->repl_grads[i] * t->repl_grads[i];
    *norm_sq -= (double)(tp - 1) * repl;
    if (*norm_sq < 0 && isfinite(*norm_sq))
        *norm_sq = 0; /* rounding, when the slices carry no gradient */
    return LOOM_OK;
}

/* ---- the pipeline axis ---- */

/* Units of each of the pp × virtual_stages stages: the blocks split evenly
 * (or as parallel.pp.stage_layers says), the embedding with the first
 * stage, the final LayerNorm, LM head and loss with the last. */
static int split_stages(trainer *t, int stages)
{
    const char *list = "parallel.pp.stage_layers";
    int L = t->shape.layers, listed = loom_config_list_len(t->cfg, list), blocks = 0;
    t->stage_first = calloc((size_t)stages, sizeof *t->stage_first);
    t->stage_last = calloc((size_t)stages, sizeof *t->stage_last);
    if (!t->stage_first || !t->stage_last)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    if (listed > 0 && listed != stages)
        return loom_fail(LOOM_ERR_INVALID, "%s: %s has %d entries for %d stages "
                         "(parallel.pp.size × virtual_stages)", loom_config_where(t->cfg, list),
                         list, listed, stages);
    if (listed <= 0 && L % stages != 0)
        return loom_fail(LOOM_ERR_INVALID, "%s: model.layers = %d do not split evenly over %d "
                         "stages (parallel.pp.size × virtual_stages); list the layers of each "
                         "stage in %s", loom_config_where(t->cfg, "parallel.pp.size"), L, stages,
                         list);
    for (int st = 0; st < stages; st++) {
        int n = L / stages;
        if (listed > 0) {
            char path[64];
            snprintf(path, sizeof path, "%s[%d]", list, st);
            read_int(t->cfg, path, &n);
        }
        t->stage_first[st] = st == 0 ? 0 : blocks + 1;
        blocks += n;
        t->stage_last[st] = st == stages - 1 ? L + 1 : blocks;
        if (t->stage_last[st] < t->stage_first[st])
            return loom_fail(LOOM_ERR_INVALID, "%s: stage %d holds no layer; every stage but the "
                             "first and the last needs one", loom_config_where(t->cfg, list), st);
    }
    if (blocks != L)
        return loom_fail(LOOM_ERR_INVALID, "%s: the stages hold %d layers, the model has %d "
                         "(model.layers)", loom_config_where(t->cfg, list), blocks, L);
    return LOOM_OK;
}

/* The units the data strategy looks after: all of them, or on a pipeline
 * those of this rank's stages. */
static int choose_units(trainer *t)
{
    t->dp_index = malloc((size_t)t->nunits * sizeof *t->dp_index);
    if (!t->dp_index)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    if (!t->runs) {
        for (int u = 0; u < t->nunits; u++)
            t->dp_index[u] = u;
        t->dp_units = t->units;
        t->ndp_units = t->nunits;
        return LOOM_OK;
    }
    t->dp_units = calloc((size_t)t->nunits, sizeof *t->dp_units);
    if (!t->dp_units)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    for (int u = 0; u < t->nunits; u++) {
        t->dp_index[u] = t->runs[u] ? t->ndp_units : -1;
        if (t->runs[u])
            t->dp_units[t->ndp_units++] = t->units[u];
    }
    return LOOM_OK;
}

static int pp_before_forward(void *ctx, int u) { return HOOK((trainer *)ctx, data_before_forward, u); }
static int pp_after_forward(void *ctx, int u) { return HOOK((trainer *)ctx, data_after_forward, u); }
static int pp_before_backward(void *ctx, int u) { return HOOK((trainer *)ctx, data_before_backward, u); }
static int pp_grads_ready(void *ctx, int u, int last_micro) { return grads_ready(ctx, u, last_micro); }

/* The schedule (validated before the first step) and its executor. */
static int setup_pipeline(trainer *t, const float *unit0_init)
{
    int rc;
    loom_pipeline_setup ps;
    memset(&ps, 0, sizeof ps);
    ps.schedule = &t->pipe_schedule;
    ps.rank = t->mesh->coords[LOOM_AXIS_PP];
    ps.group = t->mesh->groups[LOOM_AXIS_PP];
    ps.model = t->model;
    ps.stage_first = t->stage_first;
    ps.stage_last = t->stage_last;
    ps.dtype = t->dtype;
    ps.tied_init = unit0_init;
    ps.hooks = (loom_pipeline_hooks){t, pp_before_forward, pp_after_forward, pp_before_backward,
                                     pp_grads_ready};
    if ((rc = loom_pipeline_create(&ps, &t->pipeline)) != LOOM_OK)
        return rc;
    t->stage_peaks = calloc(2 * (size_t)t->mesh->sizes[LOOM_AXIS_PP], sizeof *t->stage_peaks);
    size_t N = (size_t)t->micro_batch * t->seq;
    t->mb_inputs = calloc((size_t)t->micro_batches, sizeof *t->mb_inputs);
    t->mb_targets = calloc((size_t)t->micro_batches, sizeof *t->mb_targets);
    if (!t->mb_inputs || !t->mb_targets || !t->stage_peaks)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    for (int k = 0; k < t->micro_batches; k++)
        if (!(t->mb_inputs[k] = malloc(N * sizeof(int))) ||
            !(t->mb_targets[k] = malloc(N * sizeof(int))))
            return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    return LOOM_OK;
}

/* The pp shape and the schedule, before the model: the stages decide which
 * units this rank builds. */
static int plan_pipeline(trainer *t)
{
    int p = t->mesh->sizes[LOOM_AXIS_PP], r = t->mesh->coords[LOOM_AXIS_PP], v = 1, rc;
    read_int(t->cfg, "parallel.pp.virtual_stages", &v);
    if ((rc = split_stages(t, p * v)) != LOOM_OK)
        return rc;
    if (!(t->runs = calloc((size_t)t->shape.layers + 2, 1)))
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    for (int vs = 0; vs < v; vs++)
        for (int u = t->stage_first[vs * p + r]; u <= t->stage_last[vs * p + r]; u++)
            t->runs[u] = 1;
    if ((rc = create_axis(t, LOOM_AXIS_PP, &t->pp)) != LOOM_OK)
        return rc;
    const char *name = t->pp.plugin->header->name;
    if ((rc = loom_schedule_build(t->pp.ops, t->pp.s, name, p, v, t->micro_batches,
                                  &t->pipe_schedule)) != LOOM_OK)
        return fail_at(t, rc, "parallel.pp.schedule");
    return LOOM_OK;
}

static int setup_trainer(trainer *t, const loom_train_options *o)
{
    int rc = loom_config_load(o->config, o->overrides, o->noverrides, &t->cfg);
    if (rc != LOOM_OK)
        return rc;
    if ((rc = loom_runtime_create(t->cfg, &t->rt)) != LOOM_OK)
        return rc;
    t->rank = loom_runtime_env(t->rt)->rank;
    t->world = loom_runtime_env(t->rt)->world_size;
    if ((rc = check_mesh_shape(t)) != LOOM_OK || (rc = loom_mesh_create(t->rt, &t->mesh)) != LOOM_OK)
        return rc;
    load_shape(t);
    read_int(t->cfg, "train.batch", &t->batch);
    read_int(t->cfg, "train.seq", &t->seq);
    read_int(t->cfg, "train.grad_accum", &t->grad_accum);
    loom_config_int(t->cfg, "train.steps", &t->steps);
    const char *precision = "fp32", *recompute = "none", *schedule = "constant";
    loom_config_string(t->cfg, "train.precision", &precision);
    loom_config_string(t->cfg, "train.recompute", &recompute);
    loom_config_string(t->cfg, "train.schedule", &schedule);
    t->dtype = !strcmp(precision, "bf16") ? LOOM_BF16 : !strcmp(precision, "fp16") ? LOOM_F16 : LOOM_F32;
    t->schedule.lr = read_float(t->cfg, "train.lr");
    loom_config_int(t->cfg, "train.warmup", &t->schedule.warmup);
    t->schedule.steps = t->steps;
    t->schedule.cosine = !strcmp(schedule, "cosine");
    t->schedule.final_frac = read_float(t->cfg, "train.lr_final_frac");
    t->beta1 = read_float(t->cfg, "train.beta1");
    t->beta2 = read_float(t->cfg, "train.beta2");
    t->eps = read_float(t->cfg, "train.eps");
    t->weight_decay = read_float(t->cfg, "train.weight_decay");
    t->clip = read_float(t->cfg, "train.clip");
    t->loss_scale = t->dtype == LOOM_F16 ? read_float(t->cfg, "train.loss_scale") : 1.0f;
    loom_config_int(t->cfg, "train.loss_scale_window", &t->scale_window);
    int threads = 1;
    read_int(t->cfg, "train.threads", &threads);
    loom_kernels_set_threads(threads);
    double peak_gflops = read_float(t->cfg, "train.peak_gflops");
    t->peak_flops = peak_gflops > 0 ? peak_gflops * 1e9 : measure_peak_flops();

    /* The data decides whether the batch splits evenly; check it first. */
    const char *train_path = "";
    loom_config_string(t->cfg, "data.train", &train_path);
    if (!train_path[0])
        return loom_fail(LOOM_ERR_INVALID,
                         "data.train: no token shard given; set data.train = "
                         "\"examples/data/corpus.bin\" (an llm.c token shard)");
    if ((rc = loom_shard_open(train_path, t->shape.vocab, &t->shard)) != LOOM_OK)
        return rc;
    int dp = t->mesh->sizes[LOOM_AXIS_DP], pp = t->mesh->sizes[LOOM_AXIS_PP];
    t->micro_batches = t->grad_accum;
    if (pp > 1) {
        /* a pipeline's micro-batches are its accumulation */
        read_int(t->cfg, "parallel.pp.microbatches", &t->micro_batches);
        if (t->grad_accum != 1)
            return loom_fail(LOOM_ERR_INVALID, "%s: with a pipeline, parallel.pp.microbatches is "
                             "the gradient accumulation; set train.grad_accum = 1",
                             loom_config_where(t->cfg, "train.grad_accum"));
        if (t->batch % (dp * t->micro_batches) != 0)
            return loom_fail(LOOM_ERR_INVALID, "%s: train.batch %d does not divide by "
                             "parallel.dp.size %d × parallel.pp.microbatches %d",
                             loom_config_where(t->cfg, "parallel.pp.microbatches"), t->batch, dp,
                             t->micro_batches);
    }
    if ((rc = loom_dataloader_init(&t->loader, &t->shard, t->batch, t->seq,
                                   t->mesh->coords[LOOM_AXIS_DP], dp, t->micro_batches)) != LOOM_OK)
        return rc;
    t->micro_batch = t->batch / (dp * t->micro_batches);
    if (pp > 1 && (rc = plan_pipeline(t)) != LOOM_OK)
        return rc;

    if ((rc = setup_parallel_model(t, !strcmp(recompute, "block"))) != LOOM_OK)
        return rc;
    size_t N = (size_t)t->micro_batch * t->seq;
    t->inputs = malloc(N * sizeof(int));
    t->targets = malloc(N * sizeof(int));
    if (!t->inputs || !t->targets)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");

    if ((rc = choose_units(t)) != LOOM_OK || (rc = create_strategy(t)) != LOOM_OK)
        return rc;
    float *llmc = NULL;
    if ((rc = initial_params(t, &llmc)) != LOOM_OK)
        return rc;
    /* whole units from llm.c's order, then this tp rank's slices of them */
    float **init = calloc((size_t)t->nunits, sizeof *init);
    float **whole = calloc((size_t)t->nunits, sizeof *whole);
    rc = init && whole ? LOOM_OK : loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    for (int i = 0; i < t->nunits && rc == LOOM_OK; i++)
        if (!(init[i] = malloc(t->units[i].numel * sizeof(float))) ||
            !(whole[i] = malloc(loom_model_full_numel(t->model, i) * sizeof(float))))
            rc = loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    float **held = calloc((size_t)t->nunits, sizeof *held);
    if (rc == LOOM_OK && !held)
        rc = loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    if (rc == LOOM_OK) {
        loom_model_split_params(t->model, llmc, whole);
        for (int i = 0; i < t->nunits; i++)
            loom_model_slice(t->model, i, whole[i], init[i]);
        for (int i = 0; i < t->ndp_units; i++)
            held[i] = init[t->dp_units[i].index];
        rc = t->dp->data_setup(t->strategy, t->dp_units, t->ndp_units, held);
        sync_units(t);
    }
    if (rc == LOOM_OK && t->mesh->sizes[LOOM_AXIS_PP] > 1)
        rc = setup_pipeline(t, init[0]);
    free(held);
    for (int i = 0; whole && i < t->nunits; i++)
        free(whole[i]);
    free(whole);
    for (int i = 0; init && i < t->nunits; i++)
        free(init[i]);
    free(init);
    free(llmc);
    return rc;
}

static void teardown(trainer *t)
{
    /* plugins' objects before the runtime unloads them */
    loom_pipeline_destroy(t->pipeline);
    if (t->pp.s)
        t->pp.ops->destroy(t->pp.s);
    if (t->strategy)
        t->dp->destroy(t->strategy);
    if (t->tp.s)
        t->tp.ops->destroy(t->tp.s);
    if (t->sp.s)
        t->sp.ops->destroy(t->sp.s);
    loom_model_destroy(t->model);
    loom_shard_close(&t->shard);
    loom_mesh_destroy(t->mesh);
    loom_runtime_destroy(t->rt);
    loom_config_free(t->cfg);
    free(t->inputs);
    free(t->targets);
    for (int i = 0; t->tp_shards && i < t->nunits; i++)
        free(t->tp_shards[i]);
    free(t->tp_shards);
    free(t->repl_grads);
    free(t->repl_offset);
    free(t->positions);
    loom_schedule_free(&t->pipe_schedule);
    for (int k = 0; t->mb_inputs && k < t->micro_batches; k++)
        free(t->mb_inputs[k]);
    for (int k = 0; t->mb_targets && k < t->micro_batches; k++)
        free(t->mb_targets[k]);
    free(t->mb_inputs);
    free(t->mb_targets);
    free(t->stage_first);
    free(t->stage_last);
    free(t->runs);
    free(t->stage_peaks);
    if (t->dp_units != t->units)
        free(t->dp_units);
    free(t->dp_index);
}

/* ---- checkpoints: llm.c's weights (--save) and loom's resumable state ---- */

static void fill_header(const trainer *t, loom_ckpt_header *h)
{
    memset(h, 0, sizeof *h);
    h->dtype = t->dtype;
    h->shape = t->shape;
    h->step = t->step;
    h->good_steps = t->good_steps;
    h->position = t->loader.position;
    h->loss_scale = t->loss_scale;
    h->nunits = t->nunits;
}

/* What this rank writes of one unit: the range the data strategy owns, or,
 * for a strategy that replicates the state, the whole unit on dp rank 0. */
static int save_unit_shard(trainer *t, loom_ckpt_shard_writer *w, int i, float *buf)
{
    loom_unit *u = dp_unit(t, i);
    int tp_rank = t->mesh->coords[LOOM_AXIS_TP], rc;
    size_t n = u->numel, begin = 0, count = n;
    if (t->dp->data_get_shard) {
        if ((rc = t->dp->data_get_shard(t->strategy, u, &begin, &count, NULL, NULL, NULL)) !=
            LOOM_OK)
            return rc;
        if (begin + count > n)
            return loom_fail(LOOM_ERR_INTERNAL, "strategy %s: data_get_shard gave %s the range "
                             "%zu+%zu of %zu elements", t->dp_plugin->header->name, u->name,
                             begin, count, n);
        rc = t->dp->data_get_shard(t->strategy, u, &begin, &count, buf, buf + count,
                                   buf + 2 * count);
    } else {
        /* data_get_state is collective on the dp group: every rank calls it */
        rc = t->dp->data_get_state(t->strategy, u, buf, buf + n, buf + 2 * n);
        if (t->mesh->coords[LOOM_AXIS_DP] != 0)
            return rc;
    }
    if (rc != LOOM_OK)
        return rc;
    return loom_ckpt_shard_put(w, i, tp_rank, begin, count, buf, buf + count, buf + 2 * count);
}

static int barrier(trainer *t, const char *name)
{
    loom_store *store = loom_runtime_store(t->rt);
    return store ? loom_store_barrier(store, name, loom_runtime_timeout(t->rt)) : LOOM_OK;
}

static void remove_dir(const char *dir, int files)
{
    char path[4200];
    snprintf(path, sizeof path, "%.4000s/meta.loom", dir);
    remove(path);
    for (int r = 0; r < files; r++) {
        snprintf(path, sizeof path, "%.4000s/shard-%d.loom", dir, r);
        remove(path);
    }
    rmdir(dir);
}

/* A sharded checkpoint (ckpt.h): every rank writes its own state into
 * DIR.tmp, then rank 0 adds meta.loom and moves it into place, so DIR is
 * always a whole checkpoint. Ranks that repeat another's state (the
 * sequence axis) write an empty shard file. */
static int save_sharded(trainer *t, const char *dir)
{
    if (!t->dp->data_get_shard && !t->dp->data_get_state)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED, "strategy %s can save no checkpoint (it "
                         "implements neither data_get_shard nor data_get_state)",
                         t->dp_plugin->header->name);
    char tmp[4200], name[4100];
    snprintf(tmp, sizeof tmp, "%.4000s.tmp", dir);
    if (t->rank == 0) {
        remove_dir(tmp, t->world);
        if (mkdir(tmp, 0777) != 0)
            return loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot create '%s': %s", tmp,
                             strerror(errno));
    }
    snprintf(name, sizeof name, "ckpt/%.4000s/begin", dir);
    int rc = barrier(t, name);
    size_t biggest = 0;
    for (int i = 0; i < t->nunits; i++)
        biggest = t->units[i].numel > biggest ? t->units[i].numel : biggest;
    float *buf = malloc(3 * biggest * sizeof(float));
    loom_ckpt_shard_writer w;
    memset(&w, 0, sizeof w);
    if (rc == LOOM_OK && !buf)
        rc = loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    if (rc == LOOM_OK)
        rc = loom_ckpt_shard_open(&w, tmp, t->rank);
    int writes = t->mesh->coords[LOOM_AXIS_SP] == 0;
    for (int i = 0; rc == LOOM_OK && writes && i < t->nunits; i++)
        if (holds(t, i))
            rc = save_unit_shard(t, &w, i, buf);
    if (w.f) {
        int closed = loom_ckpt_shard_close(&w);
        rc = rc == LOOM_OK ? closed : rc;
    }
    free(buf);
    snprintf(name, sizeof name, "ckpt/%.4000s/written", dir);
    if (rc == LOOM_OK)
        rc = barrier(t, name);
    if (rc == LOOM_OK && t->rank == 0) {
        loom_ckpt_header h;
        fill_header(t, &h);
        const loom_param_shard **shards = calloc((size_t)t->nunits, sizeof *shards);
        for (int i = 0; shards && i < t->nunits; i++)
            shards[i] = t->tp_shards ? t->tp_shards[i] : loom_model_shards(t->model, i);
        rc = shards ? loom_ckpt_write_meta(tmp, &h, t->mesh->sizes[LOOM_AXIS_TP], t->world,
                                           t->dp_plugin->header->name, t->units, shards)
                    : loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
        free(shards);
        remove_dir(dir, t->world);
        if (rc == LOOM_OK && rename(tmp, dir) != 0)
            rc = loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot move '%s' to '%s': %s", tmp,
                           dir, strerror(errno));
    }
    return rc;
}

/* Whole arrays -> this tp rank's slices -> the data strategy. */
static int set_unit_state(trainer *t, int i, float *p, float *m, float *v)
{
    if (t->mesh->sizes[LOOM_AXIS_TP] == 1)
        return t->dp->data_set_state(t->strategy, dp_unit(t, i), p, m, v);
    size_t n = t->units[i].numel;
    float *local = malloc(3 * n * sizeof(float) + 1);
    if (!local)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory for a checkpoint");
    loom_model_slice(t->model, i, p, local);
    loom_model_slice(t->model, i, m, local + n);
    loom_model_slice(t->model, i, v, local + 2 * n);
    int rc = t->dp->data_set_state(t->strategy, dp_unit(t, i), local, local + n, local + 2 * n);
    free(local);
    return rc;
}

/* Any checkpoint, sharded or consolidated, on any mesh: unit by unit, the
 * whole arrays are read and each rank keeps its part. */
static int load_state(trainer *t, const char *path)
{
    if (!t->dp->data_set_state)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED, "strategy %s does not implement data_set_state",
                         t->dp_plugin->header->name);
    loom_ckpt *ck = NULL;
    int rc = loom_ckpt_open(path, &ck);
    if (rc != LOOM_OK)
        return rc;
    const loom_ckpt_header *h = loom_ckpt_header_of(ck);
    if (memcmp(&h->shape, &t->shape, sizeof t->shape) != 0 || h->nunits != t->nunits)
        rc = loom_fail(LOOM_ERR_INVALID, "--resume %s: the checkpoint's model shape differs from "
                       "the config's model.*", path);
    else if (h->dtype != t->dtype)
        rc = loom_fail(LOOM_ERR_INVALID, "--resume %s: saved with precision %s, the config says %s",
                       path, loom_dtype_name(h->dtype), loom_dtype_name(t->dtype));
    size_t biggest = 0;
    for (int i = 0; i < t->nunits; i++) {
        size_t n = loom_model_full_numel(t->model, i);
        biggest = n > biggest ? n : biggest;
    }
    float *whole = rc == LOOM_OK ? malloc(3 * biggest * sizeof(float)) : NULL;
    if (rc == LOOM_OK && !whole)
        rc = loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory for a checkpoint");
    for (int i = 0; rc == LOOM_OK && i < t->nunits; i++) {
        size_t n = loom_model_full_numel(t->model, i);
        if (!holds(t, i))
            continue;
        rc = loom_ckpt_read_unit(ck, t->units, i, whole, whole + n, whole + 2 * n);
        if (rc == LOOM_OK)
            rc = set_unit_state(t, i, whole, whole + n, whole + 2 * n);
    }
    sync_units(t);
    if (rc == LOOM_OK && t->pipeline) /* the last stage's copy of unit 0 */
        rc = loom_pipeline_sync_tied(t->pipeline);
    if (rc == LOOM_OK) {
        t->step = h->step;
        t->good_steps = h->good_steps;
        t->loader.position = (size_t)h->position;
        t->loader.micro = 0;
        t->loss_scale = h->loss_scale;
    }
    free(whole);
    loom_ckpt_close(ck);
    return rc;
}

/* llm.c's weights: every rank writes its shard, rank 0 joins them (no
 * rank but the writer ever holds the whole model). */
static int save_weights(trainer *t, const char *path)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%.4000s.shards", path);
    int rc = save_sharded(t, dir);
    if (rc == LOOM_OK && t->rank == 0) {
        loom_ckpt *ck = NULL;
        if ((rc = loom_ckpt_open(dir, &ck)) == LOOM_OK)
            rc = loom_ckpt_write_llmc(ck, t->model, path);
        loom_ckpt_close(ck);
        remove_dir(dir, t->world);
    }
    return rc;
}

/* ---- one step ---- */

static float step_dloss(const trainer *t)
{
    return t->loss_scale / ((float)t->micro_batch * (float)t->seq * (float)t->micro_batches);
}

static void trace_unit(const trainer *t, const char *what, int u, uint64_t start)
{
    char name[48];
    if (t->units[u].kind == LOOM_UNIT_BLOCK)
        snprintf(name, sizeof name, "%s block %d", what, u - 1);
    else
        snprintf(name, sizeof name, "%s %s", what, t->units[u].name);
    loom_trace_span(LOOM_LANE_COMPUTE, name, start, loom_now_ns(), 0);
}

static int run_micro_batch(trainer *t, int last_micro, float *loss)
{
    int rc, head = t->nunits - 1;
    loom_dataloader_next(&t->loader, t->inputs, t->targets);
    for (int u = 0; u < t->nunits; u++) {
        uint64_t t0 = loom_now_ns();
        if ((rc = HOOK(t, data_before_forward, u)) != LOOM_OK)
            return rc;
        /* The LM head is tied to wte: the embedding is needed again. */
        if (u == head && (rc = HOOK(t, data_before_forward, 0)) != LOOM_OK)
            return rc;
        if ((rc = loom_model_forward(t->model, u, t->inputs, t->targets, loss)) != LOOM_OK)
            return rc;
        if ((rc = HOOK(t, data_after_forward, u)) != LOOM_OK)
            return rc;
        if (u == head && (rc = HOOK(t, data_after_forward, 0)) != LOOM_OK)
            return rc;
        trace_unit(t, "forward", u, t0);
    }
    /* Each token's loss weighs 1/(tokens per micro-batch x micro-batches):
     * the rank's gradient is that of its mean loss over the step. */
    float dloss = step_dloss(t);
    for (int u = head; u >= 0; u--) {
        uint64_t t0 = loom_now_ns();
        if ((rc = HOOK(t, data_before_backward, u)) != LOOM_OK)
            return rc;
        if (u == head && (rc = HOOK(t, data_before_backward, 0)) != LOOM_OK)
            return rc; /* the head adds into wte's gradient */
        if ((rc = loom_model_backward(t->model, u, dloss)) != LOOM_OK)
            return rc;
        trace_unit(t, "backward", u, t0);
        if ((rc = grads_ready(t, u, last_micro)) != LOOM_OK)
            return rc;
    }
    return LOOM_OK;
}

typedef struct step_result {
    float loss, lr, grad_norm;
    int skipped;
    double seconds;
} step_result;

static void count_comm(trainer *t, int end)
{
    for (int a = 0; a < LOOM_AXIS_COUNT; a++) {
        loom_comm_counters now;
        loom_group_counters(t->mesh->groups[a], &now);
        if (!end) {
            t->comm_start[a] = now;
            continue;
        }
        for (int op = 0; op < LOOM_OP_COUNT; op++) {
            t->comm_step[a].calls[op] = now.calls[op] - t->comm_start[a].calls[op];
            t->comm_step[a].bytes[op] = now.bytes[op] - t->comm_start[a].bytes[op];
        }
    }
}

/* The loss lives on the last stage: sum over the pp group (the others
 * add 0). The idle share of the step, averaged over the stages. */
static int pipeline_totals(trainer *t, float *loss)
{
    loom_pipeline_stats st;
    loom_pipeline_get_stats(t->pipeline, &st);
    double both[2] = {*loss, st.step_s > 0 ? 1.0 - st.busy_s / st.step_s : 0};
    int rc = group_allreduce(t->mesh->groups[LOOM_AXIS_PP], both, 2, LOOM_F64, LOOM_SUM);
    *loss = (float)both[0];
    t->bubble = both[1] / t->mesh->sizes[LOOM_AXIS_PP];
    /* every stage's activation peak, for the metrics */
    loom_mem_usage u;
    loom_mem_usage_get(&u);
    int64_t mine[2] = {(int64_t)u.peak[LOOM_TIER_HOST][LOOM_PURPOSE_ACTIVATIONS], st.peak_live};
    loom_request *req = NULL;
    if (rc == LOOM_OK &&
        (rc = loom_core_comm_api.allgather(t->mesh->groups[LOOM_AXIS_PP], mine, t->stage_peaks, 2,
                                           LOOM_I64, &req)) == LOOM_OK)
        rc = loom_core_comm_api.wait(req);
    return rc;
}

static int run_step(trainer *t, step_result *r)
{
    uint64_t t0 = loom_now_ns();
    double loss_sum = 0;
    count_comm(t, 0);
    int rc;
    if (t->pipeline) {
        for (int k = 0; k < t->micro_batches; k++)
            loom_dataloader_next(&t->loader, t->mb_inputs[k], t->mb_targets[k]);
        if ((rc = loom_pipeline_step(t->pipeline, t->mb_inputs, t->mb_targets, step_dloss(t),
                                     &loss_sum)) != LOOM_OK)
            return rc;
    }
    for (int k = 0; !t->pipeline && k < t->micro_batches; k++) {
        float loss = 0;
        if ((rc = run_micro_batch(t, k == t->micro_batches - 1, &loss)) != LOOM_OK)
            return rc;
        loss_sum += loss;
    }
    if ((rc = t->dp->data_finish_backward(t->strategy)) != LOOM_OK)
        return rc;
    sync_units(t);
    /* The step's loss: the mean over micro-batches and dp ranks (computed
     * by the last pipeline stage alone). */
    const loom_comm_api *C = &loom_core_comm_api;
    float local = (float)(loss_sum / t->micro_batches), global = local;
    loom_request *req;
    if (t->pipeline && (rc = pipeline_totals(t, &local)) != LOOM_OK)
        return rc;
    /* sp ranks hold equal shares of each sequence's tokens */
    if (t->mesh->sizes[LOOM_AXIS_SP] > 1 &&
        (rc = group_allreduce(t->mesh->groups[LOOM_AXIS_SP], &local, 1, LOOM_F32, LOOM_AVG)) !=
            LOOM_OK)
        return rc;
    if ((rc = C->allreduce(t->mesh->groups[LOOM_AXIS_DP], &local, &global, 1, LOOM_F32, LOOM_AVG,
                           &req)) != LOOM_OK ||
        (rc = C->wait(req)) != LOOM_OK)
        return rc;
    double norm_sq = 0;
    if ((rc = t->dp->data_grad_norm_sq(t->strategy, &norm_sq)) != LOOM_OK)
        return rc;
    if (t->mesh->sizes[LOOM_AXIS_TP] > 1) {
        rc = tp_norm_sq(t, &norm_sq);
        memset(t->repl_grads, 0, t->repl_count * sizeof(float)); /* the next step's */
        if (rc != LOOM_OK)
            return rc;
    }
    /* each stage's units once */
    if (t->pipeline &&
        (rc = group_allreduce(t->mesh->groups[LOOM_AXIS_PP], &norm_sq, 1, LOOM_F64, LOOM_SUM)) !=
            LOOM_OK)
        return rc;
    float norm = (float)(sqrt(norm_sq) / t->loss_scale);
    r->loss = global;
    r->grad_norm = norm;
    r->lr = loom_lr_at(&t->schedule, t->step);
    r->skipped = !isfinite(norm);
    if (r->skipped) {
        /* fp16 overflow: drop the step and halve the scale */
        if (t->dtype == LOOM_F16 && t->rank == 0)
            loom_log(LOOM_LOG_INFO, "fp16: gradients overflowed at step %lld; loss scale %g -> %g",
                     (long long)t->step + 1, t->loss_scale, t->loss_scale / 2);
        if (t->dtype == LOOM_F16)
            t->loss_scale /= 2;
        t->good_steps = 0;
        if ((rc = t->dp->data_zero_grads(t->strategy)) != LOOM_OK)
            return rc;
        sync_units(t);
    } else {
        loom_optimizer_step s = {t->step + 1, r->lr, t->beta1, t->beta2, t->eps, t->weight_decay,
                                 1.0f / t->loss_scale, loom_adamw_update};
        if (t->clip > 0 && norm > t->clip)
            s.grad_scale *= t->clip / norm;
        if ((rc = t->dp->data_optimizer_step(t->strategy, &s)) != LOOM_OK)
            return rc;
        sync_units(t);
        if (t->pipeline && (rc = loom_pipeline_sync_tied(t->pipeline)) != LOOM_OK)
            return rc;
        if (t->dtype == LOOM_F16 && ++t->good_steps >= t->scale_window) {
            if (t->rank == 0)
                loom_log(LOOM_LOG_INFO, "fp16: %lld good steps; loss scale %g -> %g",
                         (long long)t->good_steps, t->loss_scale, t->loss_scale * 2);
            t->loss_scale *= 2;
            t->good_steps = 0;
        }
    }
    r->seconds = (double)(loom_now_ns() - t0) / 1e9;
    count_comm(t, 1);
    return LOOM_OK;
}

/* ---- reporting ---- */

static void human_bytes(uint64_t b, char *buf, size_t cap)
{
    if (b >= (1ull << 30))
        snprintf(buf, cap, "%.2f GiB", (double)b / (1ull << 30));
    else if (b >= (1ull << 20))
        snprintf(buf, cap, "%.1f MiB", (double)b / (1ull << 20));
    else
        snprintf(buf, cap, "%.1f KiB", (double)b / 1024);
}

static void print_progress(const trainer *t, const step_result *r)
{
    double tokens = (double)t->batch * t->seq;
    double tps = tokens / r->seconds;
    double mfu = loom_model_flops_per_token(t->model) * tps / (t->peak_flops * t->world);
    loom_mem_usage u;
    loom_mem_usage_get(&u);
    char mem[256] = "";
    size_t n = 0;
    for (int p = 0; p < LOOM_PURPOSE_COUNT; p++) {
        uint64_t b = u.peak[LOOM_TIER_HOST][p];
        if (!b)
            continue;
        char hb[32];
        human_bytes(b, hb, sizeof hb);
        n += (size_t)snprintf(mem + n, sizeof mem - n, "%s%s %s", n ? ", " : "",
                              loom_purpose_name((loom_purpose)p), hb);
    }
    char bubble[32] = "";
    if (t->pipeline)
        snprintf(bubble, sizeof bubble, " | bubble %4.1f%%", 100 * t->bubble);
    printf("step %4lld/%lld | loss %.6f | lr %.2e | norm %.4f | %7.1f ms | %8.0f tok/s | "
           "MFU %5.1f%%%s | peak host: %s%s\n",
           (long long)t->step + 1, (long long)t->steps, r->loss, r->lr, r->grad_norm,
           r->seconds * 1e3, tps, 100 * mfu, bubble, mem, r->skipped ? " | skipped" : "");
    fflush(stdout);
}

static void write_metrics(FILE *f, const trainer *t, const step_result *r)
{
    double tps = (double)t->batch * t->seq / r->seconds;
    loom_mem_usage u;
    loom_mem_usage_get(&u);
    fprintf(f,
            "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, "
            "\"tokens_per_s\": %.3f, \"step_ms\": %.3f, \"mfu\": %.6f, \"skipped\": %s, "
            "\"loss_scale\": %g, \"peak_bytes\": {",
            (long long)t->step + 1, r->loss, r->lr, r->grad_norm, tps, r->seconds * 1e3,
            loom_model_flops_per_token(t->model) * tps / (t->peak_flops * t->world),
            r->skipped ? "true" : "false", t->loss_scale);
    int first_tier = 1;
    for (int tier = 0; tier < LOOM_TIER_COUNT; tier++) {
        if (!u.peak_total[tier])
            continue;
        fprintf(f, "%s\"%s\": {", first_tier ? "" : ", ", loom_tier_name((loom_tier)tier));
        for (int p = 0; p < LOOM_PURPOSE_COUNT; p++)
            fprintf(f, "%s\"%s\": %llu", p ? ", " : "", loom_purpose_name((loom_purpose)p),
                    (unsigned long long)u.peak[tier][p]);
        fprintf(f, ", \"total\": %llu}", (unsigned long long)u.peak_total[tier]);
        first_tier = 0;
    }
    fprintf(f, "}");
    if (t->pipeline) {
        loom_pipeline_stats st;
        loom_pipeline_get_stats(t->pipeline, &st);
        fprintf(f, ", \"bubble\": %.6f, \"live_microbatches\": %d", t->bubble, st.peak_live);
        for (int k = 0; k < 2; k++) {
            fprintf(f, ", \"stage_%s\": [", k ? "live_microbatches" : "activation_bytes");
            for (int stage = 0; stage < t->mesh->sizes[LOOM_AXIS_PP]; stage++)
                fprintf(f, "%s%lld", stage ? ", " : "", (long long)t->stage_peaks[2 * stage + k]);
            fprintf(f, "]");
        }
    }
    /* this step's traffic per axis and op, from the groups' counters:
     * "comm_bytes": {"tp.allreduce": 4096, ...}, the same keys for calls */
    for (int k = 0; k < 2; k++) {
        fprintf(f, ", \"comm_%s\": {", k ? "calls" : "bytes");
        int first = 1;
        for (int a = 0; a < LOOM_AXIS_COUNT; a++)
            for (int op = 0; op < LOOM_OP_COUNT; op++) {
                uint64_t n = k ? t->comm_step[a].calls[op] : t->comm_step[a].bytes[op];
                if (!t->comm_step[a].calls[op])
                    continue;
                fprintf(f, "%s\"%s.%s\": %llu", first ? "" : ", ", loom_axis_name((loom_axis)a),
                        loom_comm_op_name((loom_comm_op)op), (unsigned long long)n);
                first = 0;
            }
        fprintf(f, "}");
    }
    fprintf(f, "}\n");
    fflush(f);
}

/* Which units each pipeline stage holds, and on which pp rank. */
static void print_stages(const trainer *t)
{
    int p = t->mesh->sizes[LOOM_AXIS_PP], stages = p * t->pipe_schedule.virtual_stages;
    printf("pipeline stages:");
    for (int st = 0; st < stages; st++) {
        int first = t->stage_first[st], last = t->stage_last[st], L = t->shape.layers;
        int b0 = first == 0 ? 0 : first - 1, b1 = last == L + 1 ? L - 1 : last - 1;
        printf("%s %d (pp rank %d):%s", st ? " |" : "", st, st % p, first == 0 ? " embedding" : "");
        if (b1 >= b0)
            printf("%s block%s %d", first == 0 ? " +" : "", b1 > b0 ? "s" : "", b0);
        if (b1 > b0)
            printf("-%d", b1);
        if (last == L + 1)
            printf(" + head");
    }
    printf("\n");
}

static void print_header(const trainer *t)
{
    size_t params = 0;
    for (int i = 0; i < t->nunits; i++)
        params += loom_model_full_numel(t->model, i);
    char desc[768] = "";
    if (t->dp->describe)
        t->dp->describe(t->strategy, desc, 256);
    const axis_strategy *axes[3] = {&t->tp, &t->sp, &t->pp};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(desc);
        if (axes[i]->s && n + 3 < sizeof desc) {
            snprintf(desc + n, sizeof desc - n, "; ");
            axes[i]->ops->describe(axes[i]->s, desc + n + 2, sizeof desc - n - 2);
        }
    }
    double stated = read_float(t->cfg, "train.peak_gflops");
    printf("loom train: GPT-2 L=%d C=%d NH=%d V=%d (Vp %d), %.2fM parameters; batch %d x seq %d "
           "(micro-batch %d x %d %s); %s; %s; %d rank%s, dp over %s; MFU against "
           "%.1f GFLOP/s per rank (%s)\n",
           t->shape.layers, t->shape.channels, t->shape.heads, t->shape.vocab,
           t->shape.padded_vocab, (double)params / 1e6, t->batch, t->seq, t->micro_batch,
           t->micro_batches, t->pipeline ? "pipelined" : "accumulation",
           loom_dtype_name(t->dtype), desc, t->world, t->world == 1 ? "" : "s",
           loom_core_comm_api.backend(t->mesh->groups[LOOM_AXIS_DP]), t->peak_flops / 1e9,
           stated > 0 ? "train.peak_gflops" : "sgemm measured at start");
    if (t->pipeline)
        print_stages(t);
    fflush(stdout);
}

/* Every rank writes its part; rank 0 merges them once all have. */
static int write_trace(trainer *t, const char *path)
{
    char **parts = calloc((size_t)t->world, sizeof *parts);
    int rc = parts ? LOOM_OK : loom_fail(LOOM_ERR_NO_MEMORY, "trace: out of memory");
    for (int r = 0; r < t->world && rc == LOOM_OK; r++) {
        size_t len = strlen(path) + 32;
        if (!(parts[r] = malloc(len)))
            rc = loom_fail(LOOM_ERR_NO_MEMORY, "trace: out of memory");
        else
            snprintf(parts[r], len, "%s.rank%d", path, r);
    }
    if (rc == LOOM_OK)
        rc = loom_trace_write_part(parts[t->rank]);
    loom_store *store = loom_runtime_store(t->rt);
    if (rc == LOOM_OK && store)
        rc = loom_store_barrier(store, "train/trace", loom_runtime_timeout(t->rt));
    if (rc == LOOM_OK && t->rank == 0) {
        rc = loom_trace_merge(path, (const char *const *)parts, t->world);
        if (rc == LOOM_OK)
            printf("wrote trace %s\n", path);
    }
    for (int r = 0; parts && r < t->world; r++)
        free(parts[r]);
    free(parts);
    return rc;
}

static int train(trainer *t, const loom_train_options *o)
{
    int rc = LOOM_OK;
    if (o->resume && (rc = load_state(t, o->resume)) != LOOM_OK)
        return rc;
    FILE *metrics = NULL;
    if (o->metrics && t->rank == 0 && !(metrics = fopen(o->metrics, "w")))
        return loom_fail(LOOM_ERR_INVALID, "--metrics %s: %s", o->metrics, strerror(errno));
    if (o->trace)
        loom_trace_enable(t->rank);
    int64_t every = 0;
    loom_config_int(t->cfg, "train.checkpoint_every", &every);
    const char *dir = "checkpoints";
    loom_config_string(t->cfg, "train.checkpoint_dir", &dir);
    if (t->rank == 0)
        print_header(t);
    loom_mem_usage_reset_peak();
    while (t->step < t->steps) {
        step_result r;
        if ((rc = run_step(t, &r)) != LOOM_OK)
            break;
        if (t->rank == 0) {
            print_progress(t, &r);
            if (metrics)
                write_metrics(metrics, t, &r);
        }
        t->step++;
        if (every > 0 && t->step % every == 0 && t->step < t->steps) {
            char path[4096];
            if (t->rank == 0)
                mkdir(dir, 0777);
            snprintf(path, sizeof path, "%s/step-%lld", dir, (long long)t->step);
            if ((rc = save_sharded(t, path)) != LOOM_OK)
                break;
            if (t->rank == 0)
                printf("saved %s\n", path);
        }
    }
    if (metrics)
        fclose(metrics);
    if (rc == LOOM_OK && o->save && (rc = save_weights(t, o->save)) == LOOM_OK && t->rank == 0)
        printf("saved %s\n", o->save);
    if (rc == LOOM_OK && o->trace)
        rc = write_trace(t, o->trace);
    return rc;
}

int loom_train(const loom_train_options *o)
{
    trainer t;
    memset(&t, 0, sizeof t);
    int rc = setup_trainer(&t, o);
    if (rc == LOOM_OK)
        rc = train(&t, o);
    teardown(&t);
    return rc;
}
