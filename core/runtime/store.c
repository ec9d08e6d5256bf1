/* The bootstrap key-value store (docs/architecture.md): rank 0 serves it from a
 * background thread and every rank, rank 0 included, is a client over TCP.
 * Plugins exchange their addresses through it (UCX worker addresses, the
 * NCCL unique id), so it must work before any communicator exists.
 *
 * Wire format, integers big-endian:
 *   request  op u8, 0 u8, key_len u16, wait_ms u32, value_len u64, key, value
 *   reply    status i32, value_len u64, value
 * A connection starts with HELLO (magic, version, rank, world size, open
 * generation, job id); each client has at most one request in flight.
 *
 * Waits (get, barrier) happen in the server, which parks the request until
 * the key appears or the slice ends. Clients ask in slices of at most
 * SLICE_MS so that the lock around a request, which lets progress threads
 * share one client, is never held for long. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "runtime/bootstrap.h"
#include "runtime/log.h"

#define STORE_MAGIC 0x4c4f4f4du /* "LOOM" */
#define STORE_VERSION 1u
#define MAX_KEY 255
#define MAX_VALUE (64u << 20)
#define REQUEST_HEADER 16
#define REPLY_HEADER 12
#define SLICE_MS 100
#define DEFAULT_PORT 29500
#define DEFAULT_TIMEOUT_S 30.0
/* Once the job failed (loom_store_job_failed), nobody waits a whole
 * timeout on the store any more: not a rank for a stopped rank 0's answer,
 * nor rank 0 for a stopped rank to close. The live ranks answer, say which
 * ranks did not arrive and close in far less. */
#define FAILED_WAIT_S 2.0
/* A HELLO answered with this status should be retried: the server there
 * belongs to an earlier (or later) opening of the store by rank 0. */
#define STATUS_RETRY LOOM_IN_PROGRESS

enum { OP_HELLO = 1, OP_PUT, OP_GET, OP_ADD, OP_BARRIER, OP_CLOSE };

/* ------------------------------------------------------------ helpers */

static void put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)(v >> 8), p[1] = (uint8_t)v; }
static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (24 - 8 * i));
}
static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (56 - 8 * i));
}
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static uint64_t get_u64(const uint8_t *p) { return (uint64_t)get_u32(p) << 32 | get_u32(p + 4); }

static uint64_t deadline_after(double seconds)
{
    if (seconds < 0)
        seconds = 0;
    if (seconds > 1e7)
        seconds = 1e7;
    return loom_now_ns() + (uint64_t)(seconds * 1e9);
}

/* Milliseconds until deadline, rounded up, for poll(). */
static int ms_until(uint64_t deadline)
{
    uint64_t now = loom_now_ns();
    if (now >= deadline)
        return 0;
    uint64_t ms = (deadline - now + 999999) / 1000000;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

static uint64_t fnv1a(const void *data, size_t len)
{
    const uint8_t *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

enum { IO_OK = 0, IO_TIMEOUT = -1, IO_ERROR = -2, IO_EOF = -3 };

/* Wait until fd is ready for events or deadline passes: 1 ready, 0 timeout,
 * -1 error. POLLHUP/POLLERR count as ready; the next send/recv reports. */
static int wait_fd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int r = poll(&p, 1, ms_until(deadline));
        if (r > 0)
            return 1;
        if (r == 0 && loom_now_ns() >= deadline)
            return 0;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

/* Sockets are non-blocking: every byte moves under a deadline. send never
 * writes to buf, so a const buffer to send may come in through it. */
static int move_all(int fd, uint8_t *buf, size_t len, uint64_t deadline, int sending)
{
    while (len > 0) {
        ssize_t n = sending ? send(fd, buf, len, MSG_NOSIGNAL) : recv(fd, buf, len, 0);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
        } else if (n == 0 && !sending) {
            return IO_EOF;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int r = wait_fd(fd, sending ? POLLOUT : POLLIN, deadline);
            if (r <= 0)
                return r == 0 ? IO_TIMEOUT : IO_ERROR;
        } else {
            return IO_ERROR;
        }
    }
    return IO_OK;
}

static int send_all(int fd, const void *buf, size_t len, uint64_t deadline)
{
    return move_all(fd, (uint8_t *)(uintptr_t)buf, len, deadline, 1);
}

static int recv_all(int fd, void *buf, size_t len, uint64_t deadline)
{
    return move_all(fd, buf, len, deadline, 0);
}

static void set_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* --------------------------------------------------------- the address */

typedef struct store_address {
    char host[256];
    int port;        /* 0: any free port, for a world of one */
    char shown[300]; /* "127.0.0.1:29500", for messages */
    char job[128];   /* the launcher's job identity, "" when none */
} store_address;

static int parse_port(const char *name, const char *text, int *port)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end || errno || v < 1 || v > 65535)
        return loom_fail(LOOM_ERR_INVALID,
                         "bootstrap: %s='%s' is not a port number (1-65535); fix or unset it", name,
                         text);
    *port = (int)v;
    return LOOM_OK;
}

/* The launcher's job identity: the same in every rank of one job and
 * different between jobs, so hashing it gives every job on a machine its
 * own store port with no settings. */
static void job_identity(char *job, size_t cap)
{
    const char *v;
    job[0] = '\0';
    if ((v = getenv("PMIX_NAMESPACE")) && *v)
        snprintf(job, cap, "pmix:%s", v);
    else if ((v = getenv("OMPI_MCA_orte_ess_jobid")) && *v)
        snprintf(job, cap, "ompi:%s", v);
    else if ((v = getenv("SLURM_JOB_ID")) && *v) {
        const char *step = getenv("SLURM_STEP_ID");
        snprintf(job, cap, "slurm:%s.%s", v, step ? step : "");
    }
}

int loom_store_job_port(void)
{
    char job[128];
    job_identity(job, sizeof job);
    return job[0] ? 20000 + (int)(fnv1a(job, strlen(job)) % 12000) : 0;
}

/* srun places task 0 on the first node of its step, so that node's name
 * reaches rank 0 from every node, as MASTER_ADDR would. */
static int slurm_store_host(const loom_launch_env *env, char *host, size_t cap)
{
    const char *list = getenv("SLURM_STEP_NODELIST");
    if (!loom_slurm_first_host(list, host, cap))
        return loom_fail(LOOM_ERR_INVALID,
                         "bootstrap: the Slurm step spans several nodes but SLURM_STEP_NODELIST "
                         "('%s') names none; set MASTER_ADDR to rank 0's host and MASTER_PORT to "
                         "a free port", list ? list : "");
    const char *node = getenv("SLURMD_NODENAME");
    if (env->rank == 0 && node && strcmp(node, host))
        return loom_fail(LOOM_ERR_INVALID,
                         "bootstrap: rank 0 runs on %s, not on the step's first node %s, where "
                         "the other ranks would look for it; set MASTER_ADDR to %s (and "
                         "MASTER_PORT to a free port)", node, host, node);
    /* as if the user had set it: what looks for rank 0's node after the
     * store (comm-mpi's choice of interface) finds it there too */
    setenv("MASTER_ADDR", host, 0);
    return LOOM_OK;
}

static int store_address_get(const loom_launch_env *env, store_address *a)
{
    const char *host = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
    const char *host_name = "MASTER_ADDR", *port_name = "MASTER_PORT";
    if (!host || !*host) {
        host = getenv("LOOM_STORE_ADDR");
        host_name = "LOOM_STORE_ADDR";
    }
    if (!port || !*port) {
        port = getenv("LOOM_STORE_PORT");
        port_name = "LOOM_STORE_PORT";
    }
    job_identity(a->job, sizeof a->job);
    if (host && *host) {
        if (strlen(host) >= sizeof a->host)
            return loom_fail(LOOM_ERR_INVALID, "bootstrap: %s is longer than %zu characters",
                             host_name, sizeof a->host - 1);
        snprintf(a->host, sizeof a->host, "%s", host);
    } else if (env->local_size < env->world_size && !strcmp(env->source, "SLURM")) {
        int rc = slurm_store_host(env, a->host, sizeof a->host);
        if (rc)
            return rc;
    } else {
        /* 127.0.0.1 reaches rank 0 only when every rank shares its machine;
         * say so now rather than time out on the other machines later. */
        if (env->local_size < env->world_size)
            return loom_fail(LOOM_ERR_INVALID,
                             "bootstrap: the job spans several machines (%d of its %d ranks "
                             "run on this one) and no store address is set; set MASTER_ADDR "
                             "to rank 0's host and MASTER_PORT to a free port",
                             env->local_size, env->world_size);
        snprintf(a->host, sizeof a->host, "127.0.0.1");
    }
    if (port && *port) {
        int rc = parse_port(port_name, port, &a->port);
        if (rc)
            return rc;
    } else if (a->job[0]) {
        /* 20000-31999: below Linux's ephemeral range (32768 up), where an
         * outgoing connection of this or another job could hold the port. */
        a->port = loom_store_job_port();
    } else {
        a->port = env->world_size == 1 ? 0 : DEFAULT_PORT;
    }
    snprintf(a->shown, sizeof a->shown, strchr(a->host, ':') ? "[%s]:%d" : "%s:%d", a->host,
             a->port);
    return LOOM_OK;
}

/* ---------------------------------------------------- the server's table */

typedef struct kv_entry {
    char *key; /* NULL: an empty slot */
    uint8_t *value;
    size_t len;
} kv_entry;

/* Open addressing with linear probing; nothing is ever deleted. */
typedef struct kv_table {
    kv_entry *slots;
    size_t cap, count;
} kv_table;

static kv_entry *kv_slot(const kv_table *t, const char *key)
{
    size_t i = (size_t)fnv1a(key, strlen(key)) & (t->cap - 1);
    while (t->slots[i].key && strcmp(t->slots[i].key, key))
        i = (i + 1) & (t->cap - 1);
    return &t->slots[i];
}

static kv_entry *kv_find(const kv_table *t, const char *key)
{
    if (!t->cap)
        return NULL;
    kv_entry *e = kv_slot(t, key);
    return e->key ? e : NULL;
}

static int kv_set(kv_table *t, const char *key, const void *value, size_t len)
{
    if (2 * (t->count + 1) > t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 64;
        kv_table bigger = {calloc(cap, sizeof(kv_entry)), cap, t->count};
        if (!bigger.slots)
            return LOOM_ERR_NO_MEMORY;
        for (size_t i = 0; i < t->cap; i++)
            if (t->slots[i].key)
                *kv_slot(&bigger, t->slots[i].key) = t->slots[i];
        free(t->slots);
        *t = bigger;
    }
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        return LOOM_ERR_NO_MEMORY;
    memcpy(copy, value, len);
    kv_entry *e = kv_slot(t, key);
    if (!e->key) {
        if (!(e->key = strdup(key))) {
            free(copy);
            return LOOM_ERR_NO_MEMORY;
        }
        t->count++;
    }
    free(e->value);
    e->value = copy;
    e->len = len;
    return LOOM_OK;
}

static void kv_free(kv_table *t)
{
    for (size_t i = 0; i < t->cap; i++) {
        free(t->slots[i].key);
        free(t->slots[i].value);
    }
    free(t->slots);
    memset(t, 0, sizeof *t);
}

/* Integers (add, barrier arrivals) are stored as decimal text, so a get on
 * such a key reads something meaningful. 0: not an integer. */
static int kv_int(const kv_entry *e, int64_t *out)
{
    char text[32];
    if (!e) {
        *out = 0;
        return 1;
    }
    if (e->len == 0 || e->len >= sizeof text)
        return 0;
    memcpy(text, e->value, e->len);
    text[e->len] = '\0';
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (*end || errno)
        return 0;
    *out = v;
    return 1;
}

static int kv_set_int(kv_table *t, const char *key, int64_t v)
{
    char text[32];
    int n = snprintf(text, sizeof text, "%lld", (long long)v);
    return kv_set(t, key, text, (size_t)n);
}

/* ------------------------------------------------------------ the server */

typedef struct server_conn {
    int fd;
    int rank; /* -1 until its HELLO */
    int dead; /* to be closed at the end of this round */
    uint8_t *in;
    size_t in_len, in_cap;
} server_conn;

/* A request parked until its key appears, its barrier completes or its
 * slice ends. */
typedef struct server_waiter {
    server_conn *conn;
    int op;
    char key[MAX_KEY + 1];
    int64_t generation; /* barriers: the arrival this waiter waits for */
    uint64_t deadline;
} server_waiter;

enum { RANK_ABSENT = 0, RANK_PRESENT, RANK_LEFT };

typedef struct store_server {
    pthread_t thread;
    int listen_fd;
    int wake[2]; /* rank 0's close writes here to begin the shutdown */
    int world_size;
    uint32_t generation;
    char job[128];
    char shown[300];
    double timeout_s;
    kv_table table;
    server_conn **conns;
    int nconns, cap_conns;
    server_waiter *waiters;
    int nwaiters, cap_waiters;
    unsigned char *rank_state;
    int stopping;
    uint64_t stop_deadline;
    atomic_uint_least64_t failed_at; /* loom_now_ns of the job's failure; 0: none */
} store_server;

static void server_reply(store_server *sv, server_conn *c, int status, const void *v1, size_t n1,
                         const void *v2, size_t n2)
{
    if (c->dead)
        return;
    size_t total = REPLY_HEADER + n1 + n2;
    uint8_t small[512];
    uint8_t *msg = total <= sizeof small ? small : malloc(total);
    if (!msg) {
        c->dead = 1;
        return;
    }
    put_u32(msg, (uint32_t)status);
    put_u64(msg + 4, n1 + n2);
    if (n1)
        memcpy(msg + REPLY_HEADER, v1, n1);
    if (n2)
        memcpy(msg + REPLY_HEADER + n1, v2, n2);
    /* The client is reading (one request in flight), so this only waits
     * for a slow network; a client that stopped reading is dropped. */
    if (send_all(c->fd, msg, total, deadline_after(sv->timeout_s)) != IO_OK)
        c->dead = 1;
    if (msg != small)
        free(msg);
}

static void server_reply_text(store_server *sv, server_conn *c, int status, const char *text)
{
    server_reply(sv, c, status, text, strlen(text), NULL, 0);
}

static void barrier_key(char *buf, size_t cap, const char *name, int rank)
{
    /* '#' cannot start a key a client sends (keys are checked), so the
     * arrival keys never collide with a plugin's. */
    snprintf(buf, cap, "#barrier/%s/%d", name, rank);
}

static int64_t barrier_arrivals(const store_server *sv, const char *name, int rank)
{
    char key[MAX_KEY + 32];
    int64_t v = 0;
    barrier_key(key, sizeof key, name, rank);
    if (!kv_int(kv_find(&sv->table, key), &v))
        v = 0;
    return v;
}

/* Answer a barrier waiter if its barrier is decided: every rank arrived
 * (OK), or a rank that has not arrived left the store and never will
 * (REMOTE); with final set, a timeout names the missing ranks. 1 when
 * answered. */
static int barrier_answer(store_server *sv, server_conn *c, const char *name, int64_t generation,
                          int final)
{
    int *missing = malloc(sizeof(int) * (size_t)sv->world_size);
    int *left = malloc(sizeof(int) * (size_t)sv->world_size);
    if (!missing || !left) {
        free(missing);
        free(left);
        c->dead = 1;
        return 1;
    }
    int nmissing = 0, nleft = 0;
    for (int r = 0; r < sv->world_size; r++) {
        if (barrier_arrivals(sv, name, r) < generation) {
            missing[nmissing++] = r;
            if (sv->rank_state[r] == RANK_LEFT)
                left[nleft++] = r;
        }
    }
    uint8_t gen[8];
    put_u64(gen, (uint64_t)generation);
    char text[512];
    int answered = 1;
    if (nmissing == 0) {
        server_reply(sv, c, LOOM_OK, gen, 8, NULL, 0);
    } else if (nleft > 0) {
        loom_format_ranks(text, sizeof text, left, nleft);
        size_t n = strlen(text);
        snprintf(text + n, sizeof text - n, " left without arriving (%s)",
                 nleft == 1 ? "it finished or died" : "they finished or died");
        server_reply(sv, c, LOOM_ERR_REMOTE, gen, 8, text, strlen(text));
    } else if (final) {
        loom_format_ranks(text, sizeof text, missing, nmissing);
        server_reply(sv, c, LOOM_ERR_TIMEOUT, gen, 8, text, strlen(text));
    } else {
        answered = 0;
    }
    free(missing);
    free(left);
    return answered;
}

/* A get's slice ended without its key. The ranks that left are a likely
 * reason the key never comes, so the reply names them. */
static void get_timed_out(store_server *sv, server_conn *c)
{
    int *left = malloc(sizeof(int) * (size_t)sv->world_size);
    int nleft = 0;
    for (int r = 0; left && r < sv->world_size; r++)
        if (sv->rank_state[r] == RANK_LEFT)
            left[nleft++] = r;
    char text[512] = "";
    if (nleft)
        loom_format_ranks(text, sizeof text, left, nleft);
    free(left);
    server_reply(sv, c, LOOM_ERR_TIMEOUT, text, strlen(text), NULL, 0);
}

static void waiter_remove(store_server *sv, int i) { sv->waiters[i] = sv->waiters[--sv->nwaiters]; }

static int waiter_add(store_server *sv, server_conn *c, int op, const char *key, int64_t generation,
                      uint32_t wait_ms)
{
    if (sv->nwaiters == sv->cap_waiters) {
        int cap = sv->cap_waiters ? 2 * sv->cap_waiters : 16;
        server_waiter *w = realloc(sv->waiters, sizeof *w * (size_t)cap);
        if (!w)
            return LOOM_ERR_NO_MEMORY;
        sv->waiters = w;
        sv->cap_waiters = cap;
    }
    server_waiter *w = &sv->waiters[sv->nwaiters++];
    w->conn = c;
    w->op = op;
    snprintf(w->key, sizeof w->key, "%s", key);
    w->generation = generation;
    w->deadline = loom_now_ns() + (uint64_t)wait_ms * 1000000ull;
    return LOOM_OK;
}

/* A key changed: answer the gets waiting for it. */
static void wake_getters(store_server *sv, const char *key)
{
    const kv_entry *e = kv_find(&sv->table, key);
    for (int i = 0; e && i < sv->nwaiters;) {
        server_waiter *w = &sv->waiters[i];
        if (w->op == OP_GET && !strcmp(w->key, key)) {
            server_reply(sv, w->conn, LOOM_OK, e->value, e->len, NULL, 0);
            waiter_remove(sv, i);
        } else {
            i++;
        }
    }
}

/* An arrival or a departure: answer the barriers it decides (all of them
 * when name is NULL). */
static void wake_barriers(store_server *sv, const char *name)
{
    for (int i = 0; i < sv->nwaiters;) {
        server_waiter *w = &sv->waiters[i];
        if (w->op == OP_BARRIER && (!name || !strcmp(w->key, name)) &&
            barrier_answer(sv, w->conn, w->key, w->generation, 0))
            waiter_remove(sv, i);
        else
            i++;
    }
}

static void handle_hello(store_server *sv, server_conn *c, const uint8_t *v, size_t len)
{
    if (len < 20 || get_u32(v) != STORE_MAGIC) {
        c->dead = 1; /* not a loom client: a port scanner, another service */
        return;
    }
    uint32_t version = get_u32(v + 4), rank = get_u32(v + 8), world = get_u32(v + 12),
             generation = get_u32(v + 16);
    char job[128];
    size_t job_len = len - 20 < sizeof job - 1 ? len - 20 : sizeof job - 1;
    memcpy(job, v + 20, job_len);
    job[job_len] = '\0';
    char text[1024];
    if (version != STORE_VERSION) {
        snprintf(text, sizeof text,
                 "the store at %s speaks protocol %u, this rank %u: run one loom build on "
                 "every rank",
                 sv->shown, STORE_VERSION, version);
        server_reply_text(sv, c, LOOM_ERR_INVALID, text);
    } else if (strcmp(job, sv->job) || (int)world != sv->world_size) {
        snprintf(text, sizeof text,
                 "the store at %s belongs to another job (it serves %d ranks of job '%s'; this "
                 "rank is one of %u in job '%s'); set MASTER_PORT to a free port",
                 sv->shown, sv->world_size, sv->job, world, job);
        server_reply_text(sv, c, LOOM_ERR_INVALID, text);
    } else if (generation != sv->generation || rank >= world) {
        server_reply(sv, c, STATUS_RETRY, NULL, 0, NULL, 0);
    } else if (sv->rank_state[rank] == RANK_PRESENT) {
        snprintf(text, sizeof text,
                 "two processes claim rank %u in the store at %s; check the launcher's "
                 "environment (LOOM_RANK, OMPI_COMM_WORLD_RANK, ...)",
                 rank, sv->shown);
        server_reply_text(sv, c, LOOM_ERR_INVALID, text);
    } else {
        c->rank = (int)rank;
        sv->rank_state[rank] = RANK_PRESENT;
        server_reply(sv, c, LOOM_OK, NULL, 0, NULL, 0);
    }
}

static void handle_request(store_server *sv, server_conn *c, int op, const char *key,
                           uint32_t wait_ms, const uint8_t *v, size_t len)
{
    if (op == OP_HELLO) {
        handle_hello(sv, c, v, len);
        return;
    }
    if (c->rank < 0) {
        c->dead = 1;
        return;
    }
    if (op == OP_PUT) {
        int rc = kv_set(&sv->table, key, v, len);
        server_reply(sv, c, rc, NULL, 0, NULL, 0);
        if (rc == LOOM_OK)
            wake_getters(sv, key);
    } else if (op == OP_GET) {
        const kv_entry *e = kv_find(&sv->table, key);
        if (e)
            server_reply(sv, c, LOOM_OK, e->value, e->len, NULL, 0);
        else if (wait_ms == 0 || waiter_add(sv, c, OP_GET, key, 0, wait_ms))
            get_timed_out(sv, c);
    } else if (op == OP_ADD) {
        int64_t old, sum;
        if (len != 8) {
            c->dead = 1;
        } else if (!kv_int(kv_find(&sv->table, key), &old)) {
            server_reply_text(sv, c, LOOM_ERR_INVALID,
                              "the key holds a value that is not an integer");
        } else if (__builtin_add_overflow(old, (int64_t)get_u64(v), &sum)) {
            server_reply_text(sv, c, LOOM_ERR_INVALID, "the sum overflows 64 bits");
        } else if (kv_set_int(&sv->table, key, sum)) {
            server_reply_text(sv, c, LOOM_ERR_NO_MEMORY, "rank 0 ran out of memory");
        } else {
            uint8_t result[8];
            put_u64(result, (uint64_t)sum);
            server_reply(sv, c, LOOM_OK, result, 8, NULL, 0);
            wake_getters(sv, key);
        }
    } else if (op == OP_BARRIER) {
        /* value: the generation to wait for, 0 to arrive (the first slice) */
        if (len != 8) {
            c->dead = 1;
            return;
        }
        int64_t generation = (int64_t)get_u64(v);
        if (generation == 0) {
            char akey[MAX_KEY + 32];
            barrier_key(akey, sizeof akey, key, c->rank);
            generation = barrier_arrivals(sv, key, c->rank) + 1;
            if (kv_set_int(&sv->table, akey, generation)) {
                server_reply_text(sv, c, LOOM_ERR_NO_MEMORY, "rank 0 ran out of memory");
                return;
            }
            wake_barriers(sv, key);
        }
        if (!barrier_answer(sv, c, key, generation, wait_ms == 0) &&
            waiter_add(sv, c, OP_BARRIER, key, generation, wait_ms))
            barrier_answer(sv, c, key, generation, 1);
    } else if (op == OP_CLOSE) {
        sv->rank_state[c->rank] = RANK_LEFT;
        server_reply(sv, c, LOOM_OK, NULL, 0, NULL, 0);
        wake_barriers(sv, NULL);
    } else {
        c->dead = 1;
    }
}

/* Read what the connection has and serve every complete request in it. */
static void conn_read(store_server *sv, server_conn *c)
{
    if (c->in_cap - c->in_len < 65536) {
        size_t cap = c->in_cap ? c->in_cap : 65536;
        while (cap - c->in_len < 65536)
            cap *= 2;
        uint8_t *in = realloc(c->in, cap);
        if (!in) {
            c->dead = 1;
            return;
        }
        c->in = in;
        c->in_cap = cap;
    }
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) {
        c->dead = 1;
        return;
    }
    if (n < 0)
        return;
    c->in_len += (size_t)n;
    size_t used = 0;
    while (!c->dead && c->in_len - used >= REQUEST_HEADER) {
        const uint8_t *h = c->in + used;
        int op = h[0];
        size_t key_len = get_u16(h + 2);
        uint32_t wait_ms = get_u32(h + 4);
        uint64_t value_len = get_u64(h + 8);
        if (key_len > MAX_KEY || value_len > MAX_VALUE) {
            c->dead = 1;
            break;
        }
        size_t total = REQUEST_HEADER + key_len + (size_t)value_len;
        if (c->in_len - used < total) {
            if (c->in_cap < total + used) {
                uint8_t *in = realloc(c->in, total + used);
                if (!in) {
                    c->dead = 1;
                    break;
                }
                c->in = in;
                c->in_cap = total + used;
            }
            break;
        }
        char key[MAX_KEY + 1];
        memcpy(key, h + REQUEST_HEADER, key_len);
        key[key_len] = '\0';
        handle_request(sv, c, op, key, wait_ms, h + REQUEST_HEADER + key_len, (size_t)value_len);
        used += total;
    }
    memmove(c->in, c->in + used, c->in_len - used);
    c->in_len -= used;
}

static void server_accept(store_server *sv)
{
    for (;;) {
        int fd = accept4(sv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return; /* EAGAIN, or a connection that went away already */
        server_conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            return;
        }
        if (sv->nconns == sv->cap_conns) {
            int cap = sv->cap_conns ? 2 * sv->cap_conns : 16;
            server_conn **conns = realloc(sv->conns, sizeof *conns * (size_t)cap);
            if (!conns) {
                free(c);
                close(fd);
                return;
            }
            sv->conns = conns;
            sv->cap_conns = cap;
        }
        set_nodelay(fd);
        c->fd = fd;
        c->rank = -1;
        sv->conns[sv->nconns++] = c;
    }
}

static void conn_free(server_conn *c)
{
    close(c->fd);
    free(c->in);
    free(c);
}

/* Close the connections marked dead; a rank whose connection ends has
 * left, which may decide barriers that wait for it. */
static void server_sweep(store_server *sv)
{
    int departures = 0;
    for (int i = 0; i < sv->nconns;) {
        server_conn *c = sv->conns[i];
        if (!c->dead) {
            i++;
            continue;
        }
        for (int w = 0; w < sv->nwaiters;) {
            if (sv->waiters[w].conn == c)
                waiter_remove(sv, w);
            else
                w++;
        }
        if (c->rank >= 0) {
            sv->rank_state[c->rank] = RANK_LEFT;
            departures++;
        }
        conn_free(c);
        sv->conns[i] = sv->conns[--sv->nconns];
    }
    if (departures)
        wake_barriers(sv, NULL);
}

static void server_expire(store_server *sv)
{
    uint64_t now = loom_now_ns();
    for (int i = 0; i < sv->nwaiters;) {
        server_waiter *w = &sv->waiters[i];
        if (w->deadline > now) {
            i++;
            continue;
        }
        if (w->op == OP_GET)
            get_timed_out(sv, w->conn);
        else
            barrier_answer(sv, w->conn, w->key, w->generation, 1);
        waiter_remove(sv, i);
    }
}

static int server_all_left(const store_server *sv)
{
    for (int r = 0; r < sv->world_size; r++)
        if (sv->rank_state[r] != RANK_LEFT)
            return 0;
    return 1;
}

/* Until when rank 0's close waits for the others to close: a clean exit
 * gives them the store's timeout, since they may still be reading from it;
 * in a failed job the live ranks fail about when rank 0 did and report
 * within FAILED_WAIT_S of it, so the wait ends then. */
static uint64_t server_close_deadline(const store_server *sv)
{
    uint64_t deadline = deadline_after(sv->timeout_s);
    uint64_t failed_at = atomic_load(&sv->failed_at);
    if (failed_at && failed_at + (uint64_t)(FAILED_WAIT_S * 1e9) < deadline)
        deadline = failed_at + (uint64_t)(FAILED_WAIT_S * 1e9);
    return deadline;
}

static void *server_main(void *arg)
{
    store_server *sv = arg;
    struct pollfd *fds = NULL;
    int cap_fds = 0;
    for (;;) {
        if (sv->stopping && (server_all_left(sv) || loom_now_ns() >= sv->stop_deadline))
            break;
        uint64_t next = loom_now_ns() + 1000000000ull;
        for (int i = 0; i < sv->nwaiters; i++)
            if (sv->waiters[i].deadline < next)
                next = sv->waiters[i].deadline;
        if (sv->stopping && sv->stop_deadline < next)
            next = sv->stop_deadline;

        int nfds = 2 + sv->nconns;
        if (nfds > cap_fds) {
            struct pollfd *more = realloc(fds, sizeof *fds * (size_t)nfds * 2);
            if (!more) {
                sleep_ms(10);
                continue;
            }
            fds = more;
            cap_fds = nfds * 2;
        }
        fds[0] = (struct pollfd){.fd = sv->wake[0], .events = POLLIN};
        fds[1] = (struct pollfd){.fd = sv->listen_fd, .events = POLLIN};
        for (int i = 0; i < sv->nconns; i++)
            fds[2 + i] = (struct pollfd){.fd = sv->conns[i]->fd, .events = POLLIN};
        int ready = poll(fds, (nfds_t)nfds, ms_until(next));
        if (ready < 0 && errno != EINTR)
            sleep_ms(10);
        if (ready > 0) {
            if (fds[0].revents) {
                char byte;
                if (read(sv->wake[0], &byte, 1) >= 0 && !sv->stopping) {
                    sv->stopping = 1;
                    sv->stop_deadline = server_close_deadline(sv);
                }
            }
            /* Connections first: accepting appends to conns, which would
             * shift them against fds. */
            for (int i = 0; i < nfds - 2; i++)
                if (fds[2 + i].revents)
                    conn_read(sv, sv->conns[i]);
            if (fds[1].revents)
                server_accept(sv);
        }
        server_expire(sv);
        server_sweep(sv);
    }
    if (!server_all_left(sv)) {
        int *still = malloc(sizeof(int) * (size_t)sv->world_size);
        int n = 0;
        for (int r = 0; still && r < sv->world_size; r++)
            if (sv->rank_state[r] != RANK_LEFT)
                still[n++] = r;
        char ranks[256] = "some ranks";
        if (still)
            loom_format_ranks(ranks, sizeof ranks, still, n);
        /* After a failure the ranks that did not close are the ones the
         * failure already named (stopped or gone): nothing new to say. */
        if (atomic_load(&sv->failed_at))
            loom_log(LOOM_LOG_DEBUG, "bootstrap: rank 0 exits without waiting longer for %s",
                     ranks);
        else
            loom_log(LOOM_LOG_WARN,
                     "rank 0 finished, but %s did not finish within %g s (comm.timeout_s) "
                     "after it: stopped, hung or unreachable; rank 0 exits without %s",
                     ranks, sv->timeout_s, n == 1 ? "it" : "them");
        free(still);
    }
    free(fds);
    return NULL;
}

static void server_free(store_server *sv)
{
    for (int i = 0; i < sv->nconns; i++)
        conn_free(sv->conns[i]);
    free(sv->conns);
    free(sv->waiters);
    free(sv->rank_state);
    kv_free(&sv->table);
    if (sv->listen_fd >= 0)
        close(sv->listen_fd);
    if (sv->wake[0] >= 0)
        close(sv->wake[0]);
    if (sv->wake[1] >= 0)
        close(sv->wake[1]);
    free(sv);
}

static int is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)sa)->sin6_addr);
    return 0;
}

/* Bind and listen in the caller's thread, so that a port in use is an
 * error of loom_store_open and not a silent thread failure. A loopback
 * address is bound as is; any other is served on every interface, since a
 * host name often resolves to another address on rank 0's machine (Debian
 * maps it to 127.0.1.1) than on the others. */
static int server_listen(store_address *a, int *fd_out)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
    int gai = getaddrinfo(a->host, NULL, &hints, &ai);
    if (gai)
        return loom_fail(LOOM_ERR_INVALID,
                         "bootstrap: rank 0 cannot resolve the store address '%s': %s; set "
                         "MASTER_ADDR to rank 0's host",
                         a->host, gai_strerror(gai));
    struct sockaddr_storage addr;
    socklen_t addr_len = (socklen_t)ai->ai_addrlen;
    memcpy(&addr, ai->ai_addr, ai->ai_addrlen);
    int loopback = is_loopback(ai->ai_addr);
    freeaddrinfo(ai);
    if (!loopback && addr.ss_family == AF_INET)
        ((struct sockaddr_in *)&addr)->sin_addr.s_addr = htonl(INADDR_ANY);
    if (!loopback && addr.ss_family == AF_INET6)
        ((struct sockaddr_in6 *)&addr)->sin6_addr = in6addr_any;
    if (addr.ss_family == AF_INET)
        ((struct sockaddr_in *)&addr)->sin_port = htons((uint16_t)a->port);
    else
        ((struct sockaddr_in6 *)&addr)->sin6_port = htons((uint16_t)a->port);

    int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return loom_fail(LOOM_ERR_INTERNAL, "bootstrap: rank 0 cannot create a socket: %s",
                         strerror(errno));
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (addr.ss_family == AF_INET6 && !loopback)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (bind(fd, (struct sockaddr *)&addr, addr_len) < 0 || listen(fd, SOMAXCONN) < 0) {
        int err = errno;
        close(fd);
        return loom_fail(LOOM_ERR_INVALID,
                         "bootstrap: rank 0 could not serve the store on %s: %s (set "
                         "MASTER_PORT to a free port)",
                         a->shown, strerror(err));
    }
    if (a->port == 0) {
        socklen_t len = sizeof addr;
        getsockname(fd, (struct sockaddr *)&addr, &len);
        a->port = ntohs(addr.ss_family == AF_INET ? ((struct sockaddr_in *)&addr)->sin_port
                                                  : ((struct sockaddr_in6 *)&addr)->sin6_port);
        snprintf(a->shown, sizeof a->shown, strchr(a->host, ':') ? "[%s]:%d" : "%s:%d", a->host,
                 a->port);
    }
    *fd_out = fd;
    return LOOM_OK;
}

static int server_start(store_address *a, const loom_launch_env *env, uint32_t generation,
                        double timeout_s, store_server **out)
{
    store_server *sv = calloc(1, sizeof *sv);
    if (!sv)
        return loom_fail(LOOM_ERR_NO_MEMORY, "bootstrap: out of memory");
    sv->listen_fd = sv->wake[0] = sv->wake[1] = -1;
    sv->world_size = env->world_size;
    sv->generation = generation;
    sv->timeout_s = timeout_s;
    snprintf(sv->job, sizeof sv->job, "%s", a->job);
    sv->rank_state = calloc((size_t)env->world_size, 1);
    if (!sv->rank_state) {
        server_free(sv);
        return loom_fail(LOOM_ERR_NO_MEMORY, "bootstrap: out of memory");
    }
    int rc = server_listen(a, &sv->listen_fd);
    if (rc) {
        server_free(sv);
        return rc;
    }
    snprintf(sv->shown, sizeof sv->shown, "%s", a->shown);
    if (pipe2(sv->wake, O_CLOEXEC) < 0) {
        rc = loom_fail(LOOM_ERR_INTERNAL, "bootstrap: pipe: %s", strerror(errno));
        server_free(sv);
        return rc;
    }
    /* Signals belong to the application's threads, never to the server. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&sv->thread, NULL, server_main, sv);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) {
        server_free(sv);
        return loom_fail(LOOM_ERR_INTERNAL, "bootstrap: cannot start the store thread: %s",
                         strerror(err));
    }
    *out = sv;
    return LOOM_OK;
}

static void server_stop(store_server *sv)
{
    char byte = 1;
    while (write(sv->wake[1], &byte, 1) < 0 && errno == EINTR) {
    }
    pthread_join(sv->thread, NULL);
    server_free(sv);
}

/* ------------------------------------------------------------ the client */

struct loom_store {
    pthread_mutex_t lock; /* one request in flight per connection */
    int fd;
    int rank, world_size;
    double timeout_s;
    store_address addr;
    int broken_status;    /* once the connection is unusable: why, for every */
    char broken[512];     /* later call */
    store_server *server; /* rank 0 only */
    atomic_int job_failed;
};

typedef struct store_reply {
    int status;
    uint8_t *value; /* malloc'd, NUL-terminated for text */
    size_t len;
} store_reply;

static const char *io_reason(int io, int err)
{
    if (io == IO_EOF)
        return "connection closed";
    return strerror(err);
}

/* How long a reply may take beyond the time the server may park the
 * request: the store's timeout, or only a moment once the job failed. */
static double reply_wait(const loom_store *s)
{
    if (atomic_load(&s->job_failed) && s->timeout_s > FAILED_WAIT_S)
        return FAILED_WAIT_S;
    return s->timeout_s;
}

/* One request and its reply. wait_ms is how long the server may park it;
 * the reply must come within that plus reply_wait. */
static int client_call(loom_store *s, int op, const char *key, uint32_t wait_ms, const void *value,
                       size_t len, store_reply *reply, const char *what)
{
    memset(reply, 0, sizeof *reply);
    pthread_mutex_lock(&s->lock);
    if (s->broken_status) {
        int rc = loom_fail(s->broken_status, "%s", s->broken);
        pthread_mutex_unlock(&s->lock);
        return rc;
    }
    size_t key_len = key ? strlen(key) : 0;
    size_t total = REQUEST_HEADER + key_len + len;
    uint8_t small[1024];
    uint8_t *msg = total <= sizeof small ? small : malloc(total);
    if (!msg) {
        pthread_mutex_unlock(&s->lock);
        return loom_fail(LOOM_ERR_NO_MEMORY, "bootstrap: out of memory for %s", what);
    }
    msg[0] = (uint8_t)op;
    msg[1] = 0;
    put_u16(msg + 2, (uint16_t)key_len);
    put_u32(msg + 4, wait_ms);
    put_u64(msg + 8, len);
    if (key_len)
        memcpy(msg + REQUEST_HEADER, key, key_len);
    if (len)
        memcpy(msg + REQUEST_HEADER + key_len, value, len);

    double patience = reply_wait(s);
    uint64_t deadline = deadline_after(wait_ms / 1000.0 + patience);
    int io = send_all(s->fd, msg, total, deadline);
    int err = errno;
    if (msg != small)
        free(msg);
    uint8_t header[REPLY_HEADER];
    if (io == IO_OK) {
        io = recv_all(s->fd, header, sizeof header, deadline);
        err = errno;
    }
    if (io == IO_OK) {
        reply->status = (int32_t)get_u32(header);
        reply->len = get_u64(header + 4);
        if (reply->len > MAX_VALUE + 512) {
            io = IO_ERROR;
            err = EPROTO;
        } else if (!(reply->value = malloc(reply->len + 1))) {
            io = IO_ERROR;
            err = ENOMEM;
        } else {
            io = recv_all(s->fd, reply->value, reply->len, deadline);
            err = errno;
            reply->value[reply->len] = '\0';
        }
    }
    if (io != IO_OK) {
        free(reply->value);
        reply->value = NULL;
        if (io == IO_TIMEOUT) {
            s->broken_status = LOOM_ERR_TIMEOUT;
            snprintf(s->broken, sizeof s->broken,
                     "bootstrap: the store served by rank 0 at %s did not answer %s within "
                     "%g s (is rank 0 stuck?)",
                     s->addr.shown, what, patience + wait_ms / 1000.0);
        } else {
            s->broken_status = LOOM_ERR_REMOTE;
            snprintf(s->broken, sizeof s->broken,
                     "bootstrap: lost the store served by rank 0 (%s during %s; did rank 0 "
                     "exit or fail?)",
                     io_reason(io, err), what);
        }
        /* The stream is out of step now; no later request may use it. */
        shutdown(s->fd, SHUT_RDWR);
        int rc = loom_fail(s->broken_status, "%s", s->broken);
        pthread_mutex_unlock(&s->lock);
        return rc;
    }
    pthread_mutex_unlock(&s->lock);
    return LOOM_OK;
}

/* One attempt: connect and say hello. LOOM_OK, STATUS_RETRY (nobody there
 * yet, or rank 0's previous store), or an error recorded for good. */
static int client_try(loom_store *s, uint32_t generation, uint64_t deadline)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai;
    char port[16];
    snprintf(port, sizeof port, "%d", s->addr.port);
    int gai = getaddrinfo(s->addr.host, port, &hints, &ai);
    if (gai == EAI_AGAIN)
        return STATUS_RETRY;
    if (gai)
        return loom_fail(LOOM_ERR_INVALID,
                         "bootstrap: cannot resolve the store address '%s': %s; set MASTER_ADDR "
                         "to rank 0's host",
                         s->addr.host, gai_strerror(gai));
    int fd = -1;
    for (struct addrinfo *p = ai; p && fd < 0; p = p->ai_next) {
        fd = socket(p->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        int ok = connect(fd, p->ai_addr, p->ai_addrlen) == 0;
        if (!ok && errno == EINPROGRESS && wait_fd(fd, POLLOUT, deadline) > 0) {
            int err = 0;
            socklen_t err_len = sizeof err;
            ok = getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) == 0 && err == 0;
        }
        if (!ok) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return STATUS_RETRY;
    set_nodelay(fd);
    s->fd = fd;

    uint8_t hello[20 + sizeof s->addr.job];
    size_t job_len = strlen(s->addr.job);
    put_u32(hello, STORE_MAGIC);
    put_u32(hello + 4, STORE_VERSION);
    put_u32(hello + 8, (uint32_t)s->rank);
    put_u32(hello + 12, (uint32_t)s->world_size);
    put_u32(hello + 16, generation);
    memcpy(hello + 20, s->addr.job, job_len);
    store_reply reply;
    int rc = client_call(s, OP_HELLO, NULL, 0, hello, 20 + job_len, &reply, "hello");
    if (rc == LOOM_OK && reply.status == LOOM_OK) {
        free(reply.value);
        return LOOM_OK;
    }
    if (rc == LOOM_OK && reply.status != STATUS_RETRY)
        rc = loom_fail(reply.status, "bootstrap: rank %d: %s", s->rank, (char *)reply.value);
    else
        rc = STATUS_RETRY; /* a store going away under us: try again */
    free(reply.value);
    close(fd);
    s->fd = -1;
    s->broken_status = 0;
    s->broken[0] = '\0';
    return rc;
}

static int client_connect(loom_store *s, uint32_t generation, double timeout_s)
{
    uint64_t deadline = deadline_after(timeout_s);
    int pause_ms = 10;
    for (;;) {
        int rc = client_try(s, generation, deadline);
        if (rc != STATUS_RETRY)
            return rc;
        if (loom_now_ns() >= deadline)
            break;
        int left = ms_until(deadline);
        sleep_ms(pause_ms < left ? pause_ms : left);
        pause_ms = pause_ms * 2 > 250 ? 250 : pause_ms * 2;
    }
    return loom_fail(LOOM_ERR_TIMEOUT,
                     "bootstrap: could not reach the store at %s served by rank 0 after %g s "
                     "(is rank 0 running? set MASTER_ADDR/MASTER_PORT)",
                     s->addr.shown, timeout_s);
}

int loom_store_open(const loom_launch_env *env, double timeout_s, loom_store **out)
{
    /* Every opening in a process gets the next generation, the same number
     * on every rank, so a rank that reopens quickly is not served by rank
     * 0's previous store while that one waits for the slowest ranks. */
    static atomic_uint openings;
    *out = NULL;
    if (!env || env->world_size < 1 || env->rank < 0 || env->rank >= env->world_size)
        return loom_fail(LOOM_ERR_INVALID, "bootstrap: loom_store_open needs a valid launch env");
    if (!(timeout_s > 0))
        timeout_s = DEFAULT_TIMEOUT_S;
    uint32_t generation = atomic_fetch_add(&openings, 1) + 1;

    loom_store *s = calloc(1, sizeof *s);
    if (!s)
        return loom_fail(LOOM_ERR_NO_MEMORY, "bootstrap: out of memory");
    s->fd = -1;
    s->rank = env->rank;
    s->world_size = env->world_size;
    s->timeout_s = timeout_s;
    pthread_mutex_init(&s->lock, NULL);
    int rc = store_address_get(env, &s->addr);
    if (rc == LOOM_OK && env->rank == 0)
        rc = server_start(&s->addr, env, generation, timeout_s, &s->server);
    if (rc == LOOM_OK)
        rc = client_connect(s, generation, timeout_s);
    if (rc) {
        loom_store_close(s);
        return rc;
    }
    *out = s;
    return LOOM_OK;
}

void loom_store_job_failed(loom_store *s)
{
    if (!s)
        return;
    atomic_store(&s->job_failed, 1);
    uint_least64_t none = 0;
    if (s->server)
        atomic_compare_exchange_strong(&s->server->failed_at, &none, loom_now_ns());
}

void loom_store_close(loom_store *s)
{
    if (!s)
        return;
    if (s->fd >= 0) {
        store_reply reply;
        if (client_call(s, OP_CLOSE, NULL, 0, NULL, 0, &reply, "close") == LOOM_OK)
            free(reply.value);
        close(s->fd);
    }
    if (s->server)
        server_stop(s->server);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* A request's key checked, and the request named for messages in what:
 * "get 'key'". */
static int check_key(const char *op, const char *key, char *what, size_t cap)
{
    snprintf(what, cap, "%s '%s'", op, key ? key : "");
    if (!key || !*key)
        return loom_fail(LOOM_ERR_INVALID, "bootstrap: %s: the key is empty", op);
    if (strlen(key) > MAX_KEY)
        return loom_fail(LOOM_ERR_INVALID,
                         "bootstrap: %s: the key '%.40s...' is longer than %d bytes", op, key,
                         MAX_KEY);
    if (key[0] == '#')
        return loom_fail(LOOM_ERR_INVALID,
                         "bootstrap: %s: key '%s' starts with '#', which the store keeps for "
                         "itself",
                         op, key);
    return LOOM_OK;
}

/* How long one slice of a wait may park in the server. */
static uint32_t slice_ms(uint64_t deadline)
{
    int left = ms_until(deadline);
    return (uint32_t)(left < SLICE_MS ? left : SLICE_MS);
}

/* The deadline of a wait; a negative timeout means the store's own. */
static uint64_t wait_deadline(const loom_store *s, double *timeout_s)
{
    if (*timeout_s < 0)
        *timeout_s = s->timeout_s;
    return deadline_after(*timeout_s);
}

int loom_store_put(loom_store *s, const char *key, const void *value, size_t len)
{
    char what[MAX_KEY + 16];
    int rc = check_key("put", key, what, sizeof what);
    if (rc)
        return rc;
    if (len > MAX_VALUE)
        return loom_fail(LOOM_ERR_INVALID,
                         "bootstrap: put '%s': a value of %zu bytes is larger than the store "
                         "takes (%u)",
                         key, len, MAX_VALUE);
    if (len && !value)
        return loom_fail(LOOM_ERR_INVALID, "bootstrap: put '%s': value is NULL", key);
    store_reply reply;
    if ((rc = client_call(s, OP_PUT, key, 0, value, len, &reply, what)))
        return rc;
    rc = reply.status;
    free(reply.value);
    if (rc)
        return loom_fail(rc, "bootstrap: %s failed in rank 0's store: %s", what,
                         loom_status_string(rc));
    return LOOM_OK;
}

int loom_store_get(loom_store *s, const char *key, void *buf, size_t cap, size_t *len,
                   double timeout_s)
{
    char what[MAX_KEY + 16];
    int rc = check_key("get", key, what, sizeof what);
    if (rc)
        return rc;
    uint64_t deadline = wait_deadline(s, &timeout_s);
    for (;;) {
        store_reply reply;
        if ((rc = client_call(s, OP_GET, key, slice_ms(deadline), NULL, 0, &reply, what)))
            return rc;
        if (reply.status == LOOM_OK) {
            if (buf && cap)
                memcpy(buf, reply.value, reply.len < cap ? reply.len : cap);
            if (len)
                *len = reply.len;
            free(reply.value);
            return LOOM_OK;
        }
        if (reply.status != LOOM_ERR_TIMEOUT) {
            free(reply.value);
            return loom_fail(reply.status, "bootstrap: %s failed in rank 0's store: %s", what,
                             loom_status_string(reply.status));
        }
        if (loom_now_ns() >= deadline) {
            const char *left = (const char *)reply.value;
            rc = loom_fail(LOOM_ERR_TIMEOUT,
                           "bootstrap: key '%s' did not appear in the store within %g s%s%s%s", key,
                           timeout_s, *left ? " (" : "", left,
                           *left ? " finished or died meanwhile)" : "");
            free(reply.value);
            return rc;
        }
        free(reply.value);
    }
}

int loom_store_add(loom_store *s, const char *key, int64_t delta, int64_t *result)
{
    char what[MAX_KEY + 16];
    int rc = check_key("add", key, what, sizeof what);
    if (rc)
        return rc;
    uint8_t v[8];
    put_u64(v, (uint64_t)delta);
    store_reply reply;
    if ((rc = client_call(s, OP_ADD, key, 0, v, 8, &reply, what)))
        return rc;
    if (reply.status == LOOM_OK && reply.len == 8) {
        if (result)
            *result = (int64_t)get_u64(reply.value);
        free(reply.value);
        return LOOM_OK;
    }
    rc = loom_fail(reply.status ? reply.status : LOOM_ERR_INTERNAL, "bootstrap: %s: %s", what,
                   reply.status ? (char *)reply.value : "malformed reply");
    free(reply.value);
    return rc;
}

int loom_store_barrier(loom_store *s, const char *name, double timeout_s)
{
    char what[MAX_KEY + 16];
    int rc = check_key("barrier", name, what, sizeof what);
    if (rc)
        return rc;
    uint64_t deadline = wait_deadline(s, &timeout_s);
    uint8_t generation[8] = {0}; /* 0: this rank arrives; then the one to wait for */
    for (;;) {
        store_reply reply;
        if ((rc =
                 client_call(s, OP_BARRIER, name, slice_ms(deadline), generation, 8, &reply, what)))
            return rc;
        if (reply.len < 8) {
            free(reply.value);
            return loom_fail(LOOM_ERR_INTERNAL, "bootstrap: %s: malformed reply", what);
        }
        memcpy(generation, reply.value, 8);
        const char *text = (const char *)reply.value + 8;
        int status = reply.status;
        if (status == LOOM_OK) {
            free(reply.value);
            return LOOM_OK;
        }
        if (status == LOOM_ERR_TIMEOUT && loom_now_ns() < deadline) {
            free(reply.value);
            continue;
        }
        if (status == LOOM_ERR_TIMEOUT)
            rc = loom_fail(status,
                           "bootstrap: barrier '%s' timed out after %.1f s: %s did not "
                           "arrive",
                           name, timeout_s, text);
        else
            rc = loom_fail(status, "bootstrap: barrier '%s' cannot complete: %s", name, text);
        free(reply.value);
        return rc;
    }
}
