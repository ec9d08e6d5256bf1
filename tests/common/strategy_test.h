/* Shared by the data-strategy tests (tests/ddp, tests/zero): rounding to a
 * compute dtype, the fake gradients and initial values they feed every
 * strategy, and the optimizer update with call counters. */
#ifndef LOOM_STRATEGY_TEST_H
#define LOOM_STRATEGY_TEST_H

#include <stdio.h>
#include <string.h>

#include "loom/strategy.h"
#include "loom/tensor.h"
#include "model/optimizer.h"

static inline float round_to(loom_dtype t, float x)
{
    union {
        float f;
        uint16_t h;
    } r;
    loom_store_f32(&r, t, 0, x);
    return loom_load_f32(&r, t, 0);
}

/* One unit in the last place, relative: what an average computed as a
 * multiply by 1/N instead of a division may differ by. */
static inline float ulp_of(loom_dtype t)
{
    return t == LOOM_BF16 ? 1.0f / 128 : t == LOOM_F16 ? 1.0f / 1024 : 1e-6f;
}

/* A gradient contribution in [-15, 15] / 64; part 0 of the embedding comes
 * from the tied head's backward, part 1 from its own. */
static inline int kval(int dp_rank, int step, int micro, int unit, size_t j, int part)
{
    return (int)((dp_rank * 7 + step * 19 + micro * 13 + unit * 3 + (int)(j % 1009) * 5 + part * 17) %
                 31) -
           15;
}

static inline float init_value(int unit, size_t j)
{
    return (float)((int)((unit * 31 + j * 7) % 41) - 20) * 0.01f;
}

/* The core's AdamW, counting how the strategy calls it. */
static int update_calls;
static size_t update_elems;
static inline void adamw(const loom_optimizer_step *s, float *master, const void *grad,
                         loom_dtype t, float *m, float *v, size_t n)
{
    update_calls++;
    update_elems += n;
    loom_adamw_update(s, master, grad, t, m, v, n);
}

/* The same through update_range (ABI 1.6), counting ranges that do not lie
 * within their unit. */
static int update_ranges_outside;
static inline void adamw_range(const loom_optimizer_step *s, const loom_unit *unit, size_t offset,
                               float *master, const void *grad, loom_dtype t, float *m, float *v,
                               size_t n)
{
    if (!unit || offset + n > unit->numel)
        update_ranges_outside++;
    adamw(s, master, grad, t, m, v, n);
}

static inline int count_occurrences(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f))
        for (const char *p = line; (p = strstr(p, needle)); p += strlen(needle))
            n++;
    fclose(f);
    return n;
}

#endif
