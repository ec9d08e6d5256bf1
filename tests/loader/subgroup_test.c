/* Groups of one: over a backend that takes host memory the core serves them
 * itself ("self"); over one that declares device memory only (as comm-nccl
 * does) it cannot copy the buffers, so subgroups and splits of one rank
 * stay on the backend.
 *
 * usage: subgroup_test   (LOOM_PLUGIN_PATH: the test plugins' folder) */
#include <stdio.h>
#include <string.h>

#include "loom/comm.h"
#include "loom/status.h"
#include "runtime/config.h"
#include "runtime/group.h"
#include "runtime/log.h"
#include "runtime/runtime.h"
#include "check.h"

static const loom_comm_api *C = &loom_core_comm_api;

/* A subgroup of rank 0 and a split of the world: both over `want`, and
 * an allreduce through each gives the one value back. */
static void check(loom_runtime *rt, const char *backend, const char *want)
{
    loom_group *world = NULL, *sub = NULL, *split = NULL;
    int rc = loom_group_world(rt, backend, &world);
    CHECK(rc == LOOM_OK, "%s world: %s", backend, loom_last_error());
    if (rc != LOOM_OK)
        return;
    int zero = 0;
    rc = loom_group_subgroup(world, &zero, 1, &sub);
    CHECK(rc == LOOM_OK, "%s subgroup: %s", backend, loom_last_error());
    rc = C->split(world, 7, 0, &split);
    CHECK(rc == LOOM_OK, "%s split: %s", backend, loom_last_error());
    loom_group *groups[2] = {sub, split};
    const char *what[2] = {"subgroup of one", "split of one"};
    for (int i = 0; i < 2; i++) {
        if (!groups[i])
            continue;
        CHECK(!strcmp(C->backend(groups[i]), want), "%s over %s: backend %s, want %s", what[i],
              backend, C->backend(groups[i]), want);
        float x = 3.5f, y = 0;
        loom_request *req = NULL;
        rc = C->allreduce(groups[i], &x, &y, 1, LOOM_F32, LOOM_SUM, &req);
        if (rc == LOOM_OK)
            rc = C->wait(req);
        CHECK(rc == LOOM_OK && y == 3.5f, "%s over %s: allreduce %s, %g", what[i], backend,
              loom_status_string(rc), y);
        printf("%s over %s: %s\n", what[i], backend, C->backend(groups[i]));
    }
    loom_group_destroy(sub);
    loom_group_destroy(world); /* and its split */
}

int main(void)
{
    loom_config *cfg = NULL;
    loom_runtime *rt = NULL;
    if (loom_config_load(NULL, NULL, 0, &cfg) != LOOM_OK ||
        loom_runtime_create(cfg, &rt) != LOOM_OK) {
        fprintf(stderr, "subgroup_test: %s\n", loom_last_error());
        return 1;
    }
    check(rt, "good", "self");
    check(rt, "deviceonly", "deviceonly");
    loom_runtime_destroy(rt);
    loom_config_free(cfg);
    return failures ? 1 : 0;
}
