/* loom core — pipeline schedules as data (docs/pipeline.md).
 *
 * A schedule plugin emits each pp rank's list of actions; the core checks
 * the lists here before anything runs, simulates them under per-kind costs
 * and draws them. The executor (pipeline.h) runs them.
 *
 * Conventions. p = pp ranks, v = virtual stages per rank, m = micro-batches.
 * Virtual stage vs on pp rank r is stage s = vs·p + r, of S = p·v stages;
 * stage s+1 lives on rank (s+1) mod p. An action (kind, vs, mb) in rank r's
 * list refers to stage s = vs·p + r:
 *   send activation: stage s's output for mb, to the rank of stage s+1
 *   recv activation: stage s's input for mb, from the rank of stage s−1
 *   send gradient:   the gradient of stage s's input, to stage s−1
 *   recv gradient:   the gradient of stage s's output, from stage s+1
 *
 * What the validator requires, rank by rank in list order:
 *   - a known kind, vs in [0, v), mb in [0, m); receives and sends only
 *     where a neighbouring stage exists;
 *   - forward after its recv activation (s > 0); send activation after the
 *     forward; backward or backward-input after the forward and (s < S−1)
 *     the recv gradient; backward-weight after backward-input; send
 *     gradient after backward or backward-input;
 *   - once per (stage, mb): a forward, and either a backward or a
 *     backward-input + backward-weight pair (never a mix), and each send and
 *     recv the stage needs;
 *   - every send has its recv on the neighbour's rank and vice versa;
 *   - no deadlock: sends never block, a receive waits until its send has
 *     run; all ranks' lists must run to the end.
 * A refusal is one line naming the schedule, the rank, the index in its
 * list and the action. */
#ifndef LOOM_TRAIN_SCHEDULE_H
#define LOOM_TRAIN_SCHEDULE_H

#include <stddef.h>
#include <stdio.h>

#include "loom/schedule.h"
#include "runtime/loader.h"

typedef struct loom_schedule {
    char name[64];        /* the plugin's name, used in every message */
    int stages;           /* p: pp ranks */
    int virtual_stages;   /* v */
    int microbatches;     /* m */
    int *count;           /* [p] actions in each rank's list */
    loom_action **actions; /* [p][count[r]] */
    int *cap;             /* [p] room in each list (building) */
} loom_schedule;

/* An empty schedule of p ranks, to be filled with loom_schedule_append
 * (the plugins' emit does this; tests build lists by hand). */
int loom_schedule_init(loom_schedule *s, const char *name, int stages, int virtual_stages,
                       int microbatches);
int loom_schedule_append(loom_schedule *s, int rank, loom_action action);
void loom_schedule_free(loom_schedule *s); /* leaves s zeroed; safe on a zeroed struct */

/* Ask the schedule plugin for its lists (loom_plugin_schedule_build: an
 * adapted one too) and validate them; host is its own (parallel.pp). The
 * plugin's name is the schedule's in every message. On failure out is
 * freed and the one-line reason recorded (loom_fail). */
int loom_schedule_build(const loom_plugin *plugin, const loom_host *host, int stages,
                        int virtual_stages, int microbatches, loom_schedule *out);
int loom_schedule_validate(const loom_schedule *s);

/* Stage of virtual stage vs on rank r, and the rank holding a stage. */
static inline int loom_schedule_stage(const loom_schedule *s, int rank, int virtual_stage)
{
    return virtual_stage * s->stages + rank;
}
static inline int loom_schedule_rank_of(const loom_schedule *s, int stage)
{
    return stage % s->stages;
}

/* "forward", "backward", "backward-input", "backward-weight",
 * "send activation", "recv activation", "send gradient", "recv gradient";
 * "unknown" otherwise. */
const char *loom_action_kind_name(int kind);
/* Forward and the three backward kinds: the actions that take compute time. */
int loom_action_is_compute(int kind);
/* "rank 1, action 7 (backward mb 2, virtual stage 0 = stage 1)". */
void loom_action_describe(const loom_schedule *s, int rank, int index, char *buf, size_t cap);

/* ---- simulation ---- */

/* The simulator's costs: forward 1, backward-input 1, backward-weight 1,
 * backward 2 (both), sends and receives 0. */
void loom_schedule_default_costs(double cost[LOOM_ACT_KIND_COUNT]);

/* Every action's start and end time when each rank runs its list in order,
 * an action starting when the previous one on its rank has ended and (a
 * receive) when its data has arrived.
 *
 * Transfers cost link latency: a send's data arrives `transfer` time units
 * after the send has ended (its own cost, 0 under `loom schedule`, holds
 * its rank; the latency does not), and the receive waits for the arrival.
 * A schedule that posts a send early (right after the compute that
 * produced it) and gives the receiving rank other work until it needs the
 * data hides the latency; one whose receive waits on a transfer just
 * started does not. Bandwidth (a link busy with one transfer delaying the
 * next) is not modelled. */
typedef struct loom_schedule_timeline {
    double makespan;  /* the last action's end; the first starts at 0 */
    double bubble;    /* idle compute: 1 − busy / (p × makespan) */
    double transfer;  /* the latency it was simulated with */
    double **start, **end; /* [p][count[r]] */
    /* [p][count[r]] for a receive, when its data arrived (its send's end +
     * transfer); 0 for the other actions */
    double **arrival;
    double *busy;     /* [p] compute time of each rank */
    /* [p] most stage-micro-batches alive at once on the rank: forward run,
     * backward (or backward-weight) not yet. One per (virtual stage, mb),
     * so with v = 1 it counts micro-batches. */
    int *peak_stash;
} loom_schedule_timeline;

/* s must be valid (loom_schedule_validate). Free transfers (0). */
int loom_schedule_simulate(const loom_schedule *s, const double cost[LOOM_ACT_KIND_COUNT],
                           loom_schedule_timeline *out);
/* The same with a transfer latency >= 0, in the units of cost. */
int loom_schedule_simulate_transfers(const loom_schedule *s,
                                     const double cost[LOOM_ACT_KIND_COUNT], double transfer,
                                     loom_schedule_timeline *out);
void loom_schedule_timeline_free(const loom_schedule *s, loom_schedule_timeline *tl);

#endif
