/* loom runtime — Accounted memory by tier and purpose. */
#ifndef LOOM_RUNTIME_MEMORY_H
#define LOOM_RUNTIME_MEMORY_H

#include <stddef.h>
#include <stdint.h>
#include "loom/plugin.h"

/* Accounted allocation by tier and purpose, for the core and (through the
 * host table) plugins. The device tier allocates through the registered
 * device memory (below), or in builds with CUDA through runtime/device.c. */
int loom_mem_alloc(loom_tier tier, loom_purpose purpose, size_t bytes, void **out);
void loom_mem_free(void *ptr);
typedef struct loom_mem_usage {
    uint64_t current[LOOM_TIER_COUNT][LOOM_PURPOSE_COUNT];
    uint64_t peak[LOOM_TIER_COUNT][LOOM_PURPOSE_COUNT];
    uint64_t peak_total[LOOM_TIER_COUNT]; /* peak of the tier's sum, not a sum of peaks */
} loom_mem_usage;
void loom_mem_usage_get(loom_mem_usage *out);
void loom_mem_usage_reset_peak(void);
/* Bytes a tier holds that no host pointer stands for (a memtier plugin's
 * blocks), accounted like an allocation; delta < 0 gives them back. */
void loom_mem_account(loom_tier tier, loom_purpose purpose, int64_t delta);
/* Host and pinned bytes held now. */
uint64_t loom_mem_host_bytes(void);
/* "params 1.5 MiB, grads 1.5 MiB": host and pinned bytes held, by purpose. */
void loom_mem_host_parts(char *buf, size_t cap);
/* "1.5 MiB" */
void loom_mem_format(uint64_t bytes, char *buf, size_t cap);

/* Device memory: where the run's compute backend keeps its memory in the
 * device tier, the core registers the backend's allocator and copies here,
 * and loom_mem_alloc(LOOM_TIER_DEVICE, ...) allocates through it. The host
 * may not read such memory: the core never puts a header in front of a
 * device block, and reaches it only through to_host and to_device. */
typedef struct loom_device_memory {
    void *ctx;
    const char *name;       /* the backend's: "sim", "cuda" */
    loom_tier staging_tier; /* where staging copies live: LOOM_TIER_PINNED or LOOM_TIER_HOST */
    int (*alloc)(void *ctx, size_t bytes, void **out); /* zeroed */
    void (*free)(void *ctx, void *ptr);
    int (*to_host)(void *ctx, void *dst, const void *src, size_t bytes);
    int (*to_device)(void *ctx, void *dst, const void *src, size_t bytes);
} loom_device_memory;
/* Copied; dm->name and dm->ctx must outlive the registration. NULL
 * unregisters (after the backend's blocks are freed). */
void loom_mem_set_device(const loom_device_memory *dm);
/* 1 when ptr lies anywhere inside a live device block (any offset). */
int loom_mem_is_device(const void *ptr);
/* Copies between host memory and device memory (a device block or a part
 * of one), through the registered backend or CUDA. */
int loom_mem_device_to_host(void *dst, const void *src, size_t bytes);
int loom_mem_host_to_device(void *dst, const void *src, size_t bytes);
/* The tier host copies of device memory live in (the registered backend's
 * staging_tier; pinned memory with CUDA); LOOM_TIER_HOST without either. */
loom_tier loom_mem_staging_tier(void);

/* memory.host_limit: host and pinned allocations that would hold more are
 * refused, naming the purpose, the bytes asked and the budget, and what the
 * advisor (the offload tiers) suggests. 0: no limit. */
void loom_mem_set_host_limit(uint64_t bytes);
uint64_t loom_mem_host_limit(void);
typedef void (*loom_mem_advisor)(void *ctx, loom_purpose purpose, uint64_t asked, char *buf,
                                 size_t cap);
void loom_mem_set_advisor(loom_mem_advisor advisor, void *ctx);
/* The refusal's text: asked more bytes of purpose with in_use held. */
void loom_mem_budget_text(loom_purpose purpose, uint64_t asked, uint64_t in_use, char *buf,
                          size_t cap);
/* While deferred (the model state being placed), over-budget allocations
 * pass as long as the machine has the memory, and the first is remembered,
 * so that one refusal afterwards can weigh the whole state. */
typedef struct loom_mem_overrun {
    loom_purpose purpose; /* of the first allocation past the limit */
    uint64_t bytes;       /* it asked; 0: none passed the limit */
    uint64_t in_use;      /* host bytes held then */
} loom_mem_overrun;
void loom_mem_defer_limit(int on);
/* 1 when the host now holds more than the limit; *out: the first overrun. */
int loom_mem_overrun_get(loom_mem_overrun *out);

#endif
