/* The device tier (docs/offload.md): CUDA device memory, pinned (page-locked)
 * host memory, and asynchronous copies between them and host memory on
 * streams with completion events. Built only when CMake finds the CUDA
 * toolkit; memory.c calls in here for LOOM_TIER_DEVICE and LOOM_TIER_PINNED
 * and keeps the accounting.
 *
 * The CUDA runtime is loaded with dlopen, not linked. A loom built where the
 * toolkit exists is often installed on CPU-only nodes of the same cluster
 * too; linked against libcudart, libloom (and so the loom command) would not
 * even start there. Loaded on first use, the runtime is needed only by a
 * job that asks for device memory, and that job gets one line saying what
 * is missing. The plugin comm-nccl links libcudart itself; both load the
 * same soname, so the dynamic linker gives them one runtime, and device
 * pointers made here are valid there.
 *
 * Device blocks cannot carry memory.c's header in front of them (the CPU
 * cannot write device memory), so this file keeps a table from pointer to
 * (tier, purpose, bytes) for every block it hands out; pinned blocks use it
 * too, so loom_mem_free asks here first. */
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "runtime/device.h"
#include "runtime/log.h"

/* ------------------------------------------------ the runtime, by dlopen */

/* Each entry has the type of the CUDA function it stands for, so the
 * compiler checks every call against cuda_runtime_api.h. Only functions
 * that are not macros in that header (no _v2 or per-thread-stream
 * variants) are used, so each symbol name is the plain function name. */
typedef struct cudart_api {
    __typeof__(&cudaGetDeviceCount) GetDeviceCount;
    __typeof__(&cudaGetDevice) GetDevice;
    __typeof__(&cudaSetDevice) SetDevice;
    __typeof__(&cudaDeviceGetAttribute) DeviceGetAttribute;
    __typeof__(&cudaMemGetInfo) MemGetInfo;
    __typeof__(&cudaGetErrorString) GetErrorString;
    __typeof__(&cudaMalloc) Malloc;
    __typeof__(&cudaFree) Free;
    __typeof__(&cudaMallocHost) MallocHost;
    __typeof__(&cudaFreeHost) FreeHost;
    __typeof__(&cudaMemcpyAsync) MemcpyAsync;
    __typeof__(&cudaStreamCreateWithFlags) StreamCreateWithFlags;
    __typeof__(&cudaStreamDestroy) StreamDestroy;
    __typeof__(&cudaEventCreateWithFlags) EventCreateWithFlags;
    __typeof__(&cudaEventRecord) EventRecord;
    __typeof__(&cudaEventQuery) EventQuery;
    __typeof__(&cudaEventDestroy) EventDestroy;
} cudart_api;

static cudart_api rt;
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_status = LOOM_OK;
static char load_detail[512]; /* why there is no device, when load_status fails */

static void *symbol(void *dl, const char *name, int *missing)
{
    void *p = dlsym(dl, name);
    if (!p && !*missing) {
        *missing = 1;
        snprintf(load_detail, sizeof load_detail,
                 "the CUDA runtime %s lacks %s; install the runtime of the toolkit loom was "
                 "built with",
                 LOOM_CUDART_SONAME, name);
    }
    return p;
}

static void load_runtime(void)
{
    void *dl = dlopen(LOOM_CUDART_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        load_status = LOOM_ERR_NOT_SUPPORTED;
        snprintf(load_detail, sizeof load_detail,
                 "the CUDA runtime could not be loaded (%s); install it or add its folder to "
                 "LD_LIBRARY_PATH",
                 dlerror());
        return;
    }
    int missing = 0;
    /* POSIX dlsym returns function addresses as void *; memcpy moves one
     * into a function pointer without a cast C does not define. */
#define LOAD(field, name)                                                                          \
    do {                                                                                           \
        void *p_ = symbol(dl, name, &missing);                                                     \
        memcpy(&rt.field, &p_, sizeof p_);                                                         \
    } while (0)
    LOAD(GetDeviceCount, "cudaGetDeviceCount");
    LOAD(GetDevice, "cudaGetDevice");
    LOAD(SetDevice, "cudaSetDevice");
    LOAD(DeviceGetAttribute, "cudaDeviceGetAttribute");
    LOAD(MemGetInfo, "cudaMemGetInfo");
    LOAD(GetErrorString, "cudaGetErrorString");
    LOAD(Malloc, "cudaMalloc");
    LOAD(Free, "cudaFree");
    LOAD(MallocHost, "cudaMallocHost");
    LOAD(FreeHost, "cudaFreeHost");
    LOAD(MemcpyAsync, "cudaMemcpyAsync");
    LOAD(StreamCreateWithFlags, "cudaStreamCreateWithFlags");
    LOAD(StreamDestroy, "cudaStreamDestroy");
    LOAD(EventCreateWithFlags, "cudaEventCreateWithFlags");
    LOAD(EventRecord, "cudaEventRecord");
    LOAD(EventQuery, "cudaEventQuery");
    LOAD(EventDestroy, "cudaEventDestroy");
#undef LOAD
    if (missing) {
        load_status = LOOM_ERR_NOT_SUPPORTED;
        return; /* the handle stays open: harmless, and dlclose could run CUDA's destructors */
    }
    /* Without a driver, cudaGetDeviceCount fails (cudaErrorInsufficientDriver
     * or cudaErrorNoDevice) and, as observed with CUDA 13, leaves the count
     * untouched: start from 0 and trust the return code. */
    int count = 0;
    cudaError_t e = rt.GetDeviceCount(&count);
    if (e != cudaSuccess) {
        load_status = LOOM_ERR_NOT_SUPPORTED;
        snprintf(load_detail, sizeof load_detail,
                 "no CUDA device visible (cudaGetDeviceCount: %s)", rt.GetErrorString(e));
    } else if (count < 1) {
        load_status = LOOM_ERR_NOT_SUPPORTED;
        snprintf(load_detail, sizeof load_detail,
                 "no CUDA device visible (cudaGetDeviceCount: 0 devices)");
    }
    /* Copies pass cudaMemcpyDefault, which CUDA allows only with unified
     * virtual addressing (cuda_runtime_api.h, cudaMemcpyAsync): check it
     * rather than assume it. */
    for (int d = 0; load_status == LOOM_OK && d < count; d++) {
        int uva = 0;
        e = rt.DeviceGetAttribute(&uva, cudaDevAttrUnifiedAddressing, d);
        if (e != cudaSuccess || !uva) {
            load_status = LOOM_ERR_NOT_SUPPORTED;
            snprintf(load_detail, sizeof load_detail,
                     "CUDA device %d does not use unified virtual addressing (%s), which the "
                     "device tier needs",
                     d, e != cudaSuccess ? rt.GetErrorString(e) : "attribute is 0");
        }
    }
}

int loom_device_available(void)
{
    pthread_once(&load_once, load_runtime);
    if (load_status != LOOM_OK)
        return loom_fail(load_status, "%s", load_detail);
    return LOOM_OK;
}

int loom_device_count(void)
{
    int count = 0;
    pthread_once(&load_once, load_runtime);
    if (load_status != LOOM_OK || rt.GetDeviceCount(&count) != cudaSuccess)
        return 0;
    return count;
}

static const char *cuda_text(cudaError_t e) { return rt.GetErrorString(e); }

int loom_device_memory_total(int device, uint64_t *bytes)
{
    int rc = loom_device_available();
    if (rc != LOOM_OK)
        return rc;
    int current = 0;
    cudaError_t e = rt.GetDevice(&current);
    if (e == cudaSuccess)
        e = rt.SetDevice(device);
    size_t free_bytes = 0, total = 0;
    if (e == cudaSuccess) {
        e = rt.MemGetInfo(&free_bytes, &total);
        rt.SetDevice(current); /* the caller's device stays current */
    }
    if (e != cudaSuccess)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED, "CUDA device %d: cudaMemGetInfo: %s", device,
                         cuda_text(e));
    *bytes = total;
    return LOOM_OK;
}

/* ------------------------------------------------------ the block table */

typedef struct device_block {
    void *ptr;
    uint64_t bytes;
    loom_tier tier;
    loom_purpose purpose;
    struct device_block *next;
} device_block;

#define NBUCKETS 1024
static device_block *buckets[NBUCKETS];
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static int table_count;

/* cudaMalloc returns blocks aligned to at least 256 bytes: drop those bits. */
static size_t bucket_of(const void *ptr) { return ((uintptr_t)ptr >> 8) % NBUCKETS; }

int loom_device_alloc(loom_tier tier, loom_purpose purpose, size_t bytes, void **out)
{
    const char *kind = tier == LOOM_TIER_PINNED ? "pinned host" : "device";
    if (tier != LOOM_TIER_DEVICE && tier != LOOM_TIER_PINNED)
        return loom_fail(LOOM_ERR_INVALID, "memory: the device tier cannot allocate %s memory",
                         loom_tier_name(tier));
    if (loom_device_available() != LOOM_OK)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED, "memory: cannot allocate %zu bytes of %s memory for %s: %s",
                         bytes, kind, loom_purpose_name(purpose), load_detail);
    device_block *b = calloc(1, sizeof *b);
    if (!b)
        return loom_fail(LOOM_ERR_NO_MEMORY, "memory: out of host memory");
    /* A zero-byte request still gets a distinct block, as malloc gives. */
    size_t size = bytes ? bytes : 1;
    void *p = NULL;
    cudaError_t e = tier == LOOM_TIER_PINNED ? rt.MallocHost(&p, size) : rt.Malloc(&p, size);
    if (e != cudaSuccess) {
        free(b);
        return loom_fail(e == cudaErrorMemoryAllocation ? LOOM_ERR_NO_MEMORY : LOOM_ERR_INTERNAL,
                         "memory: cannot allocate %zu bytes of %s memory for %s: %s", bytes, kind,
                         loom_purpose_name(purpose), cuda_text(e));
    }
    b->ptr = p;
    b->bytes = bytes;
    b->tier = tier;
    b->purpose = purpose;
    size_t k = bucket_of(p);
    pthread_mutex_lock(&table_lock);
    b->next = buckets[k];
    buckets[k] = b;
    table_count++;
    pthread_mutex_unlock(&table_lock);
    *out = p;
    return LOOM_OK;
}

int loom_device_free(void *ptr, loom_tier *tier, loom_purpose *purpose, uint64_t *bytes)
{
    device_block *b = NULL;
    pthread_mutex_lock(&table_lock);
    if (table_count > 0) {
        for (device_block **p = &buckets[bucket_of(ptr)]; *p; p = &(*p)->next)
            if ((*p)->ptr == ptr) {
                b = *p;
                *p = b->next;
                table_count--;
                break;
            }
    }
    pthread_mutex_unlock(&table_lock);
    if (!b)
        return 0;
    /* The caller must know that no copy or collective still uses the
     * block: CUDA documents only that cudaFree "may perform implicit
     * synchronization" (cuda_runtime_api.h, cudaFree), not that it waits. */
    cudaError_t e = b->tier == LOOM_TIER_PINNED ? rt.FreeHost(ptr) : rt.Free(ptr);
    if (e != cudaSuccess)
        loom_log(LOOM_LOG_ERROR, "memory: freeing %llu bytes of %s memory: %s",
                 (unsigned long long)b->bytes, loom_tier_name(b->tier), cuda_text(e));
    *tier = b->tier;
    *purpose = b->purpose;
    *bytes = b->bytes;
    free(b);
    return 1;
}

/* ------------------------------------------------ streams and events */

struct loom_device_stream {
    cudaStream_t stream;
    int device; /* the device current when it was made: the stream lives there */
};

struct loom_device_event {
    cudaEvent_t event;
};

int loom_device_stream_create(loom_device_stream **out)
{
    *out = NULL;
    if (loom_device_available() != LOOM_OK)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED, "device: cannot create a stream: %s", load_detail);
    loom_device_stream *s = calloc(1, sizeof *s);
    if (!s)
        return loom_fail(LOOM_ERR_NO_MEMORY, "device: out of host memory");
    /* A stream belongs to the calling thread's current device. */
    cudaError_t e = rt.GetDevice(&s->device);
    if (e != cudaSuccess) {
        free(s);
        return loom_fail(LOOM_ERR_INTERNAL, "device: cudaGetDevice: %s", cuda_text(e));
    }
    /* cudaStreamNonBlocking: no implicit synchronization with the legacy
     * default stream (stream 0) in either direction, so our copies never
     * queue behind a kernel someone put there. */
    e = rt.StreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(s);
        return loom_fail(LOOM_ERR_INTERNAL, "device: cudaStreamCreateWithFlags: %s", cuda_text(e));
    }
    *out = s;
    return LOOM_OK;
}

void loom_device_stream_destroy(loom_device_stream *s)
{
    if (!s)
        return;
    /* cudaStreamDestroy returns at once; work still queued on the stream
     * completes first and the stream is released after it. */
    rt.StreamDestroy(s->stream);
    free(s);
}

int loom_device_copy_async(void *dst, const void *src, size_t bytes, loom_device_stream *s,
                           loom_device_event **done)
{
    *done = NULL;
    if (loom_device_available() != LOOM_OK)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED, "device: cannot copy %zu bytes: %s", bytes,
                         load_detail);
    if (bytes == 0)
        return LOOM_OK;
    loom_device_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return loom_fail(LOOM_ERR_NO_MEMORY, "device: out of host memory");
    cudaStream_t stream = s ? s->stream : (cudaStream_t)0;
    /* cudaEventCreateWithFlags makes the event on the current device, and
     * cudaEventRecord needs the event and the stream in the same context
     * (both in cuda_runtime_api.h); the current device is per thread and may
     * have changed since the stream was made. So work on the stream's
     * device, and give the caller its own back afterwards. */
    int cur = -1, switched = 0;
    cudaError_t e = cudaSuccess;
    if (s && (e = rt.GetDevice(&cur)) == cudaSuccess && cur != s->device) {
        e = rt.SetDevice(s->device);
        switched = e == cudaSuccess;
    }
    if (e != cudaSuccess) {
        free(ev);
        return loom_fail(LOOM_ERR_INTERNAL, "device: selecting the stream's device %d: %s",
                         s->device, cuda_text(e));
    }
    /* cudaEventDisableTiming: we only ever query the event, and the CUDA
     * documentation recommends the flag for that use (cheaper events). */
    e = rt.EventCreateWithFlags(&ev->event, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        if (switched)
            rt.SetDevice(cur);
        free(ev);
        return loom_fail(LOOM_ERR_INTERNAL, "device: cudaEventCreateWithFlags: %s", cuda_text(e));
    }
    /* cudaMemcpyDefault infers the direction from the pointers (unified
     * addressing was checked at load). A copy, unlike a kernel, may go to a
     * stream of a device other than the current one. Per the runtime's "API
     * synchronization behavior" page, a copy from pageable host memory
     * returns once the source was staged, but one between device memory and
     * pageable host memory may also block the caller until it is done: the
     * timeout of loom_device_event_wait bounds only copies that return. */
    e = rt.MemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream);
    if (e == cudaSuccess)
        e = rt.EventRecord(ev->event, stream);
    if (switched)
        rt.SetDevice(cur);
    if (e != cudaSuccess) {
        rt.EventDestroy(ev->event);
        free(ev);
        return loom_fail(LOOM_ERR_INTERNAL, "device: copying %zu bytes from %p to %p: %s", bytes, src,
                         dst, cuda_text(e));
    }
    *done = ev;
    return LOOM_OK;
}

static void event_release(loom_device_event *ev)
{
    /* Destroying an event whose work is still pending is allowed: the call
     * does not block and CUDA releases it at completion (cudaEventDestroy in
     * cuda_runtime_api.h). cudaEventQuery and cudaEventDestroy work from any
     * current device. */
    rt.EventDestroy(ev->event);
    free(ev);
}

int loom_device_event_test(loom_device_event *ev)
{
    if (!ev)
        return LOOM_OK;
    /* cudaEventQuery: cudaSuccess once all work captured by the last
     * cudaEventRecord completed, cudaErrorNotReady while some is pending;
     * anything else is an error, possibly of earlier asynchronous work. */
    cudaError_t e = rt.EventQuery(ev->event);
    if (e == cudaErrorNotReady)
        return LOOM_IN_PROGRESS;
    event_release(ev);
    if (e != cudaSuccess)
        return loom_fail(LOOM_ERR_INTERNAL, "device: a copy failed: %s", cuda_text(e));
    return LOOM_OK;
}

static double now_s(void) { return (double)loom_now_ns() * 1e-9; }

int loom_device_event_wait(loom_device_event *ev, double timeout_s)
{
    if (!ev)
        return LOOM_OK;
    double t0 = now_s();
    for (;;) {
        int st = loom_device_event_test(ev);
        if (st != LOOM_IN_PROGRESS)
            return st;
        double waited = now_s() - t0;
        if (waited > timeout_s) {
            event_release(ev);
            return loom_fail(LOOM_ERR_TIMEOUT,
                             "device: a copy did not complete within %.1f s (comm.timeout_s); the "
                             "GPU is stuck or busy with work that does not end",
                             timeout_s);
        }
        /* Yield while young (copies of small buffers end in microseconds),
         * then sleep: the machine's cores may be shared. */
        if (waited < 0.002) {
            sched_yield();
        } else {
            struct timespec t = {0, waited < 1.0 ? 20000 : 1000000};
            nanosleep(&t, NULL);
        }
    }
}

int loom_device_copy(void *dst, const void *src, size_t bytes, double timeout_s)
{
    loom_device_event *ev = NULL;
    int st = loom_device_copy_async(dst, src, bytes, NULL, &ev);
    if (st != LOOM_OK)
        return st;
    return loom_device_event_wait(ev, timeout_s);
}
