/* loom train — The tensor- and sequence-parallel glue: the model's parallel ops
 * (attention, region enter/exit, shards, vocab and gradient reductions)
 * answered by the tp and sp strategies over their groups. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom/status.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "train/trainer.h"

/* This rank's positions of each sequence: the sequence strategy's (a
 * contiguous block by default). Every sp rank must hold the same number
 * and together they must cover the sequence once: the loss averages over
 * them with equal weights. */
static int sequence_positions(trainer *t)
{
    int s = t->job.mesh->sizes[LOOM_AXIS_SP], r = t->job.mesh->coords[LOOM_AXIS_SP];
    t->axes.positions = malloc((size_t)t->job.seq * sizeof(int));
    int *all = malloc((size_t)t->job.seq * (size_t)s * sizeof(int));
    int *counts = malloc((size_t)s * sizeof(int));
    char *seen = calloc((size_t)t->job.seq, 1);
    int rc = t->axes.positions && all && counts && seen
                 ? LOOM_OK
                 : loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    int count = 0;
    if (rc == LOOM_OK && t->axes.sp.ops->sequence_positions) {
        if ((rc = t->axes.sp.ops->sequence_positions(t->axes.sp.s, t->job.seq, t->axes.positions,
                                                     &count)) != LOOM_OK)
            rc = trainer_fail_at(t, rc, "train.seq");
    } else if (rc == LOOM_OK) {
        if (t->job.seq % s != 0)
            rc = loom_fail(LOOM_ERR_INVALID,
                           "%s: train.seq = %d does not divide by parallel.sp.size = %d",
                           loom_config_where(t->job.cfg, "train.seq"), t->job.seq, s);
        count = t->job.seq / s;
        for (int i = 0; rc == LOOM_OK && i < count; i++)
            t->axes.positions[i] = r * count + i;
    }
    const loom_comm_api *C = &loom_core_comm_api;
    loom_group *g = t->job.mesh->groups[LOOM_AXIS_SP];
    loom_request *req = NULL;
    if (rc == LOOM_OK && (rc = C->allgather(g, &count, counts, 1, LOOM_I32, &req)) == LOOM_OK)
        rc = C->wait(req);
    for (int i = 0; rc == LOOM_OK && i < s; i++)
        if (counts[i] != t->job.seq / s || t->job.seq % s != 0)
            rc = loom_fail(LOOM_ERR_INVALID,
                           "%s: sp rank %d holds %d of the %d positions; every rank of "
                           "parallel.sp.size = %d must hold seq/size of them",
                           loom_config_where(t->job.cfg, "parallel.sp.strategy"), i, counts[i],
                           t->job.seq, s);
    if (rc == LOOM_OK &&
        (rc = C->allgather(g, t->axes.positions, all, (size_t)count, LOOM_I32, &req)) == LOOM_OK)
        rc = C->wait(req);
    for (int i = 0; rc == LOOM_OK && i < count * s; i++) {
        if (all[i] < 0 || all[i] >= t->job.seq || seen[all[i]]++)
            rc = loom_fail(LOOM_ERR_INVALID,
                           "%s: the sequence strategy gave position %d %s; the sp ranks must "
                           "hold each position of the sequence once",
                           loom_config_where(t->job.cfg, "parallel.sp.strategy"), all[i],
                           all[i] < 0 || all[i] >= t->job.seq ? "outside the sequence" : "twice");
    }
    t->axes.npositions = count;
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
    return t->axes.sp.ops->attention_forward(t->axes.sp.s, a);
}

static int op_attention_backward(void *ctx, const loom_attention *a)
{
    trainer *t = ctx;
    return t->axes.sp.ops->attention_backward(t->axes.sp.s, a);
}

static int op_enter(void *ctx, loom_region r, const loom_tensor *x, loom_tensor *out)
{
    trainer *t = ctx;
    return t->axes.tp.ops->tensor_enter(t->axes.tp.s, r, x, out);
}

static int op_exit(void *ctx, loom_region r, const loom_tensor *partial, loom_tensor *out)
{
    trainer *t = ctx;
    return t->axes.tp.ops->tensor_exit(t->axes.tp.s, r, partial, out);
}

static int op_exit_backward(void *ctx, loom_region r, const loom_tensor *dout,
                            loom_tensor *dpartial)
{
    trainer *t = ctx;
    return t->axes.tp.ops->tensor_exit_backward(t->axes.tp.s, r, dout, dpartial);
}

static int op_enter_backward(void *ctx, loom_region r, const loom_tensor *din, loom_tensor *dx)
{
    trainer *t = ctx;
    return t->axes.tp.ops->tensor_enter_backward(t->axes.tp.s, r, din, dx);
}

static int op_shard(void *ctx, const loom_param_desc *param, loom_param_shard *out)
{
    trainer *t = ctx;
    return t->axes.tp.ops->tensor_shard(t->axes.tp.s, param, out);
}

int trainer_group_allreduce(loom_group *g, void *data, size_t count, loom_dtype dtype,
                            loom_redop op)
{
    const loom_comm_api *C = &loom_core_comm_api;
    loom_request *req = NULL;
    int rc = C->allreduce(g, data, data, count, dtype, op, &req);
    return rc == LOOM_OK ? C->wait(req) : rc;
}

static int op_vocab_reduce(void *ctx, float *data, size_t count, loom_redop op)
{
    trainer *t = ctx;
    return trainer_group_allreduce(t->job.mesh->groups[LOOM_AXIS_TP], data, count, LOOM_F32, op);
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
    if (t->job.mesh->sizes[LOOM_AXIS_SP] > 1 &&
        (rc = trainer_group_allreduce(t->job.mesh->groups[LOOM_AXIS_SP], grads, unit->numel,
                                      LOOM_F32, LOOM_SUM)) != LOOM_OK)
        return rc;
    if (t->job.mesh->sizes[LOOM_AXIS_TP] == 1)
        return LOOM_OK;
    float *keep = t->axes.repl_grads + t->axes.repl_offset[unit->index];
    for (int i = 0; i < unit->ntensors;) {
        if (unit->tensors[i].split != LOOM_SPLIT_REPLICATED) {
            i++;
            continue;
        }
        /* a run of consecutive replicated tensors: one reduction */
        size_t off = unit->tensors[i].offset, n = 0;
        while (i < unit->ntensors && unit->tensors[i].split == LOOM_SPLIT_REPLICATED)
            n += unit->tensors[i++].count;
        if (t->axes.seqpar &&
            (rc = trainer_group_allreduce(t->job.mesh->groups[LOOM_AXIS_TP], grads + off, n,
                                          LOOM_F32, LOOM_SUM)) != LOOM_OK)
            return rc;
        if ((rc = BACKEND(t, residual_forward, keep, keep, grads + off, n)) != LOOM_OK)
            return rc;
        keep += n;
    }
    return LOOM_OK;
}

/* Every tp rank's slices of every unit, for checkpoints; and the room for
 * the replicated gradients. */
static int setup_tp_state(trainer *t)
{
    int tp = t->job.mesh->sizes[LOOM_AXIS_TP];
    t->axes.tp_shards = calloc((size_t)t->job.nunits, sizeof *t->axes.tp_shards);
    t->axes.repl_offset = calloc((size_t)t->job.nunits, sizeof *t->axes.repl_offset);
    if (!t->axes.tp_shards || !t->axes.repl_offset)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    const loom_comm_api *C = &loom_core_comm_api;
    for (int u = 0; u < t->job.nunits; u++) {
        const loom_unit *unit = &t->job.units[u];
        size_t n = (size_t)unit->ntensors;
        const loom_param_shard *mine = loom_model_shards(t->job.model, u);
        if (!(t->axes.tp_shards[u] = malloc((size_t)tp * n * sizeof(loom_param_shard))))
            return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
        loom_request *req = NULL;
        int rc = C->allgather(t->job.mesh->groups[LOOM_AXIS_TP], mine, t->axes.tp_shards[u],
                              n * sizeof(loom_param_shard) / sizeof(int64_t), LOOM_I64, &req);
        if (rc == LOOM_OK)
            rc = C->wait(req);
        if (rc != LOOM_OK)
            return rc;
        for (int r = 0; r < tp; r++)
            for (size_t i = 0; i < n; i++)
                if (t->axes.tp_shards[u][(size_t)r * n + i].count != mine[i].count)
                    return loom_fail(LOOM_ERR_INVALID,
                                     "%s: the tp strategy gives %s %lld rows/columns on tp rank "
                                     "%d but %lld on this one; checkpoints need equal slices",
                                     loom_config_where(t->job.cfg, "parallel.tp.strategy"),
                                     unit->tensors[i].name,
                                     (long long)t->axes.tp_shards[u][(size_t)r * n + i].count, r,
                                     (long long)mine[i].count);
        t->axes.repl_offset[u] = t->axes.repl_count;
        for (size_t i = 0; i < n; i++)
            if (unit->tensors[i].split == LOOM_SPLIT_REPLICATED)
                t->axes.repl_count += unit->tensors[i].count;
    }
    size_t bytes = (t->axes.repl_count ? t->axes.repl_count : 1) * sizeof(float);
    int rc = loom_mem_alloc((loom_tier)t->job.backend->ops->tier, LOOM_PURPOSE_GRADS, bytes,
                            (void **)&t->axes.repl_grads);
    if (rc == LOOM_OK)
        rc = BACKEND(t, zero, t->axes.repl_grads, bytes);
    return rc;
}

/* Load the tp and sp strategies the mesh needs, find this rank's
 * positions, and create the model with its local shapes and hooks. */
int trainer_setup_parallel_model(trainer *t, int recompute)
{
    int tp = t->job.mesh->sizes[LOOM_AXIS_TP], sp = t->job.mesh->sizes[LOOM_AXIS_SP], rc;
    if (tp > 1) {
        if ((rc = trainer_create_axis(t, LOOM_AXIS_TP, &t->axes.tp)) != LOOM_OK)
            return rc;
        loom_config_bool(t->job.cfg, "parallel.tp.sequence_parallel", &t->axes.seqpar);
    }
    if (sp > 1 && (rc = trainer_create_axis(t, LOOM_AXIS_SP, &t->axes.sp)) != LOOM_OK)
        return rc;
    if (sp > 1) {
        if ((rc = sequence_positions(t)) != LOOM_OK)
            return rc;
        if ((rc = loom_dataloader_set_positions(&t->data.loader, t->axes.positions,
                                                t->axes.npositions)) != LOOM_OK)
            return rc;
    }
    loom_model_setup ms = {t->job.shape, t->job.micro_batch, t->job.seq, t->job.dtype, recompute,
                           t->job.backend};
    loom_model_layout lay;
    memset(&lay, 0, sizeof lay);
    lay.tp_size = tp;
    lay.tp_rank = t->job.mesh->coords[LOOM_AXIS_TP];
    lay.sequence_parallel = t->axes.seqpar;
    lay.tensor_shard = tp > 1 ? op_shard : NULL;
    lay.shard_ctx = t;
    lay.sp_size = sp;
    lay.positions = sp > 1 ? t->axes.positions : NULL;
    lay.npositions = sp > 1 ? t->axes.npositions : t->job.seq;
    lay.runs_unit = t->pipe.runs; /* NULL without a pipeline: every unit */
    if ((rc = loom_model_create_parallel(&ms, &lay, &t->job.model)) != LOOM_OK)
        return t->axes.seqpar ? trainer_fail_at(t, rc, "parallel.tp.sequence_parallel") : rc;
    t->job.units = loom_model_units(t->job.model, &t->job.nunits);
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
    loom_model_set_ops(t->job.model, &ops);
    return tp > 1 ? setup_tp_state(t) : LOOM_OK;
}

/* The global gradient norm's square: the data strategy's sum covers this
 * tp rank's slices (once over the dp group) and the replicated tensors,
 * which every tp rank holds alike; sum over tp and count those once. */
int trainer_tp_norm_sq(trainer *t, double *norm_sq)
{
    int tp = t->job.mesh->sizes[LOOM_AXIS_TP], rc;
    if ((rc = trainer_group_allreduce(t->job.mesh->groups[LOOM_AXIS_TP], norm_sq, 1, LOOM_F64,
                                      LOOM_SUM)) != LOOM_OK)
        return rc;
    /* the replicated gradients as the data strategy holds them: averaged over dp */
    if (t->job.mesh->sizes[LOOM_AXIS_DP] > 1 &&
        (rc = trainer_group_allreduce(t->job.mesh->groups[LOOM_AXIS_DP], t->axes.repl_grads,
                                      t->axes.repl_count, LOOM_F32, LOOM_AVG)) != LOOM_OK)
        return rc;
    float *host = malloc((t->axes.repl_count ? t->axes.repl_count : 1) * sizeof(float));
    if (!host)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    rc = BACKEND(t, to_host, host, t->axes.repl_grads, t->axes.repl_count * sizeof(float));
    double repl = 0;
    for (size_t i = 0; i < t->axes.repl_count; i++)
        repl += (double)host[i] * host[i];
    free(host);
    if (rc != LOOM_OK)
        return rc;
    *norm_sq -= (double)(tp - 1) * repl;
    if (*norm_sq < 0 && isfinite(*norm_sq))
        *norm_sq = 0; /* rounding, when the slices carry no gradient */
    return LOOM_OK;
}

void trainer_teardown_model_axes(trainer *t)
{
    trainer_model_axes *a = &t->axes;
    if (a->tp.s)
        a->tp.ops->destroy(a->tp.s);
    if (a->sp.s)
        a->sp.ops->destroy(a->sp.s);
    for (int i = 0; a->tp_shards && i < t->job.nunits; i++)
        free(a->tp_shards[i]);
    free(a->tp_shards);
    loom_mem_free(a->repl_grads);
    free(a->repl_offset);
    free(a->positions);
}
