/* comm-mpi under another name, declaring device memory only, as comm-nccl
 * does (its buffers are host memory all the same). The collective suite
 * over it runs the core's paths for a backend that takes no host memory on
 * any machine: splits exchange their colours through the bootstrap store,
 * and a rank alone in its subgroup stays on the backend. Every op forwards
 * to comm-mpi's (MPI_PLUGIN, loaded at the first create_world). */
#include <dlfcn.h>
#include <stddef.h>

#include "loom/comm.h"

static const loom_comm_plugin_v1_t *mpi;

static int w_create_world(const loom_host *host, loom_comm **out)
{
    if (!mpi) {
        void *lib = dlopen(MPI_PLUGIN, RTLD_NOW | RTLD_LOCAL);
        mpi = lib ? dlsym(lib, "loom_comm_plugin_v1") : NULL;
        if (!mpi)
            return host->error(host, LOOM_ERR_NOT_FOUND, "comm-mpidevice: cannot load %s: %s",
                               MPI_PLUGIN, dlerror());
    }
    return mpi->create_world(host, out);
}

static int w_create_subgroup(loom_comm *parent, const int *ranks, int nranks, loom_comm **out)
{
    return mpi->create_subgroup(parent, ranks, nranks, out);
}
static int w_destroy(loom_comm *c) { return mpi->destroy(c); }
static int w_rank(const loom_comm *c) { return mpi->rank(c); }
static int w_size(const loom_comm *c) { return mpi->size(c); }
static int w_allreduce(loom_comm *c, const void *s, void *r, size_t n, loom_dtype t, loom_redop op,
                       loom_comm_request **q)
{
    return mpi->allreduce(c, s, r, n, t, op, q);
}
static int w_broadcast(loom_comm *c, void *b, size_t n, loom_dtype t, int root,
                       loom_comm_request **q)
{
    return mpi->broadcast(c, b, n, t, root, q);
}
static int w_reduce(loom_comm *c, const void *s, void *r, size_t n, loom_dtype t, loom_redop op,
                    int root, loom_comm_request **q)
{
    return mpi->reduce(c, s, r, n, t, op, root, q);
}
static int w_allgather(loom_comm *c, const void *s, void *r, size_t n, loom_dtype t,
                       loom_comm_request **q)
{
    return mpi->allgather(c, s, r, n, t, q);
}
static int w_reducescatter(loom_comm *c, const void *s, void *r, size_t n, loom_dtype t,
                           loom_redop op, loom_comm_request **q)
{
    return mpi->reducescatter(c, s, r, n, t, op, q);
}
static int w_alltoall(loom_comm *c, const void *s, void *r, size_t n, loom_dtype t,
                      loom_comm_request **q)
{
    return mpi->alltoall(c, s, r, n, t, q);
}
static int w_send(loom_comm *c, const void *b, size_t n, loom_dtype t, int peer, int tag,
                  loom_comm_request **q)
{
    return mpi->send(c, b, n, t, peer, tag, q);
}
static int w_recv(loom_comm *c, void *b, size_t n, loom_dtype t, int peer, int tag,
                  loom_comm_request **q)
{
    return mpi->recv(c, b, n, t, peer, tag, q);
}
static int w_barrier(loom_comm *c, loom_comm_request **q) { return mpi->barrier(c, q); }
static int w_test(loom_comm_request *q) { return mpi->test(q); }
static int w_wait(loom_comm_request *q) { return mpi->wait(q); }
static int w_abort(loom_comm *c) { return mpi->abort(c); }

LOOM_PLUGIN_EXPORT const loom_comm_plugin_v1_t loom_comm_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_COMM, loom_comm_plugin_v1_t, "mpidevice",
                                 "comm-mpi declaring device memory only (a test of the core)",
                                 NULL),
    .mem_kinds = LOOM_MEM_BIT(LOOM_MEM_DEVICE),
    .create_world = w_create_world,
    .create_subgroup = w_create_subgroup,
    .destroy = w_destroy,
    .rank = w_rank,
    .size = w_size,
    .allreduce = w_allreduce,
    .broadcast = w_broadcast,
    .reduce = w_reduce,
    .allgather = w_allgather,
    .reducescatter = w_reducescatter,
    .alltoall = w_alltoall,
    .send = w_send,
    .recv = w_recv,
    .barrier = w_barrier,
    .test = w_test,
    .wait = w_wait,
    .abort = w_abort,
};
