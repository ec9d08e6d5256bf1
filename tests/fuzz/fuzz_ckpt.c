/* loom's own checkpoint reader (train/ckpt.c), as `loom ckpt info` and
 * `loom ckpt consolidate` read a checkpoint: open it, make a model of its
 * shape for the units' views, print what info prints, and read every
 * unit's params, m and v.
 *
 * Input: one byte of layout, then
 *   'C'  the consolidated file;
 *   'S'  a sharded directory: pieces, each a 4-byte little-endian length
 *        and that many bytes (fewer if the input ends): meta.loom first,
 *        then shard-0.loom, shard-1.loom, ... (at most 8 shards).
 * tests/fuzz/make_corpus.sh packs real checkpoints this way. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "loom/status.h"
#include "model/formats.h"
#include "model/model.h"
#include "train/ckpt.h"
#include "fuzz_files.h"

enum { MAX_SHARDS = 8 };
/* A real checkpoint may be as large as a disk: the harness looks for wrong
 * reads, not large ones, so it skips shapes beyond a small model's. */
#define MAX_PARAMS (1u << 20)

static int small_shape(const loom_gpt2_shape *s)
{
    const int fields[] = {s->max_seq, s->vocab, s->layers, s->heads, s->channels,
                          s->padded_vocab};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (fields[i] < 0 || fields[i] > (int)MAX_PARAMS)
            return 0;
    uint64_t C = (uint64_t)s->channels, per_layer = 12 * C * C + 13 * C;
    uint64_t n = (uint64_t)s->layers * per_layer + ((uint64_t)s->padded_vocab + (uint64_t)s->max_seq) * C;
    return per_layer <= MAX_PARAMS && n <= MAX_PARAMS;
}

/* The input's files into the directory; the path to open. */
static const char *unpack(const uint8_t *data, size_t size, char *path, size_t cap)
{
    fuzz_dir_clear();
    if (data[0] == 'C') {
        fuzz_path(path, cap, "state.loom");
        fuzz_write(path, data + 1, size - 1);
        return path;
    }
    if (data[0] != 'S')
        return NULL;
    size_t at = 1;
    for (int piece = 0; piece <= MAX_SHARDS && at + 4 <= size; piece++) {
        uint32_t len = (uint32_t)data[at] | (uint32_t)data[at + 1] << 8 |
                       (uint32_t)data[at + 2] << 16 | (uint32_t)data[at + 3] << 24;
        at += 4;
        size_t n = len < size - at ? len : size - at;
        char name[32], file[1024];
        if (piece == 0)
            snprintf(name, sizeof name, "meta.loom");
        else
            snprintf(name, sizeof name, "shard-%d.loom", piece - 1);
        fuzz_path(file, sizeof file, name);
        fuzz_write(file, data + at, n);
        at += n;
    }
    snprintf(path, cap, "%s", fuzz_dir());
    return path;
}

static void read_units(loom_ckpt *ck, const loom_unit *units, int nunits)
{
    for (int u = 0; u < nunits; u++) {
        size_t n = loom_ckpt_whole_numel(&units[u]);
        float *pmv = malloc(3 * n * sizeof(float) + 1);
        if (!pmv)
            return;
        int rc = loom_ckpt_read_unit(ck, units, u, pmv, pmv + n, pmv + 2 * n);
        free(pmv);
        if (rc != LOOM_OK)
            return;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[1024];
    if (size < 1 || !unpack(data, size, path, sizeof path))
        return 0;
    loom_ckpt *ck = NULL;
    if (loom_ckpt_open(path, &ck) != LOOM_OK)
        return 0;
    const loom_ckpt_header *h = loom_ckpt_header_of(ck);
    loom_model *model = NULL;
    if (small_shape(&h->shape)) {
        loom_model_setup setup;
        memset(&setup, 0, sizeof setup);
        setup.shape = h->shape;
        setup.batch = 1;
        setup.seq = 1;
        setup.dtype = LOOM_F32;
        int nunits = 0;
        loom_unit *units = loom_model_create(&setup, &model) == LOOM_OK
                               ? loom_model_units(model, &nunits)
                               : NULL;
        if (units && nunits == h->nunits) {
            loom_ckpt_print_info(ck, units, fuzz_null());
            read_units(ck, units, nunits);
        }
    }
    loom_model_destroy(model);
    loom_ckpt_close(ck);
    return 0;
}
