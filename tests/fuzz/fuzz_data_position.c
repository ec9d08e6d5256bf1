/* The data loader's saved position (model/dataloader.c), as a checkpoint
 * holds it: restored into a loader over a fixed dataset, as --resume does,
 * then a few batches read; and printed, as `loom ckpt info` prints it.
 *
 * Input: 1 byte of settings — data.shuffle b0 & 1, data.readers
 * 1 + (b0 >> 1) % 2 — then the position's bytes. The dataset is two token
 * shards made here, which tests/fuzz/make_corpus.sh makes the same
 * (fuzz-a.bin and fuzz-b.bin, token i = (5i + 1) % 8 and (3i + 2) % 8),
 * read with train.batch 4, train.seq 4, vocabulary 8. */
#include <stdint.h>
#include <stdlib.h>

#include "loom/status.h"
#include "model/dataloader.h"
#include "model/formats.h"
#include "fuzz_files.h"

enum { VOCAB = 8, BATCH = 4, SEQ = 4, BATCHES = 3 };

static loom_dataset dataset;

static void make_shard(const char *name, size_t count, unsigned mul, unsigned add, char *path,
                       size_t cap)
{
    uint16_t *tokens = malloc(count * sizeof *tokens);
    if (!tokens)
        abort();
    for (size_t i = 0; i < count; i++)
        tokens[i] = (uint16_t)((mul * i + add) % VOCAB);
    fuzz_path(path, cap, name);
    if (loom_shard_write(path, tokens, count) != LOOM_OK)
        abort();
    free(tokens);
}

static void open_dataset(void)
{
    static char a[1024], b[1024];
    make_shard("fuzz-a.bin", 601, 5, 1, a, sizeof a);
    make_shard("fuzz-b.bin", 457, 3, 2, b, sizeof b);
    const char *patterns[2] = {a, b};
    if (loom_dataset_open(&dataset, "data.train", "fuzz", patterns, 2, VOCAB) != LOOM_OK)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (!dataset.nfiles)
        open_dataset();
    loom_data_order order = {0};
    order.shuffle = data[0] & 1;
    order.readers = 1 + (data[0] >> 1) % 2;
    order.batch = BATCH;
    order.seq = SEQ;
    const unsigned char *position = data + 1;
    size_t bytes = size - 1;
    loom_data_position_print(position, bytes, fuzz_null());
    loom_dataloader dl;
    if (loom_dataloader_init(&dl, &dataset, &order, 0, 1, 1) != LOOM_OK)
        abort(); /* the fixed dataset holds every order above */
    if (loom_dataloader_restore(&dl, position, bytes, "fuzz") == LOOM_OK) {
        int inputs[BATCH * SEQ], targets[BATCH * SEQ];
        for (int b = 0; b < BATCHES; b++)
            if (loom_dataloader_next(&dl, inputs, targets) != LOOM_OK)
                break;
    }
    loom_dataloader_free(&dl);
    return 0;
}
