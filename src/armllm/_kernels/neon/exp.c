/* neon/exp.c: vectorized exp, bit-identical to ref (see vexp_neon.h). */
#include <arm_neon.h>

#include "../armllm_kernels.h"
#include "vexp_neon.h"

void armllm_neon_exp(const float *x, float *y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) { /* four independent chains hide the FMA latency */
    float32x4_t a = vld1q_f32(x + i), b = vld1q_f32(x + i + 4);
    float32x4_t c = vld1q_f32(x + i + 8), d = vld1q_f32(x + i + 12);
    a = armllm_vexpq_f32(a);
    b = armllm_vexpq_f32(b);
    c = armllm_vexpq_f32(c);
    d = armllm_vexpq_f32(d);
    vst1q_f32(y + i, a);
    vst1q_f32(y + i + 4, b);
    vst1q_f32(y + i + 8, c);
    vst1q_f32(y + i + 12, d);
  }
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, armllm_vexpq_f32(vld1q_f32(x + i)));
  if (i < n) { /* 1..3 left: through a zeroed stack vector */
    float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int64_t r = n - i;
    memcpy(t, x + i, (size_t)r * sizeof *t);
    vst1q_f32(t, armllm_vexpq_f32(vld1q_f32(t)));
    memcpy(y + i, t, (size_t)r * sizeof *t);
  }
}
