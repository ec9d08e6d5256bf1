/* The strategy plugins never touch the model's memory on the host: each
 * plugin runs its hooks twice on one rank, against a host whose compute
 * service keeps the model's buffers in an arena that is PROT_NONE except
 * inside the service's own calls (and the fake communicator's, optimizer's
 * and attention kernels', which stand for code that runs where the memory
 * lives), against the same host with the service as a core of version 7
 * had it before copy_rows and accumulate (the plugins' per-row copies and
 * staged sums), and against a host older than the service (version 6: the
 * plugins' host-memory fallback). A plugin that reads or writes a model
 * buffer any other way dies of SIGSEGV in a guarded run, one that calls
 * past the short service's struct_size fails there; the three runs must
 * give the same bits (states, norms, attention and border outputs).
 *
 * Settings besides the plugin's: ranks=N (the data and all-to-all
 * strategies), max_copies=N (the full service's copy and copy_rows calls
 * at most N: strided views packed in few calls) and min_accumulates=N
 * (gradient sums done by the service's accumulate, at least N calls).
 *
 * guarded_test <plugin.so> <kind: data|tp|sp> [setting=value...] */
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "check.h"
#include "loom/comm.h"
#include "loom/compute.h"
#include "loom/strategy.h"

static char last_error[512];
const char *loom_last_error(void) { return last_error; }

/* ------------------------------------------------------------ the arena */

enum { ARENA_BYTES = 64 << 20 };
static char *arena;
static size_t arena_used;
static int arena_depth; /* open while > 0 */

static void arena_open(void)
{
    if (arena_depth++ == 0 && mprotect(arena, ARENA_BYTES, PROT_READ | PROT_WRITE) != 0)
        abort();
}

static void arena_close(void)
{
    if (--arena_depth == 0 && mprotect(arena, ARENA_BYTES, PROT_NONE) != 0)
        abort();
}

static int in_arena(const void *p)
{
    return (const char *)p >= arena && (const char *)p < arena + ARENA_BYTES;
}

static void *arena_alloc(size_t bytes)
{
    size_t at = (arena_used + 255) & ~(size_t)255;
    if (at + bytes > ARENA_BYTES)
        return NULL;
    arena_used = at + bytes;
    return arena + at;
}

/* ------------------------------------------------------ the compute service */

static int g_to_device(const loom_host *h, void *dst, const void *src, size_t bytes)
{
    (void)h;
    CHECK(in_arena(dst) && !in_arena(src), "to_device from %p to %p", src, dst);
    arena_open();
    memcpy(dst, src, bytes);
    arena_close();
    return LOOM_OK;
}

static int g_to_host(const loom_host *h, void *dst, const void *src, size_t bytes)
{
    (void)h;
    CHECK(!in_arena(dst) && in_arena(src), "to_host from %p to %p", src, dst);
    arena_open();
    memcpy(dst, src, bytes);
    arena_close();
    return LOOM_OK;
}

static long copy_calls;

static int g_copy(const loom_host *h, void *dst, const void *src, size_t bytes)
{
    (void)h;
    copy_calls++;
    CHECK(!bytes || (in_arena(dst) && in_arena(src)), "copy from %p to %p", src, dst);
    CHECK(dst != src || !bytes, "copy onto itself");
    arena_open();
    memmove(dst, src, bytes);
    arena_close();
    return LOOM_OK;
}

/* Calls of the full service, counted for max_copies and min_accumulates. */
static long copy_rows_calls, accumulate_calls;

static int g_copy_rows(const loom_host *h, void *dst, size_t dst_pitch, const void *src,
                       size_t src_pitch, size_t row_bytes, size_t rows)
{
    (void)h;
    copy_rows_calls++;
    CHECK(!rows || (in_arena(dst) && in_arena(src)), "copy_rows from %p to %p", src, dst);
    CHECK(rows <= 1 || (row_bytes <= dst_pitch && row_bytes <= src_pitch),
          "copy_rows of rows of %zu bytes at pitches %zu and %zu", row_bytes, dst_pitch,
          src_pitch);
    CHECK(!rows || in_arena((const char *)dst + (rows - 1) * dst_pitch + row_bytes - 1),
          "copy_rows past the arena");
    arena_open();
    for (size_t r = 0; r < rows; r++)
        memmove((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, row_bytes);
    arena_close();
    return LOOM_OK;
}

/* dst += src rounded to dst's type, src zeroed, as the cpu backend does. */
static int g_accumulate(const loom_host *h, void *dst, loom_dtype dst_type, float *src, size_t n)
{
    (void)h;
    accumulate_calls++;
    CHECK(!n || (in_arena(dst) && in_arena(src)), "accumulate of %p into %p", (void *)src, dst);
    arena_open();
    for (size_t i = 0; i < n; i++) {
        loom_store_f32(dst, dst_type, i, loom_load_f32(dst, dst_type, i) + src[i]);
        src[i] = 0;
    }
    arena_close();
    return LOOM_OK;
}

static int g_zero(const loom_host *h, void *dst, size_t bytes)
{
    (void)h;
    CHECK(!bytes || in_arena(dst), "zero of %p", dst);
    arena_open();
    memset(dst, 0, bytes);
    arena_close();
    return LOOM_OK;
}

static int g_convert(const loom_host *h, void *dst, loom_dtype dst_type, const void *src,
                     loom_dtype src_type, size_t n)
{
    (void)h;
    CHECK(in_arena(dst) && in_arena(src), "convert from %p to %p", src, dst);
    CHECK(dst_type != src_type, "convert to the same type");
    arena_open();
    for (size_t i = 0; i < n; i++)
        loom_store_f32(dst, dst_type, i, loom_load_f32(src, src_type, i));
    arena_close();
    return LOOM_OK;
}

/* The strategies' 8-lane order, which the cpu backend keeps. */
static int g_sum_squares(const loom_host *h, const void *x, loom_dtype dtype, size_t n,
                         double *sum)
{
    (void)h;
    CHECK(!n || in_arena(x), "sum_squares of %p", x);
    arena_open();
    double lane[8] = {0};
    for (size_t i = 0; i < n; i++) {
        double e = loom_load_f32(x, dtype, i);
        lane[i % 8] += e * e;
    }
    for (int k = 0; k < 8; k++)
        *sum += lane[k];
    arena_close();
    return LOOM_OK;
}

static int g_scale(const loom_host *h, float *x, float s, size_t n)
{
    (void)h;
    arena_open();
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
    arena_close();
    return LOOM_OK;
}

static int g_synchronize(const loom_host *h)
{
    (void)h;
    return LOOM_OK;
}

static const loom_compute_api guarded = {
    .struct_size = sizeof(loom_compute_api),
    .tier = LOOM_TIER_DEVICE,
    .mem_kind = LOOM_MEM_DEVICE,
    .backend = "guarded",
    .to_device = g_to_device,
    .to_host = g_to_host,
    .copy = g_copy,
    .zero = g_zero,
    .convert = g_convert,
    .sum_squares = g_sum_squares,
    .scale = g_scale,
    .synchronize = g_synchronize,
    .copy_rows = g_copy_rows,
    .accumulate = g_accumulate,
};

/* What lies past the end of an older core's service: never to be called. */
static int past_end_copy_rows(const loom_host *h, void *dst, size_t dst_pitch, const void *src,
                              size_t src_pitch, size_t row_bytes, size_t rows)
{
    (void)h, (void)dst, (void)dst_pitch, (void)src, (void)src_pitch, (void)row_bytes, (void)rows;
    REQUIRE(0, "copy_rows called past the end of a service of %zu bytes",
            offsetof(loom_compute_api, copy_rows));
    return LOOM_ERR_INTERNAL;
}

static int past_end_accumulate(const loom_host *h, void *dst, loom_dtype dst_type, float *src,
                               size_t n)
{
    (void)h, (void)dst, (void)dst_type, (void)src, (void)n;
    REQUIRE(0, "accumulate called past the end of a service of %zu bytes",
            offsetof(loom_compute_api, copy_rows));
    return LOOM_ERR_INTERNAL;
}

/* The service of a version 7 core from before copy_rows and accumulate. */
static const loom_compute_api guarded_short = {
    .struct_size = offsetof(loom_compute_api, copy_rows),
    .tier = LOOM_TIER_DEVICE,
    .mem_kind = LOOM_MEM_DEVICE,
    .backend = "guarded (short)",
    .to_device = g_to_device,
    .to_host = g_to_host,
    .copy = g_copy,
    .zero = g_zero,
    .convert = g_convert,
    .sum_squares = g_sum_squares,
    .scale = g_scale,
    .synchronize = g_synchronize,    .copy_rows = past_end_copy_rows,
    .accumulate = past_end_accumulate,
};

/* ---------------------------------------------------- the communicator */

/* Rank 0 of `ranks` (the setting ranks=, 1 by default), the others
 * holding what it holds: a sum is twice its values, a gather its values
 * `ranks` times. Collectives run inside the arena's reach, as a
 * communicator that takes device buffers (or the core's staging) does. */
static loom_group *const group = (loom_group *)&last_error; /* any address */
static int ranks = 1;

static int c_rank(const loom_group *g) { return (void)g, 0; }
static int c_size(const loom_group *g) { return (void)g, ranks; }
static const char *c_backend(const loom_group *g) { return (void)g, "guarded"; }

/* recv = send reduced over the ranks (all alike). */
static void combine(const void *send, void *recv, size_t count, loom_dtype dtype, loom_redop op)
{
    if (send != recv)
        memmove(recv, send, count * loom_dtype_size(dtype));
    if (op != LOOM_SUM || ranks == 1)
        return; /* the average, maximum or minimum of equal values is the value */
    for (size_t i = 0; i < count; i++) {
        if (dtype == LOOM_F64) {
            ((double *)recv)[i] *= ranks;
            continue;
        }
        float x = loom_load_f32(recv, dtype, i), sum = x;
        for (int r = 1; r < ranks; r++)
            sum += x;
        loom_store_f32(recv, dtype, i, sum);
    }
}

static int c_allreduce(loom_group *g, const void *send, void *recv, size_t count,
                       loom_dtype dtype, loom_redop op, loom_request **req)
{
    (void)g;
    *req = NULL;
    arena_open();
    combine(send, recv, count, dtype, op);
    arena_close();
    return LOOM_OK;
}

static int c_allgather(loom_group *g, const void *send, void *recv, size_t count,
                       loom_dtype dtype, loom_request **req)
{
    (void)g;
    *req = NULL;
    size_t bytes = count * loom_dtype_size(dtype);
    arena_open();
    for (int r = ranks - 1; r >= 0; r--) /* from the top: send may be recv's first block */
        memmove((char *)recv + r * bytes, send, bytes);
    arena_close();
    return LOOM_OK;
}

static int c_reducescatter(loom_group *g, const void *send, void *recv, size_t count,
                           loom_dtype dtype, loom_redop op, loom_request **req)
{
    (void)g;
    *req = NULL;
    arena_open();
    combine(send, recv, count, dtype, op); /* rank 0's block */
    arena_close();
    return LOOM_OK;
}

/* Every block back where it was, as if rank j's block for this rank were
 * this rank's block j: each packed row reaches the results. */
static int c_alltoall(loom_group *g, const void *send, void *recv, size_t count,
                      loom_dtype dtype, loom_request **req)
{
    (void)g;
    *req = NULL;
    arena_open();
    if (send != recv)
        memmove(recv, send, (size_t)ranks * count * loom_dtype_size(dtype));
    arena_close();
    return LOOM_OK;
}

/* A message to itself (ring attention's last hop): kept until received. */
static void *mailbox;
static size_t mailbox_bytes;

static int c_send(loom_group *g, const void *buf, size_t count, loom_dtype dtype, int peer,
                  int tag, loom_request **req)
{
    (void)g, (void)peer, (void)tag;
    *req = NULL;
    REQUIRE(!mailbox, "a second message before the first was received");
    mailbox_bytes = count * loom_dtype_size(dtype);
    mailbox = malloc(mailbox_bytes ? mailbox_bytes : 1);
    REQUIRE(mailbox);
    arena_open();
    memcpy(mailbox, buf, mailbox_bytes);
    arena_close();
    return LOOM_OK;
}

static int c_recv(loom_group *g, void *buf, size_t count, loom_dtype dtype, int peer, int tag,
                  loom_request **req)
{
    (void)g, (void)peer, (void)tag;
    *req = NULL;
    REQUIRE(mailbox && mailbox_bytes == count * loom_dtype_size(dtype),
            "a receive with no message of its size sent");
    arena_open();
    memcpy(buf, mailbox, mailbox_bytes);
    arena_close();
    free(mailbox);
    mailbox = NULL;
    return LOOM_OK;
}

static int c_group(loom_group *g) { return (void)g, LOOM_OK; }
static int c_wait(loom_request *req) { return (void)req, LOOM_OK; }

static const loom_comm_api comm = {
    .struct_size = sizeof(loom_comm_api),
    .rank = c_rank,
    .size = c_size,
    .backend = c_backend,
    .allreduce = c_allreduce,
    .allgather = c_allgather,
    .reducescatter = c_reducescatter,
    .alltoall = c_alltoall,
    .send = c_send,
    .recv = c_recv,
    .group_start = c_group,
    .group_end = c_group,
    .test = c_wait,
    .wait = c_wait,
};

/* ------------------------------------------------------------- the host */

static char **settings; /* name=value from the command line */
static int nsettings;

static const char *setting(const char *name, const char *fallback)
{
    size_t len = strlen(name);
    for (int i = 0; i < nsettings; i++)
        if (!strncmp(settings[i], name, len) && settings[i][len] == '=')
            return settings[i] + len + 1;
    return fallback;
}

static void h_log(const loom_host *h, loom_log_level level, const char *fmt, ...)
{
    (void)h, (void)level, (void)fmt;
}

static int h_error(const loom_host *h, int status, const char *fmt, ...)
{
    (void)h;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    fprintf(stderr, "error: %s\n", last_error);
    return status;
}

static int h_int(const loom_host *h, const char *name, int64_t *out)
{
    (void)h;
    const char *defaults = !strcmp(name, "prefetch") ? "1" : "0";
    *out = atoll(setting(name, defaults));
    return LOOM_OK;
}

static int h_float(const loom_host *h, const char *name, double *out)
{
    (void)h;
    *out = atof(setting(name, "25"));
    return LOOM_OK;
}

static int h_bool(const loom_host *h, const char *name, int *out)
{
    (void)h;
    const char *v = setting(name, !strcmp(name, "overlap") ? "true" : "false");
    *out = !strcmp(v, "true");
    return LOOM_OK;
}

static int h_string(const loom_host *h, const char *name, const char **out)
{
    (void)h;
    *out = setting(name, "contiguous");
    return LOOM_OK;
}

static int h_mem_alloc(const loom_host *h, loom_tier tier, loom_purpose purpose, size_t bytes,
                       void **out)
{
    (void)purpose;
    if (tier == LOOM_TIER_DEVICE) {
        REQUIRE(h->compute, "device memory asked of a host without it");
        *out = arena_alloc(bytes);
    } else {
        *out = aligned_alloc(64, (bytes + 63) / 64 * 64);
    }
    return *out ? LOOM_OK : h_error(h, LOOM_ERR_NO_MEMORY, "out of memory");
}

static void h_mem_free(const loom_host *h, void *p)
{
    (void)h;
    if (!in_arena(p)) /* the arena is freed whole */
        free(p);
}

static uint64_t h_now(void) { return 0; }

static void h_trace(const loom_host *h, loom_trace_lane lane, const char *name, uint64_t start,
                    uint64_t end, uint64_t bytes)
{
    (void)h, (void)lane, (void)name, (void)start, (void)end, (void)bytes;
}

/* The tiered service in host memory: segments acquired in place. */
struct loom_tiered {
    char *base;
    size_t *offset;
};

static int t_alloc(const loom_host *h, loom_purpose purpose, const char *name, int n,
                   const size_t *bytes, loom_tiered **out)
{
    (void)name;
    /* On a device only the optimizer state may be tiered (the core places
     * it); here it lives in the device tier, guarded as the model is. */
    CHECK(!h->compute || purpose == LOOM_PURPOSE_OPTIMIZER,
          "tiered state other than the optimizer's on a host whose model is on the device");
    loom_tiered *t = calloc(1, sizeof *t);
    REQUIRE(t && (t->offset = calloc((size_t)n, sizeof *t->offset)));
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        t->offset[i] = total;
        total += bytes[i];
    }
    t->base = h->compute ? arena_alloc(total ? total : 1) : calloc(1, total ? total : 1);
    REQUIRE(t->base); /* the arena is zeros until first written */
    *out = t;
    return LOOM_OK;
}

static void t_free(const loom_host *h, loom_tiered *t)
{
    (void)h;
    if (!in_arena(t->base))
        free(t->base);
    free(t->offset);
    free(t);
}

static int t_fetch(const loom_host *h, loom_tiered *t, int segment)
{
    (void)h, (void)t, (void)segment;
    return LOOM_OK;
}

static int t_acquire(const loom_host *h, loom_tiered *t, int segment, unsigned mode, void **ptr)
{
    (void)h, (void)mode;
    *ptr = t->base + t->offset[segment];
    return LOOM_OK;
}

static int t_release(const loom_host *h, loom_tiered *t, int segment, int dirty)
{
    (void)h, (void)t, (void)segment, (void)dirty;
    return LOOM_OK;
}

/* compute NULL: a version 6 host, which has no service. */
static loom_host make_host(const loom_compute_api *compute)
{
    return (loom_host){
        .struct_size = sizeof(loom_host),
        .version = compute ? 7 : 6,
        .world_size = 1,
        .local_size = 1,
        .timeout_s = 10,
        .log = h_log,
        .error = h_error,
        .config_int = h_int,
        .config_float = h_float,
        .config_bool = h_bool,
        .config_string = h_string,
        .mem_alloc = h_mem_alloc,
        .mem_free = h_mem_free,
        .now_ns = h_now,
        .trace = h_trace,
        .comm = &comm,
        .tiered_alloc = t_alloc,
        .tiered_free = t_free,
        .tiered_fetch = t_fetch,
        .tiered_acquire = t_acquire,
        .tiered_release = t_release,
        .compute = compute,
    };
}

/* ------------------------------------------- the model's side of the hooks */

static const loom_host *the_host;

/* The model's buffers, read and written where they live. */
static void model_read(void *dst, const void *src, size_t bytes)
{
    if (the_host->compute)
        the_host->compute->to_host(the_host, dst, src, bytes);
    else
        memcpy(dst, src, bytes);
}

static void model_write(void *dst, const void *src, size_t bytes)
{
    if (the_host->compute)
        the_host->compute->to_device(the_host, dst, src, bytes);
    else
        memcpy(dst, src, bytes);
}

/* The core's AdamW, in small: it runs where the buffers are. */
static void update(const loom_optimizer_step *s, float *master, const void *grad, loom_dtype t,
                   float *m, float *v, size_t n, void *params, loom_dtype params_dtype)
{
    arena_open();
    for (size_t i = 0; i < n; i++) {
        float g = loom_load_f32(grad, t, i) * s->grad_scale;
        m[i] = s->beta1 * m[i] + (1 - s->beta1) * g;
        v[i] = s->beta2 * v[i] + (1 - s->beta2) * g * g;
        master[i] -= s->lr * (m[i] / (sqrtf(v[i]) + s->eps) + s->weight_decay * master[i]);
    }
    if (params && params != (void *)master)
        loom_from_f32(params, params_dtype, master, n);
    arena_close();
}

static void update_range(const loom_optimizer_step *s, const loom_unit *unit, size_t offset,
                         float *master, const void *grad, loom_dtype t, float *m, float *v,
                         size_t n)
{
    (void)unit, (void)offset;
    update(s, master, grad, t, m, v, n, NULL, t);
}

static void update_range_store(const loom_optimizer_step *s, const loom_unit *unit, size_t offset,
                               float *master, const void *grad, loom_dtype t, float *m, float *v,
                               size_t n, void *params, loom_dtype params_dtype)
{
    (void)unit, (void)offset;
    update(s, master, grad, t, m, v, n, params, params_dtype);
}

/* Everything a run leaves to compare, as bytes. */
typedef struct record {
    unsigned char *bytes;
    size_t len, cap;
} record;

static void note(record *r, const void *p, size_t bytes)
{
    if (r->len + bytes > r->cap) {
        r->cap = 2 * (r->len + bytes);
        REQUIRE((r->bytes = realloc(r->bytes, r->cap)));
    }
    memcpy(r->bytes + r->len, p, bytes);
    r->len += bytes;
}

static float value(int a, int b, size_t i) { return (float)sin(0.37 * a + 0.11 * b + 0.013 * i); }

#define NUNITS 3
static const size_t unit_elems[NUNITS] = {37, 64, 5};

/* Two steps of two micro-batches through the data hooks, then the state
 * read, set and read again. */
static void run_data(const loom_strategy_plugin_v1_t *p, loom_dtype dtype, record *out)
{
    loom_strategy_setup setup = {.struct_size = sizeof setup, .axis = LOOM_AXIS_DP,
                                 .compute_dtype = dtype};
    setup.groups[LOOM_AXIS_DP] = group;
    setup.sizes[LOOM_AXIS_DP] = ranks;
    loom_strategy *s = NULL;
    REQUIRE(p->create(the_host, &setup, &s) == LOOM_OK, "create: %s", last_error);
    loom_unit units[NUNITS];
    float *init[NUNITS];
    const loom_unit_kind kinds[NUNITS] = {LOOM_UNIT_EMBEDDING, LOOM_UNIT_BLOCK, LOOM_UNIT_HEAD};
    for (int u = 0; u < NUNITS; u++) {
        units[u] = (loom_unit){.index = u, .kind = kinds[u], .name = "unit",
                               .numel = unit_elems[u], .compute_dtype = dtype};
        REQUIRE((init[u] = malloc(unit_elems[u] * sizeof(float))));
        for (size_t i = 0; i < unit_elems[u]; i++)
            init[u][i] = value(u, 0, i);
    }
    REQUIRE(p->data_setup(s, units, NUNITS, init) == LOOM_OK, "data_setup: %s", last_error);
    loom_optimizer_step step = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f,
                                .weight_decay = 0.01f, .grad_scale = 1.0f,
                                .update_range = update_range,
                                .update_range_store = update_range_store};
    size_t es = loom_dtype_size(dtype);
    unsigned char grad[64 * 4];
    for (int st = 1; st <= 2; st++) {
        REQUIRE(p->data_zero_grads(s) == LOOM_OK, "zero_grads: %s", last_error);
        for (int micro = 0; micro < 2; micro++) {
            for (int u = 0; u < NUNITS && p->data_before_forward; u++) {
                REQUIRE(p->data_before_forward(s, &units[u]) == LOOM_OK, "%s", last_error);
                REQUIRE(units[u].params);
                model_read(grad, units[u].params, unit_elems[u] * es); /* "forward" */
                note(out, grad, unit_elems[u] * es);
                REQUIRE(p->data_after_forward(s, &units[u]) == LOOM_OK, "%s", last_error);
            }
            for (int u = NUNITS - 1; u >= 0; u--) {
                if (p->data_before_backward)
                    REQUIRE(p->data_before_backward(s, &units[u]) == LOOM_OK, "%s", last_error);
                REQUIRE(units[u].grads && units[u].params);
                /* backward adds into the gradients */
                model_read(grad, units[u].grads, unit_elems[u] * es);
                for (size_t i = 0; i < unit_elems[u]; i++)
                    loom_store_f32(grad, dtype, i,
                                   loom_load_f32(grad, dtype, i) + value(u, 10 * st + micro, i));
                model_write(units[u].grads, grad, unit_elems[u] * es);
                REQUIRE(p->data_grads_ready(s, &units[u], micro == 1) == LOOM_OK, "%s",
                        last_error);
            }
            REQUIRE(p->data_finish_backward(s) == LOOM_OK, "%s", last_error);
        }
        double norm = -1;
        REQUIRE(p->data_grad_norm_sq(s, &norm) == LOOM_OK, "%s", last_error);
        CHECK(norm > 0);
        note(out, &norm, sizeof norm);
        step.step = st;
        REQUIRE(p->data_optimizer_step(s, &step) == LOOM_OK, "%s", last_error);
    }
    float state[3][64];
    for (int round = 0; round < 2; round++)
        for (int u = 0; u < NUNITS; u++) {
            memset(state, 0, sizeof state);
            REQUIRE(p->data_get_state(s, &units[u], state[0], state[1], state[2]) == LOOM_OK,
                    "get_state: %s", last_error);
            note(out, state, sizeof state);
            if (p->data_get_shard) { /* rank 0's shard: the first elements */
                size_t begin = 1, count = 0;
                float shard[3][64];
                REQUIRE(p->data_get_shard(s, &units[u], &begin, &count, shard[0], shard[1],
                                          shard[2]) == LOOM_OK, "%s", last_error);
                CHECK(begin == 0 && count > 0 && count <= unit_elems[u] &&
                      !memcmp(shard[2], state[2], count * 4));
            }
            for (size_t i = 0; i < unit_elems[u]; i++)
                for (int k = 0; k < 3; k++)
                    state[k][i] = value(u + k, 99, i) * (k == 2 ? state[k][i] : 1);
            if (round == 0)
                REQUIRE(p->data_set_state(s, &units[u], state[0], state[1], state[2]) == LOOM_OK,
                        "set_state: %s", last_error);
        }
    REQUIRE(p->destroy(s) == LOOM_OK, "destroy: %s", last_error);
    for (int u = 0; u < NUNITS; u++)
        free(init[u]);
}

/* A tensor of the model's memory with these values. */
static void *model_tensor(const float *values, size_t n)
{
    void *p = NULL;
    REQUIRE(the_host->mem_alloc(the_host, the_host->compute ? LOOM_TIER_DEVICE : LOOM_TIER_HOST,
                                LOOM_PURPOSE_ACTIVATIONS, n * sizeof(float), &p) == LOOM_OK);
    model_write(p, values, n * sizeof(float));
    return p;
}

static void note_tensor(record *out, const void *p, size_t n)
{
    float buf[4096];
    REQUIRE(n <= 4096);
    model_read(buf, p, n * sizeof(float));
    note(out, buf, n * sizeof(float));
}

/* The tensor axis's four borders on a (6, 8) activation. */
static void run_tp(const loom_strategy_plugin_v1_t *p, record *out)
{
    loom_strategy_setup setup = {.struct_size = sizeof setup, .axis = LOOM_AXIS_TP, .heads = 2,
                                 .channels = 8, .padded_vocab = 8, .compute_dtype = LOOM_F32};
    setup.groups[LOOM_AXIS_TP] = group;
    loom_strategy *s = NULL;
    REQUIRE(p->create(the_host, &setup, &s) == LOOM_OK, "create: %s", last_error);
    enum { R = 6, C = 8 };
    float v[R * C];
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i < R * C; i++)
            v[i] = value(k, 3, (size_t)i);
        loom_tensor in = {.data = model_tensor(v, R * C), .dtype = LOOM_F32, .ndim = 2,
                          .shape = {R, C}, .stride = {C, 1}};
        loom_tensor res = in;
        res.data = model_tensor(v, R * C);
        int rc = k == 0   ? p->tensor_enter(s, LOOM_REGION_MLP, &in, &res)
                 : k == 1 ? p->tensor_exit(s, LOOM_REGION_MLP, &in, &res)
                 : k == 2 ? p->tensor_exit_backward(s, LOOM_REGION_ATTENTION, &in, &res)
                          : p->tensor_enter_backward(s, LOOM_REGION_VOCAB, &in, &res);
        REQUIRE(rc == LOOM_OK, "border %d: %s", k, last_error);
        note_tensor(out, res.data, R * C);
    }
    REQUIRE(p->destroy(s) == LOOM_OK);
}

/* Attention kernels in small: they run where the memory is. */
static void block_forward(const void *q, const int *q_pos, int tq, const void *k, const void *v,
                          const int *k_pos, int tk, int B, int NH, int HS, loom_dtype dtype,
                          void *out, float *lse, int first)
{
    (void)q_pos, (void)k_pos, (void)tk, (void)dtype;
    arena_open();
    const float *fq = q, *fk = k, *fv = v;
    float *o = out;
    for (size_t i = 0; i < (size_t)B * tq * NH * HS; i++)
        o[i] = (first ? 0 : o[i]) + 0.5f * fq[i] + fk[i] * fv[i];
    for (size_t i = 0; i < (size_t)B * NH * tq; i++)
        lse[i] = (first ? 0 : lse[i]) + 1;
    arena_close();
}

static void block_backward(const void *q, const int *q_pos, int tq, const void *k, const void *v,
                           const int *k_pos, int tk, int B, int NH, int HS, loom_dtype dtype,
                           const void *out, const void *dout, const float *lse, void *dq,
                           void *dk, void *dv)
{
    (void)q, (void)q_pos, (void)k_pos, (void)tk, (void)dtype;
    arena_open();
    const float *fk = k, *fv = v, *o = out, *d = dout;
    float *gq = dq, *gk = dk, *gv = dv;
    for (size_t i = 0; i < (size_t)B * tq * NH * HS; i++) {
        gq[i] += 0.5f * d[i] + lse[i % ((size_t)B * NH * tq)];
        gk[i] += d[i] * fv[i];
        gv[i] += d[i] * fk[i] + o[i];
    }
    arena_close();
}

static const loom_attention_kernels kernels = {sizeof kernels, block_forward, block_backward};

/* Two layers' attention forward and backward on the sequence axis: this
 * rank's T = SEQ / ranks positions of each sequence. */
static void run_sp(const loom_strategy_plugin_v1_t *p, record *out)
{
    enum { B = 2, SEQ = 8, NH = 2, HS = 4, MAX_N = B * SEQ * NH * HS };
    loom_strategy_setup setup = {.struct_size = sizeof setup, .axis = LOOM_AXIS_SP, .heads = NH,
                                 .seq = SEQ, .compute_dtype = LOOM_F32};
    setup.groups[LOOM_AXIS_SP] = group;
    setup.sizes[LOOM_AXIS_SP] = ranks;
    loom_strategy *s = NULL;
    REQUIRE(p->create(the_host, &setup, &s) == LOOM_OK, "create: %s", last_error);
    int positions[SEQ], T = 0;
    REQUIRE(p->sequence_positions(s, SEQ, positions, &T) == LOOM_OK && T * ranks == SEQ);
    const int N = B * T * NH * HS;
    float v[MAX_N], zeros[MAX_N] = {0};
    void *lse[2];
    loom_attention a[2];
    for (int layer = 0; layer < 2; layer++) {
        a[layer] = (loom_attention){.B = B, .T = T, .NH = NH, .HS = HS, .dtype = LOOM_F32,
                                    .positions = positions, .kernels = &kernels};
        void *t[6];
        for (int k = 0; k < 6; k++) {
            for (int i = 0; i < N; i++)
                v[i] = value(layer, k, (size_t)i);
            t[k] = model_tensor(k < 4 ? v : zeros, N);
        }
        lse[layer] = model_tensor(zeros, B * NH * T);
        a[layer].q = t[0], a[layer].k = t[1], a[layer].v = t[2], a[layer].dout = t[3];
        a[layer].out = t[4], a[layer].lse = lse[layer];
        REQUIRE(p->attention_forward(s, &a[layer]) == LOOM_OK, "forward: %s", last_error);
        note_tensor(out, a[layer].out, N);
        note_tensor(out, a[layer].lse, B * NH * T);
        a[layer].dq = model_tensor(zeros, N);
        a[layer].dk = model_tensor(v, N); /* backward adds into what is there */
        a[layer].dv = model_tensor(zeros, N);
    }
    for (int layer = 1; layer >= 0; layer--) {
        REQUIRE(p->attention_backward(s, &a[layer]) == LOOM_OK, "backward: %s", last_error);
        note_tensor(out, a[layer].dq, N);
        note_tensor(out, a[layer].dk, N);
        note_tensor(out, a[layer].dv, N);
    }
    REQUIRE(p->destroy(s) == LOOM_OK);
}

static void run(const loom_strategy_plugin_v1_t *p, const char *kind, record *out)
{
    if (!strcmp(kind, "tp"))
        return run_tp(p, out);
    if (!strcmp(kind, "sp"))
        return run_sp(p, out);
    const loom_dtype dtypes[3] = {LOOM_F32, LOOM_BF16, LOOM_F16};
    for (int d = 0; d < 3; d++)
        run_data(p, dtypes[d], out);
}

int main(int argc, char **argv)
{
    REQUIRE(argc >= 3, "usage: guarded_test <plugin.so> <data|tp|sp> [name=value...]");
    settings = argv + 3;
    nsettings = argc - 3;
    ranks = atoi(setting("ranks", "1"));
    REQUIRE(ranks >= 1 && (ranks == 1 || strcmp(argv[2], "tp")),
            "ranks=%d: the tensor strategy runs on one rank only", ranks);
    long max_copies = atol(setting("max_copies", "-1"));
    long min_accumulates = atol(setting("min_accumulates", "0"));
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    REQUIRE(lib, "%s", dlerror());
    const loom_strategy_plugin_v1_t *p = dlsym(lib, "loom_strategy_plugin_v1");
    REQUIRE(p, "%s exports no loom_strategy_plugin_v1", argv[1]);
    arena = mmap(NULL, ARENA_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(arena != MAP_FAILED);

    record on_host = {0}, on_device = {0}, on_short = {0};
    loom_host old_core = make_host(NULL), device_core = make_host(&guarded),
              short_core = make_host(&guarded_short);
    the_host = &old_core;
    run(p, argv[2], &on_host);
    the_host = &device_core;
    run(p, argv[2], &on_device);
    long copies = copy_calls + copy_rows_calls, accumulates = accumulate_calls;
    the_host = &short_core;
    run(p, argv[2], &on_short);
    CHECK(arena_depth == 0);
    CHECK(arena_used > 0, "nothing was allocated on the device");
    CHECK(on_host.len == on_device.len && on_host.len == on_short.len && on_host.len > 0,
          "%zu bytes of results, then %zu, then %zu", on_host.len, on_device.len, on_short.len);
    CHECK(!memcmp(on_host.bytes, on_device.bytes, on_host.len),
          "the guarded run's results differ from the host memory run's");
    CHECK(!memcmp(on_host.bytes, on_short.bytes, on_host.len),
          "the run on the short service differs from the host memory run's");
    CHECK(max_copies < 0 || copies <= max_copies, "%ld copy and copy_rows calls, at most %ld",
          copies, max_copies);
    CHECK(accumulates >= min_accumulates, "%ld accumulate calls, at least %ld", accumulates,
          min_accumulates);
    printf("%s (%s): %zu bytes of results alike; %zu bytes of the model's memory never touched "
           "outside its calls; %ld copies and %ld accumulates on the full service\n",
           p->header.name, argv[2], on_host.len, arena_used, copies, accumulates);
    free(on_short.bytes);
    free(on_host.bytes);
    free(on_device.bytes);
    return check_done("strategy.guarded");
}
