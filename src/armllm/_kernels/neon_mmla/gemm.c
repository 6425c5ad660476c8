/* neon_mmla/gemm.c: not yet ported. */
#include "../armllm_kernels.h"
