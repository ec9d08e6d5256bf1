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
 *                                its blocks in parallel.
 *  reducescatter ring            n-1 steps; the partial sum of a block
 *                                travels the ring and ends on its owner.
 *  reducescatter recursive halving  log2(p) steps halving the range.
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

void build_allgather_ring(loom_comm_request *r, const void *send, void *recv, size_t count)
{
    loom_comm *c = r->comm;
    int n = c->size, me = c->rank, next = mod(me + 1, n), prev = mod(me - 1, n);
    size_t es = loom_dtype_size(r->dtype), ce = ucx_chunk_elems(c, r->dtype, count, 1);
    char *rb = recv;
    r->algo = "ring";
    int nch = nchunks(count, ce);
    int *prod = malloc(sizeof(int) * 2 * (size_t)nch);
    if (!prod) {
        r->build_failed = 1;
        return;
    }
    int *next_prod = prod + nch;
    if ((const char *)send != rb + (size_t)me * count * es)
        sched_copy(r, rb + (size_t)me * count * es, send, count * es);
    for (int s = 0; s < n - 1; s++) {
        int sblk = mod(me - s, n), rblk = mod(me - s - 1, n);
        for (int k = 0; k < nch; k++) {
            size_t o = (size_t)k * ce, l = count - o < ce ? count - o : ce;
            int rv = sched_recv(r, prev, rb + ((size_t)rblk * count + o) * es, l * es, s, k);
            const char *from = s == 0 ? (const char *)send + o * es
                                      : rb + ((size_t)sblk * count + o) * es;
            int so = sched_send(r, next, from, l * es, s, k);
            sched_after(r, so, s == 0 ? -1 : prod[k]);
            next_prod[k] = rv;
        }
        int *swap = prod;
        prod = next_prod;
        next_prod = swap;
    }
    free(prod < next_prod ? prod : next_prod);
}

void build_allgather_direct(loom_comm_request *r, const void *send, void *recv, size_t count)
{
    loom_comm *c = r->comm;
    int n = c->size, me = c->rank;
    size_t bytes = count * loom_dtype_size(r->dtype);
    char *rb = recv;
    r->algo = "direct";
    for (int s = 1; s < n; s++) {
        int from = mod(me - s, n);
        sched_recv(r, from, rb + (size_t)from * bytes, bytes, 0, 0);
    }
    for (int s = 1; s < n; s++)
        sched_send(r, mod(me + s, n), send, bytes, 0, 0);
    if ((const char *)send != rb + (size_t)me * bytes)
        sched_copy(r, rb + (size_t)me * bytes, send, bytes);
}

void build_allgather_rd(loom_comm_request *r, const void *send, void *recv, size_t count)
{
    loom_comm *c = r->comm;
    int n = c->size, me = c->rank, p = pow2_floor(n), extra = n - p, lg = log2_ceil(p);
    size_t es = loom_dtype_size(r->dtype), ce = ucx_chunk_elems(c, r->dtype, count, 1);
    char *rb = recv;
    r->algo = "recursive doubling";
    int final_step = lg + 1;
    int first = r->nops;
    if ((const char *)send != rb + (size_t)me * count * es)
        sched_copy(r, rb + (size_t)me * count * es, send, count * es);
    if (me < 2 * extra && me % 2 == 0) {
        send_chunks(r, me + 1, send, es, 0, count, ce, 0, -1);
        int j = join_since(r, first);
        recv_chunks(r, me + 1, rb, es, 0, count * (size_t)n, ce, final_step, j);
        return;
    }
    int v;
    if (me < 2 * extra) {
        recv_chunks(r, me - 1, rb, es, (size_t)(me - 1) * count, count, ce, 0, -1);
        v = me / 2;
    } else {
        v = me - extra;
    }
    int join = join_since(r, first), lo = v, hi = v + 1;
    for (int mask = 1, step = 1; mask < p; mask <<= 1, step++) {
        int pv = v ^ mask, peer = real_rank(pv, extra);
        int plo = v < pv ? hi : lo - mask, phi = plo + mask;
        size_t mo = (size_t)first_block(lo, extra) * count;
        size_t ml = (size_t)first_block(hi, extra) * count - mo;
        size_t po = (size_t)first_block(plo, extra) * count;
        size_t pl = (size_t)first_block(phi, extra) * count - po;
        first = r->nops;
        recv_chunks(r, peer, rb, es, po, pl, ce, step, join);
        send_chunks(r, peer, rb, es, mo, ml, ce, step, join);
        join = join_since(r, first);
        lo = lo < plo ? lo : plo;
        hi = hi > phi ? hi : phi;
    }
    if (me < 2 * extra)
        send_chunks(r, me - 1, rb, es, 0, count * (size_t)n, ce, final_step, join);
}

void build_allgather_bruck(loom_comm_request *r, const void *send, void *recv, size_t count)
{
    loom_comm *c = r->comm;
    int n = c->size, me = c->rank;
    size_t es = loom_dtype_size(r->dtype), bytes = count * es;
    char *rb = recv;
    r->algo = "bruck";
    /* tmp[i] holds block (me + i) mod n */
    char *tmp = sched_scratch(r, bytes * (size_t)n);
    if (!tmp)
        return;
    int join = sched_copy(r, tmp, send, bytes);
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

void build_reducescatter_ring(loom_comm_request *r, const void *send, void *recv, size_t count)
{
    loom_comm *c = r->comm;
    int n = c->size, me = c->rank, next = mod(me + 1, n), prev = mod(me - 1, n);
    size_t es = loom_dtype_size(r->dtype), ce = ucx_chunk_elems(c, r->dtype, count, 0);
    const char *sb = send;
    r->algo = "ring";
    int nch = nchunks(count, ce);
    slot_ring tmp;
    if (slots_init(r, &tmp, (count < ce ? count : ce) * es, c->set.pipeline_depth) != LOOM_OK)
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
            size_t o = (size_t)k * ce, l = count - o < ce ? count - o : ce;
            int free_dep;
            char *t = slots_take(&tmp, &free_dep);
            int rv = sched_recv(r, prev, t, l * es, s, k);
            sched_after(r, rv, free_dep);
            const char *from = s == 0 ? sb + ((size_t)sblk * count + o) * es : acc_in + o * es;
            int so = sched_send(r, next, from, l * es, s, k);
            sched_after(r, so, s == 0 ? -1 : prod[k]);
            char *dst = last ? (char *)recv + o * es : acc_out + o * es;
            int rd = sched_reduce(r, dst, t, sb + ((size_t)rblk * count + o) * es, l);
            sched_after(r, rd, rv);
            if (!last) /* acc_out's chunk k was last read by step s-1's send */
                sched_after(r, rd, sent[(s % 2) * nch + k]);
            slots_used(&tmp, rd);
            if (last && r->redop == LOOM_AVG) {
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

void build_reducescatter_rh(loom_comm_request *r, const void *send, void *recv, size_t count)
{
    loom_comm *c = r->comm;
    int n = c->size, me = c->rank, p = pow2_floor(n), extra = n - p, lg = log2_ceil(p);
    size_t es = loom_dtype_size(r->dtype), total = count * (size_t)n;
    r->algo = "recursive halving";
    int final_step = lg + 1;
    if (me < 2 * extra && me % 2 == 0) {
        int s = sched_send(r, me + 1, send, total * es, 0, 0);
        int back = sched_recv(r, me + 1, recv, count * es, final_step, 0);
        sched_after(r, back, s);
        return;
    }
    char *acc = sched_scratch(r, total * es);
    char *tmp = sched_scratch(r, total * es);
    if (!acc || !tmp)
        return;
    const char *src = send;
    int join = -1, v;
    if (me < 2 * extra) {
        int rv = sched_recv(r, me - 1, tmp, total * es, 0, 0);
        join = sched_reduce(r, acc, tmp, send, total);
        sched_after(r, join, rv);
        src = acc;
        v = me / 2;
    } else {
        v = me - extra;
    }
    int lo = 0, hi = p, step = 1;
    for (int mask = p / 2; mask >= 1; mask >>= 1, step++) {
        int pv = v ^ mask, peer = real_rank(pv, extra), mid = lo + mask;
        int klo = v < pv ? lo : mid, khi = v < pv ? mid : hi;
        int slo = v < pv ? mid : lo, shi = v < pv ? hi : mid;
        size_t so = (size_t)first_block(slo, extra) * count;
        size_t sl = (size_t)first_block(shi, extra) * count - so;
        size_t ko = (size_t)first_block(klo, extra) * count;
        size_t kl = (size_t)first_block(khi, extra) * count - ko;
        int first = r->nops;
        int rv = sched_recv(r, peer, tmp + ko * es, kl * es, step, 0);
        sched_after(r, rv, join);
        int s = sched_send(r, peer, src + so * es, sl * es, step, 0);
        sched_after(r, s, join);
        int rd = sched_reduce(r, acc + ko * es, tmp + ko * es, src + ko * es, kl);
        sched_after(r, rd, rv);
        sched_after(r, rd, join);
        join = join_since(r, first);
        src = acc;
        lo = klo;
        hi = khi;
    }
    /* Virtual rank v holds the reduced blocks of the real ranks it stands for. */
    size_t vo = (size_t)first_block(v, extra) * count;
    size_t vl = (size_t)first_block(v + 1, extra) * count - vo;
    if (r->redop == LOOM_AVG) {
        int d = sched_divide(r, acc + vo * es, vl);
        sched_after(r, d, join);
        join = d;
    }
    int cp = sched_copy(r, recv, acc + (size_t)me * count * es, count * es);
    sched_after(r, cp, join);
    if (me < 2 * extra) {
        int s = sched_send(r, me - 1, acc + (size_t)(me - 1) * count * es, count * es, final_step, 0);
        sched_after(r, s, join);
    }
}
