/* loom core — resumable checkpoints (DESIGN §8, `loom ckpt`).
 *
 * Two layouts hold the same thing: every unit's fp32 master parameters and
 * Adam m and v, plus where training stood (step, the data loader's position
 * and order, loss scale).
 *
 *  sharded      a directory written by a running job, each rank its own
 *               file with what it owns (shard-<rank>.loom: records of
 *               unit, tp rank, element range of that tp rank's flat buffer,
 *               then params, m, v), and meta.loom (the header and the tp
 *               slices of every tensor), written by rank 0 last, so a
 *               directory without it is incomplete. No rank ever holds more
 *               than its own state.
 *  consolidated one file: the header, then each unit's whole (unsplit)
 *               params, m and v in unit order (`loom ckpt consolidate`
 *               writes it from a sharded directory).
 *
 * Either loads into any mesh and any data strategy: the reader assembles a
 * unit's whole arrays and the trainer slices and hands them on. */
#ifndef LOOM_CKPT_H
#define LOOM_CKPT_H

#include <stdio.h>

#include "loom/tensor.h"
#include "model/formats.h"
#include "model/model.h"
#include "loom/strategy.h"

typedef struct loom_ckpt_header {
    loom_dtype dtype;
    loom_gpt2_shape shape;
    int64_t step, good_steps;
    /* The data loader's position (loom_dataloader_save): written by format
     * 2. A format 1 checkpoint has none, only data_offset, a token offset
     * into one unshuffled shard; a header without a position writes format
     * 1 again (consolidating an old checkpoint keeps what it has). */
    const unsigned char *data_position;
    size_t data_position_bytes;
    uint64_t data_offset;
    float loss_scale;
    int nunits;
} loom_ckpt_header;

/* Elements of a unit's whole (unsplit) flat buffer, from its views. */
size_t loom_ckpt_whole_numel(const loom_unit *unit);

/* ---- writing a sharded directory (every rank) ---- */

typedef struct loom_ckpt_shard_writer {
    FILE *f;
    char path[4200];
    uint32_t records;
} loom_ckpt_shard_writer;

int loom_ckpt_shard_open(loom_ckpt_shard_writer *w, const char *dir, int rank);
/* One record: elements [begin, begin + count) of tp rank tp_rank's flat
 * buffer of a unit. */
int loom_ckpt_shard_put(loom_ckpt_shard_writer *w, int unit, int tp_rank, size_t begin, size_t count,
                   const float *params, const float *m, const float *v);
int loom_ckpt_shard_close(loom_ckpt_shard_writer *w);

/* Rank 0, after every shard file is complete. tp_shards[u] holds every tp
 * rank's slices of unit u's tensors, rank-major (tp × units[u].ntensors). */
int loom_ckpt_write_meta(const char *dir, const loom_ckpt_header *h, int tp, int files,
                         const char *strategy, const loom_unit *units,
                         const loom_param_shard *const *tp_shards);

/* ---- writing a consolidated file ---- */

typedef struct loom_state_writer {
    FILE *f;
    char path[4200], tmp[4210];
} loom_state_writer;

int loom_state_open(loom_state_writer *w, const char *path, const loom_ckpt_header *h);
int loom_state_put(loom_state_writer *w, const float *params, const float *m, const float *v,
                   size_t n);
/* Renames into place when ok; otherwise removes the partial file. */
int loom_state_close(loom_state_writer *w, int ok);

/* ---- reading either ---- */

typedef struct loom_ckpt loom_ckpt;

/* path: a sharded directory or a consolidated file. */
int loom_ckpt_open(const char *path, loom_ckpt **out);
const loom_ckpt_header *loom_ckpt_header_of(const loom_ckpt *ck);
/* One line: "sharded, 4 files, tp 1, saved by zero3" / "consolidated". */
void loom_ckpt_describe(const loom_ckpt *ck, char *buf, size_t cap);
/* What `loom ckpt info` prints: the model, the training position, each shard. */
void loom_ckpt_print_info(const loom_ckpt *ck, const loom_unit *units, FILE *f);
/* A unit's whole fp32 arrays (m, v may be NULL). units: any model of the
 * checkpoint's shape (only the views' whole shapes are used). */
int loom_ckpt_read_unit(loom_ckpt *ck, const loom_unit *units, int unit, float *params,
                        float *m, float *v);
void loom_ckpt_close(loom_ckpt *ck);

/* Consolidation: one resumable file; llm.c's weights (model: any model of
 * the checkpoint's shape), as a file (dtype LOOM_F32 or LOOM_BF16: llm.c's
 * version 3 or 5) or as *weights (malloc'd, llm.c's order). */
int loom_ckpt_write_state(loom_ckpt *ck, const loom_unit *units, const char *path);
struct loom_model;
int loom_ckpt_write_llmc(loom_ckpt *ck, const struct loom_model *model, const char *path,
                         loom_dtype dtype);
int loom_ckpt_read_llmc(loom_ckpt *ck, const struct loom_model *model, float **weights);

#endif
