/* loom — small shared types: element types, reductions, memory kinds and
 * tensor views. Header-only so plugins need nothing else from the core. */
#ifndef LOOM_TENSOR_H
#define LOOM_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum loom_dtype {
    LOOM_F32 = 0,
    LOOM_BF16 = 1,
    LOOM_F16 = 2,
    LOOM_F64 = 3,
    LOOM_I32 = 4,
    LOOM_I64 = 5,
    LOOM_U8 = 6,
    LOOM_DTYPE_COUNT
} loom_dtype;

typedef enum loom_redop {
    LOOM_SUM = 0,
    LOOM_MAX = 1,
    LOOM_MIN = 2,
    LOOM_AVG = 3, /* sum divided by the group size; integer types truncate */
    LOOM_REDOP_COUNT
} loom_redop;

/* Where a buffer lives. A communicator declares the kinds it accepts as a
 * bit mask of LOOM_MEM_BIT(kind). */
typedef enum loom_mem_kind {
    LOOM_MEM_HOST = 0,
    LOOM_MEM_DEVICE = 1,
    LOOM_MEM_KIND_COUNT
} loom_mem_kind;
#define LOOM_MEM_BIT(kind) (1u << (kind))

static inline size_t loom_dtype_size(loom_dtype t)
{
    static const size_t sizes[LOOM_DTYPE_COUNT] = {4, 2, 2, 8, 4, 8, 1};
    return (unsigned)t < LOOM_DTYPE_COUNT ? sizes[t] : 0;
}

static inline const char *loom_dtype_name(loom_dtype t)
{
    static const char *names[LOOM_DTYPE_COUNT] = {"f32", "bf16", "f16", "f64",
                                                  "i32", "i64",  "u8"};
    return (unsigned)t < LOOM_DTYPE_COUNT ? names[t] : "?";
}

static inline const char *loom_redop_name(loom_redop op)
{
    static const char *names[LOOM_REDOP_COUNT] = {"sum", "max", "min", "avg"};
    return (unsigned)op < LOOM_REDOP_COUNT ? names[op] : "?";
}

static inline int loom_dtype_is_float(loom_dtype t)
{
    return t == LOOM_F32 || t == LOOM_BF16 || t == LOOM_F16 || t == LOOM_F64;
}

/* bf16 <-> f32, round to nearest even; NaN stays NaN. */
static inline float loom_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t loom_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    /* both computed, one chosen: no branch, so loops over it vectorise */
    uint32_t quiet_nan = (u >> 16) | 0x40u;
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

/* IEEE half <-> f32, round to nearest even, with subnormals and infinities. */
static inline float loom_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ffu;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t loom_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u);
    if (abs >= 0x477ff000u) /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) { /* below the smallest normal half */
        if (abs < 0x33000000u) /* below half the smallest subnormal */
            return (uint16_t)sign;
        uint32_t exp = abs >> 23;
        uint32_t man = (abs & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - exp; /* a half subnormal keeps man >> shift */
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
    return (uint16_t)(sign | ((rounded - 0x38000000u) >> 13));
}

/* Element i of a floating-point buffer of dtype t (f32, bf16 or f16) as
 * f32, and the way back, rounding to nearest even. */
static inline float loom_load_f32(const void *buf, loom_dtype t, size_t i)
{
    switch (t) {
    case LOOM_BF16: return loom_bf16_to_f32(((const uint16_t *)buf)[i]);
    case LOOM_F16: return loom_f16_to_f32(((const uint16_t *)buf)[i]);
    default: return ((const float *)buf)[i];
    }
}

static inline void loom_store_f32(void *buf, loom_dtype t, size_t i, float x)
{
    switch (t) {
    case LOOM_BF16: ((uint16_t *)buf)[i] = loom_f32_to_bf16(x); break;
    case LOOM_F16: ((uint16_t *)buf)[i] = loom_f32_to_f16(x); break;
    default: ((float *)buf)[i] = x; break;
    }
}

/* n fp32 values into a buffer of dtype t (f32, bf16 or f16). */
static inline void loom_from_f32(void *dst, loom_dtype t, const float *src, size_t n)
{
    if (t == LOOM_F32) {
        if (dst != src)
            memmove(dst, src, n * sizeof(float));
        return;
    }
    if (t == LOOM_BF16) { /* apart: the switch inside loom_store_f32 stays in a loop */
        uint16_t *h = dst;
        for (size_t i = 0; i < n; i++)
            h[i] = loom_f32_to_bf16(src[i]);
        return;
    }
    for (size_t i = 0; i < n; i++)
        loom_store_f32(dst, t, i, src[i]);
}

#define LOOM_MAX_DIMS 4

/* A strided view of memory owned by someone else. */
typedef struct loom_tensor {
    void *data;
    loom_dtype dtype;
    loom_mem_kind mem;
    int ndim;
    int64_t shape[LOOM_MAX_DIMS];
    int64_t stride[LOOM_MAX_DIMS]; /* in elements */
} loom_tensor;

static inline int64_t loom_tensor_numel(const loom_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

#endif
