/* loom core — causal attention as blocks of keys with an online softmax.
 *
 * No (T, T) matrix exists: each query row computes its scores against one
 * block of keys into a row of tk floats, and the rows of all blocks are
 * merged through the log-sum-exp (lse) each row keeps. That is what lets a
 * sequence strategy (ring attention) feed K/V blocks one at a time, and
 * the backward recompute the probabilities from lse instead of storing them.
 *
 * The math per (batch, head), query i at position qp, key j at kp <= qp:
 *   s_ij = scale * q_i·k_j, lse_i = log Σ_j exp(s_ij), out_i = Σ_j exp(s_ij - lse_i) v_j
 * which is llm.c's softmax(preatt)·v row for row. Inner loops run over the
 * HS contiguous floats of one head in one row.
 *
 * f32 buffers are used in place (rows of one head are C = NH*HS floats
 * apart). bf16/f16 buffers are converted per (batch, head) into f32
 * scratch, computed in f32, and written back rounded; lse is always f32. */
#include "kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom_internal.h"

/* ---------------------------------------------------------------- helpers */

static inline float dot(const float *restrict a, const float *restrict b, int n)
{
    /* 8 independent lanes so the compiler vectorises without reassociating */
    float lane[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            lane[l] += a[i + l] * b[i + l];
    float s = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Blocked by 8 for -O2's vectoriser, which takes fixed-length loops on
 * restrict parameters but no loop that needs a scalar epilogue. */
static inline void axpy(float *restrict y, float a, const float *restrict x, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            y[i + l] += a * x[i + l];
    for (; i < n; i++)
        y[i] += a * x[i];
}

/* y = a * x */
static inline void scale_into(float *restrict y, float a, const float *restrict x, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            y[i + l] = a * x[i + l];
    for (; i < n; i++)
        y[i] = a * x[i];
}

/* y = a * y + b * x */
static inline void blend(float *restrict y, float a, float b, const float *restrict x, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            y[i + l] = a * y[i + l] + b * x[i + l];
    for (; i < n; i++)
        y[i] = a * y[i] + b * x[i];
}

static inline int position(const int *pos, int i) { return pos ? pos[i] : i; }

/* One head's rows: element (row r, dim d) at base[r * ld + d]. */
typedef struct head_rows {
    float *base;
    size_t ld;
} head_rows;

static inline float *row(head_rows h, int r) { return h.base + (size_t)r * h.ld; }

/* Rows [b, 0..rows) of head h of a (B, rows, NH, HS) buffer of type dt,
 * to and from contiguous f32 (rows, HS). */
static void gather_head(float *dst, const void *src, loom_dtype dt, int b, int h, int rows,
                        int NH, int HS)
{
    const size_t C = (size_t)NH * HS, es = loom_dtype_size(dt);
    for (int r = 0; r < rows; r++) {
        const char *s = (const char *)src + (((size_t)b * rows + r) * C + (size_t)h * HS) * es;
        loom_convert(dst + (size_t)r * HS, LOOM_F32, s, dt, (size_t)HS);
    }
}

static void scatter_head(void *dst, loom_dtype dt, const float *src, int b, int h, int rows,
                         int NH, int HS)
{
    const size_t C = (size_t)NH * HS, es = loom_dtype_size(dt);
    for (int r = 0; r < rows; r++) {
        char *d = (char *)dst + (((size_t)b * rows + r) * C + (size_t)h * HS) * es;
        loom_convert(d, dt, src + (size_t)r * HS, LOOM_F32, (size_t)HS);
    }
}

/* In-place view of head h of batch b in an f32 (B, rows, NH, HS) buffer. */
static head_rows f32_head(const void *buf, int b, int h, int rows, int NH, int HS)
{
    const size_t C = (size_t)NH * HS;
    head_rows v = {(float *)buf + (size_t)b * rows * C + (size_t)h * HS, C};
    return v;
}

static head_rows scratch_head(float *buf, int HS)
{
    head_rows v = {buf, (size_t)HS};
    return v;
}

/* Out of memory in a kernel that cannot return a status: make the damage
 * impossible to miss (NaN propagates to the loss) and record why. */
static void poison(void *buf, loom_dtype dt, size_t n)
{
    if (!buf)
        return;
    if (dt == LOOM_F32) {
        float *f = buf;
        for (size_t i = 0; i < n; i++)
            f[i] = NAN;
    } else {
        uint16_t *u = buf, nan = dt == LOOM_BF16 ? 0x7fc0u : 0x7e00u;
        for (size_t i = 0; i < n; i++)
            u[i] = nan;
    }
}

/* --------------------------------------------------------------- forward */

/* One (batch, head): attend tq queries to tk keys and merge into o/lse. */
static void forward_head(head_rows q, const int *q_pos, int tq, head_rows k, head_rows v,
                         const int *k_pos, int tk, int HS, float scale, head_rows o,
                         float *lse, int first_block, float *restrict score,
                         float *restrict acc)
{
    for (int i = 0; i < tq; i++) {
        const int qp = position(q_pos, i);
        const float *qi = row(q, i);
        float *oi = row(o, i);
        float m = -INFINITY;
        int seen = 0;
        for (int j = 0; j < tk; j++) {
            if (position(k_pos, j) > qp)
                continue;
            float s = scale * dot(qi, row(k, j), HS);
            score[j] = s;
            m = s > m ? s : m;
            seen = 1;
        }
        if (!seen) {
            if (first_block) {
                memset(oi, 0, (size_t)HS * sizeof(float));
                lse[i] = -INFINITY;
            }
            continue;
        }
        memset(acc, 0, (size_t)HS * sizeof(float));
        float l = 0.0f;
        for (int j = 0; j < tk; j++) {
            if (position(k_pos, j) > qp)
                continue;
            float p = expf(score[j] - m);
            l += p;
            axpy(acc, p, row(v, j), HS);
        }
        const float block_lse = m + logf(l);
        if (first_block || lse[i] == -INFINITY) {
            /* overwrite: the row may hold anything, even NaN, on a first block */
            scale_into(oi, 1.0f / l, acc, HS);
            lse[i] = block_lse;
            continue;
        }
        /* Both finite: rescale the old row and this block's to the new lse. */
        const float old_lse = lse[i];
        const float top = old_lse > block_lse ? old_lse : block_lse;
        const float new_lse = top + logf(expf(old_lse - top) + expf(block_lse - top));
        const float w_old = expf(old_lse - new_lse);
        const float w_acc = expf(m - new_lse); /* = exp(block_lse - new_lse) / l */
        blend(oi, w_old, w_acc, acc, HS);
        lse[i] = new_lse;
    }
}

static void attention_block_forward(const void *q, const int *q_pos, int tq, const void *k,
                                    const void *v, const int *k_pos, int tk, int B, int NH,
                                    int HS, loom_dtype dtype, void *out, float *lse,
                                    int first_block)
{
    const float scale = 1.0f / sqrtf((float)HS);
    const int wide = dtype == LOOM_F32;
    /* score row, accumulator; for 16-bit also q, o (tq rows) and k, v (tk rows) */
    size_t n = (size_t)tk + HS + (wide ? 0 : (size_t)HS * (2 * (size_t)tq + 2 * (size_t)tk));
    float *scratch = malloc(n * sizeof(float));
    if (!scratch) {
        loom_fail(LOOM_ERR_NO_MEMORY, "attention forward: no memory for %zu floats of scratch", n);
        poison(out, dtype, (size_t)B * tq * NH * HS);
        poison(lse, LOOM_F32, (size_t)B * NH * tq);
        return;
    }
    float *score = scratch, *acc = score + tk;
    float *qs = NULL, *os = NULL, *ks = NULL, *vs = NULL;
    if (!wide) {
        qs = acc + HS;
        os = qs + (size_t)tq * HS;
        ks = os + (size_t)tq * HS;
        vs = ks + (size_t)tk * HS;
    }
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            float *lse_bh = lse + ((size_t)b * NH + h) * tq;
            head_rows qh, kh, vh, oh;
            if (wide) {
                qh = f32_head(q, b, h, tq, NH, HS);
                kh = f32_head(k, b, h, tk, NH, HS);
                vh = f32_head(v, b, h, tk, NH, HS);
                oh = f32_head(out, b, h, tq, NH, HS);
            } else {
                gather_head(qs, q, dtype, b, h, tq, NH, HS);
                gather_head(ks, k, dtype, b, h, tk, NH, HS);
                gather_head(vs, v, dtype, b, h, tk, NH, HS);
                if (!first_block)
                    gather_head(os, out, dtype, b, h, tq, NH, HS);
                qh = scratch_head(qs, HS);
                kh = scratch_head(ks, HS);
                vh = scratch_head(vs, HS);
                oh = scratch_head(os, HS);
            }
            forward_head(qh, q_pos, tq, kh, vh, k_pos, tk, HS, scale, oh, lse_bh, first_block,
                         score, acc);
            if (!wide)
                scatter_head(out, dtype, os, b, h, tq, NH, HS);
        }
    }
    free(scratch);
}

/* -------------------------------------------------------------- backward */

static void backward_head(head_rows q, const int *q_pos, int tq, head_rows k, head_rows v,
                          const int *k_pos, int tk, int HS, float scale, head_rows o,
                          head_rows dout, const float *lse, head_rows dq, head_rows dk,
                          head_rows dv)
{
    for (int i = 0; i < tq; i++) {
        const float L = lse[i];
        if (!isfinite(L)) /* the row saw no key anywhere: out is 0, nothing flows */
            continue;
        const int qp = position(q_pos, i);
        const float *qi = row(q, i), *doi = row(dout, i);
        float *dqi = row(dq, i);
        const float D = dot(doi, row(o, i), HS);
        for (int j = 0; j < tk; j++) {
            if (position(k_pos, j) > qp)
                continue;
            const float *kj = row(k, j), *vj = row(v, j);
            const float p = expf(scale * dot(qi, kj, HS) - L);
            const float ds = p * (dot(doi, vj, HS) - D);
            axpy(row(dv, j), p, doi, HS);
            axpy(dqi, scale * ds, kj, HS);
            axpy(row(dk, j), scale * ds, qi, HS);
        }
    }
}

static void attention_block_backward(const void *q, const int *q_pos, int tq, const void *k,
                                     const void *v, const int *k_pos, int tk, int B, int NH,
                                     int HS, loom_dtype dtype, const void *out, const void *dout,
                                     const float *lse, void *dq, void *dk, void *dv)
{
    const float scale = 1.0f / sqrtf((float)HS);
    const int wide = dtype == LOOM_F32;
    float *scratch = NULL;
    if (!wide) {
        /* q, o, dout, dq (tq rows) and k, v, dk, dv (tk rows) */
        size_t n = (size_t)HS * (4 * (size_t)tq + 4 * (size_t)tk);
        scratch = malloc(n * sizeof(float));
        if (!scratch) {
            loom_fail(LOOM_ERR_NO_MEMORY,
                      "attention backward: no memory for %zu floats of scratch", n);
            poison(dq, dtype, (size_t)B * tq * NH * HS);
            poison(dk, dtype, (size_t)B * tk * NH * HS);
            poison(dv, dtype, (size_t)B * tk * NH * HS);
            return;
        }
    }
    float *qs = NULL, *os = NULL, *dos = NULL, *dqs = NULL;
    float *ks = NULL, *vs = NULL, *dks = NULL, *dvs = NULL;
    if (scratch) {
        qs = scratch;
        os = qs + (size_t)tq * HS;
        dos = os + (size_t)tq * HS;
        dqs = dos + (size_t)tq * HS;
        ks = dqs + (size_t)tq * HS;
        vs = ks + (size_t)tk * HS;
        dks = vs + (size_t)tk * HS;
        dvs = dks + (size_t)tk * HS;
    }
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            const float *lse_bh = lse + ((size_t)b * NH + h) * tq;
            head_rows qh, kh, vh, oh, doh, dqh, dkh, dvh;
            if (wide) {
                qh = f32_head(q, b, h, tq, NH, HS);
                kh = f32_head(k, b, h, tk, NH, HS);
                vh = f32_head(v, b, h, tk, NH, HS);
                oh = f32_head(out, b, h, tq, NH, HS);
                doh = f32_head(dout, b, h, tq, NH, HS);
                dqh = f32_head(dq, b, h, tq, NH, HS);
                dkh = f32_head(dk, b, h, tk, NH, HS);
                dvh = f32_head(dv, b, h, tk, NH, HS);
            } else {
                gather_head(qs, q, dtype, b, h, tq, NH, HS);
                gather_head(os, out, dtype, b, h, tq, NH, HS);
                gather_head(dos, dout, dtype, b, h, tq, NH, HS);
                gather_head(dqs, dq, dtype, b, h, tq, NH, HS);
                gather_head(ks, k, dtype, b, h, tk, NH, HS);
                gather_head(vs, v, dtype, b, h, tk, NH, HS);
                gather_head(dks, dk, dtype, b, h, tk, NH, HS);
                gather_head(dvs, dv, dtype, b, h, tk, NH, HS);
                qh = scratch_head(qs, HS);
                oh = scratch_head(os, HS);
                doh = scratch_head(dos, HS);
                dqh = scratch_head(dqs, HS);
                kh = scratch_head(ks, HS);
                vh = scratch_head(vs, HS);
                dkh = scratch_head(dks, HS);
                dvh = scratch_head(dvs, HS);
            }
            backward_head(qh, q_pos, tq, kh, vh, k_pos, tk, HS, scale, oh, doh, lse_bh, dqh,
                          dkh, dvh);
            if (!wide) {
                scatter_head(dq, dtype, dqs, b, h, tq, NH, HS);
                scatter_head(dk, dtype, dks, b, h, tk, NH, HS);
                scatter_head(dv, dtype, dvs, b, h, tk, NH, HS);
            }
        }
    }
    free(scratch);
}

const loom_attention_kernels loom_attention_kernels_cpu = {
    .struct_size = sizeof(loom_attention_kernels),
    .block_forward = attention_block_forward,
    .block_backward = attention_block_backward,
};

/* ------------------------------------------------- whole-sequence causal */

void loom_attention_forward(float *out, float *lse, const float *q, const float *k,
                            const float *v, int B, int T, int NH, int HS)
{
    attention_block_forward(q, NULL, T, k, v, NULL, T, B, NH, HS, LOOM_F32, out, lse, 1);
}

void loom_attention_backward(float *dq, float *dk, float *dv, const float *q, const float *k,
                             const float *v, const float *out, const float *dout,
                             const float *lse, int B, int T, int NH, int HS)
{
    attention_block_backward(q, NULL, T, k, v, NULL, T, B, NH, HS, LOOM_F32, out, dout, lse, dq,
                             dk, dv);
}
