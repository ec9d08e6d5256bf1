/* loom core — matrix products on oneDNN or OpenBLAS (see gemm.h).
 *
 * oneDNN: a matmul primitive is specific to its shape, strides, dtypes,
 * alpha and beta, and creating one costs far more than running a small
 * one, so each is created the first time its key is seen and kept in an
 * open-addressing table for the life of the process. The memory objects
 * are created with the primitive and pointed at the caller's buffers on
 * each call. A stream and its memory objects serve one thread at a time,
 * so each thread that multiplies keeps its own table and stream (the
 * engine is shared; oneDNN's own cache makes a second thread's primitive
 * of a known shape cheap): the model's products come from one thread,
 * which oneDNN threads inside with OpenMP, and attention's tile products
 * from the kernels' threads at once, each alone on its core. */
#include "model/gemm.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom/status.h"
#include "model/kernels.h"
#include "runtime/cpu.h"
#include "runtime/log.h"

#ifdef LOOM_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

static loom_gemm_library library_in_use = LOOM_GEMM_AUTO; /* resolved on first use */
static loom_dtype multiply_dtype = LOOM_F32;
/* Why a 16-bit run's products multiply in f32; "" when they multiply in
 * its own dtype. */
static char products_note[256];

/* ---------------------------------------------------------------- errors */

/* The first product that failed and was not yet taken: its status and
 * detail, written by whichever thread failed (attention's products run on
 * the kernels' threads) and taken by the model's. */
static pthread_mutex_t failure_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int failure_pending; /* the model asks after every unit: no lock when none */
static int failure_status;
static char failure_detail[512];

static void record_failure(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void record_failure(int status, const char *fmt, ...)
{
    pthread_mutex_lock(&failure_lock);
    if (failure_status == LOOM_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(failure_detail, sizeof failure_detail, fmt, ap);
        va_end(ap);
        failure_status = status;
        atomic_store(&failure_pending, 1);
    }
    pthread_mutex_unlock(&failure_lock);
}

int loom_gemm_take_error(void)
{
    if (!atomic_load(&failure_pending))
        return LOOM_OK;
    char detail[sizeof failure_detail];
    pthread_mutex_lock(&failure_lock);
    const int status = failure_status;
    failure_status = LOOM_OK;
    atomic_store(&failure_pending, 0);
    memcpy(detail, failure_detail, sizeof detail);
    pthread_mutex_unlock(&failure_lock);
    return status == LOOM_OK ? LOOM_OK : loom_fail(status, "%s", detail);
}

#ifdef LOOM_HAVE_ONEDNN
/* "bf16 x f32 product 512x3072x768 (a, b transposed)": what failed. */
static const char *product_text(char *buf, size_t cap, int M, int N, int K,
                                const loom_gemm_operand *a, const loom_gemm_operand *b,
                                loom_dtype multiply)
{
    snprintf(buf, cap, "%s product %dx%dx%d of %s x %s operands (a%s, b%s)",
             loom_dtype_name(multiply), M, N, K, loom_dtype_name(a->dtype),
             loom_dtype_name(b->dtype), a->transposed ? " transposed" : "",
             b->transposed ? " transposed" : "");
    return buf;
}
#endif

/* c of a product that failed: NaN, so that a result nobody checked shows. */
static void poison(float *c, int ldc, int M, int N)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            c[(size_t)i * ldc + j] = NAN;
}

int loom_gemm_library_parse(const char *name)
{
    if (!strcmp(name, "auto"))
        return LOOM_GEMM_AUTO;
    if (!strcmp(name, "onednn"))
        return LOOM_GEMM_ONEDNN;
    if (!strcmp(name, "openblas"))
        return LOOM_GEMM_OPENBLAS;
    return -1;
}

int loom_gemm_library_built(loom_gemm_library library)
{
#ifdef LOOM_HAVE_ONEDNN
    (void)library;
    return 1;
#else
    return library != LOOM_GEMM_ONEDNN;
#endif
}

static loom_gemm_library resolve(loom_gemm_library library)
{
    if (library != LOOM_GEMM_AUTO)
        return library;
    return loom_gemm_library_built(LOOM_GEMM_ONEDNN) ? LOOM_GEMM_ONEDNN : LOOM_GEMM_OPENBLAS;
}

#ifdef LOOM_HAVE_ONEDNN
static const char *onednn_bf16_refusal(void);
#endif

int loom_gemm_select(loom_gemm_library library, loom_dtype precision)
{
    if (!loom_gemm_library_built(library))
        return loom_fail(LOOM_ERR_NOT_SUPPORTED,
                         "model.gemm = \"onednn\", but this loom was built without oneDNN "
                         "(Debian: apt-get install libdnnl-dev, then rebuild; or use \"auto\")");
    loom_gemm_library resolved = resolve(library);
    library_in_use = resolved;
    loom_dtype multiply = precision == LOOM_BF16 ? LOOM_BF16 : LOOM_F32;
    const char *why = NULL;
    if (precision == LOOM_F16)
        why = "no CPU here multiplies f16 faster than f32";
    else if (precision == LOOM_BF16 && resolved == LOOM_GEMM_OPENBLAS)
        why = "OpenBLAS has no bf16 product";
#ifdef LOOM_HAVE_ONEDNN
    else if (precision == LOOM_BF16)
        why = onednn_bf16_refusal();
#endif
    products_note[0] = '\0';
    if (why) {
        multiply = LOOM_F32;
        snprintf(products_note, sizeof products_note, "%s storage, f32 products: %s",
                 loom_dtype_name(precision), why);
    }
    multiply_dtype = multiply;
    return LOOM_OK;
}

const char *loom_gemm_products_note(void) { return products_note; }

loom_gemm_library loom_gemm_library_in_use(void) { return resolve(library_in_use); }
loom_dtype loom_gemm_multiply_dtype(void) { return multiply_dtype; }

static int threads_chosen;

void loom_gemm_set_threads(int threads)
{
    threads_chosen = 1;
    if (threads < 1)
        threads = 1;
    openblas_set_num_threads(threads);
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
}

/* The bf16 products' operand scratch (only oneDNN multiplies in bf16). */
static struct {
    void *buf;
    size_t bytes;
} lent;

void loom_gemm_lend_scratch(void *buf, size_t bytes)
{
    lent.buf = buf;
    lent.bytes = buf ? bytes : 0;
}

/* Room for the bf16 copies of both operands of a rows x width by
 * width x width product. */
size_t loom_gemm_scratch_bytes(size_t rows, size_t width) { return 2 * (2 * rows * width); }

/* ---------------------------------------------------------------- OpenBLAS */

/* A buffer of the library's own, grown as needed: OpenBLAS's f32 copies
 * of bf16 operands (it has none), oneDNN's bf16 copies when no scratch
 * was lent. */
typedef struct scratch {
    void *data;
    size_t bytes;
} scratch;

/* NULL, with the failure recorded, when memory runs out. */
static void *scratch_get(scratch *s, size_t bytes)
{
    if (bytes > s->bytes) {
        free(s->data);
        s->data = malloc(bytes);
        s->bytes = s->data ? bytes : 0;
        if (!s->data)
            record_failure(LOOM_ERR_NO_MEMORY,
                           "gemm: out of memory for %zu bytes of operand copies (host memory)",
                           bytes);
    }
    return s->data;
}

static _Thread_local scratch operand_scratch[2];

/* The operand rewritten contiguously in dtype into out: its stored rows
 * (rows x cols as laid out in memory), now with ld = cols. */
static loom_gemm_operand converted(const loom_gemm_operand *x, int rows, int cols, loom_dtype dtype,
                                   void *out)
{
    size_t es = dtype == LOOM_F32 ? 4 : 2, xs = x->dtype == LOOM_F32 ? 4 : 2;
    if (x->ld == cols || rows == 1) /* one span: loom_convert threads it */
        loom_convert(out, dtype, x->data, x->dtype, (size_t)rows * cols);
    else {
        /* rows apart: as many threads as the products use, each its rows */
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if ((size_t)rows * cols >= 65536)
#endif
        for (int r = 0; r < rows; r++)
            loom_convert((char *)out + (size_t)r * cols * es, dtype,
                         (const char *)x->data + (size_t)r * x->ld * xs, x->dtype, (size_t)cols);
    }
    return (loom_gemm_operand){out, dtype, cols, x->transposed};
}

/* The operands in f32: those in bf16 widened into the thread's scratch.
 * 0, with the failure recorded, when the scratch cannot be had. */
static int widened(int M, int N, int K, loom_gemm_operand *a, loom_gemm_operand *b)
{
    if (a->dtype != LOOM_F32) {
        void *out = scratch_get(&operand_scratch[0], (size_t)M * K * 4);
        if (!out)
            return 0;
        *a = converted(a, a->transposed ? K : M, a->transposed ? M : K, LOOM_F32, out);
    }
    if (b->dtype != LOOM_F32) {
        void *out = scratch_get(&operand_scratch[1], (size_t)K * N * 4);
        if (!out)
            return 0;
        *b = converted(b, b->transposed ? N : K, b->transposed ? K : N, LOOM_F32, out);
    }
    return 1;
}

static void openblas_gemm(float *c, int ldc, int M, int N, int K, loom_gemm_operand a,
                          loom_gemm_operand b, float alpha, float beta)
{
    if (!widened(M, N, K, &a, &b)) {
        poison(c, ldc, M, N);
        return;
    }
    cblas_sgemm(CblasRowMajor, a.transposed ? CblasTrans : CblasNoTrans,
                b.transposed ? CblasTrans : CblasNoTrans, M, N, K, alpha, a.data, a.ld, b.data,
                b.ld, beta, c, ldc);
}

/* ---------------------------------------------------------------- oneDNN */

#ifdef LOOM_HAVE_ONEDNN

typedef struct gemm_key {
    int M, N, K, lda, ldb, ldc;
    unsigned char ta, tb, dtype_a, dtype_b;
    float alpha, beta;
} gemm_key;

typedef struct gemm_entry {
    gemm_key key;
    int used;
    dnnl_primitive_t primitive;
    dnnl_memory_t a, b, c;
} gemm_entry;

static dnnl_engine_t dnn_engine; /* NULL when oneDNN refused to make one */
static dnnl_status_t dnn_engine_status;
static pthread_once_t dnn_engine_once = PTHREAD_ONCE_INIT;

/* One thread's stream and primitives. */
static _Thread_local struct {
    int ready;
    dnnl_stream_t stream;
    gemm_entry *table;
    size_t capacity, count;
} dnn;

static const char *isa_name(dnnl_cpu_isa_t isa)
{
    switch (isa) {
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_sse41: return "sse41";
    default: return "no jit isa";
    }
}

static const char *status_name(dnnl_status_t status)
{
    switch (status) {
    case dnnl_out_of_memory: return "out of memory";
    case dnnl_invalid_arguments: return "invalid arguments";
    case dnnl_unimplemented: return "unimplemented";
    case dnnl_runtime_error: return "runtime error";
    default: return "failed";
    }
}

/* oneDNN dispatches no higher than loom's level (LOOM_MAX_ISA), unless
 * oneDNN's own variable says where: a cap must be set before oneDNN
 * generates any code, so here, as the engine is made. */
static void dnn_cap_isa(void)
{
    if (getenv("ONEDNN_MAX_CPU_ISA") || getenv("DNNL_MAX_CPU_ISA"))
        return;
    const loom_isa isa = loom_cpu_isa();
    if (isa >= loom_cpu_detected_isa())
        return;
    static const dnnl_cpu_isa_t caps[LOOM_ISA_COUNT] = {
        [LOOM_ISA_BASELINE] = dnnl_cpu_isa_sse41,
        [LOOM_ISA_AVX2] = dnnl_cpu_isa_avx2,
        [LOOM_ISA_AVX512] = dnnl_cpu_isa_avx512_core,
        [LOOM_ISA_AVX512_BF16] = dnnl_cpu_isa_avx512_core_bf16,
        [LOOM_ISA_AMX] = dnnl_cpu_isa_all,
    };
    if (dnnl_set_max_cpu_isa(caps[isa]) != dnnl_success)
        loom_log(LOOM_LOG_WARN,
                 "gemm: oneDNN did not take the cap to %s: its products may use "
                 "instructions above it",
                 loom_isa_name(isa));
}

static void dnn_create_engine(void)
{
    if (!threads_chosen) /* one thread unless asked (train.threads): ranks share the cores */
        loom_gemm_set_threads(1);
    dnn_cap_isa();
    dnn_engine_status = dnnl_engine_create(&dnn_engine, dnnl_cpu, 0);
    if (dnn_engine_status != dnnl_success)
        dnn_engine = NULL;
}

/* 0, with the failure recorded, when oneDNN cannot run on this thread. */
static int dnn_start(void)
{
    if (dnn.ready)
        return 1;
    pthread_once(&dnn_engine_once, dnn_create_engine);
    dnnl_status_t status = dnn_engine_status;
    if (dnn_engine)
        status = dnnl_stream_create(&dnn.stream, dnn_engine, dnnl_stream_default_flags);
    if (status != dnnl_success) {
        record_failure(LOOM_ERR_INTERNAL,
                       "gemm: oneDNN cannot start on this CPU (isa %s): %s making its %s; "
                       "model.gemm = \"openblas\" multiplies without it",
                       loom_cpu_describe(), status_name(status), dnn_engine ? "stream" : "engine");
        return 0;
    }
    dnn.ready = 1;
    return 1;
}

static dnnl_data_type_t dnn_type(loom_dtype t) { return t == LOOM_BF16 ? dnnl_bf16 : dnnl_f32; }

/* The (rows, cols) matrix of an operand, as strides of its memory. */
static dnnl_status_t dnn_desc(dnnl_memory_desc_t *md, int rows, int cols, int ld, int transposed,
                              dnnl_data_type_t type)
{
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {transposed ? 1 : ld, transposed ? ld : 1};
    return dnnl_memory_desc_init_by_strides(md, 2, dims, type, strides);
}

static void dnn_destroy(gemm_entry *e)
{
    if (e->primitive)
        dnnl_primitive_destroy(e->primitive);
    if (e->a)
        dnnl_memory_destroy(e->a);
    if (e->b)
        dnnl_memory_destroy(e->b);
    if (e->c)
        dnnl_memory_destroy(e->c);
    e->primitive = NULL, e->a = e->b = e->c = NULL;
}

/* The primitive and memory objects of e's key; on failure, its status,
 * with *step naming what was refused, and nothing left made. */
static dnnl_status_t dnn_create(gemm_entry *e, const char **step)
{
#define DNN_TRY(call, what)                                                                        \
    if ((status = (call)) != dnnl_success) {                                                       \
        *step = what;                                                                              \
        goto done;                                                                                 \
    }
    const gemm_key *k = &e->key;
    dnnl_status_t status;
    dnnl_memory_desc_t a_md, b_md, c_md;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    e->primitive = NULL, e->a = e->b = e->c = NULL;
    DNN_TRY(dnn_desc(&a_md, k->M, k->K, k->lda, k->ta, k->dtype_a), "memory descriptor of a");
    DNN_TRY(dnn_desc(&b_md, k->K, k->N, k->ldb, k->tb, k->dtype_b), "memory descriptor of b");
    DNN_TRY(dnn_desc(&c_md, k->M, k->N, k->ldc, 0, dnnl_f32), "memory descriptor of c");
    DNN_TRY(dnnl_matmul_desc_init(&desc, &a_md, &b_md, NULL, &c_md), "matmul descriptor");
    DNN_TRY(dnnl_primitive_attr_create(&attr), "attributes");
    if (k->alpha != 1.0f)
        DNN_TRY(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha), "output scale");
    if (k->beta != 0.0f) {
        DNN_TRY(dnnl_post_ops_create(&ops), "post-ops");
        DNN_TRY(dnnl_post_ops_append_sum(ops, k->beta), "sum post-op");
        DNN_TRY(dnnl_primitive_attr_set_post_ops(attr, ops), "post-ops");
    }
    DNN_TRY(dnnl_primitive_desc_create(&pd, &desc, attr, dnn_engine, NULL),
            "matmul primitive descriptor");
    DNN_TRY(dnnl_primitive_create(&e->primitive, pd), "matmul primitive");
    DNN_TRY(dnnl_memory_create(&e->a, &a_md, dnn_engine, DNNL_MEMORY_NONE), "memory of a");
    DNN_TRY(dnnl_memory_create(&e->b, &b_md, dnn_engine, DNNL_MEMORY_NONE), "memory of b");
    DNN_TRY(dnnl_memory_create(&e->c, &c_md, dnn_engine, DNNL_MEMORY_NONE), "memory of c");
#undef DNN_TRY
done:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (ops)
        dnnl_post_ops_destroy(ops);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    if (status != dnnl_success)
        dnn_destroy(e);
    return status;
}

static uint64_t key_hash(const gemm_key *k)
{
    const unsigned char *p = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < sizeof *k; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static gemm_entry *dnn_find(const gemm_key *k);

/* 0 when memory runs out (the table stays as it was). */
static int dnn_grow(void)
{
    gemm_entry *old = dnn.table;
    size_t old_capacity = dnn.capacity;
    gemm_entry *table = calloc(old_capacity ? 2 * old_capacity : 64, sizeof *table);
    if (!table)
        return 0;
    dnn.table = table;
    dnn.capacity = old_capacity ? 2 * old_capacity : 64;
    for (size_t i = 0; i < old_capacity; i++)
        if (old[i].used)
            *dnn_find(&old[i].key) = old[i];
    free(old);
    return 1;
}

/* The slot of key: its entry, or the free slot where it belongs. */
static gemm_entry *dnn_find(const gemm_key *k)
{
    size_t i = key_hash(k) & (dnn.capacity - 1);
    while (dnn.table[i].used && memcmp(&dnn.table[i].key, k, sizeof *k))
        i = (i + 1) & (dnn.capacity - 1);
    return &dnn.table[i];
}

static void onednn_refused(dnnl_status_t status, const char *step, int M, int N, int K,
                           const loom_gemm_operand *a, const loom_gemm_operand *b,
                           loom_dtype multiply)
{
    char product[160];
    const dnnl_version_t *v = dnnl_version();
    record_failure(status == dnnl_out_of_memory ? LOOM_ERR_NO_MEMORY : LOOM_ERR_NOT_SUPPORTED,
                   "gemm: oneDNN %d.%d.%d cannot run the %s on this CPU (isa %s; oneDNN at %s): "
                   "%s at the %s; model.gemm = \"openblas\" multiplies without it",
                   v->major, v->minor, v->patch,
                   product_text(product, sizeof product, M, N, K, a, b, multiply),
                   loom_cpu_describe(), isa_name(dnnl_get_effective_cpu_isa()), status_name(status),
                   step);
}

/* 0, with the failure recorded, when oneDNN refuses the product. */
static int onednn_run(float *c, int ldc, int M, int N, int K, loom_gemm_operand a,
                      loom_gemm_operand b, float alpha, float beta, loom_dtype multiply)
{
    gemm_key key;
    memset(&key, 0, sizeof key); /* the padding is hashed and compared */
    key.M = M, key.N = N, key.K = K, key.lda = a.ld, key.ldb = b.ld, key.ldc = ldc;
    key.ta = (unsigned char)a.transposed, key.tb = (unsigned char)b.transposed;
    key.dtype_a = (unsigned char)dnn_type(a.dtype), key.dtype_b = (unsigned char)dnn_type(b.dtype);
    key.alpha = alpha, key.beta = beta;
    if (2 * (dnn.count + 1) > dnn.capacity && !dnn_grow()) {
        onednn_refused(dnnl_out_of_memory, "primitive cache", M, N, K, &a, &b, multiply);
        return 0;
    }
    gemm_entry *e = dnn_find(&key);
    if (!e->used) {
        gemm_entry made = {.key = key};
        const char *step = "";
        dnnl_status_t status = dnn_create(&made, &step);
        if (status != dnnl_success) {
            onednn_refused(status, step, M, N, K, &a, &b, multiply);
            return 0;
        }
        made.used = 1;
        *e = made;
        dnn.count++;
    }
    dnnl_status_t status = dnnl_memory_set_data_handle(e->a, (void *)a.data);
    if (status == dnnl_success)
        status = dnnl_memory_set_data_handle(e->b, (void *)b.data);
    if (status == dnnl_success)
        status = dnnl_memory_set_data_handle(e->c, c);
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, e->a}, {DNNL_ARG_WEIGHTS, e->b}, {DNNL_ARG_DST, e->c}};
    if (status == dnnl_success)
        status = dnnl_primitive_execute(e->primitive, dnn.stream, 3, args);
    if (status == dnnl_success)
        status = dnnl_stream_wait(dnn.stream);
    if (status != dnnl_success) {
        onednn_refused(status, "execution", M, N, K, &a, &b, multiply);
        return 0;
    }
    return 1;
}

/* The operand's element (r, c) from on: the same view, moved. */
static loom_gemm_operand moved(loom_gemm_operand x, int r, int c)
{
    size_t es = x.dtype == LOOM_F32 ? 4 : 2;
    size_t offset = x.transposed ? (size_t)c * x.ld + r : (size_t)r * x.ld + c;
    x.data = (const char *)x.data + offset * es;
    return x;
}

/* A bf16 product: the operands' bf16 copies in the scratch, split in
 * halves along the largest dimension while they do not fit (a split of K
 * accumulates its second half onto the first). 0, with the failure
 * recorded, when a part fails. */
static int onednn_bf16(float *c, int ldc, int M, int N, int K, loom_gemm_operand a,
                       loom_gemm_operand b, float alpha, float beta, char *buf, size_t bytes)
{
    size_t need_a = a.dtype != LOOM_BF16 ? (size_t)M * K * 2 : 0;
    size_t need_b = b.dtype != LOOM_BF16 ? (size_t)K * N * 2 : 0;
    if (need_a + need_b > bytes && (M > 1 || N > 1 || K > 1)) {
        if (M >= N && M >= K) {
            int h = M / 2;
            return onednn_bf16(c, ldc, h, N, K, a, b, alpha, beta, buf, bytes) &&
                   onednn_bf16(c + (size_t)h * ldc, ldc, M - h, N, K, moved(a, h, 0), b, alpha,
                               beta, buf, bytes);
        } else if (N >= K) {
            int h = N / 2;
            return onednn_bf16(c, ldc, M, h, K, a, b, alpha, beta, buf, bytes) &&
                   onednn_bf16(c + h, ldc, M, N - h, K, a, moved(b, 0, h), alpha, beta, buf, bytes);
        } else {
            int h = K / 2;
            return onednn_bf16(c, ldc, M, N, h, a, b, alpha, beta, buf, bytes) &&
                   onednn_bf16(c, ldc, M, N, K - h, moved(a, 0, h), moved(b, h, 0), alpha, 1.0f,
                               buf, bytes);
        }
    }
    if (need_a + need_b > bytes) {
        record_failure(LOOM_ERR_INVALID,
                       "gemm: %zu bytes of lent operand scratch cannot hold one bf16 element",
                       bytes);
        return 0;
    }
    if (need_a) {
        a = converted(&a, a.transposed ? K : M, a.transposed ? M : K, LOOM_BF16, buf);
        buf += need_a;
    }
    if (need_b)
        b = converted(&b, b.transposed ? N : K, b.transposed ? K : N, LOOM_BF16, buf);
    return onednn_run(c, ldc, M, N, K, a, b, alpha, beta, LOOM_BF16);
}

static _Thread_local scratch own_scratch;

/* Inside the kernels' threads (attention's tile products). */
static int on_kernel_thread(void)
{
#ifdef _OPENMP
    return omp_in_parallel();
#else
    return 0;
#endif
}

static int onednn_gemm(float *c, int ldc, int M, int N, int K, loom_gemm_operand a,
                       loom_gemm_operand b, float alpha, float beta, loom_dtype multiply)
{
    if (!dnn_start())
        return 0;
    if (multiply != LOOM_BF16)
        return widened(M, N, K, &a, &b) && onednn_run(c, ldc, M, N, K, a, b, alpha, beta, multiply);
    /* the lent buffer is the model's thread's */
    void *buf = on_kernel_thread() ? NULL : lent.buf;
    size_t bytes = buf ? lent.bytes : 0;
    if (!buf) { /* nobody lent one: a buffer that fits the whole product */
        bytes = (size_t)M * K * 2 + (size_t)K * N * 2;
        if (!(buf = scratch_get(&own_scratch, bytes)))
            return 0;
    }
    return onednn_bf16(c, ldc, M, N, K, a, b, alpha, beta, buf, bytes);
}

/* Why this CPU's bf16 products cannot run on oneDNN; NULL when they can:
 * where the instructions exist (emulated bf16 runs slower than f32) and
 * oneDNN makes such a product. */
static const char *onednn_bf16_refusal(void)
{
    static char why[192];
    if (loom_cpu_detected_isa() < LOOM_ISA_AVX512_BF16)
        return "this CPU has no bf16 instructions";
    if (loom_cpu_isa() < LOOM_ISA_AVX512_BF16) {
        snprintf(why, sizeof why, "no bf16 instructions at %s", loom_isa_name(loom_cpu_isa()));
        return why;
    }
    if (!dnn_start())
        return "oneDNN cannot start";
    const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    if ((isa & dnnl_cpu_isa_avx512_core_bf16) != dnnl_cpu_isa_avx512_core_bf16) {
        snprintf(why, sizeof why,
                 "oneDNN dispatches to %s here (ONEDNN_MAX_CPU_ISA), which has no "
                 "bf16 instructions",
                 isa_name(isa));
        return why;
    }
    gemm_entry probe = {.key = {.M = 16,
                                .N = 16,
                                .K = 16,
                                .lda = 16,
                                .ldb = 16,
                                .ldc = 16,
                                .dtype_a = dnnl_bf16,
                                .dtype_b = dnnl_bf16,
                                .alpha = 1.0f}};
    const char *step = "";
    dnnl_status_t status = dnn_create(&probe, &step);
    if (status != dnnl_success) {
        snprintf(why, sizeof why, "oneDNN makes no bf16 product on this CPU (%s at the %s)",
                 status_name(status), step);
        return why;
    }
    dnn_destroy(&probe);
    return NULL;
}
#endif

/* ---------------------------------------------------------------- both */

void loom_gemm(float *c, int ldc, int M, int N, int K, loom_gemm_operand a, loom_gemm_operand b,
               float alpha, float beta, loom_dtype multiply)
{
    if (M <= 0 || N <= 0)
        return;
    if (K <= 0) { /* an empty sum: c = beta · c */
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++)
                c[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : c[(size_t)i * ldc + j];
        return;
    }
    if (multiply != LOOM_BF16)
        multiply = LOOM_F32;
#ifdef LOOM_HAVE_ONEDNN
    if (loom_gemm_library_in_use() == LOOM_GEMM_ONEDNN) {
        if (!onednn_gemm(c, ldc, M, N, K, a, b, alpha, beta, multiply))
            poison(c, ldc, M, N);
        return;
    }
#endif
    openblas_gemm(c, ldc, M, N, K, a, b, alpha, beta);
}

const char *loom_gemm_describe(void)
{
    static char text[96];
#ifdef LOOM_HAVE_ONEDNN
    if (loom_gemm_library_in_use() == LOOM_GEMM_ONEDNN) {
        const char *dtype = multiply_dtype == LOOM_BF16 ? "bf16" : "f32";
        const dnnl_version_t *v = dnnl_version();
        snprintf(text, sizeof text, "oneDNN %d.%d.%d %s (%s)", v->major, v->minor, v->patch, dtype,
                 isa_name(dnnl_get_effective_cpu_isa()));
        return text;
    }
#endif
    snprintf(text, sizeof text, "%sf32 (%s)", &OPENBLAS_VERSION[1], openblas_get_corename());
    return text;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int compare_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double loom_gemm_measure(int M, int N, int K, double seconds)
{
    float *a = malloc((size_t)M * K * sizeof(float));
    float *b = malloc((size_t)N * K * sizeof(float));
    float *c = malloc((size_t)M * N * sizeof(float));
    double rate = 0;
    if (a && b && c) {
        for (size_t i = 0; i < (size_t)M * K; i++)
            a[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
        for (size_t i = 0; i < (size_t)N * K; i++)
            b[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
        loom_dtype multiply = loom_gemm_multiply_dtype();
        loom_gemm_operand x = loom_gemm_f32(a, K, 0), w = loom_gemm_f32(b, K, 1);
        loom_gemm(c, N, M, N, K, x, w, 1.0f, 0.0f, multiply); /* warm-up, primitive creation */
        if (!isfinite(c[0])) /* a product that failed (the inputs give finite sums) */
            goto done;
        double one = now_s();
        loom_gemm(c, N, M, N, K, x, w, 1.0f, 0.0f, multiply);
        one = now_s() - one;
        enum { REPEATS = 5 };
        int per_repeat = (int)(seconds / REPEATS / (one > 1e-6 ? one : 1e-6));
        if (per_repeat < 1)
            per_repeat = 1;
        double rates[REPEATS];
        for (int r = 0; r < REPEATS; r++) {
            double t0 = now_s();
            for (int i = 0; i < per_repeat; i++)
                loom_gemm(c, N, M, N, K, x, w, 1.0f, 0.0f, multiply);
            rates[r] = 2.0 * M * N * K * per_repeat / (now_s() - t0);
        }
        /* the best repeat: a peak, which a busy moment on the machine lowers */
        qsort(rates, REPEATS, sizeof *rates, compare_double);
        rate = rates[REPEATS - 1];
    }
done:
    free(a);
    free(b);
    free(c);
    return rate;
}
