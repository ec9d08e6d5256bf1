/* compute_cuda.c's own product path (product_key, the plan's descriptors,
 * the heuristic's preferences, cublasLtMatmul), exported for
 * cublaslt_emu_test.cpp: the plugin's source is compiled in for its static
 * functions, and its cuBLASLt calls reach the emulation linked in place of
 * the library. No CUDA runtime call is made on this path. */
#include "compute_cuda.c"

int emu_products_open(void);
void emu_products_close(void);
int emu_products_run(float *out, int ldc, int M, int N, int K, const void *a, int lda, int ta,
                     const void *b, int ldb, int tb, float alpha, float beta, int multiply,
                     int batch, size_t stride_a, size_t stride_b, size_t stride_out);

static int print_error(const loom_host *host, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int print_error(const loom_host *host, int status, const char *fmt, ...)
{
    (void)host;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "compute_cuda.c: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return status;
}

static loom_host emu_host;
static loom_compute emu_compute;

/* The plugin's state, as far as its products use it: a cuBLASLt handle,
 * the plans, deterministic. Returns 0 on success. */
int emu_products_open(void)
{
    emu_host.struct_size = sizeof emu_host;
    emu_host.error = print_error;
    memset(&emu_compute, 0, sizeof emu_compute);
    emu_compute.host = &emu_host;
    emu_compute.ctx.deterministic = 1;
    return cublasLtCreate(&emu_compute.lt) != CUBLAS_STATUS_SUCCESS;
}

void emu_products_close(void)
{
    destroy_plans(&emu_compute);
    if (emu_compute.lt)
        cublasLtDestroy(emu_compute.lt);
    emu_compute.lt = NULL;
}

/* out (M, N; row stride ldc) = alpha a (M, K) b (K, N) + beta out, batch
 * members stride_* elements apart, both operands already in multiply's
 * dtype (0 f32, 1 bf16): loom's gemm op as compute_cuda.c hands it to
 * cuBLASLt. Returns 0 when done, 1 where the bf16 shape has no algorithm
 * (the plugin widens it), 2 on any other failure (its line on stderr). */
int emu_products_run(float *out, int ldc, int M, int N, int K, const void *a, int lda, int ta,
                     const void *b, int ldb, int tb, float alpha, float beta, int multiply,
                     int batch, size_t stride_a, size_t stride_b, size_t stride_out)
{
    const loom_dtype dtype = multiply ? LOOM_BF16 : LOOM_F32;
    operand_view va = view_of((loom_compute_operand){a, dtype, lda, ta}, M, K, stride_a);
    operand_view vb = view_of((loom_compute_operand){b, dtype, ldb, tb}, K, N, stride_b);
    const int rc = run_product(&emu_compute, out, ldc, M, N, K, &va, &vb, alpha, beta, dtype,
                               batch, stride_out);
    return rc == LOOM_OK ? 0 : rc == LOOM_ERR_NOT_SUPPORTED ? 1 : 2;
}
