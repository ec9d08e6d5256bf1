/* loom core — llm.c's tokenizer file (gpt2_tokenizer.bin), for `loom sample`.
 *
 * Format: 256 uint32 header — [0] magic 20240328, [1] version 1 or 2,
 * [2] vocabulary size, [3] the end-of-text token (version 2; version 1 files
 * are GPT-2's, whose end-of-text is 50256) — then for each token a uint8
 * length (>= 1) and that many bytes.
 *
 * The file holds the bytes of each token but not GPT-2's merge rules, so
 * decoding is exact and encoding is not GPT-2's: loom_tokenizer_encode
 * takes the longest token that matches at each point of the text, which
 * gives the same bytes back but often other tokens than GPT-2's encoder
 * would. */
#ifndef LOOM_TOKENIZER_H
#define LOOM_TOKENIZER_H

#include <stddef.h>

typedef struct loom_tokenizer {
    int vocab;
    int eot;              /* the end-of-text token; -1: the file names none */
    unsigned char *bytes; /* every token's bytes, back to back */
    size_t *offset;       /* vocab + 1: token i is bytes[offset[i] .. offset[i+1]) */
    char *path;           /* for messages */
} loom_tokenizer;

/* Checks the magic, version and length; a bad file fails with one line
 * naming it. */
int loom_tokenizer_open(const char *path, loom_tokenizer *out);
void loom_tokenizer_close(loom_tokenizer *t);

/* The bytes of token (0 <= token < vocab) and their count. */
const unsigned char *loom_tokenizer_decode(const loom_tokenizer *t, int token, size_t *len);

/* text (len bytes) -> *tokens (malloc'd, *count of them), by the longest
 * matching token at each point (the lowest of equals). A byte no token
 * starts with fails, naming its offset. */
int loom_tokenizer_encode(const loom_tokenizer *t, const char *text, size_t len, int **tokens,
                          int *count);

#endif
