/* loom runtime — The process mesh: one group per parallel axis. */
#ifndef LOOM_RUNTIME_MESH_H
#define LOOM_RUNTIME_MESH_H

#include "loom/comm.h"
#include "loom/strategy.h"
#include "runtime/runtime.h"

typedef struct loom_mesh {
    int sizes[LOOM_AXIS_COUNT];
    int coords[LOOM_AXIS_COUNT];
    loom_group *world;
    loom_group *groups[LOOM_AXIS_COUNT];
} loom_mesh;
/* From parallel.<axis>.size and comm.default / comm.<axis>. */
int loom_mesh_create(loom_runtime *rt, loom_mesh **out);
void loom_mesh_destroy(loom_mesh *mesh);
/* Pure layout helpers (tp innermost, then sp, pp, dp). */
int loom_mesh_rank_of(const int sizes[LOOM_AXIS_COUNT], const int coords[LOOM_AXIS_COUNT]);
void loom_mesh_coords_of(const int sizes[LOOM_AXIS_COUNT], int rank, int coords[LOOM_AXIS_COUNT]);

#endif
