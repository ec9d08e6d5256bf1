/* loom train — what the trainer shows the check of its machine that its
 * caller passes (loom_train_options.check_machine; `loom train` passes the
 * planner's, loom_plan_check_machine). The trainer runs it on every rank
 * once the mesh and the pipeline's schedule exist, before anything is
 * allocated, and the ranks agree on its outcome (fit.c). */
#ifndef LOOM_TRAIN_FIT_H
#define LOOM_TRAIN_FIT_H

#include "runtime/config.h"
#include "train/schedule.h"

typedef struct loom_train_machine {
    loom_config *cfg;
    int rank, world;
    int first, local; /* the ranks of this machine: world ranks first .. first + local - 1 */
    const loom_schedule *schedule; /* the pipeline's when parallel.pp.size > 1, else NULL */
} loom_train_machine;

/* LOOM_OK, or the failure with its one line (loom_fail) that stops the job. */
typedef int (*loom_train_machine_check)(const loom_train_machine *m);

#endif
