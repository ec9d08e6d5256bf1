/* comm-mpi — the communicator over MPI (docs/architecture.md).
 *
 * Every loom collective maps onto an MPI non-blocking collective on an MPI
 * communicator of its own. Two ways to get an MPI world:
 *  - under mpirun or `srun --mpi=pmix`, MPI_COMM_WORLD is the job;
 *  - under `loom launch` (or plain srun, whose step Open MPI cannot join),
 *    which starts independent processes, each process is an MPI singleton.
 *    Rank 0 runs ompi-server, every rank points MPI at it before MPI_Init,
 *    and the ranks join one at a time by connect/accept and
 *    MPI_Intercomm_merge, taking turns through the bootstrap store.
 *
 * MPI_Init and MPI_Finalize happen once per process, so the only state
 * outside the communicator objects is the process's MPI state (`proc`
 * below): the count of live communicators (the last destroy finalizes), the
 * base world every world communicator duplicates, the half-precision type
 * and reductions, and the ompi-server child.
 *
 * No call waits forever: waits poll with MPI_Test under the host's timeout,
 * and the steps MPI can only do blocking are gated by something bounded
 * first (a world is an MPI_Comm_idup; a subgroup's members meet with
 * non-blocking sends before MPI_Comm_create_group; each joining rank puts a
 * store key before the others accept it), so a missing rank is named
 * instead of hanging everyone. On a timeout the ranks that did not arrive
 * are named by the core's group layer (runtime/group.c). Errors come
 * back as loom statuses (MPI_ERRORS_RETURN on every communicator);
 * MPI_Abort is never called.
 *
 * Under loom launch the joined processes belong to different MPI jobs, so
 * Open MPI's shared-memory transport cannot connect them and their traffic
 * goes over TCP on tcp_interface (loopback): correct, but slower than under
 * mpirun. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <mpi.h>

#include "common/call.h"
#include "common/clock.h"
#include "common/group.h"
#include "common/reduce.h"
#include "loom/comm.h"

/* ------------------------------------------------------------ settings */

static const loom_setting_spec mpi_settings[] = {
    {.name = "yield_when_idle", .type = LOOM_SETTING_BOOL, .default_value = "true",
     .help = "give the CPU away while waiting (MPI's mpi_yield_when_idle, and waits that sleep); "
     "false polls without sleeping, for dedicated cores"},
    {.name = "connect_timeout_s", .type = LOOM_SETTING_FLOAT, .default_value = "0.0",
     .help = "bound on starting ompi-server and on each rank's turn to join under loom launch; "
     "0 means comm.timeout_s",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {.name = "late_grace_s", .type = LOOM_SETTING_FLOAT, .default_value = "2.0", .help =
     "after a timeout, how long the core collects the other ranks' reports before naming the "
     "ranks that did not arrive",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {.name = "ompi_server", .type = LOOM_SETTING_STRING, .default_value = "ompi-server",
     .help = "program that joins ranks started without mpirun (Open MPI's ompi-server)"},
    {.name = "tcp_interface", .type = LOOM_SETTING_STRING, .default_value = "",
     .help = "network interface for MPI's TCP traffic between ranks joined under loom launch "
             "(\"\": lo on one machine; across machines the one that reaches MASTER_ADDR)"},
    {0},
};

typedef struct mpi_settings_t {
    int yield;
    double timeout_s;
    double connect_timeout_s;
    const char *ompi_server;
    const char *tcp_interface;
} mpi_settings_t;

static void read_settings(const loom_host *host, mpi_settings_t *s)
{
    s->yield = 1;
    s->timeout_s = host->timeout_s > 0 ? host->timeout_s : 60.0;
    s->connect_timeout_s = 0.0;
    s->ompi_server = "ompi-server";
    s->tcp_interface = "";
    /* The core has validated the group and filled in defaults; the fallbacks
     * above only matter for a host without config (a bare test harness). */
    double d;
    const char *str;
    if (host->config_bool && host->config_bool(host, "yield_when_idle", &s->yield) != LOOM_OK)
        s->yield = 1;
    if (host->config_float && host->config_float(host, "connect_timeout_s", &d) == LOOM_OK)
        s->connect_timeout_s = d;
    if (host->config_string && host->config_string(host, "ompi_server", &str) == LOOM_OK && str && *str)
        s->ompi_server = str;
    if (host->config_string && host->config_string(host, "tcp_interface", &str) == LOOM_OK && str && *str)
        s->tcp_interface = str;
    if (s->connect_timeout_s <= 0)
        s->connect_timeout_s = s->timeout_s;
}

/* ------------------------------------------------- the process's MPI state */

typedef struct mpi_process {
    pthread_mutex_t lock;
    int refs;             /* live loom_comm objects of this process */
    int started;          /* base is usable */
    int init_here;        /* we called MPI_Init, so we call MPI_Finalize */
    int failed;           /* a group failed or was aborted: MPI_Finalize could hang */
    int joined;           /* base was made by joining singletons through ompi-server */
    int thread_level;
    MPI_Comm base;        /* MPI_COMM_WORLD or the joined world; rank = loom rank */
    int nworlds;          /* world communicators made so far: part of their ids */
    MPI_Datatype half;    /* bf16 and f16 travel as two opaque bytes */
    MPI_Op half_ops[2][3]; /* [0 bf16, 1 f16][sum, max, min] */
    int nhalf_ops;        /* how many of half_ops exist (they are filled in order) */
    int half_type_ok;
    pid_t server;         /* ompi-server, a child of rank 0 */
    char server_dir[PATH_MAX];
} mpi_process;

static mpi_process proc = {.lock = PTHREAD_MUTEX_INITIALIZER, .base = MPI_COMM_NULL};

/* --------------------------------------------------------- small helpers */

/* The status class of an MPI error: argument errors are the caller's,
 * everything else most likely means a peer or the transport went away. */
static int mpi_status(int rc)
{
    int cls = MPI_ERR_OTHER;
    MPI_Error_class(rc, &cls);
    switch (cls) {
    case MPI_ERR_BUFFER:
    case MPI_ERR_COUNT:
    case MPI_ERR_TYPE:
    case MPI_ERR_TAG:
    case MPI_ERR_RANK:
    case MPI_ERR_ROOT:
    case MPI_ERR_OP:
    case MPI_ERR_ARG:
    case MPI_ERR_TRUNCATE:
        return LOOM_ERR_INVALID;
    case MPI_ERR_NO_MEM:
        return LOOM_ERR_NO_MEMORY;
    default:
        return LOOM_ERR_REMOTE;
    }
}

/* host->error with MPI's own text appended: "comm-mpi: <what>: <MPI text>". */
__attribute__((format(printf, 3, 4))) static int mpi_fail(const loom_host *host, int rc,
                                                           const char *fmt, ...)
{
    char what[512], text[MPI_MAX_ERROR_STRING + 1] = "";
    int len = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error %d", rc);
    return host->error(host, mpi_status(rc), "comm-mpi: %s: %s", what, text);
}

static int kv_put_str(const loom_host *host, const char *key, const char *value)
{
    return host->kv_put(host, key, value, strlen(value) + 1);
}

static int kv_get_str(const loom_host *host, const char *key, char *buf, size_t cap,
                      double timeout_s)
{
    size_t len = 0;
    int st = host->kv_get(host, key, buf, cap - 1, &len, timeout_s);
    if (st != LOOM_OK)
        return st;
    buf[len < cap - 1 ? len : cap - 1] = '\0';
    return LOOM_OK;
}

/* ------------------------------------------------ bf16 / f16 reductions */

/* bf16 and f16 have no MPI type: they travel as two opaque bytes and reduce
 * through these user ops (inout = in op inout, common/reduce.h). Each
 * pairwise combine rounds back to 16 bits once, so over n ranks a sum is
 * rounded up to n-1 times, in the order MPI's algorithm combines — not once,
 * as an f32 accumulator over all ranks would. */
#define HALF_OP(NAME, DTYPE, OP)                                                         \
    static void NAME(void *in, void *inout, int *n, MPI_Datatype *t)                     \
    {                                                                                    \
        (void)t;                                                                         \
        reduce_elements(inout, in, inout, (size_t)*n, DTYPE, OP);                        \
    }
HALF_OP(bf16_sum, LOOM_BF16, LOOM_SUM)
HALF_OP(bf16_max, LOOM_BF16, LOOM_MAX)
HALF_OP(bf16_min, LOOM_BF16, LOOM_MIN)
HALF_OP(f16_sum, LOOM_F16, LOOM_SUM)
HALF_OP(f16_max, LOOM_F16, LOOM_MAX)
HALF_OP(f16_min, LOOM_F16, LOOM_MIN)

static int half_types_create(const loom_host *host)
{
    MPI_User_function *fns[2][3] = {{bf16_sum, bf16_max, bf16_min}, {f16_sum, f16_max, f16_min}};
    int rc = MPI_Type_contiguous(2, MPI_BYTE, &proc.half);
    if (rc == MPI_SUCCESS)
        rc = MPI_Type_commit(&proc.half);
    proc.half_type_ok = rc == MPI_SUCCESS;
    for (int i = 0; i < 6 && rc == MPI_SUCCESS; i++) {
        rc = MPI_Op_create(fns[i / 3][i % 3], 1, &proc.half_ops[i / 3][i % 3]);
        proc.nhalf_ops += rc == MPI_SUCCESS;
    }
    if (rc != MPI_SUCCESS)
        return mpi_fail(host, rc, "creating the bf16/f16 datatype and reductions");
    return LOOM_OK;
}

static void half_types_free(void)
{
    for (int i = 0; i < proc.nhalf_ops; i++)
        MPI_Op_free(&proc.half_ops[i / 3][i % 3]);
    proc.nhalf_ops = 0;
    if (proc.half_type_ok)
        MPI_Type_free(&proc.half);
    proc.half_type_ok = 0;
}

static MPI_Datatype mpi_dtype(loom_dtype t)
{
    switch (t) {
    case LOOM_F32: return MPI_FLOAT;
    case LOOM_F64: return MPI_DOUBLE;
    case LOOM_I32: return MPI_INT32_T;
    case LOOM_I64: return MPI_INT64_T;
    case LOOM_U8: return MPI_UINT8_T;
    case LOOM_BF16:
    case LOOM_F16: return proc.half;
    default: return MPI_DATATYPE_NULL;
    }
}

/* The MPI call that posts each op, for messages. */
static const char *const mpi_call_name[LOOM_OP_COUNT] = {
    "MPI_Iallreduce", "MPI_Ibcast", "MPI_Ireduce", "MPI_Iallgather", "MPI_Ireduce_scatter_block",
    "MPI_Ialltoall",  "MPI_Isend",  "MPI_Irecv",   "MPI_Ibarrier"};

/* AVG is a SUM here; the division happens when the request completes. */
static MPI_Op mpi_op(loom_dtype t, loom_redop op)
{
    int o = op == LOOM_MAX ? 1 : op == LOOM_MIN ? 2 : 0;
    if (t == LOOM_BF16 || t == LOOM_F16)
        return proc.half_ops[t == LOOM_F16][o];
    return o == 1 ? MPI_MAX : o == 2 ? MPI_MIN : MPI_SUM;
}

/* ----------------------------------------------------------- ompi-server */

static int find_program(const char *prog, char *out, size_t cap)
{
    if (strchr(prog, '/')) {
        snprintf(out, cap, "%s", prog);
        return access(out, X_OK) == 0;
    }
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        size_t n = strcspn(path, ":");
        snprintf(out, cap, "%.*s/%s", (int)n, path, prog);
        if (n > 0 && access(out, X_OK) == 0)
            return 1;
        path += n;
        if (*path == ':')
            path++;
    }
    return 0;
}

static void read_first_line(const char *file, char *buf, size_t cap)
{
    buf[0] = '\0';
    FILE *f = fopen(file, "r");
    if (!f)
        return;
    while (fgets(buf, (int)cap, f)) {
        buf[strcspn(buf, "\n")] = '\0';
        if (buf[0] && strspn(buf, "-") != strlen(buf))
            break; /* skip Open MPI's dashed separator lines */
        buf[0] = '\0';
    }
    fclose(f);
}

static void server_stop(void)
{
    if (proc.server > 0) {
        pid_t pid = proc.server;
        int reaped = 0;
        kill(-pid, SIGTERM);
        kill(pid, SIGTERM);
        for (int i = 0; i < 200 && !reaped; i++) {
            pid_t r = waitpid(pid, NULL, WNOHANG);
            reaped = r == pid || (r < 0 && errno == ECHILD);
            if (!reaped)
                clock_sleep_s(0.01);
        }
        if (!reaped) {
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
        }
        proc.server = 0;
    }
    if (proc.server_dir[0]) {
        char f[PATH_MAX + 8];
        snprintf(f, sizeof f, "%s/uri", proc.server_dir);
        unlink(f);
        snprintf(f, sizeof f, "%s/log", proc.server_dir);
        unlink(f);
        rmdir(proc.server_dir);
        proc.server_dir[0] = '\0';
    }
}

/* The interface this machine reaches host through (the one a UDP
 * "connection" to it would leave by), into name; 0, or -1. */
static int interface_toward(const char *host, char *name, size_t cap)
{
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(9)}, me;
    socklen_t len = sizeof me;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), found = -1;
    if (fd < 0 || inet_pton(AF_INET, host, &to.sin_addr) != 1 ||
        connect(fd, (struct sockaddr *)&to, sizeof to) < 0 ||
        getsockname(fd, (struct sockaddr *)&me, &len) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    struct ifaddrs *list = NULL;
    if (getifaddrs(&list) < 0)
        return -1;
    for (struct ifaddrs *i = list; i && found < 0; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
            ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == me.sin_addr.s_addr) {
            snprintf(name, cap, "%s", i->ifa_name);
            found = 0;
        }
    freeifaddrs(list);
    return found;
}

/* comm.mpi.tcp_interface, or where it is "": lo when every rank runs on
 * this machine, else the interface toward rank 0's MASTER_ADDR. */
static int choose_interface(const loom_host *host, mpi_settings_t *s)
{
    static char chosen[64];
    if (s->tcp_interface[0])
        return LOOM_OK;
    const char *master = getenv("MASTER_ADDR");
    if (host->local_size >= host->world_size) {
        s->tcp_interface = "lo";
        return LOOM_OK;
    }
    if (!master || interface_toward(master, chosen, sizeof chosen) != 0)
        return host->error(host, LOOM_ERR_INVALID,
                           "comm-mpi: the job spans machines (%d of its %d ranks here) and no "
                           "interface reaches MASTER_ADDR '%s'; set comm.mpi.tcp_interface, or run "
                           "the job under mpirun", host->local_size, host->world_size,
                           master ? master : "(unset)");
    s->tcp_interface = chosen;
    host->log(host, LOOM_LOG_DEBUG, "comm-mpi: MPI's TCP traffic goes over %s (toward %s)",
              chosen, master);
    return LOOM_OK;
}

/* Start ompi-server as a child in its own process group, which dies with
 * us (PR_SET_PDEATHSIG; note it follows the creating thread, so create the
 * world from a thread that lives as long as the job). Returns its URI. */
static int server_start(const loom_host *host, const mpi_settings_t *s, char *uri, size_t cap)
{
    char path[PATH_MAX], urifile[PATH_MAX + 8], logfile[PATH_MAX + 8];
    if (!find_program(s->ompi_server, path, sizeof path))
        return host->error(host, LOOM_ERR_NOT_FOUND,
                           "comm-mpi: ranks started without mpirun are joined through ompi-server, "
                           "but '%s' was not found on PATH (Debian: apt-get install openmpi-bin; or "
                           "set comm.mpi.ompi_server, or run the job under mpirun)",
                           s->ompi_server);
    /* under loom launch TMPDIR is the job's own folder, removed at its end
     * whatever became of the ranks */
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !tmp[0])
        tmp = "/tmp";
    snprintf(proc.server_dir, sizeof proc.server_dir, "%.*s/loom-mpi-XXXXXX", PATH_MAX - 32, tmp);
    if (!mkdtemp(proc.server_dir)) {
        int e = errno;
        proc.server_dir[0] = '\0';
        return host->error(host, LOOM_ERR_INTERNAL,
                           "comm-mpi: cannot create a directory for ompi-server in %s (TMPDIR): %s",
                           tmp, strerror(e));
    }
    snprintf(urifile, sizeof urifile, "%s/uri", proc.server_dir);
    snprintf(logfile, sizeof logfile, "%s/log", proc.server_dir);
    char iface[64];
    snprintf(iface, sizeof iface, "%s", s->tcp_interface);
    char *argv[] = {path, "--no-daemonize", "-r", urifile, "--mca", "oob_tcp_if_include", iface, NULL};

    long maxfd = sysconf(_SC_OPEN_MAX);
    if (maxfd < 0 || maxfd > 65536)
        maxfd = 65536;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0)
        return host->error(host, LOOM_ERR_INTERNAL, "comm-mpi: fork for ompi-server failed: %s",
                           strerror(errno));
    if (pid == 0) { /* only async-signal-safe calls until exec */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(1);
        int fd = open(logfile, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0)
            dup2(nul, 0);
        /* not our sockets and pipes (the store's, the launcher's) */
        if (close_range(3, ~0u, 0) != 0)
            for (long other = 3; other < maxfd; other++)
                close((int)other);
        execv(path, argv);
        _exit(127);
    }
    setpgid(pid, pid); /* also from here, so a kill(-pid) right away finds the group */
    proc.server = pid;

    double deadline = clock_now_s() + s->connect_timeout_s;
    for (;;) {
        FILE *f = fopen(urifile, "r");
        if (f) { /* complete once the line has its newline */
            size_t n = fread(uri, 1, cap - 1, f);
            fclose(f);
            uri[n] = '\0';
            char *nl = strchr(uri, '\n');
            if (nl && strstr(uri, "tcp")) {
                *nl = '\0';
                /* Nothing is left in /tmp even if we are killed: the
                 * server keeps writing to its (now unlinked) log. */
                unlink(urifile);
                unlink(logfile);
                rmdir(proc.server_dir);
                proc.server_dir[0] = '\0';
                return LOOM_OK;
            }
        }
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            char line[256];
            read_first_line(logfile, line, sizeof line);
            proc.server = 0;
            int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            int st = host->error(host, LOOM_ERR_INTERNAL,
                                 "comm-mpi: %s exited with status %d before reporting its address%s%s",
                                 path, code, line[0] ? ": " : "", line);
            server_stop();
            return st;
        }
        if (clock_now_s() > deadline) {
            server_stop();
            return host->error(host, LOOM_ERR_TIMEOUT,
                               "comm-mpi: %s did not report its address within %.1f s "
                               "(raise comm.mpi.connect_timeout_s, or run the job under mpirun)",
                               path, s->connect_timeout_s);
        }
        clock_sleep_s(0.01);
    }
}

/* Whether the first tcp address in an ompi-server URI ("123.0;tcp://127.0.0.1:4711")
 * accepts connections. MPI_Init aborts the whole process when it cannot reach
 * the server, so we check first. Unparseable URIs are let through. */
static int uri_reachable(const char *uri, double timeout_s)
{
    const char *p = strstr(uri, "tcp://");
    if (!p)
        return 1;
    p += 6;
    char addr[64];
    size_t n = strcspn(p, ":,;");
    if (n == 0 || n >= sizeof addr || p[n] != ':')
        return 1;
    memcpy(addr, p, n);
    addr[n] = '\0';
    int port = atoi(p + n + 1);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (port <= 0 || inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
        return 1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 1;
    int ok = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    if (!ok && errno == EINPROGRESS) {
        struct pollfd pfd = {fd, POLLOUT, 0};
        if (poll(&pfd, 1, (int)(timeout_s * 1000)) == 1) {
            int err = 0;
            socklen_t len = sizeof err;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
            ok = err == 0;
        }
    }
    close(fd);
    return ok;
}

/* ------------------------------------------------------- starting MPI */

/* Join singletons into one world: the group of ranks 0..r-1 accepts rank r
 * on rank 0's port and merges it in as the highest rank. Every step is gated
 * on a store key the newcomer puts once MPI is up, so a rank that never
 * comes is named after connect_timeout_s instead of the others blocking in
 * MPI_Comm_accept. (A rank that dies between putting its key and connecting
 * still leaves the others in accept; loom launch stops them then.) */
static int join_world(const loom_host *host, const mpi_settings_t *s, MPI_Comm *out)
{
    int me = host->rank, n = host->world_size, rc, st;
    double tmo = s->connect_timeout_s;
    char port[MPI_MAX_PORT_NAME + 1] = "", key[64];
    MPI_Comm merged = MPI_COMM_SELF, inter, next;

    if (me == 0) {
        rc = MPI_Open_port(MPI_INFO_NULL, port);
        if (rc != MPI_SUCCESS)
            return mpi_fail(host, rc, "MPI_Open_port for joining the ranks");
        if ((st = kv_put_str(host, "join/port", port)) != LOOM_OK)
            return st;
    } else {
        snprintf(key, sizeof key, "join/ready/%d", me);
        if ((st = kv_put_str(host, key, "1")) != LOOM_OK)
            return st;
        if (me > 1) { /* our turn comes after rank me-1 is in */
            snprintf(key, sizeof key, "join/merged/%d", me - 1);
            if ((st = kv_get_str(host, key, port, sizeof port, tmo)) != LOOM_OK)
                return host->error(host, st,
                                   "comm-mpi: joining the world: rank %d did not join within %.1f s "
                                   "(it or an earlier rank did not start MPI; see its log)",
                                   me - 1, tmo);
        }
        if ((st = kv_get_str(host, "join/port", port, sizeof port, tmo)) != LOOM_OK)
            return host->error(host, st,
                               "comm-mpi: joining the world: rank 0 did not publish its MPI port "
                               "within %.1f s", tmo);
        rc = MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter);
        if (rc != MPI_SUCCESS)
            return mpi_fail(host, rc, "MPI_Comm_connect to rank 0 for joining the world");
        MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
        rc = MPI_Intercomm_merge(inter, 1, &merged);
        MPI_Comm_free(&inter);
        if (rc != MPI_SUCCESS)
            return mpi_fail(host, rc, "MPI_Intercomm_merge for joining the world");
        MPI_Comm_set_errhandler(merged, MPI_ERRORS_RETURN);
    }

    for (int r = me + 1; r < n; r++) {
        snprintf(key, sizeof key, "join/ready/%d", r);
        char v[8];
        if ((st = kv_get_str(host, key, v, sizeof v, tmo)) != LOOM_OK)
            return host->error(host, st,
                               "comm-mpi: joining the world: rank %d did not start MPI within %.1f s "
                               "(see its log; raise comm.mpi.connect_timeout_s if it is just slow)",
                               r, tmo);
        rc = MPI_Comm_accept(port, MPI_INFO_NULL, 0, merged, &inter);
        if (rc != MPI_SUCCESS)
            return mpi_fail(host, rc, "MPI_Comm_accept of rank %d for joining the world", r);
        MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
        rc = MPI_Intercomm_merge(inter, 0, &next);
        MPI_Comm_free(&inter);
        if (rc != MPI_SUCCESS)
            return mpi_fail(host, rc, "MPI_Intercomm_merge of rank %d for joining the world", r);
        MPI_Comm_set_errhandler(next, MPI_ERRORS_RETURN);
        if (merged != MPI_COMM_SELF)
            MPI_Comm_free(&merged);
        merged = next;
        if (me == 0) {
            snprintf(key, sizeof key, "join/merged/%d", r);
            if ((st = kv_put_str(host, key, "1")) != LOOM_OK)
                return st;
        }
    }
    if (me == 0)
        MPI_Close_port(port);

    /* Joining in rank order already gives rank == loom rank; the split makes
     * it so whatever order the joins took. */
    rc = MPI_Comm_split(merged, 0, me, out);
    if (merged != MPI_COMM_SELF)
        MPI_Comm_free(&merged);
    if (rc != MPI_SUCCESS)
        return mpi_fail(host, rc, "MPI_Comm_split of the joined world");
    MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    return LOOM_OK;
}

static int init_mpi(const loom_host *host)
{
    /* Open MPI 4.1's libnbc posts each round of its segmented ireduce
     * algorithms (chain, rabenseifner) from inside the progress of the
     * previous one; a 64 MiB reduce recurses until the stack overflows.
     * Binomial sends whole blocks: a few rounds. A user's own choice (the
     * environment or mpirun's --mca) wins. */
    setenv("OMPI_MCA_coll_libnbc_ireduce_algorithm", "2", 0);
    int provided = MPI_THREAD_SINGLE;
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS)
        return host->error(host, LOOM_ERR_INTERNAL, "comm-mpi: MPI_Init_thread failed (error %d)", rc);
    proc.init_here = 1;
    proc.thread_level = provided;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    if (provided < MPI_THREAD_SERIALIZED)
        host->log(host, LOOM_LOG_WARN,
                  "MPI provides only thread level %d: call communicators from the "
                  "thread that created them", provided);
    return LOOM_OK;
}

/* Whether a PMI-1/2 launcher (MPICH's mpiexec, srun --mpi=pmi2) started
 * us in a way this MPI can use. Open MPI builds its world from PMIx only
 * (Debian's has no PMI-2), so there PMI_* variables are not a world. */
static int pmi_launched(void)
{
#ifdef OPEN_MPI
    return 0;
#else
    return getenv("PMI_SIZE") != NULL;
#endif
}

/* srun started this process without PMIx (plain srun, or --mpi=pmi2): its
 * step variables make Open MPI's MPI_Init take it for a direct launch it
 * cannot serve and abort the process ("OMPI was not built with SLURM's PMI
 * support"; SLURM_STEP_ID, or SLURM_NODELIST without SLURM_JOBID, is
 * enough). Without the two it starts as a singleton and the ranks join
 * through ompi-server, as under loom launch. loom read the rank from the
 * environment long before; nothing reads these two after this. */
static void leave_slurm_step(const loom_host *host)
{
    int started_by_srun = getenv("SLURM_STEP_ID") && !getenv("LOOM_RANK");
    unsetenv("SLURM_STEP_ID");
    unsetenv("SLURM_NODELIST");
    if (started_by_srun && host->rank == 0 && host->world_size > 1)
        host->log(host, LOOM_LOG_INFO,
                  "srun started the ranks without PMIx, so MPI cannot build its world from "
                  "Slurm: comm-mpi joins them through ompi-server over TCP instead (srun "
                  "--mpi=pmix lets MPI do it, with shared memory between a node's ranks)");
}

/* Bring MPI up once per process and make proc.base. Called with proc.lock. */
static int process_start(const loom_host *host, const mpi_settings_t *s)
{
    int flag = 0, st, rc;
    if (proc.started)
        return LOOM_OK;
    MPI_Finalized(&flag);
    if (flag)
        return host->error(host, LOOM_ERR_NOT_SUPPORTED,
                           "comm-mpi: MPI was already finalized in this process (every comm-mpi "
                           "communicator was destroyed) and MPI cannot start twice; keep one "
                           "communicator alive for the life of the process");
    if (proc.init_here || proc.failed)
        return host->error(host, LOOM_ERR_INTERNAL,
                           "comm-mpi: MPI in this process is unusable after an earlier failure "
                           "(see the first error)");

    /* mpirun sets OMPI_COMM_WORLD_*; a PMIx direct launch (srun
     * --mpi=pmix) sets PMIX_RANK, a PMI one PMI_SIZE (pmi_launched). Either
     * way MPI_Init makes the world itself. */
    int mpi_launched = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || pmi_launched();
    MPI_Initialized(&flag);
    if (!flag && !mpi_launched && (getenv("SLURM_STEP_ID") || getenv("SLURM_NODELIST")))
        leave_slurm_step(host);
    if (s->yield)
        setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);

    if (flag) { /* the application started MPI itself: use its world */
        proc.thread_level = MPI_THREAD_SINGLE;
        MPI_Query_thread(&proc.thread_level);
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        proc.base = MPI_COMM_WORLD;
    } else if (!mpi_launched && host->world_size > 1) {
        /* Started by loom launch: independent singletons to be joined. */
        char uri[1024];
        mpi_settings_t joined = *s;
        if ((st = choose_interface(host, &joined)) != LOOM_OK)
            return st;
        s = &joined;
        if (host->rank == 0) {
            if ((st = server_start(host, s, uri, sizeof uri)) != LOOM_OK)
                return st;
            if ((st = kv_put_str(host, "join/uri", uri)) != LOOM_OK)
                return st;
        } else if ((st = kv_get_str(host, "join/uri", uri, sizeof uri, s->connect_timeout_s)) !=
                   LOOM_OK) {
            return host->error(host, st,
                               "comm-mpi: rank 0 did not publish its ompi-server address within "
                               "%.1f s (see rank 0's log)", s->connect_timeout_s);
        }
        if (!uri_reachable(uri, s->connect_timeout_s))
            return host->error(host, LOOM_ERR_REMOTE,
                               "comm-mpi: rank 0's ompi-server at '%s' does not accept "
                               "connections (is rank 0 alive? is interface '%s' up?)",
                               uri, s->tcp_interface);
        /* Once ompi-server is gone (rank 0 exited or failed), MPI's
         * connections to it break and the next write would kill this
         * process with SIGPIPE, before it could report anything. */
        struct sigaction sa;
        if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL) {
            signal(SIGPIPE, SIG_IGN);
            host->log(host, LOOM_LOG_DEBUG, "ignoring SIGPIPE (MPI joined through ompi-server)");
        }
        setenv("OMPI_MCA_pmix_server_uri", uri, 1);
        setenv("OMPI_MCA_oob_tcp_if_include", s->tcp_interface, 1);
        setenv("OMPI_MCA_btl_tcp_if_include", s->tcp_interface, 1);
        if ((st = init_mpi(host)) != LOOM_OK)
            return st;
        proc.joined = 1;
        double t0 = clock_now_s();
        if ((st = join_world(host, s, &proc.base)) != LOOM_OK)
            return st;
        host->log(host, LOOM_LOG_DEBUG, "%d singletons joined through ompi-server in %.2f s",
                  host->world_size, clock_now_s() - t0);
    } else {
        if ((st = init_mpi(host)) != LOOM_OK)
            return st;
        proc.base = MPI_COMM_WORLD;
    }

    int mrank = -1, msize = -1;
    MPI_Comm_rank(proc.base, &mrank);
    MPI_Comm_size(proc.base, &msize);
    if (mrank != host->rank || msize != host->world_size)
        return host->error(host, LOOM_ERR_INVALID,
                           "comm-mpi: MPI sees this process as rank %d of %d but loom as rank %d of "
                           "%d; start the job with one launcher only (mpirun -np N loom ..., or "
                           "loom launch -n N -- loom ...)",
                           mrank, msize, host->rank, host->world_size);
    if ((rc = half_types_create(host)) != LOOM_OK)
        return rc;
    host->log(host, LOOM_LOG_DEBUG, "MPI up (%s, thread level %d)",
              proc.joined ? "joined under loom launch" : mpi_launched ? "mpirun" : "singleton",
              proc.thread_level);
    proc.started = 1;
    return LOOM_OK;
}

/* The last communicator of the process is gone. Called with proc.lock. */
static void process_stop(const loom_host *host, double timeout_s)
{
    if (proc.failed && (proc.started || proc.init_here))
        /* MPI_Finalize waits for operations that will never complete once a
         * peer is gone; the process is about to fail anyway. */
        host->log(host, LOOM_LOG_WARN, "skipping MPI_Finalize after a failure");
    else if (proc.started) {
        half_types_free();
        if (proc.joined && proc.base != MPI_COMM_NULL)
            MPI_Comm_free(&proc.base);
        if (proc.init_here) /* else it is the application's MPI: it finalizes */
            MPI_Finalize();
    }
    proc.started = 0;
    proc.base = MPI_COMM_NULL;

    if (proc.joined && host->kv_add) {
        /* ompi-server should outlive every rank's MPI_Finalize, so rank 0
         * waits (bounded) for the others to report. After a failure it does
         * not: the job is going down, and with SIGPIPE ignored a vanished
         * server harms no one. */
        int64_t done = 0;
        int st = host->kv_add(host, "finalized", 1, &done);
        double deadline = clock_now_s() + (timeout_s < 10 ? timeout_s : 10);
        while (st == LOOM_OK && proc.server > 0 && !proc.failed && done < host->world_size &&
               clock_now_s() < deadline) {
            clock_sleep_s(0.005);
            st = host->kv_add(host, "finalized", 0, &done);
        }
        if (proc.server > 0 && !proc.failed && done < host->world_size)
            host->log(host, LOOM_LOG_WARN,
                      "%lld of %d ranks finished MPI_Finalize; stopping ompi-server anyway",
                      (long long)done, host->world_size);
    }
    server_stop();
}

/* ------------------------------------------------------- communicators */

struct loom_comm {
    comm_group group;     /* ranks, id, messages, sequence numbers; its failure under lock */
    MPI_Comm mpi;
    MPI_Comm ctl;         /* a twin of mpi for our own handshakes, never seen by user messages */
    int tag_ub;
    mpi_settings_t set;
    pthread_mutex_t lock; /* the group's failure and its requests in flight */
};
/* First: plugins/common reads the group there (comm_rank, comm_size). */
_Static_assert(offsetof(struct loom_comm, group) == 0, "comm_group first");

struct loom_comm_request {
    MPI_Request mpi;
    loom_comm *comm; /* NULL once the group was destroyed under it */
    const loom_host *host;
    const char *name; /* the op, for messages */
    int collective;
    uint64_t seq;
    int peer, tag;        /* send / recv */
    size_t expect;        /* recv: elements expected */
    loom_dtype dtype;
    void *avg_buf;        /* AVG: divide these avg_count elements at completion */
    size_t avg_count;
    void *stage;          /* a copy of a send buffer that overlaps recv */
    comm_pending pending; /* on the group's list while in flight */
};

static loom_comm *comm_alloc(const loom_host *host, int rank, int size, const mpi_settings_t *s)
{
    loom_comm *c = calloc(1, sizeof *c);
    if (!c || group_init(&c->group, host, "comm-mpi", rank, size) != LOOM_OK) {
        free(c);
        return NULL;
    }
    c->group.lock = &c->lock;
    c->mpi = MPI_COMM_NULL;
    c->ctl = MPI_COMM_NULL;
    c->tag_ub = 32767; /* MPI's guaranteed minimum */
    c->set = *s;
    pthread_mutex_init(&c->lock, NULL);
    return c;
}

static void comm_free(loom_comm *c)
{
    if (!c)
        return;
    pthread_mutex_destroy(&c->lock);
    group_release(&c->group);
    free(c);
}

/* Record that the group is unusable; later calls fail at once with this. */
static void comm_mark_failed(loom_comm *c, int status, const char *why)
{
    pthread_mutex_lock(&c->lock);
    group_fail(&c->group, status, why);
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_lock(&proc.lock);
    proc.failed = 1;
    pthread_mutex_unlock(&proc.lock);
}

/* Adopt mc and make its twin for handshakes. Collective over mc; every
 * member is known to be present when this is called. */
static int comm_set_mpi(loom_comm *c, MPI_Comm mc)
{
    c->mpi = mc;
    MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
    int rc = MPI_Comm_dup(mc, &c->ctl);
    if (rc != MPI_SUCCESS)
        return mpi_fail(c->group.host, rc, "MPI_Comm_dup for %s", c->group.desc);
    MPI_Comm_set_errhandler(c->ctl, MPI_ERRORS_RETURN);
    int *ub = NULL, flag = 0;
    if (MPI_Comm_get_attr(mc, MPI_TAG_UB, &ub, &flag) == MPI_SUCCESS && flag && ub)
        c->tag_ub = *ub;
    return LOOM_OK;
}

/* --------------------------------------------------------- requests */

static loom_comm_request *req_new(loom_comm *c, const char *name, int collective, uint64_t seq)
{
    loom_comm_request *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->mpi = MPI_REQUEST_NULL;
    r->comm = c;
    r->host = c->group.host;
    r->name = name;
    r->collective = collective;
    r->seq = seq;
    r->peer = -1;
    return r;
}

/* Unlink from the group's in-flight list and free. A request whose MPI
 * operation did not complete is dropped without MPI_Request_free (erroneous
 * for non-blocking collectives); its group is failed by then. */
static void req_release(loom_comm_request *r)
{
    loom_comm *c = r->comm;
    if (c) {
        pthread_mutex_lock(&c->lock);
        group_untrack(&c->group, &r->pending);
        pthread_mutex_unlock(&c->lock);
    }
    free(r->stage);
    free(r);
}

static void req_describe(const loom_comm_request *r, char *buf, size_t cap)
{
    group_describe_op(r->comm ? &r->comm->group : NULL, r->name, r->seq, r->peer, r->tag, buf,
                      cap);
}

/* After the MPI_I* call: track the request, or turn the MPI error into ours. */
static int op_posted(loom_comm *c, loom_comm_request *r, int rc, const char *fn,
                     loom_comm_request **out)
{
    if (rc != MPI_SUCCESS) {
        char what[400];
        req_describe(r, what, sizeof what);
        int st = mpi_fail(c->group.host, rc, "%s: %s failed", what, fn);
        comm_mark_failed(c, st, "an earlier MPI call failed");
        r->comm = NULL; /* never linked */
        req_release(r);
        return st;
    }
    pthread_mutex_lock(&c->lock);
    group_track(&c->group, &r->pending, r);
    pthread_mutex_unlock(&c->lock);
    *out = r;
    return LOOM_OK;
}

static int no_memory(loom_comm *c, const char *name, uint64_t seq, loom_comm_request *r)
{
    if (r) {
        free(r->stage);
        free(r);
    }
    return group_no_memory(&c->group, name, seq);
}

/* ---------------------------------------------------------------- ops */

/* The core checked the arguments (comm.h); what is left is MPI's limits. */
static int check_limits(const loom_comm *c, const comm_call *call, const char *name, uint64_t seq)
{
    const loom_host *h = c->group.host;
    size_t send_bytes, recv_bytes, es = loom_dtype_size(call->dtype);
    call_extents(call, c->group.rank, c->group.size, &send_bytes, &recv_bytes);
    size_t elements = (send_bytes > recv_bytes ? send_bytes : recv_bytes) / (es ? es : 1);
    /* MPI counts are ints, and some of Open MPI's algorithms compute the
     * whole buffer's element count (blocks * count) in an int too. */
    if (call->count > (size_t)INT_MAX || elements > (size_t)INT_MAX)
        return h->error(h, LOOM_ERR_NOT_SUPPORTED,
                        "comm-mpi: %s #%llu: %zu elements of %s is more than MPI's int counts "
                        "allow; split the operation",
                        name, (unsigned long long)seq, call->count, loom_dtype_name(call->dtype));
    if (call_is_p2p(call) && (call->tag < 0 || call->tag > c->tag_ub))
        return h->error(h, LOOM_ERR_INVALID, "comm-mpi: %s #%llu on %s: tag %d is outside 0..%d",
                        name, (unsigned long long)seq, c->group.desc, call->tag, c->tag_ub);
    return LOOM_OK;
}

/* The send buffer MPI gets: MPI_IN_PLACE for an in-place call, a private
 * copy of a send buffer that overlaps recv otherwise (MPI forbids aliased
 * arguments), else send itself. LOOM_OK or LOOM_ERR_NO_MEMORY. */
static int send_buffer(loom_comm_request *r, const comm_call *call, int rank, int size,
                       const void **out)
{
    size_t send_bytes, recv_bytes;
    call_extents(call, rank, size, &send_bytes, &recv_bytes);
    *out = call->send;
    /* MPI's in-place reducescatter: the whole input in recv, this rank's
     * result left in its first block. */
    if (call_in_place(call, rank) ||
        (call->op == LOOM_OP_REDUCESCATTER && call->send == call->recv))
        *out = MPI_IN_PLACE;
    else if (buffers_overlap(call->send, send_bytes, call->recv, recv_bytes)) {
        if (!(r->stage = malloc(send_bytes)))
            return LOOM_ERR_NO_MEMORY;
        memcpy(r->stage, call->send, send_bytes);
        *out = r->stage;
    }
    return LOOM_OK;
}

/* Every op (common/call.h): one MPI non-blocking call on the group's
 * communicator. */
int comm_post(loom_comm *c, const comm_call *call, loom_comm_request **req)
{
    const char *name = loom_comm_op_name(call->op);
    int collective = !call_is_p2p(call), rank = c->group.rank;
    uint64_t seq;
    int st = group_begin(&c->group, name, collective, &seq);
    if (st == LOOM_OK)
        st = check_limits(c, call, name, seq);
    if (st != LOOM_OK || call_is_empty(call))
        return st;
    loom_comm_request *r = req_new(c, name, collective, seq);
    const void *sb = NULL;
    if (!r || send_buffer(r, call, rank, c->group.size, &sb) != LOOM_OK)
        return no_memory(c, name, seq, r);
    r->peer = call->peer;
    r->tag = call->tag;
    r->expect = call->count;
    r->dtype = call->dtype;
    /* AVG is a SUM here; the division happens when the request completes. */
    if (call->redop == LOOM_AVG && (call->op != LOOM_OP_REDUCE || rank == call->root)) {
        r->avg_buf = call->recv;
        r->avg_count = call->count;
    }
    int n = (int)call->count, root = call->root, rc;
    MPI_Datatype t = mpi_dtype(call->dtype);
    MPI_Op op = mpi_op(call->dtype, call->redop);
    void *rb = call->recv;
    switch (call->op) {
    case LOOM_OP_ALLREDUCE: rc = MPI_Iallreduce(sb, rb, n, t, op, c->mpi, &r->mpi); break;
    case LOOM_OP_BROADCAST: rc = MPI_Ibcast(rb, n, t, root, c->mpi, &r->mpi); break;
    case LOOM_OP_REDUCE: /* recv is significant at the root only */
        rc = MPI_Ireduce(sb, rank == root ? rb : NULL, n, t, op, root, c->mpi, &r->mpi);
        break;
    case LOOM_OP_ALLGATHER: rc = MPI_Iallgather(sb, n, t, rb, n, t, c->mpi, &r->mpi); break;
    case LOOM_OP_REDUCESCATTER:
        rc = MPI_Ireduce_scatter_block(sb, rb, n, t, op, c->mpi, &r->mpi);
        break;
    case LOOM_OP_ALLTOALL: rc = MPI_Ialltoall(sb, n, t, rb, n, t, c->mpi, &r->mpi); break;
    case LOOM_OP_SEND: rc = MPI_Isend(sb, n, t, call->peer, call->tag, c->mpi, &r->mpi); break;
    case LOOM_OP_RECV: rc = MPI_Irecv(rb, n, t, call->peer, call->tag, c->mpi, &r->mpi); break;
    default: rc = MPI_Ibarrier(c->mpi, &r->mpi); break;
    }
    return op_posted(c, r, rc, mpi_call_name[call->op], req);
}

/* ------------------------------------------------------ completion */

/* One MPI_Test (a clock_poll callback): LOOM_OK (done), LOOM_IN_PROGRESS,
 * or an error; the request is released unless in progress. */
static int req_poll(void *arg)
{
    loom_comm_request *r = arg;
    loom_comm *c = r->comm;
    const loom_host *h = r->host;
    if (!c) {
        int st = h->error(h, LOOM_ERR_INVALID,
                          "comm-mpi: %s #%llu: its group was destroyed while it was in flight",
                          r->name, (unsigned long long)r->seq);
        req_release(r);
        return st;
    }
    char why[512];
    int failed = group_failure(&c->group, why, sizeof why);
    if (failed) {
        char what[400];
        req_describe(r, what, sizeof what);
        int st = h->error(h, failed, "comm-mpi: %s abandoned: the group failed: %s", what, why);
        req_release(r);
        return st;
    }

    MPI_Status mst;
    int flag = 0;
    int rc = MPI_Test(&r->mpi, &flag, &mst);
    if (rc != MPI_SUCCESS) {
        char what[400];
        req_describe(r, what, sizeof what);
        int st = mpi_fail(h, rc, "%s failed", what);
        comm_mark_failed(c, st, "an earlier operation failed in MPI");
        req_release(r);
        return st;
    }
    if (!flag)
        return LOOM_IN_PROGRESS;
    if (r->avg_buf)
        divide_elements(r->avg_buf, r->avg_count, r->dtype, c->group.size);
    if (!r->collective && strcmp(r->name, "recv") == 0) {
        /* MPI accepts a shorter message silently; a pipeline stage would
         * then read stale data. */
        int got = -1;
        MPI_Get_count(&mst, mpi_dtype(r->dtype), &got);
        if (got != (int)r->expect) {
            char what[400];
            req_describe(r, what, sizeof what);
            int st = h->error(h, LOOM_ERR_INVALID,
                              "comm-mpi: %s: expected %zu elements of %s, rank %d sent %d", what,
                              r->expect, loom_dtype_name(r->dtype), r->peer, got);
            req_release(r);
            return st;
        }
    }
    req_release(r);
    return LOOM_OK;
}

static int mpi_test(loom_comm_request *r) { return r ? req_poll(r) : LOOM_OK; }

/* Poll until done or timeout_s. Waits yield the CPU: sched_yield while the
 * op is young (MPI's non-blocking collectives progress only inside MPI
 * calls, so polling must stay frequent), then short sleeps. */
static int mpi_wait(loom_comm_request *r)
{
    if (!r)
        return LOOM_OK;
    double timeout = r->comm ? r->comm->set.timeout_s : 0;
    int st = clock_poll(req_poll, r, timeout, r->comm ? r->comm->set.yield : 1);
    if (st != LOOM_IN_PROGRESS)
        return st;

    loom_comm *c = r->comm;
    const loom_host *h = c->group.host;
    char what[400], detail[1536];
    req_describe(r, what, sizeof what);
    snprintf(detail, sizeof detail, "%s timed out after %.1f s", what, timeout);
    /* The MPI operation stays posted and may still touch its buffers; the
     * group cannot be used again and MPI_Finalize is skipped. */
    comm_mark_failed(c, LOOM_ERR_TIMEOUT, detail);
    req_release(r);
    return h->error(h, LOOM_ERR_TIMEOUT, "comm-mpi: %s", detail);
}


/* ------------------------------------------------- lifetime operations */

static int mpi_create_world(const loom_host *host, loom_comm **out)
{
    if (!out)
        return LOOM_ERR_INVALID;
    *out = NULL;
    int st = group_check_world(host, "comm-mpi");
    if (st != LOOM_OK)
        return st;
    mpi_settings_t s;
    read_settings(host, &s);

    pthread_mutex_lock(&proc.lock);
    st = process_start(host, &s);
    if (st != LOOM_OK) {
        proc.failed = 1;
        if (proc.refs == 0)
            server_stop();
        pthread_mutex_unlock(&proc.lock);
        return st;
    }
    loom_comm *c = comm_alloc(host, host->rank, host->world_size, &s);
    if (!c) {
        pthread_mutex_unlock(&proc.lock);
        return host->error(host, LOOM_ERR_NO_MEMORY, "comm-mpi: out of memory");
    }
    snprintf(c->group.id, sizeof c->group.id, "w%d", proc.nworlds++);
    group_set_world(&c->group);
    proc.refs++;
    MPI_Comm base = proc.base;
    pthread_mutex_unlock(&proc.lock);

    /* Each world communicator is a duplicate of the base, so two of them
     * never match each other's messages. MPI_Comm_idup lets the wait name a
     * rank that never comes. */
    MPI_Comm mc = MPI_COMM_NULL;
    loom_comm_request *r = req_new(c, "create_world", 1, 0);
    if (!r) {
        st = host->error(host, LOOM_ERR_NO_MEMORY, "comm-mpi: out of memory");
    } else {
        int rc = MPI_Comm_idup(base, &mc, &r->mpi);
        st = op_posted(c, r, rc, "MPI_Comm_idup", &r);
        if (st == LOOM_OK)
            st = mpi_wait(r);
    }
    if (st != LOOM_OK) {
        /* keep the count: destroy of a failed comm is not possible for the
         * caller, so drop our reference here without finalizing */
        pthread_mutex_lock(&proc.lock);
        proc.refs--;
        proc.failed = 1;
        if (proc.refs == 0)
            process_stop(host, s.timeout_s);
        pthread_mutex_unlock(&proc.lock);
        comm_free(c);
        return st;
    }
    if ((st = comm_set_mpi(c, mc)) != LOOM_OK) {
        MPI_Comm_free(&c->mpi);
        pthread_mutex_lock(&proc.lock);
        proc.refs--;
        proc.failed = 1;
        pthread_mutex_unlock(&proc.lock);
        comm_free(c);
        return st;
    }
    *out = c;
    return LOOM_OK;
}

#define TAG_SUBGROUP 1 /* on ctl */

/* The handshake's messages in flight (a clock_poll callback tests them). */
typedef struct handshake {
    MPI_Request *reqs;
    int *done;
    int nreq, left;
    int rc; /* the first MPI error */
} handshake;

static int handshake_poll(void *arg)
{
    handshake *hs = arg;
    for (int j = 0; j < hs->nreq && hs->rc == MPI_SUCCESS; j++) {
        int flag = 0;
        if (!hs->done[j] &&
            (hs->rc = MPI_Test(&hs->reqs[j], &flag, MPI_STATUS_IGNORE)) == MPI_SUCCESS && flag) {
            hs->done[j] = 1;
            hs->left--;
        }
    }
    return hs->rc != MPI_SUCCESS || hs->left == 0 ? LOOM_OK : LOOM_IN_PROGRESS;
}

/* Before MPI_Comm_create_group, which blocks with no timeout, the members
 * meet on the parent's ctl: each sends every other member the hash of its
 * rank list and receives theirs, polled under the timeout. A member that
 * never comes is named; one with a different list is caught. */
static int subgroup_handshake(loom_comm *parent, const int *ranks, int n, int me, uint64_t hash)
{
    const comm_group *pg = &parent->group;
    const loom_host *h = pg->host;
    int nreq = 2 * (n - 1), st = LOOM_OK;
    handshake hs = {.nreq = nreq, .left = nreq, .rc = MPI_SUCCESS};
    hs.reqs = malloc((size_t)(nreq > 0 ? nreq : 1) * sizeof *hs.reqs);
    hs.done = calloc((size_t)(nreq > 0 ? nreq : 1), sizeof *hs.done);
    uint64_t *got = calloc((size_t)n, sizeof *got);
    if (!hs.reqs || !got || !hs.done) {
        free(hs.reqs);
        free(got);
        free(hs.done);
        return h->error(h, LOOM_ERR_NO_MEMORY, "comm-mpi: out of memory");
    }
    char list[128];
    rank_list_text(ranks, n, list, sizeof list);
    int k = 0, rc = MPI_SUCCESS;
    for (int i = 0; i < n && rc == MPI_SUCCESS; i++)
        if (i != me)
            rc = MPI_Irecv(&got[i], 1, MPI_UINT64_T, ranks[i], TAG_SUBGROUP, parent->ctl,
                           &hs.reqs[k++]);
    for (int i = 0; i < n && rc == MPI_SUCCESS; i++)
        if (i != me)
            rc = MPI_Isend(&hash, 1, MPI_UINT64_T, ranks[i], TAG_SUBGROUP, parent->ctl,
                           &hs.reqs[k++]);
    if (rc == MPI_SUCCESS) {
        clock_poll(handshake_poll, &hs, parent->set.timeout_s, parent->set.yield);
        rc = hs.rc;
    }

    if (rc != MPI_SUCCESS) {
        /* requests posted before the error are dropped with the failed group */
        st = mpi_fail(h, rc, "create_subgroup of ranks %s on %s: handshake", list, pg->desc);
        comm_mark_failed(parent, st, "an earlier create_subgroup failed in MPI");
    } else if (hs.left > 0) {
        /* the receives not done name the members that did not come */
        char why[512], nm[64];
        size_t len = 0;
        int missing = 0;
        for (int i = 0, j = 0; i < n; i++) {
            if (i == me)
                continue;
            if (!hs.done[j] && len < sizeof why) {
                group_name_rank(pg, ranks[i], nm, sizeof nm);
                len += (size_t)snprintf(why + len, sizeof why - len, "%s%s", missing++ ? ", " : "", nm);
            }
            j++;
        }
        for (int j = 0; j < nreq; j++) /* drop ours, so the parent stays usable */
            if (!hs.done[j]) {
                MPI_Cancel(&hs.reqs[j]);
                MPI_Request_free(&hs.reqs[j]);
            }
        char detail[1024];
        if (missing > 0)
            snprintf(detail, sizeof detail,
                     "create_subgroup of ranks %s on %s timed out after %.1f s: rank%s %s did not arrive",
                     list, pg->desc, parent->set.timeout_s, missing > 1 ? "s" : "", why);
        else /* only our sends were stuck: should not happen */
            snprintf(detail, sizeof detail, "create_subgroup of ranks %s on %s timed out after %.1f s",
                     list, pg->desc, parent->set.timeout_s);
        /* Like any timeout, this leaves the group broken (our cancelled
         * messages may still land at a late member). */
        comm_mark_failed(parent, LOOM_ERR_TIMEOUT, detail);
        st = h->error(h, LOOM_ERR_TIMEOUT, "comm-mpi: %s", detail);
    } else {
        for (int i = 0; i < n; i++)
            if (i != me && got[i] != hash) {
                char nm[64];
                group_name_rank(pg, ranks[i], nm, sizeof nm);
                st = h->error(h, LOOM_ERR_INVALID,
                              "comm-mpi: create_subgroup on %s: rank %s passed a different rank "
                              "list than this rank's [%s]; every member must pass the same list",
                              pg->desc, nm, list);
                break;
            }
    }
    free(hs.reqs);
    free(got);
    free(hs.done);
    return st;
}

/* Collective over the ranks of the list only (MPI_Comm_create_group), so a
 * parent rank in no subgroup, or in one of its own that the core serves
 * without us, need not call. Subgroup rank i is parent rank ranks[i]. */
static int mpi_create_subgroup(loom_comm *parent, const int *ranks, int nranks, loom_comm **out)
{
    if (!out || !parent)
        return LOOM_ERR_INVALID;
    *out = NULL;
    const loom_host *h = parent->group.host;
    int me = rank_list_index(ranks, parent->group.rank);
    int st = group_refuse_failed(&parent->group, "create_subgroup", LOOM_ERR_REMOTE);
    if (st != LOOM_OK)
        return st;

    uint64_t hash = rank_list_hash(ranks, nranks);
    if ((st = subgroup_handshake(parent, ranks, nranks, me, hash)) != LOOM_OK)
        return st;

    MPI_Group pg = MPI_GROUP_NULL, g = MPI_GROUP_NULL, wg = MPI_GROUP_NULL;
    MPI_Comm mc = MPI_COMM_NULL;
    int rc = MPI_Comm_group(parent->mpi, &pg);
    if (rc == MPI_SUCCESS)
        rc = MPI_Group_incl(pg, nranks, ranks, &g);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_create_group(parent->mpi, g, (int)(hash % 32768u), &mc);
    if (rc != MPI_SUCCESS) {
        st = mpi_fail(h, rc, "create_subgroup on %s: MPI_Comm_create_group failed",
                      parent->group.desc);
        comm_mark_failed(parent, st, "an earlier create_subgroup failed in MPI");
    }

    loom_comm *c = NULL;
    if (st == LOOM_OK && !(c = comm_alloc(h, me, nranks, &parent->set)))
        st = h->error(h, LOOM_ERR_NO_MEMORY, "comm-mpi: out of memory");
    if (st == LOOM_OK) {
        /* world ranks for messages, from MPI itself */
        int *idx = malloc((size_t)nranks * sizeof *idx);
        rc = idx ? MPI_Comm_group(proc.base, &wg) : MPI_ERR_NO_MEM;
        for (int i = 0; idx && i < nranks; i++)
            idx[i] = i;
        if (rc == MPI_SUCCESS)
            rc = MPI_Group_translate_ranks(g, nranks, idx, wg, c->group.world_ranks);
        free(idx);
        if (rc != MPI_SUCCESS)
            st = mpi_fail(h, rc, "create_subgroup on %s: translating ranks", parent->group.desc);
    }
    if (st == LOOM_OK) {
        group_describe(&c->group);
        st = comm_set_mpi(c, mc);
    }
    if (pg != MPI_GROUP_NULL)
        MPI_Group_free(&pg);
    if (g != MPI_GROUP_NULL)
        MPI_Group_free(&g);
    if (wg != MPI_GROUP_NULL)
        MPI_Group_free(&wg);
    if (st != LOOM_OK) {
        if (mc != MPI_COMM_NULL)
            MPI_Comm_free(&mc);
        comm_free(c);
        return st;
    }

    int nth = group_count_subgroup(&parent->group, hash);
    char id[160];
    snprintf(id, sizeof id, "%s.%llx.%d", parent->group.id,
             (unsigned long long)(hash & 0xffffffffu), nth > 0 ? nth : 0);
    copy_text(c->group.id, sizeof c->group.id, id);
    pthread_mutex_lock(&proc.lock);
    proc.refs++;
    pthread_mutex_unlock(&proc.lock);
    *out = c;
    return LOOM_OK;
}

static int mpi_destroy(loom_comm *c)
{
    if (!c)
        return LOOM_OK;
    const loom_host *h = c->group.host;
    int st = LOOM_OK;

    /* Requests never completed: detach them (test/wait on them then fail
     * cleanly) and treat MPI as unclean, since their operations still run. */
    pthread_mutex_lock(&c->lock);
    int orphans = 0;
    for (comm_pending *p = c->group.pending; p; p = p->next, orphans++)
        p->request->comm = NULL;
    c->group.pending = NULL;
    int failed = c->group.failed;
    pthread_mutex_unlock(&c->lock);
    if (orphans) {
        h->log(h, LOOM_LOG_WARN, "comm-mpi: %s destroyed with %d operation(s) still in flight",
               c->group.desc, orphans);
        pthread_mutex_lock(&proc.lock);
        proc.failed = 1;
        pthread_mutex_unlock(&proc.lock);
        failed = 1;
    }
    if (!failed && c->ctl != MPI_COMM_NULL)
        MPI_Comm_free(&c->ctl);
    if (!failed && c->mpi != MPI_COMM_NULL) {
        int rc = MPI_Comm_free(&c->mpi);
        if (rc != MPI_SUCCESS)
            st = mpi_fail(h, rc, "destroying %s", c->group.desc);
    }

    pthread_mutex_lock(&proc.lock);
    if (--proc.refs == 0)
        process_stop(h, c->set.timeout_s);
    pthread_mutex_unlock(&proc.lock);
    comm_free(c);
    return st;
}

/* MPI_Abort would take the whole job down; instead the group is marked
 * failed, so in-flight waits return and destroy skips MPI_Finalize. */
static int mpi_abort(loom_comm *c)
{
    if (c)
        comm_mark_failed(c, LOOM_ERR_REMOTE, "aborted after a failure");
    return LOOM_OK;
}

LOOM_PLUGIN_EXPORT const loom_comm_plugin_v1_t loom_comm_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_COMM, loom_comm_plugin_v1_t, "mpi",
                                 "MPI (Open MPI) non-blocking collectives, under mpirun or loom launch",
                                 mpi_settings),
    .mem_kinds = LOOM_MEM_BIT(LOOM_MEM_HOST),
    .create_world = mpi_create_world,
    .create_subgroup = mpi_create_subgroup,
    .destroy = mpi_destroy,
    COMM_COMMON_OPS,
    .test = mpi_test,
    .wait = mpi_wait,
    .abort = mpi_abort,
};
