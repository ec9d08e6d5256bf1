/* comm-nccl — the communicator over NCCL, on CUDA device buffers (docs/architecture.md).
 *
 * One NCCL communicator and one CUDA stream per loom communicator. Every op
 * is enqueued on that stream followed by a CUDA event; test is the event's
 * query and wait polls it, so every op is non-blocking. The world comes from
 * an ncclUniqueId that rank 0 makes and puts in the bootstrap store;
 * subgroups come from ncclCommSplit.
 *
 * The NCCL communicators are non-blocking (ncclConfig_t.blocking = 0): no
 * NCCL call blocks, so creation, group ends and every wait can be bounded by
 * comm.timeout_s. On expiry, or when ncclCommGetAsyncError reports an error,
 * the communicator is aborted with ncclCommAbort (which stops its kernels
 * instead of waiting for peers) and the error names the op, its sequence
 * number and the group.
 *
 * Things NCCL does differently from loom's contract, and what we do:
 *  - point-to-point has no tags: messages between two ranks match in
 *    posting order. Inside a group_start/group_end bracket we post each
 *    peer's sends and receives sorted by tag, so pairs match by tag there;
 *    outside a bracket, two ranks must post their messages in the same order.
 *    Outside a bracket NCCL also runs a rank's sends and receives one after
 *    the other on its stream (a send holds the stream until matched), so an
 *    exchange where both sides send first belongs in a bracket.
 *  - create_subgroup is ncclCommSplit, collective over every rank of the
 *    parent (as comm.h says); a rank of the parent that never calls it makes
 *    the others time out.
 *  - avg: NCCL sums then divides for integers (truncating, like loom) but
 *    pre-multiplies by 1/n for floating types, so at rank counts that are
 *    not powers of two a float average may differ from sum/n in the last bit.
 *
 * A loom communicator is used from one thread at a time (NCCL requires the
 * same of its communicators), so it has no lock. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "common/call.h"
#include "common/clock.h"
#include "common/group.h"
#include "loom/comm.h"
#include "loom/compute.h"

/* ------------------------------------------------------------ settings */

static const loom_setting_spec nccl_settings[] = {
    {.name = "device", .type = LOOM_SETTING_INT, .default_value = "-1",
     .help = "CUDA device of this rank; -1 means its local rank on the machine",
     .bounds = LOOM_SETTING_MIN, .min = -1},
    {.name = "late_grace_s", .type = LOOM_SETTING_FLOAT, .default_value = "2.0", .help =
     "after a timeout, how long to collect the other ranks' reports before naming the ranks "
     "that did not arrive",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {0},
};

typedef struct nccl_settings_t {
    int device;
    double timeout_s;
    double grace_s;
} nccl_settings_t;

static void read_settings(const loom_host *host, nccl_settings_t *s)
{
    s->device = -1;
    s->timeout_s = host->timeout_s > 0 ? host->timeout_s : 60.0;
    s->grace_s = 2.0;
    int64_t i;
    double d;
    if (host->config_int && host->config_int(host, "device", &i) == LOOM_OK)
        s->device = (int)i;
    if (host->config_float && host->config_float(host, "late_grace_s", &d) == LOOM_OK && d >= 0)
        s->grace_s = d;
}

/* --------------------------------------------------------- small helpers */

static int nccl_status(ncclResult_t r)
{
    switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage: return LOOM_ERR_INVALID;
    case ncclRemoteError:
    case ncclSystemError: return LOOM_ERR_REMOTE;
    default: return LOOM_ERR_INTERNAL;
    }
}

static ncclDataType_t nccl_dtype(loom_dtype t)
{
    switch (t) {
    case LOOM_F32: return ncclFloat32;
    case LOOM_BF16: return ncclBfloat16;
    case LOOM_F16: return ncclFloat16;
    case LOOM_F64: return ncclFloat64;
    case LOOM_I32: return ncclInt32;
    case LOOM_I64: return ncclInt64;
    case LOOM_U8: return ncclUint8;
    default: return ncclNumTypes;
    }
}

static ncclRedOp_t nccl_op(loom_redop op)
{
    switch (op) {
    case LOOM_MAX: return ncclMax;
    case LOOM_MIN: return ncclMin;
    case LOOM_AVG: return ncclAvg; /* NCCL >= 2.10, every dtype; only ops that take a redop */
    case LOOM_SUM:
    default: return ncclSum; /* the core admits only the four values above (comm.h) */
    }
}

/* The NCCL call that posts each op, for messages. */
static const char *const nccl_call_name[LOOM_OP_COUNT] = {
    "ncclAllReduce", "ncclBroadcast", "ncclReduce", "ncclAllGather", "ncclReduceScatter",
    "ncclSend/ncclRecv", "ncclSend", "ncclRecv", "ncclAllReduce"};

/* ------------------------------------------------------- communicators */

struct loom_comm {
    comm_group group;     /* ranks, id, messages, sequence numbers, failure */
    ncclComm_t nccl;      /* NULL once aborted or destroyed */
    cudaStream_t stream;  /* every op of this communicator, in posting order */
    int device;
    int nsubs;            /* subgroups split from this one: part of their ids */
    nccl_settings_t set;
    int grouping;         /* depth of group_start brackets */
    void *barrier_buf;    /* one device float: barrier is a 1-element allreduce */
    cudaEvent_t compute_mark; /* on the compute backend's queue: what each op waits for */
    struct deferred_free *deferred; /* stages the device may still use (see defer_stage) */
    /* Where a non-blocking ncclCommSplit of this group writes the child
     * communicator. NCCL fills it from its own thread when the split ends,
     * possibly after create_subgroup gave up, so it must outlive that call. */
    ncclComm_t split_out;
};
/* First: plugins/common reads the group there (comm_rank, comm_size). */
_Static_assert(offsetof(struct loom_comm, group) == 0, "comm_group first");

/* A staging buffer released before the device was known to be done with it,
 * and the event after its last use. */
typedef struct deferred_free {
    void *ptr;
    cudaEvent_t after;
    struct deferred_free *next;
} deferred_free;

struct loom_comm_request {
    loom_comm *comm; /* NULL once the group was destroyed under it */
    const loom_host *host;
    const char *name;
    int collective;
    uint64_t seq;
    comm_call call;  /* kept so a bracket can post it at group_end; send is the stage if any */
    void *stage;     /* device copy of a send buffer that overlaps recv */
    int posted;      /* handed to NCCL */
    int recorded;    /* its completion event is on the stream */
    int complete;    /* the event reported the op done on a healthy group */
    cudaEvent_t done;
    comm_pending pending; /* on the group's list until released */
};

/* host->error with NCCL's own texts: "comm-nccl: <what>: <result> (<last error>)". */
__attribute__((format(printf, 4, 5))) static int nccl_fail(const loom_host *host, ncclComm_t comm,
                                                           ncclResult_t r, const char *fmt, ...)
{
    char what[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    /* ncclGetLastError describes the last error NCCL met on this thread,
     * which may be unrelated to this call: it is an addition, not the cause. */
    const char *last = ncclGetLastError(comm);
    return host->error(host, nccl_status(r), "comm-nccl: %s: %s%s%s%s", what, ncclGetErrorString(r),
                       last && *last ? " (" : "", last && *last ? last : "",
                       last && *last ? ")" : "");
}

static int cuda_fail(const loom_host *host, cudaError_t e, const char *what)
{
    return host->error(host, LOOM_ERR_INTERNAL, "comm-nccl: %s: %s", what, cudaGetErrorString(e));
}

/* Record that the group is unusable. After an error or a timeout, NCCL's
 * documentation allows nothing but ncclCommAbort on the communicator (no
 * assumption holds about ops already enqueued), so that happens here. */
static void comm_fail(loom_comm *c, int status, const char *why)
{
    group_fail(&c->group, status, why);
    if (c->nccl) {
        /* ncclCommAbort frees the communicator and stops its kernels without
         * waiting for the peers; the handle is gone after it. */
        ncclCommAbort(c->nccl);
        c->nccl = NULL;
    }
}

/* A non-blocking NCCL call that returned ncclInProgress goes on in the
 * background; NCCL's documentation says to poll ncclCommGetAsyncError on
 * that communicator until it leaves ncclInProgress before any other NCCL
 * call on it, and not to enqueue other work on its streams meanwhile.
 * Returns NCCL's final state, or ncclInProgress if the deadline passed. */
typedef struct settling {
    ncclComm_t comm;
    ncclResult_t state;
} settling;

static int settle_poll(void *arg)
{
    settling *s = arg;
    ncclResult_t q = ncclCommGetAsyncError(s->comm, &s->state);
    if (q != ncclSuccess)
        s->state = q;
    return s->state == ncclInProgress ? LOOM_IN_PROGRESS : LOOM_OK;
}

static ncclResult_t settle(ncclComm_t comm, ncclResult_t r, double deadline)
{
    settling s = {comm, r};
    if (r == ncclInProgress)
        clock_poll(settle_poll, &s, deadline - clock_now_s(), 1);
    return s.state;
}

/* A non-blocking communicator may keep the error of a failed call as its
 * state, and then refuses every later call but ncclCommAbort. Whether the
 * communicator can still be used after a call failed: */
static int still_usable(ncclComm_t comm)
{
    ncclResult_t state = ncclSuccess;
    return comm && ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclSuccess;
}

static loom_comm *comm_alloc(const loom_host *host, int rank, int size, const nccl_settings_t *s)
{
    loom_comm *c = calloc(1, sizeof *c);
    if (!c || group_init(&c->group, host, "comm-nccl", rank, size) != LOOM_OK) {
        free(c);
        return NULL;
    }
    c->set = *s;
    return c;
}

/* The parts every communicator has besides the NCCL one: its stream (a
 * non-blocking one, so our ops never wait for work on the legacy default
 * stream) and the barrier's device word, allocated through the core so the
 * accounting sees it. */
static int comm_finish_setup(loom_comm *c)
{
    const loom_host *h = c->group.host;
    cudaError_t e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        c->stream = NULL;
        return cuda_fail(h, e, "cudaStreamCreateWithFlags");
    }
    int st = h->mem_alloc(h, LOOM_TIER_DEVICE, LOOM_PURPOSE_COMM, sizeof(float), &c->barrier_buf);
    if (st != LOOM_OK)
        c->barrier_buf = NULL;
    return st;
}

/* Give back the stages the device is done with, keep the others. */
static void sweep_deferred(loom_comm *c)
{
    deferred_free **p = &c->deferred;
    while (*p) {
        deferred_free *d = *p;
        if (d->after && cudaEventQuery(d->after) == cudaSuccess) {
            *p = d->next;
            c->group.host->mem_free(c->group.host, d->ptr);
            cudaEventDestroy(d->after);
            free(d);
        } else {
            p = &d->next;
        }
    }
}

/* Keep a stage whose op may still be running until the device is past it.
 * CUDA documents only that cudaFree "may perform implicit synchronization"
 * (cuda_runtime_api.h), so freeing it now could pull the memory from under
 * the op, and where cudaFree does wait for the whole device, a kernel of
 * another group stuck on a dead peer would make it wait forever. */
static void defer_stage(loom_comm *c, loom_comm_request *r)
{
    deferred_free *d = malloc(sizeof *d);
    /* An op never handed to NCCL may still have its staging copy queued:
     * an event recorded now comes after that copy. */
    if (d && !r->recorded && cudaEventRecord(r->done, c->stream) != cudaSuccess) {
        free(d);
        d = NULL;
    }
    if (!d) {
        c->group.host->log(c->group.host, LOOM_LOG_WARN,
                     "comm-nccl: %s: a staging buffer is not freed: the device may still use it",
                     c->group.desc);
    } else {
        d->ptr = r->stage;
        d->after = r->done; /* the event now belongs to the list */
        d->next = c->deferred;
        c->deferred = d;
        r->done = NULL;
    }
    r->stage = NULL;
}

static int stream_poll(void *stream)
{
    cudaError_t e = cudaStreamQuery(stream);
    return e == cudaErrorNotReady ? LOOM_IN_PROGRESS
           : e == cudaSuccess     ? LOOM_OK
                                  : LOOM_ERR_INTERNAL;
}

/* Whether every op of this stream ended, waiting at most wait_s. */
static int stream_idle(cudaStream_t s, double wait_s)
{
    return clock_poll(stream_poll, s, wait_s, 1) == LOOM_OK;
}

/* Device memory of the group goes back only once its stream is idle (see
 * defer_stage): after a failure that may never happen, and then the few
 * bytes stay allocated, with a warning, rather than risk a hang. */
static void comm_free(loom_comm *c, double wait_s)
{
    if (!c)
        return;
    const loom_host *h = c->group.host;
    if (c->stream && (c->deferred || c->barrier_buf) && !stream_idle(c->stream, wait_s)) {
        int n = !!c->barrier_buf;
        for (deferred_free *d = c->deferred; d; d = d->next)
            n++;
        h->log(h, LOOM_LOG_WARN,
               "comm-nccl: destroying %s: %d device buffer(s) are not freed: the GPU still runs "
               "work of this group",
               c->group.desc, n);
        while (c->deferred) {
            deferred_free *d = c->deferred;
            c->deferred = d->next;
            if (d->after) /* pending is fine: CUDA frees it when the device gets there */
                cudaEventDestroy(d->after);
            free(d);
        }
        c->barrier_buf = NULL;
    }
    while (c->deferred) {
        deferred_free *d = c->deferred;
        c->deferred = d->next;
        h->mem_free(h, d->ptr);
        if (d->after)
            cudaEventDestroy(d->after);
        free(d);
    }
    if (c->barrier_buf)
        h->mem_free(h, c->barrier_buf);
    if (c->compute_mark)
        cudaEventDestroy(c->compute_mark);
    if (c->stream)
        cudaStreamDestroy(c->stream); /* returns at once; queued work ends first */
    group_release(&c->group);
    free(c);
}

/* The current CUDA device is per thread: a thread that posts on this group
 * may not be the one that made it, and events, streams and staging memory
 * must be on the group's device (cudaEventRecord fails across devices). */
static int use_device(const loom_comm *c)
{
    int cur = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e == cudaSuccess && cur == c->device)
        return LOOM_OK;
    if ((e = cudaSetDevice(c->device)) != cudaSuccess)
        return cuda_fail(c->group.host, e, "cudaSetDevice");
    return LOOM_OK;
}

/* The communicator's own config: non-blocking, named in NCCL's logs by our id. */
static ncclConfig_t comm_config(const loom_comm *c)
{
    /* NCCL_CONFIG_INITIALIZER is required: an uninitialised config is an
     * error, and unset fields keep NCCL's defaults. */
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = c->group.id;
    return config;
}

/* ------------------------------------------------------ world creation */

/* Which device this rank drives, and make it current: ncclCommInitRank*
 * binds the communicator to the current device, and our streams and device
 * memory must be on it too. No device at all is the one-line refusal the
 * machines without a GPU see. */
static int select_device(const loom_host *host, const nccl_settings_t *s, int *device)
{
    /* Without a driver, cudaGetDeviceCount fails and leaves the count as it
     * was: start from 0 and trust the return code. */
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
        return host->error(host, LOOM_ERR_NOT_SUPPORTED,
                           "comm-nccl: no CUDA device visible (cudaGetDeviceCount: %s)",
                           cudaGetErrorString(e));
    if (count < 1)
        return host->error(host, LOOM_ERR_NOT_SUPPORTED,
                           "comm-nccl: no CUDA device visible (cudaGetDeviceCount: 0 devices)");
    int d = s->device;
    if (d >= count)
        return host->error(host, LOOM_ERR_INVALID,
                           "comm-nccl: comm.nccl.device = %d, but this machine shows %d CUDA "
                           "device%s (0..%d)",
                           d, count, count > 1 ? "s" : "", count - 1);
    if (d < 0) {
        if (host->local_rank >= count)
            return host->error(host, LOOM_ERR_INVALID,
                               "comm-nccl: rank %d is local rank %d on its machine, which shows "
                               "only %d CUDA device%s; NCCL needs a device per rank: start at "
                               "most %d ranks per machine",
                               host->rank, host->local_rank, count, count > 1 ? "s" : "", count);
        d = host->local_rank > 0 ? host->local_rank : 0;
    }
    if ((e = cudaSetDevice(d)) != cudaSuccess)
        return cuda_fail(host, e, "cudaSetDevice");
    *device = d;
    return LOOM_OK;
}

static int nccl_create_world(const loom_host *host, loom_comm **out)
{
    if (!out)
        return LOOM_ERR_INVALID;
    *out = NULL;
    int device = -1, st = group_check_world(host, "comm-nccl");
    if (st != LOOM_OK)
        return st;
    nccl_settings_t s;
    read_settings(host, &s);
    if ((st = select_device(host, &s, &device)) != LOOM_OK)
        return st;

    loom_comm *c = comm_alloc(host, host->rank, host->world_size, &s);
    if (!c)
        return host->error(host, LOOM_ERR_NO_MEMORY, "comm-nccl: out of memory");
    c->device = device;
    group_set_world(&c->group);

    /* Every rank counts the worlds it made in the store: the same count on
     * every rank names this world's unique id without a process global. */
    char key[160];
    int64_t nth = 0;
    snprintf(key, sizeof key, "worlds/%d", host->rank);
    if ((st = host->kv_add(host, key, 1, &nth)) != LOOM_OK) {
        comm_free(c, 0);
        return st;
    }
    snprintf(c->group.id, sizeof c->group.id, "w%lld", (long long)nth);

    /* ncclGetUniqueId is called once, by one rank, and the id reaches every
     * rank before ncclCommInitRank* (NCCL's documented order). */
    ncclUniqueId uid;
    snprintf(key, sizeof key, "%s/uid", c->group.id);
    if (host->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&uid);
        if (r != ncclSuccess) {
            comm_free(c, 0);
            return nccl_fail(host, NULL, r, "create_world: ncclGetUniqueId");
        }
        st = host->kv_put(host, key, &uid, sizeof uid);
    } else {
        size_t len = 0;
        st = host->kv_get(host, key, &uid, sizeof uid, &len, s.timeout_s);
        if (st == LOOM_OK && len != sizeof uid)
            st = host->error(host, LOOM_ERR_INTERNAL,
                             "comm-nccl: create_world: the unique id in the store has %zu bytes, "
                             "not %zu; are all ranks running the same loom?",
                             len, sizeof uid);
    }
    if (st != LOOM_OK) {
        comm_free(c, 0);
        return st;
    }

    ncclConfig_t config = comm_config(c);
    double deadline = clock_now_s() + s.timeout_s;
    ncclComm_t nc = NULL;
    /* Non-blocking, the call returns ncclInProgress with the handle already
     * filled in, and the new communicator's state says when it is ready. */
    ncclResult_t r = ncclCommInitRankConfig(&nc, c->group.size, uid, c->group.rank, &config);
    if (r == ncclInProgress && !nc)
        r = ncclInternalError; /* nothing to poll: NCCL broke its own contract */
    if (nc)
        r = settle(nc, r, deadline);
    if (r != ncclSuccess) {
        if (r == ncclInProgress)
            st = host->error(host, LOOM_ERR_TIMEOUT,
                             "comm-nccl: create_world on %s timed out after %.1f s: not every "
                             "rank reached ncclCommInitRankConfig (NCCL_DEBUG=INFO shows which)",
                             c->group.desc, s.timeout_s);
        else
            st = nccl_fail(host, nc, r, "create_world on %s: ncclCommInitRankConfig",
                           c->group.desc);
        if (nc)
            ncclCommAbort(nc);
        comm_free(c, 0);
        return st;
    }
    c->nccl = nc;
    if ((st = comm_finish_setup(c)) != LOOM_OK) {
        ncclCommAbort(c->nccl);
        c->nccl = NULL;
        comm_free(c, 0);
        return st;
    }
    int version = 0;
    ncclGetVersion(&version);
    host->log(host, LOOM_LOG_DEBUG, "NCCL %d: rank %d of %d on CUDA device %d", version,
              c->group.rank, c->group.size, device);
    *out = c;
    return LOOM_OK;
}

/* --------------------------------------------------------- subgroups */

static int nccl_create_subgroup(loom_comm *parent, const int *ranks, int nranks, loom_comm **out)
{
    if (!out || !parent)
        return LOOM_ERR_INVALID;
    *out = NULL;
    const loom_host *h = parent->group.host;
    int me = rank_list_index(ranks, parent->group.rank), color = ranks[0];
    for (int i = 1; i < nranks; i++)
        color = ranks[i] < color ? ranks[i] : color;
    int st = group_refuse_failed(&parent->group, "create_subgroup", LOOM_ERR_REMOTE);
    if (st == LOOM_OK)
        st = use_device(parent);
    if (st != LOOM_OK)
        return st;
    /* NCCL's ncclCommSplit page: no NCCL operation may be outstanding on
     * the parent, or the split may deadlock. Ops still held by a bracket
     * cannot be flushed here; posted ones end without this rank's help (every
     * rank posted them before reaching the split), so wait, bounded, for the
     * parent's stream. */
    if (parent->grouping > 0)
        return h->error(h, LOOM_ERR_INVALID,
                        "comm-nccl: create_subgroup on %s inside group_start/group_end; end the "
                        "group first",
                        parent->group.desc);
    if (parent->group.pending && !stream_idle(parent->stream, parent->set.timeout_s))
        return h->error(h, LOOM_ERR_TIMEOUT,
                        "comm-nccl: create_subgroup on %s: operations posted on the group did not "
                        "finish within %.1f s, and ncclCommSplit needs none outstanding",
                        parent->group.desc, parent->set.timeout_s);
    loom_comm *c = comm_alloc(h, me, nranks, &parent->set);
    if (!c)
        return h->error(h, LOOM_ERR_NO_MEMORY, "comm-nccl: out of memory");
    c->device = parent->device;
    for (int i = 0; i < nranks; i++)
        c->group.world_ranks[i] = parent->group.world_ranks[ranks[i]];
    group_describe(&c->group);
    /* ncclCommSplit is collective over the whole parent, so every parent
     * rank numbers its splits alike. */
    snprintf(c->group.id, sizeof c->group.id, "%.60s.s%d", parent->group.id, parent->nsubs++);

    /* Members of one list share a color (its smallest parent rank, distinct
     * between disjoint lists); key = place in the list orders the new ranks
     * as the list does (NCCL orders by key, ties by parent rank). */
    ncclConfig_t config = comm_config(c);
    double deadline = clock_now_s() + c->set.timeout_s;
    ncclComm_t nc = NULL;
    parent->split_out = NULL;
    ncclResult_t r = ncclCommSplit(parent->nccl, color, me, &parent->split_out, &config);
    /* Non-blocking, the split runs on in NCCL's own thread: it is the
     * PARENT whose state stays ncclInProgress until the split ends, and the
     * child handle is written only then (NVIDIA/nccl#1472). So the parent is
     * polled, and split_out is not read before the parent settled. */
    /* ncclSuccess from the call itself does not mean the split ended: a
     * one-rank parent has been seen to return it with the child still
     * unwritten, so the parent is settled either way. */
    if (r == ncclInProgress || r == ncclSuccess)
        r = settle(parent->nccl, ncclInProgress, deadline);
    if (r == ncclInProgress) {
        char why[512];
        snprintf(why, sizeof why,
                 "create_subgroup on %s timed out after %.1f s in ncclCommSplit, which every rank "
                 "of the parent must call (a rank alone in its subgroup must call it too)",
                 parent->group.desc, c->set.timeout_s);
        /* Aborting the parent stops the split's thread and waits for it
         * (NCCL's abort completes the parent's pending group job); a child
         * it made by then is aborted too. */
        comm_fail(parent, LOOM_ERR_TIMEOUT, why);
        nc = parent->split_out;
        st = h->error(h, LOOM_ERR_TIMEOUT, "comm-nccl: %s", why);
    } else if (r != ncclSuccess) {
        nc = parent->split_out; /* a child whose setup failed is handed back too */
        st = nccl_fail(h, parent->nccl, r, "create_subgroup on %s: ncclCommSplit",
                       parent->group.desc);
        if (!still_usable(parent->nccl))
            comm_fail(parent, st, "ncclCommSplit failed and left the group unusable");
    } else {
        nc = parent->split_out;
        if (!nc)
            st = h->error(h, LOOM_ERR_INTERNAL,
                          "comm-nccl: create_subgroup on %s: ncclCommSplit succeeded but made no "
                          "communicator",
                          parent->group.desc);
        else if ((r = settle(nc, ncclInProgress, deadline)) != ncclSuccess)
            /* the child's own state: ready once the parent is (NVIDIA/nccl#1472) */
            st = r == ncclInProgress
                     ? h->error(h, LOOM_ERR_TIMEOUT,
                                "comm-nccl: create_subgroup on %s: the new communicator was not "
                                "ready within %.1f s",
                                parent->group.desc, c->set.timeout_s)
                     : nccl_fail(h, nc, r, "create_subgroup on %s: the new communicator",
                                 parent->group.desc);
    }
    parent->split_out = NULL;
    if (st == LOOM_OK) {
        /* NCCL counts the ranks that passed our color: a member that passed
         * a different list shows up here instead of as a hang later. */
        int count = 0, rank = -1;
        if ((r = ncclCommCount(nc, &count)) != ncclSuccess ||
            (r = ncclCommUserRank(nc, &rank)) != ncclSuccess)
            st = nccl_fail(h, nc, r, "create_subgroup on %s: ncclCommCount/ncclCommUserRank",
                           parent->group.desc);
        else if (count != nranks || rank != me)
            st = h->error(h, LOOM_ERR_INVALID,
                          "comm-nccl: create_subgroup on %s: NCCL made rank %d of %d, this rank's "
                          "list says %d of %d; every member must pass the same list",
                          parent->group.desc, rank, count, me, nranks);
    }
    if (st == LOOM_OK) {
        c->nccl = nc;
        st = comm_finish_setup(c);
    }
    if (st != LOOM_OK) {
        if (nc)
            ncclCommAbort(nc);
        c->nccl = NULL;
        comm_free(c, 0);
        return st;
    }
    *out = c;
    return LOOM_OK;
}

/* --------------------------------------------------------- requests */

static void req_link(loom_comm *c, loom_comm_request *r)
{
    group_track(&c->group, &r->pending, r);
}

static void req_release(loom_comm_request *r)
{
    loom_comm *c = r->comm;
    if (c)
        group_untrack(&c->group, &r->pending);
    /* The stage of an op the device may not be done with waits on the
     * group's list; an orphan's stage was taken over by destroy. */
    if (r->stage && !r->complete && c)
        defer_stage(c, r);
    /* A pending event may be destroyed: the call does not block and CUDA
     * frees it at completion (cudaEventDestroy in cuda_runtime_api.h). */
    if (r->done)
        cudaEventDestroy(r->done);
    if (r->stage)
        r->host->mem_free(r->host, r->stage);
    free(r);
}

static void req_describe(const loom_comm_request *r, const loom_comm *c, char *buf, size_t cap)
{
    group_describe_op(c ? &c->group : NULL, r->name, r->seq, r->call.peer, r->call.tag, buf, cap);
}

/* The compute backend's kernels issued so far (on its native queue,
 * loom_compute_api) may still be writing this op's buffers: the op's stream
 * waits for them on the device, so the host never waits and a collective
 * overlaps the kernels issued after it. */
static int follow_compute(loom_comm *c)
{
    const loom_host *h = c->group.host;
    const loom_compute_api *api = h->compute;
    if (!api || api->struct_size < offsetof(loom_compute_api, native_queue) + sizeof(void *) ||
        !api->native_queue)
        return LOOM_OK;
    cudaError_t e = cudaSuccess;
    if (!c->compute_mark)
        e = cudaEventCreateWithFlags(&c->compute_mark, cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaEventRecord(c->compute_mark, (cudaStream_t)api->native_queue);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(c->stream, c->compute_mark, 0);
    return e == cudaSuccess ? LOOM_OK
                            : cuda_fail(h, e, "ordering an op after the compute backend's kernels");
}

/* Begin an op: number it, refuse it on a failed group, make its request
 * (NULL with LOOM_OK for an op of no elements, complete at issue). */
static int op_begin(loom_comm *c, const comm_call *call, loom_comm_request **out)
{
    *out = NULL;
    const loom_host *h = c->group.host;
    const char *name = loom_comm_op_name(call->op);
    int collective = !call_is_p2p(call);
    uint64_t seq;
    if (c->deferred)
        sweep_deferred(c);
    int st = group_begin(&c->group, name, collective, &seq);
    if (st != LOOM_OK)
        return st;
    if (nccl_dtype(call->dtype) == ncclNumTypes)
        return h->error(h, LOOM_ERR_NOT_SUPPORTED, "comm-nccl: %s #%llu: dtype %s is not supported",
                        name, (unsigned long long)seq, loom_dtype_name(call->dtype));
    if (call_is_empty(call)) /* complete at issue, on every rank alike */
        return LOOM_OK;
    if ((st = use_device(c)) != LOOM_OK)
        return st;
    loom_comm_request *r = calloc(1, sizeof *r);
    if (!r)
        return group_no_memory(&c->group, name, seq);
    r->comm = c;
    r->host = h;
    r->name = name;
    r->collective = collective;
    r->seq = seq;
    r->call = *call;
    /* cudaEventDisableTiming: we only query the event, which is what the
     * flag is for (the cheapest events). */
    cudaError_t e = cudaEventCreateWithFlags(&r->done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(r);
        return cuda_fail(h, e, "cudaEventCreateWithFlags");
    }
    if ((st = follow_compute(c)) != LOOM_OK) {
        cudaEventDestroy(r->done);
        free(r);
        return st;
    }
    *out = r;
    return LOOM_OK;
}

/* NCCL's in-place forms are exact pointer relations; any other overlap of
 * send and recv is a race inside NCCL, so such a send buffer is copied to a
 * device stage first, on the op's own stream (ordered before the op). */
static int stage_send(loom_comm_request *r, size_t bytes)
{
    loom_comm *c = r->comm;
    const loom_host *h = c->group.host;
    int st = h->mem_alloc(h, LOOM_TIER_DEVICE, LOOM_PURPOSE_COMM, bytes, &r->stage);
    if (st != LOOM_OK) {
        r->stage = NULL;
        return st;
    }
    cudaError_t e =
        cudaMemcpyAsync(r->stage, r->call.send, bytes, cudaMemcpyDeviceToDevice, c->stream);
    if (e != cudaSuccess)
        return cuda_fail(h, e, "staging an overlapping send buffer (cudaMemcpyAsync)");
    r->call.send = r->stage;
    return LOOM_OK;
}

/* Hand one op to NCCL (inside a group, it is only recorded by NCCL until
 * ncclGroupEnd). Collectives return once enqueued on the stream. */
static ncclResult_t issue(loom_comm_request *r)
{
    const comm_call *a = &r->call;
    loom_comm *c = r->comm;
    ncclDataType_t t = nccl_dtype(a->dtype);
    ncclRedOp_t op = nccl_op(a->redop);
    ncclComm_t nc = c->nccl;
    cudaStream_t s = c->stream;
    r->posted = 1;
    switch (a->op) {
    case LOOM_OP_ALLREDUCE:
    case LOOM_OP_BARRIER: return ncclAllReduce(a->send, a->recv, a->count, t, op, nc, s);
    case LOOM_OP_BROADCAST: return ncclBroadcast(a->recv, a->recv, a->count, t, a->root, nc, s);
    case LOOM_OP_REDUCE: /* recvbuff may be NULL except on the root */
        return ncclReduce(a->send, c->group.rank == a->root ? a->recv : NULL, a->count, t, op,
                          a->root, nc, s);
    case LOOM_OP_ALLGATHER: return ncclAllGather(a->send, a->recv, a->count, t, nc, s);
    case LOOM_OP_REDUCESCATTER: return ncclReduceScatter(a->send, a->recv, a->count, t, op, nc, s);
    case LOOM_OP_ALLTOALL: {
        /* One fused group of a send and a receive per peer (self included):
         * NCCL runs the sends and receives of one group concurrently, so
         * the pairwise exchange cannot deadlock. Groups nest, so this is
         * right inside a user's bracket too. */
        size_t block = a->count * loom_dtype_size(a->dtype);
        ncclResult_t res = ncclGroupStart();
        for (int j = 0; j < c->group.size && res == ncclSuccess; j++) {
            res = ncclSend((const char *)a->send + (size_t)j * block, a->count, t, j, nc, s);
            if (res == ncclSuccess)
                res = ncclRecv((char *)a->recv + (size_t)j * block, a->count, t, j, nc, s);
        }
        ncclResult_t end = ncclGroupEnd();
        return res != ncclSuccess ? res : end;
    }
    case LOOM_OP_SEND: return ncclSend(a->send, a->count, t, a->peer, nc, s);
    case LOOM_OP_RECV: return ncclRecv(a->recv, a->count, t, a->peer, nc, s);
    default: return ncclInvalidArgument;
    }
}

/* Outside a bracket: issue now, wait (bounded) until NCCL has it enqueued,
 * then put the completion event behind it. Inside a bracket: keep it for
 * group_end. */
static int op_post(loom_comm *c, loom_comm_request *r, const char *fn, loom_comm_request **out)
{
    const loom_host *h = c->group.host;
    req_link(c, r);
    if (c->grouping > 0) {
        *out = r;
        return LOOM_OK;
    }
    ncclResult_t res = settle(c->nccl, issue(r), clock_now_s() + c->set.timeout_s);
    char what[400];
    if (res != ncclSuccess) {
        req_describe(r, c, what, sizeof what);
        int st;
        if (res == ncclInProgress) {
            char why[600];
            snprintf(why, sizeof why, "%s: %s did not finish enqueueing within %.1f s", what, fn,
                     c->set.timeout_s);
            comm_fail(c, LOOM_ERR_TIMEOUT, why);
            st = h->error(h, LOOM_ERR_TIMEOUT, "comm-nccl: %s; the communicator was aborted", why);
        } else {
            st = nccl_fail(h, c->nccl, res, "%s: %s", what, fn);
            /* An argument error may leave the communicator usable, unless
             * NCCL kept it as the communicator's state; anything else may
             * have left work half enqueued. */
            if ((res != ncclInvalidArgument && res != ncclInvalidUsage) || !still_usable(c->nccl))
                comm_fail(c, st, "an earlier NCCL call failed");
        }
        req_release(r);
        return st;
    }
    cudaError_t e = cudaEventRecord(r->done, c->stream);
    if (e != cudaSuccess) {
        req_describe(r, c, what, sizeof what);
        int st = h->error(h, LOOM_ERR_INTERNAL, "comm-nccl: %s: cudaEventRecord: %s", what,
                          cudaGetErrorString(e));
        comm_fail(c, st, "a CUDA call failed");
        req_release(r);
        return st;
    }
    r->recorded = 1;
    *out = r;
    return LOOM_OK;
}

/* ---------------------------------------------------------------- ops */

/* Every op (common/call.h). A barrier is an allreduce of one float: NCCL
 * has no barrier, and the allreduce completes on no rank before every rank
 * has joined it. */
int comm_post(loom_comm *c, const comm_call *call, loom_comm_request **req)
{
    comm_call a = *call;
    if (a.op == LOOM_OP_BARRIER) {
        a.send = a.recv = c->barrier_buf;
        a.count = 1;
        a.dtype = LOOM_F32;
    }
    loom_comm_request *r;
    int st = op_begin(c, &a, &r), rank = c->group.rank;
    if (st != LOOM_OK || !r)
        return st;
    size_t send_bytes, recv_bytes;
    call_extents(&a, rank, c->group.size, &send_bytes, &recv_bytes);
    /* NCCL's in-place reducescatter is recv == send + rank * count; any
     * other overlap (send == recv on a rank other than 0, say) goes through
     * a stage. */
    int in_place = call_in_place(&a, rank) ||
                   (a.op == LOOM_OP_REDUCESCATTER &&
                    (const char *)a.recv == (const char *)a.send + (size_t)rank * recv_bytes);
    if (!in_place && buffers_overlap(a.send, send_bytes, a.recv, recv_bytes) &&
        (st = stage_send(r, send_bytes)) != LOOM_OK) {
        req_release(r);
        return st;
    }
    return op_post(c, r, nccl_call_name[a.op], req);
}

/* ------------------------------------------------- group brackets */

static int nccl_group_start(loom_comm *c)
{
    if (!c)
        return LOOM_ERR_INVALID;
    c->grouping++;
    return LOOM_OK;
}

/* The order in which a bracket's ops reach NCCL: collectives first, in
 * posting order (every rank posts them alike); then point-to-point sorted
 * by peer, tag and posting order. Both ends of a pair sort alike, so the
 * k-th message of tag t to a peer meets the k-th receive of tag t from us,
 * which is loom's (peer, tag) matching on top of NCCL's posting order. */
static int bracket_order(const void *a_, const void *b_)
{
    const loom_comm_request *a = *(loom_comm_request *const *)a_;
    const loom_comm_request *b = *(loom_comm_request *const *)b_;
    if (a->collective != b->collective)
        return a->collective ? -1 : 1;
    if (a->collective)
        return a->seq < b->seq ? -1 : a->seq > b->seq;
    if (a->call.peer != b->call.peer)
        return a->call.peer < b->call.peer ? -1 : 1;
    if (a->call.op != b->call.op)
        return a->call.op < b->call.op ? -1 : 1;
    if (a->call.tag != b->call.tag)
        return a->call.tag < b->call.tag ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

static int nccl_group_end(loom_comm *c)
{
    if (!c)
        return LOOM_ERR_INVALID;
    const loom_host *h = c->group.host;
    if (c->grouping <= 0)
        return h->error(h, LOOM_ERR_INVALID, "comm-nccl: group_end on %s without group_start",
                        c->group.desc);
    if (--c->grouping > 0)
        return LOOM_OK;
    int n = 0;
    for (comm_pending *p = c->group.pending; p; p = p->next)
        n += !p->request->posted;
    if (n == 0)
        return LOOM_OK;
    int st = group_refuse_failed(&c->group, "group_end", 0);
    if (st != LOOM_OK)
        return st;
    loom_comm_request **list = malloc((size_t)n * sizeof *list);
    if (!list)
        return h->error(h, LOOM_ERR_NO_MEMORY, "comm-nccl: out of memory");
    int k = 0;
    for (comm_pending *p = c->group.pending; p; p = p->next)
        if (!p->request->posted)
            list[k++] = p->request;
    qsort(list, (size_t)n, sizeof *list, bracket_order);

    /* Nothing starts on the stream until ncclGroupEnd, which enqueues the
     * whole fused operation; work that depends on it (our events) must be
     * enqueued after it. */
    ncclResult_t res = ncclGroupStart();
    for (int i = 0; i < n && res == ncclSuccess; i++)
        res = issue(list[i]);
    ncclResult_t end = ncclGroupEnd();
    if (res == ncclSuccess)
        res = settle(c->nccl, end, clock_now_s() + c->set.timeout_s);
    if (res != ncclSuccess) {
        char what[400];
        req_describe(list[0], c, what, sizeof what);
        if (res == ncclInProgress) {
            char why[600];
            snprintf(why, sizeof why,
                     "group_end of %d op(s) (first: %s) did not finish enqueueing within %.1f s", n,
                     what, c->set.timeout_s);
            comm_fail(c, LOOM_ERR_TIMEOUT, why);
            st = h->error(h, LOOM_ERR_TIMEOUT, "comm-nccl: %s; the communicator was aborted", why);
        } else {
            st = nccl_fail(h, c->nccl, res, "group_end of %d op(s) (first: %s)", n, what);
            comm_fail(c, st, "an earlier NCCL group failed");
        }
        /* The requests stay: their test/wait report the failure and release them. */
    } else {
        for (int i = 0; i < n && st == LOOM_OK; i++) {
            cudaError_t e = cudaEventRecord(list[i]->done, c->stream);
            if (e != cudaSuccess) {
                st = cuda_fail(h, e, "cudaEventRecord after ncclGroupEnd");
                comm_fail(c, st, "a CUDA call failed");
            } else {
                list[i]->recorded = 1;
            }
        }
    }
    free(list);
    return st;
}

/* ------------------------------------------------------ completion */

/* One look at a request (a clock_poll callback): LOOM_OK (done),
 * LOOM_IN_PROGRESS, or an error; the request is released unless in
 * progress. */
static int req_poll(void *arg)
{
    loom_comm_request *r = arg;
    loom_comm *c = r->comm;
    const loom_host *h = r->host;
    char what[400];
    if (!c) {
        int st = h->error(h, LOOM_ERR_INVALID,
                          "comm-nccl: %s #%llu: its group was destroyed while it was in flight",
                          r->name, (unsigned long long)r->seq);
        req_release(r);
        return st;
    }
    if (!r->posted && c->grouping > 0 && !c->group.failed) {
        req_describe(r, c, what, sizeof what);
        return h->error(h, LOOM_ERR_INVALID,
                        "comm-nccl: %s was posted inside group_start and is tested before "
                        "group_end; end the group first (the request stays valid)",
                        what);
    }
    if (c->group.failed || !c->nccl || !r->recorded) {
        req_describe(r, c, what, sizeof what);
        int st = h->error(h, c->group.fail_status ? c->group.fail_status : LOOM_ERR_REMOTE,
                          "comm-nccl: %s abandoned: the group failed: %s", what, c->group.failure);
        req_release(r);
        return st;
    }
    /* cudaEventQuery: cudaSuccess once everything before the event ran,
     * cudaErrorNotReady while not; any other result is an error, maybe of
     * earlier work on the device. It is read BEFORE the communicator's
     * state: kernels that NCCL stopped after an error also end, so an event
     * that completed counts only if the communicator had no error by then. */
    cudaError_t e = cudaEventQuery(r->done);
    /* An error of the communicator (a peer that went away, a network
     * failure) shows up here, not in the event: NCCL's kernels may never
     * finish after it, so abort rather than wait for them. */
    ncclResult_t state = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(c->nccl, &state);
    if (q != ncclSuccess)
        state = q;
    if (state != ncclSuccess && state != ncclInProgress) {
        req_describe(r, c, what, sizeof what);
        char why[1024];
        const char *last = ncclGetLastError(c->nccl); /* before the abort frees it */
        snprintf(why, sizeof why, "%s failed: %s%s%s%s", what, ncclGetErrorString(state),
                 last && *last ? " (" : "", last && *last ? last : "", last && *last ? ")" : "");
        int st = nccl_status(state);
        comm_fail(c, st, why);
        req_release(r);
        return h->error(h, st, "comm-nccl: %s; the communicator was aborted", why);
    }
    if (e == cudaErrorNotReady)
        return LOOM_IN_PROGRESS;
    if (e != cudaSuccess) {
        req_describe(r, c, what, sizeof what);
        int st = h->error(h, LOOM_ERR_INTERNAL, "comm-nccl: %s: CUDA reports %s", what,
                          cudaGetErrorString(e));
        comm_fail(c, st, "a CUDA error");
        req_release(r);
        return st;
    }
    r->complete = 1;
    req_release(r);
    return LOOM_OK;
}

static int nccl_test(loom_comm_request *r) { return r ? req_poll(r) : LOOM_OK; }

static int nccl_wait(loom_comm_request *r)
{
    if (!r)
        return LOOM_OK;
    double timeout = r->comm ? r->comm->set.timeout_s : 0;
    int st = clock_poll(req_poll, r, timeout, 1);
    if (st != LOOM_IN_PROGRESS)
        return st;
    loom_comm *c = r->comm;
    const loom_host *h = c->group.host;
    char what[400], detail[1536];
    req_describe(r, c, what, sizeof what);
    snprintf(detail, sizeof detail, "%s timed out after %.1f s", what, timeout);
    comm_fail(c, LOOM_ERR_TIMEOUT, detail);
    req_release(r);
    return h->error(h, LOOM_ERR_TIMEOUT, "comm-nccl: aborted the communicator: %s", detail);
}

/* ------------------------------------------------- lifetime */

static int nccl_destroy(loom_comm *c)
{
    if (!c)
        return LOOM_OK;
    const loom_host *h = c->group.host;
    use_device(c); /* for the frees below; a failure here shows in them */
    int st = LOOM_OK, orphans = 0;
    for (comm_pending *p = c->group.pending; p; p = p->next) {
        loom_comm_request *r = p->request;
        r->comm = NULL;
        orphans++;
        /* The group keeps an orphan's stage until its stream is idle. */
        deferred_free *d = r->stage ? malloc(sizeof *d) : NULL;
        if (d) {
            d->ptr = r->stage;
            d->after = NULL;
            d->next = c->deferred;
            c->deferred = d;
        }
        r->stage = NULL;
    }
    c->group.pending = NULL;
    if (orphans) {
        h->log(h, LOOM_LOG_WARN, "comm-nccl: %s destroyed with %d operation(s) still in flight",
               c->group.desc, orphans);
        comm_fail(c, LOOM_ERR_INVALID, "destroyed with operations in flight");
    }
    if (c->nccl) {
        /* Non-blocking teardown (nccl.h, ncclCommFinalize): ncclCommFinalize
         * flushes what was issued and leaves the state ncclInProgress until
         * the communicator is quiescent everywhere; once it is ncclSuccess,
         * ncclCommDestroy frees the rest without blocking. A peer that never
         * gets there turns the finalize into an abort after the timeout. */
        ncclResult_t r =
            settle(c->nccl, ncclCommFinalize(c->nccl), clock_now_s() + c->set.timeout_s);
        if (r == ncclSuccess) {
            if ((r = ncclCommDestroy(c->nccl)) != ncclSuccess)
                st = nccl_fail(h, NULL, r, "destroying %s: ncclCommDestroy", c->group.desc);
            c->nccl = NULL;
        } else {
            st = r == ncclInProgress
                     ? h->error(h, LOOM_ERR_TIMEOUT,
                                "comm-nccl: destroying %s: ncclCommFinalize did not finish within "
                                "%.1f s; aborted instead",
                                c->group.desc, c->set.timeout_s)
                     : nccl_fail(h, c->nccl, r, "destroying %s: ncclCommFinalize", c->group.desc);
            comm_fail(c, st, "destroy failed");
        }
    }
    /* A healthy group's last events follow work NCCL just flushed; after an
     * abort, give the stopped kernels a short grace. */
    comm_free(c, c->group.failed ? c->set.grace_s : c->set.timeout_s);
    return st;
}

static int nccl_abort(loom_comm *c)
{
    if (c)
        comm_fail(c, LOOM_ERR_REMOTE, "aborted after a failure");
    return LOOM_OK;
}

LOOM_PLUGIN_EXPORT const loom_comm_plugin_v1_t loom_comm_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_COMM, loom_comm_plugin_v1_t, "nccl",
                                 "NCCL collectives on CUDA device buffers, one stream per group",
                                 nccl_settings),
    /* NCCL reads and writes the buffers from GPU kernels: device memory only. */
    .mem_kinds = LOOM_MEM_BIT(LOOM_MEM_DEVICE),
    .create_world = nccl_create_world,
    .create_subgroup = nccl_create_subgroup,
    .destroy = nccl_destroy,
    COMM_COMMON_OPS,
    .test = nccl_test,
    .wait = nccl_wait,
    .group_start = nccl_group_start,
    .group_end = nccl_group_end,
    .abort = nccl_abort,
};
