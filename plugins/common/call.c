/* plugins/common — the comm ABI's ops as one call each (call.h). */
#include "common/call.h"

#include "common/group.h"

static int post(loom_comm *comm, loom_comm_op op, const void *send, void *recv, size_t count,
                loom_dtype dtype, loom_redop redop, int root, int peer, int tag,
                loom_comm_request **req)
{
    if (req)
        *req = NULL;
    if (!comm || !req)
        return LOOM_ERR_INVALID;
    comm_call call = {op, send, recv, count, dtype, redop, root, peer, tag};
    return comm_post(comm, &call, req);
}

int comm_allreduce(loom_comm *comm, const void *send, void *recv, size_t count, loom_dtype dtype,
                   loom_redop op, loom_comm_request **req)
{
    return post(comm, LOOM_OP_ALLREDUCE, send, recv, count, dtype, op, -1, -1, 0, req);
}

int comm_broadcast(loom_comm *comm, void *buf, size_t count, loom_dtype dtype, int root,
                   loom_comm_request **req)
{
    return post(comm, LOOM_OP_BROADCAST, buf, buf, count, dtype, LOOM_SUM, root, -1, 0, req);
}

int comm_reduce(loom_comm *comm, const void *send, void *recv, size_t count, loom_dtype dtype,
                loom_redop op, int root, loom_comm_request **req)
{
    return post(comm, LOOM_OP_REDUCE, send, recv, count, dtype, op, root, -1, 0, req);
}

int comm_allgather(loom_comm *comm, const void *send, void *recv, size_t count, loom_dtype dtype,
                   loom_comm_request **req)
{
    return post(comm, LOOM_OP_ALLGATHER, send, recv, count, dtype, LOOM_SUM, -1, -1, 0, req);
}

int comm_reducescatter(loom_comm *comm, const void *send, void *recv, size_t count,
                       loom_dtype dtype, loom_redop op, loom_comm_request **req)
{
    return post(comm, LOOM_OP_REDUCESCATTER, send, recv, count, dtype, op, -1, -1, 0, req);
}

int comm_alltoall(loom_comm *comm, const void *send, void *recv, size_t count, loom_dtype dtype,
                  loom_comm_request **req)
{
    return post(comm, LOOM_OP_ALLTOALL, send, recv, count, dtype, LOOM_SUM, -1, -1, 0, req);
}

int comm_send(loom_comm *comm, const void *buf, size_t count, loom_dtype dtype, int peer, int tag,
              loom_comm_request **req)
{
    return post(comm, LOOM_OP_SEND, buf, NULL, count, dtype, LOOM_SUM, -1, peer, tag, req);
}

int comm_recv(loom_comm *comm, void *buf, size_t count, loom_dtype dtype, int peer, int tag,
              loom_comm_request **req)
{
    return post(comm, LOOM_OP_RECV, NULL, buf, count, dtype, LOOM_SUM, -1, peer, tag, req);
}

int comm_barrier(loom_comm *comm, loom_comm_request **req)
{
    return post(comm, LOOM_OP_BARRIER, NULL, NULL, 0, LOOM_U8, LOOM_SUM, -1, -1, 0, req);
}

int comm_rank(const loom_comm *comm) { return ((const comm_group *)(const void *)comm)->rank; }
int comm_size(const loom_comm *comm) { return ((const comm_group *)(const void *)comm)->size; }

void call_extents(const comm_call *call, int rank, int size, size_t *send_bytes,
                  size_t *recv_bytes)
{
    size_t block = call->count * loom_dtype_size(call->dtype), all = block * (size_t)size;
    size_t s = 0, r = 0;
    switch (call->op) {
    case LOOM_OP_ALLREDUCE:
    case LOOM_OP_BROADCAST: s = r = block; break;
    case LOOM_OP_REDUCE: s = block, r = rank == call->root ? block : 0; break;
    case LOOM_OP_ALLGATHER: s = block, r = all; break;
    case LOOM_OP_REDUCESCATTER: s = all, r = block; break;
    case LOOM_OP_ALLTOALL: s = r = all; break;
    case LOOM_OP_SEND: s = block; break;
    case LOOM_OP_RECV: r = block; break;
    default: break;
    }
    *send_bytes = s;
    *recv_bytes = r;
}

int call_in_place(const comm_call *call, int rank)
{
    switch (call->op) {
    case LOOM_OP_ALLREDUCE:
    case LOOM_OP_BROADCAST: return call->send == call->recv;
    case LOOM_OP_REDUCE: return rank == call->root && call->send == call->recv;
    case LOOM_OP_ALLGATHER:
        return (const char *)call->send ==
               (const char *)call->recv + (size_t)rank * call->count * loom_dtype_size(call->dtype);
    default: return 0;
    }
}
