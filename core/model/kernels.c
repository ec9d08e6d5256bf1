/* loom core — the GPT-2 kernels of llm.c's train_gpt2.c, fp32 on the CPU.
 *
 * Matrix products, attention's included, go to loom_gemm (gemm.h). Everything
 * else is plain loops over contiguous rows, written so that the build's
 * -O2 vectorises them (see "helpers"). Float reductions are summed in 8
 * independent lanes in a fixed order, so results are deterministic.
 *
 * Two places compute llm.c's formulas in a different but equal form, for
 * speed: GELU uses 0.5·x·(1 + tanh a) = x·σ(2a) with σ from one exp
 * (glibc's tanhf costs 15 ns), and exp itself is a vectorisable
 * polynomial (exp_fast, within 2 ulp). */
#include "loom/status.h"
#include "loom/strategy.h"
#include "loom/tensor.h"
#include "model/gemm.h"
#include "model/kernels.h"
#include "runtime/log.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


/* The build targets baseline x86-64 (SSE2, 4 floats wide). The loops that
 * spend their time in exp_fast are also compiled for AVX2 and picked when
 * the library loads. Neither version uses FMA, so both round alike. */
#if defined(__x86_64__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define WIDE_LOOP __attribute__((target_clones("avx2", "default")))
#endif
#endif
#ifndef WIDE_LOOP
#define WIDE_LOOP
#endif

#define LAYERNORM_EPS 1e-5f
#define GELU_SCALING_FACTOR 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBIC 0.044715f

void loom_kernels_set_threads(int threads) { loom_gemm_set_threads(threads); }

/* c = alpha · op(a) · op(b) + beta · c on f32 rows, multiplied as the
 * run's matrix products are (model products) or always in f32 (attention's
 * small tiles, where the softmax needs the precision). */
static void product(int ta, int tb, int M, int N, int K, float alpha, const float *a, int lda,
                    const float *b, int ldb, float beta, float *c, int ldc, loom_dtype multiply)
{
    loom_gemm(c, ldc, M, N, K, loom_gemm_f32(a, lda, ta), loom_gemm_f32(b, ldb, tb), alpha, beta,
              multiply);
}

/* ---------------------------------------------------------------- helpers */

static inline float lanes_total(const float *lane)
{
    return ((lane[0] + lane[4]) + (lane[1] + lane[5])) +
           ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

/* The elementwise loops are blocked by 8 with a fixed inner loop: -O2's
 * cost model (very-cheap) vectorises only loops that need no scalar
 * epilogue and no run-time alias check, which a fixed 8-iteration loop on
 * restrict parameters is. Conditionals inside them select on integers:
 * with -ftrapping-math (the default) a float comparison is control flow
 * the vectoriser will not touch. */

/* y += x */
static inline void vec_acc(float *restrict y, const float *restrict x, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            y[i + l] += x[i + l];
    for (; i < n; i++)
        y[i] += x[i];
}

/* y += a * x */
static inline void vec_axpy(float *restrict y, float a, const float *restrict x, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            y[i + l] += a * x[i + l];
    for (; i < n; i++)
        y[i] += a * x[i];
}

/* o = a + b */
static inline void vec_add(float *restrict o, const float *restrict a, const float *restrict b,
                           int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            o[i + l] = a[i + l] + b[i + l];
    for (; i < n; i++)
        o[i] = a[i] + b[i];
}

/* y = a * x */
static inline void vec_scale(float *restrict y, float a, const float *restrict x, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            y[i + l] = a * x[i + l];
    for (; i < n; i++)
        y[i] = a * x[i];
}

/* y = a * y + b * x */
static inline void vec_blend(float *restrict y, float a, float b, const float *restrict x, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            y[i + l] = a * y[i + l] + b * x[i + l];
    for (; i < n; i++)
        y[i] = a * y[i] + b * x[i];
}

static float sum_f32(const float *restrict x, int n)
{
    float lane[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            lane[l] += x[i + l];
    float s = lanes_total(lane);
    for (; i < n; i++)
        s += x[i];
    return s;
}

static inline float dot_f32(const float *restrict a, const float *restrict b, int n)
{
    float lane[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            lane[l] += a[i + l] * b[i + l];
    float s = lanes_total(lane);
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* A float's bits and back (C11 reads a union through its other member). */
typedef union float_bits {
    float f;
    uint32_t u;
} float_bits;

static inline uint32_t as_bits(float f) { return ((float_bits){.f = f}).u; }

static inline float as_float(uint32_t u) { return ((float_bits){.u = u}).f; }

/* exp(x) within 2 ulp (Cody-Waite reduction, Cephes' degree-6 polynomial),
 * branch-free so loops of it vectorise. x < -87 gives 0, x > 88 +inf, NaN
 * NaN. */
static inline float exp_fast(float x)
{
    const uint32_t xb = as_bits(x);
    const uint32_t is_nan = 0u - (uint32_t)((xb & 0x7fffffffu) > 0x7f800000u);
    const uint32_t tiny = 0u - (uint32_t)(xb > 0xc2ae0000u); /* below -87, -inf */
    const uint32_t huge = 0u - (uint32_t)((xb > 0x42b00000u) & (xb < 0x80000000u)); /* above 88 */
    const uint32_t off = tiny | huge;
    const float xc = as_float(xb & ~off); /* out of range: compute exp(0), then replace */
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x/ln2) */
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const float y = p * as_float((uint32_t)((int32_t)n + 127) << 23); /* n in [-126, 127] */
    uint32_t yb = (as_bits(y) & ~off) | (huge & 0x7f800000u);
    yb = (yb & ~is_nan) | (is_nan & 0x7fc00000u);
    return as_float(yb);
}

/* ---------------------------------------------------------------- encoder */

void loom_encoder_forward(float *out, const int *inp, const int *pos, const float *wte,
                          const float *wpe, int B, int T, int C)
{
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float *te = wte + (size_t)inp[b * T + t] * C;
            const float *pe = wpe + (size_t)(pos ? pos[t] : t) * C;
            vec_add(out + ((size_t)b * T + t) * C, te, pe, C);
        }
    }
}

void loom_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp,
                           const int *pos, int B, int T, int C)
{
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            vec_acc(dwte + (size_t)inp[b * T + t] * C, d, C);
            vec_acc(dwpe + (size_t)(pos ? pos[t] : t) * C, d, C);
        }
    }
}

/* -------------------------------------------------------------- layernorm */

static void layernorm_row(float *restrict o, float *mean, float *rstd, const float *restrict x,
                          const float *restrict w, const float *restrict bias, int C)
{
    const float m = sum_f32(x, C) / (float)C;
    /* biased variance, as llm.c */
    float lane[8] = {0};
    int i = 0;
    for (; i + 8 <= C; i += 8)
        for (int l = 0; l < 8; l++) {
            float d = x[i + l] - m;
            lane[l] += d * d;
        }
    float v = lanes_total(lane);
    for (; i < C; i++)
        v += (x[i] - m) * (x[i] - m);
    v /= (float)C;
    const float s = 1.0f / sqrtf(v + LAYERNORM_EPS);
    for (i = 0; i + 8 <= C; i += 8)
        for (int l = 0; l < 8; l++)
            o[i + l] = (s * (x[i + l] - m)) * w[i + l] + bias[i + l];
    for (; i < C; i++)
        o[i] = (s * (x[i] - m)) * w[i] + bias[i];
    *mean = m;
    *rstd = s;
}

void loom_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C)
{
    for (int n = 0; n < N; n++)
        layernorm_row(out + (size_t)n * C, mean + n, rstd + n, inp + (size_t)n * C, weight, bias,
                      C);
}

/* The input gradient of one row: the two means it needs (of w*dout and of
 * w*dout*norm), then each element. */
static void layernorm_row_backward_input(float *restrict dx, const float *restrict d,
                                         const float *restrict x, const float *restrict w,
                                         float m, float s, int C)
{
    float lane_a[8] = {0}, lane_b[8] = {0};
    int i = 0;
    for (; i + 8 <= C; i += 8)
        for (int l = 0; l < 8; l++) {
            float norm = (x[i + l] - m) * s;
            float dnorm = w[i + l] * d[i + l];
            lane_a[l] += dnorm;
            lane_b[l] += dnorm * norm;
        }
    float dnorm_mean = lanes_total(lane_a), dnorm_norm_mean = lanes_total(lane_b);
    for (; i < C; i++) {
        float norm = (x[i] - m) * s;
        float dnorm = w[i] * d[i];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= (float)C;
    dnorm_norm_mean /= (float)C;
    for (i = 0; i < C; i++) {
        float norm = (x[i] - m) * s;
        float dnorm = w[i] * d[i];
        dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
}

static void layernorm_row_backward_weight(float *restrict dw, float *restrict db,
                                          const float *restrict d, const float *restrict x,
                                          float m, float s, int C)
{
    for (int i = 0; i < C; i++) {
        float norm = (x[i] - m) * s;
        db[i] += d[i];
        dw[i] += norm * d[i];
    }
}

void loom_layernorm_backward_input(float *dinp, const float *dout, const float *inp,
                                   const float *weight, const float *mean, const float *rstd,
                                   int N, int C)
{
    for (int n = 0; n < N; n++)
        layernorm_row_backward_input(dinp + (size_t)n * C, dout + (size_t)n * C,
                                     inp + (size_t)n * C, weight, mean[n], rstd[n], C);
}

void loom_layernorm_backward_weight(float *dweight, float *dbias, const float *dout,
                                    const float *inp, const float *mean, const float *rstd,
                                    int N, int C)
{
    for (int n = 0; n < N; n++)
        layernorm_row_backward_weight(dweight, dbias, dout + (size_t)n * C, inp + (size_t)n * C,
                                      mean[n], rstd[n], C);
}

void loom_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C)
{
    loom_layernorm_backward_input(dinp, dout, inp, weight, mean, rstd, N, C);
    loom_layernorm_backward_weight(dweight, dbias, dout, inp, mean, rstd, N, C);
}

/* ----------------------------------------------------------------- matmul */

void loom_matmul_forward(float *out, const float *inp, loom_weight weight, const float *bias,
                         int N, int C, int OC)
{
    /* Start from the bias so the product can add onto it in the same pass. */
    float beta = 0.0f;
    if (bias) {
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    loom_gemm_operand w = {weight.data, weight.dtype, C, 1};
    loom_gemm(out, OC, N, OC, C, loom_gemm_f32(inp, C, 0), w, 1.0f, beta,
              loom_gemm_multiply_dtype());
}

void loom_matmul_backward_input(float *dinp, const float *dout, loom_weight weight, int N, int C,
                                int OC)
{
    /* (N, C) += (N, OC) · (OC, C) */
    loom_gemm_operand w = {weight.data, weight.dtype, C, 0};
    loom_gemm(dinp, C, N, C, OC, loom_gemm_f32(dout, OC, 0), w, 1.0f, 1.0f,
              loom_gemm_multiply_dtype());
}

static void matmul_bias_backward(float *dbias, const float *dout, int N, int OC)
{
    for (int n = 0; n < N; n++)
        vec_acc(dbias, dout + (size_t)n * OC, OC);
}

void loom_matmul_backward_weight(float *dweight, float *dbias, const float *dout,
                                 const float *inp, int N, int C, int OC)
{
    /* (OC, C) += (OC, N) · (N, C) */
    product(1, 0, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C, loom_gemm_multiply_dtype());
    if (dbias)
        matmul_bias_backward(dbias, dout, N, OC);
}

void loom_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, loom_weight weight, int N, int C, int OC)
{
    if (dinp)
        loom_matmul_backward_input(dinp, dout, weight, N, C, OC);
    if (dweight)
        loom_matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC);
    else if (dbias)
        matmul_bias_backward(dbias, dout, N, OC);
}

/* ------------------------------------------------------------------- gelu */

/* llm.c's GELU is 0.5·x·(1 + tanh a), a = sqrt(2/pi)·(x + 0.044715·x³).
 * Since 0.5·(1 + tanh a) = σ(2a), with e = exp(-2|a|) ≤ 1:
 *   σ(2a) = 1/(1+e) for a ≥ 0, e/(1+e) for a < 0; σ(2a)·(1 - σ(2a)) = e/(1+e)²
 * which stays accurate at both tails, where tanh's 1 ± t would cancel. */
static inline float gelu_arg(float x)
{
    return GELU_SCALING_FACTOR * (x + GELU_CUBIC * x * x * x);
}

/* σ(2a) and σ(2a)·(1 - σ(2a)) */
static inline float gelu_gate(float a, float *slope)
{
    const uint32_t ab = as_bits(a);
    const float e = exp_fast(as_float(as_bits(2.0f * a) | 0x80000000u)); /* exp(-2|a|) */
    const float inv = 1.0f / (1.0f + e);
    const uint32_t neg = 0u - (ab >> 31);
    *slope = e * inv * inv;
    return as_float((as_bits(inv) & ~neg) | (as_bits(e * inv) & neg));
}

WIDE_LOOP static void gelu_forward_span(float *restrict o, const float *restrict x, int n)
{
    float slope;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            o[i + l] = x[i + l] * gelu_gate(gelu_arg(x[i + l]), &slope);
    for (; i < n; i++)
        o[i] = x[i] * gelu_gate(gelu_arg(x[i]), &slope);
}

/* d/dx x·σ(2a) = σ(2a) + x·2σ(2a)(1 - σ(2a))·a'(x), a' = sqrt(2/pi)·(1 + 3·0.044715·x²);
 * the same as llm.c's 0.5(1 + tanh a) + x·0.5·sech²(a)·a'(x). */
static inline float gelu_local_grad(float x)
{
    float slope;
    const float gate = gelu_gate(gelu_arg(x), &slope);
    return gate + 2.0f * x * slope * GELU_SCALING_FACTOR * (1.0f + 3.0f * GELU_CUBIC * x * x);
}

WIDE_LOOP static void gelu_backward_span(float *restrict dx, const float *restrict x,
                                         const float *restrict d, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            dx[i + l] += gelu_local_grad(x[i + l]) * d[i + l];
    for (; i < n; i++)
        dx[i] += gelu_local_grad(x[i]) * d[i];
}

void loom_gelu_forward(float *out, const float *inp, int N)
{
    gelu_forward_span(out, inp, N);
}

void loom_gelu_backward(float *dinp, const float *inp, const float *dout, int N)
{
    gelu_backward_span(dinp, inp, dout, N);
}

/* --------------------------------------------------------------- residual */

void loom_residual_forward(float *out, const float *a, const float *b, int N)
{
    vec_add(out, a, b, N);
}

void loom_residual_backward(float *da, float *db, const float *dout, int N)
{
    vec_acc(da, dout, N);
    vec_acc(db, dout, N);
}

/* ---------------------------------------------------- softmax and the loss */

WIDE_LOOP static void softmax_row(float *restrict p, const float *restrict x, int V, int Vp)
{
    float lane[8];
    for (int l = 0; l < 8; l++)
        lane[l] = -INFINITY;
    int i = 0;
    for (; i + 8 <= V; i += 8)
        for (int l = 0; l < 8; l++)
            lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
    float maxval = -INFINITY;
    for (int l = 0; l < 8; l++)
        maxval = lane[l] > maxval ? lane[l] : maxval;
    for (; i < V; i++)
        maxval = x[i] > maxval ? x[i] : maxval;
    for (i = 0; i + 8 <= V; i += 8)
        for (int l = 0; l < 8; l++)
            p[i + l] = exp_fast(x[i + l] - maxval);
    for (; i < V; i++)
        p[i] = exp_fast(x[i] - maxval);
    const float sum = sum_f32(p, V);
    for (i = 0; i + 8 <= V; i += 8)
        for (int l = 0; l < 8; l++)
            p[i + l] /= sum;
    for (; i < V; i++)
        p[i] /= sum;
    for (i = V; i < Vp; i++)
        p[i] = 0.0f;
}

void loom_softmax_forward(float *probs, const float *logits, int N, int V, int Vp)
{
    for (int n = 0; n < N; n++)
        softmax_row(probs + (size_t)n * Vp, logits + (size_t)n * Vp, V, Vp);
}

void loom_crossentropy_forward(float *losses, const float *probs, const int *targets, int N,
                               int Vp)
{
    for (int n = 0; n < N; n++)
        losses[n] = -logf(probs[(size_t)n * Vp + targets[n]]);
}

void loom_crossentropy_softmax_backward(float *dlogits, const float *dlosses, const float *probs,
                                        const int *targets, int N, int V, int Vp)
{
    for (int n = 0; n < N; n++) {
        float *dl = dlogits + (size_t)n * Vp;
        const float *p = probs + (size_t)n * Vp;
        const float dloss = dlosses[n];
        const int t = targets[n];
        /* the target's term is (p - 1) * dloss, rounded once like the rest */
        const float dl_target = dl[t];
        vec_axpy(dl, dloss, p, V);
        dl[t] = dl_target + (p[t] - 1.0f) * dloss;
    }
}

/* ------------------------------------------------------------- conversion */

/* loom_f32_to_bf16 without its branch, so the loop vectorises: round to
 * nearest even, NaN stays a (quiet) NaN. */
static void f32_to_bf16_span(uint16_t *restrict d, const float *restrict s, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) {
            const uint32_t u = as_bits(s[i + l]);
            const uint32_t nan = 0u - (uint32_t)((u & 0x7fffffffu) > 0x7f800000u);
            const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
            d[i + l] = (uint16_t)((rounded & ~nan) | (((u >> 16) | 0x40u) & nan));
        }
    for (; i < n; i++)
        d[i] = loom_f32_to_bf16(s[i]);
}

static void bf16_to_f32_span(float *restrict d, const uint16_t *restrict s, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            d[i + l] = as_float((uint32_t)s[i + l] << 16);
    for (; i < n; i++)
        d[i] = loom_bf16_to_f32(s[i]);
}

static void f32_to_f16_span(uint16_t *restrict d, const float *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = loom_f32_to_f16(s[i]);
}

static void f16_to_f32_span(float *restrict d, const uint16_t *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = loom_f16_to_f32(s[i]);
}

void loom_convert(void *dst, loom_dtype dst_type, const void *src, loom_dtype src_type, size_t n)
{
    if (dst_type == src_type) {
        memmove(dst, src, n * loom_dtype_size(src_type));
        return;
    }
    const int wide_src = src_type == LOOM_F32, wide_dst = dst_type == LOOM_F32;
    const int half_src = src_type == LOOM_BF16 || src_type == LOOM_F16;
    const int half_dst = dst_type == LOOM_BF16 || dst_type == LOOM_F16;
    if (wide_src && dst_type == LOOM_BF16) {
        f32_to_bf16_span(dst, src, n);
    } else if (wide_src && dst_type == LOOM_F16) {
        f32_to_f16_span(dst, src, n);
    } else if (src_type == LOOM_BF16 && wide_dst) {
        bf16_to_f32_span(dst, src, n);
    } else if (src_type == LOOM_F16 && wide_dst) {
        f16_to_f32_span(dst, src, n);
    } else if (half_src && half_dst) {
        /* exact through f32, which holds every bf16 and f16 */
        float chunk[256];
        const uint16_t *s = src;
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i += LOOM_ARRAY_LEN(chunk)) {
            size_t k = n - i < LOOM_ARRAY_LEN(chunk) ? n - i : LOOM_ARRAY_LEN(chunk);
            loom_convert(chunk, LOOM_F32, s + i, src_type, k);
            loom_convert(d + i, dst_type, chunk, LOOM_F32, k);
        }
    } else {
        loom_fail(LOOM_ERR_NOT_SUPPORTED, "loom_convert: %s to %s is not a conversion loom has",
                  loom_dtype_name(src_type), loom_dtype_name(dst_type));
    }
}

/* -------------------------------------------------------------- attention */

/* Causal attention over blocks of keys with an online softmax. Per (batch,
 * head), query i at position qp, key j at kp <= qp:
 *   s_ij = scale·q_i·k_j, lse_i = log Σ_j exp(s_ij), out_i = Σ_j exp(s_ij - lse_i)·v_j
 * which is llm.c's softmax(preatt)·v row for row. No (T, T) matrix exists:
 * queries go in tiles of ATTN_QT rows against chunks of up to ATTN_KT keys,
 * the scores of one tile and chunk live in scratch, and each chunk is
 * merged into out through the row's lse, exactly as separate blocks from a
 * sequence strategy (ring attention) are. Backward recomputes the
 * probabilities from lse. The products are products on the head's rows
 * in place (they are C = NH·HS floats apart); keys no query of the tile can
 * see are trimmed off the chunk's ends, so the causal half costs little.
 *
 * bf16/f16 buffers are converted per (batch, head) into f32 scratch,
 * computed in f32, and written back rounded; lse is always f32. */

#define ATTN_QT 64
#define ATTN_KT 256

/* One head's rows: element (row r, dim d) at base[r * ld + d]. */
typedef struct head_rows {
    float *base;
    int ld;
} head_rows;

static inline float *head_row(head_rows h, int r) { return h.base + (size_t)r * h.ld; }

/* In-place view of head h of batch b in an f32 (B, rows, NH, HS) buffer. */
static head_rows f32_head(const void *buf, int b, int h, int rows, int NH, int HS)
{
    const size_t C = (size_t)NH * HS;
    head_rows v = {(float *)buf + (size_t)b * rows * C + (size_t)h * HS, NH * HS};
    return v;
}

static head_rows packed_head(float *buf, int HS)
{
    head_rows v = {buf, HS};
    return v;
}

/* Rows [b, 0..rows) of head h of a (B, rows, NH, HS) buffer of type dt,
 * to and from contiguous f32 (rows, HS). */
static void gather_head(float *dst, const void *src, loom_dtype dt, int b, int h, int rows,
                        int NH, int HS)
{
    const size_t C = (size_t)NH * HS, es = loom_dtype_size(dt);
    for (int r = 0; r < rows; r++) {
        const char *s = (const char *)src + (((size_t)b * rows + r) * C + (size_t)h * HS) * es;
        loom_convert(dst + (size_t)r * HS, LOOM_F32, s, dt, (size_t)HS);
    }
}

static void scatter_head(void *dst, loom_dtype dt, const float *src, int b, int h, int rows,
                         int NH, int HS)
{
    const size_t C = (size_t)NH * HS, es = loom_dtype_size(dt);
    for (int r = 0; r < rows; r++) {
        char *d = (char *)dst + (((size_t)b * rows + r) * C + (size_t)h * HS) * es;
        loom_convert(d, dt, src + (size_t)r * HS, LOOM_F32, (size_t)HS);
    }
}

/* Out of memory in a kernel that cannot return a status: make the damage
 * impossible to miss (NaN reaches the loss) and record why. */
static void poison(void *buf, loom_dtype dt, size_t n)
{
    if (dt == LOOM_F32) {
        float *f = buf;
        for (size_t i = 0; i < n; i++)
            f[i] = NAN;
    } else {
        uint16_t *u = buf, nan = dt == LOOM_BF16 ? 0x7fc0u : 0x7e00u;
        for (size_t i = 0; i < n; i++)
            u[i] = nan;
    }
}

/* Positions as arrays (NULL means 0..n-1), so the masks below are plain
 * integer loops. */
typedef struct attn_positions {
    const int *q, *k;
    int *owned;
} attn_positions;

static int positions_init(attn_positions *p, const int *q_pos, int tq, const int *k_pos, int tk)
{
    p->q = q_pos;
    p->k = k_pos;
    p->owned = NULL;
    if (q_pos && k_pos)
        return 0;
    const size_t n = (size_t)(q_pos ? 0 : tq) + (size_t)(k_pos ? 0 : tk);
    p->owned = malloc((n + 1) * sizeof(int)); /* + 1: never malloc(0) */
    if (!p->owned)
        return -1;
    int *next = p->owned;
    if (!q_pos) {
        for (int i = 0; i < tq; i++)
            next[i] = i;
        p->q = next;
        next += tq;
    }
    if (!k_pos) {
        for (int j = 0; j < tk; j++)
            next[j] = j;
        p->k = next;
    }
    return 0;
}

/* The keys of chunk [c0, c1) some query at a position <= qmax can see,
 * trimmed to [*j0, *j1); 0 when there are none. */
static int chunk_visible(const int *k_pos, int c0, int c1, int qmax, int *j0, int *j1)
{
    int a = c0, z = c1;
    while (a < z && k_pos[a] > qmax)
        a++;
    while (z > a && k_pos[z - 1] > qmax)
        z--;
    *j0 = a;
    *j1 = z;
    return z > a;
}

static int tile_max(const int *pos, int n)
{
    int m = pos[0];
    for (int i = 1; i < n; i++)
        m = pos[i] > m ? pos[i] : m;
    return m;
}

/* max over the keys at positions <= qp of s; -inf when there are none */
static float masked_max(const float *restrict s, const int *restrict kp, int qp, int n)
{
    float lane[8];
    for (int l = 0; l < 8; l++)
        lane[l] = -INFINITY;
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) {
            const uint32_t seen = 0u - (uint32_t)(kp[j + l] <= qp);
            const float v = as_float((as_bits(s[j + l]) & seen) | (0xff800000u & ~seen));
            lane[l] = v > lane[l] ? v : lane[l];
        }
    float m = -INFINITY;
    for (int l = 0; l < 8; l++)
        m = lane[l] > m ? lane[l] : m;
    for (; j < n; j++)
        if (kp[j] <= qp && s[j] > m)
            m = s[j];
    return m;
}

/* s = exp(s - shift) for keys at positions <= qp, 0 for the others */
WIDE_LOOP static void masked_exp(float *restrict s, const int *restrict kp, int qp, float shift,
                                 int n)
{
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) {
            const uint32_t seen = 0u - (uint32_t)(kp[j + l] <= qp);
            s[j + l] = as_float(as_bits(exp_fast(s[j + l] - shift)) & seen);
        }
    for (; j < n; j++)
        s[j] = kp[j] <= qp ? exp_fast(s[j] - shift) : 0.0f;
}

/* Merge a chunk's row (acc = Σ exp(s_j - m)·v_j, l = Σ exp(s_j - m)) into
 * the row's out and lse. A row at lse -inf has seen no key yet: overwrite,
 * whatever out holds. */
static void merge_row(float *o, float *lse, const float *acc, float m, float l, int HS)
{
    const float chunk_lse = m + logf(l);
    const float old_lse = *lse;
    if (old_lse == -INFINITY) {
        vec_scale(o, 1.0f / l, acc, HS);
        *lse = chunk_lse;
        return;
    }
    const float top = old_lse > chunk_lse ? old_lse : chunk_lse;
    const float new_lse = top + logf(expf(old_lse - top) + expf(chunk_lse - top));
    /* exp(chunk_lse - new_lse) / l = exp(m - new_lse) */
    vec_blend(o, expf(old_lse - new_lse), expf(m - new_lse), acc, HS);
    *lse = new_lse;
}

typedef struct attn_scratch {
    float *s;        /* ATTN_QT x ATTN_KT: scores, then probabilities */
    float *ds;       /* ATTN_QT x ATTN_KT: dP, then dS (backward) */
    float *acc;      /* ATTN_QT x HS (forward) */
    float *row_max;  /* ATTN_QT */
    float *row_sum;  /* ATTN_QT; D_i = dout_i·out_i in backward */
} attn_scratch;

/* The next chunk of keys, from *c0 on, that some query of the tile [i0,
 * i0 + nq) (at positions <= qmax) can see: its keys [*j0, *j0 + nk) and
 * their scores scale·q·kᵀ in w->s (nq x nk). Returns nk, 0 when no chunk
 * is left. */
static int next_chunk_scores(head_rows q, int i0, int nq, int qmax, head_rows k,
                             const int *k_pos, int tk, int HS, float scale,
                             const attn_scratch *w, int *c0, int *j0)
{
    for (; *c0 < tk; *c0 += ATTN_KT) {
        int j1;
        if (!chunk_visible(k_pos, *c0, *c0 + ATTN_KT < tk ? *c0 + ATTN_KT : tk, qmax, j0, &j1))
            continue;
        const int nk = j1 - *j0;
        product(0, 1, nq, nk, HS, scale, head_row(q, i0), q.ld,
                head_row(k, *j0), k.ld, 0.0f, w->s, nk, LOOM_F32);
        *c0 += ATTN_KT;
        return nk;
    }
    return 0;
}

static void forward_head(head_rows q, const int *q_pos, int tq, head_rows k, head_rows v,
                         const int *k_pos, int tk, int HS, float scale, head_rows o, float *lse,
                         int first_block, const attn_scratch *w)
{
    if (first_block)
        for (int i = 0; i < tq; i++) {
            memset(head_row(o, i), 0, (size_t)HS * sizeof(float));
            lse[i] = -INFINITY;
        }
    for (int i0 = 0; i0 < tq; i0 += ATTN_QT) {
        const int nq = tq - i0 < ATTN_QT ? tq - i0 : ATTN_QT;
        const int qmax = tile_max(q_pos + i0, nq);
        int c0 = 0, j0, nk;
        while ((nk = next_chunk_scores(q, i0, nq, qmax, k, k_pos, tk, HS, scale, w, &c0, &j0))) {
            for (int r = 0; r < nq; r++) {
                float *s = w->s + (size_t)r * nk;
                const int qp = q_pos[i0 + r];
                const float m = masked_max(s, k_pos + j0, qp, nk);
                w->row_max[r] = m;
                if (m == -INFINITY) { /* this row sees no key of the chunk */
                    memset(s, 0, (size_t)nk * sizeof(float));
                    continue;
                }
                masked_exp(s, k_pos + j0, qp, m, nk);
                w->row_sum[r] = sum_f32(s, nk);
            }
            product(0, 0, nq, HS, nk, 1.0f, w->s, nk, head_row(v, j0), v.ld,
                    0.0f, w->acc, HS, LOOM_F32);
            for (int r = 0; r < nq; r++)
                if (w->row_max[r] != -INFINITY)
                    merge_row(head_row(o, i0 + r), lse + i0 + r, w->acc + (size_t)r * HS,
                              w->row_max[r], w->row_sum[r], HS);
        }
    }
}

/* ds = p ∘ (dp - D) */
static void softmax_grad_row(float *restrict ds, const float *restrict p, float D, int n)
{
    int j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++)
            ds[j + l] = p[j + l] * (ds[j + l] - D);
    for (; j < n; j++)
        ds[j] = p[j] * (ds[j] - D);
}

static void backward_head(head_rows q, const int *q_pos, int tq, head_rows k, head_rows v,
                          const int *k_pos, int tk, int HS, float scale, head_rows o,
                          head_rows dout, const float *lse, head_rows dq, head_rows dk,
                          head_rows dv, const attn_scratch *w)
{
    for (int i0 = 0; i0 < tq; i0 += ATTN_QT) {
        const int nq = tq - i0 < ATTN_QT ? tq - i0 : ATTN_QT;
        const int qmax = tile_max(q_pos + i0, nq);
        float *D = w->row_sum;
        for (int r = 0; r < nq; r++)
            D[r] = dot_f32(head_row(dout, i0 + r), head_row(o, i0 + r), HS);
        int c0 = 0, j0, nk;
        while ((nk = next_chunk_scores(q, i0, nq, qmax, k, k_pos, tk, HS, scale, w, &c0, &j0))) {
            /* P = exp(scale·Q·Kᵀ - lse), masked */
            for (int r = 0; r < nq; r++) {
                float *p = w->s + (size_t)r * nk;
                const float L = lse[i0 + r];
                if (!isfinite(L)) /* the row saw no key anywhere: out is 0, nothing flows */
                    memset(p, 0, (size_t)nk * sizeof(float));
                else
                    masked_exp(p, k_pos + j0, q_pos[i0 + r], L, nk);
            }
            /* dV += Pᵀ·dO */
            product(1, 0, nk, HS, nq, 1.0f, w->s, nk, head_row(dout, i0),
                    dout.ld, 1.0f, head_row(dv, j0), dv.ld, LOOM_F32);
            /* dS = P ∘ (dO·Vᵀ - D) */
            product(0, 1, nq, nk, HS, 1.0f, head_row(dout, i0), dout.ld,
                    head_row(v, j0), v.ld, 0.0f, w->ds, nk, LOOM_F32);
            for (int r = 0; r < nq; r++)
                softmax_grad_row(w->ds + (size_t)r * nk, w->s + (size_t)r * nk, D[r], nk);
            /* dQ += scale·dS·K, dK += scale·dSᵀ·Q */
            product(0, 0, nq, HS, nk, scale, w->ds, nk, head_row(k, j0), k.ld,
                    1.0f, head_row(dq, i0), dq.ld, LOOM_F32);
            product(1, 0, nk, HS, nq, scale, w->ds, nk, head_row(q, i0), q.ld,
                    1.0f, head_row(dk, j0), dk.ld, LOOM_F32);
        }
    }
}

/* One (B, rows, NH, HS) buffer of a call, as the per-head loop uses it:
 * read before each head (in) and/or written after it (out). A 16-bit
 * buffer goes through its packed f32 copy of one head (rows x HS). */
typedef struct head_buf {
    const void *in; /* NULL: not read */
    void *out;      /* NULL: not written */
    int rows;
    float *packed;
} head_buf;

/* One call of the attention kernels: its shape, its buffers, and the
 * scratch it runs in. */
typedef struct attn_call {
    int B, NH, HS;
    loom_dtype dtype;
    head_buf *bufs;
    int nbufs;
    float scale;
    attn_scratch w;
    attn_positions pos;
    float *mem;
} attn_call;

/* The scratch: the tile buffers, then for 16-bit types the packed heads;
 * and the positions as arrays. Out of memory: -1, why recorded, and the
 * buffers the call writes poisoned. */
static int attn_begin(attn_call *c, const char *what, const int *q_pos, int tq, const int *k_pos,
                      int tk)
{
    const size_t tile = (size_t)ATTN_QT * ATTN_KT;
    const int packed = c->dtype != LOOM_F32;
    size_t floats = 2 * tile + (size_t)ATTN_QT * c->HS + 2 * (size_t)ATTN_QT;
    for (int i = 0; packed && i < c->nbufs; i++)
        floats += (size_t)c->bufs[i].rows * c->HS;
    c->mem = malloc(floats * sizeof(float));
    if (!c->mem || positions_init(&c->pos, q_pos, tq, k_pos, tk) != 0) {
        free(c->mem);
        loom_fail(LOOM_ERR_NO_MEMORY, "attention %s: out of memory for the scratch of "
                                      "%d queries and %d keys",
                  what, tq, tk);
        for (int i = 0; i < c->nbufs; i++)
            if (c->bufs[i].out)
                poison(c->bufs[i].out, c->dtype, (size_t)c->B * c->bufs[i].rows * c->NH * c->HS);
        return -1;
    }
    c->scale = 1.0f / sqrtf((float)c->HS);
    attn_scratch *w = &c->w;
    w->s = c->mem;
    w->ds = w->s + tile;
    w->acc = w->ds + tile;
    w->row_max = w->acc + (size_t)ATTN_QT * c->HS;
    w->row_sum = w->row_max + ATTN_QT;
    float *next = w->row_sum + ATTN_QT;
    for (int i = 0; packed && i < c->nbufs; i++) {
        c->bufs[i].packed = next;
        next += (size_t)c->bufs[i].rows * c->HS;
    }
    return 0;
}

static void attn_end(attn_call *c)
{
    free(c->pos.owned);
    free(c->mem);
}

/* Head h of batch b of each buffer: in place for f32, else its packed
 * copy, read in when the buffer is. */
static void open_heads(const attn_call *c, int b, int h, head_rows *heads)
{
    for (int i = 0; i < c->nbufs; i++) {
        const head_buf *t = &c->bufs[i];
        if (c->dtype == LOOM_F32) {
            heads[i] = f32_head(t->out ? t->out : t->in, b, h, t->rows, c->NH, c->HS);
            continue;
        }
        if (t->in)
            gather_head(t->packed, t->in, c->dtype, b, h, t->rows, c->NH, c->HS);
        heads[i] = packed_head(t->packed, c->HS);
    }
}

/* ... and written back, rounded, where the buffer is written. */
static void close_heads(const attn_call *c, int b, int h)
{
    for (int i = 0; c->dtype != LOOM_F32 && i < c->nbufs; i++) {
        const head_buf *t = &c->bufs[i];
        if (t->out)
            scatter_head(t->out, c->dtype, t->packed, b, h, t->rows, c->NH, c->HS);
    }
}

static void attention_block_forward(const void *q, const int *q_pos, int tq, const void *k,
                                    const void *v, const int *k_pos, int tk, int B, int NH,
                                    int HS, loom_dtype dtype, void *out, float *lse,
                                    int first_block)
{
    enum { Q, K, V, OUT, NBUFS };
    /* a first block overwrites out */
    head_buf bufs[NBUFS] = {{q, NULL, tq, NULL}, {k, NULL, tk, NULL}, {v, NULL, tk, NULL},
                            {first_block ? NULL : out, out, tq, NULL}};
    attn_call c = {.B = B, .NH = NH, .HS = HS, .dtype = dtype, .bufs = bufs, .nbufs = NBUFS};
    if (attn_begin(&c, "forward", q_pos, tq, k_pos, tk) != 0) {
        poison(lse, LOOM_F32, (size_t)B * NH * tq);
        return;
    }
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            head_rows r[NBUFS];
            open_heads(&c, b, h, r);
            forward_head(r[Q], c.pos.q, tq, r[K], r[V], c.pos.k, tk, HS, c.scale, r[OUT],
                         lse + ((size_t)b * NH + h) * tq, first_block, &c.w);
            close_heads(&c, b, h);
        }
    }
    attn_end(&c);
}

static void attention_block_backward(const void *q, const int *q_pos, int tq, const void *k,
                                     const void *v, const int *k_pos, int tk, int B, int NH,
                                     int HS, loom_dtype dtype, const void *out, const void *dout,
                                     const float *lse, void *dq, void *dk, void *dv)
{
    enum { Q, OUT, DOUT, DQ, K, V, DK, DV, NBUFS };
    /* dq, dk and dv accumulate */
    head_buf bufs[NBUFS] = {{q, NULL, tq, NULL},  {out, NULL, tq, NULL}, {dout, NULL, tq, NULL},
                            {dq, dq, tq, NULL},   {k, NULL, tk, NULL},   {v, NULL, tk, NULL},
                            {dk, dk, tk, NULL},   {dv, dv, tk, NULL}};
    attn_call c = {.B = B, .NH = NH, .HS = HS, .dtype = dtype, .bufs = bufs, .nbufs = NBUFS};
    if (attn_begin(&c, "backward", q_pos, tq, k_pos, tk) != 0)
        return;
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            head_rows r[NBUFS];
            open_heads(&c, b, h, r);
            backward_head(r[Q], c.pos.q, tq, r[K], r[V], c.pos.k, tk, HS, c.scale, r[OUT],
                          r[DOUT], lse + ((size_t)b * NH + h) * tq, r[DQ], r[DK], r[DV], &c.w);
            close_heads(&c, b, h);
        }
    }
    attn_end(&c);
}

const loom_attention_kernels loom_attention_kernels_cpu = {
    .struct_size = sizeof(loom_attention_kernels),
    .block_forward = attention_block_forward,
    .block_backward = attention_block_backward,
};

void loom_attention_forward(float *out, float *lse, const float *q, const float *k,
                            const float *v, int B, int T, int NH, int HS)
{
    attention_block_forward(q, NULL, T, k, v, NULL, T, B, NH, HS, LOOM_F32, out, lse, 1);
}

void loom_attention_backward(float *dq, float *dk, float *dv, const float *q, const float *k,
                             const float *v, const float *out, const float *dout,
                             const float *lse, int B, int T, int NH, int HS)
{
    attention_block_backward(q, NULL, T, k, v, NULL, T, B, NH, HS, LOOM_F32, out, dout, lse, dq,
                             dk, dv);
}
