/* A memory tier over malloc, enough for `loom plugins --check` to write and
 * read back through it, and a variant missing a REQUIRED op. Writes finish
 * through a request, reads at issue (*req = NULL), so both paths are used. */
#include <stdlib.h>
#include <string.h>

#include "loom/memtier.h"

#ifndef PLUGIN_NAME
#define PLUGIN_NAME "good"
#endif

#define CAPACITY (1ull << 30)

struct loom_memtier {
    const loom_host *host;
    uint64_t used;
};

struct loom_tier_block {
    unsigned char *data;
    size_t bytes;
};

struct loom_tier_request {
    int done;
};

static int tier_create(const loom_host *host, loom_memtier **out)
{
    loom_memtier *t = calloc(1, sizeof *t);
    if (!t)
        return host->error(host, LOOM_ERR_NO_MEMORY, "memtier-%s: out of memory", PLUGIN_NAME);
    t->host = host;
    *out = t;
    return LOOM_OK;
}

static int tier_destroy(loom_memtier *tier)
{
    free(tier);
    return LOOM_OK;
}

static int tier_capacity(loom_memtier *tier, uint64_t *total, uint64_t *available)
{
    *total = CAPACITY;
    *available = CAPACITY - tier->used;
    return LOOM_OK;
}

static int tier_alloc(loom_memtier *tier, size_t bytes, size_t alignment, loom_tier_block **out)
{
    if (alignment < sizeof(void *))
        alignment = sizeof(void *);
    if (bytes > CAPACITY - tier->used)
        return tier->host->error(tier->host, LOOM_ERR_NO_MEMORY,
                                 "memtier-%s: %zu bytes do not fit", PLUGIN_NAME, bytes);
    loom_tier_block *b = calloc(1, sizeof *b);
    if (!b || posix_memalign((void **)&b->data, alignment, bytes ? bytes : 1)) {
        free(b);
        return tier->host->error(tier->host, LOOM_ERR_NO_MEMORY, "memtier-%s: out of memory",
                                 PLUGIN_NAME);
    }
    b->bytes = bytes;
    tier->used += bytes;
    *out = b;
    return LOOM_OK;
}

static int tier_free(loom_memtier *tier, loom_tier_block *block)
{
    tier->used -= block->bytes;
    free(block->data);
    free(block);
    return LOOM_OK;
}

static int in_bounds(loom_memtier *tier, const loom_tier_block *b, size_t offset, size_t bytes)
{
    if (offset > b->bytes || bytes > b->bytes - offset)
        return tier->host->error(tier->host, LOOM_ERR_INVALID,
                                 "memtier-%s: [%zu, +%zu) is outside a block of %zu bytes",
                                 PLUGIN_NAME, offset, bytes, b->bytes);
    return LOOM_OK;
}

static int tier_write(loom_memtier *tier, loom_tier_block *dst, size_t offset, const void *src,
                      size_t bytes, loom_tier_request **req)
{
    int rc = in_bounds(tier, dst, offset, bytes);
    if (rc != LOOM_OK)
        return rc;
    memcpy(dst->data + offset, src, bytes);
    loom_tier_request *r = calloc(1, sizeof *r);
    if (!r)
        return tier->host->error(tier->host, LOOM_ERR_NO_MEMORY, "memtier-%s: out of memory",
                                 PLUGIN_NAME);
    r->done = 1;
    *req = r;
    return LOOM_OK;
}

#if !defined(VARIANT_NOREAD)
static int tier_read(loom_memtier *tier, loom_tier_block *src, size_t offset, void *dst,
                     size_t bytes, loom_tier_request **req)
{
    int rc = in_bounds(tier, src, offset, bytes);
    if (rc != LOOM_OK)
        return rc;
    memcpy(dst, src->data + offset, bytes);
    *req = NULL;
    return LOOM_OK;
}
#endif

static int tier_test(loom_tier_request *req)
{
    free(req);
    return LOOM_OK;
}

static int tier_wait(loom_tier_request *req)
{
    free(req);
    return LOOM_OK;
}

static void *tier_address(loom_tier_block *block)
{
    return block->data;
}

#define SYMBOL_NAME(sym) __asm__(#sym)

LOOM_PLUGIN_EXPORT const loom_memtier_plugin_v1_t plugin SYMBOL_NAME(loom_memtier_plugin_v1) = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_MEMTIER, loom_memtier_plugin_v1_t, PLUGIN_NAME,
                                 "host memory through malloc (loader tests)", NULL),
    .tier = LOOM_TIER_HOST,
    .flags = LOOM_TIER_HOST_ADDRESSABLE,
    .create = tier_create,
    .destroy = tier_destroy,
    .capacity = tier_capacity,
    .alloc = tier_alloc,
    .free = tier_free,
    .write = tier_write,
#if !defined(VARIANT_NOREAD)
    .read = tier_read,
#endif
    .test = tier_test,
    .wait = tier_wait,
    .address = tier_address,
};
