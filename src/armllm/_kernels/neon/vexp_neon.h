/* neon/vexp_neon.h: the shared exp approximation (../vexp.h) on 4 float lanes.
 *
 * Performs exactly the operations of armllm_exp_scalar, in the same order,
 * with FMLA where the scalar form calls fmaf, so every lane is bit-identical
 * to the reference on any Armv8 core. Used by exp.c, act.c and attention.
 *
 * GCC contracts a * b + c written with vmulq/vaddq into FMLA at the default
 * -ffp-contract=fast; the result is passed through an empty asm so that a
 * caller's "1 + exp(x)" is not fused with the final scaling multiply.
 */
#ifndef ARMLLM_NEON_VEXP_NEON_H
#define ARMLLM_NEON_VEXP_NEON_H

#include <arm_neon.h>

#include "../vexp.h"

/* Keeps GCC from fusing v into a following add, or folding it away. */
#define ARMLLM_NEON_OPAQUE(v) __asm__("" : "+w"(v))

static inline __attribute__((always_inline)) float32x4_t armllm_vexpq_f32(float32x4_t x) {
  const float32x4_t lo = vdupq_n_f32(ARMLLM_EXP_LO), hi = vdupq_n_f32(ARMLLM_EXP_HI);
  const float32x4_t round = vdupq_n_f32(ARMLLM_EXP_ROUND);
  /* NaN lanes go through the arithmetic harmlessly and are restored at the end. */
  float32x4_t xc = vminq_f32(vmaxq_f32(x, lo), hi);
  float32x4_t n = vsubq_f32(vfmaq_f32(round, xc, vdupq_n_f32(ARMLLM_EXP_LOG2E)), round);
  float32x4_t r = vfmaq_f32(xc, n, vdupq_n_f32(-ARMLLM_EXP_LN2_HI));
  r = vfmaq_f32(r, n, vdupq_n_f32(ARMLLM_EXP_LN2_LO));
  float32x4_t p = vdupq_n_f32(ARMLLM_EXP_P0);
  p = vfmaq_f32(vdupq_n_f32(ARMLLM_EXP_P1), p, r);
  p = vfmaq_f32(vdupq_n_f32(ARMLLM_EXP_P2), p, r);
  p = vfmaq_f32(vdupq_n_f32(ARMLLM_EXP_P3), p, r);
  p = vfmaq_f32(vdupq_n_f32(ARMLLM_EXP_P4), p, r);
  p = vfmaq_f32(vdupq_n_f32(ARMLLM_EXP_P5), p, r);
  p = vfmaq_f32(r, p, vmulq_f32(r, r));
  p = vaddq_f32(p, vdupq_n_f32(1.0f));
  int32x4_t ni = vcvtq_s32_f32(n); /* n is an integer in [-150, 128]: exact */
  int32x4_t half = vshrq_n_s32(ni, 1);
  const int32x4_t bias = vdupq_n_s32(127);
  float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(half, bias), 23));
  float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vsubq_s32(ni, half), bias), 23));
  float32x4_t y = vmulq_f32(vmulq_f32(p, s1), s2);
  y = vbslq_f32(vceqq_f32(x, x), y, x); /* NaN in, the same NaN out */
  ARMLLM_NEON_OPAQUE(y);
  return y;
}

#endif /* ARMLLM_NEON_VEXP_NEON_H */
