/* plugins/common — a data strategy's optimizer state: fp32 master weights
 * (16-bit runs) and Adam's m and v, one segment per unit, placed by
 * memory.offload through the host's tiered service (ZeRO-Offload), so the
 * optimizer step can stream it: fetch unit i+1, step unit i, release it
 * dirty (written behind). In host memory every call is free. */
#ifndef LOOM_PLUGIN_COMMON_OPT_STATE_H
#define LOOM_PLUGIN_COMMON_OPT_STATE_H

#include <stddef.h>

#include "loom/plugin.h"

typedef struct opt_state {
    const loom_host *host;
    loom_tiered *master, *m, *v; /* master NULL: the parameters are their own (fp32) */
    int nunits;
} opt_state;

/* One unit's state in host memory, between acquire and release. */
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

/* Whether the host has the tiered service (ABI 1.4); else one line saying
 * what is missing, through host->error, naming the plugin. */
int opt_state_check_host(const loom_host *host, const char *name);

#endif
