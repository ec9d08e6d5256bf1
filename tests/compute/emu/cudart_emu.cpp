/* The CUDA runtime compute-cuda calls, on the CPU: one emulated device
 * ("loom CUDA emulation (sm_90)"), device memory in host memory, every
 * copy and kernel done when it is issued (streams and events are always
 * complete), and the kernels' grids run on fibers (cuda_emu.h).
 *
 * Linked statically into the emulated plugin, whose version script
 * exports only loom_compute_plugin_v1: these cuda* symbols never meet the
 * real libcudart the core may have loaded.
 *
 * Fibers switch with a few instructions of x86-64 assembly; with
 * -DCUDA_EMU_UCONTEXT (or on another architecture) through
 * swapcontext, which AddressSanitizer follows. */
#include "cuda_emu.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#if !defined(__x86_64__) && !defined(CUDA_EMU_UCONTEXT)
#define CUDA_EMU_UCONTEXT 1
#endif
#ifdef CUDA_EMU_UCONTEXT
#include <ucontext.h>
#endif

emu_index threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace {

constexpr size_t DEVICE_BYTES = (size_t)16 << 30;
constexpr int SM_COUNT = 132;
constexpr size_t STATIC_SMEM_LIMIT = 48 * 1024;
constexpr int SMEM_OPTIN_LIMIT = 227 * 1024;
#ifdef CUDA_EMU_UCONTEXT
constexpr size_t FIBER_STACK = 256 * 1024; /* sanitizers' frames are larger */
#else
constexpr size_t FIBER_STACK = 64 * 1024;
#endif
constexpr size_t GUARD = 4096;

[[noreturn]] __attribute__((format(printf, 1, 2))) void emu_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuda emulation: FAIL: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    fflush(stderr);
    va_end(ap);
    abort();
}

/* ---- fibers ---- */

#ifndef CUDA_EMU_UCONTEXT
extern "C" __attribute__((visibility("hidden"))) void emu_switch(void **save_sp, void *load_sp);
extern "C" __attribute__((visibility("hidden"))) void emu_fiber_start(void);
/* callee-saved registers, the SSE and x87 control words, then ret */
asm(".text\n"
    ".p2align 4\n"
    ".globl emu_switch\n"
    ".hidden emu_switch\n"
    ".type emu_switch,@function\n"
    "emu_switch:\n"
    "  pushq %rbp\n"
    "  pushq %rbx\n"
    "  pushq %r12\n"
    "  pushq %r13\n"
    "  pushq %r14\n"
    "  pushq %r15\n"
    "  subq $16, %rsp\n"
    "  stmxcsr 8(%rsp)\n"
    "  fnstcw (%rsp)\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  ldmxcsr 8(%rsp)\n"
    "  fldcw (%rsp)\n"
    "  addq $16, %rsp\n"
    "  popq %r15\n"
    "  popq %r14\n"
    "  popq %r13\n"
    "  popq %r12\n"
    "  popq %rbx\n"
    "  popq %rbp\n"
    "  ret\n"
    ".size emu_switch, .-emu_switch\n"
    ".p2align 4\n"
    ".globl emu_fiber_start\n"
    ".hidden emu_fiber_start\n"
    ".type emu_fiber_start,@function\n"
    "emu_fiber_start:\n"
    "  call emu_fiber_main\n"
    "  ud2\n"
    ".size emu_fiber_start, .-emu_fiber_start\n");
#endif

enum thread_state { NOT_STARTED, READY, RUNNING, WAIT_BLOCK, WAIT_WARP, DONE };

struct emu_thread {
    thread_state state;
    int result;                   /* a block barrier's OR/AND/count */
    unsigned exchange_gen;        /* which of the two exchange slots */
    char *stack;
#ifdef CUDA_EMU_UCONTEXT
    ucontext_t context;
#else
    void *sp;
#endif
};

struct emu_warp {
    int arrived;
    unsigned gen;
    unsigned long long value[2][32];
};

/* the block being run (one at a time, under launch_lock) */
struct emu_block_run {
    const char *kernel;
    int threads;
    int current;
    int done;
    std::vector<emu_thread> thread;
    std::vector<emu_warp> warp;
    int block_arrived, block_acc, block_kind;
    std::vector<char *> free_stacks;
    std::vector<char *> all_stacks;
    emu_body_fn body;
    void *closure;
#ifdef CUDA_EMU_UCONTEXT
    ucontext_t scheduler;
#else
    void *scheduler_sp;
#endif
    std::vector<float> dynamic_smem;
} run;

std::mutex launch_lock;

char *take_stack()
{
    if (!run.free_stacks.empty()) {
        char *s = run.free_stacks.back();
        run.free_stacks.pop_back();
        return s;
    }
    /* a guard page below: an overflow faults instead of corrupting a neighbour */
    void *m = mmap(nullptr, GUARD + FIBER_STACK, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || mprotect(m, GUARD, PROT_NONE) != 0)
        emu_fail("%s: no memory for a fiber stack (%d threads)", run.kernel, run.threads);
    char *s = (char *)m + GUARD;
    run.all_stacks.push_back(s);
    return s;
}

void set_indices(int t)
{
    const unsigned lin = (unsigned)t;
    threadIdx.x = lin % blockDim.x;
    threadIdx.y = lin / blockDim.x % blockDim.y;
    threadIdx.z = lin / (blockDim.x * blockDim.y);
}

void yield_to_scheduler()
{
    emu_thread &me = run.thread[run.current];
#ifdef CUDA_EMU_UCONTEXT
    swapcontext(&me.context, &run.scheduler);
#else
    emu_switch(&me.sp, run.scheduler_sp);
#endif
}

} // namespace

extern "C" __attribute__((visibility("hidden"), used)) void emu_fiber_main(void)
{
    run.body(run.closure);
    emu_thread &me = run.thread[run.current];
    me.state = DONE;
    run.done++;
    if (run.block_arrived)
        emu_fail("%s: thread %d left the kernel while %d threads waited at __syncthreads (a "
                 "barrier in divergent code?)",
                 run.kernel, run.current, run.block_arrived);
    const emu_warp &w = run.warp[run.current / 32];
    if (w.arrived)
        emu_fail("%s: thread %d left the kernel while %d lanes of its warp waited at a shuffle "
                 "or __syncwarp",
                 run.kernel, run.current, w.arrived);
    yield_to_scheduler();
    abort(); /* a finished thread is never resumed */
}

#ifdef CUDA_EMU_UCONTEXT
static void emu_fiber_entry_ucontext(void) { emu_fiber_main(); }
#endif

namespace {

void start_fiber(emu_thread &t)
{
    t.stack = take_stack();
#ifdef CUDA_EMU_UCONTEXT
    getcontext(&t.context);
    t.context.uc_stack.ss_sp = t.stack;
    t.context.uc_stack.ss_size = FIBER_STACK;
    t.context.uc_link = nullptr;
    makecontext(&t.context, emu_fiber_entry_ucontext, 0);
#else
    uintptr_t top = ((uintptr_t)t.stack + FIBER_STACK) & ~(uintptr_t)15;
    void **sp = (void **)(top - 88); /* sp + 72 (after ret) is 16-aligned at the call */
    unsigned control[4] = {0, 0, 0, 0};
    __asm__ volatile("fnstcw %0" : "=m"(control[0]));
    __asm__ volatile("stmxcsr %0" : "=m"(control[2]));
    memcpy(sp, control, 16);
    for (int r = 2; r < 8; r++)
        sp[r] = nullptr;
    sp[8] = (void *)emu_fiber_start;
    t.sp = sp;
#endif
}

void resume(int i)
{
    emu_thread &t = run.thread[i];
    if (t.state == NOT_STARTED)
        start_fiber(t);
    t.state = RUNNING;
    run.current = i;
    set_indices(i);
#ifdef CUDA_EMU_UCONTEXT
    swapcontext(&run.scheduler, &t.context);
#else
    emu_switch(&run.scheduler_sp, t.sp);
#endif
    if (t.state == DONE) {
        run.free_stacks.push_back(t.stack);
        t.stack = nullptr;
    }
}

void run_block(size_t smem)
{
    for (emu_thread &t : run.thread) {
        t.state = NOT_STARTED;
        t.result = 0;
        t.exchange_gen = 0;
    }
    for (emu_warp &w : run.warp) {
        w.arrived = 0;
        w.gen = 0;
    }
    run.done = 0;
    run.block_arrived = 0;
    run.block_acc = 0;
    if (smem)
        std::fill(run.dynamic_smem.begin(), run.dynamic_smem.end(), NAN);
    for (;;) {
        bool progressed = false;
        for (int i = 0; i < run.threads; i++) {
            const thread_state s = run.thread[i].state;
            if (s == NOT_STARTED || s == READY) {
                resume(i);
                progressed = true;
            }
        }
        if (run.done == run.threads)
            return;
        if (!progressed) {
            int at_warp = 0;
            for (const emu_thread &t : run.thread)
                at_warp += t.state == WAIT_WARP;
            emu_fail("%s: deadlock in block (%u, %u, %u): %d threads wait at __syncthreads, %d at "
                     "a warp barrier, %d have exited (a barrier some thread never reaches)",
                     run.kernel, blockIdx.x, blockIdx.y, blockIdx.z, run.block_arrived, at_warp,
                     run.done);
        }
    }
}

} // namespace

extern "C" int emu_block_barrier(int kind, int pred)
{
    if (run.done)
        emu_fail("%s: __syncthreads%s after %d threads of the block exited (thread %d waits "
                 "forever)",
                 run.kernel, kind == EMU_SYNC_PLAIN ? "" : "_or/_and/_count", run.done,
                 run.current);
    if (run.block_arrived && run.block_kind != kind)
        emu_fail("%s: threads of the block wait at different __syncthreads variants (%d and %d)",
                 run.kernel, run.block_kind, kind);
    run.block_kind = kind;
    if (kind == EMU_SYNC_AND)
        run.block_acc = run.block_arrived ? (run.block_acc && pred) : pred;
    else if (kind == EMU_SYNC_COUNT)
        run.block_acc += pred;
    else
        run.block_acc |= pred;
    emu_thread &me = run.thread[run.current];
    if (++run.block_arrived == run.threads) {
        const int result = run.block_acc;
        for (emu_thread &t : run.thread)
            if (t.state == WAIT_BLOCK) {
                t.state = READY;
                t.result = result;
            }
        run.block_arrived = 0;
        run.block_acc = 0;
        return result;
    }
    me.state = WAIT_BLOCK;
    yield_to_scheduler();
    return me.result;
}

static int warp_lanes(int warp) { return std::min(32, run.threads - 32 * warp); }

extern "C" unsigned long long emu_warp_exchange(unsigned mask, unsigned long long mine,
                                                int src_lane, const char *what)
{
    const int warp = run.current / 32, lane = run.current % 32;
    if (mask != 0xffffffffu || warp_lanes(warp) != 32)
        emu_fail("%s: %s with mask %#x in a warp of %d threads (only full warps are emulated)",
                 run.kernel, what, mask, warp_lanes(warp));
    if (src_lane < 0)
        emu_fail("%s: %s with a width other than 32", run.kernel, what);
    emu_warp &w = run.warp[warp];
    emu_thread &me = run.thread[run.current];
    const unsigned slot = w.gen & 1;
    w.value[slot][lane] = mine;
    if (++w.arrived == 32) {
        w.arrived = 0;
        w.gen++;
        for (int l = 0; l < 32; l++)
            if (run.thread[32 * warp + l].state == WAIT_WARP)
                run.thread[32 * warp + l].state = READY;
    } else {
        me.state = WAIT_WARP;
        yield_to_scheduler();
    }
    /* the next exchange writes the other slot: no lane can be two ahead */
    return w.value[slot][src_lane];
}

extern "C" void emu_warp_barrier(unsigned mask)
{
    (void)emu_warp_exchange(mask, 0, 0, "__syncwarp");
}

extern "C" void *emu_dynamic_shared_memory(void) { return run.dynamic_smem.data(); }

/* ---- the runtime ---- */

namespace {

thread_local cudaError_t last_error = cudaSuccess;
std::mutex state_lock;
std::map<const void *, size_t> device_blocks, host_blocks;
size_t device_used;
std::set<void *> streams, events;
std::map<const void *, int> smem_optin;
int current_device;

cudaError_t fail(cudaError_t e)
{
    last_error = e;
    return e;
}

bool known_stream(cudaStream_t s)
{
    std::lock_guard<std::mutex> g(state_lock);
    return !s || streams.count((void *)s);
}

cudaError_t allocate(void **p, size_t size, std::map<const void *, size_t> &blocks, bool device)
{
    if (!p)
        return fail(cudaErrorInvalidValue);
    *p = nullptr;
    if (!size)
        return cudaSuccess;
    std::lock_guard<std::mutex> g(state_lock);
    if (device && size > DEVICE_BYTES - device_used)
        return fail(cudaErrorMemoryAllocation);
    const size_t rounded = (size + 255) / 256 * 256;
    /* the size asked for, not rounded: AddressSanitizer then sees a read
     * past it */
    void *q = nullptr;
    if (posix_memalign(&q, 256, size) != 0)
        return fail(cudaErrorMemoryAllocation);
    blocks[q] = rounded;
    if (device)
        device_used += rounded;
    *p = q;
    return cudaSuccess;
}

cudaError_t release(void *p, std::map<const void *, size_t> &blocks, bool device)
{
    if (!p)
        return cudaSuccess;
    std::lock_guard<std::mutex> g(state_lock);
    auto it = blocks.find(p);
    if (it == blocks.end())
        return fail(cudaErrorInvalidValue);
    if (device)
        device_used -= it->second;
    blocks.erase(it);
    free(p);
    return cudaSuccess;
}

} // namespace

extern "C" cudaError_t emu_launch(const char *name, const void *kernel, dim3 grid, dim3 block,
                                  size_t smem, cudaStream_t stream, emu_body_fn body,
                                  void *closure)
{
    const size_t threads = (size_t)block.x * block.y * block.z;
    if (!threads || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
        !grid.x || !grid.y || !grid.z || grid.x > 0x7fffffffu || grid.y > 65535 ||
        grid.z > 65535)
        return fail(cudaErrorInvalidConfiguration);
    if (!known_stream(stream))
        return fail(cudaErrorInvalidResourceHandle);
    if (smem > STATIC_SMEM_LIMIT) {
        std::lock_guard<std::mutex> g(state_lock);
        auto it = smem_optin.find(kernel);
        if (it == smem_optin.end() || smem > (size_t)it->second)
            return fail(cudaErrorInvalidValue);
    }
    std::lock_guard<std::mutex> g(launch_lock);
    run.kernel = name;
    run.threads = (int)threads;
    run.thread.assign(threads, emu_thread());
    run.warp.assign((threads + 31) / 32, emu_warp());
    run.body = body;
    run.closure = closure;
    run.dynamic_smem.assign((smem + 3) / 4 + 4, NAN);
    blockDim = block;
    gridDim = grid;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx.x = x;
                blockIdx.y = y;
                blockIdx.z = z;
                run_block(smem);
            }
    return cudaSuccess;
}

extern "C" {

cudaError_t cudaGetLastError(void)
{
    const cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorName(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidPitchValue: return "cudaErrorInvalidPitchValue";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidPitchValue: return "invalid pitch argument";
    default: return "unknown error (cuda emulation)";
    }
}

cudaError_t cudaDriverGetVersion(int *v)
{
    if (!v)
        return fail(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (!v)
        return fail(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return fail(cudaErrorInvalidValue);
    *count = 1;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return fail(cudaErrorInvalidValue);
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    if (device != 0)
        return fail(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (!prop)
        return fail(cudaErrorInvalidValue);
    if (device != 0)
        return fail(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "loom CUDA emulation (sm_90)");
    prop->totalGlobalMem = DEVICE_BYTES;
    prop->sharedMemPerBlock = STATIC_SMEM_LIMIT;
    prop->sharedMemPerBlockOptin = SMEM_OPTIN_LIMIT;
    prop->sharedMemPerMultiprocessor = 228 * 1024;
    prop->regsPerBlock = 65536;
    prop->regsPerMultiprocessor = 65536;
    prop->warpSize = 32;
    prop->memPitch = 0x7fffffff;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = 1024;
    prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 0x7fffffff;
    prop->maxGridSize[1] = 65535;
    prop->maxGridSize[2] = 65535;
    prop->totalConstMem = 65536;
    prop->major = 9;
    prop->minor = 0;
    prop->textureAlignment = 512;
    prop->multiProcessorCount = SM_COUNT;
    prop->maxThreadsPerMultiProcessor = 2048;
    prop->l2CacheSize = 50 * 1024 * 1024;
    prop->memoryBusWidth = 5120;
    prop->unifiedAddressing = 1;
    prop->concurrentKernels = 1;
    prop->asyncEngineCount = 2;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (!value)
        return fail(cudaErrorInvalidValue);
    if (device != 0)
        return fail(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrMaxPitch: *value = 0x7fffffff; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *value = SM_COUNT; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = SMEM_OPTIN_LIMIT; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)STATIC_SMEM_LIMIT; return cudaSuccess;
    case cudaDevAttrWarpSize: *value = 32; return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; return cudaSuccess;
    case cudaDevAttrMaxGridDimX: *value = 0x7fffffff; return cudaSuccess;
    case cudaDevAttrMaxGridDimY:
    case cudaDevAttrMaxGridDimZ: *value = 65535; return cudaSuccess;
    default:
        fprintf(stderr, "cuda emulation: cudaDeviceGetAttribute(%d) is not emulated: add it to "
                        "tests/compute/emu/cudart_emu.cpp\n", (int)attr);
        return fail(cudaErrorInvalidValue);
    }
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    if (!free_bytes || !total)
        return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> g(state_lock);
    *total = DEVICE_BYTES;
    *free_bytes = DEVICE_BYTES - device_used;
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    if (!func)
        return fail(cudaErrorInvalidDeviceFunction);
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) {
        fprintf(stderr, "cuda emulation: cudaFuncSetAttribute(%d) is not emulated: add it to "
                        "tests/compute/emu/cudart_emu.cpp\n", (int)attr);
        return fail(cudaErrorInvalidValue);
    }
    if (value < 0 || value > SMEM_OPTIN_LIMIT)
        return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> g(state_lock);
    smem_optin[func] = value;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t size) { return allocate(p, size, device_blocks, true); }
cudaError_t cudaFree(void *p) { return release(p, device_blocks, true); }
cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t stream)
{
    if (!known_stream(stream))
        return fail(cudaErrorInvalidResourceHandle);
    return allocate(p, size, device_blocks, true);
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t stream)
{
    if (!known_stream(stream))
        return fail(cudaErrorInvalidResourceHandle);
    return release(p, device_blocks, true);
}
cudaError_t cudaMallocHost(void **p, size_t size)
{
    return allocate(p, size, host_blocks, false);
}
cudaError_t cudaFreeHost(void *p) { return release(p, host_blocks, false); }

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    if (count && (!dst || !src))
        return fail(cudaErrorInvalidValue);
    if ((int)kind < 0 || (int)kind > (int)cudaMemcpyDefault)
        return fail(cudaErrorInvalidMemcpyDirection);
    if (count)
        memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    if (!known_stream(stream))
        return fail(cudaErrorInvalidResourceHandle);
    return cudaMemcpy(dst, src, count, kind);
}

/* the real runtime's checks: a row no wider than either pitch, pitches
 * within the device's maximum */
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind,
                              cudaStream_t stream)
{
    if (!known_stream(stream))
        return fail(cudaErrorInvalidResourceHandle);
    if (width > dpitch || width > spitch || dpitch > 0x7fffffff || spitch > 0x7fffffff)
        return fail(cudaErrorInvalidPitchValue);
    if ((int)kind < 0 || (int)kind > (int)cudaMemcpyDefault)
        return fail(cudaErrorInvalidMemcpyDirection);
    if (!width || !height)
        return cudaSuccess;
    if (!dst || !src)
        return fail(cudaErrorInvalidValue);
    for (size_t r = 0; r < height; r++)
        memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return cudaSuccess;
}

cudaError_t cudaMemset2DAsync(void *p, size_t pitch, int value, size_t width, size_t height,
                              cudaStream_t stream)
{
    if (!known_stream(stream))
        return fail(cudaErrorInvalidResourceHandle);
    if (width > pitch || pitch > 0x7fffffff)
        return fail(cudaErrorInvalidPitchValue);
    if (!width || !height)
        return cudaSuccess;
    if (!p)
        return fail(cudaErrorInvalidValue);
    for (size_t r = 0; r < height; r++)
        memset((char *)p + r * pitch, value, width);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t count)
{
    if (count && !p)
        return fail(cudaErrorInvalidValue);
    if (count)
        memset(p, value, count);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t count, cudaStream_t stream)
{
    if (!known_stream(stream))
        return fail(cudaErrorInvalidResourceHandle);
    return cudaMemset(p, value, count);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned int flags)
{
    (void)flags;
    if (!stream)
        return fail(cudaErrorInvalidValue);
    void *s = malloc(1);
    if (!s)
        return fail(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> g(state_lock);
    streams.insert(s);
    *stream = (cudaStream_t)s;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    std::lock_guard<std::mutex> g(state_lock);
    if (!stream || !streams.erase((void *)stream))
        return fail(cudaErrorInvalidResourceHandle);
    free((void *)stream);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    return known_stream(stream) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) { return cudaStreamQuery(stream); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    (void)flags;
    if (!event)
        return fail(cudaErrorInvalidValue);
    void *e = malloc(1);
    if (!e)
        return fail(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> g(state_lock);
    events.insert(e);
    *event = (cudaEvent_t)e;
    return cudaSuccess;
}

static bool known_event(cudaEvent_t event)
{
    std::lock_guard<std::mutex> g(state_lock);
    return event && events.count((void *)event);
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    std::lock_guard<std::mutex> g(state_lock);
    if (!event || !events.erase((void *)event))
        return fail(cudaErrorInvalidResourceHandle);
    free((void *)event);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    if (!known_event(event) || !known_stream(stream))
        return fail(cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    return known_event(event) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) { return cudaEventQuery(event); }

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    (void)flags;
    if (!known_event(event) || !known_stream(stream))
        return fail(cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

} // extern "C"
