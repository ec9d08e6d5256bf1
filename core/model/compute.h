/* loom core — the run's compute backend (loom/compute.h): the built-in cpu
 * backend or a compute plugin, chosen by model.device, and the services
 * built on it that strategies reach through loom_host's compute. */
#ifndef LOOM_MODEL_COMPUTE_H
#define LOOM_MODEL_COMPUTE_H

#include "loom/compute.h"
#include "loom/strategy.h"
#include "runtime/loader.h"

/* The built-in backend: the CPU kernels (kernels.h, gemm.h, optimizer.h). */
extern const loom_compute_ops loom_compute_cpu;

/* A backend instance as the core holds it. */
typedef struct loom_backend {
    const loom_compute_ops *ops;
    loom_compute *self;
    const char *name; /* "cpu", "sim", "cuda" */
} loom_backend;

/* The process's cpu backend, created on first use (threads: the kernels'). */
loom_backend *loom_backend_cpu(void);

/* The attention kernels a sequence strategy composes (loom_attention's
 * kernels), on backend b: positions arrive as host arrays. */
const loom_attention_kernels *loom_backend_attention_kernels(const loom_backend *b);

/* model.device: "cpu", "auto" (the cuda plugin where it loads and sees a
 * device, else cpu) or a compute plugin's name ("cuda", "sim"); setup's
 * cpu member is filled in here. why: the header's line on which backend
 * and why. A device-tier backend's memory becomes the device tier
 * (loom_mem_alloc) until close. */
struct loom_runtime;
int loom_backend_open(struct loom_runtime *rt, const char *device,
                      const loom_compute_setup *setup, loom_backend **out, char *why, size_t cap);
void loom_backend_close(loom_backend *b);
/* The tier the backend model.device names keeps the model in, as open
 * would choose it, without creating it (`loom plan`). */
int loom_backend_tier(struct loom_runtime *rt, const char *device, loom_tier *tier);
/* Serve b to strategies (loom_host's compute) and to the optimizer's
 * update functions; loom_backend_current: the backend served (NULL: none
 * yet, the cpu's kernels). */
int loom_backend_install(struct loom_runtime *rt, const loom_backend *b);
const loom_backend *loom_backend_current(void);
/* The backend's rate (FLOP/s) on out (M, N) = a (M, K) * b (K, N)^T with
 * operands stored in multiply's dtype, its best of several repeats over
 * about seconds; 0 when it could not run (loom_last_error says why). The
 * peak MFU is measured against on a device. */
double loom_backend_measure_gemm(const loom_backend *b, int M, int N, int K, loom_dtype multiply,
                                 double seconds);

#endif
