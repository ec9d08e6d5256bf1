/* loom ckpt: describe a checkpoint, or consolidate a sharded one into a
 * resumable state file or llm.c weights. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/status.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "model/model.h"
#include "runtime/log.h"
#include "train/ckpt_format.h"

static int ckpt_usage(void)
{
    fprintf(stderr, "usage: loom ckpt info PATH\n"
                    "       loom ckpt consolidate PATH [--state FILE] [--llmc FILE "
                    "[--save-dtype fp32|bf16]]\n");
    return 2;
}

/* Any model of the checkpoint's shape gives the units' views. */
static int views_model(const loom_ckpt_header *h, loom_model **out)
{
    loom_model_setup setup;
    memset(&setup, 0, sizeof setup);
    setup.shape = h->shape;
    setup.batch = 1;
    setup.seq = 1;
    setup.dtype = LOOM_F32;
    return loom_model_create(&setup, out);
}

int loom_cmd_ckpt(int argc, char **argv)
{
    if (argc < 3)
        return ckpt_usage();
    const char *sub = argv[1], *path = argv[2], *state_path = NULL, *llmc_path = NULL;
    const char *save_dtype = NULL;
    int info = !strcmp(sub, "info");
    if (!info && strcmp(sub, "consolidate") != 0) {
        fprintf(stderr, "loom ckpt: unknown subcommand '%s'\n", sub);
        return ckpt_usage();
    }
    for (int i = 3; i < argc; i++) {
        if (!info && i + 1 < argc && !strcmp(argv[i], "--state"))
            state_path = argv[++i];
        else if (!info && i + 1 < argc && !strcmp(argv[i], "--llmc"))
            llmc_path = argv[++i];
        else if (!info && i + 1 < argc && !strcmp(argv[i], "--save-dtype"))
            save_dtype = argv[++i];
        else {
            fprintf(stderr, "loom ckpt: unexpected argument '%s'\n", argv[i]);
            return ckpt_usage();
        }
    }
    if (!info && !state_path && !llmc_path) {
        fprintf(stderr, "loom ckpt consolidate: say what to write: --state FILE (resumable) "
                        "and/or --llmc FILE (weights, llm.c's format)\n");
        return 2;
    }
    if (save_dtype && !llmc_path) {
        fprintf(stderr, "loom ckpt consolidate: --save-dtype %s says how --llmc writes the "
                        "weights, and there is no --llmc (--state is always fp32); add --llmc "
                        "FILE or drop --save-dtype\n", save_dtype);
        return 2;
    }
    loom_dtype llmc_dtype;
    int bad = loom_cli_save_dtype("loom ckpt consolidate", save_dtype, &llmc_dtype);
    if (bad)
        return bad;
    loom_ckpt *ck = NULL;
    loom_model *model = NULL;
    int rc = loom_ckpt_open(path, &ck);
    if (rc == LOOM_OK)
        rc = views_model(loom_ckpt_header_of(ck), &model);
    int nunits = 0;
    loom_unit *units = rc == LOOM_OK ? loom_model_units(model, &nunits) : NULL;
    if (rc == LOOM_OK)
        rc = loom_ckpt_check_model(ck, units, nunits);
    if (rc == LOOM_OK && info)
        loom_ckpt_print_info(ck, units, stdout);
    if (rc == LOOM_OK && !info && state_path &&
        (rc = loom_ckpt_write_state(ck, units, state_path)) == LOOM_OK)
        printf("wrote %s (resumable at any mesh: loom train --resume %s)\n", state_path,
               state_path);
    if (rc == LOOM_OK && !info && llmc_path &&
        (rc = loom_ckpt_write_llmc(ck, model, llmc_path, llmc_dtype)) == LOOM_OK)
        printf("wrote %s (llm.c weights, %s: model.init = \"checkpoint\", model.checkpoint = "
               "\"%s\")\n", llmc_path, llmc_dtype == LOOM_BF16 ? "bf16" : "fp32", llmc_path);
    if (rc != LOOM_OK)
        fprintf(stderr, "loom ckpt: %s\n", loom_last_error());
    loom_model_destroy(model);
    loom_ckpt_close(ck);
    return rc == LOOM_OK ? 0 : 1;
}
