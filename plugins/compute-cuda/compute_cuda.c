/* compute-cuda: the compute backend on an NVIDIA GPU (loom/compute.h). The
 * model's buffers are device memory (cudaMalloc); every op is enqueued on
 * one non-blocking CUDA stream; the matrix products are cuBLASLt's, the
 * other kernels are this plugin's own (cuda_kernels.h, the .cu files).
 *
 * No host wait is unbounded: synchronize, event_wait and the copies to and
 * from host memory poll the stream or an event and give up after
 * compute.cuda.timeout_s with LOOM_ERR_TIMEOUT, so a hung kernel ends the
 * run with a message instead of a silent hang. An error of issued work (a
 * launch that failed, a product cuBLASLt refused, a fault found at a wait)
 * is returned by the call that meets it and kept until status() reports
 * it; a device fault (an illegal address, say) poisons the CUDA context,
 * and every later call fails too.
 *
 * A process drives the device of its local rank; when a machine has fewer
 * GPUs than local ranks the ranks share them round-robin, which is how
 * meshes of several ranks are tested on a one-GPU machine.
 *
 * Products: loom's matrices are row-major and cuBLASLt's column-major, so
 * C (M, N) = A (M, K) B (K, N) is computed as C^T = B^T A^T: each operand's
 * memory read column-major is its transpose, and the operands swap places.
 * f32 products multiply in exact fp32 (CUBLAS_COMPUTE_32F) unless
 * compute.cuda.tf32 allows TF32; bf16 products take bf16 operands (f32 ones
 * are rounded into a copy first, as the cpu backend does) and accumulate
 * and write f32. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "common/clock.h"
#include "cuda_kernels.h"
#include "loom/compute.h"

#define MIB ((size_t)1 << 20)
#define WORKSPACE_BYTES (32 * MIB)    /* cuBLASLt's workspace */
#define SCRATCH_BYTES (64 * MIB)      /* the kernels' partial sums */
#define HOST_SCRATCH_BYTES ((size_t)4096)
#define MIN_SM_MAJOR 8                /* bf16 products: Ampere (sm_80) and newer */
#define GEMM_PLANS 48                 /* products of distinct shapes remembered */

static const loom_setting_spec cuda_settings[] = {
    {.name = "tf32", .type = LOOM_SETTING_BOOL, .default_value = "false",
     .help = "let f32 products multiply in TF32 (faster, about 3 decimal digits, the same "
             "results run to run but not the cpu backend's); false keeps them exact fp32, as "
             "reference runs need"},
    {.name = "timeout_s", .type = LOOM_SETTING_FLOAT, .default_value = "300",
     .help = "how long a wait for the device (synchronize, an event, a copy to or from host "
             "memory) may take before it fails as a hung kernel",
     .bounds = LOOM_SETTING_ABOVE_MIN, .min = 0},
    {0},
};

/* One matrix of a cuBLASLt product, as cuBLASLt sees it: column-major
 * rows x cols with leading dimension ld, transposed by the product when
 * transposed; batch members stride elements apart. */
typedef struct lt_matrix {
    uint64_t rows, cols;
    int64_t ld, stride;
    int32_t type;       /* cudaDataType_t */
    int32_t transposed; /* CUBLAS_OP_T */
    uint32_t align;     /* bytes every member's address is a multiple of (<= 256) */
    uint32_t unused;
} lt_matrix;

/* What a product's plan depends on; compared whole, so zeroed first. */
typedef struct gemm_key {
    lt_matrix m[3]; /* cuBLASLt's A (loom's b), B (loom's a), C = D (loom's c) */
    int32_t batch;
    int32_t compute; /* cublasComputeType_t */
} gemm_key;

typedef struct gemm_plan {
    gemm_key key;
    int used;
    int no_algorithm; /* cuBLASLt has none for this bf16 shape: it runs widened */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t layout[3];
    cublasLtMatmulAlgo_t algo;
} gemm_plan;

struct loom_compute {
    const loom_host *host;
    cuda_ctx ctx;              /* the stream and scratch the launchers share */
    cudaStream_t zero_stream;  /* alloc's zeroing, waited for on its own */
    int device, device_count, ranks_sharing;
    int sm_major, sm_minor;
    size_t total_bytes, max_pitch;
    char device_name[256];
    loom_dtype multiply;       /* the matmul ops' products */
    int tf32;                  /* f32 products in TF32 */
    double timeout_s;

    cublasLtHandle_t lt;
    void *workspace;
    void *room;                /* gemm's converted operands, copy's bounce buffer */
    size_t room_bytes;
    gemm_plan plans[GEMM_PLANS];
    int next_plan;             /* the slot the next new plan replaces when all are used */

    int pending;               /* first failure of issued work not yet reported by status */
    char pending_detail[512];
};

struct loom_compute_event {
    cudaEvent_t event;
};

/* ------------------------------------------------------------ errors */

static int report(loom_compute *c, int keep, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Returns status with its detail recorded through host->error; keep: also
 * kept for status() when no earlier failure waits there. */
static int report(loom_compute *c, int keep, int status, const char *fmt, ...)
{
    char detail[sizeof c->pending_detail];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    if (keep && c->pending == LOOM_OK) {
        c->pending = status;
        memcpy(c->pending_detail, detail, sizeof detail);
    }
    return c->host->error(c->host, status, "%s", detail);
}

/* Errors that poison the CUDA context: every later call returns them. */
static int is_device_fault(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable: return 1;
    default: return 0;
    }
}

/* A CUDA call of op failed: kept and reported. */
static int cuda_failed(loom_compute *c, const char *op, cudaError_t e)
{
    (void)cudaGetLastError(); /* a later launcher's cudaGetLastError must not see it again */
    if (is_device_fault(e))
        return report(c, 1, LOOM_ERR_INTERNAL,
                      "cuda: device fault during %s: %s; the device is unusable for the rest of "
                      "this process",
                      op, cudaGetErrorString(e));
    return report(c, 1, e == cudaErrorMemoryAllocation ? LOOM_ERR_NO_MEMORY : LOOM_ERR_INTERNAL,
                  "cuda: %s: %s", op, cudaGetErrorString(e));
}

/* A query that found work still running is no error, but some runtimes
 * leave cudaErrorNotReady as the last error, where the next launcher's
 * cudaGetLastError would take it for its own. */
static void forget_not_ready(void)
{
    if (cudaPeekAtLastError() == cudaErrorNotReady)
        (void)cudaGetLastError();
}

static int launched(loom_compute *c, const char *op, cudaError_t e)
{
    return e == cudaSuccess ? LOOM_OK : cuda_failed(c, op, e);
}

/* A call that cannot be right (a NULL buffer for work it has to do, a
 * negative size) is the caller's bug: refused, never run into a fault. */
static int bad_call(loom_compute *c, const char *op, const char *condition)
{
    return report(c, 0, LOOM_ERR_INVALID,
                  "cuda: %s called with %s false (a NULL buffer or a negative size): a bug in "
                  "its caller, please report it",
                  op, condition);
}
#define CHECK_CALL(c, op, condition)                                                               \
    do {                                                                                           \
        if (!(condition))                                                                          \
            return bad_call((c), (op), #condition);                                                \
    } while (0)

/* The current device is per thread: make it ours before issuing work. */
static int on_device(loom_compute *c)
{
    int current = -1;
    cudaError_t e = cudaGetDevice(&current);
    if (e == cudaSuccess && current == c->device)
        return LOOM_OK;
    return launched(c, "cudaSetDevice", cudaSetDevice(c->device));
}

/* Checks a kernel's arguments, then launches it and reports its error. */
#define KERNEL(c, op, condition, launch)                                                           \
    do {                                                                                           \
        CHECK_CALL(c, op, condition);                                                              \
        int rc_ = on_device(c);                                                                    \
        return rc_ != LOOM_OK ? rc_ : launched((c), (op), (launch));                               \
    } while (0)

static int dtype_of(loom_compute *c, const char *op, loom_dtype t, cuda_dtype *out)
{
    switch (t) {
    case LOOM_F32: *out = CUDA_DTYPE_F32; return LOOM_OK;
    case LOOM_BF16: *out = CUDA_DTYPE_BF16; return LOOM_OK;
    case LOOM_F16: *out = CUDA_DTYPE_F16; return LOOM_OK;
    default:
        return report(c, 0, LOOM_ERR_INVALID,
                      "cuda: %s called with dtype %s; the cuda backend takes f32, bf16 or f16", op,
                      loom_dtype_name(t));
    }
}

/* "1.5 GiB", "12.0 MiB", "300 bytes" */
static const char *bytes_text(char *buf, size_t cap, size_t bytes)
{
    if (bytes >= ((size_t)1 << 30))
        snprintf(buf, cap, "%.1f GiB", (double)bytes / (double)((size_t)1 << 30));
    else if (bytes >= MIB)
        snprintf(buf, cap, "%.1f MiB", (double)bytes / (double)MIB);
    else
        snprintf(buf, cap, "%zu bytes", bytes);
    return buf;
}

static int out_of_memory(loom_compute *c, size_t bytes, const char *what)
{
    (void)cudaGetLastError();
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
        (void)cudaGetLastError();
        free_bytes = 0;
        total = c->total_bytes;
    }
    char asked[32], avail[32], all[32];
    return report(c, 0, LOOM_ERR_NO_MEMORY,
                  "cuda: out of device memory%s: %s asked, %s free of %s on device %d (%s)", what,
                  bytes_text(asked, sizeof asked, bytes),
                  bytes_text(avail, sizeof avail, free_bytes), bytes_text(all, sizeof all, total),
                  c->device, c->device_name);
}

/* ------------------------------------------------------------ waiting */

/* Polls event (or stream, when event is NULL) until its work is done, at
 * most timeout_s, pausing as the comm backends do (yields while the wait
 * is young, then short sleeps: the machine's cores may be shared). */
static int wait_for(loom_compute *c, cudaStream_t stream, cudaEvent_t event, double timeout_s,
                    const char *what)
{
    const double t0 = clock_now_s();
    for (;;) {
        cudaError_t e = event ? cudaEventQuery(event) : cudaStreamQuery(stream);
        if (e == cudaSuccess)
            return LOOM_OK;
        if (e != cudaErrorNotReady)
            return cuda_failed(c, what, e);
        forget_not_ready();
        double waited = clock_now_s() - t0;
        if (waited > timeout_s)
            return report(c, 0, LOOM_ERR_TIMEOUT,
                          "cuda: the device did not finish %s within %.0f s (a hung kernel?); "
                          "raise compute.cuda.timeout_s if the work is that long",
                          what, timeout_s);
        clock_pause(waited, 1);
    }
}

static int wait_queue(loom_compute *c, const char *what)
{
    return wait_for(c, c->ctx.stream, NULL, c->timeout_s, what);
}

/* ------------------------------------------------------------ lifetime */

static int device_count(int *count, char *why, size_t cap)
{
    /* Without a driver the count is left as it was: trust the status. */
    *count = 0;
    cudaError_t e = cudaGetDeviceCount(count);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, cap, "no CUDA device visible (cudaGetDeviceCount: %s)",
                 cudaGetErrorString(e));
        return LOOM_ERR_NOT_SUPPORTED;
    }
    if (*count < 1) {
        snprintf(why, cap, "no CUDA device visible (cudaGetDeviceCount: 0 devices)");
        return LOOM_ERR_NOT_SUPPORTED;
    }
    return LOOM_OK;
}

/* The device a local rank drives: its own, or shared round-robin. */
static int device_of(int local_rank, int count)
{
    return local_rank > 0 ? local_rank % count : 0;
}

/* LOOM_OK when device can run the backend (bf16 products need sm_80). */
static int device_fits(int device, char *why, size_t cap)
{
    struct cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, cap, "cannot read CUDA device %d's properties: %s", device,
                 cudaGetErrorString(e));
        return LOOM_ERR_NOT_SUPPORTED;
    }
    if (prop.major < MIN_SM_MAJOR) {
        snprintf(why, cap,
                 "CUDA device %d (%s) is sm_%d%d; the cuda backend needs sm_80 (Ampere) or newer "
                 "for its bf16 products",
                 device, prop.name, prop.major, prop.minor);
        return LOOM_ERR_NOT_SUPPORTED;
    }
    return LOOM_OK;
}

static int gpu_probe(const loom_host *host, char *why, size_t cap)
{
    int count = 0;
    int rc = device_count(&count, why, cap);
    if (rc != LOOM_OK)
        return rc;
    return device_fits(device_of(host ? host->local_rank : 0, count), why, cap);
}

/* A plan's descriptors released (whole or half made); its slot is free. */
static void plan_release(gemm_plan *p)
{
    if (p->op)
        cublasLtMatmulDescDestroy(p->op);
    for (int k = 0; k < 3; k++)
        if (p->layout[k])
            cublasLtMatrixLayoutDestroy(p->layout[k]);
    memset(p, 0, sizeof *p);
}

static void destroy_plans(loom_compute *c)
{
    for (int i = 0; i < GEMM_PLANS; i++)
        plan_release(&c->plans[i]);
}

static int gpu_destroy(loom_compute *c)
{
    if (!c)
        return LOOM_OK;
    int rc = LOOM_OK;
    if (c->ctx.stream) {
        (void)on_device(c);
        rc = wait_queue(c, "its work before destroy");
    }
    /* After a timeout a kernel may still use the buffers, and cudaFree
     * would wait for it without bound: they are left to the process's end. */
    int drained = rc != LOOM_ERR_TIMEOUT;
    destroy_plans(c);
    if (c->lt)
        cublasLtDestroy(c->lt);
    if (drained) {
        cudaFree(c->workspace);
        cudaFree(c->room);
        cudaFree(c->ctx.scratch);
        cudaFreeHost(c->ctx.host_scratch);
    }
    if (c->ctx.stream)
        cudaStreamDestroy(c->ctx.stream);
    if (c->zero_stream)
        cudaStreamDestroy(c->zero_stream);
    (void)cudaGetLastError();
    free(c);
    return rc;
}

/* compute.cuda's settings; a host without them (a test's) gets the defaults. */
static int read_settings(loom_compute *c)
{
    const loom_host *host = c->host;
    int tf32 = 0;
    double timeout_s = 300;
    int rc = host->config_bool ? host->config_bool(host, "tf32", &tf32) : LOOM_ERR_NOT_FOUND;
    if (rc == LOOM_ERR_NOT_FOUND)
        rc = LOOM_OK;
    int rc2 = host->config_float ? host->config_float(host, "timeout_s", &timeout_s)
                                 : LOOM_ERR_NOT_FOUND;
    if (rc2 == LOOM_ERR_NOT_FOUND)
        rc2 = LOOM_OK;
    if (rc != LOOM_OK || rc2 != LOOM_OK)
        return report(c, 0, rc != LOOM_OK ? rc : rc2,
                      "cuda: cannot read compute.cuda.%s: %s", rc != LOOM_OK ? "tf32" : "timeout_s",
                      loom_status_string(rc != LOOM_OK ? rc : rc2));
    if (!(timeout_s > 0) || !isfinite(timeout_s))
        return report(c, 0, LOOM_ERR_INVALID,
                      "cuda: compute.cuda.timeout_s = %g: give a number of seconds above 0",
                      timeout_s);
    c->tf32 = tf32 != 0;
    c->timeout_s = timeout_s;
    return LOOM_OK;
}

/* The device's name, capability, size and limits. */
static int read_device(loom_compute *c)
{
    struct cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, c->device);
    if (e != cudaSuccess)
        return cuda_failed(c, "cudaGetDeviceProperties", e);
    snprintf(c->device_name, sizeof c->device_name, "%s", prop.name);
    c->sm_major = prop.major;
    c->sm_minor = prop.minor;
    c->total_bytes = prop.totalGlobalMem;
    c->ctx.sm_count = prop.multiProcessorCount;
    int pitch = 0;
    if ((e = cudaDeviceGetAttribute(&pitch, cudaDevAttrMaxPitch, c->device)) != cudaSuccess)
        return cuda_failed(c, "cudaDeviceGetAttribute", e);
    c->max_pitch = pitch > 0 ? (size_t)pitch : 0;
    return LOOM_OK;
}

/* The stream, cuBLASLt and the scratch every call uses. */
static int make_resources(loom_compute *c)
{
    cudaError_t e = cudaStreamCreateWithFlags(&c->ctx.stream, cudaStreamNonBlocking);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&c->zero_stream, cudaStreamNonBlocking);
    if (e != cudaSuccess)
        return cuda_failed(c, "cudaStreamCreateWithFlags", e);
    cublasStatus_t s = cublasLtCreate(&c->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        c->lt = NULL;
        return report(c, 0, LOOM_ERR_INTERNAL, "cuda: cublasLtCreate: %s",
                      cublasLtGetStatusString(s));
    }
    if (cudaMalloc(&c->workspace, WORKSPACE_BYTES) != cudaSuccess)
        return out_of_memory(c, WORKSPACE_BYTES, " for cuBLASLt's workspace");
    if (cudaMalloc(&c->ctx.scratch, SCRATCH_BYTES) != cudaSuccess)
        return out_of_memory(c, SCRATCH_BYTES, " for the kernels' scratch");
    c->ctx.scratch_bytes = SCRATCH_BYTES;
    if ((e = cudaMallocHost(&c->ctx.host_scratch, HOST_SCRATCH_BYTES)) != cudaSuccess)
        return cuda_failed(c, "cudaMallocHost (pinned scratch)", e);
    return LOOM_OK;
}

static int gpu_create(const loom_host *host, const loom_compute_setup *setup, loom_compute **out)
{
    if (!out)
        return host->error(host, LOOM_ERR_INVALID, "cuda: create called without out");
    *out = NULL;
    size_t has_deterministic = offsetof(loom_compute_setup, deterministic) + sizeof(int);
    if (!setup || setup->struct_size < has_deterministic)
        return host->error(host, LOOM_ERR_INVALID,
                           "cuda: create called without a setup of ABI 1.9 (loom_compute_setup)");
    char why[256];
    int count = 0;
    if (device_count(&count, why, sizeof why) != LOOM_OK)
        return host->error(host, LOOM_ERR_NOT_SUPPORTED, "cuda: %s", why);
    const int device = device_of(setup->device, count);
    if (device_fits(device, why, sizeof why) != LOOM_OK)
        return host->error(host, LOOM_ERR_NOT_SUPPORTED, "cuda: %s", why);

    loom_compute *c = calloc(1, sizeof *c);
    if (!c)
        return host->error(host, LOOM_ERR_NO_MEMORY, "cuda: out of host memory creating it");
    c->host = host;
    c->device = device;
    c->device_count = count;
    c->ranks_sharing = host->local_size > count ? (host->local_size + count - 1) / count : 1;
    c->ctx.deterministic = setup->deterministic;
    c->multiply = setup->precision == LOOM_BF16 ? LOOM_BF16 : LOOM_F32;
    int rc = read_settings(c);
    if (rc == LOOM_OK)
        rc = launched(c, "cudaSetDevice", cudaSetDevice(device));
    if (rc == LOOM_OK)
        rc = read_device(c);
    if (rc == LOOM_OK)
        rc = make_resources(c);
    if (rc != LOOM_OK) {
        c->pending = LOOM_OK;
        gpu_destroy(c);
        return rc;
    }
    *out = c;
    return LOOM_OK;
}

static int gpu_describe(const loom_compute *c, char *buf, size_t cap)
{
    if (!buf || !cap)
        return LOOM_OK;
    char share[96] = "";
    if (c->ranks_sharing > 1)
        snprintf(share, sizeof share, ", device %d of %d shared by %d local ranks", c->device,
                 c->device_count, c->ranks_sharing);
    else if (c->device_count > 1)
        snprintf(share, sizeof share, ", device %d of %d", c->device, c->device_count);
    const char *products = c->multiply == LOOM_BF16 ? "bf16 products (f32 accumulation)"
                           : c->tf32                ? "f32 products in TF32"
                                                    : "fp32 products exact";
    snprintf(buf, cap, "cuda: %s (sm_%d%d, %d SMs, %.1f GiB)%s, cuBLASLt %zu, %s",
             c->device_name, c->sm_major, c->sm_minor, c->ctx.sm_count,
             (double)c->total_bytes / (double)((size_t)1 << 30), share, cublasLtGetVersion(),
             products);
    return LOOM_OK;
}

/* ------------------------------------------------------------ memory */

static int gpu_alloc(loom_compute *c, size_t bytes, void **out)
{
    CHECK_CALL(c, "alloc", out);
    *out = NULL;
    int rc = on_device(c);
    if (rc != LOOM_OK)
        return rc;
    const size_t size = bytes ? bytes : 1;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, size); /* aligned to 256 at least */
    if (e == cudaErrorMemoryAllocation)
        return out_of_memory(c, bytes, "");
    if (e != cudaSuccess)
        return cuda_failed(c, "alloc (cudaMalloc)", e);
    /* Zeroed on a stream of its own and waited for: the block is zero for
     * every stream (a communicator's too) when alloc returns, without
     * waiting for the kernels queued on the main stream. */
    e = cudaMemsetAsync(p, 0, size, c->zero_stream);
    rc = e == cudaSuccess ? wait_for(c, c->zero_stream, NULL, c->timeout_s, "alloc's zeroing")
                          : cuda_failed(c, "alloc (cudaMemsetAsync)", e);
    if (rc != LOOM_OK) {
        cudaFree(p);
        return rc;
    }
    *out = p;
    return LOOM_OK;
}

static int gpu_free(loom_compute *c, void *ptr)
{
    if (!ptr)
        return LOOM_OK;
    int rc = on_device(c);
    /* cudaFree waits for the device: bound that wait first */
    if (rc == LOOM_OK)
        rc = wait_queue(c, "the work before free");
    if (rc != LOOM_OK)
        return rc;
    cudaError_t e = cudaFree(ptr);
    if (e == cudaSuccess)
        return LOOM_OK;
    if (is_device_fault(e))
        return cuda_failed(c, "free", e);
    (void)cudaGetLastError();
    return report(c, 0, LOOM_ERR_INVALID,
                  "cuda: free of %p: %s (not a block this backend's alloc returned, or freed "
                  "already)",
                  ptr, cudaGetErrorString(e));
}

/* A device buffer of at least bytes for gemm's operand copies and copy's
 * bounce. Growing it frees the old one, which queued work may still read:
 * the queue drains first. */
static int room_for(loom_compute *c, size_t bytes, void **out)
{
    if (bytes > c->room_bytes) {
        int rc = wait_queue(c, "the work before the operand buffer grows");
        if (rc != LOOM_OK)
            return rc;
        cudaFree(c->room);
        c->room = NULL;
        c->room_bytes = 0;
        size_t want = bytes + bytes / 4; /* room for slightly larger products next */
        if (cudaMalloc(&c->room, want) != cudaSuccess) {
            c->room = NULL;
            return out_of_memory(c, want, " for the products' operand copies");
        }
        c->room_bytes = want;
    }
    *out = c->room;
    return LOOM_OK;
}

static int gpu_to_device(loom_compute *c, void *dst, const void *src, size_t bytes)
{
    CHECK_CALL(c, "to_device", !bytes || (dst && src));
    if (!bytes)
        return LOOM_OK;
    /* A copy from pageable memory may block the caller until the stream
     * reaches it: make that wait a bounded one first. */
    int rc = on_device(c);
    if (rc == LOOM_OK)
        rc = wait_queue(c, "the work before to_device");
    if (rc != LOOM_OK)
        return rc;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c->ctx.stream);
    if (e != cudaSuccess)
        return cuda_failed(c, "to_device (cudaMemcpyAsync)", e);
    return wait_queue(c, "to_device");
}

static int gpu_to_host(loom_compute *c, void *dst, const void *src, size_t bytes)
{
    CHECK_CALL(c, "to_host", !bytes || (dst && src));
    if (!bytes)
        return LOOM_OK;
    int rc = on_device(c);
    if (rc == LOOM_OK)
        rc = wait_queue(c, "the work before to_host");
    if (rc != LOOM_OK)
        return rc;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, c->ctx.stream);
    if (e != cudaSuccess)
        return cuda_failed(c, "to_host (cudaMemcpyAsync)", e);
    return wait_queue(c, "to_host");
}

static int overlap(const void *a, const void *b, size_t bytes)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y ? y - x < bytes : x - y < bytes;
}

static int gpu_copy(loom_compute *c, void *dst, const void *src, size_t bytes)
{
    CHECK_CALL(c, "copy", !bytes || (dst && src));
    if (!bytes || dst == src)
        return LOOM_OK;
    int rc = on_device(c);
    if (rc != LOOM_OK)
        return rc;
    cudaStream_t s = c->ctx.stream;
    if (!overlap(dst, src, bytes))
        return launched(c, "copy", cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
    /* cudaMemcpy's overlapping copies are undefined: through the room */
    void *room = NULL;
    if ((rc = room_for(c, bytes, &room)) != LOOM_OK)
        return rc;
    cudaError_t e = cudaMemcpyAsync(room, src, bytes, cudaMemcpyDefault, s);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(dst, room, bytes, cudaMemcpyDefault, s);
    return launched(c, "copy (overlapping)", e);
}

static int gpu_copy_rows(loom_compute *c, void *dst, size_t dst_pitch, const void *src,
                         size_t src_pitch, size_t row_bytes, size_t rows)
{
    CHECK_CALL(c, "copy_rows", !rows || !row_bytes || (dst && src));
    CHECK_CALL(c, "copy_rows", rows <= 1 || (row_bytes <= dst_pitch && row_bytes <= src_pitch));
    if (!rows || !row_bytes)
        return LOOM_OK;
    if (rows == 1 || (dst_pitch == row_bytes && src_pitch == row_bytes))
        return gpu_copy(c, dst, src, rows * row_bytes);
    int rc = on_device(c);
    if (rc != LOOM_OK)
        return rc;
    cudaStream_t s = c->ctx.stream;
    if (dst_pitch <= c->max_pitch && src_pitch <= c->max_pitch)
        return launched(c, "copy_rows (cudaMemcpy2DAsync)",
                        cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, rows,
                                          cudaMemcpyDefault, s));
    /* pitches beyond what 2D copies take: a copy per row */
    cudaError_t e = cudaSuccess;
    for (size_t r = 0; r < rows && e == cudaSuccess; r++)
        e = cudaMemcpyAsync((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch,
                            row_bytes, cudaMemcpyDefault, s);
    return launched(c, "copy_rows (cudaMemcpyAsync)", e);
}

static int gpu_zero(loom_compute *c, void *dst, size_t bytes)
{
    KERNEL(c, "zero", !bytes || dst,
           bytes ? cudaMemsetAsync(dst, 0, bytes, c->ctx.stream) : cudaSuccess);
}

/* ------------------------------------------------------------ the queue */

static int gpu_synchronize(loom_compute *c)
{
    int rc = on_device(c);
    if (rc == LOOM_OK)
        rc = wait_queue(c, "its queued work (synchronize)");
    return rc;
}

static int gpu_event_record(loom_compute *c, loom_compute_event **out)
{
    CHECK_CALL(c, "event_record", out);
    *out = NULL;
    int rc = on_device(c);
    if (rc != LOOM_OK)
        return rc;
    loom_compute_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return report(c, 0, LOOM_ERR_NO_MEMORY, "cuda: out of host memory for an event");
    cudaError_t e = cudaEventCreateWithFlags(&ev->event, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(ev);
        return cuda_failed(c, "event_record (cudaEventCreateWithFlags)", e);
    }
    if ((e = cudaEventRecord(ev->event, c->ctx.stream)) != cudaSuccess) {
        cudaEventDestroy(ev->event);
        free(ev);
        return cuda_failed(c, "event_record (cudaEventRecord)", e);
    }
    *out = ev;
    return LOOM_OK;
}

static int gpu_event_wait(loom_compute *c, loom_compute_event *ev, double timeout_s)
{
    CHECK_CALL(c, "event_wait", ev);
    return wait_for(c, NULL, ev->event, timeout_s > 0 ? timeout_s : c->timeout_s,
                    "the work before an event");
}

static void gpu_event_free(loom_compute *c, loom_compute_event *ev)
{
    (void)c;
    if (!ev)
        return;
    cudaEventDestroy(ev->event); /* pending work is fine: released when it completes */
    free(ev);
}

static int gpu_status(loom_compute *c)
{
    /* a fault of work issued since the last wait, without waiting */
    cudaError_t e = cudaStreamQuery(c->ctx.stream);
    if (e == cudaErrorNotReady)
        forget_not_ready();
    else if (e != cudaSuccess)
        cuda_failed(c, "queued work", e);
    if (c->pending == LOOM_OK)
        return LOOM_OK;
    int status = c->pending;
    c->pending = LOOM_OK;
    return c->host->error(c->host, status, "%s", c->pending_detail);
}

/* ------------------------------------------------------------ products */

/* The largest power of two (<= 256) dividing every batch member's address. */
static uint32_t alignment_of(const void *p, size_t stride_bytes, int batch)
{
    uintptr_t bits = (uintptr_t)p | 256u;
    if (batch > 1)
        bits |= (uintptr_t)stride_bytes;
    return (uint32_t)(bits & (~bits + 1));
}

/* One loom operand of a product: its stored rows x cols (row-major, ld
 * apart) and where its data is once in the product's dtype. */
typedef struct operand_view {
    const void *data;
    loom_dtype dtype;
    uint64_t stored_rows, stored_cols;
    int64_t ld;
    size_t stride; /* elements between batch members */
    int transposed;
} operand_view;

static operand_view view_of(loom_compute_operand x, int rows, int cols, size_t stride)
{
    operand_view v = {x.data, x.dtype, (uint64_t)(x.transposed ? cols : rows),
                      (uint64_t)(x.transposed ? rows : cols), x.ld, stride, x.transposed};
    if (v.stored_rows <= 1 && v.ld < (int64_t)v.stored_cols)
        v.ld = (int64_t)v.stored_cols; /* one row: its ld is never used */
    return v;
}

/* Elements from the first member's first element to the last's last. */
static size_t span_of(const operand_view *v, int batch)
{
    return (size_t)(batch - 1) * v->stride + (size_t)(v->stored_rows - 1) * (size_t)v->ld +
           (size_t)v->stored_cols;
}

/* The operands not already in the product's dtype are converted (their
 * whole span, gaps included, so ld and stride stay) into the room. */
static int convert_operands(loom_compute *c, operand_view *v[2], loom_dtype multiply, int batch)
{
    const size_t out_size = multiply == LOOM_BF16 ? 2 : 4;
    size_t offset[2] = {0, 0}, total = 0;
    for (int i = 0; i < 2; i++) {
        if (v[i]->dtype == multiply)
            continue;
        offset[i] = total;
        total += (span_of(v[i], batch) * out_size + 255) / 256 * 256;
    }
    if (!total)
        return LOOM_OK;
    void *room = NULL;
    int rc = room_for(c, total, &room);
    for (int i = 0; i < 2 && rc == LOOM_OK; i++) {
        if (v[i]->dtype == multiply)
            continue;
        char *dst = (char *)room + offset[i];
        cuda_dtype from = v[i]->dtype == LOOM_BF16 ? CUDA_DTYPE_BF16 : CUDA_DTYPE_F32;
        cuda_dtype to = multiply == LOOM_BF16 ? CUDA_DTYPE_BF16 : CUDA_DTYPE_F32;
        rc = launched(c, "gemm (operand conversion)",
                      cuda_convert(&c->ctx, dst, to, v[i]->data, from, span_of(v[i], batch)));
        v[i]->data = dst;
        v[i]->dtype = multiply;
    }
    return rc;
}

/* An operand as cuBLASLt's column-major matrix: the transpose of what is
 * stored, so rows and cols swap. */
static lt_matrix lt_operand(const operand_view *v, int batch)
{
    const size_t es = v->dtype == LOOM_BF16 ? 2 : 4;
    lt_matrix m = {v->stored_cols, v->stored_rows, v->ld, (int64_t)v->stride,
                   v->dtype == LOOM_BF16 ? CUDA_R_16BF : CUDA_R_32F, v->transposed,
                   alignment_of(v->data, v->stride * es, batch), 0};
    return m;
}

/* "bf16 product 768x2304x512 (batch 1)": what a failure names. */
static const char *product_text(char *buf, size_t cap, loom_dtype multiply, int M, int N, int K,
                                int batch)
{
    snprintf(buf, cap, "%s product %dx%dx%d (batch %d)", loom_dtype_name(multiply), M, N, K,
             batch);
    return buf;
}

static int lt_failed(loom_compute *c, const char *call, cublasStatus_t s, const char *product)
{
    return report(c, 1, LOOM_ERR_INTERNAL, "cuda: gemm: %s: %s (%s)", call,
                  cublasLtGetStatusString(s), product);
}

static cublasStatus_t layout_create(cublasLtMatrixLayout_t *out, const lt_matrix *m, int32_t batch)
{
    cublasStatus_t s = cublasLtMatrixLayoutCreate(out, (cudaDataType_t)m->type, m->rows, m->cols,
                                                  m->ld);
    if (s == CUBLAS_STATUS_SUCCESS && batch > 1)
        s = cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                             sizeof batch);
    if (s == CUBLAS_STATUS_SUCCESS && batch > 1)
        s = cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                             &m->stride, sizeof m->stride);
    return s;
}

/* cuBLASLt's best algorithm for the plan's shape, within our workspace
 * and for operands only as aligned as they are. */
static cublasStatus_t choose_algorithm(loom_compute *c, gemm_plan *p, const char **call)
{
    cublasLtMatmulPreference_t pref = NULL;
    cublasStatus_t s = cublasLtMatmulPreferenceCreate(&pref);
    uint64_t workspace = WORKSPACE_BYTES;
    const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &workspace, sizeof workspace);
    for (int k = 0; k < 4 && s == CUBLAS_STATUS_SUCCESS; k++) {
        uint32_t align = p->key.m[k < 3 ? k : 2].align;
        s = cublasLtMatmulPreferenceSetAttribute(pref, align_attr[k], &align, sizeof align);
    }
    /* A deterministic run keeps split-K sums out of the output buffer,
     * where the parts could be added in whatever order they finish. */
    uint32_t schemes =
        CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
    if (s == CUBLAS_STATUS_SUCCESS && c->ctx.deterministic)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                 &schemes, sizeof schemes);
    *call = "cublasLtMatmulPreferenceSetAttribute";
    cublasLtMatmulHeuristicResult_t result;
    memset(&result, 0, sizeof result);
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS) {
        *call = "cublasLtMatmulAlgoGetHeuristic";
        s = cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->layout[0], p->layout[1], p->layout[2],
                                           p->layout[2], pref, 1, &result, &found);
    }
    if (s == CUBLAS_STATUS_SUCCESS && (found < 1 || result.state != CUBLAS_STATUS_SUCCESS))
        s = CUBLAS_STATUS_NOT_SUPPORTED;
    if (s == CUBLAS_STATUS_SUCCESS)
        p->algo = result.algo;
    if (pref)
        cublasLtMatmulPreferenceDestroy(pref);
    return s;
}

/* The descriptors and algorithm of key's product, made into slot p. A bf16
 * shape cuBLASLt has no algorithm for is remembered as such and returns
 * LOOM_ERR_NOT_SUPPORTED unreported: the caller runs it widened. */
static int plan_create(loom_compute *c, gemm_plan *p, const gemm_key *key, const char *product)
{
    p->key = *key;
    p->used = 1;
    const char *call = "cublasLtMatmulDescCreate";
    cublasStatus_t s = cublasLtMatmulDescCreate(&p->op, (cublasComputeType_t)key->compute,
                                                CUDA_R_32F);
    const cublasLtMatmulDescAttributes_t trans_attr[2] = {CUBLASLT_MATMUL_DESC_TRANSA,
                                                          CUBLASLT_MATMUL_DESC_TRANSB};
    for (int k = 0; k < 2 && s == CUBLAS_STATUS_SUCCESS; k++) {
        cublasOperation_t op = key->m[k].transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
        call = "cublasLtMatmulDescSetAttribute";
        s = cublasLtMatmulDescSetAttribute(p->op, trans_attr[k], &op, sizeof op);
    }
    for (int k = 0; k < 3 && s == CUBLAS_STATUS_SUCCESS; k++) {
        call = "cublasLtMatrixLayoutCreate";
        s = layout_create(&p->layout[k], &key->m[k], key->batch);
    }
    if (s == CUBLAS_STATUS_SUCCESS)
        s = choose_algorithm(c, p, &call);
    if (s == CUBLAS_STATUS_SUCCESS)
        return LOOM_OK;
    const int widen = s == CUBLAS_STATUS_NOT_SUPPORTED && key->m[0].type == CUDA_R_16BF &&
                      !strcmp(call, "cublasLtMatmulAlgoGetHeuristic");
    int rc = widen ? LOOM_ERR_NOT_SUPPORTED : lt_failed(c, call, s, product);
    plan_release(p);
    if (widen) {
        p->key = *key;
        p->used = 1;
        p->no_algorithm = 1;
    }
    return rc;
}

/* key's plan: remembered, or made into a free slot (or the oldest). */
static int plan_for(loom_compute *c, const gemm_key *key, const char *product, gemm_plan **out)
{
    for (int i = 0; i < GEMM_PLANS; i++)
        if (c->plans[i].used && !memcmp(&c->plans[i].key, key, sizeof *key)) {
            *out = &c->plans[i];
            return c->plans[i].no_algorithm ? LOOM_ERR_NOT_SUPPORTED : LOOM_OK;
        }
    gemm_plan *p = &c->plans[c->next_plan];
    c->next_plan = (c->next_plan + 1) % GEMM_PLANS;
    plan_release(p);
    *out = p;
    return plan_create(c, p, key, product);
}

/* c = beta c of a product with nothing to sum (K = 0), as the cpu's loom_gemm:
 * zero when beta is 0, untouched otherwise. */
static int empty_product(loom_compute *c, float *out, int ldc, int M, int N, float beta, int batch,
                         size_t stride_out)
{
    if (beta != 0.0f)
        return LOOM_OK;
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < batch && e == cudaSuccess; i++)
        e = cudaMemset2DAsync(out + (size_t)i * stride_out, (size_t)ldc * sizeof(float), 0,
                              (size_t)N * sizeof(float), (size_t)M, c->ctx.stream);
    return launched(c, "gemm (an empty product)", e);
}

/* What cuBLASLt is asked for: C^T (N, M) = B^T A^T, loom's b first. */
static gemm_key product_key(const loom_compute *c, float *out, int ldc, int M, int N,
                            const operand_view *a, const operand_view *b, loom_dtype multiply,
                            int batch, size_t stride_out)
{
    gemm_key key;
    memset(&key, 0, sizeof key);
    key.m[0] = lt_operand(b, batch);
    key.m[1] = lt_operand(a, batch);
    key.m[2] = (lt_matrix){(uint64_t)N, (uint64_t)M, M > 1 ? ldc : (ldc > N ? ldc : N),
                           (int64_t)stride_out, CUDA_R_32F, 0,
                           alignment_of(out, stride_out * sizeof(float), batch), 0};
    key.batch = batch;
    key.compute = multiply == LOOM_F32 && c->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                   : CUBLAS_COMPUTE_32F;
    return key;
}

/* The product on cuBLASLt, its operands already in the dtype it multiplies. */
static int run_product(loom_compute *c, float *out, int ldc, int M, int N, int K,
                       const operand_view *a, const operand_view *b, float alpha, float beta,
                       loom_dtype multiply, int batch, size_t stride_out)
{
    char product[96];
    product_text(product, sizeof product, multiply, M, N, K, batch);
    const gemm_key key = product_key(c, out, ldc, M, N, a, b, multiply, batch, stride_out);
    gemm_plan *p = NULL;
    int rc = plan_for(c, &key, product, &p);
    if (rc != LOOM_OK)
        return rc;
    cublasStatus_t s = cublasLtMatmul(c->lt, p->op, &alpha, b->data, p->layout[0], a->data,
                                      p->layout[1], &beta, out, p->layout[2], out, p->layout[2],
                                      &p->algo, c->workspace, WORKSPACE_BYTES, c->ctx.stream);
    if (s != CUBLAS_STATUS_SUCCESS)
        return lt_failed(c, "cublasLtMatmul", s, product);
    return LOOM_OK;
}

/* A bf16 product cuBLASLt has no algorithm for (a leading dimension it
 * cannot take, say): bf16 values multiply exactly in fp32 (and in TF32),
 * so the same products run in f32 on f32 copies of the bf16-rounded
 * operands, summed in fp32 as the bf16 product would be. */
static int widened_product(loom_compute *c, float *out, int ldc, int M, int N, int K,
                           operand_view *a, operand_view *b, float alpha, float beta, int batch,
                           size_t stride_out)
{
    operand_view *v[2] = {a, b};
    size_t span[2], rounded[2], widened[2], total = 0;
    for (int i = 0; i < 2; i++) {
        span[i] = span_of(v[i], batch);
        rounded[i] = total; /* an f32 operand rounded to bf16 first */
        if (v[i]->dtype == LOOM_F32)
            total += (span[i] * 2 + 255) / 256 * 256;
        widened[i] = total;
        total += (span[i] * 4 + 255) / 256 * 256;
    }
    void *room = NULL;
    int rc = room_for(c, total, &room);
    for (int i = 0; i < 2 && rc == LOOM_OK; i++) {
        const void *bf16 = v[i]->data;
        cudaError_t e = cudaSuccess;
        if (v[i]->dtype == LOOM_F32) {
            void *dst = (char *)room + rounded[i];
            e = cuda_convert(&c->ctx, dst, CUDA_DTYPE_BF16, v[i]->data, CUDA_DTYPE_F32, span[i]);
            bf16 = dst;
        }
        void *f32 = (char *)room + widened[i];
        if (e == cudaSuccess)
            e = cuda_convert(&c->ctx, f32, CUDA_DTYPE_F32, bf16, CUDA_DTYPE_BF16, span[i]);
        rc = launched(c, "gemm (widened operand conversion)", e);
        v[i]->data = f32;
        v[i]->dtype = LOOM_F32;
    }
    if (rc != LOOM_OK)
        return rc;
    return run_product(c, out, ldc, M, N, K, a, b, alpha, beta, LOOM_F32, batch, stride_out);
}

static int gpu_gemm(loom_compute *c, float *out, int ldc, int M, int N, int K,
                    loom_compute_operand a, loom_compute_operand b, float alpha, float beta,
                    loom_dtype multiply, int batch, size_t stride_a, size_t stride_b,
                    size_t stride_out)
{
    CHECK_CALL(c, "gemm", M >= 0 && N >= 0 && K >= 0 && batch >= 0);
    CHECK_CALL(c, "gemm", !M || !N || !batch || (out && (!K || (a.data && b.data))));
    if (!M || !N || !batch)
        return LOOM_OK;
    CHECK_CALL(c, "gemm", M <= 1 || ldc >= N);
    int rc = on_device(c);
    if (rc != LOOM_OK)
        return rc;
    if (!K)
        return empty_product(c, out, ldc, M, N, beta, batch, stride_out);
    if ((a.dtype != LOOM_F32 && a.dtype != LOOM_BF16) ||
        (b.dtype != LOOM_F32 && b.dtype != LOOM_BF16))
        return report(c, 0, LOOM_ERR_INVALID,
                      "cuda: gemm called with %s x %s operands; products take f32 or bf16",
                      loom_dtype_name(a.dtype), loom_dtype_name(b.dtype));
    operand_view va = view_of(a, M, K, stride_a), vb = view_of(b, K, N, stride_b);
    CHECK_CALL(c, "gemm", va.ld >= (int64_t)va.stored_cols && vb.ld >= (int64_t)vb.stored_cols);
    multiply = multiply == LOOM_BF16 ? LOOM_BF16 : LOOM_F32;
    operand_view *both[2] = {&va, &vb};
    if ((rc = convert_operands(c, both, multiply, batch)) != LOOM_OK)
        return rc;
    rc = run_product(c, out, ldc, M, N, K, &va, &vb, alpha, beta, multiply, batch, stride_out);
    if (rc != LOOM_ERR_NOT_SUPPORTED)
        return rc;
    va = view_of(a, M, K, stride_a);
    vb = view_of(b, K, N, stride_b);
    return widened_product(c, out, ldc, M, N, K, &va, &vb, alpha, beta, batch, stride_out);
}

static loom_dtype gpu_multiply_dtype(loom_compute *c, loom_dtype precision)
{
    (void)c; /* every device the backend runs on (sm_80+) multiplies bf16 */
    return precision == LOOM_BF16 ? LOOM_BF16 : LOOM_F32;
}

/* The matmul ops are the cpu backend's (kernels.c) products: the weight
 * (OC, C) as it is stored, f32 or bf16, and the run's multiply dtype. */
static int gpu_matmul_forward(loom_compute *c, float *out, const float *inp,
                              loom_compute_weight weight, const float *bias, int N, int C, int OC)
{
    CHECK_CALL(c, "matmul_forward", N >= 0 && C >= 0 && OC >= 0);
    CHECK_CALL(c, "matmul_forward", !N || !OC || (out && inp && weight.data));
    /* out (N, OC) = inp (N, C) . weight^T, then the bias on each row */
    loom_compute_operand x = {inp, LOOM_F32, C, 0}, w = {weight.data, weight.dtype, C, 1};
    int rc = gpu_gemm(c, out, OC, N, OC, C, x, w, 1.0f, 0.0f, c->multiply, 1, 0, 0, 0);
    if (rc != LOOM_OK || !bias || !N || !OC)
        return rc;
    return launched(c, "matmul_forward (bias)", cuda_bias_forward(&c->ctx, out, bias, N, OC));
}

static int gpu_matmul_backward_input(loom_compute *c, float *dinp, const float *dout,
                                     loom_compute_weight weight, int N, int C, int OC)
{
    CHECK_CALL(c, "matmul_backward_input", N >= 0 && C >= 0 && OC >= 0);
    CHECK_CALL(c, "matmul_backward_input", !N || !C || (dinp && dout && weight.data));
    /* dinp (N, C) += dout (N, OC) . weight (OC, C) */
    loom_compute_operand d = {dout, LOOM_F32, OC, 0}, w = {weight.data, weight.dtype, C, 0};
    return gpu_gemm(c, dinp, C, N, C, OC, d, w, 1.0f, 1.0f, c->multiply, 1, 0, 0, 0);
}

static int gpu_matmul_backward_weight(loom_compute *c, float *dweight, float *dbias,
                                      const float *dout, const float *inp, int N, int C, int OC)
{
    CHECK_CALL(c, "matmul_backward_weight", N >= 0 && C >= 0 && OC >= 0);
    CHECK_CALL(c, "matmul_backward_weight", !OC || (dweight && dout && inp));
    /* dweight (OC, C) += dout^T (OC, N) . inp (N, C) */
    loom_compute_operand d = {dout, LOOM_F32, OC, 1}, x = {inp, LOOM_F32, C, 0};
    int rc = gpu_gemm(c, dweight, C, OC, C, N, d, x, 1.0f, 1.0f, c->multiply, 1, 0, 0, 0);
    if (rc != LOOM_OK || !dbias || !N || !OC)
        return rc;
    return launched(c, "matmul_backward_weight (bias)",
                    cuda_bias_backward(&c->ctx, dbias, dout, N, OC));
}

/* ------------------------------------------------------------ the embedding */

static int gpu_encoder_forward(loom_compute *c, float *out, const int *inp, const int *pos,
                               const float *wte, const float *wpe, int B, int T, int C)
{
    KERNEL(c, "encoder_forward",
           B >= 0 && T >= 0 && C >= 0 && (!B || !T || (out && inp && wte && wpe)),
           cuda_encoder_forward(&c->ctx, out, inp, pos, wte, wpe, B, T, C));
}

static int gpu_encoder_backward(loom_compute *c, float *dwte, float *dwpe, const float *dout,
                                const int *inp, const int *pos, int B, int T, int C)
{
    KERNEL(c, "encoder_backward",
           B >= 0 && T >= 0 && C >= 0 && (!B || !T || (dwte && dwpe && dout && inp)),
           cuda_encoder_backward(&c->ctx, dwte, dwpe, dout, inp, pos, B, T, C));
}

static int gpu_embedding_rows_forward(loom_compute *c, float *out, const int *tok, int v0,
                                      int rows, const float *wte, int N, int C)
{
    KERNEL(c, "embedding_rows_forward",
           N >= 0 && C >= 0 && rows >= 0 && (!N || (out && tok && (wte || !rows))),
           cuda_embedding_rows_forward(&c->ctx, out, tok, v0, rows, wte, N, C));
}

static int gpu_embedding_rows_backward(loom_compute *c, float *dwte, const float *dout,
                                       const int *tok, int v0, int rows, int N, int C)
{
    KERNEL(c, "embedding_rows_backward",
           N >= 0 && C >= 0 && rows >= 0 && (!N || (dout && tok && (dwte || !rows))),
           cuda_embedding_rows_backward(&c->ctx, dwte, dout, tok, v0, rows, N, C));
}

static int gpu_position_forward(loom_compute *c, float *x, const float *wpe, const int *pos,
                                int R, int C)
{
    KERNEL(c, "position_forward", R >= 0 && C >= 0 && (!R || (x && wpe && pos)),
           cuda_position_forward(&c->ctx, x, wpe, pos, R, C));
}

static int gpu_position_backward(loom_compute *c, float *dwpe, const float *dx, const int *pos,
                                 int R, int C)
{
    KERNEL(c, "position_backward", R >= 0 && C >= 0 && (!R || (dwpe && dx && pos)),
           cuda_position_backward(&c->ctx, dwpe, dx, pos, R, C));
}

/* ------------------------------------------------------------ LayerNorm, residual, bias, GELU */

static int gpu_layernorm_forward(loom_compute *c, float *out, float *mean, float *rstd,
                                 const float *inp, const float *weight, const float *bias, int N,
                                 int C)
{
    KERNEL(c, "layernorm_forward",
           N >= 0 && C >= 0 && (!N || (out && mean && rstd && inp && weight && bias)),
           cuda_layernorm_forward(&c->ctx, out, mean, rstd, inp, weight, bias, N, C));
}

static int gpu_residual_layernorm_forward(loom_compute *c, float *res, float *out, float *mean,
                                          float *rstd, const float *a, const float *b,
                                          const float *weight, const float *bias, int N, int C)
{
    KERNEL(c, "residual_layernorm_forward",
           N >= 0 && C >= 0 && (!N || (res && out && mean && rstd && a && b && weight && bias)),
           cuda_residual_layernorm_forward(&c->ctx, res, out, mean, rstd, a, b, weight, bias, N,
                                           C));
}

static int gpu_layernorm_backward_input(loom_compute *c, float *dinp, const float *dout,
                                        const float *inp, const float *weight, const float *mean,
                                        const float *rstd, int N, int C)
{
    KERNEL(c, "layernorm_backward_input",
           N >= 0 && C >= 0 && (!N || (dinp && dout && inp && weight && mean && rstd)),
           cuda_layernorm_backward_input(&c->ctx, dinp, dout, inp, weight, mean, rstd, N, C));
}

static int gpu_layernorm_backward_weight(loom_compute *c, float *dweight, float *dbias,
                                         const float *dout, const float *inp, const float *mean,
                                         const float *rstd, int N, int C)
{
    KERNEL(c, "layernorm_backward_weight",
           N >= 0 && C >= 0 && (!C || (dweight && dbias && (!N || (dout && inp && mean && rstd)))),
           cuda_layernorm_backward_weight(&c->ctx, dweight, dbias, dout, inp, mean, rstd, N, C));
}

static int gpu_residual_forward(loom_compute *c, float *out, const float *a, const float *b,
                                size_t n)
{
    KERNEL(c, "residual_forward", !n || (out && a && b),
           cuda_residual_forward(&c->ctx, out, a, b, n));
}

static int gpu_bias_forward(loom_compute *c, float *x, const float *bias, int rows, int C)
{
    KERNEL(c, "bias_forward", rows >= 0 && C >= 0 && (!rows || !C || (x && bias)),
           cuda_bias_forward(&c->ctx, x, bias, rows, C));
}

static int gpu_bias_backward(loom_compute *c, float *dbias, const float *dout, int rows, int C)
{
    KERNEL(c, "bias_backward", rows >= 0 && C >= 0 && (!rows || !C || (dbias && dout)),
           cuda_bias_backward(&c->ctx, dbias, dout, rows, C));
}

static int gpu_bias_gelu_forward(loom_compute *c, float *out, float *pre, const float *bias,
                                 int N, int C)
{
    KERNEL(c, "bias_gelu_forward", N >= 0 && C >= 0 && (!N || !C || (out && pre && bias)),
           cuda_bias_gelu_forward(&c->ctx, out, pre, bias, N, C));
}

static int gpu_gelu_backward(loom_compute *c, float *dinp, const float *inp, const float *dout,
                             size_t n)
{
    KERNEL(c, "gelu_backward", !n || (dinp && inp && dout),
           cuda_gelu_backward(&c->ctx, dinp, inp, dout, n));
}

/* ------------------------------------------------------------ attention */

/* The kernels tile a head's channels in shared memory, up to 256 of them. */
static int head_fits(loom_compute *c, const char *op, int HS)
{
    if (HS <= 256)
        return LOOM_OK;
    return report(c, 0, LOOM_ERR_NOT_SUPPORTED,
                  "cuda: %s: heads of %d channels, but the attention kernels take at most 256 "
                  "(model.channels / model.heads); use more heads",
                  op, HS);
}

static int gpu_attention_forward(loom_compute *c, const void *q, const int *q_pos, int tq,
                                 const void *k, const void *v, const int *k_pos, int tk, int B,
                                 int NH, int HS, loom_dtype dtype, void *out, float *lse,
                                 int first_block)
{
    cuda_dtype t = CUDA_DTYPE_F32;
    int rc = dtype_of(c, "attention_forward", dtype, &t);
    if (rc == LOOM_OK)
        rc = head_fits(c, "attention_forward", HS);
    if (rc != LOOM_OK)
        return rc;
    KERNEL(c, "attention_forward",
           tq >= 0 && tk >= 0 && B >= 0 && NH >= 0 && HS >= 0 &&
               (!tq || !B || !NH || (q && k && v && out && lse)),
           cuda_attention_forward(&c->ctx, q, q_pos, tq, k, v, k_pos, tk, B, NH, HS, t, out, lse,
                                  first_block));
}

static int gpu_attention_backward(loom_compute *c, const void *q, const int *q_pos, int tq,
                                  const void *k, const void *v, const int *k_pos, int tk, int B,
                                  int NH, int HS, loom_dtype dtype, const void *out,
                                  const void *dout, const float *lse, void *dq, void *dk,
                                  void *dv)
{
    cuda_dtype t = CUDA_DTYPE_F32;
    int rc = dtype_of(c, "attention_backward", dtype, &t);
    if (rc == LOOM_OK)
        rc = head_fits(c, "attention_backward", HS);
    if (rc != LOOM_OK)
        return rc;
    KERNEL(c, "attention_backward",
           tq >= 0 && tk >= 0 && B >= 0 && NH >= 0 && HS >= 0 &&
               (!tq || !B || !NH || (q && k && v && out && dout && lse && dq && dk && dv)),
           cuda_attention_backward(&c->ctx, q, q_pos, tq, k, v, k_pos, tk, B, NH, HS, t, out,
                                   dout, lse, dq, dk, dv));
}

/* ------------------------------------------------------------ the loss */

static int gpu_crossentropy_forward(loom_compute *c, float *losses, float *lse,
                                    const float *logits, const int *targets, int N, int V, int Vp)
{
    KERNEL(c, "crossentropy_forward",
           N >= 0 && V >= 0 && Vp >= V && (!N || (losses && lse && logits && targets)),
           cuda_crossentropy_forward(&c->ctx, losses, lse, logits, targets, N, V, Vp));
}

static int gpu_crossentropy_backward(loom_compute *c, float *logits, const float *dlosses,
                                     const float *lse, const int *targets, int N, int V, int Vp)
{
    KERNEL(c, "crossentropy_backward",
           N >= 0 && V >= 0 && Vp >= V && (!N || (logits && dlosses && lse && targets)),
           cuda_crossentropy_backward(&c->ctx, logits, dlosses, lse, targets, N, V, Vp));
}

static int gpu_crossentropy_slice_max(loom_compute *c, float *max, const float *logits, int N,
                                      int width, int real)
{
    KERNEL(c, "crossentropy_slice_max",
           N >= 0 && real >= 0 && width >= real && (!N || (max && (logits || !real))),
           cuda_crossentropy_slice_max(&c->ctx, max, logits, N, width, real));
}

static int gpu_crossentropy_slice_sums(loom_compute *c, float *sum, float *target,
                                       const float *logits, const float *max, const int *targets,
                                       int v0, int N, int width, int real)
{
    KERNEL(c, "crossentropy_slice_sums",
           N >= 0 && real >= 0 && width >= real &&
               (!N || (sum && target && max && targets && (logits || !real))),
           cuda_crossentropy_slice_sums(&c->ctx, sum, target, logits, max, targets, v0, N, width,
                                        real));
}

static int gpu_crossentropy_slice_finish(loom_compute *c, float *lse, float *losses,
                                         const float *max, const float *sum, const float *target,
                                         int N)
{
    KERNEL(c, "crossentropy_slice_finish",
           N >= 0 && (!N || (lse && losses && max && sum && target)),
           cuda_crossentropy_slice_finish(&c->ctx, lse, losses, max, sum, target, N));
}

static int gpu_crossentropy_slice_backward(loom_compute *c, float *logits, const float *dlosses,
                                           const float *lse, const int *targets, int v0, int N,
                                           int width, int real)
{
    KERNEL(c, "crossentropy_slice_backward",
           N >= 0 && real >= 0 && width >= real &&
               (!N || (dlosses && lse && targets && (logits || !width))),
           cuda_crossentropy_slice_backward(&c->ctx, logits, dlosses, lse, targets, v0, N, width,
                                            real));
}

/* The ops with a result in host memory: their launchers wait for the
 * stream without a bound, so the work before them is waited for here
 * first, boundedly; the launcher then waits only for its own kernels. */
static int before_host_result(loom_compute *c, const char *what)
{
    int rc = on_device(c);
    return rc != LOOM_OK ? rc : wait_queue(c, what);
}

static int gpu_mean(loom_compute *c, const float *x, size_t n, float *mean)
{
    CHECK_CALL(c, "mean", mean && (!n || x));
    if (!n) {
        *mean = NAN; /* 0 / 0, as the cpu backend's */
        return LOOM_OK;
    }
    int rc = before_host_result(c, "the work before mean");
    return rc != LOOM_OK ? rc : launched(c, "mean", cuda_mean(&c->ctx, x, n, mean));
}

/* ------------------------------------------------------------ the optimizer and the norm */

static int gpu_adamw(loom_compute *c, const loom_compute_adamw *step, float *master,
                     const void *grad, loom_dtype grad_dtype, float *m, float *v, size_t n,
                     void *params, loom_dtype params_dtype)
{
    CHECK_CALL(c, "adamw", step && (!n || (master && grad && m && v)));
    cuda_dtype g = CUDA_DTYPE_F32, p = CUDA_DTYPE_F32;
    int rc = dtype_of(c, "adamw", grad_dtype, &g);
    if (rc == LOOM_OK && params)
        rc = dtype_of(c, "adamw", params_dtype, &p);
    if (rc == LOOM_OK)
        rc = on_device(c);
    if (rc != LOOM_OK)
        return rc;
    const cuda_adamw s = {step->step,  step->lr,           step->beta1,     step->beta2,
                          step->eps,   step->weight_decay, step->grad_scale};
    return launched(c, "adamw",
                    cuda_adamw_update(&c->ctx, &s, master, grad, g, m, v, n, params, p));
}

static int gpu_sum_squares(loom_compute *c, const void *x, loom_dtype dtype, size_t n,
                           double *sum)
{
    CHECK_CALL(c, "sum_squares", sum && (!n || x));
    cuda_dtype t = CUDA_DTYPE_F32;
    int rc = dtype_of(c, "sum_squares", dtype, &t);
    if (rc != LOOM_OK || !n)
        return rc;
    if ((rc = before_host_result(c, "the work before sum_squares")) != LOOM_OK)
        return rc;
    return launched(c, "sum_squares", cuda_sum_squares(&c->ctx, x, t, n, sum));
}

static int gpu_count_nonfinite(loom_compute *c, const void *x, loom_dtype dtype, size_t n,
                               size_t *count)
{
    CHECK_CALL(c, "count_nonfinite", count && (!n || x));
    cuda_dtype t = CUDA_DTYPE_F32;
    int rc = dtype_of(c, "count_nonfinite", dtype, &t);
    if (rc != LOOM_OK)
        return rc;
    *count = 0;
    if (!n)
        return LOOM_OK;
    if ((rc = before_host_result(c, "the work before count_nonfinite")) != LOOM_OK)
        return rc;
    return launched(c, "count_nonfinite", cuda_count_nonfinite(&c->ctx, x, t, n, count));
}

static int gpu_scale(loom_compute *c, float *x, float s, size_t n)
{
    KERNEL(c, "scale", !n || x, cuda_scale(&c->ctx, x, s, n));
}

/* ------------------------------------------------------------ conversions */

static int gpu_convert(loom_compute *c, void *dst, loom_dtype dst_type, const void *src,
                       loom_dtype src_type, size_t n)
{
    cuda_dtype to = CUDA_DTYPE_F32, from = CUDA_DTYPE_F32;
    int rc = dtype_of(c, "convert", dst_type, &to);
    if (rc == LOOM_OK)
        rc = dtype_of(c, "convert", src_type, &from);
    if (rc != LOOM_OK)
        return rc;
    KERNEL(c, "convert", !n || (dst && src), cuda_convert(&c->ctx, dst, to, src, from, n));
}

static int gpu_accumulate(loom_compute *c, void *dst, loom_dtype dst_type, float *src, size_t n)
{
    cuda_dtype to = CUDA_DTYPE_F32;
    int rc = dtype_of(c, "accumulate", dst_type, &to);
    if (rc != LOOM_OK)
        return rc;
    KERNEL(c, "accumulate", !n || (dst && src), cuda_accumulate(&c->ctx, dst, to, src, n));
}

static void *gpu_native_queue(loom_compute *c)
{
    return (void *)c->ctx.stream;
}

LOOM_PLUGIN_EXPORT const loom_compute_plugin_v1_t loom_compute_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_COMPUTE, loom_compute_plugin_v1_t, "cuda",
                                 "the model's kernels on an NVIDIA GPU (sm_80+; cuBLASLt products)",
                                 cuda_settings),
    .tier = LOOM_TIER_DEVICE,
    .mem_kind = LOOM_MEM_DEVICE,
    .probe = gpu_probe,
    .create = gpu_create,
    .destroy = gpu_destroy,
    .describe = gpu_describe,
    .alloc = gpu_alloc,
    .free = gpu_free,
    .to_device = gpu_to_device,
    .to_host = gpu_to_host,
    .copy = gpu_copy,
    .copy_rows = gpu_copy_rows,
    .zero = gpu_zero,
    .synchronize = gpu_synchronize,
    .event_record = gpu_event_record,
    .event_wait = gpu_event_wait,
    .event_free = gpu_event_free,
    .status = gpu_status,
    .gemm = gpu_gemm,
    .multiply_dtype = gpu_multiply_dtype,
    .matmul_forward = gpu_matmul_forward,
    .matmul_backward_input = gpu_matmul_backward_input,
    .matmul_backward_weight = gpu_matmul_backward_weight,
    .encoder_forward = gpu_encoder_forward,
    .encoder_backward = gpu_encoder_backward,
    .embedding_rows_forward = gpu_embedding_rows_forward,
    .embedding_rows_backward = gpu_embedding_rows_backward,
    .position_forward = gpu_position_forward,
    .position_backward = gpu_position_backward,
    .layernorm_forward = gpu_layernorm_forward,
    .residual_layernorm_forward = gpu_residual_layernorm_forward,
    .layernorm_backward_input = gpu_layernorm_backward_input,
    .layernorm_backward_weight = gpu_layernorm_backward_weight,
    .residual_forward = gpu_residual_forward,
    .bias_forward = gpu_bias_forward,
    .bias_backward = gpu_bias_backward,
    .bias_gelu_forward = gpu_bias_gelu_forward,
    .gelu_backward = gpu_gelu_backward,
    .attention_forward = gpu_attention_forward,
    .attention_backward = gpu_attention_backward,
    .crossentropy_forward = gpu_crossentropy_forward,
    .crossentropy_backward = gpu_crossentropy_backward,
    .crossentropy_slice_max = gpu_crossentropy_slice_max,
    .crossentropy_slice_sums = gpu_crossentropy_slice_sums,
    .crossentropy_slice_finish = gpu_crossentropy_slice_finish,
    .crossentropy_slice_backward = gpu_crossentropy_slice_backward,
    .mean = gpu_mean,
    .adamw = gpu_adamw,
    .sum_squares = gpu_sum_squares,
    .count_nonfinite = gpu_count_nonfinite,
    .scale = gpu_scale,
    .convert = gpu_convert,
    .accumulate = gpu_accumulate,
    .native_queue = gpu_native_queue,
};
