/* Accounted memory: every allocation is tagged with a tier and a purpose,
 * and the core keeps current and peak bytes for each pair, so a run can
 * print its footprint and a test can assert it exactly. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "runtime/device.h"
#include "runtime/log.h"
#include "runtime/memory.h"

#define ALIGNMENT 64
/* Blocks this big start on a page: the nvme tier moves them with O_DIRECT
 * straight from and to where they are. From HUGE up they start on a huge
 * page and ask for huge pages (transparent huge pages in "madvise" mode,
 * Debian's default): the disk moves memory in 2 MiB pages at its full
 * speed, 4 KiB pages cost it a third, and GEMMs walk fewer TLB entries. */
#define PAGE_ALIGNED_FROM (64u << 10)
#define PAGE 4096u
#define HUGE (2u << 20)
#define MAGIC 0x6c6f6f6d6d656d31ull /* "loommem1" */

/* Sits just before the user's block; a full alignment unit so the block
 * stays 64-byte aligned. */
typedef struct block_header {
    uint64_t magic;
    uint64_t bytes;
    uint32_t tier;
    uint32_t purpose;
    void *raw; /* what posix_memalign returned */
    unsigned char pad[ALIGNMENT - 24 - sizeof(void *)];
} block_header;
_Static_assert(sizeof(block_header) == ALIGNMENT, "header keeps the block aligned");

static pthread_mutex_t usage_lock = PTHREAD_MUTEX_INITIALIZER;
static loom_mem_usage usage;

/* memory.host_limit and what happened to it. */
static struct {
    uint64_t limit; /* 0: none */
    int deferred;   /* over-budget allocations pass and are remembered */
    loom_mem_overrun overrun;
    loom_mem_advisor advisor;
    void *advisor_ctx;
} budget;

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

static uint64_t host_bytes_locked(void)
{
    uint64_t total = 0;
    for (int p = 0; p < LOOM_PURPOSE_COUNT; p++)
        total += usage.current[LOOM_TIER_HOST][p] + usage.current[LOOM_TIER_PINNED][p];
    return total;
}

/* Host memory the kernel says it could still give, to keep a deferred
 * overrun from taking the machine down; UINT64_MAX when unknown. */
static uint64_t available_bytes(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return UINT64_MAX;
    char line[128];
    unsigned long long kib = 0;
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
    fclose(f);
    return found ? (uint64_t)kib * 1024 : UINT64_MAX;
}

/* Room in memory.host_limit for bytes more of purpose, or the refusal. */
static int check_budget(loom_purpose purpose, size_t bytes)
{
    pthread_mutex_lock(&usage_lock);
    uint64_t in_use = host_bytes_locked(), limit = budget.limit;
    int over = limit && in_use + bytes > limit;
    if (over && budget.deferred && !budget.overrun.bytes) {
        budget.overrun.purpose = purpose;
        budget.overrun.bytes = bytes;
        budget.overrun.in_use = in_use;
    }
    int deferred = budget.deferred;
    pthread_mutex_unlock(&usage_lock);
    if (!over)
        return LOOM_OK;
    /* Deferred while the model state is placed, so the refusal can weigh
     * all of it; never past what the machine has. */
    if (deferred && bytes + (256ull << 20) < available_bytes())
        return LOOM_OK;
    char text[512];
    loom_mem_budget_text(purpose, bytes, in_use, text, sizeof text);
    return loom_fail(LOOM_ERR_NO_MEMORY, "%s", text);
}

void loom_mem_format(uint64_t bytes, char *buf, size_t cap)
{
    if (bytes >= (1ull << 30))
        snprintf(buf, cap, "%.2f GiB", (double)bytes / (1ull << 30));
    else if (bytes >= (1ull << 20))
        snprintf(buf, cap, "%.1f MiB", (double)bytes / (1ull << 20));
    else if (bytes >= 1024)
        snprintf(buf, cap, "%.1f KiB", (double)bytes / 1024);
    else
        snprintf(buf, cap, "%llu bytes", (unsigned long long)bytes);
}

void loom_mem_host_parts(char *buf, size_t cap)
{
    loom_mem_usage u;
    loom_mem_usage_get(&u);
    size_t n = 0;
    buf[0] = '\0';
    for (int p = 0; p < LOOM_PURPOSE_COUNT && n < cap; p++) {
        uint64_t b = u.current[LOOM_TIER_HOST][p] + u.current[LOOM_TIER_PINNED][p];
        char hb[32];
        if (!b)
            continue;
        loom_mem_format(b, hb, sizeof hb);
        n += (size_t)snprintf(buf + n, cap - n, "%s%s %s", n ? ", " : "",
                              loom_purpose_name((loom_purpose)p), hb);
    }
}

void loom_mem_budget_text(loom_purpose purpose, uint64_t asked, uint64_t in_use, char *buf,
                          size_t cap)
{
    char limit[32], more[32], held[32], parts[256];
    loom_mem_format(budget.limit, limit, sizeof limit);
    loom_mem_format(asked, more, sizeof more);
    loom_mem_format(in_use, held, sizeof held);
    loom_mem_host_parts(parts, sizeof parts);
    size_t n = (size_t)snprintf(buf, cap,
                                "memory.host_limit = %s: %s more of %s would exceed it, with %s "
                                "held (%s)",
                                limit, more, loom_purpose_name(purpose), held, parts);
    if (budget.advisor && n < cap)
        budget.advisor(budget.advisor_ctx, purpose, asked, buf + n, cap - n);
}

void loom_mem_set_host_limit(uint64_t bytes)
{
    pthread_mutex_lock(&usage_lock);
    budget.limit = bytes;
    pthread_mutex_unlock(&usage_lock);
}

uint64_t loom_mem_host_limit(void) { return budget.limit; }

void loom_mem_set_advisor(loom_mem_advisor advisor, void *ctx)
{
    pthread_mutex_lock(&usage_lock);
    budget.advisor = advisor;
    budget.advisor_ctx = ctx;
    pthread_mutex_unlock(&usage_lock);
}

void loom_mem_defer_limit(int on)
{
    pthread_mutex_lock(&usage_lock);
    budget.deferred = on;
    if (on)
        budget.overrun = (loom_mem_overrun){0};
    pthread_mutex_unlock(&usage_lock);
}

int loom_mem_overrun_get(loom_mem_overrun *out)
{
    pthread_mutex_lock(&usage_lock);
    *out = budget.overrun;
    int over = budget.limit && host_bytes_locked() > budget.limit;
    pthread_mutex_unlock(&usage_lock);
    return over;
}

uint64_t loom_mem_host_bytes(void)
{
    pthread_mutex_lock(&usage_lock);
    uint64_t b = host_bytes_locked();
    pthread_mutex_unlock(&usage_lock);
    return b;
}

void loom_mem_account(loom_tier tier, loom_purpose purpose, int64_t delta)
{
    account(tier, purpose, delta);
}

int loom_mem_alloc(loom_tier tier, loom_purpose purpose, size_t bytes, void **out)
{
    if ((unsigned)purpose >= LOOM_PURPOSE_COUNT)
        return loom_fail(LOOM_ERR_INVALID, "memory: unknown purpose %d", (int)purpose);
    int rc = tier == LOOM_TIER_HOST || tier == LOOM_TIER_PINNED ? check_budget(purpose, bytes)
                                                                 : LOOM_OK;
    if (rc != LOOM_OK)
        return rc;
    if (tier == LOOM_TIER_DEVICE || tier == LOOM_TIER_PINNED) {
#ifdef LOOM_HAVE_CUDA
        /* device.c keeps these blocks (no header in front: the CPU cannot
         * write device memory); the accounting stays here. */
        rc = loom_device_alloc(tier, purpose, bytes, out);
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
    size_t front = bytes >= HUGE ? HUGE : bytes >= PAGE_ALIGNED_FROM ? PAGE : sizeof(block_header);
    if (posix_memalign(&raw, front >= PAGE ? front : ALIGNMENT, front + bytes) != 0)
        return loom_fail(LOOM_ERR_NO_MEMORY, "memory: cannot allocate %zu bytes of %s for %s",
                         bytes, loom_tier_name(tier), loom_purpose_name(purpose));
    if (front == HUGE) /* only the block: the header's page stays small */
        madvise((char *)raw + HUGE, bytes / HUGE * HUGE, MADV_HUGEPAGE);
    block_header *h = (block_header *)((char *)raw + front) - 1;
    h->raw = raw;
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
    free(h->raw);
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
