/* compute-cuda's per-element math, run on the host (no GPU needed) against
 * loom's CPU functions: the bf16 and f16 conversions bit for bit over every
 * 16-bit pattern and over f32 patterns around every rounding boundary
 * (ties, subnormals, overflow, NaNs), on both of loom_convert's paths;
 * AdamW's update of one element against loom_adamw_apply bit for bit for
 * every gradient and parameter dtype; accumulate against loom_accumulate;
 * the non-finite test against isfinite; and the loss's per-element
 * gradients and loss against the CPU kernels. The kernels' files are
 * included whole: their host-callable functions are what is tested, and
 * nothing here launches a kernel.
 *
 *   nvcc -std=c++17 -O2 -Xcompiler -Wall,-Wextra,-ffp-contract=off \
 *        -Iplugins/compute-cuda tests/compute/cuda_math_host_test.cu \
 *        <libloom_model.a libloom_runtime.a and their libraries> -o cuda_math_host_test
 *   cuda_math_host_test [--all]   (--all: every one of the 2^32 f32 patterns too, ~1 min) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_loss.cu"
#include "kernels_optim.cu"

/* loom's CPU functions (model/kernels.h, model/optimizer.h), declared here
 * because loom's headers are C, not C++. The dtypes are loom_dtype's
 * values, which cuda_dtype's equal; loom_compute_adamw is laid out as
 * cuda_adamw. */
extern "C" {
void loom_convert(void *dst, int dst_type, const void *src, int src_type, size_t n);
void loom_convert_set_path(int path); /* 0 native, 1 portable */
void loom_accumulate(void *dst, int dst_type, float *src, size_t n);
void loom_adamw_apply(const cuda_adamw *step, float *master, const void *grad, int grad_dtype,
                      float *m, float *v, size_t n, void *params, int params_dtype);
void loom_softmax_crossentropy_forward(float *losses, float *lse, const float *logits,
                                       const int *targets, int N, int V, int Vp);
void loom_softmax_crossentropy_backward(float *logits, const float *dlosses, const float *lse,
                                        const int *targets, int N, int V, int Vp);
}

static int failures;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            if (failures++ < 20) {                                                                 \
                fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                               \
                fprintf(stderr, __VA_ARGS__);                                                      \
                fputc('\n', stderr);                                                               \
            }                                                                                      \
        }                                                                                          \
    } while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t random_u32(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static float uniform(float lo, float hi) { return lo + (hi - lo) * (random_u32() / 4294967296.0f); }

static const char *dtype_name(int t) { return t == 0 ? "f32" : t == 1 ? "bf16" : "f16"; }

/* ---- conversions ---- */

/* Every one of the 65536 bf16 and f16 patterns widened, and narrowed to
 * the other 16-bit type through f32, against loom_convert. */
static void test_halves(void)
{
    enum { COUNT = 65536 };
    static uint16_t h[COUNT], want16[COUNT];
    static float want[COUNT];
    for (int i = 0; i < COUNT; i++)
        h[i] = (uint16_t)i;
    for (int t = CUDA_DTYPE_BF16; t <= CUDA_DTYPE_F16; t++) {
        const cuda_dtype dt = (cuda_dtype)t, other = t == 1 ? CUDA_DTYPE_F16 : CUDA_DTYPE_BF16;
        loom_convert(want, CUDA_DTYPE_F32, h, t, COUNT);
        loom_convert(want16, other, h, t, COUNT);
        for (int i = 0; i < COUNT; i++) {
            const float got = load_value(h, dt, i);
            EXPECT(bits_of(got) == bits_of(want[i]), "%s 0x%04x to f32: 0x%08x, want 0x%08x",
                   dtype_name(t), i, bits_of(got), bits_of(want[i]));
            uint16_t narrowed;
            store_value(&narrowed, other, 0, got);
            EXPECT(narrowed == want16[i], "%s 0x%04x to %s: 0x%04x, want 0x%04x", dtype_name(t),
                   i, dtype_name(other), narrowed, want16[i]);
            EXPECT(nonfinite_bits(i, dt) == !isfinite(want[i]), "%s 0x%04x: finite?",
                   dtype_name(t), i);
        }
    }
}

/* f32 patterns in blocks, narrowed to bf16 and f16 by both sides. */
enum { BLOCK = 1 << 16 };
static uint32_t block_bits[BLOCK];
static int block_fill;

static void flush_block(void)
{
    static uint16_t want[BLOCK];
    const float *f = (const float *)block_bits;
    for (int t = CUDA_DTYPE_BF16; t <= CUDA_DTYPE_F16; t++) {
        loom_convert(want, t, f, CUDA_DTYPE_F32, block_fill);
        for (int i = 0; i < block_fill; i++) {
            uint16_t got;
            store_value(&got, (cuda_dtype)t, 0, f[i]);
            EXPECT(got == want[i], "f32 0x%08x to %s: 0x%04x, want 0x%04x", block_bits[i],
                   dtype_name(t), got, want[i]);
        }
        for (int i = 0; i < block_fill; i++)
            EXPECT(nonfinite_bits(block_bits[i], CUDA_DTYPE_F32) == !isfinite(f[i]),
                   "f32 0x%08x: finite?", block_bits[i]);
    }
    block_fill = 0;
}

static void add_pattern(uint32_t u)
{
    block_bits[block_fill++] = u;
    if (block_fill == BLOCK)
        flush_block();
}

/* Both signs of every pattern in [lo, hi) of absolute values, step apart. */
static void add_range(uint32_t lo, uint32_t hi, uint32_t step)
{
    for (uint64_t u = lo; u < hi; u += step) {
        add_pattern((uint32_t)u);
        add_pattern((uint32_t)u | 0x80000000u);
    }
}

static void test_narrowing(int all)
{
    /* bf16: around every bf16 value's rounding boundary (ties at 0x8000) */
    static const uint32_t bf16_low[] = {0, 1, 0x7fff, 0x8000, 0x8001, 0xffff};
    for (uint32_t hi = 0; hi < 0x10000u; hi++)
        for (size_t k = 0; k < sizeof bf16_low / sizeof bf16_low[0]; k++)
            add_pattern(hi << 16 | bf16_low[k]);
    /* f16 normals: around bit 13's boundary, every exponent */
    static const uint32_t f16_low[] = {0, 1, 0xfff, 0x1000, 0x1001, 0x1fff};
    for (uint32_t hi = 0; hi < (1u << 19); hi++)
        for (size_t k = 0; k < sizeof f16_low / sizeof f16_low[0]; k++)
            add_pattern(hi << 13 | f16_low[k]);
    /* f16 subnormals and underflow, every positive pattern, and the edges */
    add_range(0x32fffff0u, 0x38800010u, 1);
    /* f16 overflow to infinity, every pattern near 65520 */
    add_range(0x477f0000u, 0x47810000u, 1);
    /* infinities, NaNs of several payloads, the extremes */
    static const uint32_t special[] = {0x7f800000u, 0x7f800001u, 0x7fc00000u, 0x7fbfffffu,
                                       0x7fffffffu, 0x7fc00001u, 0x7f7fffffu, 0x00000001u,
                                       0x007fffffu, 0x00800000u, 0x3f800000u, 0x00000000u};
    for (size_t k = 0; k < sizeof special / sizeof special[0]; k++) {
        add_pattern(special[k]);
        add_pattern(special[k] | 0x80000000u);
    }
    if (all) {
        for (uint64_t u = 0; u < (1ull << 32); u++)
            add_pattern((uint32_t)u);
    } else { /* a sweep of the rest */
        for (uint64_t u = 0; u < (1ull << 32); u += 997)
            add_pattern((uint32_t)u);
    }
    flush_block();
}

/* ---- AdamW ---- */

static void fill_random(float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = uniform(lo, hi);
}

static void test_adamw(void)
{
    enum { n = 4099 };
    static float master[n], m[n], v[n], g32[n];
    static float wm[n], wmm[n], wv[n], gm[n], gmm[n], gv[n];
    static uint16_t grad16[n];
    static unsigned char wparams[4 * n], gparams[4 * n];
    const int64_t steps[] = {1, 3, 1000};
    const float decays[] = {0.0f, 0.1f}, scales[] = {1.0f, 0.37f};
    int cases = 0;
    for (int gt = 0; gt < 3; gt++)
        for (int pt = -1; pt < 3; pt++) /* -1: no parameters stored */
            for (int si = 0; si < 3; si++)
                for (int wi = 0; wi < 2; wi++)
                    for (int ci = 0; ci < 2; ci++) {
                        const cuda_adamw s = {steps[si], 3e-4f, 0.9f, 0.95f, 1e-8f, decays[wi],
                                              scales[ci]};
                        fill_random(master, n, -1, 1);
                        fill_random(m, n, -0.01f, 0.01f);
                        fill_random(v, n, 0, 1e-4f);
                        fill_random(g32, n, -2, 2);
                        /* tiny and large magnitudes: subnormal moments, big steps */
                        for (int i = 0; i < n; i += 7)
                            g32[i] = ldexpf(g32[i], (int)(random_u32() % 160) - 140);
                        for (int i = 3; i < n; i += 11)
                            m[i] = ldexpf(m[i], -120);
                        const void *grad = g32;
                        if (gt) {
                            loom_convert(grad16, gt, g32, CUDA_DTYPE_F32, n);
                            grad = grad16;
                        }
                        memcpy(wm, master, sizeof master);
                        memcpy(wmm, m, sizeof m);
                        memcpy(wv, v, sizeof v);
                        memcpy(gm, master, sizeof master);
                        memcpy(gmm, m, sizeof m);
                        memcpy(gv, v, sizeof v);
                        memset(wparams, 0, sizeof wparams);
                        memset(gparams, 0, sizeof gparams);
                        loom_adamw_apply(&s, wm, grad, gt, wmm, wv, n, pt >= 0 ? wparams : NULL,
                                         pt >= 0 ? pt : 0);
                        const adamw_consts k = adamw_consts_of(&s);
                        for (size_t i = 0; i < n; i++) {
                            gm[i] = adamw_value(k, load_value(grad, (cuda_dtype)gt, i), &gmm[i],
                                                &gv[i], gm[i]);
                            if (pt >= 0)
                                store_value(gparams, (cuda_dtype)pt, i, gm[i]);
                        }
                        const int bad = memcmp(gm, wm, sizeof gm) || memcmp(gmm, wmm, sizeof gmm) ||
                                        memcmp(gv, wv, sizeof gv) ||
                                        memcmp(gparams, wparams, sizeof gparams);
                        EXPECT(!bad, "adamw (grad %s, params %s, step %lld, wd %g, scale %g) "
                                     "differs from loom_adamw_apply",
                               dtype_name(gt), pt >= 0 ? dtype_name(pt) : "none",
                               (long long)s.step, s.weight_decay, s.grad_scale);
                        cases++;
                    }
    printf("adamw: %d cases of %d elements\n", cases, n);
}

/* ---- accumulate ---- */

static void test_accumulate(void)
{
    enum { n = 5003 };
    static float src[n], want_src[n], start[n];
    static unsigned char dst[4 * n], want[4 * n];
    for (int t = 0; t < 3; t++) {
        fill_random(start, n, -4, 4);
        fill_random(src, n, -1, 1);
        for (int i = 0; i < n; i += 13)
            src[i] = ldexpf(src[i], -(int)(random_u32() % 30));
        loom_convert(dst, t, start, CUDA_DTYPE_F32, n);
        memcpy(want, dst, sizeof dst);
        memcpy(want_src, src, sizeof src);
        loom_accumulate(want, t, want_src, n);
        for (size_t i = 0; i < n; i++) {
            store_value(dst, (cuda_dtype)t, i, add_rn(load_value(dst, (cuda_dtype)t, i), src[i]));
            src[i] = 0.0f;
        }
        EXPECT(!memcmp(dst, want, sizeof dst) && !memcmp(src, want_src, sizeof src),
               "accumulate into %s differs from loom_accumulate", dtype_name(t));
    }
}

/* ---- the loss ---- */

/* The kernels' row arithmetic done on the host in one thread's order:
 * within a rounding of the CPU's (exp there is a polynomial, and the sums'
 * orders differ), and the per-element functions as the kernels call them. */
static void test_loss(void)
{
    enum { N = 9, V = 37, Vp = 40 };
    static float logits[N * Vp], losses[N], lse[N], grad[N * Vp], dlosses[N];
    static int targets[N];
    fill_random(logits, N * Vp, -6, 6);
    fill_random(dlosses, N, 0.1f, 1);
    for (int n = 0; n < N; n++)
        targets[n] = (int)(random_u32() % V);
    targets[0] = 0;
    targets[1] = V - 1;
    loom_softmax_crossentropy_forward(losses, lse, logits, targets, N, V, Vp);
    memcpy(grad, logits, sizeof grad);
    loom_softmax_crossentropy_backward(grad, dlosses, lse, targets, N, V, Vp);
    for (int n = 0; n < N; n++) {
        const float *x = logits + n * Vp;
        float max = -INFINITY, sum = 0;
        for (int i = 0; i < V; i++)
            max = loss_take_max(max, x[i]);
        for (int i = 0; i < V; i++)
            sum += expf(x[i] - max);
        const float L = max + logf(sum), loss = loss_of(x[targets[n]], max, sum);
        EXPECT(fabsf(L - lse[n]) <= 1e-5f * fmaxf(1, fabsf(lse[n])), "lse[%d] %.9g, want %.9g",
               n, L, lse[n]);
        EXPECT(fabsf(loss - losses[n]) <= 1e-5f * fmaxf(1, fabsf(losses[n])),
               "loss[%d] %.9g, want %.9g", n, loss, losses[n]);
        for (int i = 0; i < Vp; i++) {
            const float g = loss_grad_value(x[i], i, V, targets[n], lse[n], dlosses[n]);
            const float w = grad[n * Vp + i];
            EXPECT(fabsf(g - w) <= 1e-6f, "dlogits[%d][%d] %.9g, want %.9g", n, i, g, w);
            /* the slice's gradient: the model's loop, the same bits on the host */
            float s = i < V ? expf(x[i] - lse[n]) * dlosses[n] : 0.0f;
            if (i == targets[n])
                s -= dlosses[n];
            const float got = loss_slice_grad_value(x[i], i, V, targets[n], lse[n], dlosses[n]);
            EXPECT(bits_of(got) == bits_of(s), "slice dlogits[%d][%d] %.9g, want %.9g", n, i, got,
                   s);
        }
        /* a target outside the row takes nothing */
        EXPECT(loss_grad_value(x[3], 3, V, -1, lse[n], dlosses[n]) ==
                   expf(x[3] - lse[n]) * dlosses[n],
               "a target of -1 changed column 3");
    }
    /* p_target underflowing: an infinite loss, as the CPU gives */
    EXPECT(isinf(loss_of(-200.0f, 0.0f, 1.0f)), "loss_of(-200, 0, 1) = %g, want inf",
           loss_of(-200.0f, 0.0f, 1.0f));
}

int main(int argc, char **argv)
{
    const int all = argc > 1 && strcmp(argv[1], "--all") == 0;
    if (argc > 2 || (argc == 2 && !all)) {
        fprintf(stderr, "usage: cuda_math_host_test [--all]\n");
        return 2;
    }
    for (int path = 0; path < 2; path++) { /* loom_convert's native and portable paths */
        loom_convert_set_path(path);
        test_halves();
        test_narrowing(all && path == 0);
    }
    loom_convert_set_path(0);
    test_adamw();
    test_accumulate();
    test_loss();
    if (failures) {
        fprintf(stderr, "cuda_math_host_test: %d failures\n", failures);
        return 1;
    }
    printf("cuda_math_host_test: all passed\n");
    return 0;
}
