/* Groups: the core's handle on a communicator. Every call goes through here
 * so bytes are counted per op and spans traced, whatever the backend. The
 * built-in `self` communicator serves groups of one rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/comm.h"
#include "loom/plugin.h"
#include "loom/status.h"
#include "loom/tensor.h"
#include "runtime/group.h"
#include "runtime/loader.h"
#include "runtime/log.h"
#include "runtime/runtime.h"
#include "runtime/trace.h"

/* Point-to-point to oneself: sends are copied eagerly and matched to
 * receives by tag in posting order. */
typedef struct self_message {
    int tag;
    size_t bytes;
    void *data;     /* an eager copy (unmatched send) */
    void *dest;     /* a posted receive waiting for data */
    int *done;      /* the posted receive's completion flag */
    struct self_message *next;
} self_message;

struct loom_group {
    loom_runtime *rt;
    const char *backend;
    const loom_plugin *plugin;         /* NULL for self */
    const loom_comm_ops *ops;          /* NULL for self */
    loom_comm *comm;
    int rank, size;
    loom_comm_counters counters;
    self_message *unmatched_sends, *pending_recvs;
};

struct loom_request {
    loom_group *group;
    loom_comm_request *inner; /* NULL: complete (self) */
    loom_comm_op op;
    uint64_t start_ns, bytes;
    int *self_done;           /* self recv: set when matched */
};

static int make_group(loom_runtime *rt, const char *backend, const loom_plugin *plugin,
                      loom_comm *comm, loom_group **out)
{
    loom_group *g = calloc(1, sizeof *g);
    if (!g)
        return loom_fail(LOOM_ERR_NO_MEMORY, "comm: out of memory");
    g->rt = rt;
    g->backend = backend;
    g->plugin = plugin;
    g->ops = plugin ? &plugin->ops.comm : NULL;
    g->comm = comm;
    g->rank = g->ops ? g->ops->rank(comm) : 0;
    g->size = g->ops ? g->ops->size(comm) : 1;
    *out = g;
    return LOOM_OK;
}

int loom_group_world(loom_runtime *rt, const char *backend, loom_group **out)
{
    int world = loom_runtime_env(rt)->world_size;
    if (!strcmp(backend, "self")) {
        if (world != 1)
            return loom_fail(LOOM_ERR_INVALID,
                             "comm: 'self' serves groups of one rank, but the job has %d ranks; "
                             "name a backend such as \"mpi\"",
                             world);
        return make_group(rt, "self", NULL, NULL, out);
    }
    const loom_plugin *plugin;
    int rc = loom_runtime_plugin(rt, LOOM_PLUGIN_COMM, backend, &plugin);
    if (rc != LOOM_OK)
        return rc;
    char group_path[96];
    snprintf(group_path, sizeof group_path, "comm.%s", plugin->header->name);
    const loom_host *host;
    rc = loom_runtime_host(rt, plugin, group_path, &host);
    if (rc != LOOM_OK)
        return rc;
    const loom_comm_ops *ops = &plugin->ops.comm;
    if (!(ops->mem_kinds & LOOM_MEM_BIT(LOOM_MEM_HOST)))
        loom_log(LOOM_LOG_DEBUG, "comm-%s does not accept host memory", plugin->header->name);
    loom_comm *comm = NULL;
    rc = ops->create_world(host, &comm);
    if (rc != LOOM_OK)
        return rc;
    rc = make_group(rt, plugin->header->name, plugin, comm, out);
    if (rc != LOOM_OK)
        ops->destroy(comm);
    return rc;
}

int loom_group_self(loom_runtime *rt, loom_group **out)
{
    return make_group(rt, "self", NULL, NULL, out);
}

int loom_group_subgroup(loom_group *parent, const int *ranks, int nranks, loom_group **out)
{
    int found = 0;
    if (nranks < 1 || nranks > parent->size)
        return loom_fail(LOOM_ERR_INVALID, "comm: a subgroup of %d ranks from a group of %d",
                         nranks, parent->size);
    for (int i = 0; i < nranks; i++) {
        if (ranks[i] < 0 || ranks[i] >= parent->size)
            return loom_fail(LOOM_ERR_INVALID, "comm: subgroup rank %d outside a group of %d",
                             ranks[i], parent->size);
        for (int j = 0; j < i; j++)
            if (ranks[j] == ranks[i])
                return loom_fail(LOOM_ERR_INVALID, "comm: subgroup lists rank %d twice", ranks[i]);
        found |= ranks[i] == parent->rank;
    }
    if (!found)
        return loom_fail(LOOM_ERR_INVALID, "comm: a subgroup must contain the calling rank %d",
                         parent->rank);
    if (nranks == 1 || !parent->ops)
        return make_group(parent->rt, "self", NULL, NULL, out);
    loom_comm *comm = NULL;
    int rc = parent->ops->create_subgroup(parent->comm, ranks, nranks, &comm);
    if (rc != LOOM_OK)
        return rc;
    rc = make_group(parent->rt, parent->backend, parent->plugin, comm, out);
    if (rc != LOOM_OK)
        parent->ops->destroy(comm);
    return rc;
}

void loom_group_destroy(loom_group *g)
{
    if (!g)
        return;
    if (g->ops)
        g->ops->destroy(g->comm);
    for (self_message *m = g->unmatched_sends, *next; m; m = next) {
        next = m->next;
        free(m->data);
        free(m);
    }
    for (self_message *m = g->pending_recvs, *next; m; m = next) {
        next = m->next;
        free(m);
    }
    free(g);
}

void loom_group_counters(const loom_group *g, loom_comm_counters *out) { *out = g->counters; }

static int g_rank(const loom_group *g) { return g->rank; }
static int g_size(const loom_group *g) { return g->size; }
static const char *g_backend(const loom_group *g) { return g->backend; }

/* Wrap a backend request (or immediate completion) and count the op. */
static int issued(loom_group *g, loom_comm_op op, uint64_t bytes, uint64_t start,
                  loom_comm_request *inner, loom_request **req)
{
    g->counters.calls[op]++;
    g->counters.bytes[op] += bytes;
    if (!inner) {
        loom_trace_span(LOOM_LANE_COMM, loom_comm_op_name(op), start, loom_now_ns(), bytes);
        *req = NULL;
        return LOOM_OK;
    }
    loom_request *r = malloc(sizeof *r);
    if (!r) {
        g->ops->wait(inner);
        return loom_fail(LOOM_ERR_NO_MEMORY, "comm: out of memory");
    }
    r->group = g;
    r->inner = inner;
    r->op = op;
    r->start_ns = start;
    r->bytes = bytes;
    r->self_done = NULL;
    *req = r;
    return LOOM_OK;
}

/* The arguments every backend may rely on (comm.h), checked once here:
 * a known dtype and reduction, a root or peer inside the group, a tag >= 0. */
static int check_call(const loom_group *g, loom_comm_op op, loom_dtype dtype, int reduces,
                      loom_redop redop, int rank, int tag)
{
    const char *name = loom_comm_op_name(op);
    if ((unsigned)dtype >= LOOM_DTYPE_COUNT)
        return loom_fail(LOOM_ERR_INVALID, "comm: %s: unknown dtype %d", name, (int)dtype);
    if (reduces && (unsigned)redop >= LOOM_REDOP_COUNT)
        return loom_fail(LOOM_ERR_INVALID, "comm: %s: unknown reduction %d", name, (int)redop);
    if (rank < 0 || rank >= g->size)
        return loom_fail(LOOM_ERR_INVALID, "comm: %s %s %d outside a group of %d", name,
                         op == LOOM_OP_SEND || op == LOOM_OP_RECV ? "peer" : "root", rank, g->size);
    if (tag < 0)
        return loom_fail(LOOM_ERR_INVALID, "comm: %s tag %d is negative", name, tag);
    return LOOM_OK;
}

static void self_copy(const void *send, void *recv, size_t bytes)
{
    if (send != recv && bytes)
        memmove(recv, send, bytes);
}

static int g_allreduce(loom_group *g, const void *send, void *recv, size_t count,
                       loom_dtype dtype, loom_redop op, loom_request **req)
{
    uint64_t t0 = loom_now_ns(), bytes = count * loom_dtype_size(dtype);
    int rc = check_call(g, LOOM_OP_ALLREDUCE, dtype, 1, op, 0, 0);
    if (rc != LOOM_OK)
        return rc;
    loom_comm_request *inner = NULL;
    if (g->ops) {
        rc = g->ops->allreduce(g->comm, send, recv, count, dtype, op, &inner);
        if (rc != LOOM_OK)
            return rc;
    } else {
        self_copy(send, recv, bytes); /* sum, max, min and avg of one value */
    }
    return issued(g, LOOM_OP_ALLREDUCE, bytes, t0, inner, req);
}

static int g_broadcast(loom_group *g, void *buf, size_t count, loom_dtype dtype, int root,
                       loom_request **req)
{
    uint64_t t0 = loom_now_ns(), bytes = count * loom_dtype_size(dtype);
    int rc = check_call(g, LOOM_OP_BROADCAST, dtype, 0, LOOM_SUM, root, 0);
    if (rc != LOOM_OK)
        return rc;
    loom_comm_request *inner = NULL;
    if (g->ops) {
        rc = g->ops->broadcast(g->comm, buf, count, dtype, root, &inner);
        if (rc != LOOM_OK)
            return rc;
    }
    return issued(g, LOOM_OP_BROADCAST, bytes, t0, inner, req);
}

static int g_reduce(loom_group *g, const void *send, void *recv, size_t count, loom_dtype dtype,
                    loom_redop op, int root, loom_request **req)
{
    uint64_t t0 = loom_now_ns(), bytes = count * loom_dtype_size(dtype);
    int rc = check_call(g, LOOM_OP_REDUCE, dtype, 1, op, root, 0);
    if (rc != LOOM_OK)
        return rc;
    loom_comm_request *inner = NULL;
    if (g->ops) {
        rc = g->ops->reduce(g->comm, send, recv, count, dtype, op, root, &inner);
        if (rc != LOOM_OK)
            return rc;
    } else {
        self_copy(send, recv, bytes);
    }
    return issued(g, LOOM_OP_REDUCE, bytes, t0, inner, req);
}

static int g_allgather(loom_group *g, const void *send, void *recv, size_t count,
                       loom_dtype dtype, loom_request **req)
{
    uint64_t t0 = loom_now_ns(), bytes = count * loom_dtype_size(dtype);
    int rc = check_call(g, LOOM_OP_ALLGATHER, dtype, 0, LOOM_SUM, 0, 0);
    if (rc != LOOM_OK)
        return rc;
    loom_comm_request *inner = NULL;
    if (g->ops) {
        rc = g->ops->allgather(g->comm, send, recv, count, dtype, &inner);
        if (rc != LOOM_OK)
            return rc;
    } else {
        self_copy(send, recv, bytes);
    }
    return issued(g, LOOM_OP_ALLGATHER, bytes * (uint64_t)g->size, t0, inner, req);
}

static int g_reducescatter(loom_group *g, const void *send, void *recv, size_t count,
                           loom_dtype dtype, loom_redop op, loom_request **req)
{
    uint64_t t0 = loom_now_ns(), bytes = count * loom_dtype_size(dtype);
    int rc = check_call(g, LOOM_OP_REDUCESCATTER, dtype, 1, op, 0, 0);
    if (rc != LOOM_OK)
        return rc;
    loom_comm_request *inner = NULL;
    if (g->ops) {
        rc = g->ops->reducescatter(g->comm, send, recv, count, dtype, op, &inner);
        if (rc != LOOM_OK)
            return rc;
    } else {
        self_copy(send, recv, bytes);
    }
    return issued(g, LOOM_OP_REDUCESCATTER, bytes * (uint64_t)g->size, t0, inner, req);
}

static int g_alltoall(loom_group *g, const void *send, void *recv, size_t count,
                      loom_dtype dtype, loom_request **req)
{
    uint64_t t0 = loom_now_ns(), bytes = count * loom_dtype_size(dtype);
    int rc = check_call(g, LOOM_OP_ALLTOALL, dtype, 0, LOOM_SUM, 0, 0);
    if (rc != LOOM_OK)
        return rc;
    loom_comm_request *inner = NULL;
    if (g->ops) {
        rc = g->ops->alltoall(g->comm, send, recv, count, dtype, &inner);
        if (rc != LOOM_OK)
            return rc;
    } else {
        self_copy(send, recv, bytes);
    }
    return issued(g, LOOM_OP_ALLTOALL, bytes * (uint64_t)g->size, t0, inner, req);
}

/* Self: match a send with the first pending receive of its tag, else keep
 * an eager copy for a later receive. */
static int self_send(loom_group *g, const void *buf, size_t bytes, int tag)
{
    for (self_message **p = &g->pending_recvs; *p; p = &(*p)->next) {
        self_message *m = *p;
        if (m->tag != tag)
            continue;
        if (m->bytes != bytes)
            return loom_fail(LOOM_ERR_INVALID,
                             "comm: self send of %zu bytes matched a receive of %zu (tag %d)",
                             bytes, m->bytes, tag);
        memcpy(m->dest, buf, bytes);
        *m->done = 1;
        *p = m->next;
        free(m);
        return LOOM_OK;
    }
    self_message *m = calloc(1, sizeof *m);
    if (!m || !(m->data = malloc(bytes ? bytes : 1))) {
        free(m);
        return loom_fail(LOOM_ERR_NO_MEMORY, "comm: out of memory");
    }
    memcpy(m->data, buf, bytes);
    m->tag = tag;
    m->bytes = bytes;
    self_message **tail = &g->unmatched_sends;
    while (*tail)
        tail = &(*tail)->next;
    *tail = m;
    return LOOM_OK;
}

static int g_send(loom_group *g, const void *buf, size_t count, loom_dtype dtype, int peer,
                  int tag, loom_request **req)
{
    uint64_t t0 = loom_now_ns(), bytes = count * loom_dtype_size(dtype);
    int rc = check_call(g, LOOM_OP_SEND, dtype, 0, LOOM_SUM, peer, tag);
    if (rc != LOOM_OK)
        return rc;
    loom_comm_request *inner = NULL;
    if (g->ops)
        rc = g->ops->send(g->comm, buf, count, dtype, peer, tag, &inner);
    else
        rc = self_send(g, buf, bytes, tag);
    if (rc != LOOM_OK)
        return rc;
    return issued(g, LOOM_OP_SEND, bytes, t0, inner, req);
}

static int g_recv(loom_group *g, void *buf, size_t count, loom_dtype dtype, int peer, int tag,
                  loom_request **req)
{
    uint64_t t0 = loom_now_ns(), bytes = count * loom_dtype_size(dtype);
    int rc = check_call(g, LOOM_OP_RECV, dtype, 0, LOOM_SUM, peer, tag);
    if (rc != LOOM_OK)
        return rc;
    if (g->ops) {
        loom_comm_request *inner = NULL;
        rc = g->ops->recv(g->comm, buf, count, dtype, peer, tag, &inner);
        if (rc != LOOM_OK)
            return rc;
        return issued(g, LOOM_OP_RECV, bytes, t0, inner, req);
    }
    for (self_message **p = &g->unmatched_sends; *p; p = &(*p)->next) {
        self_message *m = *p;
        if (m->tag != tag)
            continue;
        if (m->bytes != bytes)
            return loom_fail(LOOM_ERR_INVALID,
                             "comm: self recv of %zu bytes matched a send of %zu (tag %d)", bytes,
                             m->bytes, tag);
        memcpy(buf, m->data, bytes);
        *p = m->next;
        free(m->data);
        free(m);
        return issued(g, LOOM_OP_RECV, bytes, t0, NULL, req);
    }
    /* No send yet: the request completes when one arrives. */
    loom_request *r = calloc(1, sizeof *r);
    self_message *m = calloc(1, sizeof *m);
    int *done = calloc(1, sizeof *done);
    if (!r || !m || !done) {
        free(r);
        free(m);
        free(done);
        return loom_fail(LOOM_ERR_NO_MEMORY, "comm: out of memory");
    }
    m->tag = tag;
    m->bytes = bytes;
    m->dest = buf;
    m->done = done;
    self_message **tail = &g->pending_recvs;
    while (*tail)
        tail = &(*tail)->next;
    *tail = m;
    g->counters.calls[LOOM_OP_RECV]++;
    g->counters.bytes[LOOM_OP_RECV] += bytes;
    r->group = g;
    r->op = LOOM_OP_RECV;
    r->start_ns = t0;
    r->bytes = bytes;
    r->self_done = done;
    *req = r;
    return LOOM_OK;
}

static int g_barrier(loom_group *g, loom_request **req)
{
    uint64_t t0 = loom_now_ns();
    loom_comm_request *inner = NULL;
    if (g->ops) {
        int rc = g->ops->barrier(g->comm, &inner);
        if (rc != LOOM_OK)
            return rc;
    }
    return issued(g, LOOM_OP_BARRIER, 0, t0, inner, req);
}

static int g_group_start(loom_group *g)
{
    if (g->ops)
        return g->ops->group_start(g->comm);
    return LOOM_OK;
}

static int g_group_end(loom_group *g)
{
    if (g->ops)
        return g->ops->group_end(g->comm);
    return LOOM_OK;
}

static void finished(loom_request *r)
{
    loom_trace_span(LOOM_LANE_COMM, loom_comm_op_name(r->op), r->start_ns, loom_now_ns(),
                    r->bytes);
    free(r->self_done);
    free(r);
}

static int g_test(loom_request *r)
{
    if (!r)
        return LOOM_OK;
    int rc;
    if (r->self_done)
        rc = *r->self_done ? LOOM_OK : LOOM_IN_PROGRESS;
    else
        rc = r->group->ops->test(r->inner);
    if (rc != LOOM_IN_PROGRESS)
        finished(r);
    return rc;
}

static int g_wait(loom_request *r)
{
    if (!r)
        return LOOM_OK;
    int rc;
    if (r->self_done)
        rc = *r->self_done ? LOOM_OK
                           : loom_fail(LOOM_ERR_TIMEOUT,
                                       "comm: self recv waits for a send this rank never posted");
    else
        rc = r->group->ops->wait(r->inner);
    finished(r);
    return rc;
}

const loom_comm_api loom_core_comm_api = {
    .struct_size = sizeof(loom_comm_api),
    .rank = g_rank,
    .size = g_size,
    .backend = g_backend,
    .allreduce = g_allreduce,
    .broadcast = g_broadcast,
    .reduce = g_reduce,
    .allgather = g_allgather,
    .reducescatter = g_reducescatter,
    .alltoall = g_alltoall,
    .send = g_send,
    .recv = g_recv,
    .barrier = g_barrier,
    .group_start = g_group_start,
    .group_end = g_group_end,
    .test = g_test,
    .wait = g_wait,
};
