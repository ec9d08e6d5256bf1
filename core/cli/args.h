/* loom CLI — the command line every config-taking command shares: one
 * CONFIG, any number of --set path=value, and the command's own options. */
#ifndef LOOM_CLI_ARGS_H
#define LOOM_CLI_ARGS_H

#include "loom/tensor.h"

#define LOOM_CLI_MAX_SETS 64

/* One option of a command: with value, it takes the next argument
 * (--json FILE); with flag, it is a switch (--verbose) that sets *flag to 1.
 * A list of options ends with an entry whose name is NULL. */
typedef struct loom_cli_option {
    const char *name;  /* "--json" */
    const char *alias; /* "-v", or NULL */
    const char **value;
    int *flag;
} loom_cli_option;

typedef struct loom_cli_config_args {
    const char *config;
    const char *overrides[LOOM_CLI_MAX_SETS]; /* "path=value", as loom_config_load takes them */
    int noverrides;
} loom_cli_config_args;

/* Read argv[1..] of a command (command names it in messages: "loom bench").
 * 0 when the line is good; otherwise the complaint, or usage as it is, went
 * to stderr and the command's exit status (2) comes back. */
int loom_cli_config_args_parse(const char *command, const char *usage, int argc, char **argv,
                               const loom_cli_option *options, loom_cli_config_args *out);

/* --save-dtype's value (NULL: not given, fp32): "fp32" (llm.c's checkpoint
 * version 3) or "bf16" (version 5). Anything else: one line on stderr
 * naming command, and 2 (the exit status). */
int loom_cli_save_dtype(const char *command, const char *value, loom_dtype *out);

#endif
