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

/* Across nodes, before any rank starts: node 0's launcher listens at
 * host:port (where rank 0's store listens later) until every other node's
 * launcher has told it its -n, --nnodes and command, and tells each whether
 * they all agree. 0 when they do; LOOM_EXIT_CONFIG when they do not (every
 * node says so); 1 when a node did not come within timeout_s. */
int loom_launch_nodes_agree(const char *host, int port, int nnodes, int node_rank, int n,
                            char *const *cmd, double timeout_s);

#endif
