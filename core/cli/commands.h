/* loom CLI — one entry point per command (cli/cmd_<name>.c). */
#ifndef LOOM_CLI_COMMANDS_H
#define LOOM_CLI_COMMANDS_H

#include <stddef.h>

#include "runtime/config.h"
#include "runtime/runtime.h"
#include "train/schedule.h"

/* The exit status of a rank that failed because another rank did (a
 * checkpoint that failed elsewhere, a peer gone): `loom launch` waits a
 * moment for that rank's own exit before blaming this one. */
#define LOOM_EXIT_ANOTHER_RANK 75

/* The exit status of a job refused for what it was given (sysexits.h's
 * EX_CONFIG): a setting, a plugin or a file the config names, an output
 * that cannot be written, limits too low for -n. Running it again repeats
 * the failure, so `loom launch` does not restart after it (nor after 2, a
 * command line it cannot use, or 126/127, a command it cannot run). */
#define LOOM_EXIT_CONFIG 78

int loom_cmd_plugins(int argc, char **argv);
int loom_cmd_launch(int argc, char **argv);
int loom_cmd_bench(int argc, char **argv);
int loom_cmd_ckpt(int argc, char **argv);
int loom_cmd_settings(int argc, char **argv);
int loom_cmd_train(int argc, char **argv);
int loom_cmd_sample(int argc, char **argv);
int loom_cmd_schedule(int argc, char **argv);
int loom_cmd_plan(int argc, char **argv);

/* The pipeline schedule a config names (parallel.pp.*), built by its plugin
 * and validated; desc: the plugin's description (cmd_schedule.c). */
int loom_cli_build_schedule(loom_config *cfg, loom_runtime *rt, loom_schedule *out, char *desc,
                            size_t desc_cap, const loom_plugin **schedule_plugin);

#endif
