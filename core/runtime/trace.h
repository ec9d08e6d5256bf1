/* loom runtime — The Chrome/Perfetto trace. */
#ifndef LOOM_RUNTIME_TRACE_H
#define LOOM_RUNTIME_TRACE_H

#include <stdint.h>
#include "loom/plugin.h"

/* Spans on the Chrome/Perfetto timeline (one process per rank, one thread
 * per lane), recorded only after loom_trace_enable(). */
void loom_trace_enable(int rank);
/* Whether spans are recorded: callers skip reading the clock when not. */
int loom_trace_enabled(void);
void loom_trace_span(loom_trace_lane lane, const char *name, uint64_t start_ns,
                     uint64_t end_ns, uint64_t bytes);
/* A sample of counters at ts_ns: one track per key in Perfetto, under
 * name. keys are kept, not copied: they must outlive the trace (string
 * literals). At most LOOM_TRACE_COUNTER_KEYS of them. */
enum { LOOM_TRACE_COUNTER_KEYS = 16 };
void loom_trace_counters(const char *name, uint64_t ts_ns, const char *const *keys,
                         const double *values, int nkeys);
/* Each rank writes its part (one event per line); rank 0 merges the parts
 * into one Chrome/Perfetto JSON file and removes them. */
int loom_trace_write_part(const char *path);
int loom_trace_merge(const char *path, const char *const *parts, int nparts);

#endif
