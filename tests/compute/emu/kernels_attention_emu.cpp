/* kernels_attention.cu compiled as host C++ on the CUDA emulation (cuda_emu.h) */
#include "cuda_emu.h"

#include "kernels_attention.cu"
