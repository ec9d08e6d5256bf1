/* loom — the pipeline-schedule ABI (docs/pipeline.md).
 *
 * A schedule plugin runs nothing: it says in which order each pp rank runs
 * the forward and backward of each micro-batch on each of its virtual
 * stages, and the transfers between them, as one list of actions per rank.
 * The core validates the lists before the first step, simulates them
 * (`loom schedule`, `loom plan`) and executes them. The config names it
 * with parallel.pp.schedule; its own settings live in parallel.pp.
 * Exported as `const loom_schedule_plugin_v1_t loom_schedule_plugin_v1`
 * from libloom-schedule-<name>.so.
 *
 * Before ABI 1.8 schedules were strategy plugins of the pp axis
 * (loom/strategy.h: pipeline_schedule, pipeline_bubble). The core still
 * loads those, libloom-strategy-<name>.so included, through an adapter. */
#ifndef LOOM_SCHEDULE_H
#define LOOM_SCHEDULE_H

#include "loom/plugin.h"

typedef enum loom_action_kind {
    LOOM_ACT_FORWARD = 0,
    LOOM_ACT_BACKWARD = 1,        /* input and weight gradients together */
    LOOM_ACT_BACKWARD_INPUT = 2,
    LOOM_ACT_BACKWARD_WEIGHT = 3,
    LOOM_ACT_SEND_ACTIVATION = 4,
    LOOM_ACT_RECV_ACTIVATION = 5,
    LOOM_ACT_SEND_GRADIENT = 6,
    LOOM_ACT_RECV_GRADIENT = 7,
    LOOM_ACT_KIND_COUNT
} loom_action_kind;

typedef struct loom_action {
    uint16_t kind;          /* loom_action_kind */
    uint16_t virtual_stage; /* 0 .. virtual_stages-1 on this pp rank */
    int32_t microbatch;
} loom_action;

typedef struct loom_pipeline_shape {
    int stages;           /* pp ranks */
    int virtual_stages;   /* model chunks per pp rank */
    int microbatches;
    /* Stage s = virtual_stage * stages + pp_rank holds a contiguous range of
     * units; sends go to the rank holding stage s+1 (activations) or s-1
     * (gradients). */
    void *builder; /* opaque, passed back to emit */
    /* Append one action to pp_rank's list. */
    int (*emit)(void *builder, int pp_rank, loom_action action);
} loom_pipeline_shape;

typedef struct loom_schedule_plugin_v1_t {
    loom_plugin_header header; /* kind = LOOM_PLUGIN_SCHEDULE */

    /* ---- REQUIRED ---- */

    /* Emit every pp rank's action list through shape->emit. A shape the
     * schedule cannot serve (virtual stages it does not use, micro-batches
     * it cannot group) is refused with host->error, in one line naming the
     * parallel.pp setting to change. host: the plugin's config group
     * (parallel.pp) and log; valid during the call. */
    int (*build)(const loom_host *host, const loom_pipeline_shape *shape);

    /* ---- OPTIONAL ---- */

    /* The idle share of a step that theory gives for this schedule under
     * the simulator's unit costs (forward, backward-input and
     * backward-weight of one micro-batch on one virtual stage take one unit
     * each, a whole backward two, transfers nothing), with `stages` pp
     * ranks holding virtual_stages each and `microbatches` per step; the
     * formula as text in *formula (never NULL on return >= 0). < 0: no
     * closed form for these sizes. `loom schedule` prints it beside the
     * simulated bubble. */
    double (*bubble)(int stages, int virtual_stages, int microbatches, const char **formula);

    /* ---- since ABI 1.10 (OPTIONAL) ---- */

    /* bubble, for a formula that depends on the plugin's settings: host is
     * its config group (parallel.pp) and log, as build gets it, valid
     * during the call. The core calls it rather than bubble when both are
     * set. */
    double (*bubble_with_settings)(const loom_host *host, int stages, int virtual_stages,
                                   int microbatches, const char **formula);
} loom_schedule_plugin_v1_t;

#endif
