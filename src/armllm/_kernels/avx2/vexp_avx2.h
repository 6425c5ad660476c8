/* avx2/vexp_avx2.h: the shared exp approximation (../vexp.h), 8 lanes wide.
 *
 * Performs exactly the operations of armllm_exp_scalar() in the same order,
 * with FMAs exactly where the scalar form calls fmaf(), so every lane is
 * bit-identical to ref. Inline, for exp.c, act.c and (later) attention.
 * Needs -mavx2 -mfma.
 */
#ifndef ARMLLM_VEXP_AVX2_H
#define ARMLLM_VEXP_AVX2_H

#include <immintrin.h>

#include "../vexp.h"

/* The core of the shared exp: n = round(x * log2(e)), r = x - n * ln2 in two
 * parts, and p = exp(r) by the polynomial, so that exp(x) = p * 2^n. The
 * full exp and the one for [-80, 0] below both use it. */
static inline __m256 armllm_exp_core_avx2(__m256 x, __m256 *n_out) {
  const __m256 round = _mm256_set1_ps(ARMLLM_EXP_ROUND);
  __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(ARMLLM_EXP_LOG2E), round), round);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-ARMLLM_EXP_LN2_HI), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(ARMLLM_EXP_LN2_LO), r);
  __m256 p = _mm256_set1_ps(ARMLLM_EXP_P0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ARMLLM_EXP_P1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ARMLLM_EXP_P2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ARMLLM_EXP_P3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ARMLLM_EXP_P4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(ARMLLM_EXP_P5));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
  *n_out = n;
  return p;
}

static inline __m256 armllm_exp_avx2(__m256 x) {
  /* clamp; max(x, LO) returns LO for NaN lanes, which are restored at the end */
  __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(ARMLLM_EXP_LO)),
                            _mm256_set1_ps(ARMLLM_EXP_HI));
  __m256 n;
  const __m256 p = armllm_exp_core_avx2(xc, &n);
  __m256i ni = _mm256_cvttps_epi32(n); /* n is an integer in [-150, 128]: exact */
  __m256i half = _mm256_srai_epi32(ni, 1);
  __m256i rest = _mm256_sub_epi32(ni, half);
  const __m256i bias = _mm256_set1_epi32(127);
  __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, bias), 23));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  /* NaN in, the same NaN out (as the scalar form's early return) */
  y = _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  /* opaque to the optimizer: a caller's later add is never fused into the
   * last multiply, whatever -ffp-contract says */
  __asm__("" : "+x"(y));
  return y;
}

/* The shared exp (armllm_exp_avx2) for d in [-80, 0], where its clamp and NaN
 * pass-through change nothing and its two-step scaling by 2^n equals one
 * (every product is a normal float, so both are exact): the same operations
 * otherwise, so the same bits. Other lanes give unspecified values. For the
 * sampler's exp pass (sample.c). */
static inline __m256 armllm_exp_nonpositive_avx2(__m256 d) {
  __m256 n;
  const __m256 p = armllm_exp_core_avx2(d, &n);
  const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n),
                                                           _mm256_set1_epi32(127)), 23);
  __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(scale));
  __asm__("" : "+x"(y)); /* as the shared exp: never fused into a later add */
  return y;
}

/* The shared exp (armllm_exp_avx2) of softmax exponents d = score - max,
 * which are <= 0 or NaN: the same bits for every such d (checked for
 * every float in [-110, 0], -inf and quiet NaNs; a signaling NaN comes out
 * quieted, and scores, arithmetic results, are never signaling). d is clamped at
 * ARMLLM_EXP_LO as the shared exp clamps it (a NaN d stays NaN: max returns
 * its second operand when one is NaN, and the arithmetic after carries it,
 * so the NaN blend is not needed), and the upper clamp cannot bite. */
static inline __m256 armllm_exp_scores_avx2(__m256 d) {
  const __m256 xc = _mm256_max_ps(_mm256_set1_ps(ARMLLM_EXP_LO), d);
  __m256 n;
  const __m256 p = armllm_exp_core_avx2(xc, &n);
  const __m256i ni = _mm256_cvttps_epi32(n); /* n is an integer in [-150, 0]: exact */
  const __m256i half = _mm256_srai_epi32(ni, 1), rest = _mm256_sub_epi32(ni, half);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, bias), 23));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  __asm__("" : "+x"(y)); /* as the shared exp: never fused into a later add */
  return y;
}

/* Lanes j..j+8 that lie in [a0, a1), as a mask: two loads from a window of
 * ones, no vector compares. */
static inline __m256 armllm_avx2_range_mask(int64_t a0, int64_t a1, int64_t j) {
  static const int32_t window[24] = {0,  0,  0,  0,  0,  0,  0,  0,  -1, -1, -1, -1,
                                     -1, -1, -1, -1, 0,  0,  0,  0,  0,  0,  0,  0};
  int64_t lo = a0 - j, hi = a1 - j;
  lo = lo < 0 ? 0 : (lo > 8 ? 8 : lo);
  hi = hi < 0 ? 0 : (hi > 8 ? 8 : hi);
  /* window + 8 - lo: -1 from lane lo on; window + 16 - hi: -1 below lane hi */
  return _mm256_and_ps(_mm256_loadu_ps((const float *)(window + 8 - lo)),
                       _mm256_loadu_ps((const float *)(window + 16 - hi)));
}

/* Lane mask for the first n (0..8) lanes, for maskload/maskstore tails. */
static inline __m256i armllm_avx2_tail_mask(int64_t n) {
  static const int32_t ones_then_zeros[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                              0,  0,  0,  0,  0,  0,  0,  0};
  return _mm256_loadu_si256((const __m256i *)(ones_then_zeros + 8 - n));
}

#endif /* ARMLLM_VEXP_AVX2_H */
