/* loom train — one training run from a config, the whole of `loom train`
 * below its argument parsing. */
#ifndef LOOM_TRAIN_TRAIN_H
#define LOOM_TRAIN_TRAIN_H

#include "loom/tensor.h"
#include "model/formats.h"
#include "runtime/config.h"

struct loom_train_machine;

typedef struct loom_train_options {
    const char *config, *metrics, *trace, *save, *resume; /* NULL: not asked for */
    loom_dtype save_dtype; /* --save's: LOOM_F32 (llm.c's version 3) or LOOM_BF16 (version 5) */
    const char *const *overrides;                         /* --set path=value */
    int noverrides;
    int *started; /* set to 1 once training begins, after every check of the setup; or NULL */
    /* checks the machine can hold the job, before any allocation (train/fit.h); or NULL */
    int (*check_machine)(const struct loom_train_machine *m);
} loom_train_options;

/* Set up the runtime, mesh, model and strategies from o->config, train
 * train.steps steps, then save/trace as asked. On failure the detail is in
 * loom_last_error(). */
int loom_train(const loom_train_options *o);

/* The model's shape from cfg's model.*. With model.init = "checkpoint" the
 * checkpoint's header gives every shape setting the config leaves unset
 * (recorded in cfg, so later reads and `loom settings` see the file's
 * values), and every one the config sets must agree with it. */
int loom_train_model_shape(loom_config *cfg, loom_gpt2_shape *shape);

#endif
