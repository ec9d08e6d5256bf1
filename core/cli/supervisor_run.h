/* Inside loom launch's supervisor: one run of the job's ranks on this
 * node (supervisor_run.c), their prefixed output (supervisor_output.c) and
 * the flight recorder's report on them (launch_report.c). supervisor.c
 * calls loom_run_ranks once per run, restarts included. */
#ifndef LOOM_CLI_SUPERVISOR_RUN_H
#define LOOM_CLI_SUPERVISOR_RUN_H

#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cli/launch_checks.h"
#include "cli/supervisor.h"

/* Which cpu each local rank gets, and the sentence the ranks' headers
 * show (LOOM_BIND): "bound rank 0 to cpu 0, rank 1 to cpu 1". */
typedef struct launch_binding {
    int on;
    int cpus[CPU_SETSIZE]; /* the allowed cpus, in order */
    int ncpus;
    int first;             /* rank r gets cpus[(first + r) % ncpus] */
    char text[512];
} launch_binding;

/* One of a rank's output pipes and the unfinished line read from it. */
typedef struct rank_stream {
    int fd;    /* -1 once closed */
    int rank;  /* the job's rank whose output this is: its lines' prefix */
    int to_fd; /* where its lines go: 1 or 2 */
    char *line;
    size_t len, cap;
} rank_stream;

typedef struct rank_proc {
    pid_t pid;
    int running;
    int status; /* from waitpid, once it is not running */
    rank_stream out, err;
} rank_proc;

typedef struct launcher {
    int n;                  /* ranks here: the job's first_rank .. first_rank + n - 1 */
    int first_rank, world;
    int local_first, local_size; /* rank r is local rank local_first + r of local_size */
    const char *master;     /* rank 0's host: 127.0.0.1 on one machine */
    int master_port;
    int restart;            /* 0, then 1.. for each restart (LOOM_RESTART of the ranks) */
    rank_proc *ranks;
    int exit_code;          /* -1 until the first failure, signal or timeout decides it */
    int decided_by;         /* the job's rank whose exit gave exit_code, -1 none */
    int signalled;          /* a SIGINT/SIGTERM was passed on */
    int timed_out;          /* the --timeout stopped the ranks */
    double timeout_s;       /* 0: none */
    uint64_t end_deadline;  /* the --timeout, 0 when none or spent */
    uint64_t kill_deadline; /* when the stopping ranks get SIGKILL, 0 when none */
    /* The first rank that exited LOOM_EXIT_ANOTHER_RANK, -1 none: blamed
     * only if no other rank fails by itself before blame_deadline. */
    int follower, follower_status;
    uint64_t blame_deadline;
    const char *job_tmpdir; /* the ranks' TMPDIR; "" when they keep the caller's */
    char flight_dir[4096];  /* the ranks' flight recorder tables; "" when none */
    int verbose;            /* -v: each rank's last operations with the diagnosis */
    const char *flight_out; /* --flight FILE: them into FILE */
    const launch_binding *bind; /* which cpu each rank gets */
} launcher;

/* One run of every rank of this node, the run's number being restart
 * (0 first): its exit code (0 when all succeeded) and the rank whose exit
 * it is (*rank, -1 when none); *stop set when nothing should be restarted
 * (the user's signal, the --timeout, or a failure of the launcher
 * itself). */
int loom_run_ranks(const loom_launch_options *opts, const launch_binding *bind,
                   const loom_launch_placement *place, const char *job_tmpdir, int restart,
                   uint64_t end_deadline, int *stop, int *rank);

/* Signal every rank still running, and everything each started. */
void loom_signal_running(launcher *L, int sig);

/* One line on who holds the job up, from every rank's flight recorder
 * table: when the launcher stops a job (only if some rank waits on another
 * or is stopped), and on SIGUSR1 (asked: always, with the details). */
void loom_launch_report(launcher *L, int asked);

/* The rank's output pipe fd, non-blocking, its lines prefixed "[rank] "
 * and passed on to to_fd. */
void loom_stream_init(rank_stream *st, int fd, int to_fd, int rank);

/* Read what the pipe has now and pass on its complete lines; 0 once it
 * is closed or would block. */
int loom_stream_read(rank_stream *st);

/* Pass on the last unterminated line too, and close the pipe. */
void loom_stream_close(rank_stream *st);

#endif
