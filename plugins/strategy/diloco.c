/* diloco — DiLoCo (Douillard et al., 2023): data parallelism that talks
 * once every H steps instead of every step, for workers joined by slow
 * links (across datacentres).
 *
 * Every dp rank is a worker with a replica of its own. It steps AdamW on
 * its own gradients (never averaged: the inner optimizer, its moments kept
 * across syncs) for H steps. Then the outer step: one all-reduce averages
 * the workers' weights, the outer gradient is how far that average moved
 * from the outer weights of the last sync, delta = outer - mean, and
 * Nesterov momentum steps the outer weights by it (PyTorch's SGD with
 * nesterov = True: buf = mu buf + delta; outer -= lr (delta + mu buf));
 * every worker then starts again from the outer weights. With outer_lr 1
 * and outer_momentum 0 the outer weights are the workers' average, so on
 * one rank the run is the single-rank run.
 *
 * A sync comes after optimizer steps H, 2H, ... (the step's number, which
 * a resumed run carries on), so checkpoints between syncs hold each
 * worker's own weights and moments (data_replica_state) and a resume is
 * bitwise the run that went on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/compute.h"
#include "common/reduce.h"
#include "common/strategy_common.h"
#include "loom/strategy.h"

static const loom_setting_spec diloco_settings[] = {
    {.name = "sync_every", .type = LOOM_SETTING_INT, .default_value = "16",
     .help = "H: inner steps of each worker between two syncs of the weights",
     .bounds = LOOM_SETTING_MIN, .min = 1},
    {.name = "outer_lr", .type = LOOM_SETTING_FLOAT, .default_value = "0.7",
     .help = "the outer optimizer's learning rate (1 with momentum 0: the plain average)",
     .bounds = LOOM_SETTING_ABOVE_MIN, .min = 0},
    {.name = "outer_momentum", .type = LOOM_SETTING_FLOAT, .default_value = "0.9",
     .help = "the outer optimizer's Nesterov momentum",
     .bounds = LOOM_SETTING_MIN | LOOM_SETTING_BELOW_MAX, .min = 0, .max = 1},
    {0},
};

struct loom_strategy {
    const loom_host *host;
    loom_group *dp;
    int dp_size;
    int64_t sync_every;
    double outer_lr, outer_momentum;

    loom_unit *units;
    int nunits;
    size_t *offset; /* each unit's, in elements, into the flat buffers */
    size_t numel;
    loom_dtype dtype;
    size_t esize;
    /* The model's memory (the compute backend's), flat: params and grads in
     * the compute dtype; the rest f32. master is the worker's weights, the
     * fp32 params themselves in an fp32 run. */
    void *params, *grads;
    float *master, *m, *v;
    float *outer, *momentum; /* the same on every worker */
};

/* ------------------------------------------------------------- common */

static int diloco_create(const loom_host *host, const loom_strategy_setup *setup,
                         loom_strategy **out)
{
    loom_group *dp = NULL;
    int rc = strategy_axis_group(host, setup, "diloco", LOOM_AXIS_DP, &dp);
    int64_t sync_every = 16;
    double outer_lr = 0.7, outer_momentum = 0.9;
    if (rc == LOOM_OK)
        rc = host->config_int(host, "sync_every", &sync_every);
    if (rc == LOOM_OK)
        rc = host->config_float(host, "outer_lr", &outer_lr);
    if (rc == LOOM_OK)
        rc = host->config_float(host, "outer_momentum", &outer_momentum);
    if (rc != LOOM_OK)
        return rc;
    loom_strategy *s = calloc(1, sizeof *s);
    if (!s)
        return host->error(host, LOOM_ERR_NO_MEMORY, "diloco: out of memory");
    *s = (loom_strategy){.host = host, .dp = dp, .dp_size = host->comm->size(dp),
                         .sync_every = sync_every, .outer_lr = outer_lr,
                         .outer_momentum = outer_momentum};
    *out = s;
    return LOOM_OK;
}

static void free_buffers(loom_strategy *s)
{
    const loom_host *h = s->host;
    if ((void *)s->master == s->params)
        s->master = NULL;
    void **buffers[] = {&s->params, &s->grads,       (void **)&s->master,  (void **)&s->m,
                        (void **)&s->v, (void **)&s->outer, (void **)&s->momentum};
    for (size_t i = 0; i < sizeof buffers / sizeof *buffers; i++)
        strategy_release(h, buffers[i]);
    free(s->offset);
    s->offset = NULL;
}

static int diloco_destroy(loom_strategy *s)
{
    if (s) {
        free_buffers(s);
        free(s);
    }
    return LOOM_OK;
}

static int diloco_describe(const loom_strategy *s, char *buf, size_t cap)
{
    snprintf(buf, cap, "diloco over %d rank%s, sync every %lld step%s, outer lr %g, momentum %g",
             s->dp_size, s->dp_size == 1 ? "" : "s", (long long)s->sync_every,
             s->sync_every == 1 ? "" : "s", s->outer_lr, s->outer_momentum);
    return LOOM_OK;
}

/* ----------------------------------------------------------- data axis */

static int unit_slot(loom_strategy *s, const loom_unit *unit, const char *hook)
{
    int i = s->offset ? strategy_find_unit(s->units, s->nunits, unit) : -1;
    if (i < 0)
        return s->host->error(s->host, LOOM_ERR_INVALID,
                              "diloco: %s for unit %d ('%s'), which data_setup was not given",
                              hook, unit->index, strategy_unit_name(unit));
    return i;
}

/* The worker's weights of unit i from fp32 values in host memory, its
 * parameters from them, and the outer weights the same. */
static int set_weights(loom_strategy *s, int i, const float *values)
{
    const loom_host *h = s->host;
    const loom_compute_api *c = strategy_compute(h);
    size_t off = s->offset[i], n = s->units[i].numel;
    if (!n)
        return LOOM_OK;
    int rc = c->to_device(h, s->master + off, values, n * sizeof(float));
    if (rc == LOOM_OK && s->dtype != LOOM_F32)
        rc = c->convert(h, (char *)s->params + off * s->esize, s->dtype, s->master + off,
                        LOOM_F32, n);
    if (rc == LOOM_OK)
        rc = c->copy(h, s->outer + off, s->master + off, n * sizeof(float));
    return rc;
}

static int diloco_data_setup(loom_strategy *s, loom_unit *units, int nunits, float *const *init)
{
    const loom_host *h = s->host;
    if (s->offset)
        return h->error(h, LOOM_ERR_INVALID, "diloco: data_setup called twice");
    int rc = strategy_check_units(h, "diloco", units, nunits, init,
                                  "its flat buffers need a single dtype");
    if (rc != LOOM_OK)
        return rc;
    if (!(s->offset = calloc((size_t)nunits, sizeof *s->offset)))
        return h->error(h, LOOM_ERR_NO_MEMORY, "diloco: out of memory");
    s->units = units;
    s->nunits = nunits;
    s->dtype = units[0].compute_dtype;
    s->esize = loom_dtype_size(s->dtype);
    for (int i = 0; i < nunits; i++) {
        s->offset[i] = s->numel;
        s->numel += units[i].numel;
    }
    size_t n = s->numel, f32 = n * sizeof(float);
    void *p[7] = {0};
    rc = strategy_alloc_model(h, LOOM_PURPOSE_PARAMS, n * s->esize, &p[0]);
    if (rc == LOOM_OK)
        rc = strategy_alloc_model(h, LOOM_PURPOSE_GRADS, n * s->esize, &p[1]);
    if (rc == LOOM_OK && s->dtype != LOOM_F32)
        rc = strategy_alloc_model(h, LOOM_PURPOSE_OPTIMIZER, f32, &p[2]);
    for (int k = 3; k < 7 && rc == LOOM_OK; k++)
        rc = strategy_alloc_model(h, LOOM_PURPOSE_OPTIMIZER, f32, &p[k]);
    s->params = p[0];
    s->grads = p[1];
    s->master = s->dtype != LOOM_F32 ? p[2] : p[0];
    s->m = p[3];
    s->v = p[4];
    s->outer = p[5];
    s->momentum = p[6];
    for (int i = 0; i < nunits && rc == LOOM_OK; i++) {
        rc = set_weights(s, i, init[i]);
        units[i].params = (char *)s->params + s->offset[i] * s->esize;
        units[i].grads = (char *)s->grads + s->offset[i] * s->esize;
    }
    if (rc != LOOM_OK)
        free_buffers(s); /* mem_alloc or the backend said what failed */
    return rc;
}

static int diloco_data_grad_norm_sq(loom_strategy *s, double *out)
{
    if (!s->offset)
        return s->host->error(s->host, LOOM_ERR_INVALID,
                              "diloco: data_grad_norm_sq before data_setup");
    /* The worker's own: each replica clips by its own norm. */
    double sum = 0.0;
    int rc = strategy_compute(s->host)->sum_squares(s->host, s->grads, s->dtype, s->numel, &sum);
    if (rc == LOOM_OK)
        *out = sum;
    return rc;
}

static int diloco_data_zero_grads(loom_strategy *s)
{
    if (!s->offset)
        return LOOM_OK;
    return strategy_compute(s->host)->zero(s->host, s->grads, s->numel * s->esize);
}

/* The outer step on host views of n elements (the model's memory staged
 * where it is a device's): mean holds the workers' average and becomes
 * the new weights of every worker. */
static void outer_step(const loom_strategy *s, float *outer, float *momentum, float *mean,
                       size_t n)
{
    float lr = (float)s->outer_lr, mu = (float)s->outer_momentum;
    for (size_t j = 0; j < n; j++) {
        float delta = outer[j] - mean[j];
        float update = delta;
        if (mu > 0.0f) {
            momentum[j] = mu * momentum[j] + delta;
            update = delta + mu * momentum[j];
        }
        outer[j] -= lr * update;
        mean[j] = outer[j];
    }
}

static int sync_workers(loom_strategy *s)
{
    const loom_host *h = s->host;
    size_t n = s->numel, bytes = n * sizeof(float);
    loom_redop average = LOOM_AVG;
    int rc = strategy_average_begin(h, s->master, n, LOOM_F32, s->dp_size, &average);
    loom_request *req = NULL;
    if (rc == LOOM_OK)
        rc = h->comm->allreduce(s->dp, s->master, s->master, n, LOOM_F32, average, &req);
    if (rc == LOOM_OK)
        rc = h->comm->wait(req); /* the comm layer's detail names the op and the ranks */
    if (rc == LOOM_OK)
        rc = strategy_average_end(h, s->master, n, LOOM_F32,
                                  average_prescale(LOOM_F32, s->dp_size), s->dp_size);
    if (rc != LOOM_OK)
        return rc;
    void *outer = NULL, *momentum = NULL, *mean = NULL;
    int staged[3] = {0};
    rc = strategy_stage_in(h, s->outer, bytes, &outer, &staged[0]);
    if (rc == LOOM_OK && (rc = strategy_stage_in(h, s->momentum, bytes, &momentum, &staged[1])) !=
                             LOOM_OK)
        strategy_stage_out(h, s->outer, outer, bytes, staged[0], 0);
    if (rc == LOOM_OK && (rc = strategy_stage_in(h, s->master, bytes, &mean, &staged[2])) !=
                             LOOM_OK) {
        strategy_stage_out(h, s->outer, outer, bytes, staged[0], 0);
        strategy_stage_out(h, s->momentum, momentum, bytes, staged[1], 0);
    }
    if (rc != LOOM_OK)
        return rc;
    outer_step(s, outer, momentum, mean, n);
    rc = strategy_stage_out(h, s->outer, outer, bytes, staged[0], 1);
    int r2 = strategy_stage_out(h, s->momentum, momentum, bytes, staged[1], 1);
    int r3 = strategy_stage_out(h, s->master, mean, bytes, staged[2], 1);
    rc = rc != LOOM_OK ? rc : r2 != LOOM_OK ? r2 : r3;
    if (rc == LOOM_OK && s->dtype != LOOM_F32)
        rc = strategy_compute(h)->convert(h, s->params, s->dtype, s->master, LOOM_F32, n);
    return rc;
}

static int diloco_data_optimizer_step(loom_strategy *s, const loom_optimizer_step *step)
{
    const loom_host *h = s->host;
    if (!s->offset)
        return h->error(h, LOOM_ERR_INVALID, "diloco: data_optimizer_step before data_setup");
    if (!step || !step->update_range)
        return h->error(h, LOOM_ERR_INVALID,
                        "diloco: data_optimizer_step without an update function");
    for (int i = 0; i < s->nunits; i++) {
        size_t off = s->offset[i];
        strategy_update_store(h, step, &s->units[i], 0, s->master + off,
                              (const char *)s->grads + off * s->esize, s->m + off, s->v + off,
                              s->units[i].numel, (char *)s->params + off * s->esize, s->dtype);
    }
    int rc = strategy_compute(h)->zero(h, s->grads, s->numel * s->esize);
    if (rc == LOOM_OK && step->step % s->sync_every == 0)
        rc = sync_workers(s);
    return rc;
}

/* The shared state: the outer weights (the model as of the last sync, the
 * same on every worker) and this worker's Adam moments. */
static int diloco_data_get_state(loom_strategy *s, loom_unit *unit, float *params, float *m,
                                 float *v)
{
    int i = unit_slot(s, unit, "data_get_state");
    if (i < 0)
        return i;
    const loom_compute_api *c = strategy_compute(s->host);
    size_t off = s->offset[i], bytes = s->units[i].numel * sizeof(float);
    int rc = params ? c->to_host(s->host, params, s->outer + off, bytes) : LOOM_OK;
    if (rc == LOOM_OK && m)
        rc = c->to_host(s->host, m, s->m + off, bytes);
    if (rc == LOOM_OK && v)
        rc = c->to_host(s->host, v, s->v + off, bytes);
    return rc;
}

/* Every worker starts from the shared state, the outer momentum at zero;
 * a resume at the mesh that wrote the checkpoint then restores each
 * worker's own (data_replica_state). */
static int diloco_data_set_state(loom_strategy *s, loom_unit *unit, const float *params,
                                 const float *m, const float *v)
{
    int i = unit_slot(s, unit, "data_set_state");
    if (i < 0)
        return i;
    const loom_compute_api *c = strategy_compute(s->host);
    size_t off = s->offset[i], bytes = s->units[i].numel * sizeof(float);
    int rc = params ? set_weights(s, i, params) : LOOM_OK;
    if (rc == LOOM_OK && m)
        rc = c->to_device(s->host, s->m + off, m, bytes);
    if (rc == LOOM_OK && v)
        rc = c->to_device(s->host, s->v + off, v, bytes);
    if (rc == LOOM_OK)
        rc = c->zero(s->host, s->momentum + off, bytes);
    return rc;
}

static int diloco_data_replica_state(loom_strategy *s, loom_unit *unit,
                                     loom_replica_buffer *buffers, int *count)
{
    int i = unit_slot(s, unit, "data_replica_state");
    if (i < 0)
        return i;
    size_t off = s->offset[i], n = s->units[i].numel, f32 = n * sizeof(float);
    loom_replica_buffer all[] = {
        {"params", (char *)s->params + off * s->esize, n * s->esize},
        {"adam m", s->m + off, f32},
        {"adam v", s->v + off, f32},
        {"outer momentum", s->momentum + off, f32},
        {"master weights", s->master + off, f32}, /* 16-bit runs only */
    };
    int k = s->dtype != LOOM_F32 ? 5 : 4;
    if (buffers)
        memcpy(buffers, all, (size_t)k * sizeof *all);
    *count = k;
    return LOOM_OK;
}

LOOM_PLUGIN_EXPORT const loom_strategy_plugin_v1_t loom_strategy_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_STRATEGY, loom_strategy_plugin_v1_t, "diloco",
                                 "DiLoCo: each worker steps on its own for sync_every steps, then "
                                 "one all-reduce and an outer Nesterov step",
                                 diloco_settings),
    .axis = LOOM_AXIS_DP,
    .capabilities = LOOM_STRATEGY_APPROXIMATE,
    .create = diloco_create,
    .destroy = diloco_destroy,
    .describe = diloco_describe,
    .data_setup = diloco_data_setup,
    .data_grad_norm_sq = diloco_data_grad_norm_sq,
    .data_optimizer_step = diloco_data_optimizer_step,
    .data_zero_grads = diloco_data_zero_grads,
    .data_get_state = diloco_data_get_state,
    .data_set_state = diloco_data_set_state,
    .data_replica_state = diloco_data_replica_state,
};
