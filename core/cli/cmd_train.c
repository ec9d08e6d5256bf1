/* loom train CONFIG: parse the command line, then train (train/train.c). */
#include <stdio.h>
#include <string.h>

#include "loom/status.h"
#include "cli/commands.h"
#include "runtime/log.h"
#include "train/train.h"

static int usage(void)
{
    fprintf(stderr, "usage: loom train CONFIG [--set path=value ...] [--metrics FILE] "
                    "[--trace FILE] [--save FILE] [--resume FILE]\n");
    return 2;
}

static int parse_args(int argc, char **argv, loom_train_options *o)
{
    memset(o, 0, sizeof *o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **slot = !strcmp(a, "--metrics") ? &o->metrics
                            : !strcmp(a, "--trace") ? &o->trace
                            : !strcmp(a, "--save")  ? &o->save
                            : !strcmp(a, "--resume") ? &o->resume
                                                     : NULL;
        if (slot || !strcmp(a, "--set")) {
            if (i + 1 >= argc)
                return usage();
            if (slot) {
                *slot = argv[++i];
            } else {
                if (o->noverrides == (int)LOOM_ARRAY_LEN(o->overrides))
                    return usage();
                o->overrides[o->noverrides++] = argv[++i];
            }
        } else if (a[0] == '-' || o->config) {
            return usage();
        } else {
            o->config = a;
        }
    }
    return o->config ? 0 : usage();
}

int loom_cmd_train(int argc, char **argv)
{
    loom_train_options o;
    int bad = parse_args(argc, argv, &o);
    if (bad)
        return bad;
    int rc = loom_train(&o);
    if (rc != LOOM_OK)
        fprintf(stderr, "loom train: %s\n", loom_last_error());
    return rc == LOOM_OK ? 0 : 1;
}
