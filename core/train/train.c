/* loom train — the loop: set up (setup.c), open the run's checkpoints
 * (checkpoints.c) and reporting (report.c), validate before training (eval.c),
 * run train.steps steps (step.c), each reported, judged by the loss scaler
 * (loss_scale.c), sampled every train.sample_every and checkpointed every
 * train.checkpoint_every and after the last, then finish and tear down,
 * one call per component. */
#include <string.h>

#include "loom/status.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "train/test_hooks.h"
#include "train/trainer.h"

/* What follows a step: validation when due, the report, the divergence
 * watch, a sample and a checkpoint when due. *checkpoint_seconds: what
 * the training thread spent on checkpoints, counted in the next step. */
static int after_step(trainer *t, step_result *r, double *checkpoint_seconds)
{
    int64_t done = t->job.step + 1;
    r->seconds += *checkpoint_seconds;
    int rc = trainer_evaluate_due(t, done, r);
    if (rc != LOOM_OK)
        return rc;
    trainer_report_step(t, r);
    if ((rc = trainer_scaler_watch(t, r)) != LOOM_OK)
        return rc;
    t->job.step = done;
    trainer_test_after_step(t->job.step);
    if ((rc = trainer_sample_due(t)) != LOOM_OK)
        return rc;
    uint64_t start = loom_now_ns();
    rc = trainer_checkpoint_due(t);
    *checkpoint_seconds = (double)(loom_now_ns() - start) / 1e9;
    return rc;
}

static int run_steps(trainer *t, const loom_train_options *o)
{
    int rc = trainer_open_checkpoints(t, o);
    if (rc == LOOM_OK)
        rc = trainer_open_reporting(t, o);
    if (rc == LOOM_OK)
        rc = trainer_setup_async_checkpoints(t);
    if (rc != LOOM_OK)
        return rc;
    loom_mem_usage_reset_peak();
    if (o->started)
        *o->started = 1;
    if ((rc = trainer_evaluate_first(t)) != LOOM_OK)
        return rc;
    double checkpoint_seconds = 0;
    while (rc == LOOM_OK && t->job.step < t->job.steps) {
        step_result r;
        rc = trainer_step(t, &r);
        if (rc == LOOM_OK)
            rc = after_step(t, &r, &checkpoint_seconds);
    }
    rc = trainer_finish_checkpoints(t, rc);
    if (rc == LOOM_OK && t->job.rank == 0)
        trainer_print_kernel_summary(t);
    if (rc == LOOM_OK && o->save)
        rc = trainer_save_final_weights(t, o);
    if (rc == LOOM_OK && o->trace)
        rc = trainer_write_trace(t, o->trace);
    return rc;
}

int loom_train(const loom_train_options *o)
{
    trainer t;
    memset(&t, 0, sizeof t);
    t.ckpt.lock_fd = -1;
    int rc = trainer_setup(&t, o);
    if (rc == LOOM_OK)
        rc = run_steps(&t, o);
    /* Tearing down after a failure can fail again (a store that went away
     * with a stopped rank 0): the first failure is the one to tell. */
    trainer_checkpoint_abandon(&t);
    char first[2048];
    snprintf(first, sizeof first, "%s", loom_last_error());
    trainer_teardown(&t);
    if (rc != LOOM_OK)
        loom_fail(rc, "%s", first);
    return rc;
}
