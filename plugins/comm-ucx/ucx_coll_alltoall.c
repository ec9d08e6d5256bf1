/* comm-ucx — alltoall and barrier schedules.
 *
 *  alltoall pairwise   n-1 steps; at step s rank r sends to r+s and
 *                      receives from r-s, straight between the user's
 *                      buffers, with two steps in flight at a time.
 *  alltoall posted     every send and receive posted at once: the fewest
 *                      round trips for small blocks (allgather direct too).
 *  alltoall bruck      ceil(log2 n) steps of packed blocks (Bruck et al.):
 *                      fewer messages than there are ranks, for many small
 *                      blocks; extra local copies.
 *  barrier             dissemination: ceil(log2 n) rounds of empty
 *                      messages to r + 2^k. */
#include <string.h>

#include "ucx_internal.h"

#define PAIRWISE_WINDOW 2

void build_alltoall_pairwise(loom_comm_request *r)
{
    int n = r->comm->group.size, me = r->comm->group.rank;
    size_t bytes = block_bytes(r);
    int joins[PAIRWISE_WINDOW];
    for (int i = 0; i < PAIRWISE_WINDOW; i++)
        joins[i] = -1;
    for (int s = 1; s < n; s++) {
        int to = mod(me + s, n), from = mod(me - s, n), first = r->nops;
        int dep = joins[s % PAIRWISE_WINDOW];
        int rv = sched_recv(r, from, recv_block(r, from), bytes, s, 0);
        sched_after(r, rv, dep);
        int so = sched_send(r, to, send_block(r, to), bytes, s, 0);
        sched_after(r, so, dep);
        joins[s % PAIRWISE_WINDOW] = join_since(r, first);
    }
    /* last: the first steps' messages go out before this rank spends its
     * time copying its own block (a quarter of 64 MiB at 4 ranks) */
    sched_copy(r, recv_block(r, me), send_block(r, me), bytes);
}

/* Also allgather's direct algorithm: there the block sent to every peer
 * is this rank's one (send_block). */
void build_exchange_posted(loom_comm_request *r)
{
    int n = r->comm->group.size, me = r->comm->group.rank;
    size_t bytes = block_bytes(r);
    for (int s = 1; s < n; s++) {
        int from = mod(me - s, n);
        sched_recv(r, from, recv_block(r, from), bytes, 0, 0);
    }
    for (int s = 1; s < n; s++) {
        int to = mod(me + s, n);
        sched_send(r, to, send_block(r, to), bytes, 0, 0);
    }
    if (send_block(r, me) != recv_block(r, me))
        sched_copy(r, recv_block(r, me), send_block(r, me), bytes);
}

void build_alltoall_bruck(loom_comm_request *r)
{
    int n = r->comm->group.size, me = r->comm->group.rank, half = (n + 1) / 2;
    size_t bytes = block_bytes(r);
    const char *sb = r->call.send;
    /* tmp[i]: first the block for rank me+i; after the steps, the block
     * from rank me-i. pack/unpack: the blocks of one step. */
    char *tmp = sched_scratch(r, (size_t)n * bytes);
    char *pack = sched_scratch(r, (size_t)half * bytes);
    char *unpack = sched_scratch(r, (size_t)half * bytes);
    if (!tmp || !pack || !unpack)
        return;
    int first = r->nops;
    sched_copy(r, tmp, sb + (size_t)me * bytes, (size_t)(n - me) * bytes);
    if (me > 0)
        sched_copy(r, tmp + (size_t)(n - me) * bytes, sb, (size_t)me * bytes);
    int join = join_since(r, first), step = 0;
    for (int d = 1; d < n; d <<= 1, step++) {
        first = r->nops;
        int m = 0;
        for (int i = 0; i < n; i++)
            if (i & d) {
                int cp = sched_copy(r, pack + (size_t)m++ * bytes, tmp + (size_t)i * bytes, bytes);
                sched_after(r, cp, join);
            }
        int packed = join_since(r, first);
        int rv = sched_recv(r, mod(me - d, n), unpack, (size_t)m * bytes, step, 0);
        sched_after(r, rv, join);
        int so = sched_send(r, mod(me + d, n), pack, (size_t)m * bytes, step, 0);
        sched_after(r, so, packed);
        m = 0;
        for (int i = 0; i < n; i++)
            if (i & d) {
                int cp = sched_copy(r, tmp + (size_t)i * bytes, unpack + (size_t)m++ * bytes, bytes);
                sched_after(r, cp, rv);
                sched_after(r, cp, packed);
            }
        join = join_since(r, first);
    }
    for (int j = 0; j < n; j++) {
        int cp = sched_copy(r, recv_block(r, j), tmp + (size_t)mod(me - j, n) * bytes, bytes);
        sched_after(r, cp, join);
    }
}

void build_barrier_dissemination(loom_comm_request *r)
{
    int n = r->comm->group.size, me = r->comm->group.rank, last = -1, step = 0;
    for (int d = 1; d < n; d <<= 1, step++) {
        int rv = sched_recv(r, mod(me - d, n), NULL, 0, step, 0);
        int so = sched_send(r, mod(me + d, n), NULL, 0, step, 0);
        sched_after(r, so, last);
        last = rv;
    }
}
