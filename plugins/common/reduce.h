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

/* The reduction that averages buf (n elements of t, in place) over `ranks`
 * ranks without overflowing. An f16 sum of every rank's gradient can pass
 * 65504 where each of them is in range (fp16 loss scaling keeps gradients
 * near the top of the range), so f16 is divided first and then summed, as
 * NCCL's average does: returns LOOM_SUM after dividing. Any other type
 * returns LOOM_AVG with buf untouched. */
loom_redop average_in_range(void *buf, size_t n, loom_dtype t, int ranks);

#endif
