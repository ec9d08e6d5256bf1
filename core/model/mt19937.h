/* loom core — the Mersenne Twister as llm.c (and torch) seed and draw it,
 * and llm.c's shuffle, so loom's data order is llm.c's to the index.
 *
 * Seeding: state[0] = seed, state[i] = 1812433253 * (state[i-1] ^
 * (state[i-1] >> 30)) + i; the first draw refills the whole state. A
 * permutation of n draws n-1 numbers: for i = n-1 down to 1, swap i with
 * draw % (i+1) (Fisher-Yates from the top). */
#ifndef LOOM_MT19937_H
#define LOOM_MT19937_H

#include <stdint.h>

#define LOOM_MT19937_WORDS 624

typedef struct loom_mt19937 {
    uint32_t words[LOOM_MT19937_WORDS];
    int32_t left;  /* draws left before the next refill, plus one */
    uint32_t next; /* index of the next word to temper */
} loom_mt19937;

void loom_mt19937_seed(loom_mt19937 *rng, uint32_t seed);
uint32_t loom_mt19937_draw(loom_mt19937 *rng);

/* order[i] = i. */
void loom_identity_permutation(int *order, int n);
/* Shuffle order in place, as llm.c's random_permutation does (it does not
 * reset order first: an epoch's shard order permutes the previous one). */
void loom_random_permutation(int *order, int n, loom_mt19937 *rng);

#endif
