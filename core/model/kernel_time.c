/* The clock per kind of kernel (kernel_time.h). */
#include <stdatomic.h>
#include <time.h>

#include "loom/plugin.h"
#include "model/kernel_time.h"
#include "runtime/trace.h"

/* Brackets deeper than this still count, charged to the deepest one kept. */
enum { MAX_DEPTH = 8 };
/* Calls of one kind this close together are one span in the trace (q, k
 * and v's three products; a block's saved tensors converted one by one). */
enum { MERGE_GAP_NS = 1000 };

static const char *const kind_names[LOOM_KERNEL_KINDS] = {
    "matmul_fwd", "matmul_dx", "matmul_dw", "lm_head", "attention", "layernorm", "gelu",
    "residual", "crossentropy", "encoder", "convert", "optimizer", "comm", "other"};

static _Atomic uint64_t totals[LOOM_KERNEL_KINDS];

typedef struct trace_run {
    int kind;
    uint64_t start, end; /* end 0: none */
} trace_run;

/* A thread's open brackets, innermost last. */
typedef struct bracket_stack {
    int depth;
    loom_kernel_kind kind[MAX_DEPTH];
    uint64_t opened[MAX_DEPTH];
    uint64_t since;    /* the innermost bracket is charged from here on */
    trace_run pending; /* the last kernel's span, held to merge with the next */
    uint64_t closed;
} bracket_stack;

static _Thread_local bracket_stack stack;

const char *loom_kernel_kind_name(loom_kernel_kind kind)
{
    return (unsigned)kind < LOOM_KERNEL_KINDS ? kind_names[kind] : "?";
}

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The innermost open bracket gets the time since the last mark. */
static void charge(uint64_t now)
{
    if (stack.depth > 0) {
        int top = stack.depth < MAX_DEPTH ? stack.depth : MAX_DEPTH;
        atomic_fetch_add_explicit(&totals[stack.kind[top - 1]], now - stack.since,
                                  memory_order_relaxed);
    }
    stack.since = now;
}

static void flush_span(void)
{
    trace_run *p = &stack.pending;
    if (p->end)
        loom_trace_span(LOOM_LANE_COMPUTE, kind_names[p->kind], p->start, p->end, 0);
    p->end = 0;
}

static void trace_kernel(int kind, uint64_t start, uint64_t end)
{
    trace_run *p = &stack.pending;
    /* (a span that encloses the pending one starts before its end: the
     * difference wraps, and it is not merged) */
    if (p->end && p->kind == kind && start - p->end <= MERGE_GAP_NS) {
        p->end = end;
        return;
    }
    flush_span();
    *p = (trace_run){kind, start, end};
}

void loom_kernel_time_begin(loom_kernel_kind kind)
{
    uint64_t now = now_ns();
    charge(now);
    if (stack.depth < MAX_DEPTH) {
        stack.kind[stack.depth] = kind;
        stack.opened[stack.depth] = now;
    }
    stack.depth++;
}

void loom_kernel_time_end(void)
{
    if (stack.depth == 0)
        return;
    uint64_t now = now_ns();
    charge(now);
    int d = --stack.depth;
    stack.closed++;
    /* OTHER's time is scattered between the kernels; the model's unit
     * spans already show its extent */
    if (d < MAX_DEPTH && stack.kind[d] != LOOM_KERNEL_OTHER)
        trace_kernel(stack.kind[d], stack.opened[d], now);
    if (d == 0)
        flush_span();
}

void loom_kernel_time_read(uint64_t ns[LOOM_KERNEL_KINDS])
{
    for (int k = 0; k < LOOM_KERNEL_KINDS; k++)
        ns[k] = atomic_load_explicit(&totals[k], memory_order_relaxed);
}

uint64_t loom_kernel_time_brackets(void) { return stack.closed; }

void loom_kernel_time_reset(void)
{
    for (int k = 0; k < LOOM_KERNEL_KINDS; k++)
        atomic_store_explicit(&totals[k], 0, memory_order_relaxed);
}
