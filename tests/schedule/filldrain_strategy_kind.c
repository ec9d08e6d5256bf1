/* The out-of-tree "fill-drain" schedule as it was written before loom ABI
 * 1.8, when pipeline schedules were strategy plugins of the pp axis: a
 * user's plugin built against the old header shape. loom loads it as a
 * schedule through the loader's adapter, and it must plan and train
 * exactly as examples/out-of-tree-plugin/filldrain.c, the same schedule of
 * the schedule kind (tests/schedule, tests/pipeline). */
#include <stdio.h>
#include <stdlib.h>

#include <loom/strategy.h>

struct loom_strategy {
    const loom_host *host;
    int stages;
};

static int filldrain_create(const loom_host *host, const loom_strategy_setup *setup,
                            loom_strategy **out)
{
    loom_strategy *s = calloc(1, sizeof *s);
    if (!s)
        return host->error(host, LOOM_ERR_NO_MEMORY, "filldrain: out of memory");
    s->host = host;
    s->stages = setup->sizes[LOOM_AXIS_PP];
    *out = s;
    return LOOM_OK;
}

static int filldrain_destroy(loom_strategy *s)
{
    free(s);
    return LOOM_OK;
}

static int filldrain_describe(const loom_strategy *s, char *buf, size_t cap)
{
    snprintf(buf, cap, "fill-drain schedule over %d stages", s->stages);
    return LOOM_OK;
}

static int emit(const loom_pipeline_shape *shape, int rank, loom_action_kind kind, int mb)
{
    loom_action a = {(uint16_t)kind, 0, mb};
    return shape->emit(shape->builder, rank, a);
}

static int filldrain_schedule(loom_strategy *s, const loom_pipeline_shape *shape)
{
    if (shape->virtual_stages != 1)
        return s->host->error(s->host, LOOM_ERR_NOT_SUPPORTED,
                              "filldrain: one virtual stage per rank only (got %d)",
                              shape->virtual_stages);
    int p = shape->stages, m = shape->microbatches, rc = LOOM_OK;
    for (int r = 0; r < p && rc == LOOM_OK; r++) {
        for (int mb = 0; mb < m && rc == LOOM_OK; mb++) {
            if (r > 0)
                rc = emit(shape, r, LOOM_ACT_RECV_ACTIVATION, mb);
            if (rc == LOOM_OK)
                rc = emit(shape, r, LOOM_ACT_FORWARD, mb);
            if (rc == LOOM_OK && r < p - 1)
                rc = emit(shape, r, LOOM_ACT_SEND_ACTIVATION, mb);
        }
        for (int mb = m - 1; mb >= 0 && rc == LOOM_OK; mb--) {
            if (r < p - 1)
                rc = emit(shape, r, LOOM_ACT_RECV_GRADIENT, mb);
            if (rc == LOOM_OK)
                rc = emit(shape, r, LOOM_ACT_BACKWARD, mb);
            if (rc == LOOM_OK && r > 0)
                rc = emit(shape, r, LOOM_ACT_SEND_GRADIENT, mb);
        }
    }
    return rc;
}

LOOM_PLUGIN_EXPORT const loom_strategy_plugin_v1_t loom_strategy_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_STRATEGY, loom_strategy_plugin_v1_t, "filldrain",
                                 "pipeline schedule: all forwards, then all backwards newest first",
                                 NULL),
    .axis = LOOM_AXIS_PP,
    .create = filldrain_create,
    .destroy = filldrain_destroy,
    .describe = filldrain_describe,
    .pipeline_schedule = filldrain_schedule,
};
