/* What `loom launch` checks before it starts any rank (launch_checks.h).
 * A check that fails after ranks run costs the job (a --flight file that
 * cannot be written is found when the report is lost); one that forks
 * until a limit stops it leaves thousands of processes to clean up. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/launch_checks.h"
#include "runtime/bootstrap.h"
#include "runtime/log.h"

int loom_launch_check_flight(const char *path)
{
    /* O_NONBLOCK: a FIFO there must not hold the launcher up */
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NONBLOCK | O_CLOEXEC, 0666);
    if (fd >= 0) {
        close(fd);
        unlink(path);
        return 0;
    }
    if (errno == EEXIST && (fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC)) >= 0) {
        close(fd);
        return 0;
    }
    fprintf(stderr, "loom launch: --flight %s: cannot write it: %s (name a file in a folder that "
                    "exists and that you may write to)\n", path, strerror(errno));
    return LOOM_EXIT_CONFIG;
}

/* ------------------------------------------------------------- the limits */

/* The name may hold spaces and parentheses: count from its end. */
int loom_launch_proc_stat(long pid, int field, unsigned long long *out, char *state)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t len = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (len <= 0)
        return -1;
    buf[len] = '\0';
    const char *p = strrchr(buf, ')');
    if (!p || field < 4 || p[1] != ' ')
        return -1;
    p++;
    if (state)
        *state = p[1];
    for (int f = 3; f <= field; f++) {
        while (*p == ' ')
            p++;
        if (!*p)
            return -1;
        if (f == field) {
            char *end;
            *out = strtoull(p, &end, 10);
            return end == p ? -1 : 0;
        }
        while (*p && *p != ' ')
            p++;
    }
    return -1;
}

/* The tasks (threads count: RLIMIT_NPROC counts them) this user runs, or
 * -1 when /proc cannot tell. */
static long count_user_tasks(uid_t uid)
{
    DIR *d = opendir("/proc");
    if (!d)
        return -1;
    long tasks = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        struct stat st;
        char path[64];
        unsigned long long threads;
        if (*end || end == e->d_name)
            continue;
        snprintf(path, sizeof path, "/proc/%ld", pid);
        if (stat(path, &st) == 0 && st.st_uid == uid)
            tasks += loom_launch_proc_stat(pid, 20, &threads, NULL) == 0 ? (long)threads : 1;
    }
    closedir(d);
    return tasks;
}

/* The kernel lets root, and a process with CAP_SYS_RESOURCE or
 * CAP_SYS_ADMIN, fork past RLIMIT_NPROC. */
static int exempt_from_nproc(void)
{
    if (getuid() == 0)
        return 1;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long caps = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "CapEff: %llx", &caps) == 1)
            break;
    if (f)
        fclose(f);
    return (caps >> 21 & 1) || (caps >> 24 & 1);
}

static long open_files_now(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return 3;
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the listing's own */
}

int loom_launch_check_limits(int n)
{
    struct rlimit lim;
    /* While it runs, a rank's stdout and stderr pipes stay open in the
     * launcher; starting one holds three pipes; and the signal pipe. */
    long need = open_files_now() + 2 * (long)n + 6 + 2;
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
        (unsigned long long)need > (unsigned long long)lim.rlim_cur) {
        fprintf(stderr, "loom launch: -n %d needs %ld open files in the launcher (two pipes per "
                        "rank) and its limit is %llu; raise it (ulimit -n %ld) or start fewer "
                        "ranks\n", n, need, (unsigned long long)lim.rlim_cur, need);
        return LOOM_EXIT_CONFIG;
    }
    if (exempt_from_nproc() || getrlimit(RLIMIT_NPROC, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY)
        return 0;
    long running = count_user_tasks(getuid());
    if (running < 0)
        running = 0;
    if ((unsigned long long)(running + n) > (unsigned long long)lim.rlim_cur) {
        fprintf(stderr, "loom launch: -n %d needs %d more processes, and this user may run %llu "
                        "and runs %ld already; raise the limit (ulimit -u %ld) or start fewer "
                        "ranks\n", n, n, (unsigned long long)lim.rlim_cur, running, running + n);
        return LOOM_EXIT_CONFIG;
    }
    return 0;
}

/* ----------------------------------------------- nodes agree on the job
 *
 * Node k's launcher connects to node 0's and sends
 *   "LOOMNODE", version, node rank, --nnodes, -n, command length (u32 each,
 *   big-endian), its machine (MACHINE_BYTES: node_machine in the order of
 *   its fields, numbers big-endian), then the command's arguments, each
 *   ended by a NUL;
 * node 0's answers, once every node has come (or at the first that
 * disagrees), with a verdict and the line every launcher prints, and when
 * they agreed the node's placement:
 *   verdict, text length (u32 each), text[, cpu_first, cpu_ranks,
 *   local_first, local_ranks (u32 each)].
 * Version 1 had no machine and no placement; a launcher of version 1 still
 * reads the verdict, so it can be told to run the same loom. */

#define NODE_MAGIC "LOOMNODE"
#define NODE_VERSION 2u
#define NODE_HEADER 28
#define MAX_COMMAND (4u << 20)
#define DEFAULT_WAIT_S 300.0

enum { AGREED = 0, DISAGREED = 1, GAVE_UP = 2 };

/* Which launchers share a machine, and in what sense. The cpus are the
 * kernel's: launchers in other network namespaces or containers of one
 * kernel (the multinode test's two "nodes") run on the same cpus, so
 * binding counts every launcher with this kernel's boot_id. Loopback and
 * shared memory reach only the ranks in the same network and IPC
 * namespaces as well, and the local ranks (LOOM_LOCAL_RANK) mean exactly
 * that to the store and the transports, so they count only those. */
typedef struct node_machine {
    char kernel[64];               /* boot_id; "host NAME" where /proc does not say */
    uint64_t net_ns, ipc_ns;       /* the namespaces' inode numbers, 0 unknown */
    uint8_t cpus[CPU_SETSIZE / 8]; /* the affinity mask: cpu c is bit c % 8 of byte c / 8 */
} node_machine;

#define MACHINE_BYTES (64 + 8 + 8 + CPU_SETSIZE / 8)

typedef struct node_hello {
    uint32_t version, node_rank, nnodes, n, len;
    node_machine machine;
    char *cmd; /* len bytes: the arguments, each ended by a NUL */
} node_hello;

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (24 - 8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put_u64(uint8_t *p, uint64_t v)
{
    put_u32(p, (uint32_t)(v >> 32));
    put_u32(p + 4, (uint32_t)v);
}

static uint64_t get_u64(const uint8_t *p)
{
    return (uint64_t)get_u32(p) << 32 | get_u32(p + 4);
}

static uint64_t namespace_inode(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* This launcher's machine, as node_machine says. */
static void describe_machine(node_machine *m)
{
    memset(m, 0, sizeof *m);
    char boot_id[40] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot_id, sizeof boot_id, f))
            boot_id[0] = '\0';
        fclose(f);
    }
    boot_id[strcspn(boot_id, "\n")] = '\0';
    if (boot_id[0]) {
        snprintf(m->kernel, sizeof m->kernel, "%s", boot_id);
    } else {
        char name[58] = "";
        gethostname(name, sizeof name - 1);
        snprintf(m->kernel, sizeof m->kernel, "host %s", name);
    }
    m->net_ns = namespace_inode("/proc/self/ns/net");
    m->ipc_ns = namespace_inode("/proc/self/ns/ipc");
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
        memset(m->cpus, 0xff, sizeof m->cpus); /* unknown: it may use any */
        return;
    }
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &allowed))
            m->cpus[c / 8] |= (uint8_t)(1u << (c % 8));
}

static void pack_machine(uint8_t *p, const node_machine *m)
{
    memcpy(p, m->kernel, sizeof m->kernel);
    put_u64(p + 64, m->net_ns);
    put_u64(p + 72, m->ipc_ns);
    memcpy(p + 80, m->cpus, sizeof m->cpus);
}

static void unpack_machine(const uint8_t *p, node_machine *m)
{
    memcpy(m->kernel, p, sizeof m->kernel);
    m->kernel[sizeof m->kernel - 1] = '\0';
    m->net_ns = get_u64(p + 64);
    m->ipc_ns = get_u64(p + 72);
    memcpy(m->cpus, p + 80, sizeof m->cpus);
}

static int ms_until(uint64_t deadline)
{
    uint64_t now = loom_now_ns();
    return now >= deadline ? 0 : (int)((deadline - now + 999999) / 1000000);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

/* Every byte over a non-blocking socket before deadline; 0, or -1. */
static int move_bytes(int fd, void *buf, size_t len, uint64_t deadline, int sending)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t got = sending ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (got > 0) {
            p += got;
            len -= (size_t)got;
            continue;
        }
        if (got == 0 || (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK))
            return -1;
        struct pollfd w = {.fd = fd, .events = sending ? POLLOUT : POLLIN};
        if (errno != EINTR && poll(&w, 1, ms_until(deadline)) == 0)
            return -1;
    }
    return 0;
}

/* The command as the wire carries it; NULL without memory. */
static char *pack_command(char *const *cmd, uint32_t *len)
{
    size_t total = 0;
    for (int i = 0; cmd[i]; i++)
        total += strlen(cmd[i]) + 1;
    char *out = malloc(total ? total : 1);
    size_t used = 0;
    for (int i = 0; out && cmd[i]; i++) {
        size_t k = strlen(cmd[i]) + 1;
        memcpy(out + used, cmd[i], k);
        used += k;
    }
    *len = (uint32_t)total;
    return out;
}

static int send_hello(int fd, const node_hello *h, uint64_t deadline)
{
    uint8_t head[NODE_HEADER + MACHINE_BYTES];
    memcpy(head, NODE_MAGIC, 8);
    put_u32(head + 8, NODE_VERSION);
    put_u32(head + 12, h->node_rank);
    put_u32(head + 16, h->nnodes);
    put_u32(head + 20, h->n);
    put_u32(head + 24, h->len);
    pack_machine(head + NODE_HEADER, &h->machine);
    return move_bytes(fd, head, sizeof head, deadline, 1) ||
           move_bytes(fd, h->cmd, h->len, deadline, 1);
}

/* 0 and *h filled (h->cmd malloc'd); 1 for a launcher of another version
 * (only h->version and h->node_rank filled); -1: not a launcher. */
static int recv_hello(int fd, node_hello *h, uint64_t deadline)
{
    uint8_t head[NODE_HEADER + MACHINE_BYTES];
    if (move_bytes(fd, head, NODE_HEADER, deadline, 0) || memcmp(head, NODE_MAGIC, 8))
        return -1;
    h->version = get_u32(head + 8);
    h->node_rank = get_u32(head + 12);
    if (h->version != NODE_VERSION)
        return 1;
    if (move_bytes(fd, head + NODE_HEADER, MACHINE_BYTES, deadline, 0))
        return -1;
    h->nnodes = get_u32(head + 16);
    h->n = get_u32(head + 20);
    h->len = get_u32(head + 24);
    unpack_machine(head + NODE_HEADER, &h->machine);
    if (h->len > MAX_COMMAND || !(h->cmd = malloc(h->len + 1)))
        return -1;
    h->cmd[h->len] = '\0';
    if (move_bytes(fd, h->cmd, h->len, deadline, 0) || (h->len && h->cmd[h->len - 1])) {
        free(h->cmd);
        h->cmd = NULL;
        return -1;
    }
    return 0;
}

/* The verdict, and with AGREED the node's placement. */
static void send_verdict(int fd, int verdict, const loom_launch_placement *place,
                         const char *text, uint64_t deadline)
{
    uint8_t head[8], tail[16];
    size_t len = strlen(text);
    put_u32(head, (uint32_t)verdict);
    put_u32(head + 4, (uint32_t)len);
    if (move_bytes(fd, head, sizeof head, deadline, 1) ||
        move_bytes(fd, (void *)(uintptr_t)text, len, deadline, 1) || verdict != AGREED || !place)
        return;
    put_u32(tail, (uint32_t)place->cpu_first);
    put_u32(tail + 4, (uint32_t)place->cpu_ranks);
    put_u32(tail + 8, (uint32_t)place->local_first);
    put_u32(tail + 12, (uint32_t)place->local_ranks);
    move_bytes(fd, tail, sizeof tail, deadline, 1);
}

/* Where node k's command first differs from node 0's, into why; 0 when
 * they are the same. */
static int compare_hellos(const node_hello *mine, const node_hello *theirs, char *why, size_t cap)
{
    unsigned k = theirs->node_rank;
    if (theirs->nnodes != mine->nnodes)
        return snprintf(why, cap, "node %u was started with --nnodes %u and node 0 with "
                                  "--nnodes %u", k, theirs->nnodes, mine->nnodes), 1;
    if (theirs->n != mine->n)
        return snprintf(why, cap, "node %u starts -n %u ranks and node 0 -n %u", k, theirs->n,
                        mine->n), 1;
    const char *a = mine->cmd, *b = theirs->cmd, *a_end = a + mine->len, *b_end = b + theirs->len;
    for (int arg = 1;; arg++) {
        if (a == a_end && b == b_end)
            return 0;
        if (a == a_end)
            return snprintf(why, cap, "node %u's command goes on after node 0's ends: argument "
                                      "%d is '%.200s' on node %u only", k, arg, b, k), 1;
        if (b == b_end)
            return snprintf(why, cap, "node %u's command ends before node 0's: argument %d is "
                                      "'%.200s' on node 0 only", k, arg, a), 1;
        if (strcmp(a, b))
            return snprintf(why, cap, "node %u's command differs from node 0's at argument %d: "
                                      "'%.200s' on node %u, '%.200s' on node 0",
                            k, arg, b, k, a), 1;
        a += strlen(a) + 1;
        b += strlen(b) + 1;
    }
}

/* A socket for node 0's launcher where rank 0's store will listen: a
 * loopback address as is, any other on every interface (as the store). */
static int listen_at(const char *host, int port)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int gai = getaddrinfo(host, service, &hints, &ai);
    if (gai) {
        fprintf(stderr, "loom launch: cannot resolve --master %s: %s\n", host, gai_strerror(gai));
        return -1;
    }
    struct sockaddr_storage addr;
    socklen_t addr_len = (socklen_t)ai->ai_addrlen;
    memcpy(&addr, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    int loopback = 0, zero = 0, one = 1;
    if (addr.ss_family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)&addr;
        loopback = (ntohl(in->sin_addr.s_addr) >> 24) == 127;
        if (!loopback)
            in->sin_addr.s_addr = htonl(INADDR_ANY);
    } else if (addr.ss_family == AF_INET6) {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&addr;
        loopback = IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
        if (!loopback)
            in6->sin6_addr = in6addr_any;
    }
    int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (addr.ss_family == AF_INET6 && !loopback)
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    }
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, addr_len) < 0 || listen(fd, 64) < 0) {
        fprintf(stderr, "loom launch: node 0 cannot listen at %s:%d for the other nodes' "
                        "launchers: %s (--master needs a free port on node 0)\n", host, port,
                strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* A connection to host:port within deadline, or -1. */
static int connect_to(const char *host, int port, uint64_t deadline)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    if (getaddrinfo(host, service, &hints, &ai))
        return -1;
    int fd = -1;
    for (struct addrinfo *p = ai; p && fd < 0; p = p->ai_next) {
        fd = socket(p->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        int ok = connect(fd, p->ai_addr, p->ai_addrlen) == 0;
        if (!ok && errno == EINPROGRESS) {
            struct pollfd w = {.fd = fd, .events = POLLOUT};
            int err = 0;
            socklen_t len = sizeof err;
            ok = poll(&w, 1, ms_until(deadline)) > 0 &&
                 getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
        }
        if (!ok) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    return fd;
}

/* Node 0's side while the other nodes' launchers join: fds[k] and
 * hellos[k] are node k's once it joined, and text is the line every
 * launcher prints when the verdict is not AGREED. */
typedef struct gathering {
    const char *host;
    int port;
    double wait_s;
    const node_hello *mine;
    int nnodes, joined, verdict;
    int *fds;
    node_hello *hellos;
    char text[1024];
} gathering;

/* The wait is over with nodes missing: name them. */
static void give_up_waiting(gathering *g)
{
    int *missing = malloc(sizeof(int) * (size_t)g->nnodes), count = 0;
    char list[512] = "some nodes";
    for (int k = 1; missing && k < g->nnodes; k++)
        if (g->fds[k] < 0)
            missing[count++] = k;
    if (missing)
        loom_format_ranks(list, sizeof list, missing, count);
    free(missing);
    /* "ranks 2, 3" is how the store names them; these are nodes */
    const char *shown = !strncmp(list, "ranks ", 6) ? list + 6
                        : !strncmp(list, "rank ", 5) ? list + 5 : list;
    snprintf(g->text, sizeof g->text, "node 0 waited %g s at %s:%d for node%s %s to join, and "
             "starts no rank (start their loom launch with --master %s:%d)",
             g->wait_s, g->host, g->port, count == 1 ? "" : "s", shown, g->host, g->port);
    g->verdict = GAVE_UP;
}

/* A launcher's hello on fd: node k joins, or the launchers disagree (and
 * one that cannot join hears so at once). */
static void judge_hello(gathering *g, int fd, node_hello h)
{
    unsigned k = h.node_rank;
    if (k == 0 || k >= (unsigned)g->nnodes) {
        snprintf(g->text, sizeof g->text, "a launcher joined node 0 as node %u of --nnodes %u, "
                 "and node 0 runs a job of --nnodes %d", k, h.nnodes, g->nnodes);
        g->verdict = DISAGREED;
    } else if (g->fds[k] >= 0) {
        snprintf(g->text, sizeof g->text, "two launchers joined node 0 as node %u; give each "
                 "node's launcher its own --node-rank", k);
        g->verdict = DISAGREED;
    } else if (compare_hellos(g->mine, &h, g->text, sizeof g->text)) {
        g->verdict = DISAGREED;
    }
    if (g->verdict == DISAGREED) {
        char why[sizeof g->text];
        snprintf(why, sizeof why, "%s", g->text);
        snprintf(g->text, sizeof g->text, "the nodes' launchers disagree, so no rank starts: "
                 "%.900s; give every node's launcher the same -n, --nnodes and command", why);
    }
    if (k > 0 && k < (unsigned)g->nnodes && g->fds[k] < 0) {
        g->fds[k] = fd;
        g->hellos[k] = h;
        g->joined++;
    } else {
        send_verdict(fd, g->verdict, NULL, g->text, loom_now_ns() + 2000000000ull);
        close(fd);
        free(h.cmd);
    }
}

/* A launcher of another loom: what follows its hello's header, and what
 * it reads back beyond the verdict, may differ from ours; every version
 * reads the verdict, so it hears why too. */
static void refuse_other_version(gathering *g, int fd, const node_hello *h)
{
    uint64_t deadline = loom_now_ns() + 2000000000ull;
    snprintf(g->text, sizeof g->text, "the nodes' launchers disagree, so no rank starts: node "
             "%u runs another loom (its launcher's rendezvous is version %u, node 0's %u); run "
             "the same loom on every node", h->node_rank, h->version, NODE_VERSION);
    g->verdict = DISAGREED;
    send_verdict(fd, g->verdict, NULL, g->text, deadline);
    /* The rest of its hello is unread: closing now would reset the
     * connection, and the verdict with it. Close once it has. */
    shutdown(fd, SHUT_WR);
    char rest[4096];
    while (loom_now_ns() < deadline) {
        ssize_t got = recv(fd, rest, sizeof rest, 0);
        if (got > 0 || (got < 0 && errno == EINTR))
            continue;
        struct pollfd w = {.fd = fd, .events = POLLIN};
        if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK) ||
            poll(&w, 1, ms_until(deadline)) <= 0)
            break;
    }
    close(fd);
}

/* Until every other node joined, one disagrees, or the wait is over. */
static void wait_for_nodes(gathering *g, int listener)
{
    uint64_t deadline = loom_now_ns() + (uint64_t)(g->wait_s * 1e9);
    while (g->joined < g->nnodes - 1 && g->verdict == AGREED) {
        struct pollfd w = {.fd = listener, .events = POLLIN};
        int ready = poll(&w, 1, ms_until(deadline));
        if (ready == 0 && loom_now_ns() >= deadline) {
            give_up_waiting(g);
            break;
        }
        if (ready <= 0)
            continue;
        int fd = accept4(listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        /* a stray client (a rank of an earlier job looking for its store)
         * gets a few seconds to show it is a launcher */
        uint64_t hello_deadline = loom_now_ns() + 5000000000ull;
        node_hello h = {0};
        int got = recv_hello(fd, &h, hello_deadline < deadline ? hello_deadline : deadline);
        if (got < 0)
            close(fd);
        else if (got > 0)
            refuse_other_version(g, fd, &h);
        else
            judge_hello(g, fd, h);
    }
}

static const node_hello *hello_of(const gathering *g, int k)
{
    return k == 0 ? g->mine : &g->hellos[k];
}

static int masks_overlap(const node_machine *a, const node_machine *b)
{
    for (size_t i = 0; i < sizeof a->cpus; i++)
        if (a->cpus[i] & b->cpus[i])
            return 1;
    return 0;
}

/* Node k's place among the launchers of its machine, once every node has
 * joined. Launchers whose masks do not overlap (Slurm gave each its own
 * cpus) pin within their own masks without counting each other; one that
 * overlaps only in part still counts, which may leave a cpu idle but never
 * puts two ranks on one while a cpu is free. */
static loom_launch_placement place_node(const gathering *g, int k)
{
    const node_machine *mine = &hello_of(g, k)->machine;
    loom_launch_placement p = {0};
    for (int j = 0; j < g->nnodes; j++) {
        const node_hello *other = hello_of(g, j);
        int n = (int)other->n;
        if (strcmp(mine->kernel, other->machine.kernel))
            continue;
        if (masks_overlap(mine, &other->machine)) {
            p.cpu_ranks += n;
            p.cpu_first += j < k ? n : 0;
        }
        if (mine->net_ns == other->machine.net_ns && mine->ipc_ns == other->machine.ipc_ns) {
            p.local_ranks += n;
            p.local_first += j < k ? n : 0;
        }
    }
    return p;
}

/* The verdict, and where they agreed its placement, to every node that
 * joined. */
static void answer_nodes(gathering *g)
{
    uint64_t reply_deadline = loom_now_ns() + 2000000000ull;
    for (int k = 1; k < g->nnodes; k++) {
        loom_launch_placement place = {0};
        if (g->verdict == AGREED)
            place = place_node(g, k);
        if (g->fds[k] >= 0)
            send_verdict(g->fds[k], g->verdict, &place, g->text, reply_deadline);
    }
    /* Their launchers close first, so the port's TIME_WAIT lands on their
     * side, not on the port rank 0's store binds next. */
    for (int k = 1; k < g->nnodes; k++) {
        char byte;
        if (g->fds[k] >= 0) {
            move_bytes(g->fds[k], &byte, 1, reply_deadline, 0);
            close(g->fds[k]);
        }
        free(g->hellos[k].cmd);
    }
}

/* Node 0: every other node's hello, then the verdict to each. */
static int gather_nodes(const char *host, int port, const node_hello *mine, double wait_s,
                        loom_launch_placement *placement)
{
    int listener = listen_at(host, port);
    if (listener < 0)
        return 1;
    gathering g = {.host = host, .port = port, .wait_s = wait_s, .mine = mine,
                   .nnodes = (int)mine->nnodes, .verdict = AGREED};
    g.fds = malloc(sizeof(int) * (size_t)g.nnodes);
    g.hellos = calloc((size_t)g.nnodes, sizeof *g.hellos);
    if (!g.fds || !g.hellos) {
        fprintf(stderr, "loom launch: out of memory\n");
        free(g.fds);
        free(g.hellos);
        close(listener);
        return 1;
    }
    for (int k = 0; k < g.nnodes; k++)
        g.fds[k] = -1;
    wait_for_nodes(&g, listener);
    close(listener);
    if (g.verdict == AGREED)
        *placement = place_node(&g, 0);
    answer_nodes(&g);
    free(g.fds);
    free(g.hellos);
    if (g.verdict != AGREED)
        fprintf(stderr, "loom launch: %s\n", g.text);
    return g.verdict == AGREED ? 0 : g.verdict == DISAGREED ? LOOM_EXIT_CONFIG : 1;
}

/* Node k > 0: tell node 0's launcher, and hear its verdict. */
static int join_node0(const char *host, int port, const node_hello *mine, double wait_s,
                      loom_launch_placement *placement)
{
    uint64_t deadline = loom_now_ns() + (uint64_t)(wait_s * 1e9);
    int pause_ms = 20, heard = 0;
    while (loom_now_ns() < deadline) {
        uint64_t try_deadline = loom_now_ns() + 2000000000ull;
        int fd = connect_to(host, port, try_deadline < deadline ? try_deadline : deadline);
        uint8_t head[8], tail[16];
        if (fd >= 0 && send_hello(fd, mine, deadline) == 0) {
            heard = 1;
            uint32_t verdict = 0, len = 0;
            char text[1024] = "";
            int answered = 0;
            if (move_bytes(fd, head, sizeof head, deadline, 0) == 0) {
                verdict = get_u32(head);
                len = get_u32(head + 4);
                answered = len < sizeof text && move_bytes(fd, text, len, deadline, 0) == 0 &&
                           (verdict != AGREED ||
                            move_bytes(fd, tail, sizeof tail, deadline, 0) == 0);
            }
            if (answered) {
                close(fd);
                if (verdict == AGREED) {
                    *placement = (loom_launch_placement){
                        .cpu_first = (int)get_u32(tail), .cpu_ranks = (int)get_u32(tail + 4),
                        .local_first = (int)get_u32(tail + 8),
                        .local_ranks = (int)get_u32(tail + 12)};
                    return 0;
                }
                fprintf(stderr, "loom launch: %s\n", text);
                return verdict == DISAGREED ? LOOM_EXIT_CONFIG : 1;
            }
        }
        if (fd >= 0)
            close(fd);
        /* nobody there yet, or something else answered: again */
        int left = ms_until(deadline);
        sleep_ms(pause_ms < left ? pause_ms : left);
        pause_ms = pause_ms * 2 > 500 ? 500 : pause_ms * 2;
    }
    if (heard)
        fprintf(stderr, "loom launch: node %u: node 0's launcher at %s:%d did not answer within "
                        "%g s (it answers once every node's launcher has joined)\n",
                mine->node_rank, host, port, wait_s);
    else
        fprintf(stderr, "loom launch: node %u found no launcher of node 0 at %s:%d within %g s "
                        "(start node 0's loom launch with --master %s:%d)\n",
                mine->node_rank, host, port, wait_s, host, port);
    return 1;
}

int loom_launch_nodes_agree(const char *host, int port, int nnodes, int node_rank, int n,
                            char *const *cmd, double timeout_s, loom_launch_placement *placement)
{
    node_hello mine = {.node_rank = (uint32_t)node_rank, .nnodes = (uint32_t)nnodes,
                       .n = (uint32_t)n};
    describe_machine(&mine.machine);
    if (!(mine.cmd = pack_command(cmd, &mine.len))) {
        fprintf(stderr, "loom launch: out of memory\n");
        return 1;
    }
    double wait_s = timeout_s > 0 && timeout_s < DEFAULT_WAIT_S ? timeout_s : DEFAULT_WAIT_S;
    int rc = node_rank == 0 ? gather_nodes(host, port, &mine, wait_s, placement)
                            : join_node0(host, port, &mine, wait_s, placement);
    free(mine.cmd);
    return rc;
}
