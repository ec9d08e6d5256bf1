/* loom core — llm.c's file formats, and the data loader.
 *
 * GPT-2 checkpoint (.bin): 256 int32 header — [0] magic 20240326,
 * [1] version 3 (fp32) or 5 (bf16), [2] maxT, [3] V, [4] L, [5] NH, [6] C,
 * [7] Vp — then the parameters as fp32 or bf16 in llm.c's order: wte (Vp,C), wpe (maxT,C),
 * ln1w (L,C), ln1b (L,C), qkvw (L,3C,C), qkvb (L,3C), attprojw (L,C,C),
 * attprojb (L,C), ln2w (L,C), ln2b (L,C), fcw (L,4C,C), fcb (L,4C),
 * fcprojw (L,C,4C), fcprojb (L,C), lnfw (C), lnfb (C).
 *
 * Token shard (.bin): 256 int32 header — [0] magic 20240520, [1] version 1,
 * [2] token count — then that many uint16 tokens. */
#ifndef LOOM_FORMATS_H
#define LOOM_FORMATS_H

#include <stddef.h>
#include <stdint.h>

#include "loom/tensor.h"

#define LOOM_GPT2_TENSORS 16

typedef struct loom_gpt2_shape {
    int max_seq, vocab, layers, heads, channels, padded_vocab;
} loom_gpt2_shape;

/* Element counts of the 16 tensors in llm.c's order, and their sum. */
void loom_gpt2_tensor_sizes(const loom_gpt2_shape *s, size_t sizes[LOOM_GPT2_TENSORS]);
size_t loom_gpt2_param_count(const loom_gpt2_shape *s);
extern const char *const loom_gpt2_tensor_names[LOOM_GPT2_TENSORS]; /* "wte", ... */

/* Read a checkpoint of either version: *params is malloc'd fp32 (bf16
 * widens exactly), llm.c's order. expect (nullable): every field must
 * match, else one line naming the file, the field, the file's value and the
 * config's. */
int loom_checkpoint_read(const char *path, const loom_gpt2_shape *expect,
                         loom_gpt2_shape *shape, float **params);
/* The header alone, checked as the read checks it (version, shape, the
 * body's size): the shape, and the element type of the version (dtype
 * nullable). */
int loom_checkpoint_read_header(const char *path, loom_gpt2_shape *shape, loom_dtype *dtype);
/* dtype LOOM_F32 writes version 3, LOOM_BF16 version 5 (rounding to
 * nearest even). */
int loom_checkpoint_write(const char *path, const loom_gpt2_shape *shape, const float *params,
                          loom_dtype dtype);

/* llm.c's random initialisation as loom defines it: every weight N(0, 0.02),
 * the residual projections (attprojw, fcprojw) N(0, 0.02/sqrt(2L)), biases
 * 0, LayerNorm weights 1 and biases 0; padded vocabulary rows 0. Seeded and
 * identical on every machine (own RNG, no libc rand). */
void loom_gpt2_init_random(const loom_gpt2_shape *s, uint64_t seed, float *params);

typedef struct loom_token_shard {
    uint16_t *tokens;
    size_t count;
    char *path; /* for messages; set by loom_shard_open, NULL for a shard built in memory */
} loom_token_shard;
/* Validates magic, version, length (truncation) and every token < vocab
 * (vocab <= 0: no token check, for tools that do not know the model). */
int loom_shard_open(const char *path, int vocab, loom_token_shard *out);
void loom_shard_close(loom_token_shard *shard);
int loom_shard_write(const char *path, const uint16_t *tokens, size_t count);

/* llm.c's order: each step reads the window of B*T+1 tokens at the current
 * position (inputs = window[0..BT), targets = window[1..BT]) and advances by
 * B*T, wrapping to 0 when the next window would not fit. The global batch
 * of B sequences is split into grad_accum micro-batches, and each micro-batch
 * over the dp ranks: micro-batch k of dp rank r holds sequences
 * k*B/K + r*B/(K*dp) ... + B/(K*dp) - 1 of the window. The same global batch
 * for any dp and K. */
typedef struct loom_dataloader {
    const loom_token_shard *shard;
    int batch, seq, dp_rank, dp_size, grad_accum;
    size_t position; /* start of the current step's window */
    int micro;       /* next micro-batch within the step */
    const int *positions; /* a sequence rank's positions of each sequence; NULL: all */
    int npositions;
} loom_dataloader;
/* Checks that batch divides by dp_size * grad_accum and the shard holds at
 * least one window, with a message naming the settings. */
int loom_dataloader_init(loom_dataloader *dl, const loom_token_shard *shard, int batch, int seq,
                         int dp_rank, int dp_size, int grad_accum);
/* A sequence-parallel rank keeps only these positions (count of them, each
 * < seq; borrowed, not copied) of every sequence, in this order, inputs
 * and targets alike. */
int loom_dataloader_set_positions(loom_dataloader *dl, const int *positions, int count);
/* Fill this rank's next micro-batch: (batch/(dp*K)) * seq inputs and targets
 * (* npositions with positions set). After the step's last micro-batch the
 * position advances. */
void loom_dataloader_next(loom_dataloader *dl, int *inputs, int *targets);

#endif
