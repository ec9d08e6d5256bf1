/* The least a data strategy can be: data_setup and data_optimizer_step, the
 * two REQUIRED hooks, with parameters, gradients and Adam state replicated
 * and no communication. The core's defaults do the rest (the norm over the
 * units' gradients, zeroing them), which is right for a dp group of one
 * only: serving more ranks, the core refuses it. Variants declare
 * requirements through `capabilities` (CAPABILITIES), or add what a dp
 * group needs (GROUP), with a norm that is wrong there (SHARE_NORM), or a
 * forward hook of its own without data_eval (FORWARD_HOOK). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/strategy.h"

#ifndef CAPABILITIES
#define CAPABILITIES 0
#endif

struct loom_strategy {
    const loom_host *host;
    loom_group *dp;
    loom_unit *units;
    int nunits;
    float **m, **v;
};

static int minimal_create(const loom_host *host, const loom_strategy_setup *setup,
                          loom_strategy **out)
{
    if (setup->compute_dtype != LOOM_F32)
        return host->error(host, LOOM_ERR_NOT_SUPPORTED, "%s: fp32 only", PLUGIN_NAME);
    loom_strategy *s = calloc(1, sizeof *s);
    if (!s)
        return host->error(host, LOOM_ERR_NO_MEMORY, "%s: out of memory", PLUGIN_NAME);
    s->host = host;
    s->dp = setup->groups[LOOM_AXIS_DP];
    *out = s;
    return LOOM_OK;
}

static int minimal_destroy(loom_strategy *s)
{
    const loom_host *h = s->host;
    /* what setup placed, also after a setup that failed half-way (the
     * arrays are zeroed, mem_free takes NULL) */
    for (int i = 0; i < s->nunits; i++) {
        if (s->units) {
            h->mem_free(h, s->units[i].params);
            h->mem_free(h, s->units[i].grads);
        }
        if (s->m)
            h->mem_free(h, s->m[i]);
        if (s->v)
            h->mem_free(h, s->v[i]);
    }
    free(s->m);
    free(s->v);
    free(s);
    return LOOM_OK;
}

static int minimal_describe(const loom_strategy *s, char *buf, size_t cap)
{
    (void)s;
    snprintf(buf, cap, "%s (replicated, no communication)", PLUGIN_NAME);
    return LOOM_OK;
}

static int alloc_zeroed(const loom_host *h, loom_purpose purpose, size_t n, float **out)
{
    void *p = NULL;
    int rc = h->mem_alloc(h, LOOM_TIER_HOST, purpose, (n ? n : 1) * sizeof(float), &p);
    if (rc == LOOM_OK)
        memset(p, 0, n * sizeof(float));
    *out = p;
    return rc;
}

static int minimal_setup(loom_strategy *s, loom_unit *units, int nunits, float *const *init)
{
    const loom_host *h = s->host;
    s->units = units;
    s->nunits = nunits;
    s->m = calloc((size_t)nunits, sizeof *s->m);
    s->v = calloc((size_t)nunits, sizeof *s->v);
    if (!s->m || !s->v)
        return h->error(h, LOOM_ERR_NO_MEMORY, "%s: out of memory", PLUGIN_NAME);
    for (int i = 0; i < nunits; i++) {
        loom_unit *u = &units[i];
        float *params, *grads;
        int rc;
        if ((rc = alloc_zeroed(h, LOOM_PURPOSE_PARAMS, u->numel, &params)) != LOOM_OK ||
            (rc = alloc_zeroed(h, LOOM_PURPOSE_GRADS, u->numel, &grads)) != LOOM_OK ||
            (rc = alloc_zeroed(h, LOOM_PURPOSE_OPTIMIZER, u->numel, &s->m[i])) != LOOM_OK ||
            (rc = alloc_zeroed(h, LOOM_PURPOSE_OPTIMIZER, u->numel, &s->v[i])) != LOOM_OK)
            return rc;
        memcpy(params, init[i], u->numel * sizeof(float));
        u->params = params;
        u->grads = grads;
    }
    return LOOM_OK;
}

static int minimal_step(loom_strategy *s, const loom_optimizer_step *step)
{
    for (int i = 0; i < s->nunits; i++) {
        loom_unit *u = &s->units[i];
        step->update(step, u->params, u->grads, LOOM_F32, s->m[i], s->v[i], u->numel);
        memset(u->grads, 0, u->numel * sizeof(float));
    }
    return LOOM_OK;
}

#if defined(VARIANT_GROUP)
/* Enough to serve a dp group: average the gradients once the backward is
 * done, and the hooks the core refuses to default beyond one rank. The
 * norm is of the averaged (replicated) gradients: with SHARE_NORM only of
 * this rank's 1/size of each unit, without communication, which is wrong
 * and must be stopped. */
static int minimal_finish(loom_strategy *s)
{
    const loom_comm_api *C = s->host->comm;
    loom_group *dp = s->dp;
    for (int i = 0; i < s->nunits; i++) {
        loom_request *req = NULL;
        int rc = C->allreduce(dp, s->units[i].grads, s->units[i].grads, s->units[i].numel,
                              LOOM_F32, LOOM_AVG, &req);
        if (rc != LOOM_OK || (rc = C->wait(req)) != LOOM_OK)
            return rc;
    }
    return LOOM_OK;
}

static int minimal_norm_sq(loom_strategy *s, double *out)
{
    int size = s->host->comm->size(s->dp), rank = s->host->comm->rank(s->dp);
    double sum = 0;
    for (int i = 0; i < s->nunits; i++) {
        const float *g = s->units[i].grads;
        size_t n = s->units[i].numel, begin = 0, end = n;
#if defined(VARIANT_SHARE_NORM)
        begin = n * (size_t)rank / (size_t)size;
        end = n * (size_t)(rank + 1) / (size_t)size;
#else
        (void)size, (void)rank;
#endif
        for (size_t k = begin; k < end; k++)
            sum += (double)g[k] * g[k];
    }
    *out = sum;
    return LOOM_OK;
}

static int minimal_zero(loom_strategy *s)
{
    for (int i = 0; i < s->nunits; i++)
        memset(s->units[i].grads, 0, s->units[i].numel * sizeof(float));
    return LOOM_OK;
}

static int minimal_get_state(loom_strategy *s, loom_unit *u, float *params, float *m, float *v)
{
    memcpy(params, u->params, u->numel * sizeof(float));
    memcpy(m, s->m[u->index], u->numel * sizeof(float));
    memcpy(v, s->v[u->index], u->numel * sizeof(float));
    return LOOM_OK;
}

static int minimal_set_state(loom_strategy *s, loom_unit *u, const float *params, const float *m,
                             const float *v)
{
    size_t bytes = u->numel * sizeof(float);
    memcpy(u->params, params, bytes);
    if (m)
        memcpy(s->m[u->index], m, bytes);
    else
        memset(s->m[u->index], 0, bytes);
    if (v)
        memcpy(s->v[u->index], v, bytes);
    else
        memset(s->v[u->index], 0, bytes);
    return LOOM_OK;
}

#define GROUP_HOOKS                                                                        \
    .data_finish_backward = minimal_finish, .data_grad_norm_sq = minimal_norm_sq,          \
    .data_zero_grads = minimal_zero, .data_get_state = minimal_get_state,                  \
    .data_set_state = minimal_set_state,
#else
#define GROUP_HOOKS
#endif

#if defined(VARIANT_FORWARD_HOOK)
/* Does nothing, as the core's default would: what counts is that the
 * plugin provides it, which says it may gather parameters there. */
static int minimal_before_forward(loom_strategy *s, loom_unit *unit)
{
    (void)s, (void)unit;
    return LOOM_OK;
}
#define FORWARD_HOOK .data_before_forward = minimal_before_forward,
#else
#define FORWARD_HOOK
#endif

LOOM_PLUGIN_EXPORT const loom_strategy_plugin_v1_t loom_strategy_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_STRATEGY, loom_strategy_plugin_v1_t, PLUGIN_NAME,
                                 "replicated, no communication: the REQUIRED hooks only", NULL),
    .axis = LOOM_AXIS_DP,
    .create = minimal_create,
    .destroy = minimal_destroy,
    .describe = minimal_describe,
    .data_setup = minimal_setup,
    .data_optimizer_step = minimal_step,
    .capabilities = CAPABILITIES,
    GROUP_HOOKS
    FORWARD_HOOK
};
