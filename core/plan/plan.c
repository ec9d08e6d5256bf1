/* loom plan — the model of a step: per pipeline rank, the bytes
 * by tier and purpose at their peaks, the collectives per axis, the work,
 * and the step time on a cluster (plan.h).
 *
 * GPT-2 is planned from loom's own code where it can be: the model's
 * buffers come from the model itself (loom_model_plan, which runs the
 * allocation code without allocating), the pipeline's from walking the
 * schedule's action lists in the order the executor runs them. The
 * shipped data strategies' buffers follow their allocation rules, written
 * out below next to the code they mirror (plugins/strategy/ddp.c,
 * zero.c); the tests hold them to the accounting of real runs. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/status.h"
#include "model/model.h"
#include "runtime/log.h"
#include "plan/plan.h"
#include "plan/plan_reference.h"
#include "train/schedule.h"

/* zero.c: each unit padded to a multiple of ALIGN × shard-group ranks */
enum { ZERO_ALIGN = 32 };

typedef struct stage_units {
    int n;        /* units the rank holds, in model order */
    int *unit;    /* their indices 0..L+1 */
    size_t *numel; /* this rank's elements of each (after the tp split) */
} stage_units;

static uint64_t round_up(uint64_t x, uint64_t q) { return (x + q - 1) / q * q; }
static uint64_t max64(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* ---- the data strategies (plugins/strategy/ddp.c, zero.c) ---- */

/* zero's full gradients in flight (zero2/3): backward runs the held units
 * last to first; beside the unit in backward, the one whose
 * reduce-scatter it overlaps; with the tied embedding held, its buffer
 * stays open from the head's backward to its own. */
static uint64_t zero_grads_in_flight(const uint64_t *u, int n, int tied)
{
    uint64_t most = n == 1 ? u[0] : 0;
    if (tied)
        most = u[n - 1] + u[0];
    for (int i = n - 1; i >= 1; i--) {
        int below = i - 1;
        uint64_t open = u[i] + u[below];
        if (tied && below > 0)
            open += u[0];
        most = max64(most, open);
    }
    return most;
}

/* zero3's gathered parameters: in forward a unit and the `prefetch` after
 * it (the head's step brings the tied embedding again, which then stays
 * for the head's backward); in backward the unit and the `prefetch`
 * before it, beside the held embedding. */
static uint64_t zero_params_in_flight(const uint64_t *u, int n, int tied, int prefetch)
{
    uint64_t most = 0;
    for (int i = 0; i < n; i++) {
        uint64_t forward = 0, backward = tied ? u[0] : 0;
        for (int k = i; k <= i + prefetch && k < n; k++)
            forward += u[k];
        if (tied && i > 0 && i + prefetch >= n - 1)
            forward += u[0];
        for (int k = i; k >= i - prefetch && k >= (tied ? 1 : 0); k--)
            backward += u[k];
        most = max64(most, max64(forward, backward));
    }
    return most;
}

/* A buffer the strategy asks the tiers for (host->tiered_alloc), one
 * segment per unit. Kept on NVMe, its segments pass through host staging
 * unit by unit, at most three at once (read ahead, in use, written
 * behind: core/runtime/tier.c), so the host holds the largest run of three
 * consecutive segments. */
static void tiered(const loom_plan_job *j, loom_purpose purpose, const uint64_t *segment, int n,
                   loom_plan_rank *r)
{
    uint64_t total = 0, staged = 0;
    for (int i = 0; i < n; i++) {
        total += segment[i];
        uint64_t run = 0;
        for (int k = i; k < i + 3 && k < n; k++)
            run += segment[k];
        staged = max64(staged, run);
    }
    if (j->offload[purpose] == LOOM_OFFLOAD_NVME) {
        r->peak[LOOM_TIER_NVME][purpose] += total;
        r->peak[LOOM_TIER_HOST][purpose] += staged;
        /* the tier reserves whole blocks, at least one a segment */
        uint64_t block = j->nvme_block_bytes ? j->nvme_block_bytes : 1;
        for (int i = 0; i < n; i++)
            r->nvme_file += (segment[i] ? (segment[i] + block - 1) / block : 1) * block;
    } else {
        r->peak[LOOM_TIER_HOST][purpose] += total;
    }
}

/* Adam's m and v per unit, and the fp32 master weights of 16-bit runs
 * (plugins/common/opt_state.c): tiered buffers of 4 bytes an element. */
static void optimizer_state(const loom_plan_job *j, const size_t *elements, int n, loom_plan_rank *r)
{
    uint64_t *segment = calloc((size_t)n, sizeof *segment);
    if (!segment)
        return;
    for (int i = 0; i < n; i++)
        segment[i] = elements[i] * 4;
    for (int k = j->dtype == LOOM_F32 ? 1 : 0; k < 3; k++)
        tiered(j, LOOM_PURPOSE_OPTIMIZER, segment, n, r);
    free(segment);
}

static void add_comm(loom_plan_rank *r, loom_axis axis, loom_comm_op op, uint64_t calls,
                     uint64_t bytes_each)
{
    r->comm[axis][op].calls += calls;
    r->comm[axis][op].bytes += calls * bytes_each;
}

/* The shipped data strategies: 0 ddp, 1..3 the ZeRO stage, 4 diloco; -1
 * another (loom_plan_make refuses it before any rank is planned). */
#define DP_DILOCO 4
static int dp_stage(const loom_plan_job *j)
{
    static const char *const names[] = {"ddp", "zero1", "zero2", "zero3", "diloco"};
    for (int k = 0; k < 5; k++)
        if (!strcmp(j->dp_strategy, names[k]))
            return k;
    return -1;
}

/* ddp: whole parameters and gradients, and buckets of consecutive units
 * in backward order, each closing at bucket_mb, all-reduced once per step
 * (the last micro-batch). */
static void plan_ddp(const loom_plan_job *j, const stage_units *su, loom_plan_rank *r)
{
    uint64_t e = loom_dtype_size(j->dtype);
    uint64_t *host = r->peak[LOOM_TIER_HOST];
    uint64_t numel = 0;
    for (int i = 0; i < su->n; i++)
        numel += su->numel[i];
    host[LOOM_PURPOSE_PARAMS] += numel * e;
    host[LOOM_PURPOSE_GRADS] += numel * e;
    optimizer_state(j, su->numel, su->n, r);
    uint64_t bucket = 0;
    for (int i = su->n - 1; i >= 0; i--) {
        bucket += su->numel[i];
        if ((double)(bucket * e) >= j->bucket_mb * 1024.0 * 1024.0 || i == 0) {
            add_comm(r, LOOM_AXIS_DP, LOOM_OP_ALLREDUCE, 1, bucket * e);
            bucket = 0;
        }
    }
}

/* diloco (plugins/strategy/diloco.c): ddp's whole parameters and
 * gradients, each worker's fp32 weights (16-bit runs) and Adam moments,
 * the outer weights and their momentum (fp32, host memory, never
 * offloaded); one all-reduce of the fp32 weights every sync_every steps,
 * planned per step as 1/sync_every of it. */
static void plan_diloco(const loom_plan_job *j, const stage_units *su, loom_plan_rank *r)
{
    uint64_t e = loom_dtype_size(j->dtype), numel = 0;
    uint64_t *host = r->peak[LOOM_TIER_HOST];
    for (int i = 0; i < su->n; i++)
        numel += su->numel[i];
    host[LOOM_PURPOSE_PARAMS] += numel * e;
    host[LOOM_PURPOSE_GRADS] += numel * e;
    host[LOOM_PURPOSE_OPTIMIZER] += numel * 4 * (j->dtype == LOOM_F32 ? 4 : 5);
    uint64_t every = j->sync_every > 0 ? (uint64_t)j->sync_every : 1;
    add_comm(r, LOOM_AXIS_DP, LOOM_OP_ALLREDUCE, 1, (numel * 4 + every - 1) / every);
    /* the core's, for a strategy that trains approximately: dp rank 0's
     * norm to every rank, and whether any rank's is not finite (two f64) */
    if (j->sizes[LOOM_AXIS_DP] > 1)
        add_comm(r, LOOM_AXIS_DP, LOOM_OP_ALLREDUCE, 1, 16);
}

static int plan_data_strategy(const loom_plan_job *j, const stage_units *su, int tied,
                              loom_plan_rank *r)
{
    uint64_t e = loom_dtype_size(j->dtype);
    uint64_t *host = r->peak[LOOM_TIER_HOST];
    int n = su->n, stage = dp_stage(j);
    if (stage == 0 || stage == DP_DILOCO) {
        (stage ? plan_diloco : plan_ddp)(j, su, r);
        return LOOM_OK;
    }
    int shard_ranks = j->shard_size > 0 ? j->shard_size : j->sizes[LOOM_AXIS_DP];
    uint64_t *padded = calloc((size_t)n, sizeof *padded), *shard = calloc((size_t)n, sizeof *shard);
    size_t *owned_elements = calloc((size_t)n, sizeof *owned_elements);
    if (!padded || !shard || !owned_elements) {
        free(padded);
        free(shard);
        free(owned_elements);
        return loom_fail(LOOM_ERR_NO_MEMORY, "plan: out of memory");
    }
    uint64_t full = 0, owned = 0, biggest_shard = 0;
    for (int i = 0; i < n; i++) {
        padded[i] = round_up(su->numel[i], (uint64_t)ZERO_ALIGN * shard_ranks);
        full += padded[i];
        owned += padded[i] / shard_ranks;
        biggest_shard = max64(biggest_shard, padded[i] / shard_ranks);
        owned_elements[i] = padded[i] / shard_ranks;
        shard[i] = owned_elements[i] * e;
    }
    for (int i = 0; i < n; i++)
        padded[i] *= e;
    optimizer_state(j, owned_elements, n, r);
    /* the global norm (one f64); per unit: zero1 reduce-scatters on the
     * last micro-batch, zero2/3 on each; zero1/2 gather the updated
     * parameters once, zero3 gathers for each forward and backward (the
     * tied embedding's second forward keeps its gather); HSDP all-reduces
     * each owned shard over the replicas */
    int micro = j->grad_accum, replicas = j->sizes[LOOM_AXIS_DP] / shard_ranks;
    add_comm(r, LOOM_AXIS_DP, LOOM_OP_ALLREDUCE, 1, 8);
    for (int i = 0; i < n; i++) {
        add_comm(r, LOOM_AXIS_DP, LOOM_OP_REDUCESCATTER, stage == 1 ? 1 : (uint64_t)micro, padded[i]);
        add_comm(r, LOOM_AXIS_DP, LOOM_OP_ALLGATHER, stage == 3 ? 2 * (uint64_t)micro : 1, padded[i]);
        if (replicas > 1)
            add_comm(r, LOOM_AXIS_DP, LOOM_OP_ALLREDUCE, 1, padded[i] / shard_ranks);
    }
    if (stage == 1) {
        host[LOOM_PURPOSE_PARAMS] += full * e;
        host[LOOM_PURPOSE_GRADS] += full * e;
        host[LOOM_PURPOSE_COMM] += owned * e;
    } else {
        if (stage == 3)
            tiered(j, LOOM_PURPOSE_PARAMS, shard, n, r);
        else
            host[LOOM_PURPOSE_PARAMS] += full * e;
        tiered(j, LOOM_PURPOSE_GRADS, shard, n, r);
        host[LOOM_PURPOSE_GRADS] += zero_grads_in_flight(padded, n, tied);
        host[LOOM_PURPOSE_COMM] += biggest_shard * e;
        if (stage == 3)
            host[LOOM_PURPOSE_PARAMS] += zero_params_in_flight(padded, n, tied, j->prefetch);
    }
    free(padded);
    free(shard);
    free(owned_elements);
    return LOOM_OK;
}

/* ---- the tensor and sequence axes (core/train/model_axes.c, the model's
 * borders, plugins/strategy/tp.c, ulysses.c, ring.c) ---- */

/* Per micro-batch, for a unit the rank runs: the tensor group's border
 * collectives, each an fp32 (N, C) buffer of the micro-batch's token rows
 * as counted (with sequence parallelism the rows are split, the count the
 * whole): a block enters and leaves two regions in forward and again in
 * backward, and with recomputation runs its forward twice; the embedding
 * leaves the vocabulary region, the head enters it (Megatron's f and g:
 * identity/all-reduce, or all-gather/reduce-scatter). The sequence group
 * sums each unit's fp32 gradients; with sequence parallelism the tensor
 * group sums the runs of replicated tensors. */
static void plan_unit_borders(const loom_plan_job *j, const loom_unit *unit, int L, double *blocks,
                              loom_plan_rank *r)
{
    int tp = j->sizes[LOOM_AXIS_TP], sp = j->sizes[LOOM_AXIS_SP], sq = j->sequence_parallel;
    uint64_t micro = (uint64_t)j->grad_accum, T = (uint64_t)j->seq / (uint64_t)sp;
    uint64_t N = (uint64_t)j->micro_batch * T, C = (uint64_t)j->shape.channels;
    uint64_t rows = N * C * 4;
    int u = unit->index;
    if (u >= 1 && u <= L)
        *blocks += 1;
    if (tp == 1)
        return;
    /* a block: per forward pass (two with recomputation) two regions
     * entered and left; in backward each border's conjugate, and the
     * weight gradients' region inputs again. The embedding leaves the
     * vocabulary region; the head enters it (and again for wte's
     * gradient). gathers: forward enters, backward exits and the inputs
     * again (identity without sequence parallelism); reductions: forward
     * exits and backward enters. */
    uint64_t passes = j->recompute ? 2 : 1, gathers = 2 * passes + 4, reductions = 2 * passes + 2;
    if (u == 0)
        gathers = reductions = 1;
    else if (u == L + 1)
        gathers = 2, reductions = 1;
    if (sq) {
        add_comm(r, LOOM_AXIS_TP, LOOM_OP_ALLGATHER, micro * gathers, rows);
        add_comm(r, LOOM_AXIS_TP, LOOM_OP_REDUCESCATTER, micro * reductions, rows);
    } else {
        add_comm(r, LOOM_AXIS_TP, LOOM_OP_ALLREDUCE, micro * reductions, rows);
    }
    if (u == L + 1) { /* the vocabulary-parallel loss: rows' max, then their two sums */
        add_comm(r, LOOM_AXIS_TP, LOOM_OP_ALLREDUCE, micro, N * 4);
        add_comm(r, LOOM_AXIS_TP, LOOM_OP_ALLREDUCE, micro, 2 * N * 4);
    }
}

/* Per micro-batch, a unit's fp32 gradients before the data strategy sees
 * them: the sequence group sums them whole; with sequence parallelism the
 * tensor group sums each run of replicated tensors. Returns the unit's
 * replicated elements. */
static uint64_t plan_reduce_grads(const loom_plan_job *j, const loom_unit *unit, loom_plan_rank *r)
{
    uint64_t replicated = 0;
    uint64_t micro = (uint64_t)j->grad_accum;
    if (r && j->sizes[LOOM_AXIS_SP] > 1)
        add_comm(r, LOOM_AXIS_SP, LOOM_OP_ALLREDUCE, micro, unit->numel * 4);
    for (int i = 0; i < unit->ntensors;) {
        if (unit->tensors[i].split != LOOM_SPLIT_REPLICATED) {
            i++;
            continue;
        }
        uint64_t n = 0;
        while (i < unit->ntensors && unit->tensors[i].split == LOOM_SPLIT_REPLICATED)
            n += unit->tensors[i++].count;
        replicated += n;
        if (r && j->sizes[LOOM_AXIS_TP] > 1 && j->sequence_parallel)
            add_comm(r, LOOM_AXIS_TP, LOOM_OP_ALLREDUCE, micro, n * 4);
    }
    return replicated;
}

/* The sequence strategy's buffers and traffic for `layers` blocks that
 * keep attention state: Ulysses all-to-alls q, k, v there and the output
 * back (backward the reverse), each an fp32 (B, T/sp, C/tp) buffer, and
 * keeps each layer's head-sharded q, k, v, output and statistics; ring
 * attention passes K and V around the ring (sp − 1 steps forward, and in
 * backward sp − 1 more with the sp gradient passes), holding five
 * double buffers. */
static int plan_sequence(const loom_plan_job *j, double blocks, double saved_layers,
                         loom_plan_rank *r)
{
    int sp = j->sizes[LOOM_AXIS_SP], tp = j->sizes[LOOM_AXIS_TP];
    if (sp == 1)
        return LOOM_OK;
    uint64_t micro = (uint64_t)j->grad_accum, T = (uint64_t)j->seq / (uint64_t)sp;
    uint64_t B = (uint64_t)j->micro_batch, NH = (uint64_t)(j->shape.heads / tp);
    uint64_t local = B * T * (uint64_t)j->shape.channels / (uint64_t)tp * 4; /* q, k, v or out */
    uint64_t passes = j->recompute ? 2 : 1; /* forwards per block */
    uint64_t *host = r->peak[LOOM_TIER_HOST];
    if (!strcmp(j->sp_strategy, "ulysses")) {
        add_comm(r, LOOM_AXIS_SP, LOOM_OP_ALLTOALL, micro * (uint64_t)blocks * (4 * passes + 4), local);
        host[LOOM_PURPOSE_COMM] += 2 * local;
        host[LOOM_PURPOSE_ACTIVATIONS] += 4 * local + (uint64_t)saved_layers * (4 * local + B * NH * T * 4);
        return LOOM_OK;
    }
    if (!strcmp(j->sp_strategy, "ring")) {
        uint64_t steps = (uint64_t)(sp - 1) * passes + (uint64_t)(sp - 1) + (uint64_t)sp;
        add_comm(r, LOOM_AXIS_SP, LOOM_OP_SEND, micro * (uint64_t)blocks * steps, 2 * local);
        add_comm(r, LOOM_AXIS_SP, LOOM_OP_RECV, micro * (uint64_t)blocks * steps, 2 * local);
        host[LOOM_PURPOSE_COMM] += 5 * 2 * local;
        return LOOM_OK;
    }
    return loom_fail(LOOM_ERR_NOT_SUPPORTED,
                     "plan: parallel.sp.strategy = \"%s\": loom plan knows ulysses and ring",
                     j->sp_strategy);
}

/* ---- the pipeline axis (core/train/pipeline.c) ---- */

enum { RECV_AHEAD = 2 }; /* receives the executor keeps posted ahead */

/* The walk over one pipeline rank's action list: its buffers' bytes now
 * and at their peaks (activations, comm), and what it keeps per action. */
typedef struct walk {
    uint64_t act, comm, act_peak, comm_peak;
    const loom_plan_job *j;
    loom_model *m;
    int rank, n;
    const loom_action *list;
    int64_t stream, gradient; /* bytes of an activation sent on, and of its gradient */
    int *slots, *live;        /* per virtual stage: slots taken, micro-batches alive */
    uint64_t *slot_bytes;     /* per virtual stage: one micro-batch's saved activations */
    char *posted, *waited;    /* per action: a receive posted, waited for */
    int next;                 /* the first action not yet looked ahead at */
    int most_live, now_live;  /* micro-batches alive at once */
    loom_plan_rank *out;
} walk;

static void hold(walk *w, int purpose_act, int64_t bytes)
{
    uint64_t *cur = purpose_act ? &w->act : &w->comm, *peak = purpose_act ? &w->act_peak : &w->comm_peak;
    *cur = (uint64_t)((int64_t)*cur + bytes);
    if (*cur > *peak)
        *peak = *cur;
}

static int is_receive(loom_action_kind kind)
{
    return kind == LOOM_ACT_RECV_ACTIVATION || kind == LOOM_ACT_RECV_GRADIENT;
}

/* A receive's buffer: a gradient's or an activation's. */
static int64_t received_bytes(const walk *w, loom_action_kind kind)
{
    return kind == LOOM_ACT_RECV_GRADIENT ? w->gradient : w->stream;
}

/* The compute of action a on virtual stage st: a forward takes a slot
 * (recycled within the virtual stage once its backward is done) and frees
 * its received input; a backward frees its received gradient and holds
 * the one to send; a split backward keeps each unit's deferred gradients
 * from its input half to its weight half. */
static void walk_compute(walk *w, loom_action a, int st)
{
    const loom_plan_job *j = w->j;
    int vs = a.virtual_stage, S = j->sizes[LOOM_AXIS_PP] * j->virtual_stages;
    int first = j->stage_first[st], last = j->stage_last[st];
    if (a.kind == LOOM_ACT_FORWARD && w->live[vs] == w->slots[vs]) {
        w->slots[vs]++;
        hold(w, 1, (int64_t)w->slot_bytes[vs]);
    }
    if (a.kind == LOOM_ACT_FORWARD) {
        w->live[vs]++;
        if (++w->now_live > w->most_live)
            w->most_live = w->now_live;
        if (st > 0) /* its received input, read and freed */
            hold(w, 0, -w->stream);
    }
    if ((a.kind == LOOM_ACT_BACKWARD || a.kind == LOOM_ACT_BACKWARD_INPUT) && st < S - 1)
        hold(w, 0, -w->gradient);
    if (a.kind == LOOM_ACT_BACKWARD_INPUT)
        for (int u = last; u >= first; u--)
            hold(w, 1, (int64_t)loom_model_deferred_bytes(w->m, u));
    if (a.kind == LOOM_ACT_BACKWARD_WEIGHT)
        for (int u = last; u >= first; u--)
            hold(w, 1, -(int64_t)loom_model_deferred_bytes(w->m, u));
    if ((a.kind == LOOM_ACT_BACKWARD || a.kind == LOOM_ACT_BACKWARD_INPUT) && st > 0)
        hold(w, 0, w->gradient);
    if (a.kind == LOOM_ACT_BACKWARD || a.kind == LOOM_ACT_BACKWARD_WEIGHT) {
        w->live[vs]--;
        w->now_live--;
    }
}

/* Action i: a receive's buffer is held from its post to the compute that
 * reads it; a send's is freed once the network says it completed, planned
 * right after its action (an eager send), which is what small messages do. */
static void walk_action(walk *w, int i)
{
    loom_action a = w->list[i];
    int st = a.virtual_stage * w->j->sizes[LOOM_AXIS_PP] + w->rank;
    if (is_receive(a.kind) && !w->posted[i]) {
        w->posted[i] = 1;
        hold(w, 0, received_bytes(w, a.kind));
    }
    if (is_receive(a.kind))
        w->waited[i] = 1;
    if (a.kind <= LOOM_ACT_BACKWARD_WEIGHT)
        walk_compute(w, a, st);
    if (a.kind == LOOM_ACT_SEND_ACTIVATION) {
        hold(w, 0, w->stream);
        hold(w, 0, -w->stream);
        add_comm(w->out, LOOM_AXIS_PP, LOOM_OP_SEND, 1, (uint64_t)w->stream);
    }
    if (a.kind == LOOM_ACT_SEND_GRADIENT) {
        hold(w, 0, -w->gradient);
        add_comm(w->out, LOOM_AXIS_PP, LOOM_OP_SEND, 1, (uint64_t)w->gradient);
    }
    if (is_receive(a.kind))
        add_comm(w->out, LOOM_AXIS_PP, LOOM_OP_RECV, 1, (uint64_t)received_bytes(w, a.kind));
}

/* Keep RECV_AHEAD receives posted beyond action i (-1: before the first). */
static void post_receives_ahead(walk *w, int i)
{
    int ahead = 0;
    for (int k = i + 1; k < w->next; k++)
        ahead += w->posted[k] && !w->waited[k] && is_receive(w->list[k].kind);
    if (w->next < i + 1)
        w->next = i + 1;
    while (w->next < w->n && ahead < RECV_AHEAD) {
        loom_action_kind kind = w->list[w->next].kind;
        if (is_receive(kind)) {
            w->posted[w->next] = 1;
            hold(w, 0, received_bytes(w, kind));
            ahead++;
        }
        w->next++;
    }
}

/* One micro-batch's saved activations on each of the rank's virtual stages. */
static void stage_slot_bytes(walk *w, unsigned char *cover)
{
    const loom_plan_job *j = w->j;
    int p = j->sizes[LOOM_AXIS_PP], L = j->shape.layers;
    for (int vs = 0; vs < j->virtual_stages; vs++) {
        int st = vs * p + w->rank;
        memset(cover, 0, (size_t)L + 2);
        for (int u = j->stage_first[st]; u <= j->stage_last[st]; u++)
            cover[u] = 1;
        w->slot_bytes[vs] = loom_model_slot_bytes_of(w->m, cover);
    }
}

/* The rank's actions in the order the executor runs them: a virtual
 * stage's micro-batch takes a slot, never freed during the step;
 * receives are posted RECV_AHEAD ahead and their buffers held until the
 * compute that reads them; a gradient to send is copied out at the
 * backward and held until its send. */
static void walk_schedule(const loom_plan_job *j, const loom_schedule *sch, int rank, loom_model *m,
                          uint64_t shared, loom_plan_rank *out)
{
    int v = j->virtual_stages, n = sch->count[rank];
    size_t count = 0;
    loom_dtype dtype = LOOM_F32;
    (void)loom_model_stream(m, 1, &count, &dtype);
    walk w = {.act = shared, .act_peak = shared, .j = j, .m = m, .rank = rank, .n = n,
              .list = sch->actions[rank], .stream = (int64_t)(count * loom_dtype_size(dtype)),
              .gradient = (int64_t)(count * 4), .out = out};
    w.slots = calloc((size_t)v, sizeof *w.slots);
    w.live = calloc((size_t)v, sizeof *w.live);
    w.slot_bytes = calloc((size_t)v, sizeof *w.slot_bytes);
    w.posted = calloc((size_t)n, 1);
    w.waited = calloc((size_t)n, 1);
    unsigned char *cover = calloc((size_t)j->shape.layers + 2, 1);
    if (w.slots && w.live && w.slot_bytes && w.posted && w.waited && cover) {
        stage_slot_bytes(&w, cover);
        for (int i = -1; i < n; i++) {
            if (i >= 0)
                walk_action(&w, i);
            post_receives_ahead(&w, i);
        }
        out->live_microbatches = w.most_live;
        out->slot_bytes = 0; /* one micro-batch through each of the rank's stages */
        for (int vs = 0; vs < v; vs++)
            out->slot_bytes += w.slot_bytes[vs];
        out->peak[LOOM_TIER_HOST][LOOM_PURPOSE_ACTIVATIONS] += w.act_peak;
        out->peak[LOOM_TIER_HOST][LOOM_PURPOSE_COMM] += w.comm_peak;
    }
    free(w.slots);
    free(w.live);
    free(w.slot_bytes);
    free(w.posted);
    free(w.waited);
    free(cover);
}

/* ---- one pipeline rank ---- */

/* The model on the rank's units as the trainer would lay it out, counted
 * and not allocated (runs: the units this pipeline rank holds), and the
 * bytes of one micro-batch's activations the kernels stream. */
static int plan_gpt2_model(const loom_plan_job *j, const unsigned char *runs, const int *positions,
                           loom_model **m, double *streamed)
{
    int p = j->sizes[LOOM_AXIS_PP], sp = j->sizes[LOOM_AXIS_SP];
    loom_model_setup setup = {.shape = {.max_seq = j->shape.max_seq,
                                        .vocab = j->shape.vocab,
                                        .layers = j->shape.layers,
                                        .heads = j->shape.heads,
                                        .channels = j->shape.channels,
                                        .padded_vocab = j->shape.padded_vocab},
                              .batch = j->micro_batch,
                              .seq = j->seq,
                              .dtype = j->dtype,
                              .recompute = j->recompute};
    loom_model_layout lay;
    memset(&lay, 0, sizeof lay);
    lay.tp_size = j->sizes[LOOM_AXIS_TP];
    lay.sequence_parallel = j->sequence_parallel;
    lay.sp_size = sp;
    lay.positions = sp > 1 ? positions : NULL;
    lay.npositions = sp > 1 ? j->seq / sp : j->seq;
    lay.runs_unit = p > 1 ? runs : NULL;
    int rc = loom_model_plan(&setup, &lay, m);
    /* what the kernels stream does not shrink with recomputation (it
     * grows): counted on the layout that keeps everything */
    loom_model *kept = NULL;
    setup.recompute = 0;
    if (rc == LOOM_OK && (rc = loom_model_plan(&setup, &lay, &kept)) == LOOM_OK)
        *streamed = (double)loom_model_slot_bytes_of(kept, p > 1 ? runs : NULL) *
                    (j->recompute ? 4.0 / 3.0 : 1.0);
    loom_model_destroy(kept);
    return rc;
}

/* The model's own buffers and the activations (the pipeline's walked
 * through its schedule), offload-nvme's ring, and a pipeline's copy of
 * the tied embedding on the last stage. */
static void plan_gpt2_buffers(const loom_plan_job *j, const loom_schedule *schedule, int rank,
                              loom_model *m, const unsigned char *runs, loom_plan_rank *out)
{
    int L = j->shape.layers, p = j->sizes[LOOM_AXIS_PP];
    uint64_t *host = out->peak[LOOM_TIER_HOST];
    out->activation_shared = loom_model_planned_bytes(m, LOOM_PURPOSE_ACTIVATIONS);
    host[LOOM_PURPOSE_OTHER] += loom_model_planned_bytes(m, LOOM_PURPOSE_OTHER);
    out->slot_bytes = loom_model_slot_bytes_of(m, NULL);
    out->live_microbatches = 1;
    if (p == 1)
        host[LOOM_PURPOSE_ACTIVATIONS] += out->activation_shared + out->slot_bytes;
    else
        walk_schedule(j, schedule, rank, m, out->activation_shared, out);
    if (p > 1) {
        /* the step's loss and idle share, the norm, every stage's peaks */
        add_comm(out, LOOM_AXIS_PP, LOOM_OP_ALLREDUCE, 1, 16);
        add_comm(out, LOOM_AXIS_PP, LOOM_OP_ALLREDUCE, 1, 8);
        add_comm(out, LOOM_AXIS_PP, LOOM_OP_ALLGATHER, 1, 16 * (uint64_t)p);
    }
    int nvme = 0;
    for (int k = 0; k < LOOM_PURPOSE_COUNT; k++)
        nvme |= j->offload[k] == LOOM_OFFLOAD_NVME;
    if (nvme) /* offload-nvme's ring: queue_depth bounce buffers and a page */
        host[LOOM_PURPOSE_OTHER] += (uint64_t)j->nvme_queue_depth * j->nvme_block_bytes + 4096;
    int count = 0;
    loom_unit *units = loom_model_units(m, &count);
    int holds_first = runs[0], holds_last = runs[L + 1];
    uint64_t tied_bytes = units[0].numel * loom_dtype_size(j->dtype);
    if (p > 1 && holds_last && !holds_first) {
        /* the head's copy of wte and its gradient share: sent to the
         * first stage after the step, the updated wte received back */
        host[LOOM_PURPOSE_PARAMS] += tied_bytes;
        host[LOOM_PURPOSE_GRADS] += tied_bytes;
        add_comm(out, LOOM_AXIS_PP, LOOM_OP_SEND, 1, tied_bytes);
        add_comm(out, LOOM_AXIS_PP, LOOM_OP_RECV, 1, tied_bytes);
    } else if (p > 1 && holds_first && !holds_last) {
        /* the share received, and in 16-bit runs its fp32 widening beside */
        uint64_t widened = j->dtype == LOOM_F32 ? 0 : units[0].numel * sizeof(float);
        host[LOOM_PURPOSE_COMM] = max64(host[LOOM_PURPOSE_COMM], tied_bytes + widened);
        add_comm(out, LOOM_AXIS_PP, LOOM_OP_RECV, 1, tied_bytes);
        add_comm(out, LOOM_AXIS_PP, LOOM_OP_SEND, 1, tied_bytes);
    }
}

/* The strategies' buffers and traffic: the data axis's, the tensor axis's
 * borders and replicated gradients, the sequence axis's; *blocks: the
 * transformer blocks the rank holds. */
static int plan_gpt2_axes(const loom_plan_job *j, loom_model *m, const stage_units *su,
                          const unsigned char *runs, double *blocks, loom_plan_rank *out)
{
    int L = j->shape.layers, p = j->sizes[LOOM_AXIS_PP];
    int count = 0;
    loom_unit *units = loom_model_units(m, &count);
    add_comm(out, LOOM_AXIS_DP, LOOM_OP_ALLREDUCE, 1, 4); /* the step's loss */
    int tied = su->unit[0] == 0 && su->unit[su->n - 1] == L + 1;
    int rc = plan_data_strategy(j, su, tied, out);
    uint64_t replicated = 0;
    for (int i = 0; i < su->n; i++) {
        plan_unit_borders(j, &units[su->unit[i]], L, blocks, out);
        plan_reduce_grads(j, &units[su->unit[i]], out);
    }
    /* a last stage without the embedding reduces its wte copy's share */
    if (p > 1 && runs[L + 1] && !runs[0])
        plan_reduce_grads(j, &units[0], out);
    /* the norm's replicated gradients, averaged over dp (every unit's) */
    for (int u = 0; u < count; u++)
        replicated += plan_reduce_grads(j, &units[u], NULL);
    if (j->sizes[LOOM_AXIS_TP] > 1) /* kept for the norm (core/train/model_axes.c) */
        out->peak[LOOM_TIER_HOST][LOOM_PURPOSE_GRADS] += replicated * 4;
    if (j->sizes[LOOM_AXIS_TP] > 1 && j->sizes[LOOM_AXIS_DP] > 1)
        add_comm(out, LOOM_AXIS_DP, LOOM_OP_ALLREDUCE, 1, replicated * 4);
    /* Ulysses keys what it keeps on each layer's statistics buffer: one
     * per block and slot, but recomputation's all share the scratch */
    double saved = j->recompute ? 1 : *blocks * out->live_microbatches;
    if (rc == LOOM_OK)
        rc = plan_sequence(j, *blocks, saved, out);
    if (j->sizes[LOOM_AXIS_SP] > 1)
        add_comm(out, LOOM_AXIS_SP, LOOM_OP_ALLREDUCE, 1, 4); /* the loss, averaged */
    if (j->sizes[LOOM_AXIS_TP] > 1)
        add_comm(out, LOOM_AXIS_TP, LOOM_OP_ALLREDUCE, 1, 8); /* the replicated norm */
    return rc;
}

/* The work: 6 FLOPs per parameter and token (forward 2, backward 4),
 * attention's scores and sums causal (6·T·C a block and token), a block's
 * forward again with recomputation; the kernels between the GEMMs stream
 * each micro-batch's activations about three times (written, read back,
 * their gradients), the optimizer the model state twice. */
static void plan_gpt2_work(const loom_plan_job *j, double blocks, int holds_head, double streamed,
                           loom_plan_rank *out)
{
    int tp = j->sizes[LOOM_AXIS_TP], sp = j->sizes[LOOM_AXIS_SP];
    const uint64_t *host = out->peak[LOOM_TIER_HOST];
    double C = j->shape.channels, T = j->seq, tokens = (double)j->micro_batch * T / sp;
    double block = (72 * C * C + 6 * T * C) / tp * (j->recompute ? 4.0 / 3.0 : 1.0);
    out->gemm_flops = tokens * j->grad_accum *
                      (blocks * block + (holds_head ? 6.0 * j->shape.padded_vocab * C / tp : 0));
    out->other_bytes = 3.0 * streamed * j->grad_accum +
                       2.0 * (double)(host[LOOM_PURPOSE_PARAMS] + host[LOOM_PURPOSE_GRADS] +
                                      host[LOOM_PURPOSE_OPTIMIZER]);
}

/* On a backend of its own memory (model.device) every buffer above is in
 * the device tier — the model's, the strategies', the pipeline's messages —
 * with the positions the kernels read (a sequence's and each residual
 * row's), except the optimizer state memory.offload moves off the device.
 * The host then holds only that, and the copies of device buffers staged for
 * communicators that do not take device memory (core/runtime/group.c),
 * which depend on how many collectives each strategy keeps in flight and
 * are not predicted. */
static void place_on_device(const loom_plan_job *j, loom_plan_rank *out)
{
    uint64_t *host = out->peak[LOOM_TIER_HOST], *device = out->peak[LOOM_TIER_DEVICE];
    /* ZeRO-Offload: offloaded optimizer state stays where tiered() put it
     * (host memory, or nvme and its host staging), and offload-nvme's ring
     * stays in host memory with it */
    uint64_t kept[LOOM_PURPOSE_COUNT] = {0};
    if (j->offload[LOOM_PURPOSE_OPTIMIZER] != LOOM_OFFLOAD_NONE)
        kept[LOOM_PURPOSE_OPTIMIZER] = host[LOOM_PURPOSE_OPTIMIZER];
    for (int k = 0; k < LOOM_PURPOSE_COUNT; k++)
        if (j->offload[k] == LOOM_OFFLOAD_NVME)
            kept[LOOM_PURPOSE_OTHER] = (uint64_t)j->nvme_queue_depth * j->nvme_block_bytes + 4096;
    for (int k = 0; k < LOOM_PURPOSE_COUNT; k++) {
        device[k] += host[k] - kept[k];
        host[k] = kept[k];
    }
    int tp = j->sizes[LOOM_AXIS_TP], T = j->seq / j->sizes[LOOM_AXIS_SP];
    int rows = j->micro_batch * T / (j->sequence_parallel && tp > 1 ? tp : 1);
    device[LOOM_PURPOSE_OTHER] += (uint64_t)(T + rows) * sizeof(int);
    /* a sequence strategy's attention gets its query and key positions
     * there too: ring's blocks of T, Ulysses' whole sequence */
    if (j->sizes[LOOM_AXIS_SP] > 1)
        device[LOOM_PURPOSE_OTHER] +=
            2 * (uint64_t)(!strcmp(j->sp_strategy, "ring") ? T : j->seq) * sizeof(int);
}

static int plan_gpt2_rank(const loom_plan_job *j, const loom_schedule *schedule, int rank,
                          loom_plan_rank *out)
{
    int L = j->shape.layers, p = j->sizes[LOOM_AXIS_PP], v = j->virtual_stages;
    unsigned char *runs = calloc((size_t)L + 2, 1);
    int *positions = calloc((size_t)j->seq, sizeof *positions);
    stage_units su = {0, calloc((size_t)L + 2, sizeof(int)), calloc((size_t)L + 2, sizeof(size_t))};
    loom_model *m = NULL;
    double streamed = 0; /* one micro-batch's activations, as the kernels pass over them */
    int rc = runs && positions && su.unit && su.numel ? LOOM_OK
                                                      : loom_fail(LOOM_ERR_NO_MEMORY, "plan: out of memory");
    for (int vs = 0; rc == LOOM_OK && vs < v; vs++)
        for (int u = j->stage_first[vs * p + rank]; u <= j->stage_last[vs * p + rank]; u++)
            runs[u] = 1;
    for (int i = 0; positions && i < j->seq; i++)
        positions[i] = i;
    if (rc == LOOM_OK)
        rc = plan_gpt2_model(j, runs, positions, &m, &streamed);
    if (rc == LOOM_OK) {
        int count = 0;
        loom_unit *units = loom_model_units(m, &count);
        for (int u = 0; u < count; u++)
            if (p == 1 || runs[u]) {
                su.unit[su.n] = u;
                su.numel[su.n++] = units[u].numel;
            }
        out->units_first = su.unit[0];
        out->units_last = su.unit[su.n - 1];
        plan_gpt2_buffers(j, schedule, rank, m, runs, out);
        double blocks = 0;
        rc = plan_gpt2_axes(j, m, &su, runs, &blocks, out);
        plan_gpt2_work(j, blocks, runs[L + 1], streamed, out);
        if (j->device_resident)
            place_on_device(j, out);
    }
    loom_model_destroy(m);
    free(runs);
    free(positions);
    free(su.unit);
    free(su.numel);
    return rc;
}

/* ---- shapes loom plans but does not train (Llama): the published
 * accounting, per pipeline rank ---- */

/* Per-layer matrix parameters of a Llama block (q, o; k, v of the KV
 * heads; gate, up, down) and its two norms. */
static double llama_layer_params(const loom_plan_shape *sh, double *norms)
{
    double h = sh->channels, kv = h * sh->kv_heads / sh->heads;
    *norms = 2 * h;
    return 2 * h * h + 2 * h * kv + 3 * h * sh->ffn;
}

/* The transformer layers of the rank's stages, and whether it holds the
 * embedding (first) and the head (last). */
static void llama_stage_layers(const loom_plan_job *j, int rank, double *layers, int *first,
                               int *last)
{
    int p = j->sizes[LOOM_AXIS_PP], L = j->shape.layers;
    for (int vs = 0; vs < j->virtual_stages; vs++) {
        int st = vs * p + rank;
        for (int u = j->stage_first[st]; u <= j->stage_last[st]; u++) {
            *layers += u >= 1 && u <= L;
            *first |= u == 0;
            *last |= u == L + 1;
        }
    }
}

/* The traffic of the rank's psi parameters of e bytes each over `layers`
 * layers: the data strategy's as loom's shipped ones issue it, the tensor
 * axis's borders, the pipeline's hand-offs. */
static void llama_traffic(const loom_plan_job *j, int rank, double psi, double e, double layers,
                          loom_plan_rank *out)
{
    int p = j->sizes[LOOM_AXIS_PP], v = j->virtual_stages, tp = j->sizes[LOOM_AXIS_TP];
    int dp = j->sizes[LOOM_AXIS_DP], stage = dp_stage(j);
    int shard = j->shard_size > 0 ? j->shard_size : dp;
    uint64_t micro = (uint64_t)j->grad_accum, grads = (uint64_t)(e * psi);
    if (stage == 0) {
        add_comm(out, LOOM_AXIS_DP, LOOM_OP_ALLREDUCE, 1, grads);
    } else {
        add_comm(out, LOOM_AXIS_DP, LOOM_OP_REDUCESCATTER, stage == 1 ? 1 : micro, grads);
        add_comm(out, LOOM_AXIS_DP, LOOM_OP_ALLGATHER, stage == 3 ? 2 * micro : 1, grads);
        if (dp / shard > 1)
            add_comm(out, LOOM_AXIS_DP, LOOM_OP_ALLREDUCE, 1, grads / (uint64_t)shard);
    }
    /* tensor parallelism: per layer and micro-batch two regions, each an
     * all-reduce forward and one backward (recomputation: the forward's
     * again), or all-gather + reduce-scatter with sequence parallelism */
    uint64_t rows = (uint64_t)((double)j->seq * j->micro_batch * j->shape.channels * e);
    uint64_t borders = (uint64_t)layers * micro * (j->recompute ? 6 : 4);
    if (tp > 1 && j->sequence_parallel) {
        add_comm(out, LOOM_AXIS_TP, LOOM_OP_ALLGATHER, borders, rows);
        add_comm(out, LOOM_AXIS_TP, LOOM_OP_REDUCESCATTER, borders, rows);
    } else if (tp > 1) {
        add_comm(out, LOOM_AXIS_TP, LOOM_OP_ALLREDUCE, borders, rows);
    }
    /* the pipeline: each micro-batch's activation and gradient over each
     * border of the rank's stages */
    uint64_t border_rows = tp > 1 && j->sequence_parallel ? rows / (uint64_t)tp : rows;
    for (int vs = 0; p > 1 && vs < v; vs++) {
        int st = vs * p + rank;
        if (st > 0) {
            add_comm(out, LOOM_AXIS_PP, LOOM_OP_RECV, micro, border_rows);
            add_comm(out, LOOM_AXIS_PP, LOOM_OP_SEND, micro, border_rows);
        }
        if (st < p * v - 1) {
            add_comm(out, LOOM_AXIS_PP, LOOM_OP_SEND, micro, border_rows);
            add_comm(out, LOOM_AXIS_PP, LOOM_OP_RECV, micro, border_rows);
        }
    }
}

static int plan_llama_rank(const loom_plan_job *j, const int *stash, int rank, loom_plan_rank *out)
{
    const loom_plan_shape *sh = &j->shape;
    int p = j->sizes[LOOM_AXIS_PP], v = j->virtual_stages, tp = j->sizes[LOOM_AXIS_TP];
    int dp = j->sizes[LOOM_AXIS_DP];
    if (j->sizes[LOOM_AXIS_SP] > 1)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED, "plan: parallel.sp.size = %d with model.kind = "
                         "\"llama\": context parallelism is planned for GPT-2 only; set it to 1",
                         j->sizes[LOOM_AXIS_SP]);
    double layers = 0, norms = 0, per_layer = llama_layer_params(sh, &norms);
    int first = 0, last = 0;
    llama_stage_layers(j, rank, &layers, &first, &last);
    out->units_first = j->stage_first[rank];
    out->units_last = j->stage_last[(v - 1) * p + rank];
    double h = sh->channels, V = sh->padded_vocab;
    /* this tp rank's parameters: matrices split, norms replicated */
    double psi = layers * (per_layer / tp + norms) + (first ? V * h / tp : 0) +
                 (last ? V * h / tp + h : 0);
    double e = (double)loom_dtype_size(j->dtype), opt = j->dtype == LOOM_F32 ? 8 : 12;
    int stage = dp_stage(j);
    int shard = j->shard_size > 0 ? j->shard_size : dp;
    uint64_t *host = out->peak[LOOM_TIER_HOST];
    host[LOOM_PURPOSE_PARAMS] = (uint64_t)(e * psi / (stage == 3 ? shard : 1));
    host[LOOM_PURPOSE_GRADS] = (uint64_t)(e * psi / (stage >= 2 ? shard : 1));
    host[LOOM_PURPOSE_OPTIMIZER] = (uint64_t)(opt * psi / (stage >= 1 ? shard : 1));
    /* activations: Korthikanti's table for a Llama layer (FlashAttention:
     * no s×s term), per micro-batch alive; the last stage's fp32 logits */
    loom_plan_ref_layout lay = {(double)j->seq, (double)j->micro_batch, tp, j->sequence_parallel,
                                (loom_plan_ref_recompute)j->recompute, 1};
    double per_mb = layers * loom_plan_ref_llama_layer_bytes(sh, &lay);
    loom_plan_ref_layout all = lay;
    all.recompute = LOOM_PLAN_REF_RECOMPUTE_NONE;
    double streamed = layers * loom_plan_ref_llama_layer_bytes(sh, &all) * (j->recompute ? 4.0 / 3.0 : 1.0);
    out->live_microbatches = stash ? stash[rank] : 1;
    out->slot_bytes = (uint64_t)per_mb;
    out->activation_shared = last ? (uint64_t)(4.0 * j->seq * j->micro_batch * V / tp) : 0;
    host[LOOM_PURPOSE_ACTIVATIONS] = (uint64_t)(per_mb * out->live_microbatches) + out->activation_shared;
    llama_traffic(j, rank, psi, e, layers, out);
    uint64_t micro = (uint64_t)j->grad_accum;
    double tokens = (double)j->micro_batch * j->seq * micro;
    out->gemm_flops = tokens * (layers * 6 * (per_layer + h * j->seq) / tp * (j->recompute ? 4.0 / 3.0 : 1.0) +
                                (last ? 6 * V * h / tp : 0));
    out->other_bytes = 2.0 * streamed * micro + (double)(host[LOOM_PURPOSE_PARAMS] +
                       host[LOOM_PURPOSE_GRADS] + host[LOOM_PURPOSE_OPTIMIZER]);
    return LOOM_OK;
}

/* ---- the step time ---- */

/* Nodes a group of `size` ranks spans, `stride` ranks apart in the mesh
 * (tp innermost, then sp, pp, dp), ranks_per_node to a node. */
static int nodes_spanned(const loom_plan_cluster *c, int size, int stride)
{
    int per_node = c->ranks_per_node;
    if (c->nodes == 1 || per_node <= 0 || size * stride <= per_node)
        return 1;
    if (stride >= per_node)
        return size;
    return (size * stride + per_node - 1) / per_node;
}

/* Which of a step's collectives the compute hides. dp: the gradient
 * reductions run beside the backward (ddp's buckets, zero's
 * reduce-scatters) and zero3's gathers beside the previous unit's compute;
 * zero1/2's gather of the updated parameters, the loss and the norm wait.
 * tp, sp and pp sit on the critical path (Megatron's borders, Ulysses'
 * all-to-alls, the pipeline's hand-offs). */
static int overlapped(const loom_plan_job *j, int axis, int op)
{
    if (axis != LOOM_AXIS_DP)
        return 0;
    if (op == LOOM_OP_REDUCESCATTER)
        return 1;
    if (op == LOOM_OP_ALLGATHER)
        return !strcmp(j->dp_strategy, "zero3");
    return op == LOOM_OP_ALLREDUCE && !strcmp(j->dp_strategy, "ddp");
}

/* One rank's step: its compute (CPU ranks beyond a node's cores share
 * them), each collective's time on the cluster and what of it the compute
 * cannot hide. Returns the exposed seconds; adds the dp axis's to *dp_comm. */
static double time_rank(const loom_plan *p, const int *stride, int world, loom_plan_rank *pr,
                        double *dp_comm)
{
    const loom_plan_job *j = &p->job;
    const loom_plan_cluster *c = &p->cluster;
    /* one node of a cluster with nodes = 1 takes the whole job */
    double share = 1;
    if (!c->device && c->nodes == 1 && c->ranks_per_node > 0 && world > c->ranks_per_node)
        share = (double)world / c->ranks_per_node;
    pr->compute_s = share * loom_plan_compute_seconds(c, j->dtype, pr->gemm_flops, pr->other_bytes);
    double hidden = 0, exposed = 0;
    for (int a = 0; a < LOOM_AXIS_COUNT; a++)
        for (int op = 0; op < LOOM_OP_COUNT; op++) {
            loom_plan_comm *cm = &pr->comm[a][op];
            if (!cm->calls)
                continue;
            int across = nodes_spanned(c, j->sizes[a], stride[a]);
            /* a receive runs while the rank's own sends do (a ring's
             * passes, 1F1B's steady state): the pair takes the time
             * of one, counted on the send */
            cm->seconds = op == LOOM_OP_RECV ? 0
                          : loom_plan_comm_seconds(c, (loom_comm_op)op, cm->bytes, cm->calls,
                                                   j->sizes[a], across);
            if (overlapped(j, a, op))
                hidden += cm->seconds;
            else
                cm->exposed_s = cm->seconds;
            exposed += cm->exposed_s;
            if (a == LOOM_AXIS_DP)
                *dp_comm += cm->seconds;
        }
    /* what the backward (two thirds of the compute) cannot hide */
    double backward = pr->compute_s * 2.0 / 3.0, left = hidden > backward ? hidden - backward : 0;
    for (int a = 0; a < LOOM_AXIS_COUNT && hidden > 0; a++)
        for (int op = 0; op < LOOM_OP_COUNT; op++)
            if (pr->comm[a][op].calls && overlapped(j, a, op))
                pr->comm[a][op].exposed_s = pr->comm[a][op].seconds * left / hidden;
    return exposed + left;
}

/* Each rank's totals by tier, and the largest rank's host bytes (*biggest)
 * and activations among them. */
static void total_ranks(loom_plan *p, double *biggest, double *activations)
{
    for (int r = 0; r < p->nranks; r++) {
        double total = 0;
        for (int k = 0; k < LOOM_PURPOSE_COUNT; k++)
            total += (double)p->ranks[r].peak[LOOM_TIER_HOST][k];
        for (int t = 0; t < LOOM_TIER_COUNT; t++) {
            uint64_t sum = 0;
            for (int k = 0; k < LOOM_PURPOSE_COUNT; k++)
                sum += p->ranks[r].peak[t][k];
            p->ranks[r].total[t] = sum;
        }
        if (total > *biggest) {
            *biggest = total;
            *activations = (double)p->ranks[r].peak[LOOM_TIER_HOST][LOOM_PURPOSE_ACTIVATIONS];
        }
    }
}

/* What the plan's summary and warnings say of the step. */
typedef struct step_summary {
    double compute_s, exposed_s; /* the slowest rank's */
    double dp_comm_s;            /* every rank's dp collectives */
    double biggest, activations; /* the largest rank's host bytes, its activations' */
    double room;                 /* a rank's memory */
} step_summary;

static void warn(loom_plan *p, const char *format, ...) __attribute__((format(printf, 2, 3)));

static void warn(loom_plan *p, const char *format, ...)
{
    if (p->nwarnings >= LOOM_PLAN_WARNINGS_MAX)
        return;
    va_list args;
    va_start(args, format);
    vsnprintf(p->warnings[p->nwarnings++], sizeof p->warnings[0], format, args);
    va_end(args);
}

/* What a careful engineer would say. */
static void add_warnings(loom_plan *p, const step_summary *s)
{
    const loom_plan_job *j = &p->job;
    const loom_plan_cluster *c = &p->cluster;
    int tp = j->sizes[LOOM_AXIS_TP], pp = j->sizes[LOOM_AXIS_PP];
    if (nodes_spanned(c, tp, 1) > 1)
        warn(p, "tp = %d spans %d nodes of %d ranks: its all-reduces on every layer cross the "
             "slower inter-node links; keep tp within a node", tp,
             nodes_spanned(c, tp, 1), c->ranks_per_node);
    if (pp > 1 && j->microbatches < pp)
        warn(p, "pp = %d stages with %d micro-batches: the bubble takes %.0f%% of the step; use at "
             "least %d micro-batches", pp, j->microbatches, 100 * p->bubble, 4 * pp);
    if (pp == 1 && j->grad_accum > 1)
        warn(p, "the global batch of %d needs %d micro-batches of %d per dp rank (gradient "
             "accumulation): each step runs %d forward/backward passes in a row",
             j->batch, j->grad_accum, j->micro_batch, j->grad_accum);
    if (s->biggest > 0 && s->activations > 0.5 * s->biggest)
        warn(p, "activations are %.0f%% of the largest rank's memory: train.recompute = \"block\", "
             "sequence parallelism or a smaller micro-batch would free most of them",
             100 * s->activations / s->biggest);
    if (s->compute_s > 0 && s->dp_comm_s / p->nranks > s->compute_s)
        warn(p, "the dp group moves more per step than the step computes (%.3g ms of traffic, "
             "%.3g ms of compute): a larger micro-batch, gradient accumulation or fewer dp "
             "ranks would hide it", s->dp_comm_s / p->nranks * 1e3, s->compute_s * 1e3);
    if (!p->fits)
        warn(p, "the largest rank needs %.2f GiB, more than the %.2f GiB a rank has",
             s->biggest / 1073741824.0, s->room / 1073741824.0);
}

static void predict_time(loom_plan *p)
{
    const loom_plan_job *j = &p->job;
    const loom_plan_cluster *c = &p->cluster;
    int stride[LOOM_AXIS_COUNT], inner = 1, world = 1;
    for (int a = 0; a < LOOM_AXIS_COUNT; a++) {
        stride[a] = inner;
        inner *= j->sizes[a];
        world *= j->sizes[a];
    }
    step_summary s = {0};
    double slowest = 0;
    int timed = p->timed = c->flops[LOOM_F32] > 0; /* a cluster to time on (loom plan --cluster) */
    for (int r = 0; timed && r < p->nranks; r++) {
        loom_plan_rank *pr = &p->ranks[r];
        double exposed = time_rank(p, stride, world, pr, &s.dp_comm_s);
        pr->step_s = (pr->compute_s + exposed) / (1.0 - p->bubble);
        if (pr->step_s > slowest) {
            slowest = pr->step_s;
            s.exposed_s = exposed;
            s.compute_s = pr->compute_s;
        }
    }
    p->params = loom_plan_ref_params(&j->shape);
    p->flops_per_token = loom_plan_ref_flops_per_token(&j->shape, j->seq);
    p->step_s = slowest;
    p->tokens_per_s = slowest > 0 ? (double)j->batch * j->seq / slowest : 0;
    double peak = c->flops[j->dtype] > 0 ? c->flops[j->dtype] : c->flops[LOOM_F32];
    p->mfu = peak > 0 ? p->flops_per_token * p->tokens_per_s / (world * peak) : 0;
    /* fit: each rank's sum of peaks against its share of the memory */
    s.room = c->device ? c->device_bytes
                       : (c->ranks_per_node > 0 ? c->host_bytes / c->ranks_per_node : c->host_bytes);
    total_ranks(p, &s.biggest, &s.activations);
    p->fits = !timed || s.room <= 0 || s.biggest <= s.room;
    if (timed)
        snprintf(p->why, sizeof p->why,
                 "compute %.3g ms, exposed communication %.3g ms, bubble %.1f%%",
                 s.compute_s * 1e3, s.exposed_s * 1e3, 100 * p->bubble);
    add_warnings(p, &s);
}

int loom_plan_make(const loom_plan_job *job, const loom_plan_cluster *cluster,
                   const struct loom_schedule *schedule, loom_plan *out)
{
    memset(out, 0, sizeof *out);
    out->job = *job;
    out->job.stage_first = out->job.stage_last = NULL; /* borrowed, not owned */
    out->cluster = *cluster;
    out->nranks = job->sizes[LOOM_AXIS_PP];
    out->ranks = calloc((size_t)out->nranks, sizeof *out->ranks);
    if (!out->ranks)
        return loom_fail(LOOM_ERR_NO_MEMORY, "plan: out of memory");
    int rc = dp_stage(job) >= 0
                 ? LOOM_OK
                 : loom_fail(LOOM_ERR_NOT_SUPPORTED,
                             "plan: parallel.dp.strategy = \"%s\": loom plan knows ddp, zero1, "
                             "zero2, zero3 and diloco; a strategy of its own is not planned",
                             job->dp_strategy);
    loom_schedule_timeline tl;
    memset(&tl, 0, sizeof tl);
    if (rc == LOOM_OK && schedule) {
        double cost[LOOM_ACT_KIND_COUNT];
        loom_schedule_default_costs(cost);
        rc = loom_schedule_simulate(schedule, cost, &tl);
        out->bubble = tl.bubble;
    }
    for (int r = 0; rc == LOOM_OK && r < out->nranks; r++)
        rc = job->shape.kind == LOOM_PLAN_GPT2
                 ? plan_gpt2_rank(job, schedule, r, &out->ranks[r])
                 : plan_llama_rank(job, schedule ? tl.peak_stash : NULL, r, &out->ranks[r]);
    loom_schedule_timeline_free(schedule, &tl);
    if (rc == LOOM_OK)
        predict_time(out);
    if (rc != LOOM_OK)
        loom_plan_free(out);
    return rc;
}

void loom_plan_free(loom_plan *p)
{
    free(p->ranks);
    p->ranks = NULL;
}
