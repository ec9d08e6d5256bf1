/* loom's own checkpoint reader (train/ckpt_format.c), as `loom ckpt info` and
 * `loom ckpt consolidate` read a checkpoint: open it, make a model of its
 * shape for the units' views, print what info prints, and read every
 * unit's params, m and v.
 *
 * Input: one byte of layout, then
 *   'C'  the consolidated file;
 *   'S'  a sharded directory: pieces, each a 4-byte little-endian length
 *        and that many bytes (fewer if the input ends): meta.loom first,
 *        then shard-0.loom, shard-1.loom, ... (at most 8 shards);
 *   'c', 's'  the same, resealed: each stamped file's stamp is rewritten
 *        as the writer would write it (its length, its CRC32C, and in the
 *        shards meta.loom's run id and step). A mutated byte otherwise
 *        stops at the checksum; resealed, it reaches the field checks.
 * tests/fuzz/make_corpus.sh packs real checkpoints each way. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "loom/status.h"
#include "model/formats.h"
#include "model/model.h"
#include "runtime/crc32c.h"
#include "train/ckpt_format.h"
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

/* The on-disk layout ckpt_format.c writes (ckpt_format.h): a fixed header, whose size
 * its magic tells, with the format version at byte 8 and, in meta.loom,
 * the step at byte 40; from format 3 the stamp right after it. */
enum {
    STATE_HEAD = 72, /* the consolidated file's header */
    META_HEAD = 112, /* meta.loom's: the same, then tp, files, strategy */
    SHARD_HEAD = 16,
    VERSION_AT = 8,
    STEP_AT = 40,
    STAMPED = 3
};
typedef struct stamp {
    uint64_t run_id;
    int64_t step;
    uint64_t bytes;
    uint32_t checksum, reserved;
} stamp;

/* The size of a file's fixed header; 0 when it has no stamp after it. */
static size_t head_bytes(const uint8_t *file, size_t n)
{
    uint32_t version;
    if (n < SHARD_HEAD)
        return 0;
    memcpy(&version, file + VERSION_AT, sizeof version);
    size_t head = !memcmp(file, "LOOMSTAT", 8)   ? STATE_HEAD
                  : !memcmp(file, "LOOMMETA", 8) ? META_HEAD
                  : !memcmp(file, "LOOMSHRD", 8) ? SHARD_HEAD
                                                 : 0;
    return version >= STAMPED && n >= head + sizeof(stamp) ? head : 0;
}

/* What the writer's file_seal stamps: the length, then the CRC32C of the
 * bytes after the stamp, continued over the header and the stamp with the
 * checksum zero. A shard also gets meta's run id and step (*run_id, *step)
 * as one job writes them; meta.loom sets them. */
static void reseal(uint8_t *file, size_t n, int is_meta, uint64_t *run_id, int64_t *step)
{
    size_t head = head_bytes(file, n);
    if (!head)
        return;
    stamp st;
    memcpy(&st, file + head, sizeof st);
    if (is_meta) {
        *run_id = st.run_id;
        memcpy(step, file + STEP_AT, sizeof *step);
    } else {
        st.run_id = *run_id;
        st.step = *step;
    }
    st.bytes = n;
    st.checksum = 0;
    uint32_t crc = loom_crc32c(file + head + sizeof st, n - head - sizeof st);
    crc = loom_crc32c_extend(crc, file, head);
    st.checksum = loom_crc32c_extend(crc, &st, sizeof st);
    memcpy(file + head, &st, sizeof st);
}

/* One file of the input, resealed if asked. */
static void put_file(const char *name, const uint8_t *data, size_t n, int resealed, int is_meta,
                     uint64_t *run_id, int64_t *step)
{
    char path[1024];
    fuzz_path(path, sizeof path, name);
    if (!resealed) {
        fuzz_write(path, data, n);
        return;
    }
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy)
        abort();
    memcpy(copy, data, n);
    reseal(copy, n, is_meta, run_id, step);
    fuzz_write(path, copy, n);
    free(copy);
}

/* The input's files into the directory; the path to open. */
static const char *unpack(const uint8_t *data, size_t size, char *path, size_t cap)
{
    fuzz_dir_clear();
    int resealed = data[0] == 'c' || data[0] == 's';
    uint64_t run_id = 0;
    int64_t step = 0;
    if (data[0] == 'C' || data[0] == 'c') {
        put_file("state.loom", data + 1, size - 1, resealed, 1, &run_id, &step);
        fuzz_path(path, cap, "state.loom");
        return path;
    }
    if (data[0] != 'S' && data[0] != 's')
        return NULL;
    size_t at = 1;
    for (int piece = 0; piece <= MAX_SHARDS && at + 4 <= size; piece++) {
        uint32_t len = (uint32_t)data[at] | (uint32_t)data[at + 1] << 8 |
                       (uint32_t)data[at + 2] << 16 | (uint32_t)data[at + 3] << 24;
        at += 4;
        size_t n = len < size - at ? len : size - at;
        char name[32];
        if (piece == 0)
            snprintf(name, sizeof name, "meta.loom");
        else
            snprintf(name, sizeof name, "shard-%d.loom", piece - 1);
        put_file(name, data + at, n, resealed, piece == 0, &run_id, &step);
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
