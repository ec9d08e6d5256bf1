/* loom train — the nvme tier's disk checked before anything is placed on
 * it: the plan's file size of every rank of this machine (each segment in
 * whole blocks, as the tier reserves them) against what the file system of
 * memory.offload.path has free. The ranks agree on the outcome, so a disk
 * too small for any rank stops every rank at once, with the whole need
 * rather than the first block that did not fit, and none waits out
 * comm.timeout_s in a collective of the strategy's setup. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>

#include "loom/status.h"
#include "runtime/bootstrap.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/mesh.h"
#include "runtime/runtime.h"
#include "train/plan.h"
#include "train/trainer.h"

/* The file bytes of ranks first .. first + local - 1, and this rank's. */
static int file_bytes(const trainer *t, const loom_plan_job *job, int first, int local,
                      uint64_t *node, uint64_t *mine)
{
    static const loom_plan_cluster none; /* memory only */
    const loom_schedule *schedule = job->sizes[LOOM_AXIS_PP] > 1 ? &t->pipe_schedule : NULL;
    loom_plan plan;
    int rc = loom_plan_make(job, &none, schedule, &plan);
    if (rc != LOOM_OK)
        return rc;
    *node = *mine = 0;
    for (int r = first; r < first + local; r++) {
        int coords[LOOM_AXIS_COUNT];
        loom_mesh_coords_of(job->sizes, r, coords);
        uint64_t bytes = plan.ranks[coords[LOOM_AXIS_PP]].nvme_file;
        *node += bytes;
        if (r == t->rank)
            *mine = bytes;
    }
    loom_plan_free(&plan);
    return LOOM_OK;
}

/* This rank's verdict: LOOM_OK, or a failure with its one line. */
static int check_space(trainer *t, const loom_plan_job *job)
{
    const loom_launch_env *env = loom_runtime_env(t->rt);
    int local = env->local_size > 0 ? env->local_size : 1;
    int first = env->rank - (env->local_rank >= 0 ? env->local_rank : 0);
    if (first < 0 || first + local > t->world) {
        first = t->rank;
        local = 1;
    }
    uint64_t node = 0, mine = 0;
    if (file_bytes(t, job, first, local, &node, &mine) != LOOM_OK) {
        loom_log(LOOM_LOG_DEBUG, "offload space check skipped: %s", loom_last_error());
        return LOOM_OK; /* the tier's own reservations still fail, block by block */
    }
    const char *path = "";
    loom_config_string(t->cfg, "memory.offload.path", &path);
    struct statvfs sv;
    if (node == 0 || statvfs(path, &sv) != 0)
        return LOOM_OK; /* nothing to place, or no such path: the tier said so already */
    uint64_t free_bytes = (uint64_t)sv.f_bavail * sv.f_frsize;
    if (sv.f_blocks == 0 || node <= free_bytes)
        return LOOM_OK; /* ramfs has no size: it takes the machine's memory */
    char need[32], own[32], have[32], block[32], others[96] = "";
    loom_mem_format(node, need, sizeof need);
    loom_mem_format(mine, own, sizeof own);
    loom_mem_format(free_bytes, have, sizeof have);
    loom_mem_format(job->nvme_block_bytes, block, sizeof block);
    if (local > 1)
        snprintf(others, sizeof others, " (the %d ranks of this machine; this one %s)", local, own);
    return loom_fail(LOOM_ERR_NO_MEMORY,
                     "memory.offload.path = '%s': no space: the offloaded state needs %s on its "
                     "file system%s, each unit's part in whole blocks of %s, and %s is available; "
                     "free space, name a larger disk, or set memory.offload.block_bytes smaller",
                     path, need, others, block, have);
}

int trainer_check_offload_space(trainer *t)
{
    loom_plan_job job;
    memset(&job, 0, sizeof job);
    if (loom_plan_job_read(t->cfg, &job) != LOOM_OK) {
        loom_log(LOOM_LOG_DEBUG, "offload space check skipped: %s", loom_last_error());
        return LOOM_OK;
    }
    int nvme = 0;
    for (int p = 0; p < LOOM_PURPOSE_COUNT; p++)
        nvme |= job.offload[p] == LOOM_OFFLOAD_NVME;
    int rc = nvme ? check_space(t, &job) : LOOM_OK;
    loom_plan_job_free(&job);
    if (!nvme || t->world == 1)
        return rc;
    /* the verdict of every rank: the first that failed, whose line the
     * others read from the bootstrap store */
    char reason[1024], key[64];
    snprintf(reason, sizeof reason, "%s", rc == LOOM_OK ? "" : loom_last_error());
    loom_store *store = loom_runtime_store(t->rt);
    if (rc != LOOM_OK && store) {
        snprintf(key, sizeof key, "offload/space/%d", t->rank);
        loom_store_put(store, key, reason, strlen(reason) + 1);
    }
    double first = rc == LOOM_OK ? (double)t->world : (double)t->rank;
    int comm_rc = trainer_group_allreduce(t->mesh->world, &first, 1, LOOM_F64, LOOM_MIN);
    if (comm_rc != LOOM_OK)
        return comm_rc;
    int rank = (int)first;
    if (rank >= t->world || rank == t->rank)
        return rc == LOOM_OK ? LOOM_OK : loom_fail(rc, "%s", reason);
    char theirs[1024];
    size_t len = 0;
    snprintf(key, sizeof key, "offload/space/%d", rank);
    if (!store || loom_store_get(store, key, theirs, sizeof theirs, &len,
                                 loom_runtime_timeout(t->rt)) != LOOM_OK)
        snprintf(theirs, sizeof theirs, "(its output says why)");
    theirs[sizeof theirs - 1] = '\0';
    /* a disk of its own that is short too (another machine's): said here,
     * while the launcher blames the first */
    if (rc != LOOM_OK && strcmp(reason, theirs) != 0)
        loom_log(LOOM_LOG_WARN, "%s (after rank %d failed)", reason, rank);
    return loom_fail(LOOM_ERR_REMOTE, "rank %d: %s", rank, theirs);
}
