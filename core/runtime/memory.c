/* Accounted memory: every allocation is tagged with a tier and a purpose,
 * and the core keeps current and peak bytes for each pair, so a run can
 * print its footprint and a test can assert it exactly. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "runtime/device.h"
#include "runtime/log.h"
#include "runtime/memory.h"

#define ALIGNMENT 64
#define MAGIC 0x6c6f6f6d6d656d31ull /* "loommem1" */

/* Sits just before the user's block; a full alignment unit so the block
 * stays 64-byte aligned. */
typedef struct block_header {
    uint64_t magic;
    uint64_t bytes;
    uint32_t tier;
    uint32_t purpose;
    unsigned char pad[ALIGNMENT - 24];
} block_header;
_Static_assert(sizeof(block_header) == ALIGNMENT, "header keeps the block aligned");

static pthread_mutex_t usage_lock = PTHREAD_MUTEX_INITIALIZER;
static loom_mem_usage usage;

static void account(loom_tier tier, loom_purpose purpose, int64_t delta)
{
    pthread_mutex_lock(&usage_lock);
    usage.current[tier][purpose] += (uint64_t)delta;
    if (usage.current[tier][purpose] > usage.peak[tier][purpose])
        usage.peak[tier][purpose] = usage.current[tier][purpose];
    uint64_t total = 0;
    for (int p = 0; p < LOOM_PURPOSE_COUNT; p++)
        total += usage.current[tier][p];
    if (total > usage.peak_total[tier])
        usage.peak_total[tier] = total;
    pthread_mutex_unlock(&usage_lock);
}

int loom_mem_alloc(loom_tier tier, loom_purpose purpose, size_t bytes, void **out)
{
    if ((unsigned)purpose >= LOOM_PURPOSE_COUNT)
        return loom_fail(LOOM_ERR_INVALID, "memory: unknown purpose %d", (int)purpose);
    if (tier == LOOM_TIER_DEVICE || tier == LOOM_TIER_PINNED) {
#ifdef LOOM_HAVE_CUDA
        /* device.c keeps these blocks (no header in front: the CPU cannot
         * write device memory); the accounting stays here. */
        int rc = loom_device_alloc(tier, purpose, bytes, out);
        if (rc == LOOM_OK)
            account(tier, purpose, (int64_t)bytes);
        return rc;
#else
        return loom_fail(LOOM_ERR_NOT_SUPPORTED,
                         "memory: the %s tier needs a loom built with CUDA (CMake did not find "
                         "the CUDA toolkit; set CUDAToolkit_ROOT and reconfigure)",
                         loom_tier_name(tier));
#endif
    }
    if (tier != LOOM_TIER_HOST) {
        /* NVMe is not addressable and goes through its memtier plugin. */
        return loom_fail(LOOM_ERR_NOT_SUPPORTED,
                         "memory: the %s tier is not addressable; use its memtier plugin",
                         loom_tier_name(tier));
    }
    void *raw = NULL;
    if (posix_memalign(&raw, ALIGNMENT, sizeof(block_header) + bytes) != 0)
        return loom_fail(LOOM_ERR_NO_MEMORY, "memory: cannot allocate %zu bytes of %s for %s",
                         bytes, loom_tier_name(tier), loom_purpose_name(purpose));
    block_header *h = raw;
    h->magic = MAGIC;
    h->bytes = bytes;
    h->tier = (uint32_t)tier;
    h->purpose = (uint32_t)purpose;
    account(tier, purpose, (int64_t)bytes);
    *out = h + 1;
    return LOOM_OK;
}

void loom_mem_free(void *ptr)
{
    if (!ptr)
        return;
#ifdef LOOM_HAVE_CUDA
    /* Device and pinned blocks first: reading a header in front of a device
     * pointer would fault. */
    loom_tier dtier;
    loom_purpose dpurpose;
    uint64_t dbytes;
    if (loom_device_free(ptr, &dtier, &dpurpose, &dbytes)) {
        account(dtier, dpurpose, -(int64_t)dbytes);
        return;
    }
#endif
    block_header *h = (block_header *)ptr - 1;
    if (h->magic != MAGIC) {
        loom_log(LOOM_LOG_ERROR, "memory: free of a pointer loom did not allocate (%p)", ptr);
        return;
    }
    h->magic = 0;
    account((loom_tier)h->tier, (loom_purpose)h->purpose, -(int64_t)h->bytes);
    free(h);
}

void loom_mem_usage_get(loom_mem_usage *out)
{
    pthread_mutex_lock(&usage_lock);
    *out = usage;
    pthread_mutex_unlock(&usage_lock);
}

void loom_mem_usage_reset_peak(void)
{
    pthread_mutex_lock(&usage_lock);
    memcpy(usage.peak, usage.current, sizeof usage.peak);
    for (int t = 0; t < LOOM_TIER_COUNT; t++) {
        uint64_t total = 0;
        for (int p = 0; p < LOOM_PURPOSE_COUNT; p++)
            total += usage.current[t][p];
        usage.peak_total[t] = total;
    }
    pthread_mutex_unlock(&usage_lock);
}
