/* compute-cuda's per-element math, run on the host (no GPU needed) against
 * loom's CPU functions: the bf16 and f16 conversions bit for bit over every
 * 16-bit pattern and over f32 patterns around every rounding boundary
 * (ties, subnormals, overflow, NaNs), on both of loom_convert's paths;
 * AdamW's update of one element against loom_adamw_apply bit for bit for
 * every gradient and parameter dtype; accumulate against loom_accumulate;
 * the non-finite test against isfinite; and the loss's per-element
 * gradients and loss against the CPU kernels. The kernels' files are
 * included whole: their host-callable functions are what is tested here.
 * Where a GPU is visible, the launchers themselves run too, at real sizes,
 * against the same functions and loom's CPU kernels (then the two big
 * kernels' timings are printed); without one that part says it is skipped.
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

/* ---- the launchers on a GPU, when one is visible ---- */

/* The same per-element math and the reductions run by the kernels at real
 * sizes (GPT-2's vocabulary, a million parameters, ten million norms),
 * aligned and one element off (the vectorised and the scalar paths),
 * against the host functions above and loom's CPU kernels. */
#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        const cudaError_t rc_ = (call);                                                            \
        if (rc_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call,                     \
                    cudaGetErrorString(rc_));                                                      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static cuda_ctx gpu;

enum { SLACK = 64 }; /* bytes before a buffer's data, for the misaligned copies */

/* Device copies of host bytes at a byte offset (0: 256-aligned). */
static void *upload_at(const void *h, size_t bytes, size_t offset)
{
    char *d = NULL;
    CUDA_OK(cudaMalloc((void **)&d, bytes + SLACK));
    CUDA_OK(cudaMemcpy(d + offset, h, bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize()); /* a pageable copy may still be in flight on return */
    return d + offset;
}

static void release(void *d, size_t offset) { CUDA_OK(cudaFree((char *)d - offset)); }

static void to_device(void *d, const void *h, size_t bytes)
{
    CUDA_OK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaDeviceSynchronize());
}

static void download(void *h, const void *d, size_t bytes)
{
    CUDA_OK(cudaStreamSynchronize(gpu.stream));
    CUDA_OK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

static size_t dsize(int t) { return t == CUDA_DTYPE_F32 ? 4 : 2; }

/* n random elements of dtype t, any bits (NaNs, infinities, subnormals). */
static void *random_bits(int t, size_t n)
{
    unsigned char *p = (unsigned char *)malloc(n * dsize(t));
    for (size_t i = 0; i < n * dsize(t); i += 2) {
        const uint32_t r = random_u32();
        memcpy(p + i, &r, 2);
    }
    return p;
}

static void gpu_test_convert(void)
{
    const size_t n = (1u << 20) + 5;
    for (int st = 0; st < 3; st++)
        for (int dt = 0; dt < 3; dt++)
            for (int shift = 0; shift < 2; shift++) { /* one element off: the scalar paths */
                if (st == dt)
                    continue;
                const size_t off = shift * dsize(st);
                void *src = random_bits(st, n);
                void *want = malloc(n * dsize(dt)), *got = malloc(n * dsize(dt));
                for (size_t i = 0; i < n; i++)
                    store_value(want, (cuda_dtype)dt, i, load_value(src, (cuda_dtype)st, i));
                void *ds = upload_at(src, n * dsize(st), off), *dd = upload_at(want, n * dsize(dt), 0);
                CUDA_OK(cudaMemset(dd, 0xff, n * dsize(dt)));
                CUDA_OK(cudaDeviceSynchronize());
                CUDA_OK(cuda_convert(&gpu, dd, (cuda_dtype)dt, ds, (cuda_dtype)st, n));
                download(got, dd, n * dsize(dt));
                EXPECT(!memcmp(got, want, n * dsize(dt)), "gpu convert %s to %s (offset %zu)",
                       dtype_name(st), dtype_name(dt), off);
                release(ds, off);
                release(dd, 0);
                free(src);
                free(want);
                free(got);
            }
}

static void gpu_test_adamw(void)
{
    const size_t n = (1u << 20) + 3;
    float *master = (float *)malloc(n * 4), *m = (float *)malloc(n * 4), *v = (float *)malloc(n * 4);
    float *g32 = (float *)malloc(n * 4), *got = (float *)malloc(n * 4);
    void *grad = malloc(n * 4), *params = malloc(n * 4), *gparams = malloc(n * 4);
    const cuda_adamw s = {7, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f};
    const adamw_consts k = adamw_consts_of(&s);
    for (int gt = 0; gt < 3; gt++)
        for (int pt = -1; pt < 3; pt++)
            for (size_t off = 0; off <= 4; off += 4) {
                fill_random(master, n, -1, 1);
                fill_random(m, n, -0.01f, 0.01f);
                fill_random(v, n, 0, 1e-4f);
                fill_random(g32, n, -2, 2);
                loom_convert(grad, gt, g32, CUDA_DTYPE_F32, n);
                float *dmaster = (float *)upload_at(master, n * 4, off);
                float *dm = (float *)upload_at(m, n * 4, off), *dv = (float *)upload_at(v, n * 4, off);
                const size_t goff = off ? dsize(gt) : 0;
                void *dgrad = upload_at(grad, n * dsize(gt), goff);
                void *dparams = pt >= 0 ? upload_at(params, n * dsize(pt), 0) : NULL;
                CUDA_OK(cuda_adamw_update(&gpu, &s, dmaster, dgrad, (cuda_dtype)gt, dm, dv, n,
                                          dparams, (cuda_dtype)(pt >= 0 ? pt : 0)));
                for (size_t i = 0; i < n; i++) {
                    master[i] = adamw_value(k, load_value(grad, (cuda_dtype)gt, i), &m[i], &v[i],
                                            master[i]);
                    if (pt >= 0)
                        store_value(params, (cuda_dtype)pt, i, master[i]);
                }
                download(got, dmaster, n * 4);
                EXPECT(!memcmp(got, master, n * 4), "gpu adamw master (grad %s, offset %zu)",
                       dtype_name(gt), off);
                download(got, dm, n * 4);
                EXPECT(!memcmp(got, m, n * 4), "gpu adamw m (grad %s)", dtype_name(gt));
                download(got, dv, n * 4);
                EXPECT(!memcmp(got, v, n * 4), "gpu adamw v (grad %s)", dtype_name(gt));
                if (pt >= 0) {
                    download(gparams, dparams, n * dsize(pt));
                    EXPECT(!memcmp(gparams, params, n * dsize(pt)), "gpu adamw params %s",
                           dtype_name(pt));
                    release(dparams, 0);
                }
                release(dmaster, off);
                release(dm, off);
                release(dv, off);
                release(dgrad, goff);
            }
    free(master);
    free(m);
    free(v);
    free(g32);
    free(got);
    free(grad);
    free(params);
    free(gparams);
}

static void gpu_test_accumulate_scale(void)
{
    const size_t n = (1u << 20) + 1;
    float *src = (float *)malloc(n * 4), *start = (float *)malloc(n * 4);
    void *dst = malloc(n * 4), *got = malloc(n * 4);
    for (int t = 0; t < 3; t++)
        for (size_t off = 0; off <= 4; off += 4) {
            fill_random(start, n, -4, 4);
            fill_random(src, n, -1, 1);
            loom_convert(dst, t, start, CUDA_DTYPE_F32, n);
            const size_t doff = off ? dsize(t) : 0;
            void *dd = upload_at(dst, n * dsize(t), doff);
            float *ds = (float *)upload_at(src, n * 4, off);
            CUDA_OK(cuda_accumulate(&gpu, dd, (cuda_dtype)t, ds, n));
            loom_accumulate(dst, t, src, n);
            download(got, dd, n * dsize(t));
            EXPECT(!memcmp(got, dst, n * dsize(t)), "gpu accumulate into %s (offset %zu)",
                   dtype_name(t), off);
            download(got, ds, n * 4);
            EXPECT(!memcmp(got, src, n * 4), "gpu accumulate: src not zeroed");
            release(dd, doff);
            release(ds, off);
        }
    for (size_t off = 0; off <= 4; off += 4) {
        fill_random(src, n, -4, 4);
        float *ds = (float *)upload_at(src, n * 4, off);
        CUDA_OK(cuda_scale(&gpu, ds, 0.375f, n));
        for (size_t i = 0; i < n; i++)
            src[i] *= 0.375f;
        download(got, ds, n * 4);
        EXPECT(!memcmp(got, src, n * 4), "gpu scale (offset %zu)", off);
        release(ds, off);
    }
    free(src);
    free(start);
    free(dst);
    free(got);
}

static void gpu_test_reductions(void)
{
    const size_t sizes[] = {1, 5, 1023, 262147, 10000019};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const size_t n = sizes[si];
        float *f = (float *)malloc(n * 4);
        fill_random(f, n, -3, 3);
        for (size_t i = 0; i < n; i += 3)
            f[i] = ldexpf(f[i], (int)(random_u32() % 12) - 6);
        for (int t = 0; t < 3; t++) {
            void *x = malloc(n * dsize(t));
            loom_convert(x, t, f, CUDA_DTYPE_F32, n);
            double plain = 0;
            for (size_t i = 0; i < n; i++) {
                const double e = load_value(x, (cuda_dtype)t, i);
                plain += e * e;
            }
            const size_t off = dsize(t); /* one element off: the scalar loads */
            void *d0 = upload_at(x, n * dsize(t), 0), *d1 = upload_at(x, n * dsize(t), off);
            double a = 0, b = 0, c = 0, onto = 0.25;
            CUDA_OK(cuda_sum_squares(&gpu, d0, (cuda_dtype)t, n, &a));
            CUDA_OK(cuda_sum_squares(&gpu, d0, (cuda_dtype)t, n, &b));
            CUDA_OK(cuda_sum_squares(&gpu, d1, (cuda_dtype)t, n, &c));
            CUDA_OK(cuda_sum_squares(&gpu, d0, (cuda_dtype)t, n, &onto));
            EXPECT(fabs(a - plain) <= 1e-12 * plain, "gpu sum_squares %s n %zu: %.17g, "
                   "want %.17g", dtype_name(t), n, a, plain);
            EXPECT(!memcmp(&a, &b, 8) && !memcmp(&a, &c, 8),
                   "gpu sum_squares %s n %zu: not the same bits run to run or misaligned",
                   dtype_name(t), n);
            EXPECT(onto == 0.25 + a, "gpu sum_squares %s: not added into *sum", dtype_name(t));
            size_t count = 99;
            CUDA_OK(cuda_count_nonfinite(&gpu, d0, (cuda_dtype)t, n, &count));
            EXPECT(count == 0, "gpu count_nonfinite %s n %zu: %zu, want 0", dtype_name(t), n,
                   count);
            const size_t bad[] = {0, n / 2, n - 1};
            for (int k = 0; k < 3; k++)
                store_value(x, (cuda_dtype)t, bad[k], k == 1 ? -INFINITY : NAN);
            release(d1, off);
            d1 = upload_at(x, n * dsize(t), off);
            const size_t want = n >= 3 ? 3 : n == 1 ? 1 : 2;
            CUDA_OK(cuda_count_nonfinite(&gpu, d1, (cuda_dtype)t, n, &count));
            EXPECT(count == want, "gpu count_nonfinite %s n %zu: %zu, want %zu", dtype_name(t),
                   n, count, want);
            release(d0, 0);
            release(d1, off);
            free(x);
        }
        double sum = 0;
        for (size_t i = 0; i < n; i++)
            sum += f[i];
        float mean = 0;
        float *df = (float *)upload_at(f, n * 4, 4);
        CUDA_OK(cuda_mean(&gpu, df, n, &mean));
        const float want = (float)(sum / (double)n);
        EXPECT(fabsf(mean - want) <= 1e-6f * fmaxf(1, fabsf(want)), "gpu mean n %zu: %.9g, want "
               "%.9g", n, mean, want);
        release(df, 4);
        free(f);
    }
}

static int near(float got, float want, float rel, float abs_tol)
{
    if (isnan(want) || isnan(got))
        return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got))
        return got == want;
    return fabsf(got - want) <= rel * fabsf(want) + abs_tol;
}

/* The fused loss and, cut in two slices, the vocabulary-parallel one,
 * against loom's CPU kernel and the cpu backend's slice loops. */
static void gpu_test_loss_shape(int N, int V, int Vp, size_t off)
{
    const size_t total = (size_t)N * Vp;
    float *logits = (float *)malloc(total * 4), *grad = (float *)malloc(total * 4);
    float *got = (float *)malloc(total * 4), *losses = (float *)malloc(N * 4);
    float *lse = (float *)malloc(N * 4), *dlosses = (float *)malloc(N * 4);
    float *glosses = (float *)malloc(N * 4), *glse = (float *)malloc(N * 4);
    int *targets = (int *)malloc(N * sizeof(int));
    fill_random(logits, total, -8, 8);
    fill_random(dlosses, N, 0.1f, 1);
    for (int n = 0; n < N; n++)
        targets[n] = (int)(random_u32() % V);
    targets[0] = 0;
    targets[N - 1] = V - 1;
    loom_softmax_crossentropy_forward(losses, lse, logits, targets, N, V, Vp);
    float *dx = (float *)upload_at(logits, total * 4, off);
    float *dloss = (float *)upload_at(losses, N * 4, 0), *dlse = (float *)upload_at(lse, N * 4, 0);
    float *ddl = (float *)upload_at(dlosses, N * 4, 0);
    int *dt = (int *)upload_at(targets, N * sizeof(int), 0);
    CUDA_OK(cuda_crossentropy_forward(&gpu, dloss, dlse, dx, dt, N, V, Vp));
    download(glosses, dloss, N * 4);
    download(glse, dlse, N * 4);
    for (int n = 0; n < N; n++) {
        EXPECT(near(glosses[n], losses[n], 1e-5f, 1e-6f), "gpu crossentropy_forward (N %d V %d "
               "Vp %d) loss[%d] %.9g, want %.9g", N, V, Vp, n, glosses[n], losses[n]);
        EXPECT(near(glse[n], lse[n], 1e-5f, 1e-6f), "gpu crossentropy_forward lse[%d] %.9g, "
               "want %.9g", n, glse[n], lse[n]);
    }
    /* backward from the CPU's lse, so that only the gradient's math differs */
    to_device(dlse, lse, N * 4);
    memcpy(grad, logits, total * 4);
    loom_softmax_crossentropy_backward(grad, dlosses, lse, targets, N, V, Vp);
    CUDA_OK(cuda_crossentropy_backward(&gpu, dx, ddl, dlse, dt, N, V, Vp));
    download(got, dx, total * 4);
    for (size_t i = 0; i < total; i++)
        if (!near(got[i], grad[i], 1e-5f, 1e-6f)) {
            EXPECT(0, "gpu crossentropy_backward (N %d V %d Vp %d) [%zu] %.9g, want %.9g", N, V,
                   Vp, i, got[i], grad[i]);
            break;
        }

    /* two slices of W columns */
    const int W = (Vp + 1) / 2;
    float *mx = (float *)malloc(N * 4), *sum = (float *)calloc(N, 4), *tgt = (float *)calloc(N, 4);
    float *slice = (float *)malloc((size_t)N * W * 4), *gs = (float *)malloc((size_t)N * W * 4);
    float *dmx = (float *)upload_at(mx, N * 4, 0), *dsum = (float *)upload_at(sum, N * 4, 0);
    float *dtgt = (float *)upload_at(tgt, N * 4, 0);
    for (int n = 0; n < N; n++)
        mx[n] = -INFINITY;
    for (int s = 0; s < 2; s++) { /* the max, reduced */
        const int v0 = s * W, real = V - v0 < W ? (V - v0 > 0 ? V - v0 : 0) : W;
        for (int n = 0; n < N; n++)
            memcpy(slice + (size_t)n * W, logits + (size_t)n * Vp + v0,
                   (size_t)(Vp - v0 < W ? Vp - v0 : W) * 4);
        float *ds = (float *)upload_at(slice, (size_t)N * W * 4, off);
        CUDA_OK(cuda_crossentropy_slice_max(&gpu, dmx, ds, N, W, real));
        download(gs, dmx, N * 4);
        for (int n = 0; n < N; n++) {
            float best = -INFINITY;
            for (int i = 0; i < real; i++)
                best = loss_take_max(best, slice[(size_t)n * W + i]);
            EXPECT(bits_of(gs[n]) == bits_of(best), "gpu slice_max row %d: %.9g, want %.9g", n,
                   gs[n], best);
            mx[n] = loss_take_max(mx[n], best);
        }
        release(ds, off);
    }
    to_device(dmx, mx, N * 4);
    for (int s = 0; s < 2; s++) { /* the sums and the target's logit, reduced */
        const int v0 = s * W, real = V - v0 < W ? (V - v0 > 0 ? V - v0 : 0) : W;
        for (int n = 0; n < N; n++)
            memcpy(slice + (size_t)n * W, logits + (size_t)n * Vp + v0,
                   (size_t)(Vp - v0 < W ? Vp - v0 : W) * 4);
        float *ds = (float *)upload_at(slice, (size_t)N * W * 4, off);
        CUDA_OK(cuda_crossentropy_slice_sums(&gpu, dsum, dtgt, ds, dmx, dt, v0, N, W, real));
        download(gs, dsum, N * 4);
        download(got, dtgt, N * 4);
        for (int n = 0; n < N; n++) {
            double e = 0;
            for (int i = 0; i < real; i++)
                e += expf(slice[(size_t)n * W + i] - mx[n]);
            const int t = targets[n] - v0;
            const float want_t = t >= 0 && t < real ? slice[(size_t)n * W + t] : 0.0f;
            EXPECT(near(gs[n], (float)e, 1e-6f, 0), "gpu slice_sums row %d: %.9g, want %.9g", n,
                   gs[n], (float)e);
            EXPECT(bits_of(got[n]) == bits_of(want_t), "gpu slice_sums target row %d", n);
            sum[n] += gs[n];
            tgt[n] += got[n];
        }
        release(ds, off);
    }
    to_device(dsum, sum, N * 4);
    to_device(dtgt, tgt, N * 4);
    CUDA_OK(cuda_crossentropy_slice_finish(&gpu, dlse, dloss, dmx, dsum, dtgt, N));
    download(glse, dlse, N * 4);
    download(glosses, dloss, N * 4);
    for (int n = 0; n < N; n++) {
        EXPECT(near(glse[n], lse[n], 1e-5f, 1e-6f), "gpu slice_finish lse[%d] %.9g, want the "
               "fused %.9g", n, glse[n], lse[n]);
        EXPECT(near(glosses[n], losses[n], 1e-5f, 1e-5f), "gpu slice_finish loss[%d] %.9g, want "
               "the fused %.9g", n, glosses[n], losses[n]);
    }
    for (int s = 0; s < 2; s++) {
        const int v0 = s * W, real = V - v0 < W ? (V - v0 > 0 ? V - v0 : 0) : W;
        for (int n = 0; n < N; n++)
            memcpy(slice + (size_t)n * W, logits + (size_t)n * Vp + v0,
                   (size_t)(Vp - v0 < W ? Vp - v0 : W) * 4);
        float *ds = (float *)upload_at(slice, (size_t)N * W * 4, off);
        CUDA_OK(cuda_crossentropy_slice_backward(&gpu, ds, ddl, dlse, dt, v0, N, W, real));
        download(gs, ds, (size_t)N * W * 4);
        int reported = 0;
        for (int n = 0; n < N && !reported; n++)
            for (int i = 0; i < W && !reported; i++) {
                const float x = slice[(size_t)n * W + i];
                float want = i < real ? expf(x - glse[n]) * dlosses[n] : 0.0f;
                if (i == targets[n] - v0 && i < real)
                    want -= dlosses[n];
                if (!near(gs[(size_t)n * W + i], want, 1e-5f, 1e-6f)) {
                    EXPECT(0, "gpu slice_backward (v0 %d) [%d][%d] %.9g, want %.9g", v0, n, i,
                           gs[(size_t)n * W + i], want);
                    reported = 1;
                }
            }
        release(ds, off);
    }
    release(dx, off);
    release(dloss, 0);
    release(dlse, 0);
    release(ddl, 0);
    release(dt, 0);
    release(dmx, 0);
    release(dsum, 0);
    release(dtgt, 0);
    free(logits);
    free(grad);
    free(got);
    free(losses);
    free(lse);
    free(dlosses);
    free(glosses);
    free(glse);
    free(targets);
    free(mx);
    free(sum);
    free(tgt);
    free(slice);
    free(gs);
}

/* Milliseconds per call of the two big kernels at GPT-2 124M's sizes. */
static void gpu_timings(void)
{
    cudaEvent_t a, b;
    CUDA_OK(cudaEventCreate(&a));
    CUDA_OK(cudaEventCreate(&b));
    const size_t n = 124475904;
    float *p = NULL;
    CUDA_OK(cudaMalloc((void **)&p, n * 4 * 4 + n * 2));
    CUDA_OK(cudaMemset(p, 0, n * 4 * 4 + n * 2));
    const cuda_adamw s = {1, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f};
    float ms = 0;
    CUDA_OK(cudaEventRecord(a, gpu.stream));
    for (int r = 0; r < 5; r++)
        CUDA_OK(cuda_adamw_update(&gpu, &s, p, p + n, CUDA_DTYPE_F32, p + 2 * n, p + 3 * n, n,
                                  p + 4 * n, CUDA_DTYPE_BF16));
    CUDA_OK(cudaEventRecord(b, gpu.stream));
    CUDA_OK(cudaEventSynchronize(b));
    CUDA_OK(cudaEventElapsedTime(&ms, a, b));
    printf("gpu adamw, %zu f32 gradients, bf16 params: %.3f ms (%.0f GB/s)\n", n, ms / 5,
           n * 26.0 / (ms / 5 * 1e6));
    double norm = 0;
    CUDA_OK(cudaEventRecord(a, gpu.stream));
    CUDA_OK(cuda_sum_squares(&gpu, p, CUDA_DTYPE_F32, n, &norm));
    CUDA_OK(cudaEventRecord(b, gpu.stream));
    CUDA_OK(cudaEventSynchronize(b));
    CUDA_OK(cudaEventElapsedTime(&ms, a, b));
    printf("gpu sum_squares, %zu f32: %.3f ms\n", n, ms);
    CUDA_OK(cudaFree(p));
    const int N = 8192, V = 50257, Vp = 50304;
    float *logits = NULL, *rows = NULL;
    int *targets = NULL;
    CUDA_OK(cudaMalloc((void **)&logits, (size_t)N * Vp * 4));
    CUDA_OK(cudaMalloc((void **)&rows, (size_t)N * 3 * 4));
    CUDA_OK(cudaMalloc((void **)&targets, (size_t)N * 4));
    CUDA_OK(cudaMemset(logits, 0, (size_t)N * Vp * 4));
    CUDA_OK(cudaMemset(rows, 0, (size_t)N * 3 * 4));
    CUDA_OK(cudaMemset(targets, 0, (size_t)N * 4));
    CUDA_OK(cuda_crossentropy_forward(&gpu, rows, rows + N, logits, targets, N, V, Vp)); /* warm */
    CUDA_OK(cudaEventRecord(a, gpu.stream));
    for (int r = 0; r < 3; r++)
        CUDA_OK(cuda_crossentropy_forward(&gpu, rows, rows + N, logits, targets, N, V, Vp));
    CUDA_OK(cudaEventRecord(b, gpu.stream));
    CUDA_OK(cudaEventSynchronize(b));
    CUDA_OK(cudaEventElapsedTime(&ms, a, b));
    printf("gpu crossentropy_forward, %d x %d: %.3f ms\n", N, Vp, ms / 3);
    CUDA_OK(cudaEventRecord(a, gpu.stream));
    for (int r = 0; r < 3; r++)
        CUDA_OK(cuda_crossentropy_backward(&gpu, logits, rows + 2 * N, rows + N, targets, N, V,
                                           Vp));
    CUDA_OK(cudaEventRecord(b, gpu.stream));
    CUDA_OK(cudaEventSynchronize(b));
    CUDA_OK(cudaEventElapsedTime(&ms, a, b));
    printf("gpu crossentropy_backward, %d x %d: %.3f ms\n", N, Vp, ms / 3);
    CUDA_OK(cudaFree(logits));
    CUDA_OK(cudaFree(rows));
    CUDA_OK(cudaFree(targets));
    CUDA_OK(cudaEventDestroy(a));
    CUDA_OK(cudaEventDestroy(b));
}

static void test_on_gpu(void)
{
    int count = 0;
    const cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess || count == 0) {
        printf("the launchers on a GPU: skipped (no device visible: %s)\n",
               rc != cudaSuccess ? cudaGetErrorString(rc) : "none");
        return;
    }
    CUDA_OK(cudaSetDevice(0));
    /* a blocking stream: ordered with the plain copies and memsets above */
    CUDA_OK(cudaStreamCreate(&gpu.stream));
    gpu.scratch_bytes = (size_t)64 << 20;
    CUDA_OK(cudaMalloc(&gpu.scratch, gpu.scratch_bytes));
    CUDA_OK(cudaMallocHost(&gpu.host_scratch, 4096));
    CUDA_OK(cudaDeviceGetAttribute(&gpu.sm_count, cudaDevAttrMultiProcessorCount, 0));
    gpu.deterministic = 1;
    gpu_test_convert();
    gpu_test_adamw();
    gpu_test_accumulate_scale();
    gpu_test_reductions();
    gpu_test_loss_shape(37, 50257, 50304, 0);
    gpu_test_loss_shape(37, 50257, 50304, 4); /* misaligned rows: the scalar paths */
    gpu_test_loss_shape(4099, 11, 12, 0);
    gpu_test_loss_shape(7, 11, 13, 0);
    gpu_test_loss_shape(5, 1, 1, 0);
    CUDA_OK(cudaStreamSynchronize(gpu.stream));
    if (!failures)
        gpu_timings();
    printf("the launchers on a GPU: done\n");
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
    test_on_gpu();
    if (failures) {
        fprintf(stderr, "cuda_math_host_test: %d failures\n", failures);
        return 1;
    }
    printf("cuda_math_host_test: all passed\n");
    return 0;
}
