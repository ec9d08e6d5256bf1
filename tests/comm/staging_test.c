/* Device buffers on a communicator that does not take device memory: the
 * core stages them through host memory. The device here is a fake one
 * whose memory is an mmap'd arena kept PROT_NONE except inside its own
 * copies, so a backend that read or wrote a device buffer itself would
 * crash the test. Every op, in place too, against a serial reference; the
 * staging blocks are accounted (purpose comm) while the op is in flight,
 * exactly as big as its device buffers, and given back when it completes;
 * each copy is a "stage <op>" span on the trace.
 *
 * With --cuda the device is CUDA's (runtime/device.c's blocks, staged in
 * pinned memory) instead, on a machine with a GPU; elsewhere it exits 77,
 * which ctest shows as skipped.
 *
 *   staging_test BACKEND [--cuda]   under `loom launch -n N` (or alone for self) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "loom/comm.h"
#include "loom/status.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "runtime/group.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/runtime.h"
#include "runtime/trace.h"
#include "rank_check.h"

static const loom_comm_api *C = &loom_core_comm_api;

/* ---------------------------------------------------- the fake device */

static struct {
    unsigned char *base;
    size_t size, used;
    pthread_mutex_t lock;
    int fail_copies; /* the next copies to the host fail */
} dev = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* The arena is open only while the device itself touches it. */
static void arena(int prot)
{
    if (mprotect(dev.base, dev.size, prot) != 0)
        abort();
}

static int dev_alloc(void *ctx, size_t bytes, void **out)
{
    (void)ctx;
    pthread_mutex_lock(&dev.lock);
    size_t at = (dev.used + 255) & ~(size_t)255;
    if (at + bytes > dev.size) {
        pthread_mutex_unlock(&dev.lock);
        return loom_fail(LOOM_ERR_NO_MEMORY, "fake device: out of memory");
    }
    dev.used = at + bytes;
    *out = dev.base + at;
    arena(PROT_READ | PROT_WRITE);
    memset(*out, 0, bytes);
    arena(PROT_NONE);
    pthread_mutex_unlock(&dev.lock);
    return LOOM_OK;
}

static void dev_free(void *ctx, void *ptr)
{
    (void)ctx;
    (void)ptr; /* a bump arena: the test allocates little */
}

static int dev_to_host(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    pthread_mutex_lock(&dev.lock);
    int fail = dev.fail_copies;
    if (!fail) {
        arena(PROT_READ);
        memcpy(dst, src, bytes);
        arena(PROT_NONE);
    }
    pthread_mutex_unlock(&dev.lock);
    if (fail)
        return loom_fail(LOOM_ERR_INTERNAL, "fake device: the copy to the host failed");
    return LOOM_OK;
}

static int dev_to_device(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    pthread_mutex_lock(&dev.lock);
    arena(PROT_READ | PROT_WRITE);
    memcpy(dst, src, bytes);
    arena(PROT_NONE);
    pthread_mutex_unlock(&dev.lock);
    return LOOM_OK;
}

static float *device_floats(size_t count)
{
    void *p = NULL;
    OK(loom_mem_alloc(LOOM_TIER_DEVICE, LOOM_PURPOSE_PARAMS, count * sizeof(float), &p));
    REQUIRE(loom_mem_is_device(p));
    return p;
}

/* ------------------------------------------------------------ the test */

static int rank, size;
static float *host_a, *host_b; /* the test's own host buffers */

static float value(int r, size_t i) { return (float)((r * 3 + (int)(i % 97) * 5) % 9 + 1); }

static uint64_t staged_bytes(void)
{
    loom_mem_usage u;
    loom_mem_usage_get(&u);
    return u.current[LOOM_TIER_HOST][LOOM_PURPOSE_COMM] +
           u.current[LOOM_TIER_PINNED][LOOM_PURPOSE_COMM];
}

/* Device buffer d (count floats) gets f(i). */
static void fill(float *d, size_t count, int r, size_t offset)
{
    for (size_t i = 0; i < count; i++)
        host_a[i] = value(r, offset + i);
    OK(loom_mem_host_to_device(d, host_a, count * sizeof(float)));
}

/* While the op is in flight its staging blocks are held (want bytes; none
 * when it completed at issue), and they are given back by its wait. */
static void complete(const char *what, loom_request *req, uint64_t want)
{
    uint64_t held = loom_request_completed_at_issue(req) ? 0 : want;
    CHECK_EQ(staged_bytes(), held);
    if (staged_bytes() != held)
        fprintf(stderr, "[rank %d] ... in %s\n", rank, what);
    OK(C->wait(req));
    CHECK(staged_bytes() == 0, "%s left %llu staging bytes", what,
          (unsigned long long)staged_bytes());
}

/* The device buffer d holds count floats equal to want(i). */
#define EXPECT_DEVICE(d, count, want_expr, what)                                                  \
    do {                                                                                           \
        OK(loom_mem_device_to_host(host_b, (d), (count) * sizeof(float)));                        \
        int bad_ = 0;                                                                              \
        for (size_t i = 0; i < (count); i++)                                                       \
            if (host_b[i] != (want_expr) && !bad_++)                                               \
                CHECK(0, "%s: element %zu is %g, want %g", what, i, (double)host_b[i],             \
                      (double)(want_expr));                                                        \
    } while (0)

static float sum_over_ranks(size_t i)
{
    float s = 0;
    for (int r = 0; r < size; r++)
        s += value(r, i);
    return s;
}

static void test_ops(loom_group *g, size_t n)
{
    const size_t nb = n * sizeof(float), all = (size_t)size * n;
    loom_request *req;
    float *a = device_floats(all), *b = device_floats(all);

    /* allreduce, out of place, in place, and with one side on the host */
    fill(a, n, rank, 0);
    OK(C->allreduce(g, a, b, n, LOOM_F32, LOOM_SUM, &req));
    complete("allreduce", req, 2 * nb);
    EXPECT_DEVICE(b, n, sum_over_ranks(i), "allreduce");
    EXPECT_DEVICE(a, n, value(rank, i), "allreduce's send");

    fill(a, n, rank, 0);
    OK(C->allreduce(g, a, a, n, LOOM_F32, LOOM_SUM, &req));
    complete("allreduce in place", req, nb);
    EXPECT_DEVICE(a, n, sum_over_ranks(i), "allreduce in place");

    float *host_send = malloc(nb + 1), *host_recv = malloc(nb + 1);
    REQUIRE(host_send && host_recv);
    for (size_t i = 0; i < n; i++)
        host_send[i] = value(rank, i);
    OK(C->allreduce(g, host_send, b, n, LOOM_F32, LOOM_SUM, &req));
    complete("allreduce host to device", req, nb);
    EXPECT_DEVICE(b, n, sum_over_ranks(i), "allreduce host to device");
    fill(a, n, rank, 0);
    OK(C->allreduce(g, a, host_recv, n, LOOM_F32, LOOM_SUM, &req));
    complete("allreduce device to host", req, nb);
    for (size_t i = 0; i < n; i++)
        CHECK_EQ(host_recv[i], sum_over_ranks(i));
    /* host buffers go straight through */
    OK(C->allreduce(g, host_send, host_recv, n, LOOM_F32, LOOM_SUM, &req));
    complete("allreduce on the host", req, 0);
    for (size_t i = 0; i < n; i++)
        CHECK_EQ(host_recv[i], sum_over_ranks(i));

    /* allgather, out of place and in place */
    fill(a, n, rank, 0);
    OK(C->allgather(g, a, b, n, LOOM_F32, &req));
    complete("allgather", req, nb + all * sizeof(float));
    EXPECT_DEVICE(b, all, value((int)(i / n), i % n), "allgather");
    fill(b + (size_t)rank * n, n, rank, 0);
    OK(C->allgather(g, b + (size_t)rank * n, b, n, LOOM_F32, &req));
    complete("allgather in place", req, all * sizeof(float));
    EXPECT_DEVICE(b, all, value((int)(i / n), i % n), "allgather in place");

    /* reducescatter: rank r gets block r of the sum */
    fill(a, all, rank, 0);
    OK(C->reducescatter(g, a, b, n, LOOM_F32, LOOM_SUM, &req));
    complete("reducescatter", req, nb + all * sizeof(float));
    EXPECT_DEVICE(b, n, sum_over_ranks((size_t)rank * n + i), "reducescatter");

    /* broadcast from the last rank, in place on every rank */
    int root = size - 1;
    fill(a, n, rank == root ? root : size + 7, 0);
    OK(C->broadcast(g, a, n, LOOM_F32, root, &req));
    complete("broadcast", req, nb);
    EXPECT_DEVICE(a, n, value(root, i), "broadcast");

    /* reduce to rank 0 */
    fill(a, n, rank, 0);
    OK(C->reduce(g, a, b, n, LOOM_F32, LOOM_SUM, 0, &req));
    complete("reduce", req, 2 * nb);
    if (rank == 0)
        EXPECT_DEVICE(b, n, sum_over_ranks(i), "reduce");

    /* alltoall: block j of rank r's send goes to rank j */
    fill(a, all, rank, 0);
    OK(C->alltoall(g, a, b, n, LOOM_F32, &req));
    complete("alltoall", req, 2 * all * sizeof(float));
    EXPECT_DEVICE(b, all, value((int)(i / n), (size_t)rank * n + i % n), "alltoall");

    /* send and receive around a ring, the receive posted first */
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    loom_request *recv_req, *send_req;
    fill(a, n, rank, 0);
    OK(C->recv(g, b, n, LOOM_F32, prev, 3, &recv_req));
    OK(C->send(g, a, n, LOOM_F32, next, 3, &send_req));
    CHECK_EQ(staged_bytes(), (loom_request_completed_at_issue(recv_req) ? 0 : nb) +
                                 (loom_request_completed_at_issue(send_req) ? 0 : nb));
    OK(C->wait(send_req));
    OK(C->wait(recv_req));
    CHECK_EQ(staged_bytes(), 0);
    EXPECT_DEVICE(b, n, value(prev, i), "send and recv");

    free(host_send);
    free(host_recv);
    loom_mem_free(a);
    loom_mem_free(b);
}

/* A copy that fails on every rank: the op is refused with one line that
 * names it and the reason, and nothing stays staged. */
static void test_copy_fails(loom_group *g)
{
    float *a = device_floats(4), *b = device_floats(4);
    loom_request *req = NULL;
    dev.fail_copies = 1;
    /* out of place: the self communicator moves nothing for an op in place */
    int rc = C->allreduce(g, a, b, 4, LOOM_F32, LOOM_SUM, &req);
    dev.fail_copies = 0;
    CHECK_EQ(rc, LOOM_ERR_INTERNAL);
    CHECK_ERROR("comm: allreduce on group ");
    CHECK_ERROR(": staging its device buffers through host memory for ");
    CHECK_ERROR("fake device: the copy to the host failed");
    CHECK_EQ(staged_bytes(), 0);
    loom_mem_free(a);
    loom_mem_free(b);
}

static int count_in_file(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f))
        for (const char *p = line; (p = strstr(p, needle)); p++)
            n++;
    fclose(f);
    return n;
}

int main(int argc, char **argv)
{
    int cuda = argc == 3 && !strcmp(argv[2], "--cuda");
    if (argc != 2 && !cuda) {
        fprintf(stderr, "usage: staging_test BACKEND [--cuda]\n");
        return 2;
    }
    if (cuda) {
#ifdef LOOM_HAVE_CUDA
        if (loom_device_available() != LOOM_OK) {
            printf("skipped: %s\n", loom_last_error());
            return 77;
        }
#else
        printf("skipped: a loom built without CUDA\n");
        return 77;
#endif
    }
    dev.size = 16u << 20;
    dev.base = mmap(NULL, dev.size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(dev.base != MAP_FAILED);
    const loom_device_memory dm = {
        .name = "fake",
        .staging_tier = LOOM_TIER_HOST,
        .alloc = dev_alloc,
        .free = dev_free,
        .to_host = dev_to_host,
        .to_device = dev_to_device,
    };
    if (!cuda)
        loom_mem_set_device(&dm);
    CHECK_EQ(loom_mem_staging_tier(), cuda ? LOOM_TIER_PINNED : LOOM_TIER_HOST);

    const char *overrides[] = {"comm.timeout_s=60"};
    loom_config *cfg;
    loom_runtime *rt;
    OK(loom_config_load(NULL, overrides, 1, &cfg));
    OK(loom_runtime_create(cfg, &rt));
    loom_group *world;
    OK(loom_group_world(rt, argv[1], &world));
    my_rank = rank = C->rank(world);
    size = C->size(world);
    loom_trace_enable(rank);

    size_t most = (size_t)size * 3001;
    REQUIRE((host_a = malloc(most * sizeof(float))) && (host_b = malloc(most * sizeof(float))));
    const size_t counts[] = {1, 7, 3001};
    for (size_t c = 0; c < sizeof counts / sizeof *counts; c++)
        test_ops(world, counts[c]);
    if (!cuda)
        test_copy_fails(world);

    char trace[128];
    snprintf(trace, sizeof trace, "staging_trace.%d.%d.json", rank, (int)getpid());
    OK(loom_trace_write_part(trace));
    const char *ops[] = {"allreduce", "allgather", "reducescatter", "broadcast", "reduce",
                         "alltoall",  "send",      "recv"};
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        if (size == 1 && !strcmp(ops[i], "broadcast"))
            continue; /* self's broadcast is in place: nothing to stage */
        char span[64];
        snprintf(span, sizeof span, "\"name\":\"stage %s\"", ops[i]);
        CHECK(count_in_file(trace, span) > 0, "no %s span in the trace", span);
    }
    unlink(trace);

    int local = failures, total = 0;
    loom_request *req;
    OK(C->allreduce(world, &local, &total, 1, LOOM_I32, LOOM_SUM, &req));
    OK(C->wait(req));
    loom_group_destroy(world);
    loom_runtime_destroy(rt);
    loom_config_free(cfg);
    loom_mem_set_device(NULL);
    free(host_a);
    free(host_b);
    if (rank == 0)
        printf("staging over %s%s: %s (%d failures over %d ranks)\n", argv[1],
               cuda ? " from CUDA memory" : "", total ? "FAILED" : "passed", total, size);
    return total ? 1 : 0;
}
