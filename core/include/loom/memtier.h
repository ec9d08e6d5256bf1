/* loom — the memory-tier ABI (docs/architecture.md).
 *
 * A tier stores blocks and moves bytes between them and host memory,
 * asynchronously. The core has built-in tiers for host memory and, when
 * built with CUDA, device and pinned memory; offload-nvme adds files on a
 * fast disk. Exported as `const loom_memtier_plugin_v1_t loom_memtier_plugin_v1`.
 *
 * Accounting is the core's job: every alloc goes through the core with a
 * purpose (loom_purpose), and the core keeps current and peak bytes per tier
 * and purpose. A tier only reports its capacity. */
#ifndef LOOM_MEMTIER_H
#define LOOM_MEMTIER_H

#include "loom/plugin.h"

typedef struct loom_memtier loom_memtier;             /* a tier instance */
typedef struct loom_tier_block loom_tier_block;       /* a tier's allocation */
typedef struct loom_tier_request loom_tier_request;   /* an in-flight transfer */

/* flags */
#define LOOM_TIER_HOST_ADDRESSABLE (1u << 0)   /* address() gives a CPU pointer */
#define LOOM_TIER_DEVICE_ADDRESSABLE (1u << 1) /* address() gives a device pointer */

typedef struct loom_memtier_plugin_v1_t {
    loom_plugin_header header; /* kind = LOOM_PLUGIN_MEMTIER */
    uint32_t tier;             /* the loom_tier it provides */
    uint32_t flags;

    /* ---- REQUIRED ---- */
    int (*create)(const loom_host *host, loom_memtier **out);
    int (*destroy)(loom_memtier *tier);
    /* total and still-available bytes of the tier on this rank */
    int (*capacity)(loom_memtier *tier, uint64_t *total, uint64_t *available);
    /* A new block reads as zeros until written. */
    int (*alloc)(loom_memtier *tier, size_t bytes, size_t alignment, loom_tier_block **out);
    int (*free)(loom_memtier *tier, loom_tier_block *block);
    /* Copy bytes between a block and host memory, asynchronously; the source
     * (write) or destination (read) must stay untouched until completion.
     * Any range of the block; a tier that moves fixed-size pieces (nvme)
     * makes the partial ones whole itself. A tier may set *req = NULL when
     * the copy completed at issue. */
    int (*write)(loom_memtier *tier, loom_tier_block *dst, size_t offset, const void *src,
                 size_t bytes, loom_tier_request **req);
    int (*read)(loom_memtier *tier, loom_tier_block *src, size_t offset, void *dst,
                size_t bytes, loom_tier_request **req);
    /* LOOM_OK when done (released), LOOM_IN_PROGRESS, or an error (released). */
    int (*test)(loom_tier_request *req);
    int (*wait)(loom_tier_request *req);

    /* ---- OPTIONAL ---- */
    /* Direct address of an addressable tier's block (see flags). */
    void *(*address)(loom_tier_block *block);
    /* Hint: bytes of a block will be read soon (offload-nvme reads ahead). */
    int (*prefetch)(loom_memtier *tier, loom_tier_block *block, size_t offset, size_t bytes);
} loom_memtier_plugin_v1_t;

#endif
