/* loom core — text from a GPT-2, one token at a time (`loom sample`,
 * train.sample_every): the model reads the context, the next token is drawn
 * from the head's logits at its last position, and joins the context.
 *
 * The draws come from loom's own generator (splitmix64), so a seed gives
 * the same tokens on every machine for the same logits; a different BLAS
 * can change the logits' last bits, and with them, rarely, a draw. */
#ifndef LOOM_SAMPLE_H
#define LOOM_SAMPLE_H

#include <stdint.h>

#include "model/formats.h"

typedef struct loom_sample_options {
    int tokens;        /* how many to generate */
    float temperature; /* the logits are divided by it; 0: greedy (the most likely token) */
    int top_k;         /* draw among the k most likely tokens only; 0: among all */
    uint64_t seed;     /* of the draws (greedy draws nothing) */
    /* Called with each token as it is chosen, e.g. to print it; NULL: none. */
    void (*on_token)(void *ctx, int token);
    void *ctx;
} loom_sample_options;

/* Continue prompt (nprompt >= 1 tokens, each < shape->vocab) by o->tokens
 * tokens, written to out, with the model of shape and weights (fp32, llm.c's
 * order). The model sees the last shape->max_seq tokens. Runs on this
 * thread, with whatever BLAS threads the caller set. Logits that are not all
 * finite stop it with LOOM_ERR_INVALID before their token is chosen. */
int loom_sample(const loom_gpt2_shape *shape, const float *weights, const int *prompt,
                int nprompt, const loom_sample_options *o, int *out);

/* A candidate of a draw; loom_sample_choose sorts them in work. */
typedef struct loom_sample_candidate {
    float logit;
    int token;
} loom_sample_candidate;

/* One choice from the logits of vocab tokens: the first most likely token
 * when greedy (temperature 0, or top_k 1), else a draw from the softmax of
 * logits / temperature over the top_k most likely (ties: the lower token
 * first), advancing *rng. work holds vocab candidates. */
int loom_sample_choose(const float *logits, int vocab, float temperature, int top_k,
                       uint64_t *rng, loom_sample_candidate *work);

/* Where a sample with no prompt starts when no tokenizer names an
 * end-of-text token: a newline for a byte-level model (vocab <= 256; a
 * fresh line of text), else the vocabulary's last token, which for GPT-2's
 * is end-of-text (50256), llm.c's start. */
int loom_sample_start_token(int vocab);

/* The generator's state for a seed. */
uint64_t loom_sample_rng(uint64_t seed);

#endif
