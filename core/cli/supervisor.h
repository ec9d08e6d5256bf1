/* loom launch's supervisor: everything after the command line. It checks
 * what can be refused before any rank starts, makes the nodes agree, runs
 * the ranks in the job's own TMPDIR (restarting them as --max-restarts
 * allows) and says who held the job up when it is stopped. cmd_launch.c
 * parses the command line into these options; nothing else passes between
 * them. */
#ifndef LOOM_CLI_SUPERVISOR_H
#define LOOM_CLI_SUPERVISOR_H

/* --bind: unset pins one core per rank when the ranks fit on the cores
 * the launcher may use, and leaves them free when they do not; core pins
 * them whatever (rank i on core i mod cores); none never pins. */
typedef enum loom_bind_mode { LOOM_BIND_FIT, LOOM_BIND_CORE, LOOM_BIND_NONE } loom_bind_mode;

/* The job as the command line asks for it. Across machines (nnodes > 1)
 * this launcher starts one node's ranks, n per node, as torchrun's
 * --nnodes/--node-rank/--master do: node k holds ranks k*n .. k*n + n - 1,
 * and rank 0's store listens at master. */
typedef struct loom_launch_options {
    int n;                  /* ranks on this node */
    double timeout_s;       /* 0: none */
    int max_restarts;
    int nnodes, node_rank;  /* 1 and 0 on one machine */
    char master[256];       /* host of rank 0's store; "" on one machine */
    int master_port;
    int verbose;            /* -v */
    const char *flight_out; /* --flight FILE */
    loom_bind_mode bind;    /* --bind */
    char **cmd;             /* the command and its arguments, NULL-terminated */
} loom_launch_options;

/* Run the job to its end; the launcher's exit status: 0 when every rank
 * succeeded, else the status of the rank that decided it (128 + signal
 * for a killed one), 124 after the --timeout, 128 + signal when the
 * launcher was signalled, LOOM_EXIT_CONFIG for what is refused before any
 * rank starts, 1 for a failure of the launcher itself. */
int loom_supervise(const loom_launch_options *opts);

#endif
