/* AdamW exactly as llm.c's update, and the learning-rate schedule. */
#include <math.h>

#include "loom/strategy.h"
#include "loom/tensor.h"
#include "model/kernel_time.h"
#include "model/optimizer.h"

static void adamw(const loom_optimizer_step *s, float *master, const void *grad,
                  loom_dtype grad_dtype, float *m, float *v, size_t n)
{
    float b1 = s->beta1, b2 = s->beta2;
    float bias1 = 1.0f - powf(b1, (float)s->step);
    float bias2 = 1.0f - powf(b2, (float)s->step);
    for (size_t i = 0; i < n; i++) {
        float g;
        if (grad_dtype == LOOM_F32)
            g = ((const float *)grad)[i];
        else if (grad_dtype == LOOM_BF16)
            g = loom_bf16_to_f32(((const uint16_t *)grad)[i]);
        else
            g = loom_f16_to_f32(((const uint16_t *)grad)[i]);
        g *= s->grad_scale;
        float mi = b1 * m[i] + (1.0f - b1) * g;
        float vi = b2 * v[i] + (1.0f - b2) * g * g;
        float m_hat = mi / bias1;
        float v_hat = vi / bias2;
        m[i] = mi;
        v[i] = vi;
        master[i] -= s->lr * (m_hat / (sqrtf(v_hat) + s->eps) + s->weight_decay * master[i]);
    }
}

void loom_adamw_update(const loom_optimizer_step *s, float *master, const void *grad,
                       loom_dtype grad_dtype, float *m, float *v, size_t n)
{
    loom_kernel_time_begin(LOOM_KERNEL_OPTIMIZER);
    adamw(s, master, grad, grad_dtype, m, v, n);
    loom_kernel_time_end();
}

void loom_adamw_update_range_all(const loom_optimizer_step *s, const loom_unit *unit,
                                 size_t offset, float *master, const void *grad,
                                 loom_dtype grad_dtype, float *m, float *v, size_t n)
{
    (void)unit;
    (void)offset;
    loom_adamw_update(s, master, grad, grad_dtype, m, v, n);
}

/* Whether element i of the unit's flat buffer lies in a tensor that decays,
 * and where the run of elements like it ends (at most end). */
static int decays_until(const loom_unit *unit, size_t i, size_t end, size_t *until)
{
    size_t next = end; /* the next tensor's start past i: where padding ends */
    for (int k = 0; k < unit->ntensors; k++) {
        const loom_param_desc *d = &unit->tensors[k];
        if (i >= d->offset && i < d->offset + d->count) {
            *until = d->offset + d->count < end ? d->offset + d->count : end;
            return d->ndim >= 2;
        }
        if (d->offset > i && d->offset < next)
            next = d->offset;
    }
    *until = next;
    return 0;
}

void loom_adamw_update_range_matrices(const loom_optimizer_step *s, const loom_unit *unit,
                                      size_t offset, float *master, const void *grad,
                                      loom_dtype grad_dtype, float *m, float *v, size_t n)
{
    loom_optimizer_step plain = *s;
    plain.weight_decay = 0.0f;
    size_t esize = loom_dtype_size(grad_dtype), end = offset + n;
    loom_kernel_time_begin(LOOM_KERNEL_OPTIMIZER);
    for (size_t i = offset, until; i < end; i = until) {
        const loom_optimizer_step *step = decays_until(unit, i, end, &until) ? s : &plain;
        size_t k = i - offset;
        adamw(step, master + k, (const char *)grad + k * esize, grad_dtype, m + k, v + k,
              until - i);
    }
    loom_kernel_time_end();
}

float loom_lr_at(const loom_lr_schedule *s, int64_t step)
{
    if (step < s->warmup)
        return s->lr * (float)(step + 1) / (float)s->warmup;
    if (!s->cosine || s->steps <= s->warmup)
        return s->lr;
    double progress = (double)(step - s->warmup) / (double)(s->steps - s->warmup);
    double coeff = 0.5 * (1.0 + cos(M_PI * progress));
    double final_lr = s->lr * s->final_frac;
    return (float)(final_lr + coeff * (s->lr - final_lr));
}
