/* Device memory registered with the runtime: a fake backend whose blocks
 * are slots of one arena, handed out in a shuffled order so that the
 * runtime's table of device blocks is filled out of address order.
 * Accounting per purpose is exact, loom_mem_is_device answers for every
 * byte of a live block and for nothing else, frees give the bytes back
 * through the backend, copies go through the backend, and without the
 * backend the device tier is not served by it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "check.h"

enum { SLOTS = 64, SLOT = 4096 };

/* The fake backend's state: which slots are taken, and what it was asked. */
typedef struct fake_device {
    unsigned char *arena;
    void *slot_of[SLOTS];
    int order[SLOTS], next; /* slots in the order they are handed out */
    int allocs, frees, to_host, to_device, fail_next;
} fake_device;

static int fake_alloc(void *ctx, size_t bytes, void **out)
{
    fake_device *f = ctx;
    if (f->fail_next) {
        f->fail_next = 0;
        return loom_fail(LOOM_ERR_NO_MEMORY, "fake: out of device memory");
    }
    if (bytes > SLOT - 64 || f->next == SLOTS)
        return loom_fail(LOOM_ERR_NO_MEMORY, "fake: %zu bytes do not fit", bytes);
    /* 64 bytes of each slot are never handed out: one past a block's end is
     * no block's byte */
    int slot = f->order[f->next++];
    *out = f->arena + (size_t)slot * SLOT;
    memset(*out, 0, bytes);
    f->allocs++;
    return LOOM_OK;
}

static void fake_free(void *ctx, void *ptr)
{
    fake_device *f = ctx;
    f->frees++;
    memset(ptr, 0xdd, 1);
}

static int fake_to_host(void *ctx, void *dst, const void *src, size_t bytes)
{
    ((fake_device *)ctx)->to_host++;
    memcpy(dst, src, bytes);
    return LOOM_OK;
}

static int fake_to_device(void *ctx, void *dst, const void *src, size_t bytes)
{
    ((fake_device *)ctx)->to_device++;
    memcpy(dst, src, bytes);
    return LOOM_OK;
}

static uint64_t device_bytes(loom_purpose purpose)
{
    loom_mem_usage u;
    loom_mem_usage_get(&u);
    return u.current[LOOM_TIER_DEVICE][purpose];
}

static uint64_t host_total(void)
{
    loom_mem_usage u;
    loom_mem_usage_get(&u);
    uint64_t total = 0;
    for (int p = 0; p < LOOM_PURPOSE_COUNT; p++)
        total += u.current[LOOM_TIER_HOST][p];
    return total;
}

int main(void)
{
    loom_log_set_level(LOOM_LOG_WARN);
    static fake_device f;
    REQUIRE((f.arena = aligned_alloc(4096, (size_t)SLOTS * SLOT)) != NULL);
    for (int i = 0; i < SLOTS; i++)
        f.order[i] = i;
    srand(31);
    for (int i = SLOTS - 1; i > 0; i--) {
        int j = rand() % (i + 1), t = f.order[i];
        f.order[i] = f.order[j];
        f.order[j] = t;
    }
    const loom_device_memory dm = {
        .ctx = &f,
        .name = "fake",
        .staging_tier = LOOM_TIER_HOST,
        .alloc = fake_alloc,
        .free = fake_free,
        .to_host = fake_to_host,
        .to_device = fake_to_device,
    };

    /* Nothing is device memory before a backend registers. */
    int on_stack = 0;
    CHECK_EQ(loom_mem_is_device(&on_stack), 0);
    loom_tier unregistered = loom_mem_staging_tier();
    CHECK(unregistered == LOOM_TIER_HOST || unregistered == LOOM_TIER_PINNED);

    loom_mem_set_device(&dm);
    CHECK_EQ(loom_mem_staging_tier(), LOOM_TIER_HOST);
    uint64_t host_before = host_total();

    /* Blocks of three purposes and many sizes, 0 bytes among them. */
    enum { N = 48 };
    void *block[N];
    size_t bytes[N];
    loom_purpose purpose[N];
    uint64_t want[LOOM_PURPOSE_COUNT] = {0};
    const loom_purpose purposes[3] = {LOOM_PURPOSE_PARAMS, LOOM_PURPOSE_GRADS,
                                      LOOM_PURPOSE_ACTIVATIONS};
    for (int i = 0; i < N; i++) {
        bytes[i] = i == 5 ? 0 : (size_t)(i * 83 % 4000) + 1;
        purpose[i] = purposes[i % 3];
        OK(loom_mem_alloc(LOOM_TIER_DEVICE, purpose[i], bytes[i], &block[i]));
        want[purpose[i]] += bytes[i];
    }
    CHECK_EQ(f.allocs, N);
    for (int p = 0; p < LOOM_PURPOSE_COUNT; p++)
        CHECK_EQ(device_bytes((loom_purpose)p), want[p]);
    CHECK_EQ(host_total(), host_before); /* no header, no host bytes */

    /* Every block's first, middle and last byte; one past the end is not. */
    for (int i = 0; i < N; i++) {
        const unsigned char *b = block[i];
        size_t last = bytes[i] ? bytes[i] - 1 : 0;
        CHECK(loom_mem_is_device(b), "block %d's first byte", i);
        CHECK(loom_mem_is_device(b + last / 2), "block %d's middle byte", i);
        CHECK(loom_mem_is_device(b + last), "block %d's last byte", i);
        CHECK(!loom_mem_is_device(b + last + 1), "one past block %d's end", i);
        CHECK(!loom_mem_is_device(b - 1), "the byte before block %d", i);
    }
    void *host = NULL;
    OK(loom_mem_alloc(LOOM_TIER_HOST, LOOM_PURPOSE_PARAMS, 128, &host));
    CHECK_EQ(loom_mem_is_device(host), 0);
    CHECK_EQ(loom_mem_is_device(&on_stack), 0);
    CHECK_EQ(loom_mem_is_device(NULL), 0);

    /* Copies go through the backend, and only inside one block. */
    char out[64] = "device bytes", back[64] = {0};
    OK(loom_mem_host_to_device((char *)block[1] + 10, out, sizeof out));
    OK(loom_mem_device_to_host(back, (char *)block[1] + 10, sizeof back));
    CHECK_STR(back, "device bytes");
    CHECK_EQ(f.to_device, 1);
    CHECK_EQ(f.to_host, 1);
    CHECK_EQ(loom_mem_device_to_host(back, (char *)block[1] + bytes[1] - 8, 16), LOOM_ERR_INVALID);
    CHECK_ERROR("not inside one device block");
    CHECK_EQ(loom_mem_host_to_device(host, out, 16), LOOM_ERR_INVALID);
    CHECK_EQ(f.to_host + f.to_device, 2);

    /* A backend that cannot allocate: its error, nothing accounted. */
    f.fail_next = 1;
    void *none = NULL;
    CHECK_EQ(loom_mem_alloc(LOOM_TIER_DEVICE, LOOM_PURPOSE_COMM, 100, &none), LOOM_ERR_NO_MEMORY);
    CHECK_ERROR("fake: out of device memory");
    CHECK_EQ(device_bytes(LOOM_PURPOSE_COMM), 0);

    /* A pointer inside a block is not a block: refused, nothing freed. */
    loom_mem_free((char *)block[2] + 1);
    CHECK_EQ(f.frees, 0);
    CHECK_EQ(device_bytes(purpose[2]), want[purpose[2]]);
    CHECK(loom_mem_is_device(block[2]));

    /* Frees, every other block first: each gives its bytes back. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = pass; i < N; i += 2) {
            loom_mem_free(block[i]);
            want[purpose[i]] -= bytes[i];
            CHECK_EQ(device_bytes(purpose[i]), want[purpose[i]]);
            CHECK(!loom_mem_is_device(block[i]), "block %d after its free", i);
            if (i + 1 < N && pass == 0)
                CHECK(loom_mem_is_device(block[i + 1]), "block %d while %d is freed", i + 1, i);
        }
    CHECK_EQ(f.frees, N);
    for (int p = 0; p < LOOM_PURPOSE_COUNT; p++)
        CHECK_EQ(device_bytes((loom_purpose)p), 0);
    loom_mem_usage u;
    loom_mem_usage_get(&u);
    CHECK(u.peak_total[LOOM_TIER_DEVICE] > 0);
    loom_mem_free(host);
    CHECK_EQ(host_total(), host_before);

    /* Unregistered: the device tier is not the fake backend's any more. A
     * build without CUDA or a machine without a GPU refuses it. */
    loom_mem_set_device(NULL);
    void *after = NULL;
    int rc = loom_mem_alloc(LOOM_TIER_DEVICE, LOOM_PURPOSE_PARAMS, 64, &after);
    CHECK_EQ(f.allocs, N);
    if (rc == LOOM_OK) {
        loom_mem_free(after);
    } else {
        CHECK_ERROR("device");
        CHECK_EQ(device_bytes(LOOM_PURPOSE_PARAMS), 0);
    }
    free(f.arena);
    return check_done("device_memory");
}
