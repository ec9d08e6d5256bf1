/* PLACEHOLDER — replaced by `loom bench` (issue 2, item 10). */
#include "loom_internal.h"
int loom_cmd_bench(int argc, char **argv) { (void)argc; (void)argv; return 2; }
