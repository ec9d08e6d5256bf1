/* loom core — the GPT-2 model as an ordered list of units (docs/parallelism.md):
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
 * Parallel layouts (docs/parallelism.md). On a tensor axis of t ranks the model
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

#include "loom/tensor.h"
#include "model/compute.h"
#include "model/formats.h"
#include "loom/strategy.h"

typedef struct loom_model loom_model;

typedef struct loom_model_setup {
    loom_gpt2_shape shape;
    int batch;          /* sequences per micro-batch on this rank */
    int seq;            /* tokens per sequence */
    loom_dtype dtype;   /* f32, bf16 or f16 */
    int recompute;      /* 1: keep only each block's input */
    /* Where every buffer of the model lives and every kernel runs; NULL:
     * the process's cpu backend. Parameters and gradients the data
     * strategy places must be this backend's memory too. */
    const loom_backend *backend;
} loom_model_setup;

/* Where this rank sits on the tensor, sequence and pipeline axes. */
typedef struct loom_model_layout {
    int tp_size, tp_rank;
    int sequence_parallel; /* Megatron's: residual regions split along the token rows */
    /* This rank's slice of a split tensor; NULL: an even split. */
    int (*tensor_shard)(void *ctx, const loom_param_desc *param, loom_param_shard *out);
    void *shard_ctx;
    int sp_size;          /* ranks on the sequence axis */
    const int *positions; /* npositions global positions of each sequence this rank holds; */
    int npositions;       /* NULL: all seq of them, in order */
    /* Pipeline stages: runs_unit[u] != 0 for each of the L + 2 units this
     * rank computes (one stage's contiguous range, or several with virtual
     * stages). NULL: every unit. Activations, their backward scratch and
     * the fp32 copies are allocated for these units only; the parameter
     * views (loom_model_units) still describe all units. */
    const unsigned char *runs_unit;
} loom_model_layout;

int loom_model_create(const loom_model_setup *setup, loom_model **out);
/* The same for one rank of a parallel layout (NULL: a single rank). */
int loom_model_create_parallel(const loom_model_setup *setup, const loom_model_layout *layout,
                               loom_model **out);
void loom_model_destroy(loom_model *m);

/* The same model without its buffers, for `loom plan`: every query below
 * and loom_model_units (numel, not buffers), loom_model_stream (counts),
 * loom_model_deferred_bytes answer as for the real one; nothing computes.
 * loom_model_planned_bytes: what create would have allocated by purpose
 * (the shared scratch and fp32 copies); loom_model_slot_bytes_of: one
 * slot of these units (L + 2 flags; NULL: all the rank runs), as
 * loom_model_use_slot(_units) would allocate it. */
int loom_model_plan(const loom_model_setup *setup, const loom_model_layout *layout,
                    loom_model **out);
uint64_t loom_model_planned_bytes(const loom_model *m, loom_purpose purpose);
size_t loom_model_slot_bytes_of(const loom_model *m, const unsigned char *units);
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

/* One unit forward for the current micro-batch (the slot in use). The
 * embedding reads tokens, the head reads targets and leaves the per-token
 * losses; returns the mean loss of the micro-batch through loss (head
 * only). A unit outside runs_unit, or no slot in use, is refused. */
int loom_model_forward(loom_model *m, int unit, const int *inputs, const int *targets,
                       float *loss);
/* The logits the head's forward computed for token row `row` of the
 * micro-batch in the slot in use, copied into out (host memory,
 * padded_vocab floats, the first vocab of them real tokens). Sampling draws
 * the next token from them. Valid until the head's backward of that slot,
 * which writes their gradient over them; refused on a tensor axis of more
 * than one rank (each holds a vocabulary slice) or where the slot does not
 * hold the head. */
int loom_model_logits(loom_model *m, int row, float *out);
/* One unit backward of the slot in use; dloss is the gradient of each
 * token's loss (the head seeds it). Adds into units[unit].grads (and, for
 * the head, into the tied wte gradient of unit 0: committed with the
 * embedding's backward when this rank runs unit 0, else at the end of the
 * head's, into units[0].grads, which a pipeline's last stage points at its
 * copy of wte). It is exactly backward_input then backward_weight. */
int loom_model_backward(loom_model *m, int unit, float dloss);

/* The split backward of zero-bubble schedules, the same bits as
 * loom_model_backward. backward_input leaves the gradient of the unit's
 * input in the stream gradient (the embedding has none: it keeps the
 * gradient of its output) and keeps what the weight gradients need in the
 * slot, loom_model_deferred_bytes(m, unit) more ACTIVATIONS; any actions
 * of other slots may run before backward_weight adds the unit's weight
 * gradients (and the head's wte share) as loom_model_backward would, and
 * frees them. The halves call the hooks apart: border conjugates and
 * attention backward in the input part; the weight gradients' region
 * inputs (f again, an all-gather with sequence parallelism) and
 * reduce_grads in the weight part. With several slots in flight, run a
 * unit's backward_weight of the head before the embedding's of the same
 * micro-batch when one model holds both (the wte share waits there). */
int loom_model_backward_input(loom_model *m, int unit, float dloss);
int loom_model_backward_weight(loom_model *m, int unit);
size_t loom_model_deferred_bytes(const loom_model *m, int unit);

/* Micro-batch slots. A slot holds everything one micro-batch keeps from
 * its forward to its backward on this rank: the residual streams, each
 * block's saved tensors (and LayerNorm statistics, attention's lse), the
 * head's LayerNorm output, statistics, probabilities and losses, the
 * tokens and targets, and split backwards in flight. use_slot makes the
 * following forward/backward calls use the slot, allocating it on first
 * use (one block of loom_model_slot_bytes, ACTIVATIONS; each buffer in it
 * rounded up to 64 bytes); release_slot frees it once the micro-batch's
 * backward is complete here (a released slot is allocated afresh by its
 * next use). What all slots share (the fp32 scratch set, the backward's
 * scratch, the fp32 copies of parameters and gradients) is allocated once
 * at create. Slot 0 is allocated and in use from create, so a caller that
 * never names a slot runs one micro-batch at a time as before. */
int loom_model_use_slot(loom_model *m, int slot);
/* The same, but a slot allocated here holds only units (L + 2 flags) of
 * those the rank runs: a pipeline rank's virtual stages each keep their own
 * micro-batches. Running a unit outside its slot's is refused. */
int loom_model_use_slot_units(loom_model *m, int slot, const unsigned char *units);
void loom_model_release_slot(loom_model *m, int slot);
size_t loom_model_slot_bytes(const loom_model *m);

/* Stage borders, in the slot in use. loom_model_stream: the residual stream
 * entering unit (1..L+1), i.e. unit-1's output: count = R x C elements
 * (R = this rank's token rows: N, or N/tp with sequence parallelism) of
 * dtype (fp32 when fp32 without recomputation, else the 16-bit or fp32
 * storage dtype), which is what goes over the wire. A stage whose first
 * unit is u writes the received activation there before forward(u); a
 * stage whose last unit is u-1 sends it after forward(u-1). NULL when the
 * rank runs neither u nor u-1, or no slot is in use (count and dtype
 * are still filled in).
 *
 * loom_model_stream_grad: the residual stream's gradient, fp32, count =
 * R x C, one buffer for all slots. Before the backward (or
 * backward_input) of a stage's last unit u < L+1, the executor writes the
 * gradient of unit u's output there (the head seeds its own); after the
 * backward (or backward_input) of the stage's first unit u >= 1, it holds
 * the gradient of unit u's input, to send before the next backward. */
void *loom_model_stream(loom_model *m, int unit, size_t *count, loom_dtype *dtype);
float *loom_model_stream_grad(loom_model *m, size_t *count);

/* The parallel ops the model is written against (docs/parallelism.md). The trainer
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
