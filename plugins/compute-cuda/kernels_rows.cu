/* compute-cuda's row and element-wise kernels: the embedding, LayerNorm,
 * the residual sum, bias and GELU, with the cpu backend's semantics
 * (core/model/kernels.c and compute_cpu.c).
 *
 * Row kernels give each row to one warp of 32 lanes. A row's columns are
 * taken in chunks of four, chunk j by lane j % 32, read with one float4
 * load where the row allows it (C % 4 == 0 and every pointer 16-byte
 * aligned) and element by element otherwise; a lane sums its chunks' values
 * in column order either way, so a row's reductions give the same bits
 * whichever load ran, and the residual's LayerNorm the bits of LayerNorm
 * run apart on the same sums.
 *
 * Nothing here uses a floating-point atomic: a result is the same bits run
 * to run on one device.
 *   - Column sums (bias and LayerNorm weight gradients): blocks over chunks
 *     of rows write partial sums into ctx->scratch, then one thread per
 *     column adds the chunks in order into the gradient.
 *   - Scatters into gradient rows (wte by token, wpe by position): the
 *     indices are read back to the host, which groups the rows by the
 *     gradient row they add into (a stable sort, so each group keeps row
 *     order); one block per group then adds its rows in that order, the
 *     order of the cpu backend's loop, so those results are its bits.
 *
 * Per-element math (GELU, its derivative, a lane's part of a row) is in
 * __host__ __device__ functions, which tests/compute/cuda_rows_host_test.cu
 * checks on the host. */
#include "cuda_kernels.h"
#include "launch.cuh"

#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAYERNORM_EPS 1e-5f
#define GELU_SCALING_FACTOR 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBIC 0.044715f

#define WARP 32
#define ROW_BLOCK 256                   /* threads of a row kernel's block */
#define ROWS_PER_BLOCK (ROW_BLOCK / WARP) /* one row per warp */
#define ELEMENT_BLOCK 256
#define COLUMN_TILE 32     /* columns of a column-sum block: one warp's coalesced row segment */
#define COLUMN_ROW_LANES 8 /* rows a column-sum block reads at once */
#define GROUP_BLOCK 256    /* most threads of a grouped-rows block */
#define RADIX 65536        /* 16-bit digits of the host's key sort */

/* Loops over a chunk's four values, unrolled so that they stay in registers
 * (the host compiler, which also builds the __host__ functions, does not
 * know the pragma). */
#ifdef __CUDA_ARCH__
#define UNROLL _Pragma("unroll")
#else
#define UNROLL
#endif

/* ------------------------------------------------------------ per-element math */

/* GELU (tanh approximation) as the cpu backend computes it:
 * 0.5·x·(1 + tanh a) = x·σ(2a), a = sqrt(2/pi)·(x + 0.044715·x³), and with
 * e = exp(-2|a|) ≤ 1, σ(2a) = 1/(1+e) for a ≥ 0, e/(1+e) for a < 0,
 * σ(2a)·(1 - σ(2a)) = e/(1+e)²; no tail cancels. */
static __host__ __device__ inline float gelu_arg(float x)
{
    return GELU_SCALING_FACTOR * (x + GELU_CUBIC * x * x * x);
}

/* σ(2a), and σ(2a)·(1 - σ(2a)) in *slope */
static __host__ __device__ inline float gelu_gate(float a, float *slope)
{
    const float e = expf(-2.0f * fabsf(a));
    const float inv = 1.0f / (1.0f + e);
    *slope = e * inv * inv;
    return a < 0.0f ? e * inv : inv;
}

static __host__ __device__ inline float gelu_value(float x)
{
    float slope;
    return x * gelu_gate(gelu_arg(x), &slope);
}

/* d/dx x·σ(2a) = σ(2a) + x·2σ(2a)(1 - σ(2a))·a'(x), a' = sqrt(2/pi)·(1 + 3·0.044715·x²) */
static __host__ __device__ inline float gelu_derivative(float x)
{
    float slope;
    const float gate = gelu_gate(gelu_arg(x), &slope);
    return gate + 2.0f * x * slope * GELU_SCALING_FACTOR * (1.0f + 3.0f * GELU_CUBIC * x * x);
}

/* --------------------------------------------------------- a lane's part of a row */

static __host__ __device__ inline int row_chunks(int C) { return (C + 3) / 4; }

/* Chunk j of a row (columns 4j .. 4j+3, fewer at the end of the row) into
 * v; returns how many. vec: C % 4 == 0 and the row 16-byte aligned. */
static __host__ __device__ inline int load_chunk(float v[4], const float *row, int j, int C,
                                                 int vec)
{
    if (vec) {
        const float4 q = reinterpret_cast<const float4 *>(row)[j];
        v[0] = q.x;
        v[1] = q.y;
        v[2] = q.z;
        v[3] = q.w;
        return 4;
    }
    const int n = C - 4 * j < 4 ? C - 4 * j : 4;
    UNROLL
    for (int k = 0; k < 4; k++)
        v[k] = k < n ? row[4 * j + k] : 0.0f;
    return n;
}

static __host__ __device__ inline void store_chunk(float *row, int j, int n, const float v[4],
                                                   int vec)
{
    if (vec) {
        reinterpret_cast<float4 *>(row)[j] = make_float4(v[0], v[1], v[2], v[3]);
        return;
    }
    UNROLL
    for (int k = 0; k < 4; k++)
        if (k < n)
            row[4 * j + k] = v[k];
}

/* The lane's part of sum(x) */
static __host__ __device__ inline float lane_sum(const float *x, int lane, int C, int vec)
{
    float s = 0.0f, v[4];
    for (int j = lane; j < row_chunks(C); j += WARP) {
        const int n = load_chunk(v, x, j, C, vec);
        UNROLL
        for (int k = 0; k < 4; k++)
            if (k < n)
                s += v[k];
    }
    return s;
}

/* The lane's part of sum((x - m)²), the biased variance's numerator */
static __host__ __device__ inline float lane_squares(const float *x, float m, int lane, int C,
                                                     int vec)
{
    float s = 0.0f, v[4];
    for (int j = lane; j < row_chunks(C); j += WARP) {
        const int n = load_chunk(v, x, j, C, vec);
        UNROLL
        for (int k = 0; k < 4; k++)
            if (k < n) {
                const float d = v[k] - m;
                s += d * d;
            }
    }
    return s;
}

/* 1 / sqrt(variance + eps) from the row's sum of squares */
static __host__ __device__ inline float layernorm_rstd(float squares, int C)
{
    return 1.0f / sqrtf(squares / (float)C + LAYERNORM_EPS);
}

/* The lane's chunks of out = (x - m)·s·w + b */
static __host__ __device__ inline void lane_normalize(float *o, const float *x, const float *w,
                                                      const float *b, float m, float s, int lane,
                                                      int C, int vec)
{
    float xv[4], wv[4], bv[4], ov[4];
    for (int j = lane; j < row_chunks(C); j += WARP) {
        const int n = load_chunk(xv, x, j, C, vec);
        load_chunk(wv, w, j, C, vec);
        load_chunk(bv, b, j, C, vec);
        UNROLL
        for (int k = 0; k < 4; k++)
            ov[k] = (s * (xv[k] - m)) * wv[k] + bv[k];
        store_chunk(o, j, n, ov, vec);
    }
}

/* The lane's parts of sum(w·dout) and sum(w·dout·norm), norm = (x - m)·s */
static __host__ __device__ inline void lane_backward_sums(float *dnorm_sum, float *dnorm_norm_sum,
                                                          const float *d, const float *x,
                                                          const float *w, float m, float s,
                                                          int lane, int C, int vec)
{
    float a = 0.0f, b = 0.0f, dv[4], xv[4], wv[4];
    for (int j = lane; j < row_chunks(C); j += WARP) {
        const int n = load_chunk(dv, d, j, C, vec);
        load_chunk(xv, x, j, C, vec);
        load_chunk(wv, w, j, C, vec);
        UNROLL
        for (int k = 0; k < 4; k++)
            if (k < n) {
                const float norm = (xv[k] - m) * s;
                const float dnorm = wv[k] * dv[k];
                a += dnorm;
                b += dnorm * norm;
            }
    }
    *dnorm_sum = a;
    *dnorm_norm_sum = b;
}

/* The lane's chunks of dx += (dnorm - mean(dnorm) - norm·mean(dnorm·norm))·s */
static __host__ __device__ inline void lane_backward_input(float *dx, const float *d,
                                                           const float *x, const float *w,
                                                           float m, float s, float dnorm_mean,
                                                           float dnorm_norm_mean, int lane, int C,
                                                           int vec)
{
    float dv[4], xv[4], wv[4], gv[4];
    for (int j = lane; j < row_chunks(C); j += WARP) {
        const int n = load_chunk(dv, d, j, C, vec);
        load_chunk(xv, x, j, C, vec);
        load_chunk(wv, w, j, C, vec);
        load_chunk(gv, dx, j, C, vec);
        UNROLL
        for (int k = 0; k < 4; k++) {
            const float norm = (xv[k] - m) * s;
            const float dnorm = wv[k] * dv[k];
            gv[k] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
        store_chunk(dx, j, n, gv, vec);
    }
}

/* --------------------------------------------------------------- launch helpers */

static inline int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

static inline unsigned row_blocks(int rows)
{
    return (unsigned)(((long long)rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
}

/* Blocks of a grid-stride element-wise kernel over n items: enough to fill
 * the device several times over, never more than the items need. */
static inline unsigned element_blocks(const cuda_ctx *x, size_t n)
{
    const size_t most = (size_t)(x->sm_count > 0 ? x->sm_count : 32) * 16;
    size_t blocks = (n + ELEMENT_BLOCK - 1) / ELEMENT_BLOCK;
    if (blocks > most)
        blocks = most;
    return (unsigned)(blocks ? blocks : 1);
}

/* The row of this warp in a row kernel, or -1 past the last. */
static __device__ inline int warp_row(int rows)
{
    const long long r = (long long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
    return r < rows ? (int)r : -1;
}

/* Every lane of a full warp gets the same sum: xor pairs add the same two
 * values in either order. */
static __device__ inline float warp_sum(float v)
{
#pragma unroll
    for (int m = WARP / 2; m > 0; m /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

/* ------------------------------------------------------------------- the embedding */

__global__ void encoder_forward_kernel(float *out, const int *inp, const int *pos,
                                       const float *wte, const float *wpe, int N, int T, int C,
                                       int vec)
{
    const int r = warp_row(N), lane = threadIdx.x % WARP;
    if (r < 0)
        return;
    const int t = r % T;
    const float *te = wte + (size_t)inp[r] * C;
    const float *pe = wpe + (size_t)(pos ? pos[t] : t) * C;
    float *o = out + (size_t)r * C;
    if (vec) {
        const float4 *te4 = reinterpret_cast<const float4 *>(te);
        const float4 *pe4 = reinterpret_cast<const float4 *>(pe);
        float4 *o4 = reinterpret_cast<float4 *>(o);
        for (int j = lane; j < C / 4; j += WARP) {
            const float4 a = te4[j], b = pe4[j];
            o4[j] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        }
    } else {
        for (int c = lane; c < C; c += WARP)
            o[c] = te[c] + pe[c];
    }
}

__global__ void embedding_rows_forward_kernel(float *out, const int *tok, int v0, int rows,
                                              const float *wte, int N, int C, int vec)
{
    const int r = warp_row(N), lane = threadIdx.x % WARP;
    if (r < 0)
        return;
    const long long t = (long long)tok[r] - v0;
    const float *src = t >= 0 && t < rows ? wte + (size_t)t * C : NULL;
    float *o = out + (size_t)r * C;
    if (vec) {
        const float4 *s4 = reinterpret_cast<const float4 *>(src);
        float4 *o4 = reinterpret_cast<float4 *>(o);
        for (int j = lane; j < C / 4; j += WARP)
            o4[j] = src ? s4[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    } else {
        for (int c = lane; c < C; c += WARP)
            o[c] = src ? src[c] : 0.0f;
    }
}

/* x (R, C) += wpe[pos[r]] for each row; also the bias (pos NULL: every row
 * adds row 0 of wpe, the bias). */
__global__ void add_rows_kernel(float *xs, const float *wpe, const int *pos, int R, int C, int vec)
{
    const int r = warp_row(R), lane = threadIdx.x % WARP;
    if (r < 0)
        return;
    const float *pe = wpe + (pos ? (size_t)pos[r] * C : 0);
    float *o = xs + (size_t)r * C;
    if (vec) {
        const float4 *p4 = reinterpret_cast<const float4 *>(pe);
        float4 *o4 = reinterpret_cast<float4 *>(o);
        for (int j = lane; j < C / 4; j += WARP) {
            const float4 a = o4[j], b = p4[j];
            o4[j] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
        }
    } else {
        for (int c = lane; c < C; c += WARP)
            o[c] += pe[c];
    }
}

/* Group blockIdx.x adds rows row[start[g]] .. row[start[g+1] - 1] of src,
 * in that (increasing) order, into row key[g] of dst: per column, the cpu
 * backend's sequence of additions. blockIdx.y picks the columns. A group's
 * additions are one chain, but its loads are not: unrolled, they are in
 * flight together (a frequent token's group is hundreds of rows). */
__global__ void grouped_rows_add_kernel(float *dst, const float *src, const int *start,
                                        const int *key, const int *row, int C)
{
    const int g = blockIdx.x;
    const int begin = start[g], end = start[g + 1];
    float *d = dst + (size_t)key[g] * C;
    const long long step = (long long)gridDim.y * blockDim.x;
    for (long long c = (long long)blockIdx.y * blockDim.x + threadIdx.x; c < C; c += step) {
        float acc = d[c];
#pragma unroll 8
        for (int i = begin; i < end; i++)
            acc += src[(size_t)row[i] * C + c];
        d[c] = acc;
    }
}

/* ---- grouping rows by the gradient row they add into (host) ---- */

/* Group g adds rows row[start[g]] .. row[start[g + 1] - 1], in increasing
 * order, into gradient row key[g]; the three arrays lie one after the
 * other in one int array, for one upload. */
typedef struct row_groups {
    int groups, rows;
    int *start, *key, *row;
} row_groups;

/* Ints group_rows needs at most: for out (3n + 1) and for work. */
static inline size_t groups_ints(int n) { return 3 * (size_t)n + 1; }
static inline size_t groups_work_ints(int n) { return 2 * (size_t)n + RADIX; }

/* Rows 0..n-1 grouped by key[r] (key < 0: the row adds nowhere) into out:
 * an LSD radix sort of 16-bit digits, stable, so each group keeps row
 * order. Returns the ints of out used (2·groups + 1 + rows). */
static size_t group_rows(row_groups *g, int *out, const int *key, int n, int *work)
{
    int *a = work, *b = work + n;
    unsigned *hist = (unsigned *)(work + 2 * (size_t)n);
    int m = 0, most = 0;
    for (int r = 0; r < n; r++)
        if (key[r] >= 0) {
            a[m++] = r;
            most = key[r] > most ? key[r] : most;
        }
    for (int shift = 0; shift < 32; shift += 16) {
        memset(hist, 0, RADIX * sizeof *hist);
        for (int i = 0; i < m; i++)
            hist[((unsigned)key[a[i]] >> shift) & (RADIX - 1)]++;
        unsigned total = 0;
        for (int d = 0; d < RADIX; d++) {
            const unsigned count = hist[d];
            hist[d] = total;
            total += count;
        }
        for (int i = 0; i < m; i++)
            b[hist[((unsigned)key[a[i]] >> shift) & (RADIX - 1)]++] = a[i];
        int *sorted = b;
        b = a;
        a = sorted;
        if (((unsigned)most >> shift) < RADIX)
            break;
    }
    int groups = 0;
    for (int i = 0; i < m; i++)
        groups += i == 0 || key[a[i]] != key[a[i - 1]];
    g->groups = groups;
    g->rows = m;
    g->start = out;
    g->key = out + groups + 1;
    g->row = g->key + groups;
    int k = -1;
    for (int i = 0; i < m; i++) {
        if (i == 0 || key[a[i]] != key[a[i - 1]]) {
            k++;
            g->start[k] = i;
            g->key[k] = key[a[i]];
        }
        g->row[i] = a[i];
    }
    g->start[groups] = m;
    return 2 * (size_t)groups + 1 + (size_t)m;
}

/* The grouped adds of up to two groupings, whose arrays lie in host (ints,
 * from the start of the first grouping) and are uploaded in one copy:
 * into ctx->scratch where they fit, else into memory allocated on the
 * stream for this call. */
static cudaError_t add_grouped_rows(const cuda_ctx *x, const int *host, size_t ints,
                                    row_groups *const groups[2], float *const dst[2],
                                    const float *src, int C)
{
    if ((!groups[0] || !groups[0]->groups) && (!groups[1] || !groups[1]->groups))
        return cudaSuccess;
    const size_t bytes = ints * sizeof(int);
    const int owned = bytes > x->scratch_bytes;
    int *dev = (int *)x->scratch;
    cudaError_t rc = owned ? cudaMallocAsync((void **)&dev, bytes, x->stream) : cudaSuccess;
    if (rc != cudaSuccess)
        return rc;
    rc = cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, x->stream);
    /* the host array is freed on return: the copy must have read it */
    if (rc == cudaSuccess)
        rc = cudaStreamSynchronize(x->stream);
    const int threads = C >= GROUP_BLOCK ? GROUP_BLOCK : (C + WARP - 1) / WARP * WARP;
    const int tiles = (C + threads - 1) / threads;
    const unsigned column_blocks = tiles < 65535 ? tiles : 65535; /* gridDim.y */
    for (int i = 0; i < 2 && rc == cudaSuccess; i++) {
        const row_groups *g = groups[i];
        if (!g || !g->groups)
            continue;
        int *start = dev + (g->start - host), *key = dev + (g->key - host);
        int *row = dev + (g->row - host);
        const dim3 grid((unsigned)g->groups, column_blocks);
        LOOM_CUDA_LAUNCH(grouped_rows_add_kernel, grid, threads, 0, x->stream, dst[i], src, start,
                         key, row, C);
        rc = cudaGetLastError();
    }
    if (owned) {
        const cudaError_t freed = cudaFreeAsync(dev, x->stream);
        rc = rc == cudaSuccess ? freed : rc;
    }
    return rc;
}

/* n ints of device memory into host (pageable: the copy is done on return,
 * and the stream synchronized, so everything before it is done too). */
static cudaError_t read_ints(const cuda_ctx *x, int *host, const int *dev, int n)
{
    cudaError_t rc = cudaMemcpyAsync(host, dev, (size_t)n * sizeof(int), cudaMemcpyDeviceToHost,
                                     x->stream);
    return rc == cudaSuccess ? cudaStreamSynchronize(x->stream) : rc;
}

/* The first negative index of n, or -1. */
static int first_negative(const int *v, int n)
{
    for (int i = 0; i < n; i++)
        if (v[i] < 0)
            return i;
    return -1;
}

extern "C" cudaError_t cuda_encoder_forward(const cuda_ctx *x, float *out, const int *inp,
                                            const int *pos, const float *wte, const float *wpe,
                                            int B, int T, int C)
{
    if (B < 0 || T < 0 || C < 0 || (long long)B * T > INT_MAX)
        return cudaErrorInvalidValue;
    const int N = B * T;
    if (!N || !C)
        return cudaSuccess;
    const int vec = C % 4 == 0 && aligned16(out) && aligned16(wte) && aligned16(wpe);
    LOOM_CUDA_LAUNCH(encoder_forward_kernel, row_blocks(N), ROW_BLOCK, 0, x->stream, out, inp, pos,
                     wte, wpe, N, T, C, vec);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_encoder_backward(const cuda_ctx *x, float *dwte, float *dwpe,
                                             const float *dout, const int *inp, const int *pos,
                                             int B, int T, int C)
{
    if (B < 0 || T < 0 || C < 0 || (long long)B * T > INT_MAX)
        return cudaErrorInvalidValue;
    const int N = B * T;
    if (!N || !C)
        return cudaSuccess;
    /* tokens (N), positions (T), each row's position (N), work, two groupings */
    const size_t ints = 2 * (size_t)N + T + groups_work_ints(N) + 2 * groups_ints(N);
    int *tokens = (int *)malloc(ints * sizeof(int));
    if (!tokens)
        return cudaErrorMemoryAllocation;
    int *positions = tokens + N, *row_pos = positions + T, *work = row_pos + N;
    int *out = work + groups_work_ints(N);
    cudaError_t rc = read_ints(x, tokens, inp, N);
    if (rc == cudaSuccess && pos)
        rc = read_ints(x, positions, pos, T);
    if (rc == cudaSuccess) {
        for (int r = 0; r < N; r++)
            row_pos[r] = pos ? positions[r % T] : r % T;
        int bad = first_negative(tokens, N);
        if (bad >= 0) {
            fprintf(stderr, "compute-cuda: encoder_backward: token %d of row %d is negative; "
                            "token ids must be in [0, vocabulary)\n", tokens[bad], bad);
            rc = cudaErrorInvalidValue;
        } else if ((bad = first_negative(row_pos, N)) >= 0) {
            fprintf(stderr, "compute-cuda: encoder_backward: position %d of row %d is negative; "
                            "positions must be in [0, max_seq_len)\n", row_pos[bad], bad);
            rc = cudaErrorInvalidValue;
        }
    }
    if (rc == cudaSuccess) {
        row_groups by_token, by_position;
        size_t used = group_rows(&by_token, out, tokens, N, work);
        used += group_rows(&by_position, out + used, row_pos, N, work);
        row_groups *const groups[2] = {&by_token, &by_position};
        float *const dst[2] = {dwte, dwpe};
        rc = add_grouped_rows(x, out, used, groups, dst, dout, C);
    }
    free(tokens);
    return rc;
}

extern "C" cudaError_t cuda_embedding_rows_forward(const cuda_ctx *x, float *out, const int *tok,
                                                   int v0, int rows, const float *wte, int N,
                                                   int C)
{
    if (N < 0 || C < 0 || rows < 0)
        return cudaErrorInvalidValue;
    if (!N || !C)
        return cudaSuccess;
    const int vec = C % 4 == 0 && aligned16(out) && aligned16(wte);
    LOOM_CUDA_LAUNCH(embedding_rows_forward_kernel, row_blocks(N), ROW_BLOCK, 0, x->stream, out,
                     tok, v0, rows, wte, N, C, vec);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_embedding_rows_backward(const cuda_ctx *x, float *dwte,
                                                    const float *dout, const int *tok, int v0,
                                                    int rows, int N, int C)
{
    if (N < 0 || C < 0 || rows < 0)
        return cudaErrorInvalidValue;
    if (!N || !C || !rows)
        return cudaSuccess;
    const size_t ints = (size_t)N + groups_work_ints(N) + groups_ints(N);
    int *keys = (int *)malloc(ints * sizeof(int));
    if (!keys)
        return cudaErrorMemoryAllocation;
    int *work = keys + N, *out = work + groups_work_ints(N);
    cudaError_t rc = read_ints(x, keys, tok, N);
    if (rc == cudaSuccess) {
        for (int n = 0; n < N; n++) {
            const long long t = (long long)keys[n] - v0;
            keys[n] = t >= 0 && t < rows ? (int)t : -1; /* outside the slice: no row */
        }
        row_groups g;
        const size_t used = group_rows(&g, out, keys, N, work);
        row_groups *const groups[2] = {&g, NULL};
        float *const dst[2] = {dwte, NULL};
        rc = add_grouped_rows(x, out, used, groups, dst, dout, C);
    }
    free(keys);
    return rc;
}

extern "C" cudaError_t cuda_position_forward(const cuda_ctx *x, float *xs, const float *wpe,
                                             const int *pos, int R, int C)
{
    if (R < 0 || C < 0)
        return cudaErrorInvalidValue;
    if (!R || !C)
        return cudaSuccess;
    const int vec = C % 4 == 0 && aligned16(xs) && aligned16(wpe);
    LOOM_CUDA_LAUNCH(add_rows_kernel, row_blocks(R), ROW_BLOCK, 0, x->stream, xs, wpe, pos, R, C,
                     vec);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_position_backward(const cuda_ctx *x, float *dwpe, const float *dx,
                                              const int *pos, int R, int C)
{
    if (R < 0 || C < 0)
        return cudaErrorInvalidValue;
    if (!R || !C)
        return cudaSuccess;
    const size_t ints = (size_t)R + groups_work_ints(R) + groups_ints(R);
    int *keys = (int *)malloc(ints * sizeof(int));
    if (!keys)
        return cudaErrorMemoryAllocation;
    int *work = keys + R, *out = work + groups_work_ints(R);
    cudaError_t rc = read_ints(x, keys, pos, R);
    if (rc == cudaSuccess) {
        const int bad = first_negative(keys, R);
        if (bad >= 0) {
            fprintf(stderr, "compute-cuda: position_backward: position %d of row %d is negative; "
                            "positions must be in [0, max_seq_len)\n", keys[bad], bad);
            rc = cudaErrorInvalidValue;
        }
    }
    if (rc == cudaSuccess) {
        row_groups g;
        const size_t used = group_rows(&g, out, keys, R, work);
        row_groups *const groups[2] = {&g, NULL};
        float *const dst[2] = {dwpe, NULL};
        rc = add_grouped_rows(x, out, used, groups, dst, dx, C);
    }
    free(keys);
    return rc;
}

/* ---------------------------------------------------------------------- LayerNorm */

/* One row by one warp. In place (o == x) is safe: a chunk is read and
 * written by its own lane only. */
static __device__ inline void layernorm_row(float *o, float *mean, float *rstd, const float *x,
                                            const float *w, const float *b, int C, int lane,
                                            int vec)
{
    const float m = warp_sum(lane_sum(x, lane, C, vec)) / (float)C;
    const float s = layernorm_rstd(warp_sum(lane_squares(x, m, lane, C, vec)), C);
    lane_normalize(o, x, w, b, m, s, lane, C, vec);
    if (lane == 0) {
        *mean = m;
        *rstd = s;
    }
}

__global__ void layernorm_forward_kernel(float *out, float *mean, float *rstd, const float *inp,
                                         const float *weight, const float *bias, int N, int C,
                                         int vec)
{
    const int r = warp_row(N), lane = threadIdx.x % WARP;
    if (r < 0)
        return;
    const size_t o = (size_t)r * C;
    layernorm_row(out + o, mean + r, rstd + r, inp + o, weight, bias, C, lane, vec);
}

/* res = a + b, then LayerNorm of res as stored (f32): each lane reads back
 * only the chunks it wrote, so no barrier is needed. */
__global__ void residual_layernorm_forward_kernel(float *res, float *out, float *mean,
                                                  float *rstd, const float *a, const float *b,
                                                  const float *weight, const float *bias, int N,
                                                  int C, int vec)
{
    const int r = warp_row(N), lane = threadIdx.x % WARP;
    if (r < 0)
        return;
    const size_t o = (size_t)r * C;
    float av[4], bv[4];
    for (int j = lane; j < row_chunks(C); j += WARP) {
        const int n = load_chunk(av, a + o, j, C, vec);
        load_chunk(bv, b + o, j, C, vec);
        UNROLL
        for (int k = 0; k < 4; k++)
            av[k] += bv[k];
        store_chunk(res + o, j, n, av, vec);
    }
    layernorm_row(out + o, mean + r, rstd + r, res + o, weight, bias, C, lane, vec);
}

__global__ void layernorm_backward_input_kernel(float *dinp, const float *dout, const float *inp,
                                                const float *weight, const float *mean,
                                                const float *rstd, int N, int C, int vec)
{
    const int r = warp_row(N), lane = threadIdx.x % WARP;
    if (r < 0)
        return;
    const size_t o = (size_t)r * C;
    const float m = mean[r], s = rstd[r];
    float a, b;
    lane_backward_sums(&a, &b, dout + o, inp + o, weight, m, s, lane, C, vec);
    const float dnorm_mean = warp_sum(a) / (float)C;
    const float dnorm_norm_mean = warp_sum(b) / (float)C;
    lane_backward_input(dinp + o, dout + o, inp + o, weight, m, s, dnorm_mean, dnorm_norm_mean,
                        lane, C, vec);
}

extern "C" cudaError_t cuda_layernorm_forward(const cuda_ctx *x, float *out, float *mean,
                                              float *rstd, const float *inp, const float *weight,
                                              const float *bias, int N, int C)
{
    if (N < 0 || C < 0)
        return cudaErrorInvalidValue;
    if (!N || !C)
        return cudaSuccess;
    const int vec = C % 4 == 0 && aligned16(out) && aligned16(inp) && aligned16(weight) &&
                    aligned16(bias);
    LOOM_CUDA_LAUNCH(layernorm_forward_kernel, row_blocks(N), ROW_BLOCK, 0, x->stream, out, mean,
                     rstd, inp, weight, bias, N, C, vec);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_residual_layernorm_forward(const cuda_ctx *x, float *res, float *out,
                                                       float *mean, float *rstd, const float *a,
                                                       const float *b, const float *weight,
                                                       const float *bias, int N, int C)
{
    if (N < 0 || C < 0)
        return cudaErrorInvalidValue;
    if (!N || !C)
        return cudaSuccess;
    const int vec = C % 4 == 0 && aligned16(res) && aligned16(out) && aligned16(a) &&
                    aligned16(b) && aligned16(weight) && aligned16(bias);
    LOOM_CUDA_LAUNCH(residual_layernorm_forward_kernel, row_blocks(N), ROW_BLOCK, 0, x->stream, res,
                     out, mean, rstd, a, b, weight, bias, N, C, vec);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_layernorm_backward_input(const cuda_ctx *x, float *dinp,
                                                     const float *dout, const float *inp,
                                                     const float *weight, const float *mean,
                                                     const float *rstd, int N, int C)
{
    if (N < 0 || C < 0)
        return cudaErrorInvalidValue;
    if (!N || !C)
        return cudaSuccess;
    const int vec = C % 4 == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) &&
                    aligned16(weight);
    LOOM_CUDA_LAUNCH(layernorm_backward_input_kernel, row_blocks(N), ROW_BLOCK, 0, x->stream, dinp,
                     dout, inp, weight, mean, rstd, N, C, vec);
    return cudaGetLastError();
}

/* ------------------------------------------------------------------- column sums */

/* How a column sum over N rows is split: chunks of rows_per_chunk rows
 * (the last shorter), each block a COLUMN_TILE of columns of one chunk.
 * Enough blocks to fill the device, partial sums (arrays of chunks x C
 * floats) within scratch; direct when not even one chunk's partials fit:
 * then one chunk of all rows adds straight into the gradient. */
typedef struct column_plan {
    int chunks, rows_per_chunk, direct;
} column_plan;

static column_plan plan_columns(int N, int C, int arrays, size_t scratch_bytes, int sm_count)
{
    column_plan p;
    const long long tiles = (C + COLUMN_TILE - 1) / COLUMN_TILE;
    const long long blocks = 4LL * (sm_count > 0 ? sm_count : 32);
    const long long fit = (long long)(scratch_bytes / ((size_t)arrays * C * sizeof(float)));
    long long chunks = (blocks + tiles - 1) / tiles;
    chunks = chunks < N ? chunks : N;
    chunks = chunks < 65535 ? chunks : 65535; /* gridDim.y */
    chunks = chunks < fit ? chunks : fit;
    p.direct = chunks < 1;
    if (p.direct)
        chunks = 1;
    p.rows_per_chunk = (int)((N + chunks - 1) / chunks);
    p.chunks = (N + p.rows_per_chunk - 1) / p.rows_per_chunk;
    return p;
}

/* Block (COLUMN_TILE, COLUMN_ROW_LANES) sums columns of one chunk of rows:
 * lane (tx, ty) rows r0 + ty, r0 + ty + 8, ... of column c, then the eight
 * lanes in order. sum_b: of dout; sum_w (inp non-NULL): of dout·norm, norm
 * = (inp - mean)·rstd. Written to row `chunk` of part_b / part_w, or added
 * into them (accumulate: the gradients themselves, one chunk). */
__global__ void column_partials_kernel(float *part_b, float *part_w, const float *dout,
                                       const float *inp, const float *mean, const float *rstd,
                                       int N, int C, int rows_per_chunk, int accumulate)
{
    __shared__ float sum_b[COLUMN_ROW_LANES][COLUMN_TILE];
    __shared__ float sum_w[COLUMN_ROW_LANES][COLUMN_TILE];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int c = blockIdx.x * COLUMN_TILE + tx;
    const long long r0 = (long long)blockIdx.y * rows_per_chunk;
    const long long r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
    float sb = 0.0f, sw = 0.0f;
    if (c < C)
        for (long long r = r0 + ty; r < r1; r += COLUMN_ROW_LANES) {
            const float d = dout[(size_t)r * C + c];
            sb += d;
            if (inp)
                sw += ((inp[(size_t)r * C + c] - mean[r]) * rstd[r]) * d;
        }
    sum_b[ty][tx] = sb;
    sum_w[ty][tx] = sw;
    __syncthreads();
    if (ty != 0 || c >= C)
        return;
    float tb = sum_b[0][tx], tw = sum_w[0][tx];
    for (int k = 1; k < COLUMN_ROW_LANES; k++) {
        tb += sum_b[k][tx];
        tw += sum_w[k][tx];
    }
    const size_t at = (size_t)blockIdx.y * C + c;
    if (accumulate) {
        part_b[at] += tb;
        if (inp)
            part_w[at] += tw;
    } else {
        part_b[at] = tb;
        if (inp)
            part_w[at] = tw;
    }
}

/* dbias[c] (and dweight[c]) += the chunks' partial sums, chunk 0 first */
__global__ void column_finish_kernel(float *dbias, float *dweight, const float *part_b,
                                     const float *part_w, int chunks, int C)
{
    const long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float tb = 0.0f, tw = 0.0f;
    for (int k = 0; k < chunks; k++) {
        tb += part_b[(size_t)k * C + c];
        if (dweight)
            tw += part_w[(size_t)k * C + c];
    }
    dbias[c] += tb;
    if (dweight)
        dweight[c] += tw;
}

/* dbias += column sums of dout; with inp, dweight += column sums of
 * dout·norm too. */
static cudaError_t column_sums(const cuda_ctx *x, float *dbias, float *dweight, const float *dout,
                               const float *inp, const float *mean, const float *rstd, int N,
                               int C)
{
    const int arrays = inp ? 2 : 1;
    const column_plan p = plan_columns(N, C, arrays, x->scratch_bytes, x->sm_count);
    const dim3 block(COLUMN_TILE, COLUMN_ROW_LANES);
    const dim3 grid((unsigned)((C + COLUMN_TILE - 1) / COLUMN_TILE), (unsigned)p.chunks);
    if (p.direct) {
        LOOM_CUDA_LAUNCH(column_partials_kernel, grid, block, 0, x->stream, dbias, dweight, dout,
                         inp, mean, rstd, N, C, p.rows_per_chunk, 1);
        return cudaGetLastError();
    }
    float *part_b = (float *)x->scratch;
    float *part_w = inp ? part_b + (size_t)p.chunks * C : NULL;
    LOOM_CUDA_LAUNCH(column_partials_kernel, grid, block, 0, x->stream, part_b, part_w, dout, inp,
                     mean, rstd, N, C, p.rows_per_chunk, 0);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess)
        return rc;
    const unsigned blocks = (unsigned)((C + ELEMENT_BLOCK - 1) / ELEMENT_BLOCK);
    LOOM_CUDA_LAUNCH(column_finish_kernel, blocks, ELEMENT_BLOCK, 0, x->stream, dbias,
                     inp ? dweight : NULL, part_b, part_w, p.chunks, C);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_layernorm_backward_weight(const cuda_ctx *x, float *dweight,
                                                      float *dbias, const float *dout,
                                                      const float *inp, const float *mean,
                                                      const float *rstd, int N, int C)
{
    if (N < 0 || C < 0)
        return cudaErrorInvalidValue;
    if (!N || !C)
        return cudaSuccess;
    return column_sums(x, dbias, dweight, dout, inp, mean, rstd, N, C);
}

extern "C" cudaError_t cuda_bias_backward(const cuda_ctx *x, float *dbias, const float *dout,
                                          int rows, int C)
{
    if (rows < 0 || C < 0)
        return cudaErrorInvalidValue;
    if (!rows || !C)
        return cudaSuccess;
    return column_sums(x, dbias, NULL, dout, NULL, NULL, NULL, rows, C);
}

/* --------------------------------------------------------- residual, bias, GELU */

/* Grid-stride over n elements; float4 where every pointer is 16-byte
 * aligned, the last n % 4 elements one by one. */
__global__ void residual_forward_kernel(float *out, const float *a, const float *b, size_t n,
                                        int vec)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t done = 0;
    if (vec) {
        const float4 *a4 = reinterpret_cast<const float4 *>(a);
        const float4 *b4 = reinterpret_cast<const float4 *>(b);
        float4 *o4 = reinterpret_cast<float4 *>(out);
        for (size_t i = first; i < n / 4; i += stride) {
            const float4 p = a4[i], q = b4[i];
            o4[i] = make_float4(p.x + q.x, p.y + q.y, p.z + q.z, p.w + q.w);
        }
        done = n / 4 * 4;
    }
    for (size_t i = done + first; i < n; i += stride)
        out[i] = a[i] + b[i];
}

extern "C" cudaError_t cuda_residual_forward(const cuda_ctx *x, float *out, const float *a,
                                             const float *b, size_t n)
{
    if (!n)
        return cudaSuccess;
    const int vec = aligned16(out) && aligned16(a) && aligned16(b);
    LOOM_CUDA_LAUNCH(residual_forward_kernel, element_blocks(x, vec ? n / 4 : n), ELEMENT_BLOCK, 0,
                     x->stream, out, a, b, n, vec);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_bias_forward(const cuda_ctx *x, float *xs, const float *bias, int rows,
                                         int C)
{
    if (rows < 0 || C < 0)
        return cudaErrorInvalidValue;
    if (!rows || !C)
        return cudaSuccess;
    const int vec = C % 4 == 0 && aligned16(xs) && aligned16(bias);
    LOOM_CUDA_LAUNCH(add_rows_kernel, row_blocks(rows), ROW_BLOCK, 0, x->stream, xs, bias, NULL,
                     rows, C, vec);
    return cudaGetLastError();
}

/* pre += bias, then out = gelu(pre), per row */
__global__ void bias_gelu_forward_kernel(float *out, float *pre, const float *bias, int N, int C,
                                         int vec)
{
    const int r = warp_row(N), lane = threadIdx.x % WARP;
    if (r < 0)
        return;
    float *p = pre + (size_t)r * C, *o = out + (size_t)r * C;
    if (vec) {
        const float4 *b4 = reinterpret_cast<const float4 *>(bias);
        float4 *p4 = reinterpret_cast<float4 *>(p), *o4 = reinterpret_cast<float4 *>(o);
        for (int j = lane; j < C / 4; j += WARP) {
            const float4 v = p4[j], b = b4[j];
            const float4 s = make_float4(v.x + b.x, v.y + b.y, v.z + b.z, v.w + b.w);
            p4[j] = s;
            o4[j] = make_float4(gelu_value(s.x), gelu_value(s.y), gelu_value(s.z),
                                gelu_value(s.w));
        }
    } else {
        for (int c = lane; c < C; c += WARP) {
            const float s = p[c] + bias[c];
            p[c] = s;
            o[c] = gelu_value(s);
        }
    }
}

extern "C" cudaError_t cuda_bias_gelu_forward(const cuda_ctx *x, float *out, float *pre,
                                              const float *bias, int N, int C)
{
    if (N < 0 || C < 0)
        return cudaErrorInvalidValue;
    if (!N || !C)
        return cudaSuccess;
    const int vec = C % 4 == 0 && aligned16(out) && aligned16(pre) && aligned16(bias);
    LOOM_CUDA_LAUNCH(bias_gelu_forward_kernel, row_blocks(N), ROW_BLOCK, 0, x->stream, out, pre,
                     bias, N, C, vec);
    return cudaGetLastError();
}

/* dinp += gelu'(inp)·dout, as the cpu backend: it accumulates */
__global__ void gelu_backward_kernel(float *dinp, const float *inp, const float *dout, size_t n,
                                     int vec)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t done = 0;
    if (vec) {
        const float4 *x4 = reinterpret_cast<const float4 *>(inp);
        const float4 *d4 = reinterpret_cast<const float4 *>(dout);
        float4 *g4 = reinterpret_cast<float4 *>(dinp);
        for (size_t i = first; i < n / 4; i += stride) {
            const float4 v = x4[i], d = d4[i];
            float4 g = g4[i];
            g.x += gelu_derivative(v.x) * d.x;
            g.y += gelu_derivative(v.y) * d.y;
            g.z += gelu_derivative(v.z) * d.z;
            g.w += gelu_derivative(v.w) * d.w;
            g4[i] = g;
        }
        done = n / 4 * 4;
    }
    for (size_t i = done + first; i < n; i += stride)
        dinp[i] += gelu_derivative(inp[i]) * dout[i];
}

extern "C" cudaError_t cuda_gelu_backward(const cuda_ctx *x, float *dinp, const float *inp,
                                          const float *dout, size_t n)
{
    if (!n)
        return cudaSuccess;
    const int vec = aligned16(dinp) && aligned16(inp) && aligned16(dout);
    LOOM_CUDA_LAUNCH(gelu_backward_kernel, element_blocks(x, vec ? n / 4 : n), ELEMENT_BLOCK, 0,
                     x->stream, dinp, inp, dout, n, vec);
    return cudaGetLastError();
}
