/* compute-cuda's attention math (plugins/compute-cuda/attention_math.cuh)
 * on the host, no GPU needed: one row's online softmax over tiles of keys
 * and the merge of two blocks of keys into (out, lse), as the kernels do
 * them, against a direct double-precision softmax; a row that sees no key
 * of a block, or of any; the backward's probabilities and score gradients
 * against the softmax's Jacobian.
 *
 *   nvcc -std=c++17 -Iplugins/compute-cuda tests/compute/cuda_attention_host_test.cu \
 *        -o cuda_attention_host_test && ./cuda_attention_host_test
 *
 * The whole kernels are checked on emulated threads by
 * cuda_attention_emulation.cpp. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "attention_math.cuh"

enum { HS = 3, NK = 11, TILE = 4 };

static int failures;

static void expect_close(const char *what, int i, double got, double want, double tol)
{
    const int same = isinf(want) ? got == want : fabs(got - want) <= tol * fmax(1.0, fabs(want));
    if (!same) {
        fprintf(stderr, "FAIL %s[%d] = %.9g, want %.9g\n", what, i, got, want);
        failures++;
    }
}

/* One row's block as the forward kernel computes it: keys [j0, j1) in
 * tiles of TILE, the running max m, sum l and unnormalised acc. */
static void online_block(const float *s, const int *k_pos, int q_pos, const float (*v)[HS],
                         int j0, int j1, float *m, float *l, float *acc)
{
    *m = -INFINITY;
    *l = 0.0f;
    for (int d = 0; d < HS; d++)
        acc[d] = 0.0f;
    for (int t0 = j0; t0 < j1; t0 += TILE) {
        const int t1 = t0 + TILE < j1 ? t0 + TILE : j1;
        float tile_max = -INFINITY;
        for (int j = t0; j < t1; j++)
            if (attn_visible(k_pos[j], q_pos))
                tile_max = fmaxf(tile_max, s[j]);
        const float m_new = fmaxf(*m, tile_max);
        const float alpha = attn_rescale(*m, m_new);
        float sum = 0.0f, pv[HS] = {0};
        for (int j = t0; j < t1; j++) {
            const float w = attn_visible(k_pos[j], q_pos) ? attn_weight(s[j], m_new) : 0.0f;
            sum += w;
            for (int d = 0; d < HS; d++)
                pv[d] += w * v[j][d];
        }
        *l = *l * alpha + sum;
        *m = m_new;
        for (int d = 0; d < HS; d++)
            acc[d] = acc[d] * alpha + pv[d];
    }
}

/* Merge as the kernel's epilogue: first block overwrites (out 0, lse -inf
 * when it sees nothing), a later one the row sees nothing of leaves them. */
static void merge(float *out, float *lse, int first_block, float m, float l, const float *acc)
{
    const float old_lse = first_block ? -INFINITY : *lse;
    if (!first_block && !(l > 0.0f))
        return;
    const attn_merge_weights w = attn_merge(old_lse, m, l);
    for (int d = 0; d < HS; d++)
        out[d] = (old_lse != -INFINITY ? w.old_scale * out[d] : 0.0f) + w.new_scale * acc[d];
    *lse = w.lse;
}

/* A query at q_pos against keys [0, split) then [split, NK) */
static void check_row(const char *what, const float *s, const int *k_pos, int q_pos,
                      const float (*v)[HS], int split)
{
    /* garbage in out and lse before a first block */
    float out[HS] = {NAN, NAN, NAN}, lse = NAN, m, l, acc[HS];
    online_block(s, k_pos, q_pos, v, 0, split, &m, &l, acc);
    merge(out, &lse, 1, m, l, acc);
    online_block(s, k_pos, q_pos, v, split, NK, &m, &l, acc);
    merge(out, &lse, 0, m, l, acc);

    double top = -INFINITY, sum = 0, ref[HS] = {0};
    for (int j = 0; j < NK; j++)
        if (k_pos[j] <= q_pos)
            top = fmax(top, s[j]);
    for (int j = 0; j < NK; j++)
        if (k_pos[j] <= q_pos) {
            const double w = exp((double)s[j] - top);
            sum += w;
            for (int d = 0; d < HS; d++)
                ref[d] += w * v[j][d];
        }
    const double ref_lse = top == -INFINITY ? -INFINITY : top + log(sum);
    char name[96];
    snprintf(name, sizeof name, "%s: out", what);
    for (int d = 0; d < HS; d++)
        expect_close(name, d, out[d], top == -INFINITY ? 0.0 : ref[d] / sum, 1e-6);
    snprintf(name, sizeof name, "%s: lse", what);
    expect_close(name, 0, lse, ref_lse, 1e-6);

    /* backward of the row: dS_j = P_j (dP_j - D) is the softmax's
     * Jacobian applied to dP, Σ_k P_j (δ_jk - P_k) dP_k */
    const float dp[NK] = {0.3f, -1.2f, 0.7f, 0.05f, 2.0f, -0.4f, 1.1f, -0.9f, 0.2f, 0.6f, -1.5f};
    double D = 0, p_ref[NK];
    for (int j = 0; j < NK; j++) {
        p_ref[j] = k_pos[j] <= q_pos ? exp((double)s[j] - ref_lse) : 0.0;
        D += p_ref[j] * dp[j];
    }
    for (int j = 0; j < NK; j++) {
        const float p = attn_visible(k_pos[j], q_pos) ? attn_probability(s[j], lse) : 0.0f;
        snprintf(name, sizeof name, "%s: P", what);
        expect_close(name, j, p, p_ref[j], 1e-6);
        double jac = 0;
        for (int k = 0; k < NK; k++)
            jac += p_ref[j] * ((j == k) - p_ref[k]) * dp[k];
        snprintf(name, sizeof name, "%s: dS", what);
        expect_close(name, j, attn_score_grad(p, dp[j], (float)D), jac, 1e-5);
    }
}

int main(void)
{
    const float s[NK] = {0.5f, -1.0f, 3.0f, 2.5f, -0.25f, 1.75f, 0.0f, -3.0f, 4.0f, 0.8f, -2.2f};
    const int k_pos[NK] = {7, 0, 3, 9, 1, 12, 4, 5, 20, 2, 8}; /* out of order, as zigzag's */
    float v[NK][HS];
    for (int j = 0; j < NK; j++)
        for (int d = 0; d < HS; d++)
            v[j][d] = (float)((j * 7 + d * 3) % 11) / 5.0f - 1.0f;
    check_row("sees all", s, k_pos, 100, (const float(*)[HS])v, 5);
    check_row("causal cut", s, k_pos, 6, (const float(*)[HS])v, 5);
    /* keys 0..4 are at 7, 0, 3, 9, 1: a query at 0 sees key 1 in the first
     * block alone; keys 5..10 are at 12, 4, 5, 20, 2, 8 */
    check_row("nothing in the second block", s, k_pos, 0, (const float(*)[HS])v, 5);
    /* a query at 2 sees keys 1, 4 in the first block and 9 in the second;
     * split at 1: the first block (key 0 at 7) holds nothing it sees */
    check_row("nothing in the first block", s, k_pos, 2, (const float(*)[HS])v, 1);
    check_row("no key at all", s, k_pos, -1, (const float(*)[HS])v, 5);
    /* an old lse far below the block's, and far above */
    attn_merge_weights w = attn_merge(-200.0f, 0.0f, 1.0f);
    expect_close("merge, old tiny: lse", 0, w.lse, 0.0, 1e-6);
    expect_close("merge, old tiny: new", 0, w.new_scale, 1.0, 1e-6);
    w = attn_merge(200.0f, 0.0f, 1.0f);
    expect_close("merge, old huge: lse", 0, w.lse, 200.0, 1e-6);
    expect_close("merge, old huge: old", 0, w.old_scale, 1.0, 1e-6);
    expect_close("rescale before any key", 0, attn_rescale(-INFINITY, -INFINITY), 1.0, 0);
    expect_close("rescale from no key", 0, attn_rescale(-INFINITY, 2.0f), 0.0, 0);
    expect_close("probability of a row with no key", 0, attn_probability(1.0f, -INFINITY), 0.0,
                 0);
    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("attention math: all checks pass\n");
    return 0;
}
