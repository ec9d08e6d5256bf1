/* loom plan — the published accounting `loom plan` uses for the shapes
 * loom plans but does not train (model.kind = "llama"), and the formulas
 * docs/plan.md cross-checks loom's own layout and schedule simulator with.
 *
 * Every function is a formula from a paper, written out term by term:
 * doubles in, a count or bytes out, no allocation, no state. Each one's
 * comment in plan_reference.c gives the formula and its source;
 * docs/plan-reference.md lists them with the test that checks each.
 *
 * Units: parameters and FLOPs are counts; memory is bytes (GB = 1e9 in
 * the papers' figures). s = tokens per sequence, b = sequences per
 * micro-batch, h = hidden size, a = attention heads, t = tensor-parallel
 * ranks, p = pipeline ranks, m = micro-batches, v = virtual stages. */
#ifndef LOOM_PLAN_PLAN_REFERENCE_H
#define LOOM_PLAN_PLAN_REFERENCE_H

#include "plan/plan.h"

/* ---- parameters and FLOPs ---- */

/* Ψ: every parameter of the shape (GPT-2: llm.c's count; Llama: Meta's). */
double loom_plan_ref_params(const loom_plan_shape *shape);

/* The parameters a token multiplies by: Ψ less the lookup tables (GPT-2's
 * position embedding wpe; Llama's input embedding). */
double loom_plan_ref_matmul_params(const loom_plan_shape *shape);

/* FLOPs of forward + backward per token at `seq` tokens per sequence:
 * 6 per multiplied parameter plus attention's scores and weighted sum,
 * causal (half the s×s products), as loom_model_flops_per_token counts. */
double loom_plan_ref_flops_per_token(const loom_plan_shape *shape, int seq);

/* ---- model states (ZeRO) ---- */

/* Bytes of parameters, gradients and optimizer state per data-parallel
 * rank: zero_stage 0 (plain data parallelism) to 3, Ψ = params, N = ranks,
 * K = optimizer_bytes per parameter (12 for mixed-precision Adam). */
double loom_plan_ref_model_state_bytes(int zero_stage, double params, int ranks,
                                       double optimizer_bytes);

/* ---- activations per transformer layer ---- */

/* What a layer keeps for its backward. The values of the first two are
 * loom_plan_job.recompute's (train.recompute = "none" / "block"). */
typedef enum loom_plan_ref_recompute {
    LOOM_PLAN_REF_RECOMPUTE_NONE = 0,
    LOOM_PLAN_REF_RECOMPUTE_BLOCK = 1,     /* full: keep each layer's input only */
    LOOM_PLAN_REF_RECOMPUTE_SELECTIVE = 2, /* Korthikanti's: recompute attention's s×s core */
} loom_plan_ref_recompute;

/* How one layer's saved activations are split and which are kept. */
typedef struct loom_plan_ref_layout {
    double seq, micro_batch;        /* s, b */
    int tp;                         /* t; 1 without tensor parallelism */
    int sequence_parallel;          /* Megatron's, on the tp ranks */
    loom_plan_ref_recompute recompute;
    int flash_attention;            /* Llama only: no s×s tensor is ever stored */
} loom_plan_ref_layout;

/* Bytes one GPT layer keeps for its backward on one tp rank, 16-bit
 * activations with dropout (Korthikanti et al. 2022, §4 and Table 2),
 * from the shape's channels (h), heads (a) and ffn (0: 4h). */
double loom_plan_ref_gpt_layer_bytes(const loom_plan_shape *shape,
                                     const loom_plan_ref_layout *layout);

/* The same for a Llama layer: RMSNorm, grouped-query attention, SwiGLU,
 * no dropout, fp32 softmax statistics when flash_attention. */
double loom_plan_ref_llama_layer_bytes(const loom_plan_shape *shape,
                                       const loom_plan_ref_layout *layout);

/* Selective recomputation's extra FLOPs as a fraction of a GPT layer's
 * forward FLOPs, counting the s×s products whole as the paper does. */
double loom_plan_ref_selective_recompute_overhead(const loom_plan_shape *shape, double seq);

/* ---- the pipeline bubble (idle fraction of the step's makespan) ---- */

/* GPipe and 1F1B, p ranks, m micro-batches. */
double loom_plan_ref_bubble_1f1b(int p, int m);
/* Interleaved 1F1B with v virtual stages per rank. */
double loom_plan_ref_bubble_interleaved(int p, int v, int m);
/* ZB-H1 with the times of a forward, a backward-input and a
 * backward-weight on one stage (for backward_weight <= forward). */
double loom_plan_ref_bubble_zb_h1(int p, int m, double forward, double backward_input,
                                  double backward_weight);

#endif
