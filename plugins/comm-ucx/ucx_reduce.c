/* comm-ucx — the reductions: dst = a op b for every dtype and op, and the
 * division that turns a sum into an average.
 *
 * dst may be a or b (never a partial overlap). bf16 and f16 combine in f32
 * and round once per combine. AVG is a SUM here; the schedule divides once
 * at the end, by the group size, on the rank that owns the final value
 * (integers truncate toward zero, as C division does). Each loop is plain
 * enough for the compiler to vectorise; this file is built with -O3. */
#include "ucx_internal.h"

#define COMBINE(T, EXPR)                                                                 \
    do {                                                                                 \
        T *d_ = dst;                                                                     \
        const T *x_ = a, *y_ = b;                                                        \
        for (size_t i = 0; i < n; i++) {                                                 \
            T p = x_[i], q = y_[i];                                                      \
            d_[i] = (EXPR);                                                              \
        }                                                                                \
    } while (0)

/* Integer sums wrap (through the unsigned type) instead of overflowing. */
#define COMBINE_ALL(T, SUM_T)                                                            \
    do {                                                                                 \
        if (op == LOOM_MAX)                                                              \
            COMBINE(T, p > q ? p : q);                                                   \
        else if (op == LOOM_MIN)                                                         \
            COMBINE(T, p < q ? p : q);                                                   \
        else                                                                             \
            COMBINE(T, (T)((SUM_T)p + (SUM_T)q));                                        \
    } while (0)

static void half_combine(uint16_t *d, const uint16_t *x, const uint16_t *y, size_t n, int is_f16,
                         loom_redop op)
{
    if (is_f16) {
        if (op == LOOM_MAX)
            for (size_t i = 0; i < n; i++)
                d[i] = loom_f16_to_f32(x[i]) > loom_f16_to_f32(y[i]) ? x[i] : y[i];
        else if (op == LOOM_MIN)
            for (size_t i = 0; i < n; i++)
                d[i] = loom_f16_to_f32(x[i]) < loom_f16_to_f32(y[i]) ? x[i] : y[i];
        else
            for (size_t i = 0; i < n; i++)
                d[i] = loom_f32_to_f16(loom_f16_to_f32(x[i]) + loom_f16_to_f32(y[i]));
    } else {
        if (op == LOOM_MAX)
            for (size_t i = 0; i < n; i++)
                d[i] = loom_bf16_to_f32(x[i]) > loom_bf16_to_f32(y[i]) ? x[i] : y[i];
        else if (op == LOOM_MIN)
            for (size_t i = 0; i < n; i++)
                d[i] = loom_bf16_to_f32(x[i]) < loom_bf16_to_f32(y[i]) ? x[i] : y[i];
        else
            for (size_t i = 0; i < n; i++)
                d[i] = loom_f32_to_bf16(loom_bf16_to_f32(x[i]) + loom_bf16_to_f32(y[i]));
    }
}

void ucx_reduce(void *dst, const void *a, const void *b, size_t n, loom_dtype t, loom_redop op)
{
    switch (t) {
    case LOOM_F32: COMBINE_ALL(float, float); break;
    case LOOM_F64: COMBINE_ALL(double, double); break;
    case LOOM_I32: COMBINE_ALL(int32_t, uint32_t); break;
    case LOOM_I64: COMBINE_ALL(int64_t, uint64_t); break;
    case LOOM_U8: COMBINE_ALL(uint8_t, uint8_t); break;
    case LOOM_BF16: half_combine(dst, a, b, n, 0, op); break;
    case LOOM_F16: half_combine(dst, a, b, n, 1, op); break;
    default: break;
    }
}

/* Floats divide the sum in their own precision (bf16/f16 through f32), as
 * the collective suite's reference does; integers truncate. */
void ucx_divide(void *buf, size_t n, loom_dtype t, int by)
{
    switch (t) {
    case LOOM_F32: {
        float *x = buf, f = (float)by;
        for (size_t i = 0; i < n; i++)
            x[i] /= f;
        break;
    }
    case LOOM_F64: {
        double *x = buf, f = (double)by;
        for (size_t i = 0; i < n; i++)
            x[i] /= f;
        break;
    }
    case LOOM_I32: {
        int32_t *x = buf;
        for (size_t i = 0; i < n; i++)
            x[i] /= by;
        break;
    }
    case LOOM_I64: {
        int64_t *x = buf;
        for (size_t i = 0; i < n; i++)
            x[i] /= by;
        break;
    }
    case LOOM_U8: {
        uint8_t *x = buf;
        for (size_t i = 0; i < n; i++)
            x[i] = (uint8_t)(x[i] / by);
        break;
    }
    case LOOM_BF16: {
        uint16_t *x = buf;
        float f = (float)by;
        for (size_t i = 0; i < n; i++)
            x[i] = loom_f32_to_bf16(loom_bf16_to_f32(x[i]) / f);
        break;
    }
    case LOOM_F16: {
        uint16_t *x = buf;
        float f = (float)by;
        for (size_t i = 0; i < n; i++)
            x[i] = loom_f32_to_f16(loom_f16_to_f32(x[i]) / f);
        break;
    }
    default: break;
    }
}
