/* compute-cuda's kernels as host C++: force-included (g++ -include) before
 * a .cu file compiled with g++ -x c++, so that the plugin's own sources run
 * on the CPU (tests/compute/emu/cudart_emu.cpp is the runtime underneath).
 *
 * A launch runs its grid block after block on the calling OS thread; a
 * block's threads are fibers, each on its own stack, switching only at a
 * barrier (__syncthreads*, a warp shuffle, __syncwarp). A thread that never
 * reaches one runs straight through. Launches are serialised process-wide,
 * so the indices and the block's __shared__ variables (function statics)
 * are plain globals: one block lives at a time.
 *
 * A barrier that not every thread of the block (or warp) reaches, a thread
 * leaving while others wait, or a shuffle with a mask other than the full
 * warp fail the process with one line naming the kernel. Dynamic shared
 * memory is filled with NaN before each block, so a read of a word no
 * thread wrote shows in the results. */
#ifndef LOOM_CUDA_EMU_H
#define LOOM_CUDA_EMU_H

/* Before the toolkit's headers, which define these only when undefined:
 * a block's __shared__ variables are function statics (one block at a
 * time; nothing may rely on their contents from a previous block). */
#define __shared__ static
#define __launch_bounds__(...)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#ifdef __CUDA_ARCH__
#error "cuda_emu.h is for host compilers: the kernels run on the CPU"
#endif

struct emu_index {
    unsigned x, y, z;
};
extern emu_index threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
static constexpr int warpSize = 32;

extern "C" {
/* barriers of the current block: the OR, AND or count of pred over the block */
int emu_block_barrier(int kind, int pred);
/* a warp barrier; lanes exchange 8-byte values: out = the value src_lane put */
unsigned long long emu_warp_exchange(unsigned mask, unsigned long long mine, int src_lane,
                                     const char *what);
void emu_warp_barrier(unsigned mask);
void *emu_dynamic_shared_memory(void);
typedef void (*emu_body_fn)(void *closure);
cudaError_t emu_launch(const char *name, const void *kernel, dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, emu_body_fn body, void *closure);
}

enum { EMU_SYNC_PLAIN = 0, EMU_SYNC_OR = 1, EMU_SYNC_AND = 2, EMU_SYNC_COUNT = 3 };

static inline void __syncthreads(void) { (void)emu_block_barrier(EMU_SYNC_PLAIN, 0); }
static inline int __syncthreads_or(int pred) { return emu_block_barrier(EMU_SYNC_OR, pred != 0); }
static inline int __syncthreads_and(int pred)
{
    return emu_block_barrier(EMU_SYNC_AND, pred != 0);
}
static inline int __syncthreads_count(int pred)
{
    return emu_block_barrier(EMU_SYNC_COUNT, pred != 0);
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) { emu_warp_barrier(mask); }

/* The shuffles, for any value of at most 8 bytes (float, double, int,
 * unsigned, long long ...), width 32 only. */
static inline int emu_lane(void)
{
    const unsigned linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    return (int)(linear % 32u);
}
template <typename T> static inline T emu_shuffle(unsigned mask, T v, int src, const char *what)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffled type");
    unsigned long long bits = 0;
    memcpy(&bits, &v, sizeof(T));
    bits = emu_warp_exchange(mask, bits, src, what);
    T r;
    memcpy(&r, &bits, sizeof(T));
    return r;
}
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
    (void)width;
    return emu_shuffle(mask, v, width == 32 ? (src & 31) : -1, "__shfl_sync");
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    return emu_shuffle(mask, v, width == 32 ? ((emu_lane() ^ lane_mask) & 31) : -1,
                       "__shfl_xor_sync");
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    const int src = emu_lane() + (int)delta;
    return emu_shuffle(mask, v, width != 32 ? -1 : src < 32 ? src : emu_lane(), "__shfl_down_sync");
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32)
{
    const int src = emu_lane() - (int)delta;
    return emu_shuffle(mask, v, width != 32 ? -1 : src >= 0 ? src : emu_lane(), "__shfl_up_sync");
}

/* The device intrinsics the kernels use, with the GPU's rounding (the
 * host's default, round to nearest; no contraction across them). */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
static inline float __int_as_float(int i)
{
    float f;
    memcpy(&f, &i, 4);
    return f;
}
static inline int __float_as_int(float f)
{
    int i;
    memcpy(&i, &f, 4);
    return i;
}
static inline float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline unsigned __float_as_uint(float f)
{
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
template <typename T> static inline T __ldg(const T *p) { return *p; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b)
{
    return a < b ? a : b;
}
static inline unsigned long long max(unsigned long long a, unsigned long long b)
{
    return a > b ? a : b;
}

/* The launch: the arguments are evaluated once, on the host, as a GPU
 * launch copies them; the grid then runs before the macro returns. The
 * launch's error is left for cudaGetLastError, as a real one is. */
template <typename... P, typename... A>
static inline void emu_launch_kernel(const char *name, void (*kernel)(P...), dim3 grid,
                                     dim3 block, size_t smem, cudaStream_t stream, A &&...args)
{
    /* a C cast: NULL arrives as an integer; nvcc has checked the types */
    auto run = [kernel, converted = std::make_tuple((typename std::decay<P>::type)(args)...)]() {
        std::apply(kernel, converted);
    };
    emu_launch(name, (const void *)kernel, grid, block, smem, stream,
               [](void *c) { (*static_cast<decltype(run) *>(c))(); }, &run);
}

#define LOOM_CUDA_LAUNCH(kernel, grid, block, smem, stream, ...)                                 \
    emu_launch_kernel(#kernel, kernel, dim3(grid), dim3(block), (size_t)(smem), (stream),       \
                      __VA_ARGS__)

/* kernels_attention.cu's dynamic shared memory (extern __shared__ there) */
#define ATTN_SHARED_MEMORY(name) float *name = (float *)emu_dynamic_shared_memory()

#endif
