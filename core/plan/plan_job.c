/* loom plan — the job `loom plan` plans: the settings `loom train` reads,
 * with the same defaults and the same refusals where they matter to a plan
 * (the batch split, the stages), read from the config alone: no data, no
 * ranks. */
#include <stdlib.h>
#include <string.h>

#include "loom/status.h"
#include "model/gemm.h"
#include "runtime/log.h"
#include "train/pipeline.h"
#include "plan/plan.h"
#include "train/train.h"

static void read_int(loom_config *cfg, const char *path, int *out)
{
    int64_t v = 0;
    loom_config_int(cfg, path, &v);
    *out = (int)v;
}

/* train.precision's dtype, as the trainer reads it */
static loom_dtype read_precision(loom_config *cfg)
{
    const char *precision = "fp32";
    loom_config_string(cfg, "train.precision", &precision);
    return !strcmp(precision, "bf16") ? LOOM_BF16 : !strcmp(precision, "fp16") ? LOOM_F16 : LOOM_F32;
}

static void read_name(loom_config *cfg, const char *path, char *out, size_t cap)
{
    const char *v = "";
    loom_config_string(cfg, path, &v);
    snprintf(out, cap, "%s", v);
}

static int read_shape(loom_config *cfg, loom_plan_shape *out)
{
    const char *kind = "gpt2";
    loom_config_string(cfg, "model.kind", &kind);
    memset(out, 0, sizeof *out);
    if (!strcmp(kind, "gpt2")) {
        loom_gpt2_shape g;
        int rc = loom_train_model_shape(cfg, &g);
        if (rc != LOOM_OK)
            return rc;
        *out = (loom_plan_shape){LOOM_PLAN_GPT2, g.layers,   g.heads, g.heads,      g.channels,
                                 4 * g.channels, g.vocab, g.padded_vocab, g.max_seq};
        return LOOM_OK;
    }
    out->kind = LOOM_PLAN_LLAMA;
    read_int(cfg, "model.layers", &out->layers);
    read_int(cfg, "model.heads", &out->heads);
    read_int(cfg, "model.kv_heads", &out->kv_heads);
    read_int(cfg, "model.channels", &out->channels);
    read_int(cfg, "model.ffn", &out->ffn);
    read_int(cfg, "model.vocab", &out->vocab);
    read_int(cfg, "model.padded_vocab", &out->padded_vocab);
    read_int(cfg, "model.max_seq", &out->max_seq);
    if (out->kv_heads == 0)
        out->kv_heads = out->heads;
    if (out->ffn == 0)
        out->ffn = 4 * out->channels;
    if (!loom_config_is_set(cfg, "model.padded_vocab"))
        out->padded_vocab = out->vocab;
    return LOOM_OK;
}

/* The batch split as `loom train` splits it (setup.c): a pipeline's
 * micro-batches are its accumulation. */
static int split_batch(loom_config *cfg, loom_plan_job *j)
{
    int dp = j->sizes[LOOM_AXIS_DP], pp = j->sizes[LOOM_AXIS_PP];
    read_int(cfg, "train.grad_accum", &j->grad_accum);
    if (pp > 1) {
        if (j->grad_accum != 1)
            return loom_fail(LOOM_ERR_INVALID, "%s: with a pipeline, parallel.pp.microbatches is "
                             "the gradient accumulation; set train.grad_accum = 1",
                             loom_config_where(cfg, "train.grad_accum"));
        j->grad_accum = j->microbatches;
    }
    const char *path = pp > 1 ? "parallel.pp.microbatches" : "train.grad_accum";
    if (j->batch % (dp * j->grad_accum) != 0)
        return loom_fail(LOOM_ERR_INVALID, "%s: train.batch %d does not divide by "
                         "parallel.dp.size %d × %s %d", loom_config_where(cfg, path), j->batch, dp,
                         path, j->grad_accum);
    j->micro_batch = j->batch / (dp * j->grad_accum);
    return LOOM_OK;
}

int loom_plan_job_read(loom_config *cfg, loom_plan_job *out)
{
    static const char *const sizes[LOOM_AXIS_COUNT] = {"parallel.tp.size", "parallel.sp.size",
                                                       "parallel.pp.size", "parallel.dp.size"};
    loom_plan_job j;
    memset(&j, 0, sizeof j);
    int rc = read_shape(cfg, &j.shape);
    if (rc != LOOM_OK)
        return rc;
    read_int(cfg, "train.batch", &j.batch);
    read_int(cfg, "train.seq", &j.seq);
    const char *recompute = "none";
    loom_config_string(cfg, "train.recompute", &recompute);
    j.dtype = read_precision(cfg);
    /* a bf16 run on oneDNN holds the bf16 copies of its products' operands */
    const char *gemm = "auto";
    loom_config_string(cfg, "model.gemm", &gemm);
    if ((rc = loom_gemm_select((loom_gemm_library)loom_gemm_library_parse(gemm), j.dtype)) != LOOM_OK) {
        char detail[512];
        snprintf(detail, sizeof detail, "%s", loom_last_error());
        return loom_fail(rc, "%s: %s", loom_config_where(cfg, "model.gemm"), detail);
    }
    j.recompute = !strcmp(recompute, "block");
    for (int a = 0; a < LOOM_AXIS_COUNT; a++)
        read_int(cfg, sizes[a], &j.sizes[a]);
    read_name(cfg, "parallel.dp.strategy", j.dp_strategy, sizeof j.dp_strategy);
    read_name(cfg, "model.device", j.device, sizeof j.device);
    /* the shipped strategies' own settings, at their defaults when unset
     * (plugins/strategy/zero.c, ddp.c, diloco.c) */
    j.prefetch = 1;
    if (loom_config_is_set(cfg, "parallel.dp.prefetch"))
        read_int(cfg, "parallel.dp.prefetch", &j.prefetch);
    read_int(cfg, "parallel.dp.shard_size", &j.shard_size);
    j.bucket_mb = 25.0;
    if (loom_config_is_set(cfg, "parallel.dp.bucket_mb"))
        loom_config_float(cfg, "parallel.dp.bucket_mb", &j.bucket_mb);
    j.sync_every = 16;
    if (loom_config_is_set(cfg, "parallel.dp.sync_every"))
        read_int(cfg, "parallel.dp.sync_every", &j.sync_every);
    loom_config_bool(cfg, "parallel.tp.sequence_parallel", &j.sequence_parallel);
    read_name(cfg, "parallel.sp.strategy", j.sp_strategy, sizeof j.sp_strategy);
    read_name(cfg, "parallel.pp.schedule", j.schedule, sizeof j.schedule);
    read_int(cfg, "parallel.pp.virtual_stages", &j.virtual_stages);
    read_int(cfg, "parallel.pp.microbatches", &j.microbatches);
    const char *where[2] = {"none", "none"};
    loom_config_string(cfg, "memory.offload.optimizer", &where[0]);
    loom_config_string(cfg, "memory.offload.params", &where[1]);
    for (int k = 0; k < 2; k++) {
        loom_offload o = !strcmp(where[k], "host") ? LOOM_OFFLOAD_HOST
                         : !strcmp(where[k], "nvme") ? LOOM_OFFLOAD_NVME : LOOM_OFFLOAD_NONE;
        if (k == 0)
            j.offload[LOOM_PURPOSE_OPTIMIZER] = o;
        else
            j.offload[LOOM_PURPOSE_PARAMS] = j.offload[LOOM_PURPOSE_GRADS] = o;
    }
    /* offload-nvme's own settings, at its defaults when unset */
    int64_t depth = 8, block = 1048576;
    loom_config_int(cfg, "memory.offload.queue_depth", &depth);
    loom_config_int(cfg, "memory.offload.block_bytes", &block);
    j.nvme_queue_depth = (int)depth;
    j.nvme_block_bytes = (uint64_t)block;
    if ((rc = split_batch(cfg, &j)) != LOOM_OK)
        return rc;
    int stages = j.sizes[LOOM_AXIS_PP] * j.virtual_stages;
    j.stage_first = calloc((size_t)stages, sizeof *j.stage_first);
    j.stage_last = calloc((size_t)stages, sizeof *j.stage_last);
    if (!j.stage_first || !j.stage_last)
        rc = loom_fail(LOOM_ERR_NO_MEMORY, "plan: out of memory");
    if (rc == LOOM_OK)
        rc = loom_split_stages(cfg, j.shape.layers, stages, j.stage_first, j.stage_last);
    if (rc != LOOM_OK) {
        loom_plan_job_free(&j);
        return rc;
    }
    *out = j;
    return LOOM_OK;
}

void loom_plan_job_free(loom_plan_job *job)
{
    free(job->stage_first);
    free(job->stage_last);
    job->stage_first = job->stage_last = NULL;
}
