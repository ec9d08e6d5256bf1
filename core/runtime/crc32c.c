/* CRC32C: the reflected Castagnoli polynomial 0x82F63B78, initial value and
 * final xor all ones. x86-64's SSE4.2 crc32 instruction computes exactly this
 * register update, eight bytes at a time; elsewhere a byte table does.
 *
 * One crc32 chain waits for the instruction's latency at every step, so the
 * SSE4.2 path runs three chains over three adjacent stripes and joins them:
 * the register update is linear, so crc(A|B) = shift(crc(A), |B|) ^ crc0(B),
 * where crc0 starts from 0 and shift feeds |B| zero bytes. The stripe length
 * is fixed, so one shift operator, tabulated by byte, serves every join. */
#include "runtime/crc32c.h"

#include <pthread.h>
#include <string.h>

#define CASTAGNOLI 0x82F63B78u
#define STRIPE 4096 /* bytes per chain per round */

static uint32_t table[256];
static uint32_t shift_stripe[4][256]; /* the register after STRIPE zero bytes, by byte of it */
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
    uint32_t column[32]; /* the shift of each single-bit register */
    for (int bit = 0; bit < 32; bit++) {
        uint32_t c = 1u << bit;
        for (int k = 0; k < STRIPE; k++)
            c = (c >> 8) ^ table[c & 0xffu];
        column[bit] = c;
    }
    for (int byte = 0; byte < 4; byte++)
        for (uint32_t v = 0; v < 256; v++) {
            uint32_t c = 0;
            for (int bit = 0; bit < 8; bit++)
                if (v >> bit & 1u)
                    c ^= column[8 * byte + bit];
            shift_stripe[byte][v] = c;
        }
}

static uint32_t shift_by_stripe(uint32_t c)
{
    return shift_stripe[0][c & 0xffu] ^ shift_stripe[1][c >> 8 & 0xffu] ^
           shift_stripe[2][c >> 16 & 0xffu] ^ shift_stripe[3][c >> 24];
}

static uint32_t update_portable(uint32_t crc, const unsigned char *p, size_t n)
{
    pthread_once(&init_once, init);
    while (n--)
        crc = (crc >> 8) ^ table[(crc ^ *p++) & 0xffu];
    return crc;
}

uint32_t loom_crc32c_portable(const void *data, size_t n)
{
    return ~update_portable(~0u, data, n);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <nmmintrin.h>

__attribute__((target("sse4.2"))) static uint32_t update_sse42(uint32_t crc,
                                                                const unsigned char *p, size_t n)
{
    for (; n >= 3 * STRIPE; p += 3 * STRIPE, n -= 3 * STRIPE) {
        uint64_t a = crc, b = 0, c = 0;
        for (size_t i = 0; i < STRIPE; i += 8) {
            uint64_t wa, wb, wc;
            memcpy(&wa, p + i, 8);
            memcpy(&wb, p + STRIPE + i, 8);
            memcpy(&wc, p + 2 * STRIPE + i, 8);
            a = _mm_crc32_u64(a, wa);
            b = _mm_crc32_u64(b, wb);
            c = _mm_crc32_u64(c, wc);
        }
        crc = shift_by_stripe(shift_by_stripe((uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)c;
    }
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

uint32_t loom_crc32c(const void *data, size_t n)
{
    return ~update(~0u, data, n);
}

uint32_t loom_crc32c_extend(uint32_t crc, const void *data, size_t n)
{
    return ~update(~crc, data, n);
}

uint32_t loom_copy_crc32c(void *dst, const void *src, size_t n)
{
    enum { PIECE = 6 * STRIPE }; /* well inside L1/L2: checksum what was just copied */
    unsigned char *d = dst;
    uint32_t crc = ~0u;
    for (size_t done = 0; done < n; done += PIECE) {
        size_t len = n - done < PIECE ? n - done : PIECE;
        memcpy(d + done, (const unsigned char *)src + done, len);
        crc = update(crc, d + done, len);
    }
    return ~crc;
}
