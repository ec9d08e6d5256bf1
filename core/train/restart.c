/* loom train — which experiment a job continues, and where it resumes.
 *
 * A checkpoint records its lineage (ckpt_format.h): the settings that shape the
 * trajectory and the data's identity, hashed, at the run that started it,
 * kept by every job resumed from it. A job that writes checkpoints refuses
 * a train.checkpoint_dir holding another lineage's (unless
 * train.checkpoint_overwrite), and after a restart by `loom launch
 * --max-restarts` (LOOM_RESTART > 0 in the environment) it resumes from the
 * latest complete checkpoint of its own lineage: as torchrun leaves it to
 * the script, the job itself finds it, so a restart loses at most the steps
 * since then, and never continues another experiment. */
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "loom/status.h"
#include "runtime/log.h"
#include "train/trainer.h"

/* The settings that shape the trajectory: what a step computes from the
 * state before it. Not the mesh, the strategies, train.grad_accum or the
 * kernels (every layout reproduces the single-rank trajectory), and not
 * what only watches or saves it (logs, evaluation, checkpoints, samples).
 * train.steps only through a schedule that decays over it. */
static const struct {
    const char *name;
    char type; /* i, f, s, b */
} trajectory_settings[] = {
    {"model.kind", 's'},         {"model.layers", 'i'},        {"model.heads", 'i'},
    {"model.kv_heads", 'i'},     {"model.ffn", 'i'},           {"model.channels", 'i'},
    {"model.vocab", 'i'},        {"model.padded_vocab", 'i'},  {"model.max_seq", 'i'},
    {"model.init", 's'},         {"model.seed", 'i'},          {"model.checkpoint", 's'},
    {"data.shuffle", 'b'},       {"data.readers", 'i'},        {"data.read_batch", 'i'},
    {"train.batch", 'i'},        {"train.seq", 'i'},           {"train.precision", 's'},
    {"train.lr", 'f'},           {"train.schedule", 's'},      {"train.warmup", 'i'},
    {"train.lr_final_frac", 'f'}, {"train.weight_decay", 'f'}, {"train.decay", 's'},
    {"train.beta1", 'f'},        {"train.beta2", 'f'},         {"train.eps", 'f'},
    {"train.clip", 'f'},         {"train.loss_scale", 'f'},    {"train.loss_scale_window", 'i'},
};

/* FNV-1a, 64 bits. */
static uint64_t hash_text(uint64_t h, const char *text)
{
    for (const unsigned char *c = (const unsigned char *)text; *c; c++)
        h = (h ^ *c) * 0x100000001b3ULL;
    return h;
}
#define HASH_START 0xcbf29ce484222325ULL

static const char *base_name(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static void append(char *buf, size_t cap, size_t *used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t cap, size_t *used, const char *fmt, ...)
{
    if (*used >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *used, cap - *used, fmt, ap);
    va_end(ap);
    *used += n > 0 ? (size_t)n : 0;
    if (*used >= cap)
        *used = cap - 1;
}

void trainer_choose_lineage(trainer *t, const char *resume)
{
    size_t used = 0, cap = sizeof t->ckpt.trajectory;
    t->ckpt.trajectory[0] = '\0';
    for (size_t i = 0; i < LOOM_ARRAY_LEN(trajectory_settings); i++) {
        const char *name = trajectory_settings[i].name, *s = "";
        int64_t n = 0;
        double f = 0;
        int b = 0;
        switch (trajectory_settings[i].type) {
        case 'i':
            loom_config_int(t->job.cfg, name, &n);
            append(t->ckpt.trajectory, cap, &used, "%s=%lld\n", name, (long long)n);
            break;
        case 'f':
            loom_config_float(t->job.cfg, name, &f);
            append(t->ckpt.trajectory, cap, &used, "%s=%.9g\n", name, f);
            break;
        case 'b':
            loom_config_bool(t->job.cfg, name, &b);
            append(t->ckpt.trajectory, cap, &used, "%s=%s\n", name, b ? "true" : "false");
            break;
        default:
            loom_config_string(t->job.cfg, name, &s);
            append(t->ckpt.trajectory, cap, &used, "%s=%s\n", name, s);
        }
    }
    const char *schedule = "constant";
    loom_config_string(t->job.cfg, "train.schedule", &schedule);
    if (strcmp(schedule, "constant") != 0)
        append(t->ckpt.trajectory, cap, &used, "train.steps=%lld\n", (long long)t->job.steps);
    /* the data by name and length (its contents are checked at resume) */
    uint64_t data = HASH_START;
    char line[4300];
    for (int i = 0; i < t->data.set.nfiles; i++) {
        snprintf(line, sizeof line, "%s:%lld\n", base_name(t->data.set.paths[i]),
                 (long long)t->data.set.tokens[i]);
        data = hash_text(data, line);
    }
    uint64_t settings = hash_text(HASH_START, t->ckpt.trajectory);
    snprintf(line, sizeof line, "%016llx", (unsigned long long)data);
    t->ckpt.lineage =
        (loom_ckpt_lineage){hash_text(settings, line), settings, data, t->ckpt.trajectory};
    t->ckpt.resumed = resume != NULL;
    if (!resume)
        return;
    /* a resumed job continues the lineage of its checkpoint */
    int64_t step = 0;
    uint32_t format = 0;
    loom_ckpt_lineage theirs;
    if (loom_ckpt_lineage_of(resume, &step, &format, &theirs, NULL, 0) == LOOM_OK)
        t->ckpt.lineage.id = theirs.id;
}

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

/* The highest complete step-N of dir: of lineage id (mine), and of any
 * other lineage (theirs, with its lineage and settings; with unrecorded,
 * one of a format before 4 too); -1 if none. */
typedef struct lineage_scan {
    long long mine, theirs;
    uint32_t their_format; /* before 4: no lineage recorded */
    loom_ckpt_lineage their_lineage;
    char their_settings[8192];
} lineage_scan;

static void scan_lineages(const char *dir, uint64_t id, int unrecorded, lineage_scan *s)
{
    s->mine = s->theirs = -1;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        long long n = step_of(e->d_name);
        if (n < 0 || (n <= s->mine && n <= s->theirs))
            continue;
        char path[4400], settings[8192];
        snprintf(path, sizeof path, "%.4000s/%s", dir, e->d_name);
        int64_t step = 0;
        uint32_t format = 0;
        loom_ckpt_lineage l;
        int rc = loom_ckpt_lineage_of(path, &step, &format, &l, settings, sizeof settings);
        /* unfinished or damaged: no one's to resume, and replacing it loses nothing */
        if (rc != LOOM_OK && (rc != LOOM_ERR_NOT_SUPPORTED || !unrecorded))
            continue;
        if (rc == LOOM_OK && l.id == id) {
            s->mine = n > s->mine ? n : s->mine;
        } else if (n > s->theirs) {
            s->theirs = n;
            s->their_format = format;
            s->their_lineage = l;
            snprintf(s->their_settings, sizeof s->their_settings, "%s",
                     rc == LOOM_OK ? settings : "");
            s->their_lineage.settings = s->their_settings;
        }
    }
    if (d)
        closedir(d);
}

/* The value of name in "name=value" lines, its length in *len; NULL if absent. */
static const char *value_of(const char *text, const char *name, size_t name_len, size_t *len)
{
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line) : strlen(line);
        if (n > name_len && !strncmp(line, name, name_len) && line[name_len] == '=') {
            *len = n - name_len - 1;
            return line + name_len + 1;
        }
        line = end ? end + 1 : NULL;
    }
    return NULL;
}

/* How another lineage differs from this job's, in a few words. */
static void describe_difference(const trainer *t, const lineage_scan *s, char *buf, size_t cap)
{
    if (s->their_format < 4) {
        snprintf(buf, cap, "written by an older loom in checkpoint format %u, which records no "
                 "lineage", s->their_format);
        return;
    }
    snprintf(buf, cap, "lineage %016llx: ", (unsigned long long)s->their_lineage.id);
    size_t used = strlen(buf);
    buf += used;
    cap -= used;
    const char *theirs = s->their_settings, *mine = t->ckpt.trajectory;
    for (const char *line = theirs; *line;) {
        const char *eq = strchr(line, '='), *end = strchr(line, '\n');
        if (!eq || !end || eq > end)
            break;
        size_t name_len = (size_t)(eq - line), their_len = (size_t)(end - eq - 1), my_len = 0;
        const char *my = value_of(mine, line, name_len, &my_len);
        if (!my || my_len != their_len || strncmp(my, eq + 1, my_len) != 0) {
            snprintf(buf, cap, "%.*s = %.*s there, %.*s in this run", (int)name_len, line,
                     (int)their_len, eq + 1, my ? (int)my_len : 5, my ? my : "unset");
            return;
        }
        line = end + 1;
    }
    for (const char *line = mine; *line;) {
        const char *eq = strchr(line, '=');
        size_t len = 0;
        if (!eq)
            break;
        if (!value_of(theirs, line, (size_t)(eq - line), &len)) {
            snprintf(buf, cap, "%.*s in this run, unset there", (int)strcspn(line, "\n"), line);
            return;
        }
        line += strcspn(line, "\n") + (line[strcspn(line, "\n")] ? 1 : 0);
    }
    if (s->their_lineage.data_hash != t->ckpt.lineage.data_hash)
        snprintf(buf, cap, "its data.train files differ by name or length");
    else
        snprintf(buf, cap, "the same settings, but a line of runs started elsewhere");
}

int trainer_check_lineage(const trainer *t, const char *dir)
{
    lineage_scan *s = calloc(1, sizeof *s);
    if (!s)
        return loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory");
    /* a resume continues the run it names, which may predate lineages:
     * the older checkpoints beside it are likely that run's own */
    scan_lineages(dir, t->ckpt.lineage.id, !t->ckpt.resumed, s);
    int rc = LOOM_OK, overwrite = 0;
    loom_config_bool(t->job.cfg, "train.checkpoint_overwrite", &overwrite);
    if (s->theirs >= 0) {
        char why[700];
        describe_difference(t, s, why, sizeof why);
        if (overwrite) {
            printf("train.checkpoint_overwrite = true: '%s' holds step-%lld of another run "
                   "(%s); this run's checkpoints replace those of the same steps, and a restart "
                   "resumes only this run's\n", dir, s->theirs, why);
            fflush(stdout);
        } else {
            rc = loom_fail(LOOM_ERR_INVALID,
                           "%s: train.checkpoint_dir '%s' holds step-%lld of "
                           "another run (%s); use a new directory, --resume %s/step-%lld to "
                           "continue it, or set train.checkpoint_overwrite = true to replace it",
                           loom_config_where(t->job.cfg, "train.checkpoint_dir"), dir, s->theirs,
                           why, dir, s->theirs);
        }
    }
    free(s);
    return rc;
}

const char *trainer_restart_resume(const trainer *t, const char *asked, char *buf, size_t cap)
{
    const char *restart = getenv("LOOM_RESTART");
    if (!restart || atoi(restart) <= 0)
        return asked;
    const char *dir = "checkpoints";
    loom_config_string(t->job.cfg, "train.checkpoint_dir", &dir);
    lineage_scan *s = calloc(1, sizeof *s);
    if (s)
        scan_lineages(dir, t->ckpt.lineage.id, 0, s);
    const char *from = asked;
    if (s && s->mine >= 0) {
        snprintf(buf, cap, "%s/step-%lld", dir, s->mine);
        from = buf;
    }
    if (t->job.rank == 0) {
        char other[200] = "";
        if (s && s->theirs > (s->mine >= 0 ? s->mine : -1))
            snprintf(other, sizeof other, " (step-%lld there is another run's, lineage %016llx: "
                     "left alone)", s->theirs, (unsigned long long)s->their_lineage.id);
        printf("restart %s: %s%s%s\n", restart, from ? "resuming from " : "",
               from ? from : "no complete checkpoint of this run to resume from: starting over",
               other);
        fflush(stdout);
    }
    free(s);
    return from;
}
