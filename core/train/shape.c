/* loom train — The model's shape: model.* of the config, or, with
 * model.init = "checkpoint", the checkpoint's header for every shape setting
 * the config leaves unset. */
#include <stdio.h>
#include <string.h>

#include "loom/status.h"
#include "runtime/log.h"
#include "train/train.h"

int loom_train_model_shape(loom_config *cfg, loom_gpt2_shape *shape)
{
    struct {
        const char *path;
        const char *letter; /* llm.c's name of the header field */
        int *field;
    } settings[] = {
        {"model.layers", "L", &shape->layers},
        {"model.heads", "NH", &shape->heads},
        {"model.channels", "C", &shape->channels},
        {"model.vocab", "V", &shape->vocab},
        {"model.padded_vocab", "Vp", &shape->padded_vocab},
        {"model.max_seq", "maxT", &shape->max_seq},
    };
    const char *init = "random", *path = "", *kind = "gpt2";
    loom_config_string(cfg, "model.kind", &kind);
    if (strcmp(kind, "gpt2"))
        return loom_fail(LOOM_ERR_INVALID, "%s: model.kind = \"%s\": loom plans this shape "
                         "(loom plan) but trains GPT-2 only; set model.kind = \"gpt2\"",
                         loom_config_where(cfg, "model.kind"), kind);
    loom_config_string(cfg, "model.init", &init);
    loom_config_string(cfg, "model.checkpoint", &path);
    loom_gpt2_shape file = {0};
    int rc, from_file = !strcmp(init, "checkpoint");
    if (from_file && (rc = loom_checkpoint_read_header(path, &file, NULL)) != LOOM_OK)
        return rc;
    const int file_values[] = {file.layers,   file.heads,        file.channels,
                               file.vocab,    file.padded_vocab, file.max_seq};
    char source[4200];
    snprintf(source, sizeof source, "%.4000s's header", path);
    for (size_t i = 0; i < LOOM_ARRAY_LEN(settings); i++) {
        int64_t v = 0;
        if (from_file && !loom_config_is_set(cfg, settings[i].path)) {
            if ((rc = loom_config_derive_int(cfg, settings[i].path, file_values[i], source)) !=
                LOOM_OK)
                return rc;
        }
        loom_config_int(cfg, settings[i].path, &v);
        *settings[i].field = (int)v;
        if (from_file && v != file_values[i])
            return loom_fail(LOOM_ERR_INVALID,
                             "%s: %s = %lld, but %s holds %s = %d; remove %s to take the "
                             "checkpoint's, or name a checkpoint of this shape",
                             loom_config_where(cfg, settings[i].path), settings[i].path,
                             (long long)v, path, settings[i].letter, file_values[i],
                             settings[i].path);
    }
    /* A checkpoint's shape was not known when the config's relations were
     * checked. */
    int64_t seq = 0;
    loom_config_int(cfg, "train.seq", &seq);
    if (from_file && seq > shape->max_seq) {
        char max_seq_from[4200];
        snprintf(max_seq_from, sizeof max_seq_from, "%s", loom_config_where(cfg, "model.max_seq"));
        return loom_fail(LOOM_ERR_INVALID,
                         "%s: train.seq: expected an integer <= model.max_seq (%d, from %s), "
                         "found %lld",
                         loom_config_is_set(cfg, "train.seq") ? loom_config_where(cfg, "train.seq")
                                                              : path,
                         shape->max_seq, max_seq_from, (long long)seq);
    }
    return LOOM_OK;
}
