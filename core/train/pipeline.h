/* loom core — the pipeline executor (docs/pipeline.md).
 *
 * A schedule plugin emits each pp rank's list of actions (schedule.h); the
 * core validates it and this executor runs one rank's list per step:
 * forward, backward (or backward-input and backward-weight) of one
 * micro-batch on one of the rank's stages, and the sends and receives at
 * the stage borders. Receives are posted a few actions ahead and sends
 * complete in the background, so transfers overlap compute. A
 * micro-batch's activations on one of the rank's virtual stages live in a
 * model slot holding that stage's units, from its forward to its backward,
 * so the activation memory is exactly what the schedule keeps alive.
 *
 * The LM head is tied to the embedding's wte. The rank holding the last
 * stage computes with a copy of unit 0's parameters and collects the
 * head's wte gradients there; at the end of the step it sends them to the
 * first stage, which adds them before its data strategy sees unit 0's
 * gradients, and after the optimizer step the first stage sends the
 * updated parameters back (loom_pipeline_sync_tied). So unit 0 is stepped
 * and counted in the gradient norm once, by the first stage. */
#ifndef LOOM_PIPELINE_H
#define LOOM_PIPELINE_H

#include "loom/comm.h"
#include "loom/tensor.h"
#include "model/model.h"
#include "runtime/config.h"
#include "train/schedule.h"

typedef struct loom_pipeline loom_pipeline;

/* The data strategy's per-unit hooks, as the trainer calls them. */
typedef struct loom_pipeline_hooks {
    void *ctx;
    int (*before_forward)(void *ctx, int unit);
    int (*after_forward)(void *ctx, int unit);
    int (*before_backward)(void *ctx, int unit);
    int (*grads_ready)(void *ctx, int unit, int last_micro);
} loom_pipeline_hooks;

typedef struct loom_pipeline_setup {
    const loom_schedule *schedule; /* validated */
    int rank;                      /* on the pp axis */
    loom_group *group;             /* the pp communicator */
    loom_model *model;
    const int *stage_first, *stage_last; /* units of each stage (stages × virtual stages) */
    loom_dtype dtype;              /* compute dtype of unit params and grads */
    const float *tied_init;        /* last stage's rank: unit 0's initial fp32 params */
    const loom_backend *backend;   /* the model's: where activations and their messages live */
    loom_pipeline_hooks hooks;
} loom_pipeline_setup;

int loom_pipeline_create(const loom_pipeline_setup *setup, loom_pipeline **out);

/* The units (0..layers+1) of each of `stages` stages (pp × virtual
 * stages): the blocks split evenly or as parallel.pp.stage_layers lists
 * them, the embedding with the first, the head with the last. */
int loom_split_stages(loom_config *cfg, int layers, int stages, int *first, int *last);
void loom_pipeline_destroy(loom_pipeline *pl);

/* One step of the schedule. inputs[mb], targets[mb]: each micro-batch's
 * tokens; dloss: the gradient of each token's loss. loss_sum: the sum of
 * the micro-batches' mean losses (on the rank holding the last stage; 0
 * elsewhere). */
int loom_pipeline_step(loom_pipeline *pl, int *const *inputs, int *const *targets, float dloss,
                       double *loss_sum);
/* Validation between steps: the micro-batches' forward only, nothing
 * kept for a backward; loss_sum as for a step. */
int loom_pipeline_evaluate(loom_pipeline *pl, int *const *inputs, int *const *targets,
                           double *loss_sum);
/* After the optimizer step: the first stage's unit 0 to the last stage. */
int loom_pipeline_sync_tied(loom_pipeline *pl);

typedef struct loom_pipeline_stats {
    double step_s, busy_s; /* the last step: wall time, and time in compute actions */
    int peak_live;         /* most (virtual stage, micro-batch) pairs alive at once on this
                              rank, so far: micro-batches when v = 1 */
} loom_pipeline_stats;
void loom_pipeline_get_stats(const loom_pipeline *pl, loom_pipeline_stats *out);

#endif
