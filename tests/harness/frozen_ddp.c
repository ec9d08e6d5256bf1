/* A deliberately wrong data strategy for the numerics harness: ddp with an
 * off-by-one in its optimizer step, which leaves the last element of every
 * unit untrained. The losses hardly notice; the final weights do. */
#include "loom/strategy.h"

/* After the headers, so only ddp's call of the optimizer changes; a
 * macro's own name in its expansion is not expanded again. */
#define update_range(step, unit, offset, params, grads, dtype, m, v, n)                           \
    update_range(step, unit, offset, params, grads, dtype, m, v, (n) - 1)
#define update_range_store(step, unit, offset, master, grads, dtype, m, v, n, params, pdtype)     \
    update_range_store(step, unit, offset, master, grads, dtype, m, v, (n) - 1, params, pdtype)
#include "../../plugins/strategy/ddp.c"
