/* loom runtime — Tiered model state: where memory.offload puts each purpose
 * (host memory or a memtier plugin's tier), and the read-ahead and
 * write-behind that move it (the loom_tiered service of loom/plugin.h). */
#ifndef LOOM_RUNTIME_TIER_H
#define LOOM_RUNTIME_TIER_H

#include <stdint.h>

#include "loom/plugin.h"

struct loom_runtime;
typedef struct loom_tiers loom_tiers;

/* memory.offload's answer for a purpose. */
typedef enum loom_offload {
    LOOM_OFFLOAD_NONE = 0, /* where the model computes: host or device memory */
    LOOM_OFFLOAD_HOST = 1, /* host memory (off the device, where there is one) */
    LOOM_OFFLOAD_NVME = 2, /* the nvme memtier plugin's files */
} loom_offload;

/* Bytes moved between host memory and the tier, since the start. */
typedef struct loom_tier_counters {
    uint64_t read[LOOM_PURPOSE_COUNT], written[LOOM_PURPOSE_COUNT];
    uint64_t wait_ns; /* time callers sat waiting for a transfer */
} loom_tier_counters;

/* Reads memory.offload, loads and creates the nvme tier when a purpose goes
 * there (so a bad path fails at start), and refuses the tier's settings
 * when none does. */
int loom_tiers_create(struct loom_runtime *rt, loom_tiers **out);
void loom_tiers_destroy(loom_tiers *t);
loom_offload loom_tiers_offload(const loom_tiers *t, loom_purpose purpose);
const char *loom_offload_name(loom_offload o);
/* Where the run's model computes, once its backend is open: backend is the
 * name of one that keeps it in device memory, or NULL (host memory). On a
 * device, a purpose memory.offload leaves at "none" has its home in the
 * device tier, used in place; "host" and "nvme" move it off the device. */
void loom_tiers_set_device(loom_tiers *t, const char *backend);

/* The loom_host service (see loom/plugin.h). */
int loom_tiers_alloc(loom_tiers *t, loom_purpose purpose, const char *name, int nsegments,
                     const size_t *segment_bytes, loom_tiered **out);
void loom_tiers_free(loom_tiered *b);
int loom_tiers_fetch(loom_tiered *b, int segment);
int loom_tiers_acquire(loom_tiered *b, int segment, unsigned mode, void **ptr);
int loom_tiers_release(loom_tiered *b, int segment, int dirty);

/* Notes transfers that completed (their trace spans end then). */
int loom_tiers_progress(loom_tiers *t);
/* Waits for every write-back and gives back its staging memory. */
int loom_tiers_flush(loom_tiers *t);
void loom_tiers_counters(const loom_tiers *t, loom_tier_counters *out);
/* After data_setup: a purpose memory.offload moves that the strategy
 * placed nowhere through the service is refused (the setting would do
 * nothing). strategy: its name, for the message. */
int loom_tiers_check_used(const loom_tiers *t, const char *strategy);
/* After data_setup under memory.host_limit: the one refusal that weighs
 * the whole model state, and the offload that would make it fit. */
int loom_tiers_settle_budget(const loom_tiers *t);

#endif
