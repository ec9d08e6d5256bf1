/* plugins/common — host reductions (reduce.h). Each loop is plain enough
 * for the compiler to vectorise; this file is built with -O3. */
#include "common/reduce.h"

#include <stdint.h>

/* d[i] = EXPR(p = x[i], q = y[i]) over elements of type T. */
#define COMBINE(T, EXPR)                                                                 \
    do {                                                                                 \
        T *d_ = dst;                                                                     \
        const T *x_ = a, *y_ = b;                                                        \
        for (size_t i = 0; i < n; i++) {                                                 \
            T p = x_[i], q = y_[i];                                                      \
            d_[i] = (EXPR);                                                              \
        }                                                                                \
    } while (0)

/* Each op of EXPRs over p and q; dispatched once per call, not per element. */
#define COMBINE_OPS(T, MAX_EXPR, MIN_EXPR, SUM_EXPR)                                     \
    do {                                                                                 \
        if (op == LOOM_MAX)                                                              \
            COMBINE(T, MAX_EXPR);                                                        \
        else if (op == LOOM_MIN)                                                         \
            COMBINE(T, MIN_EXPR);                                                        \
        else                                                                             \
            COMBINE(T, SUM_EXPR);                                                        \
    } while (0)

/* Integer sums wrap (through the unsigned type) instead of overflowing. */
#define COMBINE_ALL(T, SUM_T) COMBINE_OPS(T, p > q ? p : q, p < q ? p : q, (T)((SUM_T)p + (SUM_T)q))

/* 16-bit floats compare and add in f32: WIDEN and NARROW convert. */
#define COMBINE_HALF(WIDEN, NARROW)                                                      \
    COMBINE_OPS(uint16_t, WIDEN(p) > WIDEN(q) ? p : q, WIDEN(p) < WIDEN(q) ? p : q,      \
                NARROW(WIDEN(p) + WIDEN(q)))

void reduce_elements(void *dst, const void *a, const void *b, size_t n, loom_dtype t,
                     loom_redop op)
{
    switch (t) {
    case LOOM_F32: COMBINE_ALL(float, float); break;
    case LOOM_F64: COMBINE_ALL(double, double); break;
    case LOOM_I32: COMBINE_ALL(int32_t, uint32_t); break;
    case LOOM_I64: COMBINE_ALL(int64_t, uint64_t); break;
    case LOOM_U8: COMBINE_ALL(uint8_t, uint8_t); break;
    case LOOM_BF16: COMBINE_HALF(loom_bf16_to_f32, loom_f32_to_bf16); break;
    case LOOM_F16: COMBINE_HALF(loom_f16_to_f32, loom_f32_to_f16); break;
    default: break;
    }
}

/* x[i] = EXPR(v = x[i]) over elements of type T. */
#define DIVIDE(T, EXPR)                                                                  \
    do {                                                                                 \
        T *x_ = buf;                                                                     \
        for (size_t i = 0; i < n; i++) {                                                 \
            T v = x_[i];                                                                 \
            x_[i] = (EXPR);                                                              \
        }                                                                                \
    } while (0)

void divide_elements(void *buf, size_t n, loom_dtype t, int by)
{
    float f = (float)by;
    switch (t) {
    case LOOM_F32: DIVIDE(float, v / f); break;
    case LOOM_F64: DIVIDE(double, v / (double)by); break;
    case LOOM_I32: DIVIDE(int32_t, v / by); break;
    case LOOM_I64: DIVIDE(int64_t, v / by); break;
    case LOOM_U8: DIVIDE(uint8_t, (uint8_t)(v / by)); break;
    case LOOM_BF16: DIVIDE(uint16_t, loom_f32_to_bf16(loom_bf16_to_f32(v) / f)); break;
    case LOOM_F16: DIVIDE(uint16_t, loom_f32_to_f16(loom_f16_to_f32(v) / f)); break;
    default: break;
    }
}

int average_prescale(loom_dtype t, int ranks)
{
    int by = 1;
    while (t == LOOM_F16 && by < ranks)
        by *= 2;
    return by;
}

loom_redop average_begin(void *buf, size_t n, loom_dtype t, int ranks)
{
    int by = average_prescale(t, ranks);
    if (by == 1)
        return LOOM_AVG;
    uint16_t *x = buf;
    for (size_t i = 0; i < n; i++) /* exact: a power of two */
        x[i] = loom_f32_to_f16(loom_f16_to_f32(x[i]) / (float)by);
    return LOOM_SUM;
}

void average_end(void *buf, size_t n, loom_dtype t, int prescaled, int ranks)
{
    if (t != LOOM_F16 || prescaled == 1)
        return;
    uint16_t *x = buf;
    for (size_t i = 0; i < n; i++)
        x[i] = loom_f32_to_f16(loom_f16_to_f32(x[i]) * (float)prescaled / (float)ranks);
}
