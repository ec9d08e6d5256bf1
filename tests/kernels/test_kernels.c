/* The GPT-2 kernels against independent double-precision references.
 *
 * Every op: the f32 forward against a double forward written here from the
 * formula, and every input's gradient from the f32 backward against central
 * finite differences of that double forward, for the loss L = Σ w_i·out_i
 * with fixed random w. Gradient buffers start from random values, so the
 * kernels' accumulate (+=) contract is checked too.
 *
 * usage: test_kernels <case>; exit 0 when every check of the case passes. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/strategy.h"
#include "loom/tensor.h"
#include "model/gemm.h"
#include "model/kernels.h"
#include "model/optimizer.h"
#include "runtime/cpu.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define FD_EPS 1e-6
#define TOL_FWD 1e-5  /* f32 forward vs double reference (relative, normwise) */
#define TOL_GRAD 1e-4 /* f32 backward vs double finite differences */

static int failures;

/* ------------------------------------------------------------ utilities */

/* Every buffer a case allocates, freed after it (the sanitizer build checks
 * for leaks): the references and checks below allocate freely. */
static void **buffers;
static size_t nbuffers, buffers_cap;

static void *tracked(void *p)
{
    if (!p) {
        fprintf(stderr, "test_kernels: out of memory\n");
        exit(2);
    }
    if (nbuffers == buffers_cap) {
        buffers_cap = buffers_cap ? 2 * buffers_cap : 256;
        void **grown = realloc(buffers, buffers_cap * sizeof *grown);
        if (!grown) {
            fprintf(stderr, "test_kernels: out of memory\n");
            exit(2);
        }
        buffers = grown;
    }
    buffers[nbuffers++] = p;
    return p;
}

static void *test_malloc(size_t bytes) { return tracked(malloc(bytes ? bytes : 1)); }
static void *test_calloc(size_t n, size_t size) { return tracked(calloc(n ? n : 1, size)); }

static void test_free(void *p)
{
    for (size_t i = nbuffers; i-- > 0;)
        if (buffers[i] == p) {
            buffers[i] = buffers[--nbuffers];
            break;
        }
    free(p);
}

static void free_buffers(void)
{
    for (size_t i = 0; i < nbuffers; i++)
        free(buffers[i]);
    free(buffers);
    buffers = NULL;
    nbuffers = buffers_cap = 0;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double uniform(double lo, double hi) /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + (hi - lo) * ((double)(z >> 11) / 9007199254740992.0);
}

static float *randf(size_t n, double lo, double hi)
{
    float *x = test_malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)uniform(lo, hi);
    return x;
}

static float *copyf(const float *x, size_t n)
{
    float *y = test_malloc(n * sizeof *y);
    memcpy(y, x, n * sizeof *y);
    return y;
}

static double *to_double(const float *x, size_t n)
{
    double *y = test_malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++)
        y[i] = x[i];
    return y;
}

static double *zerod(size_t n) { return test_calloc(n, sizeof(double)); }

/* max |got - base - want| / max |want|; base (the gradient buffer's value
 * before the backward) may be NULL. */
static double rel_err(const float *got, const float *base, const double *want, size_t n)
{
    double err = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        double g = (double)got[i] - (base ? (double)base[i] : 0.0);
        double e = fabs(g - want[i]);
        if (!(e <= err)) /* NaN counts as infinitely wrong */
            err = isnan(e) ? INFINITY : e;
        if (fabs(want[i]) > scale)
            scale = fabs(want[i]);
    }
    return err / (scale > 1e-30 ? scale : 1e-30);
}

static void check(const char *what, double err, double tol)
{
    int ok = err <= tol;
    printf("%s %-44s rel err %.3g (tol %.0e)\n", ok ? "ok  " : "FAIL", what, err, tol);
    if (!ok)
        failures++;
}

static void check_true(const char *what, int ok)
{
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    if (!ok)
        failures++;
}

/* Central finite differences of f over every element of x (in place,
 * restored), in double. */
typedef double (*loss_fn)(void *ctx);

static void fd_grad(loss_fn f, void *ctx, double *x, size_t n, double *grad)
{
    for (size_t i = 0; i < n; i++) {
        double keep = x[i];
        x[i] = keep + FD_EPS;
        double up = f(ctx);
        x[i] = keep - FD_EPS;
        double down = f(ctx);
        x[i] = keep;
        grad[i] = (up - down) / (2.0 * FD_EPS);
    }
}

static double weighted_sum(const double *w, const double *out, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += w[i] * out[i];
    return s;
}

/* ------------------------------------------------------------ encoder */

typedef struct encoder_ctx {
    int B, T, C;
    const int *inp, *pos;
    double *wte, *wpe, *w, *out;
} encoder_ctx;

static void encoder_ref(encoder_ctx *c)
{
    for (int b = 0; b < c->B; b++)
        for (int t = 0; t < c->T; t++)
            for (int i = 0; i < c->C; i++) {
                int p = c->pos ? c->pos[t] : t;
                c->out[((size_t)b * c->T + t) * c->C + i] =
                    c->wte[(size_t)c->inp[b * c->T + t] * c->C + i] + c->wpe[(size_t)p * c->C + i];
            }
}

static double encoder_loss(void *ctx)
{
    encoder_ctx *c = ctx;
    encoder_ref(c);
    return weighted_sum(c->w, c->out, (size_t)c->B * c->T * c->C);
}

static void encoder_case(const int *pos, const char *label)
{
    enum { B = 2, T = 4, C = 11, V = 6, MAXT = 7 };
    /* token 3 appears three times so its gradient rows must add up */
    const int inp[B * T] = {3, 1, 3, 5, 0, 3, 2, 5};
    const size_t n = (size_t)B * T * C;
    float *wte = randf((size_t)V * C, -1, 1), *wpe = randf((size_t)MAXT * C, -1, 1);
    float *w = randf(n, -1, 1), *out = test_malloc(n * sizeof(float));
    encoder_ctx c = {B, T, C, inp, pos, to_double(wte, (size_t)V * C),
                     to_double(wpe, (size_t)MAXT * C), to_double(w, n), zerod(n)};
    char what[96];

    loom_encoder_forward(out, inp, pos, wte, wpe, B, T, C);
    encoder_ref(&c);
    snprintf(what, sizeof what, "encoder forward (%s)", label);
    check(what, rel_err(out, NULL, c.out, n), TOL_FWD);

    float *dwte0 = randf((size_t)V * C, -1, 1), *dwpe0 = randf((size_t)MAXT * C, -1, 1);
    float *dwte = copyf(dwte0, (size_t)V * C), *dwpe = copyf(dwpe0, (size_t)MAXT * C);
    loom_encoder_backward(dwte, dwpe, w, inp, pos, B, T, C);
    double *g = zerod((size_t)MAXT * C);
    fd_grad(encoder_loss, &c, c.wte, (size_t)V * C, g);
    snprintf(what, sizeof what, "encoder dwte (%s)", label);
    check(what, rel_err(dwte, dwte0, g, (size_t)V * C), TOL_GRAD);
    fd_grad(encoder_loss, &c, c.wpe, (size_t)MAXT * C, g);
    snprintf(what, sizeof what, "encoder dwpe (%s)", label);
    check(what, rel_err(dwpe, dwpe0, g, (size_t)MAXT * C), TOL_GRAD);
}

static void test_encoder(void)
{
    const int pos[4] = {6, 0, 2, 3}; /* explicit, out of order, as a sequence rank's slice */
    encoder_case(NULL, "positions 0..T-1");
    encoder_case(pos, "explicit positions");
}

/* ------------------------------------------------------------ layernorm */

typedef struct layernorm_ctx {
    int N, C;
    double *inp, *weight, *bias, *w, *out, *mean, *rstd;
} layernorm_ctx;

static void layernorm_ref(layernorm_ctx *c)
{
    for (int n = 0; n < c->N; n++) {
        const double *x = c->inp + (size_t)n * c->C;
        double m = 0.0, v = 0.0;
        for (int i = 0; i < c->C; i++)
            m += x[i];
        m /= c->C;
        for (int i = 0; i < c->C; i++)
            v += (x[i] - m) * (x[i] - m);
        v /= c->C;
        double s = 1.0 / sqrt(v + 1e-5);
        for (int i = 0; i < c->C; i++)
            c->out[(size_t)n * c->C + i] = (x[i] - m) * s * c->weight[i] + c->bias[i];
        c->mean[n] = m;
        c->rstd[n] = s;
    }
}

static double layernorm_loss(void *ctx)
{
    layernorm_ctx *c = ctx;
    layernorm_ref(c);
    return weighted_sum(c->w, c->out, (size_t)c->N * c->C);
}

static void test_layernorm(void)
{
    enum { N = 6, C = 37 }; /* C: four 8-lane steps and a tail */
    const size_t n = (size_t)N * C;
    float *inp = randf(n, -2, 3), *weight = randf(C, 0.5, 1.5), *bias = randf(C, -0.5, 0.5);
    float *w = randf(n, -1, 1);
    float *out = test_malloc(n * sizeof(float)), *mean = test_malloc(N * sizeof(float)),
          *rstd = test_malloc(N * sizeof(float));
    layernorm_ctx c = {N, C, to_double(inp, n), to_double(weight, C), to_double(bias, C),
                       to_double(w, n), zerod(n), zerod(N), zerod(N)};

    loom_layernorm_forward(out, mean, rstd, inp, weight, bias, N, C);
    layernorm_ref(&c);
    check("layernorm forward out", rel_err(out, NULL, c.out, n), TOL_FWD);
    check("layernorm forward mean", rel_err(mean, NULL, c.mean, N), TOL_FWD);
    check("layernorm forward rstd", rel_err(rstd, NULL, c.rstd, N), TOL_FWD);

    float *dinp0 = randf(n, -1, 1), *dw0 = randf(C, -1, 1), *db0 = randf(C, -1, 1);
    float *dinp = copyf(dinp0, n), *dw = copyf(dw0, C), *db = copyf(db0, C);
    loom_layernorm_backward(dinp, dw, db, w, inp, weight, mean, rstd, N, C);
    double *g = zerod(n);
    fd_grad(layernorm_loss, &c, c.inp, n, g);
    check("layernorm dinp", rel_err(dinp, dinp0, g, n), TOL_GRAD);
    fd_grad(layernorm_loss, &c, c.weight, C, g);
    check("layernorm dweight", rel_err(dw, dw0, g, C), TOL_GRAD);
    fd_grad(layernorm_loss, &c, c.bias, C, g);
    check("layernorm dbias", rel_err(db, db0, g, C), TOL_GRAD);
}

/* ------------------------------------------------------------ matmul */

typedef struct matmul_ctx {
    int N, C, OC;
    double *inp, *weight, *bias, *w, *out;
} matmul_ctx;

static void matmul_ref(matmul_ctx *c) /* the naive triple loop */
{
    for (int n = 0; n < c->N; n++)
        for (int o = 0; o < c->OC; o++) {
            double s = c->bias ? c->bias[o] : 0.0;
            for (int i = 0; i < c->C; i++)
                s += c->inp[(size_t)n * c->C + i] * c->weight[(size_t)o * c->C + i];
            c->out[(size_t)n * c->OC + o] = s;
        }
}

static double matmul_loss(void *ctx)
{
    matmul_ctx *c = ctx;
    matmul_ref(c);
    return weighted_sum(c->w, c->out, (size_t)c->N * c->OC);
}

static void matmul_forward_case(int N, int C, int OC, int threads)
{
    float *inp = randf((size_t)N * C, -1, 1), *weight = randf((size_t)OC * C, -1, 1);
    float *bias = randf(OC, -1, 1), *out = test_malloc((size_t)N * OC * sizeof(float));
    matmul_ctx c = {N, C, OC, to_double(inp, (size_t)N * C), to_double(weight, (size_t)OC * C),
                    to_double(bias, OC), NULL, zerod((size_t)N * OC)};
    char what[96];
    loom_kernels_set_threads(threads);
    loom_matmul_forward(out, inp, loom_weight_f32(weight), bias, N, C, OC);
    matmul_ref(&c);
    snprintf(what, sizeof what, "matmul forward %dx%dx%d, %d thread(s)", N, C, OC, threads);
    check(what, rel_err(out, NULL, c.out, (size_t)N * OC), TOL_FWD);
    c.bias = NULL;
    loom_matmul_forward(out, inp, loom_weight_f32(weight), NULL, N, C, OC);
    matmul_ref(&c);
    snprintf(what, sizeof what, "matmul forward %dx%dx%d no bias", N, C, OC);
    check(what, rel_err(out, NULL, c.out, (size_t)N * OC), TOL_FWD);
    loom_kernels_set_threads(1);
}

static void test_matmul(void)
{
    matmul_forward_case(7, 13, 11, 1);
    matmul_forward_case(96, 200, 130, 2);

    enum { N = 7, C = 13, OC = 11 };
    float *inp = randf((size_t)N * C, -1, 1), *weight = randf((size_t)OC * C, -1, 1);
    float *bias = randf(OC, -1, 1), *w = randf((size_t)N * OC, -1, 1);
    matmul_ctx c = {N, C, OC, to_double(inp, (size_t)N * C), to_double(weight, (size_t)OC * C),
                    to_double(bias, OC), to_double(w, (size_t)N * OC), zerod((size_t)N * OC)};
    float *dinp0 = randf((size_t)N * C, -1, 1), *dw0 = randf((size_t)OC * C, -1, 1);
    float *db0 = randf(OC, -1, 1);
    float *dinp = copyf(dinp0, (size_t)N * C), *dw = copyf(dw0, (size_t)OC * C),
          *db = copyf(db0, OC);
    loom_matmul_backward(dinp, dw, db, w, inp, loom_weight_f32(weight), N, C, OC);
    double *g = zerod((size_t)OC * C);
    fd_grad(matmul_loss, &c, c.inp, (size_t)N * C, g);
    check("matmul dinp", rel_err(dinp, dinp0, g, (size_t)N * C), TOL_GRAD);
    fd_grad(matmul_loss, &c, c.weight, (size_t)OC * C, g);
    check("matmul dweight", rel_err(dw, dw0, g, (size_t)OC * C), TOL_GRAD);
    fd_grad(matmul_loss, &c, c.bias, OC, g);
    check("matmul dbias", rel_err(db, db0, g, OC), TOL_GRAD);

    /* dinp and dbias are optional: dweight alone must be the same */
    float *dw_only = copyf(dw0, (size_t)OC * C);
    loom_matmul_backward(NULL, dw_only, NULL, w, inp, loom_weight_f32(weight), N, C, OC);
    fd_grad(matmul_loss, &c, c.weight, (size_t)OC * C, g);
    check("matmul dweight (dinp, dbias NULL)", rel_err(dw_only, dw0, g, (size_t)OC * C), TOL_GRAD);
    /* and the input gradient alone */
    float *dinp_only = copyf(dinp0, (size_t)N * C);
    loom_matmul_backward(dinp_only, NULL, NULL, w, inp, loom_weight_f32(weight), N, C, OC);
    fd_grad(matmul_loss, &c, c.inp, (size_t)N * C, g);
    check("matmul dinp (dweight, dbias NULL)", rel_err(dinp_only, dinp0, g, (size_t)N * C),
          TOL_GRAD);
}

/* ------------------------------------------------------------ gelu */

typedef struct gelu_ctx {
    int N;
    double *inp, *w, *out;
} gelu_ctx;

static void gelu_ref(gelu_ctx *c)
{
    const double k = sqrt(2.0 / M_PI);
    for (int i = 0; i < c->N; i++) {
        double x = c->inp[i];
        c->out[i] = 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
    }
}

static double gelu_loss(void *ctx)
{
    gelu_ctx *c = ctx;
    gelu_ref(c);
    return weighted_sum(c->w, c->out, (size_t)c->N);
}

static void test_gelu(void)
{
    enum { N = 203 };
    float *inp = randf(N, -4, 4), *w = randf(N, -1, 1), *out = test_malloc(N * sizeof(float));
    gelu_ctx c = {N, to_double(inp, N), to_double(w, N), zerod(N)};
    loom_gelu_forward(out, inp, N);
    gelu_ref(&c);
    check("gelu forward", rel_err(out, NULL, c.out, N), TOL_FWD);
    float *dinp0 = randf(N, -1, 1), *dinp = copyf(dinp0, N);
    loom_gelu_backward(dinp, inp, w, N);
    double *g = zerod(N);
    fd_grad(gelu_loss, &c, c.inp, N, g);
    check("gelu dinp", rel_err(dinp, dinp0, g, N), TOL_GRAD);

    /* Element by element over a wide range, tails included, against the
     * formula and its derivative in double. */
    enum { M = 4001 };
    float *x = test_malloc(M * sizeof(float)), *y = test_malloc(M * sizeof(float));
    float *ones = test_malloc(M * sizeof(float)), *slope = test_calloc(M, sizeof(float));
    for (int i = 0; i < M; i++) {
        x[i] = -20.0f + 40.0f * (float)i / (M - 1);
        ones[i] = 1.0f;
    }
    loom_gelu_forward(y, x, M);
    loom_gelu_backward(slope, x, ones, M);
    const double k = sqrt(2.0 / M_PI);
    double worst_y = 0.0, worst_d = 0.0;
    for (int i = 0; i < M; i++) {
        double xi = x[i], a = k * (xi + 0.044715 * xi * xi * xi), t = tanh(a);
        double want_y = 0.5 * xi * (1.0 + t);
        double want_d = 0.5 * (1.0 + t) +
                        xi * 0.5 * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * xi * xi);
        double ey = fabs(y[i] - want_y) / (fabs(want_y) + 1e-30 + 1e-6 * fabs(xi));
        double ed = fabs(slope[i] - want_d) / (fabs(want_d) + 1e-6);
        worst_y = ey > worst_y || isnan(ey) ? (isnan(ey) ? INFINITY : ey) : worst_y;
        worst_d = ed > worst_d || isnan(ed) ? (isnan(ed) ? INFINITY : ed) : worst_d;
    }
    check("gelu forward, each of [-20, 20]", worst_y, 1e-5);
    check("gelu local gradient, each of [-20, 20]", worst_d, 1e-5);
}

/* ------------------------------------------------------------ residual */

typedef struct residual_ctx {
    int N;
    double *a, *b, *w, *out;
} residual_ctx;

static double residual_loss(void *ctx)
{
    residual_ctx *c = ctx;
    for (int i = 0; i < c->N; i++)
        c->out[i] = c->a[i] + c->b[i];
    return weighted_sum(c->w, c->out, (size_t)c->N);
}

static void test_residual(void)
{
    enum { N = 45 };
    float *a = randf(N, -1, 1), *b = randf(N, -1, 1), *w = randf(N, -1, 1);
    float *out = test_malloc(N * sizeof(float));
    residual_ctx c = {N, to_double(a, N), to_double(b, N), to_double(w, N), zerod(N)};
    loom_residual_forward(out, a, b, N);
    residual_loss(&c);
    check("residual forward", rel_err(out, NULL, c.out, N), TOL_FWD);
    float *da0 = randf(N, -1, 1), *db0 = randf(N, -1, 1);
    float *da = copyf(da0, N), *db = copyf(db0, N);
    loom_residual_backward(da, db, w, N);
    double *g = zerod(N);
    fd_grad(residual_loss, &c, c.a, N, g);
    check("residual da", rel_err(da, da0, g, N), TOL_GRAD);
    fd_grad(residual_loss, &c, c.b, N, g);
    check("residual db", rel_err(db, db0, g, N), TOL_GRAD);
}

/* ------------------------------------------------ softmax + crossentropy */

typedef struct softmax_ctx {
    int N, V, Vp;
    const int *targets;
    double *logits, *dlosses, *lse, *losses;
} softmax_ctx;

static void softmax_ref(softmax_ctx *c)
{
    for (int n = 0; n < c->N; n++) {
        const double *x = c->logits + (size_t)n * c->Vp;
        double m = -INFINITY, s = 0.0;
        for (int i = 0; i < c->V; i++)
            m = x[i] > m ? x[i] : m;
        for (int i = 0; i < c->V; i++)
            s += exp(x[i] - m);
        c->lse[n] = m + log(s);
        c->losses[n] = -(x[c->targets[n]] - m - log(s));
    }
}

/* L = Σ_n dlosses[n] * loss[n]: its gradient is what the fused backward gives */
static double softmax_loss(void *ctx)
{
    softmax_ctx *c = ctx;
    softmax_ref(c);
    return weighted_sum(c->dlosses, c->losses, (size_t)c->N);
}

/* Logits far apart: most probabilities underflow to 0, the loss must
 * still be right, whether the target's probability is near 1 or near 0. */
static void softmax_wide_case(void)
{
    enum { N = 3, V = 203, Vp = 208 };
    const int targets[N] = {0, 100, 202};
    const size_t n = (size_t)N * Vp;
    float *logits = randf(n, -120, 120);
    logits[0] = 130.0f; /* row 0's target is its largest logit: loss near 0 */
    float *losses = test_malloc(N * sizeof(float)), *lse = test_malloc(N * sizeof(float));
    softmax_ctx c = {N, V, Vp, targets, to_double(logits, n), NULL, zerod(N), zerod(N)};
    loom_softmax_crossentropy_forward(losses, lse, logits, targets, N, V, Vp);
    softmax_ref(&c);
    check("softmax-crossentropy lse, logits in [-120, 130]", rel_err(lse, NULL, c.lse, N),
          TOL_FWD);
    double worst = 0.0; /* losses that stay finite in f32 */
    for (int r = 0; r < N; r++)
        if (c.losses[r] < 80.0) {
            double e = fabs(losses[r] - c.losses[r]) / (c.losses[r] + 1.0);
            worst = e > worst ? e : worst;
        }
    check("softmax-crossentropy losses, logits in [-120, 130]", worst, TOL_FWD);
}

static void test_softmax_crossentropy(void)
{
    softmax_wide_case();

    enum { N = 5, V = 37, Vp = 40 }; /* V: two 16-lane steps and a tail */
    const int targets[N] = {0, 36, 7, 7, 13};
    const size_t n = (size_t)N * Vp;
    float *logits = randf(n, -4, 4);
    for (int r = 0; r < N; r++) /* padding logits must be ignored, however large */
        for (int i = V; i < Vp; i++)
            logits[(size_t)r * Vp + i] = 1e4f;
    float *dlosses = randf(N, 0.1, 1.0);
    float *lse = test_malloc(N * sizeof(float)), *losses = test_malloc(N * sizeof(float));
    softmax_ctx c = {N, V, Vp, targets, to_double(logits, n), to_double(dlosses, N), zerod(N),
                     zerod(N)};

    loom_softmax_crossentropy_forward(losses, lse, logits, targets, N, V, Vp);
    softmax_ref(&c);
    check("softmax-crossentropy forward lse", rel_err(lse, NULL, c.lse, N), TOL_FWD);
    check("softmax-crossentropy forward losses", rel_err(losses, NULL, c.losses, N), TOL_FWD);

    /* backward writes the gradient over the logits */
    float *dl = copyf(logits, n);
    loom_softmax_crossentropy_backward(dl, dlosses, lse, targets, N, V, Vp);
    double *g = zerod(n);
    fd_grad(softmax_loss, &c, c.logits, n, g);
    check("softmax-crossentropy dlogits", rel_err(dl, NULL, g, n), TOL_GRAD);
    int pad_zero = 1;
    for (int r = 0; r < N; r++)
        for (int i = V; i < Vp; i++)
            pad_zero &= dl[(size_t)r * Vp + i] == 0.0f;
    check_true("softmax-crossentropy: the padding's gradient is 0", pad_zero);
}

/* ------------------------------------------------------------ attention */

/* q (B, tq, NH, HS), k/v (B, tk, NH, HS); positions NULL = 0.. */
typedef struct attention_ctx {
    int B, NH, HS, tq, tk;
    const int *q_pos, *k_pos;
    double *q, *k, *v, *w, *out, *lse;
} attention_ctx;

static void attention_ref(attention_ctx *c)
{
    const int C = c->NH * c->HS;
    const double scale = 1.0 / sqrt((double)c->HS);
    double *s = test_malloc((size_t)c->tk * sizeof *s);
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->NH; h++)
            for (int i = 0; i < c->tq; i++) {
                const double *qi = c->q + ((size_t)b * c->tq + i) * C + (size_t)h * c->HS;
                double *oi = c->out + ((size_t)b * c->tq + i) * C + (size_t)h * c->HS;
                int qp = c->q_pos ? c->q_pos[i] : i;
                double m = -INFINITY;
                for (int j = 0; j < c->tk; j++) {
                    int kp = c->k_pos ? c->k_pos[j] : j;
                    s[j] = -INFINITY;
                    if (kp > qp)
                        continue;
                    const double *kj = c->k + ((size_t)b * c->tk + j) * C + (size_t)h * c->HS;
                    double d = 0.0;
                    for (int e = 0; e < c->HS; e++)
                        d += qi[e] * kj[e];
                    s[j] = d * scale;
                    m = s[j] > m ? s[j] : m;
                }
                for (int e = 0; e < c->HS; e++)
                    oi[e] = 0.0;
                double *lse = c->lse + ((size_t)b * c->NH + h) * c->tq + i;
                if (m == -INFINITY) {
                    *lse = -INFINITY;
                    continue;
                }
                double sum = 0.0;
                for (int j = 0; j < c->tk; j++)
                    sum += exp(s[j] - m);
                for (int j = 0; j < c->tk; j++) {
                    double p = exp(s[j] - m) / sum;
                    const double *vj = c->v + ((size_t)b * c->tk + j) * C + (size_t)h * c->HS;
                    for (int e = 0; e < c->HS; e++)
                        oi[e] += p * vj[e];
                }
                *lse = m + log(sum);
            }
    test_free(s);
}

/* The analytic backward in double, with the whole probability row: for the
 * large cases, where finite differences would take too long. Checked
 * against finite differences itself on the small ones. */
static void attention_ref_backward(attention_ctx *c, const double *dout, double *dq, double *dk,
                                   double *dv)
{
    const int C = c->NH * c->HS, HS = c->HS;
    const double scale = 1.0 / sqrt((double)HS);
    attention_ref(c);
    memset(dq, 0, (size_t)c->B * c->tq * C * sizeof(double));
    memset(dk, 0, (size_t)c->B * c->tk * C * sizeof(double));
    memset(dv, 0, (size_t)c->B * c->tk * C * sizeof(double));
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->NH; h++)
            for (int i = 0; i < c->tq; i++) {
                const size_t qi = ((size_t)b * c->tq + i) * C + (size_t)h * HS;
                const double L = c->lse[((size_t)b * c->NH + h) * c->tq + i];
                if (isinf(L))
                    continue;
                const int qp = c->q_pos ? c->q_pos[i] : i;
                double D = 0.0;
                for (int e = 0; e < HS; e++)
                    D += dout[qi + e] * c->out[qi + e];
                for (int j = 0; j < c->tk; j++) {
                    if ((c->k_pos ? c->k_pos[j] : j) > qp)
                        continue;
                    const size_t kj = ((size_t)b * c->tk + j) * C + (size_t)h * HS;
                    double s = 0.0, dp = 0.0;
                    for (int e = 0; e < HS; e++) {
                        s += c->q[qi + e] * c->k[kj + e];
                        dp += dout[qi + e] * c->v[kj + e];
                    }
                    const double p = exp(s * scale - L), ds = p * (dp - D);
                    for (int e = 0; e < HS; e++) {
                        dv[kj + e] += p * dout[qi + e];
                        dq[qi + e] += scale * ds * c->k[kj + e];
                        dk[kj + e] += scale * ds * c->q[qi + e];
                    }
                }
            }
}

static double attention_loss(void *ctx)
{
    attention_ctx *c = ctx;
    attention_ref(c);
    return weighted_sum(c->w, c->out, (size_t)c->B * c->tq * c->NH * c->HS);
}

/* lse with -inf entries: equal where infinite, relative elsewhere */
static double lse_err(const float *got, const double *want, size_t n)
{
    double scale = 0.0, err = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(want[i])) {
            if (!(isinf(got[i]) && got[i] < 0))
                return INFINITY;
            continue;
        }
        double e = fabs(got[i] - want[i]);
        if (!(e <= err))
            err = isnan(e) ? INFINITY : e;
        scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
    }
    return err / (scale > 1.0 ? scale : 1.0);
}

/* Forward and every gradient of one attention call against the double
 * reference: whole-sequence (positions NULL) or one block with positions. */
static void attention_fd_case(const char *label, int B, int NH, int HS, int tq, int tk,
                              const int *q_pos, const int *k_pos)
{
    const int C = NH * HS;
    const size_t nq = (size_t)B * tq * C, nk = (size_t)B * tk * C, nl = (size_t)B * NH * tq;
    float *q = randf(nq, -1.5, 1.5), *k = randf(nk, -1.5, 1.5), *v = randf(nk, -1, 1);
    float *w = randf(nq, -1, 1);
    float *out = test_malloc(nq * sizeof(float)), *lse = test_malloc(nl * sizeof(float));
    attention_ctx c = {B, NH, HS, tq, tk, q_pos, k_pos, to_double(q, nq), to_double(k, nk),
                       to_double(v, nk), to_double(w, nq), zerod(nq), zerod(nl)};
    char what[128];

    int whole = !q_pos && !k_pos && tq == tk;
    if (whole)
        loom_attention_forward(out, lse, q, k, v, B, tq, NH, HS);
    else
        loom_attention_kernels_cpu.block_forward(q, q_pos, tq, k, v, k_pos, tk, B, NH, HS,
                                                 LOOM_F32, out, lse, 1);
    attention_ref(&c);
    snprintf(what, sizeof what, "attention forward out (%s)", label);
    check(what, rel_err(out, NULL, c.out, nq), TOL_FWD);
    snprintf(what, sizeof what, "attention forward lse (%s)", label);
    check(what, lse_err(lse, c.lse, nl), TOL_FWD);

    float *dq0 = randf(nq, -1, 1), *dk0 = randf(nk, -1, 1), *dv0 = randf(nk, -1, 1);
    float *dq = copyf(dq0, nq), *dk = copyf(dk0, nk), *dv = copyf(dv0, nk);
    if (whole)
        loom_attention_backward(dq, dk, dv, q, k, v, out, w, lse, B, tq, NH, HS);
    else
        loom_attention_kernels_cpu.block_backward(q, q_pos, tq, k, v, k_pos, tk, B, NH, HS,
                                                  LOOM_F32, out, w, lse, dq, dk, dv);
    double *g = zerod(nq > nk ? nq : nk);
    double *rq = zerod(nq), *rk = zerod(nk), *rv = zerod(nk);
    attention_ref_backward(&c, c.w, rq, rk, rv);
    float *zq = test_calloc(nq, sizeof(float)), *zk = test_calloc(nk, sizeof(float));
    for (size_t i = 0; i < nq; i++)
        zq[i] = (float)rq[i];
    fd_grad(attention_loss, &c, c.q, nq, g);
    snprintf(what, sizeof what, "attention dq (%s)", label);
    check(what, rel_err(dq, dq0, g, nq), TOL_GRAD);
    snprintf(what, sizeof what, "  double reference dq vs FD (%s)", label);
    check(what, rel_err(zq, NULL, g, nq), TOL_GRAD);
    for (size_t i = 0; i < nk; i++)
        zk[i] = (float)rk[i];
    fd_grad(attention_loss, &c, c.k, nk, g);
    snprintf(what, sizeof what, "attention dk (%s)", label);
    check(what, rel_err(dk, dk0, g, nk), TOL_GRAD);
    snprintf(what, sizeof what, "  double reference dk vs FD (%s)", label);
    check(what, rel_err(zk, NULL, g, nk), TOL_GRAD);
    for (size_t i = 0; i < nk; i++)
        zk[i] = (float)rv[i];
    fd_grad(attention_loss, &c, c.v, nk, g);
    snprintf(what, sizeof what, "attention dv (%s)", label);
    check(what, rel_err(dv, dv0, g, nk), TOL_GRAD);
    snprintf(what, sizeof what, "  double reference dv vs FD (%s)", label);
    check(what, rel_err(zk, NULL, g, nk), TOL_GRAD);
}

/* Sizes that cross the kernel's query tiles and key chunks, against the
 * double reference forward and analytic backward. */
static void attention_large_case(const char *label, int B, int NH, int HS, int tq, int tk,
                                 const int *q_pos, const int *k_pos)
{
    const int C = NH * HS;
    const size_t nq = (size_t)B * tq * C, nk = (size_t)B * tk * C, nl = (size_t)B * NH * tq;
    float *q = randf(nq, -1.5, 1.5), *k = randf(nk, -1.5, 1.5), *v = randf(nk, -1, 1);
    float *w = randf(nq, -1, 1);
    float *out = test_malloc(nq * sizeof(float)), *lse = test_malloc(nl * sizeof(float));
    attention_ctx c = {B, NH, HS, tq, tk, q_pos, k_pos, to_double(q, nq), to_double(k, nk),
                       to_double(v, nk), to_double(w, nq), zerod(nq), zerod(nl)};
    char what[128];
    int whole = !q_pos && !k_pos && tq == tk;
    if (whole)
        loom_attention_forward(out, lse, q, k, v, B, tq, NH, HS);
    else
        loom_attention_kernels_cpu.block_forward(q, q_pos, tq, k, v, k_pos, tk, B, NH, HS,
                                                 LOOM_F32, out, lse, 1);
    double *rq = zerod(nq), *rk = zerod(nk), *rv = zerod(nk);
    attention_ref_backward(&c, c.w, rq, rk, rv); /* runs the forward too */
    snprintf(what, sizeof what, "attention forward out (%s)", label);
    check(what, rel_err(out, NULL, c.out, nq), TOL_FWD);
    snprintf(what, sizeof what, "attention forward lse (%s)", label);
    check(what, lse_err(lse, c.lse, nl), TOL_FWD);
    float *dq0 = randf(nq, -1, 1), *dk0 = randf(nk, -1, 1), *dv0 = randf(nk, -1, 1);
    float *dq = copyf(dq0, nq), *dk = copyf(dk0, nk), *dv = copyf(dv0, nk);
    if (whole)
        loom_attention_backward(dq, dk, dv, q, k, v, out, w, lse, B, tq, NH, HS);
    else
        loom_attention_kernels_cpu.block_backward(q, q_pos, tq, k, v, k_pos, tk, B, NH, HS,
                                                  LOOM_F32, out, w, lse, dq, dk, dv);
    snprintf(what, sizeof what, "attention dq (%s)", label);
    check(what, rel_err(dq, dq0, rq, nq), TOL_GRAD);
    snprintf(what, sizeof what, "attention dk (%s)", label);
    check(what, rel_err(dk, dk0, rk, nk), TOL_GRAD);
    snprintf(what, sizeof what, "attention dv (%s)", label);
    check(what, rel_err(dv, dv0, rv, nk), TOL_GRAD);
}

static void test_attention(void)
{
    /* HS 12: one 8-lane step and a tail */
    attention_fd_case("causal, B2 T7 NH3 HS12", 2, 3, 12, 7, 7, NULL, NULL);
    attention_fd_case("causal, B1 T5 NH2 HS16", 1, 2, 16, 5, 5, NULL, NULL);
    /* A zigzag slice of T=12 on 2 ranks (chunks 0 and 3) against all keys in
     * ring order; and queries of which the first sees no key at all. */
    const int zq[6] = {0, 1, 2, 9, 10, 11};
    const int zk[12] = {0, 1, 2, 9, 10, 11, 3, 4, 5, 6, 7, 8};
    attention_fd_case("zigzag positions", 2, 2, 12, 6, 12, zq, zk);
    const int eq[3] = {1, 5, 8};
    const int ek[4] = {3, 4, 9, 2};
    attention_fd_case("a query that sees no key", 1, 2, 8, 3, 4, eq, ek);

    /* Past the kernel's tiles (64 queries) and key chunks (256 keys). */
    attention_large_case("causal, B2 T300 NH2 HS20", 2, 2, 20, 300, 300, NULL, NULL);
    /* rank 0 of 2 in zigzag over T=600 (chunks 0 and 3 of 4 of 150, so one
     * query tile holds both), all keys in an order that wraps around */
    enum { ZT = 600, ZQ = 300 };
    int *zzq = test_malloc(ZQ * sizeof(int)), *zzk = test_malloc(ZT * sizeof(int));
    for (int i = 0; i < ZQ; i++)
        zzq[i] = i < 150 ? i : 300 + i;
    for (int j = 0; j < ZT; j++)
        zzk[j] = (j + 150) % ZT;
    attention_large_case("zigzag, tq 300 of T 600", 1, 2, 16, ZQ, ZT, zzq, zzk);
}

/* ------------------------------------------------- attention in blocks */

/* Keys [j0, j1) of every batch row of a (B, tk, C) buffer, as (B, j1-j0, C). */
static void *key_slice(const void *src, size_t es, int B, int tk, int C, int j0, int j1)
{
    char *dst = test_malloc((size_t)B * (j1 - j0) * C * es);
    for (int b = 0; b < B; b++)
        memcpy(dst + (size_t)b * (j1 - j0) * C * es,
               (const char *)src + ((size_t)b * tk + j0) * C * es, (size_t)(j1 - j0) * C * es);
    return dst;
}

static void key_unslice(void *dst, const void *src, size_t es, int B, int tk, int C, int j0,
                        int j1)
{
    for (int b = 0; b < B; b++)
        memcpy((char *)dst + ((size_t)b * tk + j0) * C * es,
               (const char *)src + (size_t)b * (j1 - j0) * C * es, (size_t)(j1 - j0) * C * es);
}

typedef struct attn_problem {
    int B, NH, HS, tq, tk;
    const int *q_pos, *k_pos;
    loom_dtype dtype;
    const void *q, *k, *v, *dout;
} attn_problem;

typedef struct attn_result {
    void *out, *dq, *dk, *dv; /* of the problem's dtype */
    float *lse;
} attn_result;

/* Forward over the key blocks cut at bounds[0..nb] (merging), then the
 * backward block by block given the final out and lse. */
static attn_result run_blocks(const attn_problem *p, const int *bounds, int nb)
{
    const int C = p->NH * p->HS;
    const size_t es = loom_dtype_size(p->dtype);
    const size_t nq = (size_t)p->B * p->tq * C, nk = (size_t)p->B * p->tk * C;
    attn_result r = {test_malloc(nq * es), test_calloc(nq, es), test_calloc(nk, es), test_calloc(nk, es),
                     test_malloc((size_t)p->B * p->NH * p->tq * sizeof(float))};
    /* a first block must overwrite whatever is there, NaN included */
    memset(r.out, 0xff, nq * es);
    memset(r.lse, 0xff, (size_t)p->B * p->NH * p->tq * sizeof(float));
    for (int blk = 0; blk < nb; blk++) {
        int j0 = bounds[blk], j1 = bounds[blk + 1];
        void *kb = key_slice(p->k, es, p->B, p->tk, C, j0, j1);
        void *vb = key_slice(p->v, es, p->B, p->tk, C, j0, j1);
        loom_attention_kernels_cpu.block_forward(p->q, p->q_pos, p->tq, kb, vb, p->k_pos + j0,
                                                 j1 - j0, p->B, p->NH, p->HS, p->dtype, r.out,
                                                 r.lse, blk == 0);
        test_free(kb);
        test_free(vb);
    }
    for (int blk = 0; blk < nb; blk++) {
        int j0 = bounds[blk], j1 = bounds[blk + 1];
        void *kb = key_slice(p->k, es, p->B, p->tk, C, j0, j1);
        void *vb = key_slice(p->v, es, p->B, p->tk, C, j0, j1);
        void *dkb = key_slice(r.dk, es, p->B, p->tk, C, j0, j1);
        void *dvb = key_slice(r.dv, es, p->B, p->tk, C, j0, j1);
        loom_attention_kernels_cpu.block_backward(p->q, p->q_pos, p->tq, kb, vb, p->k_pos + j0,
                                                  j1 - j0, p->B, p->NH, p->HS, p->dtype, r.out,
                                                  p->dout, r.lse, r.dq, dkb, dvb);
        key_unslice(r.dk, dkb, es, p->B, p->tk, C, j0, j1);
        key_unslice(r.dv, dvb, es, p->B, p->tk, C, j0, j1);
        test_free(kb);
        test_free(vb);
        test_free(dkb);
        test_free(dvb);
    }
    return r;
}

static float *as_f32(const void *x, loom_dtype dt, size_t n)
{
    float *y = test_malloc(n * sizeof *y);
    loom_convert(y, LOOM_F32, x, dt, n);
    return y;
}

static double rel_err_f(const float *got, const float *want, size_t n)
{
    double *w = to_double(want, n);
    double e = rel_err(got, NULL, w, n);
    test_free(w);
    return e;
}

static double lse_err_f(const float *got, const float *want, size_t n)
{
    double *w = to_double(want, n);
    double e = lse_err(got, w, n);
    test_free(w);
    return e;
}

static int all_finite_or_neg_inf(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (isnan(x[i]) || x[i] == INFINITY)
            return 0;
    return 1;
}

static void compare_results(const char *label, const attn_problem *p, attn_result got,
                            attn_result want, double tol)
{
    const int C = p->NH * p->HS;
    const size_t nq = (size_t)p->B * p->tq * C, nk = (size_t)p->B * p->tk * C;
    const size_t nl = (size_t)p->B * p->NH * p->tq;
    float *o = as_f32(got.out, p->dtype, nq), *dq = as_f32(got.dq, p->dtype, nq);
    float *dk = as_f32(got.dk, p->dtype, nk), *dv = as_f32(got.dv, p->dtype, nk);
    float *wo = as_f32(want.out, LOOM_F32, nq);
    char what[128];
    snprintf(what, sizeof what, "%s: out", label);
    check(what, rel_err_f(o, wo, nq), tol);
    snprintf(what, sizeof what, "%s: lse", label);
    check(what, lse_err_f(got.lse, want.lse, nl), tol);
    snprintf(what, sizeof what, "%s: dq", label);
    check(what, rel_err_f(dq, want.dq, nq), tol);
    snprintf(what, sizeof what, "%s: dk", label);
    check(what, rel_err_f(dk, want.dk, nk), tol);
    snprintf(what, sizeof what, "%s: dv", label);
    check(what, rel_err_f(dv, want.dv, nk), tol);
    snprintf(what, sizeof what, "%s: no NaN", label);
    check_true(what, all_finite_or_neg_inf(o, nq) && all_finite_or_neg_inf(got.lse, nl) &&
                         all_finite_or_neg_inf(dq, nq) && all_finite_or_neg_inf(dk, nk) &&
                         all_finite_or_neg_inf(dv, nk));
    test_free(o);
    test_free(dq);
    test_free(dk);
    test_free(dv);
    test_free(wo);
}

static void test_attention_blocks(void)
{
    enum { B = 2, NH = 3, HS = 12, TQ = 7, TK = 12 };
    const int C = NH * HS;
    /* zigzag-like query positions (chunks 0 and 3 of 4, plus one early query
     * that no key is visible to) and keys in ring order: own chunk first */
    const int q_pos[TQ] = {0, 1, 2, 9, 10, 11, 1};
    const int k_pos[TK] = {3, 4, 5, 0, 1, 2, 9, 10, 11, 6, 7, 8};
    int q_pos_blind[TQ];
    memcpy(q_pos_blind, q_pos, sizeof q_pos);
    q_pos_blind[6] = -1; /* before every key: out 0, lse -inf */
    const size_t nq = (size_t)B * TQ * C, nk = (size_t)B * TK * C;
    float *q = randf(nq, -2, 2), *k = randf(nk, -2, 2), *v = randf(nk, -1, 1);
    float *dout = randf(nq, -1, 1);

    for (int blind = 0; blind < 2; blind++) {
        attn_problem p = {B, NH, HS, TQ, TK, blind ? q_pos_blind : q_pos, k_pos, LOOM_F32,
                          q, k, v, dout};
        const int one[2] = {0, TK}, two[3] = {0, 5, TK}, three[4] = {0, 3, 7, TK};
        /* first block invisible to everyone: rows start at -inf then merge */
        const int late_first[3] = {0, 3, TK};
        const int *k_late = NULL;
        attn_result ref = run_blocks(&p, one, 1);
        const char *sfx = blind ? " (one query sees no key)" : "";
        char label[96];
        snprintf(label, sizeof label, "2 key blocks = 1%s", sfx);
        compare_results(label, &p, run_blocks(&p, two, 2), ref, 1e-5);
        snprintf(label, sizeof label, "3 key blocks = 1%s", sfx);
        compare_results(label, &p, run_blocks(&p, three, 3), ref, 1e-5);
        if (blind) {
            /* keys reordered so the first block is 9, 10, 11 (invisible to
             * queries 0..2 and the blind one) */
            static const int k_pos_late[TK] = {9, 10, 11, 3, 4, 5, 0, 1, 2, 6, 7, 8};
            float *k2 = test_malloc(nk * sizeof(float)), *v2 = test_malloc(nk * sizeof(float));
            for (int b = 0; b < B; b++) /* same keys, permuted rows: 6..8 then 0..5 then 9..11 */
                for (int j = 0; j < TK; j++) {
                    static const int from[TK] = {6, 7, 8, 0, 1, 2, 3, 4, 5, 9, 10, 11};
                    memcpy(k2 + ((size_t)b * TK + j) * C, k + ((size_t)b * TK + from[j]) * C,
                           (size_t)C * sizeof(float));
                    memcpy(v2 + ((size_t)b * TK + j) * C, v + ((size_t)b * TK + from[j]) * C,
                           (size_t)C * sizeof(float));
                }
            k_late = k_pos_late;
            attn_problem p2 = p;
            p2.k = k2;
            p2.v = v2;
            p2.k_pos = k_late;
            attn_result r2 = run_blocks(&p2, late_first, 2);
            /* compare forward only (dk/dv rows are permuted) */
            float *o2 = as_f32(r2.out, LOOM_F32, nq);
            check("first block unseen by some rows: out", rel_err_f(o2, ref.out, nq), 1e-5);
            check("first block unseen by some rows: lse",
                  lse_err_f(r2.lse, ref.lse, (size_t)B * NH * TQ), 1e-5);
            int zero = 1;
            for (int b = 0; b < B; b++)
                for (int h = 0; h < NH; h++) {
                    zero &= r2.lse[((size_t)b * NH + h) * TQ + 6] == -INFINITY;
                    for (int e = 0; e < HS; e++)
                        zero &= o2[((size_t)b * TQ + 6) * C + (size_t)h * HS + e] == 0.0f;
                }
            check_true("a query that never sees a key: out 0, lse -inf", zero);
        }
    }
}

/* A random problem of T queries and keys (positions 0..T-1) in f32, and
 * the same rounded to dt. */
static void problem_pair(int B, int NH, int HS, int T, loom_dtype dt, attn_problem *p32,
                         attn_problem *low)
{
    const size_t n = (size_t)B * T * NH * HS, es = loom_dtype_size(dt);
    int *pos = test_malloc((size_t)T * sizeof(int));
    for (int i = 0; i < T; i++)
        pos[i] = i;
    float *q = randf(n, -2, 2), *k = randf(n, -2, 2), *v = randf(n, -1, 1);
    float *dout = randf(n, -1, 1);
    *p32 = (attn_problem){B, NH, HS, T, T, pos, pos, LOOM_F32, q, k, v, dout};
    void *q16 = test_malloc(n * es), *k16 = test_malloc(n * es), *v16 = test_malloc(n * es),
         *d16 = test_malloc(n * es);
    loom_convert(q16, dt, q, LOOM_F32, n);
    loom_convert(k16, dt, k, LOOM_F32, n);
    loom_convert(v16, dt, v, LOOM_F32, n);
    loom_convert(d16, dt, dout, LOOM_F32, n);
    *low = (attn_problem){B, NH, HS, T, T, pos, pos, dt, q16, k16, v16, d16};
}

static void test_attention_lowp(loom_dtype dt)
{
    enum { T = 12 };
    attn_problem p32, p16;
    problem_pair(2, 2, 16, T, dt, &p32, &p16);
    const int one[2] = {0, T}, two[3] = {0, 5, T};
    attn_result ref = run_blocks(&p32, one, 1);
    char label[64];
    snprintf(label, sizeof label, "%s in 2 key blocks vs f32", loom_dtype_name(dt));
    compare_results(label, &p16, run_blocks(&p16, two, 2), ref, 1e-2);
}

static void test_attention_bf16(void) { test_attention_lowp(LOOM_BF16); }

static int same_result(const attn_problem *p, attn_result a, attn_result b)
{
    const int C = p->NH * p->HS;
    const size_t es = loom_dtype_size(p->dtype);
    const size_t nq = (size_t)p->B * p->tq * C * es, nk = (size_t)p->B * p->tk * C * es;
    return !memcmp(a.out, b.out, nq) && !memcmp(a.dq, b.dq, nq) && !memcmp(a.dk, b.dk, nk) &&
           !memcmp(a.dv, b.dv, nk) &&
           !memcmp(a.lse, b.lse, (size_t)p->B * p->NH * p->tq * sizeof(float));
}

/* A bf16 run on oneDNN multiplies attention's tiles in bf16 (q, k, v, dout
 * as stored, or rounded from f32 buffers, P and dS rounded): within
 * bf16's reach of the f32 result at a length past one chunk of keys, in
 * one key block or two, on 1 and 2 threads alike; and not the f32
 * products' bits (so the path is taken). */
static void test_attention_bf16_products(void)
{
    if (!loom_gemm_library_built(LOOM_GEMM_ONEDNN)) {
        printf("ok   no oneDNN in this build: bf16 products do not exist\n");
        return;
    }
    enum { T = 300 };
    attn_problem p32, p16;
    problem_pair(2, 3, 32, T, LOOM_BF16, &p32, &p16);
    const int one[2] = {0, T}, two[3] = {0, 137, T};
    loom_gemm_select(LOOM_GEMM_ONEDNN, LOOM_F32);
    attn_result ref = run_blocks(&p32, one, 1), ref_two = run_blocks(&p32, two, 2);
    attn_result f32_products = run_blocks(&p16, one, 1);
    loom_gemm_select(LOOM_GEMM_ONEDNN, LOOM_BF16);
    if (loom_gemm_multiply_dtype() != LOOM_BF16) {
        /* no bf16 products here: a bf16 run's tiles multiply in f32 */
        printf("note %s\n", loom_gemm_products_note());
        check_true("without bf16 products, a bf16 run multiplies its tiles in f32, bit for bit",
                   same_result(&p16, run_blocks(&p16, one, 1), f32_products));
        loom_gemm_select(LOOM_GEMM_AUTO, LOOM_F32);
        return;
    }
    attn_result whole = run_blocks(&p16, one, 1);
    compare_results("bf16 products, one key block, vs f32", &p16, whole, ref, 1e-2);
    compare_results("bf16 products, two key blocks, vs f32", &p16, run_blocks(&p16, two, 2), ref,
                    1e-2);
    check_true("bf16 products are not the f32 products' bits", !same_result(&p16, whole,
                                                                            f32_products));
    loom_kernels_set_threads(2);
    check_true("bf16 products: 1 and 2 threads, bit for bit",
               same_result(&p16, whole, run_blocks(&p16, one, 1)));
    loom_kernels_set_threads(1);
    /* f32 buffers (the model's) in a bf16 run: their products in bf16 too */
    attn_result from_f32 = run_blocks(&p32, two, 2);
    compare_results("bf16 products of f32 buffers, two key blocks, vs f32", &p32, from_f32, ref,
                    1e-2);
    check_true("bf16 products of f32 buffers are not the f32 products' bits",
               !same_result(&p32, from_f32, ref_two));
    loom_gemm_select(LOOM_GEMM_AUTO, LOOM_F32);
}
static void test_attention_f16(void) { test_attention_lowp(LOOM_F16); }

/* ------------------------------------------------------------ convert */

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static void test_convert(void)
{
    enum { N = 1000 };
    float *x = randf(N, -70000, 70000);
    x[0] = 1.0f;
    x[1] = 1.0f + 1.0f / 256.0f; /* a bf16 tie: rounds to even, 1.0 */
    x[2] = 65504.0f;              /* largest half */
    x[3] = 1e-7f;                 /* a half subnormal */
    x[4] = -0.0f;
    x[5] = 3e38f;                 /* beyond half: inf */
    x[6] = NAN;
    x[7] = -INFINITY;
    x[8] = -NAN;
    x[9] = 3.4028235e38f;         /* FLT_MAX rounds up to inf in bf16 */
    uint16_t *b = test_malloc(N * 2), *h = test_malloc(N * 2), *bh = test_malloc(N * 2), *hb = test_malloc(N * 2);
    float *back = test_malloc(N * sizeof(float));
    int ok_b = 1, ok_h = 1, ok_bh = 1, ok_hb = 1, ok_back = 1;
    loom_convert(b, LOOM_BF16, x, LOOM_F32, N);
    loom_convert(h, LOOM_F16, x, LOOM_F32, N);
    loom_convert(bh, LOOM_F16, b, LOOM_BF16, N);
    loom_convert(hb, LOOM_BF16, h, LOOM_F16, N);
    for (int i = 0; i < N; i++) {
        ok_b &= b[i] == loom_f32_to_bf16(x[i]);
        ok_h &= h[i] == loom_f32_to_f16(x[i]);
        ok_bh &= bh[i] == loom_f32_to_f16(loom_bf16_to_f32(b[i]));
        ok_hb &= hb[i] == loom_f32_to_bf16(loom_f16_to_f32(h[i]));
    }
    check_true("convert f32 -> bf16", ok_b);
    check_true("convert f32 -> f16", ok_h);
    check_true("convert bf16 -> f16", ok_bh);
    check_true("convert f16 -> bf16", ok_hb);
    check_true("convert known values",
               b[0] == 0x3f80 && b[1] == 0x3f80 && h[0] == 0x3c00 && h[2] == 0x7bff &&
                   h[3] != 0 && h[3] < 0x0400 && h[4] == 0x8000 && h[5] == 0x7c00 &&
                   (b[6] & 0x7fff) > 0x7f80 && b[7] == 0xff80 && (b[8] & 0x7fff) > 0x7f80 &&
                   b[9] == 0x7f80 && (h[6] & 0x7fff) > 0x7c00);
    loom_convert(back, LOOM_F32, b, LOOM_BF16, N);
    for (int i = 0; i < N; i++)
        ok_back &= same_bits(back[i], loom_bf16_to_f32(b[i])) &&
                   (i == 5 || (i >= 6 && i <= 9) || fabsf(back[i] - x[i]) <= fabsf(x[i]) / 256.0f);
    loom_convert(back, LOOM_F32, h, LOOM_F16, N);
    for (int i = 0; i < N; i++)
        ok_back &= same_bits(back[i], loom_f16_to_f32(h[i]));
    check_true("convert bf16/f16 -> f32", ok_back);
    float *same = test_malloc(N * sizeof(float));
    loom_convert(same, LOOM_F32, x, LOOM_F32, N);
    check_true("convert f32 -> f32 copies", memcmp(same, x, N * sizeof(float)) == 0);
}


/* The native conversions (AVX-512 BF16, F16C) against the portable loops,
 * bit for bit: every 16-bit pattern, and f32 patterns at random, with the
 * special values, subnormals and rounding ties among them. */
static uint32_t random_bits(void) { return (uint32_t)(uniform(0, 4294967296.0)); }

static void test_convert_paths(void)
{
    enum { M = 1 << 16, F = 1 << 20 };
    uint16_t *h = test_malloc(M * sizeof *h);
    uint16_t *nat16 = test_malloc(F * 2), *port16 = test_malloc(F * 2);
    float *nat32 = test_malloc(F * sizeof(float)), *port32 = test_malloc(F * sizeof(float));
    uint32_t *x = test_malloc(F * sizeof *x);
    for (int i = 0; i < M; i++)
        h[i] = (uint16_t)i;
    const uint32_t special[] = {
        0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x00400000, 0x007fffff, /* 0, subnormal */
        0x00800000, 0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000,             /* edges, inf */
        0x7fc00000, 0xffc00000, 0x7f800001, 0xffbfffff, 0x7fc12345, 0x7fa00000, /* NaNs */
        0x3f808000, 0x3f818000, 0x3f80ffff, 0x3f807fff,                         /* bf16 ties */
        0x477ff000, 0x477fefff, 0x33000000, 0x33000001, 0x387fc000, 0x38800000, /* f16 edges */
        0x3f801000, 0x3f803000, 0xc7800000, 0x37800000};
    for (int i = 0; i < F; i++) /* random bits: every exponent, NaNs included */
        x[i] = random_bits();
    for (size_t i = 0; i < ARRAY_LEN(special); i++) /* in and across 32-element blocks */
        x[i] = x[40 + 33 * i] = special[i];
    for (int i = 0; i < 4096; i++) /* whole blocks of f32 subnormals, and of small values */
        x[8192 + i] = (random_bits() & 0x807fffffu) | (i & 1 ? 0x00800000u : 0u);
    struct {
        loom_dtype dst, src;
        const void *in;
        size_t n;
    } pairs[] = {{LOOM_BF16, LOOM_F32, x, F},
                 {LOOM_F16, LOOM_F32, x, F},
                 {LOOM_F32, LOOM_BF16, h, M},
                 {LOOM_F32, LOOM_F16, h, M}};
    int natives = 0;
    for (size_t i = 0; i < ARRAY_LEN(pairs); i++) {
        const char *name = loom_convert_path_name(pairs[i].dst, pairs[i].src);
        void *nat = pairs[i].dst == LOOM_F32 ? (void *)nat32 : (void *)nat16;
        void *port = pairs[i].dst == LOOM_F32 ? (void *)port32 : (void *)port16;
        size_t bytes = pairs[i].n * loom_dtype_size(pairs[i].dst);
        /* odd lengths and offsets: the blocks' tails, unaligned loads */
        loom_convert(nat, pairs[i].dst, pairs[i].in, pairs[i].src, pairs[i].n);
        loom_convert_set_path(LOOM_CONVERT_PORTABLE);
        loom_convert(port, pairs[i].dst, pairs[i].in, pairs[i].src, pairs[i].n);
        check_true("convert: the portable path can be chosen",
                   strcmp(loom_convert_path_name(pairs[i].dst, pairs[i].src), "portable") == 0);
        loom_convert_set_path(LOOM_CONVERT_NATIVE);
        int same = memcmp(nat, port, bytes) == 0;
        const size_t es = loom_dtype_size(pairs[i].src);
        loom_convert(nat, pairs[i].dst, (const char *)pairs[i].in + 3 * es, pairs[i].src,
                     pairs[i].n - 7);
        same &= memcmp(nat, (const char *)port + 3 * loom_dtype_size(pairs[i].dst),
                       (pairs[i].n - 7) * loom_dtype_size(pairs[i].dst)) == 0;
        char what[128];
        snprintf(what, sizeof what, "convert %s -> %s: %s path = portable, bit for bit",
                 loom_dtype_name(pairs[i].src), loom_dtype_name(pairs[i].dst), name);
        check_true(what, same);
        natives += strcmp(name, "portable") != 0;
    }
    printf("note %d of 4 conversions have a native path on this CPU\n", natives);
}

/* loom_accumulate against tensor.h's scalar conversions, bit for bit, in
 * every storage type; the source left zero. */
static void test_accumulate(void)
{
    enum { N = 70001 }; /* past the size threads split, with a tail */
    const loom_dtype types[] = {LOOM_F32, LOOM_BF16, LOOM_F16};
    float *base = randf(N, -10, 10);
    for (size_t k = 0; k < ARRAY_LEN(types); k++) {
        const loom_dtype t = types[k];
        void *got = test_malloc(N * sizeof(float)), *want = test_malloc(N * sizeof(float));
        loom_convert(got, t, base, LOOM_F32, N);
        loom_convert(want, t, base, LOOM_F32, N);
        float *src = randf(N, -1, 1);
        src[5] = NAN;
        for (size_t i = 0; i < N; i++)
            loom_store_f32(want, t, i, loom_load_f32(want, t, i) + src[i]);
        loom_kernels_set_threads(2);
        loom_accumulate(got, t, src, N);
        loom_kernels_set_threads(1);
        int zero = 1;
        for (size_t i = 0; i < N; i++)
            zero &= src[i] == 0.0f;
        char what[80];
        snprintf(what, sizeof what, "accumulate into %s: the scalar sums, bit for bit; source 0",
                 loom_dtype_name(t));
        check_true(what, memcmp(got, want, N * loom_dtype_size(t)) == 0 && zero);
    }
}

/* ------------------------------------------------------------ fused */

/* The fused kernels against their parts, bit for bit. */
static void test_fused(void)
{
    enum { N = 7, C = 53 }; /* C: three 16-lane steps and a tail */
    const size_t n = (size_t)N * C;
    float *a = randf(n, -2, 2), *b = randf(n, -2, 2), *w = randf(C, 0.5, 1.5);
    float *bias = randf(C, -0.5, 0.5);
    float *res1 = test_malloc(n * 4), *out1 = test_malloc(n * 4), *mean1 = test_malloc(N * 4),
          *rstd1 = test_malloc(N * 4);
    float *res2 = test_malloc(n * 4), *out2 = test_malloc(n * 4), *mean2 = test_malloc(N * 4),
          *rstd2 = test_malloc(N * 4);
    loom_residual_forward(res1, a, b, (int)n);
    loom_layernorm_forward(out1, mean1, rstd1, res1, w, bias, N, C);
    loom_residual_layernorm_forward(res2, out2, mean2, rstd2, a, b, w, bias, N, C);
    check_true("residual + layernorm fused = apart, bit for bit",
               memcmp(res1, res2, n * 4) == 0 && memcmp(out1, out2, n * 4) == 0 &&
                   memcmp(mean1, mean2, N * 4) == 0 && memcmp(rstd1, rstd2, N * 4) == 0);

    float *pre1 = randf(n, -4, 4), *pre2 = copyf(pre1, n);
    for (int r = 0; r < N; r++)
        for (int i = 0; i < C; i++)
            pre1[(size_t)r * C + i] += bias[i];
    loom_gelu_forward(out1, pre1, (int)n);
    loom_bias_gelu_forward(out2, pre2, bias, N, C);
    check_true("bias + gelu fused = apart, bit for bit",
               memcmp(pre1, pre2, n * 4) == 0 && memcmp(out1, out2, n * 4) == 0);
}

/* ------------------------------------------------------------ threads, ISA versions */

/* Each kernel run on copies of the same inputs two ways (1 and 2 threads;
 * each vector level the CPU has), every output compared bit for bit. Sizes
 * are past the point where the kernels split work (32768 elements). */
typedef struct kernel_case {
    const char *name;
    void (*run)(float **bufs);
    int nbufs;
    size_t len[12];
    float lo[12], hi[12];
} kernel_case;

enum { TN = 96, TC = 1000, TV = 700, TVP = 720, TB = 2, TT = 48, TNH = 4, THS = 24 };

static int tokens[TN];

static void run_encoder(float **x)
{
    loom_encoder_forward(x[0], tokens, NULL, x[1], x[2], TB, TT, TC);
    loom_encoder_backward(x[3], x[4], x[0], tokens, NULL, TB, TT, TC);
}

static void run_layernorm(float **x)
{
    loom_layernorm_forward(x[0], x[1], x[2], x[3], x[4], x[5], TN, TC);
    loom_residual_layernorm_forward(x[6], x[0], x[1], x[2], x[3], x[7], x[4], x[5], TN, TC);
    loom_layernorm_backward(x[8], x[9], x[10], x[7], x[3], x[4], x[1], x[2], TN, TC);
}

static void run_gelu(float **x)
{
    loom_gelu_forward(x[0], x[1], TN * TC);
    loom_gelu_backward(x[2], x[1], x[3], TN * TC);
    loom_bias_gelu_forward(x[0], x[1], x[4], TN, TC);
}

static void run_residual(float **x)
{
    loom_residual_forward(x[0], x[1], x[2], TN * TC);
    loom_residual_backward(x[1], x[2], x[0], TN * TC);
}

static void run_bias_backward(float **x) /* matmul_backward without dweight: dbias only */
{
    loom_matmul_backward(NULL, NULL, x[0], x[1], NULL, loom_weight_f32(NULL), TN, 8, TC);
}

static void run_softmax(float **x)
{
    loom_softmax_crossentropy_forward(x[0], x[1], x[2], tokens, TN, TV, TVP);
    loom_softmax_crossentropy_backward(x[2], x[3], x[1], tokens, TN, TV, TVP);
}

static void run_attention(float **x)
{
    loom_attention_forward(x[3], x[4], x[0], x[1], x[2], TB, TT, TNH, THS);
    loom_attention_backward(x[5], x[6], x[7], x[0], x[1], x[2], x[3], x[8], x[4], TB, TT, TNH,
                            THS);
    /* the same in bf16, through the threads' packed heads */
    const size_t n = (size_t)TB * TT * TNH * THS;
    uint16_t *h = (uint16_t *)x[9];
    for (int i = 0; i < 3; i++)
        loom_convert(h + i * n, LOOM_BF16, x[i], LOOM_F32, n);
    loom_attention_kernels_cpu.block_forward(h, NULL, TT, h + n, h + 2 * n, NULL, TT, TB, TNH, THS,
                                             LOOM_BF16, h + 3 * n, x[10], 1);
}

static void run_adamw(float **x)
{
    loom_optimizer_step s = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                             .weight_decay = 0.1f, .step = 3, .grad_scale = 0.5f};
    loom_adamw_update(&s, x[0], x[1], LOOM_F32, x[2], x[3], (size_t)TN * TC);
    uint16_t *g16 = (uint16_t *)x[4];
    loom_convert(g16, LOOM_BF16, x[1], LOOM_F32, (size_t)TN * TC);
    loom_adamw_update(&s, x[0], g16, LOOM_BF16, x[2], x[3], (size_t)TN * TC);
    /* and storing bf16 parameters in the same pass */
    loom_adamw_update_range_store_all(&s, NULL, 0, x[0], g16, LOOM_BF16, x[2], x[3],
                                      (size_t)TN * TC, x[5], LOOM_BF16);
}

static void run_convert(float **x)
{
    const size_t n = (size_t)TN * TC;
    loom_convert(x[1], LOOM_BF16, x[0], LOOM_F32, n);
    loom_convert(x[2], LOOM_F16, x[0], LOOM_F32, n);
    loom_convert(x[3], LOOM_F32, x[1], LOOM_BF16, n);
    loom_convert(x[4], LOOM_F32, x[2], LOOM_F16, n);
}

#define NC ((size_t)TN * TC)
#define NV ((size_t)TN * TVP)
#define A4 ((size_t)TB * TT * TNH * THS)
#define NL ((size_t)TB * TNH * TT)
#define VC ((size_t)TV * TC)
#define PC ((size_t)TT * TC)
static const kernel_case kernel_cases[] = {
    {"encoder", run_encoder, 5, {NC, VC, PC, VC, PC}, {0, -1, -1, -1, -1}, {0, 1, 1, 1, 1}},
    {"layernorm",
     run_layernorm,
     11,
     {NC, TN, TN, NC, TC, TC, NC, NC, NC, TC, TC},
     {0, 0, 0, -2, 0.5f, -1, 0, -1, -1, -1, -1},
     {0, 0, 0, 2, 1.5f, 1, 0, 1, 1, 1, 1}},
    {"gelu", run_gelu, 5, {NC, NC, NC, NC, TC}, {0, -4, -1, -1, -1}, {0, 4, 1, 1, 1}},
    {"residual", run_residual, 3, {NC, NC, NC}, {0, -1, -1}, {0, 1, 1}},
    {"bias gradient", run_bias_backward, 2, {TC, NC}, {-1, -1}, {1, 1}},
    {"softmax-crossentropy", run_softmax, 4, {TN, TN, NV, TN}, {0, 0, -8, 0.1f}, {0, 0, 8, 1}},
    {"attention (f32, bf16)",
     run_attention,
     11,
     {A4, A4, A4, A4, NL, A4, A4, A4, A4, 2 * A4, NL},
     {-1, -1, -1, 0, 0, -1, -1, -1, -1, 0, 0},
     {1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0}},
    {"adamw (f32, bf16 gradients, bf16 parameters stored)",
     run_adamw,
     6,
     {NC, NC, NC, NC, NC, NC},
     {-1, -1e-2f, -1e-3f, 0, 0, 0},
     {1, 1e-2f, 1e-3f, 1e-5f, 0, 0}},
    {"convert", run_convert, 5, {NC, NC, NC, NC, NC}, {-1e5f, 0, 0, 0, 0}, {1e5f, 0, 0, 0, 0}},
};

static float **case_inputs(const kernel_case *t)
{
    for (int i = 0; i < TN; i++)
        tokens[i] = (i * 7) % 50; /* repeats: the embedding's gradient rows add up */
    float **x = test_malloc(sizeof *x * (size_t)t->nbufs);
    for (int i = 0; i < t->nbufs; i++)
        x[i] = randf(t->len[i], t->lo[i], t->hi[i]);
    return x;
}

static float **case_copy(const kernel_case *t, float *const *from)
{
    float **x = test_malloc(sizeof *x * (size_t)t->nbufs);
    for (int i = 0; i < t->nbufs; i++)
        x[i] = copyf(from[i], t->len[i]);
    return x;
}

static int case_same(const kernel_case *t, float *const *a, float *const *b)
{
    int same = 1;
    for (int i = 0; i < t->nbufs; i++)
        same &= memcmp(a[i], b[i], t->len[i] * sizeof(float)) == 0;
    return same;
}

static void test_threads(void)
{
    for (size_t k = 0; k < ARRAY_LEN(kernel_cases); k++) {
        const kernel_case *t = &kernel_cases[k];
        float **in = case_inputs(t), **one = case_copy(t, in), **two = case_copy(t, in);
        loom_kernels_set_threads(1);
        t->run(one);
        loom_kernels_set_threads(2);
        t->run(two);
        loom_kernels_set_threads(1);
        char what[96];
        snprintf(what, sizeof what, "%s: 1 and 2 threads, bit for bit", t->name);
        check_true(what, case_same(t, one, two));
    }
}

/* Every kernel's versions for lower vector levels (loom_cpu_cap_isa, what
 * LOOM_MAX_ISA does at start) give the widest version's bits; and the
 * conversions' native paths follow the cap. */
static void test_isa_versions(void)
{
    const loom_isa top = loom_cpu_isa();
    printf("note vector instructions: %s\n", loom_cpu_describe());
    float **in[ARRAY_LEN(kernel_cases)], **widest[ARRAY_LEN(kernel_cases)];
    for (size_t k = 0; k < ARRAY_LEN(kernel_cases); k++) {
        in[k] = case_inputs(&kernel_cases[k]);
        widest[k] = case_copy(&kernel_cases[k], in[k]);
        kernel_cases[k].run(widest[k]);
    }
    check_true("convert f32 -> bf16: the AVX512-BF16 path exactly where the level has it",
               (strcmp(loom_convert_path_name(LOOM_BF16, LOOM_F32), "avx512-bf16") == 0) ==
                   (top >= LOOM_ISA_AVX512_BF16));
    for (int level = (int)top - 1; level >= LOOM_ISA_BASELINE; level--) {
        loom_cpu_cap_isa((loom_isa)level);
        check_true("the cap lowers the level in use", loom_cpu_isa() == (loom_isa)level);
        for (size_t k = 0; k < ARRAY_LEN(kernel_cases); k++) {
            const kernel_case *t = &kernel_cases[k];
            float **x = case_copy(t, in[k]);
            t->run(x);
            char what[160];
            snprintf(what, sizeof what, "%s: %s = %s, bit for bit", t->name,
                     loom_isa_name((loom_isa)level), loom_isa_name(top));
            check_true(what, case_same(t, x, widest[k]));
        }
        check_true("convert f32 -> bf16: the AVX512-BF16 path exactly where the level has it",
                   (strcmp(loom_convert_path_name(LOOM_BF16, LOOM_F32), "avx512-bf16") == 0) ==
                       (level >= LOOM_ISA_AVX512_BF16));
        if (level < LOOM_ISA_AVX2)
            check_true("convert: no F16C path below avx2",
                       strcmp(loom_convert_path_name(LOOM_F16, LOOM_F32), "portable") == 0 &&
                           strcmp(loom_convert_path_name(LOOM_F32, LOOM_F16), "portable") == 0);
    }
    if (top == LOOM_ISA_BASELINE)
        printf("note only baseline x86-64 here: no other version to compare\n");
}

/* ------------------------------------------------------------ main */

static const struct {
    const char *name;
    void (*run)(void);
} cases[] = {
    {"encoder", test_encoder},
    {"layernorm", test_layernorm},
    {"matmul", test_matmul},
    {"gelu", test_gelu},
    {"residual", test_residual},
    {"softmax_crossentropy", test_softmax_crossentropy},
    {"attention", test_attention},
    {"attention_blocks", test_attention_blocks},
    {"attention_bf16", test_attention_bf16},
    {"attention_bf16_products", test_attention_bf16_products},
    {"attention_f16", test_attention_f16},
    {"convert", test_convert},
    {"convert_paths", test_convert_paths},
    {"accumulate", test_accumulate},
    {"fused", test_fused},
    {"threads", test_threads},
    {"isa_versions", test_isa_versions},
};

int main(int argc, char **argv)
{
    int ran = 0;
    loom_kernels_set_threads(1);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (argc > 1 && strcmp(argv[1], cases[i].name) != 0)
            continue;
        printf("== %s\n", cases[i].name);
        cases[i].run();
        free_buffers();
        ran++;
    }
    if (!ran) {
        fprintf(stderr, "test_kernels: no case named '%s'\n", argv[1]);
        return 2;
    }
    if (failures)
        printf("%d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
