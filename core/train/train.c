/* loom train — the loop. Set up (setup.c), run train.steps steps (step.c),
 * report each (report.c) and print a sample every train.sample_every,
 * checkpoint every train.checkpoint_every steps and after the last, and
 * save at the end (save.c), tear down. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "loom/status.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/trace.h"
#include "train/trainer.h"

static int run_steps(trainer *t, const loom_train_options *o, int *lock_fd)
{
    int64_t every = 0, keep = 0;
    int async = 0;
    loom_config_int(t->cfg, "train.checkpoint_every", &every);
    loom_config_int(t->cfg, "train.keep_checkpoints", &keep);
    loom_config_bool(t->cfg, "train.checkpoint_async", &async);
    const char *dir = "checkpoints";
    loom_config_string(t->cfg, "train.checkpoint_dir", &dir);
    int rc = trainer_check_outputs(t, o);
    if (rc == LOOM_OK)
        rc = trainer_choose_run_id(t);
    trainer_choose_lineage(t, o->resume);
    if (rc == LOOM_OK && every > 0)
        rc = trainer_lock_checkpoints(t, dir, lock_fd);
    if (rc != LOOM_OK)
        return rc;
    char latest[4200];
    const char *resume = trainer_restart_resume(t, o->resume, latest, sizeof latest);
    t->restarting = resume == latest;
    if (resume && (rc = trainer_load_state(t, resume)) != LOOM_OK)
        return rc;
    /* a restarted job adds to what its first run wrote (a step redone
     * since the checkpoint appears again, later) */
    const char *restarted = getenv("LOOM_RESTART");
    FILE *metrics = NULL;
    /* "{rank}" in the path: every rank writes its own lines (its memory and
     * traffic, which differ along a pipeline); otherwise rank 0 alone */
    char path[4096] = "";
    const char *mark = o->metrics ? strstr(o->metrics, "{rank}") : NULL;
    if (mark)
        snprintf(path, sizeof path, "%.*s%d%s", (int)(mark - o->metrics), o->metrics, t->rank,
                 mark + strlen("{rank}"));
    else if (o->metrics)
        snprintf(path, sizeof path, "%s", o->metrics);
    if (o->metrics && (t->rank == 0 || mark) &&
        !(metrics = fopen(path, restarted && atoi(restarted) > 0 ? "a" : "w")))
        return loom_fail(LOOM_ERR_INVALID, "--metrics %s: %s", path, strerror(errno));
    if (o->trace)
        loom_trace_enable(t->rank);
    int64_t sample_every = 0, sample_tokens = 0;
    loom_config_int(t->cfg, "train.sample_every", &sample_every);
    loom_config_int(t->cfg, "train.sample_tokens", &sample_tokens);
    if (t->rank == 0)
        trainer_print_header(t);
    if (async && every > 0 && (rc = trainer_setup_async_checkpoints(t)) != LOOM_OK) {
        if (metrics)
            fclose(metrics);
        return rc;
    }
    loom_mem_usage_reset_peak();
    if (o->started)
        *o->started = 1;
    /* A testing aid: stop (SIGSTOP) after that step, between steps, so a
     * test can look at or damage the tier files; SIGCONT goes on. */
    const char *stop = getenv("LOOM_STOP_AFTER_STEP");
    long long stop_after = stop ? atoll(stop) : 0;
    /* llm.c's rhythm: validate before training, every eval_every steps,
     * and after the last */
    if (t->validating && t->eval_every > 0 && t->step == 0) {
        float val = 0;
        if ((rc = trainer_evaluate(t, &val)) != LOOM_OK) {
            if (metrics)
                fclose(metrics);
            return rc;
        }
        if (t->rank == 0)
            trainer_report_validation(t, metrics, val);
    }
    /* what the training thread spent on checkpoints at a step boundary
     * counts in the next step's time */
    double checkpoint_seconds = 0;
    while (t->step < t->steps) {
        step_result r;
        if ((rc = trainer_step(t, &r)) != LOOM_OK)
            break;
        r.seconds += checkpoint_seconds;
        trainer_count_kernel_times(t, &r);
        int64_t done = t->step + 1;
        r.evaluated = t->validating &&
                      (done == t->steps || (t->eval_every > 0 && done % t->eval_every == 0));
        if (r.evaluated && (rc = trainer_evaluate(t, &r.val_loss)) != LOOM_OK)
            break;
        if (t->rank == 0)
            trainer_print_progress(t, &r);
        if (metrics)
            trainer_write_metrics(metrics, t, &r);
        if ((rc = trainer_check_diverged(t, &r)) != LOOM_OK)
            break;
        t->step++;
        if (t->step == stop_after) {
            fflush(NULL);
            raise(SIGSTOP);
        }
        if (sample_every > 0 && t->step % sample_every == 0 &&
            (rc = trainer_print_sample(t, (int)sample_tokens, dir)) != LOOM_OK)
            break;
        /* every N steps, and the last whatever N */
        uint64_t start = loom_now_ns();
        if ((rc = trainer_checkpoint_poll(t)) != LOOM_OK ||
            (every > 0 && (t->step % every == 0 || t->step == t->steps) &&
             (rc = trainer_checkpoint(t, dir, keep)) != LOOM_OK))
            break;
        checkpoint_seconds = (double)(loom_now_ns() - start) / 1e9;
    }
    /* the last step's checkpoint, or one still written, ends before the
     * run does; on a failure it is given up */
    if (rc == LOOM_OK)
        rc = trainer_checkpoint_wait(t);
    else
        trainer_checkpoint_abandon(t);
    if (metrics)
        fclose(metrics);
    if (rc == LOOM_OK && t->rank == 0)
        trainer_print_kernel_summary(t);
    if (rc == LOOM_OK && o->save && (rc = trainer_save_weights(t, o->save, o->save_dtype)) == LOOM_OK && t->rank == 0)
        printf("saved %s\n", o->save);
    if (rc == LOOM_OK && o->trace)
        rc = trainer_write_trace(t, o->trace);
    return rc;
}

int loom_train(const loom_train_options *o)
{
    trainer t;
    memset(&t, 0, sizeof t);
    int rc = trainer_setup(&t, o), lock_fd = -1;
    if (rc == LOOM_OK)
        rc = run_steps(&t, o, &lock_fd);
    trainer_checkpoint_abandon(&t);
    /* Tearing down after a failure can fail again (a store that went away
     * with a stopped rank 0): the first failure is the one to tell. */
    char first[2048];
    snprintf(first, sizeof first, "%s", loom_last_error());
    trainer_teardown(&t);
    trainer_unlock_checkpoints(lock_fd);
    if (rc != LOOM_OK)
        loom_fail(rc, "%s", first);
    return rc;
}
