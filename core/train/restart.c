/* loom train — after a restart by `loom launch --max-restarts` (LOOM_RESTART
 * > 0 in the environment): where to resume from. As torchrun leaves it to
 * the script, the job itself finds its latest complete checkpoint, so a
 * restart loses at most the steps since then. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "train/trainer.h"

/* N of "step-N" (digits only), else -1. */
static long long step_of(const char *name)
{
    if (strncmp(name, "step-", 5) || !name[5])
        return -1;
    long long n = 0;
    for (const char *c = name + 5; *c; c++) {
        if (*c < '0' || *c > '9' || n > (1LL << 50))
            return -1;
        n = n * 10 + (*c - '0');
    }
    return n;
}

const char *trainer_restart_resume(const trainer *t, const char *asked, char *buf, size_t cap)
{
    const char *restart = getenv("LOOM_RESTART");
    if (!restart || atoi(restart) <= 0)
        return asked;
    const char *dir = "checkpoints";
    loom_config_string(t->cfg, "train.checkpoint_dir", &dir);
    long long best = -1;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        long long n = step_of(e->d_name);
        char meta[4200];
        struct stat st;
        /* a directory without meta.loom was not finished */
        snprintf(meta, sizeof meta, "%s/%s/meta.loom", dir, e->d_name);
        if (n > best && stat(meta, &st) == 0 && S_ISREG(st.st_mode)) {
            best = n;
            snprintf(buf, cap, "%s/%s", dir, e->d_name);
        }
    }
    if (d)
        closedir(d);
    const char *from = best >= 0 ? buf : asked;
    if (t->rank == 0) {
        printf("restart %s: %s%s\n", restart, from ? "resuming from " : "",
               from ? from : "no complete checkpoint to resume from: starting over");
        fflush(stdout);
    }
    return from;
}
