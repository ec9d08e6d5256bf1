/* loom core — AdamW (llm.c's CPU update: bias correction, decoupled weight
 * decay on every parameter) and the learning-rate schedule. */
#ifndef LOOM_OPTIMIZER_H
#define LOOM_OPTIMIZER_H

#include "loom/tensor.h"
#include "loom/strategy.h"

/* The update a data strategy applies to the master weights it owns. */
void loom_adamw_update(const loom_optimizer_step *s, float *master, const void *grad,
                       loom_dtype grad_dtype, float *m, float *v, size_t n);

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
