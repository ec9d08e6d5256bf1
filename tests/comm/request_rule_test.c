/* The request rule of the core's comm api (comm.h, above loom_comm_api):
 * every op that returns LOOM_OK hands back a request, complete or not;
 * wait or test on NULL, or on a request already released, is an error
 * naming the op, its number and its group, and never reaches the
 * backend; a group destroyed with requests outstanding names each on
 * stderr; the table of plugins built before ABI 1.10 keeps the old rule
 * (NULL is complete).
 *
 *   request_rule_test BACKEND   under `loom launch -n N` (or alone for self) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/comm.h"
#include "loom/status.h"
#include "runtime/config.h"
#include "runtime/group.h"
#include "runtime/loader.h"
#include "runtime/runtime.h"
#include "rank_check.h"

static const loom_comm_api *C = &loom_core_comm_api;

static void null_requests(void)
{
    CHECK_EQ(C->wait(NULL), LOOM_ERR_INVALID);
    CHECK_ERROR("comm: wait on a NULL request: no op set it");
    CHECK_EQ(C->test(NULL), LOOM_ERR_INVALID);
    CHECK_ERROR("comm: test on a NULL request");
}

/* A second wait, and a test, on a request the first wait released. */
static void twice(loom_group *g, const char *named)
{
    int n = C->size(g);
    float one = 1, sum = 0;
    loom_request *req = NULL;
    OK(C->allreduce(g, &one, &sum, 1, LOOM_F32, LOOM_SUM, &req));
    REQUIRE(req != NULL, "an allreduce on %s handed back no request", C->backend(g));
    OK(C->wait(req));
    CHECK_EQ(sum, n);
    loom_request *other = NULL; /* the released request's memory is not reused at once */
    OK(C->barrier(g, &other));
    CHECK(other != req);
    OK(C->wait(other));
    CHECK_EQ(C->wait(req), LOOM_ERR_INVALID);
    CHECK_ERROR(named);
    CHECK_ERROR("already completed and released");
    CHECK_EQ(C->test(req), LOOM_ERR_INVALID);
    CHECK_ERROR(named);
}

/* Sends and receives are named with their peer. */
static void p2p_twice(loom_group *g)
{
    int n = C->size(g), me = C->rank(g);
    int to = (me + 1) % n, from = (me + n - 1) % n, out = me, in = -1;
    loom_request *send = NULL, *recv = NULL;
    OK(C->recv(g, &in, 1, LOOM_I32, from, 7, &recv));
    OK(C->send(g, &out, 1, LOOM_I32, to, 7, &send));
    OK(C->wait(send));
    int rc;
    while ((rc = C->test(recv)) == LOOM_IN_PROGRESS)
        ;
    OK(rc);
    CHECK_EQ(in, from);
    char named[96];
    CHECK_EQ(C->wait(recv), LOOM_ERR_INVALID);
    snprintf(named, sizeof named, "recv #1 from rank %d on group", from);
    CHECK_ERROR(named);
    CHECK_EQ(C->test(send), LOOM_ERR_INVALID);
    snprintf(named, sizeof named, " to rank %d on group", to);
    CHECK_ERROR(named);
}

/* The old rule: complete at issue hands back NULL, and NULL is complete. */
static void old_rule(loom_group *self, loom_group *world)
{
    const loom_comm_api *old = &loom_core_comm_api_v1_9;
    float one = 1, sum = 0;
    loom_request *req = (loom_request *)&req; /* anything but NULL */
    OK(old->allreduce(self, &one, &sum, 1, LOOM_F32, LOOM_SUM, &req));
    CHECK(req == NULL, "the old table handed back a request for an op complete at issue");
    CHECK_EQ(sum, 1);
    OK(old->wait(NULL));
    OK(old->test(NULL));
    OK(old->allreduce(world, &one, &sum, 1, LOOM_F32, LOOM_SUM, &req));
    OK(old->wait(req));
    CHECK_EQ(sum, C->size(world));
}

/* The host table of a plugin gets the rule it was built for. */
static void host_tables(loom_runtime *rt)
{
    static loom_plugin plugins[2];
    static const char *const names[2] = {"abi19", "abi110"};
    const loom_comm_api *want[2] = {&loom_core_comm_api_v1_9, &loom_core_comm_api};
    for (int i = 0; i < 2; i++) {
        loom_plugin *p = &plugins[i];
        p->kind = p->built_as = LOOM_PLUGIN_STRATEGY;
        p->ops.strategy.header = (loom_plugin_header){
            .abi_version = LOOM_ABI_VERSION(1, 9 + i),
            .kind = LOOM_PLUGIN_STRATEGY,
            .name = names[i],
        };
        p->header = &p->ops.strategy.header;
        char group[64];
        snprintf(group, sizeof group, "strategy.%s", names[i]);
        const loom_host *h = NULL;
        OK(loom_runtime_host(rt, p, group, &h));
        CHECK(h->comm == want[i], "a plugin built for 1.%d got the other comm api table", 9 + i);
    }
}

/* What a destroyed group says on stderr, caught in a file; an op posted
 * on it afterwards is refused. */
static void teardown(loom_runtime *rt)
{
    loom_group *g;
    OK(loom_group_self(rt, &g));
    loom_request *done = NULL, *pending = NULL;
    float one = 1, sum = 0;
    int in = 0;
    OK(C->allreduce(g, &one, &sum, 1, LOOM_F32, LOOM_SUM, &done));
    OK(C->recv(g, &in, 1, LOOM_I32, 0, 3, &pending)); /* no send: outstanding */
    char path[] = "/tmp/request_rule_XXXXXX";
    int fd = mkstemp(path), saved = dup(2);
    REQUIRE(fd >= 0 && saved >= 0);
    fflush(stderr);
    dup2(fd, 2);
    loom_group_destroy(g);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char said[2048] = "";
    ssize_t len = pread(fd, said, sizeof said - 1, 0);
    close(fd);
    unlink(path);
    said[len > 0 ? len : 0] = '\0';
    CHECK(strstr(said, "comm: group self destroyed with allreduce #1 on group self outstanding"),
          "stderr: %s", said);
    CHECK(strstr(said, "comm: group self destroyed with recv #1 from rank 0 on group self "
                       "outstanding"),
          "stderr: %s", said);
    CHECK_EQ(C->wait(pending), LOOM_ERR_INVALID);
    CHECK_ERROR("recv #1 from rank 0 on group self, whose group was destroyed");
    loom_request *late = NULL; /* g is a tombstone for the next destroys */
    CHECK_EQ(C->allreduce(g, &one, &sum, 1, LOOM_F32, LOOM_SUM, &late), LOOM_ERR_INVALID);
    CHECK_ERROR("comm: allreduce on group self, which was destroyed");
    CHECK_EQ(C->barrier(g, &late), LOOM_ERR_INVALID);
    CHECK_ERROR("comm: barrier on group self, which was destroyed");
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: request_rule_test BACKEND\n");
        return 2;
    }
    const char *overrides[] = {"comm.timeout_s=60"};
    loom_config *cfg;
    loom_runtime *rt;
    OK(loom_config_load(NULL, overrides, 1, &cfg));
    OK(loom_runtime_create(cfg, &rt));
    loom_group *world, *self;
    OK(loom_group_world(rt, argv[1], &world));
    my_rank = C->rank(world);
    OK(loom_group_self(rt, &self));

    null_requests();
    twice(self, "allreduce #1 on group self");
    char named[64];
    snprintf(named, sizeof named, "allreduce #1 on group %s", loom_group_name(world));
    twice(world, named);
    p2p_twice(world);
    old_rule(self, world);
    host_tables(rt);
    teardown(rt);

    loom_group_destroy(self);
    loom_group_destroy(world);
    loom_runtime_destroy(rt);
    loom_config_free(cfg);
    return check_done("request_rule_test");
}
