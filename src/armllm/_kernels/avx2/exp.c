/* avx2/exp.c: the shared exp approximation, 8 lanes at a time; the tail goes
 * through masked loads and stores, so every element is bit-identical to ref. */
#include "../armllm_kernels.h"
#include "vexp_avx2.h"

void armllm_avx2_exp(const float *x, float *y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    _mm256_storeu_ps(y + i, armllm_exp_avx2(a));
    _mm256_storeu_ps(y + i + 8, armllm_exp_avx2(b));
  }
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, armllm_exp_avx2(_mm256_loadu_ps(x + i)));
  if (i < n) {
    __m256i m = armllm_avx2_tail_mask(n - i);
    _mm256_maskstore_ps(y + i, m, armllm_exp_avx2(_mm256_maskload_ps(x + i, m)));
  }
}
