/* compute-cuda's products, without a GPU: the cuBLASLt problem that
 * compute_cuda.c builds for a loom gemm (row-major operands, transposed or
 * not, leading dimensions wider than the rows, batches) is computed here as
 * cuBLASLt would compute it — column-major, its A and B as described by the
 * key — and compared with the row-major product loom asked for, exactly
 * (small integers, so every sum is exact). Also the alignment the heuristic
 * is told and the span an operand's conversion covers. No CUDA call is
 * made: the plugin's source is compiled in for its static functions.
 *
 *   cuda_gemm_mapping        exit 0 when every case holds */
#include "compute_cuda.c"

static int failures;

static void fail(const char *what, int M, int N, int K, int ta, int tb, int batch)
{
    printf("FAIL %s: M %d N %d K %d, a%s, b%s, batch %d\n", what, M, N, K,
           ta ? " transposed" : "", tb ? " transposed" : "", batch);
    failures++;
}

/* Element (r, c) of a matrix as cuBLASLt stores it (column-major), of batch
 * member i; -1 past its layout, which no correct key reaches. */
static double stored(const lt_matrix *m, const float *d, int i, uint64_t r, uint64_t c)
{
    if (r >= m->rows || c >= m->cols)
        return -1e30;
    return d[(size_t)i * (size_t)m->stride + c * (size_t)m->ld + r];
}

/* Element (r, c) of op(matrix), as the product reads it. */
static double op(const lt_matrix *m, const float *d, int i, uint64_t r, uint64_t c)
{
    return m->transposed ? stored(m, d, i, c, r) : stored(m, d, i, r, c);
}

/* D = op(A) op(B) as cuBLASLt computes it from key, into out. */
static int emulate(const gemm_key *key, const float *a_slot, const float *b_slot, float *out)
{
    const lt_matrix *A = &key->m[0], *B = &key->m[1], *D = &key->m[2];
    uint64_t rows = A->transposed ? A->cols : A->rows, inner = A->transposed ? A->rows : A->cols;
    uint64_t inner_b = B->transposed ? B->cols : B->rows, cols = B->transposed ? B->rows : B->cols;
    if (rows != D->rows || cols != D->cols || inner != inner_b)
        return 0;
    for (int k = 0; k < 3; k++)
        if (key->m[k].ld < (int64_t)key->m[k].rows)
            return 0;
    for (int i = 0; i < key->batch; i++)
        for (uint64_t r = 0; r < rows; r++)
            for (uint64_t c = 0; c < cols; c++) {
                double s = 0;
                for (uint64_t k = 0; k < inner; k++)
                    s += op(A, a_slot, i, r, k) * op(B, b_slot, i, k, c);
                out[(size_t)i * (size_t)D->stride + c * (size_t)D->ld + r] = (float)s;
            }
    return 1;
}

static float *small_ints(size_t n, int seed)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((i * 7 + (size_t)seed) % 13) - 6.0f;
    return x;
}

static void check_case(int M, int N, int K, int ta, int tb, int pad, int batch)
{
    const int lda = (ta ? M : K) + 3 * pad, ldb = (tb ? K : N) + 2 * pad, ldc = N + pad;
    const size_t sa = (size_t)(ta ? K : M) * lda + 3, sb = (size_t)(tb ? N : K) * ldb + 5;
    const size_t sc = (size_t)M * ldc + 7;
    float *a = small_ints(batch * sa, 1), *b = small_ints(batch * sb, 2);
    float *out = calloc(batch * sc, sizeof *out);
    loom_compute c;
    memset(&c, 0, sizeof c);
    operand_view va = view_of((loom_compute_operand){a, LOOM_F32, lda, ta}, M, K, sa);
    operand_view vb = view_of((loom_compute_operand){b, LOOM_F32, ldb, tb}, K, N, sb);
    if (span_of(&va, batch) > batch * sa || span_of(&vb, batch) > batch * sb)
        fail("an operand's span reaches past its memory", M, N, K, ta, tb, batch);
    gemm_key key = product_key(&c, out, ldc, M, N, &va, &vb, LOOM_F32, batch, sc);
    if (!emulate(&key, b, a, out)) {
        fail("the cuBLASLt shapes do not fit together", M, N, K, ta, tb, batch);
    } else {
        for (int i = 0; i < batch; i++)
            for (int r = 0; r < M; r++)
                for (int col = 0; col < N; col++) {
                    double s = 0;
                    for (int k = 0; k < K; k++)
                        s += (double)a[i * sa + (ta ? (size_t)k * lda + r : (size_t)r * lda + k)] *
                             b[i * sb + (tb ? (size_t)col * ldb + k : (size_t)k * ldb + col)];
                    if (out[i * sc + (size_t)r * ldc + col] != (float)s) {
                        fail("a wrong product", M, N, K, ta, tb, batch);
                        i = batch, r = M, col = N; /* one line per case */
                    }
                }
    }
    free(a);
    free(b);
    free(out);
}

static void check_alignment(uintptr_t at, size_t stride_bytes, int batch, uint32_t want)
{
    uint32_t got = alignment_of((const void *)at, stride_bytes, batch);
    if (got != want) {
        printf("FAIL alignment_of(%#lx, stride %zu bytes, batch %d) = %u, want %u\n",
               (unsigned long)at, stride_bytes, batch, got, want);
        failures++;
    }
}

int main(void)
{
    /* odd sizes, single rows and columns, a deeper sum */
    static const int shapes[][3] = {{7, 20, 12}, {1, 9, 4}, {5, 1, 3}, {3, 4, 1}, {16, 8, 33}};
    int cases = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int pad = 0; pad < 2; pad++)
                    for (int batch = 1; batch <= 3; batch += 2, cases++)
                        check_case(shapes[s][0], shapes[s][1], shapes[s][2], ta, tb, pad, batch);
    check_alignment(0x1000, 0, 1, 256);
    check_alignment(0x1004, 0, 1, 4);
    check_alignment(0x1010, 0, 1, 16);
    check_alignment(0x1000, 12, 2, 4);  /* the second member is 4-aligned */
    check_alignment(0x1000, 12, 1, 256); /* one member: the stride is never used */
    printf("cuda_gemm_mapping: %d products, %s\n", cases, failures ? "FAILED" : "all exact");
    return failures != 0;
}
