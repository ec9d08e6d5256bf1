/* The command line every config-taking command shares (cli/args.h). */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"

static const loom_cli_option *find_option(const loom_cli_option *options, const char *arg)
{
    for (const loom_cli_option *o = options; o && o->name; o++)
        if (!strcmp(arg, o->name) || (o->alias && !strcmp(arg, o->alias)))
            return o;
    return NULL;
}

int loom_cli_save_dtype(const char *command, const char *value, loom_dtype *out)
{
    *out = LOOM_F32;
    if (!value || !strcmp(value, "fp32"))
        return 0;
    if (!strcmp(value, "bf16")) {
        *out = LOOM_BF16;
        return 0;
    }
    fprintf(stderr, "%s: --save-dtype %s: expected fp32 (llm.c's checkpoint version 3) or bf16 "
                    "(version 5)\n", command, value);
    return 2;
}

int loom_cli_config_args_parse(const char *command, const char *usage, int argc, char **argv,
                               const loom_cli_option *options, loom_cli_config_args *out)
{
    memset(out, 0, sizeof *out);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const loom_cli_option *o = find_option(options, arg);
        int has_value = i + 1 < argc;
        if (o && o->flag) {
            *o->flag = 1;
        } else if (o && has_value) {
            *o->value = argv[++i];
        } else if (!strcmp(arg, "--set") && has_value) {
            if (out->noverrides == LOOM_CLI_MAX_SETS) {
                fprintf(stderr, "%s: too many --set options (at most %d)\n", command,
                        LOOM_CLI_MAX_SETS);
                return 2;
            }
            out->overrides[out->noverrides++] = argv[++i];
        } else if (arg[0] == '-' || out->config) {
            fputs(usage, stderr);
            return 2;
        } else {
            out->config = arg;
        }
    }
    if (!out->config) {
        fputs(usage, stderr);
        return 2;
    }
    return 0;
}
