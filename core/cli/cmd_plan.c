/* `loom plan CONFIG [--cluster FILE] [--set path=value ...] [--json FILE]
 * [--search]`: what the job the config describes will hold, move and take
 * per step on a cluster, before it runs (plan/plan.h). One process: no
 * ranks, no data, no model weights. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loom/status.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/plan_calibrate.h"
#include "model/compute.h"
#include "runtime/config.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/runtime.h"
#include "plan/plan.h"
#include "train/schedule.h"

static const char plan_usage[] =
    "usage: loom plan CONFIG [--cluster FILE] [--set path=value ...] [--json FILE] [--search [--top N]]\n"
    "       loom plan --calibrate FILE [--device NAME] [--reference CONFIG] [--data SHARD] [--ranks N]\n";

/* The reference job whose measured step fits the non-GEMM kernels' rate
 * (tests/zero/tiny.cfg's model: small enough that they dominate). */
static const char reference_config[] =
    "model = { layers = 2; heads = 4; channels = 64; vocab = 256; padded_vocab = 256; max_seq = 64; };\n"
    "train = { batch = 12; seq = 32; steps = 30; lr = 1e-3; };\n";

/* `loom plan --calibrate FILE [--device NAME] [--reference CONFIG] [--data
 * SHARD] [--ranks N]`: this machine's cores, memory, the matrix products'
 * and memcpy's rates, `loom bench`'s collectives at 2 and 4 ranks (up to
 * N), and the non-GEMM kernels' rate from one rank of a reference job
 * (CONFIG, else tiny.cfg's model on SHARD: a token shard,
 * examples/data/corpus.bin). --device: the ranks compute on that backend
 * ("cuda", "sim"; "auto": cuda where it runs, else the CPU), which gives
 * the peaks, the memory roof and the reference run. */
static int calibrate(int argc, char **argv)
{
    const char *out = argc > 2 ? argv[2] : NULL, *data = NULL, *device = NULL;
    const char *reference = NULL;
    int ranks = 4;
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--data") && i + 1 < argc)
            data = argv[++i];
        else if (!strcmp(argv[i], "--ranks") && i + 1 < argc)
            ranks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            device = argv[++i];
        else if (!strcmp(argv[i], "--reference") && i + 1 < argc)
            reference = argv[++i];
        else
            out = NULL;
    }
    if (!out || out[0] == '-' || ranks < 2 || (device && !device[0])) {
        fprintf(stderr, "%s", plan_usage);
        return 2;
    }
    /* the built-in reference trains on a shard; a config of one's own
     * names its data, or --data does */
    if (!reference && !data)
        data = "examples/data/corpus.bin";
    if (data && access(data, R_OK) != 0) {
        fprintf(stderr, "loom plan --calibrate: the reference job's data %s: %s; name a token shard "
                "with --data SHARD (examples/data/corpus.bin in loom's source tree)\n", data,
                strerror(errno));
        return 1;
    }
    if (reference && access(reference, R_OK) != 0) {
        fprintf(stderr, "loom plan --calibrate: --reference %s: %s; name a config of one rank "
                "(e.g. one scripts/bench-gpu.sh writes)\n", reference, strerror(errno));
        return 1;
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, "loom plan --calibrate: cannot find this program: %s\n", strerror(errno));
        return 1;
    }
    exe[n] = '\0';
    char config[] = "/tmp/loom-calibrate-XXXXXX";
    if (!reference) {
        int fd = mkstemp(config);
        if (fd < 0 || write(fd, reference_config, sizeof reference_config - 1) !=
                          (ssize_t)(sizeof reference_config - 1)) {
            fprintf(stderr, "loom plan --calibrate: cannot write the reference config: %s\n",
                    strerror(errno));
            if (fd >= 0)
                close(fd);
            return 1;
        }
        close(fd);
    }
    char set[4200], device_set[64] = "";
    const char *sets[2];
    int nsets = 0;
    if (data) {
        snprintf(set, sizeof set, "data.train=%s", data);
        sets[nsets++] = set;
    }
    const char *ref = reference ? reference : config;
    char opened[32] = "cpu";
    loom_plan_calibration *cal = calloc(1, sizeof *cal);
    int rc = !cal ? loom_fail(LOOM_ERR_NO_MEMORY, "plan: out of memory")
             : device && strcmp(device, "cpu")
                 ? loom_plan_calibrate_device(exe, ranks, device, ref, sets, nsets, stdout, cal,
                                              opened, sizeof opened)
                 : loom_plan_calibrate(exe, ranks, stdout, cal);
    if (strcmp(opened, "cpu")) { /* the reference trains on the backend measured */
        snprintf(device_set, sizeof device_set, "model.device=%s", opened);
        sets[nsets++] = device_set;
    }
    if (rc == LOOM_OK)
        rc = loom_plan_calibrate_compute(cal, exe, ref, sets, nsets, stdout);
    if (rc == LOOM_OK)
        rc = loom_plan_calibration_write(cal, out);
    if (!reference)
        unlink(config);
    if (rc == LOOM_OK)
        printf("loom plan: wrote %s (%.0f s)\n", out, cal->seconds);
    else
        fprintf(stderr, "loom plan --calibrate: %s\n", loom_last_error());
    free(cal);
    return rc == LOOM_OK ? 0 : 1;
}

static const char *const axis_names[LOOM_AXIS_COUNT] = {"tp", "sp", "pp", "dp"};

static void format_bytes(uint64_t bytes, char *buf, size_t cap) { loom_mem_format(bytes, buf, cap); }

static void print_header(const loom_plan *p)
{
    const loom_plan_job *j = &p->job;
    const loom_plan_shape *sh = &j->shape;
    printf("loom plan: %s L=%d C=%d NH=%d", sh->kind == LOOM_PLAN_GPT2 ? "GPT-2" : "Llama", sh->layers,
           sh->channels, sh->heads);
    if (sh->kind == LOOM_PLAN_LLAMA)
        printf(" KV=%d FFN=%d", sh->kv_heads, sh->ffn);
    printf(" V=%d, %.4g M parameters; batch %d x seq %d (micro-batch %d x %d per dp rank); %s%s\n",
           sh->vocab, p->params / 1e6, j->batch, j->seq, j->micro_batch, j->grad_accum,
           loom_dtype_name(j->dtype), j->recompute ? ", recomputation" : "");
    printf("  mesh tp %d x sp %d x pp %d x dp %d: dp %s", j->sizes[LOOM_AXIS_TP], j->sizes[LOOM_AXIS_SP],
           j->sizes[LOOM_AXIS_PP], j->sizes[LOOM_AXIS_DP], j->dp_strategy);
    if (j->sizes[LOOM_AXIS_TP] > 1)
        printf(", tp%s", j->sequence_parallel ? " + sequence parallel" : "");
    if (j->sizes[LOOM_AXIS_SP] > 1)
        printf(", sp %s", j->sp_strategy);
    if (j->sizes[LOOM_AXIS_PP] > 1)
        printf(", pp %s x %d micro-batches%s", j->schedule, j->microbatches,
               j->virtual_stages > 1 ? " (interleaved)" : "");
    printf("\n  cluster: %s\n", p->timed ? p->cluster.name : "none (--cluster FILE for the step time)");
}

static void print_time(const loom_plan *p)
{
    if (!p->timed)
        return;
    printf("step: %.3f ms (%s) -> %.0f tokens/s, MFU %.1f%% of %.1f TFLOP/s per rank\n",
           p->step_s * 1e3, p->why, p->tokens_per_s, 100 * p->mfu,
           (p->cluster.flops[p->job.dtype] > 0 ? p->cluster.flops[p->job.dtype]
                                                : p->cluster.flops[LOOM_F32]) / 1e12);
    printf("fits: %s\n", p->fits ? "yes" : "no");
    for (int i = 0; i < p->nwarnings; i++)
        printf("warning: %s\n", p->warnings[i]);
}

static void print_memory(const loom_plan *p)
{
    loom_tier tier = p->job.device_resident ? LOOM_TIER_DEVICE : LOOM_TIER_HOST;
    if (p->job.device_resident)
        printf("memory per rank, peak bytes by purpose (device tier, model.device = \"%s\"; a "
               "\"host\" row: what memory.offload moves off the device; the host's copies "
               "staged for communicators that do not take device memory are not predicted):\n",
               p->job.device);
    else
        printf("memory per rank, peak bytes by purpose (host tier):\n");
    printf("  %-8s %-7s", "pp rank", "units");
    for (int k = 0; k < LOOM_PURPOSE_COUNT; k++)
        printf(" %11s", loom_purpose_name((loom_purpose)k));
    printf(" %11s\n", "total");
    for (int r = 0; r < p->nranks; r++) {
        const loom_plan_rank *pr = &p->ranks[r];
        char units[32], b[32];
        snprintf(units, sizeof units, "%d..%d", pr->units_first, pr->units_last);
        printf("  %-8d %-7s", r, units);
        uint64_t total = 0;
        for (int k = 0; k < LOOM_PURPOSE_COUNT; k++) {
            format_bytes(pr->peak[tier][k], b, sizeof b);
            printf(" %11s", b);
            total += pr->peak[tier][k];
        }
        format_bytes(total, b, sizeof b);
        printf(" %11s\n", b);
        uint64_t host = 0; /* on a device: what memory.offload moved off it */
        for (int k = 0; k < LOOM_PURPOSE_COUNT && tier == LOOM_TIER_DEVICE; k++)
            host += pr->peak[LOOM_TIER_HOST][k];
        if (!host)
            continue;
        printf("  %-8s %-7s", "", "host");
        for (int k = 0; k < LOOM_PURPOSE_COUNT; k++) {
            format_bytes(pr->peak[LOOM_TIER_HOST][k], b, sizeof b);
            printf(" %11s", b);
        }
        format_bytes(host, b, sizeof b);
        printf(" %11s\n", b);
    }
}

static void print_traffic(const loom_plan *p)
{
    printf("traffic per rank per step (payload bytes as the comm counters count them):\n");
    printf("  %-8s %-17s %7s %11s%s\n", "pp rank", "collective", "calls", "bytes",
           p->timed ? "   time ms  exposed ms" : "");
    for (int r = 0; r < p->nranks; r++) {
        const loom_plan_rank *pr = &p->ranks[r];
        for (int a = 0; a < LOOM_AXIS_COUNT; a++)
            for (int op = 0; op < LOOM_OP_COUNT; op++) {
                const loom_plan_comm *c = &pr->comm[a][op];
                if (!c->calls)
                    continue;
                char b[32];
                format_bytes(c->bytes, b, sizeof b);
                printf("  %-8d %s.%-14s %7llu %11s", r, axis_names[a],
                       loom_comm_op_name((loom_comm_op)op), (unsigned long long)c->calls, b);
                if (p->timed)
                    printf(" %10.3f %10.3f", c->seconds * 1e3, c->exposed_s * 1e3);
                printf("\n");
            }
    }
}

/* The same keys as `loom train --metrics` (peak_bytes, comm_bytes,
 * comm_calls), one object per pp rank, so a plan and a run compare
 * field by field. */
static int write_json(const loom_plan *p, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return loom_fail(LOOM_ERR_INVALID, "--json %s: %s", path, strerror(errno));
    fprintf(f, "{\"mesh\": {\"tp\": %d, \"sp\": %d, \"pp\": %d, \"dp\": %d}, \"ranks\": [",
            p->job.sizes[LOOM_AXIS_TP], p->job.sizes[LOOM_AXIS_SP], p->job.sizes[LOOM_AXIS_PP],
            p->job.sizes[LOOM_AXIS_DP]);
    for (int r = 0; r < p->nranks; r++) {
        const loom_plan_rank *pr = &p->ranks[r];
        fprintf(f, "%s{\"pp_rank\": %d, \"units\": [%d, %d], \"peak_bytes\": {", r ? ", " : "", r,
                pr->units_first, pr->units_last);
        int first_tier = 1;
        for (int t = 0; t < LOOM_TIER_COUNT; t++) {
            uint64_t total = 0;
            for (int k = 0; k < LOOM_PURPOSE_COUNT; k++)
                total += pr->peak[t][k];
            if (!total)
                continue;
            fprintf(f, "%s\"%s\": {", first_tier ? "" : ", ", loom_tier_name((loom_tier)t));
            for (int k = 0; k < LOOM_PURPOSE_COUNT; k++)
                fprintf(f, "%s\"%s\": %llu", k ? ", " : "", loom_purpose_name((loom_purpose)k),
                        (unsigned long long)pr->peak[t][k]);
            fprintf(f, ", \"total\": %llu}", (unsigned long long)total);
            first_tier = 0;
        }
        fprintf(f, "}, \"slot_bytes\": %llu, \"live_microbatches\": %d, \"compute_s\": %.9g, "
                "\"step_s\": %.9g", (unsigned long long)pr->slot_bytes, pr->live_microbatches,
                pr->compute_s, pr->step_s);
        for (int k = 0; k < 2; k++) {
            fprintf(f, ", \"comm_%s\": {", k ? "calls" : "bytes");
            int first = 1;
            for (int a = 0; a < LOOM_AXIS_COUNT; a++)
                for (int op = 0; op < LOOM_OP_COUNT; op++) {
                    const loom_plan_comm *c = &pr->comm[a][op];
                    if (!c->calls)
                        continue;
                    fprintf(f, "%s\"%s.%s\": %llu", first ? "" : ", ", axis_names[a],
                            loom_comm_op_name((loom_comm_op)op),
                            (unsigned long long)(k ? c->calls : c->bytes));
                    first = 0;
                }
            fprintf(f, "}");
        }
        fprintf(f, "}");
    }
    fprintf(f, "], \"params\": %.0f, \"bubble\": %.6f, \"fits\": %s", p->params, p->bubble,
            p->fits ? "true" : "false");
    if (p->timed)
        fprintf(f, ", \"step_s\": %.9g, \"tokens_per_s\": %.6g, \"mfu\": %.6f", p->step_s,
                p->tokens_per_s, p->mfu);
    fprintf(f, ", \"warnings\": [");
    for (int i = 0; i < p->nwarnings; i++) {
        fprintf(f, "%s\"", i ? ", " : "");
        for (const char *c = p->warnings[i]; *c; c++)
            fprintf(f, *c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
        fprintf(f, "\"");
    }
    fprintf(f, "]}\n");
    if (fclose(f) != 0)
        return loom_fail(LOOM_ERR_INVALID, "--json %s: %s", path, strerror(errno));
    return LOOM_OK;
}

/* The config at path with the overrides, planned on the cluster: the job
 * read as `loom train` reads it, the pipeline schedule its plugin emits. */
static int plan_config(const char *path, const char *const *sets, int nsets,
                       const loom_plan_cluster *cluster, loom_plan *out)
{
    loom_config *cfg = NULL;
    loom_runtime *rt = NULL;
    loom_schedule schedule;
    memset(&schedule, 0, sizeof schedule);
    loom_plan_job job;
    memset(&job, 0, sizeof job);
    char desc[256];
    const loom_plugin *schedule_plugin = NULL;
    int rc = loom_config_load(path, sets, nsets, &cfg);
    if (rc == LOOM_OK)
        rc = loom_plan_job_read(cfg, &job);
    int pipeline = rc == LOOM_OK && job.sizes[LOOM_AXIS_PP] > 1;
    int device = rc == LOOM_OK && strcmp(job.device, "cpu") != 0;
    if ((pipeline || device) && (rc = loom_runtime_create(cfg, &rt)) == LOOM_OK && pipeline)
        rc = loom_cli_build_schedule(cfg, rt, &schedule, desc, sizeof desc, &schedule_plugin);
    loom_tier tier = LOOM_TIER_HOST;
    if (rc == LOOM_OK && device && (rc = loom_backend_tier(rt, job.device, &tier)) != LOOM_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", loom_last_error());
        rc = loom_fail(rc, "%s: %s", loom_config_where(cfg, "model.device"), why);
    }
    job.device_resident = tier == LOOM_TIER_DEVICE;
    if (rc == LOOM_OK)
        rc = loom_plan_make(&job, cluster, pipeline ? &schedule : NULL, out);
    loom_plan_job_free(&job);
    loom_schedule_free(&schedule);
    loom_runtime_destroy(rt);
    loom_config_free(cfg);
    return rc;
}

/* ---- --search ---- */

typedef struct candidate {
    char label[160];
    int tp, pp, dp;
    double step_s, tokens_per_s, mfu, bubble, compute_s, exposed_s;
    double memory; /* the largest rank's sum of peaks */
    char why[512];
    int nwarnings;
    char warning[256];
} candidate;

static int by_step(const void *a, const void *b)
{
    double x = ((const candidate *)a)->step_s, y = ((const candidate *)b)->step_s;
    return (x > y) - (x < y);
}

/* One mesh of the search: the config with these settings over it, planned
 * like any other. 1: planned and fits; 0: does not fit or cannot be laid
 * out (the reason is dropped: the search only ranks what can run). */
static int try_mesh(const loom_cli_config_args *args, const char *const *extra, int nextra,
                    const loom_plan_cluster *cluster, candidate *out)
{
    const char *sets[LOOM_CLI_MAX_SETS + 16];
    int n = 0;
    for (int i = 0; i < args->noverrides; i++)
        sets[n++] = args->overrides[i];
    for (int i = 0; i < nextra; i++)
        sets[n++] = extra[i];
    loom_plan plan;
    memset(&plan, 0, sizeof plan);
    int rc = plan_config(args->config, sets, n, cluster, &plan);
    int fits = rc == LOOM_OK && plan.fits;
    if (fits) {
        out->step_s = plan.step_s;
        out->tokens_per_s = plan.tokens_per_s;
        out->mfu = plan.mfu;
        out->bubble = plan.bubble;
        out->memory = 0;
        for (int r = 0; r < plan.nranks; r++) {
            double total = (double)plan.ranks[r].total[LOOM_TIER_HOST];
            if (total > out->memory)
                out->memory = total;
            if (plan.ranks[r].step_s >= plan.step_s) {
                out->compute_s = plan.ranks[r].compute_s;
                out->exposed_s = plan.ranks[r].step_s * (1 - plan.bubble) - plan.ranks[r].compute_s;
            }
        }
        snprintf(out->why, sizeof out->why, "%s", plan.why);
        out->nwarnings = plan.nwarnings;
        snprintf(out->warning, sizeof out->warning, "%s", plan.nwarnings ? plan.warnings[0] : "");
    }
    loom_plan_free(&plan);
    return fits;
}

/* parallel.pp.stage_layers for pp stages: the blocks spread evenly, the
 * remainder taken from the first and last stages, which hold the
 * embedding and head. 0: the layers do not spread so. */
static int stage_layers_setting(const loom_plan_shape *sh, int pp, char *out, size_t cap)
{
    int per = (sh->layers + pp - 1) / pp, spare = per * pp - sh->layers;
    if (spare > 2 || per < 1 || (spare > 0 && pp < 2))
        return 0;
    int used = snprintf(out, cap, "parallel.pp.stage_layers=[");
    for (int st = 0; st < pp; st++) {
        int n = per - ((st == 0 && spare >= 1) || (st == pp - 1 && spare >= 2));
        used += snprintf(out + used, cap - (size_t)used, "%s%d", st ? "," : "", n);
    }
    snprintf(out + used, cap - (size_t)used, "]");
    return 1;
}

/* The candidates the search keeps, and how many meshes it tried. */
typedef struct ranking {
    candidate *all;
    int count, cap, tried;
} ranking;

static const char *const search_strategies[] = {"ddp", "zero1", "zero2", "zero3"};

/* One tp x pp x dp mesh under each dp strategy, with and without
 * recomputation, and without a pipeline with and without accumulation;
 * those that fit go into r. */
static void try_variants(const loom_cli_config_args *args, const loom_plan_job *base,
                         const loom_plan_cluster *cluster, const int mesh[3], const char *layers,
                         ranking *r)
{
    int tp = mesh[0], pp = mesh[1], dp = mesh[2], per_rank = base->batch / dp;
    char sizes[3][64], extra[4][64];
    snprintf(sizes[0], sizeof sizes[0], "parallel.tp.size=%d", tp);
    snprintf(sizes[1], sizeof sizes[1], "parallel.pp.size=%d", pp);
    snprintf(sizes[2], sizeof sizes[2], "parallel.dp.size=%d", dp);
    for (int sidx = 0; sidx < 4; sidx++)
        for (int rec = 0; rec < 2; rec++)
            for (int acc = 0; acc < (pp > 1 ? 1 : 2); acc++) {
                const char *sets[10];
                int n = 0;
                for (int k = 0; k < 3; k++)
                    sets[n++] = sizes[k];
                snprintf(extra[0], sizeof extra[0], "parallel.dp.strategy=%s",
                         search_strategies[sidx]);
                snprintf(extra[1], sizeof extra[1], "train.recompute=%s", rec ? "block" : "none");
                snprintf(extra[2], sizeof extra[2], "parallel.tp.sequence_parallel=%s",
                         tp > 1 ? "true" : "false");
                if (pp > 1)
                    snprintf(extra[3], sizeof extra[3], "parallel.pp.microbatches=%d", per_rank);
                else
                    snprintf(extra[3], sizeof extra[3], "train.grad_accum=%d", acc ? per_rank : 1);
                for (int k = 0; k < 4; k++)
                    sets[n++] = extra[k];
                if (pp > 1)
                    sets[n++] = layers;
                if (acc && per_rank == 1)
                    continue;
                candidate c;
                memset(&c, 0, sizeof c);
                r->tried++;
                if (!try_mesh(args, sets, n, cluster, &c))
                    continue;
                c.tp = tp;
                c.pp = pp;
                c.dp = dp;
                snprintf(c.label, sizeof c.label, "tp %d x pp %d x dp %d, %s%s%s", tp, pp, dp,
                         search_strategies[sidx], rec ? ", recompute" : "",
                         pp > 1 ? "" : acc ? ", micro-batch 1" : "");
                if (r->count < r->cap)
                    r->all[r->count++] = c;
            }
}

/* The fastest `top`, why the first wins, and the best of each
 * tensor-parallel width: what widening tp costs, and where it leaves the
 * node. */
static void print_ranking(const ranking *r, int world, int top, const loom_plan_cluster *cluster)
{
    int count = r->count;
    printf("search: %d ranks, %d meshes tried, %d fit; the fastest %d:\n", world, r->tried, count,
           top < count ? top : count);
    printf("  %-4s %-42s %10s %10s %7s %8s %10s %10s %10s\n", "rank", "mesh", "step ms", "tokens/s",
           "MFU", "bubble", "compute", "exposed", "memory");
    for (int i = 0; i < count && i < top; i++) {
        const candidate *c = &r->all[i];
        char mem[32];
        loom_mem_format((uint64_t)c->memory, mem, sizeof mem);
        printf("  %-4d %-42s %10.3f %10.4g %6.1f%% %7.1f%% %10.3f %10.3f %10s\n", i + 1, c->label,
               c->step_s * 1e3, c->tokens_per_s, 100 * c->mfu, 100 * c->bubble, c->compute_s * 1e3,
               c->exposed_s * 1e3, mem);
        if (c->nwarnings)
            printf("       note: %s\n", c->warning);
    }
    if (count)
        printf("why the first wins: %s\n", r->all[0].why);
    printf("the fastest mesh at each tp:\n");
    for (int tp = 1; tp <= world; tp *= 2)
        for (int i = 0; i < count; i++) {
            const candidate *c = &r->all[i];
            if (c->tp != tp)
                continue;
            int nodes = cluster->ranks_per_node > 0 && tp > cluster->ranks_per_node
                            ? tp / cluster->ranks_per_node : 1;
            printf("  tp %-4d rank %-4d %-42s %10.3f ms: compute %.3f ms, exposed communication "
                   "%.3f ms%s\n", tp, i + 1, c->label, c->step_s * 1e3, c->compute_s * 1e3,
                   c->exposed_s * 1e3, nodes > 1 ? " (tp's all-reduces cross nodes)" : "");
            break;
        }
}

/* Every mesh of the config's ranks (or the cluster's): tp and pp powers of
 * two that divide them and the model (tp within the heads, pp within the
 * layers, their layers spread as evenly as they go with the first and last
 * stage lighter), dp the rest; each dp strategy, with and without
 * recomputation; a pipeline fed one sequence per micro-batch (the
 * smallest bubble), no pipeline the whole per-rank batch at once or one
 * sequence at a time (accumulation). Those that fit, fastest first. */
static int search(const loom_cli_config_args *args, const loom_plan_job *base,
                  const loom_plan_cluster *cluster, int top)
{
    /* the ranks the config's mesh asks for; a config of one rank: the
     * whole cluster */
    int world = 1;
    for (int a = 0; a < LOOM_AXIS_COUNT; a++)
        world *= base->sizes[a];
    if (world == 1 && cluster->nodes > 0 && cluster->ranks_per_node > 0)
        world = cluster->nodes * cluster->ranks_per_node;
    const loom_plan_shape *sh = &base->shape;
    ranking r = {.cap = 4096};
    if (!(r.all = calloc((size_t)r.cap, sizeof *r.all)))
        return loom_fail(LOOM_ERR_NO_MEMORY, "plan: out of memory");
    for (int tp = 1; tp <= world && tp <= sh->heads; tp *= 2) {
        if (world % tp || sh->heads % tp || sh->channels % tp)
            continue;
        for (int pp = 1; pp * tp <= world && pp <= sh->layers; pp *= 2) {
            int mesh[3] = {tp, pp, world / (tp * pp)};
            char layers[2048] = "";
            if (world % (tp * pp) || base->batch % mesh[2])
                continue;
            if (pp > 1 && !stage_layers_setting(sh, pp, layers, sizeof layers))
                continue;
            try_variants(args, base, cluster, mesh, layers, &r);
        }
    }
    qsort(r.all, (size_t)r.count, sizeof *r.all, by_step);
    print_ranking(&r, world, top, cluster);
    free(r.all);
    return r.count ? LOOM_OK
                   : loom_fail(LOOM_ERR_INVALID, "plan --search: no mesh of %d ranks fits", world);
}

int loom_cmd_plan(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--calibrate"))
        return calibrate(argc, argv);
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--device") || !strcmp(argv[i], "--reference")) {
            fprintf(stderr, "loom plan: %s goes with --calibrate FILE (loom plan --calibrate FILE "
                    "%s ...); to plan a job on a backend, --set model.device=NAME\n", argv[i],
                    argv[i]);
            return 2;
        }
    const char *json = NULL, *cluster_path = NULL, *top_text = NULL;
    int searching = 0;
    const loom_cli_option options[] = {{"--json", NULL, &json, NULL},
                                       {"--cluster", NULL, &cluster_path, NULL},
                                       {"--search", NULL, NULL, &searching},
                                       {"--top", NULL, &top_text, NULL},
                                       {NULL, NULL, NULL, NULL}};
    loom_cli_config_args args;
    int bad = loom_cli_config_args_parse("loom plan", plan_usage, argc, argv, options, &args);
    if (bad)
        return bad;
    int top = top_text ? atoi(top_text) : 8;
    if (top < 1) {
        fprintf(stderr, "loom plan: --top %s: expected a count of meshes, 1 or more\n", top_text);
        return 2;
    }
    loom_plan plan;
    memset(&plan, 0, sizeof plan);
    loom_plan_cluster cluster;
    memset(&cluster, 0, sizeof cluster);
    int rc = cluster_path ? loom_plan_cluster_read(cluster_path, &cluster) : LOOM_OK;
    if (rc == LOOM_OK)
        rc = plan_config(args.config, args.overrides, args.noverrides, &cluster, &plan);
    if (rc == LOOM_OK && searching) {
        if (!cluster_path)
            rc = loom_fail(LOOM_ERR_INVALID, "--search ranks meshes by step time: name the cluster "
                           "with --cluster FILE (examples/clusters/)");
        else
            rc = search(&args, &plan.job, &cluster, top);
    } else if (rc == LOOM_OK) {
        print_header(&plan);
        print_memory(&plan);
        print_traffic(&plan);
        print_time(&plan);
    }
    if (rc == LOOM_OK && json)
        rc = write_json(&plan, json);
    if (rc != LOOM_OK)
        fprintf(stderr, "loom plan: %s\n", loom_last_error());
    fflush(stdout);
    loom_plan_free(&plan);
    return rc == LOOM_OK ? 0 : 1;
}
