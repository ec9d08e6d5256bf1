/* plugins/common — the model's memory as a strategy reaches it: through
 * the core's compute service (loom/compute.h, host version 7), the only
 * way to read or write a buffer that may live on a device. */
#ifndef LOOM_PLUGIN_COMMON_COMPUTE_H
#define LOOM_PLUGIN_COMMON_COMPUTE_H

#include <stddef.h>

#include "common/reduce.h"
#include "loom/compute.h"
#include "loom/plugin.h"

/* The run's compute service: the core's, or on a core older than host
 * version 7 (which has none) one over host memory that does what the
 * strategies did before, in LOOM_TIER_HOST. */
const loom_compute_api *strategy_compute(const loom_host *h);

/* Whether the model's buffers are host memory the host may address. */
int strategy_model_on_host(const loom_host *h);

/* A zeroed buffer of the model's memory (the compute service's tier),
 * accounted under purpose; *out is set only on success. A byte is asked
 * for even when bytes is 0, so an empty unit still has an address. */
int strategy_alloc_model(const loom_host *h, loom_purpose purpose, size_t bytes, void **out);

/* n fp32 values of host memory into the model's buffer dst of dtype t:
 * copied over, or converted there (through a bounded scratch buffer of the
 * model's memory when that is a device's). */
int strategy_upload_f32(const loom_host *h, void *dst, loom_dtype t, const float *src, size_t n);

/* rows rows of row_bytes each, at pitch src_pitch from src to pitch
 * dst_pitch at dst (a strided view packed or unpacked): one copy where the
 * rows are contiguous, else one copy_rows, or on a core whose service
 * predates copy_rows a copy per row. */
int strategy_copy_rows(const loom_host *h, void *dst, size_t dst_pitch, const void *src,
                       size_t src_pitch, size_t row_bytes, size_t rows);

/* dst += src, n elements of t, where src is scratch of the model's memory
 * the caller is done with (it may be left zeroed): for f32 the service's
 * accumulate, where the memory is, else strategy_add. The same bits
 * either way: each element's sum is one f32 addition. */
int strategy_add_spent(const loom_host *h, void *dst, void *src, size_t n, loom_dtype t);

/* The service adds only f32 addends, consuming them (accumulate), and has
 * no f16 average, so these run on the host: in place where the buffers are
 * host memory, else on a copy brought over with to_host and sent back with
 * to_device (accounted host memory, freed on return). */

/* dst += src, n elements of t, rounded as reduce_elements sums; src is
 * left as it was. */
int strategy_add(const loom_host *h, void *dst, const void *src, size_t n, loom_dtype t);

/* A host view of bytes of the model's memory at dev: dev itself where
 * that is host memory, else a copy (*staged 1) in accounted host memory.
 * stage_out gives it back, writing it to dev first when write_back. */
int strategy_stage_in(const loom_host *h, const void *dev, size_t bytes, void **out, int *staged);
int strategy_stage_out(const loom_host *h, void *dev, void *copy, size_t bytes, int staged,
                       int write_back);

/* common/reduce.h's average_begin and average_end on the model's memory;
 * *op: the reduction to post. Inline, so a test build that redefines
 * average_begin around a strategy's source changes these too. */
static inline int strategy_average_begin(const loom_host *h, void *buf, size_t n, loom_dtype t,
                                         int ranks, loom_redop *op)
{
    if (average_prescale(t, ranks) == 1) { /* the buffer is left alone */
        *op = average_begin(buf, n, t, ranks);
        return LOOM_OK;
    }
    size_t bytes = n * loom_dtype_size(t);
    void *p = NULL;
    int staged = 0;
    int rc = strategy_stage_in(h, buf, bytes, &p, &staged);
    if (rc != LOOM_OK)
        return rc;
    *op = average_begin(p, n, t, ranks);
    return strategy_stage_out(h, buf, p, bytes, staged, 1);
}

static inline int strategy_average_end(const loom_host *h, void *buf, size_t n, loom_dtype t,
                                       int prescaled, int ranks)
{
    if (t != LOOM_F16 || prescaled == 1)
        return LOOM_OK; /* average_end leaves the buffer alone */
    size_t bytes = n * loom_dtype_size(t);
    void *p = NULL;
    int staged = 0;
    int rc = strategy_stage_in(h, buf, bytes, &p, &staged);
    if (rc != LOOM_OK)
        return rc;
    average_end(p, n, t, prescaled, ranks);
    return strategy_stage_out(h, buf, p, bytes, staged, 1);
}

#endif
