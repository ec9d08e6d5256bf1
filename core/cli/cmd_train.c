/* loom train CONFIG: parse the command line, then train (train/train.c). */
#include <stdio.h>

#include "loom/status.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "plan/plan.h"
#include "runtime/log.h"
#include "train/train.h"

static const char train_usage[] =
    "usage: loom train CONFIG [--set path=value ...] [--metrics FILE] [--trace FILE] "
    "[--save FILE [--save-dtype fp32|bf16]] [--resume FILE]\n";

int loom_cmd_train(int argc, char **argv)
{
    loom_train_options o = {0};
    const char *save_dtype = NULL;
    const loom_cli_option options[] = {{"--metrics", NULL, &o.metrics, NULL},
                                       {"--trace", NULL, &o.trace, NULL},
                                       {"--save", NULL, &o.save, NULL},
                                       {"--save-dtype", NULL, &save_dtype, NULL},
                                       {"--resume", NULL, &o.resume, NULL},
                                       {NULL, NULL, NULL, NULL}};
    loom_cli_config_args args;
    int bad = loom_cli_config_args_parse("loom train", train_usage, argc, argv, options, &args);
    if (bad)
        return bad;
    if (save_dtype && !o.save) {
        fprintf(stderr, "loom train: --save-dtype %s says how --save writes the final weights, "
                        "and there is no --save; add --save FILE or drop --save-dtype\n",
                save_dtype);
        return 2;
    }
    if ((bad = loom_cli_save_dtype("loom train", save_dtype, &o.save_dtype)))
        return bad;
    o.config = args.config;
    o.overrides = args.overrides;
    o.noverrides = args.noverrides;
    int started = 0;
    o.started = &started;
    o.check_machine = loom_plan_check_machine;
    int rc = loom_train(&o);
    if (rc != LOOM_OK)
        fprintf(stderr, "loom train: %s\n", loom_last_error());
    /* A job refused before it trains, for what it was given, is refused
     * again when restarted; one that fails later may not fail again. */
    int refused = !started && (rc == LOOM_ERR_INVALID || rc == LOOM_ERR_NOT_FOUND ||
                               rc == LOOM_ERR_NOT_SUPPORTED);
    return rc == LOOM_OK              ? 0
           : rc == LOOM_ERR_REMOTE    ? LOOM_EXIT_ANOTHER_RANK
           : refused                  ? LOOM_EXIT_CONFIG
                                      : 1;
}
