/* loom runtime — Accounted memory by tier and purpose. */
#ifndef LOOM_RUNTIME_MEMORY_H
#define LOOM_RUNTIME_MEMORY_H

#include <stddef.h>
#include <stdint.h>
#include "loom/plugin.h"

/* Accounted allocation by tier and purpose, for the core and (through the
 * host table) plugins. */
int loom_mem_alloc(loom_tier tier, loom_purpose purpose, size_t bytes, void **out);
void loom_mem_free(void *ptr);
typedef struct loom_mem_usage {
    uint64_t current[LOOM_TIER_COUNT][LOOM_PURPOSE_COUNT];
    uint64_t peak[LOOM_TIER_COUNT][LOOM_PURPOSE_COUNT];
    uint64_t peak_total[LOOM_TIER_COUNT]; /* peak of the tier's sum, not a sum of peaks */
} loom_mem_usage;
void loom_mem_usage_get(loom_mem_usage *out);
void loom_mem_usage_reset_peak(void);

#endif
