/* loom CLI — loom bench's memory tiers (bench.tiers). */
#ifndef LOOM_CLI_BENCH_TIERS_H
#define LOOM_CLI_BENCH_TIERS_H

#include <stdio.h>

#include "cli/args.h"
#include "runtime/config.h"

/* Times every tier in bench.tiers (the nvme tier at every block size and
 * queue depth listed, each in a config of its own built from args), prints
 * the table and appends JSON rows to json (NULL: none). */
int loom_bench_tiers(const loom_cli_config_args *args, const loom_config *cfg, FILE *json,
                     int *json_first);

#endif
