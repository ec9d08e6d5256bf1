/* ddp as a core before host version 7 sees it: no host->compute, so it
 * keeps the model in host memory (plugins/common/compute.c's fallback) —
 * and claims the current ABI. With model.device = "sim" the trainer must
 * refuse it after data_setup, before any kernel reads host memory as the
 * device's (compute.sim.train.refusals). */
#include "loom/plugin.h"
#undef LOOM_PLUGIN_EXPORT
#define LOOM_PLUGIN_EXPORT static
#define loom_strategy_plugin_v1 ddp_as_built
#include "../../plugins/strategy/ddp.c"
#undef loom_strategy_plugin_v1

/* The host table is the core's own (it finds its slot from the pointer),
 * so it is changed in place: this plugin's instance alone uses it. */
static int create_on_older_host(const loom_host *host, const loom_strategy_setup *setup,
                                loom_strategy **out)
{
    loom_host *older = (loom_host *)(uintptr_t)host;
    older->version = 6;
    older->compute = NULL;
    return ddp_create(host, setup, out);
}

__attribute__((visibility("default"))) const loom_strategy_plugin_v1_t loom_strategy_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_STRATEGY, loom_strategy_plugin_v1_t, "ddp",
                                 "ddp keeping the model in host memory (a test of the trainer)",
                                 ddp_settings),
    .axis = LOOM_AXIS_DP,
    .create = create_on_older_host,
    .destroy = ddp_destroy,
    .describe = ddp_describe,
    .data_setup = ddp_data_setup,
    .data_before_backward = ddp_data_before_backward,
    .data_grads_ready = ddp_data_grads_ready,
    .data_finish_backward = ddp_data_finish_backward,
    .data_grad_norm_sq = ddp_data_grad_norm_sq,
    .data_optimizer_step = ddp_data_optimizer_step,
    .data_zero_grads = ddp_data_zero_grads,
    .data_get_state = ddp_data_get_state,
    .data_set_state = ddp_data_set_state,
};
