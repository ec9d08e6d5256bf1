/* An out-of-tree data strategy for loom: a parameter server.
 *
 * The classic design (DistBelief, ps-lite): workers compute gradients and
 * push them to a server, the server runs the optimizer, and the workers
 * pull the new parameters back. Here every dp rank is a worker, and
 *   servers = "one"      dp rank 0 serves every parameter;
 *   servers = "sharded"  dp rank r serves the r-th contiguous 1/N of every
 *                        unit's flat buffer (ps-lite's key ranges).
 * Only a server holds optimizer state — Adam's m and v and, in 16-bit runs,
 * fp32 master weights — and only for the ranges it serves: with "one" rank
 * 0 holds all of it and the other ranks none, with "sharded" each rank
 * 1/N. Parameters and gradients come from host->mem_alloc; the optimizer
 * state from the core's tiered service (ABI 1.4), one segment per unit, so
 * memory.offload.optimizer can move it to another tier (ZeRO-Offload) and
 * the optimizer step streams it: read unit i+1 ahead, step unit i, write
 * it back behind. In host memory, the default, a segment is used in place
 * and that costs nothing. Either way the accounting shows the bytes under
 * their purpose: the progress line and --metrics give rank 0's, LOOM_LOG=
 * debug each rank's share.
 *
 * The hooks, in the order the core calls them in a step:
 *   data_grads_ready ...... on a step's last micro-batch, push: the unit's
 *                           gradients averaged onto each range's server
 *                           (non-blocking reduces, posted during backward)
 *   data_finish_backward .. wait for every push
 *   data_grad_norm_sq ..... each server sums the squares of what it serves
 *                           and an all-reduce adds them up: every rank gets
 *                           the same global norm, as clipping needs
 *   data_optimizer_step ... each server steps AdamW on its ranges, then
 *                           pull: each range broadcast from its server
 *   data_zero_grads ....... a step the core skips (fp16 overflow)
 *   data_get_state, data_set_state: checkpoints
 * Earlier micro-batches only accumulate locally (the model adds into the
 * gradients), so train.grad_accum > 1 needs nothing more.
 *
 * Built against an installed loom with its CMake helper (CMakeLists.txt
 * here); train with `--set parallel.dp.strategy=/path/to/
 * libloom-strategy-paramserver.so --set parallel.dp.servers=sharded`. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <loom/strategy.h>

/* The core checks the value against .allowed before create (and says
 * where in the config a wrong one is), so create need not. */
static const loom_setting_spec paramserver_settings[] = {
    {.name = "servers", .type = LOOM_SETTING_STRING, .default_value = "one",
     .help = "who serves the parameters: one (dp rank 0) or sharded (every dp rank 1/N)",
     .allowed = (const char *const[]){"one", "sharded", NULL}},
    {0},
};

/* What this rank serves of one unit: elements of the unit's flat buffer. */
typedef struct served_part {
    size_t begin, count;
} served_part;

/* The optimizer state of what a rank serves, one tiered buffer each. */
enum { MASTER, M, V, NSTATE };
static const char *const state_labels[NSTATE] = {"paramserver master", "paramserver m",
                                                 "paramserver v"};

struct loom_strategy {
    const loom_host *host;
    const loom_comm_api *comm;
    loom_group *dp;
    int rank, ranks;
    int sharded;

    loom_unit *units;
    int nunits;
    served_part *served; /* per unit */
    char *pushed;   /* per unit: pushed on this step's last micro-batch */
    loom_dtype dtype;
    size_t esize, numel; /* all units' elements */
    void *params, *grads; /* every unit's, back to back, in compute dtype */
    /* Segment i: unit i's served range, count floats (0 bytes when the
     * rank serves none of it). state[MASTER] is NULL in fp32 runs, where
     * the parameters are their own masters. */
    loom_tiered *state[NSTATE];

    loom_request **inflight; /* posted and not yet waited for */
    int ninflight, capacity;
    int broken; /* a collective failed: the dp group is unusable */
};

/* The range of a unit of n elements that dp rank r serves. Every rank
 * computes every rank's range, so all of them post the same collectives. */
static void range_of(const loom_strategy *s, size_t n, int r, size_t *begin, size_t *count)
{
    if (!s->sharded) {
        *begin = 0;
        *count = r == 0 ? n : 0;
        return;
    }
    *begin = n * (size_t)r / (size_t)s->ranks;
    *count = n * (size_t)(r + 1) / (size_t)s->ranks - *begin;
}

/* ---------------------------------------------------------- collectives */

typedef enum { PUSH, PULL } direction;

/* For every server's range of buf (a unit's n elements of dtype t): PUSH
 * averages the range onto its server (in place; only the server's copy is
 * the average afterwards), PULL broadcasts it from the server. Posted, not
 * waited for: every rank of the dp group must post collectives in the same
 * order, which holds because all ranks walk the same units and ranges. */
static int post(loom_strategy *s, direction d, void *buf, size_t n, loom_dtype t)
{
    for (int r = 0; r < s->ranks; r++) {
        size_t begin, count;
        range_of(s, n, r, &begin, &count);
        if (count == 0) /* legal, but it would only add calls */
            continue;
        if (s->ninflight == s->capacity) /* a hook order data_setup did not plan for */
            return s->host->error(s->host, LOOM_ERR_INTERNAL,
                                  "paramserver: more than %d collectives in flight", s->capacity);
        void *range = (char *)buf + begin * loom_dtype_size(t);
        loom_request *req = NULL;
        int rc = d == PUSH ? s->comm->reduce(s->dp, range, range, count, t, LOOM_AVG, r, &req)
                           : s->comm->broadcast(s->dp, range, count, t, r, &req);
        if (rc != LOOM_OK) {
            s->broken = 1;
            return rc; /* the core's detail names the op and the group */
        }
        s->inflight[s->ninflight++] = req;
    }
    return LOOM_OK;
}

static int wait_all(loom_strategy *s)
{
    for (int k = 0; k < s->ninflight; k++) {
        int rc = s->comm->wait(s->inflight[k]); /* releases the request either way */
        if (rc != LOOM_OK) {
            /* The rest may never complete: waiting for each would take the
             * whole timeout again. destroy keeps their buffers. */
            s->broken = 1;
            return rc;
        }
    }
    s->ninflight = 0;
    return LOOM_OK;
}

/* Every hook that communicates starts here. */
static int usable(loom_strategy *s, const char *hook)
{
    if (!s->served)
        return s->host->error(s->host, LOOM_ERR_INVALID, "paramserver: %s before data_setup", hook);
    if (s->broken)
        return s->host->error(s->host, LOOM_ERR_REMOTE,
                              "paramserver: %s after a failed collective on the dp group", hook);
    return LOOM_OK;
}

/* The unit's position in what data_setup was given. The core may pass a
 * copy of the unit, so it is found by its index, not its address. */
static int unit_index(loom_strategy *s, const loom_unit *unit, const char *hook)
{
    for (int i = 0; unit && i < s->nunits; i++)
        if (s->units[i].index == unit->index)
            return i;
    return s->host->error(s->host, LOOM_ERR_INVALID,
                          "paramserver: %s for a unit data_setup was not given", hook);
}

/* ------------------------------------------------------- optimizer state */

/* Starts reading unit i's state ahead of its acquire; nothing when i is
 * past the last unit or the rank serves none of it. */
static int fetch_state(loom_strategy *s, int i)
{
    int rc = LOOM_OK;
    if (i >= s->nunits || s->served[i].count == 0)
        return LOOM_OK;
    for (int k = 0; k < NSTATE && rc == LOOM_OK; k++)
        if (s->state[k])
            rc = s->host->tiered_fetch(s->host, s->state[k], i);
    return rc;
}

/* Unit i's served state in host memory until release_state. part[MASTER]
 * is the parameters themselves in fp32 runs. */
static int acquire_state(loom_strategy *s, int i, float *part[NSTATE])
{
    const loom_host *h = s->host;
    for (int k = 0; k < NSTATE; k++) {
        if (!s->state[k])
            continue;
        int rc = h->tiered_acquire(h, s->state[k], i, LOOM_TIERED_READ, (void **)&part[k]);
        if (rc != LOOM_OK) {
            while (--k >= 0) /* give back what was acquired */
                if (s->state[k])
                    h->tiered_release(h, s->state[k], i, 0);
            return rc;
        }
    }
    if (!s->state[MASTER])
        part[MASTER] = (float *)s->units[i].params + s->served[i].begin;
    return LOOM_OK;
}

/* dirty: it was written, and goes back to its tier (behind the caller). */
static int release_state(loom_strategy *s, int i, int dirty)
{
    int rc = LOOM_OK;
    for (int k = 0; k < NSTATE; k++)
        if (s->state[k]) {
            int released = s->host->tiered_release(s->host, s->state[k], i, dirty);
            if (rc == LOOM_OK)
                rc = released;
        }
    return rc;
}

/* --------------------------------------------------------------- common */

static int paramserver_create(const loom_host *host, const loom_strategy_setup *setup,
                              loom_strategy **out)
{
    if (setup->axis != LOOM_AXIS_DP || !setup->groups[LOOM_AXIS_DP])
        return host->error(host, LOOM_ERR_INVALID,
                           "paramserver: a data strategy (parallel.dp.strategy), created for "
                           "axis %s", loom_axis_name(setup->axis));
    /* The tiered service came with ABI 1.4; an older core has a shorter table. */
    if (host->struct_size < offsetof(loom_host, tiered_release) + sizeof host->tiered_release ||
        !host->tiered_release)
        return host->error(host, LOOM_ERR_NOT_SUPPORTED,
                           "paramserver: needs the core's tiered service (loom_host version 3, "
                           "ABI 1.4) for its optimizer state; this loom is older: build the "
                           "plugin against the loom that runs it");
    const char *servers = NULL;
    int rc = host->config_string(host, "servers", &servers);
    if (rc != LOOM_OK)
        return rc;
    loom_strategy *s = calloc(1, sizeof *s);
    if (!s)
        return host->error(host, LOOM_ERR_NO_MEMORY, "paramserver: out of memory");
    s->host = host;
    s->comm = host->comm;
    s->dp = setup->groups[LOOM_AXIS_DP];
    s->rank = s->comm->rank(s->dp);
    s->ranks = s->comm->size(s->dp);
    s->sharded = strcmp(servers, "sharded") == 0;
    *out = s;
    return LOOM_OK;
}

static int paramserver_destroy(loom_strategy *s)
{
    const loom_host *h = s->host;
    if (s->broken) {
        /* A backend may still write into these: leak rather than free. */
        h->log(h, LOOM_LOG_WARN, "keeping the parameter and gradient buffers: collectives "
               "may still be in flight after a failure");
    } else {
        if (s->params)
            h->mem_free(h, s->params);
        if (s->grads)
            h->mem_free(h, s->grads);
    }
    for (int k = 0; k < NSTATE; k++)
        if (s->state[k])
            h->tiered_free(h, s->state[k]);
    free(s->served);
    free(s->pushed);
    free(s->inflight);
    free(s);
    return LOOM_OK;
}

static int paramserver_describe(const loom_strategy *s, char *buf, size_t cap)
{
    if (s->sharded)
        snprintf(buf, cap, "paramserver over %d ranks, sharded: each serves 1/%d of every unit",
                 s->ranks, s->ranks);
    else
        snprintf(buf, cap, "paramserver over %d ranks, one server (dp rank 0)", s->ranks);
    return LOOM_OK;
}

/* ------------------------------------------------------------ data axis */

static int paramserver_data_setup(loom_strategy *s, loom_unit *units, int nunits,
                                  float *const *init)
{
    const loom_host *h = s->host;
    if (s->served || nunits <= 0)
        return h->error(h, LOOM_ERR_INVALID, "paramserver: data_setup twice or without units");
    s->dtype = units[0].compute_dtype;
    s->esize = loom_dtype_size(s->dtype);
    for (int i = 0; i < nunits; i++)
        if (units[i].compute_dtype != s->dtype ||
            (s->dtype != LOOM_F32 && s->dtype != LOOM_BF16 && s->dtype != LOOM_F16))
            return h->error(h, LOOM_ERR_NOT_SUPPORTED,
                            "paramserver: unit %d ('%s') computes in %s; train.precision must "
                            "be one of fp32, bf16, fp16 for every unit", units[i].index,
                            units[i].name, loom_dtype_name(units[i].compute_dtype));
    s->units = units;
    s->nunits = nunits;
    s->capacity = (nunits + 3) * s->ranks; /* one phase's posts at most */
    s->served = calloc((size_t)nunits, sizeof *s->served);
    s->pushed = calloc((size_t)nunits, 1);
    s->inflight = calloc((size_t)s->capacity, sizeof *s->inflight);
    if (!s->served || !s->pushed || !s->inflight)
        return h->error(h, LOOM_ERR_NO_MEMORY, "paramserver: out of memory");

    size_t mine = 0; /* elements this rank serves */
    size_t *bytes = malloc((size_t)nunits * sizeof *bytes); /* each unit's state segment */
    if (!bytes)
        return h->error(h, LOOM_ERR_NO_MEMORY, "paramserver: out of memory");
    for (int i = 0; i < nunits; i++) {
        range_of(s, units[i].numel, s->rank, &s->served[i].begin, &s->served[i].count);
        bytes[i] = s->served[i].count * sizeof(float);
        s->numel += units[i].numel;
        mine += s->served[i].count;
    }
    /* Every rank holds whole parameters and gradients (a worker computes
     * with all of them); optimizer state only for what it serves. A rank
     * that serves nothing still has the (empty) buffers: the core refuses
     * memory.offload.optimizer on a rank that placed nothing through it. */
    int masters = s->dtype != LOOM_F32, rc;
    void *params = NULL, *grads = NULL;
    rc = h->mem_alloc(h, LOOM_TIER_HOST, LOOM_PURPOSE_PARAMS, s->numel * s->esize, &params);
    s->params = params;
    if (rc == LOOM_OK)
        rc = h->mem_alloc(h, LOOM_TIER_HOST, LOOM_PURPOSE_GRADS, s->numel * s->esize, &grads);
    s->grads = grads;
    for (int k = masters ? MASTER : M; rc == LOOM_OK && k < NSTATE; k++)
        rc = h->tiered_alloc(h, LOOM_PURPOSE_OPTIMIZER, state_labels[k], nunits, bytes,
                             &s->state[k]);
    free(bytes);
    if (rc != LOOM_OK)
        return rc; /* the core's detail says what it could not get; destroy frees the rest */
    memset(s->grads, 0, s->numel * s->esize); /* the ABI: gradients start at zero */

    size_t offset = 0;
    for (int i = 0; i < nunits && rc == LOOM_OK; i++) {
        loom_unit *u = &units[i];
        served_part *sv = &s->served[i];
        u->params = (char *)s->params + offset * s->esize;
        u->grads = (char *)s->grads + offset * s->esize;
        offset += u->numel;
        if (u->numel)
            loom_from_f32(u->params, s->dtype, init[i], u->numel);
        if (!masters || sv->count == 0)
            continue; /* m and v start at zero, as tiered_alloc gives them */
        float *master = NULL; /* all of it written: OVERWRITE reads nothing */
        rc = h->tiered_acquire(h, s->state[MASTER], i, LOOM_TIERED_OVERWRITE, (void **)&master);
        if (rc == LOOM_OK) {
            memcpy(master, init[i] + sv->begin, sv->count * sizeof(float));
            rc = h->tiered_release(h, s->state[MASTER], i, 1);
        }
    }
    if (rc != LOOM_OK)
        return rc;
    h->log(h, LOOM_LOG_DEBUG, "serves %zu of %zu parameters: %zu bytes of optimizer state",
           mine, s->numel, (size_t)(2 + masters) * mine * sizeof(float));
    return LOOM_OK;
}

static int paramserver_data_grads_ready(loom_strategy *s, loom_unit *unit, int last_micro)
{
    /* The core reports a unit once its gradient is complete (the
     * embedding last, after the tied LM head has added into it), so the
     * push can start at once. Earlier micro-batches accumulate locally. */
    int rc = usable(s, "data_grads_ready"), i;
    if (rc != LOOM_OK || !last_micro)
        return rc;
    if ((i = unit_index(s, unit, "data_grads_ready")) < 0)
        return i;
    if (s->pushed[i])
        return s->host->error(s->host, LOOM_ERR_INVALID,
                              "paramserver: unit %d ('%s') reported twice on the last "
                              "micro-batch", unit->index, unit->name);
    s->pushed[i] = 1;
    return post(s, PUSH, s->units[i].grads, s->units[i].numel, s->dtype);
}

static int paramserver_data_finish_backward(loom_strategy *s)
{
    int rc = usable(s, "data_finish_backward");
    /* A unit not reported (none should be) is pushed now, in unit order. */
    for (int i = 0; rc == LOOM_OK && i < s->nunits; i++)
        if (!s->pushed[i]) {
            s->pushed[i] = 1;
            rc = post(s, PUSH, s->units[i].grads, s->units[i].numel, s->dtype);
        }
    return rc == LOOM_OK ? wait_all(s) : rc;
}

static int paramserver_data_grad_norm_sq(loom_strategy *s, double *out)
{
    int rc = usable(s, "data_grad_norm_sq");
    if (rc != LOOM_OK)
        return rc;
    /* Only a server's copy of its ranges is the average. */
    double sum = 0;
    for (int i = 0; i < s->nunits; i++)
        for (size_t k = 0; k < s->served[i].count; k++) {
            double g = loom_load_f32(s->units[i].grads, s->dtype, s->served[i].begin + k);
            sum += g * g;
        }
    loom_request *req = NULL;
    rc = s->comm->allreduce(s->dp, &sum, out, 1, LOOM_F64, LOOM_SUM, &req);
    return rc == LOOM_OK ? s->comm->wait(req) : rc;
}

static void zero_grads(loom_strategy *s)
{
    memset(s->grads, 0, s->numel * s->esize);
    memset(s->pushed, 0, (size_t)s->nunits);
}

static int paramserver_data_optimizer_step(loom_strategy *s, const loom_optimizer_step *step)
{
    int rc = usable(s, "data_optimizer_step");
    if (rc != LOOM_OK)
        return rc;
    /* Streamed unit by unit: unit i+1's state is read while unit i steps,
     * and each is written back behind (in host memory none of it costs). */
    rc = fetch_state(s, 0);
    for (int i = 0; rc == LOOM_OK && i < s->nunits; i++) {
        served_part *sv = &s->served[i];
        if (sv->count == 0)
            continue;
        float *part[NSTATE];
        if ((rc = fetch_state(s, i + 1)) != LOOM_OK || (rc = acquire_state(s, i, part)) != LOOM_OK)
            break;
        /* update_range applies step->grad_scale (clipping and the loss
         * scale) to the gradients first: never scale them here as well. It
         * is told where the range lies in the unit, so that the core can
         * decay only the tensors train.decay names; a loom older than ABI
         * 1.6 (host version 4) has only update, which decays them all. */
        const char *grad = (const char *)s->units[i].grads + sv->begin * s->esize;
        if (s->host->version >= 4)
            step->update_range(step, &s->units[i], sv->begin, part[MASTER], grad, s->dtype,
                               part[M], part[V], sv->count);
        else
            step->update(step, part[MASTER], grad, s->dtype, part[M], part[V], sv->count);
        if (s->dtype != LOOM_F32)
            loom_from_f32((char *)s->units[i].params + sv->begin * s->esize, s->dtype,
                          part[MASTER], sv->count);
        rc = release_state(s, i, 1);
    }
    for (int i = 0; rc == LOOM_OK && i < s->nunits; i++)
        rc = post(s, PULL, s->units[i].params, s->units[i].numel, s->dtype);
    if (rc == LOOM_OK)
        rc = wait_all(s);
    zero_grads(s); /* the ABI: the optimizer step leaves them zeroed */
    return rc;
}

static int paramserver_data_zero_grads(loom_strategy *s)
{
    int rc = usable(s, "data_zero_grads");
    if (rc == LOOM_OK)
        rc = wait_all(s); /* never clear memory a backend may still write */
    if (rc == LOOM_OK)
        zero_grads(s);
    return rc;
}

/* Collective: every dp rank gets the whole unit's fp32 state, each range
 * broadcast from its server. The core passes the same arrays (or NULLs) on
 * every rank, so all post the same broadcasts. */
static int paramserver_data_get_state(loom_strategy *s, loom_unit *unit, float *params, float *m,
                                      float *v)
{
    int rc = usable(s, "data_get_state"), i;
    if (rc != LOOM_OK)
        return rc;
    if ((i = unit_index(s, unit, "data_get_state")) < 0)
        return i;
    served_part *sv = &s->served[i];
    float *part[NSTATE], *whole[NSTATE] = {params, m, v};
    if (sv->count) { /* copied out, so no collective sees a segment */
        if ((rc = acquire_state(s, i, part)) != LOOM_OK)
            return rc;
        for (int k = 0; k < NSTATE; k++)
            if (whole[k])
                memcpy(whole[k] + sv->begin, part[k], sv->count * sizeof(float));
        if ((rc = release_state(s, i, 0)) != LOOM_OK)
            return rc;
    }
    for (int k = 0; k < NSTATE && rc == LOOM_OK; k++)
        if (whole[k])
            rc = post(s, PULL, whole[k], s->units[i].numel, LOOM_F32);
    int waited = wait_all(s);
    return rc != LOOM_OK ? rc : waited;
}

/* Not collective: every rank is given the whole arrays and keeps its part. */
static int paramserver_data_set_state(loom_strategy *s, loom_unit *unit, const float *params,
                                      const float *m, const float *v)
{
    int i = unit_index(s, unit, "data_set_state");
    if (i < 0)
        return i;
    served_part *sv = &s->served[i];
    if (params)
        loom_from_f32(s->units[i].params, s->dtype, params, s->units[i].numel);
    if (sv->count == 0)
        return LOOM_OK;
    float *part[NSTATE];
    const float *whole[NSTATE] = {params, m, v};
    int rc = acquire_state(s, i, part);
    if (rc != LOOM_OK)
        return rc;
    for (int k = 0; k < NSTATE; k++)
        if (whole[k] && s->state[k]) /* fp32: the masters are the parameters, set above */
            memcpy(part[k], whole[k] + sv->begin, sv->count * sizeof(float));
    return release_state(s, i, 1);
}

LOOM_PLUGIN_EXPORT const loom_strategy_plugin_v1_t loom_strategy_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_STRATEGY, loom_strategy_plugin_v1_t, "paramserver",
                                 "data parallel: gradients pushed to parameter servers, which "
                                 "step and broadcast the parameters back",
                                 paramserver_settings),
    .axis = LOOM_AXIS_DP,
    .create = paramserver_create,
    .destroy = paramserver_destroy,
    .describe = paramserver_describe,
    .data_setup = paramserver_data_setup,
    .data_grads_ready = paramserver_data_grads_ready,
    .data_finish_backward = paramserver_data_finish_backward,
    .data_grad_norm_sq = paramserver_data_grad_norm_sq,
    .data_optimizer_step = paramserver_data_optimizer_step,
    .data_zero_grads = paramserver_data_zero_grads,
    .data_get_state = paramserver_data_get_state,
    .data_set_state = paramserver_data_set_state,
};
