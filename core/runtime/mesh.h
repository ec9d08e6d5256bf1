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
    /* The backend of the axes that communicate and why, for the run's
     * header: "ucx (auto: host memory, comm-ucx loads)"; "" on one rank. */
    char comm_choice[1280];
} loom_mesh;
/* From parallel.<axis>.size and comm.default / comm.<axis>; "auto" is
 * resolved by loom_comm_auto for the memory of the run's compute backend
 * (loom_runtime_compute: device memory on a CUDA stream, else host). */
int loom_mesh_create(loom_runtime *rt, loom_mesh **out);
void loom_mesh_destroy(loom_mesh *mesh);
/* The backend "auto" stands for, for buffers of `memory`: comm-nccl for
 * device memory (when every rank of each machine has a CUDA device of its
 * own), comm-ucx for host memory, when that plugin loads (and takes that
 * memory) on every rank; comm-mpi otherwise. Device memory that comm-nccl
 * cannot take gets the host's choice (its buffers staged). Every rank calls
 * it, in the same order: they agree through the bootstrap store. *name
 * gets the backend, why the reason as the run's header shows it ("auto:
 * host memory, comm-ucx loads"). */
int loom_comm_auto(loom_runtime *rt, loom_mem_kind memory, const char **name, char *why,
                   size_t cap);
/* Pure layout helpers (tp innermost, then sp, pp, dp). */
int loom_mesh_rank_of(const int sizes[LOOM_AXIS_COUNT], const int coords[LOOM_AXIS_COUNT]);
void loom_mesh_coords_of(const int sizes[LOOM_AXIS_COUNT], int rank, int coords[LOOM_AXIS_COUNT]);

#endif
