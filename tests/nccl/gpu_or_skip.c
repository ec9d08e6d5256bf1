/* Runs a test only on the machines it is about:
 *
 *   gpu_or_skip [--gpus N] -- COMMAND [ARGS...]
 *   gpu_or_skip --no-gpu -- COMMAND [ARGS...]
 *
 * With at least N CUDA devices visible (default 1), or with --no-gpu where
 * none is, it becomes COMMAND (exec); otherwise it prints why on one line
 * and exits 77, which ctest shows as skipped (SKIP_RETURN_CODE), never as
 * passed. --no-gpu is for tests of the refusals a machine without a GPU
 * gives: where a GPU is visible those refusals cannot happen. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#define SKIP 77

int main(int argc, char **argv)
{
    int need = 1, without = 0, first = 1;
    if (first + 1 < argc && !strcmp(argv[first], "--gpus")) {
        need = atoi(argv[first + 1]);
        first += 2;
    } else if (first < argc && !strcmp(argv[first], "--no-gpu")) {
        without = 1;
        first += 1;
    }
    if (first >= argc || strcmp(argv[first], "--") != 0 || first + 1 >= argc) {
        fprintf(stderr, "usage: gpu_or_skip [--gpus N | --no-gpu] -- COMMAND [ARGS...]\n");
        return 2;
    }
    /* Without a driver cudaGetDeviceCount fails and leaves the count alone. */
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
        count = 0;
    if (without && count > 0) {
        printf("SKIPPED: %d CUDA device%s visible; this test covers machines without one\n",
               count, count > 1 ? "s" : "");
        return SKIP;
    }
    if (!without && e != cudaSuccess) {
        printf("SKIPPED: no CUDA device visible (cudaGetDeviceCount: %s)\n", cudaGetErrorString(e));
        return SKIP;
    }
    if (!without && count < need) {
        printf("SKIPPED: needs %d CUDA device%s (one per rank), %d visible\n", need,
               need > 1 ? "s" : "", count);
        return SKIP;
    }
    fflush(stdout);
    execvp(argv[first + 1], argv + first + 1);
    perror(argv[first + 1]);
    return 127;
}
