/* `loom launch -n N [--timeout S] [--] CMD [ARGS...]`: N ranks of CMD on this
 * machine, for development and tests; across machines jobs run under
 * mpirun or srun (docs/architecture.md).
 *
 * Ranks are pinned to cores by default, one core each when they fit, as
 * mpirun's --bind-to core: a rank that migrates between cores pays for it
 * in every small message (2.4-3.3 us per small allreduce unpinned against
 * 0.8-1.0 us pinned over comm-ucx here).
 *
 * The launcher is one poll loop over the ranks' output pipes and a
 * self-pipe that the signal handlers write to. Each rank runs in its own
 * process group, so stopping a rank stops what it started too (a shell and
 * its children), and a Ctrl-C reaches the ranks once, through us.
 *
 * What can be refused is refused before any rank starts (launch_checks.c),
 * and a failure that a restart would repeat (its exit status says so) is
 * not restarted. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/launch_checks.h"
#include "runtime/bootstrap.h"
#include "runtime/flight.h"
#include "runtime/log.h"

#define GRACE_S 5.0       /* between SIGTERM and SIGKILL */
#define MAX_PARTIAL 65536 /* a longer line is cut rather than held */

static const char usage_text[] =
    "usage: loom launch -n N [--timeout S] [--max-restarts R] [--bind core|none] "
    "[--nnodes M --node-rank K --master HOST:PORT] [-v] [--flight FILE] [--] CMD [ARGS...]";

/* --bind: unset pins one core per rank when the ranks fit on the cores
 * the launcher may use, and leaves them free when they do not; core pins
 * them whatever (rank i on core i mod cores); none never pins. */
typedef enum bind_mode { BIND_FIT, BIND_CORE, BIND_NONE } bind_mode;

/* Which cpu each local rank gets, and the sentence the ranks' headers
 * show (LOOM_BIND): "bound rank 0 to cpu 0, rank 1 to cpu 1". */
typedef struct binding {
    int on;
    int cpus[CPU_SETSIZE]; /* the allowed cpus, in order */
    int ncpus;
    char text[512];
} binding;

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
    char flight_dir[4096];  /* the ranks' flight recorder tables; "" when none */
    int verbose;            /* -v: each rank's last operations with the diagnosis */
    const char *flight_out; /* --flight FILE: them into FILE */
    const binding *bind;    /* which cpu each rank gets */
} launcher;

static int signal_pipe[2] = {-1, -1};

/* The ranks' TMPDIR: a directory of the job's own under the caller's
 * TMPDIR, removed when the launch ends, so nothing a rank leaves there
 * (Open MPI's session directories, a rank killed mid-write) outlives the
 * job. "" when it could not be made (the ranks keep the caller's). */
static char job_tmpdir[4096];

static void on_signal(int sig)
{
    int saved = errno;
    unsigned char byte = (unsigned char)sig;
    if (write(signal_pipe[1], &byte, 1) < 0) {
        /* full: enough wake-ups are queued already */
    }
    errno = saved;
}

static void write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return; /* our own output is gone (EPIPE): nothing to tell anyone */
        buf += n;
        len -= (size_t)n;
    }
}

/* Append data to the stream's line and pass on every complete line with
 * the rank's prefix, in one write so no other rank's line lands inside it.
 * final: the stream ended, so a last unterminated line goes too. */
static void stream_emit(rank_stream *st, const char *data, size_t n, int final)
{
    /* A rank that printed nothing has no line buffer yet, and memcpy or
     * memmove with a NULL pointer is undefined even for 0 bytes. */
    if (st->len + n == 0)
        return;
    if (st->len + n > st->cap) {
        size_t cap = st->cap ? st->cap : 4096;
        while (cap < st->len + n)
            cap *= 2;
        char *line = realloc(st->line, cap);
        if (!line)
            return;
        st->line = line;
        st->cap = cap;
    }
    memcpy(st->line + st->len, data, n);
    st->len += n;

    char prefix[24];
    size_t plen = (size_t)snprintf(prefix, sizeof prefix, "[%d] ", st->rank);
    size_t lines = 1;
    for (size_t i = 0; i < st->len; i++)
        lines += st->line[i] == '\n';
    char *out = malloc(st->len + lines * plen + 1);
    if (!out)
        return;
    size_t used = 0, start = 0;
    for (size_t i = 0; i < st->len; i++) {
        if (st->line[i] != '\n')
            continue;
        memcpy(out + used, prefix, plen);
        memcpy(out + used + plen, st->line + start, i + 1 - start);
        used += plen + i + 1 - start;
        start = i + 1;
    }
    if (start < st->len && (final || st->len - start >= MAX_PARTIAL)) {
        memcpy(out + used, prefix, plen);
        memcpy(out + used + plen, st->line + start, st->len - start);
        used += plen + st->len - start;
        out[used++] = '\n';
        start = st->len;
    }
    write_all(st->to_fd, out, used);
    free(out);
    memmove(st->line, st->line + start, st->len - start);
    st->len -= start;
}

static void stream_close(rank_stream *st)
{
    if (st->fd < 0)
        return;
    stream_emit(st, "", 0, 1);
    close(st->fd);
    st->fd = -1;
}

/* Read what the pipe has now; 0 once it is closed or would block. */
static int stream_read(rank_stream *st)
{
    char buf[65536];
    ssize_t n = read(st->fd, buf, sizeof buf);
    if (n > 0) {
        stream_emit(st, buf, (size_t)n, 0);
        return 1;
    }
    if (n < 0 && errno == EINTR)
        return 1;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    stream_close(st);
    return 0;
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

static void signal_running(launcher *L, int sig)
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
    signal_running(L, SIGTERM);
    signal_running(L, SIGCONT);
    arm_kill_deadline(L);
}

static void blame(launcher *L, int r, int status);

/* ------------------------------------------------- the flight recorder
 *
 * Each rank keeps its last operations per group in a table in flight_dir
 * (runtime/flight.h), which stays readable whatever became of the rank. */

/* /proc says the process is stopped: state T (a signal) or t (a tracer).
 * The name before the state may hold spaces and parentheses. */
static int process_stopped(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')');
    return paren && paren[1] == ' ' && (paren[2] == 'T' || paren[2] == 't');
}

/* How rank r is: its end once reaped, else stopped or running. The rank
 * may be a wrapper (a shell) around the process whose table v is. */
static loom_flight_rank rank_state(const launcher *L, int r, const loom_flight_view *v)
{
    const rank_proc *p = &L->ranks[r];
    loom_flight_rank how = {.view = v, .state = LOOM_RANK_RUNNING};
    if (!p->running) {
        int killed = WIFSIGNALED(p->status);
        how.state = killed ? LOOM_RANK_KILLED : LOOM_RANK_EXITED;
        how.code = killed ? WTERMSIG(p->status) : WEXITSTATUS(p->status);
    } else if (process_stopped(p->pid) || (v && process_stopped((pid_t)v->pid))) {
        how.state = LOOM_RANK_STOPPED;
    }
    return how;
}

/* Each rank's last operations, as `loom launch -v` shows them. */
static void write_details(FILE *f, const loom_flight_rank *ranks, int n)
{
    enum { CAP = 1 << 16 };
    char *buf = malloc(CAP);
    uint64_t now = loom_now_ns();
    for (int r = 0; buf && r < n; r++) {
        loom_flight_format(ranks[r].view, r, &ranks[r], now, 8, buf, CAP);
        fputs(buf, f);
    }
    free(buf);
}

/* One line on who holds the job up, from every rank's table: when the
 * launcher stops a job (only if some rank waits on another or is
 * stopped), and on SIGUSR1 (asked: always, with the details). */
static void report(launcher *L, int asked)
{
    if (!L->flight_dir[0]) {
        if (asked)
            fprintf(stderr, "loom launch: SIGUSR1, but this job has no flight recorder\n");
        return;
    }
    if (L->world != L->n) {
        /* one node of several sees a part of the job: each rank says its own */
        if (asked)
            signal_running(L, SIGUSR1);
        return;
    }
    int n = L->n, stopped = 0;
    loom_flight_view *views = calloc((size_t)n, sizeof *views);
    loom_flight_rank *ranks = calloc((size_t)n, sizeof *ranks);
    char line[4096];
    if (!views || !ranks) {
        fprintf(stderr, "loom launch: no memory to read the flight recorder\n");
        goto done;
    }
    for (int r = 0; r < n; r++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/rank-%d.flight", L->flight_dir, L->first_rank + r);
        int got = loom_flight_load(path, &views[r]) == LOOM_OK;
        ranks[r] = rank_state(L, r, got ? &views[r] : NULL);
        stopped |= ranks[r].state == LOOM_RANK_STOPPED;
    }
    int waits = loom_flight_diagnose(ranks, n, loom_now_ns(), line, sizeof line);
    if (!waits && !stopped && !asked)
        goto done;
    fprintf(stderr, "loom launch: %s\n", line);
    if (L->flight_out) {
        FILE *f = fopen(L->flight_out, "w");
        if (f) {
            fprintf(f, "%s\n", line);
            write_details(f, ranks, n);
        }
        if (!f || fclose(f) != 0)
            fprintf(stderr, "loom launch: cannot write --flight %s: %s\n", L->flight_out,
                    strerror(errno));
        else
            fprintf(stderr, "loom launch: each rank's last operations are in %s\n",
                    L->flight_out);
    } else if (L->verbose || asked) {
        write_details(stderr, ranks, n);
    } else {
        fprintf(stderr, "loom launch: -v or --flight FILE shows each rank's last operations\n");
    }
done:
    free(views);
    free(ranks);
}

static void rank_exited(launcher *L, int r, int status)
{
    rank_proc *p = &L->ranks[r];
    p->running = 0;
    p->status = status;
    /* Everything the rank wrote is in its pipes now: show it before any
     * verdict about the rank. Bounded, because something the rank left
     * running may still be writing. */
    for (int k = 0; k < 64 && p->out.fd >= 0 && stream_read(&p->out); k++) {
    }
    for (int k = 0; k < 64 && p->err.fd >= 0 && stream_read(&p->err); k++) {
    }
    stream_close(&p->out);
    stream_close(&p->err);

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
        report(L, 0);
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
        report(L, 1);
        return;
    }
    if (sig != SIGINT && sig != SIGTERM)
        return; /* SIGCHLD only wakes the loop up */
    if (L->signalled) {
        /* Asked twice: the user is done waiting. */
        signal_running(L, SIGKILL);
        return;
    }
    L->signalled = 1;
    char ranks[512];
    if (format_running(L, ranks, sizeof ranks) > 0)
        fprintf(stderr, "loom launch: got %s; passing it on to %s\n",
                sig == SIGINT ? "SIGINT" : "SIGTERM", ranks);
    if (L->exit_code < 0)
        L->exit_code = 128 + sig;
    report(L, 0);
    signal_running(L, sig);
    signal_running(L, SIGCONT);
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
        report(L, 0);
        stop_running(L);
    }
    if (L->kill_deadline && now >= L->kill_deadline) {
        signal_running(L, SIGKILL);
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
    set_env_int("LOOM_RANK", L->first_rank + r);
    set_env_int("LOOM_WORLD_SIZE", L->world);
    set_env_int("LOOM_LOCAL_RANK", r);
    set_env_int("LOOM_LOCAL_SIZE", L->n);
    set_env_int("LOOM_RESTART", L->restart);
    setenv("LOOM_BIND", L->bind->text, 1);
    if (L->bind->on) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(L->bind->cpus[r % L->bind->ncpus], &one);
        if (sched_setaffinity(0, sizeof one, &one) != 0)
            fprintf(stderr, "loom launch: cannot bind rank %d to cpu %d: %s; it runs unbound\n",
                    L->first_rank + r, L->bind->cpus[r % L->bind->ncpus], strerror(errno));
    }
    if (job_tmpdir[0])
        setenv("TMPDIR", job_tmpdir, 1);
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

static void stream_init(rank_stream *st, int fd, int to_fd, int rank)
{
    memset(st, 0, sizeof *st);
    st->fd = fd;
    st->rank = rank;
    st->to_fd = to_fd;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
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
    stream_init(&p->out, out[0], 1, L->first_rank + r);
    stream_init(&p->err, err[0], 2, L->first_rank + r);
    /* The status pipe closes at exec (success) or carries exec's errno. */
    int exec_errno = 0;
    ssize_t got;
    while ((got = read(status[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
    }
    close(status[0]);
    return got == (ssize_t)sizeof exec_errno ? exec_errno : 0;
}

static int usage_error(const char *what)
{
    fprintf(stderr, "loom launch: %s; %s\n", what, usage_text);
    return 2;
}

/* The command line. Across machines (nnodes > 1) this launcher starts one
 * node's ranks, n per node, as torchrun's --nnodes/--node-rank/--master
 * do: node k holds ranks k*n .. k*n + n - 1, and rank 0's store listens at
 * master. */
typedef struct launch_args {
    int n;                 /* ranks on this node */
    double timeout_s;      /* 0: none */
    int max_restarts;
    int nnodes, node_rank; /* 1 and 0 on one machine */
    char master[256];      /* host of rank 0's store; "" on one machine */
    int master_port;
    int verbose;            /* -v */
    const char *flight_out; /* --flight FILE */
    bind_mode bind;         /* --bind */
    int cmd_index;
} launch_args;

/* "HOST:PORT" into a; 0, or -1 when it is not one. */
static int parse_master(const char *text, launch_args *a)
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
static const char *take_value(const char *name, const char *value, launch_args *a)
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
        a->bind = !strcmp(value, "core") ? BIND_CORE : BIND_NONE;
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

static int parse_args(int argc, char **argv, launch_args *a)
{
    static const char *const options[] = {"-n",          "--timeout", "--max-restarts",
                                          "--nnodes",    "--node-rank", "--master",
                                          "--flight",    "--bind",      NULL};
    *a = (launch_args){.nnodes = 1};
    int i = 1;
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
        const char *wrong = take_value(name, value, a);
        if (wrong)
            return usage_error(wrong);
    }
    if (a->n < 1)
        return usage_error("-n N is required");
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
    a->cmd_index = i;
    return -1;
}

/* The cpus the launcher may use (its own affinity: a cgroup, taskset or an
 * outer launcher's binding) and, by --bind, the one each rank gets. */
static void plan_binding(const launch_args *a, binding *b)
{
    cpu_set_t allowed;
    b->on = 0;
    b->ncpus = 0;
    int got = sched_getaffinity(0, sizeof allowed, &allowed) == 0;
    for (int c = 0; got && c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &allowed))
            b->cpus[b->ncpus++] = c;
    if (a->bind == BIND_NONE) {
        snprintf(b->text, sizeof b->text, "not bound (--bind none)");
        return;
    }
    if (b->ncpus == 0) {
        snprintf(b->text, sizeof b->text, "not bound: sched_getaffinity: %s", strerror(errno));
        return;
    }
    if (a->bind == BIND_FIT && a->n > b->ncpus) {
        snprintf(b->text, sizeof b->text,
                 "not bound: %d ranks on %d cpu%s (--bind core would pin them, sharing cpus)",
                 a->n, b->ncpus, b->ncpus == 1 ? "" : "s");
        return;
    }
    b->on = 1;
    enum { SHOWN = 8 };
    size_t len = (size_t)snprintf(b->text, sizeof b->text, "bound");
    int first = a->node_rank * a->n;
    for (int r = 0; r < a->n && r < SHOWN; r++)
        len += (size_t)snprintf(b->text + len, sizeof b->text - len, "%s rank %d to cpu %d",
                                r ? "," : "", first + r, b->cpus[r % b->ncpus]);
    /* at most 8 of ~30 characters above: room for the rest */
    if (a->n > SHOWN)
        len += (size_t)snprintf(b->text + len, sizeof b->text - len, ", ... (%d ranks, one cpu "
                                "each in turn)", a->n);
    if (a->n > b->ncpus)
        snprintf(b->text + len, sizeof b->text - len, " (%d ranks share %d cpu%s)", a->n,
                 b->ncpus, b->ncpus == 1 ? "" : "s");
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
        stream_close(&L->ranks[r].out);
        stream_close(&L->ranks[r].err);
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
                stream_read(w.streams[k - 1]);
    }
    free(w.fds);
    free(w.streams);
}

/* A folder in the job's for this run's tables; without one the job runs
 * unrecorded. */
static void make_flight_dir(launcher *L)
{
    L->flight_dir[0] = '\0';
    if (!job_tmpdir[0])
        return;
    snprintf(L->flight_dir, sizeof L->flight_dir, "%.4000s/flight-%d", job_tmpdir, L->restart);
    if (mkdir(L->flight_dir, 0700) != 0) {
        fprintf(stderr, "loom launch: warning: no flight recorder: cannot make %s: %s\n",
                L->flight_dir, strerror(errno));
        L->flight_dir[0] = '\0';
    }
}

/* One run of every rank: its exit code (0 when all succeeded) and the rank
 * whose exit it is (*rank, -1 when none); *stop set when nothing should
 * be restarted (the user's signal, the --timeout, or a failure of the
 * launcher itself). */
static int run_once(const launch_args *a, const binding *bind, int restart,
                    uint64_t end_deadline, char **cmd, int *stop, int *rank)
{
    *rank = -1;
    launcher L;
    if (launcher_init(&L, a->n, a->timeout_s) != 0) {
        *stop = 1;
        return 1;
    }
    L.first_rank = a->node_rank * a->n;
    L.world = a->nnodes * a->n;
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
    make_flight_dir(&L);
    saved_signals saved;
    take_signals(&saved);
    spawn_ranks(&L, cmd);
    supervise(&L);
    launcher_free(&L);
    give_back_signals(&saved);
    *stop = L.signalled || L.timed_out;
    *rank = L.decided_by;
    return L.exit_code < 0 ? 0 : L.exit_code;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

/* The job's TMPDIR, named so that the next launcher removes it if this one
 * is killed before it can (SIGKILL), along with any such folder left. */
static void make_job_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    if (!base || !base[0])
        base = "/tmp";
    loom_launch_remove_stale_tmpdirs(base);
    loom_launch_tmpdir_template(job_tmpdir, sizeof job_tmpdir, base);
    if (!mkdtemp(job_tmpdir))
        job_tmpdir[0] = '\0';
}

/* Open MPI's helpers (ompi-server, a singleton's orted) outlive a killed
 * rank for a moment and write their session folders here while they shut
 * down: a folder that is not empty yet is tried again for up to 2 s. */
static void remove_job_tmpdir(void)
{
    for (int attempt = 0; job_tmpdir[0] && attempt < 40; attempt++) {
        nftw(job_tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
        if (access(job_tmpdir, F_OK) != 0)
            break;
        nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
    }
    job_tmpdir[0] = '\0';
}

/* What an exit status says when a restart cannot help, NULL otherwise. */
static const char *failure_that_repeats(int status)
{
    switch (status) {
    case 2: return "a command line it cannot use";
    case LOOM_EXIT_CONFIG: return "a configuration error";
    case 126: return "a command that cannot be executed";
    case 127: return "a command that was not found";
    default: return NULL;
    }
}

static int launch(const launch_args *a, char **cmd)
{
    static binding bind; /* CPU_SETSIZE cpus: not on the stack */
    plan_binding(a, &bind);
    if (a->verbose)
        fprintf(stderr, "loom launch: %s\n", bind.text);
    /* the --timeout covers the whole job, restarts included */
    uint64_t end_deadline = a->timeout_s > 0 ? loom_now_ns() + (uint64_t)(a->timeout_s * 1e9) : 0;
    for (int restart = 0;; restart++) {
        int stop = 0, rank;
        int rc = run_once(a, &bind, restart, end_deadline, cmd, &stop, &rank);
        if (rc == 0 || stop || restart == a->max_restarts)
            return rc;
        const char *repeats = failure_that_repeats(rc);
        if (repeats && rank >= 0) {
            fprintf(stderr, "loom launch: not restarting: rank %d exited with status %d (%s, "
                            "which a restart would repeat)\n", rank, rc, repeats);
            return rc;
        }
        /* as torchrun: every rank again, the job resuming from its latest
         * complete checkpoint (loom train does, seeing LOOM_RESTART) */
        fprintf(stderr, "loom launch: restart %d of %d: every rank again (the last run ended with "
                        "status %d)\n", restart + 1, a->max_restarts, rc);
    }
}

int loom_cmd_launch(int argc, char **argv)
{
    launch_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc >= 0)
        return rc;
    char **cmd = argv + a.cmd_index;
    if ((a.flight_out && (rc = loom_launch_check_flight(a.flight_out))) ||
        (rc = loom_launch_check_limits(a.n)))
        return rc;
    if (a.nnodes > 1 && (rc = loom_launch_nodes_agree(a.master, a.master_port, a.nnodes,
                                                      a.node_rank, a.n, cmd, a.timeout_s)))
        return rc;
    make_job_tmpdir();
    rc = launch(&a, cmd);
    remove_job_tmpdir();
    return rc;
}
