/* loom-text2shard IN.txt OUT.bin: a text file as an llm.c token shard with
 * byte-level tokens (each byte is one token, vocabulary 256), for the small
 * models of the examples that need no tokenizer. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/status.h"
#include "model/formats.h"
#include "runtime/log.h"

int main(int argc, char **argv)
{
    int help = argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"));
    if (argc != 3 || help) {
        fprintf(help ? stdout : stderr, "usage: loom-text2shard IN.txt OUT.bin\n"
                        "  writes the bytes of IN.txt as an llm.c token shard (one token per "
                        "byte, vocabulary 256)\n");
        return help ? 0 : 2;
    }
    const char *in = argv[1], *out = argv[2];
    FILE *f = fopen(in, "rb");
    if (!f) {
        fprintf(stderr, "loom-text2shard: %s: cannot open: %s\n", in, strerror(errno));
        return 1;
    }
    size_t cap = 1 << 16, n = 0;
    unsigned char *bytes = malloc(cap);
    for (;;) {
        if (!bytes) {
            fprintf(stderr, "loom-text2shard: %s: out of memory\n", in);
            return 1;
        }
        n += fread(bytes + n, 1, cap - n, f);
        if (n < cap)
            break;
        cap *= 2;
        bytes = realloc(bytes, cap);
    }
    if (ferror(f)) {
        fprintf(stderr, "loom-text2shard: %s: cannot read: %s\n", in, strerror(errno));
        return 1;
    }
    fclose(f);
    uint16_t *tokens = malloc(n ? n * sizeof(uint16_t) : 1);
    if (!tokens) {
        fprintf(stderr, "loom-text2shard: %s: out of memory\n", in);
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        tokens[i] = bytes[i];
    if (loom_shard_write(out, tokens, n) != LOOM_OK) {
        fprintf(stderr, "loom-text2shard: %s\n", loom_last_error());
        return 1;
    }
    printf("%s: %zu tokens (byte-level, vocabulary 256) from %s\n", out, n, in);
    free(tokens);
    free(bytes);
    return 0;
}
