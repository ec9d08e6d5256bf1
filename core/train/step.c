/* loom train — One training step: micro-batches through the units with the data
 * strategy's hooks (or the pipeline executor), the loss and gradient norm
 * over the mesh, the optimizer step, fp16 loss scaling. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "runtime/flight.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/trace.h"
#include "train/trainer.h"

/* With train.decay = "matrices", update cannot do what the job asks (it
 * decays every element it gets): its calls are counted here, and the step
 * refused. A strategy may call it from threads of its own. */
static atomic_int whole_updates;

static void count_whole_update(const loom_optimizer_step *s, float *master, const void *grad,
                               loom_dtype grad_dtype, float *m, float *v, size_t n)
{
    atomic_fetch_add(&whole_updates, 1);
    loom_adamw_update(s, master, grad, grad_dtype, m, v, n);
}

static int optimizer_step(trainer *t, const step_result *r, float norm)
{
    loom_optimizer_step s = {
        .step = t->job.step + 1,
        .lr = r->lr,
        .beta1 = t->opt.beta1,
        .beta2 = t->opt.beta2,
        .eps = t->opt.eps,
        .weight_decay = t->opt.weight_decay,
        .grad_scale = 1.0f / t->scaler.scale,
        .update = t->opt.decay_matrices ? count_whole_update : loom_adamw_update,
        .update_range =
            t->opt.decay_matrices ? loom_adamw_update_range_matrices : loom_adamw_update_range_all,
        .update_range_store = t->opt.decay_matrices ? loom_adamw_update_range_store_matrices
                                                    : loom_adamw_update_range_store_all};
    if (t->opt.clip > 0 && norm > t->opt.clip)
        s.grad_scale *= t->opt.clip / norm;
    atomic_store(&whole_updates, 0);
    int rc = t->data_axis.ops->data_optimizer_step(t->data_axis.strategy, &s);
    if (rc == LOOM_OK && atomic_load(&whole_updates) > 0)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED,
                         "%s: train.decay = \"matrices\", but strategy %s stepped through "
                         "loom_optimizer_step.update, which cannot tell a unit's tensors apart; "
                         "it must call update_range (ABI 1.6), or set train.decay = \"all\"",
                         loom_config_where(t->job.cfg, "train.decay"),
                         t->data_axis.plugin->header->name);
    return rc;
}

static void sync_unit(trainer *t, int u)
{
    const loom_unit *su = dp_unit(t, u);
    t->job.units[u].params = su->params;
    t->job.units[u].grads = su->grads;
}

void trainer_sync_units(trainer *t)
{
    for (int u = 0; u < t->job.nunits; u++)
        if (holds(t, u))
            sync_unit(t, u);
}

/* On a backend of its own memory the kernels read params and grads there:
 * a strategy that left them in host memory would have them read as device
 * memory (which a GPU faults on and sim would not notice). */
static int check_resident(const trainer *t, int u)
{
    if (t->job.backend->ops->tier == LOOM_TIER_HOST) /* no lookup on the cpu's hot path */
        return LOOM_OK;
    const loom_unit *su = dp_unit(t, u);
    const char *where = su->params && !loom_mem_is_device(su->params) ? "parameters"
                        : su->grads && !loom_mem_is_device(su->grads) ? "gradients"
                                                                      : NULL;
    if (!where)
        return LOOM_OK;
    return loom_fail(LOOM_ERR_INVALID,
                     "%s: strategy %s keeps the %s of unit %d (%s) in host memory, but "
                     "model.device = \"%s\" computes in device memory; a strategy allocates "
                     "the model's buffers in host->compute->tier",
                     loom_config_where(t->job.cfg, "parallel.dp.strategy"),
                     t->data_axis.plugin->header->name, where, u, su->name, t->job.backend->name);
}

int trainer_check_resident(const trainer *t)
{
    int rc = LOOM_OK;
    for (int u = 0; u < t->job.nunits && rc == LOOM_OK; u++)
        if (holds(t, u))
            rc = check_resident(t, u);
    return rc;
}

/* A data-axis unit hook (absent ones are the loader's no-op), keeping the
 * model's unit in step with the strategy's. */
int trainer_hook_unit(trainer *t, int (*hook)(loom_strategy *, loom_unit *), int u)
{
    int rc = hook(t->data_axis.strategy, dp_unit(t, u));
    sync_unit(t, u);
    if (rc == LOOM_OK)
        rc = check_resident(t, u);
    /* tier transfers that landed meanwhile end their trace spans now */
    return rc == LOOM_OK ? loom_tiers_progress(t->job.tiers) : rc;
}

int trainer_grads_ready(trainer *t, int u, int last_micro)
{
    int rc = t->data_axis.ops->data_grads_ready(t->data_axis.strategy, dp_unit(t, u), last_micro);
    sync_unit(t, u);
    return rc;
}

/* ---- one step ---- */

static float step_dloss(const trainer *t)
{
    return t->scaler.scale /
           ((float)t->job.micro_batch * (float)t->job.seq * (float)t->job.micro_batches);
}

static void trace_unit(const trainer *t, const char *what, int u, uint64_t start)
{
    char name[48];
    if (t->job.units[u].kind == LOOM_UNIT_BLOCK)
        snprintf(name, sizeof name, "%s block %d", what, u - 1);
    else
        snprintf(name, sizeof name, "%s %s", what, t->job.units[u].name);
    loom_trace_span(LOOM_LANE_COMPUTE, name, start, loom_now_ns(), 0);
}

/* What the flight recorder says issued the ops from here on. */
static void issuer_unit(const trainer *t, const char *what, int u)
{
    if (t->job.units[u].kind == LOOM_UNIT_BLOCK)
        loom_flight_issuer("%s block %d", what, u - 1);
    else
        loom_flight_issuer("%s %s", what, t->job.units[u].name);
}

/* The forward of the micro-batch in t->data.inputs through every unit, with
 * the data strategy's hooks; the loss of its tokens. */
int trainer_forward(trainer *t, float *loss)
{
    int rc, head = t->job.nunits - 1;
    for (int u = 0; u < t->job.nunits; u++) {
        uint64_t t0 = loom_now_ns();
        issuer_unit(t, "forward", u);
        if ((rc = HOOK(t, data_before_forward, u)) != LOOM_OK)
            return rc;
        /* The LM head is tied to wte: the embedding is needed again. */
        if (u == head && (rc = HOOK(t, data_before_forward, 0)) != LOOM_OK)
            return rc;
        if ((rc = loom_model_forward(t->job.model, u, t->data.inputs, t->data.targets, loss)) !=
            LOOM_OK)
            return rc;
        if ((rc = HOOK(t, data_after_forward, u)) != LOOM_OK)
            return rc;
        if (u == head && (rc = HOOK(t, data_after_forward, 0)) != LOOM_OK)
            return rc;
        trace_unit(t, "forward", u, t0);
    }
    return LOOM_OK;
}

static int run_micro_batch(trainer *t, int last_micro, float *loss)
{
    int rc, head = t->job.nunits - 1;
    if ((rc = loom_dataloader_next(&t->data.loader, t->data.inputs, t->data.targets)) != LOOM_OK ||
        (rc = trainer_forward(t, loss)) != LOOM_OK)
        return rc;
    /* Each token's loss weighs 1/(tokens per micro-batch x micro-batches):
     * the rank's gradient is that of its mean loss over the step. */
    float dloss = step_dloss(t);
    for (int u = head; u >= 0; u--) {
        uint64_t t0 = loom_now_ns();
        issuer_unit(t, "backward", u);
        if ((rc = HOOK(t, data_before_backward, u)) != LOOM_OK)
            return rc;
        if (u == head && (rc = HOOK(t, data_before_backward, 0)) != LOOM_OK)
            return rc; /* the head adds into wte's gradient */
        if ((rc = loom_model_backward(t->job.model, u, dloss)) != LOOM_OK)
            return rc;
        trace_unit(t, "backward", u, t0);
        if ((rc = trainer_grads_ready(t, u, last_micro)) != LOOM_OK)
            return rc;
    }
    return LOOM_OK;
}

/* The strategy's norm and zeroing, or the core's for a strategy that
 * leaves them to it (a dp group of one, loom_plugin_check_dp_size): the
 * units' own gradients. */
static int grads_norm_sq(trainer *t, double *out)
{
    if (t->data_axis.ops->data_grad_norm_sq)
        return t->data_axis.ops->data_grad_norm_sq(t->data_axis.strategy, out);
    /* (a dp group of one: the units' gradients are the whole) */
    double sum = 0;
    int rc = LOOM_OK;
    for (int i = 0; i < t->data_axis.nunits && rc == LOOM_OK; i++) {
        const loom_unit *u = &t->data_axis.units[i];
        if (u->grads)
            rc = BACKEND(t, sum_squares, u->grads, u->compute_dtype, u->numel, &sum);
    }
    *out = sum;
    return rc;
}

/* The strategy's replicas differ on purpose (LOOM_STRATEGY_APPROXIMATE):
 * each dp rank's norm is its own. */
static int approximate(const trainer *t)
{
    return (t->data_axis.ops->capabilities & LOOM_STRATEGY_APPROXIMATE) &&
           t->job.mesh->sizes[LOOM_AXIS_DP] > 1;
}

/* With replicas that differ, each clips by its own norm, but the step is
 * skipped everywhere or nowhere (a rank alone skipping would leave its
 * replica a step behind the others' schedule), and every rank reports dp
 * rank 0's norm. One allreduce: a sum of non-finite flags, and the norm
 * of dp rank 0 added to zeros, which is exact. */
static int reported_norm(trainer *t, float own, float *reported, int *any_nonfinite)
{
    double both[2] = {isfinite(own) ? 0.0 : 1.0,
                      t->job.mesh->coords[LOOM_AXIS_DP] == 0 && isfinite(own) ? own : 0.0};
    loom_flight_issuer("gradient norm of dp rank 0");
    int rc =
        trainer_group_allreduce(t->job.mesh->groups[LOOM_AXIS_DP], both, 2, LOOM_F64, LOOM_SUM);
    *any_nonfinite = both[0] > 0;
    *reported = *any_nonfinite ? NAN : (float)both[1];
    return rc;
}

/* Every dp rank must clip by one norm, or the replicas drift apart
 * silently: a strategy whose data_grad_norm_sq returns a rank's own share
 * is stopped at the first step of a run. Once per run, not per step, so a
 * step's traffic stays the strategy's own. Ranks may differ by the rounding
 * of their reductions only. */
static int check_norm_agrees(trainer *t, double norm_sq)
{
    if (t->job.mesh->sizes[LOOM_AXIS_DP] == 1 || t->job.norm_checked || approximate(t))
        return LOOM_OK;
    t->job.norm_checked = 1;
    double spread[2] = {norm_sq, -norm_sq};
    int rc =
        trainer_group_allreduce(t->job.mesh->groups[LOOM_AXIS_DP], spread, 2, LOOM_F64, LOOM_MAX);
    if (rc != LOOM_OK)
        return rc;
    double hi = spread[0], lo = -spread[1];
    if (!(hi - lo <= 1e-5 * hi) && isfinite(hi) && isfinite(lo))
        return loom_fail(LOOM_ERR_INTERNAL,
                         "strategy %s: data_grad_norm_sq differs across the dp group at step %lld "
                         "(from %.9g to %.9g); it must return the sum of squares over the whole "
                         "group, the same on every dp rank",
                         t->data_axis.plugin->header->name, (long long)t->job.step + 1, lo, hi);
    return LOOM_OK;
}

static int zero_grads(trainer *t)
{
    if (t->data_axis.ops->data_zero_grads)
        return t->data_axis.ops->data_zero_grads(t->data_axis.strategy);
    int rc = LOOM_OK;
    for (int i = 0; i < t->data_axis.nunits && rc == LOOM_OK; i++) {
        const loom_unit *u = &t->data_axis.units[i];
        if (u->grads)
            rc = BACKEND(t, zero, u->grads, u->numel * loom_dtype_size(u->compute_dtype));
    }
    return rc;
}

/* The step's time inside the model and the optimizer by kernel kind, and
 * in the trace a counter track of each (ms) at the step's end. */
static void read_kernel_times(step_result *r, uint64_t end)
{
    _Static_assert((int)LOOM_KERNEL_KINDS <= (int)LOOM_TRACE_COUNTER_KEYS,
                   "a trace counter per kind");
    uint64_t ns[LOOM_KERNEL_KINDS];
    loom_kernel_time_read(ns);
    const char *keys[LOOM_KERNEL_KINDS];
    double ms[LOOM_KERNEL_KINDS];
    for (int k = 0; k < LOOM_KERNEL_KINDS; k++) {
        r->kernel_s[k] = (double)ns[k] / 1e9;
        keys[k] = loom_kernel_kind_name((loom_kernel_kind)k);
        ms[k] = (double)ns[k] / 1e6;
    }
    loom_trace_counters("kernel_ms", end, keys, ms, LOOM_KERNEL_KINDS);
}

/* Forward and backward over the step's micro-batches (by the pipeline's
 * schedule on a pipeline), the gradients then finished by the data
 * strategy; *loss_sum: the sum of the micro-batches' mean losses. */
static int forward_backward(trainer *t, double *loss_sum)
{
    int rc;
    *loss_sum = 0;
    if (t->pipe.executor) {
        for (int k = 0; k < t->job.micro_batches; k++)
            if ((rc = loom_dataloader_next(&t->data.loader, t->pipe.mb_inputs[k],
                                           t->pipe.mb_targets[k])) != LOOM_OK)
                return rc;
        if ((rc = loom_pipeline_step(t->pipe.executor, t->pipe.mb_inputs, t->pipe.mb_targets,
                                     step_dloss(t), loss_sum)) != LOOM_OK)
            return rc;
    }
    for (int k = 0; !t->pipe.executor && k < t->job.micro_batches; k++) {
        float loss = 0;
        if ((rc = run_micro_batch(t, k == t->job.micro_batches - 1, &loss)) != LOOM_OK)
            return rc;
        *loss_sum += loss;
    }
    loom_flight_issuer("finish backward");
    if ((rc = t->data_axis.ops->data_finish_backward(t->data_axis.strategy)) != LOOM_OK)
        return rc;
    trainer_sync_units(t);
    return LOOM_OK;
}

/* The step's loss: the mean over micro-batches and dp ranks (computed by
 * the last pipeline stage alone). */
static int global_loss(trainer *t, double loss_sum, float *global)
{
    const loom_comm_api *C = &loom_core_comm_api;
    float local = (float)(loss_sum / t->job.micro_batches);
    loom_request *req;
    loom_flight_issuer("loss");
    int rc = LOOM_OK;
    if (t->pipe.executor && (rc = trainer_pipeline_totals(t, &local)) != LOOM_OK)
        return rc;
    /* sp ranks hold equal shares of each sequence's tokens */
    if (t->job.mesh->sizes[LOOM_AXIS_SP] > 1 &&
        (rc = trainer_group_allreduce(t->job.mesh->groups[LOOM_AXIS_SP], &local, 1, LOOM_F32,
                                      LOOM_AVG)) != LOOM_OK)
        return rc;
    *global = local;
    if ((rc = C->allreduce(t->job.mesh->groups[LOOM_AXIS_DP], &local, global, 1, LOOM_F32, LOOM_AVG,
                           &req)) == LOOM_OK)
        rc = C->wait(req);
    return rc;
}

/* The global gradient norm, unscaled: over the dp shards, the tp-replicated
 * tensors once, and each pipeline stage's units once. */
static int global_norm(trainer *t, float *norm)
{
    double norm_sq = 0;
    loom_flight_issuer("gradient norm");
    int rc = grads_norm_sq(t, &norm_sq);
    if (rc == LOOM_OK)
        rc = check_norm_agrees(t, norm_sq);
    if (rc == LOOM_OK && t->job.mesh->sizes[LOOM_AXIS_TP] > 1) {
        rc = trainer_tp_norm_sq(t, &norm_sq);
        if (rc == LOOM_OK) /* the next step's */
            rc = BACKEND(t, zero, t->axes.repl_grads, t->axes.repl_count * sizeof(float));
    }
    if (rc == LOOM_OK && t->pipe.executor)
        rc = trainer_group_allreduce(t->job.mesh->groups[LOOM_AXIS_PP], &norm_sq, 1, LOOM_F64,
                                     LOOM_SUM);
    *norm = (float)(sqrt(norm_sq) / t->scaler.scale);
    return rc;
}

/* The optimizer's step, or on a skipped step the gradients dropped; the
 * loss scaler told either way. */
static int apply_or_skip(trainer *t, step_result *r, float norm)
{
    int rc;
    if (r->skipped) {
        /* the step is dropped (the scale halved first) */
        trainer_scaler_update(t, r);
        if ((rc = zero_grads(t)) != LOOM_OK)
            return rc;
        trainer_sync_units(t);
        return LOOM_OK;
    }
    loom_flight_issuer("optimizer");
    if ((rc = optimizer_step(t, r, norm)) != LOOM_OK)
        return rc;
    /* the step's write-backs land within the step they belong to */
    if ((rc = loom_tiers_flush(t->job.tiers)) != LOOM_OK)
        return rc;
    trainer_sync_units(t);
    if (t->pipe.executor && (rc = loom_pipeline_sync_tied(t->pipe.executor)) != LOOM_OK)
        return rc;
    /* after the optimizer, which unscaled by the step's scale */
    trainer_scaler_update(t, r);
    return LOOM_OK;
}

int trainer_step(trainer *t, step_result *r)
{
    uint64_t t0 = loom_now_ns();
    trainer_count_traffic(t, 0);
    loom_kernel_time_reset();
    loom_flight_step(t->job.step + 1);
    double loss_sum = 0;
    float loss = 0, norm = 0;
    int rc = forward_backward(t, &loss_sum);
    if (rc == LOOM_OK)
        rc = global_loss(t, loss_sum, &loss);
    if (rc == LOOM_OK)
        rc = global_norm(t, &norm);
    if (rc != LOOM_OK)
        return rc;
    float reported = norm;
    int any_nonfinite = 0;
    if (approximate(t) && (rc = reported_norm(t, norm, &reported, &any_nonfinite)) != LOOM_OK)
        return rc;
    r->loss = loss;
    r->grad_norm = reported;
    r->lr = loom_lr_at(&t->opt.lr_schedule, t->job.step);
    trainer_scaler_judge(t, loss, any_nonfinite ? NAN : norm, r);
    if ((rc = apply_or_skip(t, r, norm)) != LOOM_OK)
        return rc;
    uint64_t end = loom_now_ns();
    r->seconds = (double)(end - t0) / 1e9;
    read_kernel_times(r, end);
    trainer_count_traffic(t, 1);
    loom_flight_issuer("between steps");
    return LOOM_OK;
}
