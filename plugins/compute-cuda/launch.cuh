/* The one way compute-cuda's kernel files launch a kernel. A build that
 * runs the kernels elsewhere (the CPU emulation in tests/compute/emu)
 * defines LOOM_CUDA_LAUNCH before this header; a template kernel with more
 * than one argument is named through a variable (a macro argument cannot
 * hold its comma). */
#ifndef LOOM_CUDA_LAUNCH_CUH
#define LOOM_CUDA_LAUNCH_CUH

#ifndef LOOM_CUDA_LAUNCH
#define LOOM_CUDA_LAUNCH(kernel, grid, block, smem, stream, ...)                                 \
    kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#endif

#endif
