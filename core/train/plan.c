/* loom train — `loom plan`'s model of a step: per pipeline rank, the bytes
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
#include <stdlib.h>
#include <string.h>

#include "loom/status.h"
#include "model/model.h"
#include "runtime/log.h"
#include "train/plan.h"
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

static void add_comm(loom_plan_rank *r, loom_axis axis, loom_comm_op op, uint64_t calls,
                     uint64_t bytes_each)
{
    r->comm[axis][op].calls += calls;
    r->comm[axis][op].bytes += calls * bytes_each;
}

static int plan_data_strategy(const loom_plan_job *j, const stage_units *su, int tied,
                              loom_plan_rank *r)
{
    const char *name = j->dp_strategy;
    uint64_t e = loom_dtype_size(j->dtype);
    uint64_t opt = j->dtype == LOOM_F32 ? 8 : 12; /* Adam m, v (+ fp32 master weights) */
    uint64_t *host = r->peak[LOOM_TIER_HOST];
    int n = su->n;
    if (!strcmp(name, "ddp")) {
        uint64_t numel = 0;
        for (int i = 0; i < n; i++)
            numel += su->numel[i];
        host[LOOM_PURPOSE_PARAMS] += numel * e;
        host[LOOM_PURPOSE_GRADS] += numel * e;
        host[LOOM_PURPOSE_OPTIMIZER] += numel * opt;
        /* buckets of consecutive units in backward order, each closing at
         * bucket_mb, all-reduced once per step (the last micro-batch) */
        uint64_t bucket = 0;
        for (int i = n - 1; i >= 0; i--) {
            bucket += su->numel[i];
            if ((double)(bucket * e) >= j->bucket_mb * 1024.0 * 1024.0 || i == 0) {
                add_comm(r, LOOM_AXIS_DP, LOOM_OP_ALLREDUCE, 1, bucket * e);
                bucket = 0;
            }
        }
        return LOOM_OK;
    }
    int stage = !strcmp(name, "zero1") ? 1 : !strcmp(name, "zero2") ? 2 : !strcmp(name, "zero3") ? 3 : 0;
    if (!stage)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED,
                         "plan: parallel.dp.strategy = \"%s\": loom plan knows ddp, zero1, zero2 "
                         "and zero3; a strategy of its own is not planned", name);
    int shard_ranks = j->shard_size > 0 ? j->shard_size : j->sizes[LOOM_AXIS_DP];
    uint64_t *padded = calloc((size_t)n, sizeof *padded);
    if (!padded)
        return loom_fail(LOOM_ERR_NO_MEMORY, "plan: out of memory");
    uint64_t full = 0, owned = 0, biggest_shard = 0;
    for (int i = 0; i < n; i++) {
        padded[i] = round_up(su->numel[i], (uint64_t)ZERO_ALIGN * shard_ranks);
        full += padded[i];
        owned += padded[i] / shard_ranks;
        biggest_shard = max64(biggest_shard, padded[i] / shard_ranks);
    }
    for (int i = 0; i < n; i++)
        padded[i] *= e;
    host[LOOM_PURPOSE_OPTIMIZER] += owned * opt;
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
        host[LOOM_PURPOSE_PARAMS] += stage == 3 ? owned * e : full * e;
        host[LOOM_PURPOSE_GRADS] += owned * e + zero_grads_in_flight(padded, n, tied);
        host[LOOM_PURPOSE_COMM] += biggest_shard * e;
        if (stage == 3)
            host[LOOM_PURPOSE_PARAMS] += zero_params_in_flight(padded, n, tied, j->prefetch);
    }
    free(padded);
    return LOOM_OK;
}

/* ---- one pipeline rank ---- */

static int plan_gpt2_rank(const loom_plan_job *j, const struct loom_schedule *schedule, int rank,
                          loom_plan_rank *out)
{
    (void)schedule;
    int L = j->shape.layers, p = j->sizes[LOOM_AXIS_PP], v = j->virtual_stages;
    int tp = j->sizes[LOOM_AXIS_TP], sp = j->sizes[LOOM_AXIS_SP];
    unsigned char *runs = calloc((size_t)L + 2, 1);
    int *positions = calloc((size_t)j->seq, sizeof *positions);
    stage_units su = {0, calloc((size_t)L + 2, sizeof(int)), calloc((size_t)L + 2, sizeof(size_t))};
    loom_model *m = NULL;
    int rc = runs && positions && su.unit && su.numel ? LOOM_OK
                                                      : loom_fail(LOOM_ERR_NO_MEMORY, "plan: out of memory");
    for (int vs = 0; rc == LOOM_OK && vs < v; vs++)
        for (int u = j->stage_first[vs * p + rank]; u <= j->stage_last[vs * p + rank]; u++)
            runs[u] = 1;
    for (int i = 0; positions && i < j->seq; i++)
        positions[i] = i;
    if (rc == LOOM_OK) {
        loom_model_setup setup = {.shape = {.max_seq = j->shape.max_seq,
                                            .vocab = j->shape.vocab,
                                            .layers = L,
                                            .heads = j->shape.heads,
                                            .channels = j->shape.channels,
                                            .padded_vocab = j->shape.padded_vocab},
                                  .batch = j->micro_batch,
                                  .seq = j->seq,
                                  .dtype = j->dtype,
                                  .recompute = j->recompute};
        loom_model_layout lay;
        memset(&lay, 0, sizeof lay);
        lay.tp_size = tp;
        lay.sequence_parallel = j->sequence_parallel;
        lay.sp_size = sp;
        lay.positions = sp > 1 ? positions : NULL;
        lay.npositions = sp > 1 ? j->seq / sp : j->seq;
        lay.runs_unit = p > 1 ? runs : NULL;
        rc = loom_model_plan(&setup, &lay, &m);
    }
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
        uint64_t *host = out->peak[LOOM_TIER_HOST];
        out->activation_shared = loom_model_planned_bytes(m, LOOM_PURPOSE_ACTIVATIONS);
        host[LOOM_PURPOSE_OTHER] += loom_model_planned_bytes(m, LOOM_PURPOSE_OTHER);
        out->slot_bytes = loom_model_slot_bytes_of(m, NULL);
        out->live_microbatches = 1;
        host[LOOM_PURPOSE_ACTIVATIONS] += out->activation_shared + out->slot_bytes;
        add_comm(out, LOOM_AXIS_DP, LOOM_OP_ALLREDUCE, 1, 4); /* the step's loss */
        int tied = su.unit[0] == 0 && su.unit[su.n - 1] == L + 1;
        rc = plan_data_strategy(j, &su, tied, out);
    }
    loom_model_destroy(m);
    free(runs);
    free(positions);
    free(su.unit);
    free(su.numel);
    return rc;
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
    int rc = LOOM_OK;
    for (int r = 0; rc == LOOM_OK && r < out->nranks; r++)
        rc = plan_gpt2_rank(job, schedule, r, &out->ranks[r]);
    if (rc != LOOM_OK)
        loom_plan_free(out);
    return rc;
}

void loom_plan_free(loom_plan *p)
{
    free(p->ranks);
    p->ranks = NULL;
}
