/* loom train — what the tests do to a running job, compiled only into
 * builds that build the tests (LOOM_TEST_HOOKS, on with LOOM_BUILD_TESTS):
 * elsewhere these are empty and the job reads no variable for them.
 *   LOOM_STOP_AFTER_STEP=N  the process stops itself (SIGSTOP) after step
 *                           N, between steps, so a test can look at or
 *                           damage files; SIGCONT goes on.
 *   LOOM_PEAK_SCALE=F       the peak measured at start is scaled by F, as a
 *                           busy machine measures it. */
#ifndef LOOM_TRAIN_TEST_HOOKS_H
#define LOOM_TRAIN_TEST_HOOKS_H

#include <stdint.h>

#ifdef LOOM_TEST_HOOKS
void trainer_test_after_step(int64_t step);
double trainer_test_peak_scale(void);
#else
static inline void trainer_test_after_step(int64_t step) { (void)step; }
static inline double trainer_test_peak_scale(void) { return 1.0; }
#endif

#endif
