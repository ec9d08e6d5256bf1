/* loom — the command line: loom <command> [args]. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: loom <command> [args]\n"
            "\n"
            "commands:\n"
            "  train CONFIG [--set path=value ...] [--metrics FILE] [--trace FILE]\n"
            "               [--save FILE] [--resume FILE]\n"
            "                         train the model the config describes\n"
            "  bench CONFIG [--json FILE] [--set path=value ...]\n"
            "                         time every collective of every backend in bench.comms\n"
            "  ckpt info PATH         what a checkpoint (directory of shards or file) holds\n"
            "  ckpt consolidate DIR [--state FILE] [--llmc FILE]\n"
            "                         one resumable file, or llm.c weights, from the shards\n"
            "  schedule CONFIG [--set path=value ...] [--svg FILE] [--verbose]\n"
            "                         check, simulate and draw the pipeline schedule\n"
            "  launch -n N [--] CMD...  start N local ranks of CMD\n"
            "  plugins [CONFIG]       list every plugin found, and whether it loads\n"
            "  settings [CONFIG]      every setting: the core's, then each plugin's\n"
            "  plugins --check FILE   run the conformance checks on one plugin file\n"
            "  help                   this text\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "plugins"))
        return loom_cmd_plugins(argc - 1, argv + 1);
    if (!strcmp(cmd, "launch"))
        return loom_cmd_launch(argc - 1, argv + 1);
    if (!strcmp(cmd, "train"))
        return loom_cmd_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench"))
        return loom_cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "schedule"))
        return loom_cmd_schedule(argc - 1, argv + 1);
    if (!strcmp(cmd, "ckpt"))
        return loom_cmd_ckpt(argc - 1, argv + 1);
    if (!strcmp(cmd, "settings"))
        return loom_cmd_settings(argc - 1, argv + 1);
    fprintf(stderr, "loom: unknown command '%s' (try: loom help)\n", cmd);
    return 2;
}
