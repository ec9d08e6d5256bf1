/* loom train — The pipeline axis: which units each stage holds, the units the data
 * strategy is given, and the validated schedule the executor runs. */
#include <stdlib.h>
#include <string.h>

#include "loom/status.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "train/trainer.h"

/* ---- the pipeline axis ---- */

/* Units of each of the pp × virtual_stages stages: the blocks split evenly
 * (or as parallel.pp.stage_layers says), the embedding with the first
 * stage, the final LayerNorm, LM head and loss with the last. */
int loom_split_stages(loom_config *cfg, int layers, int stages, int *first, int *last)
{
    const char *list = "parallel.pp.stage_layers";
    int L = layers, listed = loom_config_list_len(cfg, list), blocks = 0;
    if (listed > 0 && listed != stages)
        return loom_fail(LOOM_ERR_INVALID, "%s: %s has %d entries for %d stages "
                         "(parallel.pp.size × virtual_stages)", loom_config_where(cfg, list),
                         list, listed, stages);
    if (listed <= 0 && L % stages != 0)
        return loom_fail(LOOM_ERR_INVALID, "%s: model.layers = %d do not split evenly over %d "
                         "stages (parallel.pp.size × virtual_stages); list the layers of each "
                         "stage in %s", loom_config_where(cfg, "parallel.pp.size"), L, stages,
                         list);
    for (int st = 0; st < stages; st++) {
        int64_t n = L / stages;
        if (listed > 0) {
            char path[64];
            snprintf(path, sizeof path, "%s[%d]", list, st);
            loom_config_int(cfg, path, &n);
        }
        first[st] = st == 0 ? 0 : blocks + 1;
        blocks += (int)n;
        last[st] = st == stages - 1 ? L + 1 : blocks;
        if (last[st] < first[st])
            return loom_fail(LOOM_ERR_INVALID, "%s: stage %d holds no layer; every stage but the "
                             "first and the last needs one", loom_config_where(cfg, list), st);
    }
    if (blocks != L)
        return loom_fail(LOOM_ERR_INVALID, "%s: the stages hold %d layers, the model has %d "
                         "(model.layers)", loom_config_where(cfg, list), blocks, L);
    return LOOM_OK;
}

static int split_stages(trainer *t, int stages)
{
    t->pipe.stage_first = calloc((size_t)stages, sizeof *t->pipe.stage_first);
    t->pipe.stage_last = calloc((size_t)stages, sizeof *t->pipe.stage_last);
    if (!t->pipe.stage_first || !t->pipe.stage_last)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    return loom_split_stages(t->job.cfg, t->job.shape.layers, stages, t->pipe.stage_first,
                             t->pipe.stage_last);
}

/* The units the data strategy looks after: all of them, or on a pipeline
 * those of this rank's stages. */
int trainer_choose_units(trainer *t)
{
    t->data_axis.index = malloc((size_t)t->job.nunits * sizeof *t->data_axis.index);
    if (!t->data_axis.index)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    if (!t->pipe.runs) {
        for (int u = 0; u < t->job.nunits; u++)
            t->data_axis.index[u] = u;
        t->data_axis.units = t->job.units;
        t->data_axis.nunits = t->job.nunits;
        return LOOM_OK;
    }
    t->data_axis.units = calloc((size_t)t->job.nunits, sizeof *t->data_axis.units);
    if (!t->data_axis.units)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    for (int u = 0; u < t->job.nunits; u++) {
        t->data_axis.index[u] = t->pipe.runs[u] ? t->data_axis.nunits : -1;
        if (t->pipe.runs[u])
            t->data_axis.units[t->data_axis.nunits++] = t->job.units[u];
    }
    return LOOM_OK;
}

static int pp_before_forward(void *ctx, int u)
{
    return HOOK((trainer *)ctx, data_before_forward, u);
}
static int pp_after_forward(void *ctx, int u)
{
    return HOOK((trainer *)ctx, data_after_forward, u);
}
static int pp_before_backward(void *ctx, int u)
{
    return HOOK((trainer *)ctx, data_before_backward, u);
}
static int pp_grads_ready(void *ctx, int u, int last_micro)
{
    return trainer_grads_ready(ctx, u, last_micro);
}

/* The schedule (validated before the first step) and its executor. */
int trainer_setup_pipeline(trainer *t, const float *unit0_init)
{
    int rc;
    loom_pipeline_setup ps;
    memset(&ps, 0, sizeof ps);
    ps.schedule = &t->pipe.schedule;
    ps.rank = t->job.mesh->coords[LOOM_AXIS_PP];
    ps.group = t->job.mesh->groups[LOOM_AXIS_PP];
    ps.model = t->job.model;
    ps.stage_first = t->pipe.stage_first;
    ps.stage_last = t->pipe.stage_last;
    ps.dtype = t->job.dtype;
    ps.tied_init = unit0_init;
    ps.backend = t->job.backend;
    ps.hooks = (loom_pipeline_hooks){t, pp_before_forward, pp_after_forward, pp_before_backward,
                                     pp_grads_ready};
    if ((rc = loom_pipeline_create(&ps, &t->pipe.executor)) != LOOM_OK)
        return rc;
    t->pipe.stage_peaks =
        calloc(2 * (size_t)t->job.mesh->sizes[LOOM_AXIS_PP], sizeof *t->pipe.stage_peaks);
    size_t N = (size_t)t->job.micro_batch * t->job.seq;
    t->pipe.mb_inputs = calloc((size_t)t->job.micro_batches, sizeof *t->pipe.mb_inputs);
    t->pipe.mb_targets = calloc((size_t)t->job.micro_batches, sizeof *t->pipe.mb_targets);
    if (!t->pipe.mb_inputs || !t->pipe.mb_targets || !t->pipe.stage_peaks)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    for (int k = 0; k < t->job.micro_batches; k++)
        if (!(t->pipe.mb_inputs[k] = malloc(N * sizeof(int))) ||
            !(t->pipe.mb_targets[k] = malloc(N * sizeof(int))))
            return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    return LOOM_OK;
}

/* The pp shape and the schedule, before the model: the stages decide which
 * units this rank builds. */
int trainer_plan_pipeline(trainer *t)
{
    int p = t->job.mesh->sizes[LOOM_AXIS_PP], r = t->job.mesh->coords[LOOM_AXIS_PP], v = 1, rc;
    trainer_read_int(t->job.cfg, "parallel.pp.virtual_stages", &v);
    if ((rc = split_stages(t, p * v)) != LOOM_OK)
        return rc;
    if (!(t->pipe.runs = calloc((size_t)t->job.shape.layers + 2, 1)))
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    for (int vs = 0; vs < v; vs++)
        for (int u = t->pipe.stage_first[vs * p + r]; u <= t->pipe.stage_last[vs * p + r]; u++)
            t->pipe.runs[u] = 1;
    const char *name = NULL;
    const loom_host *host;
    loom_config_string(t->job.cfg, "parallel.pp.schedule", &name);
    if ((rc = loom_runtime_plugin(t->job.rt, LOOM_PLUGIN_SCHEDULE, name,
                                  &t->pipe.schedule_plugin)) != LOOM_OK)
        return trainer_fail_at(t, rc, "parallel.pp.schedule");
    if ((rc = loom_runtime_host(t->job.rt, t->pipe.schedule_plugin, "parallel.pp", &host)) !=
        LOOM_OK)
        return rc;
    if ((rc = loom_schedule_build(t->pipe.schedule_plugin, host, p, v, t->job.micro_batches,
                                  &t->pipe.schedule)) != LOOM_OK)
        return trainer_fail_at(t, rc, "parallel.pp.schedule");
    return LOOM_OK;
}

/* The loss lives on the last stage: sum over the pp group (the others
 * add 0). The idle share of the step, averaged over the stages. */
int trainer_pipeline_totals(trainer *t, float *loss)
{
    loom_pipeline_stats st;
    loom_pipeline_get_stats(t->pipe.executor, &st);
    double both[2] = {*loss, st.step_s > 0 ? 1.0 - st.busy_s / st.step_s : 0};
    int rc =
        trainer_group_allreduce(t->job.mesh->groups[LOOM_AXIS_PP], both, 2, LOOM_F64, LOOM_SUM);
    *loss = (float)both[0];
    t->pipe.bubble = both[1] / t->job.mesh->sizes[LOOM_AXIS_PP];
    /* every stage's activation peak, for the metrics */
    loom_mem_usage u;
    loom_mem_usage_get(&u);
    int64_t mine[2] = {(int64_t)u.peak[LOOM_TIER_HOST][LOOM_PURPOSE_ACTIVATIONS], st.peak_live};
    loom_request *req = NULL;
    if (rc == LOOM_OK &&
        (rc = loom_core_comm_api.allgather(t->job.mesh->groups[LOOM_AXIS_PP], mine,
                                           t->pipe.stage_peaks, 2, LOOM_I64, &req)) == LOOM_OK)
        rc = loom_core_comm_api.wait(req);
    return rc;
}

void trainer_teardown_pipeline(trainer *t)
{
    trainer_pipeline_run *p = &t->pipe;
    loom_pipeline_destroy(p->executor);
    loom_schedule_free(&p->schedule);
    for (int k = 0; p->mb_inputs && k < t->job.micro_batches; k++)
        free(p->mb_inputs[k]);
    for (int k = 0; p->mb_targets && k < t->job.micro_batches; k++)
        free(p->mb_targets[k]);
    free(p->mb_inputs);
    free(p->mb_targets);
    free(p->stage_first);
    free(p->stage_last);
    free(p->runs);
    free(p->stage_peaks);
}
