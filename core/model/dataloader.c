/* The data loader: llm.c's order of windows, one global batch per step,
 * each dp rank and micro-batch taking a fixed slice of it.
 *
 * Every rank walks the same positions through the same shard, so the global
 * batch of a step does not depend on dp or grad_accum: with the same
 * weights, every layout sees the same data and can reproduce the
 * single-rank loss (DESIGN §7, the numerics contract). */
#include <string.h>

#include "loom/status.h"
#include "model/formats.h"
#include "runtime/log.h"

int loom_dataloader_init(loom_dataloader *dl, const loom_token_shard *shard, int batch, int seq,
                         int dp_rank, int dp_size, int grad_accum)
{
    memset(dl, 0, sizeof *dl);
    if (batch <= 0 || seq <= 0 || dp_size <= 0 || grad_accum <= 0)
        return loom_fail(LOOM_ERR_INVALID,
                         "data loader: train.batch %d, train.seq %d, parallel.dp.size %d and "
                         "train.grad_accum %d must all be positive",
                         batch, seq, dp_size, grad_accum);
    if (dp_rank < 0 || dp_rank >= dp_size)
        return loom_fail(LOOM_ERR_INVALID, "data loader: dp rank %d is outside 0..%d", dp_rank,
                         dp_size - 1);
    if (batch % (dp_size * grad_accum) != 0)
        return loom_fail(LOOM_ERR_INVALID,
                         "train.batch %d does not divide by parallel.dp.size %d × "
                         "train.grad_accum %d; make it a multiple of %d",
                         batch, dp_size, grad_accum, dp_size * grad_accum);
    size_t window = (size_t)batch * (size_t)seq + 1;
    if (shard->count < window)
        return loom_fail(LOOM_ERR_INVALID,
                         "data.train %s holds %zu tokens, fewer than one batch window of %zu "
                         "(train.batch %d × train.seq %d + 1)",
                         shard->path ? shard->path : "(in memory)", shard->count, window, batch,
                         seq);
    dl->shard = shard;
    dl->batch = batch;
    dl->seq = seq;
    dl->dp_rank = dp_rank;
    dl->dp_size = dp_size;
    dl->grad_accum = grad_accum;
    dl->position = 0;
    dl->micro = 0;
    return LOOM_OK;
}

int loom_dataloader_set_positions(loom_dataloader *dl, const int *positions, int count)
{
    if (count <= 0 || count > dl->seq)
        return loom_fail(LOOM_ERR_INVALID, "data loader: %d positions of a sequence of %d", count,
                         dl->seq);
    for (int i = 0; positions && i < count; i++)
        if (positions[i] < 0 || positions[i] >= dl->seq)
            return loom_fail(LOOM_ERR_INVALID,
                             "data loader: position %d is outside the sequence of %d",
                             positions[i], dl->seq);
    dl->positions = positions;
    dl->npositions = positions ? count : 0;
    return LOOM_OK;
}

void loom_dataloader_next(loom_dataloader *dl, int *inputs, int *targets)
{
    const size_t T = (size_t)dl->seq, B = (size_t)dl->batch;
    const size_t per_micro = B / (size_t)dl->grad_accum;      /* sequences per micro-batch */
    const size_t per_rank = per_micro / (size_t)dl->dp_size; /* ... of this rank */
    const size_t first = (size_t)dl->micro * per_micro + (size_t)dl->dp_rank * per_rank;
    const uint16_t *window = dl->shard->tokens + dl->position;
    /* Sequence j of the window starts at j*T; its targets are the same
     * tokens one further on, which is why a window holds B*T+1 tokens. */
    const uint16_t *src = window + first * T;
    if (dl->positions) {
        const size_t P = (size_t)dl->npositions;
        for (size_t b = 0; b < per_rank; b++)
            for (size_t i = 0; i < P; i++) {
                const uint16_t *tok = src + b * T + (size_t)dl->positions[i];
                inputs[b * P + i] = tok[0];
                targets[b * P + i] = tok[1];
            }
    } else {
        for (size_t i = 0; i < per_rank * T; i++) {
            inputs[i] = src[i];
            targets[i] = src[i + 1];
        }
    }
    if (++dl->micro == dl->grad_accum) {
        dl->micro = 0;
        dl->position += B * T;
        if (dl->position + B * T + 1 > dl->shard->count)
            dl->position = 0;
    }
}
