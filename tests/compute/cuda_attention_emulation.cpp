/* compute-cuda's attention kernels (plugins/compute-cuda/kernels_attention.cu)
 * run on the CPU, without a GPU: the file is compiled as host C++ with
 * every block's 256 threads as OS threads, __syncthreads,
 * __syncthreads_or and the warp shuffles as barriers, and each block's
 * dynamic shared memory its own allocation of the launch's size, filled
 * with NaN (a read of a word no thread wrote reaches the results). The
 * launchers' results are checked against a double-precision softmax
 * attention: ring blocks merged into out and lse, arbitrary positions,
 * rows that see no key, every head width template, f32, bf16 and f16, and
 * the backward's batch chunks.
 *
 * A barrier some thread of the block never reaches (divergent code) or a
 * shuffle a lane skips is reported after 20 s instead of hanging. Built
 * with -fsanitize=thread it also finds a missing barrier (two threads of a
 * block touching the same shared word unordered); with
 * -fsanitize=address, a read or write past a buffer or the shared memory.
 *
 *   g++ -std=c++17 -O1 -g -pthread -Wall -Wextra -Wno-unknown-pragmas \
 *       -I/usr/local/cuda/include -Iplugins/compute-cuda \
 *       tests/compute/cuda_attention_emulation.cpp -o cuda_attention_emulation \
 *       [-fsanitize=thread]
 *
 * With -DATTN_EMULATION_CPU_KERNELS and loom's libloom_model.a linked in
 * (and what it links: libloom_runtime.a, libloom_plugin_common.a, OpenBLAS,
 * oneDNN where built with it, OpenMP), every case also runs through the
 * cpu backend's kernels (loom_attention_kernels_cpu), which the GPU's
 * conformance test compares against: out, lse, dq, dk and dv within the
 * same tolerances.
 *
 * Exit 0 when every case passes, 1 naming the first wrong element of each
 * failing case. An argument runs only the cases whose name contains it
 * ("ring", "causal", "zigzag", "wide", "chunks"). */
#define __host__
#define __device__
#define __global__
#define __shared__
#define __launch_bounds__(...)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

/* ---- the CUDA built-ins the kernels use, on OS threads ---- */

struct emu_index {
    unsigned x, y, z;
};
static thread_local emu_index threadIdx, blockIdx;

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

/* n threads meet; each brings a predicate and leaves with their OR. */
class emu_barrier {
  public:
    explicit emu_barrier(int n) : n_(n) {}
    int arrive(int pred, const char *what)
    {
        std::unique_lock<std::mutex> lock(m_);
        const unsigned gen = gen_;
        any_ |= pred;
        if (++count_ == n_) {
            result_ = any_;
            any_ = 0;
            count_ = 0;
            gen_++;
            cv_.notify_all();
            return result_;
        }
        if (!cv_.wait_for(lock, std::chrono::seconds(20), [&] { return gen_ != gen; })) {
            fprintf(stderr, "FAIL: %s: %d of %d threads arrived in 20 s (a barrier or shuffle in "
                            "divergent code?)\n",
                    what, count_, n_);
            exit(1);
        }
        return result_;
    }

  private:
    std::mutex m_;
    std::condition_variable cv_;
    int n_, count_ = 0, any_ = 0, result_ = 0;
    unsigned gen_ = 0;
};

constexpr int EMU_THREADS = 256;
constexpr size_t EMU_MAX_SMEM = 227 * 1024; /* sm_90's opt-in maximum per block */

struct emu_block {
    emu_barrier block{EMU_THREADS};
    std::vector<emu_barrier *> warps;
    float slots[EMU_THREADS / 32][32];
    float *smem;
};
static thread_local emu_block *emu_current;
static size_t emu_smem_peak;

static void __syncthreads() { emu_current->block.arrive(0, "__syncthreads"); }
static int __syncthreads_or(int pred)
{
    return emu_current->block.arrive(pred != 0, "__syncthreads_or");
}
static float __shfl_xor_sync(unsigned mask, float v, int lane_mask)
{
    if (mask != 0xffffffffu) {
        fprintf(stderr, "FAIL: a shuffle with mask %#x (the kernels shuffle full warps)\n", mask);
        exit(1);
    }
    const int w = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    emu_current->slots[w][lane] = v;
    emu_current->warps[w]->arrive(0, "__shfl_xor_sync");
    const float r = emu_current->slots[w][lane ^ lane_mask];
    emu_current->warps[w]->arrive(0, "__shfl_xor_sync");
    return r;
}

/* The grid, one block after another, each on EMU_THREADS threads. */
static void emu_launch(unsigned blocks, size_t smem, unsigned threads,
                       const std::function<void()> &body)
{
    if (threads != EMU_THREADS || smem > EMU_MAX_SMEM) {
        fprintf(stderr, "FAIL: a launch of %u threads with %zu bytes of shared memory\n", threads,
                smem);
        exit(1);
    }
    emu_smem_peak = smem > emu_smem_peak ? smem : emu_smem_peak;
    for (unsigned b = 0; b < blocks; b++) {
        emu_block blk;
        for (int w = 0; w < EMU_THREADS / 32; w++)
            blk.warps.push_back(new emu_barrier(32));
        blk.smem = (float *)malloc(smem ? smem : 1);
        for (size_t i = 0; i < smem / sizeof(float); i++)
            blk.smem[i] = NAN;
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < threads; t++)
            pool.emplace_back([&, t] {
                threadIdx = {t, 0, 0};
                blockIdx = {b, 0, 0};
                emu_current = &blk;
                body();
            });
        for (auto &th : pool)
            th.join();
        free(blk.smem);
        for (auto *w : blk.warps)
            delete w;
    }
}

#define ATTN_SHARED_MEMORY(name) float *name = emu_current->smem
#define ATTN_LAUNCH(kernel, blocks, smem, stream, ...)                                           \
    ((void)(stream), emu_launch((blocks), (smem), THREADS, [&] { kernel(__VA_ARGS__); }))

static size_t emu_attribute_smem;
extern "C" cudaError_t cudaFuncSetAttribute(const void *, enum cudaFuncAttribute attr, int value)
{
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize)
        emu_attribute_smem = (size_t)value;
    return (size_t)value <= EMU_MAX_SMEM ? cudaSuccess : cudaErrorInvalidValue;
}
extern "C" cudaError_t cudaGetLastError(void) { return cudaSuccess; }

#include "kernels_attention.cu"

/* ---- buffers of a storage type ---- */

struct buffer {
    cuda_dtype dt;
    size_t n;
    void *data; /* exactly n elements: a sanitizer sees a step past the end */
    buffer(cuda_dtype d, size_t count) : dt(d), n(count), data(malloc(count * size() + 1)) {}
    ~buffer() { free(data); }
    buffer(const buffer &) = delete;
    buffer &operator=(const buffer &) = delete;
    size_t size() const { return dt == CUDA_DTYPE_F32 ? 4 : 2; }
    float get(size_t i) const
    {
        if (dt == CUDA_DTYPE_F32)
            return ((const float *)data)[i];
        if (dt == CUDA_DTYPE_BF16)
            return __bfloat162float(((const __nv_bfloat16 *)data)[i]);
        return __half2float(((const __half *)data)[i]);
    }
    void set(size_t i, float x)
    {
        if (dt == CUDA_DTYPE_F32)
            ((float *)data)[i] = x;
        else if (dt == CUDA_DTYPE_BF16)
            ((__nv_bfloat16 *)data)[i] = __float2bfloat16_rn(x);
        else
            ((__half *)data)[i] = __float2half_rn(x);
    }
    void fill_random(std::mt19937 &rng, float lo, float hi)
    {
        std::uniform_real_distribution<float> u(lo, hi);
        for (size_t i = 0; i < n; i++)
            set(i, u(rng));
    }
    void fill(float x)
    {
        for (size_t i = 0; i < n; i++)
            set(i, x);
    }
    std::vector<double> values() const
    {
        std::vector<double> v(n);
        for (size_t i = 0; i < n; i++)
            v[i] = get(i);
        return v;
    }
};

/* ---- the reference, in double ---- */

struct shape {
    int B, NH, HS;
};

/* (b, t, h, d) of a (B, rows, NH, HS) buffer */
static size_t at(const shape &s, int rows, int b, int t, int h, int d)
{
    return (((size_t)b * rows + t) * s.NH + h) * s.HS + d;
}

struct key_block {
    int tk;
    std::vector<int> pos;
    std::vector<double> k, v;
};

static double score(const shape &s, const std::vector<double> &q, int tq, int b, int i, int h,
                    const key_block &kb, int j)
{
    const double scale = 1.0f / sqrtf((float)s.HS);
    double dot = 0;
    for (int d = 0; d < s.HS; d++)
        dot += q[at(s, tq, b, i, h, d)] * kb.k[at(s, kb.tk, b, j, h, d)];
    return scale * dot;
}

/* out and lse of attention over all of blocks */
static void reference_forward(const shape &s, const std::vector<double> &q,
                              const std::vector<int> &q_pos, int tq,
                              const std::vector<key_block> &blocks, std::vector<double> &out,
                              std::vector<double> &lse)
{
    out.assign((size_t)s.B * tq * s.NH * s.HS, 0.0);
    lse.assign((size_t)s.B * s.NH * tq, -INFINITY);
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int i = 0; i < tq; i++) {
                double top = -INFINITY;
                for (const key_block &kb : blocks)
                    for (int j = 0; j < kb.tk; j++)
                        if (kb.pos[j] <= q_pos[i])
                            top = std::max(top, score(s, q, tq, b, i, h, kb, j));
                if (top == -INFINITY)
                    continue;
                double sum = 0;
                std::vector<double> acc(s.HS, 0.0);
                for (const key_block &kb : blocks)
                    for (int j = 0; j < kb.tk; j++)
                        if (kb.pos[j] <= q_pos[i]) {
                            const double w = exp(score(s, q, tq, b, i, h, kb, j) - top);
                            sum += w;
                            for (int d = 0; d < s.HS; d++)
                                acc[d] += w * kb.v[at(s, kb.tk, b, j, h, d)];
                        }
                for (int d = 0; d < s.HS; d++)
                    out[at(s, tq, b, i, h, d)] = acc[d] / sum;
                lse[((size_t)b * s.NH + h) * tq + i] = top + log(sum);
            }
}

/* dq, dk, dv += one block's share, given the final out and lse */
static void reference_backward(const shape &s, const std::vector<double> &q,
                               const std::vector<int> &q_pos, int tq, const key_block &kb,
                               const std::vector<double> &out, const std::vector<double> &dout,
                               const std::vector<double> &lse, std::vector<double> &dq,
                               std::vector<double> &dk, std::vector<double> &dv)
{
    const double scale = 1.0f / sqrtf((float)s.HS);
    for (int b = 0; b < s.B; b++)
        for (int h = 0; h < s.NH; h++)
            for (int i = 0; i < tq; i++) {
                const double l = lse[((size_t)b * s.NH + h) * tq + i];
                if (!std::isfinite(l))
                    continue;
                double D = 0;
                for (int d = 0; d < s.HS; d++)
                    D += dout[at(s, tq, b, i, h, d)] * out[at(s, tq, b, i, h, d)];
                for (int j = 0; j < kb.tk; j++) {
                    if (kb.pos[j] > q_pos[i])
                        continue;
                    const double p = exp(score(s, q, tq, b, i, h, kb, j) - l);
                    double dp = 0;
                    for (int d = 0; d < s.HS; d++)
                        dp += dout[at(s, tq, b, i, h, d)] * kb.v[at(s, kb.tk, b, j, h, d)];
                    const double ds = p * (dp - D);
                    for (int d = 0; d < s.HS; d++) {
                        dv[at(s, kb.tk, b, j, h, d)] += p * dout[at(s, tq, b, i, h, d)];
                        dq[at(s, tq, b, i, h, d)] += scale * ds * kb.k[at(s, kb.tk, b, j, h, d)];
                        dk[at(s, kb.tk, b, j, h, d)] += scale * ds * q[at(s, tq, b, i, h, d)];
                    }
                }
            }
}

/* ---- comparisons ---- */

static int failures;

static double tolerance(cuda_dtype dt)
{
    return dt == CUDA_DTYPE_F32 ? 2e-5 : dt == CUDA_DTYPE_F16 ? 4e-3 : 3e-2;
}

static bool expect(const char *test, const char *what, const buffer &got,
                   const std::vector<double> &want, double tol)
{
    double worst = 0;
    for (size_t i = 0; i < want.size(); i++) {
        const double g = got.get(i), w = want[i];
        const bool same = std::isinf(w) ? g == w : fabs(g - w) <= tol * std::max(1.0, fabs(w));
        if (!same) {
            fprintf(stderr, "FAIL %s: %s[%zu] = %.9g, want %.9g (tolerance %g)\n", test, what, i,
                    g, w, tol);
            failures++;
            return false;
        }
        if (!std::isinf(w))
            worst = std::max(worst, fabs(g - w) / std::max(1.0, fabs(w)));
    }
    printf("  %-10s max error %.3g\n", what, worst);
    return true;
}

static bool expect_lse(const char *test, const std::vector<float> &got,
                       const std::vector<double> &want)
{
    buffer g(CUDA_DTYPE_F32, got.size());
    memcpy(g.data, got.data(), got.size() * sizeof(float));
    return expect(test, "lse", g, want, 2e-5);
}

/* ---- the cases ---- */

struct attn_case {
    const char *name;
    shape s;
    cuda_dtype dt;
    std::vector<int> q_pos;
    std::vector<std::vector<int>> k_pos; /* one per key block, merged in this order */
    size_t scratch_bytes;                /* 0: plenty */
};

static const char *dtype_name(cuda_dtype dt)
{
    return dt == CUDA_DTYPE_F32 ? "f32" : dt == CUDA_DTYPE_BF16 ? "bf16" : "f16";
}

static std::vector<int> iota(int n, int from)
{
    std::vector<int> v(n);
    for (int i = 0; i < n; i++)
        v[i] = from + i;
    return v;
}

static void run_case(const attn_case &c)
{
    char test[160];
    snprintf(test, sizeof test, "%s (%s, B=%d NH=%d HS=%d tq=%zu)", c.name, dtype_name(c.dt),
             c.s.B, c.s.NH, c.s.HS, c.q_pos.size());
    printf("%s\n", test);
    std::mt19937 rng(1234);
    const shape &s = c.s;
    const int tq = (int)c.q_pos.size();
    const size_t nq = (size_t)s.B * tq * s.NH * s.HS, nl = (size_t)s.B * s.NH * tq;
    const size_t nblocks = c.k_pos.size();

    buffer q(c.dt, nq), dout(c.dt, nq), out(c.dt, nq), dq(c.dt, nq);
    q.fill_random(rng, -1.5f, 1.5f);
    dout.fill_random(rng, -1.0f, 1.0f);
    out.fill(NAN); /* a first block writes every row, seen or not */
    std::vector<float> lse(nl, NAN);
    std::vector<buffer *> k, v, dk, dv;
    std::vector<key_block> ref_blocks;
    for (size_t kb = 0; kb < nblocks; kb++) {
        const int tk = (int)c.k_pos[kb].size();
        const size_t nk = (size_t)s.B * tk * s.NH * s.HS;
        k.push_back(new buffer(c.dt, nk));
        v.push_back(new buffer(c.dt, nk));
        dk.push_back(new buffer(c.dt, nk));
        dv.push_back(new buffer(c.dt, nk));
        k.back()->fill_random(rng, -1.5f, 1.5f);
        v.back()->fill_random(rng, -1.0f, 1.0f);
        dk.back()->fill_random(rng, -1.0f, 1.0f);
        dv.back()->fill_random(rng, -1.0f, 1.0f);
        ref_blocks.push_back({tk, c.k_pos[kb], k.back()->values(), v.back()->values()});
    }
    std::vector<float> scratch(4096 * 1024);
    cuda_ctx ctx = {};
    ctx.scratch = scratch.data();
    ctx.scratch_bytes = c.scratch_bytes ? c.scratch_bytes : scratch.size() * sizeof(float);
    ctx.deterministic = 1;

    /* forward: each block merged in turn; checked after the first and the last */
    for (size_t kb = 0; kb < nblocks; kb++) {
        const int tk = (int)c.k_pos[kb].size();
        const cudaError_t e = cuda_attention_forward(
            &ctx, q.data, c.q_pos.data(), tq, k[kb]->data, v[kb]->data, c.k_pos[kb].data(), tk,
            s.B, s.NH, s.HS, c.dt, out.data, lse.data(), kb == 0);
        if (e != cudaSuccess) {
            fprintf(stderr, "FAIL %s: cuda_attention_forward returned %d\n", test, (int)e);
            failures++;
            return;
        }
        if (kb == 0 || kb + 1 == nblocks) {
            std::vector<key_block> seen(ref_blocks.begin(), ref_blocks.begin() + (long)kb + 1);
            std::vector<double> ref_out, ref_lse;
            reference_forward(s, q.values(), c.q_pos, tq, seen, ref_out, ref_lse);
            /* a 16-bit out is rounded once per block merged */
            const double tol = tolerance(c.dt) * (double)(kb + 1);
            if (!expect(test, kb == 0 ? "out first" : "out", out, ref_out, tol))
                return;
            if (!expect_lse(test, lse, ref_lse))
                return;
        }
    }

    /* backward, block by block, onto gradients that hold something, from
     * the forward's own out and lse */
    dq.fill_random(rng, -1.0f, 1.0f);
    std::vector<double> ref_dq = dq.values(), ref_lse(lse.begin(), lse.end());
    const std::vector<double> qv = q.values(), ov = out.values(), gv = dout.values();
    for (size_t kb = 0; kb < nblocks; kb++) {
        std::vector<double> ref_dk = dk[kb]->values(), ref_dv = dv[kb]->values();
        reference_backward(s, qv, c.q_pos, tq, ref_blocks[kb], ov, gv, ref_lse, ref_dq, ref_dk,
                           ref_dv);
        const int tk = (int)c.k_pos[kb].size();
        const cudaError_t e = cuda_attention_backward(
            &ctx, q.data, c.q_pos.data(), tq, k[kb]->data, v[kb]->data, c.k_pos[kb].data(), tk,
            s.B, s.NH, s.HS, c.dt, out.data, dout.data, lse.data(), dq.data, dk[kb]->data,
            dv[kb]->data);
        if (e != cudaSuccess) {
            fprintf(stderr, "FAIL %s: cuda_attention_backward returned %d\n", test, (int)e);
            failures++;
            return;
        }
        if (!expect(test, "dk", *dk[kb], ref_dk, tolerance(c.dt)) ||
            !expect(test, "dv", *dv[kb], ref_dv, tolerance(c.dt)))
            return;
    }
    /* dq takes one rounding per block */
    expect(test, "dq", dq, ref_dq, tolerance(c.dt) * (double)nblocks);
    for (size_t kb = 0; kb < nblocks; kb++) {
        delete k[kb];
        delete v[kb];
        delete dk[kb];
        delete dv[kb];
    }
}

/* A first block of no keys writes out 0 and lse -inf; a later one leaves
 * them alone; backward over it does nothing. */
static void run_empty_block()
{
    const char *test = "a block of no keys";
    printf("%s\n", test);
    const shape s = {1, 2, 8};
    const int tq = 3;
    const size_t nq = (size_t)s.B * tq * s.NH * s.HS;
    std::vector<int> q_pos = iota(tq, 0);
    buffer q(CUDA_DTYPE_F32, nq), out(CUDA_DTYPE_F32, nq), k(CUDA_DTYPE_F32, 1),
        v(CUDA_DTYPE_F32, 1);
    q.fill(0.5f);
    out.fill(NAN);
    std::vector<float> lse((size_t)s.B * s.NH * tq, NAN), scratch(1024);
    cuda_ctx ctx = {};
    ctx.scratch = scratch.data();
    ctx.scratch_bytes = scratch.size() * sizeof(float);
    cuda_attention_forward(&ctx, q.data, q_pos.data(), tq, k.data, v.data, NULL, 0, s.B, s.NH,
                           s.HS, CUDA_DTYPE_F32, out.data, lse.data(), 1);
    expect(test, "out", out, std::vector<double>(nq, 0.0), 0);
    expect_lse(test, lse, std::vector<double>(lse.size(), -INFINITY));
    out.fill(7.0f);
    std::fill(lse.begin(), lse.end(), 3.0f);
    cuda_attention_forward(&ctx, q.data, q_pos.data(), tq, k.data, v.data, NULL, 0, s.B, s.NH,
                           s.HS, CUDA_DTYPE_F32, out.data, lse.data(), 0);
    expect(test, "out kept", out, std::vector<double>(nq, 7.0), 0);
    expect_lse(test, lse, std::vector<double>(lse.size(), 3.0));
}

/* A head too wide, and a scratch too small for one batch's D: refused. */
static void run_refusals()
{
    const char *test = "refusals";
    printf("%s\n", test);
    float x[4] = {0, 0, 0, 0}, scratch[4];
    cuda_ctx ctx = {};
    ctx.scratch = scratch;
    ctx.scratch_bytes = sizeof scratch;
    if (cuda_attention_forward(&ctx, x, NULL, 1, x, x, NULL, 1, 1, 1, 257, CUDA_DTYPE_F32, x, x,
                               1) != cudaErrorInvalidValue ||
        cuda_attention_backward(&ctx, x, NULL, 8, x, x, NULL, 1, 1, 1, 4, CUDA_DTYPE_F32, x, x, x,
                                x, x, x) != cudaErrorInvalidValue) {
        fprintf(stderr, "FAIL %s: accepted\n", test);
        failures++;
    }
}

/* ---- against loom's cpu kernels (linked in with libloom_model.a) ---- */

#ifdef ATTN_EMULATION_CPU_KERNELS
/* loom/strategy.h's loom_attention_kernels, its dtype an int (loom_dtype's
 * values are cuda_dtype's) */
extern "C" {
typedef struct {
    uint32_t struct_size;
    void (*block_forward)(const void *, const int *, int, const void *, const void *, const int *,
                          int, int, int, int, int, void *, float *, int);
    void (*block_backward)(const void *, const int *, int, const void *, const void *,
                           const int *, int, int, int, int, int, const void *, const void *,
                           const float *, void *, void *, void *);
} cpu_attention_kernels;
extern const cpu_attention_kernels loom_attention_kernels_cpu;
}

/* The same blocks through both, out and lse compared, then the backward
 * of each block from the cpu's out and lse. */
static void against_cpu(cuda_dtype dt, int B, int NH, int HS, const std::vector<int> &qp,
                        const std::vector<std::vector<int>> &kps)
{
    const char *test = "against loom's cpu kernels";
    printf("%s (%s, B=%d NH=%d HS=%d tq=%zu)\n", test, dtype_name(dt), B, NH, HS, qp.size());
    std::mt19937 rng(99);
    const int tq = (int)qp.size();
    const size_t nq = (size_t)B * tq * NH * HS, nl = (size_t)B * NH * tq;
    buffer q(dt, nq), dout(dt, nq), o_gpu(dt, nq), o_cpu(dt, nq), dq_gpu(dt, nq), dq_cpu(dt, nq);
    q.fill_random(rng, -1.5f, 1.5f);
    dout.fill_random(rng, -1, 1);
    dq_gpu.fill_random(rng, -1, 1);
    memcpy(dq_cpu.data, dq_gpu.data, nq * dq_gpu.size());
    std::vector<float> l_gpu(nl), l_cpu(nl), scratch(1 << 20);
    cuda_ctx ctx = {};
    ctx.scratch = scratch.data();
    ctx.scratch_bytes = scratch.size() * 4;
    std::vector<buffer *> ks, vs, dkg, dkc, dvg, dvc;
    for (size_t b = 0; b < kps.size(); b++) {
        const int tk = (int)kps[b].size();
        const size_t nk = (size_t)B * tk * NH * HS;
        for (auto *vec : {&ks, &vs, &dkg, &dkc, &dvg, &dvc})
            vec->push_back(new buffer(dt, nk));
        ks[b]->fill_random(rng, -1.5f, 1.5f);
        vs[b]->fill_random(rng, -1, 1);
        dkg[b]->fill_random(rng, -1, 1);
        dvg[b]->fill_random(rng, -1, 1);
        memcpy(dkc[b]->data, dkg[b]->data, nk * dkg[b]->size());
        memcpy(dvc[b]->data, dvg[b]->data, nk * dvg[b]->size());
        cuda_attention_forward(&ctx, q.data, qp.data(), tq, ks[b]->data, vs[b]->data,
                               kps[b].data(), tk, B, NH, HS, dt, o_gpu.data, l_gpu.data(), b == 0);
        loom_attention_kernels_cpu.block_forward(q.data, qp.data(), tq, ks[b]->data, vs[b]->data,
                                                 kps[b].data(), tk, B, NH, HS, dt, o_cpu.data,
                                                 l_cpu.data(), b == 0);
    }
    const double tol = tolerance(dt);
    expect(test, "out", o_gpu, o_cpu.values(), tol);
    std::vector<double> lc(l_cpu.begin(), l_cpu.end());
    expect_lse(test, l_gpu, lc);
    for (size_t b = 0; b < kps.size(); b++) {
        const int tk = (int)kps[b].size();
        /* both from the cpu's forward: only the backward differs */
        cuda_attention_backward(&ctx, q.data, qp.data(), tq, ks[b]->data, vs[b]->data,
                                kps[b].data(), tk, B, NH, HS, dt, o_cpu.data, dout.data,
                                l_cpu.data(), dq_gpu.data, dkg[b]->data, dvg[b]->data);
        loom_attention_kernels_cpu.block_backward(q.data, qp.data(), tq, ks[b]->data,
                                                  vs[b]->data, kps[b].data(), tk, B, NH, HS, dt,
                                                  o_cpu.data, dout.data, l_cpu.data(),
                                                  dq_cpu.data, dkc[b]->data, dvc[b]->data);
        expect(test, "dk", *dkg[b], dkc[b]->values(), tol);
        expect(test, "dv", *dvg[b], dvc[b]->values(), tol);
    }
    expect(test, "dq", dq_gpu, dq_cpu.values(), tol);
    for (auto *vec : {&ks, &vs, &dkg, &dkc, &dvg, &dvc})
        for (buffer *b : *vec)
            delete b;
}

static void run_against_cpu(const attn_case &c)
{
    against_cpu(c.dt, c.s.B, c.s.NH, c.s.HS, c.q_pos, c.k_pos);
}
#endif

/* argv[1], when given, picks the cases whose name contains it */
int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : NULL;
    std::vector<attn_case> cases;
    const cuda_dtype dts[] = {CUDA_DTYPE_F32, CUDA_DTYPE_BF16, CUDA_DTYPE_F16};
    /* the conformance test's shape: blocks 0..2 and 3..4 */
    for (cuda_dtype dt : dts)
        cases.push_back({"conformance's ring", {2, 3, 4}, dt, iota(5, 0), {{0, 1, 2}, {3, 4}}, 0});
    /* one causal block past a tile in both directions, GPT-2's head */
    for (cuda_dtype dt : dts)
        cases.push_back({"causal", {1, 2, 64}, dt, iota(150, 0), {iota(150, 0)}, 0});
    /* zigzag-like positions, out of order, two blocks of other lengths
     * than the queries; query at 0 sees no key at all (keys from 1), the
     * first block's keys are all past some queries */
    std::vector<int> zq(70), zk1(37), zk2(90);
    for (int i = 0; i < 70; i++)
        zq[i] = (i * 37) % 70; /* a permutation of 0..69 */
    for (int j = 0; j < 37; j++)
        zk1[j] = 33 + (j * 5) % 37; /* 33..69 */
    for (int j = 0; j < 90; j++)
        zk2[j] = 1 + (j * 7) % 90 * 32 / 90; /* 1..32, repeated */
    cases.push_back({"zigzag", {2, 2, 48}, CUDA_DTYPE_F32, zq, {zk1, zk2}, 0});
    cases.push_back({"zigzag", {2, 2, 48}, CUDA_DTYPE_BF16, zq, {zk1, zk2}, 0});
    /* the wide heads' templates (tiles of 32 keys; of 32 queries at 256) */
    cases.push_back({"wide", {1, 2, 128}, CUDA_DTYPE_F32, iota(70, 0), {iota(45, 0), iota(30, 45)},
                     0});
    cases.push_back({"widest", {1, 1, 200}, CUDA_DTYPE_F32, iota(40, 10), {iota(50, 0)}, 0});
    cases.push_back({"widest", {1, 1, 256}, CUDA_DTYPE_F16, iota(33, 0), {iota(33, 0)}, 0});
    /* D in as many launches as batches: scratch for one batch at a time */
    cases.push_back({"batch chunks", {3, 2, 16}, CUDA_DTYPE_F32, iota(20, 0), {iota(20, 0)},
                     2 * 20 * sizeof(float) + 4});
    for (const attn_case &c : cases)
        if (!only || strstr(c.name, only)) {
            run_case(c);
#ifdef ATTN_EMULATION_CPU_KERNELS
            run_against_cpu(c);
#endif
        }
    if (!only) {
        run_empty_block();
        run_refusals();
    }
    printf("shared memory: %zu bytes at most per block (opted in: %zu last)\n", emu_smem_peak,
           emu_attribute_smem);
    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("all attention cases pass\n");
    return 0;
}
