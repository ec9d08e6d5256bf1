/* The pipeline executor: one pp rank's schedule, one step at a time (see
 * pipeline.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/comm.h"
#include "loom/plugin.h"
#include "loom/status.h"
#include "loom/strategy.h"
#include "loom/tensor.h"
#include "model/model.h"
#include "runtime/group.h"
#include "runtime/flight.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/trace.h"
#include "train/pipeline.h"
#include "train/schedule.h"

/* Receives posted ahead of the action that waits for them. */
#define RECV_AHEAD 2

/* A message in flight or waiting to be used: a receive posted (or done)
 * for one action, or a send until it completes. */
typedef struct message {
    void *buf;
    loom_request *req; /* NULL once complete */
    int posted;
} message;

typedef struct pending_send {
    void *buf;
    loom_request *req;
} pending_send;

struct loom_pipeline {
    loom_pipeline_setup s;
    const loom_schedule *sched;
    int p, v, m, S, head; /* stages, virtual stages, micro-batches, p·v, the head unit */
    int nactions;
    const loom_action *actions;
    loom_unit *units;

    size_t stream_count;   /* elements of an activation crossing a border */
    loom_dtype stream_dtype;
    size_t grad_count;     /* fp32 elements of its gradient */

    message *recv;         /* per action index (only receives use theirs) */
    int *recv_of;          /* [kind 0 act / 1 grad][vs][mb] -> action index, -1 none */
    void **grad_out;       /* [vs][mb]: the input gradient a backward left for its send */
    pending_send *sends;
    int nsends, capsends;

    int *bw_done;          /* per unit: micro-batches whose weight gradients are in */
    /* Model slots are reused: a (virtual stage, micro-batch) takes a free
     * slot of its virtual stage at its forward and gives it back after its
     * backward, so the slots ever made are the most alive at once. Each
     * virtual stage's slots hold its own units only. */
    int *slot_of;          /* [vs][mb]: its slot, -1 none */
    int *free_slots;       /* [vs][m]: a stack per virtual stage */
    int *nfree;            /* [vs] */
    unsigned char *chunk_units; /* [vs][L + 2]: the units of each virtual stage */
    int nslots, nlive;
    int holds_first, holds_last; /* stage 0 / stage S-1 on this rank */
    void *tied_params, *tied_grads; /* last stage: the copy of unit 0 */
    size_t tied_numel;
    double loss_sum;
    float dloss;
    int *const *inputs;
    int *const *targets;
    loom_pipeline_stats stats;
};

static const loom_comm_api *C = &loom_core_comm_api;

static int stage_of(const loom_pipeline *pl, int vs) { return vs * pl->p + pl->s.rank; }
static int next_rank(const loom_pipeline *pl) { return (pl->s.rank + 1) % pl->p; }
static int prev_rank(const loom_pipeline *pl) { return (pl->s.rank + pl->p - 1) % pl->p; }

/* One tag per (direction, receiving stage, micro-batch), so messages match
 * by identity whatever the order they are posted in. */
static int tag_of(const loom_pipeline *pl, int gradient, int stage, int mb)
{
    return (gradient * pl->S + stage) * pl->m + mb;
}
static int tied_tag(const loom_pipeline *pl, int which) { return 2 * pl->S * pl->m + which; }

/* The model's buffers and the messages of them live in its backend, and
 * move only through its calls. */
#define BK(pl, op, ...) ((pl)->s.backend->ops->op((pl)->s.backend->self, __VA_ARGS__))
static loom_tier tier_of(const loom_pipeline *pl) { return (loom_tier)pl->s.backend->ops->tier; }

static int *recv_index(loom_pipeline *pl, int gradient, int vs, int mb)
{
    return &pl->recv_of[((size_t)gradient * pl->v + (size_t)vs) * pl->m + (size_t)mb];
}

static void describe(const loom_pipeline *pl, int index, char *buf, size_t cap)
{
    loom_action_describe(pl->sched, pl->s.rank, index, buf, cap);
}

void loom_pipeline_destroy(loom_pipeline *pl)
{
    if (!pl)
        return;
    for (int i = 0; pl->recv && i < pl->nactions; i++)
        if (!pl->recv[i].req) /* never free what a backend may still write */
            loom_mem_free(pl->recv[i].buf);
    for (int i = 0; i < pl->nsends; i++)
        if (!pl->sends[i].req)
            loom_mem_free(pl->sends[i].buf);
    for (size_t i = 0; pl->grad_out && i < (size_t)pl->v * (size_t)pl->m; i++)
        loom_mem_free(pl->grad_out[i]);
    loom_mem_free(pl->tied_params);
    loom_mem_free(pl->tied_grads);
    free(pl->recv);
    free(pl->recv_of);
    free(pl->grad_out);
    free(pl->sends);
    free(pl->bw_done);
    free(pl->slot_of);
    free(pl->free_slots);
    free(pl->nfree);
    free(pl->chunk_units);
    free(pl);
}

/* The last stage's copy of unit 0: the head reads wte from it and adds
 * into its gradients; the first stage's is sent over after each step. */
static int make_tied_copy(loom_pipeline *pl)
{
    loom_unit *u0 = &pl->units[0];
    pl->tied_numel = u0->numel;
    size_t bytes = u0->numel * loom_dtype_size(pl->s.dtype);
    void *stored = malloc(bytes ? bytes : 1);
    int rc = stored ? LOOM_OK : loom_fail(LOOM_ERR_NO_MEMORY, "pipeline: out of memory");
    if (rc == LOOM_OK)
        rc = loom_mem_alloc(tier_of(pl), LOOM_PURPOSE_PARAMS, bytes, &pl->tied_params);
    if (rc == LOOM_OK)
        rc = loom_mem_alloc(tier_of(pl), LOOM_PURPOSE_GRADS, bytes, &pl->tied_grads);
    if (rc == LOOM_OK) {
        loom_from_f32(stored, pl->s.dtype, pl->s.tied_init, u0->numel);
        rc = BK(pl, to_device, pl->tied_params, stored, bytes);
    }
    free(stored);
    if (rc == LOOM_OK)
        rc = BK(pl, zero, pl->tied_grads, bytes);
    if (rc == LOOM_OK) {
        u0->params = pl->tied_params;
        u0->grads = pl->tied_grads;
    }
    return rc;
}

int loom_pipeline_create(const loom_pipeline_setup *setup, loom_pipeline **out)
{
    loom_pipeline *pl = calloc(1, sizeof *pl);
    if (!pl)
        return loom_fail(LOOM_ERR_NO_MEMORY, "pipeline: out of memory");
    pl->s = *setup;
    pl->sched = setup->schedule;
    pl->p = pl->sched->stages;
    pl->v = pl->sched->virtual_stages;
    pl->m = pl->sched->microbatches;
    pl->S = pl->p * pl->v;
    pl->nactions = pl->sched->count[setup->rank];
    pl->actions = pl->sched->actions[setup->rank];
    int nunits = 0;
    pl->units = loom_model_units(setup->model, &nunits);
    pl->head = nunits - 1;
    pl->holds_first = setup->rank == 0;
    pl->holds_last = (pl->S - 1) % pl->p == setup->rank;
    size_t vm = (size_t)pl->v * (size_t)pl->m;
    pl->recv = calloc((size_t)pl->nactions + 1, sizeof *pl->recv);
    pl->recv_of = malloc(2 * vm * sizeof *pl->recv_of);
    pl->grad_out = calloc(vm, sizeof *pl->grad_out);
    pl->bw_done = calloc((size_t)nunits, sizeof *pl->bw_done);
    pl->slot_of = malloc(vm * sizeof *pl->slot_of);
    pl->free_slots = malloc(vm * sizeof *pl->free_slots);
    pl->nfree = calloc((size_t)pl->v, sizeof *pl->nfree);
    pl->chunk_units = calloc((size_t)pl->v * (size_t)nunits, 1);
    if (!pl->recv || !pl->recv_of || !pl->grad_out || !pl->bw_done || !pl->slot_of ||
        !pl->free_slots || !pl->nfree || !pl->chunk_units) {
        loom_pipeline_destroy(pl);
        return loom_fail(LOOM_ERR_NO_MEMORY, "pipeline: out of memory");
    }
    for (size_t i = 0; i < 2 * vm; i++)
        pl->recv_of[i] = -1;
    for (int i = 0; i < pl->nactions; i++) {
        loom_action a = pl->actions[i];
        if (a.kind == LOOM_ACT_RECV_ACTIVATION || a.kind == LOOM_ACT_RECV_GRADIENT)
            *recv_index(pl, a.kind == LOOM_ACT_RECV_GRADIENT, a.virtual_stage, a.microbatch) = i;
    }
    /* Every border carries the same shape: the residual stream's rows. */
    loom_model_use_slot(setup->model, 0);
    int any = pl->s.stage_first[stage_of(pl, 0)];
    (void)loom_model_stream(setup->model, any > 0 ? any : 1, &pl->stream_count, &pl->stream_dtype);
    (void)loom_model_stream_grad(setup->model, &pl->grad_count);
    for (size_t i = 0; i < vm; i++)
        pl->slot_of[i] = -1;
    for (int vs = 0; vs < pl->v; vs++) {
        int st = stage_of(pl, vs);
        for (int u = setup->stage_first[st]; u <= setup->stage_last[st]; u++)
            pl->chunk_units[(size_t)vs * (size_t)nunits + (size_t)u] = 1;
    }
    /* The model's slot 0 holds every unit of the rank; each virtual stage
     * makes slots of its own units instead, as micro-batches need them. */
    loom_model_release_slot(setup->model, 0);
    int rc = pl->holds_last ? make_tied_copy(pl) : LOOM_OK;
    if (rc != LOOM_OK) {
        loom_pipeline_destroy(pl);
        return rc;
    }
    *out = pl;
    return LOOM_OK;
}

/* ---- messages ---- */

static int post_recv(loom_pipeline *pl, int index)
{
    loom_action a = pl->actions[index];
    message *msg = &pl->recv[index];
    int gradient = a.kind == LOOM_ACT_RECV_GRADIENT;
    int stage = stage_of(pl, a.virtual_stage);
    size_t count = gradient ? pl->grad_count : pl->stream_count;
    loom_dtype dtype = gradient ? LOOM_F32 : pl->stream_dtype;
    int rc = loom_mem_alloc(tier_of(pl), LOOM_PURPOSE_COMM, count * loom_dtype_size(dtype),
                            &msg->buf);
    if (rc != LOOM_OK)
        return rc;
    msg->posted = 1;
    return C->recv(pl->s.group, msg->buf, count, dtype, gradient ? next_rank(pl) : prev_rank(pl),
                   tag_of(pl, gradient, stage, a.microbatch), &msg->req);
}

/* Keep RECV_AHEAD receives posted beyond the action at pos. */
static int post_ahead(loom_pipeline *pl, int pos, int *next)
{
    int ahead = 0, rc = LOOM_OK;
    for (int i = pos; i < *next; i++)
        if (pl->recv[i].posted && pl->recv[i].req)
            ahead++;
    while (rc == LOOM_OK && *next < pl->nactions && ahead < RECV_AHEAD) {
        loom_action a = pl->actions[*next];
        if (a.kind == LOOM_ACT_RECV_ACTIVATION || a.kind == LOOM_ACT_RECV_GRADIENT) {
            rc = post_recv(pl, *next);
            ahead++;
        }
        (*next)++;
    }
    return rc;
}

static int wait_recv(loom_pipeline *pl, int index)
{
    message *msg = &pl->recv[index];
    int rc = msg->posted ? LOOM_OK : post_recv(pl, index);
    if (rc == LOOM_OK && msg->req) {
        rc = C->wait(msg->req);
        msg->req = NULL;
    }
    return rc;
}

/* The received buffer of a border, handed over to the caller to free. */
static void *take_recv(loom_pipeline *pl, int gradient, int vs, int mb)
{
    int i = *recv_index(pl, gradient, vs, mb);
    void *buf = pl->recv[i].buf;
    pl->recv[i].buf = NULL;
    return buf;
}

static int post_send(loom_pipeline *pl, void *buf, size_t count, loom_dtype dtype, int peer,
                     int tag)
{
    if (pl->nsends == pl->capsends) {
        int cap = pl->capsends ? 2 * pl->capsends : 16;
        pending_send *grown = realloc(pl->sends, (size_t)cap * sizeof *grown);
        if (!grown) {
            loom_mem_free(buf);
            return loom_fail(LOOM_ERR_NO_MEMORY, "pipeline: out of memory");
        }
        pl->sends = grown;
        pl->capsends = cap;
    }
    pending_send *ps = &pl->sends[pl->nsends++];
    ps->buf = buf;
    ps->req = NULL;
    return C->send(pl->s.group, buf, count, dtype, peer, tag, &ps->req);
}

/* Free the sends that completed; with wait, all of them. */
static int reap_sends(loom_pipeline *pl, int wait)
{
    int rc = LOOM_OK, kept = 0;
    for (int i = 0; i < pl->nsends; i++) {
        pending_send *ps = &pl->sends[i];
        if (ps->req && rc == LOOM_OK) {
            int st = wait ? C->wait(ps->req) : C->test(ps->req);
            if (st == LOOM_OK)
                ps->req = NULL;
            else if (st != LOOM_IN_PROGRESS)
                rc = st;
        }
        if (ps->req)
            pl->sends[kept++] = *ps;
        else
            loom_mem_free(ps->buf);
    }
    pl->nsends = kept;
    return rc;
}

/* ---- compute actions ---- */

static void trace_action(const loom_pipeline *pl, const char *what, int vs, int mb,
                         uint64_t start)
{
    char name[64];
    if (pl->v > 1)
        snprintf(name, sizeof name, "%s mb %d stage %d", what, mb, stage_of(pl, vs));
    else
        snprintf(name, sizeof name, "%s mb %d", what, mb);
    loom_trace_span(LOOM_LANE_COMPUTE, name, start, loom_now_ns(), 0);
}

static int use_slot(loom_pipeline *pl, int vs, int mb)
{
    int *slot = &pl->slot_of[(size_t)vs * pl->m + (size_t)mb];
    if (*slot < 0) {
        int *stack = &pl->free_slots[(size_t)vs * pl->m];
        *slot = pl->nfree[vs] ? stack[--pl->nfree[vs]] : pl->nslots++;
        if (++pl->nlive > pl->stats.peak_live)
            pl->stats.peak_live = pl->nlive;
    }
    return loom_model_use_slot_units(pl->s.model, *slot,
                                     &pl->chunk_units[(size_t)vs * (size_t)(pl->head + 1)]);
}

/* The backward of (vs, mb) is complete here: its slot is free for another
 * micro-batch of the same virtual stage. */
static void chunk_done(loom_pipeline *pl, int vs, int mb)
{
    int *slot = &pl->slot_of[(size_t)vs * pl->m + (size_t)mb];
    pl->free_slots[(size_t)vs * pl->m + (size_t)pl->nfree[vs]++] = *slot;
    *slot = -1;
    pl->nlive--;
}

static int run_forward(loom_pipeline *pl, int vs, int mb)
{
    int s = stage_of(pl, vs), first = pl->s.stage_first[s], last = pl->s.stage_last[s];
    const loom_pipeline_hooks *h = &pl->s.hooks;
    int rc = use_slot(pl, vs, mb);
    if (rc == LOOM_OK && s > 0) {
        void *in = take_recv(pl, 0, vs, mb);
        size_t count;
        loom_dtype dtype;
        void *stream = loom_model_stream(pl->s.model, first, &count, &dtype);
        rc = BK(pl, copy, stream, in, count * loom_dtype_size(dtype));
        loom_mem_free(in);
    }
    for (int u = first; rc == LOOM_OK && u <= last; u++) {
        float loss = 0;
        if ((rc = h->before_forward(h->ctx, u)) != LOOM_OK ||
            (rc = loom_model_forward(pl->s.model, u, pl->inputs[mb], pl->targets[mb], &loss)) !=
                LOOM_OK ||
            (rc = h->after_forward(h->ctx, u)) != LOOM_OK)
            break;
        if (u == pl->head)
            pl->loss_sum += loss;
    }
    return rc;
}

/* The unit's weight gradients of mb are in: the data strategy hears of it,
 * except unit 0's on the first stage, which wait for the head's share. */
static int weights_done(loom_pipeline *pl, int u)
{
    int last_micro = ++pl->bw_done[u] == pl->m;
    if (u == 0)
        return LOOM_OK;
    return pl->s.hooks.grads_ready(pl->s.hooks.ctx, u, last_micro);
}

enum { PART_BOTH, PART_INPUT, PART_WEIGHT };

static int run_backward(loom_pipeline *pl, int vs, int mb, int part)
{
    int s = stage_of(pl, vs), first = pl->s.stage_first[s], last = pl->s.stage_last[s];
    const loom_pipeline_hooks *h = &pl->s.hooks;
    int rc = use_slot(pl, vs, mb);
    if (rc == LOOM_OK && part != PART_WEIGHT && s < pl->S - 1) {
        float *dout = take_recv(pl, 1, vs, mb);
        size_t count;
        float *grad = loom_model_stream_grad(pl->s.model, &count);
        rc = BK(pl, copy, grad, dout, count * sizeof(float));
        loom_mem_free(dout);
    }
    for (int u = last; rc == LOOM_OK && u >= first; u--) {
        if (part != PART_INPUT && (rc = h->before_backward(h->ctx, u)) != LOOM_OK)
            break;
        if (part == PART_BOTH)
            rc = loom_model_backward(pl->s.model, u, pl->dloss);
        else if (part == PART_INPUT)
            rc = loom_model_backward_input(pl->s.model, u, pl->dloss);
        else
            rc = loom_model_backward_weight(pl->s.model, u);
        if (rc == LOOM_OK && part != PART_INPUT)
            rc = weights_done(pl, u);
    }
    if (rc == LOOM_OK && part != PART_WEIGHT && s > 0) {
        /* the input's gradient, kept for the send: later backwards reuse
         * the model's buffer */
        size_t count;
        const float *din = loom_model_stream_grad(pl->s.model, &count);
        void **slot = &pl->grad_out[(size_t)vs * pl->m + (size_t)mb];
        if ((rc = loom_mem_alloc(tier_of(pl), LOOM_PURPOSE_COMM, count * sizeof(float), slot)) ==
            LOOM_OK)
            rc = BK(pl, copy, *slot, din, count * sizeof(float));
    }
    if (rc == LOOM_OK && part != PART_INPUT)
        chunk_done(pl, vs, mb);
    return rc;
}

static int send_activation(loom_pipeline *pl, int vs, int mb)
{
    int s = stage_of(pl, vs);
    int rc = use_slot(pl, vs, mb);
    size_t count;
    loom_dtype dtype;
    const void *out = loom_model_stream(pl->s.model, pl->s.stage_last[s] + 1, &count, &dtype);
    size_t bytes = count * loom_dtype_size(dtype);
    void *buf = NULL;
    if (rc == LOOM_OK && (rc = loom_mem_alloc(tier_of(pl), LOOM_PURPOSE_COMM, bytes, &buf)) ==
                             LOOM_OK && (rc = BK(pl, copy, buf, out, bytes)) == LOOM_OK) {
        rc = post_send(pl, buf, count, dtype, next_rank(pl), tag_of(pl, 0, s + 1, mb));
    }
    return rc;
}

static int send_gradient(loom_pipeline *pl, int vs, int mb)
{
    int s = stage_of(pl, vs);
    void **slot = &pl->grad_out[(size_t)vs * pl->m + (size_t)mb];
    void *buf = *slot;
    *slot = NULL;
    return post_send(pl, buf, pl->grad_count, LOOM_F32, prev_rank(pl), tag_of(pl, 1, s - 1, mb));
}

/* ---- the tied embedding ---- */

/* unit 0's gradient += the head's share of it (n elements of the compute
 * dtype), rounded once to that dtype. */
static int add_head_share(loom_pipeline *pl, void *share, size_t n)
{
    if (pl->s.dtype == LOOM_F32)
        return BK(pl, accumulate, pl->units[0].grads, LOOM_F32, share, n);
    float *wide = NULL;
    int rc = loom_mem_alloc(tier_of(pl), LOOM_PURPOSE_COMM, n * sizeof(float), (void **)&wide);
    if (rc == LOOM_OK && (rc = BK(pl, convert, wide, LOOM_F32, share, pl->s.dtype, n)) == LOOM_OK)
        rc = BK(pl, accumulate, pl->units[0].grads, pl->s.dtype, wide, n);
    loom_mem_free(wide);
    return rc;
}

static int exchange_tied_grads(loom_pipeline *pl)
{
    size_t n = pl->units[0].numel, bytes = n * loom_dtype_size(pl->s.dtype);
    loom_request *req = NULL;
    int rc = LOOM_OK;
    if (pl->holds_last) {
        if ((rc = C->send(pl->s.group, pl->tied_grads, n, pl->s.dtype, 0, tied_tag(pl, 0),
                          &req)) == LOOM_OK)
            rc = C->wait(req);
        int zeroed = BK(pl, zero, pl->tied_grads, bytes);
        return rc != LOOM_OK ? rc : zeroed;
    }
    if (!pl->holds_first)
        return LOOM_OK;
    void *head_share = NULL;
    if ((rc = loom_mem_alloc(tier_of(pl), LOOM_PURPOSE_COMM, bytes, &head_share)) != LOOM_OK)
        return rc;
    int last_rank = (pl->S - 1) % pl->p;
    if ((rc = C->recv(pl->s.group, head_share, n, pl->s.dtype, last_rank, tied_tag(pl, 0), &req)) ==
        LOOM_OK)
        rc = C->wait(req);
    if (rc == LOOM_OK)
        rc = add_head_share(pl, head_share, n);
    loom_mem_free(head_share);
    if (rc == LOOM_OK)
        rc = pl->s.hooks.grads_ready(pl->s.hooks.ctx, 0, 1);
    return rc;
}

int loom_pipeline_sync_tied(loom_pipeline *pl)
{
    size_t n = pl->units[0].numel;
    if (!pl->holds_first && !pl->holds_last)
        return LOOM_OK; /* a stage between holds no tied weights */
    loom_request *req = NULL;
    int rc;
    if (pl->holds_first)
        rc = C->send(pl->s.group, pl->units[0].params, n, pl->s.dtype, (pl->S - 1) % pl->p,
                     tied_tag(pl, 1), &req);
    else
        rc = C->recv(pl->s.group, pl->tied_params, n, pl->s.dtype, 0, tied_tag(pl, 1), &req);
    return rc == LOOM_OK ? C->wait(req) : rc;
}

/* ---- a step ---- */

int loom_pipeline_step(loom_pipeline *pl, int *const *inputs, int *const *targets, float dloss,
                       double *loss_sum)
{
    uint64_t t0 = loom_now_ns();
    pl->inputs = inputs;
    pl->targets = targets;
    pl->dloss = dloss;
    pl->loss_sum = 0;
    memset(pl->bw_done, 0, (size_t)(pl->head + 1) * sizeof *pl->bw_done);
    for (int i = 0; i < pl->nactions; i++)
        pl->recv[i].posted = 0;
    double busy = 0;
    int next = 0, rc = post_ahead(pl, 0, &next);
    for (int i = 0; rc == LOOM_OK && i < pl->nactions; i++) {
        loom_action a = pl->actions[i];
        uint64_t start = loom_now_ns();
        loom_flight_issuer("%s mb %d vs %d", loom_action_kind_name(a.kind), (int)a.microbatch,
                           (int)a.virtual_stage);
        switch (a.kind) {
        case LOOM_ACT_RECV_ACTIVATION:
        case LOOM_ACT_RECV_GRADIENT: rc = wait_recv(pl, i); break;
        case LOOM_ACT_SEND_ACTIVATION:
            rc = send_activation(pl, a.virtual_stage, a.microbatch);
            break;
        case LOOM_ACT_SEND_GRADIENT: rc = send_gradient(pl, a.virtual_stage, a.microbatch); break;
        case LOOM_ACT_FORWARD:
            rc = run_forward(pl, a.virtual_stage, a.microbatch);
            trace_action(pl, "forward", a.virtual_stage, a.microbatch, start);
            break;
        case LOOM_ACT_BACKWARD:
        case LOOM_ACT_BACKWARD_INPUT:
        case LOOM_ACT_BACKWARD_WEIGHT: {
            int input = a.kind == LOOM_ACT_BACKWARD_INPUT,
                weight = a.kind == LOOM_ACT_BACKWARD_WEIGHT;
            rc = run_backward(pl, a.virtual_stage, a.microbatch,
                              input ? PART_INPUT : weight ? PART_WEIGHT : PART_BOTH);
            trace_action(pl, input ? "backward-input" : weight ? "backward-weight" : "backward",
                         a.virtual_stage, a.microbatch, start);
            break;
        }
        default: rc = loom_fail(LOOM_ERR_INTERNAL, "pipeline: unknown action kind %d", a.kind);
        }
        if (a.kind <= LOOM_ACT_BACKWARD_WEIGHT)
            busy += (double)(loom_now_ns() - start) / 1e9;
        if (rc == LOOM_OK)
            rc = reap_sends(pl, 0);
        if (rc == LOOM_OK)
            rc = post_ahead(pl, i + 1, &next);
        if (rc != LOOM_OK) {
            char what[160], detail[1024];
            describe(pl, i, what, sizeof what);
            snprintf(detail, sizeof detail, "%s", loom_last_error());
            return loom_fail(rc, "pipeline: %s: %s", what, detail);
        }
    }
    if (rc == LOOM_OK)
        rc = reap_sends(pl, 1);
    if (rc == LOOM_OK)
        rc = exchange_tied_grads(pl);
    pl->stats.busy_s = busy;
    pl->stats.step_s = (double)(loom_now_ns() - t0) / 1e9;
    *loss_sum = pl->loss_sum;
    return rc;
}

/* Forward only, outside the schedule: each micro-batch through this
 * rank's stages in stage order, receiving a stage's input when it is due
 * and sending its output at once. Every rank walks (micro-batch, stage)
 * in the same order and sends never block, so each receive's send has
 * run or will run without waiting on it. A receive uses the slot of the
 * schedule's own receive of that input, which is free between steps. */
int loom_pipeline_evaluate(loom_pipeline *pl, int *const *inputs, int *const *targets,
                           double *loss_sum)
{
    pl->inputs = inputs;
    pl->targets = targets;
    pl->loss_sum = 0;
    int rc = LOOM_OK;
    for (int mb = 0; rc == LOOM_OK && mb < pl->m; mb++)
        for (int vs = 0; rc == LOOM_OK && vs < pl->v; vs++) {
            int s = stage_of(pl, vs);
            if (s > 0) {
                int i = *recv_index(pl, 0, vs, mb);
                if ((rc = post_recv(pl, i)) != LOOM_OK || (rc = wait_recv(pl, i)) != LOOM_OK)
                    break;
            }
            if ((rc = run_forward(pl, vs, mb)) == LOOM_OK && s < pl->S - 1)
                rc = send_activation(pl, vs, mb);
            chunk_done(pl, vs, mb);
            if (rc == LOOM_OK)
                rc = reap_sends(pl, 0);
        }
    if (rc == LOOM_OK)
        rc = reap_sends(pl, 1);
    *loss_sum = pl->loss_sum;
    if (rc == LOOM_OK)
        return LOOM_OK;
    char detail[1024];
    snprintf(detail, sizeof detail, "%s", loom_last_error());
    return loom_fail(rc, "pipeline: validation: %s", detail);
}

void loom_pipeline_get_stats(const loom_pipeline *pl, loom_pipeline_stats *out)
{
    *out = pl->stats;
}
