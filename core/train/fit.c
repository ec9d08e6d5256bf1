/* loom train — Memory checked before allocating: the plan's peak for the
 * ranks on this machine against what the machine and the process's cgroups
 * let it take. A job too big is refused with the figures `loom plan`
 * prints and the settings that would fit, instead of being OOM-killed
 * mid-allocation with no word. */
#include <stdio.h>
#include <string.h>

#include "runtime/bootstrap.h"
#include "runtime/hostmem.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/runtime.h"
#include "train/plan.h"
#include "train/trainer.h"

/* The host bytes the ranks of this machine hold at their peaks: the
 * machine runs world ranks first .. first + local - 1 (a launcher places
 * ranks in blocks per node), each with its pipeline stage's plan. */
static int node_need(const loom_plan_job *job, const loom_schedule *schedule, int first, int local,
                     uint64_t *need, char *parts, size_t cap)
{
    static const loom_plan_cluster none; /* memory only: no rates, no limits */
    loom_plan plan;
    int rc = loom_plan_make(job, &none, schedule, &plan);
    if (rc != LOOM_OK)
        return rc;
    *need = 0;
    uint64_t largest = 0;
    for (int r = first; r < first + local; r++) {
        int coords[LOOM_AXIS_COUNT];
        loom_mesh_coords_of(job->sizes, r, coords);
        const loom_plan_rank *pr = &plan.ranks[coords[LOOM_AXIS_PP]];
        uint64_t bytes = pr->total[LOOM_TIER_HOST] + pr->total[LOOM_TIER_PINNED];
        *need += bytes;
        if (parts && bytes > largest) {
            largest = bytes;
            /* the rank's peaks by purpose, as `loom plan` lists them */
            size_t used = 0;
            for (int k = 0; k < LOOM_PURPOSE_COUNT && used < cap; k++) {
                uint64_t b = pr->peak[LOOM_TIER_HOST][k] + pr->peak[LOOM_TIER_PINNED][k];
                char text[32];
                if (!b)
                    continue;
                loom_mem_format(b, text, sizeof text);
                used += (size_t)snprintf(parts + used, cap - used, "%s%s %s", used ? ", " : "",
                                         loom_purpose_name((loom_purpose)k), text);
            }
        }
    }
    loom_plan_free(&plan);
    return LOOM_OK;
}

/* One setting that changes the plan, tried alone. */
typedef struct fit_change {
    char setting[96];
    loom_plan_job job;
} fit_change;

static int changes_of(const loom_plan_job *job, fit_change *out)
{
    int n = 0;
    if (!job->recompute) {
        out[n].job = *job;
        out[n].job.recompute = 1;
        snprintf(out[n++].setting, sizeof out[0].setting, "train.recompute = \"block\"");
    }
    /* a smaller micro-batch: twice the accumulation, where the batch divides */
    int dp = job->sizes[LOOM_AXIS_DP];
    if (job->sizes[LOOM_AXIS_PP] == 1 && job->micro_batch > 1 &&
        job->batch % (dp * job->grad_accum * 2) == 0) {
        out[n].job = *job;
        out[n].job.grad_accum *= 2;
        out[n].job.micro_batch /= 2;
        snprintf(out[n++].setting, sizeof out[0].setting, "train.grad_accum = %d",
                 job->grad_accum * 2);
    }
    static const char *const stages[] = {"ddp", "zero1", "zero2", "zero3"};
    int at = -1;
    for (int s = 0; s < 4; s++)
        if (!strcmp(job->dp_strategy, stages[s]))
            at = s;
    for (int s = at + 1; at >= 0 && dp > 1 && s < 4; s++) {
        out[n].job = *job;
        snprintf(out[n].job.dp_strategy, sizeof out[n].job.dp_strategy, "%s", stages[s]);
        snprintf(out[n++].setting, sizeof out[0].setting, "parallel.dp.strategy = \"%s\"",
                 stages[s]);
    }
    if (job->offload[LOOM_PURPOSE_OPTIMIZER] != LOOM_OFFLOAD_NVME) {
        out[n].job = *job;
        out[n].job.offload[LOOM_PURPOSE_OPTIMIZER] = LOOM_OFFLOAD_NVME;
        snprintf(out[n++].setting, sizeof out[0].setting, "memory.offload.optimizer = \"nvme\"");
    }
    if (!strcmp(job->dp_strategy, "zero3") &&
        job->offload[LOOM_PURPOSE_PARAMS] != LOOM_OFFLOAD_NVME) {
        out[n].job = *job;
        out[n].job.offload[LOOM_PURPOSE_PARAMS] = LOOM_OFFLOAD_NVME;
        out[n].job.offload[LOOM_PURPOSE_OPTIMIZER] = LOOM_OFFLOAD_NVME;
        snprintf(out[n++].setting, sizeof out[0].setting,
                 "memory.offload.params = \"nvme\" and .optimizer = \"nvme\"");
    }
    return n;
}

int trainer_check_memory(trainer *t)
{
    loom_plan_job job;
    memset(&job, 0, sizeof job);
    if (loom_plan_job_read(t->cfg, &job) != LOOM_OK) {
        /* a job the plan cannot model (a strategy of its own): nothing to
         * compare, and the allocations' own checks still hold */
        loom_log(LOOM_LOG_DEBUG, "memory check skipped: %s", loom_last_error());
        return LOOM_OK;
    }
    const loom_launch_env *env = loom_runtime_env(t->rt);
    int local = env->local_size > 0 ? env->local_size : 1;
    int first = env->rank - (env->local_rank >= 0 ? env->local_rank : 0);
    if (first < 0 || first + local > t->world) {
        first = t->rank;
        local = 1;
    }
    const loom_schedule *schedule = job.sizes[LOOM_AXIS_PP] > 1 ? &t->pipe_schedule : NULL;
    uint64_t need = 0;
    char parts[512] = "";
    int rc = node_need(&job, schedule, first, local, &need, parts, sizeof parts);
    if (rc != LOOM_OK) {
        loom_log(LOOM_LOG_DEBUG, "memory check skipped: %s", loom_last_error());
        loom_plan_job_free(&job);
        return LOOM_OK;
    }
    loom_host_room room;
    loom_host_room_read(&room);
    if (need <= room.bytes) {
        loom_plan_job_free(&job);
        return LOOM_OK;
    }
    char nb[32], rb[32], fits[1024] = "";
    loom_mem_format(need, nb, sizeof nb);
    loom_mem_format(room.bytes, rb, sizeof rb);
    fit_change changes[8];
    int nchanges = changes_of(&job, changes);
    size_t used = 0;
    for (int i = 0; i < nchanges && used < sizeof fits; i++) {
        uint64_t other = 0;
        if (node_need(&changes[i].job, schedule, first, local, &other, NULL, 0) != LOOM_OK ||
            other > room.bytes)
            continue;
        char b[32];
        loom_mem_format(other, b, sizeof b);
        used += (size_t)snprintf(fits + used, sizeof fits - used, "%s%s (%s)", used ? "; " : "",
                                 changes[i].setting, b);
    }
    /* invalid, not out of memory: the job does not fit this machine, and
     * a restart would be refused alike (loom train exits 78) */
    rc = loom_fail(LOOM_ERR_INVALID,
                   "memory: this job needs %s of host memory at its peak on this machine (%d "
                   "rank%s here; the largest holds %s, as `loom plan` predicts), but only %s is "
                   "free (%s); %s%s",
                   nb, local, local > 1 ? "s" : "", parts, rb, room.bound,
                   used ? "it would fit with "
                        : "no single setting makes it fit: use more "
                          "machines, a smaller model or a larger memory "
                          "limit",
                   fits);
    loom_plan_job_free(&job);
    return rc;
}
