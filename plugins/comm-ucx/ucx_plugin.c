/* comm-ucx — loom's own collective engine over UCX's UCP layer (docs/architecture.md).
 *
 * This file is the vtable: settings, argument checks, the choice of
 * algorithm per call, and test/wait with their timeouts. The work itself is
 * a schedule (ucx_sched.c) laid out by one builder per algorithm
 * (ucx_coll_*.c) over endpoints and a worker shared by every communicator of
 * the process (ucx_wireup.c).
 *
 * Algorithms (comm.ucx.<op> forces one; "auto" chooses by size):
 *   allreduce      recursive_doubling (small), rabenseifner, ring (large), direct
 *                  (large, one host)
 *   allgather      recursive_doubling / bruck (small; direct at 2 ranks), ring
 *                  (large), direct (large, every member on one host)
 *   reducescatter  recursive_halving (small), direct (larger, one host), ring
 *                  (larger, across hosts)
 *   broadcast      binomial (small), direct (larger, one host), scatter_allgather
 *                  (large, across hosts), chain
 *   reduce         binomial (small), direct (larger, one host), scatter_gather
 *                  (large, one host, 3+ ranks), chain (large)
 *   alltoall       posted, bruck (small), pairwise (large)
 *   barrier        dissemination
 * Every one works at any rank count; the power-of-two ones fold the extra
 * ranks in first. "direct" sends each block straight from its owner to
 * every rank: with cma the receivers pull in parallel, the best there is
 * on one host, but it would choke the owner's link across hosts. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sched.h>
#include <time.h>

#include "common/clock.h"
#include "ucx_internal.h"

/* ------------------------------------------------------------- settings */

/* An algorithm: its name in the settings, its name in messages ("step 2
 * of ring") and the builder that lays out its schedule. */
typedef struct ucx_algorithm {
    const char *setting;
    const char *title;
    void (*build)(loom_comm_request *r);
} ucx_algorithm;

#define ALGS_MAX 6 /* "auto", at most four algorithms, the end */

/* The algorithms of each op, index = its ALG_ value; "auto" first, an
 * empty setting last. */
static const ucx_algorithm algorithms[UOP_COUNT][ALGS_MAX] = {
    [UOP_ALLREDUCE] = {{"auto"},
                       {"recursive_doubling", "recursive doubling", build_allreduce_rd},
                       {"ring", "ring", build_allreduce_ring},
                       {"rabenseifner", "rabenseifner", build_allreduce_rabenseifner},
                       {"direct", "direct", build_allreduce_direct}},
    [UOP_ALLGATHER] = {{"auto"},
                       {"ring", "ring", build_allgather_ring},
                       {"recursive_doubling", "recursive doubling", build_allgather_rd},
                       {"bruck", "bruck", build_allgather_bruck},
                       {"direct", "direct", build_exchange_posted}},
    [UOP_REDUCESCATTER] = {{"auto"},
                           {"ring", "ring", build_reducescatter_ring},
                           {"recursive_halving", "recursive halving", build_reducescatter_rh},
                           {"direct", "direct", build_reducescatter_direct}},
    [UOP_BROADCAST] = {{"auto"},
                       {"binomial", "binomial tree", build_broadcast_binomial},
                       {"chain", "chain", build_broadcast_chain},
                       {"scatter_allgather", "scatter-allgather", build_broadcast_scatter_allgather},
                       {"direct", "direct", build_broadcast_direct}},
    [UOP_REDUCE] = {{"auto"},
                    {"binomial", "binomial tree", build_reduce_binomial},
                    {"chain", "chain", build_reduce_chain},
                    {"direct", "direct", build_reduce_direct},
                    {"scatter_gather", "scatter-reduce-gather", build_reduce_scatter_gather}},
    [UOP_ALLTOALL] = {{"auto"},
                      {"pairwise", "pairwise exchange", build_alltoall_pairwise},
                      {"bruck", "bruck", build_alltoall_bruck},
                      {"posted", "posted", build_exchange_posted}},
    [UOP_BARRIER] = {{"auto"}, {"dissemination", "dissemination", build_barrier_dissemination}},
};
static const char *const uop_setting[UOP_COUNT] = {"allreduce", "allgather", "reducescatter",
                                                   "broadcast", "reduce",    "alltoall",
                                                   "barrier"};
static const char *const small_setting[UOP_COUNT] = {
    "allreduce_small_bytes", "allgather_small_bytes", "reducescatter_small_bytes",
    "broadcast_small_bytes", "reduce_small_bytes",    "alltoall_small_bytes",
    NULL};

/* The size thresholds come from timing every algorithm of an op against
 * the others, interleaved, at 2-5 ranks on a 2-core machine (4 KiB to 64
 * MiB; see docs/benchmarks-ucx.md). With so few ranks the ring algorithms
 * win early: at larger rank counts the latency algorithms pay off up to
 * larger sizes, so raise the *_small_bytes there. "bytes" is the size loom
 * bench reports for the op (allgather: the gathered buffer; reducescatter
 * and alltoall: the whole send buffer). */
const loom_setting_spec ucx_settings_spec[] = {
    {.name = "tls", .type = LOOM_SETTING_STRING, .default_value = "", .help =
     "UCX_TLS for the process's UCX context, e.g. \"shm,self\" or \"tcp\"; \"\" lets UCX choose "
     "(shared memory on one host, TCP or verbs across hosts)"},
    {.name = "progress_thread", .type = LOOM_SETTING_BOOL, .default_value = "false", .help =
     "a thread drives UCX while collectives are in flight, so they complete while the caller "
     "computes"},
    {.name = "peer_errors", .type = LOOM_SETTING_BOOL, .default_value = "false", .help =
     "UCX reports failed peers itself (UCP_ERR_HANDLING_MODE_PEER); UCX 1.13 then cannot use "
     "shared memory or cma, so this is much slower on one host"},
    {.name = "allreduce", .type = LOOM_SETTING_STRING, .default_value = "auto",
     .help = "auto, recursive_doubling, ring, rabenseifner or direct"},
    {.name = "allgather", .type = LOOM_SETTING_STRING, .default_value = "auto",
     .help = "auto, ring, recursive_doubling, bruck or direct"},
    {.name = "reducescatter", .type = LOOM_SETTING_STRING, .default_value = "auto",
     .help = "auto, ring, recursive_halving or direct"},
    {.name = "broadcast", .type = LOOM_SETTING_STRING, .default_value = "auto",
     .help = "auto, binomial, chain, scatter_allgather or direct"},
    {.name = "reduce", .type = LOOM_SETTING_STRING, .default_value = "auto",
     .help = "auto, binomial, chain, direct or scatter_gather"},
    {.name = "alltoall", .type = LOOM_SETTING_STRING, .default_value = "auto",
     .help = "auto, pairwise, bruck or posted"},
    {.name = "barrier", .type = LOOM_SETTING_STRING, .default_value = "dissemination",
     .help = "dissemination (the only one)"},
    {.name = "allreduce_small_bytes", .type = LOOM_SETTING_INT, .default_value = "16384",
     .help = "auto allreduce below this: recursive doubling",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {.name = "allreduce_ring_bytes", .type = LOOM_SETTING_INT, .default_value = "1048576",
     .help = "auto allreduce from this on, at rank counts that are not a power of two: ring (else "
     "Rabenseifner, whose fold-in step costs a whole-vector transfer there)",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {.name = "allreduce_direct_bytes", .type = LOOM_SETTING_INT, .default_value = "8388608",
     .help = "auto allreduce from this on, when the group is on one host: direct (each block "
     "reduced once, in cache, by the rank that owns it, then sent to every rank at once)",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {.name = "allgather_small_bytes", .type = LOOM_SETTING_INT, .default_value = "1024", .help =
     "auto allgather below this: recursive doubling (power-of-two ranks) or Bruck, direct at 2 "
     "ranks; else direct when the group is on one host, ring across hosts",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {.name = "reducescatter_small_bytes", .type = LOOM_SETTING_INT, .default_value = "1024",
     .help = "auto reducescatter below this: recursive halving; else direct when the group is on "
     "one host, ring across hosts",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {.name = "broadcast_small_bytes", .type = LOOM_SETTING_INT, .default_value = "32768",
     .help = "auto broadcast below this: binomial tree; else direct when the group is on one host",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {.name = "broadcast_large_bytes", .type = LOOM_SETTING_INT, .default_value = "4194304",
     .help = "auto broadcast across hosts: binomial tree below this, scatter+allgather from it on",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {.name = "reduce_small_bytes", .type = LOOM_SETTING_INT, .default_value = "1048576",
     .help = "auto reduce below this: binomial tree; else pipelined chain",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {.name = "reduce_direct_bytes", .type = LOOM_SETTING_INT, .default_value = "16384",
     .help = "auto reduce from this on, when the group is on one host: direct (the root pulls "
     "every rank's vector and reduces it chunk by chunk in cache)",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {.name = "reduce_scatter_gather_bytes", .type = LOOM_SETTING_INT, .default_value = "6291456",
     .help = "auto reduce on one host, at 3 ranks or more, once what direct leaves the root to "
     "reduce (the size times the ranks but one) reaches this: scatter_gather (every rank reduces "
     "one block, in parallel, and sends it to the root); at 2 ranks the root would still move a "
     "whole vector",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {.name = "alltoall_small_bytes", .type = LOOM_SETTING_INT, .default_value = "262144",
     .help = "auto alltoall below this: all sends and receives posted at once; else pairwise",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {.name = "chunk_bytes", .type = LOOM_SETTING_INT, .default_value = "262144", .help =
     "ops that reduce move large messages in chunks of this size: each is reduced from cache "
     "as soon as it is in, while the next moves",
     .bounds = LOOM_SETTING_MIN, .min = 64},
    {.name = "forward_chunk_bytes", .type = LOOM_SETTING_INT, .default_value = "2097152", .help =
     "broadcast and allgather pipeline large messages through the ranks in chunks of this size "
     "(bigger than chunk_bytes: each chunk costs a rendezvous)",
     .bounds = LOOM_SETTING_MIN, .min = 64},
    {.name = "pipeline_depth", .type = LOOM_SETTING_INT, .default_value = "4",
     .help = "receive buffers per pipelined transfer (1-16)",
     .bounds = LOOM_SETTING_MIN | LOOM_SETTING_MAX, .min = 1, .max = SLOTS_MAX},
    {.name = "spin_us", .type = LOOM_SETTING_FLOAT, .default_value = "50", .help =
     "where ranks share cores, a wait polls (yielding the core) this many microseconds before "
     "sleeping until UCX has an event: lower frees the cores sooner for other ranks, higher "
     "answers small messages faster",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {.name = "own_core_spin_us", .type = LOOM_SETTING_FLOAT, .default_value = "1000", .help =
     "the same for a rank with a core of its own (its launcher pinned it, or this host runs no "
     "more ranks than cores): it keeps polling through transfers of a few hundred microseconds "
     "instead of waking from a sleep, which takes 100-200 us on a virtual machine",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {.name = "late_grace_s", .type = LOOM_SETTING_FLOAT, .default_value = "2.0", .help =
     "after a timeout, how long the core collects the other ranks' reports before naming the "
     "ranks that did not arrive (at most a quarter of comm.timeout_s)",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {0},
};

static void read_int(const loom_host *h, const char *name, int64_t dflt, int64_t *out)
{
    if (!h->config_int || h->config_int(h, name, out) != LOOM_OK)
        *out = dflt;
}

int ucx_settings_read(const loom_host *h, ucx_settings *s)
{
    memset(s, 0, sizeof *s);
    s->timeout_s = h->timeout_s > 0 ? h->timeout_s : 60.0;
    s->tls = "";
    const char *str;
    int b;
    double d;
    int64_t v;
    /* The core validated the group and filled in defaults; the fallbacks
     * matter only for a host without config (a bare test harness). */
    if (h->config_string && h->config_string(h, "tls", &str) == LOOM_OK && str)
        s->tls = str;
    if (h->config_bool && h->config_bool(h, "progress_thread", &b) == LOOM_OK)
        s->progress_thread = b;
    if (h->config_bool && h->config_bool(h, "peer_errors", &b) == LOOM_OK)
        s->peer_errors = b;
    for (int u = 0; u < UOP_COUNT; u++) {
        s->algo[u] = ALG_AUTO;
        if (!h->config_string || h->config_string(h, uop_setting[u], &str) != LOOM_OK || !str)
            continue;
        const ucx_algorithm *algs = algorithms[u];
        int found = -1;
        for (int a = 0; algs[a].setting; a++)
            if (!strcmp(algs[a].setting, str))
                found = a;
        if (found < 0) {
            char list[256];
            size_t len = 0;
            list[0] = '\0';
            for (int a = 0; algs[a].setting && len < sizeof list; a++)
                len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", a ? ", " : "",
                                        algs[a].setting);
            return h->error(h, LOOM_ERR_INVALID,
                            "comm-ucx: comm.ucx.%s = \"%s\": unknown algorithm (one of %s)",
                            uop_setting[u], str, list);
        }
        s->algo[u] = found;
    }
    static const int64_t small_default[UOP_COUNT] = {16384, 1024, 1024, 32768, 1048576, 262144, 0};
    for (int u = 0; u < UOP_COUNT; u++) {
        if (!small_setting[u])
            continue;
        read_int(h, small_setting[u], small_default[u], &v);
        s->small_bytes[u] = v > 0 ? (size_t)v : 0;
    }
    read_int(h, "allreduce_ring_bytes", 1048576, &v);
    s->allreduce_ring_bytes = v > 0 ? (size_t)v : 0;
    read_int(h, "allreduce_direct_bytes", 8388608, &v);
    s->allreduce_direct_bytes = v > 0 ? (size_t)v : 0;
    read_int(h, "reduce_direct_bytes", 16384, &v);
    s->reduce_direct_bytes = v > 0 ? (size_t)v : 0;
    read_int(h, "reduce_scatter_gather_bytes", 6291456, &v);
    s->reduce_scatter_gather_bytes = v > 0 ? (size_t)v : 0;
    read_int(h, "broadcast_large_bytes", 4194304, &v);
    s->broadcast_large_bytes = v > 0 ? (size_t)v : 0;
    read_int(h, "chunk_bytes", 262144, &v);
    if (v < 64)
        return h->error(h, LOOM_ERR_INVALID,
                        "comm-ucx: comm.ucx.chunk_bytes = %lld: expected at least 64",
                        (long long)v);
    s->chunk_bytes = (size_t)v;
    read_int(h, "forward_chunk_bytes", 2097152, &v);
    if (v < 64)
        return h->error(h, LOOM_ERR_INVALID,
                        "comm-ucx: comm.ucx.forward_chunk_bytes = %lld: expected at least 64",
                        (long long)v);
    s->forward_chunk_bytes = (size_t)v;
    read_int(h, "pipeline_depth", 4, &v);
    if (v < 1 || v > SLOTS_MAX)
        return h->error(h, LOOM_ERR_INVALID,
                        "comm-ucx: comm.ucx.pipeline_depth = %lld: expected 1 to %d",
                        (long long)v, SLOTS_MAX);
    s->pipeline_depth = (int)v;
    s->spin_us = 50;
    if (h->config_float && h->config_float(h, "spin_us", &d) == LOOM_OK && d >= 0)
        s->spin_us = d;
    s->own_core_spin_us = 1000;
    if (h->config_float && h->config_float(h, "own_core_spin_us", &d) == LOOM_OK && d >= 0)
        s->own_core_spin_us = d;
    return LOOM_OK;
}

size_t ucx_chunk_elems(const loom_comm_request *r, size_t count, int forward)
{
    const ucx_settings *s = &r->comm->set;
    size_t bytes = forward ? s->forward_chunk_bytes : s->chunk_bytes;
    size_t ce = bytes / loom_dtype_size(r->call.dtype), most = (count + 4095) / 4096;
    if (ce < most)
        ce = most;
    return ce ? ce : 1;
}

/* ------------------------------------------------------------- helpers */

/* The answer to a message of up to a few KiB is a few microseconds away
 * (4 KiB: ~3 us), so a rank with a core of its own polls this long before
 * it yields: a sched_yield costs ~0.5 us on a virtual machine, and a
 * message that arrives meanwhile waits it out. (Counted in polls, the
 * phase shrank as polls got cheaper, and 2-4 KiB ops began to yield.)
 * With more ranks than cores the rank it waits for may need this core, so
 * a rank that shares one yields at once. */
#define BUSY_S 10e-6

/* Polls between two readings of the clock while a wait does not pause: a
 * poll takes ~100 ns, and reading the clock at each one (~25 ns on a
 * virtual machine) was a fifth of a waiting rank's time. */
#define POLLS_PER_CLOCK 16

int ucx_own_core(const loom_host *host)
{
    cpu_set_t mine;
    if (sched_getaffinity(0, sizeof mine, &mine) != 0)
        return 0;
    /* one cpu: a launcher pinned this rank (loom launch and mpirun pin one
     * rank per core when they fit); else the ranks here share our cpus */
    int cpus = CPU_COUNT(&mine), ranks = host->local_size > 0 ? host->local_size : 1;
    return cpus == 1 || ranks <= cpus;
}

double ucx_spin_us(const ucx_settings *s)
{
    return ucx.own_core ? s->own_core_spin_us : s->spin_us;
}

double ucx_idle(ucx_idle_state *s, int events, double spin_us)
{
    if (events) {
        s->since = 0;
        s->polls = 0;
        return 0;
    }
    int busy = ucx.own_core && !s->beside_caller;
    if (busy && s->since > 0 && ++s->polls < POLLS_PER_CLOCK)
        return 0;
    s->polls = 0;
    double now = clock_now_s();
    if (s->since == 0)
        s->since = now;
    if (busy && now - s->since < BUSY_S)
        return now;
    if (now - s->since < spin_us * 1e-6) {
        sched_yield();
        return now;
    }
    /* Sleep in the kernel until UCX has something for us (a message, a
     * rendezvous reply), for at most a few ms so the caller still checks
     * its timeout and its peers. */
    pthread_mutex_lock(&ucx.lock);
    ucs_status_t st = ucx.worker && ucx.efd >= 0 ? ucp_worker_arm(ucx.worker) : UCS_ERR_UNSUPPORTED;
    pthread_mutex_unlock(&ucx.lock);
    if (st == UCS_OK) {
        struct pollfd p = {ucx.efd, POLLIN, 0};
        poll(&p, 1, 5);
    } else if (st != UCS_ERR_BUSY) {
        struct timespec t = {0, 20000};
        nanosleep(&t, NULL);
    }
    return now;
}

static int is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

/* ------------------------------------------------------------ requests
 *
 * An op takes ucx.lock once to be numbered, built and started, and a wait
 * once per poll, releasing the request in the poll that sees it done: each
 * lock round trip is on the path of every small collective. */

/* With ucx.lock held. */
static loom_comm_request *req_new(loom_comm *c, const comm_call *call, uint64_t seq)
{
    loom_comm_request *r = sched_request();
    if (!r)
        return NULL;
    r->comm = c;
    r->host = c->group.host;
    r->call = *call;
    r->collective = !call_is_p2p(call);
    r->seq = seq;
    r->dead_world = -1;
    r->status = LOOM_IN_PROGRESS;
    return r;
}

/* With ucx.lock held. */
static void req_release(loom_comm_request *r)
{
    loom_comm *c = r->comm;
    if (c)
        group_untrack(&c->group, &r->pending);
    sched_free(r);
}

/* Start a built request; called with ucx.lock held, returns with it
 * released. LOOM_OK with *out (left NULL when it completed at once) or an
 * error (the request released). */
static int req_start(loom_comm_request *r, loom_comm_request **out)
{
    loom_comm *c = r->comm;
    const loom_host *h = c->group.host;
    if (r->build_failed) {
        const char *name = loom_comm_op_name(r->call.op);
        uint64_t seq = r->seq;
        req_release(r);
        pthread_mutex_unlock(&ucx.lock);
        return group_no_memory(&c->group, name, seq);
    }
    group_track(&c->group, &r->pending, r);
    sched_activate(r);
    int st = r->status;
    if (st == LOOM_IN_PROGRESS) {
        pthread_mutex_unlock(&ucx.lock);
        *out = r;
        return LOOM_OK;
    }
    if (st == LOOM_OK) {
        req_release(r);
        pthread_mutex_unlock(&ucx.lock);
        return LOOM_OK;
    }
    char err[sizeof r->error];
    memcpy(err, r->error, sizeof err);
    req_release(r);
    pthread_mutex_unlock(&ucx.lock);
    return h->error(h, st, "%s", err);
}

/* ------------------------------------------------------------------ ops */

/* The algorithm "auto" picks for op uop over `bytes` (the size loom bench
 * reports: the gathered buffer for allgather, the whole send buffer for
 * reducescatter and alltoall). */
static int auto_algorithm(const loom_comm *c, int uop, size_t bytes)
{
    const ucx_settings *s = &c->set;
    int n = c->group.size, small = bytes < s->small_bytes[uop];
    switch (uop) {
    case UOP_ALLREDUCE:
        return small                                            ? AR_RECURSIVE_DOUBLING
               : c->local && bytes >= s->allreduce_direct_bytes ? AR_DIRECT
               : is_pow2(n) || bytes < s->allreduce_ring_bytes  ? AR_RABENSEIFNER
                                                                : AR_RING;
    case UOP_ALLGATHER:
        /* two ranks: one exchange whatever the algorithm, and direct lays it
         * out with no steps to join */
        return small      ? (n == 2 ? AG_DIRECT : is_pow2(n) ? AG_RECURSIVE_DOUBLING : AG_BRUCK)
               : c->local ? AG_DIRECT /* every rank pulls each block from its owner at once */
                          : AG_RING;
    case UOP_REDUCESCATTER:
        return small      ? RS_RECURSIVE_HALVING
               : c->local ? RS_DIRECT /* one step, each sum made once in cache */
                          : RS_RING;
    case UOP_BROADCAST:
        return small || n == 2                    ? BC_BINOMIAL
               : c->local                         ? BC_DIRECT
               : bytes < s->broadcast_large_bytes ? BC_BINOMIAL
                                                  : BC_SCATTER_ALLGATHER;
    case UOP_REDUCE:
        return c->local && n > 2 && bytes * (size_t)(n - 1) >= s->reduce_scatter_gather_bytes
                   ? RD_SCATTER_GATHER
               : c->local && bytes >= s->reduce_direct_bytes ? RD_DIRECT
               : small                                     ? RD_BINOMIAL
                                                           : RD_CHAIN;
    case UOP_ALLTOALL: return small ? A2A_POSTED : A2A_PAIRWISE;
    default: return BAR_DISSEMINATION;
    }
}

/* The collectives with a choice of algorithm, by loom_comm_op. */
static const int uop_of[LOOM_OP_COUNT] = {
    [LOOM_OP_ALLREDUCE] = UOP_ALLREDUCE, [LOOM_OP_BROADCAST] = UOP_BROADCAST,
    [LOOM_OP_REDUCE] = UOP_REDUCE,       [LOOM_OP_ALLGATHER] = UOP_ALLGATHER,
    [LOOM_OP_REDUCESCATTER] = UOP_REDUCESCATTER, [LOOM_OP_ALLTOALL] = UOP_ALLTOALL,
    [LOOM_OP_BARRIER] = UOP_BARRIER};

/* Lay out the request's schedule: a send or receive is one op; a
 * collective runs the algorithm comm.ucx.<op> forces, or the one "auto"
 * picks by size. */
static void build(loom_comm_request *r, size_t bytes)
{
    const comm_call *call = &r->call;
    if (call_is_p2p(call)) {
        size_t len = call->count * loom_dtype_size(call->dtype);
        if (call->op == LOOM_OP_SEND)
            sched_send(r, call->peer, call->send, len, 0, 0);
        else
            sched_recv(r, call->peer, call->recv, len, 0, 0);
        return;
    }
    int uop = uop_of[call->op], algo = r->comm->set.algo[uop];
    if (algo == ALG_AUTO)
        algo = auto_algorithm(r->comm, uop, bytes);
    r->algo = algorithms[uop][algo].title;
    algorithms[uop][algo].build(r);
}

/* A call that needs no request, refused or done at once: on a failed
 * group, an empty call, buffers that overlap where comm.h allows no
 * overlap, a collective of one rank. */
static int post_nothing(loom_comm *c, const comm_call *call, uint64_t seq, int failed,
                        int bad_overlap, size_t recv_bytes)
{
    const char *name = loom_comm_op_name(call->op);
    if (failed)
        return group_refuse_op(&c->group, name, seq);
    if (call_is_empty(call))
        return LOOM_OK;
    if (bad_overlap)
        return c->group.host->error(
            c->group.host, LOOM_ERR_INVALID, "comm-ucx: %s #%llu on %s: %s", name,
            (unsigned long long)seq, c->group.desc,
            call->op == LOOM_OP_ALLGATHER ? "send overlaps recv without being this rank's block of it"
                                          : "send and recv overlap without being the same buffer");
    if (call->send != call->recv && recv_bytes) /* the result is the input */
        memmove(call->recv, call->send, recv_bytes);
    return LOOM_OK;
}

/* Every op (common/call.h). Buffers that overlap other than in comm.h's
 * in-place forms: reducescatter and alltoall copy their input aside first
 * (reducescatter's send == recv then leaves the result at the start of
 * recv, as MPI_IN_PLACE does); the other ops refuse. */
int comm_post(loom_comm *c, const comm_call *call, loom_comm_request **req)
{
    int collective = !call_is_p2p(call), rank = c->group.rank;
    size_t send_bytes, recv_bytes;
    call_extents(call, rank, c->group.size, &send_bytes, &recv_bytes);
    int overlap = !call_in_place(call, rank) &&
                  buffers_overlap(call->send, send_bytes, call->recv, recv_bytes);
    int copy_aside = overlap && (call->op == LOOM_OP_REDUCESCATTER || call->op == LOOM_OP_ALLTOALL);
    uint64_t seq;
    pthread_mutex_lock(&ucx.lock);
    int failed = group_number(&c->group, collective, &seq), bad_overlap = overlap && !copy_aside;
    if (failed || call_is_empty(call) || bad_overlap || (collective && c->group.size == 1)) {
        pthread_mutex_unlock(&ucx.lock);
        return post_nothing(c, call, seq, failed, bad_overlap, recv_bytes);
    }
    loom_comm_request *r = req_new(c, call, seq);
    if (!r) {
        pthread_mutex_unlock(&ucx.lock);
        return group_no_memory(&c->group, loom_comm_op_name(call->op), seq);
    }
    if (copy_aside) {
        void *copy = sched_scratch(r, send_bytes);
        if (copy)
            memcpy(copy, call->send, send_bytes);
        r->call.send = copy;
    }
    if (call->op == LOOM_OP_REDUCE && rank != call->root)
        r->call.recv = NULL; /* significant at the root only */
    build(r, send_bytes > recv_bytes ? send_bytes : recv_bytes);
    return req_start(r, req);
}

/* ------------------------------------------------------------ completion */

/* Advance everything once (with ucx.lock held); returns the request's
 * status, the request kept. */
static int poll_req(loom_comm_request *r, int *events, int check_peers)
{
    if (r->status == LOOM_IN_PROGRESS && !r->comm)
        sched_fail(r, LOOM_ERR_INVALID, "comm-ucx: %s #%llu: its group was destroyed while it was "
                                        "in flight", loom_comm_op_name(r->call.op), (unsigned long long)r->seq);
    if (r->status == LOOM_IN_PROGRESS) {
        *events = sched_progress_all();
        if (check_peers)
            sched_check_peers(r);
    }
    return r->status;
}

/* A rank whose collective fails leaves its error in the store (key
 * fail/<group id>/<world rank>) before it goes, so the ranks that were
 * waiting for it can say why: a rank that exits after timing out looks
 * like a dead peer to its neighbours, but the cause is whom it waited
 * for. */
static void last_words_put(loom_comm *c, int status, const char *err)
{
    const loom_host *h = c->group.host;
    char key[160], text[1600];
    snprintf(key, sizeof key, "fail/%s/%d", c->group.id, c->group.world_ranks[c->group.rank]);
    int n = snprintf(text, sizeof text, "%d|%s", status, err);
    if (h->kv_put && n > 0)
        h->kv_put(h, key, text, strlen(text) + 1);
}

static int last_words_get(loom_comm *c, int world, int *status, char *buf, size_t cap)
{
    const loom_host *h = c->group.host;
    char key[160], text[1600];
    size_t len = 0;
    snprintf(key, sizeof key, "fail/%s/%d", c->group.id, world);
    /* put before the rank went, so either there now or never */
    if (!h->kv_get || h->kv_get(h, key, text, sizeof text - 1, &len, 0.2) != LOOM_OK)
        return LOOM_ERR_NOT_FOUND;
    text[len < sizeof text - 1 ? len : sizeof text - 1] = '\0';
    char *bar = strchr(text, '|');
    if (!bar)
        return LOOM_ERR_NOT_FOUND;
    *status = atoi(text);
    const char *words = bar + 1;
    if (!strncmp(words, "comm-ucx: ", 10))
        words += 10;
    snprintf(buf, cap, "%s", words);
    return LOOM_OK;
}

/* Release a finished request (without ucx.lock held) and return its
 * status, recording its error for the calling thread. */
static int finish(loom_comm_request *r)
{
    const loom_host *h = r->host;
    int st = r->status;
    if (st == LOOM_OK) {
        pthread_mutex_lock(&ucx.lock);
        req_release(r);
        pthread_mutex_unlock(&ucx.lock);
        return LOOM_OK;
    }
    char err[1536];
    memcpy(err, r->error, sizeof r->error);
    loom_comm *c = r->comm;
    if (st < 0 && c && r->collective) {
        char words[sizeof r->error];
        int ws = 0;
        if (r->dead_world >= 0 && last_words_get(c, r->dead_world, &ws, words, sizeof words) == LOOM_OK) {
            size_t len = strlen(err);
            snprintf(err + len, sizeof err - len, "; before it went, rank %d reported: %s",
                     r->dead_world, words);
            if (ws == LOOM_ERR_TIMEOUT) /* the cause: a rank that never came */
                st = LOOM_ERR_TIMEOUT;
        }
        last_words_put(c, st, err);
    }
    pthread_mutex_lock(&ucx.lock);
    req_release(r);
    pthread_mutex_unlock(&ucx.lock);
    return st == LOOM_OK ? LOOM_OK : h->error(h, st, "%s", err);
}

/* One poll, under ucx.lock; a request found done is released in the same
 * hold, a failed one by finish. now: the time, when the caller read it
 * (else 0); from 0.1 s after the first such poll, one every 0.1 s also
 * checks that the request's peers live. */
static int poll_once(loom_comm_request *r, int *events, double now)
{
    pthread_mutex_lock(&ucx.lock);
    int check = 0;
    if (now > 0 && !r->next_check) {
        r->next_check = now + 0.1;
    } else if (now > 0 && now >= r->next_check) {
        check = 1;
        r->next_check = now + 0.1;
    }
    int st = poll_req(r, events, check);
    if (st == LOOM_OK)
        req_release(r);
    pthread_mutex_unlock(&ucx.lock);
    return st == LOOM_OK || st == LOOM_IN_PROGRESS ? st : finish(r);
}

static int ucx_test(loom_comm_request *r)
{
    if (!r)
        return LOOM_OK;
    int events = 0;
    return poll_once(r, &events, clock_now_s());
}

/* "waiting for rank 2 (step 1 of ring)": the peers whose messages (or, for
 * a rendezvous send, whose receives) this rank still needs. */
static void pending_peers(const loom_comm_request *r, char *buf, size_t cap)
{
    const loom_comm *c = r->comm;
    int kind = SOP_RECV, first = -1, count = 0;
    size_t len = 0;
    char list[256] = "";
    for (int pass = 0; pass < 2 && count == 0; pass++, kind = SOP_SEND) {
        for (int i = r->low; i < r->nops; i++) {
            const sop *o = &r->ops[i];
            if (o->kind != kind || o->state != SOP_POSTED)
                continue;
            int dup = 0;
            for (int j = r->low; j < i && !dup; j++)
                dup = r->ops[j].kind == kind && r->ops[j].state == SOP_POSTED &&
                      r->ops[j].peer == o->peer;
            if (dup)
                continue;
            if (first < 0)
                first = i;
            char nm[64];
            group_name_rank(&c->group, o->peer, nm, sizeof nm);
            if (len < sizeof list)
                len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", count ? ", " : "", nm);
            count++;
        }
    }
    if (count == 0) {
        snprintf(buf, cap, " with nothing posted (an internal error)");
        return;
    }
    const sop *o = &r->ops[first];
    char step[96] = "";
    if (r->collective && r->algo)
        snprintf(step, sizeof step, " (step %d of %s)", o->step, r->algo);
    if (o->kind == SOP_RECV)
        snprintf(buf, cap, " waiting for rank%s %s%s", count > 1 ? "s" : "", list, step);
    else
        snprintf(buf, cap, " waiting for rank%s %s to receive%s", count > 1 ? "s" : "", list, step);
}

static int ucx_wait(loom_comm_request *r)
{
    if (!r)
        return LOOM_OK;
    ucx_idle_state idle = {0};
    double timeout = r->comm ? r->comm->set.timeout_s : 0;
    double spin_us = r->comm ? ucx_spin_us(&r->comm->set) : 50, t0 = 0, t = 0, report_at = 0;
    int reported = !r->collective, polls = 0;
    for (;;) {
        int events = 0, st = poll_once(r, &events, t);
        if (st != LOOM_IN_PROGRESS)
            return st;
        /* the clock starts after the first poll: a small op is often done
         * by then; while UCX has events for us, it is read every few polls */
        t = ucx_idle(&idle, events, spin_us);
        if (t == 0 && ++polls < POLLS_PER_CLOCK && t0 > 0)
            continue;
        if (t == 0)
            t = clock_now_s();
        polls = 0;
        if (t0 == 0) {
            t0 = t;
            report_at = t0 + (timeout / 4 < 1.0 ? timeout / 4 : 1.0);
        }
        if (t - t0 > timeout)
            break;
        if (!reported && t >= report_at && r->comm) {
            /* slow: tell the store we got here, in case someone times out */
            pthread_mutex_lock(&ucx.lock);
            loom_comm *c = r->comm;
            pthread_mutex_unlock(&ucx.lock);
            const loom_host *h = c ? c->group.host : NULL;
            if (h && h->struct_size > offsetof(loom_host, comm_waiting) && h->comm_waiting)
                h->comm_waiting(h, c);
            reported = 1;
        }
    }

    /* Timed out: say what we wait for; the core adds who did not come. */
    pthread_mutex_lock(&ucx.lock);
    char what[400], peers[400];
    ucx_req_describe(r, what, sizeof what);
    pending_peers(r, peers, sizeof peers);
    int events;
    if (poll_req(r, &events, 1) == LOOM_IN_PROGRESS) { /* else it finished meanwhile */
        sched_fail(r, LOOM_ERR_TIMEOUT, "comm-ucx: %s timed out after %.1f s%s", what, timeout,
                   peers);
        /* Its messages may still arrive later, so the group cannot be trusted. */
        if (r->collective && r->comm)
            ucx_comm_fail(r->comm, LOOM_ERR_TIMEOUT, r->error);
        /* a send or receive too: the peer may be stopped, and the teardown
         * must not wait to flush messages to it */
        ucx.failed = 1;
    }
    pthread_mutex_unlock(&ucx.lock);
    return finish(r);
}

/* -------------------------------------------------------------- export */

LOOM_PLUGIN_EXPORT const loom_comm_plugin_v1_t loom_comm_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_COMM, loom_comm_plugin_v1_t, "ucx",
                                 "loom's own collectives over UCX (UCP tag matching): shared "
                                 "memory, TCP or verbs, no MPI needed",
                                 ucx_settings_spec),
    .mem_kinds = LOOM_MEM_BIT(LOOM_MEM_HOST),
    .create_world = ucx_create_world,
    .create_subgroup = ucx_create_subgroup,
    .destroy = ucx_destroy,
    COMM_COMMON_OPS,
    .test = ucx_test,
    .wait = ucx_wait,
    .abort = ucx_abort,
};
