/* loom core — the run's compute backend (loom/compute.h): the built-in cpu
 * backend or a compute plugin, chosen by model.device, and the services
 * built on it that strategies reach through loom_host's compute. */
#ifndef LOOM_MODEL_COMPUTE_H
#define LOOM_MODEL_COMPUTE_H

#include "loom/compute.h"
#include "loom/strategy.h"

/* The built-in backend: the CPU kernels (kernels.h, gemm.h, optimizer.h). */
extern const loom_compute_plugin_v1_t loom_compute_cpu;

/* A backend instance as the core holds it. */
typedef struct loom_backend {
    const loom_compute_plugin_v1_t *ops;
    loom_compute *self;
    const char *name; /* "cpu", "sim", "cuda" */
} loom_backend;

/* The process's cpu backend, created on first use (threads: the kernels'). */
loom_backend *loom_backend_cpu(void);

#endif
