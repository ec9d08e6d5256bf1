/* loom runtime — the vector instructions this process may use: what the
 * CPU has (CPUID, and XGETBV for the registers the OS saves), capped by
 * LOOM_MAX_ISA so that a machine can take a smaller machine's paths.
 * Every kernel with vector versions, the f32 <-> 16-bit conversions and
 * oneDNN's own dispatch follow it; OpenBLAS picks its kernels itself
 * (OPENBLAS_CORETYPE). */
#ifndef LOOM_RUNTIME_CPU_H
#define LOOM_RUNTIME_CPU_H

#include <stddef.h>

/* Levels, each including the ones before it. */
typedef enum loom_isa {
    LOOM_ISA_BASELINE = 0, /* x86-64 (SSE2), or any other architecture */
    LOOM_ISA_AVX2,         /* AVX2 and FMA */
    LOOM_ISA_AVX512,       /* AVX-512 F, CD, BW, DQ and VL (x86-64-v4) */
    LOOM_ISA_AVX512_BF16,  /* and AVX512-BF16: bf16 products */
    LOOM_ISA_AMX,          /* and AMX-TILE with AMX-BF16 */
    LOOM_ISA_COUNT
} loom_isa;

/* "baseline", "avx2", "avx512", "avx512_bf16", "amx". */
const char *loom_isa_name(loom_isa isa);
/* The level a name (any case) stands for; -1 for anything else. */
int loom_isa_parse(const char *name);

/* What the CPU and the OS support. */
loom_isa loom_cpu_detected_isa(void);
/* What this process uses: the detected level, capped by LOOM_MAX_ISA and
 * by loom_cpu_cap_isa. Cheap: kernels ask on every call. */
loom_isa loom_cpu_isa(void);
/* F16C (f32 <-> f16 conversions), where the level allows AVX2. */
int loom_cpu_has_f16c(void);
/* Lowers the cap from now on (tests compare each level's kernels in one
 * process); oneDNN follows only a cap set before its first product. */
void loom_cpu_cap_isa(loom_isa max);
/* LOOM_MAX_ISA checked: LOOM_ERR_INVALID, with the detail, for a value
 * that names no level (which loom_cpu_isa otherwise ignores). */
int loom_cpu_check_env(void);
/* "avx512_bf16", or "avx2 (LOOM_MAX_ISA=avx2, the CPU has avx512_bf16)". */
const char *loom_cpu_describe(void);

#endif
