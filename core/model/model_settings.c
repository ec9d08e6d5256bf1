/* The model layer's settings (model_settings.h) and the relations between
 * them. */
#include <string.h>

#include "loom/status.h"
#include "model/model_settings.h"
#include "runtime/config.h"
#include "runtime/log.h"

static const char *const model_kinds[] = {"gpt2", "llama", NULL};
static const char *const model_inits[] = {"random", "checkpoint", NULL};
static const char *const gemm_libraries[] = {"auto", "onednn", "openblas", NULL};

#define S(path_, type_, def_, ...) LOOM_CFG_SETTING(path_, type_, def_, __VA_ARGS__)

static const loom_config_setting settings[] = {
    S("model.kind", LOOM_CFG_STRING, "gpt2", .choices = model_kinds, .help = "model family"),
    S("model.layers", LOOM_CFG_INT, "4", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "transformer blocks"),
    S("model.heads", LOOM_CFG_INT, "4", .lo = 1, .flags = LOOM_CFG_GE, .help = "attention heads"),
    S("model.kv_heads", LOOM_CFG_INT, "0", .lo = 0, .flags = LOOM_CFG_GE,
      .help = "llama: key/value heads of grouped-query attention; 0 = model.heads"),
    S("model.ffn", LOOM_CFG_INT, "0", .lo = 0, .flags = LOOM_CFG_GE,
      .help = "llama: MLP width; 0 = 4 x channels"),
    S("model.channels", LOOM_CFG_INT, "128", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "embedding width"),
    S("model.vocab", LOOM_CFG_INT, "256", .lo = 1, .flags = LOOM_CFG_GE, .help = "vocabulary size"),
    S("model.padded_vocab", LOOM_CFG_INT, "256", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "vocabulary padded for efficient kernels (>= vocab)"),
    S("model.max_seq", LOOM_CFG_INT, "256", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "longest sequence"),
    S("model.init", LOOM_CFG_STRING, "random", .choices = model_inits,
      .help = "random weights, or load model.checkpoint (which then gives the shape settings "
      "left unset)"),
    S("model.gemm", LOOM_CFG_STRING, "auto", .choices = gemm_libraries,
      .help = "library of the matrix products; auto = oneDNN when built with it, else OpenBLAS"),
    S("model.device", LOOM_CFG_STRING, "cpu", .flags = LOOM_CFG_NONEMPTY,
      .help = "compute backend the model runs on: \"cpu\", \"auto\" (cuda where its plugin "
      "loads and sees a device, else cpu) or a compute plugin's name (\"cuda\", \"sim\")"),
    S("model.seed", LOOM_CFG_INT, "1337", .flags = LOOM_CFG_WIDE,
      .help = "seed of the random init"),
    S("model.checkpoint", LOOM_CFG_STRING, "",
      .help = "llm.c checkpoint file (version 3 fp32 or 5 bf16) for init = checkpoint"),

    S("data.train", LOOM_CFG_GLOBS, "",
      .help = "llm.c token shards to train on: a path or glob pattern, or a list of them"),
    S("data.val", LOOM_CFG_GLOBS, "",
      .help = "llm.c token shards to validate on: a path or glob pattern, or a list of them"),
    S("data.shuffle", LOOM_CFG_BOOL, "true",
      .help = "llm.c's shuffling: shard order per epoch, sample order per shard"),
    S("data.readers", LOOM_CFG_INT, "1", .lo = 1, .flags = LOOM_CFG_GE,
      .help = "llm.c processes whose batches loom reproduces (llm.c's world size), whatever "
      "loom's mesh"),
    S("data.read_batch", LOOM_CFG_INT, "0", .lo = 0, .flags = LOOM_CFG_GE,
      .help = "sequences per reader per read (llm.c's -b); 0 = train.batch / data.readers"),
};

#undef S

static int check_init(const loom_config *cfg)
{
    const char *init = "", *ckpt = "";
    loom_config_string(cfg, "model.init", &init);
    loom_config_string(cfg, "model.checkpoint", &ckpt);
    if (!strcmp(init, "checkpoint") && !ckpt[0])
        return loom_config_fail_relation(
            cfg, "model.checkpoint", "model.init",
            "required when model.init = \"checkpoint\"; name the llm.c checkpoint file, e.g. "
            "model.checkpoint = \"gpt2_124M.bin\"");
    if (!strcmp(init, "random") && ckpt[0])
        return loom_config_fail_relation(
            cfg, "model.checkpoint", "model.init",
            "\"%s\" is not read: model.init is \"random\"%s; set model.init = \"checkpoint\" to "
            "start from the file, or remove model.checkpoint",
            ckpt, loom_config_is_set(cfg, "model.init") ? "" : " (the default)");
    return LOOM_OK;
}

/* GPT-2's attention has a key and value per head and an MLP of 4C: these
 * shape a llama, which loom plans but does not train. */
static int check_llama_shape(const loom_config *cfg)
{
    const char *kind = "gpt2";
    loom_config_string(cfg, "model.kind", &kind);
    static const char *const llama_only[] = {"model.kv_heads", "model.ffn"};
    for (size_t i = 0; i < LOOM_ARRAY_LEN(llama_only) && !strcmp(kind, "gpt2"); i++)
        if (loom_config_is_set(cfg, llama_only[i]))
            return loom_config_fail_relation(
                cfg, llama_only[i], "model.kind",
                "shapes model.kind = \"llama\" only (GPT-2 has one key and value head per head "
                "and an MLP of 4 x channels); remove it");
    if (!strcmp(kind, "llama")) {
        int64_t heads = 1, kv = 0;
        loom_config_int(cfg, "model.heads", &heads);
        loom_config_int(cfg, "model.kv_heads", &kv);
        if (kv > 0 && heads % kv)
            return loom_config_fail_relation(cfg, "model.kv_heads", "model.heads",
                                             "expected a divisor of model.heads (%lld), found %lld",
                                             (long long)heads, (long long)kv);
    }
    return LOOM_OK;
}

/* A checkpoint brings its own shape; these hold for a model we build. */
static int check_built_shape(const loom_config *cfg)
{
    const char *init = "";
    loom_config_string(cfg, "model.init", &init);
    if (strcmp(init, "random"))
        return LOOM_OK;
    int64_t vocab = 0, padded = 0, channels = 0, heads = 1;
    loom_config_int(cfg, "model.vocab", &vocab);
    loom_config_int(cfg, "model.padded_vocab", &padded);
    loom_config_int(cfg, "model.channels", &channels);
    loom_config_int(cfg, "model.heads", &heads);
    if (padded < vocab)
        return loom_config_fail_relation(cfg, "model.padded_vocab", "model.vocab",
                                         "expected an integer >= model.vocab (%lld), found %lld",
                                         (long long)vocab, (long long)padded);
    if (channels % heads)
        return loom_config_fail_relation(cfg, "model.channels", "model.heads",
                                         "expected a multiple of model.heads (%lld), found %lld",
                                         (long long)heads, (long long)channels);
    return LOOM_OK;
}

static int check_relations(const loom_config *cfg)
{
    int rc = check_init(cfg);
    if (rc == LOOM_OK)
        rc = check_llama_shape(cfg);
    if (rc == LOOM_OK)
        rc = check_built_shape(cfg);
    return rc;
}

const loom_config_settings loom_model_settings = {
    .settings = settings,
    .count = LOOM_ARRAY_LEN(settings),
    .check = check_relations,
};
