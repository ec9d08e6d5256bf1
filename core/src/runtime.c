/* PLACEHOLDER — replaced by the runtime (issue 2). */
#include "loom_internal.h"
