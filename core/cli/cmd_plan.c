/* `loom plan CONFIG [--cluster FILE] [--set path=value ...] [--json FILE]
 * [--search]`: what the job the config describes will hold, move and take
 * per step on a cluster, before it runs (train/plan.h). One process: no
 * ranks, no data, no model weights. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/status.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "runtime/config.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/runtime.h"
#include "train/plan.h"
#include "train/schedule.h"

static const char plan_usage[] =
    "usage: loom plan CONFIG [--cluster FILE] [--set path=value ...] [--json FILE] [--search]\n"
    "       loom plan --calibrate FILE\n";

static const char *const axis_names[LOOM_AXIS_COUNT] = {"tp", "sp", "pp", "dp"};

static void format_bytes(uint64_t bytes, char *buf, size_t cap) { loom_mem_format(bytes, buf, cap); }

static void print_memory(const loom_plan *p)
{
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
            format_bytes(pr->peak[LOOM_TIER_HOST][k], b, sizeof b);
            printf(" %11s", b);
            total += pr->peak[LOOM_TIER_HOST][k];
        }
        format_bytes(total, b, sizeof b);
        printf(" %11s\n", b);
    }
}

static void print_traffic(const loom_plan *p)
{
    printf("traffic per rank per step (payload bytes as the comm counters count them):\n");
    for (int r = 0; r < p->nranks; r++) {
        const loom_plan_rank *pr = &p->ranks[r];
        for (int a = 0; a < LOOM_AXIS_COUNT; a++)
            for (int op = 0; op < LOOM_OP_COUNT; op++) {
                const loom_plan_comm *c = &pr->comm[a][op];
                if (!c->calls)
                    continue;
                char b[32];
                format_bytes(c->bytes, b, sizeof b);
                printf("  pp rank %d  %s.%-14s %6llu calls %11s\n", r, axis_names[a],
                       loom_comm_op_name((loom_comm_op)op), (unsigned long long)c->calls, b);
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
        fprintf(f, "}, \"slot_bytes\": %llu, \"live_microbatches\": %d",
                (unsigned long long)pr->slot_bytes, pr->live_microbatches);
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
    fprintf(f, "]}\n");
    if (fclose(f) != 0)
        return loom_fail(LOOM_ERR_INVALID, "--json %s: %s", path, strerror(errno));
    return LOOM_OK;
}

int loom_cmd_plan(int argc, char **argv)
{
    const char *json = NULL, *cluster_path = NULL;
    const loom_cli_option options[] = {{"--json", NULL, &json, NULL},
                                       {"--cluster", NULL, &cluster_path, NULL},
                                       {NULL, NULL, NULL, NULL}};
    loom_cli_config_args args;
    int bad = loom_cli_config_args_parse("loom plan", plan_usage, argc, argv, options, &args);
    if (bad)
        return bad;
    loom_config *cfg = NULL;
    loom_runtime *rt = NULL;
    loom_schedule schedule;
    memset(&schedule, 0, sizeof schedule);
    loom_plan_job job;
    memset(&job, 0, sizeof job);
    loom_plan plan;
    memset(&plan, 0, sizeof plan);
    loom_plan_cluster cluster;
    memset(&cluster, 0, sizeof cluster);
    char desc[256] = "";
    const loom_strategy_ops *ops = NULL;
    int rc = loom_config_load(args.config, args.overrides, args.noverrides, &cfg);
    if (rc == LOOM_OK)
        rc = loom_plan_job_read(cfg, &job);
    if (rc == LOOM_OK && job.sizes[LOOM_AXIS_PP] > 1 && (rc = loom_runtime_create(cfg, &rt)) == LOOM_OK)
        rc = loom_cli_build_schedule(cfg, rt, &schedule, desc, sizeof desc, &ops);
    if (rc == LOOM_OK)
        rc = loom_plan_make(&job, &cluster, job.sizes[LOOM_AXIS_PP] > 1 ? &schedule : NULL, &plan);
    if (rc == LOOM_OK) {
        print_memory(&plan);
        print_traffic(&plan);
    }
    if (rc == LOOM_OK && json)
        rc = write_json(&plan, json);
    if (rc != LOOM_OK)
        fprintf(stderr, "loom plan: %s\n", loom_last_error());
    fflush(stdout);
    loom_plan_free(&plan);
    loom_plan_job_free(&job);
    loom_schedule_free(&schedule);
    loom_runtime_destroy(rt);
    loom_config_free(cfg);
    return rc == LOOM_OK ? 0 : 1;
}
