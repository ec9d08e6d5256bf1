/* The bf16 matrix-product rate this GPU reaches through cuBLASLt: bf16
 * inputs and output, f32 accumulation, the layout loom's products use
 * (both operands K-major). scripts/bench-gpu.sh measures MFU against the
 * best rate printed here rather than a datasheet's figure.
 *
 *   cuda_gemm_peak [--reps R] [MxNxK ...]
 *
 * Default shapes: 8192^3 and GPT-2 124M's products at B = 16, T = 1024
 * (16384 rows: QKV, attention projection, MLP up and down, the LM head).
 * Each shape runs 3 untimed products, then R timed ones (default 20) with
 * CUDA events; the line gives the median. 16 entries of each result are
 * checked against a double-precision dot product of the same bf16 inputs,
 * so a rate is never printed for a wrong product. The last line is
 *   peak: <TFLOP/s> TFLOP/s (MxNxK)
 * Exits 1 with one line naming the failing call (or "no CUDA device"). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#define WORKSPACE_BYTES ((size_t)32 << 20)
#define WARMUP 3
#define CHECKED_ENTRIES 16
#define MAX_SHAPES 32

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "cuda_gemm_peak: %s: %s\n", #call, cudaGetErrorString(e_));           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define LT_OK(call)                                                                                \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "cuda_gemm_peak: %s: cuBLAS status %d\n", #call, (int)s_);            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef struct shape {
    int m, n, k;
} shape;

static const shape default_shapes[] = {
    {8192, 8192, 8192},   /* square: the library's best case */
    {16384, 2304, 768},   /* QKV */
    {16384, 768, 768},    /* attention projection */
    {16384, 3072, 768},   /* MLP up */
    {16384, 768, 3072},   /* MLP down */
    {16384, 50304, 768},  /* LM head */
};

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint32_t next_random(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng_state >> 33);
}

/* A value in [-1, 1) as bf16: the top half of the float (truncated, which
 * is fine for inputs: the check reads these same bits back). */
static uint16_t random_bf16(void)
{
    float f = (float)next_random() / 2147483648.0f - 1.0f;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return (uint16_t)(bits >> 16);
}

static double bf16_value(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static void *host_buffer(size_t bytes)
{
    void *p = malloc(bytes);
    if (!p) {
        fprintf(stderr, "cuda_gemm_peak: out of host memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* "MxNxK" into s; 0 when it is not three positive numbers. */
static int parse_shape(const char *text, shape *s)
{
    char tail;
    return sscanf(text, "%dx%dx%d%c", &s->m, &s->n, &s->k, &tail) == 3 && s->m > 0 && s->n > 0 &&
           s->k > 0;
}

/* D (m x n, column-major, ld m) = A^T B, A stored k x m (ld k), B k x n
 * (ld k): row-major that is out (m, n)^T = in (m, k) x weight (n, k)^T, the
 * model's product. Returns the median milliseconds of reps products. */
static double measure(cublasLtHandle_t lt, cudaStream_t stream, void *workspace, shape s, int reps)
{
    const size_t m = (size_t)s.m, n = (size_t)s.n, k = (size_t)s.k;
    uint16_t *a = host_buffer(k * m * sizeof *a), *b = host_buffer(k * n * sizeof *b);
    for (size_t i = 0; i < k * m; i++)
        a[i] = random_bf16();
    for (size_t i = 0; i < k * n; i++)
        b[i] = random_bf16();
    void *da, *db, *dd;
    CUDA_OK(cudaMalloc(&da, k * m * 2));
    CUDA_OK(cudaMalloc(&db, k * n * 2));
    CUDA_OK(cudaMalloc(&dd, m * n * 2));
    CUDA_OK(cudaMemcpy(da, a, k * m * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(db, b, k * n * 2, cudaMemcpyHostToDevice));

    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    const cublasOperation_t transpose = CUBLAS_OP_T, keep = CUBLAS_OP_N;
    LT_OK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                         sizeof transpose));
    LT_OK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof keep));
    LT_OK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, k, m, k));
    LT_OK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k));
    LT_OK(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, m, n, m));

    cublasLtMatmulPreference_t pref;
    size_t workspace_bytes = WORKSPACE_BYTES;
    LT_OK(cublasLtMatmulPreferenceCreate(&pref));
    LT_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                               &workspace_bytes, sizeof workspace_bytes));
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    LT_OK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &heuristic, &found));
    if (found < 1) {
        fprintf(stderr, "cuda_gemm_peak: cuBLASLt has no algorithm for %dx%dx%d bf16\n", s.m, s.n,
                s.k);
        exit(1);
    }

    const float alpha = 1.0f, beta = 0.0f;
    cudaEvent_t start, stop;
    CUDA_OK(cudaEventCreate(&start));
    CUDA_OK(cudaEventCreate(&stop));
    double *ms = host_buffer((size_t)reps * sizeof *ms);
    for (int r = -WARMUP; r < reps; r++) {
        CUDA_OK(cudaEventRecord(start, stream));
        LT_OK(cublasLtMatmul(lt, op, &alpha, da, la, db, lb, &beta, dd, ld, dd, ld,
                             &heuristic.algo, workspace, WORKSPACE_BYTES, stream));
        CUDA_OK(cudaEventRecord(stop, stream));
        CUDA_OK(cudaEventSynchronize(stop));
        float elapsed = 0;
        CUDA_OK(cudaEventElapsedTime(&elapsed, start, stop));
        if (r >= 0)
            ms[r] = elapsed;
    }
    qsort(ms, (size_t)reps, sizeof *ms, compare_doubles);
    double median = reps % 2 ? ms[reps / 2] : (ms[reps / 2 - 1] + ms[reps / 2]) / 2;

    /* bf16 output: within half a unit in its last place (2^-8 relative)
     * plus the f32 sum's own rounding */
    uint16_t got;
    for (int e = 0; e < CHECKED_ENTRIES; e++) {
        size_t i = next_random() % m, j = next_random() % n;
        CUDA_OK(cudaMemcpy(&got, (const uint16_t *)dd + j * m + i, sizeof got,
                           cudaMemcpyDeviceToHost));
        double want = 0, magnitude = 0;
        for (size_t p = 0; p < k; p++) {
            double term = bf16_value(a[i * k + p]) * bf16_value(b[j * k + p]);
            want += term;
            magnitude += fabs(term);
        }
        if (!(fabs(bf16_value(got) - want) <= fabs(want) / 128 + 1e-5 * magnitude)) {
            fprintf(stderr,
                    "cuda_gemm_peak: %dx%dx%d: entry (%zu, %zu) = %.6g, the double reference "
                    "%.6g: the product is wrong, its rate would mean nothing\n",
                    s.m, s.n, s.k, i, j, bf16_value(got), want);
            exit(1);
        }
    }

    free(ms);
    CUDA_OK(cudaEventDestroy(start));
    CUDA_OK(cudaEventDestroy(stop));
    LT_OK(cublasLtMatmulPreferenceDestroy(pref));
    LT_OK(cublasLtMatrixLayoutDestroy(la));
    LT_OK(cublasLtMatrixLayoutDestroy(lb));
    LT_OK(cublasLtMatrixLayoutDestroy(ld));
    LT_OK(cublasLtMatmulDescDestroy(op));
    CUDA_OK(cudaFree(da));
    CUDA_OK(cudaFree(db));
    CUDA_OK(cudaFree(dd));
    free(a);
    free(b);
    return median;
}

int main(int argc, char **argv)
{
    shape shapes[MAX_SHAPES];
    int count = 0, reps = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 1) {
                fprintf(stderr, "cuda_gemm_peak: --reps %s: give a count of 1 or more\n", argv[i]);
                return 2;
            }
        } else if (count < MAX_SHAPES && parse_shape(argv[i], &shapes[count])) {
            count++;
        } else {
            fprintf(stderr, "cuda_gemm_peak: '%s' is not a shape MxNxK (at most %d) or --reps R; "
                            "usage: cuda_gemm_peak [--reps R] [MxNxK ...]\n",
                    argv[i], MAX_SHAPES);
            return 2;
        }
    }
    if (!count) {
        count = (int)(sizeof default_shapes / sizeof default_shapes[0]);
        memcpy(shapes, default_shapes, sizeof default_shapes);
    }

    int devices = 0;
    cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess || devices < 1) {
        fprintf(stderr, "cuda_gemm_peak: no CUDA device visible (%s): run it on a machine with a "
                        "GPU\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "the count is 0");
        return 1;
    }
    struct cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreate(&stream));
    void *workspace;
    CUDA_OK(cudaMalloc(&workspace, WORKSPACE_BYTES));
    cublasLtHandle_t lt;
    LT_OK(cublasLtCreate(&lt));
    printf("cuda_gemm_peak: %s (sm_%d%d), cuBLASLt %zu: bf16 inputs and output, f32 "
           "accumulation, median of %d products per shape\n",
           prop.name, prop.major, prop.minor, cublasLtGetVersion(), reps);

    double best = 0;
    int best_index = 0;
    for (int i = 0; i < count; i++) {
        double ms = measure(lt, stream, workspace, shapes[i], reps);
        double tflops = 2.0 * shapes[i].m * shapes[i].n * shapes[i].k / (ms * 1e-3) / 1e12;
        printf("gemm %dx%dx%d: %.3f ms, %.1f TFLOP/s (%d entries checked)\n", shapes[i].m,
               shapes[i].n, shapes[i].k, ms, tflops, CHECKED_ENTRIES);
        fflush(stdout);
        if (tflops > best) {
            best = tflops;
            best_index = i;
        }
    }
    printf("peak: %.1f TFLOP/s (%dx%dx%d)\n", best, shapes[best_index].m, shapes[best_index].n,
           shapes[best_index].k);

    LT_OK(cublasLtDestroy(lt));
    CUDA_OK(cudaFree(workspace));
    CUDA_OK(cudaStreamDestroy(stream));
    return 0;
}
