/* loom train — validation: the mean loss of the current weights over
 * train.eval_batches global batches of data.val, forward only.
 *
 * The validation batches are the first eval_batches of data.val in llm.c's
 * unshuffled order (data.readers and data.read_batch as for training, as
 * llm.c's val loader has its process count and -b), read again from the
 * start at every evaluation, and
 * split over the dp ranks and micro-batches exactly as a training batch
 * is: so every strategy and mesh evaluates the same tokens, and a
 * validation loss differs across meshes by the rounding of its reductions
 * only. Nothing is stepped and no gradient is touched: a run with
 * validation trains exactly as one without. */
#include <stdlib.h>
#include <string.h>

#include "loom/status.h"
#include "runtime/flight.h"
#include "runtime/log.h"
#include "runtime/trace.h"
#include "train/trainer.h"

int trainer_setup_eval(trainer *t)
{
    const char **patterns = NULL;
    int npatterns = 0;
    int rc = trainer_read_files(t->job.cfg, "data.val", &patterns, &npatterns);
    if (rc != LOOM_OK)
        return rc;
    if (npatterns == 0) {
        free(patterns);
        /* train_settings.c refuses eval settings without data.val; "" turns them off */
        if (t->job.rank == 0 && loom_config_is_set(t->job.cfg, "data.val") &&
            (loom_config_is_set(t->job.cfg, "train.eval_every") ||
             loom_config_is_set(t->job.cfg, "train.eval_batches")))
            loom_log(LOOM_LOG_INFO,
                     "%s: data.val = \"\": no validation (train.eval_every and "
                     "train.eval_batches unused)",
                     loom_config_where(t->job.cfg, "data.val"));
        return LOOM_OK;
    }
    rc = loom_dataset_open(&t->eval.data, "data.val", loom_config_where(t->job.cfg, "data.val"),
                           patterns, npatterns, t->job.shape.vocab);
    free(patterns);
    if (rc != LOOM_OK)
        return rc;
    if ((rc = trainer_read_int(t->job.cfg, "train.eval_every", &t->eval.every)) != LOOM_OK ||
        (rc = trainer_read_int(t->job.cfg, "train.eval_batches", &t->eval.batches)) != LOOM_OK)
        return rc;
    /* the plugin's own ops: the loader fills absent hooks with no-ops */
    const loom_plugin *dp = t->data_axis.plugin;
    if (loom_plugin_provides(dp, LOOM_OPTIONAL_DATA_BEFORE_FORWARD) &&
        !loom_plugin_provides(dp, LOOM_OPTIONAL_DATA_EVAL))
        return loom_fail(LOOM_ERR_NOT_SUPPORTED,
                         "%s: strategy %s gathers parameters in its forward hooks but cannot run "
                         "forward only (it has no data_eval, ABI 1.5); remove data.val or choose "
                         "another parallel.dp.strategy",
                         loom_config_where(t->job.cfg, "data.val"),
                         t->data_axis.plugin->header->name);
    loom_data_order order = {.batch = t->job.batch, .seq = t->job.seq, .shuffle = 0};
    trainer_read_int(t->job.cfg, "data.readers", &order.readers);
    trainer_read_int(t->job.cfg, "data.read_batch", &order.read_batch);
    if ((rc = loom_dataloader_init(
             &t->eval.loader, &t->eval.data, &order, t->job.mesh->coords[LOOM_AXIS_DP],
             t->job.mesh->sizes[LOOM_AXIS_DP], t->job.micro_batches)) != LOOM_OK)
        return rc;
    /* Reading past the end would repeat batches and weigh them twice. */
    const loom_data_order *o = &t->eval.loader.order;
    int64_t reads = 0, per_read = (int64_t)o->readers * o->read_batch * o->seq;
    for (int f = 0; f < t->eval.data.nfiles; f++)
        reads += (t->eval.data.tokens[f] - 1) / per_read;
    int64_t batches = reads / t->eval.loader.reads;
    if (t->eval.batches > batches)
        return loom_fail(LOOM_ERR_INVALID,
                         "%s: train.eval_batches = %d, but data.val holds %lld batches of "
                         "train.batch %d x train.seq %d before it repeats; set "
                         "train.eval_batches <= %lld or validate on more data",
                         loom_config_where(t->job.cfg, "train.eval_batches"), t->eval.batches,
                         (long long)batches, t->job.batch, t->job.seq, (long long)batches);
    if (t->axes.positions && (rc = loom_dataloader_set_positions(&t->eval.loader, t->axes.positions,
                                                                 t->axes.npositions)) != LOOM_OK)
        return rc;
    t->eval.on = 1;
    return LOOM_OK;
}

void trainer_teardown_eval(trainer *t)
{
    loom_dataloader_free(&t->eval.loader);
    loom_dataset_close(&t->eval.data);
}

/* The sum of the micro-batches' mean losses of one batch on this rank
 * (the last pipeline stage's; 0 on the other stages). */
static int eval_batch(trainer *t, double *loss_sum)
{
    int rc = LOOM_OK;
    if (t->pipe.executor) {
        for (int k = 0; k < t->job.micro_batches; k++)
            if ((rc = loom_dataloader_next(&t->eval.loader, t->pipe.mb_inputs[k],
                                           t->pipe.mb_targets[k])) != LOOM_OK)
                return rc;
        return loom_pipeline_evaluate(t->pipe.executor, t->pipe.mb_inputs, t->pipe.mb_targets,
                                      loss_sum);
    }
    *loss_sum = 0;
    for (int k = 0; rc == LOOM_OK && k < t->job.micro_batches; k++) {
        float loss = 0;
        if ((rc = loom_dataloader_next(&t->eval.loader, t->data.inputs, t->data.targets)) ==
            LOOM_OK)
            rc = trainer_forward(t, &loss);
        *loss_sum += loss;
    }
    return rc;
}

/* The mean over the batches, micro-batches, pipeline stages (the last
 * holds it), sequence shards and dp ranks. */
static int global_mean(trainer *t, double loss_sum, float *out)
{
    double local = loss_sum / ((double)t->eval.batches * t->job.micro_batches);
    loom_group **g = t->job.mesh->groups;
    int rc = LOOM_OK;
    if (t->pipe.executor)
        rc = trainer_group_allreduce(g[LOOM_AXIS_PP], &local, 1, LOOM_F64, LOOM_SUM);
    if (rc == LOOM_OK && t->job.mesh->sizes[LOOM_AXIS_SP] > 1)
        rc = trainer_group_allreduce(g[LOOM_AXIS_SP], &local, 1, LOOM_F64, LOOM_AVG);
    if (rc == LOOM_OK)
        rc = trainer_group_allreduce(g[LOOM_AXIS_DP], &local, 1, LOOM_F64, LOOM_AVG);
    *out = (float)local;
    return rc;
}

int trainer_evaluate(trainer *t, float *loss)
{
    uint64_t t0 = loom_now_ns();
    loom_flight_issuer("validation");
    loom_dataloader_rewind(&t->eval.loader);
    int rc = t->data_axis.ops->data_eval ? t->data_axis.ops->data_eval(t->data_axis.strategy, 1)
                                         : LOOM_OK;
    double loss_sum = 0;
    for (int b = 0; rc == LOOM_OK && b < t->eval.batches; b++) {
        double batch_sum = 0;
        rc = eval_batch(t, &batch_sum);
        loss_sum += batch_sum;
    }
    if (rc == LOOM_OK && t->data_axis.ops->data_eval)
        rc = t->data_axis.ops->data_eval(t->data_axis.strategy, 0);
    trainer_sync_units(t);
    if (rc == LOOM_OK)
        rc = global_mean(t, loss_sum, loss);
    loom_trace_span(LOOM_LANE_COMPUTE, "validation", t0, loom_now_ns(), 0);
    return rc;
}

/* llm.c's rhythm: validate before training, every train.eval_every steps,
 * and after the last. */
int trainer_evaluate_first(trainer *t)
{
    if (!t->eval.on || t->eval.every <= 0 || t->job.step != 0)
        return LOOM_OK;
    float val = 0;
    int rc = trainer_evaluate(t, &val);
    if (rc == LOOM_OK && t->job.rank == 0)
        trainer_report_validation(t, val);
    return rc;
}

int trainer_evaluate_due(trainer *t, int64_t done, step_result *r)
{
    r->evaluated =
        t->eval.on && (done == t->job.steps || (t->eval.every > 0 && done % t->eval.every == 0));
    return r->evaluated ? trainer_evaluate(t, &r->val_loss) : LOOM_OK;
}
