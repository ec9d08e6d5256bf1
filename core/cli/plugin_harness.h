/* loom CLI — the numerics harness of `loom plugins --check FILE --train
 * CONFIG`: the plugin trains CONFIG at several rank counts, and each run's
 * per-step losses, gradient norms and final weights are compared with the
 * single-rank run of CONFIG (or, with a named reference, with that plugin
 * at the same rank count). And the functional checks of a compute
 * backend, which `loom plugins --check FILE` runs. */
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
    double tolerance;             /* --tolerance: the loss's relative drift allowed per
                                     step; 0: the fp32 contract's bounds */
    const char *reference;        /* --reference: this plugin on the same axis at the same
                                     rank count is the reference; NULL: the single-rank
                                     run with the core's default */
} loom_harness_options;

/* Runs the harness on a plugin that passed the conformance checks; prints
 * one line per run, and with a tolerance a table of the drift per step. 0
 * when every run checked holds, 1 on a divergence, a failed run or nothing
 * checked, 2 on bad options. */
int loom_plugin_harness(const loom_plugin *plugin, const loom_harness_options *o);

/* The functional checks of a compute backend under `loom plugins --check`,
 * on device 0 with one thread, f32, deterministic: probe (a backend that
 * declines is noted and not checked further), create, describe, alloc (or
 * host memory for a host-tier backend without one), a round trip through
 * to_device and to_host, copy, zero, one gemm and one layernorm_forward
 * against the built-in cpu backend's bits, synchronize, status, free and
 * destroy. report hears each check as it runs (failure NULL when it
 * passed); notes are printed. */
typedef void (*loom_check_report)(void *ctx, const char *check, const char *failure);
void loom_compute_check(const loom_plugin *plugin, const loom_host *host,
                        loom_check_report report, void *ctx);

#endif
