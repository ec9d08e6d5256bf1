/* The numerics harness for plugin authors (cli/plugin_harness.h), and the
 * functional checks of a compute backend at the end of this file.
 *
 * Every run is this program itself, `loom launch -n N -- loom train CONFIG`
 * with --metrics and --save (llm.c weights, which the trainer consolidates
 * from any layout), its files in a directory of its own. The reference has
 * every parallel.*.size = 1 and the core's default plugin on the checked
 * axis; each checked run puts the plugin there at N ranks. With
 * --reference NAME each rank count has a reference of its own: NAME on the
 * axis at the same N, so that a schedule is compared with another schedule
 * of the same pipeline. The runs work in our working directory, so
 * relative paths in CONFIG mean what they mean to the author. */
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "loom/strategy.h"
#include "cli/plugin_harness.h"
#include "model/compute.h"
#include "model/formats.h"
#include "runtime/config.h"
#include "runtime/log.h"
#include "runtime/runtime.h"
#include "train/schedule.h"

/* The numerics contract (the README's Tests): an fp32 run at any rank count is the
 * single-rank run up to the order of its reductions, 1e-5 relative per
 * step in the loss. */
#define LOSS_TOLERANCE 1e-5
/* The gradient norm is a sum of squares of every gradient, more sensitive
 * to that order than the loss: correct strategies drift to 2e-5 over 60
 * steps of the tiny model. A strategy that sums instead of averaging, or
 * loses a unit's gradient, moves it by a factor, so 1e-4 loses nothing. */
#define NORM_TOLERANCE 1e-4

/* Final weights, per tensor: max |diff| over the reference tensor's largest
 * |value|. Where a gradient is zero in exact arithmetic (the attention key
 * bias: softmax ignores a shift of every key) Adam steps on rounding noise
 * alone, by up to lr |noise| / eps per step, so those elements differ
 * between correct runs by far more than the rest: 9e-4 of the tensor's
 * scale after 10 steps of the tiny model, 2.3e-3 after 60, everything else
 * below 1e-5. A strategy that drops or mis-slices a unit's gradient moves
 * whole tensors by about lr per step, tenths of their scale; 1e-2 tells
 * the two apart over the short runs the harness is for. */
#define WEIGHT_TOLERANCE 1e-2

/* With --tolerance REL a run is meant to be near the reference, not equal
 * to it, and only the loss is held to REL at every step: it is what such a
 * run promises (local SGD, DiLoCo, compressed gradients: the same training,
 * a little off). The grad norm is held to REL too, where it is the global
 * norm; a strategy that declares LOOM_STRATEGY_APPROXIMATE reports dp rank
 * 0's own norm (strategy.h), a gradient of its share of the batch on its
 * own replica, which differs from the single-rank norm by that share's
 * sampling noise whatever the strategy's error: its norm is reported,
 * not held. The final weights are reported, not
 * held: Adam moves every weight by up to lr a step whatever its gradient's
 * size, so a run a little off moves the weights whose gradients are near
 * zero by whole steps, and no bound on a tensor follows from REL on the
 * loss. */

#define MAX_RANK_COUNTS 16
#define RUN_ARGS (16 + 2 * 8) /* fixed words + --set pairs of our own */
#define DEFAULT_TIMEOUT_S 600.0
/* The drift table prints every step up to this many; past it, a sample
 * across the run and the worst steps. */
#define TABLE_ROWS 20

typedef struct step_record {
    double loss, grad_norm;
} step_record;

typedef struct run_result {
    step_record *steps;
    int nsteps;
    float *weights;
    loom_gpt2_shape shape;
} run_result;

/* What a run is held to, relative; 0: reported, not held. */
typedef struct bounds {
    double loss, norm, weights;
} bounds;

typedef struct harness {
    const loom_harness_options *o;
    const loom_plugin *plugin;
    char self[PATH_MAX];                 /* this program */
    char file[PATH_MAX];                 /* the plugin file, absolute */
    char dir[PATH_MAX];                  /* where the runs write */
    const char *size_key, *strategy_key; /* the axis's settings */
    char reference[PATH_MAX];            /* the reference's plugin for strategy_key */
    char ref_name[128];                  /* how lines name it: "single-rank", "1f1b" */
    char group[192];                     /* the plugin's settings group: "parallel.dp" */
    const char *label;                   /* "dp", "tp", ...: the line's "dp=2" */
    int schedule;                        /* a pipeline schedule: it runs at pp > 1 only */
    int approximate;                     /* declares LOOM_STRATEGY_APPROXIMATE */
    bounds bound;
    int ranks[MAX_RANK_COUNTS], nranks;
} harness;

/* ---- the runs ---- */

static void run_path(const harness *h, const char *name, const char *ext, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s.%s", h->dir, name, ext);
}

/* Print the last lines of a run's output, indented: what the run said,
 * not the command line run_training puts first. */
static void show_log_tail(const char *log_path, int lines)
{
    FILE *f = fopen(log_path, "r");
    if (!f)
        return;
    long starts[64];
    int count = 0, first = 1;
    char line[1024];
    long at = ftell(f);
    while (fgets(line, sizeof line, f)) {
        if (!(first && line[0] == '$'))
            starts[count++ % 64] = at;
        first = 0;
        at = ftell(f);
    }
    int show = count < lines ? count : lines;
    if (show == 0) {
        printf("    (no output)\n");
        fclose(f);
        return;
    }
    fseek(f, starts[(count - show) % 64], SEEK_SET);
    while (show-- > 0 && fgets(line, sizeof line, f))
        printf("    %s%s", line, strchr(line, '\n') ? "" : "\n");
    fclose(f);
}

/* A --set of the plugin's own settings ("parallel.dp.prefetch=2",
 * "comm.trace.file=t.json"), which the reference's plugin would refuse. A
 * wrapper communicator's settings of the backend it opens, comm.mpi.*,
 * are another group: the reference keeps them. */
static int plugin_setting(const harness *h, const char *set)
{
    size_t g = strlen(h->group), n = strcspn(set, "=");
    char path[256];
    if (!g || n <= g || strncmp(set, h->group, g) != 0 || set[g] != '.' || n >= sizeof path)
        return 0;
    memcpy(path, set, n);
    path[n] = '\0';
    return !loom_config_core_owns(path);
}

/* One run of `loom launch -n ranks -- loom train`, its output in NAME.log
 * after the command line itself. sets: "path=value" of our own, after the
 * author's (less the plugin's own settings for a reference). 0 when it
 * exited 0. */
static int run_training(const harness *h, const char *name, int ranks, int reference,
                        const char *const *sets, int nsets)
{
    char metrics[PATH_MAX + 16], weights[PATH_MAX + 16], log_path[PATH_MAX + 16];
    char nranks[16], timeout[32];
    run_path(h, name, "jsonl", metrics, sizeof metrics);
    run_path(h, name, "bin", weights, sizeof weights);
    run_path(h, name, "log", log_path, sizeof log_path);
    snprintf(nranks, sizeof nranks, "%d", ranks);
    snprintf(timeout, sizeof timeout, "%g",
             h->o->timeout_s > 0 ? h->o->timeout_s : DEFAULT_TIMEOUT_S);

    int cap = RUN_ARGS + 2 * h->o->noverrides + 2 * nsets;
    char **argv = calloc((size_t)cap, sizeof *argv);
    if (!argv)
        return -1;
    int n = 0;
    const char *fixed[] = {h->self, "launch", "-n", nranks, "--timeout", timeout, "--",
                           h->self, "train", h->o->config};
    for (size_t i = 0; i < LOOM_ARRAY_LEN(fixed); i++)
        argv[n++] = (char *)fixed[i];
    for (int i = 0; i < h->o->noverrides; i++) {
        if (reference && plugin_setting(h, h->o->overrides[i]))
            continue;
        argv[n++] = "--set";
        argv[n++] = (char *)h->o->overrides[i];
    }
    for (int i = 0; i < nsets; i++) {
        argv[n++] = "--set";
        argv[n++] = (char *)sets[i];
    }
    argv[n++] = "--metrics";
    argv[n++] = metrics;
    argv[n++] = "--save";
    argv[n++] = weights;
    argv[n] = NULL;

    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *log = fopen(log_path, "w");
        if (!log)
            _exit(127);
        /* what ran, for whoever reads the kept log */
        fputs("$", log);
        for (int i = 0; argv[i]; i++)
            fprintf(log, " %s", argv[i]);
        fputs("\n", log);
        fflush(log);
        if (dup2(fileno(log), 1) < 0 || dup2(fileno(log), 2) < 0)
            _exit(127);
        execv(h->self, argv);
        fprintf(stderr, "cannot run %s: %s\n", h->self, strerror(errno));
        _exit(127);
    }
    free(argv);
    int status = 0;
    if (pid < 0) {
        printf("  cannot start a run: fork: %s\n", strerror(errno));
        return -1;
    }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

/* The loss and grad norm of every line of a --metrics file. */
static int read_metrics(const char *path, run_result *r)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[8192];
    int cap = 0;
    while (fgets(line, sizeof line, f)) {
        const char *loss = strstr(line, "\"loss\": "), *norm = strstr(line, "\"grad_norm\": ");
        if (!loss || !norm)
            continue;
        if (r->nsteps == cap) {
            cap = cap ? 2 * cap : 64;
            step_record *grown = realloc(r->steps, (size_t)cap * sizeof *grown);
            if (!grown)
                break;
            r->steps = grown;
        }
        r->steps[r->nsteps++] = (step_record){strtod(loss + 8, NULL), strtod(norm + 13, NULL)};
    }
    fclose(f);
    return 0;
}

/* A finished run's metrics and weights; 1 (said) when they are not there. */
static int read_result(const harness *h, const char *who, const char *name, run_result *r)
{
    char path[PATH_MAX + 16];
    run_path(h, name, "jsonl", path, sizeof path);
    if (read_metrics(path, r) != 0 || r->nsteps == 0) {
        printf("%s: the run exited 0 but wrote no step to its --metrics file\n", who);
        return 1;
    }
    run_path(h, name, "bin", path, sizeof path);
    if (loom_checkpoint_read(path, NULL, &r->shape, &r->weights) != LOOM_OK) {
        printf("%s: its final weights: %s\n", who, loom_last_error());
        loom_clear_error();
        return 1;
    }
    return 0;
}

static void free_result(run_result *r)
{
    free(r->steps);
    free(r->weights);
    memset(r, 0, sizeof *r);
}

/* ---- comparing ---- */

static double relative(double got, double want)
{
    double scale = fabs(want) > 0 ? fabs(want) : 1.0;
    return fabs(got - want) / scale;
}

/* The largest relative difference of one quantity over the steps. */
typedef struct worst_drift {
    double relative; /* NaN is the worst there is */
    int step;        /* 1-based */
} worst_drift;

typedef struct step_drift {
    worst_drift loss, norm;
    int steps;  /* compared: both runs have them */
    int breach; /* the first step out of bounds, 1-based; 0: none */
} step_drift;

static void note_drift(worst_drift *w, double r, int step)
{
    if (!isnan(w->relative) && !(r <= w->relative)) {
        w->relative = r;
        w->step = step;
    }
}

static int out_of_bound(double r, double bound)
{
    return bound > 0 && !(r <= bound); /* NaN too */
}

/* Every step's loss and grad norm against the reference's, the worst of
 * each into d. The first step out of bounds is printed (1); 0 when every
 * step holds. */
static int compare_steps(const harness *h, const char *who, const run_result *got,
                         const run_result *ref, step_drift *d)
{
    memset(d, 0, sizeof *d);
    d->loss.relative = d->norm.relative = -1;
    int failed = 0;
    if (got->nsteps != ref->nsteps) {
        printf("%s: %d steps, the %s run %d\n", who, got->nsteps, h->ref_name, ref->nsteps);
        failed = 1;
    }
    d->steps = got->nsteps < ref->nsteps ? got->nsteps : ref->nsteps;
    for (int s = 0; s < d->steps; s++) {
        const char *what[2] = {"loss", "grad_norm"};
        double g[2] = {got->steps[s].loss, got->steps[s].grad_norm};
        double w[2] = {ref->steps[s].loss, ref->steps[s].grad_norm};
        worst_drift *worst[2] = {&d->loss, &d->norm};
        const double bound[2] = {h->bound.loss, h->bound.norm};
        for (int k = 0; k < 2; k++) {
            double r = relative(g[k], w[k]);
            note_drift(worst[k], r, s + 1);
            if (!failed && out_of_bound(r, bound[k])) {
                printf("%s: step %d %s %.7g vs %.7g %s (relative %.1e > %g)\n", who, s + 1, what[k],
                       g[k], w[k], h->ref_name, r, bound[k]);
                d->breach = s + 1;
                failed = 1;
            }
        }
    }
    return failed;
}

/* "3.2e-06 at step 7" */
static const char *drift_text(const worst_drift *w, char *buf, size_t cap)
{
    if (w->step && w->relative == 0)
        snprintf(buf, cap, "0, bitwise equal");
    else if (w->step)
        snprintf(buf, cap, "%.1e at step %d", w->relative, w->step);
    else
        snprintf(buf, cap, "no step");
    return buf;
}

/* One row of the drift table; '!' marks a drift out of bounds. */
static void print_drift_row(const harness *h, int s, const run_result *got, const run_result *ref,
                            const step_drift *d)
{
    const step_record *g = &got->steps[s], *w = &ref->steps[s];
    double rl = relative(g->loss, w->loss), rn = relative(g->grad_norm, w->grad_norm);
    int worst_loss = d->loss.step == s + 1, worst_norm = d->norm.step == s + 1;
    const char *worst = worst_loss && worst_norm ? "  worst loss and norm"
                        : worst_loss               ? "  worst loss"
                        : worst_norm               ? "  worst norm"
                                                   : "";
    printf("  %5d %11.7g %11.7g %8.1e%c %11.7g %11.7g %8.1e%s%s\n", s + 1, w->loss, g->loss, rl,
           out_of_bound(rl, h->bound.loss) ? '!' : ' ', w->grad_norm, g->grad_norm, rn,
           out_of_bound(rn, h->bound.norm) ? "!" : worst[0] ? " " : "", worst);
}

/* The drift at every step (a sample and the worst ones of a long run),
 * against the reference. */
static void print_drift_table(const harness *h, const run_result *got, const run_result *ref,
                              const step_drift *d)
{
    int n = d->steps;
    char *shown = calloc((size_t)n + 1, 1);
    if (!shown || n == 0) {
        free(shown);
        return;
    }
    int rows = 0;
    if (n <= TABLE_ROWS) {
        memset(shown, 1, (size_t)n);
    } else {
        int sample = TABLE_ROWS - 3; /* room for the worst two and the first breach */
        /* evenly spaced from the first step to the last */
        for (int i = 0; i < sample; i++)
            shown[(long)i * (n - 1) / (sample - 1)] = 1;
        if (d->loss.step)
            shown[d->loss.step - 1] = 1;
        if (d->norm.step)
            shown[d->norm.step - 1] = 1;
        if (d->breach)
            shown[d->breach - 1] = 1;
    }
    for (int s = 0; s < n; s++)
        rows += shown[s];
    printf("  %5s %11s %11s %9s %11s %11s %9s\n", "step", "ref loss", "run loss", "drift",
           "ref norm", "run norm", "drift");
    for (int s = 0; s < n; s++)
        if (shown[s])
            print_drift_row(h, s, got, ref, d);
    if (rows < n)
        printf("  (%d of %d steps: a sample, the worst and the first out of bounds; --keep DIR "
               "keeps every step's metrics)\n", rows, n);
    free(shown);
}

/* A tensor as the comparison names it: "wte", "lnfw", or one layer's
 * slice of a stacked one, "h.3.qkvw". */
typedef struct tensor_diff {
    char name[32];
    double relative; /* max |diff| / scale */
    double max_diff;
    size_t at;
    float got, want;
} tensor_diff;

static void diff_tensor(const float *got, const float *want, size_t n, tensor_diff *d)
{
    double scale = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(want[i]));
    d->max_diff = 0;
    d->at = 0;
    for (size_t i = 0; i < n; i++) {
        double diff = fabs((double)got[i] - want[i]);
        if (!(diff <= d->max_diff)) { /* the first NaN stays */
            d->max_diff = diff;
            d->at = i;
            if (isnan(diff))
                break;
        }
    }
    d->got = n ? got[d->at] : 0;
    d->want = n ? want[d->at] : 0;
    d->relative = d->max_diff / (scale > 0 ? scale : 1.0);
}

/* llm.c's tensors, the stacked ones per layer: the worst is printed, as a
 * divergence when it leaves the bound (1, with how many others do), else
 * as the margin (0); without a bound, as the drift (0). The worst, not the
 * first: one wrong tensor drags the rest a little, and the one it is about
 * stands out by its size. */
static int compare_weights(const harness *h, const char *indent, const run_result *got,
                           const run_result *ref)
{
    if (memcmp(&got->shape, &ref->shape, sizeof got->shape) != 0) {
        printf("%sfinal weights: the model's shape differs from the %s run's\n", indent,
               h->ref_name);
        return 1;
    }
    size_t sizes[LOOM_GPT2_TENSORS], base = 0;
    loom_gpt2_tensor_sizes(&ref->shape, sizes);
    int layers = ref->shape.layers, differ = 0;
    double bound = h->bound.weights;
    tensor_diff worst = {.relative = -1};
    for (int t = 0; t < LOOM_GPT2_TENSORS; t++) {
        /* wte, wpe and the final LayerNorm are whole; the rest hold a slice per layer */
        int stacked = t >= 2 && t < LOOM_GPT2_TENSORS - 2;
        int pieces = stacked ? layers : 1;
        size_t n = sizes[t] / (size_t)pieces;
        for (int l = 0; l < pieces; l++, base += n) {
            tensor_diff d;
            if (stacked)
                snprintf(d.name, sizeof d.name, "h.%d.%s", l, loom_gpt2_tensor_names[t]);
            else
                snprintf(d.name, sizeof d.name, "%s", loom_gpt2_tensor_names[t]);
            diff_tensor(got->weights + base, ref->weights + base, n, &d);
            differ += out_of_bound(d.relative, bound);
            if (!(d.relative <= worst.relative) && !isnan(worst.relative))
                worst = d; /* NaN is the worst there is */
        }
    }
    if (!(bound > 0)) {
        printf("%sweights drift up to %.1e of a tensor's scale (in %s; not held with "
               "--tolerance)\n", indent, worst.relative, worst.name);
        return 0;
    }
    if (!differ && worst.relative == 0) {
        printf("%sweights match (bitwise equal)\n", indent);
        return 0;
    }
    if (!differ) {
        printf("%sweights match (worst %.1e in %s)\n", indent, worst.relative, worst.name);
        return 0;
    }
    printf("%sfinal weights: %s differs, max |diff| %.1e at element %zu (%.7g vs %.7g "
           "%s; %.1e of the tensor's scale > %g)", indent, worst.name, worst.max_diff,
           worst.at, (double)worst.got, (double)worst.want, h->ref_name, worst.relative, bound);
    if (differ > 1)
        printf("; %d other tensor%s differ%s too", differ - 1, differ > 2 ? "s" : "",
               differ > 2 ? "" : "s");
    printf("\n");
    return 1;
}

/* A run against its reference: one line when it holds, else the first
 * step out of bounds; the worst drift of the loss, the norm and the
 * weights either way; with --tolerance the table. 1 when it fails. */
static int compare_run(const harness *h, const char *who, const run_result *got,
                       const run_result *ref)
{
    step_drift d;
    char loss[64], norm[64];
    int failed = compare_steps(h, who, got, ref, &d);
    drift_text(&d.loss, loss, sizeof loss);
    drift_text(&d.norm, norm, sizeof norm);
    if (failed) {
        printf("  worst drift: loss %s, grad norm %s\n", loss, norm);
        compare_weights(h, "  ", got, ref);
    } else if (!h->o->tolerance) {
        printf("%s: %d steps, losses match (worst %s), grad norms match (worst %s), ", who,
               d.steps, loss, norm);
        failed = compare_weights(h, "", got, ref);
    } else {
        printf("%s: %d steps, losses within %g (worst %s), ", who, d.steps, h->bound.loss, loss);
        if (h->bound.norm > 0)
            printf("grad norms within %g (worst %s), ", h->bound.norm, norm);
        else
            printf("grad norms not held (worst %s), ", norm);
        failed = compare_weights(h, "", got, ref);
    }
    if (h->o->tolerance)
        print_drift_table(h, got, ref, &d);
    return failed;
}

/* ---- setting up ---- */

static int parse_ranks(harness *h, const char *text)
{
    const char *p = text ? text : "1,2,4";
    h->nranks = 0;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 1 || v > 4096 || (*end && *end != ',') ||
            h->nranks == MAX_RANK_COUNTS) {
            fprintf(stderr, "loom plugins: --ranks '%s': want up to %d rank counts >= 1 "
                            "separated by commas, e.g. 1,2,4\n", text, MAX_RANK_COUNTS);
            return -1;
        }
        h->ranks[h->nranks++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (!h->nranks) {
        fprintf(stderr, "loom plugins: --ranks is empty; e.g. --ranks 1,2,4\n");
        return -1;
    }
    return 0;
}

/* Which settings put the plugin on its axis; its own settings' group. */
static int pick_axis(harness *h, const loom_plugin *p)
{
    static const char *const strategy_keys[LOOM_AXIS_COUNT] = {
        [LOOM_AXIS_TP] = "parallel.tp.strategy", [LOOM_AXIS_SP] = "parallel.sp.strategy",
        [LOOM_AXIS_PP] = "parallel.pp.schedule", [LOOM_AXIS_DP] = "parallel.dp.strategy"};
    static const char *const size_keys[LOOM_AXIS_COUNT] = {
        [LOOM_AXIS_TP] = "parallel.tp.size", [LOOM_AXIS_SP] = "parallel.sp.size",
        [LOOM_AXIS_PP] = "parallel.pp.size", [LOOM_AXIS_DP] = "parallel.dp.size"};
    h->schedule = p->kind == LOOM_PLUGIN_SCHEDULE;
    loom_plugin_settings_group(p, h->group, sizeof h->group);
    if (h->schedule ||
        (p->kind == LOOM_PLUGIN_STRATEGY && p->ops.strategy.axis < LOOM_AXIS_COUNT)) {
        loom_axis a = h->schedule ? LOOM_AXIS_PP : (loom_axis)p->ops.strategy.axis;
        h->label = loom_axis_name(a);
        h->size_key = size_keys[a];
        h->strategy_key = strategy_keys[a];
        return 0;
    }
    if (p->kind == LOOM_PLUGIN_COMM) {
        /* a communicator carries the data axis, the one every config can widen */
        h->label = "dp";
        h->size_key = size_keys[LOOM_AXIS_DP];
        h->strategy_key = "comm.default";
        return 0;
    }
    fprintf(stderr, "loom plugins: --train drives strategy, schedule and comm plugins; a %s "
                    "plugin gets the conformance checks only (drop --train)\n",
            loom_plugin_kind_name(p->kind));
    return -1;
}

/* What the runs are held to: the fp32 contract, or --tolerance. A strategy
 * that trains approximately on purpose cannot meet the contract, and
 * failing it for that would say nothing: it is refused without
 * --tolerance. */
static int pick_bounds(harness *h, const loom_plugin *p)
{
    h->approximate = p->kind == LOOM_PLUGIN_STRATEGY &&
                     (p->ops.strategy.capabilities & LOOM_STRATEGY_APPROXIMATE);
    double rel = h->o->tolerance;
    if (h->approximate && !(rel > 0)) {
        fprintf(stderr, "loom plugins: strategy %s declares LOOM_STRATEGY_APPROXIMATE (its "
                        "replicas differ on purpose, so it trains near the single-rank run, not "
                        "equal to it): give --tolerance REL, the relative drift of the loss to "
                        "allow at each step (e.g. 0.05)\n",
                p->header->name);
        return -1;
    }
    if (rel > 0)
        h->bound = (bounds){rel, h->approximate ? 0 : rel, 0};
    else
        h->bound = (bounds){LOSS_TOLERANCE, NORM_TOLERANCE, WEIGHT_TOLERANCE};
    return 0;
}

/* --reference NAME: a plugin of the checked one's kind and axis that
 * loads, found as the runs will find it (cfg's plugins.path). */
static int check_reference(harness *h, const loom_config *cfg)
{
    const loom_plugin *p = h->plugin;
    const char *name = h->o->reference;
    if (p->kind == LOOM_PLUGIN_COMM && !strcmp(name, "auto")) { /* the core's choice, no file */
        snprintf(h->ref_name, sizeof h->ref_name, "%s", name);
        return 0;
    }
    loom_search_path sp;
    loom_plugin *ref = NULL;
    int rc = loom_search_path_init(&sp, cfg);
    if (rc == LOOM_OK)
        rc = loom_plugin_load(&sp, p->kind, name, &ref);
    loom_search_path_free(&sp);
    if (rc != LOOM_OK) {
        fprintf(stderr, "loom plugins: --reference %s: %s\n", name, loom_last_error());
        return -1;
    }
    int axis_ok = p->kind != LOOM_PLUGIN_STRATEGY || ref->ops.strategy.axis == p->ops.strategy.axis;
    if (!axis_ok)
        fprintf(stderr, "loom plugins: --reference %s: a strategy of the %s axis; %s is of the "
                        "%s axis: name one of its axis\n",
                name, loom_axis_name((loom_axis)ref->ops.strategy.axis), p->header->name,
                h->label);
    else
        snprintf(h->ref_name, sizeof h->ref_name, "%s", ref->header->name);
    loom_plugin_unload(ref);
    return axis_ok ? 0 : -1;
}

/* The config must load, and be fp32 unless --tolerance: the contract's
 * bound is fp32's. The reference run puts the core's default plugin on the
 * axis (a config of defaults says which), so the plugin is never its own
 * reference; or the plugin --reference names. */
static int check_config(harness *h, const loom_harness_options *o)
{
    loom_config *cfg = NULL;
    const char *reference = NULL;
    if (loom_config_load(NULL, NULL, 0, &cfg) != LOOM_OK ||
        loom_config_string(cfg, h->strategy_key, &reference) != LOOM_OK) {
        fprintf(stderr, "loom plugins: %s\n", loom_last_error());
        loom_config_free(cfg);
        return -1;
    }
    snprintf(h->reference, sizeof h->reference, "%s", o->reference ? o->reference : reference);
    snprintf(h->ref_name, sizeof h->ref_name, "single-rank");
    loom_config_free(cfg);
    cfg = NULL;
    if (loom_config_load(o->config, o->overrides, o->noverrides, &cfg) != LOOM_OK) {
        fprintf(stderr, "loom plugins: %s\n", loom_last_error());
        return -1;
    }
    const char *precision = "fp32";
    loom_config_string(cfg, "train.precision", &precision);
    int ok = !strcmp(precision, "fp32") || o->tolerance > 0;
    if (!ok)
        fprintf(stderr, "loom plugins: %s: train.precision = %s; the harness holds runs to "
                        "fp32's contract (1e-5 relative per step), which 16-bit rounding "
                        "breaks by design: check with --set train.precision=fp32, or give "
                        "--tolerance REL\n",
                loom_config_where(cfg, "train.precision"), precision);
    if (ok && o->reference)
        ok = check_reference(h, cfg) == 0;
    loom_config_free(cfg);
    return ok ? 0 : -1;
}

static int make_dir(harness *h)
{
    if (h->o->keep) {
        if (mkdir(h->o->keep, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, "loom plugins: --keep %s: %s\n", h->o->keep, strerror(errno));
            return -1;
        }
        if (!realpath(h->o->keep, h->dir)) {
            fprintf(stderr, "loom plugins: --keep %s: %s\n", h->o->keep, strerror(errno));
            return -1;
        }
        return 0;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(h->dir, sizeof h->dir, "%s/loom-harness-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(h->dir)) {
        fprintf(stderr, "loom plugins: cannot make a directory for the runs (%s): %s\n", h->dir,
                strerror(errno));
        return -1;
    }
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

/* ---- a schedule's shapes ---- */

static int append_action(void *builder, int pp_rank, loom_action action)
{
    return loom_schedule_append(builder, pp_rank, action);
}

/* Whether the schedule refuses to build lists for `stages` pipeline ranks
 * of the config's virtual stages and micro-batches, as the trainer would
 * ask it: 1 with its reason in why. Anything else that goes wrong here is
 * left to the run to say. */
static int schedule_refuses(const harness *h, int stages, char *why, size_t cap)
{
    char schedule[PATH_MAX + 32];
    snprintf(schedule, sizeof schedule, "parallel.pp.schedule=%s", h->file);
    const char **sets = calloc((size_t)h->o->noverrides + 1, sizeof *sets);
    if (!sets)
        return 0;
    for (int i = 0; i < h->o->noverrides; i++)
        sets[i] = h->o->overrides[i];
    sets[h->o->noverrides] = schedule;
    loom_config *cfg = NULL;
    loom_runtime *rt = NULL;
    const loom_host *host = NULL;
    int refused = 0;
    int64_t virtual_stages = 1, micro = 1;
    if (loom_config_load(h->o->config, sets, h->o->noverrides + 1, &cfg) == LOOM_OK &&
        loom_config_int(cfg, "parallel.pp.virtual_stages", &virtual_stages) == LOOM_OK &&
        loom_config_int(cfg, "parallel.pp.microbatches", &micro) == LOOM_OK &&
        loom_runtime_create(cfg, &rt) == LOOM_OK &&
        loom_runtime_host(rt, h->plugin, "parallel.pp", &host) == LOOM_OK) {
        loom_schedule s;
        if (loom_schedule_init(&s, h->plugin->header->name, stages, (int)virtual_stages,
                               (int)micro) == LOOM_OK) {
            loom_pipeline_shape shape = {.stages = stages, .virtual_stages = (int)virtual_stages,
                                         .microbatches = (int)micro, .builder = &s,
                                         .emit = append_action};
            loom_clear_error();
            if (loom_plugin_schedule_build(h->plugin, host, &shape) != LOOM_OK) {
                refused = 1;
                snprintf(why, cap, "%s",
                         *loom_last_error() ? loom_last_error() : "(it said nothing)");
            }
            loom_schedule_free(&s);
        }
    }
    loom_clear_error();
    loom_runtime_destroy(rt);
    loom_config_free(cfg);
    free(sets);
    return refused;
}

/* ---- the harness ---- */

/* Every parallel size 1 but the checked axis's, ranks there, so the run is
 * that plugin (or the reference's) alone against the same job. */
static int run_sets(const harness *h, int ranks, int reference, char own[][PATH_MAX + 64],
                    const char **sets)
{
    static const char *const sizes[] = {"parallel.tp.size", "parallel.sp.size",
                                        "parallel.pp.size", "parallel.dp.size"};
    int n = 0;
    for (size_t i = 0; i < LOOM_ARRAY_LEN(sizes); i++) {
        snprintf(own[n], sizeof own[n], "%s=%d", sizes[i],
                 !strcmp(sizes[i], h->size_key) ? ranks : 1);
        sets[n] = own[n];
        n++;
    }
    snprintf(own[n], sizeof own[n], "%s=%s", h->strategy_key, reference ? h->reference : h->file);
    sets[n] = own[n];
    return n + 1;
}

static int failed_run(const harness *h, const char *who, const char *name)
{
    char log_path[PATH_MAX + 16];
    run_path(h, name, "log", log_path, sizeof log_path);
    if (h->o->keep)
        printf("%s: the run failed; the end of %s:\n", who, log_path);
    else
        printf("%s: the run failed; the end of its output (--keep DIR keeps it all):\n", who);
    show_log_tail(log_path, 12);
    return 1;
}

/* One run at `ranks` on the axis, of the plugin or the reference, read
 * back into r; 1 (said) when it fails or leaves nothing to compare. */
static int run_once(const harness *h, const char *who, const char *name, int ranks,
                    int reference, run_result *r)
{
    char own[8][PATH_MAX + 64];
    const char *sets[8];
    memset(r, 0, sizeof *r);
    int nsets = run_sets(h, ranks, reference, own, sets);
    if (run_training(h, name, ranks, reference, sets, nsets) != 0)
        return failed_run(h, who, name);
    return read_result(h, who, name, r);
}

/* The first line: what runs against what, and what it is held to. */
static void print_plan(const harness *h)
{
    const loom_harness_options *o = h->o;
    printf("numerics: %s as %s at %s", h->plugin->header->name, h->strategy_key, h->size_key);
    for (int i = 0; i < h->nranks; i++)
        printf("%s%d", i ? ", " : " ", h->ranks[i]);
    if (o->reference)
        printf(", against %s with %s = %s at the same %s\n", o->config, h->strategy_key,
               h->reference, h->size_key);
    else
        printf(", against %s on one rank with %s = %s\n", o->config, h->strategy_key,
               h->reference);
    if (o->tolerance > 0)
        printf("held to --tolerance %g: the loss at every step%s; the final weights are "
               "reported\n", o->tolerance,
               h->approximate ? " (the strategy declares LOOM_STRATEGY_APPROXIMATE: its grad "
                                "norm is dp rank 0's own, reported)"
                              : " and the grad norm");
}

/* A rank count that runs nothing, with why, for the last line. */
static void note_unchecked(char *notes, size_t cap, const char *who, const char *why)
{
    size_t used = strlen(notes);
    snprintf(notes + used, cap - used, "%s%s (%s)", used ? ", " : "", who, why);
}

int loom_plugin_harness(const loom_plugin *plugin, const loom_harness_options *o)
{
    harness h;
    memset(&h, 0, sizeof h);
    h.o = o;
    h.plugin = plugin;
    if (parse_ranks(&h, o->ranks) != 0 || pick_axis(&h, plugin) != 0 ||
        pick_bounds(&h, plugin) != 0 || check_config(&h, o) != 0)
        return 2;
    if (!realpath("/proc/self/exe", h.self) || !realpath(plugin->path, h.file)) {
        fprintf(stderr, "loom plugins: cannot find this program or %s: %s\n", plugin->path,
                strerror(errno));
        return 2;
    }
    if (make_dir(&h) != 0)
        return 2;
    print_plan(&h);

    int failures = 0, checked = 0, have_single = 0;
    char unchecked[1024] = "";
    run_result single;
    memset(&single, 0, sizeof single);
    for (int i = 0; failures >= 0 && i < h.nranks; i++) {
        int ranks = h.ranks[i];
        char who[32], name[32], why[768];
        snprintf(who, sizeof who, "%s=%d", h.label, ranks);
        snprintf(name, sizeof name, "%s%d", h.label, ranks);
        if (h.schedule && ranks == 1) {
            /* the trainer loads parallel.pp.schedule only at parallel.pp.size > 1 */
            printf("%s: skipped: a pipeline of one stage runs no schedule\n", who);
            note_unchecked(unchecked, sizeof unchecked, who, "one stage runs no schedule");
            continue;
        }
        if (h.schedule && schedule_refuses(&h, ranks, why, sizeof why)) {
            printf("%s: the schedule refused this shape: %s\n", who, why);
            note_unchecked(unchecked, sizeof unchecked, who, "the schedule refused the shape");
            continue;
        }
        checked++;
        run_result ref_here, got;
        const run_result *ref = &single;
        if (o->reference) {
            char ref_who[192], ref_file[48];
            snprintf(ref_who, sizeof ref_who, "%s reference (%s)", who, h.ref_name);
            snprintf(ref_file, sizeof ref_file, "%s-reference", name);
            if (run_once(&h, ref_who, ref_file, ranks, 1, &ref_here)) {
                printf("%s: not checked: its reference fails (the config or %s, not the "
                       "plugin)\n", who, h.ref_name);
                free_result(&ref_here);
                failures++;
                continue;
            }
            ref = &ref_here;
        } else if (!have_single) {
            if (run_once(&h, "single-rank reference", "single", 1, 1, &single)) {
                printf("no run checked: the reference itself fails (the config, not the "
                       "plugin)\n");
                failures = -1;
                break;
            }
            have_single = 1;
        }
        if (run_once(&h, who, name, ranks, 0, &got))
            failures++;
        else
            failures += compare_run(&h, who, &got, ref);
        free_result(&got);
        if (o->reference)
            free_result(&ref_here);
    }
    free_result(&single);
    if (o->keep)
        printf("the runs' logs, metrics and weights are in %s\n", h.dir);
    else
        nftw(h.dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (failures > 0 && o->reference)
        printf("%d of %d runs diverge from %s at the same %s or fail\n", failures, checked,
               h.ref_name, h.size_key);
    else if (failures > 0)
        printf("%d of %d runs diverge from the single-rank run or fail\n", failures, checked);
    else if (failures == 0 && !checked)
        printf("no rank count checked: %s\n", unchecked);
    else if (failures == 0 && unchecked[0])
        printf("numerics hold at every rank count run; not run: %s\n", unchecked);
    else if (failures == 0)
        printf("numerics hold at every rank count\n");
    return failures || !checked ? 1 : 0;
}

/* ---- the compute check of `loom plugins --check` ---- */

/* What a compute backend's check holds: the backend, the built-in cpu
 * backend it is compared with, and where the checks are reported. */
typedef struct compute_check {
    const loom_compute_ops *vt, *cpu;
    loom_compute *self, *ref;
    loom_check_report report;
    void *ctx;
} compute_check;

static void compute_passed(compute_check *cc, const char *check)
{
    cc->report(cc->ctx, check, NULL);
}

static void compute_failed(compute_check *cc, const char *check, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void compute_failed(compute_check *cc, const char *check, const char *fmt, ...)
{
    char why[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    cc->report(cc->ctx, check, why);
}

/* A backend call that failed: its status and the detail it recorded. */
static void compute_call_failed(compute_check *cc, const char *check, const char *call, int rc)
{
    const char *detail = loom_last_error();
    compute_failed(cc, check, "%s returned %d (%s)%s%s", call, rc, loom_status_string(rc),
                   detail[0] ? ": " : "", detail);
    loom_clear_error();
}

/* Bytes that cross a page and end at an odd offset, for the round trip; the
 * kernels' arrays are each under SLOT_BYTES, one slot apiece after them. */
enum { ROUND_TRIP_BYTES = 2 * 4096 + 100, SLOT_BYTES = 256, SLOTS = 10 };
#define FIRST_SLOT ((ROUND_TRIP_BYTES + SLOT_BYTES - 1) / SLOT_BYTES * SLOT_BYTES)
#define SLOT_AT(base, i) ((void *)((char *)(base) + FIRST_SLOT + (size_t)(i)*SLOT_BYTES))
#define BLOCK_BYTES (FIRST_SLOT + SLOTS * SLOT_BYTES)

/* Memory of the backend: its own, or for a host-tier backend that leaves
 * that to the core, host memory aligned as alloc's would be. */
static int compute_alloc(compute_check *cc, size_t bytes, void **out)
{
    *out = NULL;
    if (cc->vt->alloc)
        return cc->vt->alloc(cc->self, bytes, out);
    if (posix_memalign(out, 256, bytes))
        return LOOM_ERR_NO_MEMORY;
    memset(*out, 0, bytes);
    return LOOM_OK;
}

static int compute_free(compute_check *cc, void *p)
{
    if (cc->vt->free)
        return cc->vt->free(cc->self, p);
    free(p);
    return LOOM_OK;
}

/* A fresh block reads back zero; bytes sent to it read back the same; copy
 * and zero within it do what they say. */
static void check_compute_memory(compute_check *cc, void *block)
{
    const loom_compute_ops *vt = cc->vt;
    unsigned char *src = malloc(ROUND_TRIP_BYTES), *dst = malloc(ROUND_TRIP_BYTES);
    if (!src || !dst) {
        compute_failed(cc, "to_device and to_host", "out of host memory for the check itself");
        goto out;
    }
    int rc = LOOM_OK;
    size_t i = 0;
    if (vt->alloc) {
        rc = vt->to_host(cc->self, dst, block, ROUND_TRIP_BYTES);
        while (rc == LOOM_OK && i < ROUND_TRIP_BYTES && dst[i] == 0)
            i++;
        if (rc != LOOM_OK)
            compute_call_failed(cc, "alloc zeroes", "to_host", rc);
        else if (i < ROUND_TRIP_BYTES)
            compute_failed(cc, "alloc zeroes", "byte %zu of a new block is %u; alloc must zero "
                           "the memory it gives", i, dst[i]);
        else
            compute_passed(cc, "alloc zeroes");
    }

    for (i = 0; i < ROUND_TRIP_BYTES; i++)
        src[i] = (unsigned char)(i * 131u + 7u);
    memset(dst, 0, ROUND_TRIP_BYTES);
    rc = vt->to_device(cc->self, block, src, ROUND_TRIP_BYTES);
    if (rc == LOOM_OK)
        rc = vt->to_host(cc->self, dst, block, ROUND_TRIP_BYTES);
    for (i = 0; rc == LOOM_OK && i < ROUND_TRIP_BYTES && src[i] == dst[i];)
        i++;
    if (rc != LOOM_OK)
        compute_call_failed(cc, "to_device and to_host", "to_device or to_host", rc);
    else if (i < ROUND_TRIP_BYTES)
        compute_failed(cc, "to_device and to_host", "byte %zu reads back %u, %u was sent", i,
                       dst[i], src[i]);
    else
        compute_passed(cc, "to_device and to_host");

    /* 200 bytes from an odd offset into a slot, then the slot zeroed */
    void *slot = SLOT_AT(block, 0);
    memset(dst, 0xff, SLOT_BYTES);
    rc = vt->copy(cc->self, slot, (char *)block + 33, 200);
    if (rc == LOOM_OK)
        rc = vt->to_host(cc->self, dst, slot, 200);
    if (rc != LOOM_OK)
        compute_call_failed(cc, "copy", "copy or to_host", rc);
    else if (memcmp(dst, src + 33, 200))
        compute_failed(cc, "copy", "the bytes copied read back different");
    else
        compute_passed(cc, "copy");
    rc = vt->zero(cc->self, slot, 200);
    if (rc == LOOM_OK)
        rc = vt->to_host(cc->self, dst, slot, 200);
    for (i = 0; rc == LOOM_OK && i < 200 && dst[i] == 0;)
        i++;
    if (rc != LOOM_OK)
        compute_call_failed(cc, "zero", "zero or to_host", rc);
    else if (i < 200)
        compute_failed(cc, "zero", "byte %zu reads back %u after zero", i, dst[i]);
    else
        compute_passed(cc, "zero");
out:
    free(src);
    free(dst);
}

/* The numerics contract between backends: 1e-5 of the largest value. */
#define COMPUTE_TOLERANCE 1e-5

/* An op's output (got, brought back to the host) against the cpu
 * backend's (want): the same bits pass; a difference within the numerics
 * contract passes with a note; more fails, naming the op and the element. */
static int compare_with_cpu(compute_check *cc, const char *op, const char *what,
                            const float *got, const float *want, size_t n)
{
    if (!memcmp(got, want, n * sizeof *got))
        return 0;
    double scale = 0, worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(want[i]));
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= worst)) {
            worst = d;
            at = i;
        }
    }
    if (worst <= COMPUTE_TOLERANCE * scale) {
        printf("note: %s: %s is not the cpu backend's bits (largest difference %.1e of the "
               "largest value), within the numerics contract's %.0e\n", op, what,
               scale > 0 ? worst / scale : worst, COMPUTE_TOLERANCE);
        return 0;
    }
    compute_failed(cc, op, "%s[%zu] = %.9g, the cpu backend's is %.9g", what, at, (double)got[at],
                   (double)want[at]);
    return 1;
}

enum { GEMM_M = 4, GEMM_N = 5, GEMM_K = 6, LN_N = 3, LN_C = 8 };

/* One f32 product, (M, K) * (K, N), of values whose products and sums are
 * all exact, so any order of summation gives the cpu backend's bits. */
static void check_compute_gemm(compute_check *cc, void *block)
{
    float a[GEMM_M * GEMM_K], b[GEMM_K * GEMM_N], got[GEMM_M * GEMM_N], want[GEMM_M * GEMM_N];
    for (int i = 0; i < GEMM_M * GEMM_K; i++)
        a[i] = (float)((i * 7) % 9 - 4) * 0.25f;
    for (int i = 0; i < GEMM_K * GEMM_N; i++)
        b[i] = (float)((i * 5) % 7 - 3) * 0.5f;
    memset(want, 0, sizeof want);
    loom_compute_operand ha = {a, LOOM_F32, GEMM_K, 0}, hb = {b, LOOM_F32, GEMM_N, 0};
    int rc = cc->cpu->gemm(cc->ref, want, GEMM_N, GEMM_M, GEMM_N, GEMM_K, ha, hb, 1.0f, 0.0f,
                           LOOM_F32, 1, 0, 0, 0);
    if (rc != LOOM_OK) {
        compute_call_failed(cc, "gemm", "the cpu backend's gemm", rc);
        return;
    }
    void *da = SLOT_AT(block, 1), *db = SLOT_AT(block, 2), *dout = SLOT_AT(block, 3);
    rc = cc->vt->to_device(cc->self, da, a, sizeof a);
    if (rc == LOOM_OK)
        rc = cc->vt->to_device(cc->self, db, b, sizeof b);
    if (rc != LOOM_OK) {
        compute_call_failed(cc, "gemm", "to_device", rc);
        return;
    }
    loom_compute_operand oa = {da, LOOM_F32, GEMM_K, 0}, ob = {db, LOOM_F32, GEMM_N, 0};
    rc = cc->vt->gemm(cc->self, dout, GEMM_N, GEMM_M, GEMM_N, GEMM_K, oa, ob, 1.0f, 0.0f,
                      LOOM_F32, 1, 0, 0, 0);
    if (rc == LOOM_OK)
        rc = cc->vt->to_host(cc->self, got, dout, sizeof got);
    if (rc != LOOM_OK)
        compute_call_failed(cc, "gemm", "gemm or to_host", rc);
    else if (!compare_with_cpu(cc, "gemm", "out", got, want, GEMM_M * GEMM_N))
        compute_passed(cc, "gemm");
}

static void check_compute_layernorm(compute_check *cc, void *block)
{
    enum { ROWS = LN_N * LN_C };
    float inp[ROWS], w[LN_C], bias[LN_C];
    float out[ROWS], mean[LN_N], rstd[LN_N], got_out[ROWS], got_mean[LN_N], got_rstd[LN_N];
    for (int i = 0; i < ROWS; i++)
        inp[i] = (float)((i * 11) % 13) * 0.37f - 1.5f;
    for (int i = 0; i < LN_C; i++) {
        w[i] = 1.0f + 0.125f * (float)i;
        bias[i] = 0.0625f * (float)(i - 3);
    }
    int rc = cc->cpu->layernorm_forward(cc->ref, out, mean, rstd, inp, w, bias, LN_N, LN_C);
    if (rc != LOOM_OK) {
        compute_call_failed(cc, "layernorm_forward", "the cpu backend's layernorm_forward", rc);
        return;
    }
    void *dinp = SLOT_AT(block, 4), *dw = SLOT_AT(block, 5), *dbias = SLOT_AT(block, 6);
    void *dout = SLOT_AT(block, 7), *dmean = SLOT_AT(block, 8), *drstd = SLOT_AT(block, 9);
    rc = cc->vt->to_device(cc->self, dinp, inp, sizeof inp);
    if (rc == LOOM_OK)
        rc = cc->vt->to_device(cc->self, dw, w, sizeof w);
    if (rc == LOOM_OK)
        rc = cc->vt->to_device(cc->self, dbias, bias, sizeof bias);
    if (rc != LOOM_OK) {
        compute_call_failed(cc, "layernorm_forward", "to_device", rc);
        return;
    }
    rc = cc->vt->layernorm_forward(cc->self, dout, dmean, drstd, dinp, dw, dbias, LN_N, LN_C);
    if (rc == LOOM_OK)
        rc = cc->vt->to_host(cc->self, got_out, dout, sizeof got_out);
    if (rc == LOOM_OK)
        rc = cc->vt->to_host(cc->self, got_mean, dmean, sizeof got_mean);
    if (rc == LOOM_OK)
        rc = cc->vt->to_host(cc->self, got_rstd, drstd, sizeof got_rstd);
    if (rc != LOOM_OK)
        compute_call_failed(cc, "layernorm_forward", "layernorm_forward or to_host", rc);
    else if (!compare_with_cpu(cc, "layernorm_forward", "out", got_out, out, ROWS) &&
             !compare_with_cpu(cc, "layernorm_forward", "mean", got_mean, mean, LN_N) &&
             !compare_with_cpu(cc, "layernorm_forward", "rstd", got_rstd, rstd, LN_N))
        compute_passed(cc, "layernorm_forward");
}

/* Whether the backend can run here: a probe that declines is a note, and
 * the functional checks are skipped. */
static int compute_probe(compute_check *cc, const loom_plugin *p, const loom_host *host)
{
    if (!cc->vt->probe)
        return 1;
    char why[512] = "";
    if (cc->vt->probe(host, why, sizeof why) != LOOM_OK) {
        printf("note: probe: %s cannot run here: %s\n", p->header->name,
               why[0] ? why : "(it said nothing)");
        printf("note: functional checks skipped: run --check where the backend can run\n");
        loom_clear_error();
        return 0;
    }
    compute_passed(cc, "probe");
    return 1;
}

static void check_compute_describe(compute_check *cc)
{
    char line[512] = "";
    int rc = cc->vt->describe(cc->self, line, sizeof line);
    if (rc != LOOM_OK) {
        compute_call_failed(cc, "describe", "describe", rc);
    } else if (!line[0] || strchr(line, '\n')) {
        compute_failed(cc, "describe", "want one line, got \"%s\"", line);
    } else {
        compute_passed(cc, "describe");
        printf("note: describe: %s\n", line);
    }
}

/* A block of the backend's memory, the copies, a product and a LayerNorm
 * on it, and the block given back. */
static void check_compute_block(compute_check *cc)
{
    const loom_compute_ops *vt = cc->vt;
    void *block = NULL;
    int rc = compute_alloc(cc, BLOCK_BYTES, &block);
    if (!vt->alloc)
        printf("note: alloc and free are the core's: host memory\n");
    if (rc != LOOM_OK || !block) {
        if (rc == LOOM_OK)
            compute_failed(cc, "alloc", "returned ok but no memory");
        else
            compute_call_failed(cc, "alloc", "alloc", rc);
        return;
    }
    if ((uintptr_t)block % 256) {
        compute_failed(cc, "alloc", "%p is not aligned to 256 bytes", block);
    } else {
        if (vt->alloc)
            compute_passed(cc, "alloc");
        check_compute_memory(cc, block);
        check_compute_gemm(cc, block);
        check_compute_layernorm(cc, block);
    }
    if ((rc = vt->synchronize(cc->self)) != LOOM_OK)
        compute_call_failed(cc, "synchronize", "synchronize", rc);
    else
        compute_passed(cc, "synchronize");
    if ((rc = vt->status(cc->self)) != LOOM_OK)
        compute_call_failed(cc, "status", "status", rc);
    else
        compute_passed(cc, "status");
    if ((rc = compute_free(cc, block)) != LOOM_OK)
        compute_call_failed(cc, "free", "free", rc);
    else if (vt->free)
        compute_passed(cc, "free");
}

void loom_compute_check(const loom_plugin *p, const loom_host *host, loom_check_report report,
                        void *ctx)
{
    compute_check cc = {&p->ops.compute, &loom_compute_cpu, NULL, NULL, report, ctx};
    const loom_compute_ops *vt = cc.vt;
    printf("note: its memory is accounted in the %s tier and is %s memory to communicators\n",
           loom_tier_name((loom_tier)vt->tier), vt->mem_kind == LOOM_MEM_DEVICE ? "device"
                                                                                 : "host");
    if (!compute_probe(&cc, p, host))
        return;
    loom_compute_setup setup = {.struct_size = sizeof setup, .device = 0, .threads = 1,
                                .precision = LOOM_F32, .deterministic = 1,
                                .cpu = &loom_compute_cpu};
    int rc = vt->create(host, &setup, &cc.self);
    if (rc != LOOM_OK || !cc.self) {
        if (rc == LOOM_OK)
            compute_failed(&cc, "create", "returned ok but no backend");
        else
            compute_call_failed(&cc, "create", "create", rc);
        return;
    }
    compute_passed(&cc, "create");
    rc = loom_compute_cpu.create(host, &setup, &cc.ref);
    if (rc != LOOM_OK) {
        compute_call_failed(&cc, "cpu backend", "the cpu backend's create", rc);
        vt->destroy(cc.self);
        return;
    }
    check_compute_describe(&cc);
    check_compute_block(&cc);
    loom_compute_cpu.destroy(cc.ref);
    rc = vt->destroy(cc.self);
    if (rc != LOOM_OK)
        compute_call_failed(&cc, "destroy", "destroy", rc);
    else
        compute_passed(&cc, "destroy");
}
