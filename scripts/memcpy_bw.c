/* Single-thread memcpy bandwidth, the physical bound docs/benchmarks-ucx.md
 * compares collective bandwidth with. Copies a buffer of SIZE bytes (default
 * 64 MiB, far past the caches) RUNS times and prints the median in GB/s
 * (10^9 bytes per second, as loom bench's busbw).
 *
 *   cc -O2 -o memcpy_bw scripts/memcpy_bw.c && ./memcpy_bw [SIZE [RUNS]]   */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    size_t size = argc > 1 ? strtoull(argv[1], NULL, 0) : (size_t)64 << 20;
    int runs = argc > 2 ? atoi(argv[2]) : 11;
    if (size == 0 || runs < 1 || runs > 1000) {
        fprintf(stderr, "usage: memcpy_bw [SIZE [RUNS]]\n");
        return 2;
    }
    char *src = malloc(size), *dst = malloc(size);
    double *gbs = malloc((size_t)runs * sizeof *gbs);
    if (!src || !dst || !gbs) {
        fprintf(stderr, "memcpy_bw: out of memory\n");
        return 1;
    }
    /* touch every page first: the first copy would otherwise time page faults */
    memset(src, 1, size);
    memset(dst, 2, size);
    for (int i = 0; i < runs; i++) {
        double t0 = now_s();
        memcpy(dst, src, size);
        double t = now_s() - t0;
        gbs[i] = (double)size / t / 1e9;
        src[i % size] = dst[(i * 4099) % size]; /* keep the copies observable */
    }
    qsort(gbs, (size_t)runs, sizeof *gbs, cmp);
    printf("%.2f\n", gbs[runs / 2]);
    free(src);
    free(dst);
    free(gbs);
    return 0;
}
