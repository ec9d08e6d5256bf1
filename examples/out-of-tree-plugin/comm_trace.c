/* comm-trace: a communicator that wraps another. It opens the backend named
 * by comm.trace.inner with host->comm_open, forwards every op to it and
 * times each one from post to completion; when its last communicator is
 * destroyed it writes <output>.<rank>.json: per communicator (the world,
 * then each subgroup with its world ranks), per op kind, the calls, payload
 * bytes (count * element size, as the core counts them; 0 for a barrier)
 * and seconds. */
#include <stdio.h>
#include <stdlib.h>

#include <loom/comm.h>

static const loom_setting_spec trace_settings[] = {
    {.name = "inner", .type = LOOM_SETTING_STRING, .default_value = "mpi",
     .help = "the comm backend to forward to (a name or a file path, as comm.default takes it)"},
    {.name = "output", .type = LOOM_SETTING_STRING, .default_value = "comm-trace",
     .help = "each rank writes <output>.<rank>.json"},
    {0},
};

struct loom_comm {
    const loom_host *host;
    loom_comm *inner;       /* NULL once destroyed: the counts stay until written */
    struct loom_comm *next; /* every communicator of this process, in creation order */
    int size, *world_ranks;
    uint64_t calls[LOOM_OP_COUNT], bytes[LOOM_OP_COUNT], ns[LOOM_OP_COUNT];
};

struct loom_comm_request {
    loom_comm *comm;
    loom_comm_op op;
    uint64_t start_ns;
    loom_comm_request *inner;
};

/* one inner backend per process: comm_open gives the same two every time */
static const loom_comm_plugin_v1_t *in;
static const loom_host *in_host;
static loom_comm *comms;
static int live;

static int add_comm(const loom_host *host, loom_comm *inner, loom_comm **out)
{
    loom_comm *c = calloc(1, sizeof *c);
    int size = in->size(inner);
    int *ranks = calloc((size_t)size, sizeof *ranks);
    if (!c || !ranks) {
        free(c);
        free(ranks);
        in->destroy(inner);
        return host->error(host, LOOM_ERR_NO_MEMORY, "comm-trace: out of memory");
    }
    *c = (loom_comm){.host = host, .inner = inner, .size = size, .world_ranks = ranks};
    loom_comm **tail = &comms;
    while (*tail)
        tail = &(*tail)->next;
    *tail = *out = c;
    live++;
    return LOOM_OK;
}

static int trace_create_world(const loom_host *host, loom_comm **out)
{
    const char *inner_name;
    loom_comm *inner = NULL;
    int rc = host->config_string(host, "inner", &inner_name);
    if (rc == LOOM_OK && !in)
        rc = host->comm_open(host, inner_name, &in, &in_host);
    if (rc == LOOM_OK)
        rc = in->create_world(in_host, &inner);
    if (rc == LOOM_OK && (rc = add_comm(host, inner, out)) == LOOM_OK)
        for (int r = 0; r < (*out)->size; r++)
            (*out)->world_ranks[r] = r;
    return rc;
}

static int trace_create_subgroup(loom_comm *parent, const int *ranks, int nranks, loom_comm **out)
{
    loom_comm *inner = NULL;
    int rc = in->create_subgroup(parent->inner, ranks, nranks, &inner);
    if (rc == LOOM_OK && (rc = add_comm(parent->host, inner, out)) == LOOM_OK)
        for (int r = 0; r < nranks; r++)
            (*out)->world_ranks[r] = parent->world_ranks[ranks[r]];
    return rc;
}

static void write_comm(FILE *f, const loom_comm *c)
{
    fprintf(f, "    {\"group\": \"%s\", \"size\": %d, \"world_ranks\": [",
            c == comms ? "world" : "sub", c->size);
    for (int r = 0; r < c->size; r++)
        fprintf(f, "%s%d", r ? ", " : "", c->world_ranks[r]);
    fprintf(f, "],\n     \"ops\": {");
    for (int op = 0; op < LOOM_OP_COUNT; op++)
        fprintf(f, "%s\n       \"%s\": {\"calls\": %llu, \"bytes\": %llu, \"seconds\": %.9f}",
                op ? "," : "", loom_comm_op_name((loom_comm_op)op),
                (unsigned long long)c->calls[op], (unsigned long long)c->bytes[op],
                (double)c->ns[op] * 1e-9);
    fprintf(f, "}}%s\n", c->next ? "," : "");
}

static int write_trace(const loom_host *host)
{
    const char *output, *inner_name;
    char path[4096];
    host->config_string(host, "output", &output);
    host->config_string(host, "inner", &inner_name);
    snprintf(path, sizeof path, "%s.%d.json", output, host->rank);
    FILE *f = fopen(path, "w");
    if (!f)
        return host->error(host, LOOM_ERR_INVALID,
                           "comm-trace: cannot write %s (comm.trace.output)", path);
    fprintf(f, "{\"rank\": %d, \"inner\": \"%s\", \"groups\": [\n", host->rank, inner_name);
    for (const loom_comm *c = comms; c; c = c->next)
        write_comm(f, c);
    fprintf(f, "]}\n");
    return fclose(f) == 0 ? LOOM_OK : host->error(host, LOOM_ERR_INVALID, "comm-trace: %s", path);
}

/* The file is written when the last communicator goes (the core may destroy
 * a world before the subgroups made from it). */
static int trace_destroy(loom_comm *comm)
{
    int rc = in->destroy(comm->inner);
    comm->inner = NULL;
    if (--live > 0)
        return rc;
    int wrote = write_trace(comm->host);
    while (comms) {
        loom_comm *next = comms->next;
        free(comms->world_ranks);
        free(comms);
        comms = next;
    }
    return rc != LOOM_OK ? rc : wrote;
}

static int trace_rank(const loom_comm *comm)
{
    return in->rank(comm->inner);
}

static int trace_size(const loom_comm *comm)
{
    return comm->size;
}

static loom_comm *trace_inner(const loom_comm *comm)
{
    return comm->inner;
}

/* Count the op and hand back a request of our own that times it. An op
 * the inner backend completed at issue (no request) is timed here. */
static int posted(loom_comm *c, loom_comm_op op, uint64_t bytes, uint64_t start_ns, int rc,
                  loom_comm_request *inner, loom_comm_request **req)
{
    *req = NULL;
    if (rc != LOOM_OK)
        return rc;
    c->calls[op]++;
    c->bytes[op] += bytes;
    if (!inner) {
        c->ns[op] += c->host->now_ns() - start_ns;
        return LOOM_OK;
    }
    if (!(*req = malloc(sizeof **req))) {
        in->wait(inner);
        return c->host->error(c->host, LOOM_ERR_NO_MEMORY, "comm-trace: out of memory");
    }
    **req = (loom_comm_request){.comm = c, .op = op, .start_ns = start_ns, .inner = inner};
    return LOOM_OK;
}

static int completed(loom_comm_request *req, int rc)
{
    if (rc != LOOM_IN_PROGRESS) {
        req->comm->ns[req->op] += req->comm->host->now_ns() - req->start_ns;
        free(req);
    }
    return rc;
}

static int trace_test(loom_comm_request *req)
{
    return completed(req, in->test(req->inner));
}

static int trace_wait(loom_comm_request *req)
{
    return completed(req, in->wait(req->inner));
}

/* Forward an op: call is the inner backend's op with &inner as its request. */
#define FORWARD(op, bytes, call)                                                                   \
    uint64_t start_ns = c->host->now_ns();                                                         \
    loom_comm_request *inner = NULL;                                                               \
    int rc = in->call;                                                                             \
    return posted(c, op, bytes, start_ns, rc, inner, req)

static int trace_allreduce(loom_comm *c, const void *send, void *recv, size_t count,
                           loom_dtype dtype, loom_redop redop, loom_comm_request **req)
{
    FORWARD(LOOM_OP_ALLREDUCE, count * loom_dtype_size(dtype),
            allreduce(c->inner, send, recv, count, dtype, redop, &inner));
}

static int trace_broadcast(loom_comm *c, void *buf, size_t count, loom_dtype dtype, int root,
                           loom_comm_request **req)
{
    FORWARD(LOOM_OP_BROADCAST, count * loom_dtype_size(dtype),
            broadcast(c->inner, buf, count, dtype, root, &inner));
}

static int trace_reduce(loom_comm *c, const void *send, void *recv, size_t count, loom_dtype dtype,
                        loom_redop redop, int root, loom_comm_request **req)
{
    FORWARD(LOOM_OP_REDUCE, count * loom_dtype_size(dtype),
            reduce(c->inner, send, recv, count, dtype, redop, root, &inner));
}

static int trace_allgather(loom_comm *c, const void *send, void *recv, size_t count,
                           loom_dtype dtype, loom_comm_request **req)
{
    FORWARD(LOOM_OP_ALLGATHER, count * loom_dtype_size(dtype),
            allgather(c->inner, send, recv, count, dtype, &inner));
}

static int trace_reducescatter(loom_comm *c, const void *send, void *recv, size_t count,
                               loom_dtype dtype, loom_redop redop, loom_comm_request **req)
{
    FORWARD(LOOM_OP_REDUCESCATTER, count * loom_dtype_size(dtype),
            reducescatter(c->inner, send, recv, count, dtype, redop, &inner));
}

static int trace_alltoall(loom_comm *c, const void *send, void *recv, size_t count,
                          loom_dtype dtype, loom_comm_request **req)
{
    FORWARD(LOOM_OP_ALLTOALL, count * loom_dtype_size(dtype),
            alltoall(c->inner, send, recv, count, dtype, &inner));
}

static int trace_send(loom_comm *c, const void *buf, size_t count, loom_dtype dtype, int peer,
                      int tag, loom_comm_request **req)
{
    FORWARD(LOOM_OP_SEND, count * loom_dtype_size(dtype),
            send(c->inner, buf, count, dtype, peer, tag, &inner));
}

static int trace_recv(loom_comm *c, void *buf, size_t count, loom_dtype dtype, int peer, int tag,
                      loom_comm_request **req)
{
    FORWARD(LOOM_OP_RECV, count * loom_dtype_size(dtype),
            recv(c->inner, buf, count, dtype, peer, tag, &inner));
}

static int trace_barrier(loom_comm *c, loom_comm_request **req)
{
    FORWARD(LOOM_OP_BARRIER, 0, barrier(c->inner, &inner));
}

/* The struct is const, so it cannot mirror which optional ops the inner
 * backend has: the core gives every backend group_start and group_end, and
 * calls mem_register, mem_deregister and abort on none yet, so those stay
 * NULL here. */
static int trace_group_start(loom_comm *c)
{
    return in->group_start(c->inner);
}

static int trace_group_end(loom_comm *c)
{
    return in->group_end(c->inner);
}

LOOM_PLUGIN_EXPORT const loom_comm_plugin_v1_t loom_comm_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_COMM, loom_comm_plugin_v1_t, "trace",
                                 "forwards to another backend and writes each op's calls, bytes "
                                 "and time per communicator",
                                 trace_settings),
    .mem_kinds = LOOM_MEM_KINDS_INNER,
    .create_world = trace_create_world,
    .create_subgroup = trace_create_subgroup,
    .destroy = trace_destroy,
    .rank = trace_rank,
    .size = trace_size,
    .allreduce = trace_allreduce,
    .broadcast = trace_broadcast,
    .reduce = trace_reduce,
    .allgather = trace_allgather,
    .reducescatter = trace_reducescatter,
    .alltoall = trace_alltoall,
    .send = trace_send,
    .recv = trace_recv,
    .barrier = trace_barrier,
    .test = trace_test,
    .wait = trace_wait,
    .group_start = trace_group_start,
    .group_end = trace_group_end,
    .inner = trace_inner,
};
