/* loom launch — what the supervisor checks before it starts any rank
 * (launch_checks.c): the --flight file, the process and file limits, and,
 * across nodes, that every node's launcher runs the same job. Each check
 * that refuses has said why on stderr, in one line, and returns the
 * launcher's exit status. */
#ifndef LOOM_CLI_LAUNCH_CHECKS_H
#define LOOM_CLI_LAUNCH_CHECKS_H

#include <stddef.h>

/* --flight FILE can be written: its folder exists and lets us create it
 * (nothing is left behind). 0, or LOOM_EXIT_CONFIG. */
int loom_launch_check_flight(const char *path);

/* n ranks fit in the launcher's open files (RLIMIT_NOFILE: two pipes per
 * rank) and in the processes this user may run (RLIMIT_NPROC, less those
 * running already). 0, or LOOM_EXIT_CONFIG. */
int loom_launch_check_limits(int n);

/* Field `field` (1-based, as proc(5) numbers them, 4 or later: the
 * numeric fields after the name) of /proc/PID/stat into *out; 0, or -1
 * when there is no such process. *state, when asked, gets field 3 (R, S,
 * T, Z...). */
int loom_launch_proc_stat(long pid, int field, unsigned long long *out, char *state);

/* Where this launcher's ranks sit among the ranks of every launcher on
 * its machine (several nodes' launchers may share one: a test, or a shared
 * node where Slurm leaves the cpus unrestricted). The launchers of a
 * machine take their places in --node-rank order. */
typedef struct loom_launch_placement {
    /* Among the ranks pinned to the cpus this launcher may use: its own and
     * those of the launchers on the same kernel whose affinity masks
     * overlap its own. Rank r of this launcher gets allowed cpu
     * (cpu_first + r) mod the allowed count, and the ranks fit when
     * cpu_ranks do. */
    int cpu_first, cpu_ranks;
    /* Among the ranks that loopback and shared memory reach (LOOM_LOCAL_RANK
     * and LOOM_LOCAL_SIZE of the ranks). */
    int local_first, local_ranks;
} loom_launch_placement;

/* Across nodes, before any rank starts: node 0's launcher listens at
 * host:port (where rank 0's store listens later) until every other node's
 * launcher has told it its -n, --nnodes, command and machine, and tells
 * each whether they all agree and, when they do, its placement. 0 when
 * they do; LOOM_EXIT_CONFIG when they do not (every node says so); 1 when
 * a node did not come within timeout_s. */
int loom_launch_nodes_agree(const char *host, int port, int nnodes, int node_rank, int n,
                            char *const *cmd, double timeout_s, loom_launch_placement *placement);

#endif
