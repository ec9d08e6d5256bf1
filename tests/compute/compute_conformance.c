/* The conformance of a compute backend (loom/compute.h): every op run on
 * the backend's memory with small random inputs of odd sizes, its results
 * read back and compared with the CPU kernels called directly on host
 * copies of the inputs: the same bits, or within a tolerance when one is
 * given. The ops that were the model's own host loops (bias, the
 * vocabulary slices of the embedding and the loss, the loss mean) are
 * compared with those loops, written out below as the model had them, and
 * with double-precision references too, so that a kernel that is wrong
 * fails and not only one that changed. AdamW is compared with the
 * strategies' update_range_store, sum_squares with the 8-lane sum the
 * strategies computed on the host before backends.
 *
 *   compute_conformance                                 the built-in cpu backend
 *   compute_conformance <libloom-compute-X.so> [tolerance]
 *
 * Every failure names the op. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "loom/compute.h"
#include "model/compute.h"
#include "model/gemm.h"
#include "model/kernels.h"
#include "model/optimizer.h"
#include "runtime/loader.h"
#include "runtime/log.h"

static const loom_compute_plugin_v1_t *ops;
static loom_compute *backend;
static double tolerance; /* 0: the same bits as the CPU kernels */

/* Double-precision references: relative to max(1, |reference|). */
#define REFERENCE_TOLERANCE 1e-5

/* ---- buffers ---- */

enum { MAX_BUFFERS = 512 };
static void *device_buffers[MAX_BUFFERS], *host_buffers[MAX_BUFFERS];
static int device_count, host_count;

static void *host_alloc(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    REQUIRE(p && host_count < MAX_BUFFERS, "out of memory or buffers");
    host_buffers[host_count++] = p;
    return p;
}

/* The backend's memory: its own alloc, or for a host-tier backend without
 * one, host memory as the core would give it. */
static void *device_alloc(size_t bytes)
{
    void *p = NULL;
    REQUIRE(device_count < MAX_BUFFERS, "too many buffers");
    if (ops->alloc) {
        OK(ops->alloc(backend, bytes ? bytes : 1, &p));
    } else {
        size_t rounded = (bytes + 255) / 256 * 256;
        p = aligned_alloc(256, rounded ? rounded : 256);
        REQUIRE(p, "out of memory");
        memset(p, 0, rounded ? rounded : 256);
    }
    device_buffers[device_count++] = p;
    return p;
}

static void *upload(const void *src, size_t bytes)
{
    void *d = device_alloc(bytes);
    OK(ops->to_device(backend, d, src, bytes));
    return d;
}

static void *download(const void *d, size_t bytes)
{
    void *h = host_alloc(bytes);
    OK(ops->to_host(backend, h, d, bytes));
    return h;
}

static void release_buffers(void)
{
    for (int i = 0; i < device_count; i++) {
        if (ops->free)
            OK(ops->free(backend, device_buffers[i]));
        else
            free(device_buffers[i]);
    }
    for (int i = 0; i < host_count; i++)
        free(host_buffers[i]);
    device_count = host_count = 0;
}

/* ---- random inputs ---- */

static uint64_t rng_state = 0x853c49e6748fea9bULL;

static double uniform(double lo, double hi)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * (double)(rng_state >> 11) / 9007199254740992.0;
}

static float *random_floats(size_t n, double lo, double hi)
{
    float *x = host_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)uniform(lo, hi);
    return x;
}

static int *random_ints(size_t n, int lo, int hi) /* in [lo, hi) */
{
    int *x = host_alloc(n * sizeof(int));
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (int)uniform(0, hi - lo);
    return x;
}

static void *copy_of(const void *x, size_t bytes)
{
    void *y = host_alloc(bytes);
    memcpy(y, x, bytes);
    return y;
}

static float *floats_copy(const float *x, size_t n) { return copy_of(x, n * sizeof(float)); }
static float *device_floats(const float *x, size_t n) { return upload(x, n * sizeof(float)); }
static int *device_ints(const int *x, size_t n) { return upload(x, n * sizeof(int)); }

/* ---- comparisons ---- */

static int same_value(float got, float want, double tol)
{
    if (tol == 0)
        return memcmp(&got, &want, sizeof got) == 0;
    if (isnan(want) || isnan(got))
        return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got))
        return got == want;
    return fabs((double)got - (double)want) <= tol * fmax(1.0, fabs((double)want));
}

/* n elements of dtype: got against want, the same bits when tol is 0; the
 * first mismatch is reported, naming the op. */
static void expect_typed(const char *op, const char *what, const void *got, const void *want,
                         loom_dtype dtype, size_t n, double tol)
{
    for (size_t i = 0; i < n; i++) {
        float g = loom_load_f32(got, dtype, i), w = loom_load_f32(want, dtype, i);
        int same = tol == 0 ? memcmp((const char *)got + i * loom_dtype_size(dtype),
                                     (const char *)want + i * loom_dtype_size(dtype),
                                     loom_dtype_size(dtype)) == 0
                            : same_value(g, w, tol);
        if (!same) {
            failures++;
            fprintf(stderr, "FAIL %s: %s[%zu] = %.9g, want %.9g (%s)\n", op, what, i, g, w,
                    tol == 0 ? "the same bits" : "within the tolerance");
            return;
        }
    }
}

/* The backend's result, in its memory, against the CPU kernels' on the host. */
static void expect_device(const char *op, const char *what, const void *device, const void *want,
                          loom_dtype dtype, size_t n)
{
    const void *got = download(device, n * loom_dtype_size(dtype));
    expect_typed(op, what, got, want, dtype, n, tolerance);
}

static void expect_floats(const char *op, const char *what, const float *device,
                          const float *want, size_t n)
{
    expect_device(op, what, device, want, LOOM_F32, n);
}

/* The backend's result against a double-precision reference. */
static void expect_reference(const char *op, const char *what, const float *device,
                             const double *want, size_t n)
{
    const float *got = download(device, n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        if (!(fabs((double)got[i] - want[i]) <= REFERENCE_TOLERANCE * fmax(1.0, fabs(want[i])))) {
            failures++;
            fprintf(stderr, "FAIL %s: %s[%zu] = %.9g, the double reference %.9g (within %g)\n",
                    op, what, i, got[i], want[i], REFERENCE_TOLERANCE);
            return;
        }
    }
}

#define RUN(op, call)                                                                              \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != LOOM_OK) {                                                                      \
            failures++;                                                                            \
            fprintf(stderr, "FAIL %s: returned %s: %s\n", op, loom_status_string(rc_),             \
                    loom_last_error());                                                            \
        }                                                                                          \
    } while (0)

static double *doubles(size_t n) { return host_alloc(n * sizeof(double)); }

/* ---- memory and the queue ---- */

static void test_memory(void)
{
    enum { n = 37, rows = 5, width = 7, src_pitch = 9, dst_pitch = 8 };
    float *x = random_floats(n, -2, 2);
    float *d = device_floats(x, n);
    expect_floats("to_device/to_host", "x", d, x, n);

    float *d2 = device_alloc(n * sizeof(float));
    RUN("copy", ops->copy(backend, d2, d, n * sizeof(float)));
    expect_floats("copy", "dst", d2, x, n);

    RUN("zero", ops->zero(backend, d2, 13 * sizeof(float)));
    float *zeroed = floats_copy(x, n);
    memset(zeroed, 0, 13 * sizeof(float));
    expect_floats("zero", "dst", d2, zeroed, n);

    float *src = random_floats(rows * src_pitch, -1, 1), *dst = random_floats(rows * dst_pitch, 5, 6);
    float *want = floats_copy(dst, rows * dst_pitch);
    for (int r = 0; r < rows; r++)
        memcpy(want + r * dst_pitch, src + r * src_pitch, width * sizeof(float));
    float *dsrc = device_floats(src, rows * src_pitch), *ddst = device_floats(dst, rows * dst_pitch);
    RUN("copy_rows", ops->copy_rows(backend, ddst, dst_pitch * sizeof(float), dsrc,
                                    src_pitch * sizeof(float), width * sizeof(float), rows));
    expect_floats("copy_rows", "dst", ddst, want, rows * dst_pitch);

    RUN("synchronize", ops->synchronize(backend));
    loom_compute_event *ev = NULL;
    RUN("event_record", ops->event_record(backend, &ev));
    RUN("event_wait", ops->event_wait(backend, ev, 10.0));
    ops->event_free(backend, ev);
    RUN("status", ops->status(backend));

    char line[256] = "";
    RUN("describe", ops->describe(backend, line, sizeof line));
    CHECK(line[0] != '\0', "describe wrote nothing");
    printf("backend: %s\n", line);
}

/* ---- matrix products ---- */

static void test_gemm(void)
{
    enum { M = 7, N = 20, K = 12, batch = 2, ldc = N + 3 };
    const size_t sa = (size_t)M * K, sb = (size_t)N * K, sc = (size_t)M * ldc;
    CHECK(ops->multiply_dtype(backend, LOOM_F32) == LOOM_F32, "gemm: f32 runs multiply in f32");
    float *a = random_floats(batch * sa, -1, 1), *b = random_floats(batch * sb, -1, 1);
    float *c0 = random_floats(batch * sc, -1, 1);
    float *da = device_floats(a, batch * sa), *db = device_floats(b, batch * sb);
    /* a (M, K) as it is, b (K, N) stored transposed as (N, K) */
    for (int accumulate = 0; accumulate < 2; accumulate++) {
        const float alpha = accumulate ? 0.5f : 1.0f, beta = accumulate ? 1.0f : 0.0f;
        float *want = floats_copy(c0, batch * sc);
        for (int i = 0; i < batch; i++)
            loom_gemm(want + i * sc, ldc, M, N, K, loom_gemm_f32(a + i * sa, K, 0),
                      loom_gemm_f32(b + i * sb, K, 1), alpha, beta, LOOM_F32);
        float *dc = device_floats(c0, batch * sc);
        RUN("gemm", ops->gemm(backend, dc, ldc, M, N, K, (loom_compute_operand){da, LOOM_F32, K, 0},
                              (loom_compute_operand){db, LOOM_F32, K, 1}, alpha, beta, LOOM_F32,
                              batch, sa, sb, sc));
        const char *what = accumulate ? "c (beta 1)" : "c (beta 0)";
        expect_floats("gemm", what, dc, want, batch * sc);
        double *ref = doubles(batch * sc);
        for (int i = 0; i < batch; i++)
            for (int r = 0; r < M; r++)
                for (int col = 0; col < ldc; col++) {
                    size_t o = i * sc + (size_t)r * ldc + col;
                    double s = 0;
                    for (int k = 0; col < N && k < K; k++)
                        s += (double)a[i * sa + r * K + k] * b[i * sb + (size_t)col * K + k];
                    ref[o] = col < N ? alpha * s + beta * c0[o] : c0[o];
                }
        expect_reference("gemm", what, dc, ref, batch * sc);
    }
}

static void test_matmul(void)
{
    enum { N = 7, C = 12, OC = 20 };
    float *inp = random_floats(N * C, -1, 1), *w = random_floats(OC * C, -1, 1);
    float *bias = random_floats(OC, -1, 1), *dout = random_floats(N * OC, -1, 1);
    float *dinp0 = random_floats(N * C, -1, 1), *dw0 = random_floats(OC * C, -1, 1);
    float *dbias0 = random_floats(OC, -1, 1);
    float *dinp_ = device_floats(inp, N * C), *dw_ = device_floats(w, OC * C);
    float *dbias_ = device_floats(bias, OC), *ddout = device_floats(dout, N * OC);
    loom_compute_weight weight = {dw_, LOOM_F32};

    for (int with_bias = 0; with_bias < 2; with_bias++) {
        float *want = host_alloc(N * OC * sizeof(float));
        loom_matmul_forward(want, inp, loom_weight_f32(w), with_bias ? bias : NULL, N, C, OC);
        float *out = device_alloc(N * OC * sizeof(float));
        RUN("matmul_forward", ops->matmul_forward(backend, out, dinp_, weight,
                                                  with_bias ? dbias_ : NULL, N, C, OC));
        expect_floats("matmul_forward", with_bias ? "out (bias)" : "out (no bias)", out, want,
                      N * OC);
    }

    float *want = floats_copy(dinp0, N * C), *ddinp = device_floats(dinp0, N * C);
    loom_matmul_backward_input(want, dout, loom_weight_f32(w), N, C, OC);
    RUN("matmul_backward_input",
        ops->matmul_backward_input(backend, ddinp, ddout, weight, N, C, OC));
    expect_floats("matmul_backward_input", "dinp", ddinp, want, N * C);

    for (int with_bias = 0; with_bias < 2; with_bias++) {
        float *wdw = floats_copy(dw0, OC * C), *wdb = floats_copy(dbias0, OC);
        loom_matmul_backward_weight(wdw, with_bias ? wdb : NULL, dout, inp, N, C, OC);
        float *ddw = device_floats(dw0, OC * C), *ddb = device_floats(dbias0, OC);
        RUN("matmul_backward_weight",
            ops->matmul_backward_weight(backend, ddw, with_bias ? ddb : NULL, ddout, dinp_, N, C,
                                        OC));
        expect_floats("matmul_backward_weight", "dweight", ddw, wdw, OC * C);
        expect_floats("matmul_backward_weight", with_bias ? "dbias" : "dbias (NULL: untouched)",
                      ddb, with_bias ? wdb : dbias0, OC);
    }
}

/* ---- the embedding ---- */

static void test_encoder(void)
{
    enum { B = 2, T = 5, C = 12, V = 11, maxT = 8 };
    const int N = B * T, positions[T] = {3, 0, 4, 1, 2};
    int *inp = random_ints(N, 0, V);
    float *wte = random_floats(V * C, -1, 1), *wpe = random_floats(maxT * C, -1, 1);
    float *dout = random_floats(N * C, -1, 1);
    float *dwte0 = random_floats(V * C, -1, 1), *dwpe0 = random_floats(maxT * C, -1, 1);
    int *dinp = device_ints(inp, N), *dpos = device_ints(positions, T);
    float *dwte_ = device_floats(wte, V * C), *dwpe_ = device_floats(wpe, maxT * C);
    float *ddout = device_floats(dout, N * C);
    for (int with_pos = 0; with_pos < 2; with_pos++) {
        const int *pos = with_pos ? positions : NULL;
        float *want = host_alloc(N * C * sizeof(float)), *out = device_alloc(N * C * sizeof(float));
        loom_encoder_forward(want, inp, pos, wte, wpe, B, T, C);
        RUN("encoder_forward", ops->encoder_forward(backend, out, dinp, with_pos ? dpos : NULL,
                                                    dwte_, dwpe_, B, T, C));
        expect_floats("encoder_forward", "out", out, want, N * C);

        float *wdwte = floats_copy(dwte0, V * C), *wdwpe = floats_copy(dwpe0, maxT * C);
        loom_encoder_backward(wdwte, wdwpe, dout, inp, pos, B, T, C);
        float *ddwte = device_floats(dwte0, V * C), *ddwpe = device_floats(dwpe0, maxT * C);
        RUN("encoder_backward", ops->encoder_backward(backend, ddwte, ddwpe, ddout, dinp,
                                                      with_pos ? dpos : NULL, B, T, C));
        expect_floats("encoder_backward", "dwte", ddwte, wdwte, V * C);
        expect_floats("encoder_backward", "dwpe", ddwpe, wdwpe, maxT * C);
    }
}

/* The model's vocabulary-parallel embedding before backends, for the bits:
 * a slice's rows of wte, zero for tokens outside it, and back. */
static void model_embedding_rows(float *out, const int *tok, int v0, int rows, const float *wte,
                                 int N, int C)
{
    for (int n = 0; n < N; n++) {
        float *row = out + (size_t)n * C;
        int t = tok[n] - v0;
        if (t >= 0 && t < rows)
            memcpy(row, wte + (size_t)t * C, (size_t)C * sizeof(float));
        else
            memset(row, 0, (size_t)C * sizeof(float));
    }
}

static void model_embedding_rows_backward(float *dwte, const float *d, const int *tok, int v0,
                                          int rows, int N, int C)
{
    for (int n = 0; n < N; n++) {
        int t = tok[n] - v0;
        if (t < 0 || t >= rows)
            continue;
        float *row = dwte + (size_t)t * C;
        for (int c = 0; c < C; c++)
            row[c] += d[(size_t)n * C + c];
    }
}

static void test_embedding_rows(void)
{
    enum { N = 10, C = 12, V = 11, v0 = 4, rows = 5 };
    int *tok = random_ints(N, 0, V);
    tok[0] = v0; /* one token at each end of the slice, one just past it */
    tok[1] = v0 + rows - 1;
    tok[2] = v0 + rows;
    float *wte = random_floats(rows * C, -1, 1), *dout = random_floats(N * C, -1, 1);
    float *dwte0 = random_floats(rows * C, -1, 1), *out0 = random_floats(N * C, 7, 8);
    int *dtok = device_ints(tok, N);
    float *dwte_ = device_floats(wte, rows * C), *ddout = device_floats(dout, N * C);

    float *want = floats_copy(out0, N * C), *out = device_floats(out0, N * C);
    model_embedding_rows(want, tok, v0, rows, wte, N, C);
    RUN("embedding_rows_forward",
        ops->embedding_rows_forward(backend, out, dtok, v0, rows, dwte_, N, C));
    expect_floats("embedding_rows_forward", "out", out, want, N * C);
    double *ref = doubles(N * C);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            int t = tok[n] - v0;
            ref[n * C + c] = t >= 0 && t < rows ? wte[t * C + c] : 0.0;
        }
    expect_reference("embedding_rows_forward", "out", out, ref, N * C);

    float *wdwte = floats_copy(dwte0, rows * C), *ddwte = device_floats(dwte0, rows * C);
    model_embedding_rows_backward(wdwte, dout, tok, v0, rows, N, C);
    RUN("embedding_rows_backward",
        ops->embedding_rows_backward(backend, ddwte, ddout, dtok, v0, rows, N, C));
    expect_floats("embedding_rows_backward", "dwte", ddwte, wdwte, rows * C);
    double *gref = doubles(rows * C);
    for (int i = 0; i < rows * C; i++)
        gref[i] = dwte0[i];
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            if (tok[n] - v0 >= 0 && tok[n] - v0 < rows)
                gref[(tok[n] - v0) * C + c] += dout[n * C + c];
    expect_reference("embedding_rows_backward", "dwte", ddwte, gref, rows * C);
}

static void test_position(void)
{
    enum { R = 7, C = 12, maxT = 8 };
    int *pos = random_ints(R, 0, maxT);
    pos[1] = pos[0]; /* two rows at one position: backward adds both */
    float *wpe = random_floats(maxT * C, -1, 1), *x0 = random_floats(R * C, -1, 1);
    float *dx = random_floats(R * C, -1, 1), *dwpe0 = random_floats(maxT * C, -1, 1);
    int *dpos = device_ints(pos, R);
    float *dwpe_ = device_floats(wpe, maxT * C), *ddx = device_floats(dx, R * C);

    /* the model's loops: x[r] += wpe[position of r]; dwpe[position of r] += dx[r] */
    float *want = floats_copy(x0, R * C), *x = device_floats(x0, R * C);
    double *ref = doubles(R * C);
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            want[r * C + c] += wpe[pos[r] * C + c];
            ref[r * C + c] = (double)x0[r * C + c] + wpe[pos[r] * C + c];
        }
    RUN("position_forward", ops->position_forward(backend, x, dwpe_, dpos, R, C));
    expect_floats("position_forward", "x", x, want, R * C);
    expect_reference("position_forward", "x", x, ref, R * C);

    float *wd = floats_copy(dwpe0, maxT * C), *dd = device_floats(dwpe0, maxT * C);
    double *gref = doubles(maxT * C);
    for (int i = 0; i < maxT * C; i++)
        gref[i] = dwpe0[i];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            wd[pos[r] * C + c] += dx[r * C + c];
            gref[pos[r] * C + c] += dx[r * C + c];
        }
    RUN("position_backward", ops->position_backward(backend, dd, ddx, dpos, R, C));
    expect_floats("position_backward", "dwpe", dd, wd, maxT * C);
    expect_reference("position_backward", "dwpe", dd, gref, maxT * C);
}

/* ---- LayerNorm, residual, bias, GELU ---- */

static void test_layernorm(void)
{
    enum { N = 7, C = 12 };
    float *inp = random_floats(N * C, -2, 2), *other = random_floats(N * C, -2, 2);
    float *w = random_floats(C, 0.5, 1.5), *b = random_floats(C, -0.5, 0.5);
    float *dout = random_floats(N * C, -1, 1), *dinp0 = random_floats(N * C, -1, 1);
    float *dw0 = random_floats(C, -1, 1), *db0 = random_floats(C, -1, 1);
    float *dinp_ = device_floats(inp, N * C), *dother = device_floats(other, N * C);
    float *dw_ = device_floats(w, C), *db_ = device_floats(b, C);
    float *ddout = device_floats(dout, N * C);

    float *out = host_alloc(N * C * 4), *mean = host_alloc(N * 4), *rstd = host_alloc(N * 4);
    loom_layernorm_forward(out, mean, rstd, inp, w, b, N, C);
    float *dout_ = device_alloc(N * C * 4), *dmean = device_alloc(N * 4);
    float *drstd = device_alloc(N * 4);
    RUN("layernorm_forward",
        ops->layernorm_forward(backend, dout_, dmean, drstd, dinp_, dw_, db_, N, C));
    expect_floats("layernorm_forward", "out", dout_, out, N * C);
    expect_floats("layernorm_forward", "mean", dmean, mean, N);
    expect_floats("layernorm_forward", "rstd", drstd, rstd, N);

    float *res = host_alloc(N * C * 4), *out2 = host_alloc(N * C * 4);
    float *mean2 = host_alloc(N * 4), *rstd2 = host_alloc(N * 4);
    loom_residual_layernorm_forward(res, out2, mean2, rstd2, inp, other, w, b, N, C);
    float *dres = device_alloc(N * C * 4), *dout2 = device_alloc(N * C * 4);
    float *dmean2 = device_alloc(N * 4), *drstd2 = device_alloc(N * 4);
    RUN("residual_layernorm_forward",
        ops->residual_layernorm_forward(backend, dres, dout2, dmean2, drstd2, dinp_, dother, dw_,
                                        db_, N, C));
    expect_floats("residual_layernorm_forward", "res", dres, res, N * C);
    expect_floats("residual_layernorm_forward", "out", dout2, out2, N * C);
    expect_floats("residual_layernorm_forward", "mean", dmean2, mean2, N);
    expect_floats("residual_layernorm_forward", "rstd", drstd2, rstd2, N);

    float *wdinp = floats_copy(dinp0, N * C), *ddinp = device_floats(dinp0, N * C);
    loom_layernorm_backward_input(wdinp, dout, inp, w, mean, rstd, N, C);
    RUN("layernorm_backward_input", ops->layernorm_backward_input(backend, ddinp, ddout, dinp_,
                                                                  dw_, dmean, drstd, N, C));
    expect_floats("layernorm_backward_input", "dinp", ddinp, wdinp, N * C);

    float *wdw = floats_copy(dw0, C), *wdb = floats_copy(db0, C);
    float *ddw = device_floats(dw0, C), *ddb = device_floats(db0, C);
    loom_layernorm_backward_weight(wdw, wdb, dout, inp, mean, rstd, N, C);
    RUN("layernorm_backward_weight", ops->layernorm_backward_weight(backend, ddw, ddb, ddout,
                                                                    dinp_, dmean, drstd, N, C));
    expect_floats("layernorm_backward_weight", "dweight", ddw, wdw, C);
    expect_floats("layernorm_backward_weight", "dbias", ddb, wdb, C);
}

static void test_elementwise(void)
{
    enum { n = 37, N = 7, C = 12 };
    float *a = random_floats(n, -2, 2), *b = random_floats(n, -2, 2);
    float *want = host_alloc(n * 4), *out = device_alloc(n * 4);
    loom_residual_forward(want, a, b, n);
    RUN("residual_forward",
        ops->residual_forward(backend, out, device_floats(a, n), device_floats(b, n), n));
    expect_floats("residual_forward", "out", out, want, n);

    /* bias_forward and bias_backward: the model's row-parallel bias loops */
    float *x0 = random_floats(N * C, -1, 1), *bias = random_floats(C, -1, 1);
    float *dbias_ = device_floats(bias, C), *x = device_floats(x0, N * C);
    float *wx = floats_copy(x0, N * C);
    double *ref = doubles(N * C);
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++) {
            wx[r * C + c] += bias[c];
            ref[r * C + c] = (double)x0[r * C + c] + bias[c];
        }
    RUN("bias_forward", ops->bias_forward(backend, x, dbias_, N, C));
    expect_floats("bias_forward", "x", x, wx, N * C);
    expect_reference("bias_forward", "x", x, ref, N * C);

    float *dout = random_floats(N * C, -1, 1), *db0 = random_floats(C, -1, 1);
    float *wdb = floats_copy(db0, C), *ddb = device_floats(db0, C);
    double *gref = doubles(C);
    for (int c = 0; c < C; c++)
        gref[c] = db0[c];
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++) {
            wdb[c] += dout[r * C + c];
            gref[c] += dout[r * C + c];
        }
    RUN("bias_backward", ops->bias_backward(backend, ddb, device_floats(dout, N * C), N, C));
    expect_floats("bias_backward", "dbias", ddb, wdb, C);
    expect_reference("bias_backward", "dbias", ddb, gref, C);

    float *pre0 = random_floats(N * C, -3, 3), *wpre = floats_copy(pre0, N * C);
    float *wout = host_alloc(N * C * 4), *dpre = device_floats(pre0, N * C);
    float *dout_gelu = device_alloc(N * C * 4);
    loom_bias_gelu_forward(wout, wpre, bias, N, C);
    RUN("bias_gelu_forward", ops->bias_gelu_forward(backend, dout_gelu, dpre, dbias_, N, C));
    expect_floats("bias_gelu_forward", "pre", dpre, wpre, N * C);
    expect_floats("bias_gelu_forward", "out", dout_gelu, wout, N * C);

    float *inp = random_floats(n, -3, 3), *d = random_floats(n, -1, 1);
    float *dinp0 = random_floats(n, -1, 1), *wdinp = floats_copy(dinp0, n);
    float *ddinp = device_floats(dinp0, n);
    loom_gelu_backward(wdinp, inp, d, n);
    RUN("gelu_backward",
        ops->gelu_backward(backend, ddinp, device_floats(inp, n), device_floats(d, n), n));
    expect_floats("gelu_backward", "dinp", ddinp, wdinp, n);
}

/* ---- attention ---- */

/* Queries at positions 0..T-1 against the keys in two blocks (positions
 * 0..2, then 3..4), forward merging the second into the first, backward
 * block by block: f32, bf16 and f16 buffers. */
static void test_attention(loom_dtype dtype)
{
    enum { B = 2, T = 5, NH = 3, HS = 4, C = NH * HS, T1 = 3, T2 = T - T1 };
    const int q_pos[T] = {0, 1, 2, 3, 4}, k_pos1[T1] = {0, 1, 2}, k_pos2[T2] = {3, 4};
    const size_t es = loom_dtype_size(dtype), nq = (size_t)B * T * C;
    const size_t n1 = (size_t)B * T1 * C, n2 = (size_t)B * T2 * C, nl = (size_t)B * NH * T;
    const char *name = loom_dtype_name(dtype);
    char what[64];
    void *q = host_alloc(nq * es), *k1 = host_alloc(n1 * es), *v1 = host_alloc(n1 * es);
    void *k2 = host_alloc(n2 * es), *v2 = host_alloc(n2 * es), *dout = host_alloc(nq * es);
    loom_convert(q, dtype, random_floats(nq, -1.5, 1.5), LOOM_F32, nq);
    loom_convert(k1, dtype, random_floats(n1, -1.5, 1.5), LOOM_F32, n1);
    loom_convert(v1, dtype, random_floats(n1, -1, 1), LOOM_F32, n1);
    loom_convert(k2, dtype, random_floats(n2, -1.5, 1.5), LOOM_F32, n2);
    loom_convert(v2, dtype, random_floats(n2, -1, 1), LOOM_F32, n2);
    loom_convert(dout, dtype, random_floats(nq, -1, 1), LOOM_F32, nq);
    void *dq_ = upload(q, nq * es), *dk1 = upload(k1, n1 * es), *dv1 = upload(v1, n1 * es);
    void *dk2 = upload(k2, n2 * es), *dv2 = upload(v2, n2 * es), *ddout = upload(dout, nq * es);
    int *dqpos = device_ints(q_pos, T), *dkpos1 = device_ints(k_pos1, T1);
    int *dkpos2 = device_ints(k_pos2, T2);

    void *out = host_alloc(nq * es), *dout_ = device_alloc(nq * es);
    float *lse = host_alloc(nl * 4), *dlse = device_alloc(nl * 4);
    const loom_attention_kernels *cpu = &loom_attention_kernels_cpu;
    cpu->block_forward(q, q_pos, T, k1, v1, k_pos1, T1, B, NH, HS, dtype, out, lse, 1);
    cpu->block_forward(q, q_pos, T, k2, v2, k_pos2, T2, B, NH, HS, dtype, out, lse, 0);
    RUN("attention_forward", ops->attention_forward(backend, dq_, dqpos, T, dk1, dv1, dkpos1, T1,
                                                    B, NH, HS, dtype, dout_, dlse, 1));
    RUN("attention_forward", ops->attention_forward(backend, dq_, dqpos, T, dk2, dv2, dkpos2, T2,
                                                    B, NH, HS, dtype, dout_, dlse, 0));
    snprintf(what, sizeof what, "out (%s)", name);
    expect_device("attention_forward", what, dout_, out, dtype, nq);
    snprintf(what, sizeof what, "lse (%s)", name);
    expect_floats("attention_forward", what, dlse, lse, nl);

    /* gradients accumulate onto what is there */
    void *dq = host_alloc(nq * es), *dk1h = host_alloc(n1 * es), *dv1h = host_alloc(n1 * es);
    void *dk2h = host_alloc(n2 * es), *dv2h = host_alloc(n2 * es);
    loom_convert(dq, dtype, random_floats(nq, -1, 1), LOOM_F32, nq);
    loom_convert(dk1h, dtype, random_floats(n1, -1, 1), LOOM_F32, n1);
    loom_convert(dv1h, dtype, random_floats(n1, -1, 1), LOOM_F32, n1);
    loom_convert(dk2h, dtype, random_floats(n2, -1, 1), LOOM_F32, n2);
    loom_convert(dv2h, dtype, random_floats(n2, -1, 1), LOOM_F32, n2);
    void *ddq = upload(dq, nq * es), *ddk1 = upload(dk1h, n1 * es), *ddv1 = upload(dv1h, n1 * es);
    void *ddk2 = upload(dk2h, n2 * es), *ddv2 = upload(dv2h, n2 * es);
    cpu->block_backward(q, q_pos, T, k1, v1, k_pos1, T1, B, NH, HS, dtype, out, dout, lse, dq,
                        dk1h, dv1h);
    cpu->block_backward(q, q_pos, T, k2, v2, k_pos2, T2, B, NH, HS, dtype, out, dout, lse, dq,
                        dk2h, dv2h);
    RUN("attention_backward",
        ops->attention_backward(backend, dq_, dqpos, T, dk1, dv1, dkpos1, T1, B, NH, HS, dtype,
                                dout_, ddout, dlse, ddq, ddk1, ddv1));
    RUN("attention_backward",
        ops->attention_backward(backend, dq_, dqpos, T, dk2, dv2, dkpos2, T2, B, NH, HS, dtype,
                                dout_, ddout, dlse, ddq, ddk2, ddv2));
    snprintf(what, sizeof what, "dq (%s)", name);
    expect_device("attention_backward", what, ddq, dq, dtype, nq);
    snprintf(what, sizeof what, "dk, first block (%s)", name);
    expect_device("attention_backward", what, ddk1, dk1h, dtype, n1);
    snprintf(what, sizeof what, "dv, first block (%s)", name);
    expect_device("attention_backward", what, ddv1, dv1h, dtype, n1);
    snprintf(what, sizeof what, "dk, second block (%s)", name);
    expect_device("attention_backward", what, ddk2, dk2h, dtype, n2);
    snprintf(what, sizeof what, "dv, second block (%s)", name);
    expect_device("attention_backward", what, ddv2, dv2h, dtype, n2);
}

/* ---- the loss ---- */

enum { LOSS_N = 7, LOSS_V = 11, LOSS_VP = 16, SLICE_WIDTH = 8 };

/* Each row's log-sum-exp over the first V logits, in double. */
static double reference_lse(const float *x, int V)
{
    double mx = -INFINITY, s = 0;
    for (int i = 0; i < V; i++)
        mx = fmax(mx, x[i]);
    for (int i = 0; i < V; i++)
        s += exp(x[i] - mx);
    return log(s) + mx;
}

static void test_crossentropy(const float *logits, const int *targets, const float *dlosses)
{
    enum { N = LOSS_N, V = LOSS_V, Vp = LOSS_VP };
    float *losses = host_alloc(N * 4), *lse = host_alloc(N * 4);
    loom_softmax_crossentropy_forward(losses, lse, logits, targets, N, V, Vp);
    float *dlogits_ = device_floats(logits, N * Vp), *dlosses_ = device_alloc(N * 4);
    float *dlse = device_alloc(N * 4);
    int *dtargets = device_ints(targets, N);
    RUN("crossentropy_forward", ops->crossentropy_forward(backend, dlosses_, dlse, dlogits_,
                                                          dtargets, N, V, Vp));
    expect_floats("crossentropy_forward", "losses", dlosses_, losses, N);
    expect_floats("crossentropy_forward", "lse", dlse, lse, N);
    double *rloss = doubles(N), *rlse = doubles(N), *rgrad = doubles(N * Vp);
    for (int n = 0; n < N; n++) {
        rlse[n] = reference_lse(logits + n * Vp, V);
        rloss[n] = rlse[n] - logits[n * Vp + targets[n]];
        for (int i = 0; i < Vp; i++)
            rgrad[n * Vp + i] = i < V ? (exp(logits[n * Vp + i] - rlse[n]) - (i == targets[n])) *
                                            dlosses[n]
                                      : 0.0;
    }
    expect_reference("crossentropy_forward", "losses", dlosses_, rloss, N);
    expect_reference("crossentropy_forward", "lse", dlse, rlse, N);

    float *grad = floats_copy(logits, N * Vp);
    loom_softmax_crossentropy_backward(grad, dlosses, lse, targets, N, V, Vp);
    RUN("crossentropy_backward",
        ops->crossentropy_backward(backend, dlogits_, device_floats(dlosses, N), dlse, dtargets,
                                   N, V, Vp));
    expect_floats("crossentropy_backward", "logits", dlogits_, grad, N * Vp);
    expect_reference("crossentropy_backward", "logits", dlogits_, rgrad, N * Vp);
}

/* The model's vocabulary-parallel loss before backends, cut at its two
 * reductions over the tensor group, for the bits. */
static void model_slice_max(float *mx, const float *logits, int N, int width, int real)
{
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * width;
        float best = -INFINITY;
        for (int i = 0; i < real; i++)
            best = x[i] > best ? x[i] : best;
        mx[n] = best;
    }
}

static void model_slice_sums(float *sum, float *tgt, const float *logits, const float *mx,
                             const int *targets, int v0, int N, int width, int real)
{
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * width;
        double s = 0;
        for (int i = 0; i < real; i++)
            s += expf(x[i] - mx[n]);
        sum[n] = (float)s;
        int t = targets[n] - v0;
        tgt[n] = t >= 0 && t < real ? x[t] : 0.0f;
    }
}

static void model_slice_finish(float *lse, float *losses, const float *mx, const float *sum,
                               const float *tgt, int N)
{
    for (int n = 0; n < N; n++) {
        lse[n] = logf(sum[n]) + mx[n];
        losses[n] = logf(sum[n]) + mx[n] - tgt[n];
    }
}

static void model_slice_backward(float *logits, const float *dlosses, const float *lse,
                                 const int *targets, int v0, int N, int width, int real)
{
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
}

/* The vocabulary in two slices of SLICE_WIDTH columns (v0 = 0: 8 tokens;
 * v0 = 8: 3 tokens and 5 of padding), reduced between the parts as a
 * tensor group of two would: together they must give the whole
 * vocabulary's loss, log-sum-exp and gradient. */
static void test_crossentropy_slices(const float *logits, const int *targets,
                                     const float *dlosses)
{
    enum { N = LOSS_N, V = LOSS_V, Vp = LOSS_VP, W = SLICE_WIDTH, S = 2 };
    float *slice[S], *dslice[S], *mx[S], *sum[S], *tgt[S];
    int real[S], *dtargets = device_ints(targets, N);
    float *rmx = host_alloc(N * 4), *rsum = host_alloc(N * 4), *rtgt = host_alloc(N * 4);
    for (int s = 0; s < S; s++) {
        real[s] = V - s * W < W ? V - s * W : W;
        slice[s] = host_alloc(N * W * 4);
        for (int n = 0; n < N; n++)
            memcpy(slice[s] + n * W, logits + n * Vp + s * W, W * sizeof(float));
        dslice[s] = device_floats(slice[s], N * W);
        mx[s] = device_alloc(N * 4);
        sum[s] = device_alloc(N * 4);
        tgt[s] = device_alloc(N * 4);
    }

    /* the max, reduced (LOOM_MAX) */
    float *want_mx[S];
    for (int s = 0; s < S; s++) {
        want_mx[s] = host_alloc(N * 4);
        model_slice_max(want_mx[s], slice[s], N, W, real[s]);
        RUN("crossentropy_slice_max",
            ops->crossentropy_slice_max(backend, mx[s], dslice[s], N, W, real[s]));
        expect_floats("crossentropy_slice_max", s ? "max (v0 8)" : "max (v0 0)", mx[s],
                      want_mx[s], N);
    }
    for (int n = 0; n < N; n++)
        rmx[n] = want_mx[0][n] > want_mx[1][n] ? want_mx[0][n] : want_mx[1][n];
    float *dmx = device_floats(rmx, N);

    /* the sums and the target's logit, reduced (LOOM_SUM) */
    for (int s = 0; s < S; s++) {
        float *ws = host_alloc(N * 4), *wt = host_alloc(N * 4);
        model_slice_sums(ws, wt, slice[s], rmx, targets, s * W, N, W, real[s]);
        RUN("crossentropy_slice_sums", ops->crossentropy_slice_sums(backend, sum[s], tgt[s],
                                                                    dslice[s], dmx, dtargets,
                                                                    s * W, N, W, real[s]));
        expect_floats("crossentropy_slice_sums", s ? "sum (v0 8)" : "sum (v0 0)", sum[s], ws, N);
        expect_floats("crossentropy_slice_sums", s ? "target (v0 8)" : "target (v0 0)", tgt[s],
                      wt, N);
        for (int n = 0; n < N; n++) {
            rsum[n] = s ? rsum[n] + ws[n] : ws[n];
            rtgt[n] = s ? rtgt[n] + wt[n] : wt[n];
        }
    }

    float *lse = host_alloc(N * 4), *losses = host_alloc(N * 4);
    model_slice_finish(lse, losses, rmx, rsum, rtgt, N);
    float *dlse = device_alloc(N * 4), *dlosses_ = device_alloc(N * 4);
    RUN("crossentropy_slice_finish",
        ops->crossentropy_slice_finish(backend, dlse, dlosses_, dmx, device_floats(rsum, N),
                                       device_floats(rtgt, N), N));
    expect_floats("crossentropy_slice_finish", "lse", dlse, lse, N);
    expect_floats("crossentropy_slice_finish", "losses", dlosses_, losses, N);

    /* the whole vocabulary's, from the fused kernel and in double */
    float *whole_loss = host_alloc(N * 4), *whole_lse = host_alloc(N * 4);
    loom_softmax_crossentropy_forward(whole_loss, whole_lse, logits, targets, N, V, Vp);
    double *rl = doubles(N), *rlse = doubles(N), *kl = doubles(N), *klse = doubles(N);
    for (int n = 0; n < N; n++) {
        rlse[n] = reference_lse(logits + n * Vp, V);
        rl[n] = rlse[n] - logits[n * Vp + targets[n]];
        kl[n] = whole_loss[n];
        klse[n] = whole_lse[n];
    }
    expect_reference("crossentropy_slice_finish", "losses vs the whole vocabulary's", dlosses_,
                     kl, N);
    expect_reference("crossentropy_slice_finish", "lse vs the whole vocabulary's", dlse, klse, N);
    expect_reference("crossentropy_slice_finish", "losses", dlosses_, rl, N);
    expect_reference("crossentropy_slice_finish", "lse", dlse, rlse, N);

    float *whole_grad = floats_copy(logits, N * Vp);
    loom_softmax_crossentropy_backward(whole_grad, dlosses, whole_lse, targets, N, V, Vp);
    float *ddl = device_floats(dlosses, N);
    for (int s = 0; s < S; s++) {
        float *want = floats_copy(slice[s], N * W);
        model_slice_backward(want, dlosses, lse, targets, s * W, N, W, real[s]);
        RUN("crossentropy_slice_backward",
            ops->crossentropy_slice_backward(backend, dslice[s], ddl, dlse, dtargets, s * W, N, W,
                                             real[s]));
        const char *what = s ? "logits (v0 8)" : "logits (v0 0)";
        expect_floats("crossentropy_slice_backward", what, dslice[s], want, N * W);
        double *ref = doubles(N * W), *fused = doubles(N * W);
        for (int n = 0; n < N; n++)
            for (int i = 0; i < W; i++) {
                int col = s * W + i, t = targets[n];
                ref[n * W + i] = col < V ? (exp(logits[n * Vp + col] - rlse[n]) - (col == t)) *
                                               dlosses[n]
                                         : 0.0;
                fused[n * W + i] = whole_grad[n * Vp + col];
            }
        expect_reference("crossentropy_slice_backward", what, dslice[s], ref, N * W);
        expect_reference("crossentropy_slice_backward", "logits vs the whole vocabulary's",
                         dslice[s], fused, N * W);
    }
}

static void test_loss(void)
{
    enum { N = LOSS_N, V = LOSS_V, Vp = LOSS_VP };
    float *logits = random_floats(N * Vp, -3, 3);
    int *targets = random_ints(N, 0, V);
    targets[0] = 0;     /* in the first slice ... */
    targets[1] = V - 1; /* ... and the last token, in the second */
    float *dlosses = random_floats(N, 0.1, 1);
    test_crossentropy(logits, targets, dlosses);
    test_crossentropy_slices(logits, targets, dlosses);

    /* the model's loss mean, on several sets of losses: one set may round
     * alike however the mean is taken */
    for (int trial = 0, n = 37; trial < 16; trial++, n += 3) {
        float *x = random_floats(n, 0, 12), got = 0;
        double sum = 0;
        for (int i = 0; i < n; i++)
            sum += x[i];
        float want = (float)(sum / n);
        RUN("mean", ops->mean(backend, device_floats(x, n), n, &got));
        expect_typed("mean", "mean", &got, &want, LOOM_F32, 1, tolerance);
        CHECK(fabs(got - sum / n) <= 1e-6 * (sum / n), "mean: %.9g, the double reference %.9g",
              got, sum / n);
    }
}

/* ---- the optimizer and the norm ---- */

/* The strategies' sum of squares before backends (strategy_add_squares):
 * element i in running sum i mod 8, the eight added into sum at the end. */
static double eight_lane_squares(double sum, const void *x, loom_dtype dtype, size_t n)
{
    double lane[8] = {0};
    for (size_t i = 0; i < n; i++) {
        double e = loom_load_f32(x, dtype, i);
        lane[i % 8] += e * e;
    }
    for (int k = 0; k < 8; k++)
        sum += lane[k];
    return sum;
}

static void test_adamw(void)
{
    enum { n = 37 };
    const loom_compute_adamw k = {.step = 3, .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f,
                                  .eps = 1e-8f, .weight_decay = 0.1f, .grad_scale = 0.5f};
    const loom_optimizer_step s = {.step = k.step, .lr = k.lr, .beta1 = k.beta1,
                                   .beta2 = k.beta2, .eps = k.eps,
                                   .weight_decay = k.weight_decay, .grad_scale = k.grad_scale};
    const loom_unit unit = {.name = "conformance", .numel = n};
    const struct {
        loom_dtype grad, params;
        int store;
        const char *label;
    } cases[] = {
        {LOOM_F32, LOOM_F32, 0, "f32 gradients"},
        {LOOM_BF16, LOOM_BF16, 1, "bf16 gradients, bf16 parameters"},
        {LOOM_F32, LOOM_F16, 1, "f32 gradients, f16 parameters"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const loom_dtype gt = cases[c].grad, pt = cases[c].params;
        const size_t gs = loom_dtype_size(gt), ps = loom_dtype_size(pt);
        float *master = random_floats(n, -1, 1), *m = random_floats(n, -0.1, 0.1);
        float *v = random_floats(n, 0, 0.01);
        void *grad = host_alloc(n * gs), *params = host_alloc(n * ps);
        loom_convert(grad, gt, random_floats(n, -2, 2), LOOM_F32, n);
        float *dmaster = device_floats(master, n), *dm = device_floats(m, n);
        float *dv = device_floats(v, n);
        void *dgrad = upload(grad, n * gs), *dparams = upload(params, n * ps);
        float *wmaster = floats_copy(master, n), *wm = floats_copy(m, n), *wv = floats_copy(v, n);
        void *wparams = copy_of(params, n * ps);
        loom_adamw_update_range_store_all(&s, &unit, 0, wmaster, grad, gt, wm, wv, n,
                                          cases[c].store ? wparams : NULL, pt);
        RUN("adamw", ops->adamw(backend, &k, dmaster, dgrad, gt, dm, dv, n,
                                cases[c].store ? dparams : NULL, pt));
        char what[96];
        snprintf(what, sizeof what, "master (%s)", cases[c].label);
        expect_floats("adamw", what, dmaster, wmaster, n);
        snprintf(what, sizeof what, "m (%s)", cases[c].label);
        expect_floats("adamw", what, dm, wm, n);
        snprintf(what, sizeof what, "v (%s)", cases[c].label);
        expect_floats("adamw", what, dv, wv, n);
        snprintf(what, sizeof what, "params (%s)", cases[c].label);
        expect_device("adamw", what, dparams, wparams, pt, n);

        /* llm.c's update written out in double */
        double *ref = doubles(n);
        for (int i = 0; i < n; i++) {
            double g = loom_load_f32(grad, gt, i) * (double)k.grad_scale;
            double mi = k.beta1 * (double)m[i] + (1 - (double)k.beta1) * g;
            double vi = k.beta2 * (double)v[i] + (1 - (double)k.beta2) * g * g;
            double mh = mi / (1 - pow(k.beta1, (double)k.step));
            double vh = vi / (1 - pow(k.beta2, (double)k.step));
            ref[i] = master[i] - k.lr * (mh / (sqrt(vh) + k.eps) + k.weight_decay * master[i]);
        }
        snprintf(what, sizeof what, "master (%s)", cases[c].label);
        expect_reference("adamw", what, dmaster, ref, n);
    }
}

static void test_norm(void)
{
    enum { n = 301 };
    const loom_dtype types[] = {LOOM_F32, LOOM_BF16, LOOM_F16};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const loom_dtype dt = types[t];
        /* magnitudes far apart (within f16's range), so that the sums round
         * and their order shows in the bits */
        const int spread_exp = dt == LOOM_F16 ? 6 : 20;
        float *spread = random_floats(n, -3, 3);
        for (int i = 0; i < n; i++)
            spread[i] = ldexpf(spread[i], (int)uniform(-spread_exp, spread_exp + 1));
        void *x = host_alloc(n * loom_dtype_size(dt));
        loom_convert(x, dt, spread, LOOM_F32, n);
        void *dx = upload(x, n * loom_dtype_size(dt));
        double got = 0.25, want = eight_lane_squares(0.25, x, dt, n), plain = 0.25;
        for (int i = 0; i < n; i++)
            plain += (double)loom_load_f32(x, dt, i) * loom_load_f32(x, dt, i);
        RUN("sum_squares", ops->sum_squares(backend, dx, dt, n, &got));
        char what[64];
        snprintf(what, sizeof what, "sum (%s) vs the strategies' 8-lane sum", loom_dtype_name(dt));
        if (tolerance == 0 ? memcmp(&got, &want, sizeof got) != 0
                           : !(fabs(got - want) <= tolerance * fmax(1.0, fabs(want)))) {
            failures++;
            fprintf(stderr, "FAIL sum_squares: %s: %.17g, want %.17g\n", what, got, want);
        }
        CHECK(fabs(got - plain) <= 1e-12 * plain, "sum_squares (%s): %.17g, the plain sum %.17g",
              loom_dtype_name(dt), got, plain);

        /* 3 not finite of n: inf, -inf, NaN */
        void *bad = copy_of(x, n * loom_dtype_size(dt));
        loom_store_f32(bad, dt, 3, INFINITY);
        loom_store_f32(bad, dt, 17, -INFINITY);
        loom_store_f32(bad, dt, n - 1, NAN);
        size_t count = 99, none = 99;
        RUN("count_nonfinite",
            ops->count_nonfinite(backend, upload(bad, n * loom_dtype_size(dt)), dt, n, &count));
        RUN("count_nonfinite", ops->count_nonfinite(backend, dx, dt, n, &none));
        CHECK(count == 3, "count_nonfinite (%s): %zu, want 3", loom_dtype_name(dt), count);
        CHECK(none == 0, "count_nonfinite (%s): %zu, want 0", loom_dtype_name(dt), none);
    }

    float *x = random_floats(n, -3, 3), *want = floats_copy(x, n), *dx = device_floats(x, n);
    for (int i = 0; i < n; i++)
        want[i] *= 0.375f;
    RUN("scale", ops->scale(backend, dx, 0.375f, n));
    expect_floats("scale", "x", dx, want, n);
}

/* ---- conversions ---- */

static void test_convert(void)
{
    enum { n = 37 };
    const struct {
        loom_dtype dst, src;
    } pairs[] = {{LOOM_BF16, LOOM_F32}, {LOOM_F16, LOOM_F32}, {LOOM_F32, LOOM_BF16},
                 {LOOM_F32, LOOM_F16},  {LOOM_F32, LOOM_F32}};
    char what[64];
    for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++) {
        const loom_dtype dt = pairs[p].dst, st = pairs[p].src;
        void *src = host_alloc(n * loom_dtype_size(st));
        loom_convert(src, st, random_floats(n, -100, 100), LOOM_F32, n);
        loom_store_f32(src, st, 5, NAN); /* NaN stays NaN */
        void *want = host_alloc(n * loom_dtype_size(dt)), *dst = device_alloc(n * loom_dtype_size(dt));
        loom_convert(want, dt, src, st, n);
        RUN("convert", ops->convert(backend, dst, dt, upload(src, n * loom_dtype_size(st)), st, n));
        snprintf(what, sizeof what, "%s from %s", loom_dtype_name(dt), loom_dtype_name(st));
        expect_device("convert", what, dst, want, dt, n);
    }

    const loom_dtype types[] = {LOOM_F32, LOOM_BF16, LOOM_F16};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const loom_dtype dt = types[t];
        void *dst = host_alloc(n * loom_dtype_size(dt));
        loom_convert(dst, dt, random_floats(n, -4, 4), LOOM_F32, n);
        float *src = random_floats(n, -1, 1), *zeros = host_alloc(n * 4);
        void *ddst = upload(dst, n * loom_dtype_size(dt));
        float *dsrc = device_floats(src, n);
        loom_accumulate(dst, dt, src, n);
        RUN("accumulate", ops->accumulate(backend, ddst, dt, dsrc, n));
        snprintf(what, sizeof what, "dst (%s)", loom_dtype_name(dt));
        expect_device("accumulate", what, ddst, dst, dt, n);
        snprintf(what, sizeof what, "src zeroed (%s)", loom_dtype_name(dt));
        expect_floats("accumulate", what, dsrc, zeros, n);
    }
}

/* ---- the built-in backend's own promises ---- */

static void test_cpu_backend(void)
{
    /* create changes nothing of the process's: the kernels' threads stay */
    const int threads = loom_kernels_threads();
    loom_compute_setup setup = {.struct_size = sizeof setup, .threads = threads + 3,
                                .precision = LOOM_BF16, .cpu = &loom_compute_cpu};
    loom_compute *other = NULL;
    OK(loom_compute_cpu.create(NULL, &setup, &other));
    CHECK(loom_kernels_threads() == threads, "create changed the kernels' threads");
    OK(loom_compute_cpu.destroy(other));
    CHECK(ops->multiply_dtype(backend, LOOM_BF16) == loom_gemm_multiply_dtype());
    CHECK(ops->multiply_dtype(backend, LOOM_F16) == LOOM_F32);
    CHECK(loom_compute_cpu.tier == LOOM_TIER_HOST && loom_compute_cpu.mem_kind == LOOM_MEM_HOST);
    CHECK(!loom_compute_cpu.alloc && !loom_compute_cpu.free && !loom_compute_cpu.probe);
    char line[256];
    OK(ops->describe(backend, line, sizeof line));
    CHECK(strncmp(line, "cpu: ", 5) == 0, "describe: \"%s\"", line);

    /* a call that cannot be right is refused, naming the op */
    CHECK(ops->zero(backend, NULL, 16) == LOOM_ERR_INVALID);
    CHECK_ERROR("compute backend cpu: zero called with");
    CHECK(ops->matmul_forward(backend, NULL, NULL, (loom_compute_weight){NULL, LOOM_F32}, NULL, 7,
                              12, 20) == LOOM_ERR_INVALID);
    CHECK_ERROR("matmul_forward");
    CHECK(ops->bias_forward(backend, NULL, NULL, -1, 12) == LOOM_ERR_INVALID);
    CHECK_ERROR("bias_forward called with rows >= 0");
}

/* ---- a plugin's host ---- */

static void host_log(const loom_host *host, loom_log_level level, const char *fmt, ...)
{
    (void)host;
    va_list ap;
    va_start(ap, fmt);
    loom_vlog(level, "compute_conformance", fmt, ap);
    va_end(ap);
}

static int host_error(const loom_host *host, int status, const char *fmt, ...)
{
    (void)host;
    va_list ap;
    va_start(ap, fmt);
    int rc = loom_vfail(status, fmt, ap);
    va_end(ap);
    return rc;
}

/* No config here: every setting takes its default. */
static int host_config_int(const loom_host *host, const char *name, int64_t *out)
{
    (void)host;
    (void)name;
    (void)out;
    return LOOM_ERR_NOT_FOUND;
}
static int host_config_float(const loom_host *host, const char *name, double *out)
{
    (void)host;
    (void)name;
    (void)out;
    return LOOM_ERR_NOT_FOUND;
}
static int host_config_bool(const loom_host *host, const char *name, int *out)
{
    (void)host;
    (void)name;
    (void)out;
    return LOOM_ERR_NOT_FOUND;
}
static int host_config_string(const loom_host *host, const char *name, const char **out)
{
    (void)host;
    (void)name;
    (void)out;
    return LOOM_ERR_NOT_FOUND;
}

static int host_mem_alloc(const loom_host *host, loom_tier tier, loom_purpose purpose,
                          size_t bytes, void **out)
{
    (void)host;
    (void)tier;
    (void)purpose;
    *out = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    return *out ? LOOM_OK : loom_fail(LOOM_ERR_NO_MEMORY, "out of memory (%zu bytes)", bytes);
}

static void host_mem_free(const loom_host *host, void *ptr)
{
    (void)host;
    free(ptr);
}

static const loom_host test_host = {
    .struct_size = sizeof(loom_host),
    .version = LOOM_HOST_VERSION,
    .world_size = 1,
    .local_size = 1,
    .timeout_s = 60,
    .log = host_log,
    .error = host_error,
    .config_int = host_config_int,
    .config_float = host_config_float,
    .config_bool = host_config_bool,
    .config_string = host_config_string,
    .mem_alloc = host_mem_alloc,
    .mem_free = host_mem_free,
    .now_ns = loom_now_ns,
};

int main(int argc, char **argv)
{
    if (argc > 3) {
        fprintf(stderr, "usage: compute_conformance [libloom-compute-<name>.so [tolerance]]\n");
        return 2;
    }
    loom_plugin *plugin = NULL;
    ops = &loom_compute_cpu;
    if (argc > 1) {
        int rc = loom_plugin_load_file(argv[1], LOOM_PLUGIN_COMPUTE, NULL, NULL, &plugin);
        if (rc != LOOM_OK) {
            fprintf(stderr, "compute_conformance: %s\n", loom_last_error());
            return 1;
        }
        /* the loader's checked copy of the plugin's struct, header first */
        ops = (const loom_compute_plugin_v1_t *)plugin->header;
    }
    if (argc > 2) {
        char *end;
        tolerance = strtod(argv[2], &end);
        if (*end || end == argv[2] || !(tolerance >= 0 && tolerance < 1)) {
            fprintf(stderr, "compute_conformance: tolerance '%s' is not a number in [0, 1): "
                            "give 0 for the same bits, or a relative error such as 1e-5\n",
                    argv[2]);
            return 2;
        }
    }
    loom_kernels_set_threads(1);
    loom_compute_setup setup = {.struct_size = sizeof setup, .device = 0, .threads = 1,
                                .precision = LOOM_F32, .deterministic = 1,
                                .cpu = &loom_compute_cpu};
    OK(ops->create(&test_host, &setup, &backend));
    printf("== %s (%s)\n", ops->header.name, tolerance == 0 ? "the same bits" : argv[2]);

    test_memory();
    test_gemm();
    test_matmul();
    test_encoder();
    test_embedding_rows();
    test_position();
    test_layernorm();
    test_elementwise();
    test_attention(LOOM_F32);
    test_attention(LOOM_BF16);
    test_attention(LOOM_F16);
    test_loss();
    test_adamw();
    test_norm();
    test_convert();
    RUN("status", ops->status(backend));
    RUN("synchronize", ops->synchronize(backend));
    if (ops == &loom_compute_cpu)
        test_cpu_backend();

    release_buffers();
    OK(ops->destroy(backend));
    if (plugin)
        loom_plugin_unload(plugin);
    return check_done("compute_conformance");
}
