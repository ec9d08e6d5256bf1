/* loom core — the GPT-2 model as an ordered list of units (DESIGN §5.1):
 * unit 0 is the embedding (wte, wpe), units 1..L the transformer blocks,
 * unit L+1 the head (final LayerNorm; the LM head is tied to wte, which
 * stays in unit 0). Each unit's parameters are one flat buffer that the data
 * strategy owns; the model only reads unit->params and adds into
 * unit->grads.
 *
 * Precision: fp32 computes in place. bf16/fp16 keep parameters, gradients
 * and saved activations in 16 bits and compute each unit in fp32 scratch.
 * Recomputation ("block") saves only each block's input and recomputes the
 * block in backward. Activation buffers are accounted under ACTIVATIONS. */
#ifndef LOOM_MODEL_H
#define LOOM_MODEL_H

#include "formats.h"
#include "loom/strategy.h"

typedef struct loom_model loom_model;

typedef struct loom_model_setup {
    loom_gpt2_shape shape;
    int batch;          /* sequences per micro-batch on this rank */
    int seq;            /* tokens per sequence */
    loom_dtype dtype;   /* f32, bf16 or f16 */
    int recompute;      /* 1: keep only each block's input */
} loom_model_setup;

int loom_model_create(const loom_model_setup *setup, loom_model **out);
void loom_model_destroy(loom_model *m);
/* The units (L + 2), their parameter views and numel filled in; params and
 * grads are NULL until the data strategy places them. */
loom_unit *loom_model_units(loom_model *m, int *count);

/* Between llm.c's flat order and per-unit buffers (fp32). unit_params[i]
 * has units[i].numel elements. */
void loom_model_split_params(const loom_model *m, const float *llmc, float *const *unit_params);
void loom_model_join_params(const loom_model *m, float *const *unit_params, float *llmc);

/* One unit forward for the current micro-batch. The embedding reads tokens,
 * the head reads targets and leaves the per-token losses; returns the mean
 * loss of the micro-batch through loss (head only). */
int loom_model_forward(loom_model *m, int unit, const int *inputs, const int *targets,
                       float *loss);
/* One unit backward; dloss is the gradient of each token's loss (the head
 * seeds it). Adds into units[unit].grads (and, for the head, into the tied
 * wte gradient of unit 0). */
int loom_model_backward(loom_model *m, int unit, float dloss);

/* The parallel ops the model is written against (DESIGN §5.1). The trainer
 * installs a strategy's hooks here; a NULL member is the local default:
 * whole-sequence attention with the CPU kernels, identity borders. The
 * border hooks see each tensor-parallel region's input and output in
 * forward and the gradients in backward (Megatron's f and g). */
typedef struct loom_model_ops {
    void *ctx;
    int (*attention_forward)(void *ctx, const loom_attention *a);
    int (*attention_backward)(void *ctx, const loom_attention *a);
    int (*region_enter)(void *ctx, loom_region region, const loom_tensor *x, loom_tensor *out);
    int (*region_exit)(void *ctx, loom_region region, const loom_tensor *partial,
                       loom_tensor *out);
    int (*region_exit_backward)(void *ctx, loom_region region, const loom_tensor *dout,
                                loom_tensor *dpartial);
    int (*region_enter_backward)(void *ctx, loom_region region, const loom_tensor *dregion_in,
                                 loom_tensor *dx);
} loom_model_ops;
void loom_model_set_ops(loom_model *m, const loom_model_ops *ops);

/* FLOPs of one forward+backward per token (6N plus attention), for MFU. */
double loom_model_flops_per_token(const loom_model *m);

#endif
