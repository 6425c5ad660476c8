/* avx2/gemm.c: not yet ported; the table points at ref. */
#include "../armllm_kernels.h"
