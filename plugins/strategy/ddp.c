/* ddp — the data-parallel strategy of PyTorch's DistributedDataParallel.
 *
 * Every dp rank keeps the whole model: parameters, gradients, Adam state and
 * (for 16-bit runs) fp32 master weights. Gradients live in one flat buffer
 * laid out in backward order (the last unit first), cut into buckets of
 * consecutive units; on the last micro-batch of a step each bucket is
 * averaged over the dp group with a non-blocking all-reduce as soon as all of
 * its units have reported, so communication overlaps the rest of the
 * backward. After the average every rank holds the same gradient and steps
 * the same way, so parameters stay replicated without further traffic. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/opt_state.h"
#include "common/reduce.h"
#include "common/strategy_common.h"
#include "loom/strategy.h"

#define MIB (1024.0 * 1024.0)

static const loom_setting_spec ddp_settings[] = {
    {.name = "bucket_mb", .type = LOOM_SETTING_FLOAT, .default_value = "25",
     .help = "gradient bytes per all-reduce bucket, in MiB (a bucket closes once it reaches this)",
     .bounds = LOOM_SETTING_MIN, .min = 0},
    {.name = "overlap", .type = LOOM_SETTING_BOOL, .default_value = "true", .help =
     "all-reduce each bucket as soon as it is complete during backward (false: all at the end)"},
    {0},
};

/* A run of consecutive units in backward order, reduced by one all-reduce. */
typedef struct ddp_bucket {
    size_t offset;      /* elements into the flat buffers */
    size_t count;       /* elements */
    int nunits;
    int ready;          /* units reported on the last micro-batch of this step */
    int posted;
    int done;
    loom_request *req;  /* while posted and not done; NULL once complete */
    uint64_t start_ns;
} ddp_bucket;

/* Where one unit sits. */
typedef struct ddp_slot {
    size_t offset; /* elements into the flat buffers */
    int bucket;
    int ready;     /* reported on the last micro-batch of this step */
} ddp_slot;

struct loom_strategy {
    const loom_host *host;
    loom_strategy_setup setup;
    loom_group *dp;
    int dp_size;
    double bucket_mb;
    int overlap;

    loom_unit *units;
    int nunits;
    ddp_slot *slots;
    ddp_bucket *buckets;
    int nbuckets;
    int next_post; /* buckets are posted in order, so every rank issues the same sequence */

    loom_dtype dtype;
    size_t esize;
    size_t numel; /* Ψ: elements over all units */
    void *params; /* compute dtype */
    void *grads;  /* compute dtype */
    /* Master weights (16-bit runs; fp32 parameters are their own) and Adam's
     * moments, one segment per unit, where memory.offload puts them. */
    opt_state opt;

    /* What this step's backward has reported so far. */
    int saw_micro;
    int saw_last_micro;
    int failed; /* a reduction failed: in-flight requests are no longer waited for */
};

/* ---------------------------------------------------------- reductions */

static int bucket_completed(loom_strategy *s, int b)
{
    ddp_bucket *bk = &s->buckets[b];
    bk->done = 1;
    bk->req = NULL;
    char name[48];
    snprintf(name, sizeof name, "ddp bucket %d", b);
    s->host->trace(s->host, LOOM_LANE_COMM, name, bk->start_ns, s->host->now_ns(),
                   (uint64_t)(bk->count * s->esize));
    return strategy_average_end(s->host, (char *)s->grads + bk->offset * s->esize, bk->count,
                                s->dtype, average_prescale(s->dtype, s->dp_size), s->dp_size);
}

static int post_bucket(loom_strategy *s, int b)
{
    ddp_bucket *bk = &s->buckets[b];
    void *range = (char *)s->grads + bk->offset * s->esize;
    bk->start_ns = s->host->now_ns();
    bk->posted = 1;
    loom_redop average = LOOM_AVG;
    int rc = strategy_average_begin(s->host, range, bk->count, s->dtype, s->dp_size, &average);
    if (rc != LOOM_OK) {
        bk->done = 1;
        return rc; /* nothing posted: the group is still whole */
    }
    rc = s->host->comm->allreduce(s->dp, range, range, bk->count, s->dtype, average, &bk->req);
    if (rc != LOOM_OK) { /* the comm layer's detail names the op and the group */
        bk->req = NULL;
        bk->done = 1;
        s->failed = 1;
        return rc;
    }
    return LOOM_OK; /* complete_posted completes it, as every bucket */
}

/* Post, in bucket order, every bucket whose units have all reported. */
static int post_ready(loom_strategy *s)
{
    while (s->next_post < s->nbuckets) {
        ddp_bucket *bk = &s->buckets[s->next_post];
        if (bk->ready < bk->nunits)
            break;
        int rc = post_bucket(s, s->next_post++);
        if (rc != LOOM_OK)
            return rc;
    }
    return LOOM_OK;
}

/* After a failed reduction the dp group is broken and the gradients are
 * not the average: no hook that needs them may go on. */
static int broken(loom_strategy *s)
{
    return s->host->error(s->host, LOOM_ERR_REMOTE,
                          "ddp: an earlier gradient all-reduce on the dp group failed; "
                          "the run cannot continue");
}

/* Notes which posted buckets have completed: those the backend has
 * finished (test), or all of them (wait). After a failure the rest is left
 * alone: each wait could take the whole timeout again, and a test on the
 * failed group would replace the comm layer's detail of the first failure
 * (op, sequence number, the ranks that did not arrive) with a vaguer one. */
static int complete_posted(loom_strategy *s, int wait)
{
    if (s->failed)
        return broken(s);
    for (int b = 0; b < s->next_post; b++) {
        ddp_bucket *bk = &s->buckets[b];
        if (!bk->posted || bk->done)
            continue;
        int rc = wait ? s->host->comm->wait(bk->req) : s->host->comm->test(bk->req);
        if (!wait && rc == LOOM_IN_PROGRESS)
            continue;
        if (rc != LOOM_OK) { /* test and wait release the request either way */
            bk->done = 1;
            bk->req = NULL;
            s->failed = 1;
            return rc; /* the comm layer's detail names the op and the missing ranks */
        }
        if ((rc = bucket_completed(s, b)) != LOOM_OK)
            return rc;
    }
    return LOOM_OK;
}

/* MPI moves data only inside its calls: test what is in flight. */
static int progress(loom_strategy *s) { return complete_posted(s, 0); }

static int wait_posted(loom_strategy *s) { return complete_posted(s, 1); }

static int in_flight(const loom_strategy *s)
{
    int n = 0;
    for (int b = 0; b < s->next_post; b++)
        n += s->buckets[b].posted && !s->buckets[b].done;
    return n;
}

static void reset_step(loom_strategy *s)
{
    for (int b = 0; b < s->nbuckets; b++) {
        s->buckets[b].ready = 0;
        s->buckets[b].posted = 0;
        s->buckets[b].done = 0;
        s->buckets[b].req = NULL;
    }
    for (int i = 0; i < s->nunits; i++)
        s->slots[i].ready = 0;
    s->next_post = 0;
    s->saw_micro = 0;
    s->saw_last_micro = 0;
}

/* ------------------------------------------------------------- common */

static int ddp_create(const loom_host *host, const loom_strategy_setup *setup, loom_strategy **out)
{
    loom_group *dp = NULL;
    int rc = strategy_axis_group(host, setup, "ddp", LOOM_AXIS_DP, &dp);
    if (rc != LOOM_OK)
        return rc;
    double bucket_mb = 25.0;
    int overlap = 1;
    rc = host->config_float(host, "bucket_mb", &bucket_mb);
    if (rc == LOOM_OK)
        rc = host->config_bool(host, "overlap", &overlap);
    if (rc != LOOM_OK)
        return rc;
    if (!(bucket_mb >= 0.0) || !isfinite(bucket_mb))
        return host->error(host, LOOM_ERR_INVALID,
                           "ddp: parallel.dp.bucket_mb = %g must be a size in MiB >= 0 "
                           "(0 puts every unit in its own bucket)",
                           bucket_mb);
    loom_strategy *s = malloc(sizeof *s);
    if (!s)
        return host->error(host, LOOM_ERR_NO_MEMORY, "ddp: out of memory");
    *s = (loom_strategy){.host = host, .setup = *setup, .dp = dp, .dp_size = host->comm->size(dp),
                         .bucket_mb = bucket_mb, .overlap = overlap};
    *out = s;
    return LOOM_OK;
}

static void free_buffers(loom_strategy *s)
{
    const loom_host *h = s->host;
    if (s->params)
        h->mem_free(h, s->params);
    if (s->grads)
        h->mem_free(h, s->grads);
    if (s->opt.host)
        opt_state_free(&s->opt);
    s->params = s->grads = NULL;
    free(s->slots);
    free(s->buckets);
    s->slots = NULL;
    s->buckets = NULL;
}

static int ddp_destroy(loom_strategy *s)
{
    if (!s)
        return LOOM_OK;
    /* The backend may still write into the gradient buffer. */
    int rc = s->buckets && !s->failed ? wait_posted(s) : LOOM_OK;
    if (s->failed) {
        /* A timed-out collective stays posted inside the backend: better to
         * leak the buffer than to free memory it may still write. */
        s->host->log(s->host, LOOM_LOG_WARN,
                     "keeping the gradient buffer (%zu bytes): a reduction failed and "
                     "%d all-reduces may still be in flight",
                     s->numel * s->esize, in_flight(s));
        s->grads = NULL;
    }
    free_buffers(s);
    free(s);
    return rc;
}

static int ddp_describe(const loom_strategy *s, char *buf, size_t cap)
{
    const char *overlap = s->overlap ? "on" : "off";
    if (!s->buckets) {
        snprintf(buf, cap, "ddp over %d ranks, buckets of %g MiB, overlap %s", s->dp_size,
                 s->bucket_mb, overlap);
        return LOOM_OK;
    }
    size_t largest = 0;
    for (int b = 0; b < s->nbuckets; b++)
        if (s->buckets[b].count > largest)
            largest = s->buckets[b].count;
    snprintf(buf, cap, "ddp over %d ranks, %d bucket%s of \u2264 %.3g MiB, overlap %s", s->dp_size,
             s->nbuckets, s->nbuckets == 1 ? "" : "s", (double)(largest * s->esize) / MIB, overlap);
    return LOOM_OK;
}

/* ----------------------------------------------------------- data axis */

/* Unit i's optimizer state until opt_state_release, and its master
 * weights: the state's, or the fp32 parameters themselves. */
static int unit_state(loom_strategy *s, int i, opt_view *st, float **master)
{
    int rc = opt_state_acquire(&s->opt, i, st);
    size_t off = s->slots[i].offset;
    *master = st->master ? st->master : (float *)((char *)s->params + off * s->esize);
    return rc;
}

/* Unit i's master weights from full fp32 values (host memory), and its
 * parameters from them. */
static int set_unit_master(loom_strategy *s, int i, float *master, const float *values)
{
    const loom_host *h = s->host;
    const loom_compute_api *c = strategy_compute(h);
    size_t off = s->slots[i].offset, n = s->units[i].numel;
    int rc = n ? c->to_device(h, master, values, n * sizeof(float)) : LOOM_OK;
    if (rc == LOOM_OK && n && s->dtype != LOOM_F32)
        rc = c->convert(h, (char *)s->params + off * s->esize, s->dtype, master, LOOM_F32, n);
    return rc;
}

static int ddp_data_setup(loom_strategy *s, loom_unit *units, int nunits, float *const *init)
{
    const loom_host *h = s->host;
    if (s->buckets)
        return h->error(h, LOOM_ERR_INVALID, "ddp: data_setup called twice");
    int rc = strategy_check_units(h, "ddp", units, nunits, init,
                                  "one flat gradient buffer needs a single dtype");
    if (rc != LOOM_OK)
        return rc;
    loom_dtype dtype = units[0].compute_dtype;
    s->dtype = dtype;
    s->esize = loom_dtype_size(dtype);
    s->units = units;
    s->nunits = nunits;

    s->slots = calloc((size_t)nunits, sizeof *s->slots);
    s->buckets = calloc((size_t)nunits, sizeof *s->buckets); /* at most one per unit */
    if (!s->slots || !s->buckets) {
        free_buffers(s);
        return h->error(h, LOOM_ERR_NO_MEMORY, "ddp: out of memory");
    }

    /* Backward order: the last unit first, so a bucket is a contiguous range. */
    double limit = s->bucket_mb * MIB;
    size_t offset = 0;
    int nb = 0;
    for (int i = nunits - 1; i >= 0; i--) {
        ddp_bucket *bk = &s->buckets[nb];
        if (bk->nunits == 0)
            bk->offset = offset;
        s->slots[i].offset = offset;
        s->slots[i].bucket = nb;
        offset += units[i].numel;
        bk->count += units[i].numel;
        bk->nunits++;
        if ((double)(bk->count * s->esize) >= limit || i == 0)
            nb++;
    }
    s->nbuckets = nb;
    s->numel = offset;
    if (s->numel == 0) {
        free_buffers(s);
        return h->error(h, LOOM_ERR_INVALID, "ddp: the model has no parameters");
    }

    size_t n = s->numel;
    void *params = NULL, *grads = NULL;
    size_t *elems = malloc((size_t)nunits * sizeof *elems);
    rc = elems ? strategy_alloc_model(h, LOOM_PURPOSE_PARAMS, n * s->esize, &params)
               : h->error(h, LOOM_ERR_NO_MEMORY, "ddp: out of memory");
    s->params = params;
    if (rc == LOOM_OK)
        rc = strategy_alloc_model(h, LOOM_PURPOSE_GRADS, n * s->esize, &grads);
    s->grads = grads;
    for (int i = 0; rc == LOOM_OK && i < nunits; i++)
        elems[i] = units[i].numel;
    if (rc == LOOM_OK)
        rc = opt_state_alloc(&s->opt, h, "ddp", nunits, elems, dtype != LOOM_F32);
    free(elems);
    if (rc != LOOM_OK) {
        free_buffers(s);
        return rc; /* mem_alloc said what it could not get */
    }
    for (int i = 0; i < nunits && rc == LOOM_OK; i++) {
        size_t off = s->slots[i].offset;
        opt_view st;
        float *master = NULL;
        if ((rc = unit_state(s, i, &st, &master)) != LOOM_OK)
            break;
        rc = set_unit_master(s, i, master, init[i]);
        int r2 = opt_state_release(&s->opt, i, 1);
        if (rc == LOOM_OK)
            rc = r2;
        units[i].params = (char *)s->params + off * s->esize;
        units[i].grads = (char *)s->grads + off * s->esize;
        units[i].strategy_data = &s->slots[i];
    }
    if (rc != LOOM_OK) {
        free_buffers(s);
        return rc;
    }
    reset_step(s);
    return LOOM_OK;
}

static int ddp_data_before_backward(loom_strategy *s, loom_unit *unit)
{
    (void)unit;
    return progress(s);
}

static int ddp_data_grads_ready(loom_strategy *s, loom_unit *unit, int last_micro)
{
    const loom_host *h = s->host;
    if (!s->buckets)
        return h->error(h, LOOM_ERR_INVALID, "ddp: data_grads_ready before data_setup");
    int i = strategy_find_unit(s->units, s->nunits, unit);
    if (i < 0)
        return h->error(h, LOOM_ERR_INVALID, "ddp: data_grads_ready for unit %d ('%s'), "
                        "which data_setup was not given", unit->index, strategy_unit_name(unit));
    s->saw_micro = 1;
    /* Accumulating micro-batches stay local, like PyTorch's no_sync. */
    if (!last_micro)
        return progress(s);
    s->saw_last_micro = 1;
    ddp_slot *slot = &s->slots[i];
    if (slot->ready)
        return h->error(h, LOOM_ERR_INVALID,
                        "ddp: unit '%s' reported its gradients twice on the last micro-batch",
                        strategy_unit_name(unit));
    slot->ready = 1;
    s->buckets[slot->bucket].ready++;
    int rc = progress(s);
    if (rc == LOOM_OK && s->overlap)
        rc = post_ready(s);
    return rc;
}

static int ddp_data_finish_backward(loom_strategy *s)
{
    if (!s->buckets)
        return s->host->error(s->host, LOOM_ERR_INVALID, "ddp: data_finish_backward before data_setup");
    /* Called after a micro-batch that was not the last: the accumulation
     * continues, nothing to reduce yet. */
    if (s->saw_micro && !s->saw_last_micro)
        return progress(s);
    if (s->failed)
        return broken(s);
    int rc = LOOM_OK;
    while (rc == LOOM_OK && s->next_post < s->nbuckets)
        rc = post_bucket(s, s->next_post++);
    int wrc = wait_posted(s);
    if (rc != LOOM_OK || wrc != LOOM_OK)
        return rc != LOOM_OK ? rc : wrc; /* in-flight requests stay known to destroy */
    reset_step(s);
    return LOOM_OK;
}

/* The hooks that read gradients need this step's average. */
static int need_finished(loom_strategy *s, const char *hook)
{
    return strategy_need_finished(s->host, "ddp", hook, s->buckets != NULL, s->saw_last_micro,
                                  "averaged");
}

static int ddp_data_grad_norm_sq(loom_strategy *s, double *out)
{
    int rc = need_finished(s, "data_grad_norm_sq");
    if (rc != LOOM_OK)
        return rc;
    /* Gradients are replicated after the average: the local sum is the global one. */
    double sum = 0.0;
    rc = strategy_compute(s->host)->sum_squares(s->host, s->grads, s->dtype, s->numel, &sum);
    if (rc == LOOM_OK)
        *out = sum;
    return rc;
}

static int ddp_data_zero_grads(loom_strategy *s)
{
    if (!s->buckets)
        return LOOM_OK;
    /* Never clear memory the backend may still be writing. */
    int rc = wait_posted(s);
    if (rc != LOOM_OK)
        return rc;
    reset_step(s);
    return strategy_compute(s->host)->zero(s->host, s->grads, s->numel * s->esize);
}

static int ddp_data_optimizer_step(loom_strategy *s, const loom_optimizer_step *step)
{
    const loom_host *h = s->host;
    int rc = need_finished(s, "data_optimizer_step");
    if (rc != LOOM_OK)
        return rc;
    if (!step || !step->update_range)
        return h->error(h, LOOM_ERR_INVALID, "ddp: data_optimizer_step without an update function");
    rc = wait_posted(s);
    if (rc != LOOM_OK)
        return rc;
    /* Streamed unit by unit: the next unit's state is read while this one
     * steps, and each is written back behind (free in host memory). */
    rc = s->nunits ? opt_state_fetch(&s->opt, 0) : LOOM_OK;
    for (int i = 0; i < s->nunits && rc == LOOM_OK; i++) {
        size_t off = s->slots[i].offset, n = s->units[i].numel;
        if (i + 1 < s->nunits && (rc = opt_state_fetch(&s->opt, i + 1)) != LOOM_OK)
            break;
        opt_view st;
        float *master = NULL;
        if ((rc = unit_state(s, i, &st, &master)) != LOOM_OK)
            break;
        strategy_update_store(s->host, step, &s->units[i], 0, master,
                              (const char *)s->grads + off * s->esize, st.m, st.v, n,
                              (char *)s->params + off * s->esize, s->dtype);
        rc = opt_state_release(&s->opt, i, 1);
    }
    if (rc != LOOM_OK)
        return rc;
    return strategy_compute(h)->zero(h, s->grads, s->numel * s->esize);
}

/* Replicated state: every dp rank already holds all of it, so checkpointing
 * needs no communication. */
static int state_slot(loom_strategy *s, const loom_unit *unit, const char *hook)
{
    int i = s->buckets ? strategy_find_unit(s->units, s->nunits, unit) : -1;
    if (i < 0)
        return s->host->error(s->host, LOOM_ERR_INVALID,
                              "ddp: %s for unit %d ('%s'), which data_setup was not given", hook,
                              unit->index, strategy_unit_name(unit));
    return i;
}

static int ddp_data_get_state(loom_strategy *s, loom_unit *unit, float *params, float *m, float *v)
{
    int i = state_slot(s, unit, "data_get_state");
    if (i < 0)
        return i;
    size_t bytes = s->units[i].numel * sizeof(float);
    opt_view st;
    float *master = NULL;
    int rc = unit_state(s, i, &st, &master);
    if (rc != LOOM_OK)
        return rc;
    const loom_compute_api *c = strategy_compute(s->host);
    if (params)
        rc = c->to_host(s->host, params, master, bytes);
    if (m && rc == LOOM_OK)
        rc = c->to_host(s->host, m, st.m, bytes);
    if (v && rc == LOOM_OK)
        rc = c->to_host(s->host, v, st.v, bytes);
    int r2 = opt_state_release(&s->opt, i, 0);
    return rc != LOOM_OK ? rc : r2;
}

static int ddp_data_set_state(loom_strategy *s, loom_unit *unit, const float *params,
                              const float *m, const float *v)
{
    int i = state_slot(s, unit, "data_set_state");
    if (i < 0)
        return i;
    size_t bytes = s->units[i].numel * sizeof(float);
    opt_view st;
    float *master = NULL;
    int rc = unit_state(s, i, &st, &master);
    if (rc != LOOM_OK)
        return rc;
    const loom_compute_api *c = strategy_compute(s->host);
    if (params)
        rc = set_unit_master(s, i, master, params);
    if (m && rc == LOOM_OK)
        rc = c->to_device(s->host, st.m, m, bytes);
    if (v && rc == LOOM_OK)
        rc = c->to_device(s->host, st.v, v, bytes);
    int r2 = opt_state_release(&s->opt, i, 1);
    return rc != LOOM_OK ? rc : r2;
}

LOOM_PLUGIN_EXPORT const loom_strategy_plugin_v1_t loom_strategy_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_STRATEGY, loom_strategy_plugin_v1_t, "ddp",
                                 "data parallel: replicated model, bucketed gradient all-reduce "
                                 "overlapping backward",
                                 ddp_settings),
    .axis = LOOM_AXIS_DP,
    .create = ddp_create,
    .destroy = ddp_destroy,
    .describe = ddp_describe,
    .data_setup = ddp_data_setup,
    .data_before_backward = ddp_data_before_backward,
    .data_grads_ready = ddp_data_grads_ready,
    .data_finish_backward = ddp_data_finish_backward,
    .data_grad_norm_sq = ddp_data_grad_norm_sq,
    .data_optimizer_step = ddp_data_optimizer_step,
    .data_zero_grads = ddp_data_zero_grads,
    .data_get_state = ddp_data_get_state,
    .data_set_state = ddp_data_set_state,
};
