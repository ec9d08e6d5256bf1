/* plugins/common — time and polling (clock.h). */
#include "common/clock.h"

#include <sched.h>
#include <time.h>

#include "loom/status.h"

double clock_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void clock_sleep_s(double s)
{
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&t, NULL);
}

void clock_pause(double waited, int may_sleep)
{
    if (!may_sleep || waited < 0.002)
        sched_yield();
    else
        clock_sleep_s(waited < 1.0 ? 20e-6 : 1e-3);
}

int clock_poll(int (*poll)(void *arg), void *arg, double timeout_s, int may_sleep)
{
    double t0 = clock_now_s();
    for (;;) {
        int st = poll(arg);
        if (st != LOOM_IN_PROGRESS)
            return st;
        double waited = clock_now_s() - t0;
        if (waited > timeout_s)
            return LOOM_IN_PROGRESS;
        clock_pause(waited, may_sleep);
    }
}
