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
 * block in backward. Activation buffers are accounted under ACTIVATIONS.
 *
 * Parallel layouts (DESIGN §5.1). On a tensor axis of t ranks the model
 * computes with this rank's slice of every split tensor: QKV and MLP-up
 * column-parallel (heads NH/t, MLP width 4C/t), attention-out and MLP-down
 * row-parallel (partial sums, the bias added once after the border), and
 * the tied wte vocabulary-parallel (Vp/t rows; the embedding masks tokens
 * outside them, the loss is a parallel cross-entropy whose row max and sum
 * of exponentials are reduced over the tensor group, never the logits).
 * With sequence parallelism the LayerNorm/residual regions hold the rows
 * of this tp rank only (N/t of the N token rows). On a sequence axis the
 * rank holds `npositions` positions of each sequence; attention is the
 * sequence strategy's op. */
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

/* Where this rank sits on the tensor and sequence axes. */
typedef struct loom_model_layout {
    int tp_size, tp_rank;
    int sequence_parallel; /* Megatron's: residual regions split along the token rows */
    /* This rank's slice of a split tensor; NULL: an even split. */
    int (*tensor_shard)(void *ctx, const loom_param_desc *param, loom_param_shard *out);
    void *shard_ctx;
    int sp_size;          /* ranks on the sequence axis */
    const int *positions; /* npositions global positions of each sequence this rank holds; */
    int npositions;       /* NULL: all seq of them, in order */
} loom_model_layout;

int loom_model_create(const loom_model_setup *setup, loom_model **out);
/* The same for one rank of a parallel layout (NULL: a single rank). */
int loom_model_create_parallel(const loom_model_setup *setup, const loom_model_layout *layout,
                               loom_model **out);
void loom_model_destroy(loom_model *m);
/* The units (L + 2), their parameter views and numel filled in; params and
 * grads are NULL until the data strategy places them. */
loom_unit *loom_model_units(loom_model *m, int *count);

/* Between llm.c's flat order and whole (unsplit) per-unit buffers (fp32).
 * unit_params[i] has loom_model_full_numel(m, i) elements, which is
 * units[i].numel on a tensor axis of one rank. */
void loom_model_split_params(const loom_model *m, const float *llmc, float *const *unit_params);
void loom_model_join_params(const loom_model *m, float *const *unit_params, float *llmc);
size_t loom_model_full_numel(const loom_model *m, int unit);
/* This tp rank's slice of each of a unit's tensors (units[unit].ntensors
 * of them, along the tensor's split dim, per part). */
const loom_param_shard *loom_model_shards(const loom_model *m, int unit);
/* A whole unit buffer -> this rank's (units[unit].numel elements). */
void loom_model_slice(const loom_model *m, int unit, const float *full, float *local);
/* The slices a tp rank holds (its shards; a rank with this rank's local
 * layout) -> their places in the whole unit buffer. Replicated tensors
 * are copied whole. */
void loom_model_unslice(const loom_model *m, int unit, const loom_param_shard *shards,
                        const float *local, float *full);

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
 * forward and the gradients in backward (Megatron's f and g); with
 * sequence parallelism the two differ in rows (N/t and N). Attention gets
 * each layer's own lse buffer, so a strategy can key what it keeps for
 * backward on it. */
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
    /* The vocabulary-parallel loss: reduce count floats over the tensor
     * group in place (the rows' max, then their sums). NULL: one rank. */
    int (*vocab_reduce)(void *ctx, float *data, size_t count, loom_redop op);
    /* A unit's fp32 gradients of this micro-batch alone (before they are
     * added into unit->grads): sums over the sequence group, and over the
     * tensor group for what sequence parallelism leaves partial, go here.
     * Called when the layout is parallel (tp or sp > 1); NULL: nothing. */
    int (*reduce_grads)(void *ctx, const loom_unit *unit, float *grads);
} loom_model_ops;
void loom_model_set_ops(loom_model *m, const loom_model_ops *ops);

/* FLOPs of one forward+backward per token of the whole model (6N plus
 * attention over the whole sequence), for MFU. */
double loom_model_flops_per_token(const loom_model *m);

#endif
