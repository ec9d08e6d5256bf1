/* loom launch — what the launcher checks before it starts any rank
 * (launch_checks.c): the --flight file, the process and file limits, the
 * TMPDIRs of launchers that are gone, and, across nodes, that every node's
 * launcher runs the same job. Each check that refuses has said why on
 * stderr, in one line, and returns the launcher's exit status. */
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

/* The mkdtemp template of this launcher's TMPDIR under base:
 * base/loom-launch-NS-PID-START-XXXXXX, where NS, PID and START (its pid
 * namespace, pid and start time) tell a later launcher whether this one
 * still runs. */
void loom_launch_tmpdir_template(char *buf, size_t cap, const char *base);

/* Remove the loom-launch-* folders under base that belong to this user and
 * to a launcher of this pid namespace that no longer runs (killed with
 * SIGKILL, or before a reboot). */
void loom_launch_remove_stale_tmpdirs(const char *base);

/* Across nodes, before any rank starts: node 0's launcher listens at
 * host:port (where rank 0's store listens later) until every other node's
 * launcher has told it its -n, --nnodes and command, and tells each whether
 * they all agree. 0 when they do; LOOM_EXIT_CONFIG when they do not (every
 * node says so); 1 when a node did not come within timeout_s. */
int loom_launch_nodes_agree(const char *host, int port, int nnodes, int node_rank, int n,
                            char *const *cmd, double timeout_s);

#endif
