/* AdamW exactly as llm.c's update, and the learning-rate schedule. */
#include <math.h>

#include "loom/strategy.h"
#include "loom/tensor.h"
#include "model/compute.h"
#include "model/kernel_time.h"
#include "model/kernels.h"
#include "model/optimizer.h"
#include "runtime/log.h"
#include "runtime/memory.h"

/* One step's constants and buffers, for the spans the kernels' threads
 * take (each element is independent: any split gives the same bits). */
typedef struct adamw_call {
    float lr, b1, b2, one_minus_b1, one_minus_b2, bias1, bias2, eps, weight_decay, grad_scale;
    float *master, *m, *v;
    const void *grad;
    loom_dtype grad_dtype;
    void *params; /* NULL: the master weights are the parameters */
    loom_dtype params_dtype;
} adamw_call;

/* llm.c's update of n elements, f32 gradients; blocked by 16 so the
 * compiler vectorises it, each element computed as the scalar formula. */
LOOM_INLINE void adamw_values_loop(const adamw_call *k, float *restrict master,
                                   const float *restrict grad, float *restrict m, float *restrict v,
                                   size_t n)
{
    const float lr = k->lr, b1 = k->b1, b2 = k->b2, c1 = k->one_minus_b1, c2 = k->one_minus_b2;
    const float bias1 = k->bias1, bias2 = k->bias2, eps = k->eps, wd = k->weight_decay;
    const float scale = k->grad_scale;
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) {
            float g = grad[i + l] * scale;
            float mi = b1 * m[i + l] + c1 * g;
            float vi = b2 * v[i + l] + c2 * g * g;
            float m_hat = mi / bias1;
            float v_hat = vi / bias2;
            m[i + l] = mi;
            v[i + l] = vi;
            master[i + l] -= lr * (m_hat / (sqrtf(v_hat) + eps) + wd * master[i + l]);
        }
    for (; i < n; i++) {
        float g = grad[i] * scale;
        float mi = b1 * m[i] + c1 * g;
        float vi = b2 * v[i] + c2 * g * g;
        float m_hat = mi / bias1;
        float v_hat = vi / bias2;
        m[i] = mi;
        v[i] = vi;
        master[i] -= lr * (m_hat / (sqrtf(v_hat) + eps) + wd * master[i]);
    }
}
LOOM_WIDE_LOOP(adamw_values,
               (const adamw_call *k, float *restrict master, const float *restrict grad,
                float *restrict m, float *restrict v, size_t n),
               (k, master, grad, m, v, n))

/* A block at a time, so that 16-bit gradients widen and the updated
 * weights are stored into the parameters while the block is in cache. */
#define ADAMW_BLOCK 1024

static void adamw_span(void *ctx, size_t begin, size_t end)
{
    const adamw_call *k = ctx;
    if (k->grad_dtype == LOOM_F32 && !k->params) {
        adamw_values(k, k->master + begin, (const float *)k->grad + begin, k->m + begin,
                     k->v + begin, end - begin);
        return;
    }
    const size_t gsize = loom_dtype_size(k->grad_dtype), psize = loom_dtype_size(k->params_dtype);
    float g[ADAMW_BLOCK];
    for (size_t i = begin; i < end; i += ADAMW_BLOCK) {
        size_t n = end - i < ADAMW_BLOCK ? end - i : ADAMW_BLOCK;
        const void *grad = (const char *)k->grad + i * gsize;
        if (k->grad_dtype != LOOM_F32) /* widens exactly */
            loom_convert(g, LOOM_F32, grad, k->grad_dtype, n);
        adamw_values(k, k->master + i, k->grad_dtype == LOOM_F32 ? grad : g, k->m + i, k->v + i,
                     n);
        if (k->params)
            loom_convert((char *)k->params + i * psize, k->params_dtype, k->master + i, LOOM_F32,
                         n);
    }
}

/* params: where the updated weights are also stored, as params_dtype
 * (NULL, or the master weights themselves: nowhere). */
static void adamw(const loom_optimizer_step *s, float *master, const void *grad,
                  loom_dtype grad_dtype, float *m, float *v, size_t n, void *params,
                  loom_dtype params_dtype)
{
    adamw_call k = {.lr = s->lr, .b1 = s->beta1, .b2 = s->beta2,
                    .one_minus_b1 = 1.0f - s->beta1, .one_minus_b2 = 1.0f - s->beta2,
                    .bias1 = 1.0f - powf(s->beta1, (float)s->step),
                    .bias2 = 1.0f - powf(s->beta2, (float)s->step), .eps = s->eps,
                    .weight_decay = s->weight_decay, .grad_scale = s->grad_scale,
                    .master = master, .m = m, .v = v, .grad = grad, .grad_dtype = grad_dtype,
                    .params = params != (void *)master ? params : NULL,
                    .params_dtype = params_dtype};
    loom_kernels_for_spans(n, adamw_span, &k);
}

/* Elements a step on offloaded state copies through host memory at a
 * time: each element is independent, so any split gives the same bits. */
#define OFFLOAD_CHUNK ((size_t)1 << 20)

/* A host view of bytes of the device buffer at p (p itself when it is host
 * memory), in scratch; read: copy its values in. */
static int host_view(const loom_backend *b, void *p, size_t bytes, char **scratch, int read,
                     void **view)
{
    if (!p || !loom_mem_is_device(p)) {
        *view = p;
        return LOOM_OK;
    }
    *view = *scratch;
    *scratch += (bytes + 63) / 64 * 64;
    return read ? b->ops->to_host(b->self, *view, p, bytes) : LOOM_OK;
}

static int host_writeback(const loom_backend *b, void *p, const void *view, size_t bytes)
{
    return p && view != p ? b->ops->to_device(b->self, p, view, bytes) : LOOM_OK;
}

/* ZeRO-Offload: the state memory.offload moved off the device is host
 * memory, so the step is the CPU's AdamW (the cpu backend's bits) on host
 * views, a chunk at a time: the gradient (and any state still on the
 * device) copied over, the updated state and parameters copied back. */
static int adamw_offloaded(const loom_backend *b, const loom_optimizer_step *s, float *master,
                           const void *grad, loom_dtype grad_dtype, float *m, float *v, size_t n,
                           void *params, loom_dtype params_dtype)
{
    size_t gsize = loom_dtype_size(grad_dtype), psize = loom_dtype_size(params_dtype);
    if (params == (void *)master)
        params = NULL;
    size_t chunk = n < OFFLOAD_CHUNK ? n : OFFLOAD_CHUNK;
    size_t each = 3 * sizeof(float) + gsize + (params ? psize : 0);
    char *scratch = NULL;
    int rc = loom_mem_alloc(loom_mem_staging_tier(), LOOM_PURPOSE_COMM, chunk * each + 5 * 64,
                            (void **)&scratch);
    if (rc != LOOM_OK)
        return rc;
    rc = b->ops->synchronize(b->self); /* the gradient's producers have finished */
    for (size_t i = 0; i < n && rc == LOOM_OK; i += chunk) {
        size_t k = n - i < chunk ? n - i : chunk;
        char *next = scratch;
        void *hm = NULL, *hg = NULL, *hmm = NULL, *hv = NULL, *hp = NULL;
        float *dm = master + i, *dmm = m + i, *dv = v + i;
        const char *dg = (const char *)grad + i * gsize;
        char *dp = params ? (char *)params + i * psize : NULL;
        if ((rc = host_view(b, dm, k * sizeof(float), &next, 1, &hm)) != LOOM_OK ||
            (rc = host_view(b, (void *)dg, k * gsize, &next, 1, &hg)) != LOOM_OK ||
            (rc = host_view(b, dmm, k * sizeof(float), &next, 1, &hmm)) != LOOM_OK ||
            (rc = host_view(b, dv, k * sizeof(float), &next, 1, &hv)) != LOOM_OK ||
            (rc = host_view(b, dp, k * psize, &next, 0, &hp)) != LOOM_OK)
            break;
        adamw(s, hm, hg, grad_dtype, hmm, hv, k, hp, params_dtype);
        if ((rc = host_writeback(b, dm, hm, k * sizeof(float))) != LOOM_OK ||
            (rc = host_writeback(b, dmm, hmm, k * sizeof(float))) != LOOM_OK ||
            (rc = host_writeback(b, dv, hv, k * sizeof(float))) != LOOM_OK)
            break;
        rc = host_writeback(b, dp, hp, k * psize);
    }
    loom_mem_free(scratch);
    return rc;
}

/* The step on the run's backend (model/compute.h): the buffers are its
 * memory, which only its calls may touch. The cpu backend's adamw is the
 * function above; another's is called through its table, unless the
 * optimizer state was offloaded to host memory. */
static void adamw_on_backend(const loom_optimizer_step *s, float *master, const void *grad,
                             loom_dtype grad_dtype, float *m, float *v, size_t n, void *params,
                             loom_dtype params_dtype)
{
    const loom_backend *b = loom_backend_current();
    if (!b || b->ops == &loom_compute_cpu) {
        adamw(s, master, grad, grad_dtype, m, v, n, params, params_dtype);
        return;
    }
    if (b->ops->tier == LOOM_TIER_DEVICE && n &&
        (!loom_mem_is_device(master) || !loom_mem_is_device(m) || !loom_mem_is_device(v))) {
        int rc = adamw_offloaded(b, s, master, grad, grad_dtype, m, v, n, params, params_dtype);
        if (rc != LOOM_OK)
            loom_log(LOOM_LOG_ERROR, "optimizer: the step on state offloaded from the %s "
                     "backend failed: %s", b->name, loom_last_error());
        return;
    }
    const loom_compute_adamw k = {.step = s->step, .lr = s->lr, .beta1 = s->beta1,
                                  .beta2 = s->beta2, .eps = s->eps,
                                  .weight_decay = s->weight_decay, .grad_scale = s->grad_scale};
    int rc = b->ops->adamw(b->self, &k, master, grad, grad_dtype, m, v, n,
                           params != (void *)master ? params : NULL, params_dtype);
    if (rc != LOOM_OK)
        loom_log(LOOM_LOG_ERROR, "optimizer: the %s backend's adamw failed: %s", b->name,
                 loom_last_error());
}

void loom_adamw_update(const loom_optimizer_step *s, float *master, const void *grad,
                       loom_dtype grad_dtype, float *m, float *v, size_t n)
{
    loom_kernel_time_begin(LOOM_KERNEL_OPTIMIZER);
    adamw_on_backend(s, master, grad, grad_dtype, m, v, n, NULL, LOOM_F32);
    loom_kernel_time_end();
}

void loom_adamw_update_range_all(const loom_optimizer_step *s, const loom_unit *unit,
                                 size_t offset, float *master, const void *grad,
                                 loom_dtype grad_dtype, float *m, float *v, size_t n)
{
    loom_adamw_update_range_store_all(s, unit, offset, master, grad, grad_dtype, m, v, n, NULL,
                                      LOOM_F32);
}

void loom_adamw_update_range_store_all(const loom_optimizer_step *s, const loom_unit *unit,
                                       size_t offset, float *master, const void *grad,
                                       loom_dtype grad_dtype, float *m, float *v, size_t n,
                                       void *params, loom_dtype params_dtype)
{
    (void)unit;
    (void)offset;
    loom_kernel_time_begin(LOOM_KERNEL_OPTIMIZER);
    adamw_on_backend(s, master, grad, grad_dtype, m, v, n, params, params_dtype);
    loom_kernel_time_end();
}

void loom_adamw_apply(const loom_compute_adamw *step, float *master, const void *grad,
                      loom_dtype grad_dtype, float *m, float *v, size_t n, void *params,
                      loom_dtype params_dtype)
{
    const loom_optimizer_step s = {.step = step->step, .lr = step->lr, .beta1 = step->beta1,
                                   .beta2 = step->beta2, .eps = step->eps,
                                   .weight_decay = step->weight_decay,
                                   .grad_scale = step->grad_scale};
    loom_kernel_time_begin(LOOM_KERNEL_OPTIMIZER);
    adamw(&s, master, grad, grad_dtype, m, v, n, params, params_dtype);
    loom_kernel_time_end();
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
    loom_adamw_update_range_store_matrices(s, unit, offset, master, grad, grad_dtype, m, v, n,
                                           NULL, LOOM_F32);
}

void loom_adamw_update_range_store_matrices(const loom_optimizer_step *s, const loom_unit *unit,
                                            size_t offset, float *master, const void *grad,
                                            loom_dtype grad_dtype, float *m, float *v, size_t n,
                                            void *params, loom_dtype params_dtype)
{
    loom_optimizer_step plain = *s;
    plain.weight_decay = 0.0f;
    size_t esize = loom_dtype_size(grad_dtype), psize = loom_dtype_size(params_dtype);
    size_t end = offset + n;
    loom_kernel_time_begin(LOOM_KERNEL_OPTIMIZER);
    for (size_t i = offset, until; i < end; i = until) {
        const loom_optimizer_step *step = decays_until(unit, i, end, &until) ? s : &plain;
        size_t k = i - offset;
        adamw_on_backend(step, master + k, (const char *)grad + k * esize, grad_dtype, m + k,
                         v + k, until - i, params ? (char *)params + k * psize : NULL,
                         params_dtype);
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
