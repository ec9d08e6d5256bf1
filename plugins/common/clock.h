/* plugins/common — time and polling for the comm backends.
 *
 * Every wait of a backend polls: no call may block past the host's
 * timeout_s, and a blocking call would not let us name who is missing. */
#ifndef LOOM_PLUGIN_COMMON_CLOCK_H
#define LOOM_PLUGIN_COMMON_CLOCK_H

/* Seconds on the monotonic clock. */
double clock_now_s(void);
void clock_sleep_s(double s);

/* One pause of a loop that has polled for `waited` seconds: a yield while
 * the wait is young (small ops end in microseconds, and some transports
 * progress only while polled), then short sleeps, since cores may be shared
 * between ranks. may_sleep = 0 only yields, for dedicated cores. */
void clock_pause(double waited, int may_sleep);

/* Call poll(arg) until it returns anything but LOOM_IN_PROGRESS, with a
 * clock_pause between calls. Returns that result, or LOOM_IN_PROGRESS when
 * timeout_s passed first. */
int clock_poll(int (*poll)(void *arg), void *arg, double timeout_s, int may_sleep);

#endif
