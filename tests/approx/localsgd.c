/* A data strategy whose replicas differ on purpose, for the core's side of
 * LOOM_STRATEGY_APPROXIMATE and data_replica_state: ddp's buffers, but no
 * gradient is ever averaged, so each dp rank steps on its own batches
 * alone (local SGD that never synchronises). Its norm is its own, and its
 * master weights and Adam moments are its own state: a checkpoint keeps
 * each rank's, and data_get_state gives dp rank 0's as the shared state.
 * Built a second time with LOCALSGD_UNDECLARED: the same hooks without the
 * capability, which the core must refuse at dp > 1. */
#include <stdlib.h>

#include "loom/plugin.h"
#include "loom/strategy.h"

/* ddp's code with its export under another name: this file exports its own. */
#define loom_strategy_plugin_v1 ddp_strategy_plugin_v1
#include "../../plugins/strategy/ddp.c"
#undef loom_strategy_plugin_v1

/* ddp's hooks that read gradients wait for an average that data_grads_ready
 * starts; never called here, they read the local gradients as final. */

static int localsgd_describe(const loom_strategy *s, char *buf, size_t cap)
{
    snprintf(buf, cap, "localsgd over %d ranks, never synchronised", s->dp_size);
    return LOOM_OK;
}

static int localsgd_replica_state(loom_strategy *s, loom_unit *unit, loom_replica_buffer *buffers,
                                  int *count)
{
    int i = state_slot(s, unit, "data_replica_state");
    if (i < 0)
        return i;
    int wanted = s->dtype == LOOM_F32 ? 3 : 4;
    if (!buffers) {
        *count = wanted;
        return LOOM_OK;
    }
    if (*count < wanted)
        return s->host->error(s->host, LOOM_ERR_INVALID,
                              "localsgd: data_replica_state given room for %d buffers, not %d",
                              *count, wanted);
    opt_view st;
    float *master = NULL;
    int rc = unit_state(s, i, &st, &master);
    if (rc != LOOM_OK)
        return rc;
    size_t n = s->units[i].numel;
    buffers[0] = (loom_replica_buffer){"master", master, n * sizeof(float)};
    buffers[1] = (loom_replica_buffer){"adam m", st.m, n * sizeof(float)};
    buffers[2] = (loom_replica_buffer){"adam v", st.v, n * sizeof(float)};
    if (wanted == 4)
        buffers[3] = (loom_replica_buffer){
            "params", (char *)s->params + s->slots[i].offset * s->esize, n * s->esize};
    /* the test's mismatches: a label or a size other than the checkpoint's */
    if (getenv("LOCALSGD_RENAME"))
        buffers[1].name = "adam m (renamed)";
    if (getenv("LOCALSGD_SHORTEN"))
        buffers[2].bytes -= sizeof(float);
    *count = wanted;
    /* without memory.offload the state stays where it was acquired */
    return opt_state_release(&s->opt, i, 1);
}

LOOM_PLUGIN_EXPORT const loom_strategy_plugin_v1_t loom_strategy_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_STRATEGY, loom_strategy_plugin_v1_t, "localsgd",
                                 "test strategy: each dp rank trains its own replica, never "
                                 "averaged, its state checkpointed per rank",
                                 ddp_settings),
    .axis = LOOM_AXIS_DP,
#ifndef LOCALSGD_UNDECLARED
    .capabilities = LOOM_STRATEGY_APPROXIMATE,
#endif
    .create = ddp_create,
    .destroy = ddp_destroy,
    .describe = localsgd_describe,
    .data_setup = ddp_data_setup,
    .data_grad_norm_sq = ddp_data_grad_norm_sq,
    .data_optimizer_step = ddp_data_optimizer_step,
    .data_zero_grads = ddp_data_zero_grads,
    .data_get_state = ddp_data_get_state,
    .data_set_state = ddp_data_set_state,
    .data_replica_state = localsgd_replica_state,
};
