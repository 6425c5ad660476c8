/* avx512/bf16_round.h: rows of f32 activations rounded to bf16 k pairs, the
 * A operand of avx512's vdpbf16ps chains and of the amx variant's TDPBF16PS
 * tiles (one rounding for both): round to nearest even with vcvtne2ps2bf16,
 * which, like both dot products, flushes f32 denormals to zero. Pair i of a
 * row is 32-bit lane i (even k in the low half), matching the weights'
 * "nr16k2" pairs. */
#ifndef ARMLLM_AVX512_BF16_ROUND_H
#define ARMLLM_AVX512_BF16_ROUND_H

#include <immintrin.h>
#include <stdint.h>

/* Lanes [0, n) of a 16-lane vector (n clamped to 0..16). */
static inline __mmask16 bf16_round_lanes(int64_t n) {
  return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* bf16 pairs of x[0 .. 32) (zeros from x[valid] on): 16 pairs. */
static inline __attribute__((always_inline)) __m512i bf16_round_pairs16(const float *x,
                                                                         int64_t valid) {
  const __m512 lo = _mm512_maskz_loadu_ps(bf16_round_lanes(valid), x);
  const __m512 hi = _mm512_maskz_loadu_ps(bf16_round_lanes(valid - 16), x + 16);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo); /* low 16 bf16 from lo, high 16 from hi */
}

/* Rounds pairs [0, pairs) (whole vectors: up to pairs rounded up to 16) of
 * `rows` rows of x (row stride ldx; x[.. valid) real, zeros after) to bf16
 * pairs at out[r*stride + i]. */
static inline void bf16_round_rows(const float *x, int64_t ldx, int64_t rows, int64_t valid,
                                   int64_t pairs, uint32_t *out, int64_t stride) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t i = 0; i < pairs; i += 16)
      _mm512_storeu_si512(out + r * stride + i,
                          bf16_round_pairs16(x + r * ldx + 2 * i, valid - 2 * i));
}

#endif /* ARMLLM_AVX512_BF16_ROUND_H */
