/* loom model — where the compute time goes: a clock per kind of kernel.
 *
 * The model brackets each kernel call at its call site (model.c) and
 * AdamW its updates (optimizer.c) with begin/end; the time in between is
 * charged to that kind. Brackets nest, and time is exclusive: an outer
 * bracket gets only what its inner ones do not, so the model's own
 * forward/backward entry points open an OTHER bracket and everything in
 * them that is no kernel (zeroing, copies, bias sums) lands there. The sum
 * over the kinds is then the wall time spent inside the model and the
 * optimizer, each nanosecond counted once.
 *
 * The totals are per process and read by the trainer once a step
 * (read, then reset). Brackets are per thread (a bracket opened on one
 * thread must close on it); the totals add up over threads. Each begin or
 * end reads CLOCK_MONOTONIC once; with the trace on (runtime/trace.h) each
 * kernel call, adjacent calls of one kind merged, is also a span on the
 * compute lane. */
#ifndef LOOM_MODEL_KERNEL_TIME_H
#define LOOM_MODEL_KERNEL_TIME_H

#include <stdint.h>

typedef enum loom_kernel_kind {
    LOOM_KERNEL_MATMUL_FWD,   /* the blocks' GEMMs: forward */
    LOOM_KERNEL_MATMUL_DX,    /* ... the input's gradient */
    LOOM_KERNEL_MATMUL_DW,    /* ... the weights' (and biases') gradients */
    LOOM_KERNEL_LM_HEAD,      /* the tied LM head's three GEMMs */
    LOOM_KERNEL_ATTENTION,    /* the attention op, forward and backward (a sequence
                                 strategy's exchanges included) */
    LOOM_KERNEL_LAYERNORM,
    LOOM_KERNEL_GELU,
    LOOM_KERNEL_RESIDUAL,
    LOOM_KERNEL_CROSSENTROPY, /* softmax and cross-entropy, forward and backward */
    LOOM_KERNEL_ENCODER,      /* the token and position embedding */
    LOOM_KERNEL_CONVERT,      /* 16-bit <-> fp32 of parameters, gradients, activations */
    LOOM_KERNEL_OPTIMIZER,    /* AdamW */
    LOOM_KERNEL_COMM,         /* the tensor-parallel borders, the vocabulary-parallel
                                 loss's reductions, the parallel gradient sums */
    LOOM_KERNEL_OTHER,        /* the rest of the model's time */
    LOOM_KERNEL_KINDS
} loom_kernel_kind;

/* "matmul_fwd", ...: the key in --metrics' kernel_ms and the trace's name. */
const char *loom_kernel_kind_name(loom_kernel_kind kind);

void loom_kernel_time_begin(loom_kernel_kind kind);
void loom_kernel_time_end(void);

/* Nanoseconds per kind since the last reset, over all threads. */
void loom_kernel_time_read(uint64_t ns[LOOM_KERNEL_KINDS]);
void loom_kernel_time_reset(void);

/* Brackets closed on the calling thread since it started: the clock's
 * own cost is this many begin/end pairs (tests/model/kernel_time_test.c
 * measures one). */
uint64_t loom_kernel_time_brackets(void);

#endif
