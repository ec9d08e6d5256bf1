/* compute-cuda's optimizer, norm and conversion kernels: AdamW with master
 * weights, the reductions the host reads back (the loss mean, the sum of
 * squares and the count of non-finite values), scale, convert and
 * accumulate.
 *
 * They give the cpu backend's bits wherever its order of operations can be
 * kept: the per-element math below is written once for the host and the
 * device, with every rounding explicit on the device (__fmul_rn and kin,
 * which nvcc never contracts into an FMA, as core's -ffp-contract=off does
 * not on the CPU), and the conversions are tensor.h's bit for bit. The
 * reductions cannot keep the CPU's sequential order; they are summed in
 * double in an order that depends on n alone (a grid fixed by n, each
 * thread's elements in index order, fixed trees), so a buffer gives the
 * same bits on every run and every device. No atomics anywhere.
 *
 * These functions assume IEEE f32 on the device: the plugin must not be
 * built with --use_fast_math or -ftz=true (subnormal gradients and
 * moments would flush to zero where the CPU keeps them). */
#include <math.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#include "cuda_kernels.h"
#include "launch.cuh"

/* ---- per-element math, on the host and the device ---- */

static __host__ __device__ inline uint32_t bits_of(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

static __host__ __device__ inline float float_of(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* One rounding each, never fused with a neighbour. */
static __host__ __device__ inline float mul_rn(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

static __host__ __device__ inline float add_rn(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

static __host__ __device__ inline float sub_rn(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

static __host__ __device__ inline float div_rn(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

static __host__ __device__ inline float sqrt_rn(float a)
{
#ifdef __CUDA_ARCH__
    return __fsqrt_rn(a);
#else
    return sqrtf(a);
#endif
}

/* bf16 <-> f32 as tensor.h's loom_bf16_to_f32 / loom_f32_to_bf16: round
 * to nearest even; a NaN keeps its sign and top payload, quieted. */
static __host__ __device__ inline float optim_bf16_to_f32(uint16_t h)
{
    return float_of((uint32_t)h << 16);
}

static __host__ __device__ inline uint16_t optim_f32_to_bf16(float f)
{
    const uint32_t u = bits_of(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* IEEE half <-> f32 as tensor.h's loom_f16_to_f32 / loom_f32_to_f16:
 * subnormals kept, overflow to infinity, round to nearest even; a half NaN
 * widens with its payload, an f32 NaN narrows to the quiet NaN 0x7e00 with
 * its sign. The hardware's conversions are not used: their NaNs differ. */
static __host__ __device__ inline float optim_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise (at most 10 shifts) */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ffu;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    return float_of(u);
}

static __host__ __device__ inline uint16_t optim_f32_to_f16(float f)
{
    const uint32_t u = bits_of(f);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u);
    if (abs >= 0x477ff000u) /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) { /* below the smallest normal half */
        if (abs < 0x33000000u) /* below half the smallest subnormal */
            return (uint16_t)sign;
        const uint32_t exp = abs >> 23; /* 102 .. 112 */
        const uint32_t man = (abs & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - exp; /* 14 .. 24: a half subnormal keeps man >> shift */
        uint32_t half = man >> shift;
        const uint32_t rem = man & ((1u << shift) - 1u);
        const uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u)))
            half++;
        return (uint16_t)(sign | half);
    }
    const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
    return (uint16_t)(sign | ((rounded - 0x38000000u) >> 13));
}

/* Element i of a buffer of dtype t as f32, and the way back. */
static __host__ __device__ inline float load_value(const void *p, cuda_dtype t, size_t i)
{
    if (t == CUDA_DTYPE_BF16)
        return optim_bf16_to_f32(((const uint16_t *)p)[i]);
    if (t == CUDA_DTYPE_F16)
        return optim_f16_to_f32(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

static __host__ __device__ inline void store_value(void *p, cuda_dtype t, size_t i, float x)
{
    if (t == CUDA_DTYPE_BF16)
        ((uint16_t *)p)[i] = optim_f32_to_bf16(x);
    else if (t == CUDA_DTYPE_F16)
        ((uint16_t *)p)[i] = optim_f32_to_f16(x);
    else
        ((float *)p)[i] = x;
}

/* 1 when the f32 value of an element of dtype t, given by its bits (the
 * low 16 for bf16 and f16), is an infinity or a NaN: the exponent all
 * ones. The same answer as isfinite() on the widened value, under any
 * math flags. */
static __host__ __device__ inline int nonfinite_bits(uint32_t bits, cuda_dtype t)
{
    if (t == CUDA_DTYPE_BF16)
        return (bits & 0x7f80u) == 0x7f80u;
    if (t == CUDA_DTYPE_F16)
        return (bits & 0x7c00u) == 0x7c00u;
    return (bits & 0x7f800000u) == 0x7f800000u;
}

/* One step's constants, computed on the host as optimizer.c's adamw()
 * computes them (powf of the step in float), so every element gets the
 * same bias corrections as on the CPU. */
typedef struct adamw_consts {
    float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, bias1, bias2, eps, weight_decay;
    float grad_scale;
} adamw_consts;

static adamw_consts adamw_consts_of(const cuda_adamw *s)
{
    adamw_consts k;
    k.lr = s->lr;
    k.beta1 = s->beta1;
    k.beta2 = s->beta2;
    k.one_minus_beta1 = 1.0f - s->beta1;
    k.one_minus_beta2 = 1.0f - s->beta2;
    k.bias1 = 1.0f - powf(s->beta1, (float)s->step);
    k.bias2 = 1.0f - powf(s->beta2, (float)s->step);
    k.eps = s->eps;
    k.weight_decay = s->weight_decay;
    k.grad_scale = s->grad_scale;
    return k;
}

/* llm.c's AdamW of one element, in optimizer.c's order of operations:
 * updates *m and *v and returns the new master weight. */
static __host__ __device__ inline float adamw_value(const adamw_consts &k, float grad, float *m,
                                                    float *v, float master)
{
    const float g = mul_rn(grad, k.grad_scale);
    const float mi = add_rn(mul_rn(k.beta1, *m), mul_rn(k.one_minus_beta1, g));
    const float vi = add_rn(mul_rn(k.beta2, *v), mul_rn(mul_rn(k.one_minus_beta2, g), g));
    const float m_hat = div_rn(mi, k.bias1);
    const float v_hat = div_rn(vi, k.bias2);
    *m = mi;
    *v = vi;
    const float step = add_rn(div_rn(m_hat, add_rn(sqrt_rn(v_hat), k.eps)),
                              mul_rn(k.weight_decay, master));
    return sub_rn(master, mul_rn(k.lr, step));
}

/* ---- groups of four elements ---- */

/* The element-wise kernels and the reductions take elements in units of
 * four: unit u is elements 4u .. 4u + 3 (fewer at the end), read with one
 * 16-byte (f32) or 8-byte (bf16, f16) load when the launcher found every
 * buffer aligned, else one by one: the same values and the same order
 * either way. */
enum { UNIT = 4 };

static __host__ __device__ inline size_t units_of(size_t n) { return (n + UNIT - 1) / UNIT; }

static __host__ inline int aligned_for(const void *p, cuda_dtype t)
{
    const uintptr_t need = t == CUDA_DTYPE_F32 ? 16 : 8;
    return p == NULL || (uintptr_t)p % need == 0;
}

static __host__ __device__ inline int dtype_ok(cuda_dtype t)
{
    return t == CUDA_DTYPE_F32 || t == CUDA_DTYPE_BF16 || t == CUDA_DTYPE_F16;
}

static __device__ inline uint16_t low_half(uint32_t w) { return (uint16_t)(w & 0xffffu); }
static __device__ inline uint16_t high_half(uint32_t w) { return (uint16_t)(w >> 16); }

/* The elements of unit u (at most four, fewer past n) into e as f32;
 * returns how many. */
static __device__ inline int load_unit(const void *p, cuda_dtype t, size_t u, size_t n, int vec,
                                       float e[UNIT])
{
    const size_t i = u * UNIT;
    if (vec && i + UNIT <= n) {
        if (t == CUDA_DTYPE_F32) {
            const float4 q = ((const float4 *)p)[u];
            e[0] = q.x;
            e[1] = q.y;
            e[2] = q.z;
            e[3] = q.w;
        } else {
            const uint2 q = ((const uint2 *)p)[u]; /* little-endian: element 4u in q.x's low half */
            const uint16_t h[UNIT] = {low_half(q.x), high_half(q.x), low_half(q.y),
                                      high_half(q.y)};
            for (int l = 0; l < UNIT; l++)
                e[l] = t == CUDA_DTYPE_BF16 ? optim_bf16_to_f32(h[l]) : optim_f16_to_f32(h[l]);
        }
        return UNIT;
    }
#pragma unroll
    for (int l = 0; l < UNIT; l++)
        if (i + l < n)
            e[l] = load_value(p, t, i + l);
    return n - i < UNIT ? (int)(n - i) : UNIT;
}

/* The k elements of e into unit u of p, as dtype t. */
static __device__ inline void store_unit(void *p, cuda_dtype t, size_t u, int k, int vec,
                                         const float e[UNIT])
{
    const size_t i = u * UNIT;
    if (vec && k == UNIT) {
        if (t == CUDA_DTYPE_F32) {
            ((float4 *)p)[u] = make_float4(e[0], e[1], e[2], e[3]);
        } else {
            uint32_t h[UNIT];
            for (int l = 0; l < UNIT; l++)
                h[l] = t == CUDA_DTYPE_BF16 ? optim_f32_to_bf16(e[l]) : optim_f32_to_f16(e[l]);
            ((uint2 *)p)[u] = make_uint2(h[0] | (h[1] << 16), h[2] | (h[3] << 16));
        }
        return;
    }
#pragma unroll
    for (int l = 0; l < UNIT; l++)
        if (l < k)
            store_value(p, t, i + l, e[l]);
}

/* The element-wise kernels' grid: enough blocks to fill the device a few
 * times over, each thread looping over units (any split gives the same
 * bits: no element depends on another). */
enum { ELEMENTWISE_THREADS = 256 };

static unsigned elementwise_blocks(const cuda_ctx *x, size_t units)
{
    const size_t want = (units + ELEMENTWISE_THREADS - 1) / ELEMENTWISE_THREADS;
    const size_t cap = (size_t)(x->sm_count > 0 ? x->sm_count : 1) * 32;
    return (unsigned)(want < cap ? want : cap);
}

#define FOR_EACH_UNIT(u, units)                                                                    \
    for (size_t u = (size_t)blockIdx.x * blockDim.x + threadIdx.x; u < (units);                    \
         u += (size_t)gridDim.x * blockDim.x)

/* ---- AdamW ---- */

__global__ void __launch_bounds__(ELEMENTWISE_THREADS)
    adamw_kernel(adamw_consts k, float *master, const void *grad, cuda_dtype grad_dtype,
                 float *m, float *v, size_t n, void *params, cuda_dtype params_dtype, int vec)
{
    FOR_EACH_UNIT(u, units_of(n)) {
        float g[UNIT], w[UNIT], mu[UNIT], nu[UNIT];
        const int cnt = load_unit(grad, grad_dtype, u, n, vec, g);
        load_unit(master, CUDA_DTYPE_F32, u, n, vec, w);
        load_unit(m, CUDA_DTYPE_F32, u, n, vec, mu);
        load_unit(v, CUDA_DTYPE_F32, u, n, vec, nu);
#pragma unroll
        for (int l = 0; l < UNIT; l++)
            if (l < cnt)
                w[l] = adamw_value(k, g[l], &mu[l], &nu[l], w[l]);
        store_unit(m, CUDA_DTYPE_F32, u, cnt, vec, mu);
        store_unit(v, CUDA_DTYPE_F32, u, cnt, vec, nu);
        store_unit(master, CUDA_DTYPE_F32, u, cnt, vec, w);
        if (params)
            store_unit(params, params_dtype, u, cnt, vec, w);
    }
}

extern "C" cudaError_t cuda_adamw_update(const cuda_ctx *x, const cuda_adamw *step, float *master,
                                         const void *grad, cuda_dtype grad_dtype, float *m,
                                         float *v, size_t n, void *params, cuda_dtype params_dtype)
{
    if (!n)
        return cudaSuccess;
    if (!step || !master || !grad || !m || !v || !dtype_ok(grad_dtype) ||
        (params && !dtype_ok(params_dtype)))
        return cudaErrorInvalidValue;
    if (params == (void *)master) /* the master weights are the parameters: nothing to store */
        params = NULL;
    const int vec = aligned_for(master, CUDA_DTYPE_F32) && aligned_for(m, CUDA_DTYPE_F32) &&
                    aligned_for(v, CUDA_DTYPE_F32) && aligned_for(grad, grad_dtype) &&
                    aligned_for(params, params_dtype);
    const size_t units = units_of(n);
    LOOM_CUDA_LAUNCH(adamw_kernel, elementwise_blocks(x, units), ELEMENTWISE_THREADS, 0, x->stream,
                     adamw_consts_of(step), master, grad, grad_dtype, m, v, n, params, params_dtype,
                     vec);
    return cudaGetLastError();
}

/* ---- scale, convert, accumulate ---- */

__global__ void __launch_bounds__(ELEMENTWISE_THREADS)
    scale_kernel(float *xs, float s, size_t n, int vec)
{
    FOR_EACH_UNIT(u, units_of(n)) {
        float e[UNIT];
        const int cnt = load_unit(xs, CUDA_DTYPE_F32, u, n, vec, e);
#pragma unroll
        for (int l = 0; l < UNIT; l++)
            if (l < cnt)
                e[l] = mul_rn(e[l], s);
        store_unit(xs, CUDA_DTYPE_F32, u, cnt, vec, e);
    }
}

extern "C" cudaError_t cuda_scale(const cuda_ctx *x, float *xs, float s, size_t n)
{
    if (!n)
        return cudaSuccess;
    if (!xs)
        return cudaErrorInvalidValue;
    const size_t units = units_of(n);
    LOOM_CUDA_LAUNCH(scale_kernel, elementwise_blocks(x, units), ELEMENTWISE_THREADS, 0, x->stream,
                     xs, s, n, aligned_for(xs, CUDA_DTYPE_F32));
    return cudaGetLastError();
}

/* Every pair of f32, bf16 and f16 through f32, which holds every bf16 and
 * f16 exactly (bf16 <-> f16 as loom_convert does it). */
__global__ void __launch_bounds__(ELEMENTWISE_THREADS)
    convert_kernel(void *dst, cuda_dtype dst_type, const void *src, cuda_dtype src_type,
                   size_t n, int vec)
{
    FOR_EACH_UNIT(u, units_of(n)) {
        float e[UNIT];
        const int cnt = load_unit(src, src_type, u, n, vec, e);
        store_unit(dst, dst_type, u, cnt, vec, e);
    }
}

static size_t dtype_bytes(cuda_dtype t) { return t == CUDA_DTYPE_F32 ? 4 : 2; }

static int overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes)
{
    const uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return pa < pb + b_bytes && pb < pa + a_bytes;
}

extern "C" cudaError_t cuda_convert(const cuda_ctx *x, void *dst, cuda_dtype dst_type,
                                    const void *src, cuda_dtype src_type, size_t n)
{
    if (!n)
        return cudaSuccess;
    if (!dst || !src || !dtype_ok(dst_type) || !dtype_ok(src_type))
        return cudaErrorInvalidValue;
    const size_t dst_bytes = n * dtype_bytes(dst_type), src_bytes = n * dtype_bytes(src_type);
    if (dst_type == src_type && dst == src)
        return cudaSuccess;
    /* The threads run in no order, so a conversion onto its own source
     * (which no caller makes) would read elements already overwritten:
     * refused rather than wrong. */
    if (overlap(dst, dst_bytes, src, src_bytes))
        return cudaErrorInvalidValue;
    if (dst_type == src_type)
        return cudaMemcpyAsync(dst, src, dst_bytes, cudaMemcpyDeviceToDevice, x->stream);
    const int vec = aligned_for(dst, dst_type) && aligned_for(src, src_type);
    const size_t units = units_of(n);
    LOOM_CUDA_LAUNCH(convert_kernel, elementwise_blocks(x, units), ELEMENTWISE_THREADS, 0,
                     x->stream, dst, dst_type, src, src_type, n, vec);
    return cudaGetLastError();
}

/* dst += src rounded once to dst's type (a 16-bit dst widened exactly
 * first, as loom_accumulate's f32 round trip does), then src = 0. */
__global__ void __launch_bounds__(ELEMENTWISE_THREADS)
    accumulate_kernel(void *dst, cuda_dtype dst_type, float *src, size_t n, int vec)
{
    FOR_EACH_UNIT(u, units_of(n)) {
        float d[UNIT], s[UNIT];
        const int cnt = load_unit(dst, dst_type, u, n, vec, d);
        load_unit(src, CUDA_DTYPE_F32, u, n, vec, s);
#pragma unroll
        for (int l = 0; l < UNIT; l++)
            if (l < cnt) {
                d[l] = add_rn(d[l], s[l]);
                s[l] = 0.0f;
            }
        store_unit(dst, dst_type, u, cnt, vec, d);
        store_unit(src, CUDA_DTYPE_F32, u, cnt, vec, s);
    }
}

extern "C" cudaError_t cuda_accumulate(const cuda_ctx *x, void *dst, cuda_dtype dst_type,
                                       float *src, size_t n)
{
    if (!n)
        return cudaSuccess;
    if (!dst || !src || !dtype_ok(dst_type))
        return cudaErrorInvalidValue;
    const int vec = aligned_for(dst, dst_type) && aligned_for(src, CUDA_DTYPE_F32);
    const size_t units = units_of(n);
    LOOM_CUDA_LAUNCH(accumulate_kernel, elementwise_blocks(x, units), ELEMENTWISE_THREADS, 0,
                     x->stream, dst, dst_type, src, n, vec);
    return cudaGetLastError();
}

/* ---- reductions read back by the host ---- */

/* Two passes: REDUCE_BLOCKS at most, their number a function of n alone,
 * each writes its threads' sum (fixed tree) into ctx->scratch; then one
 * block adds those partials in a fixed tree. Thread t of the first pass
 * takes units t, t + stride, ... in order. */
enum { REDUCE_THREADS = 256, REDUCE_BLOCKS = 1024, FINAL_THREADS = 1024 };

static unsigned reduce_blocks(size_t n)
{
    const size_t want = (units_of(n) + REDUCE_THREADS - 1) / REDUCE_THREADS;
    return (unsigned)(want < (size_t)REDUCE_BLOCKS ? want : (size_t)REDUCE_BLOCKS);
}

/* The sum over the block's threads, in the same tree every time; every
 * thread of the block must call it (it synchronises the block), and the
 * block's size must be a multiple of 32. Thread 0 gets the sum. */
template <typename T> static __device__ T optim_block_sum(T value)
{
    __shared__ T warp_sums[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int offset = 16; offset > 0; offset >>= 1)
        value += __shfl_down_sync(0xffffffffu, value, offset);
    if (lane == 0)
        warp_sums[warp] = value;
    __syncthreads();
    if (warp == 0) {
        value = lane < (int)(blockDim.x >> 5) ? warp_sums[lane] : T(0);
        for (int offset = 16; offset > 0; offset >>= 1)
            value += __shfl_down_sync(0xffffffffu, value, offset);
    }
    return value;
}

/* What each element adds to its reduction. */
enum reduce_term { TERM_VALUE, TERM_SQUARE, TERM_NONFINITE };

template <typename T, reduce_term term> static __device__ inline T term_of(float e)
{
    if (term == TERM_NONFINITE)
        return (T)nonfinite_bits(bits_of(e), CUDA_DTYPE_F32);
    const double d = e;
    return (T)(term == TERM_SQUARE ? d * d : d); /* a float's square is exact in double */
}

template <typename T, reduce_term term>
__global__ void __launch_bounds__(REDUCE_THREADS)
    reduce_partials_kernel(T *partials, const void *xs, cuda_dtype dtype, size_t n, int vec)
{
    T sum = T(0);
    FOR_EACH_UNIT(u, units_of(n)) {
        float e[UNIT];
        const int cnt = load_unit(xs, dtype, u, n, vec, e);
#pragma unroll
        for (int l = 0; l < UNIT; l++)
            if (l < cnt)
                sum += term_of<T, term>(e[l]);
    }
    sum = optim_block_sum(sum);
    if (threadIdx.x == 0)
        partials[blockIdx.x] = sum;
}

template <typename T>
__global__ void __launch_bounds__(FINAL_THREADS)
    reduce_final_kernel(T *total, const T *partials, unsigned count)
{
    T sum = threadIdx.x < count ? partials[threadIdx.x] : T(0);
    sum = optim_block_sum(sum);
    if (threadIdx.x == 0)
        *total = sum;
}

/* Waits for the stream, polling, at most this long: a kernel that never
 * ends shows as an error, not a hang. */
#define REDUCE_WAIT_S 600.0

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static cudaError_t wait_stream(const cuda_ctx *x)
{
    const double start = seconds_now();
    for (long polls = 0;; polls++) {
        const cudaError_t rc = cudaStreamQuery(x->stream);
        if (rc != cudaErrorNotReady)
            return rc;
        if (seconds_now() - start > REDUCE_WAIT_S)
            return cudaErrorTimeout;
        if (polls > 1000) { /* past the first millisecond or so: sleep between polls */
            const struct timespec pause = {0, 50 * 1000};
            nanosleep(&pause, NULL);
        }
    }
}

/* The reduction of n elements of xs into *out (host), its sum of T. */
template <typename T, reduce_term term>
static cudaError_t reduce_to_host(const cuda_ctx *x, const void *xs, cuda_dtype dtype, size_t n,
                                  T *out)
{
    if (!x->scratch || x->scratch_bytes < (REDUCE_BLOCKS + 1) * sizeof(T) || !x->host_scratch)
        return cudaErrorInvalidValue;
    T *partials = (T *)x->scratch, *total = partials + REDUCE_BLOCKS;
    const unsigned blocks = reduce_blocks(n);
    const int vec = aligned_for(xs, dtype);
    void (*const partials_kernel)(T *, const void *, cuda_dtype, size_t, int) =
        reduce_partials_kernel<T, term>;
    LOOM_CUDA_LAUNCH(partials_kernel, blocks, REDUCE_THREADS, 0, x->stream, partials, xs, dtype, n,
                     vec);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess)
        return rc;
    LOOM_CUDA_LAUNCH(reduce_final_kernel<T>, 1, FINAL_THREADS, 0, x->stream, total, partials,
                     blocks);
    if ((rc = cudaGetLastError()) != cudaSuccess)
        return rc;
    rc = cudaMemcpyAsync(x->host_scratch, total, sizeof(T), cudaMemcpyDeviceToHost, x->stream);
    if (rc != cudaSuccess || (rc = wait_stream(x)) != cudaSuccess)
        return rc;
    memcpy(out, x->host_scratch, sizeof(T));
    return cudaSuccess;
}

extern "C" cudaError_t cuda_mean(const cuda_ctx *x, const float *xs, size_t n, float *mean)
{
    if (!mean || (n && !xs))
        return cudaErrorInvalidValue;
    double sum = 0;
    if (n) {
        const cudaError_t rc = reduce_to_host<double, TERM_VALUE>(x, xs, CUDA_DTYPE_F32, n, &sum);
        if (rc != cudaSuccess)
            return rc;
    }
    *mean = (float)(sum / (double)n); /* n = 0: NaN, as on the CPU */
    return cudaSuccess;
}

extern "C" cudaError_t cuda_sum_squares(const cuda_ctx *x, const void *xs, cuda_dtype dtype,
                                        size_t n, double *sum)
{
    if (!sum || !dtype_ok(dtype) || (n && !xs))
        return cudaErrorInvalidValue;
    double squares = 0;
    if (n) {
        const cudaError_t rc = reduce_to_host<double, TERM_SQUARE>(x, xs, dtype, n, &squares);
        if (rc != cudaSuccess)
            return rc;
    }
    *sum += squares;
    return cudaSuccess;
}

extern "C" cudaError_t cuda_count_nonfinite(const cuda_ctx *x, const void *xs, cuda_dtype dtype,
                                            size_t n, size_t *count)
{
    if (!count || !dtype_ok(dtype) || (n && !xs))
        return cudaErrorInvalidValue;
    unsigned long long bad = 0;
    if (n) {
        const cudaError_t rc =
            reduce_to_host<unsigned long long, TERM_NONFINITE>(x, xs, dtype, n, &bad);
        if (rc != cudaSuccess)
            return rc;
    }
    *count = (size_t)bad;
    return cudaSuccess;
}
