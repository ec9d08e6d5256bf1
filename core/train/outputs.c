/* loom train — the files a run writes (--save, --trace, train.checkpoint_dir),
 * checked before step 1: a path that cannot be written would otherwise fail
 * only when first used, after the whole run, and lose its result. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/status.h"
#include "runtime/log.h"
#include "train/trainer.h"

/* The directory part of path: "." for a bare name. */
static void dir_of(const char *path, char *out, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(out, cap, ".");
    else if (slash == path)
        snprintf(out, cap, "/");
    else
        snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

/* Why a file cannot be created in dir: the missing or wrong directory, not
 * only the errno, since that is what to fix. */
static void creation_failure(const char *path, int err, char *why, size_t cap)
{
    char dir[4096];
    dir_of(path, dir, sizeof dir);
    struct stat st;
    if (err == ENOENT || err == ENOTDIR) {
        if (stat(dir, &st) != 0)
            snprintf(why, cap, "its directory %s does not exist; create it or name another path",
                     dir);
        else
            snprintf(why, cap, "%s is not a directory; name another path", dir);
    } else {
        snprintf(why, cap, "cannot create a file in %s: %s", dir, strerror(err));
    }
}

/* Whether path can be written later, leaving the file system as it was: an
 * existing file is opened without truncating it, a new one created and
 * removed. 0, or -1 with why filled in. */
static int probe_file(const char *path, char *why, size_t cap)
{
    struct stat st;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            snprintf(why, cap, "it is a directory; name a file");
            return -1;
        }
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0) {
            snprintf(why, cap, "cannot write it: %s", strerror(errno));
            return -1;
        }
        close(fd);
        return 0;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
        creation_failure(path, errno, why, cap);
        return -1;
    }
    close(fd);
    unlink(path);
    return 0;
}

int trainer_make_dirs(const char *path, char *made, size_t made_cap, char *why, size_t cap)
{
    made[0] = '\0';
    char partial[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof partial) {
        snprintf(why, cap, "not a usable directory name");
        return -1;
    }
    /* each prefix ending before a '/', then the whole path */
    for (size_t i = 1; i <= n; i++) {
        if (i < n && path[i] != '/')
            continue;
        memcpy(partial, path, i);
        partial[i] = '\0';
        if (mkdir(partial, 0777) == 0) {
            if (!made[0])
                snprintf(made, made_cap, "%s", partial);
            continue;
        }
        int err = errno;
        struct stat st;
        if (err == EEXIST && stat(partial, &st) == 0 && S_ISDIR(st.st_mode))
            continue;
        if (err == EEXIST)
            snprintf(why, cap, "%s exists and is not a directory", partial);
        else
            snprintf(why, cap, "cannot create %s: %s", partial, strerror(err));
        trainer_remove_made_dirs(path, made);
        made[0] = '\0';
        return -1;
    }
    return 0;
}

void trainer_remove_made_dirs(const char *path, const char *made)
{
    if (!made || !made[0])
        return;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    for (;;) {
        size_t n = strlen(dir);
        while (n > 1 && dir[n - 1] == '/')
            dir[--n] = '\0';
        if (rmdir(dir) != 0 || strlen(dir) <= strlen(made))
            return;
        char *slash = strrchr(dir, '/');
        if (!slash)
            return;
        *slash = '\0';
    }
}

/* A directory a run writes into, made (with its parents) and tried with a
 * file of our own. keep: leave what was made (checkpoints go there);
 * otherwise remove it again, so a check leaves nothing behind. */
static int prepare_dir(const char *dir, int keep, char *why, size_t cap)
{
    char made[4096];
    if (trainer_make_dirs(dir, made, sizeof made, why, cap) != 0)
        return -1;
    char probe[4200];
    snprintf(probe, sizeof probe, "%.4000s/.loom-probe-XXXXXX", dir);
    int fd = mkstemp(probe);
    int rc = 0;
    if (fd < 0) {
        snprintf(why, cap, "cannot create a file in it: %s", strerror(errno));
        rc = -1;
    } else {
        close(fd);
        unlink(probe);
    }
    if (!keep || rc != 0)
        trainer_remove_made_dirs(dir, made);
    return rc;
}

/* Rank 0's part: --save's file and train.checkpoint_dir (the others write
 * into the same places, which every rank sees). Every rank: its own part
 * of --trace. */
static int check_here(trainer *t, const loom_train_options *o)
{
    char why[4400];
    if (o->trace) {
        char part[4200];
        snprintf(part, sizeof part, "%.4000s.rank%d", o->trace, t->job.rank);
        if ((t->job.rank == 0 && probe_file(o->trace, why, sizeof why) != 0) ||
            probe_file(part, why, sizeof why) != 0)
            return loom_fail(LOOM_ERR_INVALID, "--trace %s: %s", o->trace, why);
    }
    if (t->job.rank != 0)
        return LOOM_OK;
    if (o->save && probe_file(o->save, why, sizeof why) != 0)
        return loom_fail(LOOM_ERR_INVALID, "--save %s: %s", o->save, why);
    int64_t checkpoint_every = 0, sample_every = 0;
    loom_config_int(t->job.cfg, "train.checkpoint_every", &checkpoint_every);
    loom_config_int(t->job.cfg, "train.sample_every", &sample_every);
    if (checkpoint_every > 0 || sample_every > 0) {
        /* samples pass through it too, and leave it as they found it */
        const char *dir = "checkpoints";
        loom_config_string(t->job.cfg, "train.checkpoint_dir", &dir);
        if (prepare_dir(dir, checkpoint_every > 0, why, sizeof why) != 0)
            return loom_fail(LOOM_ERR_INVALID, "%s: train.checkpoint_dir = \"%s\": %s",
                             loom_config_where(t->job.cfg, "train.checkpoint_dir"), dir, why);
    }
    return LOOM_OK;
}

int trainer_check_outputs(trainer *t, const loom_train_options *o)
{
    int rc = check_here(t, o);
    char message[1024];
    snprintf(message, sizeof message, "%s", rc == LOOM_OK ? "" : loom_last_error());
    /* One verdict for every rank, in the first failing rank's words: a rank
     * that stopped with a vaguer line could be the one the launcher shows. */
    int32_t first = rc == LOOM_OK ? t->job.world : t->job.rank;
    int arc = trainer_group_allreduce(t->job.mesh->world, &first, 1, LOOM_I32, LOOM_MIN);
    if (arc != LOOM_OK || first == t->job.world)
        return rc != LOOM_OK ? rc : arc;
    loom_request *req = NULL;
    const loom_comm_api *C = &loom_core_comm_api;
    arc = C->broadcast(t->job.mesh->world, message, sizeof message, LOOM_U8, (int)first, &req);
    if (arc == LOOM_OK)
        arc = C->wait(req);
    message[sizeof message - 1] = '\0';
    return loom_fail(LOOM_ERR_INVALID, "%s", arc == LOOM_OK ? message : "an output path is bad");
}
