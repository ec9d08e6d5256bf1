/* Memory accounting is exact: current and peak bytes per tier and purpose,
 * host blocks everywhere, device blocks where a GPU is usable. */
#include <stdio.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "runtime/device.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "check.h"

/* A build without CUDA, or a machine without a usable GPU: the device tier
 * is refused with a reason, not a crash, and accounts nothing. */
static void device_tier_refused(void)
{
    void *d = NULL;
    int rc = loom_mem_alloc(LOOM_TIER_DEVICE, LOOM_PURPOSE_PARAMS, 64, &d);
    CHECK_EQ(rc == LOOM_ERR_NOT_SUPPORTED, 1);
    CHECK_EQ(strstr(loom_last_error(), "device") != NULL, 1);
    loom_mem_usage u;
    loom_mem_usage_get(&u);
    CHECK_EQ(u.current[LOOM_TIER_DEVICE][LOOM_PURPOSE_PARAMS], 0);
    CHECK_EQ(u.peak_total[LOOM_TIER_DEVICE], 0);
}

#ifdef LOOM_HAVE_CUDA
/* A GPU: device blocks are accounted in the device tier by purpose, never
 * as host bytes, and their frees give every byte back. */
static void device_tier_accounted(void)
{
    void *w = NULL, *c = NULL;
    if (loom_mem_alloc(LOOM_TIER_DEVICE, LOOM_PURPOSE_PARAMS, 5000, &w) != LOOM_OK ||
        loom_mem_alloc(LOOM_TIER_DEVICE, LOOM_PURPOSE_COMM, 3000, &c) != LOOM_OK) {
        fprintf(stderr, "FAIL: device alloc with a GPU: %s\n", loom_last_error());
        failures++;
        loom_mem_free(w);
        return;
    }
    CHECK_EQ(w != NULL && c != NULL && w != c, 1);
    loom_mem_usage u;
    loom_mem_usage_get(&u);
    CHECK_EQ(u.current[LOOM_TIER_DEVICE][LOOM_PURPOSE_PARAMS], 5000);
    CHECK_EQ(u.current[LOOM_TIER_DEVICE][LOOM_PURPOSE_COMM], 3000);
    CHECK_EQ(u.peak_total[LOOM_TIER_DEVICE], 8000);
    CHECK_EQ(u.current[LOOM_TIER_HOST][LOOM_PURPOSE_PARAMS], 0);
    CHECK_EQ(u.current[LOOM_TIER_PINNED][LOOM_PURPOSE_PARAMS], 0);
    CHECK_EQ(loom_mem_host_bytes(), 0);
    loom_mem_free(w);
    loom_mem_usage_get(&u);
    CHECK_EQ(u.current[LOOM_TIER_DEVICE][LOOM_PURPOSE_PARAMS], 0);
    CHECK_EQ(u.peak[LOOM_TIER_DEVICE][LOOM_PURPOSE_PARAMS], 5000);
    CHECK_EQ(u.current[LOOM_TIER_DEVICE][LOOM_PURPOSE_COMM], 3000);
    loom_mem_free(c);
    loom_mem_usage_get(&u);
    for (int q = 0; q < LOOM_PURPOSE_COUNT; q++)
        CHECK_EQ(u.current[LOOM_TIER_DEVICE][q], 0);
    CHECK_EQ(u.peak_total[LOOM_TIER_DEVICE], 8000);
}
#endif

int main(void)
{
    loom_mem_usage u;
    void *p = NULL, *g = NULL, *o = NULL;
    if (loom_mem_alloc(LOOM_TIER_HOST, LOOM_PURPOSE_PARAMS, 1000, &p) != LOOM_OK ||
        loom_mem_alloc(LOOM_TIER_HOST, LOOM_PURPOSE_GRADS, 3000, &g) != LOOM_OK) {
        fprintf(stderr, "alloc failed: %s\n", loom_last_error());
        return 1;
    }
    CHECK_EQ((uintptr_t)p % 64, 0);
    memset(p, 1, 1000);
    memset(g, 2, 3000);
    loom_mem_usage_get(&u);
    CHECK_EQ(u.current[LOOM_TIER_HOST][LOOM_PURPOSE_PARAMS], 1000);
    CHECK_EQ(u.current[LOOM_TIER_HOST][LOOM_PURPOSE_GRADS], 3000);
    CHECK_EQ(u.peak_total[LOOM_TIER_HOST], 4000);
    loom_mem_free(g);
    if (loom_mem_alloc(LOOM_TIER_HOST, LOOM_PURPOSE_OPTIMIZER, 2000, &o) != LOOM_OK)
        return 1;
    loom_mem_usage_get(&u);
    CHECK_EQ(u.current[LOOM_TIER_HOST][LOOM_PURPOSE_GRADS], 0);
    CHECK_EQ(u.peak[LOOM_TIER_HOST][LOOM_PURPOSE_GRADS], 3000);
    CHECK_EQ(u.current[LOOM_TIER_HOST][LOOM_PURPOSE_OPTIMIZER], 2000);
    CHECK_EQ(u.peak_total[LOOM_TIER_HOST], 4000); /* 1000 + 2000 never exceeded it */
    loom_mem_usage_reset_peak();
    loom_mem_usage_get(&u);
    CHECK_EQ(u.peak[LOOM_TIER_HOST][LOOM_PURPOSE_GRADS], 0);
    CHECK_EQ(u.peak_total[LOOM_TIER_HOST], 3000);
    loom_mem_free(p);
    loom_mem_free(o);
    loom_mem_usage_get(&u);
    for (int t = 0; t < LOOM_TIER_COUNT; t++)
        for (int q = 0; q < LOOM_PURPOSE_COUNT; q++)
            CHECK_EQ(u.current[t][q], 0);
    const char *device_tier = "refused (a build without CUDA)";
#ifdef LOOM_HAVE_CUDA
    if (loom_device_available() == LOOM_OK) {
        device_tier_accounted();
        device_tier = "accounted (a GPU is usable)";
    } else {
        device_tier_refused();
        device_tier = "refused (no usable GPU)";
    }
#else
    device_tier_refused();
#endif
    printf("memory accounting: %s; device tier %s\n", failures ? "FAILED" : "ok", device_tier);
    return failures ? 1 : 0;
}
