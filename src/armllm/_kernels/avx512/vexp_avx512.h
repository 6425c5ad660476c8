/* avx512/vexp_avx512.h: the shared exp approximation (../vexp.h), 16 lanes
 * wide, and the lane masks the avx512 element-wise kernels use for tails.
 *
 * Performs exactly the operations of armllm_exp_scalar() in the same order,
 * with FMAs exactly where the scalar form calls fmaf(), so every lane is
 * bit-identical to ref. Inline, for exp.c, act.c and attn.c. Needs -mavx512f.
 */
#ifndef ARMLLM_VEXP_AVX512_H
#define ARMLLM_VEXP_AVX512_H

#include <immintrin.h>

#include "../vexp.h"

/* The core of the shared exp: n = round(x * log2(e)), r = x - n * ln2 in two
 * parts, and p = exp(r) by the polynomial, so that exp(x) = p * 2^n. The
 * full exp and the one for [-80, 0] below both use it. */
static inline __m512 armllm_exp_core_avx512(__m512 x, __m512 *n_out) {
  const __m512 round = _mm512_set1_ps(ARMLLM_EXP_ROUND);
  __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(ARMLLM_EXP_LOG2E), round), round);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-ARMLLM_EXP_LN2_HI), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(ARMLLM_EXP_LN2_LO), r);
  __m512 p = _mm512_set1_ps(ARMLLM_EXP_P0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ARMLLM_EXP_P1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ARMLLM_EXP_P2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ARMLLM_EXP_P3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ARMLLM_EXP_P4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(ARMLLM_EXP_P5));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
  p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
  *n_out = n;
  return p;
}

static inline __m512 armllm_exp_avx512(__m512 x) {
  /* clamp; max(x, LO) returns LO for NaN lanes, which are restored at the end */
  __m512 xc = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(ARMLLM_EXP_LO)),
                            _mm512_set1_ps(ARMLLM_EXP_HI));
  __m512 n;
  const __m512 p = armllm_exp_core_avx512(xc, &n);
  __m512i ni = _mm512_cvttps_epi32(n); /* n is an integer in [-150, 128]: exact */
  __m512i half = _mm512_srai_epi32(ni, 1);
  __m512i rest = _mm512_sub_epi32(ni, half);
  const __m512i bias = _mm512_set1_epi32(127);
  __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(half, bias), 23));
  __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(rest, bias), 23));
  __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
  /* NaN in, the same NaN out (as the scalar form's early return) */
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);
  /* opaque to the optimizer: a caller's later add is never fused into the
   * last multiply, whatever -ffp-contract says */
  __asm__("" : "+v"(y));
  return y;
}

/* The shared exp (armllm_exp_avx512) for d in [-80, 0], where its clamp and
 * NaN pass-through change nothing and its two-step scaling by 2^n equals one
 * (every product is a normal float, so both are exact): the same operations
 * otherwise, so the same bits, in lanes `keep`; other lanes are 0. The scaling
 * is one vscalefps (p * 2^n, exact for a normal result like the product it
 * stands for), which also zeroes the lanes outside keep. For the sampler's
 * exp pass (sample.c). */
static inline __m512 armllm_exp_nonpositive_avx512(__mmask16 keep, __m512 d) {
  __m512 n;
  const __m512 p = armllm_exp_core_avx512(d, &n);
  __m512 y = _mm512_maskz_scalef_ps(keep, p, n);
  __asm__("" : "+v"(y)); /* as the shared exp: never fused into a later add */
  return y;
}

/* The shared exp (armllm_exp_avx512) of softmax exponents d = score - max,
 * which are <= 0 or NaN, in lanes `keep` (0 in the others): the same bits
 * for every such d (checked for every float in [-110, 0], -inf and quiet
 * NaNs; a signaling NaN comes out quieted, and scores, arithmetic results,
 * are never signaling). d is clamped at ARMLLM_EXP_LO as the shared exp clamps
 * it (a NaN d stays NaN: max returns its second operand when one is NaN),
 * and n >= -150 makes the shared exp's first product p * 2^(n/2) a normal
 * float, exact, so both its scalings and the one vscalefps round the exact
 * p * 2^n once, subnormal results included. */
static inline __m512 armllm_exp_scores_avx512(__mmask16 keep, __m512 d) {
  return armllm_exp_nonpositive_avx512(keep, _mm512_max_ps(_mm512_set1_ps(ARMLLM_EXP_LO), d));
}

/* Lane mask for the first n (0..16) lanes of a 16-lane vector. */
static inline __mmask16 armllm_avx512_tail16(int64_t n) {
  return (__mmask16)(((uint32_t)1 << n) - 1);
}

#endif /* ARMLLM_VEXP_AVX512_H */
