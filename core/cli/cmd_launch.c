/* `loom launch -n N [--timeout S] [--] CMD [ARGS...]`: N ranks of CMD on this
 * machine; across machines one launcher per machine (--nnodes, which srun
 * fills in), or mpirun or srun alone (docs/architecture.md, docs/slurm.md).
 *
 * This file is the command line: its options into loom_launch_options,
 * checked against each other, for the supervisor (supervisor.h), which
 * runs the job and gives the launcher's exit status. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/supervisor.h"
#include "runtime/bootstrap.h"

static const char usage_text[] =
    "usage: loom launch -n N [--timeout S] [--max-restarts R] [--bind core|none] "
    "[--nnodes M --node-rank K --master HOST:PORT] [-v] [--flight FILE] [--] CMD [ARGS...]";

static int usage_error(const char *what)
{
    fprintf(stderr, "loom launch: %s; %s\n", what, usage_text);
    return 2;
}

/* "HOST:PORT" into a; 0, or -1 when it is not one. */
static int parse_master(const char *text, loom_launch_options *a)
{
    const char *colon = strrchr(text, ':');
    if (!colon || colon == text || (size_t)(colon - text) >= sizeof a->master)
        return -1;
    char *end;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || *end || errno || port < 1 || port > 65535)
        return -1;
    snprintf(a->master, sizeof a->master, "%.*s", (int)(colon - text), text);
    a->master_port = (int)port;
    return 0;
}

/* One option's value into a; NULL, or what is wrong with it. */
static const char *take_value(const char *name, const char *value, loom_launch_options *a)
{
    char *end;
    errno = 0;
    if (!strcmp(name, "--timeout")) {
        double v = strtod(value, &end);
        if (end == value || *end || !(v > 0) || v > 1e7)
            return "--timeout needs a number of seconds > 0";
        a->timeout_s = v;
        return NULL;
    }
    if (!strcmp(name, "--master"))
        return parse_master(value, a) == 0 ? NULL : "--master needs HOST:PORT (rank 0's node)";
    if (!strcmp(name, "--flight")) {
        a->flight_out = value;
        return value[0] ? NULL : "--flight needs a file name";
    }
    if (!strcmp(name, "--bind")) {
        if (strcmp(value, "core") && strcmp(value, "none"))
            return "--bind needs core (one core per rank) or none";
        a->bind = !strcmp(value, "core") ? LOOM_BIND_CORE : LOOM_BIND_NONE;
        return NULL;
    }
    long v = strtol(value, &end, 10);
    int bad = end == value || *end || errno;
    if (!strcmp(name, "-n")) {
        if (bad || v < 1 || v > 1000000)
            return "-n needs a number of ranks >= 1";
        a->n = (int)v;
    } else if (!strcmp(name, "--max-restarts")) {
        if (bad || v < 0 || v > 1000000)
            return "--max-restarts needs a number of restarts >= 0";
        a->max_restarts = (int)v;
    } else if (!strcmp(name, "--nnodes")) {
        if (bad || v < 1 || v > 100000)
            return "--nnodes needs a number of nodes >= 1";
        a->nnodes = (int)v;
    } else {
        if (bad || v < 0 || v > 100000)
            return "--node-rank needs a node number >= 0";
        a->node_rank = (int)v;
    }
    return NULL;
}

/* A Slurm variable as a count >= 1 (the step's own, else the job's); 0
 * when neither is set or it is not one. */
static int slurm_count(const char *step_name, const char *job_name)
{
    const char *text = getenv(step_name);
    if (!text)
        text = getenv(job_name);
    char *end;
    long v = text ? strtol(text, &end, 10) : 0;
    return text && end != text && !*end && v >= 1 && v <= 1000000 ? (int)v : 0;
}

/* Under srun, one launcher per node: what --nnodes, --node-rank and
 * --master leave unsaid comes from the step, as torchrun's flags would
 * give it (the store on the step's first node, at the port the job's
 * identity gives). given: which of the three the command line set. NULL,
 * or what is wrong. */
static const char *fill_from_slurm(loom_launch_options *a, int nnodes_given, int node_rank_given,
                                   int master_given, char *why, size_t cap)
{
    if (!loom_slurm_step() || (nnodes_given && a->nnodes == 1))
        return NULL;
    int nodes = slurm_count("SLURM_STEP_NUM_NODES", "SLURM_NNODES");
    int tasks = slurm_count("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS");
    if (!nnodes_given) {
        if (!nodes || !tasks)
            return NULL; /* not enough of Slurm's picture: as outside it */
        if (tasks != nodes) {
            snprintf(why, cap,
                     "srun started %d copies of loom launch on %d node%s, but loom launch runs "
                     "once per node and starts that node's ranks itself: run srun -N %d "
                     "--ntasks-per-node=1 loom launch -n RANKS_PER_NODE ..., or srun -n RANKS "
                     "loom train ... without loom launch",
                     tasks, nodes, nodes == 1 ? "" : "s", nodes);
            return why;
        }
        a->nnodes = nodes;
    }
    if (a->nnodes == 1)
        return NULL;
    if (!node_rank_given) {
        const char *id = getenv("SLURM_NODEID");
        if (!id)
            return "srun gave no SLURM_NODEID: pass --node-rank";
        a->node_rank = atoi(id);
    }
    if (!master_given) {
        char host[sizeof a->master];
        if (!loom_slurm_first_host(getenv("SLURM_STEP_NODELIST"), host, sizeof host))
            return "the Slurm step's node list (SLURM_STEP_NODELIST) names no node: pass "
                   "--master HOST:PORT";
        snprintf(a->master, sizeof a->master, "%s", host);
        a->master_port = loom_store_job_port();
    }
    if (a->verbose)
        fprintf(stderr, "loom launch: from Slurm: --nnodes %d --node-rank %d --master %s:%d\n",
                a->nnodes, a->node_rank, a->master, a->master_port);
    return NULL;
}

/* argv into *a: -1 when the job is to run, else the launcher's exit status
 * (0 after --help; 2 after a usage error, said on stderr). */
static int parse_args(int argc, char **argv, loom_launch_options *a)
{
    static const char *const options[] = {"-n",          "--timeout", "--max-restarts",
                                          "--nnodes",    "--node-rank", "--master",
                                          "--flight",    "--bind",      NULL};
    *a = (loom_launch_options){.nnodes = 1, .bind = LOOM_BIND_FIT};
    int i = 1, nnodes_given = 0, node_rank_given = 0, master_given = 0;
    while (i < argc) {
        const char *arg = argv[i], *value = NULL, *name = NULL;
        if (!strcmp(arg, "--")) {
            i++;
            break;
        }
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            printf("%s\n", usage_text);
            return 0;
        }
        if (!strcmp(arg, "-v")) {
            a->verbose = 1;
            i++;
            continue;
        }
        /* -n4, -n 4, --opt=v, --opt v */
        for (int k = 0; options[k] && !name; k++) {
            size_t len = strlen(options[k]);
            if (strncmp(arg, options[k], len))
                continue;
            if (!arg[len] || (k == 0 && arg[len] != '=') || arg[len] == '=') {
                name = options[k];
                value = !arg[len] ? NULL : arg + len + (arg[len] == '=');
            }
        }
        if (!name) {
            if (arg[0] == '-')
                return usage_error("unknown option");
            break; /* the command */
        }
        if (!value && i + 1 >= argc) {
            char what[64];
            snprintf(what, sizeof what, "%s needs a value", name);
            return usage_error(what);
        }
        if (!value)
            value = argv[++i];
        i++;
        nnodes_given |= !strcmp(name, "--nnodes");
        node_rank_given |= !strcmp(name, "--node-rank");
        master_given |= !strcmp(name, "--master");
        const char *wrong = take_value(name, value, a);
        if (wrong)
            return usage_error(wrong);
    }
    if (a->n < 1)
        return usage_error("-n N is required");
    char why[320];
    const char *wrong =
        fill_from_slurm(a, nnodes_given, node_rank_given, master_given, why, sizeof why);
    if (wrong) {
        fprintf(stderr, "loom launch: %s\n", wrong);
        return 2;
    }
    if (a->nnodes > 1 && !a->master[0])
        return usage_error("--nnodes > 1 needs --master HOST:PORT, where rank 0's node listens");
    if (a->nnodes == 1 && (a->master[0] || a->node_rank))
        return usage_error("--master and --node-rank are for jobs of --nnodes > 1");
    if (a->node_rank >= a->nnodes)
        return usage_error("--node-rank must be below --nnodes");
    if (a->nnodes > 1 && a->max_restarts)
        return usage_error("--max-restarts restarts one machine's job; across nodes every "
                           "node's launcher would restart on its own (run one node, or restart "
                           "the whole job from outside)");
    if (i >= argc)
        return usage_error("no command to run");
    a->cmd = argv + i;
    return -1;
}

int loom_cmd_launch(int argc, char **argv)
{
    loom_launch_options opts;
    int rc = parse_args(argc, argv, &opts);
    if (rc >= 0)
        return rc;
    return loom_supervise(&opts);
}
