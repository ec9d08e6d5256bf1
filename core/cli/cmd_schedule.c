/* `loom schedule CONFIG [--set path=value ...] [--svg FILE] [--verbose]
 * [--p2p-cost X]`: build the pipeline schedule the config names
 * (parallel.pp.{size, schedule, microbatches, virtual_stages}), validate
 * it, print each rank's list, simulate it with forward = backward-input =
 * backward-weight = 1 (backward = 2) and transfers arriving X after their
 * send (the latency model in train/schedule.h), report the bubble and the
 * activation stash, and draw it. One process: no ranks, no communication,
 * no model. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "loom/plugin.h"
#include "loom/schedule.h"
#include "loom/status.h"
#include "loom/tensor.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/schedule_svg.h"
#include "runtime/config.h"
#include "runtime/loader.h"
#include "runtime/log.h"
#include "runtime/runtime.h"
#include "train/schedule.h"

static const char schedule_usage[] =
    "usage: loom schedule CONFIG [--set path=value ...] [--svg FILE] [--verbose] "
    "[--p2p-cost X]\n"
    "  --p2p-cost X  each transfer between stages arrives X after its send, in units of\n"
    "                a forward (default 0: free transfers); the sender is not held up\n";

/* "F3" for a forward of micro-batch 3, "B" backward, "I" backward-input,
 * "W" backward-weight; "ra", "sa", "rg", "sg" the transfers; "v1" after it
 * for virtual stage 1 when there are several. */
static void print_list(const loom_schedule *s, int r, int verbose)
{
    static const char *letters[LOOM_ACT_KIND_COUNT] = {"F", "B", "I", "W", "sa", "ra", "sg", "rg"};
    printf("rank %d:", r);
    for (int i = 0; i < s->count[r]; i++) {
        loom_action a = s->actions[r][i];
        if (!verbose && !loom_action_is_compute(a.kind))
            continue;
        printf(" %s%d", letters[a.kind], (int)a.microbatch);
        if (s->virtual_stages > 1)
            printf("v%u", (unsigned)a.virtual_stage);
    }
    printf("\n");
}

/* Read the pp settings, load the schedule plugin, build and validate. */
int loom_cli_build_schedule(loom_config *cfg, loom_runtime *rt, loom_schedule *out,
                            char *desc, size_t desc_cap, const loom_plugin **schedule_plugin)
{
    int64_t p = 1, v = 1, m = 1;
    const char *name = NULL; /* the schema's default */
    loom_config_int(cfg, "parallel.pp.size", &p);
    loom_config_int(cfg, "parallel.pp.virtual_stages", &v);
    loom_config_int(cfg, "parallel.pp.microbatches", &m);
    loom_config_string(cfg, "parallel.pp.schedule", &name);
    if (p < 2)
        return loom_fail(LOOM_ERR_INVALID, "%s: parallel.pp.size = %lld: no pipeline to "
                         "schedule; set it to 2 or more stages",
                         loom_config_where(cfg, "parallel.pp.size"), (long long)p);
    if (p > 4096 || v > 4096 || m > 1 << 20)
        return loom_fail(LOOM_ERR_INVALID, "%s: parallel.pp.size = %lld, virtual_stages = %lld, "
                         "microbatches = %lld: too large to draw",
                         loom_config_where(cfg, "parallel.pp.size"), (long long)p, (long long)v,
                         (long long)m);
    const char *where_schedule = loom_config_where(cfg, "parallel.pp.schedule");
    char where[256];
    snprintf(where, sizeof where, "%s", where_schedule);
    const loom_plugin *plugin;
    int rc = loom_runtime_plugin(rt, LOOM_PLUGIN_SCHEDULE, name, &plugin);
    if (rc != LOOM_OK) {
        char detail[1024];
        snprintf(detail, sizeof detail, "%s", loom_last_error());
        return loom_fail(rc, "%s: %s", where, detail);
    }
    *schedule_plugin = plugin;
    const loom_host *host;
    if ((rc = loom_runtime_host(rt, plugin, "parallel.pp", &host)) != LOOM_OK)
        return rc;
    snprintf(desc, desc_cap, "%s schedule over %lld stages%s", plugin->header->name,
             (long long)p, plugin->built_as != LOOM_PLUGIN_SCHEDULE
                               ? " (a strategy-kind schedule, adapted)" : "");
    rc = loom_schedule_build(plugin, host, (int)p, (int)v, (int)m, out);
    if (rc != LOOM_OK) {
        char detail[1024];
        snprintf(detail, sizeof detail, "%s", loom_last_error());
        loom_fail(rc, "%s: %s", where, detail);
    }
    return rc;
}

/* The plugin's closed-form bubble, through bubble_with_settings (given its
 * host, parallel.pp) when it has one; < 0 when it has none for this shape. */
static double theory_bubble(const loom_plugin *plugin, const loom_host *host, int p, int v, int m,
                            const char **formula)
{
    const loom_schedule_ops *ops = &plugin->ops.schedule;
    if (loom_plugin_provides(plugin, LOOM_OPTIONAL_SCHEDULE_BUBBLE_WITH_SETTINGS))
        return ops->bubble_with_settings(host, p, v, m, formula);
    return ops->bubble ? ops->bubble(p, v, m, formula) : -1.0;
}

static int report(const loom_schedule *s, const loom_plugin *plugin, const loom_host *host,
                  const char *desc, int verbose, double transfer, const char *svg_path)
{
    double cost[LOOM_ACT_KIND_COUNT];
    loom_schedule_default_costs(cost);
    loom_schedule_timeline tl;
    int rc = loom_schedule_simulate_transfers(s, cost, transfer, &tl);
    if (rc != LOOM_OK)
        return rc;
    int p = s->stages, v = s->virtual_stages, m = s->microbatches;
    printf("schedule \"%s\": %s; p = %d, v = %d, m = %d (valid)\n", s->name, desc, p, v, m);
    printf("F forward, B backward, I backward-input, W backward-weight, then the micro-batch%s%s\n",
           v > 1 ? ", then v and the virtual stage" : "",
           verbose ? "; ra/sa receive/send activation, rg/sg receive/send gradient" : "");
    for (int r = 0; r < p; r++)
        print_list(s, r, verbose);
    printf("simulated with forward %g, backward-input %g, backward-weight %g, backward %g, "
           "transfers %g:\n", cost[LOOM_ACT_FORWARD], cost[LOOM_ACT_BACKWARD_INPUT],
           cost[LOOM_ACT_BACKWARD_WEIGHT], cost[LOOM_ACT_BACKWARD], transfer);
    printf("  makespan %g, bubble %.4f", tl.makespan, tl.bubble);
    const char *formula = NULL;
    double th = theory_bubble(plugin, host, p, v, m, &formula);
    /* The closed forms know nothing of transfers: say so when they cost. */
    if (th >= 0.0)
        printf(" (theory%s %s = %.4f)", transfer > 0.0 ? ", free transfers:" : "",
               formula ? formula : "?", th);
    printf("\n  peak stash (%s alive at once):", v > 1 ? "stage-micro-batches" : "micro-batches");
    for (int r = 0; r < p; r++)
        printf(" rank %d: %d%s", r, tl.peak_stash[r], r + 1 < p ? "," : "\n");
    if (svg_path) {
        FILE *f = fopen(svg_path, "w");
        if (!f) {
            rc = loom_fail(LOOM_ERR_INVALID, "cannot write '%s': %s", svg_path, strerror(errno));
        } else {
            rc = loom_schedule_svg(s, &tl, f);
            if (fclose(f) != 0 && rc == LOOM_OK)
                rc = loom_fail(LOOM_ERR_INVALID, "cannot write '%s': %s", svg_path,
                               strerror(errno));
            if (rc == LOOM_OK)
                printf("  drawn to %s\n", svg_path);
        }
    }
    loom_schedule_timeline_free(s, &tl);
    return rc;
}

int loom_cmd_schedule(int argc, char **argv)
{
    const char *svg_path = NULL, *p2p_cost = NULL;
    int verbose = 0;
    const loom_cli_option options[] = {{"--svg", NULL, &svg_path, NULL},
                                       {"--verbose", "-v", NULL, &verbose},
                                       {"--p2p-cost", NULL, &p2p_cost, NULL},
                                       {NULL, NULL, NULL, NULL}};
    loom_cli_config_args args;
    int bad = loom_cli_config_args_parse("loom schedule", schedule_usage, argc, argv, options, &args);
    if (bad)
        return bad;
    double transfer = 0.0;
    if (p2p_cost) {
        char *end = NULL;
        errno = 0;
        transfer = strtod(p2p_cost, &end);
        if (end == p2p_cost || *end || errno || !isfinite(transfer) || transfer < 0.0) {
            fprintf(stderr, "loom schedule: --p2p-cost '%s': not a time; give a number 0 or "
                    "more, in units of a forward (e.g. --p2p-cost 0.5)\n", p2p_cost);
            return 2;
        }
    }
    loom_config *cfg = NULL;
    loom_runtime *rt = NULL;
    loom_schedule s;
    memset(&s, 0, sizeof s);
    char desc[256] = "";
    const loom_plugin *plugin = NULL;
    int rc = loom_config_load(args.config, args.overrides, args.noverrides, &cfg);
    if (rc == LOOM_OK)
        rc = loom_runtime_create(cfg, &rt);
    if (rc == LOOM_OK)
        rc = loom_cli_build_schedule(cfg, rt, &s, desc, sizeof desc, &plugin);
    const loom_host *host = NULL;
    if (rc == LOOM_OK)
        rc = loom_runtime_host(rt, plugin, "parallel.pp", &host);
    if (rc == LOOM_OK)
        rc = report(&s, plugin, host, desc, verbose, transfer, svg_path);
    if (rc != LOOM_OK)
        fprintf(stderr, "loom schedule: %s\n", loom_last_error());
    fflush(stdout);
    loom_schedule_free(&s);
    loom_runtime_destroy(rt);
    loom_config_free(cfg);
    return rc == LOOM_OK ? 0 : 1;
}
