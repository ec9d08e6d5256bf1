/* llm.c's tokenizer file (tokenizer.h): read, decode, encode by longest
 * match. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/status.h"
#include "model/tokenizer.h"
#include "runtime/files.h"
#include "runtime/log.h"

#define TOKENIZER_MAGIC 20240328u
#define HEADER_INTS 256
#define GPT2_VOCAB 50257
#define GPT2_EOT 50256

static int bad(const char *path, const char *what)
{
    return loom_fail(LOOM_ERR_INVALID, "tokenizer %s: %s (want llm.c's gpt2_tokenizer.bin, "
                     "magic %u, version 1 or 2)", path, what, TOKENIZER_MAGIC);
}

static int read_table(FILE *f, const char *path, loom_tokenizer *t)
{
    size_t cap = 8 * (size_t)t->vocab + 64, used = 0;
    t->bytes = malloc(cap);
    t->offset = malloc(((size_t)t->vocab + 1) * sizeof *t->offset);
    if (!t->bytes || !t->offset)
        return loom_fail(LOOM_ERR_NO_MEMORY, "tokenizer %s: out of memory", path);
    for (int i = 0; i < t->vocab; i++) {
        unsigned char len;
        if (fread(&len, 1, 1, f) != 1)
            return bad(path, "truncated: fewer tokens than its header says");
        if (len == 0)
            return bad(path, "a token of length 0");
        if (used + len > cap) {
            unsigned char *grown = realloc(t->bytes, cap *= 2);
            if (!grown)
                return loom_fail(LOOM_ERR_NO_MEMORY, "tokenizer %s: out of memory", path);
            t->bytes = grown;
        }
        t->offset[i] = used;
        if (fread(t->bytes + used, 1, len, f) != len)
            return bad(path, "truncated: fewer tokens than its header says");
        used += len;
    }
    t->offset[t->vocab] = used;
    if (fgetc(f) != EOF)
        return bad(path, "trailing bytes after the last token");
    return LOOM_OK;
}

int loom_tokenizer_open(const char *path, loom_tokenizer *out)
{
    memset(out, 0, sizeof *out);
    out->eot = -1;
    const char *why = NULL;
    FILE *f = loom_fopen_regular(path, &why);
    if (!f)
        return loom_fail(LOOM_ERR_NOT_FOUND, "tokenizer %s: cannot open: %s", path, why);
    uint32_t header[HEADER_INTS];
    int rc = LOOM_OK;
    size_t got = fread(header, 1, sizeof header, f);
    /* the magic first: "not a tokenizer" says more about a small text file */
    if (got >= sizeof header[0] && header[0] != TOKENIZER_MAGIC)
        rc = bad(path, "not a tokenizer file (wrong magic)");
    else if (got < sizeof header)
        rc = bad(path, "shorter than the 1024-byte header");
    else if (header[1] != 1 && header[1] != 2)
        rc = bad(path, "unknown version");
    else if (header[2] < 1 || header[2] > INT32_MAX / 16)
        rc = bad(path, "bad vocabulary size in its header");
    else if (header[1] == 2 && header[3] >= header[2])
        rc = bad(path, "its end-of-text token is outside its vocabulary");
    if (rc == LOOM_OK) {
        out->vocab = (int)header[2];
        /* version 1 predates the field: its files are GPT-2's */
        if (header[1] == 2)
            out->eot = (int)header[3];
        else if (out->vocab == GPT2_VOCAB)
            out->eot = GPT2_EOT;
        rc = read_table(f, path, out);
    }
    fclose(f);
    if (rc == LOOM_OK && !(out->path = strdup(path)))
        rc = loom_fail(LOOM_ERR_NO_MEMORY, "tokenizer %s: out of memory", path);
    if (rc != LOOM_OK)
        loom_tokenizer_close(out);
    return rc;
}

void loom_tokenizer_close(loom_tokenizer *t)
{
    free(t->bytes);
    free(t->offset);
    free(t->path);
    memset(t, 0, sizeof *t);
}

const unsigned char *loom_tokenizer_decode(const loom_tokenizer *t, int token, size_t *len)
{
    *len = t->offset[token + 1] - t->offset[token];
    return t->bytes + t->offset[token];
}

/* The longest token that text[0..len) starts with; -1: none. A scan of the
 * whole table per token: prompts are short. */
static int longest_match(const loom_tokenizer *t, const unsigned char *text, size_t len)
{
    int best = -1;
    size_t best_len = 0;
    for (int i = 0; i < t->vocab; i++) {
        size_t n = t->offset[i + 1] - t->offset[i];
        if (n > best_len && n <= len && !memcmp(t->bytes + t->offset[i], text, n)) {
            best = i;
            best_len = n;
        }
    }
    return best;
}

int loom_tokenizer_encode(const loom_tokenizer *t, const char *text, size_t len, int **tokens,
                          int *count)
{
    *tokens = malloc((len ? len : 1) * sizeof **tokens); /* at most one token per byte */
    *count = 0;
    if (!*tokens)
        return loom_fail(LOOM_ERR_NO_MEMORY, "tokenizer: out of memory");
    const unsigned char *p = (const unsigned char *)text;
    for (size_t at = 0; at < len;) {
        int token = longest_match(t, p + at, len - at);
        if (token < 0) {
            free(*tokens);
            *tokens = NULL;
            return loom_fail(LOOM_ERR_INVALID, "--prompt: byte %zu (0x%02x) starts no token of "
                             "tokenizer %s; leave it out", at, p[at], t->path);
        }
        (*tokens)[(*count)++] = token;
        at += t->offset[token + 1] - t->offset[token];
    }
    return LOOM_OK;
}
