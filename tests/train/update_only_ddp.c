/* ddp stepping through loom_optimizer_step.update alone, which cannot tell
 * a unit's tensors apart, as a strategy built before ABI 1.6 does: with
 * OLD_ABI its header says 1.5 and the core refuses train.decay =
 * "matrices" at set-up; without, it claims the current ABI and the core
 * refuses the first step that comes through update. */
#include "loom/plugin.h"
#ifdef OLD_ABI
#undef LOOM_ABI_MINOR
#define LOOM_ABI_MINOR 5
#endif
#include "common/strategy_common.h"
#include "loom/strategy.h"

/* ddp's optimizer step, through update and nothing newer */
static void update_only_store(const loom_host *h, const loom_optimizer_step *step,
                              const loom_unit *unit, size_t offset, float *master,
                              const void *grad, float *m, float *v, size_t n, void *params,
                              loom_dtype dtype)
{
    (void)h;
    (void)unit;
    (void)offset;
    if (n)
        step->update(step, master, grad, dtype, m, v, n);
    loom_from_f32(params, dtype, master, n);
}
#define strategy_update_store update_only_store
#include "../../plugins/strategy/ddp.c"
