/* The least a data strategy can be: data_setup and data_optimizer_step, the
 * two REQUIRED hooks, with parameters, gradients and Adam state replicated
 * and no communication. The core's defaults do the rest (the norm over the
 * units' gradients, zeroing them), which is right for a dp group of one
 * only: serving more ranks, the core refuses it. Variants declare
 * requirements through `capabilities` (CAPABILITIES). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/strategy.h"

#ifndef CAPABILITIES
#define CAPABILITIES 0
#endif

struct loom_strategy {
    const loom_host *host;
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
    *out = s;
    return LOOM_OK;
}

static int minimal_destroy(loom_strategy *s)
{
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
};
