/* sve/vexp_sve.h: the shared exp approximation (../vexp.h) as an SVE vector
 * function, vector-length agnostic.
 *
 * Performs exactly the operations of armllm_exp_scalar() in the same order,
 * fused where the scalar form uses fmaf and nowhere else, so every lane is
 * bit-identical to ref. Inactive lanes of pg are don't-care. Callers that
 * feed the result into an addition (silu: 1 + exp(-g)) should pass it
 * through armllm_sve_opaque() first so that the compiler cannot contract the
 * final multiply into a fused multiply-add that ref does not perform.
 */
#ifndef ARMLLM_VEXP_SVE_H
#define ARMLLM_VEXP_SVE_H

#include <arm_sve.h>

#include "../vexp.h"

/* Hides a value from the optimizer (no instruction): blocks contraction. */
static inline svfloat32_t armllm_sve_opaque(svfloat32_t v) {
  __asm__("" : "+w"(v));
  return v;
}

/* The core of the shared exp: n = round(x * log2(e)), r = x - n * ln2 in two
 * parts, and p = exp(r) by the polynomial, so that exp(x) = p * 2^n. The
 * full exp and the one for [-80, 0] below both use it. */
static inline svfloat32_t armllm_sve_vexp_core(svbool_t pg, svfloat32_t x, svfloat32_t *n_out) {
  /* n = fmaf(x, LOG2E, ROUND) - ROUND */
  svfloat32_t n = svmad_n_f32_x(pg, x, svdup_n_f32(ARMLLM_EXP_LOG2E), ARMLLM_EXP_ROUND);
  n = svsub_n_f32_x(pg, n, ARMLLM_EXP_ROUND);
  /* r = fmaf(n, -LN2_HI, x); r = fmaf(n, LN2_LO, r) */
  svfloat32_t r = svmla_n_f32_x(pg, x, n, -ARMLLM_EXP_LN2_HI);
  r = svmla_n_f32_x(pg, r, n, ARMLLM_EXP_LN2_LO);
  /* Horner, p = fmaf(p, r, Pi) */
  svfloat32_t p = svmad_n_f32_x(pg, svdup_n_f32(ARMLLM_EXP_P0), r, ARMLLM_EXP_P1);
  p = svmad_n_f32_x(pg, p, r, ARMLLM_EXP_P2);
  p = svmad_n_f32_x(pg, p, r, ARMLLM_EXP_P3);
  p = svmad_n_f32_x(pg, p, r, ARMLLM_EXP_P4);
  p = svmad_n_f32_x(pg, p, r, ARMLLM_EXP_P5);
  /* p = fmaf(p, r * r, r); p = p + 1 */
  svfloat32_t r2 = svmul_f32_x(pg, r, r);
  p = svmla_f32_x(pg, r, p, r2);
  p = svadd_n_f32_x(pg, p, 1.0f);
  *n_out = n;
  return p;
}

static inline svfloat32_t armllm_sve_vexp(svbool_t pg, svfloat32_t x) {
  /* FMAX/FMIN propagate NaN; NaN lanes are replaced by x at the end. */
  svfloat32_t xc = svmin_n_f32_x(pg, svmax_n_f32_x(pg, x, ARMLLM_EXP_LO), ARMLLM_EXP_HI);
  svfloat32_t n;
  const svfloat32_t p = armllm_sve_vexp_core(pg, xc, &n);
  /* p * 2^half * 2^(n - half), half = floor(n / 2) */
  svint32_t ni = svcvt_s32_f32_x(pg, n);
  svint32_t half = svasr_n_s32_x(pg, ni, 1);
  svint32_t rest = svsub_s32_x(pg, ni, half);
  svfloat32_t s1 = svreinterpret_f32_s32(svlsl_n_s32_x(pg, svadd_n_s32_x(pg, half, 127), 23));
  svfloat32_t s2 = svreinterpret_f32_s32(svlsl_n_s32_x(pg, svadd_n_s32_x(pg, rest, 127), 23));
  svfloat32_t y = svmul_f32_x(pg, svmul_f32_x(pg, p, s1), s2);
  return svsel_f32(svcmpuo_f32(pg, x, x), x, y);
}

/* The shared exp (armllm_sve_vexp) for d in [-80, 0], where its clamp and NaN
 * pass-through change nothing and its two-step scaling by 2^n equals one
 * (every product is a normal float, so both are exact): the same operations
 * otherwise, so the same bits. Other lanes give unspecified values. For the
 * sampler's exp pass (sample.c). */
static inline svfloat32_t armllm_exp_nonpositive_sve(svbool_t pg, svfloat32_t d) {
  svfloat32_t n;
  const svfloat32_t p = armllm_sve_vexp_core(pg, d, &n);
  const svint32_t scale = svlsl_n_s32_x(pg, svadd_n_s32_x(pg, svcvt_s32_f32_x(pg, n), 127), 23);
  return svmul_f32_x(pg, p, svreinterpret_f32_s32(scale));
}

#endif /* ARMLLM_VEXP_SVE_H */
