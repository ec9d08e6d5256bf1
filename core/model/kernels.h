/* loom core — the GPT-2 compute kernels, fp32 on the CPU: exactly the
 * math of llm.c's train_gpt2.c, matrix products through loom_gemm
 * (gemm.h), the rest plain C the compiler vectorises for each vector
 * level and OpenMP threads.
 *
 * Conventions: N = B*T rows; activations row-major (N, C). Backward kernels
 * ACCUMULATE (+=) into every gradient they write, as llm.c's do, so
 * gradients from several consumers add up; callers zero them first (the
 * fused softmax/cross-entropy backward alone writes over its input).
 * Every result is the same bits for any number of threads and any vector
 * level. */
#ifndef LOOM_KERNELS_H
#define LOOM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "loom/strategy.h"
#include "loom/tensor.h"
#include "runtime/cpu.h"

/* Functions whose loops the compiler vectorises come in versions for
 * AVX-512 (x86-64-v4), AVX2 and baseline x86-64, and each call runs the
 * widest the level in use allows (loom_cpu_isa: the CPU's, capped by
 * LOOM_MAX_ISA), so no version runs an instruction the CPU lacks. No
 * version contracts into FMA (ISO C mode, -ffp-contract=off) and the
 * loops' order does not depend on the width, so every version gives the
 * same bits.
 *
 *   LOOM_WIDE_LOOP(name, (params), (args)) defines static void name(params)
 *   in all three versions from an always-inline void name##_loop(params)
 *   defined before it; LOOM_STREAM_LOOP the same in AVX2 and baseline
 *   versions only, for loops that stream memory (wider vectors moved no
 *   more bytes a second once the data left the L2). */
#if defined(__x86_64__) && defined(__GNUC__)
#define LOOM_ISA_VERSION(name, suffix, isa_target, params, args)                                   \
    __attribute__((target(isa_target))) static void name##_##suffix params { name##_loop args; }
#define LOOM_WIDE_LOOP(name, params, args)                                                         \
    LOOM_ISA_VERSION(name, avx512, "arch=x86-64-v4", params, args)                                 \
    LOOM_ISA_VERSION(name, avx2, "avx2", params, args)                                             \
    static void name params                                                                        \
    {                                                                                              \
        const loom_isa isa_ = loom_cpu_isa();                                                      \
        if (isa_ >= LOOM_ISA_AVX512)                                                               \
            name##_avx512 args;                                                                    \
        else if (isa_ >= LOOM_ISA_AVX2)                                                            \
            name##_avx2 args;                                                                      \
        else                                                                                       \
            name##_loop args;                                                                      \
    }
#define LOOM_STREAM_LOOP(name, params, args)                                                       \
    LOOM_ISA_VERSION(name, avx2, "avx2", params, args)                                             \
    static void name params                                                                        \
    {                                                                                              \
        if (loom_cpu_isa() >= LOOM_ISA_AVX2)                                                       \
            name##_avx2 args;                                                                      \
        else                                                                                       \
            name##_loop args;                                                                      \
    }
#else
#define LOOM_WIDE_LOOP(name, params, args)                                                         \
    static void name params { name##_loop args; }
#define LOOM_STREAM_LOOP(name, params, args) LOOM_WIDE_LOOP(name, params, args)
#endif
/* The _loop functions and the helpers they call: inlined into each
 * version, so they are compiled (and vectorised) for its instructions. */
#define LOOM_INLINE static inline __attribute__((always_inline))

/* Threads for the kernels (OpenMP) and BLAS: one unless the run asks for
 * more (train.threads). */
void loom_kernels_set_threads(int threads);
int loom_kernels_threads(void);
/* fn(ctx, begin, end) over parts of [0, n) cut at multiples of 16, in
 * parallel on the kernels' threads when n is large enough to pay for it:
 * for element-wise work, where any split gives the same bits. */
void loom_kernels_for_spans(size_t n, void (*fn)(void *ctx, size_t begin, size_t end), void *ctx);

/* out[b,t,:] = wte[inp[b,t],:] + wpe[pos[t],:]. pos NULL: pos[t] = t. */
void loom_encoder_forward(float *out, const int *inp, const int *pos, const float *wte,
                          const float *wpe, int B, int T, int C);
void loom_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp,
                           const int *pos, int B, int T, int C);

/* eps 1e-5; mean and rstd (N) are saved for backward. */
void loom_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C);
/* res = a + b, then out = layernorm(res): loom_residual_forward and
 * loom_layernorm_forward in one pass, the same bits. */
void loom_residual_layernorm_forward(float *res, float *out, float *mean, float *rstd,
                                     const float *a, const float *b, const float *weight,
                                     const float *bias, int N, int C);
void loom_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C);
/* The two halves of loom_layernorm_backward, which is input then weight:
 * same operations per element (split backward of zero-bubble pipelines). */
void loom_layernorm_backward_input(float *dinp, const float *dout, const float *inp,
                                   const float *weight, const float *mean, const float *rstd,
                                   int N, int C);
void loom_layernorm_backward_weight(float *dweight, float *dbias, const float *dout,
                                    const float *inp, const float *mean, const float *rstd,
                                    int N, int C);

/* A product's weight: f32, or in a bf16 run that multiplies in bf16 the
 * stored bf16 parameters themselves (see gemm.h). */
typedef struct loom_weight {
    const void *data;
    loom_dtype dtype;
} loom_weight;

static inline loom_weight loom_weight_f32(const float *w) { return (loom_weight){w, LOOM_F32}; }

/* out (N, OC) = inp (N, C) · weight (OC, C)^T + bias (OC; may be NULL). */
void loom_matmul_forward(float *out, const float *inp, loom_weight weight, const float *bias,
                         int N, int C, int OC);
/* dinp += dout·weight; dweight += dout^T·inp; dbias += column sums of dout
 * (dbias may be NULL; dinp may be NULL when not needed). It is
 * loom_matmul_backward_input then _weight, so the halves called apart give
 * the same bits. */
void loom_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, loom_weight weight, int N, int C, int OC);
void loom_matmul_backward_input(float *dinp, const float *dout, loom_weight weight, int N, int C,
                                int OC);
void loom_matmul_backward_weight(float *dweight, float *dbias, const float *dout,
                                 const float *inp, int N, int C, int OC); /* dbias may be NULL */

/* GELU, tanh approximation. */
void loom_gelu_forward(float *out, const float *inp, int N);
void loom_gelu_backward(float *dinp, const float *inp, const float *dout, int N);
/* pre (N, C) += bias, then out = gelu(pre): a bias-less matmul's output
 * made the pre-activation the GELU's backward reads. */
void loom_bias_gelu_forward(float *out, float *pre, const float *bias, int N, int C);

void loom_residual_forward(float *out, const float *a, const float *b, int N);
void loom_residual_backward(float *da, float *db, const float *dout, int N);

/* Softmax and cross-entropy fused, over the first V of Vp logits per row
 * (the padding is ignored): each row's loss and the log-sum-exp lse of its
 * logits, and no probabilities stored. Backward writes the logits'
 * gradient, (softmax - one-hot)·dloss, over the logits themselves, 0 in the
 * padding: it does not accumulate. */
void loom_softmax_crossentropy_forward(float *losses, float *lse, const float *logits,
                                       const int *targets, int N, int V, int Vp);
void loom_softmax_crossentropy_backward(float *logits, const float *dlosses, const float *lse,
                                        const int *targets, int N, int V, int Vp);

/* Causal attention as blocks with an online softmax (see loom_attention_kernels
 * in strategy.h): q, k, v, out (B, T, NH, HS) i.e. (B, T, C) with heads
 * side by side; lse (B, NH, tq). Scale 1/sqrt(HS); key j is visible to query
 * i when k_pos[j] <= q_pos[i]. block_forward with first_block = 1 overwrites
 * out/lse; with 0 it merges the block into them. A row that sees no key in
 * any block gets out = 0 and lse = -inf. block_backward accumulates into
 * dq, dk, dv, given the final out and lse. dtype: f32, bf16 or f16 buffers
 * (16-bit ones are computed in f32). */
extern const loom_attention_kernels loom_attention_kernels_cpu;

/* Whole-sequence causal attention in one call (one block, positions 0..T-1). */
void loom_attention_forward(float *out, float *lse, const float *q, const float *k,
                            const float *v, int B, int T, int NH, int HS);
void loom_attention_backward(float *dq, float *dk, float *dv, const float *q, const float *k,
                             const float *v, const float *out, const float *dout,
                             const float *lse, int B, int T, int NH, int HS);

/* Array conversions for 16-bit storage (round to nearest even; NaN stays
 * NaN as tensor.h's scalar conversions have it). */
void loom_convert(void *dst, loom_dtype dst_type, const void *src, loom_dtype src_type, size_t n);
/* dst (f32, bf16 or f16) += src, rounded to dst's type, and src zeroed. */
void loom_accumulate(void *dst, loom_dtype dst_type, float *src, size_t n);
/* loom_convert's code: the CPU's conversion instructions where it has them
 * (AVX-512 BF16 for f32 -> bf16, F16C for f16; the default), or the
 * portable loops only. Both give the same bits; tests compare them. */
typedef enum loom_convert_path { LOOM_CONVERT_NATIVE, LOOM_CONVERT_PORTABLE } loom_convert_path;
void loom_convert_set_path(loom_convert_path path);
/* What converts src to dst now: "avx512-bf16", "f16c" or "portable"
 * (NULL: not a pair with its own code). */
const char *loom_convert_path_name(loom_dtype dst, loom_dtype src);

#endif
