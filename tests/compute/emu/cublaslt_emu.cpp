/* cuBLASLt emulated on the CPU, for compute-cuda's CPU emulation: the
 * functions plugins/compute-cuda/compute_cuda.c (and cuda_gemm_peak.c)
 * call, declared by the toolkit's own <cublasLt.h>. "Device" memory is
 * host memory here (the emulated runtime's), so every pointer is read
 * directly, and the work runs at issue (the emulated streams are
 * synchronous).
 *
 * cublasLtMatmul computes D = alpha op(A) op(B) + beta C, column-major,
 * strided batches; A and B in CUDA_R_32F, CUDA_R_16BF or CUDA_R_16F (both
 * the same), C and D in CUDA_R_32F or A's 16-bit type (both the same);
 * alpha and beta floats on the host; each element of D a float sum over k
 * in order (C is not read when beta is 0, as BLAS does). TF32 compute
 * rounds the f32 inputs to TF32 first.
 *
 * Checked as the real library checks, with one line on stderr naming the
 * problem: descriptor attributes of the wrong size or value, dimensions
 * that do not fit together, a leading dimension below the rows, batch
 * counts that differ, type combinations cuBLASLt has no kernel for,
 * operands less aligned than the algorithm was chosen for. The emulation
 * also refuses what a GPU would not report: batch members of D that
 * overlap, D over A or B, and an algorithm not returned by the heuristic.
 *
 * The heuristic has no algorithm (CUBLAS_STATUS_NOT_SUPPORTED, none
 * returned) for a 16-bit product whose A or B is not 16-byte aligned, or
 * whose leading dimension or batch stride is not a multiple of 16 bytes:
 * a GPU's cuBLASLt may refuse such shapes, and compute_cuda.c then runs
 * the product widened to f32; the emulation refuses them always so that
 * path runs. CUBLASLT_EMU_16BIT=any accepts every 16-bit shape instead,
 * =none refuses every one. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

namespace {

const uint32_t HANDLE_MAGIC = 0x4c54484e;  /* "LTHN" */
const uint32_t DESC_MAGIC = 0x4c544445;    /* "LTDE" */
const uint32_t LAYOUT_MAGIC = 0x4c544c41;  /* "LTLA" */
const uint32_t PREF_MAGIC = 0x4c545052;    /* "LTPR" */
const uint32_t ALGO_MAGIC = 0x4c54414c;    /* "LTAL" */

struct desc_state {
    uint32_t magic;
    int32_t compute;      /* cublasComputeType_t */
    int32_t scale;        /* cudaDataType_t */
    int32_t pointer_mode; /* cublasLtPointerMode_t */
    int32_t transa, transb;
    uint32_t epilogue;
};

struct layout_state {
    uint32_t magic;
    uint32_t type; /* cudaDataType_t */
    int32_t order;
    int32_t batch;
    uint64_t rows, cols;
    int64_t ld, stride;
};

struct pref_state {
    uint32_t magic;
    uint32_t search_mode;
    uint32_t reduction_mask;
    uint32_t align[4]; /* A, B, C, D */
    uint64_t max_workspace;
};

/* What an algorithm was chosen for: a later product must match it. */
struct algo_state {
    uint32_t magic;
    int32_t compute;
    uint32_t ab_type, cd_type;
    int32_t transa, transb;
    uint32_t align[4];
};

static_assert(sizeof(desc_state) <= sizeof(cublasLtMatmulDescOpaque_t), "desc fits");
static_assert(sizeof(layout_state) <= sizeof(cublasLtMatrixLayoutOpaque_t), "layout fits");
static_assert(sizeof(pref_state) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "pref fits");
static_assert(sizeof(algo_state) <= sizeof(cublasLtMatmulAlgo_t), "algo fits");

/* The states live in the opaque structs' words, copied in and out (the
 * opaque types are arrays of uint64_t). */
template <class State, class Opaque> State load(const Opaque *o)
{
    State s;
    memcpy(&s, o->data, sizeof s);
    return s;
}

template <class State, class Opaque> void store(Opaque *o, const State &s)
{
    memcpy(o->data, &s, sizeof s);
}

void complain(const char *call, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void complain(const char *call, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cublaslt-emu: %s: %s\n", call, line);
}

/* An attribute's value, when buf holds exactly its size. */
template <class T> bool read_attr(const void *buf, size_t size, T *out)
{
    if (!buf || size != sizeof(T))
        return false;
    memcpy(out, buf, sizeof(T));
    return true;
}

template <class T>
cublasStatus_t write_attr(void *buf, size_t size, size_t *written, const T &value)
{
    if (!buf && !written)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (written)
        *written = sizeof(T);
    if (!buf)
        return CUBLAS_STATUS_SUCCESS; /* asked for the size only */
    if (size < sizeof(T))
        return CUBLAS_STATUS_INVALID_VALUE;
    memcpy(buf, &value, sizeof(T));
    return CUBLAS_STATUS_SUCCESS;
}

size_t element_size(uint32_t type)
{
    switch (type) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF:
    case CUDA_R_16F: return 2;
    default: return 0;
    }
}

const char *type_name(uint32_t type)
{
    switch (type) {
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_16F: return "CUDA_R_16F";
    default: return "a type the emulation lacks";
    }
}

bool valid_op(int32_t op)
{
    return op == CUBLAS_OP_N || op == CUBLAS_OP_T;
}

/* The largest power of two (<= 256) dividing the address of every batch
 * member (stride bytes apart). */
uint32_t alignment_of(const void *p, int64_t stride_bytes, int32_t batch)
{
    uint64_t bits = (uint64_t)(uintptr_t)p | 256u;
    if (batch > 1)
        bits |= (uint64_t)stride_bytes;
    return (uint32_t)(bits & (~bits + 1));
}

/* A product's parts, checked for fitting together. */
struct problem {
    desc_state op;
    layout_state a, b, c, d;
    uint64_t m, n, k;
};

cublasStatus_t describe(const char *call, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t A,
                        cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
                        cublasLtMatrixLayout_t D, problem *p)
{
    if (!desc || !A || !B || !C || !D) {
        complain(call, "a descriptor or layout is NULL");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    p->op = load<desc_state>(desc);
    p->a = load<layout_state>(A);
    p->b = load<layout_state>(B);
    p->c = load<layout_state>(C);
    p->d = load<layout_state>(D);
    if (p->op.magic != DESC_MAGIC) {
        complain(call, "the matmul descriptor was not made by cublasLtMatmulDescCreate "
                       "(or was destroyed)");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const layout_state *all[4] = {&p->a, &p->b, &p->c, &p->d};
    const char *names = "ABCD";
    for (int i = 0; i < 4; i++) {
        const layout_state &l = *all[i];
        if (l.magic != LAYOUT_MAGIC) {
            complain(call, "layout %c was not made by cublasLtMatrixLayoutCreate "
                           "(or was destroyed)", names[i]);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        if (l.order != CUBLASLT_ORDER_COL) {
            complain(call, "layout %c: order %d; the emulation has column-major only",
                     names[i], (int)l.order);
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
        if (l.rows && l.ld < (int64_t)l.rows) {
            complain(call, "layout %c: ld %lld is below its %llu rows", names[i],
                     (long long)l.ld, (unsigned long long)l.rows);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        if (l.batch < 1) {
            complain(call, "layout %c: batch count %d", names[i], (int)l.batch);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        if (l.batch != p->d.batch) {
            complain(call, "layout %c has batch count %d but D has %d", names[i], (int)l.batch,
                     (int)p->d.batch);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    }
    const uint64_t a_rows = p->op.transa == CUBLAS_OP_T ? p->a.cols : p->a.rows;
    const uint64_t a_cols = p->op.transa == CUBLAS_OP_T ? p->a.rows : p->a.cols;
    const uint64_t b_rows = p->op.transb == CUBLAS_OP_T ? p->b.cols : p->b.rows;
    const uint64_t b_cols = p->op.transb == CUBLAS_OP_T ? p->b.rows : p->b.cols;
    if (a_cols != b_rows) {
        complain(call, "op(A) is %llux%llu and op(B) %llux%llu: the inner dimensions differ",
                 (unsigned long long)a_rows, (unsigned long long)a_cols,
                 (unsigned long long)b_rows, (unsigned long long)b_cols);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (p->d.rows != a_rows || p->d.cols != b_cols || p->c.rows != a_rows ||
        p->c.cols != b_cols) {
        complain(call, "op(A) op(B) is %llux%llu but C is %llux%llu and D %llux%llu",
                 (unsigned long long)a_rows, (unsigned long long)b_cols,
                 (unsigned long long)p->c.rows, (unsigned long long)p->c.cols,
                 (unsigned long long)p->d.rows, (unsigned long long)p->d.cols);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    p->m = a_rows;
    p->n = b_cols;
    p->k = a_cols;
    /* the emulation's own check: batched outputs written over each other */
    if (p->d.batch > 1 && p->m && p->n) {
        const uint64_t span = (p->n - 1) * (uint64_t)p->d.ld + p->m;
        const uint64_t stride = (uint64_t)(p->d.stride < 0 ? -p->d.stride : p->d.stride);
        if (stride < span) {
            complain(call, "D's batch members overlap: stride %lld, but each spans %llu "
                           "elements", (long long)p->d.stride, (unsigned long long)span);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* Whether cuBLASLt has kernels for the types; the reason if not. */
const char *types_refused(const problem &p)
{
    if (p.op.scale != CUDA_R_32F)
        return "the scale type is not CUDA_R_32F";
    if (p.op.pointer_mode != CUBLASLT_POINTER_MODE_HOST)
        return "alpha and beta are not host pointers (the emulation has those only)";
    if (p.op.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
        return "an epilogue (the emulation has CUBLASLT_EPILOGUE_DEFAULT only)";
    if (p.op.compute != CUBLAS_COMPUTE_32F && p.op.compute != CUBLAS_COMPUTE_32F_FAST_TF32)
        return "the compute type is neither CUBLAS_COMPUTE_32F nor _FAST_TF32";
    if (p.a.type != p.b.type)
        return "A and B differ in type";
    if (p.c.type != p.d.type)
        return "C and D differ in type";
    if (!element_size(p.a.type) || !element_size(p.c.type))
        return "a type other than CUDA_R_32F, CUDA_R_16BF and CUDA_R_16F";
    if (p.c.type != CUDA_R_32F && p.c.type != p.a.type)
        return "a 16-bit D of another type than A and B";
    if (p.op.compute == CUBLAS_COMPUTE_32F_FAST_TF32 && p.a.type != CUDA_R_32F)
        return "TF32 compute on 16-bit A and B";
    return nullptr;
}

/* The 16-bit shapes the emulation has no algorithm for (see the top). */
bool no_16bit_algorithm(const problem &p, const pref_state &pref)
{
    if (p.a.type == CUDA_R_32F)
        return false;
    const char *mode = getenv("CUBLASLT_EMU_16BIT");
    if (mode && !strcmp(mode, "any"))
        return false;
    if (mode && !strcmp(mode, "none"))
        return true;
    const layout_state *ops[2] = {&p.a, &p.b};
    for (int i = 0; i < 2; i++) {
        const int64_t es = (int64_t)element_size(ops[i]->type);
        if (pref.align[i] < 16 || (ops[i]->ld * es) % 16 != 0)
            return true;
        if (ops[i]->batch > 1 && (ops[i]->stride * es) % 16 != 0)
            return true;
    }
    return false;
}

pref_state default_pref()
{
    pref_state s;
    memset(&s, 0, sizeof s);
    s.magic = PREF_MAGIC;
    s.reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
    for (int i = 0; i < 4; i++)
        s.align[i] = 256;
    return s;
}

float read_element(const void *base, uint32_t type, size_t i)
{
    switch (type) {
    case CUDA_R_16BF: return __bfloat162float(static_cast<const __nv_bfloat16 *>(base)[i]);
    case CUDA_R_16F: return __half2float(static_cast<const __half *>(base)[i]);
    default: return static_cast<const float *>(base)[i];
    }
}

void write_element(void *base, uint32_t type, size_t i, float x)
{
    switch (type) {
    case CUDA_R_16BF: static_cast<__nv_bfloat16 *>(base)[i] = __float2bfloat16(x); break;
    case CUDA_R_16F: static_cast<__half *>(base)[i] = __float2half(x); break;
    default: static_cast<float *>(base)[i] = x; break;
    }
}

/* An f32 value as the tensor cores read it in TF32: 10 mantissa bits,
 * rounded to nearest, ties away (non-finite values as they are). */
float to_tf32(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) != 0x7f800000u) {
        u += 0x1000u;
        u &= 0xffffe000u;
    }
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Batch member i of a matrix (NULL stays NULL: an operand not read). */
const char *member(const void *base, int32_t i, const layout_state &l)
{
    if (!base)
        return nullptr;
    return static_cast<const char *>(base) +
           (ptrdiff_t)i * (ptrdiff_t)l.stride * (ptrdiff_t)element_size(l.type);
}

/* Whether two matrices' memory (first to last element of every member)
 * meets. */
bool overlap(const void *x, const layout_state &lx, const void *y, const layout_state &ly)
{
    if (!x || !y || !lx.rows || !lx.cols || !ly.rows || !ly.cols)
        return false;
    const layout_state *l[2] = {&lx, &ly};
    const void *p[2] = {x, y};
    uintptr_t lo[2], hi[2];
    for (int i = 0; i < 2; i++) {
        const int64_t last = (l[i]->batch > 1 ? (int64_t)(l[i]->batch - 1) * l[i]->stride : 0);
        const int64_t lo_el = last < 0 ? last : 0, hi_el = last > 0 ? last : 0;
        const int64_t es = (int64_t)element_size(l[i]->type);
        const int64_t span = ((int64_t)(l[i]->cols - 1) * l[i]->ld + (int64_t)l[i]->rows) * es;
        lo[i] = reinterpret_cast<uintptr_t>(p[i]) + (uintptr_t)(lo_el * es);
        hi[i] = reinterpret_cast<uintptr_t>(p[i]) + (uintptr_t)(hi_el * es + span);
    }
    return lo[0] < hi[1] && lo[1] < hi[0];
}

/* One batch member: op(A) packed as rows of k, op(B) as rows of n (one
 * per k), so every output's sum runs over k in order while the inner loop
 * walks n contiguous outputs. */
void multiply_member(const problem &p, const char *a, const char *b, const char *c, char *d,
                     float alpha, float beta, std::vector<float> &pa, std::vector<float> &pb,
                     std::vector<float> &acc)
{
    const uint64_t m = p.m, n = p.n, k = p.k;
    const bool tf32 = p.op.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    pa.resize(m * k);
    pb.resize(k * n);
    acc.resize(n);
    for (uint64_t r = 0; r < m; r++)
        for (uint64_t j = 0; j < k; j++) {
            /* op(A)(r, j) */
            const size_t at = p.op.transa == CUBLAS_OP_T ? (size_t)(r * (uint64_t)p.a.ld + j)
                                                         : (size_t)(j * (uint64_t)p.a.ld + r);
            const float x = read_element(a, p.a.type, at);
            pa[r * k + j] = tf32 ? to_tf32(x) : x;
        }
    for (uint64_t j = 0; j < k; j++)
        for (uint64_t col = 0; col < n; col++) {
            /* op(B)(j, col) */
            const size_t at = p.op.transb == CUBLAS_OP_T ? (size_t)(j * (uint64_t)p.b.ld + col)
                                                         : (size_t)(col * (uint64_t)p.b.ld + j);
            const float x = read_element(b, p.b.type, at);
            pb[j * n + col] = tf32 ? to_tf32(x) : x;
        }
    for (uint64_t r = 0; r < m; r++) {
        float *sum = acc.data();
        for (uint64_t col = 0; col < n; col++)
            sum[col] = 0.0f;
        for (uint64_t j = 0; j < k; j++) {
            const float x = pa[r * k + j];
            const float *row = &pb[j * n];
            for (uint64_t col = 0; col < n; col++)
                sum[col] += x * row[col];
        }
        for (uint64_t col = 0; col < n; col++) {
            float out = alpha * sum[col];
            if (beta != 0.0f)
                out += beta * read_element(c, p.c.type, (size_t)(col * (uint64_t)p.c.ld + r));
            write_element(d, p.d.type, (size_t)(col * (uint64_t)p.d.ld + r), out);
        }
    }
}

} // namespace

struct cublasLtContext {
    uint32_t magic;
};

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    if (!lightHandle)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtContext *h = new (std::nothrow) cublasLtContext;
    if (!h)
        return CUBLAS_STATUS_ALLOC_FAILED;
    h->magic = HANDLE_MAGIC;
    *lightHandle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle)
{
    if (!lightHandle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (lightHandle->magic != HANDLE_MAGIC) {
        complain("cublasLtDestroy", "not a handle made by cublasLtCreate (or destroyed twice)");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    lightHandle->magic = 0;
    delete lightHandle;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusName(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_UNKNOWN";
    }
}

const char *cublasLtGetStatusString(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "the operation completed successfully";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    default: return cublasLtGetStatusName(status);
    }
}

size_t cublasLtGetVersion(void)
{
    return CUBLAS_VERSION;
}

size_t cublasLtGetCudartVersion(void)
{
    return CUDART_VERSION;
}

cublasStatus_t cublasLtGetProperty(libraryPropertyType type, int *value)
{
    if (!value)
        return CUBLAS_STATUS_INVALID_VALUE;
    switch (type) {
    case MAJOR_VERSION: *value = CUBLAS_VER_MAJOR; return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION: *value = CUBLAS_VER_MINOR; return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL: *value = CUBLAS_VER_PATCH; return CUBLAS_STATUS_SUCCESS;
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
}

/* ------------------------------------------------------------ matmul descriptor */

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType)
{
    if (!matmulDesc)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatmulDescOpaque_t *o = new (std::nothrow) cublasLtMatmulDescOpaque_t;
    if (!o)
        return CUBLAS_STATUS_ALLOC_FAILED;
    memset(o, 0, sizeof *o);
    desc_state s;
    memset(&s, 0, sizeof s);
    s.magic = DESC_MAGIC;
    s.compute = computeType;
    s.scale = scaleType;
    s.pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    s.transa = CUBLAS_OP_N;
    s.transb = CUBLAS_OP_N;
    s.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    store(o, s);
    *matmulDesc = o;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc)
{
    if (!matmulDesc)
        return CUBLAS_STATUS_SUCCESS;
    if (load<desc_state>(matmulDesc).magic != DESC_MAGIC) {
        complain("cublasLtMatmulDescDestroy", "not a descriptor (or destroyed twice)");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    memset(matmulDesc, 0, sizeof *matmulDesc);
    delete matmulDesc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes)
{
    static const char call[] = "cublasLtMatmulDescSetAttribute";
    if (!matmulDesc || load<desc_state>(matmulDesc).magic != DESC_MAGIC) {
        complain(call, "not a descriptor made by cublasLtMatmulDescCreate");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    desc_state s = load<desc_state>(matmulDesc);
    bool ok = false;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: ok = read_attr(buf, sizeInBytes, &s.compute); break;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: ok = read_attr(buf, sizeInBytes, &s.scale); break;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
        ok = read_attr(buf, sizeInBytes, &s.pointer_mode);
        break;
    case CUBLASLT_MATMUL_DESC_TRANSA:
        ok = read_attr(buf, sizeInBytes, &s.transa) && valid_op(s.transa);
        break;
    case CUBLASLT_MATMUL_DESC_TRANSB:
        ok = read_attr(buf, sizeInBytes, &s.transb) && valid_op(s.transb);
        break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: ok = read_attr(buf, sizeInBytes, &s.epilogue); break;
    default:
        complain(call, "attribute %d is not emulated", (int)attr);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!ok) {
        complain(call, "attribute %d: a NULL buffer, a size of %zu bytes or a value it cannot "
                       "take", (int)attr, sizeInBytes);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    store(matmulDesc, s);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, void *buf,
                                              size_t sizeInBytes, size_t *sizeWritten)
{
    if (!matmulDesc || load<desc_state>(matmulDesc).magic != DESC_MAGIC)
        return CUBLAS_STATUS_INVALID_VALUE;
    const desc_state s = load<desc_state>(matmulDesc);
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
        return write_attr(buf, sizeInBytes, sizeWritten, s.compute);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
        return write_attr(buf, sizeInBytes, sizeWritten, s.scale);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
        return write_attr(buf, sizeInBytes, sizeWritten, s.pointer_mode);
    case CUBLASLT_MATMUL_DESC_TRANSA:
        return write_attr(buf, sizeInBytes, sizeWritten, s.transa);
    case CUBLASLT_MATMUL_DESC_TRANSB:
        return write_attr(buf, sizeInBytes, sizeWritten, s.transb);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        return write_attr(buf, sizeInBytes, sizeWritten, s.epilogue);
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
}

/* ------------------------------------------------------------ matrix layout */

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    if (!matLayout)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!element_size((uint32_t)type)) {
        complain("cublasLtMatrixLayoutCreate", "type %d: the emulation has CUDA_R_32F, "
                                               "CUDA_R_16BF and CUDA_R_16F", (int)type);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    cublasLtMatrixLayoutOpaque_t *o = new (std::nothrow) cublasLtMatrixLayoutOpaque_t;
    if (!o)
        return CUBLAS_STATUS_ALLOC_FAILED;
    memset(o, 0, sizeof *o);
    layout_state s;
    memset(&s, 0, sizeof s);
    s.magic = LAYOUT_MAGIC;
    s.type = (uint32_t)type;
    s.order = CUBLASLT_ORDER_COL;
    s.batch = 1;
    s.rows = rows;
    s.cols = cols;
    s.ld = ld;
    store(o, s);
    *matLayout = o;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout)
{
    if (!matLayout)
        return CUBLAS_STATUS_SUCCESS;
    if (load<layout_state>(matLayout).magic != LAYOUT_MAGIC) {
        complain("cublasLtMatrixLayoutDestroy", "not a layout (or destroyed twice)");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    memset(matLayout, 0, sizeof *matLayout);
    delete matLayout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t sizeInBytes)
{
    static const char call[] = "cublasLtMatrixLayoutSetAttribute";
    if (!matLayout || load<layout_state>(matLayout).magic != LAYOUT_MAGIC) {
        complain(call, "not a layout made by cublasLtMatrixLayoutCreate");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    layout_state s = load<layout_state>(matLayout);
    bool ok = false;
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE:
        ok = read_attr(buf, sizeInBytes, &s.type) && element_size(s.type);
        break;
    case CUBLASLT_MATRIX_LAYOUT_ORDER: ok = read_attr(buf, sizeInBytes, &s.order); break;
    case CUBLASLT_MATRIX_LAYOUT_ROWS: ok = read_attr(buf, sizeInBytes, &s.rows); break;
    case CUBLASLT_MATRIX_LAYOUT_COLS: ok = read_attr(buf, sizeInBytes, &s.cols); break;
    case CUBLASLT_MATRIX_LAYOUT_LD: ok = read_attr(buf, sizeInBytes, &s.ld); break;
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
        ok = read_attr(buf, sizeInBytes, &s.batch) && s.batch >= 1;
        break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
        ok = read_attr(buf, sizeInBytes, &s.stride);
        break;
    default:
        complain(call, "attribute %d is not emulated", (int)attr);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!ok) {
        complain(call, "attribute %d: a NULL buffer, a size of %zu bytes or a value it cannot "
                       "take", (int)attr, sizeInBytes);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    store(matLayout, s);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr, void *buf,
                                                size_t sizeInBytes, size_t *sizeWritten)
{
    if (!matLayout || load<layout_state>(matLayout).magic != LAYOUT_MAGIC)
        return CUBLAS_STATUS_INVALID_VALUE;
    const layout_state s = load<layout_state>(matLayout);
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return write_attr(buf, sizeInBytes, sizeWritten, s.type);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: return write_attr(buf, sizeInBytes, sizeWritten, s.order);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return write_attr(buf, sizeInBytes, sizeWritten, s.rows);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return write_attr(buf, sizeInBytes, sizeWritten, s.cols);
    case CUBLASLT_MATRIX_LAYOUT_LD: return write_attr(buf, sizeInBytes, sizeWritten, s.ld);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
        return write_attr(buf, sizeInBytes, sizeWritten, s.batch);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
        return write_attr(buf, sizeInBytes, sizeWritten, s.stride);
    default: return CUBLAS_STATUS_INVALID_VALUE;
    }
}

/* ------------------------------------------------------------ preference */

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    if (!pref)
        return CUBLAS_STATUS_INVALID_VALUE;
    cublasLtMatmulPreferenceOpaque_t *o = new (std::nothrow) cublasLtMatmulPreferenceOpaque_t;
    if (!o)
        return CUBLAS_STATUS_ALLOC_FAILED;
    memset(o, 0, sizeof *o);
    store(o, default_pref());
    *pref = o;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    if (!pref)
        return CUBLAS_STATUS_SUCCESS;
    if (load<pref_state>(pref).magic != PREF_MAGIC) {
        complain("cublasLtMatmulPreferenceDestroy", "not a preference (or destroyed twice)");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    memset(pref, 0, sizeof *pref);
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t sizeInBytes)
{
    static const char call[] = "cublasLtMatmulPreferenceSetAttribute";
    if (!pref || load<pref_state>(pref).magic != PREF_MAGIC) {
        complain(call, "not a preference made by cublasLtMatmulPreferenceCreate");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    pref_state s = load<pref_state>(pref);
    bool ok = false;
    float waves = 0.0f;
    uint64_t impl = 0;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE:
        ok = read_attr(buf, sizeInBytes, &s.search_mode);
        break;
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        ok = read_attr(buf, sizeInBytes, &s.max_workspace);
        break;
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK:
        ok = read_attr(buf, sizeInBytes, &s.reduction_mask);
        break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
        ok = read_attr(buf, sizeInBytes, &s.align[0]);
        break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
        ok = read_attr(buf, sizeInBytes, &s.align[1]);
        break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
        ok = read_attr(buf, sizeInBytes, &s.align[2]);
        break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        ok = read_attr(buf, sizeInBytes, &s.align[3]);
        break;
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT: ok = read_attr(buf, sizeInBytes, &waves); break;
    case CUBLASLT_MATMUL_PREF_IMPL_MASK: ok = read_attr(buf, sizeInBytes, &impl); break;
    default:
        complain(call, "attribute %d is not emulated", (int)attr);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (!ok) {
        complain(call, "attribute %d: a NULL buffer or a size of %zu bytes", (int)attr,
                 sizeInBytes);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    store(pref, s);
    return CUBLAS_STATUS_SUCCESS;
}

/* ------------------------------------------------------------ heuristic and product */

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int *returnAlgoCount)
{
    static const char call[] = "cublasLtMatmulAlgoGetHeuristic";
    if (!lightHandle || lightHandle->magic != HANDLE_MAGIC) {
        complain(call, "no handle made by cublasLtCreate");
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    if (requestedAlgoCount < 1 || !heuristicResultsArray || !returnAlgoCount) {
        complain(call, "%d algorithms asked for, results %p, count %p", requestedAlgoCount,
                 (void *)heuristicResultsArray, (void *)returnAlgoCount);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    *returnAlgoCount = 0;
    if (!preference || load<pref_state>(preference).magic != PREF_MAGIC) {
        complain(call, "no preference made by cublasLtMatmulPreferenceCreate");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    problem p;
    cublasStatus_t s = describe(call, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (s != CUBLAS_STATUS_SUCCESS)
        return s;
    if (const char *why = types_refused(p)) {
        complain(call, "no algorithm: %s (A %s, C %s)", why, type_name(p.a.type),
                 type_name(p.c.type));
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    const pref_state pref = load<pref_state>(preference);
    /* expected, and handled by the caller: no line */
    if (no_16bit_algorithm(p, pref))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    algo_state a;
    memset(&a, 0, sizeof a);
    a.magic = ALGO_MAGIC;
    a.compute = p.op.compute;
    a.ab_type = p.a.type;
    a.cd_type = p.c.type;
    a.transa = p.op.transa;
    a.transb = p.op.transb;
    for (int i = 0; i < 4; i++)
        a.align[i] = pref.align[i];
    cublasLtMatmulHeuristicResult_t &r = heuristicResultsArray[0];
    memset(&r, 0, sizeof r);
    store(&r.algo, a);
    r.workspaceSize = 0; /* the emulation sums in one pass: no split-K */
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
    *returnAlgoCount = 1;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream)
{
    static const char call[] = "cublasLtMatmul";
    (void)workspace;
    (void)workspaceSizeInBytes; /* the algorithms here need none */
    (void)stream;               /* the emulated streams run work at issue */
    if (!lightHandle || lightHandle->magic != HANDLE_MAGIC) {
        complain(call, "no handle made by cublasLtCreate");
        return CUBLAS_STATUS_NOT_INITIALIZED;
    }
    problem p;
    cublasStatus_t s = describe(call, computeDesc, Adesc, Bdesc, Cdesc, Ddesc, &p);
    if (s != CUBLAS_STATUS_SUCCESS)
        return s;
    if (const char *why = types_refused(p)) {
        complain(call, "not supported: %s (A %s, C %s)", why, type_name(p.a.type),
                 type_name(p.c.type));
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!alpha || !beta) {
        complain(call, "alpha or beta is NULL");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    const float a_scale = *static_cast<const float *>(alpha);
    const float b_scale = *static_cast<const float *>(beta);
    const int32_t batch = p.d.batch;
    const bool empty = !p.m || !p.n;
    if (!empty && (!D || (p.k && (!A || !B)) || (b_scale != 0.0f && !C))) {
        complain(call, "a NULL matrix: A %p, B %p, C %p (beta %g), D %p", A, B, C,
                 (double)b_scale, D);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (C == D && C && memcmp(&p.c, &p.d, sizeof p.c) != 0) {
        complain(call, "C and D are the same memory with different layouts");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    /* An algorithm is chosen for operands at least as aligned as the
     * preference said; a less aligned one faults on a GPU. Without one
     * the implicit heuristic takes the operands as they are. */
    uint32_t promised[4] = {1, 1, 1, 1};
    if (algo) {
        const algo_state a = load<algo_state>(algo);
        if (a.magic != ALGO_MAGIC) {
            complain(call, "the algorithm was not returned by cublasLtMatmulAlgoGetHeuristic");
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        if (a.compute != p.op.compute || a.ab_type != p.a.type || a.cd_type != p.c.type ||
            a.transa != p.op.transa || a.transb != p.op.transb) {
            complain(call, "the algorithm was chosen for another problem (compute type, types "
                           "or transposes differ)");
            return CUBLAS_STATUS_INVALID_VALUE;
        }
        for (int i = 0; i < 4; i++)
            promised[i] = a.align[i];
    }
    const void *ptr[4] = {A, B, C, D};
    const layout_state *lay[4] = {&p.a, &p.b, &p.c, &p.d};
    uint32_t have[4] = {256, 256, 256, 256};
    for (int i = 0; i < 4; i++) {
        const int64_t stride_bytes = lay[i]->stride * (int64_t)element_size(lay[i]->type);
        if (ptr[i])
            have[i] = alignment_of(ptr[i], stride_bytes, batch);
    }
    if (!algo) {
        pref_state pref = default_pref();
        memcpy(pref.align, have, sizeof pref.align);
        if (no_16bit_algorithm(p, pref)) {
            complain(call, "no algorithm for this 16-bit shape (the implicit heuristic)");
            return CUBLAS_STATUS_NOT_SUPPORTED;
        }
    }
    for (int i = 0; i < 4 && !empty; i++) {
        if (!ptr[i] || (i < 2 && !p.k) || (i == 2 && b_scale == 0.0f))
            continue;
        const int64_t stride_bytes = lay[i]->stride * (int64_t)element_size(lay[i]->type);
        if (have[i] < promised[i]) {
            complain(call, "%c at %p (batch stride %lld bytes) is %u-byte aligned, but its "
                           "algorithm was chosen for %u", "ABCD"[i], ptr[i],
                     (long long)stride_bytes, have[i], promised[i]);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    }
    if (empty)
        return CUBLAS_STATUS_SUCCESS;
    /* the emulation's own check: D written over an operand still being read */
    for (int i = 0; i < 2 && p.k; i++)
        if (overlap(D, p.d, ptr[i], *lay[i])) {
            complain(call, "D overlaps %c (the product would read what it has written)",
                     "AB"[i]);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    std::vector<float> pa, pb, acc;
    for (int32_t i = 0; i < batch; i++)
        multiply_member(p, member(A, i, p.a), member(B, i, p.b), member(C, i, p.c),
                        const_cast<char *>(member(D, i, p.d)), a_scale, b_scale, pa, pb, acc);
    return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
