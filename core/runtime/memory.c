/* Accounted memory: every allocation is tagged with a tier and a purpose,
 * and the core keeps current and peak bytes for each pair, so a run can
 * print its footprint and a test can assert it exactly. */
#include <pthread.h>
#include <stdatomic.h>
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

/* Device blocks, sorted by address so that a pointer anywhere inside one
 * is found by binary search: device memory may not be readable, so nothing
 * is kept in front of it. Guarded by usage_lock. */
typedef struct device_block {
    uintptr_t start;
    uint64_t bytes;
    loom_purpose purpose;
    int cuda; /* runtime/device.c's: it frees and accounts the block */
} device_block;

static struct {
    device_block *blocks;
    size_t count, cap;
    loom_device_memory dm;
    int registered;
} device;
/* How many device blocks live: pointers are not looked up while none do,
 * the common case of a run on the CPU. */
static atomic_size_t device_blocks_live;

/* A block of 0 bytes still has an address that must be found. */
static uintptr_t block_end(const device_block *b) { return b->start + (b->bytes ? b->bytes : 1); }

/* The index of the block at or before p (the last whose start <= p), or
 * -1 when there is none. Called with usage_lock held. */
static ptrdiff_t block_at_or_before(uintptr_t p)
{
    size_t lo = 0, hi = device.count; /* the answer is lo - 1 */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (device.blocks[mid].start <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (ptrdiff_t)lo - 1;
}

/* The block containing p, or NULL. Called with usage_lock held. */
static device_block *find_block(uintptr_t p)
{
    ptrdiff_t i = block_at_or_before(p);
    if (i < 0 || p >= block_end(&device.blocks[i]))
        return NULL;
    return &device.blocks[i];
}

static int add_block(void *ptr, uint64_t bytes, loom_purpose purpose, int cuda)
{
    pthread_mutex_lock(&usage_lock);
    if (device.count == device.cap) {
        size_t cap = device.cap ? 2 * device.cap : 64;
        device_block *grown = realloc(device.blocks, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&usage_lock);
            return loom_fail(LOOM_ERR_NO_MEMORY,
                             "memory: out of memory for the table of device blocks");
        }
        device.blocks = grown;
        device.cap = cap;
    }
    uintptr_t start = (uintptr_t)ptr;
    size_t at = (size_t)(block_at_or_before(start) + 1);
    memmove(device.blocks + at + 1, device.blocks + at,
            (device.count - at) * sizeof *device.blocks);
    device.blocks[at] = (device_block){start, bytes, purpose, cuda};
    device.count++;
    atomic_fetch_add(&device_blocks_live, 1);
    pthread_mutex_unlock(&usage_lock);
    return LOOM_OK;
}

/* What a lookup of a pointer to free found. */
typedef enum { NOT_DEVICE, DEVICE_BLOCK, INSIDE_DEVICE_BLOCK } device_lookup;

/* Takes the block starting at ptr out of the table into *out. */
static device_lookup take_block(const void *ptr, device_block *out, loom_device_memory *dm,
                                int *registered)
{
    if (!atomic_load(&device_blocks_live))
        return NOT_DEVICE;
    pthread_mutex_lock(&usage_lock);
    device_block *b = find_block((uintptr_t)ptr);
    device_lookup found = !b ? NOT_DEVICE : b->start == (uintptr_t)ptr ? DEVICE_BLOCK
                                                                        : INSIDE_DEVICE_BLOCK;
    if (found == DEVICE_BLOCK) {
        *out = *b;
        size_t at = (size_t)(b - device.blocks);
        memmove(b, b + 1, (device.count - at - 1) * sizeof *b);
        device.count--;
        atomic_fetch_sub(&device_blocks_live, 1);
    }
    *dm = device.dm;
    *registered = device.registered;
    pthread_mutex_unlock(&usage_lock);
    return found;
}

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

static int device_registered(void)
{
    pthread_mutex_lock(&usage_lock);
    int registered = device.registered;
    pthread_mutex_unlock(&usage_lock);
    return registered;
}

/* The backend's refusal of an allocation, with what loom asked for and
 * holds: the tier, the purpose and the bytes, as host refusals say them. */
static int device_refused(int rc, const loom_device_memory *dm, loom_purpose purpose, size_t bytes)
{
    char detail[1024], asked[32], held[32], mine[32];
    snprintf(detail, sizeof detail, "%s", loom_last_error());
    pthread_mutex_lock(&usage_lock);
    uint64_t total = 0;
    for (int p = 0; p < LOOM_PURPOSE_COUNT; p++)
        total += usage.current[LOOM_TIER_DEVICE][p];
    uint64_t of_purpose = usage.current[LOOM_TIER_DEVICE][purpose];
    pthread_mutex_unlock(&usage_lock);
    loom_mem_format(bytes, asked, sizeof asked);
    loom_mem_format(total, held, sizeof held);
    loom_mem_format(of_purpose, mine, sizeof mine);
    return loom_fail(rc,
                     "memory: the device tier (the %s backend) cannot give %s more for %s (%s of "
                     "it held for %s, %s in all): %s",
                     dm->name, asked, loom_purpose_name(purpose), mine, loom_purpose_name(purpose),
                     held, detail);
}

/* A block of the registered device memory, accounted and in the table. */
static int device_alloc(loom_purpose purpose, size_t bytes, void **out)
{
    pthread_mutex_lock(&usage_lock);
    loom_device_memory dm = device.dm;
    pthread_mutex_unlock(&usage_lock);
    void *p = NULL;
    int rc = dm.alloc(dm.ctx, bytes ? bytes : 1, &p);
    if (rc != LOOM_OK)
        return device_refused(rc, &dm, purpose, bytes);
    if (!p)
        return loom_fail(LOOM_ERR_INTERNAL,
                         "memory: the %s backend's alloc of %zu bytes for %s returned no memory",
                         dm.name, bytes, loom_purpose_name(purpose));
    if ((rc = add_block(p, bytes, purpose, 0)) != LOOM_OK) {
        dm.free(dm.ctx, p);
        return rc;
    }
    account(LOOM_TIER_DEVICE, purpose, (int64_t)bytes);
    *out = p;
    return LOOM_OK;
}

void loom_mem_set_device(const loom_device_memory *dm)
{
    pthread_mutex_lock(&usage_lock);
    size_t live = 0;
    for (size_t i = 0; i < device.count; i++)
        live += !device.blocks[i].cuda;
    const char *was = device.registered ? device.dm.name : NULL;
    if (dm) {
        device.dm = *dm;
        device.registered = 1;
    } else {
        device.dm = (loom_device_memory){0};
        device.registered = 0;
    }
    pthread_mutex_unlock(&usage_lock);
    if (live && was)
        loom_log(LOOM_LOG_ERROR,
                 "memory: the %s backend's device memory was %s with %zu blocks still allocated",
                 was, dm ? "replaced" : "unregistered", live);
}

int loom_mem_is_device(const void *ptr)
{
    if (!atomic_load(&device_blocks_live))
        return 0;
    pthread_mutex_lock(&usage_lock);
    int inside = find_block((uintptr_t)ptr) != NULL;
    pthread_mutex_unlock(&usage_lock);
    return inside;
}

loom_tier loom_mem_staging_tier(void)
{
    pthread_mutex_lock(&usage_lock);
    int registered = device.registered;
    loom_tier tier = registered ? device.dm.staging_tier : LOOM_TIER_HOST;
    pthread_mutex_unlock(&usage_lock);
#ifdef LOOM_HAVE_CUDA
    if (!registered)
        tier = LOOM_TIER_PINNED; /* CUDA copies pinned memory at full speed, asynchronously */
#endif
    return tier;
}

/* A copy of a CUDA block that takes longer than this is a hung device. */
#define CUDA_COPY_TIMEOUT_S 300.0

/* Copies bytes at device (within one device block) to or from host. */
static int device_copy(void *dst, const void *src, size_t bytes, int to_host)
{
    const void *device_side = to_host ? src : dst;
    pthread_mutex_lock(&usage_lock);
    device_block *b = find_block((uintptr_t)device_side);
    int inside = b && (uintptr_t)device_side + bytes <= b->start + b->bytes;
    int cuda = b && b->cuda, registered = device.registered;
    loom_device_memory dm = device.dm;
    pthread_mutex_unlock(&usage_lock);
    if (!bytes)
        return LOOM_OK;
    if (!inside)
        return loom_fail(LOOM_ERR_INVALID,
                         "memory: a copy %s device memory of %zu bytes at %p that are not inside "
                         "one device block",
                         to_host ? "from" : "to", bytes, device_side);
#ifdef LOOM_HAVE_CUDA
    if (cuda)
        return loom_device_copy(dst, src, bytes, CUDA_COPY_TIMEOUT_S);
#else
    (void)cuda;
#endif
    if (!registered)
        return loom_fail(LOOM_ERR_INVALID,
                         "memory: a copy %s a device block whose backend's device memory was "
                         "unregistered",
                         to_host ? "from" : "to");
    return to_host ? dm.to_host(dm.ctx, dst, src, bytes) : dm.to_device(dm.ctx, dst, src, bytes);
}

int loom_mem_device_to_host(void *dst, const void *src, size_t bytes)
{
    return device_copy(dst, src, bytes, 1);
}

int loom_mem_host_to_device(void *dst, const void *src, size_t bytes)
{
    return device_copy(dst, src, bytes, 0);
}

int loom_mem_alloc(loom_tier tier, loom_purpose purpose, size_t bytes, void **out)
{
    if ((unsigned)purpose >= LOOM_PURPOSE_COUNT)
        return loom_fail(LOOM_ERR_INVALID, "memory: unknown purpose %d", (int)purpose);
    int rc = tier == LOOM_TIER_HOST || tier == LOOM_TIER_PINNED ? check_budget(purpose, bytes)
                                                                 : LOOM_OK;
    if (rc != LOOM_OK)
        return rc;
    if (tier == LOOM_TIER_DEVICE && device_registered())
        return device_alloc(purpose, bytes, out);
    if (tier == LOOM_TIER_DEVICE || tier == LOOM_TIER_PINNED) {
#ifdef LOOM_HAVE_CUDA
        /* device.c keeps these blocks (no header in front: the CPU cannot
         * write device memory); the accounting stays here, and device
         * blocks go into the table that loom_mem_is_device reads. */
        rc = loom_device_alloc(tier, purpose, bytes, out);
        if (rc == LOOM_OK && tier == LOOM_TIER_DEVICE &&
            (rc = add_block(*out, bytes, purpose, 1)) != LOOM_OK) {
            loom_tier t;
            loom_purpose pu;
            uint64_t b;
            loom_device_free(*out, &t, &pu, &b);
            *out = NULL;
        }
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
    /* Device blocks first: reading a header in front of a device pointer
     * would fault. */
    device_block b;
    loom_device_memory dm;
    int registered;
    switch (take_block(ptr, &b, &dm, &registered)) {
    case INSIDE_DEVICE_BLOCK:
        loom_log(LOOM_LOG_ERROR, "memory: free of a pointer inside a device block (%p)", ptr);
        return;
    case DEVICE_BLOCK:
        if (b.cuda)
            break; /* device.c frees it, below */
        if (registered)
            dm.free(dm.ctx, ptr);
        else
            loom_log(LOOM_LOG_ERROR,
                     "memory: free of a device block (%p) after its backend's device memory was "
                     "unregistered; the block is lost",
                     ptr);
        account(LOOM_TIER_DEVICE, b.purpose, -(int64_t)b.bytes);
        return;
    case NOT_DEVICE:
        break;
    }
#ifdef LOOM_HAVE_CUDA
    /* Then device.c's device and pinned blocks. */
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
