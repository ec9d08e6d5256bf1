/* loom core — every matrix product of the model goes through loom_gemm,
 * which runs it on one of two libraries:
 *
 *   oneDNN    matmul primitives, created once per shape and cached; f32, or
 *             bf16 x bf16 with f32 accumulation and output (its brgemm
 *             AVX-512 kernels, 2x the f32 rate where the CPU has BF16)
 *   OpenBLAS  cblas_sgemm; f32 only (bf16 runs multiply in f32 on it)
 *
 * The library and the dtype products are multiplied in are chosen once per
 * process (loom_gemm_select): model.gemm and the run's precision. A bf16
 * multiply rounds each f32 operand to bf16 on the way in (operands already
 * in bf16, the stored weights of a bf16 run, go in as they are); f16 runs
 * multiply in f32 (no CPU here multiplies f16 faster than f32). */
#ifndef LOOM_GEMM_H
#define LOOM_GEMM_H

#include "loom/tensor.h"

typedef enum loom_gemm_library {
    LOOM_GEMM_AUTO = 0, /* oneDNN when built with it, else OpenBLAS */
    LOOM_GEMM_ONEDNN,
    LOOM_GEMM_OPENBLAS,
} loom_gemm_library;

/* "auto", "onednn", "openblas" -> the library; -1 for anything else. */
int loom_gemm_library_parse(const char *name);
/* Whether this build has the library (OpenBLAS always; oneDNN when
 * libdnnl-dev was found at configure time). */
int loom_gemm_library_built(loom_gemm_library library);

/* The process's library and the dtype its products multiply in: bf16 for
 * a bf16 run on oneDNN, else f32. auto resolves here. Refuses a library
 * this build lacks. Until called: auto, f32. */
int loom_gemm_select(loom_gemm_library library, loom_dtype multiply);
loom_gemm_library loom_gemm_library_in_use(void);
loom_dtype loom_gemm_multiply_dtype(void);
/* "oneDNN 2.6.3 bf16 (avx512_core_bf16)", "OpenBLAS 0.3.21 f32": the
 * library, its version, the dtype and, for oneDNN, the ISA it runs. */
const char *loom_gemm_describe(void);

/* One operand of a product: element (r, c) of the matrix it stands for is
 * data[r * ld + c], or data[c * ld + r] when transposed. dtype f32, or bf16
 * (only on a bf16 multiply). */
typedef struct loom_gemm_operand {
    const void *data;
    loom_dtype dtype;
    int ld;
    int transposed;
} loom_gemm_operand;

static inline loom_gemm_operand loom_gemm_f32(const float *data, int ld, int transposed)
{
    return (loom_gemm_operand){data, LOOM_F32, ld, transposed};
}

/* c (M, N; row stride ldc) = alpha · a (M, K) · b (K, N) + beta · c, with
 * beta 0 or 1 (1: accumulate into c). multiply: the dtype to multiply in
 * for this product, LOOM_F32 or the process's (loom_gemm_multiply_dtype). */
void loom_gemm(float *c, int ldc, int M, int N, int K, loom_gemm_operand a, loom_gemm_operand b,
               float alpha, float beta, loom_dtype multiply);

/* Where a bf16 product writes the bf16 copies of its f32 operands: a
 * buffer of bytes the caller owns (and accounts for), lent until it lends
 * another or NULL. A product whose copies do not fit is split along its
 * largest dimension until they do. With none lent the copies go to a
 * buffer of the library's own. loom_gemm_scratch_bytes: what a model
 * lends, for products of up to rows x width operands. */
void loom_gemm_lend_scratch(void *buf, size_t bytes);
size_t loom_gemm_scratch_bytes(size_t rows, size_t width);

/* The threads the libraries use (train.threads). */
void loom_gemm_set_threads(int threads);

/* The library's rate on this rank, FLOP/s: products of the given shape
 * (c (M, N) = a (M, K) · b (K, N)^T as the model's forward runs them, in
 * the process's multiply dtype), timed for about seconds after a warm-up;
 * the best of 5 repeats. Returns 0 on failure (out of memory). */
double loom_gemm_measure(int M, int N, int K, double seconds);

#endif
