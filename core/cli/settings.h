/* loom CLI — the command line's own settings (bench.*: `loom bench`), and
 * the whole schema every command checks a config against. */
#ifndef LOOM_CLI_SETTINGS_H
#define LOOM_CLI_SETTINGS_H

#include "runtime/config.h"

extern const loom_config_settings loom_bench_settings;

/* Every layer's settings, added to the configs loaded from now on in the
 * order `loom settings` lists them. The program calls it first thing; so
 * does any other program of the cli's that loads a config. */
int loom_cli_add_settings(void);

#endif
