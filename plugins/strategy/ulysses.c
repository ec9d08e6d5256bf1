/* ulysses — DeepSpeed-Ulysses sequence parallelism (Jacobs et al., 2023).
 *
 * Outside attention each of the s sequence ranks holds a contiguous block
 * of T/s positions of every sequence. Around attention an all-to-all turns
 * the sequence-sharded Q, K and V (all H heads, T/s positions) into
 * head-sharded ones (H/s heads, all T positions); attention runs on whole
 * sequences, and a second all-to-all turns the output back. Forward moves
 * q, k, v and out; backward dout in and dq, dk, dv back: four all-to-alls
 * of b·T·h/s elements per layer each way. What backward needs (the
 * head-sharded q, k, v, out and lse) is kept from forward, keyed by the
 * layer's lse buffer, which the model gives each layer its own of. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/strategy.h"

/* What one layer's forward leaves for its backward, head-sharded:
 * (B, s*T, Hs, HS) each, and lse (B, Hs, s*T). */
typedef struct saved_layer {
    const float *key; /* the model's lse buffer of the layer */
    void *q, *k, *v, *out;
    float *lse;
} saved_layer;

struct loom_strategy {
    const loom_host *host;
    loom_group *sp;
    int size, rank;
    int heads_per_tp; /* heads of each tensor-parallel rank */

    /* shapes of the first call; every later call must match */
    int B, T, NH, HS;
    loom_dtype dtype;
    int *positions;        /* s*T: every rank's positions in rank order */
    void *send, *recv;     /* all-to-all staging, B*T*NH*HS elements each */
    void *dq, *dk, *dv, *dout; /* backward scratch, head-sharded */
    saved_layer *layers;
    int nlayers, caplayers;
    int failed;
};

static const loom_setting_spec ulysses_settings[] = {{NULL, 0, NULL, NULL}};

static int ulysses_create(const loom_host *host, const loom_strategy_setup *setup,
                          loom_strategy **out)
{
    if (!setup || setup->axis != LOOM_AXIS_SP)
        return host->error(host, LOOM_ERR_INVALID,
                           "ulysses: serves the sp axis, but was created for axis %s "
                           "(set parallel.<axis>.strategy to a strategy of that axis)",
                           setup ? loom_axis_name(setup->axis) : "?");
    loom_group *g = setup->groups[LOOM_AXIS_SP];
    if (!g)
        return host->error(host, LOOM_ERR_INVALID, "ulysses: the setup has no sp group (a core bug)");
    int s = host->comm->size(g);
    int tp = setup->sizes[LOOM_AXIS_TP] > 0 ? setup->sizes[LOOM_AXIS_TP] : 1;
    int heads = setup->heads / tp;
    if (heads % s != 0)
        return host->error(host, LOOM_ERR_INVALID,
                           "ulysses: parallel.sp.size = %d does not divide the %d attention heads "
                           "of each tp rank (model.heads %d / parallel.tp.size %d): every sp rank "
                           "attends whole heads; choose a size dividing %d, or strategy = \"ring\"",
                           s, heads, setup->heads, tp, heads);
    if (setup->seq % s != 0)
        return host->error(host, LOOM_ERR_INVALID,
                           "ulysses: train.seq = %d does not divide by parallel.sp.size = %d",
                           setup->seq, s);
    loom_strategy *u = calloc(1, sizeof *u);
    if (!u)
        return host->error(host, LOOM_ERR_NO_MEMORY, "ulysses: out of memory");
    u->host = host;
    u->sp = g;
    u->size = s;
    u->rank = host->comm->rank(g);
    u->heads_per_tp = heads;
    *out = u;
    return LOOM_OK;
}

static void release(loom_strategy *u, void **p)
{
    if (*p)
        u->host->mem_free(u->host, *p);
    *p = NULL;
}

static void free_buffers(loom_strategy *u)
{
    release(u, &u->send);
    release(u, &u->recv);
    release(u, &u->dq);
    release(u, &u->dk);
    release(u, &u->dv);
    release(u, &u->dout);
    for (int i = 0; i < u->nlayers; i++) {
        saved_layer *l = &u->layers[i];
        release(u, &l->q);
        release(u, &l->k);
        release(u, &l->v);
        release(u, &l->out);
        release(u, (void **)&l->lse);
    }
    free(u->layers);
    u->layers = NULL;
    u->nlayers = u->caplayers = 0;
    free(u->positions);
    u->positions = NULL;
}

static int ulysses_destroy(loom_strategy *u)
{
    if (!u)
        return LOOM_OK;
    free_buffers(u);
    free(u);
    return LOOM_OK;
}

static int ulysses_describe(const loom_strategy *u, char *buf, size_t cap)
{
    snprintf(buf, cap, "ulysses over %d ranks (%s), %d heads each", u->size,
             u->host->comm->backend(u->sp), u->heads_per_tp / u->size);
    return LOOM_OK;
}

/* A contiguous block per rank, as DeepSpeed-Ulysses splits the sequence. */
static int ulysses_positions(loom_strategy *u, int seq, int *positions, int *count)
{
    if (seq % u->size != 0)
        return u->host->error(u->host, LOOM_ERR_INVALID,
                              "ulysses: train.seq = %d does not divide by parallel.sp.size = %d",
                              seq, u->size);
    int n = seq / u->size;
    for (int i = 0; i < n; i++)
        positions[i] = u->rank * n + i;
    *count = n;
    return LOOM_OK;
}

/* ------------------------------------------------------------ buffers */

static int alloc(loom_strategy *u, loom_purpose purpose, size_t bytes, void **out)
{
    int rc = u->host->mem_alloc(u->host, LOOM_TIER_HOST, purpose, bytes ? bytes : 1, out);
    if (rc == LOOM_OK)
        memset(*out, 0, bytes);
    return rc;
}

static size_t elems(const loom_strategy *u) { return (size_t)u->B * u->T * u->NH * u->HS; }

/* First call: learn the shapes, gather every rank's positions. */
static int prepare(loom_strategy *u, const loom_attention *a)
{
    const loom_host *h = u->host;
    if (u->positions) {
        if (a->B != u->B || a->T != u->T || a->NH != u->NH || a->HS != u->HS ||
            a->dtype != u->dtype)
            return h->error(h, LOOM_ERR_INVALID,
                            "ulysses: attention of (B %d, T %d, heads %d, size %d) after "
                            "(B %d, T %d, heads %d, size %d); the shapes must not change",
                            a->B, a->T, a->NH, a->HS, u->B, u->T, u->NH, u->HS);
        return LOOM_OK;
    }
    if (a->NH % u->size != 0)
        return h->error(h, LOOM_ERR_INVALID,
                        "ulysses: %d heads on this rank do not divide by parallel.sp.size = %d",
                        a->NH, u->size);
    if (!a->kernels || !a->kernels->block_forward || !a->kernels->block_backward)
        return h->error(h, LOOM_ERR_INVALID, "ulysses: the attention op came without kernels");
    u->B = a->B;
    u->T = a->T;
    u->NH = a->NH;
    u->HS = a->HS;
    u->dtype = a->dtype;
    u->positions = malloc((size_t)u->size * u->T * sizeof(int));
    if (!u->positions)
        return h->error(h, LOOM_ERR_NO_MEMORY, "ulysses: out of memory");
    loom_request *req = NULL;
    int rc = h->comm->allgather(u->sp, a->positions, u->positions, (size_t)u->T, LOOM_I32, &req);
    if (rc == LOOM_OK && req)
        rc = h->comm->wait(req);
    size_t bytes = elems(u) * loom_dtype_size(u->dtype);
    if (rc == LOOM_OK)
        rc = alloc(u, LOOM_PURPOSE_COMM, bytes, &u->send);
    if (rc == LOOM_OK)
        rc = alloc(u, LOOM_PURPOSE_COMM, bytes, &u->recv);
    void **scratch[4] = {&u->dq, &u->dk, &u->dv, &u->dout};
    for (int i = 0; i < 4 && rc == LOOM_OK; i++)
        rc = alloc(u, LOOM_PURPOSE_ACTIVATIONS, bytes, scratch[i]);
    if (rc != LOOM_OK) {
        free_buffers(u);
        u->failed = 1;
    }
    return rc;
}

static saved_layer *layer_of(loom_strategy *u, const float *key, int create)
{
    for (int i = 0; i < u->nlayers; i++)
        if (u->layers[i].key == key)
            return &u->layers[i];
    if (!create)
        return NULL;
    if (u->nlayers == u->caplayers) {
        int cap = u->caplayers ? 2 * u->caplayers : 8;
        saved_layer *grown = realloc(u->layers, (size_t)cap * sizeof *grown);
        if (!grown)
            return NULL;
        u->layers = grown;
        u->caplayers = cap;
    }
    saved_layer *l = &u->layers[u->nlayers];
    memset(l, 0, sizeof *l);
    l->key = key;
    size_t bytes = elems(u) * loom_dtype_size(u->dtype);
    int rc = alloc(u, LOOM_PURPOSE_ACTIVATIONS, bytes, &l->q);
    if (rc == LOOM_OK)
        rc = alloc(u, LOOM_PURPOSE_ACTIVATIONS, bytes, &l->k);
    if (rc == LOOM_OK)
        rc = alloc(u, LOOM_PURPOSE_ACTIVATIONS, bytes, &l->v);
    if (rc == LOOM_OK)
        rc = alloc(u, LOOM_PURPOSE_ACTIVATIONS, bytes, &l->out);
    if (rc == LOOM_OK)
        rc = alloc(u, LOOM_PURPOSE_ACTIVATIONS,
                   (size_t)u->B * (u->NH / u->size) * u->size * u->T * sizeof(float),
                   (void **)&l->lse);
    if (rc != LOOM_OK) {
        release(u, &l->q);
        release(u, &l->k);
        release(u, &l->v);
        release(u, &l->out);
        return NULL;
    }
    u->nlayers++;
    return l;
}

/* ---------------------------------------------------------- all-to-all */

static int exchange(loom_strategy *u)
{
    loom_request *req = NULL;
    int rc = u->host->comm->alltoall(u->sp, u->send, u->recv, elems(u) / (size_t)u->size,
                                     u->dtype, &req);
    if (rc == LOOM_OK && req)
        rc = u->host->comm->wait(req);
    if (rc != LOOM_OK)
        u->failed = 1; /* the comm layer's detail names the op and the ranks */
    return rc;
}

/* Sequence-sharded (B, T, NH, HS) -> head-sharded (B, s*T, Hs, HS): block
 * j of the send buffer is heads j*Hs.. of all local rows, for rank j; block
 * i received holds rank i's rows of this rank's heads, placed at rows
 * i*T.. of each sequence (u->positions says which positions those are). */
static int to_heads(loom_strategy *u, const void *x, void *dst)
{
    const int s = u->size, B = u->B, T = u->T, Hs = u->NH / s;
    const size_t es = loom_dtype_size(u->dtype), row = (size_t)Hs * u->HS * es;
    const size_t C = (size_t)u->NH * u->HS * es;
    char *send = u->send;
    for (int j = 0; j < s; j++)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                memcpy(send + (((size_t)j * B + b) * T + t) * row,
                       (const char *)x + ((size_t)b * T + t) * C + (size_t)j * row, row);
    int rc = exchange(u);
    if (rc != LOOM_OK)
        return rc;
    const char *recv = u->recv;
    for (int i = 0; i < s; i++)
        for (int b = 0; b < B; b++)
            memcpy((char *)dst + ((size_t)b * s * T + (size_t)i * T) * row,
                   recv + ((size_t)i * B + b) * T * row, (size_t)T * row);
    return LOOM_OK;
}

/* The way back: head-sharded rows i*T.. go to rank i, and the blocks
 * received (rank j's heads of this rank's rows) land in heads j*Hs.. of
 * dst, added to it when accumulate. */
static int to_sequence(loom_strategy *u, const void *src, void *dst, int accumulate)
{
    const int s = u->size, B = u->B, T = u->T, Hs = u->NH / s;
    const size_t es = loom_dtype_size(u->dtype), row = (size_t)Hs * u->HS * es;
    const size_t C = (size_t)u->NH * u->HS * es;
    char *send = u->send;
    for (int i = 0; i < s; i++)
        for (int b = 0; b < B; b++)
            memcpy(send + ((size_t)i * B + b) * T * row,
                   (const char *)src + ((size_t)b * s * T + (size_t)i * T) * row, (size_t)T * row);
    int rc = exchange(u);
    if (rc != LOOM_OK)
        return rc;
    const char *recv = u->recv;
    const size_t n = (size_t)Hs * u->HS;
    for (int j = 0; j < s; j++)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                const char *from = recv + (((size_t)j * B + b) * T + t) * row;
                char *to = (char *)dst + ((size_t)b * T + t) * C + (size_t)j * row;
                if (!accumulate) {
                    memcpy(to, from, row);
                } else if (u->dtype == LOOM_F32) {
                    float *d = (float *)(void *)to;
                    const float *f = (const float *)(const void *)from;
                    for (size_t e = 0; e < n; e++)
                        d[e] += f[e];
                } else {
                    uint16_t *d = (uint16_t *)(void *)to;
                    const uint16_t *f = (const uint16_t *)(const void *)from;
                    for (size_t e = 0; e < n; e++)
                        d[e] = u->dtype == LOOM_BF16
                                   ? loom_f32_to_bf16(loom_bf16_to_f32(d[e]) + loom_bf16_to_f32(f[e]))
                                   : loom_f32_to_f16(loom_f16_to_f32(d[e]) + loom_f16_to_f32(f[e]));
                }
            }
    return LOOM_OK;
}

static int broken(loom_strategy *u)
{
    return u->host->error(u->host, LOOM_ERR_REMOTE,
                          "ulysses: an earlier all-to-all on the sp group failed; the run cannot "
                          "continue");
}

/* ------------------------------------------------------------ attention */

static int ulysses_forward(loom_strategy *u, const loom_attention *a)
{
    if (u->failed)
        return broken(u);
    int rc = prepare(u, a);
    if (rc != LOOM_OK)
        return rc;
    saved_layer *l = layer_of(u, a->lse, 1);
    if (!l)
        return u->host->error(u->host, LOOM_ERR_NO_MEMORY,
                              "ulysses: out of memory for a layer's head-sharded activations");
    if ((rc = to_heads(u, a->q, l->q)) != LOOM_OK || (rc = to_heads(u, a->k, l->k)) != LOOM_OK ||
        (rc = to_heads(u, a->v, l->v)) != LOOM_OK)
        return rc;
    const int Tf = u->size * u->T, Hs = u->NH / u->size;
    a->kernels->block_forward(l->q, u->positions, Tf, l->k, l->v, u->positions, Tf, u->B, Hs,
                              u->HS, u->dtype, l->out, l->lse, 1);
    return to_sequence(u, l->out, a->out, 0);
}

static int ulysses_backward(loom_strategy *u, const loom_attention *a)
{
    if (u->failed)
        return broken(u);
    saved_layer *l = u->positions ? layer_of(u, a->lse, 0) : NULL;
    if (!l)
        return u->host->error(u->host, LOOM_ERR_INVALID,
                              "ulysses: attention backward for a layer whose forward it did not "
                              "see");
    int rc = to_heads(u, a->dout, u->dout);
    if (rc != LOOM_OK)
        return rc;
    size_t bytes = elems(u) * loom_dtype_size(u->dtype);
    memset(u->dq, 0, bytes);
    memset(u->dk, 0, bytes);
    memset(u->dv, 0, bytes);
    const int Tf = u->size * u->T, Hs = u->NH / u->size;
    a->kernels->block_backward(l->q, u->positions, Tf, l->k, l->v, u->positions, Tf, u->B, Hs,
                               u->HS, u->dtype, l->out, u->dout, l->lse, u->dq, u->dk, u->dv);
    if ((rc = to_sequence(u, u->dq, a->dq, 1)) != LOOM_OK ||
        (rc = to_sequence(u, u->dk, a->dk, 1)) != LOOM_OK)
        return rc;
    return to_sequence(u, u->dv, a->dv, 1);
}

LOOM_PLUGIN_EXPORT const loom_strategy_plugin_v1_t loom_strategy_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_STRATEGY, loom_strategy_plugin_v1_t, "ulysses",
                                 "DeepSpeed-Ulysses: all-to-all from sequence- to head-sharded "
                                 "Q, K, V around attention",
                                 ulysses_settings),
    .axis = LOOM_AXIS_SP,
    .create = ulysses_create,
    .destroy = ulysses_destroy,
    .describe = ulysses_describe,
    .sequence_positions = ulysses_positions,
    .attention_forward = ulysses_forward,
    .attention_backward = ulysses_backward,
};
