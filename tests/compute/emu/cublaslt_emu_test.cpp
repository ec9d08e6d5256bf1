/* The emulated cuBLASLt (cublaslt_emu.cpp) against what it stands for,
 * without a GPU:
 *
 *   direct     column-major products through the cuBLASLt calls, every
 *              transpose, wide leading dimensions, strided batches, f32,
 *              bf16 and f16 inputs, f32 and 16-bit outputs, alpha and beta
 *              (C unread when beta is 0: NaN there stays out), C and D the
 *              same memory; small integers, so every result is exact, and
 *              D's padding untouched
 *   refusals   what the real library refuses: dimensions that do not fit,
 *              a leading dimension below the rows, batch counts that
 *              differ, an attribute of the wrong size, mixed input types,
 *              an operand less aligned than its algorithm, D over B; and
 *              the 16-bit shapes that get no algorithm
 *   plugin     loom's row-major products as compute_cuda.c itself maps
 *              them (its product_key, plans and heuristic preferences,
 *              cublaslt_emu_products.c) against loom's cpu gemm
 *              (loom_gemm) within f32 rounding and against double precision;
 *              bf16 products exact on small integers, or refused exactly
 *              where an operand is not 16-byte aligned
 *
 *   cublaslt_emu_test [direct|refusals|plugin]    exit 0 when every case holds */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

extern "C" {
int emu_products_open(void);
void emu_products_close(void);
int emu_products_run(float *out, int ldc, int M, int N, int K, const void *a, int lda, int ta,
                     const void *b, int ldb, int tb, float alpha, float beta, int multiply,
                     int batch, size_t stride_a, size_t stride_b, size_t stride_out);

/* loom's cpu gemm (core/model/gemm.h, a C header): dtype 0 is LOOM_F32 */
struct loom_gemm_operand {
    const void *data;
    int dtype;
    int ld;
    int transposed;
};
void loom_gemm(float *c, int ldc, int M, int N, int K, loom_gemm_operand a, loom_gemm_operand b,
               float alpha, float beta, int multiply);
int loom_gemm_take_error(void);
}

namespace {

int failures;

#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "cublaslt_emu_test: %s:%d: ", __FILE__, __LINE__);                     \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            if (++failures > 30)                                                                   \
                exit(1);                                                                           \
        }                                                                                          \
    } while (0)

size_t type_size(cudaDataType_t t)
{
    return t == CUDA_R_32F ? 4 : 2;
}

void put(void *base, cudaDataType_t t, size_t i, float x)
{
    if (t == CUDA_R_16BF)
        static_cast<__nv_bfloat16 *>(base)[i] = __float2bfloat16(x);
    else if (t == CUDA_R_16F)
        static_cast<__half *>(base)[i] = __float2half(x);
    else
        static_cast<float *>(base)[i] = x;
}

float get(const void *base, cudaDataType_t t, size_t i)
{
    if (t == CUDA_R_16BF)
        return __bfloat162float(static_cast<const __nv_bfloat16 *>(base)[i]);
    if (t == CUDA_R_16F)
        return __half2float(static_cast<const __half *>(base)[i]);
    return static_cast<const float *>(base)[i];
}

/* a float as a 16-bit output type stores it */
float rounded(cudaDataType_t t, float x)
{
    char cell[4];
    put(cell, t, 0, x);
    return get(cell, t, 0);
}

/* 256-byte aligned storage of n elements of type t (plus offset bytes) */
struct buffer {
    std::vector<unsigned char> bytes;
    void *at;
    buffer(size_t n, cudaDataType_t t, size_t offset = 0) : bytes(n * type_size(t) + 512)
    {
        uintptr_t p = (reinterpret_cast<uintptr_t>(bytes.data()) + 255) & ~(uintptr_t)255;
        at = reinterpret_cast<void *>(p + offset);
    }
};

/* What every batch member's address is a multiple of (<= 256 bytes). */
uint32_t alignment(const void *p, int64_t stride_bytes, int batch)
{
    uint64_t bits = (uint64_t)reinterpret_cast<uintptr_t>(p) | 256u;
    if (batch > 1)
        bits |= (uint64_t)stride_bytes;
    return (uint32_t)(bits & (~bits + 1));
}

/* The descriptors of one column-major problem. */
struct lt_problem {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t layout[3] = {nullptr, nullptr, nullptr}; /* A, B, C = D */
    ~lt_problem()
    {
        if (op)
            cublasLtMatmulDescDestroy(op);
        for (auto l : layout)
            if (l)
                cublasLtMatrixLayoutDestroy(l);
    }
};

bool layout(cublasLtMatrixLayout_t *out, cudaDataType_t t, uint64_t rows, uint64_t cols,
            int64_t ld, int32_t batch, int64_t stride)
{
    if (cublasLtMatrixLayoutCreate(out, t, rows, cols, ld) != CUBLAS_STATUS_SUCCESS)
        return false;
    if (batch == 1)
        return true;
    return cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                            sizeof batch) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                            &stride, sizeof stride) == CUBLAS_STATUS_SUCCESS;
}

bool make_op(lt_problem *p, int ta, int tb, cublasComputeType_t compute)
{
    const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    return cublasLtMatmulDescCreate(&p->op, compute, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa,
                                          sizeof opa) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb,
                                          sizeof opb) == CUBLAS_STATUS_SUCCESS;
}

/* The heuristic's answer for operands aligned as align says (A, B, C, D). */
cublasStatus_t heuristic(cublasLtHandle_t lt, const lt_problem &p, const uint32_t align[4],
                         cublasLtMatmulAlgo_t *algo, int *found)
{
    cublasLtMatmulPreference_t pref;
    cublasStatus_t s = cublasLtMatmulPreferenceCreate(&pref);
    if (s != CUBLAS_STATUS_SUCCESS)
        return s;
    const uint64_t workspace = 1 << 20;
    const uint32_t schemes =
        CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
    const cublasLtMatmulPreferenceAttributes_t attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace, sizeof workspace);
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++)
        s = cublasLtMatmulPreferenceSetAttribute(pref, attr[i], &align[i], sizeof align[i]);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                 &schemes, sizeof schemes);
    cublasLtMatmulHeuristicResult_t result;
    memset(&result, 0, sizeof result);
    *found = 0;
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.layout[0], p.layout[1], p.layout[2],
                                           p.layout[2], pref, 1, &result, found);
    if (s == CUBLAS_STATUS_SUCCESS && *found == 1 && result.state == CUBLAS_STATUS_SUCCESS)
        *algo = result.algo;
    cublasLtMatmulPreferenceDestroy(pref);
    return s;
}

float small_int(size_t i, int seed)
{
    return (float)((i * 7 + (size_t)seed * 5) % 13) - 6.0f;
}

/* ------------------------------------------------------------ direct */

struct direct_case {
    int m, n, k, ta, tb, pad, batch;
    cudaDataType_t ab, cd;
    float alpha, beta;
    bool in_place;
};

void check_direct(cublasLtHandle_t lt, const direct_case &dc)
{
    const int a_rows = dc.ta ? dc.k : dc.m, a_cols = dc.ta ? dc.m : dc.k;
    const int b_rows = dc.tb ? dc.n : dc.k, b_cols = dc.tb ? dc.k : dc.n;
    const int64_t lda = a_rows + 3 * dc.pad, ldb = b_rows + 2 * dc.pad, ldd = dc.m + dc.pad;
    const int64_t sa = lda * a_cols + 8 * dc.pad, sb = ldb * b_cols + 16 * dc.pad;
    const int64_t sd = ldd * dc.n + 8 * dc.pad;
    buffer a((size_t)(sa * dc.batch), dc.ab), b((size_t)(sb * dc.batch), dc.ab);
    buffer c((size_t)(sd * dc.batch), dc.cd), d((size_t)(sd * dc.batch), dc.cd);
    const float sentinel = 1234.0f;
    for (int64_t i = 0; i < sa * dc.batch; i++)
        put(a.at, dc.ab, (size_t)i, small_int((size_t)i, 1));
    for (int64_t i = 0; i < sb * dc.batch; i++)
        put(b.at, dc.ab, (size_t)i, small_int((size_t)i, 2));
    for (int64_t i = 0; i < sd * dc.batch; i++) {
        put(c.at, dc.cd, (size_t)i, dc.beta != 0.0f ? small_int((size_t)i, 3) : NAN);
        put(d.at, dc.cd, (size_t)i, dc.in_place ? get(c.at, dc.cd, (size_t)i) : sentinel);
    }
    std::vector<unsigned char> c_before(c.bytes);
    void *out = dc.in_place ? c.at : d.at;

    lt_problem p;
    bool made = make_op(&p, dc.ta, dc.tb, CUBLAS_COMPUTE_32F) &&
                layout(&p.layout[0], dc.ab, a_rows, a_cols, lda, dc.batch, sa) &&
                layout(&p.layout[1], dc.ab, b_rows, b_cols, ldb, dc.batch, sb) &&
                layout(&p.layout[2], dc.cd, dc.m, dc.n, ldd, dc.batch, sd);
    EXPECT(made, "direct: the descriptors could not be made");
    if (!made)
        return;
    const uint32_t align[4] = {alignment(a.at, sa * type_size(dc.ab), dc.batch),
                               alignment(b.at, sb * type_size(dc.ab), dc.batch),
                               alignment(c.at, sd * type_size(dc.cd), dc.batch),
                               alignment(out, sd * type_size(dc.cd), dc.batch)};
    cublasLtMatmulAlgo_t algo;
    int found = 0;
    cublasStatus_t s = heuristic(lt, p, align, &algo, &found);
    EXPECT(s == CUBLAS_STATUS_SUCCESS && found == 1, "direct %dx%dx%d: heuristic %d, found %d",
           dc.m, dc.n, dc.k, (int)s, found);
    if (s != CUBLAS_STATUS_SUCCESS || found != 1)
        return;
    s = cublasLtMatmul(lt, p.op, &dc.alpha, a.at, p.layout[0], b.at, p.layout[1], &dc.beta, c.at,
                       p.layout[2], out, p.layout[2], &algo, nullptr, 0, nullptr);
    EXPECT(s == CUBLAS_STATUS_SUCCESS, "direct: cublasLtMatmul returned %d", (int)s);
    if (s != CUBLAS_STATUS_SUCCESS)
        return;
    int wrong = 0;
    for (int i = 0; i < dc.batch && !wrong; i++)
        for (int64_t e = 0; e < sd && !wrong; e++) {
            const int64_t r = e % ldd, col = e / ldd;
            const size_t at = (size_t)(i * sd + e);
            const float c_value = get(c_before.data() + (static_cast<unsigned char *>(c.at) -
                                                         c.bytes.data()),
                                      dc.cd, at);
            float want;
            if (r >= dc.m || col >= dc.n) { /* padding: never written */
                want = dc.in_place ? c_value : rounded(dc.cd, sentinel);
            } else {
                double sum = 0;
                for (int j = 0; j < dc.k; j++) {
                    const int64_t ai = dc.ta ? r * lda + j : j * lda + r;
                    const int64_t bi = dc.tb ? j * ldb + col : col * ldb + j;
                    sum += (double)get(a.at, dc.ab, (size_t)(i * sa + ai)) *
                           get(b.at, dc.ab, (size_t)(i * sb + bi));
                }
                double exact = dc.alpha * sum;
                if (dc.beta != 0.0f)
                    exact += dc.beta * (double)c_value;
                want = rounded(dc.cd, (float)exact);
            }
            const float got = get(out, dc.cd, at);
            if (!(got == want || (std::isnan(got) && std::isnan(want)))) {
                EXPECT(false, "direct %dx%dx%d ta %d tb %d pad %d batch %d types %d/%d alpha %g "
                              "beta %g%s: member %d (%lld, %lld) = %g, want %g", dc.m, dc.n,
                       dc.k, dc.ta, dc.tb, dc.pad, dc.batch, (int)dc.ab, (int)dc.cd,
                       (double)dc.alpha, (double)dc.beta, dc.in_place ? " in place" : "", i,
                       (long long)r, (long long)col, (double)got, (double)want);
                wrong = 1;
            }
        }
}

void direct(cublasLtHandle_t lt)
{
    setenv("CUBLASLT_EMU_16BIT", "any", 1); /* every 16-bit shape gets its algorithm here */
    static const int shapes[][3] = {{7, 20, 12}, {1, 9, 4}, {5, 1, 3}, {3, 4, 1}, {16, 8, 33}};
    static const cudaDataType_t types[][2] = {{CUDA_R_32F, CUDA_R_32F},
                                              {CUDA_R_16BF, CUDA_R_32F},
                                              {CUDA_R_16BF, CUDA_R_16BF},
                                              {CUDA_R_16F, CUDA_R_32F},
                                              {CUDA_R_16F, CUDA_R_16F}};
    static const float scales[][2] = {{1.0f, 0.0f}, {2.0f, 1.0f}, {-1.0f, 0.5f}};
    int cases = 0;
    for (const auto &shape : shapes)
        for (const auto &type : types)
            for (int ta = 0; ta < 2; ta++)
                for (int tb = 0; tb < 2; tb++)
                    for (int pad = 0; pad < 2; pad++)
                        for (int batch = 1; batch <= 3; batch += 2)
                            for (const auto &scale : scales)
                                for (int in_place = 0; in_place < 2; in_place++, cases++)
                                    check_direct(lt, {shape[0], shape[1], shape[2], ta, tb, pad,
                                                      batch, type[0], type[1], scale[0],
                                                      scale[1], in_place != 0});
    unsetenv("CUBLASLT_EMU_16BIT");
    printf("direct: %d column-major products\n", cases);
}

/* ------------------------------------------------------------ refusals */

/* The heuristic's status for A (ra x ca, lda) B (rb x cb, ldb) D (rd x cd,
 * ldd), types ta_ and tb_ for A and B, batch counts per layout. */
cublasStatus_t try_problem(cublasLtHandle_t lt, cudaDataType_t a_type, cudaDataType_t b_type,
                           const int shape[9], const int32_t batch[3], const int64_t stride[3],
                           int *found, uint32_t align_ab = 256)
{
    lt_problem p;
    if (!make_op(&p, 0, 0, CUBLAS_COMPUTE_32F) ||
        !layout(&p.layout[0], a_type, shape[0], shape[1], shape[2], batch[0], stride[0]) ||
        !layout(&p.layout[1], b_type, shape[3], shape[4], shape[5], batch[1], stride[1]) ||
        !layout(&p.layout[2], CUDA_R_32F, shape[6], shape[7], shape[8], batch[2], stride[2]))
        return CUBLAS_STATUS_INTERNAL_ERROR;
    const uint32_t align[4] = {align_ab, align_ab, 256, 256};
    cublasLtMatmulAlgo_t algo;
    return heuristic(lt, p, align, &algo, found);
}

void refusals(cublasLtHandle_t lt)
{
    fprintf(stderr, "(the refusals below print the emulation's lines on purpose)\n");
    const int32_t one[3] = {1, 1, 1}, three[3] = {3, 3, 3}, mixed[3] = {3, 1, 3};
    const int64_t strides[3] = {64 * 64, 64 * 64, 64 * 64}, odd[3] = {4100, 4096, 4096};
    int found = -1;
    /* (m x k) (k x n) = (m x n) with m 8, n 16, k 24 */
    const int fits[9] = {8, 24, 8, 24, 16, 24, 8, 16, 8};
    EXPECT(try_problem(lt, CUDA_R_32F, CUDA_R_32F, fits, one, strides, &found) ==
                   CUBLAS_STATUS_SUCCESS && found == 1,
           "refusals: a product that fits was refused");
    const int inner[9] = {8, 24, 8, 25, 16, 25, 8, 16, 8};
    EXPECT(try_problem(lt, CUDA_R_32F, CUDA_R_32F, inner, one, strides, &found) ==
                   CUBLAS_STATUS_INVALID_VALUE && found == 0,
           "refusals: inner dimensions 24 and 25 accepted");
    const int wrong_d[9] = {8, 24, 8, 24, 16, 24, 8, 15, 8};
    EXPECT(try_problem(lt, CUDA_R_32F, CUDA_R_32F, wrong_d, one, strides, &found) ==
                   CUBLAS_STATUS_INVALID_VALUE,
           "refusals: D of 15 columns for a product of 16 accepted");
    const int short_ld[9] = {8, 24, 7, 24, 16, 24, 8, 16, 8};
    EXPECT(try_problem(lt, CUDA_R_32F, CUDA_R_32F, short_ld, one, strides, &found) ==
                   CUBLAS_STATUS_INVALID_VALUE,
           "refusals: ld 7 for 8 rows accepted");
    EXPECT(try_problem(lt, CUDA_R_32F, CUDA_R_32F, fits, mixed, strides, &found) ==
                   CUBLAS_STATUS_INVALID_VALUE,
           "refusals: batch counts 3, 1, 3 accepted");
    EXPECT(try_problem(lt, CUDA_R_32F, CUDA_R_16BF, fits, one, strides, &found) ==
                   CUBLAS_STATUS_NOT_SUPPORTED,
           "refusals: an f32 A with a bf16 B accepted");
    /* 16-bit: ld 8 and 24 elements are 16 and 48 bytes; 12 is 24 */
    EXPECT(try_problem(lt, CUDA_R_16BF, CUDA_R_16BF, fits, three, strides, &found) ==
                   CUBLAS_STATUS_SUCCESS && found == 1,
           "refusals: an aligned bf16 product got no algorithm");
    const int ld12[9] = {8, 24, 12, 24, 16, 24, 8, 16, 8};
    EXPECT(try_problem(lt, CUDA_R_16BF, CUDA_R_16BF, ld12, one, strides, &found) ==
                   CUBLAS_STATUS_NOT_SUPPORTED && found == 0,
           "refusals: a bf16 A with ld 12 (24 bytes) got an algorithm");
    EXPECT(try_problem(lt, CUDA_R_16BF, CUDA_R_16BF, fits, three, odd, &found) ==
                   CUBLAS_STATUS_NOT_SUPPORTED && found == 0,
           "refusals: a bf16 A with batch stride 4100 (8200 bytes) got an algorithm");
    EXPECT(try_problem(lt, CUDA_R_16BF, CUDA_R_16BF, fits, one, strides, &found, 8) ==
                   CUBLAS_STATUS_NOT_SUPPORTED && found == 0,
           "refusals: bf16 operands 8-byte aligned got an algorithm");
    EXPECT(try_problem(lt, CUDA_R_32F, CUDA_R_32F, fits, one, strides, &found, 4) ==
                   CUBLAS_STATUS_SUCCESS && found == 1,
           "refusals: f32 operands 4-byte aligned got no algorithm");

    /* an attribute of the wrong size */
    cublasLtMatmulDesc_t op;
    EXPECT(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS,
           "refusals: cublasLtMatmulDescCreate failed");
    const int64_t wide = CUBLAS_OP_T;
    EXPECT(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof wide) ==
               CUBLAS_STATUS_INVALID_VALUE,
           "refusals: TRANSA given in 8 bytes accepted");
    cublasLtMatmulDescDestroy(op);

    /* operands less aligned than the algorithm was chosen for */
    lt_problem p;
    const bool made = make_op(&p, 0, 0, CUBLAS_COMPUTE_32F) &&
                      layout(&p.layout[0], CUDA_R_32F, 8, 24, 8, 1, 0) &&
                      layout(&p.layout[1], CUDA_R_32F, 24, 16, 24, 1, 0) &&
                      layout(&p.layout[2], CUDA_R_32F, 8, 16, 8, 1, 0);
    EXPECT(made, "refusals: descriptors not made");
    const uint32_t align16[4] = {16, 16, 16, 16};
    cublasLtMatmulAlgo_t algo;
    EXPECT(made && heuristic(lt, p, align16, &algo, &found) == CUBLAS_STATUS_SUCCESS &&
               found == 1,
           "refusals: the heuristic failed on an f32 product");
    buffer a(8 * 24, CUDA_R_32F, 4), b(24 * 16, CUDA_R_32F), d(8 * 16, CUDA_R_32F);
    memset(a.bytes.data(), 0, a.bytes.size());
    memset(b.bytes.data(), 0, b.bytes.size());
    const float alpha = 1.0f, beta = 0.0f;
    EXPECT(made && cublasLtMatmul(lt, p.op, &alpha, a.at, p.layout[0], b.at, p.layout[1], &beta,
                                  d.at, p.layout[2], d.at, p.layout[2], &algo, nullptr, 0,
                                  nullptr) == CUBLAS_STATUS_INVALID_VALUE,
           "refusals: A 4-byte aligned accepted by an algorithm chosen for 16");
    cublasLtMatmulAlgo_t blank;
    memset(&blank, 0, sizeof blank);
    EXPECT(made && cublasLtMatmul(lt, p.op, &alpha, b.at, p.layout[0], b.at, p.layout[1], &beta,
                                  d.at, p.layout[2], d.at, p.layout[2], &blank, nullptr, 0,
                                  nullptr) == CUBLAS_STATUS_INVALID_VALUE,
           "refusals: an algorithm the heuristic never returned accepted");
    buffer clean(8 * 24, CUDA_R_32F);
    memset(clean.bytes.data(), 0, clean.bytes.size());
    EXPECT(made && cublasLtMatmul(lt, p.op, &alpha, clean.at, p.layout[0], b.at, p.layout[1],
                                  &beta, b.at, p.layout[2], b.at, p.layout[2], &algo, nullptr,
                                  0, nullptr) == CUBLAS_STATUS_INVALID_VALUE,
           "refusals: D written over B accepted");
    EXPECT(made && cublasLtMatmul(lt, p.op, &alpha, clean.at, p.layout[0], b.at, p.layout[1],
                                  &beta, d.at, p.layout[2], d.at, p.layout[2], &algo, nullptr,
                                  0, nullptr) == CUBLAS_STATUS_SUCCESS,
           "refusals: a product of aligned, separate matrices refused");
    printf("refusals: checked\n");
}

/* ------------------------------------------------------------ plugin */

uint64_t rng = 0x2545f4914f6cdd1dULL;
int bf16_run, bf16_widened; /* bf16 products multiplied, and left to the widened path */

float uniform()
{
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* loom's product out (M, N) = a (M, K) b (K, N) + beta out, row-major,
 * through compute_cuda.c, against loom_gemm and double precision (f32),
 * or exactly (bf16 small integers); rows' and members' padding untouched. */
void check_plugin(int M, int N, int K, int ta, int tb, int pad, int batch, int bf16, float beta)
{
    const int lda = (ta ? M : K) + 3 * pad, ldb = (tb ? K : N) + 2 * pad, ldc = N + pad;
    const size_t sa = (size_t)(ta ? K : M) * lda + 3 * pad;
    const size_t sb = (size_t)(tb ? N : K) * ldb + 5 * pad, sc = (size_t)M * ldc + 7 * pad;
    std::vector<float> a(batch * sa), b(batch * sb), out(batch * sc), before, cpu;
    std::vector<__nv_bfloat16> a16(batch * sa), b16(batch * sb);
    for (size_t i = 0; i < a.size(); i++) {
        a[i] = bf16 ? small_int(i, 1) : uniform();
        a16[i] = __float2bfloat16(a[i]);
    }
    for (size_t i = 0; i < b.size(); i++) {
        b[i] = bf16 ? small_int(i, 2) : uniform();
        b16[i] = __float2bfloat16(b[i]);
    }
    for (size_t i = 0; i < out.size(); i++)
        out[i] = bf16 ? small_int(i, 3) : uniform();
    before = cpu = out;
    const float alpha = 1.0f;
    const int rc = emu_products_run(out.data(), ldc, M, N, K,
                                    bf16 ? (const void *)a16.data() : a.data(), lda, ta,
                                    bf16 ? (const void *)b16.data() : b.data(), ldb, tb, alpha,
                                    beta, bf16, batch, sa, sb, sc);
    if (bf16 && rc == 1) {
        /* no algorithm: only where an operand's ld or batch stride is not a
         * multiple of 16 bytes, or its data not 16-byte aligned (one row's
         * ld is its width) */
        const int rows_a = ta ? K : M, rows_b = tb ? N : K;
        const int ld_a = rows_a <= 1 && lda < (ta ? M : K) ? (ta ? M : K) : lda;
        const int ld_b = rows_b <= 1 && ldb < (tb ? K : N) ? (tb ? K : N) : ldb;
        const bool aligned = ld_a % 8 == 0 && ld_b % 8 == 0 &&
                             (batch == 1 || (sa % 8 == 0 && sb % 8 == 0)) &&
                             reinterpret_cast<uintptr_t>(a16.data()) % 16 == 0 &&
                             reinterpret_cast<uintptr_t>(b16.data()) % 16 == 0;
        EXPECT(!aligned, "plugin bf16 %dx%dx%d ta %d tb %d pad %d batch %d: refused though "
                         "aligned", M, N, K, ta, tb, pad, batch);
        bf16_widened++;
        return;
    }
    EXPECT(rc == 0, "plugin %s %dx%dx%d ta %d tb %d pad %d batch %d: failed", bf16 ? "bf16" : "f32",
           M, N, K, ta, tb, pad, batch);
    if (rc != 0)
        return;
    bf16_run += bf16;
    for (int i = 0; i < batch && !bf16; i++) {
        loom_gemm(&cpu[i * sc], ldc, M, N, K, {&a[i * sa], 0, lda, ta}, {&b[i * sb], 0, ldb, tb},
                  alpha, beta, 0);
        EXPECT(loom_gemm_take_error() == 0, "plugin: loom_gemm failed");
    }
    for (size_t at = 0; at < out.size(); at++) {
        const int i = (int)(at / sc), r = (int)(at % sc / ldc), c = (int)(at % sc % ldc);
        if (r >= M || c >= N) {
            EXPECT(out[at] == before[at], "plugin %dx%dx%d: padding at %zu written", M, N, K, at);
            if (out[at] != before[at])
                return;
            continue;
        }
        double exact = 0, size = 0;
        for (int k = 0; k < K; k++) {
            const double x = a[i * sa + (ta ? (size_t)k * lda + r : (size_t)r * lda + k)];
            const double y = b[i * sb + (tb ? (size_t)c * ldb + k : (size_t)k * ldb + c)];
            exact += x * y;
            size += fabs(x * y);
        }
        exact = alpha * exact + beta * (double)before[at];
        size += fabs(beta * (double)before[at]);
        const double tol = 2e-6 * size + 1e-7;
        const double got = out[at];
        const bool ok = bf16 ? got == exact
                             : fabs(got - exact) <= tol && fabs(got - (double)cpu[at]) <= 2 * tol;
        if (!ok) {
            EXPECT(false, "plugin %s %dx%dx%d ta %d tb %d pad %d batch %d beta %g: member %d "
                          "(%d, %d) = %.9g, want %.9g (loom_gemm %.9g)", bf16 ? "bf16" : "f32",
                   M, N, K, ta, tb, pad, batch, (double)beta, i, r, c, got, exact,
                   (double)cpu[at]);
            return; /* one line per case */
        }
    }
}

void plugin()
{
    EXPECT(emu_products_open() == 0, "plugin: cublasLtCreate failed");
    static const int shapes[][3] = {{7, 20, 12}, {1, 9, 4}, {5, 1, 3}, {3, 4, 1}, {16, 8, 33},
                                    {24, 40, 64}, {64, 48, 96}};
    int cases = 0;
    for (const auto &s : shapes)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int pad = 0; pad < 2; pad++)
                    for (int batch = 1; batch <= 3; batch += 2)
                        for (int bf16 = 0; bf16 < 2; bf16++)
                            for (int acc = 0; acc < 2; acc++, cases++)
                                check_plugin(s[0], s[1], s[2], ta, tb, pad, batch, bf16,
                                             acc ? 1.0f : 0.0f);
    emu_products_close();
    EXPECT(bf16_run > 0 && bf16_widened > 0, "plugin: %d bf16 products multiplied, %d left to "
                                             "the widened path: both should happen", bf16_run,
           bf16_widened);
    printf("plugin: %d loom products through compute_cuda.c (bf16: %d multiplied, %d left to "
           "the widened path)\n", cases, bf16_run, bf16_widened);
}

} // namespace

int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : nullptr;
    if (only && strcmp(only, "direct") && strcmp(only, "refusals") && strcmp(only, "plugin")) {
        fprintf(stderr, "cublaslt_emu_test: unknown part '%s': give direct, refusals or plugin "
                        "(or nothing for all)\n", only);
        return 2;
    }
    cublasLtHandle_t lt;
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublaslt_emu_test: cublasLtCreate failed\n");
        return 1;
    }
    if (!only || !strcmp(only, "direct"))
        direct(lt);
    if (!only || !strcmp(only, "refusals"))
        refusals(lt);
    cublasLtDestroy(lt);
    if (!only || !strcmp(only, "plugin"))
        plugin();
    printf("cublaslt_emu_test: %s\n", failures ? "FAILED" : "all hold");
    return failures != 0;
}
