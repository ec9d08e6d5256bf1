/* The mesh: run under N ranks with --set style arguments for the axis sizes
 * (parallel.tp.size=2 ...). Checks every rank's coordinates, and that each
 * axis group holds exactly the ranks that differ only along that axis, in
 * axis order, by an allreduce of world ranks over the group. With
 * --expect-error TEXT, mesh creation must fail with a message containing it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/comm.h"
#include "loom/status.h"
#include "loom/strategy.h"
#include "loom/tensor.h"
#include "runtime/config.h"
#include "runtime/group.h"
#include "runtime/log.h"
#include "runtime/mesh.h"
#include "runtime/runtime.h"

int main(int argc, char **argv)
{
    const char *overrides[16];
    int n = 0;
    const char *expect_error = NULL;
    for (int i = 1; i < argc && n < 16; i++) {
        if (!strcmp(argv[i], "--expect-error") && i + 1 < argc)
            expect_error = argv[++i];
        else
            overrides[n++] = argv[i];
    }
    loom_config *cfg;
    loom_runtime *rt;
    if (loom_config_load(NULL, overrides, n, &cfg) != LOOM_OK ||
        loom_runtime_create(cfg, &rt) != LOOM_OK) {
        fprintf(stderr, "mesh_test: %s\n", loom_last_error());
        return 1;
    }
    int rank = loom_runtime_env(rt)->rank, world = loom_runtime_env(rt)->world_size;
    loom_mesh *mesh;
    int rc = loom_mesh_create(rt, &mesh);
    if (expect_error) {
        int right = rc != LOOM_OK && strstr(loom_last_error(), expect_error);
        printf("mesh_test: %s\n", loom_last_error());
        loom_runtime_destroy(rt);
        loom_config_free(cfg);
        return right ? 0 : 1;
    }
    if (rc != LOOM_OK) {
        fprintf(stderr, "mesh_test: %s\n", loom_last_error());
        return 1;
    }
    const loom_comm_api *C = &loom_core_comm_api;
    int failures = 0;
    int coords[LOOM_AXIS_COUNT];
    loom_mesh_coords_of(mesh->sizes, rank, coords);
    if (loom_mesh_rank_of(mesh->sizes, coords) != rank || memcmp(coords, mesh->coords, sizeof coords)) {
        fprintf(stderr, "rank %d: coordinates disagree\n", rank);
        failures++;
    }
    /* tp innermost: rank = tp + TP*(sp + SP*(pp + PP*dp)) */
    int stride = 1;
    for (int a = 0; a < LOOM_AXIS_COUNT; a++) {
        loom_group *g = mesh->groups[a];
        int size = C->size(g), grank = C->rank(g);
        int64_t want_sum = 0, sum = 0, mine = rank;
        for (int i = 0; i < mesh->sizes[a]; i++)
            want_sum += rank + (int64_t)(i - coords[a]) * stride;
        loom_request *req;
        if (C->allreduce(g, &mine, &sum, 1, LOOM_I64, LOOM_SUM, &req) != LOOM_OK ||
            C->wait(req) != LOOM_OK) {
            fprintf(stderr, "rank %d: allreduce on %s: %s\n", rank, loom_axis_name((loom_axis)a),
                    loom_last_error());
            return 1;
        }
        if (size != mesh->sizes[a] || grank != coords[a] || sum != want_sum) {
            fprintf(stderr, "rank %d axis %s: size %d rank %d sum %lld, want %d %d %lld\n", rank,
                    loom_axis_name((loom_axis)a), size, grank, (long long)sum, mesh->sizes[a],
                    coords[a], (long long)want_sum);
            failures++;
        }
        stride *= mesh->sizes[a];
    }
    if (C->size(mesh->world) != world) {
        fprintf(stderr, "rank %d: world group of %d, want %d\n", rank, C->size(mesh->world), world);
        failures++;
    }
    printf("rank %d: coords tp=%d sp=%d pp=%d dp=%d %s\n", rank, coords[0], coords[1], coords[2],
           coords[3], failures ? "WRONG" : "ok");
    loom_mesh_destroy(mesh);
    loom_runtime_destroy(rt);
    loom_config_free(cfg);
    return failures ? 1 : 0;
}
