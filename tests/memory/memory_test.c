/* Memory accounting is exact: current and peak bytes per tier and purpose. */
#include <stdio.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "runtime/log.h"
#include "runtime/memory.h"

static int failures;
#define EXPECT_EQ(a, b)                                                                    \
    do {                                                                                   \
        unsigned long long a_ = (a), b_ = (b);                                             \
        if (a_ != b_) {                                                                    \
            fprintf(stderr, "FAIL line %d: %s = %llu, want %llu\n", __LINE__, #a, a_, b_); \
            failures++;                                                                    \
        }                                                                                  \
    } while (0)

int main(void)
{
    loom_mem_usage u;
    void *p = NULL, *g = NULL, *o = NULL;
    if (loom_mem_alloc(LOOM_TIER_HOST, LOOM_PURPOSE_PARAMS, 1000, &p) != LOOM_OK ||
        loom_mem_alloc(LOOM_TIER_HOST, LOOM_PURPOSE_GRADS, 3000, &g) != LOOM_OK) {
        fprintf(stderr, "alloc failed: %s\n", loom_last_error());
        return 1;
    }
    EXPECT_EQ((uintptr_t)p % 64, 0);
    memset(p, 1, 1000);
    memset(g, 2, 3000);
    loom_mem_usage_get(&u);
    EXPECT_EQ(u.current[LOOM_TIER_HOST][LOOM_PURPOSE_PARAMS], 1000);
    EXPECT_EQ(u.current[LOOM_TIER_HOST][LOOM_PURPOSE_GRADS], 3000);
    EXPECT_EQ(u.peak_total[LOOM_TIER_HOST], 4000);
    loom_mem_free(g);
    if (loom_mem_alloc(LOOM_TIER_HOST, LOOM_PURPOSE_OPTIMIZER, 2000, &o) != LOOM_OK)
        return 1;
    loom_mem_usage_get(&u);
    EXPECT_EQ(u.current[LOOM_TIER_HOST][LOOM_PURPOSE_GRADS], 0);
    EXPECT_EQ(u.peak[LOOM_TIER_HOST][LOOM_PURPOSE_GRADS], 3000);
    EXPECT_EQ(u.current[LOOM_TIER_HOST][LOOM_PURPOSE_OPTIMIZER], 2000);
    EXPECT_EQ(u.peak_total[LOOM_TIER_HOST], 4000); /* 1000 + 2000 never exceeded it */
    loom_mem_usage_reset_peak();
    loom_mem_usage_get(&u);
    EXPECT_EQ(u.peak[LOOM_TIER_HOST][LOOM_PURPOSE_GRADS], 0);
    EXPECT_EQ(u.peak_total[LOOM_TIER_HOST], 3000);
    loom_mem_free(p);
    loom_mem_free(o);
    loom_mem_usage_get(&u);
    for (int t = 0; t < LOOM_TIER_COUNT; t++)
        for (int q = 0; q < LOOM_PURPOSE_COUNT; q++)
            EXPECT_EQ(u.current[t][q], 0);
    /* Tiers this build lacks are refused with a reason, not a crash. */
    void *d = NULL;
    int rc = loom_mem_alloc(LOOM_TIER_DEVICE, LOOM_PURPOSE_PARAMS, 64, &d);
    EXPECT_EQ(rc == LOOM_ERR_NOT_SUPPORTED, 1);
    EXPECT_EQ(strstr(loom_last_error(), "device") != NULL, 1);
    printf("memory accounting: %s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
