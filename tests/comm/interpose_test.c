/* A communicator that wraps another (the comm-trace example): host->comm_open
 * in a comm plugin's host table alone, refusing "self" and the wrapper
 * itself, the same two on a second call; LOOM_MEM_KINDS_INNER resolved to
 * the opened backend's kinds once the world exists (the device bit of a
 * device-only backend too), refused before; the inner op followed from the
 * wrapper's communicator to the one comm_waiting names; the trace written
 * at the world's destroy.
 *
 *   interpose_test host             under `loom launch -n 1`, comm.trace.inner = mpi
 *   interpose_test device PLUGIN    the same over the device-only backend PLUGIN
 *   interpose_test waiting          under `loom launch -n 2`, over ucx: rank 1 never
 *       comes to an allreduce; comm-ucx reports rank 0's arrival through the wrapper
 *       (comm_waiting on its own communicator), so the core's grace after the timeout
 *       is a quarter of comm.timeout_s, not comm.ucx.late_grace_s = 1000: the wait
 *       names rank 1 within seconds, and without the lookup the test would hang */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/comm.h"
#include "runtime/config.h"
#include "runtime/group.h"
#include "runtime/runtime.h"
#include "check.h"

static const loom_comm_api *C = &loom_core_comm_api;

static loom_runtime *start(const char *inner, const char *timeout)
{
    char inner_setting[512];
    snprintf(inner_setting, sizeof inner_setting, "comm.trace.inner=\"%s\"", inner);
    const char *overrides[] = {timeout, inner_setting, "comm.trace.output=interpose-test",
                               "comm.ucx.late_grace_s=1000"};
    loom_config *cfg;
    loom_runtime *rt;
    OK(loom_config_load(NULL, overrides, 4, &cfg));
    OK(loom_runtime_create(cfg, &rt));
    return rt;
}

/* comm_open and the lookup of the communicator a wrapper forwards to */
static void check_open(loom_runtime *rt, const loom_plugin *trace)
{
    const loom_plugin *mpi, *ddp;
    const loom_host *host, *mpi_host, *ddp_host, *opened_host = NULL;
    const loom_comm_plugin_v1_t *ops = NULL;
    OK(loom_runtime_plugin(rt, LOOM_PLUGIN_COMM, "mpi", &mpi));
    OK(loom_runtime_host(rt, trace, "comm.trace", &host));
    REQUIRE(host->comm_open != NULL);
    OK(host->comm_open(host, "mpi", &ops, &mpi_host));
    CHECK(ops == &mpi->ops.comm, "comm_open gives the backend's plugin struct");
    CHECK(loom_runtime_comm_opened(rt, trace, &opened_host) == mpi);
    CHECK(opened_host == mpi_host, "a second comm_open gives the same host table");
    CHECK_EQ(host->comm_open(host, "self", &ops, &mpi_host), LOOM_ERR_INVALID);
    CHECK_ERROR("comm-trace: comm_open(\"self\"): name a comm backend to forward to");
    CHECK_EQ(host->comm_open(host, "trace", &ops, &mpi_host), LOOM_ERR_INVALID);
    CHECK_ERROR("that is comm-trace itself");
    OK(loom_runtime_plugin(rt, LOOM_PLUGIN_STRATEGY, "ddp", &ddp));
    OK(loom_runtime_host(rt, ddp, "parallel.dp", &ddp_host));
    CHECK(ddp_host->comm_open == NULL, "a strategy's host table has no comm_open");

    loom_comm *comm = NULL;
    OK(trace->ops.comm.create_world(host, &comm));
    loom_comm *inner = trace->ops.comm.inner(comm);
    REQUIRE(inner != NULL);
    CHECK(loom_runtime_comm_forwards_to(rt, trace, comm, inner));
    CHECK(loom_runtime_comm_forwards_to(rt, trace, comm, comm));
    CHECK(!loom_runtime_comm_forwards_to(rt, trace, comm, (loom_comm *)&inner),
          "a communicator the wrapper does not forward to is not found");
    CHECK(!loom_runtime_comm_forwards_to(rt, mpi, inner, comm), "the lookup goes inward only");
    loom_group_comm_waiting(mpi_host, inner); /* found through the wrapper, reported */
    OK(trace->ops.comm.destroy(comm));
}

static void check_trace_file(void)
{
    FILE *f = fopen("interpose-test.0.json", "r");
    REQUIRE(f != NULL, "comm-trace wrote no interpose-test.0.json at the world's destroy");
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    CHECK(strstr(text, "\"allreduce\": {\"calls\": 1, \"bytes\": 32,") != NULL,
          "one allreduce of 8 floats in %s", text);
    CHECK(strstr(text, "\"group\": \"world\", \"size\": 1, \"world_ranks\": [0]") != NULL);
}

static int waiting(void)
{
    loom_runtime *rt = start("ucx", "comm.timeout_s=2");
    loom_group *world;
    OK(loom_group_world(rt, "trace", &world));
    if (C->rank(world) == 1) { /* never comes */
        sleep(6);
        _exit(0);
    }
    float x = 1, y = 0;
    loom_request *req = NULL;
    OK(C->allreduce(world, &x, &y, 1, LOOM_F32, LOOM_SUM, &req));
    CHECK_EQ(C->wait(req), LOOM_ERR_TIMEOUT);
    CHECK_ERROR("rank 1 did not arrive");
    fflush(stdout);
    _exit(check_done("interpose_test waiting"));
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "waiting"))
        return waiting();
    int device = argc == 3 && !strcmp(argv[1], "device");
    if (!device && !(argc == 2 && !strcmp(argv[1], "host"))) {
        fprintf(stderr, "usage: interpose_test host | device PLUGIN | waiting\n");
        return 2;
    }
    remove("interpose-test.0.json");
    loom_runtime *rt = start(device ? argv[2] : "mpi", "comm.timeout_s=60");
    const loom_plugin *trace, *inner;
    uint32_t kinds = 0;
    OK(loom_runtime_plugin(rt, LOOM_PLUGIN_COMM, "trace", &trace));
    OK(loom_runtime_plugin(rt, LOOM_PLUGIN_COMM, device ? argv[2] : "mpi", &inner));
    CHECK_EQ(trace->ops.comm.mem_kinds, LOOM_MEM_KINDS_INNER);
    CHECK_EQ(loom_runtime_comm_mem_kinds(rt, trace, &kinds), LOOM_ERR_INVALID);
    CHECK_ERROR("comm-trace: mem_kinds is LOOM_MEM_KINDS_INNER, the kinds of the backend it "
                "opens, but it opened none");

    loom_group *world;
    OK(loom_group_world(rt, "trace", &world));
    OK(loom_runtime_comm_mem_kinds(rt, trace, &kinds));
    CHECK_EQ(kinds, inner->ops.comm.mem_kinds);
    CHECK_EQ(loom_group_mem_kinds(world), inner->ops.comm.mem_kinds);
    if (device) {
        CHECK_EQ(loom_group_mem_kinds(world), LOOM_MEM_BIT(LOOM_MEM_DEVICE));
    } else {
        CHECK(loom_group_mem_kinds(world) & LOOM_MEM_BIT(LOOM_MEM_HOST));
        float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        loom_request *req = NULL;
        OK(C->allreduce(world, x, x, 8, LOOM_F32, LOOM_SUM, &req));
        OK(C->wait(req));
        check_open(rt, trace);
    }
    loom_group_destroy(world);
    if (!device)
        check_trace_file();
    loom_runtime_destroy(rt);
    return check_done("interpose_test");
}
