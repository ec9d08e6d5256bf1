/* comm-ucx — allgather and reduce-scatter schedules.
 *
 *  allgather ring                n-1 steps, each rank forwarding the block it
 *                                received last; data lands in recv directly.
 *  allgather recursive doubling  log2(p) steps doubling the gathered range
 *                                (extra ranks folded in: see allreduce).
 *  allgather bruck               ceil(log2 n) steps at any n, in a scratch
 *                                buffer rotated into place at the end.
 *  allgather direct              every rank sends its block to every other
 *                                at once: no step waits for another, and
 *                                with cma on one host each receiver pulls
 *                                its blocks in parallel (alltoall's posted
 *                                exchange, ucx_coll_alltoall.c).
 *  reducescatter ring            n-1 steps; the partial sum of a block
 *                                travels the ring and ends on its owner.
 *  reducescatter recursive halving  log2(p) steps halving the range.
 *  reducescatter direct          every rank sends each block straight to
 *                                its owner at once, and the owner reduces
 *                                the n-1 it gets into its own, chunk by
 *                                chunk: one step, so no rank waits for a
 *                                slower one to pass a partial sum on (ranks
 *                                that share cores), and each byte of the
 *                                result is written once, from cache.
 *
 * Blocks are `count` elements; rank r's block is at r * count. The ring
 * ones move in chunks so a step starts as soon as its first chunk is in. */
#include <stdlib.h>
#include <string.h>

#include "ucx_internal.h"

/* First real block of virtual rank v (see real_rank): virtual ranks below
 * extra stand for two real ranks (2v, 2v+1), so every virtual range is a
 * contiguous run of real blocks. v == p gives n. */
static int first_block(int v, int extra) { return v < extra ? 2 * v : v + extra; }

int doubling_gather(loom_comm_request *r, char *buf, block_start_fn start, size_t ce, int v,
                    int step, int join)
{
    int p = pow2_floor(r->comm->group.size), extra = r->comm->group.size - p;
    size_t es = loom_dtype_size(r->call.dtype);
    for (int mask = 1, lo = v, hi = v + 1; mask < p; mask <<= 1, step++) {
        int peer = real_rank(v ^ mask, extra), plo = doubling_partner_lo(v, mask, lo, hi);
        int phi = plo + mask, first = r->nops;
        size_t mo = start(r, lo), po = start(r, plo);
        recv_chunks(r, peer, buf, es, po, start(r, phi) - po, ce, step, join);
        send_chunks(r, peer, buf, es, mo, start(r, hi) - mo, ce, step, join);
        join = join_since(r, first);
        lo = lo < plo ? lo : plo;
        hi = hi > phi ? hi : phi;
    }
    return join;
}

/* Virtual block i of an allgather: the blocks of the real ranks it stands
 * for. */
static size_t rank_blocks_start(const loom_comm_request *r, int i)
{
    int n = r->comm->group.size;
    return (size_t)first_block(i, n - pow2_floor(n)) * r->call.count;
}

void build_allgather_rd(loom_comm_request *r)
{
    int n = r->comm->group.size, me = r->comm->group.rank;
    int p = pow2_floor(n), extra = n - p, v = fold_virtual(me, extra);
    int final_step = log2_ceil(p) + 1, first = r->nops;
    size_t count = r->call.count, es = loom_dtype_size(r->call.dtype);
    size_t ce = ucx_chunk_elems(r, count, 1);
    char *rb = r->call.recv;
    if (send_block(r, me) != recv_block(r, me))
        sched_copy(r, recv_block(r, me), send_block(r, me), count * es);
    if (v < 0) {
        send_chunks(r, me + 1, send_block(r, me), es, 0, count, ce, 0, -1);
        int j = join_since(r, first);
        recv_chunks(r, me + 1, rb, es, 0, count * (size_t)n, ce, final_step, j);
        return;
    }
    if (me < 2 * extra)
        recv_chunks(r, me - 1, rb, es, (size_t)(me - 1) * count, count, ce, 0, -1);
    int join = doubling_gather(r, rb, rank_blocks_start, ce, v, 1, join_since(r, first));
    if (me < 2 * extra)
        send_chunks(r, me - 1, rb, es, 0, count * (size_t)n, ce, final_step, join);
}

void build_allgather_bruck(loom_comm_request *r)
{
    int n = r->comm->group.size, me = r->comm->group.rank;
    size_t bytes = block_bytes(r);
    char *rb = r->call.recv;
    /* tmp[i] holds block (me + i) mod n */
    char *tmp = sched_scratch(r, bytes * (size_t)n);
    if (!tmp)
        return;
    int join = sched_copy(r, tmp, send_block(r, me), bytes);
    for (int d = 1, step = 0; d < n; d <<= 1, step++) {
        int m = d < n - d ? d : n - d;
        int first = r->nops;
        int rv = sched_recv(r, mod(me + d, n), tmp + (size_t)d * bytes, (size_t)m * bytes, step, 0);
        sched_after(r, rv, join);
        int so = sched_send(r, mod(me - d, n), tmp, (size_t)m * bytes, step, 0);
        sched_after(r, so, join);
        join = join_since(r, first);
    }
    int a = sched_copy(r, rb + (size_t)me * bytes, tmp, (size_t)(n - me) * bytes);
    sched_after(r, a, join);
    if (me > 0) {
        int b = sched_copy(r, rb, tmp + (size_t)(n - me) * bytes, (size_t)me * bytes);
        sched_after(r, b, join);
    }
}

void build_allgather_ring(loom_comm_request *r)
{
    int n = r->comm->group.size, me = r->comm->group.rank;
    int next = mod(me + 1, n), prev = mod(me - 1, n);
    size_t count = r->call.count, es = loom_dtype_size(r->call.dtype);
    size_t ce = ucx_chunk_elems(r, count, 1);
    int nch = nchunks(count, ce);
    int *prod = malloc(sizeof(int) * 2 * (size_t)nch);
    if (!prod) {
        r->build_failed = 1;
        return;
    }
    int *next_prod = prod + nch;
    for (int s = 0; s < n - 1; s++) {
        /* forward the block received last; at first, this rank's own */
        const char *out = s == 0 ? send_block(r, me) : recv_block(r, mod(me - s, n));
        char *in = recv_block(r, mod(me - s - 1, n));
        for (int k = 0; k < nch; k++) {
            size_t o = (size_t)k * ce, l = chunk_len(count, k, ce);
            int rv = sched_recv(r, prev, in + o * es, l * es, s, k);
            int so = sched_send(r, next, out + o * es, l * es, s, k);
            sched_after(r, so, s == 0 ? -1 : prod[k]);
            next_prod[k] = rv;
        }
        int *swap = prod;
        prod = next_prod;
        next_prod = swap;
    }
    /* last, so the first chunks go out before this rank copies its block */
    if (send_block(r, me) != recv_block(r, me))
        sched_copy(r, recv_block(r, me), send_block(r, me), count * es);
    free(prod < next_prod ? prod : next_prod);
}

void build_reducescatter_ring(loom_comm_request *r)
{
    int n = r->comm->group.size, me = r->comm->group.rank;
    int next = mod(me + 1, n), prev = mod(me - 1, n);
    size_t count = r->call.count, es = loom_dtype_size(r->call.dtype);
    size_t ce = ucx_chunk_elems(r, count, 0);
    const char *sb = r->call.send;
    int nch = nchunks(count, ce);
    slot_ring tmp;
    if (slots_init(r, &tmp, count < ce ? count : ce) != LOOM_OK)
        return;
    /* The partial sums of a step wait in acc[s % 2] until the next step
     * sends them on; the last step reduces straight into recv. */
    char *acc = n > 2 ? sched_scratch(r, 2 * count * es) : NULL;
    /* prod[k]: the reduce that made chunk k of the partial sum sent next;
     * sent[k]: the send that last read chunk k of acc[s % 2] */
    int *prod = malloc(sizeof(int) * 3 * (size_t)nch);
    if (!prod || (n > 2 && !acc)) {
        free(prod);
        r->build_failed = 1;
        return;
    }
    int *sent = prod + nch; /* [2][nch] */
    for (int k = 0; k < 3 * nch; k++)
        prod[k] = -1;
    for (int s = 0; s < n - 1; s++) {
        int sblk = mod(me - s - 1, n), rblk = mod(me - s - 2, n), last = s == n - 2;
        char *acc_in = acc ? acc + (size_t)((s + 1) % 2) * count * es : NULL; /* step s-1's */
        char *acc_out = acc ? acc + (size_t)(s % 2) * count * es : NULL;
        for (int k = 0; k < nch; k++) {
            size_t o = (size_t)k * ce, l = chunk_len(count, k, ce);
            int free_dep;
            char *t = slots_take(&tmp, &free_dep);
            int rv = sched_recv(r, prev, t, l * es, s, k);
            sched_after(r, rv, free_dep);
            const char *from = s == 0 ? sb + ((size_t)sblk * count + o) * es : acc_in + o * es;
            int so = sched_send(r, next, from, l * es, s, k);
            sched_after(r, so, s == 0 ? -1 : prod[k]);
            char *dst = last ? (char *)r->call.recv + o * es : acc_out + o * es;
            int rd = sched_reduce(r, dst, t, sb + ((size_t)rblk * count + o) * es, l);
            sched_after(r, rd, rv);
            if (!last) /* acc_out's chunk k was last read by step s-1's send */
                sched_after(r, rd, sent[(s % 2) * nch + k]);
            slots_used(&tmp, rd);
            if (last && r->call.redop == LOOM_AVG) {
                int d = sched_divide(r, dst, l);
                sched_after(r, d, rd);
            }
            if (s > 0)
                sent[((s + 1) % 2) * nch + k] = so;
            prod[k] = rd;
        }
    }
    free(prod);
}

void build_reducescatter_rh(loom_comm_request *r)
{
    int n = r->comm->group.size, me = r->comm->group.rank;
    int p = pow2_floor(n), extra = n - p, v = fold_virtual(me, extra);
    int final_step = log2_ceil(p) + 1;
    size_t count = r->call.count, es = loom_dtype_size(r->call.dtype), total = count * (size_t)n;
    const char *send = r->call.send;
    if (v < 0) {
        int s = sched_send(r, me + 1, send, total * es, 0, 0);
        int back = sched_recv(r, me + 1, r->call.recv, count * es, final_step, 0);
        sched_after(r, back, s);
        return;
    }
    char *acc = sched_scratch(r, total * es);
    char *tmp = sched_scratch(r, total * es);
    if (!acc || !tmp)
        return;
    const char *src = send;
    int join = -1;
    if (me < 2 * extra) {
        int rv = sched_recv(r, me - 1, tmp, total * es, 0, 0);
        join = sched_reduce(r, acc, tmp, send, total);
        sched_after(r, join, rv);
        src = acc;
    }
    int lo = 0, hi = p, step = 1;
    for (int mask = p / 2; mask >= 1; mask >>= 1, step++) {
        int peer = real_rank(v ^ mask, extra), give_lo, give_hi;
        halving_split(v, mask, lo, hi, &lo, &hi, &give_lo, &give_hi);
        size_t go = (size_t)first_block(give_lo, extra) * count;
        size_t gl = (size_t)first_block(give_hi, extra) * count - go;
        size_t ko = (size_t)first_block(lo, extra) * count;
        size_t kl = (size_t)first_block(hi, extra) * count - ko;
        int first = r->nops;
        int rv = sched_recv(r, peer, tmp + ko * es, kl * es, step, 0);
        sched_after(r, rv, join);
        int s = sched_send(r, peer, src + go * es, gl * es, step, 0);
        sched_after(r, s, join);
        int rd = sched_reduce(r, acc + ko * es, tmp + ko * es, src + ko * es, kl);
        sched_after(r, rd, rv);
        sched_after(r, rd, join);
        join = join_since(r, first);
        src = acc;
    }
    /* Virtual rank v holds the reduced blocks of the real ranks it stands for. */
    size_t vo = (size_t)first_block(v, extra) * count;
    size_t vl = (size_t)first_block(v + 1, extra) * count - vo;
    if (r->call.redop == LOOM_AVG) {
        int d = sched_divide(r, acc + vo * es, vl);
        sched_after(r, d, join);
        join = d;
    }
    int cp = sched_copy(r, r->call.recv, acc + (size_t)me * count * es, count * es);
    sched_after(r, cp, join);
    if (me < 2 * extra) {
        int s = sched_send(r, me - 1, acc + (size_t)(me - 1) * count * es, count * es, final_step, 0);
        sched_after(r, s, join);
    }
}

void build_reducescatter_direct(loom_comm_request *r)
{
    int n = r->comm->group.size, me = r->comm->group.rank;
    size_t count = r->call.count, es = loom_dtype_size(r->call.dtype);
    size_t ce = ucx_chunk_elems(r, count, 0);
    const char *sb = r->call.send, *mine = sb + (size_t)me * count * es;
    char *rb = r->call.recv;
    /* a slot per peer, so every peer's chunk can be on its way at once */
    int depth = r->comm->set.pipeline_depth > n - 1 ? r->comm->set.pipeline_depth : n - 1;
    slot_ring in;
    if (slots_init_depth(r, &in, count < ce ? count : ce, depth) != LOOM_OK)
        return;
    for (int s = 1; s < n; s++) {
        int to = mod(me + s, n);
        send_chunks(r, to, sb, es, (size_t)to * count, count, ce, 0, -1);
    }
    /* chunk by chunk, so the sum being made stays in cache while the peers'
     * parts of it come in; in the order of s, the same on every rank */
    sum_from_peers(r, peer_behind, &in, rb, mine, 0, count, ce);
}
