/* loom train — the trainer: one run's state, the job and its components,
 * shared by the files of the train layer; each component is written by its
 * own files only (named at its struct). Not seen outside core/train. */
#ifndef LOOM_TRAIN_TRAINER_H
#define LOOM_TRAIN_TRAINER_H

#include <stdio.h>

#include "loom/comm.h"
#include "loom/strategy.h"
#include "loom/tensor.h"
#include "model/dataloader.h"
#include "model/formats.h"
#include "model/kernel_time.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "runtime/config.h"
#include "runtime/group.h"
#include "runtime/loader.h"
#include "runtime/mesh.h"
#include "runtime/runtime.h"
#include "runtime/tier.h"
#include "train/ckpt_format.h"
#include "train/fit.h"
#include "train/pipeline.h"
#include "train/schedule.h"
#include "train/train.h"

/* train.checkpoint_async: the snapshot and the pending checkpoint (checkpoints.c). */
typedef struct ckpt_async ckpt_async;

/* A strategy of the tensor or sequence axis. */
typedef struct axis_strategy {
    const loom_plugin *plugin;
    const loom_strategy_ops *ops;
    loom_strategy *s;
} axis_strategy;

/* The components of a run. Each has its own set-up and teardown and is
 * written by its own files only (named at each); the others read it. */

/* The data axis (setup.c, stages.c): the dp strategy and the units it was
 * given: the model's own, or on a pipeline the copies of this rank's
 * (units[index[u]], -1: not here). Hooks see the strategy's structs; the
 * model's follow them. */
typedef struct trainer_data_axis {
    const loom_plugin *plugin;
    const loom_strategy_ops *ops;
    loom_strategy *strategy;
    loom_unit *units;
    int nunits;
    int *index;
} trainer_data_axis;

/* The model axes (model_axes.c): the tensor and sequence strategies (loaded
 * when their size is > 1) and what they split. */
typedef struct trainer_model_axes {
    axis_strategy tp, sp;
    int seqpar;            /* the tp strategy splits the residual regions' rows */
    int *positions;        /* the positions of each sequence this rank holds */
    int npositions;
    loom_param_shard **tp_shards; /* per unit: every tp rank's slices, rank-major */
    float *repl_grads;     /* the step's gradients of tp-replicated tensors, for the norm */
    size_t *repl_offset;   /* per unit, into repl_grads */
    size_t repl_count;
} trainer_model_axes;

/* The pipeline run (stages.c; pp > 1): stages, micro-batches, schedule
 * and executor. */
typedef struct trainer_pipeline_run {
    const loom_plugin *schedule_plugin; /* parallel.pp.schedule */
    loom_schedule schedule;
    loom_pipeline *executor;
    int *stage_first, *stage_last; /* units of each stage */
    unsigned char *runs;           /* per unit: one of this rank's stages holds it */
    int **mb_inputs, **mb_targets; /* the step's micro-batches */
    double bubble;                 /* the last step's idle share, averaged over the pp ranks */
    int64_t *stage_peaks;          /* per pp rank: peak activation bytes, live micro-batches */
} trainer_pipeline_run;

/* The loss scaler and the divergence watch (loss_scale.c). */
typedef struct trainer_loss_scaler {
    float scale;         /* fp16 only; 1 otherwise */
    int64_t good_steps, window;
    int max_skipped;     /* train.max_skipped; 0: no limit */
    int diverged_steps;  /* step_result.diverged, in a row */
} trainer_loss_scaler;

/* Validation (eval.c): data.val, read the same way every time. */
typedef struct trainer_evaluation {
    int on;              /* data.val is set */
    int every, batches;
    loom_dataset data;
    loom_dataloader loader;
} trainer_evaluation;

/* Checkpoints (checkpoints.c, restart.c): this job's random id, stamped on every
 * file it writes, and how many times the ranks have agreed on a
 * checkpoint's outcome (names the store keys of the reasons). */
typedef struct trainer_checkpoints {
    const char *dir;     /* train.checkpoint_dir */
    int64_t every, keep; /* train.checkpoint_every, train.keep_checkpoints */
    int lock_fd;         /* the directory's lock; -1: not held */
    uint64_t run_id;
    /* The lineage its checkpoints record (restart.c); lineage.settings is
     * trajectory, the settings that shape the trajectory, as text. */
    loom_ckpt_lineage lineage;
    char trajectory[8192];
    int resumed; /* --resume was given: checkpoints of no recorded lineage are not refused */
    /* resuming after a restart by loom launch: a checkpoint of the last
     * step is a finished job, not a mistake */
    int restarting;
    int64_t agreements;
    ckpt_async *async; /* train.checkpoint_async; NULL: checkpoints are synchronous */
} trainer_checkpoints;

/* Reporting (report.c): the peak MFU is measured against, the traffic and
 * tier counters of a step, the kernel times' summary at the end (sums over
 * the steps this run ran, and the first one's alone, a warm-up the summary
 * leaves out when others follow), and the --metrics file. */
typedef struct trainer_reporting {
    double peak_flops;     /* per rank */
    char peak_source[160]; /* where peak_flops comes from, for the header */
    int peak_remeasured;   /* a step beat the peak measured at start: measured again */
    int peak_unreliable;   /* a step beat the peak (even the second): no MFU from then on */
    loom_comm_counters comm_start[LOOM_AXIS_COUNT], comm_step[LOOM_AXIS_COUNT];
    loom_tier_counters tier_start, tier_step; /* bytes moved to and from the tiers */
    double kernel_sum_s[LOOM_KERNEL_KINDS], kernel_first_s[LOOM_KERNEL_KINDS];
    double step_sum_s, step_first_s;
    int64_t steps_timed;
    FILE *metrics;         /* --metrics; NULL: none on this rank */
    int64_t sample_every, sample_tokens; /* train.sample_every, train.sample_tokens */
} trainer_reporting;

/* The optimizer's settings (setup.c): AdamW and the learning rate. */
typedef struct trainer_optimizer {
    loom_lr_schedule lr_schedule;
    float beta1, beta2, eps, weight_decay, clip;
    int decay_matrices; /* train.decay = "matrices": only tensors of 2+ dimensions decay */
} trainer_optimizer;

/* The training data (setup.c opens it; step.c reads a micro-batch at a
 * time into inputs and targets). */
typedef struct trainer_data {
    loom_dataset set; /* data.train */
    loom_dataloader loader;
    int *inputs, *targets;
} trainer_data;

/* The job (setup.c): settings, runtime, mesh and model; the step counter
 * (train.c, and checkpoints.c when a checkpoint is loaded). */
typedef struct trainer_job {
    loom_runtime *rt;
    loom_config *cfg;
    loom_mesh *mesh;
    loom_tiers *tiers; /* memory.offload (owned by rt) */
    int rank, world;
    loom_model *model;
    loom_backend *backend; /* model.device's: where the model's buffers live */
    char device_why[640];  /* which backend and why, for the header */
    loom_unit *units;
    int nunits;
    loom_gpt2_shape shape;
    int batch, seq, grad_accum, micro_batch;
    int micro_batches;   /* per step on this rank: grad_accum or pp.microbatches */
    int64_t steps, step; /* step: the next step to run, 0-based */
    loom_dtype dtype;
    int norm_checked; /* the dp ranks' norms were compared once (step.c) */
} trainer_job;

typedef struct trainer {
    trainer_job job;
    trainer_optimizer opt;
    trainer_data data;
    trainer_data_axis data_axis;
    trainer_model_axes axes;
    trainer_pipeline_run pipe;
    trainer_loss_scaler scaler;
    trainer_evaluation eval;
    trainer_checkpoints ckpt;
    trainer_reporting report;
} trainer;

/* A call on the run's compute backend (model/compute.h), the only way to
 * touch the model's buffers: BACKEND(t, zero, grads, bytes). */
#define BACKEND(t, op, ...) ((t)->job.backend->ops->op((t)->job.backend->self, __VA_ARGS__))

/* ---- strategy hooks ---- */

/* The strategy's struct of model unit u, and the model's kept in step with it. */
static inline loom_unit *dp_unit(const trainer *t, int u)
{
    return &t->data_axis.units[t->data_axis.index[u]];
}
static inline int holds(const trainer *t, int u) { return t->data_axis.index[u] >= 0; }
#define HOOK(t, op, u) trainer_hook_unit((t), (t)->data_axis.ops->op, (u))

typedef struct step_result {
    float loss, lr, grad_norm;
    int skipped;
    int diverged;   /* the loss or norm is not finite, and no loss scale can mend it */
    int evaluated;  /* after this step: val_loss is set */
    float val_loss;
    double seconds;
    double kernel_s[LOOM_KERNEL_KINDS]; /* inside the model and the optimizer, by kind */
} step_result;

/* setup.c */
int trainer_read_int(const loom_config *cfg, const char *path, int *out);
float trainer_read_float(const loom_config *cfg, const char *path);
loom_dtype trainer_read_precision(const loom_config *cfg); /* train.precision's dtype */
int trainer_fail_at(const trainer *t, int rc, const char *path);
/* Refused: a strategy built before ABI 1.9 with a backend whose memory
 * the host cannot touch; path: the setting that names it. */
int trainer_check_residency(const trainer *t, const loom_plugin *plugin, const char *path);
int trainer_read_files(const loom_config *cfg, const char *setting, const char ***out, int *count);
int trainer_create_axis(trainer *t, loom_axis axis, axis_strategy *a);
int trainer_setup(trainer *t, const loom_train_options *o);
/* The caller's check of this machine (o->check_machine: the plan's peak
 * memory and offload files against what the machine has), agreed by every
 * rank (fit.c), before any allocation; NULL: none. */
int trainer_check_machine(trainer *t, loom_train_machine_check check);
/* After a phase every rank went through: the first failing rank's line,
 * on every rank ("rank 2 <failed>: <its reason>"; the others fail as
 * followers, LOOM_ERR_REMOTE), or LOOM_OK where all succeeded (checkpoints.c). */
int trainer_agree(trainer *t, const char *failed, int rc);
void trainer_teardown(trainer *t);

/* model_axes.c */
int trainer_group_allreduce(loom_group *g, void *data, size_t count, loom_dtype dtype,
                            loom_redop op);
int trainer_setup_parallel_model(trainer *t, int recompute);
int trainer_tp_norm_sq(trainer *t, double *norm_sq);
void trainer_teardown_model_axes(trainer *t);

/* stages.c */
int trainer_choose_units(trainer *t);
int trainer_setup_pipeline(trainer *t, const float *unit0_init);
int trainer_plan_pipeline(trainer *t);
void trainer_teardown_pipeline(trainer *t);
/* the step's loss summed over the pp group, the bubble and every stage's
 * activation peak */
int trainer_pipeline_totals(trainer *t, float *loss);

/* step.c */
void trainer_sync_units(trainer *t);
/* Refused: a unit's params or grads in host memory with a backend of its
 * own memory (after data_setup, and after every unit hook). */
int trainer_check_resident(const trainer *t);
int trainer_hook_unit(trainer *t, int (*hook)(loom_strategy *, loom_unit *), int u);
int trainer_grads_ready(trainer *t, int u, int last_micro);
int trainer_forward(trainer *t, float *loss);
int trainer_step(trainer *t, step_result *r);

/* loss_scale.c */
void trainer_setup_scaler(trainer *t);
void trainer_scaler_judge(const trainer *t, float loss, float norm, step_result *r);
/* after the optimizer (or, on a skipped step, before its gradients go) */
void trainer_scaler_update(trainer *t, const step_result *r);
int trainer_scaler_watch(trainer *t, const step_result *r);
void trainer_scaler_restore(trainer *t, float scale, int64_t good_steps);

/* eval.c */
int trainer_setup_eval(trainer *t);
void trainer_teardown_eval(trainer *t);
int trainer_evaluate(trainer *t, float *loss);
int trainer_evaluate_first(trainer *t);
/* done: the steps done with this one; sets r->evaluated and r->val_loss */
int trainer_evaluate_due(trainer *t, int64_t done, step_result *r);

/* checkpoints.c: the component's life. Open: outputs checked, run id, lineage,
 * the directory locked (train.checkpoint_every > 0), a checkpoint loaded
 * (--resume, or the latest after a restart). Due: the async one polled,
 * then a checkpoint every train.checkpoint_every steps and after the last.
 * Finish: on success the pending one waited for, else given up. */
int trainer_open_checkpoints(trainer *t, const loom_train_options *o);
int trainer_checkpoint_due(trainer *t);
int trainer_finish_checkpoints(trainer *t, int rc);
int trainer_save_final_weights(trainer *t, const loom_train_options *o); /* --save */
int trainer_choose_run_id(trainer *t);
int trainer_lock_checkpoints(trainer *t, const char *dir, int *lock_fd);
void trainer_unlock_checkpoints(int lock_fd);
/* PARENT/step-N: saved, "saved" printed, and train.keep_checkpoints applied. */
int trainer_checkpoint(trainer *t, const char *parent, int64_t keep);
/* train.checkpoint_async: the snapshot's host memory, its size printed
 * once. Then trainer_checkpoint copies the state and leaves the writing to
 * a thread; at each later step boundary trainer_checkpoint_poll ends the
 * checkpoint once every rank has written (collective: every rank calls
 * it); trainer_checkpoint_wait ends it whatever it takes (the run's end).
 * trainer_checkpoint_abandon, on any path out: a pending checkpoint is
 * given up (no DIR.tmp left on rank 0's side; no other rank is asked), and
 * the snapshot freed. */
int trainer_setup_async_checkpoints(trainer *t);
int trainer_checkpoint_poll(trainer *t);
int trainer_checkpoint_wait(trainer *t);
void trainer_checkpoint_abandon(trainer *t);
int trainer_save_sharded(trainer *t, const char *dir);
int trainer_load_state(trainer *t, const char *path);
int trainer_gather_weights(trainer *t, const char *scratch, float **weights);
int trainer_save_weights(trainer *t, const char *path, loom_dtype dtype);

/* restart.c: after `loom launch --max-restarts` restarted the job, the
 * latest complete checkpoint of train.checkpoint_dir (in buf), else asked
 * (the --resume given, or NULL). */
const char *trainer_restart_resume(const trainer *t, const char *asked, char *buf, size_t cap);
/* The job's lineage (before trainer_restart_resume): the hash of the
 * settings that shape the trajectory and of the data's identity, or, when
 * resuming (resume: --resume's path or NULL), the checkpoint's lineage. */
void trainer_choose_lineage(trainer *t, const char *resume);
/* Rank 0, holding train.checkpoint_dir's lock: a directory holding complete
 * checkpoints of another lineage is refused (one line naming the step, the
 * lineage and the first setting that differs) unless
 * train.checkpoint_overwrite = true. */
int trainer_check_lineage(const trainer *t, const char *dir);
/* outputs.c */
int trainer_check_outputs(trainer *t, const loom_train_options *o);
/* mkdir -p: *made is the topmost directory it created ("" if none), for
 * trainer_remove_made_dirs to undo; -1 with why filled in on failure. */
int trainer_make_dirs(const char *path, char *made, size_t made_cap, char *why, size_t cap);
void trainer_remove_made_dirs(const char *path, const char *made);

/* report.c */
void trainer_print_progress(trainer *t, const step_result *r);
void trainer_write_metrics(FILE *f, trainer *t, const step_result *r);
void trainer_print_header(const trainer *t);
void trainer_count_kernel_times(trainer *t, const step_result *r);
void trainer_print_kernel_summary(const trainer *t);
void trainer_report_validation(const trainer *t, float val_loss);
/* the component's life: --metrics opened, --trace on, the header printed;
 * each step counted, printed (rank 0) and written; a sample every
 * train.sample_every steps; the metrics file closed */
int trainer_open_reporting(trainer *t, const loom_train_options *o);
void trainer_report_step(trainer *t, const step_result *r);
int trainer_sample_due(trainer *t);
void trainer_close_reporting(trainer *t);
int trainer_measure_peak(trainer *t);
void trainer_count_traffic(trainer *t, int end);
int trainer_write_trace(trainer *t, const char *path);
int trainer_print_sample(trainer *t, int tokens, const char *scratch_parent);

#endif
