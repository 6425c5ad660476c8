/* neon/attn_neon.h: what the NEON attention partial kernels (neon/attn.c,
 * neon_mmla/attn.c) share: the softmax numerators of one query's scores. */
#ifndef ARMLLM_ATTN_NEON_H
#define ARMLLM_ATTN_NEON_H

#include <arm_neon.h>
#include <math.h>

#include "../vexp.h"
#include "vexp_neon.h"

/* Scores si[a0, a1) (a1 > a0) to exp(si - m) in place, m = their max
 * (returned); with sum, *sum = the sum of the exps (4 lanes, then the tail
 * in order). vexp is bit-identical to armllm_exp_scalar. */
static inline __attribute__((always_inline)) float armllm_neon_softmax_row(float *si, int64_t a0,
                                                                           int64_t a1,
                                                                           float *sum) {
  float32x4_t vm = vdupq_n_f32(-INFINITY);
  int64_t j = a0;
  for (; j + 4 <= a1; j += 4) vm = vmaxq_f32(vm, vld1q_f32(si + j));
  float mp = vmaxvq_f32(vm);
  for (; j < a1; j++) mp = si[j] > mp ? si[j] : mp;
  const float32x4_t vmp = vdupq_n_f32(mp);
  float32x4_t vl = vdupq_n_f32(0.0f);
  for (j = a0; j + 4 <= a1; j += 4) {
    const float32x4_t ev = armllm_vexpq_f32(vsubq_f32(vld1q_f32(si + j), vmp));
    vst1q_f32(si + j, ev);
    if (sum) vl = vaddq_f32(vl, ev);
  }
  float lp = sum ? vaddvq_f32(vl) : 0.0f;
  for (; j < a1; j++) {
    si[j] = armllm_exp_scalar(si[j] - mp);
    if (sum) lp += si[j];
  }
  if (sum) *sum = lp;
  return mp;
}

#endif /* ARMLLM_ATTN_NEON_H */
