/* `loom launch -n N [--timeout S] [--] CMD [ARGS...]`: N ranks of CMD on this
 * machine, for development and tests; across machines jobs run under
 * mpirun or srun (DESIGN §3).
 *
 * The launcher is one poll loop over the ranks' output pipes and a
 * self-pipe that the signal handlers write to. Each rank runs in its own
 * process group, so stopping a rank stops what it started too (a shell and
 * its children), and a Ctrl-C reaches the ranks once, through us. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/commands.h"
#include "runtime/bootstrap.h"
#include "runtime/log.h"

#define GRACE_S 5.0       /* between SIGTERM and SIGKILL */
#define MAX_PARTIAL 65536 /* a longer line is cut rather than held */

static const char usage_text[] = "usage: loom launch -n N [--timeout S] [--] CMD [ARGS...]";

/* One of a rank's output pipes and the unfinished line read from it. */
typedef struct rank_stream {
    int fd;    /* -1 once closed */
    int to_fd; /* where its lines go: 1 or 2 */
    char *line;
    size_t len, cap;
} rank_stream;

typedef struct rank_proc {
    pid_t pid;
    int running;
    rank_stream out, err;
} rank_proc;

typedef struct launcher {
    int n;
    rank_proc *ranks;
    int exit_code;          /* -1 until the first failure, signal or timeout decides it */
    int signalled;          /* a SIGINT/SIGTERM was passed on */
    double timeout_s;       /* 0: none */
    uint64_t end_deadline;  /* the --timeout, 0 when none or spent */
    uint64_t kill_deadline; /* when the stopping ranks get SIGKILL, 0 when none */
} launcher;

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
static void stream_emit(rank_stream *st, int rank, const char *data, size_t n, int final)
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
    size_t plen = (size_t)snprintf(prefix, sizeof prefix, "[%d] ", rank);
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

static void stream_close(rank_stream *st, int rank)
{
    if (st->fd < 0)
        return;
    stream_emit(st, rank, "", 0, 1);
    close(st->fd);
    st->fd = -1;
}

/* Read what the pipe has now; 0 once it is closed or would block. */
static int stream_read(rank_stream *st, int rank)
{
    char buf[65536];
    ssize_t n = read(st->fd, buf, sizeof buf);
    if (n > 0) {
        stream_emit(st, rank, buf, (size_t)n, 0);
        return 1;
    }
    if (n < 0 && errno == EINTR)
        return 1;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    stream_close(st, rank);
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
            list[n++] = r;
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
    arm_kill_deadline(L);
}

static void rank_exited(launcher *L, int r, int status)
{
    rank_proc *p = &L->ranks[r];
    p->running = 0;
    /* Everything the rank wrote is in its pipes now: show it before any
     * verdict about the rank. Bounded, because something the rank left
     * running may still be writing. */
    for (int k = 0; k < 64 && p->out.fd >= 0 && stream_read(&p->out, r); k++) {
    }
    for (int k = 0; k < 64 && p->err.fd >= 0 && stream_read(&p->err, r); k++) {
    }
    stream_close(&p->out, r);
    stream_close(&p->err, r);

    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (ok || L->exit_code >= 0)
        return; /* a rank we stopped, or one after the first failure */
    char how[128];
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
        fprintf(stderr, "loom launch: rank %d %s; stopping %s\n", r, how, ranks);
        stop_running(L);
    } else {
        fprintf(stderr, "loom launch: rank %d %s\n", r, how);
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
    signal_running(L, sig);
    arm_kill_deadline(L);
}

static void check_deadlines(launcher *L)
{
    uint64_t now = loom_now_ns();
    if (L->end_deadline && now >= L->end_deadline) {
        L->end_deadline = 0;
        char ranks[512] = "ranks";
        int n = format_running(L, ranks, sizeof ranks);
        fprintf(stderr, "loom launch: timed out after %g s with %s still running; stopping %s\n",
                L->timeout_s, ranks, n == 1 ? "it" : "them");
        if (L->exit_code < 0)
            L->exit_code = 124;
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
static void child_exec(int r, int n, int port, char **cmd, int out_fd, int err_fd, int status_fd,
                       pid_t launcher_pid)
{
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
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
    set_env_int("LOOM_RANK", r);
    set_env_int("LOOM_WORLD_SIZE", n);
    set_env_int("LOOM_LOCAL_RANK", r);
    set_env_int("LOOM_LOCAL_SIZE", n);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    set_env_int("MASTER_PORT", port);
    setenv("LOOM_OUTPUT_PREFIXED", "1", 1); /* the core's log lines then skip their own */
    execvp(cmd[0], cmd);
    int err = errno;
    if (write(status_fd, &err, sizeof err) < 0) {
        /* the launcher will see status 127 */
    }
    _exit(127);
}

static void stream_init(rank_stream *st, int fd, int to_fd)
{
    memset(st, 0, sizeof *st);
    st->fd = fd;
    st->to_fd = to_fd;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* Start rank r. 0, or the errno of a failed exec (a positive number), or
 * -1 for a failure of ours (already reported). */
static int spawn_rank(launcher *L, int r, int port, char **cmd)
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
        child_exec(r, L->n, port, cmd, out[1], err[1], status[1], launcher_pid);
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
    stream_init(&p->out, out[0], 1);
    stream_init(&p->err, err[0], 2);
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

static int parse_args(int argc, char **argv, int *n, double *timeout_s, int *cmd_index)
{
    int i = 1;
    *n = 0;
    *timeout_s = 0;
    while (i < argc) {
        const char *a = argv[i], *value = NULL;
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("%s\n", usage_text);
            return 0;
        }
        int is_n = !strncmp(a, "-n", 2);
        int is_timeout = !strcmp(a, "--timeout") || !strncmp(a, "--timeout=", 10);
        if (!is_n && !is_timeout) {
            if (a[0] == '-')
                return usage_error("unknown option");
            break; /* the command */
        }
        if (is_n && a[2])
            value = a + 2;
        else if (is_timeout && a[9] == '=')
            value = a + 10;
        else if (i + 1 < argc)
            value = argv[++i];
        else
            return usage_error(is_n ? "-n needs a number of ranks" : "--timeout needs seconds");
        i++;
        char *end;
        errno = 0;
        if (is_n) {
            long v = strtol(value, &end, 10);
            if (end == value || *end || errno || v < 1 || v > 1000000)
                return usage_error("-n needs a number of ranks >= 1");
            *n = (int)v;
        } else {
            double v = strtod(value, &end);
            if (end == value || *end || !(v > 0) || v > 1e7)
                return usage_error("--timeout needs a number of seconds > 0");
            *timeout_s = v;
        }
    }
    if (*n < 1)
        return usage_error("-n N is required");
    if (i >= argc)
        return usage_error("no command to run");
    *cmd_index = i;
    return -1;
}

/* Ranks, their streams closed, and the signal pipe; 0, or -1 reported. */
static int launcher_init(launcher *L, int n, double timeout_s)
{
    *L = (launcher){.n = n, .exit_code = -1, .timeout_s = timeout_s};
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
        stream_close(&L->ranks[r].out, r);
        stream_close(&L->ranks[r].err, r);
        free(L->ranks[r].out.line);
        free(L->ranks[r].err.line);
    }
    free(L->ranks);
}

/* The launcher's handlers replace these while it runs. */
typedef struct saved_signals {
    struct sigaction on_int, on_term, on_chld, on_pipe;
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
    sigaction(SIGPIPE, &ign, &saved->on_pipe);
}

static void give_back_signals(const saved_signals *saved)
{
    sigaction(SIGINT, &saved->on_int, NULL);
    sigaction(SIGTERM, &saved->on_term, NULL);
    sigaction(SIGCHLD, &saved->on_chld, NULL);
    sigaction(SIGPIPE, &saved->on_pipe, NULL);
    close(signal_pipe[0]);
    close(signal_pipe[1]);
    signal_pipe[0] = signal_pipe[1] = -1;
}

/* Start every rank; after a failure, stop the ranks already started. */
static void spawn_ranks(launcher *L, int port, char **cmd)
{
    /* Held back while forking, so a child never runs our handler. */
    sigset_t held, old_mask;
    sigemptyset(&held);
    sigaddset(&held, SIGINT);
    sigaddset(&held, SIGTERM);
    sigaddset(&held, SIGCHLD);
    for (int r = 0; r < L->n; r++) {
        sigprocmask(SIG_BLOCK, &held, &old_mask);
        int spawned = spawn_rank(L, r, port, cmd);
        sigprocmask(SIG_SETMASK, &old_mask, NULL);
        if (spawned != 0) {
            if (spawned > 0)
                fprintf(stderr, "loom launch: cannot run '%s': %s\n", cmd[0], strerror(spawned));
            L->exit_code = spawned == EACCES ? 126 : spawned > 0 ? 127 : 1;
            stop_running(L);
            break;
        }
    }
}

/* What one poll watches: the signal pipe first, then every open stream. */
typedef struct watch_list {
    struct pollfd *fds;     /* 1 + 2n */
    rank_stream **streams;  /* streams[k] is fds[k + 1] */
    int *stream_rank;
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
            w->stream_rank[w->count - 1] = r;
            w->fds[w->count++] = (struct pollfd){.fd = two[k]->fd, .events = POLLIN};
        }
    }
}

/* Until the next deadline, at most a second; signals and output wake the
 * poll sooner. */
static int poll_timeout_ms(const launcher *L)
{
    uint64_t next = loom_now_ns() + 1000000000ull;
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
                    malloc(sizeof *w.stream_rank * 2 * n), 0};
    for (;;) {
        reap(L);
        check_deadlines(L);
        if (!any_running(L))
            break;
        if (!w.fds || !w.streams || !w.stream_rank) {
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
                stream_read(w.streams[k - 1], w.stream_rank[k - 1]);
    }
    free(w.fds);
    free(w.streams);
    free(w.stream_rank);
}

int loom_cmd_launch(int argc, char **argv)
{
    int n, cmd_index;
    double timeout_s;
    int rc = parse_args(argc, argv, &n, &timeout_s, &cmd_index);
    if (rc >= 0)
        return rc;
    int port = pick_free_port();
    if (port < 0) {
        fprintf(stderr, "loom launch: cannot find a free port on 127.0.0.1 for the store: %s\n",
                strerror(errno));
        return 1;
    }
    launcher L;
    if (launcher_init(&L, n, timeout_s) != 0)
        return 1;
    saved_signals saved;
    take_signals(&saved);
    if (timeout_s > 0)
        L.end_deadline = loom_now_ns() + (uint64_t)(timeout_s * 1e9);
    spawn_ranks(&L, port, argv + cmd_index);
    supervise(&L);
    launcher_free(&L);
    give_back_signals(&saved);
    return L.exit_code < 0 ? 0 : L.exit_code;
}
