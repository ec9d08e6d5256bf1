/* loom train — Checkpoints: sharded resumable state (each rank writes what it owns),
 * loading it back at any mesh, and llm.c weights (--save). */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "loom/status.h"
#include "runtime/bootstrap.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "train/ckpt_format.h"
#include "train/trainer.h"

/* ---- checkpoints: llm.c's weights (--save) and loom's resumable state ---- */

/* h->data_position is malloc'd: the caller frees it. */
static int fill_header(const trainer *t, loom_ckpt_header *h)
{
    memset(h, 0, sizeof *h);
    h->dtype = t->job.dtype;
    h->shape = t->job.shape;
    h->step = t->job.step;
    h->good_steps = t->scaler.good_steps;
    h->loss_scale = t->scaler.scale;
    h->nunits = t->job.nunits;
    h->run_id = t->ckpt.run_id;
    h->lineage = t->ckpt.lineage;
    unsigned char *position = NULL;
    int rc = loom_dataloader_save(&t->data.loader, &position, &h->data_position_bytes);
    h->data_position = position;
    return rc;
}

/* After each phase of a checkpoint (and of a resume) the ranks agree on how
 * it went: an all-reduce of the first failing rank over the world, whose
 * reason the others read from the bootstrap store. So no rank waits out
 * comm.timeout_s on one that gave up, and every rank fails with one line
 * naming the first failing rank and its reason; the others exit as
 * followers (LOOM_ERR_REMOTE). failed: "failed the checkpoint DIR".
 * With ready, the same all-reduce also tells whether *ready holds on every
 * rank (an async checkpoint: every rank's write has ended). */
static int agree_ready(trainer *t, const char *failed, int rc, int *ready)
{
    if (t->job.world == 1)
        return rc;
    char reason[1024], key[96];
    snprintf(reason, sizeof reason, "%s", rc == LOOM_OK ? "" : loom_last_error());
    int64_t round = t->ckpt.agreements++;
    loom_store *store = loom_runtime_store(t->job.rt);
    if (rc != LOOM_OK && store) {
        snprintf(key, sizeof key, "agree/%lld/%d", (long long)round, t->job.rank);
        loom_store_put(store, key, reason, strlen(reason) + 1);
    }
    /* the first failing rank, and whether every rank is ready (ready) */
    double agreed[2] = {rc == LOOM_OK ? (double)t->job.world : (double)t->job.rank,
                        ready && *ready};
    int comm_rc =
        trainer_group_allreduce(t->job.mesh->world, agreed, ready ? 2 : 1, LOOM_F64, LOOM_MIN);
    if (comm_rc != LOOM_OK)
        return comm_rc;
    if (ready)
        *ready = agreed[1] > 0;
    int rank = (int)agreed[0];
    if (rank >= t->job.world)
        return LOOM_OK;
    if (rank != t->job.rank) {
        /* This rank is named a follower even when it failed too (a disk
         * that the first filled): the launcher blames the first rank, and
         * this rank's own reason goes to its log. */
        if (rc != LOOM_OK)
            loom_log(LOOM_LOG_WARN, "%s (after rank %d failed)", reason, rank);
        rc = LOOM_OK;
        size_t len = 0;
        snprintf(key, sizeof key, "agree/%lld/%d", (long long)round, rank);
        if (!store || loom_store_get(store, key, reason, sizeof reason, &len,
                                     loom_runtime_timeout(t->job.rt)) != LOOM_OK)
            snprintf(reason, sizeof reason, "(its output says why)");
        reason[sizeof reason - 1] = '\0';
    }
    return loom_fail(rc != LOOM_OK ? rc : LOOM_ERR_REMOTE, "rank %d %s: %s", rank, failed, reason);
}

int trainer_agree(trainer *t, const char *failed, int rc)
{
    return agree_ready(t, failed, rc, NULL);
}

int trainer_choose_run_id(trainer *t)
{
    uint64_t id = 0;
    if (t->job.rank == 0 && getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id)
        id = loom_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL);
    if (t->job.world > 1) {
        /* two exact halves: a double holds 32 bits without loss */
        double halves[2] = {(double)(id >> 32), (double)(id & 0xffffffffu)};
        int rc = trainer_group_allreduce(t->job.mesh->world, halves, 2, LOOM_F64, LOOM_SUM);
        if (rc != LOOM_OK)
            return rc;
        id = (uint64_t)halves[0] << 32 | (uint64_t)halves[1];
    }
    t->ckpt.run_id = id;
    return LOOM_OK;
}

/* ---- what a rank writes of a checkpoint: a snapshot, then its shard file ---- */

/* One record of a shard file: elements [begin, begin + count) of tp rank
 * tp_rank's flat buffer of a unit; its params, m and v lie one after the
 * other at offset (floats) in the snapshot's data. */
typedef struct ckpt_record {
    int unit, tp_rank;
    size_t begin, count, offset;
} ckpt_record;

/* The records of this rank's shard file, copied out of the strategy at the
 * checkpoint step. A synchronous checkpoint holds one unit at a time and
 * writes it at once; train.checkpoint_async holds them all while the
 * writer thread writes them. */
/* One buffer of a dp rank's own state, its bytes at offset in the
 * replica snapshot's data. */
typedef struct replica_entry {
    int unit;
    char label[LOOM_CKPT_REPLICA_LABEL];
    size_t bytes, offset;
} replica_entry;

/* This rank's replica records (data_replica_state), copied to the host at
 * the checkpoint step. */
typedef struct replica_snapshot {
    unsigned char *data;
    size_t used;
    replica_entry *entries;
    int count, dp_rank, dp_size;
} replica_snapshot;

typedef struct ckpt_snapshot {
    float *data;
    size_t capacity, used; /* floats */
    ckpt_record *records;
    int nrecords;
    replica_snapshot replicas;
} ckpt_snapshot;

static void free_replicas(replica_snapshot *s)
{
    free(s->data);
    free(s->entries);
    memset(s, 0, sizeof *s);
}

/* The strategy's replica buffers of a unit (*out malloc'd, *count of them). */
static int replica_buffers(trainer *t, loom_unit *u, loom_replica_buffer **out, int *count)
{
    const char *name = t->data_axis.plugin->header->name;
    *out = NULL;
    *count = 0;
    int rc = t->data_axis.ops->data_replica_state(t->data_axis.strategy, u, NULL, count);
    if (rc != LOOM_OK || *count == 0)
        return rc;
    if (*count < 0)
        return loom_fail(LOOM_ERR_INTERNAL, "strategy %s: data_replica_state gave %s a count of "
                         "%d buffers", name, u->name, *count);
    int room = *count;
    if (!(*out = calloc((size_t)room, sizeof **out)))
        return loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    rc = t->data_axis.ops->data_replica_state(t->data_axis.strategy, u, *out, count);
    if (rc == LOOM_OK && (*count < 0 || *count > room))
        rc = loom_fail(LOOM_ERR_INTERNAL, "strategy %s: data_replica_state gave %s %d buffers "
                       "after saying %d", name, u->name, *count, room);
    for (int b = 0; rc == LOOM_OK && b < *count; b++)
        if (!(*out)[b].name || strlen((*out)[b].name) >= LOOM_CKPT_REPLICA_LABEL ||
            ((*out)[b].bytes && !(*out)[b].data))
            rc = loom_fail(LOOM_ERR_INTERNAL, "strategy %s: data_replica_state's buffer %d of %s "
                           "has no label, a label of %d characters or more, or no data", name, b,
                           u->name, LOOM_CKPT_REPLICA_LABEL);
    if (rc != LOOM_OK) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

/* Copies this rank's replica buffers of every unit it holds to the host;
 * local to the rank (no collective). */
static int snapshot_replicas(trainer *t, replica_snapshot *s)
{
    free_replicas(s);
    s->dp_rank = t->job.mesh->coords[LOOM_AXIS_DP];
    s->dp_size = t->job.mesh->sizes[LOOM_AXIS_DP];
    if (!t->data_axis.ops->data_replica_state)
        return LOOM_OK;
    int rc = LOOM_OK;
    for (int i = 0; rc == LOOM_OK && i < t->job.nunits; i++) {
        if (!holds(t, i))
            continue;
        loom_replica_buffer *buffers;
        int count;
        if ((rc = replica_buffers(t, dp_unit(t, i), &buffers, &count)) != LOOM_OK)
            break;
        size_t bytes = 0;
        for (int b = 0; b < count; b++)
            bytes += buffers[b].bytes;
        unsigned char *data = realloc(s->data, s->used + bytes + 1);
        replica_entry *entries = realloc(s->entries, ((size_t)s->count + count + 1) *
                                                         sizeof *entries);
        s->data = data ? data : s->data;
        s->entries = entries ? entries : s->entries;
        if (!data || !entries)
            rc = loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
        for (int b = 0; rc == LOOM_OK && b < count; b++) {
            replica_entry *e = &s->entries[s->count++];
            *e = (replica_entry){i, "", buffers[b].bytes, s->used};
            snprintf(e->label, sizeof e->label, "%s", buffers[b].name);
            if (buffers[b].bytes)
                rc = BACKEND(t, to_host, s->data + s->used, buffers[b].data, buffers[b].bytes);
            s->used += buffers[b].bytes;
        }
        free(buffers);
    }
    return rc;
}

static int write_replicas(loom_ckpt_shard_writer *w, const replica_snapshot *s)
{
    int rc = LOOM_OK;
    for (int e = 0; rc == LOOM_OK && e < s->count; e++)
        rc = loom_ckpt_shard_put_replica(w, s->entries[e].unit, s->dp_rank, s->dp_size,
                                         s->entries[e].label, s->data + s->entries[e].offset,
                                         s->entries[e].bytes);
    return rc;
}

/* Copies what this rank writes of unit i into the snapshot: a record, or
 * nothing when another rank writes it. ok = 0 after a failure:
 * data_get_state is still called, being collective, so that no other rank
 * waits for this one. */
static int snapshot_unit(trainer *t, ckpt_snapshot *s, int i, int ok)
{
    loom_unit *u = dp_unit(t, i);
    int tp_rank = t->job.mesh->coords[LOOM_AXIS_TP], rc;
    size_t n = u->numel, begin = 0, count = n;
    float *buf = s->data + s->used;
    if (t->data_axis.ops->data_get_shard) {
        if (!ok)
            return LOOM_OK;
        if ((rc = t->data_axis.ops->data_get_shard(t->data_axis.strategy, u, &begin, &count, NULL,
                                                   NULL, NULL)) != LOOM_OK)
            return rc;
        if (begin + count > n)
            return loom_fail(LOOM_ERR_INTERNAL, "strategy %s: data_get_shard gave %s the range "
                             "%zu+%zu of %zu elements", t->data_axis.plugin->header->name, u->name,
                             begin, count, n);
        if (s->used + 3 * count > s->capacity)
            return loom_fail(LOOM_ERR_INTERNAL, "checkpoint: strategy %s gave %s %zu elements, "
                             "more than it had at the start (the snapshot holds %zu floats)",
                             t->data_axis.plugin->header->name, u->name, count, s->capacity);
        rc = t->data_axis.ops->data_get_shard(t->data_axis.strategy, u, &begin, &count, buf,
                                              buf + count, buf + 2 * count);
    } else {
        if (s->used + 3 * n > s->capacity)
            return loom_fail(LOOM_ERR_INTERNAL, "checkpoint: the snapshot of %zu floats has no "
                             "room for %s", s->capacity, u->name);
        /* data_get_state is collective on the dp group: every rank calls it */
        rc = t->data_axis.ops->data_get_state(t->data_axis.strategy, u, buf, buf + n, buf + 2 * n);
        if (t->job.mesh->coords[LOOM_AXIS_DP] != 0)
            return rc;
    }
    if (rc != LOOM_OK || count == 0 || !ok) /* owns nothing of it: another rank writes it */
        return rc;
    s->records[s->nrecords++] = (ckpt_record){i, tp_rank, begin, count, s->used};
    s->used += 3 * count;
    return LOOM_OK;
}

/* Floats a snapshot of every unit needs on this rank (all: the records
 * kept, and room for the last call); only the ranges are asked, no state
 * is copied. */
static int snapshot_floats(trainer *t, size_t *floats)
{
    size_t kept = 0, room = 0;
    int writes = t->job.mesh->coords[LOOM_AXIS_SP] == 0;
    for (int i = 0; writes && i < t->job.nunits; i++) {
        if (!holds(t, i))
            continue;
        loom_unit *u = dp_unit(t, i);
        size_t begin = 0, count = u->numel, call = u->numel;
        if (t->data_axis.ops->data_get_shard) {
            int rc = t->data_axis.ops->data_get_shard(t->data_axis.strategy, u, &begin, &count,
                                                      NULL, NULL, NULL);
            if (rc != LOOM_OK)
                return rc;
            call = count;
        } else if (t->job.mesh->coords[LOOM_AXIS_DP] != 0) {
            count = 0;
        }
        room = kept + 3 * call > room ? kept + 3 * call : room;
        kept += 3 * count;
    }
    *floats = room;
    return LOOM_OK;
}

/* The snapshot's records to the shard file: the one writer, run by the
 * training thread (synchronous) or by the writer thread (async). stop:
 * when it becomes non-zero, the write gives up between records. */
static int write_records(loom_ckpt_shard_writer *w, const ckpt_snapshot *s,
                         const atomic_int *stop)
{
    for (int r = 0; r < s->nrecords; r++) {
        if (stop && atomic_load(stop))
            return loom_fail(LOOM_ERR_INVALID, "checkpoint: the write of %s was abandoned",
                             w->file.path);
        const ckpt_record *rec = &s->records[r];
        const float *p = s->data + rec->offset;
        int rc = loom_ckpt_shard_put(w, rec->unit, rec->tp_rank, rec->begin, rec->count, p,
                                     p + rec->count, p + 2 * rec->count);
        if (rc != LOOM_OK)
            return rc;
    }
    return LOOM_OK;
}

/* A directory some job left behind (PATH.tmp of an unfinished checkpoint,
 * or PATH.old of a replaced one) goes, said in one line unless this job
 * left it. */
static int remove_leftover(const trainer *t, const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return LOOM_OK;
    uint64_t run_id = 0;
    int64_t step = 0;
    int stamped = loom_ckpt_dir_stamp(path, &run_id, &step) == LOOM_OK;
    if (!stamped || run_id != t->ckpt.run_id) {
        char who[64] = "a job that stopped";
        if (stamped)
            snprintf(who, sizeof who, "run %016llx, a job that stopped",
                     (unsigned long long)run_id);
        loom_log(LOOM_LOG_INFO, "checkpoint: removing %s, left unfinished by %s", path, who);
    }
    return loom_ckpt_remove_dir(path);
}

/* Rank 0's part at the end: DIR.tmp becomes DIR, whatever DIR held (a
 * checkpoint of the same step saved by a mesh of any size). Every name is
 * fsync'd, so after a power loss DIR is the old checkpoint or the new one. */
static int install(const trainer *t, const char *tmp, const char *dir)
{
    char parent[4200], old[4210];
    const char *slash = strrchr(dir, '/');
    snprintf(parent, sizeof parent, "%.*s", slash ? (int)(slash - dir) : 1, slash ? dir : ".");
    int rc = loom_ckpt_sync_dir(tmp);
    if (rc != LOOM_OK)
        return rc;
    struct stat st;
    if (lstat(dir, &st) != 0) {
        if (rename(tmp, dir) != 0)
            return loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot move '%s' to '%s': %s", tmp,
                             dir, strerror(errno));
        return loom_ckpt_sync_dir(parent);
    }
    /* The step exists: swap the two in one step, so that DIR is whole at
     * every moment, then remove the old one (now at DIR.tmp). Where the file
     * system cannot swap, DIR goes to DIR.old first. */
    const char *stale = tmp;
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) != 0) {
        if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
            return loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot replace '%s' by '%s': %s", dir,
                             tmp, strerror(errno));
        snprintf(old, sizeof old, "%s.old", dir);
        stale = old;
        if ((rc = remove_leftover(t, old)) != LOOM_OK)
            return rc;
        if (rename(dir, old) != 0)
            return loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot replace '%s' by '%s': %s", dir,
                             tmp, strerror(errno));
        if (rename(tmp, dir) != 0) {
            int err = errno;
            /* the old checkpoint back in its place: the caller removes tmp */
            if (rename(old, dir) != 0)
                loom_log(LOOM_LOG_WARN, "checkpoint: %s is missing; its checkpoint is in %s, and "
                         "the next job puts it back", dir, old);
            return loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot replace '%s' by '%s': %s", dir,
                             tmp, strerror(err));
        }
    }
    if ((rc = loom_ckpt_sync_dir(parent)) != LOOM_OK)
        return rc;
    if (loom_ckpt_remove_dir(stale) != LOOM_OK)
        loom_log(LOOM_LOG_WARN, "%s is in place; the checkpoint it replaced stays in %s: %s", dir,
                 stale, loom_last_error());
    return LOOM_OK;
}

/* A failed checkpoint leaves no DIR.tmp to fill the disk; the failure's
 * own line stands. */
static void remove_failed(const char *tmp)
{
    char reason[1024];
    snprintf(reason, sizeof reason, "%s", loom_last_error());
    if (loom_ckpt_remove_dir(tmp) != LOOM_OK)
        loom_log(LOOM_LOG_WARN, "%s", loom_last_error());
    loom_fail(LOOM_ERR_INVALID, "%s", reason);
}

/* One checkpoint being saved, and what its end needs, taken at the
 * checkpoint step: on rank 0 the header, as training stood then. */
typedef struct ckpt_save {
    char dir[4200], tmp[4200], failed[4300];
    int64_t step;
    loom_ckpt_header header; /* rank 0 */
} ckpt_save;

static void end_save(ckpt_save *s)
{
    free((void *)(uintptr_t)s->header.data_position);
    s->header.data_position = NULL;
}

/* The first phase of every checkpoint: rank 0 makes DIR.tmp (removing a
 * stale one) and notes where training stands; the ranks agree. */
static int begin_save(trainer *t, ckpt_save *s, const char *dir)
{
    memset(s, 0, sizeof *s);
    snprintf(s->dir, sizeof s->dir, "%.4000s", dir);
    snprintf(s->tmp, sizeof s->tmp, "%.4000s.tmp", dir);
    snprintf(s->failed, sizeof s->failed, "failed the checkpoint %.4000s", dir);
    s->step = t->job.step;
    int rc = LOOM_OK;
    if (t->job.rank == 0 && (rc = fill_header(t, &s->header)) == LOOM_OK &&
        (rc = remove_leftover(t, s->tmp)) == LOOM_OK && mkdir(s->tmp, 0777) != 0)
        rc = loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot create '%s': %s", s->tmp,
                       strerror(errno));
    if ((rc = trainer_agree(t, s->failed, rc)) != LOOM_OK)
        end_save(s);
    return rc;
}

/* After every rank's shard file has ended (rc: how this rank's went): the
 * ranks agree; rank 0 adds meta.loom and moves DIR.tmp into place, and the
 * ranks agree again. A failed checkpoint leaves no DIR.tmp behind. */
static int finish_save(trainer *t, const ckpt_save *s, int rc)
{
    if ((rc = trainer_agree(t, s->failed, rc)) != LOOM_OK) {
        if (t->job.rank == 0)
            remove_failed(s->tmp);
        return rc;
    }
    if (t->job.rank == 0) {
        const loom_param_shard **shards = calloc((size_t)t->job.nunits, sizeof *shards);
        for (int i = 0; shards && i < t->job.nunits; i++)
            shards[i] =
                t->axes.tp_shards ? t->axes.tp_shards[i] : loom_model_shards(t->job.model, i);
        rc = shards ? loom_ckpt_write_meta(s->tmp, &s->header, t->job.mesh->sizes[LOOM_AXIS_TP],
                                           t->job.world, t->data_axis.plugin->header->name,
                                           t->job.units, shards)
                    : loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
        free(shards);
        if (rc == LOOM_OK)
            rc = install(t, s->tmp, s->dir);
        if (rc != LOOM_OK)
            remove_failed(s->tmp);
    }
    return trainer_agree(t, s->failed, rc);
}

static int can_save(const trainer *t)
{
    if (!t->data_axis.ops->data_get_shard && !t->data_axis.ops->data_get_state)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED, "strategy %s can save no checkpoint (it "
                         "implements neither data_get_shard nor data_get_state)",
                         t->data_axis.plugin->header->name);
    return LOOM_OK;
}

/* A sharded checkpoint (ckpt_format.h): every rank writes its own state into
 * DIR.tmp, then rank 0 adds meta.loom and moves it into place, so DIR is
 * always a whole checkpoint. Ranks that repeat another's state (the
 * sequence axis) write an empty shard file. After each phase the ranks
 * agree (trainer_agree), so a failure on any rank fails every rank at once; a
 * failed checkpoint leaves no DIR.tmp behind. Here the snapshot holds one
 * unit at a time, written at once. */
int trainer_save_sharded(trainer *t, const char *dir)
{
    int rc = can_save(t);
    if (rc != LOOM_OK)
        return rc;
    ckpt_save s;
    if ((rc = begin_save(t, &s, dir)) != LOOM_OK)
        return rc;
    size_t biggest = 0;
    for (int i = 0; i < t->job.nunits; i++)
        biggest = t->job.units[i].numel > biggest ? t->job.units[i].numel : biggest;
    ckpt_record record;
    ckpt_snapshot snap = {malloc(3 * biggest * sizeof(float) + 1), 3 * biggest, 0, &record, 0, {0}};
    loom_ckpt_shard_writer w;
    memset(&w, 0, sizeof w);
    if (!snap.data)
        rc = loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    if (rc == LOOM_OK)
        rc = loom_ckpt_shard_open(&w, s.tmp, t->job.rank, t->ckpt.run_id, s.step);
    int writes = t->job.mesh->coords[LOOM_AXIS_SP] == 0;
    for (int i = 0; snap.data && writes && i < t->job.nunits; i++)
        if (holds(t, i)) {
            snap.used = 0;
            snap.nrecords = 0;
            int unit_rc = snapshot_unit(t, &snap, i, rc == LOOM_OK);
            rc = rc == LOOM_OK ? unit_rc : rc;
            if (rc == LOOM_OK)
                rc = write_records(&w, &snap, NULL);
        }
    if (rc == LOOM_OK)
        rc = snapshot_replicas(t, &snap.replicas);
    if (rc == LOOM_OK)
        rc = write_replicas(&w, &snap.replicas);
    int closed = loom_ckpt_shard_close(&w, rc == LOOM_OK);
    rc = rc == LOOM_OK ? closed : rc;
    free_replicas(&snap.replicas);
    free(snap.data);
    rc = finish_save(t, &s, rc);
    end_save(&s);
    return rc;
}

/* train.keep_checkpoints: the last keep complete checkpoints up to step
 * stay. Those of later steps (a run resumed from an earlier one finds
 * them) are left alone until this run saves those steps again. */
static void prune_checkpoints(const char *parent, int64_t step, int64_t keep)
{
    DIR *d = opendir(parent);
    if (!d)
        return;
    int64_t *steps = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long found;
        int used = 0;
        if (sscanf(e->d_name, "step-%lld%n", &found, &used) != 1 || e->d_name[used] != '\0' ||
            found < 0 || found > step)
            continue;
        char meta[4400];
        snprintf(meta, sizeof meta, "%.4000s/%s/meta.loom", parent, e->d_name);
        if (access(meta, F_OK) != 0) /* not a complete checkpoint: not counted, not touched */
            continue;
        if (n == cap) {
            int64_t *grown = realloc(steps, (cap = cap ? 2 * cap : 16) * sizeof *steps);
            if (!grown)
                break;
            steps = grown;
        }
        steps[n++] = found;
    }
    closedir(d);
    for (size_t i = 0; i < n; i++) {
        size_t newer = 0;
        for (size_t j = 0; j < n; j++)
            newer += steps[j] > steps[i];
        if (newer < (size_t)keep)
            continue;
        /* out of the way in one rename first: a job killed while the files
         * go leaves a step-N.del the next job removes, never a step-N that
         * looks like a checkpoint and does not verify */
        char path[4200], gone[4210];
        snprintf(path, sizeof path, "%.4000s/step-%lld", parent, (long long)steps[i]);
        snprintf(gone, sizeof gone, "%s.del", path);
        if (rename(path, gone) != 0)
            loom_log(LOOM_LOG_WARN, "train.keep_checkpoints = %lld: cannot move '%s' away: %s",
                     (long long)keep, path, strerror(errno));
        else if (loom_ckpt_remove_dir(gone) != LOOM_OK)
            loom_log(LOOM_LOG_WARN, "train.keep_checkpoints = %lld: %s", (long long)keep,
                     loom_last_error());
    }
    free(steps);
}

/* Rank 0, once a checkpoint is in place. */
static void announce(const trainer *t, const char *parent, const ckpt_save *s, int64_t keep)
{
    if (t->job.rank != 0)
        return;
    printf("saved %s\n", s->dir);
    if (keep > 0)
        prune_checkpoints(parent, s->step, keep);
}

/* ---- train.checkpoint_async: the snapshot written by a thread ---- */

/* The snapshot (its memory kept for the whole run) and the checkpoint its
 * writer thread is writing, if one is pending. The thread does file I/O
 * only: every agreement, and every call into a strategy or a comm plugin,
 * stays on the training thread. */
struct ckpt_async {
    ckpt_snapshot snap;
    ckpt_save save;
    char parent[4200];
    int64_t keep;
    int pending; /* a checkpoint was started and has not ended */
    int started; /* its thread runs, or ended and is not yet joined */
    pthread_t thread;
    atomic_int done; /* the thread ended: rc and error are its outcome */
    atomic_int stop; /* the run gave up on the checkpoint: the thread stops between records */
    int rank;
    uint64_t run_id;
    int rc;
    char error[1024];
};

static void *write_in_background(void *arg)
{
    ckpt_async *a = arg;
    loom_ckpt_shard_writer w;
    int rc = loom_ckpt_shard_open(&w, a->save.tmp, a->rank, a->run_id, a->save.step);
    if (rc == LOOM_OK)
        rc = write_records(&w, &a->snap, &a->stop);
    if (rc == LOOM_OK)
        rc = write_replicas(&w, &a->snap.replicas);
    int closed = loom_ckpt_shard_close(&w, rc == LOOM_OK);
    rc = rc == LOOM_OK ? closed : rc;
    a->rc = rc;
    snprintf(a->error, sizeof a->error, "%s", rc == LOOM_OK ? "" : loom_last_error());
    atomic_store(&a->done, 1);
    return NULL;
}

int trainer_setup_async_checkpoints(trainer *t)
{
    int async = 0;
    loom_config_bool(t->job.cfg, "train.checkpoint_async", &async);
    if (!async || t->ckpt.every <= 0)
        return LOOM_OK;
    int rc = can_save(t);
    size_t floats = 0;
    ckpt_async *a = calloc(1, sizeof *a);
    void *data = NULL;
    if (rc == LOOM_OK && !a)
        rc = loom_fail(LOOM_ERR_NO_MEMORY, "train.checkpoint_async: out of memory");
    if (rc == LOOM_OK &&
        !(a->snap.records = calloc((size_t)t->job.nunits + 1, sizeof(ckpt_record))))
        rc = loom_fail(LOOM_ERR_NO_MEMORY, "train.checkpoint_async: out of memory");
    if (rc == LOOM_OK)
        rc = snapshot_floats(t, &floats);
    /* the snapshot's memory is the host's like the model state's, under
     * memory.host_limit; touched now, so that the first checkpoint step
     * pays no page faults */
    if (rc == LOOM_OK &&
        (rc = loom_mem_alloc(LOOM_TIER_HOST, LOOM_PURPOSE_OTHER, floats * sizeof(float),
                             &data)) == LOOM_OK) {
        memset(data, 0, floats * sizeof(float));
        a->snap.data = data;
        a->snap.capacity = floats;
        a->rank = t->job.rank;
        t->ckpt.async = a;
    } else if (a) {
        free(a->snap.records);
        free(a);
    }
    if ((rc = trainer_agree(t, "could not set up train.checkpoint_async", rc)) != LOOM_OK)
        return rc;
    double bytes = (double)floats * sizeof(float);
    if (t->job.world > 1 && (rc = trainer_group_allreduce(t->job.mesh->world, &bytes, 1, LOOM_F64,
                                                          LOOM_MAX)) != LOOM_OK)
        return rc;
    if (t->job.rank == 0) {
        char human[32];
        loom_mem_format((uint64_t)bytes, human, sizeof human);
        printf("train.checkpoint_async: the snapshot takes %s of host memory%s\n", human,
               t->job.world > 1 ? " on the rank that holds most" : "");
        fflush(stdout);
    }
    return LOOM_OK;
}

/* The training thread's part of an async checkpoint, at the checkpoint
 * step: DIR.tmp is made (agreed), the state copied into the snapshot, and
 * the thread started. A failure here is agreed at the next boundary, like
 * one of the thread's. */
static int start_async(trainer *t, const char *parent, int64_t keep)
{
    ckpt_async *a = t->ckpt.async;
    char dir[4200];
    snprintf(dir, sizeof dir, "%.4000s/step-%lld", parent, (long long)t->job.step);
    int rc = begin_save(t, &a->save, dir);
    if (rc != LOOM_OK)
        return rc;
    snprintf(a->parent, sizeof a->parent, "%s", parent);
    a->keep = keep;
    a->run_id = t->ckpt.run_id;
    a->snap.used = 0;
    a->snap.nrecords = 0;
    int writes = t->job.mesh->coords[LOOM_AXIS_SP] == 0;
    for (int i = 0; writes && i < t->job.nunits; i++)
        if (holds(t, i)) {
            int unit_rc = snapshot_unit(t, &a->snap, i, rc == LOOM_OK);
            rc = rc == LOOM_OK ? unit_rc : rc;
        }
    if (rc == LOOM_OK)
        rc = snapshot_replicas(t, &a->snap.replicas);
    atomic_store(&a->stop, 0);
    atomic_store(&a->done, 0);
    if (rc == LOOM_OK && pthread_create(&a->thread, NULL, write_in_background, a) != 0)
        rc = loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot start the writer thread: %s",
                       strerror(errno));
    a->started = rc == LOOM_OK;
    if (rc != LOOM_OK) {
        a->rc = rc;
        snprintf(a->error, sizeof a->error, "%s", loom_last_error());
        atomic_store(&a->done, 1);
    }
    a->pending = 1;
    return LOOM_OK;
}

static void join_writer(ckpt_async *a)
{
    if (a->started)
        pthread_join(a->thread, NULL);
    a->started = 0;
}

/* At a step boundary with a checkpoint pending: the ranks agree whether
 * every rank's write has ended (wait: each waits for its own first). When
 * all have, the checkpoint ends as a synchronous one does; a failure on
 * any rank fails every rank, and rank 0 removes DIR.tmp once every
 * writer has stopped. */
static int settle(trainer *t, int wait)
{
    ckpt_async *a = t->ckpt.async;
    if (!a || !a->pending)
        return LOOM_OK;
    if (wait)
        join_writer(a);
    int ended = atomic_load(&a->done), rc = LOOM_OK;
    if (ended && a->rc != LOOM_OK)
        rc = loom_fail(a->rc, "%s", a->error);
    if ((rc = agree_ready(t, a->save.failed, rc, &ended)) != LOOM_OK) {
        char reason[1024];
        snprintf(reason, sizeof reason, "%s", loom_last_error());
        atomic_store(&a->stop, 1);
        join_writer(a);
        trainer_agree(t, a->save.failed, LOOM_OK); /* every rank's writer has stopped */
        if (t->job.rank == 0 && loom_ckpt_remove_dir(a->save.tmp) != LOOM_OK)
            loom_log(LOOM_LOG_WARN, "%s", loom_last_error());
        a->pending = 0;
        end_save(&a->save);
        return loom_fail(rc, "%s", reason);
    }
    if (!ended)
        return LOOM_OK;
    join_writer(a);
    a->pending = 0;
    if ((rc = finish_save(t, &a->save, LOOM_OK)) == LOOM_OK)
        announce(t, a->parent, &a->save, a->keep);
    end_save(&a->save);
    return rc;
}

int trainer_checkpoint_poll(trainer *t) { return settle(t, 0); }

int trainer_checkpoint_wait(trainer *t) { return settle(t, 1); }

void trainer_checkpoint_abandon(trainer *t)
{
    ckpt_async *a = t->ckpt.async;
    if (!a)
        return;
    if (a->pending) {
        char reason[1024];
        snprintf(reason, sizeof reason, "%s", loom_last_error());
        atomic_store(&a->stop, 1);
        join_writer(a);
        /* the other ranks are not asked (they may be gone): rank 0 removes
         * what it finds, and what a slower rank writes after that goes
         * with the next job's start */
        if (t->job.rank == 0 && loom_ckpt_remove_dir(a->save.tmp) != LOOM_OK)
            loom_log(LOOM_LOG_WARN, "%s", loom_last_error());
        end_save(&a->save);
        loom_fail(LOOM_ERR_INVALID, "%s", reason);
    }
    loom_mem_free(a->snap.data);
    free(a->snap.records);
    free_replicas(&a->snap.replicas);
    free(a);
    t->ckpt.async = NULL;
}

int trainer_checkpoint(trainer *t, const char *parent, int64_t keep)
{
    if (t->ckpt.async) {
        /* at most one in flight: the previous ends first */
        int rc = settle(t, 1);
        return rc == LOOM_OK ? start_async(t, parent, keep) : rc;
    }
    char dir[4200];
    snprintf(dir, sizeof dir, "%.4000s/step-%lld", parent, (long long)t->job.step);
    ckpt_save s = {.step = t->job.step};
    snprintf(s.dir, sizeof s.dir, "%s", dir);
    int rc = trainer_save_sharded(t, dir);
    if (rc == LOOM_OK)
        announce(t, parent, &s, keep);
    return rc;
}

/* What a checkpoint or a sample leaves in train.checkpoint_dir while it
 * is written: step-N.tmp, step-N.old, sample-step-N(.tmp); and step-N.del,
 * a pruned checkpoint (train.keep_checkpoints) while its files go. */
static int is_leftover(const char *name)
{
    const char *p = name;
    int sample = strncmp(p, "sample-", 7) == 0;
    p += sample ? 7 : 0;
    if (strncmp(p, "step-", 5) != 0 || !isdigit((unsigned char)p[5]))
        return 0;
    for (p += 5; isdigit((unsigned char)*p); p++) {
    }
    return *p ? !strcmp(p, ".tmp") || !strcmp(p, ".old") || !strcmp(p, ".del") : sample;
}

/* A checkpoint whose every file is there and verifies. */
static int complete_checkpoint(const char *path)
{
    loom_ckpt *ck = NULL;
    int ok = loom_ckpt_open(path, &ck) == LOOM_OK;
    loom_ckpt_close(ck);
    return ok;
}

/* step-N of step-N.tmp or step-N.old (a checkpoint's leftovers, not a
 * sample's), in base; 0 for any other name. */
static int leftover_base(const char *dir, const char *name, char *base, size_t cap)
{
    size_t n = strlen(name);
    if (strncmp(name, "step-", 5) != 0 || n < 9 ||
        (strcmp(name + n - 4, ".tmp") != 0 && strcmp(name + n - 4, ".old") != 0))
        return 0;
    snprintf(base, cap, "%.4000s/%.*s", dir, (int)(n - 4), name);
    return 1;
}

/* Where a replacement stopped with step-N gone (between the two renames
 * of the fallback: step-N -> step-N.old, step-N.tmp -> step-N), or a first
 * save stopped after its last file: the complete one of step-N.tmp (the
 * newer) and step-N.old goes back to step-N. */
static void restore_missing(const char *dir, const char *name)
{
    char base[4400], path[4400];
    struct stat st;
    if (!leftover_base(dir, name, base, sizeof base) || lstat(base, &st) == 0)
        return;
    static const char *const order[] = {".tmp", ".old"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s%s", base, order[i]);
        if (lstat(path, &st) != 0 || !complete_checkpoint(path))
            continue;
        if (rename(path, base) != 0) {
            loom_log(LOOM_LOG_WARN, "checkpoint: %s is complete and %s missing, and it cannot "
                     "be moved there: %s; resume from it with --resume %s", path, base,
                     strerror(errno), path);
            return;
        }
        loom_ckpt_sync_dir(dir);
        loom_log(LOOM_LOG_INFO, "checkpoint: restored %s from %s (complete and verified), "
                 "left by a job that stopped while saving it", base, path);
        return;
    }
}

/* Rank 0, holding the lock: no live job writes here, so whatever a
 * checkpoint left is from one that stopped. A step-N that is missing comes
 * back from a complete step-N.tmp or step-N.old; then a leftover goes only
 * if it is incomplete or its step-N is complete: the only complete copy of
 * a step is never removed. */
static void remove_leftovers(const trainer *t, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char **grown;
        if (!is_leftover(e->d_name) || !(grown = realloc(names, (n + 1) * sizeof *names)))
            continue;
        names = grown;
        if ((names[n] = strdup(e->d_name)))
            n++;
    }
    closedir(d);
    for (size_t i = 0; i < n; i++)
        restore_missing(dir, names[i]);
    for (size_t i = 0; i < n; i++) {
        char path[4400], base[4400];
        snprintf(path, sizeof path, "%.4000s/%s", dir, names[i]);
        struct stat st;
        if (leftover_base(dir, names[i], base, sizeof base) && lstat(path, &st) == 0 &&
            !complete_checkpoint(base) && complete_checkpoint(path)) {
            loom_log(LOOM_LOG_WARN, "checkpoint: keeping %s, complete, while %s is not a "
                     "complete checkpoint; resume from it with --resume %s", path, base, path);
        } else if (remove_leftover(t, path) != LOOM_OK) {
            loom_log(LOOM_LOG_WARN, "%s", loom_last_error());
        }
        free(names[i]);
    }
    free(names);
}

int trainer_open_checkpoints(trainer *t, const loom_train_options *o)
{
    trainer_checkpoints *c = &t->ckpt;
    c->dir = "checkpoints";
    loom_config_string(t->job.cfg, "train.checkpoint_dir", &c->dir);
    loom_config_int(t->job.cfg, "train.checkpoint_every", &c->every);
    loom_config_int(t->job.cfg, "train.keep_checkpoints", &c->keep);
    int rc = trainer_check_outputs(t, o);
    if (rc == LOOM_OK)
        rc = trainer_choose_run_id(t);
    trainer_choose_lineage(t, o->resume);
    if (rc == LOOM_OK && c->every > 0)
        rc = trainer_lock_checkpoints(t, c->dir, &c->lock_fd);
    if (rc != LOOM_OK)
        return rc;
    char latest[4200];
    const char *resume = trainer_restart_resume(t, o->resume, latest, sizeof latest);
    c->restarting = resume == latest;
    return resume ? trainer_load_state(t, resume) : LOOM_OK;
}

/* every N steps, and the last whatever N */
int trainer_checkpoint_due(trainer *t)
{
    const trainer_checkpoints *c = &t->ckpt;
    int rc = trainer_checkpoint_poll(t);
    if (rc == LOOM_OK && c->every > 0 &&
        (t->job.step % c->every == 0 || t->job.step == t->job.steps))
        rc = trainer_checkpoint(t, c->dir, c->keep);
    return rc;
}

/* the last step's checkpoint, or one still written, ends before the run
 * does; on a failure it is given up */
int trainer_finish_checkpoints(trainer *t, int rc)
{
    if (rc == LOOM_OK)
        return trainer_checkpoint_wait(t);
    trainer_checkpoint_abandon(t);
    return rc;
}

int trainer_save_final_weights(trainer *t, const loom_train_options *o)
{
    int rc = trainer_save_weights(t, o->save, o->save_dtype);
    if (rc == LOOM_OK && t->job.rank == 0)
        printf("saved %s\n", o->save);
    return rc;
}

/* train.checkpoint_dir belongs to one job: rank 0 holds an advisory lock
 * (flock) on DIR/loom.lock for the job's life, and a second job naming the
 * same directory is refused at its start. Holding it, rank 0 removes what
 * jobs that stopped left unfinished there. */
int trainer_lock_checkpoints(trainer *t, const char *dir, int *lock_fd)
{
    *lock_fd = -1;
    int rc = LOOM_OK;
    if (t->job.rank == 0) {
        char path[4200], holder[512] = "";
        snprintf(path, sizeof path, "%.4000s/loom.lock", dir);
        int fd = -1;
        if (mkdir(dir, 0777) != 0 && errno != EEXIST)
            rc = loom_fail(LOOM_ERR_INVALID, "%s: train.checkpoint_dir '%s' cannot be created: %s",
                           loom_config_where(t->job.cfg, "train.checkpoint_dir"), dir,
                           strerror(errno));
        else if ((fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666)) < 0)
            rc = loom_fail(LOOM_ERR_INVALID, "%s: train.checkpoint_dir: cannot open '%s': %s",
                           loom_config_where(t->job.cfg, "train.checkpoint_dir"), path,
                           strerror(errno));
        else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            if (errno == EWOULDBLOCK) {
                ssize_t got = pread(fd, holder, sizeof holder - 1, 0);
                holder[got > 0 ? got : 0] = '\0';
                holder[strcspn(holder, "\n")] = '\0';
                rc = loom_fail(LOOM_ERR_INVALID,
                               "%s: train.checkpoint_dir '%s' is in use by "
                               "another job (%s); give this job a directory of its own, or wait "
                               "for that one to end",
                               loom_config_where(t->job.cfg, "train.checkpoint_dir"), dir,
                               holder[0] ? holder : "it did not say which");
            } else {
                /* a file system without locks: run, but say what is not guarded */
                loom_log(LOOM_LOG_WARN, "train.checkpoint_dir '%s': cannot lock %s (%s); nothing "
                         "keeps a second job out of this directory", dir, path, strerror(errno));
            }
        }
        if (rc == LOOM_OK && fd >= 0) {
            char host[256] = "?";
            gethostname(host, sizeof host);
            host[sizeof host - 1] = '\0';
            time_t now = time(NULL);
            char when[64];
            strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&now));
            int n = snprintf(holder, sizeof holder, "pid %ld on %s, run %016llx, since %s\n",
                             (long)getpid(), host, (unsigned long long)t->ckpt.run_id, when);
            if (ftruncate(fd, 0) != 0 || pwrite(fd, holder, (size_t)n, 0) != n)
                loom_log(LOOM_LOG_WARN, "%s: cannot write who holds it: %s", path,
                         strerror(errno));
            *lock_fd = fd;
            fd = -1;
            remove_leftovers(t, dir);
        }
        if (rc == LOOM_OK)
            rc = trainer_check_lineage(t, dir);
        if (fd >= 0)
            close(fd);
    }
    return trainer_agree(t, "could not take train.checkpoint_dir", rc);
}

void trainer_unlock_checkpoints(int lock_fd)
{
    if (lock_fd >= 0)
        close(lock_fd); /* the lock goes with it */
}

/* Whole arrays -> this tp rank's slices -> the data strategy. */
static int set_unit_state(trainer *t, int i, float *p, float *m, float *v)
{
    if (t->job.mesh->sizes[LOOM_AXIS_TP] == 1)
        return t->data_axis.ops->data_set_state(t->data_axis.strategy, dp_unit(t, i), p, m, v);
    size_t n = t->job.units[i].numel;
    float *local = malloc(3 * n * sizeof(float) + 1);
    if (!local)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory for a checkpoint");
    loom_model_slice(t->job.model, i, p, local);
    loom_model_slice(t->job.model, i, m, local + n);
    loom_model_slice(t->job.model, i, v, local + 2 * n);
    int rc = t->data_axis.ops->data_set_state(t->data_axis.strategy, dp_unit(t, i), local,
                                              local + n, local + 2 * n);
    free(local);
    return rc;
}

/* Any checkpoint, sharded or consolidated, on any mesh: unit by unit, the
 * whole arrays are read and each rank keeps its part. */
/* The checkpoint's header against the config: the shape field by field,
 * the precision, and a step still short of train.steps. */
static int check_resume(const trainer *t, const loom_ckpt *ck, const char *path)
{
    const loom_ckpt_header *h = loom_ckpt_header_of(ck);
    const struct {
        const char *setting;
        int saved, config;
    } fields[] = {
        {"model.layers", h->shape.layers, t->job.shape.layers},
        {"model.heads", h->shape.heads, t->job.shape.heads},
        {"model.channels", h->shape.channels, t->job.shape.channels},
        {"model.vocab", h->shape.vocab, t->job.shape.vocab},
        {"model.padded_vocab", h->shape.padded_vocab, t->job.shape.padded_vocab},
        {"model.max_seq", h->shape.max_seq, t->job.shape.max_seq},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(fields); i++)
        if (fields[i].saved != fields[i].config)
            return loom_fail(LOOM_ERR_INVALID, "--resume %s: %s is %d in the checkpoint, %d in the "
                             "config; set %s = %d to resume it", path, fields[i].setting,
                             fields[i].saved, fields[i].config, fields[i].setting,
                             fields[i].saved);
    int rc = loom_ckpt_check_model(ck, t->job.units, t->job.nunits);
    if (rc != LOOM_OK)
        return rc;
    if (h->dtype != t->job.dtype)
        return loom_fail(LOOM_ERR_INVALID,
                         "--resume %s: saved with precision %s, the config says "
                         "%s",
                         path, loom_dtype_name(h->dtype), loom_dtype_name(t->job.dtype));
    if (h->step > t->job.steps || (h->step == t->job.steps && !t->ckpt.restarting))
        return loom_fail(LOOM_ERR_INVALID,
                         "--resume %s: the checkpoint is after step %lld, and "
                         "train.steps is %lld: nothing is left to train; raise train.steps "
                         "(e.g. --set train.steps=%lld) to go on",
                         path, (long long)h->step, (long long)t->job.steps,
                         (long long)(h->step + t->job.steps));
    return LOOM_OK;
}

/* This rank's replica records back into the strategy's buffers of unit i:
 * each buffer by its label, of the size saved. */
static int restore_unit_replicas(trainer *t, loom_ckpt *ck, int i, const char *path)
{
    loom_replica_buffer *buffers;
    int count;
    int rc = replica_buffers(t, dp_unit(t, i), &buffers, &count);
    int saved = 0;
    for (int r = 0; r < loom_ckpt_replica_count(ck); r++) {
        const loom_ckpt_replica *rec = loom_ckpt_replica_at(ck, r);
        saved += rec->file == t->job.rank && rec->unit == i;
    }
    const char *name = t->job.units[i].name;
    if (rc == LOOM_OK && saved != count)
        rc = loom_fail(LOOM_ERR_INVALID, "--resume %s: unit %d (%s) has %d replica records of "
                       "rank %d, and strategy %s gives %d buffers; resume with the strategy "
                       "(and settings) that wrote it", path, i, name, saved, t->job.rank,
                       t->data_axis.plugin->header->name, count);
    for (int b = 0; rc == LOOM_OK && b < count; b++) {
        const loom_ckpt_replica *rec = NULL;
        int index = -1;
        for (int r = 0; r < loom_ckpt_replica_count(ck) && !rec; r++) {
            const loom_ckpt_replica *c = loom_ckpt_replica_at(ck, r);
            if (c->file == t->job.rank && c->unit == i && !strcmp(c->label, buffers[b].name))
                rec = c, index = r;
        }
        if (!rec) {
            rc = loom_fail(LOOM_ERR_INVALID, "--resume %s: unit %d (%s): no replica record "
                           "'%s' for rank %d; resume with the strategy (and settings) that "
                           "wrote it", path, i, name, buffers[b].name, t->job.rank);
            break;
        }
        if (rec->bytes != buffers[b].bytes) {
            rc = loom_fail(LOOM_ERR_INVALID, "--resume %s: unit %d (%s): replica record '%s' "
                           "holds %llu bytes, and the strategy's buffer is %zu; resume with the "
                           "settings that wrote it", path, i, name, rec->label,
                           (unsigned long long)rec->bytes, buffers[b].bytes);
            break;
        }
        void *host = malloc(rec->bytes + 1);
        if (!host)
            rc = loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory for a checkpoint");
        if (rc == LOOM_OK)
            rc = loom_ckpt_read_replica(ck, index, host);
        if (rc == LOOM_OK && rec->bytes)
            rc = BACKEND(t, to_device, buffers[b].data, host, rec->bytes);
        free(host);
    }
    free(buffers);
    return rc;
}

/* After data_set_state: at the mesh that wrote them, each rank's own state
 * back; otherwise every replica keeps the shared state, said once.
 * Collective: every rank calls it, ok = 0 after its own failure. */
static int restore_replicas(trainer *t, loom_ckpt *ck, const char *path, int ok)
{
    if (!t->data_axis.ops->data_replica_state)
        return LOOM_OK;
    int saved_dp = 0;
    if (loom_ckpt_replica_count(ck) > 0)
        saved_dp = loom_ckpt_replica_at(ck, 0)->dp_size;
    int dp = t->job.mesh->sizes[LOOM_AXIS_DP];
    /* The world, dp and tp sizes may match on another mesh (pp and sp
     * traded): the ranks agree that each holds the units of its own
     * records, as the dp rank that wrote them. */
    double fits = !ok ? -1
                  : saved_dp == dp && loom_ckpt_files(ck) == t->job.world &&
                      loom_ckpt_tp(ck) == t->job.mesh->sizes[LOOM_AXIS_TP];
    for (int r = 0; fits > 0 && r < loom_ckpt_replica_count(ck); r++) {
        const loom_ckpt_replica *rec = loom_ckpt_replica_at(ck, r);
        if (rec->file == t->job.rank &&
            (rec->dp_rank != t->job.mesh->coords[LOOM_AXIS_DP] || !holds(t, rec->unit)))
            fits = 0;
    }
    int rc = LOOM_OK;
    if (t->job.world > 1 && (rc = trainer_group_allreduce(t->job.mesh->world, &fits, 1, LOOM_F64,
                                                          LOOM_MIN)) != LOOM_OK)
        return rc;
    if (fits < 0) /* a rank failed: the agreement that follows says so */
        return LOOM_OK;
    if (!fits) {
        if (t->job.rank == 0 && saved_dp)
            loom_log(LOOM_LOG_INFO, "--resume %s: the checkpoint holds the replicas' own state "
                     "for %d dp ranks; this run has %d%s: every replica starts from the shared "
                     "state", path, saved_dp, dp,
                     saved_dp == dp ? " (on another mesh)" : "");
        else if (t->job.rank == 0)
            loom_log(LOOM_LOG_INFO, "--resume %s: the checkpoint holds no replica's own state "
                     "(%s): every replica starts from the shared state", path,
                     loom_ckpt_files(ck) ? "written without it" : "consolidated");
        return LOOM_OK;
    }
    for (int i = 0; rc == LOOM_OK && i < t->job.nunits; i++)
        if (holds(t, i))
            rc = restore_unit_replicas(t, ck, i, path);
    return rc;
}

/* Any checkpoint, sharded or consolidated, on any mesh: unit by unit, the
 * whole arrays are read and each rank keeps its part. The ranks share the
 * reading of the shard files' checksums, and agree that all is well before
 * any state changes. */
int trainer_load_state(trainer *t, const char *path)
{
    if (!t->data_axis.ops->data_set_state)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED, "strategy %s does not implement data_set_state",
                         t->data_axis.plugin->header->name);
    char failed[4200];
    snprintf(failed, sizeof failed, "could not resume from %.4000s", path);
    loom_ckpt *ck = NULL;
    int rc = loom_ckpt_open_unverified(path, &ck);
    if (rc == LOOM_OK)
        rc = check_resume(t, ck, path);
    for (int i = t->job.rank; rc == LOOM_OK && i < loom_ckpt_files(ck); i += t->job.world)
        rc = loom_ckpt_verify_file(ck, i);
    /* The data order is checked before any state is read: a resume with
     * other data or batches fails at once. */
    const loom_ckpt_header *h = ck ? loom_ckpt_header_of(ck) : NULL;
    if (rc == LOOM_OK)
        rc = h->data_position
                 ? loom_dataloader_restore(&t->data.loader, h->data_position,
                                           h->data_position_bytes, path)
                 : loom_dataloader_restore_offset(&t->data.loader, h->data_offset, path);
    if ((rc = trainer_agree(t, failed, rc)) != LOOM_OK) {
        loom_ckpt_close(ck);
        return rc;
    }
    size_t biggest = 0;
    for (int i = 0; i < t->job.nunits; i++) {
        size_t n = loom_model_full_numel(t->job.model, i);
        biggest = n > biggest ? n : biggest;
    }
    float *whole = malloc(3 * biggest * sizeof(float));
    if (!whole)
        rc = loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory for a checkpoint");
    for (int i = 0; rc == LOOM_OK && i < t->job.nunits; i++) {
        size_t n = loom_model_full_numel(t->job.model, i);
        if (!holds(t, i))
            continue;
        rc = loom_ckpt_read_unit(ck, t->job.units, i, whole, whole + n, whole + 2 * n);
        if (rc == LOOM_OK)
            rc = set_unit_state(t, i, whole, whole + n, whole + 2 * n);
    }
    int replicas_rc = restore_replicas(t, ck, path, rc == LOOM_OK);
    rc = rc == LOOM_OK ? replicas_rc : rc;
    trainer_sync_units(t);
    rc = trainer_agree(t, failed, rc);
    if (rc == LOOM_OK && t->pipe.executor) /* the last stage's copy of unit 0 */
        rc = loom_pipeline_sync_tied(t->pipe.executor);
    if (rc == LOOM_OK) {
        t->job.step = h->step;
        trainer_scaler_restore(t, h->loss_scale, h->good_steps);
    }
    free(whole);
    loom_ckpt_close(ck);
    return rc;
}

/* The whole model's fp32 weights in llm.c's order on rank 0 (*weights,
 * malloc'd; NULL on the other ranks), through a sharded checkpoint in the
 * scratch directory: every rank writes what it owns there, rank 0 joins
 * the shards and removes it. The one way the whole model is gathered, for
 * --save and for train.sample_every alike; no rank but rank 0 ever holds
 * the whole model. */
int trainer_gather_weights(trainer *t, const char *scratch, float **weights)
{
    *weights = NULL;
    int rc = trainer_save_sharded(t, scratch);
    if (rc != LOOM_OK)
        return rc;
    if (t->job.rank == 0) {
        loom_ckpt *ck = NULL;
        if ((rc = loom_ckpt_open(scratch, &ck)) == LOOM_OK &&
            (rc = loom_ckpt_check_model(ck, t->job.units, t->job.nunits)) == LOOM_OK)
            rc = loom_ckpt_read_llmc(ck, t->job.model, weights);
        loom_ckpt_close(ck);
        char reason[1024];
        snprintf(reason, sizeof reason, "%s", loom_last_error());
        if (loom_ckpt_remove_dir(scratch) != LOOM_OK)
            loom_log(LOOM_LOG_WARN, "%s", loom_last_error());
        if (rc != LOOM_OK)
            loom_fail(rc, "%s", reason);
    }
    char failed[4200];
    snprintf(failed, sizeof failed, "could not gather the weights through %.4000s", scratch);
    return trainer_agree(t, failed, rc);
}

/* llm.c's weights (--save), fp32 or bf16. */
int trainer_save_weights(trainer *t, const char *path, loom_dtype dtype)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%.4000s.shards", path);
    float *weights = NULL;
    int rc = trainer_gather_weights(t, dir, &weights);
    if (rc == LOOM_OK && t->job.rank == 0)
        rc = loom_checkpoint_write(path, &t->job.shape, weights, dtype);
    free(weights);
    return rc;
}
