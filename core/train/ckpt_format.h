/* loom core — resumable checkpoints (docs/reliability.md, `loom ckpt`).
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
 * unit's whole arrays and the trainer slices and hands them on.
 *
 * Format 3 stamps every file (meta.loom, each shard, the consolidated
 * file) right after its fixed header: the run id of the job that wrote it,
 * the step, the file's length and its CRC32C (of the bytes after the stamp,
 * continued over the header and the stamp with the checksum field zero).
 * A reader checks the checksum before it trusts a byte, and every field
 * before it uses it; a failure names the file, the field and the value.
 * Formats 1 and 2 (no stamp) are still read, range-checked but unverified.
 * Format 4 adds the run's lineage right after the stamp of meta.loom and of
 * the consolidated file (loom_ckpt_lineage); format 3 is read without one.
 * Format 5 lets a shard file end with replica records after its unit
 * records: a dp rank's own state (data_replica_state), each record the
 * unit, the dp rank and dp size of the writer, a label and the bytes; the
 * file's checksum covers them. A consolidated file never holds any.
 * Every file is fsync'd before it is closed. */
#ifndef LOOM_CKPT_H
#define LOOM_CKPT_H

#include <stdio.h>

#include "loom/tensor.h"
#include "model/formats.h"
#include "model/model.h"
#include "loom/strategy.h"

/* Which experiment a checkpoint belongs to: the trajectory it is a point
 * of. id is the hash of the settings that shape the trajectory and of the
 * data's identity at the run that started it, and a run resumed from a
 * checkpoint (--resume, a restart) keeps that checkpoint's id, so the id
 * names the whole line of jobs. settings: the text those settings were
 * hashed from, "name=value" lines (NUL-terminated; NULL if unknown). */
typedef struct loom_ckpt_lineage {
    uint64_t id, settings_hash, data_hash;
    const char *settings;
} loom_ckpt_lineage;

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
    /* The job that wrote it (a random id chosen at each job's start); 0 in
     * formats 1 and 2. */
    uint64_t run_id;
    /* Format 4; all 0 (settings NULL) in older formats. */
    loom_ckpt_lineage lineage;
} loom_ckpt_header;

/* Elements of a unit's whole (unsplit) flat buffer, from its views. */
size_t loom_ckpt_whole_numel(const loom_unit *unit);

/* One file being written: its stamp's checksum runs along. */
typedef struct loom_ckpt_file {
    FILE *f;
    char path[4200];
    uint32_t crc; /* of the bytes after the stamp, so far */
} loom_ckpt_file;

/* ---- writing a sharded directory (every rank) ---- */

typedef struct loom_ckpt_shard_writer {
    loom_ckpt_file file;
    uint64_t run_id;
    int64_t step;
    uint32_t records;
    uint32_t replicas;
} loom_ckpt_shard_writer;

/* Room for a replica buffer's label, its NUL included. */
#define LOOM_CKPT_REPLICA_LABEL 48

int loom_ckpt_shard_open(loom_ckpt_shard_writer *w, const char *dir, int rank, uint64_t run_id,
                         int64_t step);
/* One record: elements [begin, begin + count) of tp rank tp_rank's flat
 * buffer of a unit. */
int loom_ckpt_shard_put(loom_ckpt_shard_writer *w, int unit, int tp_rank, size_t begin,
                        size_t count, const float *params, const float *m, const float *v);
/* One replica record, after the unit records: bytes of the dp rank's own
 * state of a unit under label. */
int loom_ckpt_shard_put_replica(loom_ckpt_shard_writer *w, int unit, int dp_rank, int dp_size,
                                const char *label, const void *data, size_t bytes);
/* ok: stamp, fsync and close; otherwise (or if that fails) remove the file. */
int loom_ckpt_shard_close(loom_ckpt_shard_writer *w, int ok);

/* Rank 0, after every shard file is complete. tp_shards[u] holds every tp
 * rank's slices of unit u's tensors, rank-major (tp × units[u].ntensors). */
int loom_ckpt_write_meta(const char *dir, const loom_ckpt_header *h, int tp, int files,
                         const char *strategy, const loom_unit *units,
                         const loom_param_shard *const *tp_shards);

/* fsync a directory, so that the names in it (a rename) reach the disk. */
int loom_ckpt_sync_dir(const char *dir);
/* The run id and step stamped on a checkpoint directory's files (the first
 * file found with a stamp, complete or not): LOOM_ERR_NOT_FOUND if none. */
int loom_ckpt_dir_stamp(const char *dir, uint64_t *run_id, int64_t *step);
/* A checkpoint's step and lineage from its header alone: a complete
 * directory's meta.loom (checksum verified) or a consolidated file's
 * header. LOOM_ERR_NOT_FOUND without meta.loom, LOOM_ERR_NOT_SUPPORTED for
 * a format before 4 (no lineage: *step and *format are still set).
 * settings: up to cap bytes of the lineage's settings text (may be NULL). */
int loom_ckpt_lineage_of(const char *ckpt, int64_t *step, uint32_t *format,
                         loom_ckpt_lineage *lineage, char *settings, size_t cap);
/* Remove a checkpoint directory of any world size: meta.loom and every
 * shard-N.loom, then the directory; a file loom did not write stays, and
 * the failure names it. A missing directory is not an error. */
int loom_ckpt_remove_dir(const char *dir);

/* ---- writing a consolidated file ---- */

typedef struct loom_state_writer {
    loom_ckpt_file file; /* PATH.tmp */
    char path[4200];
    loom_ckpt_header h;
} loom_state_writer;

int loom_state_open(loom_state_writer *w, const char *path, const loom_ckpt_header *h);
int loom_state_put(loom_state_writer *w, const float *params, const float *m, const float *v,
                   size_t n);
/* Stamps, fsyncs and renames into place when ok; otherwise removes the
 * partial file. */
int loom_state_close(loom_state_writer *w, int ok);

/* ---- reading either ---- */

typedef struct loom_ckpt loom_ckpt;

/* path: a sharded directory or a consolidated file. Every file's stamp and
 * checksum are verified, every header field range-checked. */
int loom_ckpt_open(const char *path, loom_ckpt **out);
/* The same, but the shard files' checksums are left to
 * loom_ckpt_verify_file, so that the ranks of a resume can share that
 * reading (meta.loom, the shard files' headers and sizes are checked). */
int loom_ckpt_open_unverified(const char *path, loom_ckpt **out);
/* Shard files of a sharded checkpoint; 0 for a consolidated file (checked
 * whole at open). */
int loom_ckpt_files(const loom_ckpt *ck);
/* The tp size of the mesh that wrote a sharded checkpoint (1 if consolidated). */
int loom_ckpt_tp(const loom_ckpt *ck);
int loom_ckpt_verify_file(loom_ckpt *ck, int file);
/* The checkpoint against a model of its shape (units, nunits): the unit
 * count, each unit's tensors and the shard table's slices. Before any
 * loom_ckpt_read_unit. */
int loom_ckpt_check_model(const loom_ckpt *ck, const loom_unit *units, int nunits);
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

/* A sharded checkpoint's replica records (format 5): file is the shard
 * file, the world rank that wrote it. */
typedef struct loom_ckpt_replica {
    int file, unit, dp_rank, dp_size;
    char label[LOOM_CKPT_REPLICA_LABEL];
    uint64_t bytes;
    long offset; /* of the bytes in the file */
} loom_ckpt_replica;
int loom_ckpt_replica_count(const loom_ckpt *ck);
const loom_ckpt_replica *loom_ckpt_replica_at(const loom_ckpt *ck, int i);
/* Record i's bytes into data (its bytes long). */
int loom_ckpt_read_replica(loom_ckpt *ck, int i, void *data);

/* Consolidation: one resumable file; llm.c's weights (model: any model of
 * the checkpoint's shape), as a file (dtype LOOM_F32 or LOOM_BF16: llm.c's
 * version 3 or 5) or as *weights (malloc'd, llm.c's order). */
int loom_ckpt_write_state(loom_ckpt *ck, const loom_unit *units, const char *path);
struct loom_model;
int loom_ckpt_write_llmc(loom_ckpt *ck, const struct loom_model *model, const char *path,
                         loom_dtype dtype);
int loom_ckpt_read_llmc(loom_ckpt *ck, const struct loom_model *model, float **weights);

#endif
