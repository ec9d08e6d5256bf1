/* loom CLI — a pipeline schedule's simulated timeline drawn as SVG
 * (`loom schedule --svg`). */
#ifndef LOOM_CLI_SCHEDULE_SVG_H
#define LOOM_CLI_SCHEDULE_SVG_H

#include <stdio.h>

#include "train/schedule.h"

/* An SVG of the timeline: one row per pp rank, time to the right; forward,
 * backward, backward-input and backward-weight in distinct colours with
 * their micro-batch numbers, idle time hatched; the title names the
 * schedule, p, v, m and the bubble fraction. Every compute box is a <rect>
 * with class "forward", "backward", "backward-input" or "backward-weight",
 * every idle gap one with class "idle". With a transfer latency (tl->transfer
 * > 0) every receive's data is a <line> with class "transfer", an arrow from
 * the sender's row at the send to the receiver's row at the arrival. */
int loom_schedule_svg(const loom_schedule *s, const loom_schedule_timeline *tl, FILE *out);

#endif
