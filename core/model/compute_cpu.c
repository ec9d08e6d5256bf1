/* loom core — the built-in compute backend "cpu" (loom/compute.h): the
 * model's kernels on the host, its memory the host's own. Every op is the
 * CPU kernel (kernels.h, gemm.h, optimizer.h) or the host loop the model
 * ran before it had backends, so a run on this backend gives the bits it
 * always gave. Its queue is the calling thread: a call returns when its
 * work is done, so synchronize and events have nothing to wait for. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/compute.h"
#include "loom/status.h"
#include "loom/tensor.h"
#include "model/compute.h"
#include "model/gemm.h"
#include "model/kernels.h"
#include "model/optimizer.h"
#include "runtime/loader.h"
#include "runtime/log.h"

struct loom_compute {
    int threads;
    loom_dtype precision;
    int deterministic;
};

/* Every event is complete when recorded: one object stands for all. */
struct loom_compute_event {
    int unused;
};
static struct loom_compute_event completed_event;

/* A call that cannot be right (a NULL buffer for work it has to do, a
 * negative size) is the caller's bug: refused, never run into a crash. */
static int bad_call(const char *op, const char *condition)
{
    return loom_fail(LOOM_ERR_INVALID,
                     "compute backend cpu: %s called with %s false (a NULL buffer or a negative "
                     "size): a bug in its caller, please report it",
                     op, condition);
}
#define CHECK_CALL(op, condition)                                                                  \
    do {                                                                                           \
        if (!(condition))                                                                          \
            return bad_call(op, #condition);                                                       \
    } while (0)

static loom_weight weight_of(loom_compute_weight w) { return (loom_weight){w.data, w.dtype}; }

/* The kernels count elements in int: a longer array goes in pieces, which
 * gives the same bits as element-wise work does for any split. */
#define ELEMENTWISE_PIECE ((size_t)1 << 30)

/* ---- lifetime ---- */

static int cpu_create(const loom_host *host, const loom_compute_setup *setup, loom_compute **out)
{
    (void)host;
    CHECK_CALL("create", setup && out);
    loom_compute *c = calloc(1, sizeof *c);
    if (!c)
        return loom_fail(LOOM_ERR_NO_MEMORY, "compute backend cpu: out of memory creating it");
    c->threads = setup->threads;
    c->precision = setup->precision;
    c->deterministic = setup->deterministic;
    *out = c;
    return LOOM_OK;
}

static int cpu_destroy(loom_compute *c)
{
    free(c);
    return LOOM_OK;
}

static int cpu_describe(const loom_compute *c, char *buf, size_t cap)
{
    (void)c;
    CHECK_CALL("describe", buf || !cap);
    if (cap)
        snprintf(buf, cap, "cpu: %s", loom_gemm_describe());
    return LOOM_OK;
}

/* ---- memory ---- */

static int cpu_to_device(loom_compute *c, void *dst, const void *src, size_t bytes)
{
    (void)c;
    CHECK_CALL("to_device", !bytes || (dst && src));
    if (bytes)
        memcpy(dst, src, bytes);
    return LOOM_OK;
}

static int cpu_to_host(loom_compute *c, void *dst, const void *src, size_t bytes)
{
    (void)c;
    CHECK_CALL("to_host", !bytes || (dst && src));
    if (bytes)
        memcpy(dst, src, bytes);
    return LOOM_OK;
}

static int cpu_copy(loom_compute *c, void *dst, const void *src, size_t bytes)
{
    (void)c;
    CHECK_CALL("copy", !bytes || (dst && src));
    if (bytes)
        memcpy(dst, src, bytes);
    return LOOM_OK;
}

static int cpu_copy_rows(loom_compute *c, void *dst, size_t dst_pitch, const void *src,
                         size_t src_pitch, size_t row_bytes, size_t rows)
{
    (void)c;
    CHECK_CALL("copy_rows", !rows || !row_bytes || (dst && src));
    CHECK_CALL("copy_rows", rows <= 1 || (row_bytes <= dst_pitch && row_bytes <= src_pitch));
    if (!row_bytes)
        return LOOM_OK;
    for (size_t r = 0; r < rows; r++)
        memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, row_bytes);
    return LOOM_OK;
}

static int cpu_zero(loom_compute *c, void *dst, size_t bytes)
{
    (void)c;
    CHECK_CALL("zero", !bytes || dst);
    if (bytes)
        memset(dst, 0, bytes);
    return LOOM_OK;
}

/* ---- the queue ---- */

static int cpu_synchronize(loom_compute *c)
{
    (void)c;
    return LOOM_OK;
}

static int cpu_event_record(loom_compute *c, loom_compute_event **out)
{
    (void)c;
    CHECK_CALL("event_record", out);
    *out = &completed_event;
    return LOOM_OK;
}

static int cpu_event_wait(loom_compute *c, loom_compute_event *ev, double timeout_s)
{
    (void)c;
    (void)timeout_s;
    CHECK_CALL("event_wait", ev == &completed_event);
    return LOOM_OK;
}

static void cpu_event_free(loom_compute *c, loom_compute_event *ev)
{
    (void)c;
    (void)ev;
}

static int cpu_status(loom_compute *c)
{
    (void)c;
    return loom_gemm_take_error();
}

/* ---- matrix products ---- */

static int cpu_gemm(loom_compute *c, float *out, int ldc, int M, int N, int K,
                    loom_compute_operand a, loom_compute_operand b, float alpha, float beta,
                    loom_dtype multiply, int batch, size_t stride_a, size_t stride_b,
                    size_t stride_out)
{
    (void)c;
    CHECK_CALL("gemm", M >= 0 && N >= 0 && K >= 0 && batch >= 0);
    CHECK_CALL("gemm", !M || !N || !batch || (out && (!K || (a.data && b.data))));
    const size_t a_size = loom_dtype_size(a.dtype), b_size = loom_dtype_size(b.dtype);
    for (int i = 0; i < batch; i++) {
        loom_gemm_operand ai = {(const char *)a.data + (size_t)i * stride_a * a_size, a.dtype,
                                a.ld, a.transposed};
        loom_gemm_operand bi = {(const char *)b.data + (size_t)i * stride_b * b_size, b.dtype,
                                b.ld, b.transposed};
        loom_gemm(out + (size_t)i * stride_out, ldc, M, N, K, ai, bi, alpha, beta, multiply);
    }
    return LOOM_OK;
}

static loom_dtype cpu_multiply_dtype(loom_compute *c, loom_dtype precision)
{
    (void)c;
    return precision == LOOM_BF16 ? loom_gemm_multiply_dtype() : LOOM_F32;
}

static int cpu_matmul_forward(loom_compute *c, float *out, const float *inp,
                              loom_compute_weight weight, const float *bias, int N, int C, int OC)
{
    (void)c;
    CHECK_CALL("matmul_forward", N >= 0 && C >= 0 && OC >= 0);
    CHECK_CALL("matmul_forward", !N || !OC || (out && inp && weight.data));
    loom_matmul_forward(out, inp, weight_of(weight), bias, N, C, OC);
    return LOOM_OK;
}

static int cpu_matmul_backward_input(loom_compute *c, float *dinp, const float *dout,
                                     loom_compute_weight weight, int N, int C, int OC)
{
    (void)c;
    CHECK_CALL("matmul_backward_input", N >= 0 && C >= 0 && OC >= 0);
    CHECK_CALL("matmul_backward_input", !N || !C || (dinp && dout && weight.data));
    loom_matmul_backward_input(dinp, dout, weight_of(weight), N, C, OC);
    return LOOM_OK;
}

static int cpu_matmul_backward_weight(loom_compute *c, float *dweight, float *dbias,
                                      const float *dout, const float *inp, int N, int C, int OC)
{
    (void)c;
    CHECK_CALL("matmul_backward_weight", N >= 0 && C >= 0 && OC >= 0);
    CHECK_CALL("matmul_backward_weight", !OC || (dweight && dout && inp));
    loom_matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC);
    return LOOM_OK;
}

/* ---- the embedding ---- */

static int cpu_encoder_forward(loom_compute *c, float *out, const int *inp, const int *pos,
                               const float *wte, const float *wpe, int B, int T, int C)
{
    (void)c;
    CHECK_CALL("encoder_forward", B >= 0 && T >= 0 && C >= 0);
    CHECK_CALL("encoder_forward", !B || !T || (out && inp && wte && wpe));
    loom_encoder_forward(out, inp, pos, wte, wpe, B, T, C);
    return LOOM_OK;
}

static int cpu_encoder_backward(loom_compute *c, float *dwte, float *dwpe, const float *dout,
                                const int *inp, const int *pos, int B, int T, int C)
{
    (void)c;
    CHECK_CALL("encoder_backward", B >= 0 && T >= 0 && C >= 0);
    CHECK_CALL("encoder_backward", !B || !T || (dwte && dwpe && dout && inp));
    loom_encoder_backward(dwte, dwpe, dout, inp, pos, B, T, C);
    return LOOM_OK;
}

static int cpu_embedding_rows_forward(loom_compute *c, float *out, const int *tok, int v0,
                                      int rows, const float *wte, int N, int C)
{
    (void)c;
    CHECK_CALL("embedding_rows_forward", N >= 0 && C >= 0 && rows >= 0);
    CHECK_CALL("embedding_rows_forward", !N || (out && tok && (wte || !rows)));
    for (int n = 0; n < N; n++) {
        float *row = out + (size_t)n * C;
        int t = tok[n] - v0;
        if (t >= 0 && t < rows)
            memcpy(row, wte + (size_t)t * C, (size_t)C * sizeof(float));
        else
            memset(row, 0, (size_t)C * sizeof(float));
    }
    return LOOM_OK;
}

static int cpu_embedding_rows_backward(loom_compute *c, float *dwte, const float *dout,
                                       const int *tok, int v0, int rows, int N, int C)
{
    (void)c;
    CHECK_CALL("embedding_rows_backward", N >= 0 && C >= 0 && rows >= 0);
    CHECK_CALL("embedding_rows_backward", !N || (dout && tok && (dwte || !rows)));
    for (int n = 0; n < N; n++) {
        int t = tok[n] - v0;
        if (t < 0 || t >= rows)
            continue;
        float *row = dwte + (size_t)t * C;
        for (int i = 0; i < C; i++)
            row[i] += dout[(size_t)n * C + i];
    }
    return LOOM_OK;
}

static int cpu_position_forward(loom_compute *c, float *x, const float *wpe, const int *pos,
                                int R, int C)
{
    (void)c;
    CHECK_CALL("position_forward", R >= 0 && C >= 0);
    CHECK_CALL("position_forward", !R || (x && wpe && pos));
    for (int r = 0; r < R; r++) {
        const float *pe = wpe + (size_t)pos[r] * C;
        for (int i = 0; i < C; i++)
            x[(size_t)r * C + i] += pe[i];
    }
    return LOOM_OK;
}

static int cpu_position_backward(loom_compute *c, float *dwpe, const float *dx, const int *pos,
                                 int R, int C)
{
    (void)c;
    CHECK_CALL("position_backward", R >= 0 && C >= 0);
    CHECK_CALL("position_backward", !R || (dwpe && dx && pos));
    for (int r = 0; r < R; r++) {
        float *pe = dwpe + (size_t)pos[r] * C;
        for (int i = 0; i < C; i++)
            pe[i] += dx[(size_t)r * C + i];
    }
    return LOOM_OK;
}

/* ---- LayerNorm, residual, bias, GELU ---- */

static int cpu_layernorm_forward(loom_compute *c, float *out, float *mean, float *rstd,
                                 const float *inp, const float *weight, const float *bias, int N,
                                 int C)
{
    (void)c;
    CHECK_CALL("layernorm_forward", N >= 0 && C >= 0);
    CHECK_CALL("layernorm_forward", !N || (out && mean && rstd && inp && weight && bias));
    loom_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
    return LOOM_OK;
}

static int cpu_residual_layernorm_forward(loom_compute *c, float *res, float *out, float *mean,
                                          float *rstd, const float *a, const float *b,
                                          const float *weight, const float *bias, int N, int C)
{
    (void)c;
    CHECK_CALL("residual_layernorm_forward", N >= 0 && C >= 0);
    CHECK_CALL("residual_layernorm_forward",
               !N || (res && out && mean && rstd && a && b && weight && bias));
    loom_residual_layernorm_forward(res, out, mean, rstd, a, b, weight, bias, N, C);
    return LOOM_OK;
}

static int cpu_layernorm_backward_input(loom_compute *c, float *dinp, const float *dout,
                                        const float *inp, const float *weight, const float *mean,
                                        const float *rstd, int N, int C)
{
    (void)c;
    CHECK_CALL("layernorm_backward_input", N >= 0 && C >= 0);
    CHECK_CALL("layernorm_backward_input", !N || (dinp && dout && inp && weight && mean && rstd));
    loom_layernorm_backward_input(dinp, dout, inp, weight, mean, rstd, N, C);
    return LOOM_OK;
}

static int cpu_layernorm_backward_weight(loom_compute *c, float *dweight, float *dbias,
                                         const float *dout, const float *inp, const float *mean,
                                         const float *rstd, int N, int C)
{
    (void)c;
    CHECK_CALL("layernorm_backward_weight", N >= 0 && C >= 0);
    CHECK_CALL("layernorm_backward_weight",
               !C || (dweight && dbias && (!N || (dout && inp && mean && rstd))));
    loom_layernorm_backward_weight(dweight, dbias, dout, inp, mean, rstd, N, C);
    return LOOM_OK;
}

static int cpu_residual_forward(loom_compute *c, float *out, const float *a, const float *b,
                                size_t n)
{
    (void)c;
    CHECK_CALL("residual_forward", !n || (out && a && b));
    for (size_t i = 0; i < n; i += ELEMENTWISE_PIECE) {
        size_t piece = n - i < ELEMENTWISE_PIECE ? n - i : ELEMENTWISE_PIECE;
        loom_residual_forward(out + i, a + i, b + i, (int)piece);
    }
    return LOOM_OK;
}

static int cpu_bias_forward(loom_compute *c, float *x, const float *bias, int rows, int C)
{
    (void)c;
    CHECK_CALL("bias_forward", rows >= 0 && C >= 0);
    CHECK_CALL("bias_forward", !rows || !C || (x && bias));
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < C; i++)
            x[(size_t)r * C + i] += bias[i];
    return LOOM_OK;
}

static int cpu_bias_backward(loom_compute *c, float *dbias, const float *dout, int rows, int C)
{
    (void)c;
    CHECK_CALL("bias_backward", rows >= 0 && C >= 0);
    CHECK_CALL("bias_backward", !rows || !C || (dbias && dout));
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < C; i++)
            dbias[i] += dout[(size_t)r * C + i];
    return LOOM_OK;
}

static int cpu_bias_gelu_forward(loom_compute *c, float *out, float *pre, const float *bias,
                                 int N, int C)
{
    (void)c;
    CHECK_CALL("bias_gelu_forward", N >= 0 && C >= 0);
    CHECK_CALL("bias_gelu_forward", !N || !C || (out && pre && bias));
    loom_bias_gelu_forward(out, pre, bias, N, C);
    return LOOM_OK;
}

static int cpu_gelu_backward(loom_compute *c, float *dinp, const float *inp, const float *dout,
                             size_t n)
{
    (void)c;
    CHECK_CALL("gelu_backward", !n || (dinp && inp && dout));
    for (size_t i = 0; i < n; i += ELEMENTWISE_PIECE) {
        size_t piece = n - i < ELEMENTWISE_PIECE ? n - i : ELEMENTWISE_PIECE;
        loom_gelu_backward(dinp + i, inp + i, dout + i, (int)piece);
    }
    return LOOM_OK;
}

/* ---- attention ---- */

static int cpu_attention_forward(loom_compute *c, const void *q, const int *q_pos, int tq,
                                 const void *k, const void *v, const int *k_pos, int tk, int B,
                                 int NH, int HS, loom_dtype dtype, void *out, float *lse,
                                 int first_block)
{
    (void)c;
    CHECK_CALL("attention_forward", tq >= 0 && tk >= 0 && B >= 0 && NH >= 0 && HS >= 0);
    CHECK_CALL("attention_forward", !tq || !B || !NH || (q && k && v && out && lse));
    loom_attention_kernels_cpu.block_forward(q, q_pos, tq, k, v, k_pos, tk, B, NH, HS, dtype, out,
                                             lse, first_block);
    return LOOM_OK;
}

static int cpu_attention_backward(loom_compute *c, const void *q, const int *q_pos, int tq,
                                  const void *k, const void *v, const int *k_pos, int tk, int B,
                                  int NH, int HS, loom_dtype dtype, const void *out,
                                  const void *dout, const float *lse, void *dq, void *dk,
                                  void *dv)
{
    (void)c;
    CHECK_CALL("attention_backward", tq >= 0 && tk >= 0 && B >= 0 && NH >= 0 && HS >= 0);
    CHECK_CALL("attention_backward",
               !tq || !B || !NH || (q && k && v && out && dout && lse && dq && dk && dv));
    loom_attention_kernels_cpu.block_backward(q, q_pos, tq, k, v, k_pos, tk, B, NH, HS, dtype,
                                              out, dout, lse, dq, dk, dv);
    return LOOM_OK;
}

/* ---- the loss ---- */

static int cpu_crossentropy_forward(loom_compute *c, float *losses, float *lse,
                                    const float *logits, const int *targets, int N, int V, int Vp)
{
    (void)c;
    CHECK_CALL("crossentropy_forward", N >= 0 && V >= 0 && Vp >= V);
    CHECK_CALL("crossentropy_forward", !N || (losses && lse && logits && targets));
    loom_softmax_crossentropy_forward(losses, lse, logits, targets, N, V, Vp);
    return LOOM_OK;
}

static int cpu_crossentropy_backward(loom_compute *c, float *logits, const float *dlosses,
                                     const float *lse, const int *targets, int N, int V, int Vp)
{
    (void)c;
    CHECK_CALL("crossentropy_backward", N >= 0 && V >= 0 && Vp >= V);
    CHECK_CALL("crossentropy_backward", !N || (logits && dlosses && lse && targets));
    loom_softmax_crossentropy_backward(logits, dlosses, lse, targets, N, V, Vp);
    return LOOM_OK;
}

/* The vocabulary-parallel loss in the three parts between its two
 * reductions over the tensor group; each row's sum of exponentials is
 * accumulated in double, as the model always did. */
static int cpu_crossentropy_slice_max(loom_compute *c, float *max, const float *logits, int N,
                                      int width, int real)
{
    (void)c;
    CHECK_CALL("crossentropy_slice_max", N >= 0 && real >= 0 && width >= real);
    CHECK_CALL("crossentropy_slice_max", !N || (max && (logits || !real)));
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * width;
        float best = -INFINITY;
        for (int i = 0; i < real; i++)
            best = x[i] > best ? x[i] : best;
        max[n] = best;
    }
    return LOOM_OK;
}

static int cpu_crossentropy_slice_sums(loom_compute *c, float *sum, float *target,
                                       const float *logits, const float *max, const int *targets,
                                       int v0, int N, int width, int real)
{
    (void)c;
    CHECK_CALL("crossentropy_slice_sums", N >= 0 && real >= 0 && width >= real);
    CHECK_CALL("crossentropy_slice_sums",
               !N || (sum && target && max && targets && (logits || !real)));
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * width;
        double s = 0;
        for (int i = 0; i < real; i++)
            s += expf(x[i] - max[n]);
        sum[n] = (float)s;
        int t = targets[n] - v0;
        target[n] = t >= 0 && t < real ? x[t] : 0.0f;
    }
    return LOOM_OK;
}

static int cpu_crossentropy_slice_finish(loom_compute *c, float *lse, float *losses,
                                         const float *max, const float *sum, const float *target,
                                         int N)
{
    (void)c;
    CHECK_CALL("crossentropy_slice_finish", N >= 0);
    CHECK_CALL("crossentropy_slice_finish", !N || (lse && losses && max && sum && target));
    for (int n = 0; n < N; n++) {
        lse[n] = logf(sum[n]) + max[n];
        losses[n] = logf(sum[n]) + max[n] - target[n];
    }
    return LOOM_OK;
}

static int cpu_crossentropy_slice_backward(loom_compute *c, float *logits, const float *dlosses,
                                           const float *lse, const int *targets, int v0, int N,
                                           int width, int real)
{
    (void)c;
    CHECK_CALL("crossentropy_slice_backward", N >= 0 && real >= 0 && width >= real);
    CHECK_CALL("crossentropy_slice_backward",
               !N || (dlosses && lse && targets && (logits || !width)));
    for (int n = 0; n < N; n++) {
        float *x = logits + (size_t)n * width;
        const float d = dlosses[n], L = lse[n];
        for (int i = 0; i < real; i++)
            x[i] = expf(x[i] - L) * d;
        for (int i = real; i < width; i++)
            x[i] = 0.0f;
        int t = targets[n] - v0;
        if (t >= 0 && t < real)
            x[t] -= d;
    }
    return LOOM_OK;
}

static int cpu_mean(loom_compute *c, const float *x, size_t n, float *mean)
{
    (void)c;
    CHECK_CALL("mean", mean && (!n || x));
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += x[i];
    *mean = (float)(sum / (double)n);
    return LOOM_OK;
}

/* ---- the optimizer and the norm ---- */

static int cpu_adamw(loom_compute *c, const loom_compute_adamw *step, float *master,
                     const void *grad, loom_dtype grad_dtype, float *m, float *v, size_t n,
                     void *params, loom_dtype params_dtype)
{
    (void)c;
    CHECK_CALL("adamw", step && (!n || (master && grad && m && v)));
    loom_adamw_apply(step, master, grad, grad_dtype, m, v, n, params, params_dtype);
    return LOOM_OK;
}

/* Eight running sums, element i in sum i mod 8, added into *sum at the
 * end: the order depends on n alone, so a buffer's sum is the same bits on
 * every rank and every run, and the same as the strategies' own host loop
 * (strategy_add_squares) gave before backends. */
static double add_squares(double sum, const void *x, loom_dtype dtype, size_t n)
{
    enum { LANES = 8 };
    double lane[LANES] = {0};
    const size_t whole = n - n % LANES;
    if (dtype == LOOM_F32) {
        const float *f = x;
        for (size_t i = 0; i < whole; i += LANES)
            for (int k = 0; k < LANES; k++)
                lane[k] += (double)f[i + k] * (double)f[i + k];
    } else if (dtype == LOOM_BF16) {
        const uint16_t *h = x;
        for (size_t i = 0; i < whole; i += LANES)
            for (int k = 0; k < LANES; k++) {
                double e = loom_bf16_to_f32(h[i + k]);
                lane[k] += e * e;
            }
    } else {
        for (size_t i = 0; i < whole; i += LANES)
            for (int k = 0; k < LANES; k++) {
                double e = loom_load_f32(x, dtype, i + k);
                lane[k] += e * e;
            }
    }
    for (size_t i = whole; i < n; i++) {
        double e = loom_load_f32(x, dtype, i);
        lane[i % LANES] += e * e;
    }
    for (int k = 0; k < LANES; k++)
        sum += lane[k];
    return sum;
}

static int float_type(loom_dtype t) { return t == LOOM_F32 || t == LOOM_BF16 || t == LOOM_F16; }

static int cpu_sum_squares(loom_compute *c, const void *x, loom_dtype dtype, size_t n,
                           double *sum)
{
    (void)c;
    CHECK_CALL("sum_squares", sum && float_type(dtype) && (!n || x));
    *sum = add_squares(*sum, x, dtype, n);
    return LOOM_OK;
}

static int cpu_count_nonfinite(loom_compute *c, const void *x, loom_dtype dtype, size_t n,
                               size_t *count)
{
    (void)c;
    CHECK_CALL("count_nonfinite", count && float_type(dtype) && (!n || x));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += !isfinite(loom_load_f32(x, dtype, i));
    *count = bad;
    return LOOM_OK;
}

static int cpu_scale(loom_compute *c, float *x, float s, size_t n)
{
    (void)c;
    CHECK_CALL("scale", !n || x);
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
    return LOOM_OK;
}

/* ---- conversions ---- */

static int cpu_convert(loom_compute *c, void *dst, loom_dtype dst_type, const void *src,
                       loom_dtype src_type, size_t n)
{
    (void)c;
    CHECK_CALL("convert", float_type(dst_type) && float_type(src_type) && (!n || (dst && src)));
    loom_convert(dst, dst_type, src, src_type, n);
    return LOOM_OK;
}

static int cpu_accumulate(loom_compute *c, void *dst, loom_dtype dst_type, float *src, size_t n)
{
    (void)c;
    CHECK_CALL("accumulate", float_type(dst_type) && (!n || (dst && src)));
    loom_accumulate(dst, dst_type, src, n);
    return LOOM_OK;
}

const loom_compute_ops loom_compute_cpu = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_COMPUTE, loom_compute_ops, "cpu",
                                 "the model's kernels on the CPU (oneDNN or OpenBLAS products)",
                                 NULL),
    .tier = LOOM_TIER_HOST,
    .mem_kind = LOOM_MEM_HOST,
    .probe = NULL,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .describe = cpu_describe,
    .alloc = NULL,
    .free = NULL,
    .to_device = cpu_to_device,
    .to_host = cpu_to_host,
    .copy = cpu_copy,
    .copy_rows = cpu_copy_rows,
    .zero = cpu_zero,
    .synchronize = cpu_synchronize,
    .event_record = cpu_event_record,
    .event_wait = cpu_event_wait,
    .event_free = cpu_event_free,
    .status = cpu_status,
    .gemm = cpu_gemm,
    .multiply_dtype = cpu_multiply_dtype,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward_input = cpu_matmul_backward_input,
    .matmul_backward_weight = cpu_matmul_backward_weight,
    .encoder_forward = cpu_encoder_forward,
    .encoder_backward = cpu_encoder_backward,
    .embedding_rows_forward = cpu_embedding_rows_forward,
    .embedding_rows_backward = cpu_embedding_rows_backward,
    .position_forward = cpu_position_forward,
    .position_backward = cpu_position_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .residual_layernorm_forward = cpu_residual_layernorm_forward,
    .layernorm_backward_input = cpu_layernorm_backward_input,
    .layernorm_backward_weight = cpu_layernorm_backward_weight,
    .residual_forward = cpu_residual_forward,
    .bias_forward = cpu_bias_forward,
    .bias_backward = cpu_bias_backward,
    .bias_gelu_forward = cpu_bias_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .crossentropy_forward = cpu_crossentropy_forward,
    .crossentropy_backward = cpu_crossentropy_backward,
    .crossentropy_slice_max = cpu_crossentropy_slice_max,
    .crossentropy_slice_sums = cpu_crossentropy_slice_sums,
    .crossentropy_slice_finish = cpu_crossentropy_slice_finish,
    .crossentropy_slice_backward = cpu_crossentropy_slice_backward,
    .mean = cpu_mean,
    .adamw = cpu_adamw,
    .sum_squares = cpu_sum_squares,
    .count_nonfinite = cpu_count_nonfinite,
    .scale = cpu_scale,
    .convert = cpu_convert,
    .accumulate = cpu_accumulate,
    .native_queue = NULL,
};
