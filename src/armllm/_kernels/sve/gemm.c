/* sve/gemm.c: not yet ported. */
#include "../armllm_kernels.h"
