/* compute-cuda's row kernels, the parts that run on the host: GELU and its
 * derivative, a lane's part of LayerNorm forward and backward (a warp
 * emulated lane by lane, its xor-shuffle sum in the same pairs), the
 * split of column sums and the host's grouping of rows for the scatters
 * into wte and wpe. Compared with the cpu backend's formulas (written out
 * below as core/model/kernels.c has them) and with double precision. No
 * GPU is needed: nothing here launches a kernel.
 *
 *   nvcc -std=c++17 -O2 -I plugins/compute-cuda tests/compute/cuda_rows_host_test.cu \
 *       -o cuda_rows_host_test && ./cuda_rows_host_test */
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

int main(void)
{
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
    return 0;
}
