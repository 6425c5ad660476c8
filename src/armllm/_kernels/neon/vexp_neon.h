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

/* The core of the shared exp: n = round(x * log2(e)), r = x - n * ln2 in two
 * parts, and p = exp(r) by the polynomial, so that exp(x) = p * 2^n. The
 * full exp and the one for [-80, 0] below both use it. */
static inline __attribute__((always_inline)) float32x4_t armllm_vexpq_core_f32(
    float32x4_t x, float32x4_t *n_out) {
  const float32x4_t round = vdupq_n_f32(ARMLLM_EXP_ROUND);
  float32x4_t n = vsubq_f32(vfmaq_f32(round, x, vdupq_n_f32(ARMLLM_EXP_LOG2E)), round);
  float32x4_t r = vfmaq_f32(x, n, vdupq_n_f32(-ARMLLM_EXP_LN2_HI));
  r = vfmaq_f32(r, n, vdupq_n_f32(ARMLLM_EXP_LN2_LO));
  float32x4_t p = vdupq_n_f32(ARMLLM_EXP_P0);
  p = vfmaq_f32(vdupq_n_f32(ARMLLM_EXP_P1), p, r);
  p = vfmaq_f32(vdupq_n_f32(ARMLLM_EXP_P2), p, r);
  p = vfmaq_f32(vdupq_n_f32(ARMLLM_EXP_P3), p, r);
  p = vfmaq_f32(vdupq_n_f32(ARMLLM_EXP_P4), p, r);
  p = vfmaq_f32(vdupq_n_f32(ARMLLM_EXP_P5), p, r);
  p = vfmaq_f32(r, p, vmulq_f32(r, r));
  p = vaddq_f32(p, vdupq_n_f32(1.0f));
  *n_out = n;
  return p;
}

static inline __attribute__((always_inline)) float32x4_t armllm_vexpq_f32(float32x4_t x) {
  const float32x4_t lo = vdupq_n_f32(ARMLLM_EXP_LO), hi = vdupq_n_f32(ARMLLM_EXP_HI);
  /* NaN lanes go through the arithmetic harmlessly and are restored at the end. */
  float32x4_t xc = vminq_f32(vmaxq_f32(x, lo), hi);
  float32x4_t n;
  const float32x4_t p = armllm_vexpq_core_f32(xc, &n);
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

/* The shared exp (armllm_vexpq_f32) for d in [-80, 0], where its clamp and
 * NaN pass-through change nothing and its two-step scaling by 2^n equals one
 * (every product is a normal float, so both are exact): the same operations
 * otherwise, so the same bits. Other lanes give unspecified values. For the
 * sampler's exp pass (sample.c). */
static inline __attribute__((always_inline)) float32x4_t armllm_exp_nonpositive_neon(
    float32x4_t d) {
  float32x4_t n;
  const float32x4_t p = armllm_vexpq_core_f32(d, &n);
  const int32x4_t scale = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  float32x4_t y = vmulq_f32(p, vreinterpretq_f32_s32(scale));
  ARMLLM_NEON_OPAQUE(y);
  return y;
}

#endif /* ARMLLM_NEON_VEXP_NEON_H */
