/* PLACEHOLDER — replaced by `loom launch` (issue 2, item 6). */
#include "loom_internal.h"
int loom_cmd_launch(int argc, char **argv) { (void)argc; (void)argv; return 2; }
