/* comm-ucx — allreduce schedules.
 *
 *  recursive doubling  log2(p) exchanges of the whole vector: the fewest
 *                      steps, for small messages.
 *  rabenseifner        reduce-scatter by recursive halving, then allgather
 *                      by recursive doubling: log steps, each rank moving
 *                      2(p-1)/p of the vector, chunked within each step.
 *  ring                reduce-scatter then allgather around the ring: 2(n-1)
 *                      steps of 1/n of the vector each, chunked so that each
 *                      step starts as soon as its first chunk is in and the
 *                      reduction of a chunk reads it from cache, just
 *                      received, rather than from memory.
 *
 *  direct              every rank sends each block of its vector straight
 *                      to the rank that owns it, which reduces them chunk
 *                      by chunk in cache (reducescatter direct), then sends
 *                      its reduced block to every rank at once: two steps
 *                      at any rank count, for ranks on one host, where cma
 *                      lets every receiver pull at once.
 *
 * Rank counts that are not a power of two fold the extra ranks in (see
 * real_rank in ucx_internal.h); the ranks that sat out get the result from
 * their partners at the end.
 *
 * Every rank must end with the same bits. In the ring and Rabenseifner
 * each block is reduced once, by its owner, and then copied out; in
 * recursive doubling partners compute a op b and b op a, which are equal
 * because every reduction here is commutative elementwise. An average
 * divides the sum once, where it is final, so all ranks agree. */
#include <stdlib.h>
#include <string.h>

#include "ucx_internal.h"

void build_allreduce_rd(loom_comm_request *r)
{
    int n = r->comm->group.size, me = r->comm->group.rank;
    int p = pow2_floor(n), extra = n - p, lg = log2_ceil(p), v = fold_virtual(me, extra);
    size_t count = r->call.count, bytes = block_bytes(r);
    const void *send = r->call.send;
    char *acc = r->call.recv;
    /* one receive buffer per step, so every receive is posted at once */
    char *tmp = sched_scratch(r, bytes * (size_t)(lg + 1));
    if (!tmp)
        return;
    int last = send != acc ? sched_copy(r, acc, send, bytes) : -1;
    if (v < 0) {
        int s = sched_send(r, me + 1, send, bytes, 0, 0);
        int back = sched_recv(r, me + 1, acc, bytes, lg + 1, 0);
        sched_after(r, back, s);
        sched_after(r, back, last);
        return;
    }
    if (me < 2 * extra) {
        int rv = sched_recv(r, me - 1, tmp, bytes, 0, 0);
        int rd = sched_reduce(r, acc, acc, tmp, count);
        sched_after(r, rd, rv);
        sched_after(r, rd, last);
        last = rd;
    }
    for (int mask = 1, step = 1; mask < p; mask <<= 1, step++) {
        int peer = real_rank(v ^ mask, extra);
        char *t = tmp + (size_t)step * bytes;
        int rv = sched_recv(r, peer, t, bytes, step, 0);
        int s = sched_send(r, peer, acc, bytes, step, 0);
        sched_after(r, s, last);
        int rd = sched_reduce(r, acc, acc, t, count);
        sched_after(r, rd, rv);
        sched_after(r, rd, s);
        last = rd;
    }
    if (r->call.redop == LOOM_AVG) {
        int d = sched_divide(r, acc, count);
        sched_after(r, d, last);
        last = d;
    }
    if (me < 2 * extra) {
        int s = sched_send(r, me - 1, acc, bytes, lg + 1, 0);
        sched_after(r, s, last);
    }
}

/* Virtual block i of Rabenseifner: the vector split evenly in p. */
static size_t balanced_start(const loom_comm_request *r, int i)
{
    return blk_off(r->call.count, pow2_floor(r->comm->group.size), i);
}

void build_allreduce_rabenseifner(loom_comm_request *r)
{
    int n = r->comm->group.size, me = r->comm->group.rank;
    int p = pow2_floor(n), extra = n - p, v = fold_virtual(me, extra);
    int final_step = 2 * log2_ceil(p) + 1;
    size_t count = r->call.count, es = loom_dtype_size(r->call.dtype);
    size_t ce = ucx_chunk_elems(r, count, 0);
    const char *src = r->call.send;
    char *rb = r->call.recv;
    slot_ring sl;
    if (slots_init(r, &sl, count < ce ? count : ce) != LOOM_OK)
        return;

    if (v < 0) {
        int first = r->nops;
        send_chunks(r, me + 1, src, es, 0, count, ce, 0, -1);
        int j = join_since(r, first);
        recv_chunks(r, me + 1, rb, es, 0, count, ce, final_step, j);
        return;
    }
    int join = -1;
    if (me < 2 * extra) {
        int first = r->nops;
        recv_reduce_chunks(r, me - 1, &sl, rb, src, es, 0, count, ce, 0, -1);
        join = join_since(r, first);
        src = rb;
    }

    /* reduce-scatter by recursive halving over virtual blocks [lo, hi) */
    int lo = 0, hi = p, step = 1;
    for (int mask = p / 2; mask >= 1; mask >>= 1, step++) {
        int peer = real_rank(v ^ mask, extra), give_lo, give_hi;
        halving_split(v, mask, lo, hi, &lo, &hi, &give_lo, &give_hi);
        size_t go = blk_off(count, p, give_lo), gl = blk_off(count, p, give_hi) - go;
        size_t ko = blk_off(count, p, lo), kl = blk_off(count, p, hi) - ko;
        int first = r->nops;
        recv_reduce_chunks(r, peer, &sl, rb, src, es, ko, kl, ce, step, join);
        send_chunks(r, peer, src, es, go, gl, ce, step, join);
        join = join_since(r, first);
        src = rb;
    }
    if (r->call.redop == LOOM_AVG) {
        size_t o = blk_off(count, p, v), l = blk_len(count, p, v);
        int first = r->nops;
        for (int k = 0; k < nchunks(l, ce); k++) {
            size_t co = o + (size_t)k * ce, cl = chunk_len(l, k, ce);
            int d = sched_divide(r, rb + co * es, cl);
            sched_after(r, d, join);
        }
        join = join_since(r, first);
    }
    /* allgather by recursive doubling: the range doubles each step */
    join = doubling_gather(r, rb, balanced_start, ce, v, step, join);
    if (me < 2 * extra)
        send_chunks(r, me - 1, rb, es, 0, count, ce, final_step, join);
}

void build_allreduce_ring(loom_comm_request *r)
{
    int n = r->comm->group.size, me = r->comm->group.rank;
    int next = mod(me + 1, n), prev = mod(me - 1, n);
    size_t count = r->call.count, es = loom_dtype_size(r->call.dtype);
    size_t ce = ucx_chunk_elems(r, count, 0), maxblk = blk_len(count, n, 0);
    const char *sb = r->call.send;
    char *rb = r->call.recv;
    int maxch = nchunks(maxblk, ce);
    slot_ring slots;
    if (slots_init(r, &slots, maxblk < ce ? maxblk : ce) != LOOM_OK)
        return;
    /* prod[k]: the op after which chunk k of the block sent next is ready;
     * rs_send[s][k]: the reduce-scatter send of step s, which the allgather
     * must not overwrite before it is done. */
    int *prod = malloc(sizeof(int) * (size_t)maxch * (size_t)(n + 1));
    if (!prod) {
        r->build_failed = 1;
        return;
    }
    int *next_prod = prod + maxch, *rs_send = prod + 2 * maxch;
    for (int k = 0; k < maxch; k++)
        prod[k] = -1;

    /* reduce-scatter: block me-s goes on, block me-s-1 comes in and is
     * reduced into recv */
    for (int s = 0; s < n - 1; s++) {
        for (int k = 0; k < maxch; k++) {
            size_t rl, ro = blk_chunk(count, n, mod(me - s - 1, n), k, ce, &rl);
            size_t sl, so = blk_chunk(count, n, mod(me - s, n), k, ce, &sl);
            if (rl) {
                int free_dep;
                char *t = slots_take(&slots, &free_dep);
                int rv = sched_recv(r, prev, t, rl * es, s, k);
                sched_after(r, rv, free_dep);
                int rd = sched_reduce(r, rb + ro * es, t, sb + ro * es, rl);
                sched_after(r, rd, rv);
                slots_used(&slots, rd);
                next_prod[k] = rd;
            }
            if (sl) {
                int op = sched_send(r, next, (s == 0 ? sb : rb) + so * es, sl * es, s, k);
                sched_after(r, op, s == 0 ? -1 : prod[k]);
                rs_send[s * maxch + k] = op;
            }
        }
        int *swap = prod;
        prod = next_prod;
        next_prod = swap;
    }
    /* This rank owns block me+1 now. */
    for (int k = 0; r->call.redop == LOOM_AVG && k < maxch; k++) {
        size_t l, o = blk_chunk(count, n, mod(me + 1, n), k, ce, &l);
        if (l) {
            int d = sched_divide(r, rb + o * es, l);
            sched_after(r, d, prod[k]);
            prod[k] = d;
        }
    }
    /* allgather: the final blocks travel the ring, straight into recv */
    for (int s = 0; s < n - 1; s++) {
        int step = n - 1 + s;
        for (int k = 0; k < maxch; k++) {
            size_t rl, ro = blk_chunk(count, n, mod(me - s, n), k, ce, &rl);
            size_t sl, so = blk_chunk(count, n, mod(me + 1 - s, n), k, ce, &sl);
            if (rl) {
                next_prod[k] = sched_recv(r, prev, rb + ro * es, rl * es, step, k);
                sched_after(r, next_prod[k], rs_send[s * maxch + k]);
            }
            if (sl) {
                int op = sched_send(r, next, rb + so * es, sl * es, step, k);
                sched_after(r, op, prod[k]);
            }
        }
        int *swap = prod;
        prod = next_prod;
        next_prod = swap;
    }
    free(prod < next_prod ? prod : next_prod);
}

void build_allreduce_direct(loom_comm_request *r)
{
    int n = r->comm->group.size, me = r->comm->group.rank;
    size_t count = r->call.count, es = loom_dtype_size(r->call.dtype);
    size_t ce = ucx_chunk_elems(r, count, 0), mo = blk_off(count, n, me), ml = blk_len(count, n, me);
    const char *sb = r->call.send;
    char *rb = r->call.recv;
    int depth = r->comm->set.pipeline_depth > n - 1 ? r->comm->set.pipeline_depth : n - 1;
    slot_ring in;
    if (slots_init_depth(r, &in, ml < ce ? ml : ce, depth) != LOOM_OK)
        return;
    /* The gathered blocks land in recv at once. In place, block j of recv is
     * also what this rank sends j to reduce; j's reduced block comes only
     * after j has all of its parts, so never over one still to be read. */
    for (int s = 1; s < n; s++) {
        int from = mod(me - s, n);
        sched_recv(r, from, rb + blk_off(count, n, from) * es, blk_len(count, n, from) * es,
                   1, 0);
    }
    for (int s = 1; s < n; s++) {
        int to = mod(me + s, n);
        send_chunks(r, to, sb, es, blk_off(count, n, to), blk_len(count, n, to), ce, 0, -1);
    }
    int first = r->nops;
    sum_from_peers(r, peer_behind, &in, rb, sb, mo, ml, ce);
    int mine = join_since(r, first);
    for (int s = 1; s < n; s++) {
        int so = sched_send(r, mod(me + s, n), rb + mo * es, ml * es, 1, 0);
        sched_after(r, so, mine);
    }
}
