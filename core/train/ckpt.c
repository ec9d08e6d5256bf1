/* Resumable checkpoints, sharded and consolidated (see ckpt.h), and
 * `loom ckpt`. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "loom/status.h"
#include "loom/strategy.h"
#include "loom/tensor.h"
#include "model/dataloader.h"
#include "model/formats.h"
#include "model/model.h"
#include "runtime/log.h"
#include "train/ckpt.h"

#define STATE_MAGIC "LOOMSTAT"
#define META_MAGIC "LOOMMETA"
#define SHARD_MAGIC "LOOMSHRD"
/* 2 added the data loader's position (model/dataloader.h) after the header
 * of the consolidated file and of meta.loom; 1 is still read. */
#define FORMAT_VERSION 2u
#define FORMAT_OLDEST 1u

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

typedef struct record_disk {
    int32_t unit, tp_rank;
    uint64_t begin, count;
} record_disk;

static void to_disk(const loom_ckpt_header *h, const char *magic, state_disk *d)
{
    memset(d, 0, sizeof *d);
    memcpy(d->magic, magic, 8);
    d->version = h->data_position ? FORMAT_VERSION : FORMAT_OLDEST;
    d->dtype = (uint32_t)h->dtype;
    const loom_gpt2_shape *s = &h->shape;
    int32_t shape[6] = {s->max_seq, s->vocab, s->layers, s->heads, s->channels, s->padded_vocab};
    memcpy(d->shape, shape, sizeof shape);
    d->step = h->step;
    d->good_steps = h->good_steps;
    d->data = h->data_position ? (uint64_t)h->data_position_bytes : h->data_offset;
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
}

static int write_all(FILE *f, const void *p, size_t bytes)
{
    return bytes == 0 || fwrite(p, 1, bytes, f) == bytes;
}

static int read_all(FILE *f, void *p, size_t bytes) { return bytes == 0 || fread(p, 1, bytes, f) == bytes; }

static int known_version(uint32_t version)
{
    return version >= FORMAT_OLDEST && version <= FORMAT_VERSION;
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

/* ---- sharded: writing ---- */

int loom_ckpt_shard_open(loom_ckpt_shard_writer *w, const char *dir, int rank)
{
    memset(w, 0, sizeof *w);
    snprintf(w->path, sizeof w->path, "%.4000s/shard-%d.loom", dir, rank);
    shard_disk h = {SHARD_MAGIC, FORMAT_VERSION, 0};
    if (!(w->f = fopen(w->path, "wb")) || !write_all(w->f, &h, sizeof h))
        return loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot write '%s': %s", w->path,
                         strerror(errno));
    return LOOM_OK;
}

int loom_ckpt_shard_put(loom_ckpt_shard_writer *w, int unit, int tp_rank, size_t begin, size_t count,
                   const float *params, const float *m, const float *v)
{
    record_disk r = {unit, tp_rank, begin, count};
    size_t bytes = count * sizeof(float);
    if (!write_all(w->f, &r, sizeof r) || !write_all(w->f, params, bytes) ||
        !write_all(w->f, m, bytes) || !write_all(w->f, v, bytes))
        return loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot write '%s': %s", w->path,
                         strerror(errno));
    w->records++;
    return LOOM_OK;
}

int loom_ckpt_shard_close(loom_ckpt_shard_writer *w)
{
    shard_disk h = {SHARD_MAGIC, FORMAT_VERSION, w->records};
    int ok = w->f && fseek(w->f, 0, SEEK_SET) == 0 && write_all(w->f, &h, sizeof h);
    if (w->f && fclose(w->f) != 0)
        ok = 0;
    w->f = NULL;
    return ok ? LOOM_OK
              : loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot write '%s': %s", w->path,
                          strerror(errno));
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
    FILE *f = fopen(path, "wb");
    int ok = f && write_all(f, &md, sizeof md) &&
             (!h->data_position || write_all(f, h->data_position, h->data_position_bytes));
    for (int u = 0; ok && u < h->nunits; u++) {
        uint32_t nt = (uint32_t)units[u].ntensors;
        ok = write_all(f, &nt, sizeof nt);
        for (size_t i = 0; ok && i < (size_t)tp * nt; i++) {
            int64_t pair[2] = {tp_shards[u][i].begin, tp_shards[u][i].count};
            ok = write_all(f, pair, sizeof pair);
        }
    }
    if (f && fclose(f) != 0)
        ok = 0;
    return ok ? LOOM_OK
              : loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot write '%s': %s", path,
                          strerror(errno));
}

/* ---- consolidated: writing ---- */

int loom_state_open(loom_state_writer *w, const char *path, const loom_ckpt_header *h)
{
    memset(w, 0, sizeof *w);
    snprintf(w->path, sizeof w->path, "%.4000s", path);
    snprintf(w->tmp, sizeof w->tmp, "%.4000s.tmp", path);
    state_disk d;
    to_disk(h, STATE_MAGIC, &d);
    if (!(w->f = fopen(w->tmp, "wb")) || !write_all(w->f, &d, sizeof d) ||
        (h->data_position && !write_all(w->f, h->data_position, h->data_position_bytes)))
        return loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot write '%s': %s", w->tmp,
                         strerror(errno));
    return LOOM_OK;
}

int loom_state_put(loom_state_writer *w, const float *params, const float *m, const float *v,
                   size_t n)
{
    size_t bytes = n * sizeof(float);
    if (!write_all(w->f, params, bytes) || !write_all(w->f, m, bytes) || !write_all(w->f, v, bytes))
        return loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot write '%s': %s", w->tmp,
                         strerror(errno));
    return LOOM_OK;
}

int loom_state_close(loom_state_writer *w, int ok)
{
    if (w->f && fclose(w->f) != 0)
        ok = 0;
    w->f = NULL;
    if (ok && rename(w->tmp, w->path) == 0)
        return LOOM_OK;
    int err = errno;
    remove(w->tmp);
    return ok ? loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot write '%s': %s", w->path,
                          strerror(err))
              : LOOM_ERR_INVALID;
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
    unsigned char *data_position; /* h.data_position's bytes */
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
};

static int bad_file(const loom_ckpt *ck, const char *what)
{
    return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': %s", ck->path, what);
}

/* The data position after a header, from f (of size bytes in all). */
static int read_data_position(loom_ckpt *ck, FILE *f, long long size)
{
    size_t n = ck->h.data_position_bytes;
    if (n == 0)
        return LOOM_OK;
    if ((long long)n > size)
        return bad_file(ck, "its data position is longer than the file");
    if (!(ck->data_position = malloc(n)))
        return loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    if (!read_all(f, ck->data_position, n))
        return bad_file(ck, "truncated in its data position");
    ck->h.data_position = ck->data_position;
    return LOOM_OK;
}

static long long file_size(FILE *f)
{
    struct stat st;
    return fstat(fileno(f), &st) == 0 ? (long long)st.st_size : 0;
}

static int open_consolidated(loom_ckpt *ck)
{
    state_disk d;
    if (!(ck->state = fopen(ck->path, "rb")))
        return loom_fail(LOOM_ERR_NOT_FOUND, "checkpoint '%s': %s", ck->path, strerror(errno));
    if (!read_all(ck->state, &d, sizeof d) || memcmp(d.magic, STATE_MAGIC, 8) != 0)
        return bad_file(ck, "not a loom checkpoint (train.checkpoint_every writes a directory of "
                            "shards, `loom ckpt consolidate` one file)");
    if (!known_version(d.version))
        return loom_fail(LOOM_ERR_NOT_SUPPORTED, "checkpoint '%s': format %u; this loom reads "
                         "formats %u to %u", ck->path, d.version, FORMAT_OLDEST, FORMAT_VERSION);
    from_disk(&d, &ck->h);
    ck->units_at = (long)(sizeof d + ck->h.data_position_bytes);
    return read_data_position(ck, ck->state, file_size(ck->state));
}

static int index_shard_file(loom_ckpt *ck, int file, const char *path)
{
    FILE *f = ck->f[file] = fopen(path, "rb");
    shard_disk h;
    if (!f)
        return loom_fail(LOOM_ERR_NOT_FOUND, "checkpoint '%s': %s: %s (incomplete checkpoint?)",
                         ck->path, path, strerror(errno));
    if (!read_all(f, &h, sizeof h) || memcmp(h.magic, SHARD_MAGIC, 8) != 0 ||
        !known_version(h.version))
        return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': %s is not a loom shard", ck->path,
                         path);
    shard_record *grown = realloc(ck->rec, ((size_t)ck->nrec + h.records) * sizeof *grown);
    if (!grown)
        return loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    ck->rec = grown;
    for (uint32_t i = 0; i < h.records; i++) {
        record_disk r;
        if (!read_all(f, &r, sizeof r))
            return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': %s is truncated", ck->path, path);
        if (r.unit < 0 || r.unit >= ck->h.nunits || r.tp_rank < 0 || r.tp_rank >= ck->tp)
            return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': %s has a record of unit %d, "
                             "tp rank %d, outside the checkpoint's %d units and %d tp ranks",
                             ck->path, path, r.unit, r.tp_rank, ck->h.nunits, ck->tp);
        shard_record *s = &ck->rec[ck->nrec++];
        *s = (shard_record){r.unit, r.tp_rank, file, r.begin, r.count, ftell(f)};
        if (fseek(f, (long)(3 * r.count * sizeof(float)), SEEK_CUR) != 0)
            return loom_fail(LOOM_ERR_INVALID, "checkpoint '%s': %s is truncated", ck->path, path);
    }
    return LOOM_OK;
}

static int open_sharded(loom_ckpt *ck)
{
    char path[4200];
    snprintf(path, sizeof path, "%.4000s/meta.loom", ck->path);
    FILE *f = fopen(path, "rb");
    if (!f)
        return loom_fail(LOOM_ERR_NOT_FOUND, "checkpoint '%s': no meta.loom in it (a checkpoint "
                         "still being written, or not one)", ck->path);
    meta_disk md;
    int rc = LOOM_OK;
    if (!read_all(f, &md, sizeof md) || memcmp(md.state.magic, META_MAGIC, 8) != 0 ||
        md.tp < 1 || md.files < 1) {
        fclose(f);
        return bad_file(ck, "meta.loom is not a loom checkpoint's");
    }
    if (!known_version(md.state.version)) {
        fclose(f);
        return loom_fail(LOOM_ERR_NOT_SUPPORTED, "checkpoint '%s': format %u; this loom reads "
                         "formats %u to %u", ck->path, md.state.version, FORMAT_OLDEST,
                         FORMAT_VERSION);
    }
    from_disk(&md.state, &ck->h);
    if ((rc = read_data_position(ck, f, file_size(f))) != LOOM_OK) {
        fclose(f);
        return rc;
    }
    ck->tp = (int)md.tp;
    ck->files = (int)md.files;
    memcpy(ck->strategy, md.strategy, sizeof ck->strategy);
    ck->strategy[sizeof ck->strategy - 1] = '\0';
    size_t nu = (size_t)ck->h.nunits;
    ck->ntensors = calloc(nu, sizeof *ck->ntensors);
    ck->shards = calloc(nu, sizeof *ck->shards);
    ck->f = calloc((size_t)ck->files, sizeof *ck->f);
    if (!ck->ntensors || !ck->shards || !ck->f)
        rc = loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    for (size_t u = 0; rc == LOOM_OK && u < nu; u++) {
        uint32_t nt = 0;
        if (!read_all(f, &nt, sizeof nt) || nt > 64) {
            rc = bad_file(ck, "meta.loom is truncated");
            break;
        }
        ck->ntensors[u] = (int)nt;
        size_t n = (size_t)ck->tp * nt;
        if (!(ck->shards[u] = calloc(n ? n : 1, sizeof **ck->shards))) {
            rc = loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
            break;
        }
        for (size_t i = 0; i < n; i++) {
            int64_t pair[2];
            if (!read_all(f, pair, sizeof pair)) {
                rc = bad_file(ck, "meta.loom is truncated");
                break;
            }
            ck->shards[u][i] = (loom_param_shard){pair[0], pair[1]};
        }
    }
    fclose(f);
    for (int i = 0; rc == LOOM_OK && i < ck->files; i++) {
        snprintf(path, sizeof path, "%.4000s/shard-%d.loom", ck->path, i);
        rc = index_shard_file(ck, i, path);
    }
    return rc;
}

int loom_ckpt_open(const char *path, loom_ckpt **out)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return loom_fail(LOOM_ERR_NOT_FOUND, "checkpoint '%s': %s", path, strerror(errno));
    loom_ckpt *ck = calloc(1, sizeof *ck);
    if (!ck)
        return loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    snprintf(ck->path, sizeof ck->path, "%s", path);
    ck->sharded = S_ISDIR(st.st_mode);
    int rc = ck->sharded ? open_sharded(ck) : open_consolidated(ck);
    if (rc != LOOM_OK) {
        loom_ckpt_close(ck);
        return rc;
    }
    *out = ck;
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
    free(ck->data_position);
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
            return bad_file(ck, "truncated");
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
                rc = bad_file(ck, "a shard file is truncated");
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
    if (ck->ntensors[unit] != u->ntensors)
        return bad_file(ck, "its units do not match the model's");
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
    int rc = LOOM_OK;
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
    fprintf(f, "  model     gpt2 layers %d, heads %d, channels %d, vocab %d (padded %d), max_seq %d: "
           "%zu parameters in %d units\n",
           h->shape.layers, h->shape.heads, h->shape.channels, h->shape.vocab,
           h->shape.padded_vocab, h->shape.max_seq, params, h->nunits);
    fprintf(f, "  training  after step %lld, precision %s, loss scale %g\n", (long long)h->step,
            loom_dtype_name(h->dtype), h->loss_scale);
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
    if (!w.f)
        return rc;
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
