/* AdamW against the update written out by hand, and the learning-rate
 * schedule's warm-up and cosine values. */
#include <math.h>
#include <stdio.h>

#include "loom/strategy.h"
#include "loom/tensor.h"
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
    loom_optimizer_step s = {1, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, loom_adamw_update};
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
