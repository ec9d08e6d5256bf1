/* A deliberately wrong data strategy for the numerics harness: ddp that
 * sums the gradients over the dp group where it should average them. One
 * rank cannot tell; at two the gradient norm doubles at the first step. */
#include "loom/strategy.h"
#include "loom/tensor.h"

#include "../../plugins/common/reduce.h"

/* ddp asks average_begin which reduction averages its bucket: this one
 * answers "sum", untouched. */
static loom_redop sum_instead(void *buf, size_t n, loom_dtype t, int ranks)
{
    (void)buf, (void)n, (void)t, (void)ranks;
    return LOOM_SUM;
}

/* After the headers, so only ddp's own uses change. */
#define LOOM_AVG LOOM_SUM
#define average_begin sum_instead
#include "../../plugins/strategy/ddp.c"
