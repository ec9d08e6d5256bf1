/* loom core — llm.c's file formats (the data loader is model/dataloader.h).
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
#define LOOM_SHARD_HEADER_BYTES 1024 /* 256 int32: a token shard's tokens start here */

typedef struct loom_gpt2_shape {
    int max_seq, vocab, layers, heads, channels, padded_vocab;
} loom_gpt2_shape;

/* Element counts of the 16 tensors in llm.c's order, and their sum. */
void loom_gpt2_tensor_sizes(const loom_gpt2_shape *s, size_t sizes[LOOM_GPT2_TENSORS]);
size_t loom_gpt2_param_count(const loom_gpt2_shape *s);
/* Bytes of fp32 parameters of a shape whose fields are all positive, or 0
 * when they would not fit in 63 bits: for shapes read from files, where a
 * wrapped product would pass a size test. */
uint64_t loom_gpt2_param_bytes(const loom_gpt2_shape *s);
extern const char *const loom_gpt2_tensor_names[LOOM_GPT2_TENSORS]; /* "wte", ... */

/* Read a checkpoint of either version: *params is malloc'd fp32 (bf16
 * widens exactly), llm.c's order. expect (nullable): every field must
 * match, else one line naming the file, the field, the file's value and the
 * config's. A parameter that is NaN or infinite is refused too, naming the
 * first by tensor, layer and element, and how many there are. */
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
/* The same checks of magic, version and size without reading the tokens:
 * *count tokens follow the 1024-byte header. */
int loom_shard_inspect(const char *path, size_t *count);
void loom_shard_close(loom_token_shard *shard);
int loom_shard_write(const char *path, const uint16_t *tokens, size_t count);

#endif
