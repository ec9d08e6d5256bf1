/* The schedule validator: action lists built from the input, validated as
 * a schedule plugin's are, and simulated when valid.
 *
 * Input: 3 bytes of shape — pp ranks 1 + b0 % 8, virtual stages 1 + b1 % 4,
 * micro-batches 1 + b2 % 16 — then 4 bytes per action: the rank (modulo
 * the ranks), the kind, the virtual stage and the micro-batch (signed),
 * kind and stages taken as they are so that unknown ones reach the
 * validator. */
#include <stdint.h>
#include <string.h>

#include "loom/status.h"
#include "loom/strategy.h"
#include "train/schedule.h"
#include "fuzz_files.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    int p = 1 + data[0] % 8, v = 1 + data[1] % 4, m = 1 + data[2] % 16;
    loom_schedule s;
    if (loom_schedule_init(&s, "fuzz", p, v, m) != LOOM_OK)
        return 0;
    int appended = 1;
    for (size_t at = 3; appended && at + 4 <= size; at += 4) {
        loom_action a;
        memset(&a, 0, sizeof a);
        a.kind = data[at + 1];
        a.virtual_stage = data[at + 2];
        a.microbatch = (int8_t)data[at + 3];
        appended = loom_schedule_append(&s, data[at] % p, a) == LOOM_OK;
    }
    if (appended && loom_schedule_validate(&s) == LOOM_OK) {
        double cost[LOOM_ACT_KIND_COUNT];
        loom_schedule_default_costs(cost);
        loom_schedule_timeline tl;
        if (loom_schedule_simulate(&s, cost, &tl) == LOOM_OK)
            loom_schedule_timeline_free(&s, &tl);
    }
    loom_schedule_free(&s);
    return 0;
}
