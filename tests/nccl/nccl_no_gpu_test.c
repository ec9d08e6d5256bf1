/* A machine without a GPU: creating a comm-nccl world fails at once, on
 * every rank, with exactly one line naming CUDA's own reason:
 *   comm-nccl: no CUDA device visible (cudaGetDeviceCount: <CUDA's text>)
 * and the job's other communicators are unharmed (mpi still works after).
 * Where a GPU is visible this path cannot happen: the test skips (77). */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "loom/comm.h"
#include "loom/status.h"
#include "loom/tensor.h"
#include "runtime/config.h"
#include "runtime/group.h"
#include "runtime/log.h"
#include "runtime/runtime.h"
#include "rank_check.h"

int main(void)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaSuccess && count > 0) {
        printf("SKIPPED: %d CUDA device%s visible; this test covers machines without one\n",
               count, count > 1 ? "s" : "");
        return 77;
    }
    char want[512];
    if (e != cudaSuccess)
        snprintf(want, sizeof want, "comm-nccl: no CUDA device visible (cudaGetDeviceCount: %s)",
                 cudaGetErrorString(e));
    else
        snprintf(want, sizeof want, "comm-nccl: no CUDA device visible (cudaGetDeviceCount: 0 devices)");

    loom_config *cfg;
    loom_runtime *rt;
    const char *overrides[] = {"comm.timeout_s=30"};
    OK(loom_config_load(NULL, overrides, 1, &cfg));
    OK(loom_runtime_create(cfg, &rt));
    my_rank = loom_runtime_env(rt)->rank;

    loom_group *g = NULL;
    uint64_t t0 = loom_now_ns();
    int rc = loom_group_world(rt, "nccl", &g);
    double took = (double)(loom_now_ns() - t0) * 1e-9;
    const char *got = loom_last_error();
    printf("[rank %d] create_world: %s: %s (%.3f s)\n", my_rank, loom_status_string(rc), got, took);
    CHECK(rc == LOOM_ERR_NOT_SUPPORTED, "status %s, want %s", loom_status_string(rc),
          loom_status_string(LOOM_ERR_NOT_SUPPORTED));
    CHECK(g == NULL, "a group came back from a failed create");
    CHECK(!strcmp(got, want), "message\n  '%s'\nwant\n  '%s'", got, want);
    CHECK(!strchr(got, '\n'), "the message has more than one line");
    /* "at once": no waiting on other ranks or on the bootstrap store */
    CHECK(took < 2.0, "the refusal took %.1f s", took);

    /* The job goes on with another backend. */
    loom_group *world = NULL;
    OK(loom_group_world(rt, "mpi", &world));
    int local = failures, total = 0;
    loom_request *req;
    OK(loom_core_comm_api.allreduce(world, &local, &total, 1, LOOM_I32, LOOM_SUM, &req));
    OK(loom_core_comm_api.wait(req));
    loom_group_destroy(world);
    loom_runtime_destroy(rt);
    loom_config_free(cfg);
    if (my_rank == 0)
        printf("nccl without a GPU: %s (%d failures)\n", total ? "FAILED" : "passed", total);
    return total ? 1 : 0;
}
