/* tp — Megatron-LM's tensor parallelism, with its sequence parallelism.
 *
 * The model declares how each parameter may be split and marks the borders
 * of its tensor-parallel regions (docs/parallelism.md); this strategy cuts the
 * slices and supplies Megatron's two border operators:
 *   f (entering a region)  identity        conjugate: all-reduce
 *   g (leaving a region)   all-reduce      conjugate: identity
 * With sequence_parallel (Korthikanti et al., 2022) the LayerNorm and
 * residual regions keep only this rank's share of the token rows, and the
 * borders become
 *   f  all-gather of the rows      conjugate: reduce-scatter
 *   g  reduce-scatter of the rows  conjugate: all-gather
 * which moves the same bytes as the all-reduces (an all-reduce is a
 * reduce-scatter and an all-gather) and splits the activations between
 * the regions t ways. Rows split in rank order: rank r holds rows
 * r*R .. r*R+R-1 of the N = t*R token rows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strategy_common.h"
#include "loom/strategy.h"

static const loom_setting_spec tp_settings[] = {
    {.name = "sequence_parallel", .type = LOOM_SETTING_BOOL, .default_value = "false",
     .help = "split the LayerNorm/residual regions along the token rows (Megatron sequence "
     "parallelism): all-gather and reduce-scatter at the borders instead of all-reduce"},
    {0},
};

struct loom_strategy {
    const loom_host *host;
    loom_group *tp;
    int size, rank;
    int sequence_parallel;
    int failed; /* a border collective failed: the group is no longer usable */
};

static const char *region_name(loom_region r)
{
    switch (r) {
    case LOOM_REGION_ATTENTION: return "attention";
    case LOOM_REGION_MLP: return "mlp";
    case LOOM_REGION_VOCAB: return "vocab";
    }
    return "?";
}

static int tp_create(const loom_host *host, const loom_strategy_setup *setup, loom_strategy **out)
{
    loom_group *g = NULL;
    int rc = strategy_axis_group(host, setup, "tp", LOOM_AXIS_TP, &g);
    if (rc != LOOM_OK)
        return rc;
    int sp = 0;
    if ((rc = host->config_bool(host, "sequence_parallel", &sp)) != LOOM_OK)
        return rc;
    int t = host->comm->size(g);
    /* Megatron's requirements: whole heads per rank, and the MLP and the
     * padded vocabulary in equal slices. */
    if (setup->heads % t != 0)
        return host->error(host, LOOM_ERR_INVALID,
                           "tp: parallel.tp.size = %d does not divide model.heads = %d; each "
                           "rank computes whole attention heads", t, setup->heads);
    if (setup->channels % t != 0)
        return host->error(host, LOOM_ERR_INVALID,
                           "tp: parallel.tp.size = %d does not divide model.channels = %d", t,
                           setup->channels);
    if (setup->padded_vocab % t != 0)
        return host->error(host, LOOM_ERR_INVALID,
                           "tp: parallel.tp.size = %d does not divide model.padded_vocab = %d; "
                           "pad the vocabulary to a multiple of %d", t, setup->padded_vocab, t);
    loom_strategy *s = malloc(sizeof *s);
    if (!s)
        return host->error(host, LOOM_ERR_NO_MEMORY, "tp: out of memory");
    *s = (loom_strategy){.host = host, .tp = g, .size = t, .rank = host->comm->rank(g),
                         .sequence_parallel = sp};
    *out = s;
    return LOOM_OK;
}

static int tp_destroy(loom_strategy *s)
{
    free(s);
    return LOOM_OK;
}

static int tp_describe(const loom_strategy *s, char *buf, size_t cap)
{
    snprintf(buf, cap, "tp over %d ranks (%s)%s", s->size, s->host->comm->backend(s->tp),
             s->sequence_parallel ? ", sequence parallel" : "");
    return LOOM_OK;
}

/* ---------------------------------------------------------- the slices */

static int tp_tensor_shard(loom_strategy *s, const loom_param_desc *p, loom_param_shard *out)
{
    const loom_host *h = s->host;
    if (!p || !out || p->ndim < 1)
        return h->error(h, LOOM_ERR_INVALID, "tp: tensor_shard needs a parameter and a result");
    int parts = p->split_parts > 1 ? p->split_parts : 1;
    int64_t len;
    switch (p->split) {
    case LOOM_SPLIT_ROWS:
        if (p->shape[0] % parts != 0)
            return h->error(h, LOOM_ERR_INVALID,
                            "tp: %s has %lld rows, not %d equal stacked parts", p->name,
                            (long long)p->shape[0], parts);
        len = p->shape[0] / parts;
        break;
    case LOOM_SPLIT_COLUMNS:
        len = p->shape[p->ndim - 1];
        break;
    default:
        out->begin = 0;
        out->count = p->shape[0];
        return LOOM_OK;
    }
    if (len % s->size != 0)
        return h->error(h, LOOM_ERR_INVALID,
                        "tp: %s's %s of %lld%s do not divide by parallel.tp.size = %d", p->name,
                        p->split == LOOM_SPLIT_ROWS ? "rows" : "columns", (long long)len,
                        parts > 1 ? " per part" : "", s->size);
    out->count = len / s->size;
    out->begin = out->count * s->rank;
    return LOOM_OK;
}

/* ------------------------------------------------------- the borders */

/* Contiguous (rows, cols) fp32-or-other views only: that is what the
 * model hands over. */
static int check_view(loom_strategy *s, const char *op, loom_region region, const loom_tensor *t)
{
    if (!t || !t->data || t->ndim != 2 || t->stride[1] != 1 || t->stride[0] != t->shape[1])
        return s->host->error(s->host, LOOM_ERR_INVALID,
                              "tp: %s (%s region) needs a contiguous 2-D tensor", op,
                              region_name(region));
    return LOOM_OK;
}

static int check_views(loom_strategy *s, const char *op, loom_region region,
                       const loom_tensor *in, const loom_tensor *out)
{
    int rc = check_view(s, op, region, in);
    return rc == LOOM_OK ? check_view(s, op, region, out) : rc;
}

static int finish(loom_strategy *s, int rc, loom_request *req)
{
    if (rc == LOOM_OK)
        rc = s->host->comm->wait(req);
    if (rc != LOOM_OK)
        s->failed = 1; /* the comm layer's detail names the op and the ranks */
    return rc;
}

static int broken(loom_strategy *s)
{
    return s->host->error(s->host, LOOM_ERR_REMOTE,
                          "tp: an earlier collective on the tp group failed; the run cannot "
                          "continue");
}

/* The tensors are the model's activations: copied where they live. */
static int copy_view(loom_strategy *s, const loom_tensor *in, loom_tensor *out)
{
    if (out->data == in->data)
        return LOOM_OK;
    size_t bytes = (size_t)loom_tensor_numel(in) * loom_dtype_size(in->dtype);
    return strategy_compute(s->host)->copy(s->host, out->data, in->data, bytes);
}

static int all_reduce(loom_strategy *s, const char *op, loom_region region, const loom_tensor *in,
                      loom_tensor *out)
{
    int rc = check_views(s, op, region, in, out);
    if (rc != LOOM_OK)
        return rc;
    if (loom_tensor_numel(out) != loom_tensor_numel(in))
        return s->host->error(s->host, LOOM_ERR_INVALID,
                              "tp: %s (%s region) got %lld elements in and room for %lld", op,
                              region_name(region), (long long)loom_tensor_numel(in),
                              (long long)loom_tensor_numel(out));
    loom_request *req = NULL;
    rc = s->host->comm->allreduce(s->tp, in->data, out->data, (size_t)loom_tensor_numel(in),
                                  in->dtype, LOOM_SUM, &req);
    return finish(s, rc, req);
}

enum { SCATTER_ROWS = 0, GATHER_ROWS = 1 };

/* Sequence parallelism's borders move token rows between this rank's R
 * and all t*R of them, every rank's in rank order: gathered (R -> t*R), or
 * reduce-scattered (t*R -> this rank's R, summed over the ranks). */
static int exchange_rows(loom_strategy *s, const char *op, loom_region region, int gather,
                         const loom_tensor *in, loom_tensor *out)
{
    int rc = check_views(s, op, region, in, out);
    if (rc != LOOM_OK)
        return rc;
    const loom_tensor *mine = gather ? in : out, *all = gather ? out : in;
    long long rows = mine->shape[0], want = rows * s->size;
    if (all->shape[0] != want || out->shape[1] != in->shape[1]) {
        if (gather)
            return s->host->error(s->host, LOOM_ERR_INVALID,
                                  "tp: %s (%s region) gathers %lld rows from each of %d ranks "
                                  "into %lld; want %lld", op, region_name(region), rows, s->size,
                                  (long long)all->shape[0], want);
        return s->host->error(s->host, LOOM_ERR_INVALID,
                              "tp: %s (%s region) reduces %lld rows into %lld per rank over %d "
                              "ranks; want %lld", op, region_name(region),
                              (long long)all->shape[0], rows, s->size, want);
    }
    loom_request *req = NULL;
    size_t count = (size_t)loom_tensor_numel(mine);
    if (gather)
        rc = s->host->comm->allgather(s->tp, in->data, out->data, count, in->dtype, &req);
    else
        rc = s->host->comm->reducescatter(s->tp, in->data, out->data, count, in->dtype, LOOM_SUM,
                                          &req);
    return finish(s, rc, req);
}

/* Megatron's operators come in two kinds, each the other's conjugate. The
 * identity, or with sequence parallelism the gather of the rows: */
static int replicate(loom_strategy *s, const char *op, loom_region region, const loom_tensor *in,
                     loom_tensor *out)
{
    if (s->failed)
        return broken(s);
    if (s->sequence_parallel)
        return exchange_rows(s, op, region, GATHER_ROWS, in, out);
    return copy_view(s, in, out);
}

/* and the sum over the ranks: all-reduced, or with sequence parallelism
 * reduce-scattered by rows. */
static int sum_partials(loom_strategy *s, const char *op, loom_region region,
                        const loom_tensor *in, loom_tensor *out)
{
    if (s->failed)
        return broken(s);
    if (s->sequence_parallel)
        return exchange_rows(s, op, region, SCATTER_ROWS, in, out);
    return all_reduce(s, op, region, in, out);
}

/* f: the region's input */
static int tp_enter(loom_strategy *s, loom_region region, const loom_tensor *x, loom_tensor *out)
{
    return replicate(s, "tensor_enter", region, x, out);
}

/* g: partial sums -> the result */
static int tp_exit(loom_strategy *s, loom_region region, const loom_tensor *partial,
                   loom_tensor *out)
{
    return sum_partials(s, "tensor_exit", region, partial, out);
}

/* g's conjugate: every rank's partial sum had the whole result's gradient */
static int tp_exit_backward(loom_strategy *s, loom_region region, const loom_tensor *dout,
                            loom_tensor *dpartial)
{
    return replicate(s, "tensor_exit_backward", region, dout, dpartial);
}

/* f's conjugate: the input fed every rank, so its gradient sums theirs */
static int tp_enter_backward(loom_strategy *s, loom_region region, const loom_tensor *dregion_in,
                             loom_tensor *dx)
{
    return sum_partials(s, "tensor_enter_backward", region, dregion_in, dx);
}

LOOM_PLUGIN_EXPORT const loom_strategy_plugin_v1_t loom_strategy_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_STRATEGY, loom_strategy_plugin_v1_t, "tp",
                                 "Megatron tensor parallelism: column/row-parallel linears, "
                                 "heads and vocabulary split; optional sequence parallelism",
                                 tp_settings),
    .axis = LOOM_AXIS_TP,
    .create = tp_create,
    .destroy = tp_destroy,
    .describe = tp_describe,
    .tensor_shard = tp_tensor_shard,
    .tensor_enter = tp_enter,
    .tensor_exit = tp_exit,
    .tensor_exit_backward = tp_exit_backward,
    .tensor_enter_backward = tp_enter_backward,
};
