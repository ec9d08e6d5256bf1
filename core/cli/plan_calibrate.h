/* loom CLI — `loom plan --calibrate`: this machine measured into a cluster
 * (docs/plan.md, "Calibrating this machine").
 *
 * Three parts, each usable alone:
 *   - loom_plan_calibrate: cores, host memory, the matrix products' rate, the memcpy
 *     rate, and `loom bench`'s collectives at 2 and 4 ranks, fitted;
 *   - loom_plan_calibrate_reference: one rank of `loom train` on a
 *     reference config, its median step time;
 *   - loom_plan_calibrate_count and _effective_memory: the planner's count
 *     of that step, and from it the rate the non-GEMM kernels really run
 *     at here, in place of the memcpy roof (loom_plan_calibrate_compute
 *     does the three). */
#ifndef LOOM_CLI_PLAN_CALIBRATE_H
#define LOOM_CLI_PLAN_CALIBRATE_H

#include <stdio.h>

#include "plan/plan.h"

enum { LOOM_PLAN_CALIBRATION_NOTES = 24 };

/* A measured cluster and, per field, how it was measured (written as the
 * file's comments by loom_plan_calibration_write). */
typedef struct loom_plan_calibration {
    loom_plan_cluster cluster;
    char comm[16];        /* the backend the collectives ran on: "ucx", else "mpi" */
    double gemm_flops;    /* the matrix products, one thread, f32: cluster.flops[f32] */
    double memcpy_bytes_per_s; /* single thread, reads + writes: the roof before any reference */
    double seconds;       /* how long loom_plan_calibrate took */
    loom_dtype reference_dtype; /* the reference run's precision (f32 on a CPU) */
    int nnotes;
    char note_field[LOOM_PLAN_CALIBRATION_NOTES][32];
    char note_text[LOOM_PLAN_CALIBRATION_NOTES][1024];
} loom_plan_calibration;

/* Measure this machine with loom_exe (the loom program, to run `loom launch
 * ... loom bench`): collectives at 2 and 4 ranks, those <= max_ranks.
 * progress: a line per measurement (NULL: quiet). */
int loom_plan_calibrate(const char *loom_exe, int max_ranks, FILE *progress,
                        loom_plan_calibration *out);

/* loom_plan_calibrate with the ranks computing on a compute backend,
 * device ("cuda", "sim"; "auto": cuda where it runs, else the CPU as
 * loom_plan_calibrate): the backend opened for config with sets (its
 * compute.<name> settings), device = true, device_memory, the peaks of
 * its own products on config's MLP-up shape and a roof of its own
 * copies; the host's collectives as loom_plan_calibrate times them.
 * opened: the backend measured ("cpu": none). Then
 * loom_plan_calibrate_compute with model.device among sets fits the rate
 * of its other kernels. */
int loom_plan_calibrate_device(const char *loom_exe, int max_ranks, const char *device,
                               const char *config, const char *const *sets, int nsets,
                               FILE *progress, loom_plan_calibration *out, char *opened,
                               size_t cap);

/* The median step time, steps 3 on, of one rank of `loom train config
 * --set ...` (sets: "path=value"; data.train among them when the config
 * has none), with one BLAS thread. */
int loom_plan_calibrate_reference(const char *loom_exe, const char *config,
                                  const char *const *sets, int nsets, double *step_s);

/* The planner's count of one step of the job config describes (one rank,
 * fp32; any precision when cluster->device): loom_plan_make's gemm_flops
 * and other_bytes on cluster. */
int loom_plan_calibrate_count(const char *config, const char *const *sets, int nsets,
                              const loom_plan_cluster *cluster, double *gemm_flops,
                              double *other_bytes);

/* The reference step (step_s) counted as gemm_flops and other_bytes: the
 * non-GEMM kernels' effective rate, other_bytes / (step_s - gemm_flops /
 * flops[reference_dtype]), replaces cluster.memory_bytes_per_s, and a note says so.
 * Refused when the GEMMs alone explain the step (nothing left to fit). */
int loom_plan_calibrate_effective_memory(loom_plan_calibration *cal, const char *config,
                                         double step_s, double gemm_flops, double other_bytes);

/* The three above on config (tests/zero/tiny.cfg with data.train among
 * sets, say), after loom_plan_calibrate filled cal. */
int loom_plan_calibrate_compute(loom_plan_calibration *cal, const char *loom_exe,
                                const char *config, const char *const *sets, int nsets,
                                FILE *progress);

/* The cluster with its notes (loom_plan_cluster_write_notes). */
int loom_plan_calibration_write(const loom_plan_calibration *cal, const char *path);

#endif
