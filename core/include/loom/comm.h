/* loom — the communicator ABI (docs/architecture.md).
 *
 * Two layers:
 *  - loom_comm_plugin_v1_t: what a backend plugin (mpi, ucx, nccl) implements,
 *    exported as `const loom_comm_plugin_v1_t loom_comm_plugin_v1`;
 *  - loom_comm_api: what strategies and the core call, on loom_group handles.
 *    It dispatches to the backend, counts bytes per op and traces each call.
 *
 * Conventions for every collective:
 *  - non-blocking: the call posts the operation and returns a request, which
 *    test/wait complete and release. A backend may set *req = NULL when the
 *    operation completed at issue (a zero-size one, say).
 *  - counts are in elements of dtype; zero counts are legal and complete.
 *  - buffers are of the memory kinds the backend declares in mem_kinds.
 *  - in place: allreduce and reduce accept send == recv; allgather accepts
 *    send == recv + rank * count * elemsize.
 *  - every rank of the group calls collectives in the same order; each call
 *    gets the next sequence number of that group, which error messages name.
 *  - the core checks arguments once, before calling a backend: dtype and
 *    reduction are known values, a root or peer is a rank of the group, a
 *    tag is >= 0, and a subgroup list names ranks of the parent once each,
 *    the caller among them. Backends need not check these again.
 *  - wait never blocks longer than the host's timeout_s: on expiry it fails
 *    with LOOM_ERR_TIMEOUT and a detail naming the op, its sequence number
 *    and the ranks that did not arrive. */
#ifndef LOOM_COMM_H
#define LOOM_COMM_H

#include "loom/plugin.h"

typedef struct loom_comm loom_comm;                 /* a backend's communicator */
typedef struct loom_comm_request loom_comm_request; /* a backend's in-flight op */

typedef enum loom_comm_op {
    LOOM_OP_ALLREDUCE = 0,
    LOOM_OP_BROADCAST = 1,
    LOOM_OP_REDUCE = 2,
    LOOM_OP_ALLGATHER = 3,
    LOOM_OP_REDUCESCATTER = 4,
    LOOM_OP_ALLTOALL = 5,
    LOOM_OP_SEND = 6,
    LOOM_OP_RECV = 7,
    LOOM_OP_BARRIER = 8,
    LOOM_OP_COUNT
} loom_comm_op;

static inline const char *loom_comm_op_name(loom_comm_op op)
{
    static const char *names[LOOM_OP_COUNT] = {"allreduce", "broadcast",     "reduce",
                                               "allgather", "reducescatter", "alltoall",
                                               "send",      "recv",          "barrier"};
    return (unsigned)op < LOOM_OP_COUNT ? names[op] : "?";
}

typedef struct loom_comm_plugin_v1_t {
    loom_plugin_header header; /* kind = LOOM_PLUGIN_COMM */
    /* LOOM_MEM_BIT(LOOM_MEM_HOST) | ...; since ABI 1.10, LOOM_MEM_KINDS_INNER
     * for a wrapper: the kinds of the backend it opened (host->comm_open) */
    uint32_t mem_kinds;
    uint32_t reserved;

    /* ---- lifetime (REQUIRED) ---- */

    /* The communicator of all ranks of the job, ranks as host->rank. Uses the
     * host's bootstrap store for any out-of-band exchange. Collective. */
    int (*create_world)(const loom_host *host, loom_comm **out);
    /* Collective over every rank of parent: each rank passes the parent
     * ranks of its own subgroup (which contains it), in the order that gives
     * the subgroup's ranks; disjoint lists partition the parent. A rank
     * alone in its subgroup calls it too where mem_kinds lacks host memory;
     * where it has host memory, the core serves that rank itself and does
     * not call it (so a host backend must not wait for that rank here). */
    int (*create_subgroup)(loom_comm *parent, const int *ranks, int nranks, loom_comm **out);
    int (*destroy)(loom_comm *comm);
    int (*rank)(const loom_comm *comm);
    int (*size)(const loom_comm *comm);

    /* ---- collectives (REQUIRED) ---- */

    int (*allreduce)(loom_comm *comm, const void *send, void *recv, size_t count,
                     loom_dtype dtype, loom_redop op, loom_comm_request **req);
    int (*broadcast)(loom_comm *comm, void *buf, size_t count, loom_dtype dtype, int root,
                     loom_comm_request **req);
    /* recv is significant on root only. */
    int (*reduce)(loom_comm *comm, const void *send, void *recv, size_t count,
                  loom_dtype dtype, loom_redop op, int root, loom_comm_request **req);
    /* send: count elements; recv: size * count, rank r's block at r * count. */
    int (*allgather)(loom_comm *comm, const void *send, void *recv, size_t count,
                     loom_dtype dtype, loom_comm_request **req);
    /* send: size * count elements; recv: count, the reduced block of this rank. */
    int (*reducescatter)(loom_comm *comm, const void *send, void *recv, size_t count,
                         loom_dtype dtype, loom_redop op, loom_comm_request **req);
    /* send and recv: size * count; block j of send goes to rank j, block i of
     * recv came from rank i. */
    int (*alltoall)(loom_comm *comm, const void *send, void *recv, size_t count,
                    loom_dtype dtype, loom_comm_request **req);
    /* Point-to-point. tag >= 0 (comm-mpi takes up to MPI_TAG_UB, at least
     * 32767); a (peer, tag) pair matches in posting order. */
    int (*send)(loom_comm *comm, const void *buf, size_t count, loom_dtype dtype, int peer,
                int tag, loom_comm_request **req);
    int (*recv)(loom_comm *comm, void *buf, size_t count, loom_dtype dtype, int peer,
                int tag, loom_comm_request **req);
    int (*barrier)(loom_comm *comm, loom_comm_request **req);

    /* LOOM_OK when done (the request is released), LOOM_IN_PROGRESS, or an
     * error (the request is released). Drives progress; never blocks. */
    int (*test)(loom_comm_request *req);
    /* Until done or the timeout; releases the request either way. A
     * released request is gone, but after an error the operation may still
     * be posted in the transport and read or write its buffers: the caller
     * must not free or reuse them (ddp keeps its gradient buffer), and the
     * group fails every later op. */
    int (*wait)(loom_comm_request *req);

    /* ---- OPTIONAL ---- */

    /* Bracket point-to-point calls that must be posted together (a pipeline
     * stage's send+recv pair). NULL: calls are posted as they come, which is
     * correct because they never block. */
    int (*group_start)(loom_comm *comm);
    int (*group_end)(loom_comm *comm);
    /* Register a buffer for reuse across calls (UCX memory handles, NCCL user
     * buffers). NULL: nothing to register. This core calls neither yet. */
    int (*mem_register)(loom_comm *comm, void *ptr, size_t bytes, loom_mem_kind kind,
                        void **handle);
    int (*mem_deregister)(loom_comm *comm, void *handle);
    /* Give up on everything in flight after a failure so destroy cannot
     * hang. This core does not call it yet: destroy must not hang either. */
    int (*abort)(loom_comm *comm);

    /* ---- since ABI 1.10 (OPTIONAL) ---- */

    /* A wrapper (a backend that forwards to one it opened with
     * host->comm_open): the inner backend's communicator that comm forwards
     * to. The core follows it so that the inner backend's comm_waiting on
     * that communicator counts as comm's group, and so that mem_kinds
     * LOOM_MEM_KINDS_INNER resolves. A wrapper may hand back the inner
     * backend's requests as its own and forward test and wait to it, or
     * wrap them (to time each op); either way it forwards every op. */
    loom_comm *(*inner)(const loom_comm *comm);
} loom_comm_plugin_v1_t;

/* mem_kinds of a wrapper: whatever the backend it opened takes. */
#define LOOM_MEM_KINDS_INNER 0u

/* ---- the core's side: groups, as strategies and the core use them ---- */

typedef struct loom_group loom_group;     /* a communicator the core manages */
typedef struct loom_request loom_request; /* an in-flight op on a group */

/* Semantics as in loom_comm_plugin_v1_t, with one rule of its own for
 * requests. Since ABI 1.10 an op that returns LOOM_OK always sets *req to
 * a request, complete or not, and one wait, or one test that returns
 * other than LOOM_IN_PROGRESS, completes and releases it. wait or test on
 * NULL, or on a request already released, fails with LOOM_ERR_INVALID
 * naming the op (the released request's op and sequence number on its
 * group), never reaching the transport; a group torn down with requests
 * outstanding names each. A plugin built before 1.10 is given the old
 * rule: an op complete at issue may set *req = NULL, and wait and test
 * take NULL as complete. */
typedef struct loom_comm_api {
    uint32_t struct_size;
    int (*rank)(const loom_group *g);
    int (*size)(const loom_group *g);
    const char *(*backend)(const loom_group *g); /* "mpi", "ucx", "self", ... */

    int (*allreduce)(loom_group *g, const void *send, void *recv, size_t count,
                     loom_dtype dtype, loom_redop op, loom_request **req);
    int (*broadcast)(loom_group *g, void *buf, size_t count, loom_dtype dtype, int root,
                     loom_request **req);
    int (*reduce)(loom_group *g, const void *send, void *recv, size_t count, loom_dtype dtype,
                  loom_redop op, int root, loom_request **req);
    int (*allgather)(loom_group *g, const void *send, void *recv, size_t count,
                     loom_dtype dtype, loom_request **req);
    int (*reducescatter)(loom_group *g, const void *send, void *recv, size_t count,
                         loom_dtype dtype, loom_redop op, loom_request **req);
    int (*alltoall)(loom_group *g, const void *send, void *recv, size_t count,
                    loom_dtype dtype, loom_request **req);
    int (*send)(loom_group *g, const void *buf, size_t count, loom_dtype dtype, int peer,
                int tag, loom_request **req);
    int (*recv)(loom_group *g, void *buf, size_t count, loom_dtype dtype, int peer, int tag,
                loom_request **req);
    int (*barrier)(loom_group *g, loom_request **req);
    int (*group_start)(loom_group *g);
    int (*group_end)(loom_group *g);
    int (*test)(loom_request *req);
    int (*wait)(loom_request *req);

    /* ---- since ABI 1.3 ---- */

    /* Subgroups of parent, like MPI_Comm_split. Collective over every rank
     * of parent: the ranks that pass the same colour form one group, ranked
     * by key, ties by their parent rank. Colours are >= 0: every rank joins
     * one group; a negative colour fails on every rank alike (there is no
     * "no group"). Works on every backend (the core exchanges the colours
     * over parent, then makes the subgroups). The core owns *out: it is
     * destroyed with parent at teardown; never destroy it yourself. Its
     * traffic is also counted as parent's, so a split of an axis group
     * shows in that axis's metrics (comm_bytes "dp.allgather" holds the
     * all-gathers of a split of the dp group). */
    int (*split)(loom_group *parent, int colour, int key, loom_group **out);
} loom_comm_api;

/* A hash of a rank list as create_subgroup takes it (FNV-1a over the
 * ranks, then the count): with the parent's id and how many subgroups of
 * that list the parent made, it names a subgroup the same on every member,
 * in the core and in a backend. */
static inline uint64_t loom_rank_list_hash(const int *ranks, int n)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ranks[i];
        for (int k = 0; k < 4; k++) {
            h ^= (v >> (8 * k)) & 0xffu;
            h *= 1099511628211ull;
        }
    }
    return h ^ (uint64_t)n;
}

#endif
