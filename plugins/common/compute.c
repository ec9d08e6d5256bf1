/* plugins/common — the model's memory through the compute service. */
#include "common/compute.h"

#include <string.h>

#include "common/reduce.h"
#include "common/strategy_common.h"

/* ---- host memory, for a core without the service ---- */

static int host_copy(const loom_host *h, void *dst, const void *src, size_t bytes)
{
    (void)h;
    if (bytes && dst != src)
        memmove(dst, src, bytes);
    return LOOM_OK;
}

static int host_zero(const loom_host *h, void *dst, size_t bytes)
{
    (void)h;
    if (bytes)
        memset(dst, 0, bytes);
    return LOOM_OK;
}

static int host_convert(const loom_host *h, void *dst, loom_dtype dst_type, const void *src,
                        loom_dtype src_type, size_t n)
{
    if (dst_type == src_type)
        return host_copy(h, dst, src, n * loom_dtype_size(dst_type));
    if (src_type == LOOM_F32) {
        loom_from_f32(dst, dst_type, src, n);
        return LOOM_OK;
    }
    for (size_t i = 0; i < n; i++)
        loom_store_f32(dst, dst_type, i, loom_load_f32(src, src_type, i));
    return LOOM_OK;
}

static int host_sum_squares(const loom_host *h, const void *x, loom_dtype dtype, size_t n,
                            double *sum)
{
    (void)h;
    *sum = strategy_add_squares(*sum, x, dtype, n);
    return LOOM_OK;
}

static int host_scale(const loom_host *h, float *x, float s, size_t n)
{
    (void)h;
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
    return LOOM_OK;
}

static int host_synchronize(const loom_host *h)
{
    (void)h;
    return LOOM_OK;
}

static int host_copy_rows(const loom_host *h, void *dst, size_t dst_pitch, const void *src,
                          size_t src_pitch, size_t row_bytes, size_t rows)
{
    for (size_t r = 0; r < rows; r++)
        host_copy(h, (char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, row_bytes);
    return LOOM_OK;
}

/* The core's accumulate: each sum rounded once to dst's type. */
static int host_accumulate(const loom_host *h, void *dst, loom_dtype dst_type, float *src,
                           size_t n)
{
    (void)h;
    if (dst_type == LOOM_F32) {
        float *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] += src[i];
    } else {
        for (size_t i = 0; i < n; i++)
            loom_store_f32(dst, dst_type, i, loom_load_f32(dst, dst_type, i) + src[i]);
    }
    if (n)
        memset(src, 0, n * sizeof *src);
    return LOOM_OK;
}

static const loom_compute_api host_compute = {
    .struct_size = sizeof(loom_compute_api),
    .tier = LOOM_TIER_HOST,
    .mem_kind = LOOM_MEM_HOST,
    .backend = "host",
    .to_device = host_copy,
    .to_host = host_copy,
    .copy = host_copy,
    .zero = host_zero,
    .convert = host_convert,
    .sum_squares = host_sum_squares,
    .scale = host_scale,
    .synchronize = host_synchronize,
    .copy_rows = host_copy_rows,
    .accumulate = host_accumulate,
};

const loom_compute_api *strategy_compute(const loom_host *h)
{
    if (h->version >= 7 && h->struct_size >= offsetof(loom_host, compute) + sizeof h->compute &&
        h->compute)
        return h->compute;
    return &host_compute;
}

/* A core's service from before a member was added ends before it. */
#define HAS_CALL(c, member)                                                              \
    (offsetof(loom_compute_api, member) + sizeof(c)->member <= (c)->struct_size &&       \
     (c)->member != NULL)

int strategy_model_on_host(const loom_host *h)
{
    return strategy_compute(h)->mem_kind == LOOM_MEM_HOST;
}

int strategy_alloc_model(const loom_host *h, loom_purpose purpose, size_t bytes, void **out)
{
    const loom_compute_api *c = strategy_compute(h);
    void *p = NULL;
    int rc = h->mem_alloc(h, (loom_tier)c->tier, purpose, bytes ? bytes : 1, &p);
    if (rc != LOOM_OK)
        return rc;
    if ((rc = c->zero(h, p, bytes)) != LOOM_OK) {
        h->mem_free(h, p);
        return rc;
    }
    *out = p;
    return LOOM_OK;
}

int strategy_upload_f32(const loom_host *h, void *dst, loom_dtype t, const float *src, size_t n)
{
    const loom_compute_api *c = strategy_compute(h);
    if (!n)
        return LOOM_OK;
    if (t == LOOM_F32)
        return c->to_device(h, dst, src, n * sizeof(float));
    if (strategy_model_on_host(h)) /* src is memory of the model's kind */
        return c->convert(h, dst, t, src, LOOM_F32, n);
    enum { CHUNK = 1 << 20 }; /* elements through the scratch buffer at a time */
    size_t chunk = n < CHUNK ? n : CHUNK;
    float *scratch = NULL;
    int rc = h->mem_alloc(h, (loom_tier)c->tier, LOOM_PURPOSE_COMM, chunk * sizeof(float),
                          (void **)&scratch);
    for (size_t i = 0; rc == LOOM_OK && i < n; i += chunk) {
        size_t k = n - i < chunk ? n - i : chunk;
        rc = c->to_device(h, scratch, src + i, k * sizeof(float));
        if (rc == LOOM_OK)
            rc = c->convert(h, (char *)dst + i * loom_dtype_size(t), t, scratch, LOOM_F32, k);
    }
    if (scratch) {
        int sync = c->synchronize(h); /* the conversions are done with it */
        h->mem_free(h, scratch);
        if (rc == LOOM_OK)
            rc = sync;
    }
    return rc;
}

int strategy_copy_rows(const loom_host *h, void *dst, size_t dst_pitch, const void *src,
                       size_t src_pitch, size_t row_bytes, size_t rows)
{
    const loom_compute_api *c = strategy_compute(h);
    if (!rows || !row_bytes)
        return LOOM_OK;
    if (rows == 1 || (dst_pitch == row_bytes && src_pitch == row_bytes))
        return c->copy(h, dst, src, rows * row_bytes);
    if (HAS_CALL(c, copy_rows))
        return c->copy_rows(h, dst, dst_pitch, src, src_pitch, row_bytes, rows);
    int rc = LOOM_OK;
    for (size_t r = 0; r < rows && rc == LOOM_OK; r++)
        rc = c->copy(h, (char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, row_bytes);
    return rc;
}

int strategy_add_spent(const loom_host *h, void *dst, void *src, size_t n, loom_dtype t)
{
    const loom_compute_api *c = strategy_compute(h);
    if (t == LOOM_F32 && HAS_CALL(c, accumulate))
        return n ? c->accumulate(h, dst, LOOM_F32, src, n) : LOOM_OK;
    return strategy_add(h, dst, src, n, t);
}

/* ---- what the service lacks, done on the host ---- */

int strategy_stage_in(const loom_host *h, const void *dev, size_t bytes, void **out, int *staged)
{
    *staged = !strategy_model_on_host(h);
    if (!*staged) {
        *out = (void *)dev;
        return LOOM_OK;
    }
    void *p = NULL;
    int rc = h->mem_alloc(h, LOOM_TIER_HOST, LOOM_PURPOSE_COMM, bytes ? bytes : 1, &p);
    if (rc == LOOM_OK && (rc = strategy_compute(h)->to_host(h, p, dev, bytes)) != LOOM_OK)
        h->mem_free(h, p);
    if (rc == LOOM_OK)
        *out = p;
    return rc;
}

int strategy_stage_out(const loom_host *h, void *dev, void *copy, size_t bytes, int staged,
                       int write_back)
{
    if (!staged)
        return LOOM_OK;
    int rc = write_back ? strategy_compute(h)->to_device(h, dev, copy, bytes) : LOOM_OK;
    h->mem_free(h, copy);
    return rc;
}

int strategy_add(const loom_host *h, void *dst, const void *src, size_t n, loom_dtype t)
{
    size_t bytes = n * loom_dtype_size(t);
    void *d = NULL, *s = NULL;
    int dst_staged = 0, src_staged = 0;
    int rc = strategy_stage_in(h, dst, bytes, &d, &dst_staged);
    if (rc != LOOM_OK)
        return rc;
    if ((rc = strategy_stage_in(h, src, bytes, &s, &src_staged)) != LOOM_OK) {
        strategy_stage_out(h, dst, d, bytes, dst_staged, 0);
        return rc;
    }
    reduce_elements(d, d, s, n, t, LOOM_SUM);
    strategy_stage_out(h, (void *)src, s, bytes, src_staged, 0);
    return strategy_stage_out(h, dst, d, bytes, dst_staged, 1);
}

