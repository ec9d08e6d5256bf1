/* A compute backend for the loader's compute rules and `loom plugins --check`:
 * every kernel is the built-in cpu backend's (loom_compute_setup.cpu), run
 * on memory of its own (tier device, alloc and free from the heap). Broken
 * and other variants:
 *   VARIANT_HOST        tier host, alloc and free NULL (the core's memory)
 *   VARIANT_NULLKERNEL  crossentropy_slice_sums NULL
 *   VARIANT_NOALLOC     tier device with alloc and free NULL
 *   VARIANT_BADTIER     tier 7
 *   VARIANT_BADMEMKIND  mem_kind 5
 *   VARIANT_BADMATH     gemm and layernorm_forward one off in one element
 *   VARIANT_DECLINE     probe says no device is visible */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/compute.h"

#ifndef PLUGIN_NAME
#define PLUGIN_NAME "good"
#endif

/* The cpu backend this one runs on, from create's setup. */
static const loom_compute_plugin_v1_t *cpu;

static int probe(const loom_host *host, char *why, size_t cap)
{
    (void)host;
#if defined(VARIANT_DECLINE)
    snprintf(why, cap, "no device visible (loader tests)");
    return LOOM_ERR_NOT_SUPPORTED;
#else
    (void)why, (void)cap;
    return LOOM_OK;
#endif
}

static int create(const loom_host *host, const loom_compute_setup *setup, loom_compute **out)
{
    if (!setup->cpu)
        return host->error(host, LOOM_ERR_INVALID, PLUGIN_NAME ": no cpu backend in the setup");
    cpu = setup->cpu;
    return cpu->create(host, setup, out);
}

static int describe(const loom_compute *c, char *buf, size_t cap)
{
    (void)c;
    snprintf(buf, cap, PLUGIN_NAME ": the cpu kernels (loader tests)");
    return LOOM_OK;
}

#if !defined(VARIANT_HOST) && !defined(VARIANT_NOALLOC)
static int alloc(loom_compute *c, size_t bytes, void **out)
{
    (void)c;
    void *p = NULL;
    if (posix_memalign(&p, 256, bytes ? bytes : 1))
        return LOOM_ERR_NO_MEMORY;
    memset(p, 0, bytes);
    *out = p;
    return LOOM_OK;
}

static int release(loom_compute *c, void *ptr)
{
    (void)c;
    free(ptr);
    return LOOM_OK;
}
#define ALLOC alloc
#define FREE release
#else
#define ALLOC NULL
#define FREE NULL
#endif

#define FWD(name, params, ...) \
    static int fwd_##name params { return cpu->name(__VA_ARGS__); }

FWD(destroy, (loom_compute *c), c)
FWD(to_device, (loom_compute *c, void *dst, const void *src, size_t n), c, dst, src, n)
FWD(to_host, (loom_compute *c, void *dst, const void *src, size_t n), c, dst, src, n)
FWD(copy, (loom_compute *c, void *dst, const void *src, size_t n), c, dst, src, n)
FWD(copy_rows,
    (loom_compute *c, void *dst, size_t dp, const void *src, size_t sp, size_t rb, size_t rows),
    c, dst, dp, src, sp, rb, rows)
FWD(zero, (loom_compute *c, void *dst, size_t n), c, dst, n)
FWD(synchronize, (loom_compute *c), c)
FWD(event_record, (loom_compute *c, loom_compute_event **out), c, out)
FWD(event_wait, (loom_compute *c, loom_compute_event *ev, double t), c, ev, t)
FWD(status, (loom_compute *c), c)
FWD(matmul_forward,
    (loom_compute *c, float *out, const float *inp, loom_compute_weight w, const float *bias,
     int N, int C, int OC),
    c, out, inp, w, bias, N, C, OC)
FWD(matmul_backward_input,
    (loom_compute *c, float *dinp, const float *dout, loom_compute_weight w, int N, int C,
     int OC),
    c, dinp, dout, w, N, C, OC)
FWD(matmul_backward_weight,
    (loom_compute *c, float *dw, float *db, const float *dout, const float *inp, int N, int C,
     int OC),
    c, dw, db, dout, inp, N, C, OC)
FWD(encoder_forward,
    (loom_compute *c, float *out, const int *inp, const int *pos, const float *wte,
     const float *wpe, int B, int T, int C),
    c, out, inp, pos, wte, wpe, B, T, C)
FWD(encoder_backward,
    (loom_compute *c, float *dwte, float *dwpe, const float *dout, const int *inp,
     const int *pos, int B, int T, int C),
    c, dwte, dwpe, dout, inp, pos, B, T, C)
FWD(embedding_rows_forward,
    (loom_compute *c, float *out, const int *tok, int v0, int rows, const float *wte, int N,
     int C),
    c, out, tok, v0, rows, wte, N, C)
FWD(embedding_rows_backward,
    (loom_compute *c, float *dwte, const float *dout, const int *tok, int v0, int rows, int N,
     int C),
    c, dwte, dout, tok, v0, rows, N, C)
FWD(position_forward,
    (loom_compute *c, float *x, const float *wpe, const int *pos, int R, int C), c, x, wpe, pos,
    R, C)
FWD(position_backward,
    (loom_compute *c, float *dwpe, const float *dx, const int *pos, int R, int C), c, dwpe, dx,
    pos, R, C)
FWD(residual_layernorm_forward,
    (loom_compute *c, float *res, float *out, float *mean, float *rstd, const float *a,
     const float *b, const float *w, const float *bias, int N, int C),
    c, res, out, mean, rstd, a, b, w, bias, N, C)
FWD(layernorm_backward_input,
    (loom_compute *c, float *dinp, const float *dout, const float *inp, const float *w,
     const float *mean, const float *rstd, int N, int C),
    c, dinp, dout, inp, w, mean, rstd, N, C)
FWD(layernorm_backward_weight,
    (loom_compute *c, float *dw, float *db, const float *dout, const float *inp,
     const float *mean, const float *rstd, int N, int C),
    c, dw, db, dout, inp, mean, rstd, N, C)
FWD(residual_forward, (loom_compute *c, float *out, const float *a, const float *b, size_t n),
    c, out, a, b, n)
FWD(bias_forward, (loom_compute *c, float *x, const float *bias, int rows, int C), c, x, bias,
    rows, C)
FWD(bias_backward, (loom_compute *c, float *db, const float *dout, int rows, int C), c, db,
    dout, rows, C)
FWD(bias_gelu_forward,
    (loom_compute *c, float *out, float *pre, const float *bias, int N, int C), c, out, pre,
    bias, N, C)
FWD(gelu_backward,
    (loom_compute *c, float *dinp, const float *inp, const float *dout, size_t n), c, dinp, inp,
    dout, n)
FWD(attention_forward,
    (loom_compute *c, const void *q, const int *q_pos, int tq, const void *k, const void *v,
     const int *k_pos, int tk, int B, int NH, int HS, loom_dtype dtype, void *out, float *lse,
     int first_block),
    c, q, q_pos, tq, k, v, k_pos, tk, B, NH, HS, dtype, out, lse, first_block)
FWD(attention_backward,
    (loom_compute *c, const void *q, const int *q_pos, int tq, const void *k, const void *v,
     const int *k_pos, int tk, int B, int NH, int HS, loom_dtype dtype, const void *out,
     const void *dout, const float *lse, void *dq, void *dk, void *dv),
    c, q, q_pos, tq, k, v, k_pos, tk, B, NH, HS, dtype, out, dout, lse, dq, dk, dv)
FWD(crossentropy_forward,
    (loom_compute *c, float *losses, float *lse, const float *logits, const int *targets, int N,
     int V, int Vp),
    c, losses, lse, logits, targets, N, V, Vp)
FWD(crossentropy_backward,
    (loom_compute *c, float *logits, const float *dlosses, const float *lse, const int *targets,
     int N, int V, int Vp),
    c, logits, dlosses, lse, targets, N, V, Vp)
FWD(crossentropy_slice_max,
    (loom_compute *c, float *max, const float *logits, int N, int width, int real), c, max,
    logits, N, width, real)
#if !defined(VARIANT_NULLKERNEL)
FWD(crossentropy_slice_sums,
    (loom_compute *c, float *sum, float *target, const float *logits, const float *max,
     const int *targets, int v0, int N, int width, int real),
    c, sum, target, logits, max, targets, v0, N, width, real)
#define SLICE_SUMS fwd_crossentropy_slice_sums
#else
#define SLICE_SUMS NULL
#endif
FWD(crossentropy_slice_finish,
    (loom_compute *c, float *lse, float *losses, const float *max, const float *sum,
     const float *target, int N),
    c, lse, losses, max, sum, target, N)
FWD(crossentropy_slice_backward,
    (loom_compute *c, float *logits, const float *dlosses, const float *lse, const int *targets,
     int v0, int N, int width, int real),
    c, logits, dlosses, lse, targets, v0, N, width, real)
FWD(mean, (loom_compute *c, const float *x, size_t n, float *mean), c, x, n, mean)
FWD(adamw,
    (loom_compute *c, const loom_compute_adamw *step, float *master, const void *grad,
     loom_dtype grad_dtype, float *m, float *v, size_t n, void *params, loom_dtype params_dtype),
    c, step, master, grad, grad_dtype, m, v, n, params, params_dtype)
FWD(sum_squares, (loom_compute *c, const void *x, loom_dtype dtype, size_t n, double *sum), c, x,
    dtype, n, sum)
FWD(count_nonfinite,
    (loom_compute *c, const void *x, loom_dtype dtype, size_t n, size_t *count), c, x, dtype, n,
    count)
FWD(scale, (loom_compute *c, float *x, float s, size_t n), c, x, s, n)
FWD(convert,
    (loom_compute *c, void *dst, loom_dtype dst_type, const void *src, loom_dtype src_type,
     size_t n),
    c, dst, dst_type, src, src_type, n)
FWD(accumulate, (loom_compute *c, void *dst, loom_dtype dst_type, float *src, size_t n), c, dst,
    dst_type, src, n)

static void event_free(loom_compute *c, loom_compute_event *ev) { cpu->event_free(c, ev); }

static loom_dtype multiply_dtype(loom_compute *c, loom_dtype precision)
{
    return cpu->multiply_dtype(c, precision);
}

/* The wrong-answer variant is off by one in the first element it writes,
 * which is this backend's own memory, the host's. */
static int gemm(loom_compute *c, float *out, int ldc, int M, int N, int K, loom_compute_operand a,
                loom_compute_operand b, float alpha, float beta, loom_dtype multiply, int batch,
                size_t stride_a, size_t stride_b, size_t stride_out)
{
    int rc = cpu->gemm(c, out, ldc, M, N, K, a, b, alpha, beta, multiply, batch, stride_a,
                       stride_b, stride_out);
#if defined(VARIANT_BADMATH)
    out[0] += 1.0f;
#endif
    return rc;
}

static int layernorm_forward(loom_compute *c, float *out, float *mean, float *rstd,
                             const float *inp, const float *weight, const float *bias, int N,
                             int C)
{
    int rc = cpu->layernorm_forward(c, out, mean, rstd, inp, weight, bias, N, C);
#if defined(VARIANT_BADMATH)
    out[1] += 1.0f;
#endif
    return rc;
}

#if defined(VARIANT_HOST)
#define TIER LOOM_TIER_HOST
#define MEM_KIND LOOM_MEM_HOST
#define MEMORY "the core's host memory"
#elif defined(VARIANT_BADTIER)
#define TIER 7
#define MEM_KIND LOOM_MEM_DEVICE
#elif defined(VARIANT_BADMEMKIND)
#define TIER LOOM_TIER_DEVICE
#define MEM_KIND 5
#else
#define TIER LOOM_TIER_DEVICE
#define MEM_KIND LOOM_MEM_DEVICE
#endif
#ifndef MEMORY
#define MEMORY "memory of its own"
#endif

/* One setting, in compute.<name>, for the config's compute group. */
static const loom_setting_spec settings[] = {
    {.name = "queue_depth", .type = LOOM_SETTING_INT, .default_value = "2",
     .help = "kernels in flight (loader tests)", .bounds = LOOM_SETTING_MIN | LOOM_SETTING_MAX,
     .min = 1, .max = 64},
    {0},
};

LOOM_PLUGIN_EXPORT const loom_compute_plugin_v1_t loom_compute_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_COMPUTE, loom_compute_plugin_v1_t, PLUGIN_NAME,
                                 "the cpu kernels on " MEMORY " (loader tests)", settings),
    .tier = TIER,
    .mem_kind = MEM_KIND,
    .probe = probe,
    .create = create,
    .destroy = fwd_destroy,
    .describe = describe,
    .alloc = ALLOC,
    .free = FREE,
    .to_device = fwd_to_device,
    .to_host = fwd_to_host,
    .copy = fwd_copy,
    .copy_rows = fwd_copy_rows,
    .zero = fwd_zero,
    .synchronize = fwd_synchronize,
    .event_record = fwd_event_record,
    .event_wait = fwd_event_wait,
    .event_free = event_free,
    .status = fwd_status,
    .gemm = gemm,
    .multiply_dtype = multiply_dtype,
    .matmul_forward = fwd_matmul_forward,
    .matmul_backward_input = fwd_matmul_backward_input,
    .matmul_backward_weight = fwd_matmul_backward_weight,
    .encoder_forward = fwd_encoder_forward,
    .encoder_backward = fwd_encoder_backward,
    .embedding_rows_forward = fwd_embedding_rows_forward,
    .embedding_rows_backward = fwd_embedding_rows_backward,
    .position_forward = fwd_position_forward,
    .position_backward = fwd_position_backward,
    .layernorm_forward = layernorm_forward,
    .residual_layernorm_forward = fwd_residual_layernorm_forward,
    .layernorm_backward_input = fwd_layernorm_backward_input,
    .layernorm_backward_weight = fwd_layernorm_backward_weight,
    .residual_forward = fwd_residual_forward,
    .bias_forward = fwd_bias_forward,
    .bias_backward = fwd_bias_backward,
    .bias_gelu_forward = fwd_bias_gelu_forward,
    .gelu_backward = fwd_gelu_backward,
    .attention_forward = fwd_attention_forward,
    .attention_backward = fwd_attention_backward,
    .crossentropy_forward = fwd_crossentropy_forward,
    .crossentropy_backward = fwd_crossentropy_backward,
    .crossentropy_slice_max = fwd_crossentropy_slice_max,
    .crossentropy_slice_sums = SLICE_SUMS,
    .crossentropy_slice_finish = fwd_crossentropy_slice_finish,
    .crossentropy_slice_backward = fwd_crossentropy_slice_backward,
    .mean = fwd_mean,
    .adamw = fwd_adamw,
    .sum_squares = fwd_sum_squares,
    .count_nonfinite = fwd_count_nonfinite,
    .scale = fwd_scale,
    .convert = fwd_convert,
    .accumulate = fwd_accumulate,
};
