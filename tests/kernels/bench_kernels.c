/* The non-GEMM kernels' speed at GPT-2 124M shapes, against the machine's
 * memory bandwidth. Prints figures; asserts nothing about time.
 *
 *   bench_kernels [--quick] [THREADS...]      (default: 1 2)
 *
 * Each kernel's GB/s counts the bytes it must read plus the bytes it must
 * write once (a read-modify-write buffer twice); memcpy's counts the same
 * way (2 x its size), so "of memcpy" is the fraction of the bandwidth a
 * plain copy reaches with as many threads (each copying its part). Kernels
 * that stream several arrays at once can pass it. Medians of RUNS
 * timings.
 * Every timed call starts after 64 MiB have been read (twice this
 * machine's L3) and memcpy's reference copies 64 MiB, as
 * scripts/memcpy_bw.c does. The L3's replacement policy still keeps part
 * of a kernel's buffers that are reused run after run: buffers under
 * 32 MB (the (N, C) activations) can beat memcpy.
 * --quick: small shapes and few runs, so ctest checks that it runs. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loom/strategy.h"
#include "loom/tensor.h"
#include "model/kernels.h"
#include "model/optimizer.h"

static int B = 4, T = 256, C = 768, V = 50257, Vp = 50304, NH = 12, RUNS = 9;
static size_t PARAMS = 124475904; /* GPT-2 124M with the padded vocabulary */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void *alloc(size_t bytes)
{
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bench_kernels: out of memory\n");
        exit(2);
    }
    return p;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float *randf(size_t n, float lo, float hi)
{
    float *x = alloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = lo + (hi - lo) * (float)(rng >> 40) / 16777216.0f;
    }
    return x;
}

static int *rand_tokens(size_t n, int below)
{
    int *x = alloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (int)((rng >> 33) % (uint64_t)below);
    }
    return x;
}

/* All the buffers the kernels run on, made once. */
typedef struct bench {
    int N;
    float *x, *y, *z, *w, *wb, *mean, *rstd, *dw, *db;
    float *wide_x, *wide_y, *wide_z;
    float *logits, *lse, *dlogits, *losses, *dlosses;
    int *tokens, *targets;
    float *wte, *wpe, *dwte, *dwpe;
    float *master, *grad, *m, *v;
    uint16_t *half;
    float *q, *k, *vv, *att, *att_lse, *dq, *dk, *dv, *datt;
} bench;

static bench *b_;

enum { FLUSH_BYTES = 64 << 20 };
static char *flush_src, *flush_dst;

/* Reads, not memset: glibc's large memset streams past the caches. On the
 * kernels' threads, as the kernels before a kernel in a training step run:
 * a thread left asleep by a long serial gap would wait to be scheduled. */
static void flush_span(void *ctx, size_t begin, size_t end)
{
    const uint64_t *p = (const uint64_t *)flush_src;
    uint64_t sum = 0;
    for (size_t i = begin; i < end; i += 8) /* one read per cache line */
        sum += p[i];
    __atomic_fetch_add((uint64_t *)ctx, sum, __ATOMIC_RELAXED);
}

static void flush_caches(void)
{
    static uint64_t sink;
    loom_kernels_for_spans(FLUSH_BYTES / sizeof(uint64_t), flush_span, &sink);
}

typedef void (*kernel_fn)(void);

static double median_time(kernel_fn f)
{
    double t[64];
    f(); /* touch the pages */
    for (int r = 0; r < RUNS; r++) {
        flush_caches();
        double t0 = now_s();
        f();
        t[r] = now_s() - t0;
    }
    qsort(t, (size_t)RUNS, sizeof t[0], cmp_double);
    return t[RUNS / 2];
}

/* memcpy of 64 MiB, split over the kernels' threads */
static void copy_span(void *ctx, size_t begin, size_t end)
{
    (void)ctx;
    memcpy(flush_dst + begin, flush_src + begin, end - begin);
}

static void k_memcpy(void) { loom_kernels_for_spans(FLUSH_BYTES, copy_span, NULL); }

static void k_encoder_fwd(void)
{
    loom_encoder_forward(b_->x, b_->tokens, NULL, b_->wte, b_->wpe, B, T, C);
}

static void k_encoder_bwd(void)
{
    loom_encoder_backward(b_->dwte, b_->dwpe, b_->x, b_->tokens, NULL, B, T, C);
}

static void k_layernorm_fwd(void)
{
    loom_layernorm_forward(b_->y, b_->mean, b_->rstd, b_->x, b_->w, b_->wb, b_->N, C);
}

static void k_layernorm_bwd(void)
{
    loom_layernorm_backward(b_->z, b_->dw, b_->db, b_->y, b_->x, b_->w, b_->mean, b_->rstd,
                            b_->N, C);
}

static void k_residual_fwd(void) { loom_residual_forward(b_->z, b_->x, b_->y, b_->N * C); }

static void k_residual_bwd(void) { loom_residual_backward(b_->y, b_->z, b_->x, b_->N * C); }

static void k_gelu_fwd(void) { loom_gelu_forward(b_->wide_y, b_->wide_x, b_->N * 4 * C); }

static void k_gelu_bwd(void)
{
    loom_gelu_backward(b_->wide_z, b_->wide_x, b_->wide_y, b_->N * 4 * C);
}

static void k_softmax_ce_fwd(void)
{
    loom_softmax_crossentropy_forward(b_->losses, b_->lse, b_->logits, b_->targets, b_->N, V, Vp);
}

/* It writes over its input: the runs after the first start from a
 * gradient, at the same cost (the loop has no branches). */
static void k_softmax_ce_bwd(void)
{
    loom_softmax_crossentropy_backward(b_->dlogits, b_->dlosses, b_->lse, b_->targets, b_->N, V,
                                       Vp);
}

static void k_adamw(void)
{
    static int64_t step = 0;
    loom_optimizer_step s = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                             .weight_decay = 0.1f, .step = ++step, .grad_scale = 1.0f};
    loom_adamw_update(&s, b_->master, b_->grad, LOOM_F32, b_->m, b_->v, PARAMS);
}

static void k_to_bf16(void) { loom_convert(b_->half, LOOM_BF16, b_->wide_x, LOOM_F32, (size_t)b_->N * 4 * C); }
static void k_from_bf16(void) { loom_convert(b_->wide_y, LOOM_F32, b_->half, LOOM_BF16, (size_t)b_->N * 4 * C); }
static void k_to_f16(void) { loom_convert(b_->half, LOOM_F16, b_->wide_x, LOOM_F32, (size_t)b_->N * 4 * C); }
static void k_from_f16(void) { loom_convert(b_->wide_y, LOOM_F32, b_->half, LOOM_F16, (size_t)b_->N * 4 * C); }

static int attn_T, attn_B;

static void k_attention_fwd(void)
{
    loom_attention_forward(b_->att, b_->att_lse, b_->q, b_->k, b_->vv, attn_B, attn_T, NH, C / NH);
}

static void k_attention_bwd(void)
{
    loom_attention_backward(b_->dq, b_->dk, b_->dv, b_->q, b_->k, b_->vv, b_->att, b_->datt,
                            b_->att_lse, attn_B, attn_T, NH, C / NH);
}

typedef struct row {
    const char *name;
    kernel_fn fn;
    double bytes; /* read + written; 0: compute-bound, time only */
} row;

static void print_row(const char *name, double t, double bytes, double copy_gbs)
{
    if (bytes > 0) {
        double gbs = bytes / t / 1e9;
        printf("  %-28s %9.3f ms %8.2f GB/s %6.0f%% of memcpy\n", name, t * 1e3, gbs,
               100.0 * gbs / copy_gbs);
    } else {
        printf("  %-28s %9.3f ms\n", name, t * 1e3);
    }
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int threads[8], nthreads = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            B = 2, T = 64, C = 64, V = 500, Vp = 512, NH = 4, RUNS = 3;
            PARAMS = 100000;
        } else if (nthreads < 8 && atoi(argv[i]) > 0) {
            threads[nthreads++] = atoi(argv[i]);
        } else {
            fprintf(stderr, "usage: bench_kernels [--quick] [THREADS...]\n");
            return 2;
        }
    }
    if (!nthreads) {
        threads[0] = 1, threads[1] = 2;
        nthreads = 2;
    }
    flush_src = alloc(FLUSH_BYTES), flush_dst = alloc(FLUSH_BYTES);
    memset(flush_src, 1, FLUSH_BYTES);
    bench b = {.N = B * T};
    b_ = &b;
    size_t NC = (size_t)b.N * C, NV = (size_t)b.N * Vp, N4C = 4 * NC;
    b.x = randf(N4C, -1, 1), b.y = randf(N4C, -1, 1), b.z = randf(N4C, -1, 1);
    b.w = randf((size_t)C, 0.5f, 1.5f), b.wb = randf((size_t)C, -0.1f, 0.1f);
    b.mean = randf((size_t)b.N, 0, 0), b.rstd = randf((size_t)b.N, 0, 0);
    b.dw = randf((size_t)C, 0, 0), b.db = randf((size_t)C, 0, 0);
    b.wide_x = randf(N4C, -3, 3), b.wide_y = randf(N4C, -1, 1), b.wide_z = randf(N4C, 0, 0);
    b.logits = randf(NV, -8, 8), b.lse = randf((size_t)b.N, 0, 0), b.dlogits = randf(NV, 0, 0);
    b.losses = randf((size_t)b.N, 0, 0), b.dlosses = randf((size_t)b.N, 1e-3f, 1e-3f);
    b.tokens = rand_tokens((size_t)b.N, V), b.targets = rand_tokens((size_t)b.N, V);
    b.wte = randf((size_t)Vp * C, -0.1f, 0.1f), b.wpe = randf((size_t)T * C, -0.1f, 0.1f);
    b.dwte = randf((size_t)Vp * C, 0, 0), b.dwpe = randf((size_t)T * C, 0, 0);
    b.master = randf(PARAMS, -0.1f, 0.1f), b.grad = randf(PARAMS, -1e-3f, 1e-3f);
    b.m = randf(PARAMS, 0, 0), b.v = randf(PARAMS, 0, 0);
    b.half = alloc(N4C * sizeof(uint16_t));
    k_to_bf16();
    k_softmax_ce_fwd();
    memcpy(b.dlogits, b.logits, NV * sizeof(float));

    const double f = sizeof(float), NCb = (double)NC * f, N4Cb = (double)N4C * f;
    const double NVb = (double)NV * f, Nf = (double)b.N * f;
    const row rows[] = {
        {"encoder forward", k_encoder_fwd, 3 * NCb},
        {"encoder backward", k_encoder_bwd, 5 * NCb},
        {"layernorm forward", k_layernorm_fwd, 2 * NCb + 2 * Nf},
        {"layernorm backward", k_layernorm_bwd, 4 * NCb + 2 * Nf},
        {"residual forward", k_residual_fwd, 3 * NCb},
        {"residual backward", k_residual_bwd, 5 * NCb},
        {"gelu forward", k_gelu_fwd, 2 * N4Cb},
        {"gelu backward", k_gelu_bwd, 4 * N4Cb},
        {"softmax+crossentropy fwd", k_softmax_ce_fwd, NVb},
        {"softmax+crossentropy bwd", k_softmax_ce_bwd, 2 * NVb},
        {"adamw (124M params)", k_adamw, 7.0 * (double)PARAMS * f},
        {"convert f32->bf16", k_to_bf16, 6 * (double)N4C},
        {"convert bf16->f32", k_from_bf16, 6 * (double)N4C},
        {"convert f32->f16", k_to_f16, 6 * (double)N4C},
        {"convert f16->f32", k_from_f16, 6 * (double)N4C},
    };
    printf("bench_kernels: N = %d (B %d x T %d), C = %d, Vp = %d; medians of %d\n", b.N, B, T, C,
           Vp, RUNS);
    for (int ti = 0; ti < nthreads; ti++) {
        loom_kernels_set_threads(threads[ti]);
        double copy_gbs = 2.0 * FLUSH_BYTES / median_time(k_memcpy) / 1e9;
        printf("threads %d: memcpy of 64 MiB: %.2f GB/s read + written\n", threads[ti], copy_gbs);
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
            print_row(rows[r].name, median_time(rows[r].fn), rows[r].bytes, copy_gbs);
        /* attention is compute-bound: time per call, at longer sequences
         * too (N rows in all, at least one sequence) */
        const int lengths[] = {T, 4 * T, 8 * T};
        const size_t rows_max = (size_t)(b.N > 8 * T ? b.N : 8 * T), RC = rows_max * C;
        if (!b.q) {
            b.q = randf(RC, -1, 1), b.k = randf(RC, -1, 1), b.vv = randf(RC, -1, 1);
            b.att = randf(RC, 0, 0), b.att_lse = randf(rows_max * NH, 0, 0);
            b.dq = randf(RC, 0, 0), b.dk = randf(RC, 0, 0), b.dv = randf(RC, 0, 0);
            b.datt = randf(RC, -1, 1);
        }
        for (int li = 0; li < 3; li++) {
            attn_T = lengths[li];
            attn_B = b.N / attn_T > 1 ? b.N / attn_T : 1;
            char name[64];
            snprintf(name, sizeof name, "attention forward B=%d T=%d", attn_B, attn_T);
            print_row(name, median_time(k_attention_fwd), 0, copy_gbs);
            snprintf(name, sizeof name, "attention backward B=%d T=%d", attn_B, attn_T);
            print_row(name, median_time(k_attention_bwd), 0, copy_gbs);
        }
    }
    return 0;
}
