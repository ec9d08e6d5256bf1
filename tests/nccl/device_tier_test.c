/* The device tier behind loom_mem_alloc.
 *
 * Without a GPU: device and pinned allocations fail with one line that
 * names CUDA's reason, and the accounting does not move; host memory is
 * untouched by the device tier's bookkeeping.
 * With a GPU: device and pinned blocks are accounted by purpose (current
 * and peak), bytes survive a host -> device -> device -> host round trip
 * through async copies with events, and frees give the bytes back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "runtime/device.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "rank_check.h"

static int usage_is(loom_tier t, loom_purpose p, uint64_t current)
{
    loom_mem_usage u;
    loom_mem_usage_get(&u);
    return u.current[t][p] == current;
}

static void without_gpu(const char *why)
{
    loom_mem_usage before, after;
    loom_mem_usage_get(&before);
    void *p = (void *)1;
    int rc = loom_mem_alloc(LOOM_TIER_DEVICE, LOOM_PURPOSE_COMM, 1 << 20, &p);
    const char *msg = loom_last_error();
    printf("device alloc: %s: %s\n", loom_status_string(rc), msg);
    CHECK(rc == LOOM_ERR_NOT_SUPPORTED, "device alloc returned %s", loom_status_string(rc));
    CHECK(!strncmp(msg, "memory: cannot allocate 1048576 bytes of device memory for comm: ", 65),
          "message '%s'", msg);
    CHECK(strstr(msg, why) != NULL, "message '%s' does not carry '%s'", msg, why);
    CHECK(!strchr(msg, '\n'), "message has more than one line");
    CHECK(p == (void *)1, "the out pointer was written on failure");

    rc = loom_mem_alloc(LOOM_TIER_PINNED, LOOM_PURPOSE_PARAMS, 4096, &p);
    msg = loom_last_error();
    printf("pinned alloc: %s: %s\n", loom_status_string(rc), msg);
    CHECK(rc == LOOM_ERR_NOT_SUPPORTED, "pinned alloc returned %s", loom_status_string(rc));
    CHECK(strstr(msg, "pinned host memory for params") && strstr(msg, why), "message '%s'", msg);

    loom_mem_usage_get(&after);
    CHECK(!memcmp(&before, &after, sizeof before), "a failed allocation changed the accounting");

    loom_device_event *ev = (loom_device_event *)1;
    char x = 0, y = 0;
    CHECK(loom_device_copy_async(&y, &x, 1, NULL, &ev) == LOOM_ERR_NOT_SUPPORTED && ev == NULL,
          "a copy without a GPU did not fail cleanly");

    /* host blocks still come and go through the same free */
    void *h = NULL;
    OK(loom_mem_alloc(LOOM_TIER_HOST, LOOM_PURPOSE_GRADS, 1000, &h));
    CHECK(usage_is(LOOM_TIER_HOST, LOOM_PURPOSE_GRADS, before.current[LOOM_TIER_HOST][LOOM_PURPOSE_GRADS] + 1000),
          "host grads not accounted");
    loom_mem_free(h);
    CHECK(usage_is(LOOM_TIER_HOST, LOOM_PURPOSE_GRADS, before.current[LOOM_TIER_HOST][LOOM_PURPOSE_GRADS]),
          "host grads not given back");
}

static void with_gpu(void)
{
    enum { N = 3 * 65536 + 17 };
    loom_mem_usage_reset_peak();
    unsigned char *src = malloc(N), *dst = malloc(N);
    if (!src || !dst)
        abort();
    for (size_t i = 0; i < N; i++)
        src[i] = (unsigned char)(i * 131u + 7u);
    memset(dst, 0, N);

    void *a = NULL, *b = NULL, *pin = NULL;
    OK(loom_mem_alloc(LOOM_TIER_DEVICE, LOOM_PURPOSE_PARAMS, N, &a));
    OK(loom_mem_alloc(LOOM_TIER_DEVICE, LOOM_PURPOSE_COMM, N, &b));
    OK(loom_mem_alloc(LOOM_TIER_PINNED, LOOM_PURPOSE_COMM, N, &pin));
    CHECK(usage_is(LOOM_TIER_DEVICE, LOOM_PURPOSE_PARAMS, N), "device params not accounted");
    CHECK(usage_is(LOOM_TIER_DEVICE, LOOM_PURPOSE_COMM, N), "device comm not accounted");
    CHECK(usage_is(LOOM_TIER_PINNED, LOOM_PURPOSE_COMM, N), "pinned comm not accounted");

    /* host -> a (pageable source), a -> b on a stream, b -> pinned, each
     * completed by its event */
    loom_device_stream *s = NULL;
    OK(loom_device_stream_create(&s));
    loom_device_event *e1, *e2, *e3;
    OK(loom_device_copy_async(a, src, N, s, &e1));
    OK(loom_device_copy_async(b, a, N, s, &e2));
    OK(loom_device_copy_async(pin, b, N, s, &e3));
    int rc;
    uint64_t t0 = loom_now_ns();
    while ((rc = loom_device_event_test(e3)) == LOOM_IN_PROGRESS && loom_now_ns() - t0 < 30000000000ull)
        ;
    CHECK(rc == LOOM_OK, "test on the last copy: %s", loom_status_string(rc));
    OK(loom_device_event_wait(e1, 30));
    OK(loom_device_event_wait(e2, 30));
    CHECK(!memcmp(pin, src, N), "pinned block differs after host -> device -> device -> pinned");
    OK(loom_device_copy(dst, b, N, 30));
    CHECK(!memcmp(dst, src, N), "host copy differs after the round trip");
    loom_device_stream_destroy(s);

    loom_mem_free(a);
    loom_mem_free(b);
    loom_mem_free(pin);
    loom_mem_usage u;
    loom_mem_usage_get(&u);
    CHECK(u.current[LOOM_TIER_DEVICE][LOOM_PURPOSE_PARAMS] == 0 &&
              u.current[LOOM_TIER_DEVICE][LOOM_PURPOSE_COMM] == 0 &&
              u.current[LOOM_TIER_PINNED][LOOM_PURPOSE_COMM] == 0,
          "frees did not give the bytes back");
    CHECK(u.peak_total[LOOM_TIER_DEVICE] == 2ull * N, "device peak %llu, want %llu",
          (unsigned long long)u.peak_total[LOOM_TIER_DEVICE], 2ull * N);
    free(src);
    free(dst);
}

int main(void)
{
    if (loom_device_available() == LOOM_OK) {
        printf("a CUDA device is visible: checking the tier on it\n");
        with_gpu();
    } else {
        char why[512];
        snprintf(why, sizeof why, "%s", loom_last_error());
        printf("no GPU: %s\n", why);
        without_gpu(why);
    }
    printf("device tier: %s (%d failures)\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}
