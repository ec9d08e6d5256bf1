/* compute-cuda's loss kernels: the fused softmax and cross-entropy over
 * the whole vocabulary, and the vocabulary-parallel loss in the parts
 * between its reductions over the tensor group (slice max, slice sums,
 * finish, slice backward). The loss mean is with the other reductions the
 * host reads back, in kernels_optim.cu.
 *
 * One block per row (a row is a token's logits: 50304 floats in GPT-2,
 * 200 KB, read twice from L2 in the forward). Each thread takes the row's
 * elements (or groups of four, with one 16-byte load when the rows are
 * aligned) at a stride of the block, and the block combines the threads'
 * values in a fixed tree: deterministic, no atomics. The sums of
 * exponentials are f32 in the fused loss (as the CPU's lanes are) and
 * double in the slices (as the cpu backend's slice sums are); exp and log
 * are CUDA's expf and logf (within 2 ulp of glibc's), so the values agree
 * with the CPU's within rounding, not bit for bit.
 *
 * A target outside [0, V) (outside the slice for the slice kernels) reads
 * nothing: its row's loss is NaN in the fused forward, so that a bad
 * token shows in the loss, and no element of the row gets the one-hot's
 * -1 in backward. */
#include <math.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "cuda_kernels.h"
#include "launch.cuh"

enum { LOSS_THREADS = 512, FINISH_THREADS = 256 };

/* ---- per-element math, on the host and the device ---- */

/* The larger of best and x the way the CPU's max loops take it (x > best
 * ? x : best): a NaN is never taken, so the max is exact in any order. */
static __host__ __device__ inline float loss_take_max(float best, float x)
{
    return x > best ? x : best;
}

/* One logit's gradient in the fused backward, x its logit, i its column:
 * (p - [i = target])·dloss with p = exp(x - lse), rounded once like the
 * CPU's (p_target - 1)·d; 0 in the padding [V, Vp). */
static __host__ __device__ inline float loss_grad_value(float x, int i, int V, int target,
                                                        float lse, float dloss)
{
    if (i >= V)
        return 0.0f;
    const float p = expf(x - lse);
    return i == target ? (p - 1.0f) * dloss : p * dloss;
}

/* The slice backward's gradient of column i (of the slice) as the cpu
 * backend computes it: exp(x - lse)·d, then minus d at the target (two
 * roundings, not one FMA); 0 past real. */
static __host__ __device__ inline float loss_slice_grad_value(float x, int i, int real, int target,
                                                              float lse, float dloss)
{
    if (i >= real)
        return 0.0f;
#ifdef __CUDA_ARCH__
    const float g = __fmul_rn(expf(x - lse), dloss);
    return i == target ? __fsub_rn(g, dloss) : g;
#else
    const float g = expf(x - lse) * dloss;
    return i == target ? g - dloss : g;
#endif
}

/* The fused forward's loss from the row's max, sum of exponentials and
 * target logit: llm.c's -log p_target, which is inf once p_target
 * underflows (how a diverged run shows), as on the CPU. */
static __host__ __device__ inline float loss_of(float target_logit, float max, float sum)
{
    return -logf(expf(target_logit - max) / sum);
}

/* ---- block reductions ---- */

struct loss_max_op {
    __device__ float operator()(float a, float b) const { return loss_take_max(a, b); }
};

template <typename T> struct loss_sum_op {
    __device__ T operator()(T a, T b) const { return a + b; }
};

/* The block's values combined in the same tree every time, the result
 * given to every thread. Every thread of the block must call it (it
 * synchronises the block); the block's size is a multiple of 32. */
template <typename T, typename Op> static __device__ T loss_block_reduce(T value, Op op, T identity)
{
    __shared__ T warp_values[32];
    __shared__ T result;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int offset = 16; offset > 0; offset >>= 1)
        value = op(value, __shfl_down_sync(0xffffffffu, value, offset));
    if (lane == 0)
        warp_values[warp] = value;
    __syncthreads();
    if (warp == 0) {
        value = lane < (int)(blockDim.x >> 5) ? warp_values[lane] : identity;
        for (int offset = 16; offset > 0; offset >>= 1)
            value = op(value, __shfl_down_sync(0xffffffffu, value, offset));
        if (lane == 0)
            result = value;
    }
    __syncthreads();
    value = result;
    __syncthreads(); /* a later call writes warp_values and result again */
    return value;
}

/* ---- row passes ---- */

/* The max over x[0, n), -inf for n = 0. vec: x is 16-byte aligned. */
static __device__ float row_max(const float *x, int n, int vec)
{
    float best = -INFINITY;
    int tail = 0;
    if (vec) {
        const float4 *x4 = (const float4 *)x;
        for (int j = threadIdx.x; j < n / 4; j += blockDim.x) {
            const float4 q = x4[j];
            best = loss_take_max(best, q.x);
            best = loss_take_max(best, q.y);
            best = loss_take_max(best, q.z);
            best = loss_take_max(best, q.w);
        }
        tail = n / 4 * 4;
    }
    for (int i = tail + threadIdx.x; i < n; i += blockDim.x)
        best = loss_take_max(best, x[i]);
    return loss_block_reduce(best, loss_max_op(), -INFINITY);
}

/* The sum of exp(x[i] - max) over x[0, n), in T (float or double). */
template <typename T> static __device__ T row_exp_sum(const float *x, int n, float max, int vec)
{
    T sum = T(0);
    int tail = 0;
    if (vec) {
        const float4 *x4 = (const float4 *)x;
        for (int j = threadIdx.x; j < n / 4; j += blockDim.x) {
            const float4 q = x4[j];
            sum += (T)expf(q.x - max);
            sum += (T)expf(q.y - max);
            sum += (T)expf(q.z - max);
            sum += (T)expf(q.w - max);
        }
        tail = n / 4 * 4;
    }
    for (int i = tail + threadIdx.x; i < n; i += blockDim.x)
        sum += (T)expf(x[i] - max);
    return loss_block_reduce(sum, loss_sum_op<T>(), T(0));
}

/* Rows of `pitch` floats from base are all 16-byte aligned. */
static int rows_aligned(const float *base, int pitch)
{
    return (uintptr_t)base % 16 == 0 && pitch % 4 == 0;
}

/* ---- the fused softmax and cross-entropy ---- */

__global__ void __launch_bounds__(LOSS_THREADS)
    crossentropy_forward_kernel(float *losses, float *lse, const float *logits,
                                const int *targets, int V, int Vp, int vec)
{
    const int row = blockIdx.x;
    const float *x = logits + (size_t)row * Vp;
    const float max = row_max(x, V, vec);
    const float sum = row_exp_sum<float>(x, V, max, vec);
    if (threadIdx.x == 0) {
        lse[row] = max + logf(sum);
        const int t = targets[row];
        losses[row] = t >= 0 && t < V ? loss_of(x[t], max, sum) : __int_as_float(0x7fc00000);
    }
}

extern "C" cudaError_t cuda_crossentropy_forward(const cuda_ctx *x, float *losses, float *lse,
                                                 const float *logits, const int *targets, int N,
                                                 int V, int Vp)
{
    if (N <= 0)
        return N == 0 ? cudaSuccess : cudaErrorInvalidValue;
    if (V < 0 || Vp < V || !losses || !lse || !logits || !targets)
        return cudaErrorInvalidValue;
    LOOM_CUDA_LAUNCH(crossentropy_forward_kernel, N, LOSS_THREADS, 0, x->stream, losses, lse,
                     logits, targets, V, Vp, rows_aligned(logits, Vp));
    return cudaGetLastError();
}

/* Each element is read and written by the same thread: in place is safe. */
__global__ void __launch_bounds__(LOSS_THREADS)
    crossentropy_backward_kernel(float *logits, const float *dlosses, const float *lse,
                                 const int *targets, int V, int Vp, int vec)
{
    const int row = blockIdx.x;
    float *x = logits + (size_t)row * Vp;
    const float L = lse[row], d = dlosses[row];
    const int t = targets[row];
    if (vec) { /* Vp % 4 == 0 */
        float4 *x4 = (float4 *)x;
        for (int j = threadIdx.x; j < Vp / 4; j += blockDim.x) {
            float4 q = x4[j];
            const int i = 4 * j;
            q.x = loss_grad_value(q.x, i, V, t, L, d);
            q.y = loss_grad_value(q.y, i + 1, V, t, L, d);
            q.z = loss_grad_value(q.z, i + 2, V, t, L, d);
            q.w = loss_grad_value(q.w, i + 3, V, t, L, d);
            x4[j] = q;
        }
        return;
    }
    for (int i = threadIdx.x; i < Vp; i += blockDim.x)
        x[i] = loss_grad_value(x[i], i, V, t, L, d);
}

extern "C" cudaError_t cuda_crossentropy_backward(const cuda_ctx *x, float *logits,
                                                  const float *dlosses, const float *lse,
                                                  const int *targets, int N, int V, int Vp)
{
    if (N <= 0)
        return N == 0 ? cudaSuccess : cudaErrorInvalidValue;
    if (V < 0 || Vp < V || !logits || !dlosses || !lse || !targets)
        return cudaErrorInvalidValue;
    LOOM_CUDA_LAUNCH(crossentropy_backward_kernel, N, LOSS_THREADS, 0, x->stream, logits, dlosses,
                     lse, targets, V, Vp, rows_aligned(logits, Vp));
    return cudaGetLastError();
}

/* ---- the vocabulary-parallel loss ---- */

/* Each row of the slice is width floats, of which the first real are
 * tokens v0 .. v0 + real - 1 and the rest padding. */

__global__ void __launch_bounds__(LOSS_THREADS)
    slice_max_kernel(float *max, const float *logits, int width, int real, int vec)
{
    const int row = blockIdx.x;
    const float best = row_max(logits + (size_t)row * width, real, vec);
    if (threadIdx.x == 0)
        max[row] = best;
}

extern "C" cudaError_t cuda_crossentropy_slice_max(const cuda_ctx *x, float *max,
                                                   const float *logits, int N, int width, int real)
{
    if (N <= 0)
        return N == 0 ? cudaSuccess : cudaErrorInvalidValue;
    if (real < 0 || width < real || !max || (real && !logits))
        return cudaErrorInvalidValue;
    LOOM_CUDA_LAUNCH(slice_max_kernel, N, LOSS_THREADS, 0, x->stream, max, logits, width, real,
                     real && rows_aligned(logits, width));
    return cudaGetLastError();
}

/* sum[n] = Σ exp(x - max[n]) over the real columns, summed in double and
 * rounded once; target[n] = the target's logit when the slice holds it,
 * else 0 (the group's sum then adds the one slice's logit). */
__global__ void __launch_bounds__(LOSS_THREADS)
    slice_sums_kernel(float *sum, float *target, const float *logits, const float *max,
                      const int *targets, int v0, int width, int real, int vec)
{
    const int row = blockIdx.x;
    const float *x = logits + (size_t)row * width;
    const double s = row_exp_sum<double>(x, real, max[row], vec);
    if (threadIdx.x == 0) {
        sum[row] = (float)s;
        const long long t = (long long)targets[row] - v0;
        target[row] = t >= 0 && t < real ? x[t] : 0.0f;
    }
}

extern "C" cudaError_t cuda_crossentropy_slice_sums(const cuda_ctx *x, float *sum, float *target,
                                                    const float *logits, const float *max,
                                                    const int *targets, int v0, int N, int width,
                                                    int real)
{
    if (N <= 0)
        return N == 0 ? cudaSuccess : cudaErrorInvalidValue;
    if (real < 0 || width < real || !sum || !target || !max || !targets || (real && !logits))
        return cudaErrorInvalidValue;
    LOOM_CUDA_LAUNCH(slice_sums_kernel, N, LOSS_THREADS, 0, x->stream, sum, target, logits, max,
                     targets, v0, width, real, real && rows_aligned(logits, width));
    return cudaGetLastError();
}

/* lse = log Σ + max, loss = lse - the target's logit, in the cpu backend's
 * order: (log(sum) + max) - target. */
__global__ void __launch_bounds__(FINISH_THREADS)
    slice_finish_kernel(float *lse, float *losses, const float *max, const float *sum,
                        const float *target, int N)
{
    const size_t row = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= (size_t)N)
        return;
    const float L = logf(sum[row]) + max[row];
    lse[row] = L;
    losses[row] = L - target[row];
}

extern "C" cudaError_t cuda_crossentropy_slice_finish(const cuda_ctx *x, float *lse,
                                                      float *losses, const float *max,
                                                      const float *sum, const float *target, int N)
{
    if (N <= 0)
        return N == 0 ? cudaSuccess : cudaErrorInvalidValue;
    if (!lse || !losses || !max || !sum || !target)
        return cudaErrorInvalidValue;
    const unsigned blocks = (unsigned)(((size_t)N + FINISH_THREADS - 1) / FINISH_THREADS);
    LOOM_CUDA_LAUNCH(slice_finish_kernel, blocks, FINISH_THREADS, 0, x->stream, lse, losses, max,
                     sum, target, N);
    return cudaGetLastError();
}

/* Over the whole width: the real columns' gradient, 0 in the padding. */
__global__ void __launch_bounds__(LOSS_THREADS)
    slice_backward_kernel(float *logits, const float *dlosses, const float *lse,
                          const int *targets, int v0, int width, int real, int vec)
{
    const int row = blockIdx.x;
    float *x = logits + (size_t)row * width;
    const float L = lse[row], d = dlosses[row];
    const long long target = (long long)targets[row] - v0;
    /* outside the slice: a column no i can equal */
    const int t = target >= 0 && target < real ? (int)target : -1;
    if (vec) { /* width % 4 == 0 */
        float4 *x4 = (float4 *)x;
        for (int j = threadIdx.x; j < width / 4; j += blockDim.x) {
            float4 q = x4[j];
            const int i = 4 * j;
            q.x = loss_slice_grad_value(q.x, i, real, t, L, d);
            q.y = loss_slice_grad_value(q.y, i + 1, real, t, L, d);
            q.z = loss_slice_grad_value(q.z, i + 2, real, t, L, d);
            q.w = loss_slice_grad_value(q.w, i + 3, real, t, L, d);
            x4[j] = q;
        }
        return;
    }
    for (int i = threadIdx.x; i < width; i += blockDim.x)
        x[i] = loss_slice_grad_value(x[i], i, real, t, L, d);
}

extern "C" cudaError_t cuda_crossentropy_slice_backward(const cuda_ctx *x, float *logits,
                                                        const float *dlosses, const float *lse,
                                                        const int *targets, int v0, int N,
                                                        int width, int real)
{
    if (N <= 0)
        return N == 0 ? cudaSuccess : cudaErrorInvalidValue;
    if (real < 0 || width < real || !dlosses || !lse || !targets || (width && !logits))
        return cudaErrorInvalidValue;
    if (!width)
        return cudaSuccess;
    LOOM_CUDA_LAUNCH(slice_backward_kernel, N, LOSS_THREADS, 0, x->stream, logits, dlosses, lse,
                     targets, v0, width, real, rows_aligned(logits, width));
    return cudaGetLastError();
}
