/* loom — the compute-backend ABI (docs/architecture.md, docs/plugin-guide.md).
 *
 * A compute backend runs the model's math where its memory lives: it
 * allocates the buffers, orders work on its own queue, copies between host
 * memory and its own, and provides every kernel of a GPT-2 training step —
 * the matrix products (f32, and bf16 in with f32 accumulation), the
 * element-wise and row kernels, flash-style attention, the fused softmax and
 * cross-entropy and AdamW with master weights. The CPU kernels are the
 * built-in backend "cpu"; a plugin file libloom-compute-<name>.so exports
 * `const loom_compute_plugin_v1_t loom_compute_plugin_v1` and is chosen with
 * model.device = "<name>".
 *
 * Every kernel is REQUIRED: the loader refuses a backend that leaves one
 * NULL, naming it, so a missing kernel is a refusal at load and never a
 * silent fallback to the CPU. Kernels run in the order they are issued on
 * the backend's one queue; a host pointer argument (marked "host") may be
 * reused as soon as the call returns; every other pointer is the backend's
 * memory, which only the backend's calls may read or write.
 *
 * Conventions of the kernels (those of llm.c's train_gpt2): N = B*T rows;
 * activations row-major (N, C); backward kernels ACCUMULATE (+=) into every
 * gradient they write, so callers zero them first (the fused softmax and
 * cross-entropy's backward alone writes over its input). An error a kernel
 * meets after it was issued (an asynchronous failure, a product the library
 * refused) is kept until status() reports it. */
#ifndef LOOM_COMPUTE_H
#define LOOM_COMPUTE_H

#include "loom/plugin.h"

typedef struct loom_compute loom_compute;             /* a backend's instance */
typedef struct loom_compute_event loom_compute_event; /* a point in its queue */

/* What the core tells a backend at create; valid during create only. */
typedef struct loom_compute_setup {
    uint32_t struct_size;
    int device;           /* the device of this machine to use: the local rank's */
    int threads;          /* CPU threads the backend may use (train.threads) */
    loom_dtype precision; /* the run's storage dtype: f32, bf16 or f16 */
    int deterministic;    /* 1: results identical run to run (fixed reduction order) */
    /* The built-in cpu backend, for a backend that wraps it or runs some of
     * its work on the host (its instances are created with the same setup). */
    const struct loom_compute_plugin_v1_t *cpu;
} loom_compute_setup;

/* One operand of a matrix product: element (r, c) of the matrix it stands
 * for is data[r * ld + c], or data[c * ld + r] when transposed; dtype f32
 * or bf16. */
typedef struct loom_compute_operand {
    const void *data;
    loom_dtype dtype;
    int ld;
    int transposed;
} loom_compute_operand;

/* A product's weight: f32, or the stored bf16 parameters themselves in a
 * bf16 run whose products multiply in bf16. */
typedef struct loom_compute_weight {
    const void *data;
    loom_dtype dtype;
} loom_compute_weight;

/* One AdamW step's constants (llm.c's update, with bias correction). */
typedef struct loom_compute_adamw {
    int64_t step; /* 1-based */
    float lr, beta1, beta2, eps;
    float weight_decay; /* for these elements: 0 where they do not decay */
    float grad_scale;   /* gradients are multiplied by this first */
} loom_compute_adamw;

typedef struct loom_compute_plugin_v1_t {
    loom_plugin_header header; /* kind = LOOM_PLUGIN_COMPUTE */
    uint32_t tier;             /* the loom_tier its memory is accounted in */
    uint32_t mem_kind;         /* the loom_mem_kind of its buffers, as communicators see them */

    /* ---- lifetime ---- */

    /* OPTIONAL. LOOM_OK when the backend can run here (a device visible,
     * its libraries loaded); otherwise a status and one line in why that
     * says what is missing, which model.device = "auto" prints. NULL:
     * always. */
    int (*probe)(const loom_host *host, char *why, size_t cap);
    int (*create)(const loom_host *host, const loom_compute_setup *setup, loom_compute **out);
    int (*destroy)(loom_compute *c);
    /* One line for the progress header: "cuda: NVIDIA H200 (sm_90), cuBLASLt 13.0". */
    int (*describe)(const loom_compute *c, char *buf, size_t cap);

    /* ---- memory ---- */

    /* bytes of the backend's memory, aligned to 256 and zeroed; the core
     * accounts them in tier. A backend whose tier is LOOM_TIER_HOST may
     * leave alloc and free NULL: the core then gives it accounted host
     * memory. */
    int (*alloc)(loom_compute *c, size_t bytes, void **out);
    int (*free)(loom_compute *c, void *ptr);
    /* Copies: to_device from host memory (host src reusable on return),
     * to_host into host memory (the bytes are there on return), copy within
     * the backend's memory (ordered on the queue), copy_rows of rows rows of
     * row_bytes each between pitched layouts of the backend's memory. */
    int (*to_device)(loom_compute *c, void *dst, const void *src, size_t bytes);
    int (*to_host)(loom_compute *c, void *dst, const void *src, size_t bytes);
    int (*copy)(loom_compute *c, void *dst, const void *src, size_t bytes);
    int (*copy_rows)(loom_compute *c, void *dst, size_t dst_pitch, const void *src,
                     size_t src_pitch, size_t row_bytes, size_t rows);
    int (*zero)(loom_compute *c, void *dst, size_t bytes);

    /* ---- the queue ---- */

    /* Everything issued so far is done (and its errors reported). */
    int (*synchronize)(loom_compute *c);
    /* A point after everything issued so far; wait blocks the host until
     * it is passed, at most timeout_s (LOOM_ERR_TIMEOUT); free releases it. */
    int (*event_record)(loom_compute *c, loom_compute_event **out);
    int (*event_wait)(loom_compute *c, loom_compute_event *ev, double timeout_s);
    void (*event_free)(loom_compute *c, loom_compute_event *ev);
    /* The first failure since the last call (LOOM_OK: none), its detail
     * recorded through host->error. */
    int (*status)(loom_compute *c);

    /* ---- matrix products ---- */

    /* c (M, N; row stride ldc) = alpha * a (M, K) * b (K, N) + beta * c,
     * beta 0 or 1, multiplied in multiply (f32, or bf16: f32 operands are
     * rounded to bf16 on the way in). batch > 1: batch products, operand i
     * at data + i * stride (elements) of each. */
    int (*gemm)(loom_compute *c, float *out, int ldc, int M, int N, int K,
                loom_compute_operand a, loom_compute_operand b, float alpha, float beta,
                loom_dtype multiply, int batch, size_t stride_a, size_t stride_b,
                size_t stride_out);
    /* The dtype a run of precision multiplies in on this backend: bf16 for
     * bf16 runs where the hardware multiplies bf16, else f32. */
    loom_dtype (*multiply_dtype)(loom_compute *c, loom_dtype precision);
    /* out (N, OC) = inp (N, C) * weight (OC, C)^T + bias (OC; may be NULL) */
    int (*matmul_forward)(loom_compute *c, float *out, const float *inp,
                          loom_compute_weight weight, const float *bias, int N, int C, int OC);
    /* dinp += dout * weight */
    int (*matmul_backward_input)(loom_compute *c, float *dinp, const float *dout,
                                 loom_compute_weight weight, int N, int C, int OC);
    /* dweight += dout^T * inp; dbias (may be NULL) += column sums of dout */
    int (*matmul_backward_weight)(loom_compute *c, float *dweight, float *dbias,
                                  const float *dout, const float *inp, int N, int C, int OC);

    /* ---- the embedding ---- */

    /* out[b,t,:] = wte[inp[b,t],:] + wpe[pos[t],:]; pos NULL: pos[t] = t.
     * inp and pos are the backend's memory. */
    int (*encoder_forward)(loom_compute *c, float *out, const int *inp, const int *pos,
                           const float *wte, const float *wpe, int B, int T, int C);
    int (*encoder_backward)(loom_compute *c, float *dwte, float *dwpe, const float *dout,
                            const int *inp, const int *pos, int B, int T, int C);
    /* A vocabulary slice's rows, for a tensor axis: out[n,:] = wte[tok[n] -
     * v0,:] when that row is one of the slice's rows rows, else 0; backward
     * adds dout's rows back into those of dwte. */
    int (*embedding_rows_forward)(loom_compute *c, float *out, const int *tok, int v0, int rows,
                                  const float *wte, int N, int C);
    int (*embedding_rows_backward)(loom_compute *c, float *dwte, const float *dout,
                                   const int *tok, int v0, int rows, int N, int C);
    /* x[r,:] += wpe[pos[r],:] for R rows; backward: dwpe[pos[r],:] += dx[r,:] */
    int (*position_forward)(loom_compute *c, float *x, const float *wpe, const int *pos, int R,
                            int C);
    int (*position_backward)(loom_compute *c, float *dwpe, const float *dx, const int *pos,
                             int R, int C);

    /* ---- LayerNorm, residual, bias, GELU ---- */

    /* eps 1e-5; mean and rstd (N) saved for backward */
    int (*layernorm_forward)(loom_compute *c, float *out, float *mean, float *rstd,
                             const float *inp, const float *weight, const float *bias, int N,
                             int C);
    /* res = a + b, then out = layernorm(res), the same bits as the two apart */
    int (*residual_layernorm_forward)(loom_compute *c, float *res, float *out, float *mean,
                                      float *rstd, const float *a, const float *b,
                                      const float *weight, const float *bias, int N, int C);
    int (*layernorm_backward_input)(loom_compute *c, float *dinp, const float *dout,
                                    const float *inp, const float *weight, const float *mean,
                                    const float *rstd, int N, int C);
    int (*layernorm_backward_weight)(loom_compute *c, float *dweight, float *dbias,
                                     const float *dout, const float *inp, const float *mean,
                                     const float *rstd, int N, int C);
    int (*residual_forward)(loom_compute *c, float *out, const float *a, const float *b, size_t n);
    /* x (rows, C) += bias per row; dbias += column sums of dout (rows, C) */
    int (*bias_forward)(loom_compute *c, float *x, const float *bias, int rows, int C);
    int (*bias_backward)(loom_compute *c, float *dbias, const float *dout, int rows, int C);
    /* pre (N, C) += bias, then out = gelu(pre) (tanh approximation) */
    int (*bias_gelu_forward)(loom_compute *c, float *out, float *pre, const float *bias, int N,
                             int C);
    int (*gelu_backward)(loom_compute *c, float *dinp, const float *inp, const float *dout,
                         size_t n);

    /* ---- attention ---- */

    /* Causal attention on blocks with an online softmax (loom/strategy.h's
     * loom_attention_kernels): q, k, v, out (B, T, NH, HS); lse (B, NH, tq);
     * scale 1/sqrt(HS); key j is visible to query i when k_pos[j] <=
     * q_pos[i] (positions in the backend's memory). first_block 1
     * overwrites out and lse, 0 merges the block into them. Backward
     * accumulates dq, dk and dv from the final out and lse. dtype: f32,
     * bf16 or f16 buffers. */
    int (*attention_forward)(loom_compute *c, const void *q, const int *q_pos, int tq,
                             const void *k, const void *v, const int *k_pos, int tk, int B,
                             int NH, int HS, loom_dtype dtype, void *out, float *lse,
                             int first_block);
    int (*attention_backward)(loom_compute *c, const void *q, const int *q_pos, int tq,
                              const void *k, const void *v, const int *k_pos, int tk, int B,
                              int NH, int HS, loom_dtype dtype, const void *out,
                              const void *dout, const float *lse, void *dq, void *dk, void *dv);

    /* ---- the loss ---- */

    /* Softmax and cross-entropy fused over the first V of Vp logits per
     * row: each row's loss and log-sum-exp. Backward writes (softmax -
     * one-hot) * dlosses over the logits, 0 in the padding. */
    int (*crossentropy_forward)(loom_compute *c, float *losses, float *lse, const float *logits,
                                const int *targets, int N, int V, int Vp);
    int (*crossentropy_backward)(loom_compute *c, float *logits, const float *dlosses,
                                 const float *lse, const int *targets, int N, int V, int Vp);
    /* The vocabulary-parallel loss, each rank holding columns [v0, v0 +
     * width) of the logits, of which the first real are tokens: stats
     * writes each row's max over them (max[N]); after the max is reduced
     * over the tensor group, sums writes sum[n] = sum of exp(x - max) and
     * target[n] = the target's logit (0 outside the slice); after those are
     * reduced, finish writes lse and losses. backward as above, with the
     * slice. */
    int (*crossentropy_slice_max)(loom_compute *c, float *max, const float *logits, int N,
                                  int width, int real);
    int (*crossentropy_slice_sums)(loom_compute *c, float *sum, float *target,
                                   const float *logits, const float *max, const int *targets,
                                   int v0, int N, int width, int real);
    int (*crossentropy_slice_finish)(loom_compute *c, float *lse, float *losses, const float *max,
                                     const float *sum, const float *target, int N);
    int (*crossentropy_slice_backward)(loom_compute *c, float *logits, const float *dlosses,
                                       const float *lse, const int *targets, int v0, int N,
                                       int width, int real);
    /* *mean (host) = the mean of n losses */
    int (*mean)(loom_compute *c, const float *x, size_t n, float *mean);

    /* ---- the optimizer and the norm ---- */

    /* AdamW on n elements: master, m, v fp32; grad of grad_dtype; params
     * (may be NULL) gets the updated weights stored as params_dtype. */
    int (*adamw)(loom_compute *c, const loom_compute_adamw *step, float *master, const void *grad,
                 loom_dtype grad_dtype, float *m, float *v, size_t n, void *params,
                 loom_dtype params_dtype);
    /* *sum (host) += the sum of squares of n elements of x (f32, bf16, f16) */
    int (*sum_squares)(loom_compute *c, const void *x, loom_dtype dtype, size_t n, double *sum);
    /* *count (host) = how many of n elements are not finite */
    int (*count_nonfinite)(loom_compute *c, const void *x, loom_dtype dtype, size_t n,
                           size_t *count);
    /* x (f32) *= s */
    int (*scale)(loom_compute *c, float *x, float s, size_t n);

    /* ---- conversions ---- */

    /* dst = src in dst_type (round to nearest even; NaN stays NaN) */
    int (*convert)(loom_compute *c, void *dst, loom_dtype dst_type, const void *src,
                   loom_dtype src_type, size_t n);
    /* dst (f32, bf16 or f16) += src, rounded to dst's type, and src zeroed */
    int (*accumulate)(loom_compute *c, void *dst, loom_dtype dst_type, float *src, size_t n);

    /* ---- OPTIONAL ---- */

    /* The backend's native queue (a cudaStream_t), for a communicator that
     * orders its collectives after the kernels; NULL: none. */
    void *(*native_queue)(loom_compute *c);
} loom_compute_plugin_v1_t;

/* The core's service over the run's backend, for strategies (loom_host's
 * compute, since LOOM_HOST_VERSION 7). The model's buffers — parameters,
 * gradients, master weights, optimizer state, activations — live in tier,
 * as mem_kind: a strategy allocates them with host->mem_alloc(host,
 * compute->tier, ...) and moves or reads them only through the calls below
 * and host->comm (which stages device buffers through pinned host memory
 * for a communicator that does not take them). loom_optimizer_step's update
 * functions take these buffers as they are. */
typedef struct loom_compute_api {
    uint32_t struct_size;
    uint32_t tier;     /* loom_tier of the model's buffers */
    uint32_t mem_kind; /* loom_mem_kind of them */
    uint32_t reserved;
    const char *backend; /* "cpu", "sim", "cuda" */
    int (*to_device)(const loom_host *host, void *dst, const void *src, size_t bytes);
    int (*to_host)(const loom_host *host, void *dst, const void *src, size_t bytes);
    int (*copy)(const loom_host *host, void *dst, const void *src, size_t bytes);
    int (*zero)(const loom_host *host, void *dst, size_t bytes);
    int (*convert)(const loom_host *host, void *dst, loom_dtype dst_type, const void *src,
                   loom_dtype src_type, size_t n);
    /* *sum += the sum of squares of n elements */
    int (*sum_squares)(const loom_host *host, const void *x, loom_dtype dtype, size_t n,
                       double *sum);
    int (*scale)(const loom_host *host, float *x, float s, size_t n);
    int (*synchronize)(const loom_host *host);
    /* rows rows of row_bytes each between pitched layouts (packing a
     * strided view in one call) */
    int (*copy_rows)(const loom_host *host, void *dst, size_t dst_pitch, const void *src,
                     size_t src_pitch, size_t row_bytes, size_t rows);
    /* dst (f32, bf16 or f16) += src (f32), rounded to dst's type; src is
     * zeroed */
    int (*accumulate)(const loom_host *host, void *dst, loom_dtype dst_type, float *src, size_t n);
    /* The backend's native queue (a cudaStream_t; NULL: none): a
     * communicator that takes device memory orders each op after the
     * kernels issued so far on it (an event the op's stream waits for),
     * without waiting on the host. Present when struct_size covers it. */
    void *native_queue;
} loom_compute_api;

#endif
