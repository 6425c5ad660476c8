/* avx2/norm.c: not yet ported; the table points at ref. */
#include "../armllm_kernels.h"
