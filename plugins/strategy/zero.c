/* zero1, zero2, zero3 — the ZeRO stages of Rajbhandari et al. ("ZeRO: Memory
 * Optimizations Toward Training Trillion Parameter Models", SC 2020) as
 * DeepSpeed and PyTorch FSDP run them. One source built three times, with
 * ZERO_STAGE = 1, 2 or 3.
 *
 * Flat shards. A unit's parameters are one flat buffer, padded with zeros to
 * a multiple of ALIGN x S elements so it splits evenly over the S ranks of
 * a shard group: shard rank r owns shard r, elements [r * shard, (r + 1) *
 * shard). fp32 master weights (for 16-bit runs) and Adam's m and v exist
 * only for the owned shard; fp32 parameters are their own master weights.
 * The shard group is the whole dp group (S = N), except under zero3's
 * hybrid sharding (HSDP, FSDP's HYBRID_SHARD): parallel.dp.shard_size = S
 * < N splits the dp group into N/S shard groups of S consecutive dp ranks,
 * each holding the whole model state sharded, and S replica groups (the
 * ranks of equal shard rank, one per shard group). Gathers and
 * reduce-scatters stay inside the shard group; each reduce-scattered
 * gradient shard is then all-reduced (averaged) over the replica group.
 *
 *  zero1  every rank keeps the full parameters and gradients. On the last
 *         micro-batch each unit's gradients are reduce-scattered (averaged)
 *         as soon as backward reports them; the owned shard is stepped and
 *         the parameters all-gathered in place.
 *  zero2  full parameters. A unit's full gradient buffer exists from its
 *         before_backward until its reduce-scatter completes, on every
 *         micro-batch; the owned gradient shard accumulates the results.
 *         One reduce-scatter is in flight at a time, overlapping the next
 *         unit's backward.
 *  zero3  only the owned parameter shard persists. A unit is all-gathered
 *         before its forward and freed after it, all-gathered again before
 *         its backward and freed when its gradients are handed on, which go
 *         as in zero2. The all-gathers of the next `prefetch` units are
 *         posted ahead, in forward order and in backward order. The
 *         embedding is tied to the LM head: once gathered for the head's
 *         forward it stays until its own gradients are reduce-scattered,
 *         since the head's backward needs it and its gradient stays open
 *         until the embedding's own backward anyway. So each unit is
 *         gathered exactly twice per micro-batch.
 *
 * Model-state bytes per rank (accounted PARAMS + GRADS + OPTIMIZER), Ψ the
 * padded parameter count, N the dp size (the shard size S under HSDP), e
 * the compute dtype's size, w = 4 for 16-bit runs (fp32 master weights) and
 * 0 for fp32 (none):
 *   zero1   2eΨ + (w + 8)Ψ/N          bf16 4Ψ + 12Ψ/N   fp32 8Ψ + 8Ψ/N
 *   zero2    eΨ + (e + w + 8)Ψ/N      bf16 2Ψ + 14Ψ/N   fp32 4Ψ + 12Ψ/N
 *   zero3   (2e + w + 8)Ψ/N           bf16 16Ψ/N        fp32 16Ψ/N
 * plus, while in flight, zero2's and zero3's full gradients (the unit in
 * backward, the one being reduce-scattered and the open embedding) and
 * zero3's gathered units. Each rank's reduce-scatter result lands in a COMM
 * buffer: zero1's reduced shard (eΨ/N), zero2's and zero3's one unit shard.
 *
 * Trace: every collective is a span on the comm lane from its post to its
 * completion ("zero3 allgather block 3"); the time a hook sits waiting for
 * one is a span on the compute lane ("zero3 wait allgather block 3"),
 * nested in the unit's own: the communication that prefetch and overlap did
 * not hide.
 *
 * Communication per step (one micro-batch) per rank, in elements of the
 * compute dtype as the ring algorithms move them: reduce-scatter and
 * all-gather each (N-1)/N Ψ, so 2Ψ(N-1)/N for zero1 and zero2 and
 * 3Ψ(N-1)/N for zero3. With k micro-batches zero2 reduce-scatters k times
 * and zero3 gathers 2k times. HSDP (R = N/S replicas): 3Ψ(S-1)/S in the
 * shard group plus the replica all-reduce of each shard, 2(Ψ/S)(R-1)/R,
 * per micro-batch. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/opt_state.h"
#include "common/reduce.h"
#include "common/strategy_common.h"
#include "loom/strategy.h"

#ifndef ZERO_STAGE
#error "build with -DZERO_STAGE=1, 2 or 3"
#endif
_Static_assert(ZERO_STAGE >= 1 && ZERO_STAGE <= 3, "ZERO_STAGE must be 1, 2 or 3");

/* The build's one input. Every stage's code is compiled, and so checked, in
 * every build; the branches of the other stages fold away. */
static const int zero_stage = ZERO_STAGE;

#define STR_(x) #x
#define STR(x) STR_(x)
#define NAME "zero" STR(ZERO_STAGE)

/* Shard boundaries fall on multiples of this many elements, so every shard
 * starts 64-byte aligned in 16-bit runs (128 in fp32). */
#define ALIGN 32

static const loom_setting_spec zero3_settings[] = {
    {.name = "prefetch", .type = LOOM_SETTING_INT, .default_value = "1",
     .help = "units whose all-gather is posted ahead of use, in forward and in backward order "
     "(0: gather each unit when it is needed)"},
    {.name = "shard_size", .type = LOOM_SETTING_INT, .default_value = "0",
     .help = "ranks each unit is sharded over, a divisor of parallel.dp.size; smaller: "
     "dp.size / shard_size replicas of the shards (hybrid sharding, HSDP); 0: the whole dp group",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {0},
};

#define ZERO1_DESCRIPTION                                                                      \
    "ZeRO-1: optimizer state sharded; gradients reduce-scattered, parameters all-gathered "   \
    "after the step"
#define ZERO2_DESCRIPTION                                                                      \
    "ZeRO-2: gradients and optimizer state sharded; gradients reduce-scattered unit by unit " \
    "during backward"
#define ZERO3_DESCRIPTION                                                                      \
    "ZeRO-3 / FSDP: parameters, gradients and optimizer state sharded; units all-gathered "   \
    "around forward and backward with prefetch"

/* One collective in flight. */
typedef struct zero_op {
    loom_request *req; /* while active */
    int active;        /* posted and not yet seen complete */
    const char *what;  /* "allgather", "reducescatter", "allreduce" */
    uint64_t start_ns, bytes;
} zero_op;

/* A unit as this strategy keeps it. */
typedef struct zero_unit {
    loom_unit *unit;
    size_t numel;     /* the model's elements */
    size_t padded;    /* numel rounded up to ALIGN x shard_size */
    size_t shard;     /* padded / shard_size */
    size_t own_begin; /* shard_rank * shard */
    size_t own_count; /* elements of the owned shard that are not padding */
    size_t shard_off; /* into the per-rank shard buffers */
    size_t flat_off;  /* zero1/2: into the full parameter (and zero1 gradient) buffers */

    void *params;     /* full, compute dtype: zero1/2 always; zero3 while gathered */
    void *grads;      /* full, compute dtype: zero1 always; zero2/3 open or being reduced */
    int reduced;      /* zero1: reduce-scatter posted this step */
    int reducing;     /* zero2/3: reduce-scatter posted, result not yet accumulated */
    int averaging;    /* HSDP: the reduce op is now the replica all-reduce */
    zero_op gather;   /* zero3 gather, zero1/2 post-step all-gather */
    zero_op reduce;   /* reduce-scatter of grads, then HSDP's replica all-reduce */

    /* zero3 lifetime of the gathered parameters */
    int fwd_refs;    /* before_forward calls not yet closed by after_forward */
    int fwd_entries; /* before_forward calls this micro-batch (a second one: tied reuse) */
    int bwd_entries; /* before_backward calls this micro-batch */
    int bwd_open;    /* from before_backward until grads_ready */
    int held;        /* tied reuse: kept until grads_ready */
    int shard_lent;  /* zero3: the owned parameter shard is acquired for the gather in flight */
    int grad_clear;  /* zero2/3: the owned gradient shard counts as zeros (not yet accumulated) */
} zero_unit;

/* zero3 prefetch: the trainer's hook steps, each a unit and maybe the tied
 * embedding the head brings along. */
typedef struct zero_step {
    int unit, tied; /* tied: -1 or a second unit */
} zero_step;

struct loom_strategy {
    const loom_host *host;
    loom_strategy_setup setup;
    int dp_size, dp_rank;
    /* The ranks the units are sharded over: the dp group, or under HSDP a
     * split of it (the core owns splits); replica: HSDP's group of the
     * ranks with my shard, else NULL. */
    loom_group *shard_group, *replica;
    int shard_size, shard_rank;
    int prefetch;

    loom_unit *units;
    int nunits;
    zero_unit *zu;
    zero_step *fsteps, *bsteps; /* nunits each */

    loom_dtype dtype;
    size_t esize;
    size_t numel;       /* Ψ the model's */
    size_t padded;      /* Ψ padded */
    size_t shard_total; /* padded / shard_size */
    size_t max_shard;

    void *params_all;  /* zero1/2: every unit's full parameters (PARAMS) */
    void *grads_all;   /* zero1: every unit's full gradients (GRADS) */
    void *reduced;     /* zero1: the reduced gradient shards (COMM) */
    /* Where memory.offload puts them, one segment per unit (ZeRO-Infinity):
     * zero3's owned parameter shards (PARAMS; fp32: the master weights) and
     * zero2/3's accumulated gradient shards (GRADS). */
    state_buffer param_shards, grad_shards;
    /* Master shards (16-bit runs) and Adam's moments of the owned shards
     * (OPTIMIZER), where memory.offload puts them (ZeRO-Offload). */
    opt_state opt;
    void *recv;        /* zero2/3: the in-flight reduce-scatter's result (COMM) */
    int reducing_unit; /* zero2/3: the unit whose reduce-scatter owns recv, or -1 */

    int saw_micro, saw_last_micro;
    int evaluating; /* zero3: between data_eval(1) and data_eval(0): forward only */
    int failed; /* a collective failed: in-flight requests are no longer waited for */
};

/* ------------------------------------------------------------ helpers */

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static const char *unit_label(const loom_unit *u, char *buf, size_t cap)
{
    if (u->kind == LOOM_UNIT_BLOCK)
        snprintf(buf, cap, "block %d", u->index - 1);
    else
        snprintf(buf, cap, "%s", u->name ? u->name : "unit");
    return buf;
}

static char *at(void *base, size_t elems, size_t esize) { return (char *)base + elems * esize; }

static int unit_index(const loom_strategy *s, const zero_unit *z) { return (int)(z - s->zu); }

/* The owned shard of the parameters in the compute dtype, until
 * put_params_shard: zero3's (fetched from its tier; mode: a LOOM_TIERED_*
 * of loom/plugin.h), or zero1/2's range of the full parameters. */
static int get_params_shard(loom_strategy *s, zero_unit *z, unsigned mode, void **out)
{
    if (zero_stage < 3) {
        *out = at(z->params, z->own_begin, s->esize);
        return LOOM_OK;
    }
    int rc = state_buffer_acquire(&s->param_shards, unit_index(s, z), mode, out);
    if (rc == LOOM_OK && mode == LOOM_TIERED_OVERWRITE) /* the padding stays zeros */
        rc = strategy_compute(s->host)->zero(s->host, at(*out, z->own_count, s->esize),
                                             (z->shard - z->own_count) * s->esize);
    return rc;
}

static int put_params_shard(loom_strategy *s, zero_unit *z, int dirty)
{
    if (zero_stage < 3)
        return LOOM_OK;
    return state_buffer_release(&s->param_shards, unit_index(s, z), dirty);
}

/* The owned shard's averaged gradient, until put_grad_shard: zero1's
 * reduce-scatter result, or zero2/3's accumulated shard (zeros when it
 * counts as clear). */
static int get_grad_shard(loom_strategy *s, zero_unit *z, void **out)
{
    if (zero_stage == 1) {
        *out = at(s->reduced, z->shard_off, s->esize);
        return LOOM_OK;
    }
    unsigned mode = z->grad_clear ? LOOM_TIERED_OVERWRITE : LOOM_TIERED_READ;
    int rc = state_buffer_acquire(&s->grad_shards, unit_index(s, z), mode, out);
    if (rc == LOOM_OK && z->grad_clear)
        rc = strategy_compute(s->host)->zero(s->host, *out, z->shard * s->esize);
    return rc;
}

static int put_grad_shard(loom_strategy *s, zero_unit *z, int dirty)
{
    if (zero_stage == 1)
        return LOOM_OK;
    if (dirty)
        z->grad_clear = 0;
    return state_buffer_release(&s->grad_shards, unit_index(s, z), dirty);
}

/* A unit's optimizer state and master weights until put_unit_state: the
 * state's master shard in 16-bit runs, else the fp32 parameter shard
 * itself. params_mode: how the parameter shard is needed
 * (LOOM_TIERED_OVERWRITE when only written). */
static int get_unit_state(loom_strategy *s, zero_unit *z, unsigned params_mode, opt_view *st,
                          void **params, float **master)
{
    int rc = opt_state_acquire(&s->opt, unit_index(s, z), st);
    if (rc != LOOM_OK)
        return rc;
    if (!st->master)
        params_mode = LOOM_TIERED_READ; /* the master weights are in it */
    if ((rc = get_params_shard(s, z, params_mode, params)) != LOOM_OK) {
        opt_state_release(&s->opt, unit_index(s, z), 0);
        return rc;
    }
    *master = st->master ? st->master : (float *)*params;
    return LOOM_OK;
}

static int put_unit_state(loom_strategy *s, zero_unit *z, int dirty)
{
    int rc = put_params_shard(s, z, dirty);
    int r2 = opt_state_release(&s->opt, unit_index(s, z), dirty);
    return rc != LOOM_OK ? rc : r2;
}

static void free_if(const loom_host *h, void *p)
{
    if (p)
        h->mem_free(h, p);
}

/* ------------------------------------------------------ collectives */

static void op_done(loom_strategy *s, zero_unit *z, zero_op *op, const char *what)
{
    op->active = 0;
    op->req = NULL;
    char label[48], name[80];
    snprintf(name, sizeof name, NAME " %s %s", what, unit_label(z->unit, label, sizeof label));
    s->host->trace(s->host, LOOM_LANE_COMM, name, op->start_ns, s->host->now_ns(), op->bytes);
}

/* After a failed collective the dp group is broken and the shards are not
 * what the step needs: no hook may go on. */
static int broken(loom_strategy *s)
{
    return s->host->error(s->host, LOOM_ERR_REMOTE,
                          NAME ": an earlier collective on the dp group failed; "
                               "the run cannot continue");
}

static int op_failed(loom_strategy *s, int rc)
{
    s->failed = 1;
    return rc; /* the comm layer's detail names the op, its sequence number and who is missing */
}

static int post_average(loom_strategy *s, zero_unit *z);

/* MPI moves data only inside its calls: test what is in flight. Completion
 * is noted (and traced) here, but buffers change hands only at the fixed
 * points below, so memory use is the same on every run. Under HSDP a
 * finished reduce-scatter's replica all-reduce is posted at once. */
static int progress(loom_strategy *s)
{
    if (s->failed)
        return broken(s);
    for (int i = 0; i < s->nunits; i++) {
        zero_unit *z = &s->zu[i];
        zero_op *ops[2] = {&z->gather, &z->reduce};
        for (int k = 0; k < 2; k++) {
            if (!ops[k]->active)
                continue;
            int rc = s->host->comm->test(ops[k]->req);
            if (rc == LOOM_IN_PROGRESS)
                continue;
            op_done(s, z, ops[k], ops[k]->what);
            if (rc != LOOM_OK)
                return op_failed(s, rc);
            if (k == 1 && s->replica && !z->averaging && (rc = post_average(s, z)) != LOOM_OK)
                return rc;
        }
    }
    return LOOM_OK;
}

/* Wait for one op. After a failure the rest is left alone: each wait could
 * take the whole timeout again, and would replace the first failure's
 * detail with a vaguer one. */
static int wait_op(loom_strategy *s, zero_unit *z, zero_op *op, const char *what)
{
    if (s->failed)
        return broken(s);
    if (!op->active)
        return LOOM_OK;
    int rc = s->host->comm->test(op->req);
    if (rc == LOOM_IN_PROGRESS) {
        /* Exposed communication: the compute lane shows how long this rank
         * sat waiting, inside the unit's span. */
        uint64_t t0 = s->host->now_ns();
        rc = s->host->comm->wait(op->req);
        char label[48], name[80];
        snprintf(name, sizeof name, NAME " wait %s %s", what, unit_label(z->unit, label, sizeof label));
        s->host->trace(s->host, LOOM_LANE_COMPUTE, name, t0, s->host->now_ns(), 0);
    }
    op_done(s, z, op, what); /* released either way */
    return rc == LOOM_OK ? LOOM_OK : op_failed(s, rc);
}

/* Wait for z's all-gather and give back the parameter shard it read:
 * here, at a fixed point, not when the gather happens to finish, so the
 * staging bytes are the same on every run. Released clean, it cannot fail. */
static int wait_gather(loom_strategy *s, zero_unit *z)
{
    int rc = wait_op(s, z, &z->gather, "allgather");
    if (z->shard_lent && !z->gather.active) {
        z->shard_lent = 0;
        put_params_shard(s, z, 0);
    }
    return rc;
}

/* A collective of `elems` elements was just posted (rc and req as the comm
 * layer returned them): track it until a test or a wait completes it, even
 * one complete at issue (its request is released by that test or wait). */
static int track(loom_strategy *s, zero_op *op, const char *what, size_t elems, int rc,
                 loom_request *req)
{
    if (rc != LOOM_OK)
        return op_failed(s, rc);
    op->req = req;
    op->active = 1;
    op->what = what;
    op->bytes = (uint64_t)(elems * s->esize);
    return LOOM_OK;
}

static int post_reduce(loom_strategy *s, zero_unit *z, void *recv)
{
    z->reduce.start_ns = s->host->now_ns();
    loom_request *req = NULL;
    loom_redop average = LOOM_AVG;
    int rc = strategy_average_begin(s->host, z->grads, z->padded, s->dtype, s->shard_size,
                                     &average);
    if (rc != LOOM_OK)
        return rc; /* nothing posted */
    rc = s->host->comm->reducescatter(s->shard_group, z->grads, recv, z->shard, s->dtype,
                                          average, &req);
    return track(s, &z->reduce, "reducescatter", z->padded, rc, req);
}

/* send: the owned shard (zero1/2: in place inside recv). */
static int post_gather(loom_strategy *s, zero_unit *z, const void *send, void *recv)
{
    z->gather.start_ns = s->host->now_ns();
    loom_request *req = NULL;
    int rc = s->host->comm->allgather(s->shard_group, send, recv, z->shard, s->dtype, &req);
    return track(s, &z->gather, "allgather", z->padded, rc, req);
}

/* HSDP: the shard group's average of a gradient shard (in recv), averaged
 * again over the replicas, in place, is the average over the dp group. */
static int post_average(loom_strategy *s, zero_unit *z)
{
    z->averaging = 1;
    z->reduce.start_ns = s->host->now_ns();
    loom_request *req = NULL;
    loom_redop average = LOOM_AVG;
    int rc = strategy_average_begin(s->host, s->recv, z->shard, s->dtype,
                                     s->host->comm->size(s->replica), &average);
    if (rc != LOOM_OK)
        return rc; /* nothing posted */
    rc = s->host->comm->allreduce(s->replica, s->recv, s->recv, z->shard, s->dtype, average,
                                      &req);
    return track(s, &z->reduce, "allreduce", z->shard, rc, req);
}

/* ---------------------------------------------- zero2/3 gradient shards */

/* A reduced gradient shard (in the compute dtype) becomes the average over
 * the dp group: after the reduce-scatter, and the replicas' all-reduce under
 * HSDP, each begun by average_begin. */
static int average_shard_end(loom_strategy *s, void *shard, size_t n)
{
    int replicas = s->replica ? s->host->comm->size(s->replica) : 1;
    return strategy_average_end(
        s->host, shard, n, s->dtype,
        average_prescale(s->dtype, s->shard_size) * average_prescale(s->dtype, replicas),
        s->shard_size * replicas);
}

/* The one reduce-scatter in flight completes: its result joins the owned
 * shard and the unit's full gradients are freed. */
static int finish_reduce(loom_strategy *s)
{
    if (s->reducing_unit < 0)
        return LOOM_OK;
    zero_unit *z = &s->zu[s->reducing_unit];
    int rc = wait_op(s, z, &z->reduce, z->averaging ? "allreduce" : "reducescatter");
    if (rc == LOOM_OK && s->replica && !z->averaging && (rc = post_average(s, z)) == LOOM_OK)
        rc = wait_op(s, z, &z->reduce, "allreduce");
    if (rc != LOOM_OK)
        return rc;
    z->averaging = 0;
    if ((rc = average_shard_end(s, s->recv, z->shard)) != LOOM_OK)
        return rc;
    void *owned = NULL;
    if ((rc = get_grad_shard(s, z, &owned)) != LOOM_OK)
        return rc;
    /* recv is spent: the next reduce-scatter writes it afresh */
    rc = strategy_add_spent(s->host, owned, s->recv, z->shard, s->dtype);
    int r2 = put_grad_shard(s, z, 1); /* written behind when offloaded */
    if ((rc = rc != LOOM_OK ? rc : r2) != LOOM_OK)
        return rc;
    s->host->mem_free(s->host, z->grads);
    z->grads = NULL;
    z->reducing = 0;
    s->reducing_unit = -1;
    return LOOM_OK;
}

/* A zeroed full gradient buffer for this micro-batch's backward. */
static int open_grads(loom_strategy *s, zero_unit *z)
{
    if (z->grads && !z->reducing)
        return LOOM_OK; /* already open: the tied embedding */
    int rc;
    if (z->reducing && (rc = finish_reduce(s)) != LOOM_OK)
        return rc;
    if ((rc = strategy_alloc_model(s->host, LOOM_PURPOSE_GRADS, z->padded * s->esize,
                                   &z->grads)) != LOOM_OK)
        return rc;
    z->unit->grads = z->grads;
    return LOOM_OK;
}

/* ------------------------------------------------ zero3 parameter life */

static int start_gather(loom_strategy *s, zero_unit *z)
{
    if (z->params)
        return LOOM_OK; /* gathered or on its way */
    void *full = NULL; /* all of it gathered: nothing to clear */
    int rc = s->host->mem_alloc(s->host, (loom_tier)strategy_compute(s->host)->tier,
                                LOOM_PURPOSE_PARAMS, z->padded * s->esize, &full);
    if (rc != LOOM_OK)
        return rc;
    z->params = full;
    void *shard = NULL;
    /* lent to the gather until it completes (op_done) */
    if ((rc = get_params_shard(s, z, LOOM_TIERED_READ, &shard)) == LOOM_OK) {
        z->shard_lent = 1;
        rc = post_gather(s, z, shard, full);
    }
    if (rc != LOOM_OK) {
        if (z->shard_lent) {
            z->shard_lent = 0;
            put_params_shard(s, z, 0);
        }
        s->host->mem_free(s->host, full); /* never posted */
        z->params = NULL;
    }
    return rc;
}

static int ensure_params(loom_strategy *s, zero_unit *z)
{
    int rc = start_gather(s, z);
    if (rc == LOOM_OK)
        rc = wait_gather(s, z);
    if (rc == LOOM_OK)
        z->unit->params = z->params;
    return rc;
}

static int drop_params(loom_strategy *s, zero_unit *z)
{
    if (!z->params)
        return LOOM_OK;
    int rc = wait_gather(s, z); /* never free under the backend */
    if (rc != LOOM_OK)
        return rc;
    s->host->mem_free(s->host, z->params);
    z->params = NULL;
    z->unit->params = NULL;
    return LOOM_OK;
}

static int maybe_drop(loom_strategy *s, zero_unit *z)
{
    if (z->fwd_refs > 0 || z->bwd_open || z->held)
        return LOOM_OK;
    return drop_params(s, z);
}

/* The k-th (0-based) step of the list that holds unit u, or -1. */
static int find_step(const zero_step *steps, int n, int u, int k)
{
    for (int i = 0; i < n; i++)
        if ((steps[i].unit == u || steps[i].tied == u) && k-- == 0)
            return i;
    return -1;
}

/* Post the all-gathers of the `prefetch` steps after step i, and start
 * reading the owned shards of the one after those from their tier (a no-op
 * in host memory), so each read overlaps a unit's compute before its
 * gather needs it. */
static int prefetch_after(loom_strategy *s, const zero_step *steps, int i)
{
    if (i < 0)
        return LOOM_OK;
    for (int j = i + 1; j <= i + s->prefetch + 1 && j < s->nunits; j++) {
        int us[2] = {steps[j].unit, steps[j].tied};
        for (int k = 0; k < 2; k++) {
            if (us[k] < 0 || s->zu[us[k]].params)
                continue; /* gathered, or on its way */
            int rc = j <= i + s->prefetch
                         ? start_gather(s, &s->zu[us[k]])
                         : state_buffer_fetch(&s->param_shards, us[k]);
            if (rc != LOOM_OK)
                return rc;
        }
    }
    return LOOM_OK;
}

/* Between steps every gathered copy is stale (or a prefetch nobody used). */
static int drop_all_params(loom_strategy *s)
{
    for (int i = 0; i < s->nunits; i++) {
        zero_unit *z = &s->zu[i];
        z->fwd_refs = z->fwd_entries = z->bwd_entries = z->bwd_open = z->held = 0;
        int rc = drop_params(s, z);
        if (rc != LOOM_OK)
            return rc;
    }
    return LOOM_OK;
}

/* ------------------------------------------------------------- common */

static int zero_create(const loom_host *host, const loom_strategy_setup *setup, loom_strategy **out)
{
    loom_group *dp = NULL;
    int rc = strategy_axis_group(host, setup, NAME, LOOM_AXIS_DP, &dp);
    if (rc != LOOM_OK)
        return rc;
    int dp_size = host->comm->size(dp), dp_rank = host->comm->rank(dp);
    int64_t prefetch = 0, shard_size = 0;
    if (zero_stage == 3) {
        if ((rc = host->config_int(host, "prefetch", &prefetch)) != LOOM_OK ||
            (rc = host->config_int(host, "shard_size", &shard_size)) != LOOM_OK)
            return rc;
        if (prefetch < 0 || prefetch > 64)
            return host->error(host, LOOM_ERR_INVALID,
                               NAME ": parallel.dp.prefetch = %lld must be between 0 (no "
                                    "prefetch) and 64 units",
                               (long long)prefetch);
        if (shard_size < 0 || (shard_size > 0 && dp_size % shard_size != 0))
            return host->error(host, LOOM_ERR_INVALID,
                               NAME ": parallel.dp.shard_size = %lld does not divide "
                                    "parallel.dp.size = %d; set a divisor of %d (0: shard over "
                                    "the whole dp group)",
                               (long long)shard_size, dp_size, dp_size);
    }
    if ((rc = opt_state_check_host(host, NAME)) != LOOM_OK)
        return rc;
    if (shard_size == 0)
        shard_size = dp_size;
    loom_group *shard_group = dp, *replica = NULL;
    if (shard_size < dp_size) {
        /* Shard groups of consecutive dp ranks; a replica group takes one
         * rank of each. Collective over dp, and the core owns both. */
        if (host->comm->struct_size < offsetof(loom_comm_api, split) + sizeof host->comm->split ||
            !host->comm->split)
            return host->error(host, LOOM_ERR_NOT_SUPPORTED,
                               NAME ": parallel.dp.shard_size needs the comm API's split (ABI "
                                    "1.3); this core has none");
        int S = (int)shard_size;
        if ((rc = host->comm->split(dp, dp_rank / S, dp_rank, &shard_group)) != LOOM_OK ||
            (rc = host->comm->split(dp, dp_rank % S, dp_rank, &replica)) != LOOM_OK)
            return rc;
    }
    loom_strategy *s = malloc(sizeof *s);
    if (!s)
        return host->error(host, LOOM_ERR_NO_MEMORY, NAME ": out of memory");
    *s = (loom_strategy){.host = host, .setup = *setup, .dp_size = dp_size, .dp_rank = dp_rank,
                         .shard_group = shard_group, .replica = replica,
                         .shard_size = (int)shard_size,
                         .shard_rank = host->comm->rank(shard_group), .prefetch = (int)prefetch,
                         .reducing_unit = -1};
    *out = s;
    return LOOM_OK;
}

static void free_buffers(loom_strategy *s)
{
    const loom_host *h = s->host;
    for (int i = 0; s->zu && i < s->nunits; i++) {
        zero_unit *z = &s->zu[i];
        if (zero_stage >= 2)
            free_if(h, z->grads);
        if (zero_stage == 3)
            free_if(h, z->params);
        z->params = z->grads = NULL;
    }
    free_if(h, s->params_all);
    free_if(h, s->grads_all);
    free_if(h, s->reduced);
    state_buffer_free(&s->param_shards);
    state_buffer_free(&s->grad_shards);
    if (s->opt.host)
        opt_state_free(&s->opt);
    free_if(h, s->recv);
    s->params_all = s->grads_all = s->reduced = s->recv = NULL;
    free(s->zu);
    free(s->fsteps);
    free(s->bsteps);
    s->zu = NULL;
    s->fsteps = s->bsteps = NULL;
}

static int in_flight(const loom_strategy *s)
{
    int n = 0;
    for (int i = 0; s->zu && i < s->nunits; i++)
        n += s->zu[i].gather.active + s->zu[i].reduce.active;
    return n;
}

/* Wait for everything posted. */
static int quiesce(loom_strategy *s)
{
    if (s->failed)
        return broken(s);
    int rc = zero_stage >= 2 ? finish_reduce(s) : LOOM_OK;
    for (int i = 0; rc == LOOM_OK && i < s->nunits; i++) {
        zero_unit *z = &s->zu[i];
        rc = wait_op(s, z, &z->reduce, "reducescatter");
        if (rc == LOOM_OK)
            rc = wait_gather(s, z);
    }
    return rc;
}

static int zero_destroy(loom_strategy *s)
{
    if (!s)
        return LOOM_OK;
    int rc = s->zu && !s->failed ? quiesce(s) : LOOM_OK;
    if (s->failed) {
        /* A timed-out collective stays posted inside the backend: better to
         * leak the buffers it may still write than to free them. */
        int n = in_flight(s);
        s->host->log(s->host, LOOM_LOG_WARN,
                     "keeping the buffers of %d collective%s still in flight after a failure", n,
                     n == 1 ? "" : "s");
        for (int i = 0; s->zu && i < s->nunits; i++) {
            zero_unit *z = &s->zu[i];
            if (z->gather.active) {
                if (zero_stage == 3)
                    z->params = NULL;
                else
                    s->params_all = NULL;
            }
            if (z->reduce.active) {
                if (zero_stage == 1) {
                    s->grads_all = NULL;
                    s->reduced = NULL;
                } else {
                    z->grads = NULL;
                    s->recv = NULL;
                }
            }
        }
    }
    free_buffers(s);
    free(s);
    return rc;
}

static int zero_describe(const loom_strategy *s, char *buf, size_t cap)
{
    char prefetch[32] = "", hybrid[96] = "", sizes[160] = "";
    if (zero_stage == 3)
        snprintf(prefetch, sizeof prefetch, ", prefetch %d", s->prefetch);
    if (s->replica)
        snprintf(hybrid, sizeof hybrid, ", shard groups of %d (HSDP: %d replicas)", s->shard_size,
                 s->dp_size / s->shard_size);
    if (s->zu)
        snprintf(sizes, sizeof sizes, ", %zu parameters padded to %zu, %zu owned per rank",
                 s->numel, s->padded, s->shard_total);
    snprintf(buf, cap, NAME " over %d rank%s%s%s%s", s->dp_size, s->dp_size == 1 ? "" : "s",
             hybrid, prefetch, sizes);
    return LOOM_OK;
}

/* ----------------------------------------------------------- data axis */

/* Pads each unit to a multiple of ALIGN x shard_size elements and cuts it
 * into shard_size equal shards, of which this rank owns shard shard_rank;
 * the units lie
 * one after the other in the full buffers and in the shard buffers. */
static void lay_out_shards(loom_strategy *s)
{
    size_t N = (size_t)s->shard_size, flat = 0, shards = 0;
    for (int i = 0; i < s->nunits; i++) {
        zero_unit *z = &s->zu[i];
        z->unit = &s->units[i];
        z->numel = z->unit->numel;
        z->padded = round_up(z->numel ? z->numel : 1, ALIGN * N);
        z->shard = z->padded / N;
        z->own_begin = (size_t)s->shard_rank * z->shard;
        z->own_count = z->numel > z->own_begin ? z->numel - z->own_begin : 0;
        if (z->own_count > z->shard)
            z->own_count = z->shard;
        z->flat_off = flat;
        z->shard_off = shards;
        flat += z->padded;
        shards += z->shard;
        s->numel += z->numel;
        if (z->shard > s->max_shard)
            s->max_shard = z->shard;
    }
    s->padded = flat;
    s->shard_total = shards;
}

/* zero3's prefetch order: the units as the trainer's forward and backward
 * hooks meet them. The tied embedding rides along with the head's. */
static void plan_hook_steps(loom_strategy *s)
{
    int n = s->nunits;
    int tied = n >= 2 && s->units[0].kind == LOOM_UNIT_EMBEDDING &&
               s->units[n - 1].kind == LOOM_UNIT_HEAD;
    for (int i = 0; i < n; i++) {
        s->fsteps[i] = (zero_step){i, tied && i == n - 1 ? 0 : -1};
        s->bsteps[i] = (zero_step){n - 1 - i, tied && i == 0 ? 0 : -1};
    }
}

/* The buffers that persist, as the header comment counts them. */
static int alloc_model_state(loom_strategy *s)
{
    const loom_host *h = s->host;
    size_t full = s->padded * s->esize, owned = s->shard_total * s->esize;
    size_t *elems = malloc((size_t)s->nunits * sizeof *elems);
    size_t *bytes = malloc((size_t)s->nunits * sizeof *bytes);
    int rc = elems && bytes ? LOOM_OK : h->error(h, LOOM_ERR_NO_MEMORY, NAME ": out of memory");
    for (int i = 0; rc == LOOM_OK && i < s->nunits; i++) {
        elems[i] = s->zu[i].shard;
        bytes[i] = s->zu[i].shard * s->esize;
    }
    if (rc == LOOM_OK && zero_stage == 3)
        rc = state_buffer_alloc(&s->param_shards, h, LOOM_PURPOSE_PARAMS, NAME " params",
                                s->nunits, bytes);
    else if (rc == LOOM_OK)
        rc = strategy_alloc_model(h, LOOM_PURPOSE_PARAMS, full, &s->params_all);
    if (rc == LOOM_OK && zero_stage == 1) {
        rc = strategy_alloc_model(h, LOOM_PURPOSE_GRADS, full, &s->grads_all);
        if (rc == LOOM_OK)
            rc = strategy_alloc_model(h, LOOM_PURPOSE_COMM, owned, &s->reduced);
    } else if (rc == LOOM_OK) {
        rc = state_buffer_alloc(&s->grad_shards, h, LOOM_PURPOSE_GRADS, NAME " grads",
                                s->nunits, bytes);
        if (rc == LOOM_OK)
            rc = strategy_alloc_model(h, LOOM_PURPOSE_COMM, s->max_shard * s->esize, &s->recv);
    }
    if (rc == LOOM_OK)
        rc = opt_state_alloc(&s->opt, h, NAME, s->nunits, elems, s->dtype != LOOM_F32);
    free(elems);
    free(bytes);
    return rc;
}

/* The initial parameters into what each stage keeps: every rank has them
 * whole, so nothing is gathered. zero1/2 keep the full parameters in the
 * compute dtype, zero3 only its shard; each rank copies its shard into the
 * master weights. */
static int place_initial_params(loom_strategy *s, float *const *init)
{
    const loom_host *h = s->host;
    const loom_compute_api *c = strategy_compute(h);
    int rc = LOOM_OK;
    for (int i = 0; i < s->nunits && rc == LOOM_OK; i++) {
        zero_unit *z = &s->zu[i];
        z->grad_clear = 1;
        if (zero_stage < 3) {
            z->params = at(s->params_all, z->flat_off, s->esize);
            if ((rc = strategy_upload_f32(h, z->params, s->dtype, init[i], z->numel)) != LOOM_OK)
                break;
        }
        if (zero_stage == 1)
            z->grads = at(s->grads_all, z->flat_off, s->esize);
        opt_view st;
        void *shard = NULL;
        float *master = NULL;
        if ((rc = get_unit_state(s, z, LOOM_TIERED_OVERWRITE, &st, &shard, &master)) != LOOM_OK)
            break;
        if (zero_stage == 3 && !st.master) /* fp32: the shard is the master, padding zeros */
            rc = c->zero(h, shard, z->shard * s->esize);
        if (rc == LOOM_OK && z->own_count)
            rc = c->to_device(h, master, init[i] + z->own_begin, z->own_count * sizeof(float));
        if (rc == LOOM_OK && zero_stage == 3 && z->own_count && shard != (void *)master)
            rc = c->convert(h, shard, s->dtype, master, LOOM_F32, z->own_count);
        int r2 = put_unit_state(s, z, 1);
        if (rc == LOOM_OK)
            rc = r2;
        z->unit->params = z->params;
        z->unit->grads = z->grads;
        z->unit->strategy_data = z;
    }
    return rc;
}

static int zero_data_setup(loom_strategy *s, loom_unit *units, int nunits, float *const *init)
{
    const loom_host *h = s->host;
    if (s->zu)
        return h->error(h, LOOM_ERR_INVALID, NAME ": data_setup called twice");
    int rc = strategy_check_units(h, NAME, units, nunits, init, "the shards need a single dtype");
    if (rc != LOOM_OK)
        return rc;
    s->dtype = units[0].compute_dtype;
    s->esize = loom_dtype_size(s->dtype);
    s->units = units;
    s->nunits = nunits;
    s->zu = calloc((size_t)nunits, sizeof *s->zu);
    s->fsteps = calloc((size_t)nunits, sizeof *s->fsteps);
    s->bsteps = calloc((size_t)nunits, sizeof *s->bsteps);
    if (!s->zu || !s->fsteps || !s->bsteps) {
        free_buffers(s);
        return h->error(h, LOOM_ERR_NO_MEMORY, NAME ": out of memory");
    }
    lay_out_shards(s);
    if (s->numel == 0) {
        free_buffers(s);
        return h->error(h, LOOM_ERR_INVALID, NAME ": the model has no parameters");
    }
    plan_hook_steps(s);
    if ((rc = alloc_model_state(s)) != LOOM_OK) {
        free_buffers(s);
        return rc; /* mem_alloc said what it could not get */
    }
    if ((rc = place_initial_params(s, init)) != LOOM_OK)
        free_buffers(s);
    return rc;
}

static zero_unit *hook_unit(loom_strategy *s, loom_unit *unit, const char *hook)
{
    if (!s->zu) {
        s->host->error(s->host, LOOM_ERR_INVALID, NAME ": %s before data_setup", hook);
        return NULL;
    }
    int i = unit ? strategy_find_unit(s->units, s->nunits, unit) : -1;
    if (i < 0) {
        s->host->error(s->host, LOOM_ERR_INVALID,
                       NAME ": %s for unit %d ('%s'), which data_setup was not given", hook,
                       unit ? unit->index : -1, strategy_unit_name(unit));
        return NULL;
    }
    return &s->zu[i];
}

/* zero3 only: zero1/2 keep the full parameters. */
static int zero_data_before_forward(loom_strategy *s, loom_unit *unit)
{
    zero_unit *z = hook_unit(s, unit, "data_before_forward");
    int rc = z ? progress(s) : LOOM_ERR_INVALID;
    if (rc != LOOM_OK)
        return rc;
    int i = (int)(z - s->zu);
    int occurrence = z->fwd_entries++;
    if (occurrence > 0 && !s->evaluating)
        z->held = 1; /* the tied reuse: needed again by the head's backward */
    /* Post this unit's gather (if no prefetch did), then the next ones, then wait. */
    if ((rc = start_gather(s, z)) != LOOM_OK ||
        (rc = prefetch_after(s, s->fsteps, find_step(s->fsteps, s->nunits, i, occurrence))) != LOOM_OK ||
        (rc = ensure_params(s, z)) != LOOM_OK)
        return rc;
    z->fwd_refs++;
    return LOOM_OK;
}

/* zero3 only. */
static int zero_data_after_forward(loom_strategy *s, loom_unit *unit)
{
    zero_unit *z = hook_unit(s, unit, "data_after_forward");
    if (!z)
        return LOOM_ERR_INVALID;
    if (z->fwd_refs > 0)
        z->fwd_refs--;
    /* Evaluating, no backward closes the micro-batch: the tied embedding's
     * second forward (inside the head's) does. */
    if (s->evaluating && z == &s->zu[0] && z->fwd_entries > 1)
        for (int i = 0; i < s->nunits; i++)
            s->zu[i].fwd_entries = 0;
    int rc = maybe_drop(s, z);
    return rc == LOOM_OK ? progress(s) : rc;
}

/* zero3 only: forward-only micro-batches gather each unit around its
 * forward and drop it after, the embedding too (no backward needs it). */
static int zero_data_eval(loom_strategy *s, int evaluating)
{
    if (!s->zu)
        return s->host->error(s->host, LOOM_ERR_INVALID, NAME ": data_eval before data_setup");
    int rc = progress(s);
    for (int i = 0; rc == LOOM_OK && i < s->nunits; i++) {
        zero_unit *z = &s->zu[i];
        if (z->fwd_refs || z->bwd_open)
            return s->host->error(s->host, LOOM_ERR_INVALID,
                                  NAME ": data_eval(%d) inside a micro-batch (unit '%s' is in "
                                  "its forward or backward)",
                                  evaluating, strategy_unit_name(z->unit));
        z->fwd_entries = 0;
        rc = drop_params(s, z); /* a prefetch the other mode would not use */
    }
    s->evaluating = evaluating;
    return rc;
}

static int zero_data_before_backward(loom_strategy *s, loom_unit *unit)
{
    zero_unit *z = hook_unit(s, unit, "data_before_backward");
    int rc = z ? progress(s) : LOOM_ERR_INVALID;
    if (rc != LOOM_OK || zero_stage == 1)
        return rc; /* zero1's full gradients are always there */
    int occurrence = z->bwd_entries++;
    if (!z->bwd_open) {
        z->bwd_open = 1;
        if (zero_stage == 3 && (rc = start_gather(s, z)) != LOOM_OK)
            return rc;
        if ((rc = open_grads(s, z)) != LOOM_OK)
            return rc;
    }
    if (zero_stage == 2)
        return LOOM_OK;
    int i = (int)(z - s->zu);
    if ((rc = prefetch_after(s, s->bsteps, find_step(s->bsteps, s->nunits, i, occurrence))) != LOOM_OK)
        return rc;
    return ensure_params(s, z);
}

static int zero_data_grads_ready(loom_strategy *s, loom_unit *unit, int last_micro)
{
    const loom_host *h = s->host;
    zero_unit *z = hook_unit(s, unit, "data_grads_ready");
    if (!z)
        return LOOM_ERR_INVALID;
    s->saw_micro = 1;
    int rc = progress(s);
    if (rc != LOOM_OK)
        return rc;
    if (zero_stage == 1) {
        /* Accumulating micro-batches stay local, like PyTorch's no_sync. */
        if (!last_micro)
            return LOOM_OK;
        s->saw_last_micro = 1;
        if (z->reduced)
            return h->error(h, LOOM_ERR_INVALID,
                            NAME ": unit '%s' reported its gradients twice on the last micro-batch",
                            strategy_unit_name(unit));
        z->reduced = 1;
        return post_reduce(s, z, at(s->reduced, z->shard_off, s->esize));
    }
    if (last_micro)
        s->saw_last_micro = 1;
    if (!z->bwd_open || !z->grads || z->reducing)
        return h->error(h, LOOM_ERR_INVALID,
                        NAME ": data_grads_ready for unit '%s' without data_before_backward "
                             "(no gradient buffer is open)",
                        strategy_unit_name(unit));
    /* One reduce-scatter at a time: the previous one has overlapped this
     * unit's backward; now its result is due. */
    if ((rc = finish_reduce(s)) != LOOM_OK)
        return rc;
    if ((rc = post_reduce(s, z, s->recv)) != LOOM_OK)
        return rc;
    z->reducing = 1;
    s->reducing_unit = (int)(z - s->zu);
    unit->grads = NULL; /* the model must not write it any more */
    z->bwd_open = 0;
    z->held = 0;
    z->fwd_entries = 0;
    z->bwd_entries = 0;
    return zero_stage == 3 ? maybe_drop(s, z) : LOOM_OK;
}

static void reset_step(loom_strategy *s)
{
    for (int i = 0; i < s->nunits; i++)
        s->zu[i].reduced = 0;
    s->saw_micro = 0;
    s->saw_last_micro = 0;
}

static int zero_data_finish_backward(loom_strategy *s)
{
    if (!s->zu)
        return s->host->error(s->host, LOOM_ERR_INVALID, NAME ": data_finish_backward before data_setup");
    /* Called after a micro-batch that was not the last: the accumulation
     * continues. */
    if (s->saw_micro && !s->saw_last_micro)
        return progress(s);
    if (s->failed)
        return broken(s);
    int rc = LOOM_OK;
    if (zero_stage == 1) {
        /* Units that never reported still get reduced, in the same order on
         * every rank. */
        for (int i = s->nunits - 1; rc == LOOM_OK && i >= 0; i--)
            if (!s->zu[i].reduced) {
                s->zu[i].reduced = 1;
                rc = post_reduce(s, &s->zu[i], at(s->reduced, s->zu[i].shard_off, s->esize));
            }
    }
    if (rc == LOOM_OK)
        rc = quiesce(s);
    if (rc != LOOM_OK)
        return rc;
    for (int i = 0; zero_stage == 1 && rc == LOOM_OK && i < s->nunits; i++)
        rc = average_shard_end(s, at(s->reduced, s->zu[i].shard_off, s->esize), s->zu[i].shard);
    if (rc != LOOM_OK)
        return rc;
    reset_step(s);
    return LOOM_OK;
}

/* The hooks that read gradients need this step's average. */
static int need_finished(loom_strategy *s, const char *hook)
{
    if (s->zu && s->failed)
        return broken(s);
    return strategy_need_finished(s->host, NAME, hook, s->zu != NULL, s->saw_last_micro,
                                  "reduced");
}

static int zero_data_grad_norm_sq(loom_strategy *s, double *out)
{
    int rc = need_finished(s, "data_grad_norm_sq");
    if (rc != LOOM_OK)
        return rc;
    /* Each rank sums its owned shard; a shard group's shards partition the
     * model (and under HSDP every shard group holds the same). */
    double local = 0.0;
    for (int i = 0; i < s->nunits; i++) {
        zero_unit *z = &s->zu[i];
        void *g = NULL;
        if (zero_stage > 1 && z->grad_clear)
            continue; /* zeros add nothing */
        if (i + 1 < s->nunits && zero_stage > 1 && !s->zu[i + 1].grad_clear &&
            (rc = state_buffer_fetch(&s->grad_shards, i + 1)) != LOOM_OK)
            return rc;
        if ((rc = get_grad_shard(s, z, &g)) != LOOM_OK)
            return rc;
        rc = strategy_compute(s->host)->sum_squares(s->host, g, s->dtype, z->own_count, &local);
        int r2 = put_grad_shard(s, z, 0);
        if ((rc = rc != LOOM_OK ? rc : r2) != LOOM_OK)
            return rc;
    }
    double global = local;
    loom_request *req = NULL;
    rc = s->host->comm->allreduce(s->shard_group, &local, &global, 1, LOOM_F64, LOOM_SUM, &req);
    if (rc == LOOM_OK)
        rc = s->host->comm->wait(req);
    if (rc != LOOM_OK)
        return op_failed(s, rc);
    *out = global;
    return LOOM_OK;
}

static int clear_grads(loom_strategy *s)
{
    const loom_compute_api *c = strategy_compute(s->host);
    int rc = LOOM_OK;
    if (zero_stage == 1)
        rc = c->zero(s->host, s->grads_all, s->padded * s->esize);
    if (zero_stage == 1 && rc == LOOM_OK)
        rc = c->zero(s->host, s->reduced, s->shard_total * s->esize);
    for (int i = 0; i < s->nunits; i++)
        s->zu[i].grad_clear = 1;
    return rc;
}

static int zero_data_zero_grads(loom_strategy *s)
{
    if (!s->zu)
        return LOOM_OK;
    /* Never clear memory the backend may still be writing. */
    int rc = quiesce(s);
    if (rc == LOOM_OK && zero_stage == 3)
        rc = drop_all_params(s);
    if (rc != LOOM_OK)
        return rc;
    reset_step(s);
    return clear_grads(s);
}

/* zero1/2 after the step: every rank's new shard to every rank, in place,
 * all units at once. */
static int gather_stepped_params(loom_strategy *s)
{
    int rc = LOOM_OK;
    for (int i = 0; rc == LOOM_OK && i < s->nunits; i++) {
        zero_unit *z = &s->zu[i];
        rc = post_gather(s, z, at(z->params, z->own_begin, s->esize), z->params);
    }
    for (int i = 0; rc == LOOM_OK && i < s->nunits; i++)
        rc = wait_gather(s, &s->zu[i]);
    return rc;
}

/* Start reading what the optimizer step needs of unit i from its tier. */
static int fetch_for_step(loom_strategy *s, int i)
{
    if (i >= s->nunits)
        return LOOM_OK;
    int rc = opt_state_fetch(&s->opt, i);
    if (rc == LOOM_OK && zero_stage > 1 && !s->zu[i].grad_clear)
        rc = state_buffer_fetch(&s->grad_shards, i);
    if (rc == LOOM_OK && zero_stage == 3 && !opt_state_has_master(&s->opt))
        rc = state_buffer_fetch(&s->param_shards, i); /* fp32: the shard is the master */
    return rc;
}

static int zero_data_optimizer_step(loom_strategy *s, const loom_optimizer_step *step)
{
    const loom_host *h = s->host;
    int rc = need_finished(s, "data_optimizer_step");
    if (rc != LOOM_OK)
        return rc;
    if (!step || !step->update_range)
        return h->error(h, LOOM_ERR_INVALID, NAME ": data_optimizer_step without an update function");
    if ((rc = quiesce(s)) != LOOM_OK)
        return rc;
    /* Streamed unit by unit: the next unit's state and gradient are read
     * while this one steps, and each is written back behind (all free in
     * host memory). */
    rc = fetch_for_step(s, 0);
    for (int i = 0; i < s->nunits && rc == LOOM_OK; i++) {
        zero_unit *z = &s->zu[i];
        opt_view st;
        void *shard = NULL, *grad = NULL;
        float *master = NULL;
        if ((rc = fetch_for_step(s, i + 1)) != LOOM_OK ||
            (rc = get_unit_state(s, z, LOOM_TIERED_OVERWRITE, &st, &shard, &master)) != LOOM_OK)
            break;
        if ((rc = get_grad_shard(s, z, &grad)) != LOOM_OK) {
            put_unit_state(s, z, 0);
            break;
        }
        strategy_update_store(h, step, z->unit, z->own_begin, master, grad, st.m, st.v,
                              z->own_count, shard, s->dtype);
        rc = put_grad_shard(s, z, 0);
        int r2 = put_unit_state(s, z, 1);
        if (rc == LOOM_OK)
            rc = r2;
    }
    if (rc != LOOM_OK)
        return rc;
    if (zero_stage == 3)
        rc = drop_all_params(s); /* gathered copies are stale now */
    else
        rc = gather_stepped_params(s);
    if (rc != LOOM_OK)
        return rc;
    return clear_grads(s);
}

/* Checkpointing: full fp32 arrays from the owned shards of every rank. */
static int zero_data_get_state(loom_strategy *s, loom_unit *unit, float *params, float *m, float *v)
{
    zero_unit *z = hook_unit(s, unit, "data_get_state");
    int rc = z ? quiesce(s) : LOOM_ERR_INVALID;
    if (rc != LOOM_OK)
        return rc;
    float *full = NULL, *master = NULL;
    void *own = NULL;
    opt_view st;
    const loom_compute_api *c = strategy_compute(s->host);
    if ((rc = s->host->mem_alloc(s->host, (loom_tier)c->tier, LOOM_PURPOSE_COMM,
                                 z->padded * sizeof(float), (void **)&full)) != LOOM_OK)
        return rc;
    if ((rc = get_unit_state(s, z, LOOM_TIERED_READ, &st, &own, &master)) != LOOM_OK) {
        free_if(s->host, full);
        return rc;
    }
    const float *shard[3] = {master, st.m, st.v};
    float *dst[3] = {params, m, v};
    for (int k = 0; k < 3 && rc == LOOM_OK; k++) {
        if (!dst[k])
            continue;
        loom_request *req = NULL;
        rc = s->host->comm->allgather(s->shard_group, shard[k], full, z->shard, LOOM_F32, &req);
        if (rc == LOOM_OK)
            rc = s->host->comm->wait(req);
        if (rc != LOOM_OK) {
            op_failed(s, rc);
            if (req) /* the backend may still write it */
                full = NULL;
            break;
        }
        rc = c->to_host(s->host, dst[k], full, z->numel * sizeof(float));
    }
    free_if(s->host, full);
    int r2 = put_unit_state(s, z, 0);
    return rc != LOOM_OK ? rc : r2;
}

static int zero_data_set_state(loom_strategy *s, loom_unit *unit, const float *params,
                               const float *m, const float *v)
{
    zero_unit *z = hook_unit(s, unit, "data_set_state");
    int rc = z ? quiesce(s) : LOOM_ERR_INVALID;
    if (rc != LOOM_OK)
        return rc;
    /* Every rank holds the full arrays: keep the owned part, no communication. */
    float *master = NULL;
    void *own = NULL;
    opt_view st;
    if ((rc = get_unit_state(s, z, LOOM_TIERED_READ, &st, &own, &master)) != LOOM_OK)
        return rc;
    const loom_host *h = s->host;
    const loom_compute_api *c = strategy_compute(h);
    float *dst[3] = {master, st.m, st.v};
    const float *src[3] = {params, m, v};
    for (int k = 0; k < 3 && rc == LOOM_OK; k++)
        if (src[k] && z->own_count)
            rc = c->to_device(h, dst[k], src[k] + z->own_begin, z->own_count * sizeof(float));
    if (rc == LOOM_OK && params && zero_stage == 3 && z->own_count && own != (void *)master)
        rc = c->convert(h, own, s->dtype, master, LOOM_F32, z->own_count);
    if (rc == LOOM_OK && params && z->params) /* zero1/2 always; zero3 while gathered */
        rc = strategy_upload_f32(h, z->params, s->dtype, params, z->numel);
    int r2 = put_unit_state(s, z, 1);
    return rc != LOOM_OK ? rc : r2;
}

/* Sharded checkpoints: the owned shard as it is, no communication. Under
 * HSDP the first shard group's ranks write the shards and the replicas
 * nothing, so the ranges stay disjoint. */
static int zero_data_get_shard(loom_strategy *s, loom_unit *unit, size_t *begin, size_t *count,
                               float *params, float *m, float *v)
{
    zero_unit *z = hook_unit(s, unit, "data_get_shard");
    if (!z)
        return LOOM_ERR_INVALID;
    if (s->dp_rank >= s->shard_size) {
        *begin = *count = 0;
        return LOOM_OK;
    }
    *begin = z->own_count ? z->own_begin : 0;
    *count = z->own_count;
    size_t bytes = z->own_count * sizeof(float);
    float *master = NULL;
    void *own = NULL;
    opt_view st;
    int rc = get_unit_state(s, z, LOOM_TIERED_READ, &st, &own, &master);
    if (rc != LOOM_OK)
        return rc;
    const loom_compute_api *c = strategy_compute(s->host);
    if (params)
        rc = c->to_host(s->host, params, master, bytes);
    if (m && rc == LOOM_OK)
        rc = c->to_host(s->host, m, st.m, bytes);
    if (v && rc == LOOM_OK)
        rc = c->to_host(s->host, v, st.v, bytes);
    int r2 = put_unit_state(s, z, 0);
    return rc != LOOM_OK ? rc : r2;
}

/* Initializers must be constant expressions: here the stage is spelled as
 * the macro. zero1/2 keep the full parameters, so they leave the forward
 * hooks to the core's no-ops. */
LOOM_PLUGIN_EXPORT const loom_strategy_plugin_v1_t loom_strategy_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_STRATEGY, loom_strategy_plugin_v1_t, NAME,
                                 ZERO_STAGE == 3   ? ZERO3_DESCRIPTION
                                 : ZERO_STAGE == 2 ? ZERO2_DESCRIPTION
                                                   : ZERO1_DESCRIPTION,
                                 ZERO_STAGE == 3 ? zero3_settings : NULL),
    .axis = LOOM_AXIS_DP,
    .create = zero_create,
    .destroy = zero_destroy,
    .describe = zero_describe,
    .data_setup = zero_data_setup,
    .data_before_forward = ZERO_STAGE == 3 ? zero_data_before_forward : NULL,
    .data_after_forward = ZERO_STAGE == 3 ? zero_data_after_forward : NULL,
    .data_before_backward = zero_data_before_backward,
    .data_grads_ready = zero_data_grads_ready,
    .data_finish_backward = zero_data_finish_backward,
    .data_grad_norm_sq = zero_data_grad_norm_sq,
    .data_optimizer_step = zero_data_optimizer_step,
    .data_zero_grads = zero_data_zero_grads,
    .data_get_state = zero_data_get_state,
    .data_set_state = zero_data_set_state,
    .data_get_shard = zero_data_get_shard,
    .capabilities = ZERO_STAGE == 3 ? LOOM_STRATEGY_PARAMS_SHARDED : 0,
    .data_eval = ZERO_STAGE == 3 ? zero_data_eval : NULL,
};
