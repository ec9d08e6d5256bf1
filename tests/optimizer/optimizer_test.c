/* AdamW against the update written out by hand, weight decay on the
 * matrices only (train.decay = "matrices") over a range that crosses
 * tensors and padding, update_range_store against update_range and then
 * loom_from_f32, and the learning-rate schedule's warm-up and cosine
 * values. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/strategy.h"
#include "loom/tensor.h"
#include "model/kernels.h"
#include "model/optimizer.h"

static int failures;
#define NEAR(a, b, tol)                                                                  \
    do {                                                                                 \
        double a_ = (a), b_ = (b);                                                       \
        if (fabs(a_ - b_) > (tol) * fmax(1.0, fabs(b_))) {                               \
            printf("FAIL line %d: %s = %.9g, want %.9g\n", __LINE__, #a, a_, b_);       \
            failures++;                                                                  \
        }                                                                                \
    } while (0)

int main(void)
{
    loom_optimizer_step s = {.step = 1, .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                             .weight_decay = 0.1f, .grad_scale = 0.5f, .update = loom_adamw_update,
                             .update_range = loom_adamw_update_range_all};
    float p[2] = {1.0f, -2.0f}, g[2] = {0.4f, -3.0f}, m[2] = {0, 0}, v[2] = {0, 0};
    loom_adamw_update(&s, p, g, LOOM_F32, m, v, 2);
    /* step 1: bias correction makes m_hat = g', v_hat = g'^2 with g' = 0.5 g */
    for (int i = 0; i < 2; i++) {
        double gs = 0.5 * (i ? -3.0 : 0.4), p0 = i ? -2.0 : 1.0;
        NEAR(m[i], 0.1 * gs, 1e-6);
        NEAR(v[i], 0.05 * gs * gs, 1e-6);
        NEAR(p[i], p0 - 1e-2 * (gs / (fabs(gs) + 1e-8) + 0.1 * p0), 1e-6);
    }
    /* step 2 from that state, the general formula */
    s.step = 2;
    float p1 = p[0], m1 = m[0], v1 = v[0];
    loom_adamw_update(&s, p, g, LOOM_F32, m, v, 1);
    double gs = 0.2, mm = 0.9 * m1 + 0.1 * gs, vv = 0.95 * v1 + 0.05 * gs * gs;
    double mh = mm / (1 - 0.81), vh = vv / (1 - 0.9025);
    NEAR(p[0], p1 - 1e-2 * (mh / (sqrt(vh) + 1e-8) + 0.1 * p1), 1e-6);
    /* 16-bit gradients read the same as their fp32 values */
    uint16_t gb[1] = {loom_f32_to_bf16(0.5f)}, gh[1] = {loom_f32_to_f16(0.5f)};
    float pb = 1, mb = 0, vb = 0, ph = 1, mh2 = 0, vh2 = 0, pf = 1, mf = 0, vf = 0, gf = 0.5f;
    s.step = 1;
    loom_adamw_update(&s, &pb, gb, LOOM_BF16, &mb, &vb, 1);
    loom_adamw_update(&s, &ph, gh, LOOM_F16, &mh2, &vh2, 1);
    loom_adamw_update(&s, &pf, &gf, LOOM_F32, &mf, &vf, 1);
    NEAR(pb, pf, 0);
    NEAR(ph, pf, 0);

    /* A unit of a 2x2 matrix, a bias of 3, 3 elements of padding and a 1x2
     * matrix, stepped from element 2 to 11: elements 2, 3, 10 and 11
     * decay, the bias and the padding do not. */
    loom_param_desc descs[3] = {
        {.name = "w", .offset = 0, .count = 4, .ndim = 2, .shape = {2, 2}},
        {.name = "b", .offset = 4, .count = 3, .ndim = 1, .shape = {3}},
        {.name = "w2", .offset = 10, .count = 2, .ndim = 2, .shape = {1, 2}},
    };
    loom_unit unit = {.ntensors = 3, .tensors = descs, .numel = 12};
    float pr[10], gr[10];
    for (int i = 0; i < 10; i++) {
        pr[i] = 1.0f + 0.25f * (float)i;
        gr[i] = (i % 2 ? -0.3f : 0.7f) * (float)(i + 1);
    }
    s.step = 1;
    for (int split = 0; split < 2; split++) {
        float q[10], mq[10] = {0}, vq[10] = {0};
        for (int i = 0; i < 10; i++)
            q[i] = pr[i];
        if (split) { /* the same range in two calls, cut inside the bias */
            loom_adamw_update_range_matrices(&s, &unit, 2, q, gr, LOOM_F32, mq, vq, 3);
            loom_adamw_update_range_matrices(&s, &unit, 5, q + 3, gr + 3, LOOM_F32, mq + 3, vq + 3, 7);
        } else {
            loom_adamw_update_range_matrices(&s, &unit, 2, q, gr, LOOM_F32, mq, vq, 10);
        }
        for (int i = 0; i < 10; i++) {
            int element = 2 + i, decays = element < 4 || element >= 10;
            double gi = 0.5 * gr[i];
            NEAR(q[i], pr[i] - 1e-2 * (gi / (fabs(gi) + 1e-8) + (decays ? 0.1 * pr[i] : 0.0)),
                 1e-6);
        }
    }
    /* "all" decays every element, whatever the unit says */
    float qa[10], ma[10] = {0}, va[10] = {0};
    for (int i = 0; i < 10; i++)
        qa[i] = pr[i];
    loom_adamw_update_range_all(&s, &unit, 2, qa, gr, LOOM_F32, ma, va, 10);
    for (int i = 0; i < 10; i++) {
        double gi = 0.5 * gr[i];
        NEAR(qa[i], pr[i] - 1e-2 * (gi / (fabs(gi) + 1e-8) + 0.1 * pr[i]), 1e-6);
    }

    /* update_range_store: the same master, m and v bit for bit as
     * update_range, and params exactly what loom_from_f32 then writes;
     * 3000 elements of a unit cross the blocks it stores by at odd places */
    enum { BIG = 3000 };
    loom_param_desc big_descs[2] = {
        {.name = "w", .offset = 0, .count = 2048, .ndim = 2, .shape = {32, 64}},
        {.name = "b", .offset = 2048, .count = 1100, .ndim = 1, .shape = {1100}},
    };
    loom_unit big = {.ntensors = 2, .tensors = big_descs, .numel = 3148};
    float *p0 = malloc(BIG * sizeof(float)), *g0 = malloc(BIG * sizeof(float));
    float *ref[3], *got[3]; /* master, m, v */
    /* want and params have room for f32, which loom_from_f32 could be asked for */
    uint16_t *g16 = malloc(BIG * 2), *want = malloc(BIG * 4), *params = malloc(BIG * 4);
    for (int i = 0; i < BIG; i++) {
        p0[i] = sinf(0.37f * (float)i);
        g0[i] = cosf(0.11f * (float)i) * 0.01f;
    }
    loom_convert(g16, LOOM_BF16, g0, LOOM_F32, BIG);
    for (int k = 0; k < 3; k++) {
        ref[k] = malloc(BIG * sizeof(float));
        got[k] = malloc(BIG * sizeof(float));
    }
    const loom_dtype params_types[2] = {LOOM_BF16, LOOM_F16};
    int stored_ok = 1;
    for (int matrices = 0; matrices < 2; matrices++)
        for (int gt = 0; gt < 2; gt++)
            for (int pt = 0; pt < 2; pt++) {
                const void *grad = gt ? (const void *)g16 : g0;
                loom_dtype gdt = gt ? LOOM_BF16 : LOOM_F32, pdt = params_types[pt];
                for (int k = 0; k < 3; k++) {
                    memcpy(ref[k], k ? g0 : p0, BIG * sizeof(float)); /* m, v: any start */
                    memcpy(got[k], ref[k], BIG * sizeof(float));
                }
                s.step = 4;
                if (matrices) {
                    loom_adamw_update_range_matrices(&s, &big, 100, ref[0], grad, gdt, ref[1],
                                                     ref[2], BIG);
                    loom_adamw_update_range_store_matrices(&s, &big, 100, got[0], grad, gdt,
                                                           got[1], got[2], BIG, params, pdt);
                } else {
                    loom_adamw_update_range_all(&s, &big, 100, ref[0], grad, gdt, ref[1], ref[2],
                                                BIG);
                    loom_adamw_update_range_store_all(&s, &big, 100, got[0], grad, gdt, got[1],
                                                      got[2], BIG, params, pdt);
                }
                loom_from_f32(want, pdt, ref[0], BIG);
                for (int k = 0; k < 3; k++)
                    stored_ok &= memcmp(ref[k], got[k], BIG * sizeof(float)) == 0;
                stored_ok &= memcmp(want, params, BIG * 2) == 0;
                if (!stored_ok) {
                    printf("FAIL: update_range_store (%s, %s gradients, %s parameters) differs "
                           "from update_range and loom_from_f32\n",
                           matrices ? "matrices" : "all", loom_dtype_name(gdt),
                           loom_dtype_name(pdt));
                    failures++;
                    stored_ok = 1;
                }
            }
    /* params NULL or the master weights themselves: nothing stored */
    memcpy(ref[0], p0, BIG * sizeof(float));
    memcpy(got[0], p0, BIG * sizeof(float));
    memset(ref[1], 0, BIG * sizeof(float));
    memset(ref[2], 0, BIG * sizeof(float));
    memset(got[1], 0, BIG * sizeof(float));
    memset(got[2], 0, BIG * sizeof(float));
    loom_adamw_update_range_all(&s, &big, 0, ref[0], g0, LOOM_F32, ref[1], ref[2], BIG);
    loom_adamw_update_range_store_all(&s, &big, 0, got[0], g0, LOOM_F32, got[1], got[2], BIG,
                                      got[0], LOOM_F32);
    if (memcmp(ref[0], got[0], BIG * sizeof(float))) {
        printf("FAIL: update_range_store into the master weights themselves changed them\n");
        failures++;
    }
    for (int k = 0; k < 3; k++) {
        free(ref[k]);
        free(got[k]);
    }
    free(p0), free(g0), free(g16), free(want), free(params);

    loom_lr_schedule c = {1e-3f, 10, 110, 1, 0.1f};
    NEAR(loom_lr_at(&c, 0), 1e-4, 1e-6);           /* warm-up: lr * 1/10 */
    NEAR(loom_lr_at(&c, 9), 1e-3, 1e-6);           /* end of warm-up */
    NEAR(loom_lr_at(&c, 10), 1e-3, 1e-6);          /* cosine starts at the peak */
    NEAR(loom_lr_at(&c, 60), 0.55e-3, 1e-6);       /* halfway: (peak + final) / 2 */
    NEAR(loom_lr_at(&c, 110), 1e-4, 1e-6);         /* the end: lr * final_frac */
    loom_lr_schedule k = {1e-3f, 0, 100, 0, 0};
    NEAR(loom_lr_at(&k, 57), 1e-3, 1e-7);          /* constant */
    printf("%s\n", failures ? "FAILED" : "optimizer: ok");
    return failures != 0;
}
