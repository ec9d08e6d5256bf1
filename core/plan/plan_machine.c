/* loom plan — the machine check before `loom train` allocates anything
 * (the check it passes the trainer, train/fit.h): the plan's peak host
 * memory of the ranks on this machine against what the machine and the
 * process's cgroups let it take, and the nvme tier's files against what
 * memory.offload.path has free. A job too big is refused with the figures
 * `loom plan` prints (and, for memory, the settings that would fit) instead
 * of being OOM-killed mid-allocation with no word, or failing at the first
 * block that does not fit. */
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>

#include "plan/plan.h"
#include "runtime/hostmem.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "train/fit.h"

/* The plan's figures for the ranks of this machine, each rank with its
 * pipeline stage's plan. */
typedef struct machine {
    uint64_t host;            /* host and pinned bytes at the peaks, every rank here */
    uint64_t nvme, nvme_mine; /* the nvme tier's file bytes: every rank here, this one */
    char parts[512];          /* the largest rank's peaks by purpose, as `loom plan` lists them */
} machine;

static int plan_machine(const loom_train_machine *tm, const loom_plan_job *job, machine *m)
{
    static const loom_plan_cluster none; /* memory only: no rates, no limits */
    loom_plan plan;
    int rc = loom_plan_make(job, &none, tm->schedule, &plan);
    if (rc != LOOM_OK)
        return rc;
    m->host = m->nvme = m->nvme_mine = 0;
    m->parts[0] = '\0';
    uint64_t largest = 0;
    for (int r = tm->first; r < tm->first + tm->local; r++) {
        int coords[LOOM_AXIS_COUNT];
        loom_mesh_coords_of(job->sizes, r, coords);
        const loom_plan_rank *pr = &plan.ranks[coords[LOOM_AXIS_PP]];
        uint64_t bytes = pr->total[LOOM_TIER_HOST] + pr->total[LOOM_TIER_PINNED];
        m->host += bytes;
        m->nvme += pr->nvme_file;
        if (r == tm->rank)
            m->nvme_mine = pr->nvme_file;
        if (bytes <= largest)
            continue;
        largest = bytes;
        size_t used = 0;
        for (int k = 0; k < LOOM_PURPOSE_COUNT && used < sizeof m->parts; k++) {
            uint64_t b = pr->peak[LOOM_TIER_HOST][k] + pr->peak[LOOM_TIER_PINNED][k];
            char text[32];
            if (!b)
                continue;
            loom_mem_format(b, text, sizeof text);
            used += (size_t)snprintf(m->parts + used, sizeof m->parts - used, "%s%s %s",
                                     used ? ", " : "", loom_purpose_name((loom_purpose)k), text);
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

static int check_memory(const loom_train_machine *tm, const loom_plan_job *job, const machine *m)
{
    loom_host_room room;
    loom_host_room_read(&room);
    if (m->host <= room.bytes)
        return LOOM_OK;
    char nb[32], rb[32], fits[1024] = "";
    loom_mem_format(m->host, nb, sizeof nb);
    loom_mem_format(room.bytes, rb, sizeof rb);
    fit_change changes[8];
    int nchanges = changes_of(job, changes);
    size_t used = 0;
    for (int i = 0; i < nchanges && used < sizeof fits; i++) {
        machine other = *m;
        if (plan_machine(tm, &changes[i].job, &other) != LOOM_OK || other.host > room.bytes)
            continue;
        char b[32];
        loom_mem_format(other.host, b, sizeof b);
        used += (size_t)snprintf(fits + used, sizeof fits - used, "%s%s (%s)", used ? "; " : "",
                                 changes[i].setting, b);
    }
    /* invalid, not out of memory: the job does not fit this machine, and
     * a restart would be refused alike (loom train exits 78) */
    return loom_fail(LOOM_ERR_INVALID,
                     "memory: this job needs %s of host memory at its peak on this machine (%d "
                     "rank%s here; the largest holds %s, as `loom plan` predicts), but only %s "
                     "is free (%s); %s%s",
                     nb, tm->local, tm->local > 1 ? "s" : "", m->parts, rb, room.bound,
                     used ? "it would fit with "
                          : "no single setting makes it fit: use more machines, a smaller model "
                            "or a larger memory limit",
                     fits);
}

/* The tier reserves each unit's segment in whole blocks, as the plan
 * counts them: the whole need, not the first block that does not fit. */
static int check_offload_space(const loom_train_machine *tm, const loom_plan_job *job,
                               const machine *m)
{
    const char *path = "";
    loom_config_string(tm->cfg, "memory.offload.path", &path);
    struct statvfs sv;
    if (m->nvme == 0 || statvfs(path, &sv) != 0)
        return LOOM_OK; /* nothing to place, or no such path: the tier says so itself */
    uint64_t free_bytes = (uint64_t)sv.f_bavail * sv.f_frsize;
    if (sv.f_blocks == 0 || m->nvme <= free_bytes)
        return LOOM_OK; /* ramfs has no size: it takes the machine's memory */
    char need[32], own[32], have[32], block[32], others[96] = "";
    loom_mem_format(m->nvme, need, sizeof need);
    loom_mem_format(m->nvme_mine, own, sizeof own);
    loom_mem_format(free_bytes, have, sizeof have);
    loom_mem_format(job->nvme_block_bytes, block, sizeof block);
    if (tm->local > 1)
        snprintf(others, sizeof others, " (the %d ranks of this machine; this one %s)", tm->local,
                 own);
    return loom_fail(LOOM_ERR_NO_MEMORY,
                     "memory.offload.path = '%s': no space: the offloaded state needs %s on its "
                     "file system%s, each unit's part in whole blocks of %s, and %s is available; "
                     "free space, name a larger disk, or set memory.offload.block_bytes smaller",
                     path, need, others, block, have);
}

int loom_plan_check_machine(const loom_train_machine *tm)
{
    loom_plan_job job;
    memset(&job, 0, sizeof job);
    if (loom_plan_job_read(tm->cfg, &job) != LOOM_OK) {
        /* a job the plan cannot model (a strategy of its own), alike on
         * every rank: nothing to compare, and the allocations' own checks
         * still hold */
        loom_log(LOOM_LOG_DEBUG, "machine check skipped: %s", loom_last_error());
        return LOOM_OK;
    }
    machine m;
    int rc = LOOM_OK;
    if (plan_machine(tm, &job, &m) != LOOM_OK)
        loom_log(LOOM_LOG_DEBUG, "machine check skipped: %s", loom_last_error());
    else if ((rc = check_memory(tm, &job, &m)) == LOOM_OK)
        rc = check_offload_space(tm, &job, &m);
    loom_plan_job_free(&job);
    return rc;
}
