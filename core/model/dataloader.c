/* The data: llm.c token shards and llm.c's order of reading them, for any
 * number of emulated llm.c processes (model/dataloader.h).
 *
 * Every rank walks every reader, so every rank knows the whole global batch
 * of a step and reads its own slice of it: the batch does not depend on
 * loom's mesh (the numerics contract: the README's Tests). */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/status.h"
#include "model/dataloader.h"
#include "model/formats.h"
#include "model/mt19937.h"
#include "runtime/crc32c.h"
#include "runtime/log.h"

/* llm.c seeds process r's shuffle with 42 + r. */
#define SHUFFLE_SEED 42u

/* -------------------------------------------------------------- dataset */

static int add_file(loom_dataset *ds, const char *path)
{
    char **paths = realloc(ds->paths, (size_t)(ds->nfiles + 1) * sizeof *paths);
    if (paths)
        ds->paths = paths;
    int64_t *tokens = realloc(ds->tokens, (size_t)(ds->nfiles + 1) * sizeof *tokens);
    if (tokens)
        ds->tokens = tokens;
    char *copy = strdup(path);
    if (!paths || !tokens || !copy) {
        free(copy);
        return loom_fail(LOOM_ERR_NO_MEMORY, "%s: out of memory for the file list", ds->setting);
    }
    ds->paths[ds->nfiles] = copy;
    ds->tokens[ds->nfiles] = 0;
    ds->nfiles++;
    return LOOM_OK;
}

/* A plain path is taken as it is, so that a missing file says "cannot
 * open" rather than "matches nothing". */
static int add_pattern(loom_dataset *ds, const char *where, const char *pattern)
{
    if (!strpbrk(pattern, "*?["))
        return add_file(ds, pattern);
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        if (rc == 0)
            globfree(&g);
        return loom_fail(LOOM_ERR_NOT_FOUND, "%s: %s: no file matches \"%s\"; check the pattern "
                         "and the directory it names", where, ds->setting, pattern);
    }
    if (rc != 0)
        return loom_fail(LOOM_ERR_INVALID, "%s: %s: cannot list the files of \"%s\" (%s)", where,
                         ds->setting, pattern,
                         rc == GLOB_NOSPACE ? "out of memory" : "a directory cannot be read");
    for (size_t i = 0; rc == 0 && i < g.gl_pathc; i++)
        rc = add_file(ds, g.gl_pathv[i]);
    globfree(&g);
    return rc;
}

/* One file's CRC32C and the size and mtime it was computed at. */
struct loom_file_crc {
    int known;
    off_t size;
    struct timespec mtime;
    uint32_t crc;
};

int loom_dataset_open(loom_dataset *ds, const char *setting, const char *where,
                      const char *const *patterns, int npatterns, int vocab)
{
    memset(ds, 0, sizeof *ds);
    ds->vocab = vocab;
    if (npatterns <= 0)
        return loom_fail(LOOM_ERR_INVALID, "%s: no token shard given; set %s = "
                         "\"examples/data/corpus.bin\" (llm.c token shards: a path, a glob "
                         "pattern, or a list of them)", setting, setting);
    if (!(ds->setting = strdup(setting)))
        return loom_fail(LOOM_ERR_NO_MEMORY, "%s: out of memory", setting);
    int rc = LOOM_OK;
    for (int i = 0; rc == LOOM_OK && i < npatterns; i++)
        rc = add_pattern(ds, where, patterns[i]);
    /* Every file now, so that a bad one stops the job before its first step
     * rather than in the middle of an epoch. */
    for (int i = 0; rc == LOOM_OK && i < ds->nfiles; i++) {
        size_t count = 0;
        if ((rc = loom_shard_inspect(ds->paths[i], &count)) == LOOM_OK)
            ds->tokens[i] = (int64_t)count;
    }
    if (rc == LOOM_OK && !(ds->crcs = calloc((size_t)ds->nfiles + 1, sizeof *ds->crcs)))
        rc = loom_fail(LOOM_ERR_NO_MEMORY, "%s: out of memory", setting);
    if (rc != LOOM_OK) {
        /* the detail outlives the close: it is the thread's last error */
        loom_dataset_close(ds);
        return rc;
    }
    return LOOM_OK;
}

int loom_dataset_crc(const loom_dataset *ds, int i, uint32_t *crc)
{
    const char *path = ds->paths[i];
    struct stat st;
    if (stat(path, &st) != 0)
        return loom_fail(LOOM_ERR_NOT_FOUND, "%s: cannot open '%s': %s", ds->setting, path,
                         strerror(errno));
    struct loom_file_crc *c = ds->crcs ? &ds->crcs[i] : NULL;
    if (c && c->known && c->size == st.st_size && c->mtime.tv_sec == st.st_mtim.tv_sec &&
        c->mtime.tv_nsec == st.st_mtim.tv_nsec) {
        *crc = c->crc;
        return LOOM_OK;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = fd >= 0 ? malloc(CHUNK) : NULL;
    uint32_t sum = 0;
    ssize_t n = -1;
    while (buf && (n = read(fd, buf, CHUNK)) > 0)
        sum = loom_crc32c_extend(sum, buf, (size_t)n);
    int err = errno;
    free(buf);
    if (fd >= 0)
        close(fd);
    if (n != 0)
        return loom_fail(LOOM_ERR_INVALID, "%s: cannot read '%s': %s", ds->setting, path,
                         fd < 0 || n < 0 ? strerror(err) : "out of memory");
    if (c)
        *c = (struct loom_file_crc){1, st.st_size, st.st_mtim, sum};
    *crc = sum;
    return LOOM_OK;
}

void loom_dataset_close(loom_dataset *ds)
{
    free(ds->crcs);
    for (int i = 0; ds->paths && i < ds->nfiles; i++)
        free(ds->paths[i]);
    free(ds->paths);
    free(ds->tokens);
    free(ds->setting);
    memset(ds, 0, sizeof *ds);
}

/* ------------------------------------------------------------- readers */

/* One emulated llm.c process: its DataLoader's position and shuffle. */
typedef struct loom_data_reader {
    loom_mt19937 rng;
    loom_mt19937 rng_at_shard; /* before the current shard's sample permutation */
    int *shard_order;          /* llm.c's shard_indices */
    int *sample_order;         /* the current shard's samples, shuffled */
    int64_t epoch, shard, sample, samples;
} loom_data_reader;

/* Where one read of one reader starts. */
typedef struct loom_data_read {
    int file;
    int64_t first; /* token offset in the file */
} loom_data_read;

/* Tokens between one reader's consecutive samples: all readers' reads. */
static int64_t sample_stride(const loom_data_order *o)
{
    return (int64_t)o->readers * o->read_batch * o->seq;
}

static int64_t samples_in(const loom_dataloader *dl, int file)
{
    /* the last sample's targets reach one token past its B*T */
    return (dl->data->tokens[file] - 1) / sample_stride(&dl->order);
}

static int file_of(const loom_dataloader *dl, const loom_data_reader *rd)
{
    return dl->order.shuffle ? rd->shard_order[rd->shard] : (int)rd->shard;
}

/* llm.c loads the shard, then shuffles its samples. */
static void open_shard(const loom_dataloader *dl, loom_data_reader *rd)
{
    rd->samples = samples_in(dl, file_of(dl, rd));
    if (dl->order.shuffle) {
        rd->rng_at_shard = rd->rng;
        loom_identity_permutation(rd->sample_order, (int)rd->samples);
        loom_random_permutation(rd->sample_order, (int)rd->samples, &rd->rng);
    }
}

static void start_epoch(const loom_dataloader *dl, loom_data_reader *rd)
{
    rd->shard = 0;
    rd->sample = 0;
    if (dl->order.shuffle)
        loom_random_permutation(rd->shard_order, dl->data->nfiles, &rd->rng);
    open_shard(dl, rd);
}

static void start_reader(const loom_dataloader *dl, int r)
{
    loom_data_reader *rd = &dl->reader[r];
    loom_mt19937_seed(&rd->rng, SHUFFLE_SEED + (uint32_t)r);
    loom_identity_permutation(rd->shard_order, dl->data->nfiles);
    rd->epoch = 0;
    start_epoch(dl, rd);
}

/* Reader r's next read; like llm.c it moves on to the next shard (the next
 * epoch after the last) only when a read finds the shard used up. */
static loom_data_read next_read(const loom_dataloader *dl, int r)
{
    loom_data_reader *rd = &dl->reader[r];
    if (rd->sample >= rd->samples) {
        if (rd->shard == dl->data->nfiles - 1) {
            rd->epoch++;
            start_epoch(dl, rd);
        } else {
            rd->shard++;
            rd->sample = 0;
            open_shard(dl, rd);
        }
    }
    int64_t index = dl->order.shuffle ? rd->sample_order[rd->sample] : rd->sample;
    rd->sample++;
    int64_t own = (int64_t)r * dl->order.read_batch * dl->order.seq;
    return (loom_data_read){file_of(dl, rd), index * sample_stride(&dl->order) + own};
}

/* -------------------------------------------------------------- loader */

void loom_dataloader_rewind(loom_dataloader *dl)
{
    for (int r = 0; r < dl->order.readers; r++)
        start_reader(dl, r);
    dl->micro = 0;
}

static int check_order(const loom_dataset *data, loom_data_order *o, int dp_rank, int dp_size,
                       int grad_accum)
{
    if (o->batch <= 0 || o->seq <= 0 || dp_size <= 0 || grad_accum <= 0)
        return loom_fail(LOOM_ERR_INVALID,
                         "data loader: train.batch %d, train.seq %d, parallel.dp.size %d and "
                         "train.grad_accum %d must all be positive",
                         o->batch, o->seq, dp_size, grad_accum);
    if (o->readers <= 0 || o->read_batch < 0)
        return loom_fail(LOOM_ERR_INVALID, "data loader: data.readers %d must be positive and "
                         "data.read_batch %d not negative", o->readers, o->read_batch);
    if (dp_rank < 0 || dp_rank >= dp_size)
        return loom_fail(LOOM_ERR_INVALID, "data loader: dp rank %d is outside 0..%d", dp_rank,
                         dp_size - 1);
    if (o->batch % (dp_size * grad_accum) != 0)
        return loom_fail(LOOM_ERR_INVALID,
                         "train.batch %d does not divide by parallel.dp.size %d × "
                         "train.grad_accum %d; make it a multiple of %d",
                         o->batch, dp_size, grad_accum, dp_size * grad_accum);
    if (o->read_batch == 0) {
        if (o->batch % o->readers != 0)
            return loom_fail(LOOM_ERR_INVALID,
                             "train.batch %d does not divide by data.readers %d (data.read_batch "
                             "0 reads train.batch / data.readers sequences per reader); make "
                             "train.batch a multiple of %d or set data.read_batch",
                             o->batch, o->readers, o->readers);
        o->read_batch = o->batch / o->readers;
    } else if (o->batch % (o->readers * o->read_batch) != 0) {
        return loom_fail(LOOM_ERR_INVALID,
                         "train.batch %d is not a multiple of data.readers %d × data.read_batch "
                         "%d = %d; a step is whole reads of every reader",
                         o->batch, o->readers, o->read_batch, o->readers * o->read_batch);
    }
    /* llm.c asks the same of every shard: one sample for every process. */
    int64_t sample = sample_stride(o) + 1;
    for (int i = 0; i < data->nfiles; i++)
        if (data->tokens[i] < sample)
            return loom_fail(LOOM_ERR_INVALID,
                             "%s: %s holds %lld tokens, fewer than one sample of %lld "
                             "(data.readers %d × data.read_batch %d × train.seq %d + 1); use "
                             "fewer or smaller reads, or leave the file out",
                             data->setting, data->paths[i], (long long)data->tokens[i],
                             (long long)sample, o->readers, o->read_batch, o->seq);
    return LOOM_OK;
}

int loom_dataloader_init(loom_dataloader *dl, const loom_dataset *data,
                         const loom_data_order *order, int dp_rank, int dp_size, int grad_accum)
{
    memset(dl, 0, sizeof *dl);
    loom_data_order o = *order;
    int rc = check_order(data, &o, dp_rank, dp_size, grad_accum);
    if (rc != LOOM_OK)
        return rc;
    dl->data = data;
    dl->order = o;
    dl->dp_rank = dp_rank;
    dl->dp_size = dp_size;
    dl->grad_accum = grad_accum;
    dl->reads = o.batch / (o.readers * o.read_batch);
    int64_t most = 0;
    for (int i = 0; i < data->nfiles; i++) {
        int64_t n = (data->tokens[i] - 1) / sample_stride(&o);
        most = n > most ? n : most;
    }
    dl->reader = calloc((size_t)o.readers, sizeof *dl->reader);
    dl->plan = calloc((size_t)dl->reads * (size_t)o.readers, sizeof *dl->plan);
    dl->buffer = malloc(((size_t)o.read_batch * (size_t)o.seq + 1) * sizeof *dl->buffer);
    /* Readers sit in different shards when shuffled: a file open for each,
     * and one more so a step that crosses into the next shard reopens nothing. */
    dl->nfds = o.readers < 8 ? o.readers + 1 : 8;
    dl->fds = malloc((size_t)dl->nfds * sizeof *dl->fds);
    dl->fd_file = malloc((size_t)dl->nfds * sizeof *dl->fd_file);
    int ok = dl->reader && dl->plan && dl->buffer && dl->fds && dl->fd_file;
    for (int i = 0; ok && i < dl->nfds; i++)
        dl->fds[i] = dl->fd_file[i] = -1;
    for (int r = 0; ok && r < o.readers; r++) {
        loom_data_reader *rd = &dl->reader[r];
        rd->shard_order = malloc((size_t)data->nfiles * sizeof *rd->shard_order);
        rd->sample_order = o.shuffle ? malloc((size_t)most * sizeof *rd->sample_order) : NULL;
        ok = rd->shard_order && (!o.shuffle || rd->sample_order);
    }
    if (!ok) {
        loom_dataloader_free(dl);
        return loom_fail(LOOM_ERR_NO_MEMORY, "%s: out of memory for the data loader",
                         data->setting);
    }
    loom_dataloader_rewind(dl);
    return LOOM_OK;
}

void loom_dataloader_free(loom_dataloader *dl)
{
    for (int i = 0; dl->fds && i < dl->nfds; i++)
        if (dl->fds[i] >= 0)
            close(dl->fds[i]);
    for (int r = 0; dl->reader && r < dl->order.readers; r++) {
        free(dl->reader[r].shard_order);
        free(dl->reader[r].sample_order);
    }
    free(dl->reader);
    free(dl->plan);
    free(dl->buffer);
    free(dl->fds);
    free(dl->fd_file);
    memset(dl, 0, sizeof *dl);
}

int loom_dataloader_set_positions(loom_dataloader *dl, const int *positions, int count)
{
    if (count <= 0 || count > dl->order.seq)
        return loom_fail(LOOM_ERR_INVALID, "data loader: %d positions of a sequence of %d", count,
                         dl->order.seq);
    for (int i = 0; positions && i < count; i++)
        if (positions[i] < 0 || positions[i] >= dl->order.seq)
            return loom_fail(LOOM_ERR_INVALID,
                             "data loader: position %d is outside the sequence of %d",
                             positions[i], dl->order.seq);
    dl->positions = positions;
    dl->npositions = positions ? count : 0;
    return LOOM_OK;
}

static int file_descriptor(loom_dataloader *dl, int file, int *fd)
{
    for (int i = 0; i < dl->nfds; i++)
        if (dl->fd_file[i] == file) {
            *fd = dl->fds[i];
            return LOOM_OK;
        }
    int slot = dl->fd_next++ % dl->nfds;
    if (dl->fds[slot] >= 0)
        close(dl->fds[slot]);
    dl->fd_file[slot] = -1;
    const char *path = dl->data->paths[file];
    if ((dl->fds[slot] = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return loom_fail(LOOM_ERR_NOT_FOUND, "%s: cannot open: %s", path, strerror(errno));
    dl->fd_file[slot] = file;
    *fd = dl->fds[slot];
    return LOOM_OK;
}

/* count tokens of a file from token offset first into dl->buffer, each
 * checked against the vocabulary. */
static int read_tokens(loom_dataloader *dl, int file, int64_t first, size_t count)
{
    const char *path = dl->data->paths[file];
    int fd = -1, rc = file_descriptor(dl, file, &fd);
    if (rc != LOOM_OK)
        return rc;
    unsigned char *dst = (unsigned char *)dl->buffer;
    size_t want = count * sizeof(uint16_t), got = 0;
    off_t at = (off_t)LOOM_SHARD_HEADER_BYTES + (off_t)first * (off_t)sizeof(uint16_t);
    while (got < want) {
        ssize_t n = pread(fd, dst + got, want - got, at + (off_t)got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return loom_fail(LOOM_ERR_INVALID, "%s: cannot read tokens %lld..%lld: %s", path,
                             (long long)first, (long long)first + (long long)count - 1,
                             n < 0 ? strerror(errno) : "the file is shorter than when it was "
                                                       "opened");
        got += (size_t)n;
    }
    for (size_t i = 0; i < count; i++)
        if ((int)dl->buffer[i] >= dl->data->vocab)
            return loom_fail(LOOM_ERR_INVALID,
                             "%s: token %u at position %lld is >= the vocabulary size %d "
                             "(model.vocab)",
                             path, (unsigned)dl->buffer[i], (long long)first + (long long)i,
                             dl->data->vocab);
    return LOOM_OK;
}

/* n sequences from dl->buffer (sequence j at j*T, targets one token on)
 * into inputs and targets, whole or at this rank's positions. */
static void copy_sequences(const loom_dataloader *dl, size_t n, int *inputs, int *targets)
{
    const size_t T = (size_t)dl->order.seq;
    const uint16_t *src = dl->buffer;
    if (dl->positions) {
        const size_t P = (size_t)dl->npositions;
        for (size_t b = 0; b < n; b++)
            for (size_t i = 0; i < P; i++) {
                const uint16_t *tok = src + b * T + (size_t)dl->positions[i];
                inputs[b * P + i] = tok[0];
                targets[b * P + i] = tok[1];
            }
    } else {
        for (size_t i = 0; i < n * T; i++) {
            inputs[i] = src[i];
            targets[i] = src[i + 1];
        }
    }
}

int loom_dataloader_next(loom_dataloader *dl, int *inputs, int *targets)
{
    const loom_data_order *o = &dl->order;
    if (dl->micro == 0) /* the step's global batch: every reader's reads */
        for (int k = 0; k < dl->reads; k++)
            for (int r = 0; r < o->readers; r++)
                dl->plan[k * o->readers + r] = next_read(dl, r);
    const int per_micro = o->batch / dl->grad_accum;
    const int per_rank = per_micro / dl->dp_size;
    const int first = dl->micro * per_micro + dl->dp_rank * per_rank;
    const int per_read = o->readers * o->read_batch;
    const size_t stride = (size_t)(dl->positions ? dl->npositions : o->seq);
    /* Sequence s of the global batch is sequence j of reader r's read k;
     * the sequences of one read are contiguous in its file: one pread each. */
    for (int b = 0; b < per_rank;) {
        int s = first + b, k = s / per_read, r = (s % per_read) / o->read_batch;
        int j = s % o->read_batch, n = o->read_batch - j;
        n = n < per_rank - b ? n : per_rank - b;
        const loom_data_read *read = &dl->plan[k * o->readers + r];
        int rc = read_tokens(dl, read->file, read->first + (int64_t)j * o->seq,
                             (size_t)n * (size_t)o->seq + 1);
        if (rc != LOOM_OK)
            return rc;
        copy_sequences(dl, (size_t)n, inputs + (size_t)b * stride, targets + (size_t)b * stride);
        b += n;
    }
    if (++dl->micro == dl->grad_accum)
        dl->micro = 0;
    return LOOM_OK;
}

/* ------------------------------------------------------------ position */

/* The saved position, as bytes (host order, like the rest of a loom
 * checkpoint):
 *   "LOOMDATA", u32 version,
 *   u32 shuffle, readers, read_batch, batch, seq, files,
 *   per file: i64 tokens, u32 name length, the path, u32 CRC32C of the
 *   file (version 2; version 1 has none and is still read),
 *   per reader: i64 epoch, shard, sample; the mt19937 as it was before the
 *   shard's sample permutation (u32 words[624], i32 left, u32 next);
 *   i32 shard order[files]. */
#define POSITION_MAGIC "LOOMDATA"
#define POSITION_VERSION 2u
#define POSITION_CRC 2u

typedef struct bytes_out {
    unsigned char *p;
    size_t n, cap;
    int failed;
} bytes_out;

static void put(bytes_out *o, const void *v, size_t n)
{
    if (o->failed)
        return;
    if (o->n + n > o->cap) {
        size_t cap = o->cap ? o->cap : 4096;
        while (cap < o->n + n)
            cap *= 2;
        unsigned char *p = realloc(o->p, cap);
        if (!p) {
            o->failed = 1;
            return;
        }
        o->p = p;
        o->cap = cap;
    }
    memcpy(o->p + o->n, v, n);
    o->n += n;
}

static void put_u32(bytes_out *o, uint32_t v) { put(o, &v, sizeof v); }
static void put_i64(bytes_out *o, int64_t v) { put(o, &v, sizeof v); }

typedef struct bytes_in {
    const unsigned char *p;
    size_t n, at;
    int short_read;
} bytes_in;

static void get(bytes_in *in, void *v, size_t n)
{
    if (in->short_read || in->n - in->at < n) {
        in->short_read = 1;
        memset(v, 0, n);
        return;
    }
    memcpy(v, in->p + in->at, n);
    in->at += n;
}

static void skip(bytes_in *in, size_t n)
{
    if (in->short_read || in->n - in->at < n)
        in->short_read = 1;
    else
        in->at += n;
}

static uint32_t get_u32(bytes_in *in)
{
    uint32_t v;
    get(in, &v, sizeof v);
    return v;
}

static int64_t get_i64(bytes_in *in)
{
    int64_t v;
    get(in, &v, sizeof v);
    return v;
}

int loom_dataloader_save(const loom_dataloader *dl, unsigned char **bytes, size_t *size)
{
    const loom_data_order *o = &dl->order;
    const loom_dataset *ds = dl->data;
    bytes_out out = {0};
    put(&out, POSITION_MAGIC, 8);
    put_u32(&out, POSITION_VERSION);
    uint32_t head[6] = {(uint32_t)o->shuffle, (uint32_t)o->readers, (uint32_t)o->read_batch,
                        (uint32_t)o->batch,   (uint32_t)o->seq,     (uint32_t)ds->nfiles};
    put(&out, head, sizeof head);
    for (int i = 0; i < ds->nfiles; i++) {
        uint32_t crc = 0;
        int rc = loom_dataset_crc(ds, i, &crc);
        if (rc != LOOM_OK) {
            free(out.p);
            return rc;
        }
        put_i64(&out, ds->tokens[i]);
        put_u32(&out, (uint32_t)strlen(ds->paths[i]));
        put(&out, ds->paths[i], strlen(ds->paths[i]));
        put_u32(&out, crc);
    }
    for (int r = 0; r < o->readers; r++) {
        const loom_data_reader *rd = &dl->reader[r];
        put_i64(&out, rd->epoch);
        put_i64(&out, rd->shard);
        put_i64(&out, rd->sample);
        /* unshuffled, no generator runs: save the seeded one */
        const loom_mt19937 *rng = o->shuffle ? &rd->rng_at_shard : &rd->rng;
        put(&out, rng->words, sizeof rng->words);
        put(&out, &rng->left, sizeof rng->left);
        put_u32(&out, rng->next);
        put(&out, rd->shard_order, (size_t)ds->nfiles * sizeof *rd->shard_order);
    }
    if (out.failed) {
        free(out.p);
        return loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory for the data position");
    }
    *bytes = out.p;
    *size = out.n;
    return LOOM_OK;
}

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static int differs(const char *ckpt, const char *setting, long long saved, long long now)
{
    return loom_fail(LOOM_ERR_INVALID,
                     "--resume %s: %s is %lld in the checkpoint, %lld in the config; the data "
                     "order would differ: set it as the checkpoint has it, or start afresh",
                     ckpt, setting, saved, now);
}

static int damaged(const char *ckpt, const char *what)
{
    return loom_fail(LOOM_ERR_INVALID, "--resume %s: the checkpoint's data position is damaged "
                     "(%s)", ckpt, what);
}

/* One reader's saved state, checked against the files, into rd. */
static int restore_reader(loom_dataloader *dl, loom_data_reader *rd, bytes_in *in,
                          const char *ckpt)
{
    const int nfiles = dl->data->nfiles;
    rd->epoch = get_i64(in);
    rd->shard = get_i64(in);
    rd->sample = get_i64(in);
    loom_mt19937 rng;
    get(in, rng.words, sizeof rng.words);
    get(in, &rng.left, sizeof rng.left);
    rng.next = get_u32(in);
    get(in, rd->shard_order, (size_t)nfiles * sizeof *rd->shard_order);
    if (in->short_read)
        return damaged(ckpt, "it ends early");
    int fresh = rng.left == 1 && rng.next == 0; /* seeded, nothing drawn */
    if (rd->epoch < 0 || rd->shard < 0 || rd->shard >= nfiles || rd->sample < 0 ||
        (!fresh && (rng.left < 1 || rng.left > LOOM_MT19937_WORDS ||
                    rng.next + (uint32_t)rng.left != LOOM_MT19937_WORDS + 1)))
        return damaged(ckpt, "a reader's shard, sample or generator is out of range");
    /* the shard order must be a permutation of the files */
    unsigned char *seen = calloc((size_t)nfiles, 1);
    if (!seen)
        return loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    int bad = 0;
    for (int i = 0; i < nfiles; i++) {
        int f = rd->shard_order[i];
        bad |= f < 0 || f >= nfiles || seen[f];
        if (!bad)
            seen[f] = 1;
    }
    free(seen);
    if (bad)
        return damaged(ckpt, "a reader's shard order is not a permutation of the files");
    if (dl->order.shuffle) {
        /* the shard's sample permutation, drawn again from where it was drawn */
        rd->rng = rng;
        open_shard(dl, rd);
    } else {
        rd->rng = rng;
        rd->samples = samples_in(dl, file_of(dl, rd));
    }
    if (rd->sample > rd->samples)
        return damaged(ckpt, "a reader's sample is past the end of its shard");
    return LOOM_OK;
}

int loom_dataloader_restore(loom_dataloader *dl, const unsigned char *bytes, size_t size,
                            const char *ckpt)
{
    const loom_data_order *o = &dl->order;
    const loom_dataset *ds = dl->data;
    bytes_in in = {bytes, size, 0, 0};
    char magic[8];
    get(&in, magic, sizeof magic);
    uint32_t version = get_u32(&in);
    if (in.short_read || memcmp(magic, POSITION_MAGIC, 8) != 0)
        return damaged(ckpt, "no LOOMDATA record");
    if (version < 1 || version > POSITION_VERSION)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED, "--resume %s: data position version %u; this "
                         "loom reads versions 1 to %u", ckpt, version, POSITION_VERSION);
    uint32_t head[6];
    get(&in, head, sizeof head);
    if (in.short_read)
        return damaged(ckpt, "it ends early");
    if (head[0] != (uint32_t)o->shuffle)
        return loom_fail(LOOM_ERR_INVALID,
                         "--resume %s: data.shuffle is %s in the checkpoint, %s in the config; "
                         "the data order would differ: set it as the checkpoint has it, or start "
                         "afresh", ckpt, head[0] ? "true" : "false", o->shuffle ? "true" : "false");
    const struct {
        const char *setting;
        uint32_t saved;
        int now;
    } same[] = {{"data.readers", head[1], o->readers},
                {"train.batch", head[3], o->batch},
                {"train.seq", head[4], o->seq},
                {"data.read_batch", head[2], o->read_batch}};
    for (size_t i = 0; i < LOOM_ARRAY_LEN(same); i++)
        if (same[i].saved != (uint32_t)same[i].now)
            return differs(ckpt, same[i].setting, (long long)same[i].saved, same[i].now);
    if (head[5] != (uint32_t)ds->nfiles)
        return loom_fail(LOOM_ERR_INVALID,
                         "--resume %s: %s: the checkpoint read %u files, the config names %d; "
                         "the data order would differ: name the same files, or start afresh",
                         ckpt, ds->setting, head[5], ds->nfiles);
    /* The files by name, size and contents, not by directory: the data may move. */
    for (int i = 0; i < ds->nfiles; i++) {
        int64_t tokens = get_i64(&in);
        uint32_t len = get_u32(&in);
        char name[4096];
        if (in.short_read || len >= sizeof name)
            return damaged(ckpt, "a file name is cut short");
        get(&in, name, len);
        name[len] = '\0';
        if (in.short_read)
            return damaged(ckpt, "it ends early");
        if (strcmp(base_name(name), base_name(ds->paths[i])) || tokens != ds->tokens[i])
            return loom_fail(LOOM_ERR_INVALID,
                             "--resume %s: %s: file %d is %s (%lld tokens) in the checkpoint, %s "
                             "(%lld tokens) in the config; the data order would differ: name the "
                             "same files, or start afresh",
                             ckpt, ds->setting, i + 1, name, (long long)tokens, ds->paths[i],
                             (long long)ds->tokens[i]);
        if (version < POSITION_CRC)
            continue;
        uint32_t saved = get_u32(&in), now = 0;
        if (in.short_read)
            return damaged(ckpt, "it ends early");
        int rc = loom_dataset_crc(ds, i, &now);
        if (rc != LOOM_OK)
            return rc;
        if (saved != now)
            return loom_fail(LOOM_ERR_INVALID,
                             "--resume %s: %s: file %d, %s, has CRC32C 0x%08x, and had 0x%08x "
                             "when the checkpoint was saved: the same name and size, other "
                             "contents, so the losses would differ; put the saved file back, or "
                             "start afresh", ckpt, ds->setting, i + 1, ds->paths[i], now, saved);
    }
    for (int r = 0; r < o->readers; r++) {
        int rc = restore_reader(dl, &dl->reader[r], &in, ckpt);
        if (rc != LOOM_OK) {
            loom_dataloader_rewind(dl);
            return rc;
        }
    }
    if (in.at != in.n) {
        loom_dataloader_rewind(dl);
        return damaged(ckpt, "bytes after the last reader");
    }
    dl->micro = 0;
    return LOOM_OK;
}

int loom_dataloader_restore_offset(loom_dataloader *dl, uint64_t offset, const char *ckpt)
{
    const loom_data_order *o = &dl->order;
    uint64_t step_tokens = (uint64_t)o->batch * (uint64_t)o->seq;
    if (o->shuffle || o->readers != 1 || o->read_batch != o->batch || dl->data->nfiles != 1)
        return loom_fail(LOOM_ERR_INVALID,
                         "--resume %s: a checkpoint of loom's format 1 holds only a token offset "
                         "into one unshuffled shard; resume it with data.shuffle = false, "
                         "data.readers = 1, data.read_batch = 0 and one file in %s, or start "
                         "afresh", ckpt, dl->data->setting);
    loom_data_reader *rd = &dl->reader[0];
    if (offset % step_tokens != 0 || offset / step_tokens > (uint64_t)rd->samples)
        return loom_fail(LOOM_ERR_INVALID,
                         "--resume %s: its data offset %llu is no step of train.batch %d × "
                         "train.seq %d in %s (%lld tokens): the checkpoint was saved with other "
                         "settings or data", ckpt, (unsigned long long)offset, o->batch, o->seq,
                         dl->data->paths[0], (long long)dl->data->tokens[0]);
    rd->sample = (int64_t)(offset / step_tokens);
    dl->micro = 0;
    return LOOM_OK;
}

/* Samples of a file of tokens tokens for one reader, 0 for what no loader
 * would read (the values come from a file: no overflow on any of them). */
static long long saved_samples(int64_t tokens, const uint32_t head[6])
{
    uint64_t stride;
    if (tokens < 1 || __builtin_mul_overflow((uint64_t)head[1], (uint64_t)head[2], &stride) ||
        __builtin_mul_overflow(stride, (uint64_t)head[4], &stride) || stride == 0)
        return 0;
    return (long long)((uint64_t)(tokens - 1) / stride);
}

void loom_data_position_print(const unsigned char *bytes, size_t size, FILE *f)
{
    bytes_in in = {bytes, size, 0, 0};
    char magic[8];
    get(&in, magic, sizeof magic);
    uint32_t version = get_u32(&in), head[6];
    get(&in, head, sizeof head);
    if (in.short_read || memcmp(magic, POSITION_MAGIC, 8) != 0 || version < 1 ||
        version > POSITION_VERSION) {
        fprintf(f, "  data      (a data position this loom cannot read)\n");
        return;
    }
    /* Each file takes 12 bytes at least and each reader more: counts the
     * bytes cannot hold are damage, not a size to allocate. */
    uint32_t readers = head[1], nfiles = head[5];
    size_t left = in.n - in.at;
    if (nfiles > left / 12 || readers > left / (3 * sizeof(int64_t))) {
        fprintf(f, "  data      (the position is damaged: %u files and %u readers in %zu bytes)\n",
                nfiles, readers, left);
        return;
    }
    uint64_t total = 0;
    int64_t *tokens = calloc(nfiles ? nfiles : 1, sizeof *tokens);
    uint32_t *crcs = calloc(nfiles ? nfiles : 1, sizeof *crcs);
    char **names = calloc(nfiles ? nfiles : 1, sizeof *names);
    for (uint32_t i = 0; tokens && names && i < nfiles && !in.short_read; i++) {
        tokens[i] = get_i64(&in);
        uint32_t len = get_u32(&in);
        if (in.short_read || len > in.n - in.at)
            break;
        if ((names[i] = malloc((size_t)len + 1))) {
            get(&in, names[i], len);
            names[i][len] = '\0';
        } else {
            skip(&in, len);
        }
        if (version >= POSITION_CRC && crcs)
            crcs[i] = get_u32(&in);
        total += tokens[i] > 0 ? (uint64_t)tokens[i] : 0;
    }
    fprintf(f, "  data      %s, %u reader%s × %u sequences of %u tokens per read, train.batch %u; "
               "%u file%s, %llu tokens\n",
            head[0] ? "shuffled as llm.c" : "in file order", readers, readers == 1 ? "" : "s",
            head[2], head[4], head[3], nfiles, nfiles == 1 ? "" : "s", (unsigned long long)total);
    int *order = malloc((nfiles ? nfiles : 1) * sizeof *order);
    enum { SHOWN = 8 };
    for (uint32_t i = 0; version >= POSITION_CRC && crcs && names && i < nfiles && i < SHOWN &&
                         names[i] && !in.short_read; i++)
        fprintf(f, "  file %-4u %s, %lld tokens, CRC32C 0x%08x\n", i + 1, names[i],
                (long long)tokens[i], crcs[i]);
    for (uint32_t r = 0; order && tokens && names && r < readers && !in.short_read; r++) {
        int64_t epoch = get_i64(&in), shard = get_i64(&in), sample = get_i64(&in);
        skip(&in, LOOM_MT19937_WORDS * sizeof(uint32_t) + 2 * sizeof(uint32_t));
        get(&in, order, nfiles * sizeof *order);
        if (in.short_read || shard < 0 || shard >= (int64_t)nfiles)
            break;
        int file = head[0] ? order[shard] : (int)shard;
        if (file < 0 || file >= (int)nfiles || !names[file] || r >= SHOWN)
            continue;
        fprintf(f, "  reader %-2u epoch %lld, shard %lld of %u (%s), sample %lld of %lld read\n",
                r, (long long)epoch, (long long)shard + 1, nfiles, names[file], (long long)sample,
                saved_samples(tokens[file], head));
    }
    if (readers > SHOWN)
        fprintf(f, "  ...       and %u readers more\n", readers - SHOWN);
    if (in.short_read)
        fprintf(f, "  data      (the position is cut short)\n");
    for (uint32_t i = 0; names && i < nfiles; i++)
        free(names[i]);
    free(names);
    free(tokens);
    free(crcs);
    free(order);
}
