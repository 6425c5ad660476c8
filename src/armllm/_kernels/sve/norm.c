/* sve/norm.c: not yet ported. */
#include "../armllm_kernels.h"
