/* compute-cuda's kernels: the launchers the plugin's host side
 * (compute_cuda.c) calls for each op of the compute ABI. C on one side
 * (gcc), CUDA C++ on the other (nvcc), so nothing of loom's headers is
 * included here: dtypes are cuda_dtype, errors are cudaError_t.
 *
 * Every launcher enqueues on ctx->stream and returns the launch's error
 * (cudaGetLastError), cudaSuccess for an empty size without launching
 * anything. Semantics are those of the same-named op in
 * loom/compute.h (llm.c's train_gpt2 conventions: N = B*T rows, row-major
 * (N, C) activations, backward kernels ACCUMULATE into gradients). The
 * launchers that return a value to the host (mean, sum_squares,
 * count_nonfinite) reduce on the device into ctx->scratch, copy the result
 * into ctx->host_scratch (pinned) and synchronize the stream. */
#ifndef LOOM_CUDA_KERNELS_H
#define LOOM_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cuda_dtype { CUDA_DTYPE_F32 = 0, CUDA_DTYPE_BF16 = 1, CUDA_DTYPE_F16 = 2 } cuda_dtype;

/* What the launchers share: the backend's one queue and its scratch. */
typedef struct cuda_ctx {
    cudaStream_t stream;
    void *scratch;        /* device memory, scratch_bytes (>= 1 MiB), for partial reductions */
    size_t scratch_bytes;
    void *host_scratch;   /* pinned host memory, 4096 bytes, for results read back */
    int sm_count;         /* multiprocessors of the device */
    int deterministic;    /* 1: no floating-point atomics, fixed reduction order */
} cuda_ctx;

/* ---- the embedding ---- */
cudaError_t cuda_encoder_forward(const cuda_ctx *x, float *out, const int *inp, const int *pos,
                                 const float *wte, const float *wpe, int B, int T, int C);
cudaError_t cuda_encoder_backward(const cuda_ctx *x, float *dwte, float *dwpe, const float *dout,
                                  const int *inp, const int *pos, int B, int T, int C);
cudaError_t cuda_embedding_rows_forward(const cuda_ctx *x, float *out, const int *tok, int v0,
                                        int rows, const float *wte, int N, int C);
cudaError_t cuda_embedding_rows_backward(const cuda_ctx *x, float *dwte, const float *dout,
                                         const int *tok, int v0, int rows, int N, int C);
cudaError_t cuda_position_forward(const cuda_ctx *x, float *xs, const float *wpe, const int *pos,
                                  int R, int C);
cudaError_t cuda_position_backward(const cuda_ctx *x, float *dwpe, const float *dx,
                                   const int *pos, int R, int C);

/* ---- LayerNorm, residual, bias, GELU ---- */
cudaError_t cuda_layernorm_forward(const cuda_ctx *x, float *out, float *mean, float *rstd,
                                   const float *inp, const float *weight, const float *bias, int N,
                                   int C);
cudaError_t cuda_residual_layernorm_forward(const cuda_ctx *x, float *res, float *out, float *mean,
                                            float *rstd, const float *a, const float *b,
                                            const float *weight, const float *bias, int N, int C);
cudaError_t cuda_layernorm_backward_input(const cuda_ctx *x, float *dinp, const float *dout,
                                          const float *inp, const float *weight, const float *mean,
                                          const float *rstd, int N, int C);
cudaError_t cuda_layernorm_backward_weight(const cuda_ctx *x, float *dweight, float *dbias,
                                           const float *dout, const float *inp, const float *mean,
                                           const float *rstd, int N, int C);
cudaError_t cuda_residual_forward(const cuda_ctx *x, float *out, const float *a, const float *b,
                                  size_t n);
cudaError_t cuda_bias_forward(const cuda_ctx *x, float *xs, const float *bias, int rows, int C);
cudaError_t cuda_bias_backward(const cuda_ctx *x, float *dbias, const float *dout, int rows,
                               int C);
cudaError_t cuda_bias_gelu_forward(const cuda_ctx *x, float *out, float *pre, const float *bias,
                                   int N, int C);
cudaError_t cuda_gelu_backward(const cuda_ctx *x, float *dinp, const float *inp,
                               const float *dout, size_t n);

/* ---- attention (flash-style: no (T, T) tensor; backward from lse) ---- */
cudaError_t cuda_attention_forward(const cuda_ctx *x, const void *q, const int *q_pos, int tq,
                                   const void *k, const void *v, const int *k_pos, int tk, int B,
                                   int NH, int HS, cuda_dtype dtype, void *out, float *lse,
                                   int first_block);
cudaError_t cuda_attention_backward(const cuda_ctx *x, const void *q, const int *q_pos, int tq,
                                    const void *k, const void *v, const int *k_pos, int tk, int B,
                                    int NH, int HS, cuda_dtype dtype, const void *out,
                                    const void *dout, const float *lse, void *dq, void *dk,
                                    void *dv);

/* ---- the loss ---- */
cudaError_t cuda_crossentropy_forward(const cuda_ctx *x, float *losses, float *lse,
                                      const float *logits, const int *targets, int N, int V,
                                      int Vp);
cudaError_t cuda_crossentropy_backward(const cuda_ctx *x, float *logits, const float *dlosses,
                                       const float *lse, const int *targets, int N, int V, int Vp);
cudaError_t cuda_crossentropy_slice_max(const cuda_ctx *x, float *max, const float *logits, int N,
                                        int width, int real);
cudaError_t cuda_crossentropy_slice_sums(const cuda_ctx *x, float *sum, float *target,
                                         const float *logits, const float *max,
                                         const int *targets, int v0, int N, int width, int real);
cudaError_t cuda_crossentropy_slice_finish(const cuda_ctx *x, float *lse, float *losses,
                                           const float *max, const float *sum,
                                           const float *target, int N);
cudaError_t cuda_crossentropy_slice_backward(const cuda_ctx *x, float *logits,
                                             const float *dlosses, const float *lse,
                                             const int *targets, int v0, int N, int width,
                                             int real);
/* *mean (host) = the mean of n values of x */
cudaError_t cuda_mean(const cuda_ctx *x, const float *xs, size_t n, float *mean);

/* ---- the optimizer, the norm, conversions ---- */
typedef struct cuda_adamw {
    int64_t step; /* 1-based */
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
} cuda_adamw;
cudaError_t cuda_adamw_update(const cuda_ctx *x, const cuda_adamw *step, float *master,
                              const void *grad, cuda_dtype grad_dtype, float *m, float *v, size_t n,
                              void *params, cuda_dtype params_dtype);
/* *sum (host) += the sum of squares of n elements, accumulated in double */
cudaError_t cuda_sum_squares(const cuda_ctx *x, const void *xs, cuda_dtype dtype, size_t n,
                             double *sum);
cudaError_t cuda_count_nonfinite(const cuda_ctx *x, const void *xs, cuda_dtype dtype, size_t n,
                                 size_t *count);
cudaError_t cuda_scale(const cuda_ctx *x, float *xs, float s, size_t n);
cudaError_t cuda_convert(const cuda_ctx *x, void *dst, cuda_dtype dst_type, const void *src,
                         cuda_dtype src_type, size_t n);
cudaError_t cuda_accumulate(const cuda_ctx *x, void *dst, cuda_dtype dst_type, float *src,
                            size_t n);

#ifdef __cplusplus
}
#endif
#endif
