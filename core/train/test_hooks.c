/* loom train — the tests' hooks (test_hooks.h); built only with
 * LOOM_TEST_HOOKS. */
#include "train/test_hooks.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef LOOM_TEST_HOOKS
void trainer_test_after_step(int64_t step)
{
    const char *stop = getenv("LOOM_STOP_AFTER_STEP");
    if (stop && step == atoll(stop)) {
        fflush(NULL);
        raise(SIGSTOP);
    }
}

double trainer_test_peak_scale(void)
{
    const char *busy = getenv("LOOM_PEAK_SCALE");
    return busy && atof(busy) > 0 ? atof(busy) : 1.0;
}
#endif
