/* loom train — Checkpoints: sharded resumable state (each rank writes what it owns),
 * loading it back at any mesh, and llm.c weights (--save). */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "loom/status.h"
#include "runtime/bootstrap.h"
#include "runtime/log.h"
#include "train/ckpt.h"
#include "train/trainer.h"

/* ---- checkpoints: llm.c's weights (--save) and loom's resumable state ---- */

/* h->data_position is malloc'd: the caller frees it. */
static int fill_header(const trainer *t, loom_ckpt_header *h)
{
    memset(h, 0, sizeof *h);
    h->dtype = t->dtype;
    h->shape = t->shape;
    h->step = t->step;
    h->good_steps = t->good_steps;
    h->loss_scale = t->loss_scale;
    h->nunits = t->nunits;
    h->run_id = t->run_id;
    unsigned char *position = NULL;
    int rc = loom_dataloader_save(&t->loader, &position, &h->data_position_bytes);
    h->data_position = position;
    return rc;
}

/* After each phase of a checkpoint (and of a resume) the ranks agree on how
 * it went: an all-reduce of the first failing rank over the world, whose
 * reason the others read from the bootstrap store. So no rank waits out
 * comm.timeout_s on one that gave up, and every rank fails with one line
 * naming the rank and its reason. failed: "failed the checkpoint DIR". */
static int agree(trainer *t, const char *failed, int rc)
{
    if (t->world == 1)
        return rc;
    char reason[1024], key[96];
    snprintf(reason, sizeof reason, "%s", rc == LOOM_OK ? "" : loom_last_error());
    int64_t round = t->agreements++;
    loom_store *store = loom_runtime_store(t->rt);
    if (rc != LOOM_OK && store) {
        snprintf(key, sizeof key, "ckpt/agree/%lld/%d", (long long)round, t->rank);
        loom_store_put(store, key, reason, strlen(reason) + 1);
    }
    double first = rc == LOOM_OK ? (double)t->world : (double)t->rank;
    int comm_rc = trainer_group_allreduce(t->mesh->world, &first, 1, LOOM_F64, LOOM_MIN);
    if (comm_rc != LOOM_OK)
        return comm_rc;
    int rank = (int)first;
    if (rank >= t->world)
        return LOOM_OK;
    if (rank != t->rank) {
        size_t len = 0;
        snprintf(key, sizeof key, "ckpt/agree/%lld/%d", (long long)round, rank);
        if (!store || loom_store_get(store, key, reason, sizeof reason, &len,
                                     loom_runtime_timeout(t->rt)) != LOOM_OK)
            snprintf(reason, sizeof reason, "(its output says why)");
        reason[sizeof reason - 1] = '\0';
    }
    return loom_fail(rc != LOOM_OK ? rc : LOOM_ERR_REMOTE, "rank %d %s: %s", rank, failed, reason);
}

int trainer_choose_run_id(trainer *t)
{
    uint64_t id = 0;
    if (t->rank == 0 && getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id)
        id = loom_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL);
    if (t->world > 1) {
        /* two exact halves: a double holds 32 bits without loss */
        double halves[2] = {(double)(id >> 32), (double)(id & 0xffffffffu)};
        int rc = trainer_group_allreduce(t->mesh->world, halves, 2, LOOM_F64, LOOM_SUM);
        if (rc != LOOM_OK)
            return rc;
        id = (uint64_t)halves[0] << 32 | (uint64_t)halves[1];
    }
    t->run_id = id;
    return LOOM_OK;
}

/* What this rank writes of one unit: the range the data strategy owns, or,
 * for a strategy that replicates the state, the whole unit on dp rank 0.
 * write = 0 after a failure: data_get_state is still called, being
 * collective, so that no other rank waits for this one. */
static int save_unit_shard(trainer *t, loom_ckpt_shard_writer *w, int i, float *buf, int write)
{
    loom_unit *u = dp_unit(t, i);
    int tp_rank = t->mesh->coords[LOOM_AXIS_TP], rc;
    size_t n = u->numel, begin = 0, count = n;
    if (t->dp->data_get_shard) {
        if (!write)
            return LOOM_OK;
        if ((rc = t->dp->data_get_shard(t->strategy, u, &begin, &count, NULL, NULL, NULL)) !=
            LOOM_OK)
            return rc;
        if (begin + count > n)
            return loom_fail(LOOM_ERR_INTERNAL, "strategy %s: data_get_shard gave %s the range "
                             "%zu+%zu of %zu elements", t->dp_plugin->header->name, u->name,
                             begin, count, n);
        rc = t->dp->data_get_shard(t->strategy, u, &begin, &count, buf, buf + count,
                                   buf + 2 * count);
    } else {
        /* data_get_state is collective on the dp group: every rank calls it */
        rc = t->dp->data_get_state(t->strategy, u, buf, buf + n, buf + 2 * n);
        if (t->mesh->coords[LOOM_AXIS_DP] != 0)
            return rc;
    }
    if (rc != LOOM_OK || count == 0 || !write) /* owns nothing of it: another rank writes it */
        return rc;
    return loom_ckpt_shard_put(w, i, tp_rank, begin, count, buf, buf + count, buf + 2 * count);
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
    if (!stamped || run_id != t->run_id) {
        char who[64] = "a job that stopped";
        if (stamped)
            snprintf(who, sizeof who, "run %016llx, a job that stopped", (unsigned long long)run_id);
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
        if (rename(dir, old) != 0 || rename(tmp, dir) != 0)
            return loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot replace '%s' by '%s': %s", dir,
                             tmp, strerror(errno));
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

/* A sharded checkpoint (ckpt.h): every rank writes its own state into
 * DIR.tmp, then rank 0 adds meta.loom and moves it into place, so DIR is
 * always a whole checkpoint. Ranks that repeat another's state (the
 * sequence axis) write an empty shard file. After each phase the ranks
 * agree (agree()), so a failure on any rank fails every rank at once; a
 * failed checkpoint leaves no DIR.tmp behind. */
int trainer_save_sharded(trainer *t, const char *dir)
{
    if (!t->dp->data_get_shard && !t->dp->data_get_state)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED, "strategy %s can save no checkpoint (it "
                         "implements neither data_get_shard nor data_get_state)",
                         t->dp_plugin->header->name);
    char tmp[4200], failed[4200];
    snprintf(tmp, sizeof tmp, "%.4000s.tmp", dir);
    snprintf(failed, sizeof failed, "failed the checkpoint %.4000s", dir);
    int rc = LOOM_OK;
    if (t->rank == 0 && (rc = remove_leftover(t, tmp)) == LOOM_OK && mkdir(tmp, 0777) != 0)
        rc = loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot create '%s': %s", tmp,
                       strerror(errno));
    if ((rc = agree(t, failed, rc)) != LOOM_OK)
        return rc;

    size_t biggest = 0;
    for (int i = 0; i < t->nunits; i++)
        biggest = t->units[i].numel > biggest ? t->units[i].numel : biggest;
    float *buf = malloc(3 * biggest * sizeof(float) + 1);
    loom_ckpt_shard_writer w;
    memset(&w, 0, sizeof w);
    if (!buf)
        rc = loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    if (rc == LOOM_OK)
        rc = loom_ckpt_shard_open(&w, tmp, t->rank, t->run_id, t->step);
    int writes = t->mesh->coords[LOOM_AXIS_SP] == 0;
    for (int i = 0; buf && writes && i < t->nunits; i++)
        if (holds(t, i)) {
            int unit_rc = save_unit_shard(t, &w, i, buf, rc == LOOM_OK);
            rc = rc == LOOM_OK ? unit_rc : rc;
        }
    int closed = loom_ckpt_shard_close(&w, rc == LOOM_OK);
    rc = rc == LOOM_OK ? closed : rc;
    free(buf);
    if ((rc = agree(t, failed, rc)) != LOOM_OK) {
        if (t->rank == 0)
            remove_failed(tmp);
        return rc;
    }

    if (t->rank == 0) {
        loom_ckpt_header h;
        rc = fill_header(t, &h);
        const loom_param_shard **shards = calloc((size_t)t->nunits, sizeof *shards);
        for (int i = 0; shards && i < t->nunits; i++)
            shards[i] = t->tp_shards ? t->tp_shards[i] : loom_model_shards(t->model, i);
        if (rc == LOOM_OK)
            rc = shards ? loom_ckpt_write_meta(tmp, &h, t->mesh->sizes[LOOM_AXIS_TP], t->world,
                                               t->dp_plugin->header->name, t->units, shards)
                        : loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
        free(shards);
        free((void *)(uintptr_t)h.data_position);
        if (rc == LOOM_OK)
            rc = install(t, tmp, dir);
    }
    if (rc != LOOM_OK)
        remove_failed(tmp);
    return agree(t, failed, rc);
}

/* train.keep_checkpoints: the last keep complete checkpoints up to this
 * step stay. Those of later steps (a run resumed from an earlier one finds
 * them) are left alone until this run saves those steps again. */
static void prune_checkpoints(const trainer *t, const char *parent, int64_t keep)
{
    DIR *d = opendir(parent);
    if (!d)
        return;
    int64_t *steps = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long step;
        int used = 0;
        if (sscanf(e->d_name, "step-%lld%n", &step, &used) != 1 || e->d_name[used] != '\0' ||
            step < 0 || step > t->step)
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
        steps[n++] = step;
    }
    closedir(d);
    for (size_t i = 0; i < n; i++) {
        size_t newer = 0;
        for (size_t j = 0; j < n; j++)
            newer += steps[j] > steps[i];
        if (newer < (size_t)keep)
            continue;
        char path[4200];
        snprintf(path, sizeof path, "%.4000s/step-%lld", parent, (long long)steps[i]);
        if (loom_ckpt_remove_dir(path) != LOOM_OK)
            loom_log(LOOM_LOG_WARN, "train.keep_checkpoints = %lld: %s", (long long)keep,
                     loom_last_error());
    }
    free(steps);
}

int trainer_checkpoint(trainer *t, const char *parent, int64_t keep)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%.4000s/step-%lld", parent, (long long)t->step);
    int rc = trainer_save_sharded(t, dir);
    if (rc == LOOM_OK && t->rank == 0) {
        printf("saved %s\n", dir);
        if (keep > 0)
            prune_checkpoints(t, parent, keep);
    }
    return rc;
}

/* What a checkpoint or a sample leaves in train.checkpoint_dir while it
 * is written: step-N.tmp, step-N.old, sample-step-N(.tmp). */
static int is_leftover(const char *name)
{
    const char *p = name;
    int sample = strncmp(p, "sample-", 7) == 0;
    p += sample ? 7 : 0;
    if (strncmp(p, "step-", 5) != 0 || !isdigit((unsigned char)p[5]))
        return 0;
    for (p += 5; isdigit((unsigned char)*p); p++) {
    }
    return *p ? !strcmp(p, ".tmp") || !strcmp(p, ".old") : sample;
}

/* Rank 0, holding the lock: no live job writes here, so whatever a
 * checkpoint left unfinished is from one that stopped. */
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
    for (size_t i = 0; i < n; i++) {
        char path[4400];
        snprintf(path, sizeof path, "%.4000s/%s", dir, names[i]);
        if (remove_leftover(t, path) != LOOM_OK)
            loom_log(LOOM_LOG_WARN, "%s", loom_last_error());
        free(names[i]);
    }
    free(names);
}

/* train.checkpoint_dir belongs to one job: rank 0 holds an advisory lock
 * (flock) on DIR/loom.lock for the job's life, and a second job naming the
 * same directory is refused at its start. Holding it, rank 0 removes what
 * jobs that stopped left unfinished there. */
int trainer_lock_checkpoints(trainer *t, const char *dir, int *lock_fd)
{
    *lock_fd = -1;
    int rc = LOOM_OK;
    if (t->rank == 0) {
        char path[4200], holder[512] = "";
        snprintf(path, sizeof path, "%.4000s/loom.lock", dir);
        int fd = -1;
        if (mkdir(dir, 0777) != 0 && errno != EEXIST)
            rc = loom_fail(LOOM_ERR_INVALID, "%s: train.checkpoint_dir '%s' cannot be created: %s",
                           loom_config_where(t->cfg, "train.checkpoint_dir"), dir,
                           strerror(errno));
        else if ((fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666)) < 0)
            rc = loom_fail(LOOM_ERR_INVALID, "%s: train.checkpoint_dir: cannot open '%s': %s",
                           loom_config_where(t->cfg, "train.checkpoint_dir"), path,
                           strerror(errno));
        else if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            if (errno == EWOULDBLOCK) {
                ssize_t got = pread(fd, holder, sizeof holder - 1, 0);
                holder[got > 0 ? got : 0] = '\0';
                holder[strcspn(holder, "\n")] = '\0';
                rc = loom_fail(LOOM_ERR_INVALID, "%s: train.checkpoint_dir '%s' is in use by "
                               "another job (%s); give this job a directory of its own, or wait "
                               "for that one to end",
                               loom_config_where(t->cfg, "train.checkpoint_dir"), dir,
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
                             (long)getpid(), host, (unsigned long long)t->run_id, when);
            if (ftruncate(fd, 0) != 0 || pwrite(fd, holder, (size_t)n, 0) != n)
                loom_log(LOOM_LOG_WARN, "%s: cannot write who holds it: %s", path,
                         strerror(errno));
            *lock_fd = fd;
            fd = -1;
            remove_leftovers(t, dir);
        }
        if (fd >= 0)
            close(fd);
    }
    return agree(t, "could not take train.checkpoint_dir", rc);
}

void trainer_unlock_checkpoints(int lock_fd)
{
    if (lock_fd >= 0)
        close(lock_fd); /* the lock goes with it */
}

/* Whole arrays -> this tp rank's slices -> the data strategy. */
static int set_unit_state(trainer *t, int i, float *p, float *m, float *v)
{
    if (t->mesh->sizes[LOOM_AXIS_TP] == 1)
        return t->dp->data_set_state(t->strategy, dp_unit(t, i), p, m, v);
    size_t n = t->units[i].numel;
    float *local = malloc(3 * n * sizeof(float) + 1);
    if (!local)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory for a checkpoint");
    loom_model_slice(t->model, i, p, local);
    loom_model_slice(t->model, i, m, local + n);
    loom_model_slice(t->model, i, v, local + 2 * n);
    int rc = t->dp->data_set_state(t->strategy, dp_unit(t, i), local, local + n, local + 2 * n);
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
        {"model.layers", h->shape.layers, t->shape.layers},
        {"model.heads", h->shape.heads, t->shape.heads},
        {"model.channels", h->shape.channels, t->shape.channels},
        {"model.vocab", h->shape.vocab, t->shape.vocab},
        {"model.padded_vocab", h->shape.padded_vocab, t->shape.padded_vocab},
        {"model.max_seq", h->shape.max_seq, t->shape.max_seq},
    };
    for (size_t i = 0; i < LOOM_ARRAY_LEN(fields); i++)
        if (fields[i].saved != fields[i].config)
            return loom_fail(LOOM_ERR_INVALID, "--resume %s: %s is %d in the checkpoint, %d in the "
                             "config; set %s = %d to resume it", path, fields[i].setting,
                             fields[i].saved, fields[i].config, fields[i].setting,
                             fields[i].saved);
    int rc = loom_ckpt_check_model(ck, t->units, t->nunits);
    if (rc != LOOM_OK)
        return rc;
    if (h->dtype != t->dtype)
        return loom_fail(LOOM_ERR_INVALID, "--resume %s: saved with precision %s, the config says "
                         "%s", path, loom_dtype_name(h->dtype), loom_dtype_name(t->dtype));
    if (h->step > t->steps || (h->step == t->steps && !t->restarting))
        return loom_fail(LOOM_ERR_INVALID, "--resume %s: the checkpoint is after step %lld, and "
                         "train.steps is %lld: nothing is left to train; raise train.steps "
                         "(e.g. --set train.steps=%lld) to go on", path, (long long)h->step,
                         (long long)t->steps, (long long)(h->step + t->steps));
    return LOOM_OK;
}

/* Any checkpoint, sharded or consolidated, on any mesh: unit by unit, the
 * whole arrays are read and each rank keeps its part. The ranks share the
 * reading of the shard files' checksums, and agree that all is well before
 * any state changes. */
int trainer_load_state(trainer *t, const char *path)
{
    if (!t->dp->data_set_state)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED, "strategy %s does not implement data_set_state",
                         t->dp_plugin->header->name);
    char failed[4200];
    snprintf(failed, sizeof failed, "could not resume from %.4000s", path);
    loom_ckpt *ck = NULL;
    int rc = loom_ckpt_open_unverified(path, &ck);
    if (rc == LOOM_OK)
        rc = check_resume(t, ck, path);
    for (int i = t->rank; rc == LOOM_OK && i < loom_ckpt_files(ck); i += t->world)
        rc = loom_ckpt_verify_file(ck, i);
    /* The data order is checked before any state is read: a resume with
     * other data or batches fails at once. */
    const loom_ckpt_header *h = ck ? loom_ckpt_header_of(ck) : NULL;
    if (rc == LOOM_OK)
        rc = h->data_position ? loom_dataloader_restore(&t->loader, h->data_position,
                                                        h->data_position_bytes, path)
                              : loom_dataloader_restore_offset(&t->loader, h->data_offset, path);
    if ((rc = agree(t, failed, rc)) != LOOM_OK) {
        loom_ckpt_close(ck);
        return rc;
    }
    size_t biggest = 0;
    for (int i = 0; i < t->nunits; i++) {
        size_t n = loom_model_full_numel(t->model, i);
        biggest = n > biggest ? n : biggest;
    }
    float *whole = malloc(3 * biggest * sizeof(float));
    if (!whole)
        rc = loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory for a checkpoint");
    for (int i = 0; rc == LOOM_OK && i < t->nunits; i++) {
        size_t n = loom_model_full_numel(t->model, i);
        if (!holds(t, i))
            continue;
        rc = loom_ckpt_read_unit(ck, t->units, i, whole, whole + n, whole + 2 * n);
        if (rc == LOOM_OK)
            rc = set_unit_state(t, i, whole, whole + n, whole + 2 * n);
    }
    trainer_sync_units(t);
    rc = agree(t, failed, rc);
    if (rc == LOOM_OK && t->pipeline) /* the last stage's copy of unit 0 */
        rc = loom_pipeline_sync_tied(t->pipeline);
    if (rc == LOOM_OK) {
        t->step = h->step;
        t->good_steps = h->good_steps;
        t->loss_scale = h->loss_scale;
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
    if (t->rank == 0) {
        loom_ckpt *ck = NULL;
        if ((rc = loom_ckpt_open(scratch, &ck)) == LOOM_OK &&
            (rc = loom_ckpt_check_model(ck, t->units, t->nunits)) == LOOM_OK)
            rc = loom_ckpt_read_llmc(ck, t->model, weights);
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
    return agree(t, failed, rc);
}

/* llm.c's weights (--save), fp32 or bf16. */
int trainer_save_weights(trainer *t, const char *path, loom_dtype dtype)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%.4000s.shards", path);
    float *weights = NULL;
    int rc = trainer_gather_weights(t, dir, &weights);
    if (rc == LOOM_OK && t->rank == 0)
        rc = loom_checkpoint_write(path, &t->shape, weights, dtype);
    free(weights);
    return rc;
}
