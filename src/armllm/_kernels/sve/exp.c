/* sve/exp.c: not yet ported. */
#include "../armllm_kernels.h"
