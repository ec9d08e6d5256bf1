/* The Mersenne Twister MT19937 (Matsumoto and Nishimura, 1998), seeded the
 * way llm.c and torch seed it: see mt19937.h. */
#include "model/mt19937.h"

#define SHIFT 397 /* the twist pairs word i with word i + SHIFT */
#define TWIST 0x9908b0dfu

static uint32_t twist(uint32_t upper, uint32_t lower, uint32_t far)
{
    uint32_t y = (upper & 0x80000000u) | (lower & 0x7fffffffu);
    return far ^ (y >> 1) ^ ((y & 1u) ? TWIST : 0u);
}

void loom_mt19937_seed(loom_mt19937 *rng, uint32_t seed)
{
    rng->words[0] = seed;
    for (uint32_t i = 1; i < LOOM_MT19937_WORDS; i++) {
        uint32_t prev = rng->words[i - 1];
        rng->words[i] = 1812433253u * (prev ^ (prev >> 30)) + i;
    }
    /* llm.c's start: the first draw refills before it reads a word. */
    rng->left = 1;
    rng->next = 0;
}

static void refill(loom_mt19937 *rng)
{
    uint32_t *w = rng->words;
    for (int i = 0; i < LOOM_MT19937_WORDS; i++) {
        int after = (i + 1) % LOOM_MT19937_WORDS, far = (i + SHIFT) % LOOM_MT19937_WORDS;
        w[i] = twist(w[i], w[after], w[far]);
    }
    rng->left = LOOM_MT19937_WORDS;
    rng->next = 0;
}

uint32_t loom_mt19937_draw(loom_mt19937 *rng)
{
    if (--rng->left <= 0)
        refill(rng);
    uint32_t y = rng->words[rng->next++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

void loom_identity_permutation(int *order, int n)
{
    for (int i = 0; i < n; i++)
        order[i] = i;
}

void loom_random_permutation(int *order, int n, loom_mt19937 *rng)
{
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(loom_mt19937_draw(rng) % (uint32_t)(i + 1));
        int kept = order[i];
        order[i] = order[j];
        order[j] = kept;
    }
}
