/* loom_gemm (core/model/gemm.h) against a double-precision reference, on
 * every library this build has: each transpose, strided operands, alpha,
 * accumulation; bf16 products against the reference of the bf16-rounded
 * operands (and not of the f32 ones) where the CPU has bf16 instructions,
 * and a bf16 run's f32 products elsewhere; products split to fit a small
 * lent scratch; the library selection; a product oneDNN refuses, as an
 * error and not an abort; oneDNN under LOOM_MAX_ISA.
 *
 * usage: test_gemm <case>; exit 0 when every check passes, 77 when the
 * case cannot apply to this build or CPU (it says why). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/status.h"
#include "model/gemm.h"
#include "model/kernels.h"
#include "runtime/cpu.h"
#include "runtime/log.h"
#include "check.h"

enum { SKIPPED = 77 };
static int skipped;

static uint64_t rng = 88172645463325252ull;
static float uniform(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / (1ull << 24))) * 2.0f - 1.0f;
}

static float bf16_round(float x)
{
    uint16_t h;
    float y;
    loom_convert(&h, LOOM_BF16, &x, LOOM_F32, 1);
    loom_convert(&y, LOOM_F32, &h, LOOM_BF16, 1);
    return y;
}

typedef struct problem {
    int M, N, K, ta, tb, lda, ldb, ldc;
    float alpha, beta;
    float *a, *b, *c0; /* stored operands; c's start */
} problem;

static problem make(int M, int N, int K, int ta, int tb, int pad, float alpha, float beta)
{
    problem p = {M, N, K, ta, tb, 0, 0, N + pad, alpha, beta, NULL, NULL, NULL};
    p.lda = (ta ? M : K) + pad;
    p.ldb = (tb ? K : N) + pad;
    size_t na = (size_t)(ta ? K : M) * p.lda, nb = (size_t)(tb ? N : K) * p.ldb;
    p.a = malloc(na * 4), p.b = malloc(nb * 4), p.c0 = malloc((size_t)M * p.ldc * 4);
    for (size_t i = 0; i < na; i++)
        p.a[i] = uniform();
    for (size_t i = 0; i < nb; i++)
        p.b[i] = uniform();
    for (size_t i = 0; i < (size_t)M * p.ldc; i++)
        p.c0[i] = uniform();
    return p;
}

static void release(problem *p)
{
    free(p->a);
    free(p->b);
    free(p->c0);
}

static float at(const float *x, int ld, int transposed, int r, int c)
{
    return transposed ? x[(size_t)c * ld + r] : x[(size_t)r * ld + c];
}

/* The largest error of c against the reference, relative to the sum of
 * the terms' magnitudes; round: the operands as bf16. Padding untouched. */
static double error_of(const problem *p, const float *c, int round)
{
    double worst = 0;
    for (int i = 0; i < p->M; i++)
        for (int j = 0; j < p->ldc; j++) {
            size_t o = (size_t)i * p->ldc + j;
            if (j >= p->N) {
                if (memcmp(&c[o], &p->c0[o], 4))
                    return INFINITY;
                continue;
            }
            double sum = 0, mag = 0;
            for (int k = 0; k < p->K; k++) {
                double x = at(p->a, p->lda, p->ta, i, k), y = at(p->b, p->ldb, p->tb, k, j);
                if (round)
                    x = bf16_round((float)x), y = bf16_round((float)y);
                sum += x * y, mag += fabs(x * y);
            }
            double want = p->alpha * sum + p->beta * p->c0[o];
            double e = fabs(c[o] - want) / (fabs(p->alpha) * mag + fabs(p->beta * p->c0[o]) + 1e-30);
            if (e > worst)
                worst = e;
        }
    return worst;
}

static double run(const problem *p, loom_dtype multiply, float *c)
{
    memcpy(c, p->c0, (size_t)p->M * p->ldc * 4);
    loom_gemm(c, p->ldc, p->M, p->N, p->K, loom_gemm_f32(p->a, p->lda, p->ta),
              loom_gemm_f32(p->b, p->ldb, p->tb), p->alpha, p->beta, multiply);
    return error_of(p, c, multiply == LOOM_BF16);
}

static const char *const library_names[] = {"auto", "onednn", "openblas"};

static void test_f32(void)
{
    for (int lib = LOOM_GEMM_ONEDNN; lib <= LOOM_GEMM_OPENBLAS; lib++) {
        if (!loom_gemm_library_built(lib))
            continue;
        CHECK(loom_gemm_select(lib, LOOM_F32) == 0, "select %s", library_names[lib]);
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int pad = 0; pad < 8; pad += 7)
                    for (int acc = 0; acc < 2; acc++) {
                        problem p = make(37, 53, 71, ta, tb, pad, acc ? 0.125f : 1.0f, (float)acc);
                        float *c = malloc((size_t)p.M * p.ldc * 4);
                        for (int again = 0; again < 2; again++) { /* the cached primitive too */
                            double e = run(&p, LOOM_F32, c);
                            CHECK(e < 1e-5, "%s f32 ta %d tb %d pad %d beta %d: error %.3g",
                                  library_names[lib], ta, tb, pad, acc, e);
                        }
                        free(c);
                        release(&p);
                    }
    }
}

/* A bf16 run's products where they multiply in f32: the stored bf16
 * operands widened exactly, the same bits as their f32 values multiplied
 * in f32; and the note says why. */
static void test_bf16_storage_f32_products(void)
{
    const char *note = loom_gemm_products_note();
    printf("note %s\n", note);
    CHECK(strstr(note, "bf16 storage, f32 products: ") == note, "the note: '%s'", note);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            problem p = make(64, 96, 256, ta, tb, 3, 1.0f, 1.0f);
            size_t nb = (size_t)(tb ? p.N : p.K) * p.ldb;
            uint16_t *b16 = malloc(nb * 2);
            loom_convert(b16, LOOM_BF16, p.b, LOOM_F32, nb);
            loom_convert(p.b, LOOM_F32, b16, LOOM_BF16, nb); /* p.b: the widened values */
            float *c = malloc((size_t)p.M * p.ldc * 4), *c16 = malloc((size_t)p.M * p.ldc * 4);
            double e = run(&p, loom_gemm_multiply_dtype(), c);
            CHECK(e < 1e-5, "f32 products ta %d tb %d: error %.3g", ta, tb, e);
            memcpy(c16, p.c0, (size_t)p.M * p.ldc * 4);
            loom_gemm(c16, p.ldc, p.M, p.N, p.K, loom_gemm_f32(p.a, p.lda, ta),
                      (loom_gemm_operand){b16, LOOM_BF16, p.ldb, tb}, 1.0f, 1.0f,
                      loom_gemm_multiply_dtype());
            CHECK(!memcmp(c, c16, (size_t)p.M * p.ldc * 4),
                  "a bf16 operand multiplied in f32, ta %d tb %d: not its widened value's bits", ta,
                  tb);
            free(b16), free(c), free(c16);
            release(&p);
        }
    CHECK(loom_gemm_take_error() == LOOM_OK, "no product failed: %s", loom_last_error());
}

/* Whether bf16 products should multiply in bf16 here: oneDNN, and bf16
 * instructions at the level in use, which oneDNN may dispatch to. */
static int bf16_products_expected(void)
{
    const char *onednn_cap = getenv("ONEDNN_MAX_CPU_ISA");
    return loom_gemm_library_built(LOOM_GEMM_ONEDNN) && loom_cpu_isa() >= LOOM_ISA_AVX512_BF16 &&
           (!onednn_cap || !*onednn_cap || strstr(onednn_cap, "BF16") ||
            strstr(onednn_cap, "AMX") || !strcmp(onednn_cap, "ALL"));
}

static void test_bf16(void)
{
    for (int lib = LOOM_GEMM_ONEDNN; lib <= LOOM_GEMM_OPENBLAS; lib++) {
        if (!loom_gemm_library_built(lib))
            continue;
        CHECK(loom_gemm_select(lib, LOOM_BF16) == 0, "select %s bf16", library_names[lib]);
        const int expected = lib == LOOM_GEMM_ONEDNN && bf16_products_expected();
        CHECK((loom_gemm_multiply_dtype() == LOOM_BF16) == expected,
              "%s on %s: bf16 run multiplies in %s", library_names[lib], loom_cpu_describe(),
              loom_dtype_name(loom_gemm_multiply_dtype()));
        if (loom_gemm_multiply_dtype() != LOOM_BF16)
            test_bf16_storage_f32_products();
        else
            CHECK(loom_gemm_products_note()[0] == '\0', "a note with bf16 products: %s",
                  loom_gemm_products_note());
    }
    if (!bf16_products_expected()) {
        printf("note no bf16 products here (%s): their checks do not apply\n", loom_cpu_describe());
        return;
    }
    CHECK(loom_gemm_select(LOOM_GEMM_ONEDNN, LOOM_BF16) == 0, "select onednn bf16");
    CHECK(loom_gemm_multiply_dtype() == LOOM_BF16, "onednn multiplies bf16 in bf16 runs");
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            problem p = make(64, 96, 256, ta, tb, 3, 1.0f, 1.0f);
            float *c = malloc((size_t)p.M * p.ldc * 4);
            double e = run(&p, LOOM_BF16, c);
            CHECK(e < 1e-5, "bf16 ta %d tb %d: error %.3g against the bf16 operands", ta, tb, e);
            /* multiplied as bf16: far from the f32 operands' product */
            double e32 = error_of(&p, c, 0);
            CHECK(e32 > 1e-4, "bf16 ta %d tb %d: error %.3g against f32 operands; not rounded?",
                  ta, tb, e32);
            /* a bf16 operand goes in as it is: the same bits as its f32 value */
            size_t nb = (size_t)(tb ? p.N : p.K) * p.ldb;
            uint16_t *b16 = malloc(nb * 2);
            loom_convert(b16, LOOM_BF16, p.b, LOOM_F32, nb);
            float *c16 = malloc((size_t)p.M * p.ldc * 4);
            memcpy(c16, p.c0, (size_t)p.M * p.ldc * 4);
            loom_gemm(c16, p.ldc, p.M, p.N, p.K, loom_gemm_f32(p.a, p.lda, ta),
                      (loom_gemm_operand){b16, LOOM_BF16, p.ldb, tb}, 1.0f, 1.0f, LOOM_BF16);
            CHECK(!memcmp(c, c16, (size_t)p.M * p.ldc * 4), "bf16 operand ta %d tb %d differs",
                  ta, tb);
            free(b16);
            free(c16);
            free(c);
            release(&p);
        }
    /* attention's products ask for f32 in a bf16 run */
    problem p = make(16, 24, 32, 0, 1, 0, 1.0f, 0.0f);
    float *c = malloc((size_t)p.M * p.ldc * 4);
    CHECK(run(&p, LOOM_F32, c) < 1e-5, "f32 product in a bf16 run");
    free(c);
    release(&p);
}

/* Products whose bf16 copies do not fit the lent scratch: split along M
 * (the LM head's weight gradient), N (its forward) and K (its input
 * gradient); the same products as unsplit, up to the order of K's sums. */
static void test_split(void)
{
    if (!bf16_products_expected()) {
        printf("SKIP: no bf16 products here (%s), so no bf16 copies to split\n",
               loom_gemm_library_built(LOOM_GEMM_ONEDNN) ? loom_cpu_describe()
                                                         : "this build has no oneDNN");
        skipped = 1;
        return;
    }
    CHECK(loom_gemm_select(LOOM_GEMM_ONEDNN, LOOM_BF16) == 0, "select");
    const int shapes[3][3] = {{300, 20, 24}, {20, 300, 24}, {20, 24, 300}};
    for (int s = 0; s < 3; s++)
        for (int ta = 0; ta < 2; ta++) {
            problem p = make(shapes[s][0], shapes[s][1], shapes[s][2], ta, !ta, 1, 0.5f, 1.0f);
            float *c = malloc((size_t)p.M * p.ldc * 4);
            size_t whole = (size_t)(p.M * p.K + p.K * p.N) * 2;
            void *small = malloc(whole / 5);
            loom_gemm_lend_scratch(small, whole / 5);
            double e = run(&p, LOOM_BF16, c);
            loom_gemm_lend_scratch(NULL, 0);
            CHECK(e < 1e-5, "split %dx%dx%d ta %d: error %.3g", p.M, p.N, p.K, ta, e);
            free(small);
            free(c);
            release(&p);
        }
}

static void test_select(void)
{
    CHECK(loom_gemm_library_parse("auto") == LOOM_GEMM_AUTO, "parse auto");
    CHECK(loom_gemm_library_parse("onednn") == LOOM_GEMM_ONEDNN, "parse onednn");
    CHECK(loom_gemm_library_parse("openblas") == LOOM_GEMM_OPENBLAS, "parse openblas");
    CHECK(loom_gemm_library_parse("mkl") == -1, "parse mkl");
    CHECK(loom_gemm_select(LOOM_GEMM_AUTO, LOOM_F32) == 0, "select auto");
    CHECK(loom_gemm_library_in_use() == (loom_gemm_library_built(LOOM_GEMM_ONEDNN)
                                             ? LOOM_GEMM_ONEDNN
                                             : LOOM_GEMM_OPENBLAS),
          "auto prefers oneDNN");
    CHECK(loom_gemm_select(LOOM_GEMM_OPENBLAS, LOOM_BF16) == 0, "openblas in a bf16 run");
    CHECK(loom_gemm_multiply_dtype() == LOOM_F32, "OpenBLAS multiplies bf16 runs in f32");
    CHECK(loom_gemm_select(LOOM_GEMM_AUTO, LOOM_F16) == 0 && loom_gemm_multiply_dtype() == LOOM_F32,
          "f16 runs multiply in f32");
    CHECK(strstr(loom_gemm_describe(), "f32") != NULL, "describe: %s", loom_gemm_describe());
    if (!loom_gemm_library_built(LOOM_GEMM_ONEDNN))
        CHECK(loom_gemm_select(LOOM_GEMM_ONEDNN, LOOM_F32) != 0, "onednn refused when not built");
}

/* A product oneDNN cannot make (bf16 where ctest caps oneDNN at AVX2):
 * NaN in c and the failure kept, naming the product, its shape, dtype and
 * the CPU's level, until taken once; the process goes on multiplying. */
static void test_refusal(void)
{
    if (!loom_gemm_library_built(LOOM_GEMM_ONEDNN)) {
        printf("SKIP: this build has no oneDNN to refuse a product\n");
        skipped = 1;
        return;
    }
    const char *cap = getenv("ONEDNN_MAX_CPU_ISA");
    CHECK(cap && !strcmp(cap, "AVX2"), "run with ONEDNN_MAX_CPU_ISA=AVX2 (ctest sets it)");
    CHECK(loom_gemm_select(LOOM_GEMM_ONEDNN, LOOM_BF16) == 0, "select onednn bf16");
    CHECK(loom_gemm_multiply_dtype() == LOOM_F32, "oneDNN at AVX2: a bf16 run multiplies in f32");
    printf("note %s\n", loom_gemm_products_note());
    /* why: this CPU's (or the capped level's) lack of bf16, or oneDNN's cap */
    CHECK(strstr(loom_gemm_products_note(), "bf16 storage, f32 products: ") ==
              loom_gemm_products_note(),
          "the note: %s", loom_gemm_products_note());
    problem p = make(8, 12, 16, 0, 1, 0, 1.0f, 0.0f);
    float *c = malloc((size_t)p.M * p.ldc * 4);
    run(&p, LOOM_BF16, c); /* asked for in bf16 all the same */
    int all_nan = 1;
    for (int i = 0; i < p.M * p.ldc; i++)
        all_nan &= isnan(c[i]);
    CHECK(all_nan, "a refused product leaves NaN in c");
    int rc = loom_gemm_take_error();
    const char *detail = loom_last_error();
    printf("note %s\n", detail);
    CHECK(rc == LOOM_ERR_NOT_SUPPORTED, "refusal status %d", rc);
    CHECK(strstr(detail, "oneDNN") && strstr(detail, "bf16 product 8x12x16") &&
              strstr(detail, "isa ") && strstr(detail, loom_isa_name(loom_cpu_isa())) &&
              strstr(detail, "model.gemm"),
          "the detail names the library, product, shape, dtype, level and a way out: %s", detail);
    CHECK(loom_gemm_take_error() == LOOM_OK, "taken once");
    CHECK(run(&p, LOOM_F32, c) < 1e-5, "f32 products go on after a refusal");
    CHECK(loom_gemm_take_error() == LOOM_OK, "and do not fail");
    free(c);
    release(&p);
}

/* LOOM_MAX_ISA=avx2 (ctest sets it) caps oneDNN's dispatch too. */
static void test_isa_cap(void)
{
    const char *cap = getenv("LOOM_MAX_ISA");
    CHECK(cap && !strcmp(cap, "avx2"), "run with LOOM_MAX_ISA=avx2 (ctest sets it)");
    if (loom_cpu_detected_isa() < LOOM_ISA_AVX2) {
        printf("SKIP: this CPU has no AVX2 (%s)\n", loom_cpu_describe());
        skipped = 1;
        return;
    }
    CHECK(loom_cpu_isa() == LOOM_ISA_AVX2, "the level in use: %s", loom_cpu_describe());
    CHECK(loom_gemm_select(LOOM_GEMM_AUTO, LOOM_BF16) == 0 &&
              loom_gemm_multiply_dtype() == LOOM_F32,
          "no bf16 products at avx2");
    problem p = make(33, 40, 50, 1, 0, 2, 1.0f, 1.0f);
    float *c = malloc((size_t)p.M * p.ldc * 4);
    CHECK(run(&p, LOOM_F32, c) < 1e-5, "f32 products at avx2");
    printf("note %s\n", loom_gemm_describe());
    if (loom_gemm_library_built(LOOM_GEMM_ONEDNN))
        CHECK(strstr(loom_gemm_describe(), "(avx2)") != NULL, "oneDNN dispatches to avx2: %s",
              loom_gemm_describe());
    free(c);
    release(&p);
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } cases[] = {{"f32", test_f32},       {"bf16", test_bf16},       {"split", test_split},
                 {"select", test_select}, {"refusal", test_refusal}, {"isa_cap", test_isa_cap}};
    int ran = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        if (argc > 1 && !strcmp(argv[1], cases[i].name)) {
            cases[i].fn();
            ran++;
        }
    if (!ran) {
        fprintf(stderr, "usage: test_gemm <case>; no case named '%s'\n", argc > 1 ? argv[1] : "");
        return 2;
    }
    if (failures)
        fprintf(stderr, "%d failure(s)\n", failures);
    return failures ? 1 : skipped ? SKIPPED : 0;
}
