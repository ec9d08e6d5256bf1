/* Resumable checkpoints, sharded and consolidated (see ckpt_format.h), and
 * `loom ckpt`. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/status.h"
#include "loom/strategy.h"
#include "loom/tensor.h"
#include "model/dataloader.h"
#include "model/formats.h"
#include "model/model.h"
#include "runtime/crc32c.h"
#include "runtime/files.h"
#include "runtime/log.h"
#include "train/ckpt_format.h"

#define STATE_MAGIC "LOOMSTAT"
#define META_MAGIC "LOOMMETA"
#define SHARD_MAGIC "LOOMSHRD"
/* 2 added the data loader's position (model/dataloader.h) after the header
 * of the consolidated file and of meta.loom; 3 the stamp (ckpt_format.h) after
 * every file's fixed header; 4 the lineage after the stamp of meta.loom and
 * of the consolidated file. 1 to 3 are still read. */
#define FORMAT_VERSION 5u
#define FORMAT_STAMPED 3u
#define FORMAT_LINEAGE 4u
#define FORMAT_REPLICAS 5u
#define FORMAT_OLDEST 1u
/* Far above any real job, low enough that a damaged count cannot make the
 * reader allocate without bound. */
#define MAX_FILES (1 << 20)
#define MAX_TENSORS 64
/* The lineage's settings text: a few dozen short lines. */
#define MAX_SETTINGS_TEXT (64 * 1024)

/* The consolidated file's header; its layout is the on-disk format. */
typedef struct state_disk {
    char magic[8];
    uint32_t version, dtype;
    int32_t shape[6];
    int64_t step, good_steps;
    uint64_t data; /* format 2: bytes of data position after the header; 1: a token offset */
    float loss_scale;
    uint32_t nunits;
} state_disk;

typedef struct meta_disk {
    state_disk state; /* magic META_MAGIC */
    uint32_t tp, files;
    char strategy[32];
} meta_disk;

typedef struct shard_disk {
    char magic[8];
    uint32_t version, records;
} shard_disk;

/* Format 3: after every file's fixed header. */
typedef struct stamp_disk {
    uint64_t run_id;
    int64_t step;
    uint64_t bytes; /* the whole file's length */
    uint32_t checksum;
    uint32_t reserved; /* 0 */
} stamp_disk;

/* Format 4: after the stamp of meta.loom and of the consolidated file,
 * then settings_bytes of settings text (no NUL). */
typedef struct lineage_disk {
    uint64_t id, settings_hash, data_hash;
    uint32_t settings_bytes;
    uint32_t reserved; /* 0 */
} lineage_disk;

typedef struct record_disk {
    int32_t unit, tp_rank;
    uint64_t begin, count;
} record_disk;

static void to_disk(const loom_ckpt_header *h, const char *magic, state_disk *d)
{
    memset(d, 0, sizeof *d);
    memcpy(d->magic, magic, 8);
    /* a header without a position (consolidating a format 1 checkpoint)
     * can only be written as format 1 */
    int positioned = h->data_position_bytes > 0;
    d->version = positioned ? FORMAT_VERSION : FORMAT_OLDEST;
    d->dtype = (uint32_t)h->dtype;
    const loom_gpt2_shape *s = &h->shape;
    int32_t shape[6] = {s->max_seq, s->vocab, s->layers, s->heads, s->channels, s->padded_vocab};
    memcpy(d->shape, shape, sizeof shape);
    d->step = h->step;
    d->good_steps = h->good_steps;
    d->data = positioned ? (uint64_t)h->data_position_bytes : h->data_offset;
    d->loss_scale = h->loss_scale;
    d->nunits = (uint32_t)h->nunits;
}

/* The header but the data position itself, which follows it on disk. */
static void from_disk(const state_disk *d, loom_ckpt_header *h)
{
    h->dtype = (loom_dtype)d->dtype;
    h->shape = (loom_gpt2_shape){d->shape[0], d->shape[1], d->shape[2],
                                 d->shape[3], d->shape[4], d->shape[5]};
    h->step = d->step;
    h->good_steps = d->good_steps;
    h->data_position = NULL;
    h->data_position_bytes = d->version >= 2 ? (size_t)d->data : 0;
    h->data_offset = d->version >= 2 ? 0 : d->data;
    h->loss_scale = d->loss_scale;
    h->nunits = (int)d->nunits;
    h->run_id = 0;
    memset(&h->lineage, 0, sizeof h->lineage);
}

static int write_all(FILE *f, const void *p, size_t bytes)
{
    return bytes == 0 || fwrite(p, 1, bytes, f) == bytes;
}

static int read_all(FILE *f, void *p, size_t bytes)
{
    return bytes == 0 || fread(p, 1, bytes, f) == bytes;
}

static int known_version(uint32_t version)
{
    return version >= FORMAT_OLDEST && version <= FORMAT_VERSION;
}

static int unknown_version(const char *file, uint32_t version)
{
    return loom_fail(LOOM_ERR_NOT_SUPPORTED, "checkpoint file '%s': format %u; this loom reads "
                     "formats %u to %u (a newer loom wrote it, or the file is damaged)", file,
                     version, FORMAT_OLDEST, FORMAT_VERSION);
}

/* A field or a size that no writer produced: the file, the field and its
 * value, in one line. */
__attribute__((format(printf, 2, 3))) static int damaged(const char *file, const char *fmt, ...)
{
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return loom_fail(LOOM_ERR_INVALID, "checkpoint file '%s': %s; the checkpoint is damaged: "
                     "use another one", file, what);
}

static long long file_size(FILE *f)
{
    struct stat st;
    return fstat(fileno(f), &st) == 0 ? (long long)st.st_size : -1;
}

static size_t tensor_numel(const loom_param_desc *d)
{
    return (size_t)d->shape[0] * (size_t)(d->ndim > 1 ? d->shape[1] : 1);
}

size_t loom_ckpt_whole_numel(const loom_unit *unit)
{
    size_t n = 0;
    for (int i = 0; i < unit->ntensors; i++)
        n += tensor_numel(&unit->tensors[i]);
    return n;
}

/* Elements a tp rank holds of one tensor, given its slice. */
static size_t slice_numel(const loom_param_desc *d, const loom_param_shard *sh)
{
    size_t d0 = (size_t)d->shape[0], d1 = (size_t)(d->ndim > 1 ? d->shape[1] : 1);
    int parts = d->split_parts > 1 ? d->split_parts : 1;
    if (d->split == LOOM_SPLIT_ROWS)
        return (size_t)sh->count * (size_t)parts * d1;
    if (d->split == LOOM_SPLIT_COLUMNS)
        return d0 * (size_t)sh->count;
    return d0 * d1;
}

/* How far along its split dimension (per part) a tensor's slices may reach;
 * 0 for a tensor that is not split. */
static int64_t split_extent(const loom_param_desc *d)
{
    int parts = d->split_parts > 1 ? d->split_parts : 1;
    if (d->split == LOOM_SPLIT_ROWS)
        return d->shape[0] / parts;
    if (d->split == LOOM_SPLIT_COLUMNS)
        return d->ndim > 1 ? d->shape[1] : 1;
    return 0;
}

/* One tensor's slice into its place in the whole tensor: rows of a part
 * are contiguous, columns strided (the layout loom_model_slice makes). */
static void place_slice(const loom_param_desc *d, const loom_param_shard *sh, const float *local,
                        float *whole)
{
    size_t d0 = (size_t)d->shape[0], d1 = (size_t)(d->ndim > 1 ? d->shape[1] : 1);
    size_t begin = (size_t)sh->begin, count = (size_t)sh->count;
    if (d->split == LOOM_SPLIT_ROWS) {
        int parts = d->split_parts > 1 ? d->split_parts : 1;
        size_t per = d0 / (size_t)parts;
        for (int p = 0; p < parts; p++)
            memcpy(whole + ((size_t)p * per + begin) * d1, local + (size_t)p * count * d1,
                   count * d1 * sizeof(float));
    } else if (d->split == LOOM_SPLIT_COLUMNS) {
        for (size_t r = 0; r < d0; r++)
            memcpy(whole + r * d1 + begin, local + r * count, count * sizeof(float));
    } else {
        memcpy(whole, local, d0 * d1 * sizeof(float));
    }
}

/* ---- writing any file: the stamp, fsync ---- */

static int cannot_write(const char *path, int err)
{
    return loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot write '%s': %s", path, strerror(err));
}

/* Opens path and leaves room for the fixed header (head_bytes) and, when
 * stamped, the stamp: both are written by file_seal, once known. */
static int file_create(loom_ckpt_file *cf, const char *path, size_t head_bytes, int stamped)
{
    memset(cf, 0, sizeof *cf);
    snprintf(cf->path, sizeof cf->path, "%s", path);
    unsigned char zeros[sizeof(meta_disk) + sizeof(stamp_disk)] = {0};
    size_t n = head_bytes + (stamped ? sizeof(stamp_disk) : 0);
    if (!(cf->f = fopen(path, "wb")) || !write_all(cf->f, zeros, n)) {
        int err = errno;
        if (cf->f) {
            fclose(cf->f);
            cf->f = NULL;
            remove(path);
        }
        return cannot_write(path, err);
    }
    return LOOM_OK;
}

static int file_write(loom_ckpt_file *cf, const void *data, size_t bytes)
{
    if (!write_all(cf->f, data, bytes))
        return cannot_write(cf->path, errno);
    cf->crc = loom_crc32c_extend(cf->crc, data, bytes);
    return LOOM_OK;
}

static void file_abandon(loom_ckpt_file *cf)
{
    if (cf->f) {
        fclose(cf->f);
        cf->f = NULL;
        remove(cf->path);
    }
}

/* The header and stamp into their place, then fsync and close: the file is
 * on the disk whole when this returns LOOM_OK; otherwise it is removed. */
static int file_seal(loom_ckpt_file *cf, const void *head, size_t head_bytes, int stamped,
                     uint64_t run_id, int64_t step)
{
    long end = ftell(cf->f);
    int ok = end >= 0;
    if (ok && stamped) {
        stamp_disk st = {run_id, step, (uint64_t)end, 0, 0};
        uint32_t crc = loom_crc32c_extend(cf->crc, head, head_bytes);
        st.checksum = loom_crc32c_extend(crc, &st, sizeof st);
        ok = fseek(cf->f, 0, SEEK_SET) == 0 && write_all(cf->f, head, head_bytes) &&
             write_all(cf->f, &st, sizeof st);
    } else if (ok) {
        ok = fseek(cf->f, 0, SEEK_SET) == 0 && write_all(cf->f, head, head_bytes);
    }
    /* fsync before anyone renames the directory into place: otherwise the
     * rename may reach the disk before the data, and a power loss leaves a
     * "complete" checkpoint of zeroed pages */
    ok = ok && fflush(cf->f) == 0 && fsync(fileno(cf->f)) == 0;
    int err = errno;
    if (fclose(cf->f) != 0 && ok) {
        ok = 0;
        err = errno;
    }
    cf->f = NULL;
    if (ok)
        return LOOM_OK;
    remove(cf->path);
    return cannot_write(cf->path, err);
}

/* Format 4's lineage block, first after the stamp. */
static int write_lineage(loom_ckpt_file *cf, const loom_ckpt_lineage *l)
{
    size_t text = l->settings ? strlen(l->settings) : 0;
    if (text > MAX_SETTINGS_TEXT)
        text = MAX_SETTINGS_TEXT;
    lineage_disk d = {l->id, l->settings_hash, l->data_hash, (uint32_t)text, 0};
    int rc = file_write(cf, &d, sizeof d);
    return rc == LOOM_OK ? file_write(cf, l->settings, text) : rc;
}

int loom_ckpt_sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int ok = fd >= 0 && (fsync(fd) == 0 || errno == EINVAL); /* EINVAL: it cannot be synced */
    int err = errno;
    if (fd >= 0)
        close(fd);
    return ok ? LOOM_OK
              : loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot sync the directory '%s': %s", dir,
                          strerror(err));
}

/* Format 5: after a shard file's unit records, to its end, the replica
 * records of the rank that wrote it, each followed by its bytes. */
typedef struct replica_disk {
    int32_t unit, dp_rank, dp_size, reserved; /* reserved 0 */
    char label[LOOM_CKPT_REPLICA_LABEL];      /* NUL-terminated */
    uint64_t bytes;
} replica_disk;

/* ---- sharded: writing ---- */

int loom_ckpt_shard_open(loom_ckpt_shard_writer *w, const char *dir, int rank, uint64_t run_id,
                         int64_t step)
{
    memset(w, 0, sizeof *w);
    w->run_id = run_id;
    w->step = step;
    char path[4200];
    snprintf(path, sizeof path, "%.4000s/shard-%d.loom", dir, rank);
    return file_create(&w->file, path, sizeof(shard_disk), 1);
}

int loom_ckpt_shard_put(loom_ckpt_shard_writer *w, int unit, int tp_rank, size_t begin,
                        size_t count, const float *params, const float *m, const float *v)
{
    record_disk r = {unit, tp_rank, begin, count};
    size_t bytes = count * sizeof(float);
    int rc;
    if ((rc = file_write(&w->file, &r, sizeof r)) != LOOM_OK ||
        (rc = file_write(&w->file, params, bytes)) != LOOM_OK ||
        (rc = file_write(&w->file, m, bytes)) != LOOM_OK ||
        (rc = file_write(&w->file, v, bytes)) != LOOM_OK)
        return rc;
    w->records++;
    return LOOM_OK;
}

int loom_ckpt_shard_put_replica(loom_ckpt_shard_writer *w, int unit, int dp_rank, int dp_size,
                                const char *label, const void *data, size_t bytes)
{
    replica_disk r = {unit, dp_rank, dp_size, 0, "", bytes};
    if (strlen(label) >= sizeof r.label)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint: the replica buffer label '%s' of unit %d "
                         "is longer than %zu characters", label, unit, sizeof r.label - 1);
    memcpy(r.label, label, strlen(label));
    int rc = file_write(&w->file, &r, sizeof r);
    if (rc == LOOM_OK && bytes)
        rc = file_write(&w->file, data, bytes);
    w->replicas += rc == LOOM_OK;
    return rc;
}

int loom_ckpt_shard_close(loom_ckpt_shard_writer *w, int ok)
{
    if (!w->file.f)
        return ok ? LOOM_OK : LOOM_ERR_INVALID;
    if (!ok) {
        file_abandon(&w->file);
        return LOOM_ERR_INVALID;
    }
    shard_disk h = {SHARD_MAGIC, FORMAT_VERSION, w->records};
    return file_seal(&w->file, &h, sizeof h, 1, w->run_id, w->step);
}

int loom_ckpt_write_meta(const char *dir, const loom_ckpt_header *h, int tp, int files,
                         const char *strategy, const loom_unit *units,
                         const loom_param_shard *const *tp_shards)
{
    char path[4200];
    snprintf(path, sizeof path, "%.4000s/meta.loom", dir);
    meta_disk md;
    memset(&md, 0, sizeof md);
    to_disk(h, META_MAGIC, &md.state);
    md.tp = (uint32_t)tp;
    md.files = (uint32_t)files;
    snprintf(md.strategy, sizeof md.strategy, "%s", strategy);
    int stamped = md.state.version >= FORMAT_STAMPED;
    loom_ckpt_file cf;
    int rc = file_create(&cf, path, sizeof md, stamped);
    if (rc == LOOM_OK && md.state.version >= FORMAT_LINEAGE)
        rc = write_lineage(&cf, &h->lineage);
    if (rc == LOOM_OK && h->data_position_bytes)
        rc = file_write(&cf, h->data_position, h->data_position_bytes);
    for (int u = 0; rc == LOOM_OK && u < h->nunits; u++) {
        uint32_t nt = (uint32_t)units[u].ntensors;
        rc = file_write(&cf, &nt, sizeof nt);
        for (size_t i = 0; rc == LOOM_OK && i < (size_t)tp * nt; i++) {
            int64_t pair[2] = {tp_shards[u][i].begin, tp_shards[u][i].count};
            rc = file_write(&cf, pair, sizeof pair);
        }
    }
    if (rc != LOOM_OK) {
        file_abandon(&cf);
        return rc;
    }
    return file_seal(&cf, &md, sizeof md, stamped, h->run_id, h->step);
}

static int is_shard_name(const char *name)
{
    const char *p = name;
    if (strncmp(p, "shard-", 6) != 0)
        return 0;
    p += 6;
    if (*p < '0' || *p > '9')
        return 0;
    while (*p >= '0' && *p <= '9')
        p++;
    return !strcmp(p, ".loom");
}

int loom_ckpt_remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? LOOM_OK
                               : loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot remove '%s': %s",
                                           dir, strerror(errno));
    char path[4400], other[256] = "";
    struct dirent *e;
    int rc = LOOM_OK;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (strcmp(e->d_name, "meta.loom") != 0 && !is_shard_name(e->d_name)) {
            snprintf(other, sizeof other, "%s", e->d_name);
            continue;
        }
        snprintf(path, sizeof path, "%.4000s/%s", dir, e->d_name);
        if (unlink(path) != 0 && errno != ENOENT && rc == LOOM_OK)
            rc = loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot remove '%s': %s", path,
                           strerror(errno));
    }
    closedir(d);
    if (rc != LOOM_OK)
        return rc;
    if (rmdir(dir) != 0 && errno != ENOENT)
        return other[0] ? loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot remove '%s': it holds "
                                    "'%s', which loom did not write; move that file away",
                                    dir, other)
                        : loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot remove '%s': %s", dir,
                                    strerror(errno));
    return LOOM_OK;
}

/* The stamp of one file, if it has one. */
static int read_file_stamp(const char *path, stamp_disk *st)
{
    FILE *f = loom_fopen_regular(path, NULL);
    if (!f)
        return 0;
    char head[sizeof(meta_disk)];
    size_t head_bytes = 0;
    int ok = read_all(f, head, sizeof(shard_disk));
    if (ok && !memcmp(head, SHARD_MAGIC, 8))
        head_bytes = sizeof(shard_disk);
    else if (ok && !memcmp(head, META_MAGIC, 8))
        head_bytes = sizeof(meta_disk);
    uint32_t version = 0;
    if (ok)
        memcpy(&version, head + 8, sizeof version);
    ok = ok && head_bytes && version >= FORMAT_STAMPED && known_version(version) &&
         fseek(f, (long)head_bytes, SEEK_SET) == 0 && read_all(f, st, sizeof *st);
    fclose(f);
    return ok;
}

int loom_ckpt_dir_stamp(const char *dir, uint64_t *run_id, int64_t *step)
{
    DIR *d = opendir(dir);
    if (!d)
        return LOOM_ERR_NOT_FOUND;
    struct dirent *e;
    char path[4400];
    int found = 0;
    while (!found && (e = readdir(d))) {
        if (strcmp(e->d_name, "meta.loom") != 0 && !is_shard_name(e->d_name))
            continue;
        stamp_disk st;
        snprintf(path, sizeof path, "%.4000s/%s", dir, e->d_name);
        if ((found = read_file_stamp(path, &st))) {
            *run_id = st.run_id;
            *step = st.step;
        }
    }
    closedir(d);
    return found ? LOOM_OK : LOOM_ERR_NOT_FOUND;
}

/* ---- consolidated: writing ---- */

int loom_state_open(loom_state_writer *w, const char *path, const loom_ckpt_header *h)
{
    memset(w, 0, sizeof *w);
    snprintf(w->path, sizeof w->path, "%.4000s", path);
    w->h = *h;
    char tmp[4210];
    snprintf(tmp, sizeof tmp, "%.4000s.tmp", path);
    state_disk d;
    to_disk(h, STATE_MAGIC, &d);
    int rc = file_create(&w->file, tmp, sizeof d, d.version >= FORMAT_STAMPED);
    if (rc == LOOM_OK && d.version >= FORMAT_LINEAGE)
        rc = write_lineage(&w->file, &h->lineage);
    if (rc == LOOM_OK && h->data_position_bytes)
        rc = file_write(&w->file, h->data_position, h->data_position_bytes);
    if (rc != LOOM_OK)
        file_abandon(&w->file);
    w->h.data_position = NULL; /* the caller's; not needed again */
    w->h.lineage.settings = NULL;
    return rc;
}

int loom_state_put(loom_state_writer *w, const float *params, const float *m, const float *v,
                   size_t n)
{
    size_t bytes = n * sizeof(float);
    int rc;
    if ((rc = file_write(&w->file, params, bytes)) != LOOM_OK ||
        (rc = file_write(&w->file, m, bytes)) != LOOM_OK ||
        (rc = file_write(&w->file, v, bytes)) != LOOM_OK)
        return rc;
    return LOOM_OK;
}

/* The folder a path is in, for its fsync after a rename. */
static void parent_of(const char *path, char *buf, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(buf, cap, ".");
    else if (slash == path)
        snprintf(buf, cap, "/");
    else
        snprintf(buf, cap, "%.*s", (int)(slash - path), path);
}

int loom_state_close(loom_state_writer *w, int ok)
{
    if (!w->file.f)
        return ok ? LOOM_OK : LOOM_ERR_INVALID;
    if (!ok) {
        file_abandon(&w->file);
        return LOOM_ERR_INVALID;
    }
    state_disk d;
    to_disk(&w->h, STATE_MAGIC, &d);
    int rc = file_seal(&w->file, &d, sizeof d, d.version >= FORMAT_STAMPED, w->h.run_id,
                       w->h.step);
    if (rc != LOOM_OK)
        return rc;
    if (rename(w->file.path, w->path) != 0) {
        int err = errno;
        remove(w->file.path);
        return cannot_write(w->path, err);
    }
    char parent[4200];
    parent_of(w->path, parent, sizeof parent);
    return loom_ckpt_sync_dir(parent);
}

/* ---- reading ---- */

typedef struct shard_record {
    int unit, tp_rank, file;
    uint64_t begin, count;
    long offset; /* of the params in the file */
} shard_record;

struct loom_ckpt {
    loom_ckpt_header h;
    char path[4096];
    int sharded;
    uint32_t format;   /* meta.loom's, or the consolidated file's */
    int verified;      /* every file's checksum was checked */
    unsigned char *data_position; /* h.data_position's bytes */
    char *settings;               /* h.lineage.settings' text */
    FILE *state; /* consolidated */
    long units_at; /* consolidated: where the units start, past the data position */
    /* sharded */
    int tp, files;
    char strategy[32];
    int *ntensors;             /* per unit */
    loom_param_shard **shards; /* per unit: tp × ntensors */
    FILE **f;
    shard_record *rec;
    int nrec;
    loom_ckpt_replica *replicas;
    int nreplicas;
};

/* The path of meta.loom (file -1) or of a shard file, or the consolidated
 * file itself: what every message names. */
static void file_path(const loom_ckpt *ck, int file, char *buf, size_t cap)
{
    if (!ck->sharded)
        snprintf(buf, cap, "%s", ck->path);
    else if (file < 0)
        snprintf(buf, cap, "%.4000s/meta.loom", ck->path);
    else
        snprintf(buf, cap, "%.4000s/shard-%d.loom", ck->path, file);
}

/* A stamped file's checksum, over the whole file (ckpt_format.h). */
static int verify_checksum(const char *path, FILE *f, size_t head_bytes)
{
    unsigned char head[sizeof(meta_disk)];
    stamp_disk st;
    if (fseek(f, 0, SEEK_SET) != 0 || !read_all(f, head, head_bytes) ||
        !read_all(f, &st, sizeof st))
        return damaged(path, "it ends inside its header");
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = malloc(CHUNK);
    if (!buf)
        return loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    uint32_t crc = 0;
    size_t n;
    while ((n = fread(buf, 1, CHUNK, f)) > 0)
        crc = loom_crc32c_extend(crc, buf, n);
    int err = ferror(f) ? errno : 0;
    free(buf);
    if (err)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint file '%s': cannot read it: %s", path,
                         strerror(err));
    uint32_t written = st.checksum;
    st.checksum = 0;
    crc = loom_crc32c_extend(crc, head, head_bytes);
    crc = loom_crc32c_extend(crc, &st, sizeof st);
    if (crc != written)
        return damaged(path, "its CRC32C is 0x%08x, and it was written with 0x%08x (bytes "
                       "changed after it was written)", crc, written);
    return LOOM_OK;
}

/* The stamp after a fixed header, against the file's length. */
static int read_stamp(const char *path, FILE *f, long long size, stamp_disk *st)
{
    if (!read_all(f, st, sizeof *st))
        return damaged(path, "it ends inside its header (%lld bytes)", size);
    if (st->bytes != (uint64_t)size)
        return damaged(path, "it is %lld bytes long, and was written %llu bytes long (%s)", size,
                       (unsigned long long)st->bytes,
                       (unsigned long long)size < st->bytes ? "cut short" : "added to");
    return LOOM_OK;
}

/* Every field of a header before anything uses it. */
static int check_state(const char *path, const state_disk *d)
{
    if (d->dtype != LOOM_F32 && d->dtype != LOOM_BF16 && d->dtype != LOOM_F16)
        return damaged(path, "its precision (dtype) is %u, none that loom trains in", d->dtype);
    static const char *const names[6] = {"model.max_seq", "model.vocab",    "model.layers",
                                         "model.heads",   "model.channels", "model.padded_vocab"};
    for (int i = 0; i < 6; i++)
        if (d->shape[i] < 1)
            return damaged(path, "%s is %d, and must be at least 1", names[i], d->shape[i]);
    if (d->shape[4] % d->shape[3] != 0)
        return damaged(path, "model.channels %d does not divide by model.heads %d", d->shape[4],
                       d->shape[3]);
    if (d->shape[5] < d->shape[1])
        return damaged(path, "model.padded_vocab %d is below model.vocab %d", d->shape[5],
                       d->shape[1]);
    loom_gpt2_shape shape = {d->shape[0], d->shape[1], d->shape[2],
                             d->shape[3], d->shape[4], d->shape[5]};
    uint64_t bytes = loom_gpt2_param_bytes(&shape);
    if (bytes == 0 || bytes > (uint64_t)INT64_MAX / 3)
        return damaged(path, "model.layers %d, model.channels %d, model.padded_vocab %d and "
                       "model.max_seq %d make more than 2^63 bytes of state", d->shape[2],
                       d->shape[4], d->shape[5], d->shape[0]);
    if (d->step < 0)
        return damaged(path, "its step is %lld", (long long)d->step);
    if (d->good_steps < 0 || d->good_steps > d->step)
        return damaged(path, "its good_steps is %lld, after step %lld", (long long)d->good_steps,
                       (long long)d->step);
    if (!isfinite(d->loss_scale) || d->loss_scale <= 0)
        return damaged(path, "its loss_scale is %g", (double)d->loss_scale);
    if (d->nunits < 1 || d->nunits > INT32_MAX)
        return damaged(path, "its nunits is %u", d->nunits);
    return LOOM_OK;
}

/* Elements of params (m and v as many) of the checkpoint's model. */
static uint64_t model_elements(const loom_ckpt *ck)
{
    return loom_gpt2_param_bytes(&ck->h.shape) / sizeof(float);
}

/* The data position after a header, from f (remaining bytes to the end). */
static int read_data_position(loom_ckpt *ck, const char *path, FILE *f, long long remaining)
{
    size_t n = ck->h.data_position_bytes;
    if (n == 0)
        return LOOM_OK;
    if (remaining < 0 || (unsigned long long)n > (unsigned long long)remaining)
        return damaged(path, "its data position is %zu bytes, more than the %lld bytes left "
                       "in the file", n, remaining);
    if (!(ck->data_position = malloc(n)))
        return loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    if (!read_all(f, ck->data_position, n))
        return damaged(path, "it ends inside its data position");
    ck->h.data_position = ck->data_position;
    return LOOM_OK;
}

/* Format 4's lineage block from f, at the end of the stamp (remaining
 * bytes to the end): into *l, its text into *text (malloc'd). */
static int read_lineage(const char *path, FILE *f, long long remaining, loom_ckpt_lineage *l,
                        char **text)
{
    lineage_disk d;
    if (remaining < (long long)sizeof d || !read_all(f, &d, sizeof d))
        return damaged(path, "it ends inside its lineage");
    if (d.settings_bytes > MAX_SETTINGS_TEXT ||
        (long long)d.settings_bytes > remaining - (long long)sizeof d)
        return damaged(path, "its lineage's settings are %u bytes, more than the file or loom "
                       "allows", d.settings_bytes);
    if (!(*text = malloc((size_t)d.settings_bytes + 1)))
        return loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    if (!read_all(f, *text, d.settings_bytes))
        return damaged(path, "it ends inside its lineage");
    (*text)[d.settings_bytes] = '\0';
    if (strlen(*text) != d.settings_bytes)
        return damaged(path, "its lineage's settings hold a NUL byte");
    *l = (loom_ckpt_lineage){d.id, d.settings_hash, d.data_hash, *text};
    return LOOM_OK;
}

static int open_consolidated(loom_ckpt *ck)
{
    const char *path = ck->path;
    state_disk d;
    const char *why = NULL;
    if (!(ck->state = loom_fopen_regular(path, &why)))
        return loom_fail(LOOM_ERR_NOT_FOUND, "checkpoint '%s': %s", path, why);
    long long size = file_size(ck->state);
    if (!read_all(ck->state, &d, sizeof d) || memcmp(d.magic, STATE_MAGIC, 8) != 0)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': not a loom checkpoint "
                         "(train.checkpoint_every writes a directory of shards, `loom ckpt "
                         "consolidate` one file)", path);
    if (!known_version(d.version))
        return unknown_version(path, d.version);
    ck->format = d.version;
    stamp_disk st = {0};
    int rc;
    if (d.version >= FORMAT_STAMPED &&
        ((rc = read_stamp(path, ck->state, size, &st)) != LOOM_OK ||
         (rc = verify_checksum(path, ck->state, sizeof d)) != LOOM_OK))
        return rc;
    if ((rc = check_state(path, &d)) != LOOM_OK)
        return rc;
    from_disk(&d, &ck->h);
    ck->h.run_id = st.run_id;
    ck->verified = d.version >= FORMAT_STAMPED;
    long head = (long)(sizeof d + (d.version >= FORMAT_STAMPED ? sizeof st : 0));
    if (fseek(ck->state, head, SEEK_SET) != 0)
        return damaged(path, "it ends inside its header");
    if (d.version >= FORMAT_LINEAGE &&
        (rc = read_lineage(path, ck->state, size - head, &ck->h.lineage, &ck->settings)) !=
            LOOM_OK)
        return rc;
    head = ftell(ck->state);
    if ((rc = read_data_position(ck, path, ck->state, size - head)) != LOOM_OK)
        return rc;
    ck->units_at = head + (long)ck->h.data_position_bytes;
    /* params, m and v of every unit, whole, and nothing after them */
    uint64_t want = 3 * model_elements(ck) * sizeof(float);
    if ((uint64_t)(size - ck->units_at) != want)
        return damaged(path, "it holds %lld bytes of state, and a model of its shape (model.layers "
                       "%d, model.channels %d) %llu", size - ck->units_at, ck->h.shape.layers,
                       ck->h.shape.channels, (unsigned long long)want);
    return LOOM_OK;
}

static int index_shard_file(loom_ckpt *ck, int file)
{
    char path[4200];
    file_path(ck, file, path, sizeof path);
    const char *why = NULL;
    FILE *f = ck->f[file] = loom_fopen_regular(path, &why);
    if (!f && errno != ENOENT)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': %s: %s", ck->path, path, why);
    if (!f)
        return loom_fail(LOOM_ERR_NOT_FOUND, "checkpoint '%s': %s: %s (meta.loom names %d shard "
                         "files: a checkpoint from an older loom that was not finished?)",
                         ck->path, path, why, ck->files);
    long long size = file_size(f);
    shard_disk h;
    if (!read_all(f, &h, sizeof h) || memcmp(h.magic, SHARD_MAGIC, 8) != 0)
        return damaged(path, "it is not a loom shard file");
    if (!known_version(h.version))
        return unknown_version(path, h.version);
    if ((ck->format >= FORMAT_STAMPED) != (h.version >= FORMAT_STAMPED))
        return damaged(path, "its format is %u, and meta.loom's %u", h.version, ck->format);
    if (h.version >= FORMAT_STAMPED) {
        stamp_disk st;
        int rc = read_stamp(path, f, size, &st);
        if (rc != LOOM_OK)
            return rc;
        if (st.run_id != ck->h.run_id || st.step != ck->h.step)
            return damaged(path, "it was written by run %016llx after step %lld, and meta.loom "
                           "by run %016llx after step %lld: the directory mixes two checkpoints",
                           (unsigned long long)st.run_id, (long long)st.step,
                           (unsigned long long)ck->h.run_id, (long long)ck->h.step);
    }
    long at = ftell(f);
    if (h.records > (unsigned long long)(size - at) / sizeof(record_disk))
        return damaged(path, "it says it holds %u records, more than its %lld bytes can",
                       h.records, size);
    shard_record *grown = realloc(ck->rec, ((size_t)ck->nrec + h.records + 1) * sizeof *grown);
    if (!grown)
        return loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    ck->rec = grown;
    for (uint32_t i = 0; i < h.records; i++) {
        record_disk r;
        if (!read_all(f, &r, sizeof r))
            return damaged(path, "it ends inside record %u of %u", i, h.records);
        if (r.unit < 0 || r.unit >= ck->h.nunits || r.tp_rank < 0 || r.tp_rank >= ck->tp)
            return damaged(path, "record %u is of unit %d, tp rank %d, outside the checkpoint's "
                           "%d units and %d tp ranks", i, r.unit, r.tp_rank, ck->h.nunits, ck->tp);
        at = ftell(f);
        uint64_t room = (uint64_t)(size - at) / (3 * sizeof(float));
        if (r.count > room)
            return damaged(path, "record %u (unit %d) holds %llu elements, and the file has room "
                           "for %llu more (cut short)", i, r.unit, (unsigned long long)r.count,
                           (unsigned long long)room);
        if (r.begin > model_elements(ck))
            return damaged(path, "record %u (unit %d) begins at element %llu, past the whole "
                           "model's %llu", i, r.unit, (unsigned long long)r.begin,
                           (unsigned long long)model_elements(ck));
        ck->rec[ck->nrec++] = (shard_record){r.unit, r.tp_rank, file, r.begin, r.count, at};
        if (fseek(f, (long)(3 * r.count * sizeof(float)), SEEK_CUR) != 0)
            return damaged(path, "it ends inside record %u", i);
    }
    for (int i = 0; h.version >= FORMAT_REPLICAS && ftell(f) < size; i++) {
        replica_disk r;
        if (!read_all(f, &r, sizeof r))
            return damaged(path, "it ends inside replica record %d", i);
        at = ftell(f);
        if (r.unit < 0 || r.unit >= ck->h.nunits || r.dp_size < 1 || r.dp_rank < 0 ||
            r.dp_rank >= r.dp_size || r.reserved != 0 || !memchr(r.label, 0, sizeof r.label))
            return damaged(path, "replica record %d (unit %d, dp rank %d of %d) is malformed", i,
                           r.unit, r.dp_rank, r.dp_size);
        if (r.bytes > (uint64_t)(size - at))
            return damaged(path, "replica record %d (unit %d, '%s') holds %llu bytes, and the "
                           "file has %lld more (cut short)", i, r.unit, r.label,
                           (unsigned long long)r.bytes, size - (long long)at);
        loom_ckpt_replica *grown_replicas =
            realloc(ck->replicas, ((size_t)ck->nreplicas + 1) * sizeof *grown_replicas);
        if (!grown_replicas)
            return loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
        ck->replicas = grown_replicas;
        loom_ckpt_replica *rep = &ck->replicas[ck->nreplicas++];
        *rep = (loom_ckpt_replica){file, r.unit, r.dp_rank, r.dp_size, "", r.bytes, at};
        memcpy(rep->label, r.label, sizeof rep->label);
        if (fseek(f, (long)r.bytes, SEEK_CUR) != 0)
            return damaged(path, "it ends inside replica record %d", i);
    }
    if (ftell(f) != size)
        return damaged(path, "%lld bytes follow its last record", size - (long long)ftell(f));
    return LOOM_OK;
}

int loom_ckpt_replica_count(const loom_ckpt *ck)
{
    return ck->nreplicas;
}

const loom_ckpt_replica *loom_ckpt_replica_at(const loom_ckpt *ck, int i)
{
    return i >= 0 && i < ck->nreplicas ? &ck->replicas[i] : NULL;
}

int loom_ckpt_read_replica(loom_ckpt *ck, int i, void *data)
{
    const loom_ckpt_replica *r = &ck->replicas[i];
    char path[4200];
    file_path(ck, r->file, path, sizeof path);
    FILE *f = ck->f[r->file];
    if (fseek(f, r->offset, SEEK_SET) != 0 || !read_all(f, data, r->bytes))
        return damaged(path, "cannot read replica record '%s' of unit %d", r->label, r->unit);
    return LOOM_OK;
}

/* meta.loom: the header, the data position and the shard table. */
static int read_meta(loom_ckpt *ck, FILE *f, const char *path)
{
    long long size = file_size(f);
    meta_disk md;
    if (!read_all(f, &md, sizeof md) || memcmp(md.state.magic, META_MAGIC, 8) != 0)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': meta.loom is not a loom "
                         "checkpoint's", ck->path);
    if (!known_version(md.state.version))
        return unknown_version(path, md.state.version);
    ck->format = md.state.version;
    stamp_disk st = {0};
    int rc;
    if (ck->format >= FORMAT_STAMPED &&
        ((rc = read_stamp(path, f, size, &st)) != LOOM_OK ||
         (rc = verify_checksum(path, f, sizeof md)) != LOOM_OK))
        return rc;
    if ((rc = check_state(path, &md.state)) != LOOM_OK)
        return rc;
    if (md.tp < 1 || md.tp > MAX_FILES)
        return damaged(path, "its tp is %u", md.tp);
    if (md.files < 1 || md.files > MAX_FILES || md.files % md.tp != 0)
        return damaged(path, "its files is %u, and must be a multiple of its tp %u", md.files,
                       md.tp);
    if (!memchr(md.strategy, '\0', sizeof md.strategy))
        return damaged(path, "its strategy name is not terminated");
    from_disk(&md.state, &ck->h);
    ck->h.run_id = st.run_id;
    ck->tp = (int)md.tp;
    ck->files = (int)md.files;
    memcpy(ck->strategy, md.strategy, sizeof ck->strategy);
    long head = (long)(sizeof md + (ck->format >= FORMAT_STAMPED ? sizeof st : 0));
    if (fseek(f, head, SEEK_SET) != 0)
        return damaged(path, "it ends inside its header");
    if (ck->format >= FORMAT_LINEAGE &&
        (rc = read_lineage(path, f, size - head, &ck->h.lineage, &ck->settings)) != LOOM_OK)
        return rc;
    head = ftell(f);
    if ((rc = read_data_position(ck, path, f, size - head)) != LOOM_OK)
        return rc;
    size_t nu = (size_t)ck->h.nunits;
    long long left = size - ftell(f);
    if (nu > (unsigned long long)left / sizeof(uint32_t))
        return damaged(path, "its nunits is %zu, more than its %lld bytes of shard table can "
                       "describe", nu, left);
    ck->ntensors = calloc(nu, sizeof *ck->ntensors);
    ck->shards = calloc(nu, sizeof *ck->shards);
    ck->f = calloc((size_t)ck->files, sizeof *ck->f);
    if (!ck->ntensors || !ck->shards || !ck->f)
        return loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    for (size_t u = 0; u < nu; u++) {
        uint32_t nt = 0;
        if (!read_all(f, &nt, sizeof nt))
            return damaged(path, "it ends inside its shard table (unit %zu)", u);
        if (nt > MAX_TENSORS)
            return damaged(path, "unit %zu has %u tensors in its shard table", u, nt);
        ck->ntensors[u] = (int)nt;
        size_t n = (size_t)ck->tp * nt;
        if (!(ck->shards[u] = calloc(n ? n : 1, sizeof **ck->shards)))
            return loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
        for (size_t i = 0; i < n; i++) {
            int64_t pair[2];
            if (!read_all(f, pair, sizeof pair))
                return damaged(path, "it ends inside its shard table (unit %zu)", u);
            if (pair[0] < 0 || pair[1] < 0)
                return damaged(path, "its shard table gives tp rank %zu of unit %zu, tensor %zu "
                               "the slice %lld + %lld", i / nt, u, i % nt, (long long)pair[0],
                               (long long)pair[1]);
            ck->shards[u][i] = (loom_param_shard){pair[0], pair[1]};
        }
    }
    if (ftell(f) != size)
        return damaged(path, "%lld bytes follow its shard table", size - (long long)ftell(f));
    return LOOM_OK;
}

int loom_ckpt_lineage_of(const char *ckpt, int64_t *step, uint32_t *format,
                         loom_ckpt_lineage *lineage, char *settings, size_t cap)
{
    char path[4200];
    struct stat st_path;
    int sharded = stat(ckpt, &st_path) == 0 && S_ISDIR(st_path.st_mode);
    if (sharded)
        snprintf(path, sizeof path, "%.4000s/meta.loom", ckpt);
    else
        snprintf(path, sizeof path, "%.4000s", ckpt);
    memset(lineage, 0, sizeof *lineage);
    if (settings && cap)
        settings[0] = '\0';
    FILE *f = loom_fopen_regular(path, NULL);
    if (!f)
        return loom_fail(LOOM_ERR_NOT_FOUND, "checkpoint '%s': %s", ckpt,
                         sharded ? "no meta.loom in it" : "cannot open it");
    long long size = file_size(f);
    /* meta.loom's header begins as the consolidated file's */
    meta_disk md;
    size_t head_bytes = sharded ? sizeof md : sizeof md.state;
    stamp_disk st;
    char *text = NULL;
    int rc = LOOM_OK;
    if (!read_all(f, &md, head_bytes) ||
        memcmp(md.state.magic, sharded ? META_MAGIC : STATE_MAGIC, 8) != 0)
        rc = damaged(path, "it is not a loom checkpoint");
    else if (!known_version(md.state.version))
        rc = unknown_version(path, md.state.version);
    if (rc == LOOM_OK) {
        *step = md.state.step;
        *format = md.state.version;
    }
    if (rc == LOOM_OK && md.state.version < FORMAT_LINEAGE)
        rc = loom_fail(LOOM_ERR_NOT_SUPPORTED, "checkpoint '%s': format %u records no lineage",
                       ckpt, md.state.version);
    /* meta.loom is small enough to verify here; a consolidated file is
     * verified whole when it is opened to resume */
    if (rc == LOOM_OK && (rc = read_stamp(path, f, size, &st)) == LOOM_OK &&
        (!sharded || (rc = verify_checksum(path, f, head_bytes)) == LOOM_OK)) {
        long head = (long)(head_bytes + sizeof st);
        rc = fseek(f, head, SEEK_SET) == 0 ? read_lineage(path, f, size - head, lineage, &text)
                                           : damaged(path, "it ends inside its header");
    }
    if (rc == LOOM_OK && settings && cap)
        snprintf(settings, cap, "%s", text);
    lineage->settings = rc == LOOM_OK && settings ? settings : NULL;
    free(text);
    fclose(f);
    return rc;
}

static int open_sharded(loom_ckpt *ck, int verify)
{
    char path[4200];
    file_path(ck, -1, path, sizeof path);
    FILE *f = loom_fopen_regular(path, NULL);
    if (!f)
        return loom_fail(LOOM_ERR_NOT_FOUND, "checkpoint '%s': no meta.loom in it (a checkpoint "
                         "still being written, or not one)", ck->path);
    int rc = read_meta(ck, f, path);
    fclose(f);
    for (int i = 0; rc == LOOM_OK && i < ck->files; i++)
        rc = index_shard_file(ck, i);
    if (rc != LOOM_OK)
        return rc;
    /* every element is in some record, and the tp-replicated ones in one per
     * tp rank: fewer elements than the model's is a shape no writer made */
    uint64_t held = 0;
    for (int i = 0; i < ck->nrec; i++)
        held += ck->rec[i].count;
    if (held < model_elements(ck))
        return damaged(path, "a model of its shape (model.layers %d, model.channels %d) has %llu "
                       "elements, and its %d shard files hold %llu", ck->h.shape.layers,
                       ck->h.shape.channels, (unsigned long long)model_elements(ck), ck->files,
                       (unsigned long long)held);
    for (int i = 0; verify && i < ck->files; i++)
        if ((rc = loom_ckpt_verify_file(ck, i)) != LOOM_OK)
            return rc;
    ck->verified = verify && ck->format >= FORMAT_STAMPED;
    return LOOM_OK;
}

static int open_checkpoint(const char *path, int verify, loom_ckpt **out)
{
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0)
        return loom_fail(LOOM_ERR_NOT_FOUND, "checkpoint '%s': %s", path, strerror(errno));
    loom_ckpt *ck = calloc(1, sizeof *ck);
    if (!ck)
        return loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    snprintf(ck->path, sizeof ck->path, "%s", path);
    ck->sharded = S_ISDIR(st.st_mode);
    int rc = ck->sharded ? open_sharded(ck, verify) : open_consolidated(ck);
    if (rc != LOOM_OK) {
        loom_ckpt_close(ck);
        return rc;
    }
    *out = ck;
    return LOOM_OK;
}

int loom_ckpt_open(const char *path, loom_ckpt **out) { return open_checkpoint(path, 1, out); }

int loom_ckpt_open_unverified(const char *path, loom_ckpt **out)
{
    return open_checkpoint(path, 0, out);
}

int loom_ckpt_files(const loom_ckpt *ck) { return ck->sharded ? ck->files : 0; }

int loom_ckpt_tp(const loom_ckpt *ck) { return ck->sharded ? ck->tp : 1; }

int loom_ckpt_verify_file(loom_ckpt *ck, int file)
{
    if (!ck->sharded || ck->format < FORMAT_STAMPED || file < 0 || file >= ck->files)
        return LOOM_OK;
    char path[4200];
    file_path(ck, file, path, sizeof path);
    return verify_checksum(path, ck->f[file], sizeof(shard_disk));
}

static int by_slice_begin(const void *a, const void *b)
{
    const loom_param_shard *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* The tp ranks' slices of a split tensor cover it exactly once: else parts
 * of the whole tensor would load as whatever the buffer held. */
static int check_tiling(const loom_ckpt *ck, const char *path, int u, const loom_param_desc *d,
                        int tensor)
{
    int64_t extent = split_extent(d);
    if (extent == 0)
        return LOOM_OK;
    int nt = ck->ntensors[u];
    loom_param_shard *sorted = malloc((size_t)ck->tp * sizeof *sorted);
    if (!sorted)
        return loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    for (int j = 0; j < ck->tp; j++)
        sorted[j] = ck->shards[u][(size_t)j * (size_t)nt + (size_t)tensor];
    qsort(sorted, (size_t)ck->tp, sizeof *sorted, by_slice_begin);
    int64_t next = 0;
    for (int j = 0; j < ck->tp && sorted[j].begin == next; j++)
        next += sorted[j].count;
    free(sorted);
    if (next != extent)
        return damaged(path, "its shard table's tp slices of %s (unit %d) cover %lld of its %lld "
                       "%s, or overlap", d->name, u, (long long)next, (long long)extent,
                       d->split == LOOM_SPLIT_ROWS ? "rows" : "columns");
    return LOOM_OK;
}

/* One unit's tensors and slices in the shard table against the model's. */
static int check_unit(const loom_ckpt *ck, const char *path, const loom_unit *unit, int u)
{
    int nt = ck->ntensors[u];
    if (nt != unit->ntensors)
        return damaged(path, "its shard table gives unit %d (%s) %d tensors, and the model has %d",
                       u, unit->name, nt, unit->ntensors);
    for (int i = 0; i < nt; i++) {
        const loom_param_desc *d = &unit->tensors[i];
        int64_t extent = split_extent(d);
        for (int j = 0; j < ck->tp; j++) {
            const loom_param_shard *sh = &ck->shards[u][(size_t)j * (size_t)nt + (size_t)i];
            if (extent > 0 && (sh->begin > extent || sh->count > extent - sh->begin))
                return damaged(path, "its shard table puts tp rank %d's slice of %s (unit %d) "
                               "at %lld + %lld, outside its %lld %s", j, d->name, u,
                               (long long)sh->begin, (long long)sh->count, (long long)extent,
                               d->split == LOOM_SPLIT_ROWS ? "rows" : "columns");
        }
        int rc = check_tiling(ck, path, u, d, i);
        if (rc != LOOM_OK)
            return rc;
    }
    return LOOM_OK;
}

int loom_ckpt_check_model(const loom_ckpt *ck, const loom_unit *units, int nunits)
{
    char path[4200];
    file_path(ck, -1, path, sizeof path);
    if (nunits != ck->h.nunits)
        return damaged(path, "its nunits is %d, and a model of its shape has %d units",
                       ck->h.nunits, nunits);
    for (int u = 0; ck->sharded && u < nunits; u++) {
        int rc = check_unit(ck, path, &units[u], u);
        if (rc != LOOM_OK)
            return rc;
    }
    return LOOM_OK;
}

const loom_ckpt_header *loom_ckpt_header_of(const loom_ckpt *ck) { return &ck->h; }

void loom_ckpt_describe(const loom_ckpt *ck, char *buf, size_t cap)
{
    if (ck->sharded)
        snprintf(buf, cap, "sharded: %d shard files, tensor-parallel over %d, saved by %s",
                 ck->files, ck->tp, ck->strategy);
    else
        snprintf(buf, cap, "consolidated: one file, whole units");
}

void loom_ckpt_close(loom_ckpt *ck)
{
    if (!ck)
        return;
    if (ck->state)
        fclose(ck->state);
    for (int i = 0; ck->f && i < ck->files; i++)
        if (ck->f[i])
            fclose(ck->f[i]);
    for (int u = 0; ck->shards && u < ck->h.nunits; u++)
        free(ck->shards[u]);
    free(ck->shards);
    free(ck->ntensors);
    free(ck->f);
    free(ck->rec);
    free(ck->replicas);
    free(ck->data_position);
    free(ck->settings);
    free(ck);
}

static int read_consolidated_unit(loom_ckpt *ck, const loom_unit *units, int unit, float *params,
                                  float *m, float *v)
{
    long offset = ck->units_at;
    for (int u = 0; u < unit; u++)
        offset += (long)(3 * loom_ckpt_whole_numel(&units[u]) * sizeof(float));
    size_t n = loom_ckpt_whole_numel(&units[unit]);
    float *dst[3] = {params, m, v};
    for (int k = 0; k < 3; k++) {
        long at = offset + (long)((size_t)k * n * sizeof(float));
        if (dst[k] && (fseek(ck->state, at, SEEK_SET) != 0 ||
                       !read_all(ck->state, dst[k], n * sizeof(float))))
            return damaged(ck->path, "it ends inside unit %d (%s)", unit, units[unit].name);
    }
    return LOOM_OK;
}

static int by_begin(const void *a, const void *b)
{
    const shard_record *x = *(const shard_record *const *)a, *y = *(const shard_record *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* One tp rank's flat arrays of a unit, from the records that cover them;
 * refuses a gap or an overlap. */
static int read_slice(loom_ckpt *ck, const loom_unit *u, int tp_rank, size_t total,
                      float *const dst[3])
{
    shard_record **mine = calloc((size_t)ck->nrec + 1, sizeof *mine);
    if (!mine)
        return loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    int n = 0, rc = LOOM_OK;
    for (int i = 0; i < ck->nrec; i++)
        if (ck->rec[i].unit == u->index && ck->rec[i].tp_rank == tp_rank)
            mine[n++] = &ck->rec[i];
    qsort(mine, (size_t)n, sizeof *mine, by_begin);
    uint64_t next = 0;
    for (int i = 0; i < n && rc == LOOM_OK; i++) {
        shard_record *r = mine[i];
        if (r->begin != next || r->begin + r->count > total) {
            rc = loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': unit %d (%s), tp rank %d: shard "
                           "file %d holds elements %llu..%llu, expected to start at %llu of %zu",
                           ck->path, u->index, u->name, tp_rank, r->file,
                           (unsigned long long)r->begin,
                           (unsigned long long)(r->begin + r->count), (unsigned long long)next,
                           total);
            break;
        }
        FILE *f = ck->f[r->file];
        for (int k = 0; k < 3 && rc == LOOM_OK; k++) {
            long at = r->offset + (long)((size_t)k * r->count * sizeof(float));
            if (dst[k] && (fseek(f, at, SEEK_SET) != 0 ||
                           !read_all(f, dst[k] + r->begin, r->count * sizeof(float))))
            {
                char path[4200];
                file_path(ck, r->file, path, sizeof path);
                rc = damaged(path, "it ends inside its record of unit %d (%s), tp rank %d",
                             u->index, u->name, tp_rank);
            }
        }
        next = r->begin + r->count;
    }
    if (rc == LOOM_OK && next != total)
        rc = loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': unit %d (%s), tp rank %d: the shard "
                       "files hold %llu of its %zu elements (a rank's shard file is missing "
                       "records)", ck->path, u->index, u->name, tp_rank,
                       (unsigned long long)next, total);
    free(mine);
    return rc;
}

static int read_sharded_unit(loom_ckpt *ck, const loom_unit *units, int unit, float *params,
                             float *m, float *v)
{
    const loom_unit *u = &units[unit];
    char meta[4200];
    file_path(ck, -1, meta, sizeof meta);
    int rc = check_unit(ck, meta, u, unit);
    if (rc != LOOM_OK)
        return rc;
    float *whole[3] = {params, m, v};
    size_t biggest = 0;
    for (int j = 0; j < ck->tp; j++) {
        size_t total = 0;
        for (int i = 0; i < u->ntensors; i++)
            total += slice_numel(&u->tensors[i], &ck->shards[unit][(size_t)j * u->ntensors + i]);
        biggest = total > biggest ? total : biggest;
    }
    float *local = malloc(3 * biggest * sizeof(float) + 1);
    if (!local)
        return loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    for (int j = 0; j < ck->tp && rc == LOOM_OK; j++) {
        const loom_param_shard *sh = &ck->shards[unit][(size_t)j * u->ntensors];
        size_t total = 0;
        for (int i = 0; i < u->ntensors; i++)
            total += slice_numel(&u->tensors[i], &sh[i]);
        float *want[3];
        for (int k = 0; k < 3; k++)
            want[k] = whole[k] ? local + (size_t)k * total : NULL;
        if ((rc = read_slice(ck, u, j, total, want)) != LOOM_OK)
            break;
        for (int k = 0; k < 3; k++) {
            if (!whole[k])
                continue;
            size_t from = 0, to = 0;
            for (int i = 0; i < u->ntensors; i++) {
                place_slice(&u->tensors[i], &sh[i], want[k] + from, whole[k] + to);
                from += slice_numel(&u->tensors[i], &sh[i]);
                to += tensor_numel(&u->tensors[i]);
            }
        }
    }
    free(local);
    return rc;
}

int loom_ckpt_read_unit(loom_ckpt *ck, const loom_unit *units, int unit, float *params, float *m,
                        float *v)
{
    if (unit < 0 || unit >= ck->h.nunits)
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': no unit %d", ck->path, unit);
    return ck->sharded ? read_sharded_unit(ck, units, unit, params, m, v)
                       : read_consolidated_unit(ck, units, unit, params, m, v);
}

void loom_ckpt_print_info(const loom_ckpt *ck, const loom_unit *units, FILE *f)
{
    const loom_ckpt_header *h = &ck->h;
    char what[200];
    loom_ckpt_describe(ck, what, sizeof what);
    size_t params = 0;
    for (int u = 0; u < h->nunits; u++)
        params += loom_ckpt_whole_numel(&units[u]);
    fprintf(f, "%s: %s\n", ck->path, what);
    fprintf(f,
            "  model     gpt2 layers %d, heads %d, channels %d, vocab %d (padded %d), max_seq %d: "
            "%zu parameters in %d units\n",
            h->shape.layers, h->shape.heads, h->shape.channels, h->shape.vocab,
            h->shape.padded_vocab, h->shape.max_seq, params, h->nunits);
    fprintf(f, "  training  after step %lld, precision %s, loss scale %g\n", (long long)h->step,
            loom_dtype_name(h->dtype), h->loss_scale);
    if (ck->format >= FORMAT_STAMPED)
        fprintf(f, "  written   by run %016llx (format %u); CRC32C of every file %s\n",
                (unsigned long long)h->run_id, ck->format,
                ck->verified ? "verified" : "not yet verified");
    else
        fprintf(f, "  written   in format %u, which has no checksums to verify\n", ck->format);
    if (ck->format >= FORMAT_LINEAGE) {
        fprintf(f, "  lineage   %016llx (settings %016llx, data %016llx)\n",
                (unsigned long long)h->lineage.id, (unsigned long long)h->lineage.settings_hash,
                (unsigned long long)h->lineage.data_hash);
        /* the settings one line, as "name=value, name=value" */
        fprintf(f, "  settings  ");
        for (const char *c = h->lineage.settings; c && *c; c++)
            if (*c != '\n')
                fputc(*c, f);
            else if (c[1])
                fputs(", ", f);
        fputc('\n', f);
    } else {
        fprintf(f, "  lineage   none recorded (format %u; format 4 records it)\n", ck->format);
    }
    if (h->data_position)
        loom_data_position_print(h->data_position, h->data_position_bytes, f);
    else
        fprintf(f, "  data      token %llu of one unshuffled shard (checkpoint format 1)\n",
                (unsigned long long)h->data_offset);
    for (int fi = 0; ck->sharded && fi < ck->files; fi++) {
        int records = 0;
        uint64_t elems = 0;
        for (int i = 0; i < ck->nrec; i++)
            if (ck->rec[i].file == fi)
                records++, elems += ck->rec[i].count;
        fprintf(f, "  shard-%d   %d records, %llu elements (%.2f MiB of params, m and v)\n", fi,
               records, (unsigned long long)elems, (double)elems * 12.0 / (1024.0 * 1024.0));
        int replicas = 0, dp_rank = 0;
        uint64_t bytes = 0;
        for (int i = 0; i < ck->nreplicas; i++)
            if (ck->replicas[i].file == fi)
                replicas++, bytes += ck->replicas[i].bytes, dp_rank = ck->replicas[i].dp_rank;
        if (replicas)
            fprintf(f, "            %d replica records of dp rank %d, %llu bytes (its own state)\n",
                    replicas, dp_rank, (unsigned long long)bytes);
    }
}

int loom_ckpt_write_state(loom_ckpt *ck, const loom_unit *units, const char *path)
{
    loom_state_writer w;
    int rc = loom_state_open(&w, path, &ck->h);
    for (int u = 0; rc == LOOM_OK && u < ck->h.nunits; u++) {
        size_t n = loom_ckpt_whole_numel(&units[u]);
        float *pmv = malloc(3 * n * sizeof(float) + 1);
        rc = pmv ? loom_ckpt_read_unit(ck, units, u, pmv, pmv + n, pmv + 2 * n)
                 : loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
        if (rc == LOOM_OK)
            rc = loom_state_put(&w, pmv, pmv + n, pmv + 2 * n, n);
        free(pmv);
    }
    int closed = loom_state_close(&w, rc == LOOM_OK);
    return rc == LOOM_OK ? closed : rc;
}

int loom_ckpt_read_llmc(loom_ckpt *ck, const loom_model *model, float **weights)
{
    int nunits = 0;
    const loom_unit *units = loom_model_units((loom_model *)(uintptr_t)model, &nunits);
    float **whole = calloc((size_t)nunits, sizeof *whole);
    float *llmc = malloc(loom_gpt2_param_count(&ck->h.shape) * sizeof(float));
    int rc = whole && llmc ? LOOM_OK : loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    for (int u = 0; rc == LOOM_OK && u < nunits; u++)
        rc = (whole[u] = malloc(loom_ckpt_whole_numel(&units[u]) * sizeof(float)))
                 ? loom_ckpt_read_unit(ck, units, u, whole[u], NULL, NULL)
                 : loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    if (rc == LOOM_OK)
        loom_model_join_params(model, whole, llmc);
    for (int u = 0; whole && u < nunits; u++)
        free(whole[u]);
    free(whole);
    if (rc != LOOM_OK) {
        free(llmc);
        llmc = NULL;
    }
    *weights = llmc;
    return rc;
}

int loom_ckpt_write_llmc(loom_ckpt *ck, const loom_model *model, const char *path,
                         loom_dtype dtype)
{
    float *llmc = NULL;
    int rc = loom_ckpt_read_llmc(ck, model, &llmc);
    if (rc == LOOM_OK)
        rc = loom_checkpoint_write(path, &ck->h.shape, llmc, dtype);
    free(llmc);
    return rc;
}
