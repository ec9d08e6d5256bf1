/* plugins/common — what several strategy plugins (plugins/strategy) do
 * alike. Built on the ABI headers alone: each plugin is a .so of its own
 * that links no loom library, so each gets its own copy (of this header,
 * and of loom_plugin_common for common/compute.h). */
#ifndef LOOM_PLUGIN_COMMON_STRATEGY_H
#define LOOM_PLUGIN_COMMON_STRATEGY_H

#include <stdlib.h>
#include <string.h>

#include "common/compute.h"
#include "loom/strategy.h"

/* For messages: a unit's name, or "?" when it has none. */
static inline const char *strategy_unit_name(const loom_unit *unit)
{
    return unit && unit->name ? unit->name : "?";
}

/* The group of the axis a strategy serves, after checking the core created
 * it for that axis. name: the plugin's, to start the messages. */
static inline int strategy_axis_group(const loom_host *host, const loom_strategy_setup *setup,
                                      const char *name, loom_axis axis, loom_group **out)
{
    if (!setup || setup->axis != axis)
        return host->error(host, LOOM_ERR_INVALID,
                           "%s: serves the %s axis, but was created for axis %s "
                           "(set parallel.<axis>.strategy to a strategy of that axis)",
                           name, loom_axis_name(axis), setup ? loom_axis_name(setup->axis) : "?");
    if (!setup->groups[axis])
        return host->error(host, LOOM_ERR_INVALID, "%s: the setup has no %s group (a core bug)",
                           name, loom_axis_name(axis));
    *out = setup->groups[axis];
    return LOOM_OK;
}

/* What a data strategy's data_setup needs of its arguments: units, all of
 * one compute dtype that is f32, bf16 or f16, and initial parameters for
 * each unit that has any. single_dtype_reason: why the strategy needs one
 * dtype, for the message. */
static inline int strategy_check_units(const loom_host *h, const char *name, const loom_unit *units,
                                       int nunits, float *const *init,
                                       const char *single_dtype_reason)
{
    if (nunits <= 0 || !units || !init)
        return h->error(h, LOOM_ERR_INVALID, "%s: data_setup needs at least one unit", name);
    loom_dtype dtype = units[0].compute_dtype;
    if (dtype != LOOM_F32 && dtype != LOOM_BF16 && dtype != LOOM_F16)
        return h->error(h, LOOM_ERR_INVALID,
                        "%s: unit '%s' computes in %s; %s supports f32, bf16 and f16", name,
                        strategy_unit_name(&units[0]), loom_dtype_name(dtype), name);
    for (int i = 1; i < nunits; i++)
        if (units[i].compute_dtype != dtype)
            return h->error(h, LOOM_ERR_INVALID,
                            "%s: unit '%s' computes in %s but unit '%s' in %s; %s", name,
                            strategy_unit_name(&units[i]),
                            loom_dtype_name(units[i].compute_dtype), strategy_unit_name(&units[0]),
                            loom_dtype_name(dtype), single_dtype_reason);
    for (int i = 0; i < nunits; i++)
        if (units[i].numel && !init[i])
            return h->error(h, LOOM_ERR_INVALID, "%s: no initial parameters for unit '%s'", name,
                            strategy_unit_name(&units[i]));
    return LOOM_OK;
}

/* Where unit sits in the units data_setup was given: the same struct, or a
 * copy of it (matched by index). -1 when neither. */
static inline int strategy_find_unit(const loom_unit *units, int nunits, const loom_unit *unit)
{
    for (int i = 0; i < nunits; i++)
        if (&units[i] == unit)
            return i;
    for (int i = 0; i < nunits; i++)
        if (units[i].index == unit->index)
            return i;
    return -1;
}

/* The hooks that read a step's gradients (grad_norm_sq, optimizer_step)
 * need them reduced over the dp group: data_setup done (set_up), and
 * data_finish_backward called after the last micro-batch (saw_last_micro:
 * not yet). reduced: how the strategy reduces, for the message. */
static inline int strategy_need_finished(const loom_host *h, const char *name, const char *hook,
                                         int set_up, int saw_last_micro, const char *reduced)
{
    if (!set_up)
        return h->error(h, LOOM_ERR_INVALID, "%s: %s before data_setup", name, hook);
    if (saw_last_micro)
        return h->error(h, LOOM_ERR_INVALID,
                        "%s: %s before data_finish_backward: the gradients of the last "
                        "micro-batch are not %s yet",
                        name, hook, reduced);
    return LOOM_OK;
}

/* sum plus the squares of n elements of g (dtype t). Eight running sums,
 * element i in sum i mod 8, added together at the end: one chain of
 * dependent additions ran at a quarter of the memory's speed (110 ms for
 * GPT-2 124M's gradients here, 30 ms so). The order is fixed by n alone,
 * so a buffer's sum is the same on every rank and every run. */
static inline double strategy_add_squares(double sum, const void *g, loom_dtype t, size_t n)
{
    enum { LANES = 8 };
    double lane[LANES] = {0};
    size_t whole = n - n % LANES;
    if (t == LOOM_F32) {
        const float *f = g;
        for (size_t i = 0; i < whole; i += LANES)
            for (int k = 0; k < LANES; k++)
                lane[k] += (double)f[i + k] * (double)f[i + k];
    } else if (t == LOOM_BF16) { /* apart: the switch inside loom_load_f32 stays in a loop */
        const uint16_t *h = g;
        for (size_t i = 0; i < whole; i += LANES)
            for (int k = 0; k < LANES; k++) {
                double x = loom_bf16_to_f32(h[i + k]);
                lane[k] += x * x;
            }
    } else {
        for (size_t i = 0; i < whole; i += LANES)
            for (int k = 0; k < LANES; k++) {
                double x = loom_load_f32(g, t, i + k);
                lane[k] += x * x;
            }
    }
    for (size_t i = whole; i < n; i++) {
        double x = loom_load_f32(g, t, i);
        lane[i % LANES] += x * x;
    }
    for (int k = 0; k < LANES; k++)
        sum += lane[k];
    return sum;
}

/* AdamW on n elements of unit from offset, then the updated master weights
 * stored into params as dtype (16-bit copies; params == master for fp32):
 * in one pass on a core with update_range_store (ABI 1.7), else
 * update_range, then a conversion (a core that old has no compute service:
 * host memory, which cannot fail). The buffers are the model's, as they
 * are: the core runs the update where they live. */
static inline void strategy_update_store(const loom_host *h, const loom_optimizer_step *step,
                                         const loom_unit *unit, size_t offset, float *master,
                                         const void *grad, float *m, float *v, size_t n,
                                         void *params, loom_dtype dtype)
{
    if (h->version >= 5 && step->update_range_store) {
        if (n)
            step->update_range_store(step, unit, offset, master, grad, dtype, m, v, n, params,
                                     dtype);
        return;
    }
    if (n)
        step->update_range(step, unit, offset, master, grad, dtype, m, v, n);
    if (n && (void *)master != params)
        strategy_compute(h)->convert(h, params, dtype, master, LOOM_F32, n);
}

/* Frees an accounted buffer, if any, and forgets it. */
static inline void strategy_release(const loom_host *h, void **buffer)
{
    if (*buffer)
        h->mem_free(h, *buffer);
    *buffer = NULL;
}

/* ---- sequence strategies ---- */

/* The sizes of a sequence strategy's attention calls: those of the first
 * call, which no later call may change. */
typedef struct strategy_attention_shape {
    int B, T, NH, HS;
    loom_dtype dtype;
} strategy_attention_shape;

/* Elements of each of the call's q, k, v and out, and their bytes. */
static inline size_t strategy_attention_elems(const strategy_attention_shape *shape)
{
    return (size_t)shape->B * shape->T * shape->NH * shape->HS;
}

static inline size_t strategy_attention_bytes(const strategy_attention_shape *shape)
{
    return strategy_attention_elems(shape) * loom_dtype_size(shape->dtype);
}

/* The first attention call: it must bring the host's kernels; its shape is
 * kept in *shape. */
static inline int strategy_first_attention(const loom_host *h, const char *name,
                                           const loom_attention *a, strategy_attention_shape *shape)
{
    if (!a->kernels || !a->kernels->block_forward || !a->kernels->block_backward)
        return h->error(h, LOOM_ERR_INVALID, "%s: the attention op came without kernels", name);
    *shape = (strategy_attention_shape){a->B, a->T, a->NH, a->HS, a->dtype};
    return LOOM_OK;
}

/* A later attention call has the first one's shape. */
static inline int strategy_check_attention_shape(const loom_host *h, const char *name,
                                                 const strategy_attention_shape *first,
                                                 const loom_attention *a)
{
    if (a->B == first->B && a->T == first->T && a->NH == first->NH && a->HS == first->HS &&
        a->dtype == first->dtype)
        return LOOM_OK;
    return h->error(h, LOOM_ERR_INVALID,
                    "%s: attention of (B %d, T %d, heads %d, size %d) after (B %d, T %d, heads "
                    "%d, size %d); the shapes must not change",
                    name, a->B, a->T, a->NH, a->HS, first->B, first->T, first->NH, first->HS);
}

/* Every rank's positions of the sequence, ranks x a->T and rank-major,
 * all-gathered over the sp group. *out is allocated here (malloc) and is the
 * caller's even when the gather fails; NULL: out of memory. */
static inline int strategy_gather_positions(const loom_host *h, const char *name, loom_group *sp,
                                            int ranks, const loom_attention *a, int **out)
{
    *out = malloc((size_t)ranks * a->T * sizeof(int));
    if (!*out)
        return h->error(h, LOOM_ERR_NO_MEMORY, "%s: out of memory", name);
    loom_request *req = NULL;
    int rc = h->comm->allgather(sp, a->positions, *out, (size_t)a->T, LOOM_I32, &req);
    if (rc == LOOM_OK)
        rc = h->comm->wait(req);
    return rc;
}

#endif
