/* compute-cuda's attention: flash-style forward and backward over blocks of
 * keys (loom/compute.h's attention_forward and attention_backward), with
 * the semantics of the cpu backend's kernels (core/model/kernels.c).
 *
 * Per (batch, head), query i at position q_pos[i] sees key j when k_pos[j]
 * <= q_pos[i]; no (tq, tk) matrix exists. q, k, v, out and the gradients
 * are (B, rows, NH, HS) of f32, bf16 or f16; everything is computed in f32
 * and each written element is rounded once. lse is (B, NH, tq) f32.
 *
 * Every kernel runs 256 threads as a 16 x 16 grid (ty, tx). A tile of
 * ROWS rows of a head is staged in shared memory as f32, HSM wide (HS
 * rounded up to 32, 64, 128 or 256, zero-padded: the padding adds 0 to
 * every dot product and is never stored). A thread owns rows ty + 16a of
 * the block's rows and columns tx + 16b of the tile it multiplies against,
 * so the 16 threads sharing a row are 16 lanes of one warp and reduce a
 * row with four shuffles.
 *
 *   forward: a block per (b, h, tile of BQ queries); key tiles of BK keys
 *     in turn, the online softmax's max and sum per row in registers, out
 *     accumulated in registers and merged into out and lse at the end.
 *   backward, no atomics, a fixed order everywhere: D = dout·out per
 *     query into ctx->scratch; dQ with a block per query tile looping over
 *     key tiles; dK and dV with a block per key tile looping over query
 *     tiles. Both recompute P = exp(s - lse) from the final lse.
 *
 * A tile no query of the block can see (all its keys past the block's
 * last position, or all its queries before the block's first) is skipped
 * as a whole: the causal half costs nothing but the positions' read.
 *
 * The products are scalar FP32 FMAs (no tensor cores yet). */
#include <climits>
#include <cstddef>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention_math.cuh"
#include "cuda_kernels.h"
#include "launch.cuh"

namespace {

constexpr int THREADS = 256; /* 16 x 16 */

/* A block's dynamic shared memory, and a launch. A host emulation of the
 * kernels (tests/compute/cuda_attention_emulation.cpp, threads and
 * barriers on the CPU) defines both to its own. */
#ifndef ATTN_SHARED_MEMORY
#define ATTN_SHARED_MEMORY(name) extern __shared__ __align__(16) float name[]
#endif
#ifndef ATTN_LAUNCH
#define ATTN_LAUNCH(kernel, blocks, smem, stream, ...)                                           \
    LOOM_CUDA_LAUNCH(kernel, (blocks), THREADS, (smem), (stream), __VA_ARGS__)
#endif

/* ---- storage types ---- */

__device__ __forceinline__ float load_f32(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float load_f32(const __nv_bfloat16 *p, size_t i)
{
    return __bfloat162float(p[i]);
}
__device__ __forceinline__ float load_f32(const __half *p, size_t i) { return __half2float(p[i]); }

__device__ __forceinline__ void store_f32(float *p, size_t i, float x) { p[i] = x; }
__device__ __forceinline__ void store_f32(__nv_bfloat16 *p, size_t i, float x)
{
    p[i] = __float2bfloat16_rn(x);
}
__device__ __forceinline__ void store_f32(__half *p, size_t i, float x)
{
    p[i] = __float2half_rn(x);
}

/* ---- one call's arguments, shared by the kernels ---- */

struct attn_params {
    const void *q, *k, *v;    /* (B, tq or tk, NH, HS) */
    const int *q_pos, *k_pos; /* NULL: 0, 1, 2, ... */
    int tq, tk;
    int heads; /* B * NH of this launch */
    int NH, HS;
    float scale;
    void *out;  /* forward: merged into */
    float *lse; /* (B, NH, tq): forward: merged into */
    int first_block;
    const void *saved_out;  /* backward: the forward's final out and lse */
    const float *saved_lse;
    const void *dout;
    float *delta; /* backward: D per (b, h, query), (B, NH, tq) */
    void *dq, *dk, *dv;
};

__device__ __forceinline__ int position(const int *pos, int i) { return pos ? pos[i] : i; }

/* Tile sizes for heads up to HSM wide: BQ query rows and BK key rows,
 * smaller for wide heads so the staged tiles fit in shared memory.
 * A staged tile's row stride is LDA or LDB by the side of a dot product it
 * is on: an A tile (rows ty + 16a) is read four dims at a time, as float4,
 * 2 addresses a warp; a B tile (rows tx + 16b) a dim at a time down 16
 * rows, which an odd stride puts in 16 different banks. */
template <int HSM>
struct attn_tiles {
    static_assert(HSM == 32 || HSM == 64 || HSM == 128 || HSM == 256, "head widths");
    static constexpr int BQ = HSM >= 256 ? 32 : 64;
    static constexpr int BK = HSM >= 128 ? 32 : 64;
    static constexpr int LDA = HSM + 4, LDB = HSM + 1;
    static constexpr int RQ = BQ / 16, RK = BK / 16, RD = HSM / 16;
};

/* The shared memory of each kernel, in floats (positions are ints, of the
 * same size), every float4-read array at a multiple of 4. */
template <int HSM>
struct forward_layout {
    using L = attn_tiles<HSM>;
    static constexpr int LDP = L::BK + 16; /* P, (BQ, BK): the 16 lanes of a row in 16 banks */
    static constexpr int QS = 0, KS = QS + L::BQ * L::LDA, VS = KS + L::BK * L::LDB;
    static constexpr int PS = VS + L::BK * L::LDA, QPOS = PS + L::BQ * LDP, KPOS = QPOS + L::BQ;
    static constexpr size_t bytes = (size_t)(KPOS + L::BK) * sizeof(float);
    static_assert(QS % 4 == 0 && PS % 4 == 0 && LDP % 4 == 0, "float4 reads");
};

template <int HSM>
struct backward_q_layout {
    using L = attn_tiles<HSM>;
    static constexpr int LDP = L::BK + 16; /* dS, (BQ, BK) */
    static constexpr int QS = 0, DOS = QS + L::BQ * L::LDA, KS = DOS + L::BQ * L::LDA;
    static constexpr int VS = KS + L::BK * L::LDB, DSS = VS + L::BK * L::LDB;
    static constexpr int QPOS = DSS + L::BQ * LDP, KPOS = QPOS + L::BQ;
    static constexpr size_t bytes = (size_t)(KPOS + L::BK) * sizeof(float);
    static_assert(QS % 4 == 0 && DOS % 4 == 0 && DSS % 4 == 0 && LDP % 4 == 0, "float4 reads");
};

template <int HSM>
struct backward_kv_layout {
    using L = attn_tiles<HSM>;
    static constexpr int LDP = L::BQ + 16; /* P and dS transposed, (BK, BQ) */
    static constexpr int KS = 0, VS = KS + L::BK * L::LDA, QS = VS + L::BK * L::LDA;
    static constexpr int DOS = QS + L::BQ * L::LDB, PS = DOS + L::BQ * L::LDB;
    static constexpr int DSS = PS + L::BK * LDP, LSE = DSS + L::BK * LDP, DELTA = LSE + L::BQ;
    static constexpr int KPOS = DELTA + L::BQ, QPOS = KPOS + L::BK;
    static constexpr size_t bytes = (size_t)(QPOS + L::BQ) * sizeof(float);
    static_assert(KS % 4 == 0 && VS % 4 == 0 && PS % 4 == 0 && DSS % 4 == 0 && LDP % 4 == 0,
                  "float4 reads");
};

/* Rows [0, rows) of a head (row r at src + r * stride, HS elements) into
 * a (ROWS, HSM) f32 tile of stride LD, zero past rows and past HS. */
template <typename T, int ROWS, int HSM, int LD>
__device__ void stage_rows(float *tile, const T *src, int rows, size_t stride, int HS)
{
    for (int e = threadIdx.x; e < ROWS * HSM; e += THREADS) {
        const int r = e / HSM, d = e % HSM;
        tile[r * LD + d] = r < rows && d < HS ? load_f32(src, (size_t)r * stride + d) : 0.0f;
    }
}

__device__ __forceinline__ float lane4(const float4 &x, int i)
{
    return i == 0 ? x.x : i == 1 ? x.y : i == 2 ? x.z : x.w;
}

/* acc[a][b] = Σ_d A[ty + 16a][d]·B[tx + 16b][d] over an A tile of stride
 * LDA and a B tile of stride LDB */
template <int RA, int RB, int HSM, int LDA, int LDB>
__device__ __forceinline__ void tile_dot(float (&acc)[RA][RB], const float *A, const float *B)
{
    static_assert(LDA % 4 == 0 && HSM % 4 == 0, "A is read as float4");
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int a = 0; a < RA; a++)
#pragma unroll
        for (int b = 0; b < RB; b++)
            acc[a][b] = 0.0f;
#pragma unroll 2
    for (int d0 = 0; d0 < HSM; d0 += 4) {
        float4 av[RA];
#pragma unroll
        for (int a = 0; a < RA; a++)
            av[a] = *(const float4 *)&A[(ty + 16 * a) * LDA + d0];
#pragma unroll
        for (int dd = 0; dd < 4; dd++) {
            float bv[RB];
#pragma unroll
            for (int b = 0; b < RB; b++)
                bv[b] = B[(tx + 16 * b) * LDB + d0 + dd];
#pragma unroll
            for (int a = 0; a < RA; a++)
#pragma unroll
                for (int b = 0; b < RB; b++)
                    acc[a][b] = fmaf(lane4(av[a], dd), bv[b], acc[a][b]);
        }
    }
}

/* acc[a][c] += Σ_j P[ty + 16a][j]·V[j][tx + 16c], j < NJ: a (rows, NJ)
 * tile of stride LDP, read as float4, times a staged (NJ, HSM) tile of
 * stride LDV */
template <int RA, int RD, int NJ, int LDP, int LDV>
__device__ __forceinline__ void tile_mul_acc(float (&acc)[RA][RD], const float *P,
                                             const float *V)
{
    static_assert(LDP % 4 == 0 && NJ % 4 == 0, "P is read as float4");
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll 2
    for (int j0 = 0; j0 < NJ; j0 += 4) {
        float4 pv[RA];
#pragma unroll
        for (int a = 0; a < RA; a++)
            pv[a] = *(const float4 *)&P[(ty + 16 * a) * LDP + j0];
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            float vv[RD];
#pragma unroll
            for (int c = 0; c < RD; c++)
                vv[c] = V[(j0 + jj) * LDV + tx + 16 * c];
#pragma unroll
            for (int a = 0; a < RA; a++)
#pragma unroll
                for (int c = 0; c < RD; c++)
                    acc[a][c] = fmaf(lane4(pv[a], jj), vv[c], acc[a][c]);
        }
    }
}

/* Over the 16 lanes sharing a row (tx = lane % 16; every lane of the warp
 * takes part). The butterfly leaves the same bits in all 16. */
__device__ __forceinline__ float row_max16(float x)
{
#pragma unroll
    for (int off = 8; off > 0; off /= 2)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    return x;
}

__device__ __forceinline__ float row_sum16(float x)
{
#pragma unroll
    for (int off = 8; off > 0; off /= 2)
        x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

/* ---- forward ---- */

/* A block per (b, h, query tile), the last tiles first (with ordered
 * positions they see the most keys). */
template <typename T, int HSM>
__global__ void __launch_bounds__(THREADS, 2) attention_forward_kernel(attn_params p)
{
    using L = attn_tiles<HSM>;
    using M = forward_layout<HSM>;
    constexpr int BQ = L::BQ, BK = L::BK, LDA = L::LDA, LDB = L::LDB, LDP = M::LDP;
    constexpr int RQ = L::RQ, RK = L::RK, RD = L::RD;
    ATTN_SHARED_MEMORY(smem);
    float *qs = smem + M::QS, *ks = smem + M::KS, *vs = smem + M::VS, *ps = smem + M::PS;
    int *qpos = (int *)(smem + M::QPOS), *kpos = (int *)(smem + M::KPOS);

    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    const int q_tiles = (p.tq + BQ - 1) / BQ;
    const int bh = blockIdx.x % p.heads, b = bh / p.NH, h = bh % p.NH;
    const int i0 = (q_tiles - 1 - (int)(blockIdx.x / p.heads)) * BQ;
    const int nq = min(BQ, p.tq - i0);
    const size_t C = (size_t)p.NH * p.HS;
    const T *q = (const T *)p.q + ((size_t)b * p.tq + i0) * C + (size_t)h * p.HS;
    const T *k = (const T *)p.k + (size_t)b * p.tk * C + (size_t)h * p.HS;
    const T *v = (const T *)p.v + (size_t)b * p.tk * C + (size_t)h * p.HS;
    T *out = (T *)p.out + ((size_t)b * p.tq + i0) * C + (size_t)h * p.HS;
    float *lse = p.lse + (size_t)bh * p.tq + i0;

    stage_rows<T, BQ, HSM, LDA>(qs, q, nq, C, p.HS);
    if (tid < BQ)
        qpos[tid] = tid < nq ? position(p.q_pos, i0 + tid) : 0;
    __syncthreads();
    int qmax = INT_MIN;
    for (int r = 0; r < nq; r++)
        qmax = max(qmax, qpos[r]);

    bool row_ok[RQ];
    int qp[RQ];
    float old_lse[RQ], m[RQ], l[RQ], acc[RQ][RD];
#pragma unroll
    for (int a = 0; a < RQ; a++) {
        const int r = ty + 16 * a;
        row_ok[a] = r < nq;
        qp[a] = qpos[r];
        /* read before the barrier that precedes any write of lse */
        old_lse[a] = row_ok[a] && !p.first_block ? lse[r] : -INFINITY;
        m[a] = -INFINITY;
        l[a] = 0.0f;
#pragma unroll
        for (int c = 0; c < RD; c++)
            acc[a][c] = 0.0f;
    }

    for (int j0 = 0; j0 < p.tk; j0 += BK) {
        const int nk = min(BK, p.tk - j0);
        bool seen = false;
        if (tid < BK) {
            kpos[tid] = tid < nk ? position(p.k_pos, j0 + tid) : 0;
            seen = tid < nk && attn_visible(kpos[tid], qmax);
        }
        if (!__syncthreads_or(seen))
            continue; /* no query of the tile sees a key of this one */
        stage_rows<T, BK, HSM, LDB>(ks, k + (size_t)j0 * C, nk, C, p.HS);
        stage_rows<T, BK, HSM, LDA>(vs, v + (size_t)j0 * C, nk, C, p.HS);
        __syncthreads();

        float s[RQ][RK];
        tile_dot<RQ, RK, HSM, LDA, LDB>(s, qs, ks);
#pragma unroll
        for (int a = 0; a < RQ; a++) {
            bool vis[RK];
            float tile_max = -INFINITY;
#pragma unroll
            for (int c = 0; c < RK; c++) {
                const int j = tx + 16 * c;
                vis[c] = row_ok[a] && j < nk && attn_visible(kpos[j], qp[a]);
                s[a][c] *= p.scale;
                if (vis[c])
                    tile_max = fmaxf(tile_max, s[a][c]);
            }
            const float m_new = fmaxf(m[a], row_max16(tile_max));
            const float alpha = attn_rescale(m[a], m_new);
            float sum = 0.0f;
#pragma unroll
            for (int c = 0; c < RK; c++) {
                const float w = vis[c] ? attn_weight(s[a][c], m_new) : 0.0f;
                ps[(ty + 16 * a) * LDP + tx + 16 * c] = w;
                sum += w;
            }
            l[a] = l[a] * alpha + row_sum16(sum);
            m[a] = m_new;
#pragma unroll
            for (int c = 0; c < RD; c++)
                acc[a][c] *= alpha;
        }
        __syncthreads();
        tile_mul_acc<RQ, RD, BK, LDP, LDA>(acc, ps, vs);
    }
    __syncthreads(); /* every lane has read its rows' old lse (also when tk is 0) */

#pragma unroll
    for (int a = 0; a < RQ; a++) {
        const int r = ty + 16 * a;
        if (!row_ok[a] || (!p.first_block && !(l[a] > 0.0f)))
            continue; /* merging a block the row sees nothing of: out and lse stay */
        const attn_merge_weights w = attn_merge(old_lse[a], m[a], l[a]);
        const bool read_old = old_lse[a] != -INFINITY;
#pragma unroll
        for (int c = 0; c < RD; c++) {
            const int d = tx + 16 * c;
            if (d >= p.HS)
                continue;
            const size_t at = (size_t)r * C + d;
            float o = w.new_scale * acc[a][c];
            if (read_old)
                o = fmaf(w.old_scale, load_f32(out, at), o);
            store_f32(out, at, o);
        }
        if (tx == 0)
            lse[r] = w.lse;
    }
}

/* ---- backward ---- */

/* D[b, h, i] = Σ_d dout·out of row (b, i, h): a warp per row, rows in
 * memory order. */
template <typename T>
__global__ void __launch_bounds__(THREADS) attention_delta_kernel(attn_params p, size_t rows)
{
    const size_t r = (size_t)blockIdx.x * (THREADS / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (r >= rows)
        return; /* the whole warp: the shuffles below see full warps only */
    const T *o = (const T *)p.saved_out + r * p.HS, *g = (const T *)p.dout + r * p.HS;
    float sum = 0.0f;
    for (int d = lane; d < p.HS; d += 32)
        sum = fmaf(load_f32(g, d), load_f32(o, d), sum);
#pragma unroll
    for (int off = 16; off > 0; off /= 2)
        sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) {
        const size_t per_batch = (size_t)p.tq * p.NH;
        const size_t b = r / per_batch, i = r % per_batch / p.NH, h = r % p.NH;
        p.delta[(b * p.NH + h) * p.tq + i] = sum;
    }
}

/* dq += scale·dS·K: a block per (b, h, query tile), the last first. */
template <typename T, int HSM>
__global__ void __launch_bounds__(THREADS, 2) attention_backward_q_kernel(attn_params p)
{
    using L = attn_tiles<HSM>;
    using M = backward_q_layout<HSM>;
    constexpr int BQ = L::BQ, BK = L::BK, LDA = L::LDA, LDB = L::LDB, LDP = M::LDP;
    constexpr int RQ = L::RQ, RK = L::RK, RD = L::RD;
    ATTN_SHARED_MEMORY(smem);
    float *qs = smem + M::QS, *dos = smem + M::DOS, *ks = smem + M::KS, *vs = smem + M::VS;
    float *dss = smem + M::DSS;
    int *qpos = (int *)(smem + M::QPOS), *kpos = (int *)(smem + M::KPOS);

    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    const int q_tiles = (p.tq + BQ - 1) / BQ;
    const int bh = blockIdx.x % p.heads, b = bh / p.NH, h = bh % p.NH;
    const int i0 = (q_tiles - 1 - (int)(blockIdx.x / p.heads)) * BQ;
    const int nq = min(BQ, p.tq - i0);
    const size_t C = (size_t)p.NH * p.HS;
    const size_t q_head = ((size_t)b * p.tq + i0) * C + (size_t)h * p.HS;
    const T *k = (const T *)p.k + (size_t)b * p.tk * C + (size_t)h * p.HS;
    const T *v = (const T *)p.v + (size_t)b * p.tk * C + (size_t)h * p.HS;
    T *dq = (T *)p.dq + q_head;

    stage_rows<T, BQ, HSM, LDA>(qs, (const T *)p.q + q_head, nq, C, p.HS);
    stage_rows<T, BQ, HSM, LDA>(dos, (const T *)p.dout + q_head, nq, C, p.HS);
    if (tid < BQ)
        qpos[tid] = tid < nq ? position(p.q_pos, i0 + tid) : 0;
    __syncthreads();
    int qmax = INT_MIN;
    for (int r = 0; r < nq; r++)
        qmax = max(qmax, qpos[r]);

    bool row_ok[RQ];
    int qp[RQ];
    float row_lse[RQ], row_delta[RQ], acc[RQ][RD];
#pragma unroll
    for (int a = 0; a < RQ; a++) {
        const int r = ty + 16 * a;
        row_ok[a] = r < nq;
        qp[a] = qpos[r];
        row_lse[a] = row_ok[a] ? p.saved_lse[(size_t)bh * p.tq + i0 + r] : -INFINITY;
        row_delta[a] = row_ok[a] ? p.delta[(size_t)bh * p.tq + i0 + r] : 0.0f;
#pragma unroll
        for (int c = 0; c < RD; c++)
            acc[a][c] = 0.0f;
    }

    for (int j0 = 0; j0 < p.tk; j0 += BK) {
        const int nk = min(BK, p.tk - j0);
        bool seen = false;
        if (tid < BK) {
            kpos[tid] = tid < nk ? position(p.k_pos, j0 + tid) : 0;
            seen = tid < nk && attn_visible(kpos[tid], qmax);
        }
        if (!__syncthreads_or(seen))
            continue;
        stage_rows<T, BK, HSM, LDB>(ks, k + (size_t)j0 * C, nk, C, p.HS);
        stage_rows<T, BK, HSM, LDB>(vs, v + (size_t)j0 * C, nk, C, p.HS);
        __syncthreads();

        float s[RQ][RK], dp[RQ][RK];
        tile_dot<RQ, RK, HSM, LDA, LDB>(s, qs, ks);
        tile_dot<RQ, RK, HSM, LDA, LDB>(dp, dos, vs);
#pragma unroll
        for (int a = 0; a < RQ; a++)
#pragma unroll
            for (int c = 0; c < RK; c++) {
                const int j = tx + 16 * c;
                const bool vis = row_ok[a] && j < nk && attn_visible(kpos[j], qp[a]);
                const float pr = vis ? attn_probability(p.scale * s[a][c], row_lse[a]) : 0.0f;
                dss[(ty + 16 * a) * LDP + j] = attn_score_grad(pr, dp[a][c], row_delta[a]);
            }
        __syncthreads();
        tile_mul_acc<RQ, RD, BK, LDP, LDB>(acc, dss, ks);
    }

#pragma unroll
    for (int a = 0; a < RQ; a++) {
        if (!row_ok[a])
            continue;
        const int r = ty + 16 * a;
#pragma unroll
        for (int c = 0; c < RD; c++) {
            const int d = tx + 16 * c;
            if (d >= p.HS)
                continue;
            const size_t at = (size_t)r * C + d;
            store_f32(dq, at, fmaf(p.scale, acc[a][c], load_f32(dq, at)));
        }
    }
}

/* dk += scale·dSᵀ·Q and dv += Pᵀ·dO: a block per (b, h, key tile), the
 * first first; a thread owns key rows ty + 16a and, in the products,
 * query columns tx + 16b. */
template <typename T, int HSM>
__global__ void __launch_bounds__(THREADS, 2) attention_backward_kv_kernel(attn_params p)
{
    using L = attn_tiles<HSM>;
    using M = backward_kv_layout<HSM>;
    constexpr int BQ = L::BQ, BK = L::BK, LDA = L::LDA, LDB = L::LDB, LDP = M::LDP;
    constexpr int RQ = L::RQ, RK = L::RK, RD = L::RD;
    ATTN_SHARED_MEMORY(smem);
    float *ks = smem + M::KS, *vs = smem + M::VS, *qs = smem + M::QS, *dos = smem + M::DOS;
    float *ps = smem + M::PS, *dss = smem + M::DSS, *lse_s = smem + M::LSE;
    float *delta_s = smem + M::DELTA;
    int *kpos = (int *)(smem + M::KPOS), *qpos = (int *)(smem + M::QPOS);

    const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
    const int bh = blockIdx.x % p.heads, b = bh / p.NH, h = bh % p.NH;
    const int j0 = (int)(blockIdx.x / p.heads) * BK;
    const int nk = min(BK, p.tk - j0);
    const size_t C = (size_t)p.NH * p.HS;
    const size_t k_head = ((size_t)b * p.tk + j0) * C + (size_t)h * p.HS;
    const T *q = (const T *)p.q + (size_t)b * p.tq * C + (size_t)h * p.HS;
    const T *dout = (const T *)p.dout + (size_t)b * p.tq * C + (size_t)h * p.HS;
    const float *lse = p.saved_lse + (size_t)bh * p.tq, *delta = p.delta + (size_t)bh * p.tq;
    T *dk = (T *)p.dk + k_head, *dv = (T *)p.dv + k_head;

    stage_rows<T, BK, HSM, LDA>(ks, (const T *)p.k + k_head, nk, C, p.HS);
    stage_rows<T, BK, HSM, LDA>(vs, (const T *)p.v + k_head, nk, C, p.HS);
    if (tid < BK)
        kpos[tid] = tid < nk ? position(p.k_pos, j0 + tid) : 0;
    __syncthreads();
    int kmin = INT_MAX;
    for (int r = 0; r < nk; r++)
        kmin = min(kmin, kpos[r]);

    bool key_ok[RK];
    int kp[RK];
    float dk_acc[RK][RD], dv_acc[RK][RD];
#pragma unroll
    for (int a = 0; a < RK; a++) {
        key_ok[a] = ty + 16 * a < nk;
        kp[a] = kpos[ty + 16 * a];
#pragma unroll
        for (int c = 0; c < RD; c++) {
            dk_acc[a][c] = 0.0f;
            dv_acc[a][c] = 0.0f;
        }
    }

    for (int i0 = 0; i0 < p.tq; i0 += BQ) {
        const int nq = min(BQ, p.tq - i0);
        bool seen = false;
        if (tid < BQ) {
            const bool ok = tid < nq;
            qpos[tid] = ok ? position(p.q_pos, i0 + tid) : 0;
            lse_s[tid] = ok ? lse[i0 + tid] : -INFINITY;
            delta_s[tid] = ok ? delta[i0 + tid] : 0.0f;
            seen = ok && attn_visible(kmin, qpos[tid]);
        }
        if (!__syncthreads_or(seen))
            continue; /* no query of this tile sees a key of the block */
        stage_rows<T, BQ, HSM, LDB>(qs, q + (size_t)i0 * C, nq, C, p.HS);
        stage_rows<T, BQ, HSM, LDB>(dos, dout + (size_t)i0 * C, nq, C, p.HS);
        __syncthreads();

        float s[RK][RQ], dp[RK][RQ];
        tile_dot<RK, RQ, HSM, LDA, LDB>(s, ks, qs);
        tile_dot<RK, RQ, HSM, LDA, LDB>(dp, vs, dos);
#pragma unroll
        for (int a = 0; a < RK; a++)
#pragma unroll
            for (int c = 0; c < RQ; c++) {
                const int i = tx + 16 * c;
                const bool vis = key_ok[a] && i < nq && attn_visible(kp[a], qpos[i]);
                const float pr = vis ? attn_probability(p.scale * s[a][c], lse_s[i]) : 0.0f;
                ps[(ty + 16 * a) * LDP + i] = pr;
                dss[(ty + 16 * a) * LDP + i] = attn_score_grad(pr, dp[a][c], delta_s[i]);
            }
        __syncthreads();
        tile_mul_acc<RK, RD, BQ, LDP, LDB>(dv_acc, ps, dos);
        tile_mul_acc<RK, RD, BQ, LDP, LDB>(dk_acc, dss, qs);
    }

#pragma unroll
    for (int a = 0; a < RK; a++) {
        if (!key_ok[a])
            continue;
        const int r = ty + 16 * a;
#pragma unroll
        for (int c = 0; c < RD; c++) {
            const int d = tx + 16 * c;
            if (d >= p.HS)
                continue;
            const size_t at = (size_t)r * C + d;
            store_f32(dk, at, fmaf(p.scale, dk_acc[a][c], load_f32(dk, at)));
            store_f32(dv, at, load_f32(dv, at) + dv_acc[a][c]);
        }
    }
}

/* ---- launchers ---- */

typedef void (*attn_kernel)(attn_params);

/* blocks of THREADS with smem bytes of dynamic shared memory (above the
 * default 48 KiB: opted in per launch, which is idempotent and per device) */
static cudaError_t launch(attn_kernel kernel, size_t blocks, size_t smem, const cuda_ctx *x,
                          const attn_params &p)
{
    if (blocks == 0)
        return cudaSuccess;
    if (blocks > (size_t)INT_MAX)
        return cudaErrorInvalidValue;
    cudaError_t e = cudaFuncSetAttribute((const void *)kernel,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* returned here: not left for the next launcher */
        return e;
    }
    ATTN_LAUNCH(kernel, (unsigned)blocks, smem, x->stream, p);
    return cudaGetLastError();
}

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

template <int HSM>
static cudaError_t forward_width(const cuda_ctx *x, const attn_params &p, cuda_dtype dtype)
{
    const size_t blocks = ceil_div((size_t)p.tq, attn_tiles<HSM>::BQ) * (size_t)p.heads;
    const size_t smem = forward_layout<HSM>::bytes;
    switch (dtype) {
    case CUDA_DTYPE_F32:
        return launch(attention_forward_kernel<float, HSM>, blocks, smem, x, p);
    case CUDA_DTYPE_BF16:
        return launch(attention_forward_kernel<__nv_bfloat16, HSM>, blocks, smem, x, p);
    case CUDA_DTYPE_F16:
        return launch(attention_forward_kernel<__half, HSM>, blocks, smem, x, p);
    }
    return cudaErrorInvalidValue;
}

template <typename T>
static cudaError_t delta_rows(const cuda_ctx *x, const attn_params &p, size_t rows)
{
    const size_t blocks = ceil_div(rows, THREADS / 32);
    if (blocks > (size_t)INT_MAX)
        return cudaErrorInvalidValue;
    ATTN_LAUNCH(attention_delta_kernel<T>, (unsigned)blocks, 0, x->stream, p, rows);
    return cudaGetLastError();
}

template <int HSM, typename T>
static cudaError_t backward_typed(const cuda_ctx *x, const attn_params &p)
{
    using L = attn_tiles<HSM>;
    cudaError_t e = delta_rows<T>(x, p, (size_t)p.heads * p.tq);
    if (e != cudaSuccess)
        return e;
    e = launch(attention_backward_q_kernel<T, HSM>, ceil_div((size_t)p.tq, L::BQ) * p.heads,
               backward_q_layout<HSM>::bytes, x, p);
    if (e != cudaSuccess)
        return e;
    return launch(attention_backward_kv_kernel<T, HSM>, ceil_div((size_t)p.tk, L::BK) * p.heads,
                  backward_kv_layout<HSM>::bytes, x, p);
}

template <int HSM>
static cudaError_t backward_width(const cuda_ctx *x, const attn_params &p, cuda_dtype dtype)
{
    switch (dtype) {
    case CUDA_DTYPE_F32:
        return backward_typed<HSM, float>(x, p);
    case CUDA_DTYPE_BF16:
        return backward_typed<HSM, __nv_bfloat16>(x, p);
    case CUDA_DTYPE_F16:
        return backward_typed<HSM, __half>(x, p);
    }
    return cudaErrorInvalidValue;
}

/* The widest head the kernels take */
constexpr int MAX_HS = 256;

static size_t dtype_size(cuda_dtype dtype) { return dtype == CUDA_DTYPE_F32 ? 4 : 2; }

} /* namespace */

extern "C" cudaError_t cuda_attention_forward(const cuda_ctx *x, const void *q, const int *q_pos,
                                              int tq, const void *k, const void *v,
                                              const int *k_pos, int tk, int B, int NH, int HS,
                                              cuda_dtype dtype, void *out, float *lse,
                                              int first_block)
{
    if (tq < 0 || tk < 0 || B < 0 || NH < 0 || HS < 0)
        return cudaErrorInvalidValue;
    /* tk 0 still writes a first block's out (0) and lse (-inf) */
    if (tq == 0 || B == 0 || NH == 0 || (tk == 0 && !first_block))
        return cudaSuccess;
    if (HS == 0 || HS > MAX_HS || (size_t)B * NH > (size_t)INT_MAX)
        return cudaErrorInvalidValue;
    attn_params p = {};
    p.q = q;
    p.k = k;
    p.v = v;
    p.q_pos = q_pos;
    p.k_pos = k_pos;
    p.tq = tq;
    p.tk = tk;
    p.heads = B * NH;
    p.NH = NH;
    p.HS = HS;
    p.scale = 1.0f / sqrtf((float)HS); /* as the cpu backend: in float */
    p.out = out;
    p.lse = lse;
    p.first_block = first_block != 0;
    if (HS <= 32)
        return forward_width<32>(x, p, dtype);
    if (HS <= 64)
        return forward_width<64>(x, p, dtype);
    if (HS <= 128)
        return forward_width<128>(x, p, dtype);
    return forward_width<256>(x, p, dtype);
}

/* D takes B·NH·tq floats of ctx->scratch: the batches go in as many
 * launches as it needs (one for any usual shape: 64 MiB holds 16M rows). */
extern "C" cudaError_t cuda_attention_backward(const cuda_ctx *x, const void *q, const int *q_pos,
                                               int tq, const void *k, const void *v,
                                               const int *k_pos, int tk, int B, int NH, int HS,
                                               cuda_dtype dtype, const void *out,
                                               const void *dout, const float *lse, void *dq,
                                               void *dk, void *dv)
{
    if (tq < 0 || tk < 0 || B < 0 || NH < 0 || HS < 0)
        return cudaErrorInvalidValue;
    if (tq == 0 || tk == 0 || B == 0 || NH == 0)
        return cudaSuccess;
    if (HS == 0 || HS > MAX_HS || (size_t)B * NH > (size_t)INT_MAX)
        return cudaErrorInvalidValue;
    const size_t per_batch = (size_t)NH * tq * sizeof(float);
    if (per_batch > x->scratch_bytes)
        return cudaErrorInvalidValue;
    const int chunk = (int)(x->scratch_bytes / per_batch < (size_t)B ? x->scratch_bytes / per_batch
                                                                     : (size_t)B);
    const size_t es = dtype_size(dtype), C = (size_t)NH * HS;
    for (int b0 = 0; b0 < B; b0 += chunk) {
        const int nb = B - b0 < chunk ? B - b0 : chunk;
        const size_t q_off = (size_t)b0 * tq * C * es, k_off = (size_t)b0 * tk * C * es;
        attn_params p = {};
        p.q = (const char *)q + q_off;
        p.k = (const char *)k + k_off;
        p.v = (const char *)v + k_off;
        p.q_pos = q_pos;
        p.k_pos = k_pos;
        p.tq = tq;
        p.tk = tk;
        p.heads = nb * NH;
        p.NH = NH;
        p.HS = HS;
        p.scale = 1.0f / sqrtf((float)HS);
        p.saved_out = (const char *)out + q_off;
        p.saved_lse = lse + (size_t)b0 * NH * tq;
        p.dout = (const char *)dout + q_off;
        p.delta = (float *)x->scratch;
        p.dq = (char *)dq + q_off;
        p.dk = (char *)dk + k_off;
        p.dv = (char *)dv + k_off;
        cudaError_t e;
        if (HS <= 32)
            e = backward_width<32>(x, p, dtype);
        else if (HS <= 64)
            e = backward_width<64>(x, p, dtype);
        else if (HS <= 128)
            e = backward_width<128>(x, p, dtype);
        else
            e = backward_width<256>(x, p, dtype);
        if (e != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}
