/* avx512/exp.c: the shared exp approximation, 16 lanes at a time; the tail
 * goes through masked loads and stores, so every element is bit-identical
 * to ref. */
#include "../armllm_kernels.h"
#include "vexp_avx512.h"

void armllm_avx512_exp(const float *x, float *y, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    _mm512_storeu_ps(y + i, armllm_exp_avx512(a));
    _mm512_storeu_ps(y + i + 16, armllm_exp_avx512(b));
  }
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, armllm_exp_avx512(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = armllm_avx512_tail16(n - i);
    _mm512_mask_storeu_ps(y + i, m, armllm_exp_avx512(_mm512_maskz_loadu_ps(m, x + i)));
  }
}
