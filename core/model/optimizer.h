/* loom core — AdamW (llm.c's update: bias correction, decoupled weight
 * decay on every parameter as its CPU trainer, or on the matrices only as
 * its GPU trainer) and the learning-rate schedule. */
#ifndef LOOM_OPTIMIZER_H
#define LOOM_OPTIMIZER_H

#include "loom/compute.h"
#include "loom/tensor.h"
#include "loom/strategy.h"

/* The update a data strategy applies to the master weights it owns. */
void loom_adamw_update(const loom_optimizer_step *s, float *master, const void *grad,
                       loom_dtype grad_dtype, float *m, float *v, size_t n);

/* update_range for train.decay = "all": the range decays whatever it holds. */
void loom_adamw_update_range_all(const loom_optimizer_step *s, const loom_unit *unit,
                                 size_t offset, float *master, const void *grad,
                                 loom_dtype grad_dtype, float *m, float *v, size_t n);
/* update_range for train.decay = "matrices": elements of the unit's tensors
 * of 2 and more dimensions decay (wte, wpe, qkvw, attprojw, fcw, fcprojw),
 * the rest (biases, LayerNorms, padding) do not. */
void loom_adamw_update_range_matrices(const loom_optimizer_step *s, const loom_unit *unit,
                                      size_t offset, float *master, const void *grad,
                                      loom_dtype grad_dtype, float *m, float *v, size_t n);

/* The same, then the updated weights stored into params as params_dtype
 * in the same pass (update_range_store, ABI 1.7). */
void loom_adamw_update_range_store_all(const loom_optimizer_step *s, const loom_unit *unit,
                                       size_t offset, float *master, const void *grad,
                                       loom_dtype grad_dtype, float *m, float *v, size_t n,
                                       void *params, loom_dtype params_dtype);
void loom_adamw_update_range_store_matrices(const loom_optimizer_step *s, const loom_unit *unit,
                                            size_t offset, float *master, const void *grad,
                                            loom_dtype grad_dtype, float *m, float *v, size_t n,
                                            void *params, loom_dtype params_dtype);

/* The compute backend's adamw (loom/compute.h) on the CPU: the update
 * above with step's constants, decaying every element by its weight_decay,
 * the same bits as loom_adamw_update_range_store_all with those numbers. */
void loom_adamw_apply(const loom_compute_adamw *step, float *master, const void *grad,
                      loom_dtype grad_dtype, float *m, float *v, size_t n, void *params,
                      loom_dtype params_dtype);

typedef struct loom_lr_schedule {
    float lr;
    int64_t warmup, steps;
    int cosine;
    float final_frac;
} loom_lr_schedule;
/* Linear warm-up over the first `warmup` steps (0-based step), then constant
 * or cosine decay to lr * final_frac at the last step. */
float loom_lr_at(const loom_lr_schedule *s, int64_t step);

#endif
