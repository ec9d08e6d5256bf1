/* CRC32C: the reflected Castagnoli polynomial 0x82F63B78, initial value and
 * final xor all ones. x86-64's SSE4.2 crc32 instruction computes exactly this
 * register update, eight bytes at a time; elsewhere a byte table does. */
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

#define CASTAGNOLI 0x82F63B78u

static uint32_t table[256];
static int have_sse42;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

static void init(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    have_sse42 = __builtin_cpu_supports("sse4.2");
#endif
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (CASTAGNOLI & (0u - (c & 1u)));
        table[i] = c;
    }
}

static uint32_t update_portable(uint32_t crc, const unsigned char *p, size_t n)
{
    pthread_once(&init_once, init);
    while (n--)
        crc = (crc >> 8) ^ table[(crc ^ *p++) & 0xffu];
    return crc;
}

uint32_t nvme_crc32c_portable(const void *data, size_t n)
{
    return ~update_portable(~0u, data, n);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <nmmintrin.h>

__attribute__((target("sse4.2"))) static uint32_t update_sse42(uint32_t crc,
                                                                const unsigned char *p, size_t n)
{
    uint64_t c = crc;
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = _mm_crc32_u8(c32, *p++);
    return c32;
}

static uint32_t update(uint32_t crc, const unsigned char *p, size_t n)
{
    pthread_once(&init_once, init);
    return have_sse42 ? update_sse42(crc, p, n) : update_portable(crc, p, n);
}
#else
static uint32_t update(uint32_t crc, const unsigned char *p, size_t n)
{
    return update_portable(crc, p, n);
}
#endif

uint32_t nvme_crc32c(const void *data, size_t n)
{
    return ~update(~0u, data, n);
}

uint32_t nvme_copy_crc32c(void *dst, const void *src, size_t n)
{
    enum { PIECE = 32 * 1024 }; /* well inside L1/L2: checksum what was just copied */
    unsigned char *d = dst;
    uint32_t crc = ~0u;
    for (size_t done = 0; done < n; done += PIECE) {
        size_t len = n - done < PIECE ? n - done : PIECE;
        memcpy(d + done, (const unsigned char *)src + done, len);
        crc = update(crc, d + done, len);
    }
    return ~crc;
}
