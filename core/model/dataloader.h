/* loom core — the data: llm.c token shards named by glob patterns, read in
 * llm.c's order.
 *
 * llm.c's loader, process r of P with -b B and -t T: a sample is a window of
 * B*T+1 tokens (inputs, and targets one token on); sample i of a shard
 * starts at token i*P*B*T + r*B*T, and a shard of n tokens holds
 * (n-1)/(P*B*T) samples. Shuffled, process r seeds an mt19937 with 42 + r
 * (model/mt19937.h), permutes the shard order at the start of every epoch
 * (the previous epoch's order, not the identity) and the samples of each
 * shard when it opens it; it moves to the next shard (or the next epoch)
 * when the read after the shard's last sample comes.
 *
 * loom emulates `readers` such processes, each reading `read_batch`
 * sequences per read, whatever loom's own mesh: the global batch of a step
 * is R = batch / (readers * read_batch) reads, read k = 0..R-1, and within
 * a read reader r = 0..readers-1 gives its read_batch sequences. Every rank
 * walks every reader (cheap: the order is arithmetic) and reads, with
 * pread, only the sequences it trains on. Micro-batch k of dp rank d holds
 * sequences k*batch/K + d*batch/(K*dp) ... + batch/(K*dp) - 1 of the global
 * batch, so the global batch does not depend on dp or K (the numerics
 * contract: the README's Tests), and with readers = P, read_batch = B and
 * batch = P*B*K, loom's dp rank d's micro-batch k is llm.c process d's k-th
 * read of the step. */
#ifndef LOOM_DATALOADER_H
#define LOOM_DATALOADER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The files of one setting (data.train, data.val), checked whole at open. */
typedef struct loom_dataset {
    char *setting;   /* "data.train": names the setting in messages */
    int nfiles;
    char **paths;    /* each pattern's matches in glob's (sorted) order, patterns in order */
    int64_t *tokens; /* each file's token count */
    int vocab;       /* every token read must be < vocab */
    struct loom_file_crc *crcs; /* each file's CRC32C once computed, with its size and mtime */
} loom_dataset;

/* patterns: glob(3) patterns or plain paths. Every file's header (magic,
 * version) and size are checked now; a pattern that matches nothing is an
 * error naming it (where: the config's place of the setting, for it). */
int loom_dataset_open(loom_dataset *ds, const char *setting, const char *where,
                      const char *const *patterns, int npatterns, int vocab);
void loom_dataset_close(loom_dataset *ds);
/* File i's CRC32C, its contents' identity: read whole the first time it is
 * asked, then again only when the file's size or mtime changed (kept in
 * memory, so a read-only data folder is fine). */
int loom_dataset_crc(const loom_dataset *ds, int i, uint32_t *crc);

/* What decides which tokens each step sees. */
typedef struct loom_data_order {
    int batch;      /* global batch, in sequences (train.batch) */
    int seq;        /* tokens per sequence (train.seq) */
    int shuffle;    /* llm.c's shuffling (data.shuffle); 0: in file order */
    int readers;    /* llm.c processes emulated (data.readers) */
    int read_batch; /* sequences per reader per read (data.read_batch); 0: batch / readers */
} loom_data_order;

struct loom_data_reader;
struct loom_data_read;

typedef struct loom_dataloader {
    const loom_dataset *data;
    loom_data_order order; /* read_batch resolved */
    int dp_rank, dp_size, grad_accum;
    int reads;                     /* per step: batch / (readers * read_batch) */
    int micro;                     /* next micro-batch within the step */
    struct loom_data_reader *reader; /* order.readers of them */
    struct loom_data_read *plan;     /* the step's reads, read-major (reads x readers) */
    uint16_t *buffer;              /* one read's tokens */
    int *fds, *fd_file, nfds, fd_next; /* a few files kept open */
    const int *positions; /* a sequence rank's positions of each sequence; NULL: all */
    int npositions;
} loom_dataloader;

/* Checks that batch divides by dp_size * grad_accum and by readers *
 * read_batch, and that every file holds at least one sample (readers *
 * read_batch * seq + 1 tokens), each message naming the settings (and the
 * file). Then at the first batch, as llm.c starts. */
int loom_dataloader_init(loom_dataloader *dl, const loom_dataset *data,
                         const loom_data_order *order, int dp_rank, int dp_size, int grad_accum);
void loom_dataloader_free(loom_dataloader *dl);
/* A sequence-parallel rank keeps only these positions (count of them, each
 * < seq; borrowed, not copied) of every sequence, in this order, inputs
 * and targets alike. */
int loom_dataloader_set_positions(loom_dataloader *dl, const int *positions, int count);
/* Fill this rank's next micro-batch: batch/(dp*K) sequences of seq inputs
 * and targets (npositions each with positions set). Fails on a read error
 * or a token >= the dataset's vocab, naming the file and the token's
 * offset in it. */
int loom_dataloader_next(loom_dataloader *dl, int *inputs, int *targets);
/* Back to the very first batch (validation reads the same batches each time). */
void loom_dataloader_rewind(loom_dataloader *dl);

/* ---- the position, for checkpoints (between steps) ----
 * Every reader's epoch, shard and sample, its shard order and its mt19937
 * as it was before the current shard's sample permutation (which restoring
 * draws again), plus the order and the files it applies to. */

/* *bytes is malloc'd. */
int loom_dataloader_save(const loom_dataloader *dl, unsigned char **bytes, size_t *size);
/* A position saved by loom_dataloader_save. The order and the files must
 * be the saved ones (the mesh may differ), the files by name, size and
 * CRC32C (a position of version 1 has no CRC32C): else one line naming the
 * setting (or the file), the checkpoint's value and the config's. ckpt
 * names the checkpoint. */
int loom_dataloader_restore(loom_dataloader *dl, const unsigned char *bytes, size_t size,
                            const char *ckpt);
/* A checkpoint of loom's format 1 holds only a token offset into one
 * unshuffled shard: accepted only where it means the same (data.shuffle =
 * false, data.readers = 1, data.read_batch = train.batch, one file). */
int loom_dataloader_restore_offset(loom_dataloader *dl, uint64_t offset, const char *ckpt);
/* What `loom ckpt info` shows of a saved position: lines indented by two. */
void loom_data_position_print(const unsigned char *bytes, size_t size, FILE *f);

#endif
