/* loom train — What a run prints and writes: the header, the progress line, the
 * --metrics JSON lines, the merged --trace. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loom/plugin.h"
#include "loom/status.h"
#include "model/gemm.h"
#include "model/sample.h"
#include "runtime/bootstrap.h"
#include "runtime/cpu.h"
#include "runtime/log.h"
#include "runtime/memory.h"
#include "runtime/trace.h"
#include "train/test_hooks.h"
#include "train/trainer.h"

/* ---- reporting ---- */

/* "params 3.3 MiB, optimizer 6.6 MiB": a tier's peak bytes by purpose. */
static size_t tier_parts(const loom_mem_usage *u, loom_tier tier, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int p = 0; p < LOOM_PURPOSE_COUNT && n < cap; p++) {
        uint64_t b = u->peak[tier][p];
        if (!b)
            continue;
        char hb[32];
        loom_mem_format(b, hb, sizeof hb);
        n += (size_t)snprintf(buf + n, cap - n, "%s%s %s", n ? ", " : "",
                              loom_purpose_name((loom_purpose)p), hb);
    }
    return n;
}

/* " | nvme: optimizer 6.6 MiB | tier r 6.6 MiB w 6.6 MiB": where offloaded
 * state lives, and what this step moved; "" without offload. */
static void offload_text(const trainer *t, const loom_mem_usage *u, char *buf, size_t cap)
{
    uint64_t read = 0, written = 0;
    for (int p = 0; p < LOOM_PURPOSE_COUNT; p++) {
        read += t->report.tier_step.read[p];
        written += t->report.tier_step.written[p];
    }
    char parts[256];
    size_t n = 0;
    buf[0] = '\0';
    if (tier_parts(u, LOOM_TIER_DEVICE, parts, sizeof parts))
        n += (size_t)snprintf(buf + n, cap - n, " | peak device: %s", parts);
    if (n < cap && tier_parts(u, LOOM_TIER_NVME, parts, sizeof parts))
        n += (size_t)snprintf(buf + n, cap - n, " | peak nvme: %s", parts);
    if ((read || written) && n < cap) {
        char r[32], w[32];
        loom_mem_format(read, r, sizeof r);
        loom_mem_format(written, w, sizeof w);
        snprintf(buf + n, cap - n, " | moved: read %s, written %s", r, w);
    }
}

/* A step that ran faster than the peak: the peak was measured while the
 * machine was busy, or train.peak_gflops is below this machine's. A
 * measured peak is measured again, once, the same way; if the step beats
 * that too (or the peak was given), the peak cannot be trusted and MFU is
 * not given from this step on: an MFU over 100% is never reported. say: print
 * what happened (the rank that prints the progress). */
static void check_peak(trainer *t, double flops_per_rank, int say)
{
    if (t->report.peak_unreliable || flops_per_rank <= t->report.peak_flops)
        return;
    double start = t->report.peak_flops;
    if (!t->report.peak_remeasured && !(trainer_read_float(t->job.cfg, "train.peak_gflops") > 0)) {
        t->report.peak_remeasured = 1;
        int rows = t->job.micro_batch * t->job.seq, C = t->job.shape.channels;
        double again = loom_gemm_measure(rows, 4 * C, C, 0.1);
        if (again > t->report.peak_flops)
            t->report.peak_flops = again;
        if (flops_per_rank <= t->report.peak_flops) {
            if (say)
                printf("MFU: step %lld ran at %.3g GFLOP/s per rank, above the peak measured at "
                       "start (%.3g, while the machine was busy); measured again: %.3g GFLOP/s "
                       "per rank from this step on\n",
                       (long long)t->job.step + 1, flops_per_rank / 1e9, start / 1e9,
                       t->report.peak_flops / 1e9);
            return;
        }
    }
    t->report.peak_unreliable = 1;
    if (say)
        printf("MFU n/a from step %lld: it ran at %.3g GFLOP/s per rank, above the peak of %.3g "
               "(%s%s); set train.peak_gflops to this machine's peak, or run on a quiet "
               "machine\n",
               (long long)t->job.step + 1, flops_per_rank / 1e9, t->report.peak_flops / 1e9,
               t->report.peak_source, t->report.peak_remeasured ? ", and measured again" : "");
}

/* This step's MFU, or NAN where the peak is not to be trusted. */
static double step_mfu(trainer *t, double tokens_per_s, int say)
{
    double rate = loom_model_flops_per_token(t->job.model) * tokens_per_s / t->job.world;
    check_peak(t, rate, say);
    return t->report.peak_unreliable ? NAN : rate / t->report.peak_flops;
}

void trainer_print_progress(trainer *t, const step_result *r)
{
    double tokens = (double)t->job.batch * t->job.seq;
    double tps = tokens / r->seconds;
    double mfu = step_mfu(t, tps, 1);
    char mfu_text[16] = "   n/a";
    if (isfinite(mfu))
        snprintf(mfu_text, sizeof mfu_text, "%5.1f%%", 100 * mfu);
    loom_mem_usage u;
    loom_mem_usage_get(&u);
    char mem[256], offload[384];
    if (!tier_parts(&u, LOOM_TIER_HOST, mem, sizeof mem))
        snprintf(mem, sizeof mem, "none"); /* all of it on a device */
    offload_text(t, &u, offload, sizeof offload);
    char bubble[32] = "", val[32] = "";
    if (t->pipe.executor)
        snprintf(bubble, sizeof bubble, " | bubble %4.1f%%", 100 * t->pipe.bubble);
    if (r->evaluated)
        snprintf(val, sizeof val, " | val %.6f", r->val_loss);
    printf("step %4lld/%lld | loss %.6f%s | lr %.2e | norm %.4f | %7.1f ms | %8.0f tok/s | "
           "MFU %s%s | peak host: %s%s%s\n",
           (long long)t->job.step + 1, (long long)t->job.steps, r->loss, val, r->lr, r->grad_norm,
           r->seconds * 1e3, tps, mfu_text, bubble, mem, offload, r->skipped ? " | skipped" : "");
    if (r->evaluated && t->job.step + 1 == t->job.steps)
        printf("validation loss %.6f (%d batches of data.val, %lld tokens)\n", r->val_loss,
               t->eval.batches, (long long)t->eval.batches * t->job.batch * t->job.seq);
    fflush(stdout);
}

/* ", \"name\": value" in format fmt; JSON has no inf or nan, so a number
 * that is not finite (an overflowed gradient norm) is null. */
static void json_number(FILE *f, const char *name, const char *fmt, double value)
{
    fprintf(f, ", \"%s\": ", name);
    if (isfinite(value))
        fprintf(f, fmt, value);
    else
        fprintf(f, "null");
}

/* Validation before the first step: its own progress and metrics line. */
void trainer_report_validation(const trainer *t, float val_loss)
{
    FILE *metrics = t->report.metrics;
    printf("step %4lld/%lld | val %.6f (before training)\n", (long long)t->job.step,
           (long long)t->job.steps, val_loss);
    fflush(stdout);
    if (metrics) {
        fprintf(metrics, "{\"step\": %lld", (long long)t->job.step);
        json_number(metrics, "val_loss", "%.9g", val_loss);
        fprintf(metrics, "}\n");
    }
}

/* "host": {"params": 1024, ..., "total": 4096}, ... for every tier used:
 * peaks, or the bytes held now. */
static void write_tier_bytes(FILE *f, const loom_mem_usage *u, int peaks)
{
    int first_tier = 1;
    for (int tier = 0; tier < LOOM_TIER_COUNT; tier++) {
        if (!u->peak_total[tier])
            continue;
        const uint64_t *bytes = peaks ? u->peak[tier] : u->current[tier];
        uint64_t total = 0;
        fprintf(f, "%s\"%s\": {", first_tier ? "" : ", ", loom_tier_name((loom_tier)tier));
        for (int p = 0; p < LOOM_PURPOSE_COUNT; p++) {
            fprintf(f, "%s\"%s\": %llu", p ? ", " : "", loom_purpose_name((loom_purpose)p),
                    (unsigned long long)bytes[p]);
            total += bytes[p];
        }
        fprintf(f, ", \"total\": %llu}",
                (unsigned long long)(peaks ? u->peak_total[tier] : total));
        first_tier = 0;
    }
}

void trainer_write_metrics(FILE *f, trainer *t, const step_result *r)
{
    double tps = (double)t->job.batch * t->job.seq / r->seconds;
    loom_mem_usage u;
    loom_mem_usage_get(&u);
    fprintf(f, "{\"step\": %lld", (long long)t->job.step + 1);
    json_number(f, "loss", "%.9g", r->loss);
    json_number(f, "lr", "%.9g", r->lr);
    json_number(f, "grad_norm", "%.9g", r->grad_norm);
    json_number(f, "tokens_per_s", "%.3f", tps);
    json_number(f, "step_ms", "%.3f", r->seconds * 1e3);
    json_number(f, "mfu", "%.6f", step_mfu(t, tps, 0)); /* null where the peak is not trusted */
    fprintf(f, ", \"skipped\": %s", r->skipped ? "true" : "false");
    json_number(f, "loss_scale", "%g", t->scaler.scale);
    fprintf(f, ", \"held_bytes\": {");
    /* what stays between steps (offloaded state has left the host), and
     * the peaks last, where the older readers of this line look for them */
    write_tier_bytes(f, &u, 0);
    fprintf(f, "}");
    /* this step's tier traffic by purpose, and the time spent waiting on it:
     * "tier_bytes": {"read": {"optimizer": 4096, ...}, "written": {...}} */
    fprintf(f, ", \"tier_bytes\": {");
    for (int k = 0; k < 2; k++) {
        const uint64_t *moved = k ? t->report.tier_step.written : t->report.tier_step.read;
        fprintf(f, "%s\"%s\": {", k ? ", " : "", k ? "written" : "read");
        for (int p = 0; p < LOOM_PURPOSE_COUNT; p++)
            fprintf(f, "%s\"%s\": %llu", p ? ", " : "", loom_purpose_name((loom_purpose)p),
                    (unsigned long long)moved[p]);
        fprintf(f, "}");
    }
    fprintf(f, "}");
    json_number(f, "tier_wait_ms", "%.3f", (double)t->report.tier_step.wait_ns / 1e6);
    fprintf(f, ", \"peak_bytes\": {");
    write_tier_bytes(f, &u, 1);
    fprintf(f, "}");
    if (t->pipe.executor) {
        loom_pipeline_stats st;
        loom_pipeline_get_stats(t->pipe.executor, &st);
        json_number(f, "bubble", "%.6f", t->pipe.bubble);
        fprintf(f, ", \"live_microbatches\": %d", st.peak_live);
        for (int k = 0; k < 2; k++) {
            fprintf(f, ", \"stage_%s\": [", k ? "live_microbatches" : "activation_bytes");
            for (int stage = 0; stage < t->job.mesh->sizes[LOOM_AXIS_PP]; stage++)
                fprintf(f, "%s%lld", stage ? ", " : "",
                        (long long)t->pipe.stage_peaks[2 * stage + k]);
            fprintf(f, "]");
        }
    }
    /* this step's traffic per axis and op, from the groups' counters:
     * "comm_bytes": {"tp.allreduce": 4096, ...}, the same keys for calls */
    for (int k = 0; k < 2; k++) {
        fprintf(f, ", \"comm_%s\": {", k ? "calls" : "bytes");
        int first = 1;
        for (int a = 0; a < LOOM_AXIS_COUNT; a++)
            for (int op = 0; op < LOOM_OP_COUNT; op++) {
                uint64_t n =
                    k ? t->report.comm_step[a].calls[op] : t->report.comm_step[a].bytes[op];
                if (!t->report.comm_step[a].calls[op])
                    continue;
                fprintf(f, "%s\"%s.%s\": %llu", first ? "" : ", ", loom_axis_name((loom_axis)a),
                        loom_comm_op_name((loom_comm_op)op), (unsigned long long)n);
                first = 0;
            }
        fprintf(f, "}");
    }
    /* where the step's compute went: "kernel_ms": {"matmul_fwd": 1.5, ...} */
    fprintf(f, ", \"kernel_ms\": {");
    for (int k = 0; k < LOOM_KERNEL_KINDS; k++)
        fprintf(f, "%s\"%s\": %.3f", k ? ", " : "", loom_kernel_kind_name((loom_kernel_kind)k),
                r->kernel_s[k] * 1e3);
    fprintf(f, "}");
    if (r->evaluated)
        json_number(f, "val_loss", "%.9g", r->val_loss);
    fprintf(f, "}\n");
    fflush(f);
}

void trainer_count_kernel_times(trainer *t, const step_result *r)
{
    for (int k = 0; k < LOOM_KERNEL_KINDS; k++) {
        t->report.kernel_sum_s[k] += r->kernel_s[k];
        if (t->report.steps_timed == 0)
            t->report.kernel_first_s[k] = r->kernel_s[k];
    }
    t->report.step_sum_s += r->seconds;
    if (t->report.steps_timed == 0)
        t->report.step_first_s = r->seconds;
    t->report.steps_timed++;
}

/* The end of the run: per kernel kind its mean ms per step and its share
 * of the compute (the time inside the model and the optimizer), on this
 * rank, over the steps after the first (or the only one). */
void trainer_print_kernel_summary(const trainer *t)
{
    if (t->report.steps_timed == 0)
        return;
    int64_t n = t->report.steps_timed > 1 ? t->report.steps_timed - 1 : 1;
    double ms[LOOM_KERNEL_KINDS], compute = 0;
    for (int k = 0; k < LOOM_KERNEL_KINDS; k++) {
        double s = t->report.kernel_sum_s[k] -
                   (t->report.steps_timed > 1 ? t->report.kernel_first_s[k] : 0);
        ms[k] = 1e3 * s / (double)n;
        compute += ms[k];
    }
    double step =
        1e3 * (t->report.step_sum_s - (t->report.steps_timed > 1 ? t->report.step_first_s : 0)) /
        (double)n;
    char which[64];
    if (t->report.steps_timed > 1)
        snprintf(which, sizeof which, "mean of the %lld steps after the first", (long long)n);
    else
        snprintf(which, sizeof which, "the only step");
    printf("compute by kernel (%s%s): %.1f ms a step of %.1f ms (%.0f%%) in the model and the "
           "optimizer\n",
           which, t->job.world > 1 ? ", rank 0" : "", compute, step,
           step > 0 ? 100 * compute / step : 0.0);
    printf("  %-13s %10s %12s\n", "kernel", "ms/step", "% of compute");
    for (int k = 0; k < LOOM_KERNEL_KINDS; k++)
        printf("  %-13s %10.2f %11.1f%%\n", loom_kernel_kind_name((loom_kernel_kind)k), ms[k],
               compute > 0 ? 100 * ms[k] / compute : 0.0);
    fflush(stdout);
}

/* Which units each pipeline stage holds, and on which pp rank. */
static void print_stages(const trainer *t)
{
    int p = t->job.mesh->sizes[LOOM_AXIS_PP], stages = p * t->pipe.schedule.virtual_stages;
    printf("pipeline stages:");
    for (int st = 0; st < stages; st++) {
        int first = t->pipe.stage_first[st], last = t->pipe.stage_last[st], L = t->job.shape.layers;
        int b0 = first == 0 ? 0 : first - 1, b1 = last == L + 1 ? L - 1 : last - 1;
        printf("%s %d (pp rank %d):%s", st ? " |" : "", st, st % p, first == 0 ? " embedding" : "");
        if (b1 >= b0)
            printf("%s block%s %d", first == 0 ? " +" : "", b1 > b0 ? "s" : "", b0);
        if (b1 > b0)
            printf("-%d", b1);
        if (last == L + 1)
            printf(" + head");
    }
    printf("\n");
}

void trainer_print_header(const trainer *t)
{
    size_t params = 0;
    for (int i = 0; i < t->job.nunits; i++)
        params += loom_model_full_numel(t->job.model, i);
    char desc[768] = "";
    if (t->data_axis.ops->describe)
        t->data_axis.ops->describe(t->data_axis.strategy, desc, 256);
    if (t->data_axis.ops->capabilities & LOOM_STRATEGY_APPROXIMATE)
        snprintf(desc + strlen(desc), sizeof desc - strlen(desc), " (approximate)");
    const axis_strategy *axes[2] = {&t->axes.tp, &t->axes.sp};
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(desc);
        if (axes[i]->s && n + 3 < sizeof desc) {
            snprintf(desc + n, sizeof desc - n, "; ");
            axes[i]->ops->describe(axes[i]->s, desc + n + 2, sizeof desc - n - 2);
        }
    }
    size_t n = strlen(desc);
    if (t->pipe.schedule_plugin)
        snprintf(desc + n, sizeof desc - n, "; %s schedule over %d stages",
                 t->pipe.schedule_plugin->header->name, t->job.mesh->sizes[LOOM_AXIS_PP]);
    printf("loom train: GPT-2 L=%d C=%d NH=%d V=%d (Vp %d), %.2fM parameters; batch %d x seq %d "
           "(micro-batch %d x %d %s); %s; %s; %d rank%s, dp over %s; MFU against "
           "%.1f GFLOP/s per rank (%s)\n",
           t->job.shape.layers, t->job.shape.channels, t->job.shape.heads, t->job.shape.vocab,
           t->job.shape.padded_vocab, (double)params / 1e6, t->job.batch, t->job.seq,
           t->job.micro_batch, t->job.micro_batches,
           t->pipe.executor ? "pipelined" : "accumulation", loom_dtype_name(t->job.dtype), desc,
           t->job.world, t->job.world == 1 ? "" : "s",
           loom_core_comm_api.backend(t->job.mesh->groups[LOOM_AXIS_DP]),
           t->report.peak_flops / 1e9, t->report.peak_source);
    const char *products = loom_gemm_products_note();
    printf("cpu: %s; %s\n", loom_cpu_describe(),
           products[0]                 ? products
           : t->job.dtype == LOOM_BF16 ? "bf16 storage and products"
                                       : "f32 products");
    char compute[256] = "";
    t->job.backend->ops->describe(t->job.backend->self, compute, sizeof compute);
    printf("compute: %s (%s)\n", compute, t->job.device_why);
    if (t->job.mesh->comm_choice[0])
        printf("comm: %s\n", t->job.mesh->comm_choice);
    char ranks[128];
    loom_launch_env_describe(loom_runtime_env(t->job.rt), ranks, sizeof ranks);
    printf("ranks: %s\n", ranks);
    if (loom_launch_binding())
        printf("launch: %s\n", loom_launch_binding());
    if (t->pipe.executor)
        print_stages(t);
    fflush(stdout);
}

/* Every rank writes its part; rank 0 merges them once all have. */
int trainer_write_trace(trainer *t, const char *path)
{
    char **parts = calloc((size_t)t->job.world, sizeof *parts);
    int rc = parts ? LOOM_OK : loom_fail(LOOM_ERR_NO_MEMORY, "trace: out of memory");
    for (int r = 0; r < t->job.world && rc == LOOM_OK; r++) {
        size_t len = strlen(path) + 32;
        if (!(parts[r] = malloc(len)))
            rc = loom_fail(LOOM_ERR_NO_MEMORY, "trace: out of memory");
        else
            snprintf(parts[r], len, "%s.rank%d", path, r);
    }
    if (rc == LOOM_OK)
        rc = loom_trace_write_part(parts[t->job.rank]);
    loom_store *store = loom_runtime_store(t->job.rt);
    if (rc == LOOM_OK && store)
        rc = loom_store_barrier(store, "train/trace", loom_runtime_timeout(t->job.rt));
    if (rc == LOOM_OK && t->job.rank == 0) {
        rc = loom_trace_merge(path, (const char *const *)parts, t->job.world);
        if (rc == LOOM_OK)
            printf("wrote trace %s\n", path);
    }
    for (int r = 0; parts && r < t->job.world; r++)
        free(parts[r]);
    free(parts);
    return rc;
}

/* A sample on one line of the log: a byte-level model's bytes with
 * newlines, backslashes and other non-printing bytes escaped (\n, \\,
 * \xNN); a larger vocabulary's token ids, which only a tokenizer could
 * turn into text. */
static void print_sample_line(const int *tokens, int count, int vocab)
{
    fputs("sample: ", stdout);
    for (int i = 0; i < count; i++) {
        int c = tokens[i];
        if (vocab > 256)
            printf("%s%d", i ? " " : "tokens ", c);
        else if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c == '\\')
            fputs("\\\\", stdout);
        else if (c >= 0x20 && c < 0x7f)
            putchar(c);
        else
            printf("\\x%02x", c);
    }
    putchar('\n');
    fflush(stdout);
}

/* train.sample_every: the whole current weights gathered to rank 0 (through
 * a scratch checkpoint under scratch_parent, train.checkpoint_dir, which
 * every rank sees), and `tokens` greedy tokens from the start token:
 * greedy depends on nothing but the weights, so every mesh prints the same
 * sample (up to the rounding its weights differ by). The others wait. */
int trainer_print_sample(trainer *t, int tokens, const char *scratch_parent)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%.4000s/sample-step-%lld", scratch_parent, (long long)t->job.step);
    char made[4096] = "", why[512];
    /* a failure here is the gather's to report, on every rank */
    if (t->job.rank == 0 &&
        trainer_make_dirs(scratch_parent, made, sizeof made, why, sizeof why) != 0)
        made[0] = '\0';
    float *weights = NULL;
    int rc = trainer_gather_weights(t, dir, &weights);
    if (t->job.rank == 0)
        trainer_remove_made_dirs(scratch_parent, made); /* only what the sample left empty */
    if (rc != LOOM_OK || t->job.rank != 0)
        return rc;
    int start = loom_sample_start_token(t->job.shape.vocab);
    int *out = malloc((size_t)tokens * sizeof *out);
    loom_sample_options o = {.tokens = tokens, .temperature = 0.0f};
    rc = out ? loom_sample(&t->job.shape, weights, &start, 1, &o, out)
             : loom_fail(LOOM_ERR_NO_MEMORY, "train.sample_every: out of memory");
    if (rc == LOOM_OK)
        print_sample_line(out, tokens, t->job.shape.vocab);
    free(out);
    free(weights);
    return rc;
}

/* ---- the component's life: --metrics, --trace and the header; each
 * step's report; samples ---- */

int trainer_open_reporting(trainer *t, const loom_train_options *o)
{
    trainer_reporting *r = &t->report;
    /* a restarted job adds to what its first run wrote (a step redone
     * since the checkpoint appears again, later) */
    const char *restarted = getenv("LOOM_RESTART");
    /* "{rank}" in the path: every rank writes its own lines (its memory and
     * traffic, which differ along a pipeline); otherwise rank 0 alone */
    char path[4096] = "";
    const char *mark = o->metrics ? strstr(o->metrics, "{rank}") : NULL;
    if (mark)
        snprintf(path, sizeof path, "%.*s%d%s", (int)(mark - o->metrics), o->metrics, t->job.rank,
                 mark + strlen("{rank}"));
    else if (o->metrics)
        snprintf(path, sizeof path, "%s", o->metrics);
    if (o->metrics && (t->job.rank == 0 || mark) &&
        !(r->metrics = fopen(path, restarted && atoi(restarted) > 0 ? "a" : "w")))
        return loom_fail(LOOM_ERR_INVALID, "--metrics %s: %s", path, strerror(errno));
    if (o->trace)
        loom_trace_enable(t->job.rank);
    loom_config_int(t->job.cfg, "train.sample_every", &r->sample_every);
    loom_config_int(t->job.cfg, "train.sample_tokens", &r->sample_tokens);
    if (t->job.rank == 0)
        trainer_print_header(t);
    return LOOM_OK;
}

void trainer_report_step(trainer *t, const step_result *r)
{
    trainer_count_kernel_times(t, r);
    if (t->job.rank == 0)
        trainer_print_progress(t, r);
    if (t->report.metrics)
        trainer_write_metrics(t->report.metrics, t, r);
}

int trainer_sample_due(trainer *t)
{
    int64_t every = t->report.sample_every;
    if (every <= 0 || t->job.step % every != 0)
        return LOOM_OK;
    return trainer_print_sample(t, (int)t->report.sample_tokens, t->ckpt.dir);
}

void trainer_close_reporting(trainer *t)
{
    if (t->report.metrics)
        fclose(t->report.metrics);
    t->report.metrics = NULL;
}

/* The tier and comm counters at a step's start (end 0), and what the step
 * moved (end 1). */
void trainer_count_traffic(trainer *t, int end)
{
    loom_tier_counters now;
    loom_tiers_counters(t->job.tiers, &now);
    if (!end) {
        t->report.tier_start = now;
    } else {
        for (int p = 0; p < LOOM_PURPOSE_COUNT; p++) {
            t->report.tier_step.read[p] = now.read[p] - t->report.tier_start.read[p];
            t->report.tier_step.written[p] = now.written[p] - t->report.tier_start.written[p];
        }
        t->report.tier_step.wait_ns = now.wait_ns - t->report.tier_start.wait_ns;
    }
    for (int a = 0; a < LOOM_AXIS_COUNT; a++) {
        loom_comm_counters moved;
        loom_group_counters(t->job.mesh->groups[a], &moved);
        if (!end) {
            t->report.comm_start[a] = moved;
            continue;
        }
        for (int op = 0; op < LOOM_OP_COUNT; op++) {
            t->report.comm_step[a].calls[op] = moved.calls[op] - t->report.comm_start[a].calls[op];
            t->report.comm_step[a].bytes[op] = moved.bytes[op] - t->report.comm_start[a].bytes[op];
        }
    }
}

/* The peak MFU is measured against: train.peak_gflops, or the matrix
 * products' rate on this rank measured at start on the model's MLP-up
 * product of one micro-batch (rows x 4C x C). */
/* A device's peak: its own products in the dtype the run multiplies in. */
static int measure_backend_peak(trainer *t, int M, int N, int K)
{
    const loom_backend *b = t->job.backend;
    loom_dtype multiply = b->ops->multiply_dtype(b->self, t->job.dtype);
    t->report.peak_flops = loom_backend_measure_gemm(b, M, N, K, multiply, 0.2);
    if (t->report.peak_flops <= 0) {
        char why[1024];
        snprintf(why, sizeof why, "%s", loom_last_error());
        return loom_fail(LOOM_ERR_INTERNAL,
                         "train: measuring the %s backend's matrix products (set "
                         "train.peak_gflops to skip it): %s",
                         b->name, why);
    }
    snprintf(t->report.peak_source, sizeof t->report.peak_source,
             "the %s backend's %s products, measured at start on %dx%dx%d", b->name,
             loom_dtype_name(multiply), M, N, K);
    t->report.peak_flops *= trainer_test_peak_scale();
    return LOOM_OK;
}

int trainer_measure_peak(trainer *t)
{
    int rc;
    double stated = trainer_read_float(t->job.cfg, "train.peak_gflops");
    if (stated > 0) {
        t->report.peak_flops = stated * 1e9;
        snprintf(t->report.peak_source, sizeof t->report.peak_source, "train.peak_gflops");
        return LOOM_OK;
    }
    int rows = t->job.micro_batch * t->job.seq, C = t->job.shape.channels;
    const loom_backend *b = t->job.backend;
    if (b->ops->tier == LOOM_TIER_DEVICE)
        return measure_backend_peak(t, rows, 4 * C, C);
    t->report.peak_flops = loom_gemm_measure(rows, 4 * C, C, 0.2);
    if (t->report.peak_flops <= 0)
        return (rc = loom_gemm_take_error()) != LOOM_OK
                   ? rc
                   : loom_fail(LOOM_ERR_NO_MEMORY, "train: out of memory measuring the matrix "
                                                   "products");
    snprintf(t->report.peak_source, sizeof t->report.peak_source,
             "%s, measured at start on %dx%dx%d", loom_gemm_describe(), rows, 4 * C, C);
    t->report.peak_flops *= trainer_test_peak_scale();
    return LOOM_OK;
}
