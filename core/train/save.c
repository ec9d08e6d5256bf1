/* loom train — Checkpoints: sharded resumable state (each rank writes what it owns),
 * loading it back at any mesh, and llm.c weights (--save). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
    unsigned char *position = NULL;
    int rc = loom_dataloader_save(&t->loader, &position, &h->data_position_bytes);
    h->data_position = position;
    return rc;
}

/* What this rank writes of one unit: the range the data strategy owns, or,
 * for a strategy that replicates the state, the whole unit on dp rank 0. */
static int save_unit_shard(trainer *t, loom_ckpt_shard_writer *w, int i, float *buf)
{
    loom_unit *u = dp_unit(t, i);
    int tp_rank = t->mesh->coords[LOOM_AXIS_TP], rc;
    size_t n = u->numel, begin = 0, count = n;
    if (t->dp->data_get_shard) {
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
    if (rc != LOOM_OK || count == 0) /* owns nothing of it: another rank writes it */
        return rc;
    return loom_ckpt_shard_put(w, i, tp_rank, begin, count, buf, buf + count, buf + 2 * count);
}

static int barrier(trainer *t, const char *name)
{
    loom_store *store = loom_runtime_store(t->rt);
    return store ? loom_store_barrier(store, name, loom_runtime_timeout(t->rt)) : LOOM_OK;
}

static void remove_dir(const char *dir, int files)
{
    char path[4200];
    snprintf(path, sizeof path, "%.4000s/meta.loom", dir);
    remove(path);
    for (int r = 0; r < files; r++) {
        snprintf(path, sizeof path, "%.4000s/shard-%d.loom", dir, r);
        remove(path);
    }
    rmdir(dir);
}

/* A sharded checkpoint (ckpt.h): every rank writes its own state into
 * DIR.tmp, then rank 0 adds meta.loom and moves it into place, so DIR is
 * always a whole checkpoint. Ranks that repeat another's state (the
 * sequence axis) write an empty shard file. */
int trainer_save_sharded(trainer *t, const char *dir)
{
    if (!t->dp->data_get_shard && !t->dp->data_get_state)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED, "strategy %s can save no checkpoint (it "
                         "implements neither data_get_shard nor data_get_state)",
                         t->dp_plugin->header->name);
    char tmp[4200], name[4100];
    snprintf(tmp, sizeof tmp, "%.4000s.tmp", dir);
    if (t->rank == 0) {
        remove_dir(tmp, t->world);
        if (mkdir(tmp, 0777) != 0)
            return loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot create '%s': %s", tmp,
                             strerror(errno));
    }
    snprintf(name, sizeof name, "ckpt/%.4000s/begin", dir);
    int rc = barrier(t, name);
    size_t biggest = 0;
    for (int i = 0; i < t->nunits; i++)
        biggest = t->units[i].numel > biggest ? t->units[i].numel : biggest;
    float *buf = malloc(3 * biggest * sizeof(float));
    loom_ckpt_shard_writer w;
    memset(&w, 0, sizeof w);
    if (rc == LOOM_OK && !buf)
        rc = loom_fail(LOOM_ERR_NO_MEMORY, "checkpoint: out of memory");
    if (rc == LOOM_OK)
        rc = loom_ckpt_shard_open(&w, tmp, t->rank);
    int writes = t->mesh->coords[LOOM_AXIS_SP] == 0;
    for (int i = 0; rc == LOOM_OK && writes && i < t->nunits; i++)
        if (holds(t, i))
            rc = save_unit_shard(t, &w, i, buf);
    if (w.f) {
        int closed = loom_ckpt_shard_close(&w);
        rc = rc == LOOM_OK ? closed : rc;
    }
    free(buf);
    snprintf(name, sizeof name, "ckpt/%.4000s/written", dir);
    if (rc == LOOM_OK)
        rc = barrier(t, name);
    if (rc == LOOM_OK && t->rank == 0) {
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
        remove_dir(dir, t->world);
        if (rc == LOOM_OK && rename(tmp, dir) != 0)
            rc = loom_fail(LOOM_ERR_INVALID, "checkpoint: cannot move '%s' to '%s': %s", tmp,
                           dir, strerror(errno));
    }
    return rc;
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
int trainer_load_state(trainer *t, const char *path)
{
    if (!t->dp->data_set_state)
        return loom_fail(LOOM_ERR_NOT_SUPPORTED, "strategy %s does not implement data_set_state",
                         t->dp_plugin->header->name);
    loom_ckpt *ck = NULL;
    int rc = loom_ckpt_open(path, &ck);
    if (rc != LOOM_OK)
        return rc;
    const loom_ckpt_header *h = loom_ckpt_header_of(ck);
    if (memcmp(&h->shape, &t->shape, sizeof t->shape) != 0 || h->nunits != t->nunits)
        rc = loom_fail(LOOM_ERR_INVALID, "--resume %s: the checkpoint's model shape differs from "
                       "the config's model.*", path);
    else if (h->dtype != t->dtype)
        rc = loom_fail(LOOM_ERR_INVALID, "--resume %s: saved with precision %s, the config says %s",
                       path, loom_dtype_name(h->dtype), loom_dtype_name(t->dtype));
    /* The data order is checked first: a resume with other data or batches
     * fails before any state is read. */
    if (rc == LOOM_OK)
        rc = h->data_position ? loom_dataloader_restore(&t->loader, h->data_position,
                                                        h->data_position_bytes, path)
                              : loom_dataloader_restore_offset(&t->loader, h->data_offset, path);
    size_t biggest = 0;
    for (int i = 0; i < t->nunits; i++) {
        size_t n = loom_model_full_numel(t->model, i);
        biggest = n > biggest ? n : biggest;
    }
    float *whole = rc == LOOM_OK ? malloc(3 * biggest * sizeof(float)) : NULL;
    if (rc == LOOM_OK && !whole)
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
    if (rc == LOOM_OK && t->rank == 0) {
        loom_ckpt *ck = NULL;
        if ((rc = loom_ckpt_open(scratch, &ck)) == LOOM_OK)
            rc = loom_ckpt_read_llmc(ck, t->model, weights);
        loom_ckpt_close(ck);
        remove_dir(scratch, t->world);
    }
    return rc;
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
