/* ring — ring attention (Liu et al., 2023) on the sequence axis.
 *
 * Each of the s sequence ranks keeps its block of T/s positions of Q, K
 * and V. Forward: the K/V blocks travel around the ring (rank r sends to
 * r+1, receives from r-1) while each rank attends its queries to the block
 * it holds, merging the blocks through their log-sum-exp (the block
 * kernels' online softmax); the transfer of the next block is posted
 * before the current one computes, so the two overlap. s-1 transfers per
 * layer. Causal masking is by position, per block pair; a pair with no
 * visible key is skipped.
 *
 * Backward: the K/V blocks go around again, and with each the gradient of
 * that block accumulated so far: a rank adds its queries' share of dK, dV
 * and passes the sum on; after s steps every block's gradient has met
 * every rank's queries and one last hop brings it home. s-1 K/V transfers
 * and s dK/dV transfers per layer.
 *
 * balance = "zigzag" cuts the sequence into 2s chunks and gives rank r
 * chunks r and 2s-1-r: with a causal mask every rank then has the same
 * work (a contiguous split leaves rank 0 one block pair, rank s-1 all s). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strategy_common.h"
#include "loom/strategy.h"

static const loom_setting_spec ring_settings[] = {
    {.name = "balance", .type = LOOM_SETTING_STRING, .default_value = "contiguous",
     .help = "how the sequence is cut: \"contiguous\" (rank r holds block r) or \"zigzag\" "
             "(chunks r and 2s-1-r of 2s, even causal work)",
     .allowed = (const char *const[]){"contiguous", "zigzag", NULL}},
    {0},
};

enum { TAG_KV = 1, TAG_KV_BACK = 2, TAG_DKV = 3 };

struct loom_strategy {
    const loom_host *host;
    loom_group *sp;
    int size, rank, zigzag;

    strategy_attention_shape shape; /* of the first call; every later call must match */
    int *positions;   /* s*T: every rank's positions, rank-major */
    int *first_pos;   /* s: the smallest position of each rank's block */
    void *kv[2];      /* K then V of the block held, and the next */
    void *dkv[2];     /* this rank's share plus what came before, being sent */
    void *dkv_in;     /* the block's gradient from the previous ranks */
    int failed;
};

static int ring_create(const loom_host *host, const loom_strategy_setup *setup, loom_strategy **out)
{
    loom_group *g = NULL;
    int rc = strategy_axis_group(host, setup, "ring", LOOM_AXIS_SP, &g);
    if (rc != LOOM_OK)
        return rc;
    const char *balance = "contiguous";
    if ((rc = host->config_string(host, "balance", &balance)) != LOOM_OK)
        return rc;
    int s = host->comm->size(g);
    int zigzag = !strcmp(balance, "zigzag");
    int parts = zigzag ? 2 * s : s;
    if (setup->seq % parts != 0)
        return host->error(host, LOOM_ERR_INVALID,
                           "ring: train.seq = %d does not divide into %d %s (parallel.sp.size = "
                           "%d%s); make it a multiple of %d",
                           setup->seq, parts, zigzag ? "zigzag chunks" : "blocks", s,
                           zigzag ? ", balance = \"zigzag\"" : "", parts);
    loom_strategy *r = malloc(sizeof *r);
    if (!r)
        return host->error(host, LOOM_ERR_NO_MEMORY, "ring: out of memory");
    *r = (loom_strategy){.host = host, .sp = g, .size = s, .rank = host->comm->rank(g),
                         .zigzag = zigzag};
    *out = r;
    return LOOM_OK;
}

static void release_buffers(loom_strategy *r)
{
    void **buffers[5] = {&r->kv[0], &r->kv[1], &r->dkv[0], &r->dkv[1], &r->dkv_in};
    for (int i = 0; i < 5; i++)
        strategy_release(r->host, buffers[i]);
}

static int ring_destroy(loom_strategy *r)
{
    if (!r)
        return LOOM_OK;
    if (!r->failed) /* after a failure a transfer may still write: keep the buffers */
        release_buffers(r);
    free(r->positions);
    free(r->first_pos);
    free(r);
    return LOOM_OK;
}

static int ring_describe(const loom_strategy *r, char *buf, size_t cap)
{
    snprintf(buf, cap, "ring attention over %d ranks (%s), %s", r->size,
             r->host->comm->backend(r->sp), r->zigzag ? "zigzag" : "contiguous blocks");
    return LOOM_OK;
}

static int ring_positions(loom_strategy *r, int seq, int *positions, int *count)
{
    int s = r->size, parts = r->zigzag ? 2 * s : s;
    if (seq % parts != 0)
        return r->host->error(r->host, LOOM_ERR_INVALID,
                              "ring: train.seq = %d does not divide into %d %s", seq, parts,
                              r->zigzag ? "zigzag chunks" : "blocks");
    int c = seq / parts, n = 0;
    for (int i = 0; i < c; i++)
        positions[n++] = r->rank * c + i;
    for (int i = 0; r->zigzag && i < c; i++)
        positions[n++] = (2 * s - 1 - r->rank) * c + i;
    *count = n;
    return LOOM_OK;
}

/* ------------------------------------------------------------ buffers */

static int prepare(loom_strategy *r, const loom_attention *a)
{
    const loom_host *h = r->host;
    if (r->positions)
        return strategy_check_attention_shape(h, "ring", &r->shape, a);
    int rc = strategy_first_attention(h, "ring", a, &r->shape);
    if (rc != LOOM_OK)
        return rc;
    r->first_pos = malloc((size_t)r->size * sizeof(int));
    if (!r->first_pos)
        return h->error(h, LOOM_ERR_NO_MEMORY, "ring: out of memory");
    rc = strategy_gather_positions(h, "ring", r->sp, r->size, a, &r->positions);
    if (rc != LOOM_OK) {
        r->failed = r->positions != NULL; /* the gather failed, not the allocation */
        return rc;
    }
    for (int i = 0; i < r->size; i++) {
        const int *pos = r->positions + (size_t)i * r->shape.T;
        int lo = pos[0];
        for (int j = 1; j < r->shape.T; j++)
            lo = pos[j] < lo ? pos[j] : lo;
        r->first_pos[i] = lo;
    }
    size_t bytes = 2 * strategy_attention_bytes(&r->shape);
    void **bufs[5] = {&r->kv[0], &r->kv[1], &r->dkv[0], &r->dkv[1], &r->dkv_in};
    for (int i = 0; i < 5 && rc == LOOM_OK; i++)
        rc = strategy_alloc_model(h, LOOM_PURPOSE_COMM, bytes, bufs[i]);
    if (rc != LOOM_OK) {
        release_buffers(r);
        free(r->positions);
        r->positions = NULL;
    }
    return rc;
}

/* ---------------------------------------------------------- transfers */

static int broken(loom_strategy *r)
{
    return r->host->error(r->host, LOOM_ERR_REMOTE,
                          "ring: an earlier transfer on the sp group failed; the run cannot "
                          "continue");
}

static int finish(loom_strategy *r, loom_request **req)
{
    int rc = LOOM_OK;
    if (*req)
        rc = r->host->comm->wait(*req);
    *req = NULL;
    if (rc != LOOM_OK)
        r->failed = 1; /* the comm layer's detail names the op and the peer */
    return rc;
}

/* Post: send buf to the next rank, receive into into from the previous. */
static int pass_on(loom_strategy *r, const void *buf, void *into, size_t count, int tag,
                   loom_request **send, loom_request **recv)
{
    const loom_comm_api *C = r->host->comm;
    int next = (r->rank + 1) % r->size, prev = (r->rank + r->size - 1) % r->size;
    C->group_start(r->sp);
    int rc = into ? C->recv(r->sp, into, count, r->shape.dtype, prev, tag, recv) : LOOM_OK;
    if (rc == LOOM_OK && buf)
        rc = C->send(r->sp, buf, count, r->shape.dtype, next, tag, send);
    int grc = C->group_end(r->sp);
    if (rc == LOOM_OK)
        rc = grc;
    if (rc != LOOM_OK)
        r->failed = 1;
    return rc;
}

/* MPI moves a large message only inside its calls: between the sequences
 * of a block, give the transfers in flight a chance. */
static int poke(loom_strategy *r, loom_request **req)
{
    if (!*req)
        return LOOM_OK;
    int rc = r->host->comm->test(*req);
    if (rc == LOOM_IN_PROGRESS)
        return LOOM_OK;
    *req = NULL; /* test released it */
    if (rc != LOOM_OK)
        r->failed = 1;
    return rc;
}

/* Can any query of this rank see a key of rank src's block? */
static int visible(const loom_strategy *r, const int *q_pos, int src)
{
    int top = q_pos[0];
    for (int i = 1; i < r->shape.T; i++)
        top = q_pos[i] > top ? q_pos[i] : top;
    return r->first_pos[src] <= top;
}

/* Both passes start from this rank's own K/V block. */
static int hold_own_block(loom_strategy *r, const loom_attention *a)
{
    int rc = prepare(r, a);
    if (rc != LOOM_OK)
        return rc;
    const size_t bytes = strategy_attention_bytes(&r->shape);
    const loom_compute_api *c = strategy_compute(r->host);
    rc = c->copy(r->host, r->kv[0], a->k, bytes);
    if (rc == LOOM_OK)
        rc = c->copy(r->host, (char *)r->kv[0] + bytes, a->v, bytes);
    return rc;
}

/* ------------------------------------------------------------ attention */

static int ring_forward(loom_strategy *r, const loom_attention *a)
{
    if (r->failed)
        return broken(r);
    int rc = hold_own_block(r, a);
    if (rc != LOOM_OK)
        return rc;
    const strategy_attention_shape *sh = &r->shape;
    const size_t E = strategy_attention_elems(sh), es = loom_dtype_size(sh->dtype);
    int cur = 0, first = 1;
    for (int i = 0; i < r->size; i++) {
        int src = (r->rank - i + r->size) % r->size;
        loom_request *send = NULL, *recv = NULL;
        if (i < r->size - 1 &&
            (rc = pass_on(r, r->kv[cur], r->kv[1 - cur], 2 * E, TAG_KV, &send, &recv)) != LOOM_OK)
            return rc;
        if (visible(r, a->positions, src)) {
            /* one sequence at a time, the transfers poked in between */
            const size_t seq = (size_t)sh->T * sh->NH * sh->HS * es, lse = (size_t)sh->NH * sh->T;
            const char *k = r->kv[cur];
            for (int b = 0; b < sh->B && rc == LOOM_OK; b++) {
                a->kernels->block_forward((const char *)a->q + b * seq, a->positions, sh->T,
                                          k + b * seq, k + E * es + b * seq,
                                          r->positions + (size_t)src * sh->T, sh->T, 1, sh->NH,
                                          sh->HS, sh->dtype, (char *)a->out + b * seq,
                                          a->lse + b * lse, first);
                if ((rc = poke(r, &send)) == LOOM_OK)
                    rc = poke(r, &recv);
            }
            if (rc != LOOM_OK)
                return rc;
            first = 0;
        }
        if ((rc = finish(r, &send)) != LOOM_OK || (rc = finish(r, &recv)) != LOOM_OK)
            return rc;
        cur = 1 - cur;
    }
    return LOOM_OK;
}

static int ring_backward(loom_strategy *r, const loom_attention *a)
{
    if (r->failed)
        return broken(r);
    if (!r->positions)
        return r->host->error(r->host, LOOM_ERR_INVALID,
                              "ring: attention backward before any forward");
    int rc = hold_own_block(r, a);
    if (rc != LOOM_OK)
        return rc;
    const strategy_attention_shape *sh = &r->shape;
    const size_t E = strategy_attention_elems(sh), es = loom_dtype_size(sh->dtype);
    int cur = 0;
    loom_request *dsend = NULL;
    for (int i = 0; i < r->size; i++) {
        int src = (r->rank - i + r->size) % r->size;
        loom_request *send = NULL, *recv = NULL, *drecv = NULL;
        if (i < r->size - 1 &&
            (rc = pass_on(r, r->kv[cur], r->kv[1 - cur], 2 * E, TAG_KV_BACK, &send, &recv)) !=
                LOOM_OK)
            return rc;
        /* the gradient of this block so far, from the ranks it visited before */
        if (i > 0 && (rc = pass_on(r, NULL, r->dkv_in, 2 * E, TAG_DKV, NULL, &drecv)) != LOOM_OK)
            return rc;
        char *mine = r->dkv[i % 2];
        if ((rc = strategy_compute(r->host)->zero(r->host, mine, 2 * E * es)) != LOOM_OK)
            return rc;
        if (visible(r, a->positions, src)) {
            const size_t seq = (size_t)sh->T * sh->NH * sh->HS * es, lse = (size_t)sh->NH * sh->T;
            const char *k = r->kv[cur];
            for (int b = 0; b < sh->B && rc == LOOM_OK; b++) {
                a->kernels->block_backward(
                    (const char *)a->q + b * seq, a->positions, sh->T, k + b * seq,
                    k + E * es + b * seq, r->positions + (size_t)src * sh->T, sh->T, 1, sh->NH, sh->HS,
                    sh->dtype, (const char *)a->out + b * seq, (const char *)a->dout + b * seq,
                    a->lse + b * lse, (char *)a->dq + b * seq, mine + b * seq,
                    mine + E * es + b * seq);
                if ((rc = poke(r, &send)) == LOOM_OK && (rc = poke(r, &recv)) == LOOM_OK &&
                    (rc = poke(r, &drecv)) == LOOM_OK)
                    rc = poke(r, &dsend);
            }
            if (rc != LOOM_OK)
                return rc;
        }
        if (i > 0) {
            if ((rc = finish(r, &drecv)) != LOOM_OK)
                return rc;
            /* dkv_in is spent: the next step receives into it afresh */
            if ((rc = strategy_add_spent(r->host, mine, r->dkv_in, 2 * E, sh->dtype)) != LOOM_OK)
                return rc;
        }
        if ((rc = finish(r, &dsend)) != LOOM_OK) /* frees the other buffer for the next step */
            return rc;
        if ((rc = pass_on(r, mine, NULL, 2 * E, TAG_DKV, &dsend, NULL)) != LOOM_OK)
            return rc;
        if ((rc = finish(r, &send)) != LOOM_OK || (rc = finish(r, &recv)) != LOOM_OK)
            return rc;
        cur = 1 - cur;
    }
    /* the last hop: this rank's own block, with every rank's share */
    loom_request *drecv = NULL;
    if ((rc = pass_on(r, NULL, r->dkv_in, 2 * E, TAG_DKV, NULL, &drecv)) != LOOM_OK ||
        (rc = finish(r, &drecv)) != LOOM_OK || (rc = finish(r, &dsend)) != LOOM_OK)
        return rc;
    if ((rc = strategy_add_spent(r->host, a->dk, r->dkv_in, E, sh->dtype)) != LOOM_OK)
        return rc;
    return strategy_add_spent(r->host, a->dv, (char *)r->dkv_in + E * es, E, sh->dtype);
}

LOOM_PLUGIN_EXPORT const loom_strategy_plugin_v1_t loom_strategy_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_STRATEGY, loom_strategy_plugin_v1_t, "ring",
                                 "ring attention: K/V blocks passed around the sequence ranks, "
                                 "online softmax, optional zigzag balance",
                                 ring_settings),
    .axis = LOOM_AXIS_SP,
    .create = ring_create,
    .destroy = ring_destroy,
    .describe = ring_describe,
    .sequence_positions = ring_positions,
    .attention_forward = ring_forward,
    .attention_backward = ring_backward,
};
