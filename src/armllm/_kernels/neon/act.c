/* neon/act.c: not yet ported; the table points at ref. */
#include "../armllm_kernels.h"
