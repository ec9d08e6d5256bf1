/* loom runtime — the vector instruction level (see cpu.h).
 *
 * CPUID traps to the hypervisor in a VM (a microsecond or more a time),
 * so it is asked once; the level in use is then one atomic load. */
#include "runtime/cpu.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "loom/status.h"
#include "runtime/log.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#define LOOM_CPU_X86 1
#else
#define LOOM_CPU_X86 0
#endif

static const char *const isa_names[LOOM_ISA_COUNT] = {"baseline", "avx2", "avx512", "avx512_bf16",
                                                      "amx"};

const char *loom_isa_name(loom_isa isa)
{
    return isa >= 0 && isa < LOOM_ISA_COUNT ? isa_names[isa] : "unknown";
}

int loom_isa_parse(const char *name)
{
    for (int i = 0; i < LOOM_ISA_COUNT; i++)
        if (name && !strcasecmp(name, isa_names[i]))
            return i;
    return -1;
}

typedef struct cpu_facts {
    loom_isa isa;
    int f16c;
} cpu_facts;

#if LOOM_CPU_X86
/* The register state the OS saves on a context switch (XCR0): a unit the
 * CPU has is usable only when its registers are saved too. */
static unsigned long long saved_state(void)
{
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

static int bit(unsigned word, int n) { return (int)((word >> n) & 1u); }

static cpu_facts ask_cpu(void)
{
    cpu_facts f = {LOOM_ISA_BASELINE, 0};
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !bit(c, 27) /* OSXSAVE */)
        return f;
    const int fma = bit(c, 12), f16c = bit(c, 29), avx = bit(c, 28);
    const unsigned long long xcr0 = saved_state();
    const int ymm = (xcr0 & 0x6) == 0x6, zmm = (xcr0 & 0xe6) == 0xe6;
    const int tiles = (xcr0 & 0x60000) == 0x60000;
    if (!avx || !ymm || !__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return f;
    const unsigned leaf7_b = b, leaf7_d = d;
    if (!bit(leaf7_b, 5) /* AVX2 */ || !fma)
        return f;
    f.isa = LOOM_ISA_AVX2;
    f.f16c = f16c;
    /* F, DQ, CD, BW, VL */
    const int avx512 = bit(leaf7_b, 16) && bit(leaf7_b, 17) && bit(leaf7_b, 28) &&
                       bit(leaf7_b, 30) && bit(leaf7_b, 31);
    if (!avx512 || !zmm)
        return f;
    f.isa = LOOM_ISA_AVX512;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !bit(a, 5) /* AVX512_BF16 */)
        return f;
    f.isa = LOOM_ISA_AVX512_BF16;
    if (bit(leaf7_d, 24) /* AMX-TILE */ && bit(leaf7_d, 22) /* AMX-BF16 */ && tiles)
        f.isa = LOOM_ISA_AMX;
    return f;
}
#else
static cpu_facts ask_cpu(void) { return (cpu_facts){LOOM_ISA_BASELINE, 0}; }
#endif

static cpu_facts detected;
static int env_cap = LOOM_ISA_COUNT - 1;
static _Atomic int in_use = -1; /* -1: not asked yet */
static pthread_once_t asked = PTHREAD_ONCE_INIT;

static void init(void)
{
    detected = ask_cpu();
    const char *max = getenv("LOOM_MAX_ISA");
    const int cap = max && *max ? loom_isa_parse(max) : -1;
    if (cap >= 0)
        env_cap = cap;
    atomic_store(&in_use, (int)detected.isa < env_cap ? (int)detected.isa : env_cap);
}

loom_isa loom_cpu_isa(void)
{
    /* acquire: whoever sees the level sees the facts init wrote before it */
    int level = atomic_load_explicit(&in_use, memory_order_acquire);
    if (level < 0) {
        pthread_once(&asked, init);
        level = atomic_load(&in_use);
    }
    return (loom_isa)level;
}

loom_isa loom_cpu_detected_isa(void)
{
    loom_cpu_isa();
    return detected.isa;
}

int loom_cpu_has_f16c(void) { return loom_cpu_isa() >= LOOM_ISA_AVX2 && detected.f16c; }

void loom_cpu_cap_isa(loom_isa max)
{
    if (loom_cpu_isa() > max) /* after init, which would overwrite it */
        atomic_store(&in_use, (int)max);
}

int loom_cpu_check_env(void)
{
    const char *max = getenv("LOOM_MAX_ISA");
    if (max && *max && loom_isa_parse(max) < 0)
        return loom_fail(LOOM_ERR_INVALID,
                         "LOOM_MAX_ISA=%s names no instruction level; use baseline, avx2, avx512, "
                         "avx512_bf16 or amx (or unset it)",
                         max);
    return LOOM_OK;
}

const char *loom_cpu_describe(void)
{
    static char text[128];
    const loom_isa isa = loom_cpu_isa();
    if (isa == detected.isa)
        snprintf(text, sizeof text, "%s", loom_isa_name(isa));
    else if ((int)isa == env_cap)
        snprintf(text, sizeof text, "%s (LOOM_MAX_ISA=%s, the CPU has %s)", loom_isa_name(isa),
                 getenv("LOOM_MAX_ISA"), loom_isa_name(detected.isa));
    else
        snprintf(text, sizeof text, "%s (capped, the CPU has %s)", loom_isa_name(isa),
                 loom_isa_name(detected.isa));
    return text;
}
