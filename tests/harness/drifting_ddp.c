/* A data strategy that trains near the single-rank run on purpose, for
 * the harness's --tolerance: ddp whose learning rate is 5% high, declaring
 * LOOM_STRATEGY_APPROXIMATE. The loss drifts a little from the first
 * update on, at every rank count. */
#include "loom/plugin.h"
#include "loom/strategy.h"

#include "../../plugins/common/strategy_common.h"

static const loom_optimizer_step *faster(const loom_optimizer_step *step, loom_optimizer_step *copy)
{
    *copy = *step;
    copy->lr *= 1.05f;
    return copy;
}

/* After the headers, so only ddp's call of the optimizer changes; a
 * macro's own name in its expansion is not expanded again. */
#define strategy_update_store(h, step, ...)                                                        \
    strategy_update_store(h, faster(step, &(loom_optimizer_step){0}), __VA_ARGS__)

/* ddp's plugin struct under another name, with the capability: the header
 * is its first member, so what follows the braces is the struct's next
 * designated member. */
#undef LOOM_PLUGIN_HEADER
#define LOOM_PLUGIN_HEADER(kind_, struct_type, name_, description_, settings_)                    \
    {LOOM_ABI_VERSION(LOOM_ABI_MAJOR, LOOM_ABI_MINOR), (uint32_t)sizeof(struct_type),             \
     (uint32_t)(kind_), (uint32_t)sizeof(loom_setting_spec), "drifting",                          \
     "ddp with a learning rate 5% high, approximate on purpose", (settings_)},                    \
        .capabilities = LOOM_STRATEGY_APPROXIMATE
#include "../../plugins/strategy/ddp.c"
