/* A test schedule whose closed-form bubble depends on one of its settings:
 * "flushes" runs GPipe (all forwards, then all backwards) on each of
 * parallel.pp.flushes equal groups of micro-batches in turn, the pipeline
 * filling and draining once per group. Each fill and drain idles each rank
 * (p-1) forward+backward times, so with k groups of the step's m
 * micro-batches the bubble is k(p-1)/(m+k(p-1)): bubble_with_settings
 * reads k from the plugin's host. */
#include <loom/schedule.h>

static const loom_setting_spec flushes_settings[] = {
    {.name = "flushes", .type = LOOM_SETTING_INT, .default_value = "1",
     .help = "groups of micro-batches, each a fill and drain of the pipeline",
     .bounds = LOOM_SETTING_MIN, .min = 1},
    /* written quoted, as plugins did before defaults were bare words: it
     * must read, and list, as the bare word (tests/config settings.cli) */
    {.name = "order", .type = LOOM_SETTING_STRING, .default_value = "\"forward\"",
     .help = "the order of each group's backwards",
     .allowed = (const char *const[]){"forward", NULL}},
    {0}};

static int emit(const loom_pipeline_shape *shape, int rank, loom_action_kind kind, int mb)
{
    loom_action a = {(uint16_t)kind, 0, mb};
    return shape->emit(shape->builder, rank, a);
}

/* k, checked against the shape: it must split the micro-batches evenly. */
static int read_flushes(const loom_host *host, int microbatches, int64_t *k)
{
    int rc = host->config_int(host, "flushes", k);
    if (rc != LOOM_OK)
        return rc;
    if (microbatches % *k)
        return host->error(host, LOOM_ERR_INVALID,
                           "flushes: parallel.pp.flushes = %lld does not divide "
                           "parallel.pp.microbatches = %d", (long long)*k, microbatches);
    return LOOM_OK;
}

static int flushes_build(const loom_host *host, const loom_pipeline_shape *shape)
{
    if (shape->virtual_stages != 1)
        return host->error(host, LOOM_ERR_NOT_SUPPORTED,
                           "flushes: one virtual stage per rank only (got %d)",
                           shape->virtual_stages);
    int p = shape->stages, m = shape->microbatches;
    int64_t k;
    int rc = read_flushes(host, m, &k);
    int group = m / (int)(k > 0 ? k : 1);
    for (int r = 0; r < p && rc == LOOM_OK; r++)
        for (int first = 0; first < m && rc == LOOM_OK; first += group) {
            for (int mb = first; mb < first + group && rc == LOOM_OK; mb++) {
                if (r > 0)
                    rc = emit(shape, r, LOOM_ACT_RECV_ACTIVATION, mb);
                if (rc == LOOM_OK)
                    rc = emit(shape, r, LOOM_ACT_FORWARD, mb);
                if (rc == LOOM_OK && r < p - 1)
                    rc = emit(shape, r, LOOM_ACT_SEND_ACTIVATION, mb);
            }
            for (int mb = first; mb < first + group && rc == LOOM_OK; mb++) {
                if (r < p - 1)
                    rc = emit(shape, r, LOOM_ACT_RECV_GRADIENT, mb);
                if (rc == LOOM_OK)
                    rc = emit(shape, r, LOOM_ACT_BACKWARD, mb);
                if (rc == LOOM_OK && r > 0)
                    rc = emit(shape, r, LOOM_ACT_SEND_GRADIENT, mb);
            }
        }
    return rc;
}

/* The bubble without the setting: one group, GPipe's. */
static double flushes_bubble(int p, int v, int m, const char **formula)
{
    *formula = "(p-1)/(m+p-1)";
    return v == 1 ? (double)(p - 1) / (m + p - 1) : -1.0;
}

static double flushes_bubble_with_settings(const loom_host *host, int p, int v, int m,
                                           const char **formula)
{
    int64_t k;
    if (v != 1 || read_flushes(host, m, &k) != LOOM_OK)
        return -1.0;
    *formula = k == 1 ? "(p-1)/(m+p-1) with flushes = 1" : "k(p-1)/(m+k(p-1)) with k = flushes";
    return (double)k * (p - 1) / (m + (double)k * (p - 1));
}

LOOM_PLUGIN_EXPORT const loom_schedule_plugin_v1_t loom_schedule_plugin_v1 = {
    .header = LOOM_PLUGIN_HEADER(LOOM_PLUGIN_SCHEDULE, loom_schedule_plugin_v1_t, "flushes",
                                 "pipeline schedule: GPipe over parallel.pp.flushes groups of "
                                 "micro-batches in turn",
                                 flushes_settings),
    .build = flushes_build,
    .bubble = flushes_bubble,
    .bubble_with_settings = flushes_bubble_with_settings,
};
