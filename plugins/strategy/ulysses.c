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

#include "common/strategy_common.h"
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

    strategy_attention_shape shape; /* of the first call; every later call must match */
    int *positions;        /* s*T: every rank's positions in rank order */
    void *send, *recv;     /* all-to-all staging, B*T*NH*HS elements each */
    void *dq, *dk, *dv, *dout; /* backward scratch, head-sharded */
    saved_layer *layers;
    int nlayers, caplayers;
    int failed;
};

static const loom_setting_spec ulysses_settings[] = {{0}};

static int ulysses_create(const loom_host *host, const loom_strategy_setup *setup,
                          loom_strategy **out)
{
    loom_group *g = NULL;
    int rc = strategy_axis_group(host, setup, "ulysses", LOOM_AXIS_SP, &g);
    if (rc != LOOM_OK)
        return rc;
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
    loom_strategy *u = malloc(sizeof *u);
    if (!u)
        return host->error(host, LOOM_ERR_NO_MEMORY, "ulysses: out of memory");
    *u = (loom_strategy){.host = host, .sp = g, .size = s, .rank = host->comm->rank(g),
                         .heads_per_tp = heads};
    *out = u;
    return LOOM_OK;
}

static void release_layer(loom_strategy *u, saved_layer *l)
{
    void **buffers[4] = {&l->q, &l->k, &l->v, &l->out};
    for (int i = 0; i < 4; i++)
        strategy_release(u->host, buffers[i]);
    if (l->lse)
        u->host->mem_free(u->host, l->lse);
    l->lse = NULL;
}

static void free_buffers(loom_strategy *u)
{
    void **buffers[6] = {&u->send, &u->recv, &u->dq, &u->dk, &u->dv, &u->dout};
    for (int i = 0; i < 6; i++)
        strategy_release(u->host, buffers[i]);
    for (int i = 0; i < u->nlayers; i++)
        release_layer(u, &u->layers[i]);
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

/* First call: learn the shapes, gather every rank's positions. */
static int prepare(loom_strategy *u, const loom_attention *a)
{
    const loom_host *h = u->host;
    if (u->positions)
        return strategy_check_attention_shape(h, "ulysses", &u->shape, a);
    if (a->NH % u->size != 0)
        return h->error(h, LOOM_ERR_INVALID,
                        "ulysses: %d heads on this rank do not divide by parallel.sp.size = %d",
                        a->NH, u->size);
    int rc = strategy_first_attention(h, "ulysses", a, &u->shape);
    if (rc != LOOM_OK)
        return rc;
    rc = strategy_gather_positions(h, "ulysses", u->sp, u->size, a, &u->positions);
    if (!u->positions)
        return rc; /* out of memory */
    size_t bytes = strategy_attention_bytes(&u->shape);
    if (rc == LOOM_OK)
        rc = strategy_alloc_model(h, LOOM_PURPOSE_COMM, bytes, &u->send);
    if (rc == LOOM_OK)
        rc = strategy_alloc_model(h, LOOM_PURPOSE_COMM, bytes, &u->recv);
    void **scratch[4] = {&u->dq, &u->dk, &u->dv, &u->dout};
    for (int i = 0; i < 4 && rc == LOOM_OK; i++)
        rc = strategy_alloc_model(h, LOOM_PURPOSE_ACTIVATIONS, bytes, scratch[i]);
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
    size_t bytes = strategy_attention_bytes(&u->shape);
    void **buffers[4] = {&l->q, &l->k, &l->v, &l->out};
    int rc = LOOM_OK;
    for (int i = 0; i < 4 && rc == LOOM_OK; i++)
        rc = strategy_alloc_model(u->host, LOOM_PURPOSE_ACTIVATIONS, bytes, buffers[i]);
    void *lse = NULL;
    if (rc == LOOM_OK)
        rc = strategy_alloc_model(u->host, LOOM_PURPOSE_ACTIVATIONS,
                                  (size_t)u->shape.B * (u->shape.NH / u->size) * u->size *
                                      u->shape.T * sizeof(float),
                                  &lse);
    if (rc != LOOM_OK) {
        release_layer(u, l);
        return NULL;
    }
    l->lse = lse;
    u->nlayers++;
    return l;
}

/* ---------------------------------------------------------- all-to-all */

/* The all-to-all's blocks are cut in rows of one position's Hs heads. */
static size_t head_row_bytes(const loom_strategy *u)
{
    return (size_t)(u->shape.NH / u->size) * u->shape.HS * loom_dtype_size(u->shape.dtype);
}

static int exchange(loom_strategy *u)
{
    loom_request *req = NULL;
    int rc = u->host->comm->alltoall(u->sp, u->send, u->recv,
                                     strategy_attention_elems(&u->shape) / (size_t)u->size,
                                     u->shape.dtype, &req);
    if (rc == LOOM_OK)
        rc = u->host->comm->wait(req);
    if (rc != LOOM_OK)
        u->failed = 1; /* the comm layer's detail names the op and the ranks */
    return rc;
}

/* Sequence-sharded (B, T, NH, HS) -> head-sharded (B, s*T, Hs, HS): block
 * j of the send buffer is heads j*Hs.. of all local rows, for rank j; block
 * i received holds rank i's rows of this rank's heads, placed at rows
 * i*T.. of each sequence (u->positions says which positions those are).
 * Each block is one strided copy: the B*T rows of a rank's heads are C
 * apart in x, and the B sequences of a received block s*T rows apart in
 * dst. */
static int to_heads(loom_strategy *u, const void *x, void *dst)
{
    const int s = u->size, B = u->shape.B, T = u->shape.T;
    const size_t row = head_row_bytes(u), C = (size_t)s * row, block = (size_t)B * T * row;
    const size_t seq = (size_t)T * row; /* one sequence's rows of a block */
    int rc = LOOM_OK;
    for (int j = 0; j < s && rc == LOOM_OK; j++)
        rc = strategy_copy_rows(u->host, (char *)u->send + j * block, row,
                                (const char *)x + j * row, C, row, (size_t)B * T);
    if (rc != LOOM_OK || (rc = exchange(u)) != LOOM_OK)
        return rc;
    for (int i = 0; i < s && rc == LOOM_OK; i++)
        rc = strategy_copy_rows(u->host, (char *)dst + i * seq, s * seq,
                                (const char *)u->recv + i * block, seq, seq, (size_t)B);
    return rc;
}

/* The way back: head-sharded rows i*T.. go to rank i, and the blocks
 * received (rank j's heads of this rank's rows) land in heads j*Hs.. of
 * dst, added to it when accumulate (laid out in send first, which the
 * exchange is done with, then added whole: the same sums element by
 * element). */
static int to_sequence(loom_strategy *u, const void *src, void *dst, int accumulate)
{
    const int s = u->size, B = u->shape.B, T = u->shape.T;
    const size_t row = head_row_bytes(u), C = (size_t)s * row, block = (size_t)B * T * row;
    const size_t seq = (size_t)T * row;
    int rc = LOOM_OK;
    for (int i = 0; i < s && rc == LOOM_OK; i++)
        rc = strategy_copy_rows(u->host, (char *)u->send + i * block, seq,
                                (const char *)src + i * seq, s * seq, seq, (size_t)B);
    if (rc != LOOM_OK || (rc = exchange(u)) != LOOM_OK)
        return rc;
    char *to = accumulate ? u->send : dst;
    for (int j = 0; j < s && rc == LOOM_OK; j++)
        rc = strategy_copy_rows(u->host, to + j * row, C, (const char *)u->recv + j * block,
                                row, row, (size_t)B * T);
    if (rc == LOOM_OK && accumulate) /* send is spent: the next exchange refills it */
        rc = strategy_add_spent(u->host, dst, u->send, strategy_attention_elems(&u->shape),
                                u->shape.dtype);
    return rc;
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
    const strategy_attention_shape *sh = &u->shape;
    const int Tf = u->size * sh->T, Hs = sh->NH / u->size;
    a->kernels->block_forward(l->q, u->positions, Tf, l->k, l->v, u->positions, Tf, sh->B, Hs,
                              sh->HS, sh->dtype, l->out, l->lse, 1);
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
    size_t bytes = strategy_attention_bytes(&u->shape);
    const loom_compute_api *c = strategy_compute(u->host);
    void *grads[3] = {u->dq, u->dk, u->dv};
    for (int i = 0; i < 3 && rc == LOOM_OK; i++)
        rc = c->zero(u->host, grads[i], bytes); /* the kernel adds into them */
    if (rc != LOOM_OK)
        return rc;
    const strategy_attention_shape *sh = &u->shape;
    const int Tf = u->size * sh->T, Hs = sh->NH / u->size;
    a->kernels->block_backward(l->q, u->positions, Tf, l->k, l->v, u->positions, Tf, sh->B, Hs,
                               sh->HS, sh->dtype, l->out, u->dout, l->lse, u->dq, u->dk, u->dv);
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
