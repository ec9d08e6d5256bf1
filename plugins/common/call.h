/* plugins/common — the comm ABI's ops as one call each.
 *
 * A backend that includes this puts COMM_COMMON_OPS in its plugin struct
 * and defines comm_post: every op reaches it as a comm_call, so the
 * prologue every op shares (numbering, the count, in-place forms and
 * overlapping buffers) is written once per backend instead of once per op. */
#ifndef LOOM_PLUGIN_COMMON_CALL_H
#define LOOM_PLUGIN_COMMON_CALL_H

#include <stddef.h>

#include "loom/comm.h"

typedef struct comm_call {
    loom_comm_op op;
    const void *send; /* broadcast: the buffer, as recv */
    void *recv;
    size_t count;     /* elements of dtype (a block, for the ops that have one per rank) */
    loom_dtype dtype;
    loom_redop redop; /* LOOM_SUM for the ops that do not reduce */
    int root;         /* broadcast and reduce; -1 otherwise */
    int peer, tag;    /* send and recv; -1 and 0 otherwise */
} comm_call;

/* Defined by the backend: post one call, as the op's ABI entry would
 * (*req is NULL already, and comm and req are not). */
int comm_post(loom_comm *comm, const comm_call *call, loom_comm_request **req);

/* The ABI's ops (comm.h), each handing its arguments to comm_post. */
int comm_allreduce(loom_comm *comm, const void *send, void *recv, size_t count, loom_dtype dtype,
                   loom_redop op, loom_comm_request **req);
int comm_broadcast(loom_comm *comm, void *buf, size_t count, loom_dtype dtype, int root,
                   loom_comm_request **req);
int comm_reduce(loom_comm *comm, const void *send, void *recv, size_t count, loom_dtype dtype,
                loom_redop op, int root, loom_comm_request **req);
int comm_allgather(loom_comm *comm, const void *send, void *recv, size_t count, loom_dtype dtype,
                   loom_comm_request **req);
int comm_reducescatter(loom_comm *comm, const void *send, void *recv, size_t count,
                       loom_dtype dtype, loom_redop op, loom_comm_request **req);
int comm_alltoall(loom_comm *comm, const void *send, void *recv, size_t count, loom_dtype dtype,
                  loom_comm_request **req);
int comm_send(loom_comm *comm, const void *buf, size_t count, loom_dtype dtype, int peer, int tag,
              loom_comm_request **req);
int comm_recv(loom_comm *comm, void *buf, size_t count, loom_dtype dtype, int peer, int tag,
              loom_comm_request **req);
int comm_barrier(loom_comm *comm, loom_comm_request **req);

/* A backend's struct loom_comm starts with its comm_group (common/group.h),
 * so these serve every backend. */
int comm_rank(const loom_comm *comm);
int comm_size(const loom_comm *comm);

/* The ops of a plugin struct that plugins/common implements, for its
 * initializer: { ..., COMM_COMMON_OPS, ... }. */
#define COMM_COMMON_OPS                                                                  \
    .rank = comm_rank, .size = comm_size, .allreduce = comm_allreduce,                   \
    .broadcast = comm_broadcast, .reduce = comm_reduce, .allgather = comm_allgather,     \
    .reducescatter = comm_reducescatter, .alltoall = comm_alltoall, .send = comm_send,   \
    .recv = comm_recv, .barrier = comm_barrier

/* A send or a receive (numbered apart from the collectives). */
static inline int call_is_p2p(const comm_call *call)
{
    return call->op == LOOM_OP_SEND || call->op == LOOM_OP_RECV;
}
/* Whether the call moves nothing: a count of zero, complete at issue. */
static inline int call_is_empty(const comm_call *call)
{
    return call->count == 0 && call->op != LOOM_OP_BARRIER;
}
/* The bytes the call reads from send and writes into recv on rank `rank`
 * of a group of `size` (recv: 0 off the root of a reduce). */
void call_extents(const comm_call *call, int rank, int size, size_t *send_bytes,
                  size_t *recv_bytes);
/* Whether send and recv are in one of comm.h's in-place forms: send == recv
 * for allreduce and (on the root) reduce, send == this rank's block of recv
 * for allgather; a broadcast's one buffer always. */
int call_in_place(const comm_call *call, int rank);

#endif
