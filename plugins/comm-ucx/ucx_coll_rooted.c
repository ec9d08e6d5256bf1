/* comm-ucx — broadcast and reduce schedules, on ranks renumbered so the
 * root is virtual rank 0 (v = (rank - root) mod n).
 *
 *  broadcast binomial          ceil(log2 n) steps; each rank forwards every
 *                              chunk to its children as soon as it is in.
 *  broadcast chain             root -> 1 -> 2 -> ... in chunks: a pipeline
 *                              whose time tends to one transfer of the
 *                              message for many chunks.
 *  broadcast scatter_allgather the root sends block v to rank v, then a ring
 *                              allgather: every link carries ~2/n of the
 *                              message instead of the root's carrying all.
 *  broadcast direct            the root sends the whole message to every
 *                              rank at once: on one host the receivers
 *                              pull it with cma in parallel.
 *  reduce binomial             the mirror of the broadcast tree; interior
 *                              ranks reduce their children's chunks into a
 *                              scratch buffer and pass the sum up.
 *  reduce chain                n-1 -> ... -> 1 -> root in chunks, each rank
 *                              adding its own contribution on the way.
 *  reduce direct               every rank sends its vector straight to the
 *                              root, which reduces the n-1 chunk by chunk:
 *                              each byte of the result made once, in cache;
 *                              one host, where the root pulls them all.
 *  reduce scatter_gather       every rank reduces one block of the vector
 *                              (the direct reduce-scatter), then sends it to
 *                              the root: the sums are made on every core at
 *                              once instead of all on the root's. */
#include <stdlib.h>
#include <string.h>

#include "ucx_internal.h"

/* Virtual rank c, which receives at bit m, forwards to nobody. */
static int bcast_leaf(int c, int m, int n) { return m == 1 || c + 1 >= n; }

void build_broadcast_binomial(loom_comm_request *r)
{
    int n = r->comm->group.size, v = root_virtual(r), mask = 1;
    size_t count = r->call.count, es = loom_dtype_size(r->call.dtype);
    size_t ce = ucx_chunk_elems(r, count, 1);
    char *b = r->call.recv;
    while (mask < n && !(v & mask))
        mask <<= 1;
    int parent = mask < n ? root_real(r, v - mask) : -1;
    /* Chunks only pay where a rank forwards them as they come; a leaf gets
     * the message in one piece. */
    int got = -1;
    if (parent >= 0 && bcast_leaf(v, mask, n)) {
        sched_recv(r, parent, b, count * es, log2_floor(mask), 0);
        return;
    }
    int first = r->nops;
    if (parent >= 0)
        recv_chunks(r, parent, b, es, 0, count, ce, log2_floor(mask), -1);
    int nrecv = r->nops - first; /* chunk k's receive is op first + k */
    for (int m = mask >> 1; m > 0; m >>= 1) { /* bigger subtrees first */
        if (v + m >= n)
            continue;
        int child = root_real(r, v + m), step = log2_floor(m);
        if (bcast_leaf(v + m, m, n)) {
            if (nrecv > 0 && got < 0) { /* the whole message is in */
                got = sched_join(r);
                for (int k = 0; k < nrecv; k++)
                    sched_after(r, got, first + k);
            }
            int s = sched_send(r, child, b, count * es, step, 0);
            sched_after(r, s, got);
            continue;
        }
        for (int k = 0; k < nchunks(count, ce); k++) {
            size_t o = (size_t)k * ce, l = chunk_len(count, k, ce);
            int s = sched_send(r, child, b + o * es, l * es, step, k);
            sched_after(r, s, nrecv > 0 ? first + k : -1);
        }
    }
}

void build_broadcast_direct(loom_comm_request *r)
{
    size_t bytes = block_bytes(r);
    if (root_virtual(r) != 0) {
        sched_recv(r, r->call.root, r->call.recv, bytes, 0, 0);
        return;
    }
    for (int v = 1; v < r->comm->group.size; v++)
        sched_send(r, root_real(r, v), r->call.recv, bytes, 0, 0);
}

void build_broadcast_chain(loom_comm_request *r)
{
    int n = r->comm->group.size, v = root_virtual(r);
    size_t count = r->call.count, es = loom_dtype_size(r->call.dtype);
    size_t ce = ucx_chunk_elems(r, count, 1);
    char *b = r->call.recv;
    for (int k = 0; k < nchunks(count, ce); k++) {
        size_t o = (size_t)k * ce, l = chunk_len(count, k, ce);
        int rv = -1;
        if (v > 0)
            rv = sched_recv(r, root_real(r, v - 1), b + o * es, l * es, v - 1, k);
        if (v < n - 1) {
            int s = sched_send(r, root_real(r, v + 1), b + o * es, l * es, v, k);
            sched_after(r, s, rv);
        }
    }
}

void build_broadcast_scatter_allgather(loom_comm_request *r)
{
    int n = r->comm->group.size, v = root_virtual(r);
    size_t count = r->call.count, es = loom_dtype_size(r->call.dtype);
    size_t ce = ucx_chunk_elems(r, count, 1);
    char *b = r->call.recv;
    size_t maxch = (size_t)nchunks(blk_len(count, n, 0), ce);
    int *prod = malloc(sizeof(int) * 2 * (maxch ? maxch : 1));
    if (!prod) {
        r->build_failed = 1;
        return;
    }
    int *next_prod = prod + maxch;
    for (size_t k = 0; k < maxch; k++)
        prod[k] = -1;
    /* scatter (step 0): block j goes to virtual rank j */
    if (v == 0) {
        for (int j = 1; j < n; j++)
            send_chunks(r, root_real(r, j), b, es, blk_off(count, n, j), blk_len(count, n, j),
                        ce, 0, -1);
    } else {
        size_t off = blk_off(count, n, v), len = blk_len(count, n, v);
        for (int k = 0; k < nchunks(len, ce); k++) {
            size_t o = off + (size_t)k * ce, l = chunk_len(len, k, ce);
            prod[k] = sched_recv(r, r->call.root, b + o * es, l * es, 0, k);
        }
    }
    /* ring allgather (steps 1..n-1): at step s rank v forwards block v-s+1
     * to v+1; the root needs nothing and the rank before it sends it
     * nothing. */
    int next = root_real(r, v + 1), prev = root_real(r, v - 1);
    for (int s = 0; s < n - 1; s++) {
        int sblk = mod(v - s, n), rblk = mod(v - s - 1, n);
        size_t soff = blk_off(count, n, sblk), slen = blk_len(count, n, sblk);
        size_t roff = blk_off(count, n, rblk), rlen = blk_len(count, n, rblk);
        for (size_t k = 0; k < maxch; k++)
            next_prod[k] = -1;
        for (int k = 0; k < nchunks(rlen, ce) && v != 0; k++) {
            size_t o = roff + (size_t)k * ce, l = chunk_len(rlen, k, ce);
            next_prod[k] = sched_recv(r, prev, b + o * es, l * es, s + 1, k);
        }
        for (int k = 0; k < nchunks(slen, ce) && v != n - 1; k++) {
            size_t o = soff + (size_t)k * ce, l = chunk_len(slen, k, ce);
            int so = sched_send(r, next, b + o * es, l * es, s + 1, k);
            sched_after(r, so, v == 0 ? -1 : prod[k]);
        }
        int *swap = prod;
        prod = next_prod;
        next_prod = swap;
    }
    free(prod < next_prod ? prod : next_prod);
}

void build_reduce_binomial(loom_comm_request *r)
{
    int n = r->comm->group.size, v = root_virtual(r);
    size_t count = r->call.count, es = loom_dtype_size(r->call.dtype);
    size_t ce = ucx_chunk_elems(r, count, 0);
    /* children v + m for m = 1, 2, 4, ... below the lowest set bit of v */
    int top = 1;
    while (top < n && !(v & top))
        top <<= 1;
    int children = 0;
    for (int m = 1; m < top; m <<= 1)
        children += v + m < n;
    char *acc = r->call.recv; /* the root's */
    if (v != 0 && children > 0 && !(acc = sched_scratch(r, count * es)))
        return;
    slot_ring sl;
    if (children > 0 && slots_init(r, &sl, count < ce ? count : ce) != LOOM_OK)
        return;
    for (int k = 0; k < nchunks(count, ce); k++) {
        size_t o = (size_t)k * ce, l = chunk_len(count, k, ce);
        const char *cur = (const char *)r->call.send + o * es;
        int last = -1;
        for (int m = 1; m < top; m <<= 1) {
            if (v + m >= n)
                continue;
            int free_dep;
            char *t = slots_take(&sl, &free_dep);
            int rv = sched_recv(r, root_real(r, v + m), t, l * es, log2_floor(m), k);
            sched_after(r, rv, free_dep);
            int rd = sched_reduce(r, acc + o * es, t, cur, l);
            sched_after(r, rd, rv);
            sched_after(r, rd, last);
            slots_used(&sl, rd);
            cur = acc + o * es;
            last = rd;
        }
        if (v != 0) {
            int s = sched_send(r, root_real(r, v - top), cur, l * es, log2_floor(top), k);
            sched_after(r, s, last);
        } else if (r->call.redop == LOOM_AVG) {
            int d = sched_divide(r, acc + o * es, l);
            sched_after(r, d, last);
        }
    }
}

void build_reduce_chain(loom_comm_request *r)
{
    int n = r->comm->group.size, v = root_virtual(r);
    int up = root_real(r, v - 1), down = root_real(r, v + 1);
    size_t count = r->call.count, es = loom_dtype_size(r->call.dtype);
    size_t ce = ucx_chunk_elems(r, count, 0), slot = count < ce ? count : ce;
    slot_ring tmp, acc;
    if (v < n - 1 && slots_init(r, &tmp, slot) != LOOM_OK)
        return;
    if (v > 0 && v < n - 1 && slots_init(r, &acc, slot) != LOOM_OK)
        return;
    for (int k = 0; k < nchunks(count, ce); k++) {
        size_t o = (size_t)k * ce, l = chunk_len(count, k, ce);
        const char *mine = (const char *)r->call.send + o * es;
        if (v == n - 1) { /* the far end only sends */
            sched_send(r, up, mine, l * es, v - 1, k);
            continue;
        }
        int free_dep, acc_dep = -1;
        char *t = slots_take(&tmp, &free_dep);
        int rv = sched_recv(r, down, t, l * es, v, k);
        sched_after(r, rv, free_dep);
        char *dst = v == 0 ? (char *)r->call.recv + o * es : slots_take(&acc, &acc_dep);
        int rd = sched_reduce(r, dst, t, mine, l);
        sched_after(r, rd, rv);
        sched_after(r, rd, acc_dep);
        slots_used(&tmp, rd);
        if (v > 0) {
            int s = sched_send(r, up, dst, l * es, v - 1, k);
            sched_after(r, s, rd);
            slots_used(&acc, s);
        } else if (r->call.redop == LOOM_AVG) {
            int d = sched_divide(r, dst, l);
            sched_after(r, d, rd);
        }
    }
}

void build_reduce_direct(loom_comm_request *r)
{
    int n = r->comm->group.size, v = root_virtual(r);
    size_t count = r->call.count, es = loom_dtype_size(r->call.dtype);
    size_t ce = ucx_chunk_elems(r, count, 0);
    const char *mine = r->call.send;
    if (v != 0) {
        send_chunks(r, r->call.root, mine, es, 0, count, ce, 0, -1);
        return;
    }
    char *rb = r->call.recv;
    int depth = r->comm->set.pipeline_depth > n - 1 ? r->comm->set.pipeline_depth : n - 1;
    slot_ring in;
    if (slots_init_depth(r, &in, count < ce ? count : ce, depth) != LOOM_OK)
        return;
    sum_from_peers(r, root_real, &in, rb, mine, 0, count, ce); /* in virtual rank order */
}

void build_reduce_scatter_gather(loom_comm_request *r)
{
    int n = r->comm->group.size, me = r->comm->group.rank, root = r->call.root;
    size_t count = r->call.count, es = loom_dtype_size(r->call.dtype);
    size_t ce = ucx_chunk_elems(r, count, 0), mo = blk_off(count, n, me), ml = blk_len(count, n, me);
    const char *sb = r->call.send;
    char *rb = r->call.recv; /* the root's */
    char *sum = me == root ? rb + mo * es : sched_scratch(r, ml * es);
    int depth = r->comm->set.pipeline_depth > n - 1 ? r->comm->set.pipeline_depth : n - 1;
    slot_ring in;
    if (!sum || slots_init_depth(r, &in, ml < ce ? ml : ce, depth) != LOOM_OK)
        return;
    /* step 0: block j of every vector to rank j; sent[j]: done reading it */
    int *sent = malloc(sizeof(int) * (size_t)n);
    if (!sent) {
        r->build_failed = 1;
        return;
    }
    for (int s = 1; s < n; s++) {
        int to = mod(me + s, n), first = r->nops;
        send_chunks(r, to, sb, es, blk_off(count, n, to), blk_len(count, n, to), ce, 0, -1);
        sent[to] = join_since(r, first);
    }
    int first = r->nops;
    sum_from_peers(r, peer_behind, &in, sum, sb + mo * es, 0, ml, ce);
    int mine = join_since(r, first);
    /* step 1: the reduced blocks to the root, in place over its sent blocks */
    if (me != root)
        send_chunks(r, root, sum, es, 0, ml, ce, 1, mine);
    for (int j = 0; j < n && me == root; j++)
        if (j != root)
            recv_chunks(r, j, rb, es, blk_off(count, n, j), blk_len(count, n, j), ce, 1, sent[j]);
    free(sent);
}
