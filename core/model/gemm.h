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
 * in bf16, the stored weights of a bf16 run, go in as they are). It runs
 * only where the CPU has bf16 instructions (loom_cpu_isa: AVX512-BF16 or
 * AMX) and oneDNN makes the product; elsewhere, and on OpenBLAS, a bf16
 * run keeps its 16-bit storage and multiplies in f32, its bf16 operands
 * widened; f16 runs always multiply in f32 (no CPU here multiplies f16
 * faster than f32).
 *
 * A product the library refuses (or that runs out of memory) does not
 * stop the process: its result is NaN and the failure waits, with a
 * detail naming the product, its shape and dtype, the library and the
 * CPU's instruction level, for loom_gemm_take_error. */
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

/* The process's library and the dtype its products multiply in for a run
 * of precision: bf16 for a bf16 run on oneDNN on a CPU with bf16
 * instructions, else f32. auto resolves here. Refuses a library this
 * build lacks. Until called: auto, f32. */
int loom_gemm_select(loom_gemm_library library, loom_dtype precision);
loom_gemm_library loom_gemm_library_in_use(void);
loom_dtype loom_gemm_multiply_dtype(void);
/* Why a 16-bit run multiplies in f32, as the training header says it:
 * "bf16 storage, f32 products: this CPU has no bf16 instructions"; ""
 * when the products multiply in the run's own dtype. */
const char *loom_gemm_products_note(void);
/* LOOM_OK, or the status of the first product that failed since the last
 * call, with its detail recorded on the calling thread (loom_fail). */
int loom_gemm_take_error(void);
/* "oneDNN 2.6.3 bf16 (avx512_core_bf16)", "OpenBLAS 0.3.21 f32
 * (Cooperlake)": the library, its version, the dtype and the ISA of its
 * kernels (oneDNN's dispatch, OpenBLAS's core type). */
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
 * the best of 5 repeats. Returns 0 on failure: out of memory, or a product
 * that failed (loom_gemm_take_error tells). */
double loom_gemm_measure(int M, int N, int K, double seconds);

#endif
