/* The pipeline schedules loom ships (docs/pipeline.md): gpipe, 1f1b,
 * interleaved and zb-h1. One source, built once per schedule with
 * PP_SCHEDULE set (see CMakeLists.txt) into libloom-schedule-<name>.so. A
 * schedule plugin runs nothing: it emits each pp rank's list of actions,
 * and the core validates, simulates and executes them.
 *
 * Each schedule decides only the order of the compute actions on each rank
 * (forward, backward, or backward-input and backward-weight); emit_compute
 * puts the transfers around them: a receive right before the action that
 * uses it, a send right after the action that produced it. Sends never
 * block in loom's executor, so an order that respects the dependencies
 * between stages cannot deadlock.
 *
 * Stage s = vs·p + r is virtual stage vs of rank r (p ranks, v virtual
 * stages, m micro-batches). */
#include "loom/schedule.h"

#define PP_GPIPE 1
#define PP_1F1B 2
#define PP_INTERLEAVED 3
#define PP_ZB_H1 4

#if PP_SCHEDULE == PP_GPIPE
#define SCHEDULE_NAME "gpipe"
#define SCHEDULE_TEXT "pipeline schedule: all forwards, then all backwards (GPipe)"
#elif PP_SCHEDULE == PP_1F1B
#define SCHEDULE_NAME "1f1b"
#define SCHEDULE_TEXT "pipeline schedule: warm-up forwards, one forward one backward, cool-down"
#elif PP_SCHEDULE == PP_INTERLEAVED
#define SCHEDULE_NAME "interleaved"
#define SCHEDULE_TEXT "pipeline schedule: interleaved 1F1B over virtual stages (Megatron)"
#elif PP_SCHEDULE == PP_ZB_H1
#define SCHEDULE_NAME "zb-h1"
#define SCHEDULE_TEXT "pipeline schedule: zero-bubble H1, weight gradients fill the cool-down"
#else
#error "PP_SCHEDULE must name one schedule"
#endif

/* The build's one input. Every schedule is compiled, and so checked, in
 * every build; the others fold away. */
static const int schedule = PP_SCHEDULE;

static int emit(const loom_pipeline_shape *shape, int rank, int kind, int vs, int mb)
{
    loom_action a = {(uint16_t)kind, (uint16_t)vs, mb};
    return shape->emit(shape->builder, rank, a);
}

/* One compute action with the transfers it needs around it: a forward
 * takes activations from the stage before and hands its own to the stage
 * after, a backward (or backward-input) the gradients the other way; a
 * backward-weight needs none. */
static int emit_compute(const loom_pipeline_shape *shape, int rank, int kind, int vs, int mb)
{
    int p = shape->stages, S = p * shape->virtual_stages, stage = vs * p + rank;
    int first = stage == 0, last = stage == S - 1;
    int recv = -1, send = -1; /* none */
    if (kind == LOOM_ACT_FORWARD) {
        recv = first ? -1 : LOOM_ACT_RECV_ACTIVATION;
        send = last ? -1 : LOOM_ACT_SEND_ACTIVATION;
    } else if (kind == LOOM_ACT_BACKWARD || kind == LOOM_ACT_BACKWARD_INPUT) {
        recv = last ? -1 : LOOM_ACT_RECV_GRADIENT;
        send = first ? -1 : LOOM_ACT_SEND_GRADIENT;
    }
    int rc = recv < 0 ? LOOM_OK : emit(shape, rank, recv, vs, mb);
    if (rc == LOOM_OK)
        rc = emit(shape, rank, kind, vs, mb);
    if (rc == LOOM_OK && send >= 0)
        rc = emit(shape, rank, send, vs, mb);
    return rc;
}

static int need_one_virtual_stage(const loom_host *host, const loom_pipeline_shape *shape)
{
    if (shape->virtual_stages == 1)
        return LOOM_OK;
    return host->error(host, LOOM_ERR_INVALID,
                       SCHEDULE_NAME ": one virtual stage per rank only (parallel.pp."
                       "virtual_stages = %d); the interleaved schedule takes more",
                       shape->virtual_stages);
}

/* GPipe: every virtual stage's forwards in micro-batch order, then the
 * backwards from the last virtual stage down, also in micro-batch order. */
static int schedule_gpipe(const loom_pipeline_shape *shape)
{
    int p = shape->stages, v = shape->virtual_stages, m = shape->microbatches, rc = LOOM_OK;
    for (int r = 0; r < p && rc == LOOM_OK; r++) {
        for (int vs = 0; vs < v; vs++)
            for (int mb = 0; mb < m && rc == LOOM_OK; mb++)
                rc = emit_compute(shape, r, LOOM_ACT_FORWARD, vs, mb);
        for (int vs = v - 1; vs >= 0; vs--)
            for (int mb = 0; mb < m && rc == LOOM_OK; mb++)
                rc = emit_compute(shape, r, LOOM_ACT_BACKWARD, vs, mb);
    }
    return rc;
}

/* Megatron's non-interleaved 1F1B: rank r runs p−r−1 forwards to fill the
 * pipeline, then alternates one forward and one backward, then drains the
 * backwards left. At most p−r micro-batches are alive on rank r.
 *
 * With split_backward, zero-bubble H1 (Qi et al., "Zero Bubble Pipeline
 * Parallelism", 2023): the backward splits into backward-input (B, on the
 * critical path: the previous stage waits for it) and backward-weight (W,
 * which nobody waits for). Rank r runs 1F1B's order with B in place of the
 * whole backward and delays its W's by r of the steady steps: the W of
 * micro-batch i−r follows the B of micro-batch i. So every rank has p
 * micro-batches alive at most (forward run, W not yet), rank 0's 1F1B peak;
 * the B's reach rank 0 sooner because no W sits between them on the way,
 * and the delayed W's fill the waits of the cool-down. With equal F, B and
 * W costs each rank idles p−1 units against 1F1B's 3(p−1). */
static int schedule_1f1b(const loom_host *host, const loom_pipeline_shape *shape,
                         int split_backward)
{
    int rc = need_one_virtual_stage(host, shape);
    int p = shape->stages, m = shape->microbatches;
    int backward = split_backward ? LOOM_ACT_BACKWARD_INPUT : LOOM_ACT_BACKWARD;
    for (int r = 0; r < p && rc == LOOM_OK; r++) {
        int warmup = p - r - 1 < m ? p - r - 1 : m, steady = m - warmup, next_w = 0;
        for (int mb = 0; mb < warmup && rc == LOOM_OK; mb++)
            rc = emit_compute(shape, r, LOOM_ACT_FORWARD, 0, mb);
        for (int i = 0; i < steady && rc == LOOM_OK; i++) {
            rc = emit_compute(shape, r, LOOM_ACT_FORWARD, 0, warmup + i);
            if (rc == LOOM_OK)
                rc = emit_compute(shape, r, backward, 0, i);
            if (rc == LOOM_OK && split_backward && i >= r)
                rc = emit_compute(shape, r, LOOM_ACT_BACKWARD_WEIGHT, 0, next_w++);
        }
        /* cool-down; ZB-H1 follows each B with the oldest W left, then the rest */
        for (int mb = steady; mb < m && rc == LOOM_OK; mb++) {
            rc = emit_compute(shape, r, backward, 0, mb);
            if (rc == LOOM_OK && split_backward)
                rc = emit_compute(shape, r, LOOM_ACT_BACKWARD_WEIGHT, 0, next_w++);
        }
        while (split_backward && next_w < m && rc == LOOM_OK)
            rc = emit_compute(shape, r, LOOM_ACT_BACKWARD_WEIGHT, 0, next_w++);
    }
    return rc;
}

/* Megatron's interleaved 1F1B. Each rank walks m·v "virtual micro-batches":
 * forwards go through the virtual stages in groups of p micro-batches
 * (vs 0 for micro-batches 0..p−1, vs 1 for the same, ..., then vs 0 for
 * p..2p−1), backwards the same way from the last virtual stage down. Rank r
 * warms up with 2(p−r−1) + (v−1)p forwards (all of them when m = p), then
 * alternates, then drains. The groups of p are why m must be a multiple of
 * p. */
static int schedule_interleaved(const loom_host *host, const loom_pipeline_shape *shape)
{
    int p = shape->stages, v = shape->virtual_stages, m = shape->microbatches, rc = LOOM_OK;
    if (v < 2)
        return host->error(host, LOOM_ERR_INVALID,
                           "interleaved: needs parallel.pp.virtual_stages of 2 or more "
                           "(got %d); with one, use the 1f1b schedule", v);
    if (m % p != 0 && m < p)
        return host->error(host, LOOM_ERR_INVALID,
                           "interleaved: parallel.pp.microbatches = %d is not a multiple of "
                           "parallel.pp.size = %d (micro-batches go through the virtual "
                           "stages in groups of %d); use %d", m, p, p, p);
    if (m % p != 0)
        return host->error(host, LOOM_ERR_INVALID,
                           "interleaved: parallel.pp.microbatches = %d is not a multiple of "
                           "parallel.pp.size = %d (micro-batches go through the virtual "
                           "stages in groups of %d); use %d or %d",
                           m, p, p, m / p * p, (m / p + 1) * p);
    int total = m * v, group = p * v;
    for (int r = 0; r < p && rc == LOOM_OK; r++) {
        int warmup = m == p ? total : 2 * (p - r - 1) + (v - 1) * p;
        if (warmup > total)
            warmup = total;
        int steady = total - warmup;
        int next_forward = 0, next_backward = 0;
        /* k-th virtual micro-batch: its micro-batch and its virtual stage */
#define MB_OF(k) ((k) / group * p + (k) % p)
#define VS_FORWARD(k) ((k) % group / p)
#define VS_BACKWARD(k) (v - 1 - (k) % group / p)
        for (; next_forward < warmup && rc == LOOM_OK; next_forward++)
            rc = emit_compute(shape, r, LOOM_ACT_FORWARD, VS_FORWARD(next_forward),
                              MB_OF(next_forward));
        for (int i = 0; i < steady && rc == LOOM_OK; i++, next_forward++, next_backward++) {
            rc = emit_compute(shape, r, LOOM_ACT_FORWARD, VS_FORWARD(next_forward),
                              MB_OF(next_forward));
            if (rc == LOOM_OK)
                rc = emit_compute(shape, r, LOOM_ACT_BACKWARD, VS_BACKWARD(next_backward),
                                  MB_OF(next_backward));
        }
        for (; next_backward < total && rc == LOOM_OK; next_backward++)
            rc = emit_compute(shape, r, LOOM_ACT_BACKWARD, VS_BACKWARD(next_backward),
                              MB_OF(next_backward));
#undef MB_OF
#undef VS_FORWARD
#undef VS_BACKWARD
    }
    return rc;
}

static int pp_build(const loom_host *host, const loom_pipeline_shape *shape)
{
    switch (schedule) {
    case PP_GPIPE: return schedule_gpipe(shape);
    case PP_1F1B: return schedule_1f1b(host, shape, 0);
    case PP_INTERLEAVED: return schedule_interleaved(host, shape);
    default: return schedule_1f1b(host, shape, 1); /* PP_ZB_H1 */
    }
}

/* The bubble theory gives under the simulator's unit costs. GPipe and 1F1B
 * idle (p−1) forward+backward times per rank; interleaved a v-th of that;
 * ZB-H1 (p−1)(F + B − W) = p−1 units against 3m of work, once m >= p fills
 * its steady state. */
static double pp_bubble(int p, int v, int m, const char **formula)
{
    if (schedule == PP_INTERLEAVED) {
        *formula = "(p-1)/(v·m+p-1)";
        return (double)(p - 1) / ((double)v * m + p - 1);
    }
    if (schedule == PP_ZB_H1) {
        *formula = "(p-1)/(3m+p-1)";
        return m >= p ? (double)(p - 1) / (3.0 * m + p - 1) : -1.0;
    }
    *formula = "(p-1)/(m+p-1)";
    return schedule == PP_GPIPE && v != 1 ? -1.0 : (double)(p - 1) / (m + p - 1);
}

LOOM_PLUGIN_EXPORT const loom_schedule_plugin_v1_t loom_schedule_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_SCHEDULE, loom_schedule_plugin_v1_t, SCHEDULE_NAME,
                                 SCHEDULE_TEXT, NULL),
    .build = pp_build,
    .bubble = pp_bubble,
};
