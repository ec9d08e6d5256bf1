/* The per-element math of compute-cuda's attention kernels
 * (kernels_attention.cu): the online softmax over tiles of keys, the merge
 * of a block of keys into a row's (out, lse), and the probabilities and
 * score gradients of the backward pass. Host-callable, so that
 * tests/compute/cuda_attention_host_test.cu checks them on a machine
 * without a GPU against a double-precision softmax.
 *
 * Per (batch, head), query i at position qp, key j at position kp:
 *   s_ij = scale·q_i·k_j over the keys with kp <= qp,
 *   lse_i = log Σ_j exp(s_ij), out_i = Σ_j exp(s_ij - lse_i)·v_j,
 * with lse_i = -inf and out_i = 0 for a row that sees no key. */
#ifndef LOOM_CUDA_ATTENTION_MATH_CUH
#define LOOM_CUDA_ATTENTION_MATH_CUH

#include <math.h>

/* Whether the key at k_pos is visible to the query at q_pos (positions are
 * arbitrary: a ring or zigzag block's are not 0..n-1). */
static __host__ __device__ inline bool attn_visible(int k_pos, int q_pos)
{
    return k_pos <= q_pos;
}

/* The factor a row's running sum and accumulator are multiplied by when its
 * running max moves from m_old to m_new. While the row has seen no key both
 * are -inf, and exp(-inf - -inf) would be NaN: nothing to rescale then. */
static __host__ __device__ inline float attn_rescale(float m_old, float m_new)
{
    return m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
}

/* A visible key's weight under the row's running max m; m >= s is finite
 * whenever a visible key exists, since m includes s. */
static __host__ __device__ inline float attn_weight(float s, float m)
{
    return expf(s - m);
}

/* How a block's row (its running max m, sum l = Σ exp(s_j - m) and
 * unnormalised acc = Σ exp(s_j - m)·v_j) joins the row's out and lse so far:
 * out = old_scale·out + new_scale·acc, lse = lse. */
typedef struct attn_merge_weights {
    float old_scale, new_scale, lse;
} attn_merge_weights;

/* old_lse -inf: the row has seen no key before this block; its out is not
 * read (new out = acc / l). l 0: the block has no key the row sees; out
 * and lse stay as they are (the caller leaves them alone, or, for a first
 * block, writes 0 and -inf: old_scale·0 + 0·acc). */
static __host__ __device__ inline attn_merge_weights attn_merge(float old_lse, float m, float l)
{
    attn_merge_weights w;
    if (!(l > 0.0f)) {
        w.old_scale = 1.0f;
        w.new_scale = 0.0f;
        w.lse = old_lse;
        return w;
    }
    const float block_lse = m + logf(l);
    if (old_lse == -INFINITY) {
        w.old_scale = 0.0f;
        w.new_scale = 1.0f / l;
        w.lse = block_lse;
        return w;
    }
    const float top = old_lse > block_lse ? old_lse : block_lse;
    w.lse = top + logf(expf(old_lse - top) + expf(block_lse - top));
    w.old_scale = expf(old_lse - w.lse);
    /* exp(block_lse - lse) / l = exp(m - lse) */
    w.new_scale = expf(m - w.lse);
    return w;
}

/* The backward's probability of a visible key from the final lse; a row
 * that saw no key anywhere (lse -inf) has out 0 and passes no gradient. */
static __host__ __device__ inline float attn_probability(float s, float lse)
{
    return isfinite(lse) ? expf(s - lse) : 0.0f;
}

/* dS = P ∘ (dP - D), D = dout·out of the row */
static __host__ __device__ inline float attn_score_grad(float p, float dp, float delta)
{
    return p * (dp - delta);
}

#endif
