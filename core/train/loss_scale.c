/* loom train — the loss scaler and the divergence watch. In fp16 the loss
 * is scaled before backward so small gradients stay representable; a step
 * whose gradients overflow is dropped and the scale halved, and after
 * train.loss_scale_window good steps in a row it doubles. A run whose loss
 * or norm stays infinite or NaN for train.max_skipped steps is over. */
#include <math.h>

#include "loom/status.h"
#include "runtime/log.h"
#include "train/trainer.h"

void trainer_setup_scaler(trainer *t)
{
    trainer_loss_scaler *s = &t->scaler;
    s->scale = t->job.dtype == LOOM_F16 ? trainer_read_float(t->job.cfg, "train.loss_scale") : 1.0f;
    loom_config_int(t->job.cfg, "train.loss_scale_window", &s->window);
    trainer_read_int(t->job.cfg, "train.max_skipped", &s->max_skipped);
}

/* A checkpoint's scale and good steps, resumed. */
void trainer_scaler_restore(trainer *t, float scale, int64_t good_steps)
{
    t->scaler.scale = scale;
    t->scaler.good_steps = good_steps;
}

/* The step's verdict on its gradients of norm (unscaled) and its loss:
 * skipped when the norm is not finite, diverged when nothing can mend it
 * (an fp16 overflow is the scale's to mend while halving it can: down to
 * a scale of 1 the gradients overflow at their true size). */
void trainer_scaler_judge(const trainer *t, float loss, float norm, step_result *r)
{
    r->skipped = !isfinite(norm);
    r->diverged =
        !isfinite(loss) || (r->skipped && (t->job.dtype != LOOM_F16 || t->scaler.scale <= 1.0f));
}

void trainer_scaler_update(trainer *t, const step_result *r)
{
    trainer_loss_scaler *s = &t->scaler;
    if (t->job.dtype != LOOM_F16)
        return;
    if (r->skipped) {
        if (t->job.rank == 0)
            loom_log(LOOM_LOG_INFO, "fp16: gradients overflowed at step %lld; loss scale %g -> %g",
                     (long long)t->job.step + 1, s->scale, s->scale / 2);
        s->scale /= 2;
        s->good_steps = 0;
    } else if (++s->good_steps >= s->window) {
        if (t->job.rank == 0)
            loom_log(LOOM_LOG_INFO, "fp16: %lld good steps; loss scale %g -> %g",
                     (long long)s->good_steps, s->scale, s->scale * 2);
        s->scale *= 2;
        s->good_steps = 0;
    }
}

/* train.max_skipped: every rank sees the same reduced loss and norm, so
 * all stop at the same step. */
int trainer_scaler_watch(trainer *t, const step_result *r)
{
    trainer_loss_scaler *s = &t->scaler;
    s->diverged_steps = r->diverged ? s->diverged_steps + 1 : 0;
    if (s->max_skipped == 0 || s->diverged_steps < s->max_skipped)
        return LOOM_OK;
    return loom_fail(LOOM_ERR_INVALID,
                     "step %lld: loss %g, gradient norm %g: %d step%s in a row with a loss or "
                     "gradient norm that is not finite (train.max_skipped = %d); the run "
                     "diverged: lower train.lr (%g) or set train.clip, and start again",
                     (long long)t->job.step + 1, r->loss, r->grad_norm, s->diverged_steps,
                     s->diverged_steps == 1 ? "" : "s", s->max_skipped, t->opt.lr_schedule.lr);
}
