/* loom CLI — the numerics harness of `loom plugins --check FILE --train
 * CONFIG`: the plugin trains CONFIG at several rank counts, and each run's
 * per-step losses, gradient norms and final weights are compared with the
 * single-rank run of CONFIG. */
#ifndef LOOM_CLI_PLUGIN_HARNESS_H
#define LOOM_CLI_PLUGIN_HARNESS_H

#include "runtime/loader.h"

typedef struct loom_harness_options {
    const char *config;
    const char *const *overrides; /* "path=value", applied to every run */
    int noverrides;
    const char *ranks;            /* "1,2,4"; NULL: that */
    const char *keep;             /* keep the runs' files here; NULL: a temporary directory */
    double timeout_s;             /* per run; 0: the default */
} loom_harness_options;

/* Runs the harness on a plugin that passed the conformance checks; prints
 * one line per run. 0 when every run matches, 1 on a divergence or a failed
 * run, 2 on bad options. */
int loom_plugin_harness(const loom_plugin *plugin, const loom_harness_options *o);

#endif
