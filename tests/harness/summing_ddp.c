/* A deliberately wrong data strategy for the numerics harness: ddp that
 * sums the gradients over the dp group where it should average them. One
 * rank cannot tell; at two the gradient norm doubles at the first step. */
#include "loom/strategy.h"
#include "loom/tensor.h"

/* After the headers, so only ddp's own use of LOOM_AVG changes. */
#define LOOM_AVG LOOM_SUM
#include "../../plugins/strategy/ddp.c"
