/* loom — the parallel-strategy ABI (docs/architecture.md).
 *
 * A strategy plugin serves one axis of the mesh (tp, sp, pp, dp). Its struct
 * has a common part and one set of hooks per axis; a plugin fills the common
 * part and the hooks of its axis. Hooks left NULL take the core's default:
 *   data axis:     parameters, gradients and optimizer state replicated, no
 *                  communication: the unit hooks do nothing, the norm is the
 *                  sum of squares of every unit's grads, zeroing clears them.
 *                  That is right for a dp group of one only: serving a larger
 *                  group, a strategy must implement data_grad_norm_sq,
 *                  data_zero_grads, data_set_state, data_get_state or
 *                  data_get_shard, and data_grads_ready or
 *                  data_finish_backward, or the core refuses it;
 *   tensor axis:   parameters replicated, border operators identity;
 *   sequence axis: the whole sequence on each rank, local attention;
 *   pipeline axis: one stage holds every unit (schedules are plugins of
 *                  their own kind since ABI 1.8: loom/schedule.h).
 * Exported as `const loom_strategy_plugin_v1_t loom_strategy_plugin_v1`.
 *
 * Strategies never see the model's insides: the model is a list of units
 * (embedding, each block, final LayerNorm + LM head + loss), each with a
 * flat parameter buffer described by loom_param_desc views; tensor-parallel
 * regions are marked by the model; attention is one replaceable op; a
 * pipeline schedule is data the core validates and executes. */
#ifndef LOOM_STRATEGY_H
#define LOOM_STRATEGY_H

#include "loom/comm.h"
#include "loom/plugin.h"
#include "loom/schedule.h"

typedef enum loom_axis {
    LOOM_AXIS_TP = 0, /* innermost: talks most, fastest links */
    LOOM_AXIS_SP = 1,
    LOOM_AXIS_PP = 2,
    LOOM_AXIS_DP = 3,
    LOOM_AXIS_COUNT
} loom_axis;

static inline const char *loom_axis_name(loom_axis a)
{
    static const char *names[LOOM_AXIS_COUNT] = {"tp", "sp", "pp", "dp"};
    return (unsigned)a < LOOM_AXIS_COUNT ? names[a] : "?";
}

typedef struct loom_strategy loom_strategy; /* a plugin's instance */

/* ---- model description shared with strategies ---- */

/* How the tensor axis may split a parameter. */
typedef enum loom_split {
    LOOM_SPLIT_REPLICATED = 0,
    LOOM_SPLIT_ROWS = 1,    /* along dim 0 (output features; vocabulary rows) */
    LOOM_SPLIT_COLUMNS = 2, /* along the last dim (input features) */
} loom_split;

typedef struct loom_param_desc {
    const char *name;       /* llm.c's name: "wte", "qkvw", "fcprojw", ... */
    size_t offset;          /* elements into the unit's flat buffer, as stored on this rank */
    size_t count;           /* elements stored on this rank */
    int ndim;
    int64_t shape[LOOM_MAX_DIMS];      /* the full, unsplit shape */
    int64_t local_shape[LOOM_MAX_DIMS]; /* the shape stored on this rank */
    loom_split split;       /* how it may be split on the tensor axis */
    int split_parts;        /* >1: the split dim holds this many stacked parts
                               (QKV: 3) that are split separately */
} loom_param_desc;

typedef enum loom_unit_kind {
    LOOM_UNIT_EMBEDDING = 0, /* token and position embeddings */
    LOOM_UNIT_BLOCK = 1,     /* one transformer block */
    LOOM_UNIT_HEAD = 2,      /* final LayerNorm, LM head (tied) and loss */
} loom_unit_kind;

/* One unit as the data axis sees it. The strategy decides where the
 * buffers live (data_setup) and fills params/grads whenever a hook promises
 * them to the model; the core copies both pointers to the model after
 * every hook, so a hook may move them. The array data_setup receives, and
 * every unit a hook receives (a pointer into it), stays valid until
 * destroy. The model adds each micro-batch's gradients into grads. */
typedef struct loom_unit {
    int index;
    loom_unit_kind kind;
    const char *name;            /* "embedding", "block" (every block; index
                                    tells them apart) or "head" */
    int ntensors;
    const loom_param_desc *tensors; /* views into the flat buffer */
    size_t numel;                /* elements of the flat buffer on this rank */
    loom_dtype compute_dtype;    /* of params/grads during forward/backward */
    void *params;                /* full (this tp rank's) parameters, when materialised */
    void *grads;                 /* gradients of the current step, when materialised */
    void *strategy_data;         /* the data strategy's per-unit state */
} loom_unit;

/* AdamW as the core implements it (llm.c's update). The strategy calls
 * update_range (before ABI 1.6: update) on the master weights it owns. */
typedef struct loom_optimizer_step {
    int64_t step;       /* 1-based, for bias correction */
    float lr;
    float beta1, beta2, eps, weight_decay;
    float grad_scale;   /* multiply gradients by this first: 1 / loss scale (fp16;
                           1 otherwise), times train.clip / norm when clipping */
    /* master, m, v: fp32, n elements. grad: n elements of grad_dtype.
     * Weight decay applies to every element: with train.decay = "matrices"
     * the core refuses a step that comes through here. */
    void (*update)(const struct loom_optimizer_step *s, float *master, const void *grad,
                   loom_dtype grad_dtype, float *m, float *v, size_t n);
    /* Since ABI 1.6: the same on n elements of unit's flat buffer (as stored
     * on this rank) from element offset on — master[0] is element offset —
     * so that the core can tell which tensors they belong to
     * (train.decay = "matrices" decays only those of 2 and more dimensions).
     * Padding past the unit's tensors may be included. A core older than
     * 1.6 passes no such member: call it only when host->version >= 4. */
    void (*update_range)(const struct loom_optimizer_step *s, const loom_unit *unit,
                         size_t offset, float *master, const void *grad, loom_dtype grad_dtype,
                         float *m, float *v, size_t n);
    /* Since ABI 1.7: update_range, then the n updated weights stored into
     * params as params_dtype (16-bit types rounded to nearest even; params
     * NULL or master itself: nowhere), block by block while each is in
     * cache, on the optimizer's threads. A strategy whose parameters are
     * 16-bit copies of its master weights calls this rather than
     * update_range and then loom_from_f32, which reads every master weight
     * back from memory on one thread. A core older than 1.7 passes no such
     * member: call it only when host->version >= 5. */
    void (*update_range_store)(const struct loom_optimizer_step *s, const loom_unit *unit,
                               size_t offset, float *master, const void *grad,
                               loom_dtype grad_dtype, float *m, float *v, size_t n, void *params,
                               loom_dtype params_dtype);
} loom_optimizer_step;

/* ---- tensor axis ---- */

/* The border regions the model marks. */
typedef enum loom_region {
    LOOM_REGION_ATTENTION = 0, /* before QKV ... after the output projection */
    LOOM_REGION_MLP = 1,       /* before up ... after down */
    LOOM_REGION_VOCAB = 2,     /* the LM head and the loss */
} loom_region;

/* Where this rank's slice of a parameter lies along its split dim. */
typedef struct loom_param_shard {
    int64_t begin; /* first index along the split dim (per part) */
    int64_t count; /* indices kept (per part) */
} loom_param_shard;

/* ---- sequence axis ---- */

/* Host-provided attention kernels a sequence strategy composes. Layout:
 * q, k, v, out: (B, T, NH, HS) rows of positions; lse: (B, NH, T) log-sum-exp
 * of the softmax rows. A "block" call attends queries at q_pos to keys at
 * k_pos with the causal mask applied by position and merges into out/lse
 * with an online softmax, so ring attention can feed K/V blocks one at a time. */
typedef struct loom_attention_kernels {
    uint32_t struct_size;
    void (*block_forward)(const void *q, const int *q_pos, int tq, const void *k,
                          const void *v, const int *k_pos, int tk, int B, int NH, int HS,
                          loom_dtype dtype, void *out, float *lse, int first_block);
    void (*block_backward)(const void *q, const int *q_pos, int tq, const void *k,
                           const void *v, const int *k_pos, int tk, int B, int NH, int HS,
                           loom_dtype dtype, const void *out, const void *dout,
                           const float *lse, void *dq, void *dk, void *dv);
} loom_attention_kernels;

typedef struct loom_attention {
    int B, T, NH, HS;           /* T: positions held by this rank */
    loom_dtype dtype;
    const int *positions;       /* T global positions of this rank's rows */
    const void *q, *k, *v;      /* (B, T, NH, HS) */
    void *out;                  /* (B, T, NH, HS) */
    float *lse;                 /* (B, NH, T), saved by forward for backward */
    const void *dout;           /* backward only */
    void *dq, *dk, *dv;         /* backward only */
    const loom_attention_kernels *kernels;
} loom_attention;

/* ---- pipeline axis ---- */

/* Pipeline schedules are plugins of their own kind since ABI 1.8
 * (loom/schedule.h, which holds loom_action and loom_pipeline_shape). A
 * strategy of this axis, built before, is loaded as a schedule through the
 * core's adapter: create, pipeline_schedule, destroy and pipeline_bubble
 * below are all it uses, and its create gets the mesh sizes and the
 * micro-batches (micro_batches) only: no groups, no model shape. */

/* ---- data axis: a replica's own state (data_replica_state) ---- */

typedef struct loom_replica_buffer {
    const char *name; /* "inner params", "inner m", ... */
    void *data;       /* in the compute backend's memory */
    size_t bytes;
} loom_replica_buffer;

/* ---- what the core gives a strategy at create ---- */

/* Valid during create only (copy what you keep); the groups it points to
 * live until after destroy. */
typedef struct loom_strategy_setup {
    uint32_t struct_size;
    loom_axis axis;
    int sizes[LOOM_AXIS_COUNT];        /* mesh shape */
    int coords[LOOM_AXIS_COUNT];       /* this rank's position in the mesh */
    loom_group *groups[LOOM_AXIS_COUNT]; /* this rank's communicator per axis */
    /* model shape */
    int layers, heads, channels, vocab, padded_vocab, max_seq;
    /* run shape: micro_batches is the step's micro-batches on this rank,
     * train.grad_accum or, on a pipeline, parallel.pp.microbatches
     * (grad_accum: its name before ABI 1.8, the same int) */
    int micro_batch, seq;
    union {
        int micro_batches;
        int grad_accum;
    };
    loom_dtype compute_dtype;          /* f32, bf16 or f16 */
} loom_strategy_setup;

typedef struct loom_strategy_plugin_v1_t {
    loom_plugin_header header; /* kind = LOOM_PLUGIN_STRATEGY */
    uint32_t axis;             /* the loom_axis this strategy serves */
    uint32_t reserved;

    /* ---- common (REQUIRED) ---- */
    int (*create)(const loom_host *host, const loom_strategy_setup *setup, loom_strategy **out);
    int (*destroy)(loom_strategy *s);
    /* One line for the progress header: "zero3 over 4 ranks, prefetch 1". */
    int (*describe)(const loom_strategy *s, char *buf, size_t cap);

    /* ---- data axis (data_setup and data_optimizer_step REQUIRED there) ---- */

    /* Allocate (through host->mem_alloc) and place parameters, gradients,
     * master weights and optimizer state for every unit; initial fp32
     * parameters are in init[i] (full, this tp rank's; valid during this
     * call only), to be copied or sharded. Purposes: params and grads in
     * compute_dtype (PARAMS, GRADS); fp32 master weights when compute_dtype
     * is not f32, and Adam's m and v (OPTIMIZER). Gradients and m and v
     * start at zero: mem_alloc does not clear memory. Every unit has the
     * same compute_dtype. On a pipeline, units are only those of this
     * rank's stages. */
    int (*data_setup)(loom_strategy *s, loom_unit *units, int nunits, float *const *init);
    /* Before a unit's forward: its params must be materialised on return
     * (ZeRO-3 all-gathers, and may start prefetching the next unit). The
     * LM head is tied to the embedding's wte, so without a pipeline the
     * embedding unit's forward and backward hooks also bracket the head's:
     * hooks must tolerate a unit being materialised when it already is.
     * (On a pipeline the last stage keeps its own copy of wte.) */
    int (*data_before_forward)(loom_strategy *s, loom_unit *unit);
    int (*data_after_forward)(loom_strategy *s, loom_unit *unit);
    /* Before a unit's backward: params and a zeroed-or-accumulating grads
     * buffer must be materialised on return. With a split backward (zb-h1)
     * it comes before the backward-weight half only. */
    int (*data_before_backward)(loom_strategy *s, loom_unit *unit);
    /* A unit's gradients for this micro-batch are complete (DDP buckets and
     * all-reduces here; ZeRO-2/3 reduce-scatter). last_micro: the last
     * micro-batch of the step. Units come in reverse order, except the
     * embedding (unit 0), which is always reported last because the tied
     * LM head adds into its gradient first; on a pipeline unit 0 is
     * reported once per step, last_micro = 1, after the head's share
     * arrived from the last stage. Each rank's gradients are those of its
     * own mean loss (accumulated over micro-batches; times the fp16 loss
     * scale); the strategy averages them over the dp group. */
    int (*data_grads_ready)(loom_strategy *s, loom_unit *unit, int last_micro);
    /* After the whole backward of a step (once per step, after the last
     * micro-batch): complete every outstanding reduction. */
    int (*data_finish_backward)(loom_strategy *s);
    /* Sum of squared gradients over the units this rank was given, across
     * the dp group (all data shards), for clipping by the global norm: the
     * gradients as held (the core divides out the loss scale), the same
     * value on every dp rank (checked at a run's first step). Called on
     * every rank once per step, after
     * data_finish_backward. The core adds the other axes' shares (tensor
     * shards, pipeline stages). */
    int (*data_grad_norm_sq)(loom_strategy *s, double *out);
    /* Step the owned master weights, re-materialise parameters as the
     * strategy keeps them (ZeRO-1/2 all-gather), and zero the gradients for
     * the next step. Not called for a step the core skips (a norm that is
     * not finite: fp16 overflow, or a NaN); the core then calls
     * data_zero_grads instead. */
    int (*data_optimizer_step)(loom_strategy *s, const loom_optimizer_step *step);
    /* Drop this step's gradients without stepping (a skipped step). */
    int (*data_zero_grads)(loom_strategy *s);
    /* Checkpointing, collective over the dp group: the unit's full fp32
     * master parameters and Adam m and v (each numel; m and v may be NULL)
     * written on every dp rank, and read back from full arrays (each rank
     * keeping what it owns; params re-materialised in compute dtype). A
     * NULL array is left alone: not written by get, kept as it is by set
     * (the core passes all three today). set_state is called on every
     * rank, between data_setup and the first step (--resume). */
    int (*data_get_state)(loom_strategy *s, loom_unit *unit, float *params, float *m, float *v);
    int (*data_set_state)(loom_strategy *s, loom_unit *unit, const float *params,
                          const float *m, const float *v);

    /* ---- tensor axis (all five REQUIRED there) ---- */

    /* This rank's slice of a parameter that may be split. */
    int (*tensor_shard)(loom_strategy *s, const loom_param_desc *param, loom_param_shard *out);
    /* Megatron's f: entering a region, x (replicated, or sequence-split with
     * sequence parallelism) becomes the region's input. */
    int (*tensor_enter)(loom_strategy *s, loom_region region, const loom_tensor *x,
                        loom_tensor *out);
    /* Megatron's g: leaving a region, partial sums become the result. */
    int (*tensor_exit)(loom_strategy *s, loom_region region, const loom_tensor *partial,
                       loom_tensor *out);
    /* The conjugates, in backward: gradient of g's output -> of its input,
     * and gradient of f's output -> of its input. */
    int (*tensor_exit_backward)(loom_strategy *s, loom_region region, const loom_tensor *dout,
                                loom_tensor *dpartial);
    int (*tensor_enter_backward)(loom_strategy *s, loom_region region,
                                 const loom_tensor *dregion_in, loom_tensor *dx);

    /* ---- sequence axis (attention_forward and _backward REQUIRED there) ---- */

    /* The global positions this rank holds out of seq (contiguous block, or
     * zigzag for balanced causal work); positions has room for seq. Every
     * sp rank must hold seq / size of them and each position be held
     * once; the core checks. NULL: contiguous blocks in rank order. */
    int (*sequence_positions)(loom_strategy *s, int seq, int *positions, int *count);
    int (*attention_forward)(loom_strategy *s, const loom_attention *a);
    int (*attention_backward)(loom_strategy *s, const loom_attention *a);

    /* ---- pipeline axis (REQUIRED there; a schedule plugin since 1.8) ---- */

    /* Emit every pp rank's action list through shape->emit. The core
     * validates the lists before the first step and runs them. */
    int (*pipeline_schedule)(loom_strategy *s, const loom_pipeline_shape *shape);

    /* ---- data axis, since ABI 1.1 (OPTIONAL) ---- */

    /* Sharded checkpoints, each rank writing what it owns with no
     * communication: the range of a unit's flat buffer (as stored on this
     * tp rank, padding excluded) whose fp32 master parameters and Adam m and
     * v this rank owns — [*begin, *begin + *count) — and, when the arrays
     * are not NULL, those count elements of each (the core asks first with
     * NULL arrays, for the range). The dp ranks' ranges are disjoint and
     * cover the unit, in any order; a rank that owns none of it (a replica
     * under hybrid sharding) reports *count = 0 and writes nothing. A
     * strategy that replicates the state
     * (ddp) leaves this NULL: the core then saves dp rank 0's full state. */
    int (*data_get_shard)(loom_strategy *s, loom_unit *unit, size_t *begin, size_t *count,
                          float *params, float *m, float *v);

    /* ---- since ABI 1.2 (OPTIONAL) ---- */

    /* What the core must know of this strategy, declared rather than
     * guessed from its name: LOOM_STRATEGY_* bits below (0, or a plugin
     * older than 1.2: none). */
    uint64_t capabilities;
    /* Pipeline axis: the idle share of a step that theory gives for this
     * schedule under the simulator's unit costs (forward, backward-input
     * and backward-weight of one micro-batch on one virtual stage take one
     * unit each, a whole backward two, transfers nothing), with `stages` pp
     * ranks holding virtual_stages each and `microbatches` per step; the
     * formula as text in *formula (never NULL on return >= 0). < 0: no
     * closed form for these sizes. `loom schedule` prints it beside the
     * simulated bubble. */
    double (*pipeline_bubble)(int stages, int virtual_stages, int microbatches,
                              const char **formula);

    /* ---- data axis, since ABI 1.5 (OPTIONAL) ---- */

    /* Validation (train.eval_every, data.val): between data_eval(s, 1) and
     * data_eval(s, 0) micro-batches run forward only — data_before_forward
     * and data_after_forward for every unit (the embedding's also around
     * the tied head, as in training), no backward hook, no optimizer step —
     * and the gradients must be left as they were. Called between steps on
     * every rank. A strategy with forward hooks but no data_eval cannot be
     * evaluated: the core refuses validation with it. Strategies without
     * forward hooks need none. */
    int (*data_eval)(loom_strategy *s, int evaluating);

    /* ---- data axis, since ABI 1.10 (OPTIONAL) ---- */

    /* State a dp rank keeps for itself alone, beyond what data_get_state
     * gives (DiLoCo's worker weights and Adam moments between two syncs):
     * the unit's buffers of it, each a label unique in the unit, its
     * address in the compute backend's memory (host->compute) and its size
     * in bytes. Called with buffers NULL for *count, then with room for
     * *count. The core writes the buffers' bytes into every checkpoint as
     * records of this rank and, on a resume at the same mesh, copies them
     * back after data_set_state, so the resumed run is bitwise the
     * uninterrupted one; at another mesh they are left out (the replicas
     * start from data_set_state's shared state) and the core says so. A
     * consolidated checkpoint holds no replica state. */
    int (*data_replica_state)(loom_strategy *s, loom_unit *unit,
                              loom_replica_buffer *buffers, int *count);
} loom_strategy_plugin_v1_t;

/* Each bit is a requirement the strategy puts on the rest of the job; the
 * core refuses a composition that cannot honour one, naming the bit, and
 * refuses a bit it does not know (a plugin newer than the core).
 *
 * Data axis: parameters are complete only between my before and after
 * hooks, sharded across the dp group the rest of the time (ZeRO-3, FSDP). A
 * pipeline stage needs its parameters whole at rest: refused when
 * parallel.pp.size > 1. */
#define LOOM_STRATEGY_PARAMS_SHARDED (1u << 0)
/* Since 1.3. Data axis: my hooks assume one micro-batch per step
 * (data_grads_ready's last_micro always 1): refused with
 * train.grad_accum > 1 or a pipeline. */
#define LOOM_STRATEGY_ONE_MICROBATCH (1u << 1)
/* Since 1.3. Data axis: data_grads_ready comes once per unit per
 * micro-batch in reverse unit order (the embedding last), each micro-batch's
 * backward complete before the next begins. Pipeline schedules interleave
 * micro-batches and split the backward: refused when parallel.pp.size > 1. */
#define LOOM_STRATEGY_GRADS_IN_ORDER (1u << 2)
/* Since 1.10. Data axis: my dp ranks train replicas that differ on
 * purpose between synchronisations (local SGD, DiLoCo, compressed
 * gradients), so the run is near the single-rank run, not equal to it.
 * The core then lets me serve dp > 1 without data_grads_ready and
 * data_finish_backward (nothing need average the gradients each step),
 * takes data_grad_norm_sq as this rank's own (each replica clips by its
 * own norm; the first step's cross-rank check is skipped and dp rank 0's
 * norm is the one reported), and saves each rank's data_replica_state in
 * checkpoints. `loom plugins --check --train` holds such a strategy to
 * --tolerance rather than the fp32 contract. */
#define LOOM_STRATEGY_APPROXIMATE (1u << 3)
/* The bits this header knows. */
#define LOOM_STRATEGY_KNOWN_CAPABILITIES                                              \
    (LOOM_STRATEGY_PARAMS_SHARDED | LOOM_STRATEGY_ONE_MICROBATCH |                    \
     LOOM_STRATEGY_GRADS_IN_ORDER | LOOM_STRATEGY_APPROXIMATE)

#endif
