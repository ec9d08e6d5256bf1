/* loom core — the GPT-2 kernels of llm.c's train_gpt2.c, fp32 on the CPU.
 *
 * Matrix products go to loom_gemm (gemm.h), attention's small tiles too,
 * from the heads' threads at once. Everything else is plain loops over contiguous rows, written
 * so that the compiler vectorises them (see "helpers"). Float reductions
 * are summed in 8 or 16
 * independent lanes in a fixed order, so results are deterministic.
 *
 * Threads (train.threads, OpenMP) split rows, or columns where a loop sums
 * over rows, never a sum: each value is computed by one thread in the
 * order a single thread would, so every thread count gives the same bits.
 *
 * Three fusions follow llm.c's CUDA trainer: the residual sum with the
 * LayerNorm that reads it, the MLP's bias with its GELU, and softmax with
 * cross-entropy (the loss from the logits and their log-sum-exp; backward
 * writes the logits' gradient over them).
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

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* The build targets baseline x86-64 (SSE2); the loops also come in AVX2
 * and AVX-512 versions (LOOM_WIDE_LOOP, kernels.h). Loops that compute
 * (exp, division) take 512-bit vectors; loops that stream memory stop at
 * 256 bits, which moved 8-10% more bytes per second here (Zen 4) once the
 * data left the L2. */
#define WIDE_LOOP LOOM_WIDE_LOOP
#define STREAM_LOOP LOOM_STREAM_LOOP
#define INLINE LOOM_INLINE

#define LAYERNORM_EPS 1e-5f
#define GELU_SCALING_FACTOR 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBIC 0.044715f

/* ---------------------------------------------------------------- threads */

static int kernel_threads = 1;

void loom_kernels_set_threads(int threads)
{
    kernel_threads = threads > 0 ? threads : 1;
    loom_gemm_set_threads(kernel_threads); /* OpenBLAS's, and OpenMP's for oneDNN */
}

int loom_kernels_threads(void) { return kernel_threads; }

/* Loops over fewer elements than this stay on the calling thread: a
 * parallel region costs microseconds. */
#define PARALLEL_MIN_WORK 32768

static int threads_for(size_t work) { return work < PARALLEL_MIN_WORK ? 1 : kernel_threads; }

/* PARALLEL_FOR(nt) before a for loop: its iterations split in nt equal
 * parts, one a thread. */
#ifdef _OPENMP
#define PRAGMA(x) _Pragma(#x)
#define PARALLEL_FOR(nt) PRAGMA(omp parallel for num_threads(nt) schedule(static) if (nt > 1))
static int thread_index(void) { return omp_get_thread_num(); }
#else
#define PARALLEL_FOR(nt) (void)(nt);
static int thread_index(void) { return 0; }
#endif

/* The statement for each part p = 0 .. nt-1, part p on thread p; one part
 * runs on the calling thread outside OpenMP, whose region costs half a
 * microsecond even with one thread (the attention's gather calls
 * loom_convert per row). */
#define FOR_PARTS(nt, ...)                                                                         \
    do {                                                                                           \
        if ((nt) == 1) {                                                                           \
            const int p = 0;                                                                       \
            __VA_ARGS__;                                                                           \
        } else {                                                                                   \
            PARALLEL_FOR(nt)                                                                       \
            for (int p = 0; p < (nt); p++) {                                                       \
                __VA_ARGS__;                                                                       \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* Part p of `parts` of [0, n), cut at multiples of `align`. */
static size_t part_begin(size_t n, int parts, int p, size_t align)
{
    size_t b = (n + align - 1) / align * (size_t)p / (size_t)parts * align;
    return b < n ? b : n;
}

/* Elements go in parts of whole cache lines, so no two threads write one. */
#define LINE_FLOATS 16

void loom_kernels_for_spans(size_t n, void (*fn)(void *ctx, size_t begin, size_t end), void *ctx)
{
    const int nt = threads_for(n);
    FOR_PARTS(nt, {
        size_t b = part_begin(n, nt, p, LINE_FLOATS), e = part_begin(n, nt, p + 1, LINE_FLOATS);
        if (e > b)
            fn(ctx, b, e);
    });
}

/* c = alpha · op(a) · op(b) + beta · c on f32 rows, multiplied as the
 * run's matrix products are. */
static void product(int ta, int tb, int M, int N, int K, float alpha, const float *a, int lda,
                    const float *b, int ldb, float beta, float *c, int ldc, loom_dtype multiply)
{
    loom_gemm(c, ldc, M, N, K, loom_gemm_f32(a, lda, ta), loom_gemm_f32(b, ldb, tb), alpha, beta,
              multiply);
}

/* ---------------------------------------------------------------- helpers */

INLINE float lanes_total(const float *lane)
{
    return ((lane[0] + lane[4]) + (lane[1] + lane[5])) +
           ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

INLINE float lanes16_total(const float *lane)
{
    float half[8];
    for (int l = 0; l < 8; l++)
        half[l] = lane[l] + lane[l + 8];
    return lanes_total(half);
}

/* The elementwise loops are blocked by 16 with a fixed inner loop: -O2's
 * cost model (very-cheap) vectorises only loops that need no scalar
 * epilogue and no run-time alias check, which a fixed 16-iteration loop on
 * restrict parameters is. Conditionals inside them select on integers. */

/* y += x */
INLINE void vec_acc(float *restrict y, const float *restrict x, int n)
{
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++)
            y[i + l] += x[i + l];
    for (; i < n; i++)
        y[i] += x[i];
}

/* o = a + b */
INLINE void vec_add(float *restrict o, const float *restrict a, const float *restrict b,
                    int n)
{
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++)
            o[i + l] = a[i + l] + b[i + l];
    for (; i < n; i++)
        o[i] = a[i] + b[i];
}

/* y = a * x */
INLINE void vec_scale(float *restrict y, float a, const float *restrict x, int n)
{
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++)
            y[i + l] = a * x[i + l];
    for (; i < n; i++)
        y[i] = a * x[i];
}

/* y = a * y + b * x */
INLINE void vec_blend(float *restrict y, float a, float b, const float *restrict x, int n)
{
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++)
            y[i + l] = a * y[i + l] + b * x[i + l];
    for (; i < n; i++)
        y[i] = a * y[i] + b * x[i];
}

INLINE float sum_f32(const float *restrict x, int n)
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

INLINE float dot_f32(const float *restrict a, const float *restrict b, int n)
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

/* max of x[0..n), -inf for n = 0; exact whatever the order */
INLINE float max_f32(const float *restrict x, int n)
{
    float lane[16];
    for (int l = 0; l < 16; l++)
        lane[l] = -INFINITY;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++)
            lane[l] = x[i + l] > lane[l] ? x[i + l] : lane[l];
    float m = -INFINITY;
    for (int l = 0; l < 16; l++)
        m = lane[l] > m ? lane[l] : m;
    for (; i < n; i++)
        m = x[i] > m ? x[i] : m;
    return m;
}

/* A float's bits and back (C11 reads a union through its other member). */
typedef union float_bits {
    float f;
    uint32_t u;
} float_bits;

INLINE uint32_t as_bits(float f) { return ((float_bits){.f = f}).u; }

INLINE float as_float(uint32_t u) { return ((float_bits){.u = u}).f; }

/* exp(x) within 2 ulp (Cody-Waite reduction, Cephes' degree-6 polynomial),
 * branch-free so loops of it vectorise. x < -87 gives 0, x > 88 +inf, NaN
 * NaN. */
INLINE float exp_fast(float x)
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

INLINE void encoder_rows_loop(float *out, const int *inp, const int *pos, const float *wte,
                              const float *wpe, int T, int C, int r0, int r1)
{
    for (int r = r0; r < r1; r++) {
        const float *te = wte + (size_t)inp[r] * C;
        const float *pe = wpe + (size_t)(pos ? pos[r % T] : r % T) * C;
        vec_add(out + (size_t)r * C, te, pe, C);
    }
}
STREAM_LOOP(encoder_rows,
            (float *out, const int *inp, const int *pos, const float *wte, const float *wpe, int T,
             int C, int r0, int r1),
            (out, inp, pos, wte, wpe, T, C, r0, r1))

void loom_encoder_forward(float *out, const int *inp, const int *pos, const float *wte,
                          const float *wpe, int B, int T, int C)
{
    const int N = B * T, nt = threads_for((size_t)N * C);
    FOR_PARTS(nt, encoder_rows(out, inp, pos, wte, wpe, T, C, (int)part_begin(N, nt, p, 1),
                               (int)part_begin(N, nt, p + 1, 1)));
}

/* Rows that share a token (or a position) add into the same gradient row,
 * so threads split the columns; each column adds its rows in order. */
INLINE void encoder_backward_columns_loop(float *dwte, float *dwpe, const float *dout,
                                          const int *inp, const int *pos, int N, int T, int C,
                                          int c0, int c1)
{
    for (int r = 0; r < N; r++) {
        const float *d = dout + (size_t)r * C + c0;
        vec_acc(dwte + (size_t)inp[r] * C + c0, d, c1 - c0);
        vec_acc(dwpe + (size_t)(pos ? pos[r % T] : r % T) * C + c0, d, c1 - c0);
    }
}
STREAM_LOOP(encoder_backward_columns,
            (float *dwte, float *dwpe, const float *dout, const int *inp, const int *pos, int N,
             int T, int C, int c0, int c1),
            (dwte, dwpe, dout, inp, pos, N, T, C, c0, c1))

void loom_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp,
                           const int *pos, int B, int T, int C)
{
    const int N = B * T, nt = threads_for((size_t)N * C);
    FOR_PARTS(nt, encoder_backward_columns(dwte, dwpe, dout, inp, pos, N, T, C,
                                           (int)part_begin(C, nt, p, LINE_FLOATS),
                                           (int)part_begin(C, nt, p + 1, LINE_FLOATS)));
}

/* -------------------------------------------------------------- layernorm */

INLINE void layernorm_row(float *restrict o, float *mean, float *rstd,
                          const float *restrict x, const float *restrict w,
                          const float *restrict bias, int C)
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
    for (i = 0; i + 16 <= C; i += 16)
        for (int l = 0; l < 16; l++)
            o[i + l] = (s * (x[i + l] - m)) * w[i + l] + bias[i + l];
    for (; i < C; i++)
        o[i] = (s * (x[i] - m)) * w[i] + bias[i];
    *mean = m;
    *rstd = s;
}

INLINE void layernorm_rows_loop(float *out, float *mean, float *rstd, const float *inp,
                                const float *weight, const float *bias, int C, int r0, int r1)
{
    for (int r = r0; r < r1; r++)
        layernorm_row(out + (size_t)r * C, mean + r, rstd + r, inp + (size_t)r * C, weight, bias,
                      C);
}
STREAM_LOOP(layernorm_rows,
            (float *out, float *mean, float *rstd, const float *inp, const float *weight,
             const float *bias, int C, int r0, int r1),
            (out, mean, rstd, inp, weight, bias, C, r0, r1))

void loom_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, const float *bias, int N, int C)
{
    const int nt = threads_for((size_t)N * C);
    FOR_PARTS(nt, layernorm_rows(out, mean, rstd, inp, weight, bias, C,
                                 (int)part_begin(N, nt, p, 1), (int)part_begin(N, nt, p + 1, 1)));
}

/* Each row's sum is written, then normalised while it is still in L1. */
INLINE void residual_layernorm_rows_loop(float *res, float *out, float *mean, float *rstd,
                                         const float *a, const float *b, const float *weight,
                                         const float *bias, int C, int r0, int r1)
{
    for (int r = r0; r < r1; r++) {
        const size_t o = (size_t)r * C;
        vec_add(res + o, a + o, b + o, C);
        layernorm_row(out + o, mean + r, rstd + r, res + o, weight, bias, C);
    }
}
STREAM_LOOP(residual_layernorm_rows,
            (float *res, float *out, float *mean, float *rstd, const float *a, const float *b,
             const float *weight, const float *bias, int C, int r0, int r1),
            (res, out, mean, rstd, a, b, weight, bias, C, r0, r1))

void loom_residual_layernorm_forward(float *res, float *out, float *mean, float *rstd,
                                     const float *a, const float *b, const float *weight,
                                     const float *bias, int N, int C)
{
    const int nt = threads_for((size_t)N * C);
    FOR_PARTS(nt, residual_layernorm_rows(res, out, mean, rstd, a, b, weight, bias, C,
                                          (int)part_begin(N, nt, p, 1),
                                          (int)part_begin(N, nt, p + 1, 1)));
}

/* The input gradient of one row: the two means it needs (of w*dout and of
 * w*dout*norm), then each element. */
INLINE void layernorm_row_backward_input(float *restrict dx, const float *restrict d,
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
    for (i = 0; i + 16 <= C; i += 16)
        for (int l = 0; l < 16; l++) {
            float norm = (x[i + l] - m) * s;
            float dnorm = w[i + l] * d[i + l];
            dx[i + l] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    for (; i < C; i++) {
        float norm = (x[i] - m) * s;
        float dnorm = w[i] * d[i];
        dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
}

INLINE void layernorm_backward_input_rows_loop(float *dinp, const float *dout, const float *inp,
                                               const float *weight, const float *mean,
                                               const float *rstd, int C, int r0, int r1)
{
    for (int r = r0; r < r1; r++) {
        const size_t o = (size_t)r * C;
        layernorm_row_backward_input(dinp + o, dout + o, inp + o, weight, mean[r], rstd[r], C);
    }
}
STREAM_LOOP(layernorm_backward_input_rows,
            (float *dinp, const float *dout, const float *inp, const float *weight,
             const float *mean, const float *rstd, int C, int r0, int r1),
            (dinp, dout, inp, weight, mean, rstd, C, r0, r1))

void loom_layernorm_backward_input(float *dinp, const float *dout, const float *inp,
                                   const float *weight, const float *mean, const float *rstd,
                                   int N, int C)
{
    const int nt = threads_for((size_t)N * C);
    FOR_PARTS(nt, layernorm_backward_input_rows(dinp, dout, inp, weight, mean, rstd, C,
                                                (int)part_begin(N, nt, p, 1),
                                                (int)part_begin(N, nt, p + 1, 1)));
}

/* Columns [c0, c1) of dweight and dbias, summing the rows in order. */
INLINE void layernorm_backward_weight_columns_loop(float *restrict dw, float *restrict db,
                                                   const float *dout, const float *inp,
                                                   const float *mean, const float *rstd, int N,
                                                   int C, int c0, int c1)
{
    const int n = c1 - c0;
    dw += c0;
    db += c0;
    for (int r = 0; r < N; r++) {
        const float *restrict d = dout + (size_t)r * C + c0;
        const float *restrict x = inp + (size_t)r * C + c0;
        const float m = mean[r], s = rstd[r];
        int i = 0;
        for (; i + 16 <= n; i += 16)
            for (int l = 0; l < 16; l++) {
                float norm = (x[i + l] - m) * s;
                db[i + l] += d[i + l];
                dw[i + l] += norm * d[i + l];
            }
        for (; i < n; i++) {
            float norm = (x[i] - m) * s;
            db[i] += d[i];
            dw[i] += norm * d[i];
        }
    }
}
STREAM_LOOP(layernorm_backward_weight_columns,
            (float *restrict dw, float *restrict db, const float *dout, const float *inp,
             const float *mean, const float *rstd, int N, int C, int c0, int c1),
            (dw, db, dout, inp, mean, rstd, N, C, c0, c1))

void loom_layernorm_backward_weight(float *dweight, float *dbias, const float *dout,
                                    const float *inp, const float *mean, const float *rstd,
                                    int N, int C)
{
    const int nt = threads_for((size_t)N * C);
    FOR_PARTS(nt, layernorm_backward_weight_columns(dweight, dbias, dout, inp, mean, rstd, N, C,
                                                    (int)part_begin(C, nt, p, LINE_FLOATS),
                                                    (int)part_begin(C, nt, p + 1, LINE_FLOATS)));
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

/* dbias += column sums of dout: threads split the columns */
INLINE void bias_backward_columns_loop(float *dbias, const float *dout, int N, int OC, int c0,
                                       int c1)
{
    for (int n = 0; n < N; n++)
        vec_acc(dbias + c0, dout + (size_t)n * OC + c0, c1 - c0);
}
STREAM_LOOP(bias_backward_columns, (float *dbias, const float *dout, int N, int OC, int c0, int c1),
            (dbias, dout, N, OC, c0, c1))

static void matmul_bias_backward(float *dbias, const float *dout, int N, int OC)
{
    const int nt = threads_for((size_t)N * OC);
    FOR_PARTS(nt, bias_backward_columns(dbias, dout, N, OC, (int)part_begin(OC, nt, p, LINE_FLOATS),
                                        (int)part_begin(OC, nt, p + 1, LINE_FLOATS)));
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
INLINE float gelu_arg(float x)
{
    return GELU_SCALING_FACTOR * (x + GELU_CUBIC * x * x * x);
}

/* σ(2a) and σ(2a)·(1 - σ(2a)) */
INLINE float gelu_gate(float a, float *slope)
{
    const uint32_t ab = as_bits(a);
    const float e = exp_fast(as_float(as_bits(2.0f * a) | 0x80000000u)); /* exp(-2|a|) */
    const float inv = 1.0f / (1.0f + e);
    const uint32_t neg = 0u - (ab >> 31);
    *slope = e * inv * inv;
    return as_float((as_bits(inv) & ~neg) | (as_bits(e * inv) & neg));
}

INLINE void gelu_values(float *restrict o, const float *restrict x, int n)
{
    float slope;
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++)
            o[i + l] = x[i + l] * gelu_gate(gelu_arg(x[i + l]), &slope);
    for (; i < n; i++)
        o[i] = x[i] * gelu_gate(gelu_arg(x[i]), &slope);
}

INLINE void gelu_forward_span_loop(float *o, const float *x, int n) { gelu_values(o, x, n); }
WIDE_LOOP(gelu_forward_span, (float *o, const float *x, int n), (o, x, n))

/* d/dx x·σ(2a) = σ(2a) + x·2σ(2a)(1 - σ(2a))·a'(x), a' = sqrt(2/pi)·(1 + 3·0.044715·x²);
 * the same as llm.c's 0.5(1 + tanh a) + x·0.5·sech²(a)·a'(x). */
INLINE float gelu_local_grad(float x)
{
    float slope;
    const float gate = gelu_gate(gelu_arg(x), &slope);
    return gate + 2.0f * x * slope * GELU_SCALING_FACTOR * (1.0f + 3.0f * GELU_CUBIC * x * x);
}

INLINE void gelu_backward_span_loop(float *restrict dx, const float *restrict x,
                                    const float *restrict d, int n)
{
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++)
            dx[i + l] += gelu_local_grad(x[i + l]) * d[i + l];
    for (; i < n; i++)
        dx[i] += gelu_local_grad(x[i]) * d[i];
}
WIDE_LOOP(gelu_backward_span,
          (float *restrict dx, const float *restrict x, const float *restrict d, int n),
          (dx, x, d, n))

void loom_gelu_forward(float *out, const float *inp, int N)
{
    const int nt = threads_for((size_t)N);
    FOR_PARTS(nt, {
        const size_t b = part_begin(N, nt, p, LINE_FLOATS);
        const size_t e = part_begin(N, nt, p + 1, LINE_FLOATS);
        gelu_forward_span(out + b, inp + b, (int)(e - b));
    });
}

void loom_gelu_backward(float *dinp, const float *inp, const float *dout, int N)
{
    const int nt = threads_for((size_t)N);
    FOR_PARTS(nt, {
        const size_t b = part_begin(N, nt, p, LINE_FLOATS);
        const size_t e = part_begin(N, nt, p + 1, LINE_FLOATS);
        gelu_backward_span(dinp + b, inp + b, dout + b, (int)(e - b));
    });
}

INLINE void bias_gelu_rows_loop(float *out, float *pre, const float *bias, int C, int r0, int r1)
{
    for (int r = r0; r < r1; r++) {
        float *x = pre + (size_t)r * C;
        vec_acc(x, bias, C);
        gelu_values(out + (size_t)r * C, x, C);
    }
}
WIDE_LOOP(bias_gelu_rows, (float *out, float *pre, const float *bias, int C, int r0, int r1),
          (out, pre, bias, C, r0, r1))

void loom_bias_gelu_forward(float *out, float *pre, const float *bias, int N, int C)
{
    const int nt = threads_for((size_t)N * C);
    FOR_PARTS(nt, bias_gelu_rows(out, pre, bias, C, (int)part_begin(N, nt, p, 1),
                                 (int)part_begin(N, nt, p + 1, 1)));
}

/* --------------------------------------------------------------- residual */

INLINE void residual_span_loop(float *o, const float *a, const float *b, int n)
{
    vec_add(o, a, b, n);
}
STREAM_LOOP(residual_span, (float *o, const float *a, const float *b, int n), (o, a, b, n))

INLINE void residual_backward_span_loop(float *da, float *db, const float *d, int n)
{
    vec_acc(da, d, n);
    vec_acc(db, d, n);
}
STREAM_LOOP(residual_backward_span, (float *da, float *db, const float *d, int n), (da, db, d, n))

void loom_residual_forward(float *out, const float *a, const float *b, int N)
{
    const int nt = threads_for((size_t)N);
    FOR_PARTS(nt, {
        const size_t s = part_begin(N, nt, p, LINE_FLOATS);
        const size_t e = part_begin(N, nt, p + 1, LINE_FLOATS);
        residual_span(out + s, a + s, b + s, (int)(e - s));
    });
}

void loom_residual_backward(float *da, float *db, const float *dout, int N)
{
    const int nt = threads_for((size_t)N);
    FOR_PARTS(nt, {
        const size_t s = part_begin(N, nt, p, LINE_FLOATS);
        const size_t e = part_begin(N, nt, p + 1, LINE_FLOATS);
        residual_backward_span(da + s, db + s, dout + s, (int)(e - s));
    });
}

/* ---------------------------------------------------- softmax and the loss */

/* Per row: the max m of the V real logits, then Σ exp(x - m) in 16 lanes,
 * a row's 200 KB (GPT-2's vocabulary) read the second time from L2. The
 * loss is llm.c's -log p_target, p_target = exp(x_target - m) / Σ, which
 * is inf once p_target underflows (how a diverged run shows), and
 * lse = m + log Σ what backward needs; no probabilities are stored. */
INLINE void softmax_crossentropy_rows_loop(float *losses, float *lse, const float *logits,
                                           const int *targets, int V, int Vp, int r0, int r1)
{
    for (int r = r0; r < r1; r++) {
        const float *restrict x = logits + (size_t)r * Vp;
        const float m = max_f32(x, V);
        float lane[16] = {0};
        int i = 0;
        for (; i + 16 <= V; i += 16)
            for (int l = 0; l < 16; l++)
                lane[l] += exp_fast(x[i + l] - m);
        float sum = lanes16_total(lane);
        for (; i < V; i++)
            sum += exp_fast(x[i] - m);
        lse[r] = m + logf(sum);
        losses[r] = -logf(exp_fast(x[targets[r]] - m) / sum);
    }
}
WIDE_LOOP(softmax_crossentropy_rows,
          (float *losses, float *lse, const float *logits, const int *targets, int V, int Vp,
           int r0, int r1),
          (losses, lse, logits, targets, V, Vp, r0, r1))

void loom_softmax_crossentropy_forward(float *losses, float *lse, const float *logits,
                                       const int *targets, int N, int V, int Vp)
{
    const int nt = threads_for((size_t)N * Vp);
    FOR_PARTS(nt, softmax_crossentropy_rows(losses, lse, logits, targets, V, Vp,
                                            (int)part_begin(N, nt, p, 1),
                                            (int)part_begin(N, nt, p + 1, 1)));
}

/* dlogit_i = (p_i - [i = target])·dloss with p_i = exp(x_i - lse), over x */
INLINE void softmax_crossentropy_backward_rows_loop(float *logits, const float *dlosses,
                                                    const float *lse, const int *targets, int V,
                                                    int Vp, int r0, int r1)
{
    for (int r = r0; r < r1; r++) {
        float *restrict x = logits + (size_t)r * Vp;
        const float L = lse[r], d = dlosses[r];
        const int t = targets[r];
        const float p_target = exp_fast(x[t] - L);
        int i = 0;
        for (; i + 16 <= V; i += 16)
            for (int l = 0; l < 16; l++)
                x[i + l] = exp_fast(x[i + l] - L) * d;
        for (; i < V; i++)
            x[i] = exp_fast(x[i] - L) * d;
        for (i = V; i < Vp; i++)
            x[i] = 0.0f;
        x[t] = (p_target - 1.0f) * d; /* rounded once, like the rest */
    }
}
WIDE_LOOP(softmax_crossentropy_backward_rows,
          (float *logits, const float *dlosses, const float *lse, const int *targets, int V, int Vp,
           int r0, int r1),
          (logits, dlosses, lse, targets, V, Vp, r0, r1))

void loom_softmax_crossentropy_backward(float *logits, const float *dlosses, const float *lse,
                                        const int *targets, int N, int V, int Vp)
{
    const int nt = threads_for((size_t)N * Vp);
    FOR_PARTS(nt, softmax_crossentropy_backward_rows(logits, dlosses, lse, targets, V, Vp,
                                                     (int)part_begin(N, nt, p, 1),
                                                     (int)part_begin(N, nt, p + 1, 1)));
}

/* ------------------------------------------------------------- conversion */

/* The portable paths: tensor.h's conversions, bf16's without its branch so
 * the loop vectorises (round to nearest even; NaN keeps its sign and top
 * payload, quieted). The native ones use the CPU's instructions and must
 * give the same bits (tests/kernels compares them): where an instruction
 * rounds otherwise (AVX-512 BF16 flushes subnormals to 0; F16C keeps a
 * NaN's payload), the block it met is done again the portable way. */
INLINE void f32_to_bf16_values(uint16_t *restrict d, const float *restrict s, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) {
            const uint32_t u = as_bits(s[i + l]);
            const uint32_t nan = 0u - (uint32_t)((u & 0x7fffffffu) > 0x7f800000u);
            const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
            d[i + l] = (uint16_t)((rounded & ~nan) | (((u >> 16) | 0x40u) & nan));
        }
    for (; i < n; i++)
        d[i] = loom_f32_to_bf16(s[i]);
}

INLINE void bf16_to_f32_values(float *restrict d, const uint16_t *restrict s, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++)
            d[i + l] = as_float((uint32_t)s[i + l] << 16);
    for (; i < n; i++)
        d[i] = loom_bf16_to_f32(s[i]);
}

static void f32_to_f16_values(uint16_t *restrict d, const float *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = loom_f32_to_f16(s[i]);
}

static void f16_to_f32_values(float *restrict d, const uint16_t *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = loom_f16_to_f32(s[i]);
}

/* The span converters, all of one type: (dst, src, n). */
typedef void (*convert_fn)(void *dst, const void *src, size_t n);

INLINE void f32_to_bf16_portable_loop(void *d, const void *s, size_t n)
{
    f32_to_bf16_values(d, s, n);
}
STREAM_LOOP(f32_to_bf16_portable, (void *d, const void *s, size_t n), (d, s, n))

INLINE void bf16_to_f32_portable_loop(void *d, const void *s, size_t n)
{
    bf16_to_f32_values(d, s, n);
}
STREAM_LOOP(bf16_to_f32_portable, (void *d, const void *s, size_t n), (d, s, n))

static void f32_to_f16_portable(void *d, const void *s, size_t n) { f32_to_f16_values(d, s, n); }

static void f16_to_f32_portable(void *d, const void *s, size_t n) { f16_to_f32_values(d, s, n); }

#if defined(__x86_64__) && defined(__GNUC__)
#define NATIVE_CONVERT 1

__attribute__((target("avx512f,avx512bf16"))) static void
f32_to_bf16_avx512(void *dst, const void *src, size_t n)
{
    uint16_t *d = dst;
    const float *s = src;
    const __m512i exponent = _mm512_set1_epi32(0x7f800000), mantissa = _mm512_set1_epi32(0x7fffff);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 lo = _mm512_loadu_ps(s + i), hi = _mm512_loadu_ps(s + i + 16);
        const __m512i lo_bits = _mm512_castps_si512(lo), hi_bits = _mm512_castps_si512(hi);
        /* subnormal: exponent 0, mantissa not */
        const __mmask16 sub_lo = _mm512_mask_test_epi32_mask(
                            _mm512_testn_epi32_mask(lo_bits, exponent), lo_bits, mantissa),
                        sub_hi = _mm512_mask_test_epi32_mask(
                            _mm512_testn_epi32_mask(hi_bits, exponent), hi_bits, mantissa);
        if (sub_lo | sub_hi)
            f32_to_bf16_portable(d + i, s + i, 32);
        else
            _mm512_storeu_si512((void *)(d + i), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
    f32_to_bf16_portable(d + i, s + i, n - i);
}

__attribute__((target("avx2,f16c"))) static void f32_to_f16_f16c(void *dst, const void *src,
                                                                 size_t n)
{
    uint16_t *d = dst;
    const float *s = src;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(s + i);
        if (_mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q))) /* a NaN */
            f32_to_f16_values(d + i, s + i, 8);
        else
            _mm_storeu_si128((__m128i *)(d + i),
                             _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    f32_to_f16_values(d + i, s + i, n - i);
}

__attribute__((target("avx2,f16c"))) static void f16_to_f32_f16c(void *dst, const void *src,
                                                                 size_t n)
{
    float *d = dst;
    const uint16_t *s = src;
    const __m128i abs = _mm_set1_epi16(0x7fff), inf = _mm_set1_epi16(0x7c00);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128((const __m128i *)(s + i));
        if (_mm_movemask_epi8(_mm_cmpgt_epi16(_mm_and_si128(h, abs), inf))) /* a NaN */
            f16_to_f32_values(d + i, s + i, 8);
        else
            _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
    }
    f16_to_f32_values(d + i, s + i, n - i);
}
#else
#define NATIVE_CONVERT 0
#endif

static int convert_native = 1;

void loom_convert_set_path(loom_convert_path path) { convert_native = path == LOOM_CONVERT_NATIVE; }

/* The span converter of f32 <-> bf16/f16, whichever the CPU and the path
 * setting allow; NULL for other pairs. */
static convert_fn converter(loom_dtype dst, loom_dtype src, const char **name)
{
    const char *unused;
    if (!name)
        name = &unused;
    *name = "portable";
#if NATIVE_CONVERT
    if (convert_native && src == LOOM_F32 && dst == LOOM_BF16 &&
        loom_cpu_isa() >= LOOM_ISA_AVX512_BF16) {
        *name = "avx512-bf16";
        return f32_to_bf16_avx512;
    }
    const int f16c = convert_native && loom_cpu_has_f16c();
    if (f16c && src == LOOM_F32 && dst == LOOM_F16) {
        *name = "f16c";
        return f32_to_f16_f16c;
    }
    if (f16c && src == LOOM_F16 && dst == LOOM_F32) {
        *name = "f16c";
        return f16_to_f32_f16c;
    }
#endif
    if (src == LOOM_F32 && dst == LOOM_BF16)
        return f32_to_bf16_portable;
    if (src == LOOM_BF16 && dst == LOOM_F32)
        return bf16_to_f32_portable;
    if (src == LOOM_F32 && dst == LOOM_F16)
        return f32_to_f16_portable;
    if (src == LOOM_F16 && dst == LOOM_F32)
        return f16_to_f32_portable;
    *name = NULL;
    return NULL;
}

const char *loom_convert_path_name(loom_dtype dst, loom_dtype src)
{
    const char *name;
    converter(dst, src, &name);
    return name;
}

void loom_convert(void *dst, loom_dtype dst_type, const void *src, loom_dtype src_type, size_t n)
{
    if (dst_type == src_type) {
        memmove(dst, src, n * loom_dtype_size(src_type));
        return;
    }
    const convert_fn fn = converter(dst_type, src_type, NULL);
    const size_t dsize = loom_dtype_size(dst_type), ssize = loom_dtype_size(src_type);
    const int half_src = src_type == LOOM_BF16 || src_type == LOOM_F16;
    const int half_dst = dst_type == LOOM_BF16 || dst_type == LOOM_F16;
    if (fn) {
        const int nt = threads_for(n);
        FOR_PARTS(nt, {
            /* parts of 32 elements: the AVX-512 loop's step, whole cache lines */
            const size_t b = part_begin(n, nt, p, 32), e = part_begin(n, nt, p + 1, 32);
            fn((char *)dst + b * dsize, (const char *)src + b * ssize, e - b);
        });
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

/* dst (dtype t) += src, rounded to t, and src zeroed: a gradient scratch
 * committed into a unit's buffer. 16-bit blocks go through f32 and back,
 * the same bits as tensor.h's scalar conversions. */
typedef struct accumulate_call {
    void *dst;
    loom_dtype type;
    float *src;
} accumulate_call;

INLINE void add_and_clear_loop(float *restrict y, float *restrict x, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) {
            y[i + l] += x[i + l];
            x[i + l] = 0.0f;
        }
    for (; i < n; i++) {
        y[i] += x[i];
        x[i] = 0.0f;
    }
}
STREAM_LOOP(add_and_clear, (float *restrict y, float *restrict x, size_t n), (y, x, n))

static void accumulate_span(void *ctx, size_t begin, size_t end)
{
    const accumulate_call *a = ctx;
    if (a->type == LOOM_F32) {
        add_and_clear((float *)a->dst + begin, a->src + begin, end - begin);
        return;
    }
    float y[1024];
    for (size_t i = begin; i < end; i += 1024) {
        const size_t n = end - i < 1024 ? end - i : 1024;
        uint16_t *d = (uint16_t *)a->dst + i;
        loom_convert(y, LOOM_F32, d, a->type, n);
        add_and_clear(y, a->src + i, n);
        loom_convert(d, a->type, y, LOOM_F32, n);
    }
}

void loom_accumulate(void *dst, loom_dtype dst_type, float *src, size_t n)
{
    accumulate_call a = {dst, dst_type, src};
    loom_kernels_for_spans(n, accumulate_span, &a);
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
 * probabilities from lse. The products are loom_gemm's on the head's rows
 * in place (they are C = NH·HS elements apart); keys no query of the tile
 * can see are trimmed off the chunk's ends, so the causal half costs
 * little.
 *
 * The products multiply in the run's dtype (loom_gemm_multiply_dtype):
 * in a bf16 run on oneDNN, q, k, v and dout go in as bf16 (read in place
 * when they are stored so, else rounded per head into the thread's copy),
 * and the probabilities P and their gradient dS are rounded to bf16 for
 * the products they feed, as FlashAttention does on GPUs; softmax, its
 * row sums, lse and every accumulation (out, dq, dk, dv) stay f32. A
 * written buffer of a 16-bit type goes through an f32 copy of the head
 * per thread, written back rounded; lse is always f32. */

#define ATTN_QT 64
#define ATTN_KT 256

/* One head's rows: element (row r, dim d) at base[r * ld + d], of dtype
 * f32, or (read only, in products) the products' 16-bit type. */
typedef struct head_rows {
    void *base;
    int ld;
    loom_dtype dtype;
} head_rows;

INLINE float *head_row(head_rows h, int r) { return (float *)h.base + (size_t)r * h.ld; }

/* Rows [r, ...) of h as a product's operand, transposed or not. */
static loom_gemm_operand head_operand(head_rows h, int r, int transposed)
{
    const size_t es = loom_dtype_size(h.dtype);
    return (loom_gemm_operand){(const char *)h.base + (size_t)r * h.ld * es, h.dtype, h.ld,
                               transposed};
}

/* In-place view of head h of batch b in a (B, rows, NH, HS) buffer. */
static head_rows buffer_head(const void *buf, loom_dtype dt, int b, int h, int rows, int NH,
                             int HS)
{
    const size_t C = (size_t)NH * HS;
    head_rows v = {(char *)buf + ((size_t)b * rows * C + (size_t)h * HS) * loom_dtype_size(dt),
                   NH * HS, dt};
    return v;
}

static head_rows packed_head(float *buf, loom_dtype dt, int HS)
{
    head_rows v = {buf, HS, dt};
    return v;
}

/* Rows [b, 0..rows) of head h of a (B, rows, NH, HS) buffer of type dt,
 * to contiguous (rows, HS) of type to, and from contiguous f32. */
static void gather_head(void *dst, loom_dtype to, const void *src, loom_dtype dt, int b, int h,
                        int rows, int NH, int HS)
{
    const size_t C = (size_t)NH * HS, es = loom_dtype_size(dt), ts = loom_dtype_size(to);
    for (int r = 0; r < rows; r++) {
        const char *s = (const char *)src + (((size_t)b * rows + r) * C + (size_t)h * HS) * es;
        loom_convert((char *)dst + (size_t)r * HS * ts, to, s, dt, (size_t)HS);
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
INLINE float masked_max(const float *restrict s, const int *restrict kp, int qp, int n)
{
    float lane[16];
    for (int l = 0; l < 16; l++)
        lane[l] = -INFINITY;
    int j = 0;
    for (; j + 16 <= n; j += 16)
        for (int l = 0; l < 16; l++) {
            const uint32_t seen = 0u - (uint32_t)(kp[j + l] <= qp);
            const float v = as_float((as_bits(s[j + l]) & seen) | (0xff800000u & ~seen));
            lane[l] = v > lane[l] ? v : lane[l];
        }
    float m = -INFINITY;
    for (int l = 0; l < 16; l++)
        m = lane[l] > m ? lane[l] : m;
    for (; j < n; j++)
        if (kp[j] <= qp && s[j] > m)
            m = s[j];
    return m;
}

/* s = exp(s - shift) for keys at positions <= qp, 0 for the others */
INLINE void masked_exp(float *restrict s, const int *restrict kp, int qp, float shift,
                       int n)
{
    int j = 0;
    for (; j + 16 <= n; j += 16)
        for (int l = 0; l < 16; l++) {
            const uint32_t seen = 0u - (uint32_t)(kp[j + l] <= qp);
            s[j + l] = as_float(as_bits(exp_fast(s[j + l] - shift)) & seen);
        }
    for (; j < n; j++)
        s[j] = kp[j] <= qp ? exp_fast(s[j] - shift) : 0.0f;
}

/* Merge a chunk's row (acc = Σ exp(s_j - m)·v_j, l = Σ exp(s_j - m)) into
 * the row's out and lse. A row at lse -inf has seen no key yet: overwrite,
 * whatever out holds. */
INLINE void merge_row(float *o, float *lse, const float *acc, float m, float l, int HS)
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

/* A call's buffers, at most this many (backward's). */
#define ATTN_MAX_BUFS 8

/* What one thread computes a head in. */
typedef struct attn_scratch {
    float *s;        /* ATTN_QT x ATTN_KT: scores, then probabilities */
    float *ds;       /* ATTN_QT x ATTN_KT: dP, then dS (backward) */
    uint16_t *low;   /* ATTN_QT x ATTN_KT: P or dS rounded, for 16-bit products */
    float *acc;      /* ATTN_QT x HS (forward); two rows widened for D (backward) */
    float *row_max;  /* ATTN_QT */
    float *row_sum;  /* ATTN_QT; D_i = dout_i·out_i in backward */
    float *packed[ATTN_MAX_BUFS]; /* buffers not used in place: the head (rows x HS) */
} attn_scratch;

/* The multiply's operand of an (nq, nk) tile of w's in tile: itself, or
 * rounded into w->low for a 16-bit multiply. */
static loom_gemm_operand tile_operand(const attn_scratch *w, const float *tile, int nq, int nk,
                                      int transposed, loom_dtype multiply)
{
    if (multiply == LOOM_F32)
        return loom_gemm_f32(tile, nk, transposed);
    loom_convert(w->low, multiply, tile, LOOM_F32, (size_t)nq * nk);
    return (loom_gemm_operand){w->low, multiply, nk, transposed};
}

/* A tile's scores (nq x nk in w->s) -> exp(s - row max), masked, with each
 * row's max and sum; a row that sees no key of the chunk gets max -inf. */
INLINE void tile_exp_loop(const attn_scratch *w, const int *q_pos, const int *k_pos, int nq, int nk)
{
    for (int r = 0; r < nq; r++) {
        float *s = w->s + (size_t)r * nk;
        const int qp = q_pos[r];
        const float m = masked_max(s, k_pos, qp, nk);
        w->row_max[r] = m;
        if (m == -INFINITY) { /* this row sees no key of the chunk */
            memset(s, 0, (size_t)nk * sizeof(float));
            continue;
        }
        masked_exp(s, k_pos, qp, m, nk);
        w->row_sum[r] = sum_f32(s, nk);
    }
}
WIDE_LOOP(tile_exp, (const attn_scratch *w, const int *q_pos, const int *k_pos, int nq, int nk),
          (w, q_pos, k_pos, nq, nk))

/* A tile's rows of w->acc merged into out and lse. */
INLINE void tile_merge_loop(const attn_scratch *w, float *o, int ldo, float *lse, int nq, int HS)
{
    for (int r = 0; r < nq; r++)
        if (w->row_max[r] != -INFINITY)
            merge_row(o + (size_t)r * ldo, lse + r, w->acc + (size_t)r * HS, w->row_max[r],
                      w->row_sum[r], HS);
}
WIDE_LOOP(tile_merge, (const attn_scratch *w, float *o, int ldo, float *lse, int nq, int HS),
          (w, o, ldo, lse, nq, HS))

/* The next chunk of keys, from *c0 on, that some query of the tile [i0,
 * i0 + nq) (at positions <= qmax) can see: its keys [*j0, *j0 + nk) and
 * their scores scale·q·kᵀ in w->s (nq x nk). Returns nk, 0 when no chunk
 * is left. */
static int next_chunk_scores(head_rows q, int i0, int nq, int qmax, head_rows k,
                             const int *k_pos, int tk, int HS, float scale,
                             const attn_scratch *w, int *c0, int *j0, loom_dtype multiply)
{
    for (; *c0 < tk; *c0 += ATTN_KT) {
        int j1;
        if (!chunk_visible(k_pos, *c0, *c0 + ATTN_KT < tk ? *c0 + ATTN_KT : tk, qmax, j0, &j1))
            continue;
        const int nk = j1 - *j0;
        loom_gemm(w->s, nk, nq, nk, HS, head_operand(q, i0, 0), head_operand(k, *j0, 1), scale,
                  0.0f, multiply);
        *c0 += ATTN_KT;
        return nk;
    }
    return 0;
}

static void forward_head(head_rows q, const int *q_pos, int tq, head_rows k, head_rows v,
                         const int *k_pos, int tk, int HS, float scale, head_rows o, float *lse,
                         int first_block, const attn_scratch *w, loom_dtype multiply)
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
        while ((nk = next_chunk_scores(q, i0, nq, qmax, k, k_pos, tk, HS, scale, w, &c0, &j0,
                                       multiply))) {
            tile_exp(w, q_pos + i0, k_pos + j0, nq, nk);
            loom_gemm(w->acc, HS, nq, HS, nk, tile_operand(w, w->s, nq, nk, 0, multiply),
                      head_operand(v, j0, 0), 1.0f, 0.0f, multiply);
            tile_merge(w, head_row(o, i0), o.ld, lse + i0, nq, HS);
        }
    }
}

/* A tile's P = exp(s - lse) in w->s, masked; a row that saw no key
 * anywhere (lse -inf) gets 0: its out is 0, nothing flows. */
INLINE void tile_probabilities_loop(const attn_scratch *w, const int *q_pos, const int *k_pos,
                                    const float *lse, int nq, int nk)
{
    for (int r = 0; r < nq; r++) {
        float *p = w->s + (size_t)r * nk;
        if (!isfinite(lse[r]))
            memset(p, 0, (size_t)nk * sizeof(float));
        else
            masked_exp(p, k_pos, q_pos[r], lse[r], nk);
    }
}
WIDE_LOOP(tile_probabilities,
          (const attn_scratch *w, const int *q_pos, const int *k_pos, const float *lse, int nq,
           int nk),
          (w, q_pos, k_pos, lse, nq, nk))

/* ds = p ∘ (ds - D) */
INLINE void softmax_grad_row(float *restrict ds, const float *restrict p, float D, int n)
{
    int j = 0;
    for (; j + 16 <= n; j += 16)
        for (int l = 0; l < 16; l++)
            ds[j + l] = p[j + l] * (ds[j + l] - D);
    for (; j < n; j++)
        ds[j] = p[j] * (ds[j] - D);
}

/* dS = P ∘ (dP - D), over dP in w->ds */
INLINE void tile_softmax_grad_loop(const attn_scratch *w, const float *D, int nq, int nk)
{
    for (int r = 0; r < nq; r++)
        softmax_grad_row(w->ds + (size_t)r * nk, w->s + (size_t)r * nk, D[r], nk);
}
WIDE_LOOP(tile_softmax_grad, (const attn_scratch *w, const float *D, int nq, int nk),
          (w, D, nq, nk))

/* Row r of h as f32: in place, or widened into tmp (HS floats). */
static const float *row_f32(head_rows h, int r, float *tmp, int HS)
{
    if (h.dtype == LOOM_F32)
        return head_row(h, r);
    loom_convert(tmp, LOOM_F32, (const char *)h.base + (size_t)r * h.ld * loom_dtype_size(h.dtype),
                 h.dtype, (size_t)HS);
    return tmp;
}

static void backward_head(head_rows q, const int *q_pos, int tq, head_rows k, head_rows v,
                          const int *k_pos, int tk, int HS, float scale, head_rows o,
                          head_rows dout, const float *lse, head_rows dq, head_rows dk,
                          head_rows dv, const attn_scratch *w, loom_dtype multiply)
{
    for (int i0 = 0; i0 < tq; i0 += ATTN_QT) {
        const int nq = tq - i0 < ATTN_QT ? tq - i0 : ATTN_QT;
        const int qmax = tile_max(q_pos + i0, nq);
        float *D = w->row_sum;
        for (int r = 0; r < nq; r++)
            D[r] = dot_f32(row_f32(dout, i0 + r, w->acc, HS), row_f32(o, i0 + r, w->acc + HS, HS),
                           HS);
        int c0 = 0, j0, nk;
        while ((nk = next_chunk_scores(q, i0, nq, qmax, k, k_pos, tk, HS, scale, w, &c0, &j0,
                                       multiply))) {
            /* P = exp(scale·Q·Kᵀ - lse), masked */
            tile_probabilities(w, q_pos + i0, k_pos + j0, lse + i0, nq, nk);
            /* dV += Pᵀ·dO */
            loom_gemm(head_row(dv, j0), dv.ld, nk, HS, nq, tile_operand(w, w->s, nq, nk, 1, multiply),
                      head_operand(dout, i0, 0), 1.0f, 1.0f, multiply);
            /* dS = P ∘ (dO·Vᵀ - D) */
            loom_gemm(w->ds, nk, nq, nk, HS, head_operand(dout, i0, 0), head_operand(v, j0, 1),
                      1.0f, 0.0f, multiply);
            tile_softmax_grad(w, D, nq, nk);
            /* dQ += scale·dS·K, dK += scale·dSᵀ·Q (dS rounded once for both) */
            loom_gemm_operand ds = tile_operand(w, w->ds, nq, nk, 0, multiply);
            loom_gemm(head_row(dq, i0), dq.ld, nq, HS, nk, ds, head_operand(k, j0, 0), scale, 1.0f,
                      multiply);
            ds.transposed = 1;
            loom_gemm(head_row(dk, j0), dk.ld, nk, HS, nq, ds, head_operand(q, i0, 0), scale, 1.0f,
                      multiply);
        }
    }
}

/* One (B, rows, NH, HS) buffer of a call, as the per-head loop uses it:
 * read before each head (in) and/or written after it (out). */
typedef struct head_buf {
    const void *in; /* NULL: not read */
    void *out;      /* NULL: not written */
    int rows;
    int rows_only;  /* read by rows alone, never a product's operand (out, for D) */
} head_buf;

/* One call of the attention kernels: its shape, its buffers, and the
 * scratch each of its threads runs in. Threads take whole (batch, head)
 * pairs, which share nothing they write, and compute each as one thread
 * would: the same bits for any thread count. */
typedef struct attn_call {
    int B, NH, HS;
    loom_dtype dtype;
    loom_dtype multiply; /* the products' dtype */
    head_buf *bufs;
    int nbufs;
    float scale;
    int threads;
    attn_scratch *w; /* one per thread */
    attn_positions pos;
    float *mem;
} attn_call;

/* Whether buffer i is used in place: a buffer that is only read, when it
 * is of the products' dtype or no product reads it; a written one (an
 * accumulator), when it is f32. The others go through a thread's copy of
 * the head. */
static int in_place(const attn_call *c, int i)
{
    const head_buf *t = &c->bufs[i];
    return t->out ? c->dtype == LOOM_F32 : t->rows_only || c->dtype == c->multiply;
}

/* The dtype of buffer i's copy: an accumulator's f32, a read buffer's the
 * products'. */
static loom_dtype packed_dtype(const attn_call *c, int i)
{
    return c->bufs[i].out ? LOOM_F32 : c->multiply;
}

/* Per thread the tile buffers, then the packed heads; and the positions
 * as arrays. Out of memory: -1, why recorded, and the buffers the call
 * writes poisoned. */
static int attn_begin(attn_call *c, const char *what, const int *q_pos, int tq, const int *k_pos,
                      int tk)
{
    const size_t tile = (size_t)ATTN_QT * ATTN_KT;
    const int heads = c->B * c->NH;
    c->multiply = c->dtype == LOOM_F16 ? LOOM_F32 : loom_gemm_multiply_dtype();
    c->threads = threads_for((size_t)heads * tq * tk);
    c->threads = c->threads < heads ? c->threads : heads > 0 ? heads : 1;
    size_t floats = 2 * tile + tile / 2 + (size_t)ATTN_QT * c->HS + 2 * (size_t)ATTN_QT;
    for (int i = 0; i < c->nbufs; i++)
        if (!in_place(c, i))
            floats += (size_t)c->bufs[i].rows * c->HS;
    c->mem = malloc(floats * (size_t)c->threads * sizeof(float));
    c->w = calloc((size_t)c->threads, sizeof *c->w);
    if (!c->mem || !c->w || positions_init(&c->pos, q_pos, tq, k_pos, tk) != 0) {
        free(c->mem);
        free(c->w);
        loom_fail(LOOM_ERR_NO_MEMORY, "attention %s: out of memory for the scratch of "
                                      "%d queries and %d keys",
                  what, tq, tk);
        for (int i = 0; i < c->nbufs; i++)
            if (c->bufs[i].out)
                poison(c->bufs[i].out, c->dtype, (size_t)c->B * c->bufs[i].rows * c->NH * c->HS);
        return -1;
    }
    c->scale = 1.0f / sqrtf((float)c->HS);
    float *next = c->mem;
    for (int t = 0; t < c->threads; t++) {
        attn_scratch *w = &c->w[t];
        w->s = next;
        w->ds = w->s + tile;
        w->low = (uint16_t *)(w->ds + tile);
        w->acc = w->ds + tile + tile / 2;
        w->row_max = w->acc + (size_t)ATTN_QT * c->HS;
        w->row_sum = w->row_max + ATTN_QT;
        next = w->row_sum + ATTN_QT;
        for (int i = 0; i < c->nbufs; i++)
            if (!in_place(c, i)) {
                w->packed[i] = next;
                next += (size_t)c->bufs[i].rows * c->HS;
            }
    }
    /* each tile's product on its head's thread alone, whatever the number
     * of threads (the same bits; BLAS threads would fight the heads' for
     * the cores) */
    if (kernel_threads > 1)
        openblas_set_num_threads(1);
    return 0;
}

static void attn_end(attn_call *c)
{
    if (kernel_threads > 1)
        openblas_set_num_threads(kernel_threads);
    free(c->pos.owned);
    free(c->mem);
    free(c->w);
}

/* Head h of batch b of each buffer: in place, or the thread's packed
 * copy, read in when the buffer is. */
static void open_heads(const attn_call *c, const attn_scratch *w, int b, int h,
                       head_rows *heads)
{
    for (int i = 0; i < c->nbufs; i++) {
        const head_buf *t = &c->bufs[i];
        if (in_place(c, i)) {
            heads[i] = buffer_head(t->out ? t->out : t->in, c->dtype, b, h, t->rows, c->NH, c->HS);
            continue;
        }
        if (t->in)
            gather_head(w->packed[i], packed_dtype(c, i), t->in, c->dtype, b, h, t->rows, c->NH,
                        c->HS);
        heads[i] = packed_head(w->packed[i], packed_dtype(c, i), c->HS);
    }
}

/* ... and written back, rounded, where the buffer is written. */
static void close_heads(const attn_call *c, const attn_scratch *w, int b, int h)
{
    for (int i = 0; i < c->nbufs; i++) {
        const head_buf *t = &c->bufs[i];
        if (t->out && !in_place(c, i))
            scatter_head(t->out, c->dtype, w->packed[i], b, h, t->rows, c->NH, c->HS);
    }
}

static void attention_block_forward(const void *q, const int *q_pos, int tq, const void *k,
                                    const void *v, const int *k_pos, int tk, int B, int NH,
                                    int HS, loom_dtype dtype, void *out, float *lse,
                                    int first_block)
{
    enum { Q, K, V, OUT, NBUFS };
    /* a first block overwrites out */
    head_buf bufs[NBUFS] = {{q, NULL, tq, 0}, {k, NULL, tk, 0}, {v, NULL, tk, 0},
                            {first_block ? NULL : out, out, tq, 0}};
    attn_call c = {.B = B, .NH = NH, .HS = HS, .dtype = dtype, .bufs = bufs, .nbufs = NBUFS};
    if (attn_begin(&c, "forward", q_pos, tq, k_pos, tk) != 0) {
        poison(lse, LOOM_F32, (size_t)B * NH * tq);
        return;
    }
    PARALLEL_FOR(c.threads)
    for (int bh = 0; bh < B * NH; bh++) {
        const int b = bh / NH, h = bh % NH;
        const attn_scratch *w = &c.w[thread_index()];
        head_rows r[NBUFS];
        open_heads(&c, w, b, h, r);
        forward_head(r[Q], c.pos.q, tq, r[K], r[V], c.pos.k, tk, HS, c.scale, r[OUT],
                     lse + (size_t)bh * tq, first_block, w, c.multiply);
        close_heads(&c, w, b, h);
    }
    attn_end(&c);
}

static void attention_block_backward(const void *q, const int *q_pos, int tq, const void *k,
                                     const void *v, const int *k_pos, int tk, int B, int NH,
                                     int HS, loom_dtype dtype, const void *out, const void *dout,
                                     const float *lse, void *dq, void *dk, void *dv)
{
    enum { Q, OUT, DOUT, DQ, K, V, DK, DV, NBUFS };
    _Static_assert(NBUFS <= ATTN_MAX_BUFS, "a thread's scratch packs every buffer");
    /* dq, dk and dv accumulate */
    head_buf bufs[NBUFS] = {{q, NULL, tq, 0}, {out, NULL, tq, 1}, {dout, NULL, tq, 0},
                            {dq, dq, tq, 0},  {k, NULL, tk, 0},   {v, NULL, tk, 0},
                            {dk, dk, tk, 0},  {dv, dv, tk, 0}};
    attn_call c = {.B = B, .NH = NH, .HS = HS, .dtype = dtype, .bufs = bufs, .nbufs = NBUFS};
    if (attn_begin(&c, "backward", q_pos, tq, k_pos, tk) != 0)
        return;
    PARALLEL_FOR(c.threads)
    for (int bh = 0; bh < B * NH; bh++) {
        const int b = bh / NH, h = bh % NH;
        const attn_scratch *w = &c.w[thread_index()];
        head_rows r[NBUFS];
        open_heads(&c, w, b, h, r);
        backward_head(r[Q], c.pos.q, tq, r[K], r[V], c.pos.k, tk, HS, c.scale, r[OUT], r[DOUT],
                      lse + (size_t)bh * tq, r[DQ], r[DK], r[DV], w, c.multiply);
        close_heads(&c, w, b, h);
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
