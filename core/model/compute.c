/* The run's compute backend: the built-in cpu one, and the attention
 * kernels strategies compose on it. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/status.h"
#include "model/compute.h"
#include "model/kernels.h"
#include "runtime/log.h"
#include "runtime/device.h"
#include "runtime/loader.h"
#include "runtime/memory.h"
#include "runtime/runtime.h"

static loom_backend cpu_backend;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void create_cpu(void)
{
    loom_compute_setup setup = {.struct_size = sizeof setup,
                                .device = 0,
                                .threads = loom_kernels_threads(),
                                .precision = LOOM_F32,
                                .deterministic = 1,
                                .cpu = &loom_compute_cpu};
    loom_compute *self = NULL;
    if (loom_compute_cpu.create(NULL, &setup, &self) != LOOM_OK)
        return;
    cpu_backend = (loom_backend){&loom_compute_cpu, self, "cpu"};
}

loom_backend *loom_backend_cpu(void)
{
    pthread_once(&cpu_once, create_cpu);
    if (!cpu_backend.self) {
        loom_fail(LOOM_ERR_NO_MEMORY, "compute: cannot create the cpu backend");
        return NULL;
    }
    return &cpu_backend;
}

/* ---- attention kernels on a backend whose memory the host cannot read ----
 *
 * loom_attention_kernels takes no context and positions as host arrays:
 * the adapter runs on the backend last handed out (one run's backend per
 * process) and gives it the positions in its own memory. */

static const loom_backend *attention_backend;
static int *positions_scratch;
static size_t positions_capacity; /* ints */

/* q_pos then k_pos in the backend's memory; NULL when out of memory. */
static int *device_positions(const int *q_pos, int tq, const int *k_pos, int tk)
{
    const loom_backend *b = attention_backend;
    size_t need = (size_t)tq + (size_t)tk;
    if (need > positions_capacity) {
        loom_mem_free(positions_scratch);
        positions_scratch = NULL;
        positions_capacity = 0;
        if (loom_mem_alloc((loom_tier)b->ops->tier, LOOM_PURPOSE_OTHER, need * sizeof(int),
                           (void **)&positions_scratch) != LOOM_OK)
            return NULL;
        positions_capacity = need;
    }
    if (b->ops->to_device(b->self, positions_scratch, q_pos, (size_t)tq * sizeof(int)) != LOOM_OK ||
        b->ops->to_device(b->self, positions_scratch + tq, k_pos, (size_t)tk * sizeof(int)) !=
            LOOM_OK)
        return NULL;
    return positions_scratch;
}

static void adapted_forward(const void *q, const int *q_pos, int tq, const void *k, const void *v,
                            const int *k_pos, int tk, int B, int NH, int HS, loom_dtype dtype,
                            void *out, float *lse, int first_block)
{
    const loom_backend *b = attention_backend;
    int *pos = device_positions(q_pos, tq, k_pos, tk);
    if (!pos) {
        loom_log(LOOM_LOG_ERROR, "compute: attention: %s", loom_last_error());
        return;
    }
    b->ops->attention_forward(b->self, q, pos, tq, k, v, pos + tq, tk, B, NH, HS, dtype, out, lse,
                              first_block);
}

static void adapted_backward(const void *q, const int *q_pos, int tq, const void *k,
                             const void *v, const int *k_pos, int tk, int B, int NH, int HS,
                             loom_dtype dtype, const void *out, const void *dout,
                             const float *lse, void *dq, void *dk, void *dv)
{
    const loom_backend *b = attention_backend;
    int *pos = device_positions(q_pos, tq, k_pos, tk);
    if (!pos) {
        loom_log(LOOM_LOG_ERROR, "compute: attention: %s", loom_last_error());
        return;
    }
    b->ops->attention_backward(b->self, q, pos, tq, k, v, pos + tq, tk, B, NH, HS, dtype, out,
                               dout, lse, dq, dk, dv);
}

static const loom_attention_kernels adapted_kernels = {sizeof(loom_attention_kernels),
                                                       adapted_forward, adapted_backward};

const loom_attention_kernels *loom_backend_attention_kernels(const loom_backend *b)
{
    if (b->ops->tier == LOOM_TIER_HOST && b->ops == &loom_compute_cpu)
        return &loom_attention_kernels_cpu;
    attention_backend = b;
    return &adapted_kernels;
}

/* ---- the service strategies reach through loom_host's compute ---- */

static const loom_backend *api_backend;

/* Whether p, which a copy names the backend's memory, is host memory
 * instead: model state memory.offload moved off a device backend (a
 * segment of the tiered service). Such a side is copied with memcpy, so a
 * strategy's copies work wherever the state's home is. */
static int offloaded(const void *p)
{
    return api_backend->ops->tier == LOOM_TIER_DEVICE && !loom_mem_is_device(p);
}

static int api_to_device(const loom_host *host, void *dst, const void *src, size_t bytes)
{
    (void)host;
    if (bytes && offloaded(dst)) {
        memcpy(dst, src, bytes);
        return LOOM_OK;
    }
    return api_backend->ops->to_device(api_backend->self, dst, src, bytes);
}

static int api_to_host(const loom_host *host, void *dst, const void *src, size_t bytes)
{
    (void)host;
    if (bytes && offloaded(src)) {
        memcpy(dst, src, bytes);
        return LOOM_OK;
    }
    return api_backend->ops->to_host(api_backend->self, dst, src, bytes);
}

static int api_copy(const loom_host *host, void *dst, const void *src, size_t bytes)
{
    (void)host;
    const loom_backend *b = api_backend;
    int host_dst = bytes && offloaded(dst), host_src = bytes && offloaded(src);
    if (host_dst && host_src) {
        memmove(dst, src, bytes);
        return LOOM_OK;
    }
    if (host_dst)
        return b->ops->to_host(b->self, dst, src, bytes);
    if (host_src)
        return b->ops->to_device(b->self, dst, src, bytes);
    return b->ops->copy(b->self, dst, src, bytes);
}

static int api_zero(const loom_host *host, void *dst, size_t bytes)
{
    (void)host;
    if (bytes && offloaded(dst)) {
        memset(dst, 0, bytes);
        return LOOM_OK;
    }
    return api_backend->ops->zero(api_backend->self, dst, bytes);
}

/* A conversion with a side in host memory (offloaded state) on a device
 * backend: that side goes through a device copy, so the backend's kernel
 * does the conversion either way (the same bits); both host: the CPU's. */
static int convert_offloaded(void *dst, loom_dtype dst_type, const void *src, loom_dtype src_type,
                             size_t n)
{
    const loom_backend *b = api_backend;
    int host_dst = offloaded(dst), host_src = offloaded(src);
    if (host_dst && host_src) {
        loom_convert(dst, dst_type, src, src_type, n);
        return LOOM_OK;
    }
    size_t bytes = n * loom_dtype_size(host_src ? src_type : dst_type);
    void *staged = NULL;
    int rc = loom_mem_alloc(LOOM_TIER_DEVICE, LOOM_PURPOSE_COMM, bytes ? bytes : 1, &staged);
    if (rc == LOOM_OK && host_src &&
        (rc = b->ops->to_device(b->self, staged, src, bytes)) == LOOM_OK)
        rc = b->ops->convert(b->self, dst, dst_type, staged, src_type, n);
    if (rc == LOOM_OK && host_dst &&
        (rc = b->ops->convert(b->self, staged, dst_type, src, src_type, n)) == LOOM_OK)
        rc = b->ops->to_host(b->self, dst, staged, bytes);
    loom_mem_free(staged);
    return rc;
}

static int api_convert(const loom_host *host, void *dst, loom_dtype dst_type, const void *src,
                       loom_dtype src_type, size_t n)
{
    (void)host;
    if (n && (offloaded(dst) || offloaded(src)))
        return convert_offloaded(dst, dst_type, src, src_type, n);
    return api_backend->ops->convert(api_backend->self, dst, dst_type, src, src_type, n);
}

static int api_sum_squares(const loom_host *host, const void *x, loom_dtype dtype, size_t n,
                           double *sum)
{
    (void)host;
    return api_backend->ops->sum_squares(api_backend->self, x, dtype, n, sum);
}

static int api_scale(const loom_host *host, float *x, float s, size_t n)
{
    (void)host;
    return api_backend->ops->scale(api_backend->self, x, s, n);
}

static int api_synchronize(const loom_host *host)
{
    (void)host;
    return api_backend->ops->synchronize(api_backend->self);
}

static int api_copy_rows(const loom_host *host, void *dst, size_t dst_pitch, const void *src,
                         size_t src_pitch, size_t row_bytes, size_t rows)
{
    (void)host;
    return api_backend->ops->copy_rows(api_backend->self, dst, dst_pitch, src, src_pitch,
                                       row_bytes, rows);
}

static int api_accumulate(const loom_host *host, void *dst, loom_dtype dst_type, float *src,
                          size_t n)
{
    (void)host;
    return api_backend->ops->accumulate(api_backend->self, dst, dst_type, src, n);
}

static loom_compute_api api = {.struct_size = sizeof api,
                               .to_device = api_to_device,
                               .to_host = api_to_host,
                               .copy = api_copy,
                               .zero = api_zero,
                               .convert = api_convert,
                               .sum_squares = api_sum_squares,
                               .scale = api_scale,
                               .synchronize = api_synchronize,
                               .copy_rows = api_copy_rows,
                               .accumulate = api_accumulate};

int loom_backend_install(loom_runtime *rt, const loom_backend *b)
{
    api_backend = b;
    api.tier = b->ops->tier;
    api.mem_kind = b->ops->mem_kind;
    api.backend = b->name;
    api.native_queue = b->ops->native_queue ? b->ops->native_queue(b->self) : NULL;
    return loom_runtime_set_compute(rt, &api);
}

const loom_backend *loom_backend_current(void) { return api_backend; }

/* ---- the backend's matrix-product rate ---- */

/* Seconds of n products, all issued then waited for (a device's queue runs
 * them back to back); negative when one failed. */
static double timed_products(const loom_backend *b, float *out, const void *x, const void *w,
                             int M, int N, int K, loom_dtype multiply, int n)
{
    loom_compute_operand a = {x, multiply, K, 0}, bt = {w, multiply, K, 1};
    uint64_t t0 = loom_now_ns();
    for (int i = 0; i < n; i++)
        if (b->ops->gemm(b->self, out, N, M, N, K, a, bt, 1.0f, 0.0f, multiply, 1, 0, 0, 0) !=
            LOOM_OK)
            return -1;
    if (b->ops->synchronize(b->self) != LOOM_OK)
        return -1;
    return 1e-9 * (double)(loom_now_ns() - t0);
}

double loom_backend_measure_gemm(const loom_backend *b, int M, int N, int K, loom_dtype multiply,
                                 double seconds)
{
    size_t elem = loom_dtype_size(multiply);
    void *x = NULL, *w = NULL;
    float *out = NULL;
    double rate = 0;
    loom_tier tier = (loom_tier)b->ops->tier;
    if (loom_mem_alloc(tier, LOOM_PURPOSE_OTHER, (size_t)M * K * elem, &x) != LOOM_OK ||
        loom_mem_alloc(tier, LOOM_PURPOSE_OTHER, (size_t)N * K * elem, &w) != LOOM_OK ||
        loom_mem_alloc(tier, LOOM_PURPOSE_OTHER, (size_t)M * N * sizeof(float), (void **)&out) !=
            LOOM_OK)
        goto done;
    /* zeros: a product's time does not depend on the values */
    double one = timed_products(b, out, x, w, M, N, K, multiply, 2) / 2; /* warm-up too */
    if (one < 0)
        goto done;
    enum { REPEATS = 5 };
    int per_repeat = (int)(seconds / REPEATS / (one > 1e-6 ? one : 1e-6));
    per_repeat = per_repeat < 1 ? 1 : per_repeat;
    for (int r = 0; r < REPEATS; r++) {
        double took = timed_products(b, out, x, w, M, N, K, multiply, per_repeat);
        if (took <= 0) {
            rate = 0;
            goto done;
        }
        double at = 2.0 * M * N * K * per_repeat / took;
        rate = at > rate ? at : rate; /* the best repeat: a peak, which a busy moment lowers */
    }
done:
    loom_mem_free(x);
    loom_mem_free(w);
    loom_mem_free(out);
    return rate;
}

/* ---- opening the run's backend (model.device) ---- */

typedef struct opened_backend {
    loom_backend b;
    loom_device_memory memory; /* registered while open, for a device-tier backend */
} opened_backend;

static int device_alloc(void *ctx, size_t bytes, void **out)
{
    const loom_backend *b = ctx;
    return b->ops->alloc(b->self, bytes, out);
}

static void device_free(void *ctx, void *ptr)
{
    const loom_backend *b = ctx;
    b->ops->free(b->self, ptr);
}

static int device_to_host(void *ctx, void *dst, const void *src, size_t bytes)
{
    const loom_backend *b = ctx;
    return b->ops->to_host(b->self, dst, src, bytes);
}

static int device_to_device(void *ctx, void *dst, const void *src, size_t bytes)
{
    const loom_backend *b = ctx;
    return b->ops->to_device(b->self, dst, src, bytes);
}

/* The host table of a compute plugin: its settings are compute.<name>. */
static int plugin_host(loom_runtime *rt, const loom_plugin *plugin, const loom_host **host)
{
    char path[128];
    snprintf(path, sizeof path, "compute.%s", plugin->ops.compute.header.name);
    return loom_runtime_host(rt, plugin, path, host);
}

/* Whether the plugin can run here; one line in why when it cannot. */
static int probe(loom_runtime *rt, const loom_plugin *plugin, char *why, size_t cap)
{
    const loom_compute_ops *ops = &plugin->ops.compute;
    const loom_host *host = NULL;
    if (!ops->probe)
        return LOOM_OK;
    int rc = plugin_host(rt, plugin, &host);
    if (rc != LOOM_OK) {
        snprintf(why, cap, "%s", loom_last_error());
        return rc;
    }
    return ops->probe(host, why, cap);
}

/* Where comm staging of this backend's buffers goes: pinned host memory
 * for a backend on a CUDA stream (its copies from there run at full speed
 * and need no bounce through the driver's own buffer), host memory else. */
static loom_tier staging_tier(const loom_compute_ops *ops)
{
#ifdef LOOM_HAVE_CUDA
    if (ops->native_queue && loom_device_available() == LOOM_OK)
        return LOOM_TIER_PINNED;
#else
    (void)ops;
#endif
    return LOOM_TIER_HOST;
}

/* A compute plugin's instance, with its settings from compute.<name>. */
static int create_plugin(loom_runtime *rt, const loom_plugin *plugin,
                         const loom_compute_setup *setup, opened_backend *o)
{
    const loom_compute_ops *ops = &plugin->ops.compute;
    const loom_host *host = NULL;
    int rc = plugin_host(rt, plugin, &host);
    if (rc != LOOM_OK)
        return rc;
    loom_compute_setup s = *setup;
    s.cpu = &loom_compute_cpu;
    if ((rc = ops->create(host, &s, &o->b.self)) != LOOM_OK)
        return rc;
    o->b.ops = ops;
    o->b.name = ops->header.name;
    if (ops->tier == LOOM_TIER_DEVICE) {
        o->memory = (loom_device_memory){.ctx = &o->b,
                                         .name = o->b.name,
                                         .staging_tier = staging_tier(ops),
                                         .alloc = device_alloc,
                                         .free = device_free,
                                         .to_host = device_to_host,
                                         .to_device = device_to_device};
        loom_mem_set_device(&o->memory);
    }
    return LOOM_OK;
}

/* "auto": the cuda backend when its plugin loads and says a device is
 * visible, else cpu; why says which and why. */
static int open_auto(loom_runtime *rt, const loom_compute_setup *setup, opened_backend *o,
                     char *why, size_t cap)
{
    const loom_plugin *plugin = NULL;
    if (loom_runtime_plugin(rt, LOOM_PLUGIN_COMPUTE, "cuda", &plugin) != LOOM_OK) {
        snprintf(why, cap, "model.device = \"auto\": cpu (no cuda compute plugin: %s)",
                 loom_last_error());
        return LOOM_OK;
    }
    char declined[512] = "";
    if (probe(rt, plugin, declined, sizeof declined) != LOOM_OK) {
        snprintf(why, cap, "model.device = \"auto\": cpu (cuda: %s)", declined);
        return LOOM_OK;
    }
    int rc = create_plugin(rt, plugin, setup, o);
    if (rc == LOOM_OK)
        snprintf(why, cap, "model.device = \"auto\": cuda (its plugin loaded and sees a device)");
    return rc;
}

int loom_backend_open(loom_runtime *rt, const char *device, const loom_compute_setup *setup,
                      loom_backend **out, char *why, size_t cap)
{
    opened_backend *o = calloc(1, sizeof *o);
    if (!o)
        return loom_fail(LOOM_ERR_NO_MEMORY, "compute: out of memory");
    int rc = LOOM_OK;
    if (!strcmp(device, "auto")) {
        rc = open_auto(rt, setup, o, why, cap);
    } else if (strcmp(device, "cpu") != 0) {
        const loom_plugin *plugin = NULL;
        if ((rc = loom_runtime_plugin(rt, LOOM_PLUGIN_COMPUTE, device, &plugin)) == LOOM_OK) {
            char declined[512] = "";
            if ((rc = probe(rt, plugin, declined, sizeof declined)) != LOOM_OK)
                rc = loom_fail(rc, "the %s backend cannot run here: %s", device, declined);
            if (rc == LOOM_OK)
                rc = create_plugin(rt, plugin, setup, o);
        }
        snprintf(why, cap, "model.device = \"%s\"", device);
    } else {
        snprintf(why, cap, "model.device = \"cpu\"");
    }
    if (rc == LOOM_OK && !o->b.ops) { /* cpu */
        free(o);
        loom_backend *cpu = loom_backend_cpu();
        if (!cpu)
            return LOOM_ERR_NO_MEMORY;
        *out = cpu;
        return LOOM_OK;
    }
    if (rc != LOOM_OK) {
        free(o);
        return rc;
    }
    *out = &o->b;
    return LOOM_OK;
}

int loom_backend_tier(loom_runtime *rt, const char *device, loom_tier *tier)
{
    *tier = LOOM_TIER_HOST;
    if (!strcmp(device, "cpu"))
        return LOOM_OK;
    const loom_plugin *plugin = NULL;
    int is_auto = !strcmp(device, "auto");
    int rc = loom_runtime_plugin(rt, LOOM_PLUGIN_COMPUTE, is_auto ? "cuda" : device, &plugin);
    if (rc != LOOM_OK)
        return is_auto ? LOOM_OK : rc;
    char why[512] = "";
    if (is_auto && probe(rt, plugin, why, sizeof why) != LOOM_OK)
        return LOOM_OK;
    *tier = (loom_tier)plugin->ops.compute.tier;
    return LOOM_OK;
}

void loom_backend_close(loom_backend *b)
{
    if (!b || b == &cpu_backend)
        return;
    opened_backend *o = (opened_backend *)b;
    b->ops->synchronize(b->self);
    if (attention_backend == b) {
        loom_mem_free(positions_scratch);
        positions_scratch = NULL;
        positions_capacity = 0;
        attention_backend = NULL;
    }
    if (api_backend == b)
        api_backend = NULL;
    if (b->ops->tier == LOOM_TIER_DEVICE)
        loom_mem_set_device(NULL);
    b->ops->destroy(b->self);
    free(o);
}
