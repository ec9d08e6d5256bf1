/* plugins/common — reductions over host buffers, for the backends that
 * reduce on the CPU (comm-ucx's schedules, comm-mpi's bf16/f16 ops). */
#ifndef LOOM_PLUGIN_COMMON_REDUCE_H
#define LOOM_PLUGIN_COMMON_REDUCE_H

#include <stddef.h>

#include "loom/tensor.h"

/* dst[i] = a[i] op b[i] for n elements of dtype t. dst may be a or b (never
 * a partial overlap). AVG reduces as SUM: divide once where the sum is
 * final (divide_elements). bf16 and f16 combine in f32 and round back once
 * per call, so a sum over n ranks is rounded n-1 times, in the order the
 * algorithm combines. Max and min pick an input unchanged. Integer sums
 * wrap instead of overflowing. */
void reduce_elements(void *dst, const void *a, const void *b, size_t n, loom_dtype t,
                     loom_redop op);

/* buf[i] /= by for n elements: floats in their own precision (bf16 and f16
 * through f32), integers truncating toward zero as C division does. */
void divide_elements(void *buf, size_t n, loom_dtype t, int by);

/* Averages that cannot overflow. An f16 sum of every rank's gradient can
 * pass 65504 where each of them is in range (fp16 loss scaling keeps
 * gradients near the top of the range), so f16 is scaled down before the
 * sum by a power of two at least the number of ranks (exact, and the sum
 * of the scaled values is in range), summed, and then scaled by
 * prescale / ranks in f32, one rounding as an average's: divided first as
 * PyTorch's DDP does, without its extra rounding at odd rank counts.
 *
 * average_prescale: that power of two for t (1 for any other type).
 * average_begin: the reduction to post on buf (n elements of t, scaled in
 *   place): LOOM_SUM after scaling f16, else LOOM_AVG (LOOM_SUM for one
 *   rank, which needs no division).
 * average_end: on the reduced result, `prescaled` being the product of
 *   the prescales of every reduction it went through and `ranks` of their
 *   ranks; nothing for any other type. */
int average_prescale(loom_dtype t, int ranks);
loom_redop average_begin(void *buf, size_t n, loom_dtype t, int ranks);
void average_end(void *buf, size_t n, loom_dtype t, int prescaled, int ranks);

#endif
