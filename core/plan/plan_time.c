/* loom plan — the time model: collectives by the alpha–beta model of ring
 * algorithms, compute by a roofline (docs/plan.md, "The time model").
 *
 * A collective of n ranks runs in steps; each step sends one message over
 * a link of latency α and bandwidth β (per rank, each direction). One call
 * with payload P, P counted as loom's comm counters count it
 * (core/runtime/group.c: allreduce, broadcast, reduce, send and recv the
 * buffer; allgather, reducescatter and alltoall the full buffer of all n
 * blocks), takes
 *
 *     steps(op, n) · α + moved(op, n) · P / β
 *
 *   op              steps      moved (loom_comm_bus_factor): the share of P each rank sends
 *   allreduce       2(n-1)     2(n-1)/n   ring: reduce-scatter, then allgather
 *   reducescatter   n-1        (n-1)/n    ring
 *   allgather       n-1        (n-1)/n    ring
 *   alltoall        n-1        (n-1)/n    pairwise exchange: P/n to each peer
 *   broadcast       n-1        1          pipelined chain: P in small chunks,
 *   reduce          n-1        1            each link carries all of it once
 *   send, recv      1          1
 *   barrier         ⌈log2 n⌉   0          dissemination
 *
 * (Thakur, Rabenseifner and Gropp, "Optimization of Collective
 * Communication Operations in MPICH", 2005, give these costs.) Inside one
 * node the link is intra. A group across nodes runs at its slowest link:
 * every ring step waits for the message that crosses a node boundary, so
 * both α and β are the worse of intra and inter.
 *
 * A collective the cluster measured inside a node (--calibrate: seconds =
 * latency + P / bandwidth at r ranks) replaces the link model for that op
 * inside a node. At r ranks the fit is used as it is; at other counts the
 * fit of the nearest r is turned into the link it implies (α = latency /
 * steps(r), β = moved(r) · bandwidth) and that link is run at n. */
#include <math.h>
#include <stdlib.h>

#include "runtime/group.h"
#include "plan/plan.h"

static double steps(loom_comm_op op, int n)
{
    switch (op) {
    case LOOM_OP_ALLREDUCE: return 2.0 * (n - 1);
    case LOOM_OP_REDUCESCATTER:
    case LOOM_OP_ALLGATHER:
    case LOOM_OP_ALLTOALL:
    case LOOM_OP_BROADCAST:
    case LOOM_OP_REDUCE: return n - 1;
    case LOOM_OP_SEND:
    case LOOM_OP_RECV: return 1;
    case LOOM_OP_BARRIER: return ceil(log2(n));
    default: return 0;
    }
}

/* The measured fit of op at the rank count nearest n (the larger of two
 * as near), or NULL. */
static const loom_plan_measured *nearest_fit(const loom_plan_cluster *c, loom_comm_op op, int n)
{
    const loom_plan_measured *best = NULL;
    for (int i = 0; i < c->nmeasured[op] && i < LOOM_PLAN_MEASURED_MAX; i++) {
        const loom_plan_measured *m = &c->measured[op][i];
        if (!best || abs(m->ranks - n) < abs(best->ranks - n) ||
            (abs(m->ranks - n) == abs(best->ranks - n) && m->ranks > best->ranks))
            best = m;
    }
    return best;
}

double loom_plan_comm_seconds(const loom_plan_cluster *c, loom_comm_op op, uint64_t bytes,
                              uint64_t calls, int ranks, int across)
{
    if (ranks <= 1 || calls == 0 || (unsigned)op >= LOOM_OP_COUNT)
        return 0; /* a group of one copies in memory: no link is used */
    loom_plan_link link = c->intra;
    const loom_plan_measured *fit = across <= 1 ? nearest_fit(c, op, ranks) : NULL;
    if (fit && fit->ranks == ranks)
        return (double)calls * fit->latency_s + (double)bytes / fit->bytes_per_s;
    if (fit) {
        link.latency_s = fit->latency_s / steps(op, fit->ranks);
        link.bytes_per_s = loom_comm_bus_factor(op, fit->ranks) * fit->bytes_per_s;
    } else if (across > 1) {
        link.latency_s = fmax(c->intra.latency_s, c->inter.latency_s);
        link.bytes_per_s = fmin(c->intra.bytes_per_s, c->inter.bytes_per_s);
    }
    /* calls · steps · α + moved · (all calls' payload) / β: the bytes term
     * is linear in P, so the calls' payloads add up before dividing. */
    return (double)calls * steps(op, ranks) * link.latency_s +
           loom_comm_bus_factor(op, ranks) * (double)bytes / link.bytes_per_s;
}

/* A roofline with two roofs added, not overlapped: loom's kernels run one
 * after another on a rank, so the matrix products' time and the rest's
 * time add up. */
double loom_plan_compute_seconds(const loom_plan_cluster *c, loom_dtype dtype, double gemm_flops,
                                 double other_bytes)
{
    double flops = (unsigned)dtype < LOOM_DTYPE_COUNT ? c->flops[dtype] : 0;
    /* A precision the cluster file gives no peak for runs at fp32's rate:
     * what a GPU without bf16 tensor cores does, and what loom does on a
     * CPU, where bf16 and fp16 GEMMs multiply in fp32. */
    if (flops <= 0)
        flops = c->flops[LOOM_F32];
    double seconds = 0;
    if (gemm_flops > 0)
        seconds += gemm_flops / flops;
    if (other_bytes > 0)
        seconds += other_bytes / c->memory_bytes_per_s;
    return seconds;
}
