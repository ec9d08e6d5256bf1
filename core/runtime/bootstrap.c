/* Who we are in the job: rank, world size and the local (same machine)
 * rank and size, read from whatever launcher started us (docs/architecture.md). The
 * key-value store that ranks exchange addresses through is in store.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/status.h"
#include "runtime/bootstrap.h"
#include "runtime/log.h"

/* The environment variables of one launcher. rank and size must both be
 * set for the launcher to count as present; the local ones are optional
 * (local_*2 are alternative spellings, MPICH's Hydra for PMI). */
typedef struct launcher_vars {
    const char *source, *name;
    const char *rank, *size;
    const char *local_rank, *local_size;
    const char *local_rank2, *local_size2;
} launcher_vars;

static const launcher_vars launchers[] = {
    {"LOOM", "loom launch", "LOOM_RANK", "LOOM_WORLD_SIZE", "LOOM_LOCAL_RANK", "LOOM_LOCAL_SIZE",
     NULL, NULL},
    {"OMPI", "Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", NULL, NULL},
    {"PMI", "PMI", "PMI_RANK", "PMI_SIZE", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE", "MPI_LOCALRANKID",
     "MPI_LOCALNRANKS"},
    {"SLURM", "Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL, NULL, NULL},
    {"torchrun", "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", NULL, NULL},
};

/* 0: the variable is not set; 1: *out holds its value; <0: it is set but
 * not a non-negative integer (the failure is recorded). */
static int env_int(const char *name, int *out)
{
    const char *text = name ? getenv(name) : NULL;
    if (!text)
        return 0;
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    while (*end == ' ' || *end == '\t' || *end == '\n')
        end++;
    if (end == text || *end != '\0' || errno == ERANGE || v < 0 || v > 0x7fffffff)
        return loom_fail(LOOM_ERR_INVALID,
                         "bootstrap: %s='%s' is not a whole number >= 0; fix or unset it", name,
                         text);
    *out = (int)v;
    return 1;
}

/* The first variable of the pair that is set. */
static int env_int_either(const char *a, const char *b, int *out, const char **which)
{
    int rc = env_int(a, out);
    *which = a;
    if (rc == 0 && b) {
        rc = env_int(b, out);
        *which = b;
    }
    return rc;
}

/* Slurm has no local size variable; SLURM_STEP_TASKS_PER_NODE lists tasks
 * per node in the form "2(x3),1" and SLURM_NODEID says which node we are. */
static int slurm_local_size(int *out)
{
    const char *nodes_text = getenv("SLURM_STEP_NUM_NODES");
    if (!nodes_text)
        nodes_text = getenv("SLURM_NNODES");
    const char *per_node = getenv("SLURM_STEP_TASKS_PER_NODE");
    if (!per_node)
        per_node = getenv("SLURM_TASKS_PER_NODE");
    int node = 0;
    if (nodes_text && atoi(nodes_text) == 1 && per_node) {
        *out = atoi(per_node);
        return *out > 0;
    }
    const char *nodeid = getenv("SLURM_NODEID");
    if (!per_node || !nodeid)
        return 0;
    node = atoi(nodeid);
    const char *p = per_node;
    while (*p) {
        char *end;
        long tasks = strtol(p, &end, 10);
        if (end == p || tasks <= 0)
            return 0;
        long repeat = 1;
        if (*end == '(') {
            if (end[1] != 'x')
                return 0;
            repeat = strtol(end + 2, &end, 10);
            if (*end != ')' || repeat <= 0)
                return 0;
            end++;
        }
        if (node < repeat) {
            *out = (int)tasks;
            return 1;
        }
        node -= (int)repeat;
        if (*end == ',')
            end++;
        else if (*end)
            return 0;
        p = end;
    }
    return 0;
}

/* Whether this process is a task of a Slurm job step (srun started it),
 * rather than the allocation's shell (salloc) or its batch script, which
 * carry the job's SLURM_NTASKS but are one process. */
int loom_slurm_step(void)
{
    const char *step = getenv("SLURM_STEP_ID");
    if (!step)
        step = getenv("SLURM_STEPID");
    /* Slurm numbers its special steps (the batch script, the allocation's
     * interactive step, the external one) from 0xfffffffa up. */
    return step && strtoul(step, NULL, 10) < 0xfffffffaul;
}

int loom_slurm_first_host(const char *nodelist, char *host, size_t cap)
{
    size_t used = 0;
    int depth = 0;
    if (!nodelist || !cap)
        return 0;
    /* "node[07-09,12],gpu3": the first name before a top-level comma, each
     * bracket replaced by its first number ("rack[1-2]-n[01-04]" gives
     * "rack1-n01", the zero padding kept). */
    for (const char *p = nodelist; *p && !(depth == 0 && *p == ','); p++) {
        if (*p == '[') {
            depth = 1;
            continue;
        }
        if (depth) {
            if (*p == ']')
                depth = 0;
            else if (depth == 1 && (*p == ',' || *p == '-'))
                depth = 2; /* the rest of the bracket is other hosts */
            else if (depth == 1 && used + 1 < cap)
                host[used++] = *p;
            continue;
        }
        if (used + 1 < cap)
            host[used++] = *p;
    }
    host[used] = '\0';
    return used > 0 && depth == 0;
}

/* The job's other tasks will never start: say so now, not after a timeout. */
static int slurm_not_a_task(int size)
{
    const char *job = getenv("SLURM_JOB_ID");
    return loom_fail(LOOM_ERR_INVALID,
                     "bootstrap: this process runs in Slurm job %s's allocation (SLURM_NTASKS=%d) "
                     "but is not a task of a job step, so no other rank will start; run it with "
                     "srun (srun -n %d loom ...), or with loom launch -n %d -- loom ...",
                     job ? job : "?", size, size, size);
}

static int detect_from(const launcher_vars *lv, loom_launch_env *out)
{
    int rank = 0, size = 0, rc;
    if ((rc = env_int(lv->rank, &rank)) < 0 || (rc = env_int(lv->size, &size)) < 0)
        return rc;
    if (getenv(lv->rank) && !getenv(lv->size))
        return loom_fail(LOOM_ERR_INVALID,
                         "bootstrap: %s is set but %s is not; set both or neither", lv->rank,
                         lv->size);
    if (size < 1)
        return loom_fail(LOOM_ERR_INVALID, "bootstrap: %s=%d: a world needs at least one rank",
                         lv->size, size);
    if (rank >= size)
        return loom_fail(LOOM_ERR_INVALID, "bootstrap: %s=%d is not below %s=%d", lv->rank, rank,
                         lv->size, size);
    if (!strcmp(lv->source, "SLURM") && size > 1 && !loom_slurm_step())
        return slurm_not_a_task(size);

    int local_rank = 0, local_size = 0;
    const char *local_rank_name, *local_size_name;
    int have_rank = env_int_either(lv->local_rank, lv->local_rank2, &local_rank, &local_rank_name);
    if (have_rank < 0)
        return have_rank;
    int have_size = env_int_either(lv->local_size, lv->local_size2, &local_size, &local_size_name);
    if (have_size < 0)
        return have_size;
    if (!have_size && !strcmp(lv->source, "SLURM")) {
        have_size = slurm_local_size(&local_size);
        local_size_name = "SLURM_STEP_TASKS_PER_NODE";
    }
    /* Without local information, assume one machine: that is what every
     * launcher that leaves it out (a hand-set RANK/WORLD_SIZE) means. */
    if (have_size && (local_size < 1 || local_size > size))
        return loom_fail(LOOM_ERR_INVALID, "bootstrap: %s=%d is not between 1 and %s=%d",
                         local_size_name, local_size, lv->size, size);
    if (!have_size)
        local_size = size;
    if (!have_rank)
        local_rank = have_size ? rank % local_size : rank;
    /* A derived local rank is always below the local size: only a set one
     * can fail here. */
    if (local_rank >= local_size)
        return loom_fail(LOOM_ERR_INVALID, "bootstrap: %s=%d is not below %s=%d", local_rank_name,
                         local_rank, have_size ? local_size_name : lv->size, local_size);
    out->rank = rank;
    out->world_size = size;
    out->local_rank = local_rank;
    out->local_size = local_size;
    out->source = lv->source;
    out->launcher = lv->name;
    out->rank_var = lv->rank;
    return LOOM_OK;
}

/* A launcher after the chosen one whose variables say another rank or
 * size (torchrun's RANK=1 inside a one-task Slurm step) is almost always a
 * leftover from an outer job: it loses, but not silently. Slurm's under an
 * MPI launcher are not a conflict: mpirun inside an allocation is how MPI
 * jobs run there, and Slurm's variables then describe the allocation. */
static void find_conflict(size_t chosen, loom_launch_env *out)
{
    out->conflict[0] = '\0';
    for (size_t i = chosen + 1; i < LOOM_ARRAY_LEN(launchers); i++) {
        const launcher_vars *lv = &launchers[i];
        const char *rank = getenv(lv->rank), *size = getenv(lv->size);
        if (!rank && !size)
            continue;
        if (!strcmp(lv->source, "SLURM") &&
            (!strcmp(out->source, "OMPI") || !strcmp(out->source, "PMI")))
            continue;
        if ((!rank || atoi(rank) == out->rank) && (!size || atoi(size) == out->world_size))
            continue;
        snprintf(out->conflict, sizeof out->conflict,
                 "bootstrap: %s says rank %d of %d (%s, %s) but %s says %s=%s %s=%s; using %s's "
                 "(unset %s's variables if they are left over from an outer job)",
                 out->launcher, out->rank, out->world_size, launchers[chosen].rank,
                 launchers[chosen].size, lv->name, lv->rank, rank ? rank : "unset", lv->size,
                 size ? size : "unset", out->launcher, lv->name);
        return;
    }
}

void loom_launch_env_describe(const loom_launch_env *env, char *buf, size_t cap)
{
    if (!env->rank_var)
        snprintf(buf, cap, "%d (no launcher)", env->world_size);
    else
        snprintf(buf, cap, "%d from %s (%s)", env->world_size, env->launcher, env->rank_var);
}

const char *loom_launch_binding(void)
{
    const char *text = getenv("LOOM_BIND");
    return text && text[0] ? text : NULL;
}

int loom_bootstrap_detect(loom_launch_env *out)
{
    out->rank = 0;
    out->world_size = 1;
    out->local_rank = 0;
    out->local_size = 1;
    out->source = "none";
    out->launcher = "no launcher";
    out->rank_var = NULL;
    out->conflict[0] = '\0';
    for (size_t i = 0; i < LOOM_ARRAY_LEN(launchers); i++) {
        const launcher_vars *lv = &launchers[i];
        /* A launcher is present when either of its two main variables is;
         * a half-set pair is an error rather than a silent world of one. */
        if (getenv(lv->rank) || getenv(lv->size)) {
            int rc = detect_from(lv, out);
            if (rc == LOOM_OK)
                find_conflict(i, out);
            return rc;
        }
    }
    return LOOM_OK;
}

int loom_format_ranks(char *buf, size_t cap, const int *ranks, int n)
{
    /* Long lists stop after a screenful: the first ranks say enough. */
    enum { SHOWN = 32 };
    if (cap == 0)
        return n;
    size_t used = (size_t)snprintf(buf, cap, "%s", n == 1 ? "rank " : "ranks ");
    for (int i = 0; i < n && used < cap; i++) {
        if (i == SHOWN) {
            snprintf(buf + used, cap - used, ", ... (%d more)", n - SHOWN);
            break;
        }
        used += (size_t)snprintf(buf + used, cap - used, "%s%d", i ? ", " : "", ranks[i]);
    }
    return n;
}
