/* llm.c's token shard reader (model/formats.c) and the data loader over it
 * (model/dataloader.c): the shard opened whole, then as data.train with a
 * few batches read.
 *
 * Input: 4 bytes of settings — the vocabulary 64 + b0 (tokens at or above
 * it are refused), train.seq 1 + b1 % 16, data.readers 1 + b2 % 3,
 * data.shuffle b3 & 1, train.batch = data.readers × (1 + (b3 >> 1) % 4) —
 * then the shard file. */
#include <stdint.h>
#include <stdlib.h>

#include "loom/status.h"
#include "model/dataloader.h"
#include "model/formats.h"
#include "fuzz_files.h"

enum { SETTINGS = 4, BATCHES = 3 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < SETTINGS)
        return 0;
    int vocab = 64 + data[0];
    loom_data_order order = {0};
    order.seq = 1 + data[1] % 16;
    order.readers = 1 + data[2] % 3;
    order.shuffle = data[3] & 1;
    order.batch = order.readers * (1 + (data[3] >> 1) % 4);
    char path[1024];
    fuzz_path(path, sizeof path, "shard.bin");
    fuzz_write(path, data + SETTINGS, size - SETTINGS);

    loom_token_shard shard;
    if (loom_shard_open(path, vocab, &shard) == LOOM_OK)
        loom_shard_close(&shard);
    const char *patterns[1] = {path};
    loom_dataset ds;
    if (loom_dataset_open(&ds, "data.train", "fuzz", patterns, 1, vocab) != LOOM_OK)
        return 0;
    loom_dataloader dl;
    if (loom_dataloader_init(&dl, &ds, &order, 0, 1, 1) == LOOM_OK) {
        size_t n = (size_t)order.batch * (size_t)order.seq;
        int *inputs = malloc(n * sizeof *inputs), *targets = malloc(n * sizeof *targets);
        for (int b = 0; inputs && targets && b < BATCHES; b++)
            if (loom_dataloader_next(&dl, inputs, targets) != LOOM_OK)
                break;
        free(inputs);
        free(targets);
        loom_dataloader_free(&dl);
    }
    loom_dataset_close(&ds);
    return 0;
}
