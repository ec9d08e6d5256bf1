/* An out-of-tree pipeline schedule for loom: "fill-drain".
 *
 * Every stage runs all microbatches forward (filling the pipeline), then all
 * backward in reverse order (draining it, newest activations first, so the
 * oldest stay alive longest — the GPipe shape with LIFO backward). A
 * schedule plugin runs nothing: it emits each pp rank's list of actions, and
 * loom validates and executes them.
 *
 * It is built against an installed loom (find_package(loom)), as a third
 * party would build it, into libloom-schedule-filldrain.so (tests/schedule
 * also builds it in the tree to check its lists). `loom schedule CONFIG
 * --set parallel.pp.schedule=/path/to/libloom-schedule-filldrain.so --svg
 * f.svg` checks and draws it without training. */
#include <loom/schedule.h>

static int emit(const loom_pipeline_shape *shape, int rank, loom_action_kind kind, int mb)
{
    loom_action a = {(uint16_t)kind, 0, mb};
    return shape->emit(shape->builder, rank, a);
}

static int filldrain_build(const loom_host *host, const loom_pipeline_shape *shape)
{
    if (shape->virtual_stages != 1)
        return host->error(host, LOOM_ERR_NOT_SUPPORTED,
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

LOOM_PLUGIN_EXPORT const loom_schedule_plugin_v1_t loom_schedule_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_SCHEDULE, loom_schedule_plugin_v1_t, "filldrain",
                                 "pipeline schedule: all forwards, then all backwards newest first",
                                 NULL),
    .build = filldrain_build,
};
