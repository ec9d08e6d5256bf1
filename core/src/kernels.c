/* loom core — the GPT-2 kernels of llm.c's train_gpt2.c, fp32 on the CPU.
 *
 * Matrix products go to cblas_sgemm. Everything else is plain loops over
 * contiguous rows with restrict pointers so -O2 vectorises them. Float
 * reductions are summed in 8 independent lanes: the compiler may not
 * reorder a single running sum (no -ffast-math), but it does vectorise 8
 * separate ones, and the order stays fixed, so results are deterministic.
 * Attention lives in kernels_attention.c. */
#include "kernels.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "loom_internal.h"

#define LAYERNORM_EPS 1e-5f
#define GELU_SCALING_FACTOR 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBIC 0.044715f

void loom_kernels_set_threads(int threads)
{
    openblas_set_num_threads(threads > 0 ? threads : 1);
}

/* ---------------------------------------------------------------- helpers */

static inline float lanes_total(const float *lane)
{
    return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

/* The elementwise loops below are blocked by 8 with a fixed inner loop:
 * -O2's cost model (very-cheap) vectorises only loops that need no scalar
 * epilogue and no run-time alias check, which a fixed 8-iteration loop on
 * restrict parameters is. */

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

static void layernorm_row_backward(float *restrict dx, float *restrict dw, float *restrict db,
                                   const float *restrict d, const float *restrict x,
                                   const float *restrict w, float m, float s, int C)
{
    /* the two means the input gradient needs: of w*dout and of w*dout*norm */
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
    for (i = 0; i + 8 <= C; i += 8)
        for (int l = 0; l < 8; l++) {
            float norm = (x[i + l] - m) * s;
            float dnorm = w[i + l] * d[i + l];
            db[i + l] += d[i + l];
            dw[i + l] += norm * d[i + l];
            dx[i + l] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    for (; i < C; i++) {
        float norm = (x[i] - m) * s;
        float dnorm = w[i] * d[i];
        db[i] += d[i];
        dw[i] += norm * d[i];
        dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
}

void loom_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                             const float *inp, const float *weight, const float *mean,
                             const float *rstd, int N, int C)
{
    for (int n = 0; n < N; n++)
        layernorm_row_backward(dinp + (size_t)n * C, dweight, dbias, dout + (size_t)n * C,
                               inp + (size_t)n * C, weight, mean[n], rstd[n], C);
}

/* ----------------------------------------------------------------- matmul */

void loom_matmul_forward(float *out, const float *inp, const float *weight, const float *bias,
                         int N, int C, int OC)
{
    /* Start from the bias so sgemm can add onto it in the same pass. */
    float beta = 0.0f;
    if (bias) {
        for (int n = 0; n < N; n++)
            memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C,
                beta, out, OC);
}

void loom_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, int N, int C, int OC)
{
    if (dinp) /* (N, C) += (N, OC) · (OC, C) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight,
                    C, 1.0f, dinp, C);
    /* (OC, C) += (OC, N) · (N, C) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
                dweight, C);
    if (dbias) {
        for (int n = 0; n < N; n++)
            vec_acc(dbias, dout + (size_t)n * OC, OC);
    }
}

/* ------------------------------------------------------------------- gelu */

void loom_gelu_forward(float *out, const float *inp, int N)
{
    float *restrict o = out;
    const float *restrict x = inp;
    for (int i = 0; i < N; i++) {
        float xi = x[i];
        float cube = GELU_CUBIC * xi * xi * xi;
        o[i] = 0.5f * xi * (1.0f + tanhf(GELU_SCALING_FACTOR * (xi + cube)));
    }
}

void loom_gelu_backward(float *dinp, const float *inp, const float *dout, int N)
{
    float *restrict dx = dinp;
    const float *restrict x = inp;
    const float *restrict d = dout;
    for (int i = 0; i < N; i++) {
        float xi = x[i];
        float cube = GELU_CUBIC * xi * xi * xi;
        float arg = GELU_SCALING_FACTOR * (xi + cube);
        float th = tanhf(arg);
        float ch = coshf(arg);
        float sech2 = 1.0f / (ch * ch);
        float local = 0.5f * (1.0f + th) +
                      xi * 0.5f * sech2 * GELU_SCALING_FACTOR * (1.0f + 3.0f * GELU_CUBIC * xi * xi);
        dx[i] += local * d[i];
    }
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

static void softmax_row(float *restrict p, const float *restrict x, int V, int Vp)
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
    for (i = 0; i < V; i++)
        p[i] = expf(x[i] - maxval);
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

void loom_convert(void *dst, loom_dtype dst_type, const void *src, loom_dtype src_type, size_t n)
{
    if (dst_type == src_type) {
        memmove(dst, src, n * loom_dtype_size(src_type));
        return;
    }
    if (src_type == LOOM_F32 && dst_type == LOOM_BF16) {
        const float *restrict s = src;
        uint16_t *restrict d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = loom_f32_to_bf16(s[i]);
    } else if (src_type == LOOM_F32 && dst_type == LOOM_F16) {
        const float *restrict s = src;
        uint16_t *restrict d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = loom_f32_to_f16(s[i]);
    } else if (src_type == LOOM_BF16 && dst_type == LOOM_F32) {
        const uint16_t *restrict s = src;
        float *restrict d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = loom_bf16_to_f32(s[i]);
    } else if (src_type == LOOM_F16 && dst_type == LOOM_F32) {
        const uint16_t *restrict s = src;
        float *restrict d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = loom_f16_to_f32(s[i]);
    } else if (src_type == LOOM_BF16 && dst_type == LOOM_F16) {
        /* exact through f32: every bf16 is an f32 */
        const uint16_t *restrict s = src;
        uint16_t *restrict d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = loom_f32_to_f16(loom_bf16_to_f32(s[i]));
    } else if (src_type == LOOM_F16 && dst_type == LOOM_BF16) {
        const uint16_t *restrict s = src;
        uint16_t *restrict d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = loom_f32_to_bf16(loom_f16_to_f32(s[i]));
    } else {
        loom_fail(LOOM_ERR_NOT_SUPPORTED, "loom_convert: %s to %s is not a conversion loom has",
                  loom_dtype_name(src_type), loom_dtype_name(dst_type));
    }
}
