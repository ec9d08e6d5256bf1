/* Runs a GPU test only where it can run:
 *
 *   gpu_or_skip [--gpus N] -- COMMAND [ARGS...]
 *
 * With at least N CUDA devices visible (default 1) it becomes COMMAND
 * (exec); otherwise it prints why on one line and exits 77, which ctest
 * shows as skipped (SKIP_RETURN_CODE), never as passed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#define SKIP 77

int main(int argc, char **argv)
{
    int need = 1, first = 1;
    if (first + 1 < argc && !strcmp(argv[first], "--gpus")) {
        need = atoi(argv[first + 1]);
        first += 2;
    }
    if (first >= argc || strcmp(argv[first], "--") != 0 || first + 1 >= argc) {
        fprintf(stderr, "usage: gpu_or_skip [--gpus N] -- COMMAND [ARGS...]\n");
        return 2;
    }
    /* Without a driver cudaGetDeviceCount fails and leaves the count alone. */
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        printf("SKIPPED: no CUDA device visible (cudaGetDeviceCount: %s)\n", cudaGetErrorString(e));
        return SKIP;
    }
    if (count < need) {
        printf("SKIPPED: needs %d CUDA device%s (one per rank), %d visible\n", need,
               need > 1 ? "s" : "", count);
        return SKIP;
    }
    fflush(stdout);
    execvp(argv[first + 1], argv + first + 1);
    perror(argv[first + 1]);
    return 127;
}
