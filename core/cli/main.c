/* loom — the command line: loom [--verbose] <command> [args]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/settings.h"
#include "loom/plugin.h"
#include "loom/status.h"
#include "runtime/cpu.h"
#include "runtime/log.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
} command;

static const command commands[] = {
    {"train", loom_cmd_train},       {"bench", loom_cmd_bench},   {"ckpt", loom_cmd_ckpt},
    {"schedule", loom_cmd_schedule}, {"launch", loom_cmd_launch}, {"plugins", loom_cmd_plugins},
    {"settings", loom_cmd_settings}, {"sample", loom_cmd_sample},   {"plan", loom_cmd_plan},
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: loom <command> [args]\n"
            "       loom --verbose <command> [args]\n"
            "\n"
            "commands:\n"
            "  train CONFIG [--set path=value ...] [--metrics FILE] [--trace FILE]\n"
            "               [--save FILE [--save-dtype fp32|bf16]] [--resume FILE]\n"
            "                         train the model the config describes\n"
            "  sample CHECKPOINT [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K]\n"
            "               [--seed S] [--tokenizer FILE]\n"
            "                         text from a trained model (llm.c's .bin or a loom\n"
            "                         checkpoint), on one process\n"
            "  bench CONFIG [--json FILE] [--set path=value ...]\n"
            "                         time every collective of every backend in bench.comms\n"
            "  ckpt info PATH         what a checkpoint (directory of shards or file) holds\n"
            "  ckpt consolidate DIR [--state FILE] [--llmc FILE [--save-dtype fp32|bf16]]\n"
            "                         one resumable file, or llm.c weights, from the shards\n"
            "  schedule CONFIG [--set path=value ...] [--svg FILE] [--verbose]\n"
            "                         check, simulate and draw the pipeline schedule\n"
            "  plan CONFIG [--cluster FILE] [--set path=value ...] [--json FILE] [--search]\n"
            "                         memory, traffic and step time of the job on a\n"
            "                         cluster, before it runs; --search ranks the meshes\n"
            "  plan --calibrate FILE  measure this machine into a cluster file\n"
            "  launch -n N [--] CMD...  start N local ranks of CMD\n"
            "  plugins [CONFIG]       list every plugin found, and whether it loads\n"
            "  settings [CONFIG]      every setting: CONFIG's values, the core's, each plugin's\n"
            "  plugins --check FILE   run the conformance checks on one plugin file\n"
            "  plugins --check FILE --train CONFIG [--ranks 1,2,4] [--set path=value ...]\n"
            "                         then train CONFIG with it at each rank count and\n"
            "                         compare with the single-rank run\n"
            "  help                   this text\n"
            "\n"
            "options, before the command:\n"
            "  -v, --verbose          log debug lines too; the ranks loom launch starts\n"
            "                         inherit it (as LOOM_LOG=debug)\n"
            "\n"
            "environment:\n"
            "  LOOM_LOG=LEVEL         the log level: error, warn, info (the default) or debug\n"
            "  LOOM_MAX_ISA=LEVEL     the widest vector instructions used: baseline, avx2,\n"
            "                         avx512, avx512_bf16 or amx (default: all the CPU has)\n");
}

static int is_help(const char *arg)
{
    return !strcmp(arg, "help") || !strcmp(arg, "--help") || !strcmp(arg, "-h");
}

/* Debug from here on, in this process and in every process it starts. */
static void be_verbose(void)
{
    loom_log_set_level(LOOM_LOG_DEBUG);
    setenv("LOOM_LOG", "debug", 1);
}

int main(int argc, char **argv)
{
    if (loom_log_level_from_env() != LOOM_OK || loom_cpu_check_env() != LOOM_OK ||
        loom_cli_add_settings() != LOOM_OK) {
        fprintf(stderr, "loom: %s\n", loom_last_error());
        return 2;
    }
    int first = 1; /* the command's index, past the global options */
    for (; first < argc && argv[first][0] == '-' && !is_help(argv[first]); first++) {
        if (strcmp(argv[first], "--verbose") != 0 && strcmp(argv[first], "-v") != 0) {
            fprintf(stderr, "loom: unknown option '%s' (try: loom help)\n", argv[first]);
            return 2;
        }
        be_verbose();
    }
    if (first >= argc) {
        usage(stderr);
        return 2;
    }
    const char *name = argv[first];
    if (is_help(name)) {
        usage(stdout);
        return 0;
    }
    /* `loom train CONFIG -v` means `loom -v train CONFIG`, for the commands
     * whose own options have no -v (launch's and schedule's do); what
     * follows a "--" is another command's. */
    if (strcmp(name, "launch") && strcmp(name, "schedule")) {
        int kept = first + 1;
        for (int i = first + 1; i < argc; i++) {
            if (!strcmp(argv[i], "--")) {
                while (i < argc)
                    argv[kept++] = argv[i++];
                break;
            }
            if (!strcmp(argv[i], "-v") || !strcmp(argv[i], "--verbose"))
                be_verbose();
            else
                argv[kept++] = argv[i];
        }
        argc = kept;
        argv[argc] = NULL;
    }
    for (size_t i = 0; i < LOOM_ARRAY_LEN(commands); i++)
        if (!strcmp(name, commands[i].name))
            return commands[i].run(argc - first, argv + first);
    fprintf(stderr, "loom: unknown command '%s' (try: loom help)\n", name);
    return 2;
}
