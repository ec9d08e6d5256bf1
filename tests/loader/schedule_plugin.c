/* A pipeline schedule for the loader's schedule rules: all forwards, then
 * all backwards (GPipe, one virtual stage). Built as a schedule plugin
 * (loom/schedule.h), and with VARIANT_STRATEGY_KIND as a schedule was
 * built before ABI 1.8, a strategy of the pp axis (create, describe,
 * pipeline_schedule, destroy), which the loader adapts; the two emit the
 * same lists. Broken variants: header.kind not a schedule's, no build op.
 * The strategy-kind one emits only for the ranks its create was told of,
 * so a wrong pp size from the adapter shows in its lists. */
#include <stdlib.h>

#if defined(VARIANT_STRATEGY_KIND)
#include "loom/strategy.h"
#else
#include "loom/schedule.h"
#endif

#ifndef PLUGIN_NAME
#define PLUGIN_NAME "good"
#endif

#if !defined(VARIANT_NOBUILD)
static int emit(const loom_pipeline_shape *shape, int rank, int kind, int mb)
{
    loom_action a = {(uint16_t)kind, 0, mb};
    return shape->emit(shape->builder, rank, a);
}

static int fill_drain(int stages, const loom_pipeline_shape *shape)
{
    int p = shape->stages, m = shape->microbatches, rc = LOOM_OK;
    for (int r = 0; r < stages && rc == LOOM_OK; r++) {
        for (int mb = 0; mb < m && rc == LOOM_OK; mb++) {
            rc = r > 0 ? emit(shape, r, LOOM_ACT_RECV_ACTIVATION, mb) : LOOM_OK;
            if (rc == LOOM_OK)
                rc = emit(shape, r, LOOM_ACT_FORWARD, mb);
            if (rc == LOOM_OK && r < p - 1)
                rc = emit(shape, r, LOOM_ACT_SEND_ACTIVATION, mb);
        }
        for (int mb = 0; mb < m && rc == LOOM_OK; mb++) {
            rc = r < p - 1 ? emit(shape, r, LOOM_ACT_RECV_GRADIENT, mb) : LOOM_OK;
            if (rc == LOOM_OK)
                rc = emit(shape, r, LOOM_ACT_BACKWARD, mb);
            if (rc == LOOM_OK && r > 0)
                rc = emit(shape, r, LOOM_ACT_SEND_GRADIENT, mb);
        }
    }
    return rc;
}
#endif

static double bubble(int stages, int virtual_stages, int microbatches, const char **formula)
{
    *formula = "(p-1)/(m+p-1)";
    return virtual_stages == 1 ? (double)(stages - 1) / (microbatches + stages - 1) : -1.0;
}

#if defined(VARIANT_STRATEGY_KIND)

struct loom_strategy {
    const loom_host *host;
    int stages;
};

static int old_create(const loom_host *host, const loom_strategy_setup *setup,
                      loom_strategy **out)
{
    loom_strategy *s = calloc(1, sizeof *s);
    if (!s)
        return host->error(host, LOOM_ERR_NO_MEMORY, "%s: out of memory", PLUGIN_NAME);
    s->host = host;
    s->stages = setup->sizes[LOOM_AXIS_PP];
    *out = s;
    return LOOM_OK;
}

static int old_destroy(loom_strategy *s)
{
    free(s);
    return LOOM_OK;
}

static int old_describe(const loom_strategy *s, char *buf, size_t cap)
{
    (void)s, (void)buf, (void)cap;
    return LOOM_OK;
}

static int old_schedule(loom_strategy *s, const loom_pipeline_shape *shape)
{
    if (shape->virtual_stages != 1)
        return s->host->error(s->host, LOOM_ERR_INVALID, "%s: one virtual stage only",
                              PLUGIN_NAME);
    return fill_drain(s->stages, shape);
}

/* As built by loom 1.7, the last minor before schedules had a kind. */
LOOM_PLUGIN_EXPORT const loom_strategy_plugin_v1_t loom_strategy_plugin_v1 = {
    .header = {LOOM_ABI_VERSION(1, 7), (uint32_t)sizeof(loom_strategy_plugin_v1_t),
               LOOM_PLUGIN_STRATEGY, (uint32_t)sizeof(loom_setting_spec), PLUGIN_NAME,
               "fill-drain, as a strategy of the pp axis (loader tests)", NULL},
    .axis = LOOM_AXIS_PP,
    .create = old_create,
    .destroy = old_destroy,
    .describe = old_describe,
    .pipeline_schedule = old_schedule,
    .pipeline_bubble = bubble,
};

#else

#if defined(VARIANT_NOBUILD)
#define BUILD NULL
#else
#define BUILD build
static int build(const loom_host *host, const loom_pipeline_shape *shape)
{
    if (shape->virtual_stages != 1)
        return host->error(host, LOOM_ERR_INVALID, "%s: one virtual stage only", PLUGIN_NAME);
    return fill_drain(shape->stages, shape);
}
#endif

#if defined(VARIANT_KINDFIELD)
#define KIND LOOM_PLUGIN_STRATEGY
#else
#define KIND LOOM_PLUGIN_SCHEDULE
#endif

LOOM_PLUGIN_EXPORT const loom_schedule_plugin_v1_t loom_schedule_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(KIND, loom_schedule_plugin_v1_t, PLUGIN_NAME,
                                 "fill-drain (loader tests)", NULL),
    .build = BUILD,
    .bubble = bubble,
};

#endif
