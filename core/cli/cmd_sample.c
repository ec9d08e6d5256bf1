/* loom sample CHECKPOINT: text from a trained model, on one process and one
 * thread. The checkpoint is llm.c's (.bin) or loom's (a directory of
 * shards, or a consolidated file); the tokens are bytes, or a tokenizer
 * file's (llm.c's gpt2_tokenizer.bin). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "loom/status.h"
#include "cli/commands.h"
#include "model/formats.h"
#include "model/kernels.h"
#include "model/model.h"
#include "model/sample.h"
#include "model/tokenizer.h"
#include "runtime/files.h"
#include "runtime/log.h"
#include "train/ckpt_format.h"

#define LLMC_CHECKPOINT_MAGIC 20240326
#define DEFAULT_TOKENS 64
#define DEFAULT_SEED 1337

static const char sample_usage[] =
    "usage: loom sample CHECKPOINT [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K]\n"
    "                   [--seed S] [--tokenizer FILE]\n";

typedef struct sample_args {
    const char *checkpoint, *prompt, *tokenizer;
    const char *tokens, *temperature, *top_k, *seed; /* as given; NULL: the default */
} sample_args;

static int refuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int refuse(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("loom sample: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

static int parse_args(int argc, char **argv, sample_args *a)
{
    memset(a, 0, sizeof *a);
    struct {
        const char *name;
        const char **value;
    } options[] = {{"--prompt", &a->prompt},       {"--tokens", &a->tokens},
                   {"--temperature", &a->temperature}, {"--top-k", &a->top_k},
                   {"--seed", &a->seed},           {"--tokenizer", &a->tokenizer}};
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        size_t k = 0;
        while (k < LOOM_ARRAY_LEN(options) && strcmp(arg, options[k].name) != 0)
            k++;
        if (k == LOOM_ARRAY_LEN(options)) {
            if (arg[0] == '-' && arg[1] != '\0')
                return refuse("unknown option '%s' (the options are --prompt, --tokens, "
                              "--temperature, --top-k, --seed and --tokenizer)", arg);
            if (a->checkpoint)
                return refuse("one checkpoint only: '%s' and '%s' (a prompt goes after "
                              "--prompt)", a->checkpoint, arg);
            a->checkpoint = arg;
            continue;
        }
        if (i + 1 >= argc)
            return refuse("%s needs a value", arg);
        if (*options[k].value)
            return refuse("%s given twice", arg);
        *options[k].value = argv[++i];
    }
    if (!a->checkpoint) {
        fputs(sample_usage, stderr);
        return 2;
    }
    return 0;
}

/* A whole decimal integer in [lo, hi]. */
static int parse_int(const char *name, const char *text, long long lo, long long hi,
                     const char *meaning, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi)
        return refuse("%s %s: expected an integer %s", name, text, meaning);
    *out = v;
    return 0;
}

typedef struct loaded_model {
    loom_gpt2_shape shape;
    float *weights; /* llm.c's order */
} loaded_model;

/* A loom checkpoint's weights: any model of its shape gives the units'
 * views. */
static int read_loom_checkpoint(const char *path, loaded_model *out)
{
    loom_ckpt *ck = NULL;
    loom_model *views = NULL;
    int rc = loom_ckpt_open(path, &ck);
    if (rc == LOOM_OK) {
        loom_model_setup setup;
        memset(&setup, 0, sizeof setup);
        setup.shape = out->shape = loom_ckpt_header_of(ck)->shape;
        setup.batch = 1;
        setup.seq = 1;
        setup.dtype = LOOM_F32;
        rc = loom_model_create(&setup, &views);
    }
    if (rc == LOOM_OK)
        rc = loom_ckpt_read_llmc(ck, views, &out->weights);
    loom_model_destroy(views);
    loom_ckpt_close(ck);
    return rc;
}

/* llm.c's file by its magic; anything else must be loom's. */
static int load_checkpoint(const char *path, loaded_model *out)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return loom_fail(LOOM_ERR_NOT_FOUND, "checkpoint %s: %s; give an llm.c checkpoint (.bin) "
                         "or a loom checkpoint (directory or consolidated file)", path,
                         strerror(errno));
    if (S_ISDIR(st.st_mode))
        return read_loom_checkpoint(path, out);
    int32_t magic = 0;
    const char *why = NULL;
    FILE *f = loom_fopen_regular(path, &why);
    if (!f)
        return loom_fail(LOOM_ERR_NOT_FOUND, "checkpoint %s: %s", path, why);
    size_t got = fread(&magic, sizeof magic, 1, f);
    fclose(f);
    if (got == 1 && magic == LLMC_CHECKPOINT_MAGIC)
        return loom_checkpoint_read(path, NULL, &out->shape, &out->weights);
    int rc = read_loom_checkpoint(path, out);
    if (rc != LOOM_OK) {
        char cause[1024];
        snprintf(cause, sizeof cause, "%s", loom_last_error());
        return loom_fail(rc, "%s; nor is it an llm.c checkpoint (magic %d)", cause,
                         LLMC_CHECKPOINT_MAGIC);
    }
    return LOOM_OK;
}

/* Where the text goes, token by token: a tokenizer's bytes, or the token
 * itself as a byte. */
typedef struct text_out {
    const loom_tokenizer *tokenizer; /* NULL: bytes */
    int last;                        /* the last byte written; -1: none */
} text_out;

static void write_bytes(text_out *o, const unsigned char *bytes, size_t n)
{
    if (n == 0)
        return;
    fwrite(bytes, 1, n, stdout);
    o->last = bytes[n - 1];
}

static void write_token(void *ctx, int token)
{
    text_out *o = ctx;
    unsigned char byte = (unsigned char)token;
    size_t n = 1;
    const unsigned char *bytes = o->tokenizer ? loom_tokenizer_decode(o->tokenizer, token, &n)
                                              : &byte;
    write_bytes(o, bytes, n);
    fflush(stdout); /* the text appears as it is made */
}

/* The prompt's tokens: the tokenizer's longest matches, or its bytes; an
 * empty prompt starts from the end-of-text token (llm.c's start), or for
 * bytes from a newline. */
static int encode_prompt(const sample_args *a, const loom_tokenizer *tok, int vocab,
                         int **tokens, int *count)
{
    const char *text = a->prompt ? a->prompt : "";
    size_t len = strlen(text);
    if (len == 0) {
        if (tok && tok->eot < 0)
            return loom_fail(LOOM_ERR_INVALID, "--tokenizer %s names no end-of-text token to "
                             "start an empty prompt from; give --prompt TEXT", tok->path);
        if (!(*tokens = malloc(sizeof **tokens)))
            return loom_fail(LOOM_ERR_NO_MEMORY, "sample: out of memory");
        **tokens = tok ? tok->eot : loom_sample_start_token(vocab);
        *count = 1;
        return LOOM_OK;
    }
    if (tok)
        return loom_tokenizer_encode(tok, text, len, tokens, count);
    if (!(*tokens = malloc(len * sizeof **tokens)))
        return loom_fail(LOOM_ERR_NO_MEMORY, "sample: out of memory");
    for (size_t i = 0; i < len; i++) {
        int byte = (unsigned char)text[i];
        if (byte >= vocab) {
            free(*tokens);
            *tokens = NULL;
            return loom_fail(LOOM_ERR_INVALID, "--prompt: byte %zu is 0x%02x, outside the "
                             "model's vocabulary of %d tokens; leave it out", i, byte, vocab);
        }
        (*tokens)[i] = byte;
    }
    *count = (int)len;
    return LOOM_OK;
}

/* The numbers of the command line into o; greedy (temperature 0) when
 * --top-k 1 says so too. A setting that would do nothing is refused. */
static int parse_numbers(const sample_args *a, loom_sample_options *o)
{
    long long tokens = DEFAULT_TOKENS, top_k = 0, seed = DEFAULT_SEED;
    double temperature = 1.0;
    if (a->tokens && parse_int("--tokens", a->tokens, 0, 1000000,
                               "from 0 to 1000000 (how many to generate)", &tokens))
        return 2;
    if (a->top_k && parse_int("--top-k", a->top_k, 0, INT32_MAX,
                              ">= 0 (draw among the K most likely; 0 = all)", &top_k))
        return 2;
    if (a->seed && parse_int("--seed", a->seed, 0, INT64_MAX, ">= 0", &seed))
        return 2;
    if (a->temperature) {
        char *end;
        temperature = strtod(a->temperature, &end);
        if (end == a->temperature || *end || !isfinite((float)temperature) || temperature < 0)
            return refuse("--temperature %s: expected a number >= 0 (0 = greedy, the most "
                          "likely token every time)", a->temperature);
    }
    int greedy = temperature == 0 || top_k == 1;
    if (temperature == 0 && a->top_k)
        return refuse("--top-k does nothing with --temperature 0 (greedy takes the most likely "
                      "token); remove one of them");
    if (greedy && a->seed)
        return refuse("--seed does nothing when sampling is greedy (--temperature 0 or "
                      "--top-k 1 draw nothing); remove it");
    o->tokens = (int)tokens;
    o->temperature = greedy ? 0.0f : (float)temperature;
    o->top_k = (int)top_k;
    o->seed = (uint64_t)seed;
    return 0;
}

/* The model's vocabulary against the tokenizer (or bytes) and --top-k. */
static int check_vocab(const sample_args *a, const loom_tokenizer *tok, int vocab, int top_k)
{
    if (tok && tok->vocab != vocab)
        return loom_fail(LOOM_ERR_INVALID, "--tokenizer %s has %d tokens, the model in %s has "
                         "%d; give the tokenizer the model was trained with", a->tokenizer,
                         tok->vocab, a->checkpoint, vocab);
    if (!tok && vocab > 256)
        return loom_fail(LOOM_ERR_INVALID, "%s: the model has %d tokens, more than bytes; give "
                         "its tokenizer with --tokenizer FILE (for GPT-2, llm.c's "
                         "gpt2_tokenizer.bin)", a->checkpoint, vocab);
    if (top_k > vocab)
        return loom_fail(LOOM_ERR_INVALID, "--top-k %d: the model has only %d tokens; give at "
                         "most %d (0 = all)", top_k, vocab, vocab);
    return LOOM_OK;
}

int loom_cmd_sample(int argc, char **argv)
{
    sample_args a;
    loom_sample_options o = {0};
    int bad = parse_args(argc, argv, &a);
    if (bad || (bad = parse_numbers(&a, &o)))
        return bad;
    loaded_model m = {0};
    loom_tokenizer tokenizer = {0};
    const loom_tokenizer *tok = NULL;
    int *prompt = NULL, nprompt = 0, *out = NULL;
    int rc = load_checkpoint(a.checkpoint, &m);
    if (rc == LOOM_OK && a.tokenizer &&
        (rc = loom_tokenizer_open(a.tokenizer, &tokenizer)) == LOOM_OK)
        tok = &tokenizer;
    if (rc == LOOM_OK)
        rc = check_vocab(&a, tok, m.shape.vocab, o.top_k);
    if (rc == LOOM_OK)
        rc = encode_prompt(&a, tok, m.shape.vocab, &prompt, &nprompt);
    if (rc == LOOM_OK && !(out = malloc(((size_t)o.tokens + 1) * sizeof *out)))
        rc = loom_fail(LOOM_ERR_NO_MEMORY, "sample: out of memory");
    if (rc == LOOM_OK) {
        text_out text = {tok, -1};
        if (a.prompt)
            write_bytes(&text, (const unsigned char *)a.prompt, strlen(a.prompt));
        o.on_token = write_token;
        o.ctx = &text;
        loom_kernels_set_threads(1);
        rc = loom_sample(&m.shape, m.weights, prompt, nprompt, &o, out);
        if (rc != LOOM_OK) {
            char cause[1024];
            snprintf(cause, sizeof cause, "%s", loom_last_error());
            loom_fail(rc, "%s: %s", a.checkpoint, cause);
        }
        if (text.last != '\n')
            putchar('\n');
        fflush(stdout);
    }
    if (rc != LOOM_OK)
        fprintf(stderr, "loom sample: %s\n", loom_last_error());
    free(out);
    free(prompt);
    if (tok)
        loom_tokenizer_close(&tokenizer);
    free(m.weights);
    return rc == LOOM_OK ? 0 : 1;
}
