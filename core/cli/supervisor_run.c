/* One run of loom launch's ranks on this node (supervisor_run.h).
 *
 * The launcher is one poll loop over the ranks' output pipes and a
 * self-pipe that the signal handlers write to. Each rank runs in its own
 * process group, so stopping a rank stops what it started too (a shell and
 * its children), and a Ctrl-C reaches the ranks once, through us.
 *
 * The first rank to fail decides the launcher's exit status and the others
 * are stopped: SIGTERM, then SIGKILL after a grace period. A rank that
 * exited LOOM_EXIT_ANOTHER_RANK is blamed only if no other rank fails by
 * itself within that grace period. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/supervisor_run.h"
#include "runtime/bootstrap.h"
#include "runtime/flight.h"
#include "runtime/log.h"

#define GRACE_S 5.0 /* between SIGTERM and SIGKILL */

static int signal_pipe[2] = {-1, -1};

static void on_signal(int sig)
{
    int saved = errno;
    unsigned char byte = (unsigned char)sig;
    if (write(signal_pipe[1], &byte, 1) < 0) {
        /* full: enough wake-ups are queued already */
    }
    errno = saved;
}

/* Signal a rank and everything it started. */
static void rank_signal(const rank_proc *p, int sig)
{
    if (kill(-p->pid, sig) < 0)
        kill(p->pid, sig);
}

/* The ranks still running, as loom_format_ranks names them ("ranks 0, 2"),
 * into buf (left as it is when none); returns how many there are. */
static int format_running(const launcher *L, char *buf, size_t cap)
{
    int *list = malloc(sizeof(int) * (size_t)L->n);
    int n = 0;
    for (int r = 0; list && r < L->n; r++)
        if (L->ranks[r].running)
            list[n++] = L->first_rank + r;
    if (n > 0)
        loom_format_ranks(buf, cap, list, n);
    free(list);
    return n;
}

static int any_running(const launcher *L)
{
    for (int r = 0; r < L->n; r++)
        if (L->ranks[r].running)
            return 1;
    return 0;
}

void loom_signal_running(launcher *L, int sig)
{
    for (int r = 0; r < L->n; r++)
        if (L->ranks[r].running)
            rank_signal(&L->ranks[r], sig);
}

/* SIGKILL, after the grace period, for whoever is left. */
static void arm_kill_deadline(launcher *L)
{
    if (!L->kill_deadline)
        L->kill_deadline = loom_now_ns() + (uint64_t)(GRACE_S * 1e9);
}

/* SIGTERM now, SIGKILL after the grace period for whoever is left. */
static void stop_running(launcher *L)
{
    loom_signal_running(L, SIGTERM);
    loom_signal_running(L, SIGCONT);
    arm_kill_deadline(L);
}

static void blame(launcher *L, int r, int status);

static void rank_exited(launcher *L, int r, int status)
{
    rank_proc *p = &L->ranks[r];
    p->running = 0;
    p->status = status;
    /* Everything the rank wrote is in its pipes now: show it before any
     * verdict about the rank. Bounded, because something the rank left
     * running may still be writing. */
    for (int k = 0; k < 64 && p->out.fd >= 0 && loom_stream_read(&p->out); k++) {
    }
    for (int k = 0; k < 64 && p->err.fd >= 0 && loom_stream_read(&p->err); k++) {
    }
    loom_stream_close(&p->out);
    loom_stream_close(&p->err);

    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (ok || L->exit_code >= 0)
        return; /* a rank we stopped, or one after the first failure */
    if (WIFEXITED(status) && WEXITSTATUS(status) == LOOM_EXIT_ANOTHER_RANK && any_running(L)) {
        /* It failed because another rank did: that one's exit names the
         * cause; give it the grace period to come. */
        if (L->follower < 0) {
            L->follower = r;
            L->follower_status = status;
            L->blame_deadline = loom_now_ns() + (uint64_t)(GRACE_S * 1e9);
        }
        return;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == LOOM_EXIT_ANOTHER_RANK && L->follower >= 0)
        blame(L, L->follower, L->follower_status); /* only followers: the first */
    else
        blame(L, r, status);
}

/* The verdict: rank r's exit decides the launcher's status, and the other
 * ranks are stopped. */
static void blame(launcher *L, int r, int status)
{
    L->blame_deadline = 0;
    char how[128];
    L->decided_by = L->first_rank + r;
    if (WIFEXITED(status)) {
        L->exit_code = WEXITSTATUS(status);
        snprintf(how, sizeof how, "exited with status %d", WEXITSTATUS(status));
    } else {
        int sig = WTERMSIG(status);
        L->exit_code = 128 + sig;
        snprintf(how, sizeof how, "killed by signal %d (%s)", sig, strsignal(sig));
    }
    char ranks[512];
    if (format_running(L, ranks, sizeof ranks) > 0) {
        fprintf(stderr, "loom launch: rank %d %s; stopping %s\n", L->first_rank + r, how, ranks);
        loom_launch_report(L, 0);
        stop_running(L);
    } else {
        fprintf(stderr, "loom launch: rank %d %s\n", L->first_rank + r, how);
    }
}

static void reap(launcher *L)
{
    for (int r = 0; r < L->n; r++) {
        int status;
        if (!L->ranks[r].running)
            continue;
        pid_t pid = waitpid(L->ranks[r].pid, &status, WNOHANG);
        if (pid == L->ranks[r].pid)
            rank_exited(L, r, status);
    }
}

static void on_launcher_signal(launcher *L, int sig)
{
    if (sig == SIGUSR1) {
        loom_launch_report(L, 1);
        return;
    }
    if (sig != SIGINT && sig != SIGTERM)
        return; /* SIGCHLD only wakes the loop up */
    if (L->signalled) {
        /* Asked twice: the user is done waiting. */
        loom_signal_running(L, SIGKILL);
        return;
    }
    L->signalled = 1;
    char ranks[512];
    if (format_running(L, ranks, sizeof ranks) > 0)
        fprintf(stderr, "loom launch: got %s; passing it on to %s\n",
                sig == SIGINT ? "SIGINT" : "SIGTERM", ranks);
    if (L->exit_code < 0)
        L->exit_code = 128 + sig;
    loom_launch_report(L, 0);
    loom_signal_running(L, sig);
    loom_signal_running(L, SIGCONT);
    arm_kill_deadline(L);
}

static void check_deadlines(launcher *L)
{
    uint64_t now = loom_now_ns();
    if (L->follower >= 0 && L->exit_code < 0 && (!any_running(L) || now >= L->blame_deadline))
        blame(L, L->follower, L->follower_status);
    if (L->end_deadline && now >= L->end_deadline) {
        L->end_deadline = 0;
        char ranks[512] = "ranks";
        int n = format_running(L, ranks, sizeof ranks);
        fprintf(stderr, "loom launch: timed out after %g s with %s still running; stopping %s\n",
                L->timeout_s, ranks, n == 1 ? "it" : "them");
        if (L->exit_code < 0)
            L->exit_code = 124;
        L->timed_out = 1;
        loom_launch_report(L, 0);
        stop_running(L);
    }
    if (L->kill_deadline && now >= L->kill_deadline) {
        loom_signal_running(L, SIGKILL);
        L->kill_deadline = 0;
    }
}

static int pick_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0 &&
        getsockname(fd, (struct sockaddr *)&addr, &len) == 0)
        port = ntohs(addr.sin_port);
    close(fd);
    return port;
}

static void set_env_int(const char *name, int value)
{
    char text[16];
    snprintf(text, sizeof text, "%d", value);
    setenv(name, text, 1);
}

/* What an outer launcher (srun, mpirun, torchrun) told the process that
 * started loom launch about its own tasks: a rank of ours sees none of it,
 * only loom launch's variables. Left there, loom's bootstrap finds two
 * launchers, and Open MPI's MPI_Init in a rank (comm-mpi joins loom
 * launch's ranks as singletons through ompi-server) takes srun's step or a
 * PMIx server's rank for a launch of its own and aborts ("OMPI was not
 * built with SLURM support", or a world of 1). What describes the job or
 * the machine stays (SLURM_JOB_ID, the allocation's nodes and cpus), and
 * so do the user's settings (OMPI_MCA_mpi_*, PMIX_MCA_*). A '*' at the end
 * matches any rest of the name. */
static const char *const outer_launcher_vars[] = {
    /* srun's task: its rank, its place on its node, the cpus srun bound */
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_TASK_PID", "SLURM_GTIDS",
    "SLURM_CPU_BIND*",
    /* srun's step, whose tasks these are not: Open MPI takes SLURM_STEP_ID
     * for a launch by srun; the step's PMIx and srun's own addresses */
    "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEPID", "SLURM_STEP_*", "SLURM_DISTRIBUTION",
    "SLURM_SRUN_COMM_*", "SLURM_LAUNCH_NODE_IPADDR", "SLURM_PMIX*",
    /* a PMIx or PMI server and this process's rank in it (srun --mpi=pmix or
     * pmi2, mpirun, MPICH's Hydra): MPI_Init would join that server's job */
    "PMIX_*", "PMI_*", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
    /* mpirun's ranks: their place, and the daemon, session folders and
     * components of mpirun's job (OMPI_MCA_ess=^singleton forbids ours) */
    "OMPI_COMM_WORLD_*", "OMPI_APP_CTX_NUM_PROCS", "OMPI_ARGV", "OMPI_COMMAND",
    "OMPI_FILE_LOCATION", "OMPI_FIRST_RANKS", "OMPI_NUM_APP_CTX", "OMPI_UNIVERSE_SIZE",
    "OMPI_MCA_ess", "OMPI_MCA_ess_base_*", "OMPI_MCA_orte_*", "OMPI_MCA_pmix",
    "OMPI_MCA_initial_wdir", "OMPI_MCA_shmem_RUNTIME_QUERY_hint",
    /* torchrun's workers, and its agent's store */
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_*",
};

/* The user's PMIx settings, not a server's: they stay. */
#define KEPT_PREFIX "PMIX_MCA_"

/* Whether environ's entry "NAME=value" is one of outer_launcher_vars. */
static int from_outer_launcher(const char *entry)
{
    size_t name_len = strcspn(entry, "=");
    if (!strncmp(entry, KEPT_PREFIX, strlen(KEPT_PREFIX)))
        return 0;
    for (size_t i = 0; i < sizeof outer_launcher_vars / sizeof *outer_launcher_vars; i++) {
        const char *pattern = outer_launcher_vars[i];
        size_t len = strlen(pattern);
        if (pattern[len - 1] == '*' ? name_len >= len - 1 && !strncmp(entry, pattern, len - 1)
                                    : name_len == len && !strncmp(entry, pattern, len))
            return 1;
    }
    return 0;
}

static void drop_outer_launcher_vars(void)
{
    int dropped;
    do { /* unsetenv reorders environ: look again from the start */
        dropped = 0;
        for (char **e = environ; *e && !dropped; e++) {
            char name[256];
            size_t len = strcspn(*e, "=");
            if (len >= sizeof name || !from_outer_launcher(*e))
                continue;
            memcpy(name, *e, len);
            name[len] = '\0';
            dropped = unsetenv(name) == 0;
        }
    } while (dropped);
}

/* In the child, between fork and exec. Only this process runs here (the
 * launcher has no threads), so setenv and friends are safe. */
static void child_exec(const launcher *L, int r, char **cmd, int out_fd, int err_fd,
                       int status_fd, pid_t launcher_pid)
{
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGUSR1, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* A process group of its own, in the launcher's session, as mpirun's
     * ranks share theirs. Not a session each: with the kernel's autogroup
     * that is a scheduling group each, where a rank's sched_yield passes
     * the core to nobody (it yields only within its group), and ranks that
     * outnumber the cores ran small collectives 2-10x slower than under
     * mpirun. */
    setpgid(0, 0);
    /* If the launcher dies without stopping us (SIGKILL), go too. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != launcher_pid)
        _exit(1);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    /* Rank 0 reads the launcher's input, as under mpirun; but a terminal
     * cannot be read from our own process group. */
    if (r != 0 || isatty(0)) {
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0)
            dup2(null, 0);
    }
    drop_outer_launcher_vars();
    set_env_int("LOOM_RANK", L->first_rank + r);
    set_env_int("LOOM_WORLD_SIZE", L->world);
    set_env_int("LOOM_LOCAL_RANK", L->local_first + r);
    set_env_int("LOOM_LOCAL_SIZE", L->local_size);
    set_env_int("LOOM_RESTART", L->restart);
    setenv("LOOM_BIND", L->bind->text, 1);
    if (L->bind->on) {
        int cpu = L->bind->cpus[(L->bind->first + r) % L->bind->ncpus];
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        if (sched_setaffinity(0, sizeof one, &one) != 0)
            fprintf(stderr, "loom launch: cannot bind rank %d to cpu %d: %s; it runs unbound\n",
                    L->first_rank + r, cpu, strerror(errno));
    }
    if (L->job_tmpdir[0])
        setenv("TMPDIR", L->job_tmpdir, 1);
    setenv("MASTER_ADDR", L->master, 1);
    set_env_int("MASTER_PORT", L->master_port);
    setenv("LOOM_OUTPUT_PREFIXED", "1", 1); /* the core's log lines then skip their own */
    if (L->flight_dir[0])
        setenv(LOOM_FLIGHT_DIR_ENV, L->flight_dir, 1);
    else
        unsetenv(LOOM_FLIGHT_DIR_ENV); /* not an outer launcher's */
    execvp(cmd[0], cmd);
    int err = errno;
    if (write(status_fd, &err, sizeof err) < 0) {
        /* the launcher will see status 127 */
    }
    _exit(127);
}

/* Start rank r. 0, or the errno of a failed exec (a positive number), or
 * -1 for a failure of ours (already reported). */
static int spawn_rank(launcher *L, int r, char **cmd)
{
    int pipes[6] = {-1, -1, -1, -1, -1, -1};
    for (int k = 0; k < 3; k++) {
        if (pipe2(pipes + 2 * k, O_CLOEXEC) < 0) {
            fprintf(stderr, "loom launch: cannot make pipes for rank %d: %s\n", r, strerror(errno));
            for (int j = 0; j < 2 * k; j++)
                close(pipes[j]);
            return -1;
        }
    }
    int out[2] = {pipes[0], pipes[1]}, err[2] = {pipes[2], pipes[3]},
        status[2] = {pipes[4], pipes[5]};
    pid_t launcher_pid = getpid();
    pid_t pid = fork();
    if (pid == 0)
        child_exec(L, r, cmd, out[1], err[1], status[1], launcher_pid);
    int fork_errno = errno;
    close(out[1]);
    close(err[1]);
    close(status[1]);
    if (pid < 0) {
        close(out[0]);
        close(err[0]);
        close(status[0]);
        fprintf(stderr, "loom launch: cannot start rank %d: fork: %s\n", r, strerror(fork_errno));
        return -1;
    }
    rank_proc *p = &L->ranks[r];
    p->pid = pid;
    p->running = 1;
    loom_stream_init(&p->out, out[0], 1, L->first_rank + r);
    loom_stream_init(&p->err, err[0], 2, L->first_rank + r);
    /* The status pipe closes at exec (success) or carries exec's errno. */
    int exec_errno = 0;
    ssize_t got;
    while ((got = read(status[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
    }
    close(status[0]);
    return got == (ssize_t)sizeof exec_errno ? exec_errno : 0;
}

/* Ranks, their streams closed, and the signal pipe; 0, or -1 reported. */
static int launcher_init(launcher *L, int n, double timeout_s)
{
    *L = (launcher){.n = n, .exit_code = -1, .timeout_s = timeout_s, .follower = -1,
                    .decided_by = -1};
    L->ranks = calloc((size_t)n, sizeof *L->ranks);
    if (!L->ranks || pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
        fprintf(stderr, "loom launch: cannot set up: %s\n", strerror(errno));
        free(L->ranks);
        return -1;
    }
    for (int r = 0; r < n; r++)
        L->ranks[r].out.fd = L->ranks[r].err.fd = -1;
    return 0;
}

/* Whatever the ranks left unterminated goes out before the launcher ends. */
static void launcher_free(launcher *L)
{
    for (int r = 0; r < L->n; r++) {
        loom_stream_close(&L->ranks[r].out);
        loom_stream_close(&L->ranks[r].err);
        free(L->ranks[r].out.line);
        free(L->ranks[r].err.line);
    }
    free(L->ranks);
}

/* The launcher's handlers replace these while it runs. */
typedef struct saved_signals {
    struct sigaction on_int, on_term, on_chld, on_pipe, on_usr1;
} saved_signals;

static void take_signals(saved_signals *saved)
{
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART | SA_NOCLDSTOP},
                     ign = {.sa_handler = SIG_IGN};
    sigemptyset(&sa.sa_mask);
    sigemptyset(&ign.sa_mask);
    sigaction(SIGINT, &sa, &saved->on_int);
    sigaction(SIGTERM, &sa, &saved->on_term);
    sigaction(SIGCHLD, &sa, &saved->on_chld);
    sigaction(SIGUSR1, &sa, &saved->on_usr1);
    sigaction(SIGPIPE, &ign, &saved->on_pipe);
}

static void give_back_signals(const saved_signals *saved)
{
    sigaction(SIGINT, &saved->on_int, NULL);
    sigaction(SIGTERM, &saved->on_term, NULL);
    sigaction(SIGCHLD, &saved->on_chld, NULL);
    sigaction(SIGUSR1, &saved->on_usr1, NULL);
    sigaction(SIGPIPE, &saved->on_pipe, NULL);
    close(signal_pipe[0]);
    close(signal_pipe[1]);
    signal_pipe[0] = signal_pipe[1] = -1;
}

/* Start every rank; after a failure, stop the ranks already started. */
static void spawn_ranks(launcher *L, char **cmd)
{
    /* Held back while forking, so a child never runs our handler. */
    sigset_t held, old_mask;
    sigemptyset(&held);
    sigaddset(&held, SIGINT);
    sigaddset(&held, SIGTERM);
    sigaddset(&held, SIGCHLD);
    sigaddset(&held, SIGUSR1);
    for (int r = 0; r < L->n; r++) {
        sigprocmask(SIG_BLOCK, &held, &old_mask);
        int spawned = spawn_rank(L, r, cmd);
        sigprocmask(SIG_SETMASK, &old_mask, NULL);
        if (spawned != 0) {
            if (spawned > 0)
                fprintf(stderr, "loom launch: cannot run '%s': %s\n", cmd[0], strerror(spawned));
            L->exit_code = spawned == EACCES ? 126 : spawned > 0 ? 127 : 1;
            L->decided_by = L->first_rank + r;
            stop_running(L);
            break;
        }
    }
}

/* What one poll watches: the signal pipe first, then every open stream. */
typedef struct watch_list {
    struct pollfd *fds;     /* 1 + 2n */
    rank_stream **streams;  /* streams[k] is fds[k + 1] */
    int count;              /* entries of fds in use */
} watch_list;

static void watch_open_streams(launcher *L, watch_list *w)
{
    w->count = 1;
    w->fds[0] = (struct pollfd){.fd = signal_pipe[0], .events = POLLIN};
    for (int r = 0; r < L->n; r++) {
        rank_stream *two[2] = {&L->ranks[r].out, &L->ranks[r].err};
        for (int k = 0; k < 2; k++) {
            if (two[k]->fd < 0)
                continue;
            w->streams[w->count - 1] = two[k];
            w->fds[w->count++] = (struct pollfd){.fd = two[k]->fd, .events = POLLIN};
        }
    }
}

/* Until the next deadline, at most a second; signals and output wake the
 * poll sooner. */
static int poll_timeout_ms(const launcher *L)
{
    uint64_t next = loom_now_ns() + 1000000000ull;
    if (L->blame_deadline && L->blame_deadline < next)
        next = L->blame_deadline;
    if (L->end_deadline && L->end_deadline < next)
        next = L->end_deadline;
    if (L->kill_deadline && L->kill_deadline < next)
        next = L->kill_deadline;
    uint64_t now = loom_now_ns();
    return next > now ? (int)((next - now + 999999) / 1000000) : 0;
}

/* Pass on output and signals, and keep the deadlines, until no rank runs. */
static void supervise(launcher *L)
{
    size_t n = (size_t)L->n;
    watch_list w = {malloc(sizeof *w.fds * (1 + 2 * n)), malloc(sizeof *w.streams * 2 * n),
                    0};
    for (;;) {
        reap(L);
        check_deadlines(L);
        if (!any_running(L))
            break;
        if (!w.fds || !w.streams) {
            /* No memory to watch the pipes: still wait for the ranks. */
            usleep(100000);
            continue;
        }
        watch_open_streams(L, &w);
        if (poll(w.fds, (nfds_t)w.count, poll_timeout_ms(L)) <= 0)
            continue;
        if (w.fds[0].revents) {
            unsigned char sigs[64];
            ssize_t got = read(signal_pipe[0], sigs, sizeof sigs);
            for (ssize_t k = 0; k < got; k++)
                on_launcher_signal(L, sigs[k]);
        }
        for (int k = 1; k < w.count; k++)
            if (w.fds[k].revents && w.streams[k - 1]->fd >= 0)
                loom_stream_read(w.streams[k - 1]);
    }
    free(w.fds);
    free(w.streams);
}

/* A folder in the job's for this run's tables; without one the job runs
 * unrecorded. */
static void make_flight_dir(launcher *L)
{
    L->flight_dir[0] = '\0';
    if (!L->job_tmpdir[0])
        return;
    snprintf(L->flight_dir, sizeof L->flight_dir, "%.4000s/flight-%d", L->job_tmpdir,
             L->restart);
    if (mkdir(L->flight_dir, 0700) != 0) {
        fprintf(stderr, "loom launch: warning: no flight recorder: cannot make %s: %s\n",
                L->flight_dir, strerror(errno));
        L->flight_dir[0] = '\0';
    }
}

int loom_run_ranks(const loom_launch_options *a, const launch_binding *bind,
                   const loom_launch_placement *place, const char *job_tmpdir, int restart,
                   uint64_t end_deadline, int *stop, int *rank)
{
    *rank = -1;
    launcher L;
    if (launcher_init(&L, a->n, a->timeout_s) != 0) {
        *stop = 1;
        return 1;
    }
    L.first_rank = a->node_rank * a->n;
    L.world = a->nnodes * a->n;
    L.local_first = place->local_first;
    L.local_size = place->local_ranks;
    L.master = a->nnodes > 1 ? a->master : "127.0.0.1";
    L.master_port = a->nnodes > 1 ? a->master_port : pick_free_port();
    if (L.master_port < 0) {
        fprintf(stderr, "loom launch: cannot find a free port on 127.0.0.1 for the store: %s\n",
                strerror(errno));
        launcher_free(&L);
        *stop = 1;
        return 1;
    }
    L.restart = restart;
    L.end_deadline = end_deadline;
    L.verbose = a->verbose;
    L.flight_out = a->flight_out;
    L.bind = bind;
    L.job_tmpdir = job_tmpdir;
    make_flight_dir(&L);
    saved_signals saved;
    take_signals(&saved);
    spawn_ranks(&L, a->cmd);
    supervise(&L);
    launcher_free(&L);
    give_back_signals(&saved);
    *stop = L.signalled || L.timed_out;
    *rank = L.decided_by;
    return L.exit_code < 0 ? 0 : L.exit_code;
}
