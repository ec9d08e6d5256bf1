/* Text from a GPT-2 (sample.h): a model of one sequence whose length is the
 * context needed, run unit by unit on the whole window for every token. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loom/status.h"
#include "model/model.h"
#include "model/sample.h"
#include "runtime/log.h"

#define GOLDEN 0x9e3779b97f4a7c15ull

/* splitmix64's output function: the generator is a counter stepped by
 * GOLDEN, mixed. */
static uint64_t mix(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t loom_sample_rng(uint64_t seed)
{
    return mix(seed ^ 0x6c6f6f6d73616d70ull); /* "loomsamp" */
}

/* Uniform in [0, 1) from 53 bits: exact in double. */
static double uniform(uint64_t *rng)
{
    *rng += GOLDEN;
    return (double)(mix(*rng) >> 11) * 0x1p-53;
}

static int by_logit(const void *a, const void *b)
{
    const loom_sample_candidate *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return x->token < y->token ? -1 : x->token > y->token;
}

int loom_sample_choose(const float *logits, int vocab, float temperature, int top_k,
                       uint64_t *rng, loom_sample_candidate *work)
{
    int best = 0;
    for (int i = 1; i < vocab; i++)
        if (logits[i] > logits[best])
            best = i;
    if (temperature == 0.0f || top_k == 1)
        return best;
    for (int i = 0; i < vocab; i++)
        work[i] = (loom_sample_candidate){logits[i], i};
    int n = vocab;
    if (top_k > 0 && top_k < vocab) {
        qsort(work, (size_t)vocab, sizeof *work, by_logit);
        n = top_k;
    }
    /* exp((l - max) / T): the largest weight is 1, none overflows */
    double total = 0.0, scale = 1.0 / temperature, top = logits[best];
    for (int i = 0; i < n; i++)
        total += exp(((double)work[i].logit - top) * scale);
    double target = uniform(rng) * total, sum = 0.0;
    for (int i = 0; i < n; i++) {
        sum += exp(((double)work[i].logit - top) * scale);
        if (target < sum)
            return work[i].token;
    }
    return work[n - 1].token; /* target within rounding of total */
}

int loom_sample_start_token(int vocab)
{
    if (vocab > 256)
        return vocab - 1;
    return '\n' < vocab ? '\n' : 0;
}

/* Logits that are NaN or infinite choose token 0 every time, whatever the
 * text: weights that overflow, or that a diverged run wrote. */
static int check_logits(const float *logits, int vocab, int token)
{
    int bad = 0;
    for (int i = 0; i < vocab; i++)
        bad += !isfinite(logits[i]);
    if (bad == 0)
        return LOOM_OK;
    return loom_fail(LOOM_ERR_INVALID, "the model's logits for token %d are not finite (%d of %d "
                     "are NaN or infinite): its weights overflow or its run diverged; sample from "
                     "an earlier checkpoint", token + 1, bad, vocab);
}

/* A model of one sequence of seq tokens holding weights. */
static int build_model(const loom_gpt2_shape *shape, const float *weights, int seq,
                       loom_model **out, float ***unit_params)
{
    loom_model_setup setup;
    memset(&setup, 0, sizeof setup);
    setup.shape = *shape;
    setup.batch = 1;
    setup.seq = seq;
    setup.dtype = LOOM_F32;
    int rc = loom_model_create(&setup, out), nunits = 0;
    if (rc != LOOM_OK)
        return rc;
    loom_unit *units = loom_model_units(*out, &nunits);
    float **params = *unit_params = calloc((size_t)nunits, sizeof *params);
    if (!params)
        return loom_fail(LOOM_ERR_NO_MEMORY, "sample: out of memory");
    for (int u = 0; u < nunits; u++) {
        if (!(params[u] = malloc(units[u].numel * sizeof(float))))
            return loom_fail(LOOM_ERR_NO_MEMORY, "sample: out of memory for the weights");
        units[u].params = params[u];
    }
    loom_model_split_params(*out, weights, params);
    return LOOM_OK;
}

int loom_sample(const loom_gpt2_shape *shape, const float *weights, const int *prompt,
                int nprompt, const loom_sample_options *o, int *out)
{
    if (nprompt < 1 || o->tokens < 0)
        return loom_fail(LOOM_ERR_INVALID, "sample: %d prompt tokens, %d to generate", nprompt,
                         o->tokens);
    for (int i = 0; i < nprompt; i++)
        if (prompt[i] < 0 || prompt[i] >= shape->vocab)
            return loom_fail(LOOM_ERR_INVALID, "sample: prompt token %d is %d, outside the "
                             "model's vocabulary of %d", i, prompt[i], shape->vocab);
    if (o->tokens == 0)
        return LOOM_OK;
    /* the longest window the model will read: the whole history before the
     * last token is chosen, at most max_seq */
    int total = nprompt + o->tokens, seq = total - 1 < shape->max_seq ? total - 1 : shape->max_seq;
    loom_model *model = NULL;
    float **params = NULL;
    int *history = malloc((size_t)total * sizeof *history);
    int *inputs = malloc((size_t)seq * sizeof *inputs);
    int *targets = calloc((size_t)seq, sizeof *targets); /* any valid token: the loss is unused */
    loom_sample_candidate *work = malloc((size_t)shape->vocab * sizeof *work);
    float *logits = malloc((size_t)shape->padded_vocab * sizeof *logits);
    int rc = history && inputs && targets && work && logits
                 ? build_model(shape, weights, seq, &model, &params)
                 : loom_fail(LOOM_ERR_NO_MEMORY, "sample: out of memory");
    uint64_t rng = loom_sample_rng(o->seed);
    int nunits = shape->layers + 2;
    if (rc == LOOM_OK)
        memcpy(history, prompt, (size_t)nprompt * sizeof *history);
    for (int have = nprompt; rc == LOOM_OK && have < total; have++) {
        /* the last seq tokens; positions past the history do not reach
         * earlier ones through causal attention, so zeros do there */
        int window = have < seq ? have : seq;
        memset(inputs, 0, (size_t)seq * sizeof *inputs);
        memcpy(inputs, history + have - window, (size_t)window * sizeof *inputs);
        for (int u = 0; rc == LOOM_OK && u < nunits; u++)
            rc = loom_model_forward(model, u, inputs, targets, NULL);
        if (rc != LOOM_OK)
            break;
        if ((rc = loom_model_logits(model, window - 1, logits)) != LOOM_OK ||
            (rc = check_logits(logits, shape->vocab, have - nprompt)) != LOOM_OK)
            break;
        history[have] = loom_sample_choose(logits, shape->vocab, o->temperature, o->top_k, &rng,
                                           work);
        out[have - nprompt] = history[have];
        if (o->on_token)
            o->on_token(o->ctx, history[have]);
    }
    for (int u = 0; params && u < nunits; u++)
        free(params[u]);
    free(params);
    loom_model_destroy(model);
    free(history);
    free(inputs);
    free(targets);
    free(work);
    free(logits);
    return rc;
}
