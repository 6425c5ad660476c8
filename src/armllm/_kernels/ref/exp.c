/* ref/exp.c: portable form of the shared exp approximation. */
#include "../armllm_kernels.h"
#include "../vexp.h"

void armllm_ref_exp(const float *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] = armllm_exp_scalar(x[i]);
}
