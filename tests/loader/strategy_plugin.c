/* A data-axis strategy that keeps everything replicated, for the loader's
 * strategy rules, and its broken variants: an axis out of range, a tensor
 * strategy missing a REQUIRED hook, and (built as libloom-comm-*.so) a file
 * that is a strategy where a communicator was wanted. */
#include <stdio.h>
#include <stdlib.h>

#include "loom/strategy.h"

#ifndef PLUGIN_NAME
#define PLUGIN_NAME "good"
#endif

struct loom_strategy {
    const loom_host *host;
};

static int strategy_create(const loom_host *host, const loom_strategy_setup *setup,
                           loom_strategy **out)
{
    (void)setup;
    loom_strategy *s = calloc(1, sizeof *s);
    if (!s)
        return host->error(host, LOOM_ERR_NO_MEMORY, "strategy-%s: out of memory", PLUGIN_NAME);
    s->host = host;
    *out = s;
    return LOOM_OK;
}

static int strategy_destroy(loom_strategy *s)
{
    free(s);
    return LOOM_OK;
}

static int strategy_describe(const loom_strategy *s, char *buf, size_t cap)
{
    (void)s;
    snprintf(buf, cap, "%s (loader test)", PLUGIN_NAME);
    return LOOM_OK;
}

#if defined(VARIANT_TP_MISSING)

static int shard(loom_strategy *s, const loom_param_desc *param, loom_param_shard *out)
{
    (void)s;
    out->begin = 0;
    out->count = param->ndim ? param->shape[0] : 1;
    return LOOM_OK;
}

static int identity(loom_strategy *s, loom_region region, const loom_tensor *x, loom_tensor *out)
{
    (void)s, (void)region;
    *out = *x;
    return LOOM_OK;
}

#define AXIS LOOM_AXIS_TP
#define AXIS_HOOKS                                                                   \
    .tensor_shard = shard, .tensor_enter = identity, .tensor_exit_backward = identity, \
    .tensor_enter_backward = identity /* tensor_exit left NULL */

#else

static int data_setup(loom_strategy *s, loom_unit *units, int nunits, float *const *init)
{
    (void)s, (void)units, (void)nunits, (void)init;
    return LOOM_OK;
}

static int data_optimizer_step(loom_strategy *s, const loom_optimizer_step *step)
{
    (void)s, (void)step;
    return LOOM_OK;
}

#if defined(VARIANT_BADAXIS)
#define AXIS 7
#else
#define AXIS LOOM_AXIS_DP
#endif
#define AXIS_HOOKS .data_setup = data_setup, .data_optimizer_step = data_optimizer_step

#endif

#define SYMBOL_NAME(sym) __asm__(#sym)

#if defined(VARIANT_SETTINGS_COLLIDE)
/* parallel.dp.size is the core's: a plugin setting of that name would be
 * read by neither side as its author meant. */
static const loom_setting_spec settings[] = {
    {.name = "size", .type = LOOM_SETTING_INT, .default_value = "2", .help = "servers"},
    {0},
};
#else
#define settings NULL
#endif

LOOM_PLUGIN_EXPORT const loom_strategy_plugin_v1_t plugin SYMBOL_NAME(loom_strategy_plugin_v1) = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_STRATEGY, loom_strategy_plugin_v1_t, PLUGIN_NAME,
                                 "everything replicated (loader tests)", settings),
    .axis = AXIS,
    .create = strategy_create,
    .destroy = strategy_destroy,
    .describe = strategy_describe,
    AXIS_HOOKS,
};
