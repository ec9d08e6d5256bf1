/* loom train — one training run from a config, the whole of `loom train`
 * below its argument parsing. */
#ifndef LOOM_TRAIN_TRAIN_H
#define LOOM_TRAIN_TRAIN_H

typedef struct loom_train_options {
    const char *config, *metrics, *trace, *save, *resume; /* NULL: not asked for */
    const char *const *overrides;                         /* --set path=value */
    int noverrides;
} loom_train_options;

/* Set up the runtime, mesh, model and strategies from o->config, train
 * train.steps steps, then save/trace as asked. On failure the detail is in
 * loom_last_error(). */
int loom_train(const loom_train_options *o);

#endif
