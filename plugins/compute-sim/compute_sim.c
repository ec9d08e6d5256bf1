/* compute-sim: a compute backend for tests. It runs the built-in cpu
 * backend's kernels, but on memory the host cannot touch: every buffer
 * comes from one arena that stays PROT_NONE except while one of this
 * backend's own calls runs. Any other code that reads or writes a model
 * buffer — a strategy, the trainer, a checkpoint — dies of SIGSEGV, so a
 * run on sim proves that the model's buffers are reached only through the
 * compute backend and the communicators, as on a GPU whose memory the host
 * cannot address.
 *
 * The arena is address space reserved once (size_gib, MAP_NORESERVE):
 * pages are only used as buffers are. Buffers are placed first fit from a
 * free list kept outside the arena, 256-byte aligned and zeroed; freeing
 * one merges it with free neighbours. A call opens the arena's used part,
 * [base, base + high-water mark), for reading and writing and closes it
 * again on return, failed or not; a depth count keeps a call that another
 * thread's call overlaps from closing it early. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "loom/compute.h"

#define SIM_ALIGN 256
#define GIB ((size_t)1 << 30)

/* A piece of the arena, used or free; the pieces tile it in address order. */
typedef struct sim_block {
    size_t offset, bytes;
    int used;
    struct sim_block *prev, *next;
} sim_block;

struct loom_compute {
    const loom_host *host;
    const loom_compute_plugin_v1_t *cpu; /* the kernels */
    loom_compute *inner;                 /* the cpu backend's instance */

    char *base;            /* the arena */
    size_t size;           /* its bytes */
    int64_t size_gib;
    size_t page;
    sim_block *blocks;     /* the first piece */
    size_t in_use;         /* bytes of used pieces */
    size_t high_water;     /* page-rounded end of the furthest piece ever used */

    pthread_mutex_t lock;  /* the pieces, high_water and depth */
    int depth;             /* calls running: the arena is open while > 0 */

    /* An injected device fault (fault_rank, fault_after): the call that
     * fails first, -1 for none, and the calls so far. */
    int64_t fault_at, calls;
};

static const loom_setting_spec sim_settings[] = {
    {.name = "size_gib", .type = LOOM_SETTING_INT, .default_value = "16",
     .help = "GiB of address space reserved for the backend's buffers (pages are used as "
             "buffers are)",
     .bounds = LOOM_SETTING_MIN | LOOM_SETTING_MAX, .min = 1, .max = 65536},
    {.name = "fault_rank", .type = LOOM_SETTING_INT, .default_value = "-1",
     .help = "the rank whose device fails (for tests of how a job reports a failed GPU); -1: "
             "none",
     .bounds = LOOM_SETTING_MIN, .min = -1},
    {.name = "fault_after", .type = LOOM_SETTING_INT, .default_value = "0",
     .help = "calls into the backend on fault_rank that succeed; every later one fails",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {0},
};

/* ------------------------------------------------------------ the guard */

static int set_protection(loom_compute *c, size_t from, size_t to, int prot)
{
    if (to <= from || mprotect(c->base + from, to - from, prot) == 0)
        return LOOM_OK;
    return c->host->error(c->host, LOOM_ERR_INTERNAL,
                          "sim: mprotect of the arena's bytes [%zu, %zu) to %s failed: %s", from,
                          to, prot == PROT_NONE ? "no access" : "read-write", strerror(errno));
}

static int open_arena(loom_compute *c)
{
    int rc = LOOM_OK;
    pthread_mutex_lock(&c->lock);
    if (c->fault_at >= 0 && c->calls++ >= c->fault_at) {
        pthread_mutex_unlock(&c->lock);
        return c->host->error(c->host, LOOM_ERR_INTERNAL,
                              "sim: device fault on rank %d after %lld calls (injected: "
                              "compute.sim.fault_rank, fault_after); the device is unusable for "
                              "the rest of this process",
                              c->host->rank, (long long)c->fault_at);
    }
    if (c->depth == 0)
        rc = set_protection(c, 0, c->high_water, PROT_READ | PROT_WRITE);
    if (rc == LOOM_OK)
        c->depth++;
    pthread_mutex_unlock(&c->lock);
    return rc;
}

static int close_arena(loom_compute *c)
{
    int rc = LOOM_OK;
    pthread_mutex_lock(&c->lock);
    if (--c->depth == 0)
        rc = set_protection(c, 0, c->high_water, PROT_NONE);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

/* Runs call with the arena open and returns its status, or the guard's
 * when the call succeeded and closing the arena did not. */
#define GUARDED(c, call)                                                                           \
    do {                                                                                           \
        int rc_ = open_arena(c);                                                                   \
        if (rc_ != LOOM_OK)                                                                        \
            return rc_;                                                                            \
        rc_ = (call);                                                                              \
        int closed_ = close_arena(c);                                                              \
        return rc_ != LOOM_OK ? rc_ : closed_;                                                     \
    } while (0)

/* 1 when [p, p + bytes) lies in the arena. */
static int in_arena(const loom_compute *c, const void *p, size_t bytes)
{
    uintptr_t at = (uintptr_t)p, base = (uintptr_t)c->base;
    return at >= base && at - base <= c->size && bytes <= c->size - (at - base);
}

static int outside_arena(const loom_compute *c, const void *p, size_t bytes)
{
    uintptr_t at = (uintptr_t)p, base = (uintptr_t)c->base;
    return at + bytes <= base || at >= base + c->size;
}

static int not_device(loom_compute *c, const char *op, const char *which, const void *p,
                      size_t bytes)
{
    return c->host->error(c->host, LOOM_ERR_INVALID,
                          "sim: %s's %s [%p, +%zu) is not the backend's memory: pass a buffer "
                          "its alloc returned",
                          op, which, p, bytes);
}

static int not_host(loom_compute *c, const char *op, const char *which, const void *p,
                    size_t bytes)
{
    return c->host->error(c->host, LOOM_ERR_INVALID,
                          "sim: %s's %s [%p, +%zu) is the backend's memory, where host memory "
                          "belongs: use copy between two of its buffers",
                          op, which, p, bytes);
}

/* ------------------------------------------------------------ lifetime */

static int sim_destroy(loom_compute *c)
{
    if (!c)
        return LOOM_OK;
    int rc = c->inner ? c->cpu->destroy(c->inner) : LOOM_OK;
    if (c->base)
        munmap(c->base, c->size);
    for (sim_block *b = c->blocks, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    pthread_mutex_destroy(&c->lock);
    free(c);
    return rc;
}

static int read_size(const loom_host *host, int64_t *gib)
{
    *gib = 16;
    int rc = host->config_int ? host->config_int(host, "size_gib", gib) : LOOM_ERR_NOT_FOUND;
    if (rc == LOOM_ERR_NOT_FOUND) {
        *gib = 16;
        rc = LOOM_OK;
    }
    if (rc != LOOM_OK)
        return host->error(host, rc, "sim: cannot read compute.sim.size_gib: %s",
                           loom_status_string(rc));
    if (*gib < 1 || (uint64_t)*gib > SIZE_MAX / GIB)
        return host->error(host, LOOM_ERR_INVALID,
                           "sim: compute.sim.size_gib = %lld is out of range: give 1 or more "
                           "GiB that fit in this machine's address space",
                           (long long)*gib);
    return LOOM_OK;
}

/* The call of this rank's that fails first (fault_rank, fault_after), or -1. */
static int64_t read_fault(const loom_host *host)
{
    int64_t rank = -1, after = 0;
    if (!host->config_int || host->config_int(host, "fault_rank", &rank) != LOOM_OK ||
        rank != host->rank || host->config_int(host, "fault_after", &after) != LOOM_OK)
        return -1;
    return after;
}

static int sim_create(const loom_host *host, const loom_compute_setup *setup, loom_compute **out)
{
    *out = NULL;
    size_t has_cpu = offsetof(loom_compute_setup, cpu) + sizeof setup->cpu;
    if (!setup || setup->struct_size < has_cpu || !setup->cpu)
        return host->error(host, LOOM_ERR_NOT_SUPPORTED,
                           "sim: the core gave no cpu backend to run the kernels on "
                           "(loom_compute_setup.cpu); the sim backend needs a core of ABI 1.9 "
                           "or later");
    int64_t gib;
    int rc = read_size(host, &gib);
    if (rc != LOOM_OK)
        return rc;

    loom_compute *c = calloc(1, sizeof *c);
    if (!c)
        return host->error(host, LOOM_ERR_NO_MEMORY, "sim: no memory for the backend");
    c->host = host;
    c->cpu = setup->cpu;
    c->size_gib = gib;
    c->fault_at = read_fault(host);
    c->size = (size_t)gib * GIB;
    c->page = (size_t)sysconf(_SC_PAGESIZE);
    pthread_mutex_init(&c->lock, NULL);

    void *base = mmap(NULL, c->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                      0);
    if (base == MAP_FAILED) {
        rc = host->error(host, LOOM_ERR_NO_MEMORY,
                         "sim: cannot reserve an arena of %lld GiB of address space: %s; lower "
                         "compute.sim.size_gib",
                         (long long)gib, strerror(errno));
        sim_destroy(c);
        return rc;
    }
    c->base = base;
    c->blocks = calloc(1, sizeof *c->blocks);
    if (!c->blocks) {
        sim_destroy(c);
        return host->error(host, LOOM_ERR_NO_MEMORY, "sim: no memory for the backend");
    }
    c->blocks->bytes = c->size;

    rc = c->cpu->create(host, setup, &c->inner);
    if (rc != LOOM_OK) {
        c->inner = NULL;
        sim_destroy(c);
        return rc;
    }
    *out = c;
    return LOOM_OK;
}

static int sim_describe(const loom_compute *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "sim: cpu kernels on guarded memory (arena %lld GiB)",
             (long long)c->size_gib);
    return LOOM_OK;
}

/* ------------------------------------------------------------ memory */

/* The piece that starts at offset and is used, or NULL. */
static sim_block *used_block_at(loom_compute *c, size_t offset)
{
    for (sim_block *b = c->blocks; b && b->offset <= offset; b = b->next)
        if (b->offset == offset)
            return b->used ? b : NULL;
    return NULL;
}

/* The first free piece of at least bytes, split to exactly bytes, or NULL. */
static sim_block *take_first_fit(loom_compute *c, size_t bytes)
{
    sim_block *b = c->blocks;
    while (b && (b->used || b->bytes < bytes))
        b = b->next;
    if (!b)
        return NULL;
    sim_block *rest = b->bytes > bytes ? calloc(1, sizeof *rest) : NULL;
    if (rest) { /* without memory for it, b is used whole */
        rest->offset = b->offset + bytes;
        rest->bytes = b->bytes - bytes;
        rest->prev = b;
        rest->next = b->next;
        if (b->next)
            b->next->prev = rest;
        b->next = rest;
        b->bytes = bytes;
    }
    b->used = 1;
    return b;
}

/* b's successor, free, joins b. */
static void merge_next(sim_block *b)
{
    sim_block *n = b->next;
    b->bytes += n->bytes;
    b->next = n->next;
    if (n->next)
        n->next->prev = b;
    free(n);
}

/* Extends the used part to end; opened already when a call is running. */
static int raise_high_water(loom_compute *c, size_t end)
{
    size_t rounded = (end + c->page - 1) / c->page * c->page;
    if (rounded <= c->high_water)
        return LOOM_OK;
    int rc = c->depth > 0 ? set_protection(c, c->high_water, rounded, PROT_READ | PROT_WRITE)
                          : LOOM_OK;
    if (rc == LOOM_OK)
        c->high_water = rounded;
    return rc;
}

static int sim_free(loom_compute *c, void *ptr);

/* Zeroes the arena's [from, to): its whole pages are dropped (they read as
 * zero again, and give their memory back), the partial ones at its ends
 * are cleared. */
static int zero_block(loom_compute *c, size_t from, size_t to)
{
    size_t first_page = (from + c->page - 1) / c->page * c->page;
    size_t end_page = to / c->page * c->page;
    if (first_page >= end_page) {
        first_page = to;
        end_page = to;
    }
    if (end_page > first_page &&
        madvise(c->base + first_page, end_page - first_page, MADV_DONTNEED) != 0)
        return c->host->error(c->host, LOOM_ERR_INTERNAL,
                              "sim: madvise of the arena's bytes [%zu, %zu) failed: %s",
                              first_page, end_page, strerror(errno));
    int rc = open_arena(c);
    if (rc != LOOM_OK)
        return rc;
    memset(c->base + from, 0, first_page - from);
    memset(c->base + end_page, 0, to - end_page);
    return close_arena(c);
}

static int sim_alloc(loom_compute *c, size_t bytes, void **out)
{
    *out = NULL;
    size_t need = bytes ? bytes : 1;
    if (need > c->size)
        need = c->size + 1; /* no piece fits; and rounding up cannot wrap */
    else
        need = (need + SIM_ALIGN - 1) / SIM_ALIGN * SIM_ALIGN;

    pthread_mutex_lock(&c->lock);
    sim_block *b = need <= c->size - c->in_use ? take_first_fit(c, need) : NULL;
    int rc = LOOM_OK;
    if (b) {
        c->in_use += b->bytes;
        rc = raise_high_water(c, b->offset + b->bytes);
    }
    size_t in_use = c->in_use;
    pthread_mutex_unlock(&c->lock);
    if (!b)
        return c->host->error(c->host, LOOM_ERR_NO_MEMORY,
                              "sim: cannot allocate %zu bytes: %zu bytes of the %lld GiB arena "
                              "are in use and no free piece is that large; raise "
                              "compute.sim.size_gib",
                              bytes, in_use, (long long)c->size_gib);
    char *p = c->base + b->offset;
    if (rc == LOOM_OK)
        rc = zero_block(c, b->offset, b->offset + b->bytes);
    if (rc != LOOM_OK) {
        sim_free(c, p);
        return rc;
    }
    *out = p;
    return LOOM_OK;
}

static int sim_free(loom_compute *c, void *ptr)
{
    if (!ptr)
        return LOOM_OK;
    uintptr_t at = (uintptr_t)ptr, base = (uintptr_t)c->base;
    pthread_mutex_lock(&c->lock);
    sim_block *b = at >= base && at < base + c->size ? used_block_at(c, at - base) : NULL;
    if (b) {
        b->used = 0;
        c->in_use -= b->bytes;
        if (b->next && !b->next->used)
            merge_next(b);
        if (b->prev && !b->prev->used)
            merge_next(b->prev);
    }
    pthread_mutex_unlock(&c->lock);
    if (!b)
        return c->host->error(c->host, LOOM_ERR_INVALID,
                              "sim: free of %p, which is not a buffer the backend's alloc "
                              "returned (or was freed already)",
                              ptr);
    return LOOM_OK;
}

static int sim_to_device(loom_compute *c, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return LOOM_OK; /* as the cpu backend: no buffer needed */
    if (!in_arena(c, dst, bytes))
        return not_device(c, "to_device", "destination", dst, bytes);
    if (!outside_arena(c, src, bytes))
        return not_host(c, "to_device", "source", src, bytes);
    GUARDED(c, (memcpy(dst, src, bytes), LOOM_OK));
}

static int sim_to_host(loom_compute *c, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return LOOM_OK; /* as the cpu backend: no buffer needed */
    if (!in_arena(c, src, bytes))
        return not_device(c, "to_host", "source", src, bytes);
    if (!outside_arena(c, dst, bytes))
        return not_host(c, "to_host", "destination", dst, bytes);
    GUARDED(c, (memcpy(dst, src, bytes), LOOM_OK));
}

static int sim_copy(loom_compute *c, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return LOOM_OK; /* as the cpu backend: no buffer needed */
    if (!in_arena(c, dst, bytes))
        return not_device(c, "copy", "destination", dst, bytes);
    if (!in_arena(c, src, bytes))
        return not_device(c, "copy", "source", src, bytes);
    GUARDED(c, (memmove(dst, src, bytes), LOOM_OK));
}

static int copy_pitched(void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                        size_t row_bytes, size_t rows)
{
    for (size_t r = 0; r < rows; r++)
        memmove((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, row_bytes);
    return LOOM_OK;
}

static int sim_copy_rows(loom_compute *c, void *dst, size_t dst_pitch, const void *src,
                         size_t src_pitch, size_t row_bytes, size_t rows)
{
    if (rows == 0 || row_bytes == 0)
        return LOOM_OK;
    if (rows > 1 && (row_bytes > dst_pitch || row_bytes > src_pitch))
        return c->host->error(c->host, LOOM_ERR_INVALID,
                              "sim: copy_rows of rows of %zu bytes between pitches of %zu and %zu "
                              "bytes: the rows would overlap",
                              row_bytes, dst_pitch, src_pitch);
    size_t dst_span = (rows - 1) * dst_pitch + row_bytes;
    size_t src_span = (rows - 1) * src_pitch + row_bytes;
    if (!in_arena(c, dst, dst_span))
        return not_device(c, "copy_rows", "destination", dst, dst_span);
    if (!in_arena(c, src, src_span))
        return not_device(c, "copy_rows", "source", src, src_span);
    GUARDED(c, copy_pitched(dst, dst_pitch, src, src_pitch, row_bytes, rows));
}

static int sim_zero(loom_compute *c, void *dst, size_t bytes)
{
    if (bytes == 0)
        return LOOM_OK; /* as the cpu backend: no buffer needed */
    if (!in_arena(c, dst, bytes))
        return not_device(c, "zero", "destination", dst, bytes);
    GUARDED(c, (memset(dst, 0, bytes), LOOM_OK));
}

/* ------------------------------------------------------------ the queue */

static int sim_synchronize(loom_compute *c)
{
    GUARDED(c, c->cpu->synchronize(c->inner));
}

static int sim_event_record(loom_compute *c, loom_compute_event **out)
{
    return c->cpu->event_record(c->inner, out);
}

static int sim_event_wait(loom_compute *c, loom_compute_event *ev, double timeout_s)
{
    GUARDED(c, c->cpu->event_wait(c->inner, ev, timeout_s));
}

static void sim_event_free(loom_compute *c, loom_compute_event *ev)
{
    c->cpu->event_free(c->inner, ev);
}

static int sim_status(loom_compute *c)
{
    return c->cpu->status(c->inner);
}

/* ------------------------------------------------------------ the kernels */

static int sim_gemm(loom_compute *c, float *out, int ldc, int M, int N, int K,
                    loom_compute_operand a, loom_compute_operand b, float alpha, float beta,
                    loom_dtype multiply, int batch, size_t stride_a, size_t stride_b,
                    size_t stride_out)
{
    GUARDED(c, c->cpu->gemm(c->inner, out, ldc, M, N, K, a, b, alpha, beta, multiply, batch,
                            stride_a, stride_b, stride_out));
}

static loom_dtype sim_multiply_dtype(loom_compute *c, loom_dtype precision)
{
    return c->cpu->multiply_dtype(c->inner, precision);
}

static int sim_matmul_forward(loom_compute *c, float *out, const float *inp,
                              loom_compute_weight weight, const float *bias, int N, int C, int OC)
{
    GUARDED(c, c->cpu->matmul_forward(c->inner, out, inp, weight, bias, N, C, OC));
}

static int sim_matmul_backward_input(loom_compute *c, float *dinp, const float *dout,
                                     loom_compute_weight weight, int N, int C, int OC)
{
    GUARDED(c, c->cpu->matmul_backward_input(c->inner, dinp, dout, weight, N, C, OC));
}

static int sim_matmul_backward_weight(loom_compute *c, float *dweight, float *dbias,
                                      const float *dout, const float *inp, int N, int C, int OC)
{
    GUARDED(c, c->cpu->matmul_backward_weight(c->inner, dweight, dbias, dout, inp, N, C, OC));
}

static int sim_encoder_forward(loom_compute *c, float *out, const int *inp, const int *pos,
                               const float *wte, const float *wpe, int B, int T, int C)
{
    GUARDED(c, c->cpu->encoder_forward(c->inner, out, inp, pos, wte, wpe, B, T, C));
}

static int sim_encoder_backward(loom_compute *c, float *dwte, float *dwpe, const float *dout,
                                const int *inp, const int *pos, int B, int T, int C)
{
    GUARDED(c, c->cpu->encoder_backward(c->inner, dwte, dwpe, dout, inp, pos, B, T, C));
}

static int sim_embedding_rows_forward(loom_compute *c, float *out, const int *tok, int v0,
                                      int rows, const float *wte, int N, int C)
{
    GUARDED(c, c->cpu->embedding_rows_forward(c->inner, out, tok, v0, rows, wte, N, C));
}

static int sim_embedding_rows_backward(loom_compute *c, float *dwte, const float *dout,
                                       const int *tok, int v0, int rows, int N, int C)
{
    GUARDED(c, c->cpu->embedding_rows_backward(c->inner, dwte, dout, tok, v0, rows, N, C));
}

static int sim_position_forward(loom_compute *c, float *x, const float *wpe, const int *pos,
                                int R, int C)
{
    GUARDED(c, c->cpu->position_forward(c->inner, x, wpe, pos, R, C));
}

static int sim_position_backward(loom_compute *c, float *dwpe, const float *dx, const int *pos,
                                 int R, int C)
{
    GUARDED(c, c->cpu->position_backward(c->inner, dwpe, dx, pos, R, C));
}

static int sim_layernorm_forward(loom_compute *c, float *out, float *mean, float *rstd,
                                 const float *inp, const float *weight, const float *bias, int N,
                                 int C)
{
    GUARDED(c, c->cpu->layernorm_forward(c->inner, out, mean, rstd, inp, weight, bias, N, C));
}

static int sim_residual_layernorm_forward(loom_compute *c, float *res, float *out, float *mean,
                                          float *rstd, const float *a, const float *b,
                                          const float *weight, const float *bias, int N, int C)
{
    GUARDED(c, c->cpu->residual_layernorm_forward(c->inner, res, out, mean, rstd, a, b, weight,
                                                  bias, N, C));
}

static int sim_layernorm_backward_input(loom_compute *c, float *dinp, const float *dout,
                                        const float *inp, const float *weight, const float *mean,
                                        const float *rstd, int N, int C)
{
    GUARDED(c, c->cpu->layernorm_backward_input(c->inner, dinp, dout, inp, weight, mean, rstd, N,
                                                C));
}

static int sim_layernorm_backward_weight(loom_compute *c, float *dweight, float *dbias,
                                         const float *dout, const float *inp, const float *mean,
                                         const float *rstd, int N, int C)
{
    GUARDED(c, c->cpu->layernorm_backward_weight(c->inner, dweight, dbias, dout, inp, mean, rstd,
                                                 N, C));
}

static int sim_residual_forward(loom_compute *c, float *out, const float *a, const float *b,
                                size_t n)
{
    GUARDED(c, c->cpu->residual_forward(c->inner, out, a, b, n));
}

static int sim_bias_forward(loom_compute *c, float *x, const float *bias, int rows, int C)
{
    GUARDED(c, c->cpu->bias_forward(c->inner, x, bias, rows, C));
}

static int sim_bias_backward(loom_compute *c, float *dbias, const float *dout, int rows, int C)
{
    GUARDED(c, c->cpu->bias_backward(c->inner, dbias, dout, rows, C));
}

static int sim_bias_gelu_forward(loom_compute *c, float *out, float *pre, const float *bias,
                                 int N, int C)
{
    GUARDED(c, c->cpu->bias_gelu_forward(c->inner, out, pre, bias, N, C));
}

static int sim_gelu_backward(loom_compute *c, float *dinp, const float *inp, const float *dout,
                             size_t n)
{
    GUARDED(c, c->cpu->gelu_backward(c->inner, dinp, inp, dout, n));
}

static int sim_attention_forward(loom_compute *c, const void *q, const int *q_pos, int tq,
                                 const void *k, const void *v, const int *k_pos, int tk, int B,
                                 int NH, int HS, loom_dtype dtype, void *out, float *lse,
                                 int first_block)
{
    GUARDED(c, c->cpu->attention_forward(c->inner, q, q_pos, tq, k, v, k_pos, tk, B, NH, HS,
                                         dtype, out, lse, first_block));
}

static int sim_attention_backward(loom_compute *c, const void *q, const int *q_pos, int tq,
                                  const void *k, const void *v, const int *k_pos, int tk, int B,
                                  int NH, int HS, loom_dtype dtype, const void *out,
                                  const void *dout, const float *lse, void *dq, void *dk,
                                  void *dv)
{
    GUARDED(c, c->cpu->attention_backward(c->inner, q, q_pos, tq, k, v, k_pos, tk, B, NH, HS,
                                          dtype, out, dout, lse, dq, dk, dv));
}

static int sim_crossentropy_forward(loom_compute *c, float *losses, float *lse,
                                    const float *logits, const int *targets, int N, int V, int Vp)
{
    GUARDED(c, c->cpu->crossentropy_forward(c->inner, losses, lse, logits, targets, N, V, Vp));
}

static int sim_crossentropy_backward(loom_compute *c, float *logits, const float *dlosses,
                                     const float *lse, const int *targets, int N, int V, int Vp)
{
    GUARDED(c, c->cpu->crossentropy_backward(c->inner, logits, dlosses, lse, targets, N, V, Vp));
}

static int sim_crossentropy_slice_max(loom_compute *c, float *max, const float *logits, int N,
                                      int width, int real)
{
    GUARDED(c, c->cpu->crossentropy_slice_max(c->inner, max, logits, N, width, real));
}

static int sim_crossentropy_slice_sums(loom_compute *c, float *sum, float *target,
                                       const float *logits, const float *max, const int *targets,
                                       int v0, int N, int width, int real)
{
    GUARDED(c, c->cpu->crossentropy_slice_sums(c->inner, sum, target, logits, max, targets, v0, N,
                                               width, real));
}

static int sim_crossentropy_slice_finish(loom_compute *c, float *lse, float *losses,
                                         const float *max, const float *sum, const float *target,
                                         int N)
{
    GUARDED(c, c->cpu->crossentropy_slice_finish(c->inner, lse, losses, max, sum, target, N));
}

static int sim_crossentropy_slice_backward(loom_compute *c, float *logits, const float *dlosses,
                                           const float *lse, const int *targets, int v0, int N,
                                           int width, int real)
{
    GUARDED(c, c->cpu->crossentropy_slice_backward(c->inner, logits, dlosses, lse, targets, v0, N,
                                                   width, real));
}

static int sim_mean(loom_compute *c, const float *x, size_t n, float *mean)
{
    GUARDED(c, c->cpu->mean(c->inner, x, n, mean));
}

static int sim_adamw(loom_compute *c, const loom_compute_adamw *step, float *master,
                     const void *grad, loom_dtype grad_dtype, float *m, float *v, size_t n,
                     void *params, loom_dtype params_dtype)
{
    /* state offloaded to host memory is the core's to step, not ours */
    const void *state[3] = {master, m, v};
    for (int k = 0; k < 3 && n; k++)
        if (!in_arena(c, state[k], n * sizeof(float)))
            return not_device(c, "adamw", k ? "moment" : "master weights", state[k],
                              n * sizeof(float));
    if (n && !in_arena(c, grad, n * loom_dtype_size(grad_dtype)))
        return not_device(c, "adamw", "gradient", grad, n * loom_dtype_size(grad_dtype));
    if (n && params && !in_arena(c, params, n * loom_dtype_size(params_dtype)))
        return not_device(c, "adamw", "parameters", params, n * loom_dtype_size(params_dtype));
    GUARDED(c, c->cpu->adamw(c->inner, step, master, grad, grad_dtype, m, v, n, params,
                             params_dtype));
}

static int sim_sum_squares(loom_compute *c, const void *x, loom_dtype dtype, size_t n,
                           double *sum)
{
    GUARDED(c, c->cpu->sum_squares(c->inner, x, dtype, n, sum));
}

static int sim_count_nonfinite(loom_compute *c, const void *x, loom_dtype dtype, size_t n,
                               size_t *count)
{
    GUARDED(c, c->cpu->count_nonfinite(c->inner, x, dtype, n, count));
}

static int sim_scale(loom_compute *c, float *x, float s, size_t n)
{
    GUARDED(c, c->cpu->scale(c->inner, x, s, n));
}

static int sim_convert(loom_compute *c, void *dst, loom_dtype dst_type, const void *src,
                       loom_dtype src_type, size_t n)
{
    GUARDED(c, c->cpu->convert(c->inner, dst, dst_type, src, src_type, n));
}

static int sim_accumulate(loom_compute *c, void *dst, loom_dtype dst_type, float *src, size_t n)
{
    GUARDED(c, c->cpu->accumulate(c->inner, dst, dst_type, src, n));
}

LOOM_PLUGIN_EXPORT const loom_compute_plugin_v1_t loom_compute_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_COMPUTE, loom_compute_plugin_v1_t, "sim",
                                 "the cpu kernels on memory the host cannot touch outside the "
                                 "backend's calls, for tests",
                                 sim_settings),
    .tier = LOOM_TIER_DEVICE,
    .mem_kind = LOOM_MEM_DEVICE,
    .probe = NULL,
    .create = sim_create,
    .destroy = sim_destroy,
    .describe = sim_describe,
    .alloc = sim_alloc,
    .free = sim_free,
    .to_device = sim_to_device,
    .to_host = sim_to_host,
    .copy = sim_copy,
    .copy_rows = sim_copy_rows,
    .zero = sim_zero,
    .synchronize = sim_synchronize,
    .event_record = sim_event_record,
    .event_wait = sim_event_wait,
    .event_free = sim_event_free,
    .status = sim_status,
    .gemm = sim_gemm,
    .multiply_dtype = sim_multiply_dtype,
    .matmul_forward = sim_matmul_forward,
    .matmul_backward_input = sim_matmul_backward_input,
    .matmul_backward_weight = sim_matmul_backward_weight,
    .encoder_forward = sim_encoder_forward,
    .encoder_backward = sim_encoder_backward,
    .embedding_rows_forward = sim_embedding_rows_forward,
    .embedding_rows_backward = sim_embedding_rows_backward,
    .position_forward = sim_position_forward,
    .position_backward = sim_position_backward,
    .layernorm_forward = sim_layernorm_forward,
    .residual_layernorm_forward = sim_residual_layernorm_forward,
    .layernorm_backward_input = sim_layernorm_backward_input,
    .layernorm_backward_weight = sim_layernorm_backward_weight,
    .residual_forward = sim_residual_forward,
    .bias_forward = sim_bias_forward,
    .bias_backward = sim_bias_backward,
    .bias_gelu_forward = sim_bias_gelu_forward,
    .gelu_backward = sim_gelu_backward,
    .attention_forward = sim_attention_forward,
    .attention_backward = sim_attention_backward,
    .crossentropy_forward = sim_crossentropy_forward,
    .crossentropy_backward = sim_crossentropy_backward,
    .crossentropy_slice_max = sim_crossentropy_slice_max,
    .crossentropy_slice_sums = sim_crossentropy_slice_sums,
    .crossentropy_slice_finish = sim_crossentropy_slice_finish,
    .crossentropy_slice_backward = sim_crossentropy_slice_backward,
    .mean = sim_mean,
    .adamw = sim_adamw,
    .sum_squares = sim_sum_squares,
    .count_nonfinite = sim_count_nonfinite,
    .scale = sim_scale,
    .convert = sim_convert,
    .accumulate = sim_accumulate,
    .native_queue = NULL,
};
