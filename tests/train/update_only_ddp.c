/* ddp stepping through loom_optimizer_step.update alone, which cannot tell
 * a unit's tensors apart, as a strategy built before ABI 1.6 does: with
 * OLD_ABI its header says 1.5 and the core refuses train.decay =
 * "matrices" at set-up; without, it claims 1.6 and the core refuses the
 * first step that comes through update. */
#include "loom/plugin.h"
#ifdef OLD_ABI
#undef LOOM_ABI_MINOR
#define LOOM_ABI_MINOR 5
#endif
#include "loom/strategy.h"

/* After the headers, so only ddp's call of the optimizer changes. */
#define update_range(step, unit, offset, params, grads, dtype, m, v, n)                           \
    update(step, params, grads, dtype, m, v, n)
#include "../../plugins/strategy/ddp.c"
