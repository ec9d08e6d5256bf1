/* compute-cuda's row kernels, the parts that run on the host: GELU and its
 * derivative, a lane's part of LayerNorm forward and backward (a warp
 * emulated lane by lane, its xor-shuffle sum in the same pairs), the
 * split of column sums and the host's grouping of rows for the scatters
 * into wte and wpe. Compared with the cpu backend's formulas (written out
 * below as core/model/kernels.c has them) and with double precision. No
 * GPU is needed: without --device nothing here launches a kernel.
 *
 * --device (exit 77 where there is no GPU) then runs every launcher of
 * kernels_rows.cu on the GPU, at odd sizes and GPT-2 124M's, on aligned
 * and misaligned rows: against double precision, against the cpu
 * backend's loops bit for bit where the order is theirs (the embedding's
 * scatters, residual, bias), misaligned against aligned bit for bit, and
 * run against run; then prints each kernel's time at GPT-2 124M's shapes.
 *
 *   nvcc -std=c++17 -arch=sm_90 -O2 -I plugins/compute-cuda \
 *       tests/compute/cuda_rows_host_test.cu -o cuda_rows_host_test
 *   ./cuda_rows_host_test [--device] */
#include "kernels_rows.cu"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "cuda_rows_host_test: %s:%d: ", __FILE__, __LINE__);                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            if (++failures > 20)                                                                   \
                exit(1);                                                                           \
        }                                                                                          \
    } while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static double uniform(double lo, double hi)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * (double)(rng_state >> 11) / 9007199254740992.0;
}

static int close_to(double got, double want, double tol)
{
    return fabs(got - want) <= tol * fmax(1.0, fabs(want));
}

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* ---- the cpu backend's GELU, as kernels.c computes it (exp_fast) ---- */

static float as_float(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t as_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float cpu_exp_fast(float x)
{
    const uint32_t xb = as_bits(x);
    const uint32_t is_nan = 0u - (uint32_t)((xb & 0x7fffffffu) > 0x7f800000u);
    const uint32_t tiny = 0u - (uint32_t)(xb > 0xc2ae0000u);
    const uint32_t huge = 0u - (uint32_t)((xb > 0x42b00000u) & (xb < 0x80000000u));
    const uint32_t off = tiny | huge;
    const float xc = as_float(xb & ~off);
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const float y = p * as_float((uint32_t)((int32_t)n + 127) << 23);
    uint32_t yb = (as_bits(y) & ~off) | (huge & 0x7f800000u);
    yb = (yb & ~is_nan) | (is_nan & 0x7fc00000u);
    return as_float(yb);
}

static float cpu_gelu_gate(float a, float *slope)
{
    const uint32_t ab = as_bits(a);
    const float e = cpu_exp_fast(as_float(as_bits(2.0f * a) | 0x80000000u));
    const float inv = 1.0f / (1.0f + e);
    const uint32_t neg = 0u - (ab >> 31);
    *slope = e * inv * inv;
    return as_float((as_bits(inv) & ~neg) | (as_bits(e * inv) & neg));
}

static float cpu_gelu(float x)
{
    float slope;
    return x * cpu_gelu_gate(0.7978845608028654f * (x + 0.044715f * x * x * x), &slope);
}

static float cpu_gelu_grad(float x)
{
    float slope;
    const float gate = cpu_gelu_gate(0.7978845608028654f * (x + 0.044715f * x * x * x), &slope);
    return gate + 2.0f * x * slope * 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
}

/* llm.c's form, in double */
static double ref_gelu(double x)
{
    const double a = sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + tanh(a));
}

static double ref_gelu_grad(double x)
{
    const double a = sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
    const double t = tanh(a), sech2 = 1.0 - t * t;
    return 0.5 * (1.0 + t) + x * 0.5 * sech2 * sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * x * x);
}

static void test_gelu(void)
{
    float xs[4096];
    int n = 0;
    const float special[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 1.0f, -1.0f, 5.0f, -5.0f, 10.0f,
                             -10.0f, 20.0f, -20.0f, 60.0f, -60.0f};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++)
        xs[n++] = special[i];
    for (; n < 4096; n++)
        xs[n] = (float)(n % 2 ? uniform(-8, 8) : uniform(-1, 1));
    for (int i = 0; i < n; i++) {
        const float x = xs[i];
        const float g = gelu_value(x), d = gelu_derivative(x);
        EXPECT(close_to(g, cpu_gelu(x), 1e-6), "gelu(%.9g) = %.9g, the cpu's %.9g", x, g,
               cpu_gelu(x));
        EXPECT(close_to(d, cpu_gelu_grad(x), 1e-6), "gelu'(%.9g) = %.9g, the cpu's %.9g", x, d,
               cpu_gelu_grad(x));
        EXPECT(close_to(g, ref_gelu(x), 1e-6), "gelu(%.9g) = %.9g, double %.9g", x, g,
               ref_gelu(x));
        EXPECT(close_to(d, ref_gelu_grad(x), 1e-6), "gelu'(%.9g) = %.9g, double %.9g", x, d,
               ref_gelu_grad(x));
    }
    EXPECT(isnan(gelu_value(NAN)) && isnan(gelu_derivative(NAN)), "gelu of NaN is not NaN");
    EXPECT(gelu_value(INFINITY) == INFINITY, "gelu(inf) = %g", gelu_value(INFINITY));
    /* x³ overflows: the cpu's derivative is 1 + 0·inf = NaN there, and so is this one */
    const float huge[] = {1e30f, -1e30f, 3e38f};
    for (int i = 0; i < 3; i++)
        EXPECT(isnan(gelu_derivative(huge[i])) == isnan(cpu_gelu_grad(huge[i])) &&
                   same_bits(gelu_value(huge[i]), cpu_gelu(huge[i])),
               "gelu at %g: %g and %g, the cpu's %g and %g", huge[i], gelu_value(huge[i]),
               gelu_derivative(huge[i]), cpu_gelu(huge[i]), cpu_gelu_grad(huge[i]));
}

/* ---- a warp, lane by lane ---- */

/* warp_sum's pairs: at each step lane l adds lane l ^ m's value to its own */
static float emulated_warp_sum(const float lanes[WARP])
{
    float v[WARP], next[WARP];
    memcpy(v, lanes, sizeof v);
    for (int m = WARP / 2; m > 0; m /= 2) {
        for (int l = 0; l < WARP; l++)
            next[l] = v[l] + v[l ^ m];
        memcpy(v, next, sizeof v);
    }
    for (int l = 1; l < WARP; l++)
        EXPECT(same_bits(v[l], v[0]), "warp sum: lane %d differs from lane 0", l);
    return v[0];
}

/* layernorm_row on the host */
static void emulated_layernorm_row(float *o, float *mean, float *rstd, const float *x,
                                   const float *w, const float *b, int C, int vec)
{
    float lanes[WARP];
    for (int l = 0; l < WARP; l++)
        lanes[l] = lane_sum(x, l, C, vec);
    const float m = emulated_warp_sum(lanes) / (float)C;
    for (int l = 0; l < WARP; l++)
        lanes[l] = lane_squares(x, m, l, C, vec);
    const float s = layernorm_rstd(emulated_warp_sum(lanes), C);
    for (int l = 0; l < WARP; l++)
        lane_normalize(o, x, w, b, m, s, l, C, vec);
    *mean = m;
    *rstd = s;
}

static void emulated_layernorm_backward_row(float *dx, const float *d, const float *x,
                                            const float *w, float m, float s, int C, int vec)
{
    float a[WARP], b[WARP];
    for (int l = 0; l < WARP; l++)
        lane_backward_sums(&a[l], &b[l], d, x, w, m, s, l, C, vec);
    const float dnorm_mean = emulated_warp_sum(a) / (float)C;
    const float dnorm_norm_mean = emulated_warp_sum(b) / (float)C;
    for (int l = 0; l < WARP; l++)
        lane_backward_input(dx, d, x, w, m, s, dnorm_mean, dnorm_norm_mean, l, C, vec);
}

/* 16-byte aligned floats, plus the offset asked (a row that is not) */
static float *floats(int n, int offset)
{
    float *p = (float *)aligned_alloc(16, ((size_t)(n + offset) * sizeof(float) + 15) / 16 * 16);
    if (!p) {
        fprintf(stderr, "cuda_rows_host_test: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < n + offset; i++)
        p[i] = NAN; /* a value never written stays NaN */
    return p + offset;
}

static void fill(float *p, int n, double lo, double hi)
{
    for (int i = 0; i < n; i++)
        p[i] = (float)uniform(lo, hi);
}

static void test_layernorm(int C)
{
    float *x = floats(C, 0), *w = floats(C, 0), *b = floats(C, 0), *d = floats(C, 0);
    float *xo = floats(C, 1); /* misaligned: the scalar loads */
    fill(x, C, -2, 2);
    fill(w, C, 0.5, 1.5);
    fill(b, C, -0.5, 0.5);
    fill(d, C, -1, 1);
    memcpy(xo, x, (size_t)C * sizeof(float));

    /* double references */
    double dm = 0, dv = 0;
    for (int i = 0; i < C; i++)
        dm += x[i];
    dm /= C;
    for (int i = 0; i < C; i++)
        dv += (x[i] - dm) * (x[i] - dm);
    dv /= C;
    const double ds = 1.0 / sqrt(dv + 1e-5);

    float *outs[2] = {floats(C, 0), floats(C, 0)};
    float means[2], rstds[2];
    const int can_vec = C % 4 == 0;
    for (int vec = 0; vec <= can_vec; vec++) {
        emulated_layernorm_row(outs[vec], &means[vec], &rstds[vec], vec ? x : xo, w, b, C, vec);
        EXPECT(close_to(means[vec], dm, 1e-6), "C %d vec %d: mean %.9g, double %.9g", C, vec,
               means[vec], dm);
        EXPECT(close_to(rstds[vec], ds, 1e-5), "C %d vec %d: rstd %.9g, double %.9g", C, vec,
               rstds[vec], ds);
        for (int i = 0; i < C; i++) {
            const double want = (x[i] - dm) * ds * w[i] + b[i];
            EXPECT(close_to(outs[vec][i], want, 1e-5), "C %d vec %d: out[%d] %.9g, double %.9g",
                   C, vec, i, outs[vec][i], want);
        }
    }
    if (can_vec) {
        EXPECT(same_bits(means[0], means[1]) && same_bits(rstds[0], rstds[1]),
               "C %d: float4 and scalar loads give different mean or rstd", C);
        for (int i = 0; i < C; i++)
            EXPECT(same_bits(outs[0][i], outs[1][i]), "C %d: out[%d] differs by load", C, i);
    }

    /* backward input: dx += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * s, from the
     * forward's own mean and rstd */
    const float m = means[0], s = rstds[0];
    double a = 0, bb = 0;
    for (int i = 0; i < C; i++) {
        const double norm = ((double)x[i] - m) * s, dnorm = (double)w[i] * d[i];
        a += dnorm;
        bb += dnorm * norm;
    }
    a /= C;
    bb /= C;
    float *dxs[2] = {floats(C, 0), floats(C, 1)};
    float *dxo = floats(C, 1), *d_o = floats(C, 1);
    memcpy(d_o, d, (size_t)C * sizeof(float));
    for (int vec = 0; vec <= can_vec; vec++) {
        float *dx = vec ? dxs[0] : dxo;
        fill(dx, C, 0.25, 0.25); /* every element 0.25 before: accumulates */
        emulated_layernorm_backward_row(dx, vec ? d : d_o, vec ? x : xo, w, m, s, C, vec);
        for (int i = 0; i < C; i++) {
            const double norm = ((double)x[i] - m) * s, dnorm = (double)w[i] * d[i];
            const double want = 0.25 + (dnorm - a - norm * bb) * s;
            EXPECT(close_to(dx[i], want, 1e-5), "C %d vec %d: dx[%d] %.9g, double %.9g", C, vec,
                   i, dx[i], want);
        }
    }
    if (can_vec)
        for (int i = 0; i < C; i++)
            EXPECT(same_bits(dxs[0][i], dxo[i]), "C %d: dx[%d] differs by load", C, i);

    /* residual: res = a + b chunk by chunk, then LayerNorm of res: the bits of the two apart */
    float *ra = floats(C, 0), *rb = floats(C, 0), *res = floats(C, 0), *out2 = floats(C, 0);
    fill(ra, C, -1, 1);
    for (int i = 0; i < C; i++)
        rb[i] = x[i] - ra[i];
    float av[4], bv[4];
    for (int l = 0; l < WARP; l++)
        for (int j = l; j < row_chunks(C); j += WARP) {
            const int n = load_chunk(av, ra, j, C, can_vec);
            load_chunk(bv, rb, j, C, can_vec);
            for (int k = 0; k < 4; k++)
                av[k] += bv[k];
            store_chunk(res, j, n, av, can_vec);
        }
    for (int i = 0; i < C; i++)
        EXPECT(same_bits(res[i], ra[i] + rb[i]), "C %d: res[%d] is not a + b", C, i);
    float m2, s2, m3, s3;
    float *out3 = floats(C, 0);
    emulated_layernorm_row(out2, &m2, &s2, res, w, b, C, can_vec);
    emulated_layernorm_row(out3, &m3, &s3, res, w, b, C, 0);
    EXPECT(same_bits(m2, m3) && same_bits(s2, s3), "C %d: residual LayerNorm stats differ", C);
    for (int i = 0; i < C; i++)
        EXPECT(same_bits(out2[i], out3[i]), "C %d: residual LayerNorm out[%d] differs", C, i);

    free(x);
    free(w);
    free(b);
    free(d);
    free(xo - 1);
    free(outs[0]);
    free(outs[1]);
    free(dxs[0]);
    free(dxs[1] - 1);
    free(dxo - 1);
    free(d_o - 1);
    free(ra);
    free(rb);
    free(res);
    free(out2);
    free(out3);
}

/* ---- column sums' split ---- */

static void test_plan(void)
{
    const int Ns[] = {1, 7, 8, 31, 1000, 16384, 65537, 1 << 22};
    const int Cs[] = {1, 8, 12, 33, 768, 3072, 50304, 200000};
    const size_t scratches[] = {1 << 20, 64 << 20, 4096};
    const int sms[] = {0, 1, 132};
    for (size_t a = 0; a < sizeof Ns / sizeof *Ns; a++)
        for (size_t c = 0; c < sizeof Cs / sizeof *Cs; c++)
            for (size_t s = 0; s < sizeof scratches / sizeof *scratches; s++)
                for (size_t k = 0; k < sizeof sms / sizeof *sms; k++)
                    for (int arrays = 1; arrays <= 2; arrays++) {
                        const int N = Ns[a], C = Cs[c];
                        const size_t bytes = scratches[s];
                        const column_plan p = plan_columns(N, C, arrays, bytes, sms[k]);
                        const int fits = (size_t)arrays * C * sizeof(float) <= bytes;
                        EXPECT(p.chunks >= 1 && p.chunks <= 65535 && p.rows_per_chunk >= 1,
                               "N %d C %d: %d chunks of %d rows", N, C, p.chunks,
                               p.rows_per_chunk);
                        EXPECT((long long)p.chunks * p.rows_per_chunk >= N &&
                                   (long long)(p.chunks - 1) * p.rows_per_chunk < N,
                               "N %d C %d: %d chunks of %d rows do not cover the rows once", N,
                               C, p.chunks, p.rows_per_chunk);
                        EXPECT(p.direct == !fits, "N %d C %d scratch %zu: direct %d", N, C,
                               bytes, p.direct);
                        EXPECT(p.direct || (size_t)arrays * p.chunks * C * sizeof(float) <= bytes,
                               "N %d C %d: %d chunks overflow %zu bytes of scratch", N, C,
                               p.chunks, bytes);
                        EXPECT(!p.direct || p.chunks == 1, "N %d C %d: direct in %d chunks", N,
                               C, p.chunks);
                    }
}

/* ---- grouping rows for the scatters ---- */

/* the grouped adds as grouped_rows_add_kernel does them, on the host */
static void emulated_grouped_add(float *dst, const float *src, const row_groups *g, int C)
{
    for (int k = 0; k < g->groups; k++)
        for (int c = 0; c < C; c++) {
            float acc = dst[(size_t)g->key[k] * C + c];
            for (int i = g->start[k]; i < g->start[k + 1]; i++)
                acc += src[(size_t)g->row[i] * C + c];
            dst[(size_t)g->key[k] * C + c] = acc;
        }
}

static void test_grouping(int n, int keys, int skip_some)
{
    int *key = (int *)malloc((size_t)n * sizeof(int));
    int *out = (int *)malloc(groups_ints(n) * sizeof(int));
    int *work = (int *)malloc(groups_work_ints(n) * sizeof(int));
    int *seen = (int *)calloc((size_t)n, sizeof(int));
    if (!key || !out || !work || !seen) {
        fprintf(stderr, "cuda_rows_host_test: out of memory\n");
        exit(1);
    }
    for (int r = 0; r < n; r++) {
        key[r] = (int)uniform(0, keys);
        if (keys > RADIX && r % 3 == 0)
            key[r] = (int)uniform(0, 4); /* low keys among high ones: both digits sort */
        if (skip_some && r % 5 == 2)
            key[r] = -1;
    }
    row_groups g;
    const size_t used = group_rows(&g, out, key, n, work);
    EXPECT(used == 2 * (size_t)g.groups + 1 + (size_t)g.rows && used <= groups_ints(n),
           "n %d: %zu ints used for %d groups of %d rows", n, used, g.groups, g.rows);
    EXPECT(g.start == out && g.key == out + g.groups + 1 && g.row == g.key + g.groups,
           "n %d: the arrays are not laid one after the other", n);
    EXPECT(g.start[0] == 0 && g.start[g.groups] == g.rows, "n %d: groups span [%d, %d)", n,
           g.start[0], g.start[g.groups]);
    int rows = 0;
    for (int r = 0; r < n; r++)
        rows += key[r] >= 0;
    EXPECT(g.rows == rows, "n %d: %d rows grouped, %d have a key", n, g.rows, rows);
    for (int k = 0; k < g.groups; k++) {
        EXPECT(k == 0 || g.key[k] > g.key[k - 1], "n %d: group keys not increasing at %d", n, k);
        EXPECT(g.start[k + 1] > g.start[k], "n %d: group %d is empty", n, k);
        for (int i = g.start[k]; i < g.start[k + 1]; i++) {
            const int r = g.row[i];
            EXPECT(r >= 0 && r < n, "n %d: row %d out of range", n, r);
            if (r < 0 || r >= n)
                continue;
            seen[r]++;
            EXPECT(key[r] == g.key[k], "n %d: row %d (key %d) in group of key %d", n, r, key[r],
                   g.key[k]);
            EXPECT(i == g.start[k] || r > g.row[i - 1], "n %d: group %d out of row order", n, k);
        }
    }
    for (int r = 0; r < n; r++)
        EXPECT(seen[r] == (key[r] >= 0), "n %d: row %d grouped %d times", n, r, seen[r]);

    /* the adds give the cpu backend's loop's bits: rows in order into each gradient row */
    if (keys <= 4096) {
        const int C = 5;
        float *src = floats(n * C, 0), *want = floats(keys * C, 0), *got = floats(keys * C, 0);
        fill(src, n * C, -1, 1);
        fill(want, keys * C, -1, 1);
        memcpy(got, want, (size_t)keys * C * sizeof(float));
        for (int r = 0; r < n; r++)
            if (key[r] >= 0)
                for (int c = 0; c < C; c++)
                    want[(size_t)key[r] * C + c] += src[(size_t)r * C + c];
        emulated_grouped_add(got, src, &g, C);
        for (int i = 0; i < keys * C; i++)
            EXPECT(same_bits(got[i], want[i]), "n %d: grouped add [%d] %.9g, the loop's %.9g", n,
                   i, got[i], want[i]);
        free(src);
        free(want);
        free(got);
    }
    free(key);
    free(out);
    free(work);
    free(seen);
}

/* ---- --device: the launchers on a GPU, at GPT-2's sizes and odd ones ---- */

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        const cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "cuda_rows_host_test: %s:%d: %s: %s\n", __FILE__, __LINE__, #call,     \
                    cudaGetErrorString(e_));                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static cuda_ctx ctx;

/* n floats of device memory, 256-aligned, plus offset floats before (offset 1: a row that
 * is not 16-byte aligned); a host array's copy */
static float *device_floats(const float *host, size_t n, int offset)
{
    float *d;
    CUDA_OK(cudaMalloc((void **)&d, (n + (size_t)offset) * sizeof(float) + 16));
    d += offset;
    if (host)
        CUDA_OK(cudaMemcpy(d, host, n * sizeof(float), cudaMemcpyHostToDevice));
    else
        CUDA_OK(cudaMemset(d, 0xff, n * sizeof(float))); /* NaN until written */
    return d;
}

static int *device_ints(const int *host, size_t n)
{
    int *d;
    CUDA_OK(cudaMalloc((void **)&d, n * sizeof(int) + 16));
    CUDA_OK(cudaMemcpy(d, host, n * sizeof(int), cudaMemcpyHostToDevice));
    return d;
}

static float *host_copy(const float *d, size_t n)
{
    float *h = (float *)malloc(n * sizeof(float) + 16);
    if (!h) {
        fprintf(stderr, "cuda_rows_host_test: out of memory\n");
        exit(1);
    }
    CUDA_OK(cudaStreamSynchronize(ctx.stream));
    CUDA_OK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

static void device_free(void *d, int offset) { CUDA_OK(cudaFree((float *)d - offset)); }

static float *random_host(size_t n, double lo, double hi)
{
    float *h = (float *)malloc(n * sizeof(float) + 16);
    if (!h) {
        fprintf(stderr, "cuda_rows_host_test: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        h[i] = (float)uniform(lo, hi);
    return h;
}

/* got against a double reference; how many differ (the first few printed) */
static int expect_near(const char *what, const float *got, const double *ref, const double *scale,
                       size_t n, double tol)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double s = scale ? scale[i] : fmax(1.0, fabs(ref[i]));
        if (!(fabs(got[i] - ref[i]) <= tol * s)) {
            if (bad < 3)
                fprintf(stderr, "cuda_rows_host_test: %s[%zu] = %.9g, want %.9g\n", what, i,
                        got[i], ref[i]);
            bad++;
        }
    }
    EXPECT(!bad, "%s: %d of %zu values off", what, bad, n);
    return bad;
}

static void expect_bits(const char *what, const float *got, const float *want, size_t n)
{
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (!same_bits(got[i], want[i]) && !bad++)
            first = i;
    EXPECT(!bad, "%s: %zu of %zu values differ in bits, the first [%zu]: %.9g, want %.9g", what,
           bad, n, first, got[first], want[first]);
}

/* LayerNorm, its backward, the bias kernels and GELU on N rows of C, with
 * every row buffer offset by `offset` floats; returns nothing, fails by
 * EXPECT. outs: the aligned run's results, which a misaligned run must
 * equal bit for bit (a row's order does not depend on the loads). */
typedef struct row_results {
    float *out, *mean, *rstd, *dinp, *dw, *db;
} row_results;

static void device_rows_case(int N, int C, int offset, row_results *aligned)
{
    const size_t NC = (size_t)N * C;
    char what[96];
    float *x = random_host(NC, -2, 2), *other = random_host(NC, -2, 2);
    float *w = random_host(C, 0.5, 1.5), *b = random_host(C, -0.5, 0.5);
    float *dout = random_host(NC, -1, 1), *dinp0 = random_host(NC, -1, 1);
    float *dw0 = random_host(C, -1, 1), *db0 = random_host(C, -1, 1);
    float *d_x = device_floats(x, NC, offset), *d_other = device_floats(other, NC, offset);
    float *d_w = device_floats(w, C, offset), *d_b = device_floats(b, C, offset);
    float *d_dout = device_floats(dout, NC, offset), *d_out = device_floats(NULL, NC, offset);
    float *d_mean = device_floats(NULL, N, 0), *d_rstd = device_floats(NULL, N, 0);

    /* forward */
    CUDA_OK(cuda_layernorm_forward(&ctx, d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C));
    float *out = host_copy(d_out, NC), *mean = host_copy(d_mean, N), *rstd = host_copy(d_rstd, N);
    double *ref = (double *)malloc(NC * sizeof(double)), *rm = (double *)malloc(N * sizeof(double));
    double *rs = (double *)malloc(N * sizeof(double));
    for (int r = 0; r < N; r++) {
        const float *xr = x + (size_t)r * C;
        double m = 0, v = 0;
        for (int c = 0; c < C; c++)
            m += xr[c];
        m /= C;
        for (int c = 0; c < C; c++)
            v += (xr[c] - m) * (xr[c] - m);
        const double s = 1.0 / sqrt(v / C + 1e-5);
        rm[r] = m;
        rs[r] = s;
        for (int c = 0; c < C; c++)
            ref[(size_t)r * C + c] = (xr[c] - m) * s * w[c] + b[c];
    }
    snprintf(what, sizeof what, "layernorm_forward N %d C %d offset %d: out", N, C, offset);
    expect_near(what, out, ref, NULL, NC, 2e-5);
    snprintf(what, sizeof what, "layernorm_forward N %d C %d offset %d: mean", N, C, offset);
    expect_near(what, mean, rm, NULL, N, 2e-5);
    snprintf(what, sizeof what, "layernorm_forward N %d C %d offset %d: rstd", N, C, offset);
    expect_near(what, rstd, rs, NULL, N, 2e-5);

    /* residual + LayerNorm: res = x + other, then the bits of layernorm_forward on res */
    float *d_res = device_floats(NULL, NC, offset), *d_out2 = device_floats(NULL, NC, offset);
    float *d_mean2 = device_floats(NULL, N, 0), *d_rstd2 = device_floats(NULL, N, 0);
    CUDA_OK(cuda_residual_layernorm_forward(&ctx, d_res, d_out2, d_mean2, d_rstd2, d_x, d_other,
                                            d_w, d_b, N, C));
    float *res = host_copy(d_res, NC), *out2 = host_copy(d_out2, NC);
    float *mean2 = host_copy(d_mean2, N), *rstd2 = host_copy(d_rstd2, N);
    float *sum = (float *)malloc(NC * sizeof(float));
    for (size_t i = 0; i < NC; i++)
        sum[i] = x[i] + other[i];
    snprintf(what, sizeof what, "residual_layernorm_forward N %d C %d: res", N, C);
    expect_bits(what, res, sum, NC);
    CUDA_OK(cuda_layernorm_forward(&ctx, d_out, d_mean, d_rstd, d_res, d_w, d_b, N, C));
    float *out3 = host_copy(d_out, NC), *mean3 = host_copy(d_mean, N);
    float *rstd3 = host_copy(d_rstd, N);
    snprintf(what, sizeof what, "residual_layernorm_forward N %d C %d: out (vs apart)", N, C);
    expect_bits(what, out2, out3, NC);
    expect_bits("residual_layernorm_forward: mean (vs apart)", mean2, mean3, N);
    expect_bits("residual_layernorm_forward: rstd (vs apart)", rstd2, rstd3, N);

    /* backward input, from the forward's own mean and rstd (of x) */
    CUDA_OK(cuda_layernorm_forward(&ctx, d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C));
    float *d_dinp = device_floats(dinp0, NC, offset);
    CUDA_OK(cuda_layernorm_backward_input(&ctx, d_dinp, d_dout, d_x, d_w, d_mean, d_rstd, N, C));
    float *dinp = host_copy(d_dinp, NC);
    for (int r = 0; r < N; r++) {
        const double m = mean[r], s = rstd[r];
        double a = 0, bb = 0;
        for (int c = 0; c < C; c++) {
            const size_t i = (size_t)r * C + c;
            const double norm = (x[i] - m) * s, dnorm = (double)w[c] * dout[i];
            a += dnorm;
            bb += dnorm * norm;
        }
        a /= C;
        bb /= C;
        for (int c = 0; c < C; c++) {
            const size_t i = (size_t)r * C + c;
            const double norm = (x[i] - m) * s, dnorm = (double)w[c] * dout[i];
            ref[i] = dinp0[i] + (dnorm - a - norm * bb) * s;
        }
    }
    snprintf(what, sizeof what, "layernorm_backward_input N %d C %d offset %d", N, C, offset);
    expect_near(what, dinp, ref, NULL, NC, 5e-5);

    /* backward weight and bias_backward: column sums, twice for determinism */
    double *rw = (double *)calloc(C, sizeof(double)), *rb = (double *)calloc(C, sizeof(double));
    double *sw = (double *)calloc(C, sizeof(double)), *sb = (double *)calloc(C, sizeof(double));
    for (int c = 0; c < C; c++) {
        rw[c] = dw0[c];
        rb[c] = db0[c];
        sw[c] = fabs(dw0[c]) + 1e-3;
        sb[c] = fabs(db0[c]) + 1e-3;
    }
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++) {
            const size_t i = (size_t)r * C + c;
            const double t = ((double)x[i] - mean[r]) * rstd[r] * dout[i];
            rw[c] += t;
            rb[c] += dout[i];
            sw[c] += fabs(t);
            sb[c] += fabs(dout[i]);
        }
    float *dws[2], *dbs[2];
    for (int k = 0; k < 2; k++) {
        float *d_dw = device_floats(dw0, C, offset), *d_db = device_floats(db0, C, offset);
        CUDA_OK(cuda_layernorm_backward_weight(&ctx, d_dw, d_db, d_dout, d_x, d_mean, d_rstd, N,
                                               C));
        dws[k] = host_copy(d_dw, C);
        dbs[k] = host_copy(d_db, C);
        device_free(d_dw, offset);
        device_free(d_db, offset);
    }
    snprintf(what, sizeof what, "layernorm_backward_weight N %d C %d: dweight", N, C);
    expect_near(what, dws[0], rw, sw, C, 1e-5);
    snprintf(what, sizeof what, "layernorm_backward_weight N %d C %d: dbias", N, C);
    expect_near(what, dbs[0], rb, sb, C, 1e-5);
    expect_bits("layernorm_backward_weight: run to run", dws[1], dws[0], C);
    expect_bits("layernorm_backward_weight: dbias run to run", dbs[1], dbs[0], C);
    float *d_db = device_floats(db0, C, offset);
    CUDA_OK(cuda_bias_backward(&ctx, d_db, d_dout, N, C));
    float *db = host_copy(d_db, C);
    snprintf(what, sizeof what, "bias_backward N %d C %d", N, C);
    expect_near(what, db, rb, sb, C, 1e-5);
    expect_bits("bias_backward: the layernorm's dbias", db, dbs[0], C);

    /* bias_forward, bias_gelu_forward, gelu_backward, residual_forward */
    CUDA_OK(cuda_bias_forward(&ctx, d_other, d_b, N, C));
    float *biased = host_copy(d_other, NC);
    for (size_t i = 0; i < NC; i++)
        sum[i] = other[i] + b[i % C];
    expect_bits("bias_forward", biased, sum, NC);
    CUDA_OK(cudaMemcpy(d_other, other, NC * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cuda_bias_gelu_forward(&ctx, d_out, d_other, d_b, N, C));
    float *pre = host_copy(d_other, NC), *gelu = host_copy(d_out, NC);
    expect_bits("bias_gelu_forward: pre", pre, sum, NC);
    for (size_t i = 0; i < NC; i++)
        ref[i] = ref_gelu(sum[i]);
    snprintf(what, sizeof what, "bias_gelu_forward N %d C %d: out", N, C);
    expect_near(what, gelu, ref, NULL, NC, 2e-6);
    CUDA_OK(cudaMemcpy(d_dinp, dinp0, NC * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cuda_gelu_backward(&ctx, d_dinp, d_other, d_dout, NC - (size_t)(N > 1)));
    float *gdinp = host_copy(d_dinp, NC);
    for (size_t i = 0; i < NC; i++)
        ref[i] = dinp0[i] + (i < NC - (size_t)(N > 1) ? ref_gelu_grad(sum[i]) * dout[i] : 0.0);
    snprintf(what, sizeof what, "gelu_backward n %zu offset %d", NC - (N > 1), offset);
    expect_near(what, gdinp, ref, NULL, NC, 2e-6);
    CUDA_OK(cuda_residual_forward(&ctx, d_out, d_x, d_other, NC - (size_t)(N > 1)));
    float *rsum = host_copy(d_out, NC);
    for (size_t i = 0; i + (N > 1) < NC; i++)
        sum[i] = x[i] + pre[i];
    expect_bits("residual_forward", rsum, sum, NC - (N > 1));

    if (!aligned->out) {
        aligned->out = out;
        aligned->mean = mean;
        aligned->rstd = rstd;
        aligned->dinp = dinp;
        aligned->dw = dws[0];
        aligned->db = dbs[0];
    } else {
        snprintf(what, sizeof what, "N %d C %d: layernorm out, misaligned vs aligned", N, C);
        expect_bits(what, out, aligned->out, NC);
        expect_bits("layernorm mean, misaligned vs aligned", mean, aligned->mean, N);
        expect_bits("layernorm rstd, misaligned vs aligned", rstd, aligned->rstd, N);
        expect_bits("layernorm dinp, misaligned vs aligned", dinp, aligned->dinp, NC);
        expect_bits("layernorm dweight, misaligned vs aligned", dws[0], aligned->dw, C);
        expect_bits("layernorm dbias, misaligned vs aligned", dbs[0], aligned->db, C);
        free(aligned->out);
        free(aligned->mean);
        free(aligned->rstd);
        free(aligned->dinp);
        free(aligned->dw);
        free(aligned->db);
        free(out);
        free(mean);
        free(rstd);
        free(dinp);
        free(dws[0]);
        free(dbs[0]);
    }
    free(dws[1]);
    free(dbs[1]);
    float *hosts[] = {x, other, w, b, dout, dinp0, dw0, db0, res, out2, mean2, rstd2, sum, out3,
                      mean3, rstd3, db, biased, pre, gelu, gdinp, rsum};
    for (size_t i = 0; i < sizeof hosts / sizeof *hosts; i++)
        free(hosts[i]);
    free(ref);
    free(rm);
    free(rs);
    free(rw);
    free(rb);
    free(sw);
    free(sb);
    float *rows_offset[] = {d_x, d_other, d_w, d_b, d_dout, d_out, d_res, d_out2, d_dinp, d_db};
    for (size_t i = 0; i < sizeof rows_offset / sizeof *rows_offset; i++)
        device_free(rows_offset[i], offset);
    float *plain[] = {d_mean, d_rstd, d_mean2, d_rstd2};
    for (size_t i = 0; i < sizeof plain / sizeof *plain; i++)
        device_free(plain[i], 0);
}

/* The embedding's kernels: the cpu backend's loops (rows in order) give the bits exactly. */
static void device_embedding_case(int B, int T, int C, int V, int with_pos)
{
    const int N = B * T, maxT = T + 3;
    const size_t NC = (size_t)N * C;
    char what[96];
    int *tok = (int *)malloc((size_t)N * sizeof(int));
    int *pos = (int *)malloc((size_t)T * sizeof(int));
    for (int r = 0; r < N; r++) { /* skewed: a few tokens are most rows, as in text */
        const double u = uniform(0, 1);
        tok[r] = (int)(u * u * u * u * V) % V;
    }
    for (int t = 0; t < T; t++)
        pos[t] = (t * 7 + 3) % maxT; /* distinct when gcd(7, maxT) = 1; repeats otherwise */
    float *wte = random_host((size_t)V * C, -1, 1), *wpe = random_host((size_t)maxT * C, -1, 1);
    float *dout = random_host(NC, -1, 1);
    float *dwte0 = random_host((size_t)V * C, -1, 1), *dwpe0 = random_host((size_t)maxT * C, -1, 1);
    int *d_tok = device_ints(tok, N), *d_pos = device_ints(pos, T);
    float *d_wte = device_floats(wte, (size_t)V * C, 0);
    float *d_wpe = device_floats(wpe, (size_t)maxT * C, 0);
    float *d_dout = device_floats(dout, NC, 0), *d_out = device_floats(NULL, NC, 0);
    const int *p = with_pos ? pos : NULL;

    CUDA_OK(cuda_encoder_forward(&ctx, d_out, d_tok, with_pos ? d_pos : NULL, d_wte, d_wpe, B, T,
                                 C));
    float *out = host_copy(d_out, NC), *want = (float *)malloc(NC * sizeof(float));
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++)
            want[(size_t)r * C + c] = wte[(size_t)tok[r] * C + c] +
                                      wpe[(size_t)(p ? p[r % T] : r % T) * C + c];
    snprintf(what, sizeof what, "encoder_forward B %d T %d C %d pos %d", B, T, C, with_pos);
    expect_bits(what, out, want, NC);

    float *d_dwte = device_floats(dwte0, (size_t)V * C, 0);
    float *d_dwpe = device_floats(dwpe0, (size_t)maxT * C, 0);
    CUDA_OK(cuda_encoder_backward(&ctx, d_dwte, d_dwpe, d_dout, d_tok, with_pos ? d_pos : NULL, B,
                                  T, C));
    float *dwte = host_copy(d_dwte, (size_t)V * C), *dwpe = host_copy(d_dwpe, (size_t)maxT * C);
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++) {
            dwte0[(size_t)tok[r] * C + c] += dout[(size_t)r * C + c];
            dwpe0[(size_t)(p ? p[r % T] : r % T) * C + c] += dout[(size_t)r * C + c];
        }
    snprintf(what, sizeof what, "encoder_backward B %d T %d C %d pos %d: dwte", B, T, C, with_pos);
    expect_bits(what, dwte, dwte0, (size_t)V * C);
    snprintf(what, sizeof what, "encoder_backward B %d T %d C %d pos %d: dwpe", B, T, C, with_pos);
    expect_bits(what, dwpe, dwpe0, (size_t)maxT * C);

    /* a vocabulary slice [v0, v0 + rows) */
    const int v0 = V / 5, rows = V / 3 + 1;
    CUDA_OK(cuda_embedding_rows_forward(&ctx, d_out, d_tok, v0, rows, d_wte, N, C));
    float *slice = host_copy(d_out, NC);
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++) {
            const int t = tok[r] - v0;
            want[(size_t)r * C + c] = t >= 0 && t < rows ? wte[(size_t)t * C + c] : 0.0f;
        }
    expect_bits("embedding_rows_forward", slice, want, NC);
    CUDA_OK(cudaMemcpy(d_dwte, wte, (size_t)V * C * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cuda_embedding_rows_backward(&ctx, d_dwte, d_dout, d_tok, v0, rows, N, C));
    float *sdw = host_copy(d_dwte, (size_t)V * C);
    for (int r = 0; r < N; r++) {
        const int t = tok[r] - v0;
        if (t >= 0 && t < rows)
            for (int c = 0; c < C; c++)
                wte[(size_t)t * C + c] += dout[(size_t)r * C + c];
    }
    expect_bits("embedding_rows_backward", sdw, wte, (size_t)V * C);

    /* positions of R rows (a sequence-parallel rank's rows: row0 onward) */
    int *rp = (int *)malloc((size_t)N * sizeof(int));
    for (int r = 0; r < N; r++)
        rp[r] = pos[(T / 2 + r) % T];
    int *d_rp = device_ints(rp, N);
    CUDA_OK(cudaMemcpy(d_out, dout, NC * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cuda_position_forward(&ctx, d_out, d_wpe, d_rp, N, C));
    float *px = host_copy(d_out, NC);
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++)
            want[(size_t)r * C + c] = dout[(size_t)r * C + c] + wpe[(size_t)rp[r] * C + c];
    expect_bits("position_forward", px, want, NC);
    CUDA_OK(cudaMemcpy(d_dwpe, wpe, (size_t)maxT * C * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cuda_position_backward(&ctx, d_dwpe, d_dout, d_rp, N, C));
    float *pdw = host_copy(d_dwpe, (size_t)maxT * C);
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++)
            wpe[(size_t)rp[r] * C + c] += dout[(size_t)r * C + c];
    expect_bits("position_backward", pdw, wpe, (size_t)maxT * C);

    void *hosts[] = {tok, pos, wte, wpe, dout, dwte0, dwpe0, out, want, dwte, dwpe, slice, sdw,
                     rp, px, pdw};
    for (size_t i = 0; i < sizeof hosts / sizeof *hosts; i++)
        free(hosts[i]);
    void *devs[] = {d_tok, d_pos, d_wte, d_wpe, d_dout, d_out, d_dwte, d_dwpe, d_rp};
    for (size_t i = 0; i < sizeof devs / sizeof *devs; i++)
        CUDA_OK(cudaFree(devs[i]));
}

/* microseconds a launch takes, the median of 21 */
#define TIME_US(result, call)                                                                      \
    do {                                                                                           \
        float ms_[21];                                                                             \
        cudaEvent_t a_, b_;                                                                        \
        CUDA_OK(cudaEventCreate(&a_));                                                             \
        CUDA_OK(cudaEventCreate(&b_));                                                             \
        CUDA_OK(call);                                                                             \
        for (int k_ = 0; k_ < 21; k_++) {                                                          \
            CUDA_OK(cudaEventRecord(a_, ctx.stream));                                              \
            CUDA_OK(call);                                                                         \
            CUDA_OK(cudaEventRecord(b_, ctx.stream));                                              \
            CUDA_OK(cudaEventSynchronize(b_));                                                     \
            CUDA_OK(cudaEventElapsedTime(&ms_[k_], a_, b_));                                       \
        }                                                                                          \
        for (int i_ = 1; i_ < 21; i_++)                                                            \
            for (int j_ = i_; j_ > 0 && ms_[j_] < ms_[j_ - 1]; j_--) {                             \
                const float t_ = ms_[j_];                                                          \
                ms_[j_] = ms_[j_ - 1];                                                             \
                ms_[j_ - 1] = t_;                                                                  \
            }                                                                                      \
        result = 1000.0 * ms_[10];                                                                 \
        CUDA_OK(cudaEventDestroy(a_));                                                             \
        CUDA_OK(cudaEventDestroy(b_));                                                             \
    } while (0)

static void report(const char *what, double us, double bytes)
{
    printf("  %-44s %9.1f us  %7.0f GB/s\n", what, us, bytes / (us * 1e3));
}

/* GPT-2 124M's shapes: N = 16384 rows (B 16, T 1024), C 768, the MLP's 3072 */
static void device_timings(void)
{
    const int N = 16384, C = 768, H = 3072, V = 50257;
    const size_t NC = (size_t)N * C, NH = (size_t)N * H;
    float *hx = random_host(NH, -2, 2);
    float *x = device_floats(hx, NH, 0), *y = device_floats(hx, NH, 0);
    float *z = device_floats(hx, NH, 0), *g = device_floats(hx, NH, 0);
    float *w = device_floats(hx, H, 0), *mean = device_floats(NULL, N, 0);
    float *rstd = device_floats(NULL, N, 0), *wte = device_floats(NULL, (size_t)V * C, 0);
    CUDA_OK(cudaMemset(wte, 0, (size_t)V * C * sizeof(float)));
    int *tok = (int *)malloc((size_t)N * sizeof(int));
    for (int r = 0; r < N; r++) {
        const double u = uniform(0, 1);
        tok[r] = (int)(u * u * u * u * V) % V;
    }
    int *d_tok = device_ints(tok, N);
    double us;
    printf("timings (N %d, C %d, H %d):\n", N, C, H);
    CUDA_OK(cuda_layernorm_forward(&ctx, y, mean, rstd, x, w, w, N, C));
    TIME_US(us, cuda_layernorm_forward(&ctx, y, mean, rstd, x, w, w, N, C));
    report("layernorm_forward", us, 2.0 * NC * 4);
    TIME_US(us, cuda_residual_layernorm_forward(&ctx, z, y, mean, rstd, x, g, w, w, N, C));
    report("residual_layernorm_forward", us, 4.0 * NC * 4);
    TIME_US(us, cuda_layernorm_backward_input(&ctx, z, y, x, w, mean, rstd, N, C));
    report("layernorm_backward_input", us, 4.0 * NC * 4);
    TIME_US(us, cuda_layernorm_backward_weight(&ctx, g, g + C, y, x, mean, rstd, N, C));
    report("layernorm_backward_weight", us, 2.0 * NC * 4);
    TIME_US(us, cuda_bias_backward(&ctx, g, y, N, H));
    report("bias_backward (C 3072)", us, 1.0 * NH * 4);
    TIME_US(us, cuda_residual_forward(&ctx, z, x, y, NC));
    report("residual_forward", us, 3.0 * NC * 4);
    TIME_US(us, cuda_bias_gelu_forward(&ctx, z, y, w, N, H));
    report("bias_gelu_forward (C 3072)", us, 3.0 * NH * 4);
    TIME_US(us, cuda_gelu_backward(&ctx, z, x, y, NH));
    report("gelu_backward (C 3072)", us, 4.0 * NH * 4);
    TIME_US(us, cuda_encoder_forward(&ctx, z, d_tok, NULL, wte, x, 16, 1024, C));
    report("encoder_forward", us, 2.0 * NC * 4);
    TIME_US(us, cuda_encoder_backward(&ctx, wte, g, y, d_tok, NULL, 16, 1024, C));
    report("encoder_backward (host grouping included)", us, 2.0 * NC * 4);
    free(hx);
    free(tok);
    void *devs[] = {x, y, z, g, w, mean, rstd, wte, d_tok};
    for (size_t i = 0; i < sizeof devs / sizeof *devs; i++)
        CUDA_OK(cudaFree(devs[i]));
}

static int device_tests(void)
{
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1) {
        printf("cuda_rows_host_test --device: no GPU here, skipped\n");
        return 77;
    }
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    CUDA_OK(cudaStreamCreate(&ctx.stream));
    ctx.scratch_bytes = (size_t)64 << 20;
    CUDA_OK(cudaMalloc(&ctx.scratch, ctx.scratch_bytes));
    CUDA_OK(cudaMallocHost(&ctx.host_scratch, 4096));
    ctx.sm_count = prop.multiProcessorCount;
    ctx.deterministic = 1;
    printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, ctx.sm_count);
    const int cases[][2] = {{1, 1}, {7, 12}, {33, 5}, {130, 13}, {37, 1600}, {2048, 3072},
                            {16384, 768}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        row_results aligned = {};
        const uint64_t seed = rng_state;
        device_rows_case(cases[i][0], cases[i][1], 0, &aligned);
        rng_state = seed; /* the same inputs, every row buffer one float off alignment */
        device_rows_case(cases[i][0], cases[i][1], 1, &aligned);
        printf("  rows N %d C %d: %s\n", cases[i][0], cases[i][1], failures ? "FAILED" : "ok");
    }
    /* the scratch too small for the column sums' partials: they add straight in */
    const size_t scratch = ctx.scratch_bytes;
    ctx.scratch_bytes = 4096;
    {
        row_results aligned = {};
        const uint64_t seed = rng_state;
        device_rows_case(300, 1100, 0, &aligned);
        rng_state = seed;
        device_rows_case(300, 1100, 1, &aligned);
        printf("  rows N 300 C 1100, 4 KiB scratch: %s\n", failures ? "FAILED" : "ok");
    }
    ctx.scratch_bytes = scratch;
    device_embedding_case(2, 5, 12, 11, 1);
    device_embedding_case(3, 7, 13, 40, 0);
    device_embedding_case(16, 1024, 768, 50257, 0);
    device_embedding_case(4, 1024, 768, 50257, 1);
    device_embedding_case(8, 4096, 64, 70000, 1); /* tokens past 65535: two radix passes */
    printf("  embedding: %s\n", failures ? "FAILED" : "ok");
    ctx.scratch_bytes = 4096; /* the groupings in memory of their own (cudaMallocAsync) */
    device_embedding_case(4, 512, 40, 3000, 1);
    ctx.scratch_bytes = scratch;
    printf("  embedding, groupings past the scratch: %s\n", failures ? "FAILED" : "ok");
    if (!failures)
        device_timings();
    CUDA_OK(cudaFree(ctx.scratch));
    CUDA_OK(cudaFreeHost(ctx.host_scratch));
    CUDA_OK(cudaStreamDestroy(ctx.stream));
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc > 2 || (argc == 2 && strcmp(argv[1], "--device") != 0)) {
        fprintf(stderr, "usage: cuda_rows_host_test [--device]: --device runs the kernels on "
                        "the GPU too\n");
        return 2;
    }
    test_gelu();
    const int Cs[] = {1, 3, 4, 5, 8, 12, 13, 64, 127, 128, 129, 768, 1000, 1600, 3072};
    for (size_t i = 0; i < sizeof Cs / sizeof *Cs; i++)
        test_layernorm(Cs[i]);
    test_plan();
    test_grouping(1, 1, 0);
    test_grouping(10, 11, 0);
    test_grouping(10, 5, 1);
    test_grouping(7, 8, 1);
    test_grouping(1000, 3, 0);
    test_grouping(16384, 4096, 1);
    test_grouping(20000, 50257, 0);
    test_grouping(5000, 1 << 24, 1);
    test_grouping(3000, 2147483647, 0);
    if (failures) {
        fprintf(stderr, "cuda_rows_host_test: %d failures\n", failures);
        return 1;
    }
    printf("cuda_rows_host_test: ok\n");
    return argc == 2 ? device_tests() : 0;
}
