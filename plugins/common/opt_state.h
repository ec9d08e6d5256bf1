/* plugins/common — a data strategy's model state in segments, one per
 * unit, and its optimizer state: fp32 master weights (16-bit runs) and
 * Adam's m and v, placed by memory.offload through the host's tiered
 * service (ZeRO-Offload), so the optimizer step can stream it: fetch unit
 * i+1, step unit i, release it dirty (written behind). In host memory every
 * call is free. */
#ifndef LOOM_PLUGIN_COMMON_OPT_STATE_H
#define LOOM_PLUGIN_COMMON_OPT_STATE_H

#include <stddef.h>

#include "loom/plugin.h"

/* Segments of model state. The core's tiered service holds the optimizer
 * state, and where the model's buffers are host memory (the cpu backend)
 * every purpose, where memory.offload says: on a device backend, "none"
 * is the device tier and "host" or "nvme" host memory. Parameter and
 * gradient shards on a device are the compute service's memory, one block,
 * and fetch, acquire and release only point into it. Either way a segment
 * is read and written between acquire and release only through the compute
 * service (common/compute.h, whose copies take host memory on either side)
 * and host->comm. */
typedef struct state_buffer {
    const loom_host *host;
    loom_tiered *tiered; /* or */
    char *base;          /* the compute service's memory */
    size_t *offset;      /* of each segment in base */
    int nsegments;
} state_buffer;

/* bytes[i]: segment i's. Zeroed. name labels its transfers ("zero3 m"). */
int state_buffer_alloc(state_buffer *b, const loom_host *host, loom_purpose purpose,
                       const char *name, int nsegments, const size_t *bytes);
void state_buffer_free(state_buffer *b);
int state_buffer_fetch(state_buffer *b, int segment);
/* mode: LOOM_TIERED_READ or LOOM_TIERED_OVERWRITE (loom/plugin.h) */
int state_buffer_acquire(state_buffer *b, int segment, unsigned mode, void **ptr);
int state_buffer_release(state_buffer *b, int segment, int dirty);
static inline int state_buffer_allocated(const state_buffer *b)
{
    return b->tiered || b->base;
}

typedef struct opt_state {
    const loom_host *host;
    state_buffer master, m, v; /* master unallocated: the parameters are their own (fp32) */
    int nunits;
} opt_state;

/* One unit's state, between acquire and release. */
typedef struct opt_view {
    float *master, *m, *v; /* master NULL without master weights */
} opt_view;

/* elems[i]: unit i's elements. Zeroed. name starts the buffers' labels
 * ("zero3" gives "zero3 m"). */
int opt_state_alloc(opt_state *o, const loom_host *host, const char *name, int nunits,
                    const size_t *elems, int with_master);
void opt_state_free(opt_state *o);
int opt_state_fetch(opt_state *o, int unit);
int opt_state_acquire(opt_state *o, int unit, opt_view *out);
int opt_state_release(opt_state *o, int unit, int dirty);
static inline int opt_state_has_master(const opt_state *o)
{
    return state_buffer_allocated(&o->master);
}

/* Whether the host has the tiered service (ABI 1.4); else one line saying
 * what is missing, through host->error, naming the plugin. */
int opt_state_check_host(const loom_host *host, const char *name);

#endif
