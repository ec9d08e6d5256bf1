/* The train layer's settings (train_settings.h) and the relations between
 * them, and to the model's and the data's settings below. */
#include <string.h>

#include "loom/status.h"
#include "runtime/config.h"
#include "runtime/log.h"
#include "train/train_settings.h"

static const char *const lr_schedules[] = {"constant", "cosine", NULL};
static const char *const decays[] = {"all", "matrices", NULL};
static const char *const precisions[] = {"fp32", "bf16", "fp16", NULL};
static const char *const recomputes[] = {"none", "block", NULL};

#define S(path_, type_, def_, ...) LOOM_CFG_SETTING(path_, type_, def_, __VA_ARGS__)

static const loom_config_setting settings[] = {
    S("train.batch", LOOM_CFG_INT, "8", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "global batch, in sequences"),
    S("train.seq", LOOM_CFG_INT, "64", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "tokens per sequence"),
    S("train.steps", LOOM_CFG_INT, "100", .lo = 1, .flags = LOOM_CFG_GE | LOOM_CFG_WIDE,
      .help = "optimizer steps"),
    S("train.lr", LOOM_CFG_FLOAT, "1e-3", .lo = 0, .flags = LOOM_CFG_GE,
      .help = "peak learning rate"),
    S("train.weight_decay", LOOM_CFG_FLOAT, "0.0", .lo = 0, .flags = LOOM_CFG_GE,
      .help = "AdamW weight decay"),
    S("train.decay", LOOM_CFG_STRING, "all", .choices = decays,
      .help = "what weight decay applies to: every parameter (llm.c's CPU trainer), or only the "
      "matrices wte, wpe, qkvw, attprojw, fcw, fcprojw (its GPU trainer)"),
    S("train.beta1", LOOM_CFG_FLOAT, "0.9", .lo = 0, .hi = 1, .flags = LOOM_CFG_GE | LOOM_CFG_LT,
      .help = "AdamW beta1"),
    S("train.beta2", LOOM_CFG_FLOAT, "0.999", .lo = 0, .hi = 1, .flags = LOOM_CFG_GE | LOOM_CFG_LT,
      .help = "AdamW beta2"),
    S("train.eps", LOOM_CFG_FLOAT, "1e-8", .lo = 0, .flags = LOOM_CFG_GT, .help = "AdamW epsilon"),
    S("train.warmup", LOOM_CFG_INT, "0", .lo = 0, .flags = LOOM_CFG_GE | LOOM_CFG_WIDE,
      .help = "linear warm-up steps"),
    S("train.schedule", LOOM_CFG_STRING, "constant", .choices = lr_schedules,
      .help = "lr schedule: the learning rate after warm-up"),
    S("train.clip", LOOM_CFG_FLOAT, "0.0", .lo = 0, .flags = LOOM_CFG_GE,
      .help = "gradient-norm clipping; 0 = no clipping"),
    S("train.grad_accum", LOOM_CFG_INT, "1", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "micro-steps per step"),
    S("train.precision", LOOM_CFG_STRING, "fp32", .choices = precisions,
      .help = "compute precision"),
    S("train.recompute", LOOM_CFG_STRING, "none", .choices = recomputes,
      .help = "activation recomputation"),
    S("train.lr_final_frac", LOOM_CFG_FLOAT, "0.0", .lo = 0, .hi = 1,
      .flags = LOOM_CFG_GE | LOOM_CFG_LE,
      .help = "cosine lr schedule: final learning rate as a fraction of train.lr"),
    S("train.threads", LOOM_CFG_INT, "1", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "threads per rank: the matrix products and the kernels (OpenMP), the same results "
      "for any count; ranks x threads should not exceed the cores"),
    S("train.peak_gflops", LOOM_CFG_FLOAT, "0.0", .lo = 0, .flags = LOOM_CFG_GE,
      .help = "per-rank peak for MFU; 0 = measure the matrix products at start"),
    S("train.loss_scale", LOOM_CFG_FLOAT, "65536.0", .lo = 0, .flags = LOOM_CFG_GT,
      .help = "fp16: initial dynamic loss scale"),
    S("train.loss_scale_window", LOOM_CFG_INT, "1000", .lo = 1,
      .flags = LOOM_CFG_GE | LOOM_CFG_WIDE,
      .help = "fp16: good steps before the loss scale doubles"),
    S("train.max_skipped", LOOM_CFG_INT, "10", .lo = 0, .flags = LOOM_CFG_GE,
      .help = "stop with an error after this many steps in a row whose loss or gradient norm is "
      "not finite (fp16: a gradient overflow counts only once the loss scale is down to 1); 0 = "
      "never stop"),
    S("train.eval_every", LOOM_CFG_INT, "0", .lo = 0, .flags = LOOM_CFG_GE,
      .help = "validate every N steps, before the first and after the last (0: after the last "
      "only; needs data.val)"),
    S("train.eval_batches", LOOM_CFG_INT, "20", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "global batches of data.val each validation reads (needs data.val)"),
    S("train.checkpoint_every", LOOM_CFG_INT, "0", .lo = 0, .flags = LOOM_CFG_GE,
      .help = "save a resumable checkpoint every N steps (0 = never)"),
    S("train.checkpoint_dir", LOOM_CFG_STRING, "checkpoints", .flags = LOOM_CFG_NONEMPTY,
      .help = "where train.checkpoint_every writes step-N/ (a shard file per rank); one job's at "
      "a time (loom.lock)"),
    S("train.checkpoint_overwrite", LOOM_CFG_BOOL, "false",
      .help = "let this run write into a train.checkpoint_dir holding another run's checkpoints "
      "(replacing those of the steps it saves)"),
    S("train.keep_checkpoints", LOOM_CFG_INT, "0", .lo = 0, .flags = LOOM_CFG_GE,
      .help = "keep the last N checkpoints, remove older ones (0 = keep all)"),
    S("train.checkpoint_async", LOOM_CFG_BOOL, "false",
      .help = "write each checkpoint from a thread while training goes on: the state is copied "
      "to host memory at the checkpoint step, and the checkpoint is in place a few steps later"),
    S("train.sample_every", LOOM_CFG_INT, "0", .lo = 0, .flags = LOOM_CFG_GE,
      .help = "print a greedy sample of the model every N steps (0 = never)"),
    S("train.sample_tokens", LOOM_CFG_INT, "32", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "tokens in each train.sample_every sample"),
};

#undef S

/* Settings that do nothing without another one. */
static int check_needs(const loom_config *cfg)
{
    const char *decay = "all";
    double weight_decay = 0;
    loom_config_string(cfg, "train.decay", &decay);
    loom_config_float(cfg, "train.weight_decay", &weight_decay);
    if (!strcmp(decay, "matrices") && weight_decay == 0)
        return loom_config_fail_relation(
            cfg, "train.decay", "train.weight_decay",
            "\"matrices\" picks the tensors train.weight_decay applies to, and "
            "train.weight_decay is 0; set a weight decay or remove train.decay");

    int64_t checkpoint_every = 0;
    loom_config_int(cfg, "train.checkpoint_every", &checkpoint_every);
    static const char *const of_checkpoints[] = {"train.keep_checkpoints",
                                                 "train.checkpoint_async",
                                                 "train.checkpoint_overwrite"};
    for (size_t i = 0; checkpoint_every == 0 && i < LOOM_ARRAY_LEN(of_checkpoints); i++)
        if (loom_config_is_set(cfg, of_checkpoints[i]))
            return loom_config_fail_relation(
                cfg, of_checkpoints[i], "train.checkpoint_every",
                "does nothing without checkpoints; set train.checkpoint_every = N, or remove %s",
                of_checkpoints[i]);

    int64_t sample_every = 0;
    loom_config_int(cfg, "train.sample_every", &sample_every);
    if (sample_every == 0 && loom_config_is_set(cfg, "train.sample_tokens"))
        return loom_config_fail_relation(cfg, "train.sample_tokens", "train.sample_every",
                                         "does nothing without samples; set train.sample_every = "
                                         "N (a sample every N steps) or remove it");

    /* data.val = "" switches validation off, eval settings and all (a
     * command line can turn off what the file sets); never set, they would
     * do nothing */
    if (!loom_config_is_set(cfg, "data.val")) {
        static const char *const eval[] = {"train.eval_every", "train.eval_batches"};
        for (size_t i = 0; i < LOOM_ARRAY_LEN(eval); i++)
            if (loom_config_is_set(cfg, eval[i]))
                return loom_config_fail_relation(
                    cfg, eval[i], "data.val",
                    "validation needs a validation set; set data.val (llm.c token shards), or "
                    "remove %s",
                    eval[i]);
    }
    return LOOM_OK;
}

static int check_relations(const loom_config *cfg)
{
    int rc = check_needs(cfg);
    if (rc != LOOM_OK)
        return rc;
    /* A checkpoint brings its own longest sequence; a model we build has
     * model.max_seq. */
    const char *init = "";
    int64_t max_seq = 0, seq = 0;
    loom_config_string(cfg, "model.init", &init);
    loom_config_int(cfg, "model.max_seq", &max_seq);
    loom_config_int(cfg, "train.seq", &seq);
    if (!strcmp(init, "random") && seq > max_seq)
        return loom_config_fail_relation(cfg, "train.seq", "model.max_seq",
                                         "expected an integer <= model.max_seq (%lld), found %lld",
                                         (long long)max_seq, (long long)seq);
    return LOOM_OK;
}

const loom_config_settings loom_train_settings = {
    .settings = settings,
    .count = LOOM_ARRAY_LEN(settings),
    .check = check_relations,
};
