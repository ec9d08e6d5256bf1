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


void build_allreduce_rd(loom_comm_request *r, const void *send, void *recv, size_t count)
{
    loom_comm *c = r->comm;
    int n = c->size, me = c->rank, p = pow2_floor(n), extra = n - p, lg = log2_ceil(p);
    size_t es = loom_dtype_size(r->dtype), bytes = count * es;
    char *acc = recv;
    r->algo = "recursive doubling";
    /* one receive buffer per step, so every receive is posted at once */
    char *tmp = sched_scratch(r, bytes * (size_t)(lg + 1));
    if (!tmp)
        return;
    int last = send != recv ? sched_copy(r, recv, send, bytes) : -1;
    int v;
    if (me < 2 * extra && me % 2 == 0) {
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
        v = me / 2;
    } else {
        v = me - extra;
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
    if (r->redop == LOOM_AVG) {
        int d = sched_divide(r, acc, count);
        sched_after(r, d, last);
        last = d;
    }
    if (me < 2 * extra) {
        int s = sched_send(r, me - 1, acc, bytes, lg + 1, 0);
        sched_after(r, s, last);
    }
}

void build_allreduce_ring(loom_comm_request *r, const void *send, void *recv, size_t count)
{
    loom_comm *c = r->comm;
    int n = c->size, me = c->rank, next = mod(me + 1, n), prev = mod(me - 1, n);
    size_t es = loom_dtype_size(r->dtype), ce = ucx_chunk_elems(c, r->dtype, count, 0);
    const char *sb = send;
    char *rb = recv;
    r->algo = "ring";
    size_t maxblk = blk_len(count, n, 0);
    int maxch = nchunks(maxblk, ce);
    slot_ring sl;
    if (slots_init(r, &sl, (maxblk < ce ? maxblk : ce) * es, c->set.pipeline_depth) != LOOM_OK)
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

    for (int s = 0; s < n - 1; s++) {
        int sblk = mod(me - s, n), rblk = mod(me - s - 1, n);
        size_t soff = blk_off(count, n, sblk), slen = blk_len(count, n, sblk);
        size_t roff = blk_off(count, n, rblk), rlen = blk_len(count, n, rblk);
        int ns = nchunks(slen, ce), nr = nchunks(rlen, ce);
        for (int k = 0; k < (ns > nr ? ns : nr); k++) {
            if (k < nr) {
                size_t o = roff + (size_t)k * ce, l = rlen - (size_t)k * ce < ce ? rlen - (size_t)k * ce : ce;
                int free_dep;
                char *t = slots_take(&sl, &free_dep);
                int rv = sched_recv(r, prev, t, l * es, s, k);
                sched_after(r, rv, free_dep);
                int rd = sched_reduce(r, rb + o * es, t, sb + o * es, l);
                sched_after(r, rd, rv);
                slots_used(&sl, rd);
                next_prod[k] = rd;
            }
            if (k < ns) {
                size_t o = soff + (size_t)k * ce, l = slen - (size_t)k * ce < ce ? slen - (size_t)k * ce : ce;
                int so = sched_send(r, next, (s == 0 ? sb : rb) + o * es, l * es, s, k);
                sched_after(r, so, s == 0 ? -1 : prod[k]);
                rs_send[s * maxch + k] = so;
            }
        }
        int *swap = prod;
        prod = next_prod;
        next_prod = swap;
    }
    /* This rank owns block me+1 now. */
    if (r->redop == LOOM_AVG) {
        int ob = mod(me + 1, n);
        size_t off = blk_off(count, n, ob), len = blk_len(count, n, ob);
        for (int k = 0; k < nchunks(len, ce); k++) {
            size_t o = off + (size_t)k * ce, l = len - (size_t)k * ce < ce ? len - (size_t)k * ce : ce;
            int d = sched_divide(r, rb + o * es, l);
            sched_after(r, d, prod[k]);
            prod[k] = d;
        }
    }
    for (int s = 0; s < n - 1; s++) {
        int sblk = mod(me + 1 - s, n), rblk = mod(me - s, n), step = n - 1 + s;
        size_t soff = blk_off(count, n, sblk), slen = blk_len(count, n, sblk);
        size_t roff = blk_off(count, n, rblk), rlen = blk_len(count, n, rblk);
        int ns = nchunks(slen, ce), nr = nchunks(rlen, ce);
        for (int k = 0; k < (ns > nr ? ns : nr); k++) {
            if (k < nr) {
                size_t o = roff + (size_t)k * ce, l = rlen - (size_t)k * ce < ce ? rlen - (size_t)k * ce : ce;
                int rv = sched_recv(r, prev, rb + o * es, l * es, step, k);
                sched_after(r, rv, rs_send[s * maxch + k]);
                next_prod[k] = rv;
            }
            if (k < ns) {
                size_t o = soff + (size_t)k * ce, l = slen - (size_t)k * ce < ce ? slen - (size_t)k * ce : ce;
                int so = sched_send(r, next, rb + o * es, l * es, step, k);
                sched_after(r, so, prod[k]);
            }
        }
        int *swap = prod;
        prod = next_prod;
        next_prod = swap;
    }
    free(prod < next_prod ? prod : next_prod);
}

void build_allreduce_rabenseifner(loom_comm_request *r, const void *send, void *recv,
                                  size_t count)
{
    loom_comm *c = r->comm;
    int n = c->size, me = c->rank, p = pow2_floor(n), extra = n - p, lg = log2_ceil(p);
    size_t es = loom_dtype_size(r->dtype), ce = ucx_chunk_elems(c, r->dtype, count, 0);
    const char *src = send;
    char *rb = recv;
    r->algo = "rabenseifner";
    int final_step = 2 * lg + 1;
    slot_ring sl;
    if (slots_init(r, &sl, (count < ce ? count : ce) * es, c->set.pipeline_depth) != LOOM_OK)
        return;

    if (me < 2 * extra && me % 2 == 0) {
        int first = r->nops;
        send_chunks(r, me + 1, send, es, 0, count, ce, 0, -1);
        int j = join_since(r, first);
        recv_chunks(r, me + 1, rb, es, 0, count, ce, final_step, j);
        return;
    }
    int join = -1, v;
    if (me < 2 * extra) {
        int first = r->nops;
        recv_reduce_chunks(r, me - 1, &sl, rb, src, es, 0, count, ce, 0, -1);
        join = join_since(r, first);
        src = rb;
        v = me / 2;
    } else {
        v = me - extra;
    }

    /* reduce-scatter by recursive halving over virtual blocks [lo, hi) */
    int lo = 0, hi = p, step = 1;
    for (int mask = p / 2; mask >= 1; mask >>= 1, step++) {
        int pv = v ^ mask, peer = real_rank(pv, extra), mid = lo + mask;
        int klo = v < pv ? lo : mid, khi = v < pv ? mid : hi;
        int slo = v < pv ? mid : lo, shi = v < pv ? hi : mid;
        size_t so = blk_off(count, p, slo), sl_len = blk_off(count, p, shi) - so;
        size_t ko = blk_off(count, p, klo), kl_len = blk_off(count, p, khi) - ko;
        int first = r->nops;
        recv_reduce_chunks(r, peer, &sl, rb, src, es, ko, kl_len, ce, step, join);
        send_chunks(r, peer, src, es, so, sl_len, ce, step, join);
        join = join_since(r, first);
        src = rb;
        lo = klo;
        hi = khi;
    }
    if (r->redop == LOOM_AVG) {
        size_t o = blk_off(count, p, v), l = blk_len(count, p, v);
        int first = r->nops;
        for (int k = 0; k < nchunks(l, ce); k++) {
            size_t co = o + (size_t)k * ce, cl = l - (size_t)k * ce < ce ? l - (size_t)k * ce : ce;
            int d = sched_divide(r, rb + co * es, cl);
            sched_after(r, d, join);
        }
        join = join_since(r, first);
    }
    /* allgather by recursive doubling: the range doubles each step */
    for (int mask = 1; mask < p; mask <<= 1, step++) {
        int pv = v ^ mask, peer = real_rank(pv, extra);
        int plo = v < pv ? hi : lo - mask, phi = plo + mask;
        size_t mo = blk_off(count, p, lo), ml = blk_off(count, p, hi) - mo;
        size_t po = blk_off(count, p, plo), pl = blk_off(count, p, phi) - po;
        int first = r->nops;
        recv_chunks(r, peer, rb, es, po, pl, ce, step, join);
        send_chunks(r, peer, rb, es, mo, ml, ce, step, join);
        join = join_since(r, first);
        lo = lo < plo ? lo : plo;
        hi = hi > phi ? hi : phi;
    }
    if (me < 2 * extra)
        send_chunks(r, me - 1, rb, es, 0, count, ce, final_step, join);
}
