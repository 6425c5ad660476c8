/* avx2/rope.c: rotary position embedding, neox (halves) and gpt-j (pairs).
 *
 * Same products and sums as ref (a*c - b*s, b*c + a*s, each product rounded:
 * no FMA), so results are bit-identical. neox rotates 8 pairs per vector;
 * gpt-j loads 4 interleaved pairs per vector and uses addsub. Tails are
 * masked.
 */
#include <immintrin.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"
#include "vexp_avx2.h"

#define ROPE_MIN_CHUNK 32768 /* elements: less (a decode row) stays on the caller */

static inline void rope_neox_head(float *v, const float *cs, int64_t half) {
  int64_t i = 0;
  for (; i + 8 <= half; i += 8) {
    __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + half + i);
    __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(cs + half + i);
    _mm256_storeu_ps(v + i, _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
    _mm256_storeu_ps(v + half + i, _mm256_add_ps(_mm256_mul_ps(b, c), _mm256_mul_ps(a, s)));
  }
  if (i < half) {
    __m256i m = armllm_avx2_tail_mask(half - i);
    __m256 a = _mm256_maskload_ps(v + i, m), b = _mm256_maskload_ps(v + half + i, m);
    __m256 c = _mm256_maskload_ps(cs + i, m), s = _mm256_maskload_ps(cs + half + i, m);
    _mm256_maskstore_ps(v + i, m, _mm256_sub_ps(_mm256_mul_ps(a, c), _mm256_mul_ps(b, s)));
    _mm256_maskstore_ps(v + half + i, m, _mm256_add_ps(_mm256_mul_ps(b, c), _mm256_mul_ps(a, s)));
  }
}

/* 4 pairs [a0 b0 a1 b1 a2 b2 a3 b3] with cos/sin c0..c3, s0..s3: even lanes
 * a*c - b*s, odd lanes b*c + a*s (addsub: even subtract, odd add). */
static inline __m256 rope_gptj4(__m256 v, __m128 c4, __m128 s4) {
  __m256 c = _mm256_set_m128(_mm_unpackhi_ps(c4, c4), _mm_unpacklo_ps(c4, c4));
  __m256 s = _mm256_set_m128(_mm_unpackhi_ps(s4, s4), _mm_unpacklo_ps(s4, s4));
  __m256 sw = _mm256_permute_ps(v, 0xB1); /* [b0 a0 b1 a1 ...] */
  return _mm256_addsub_ps(_mm256_mul_ps(v, c), _mm256_mul_ps(sw, s));
}

static inline void rope_gptj_head(float *v, const float *cs, int64_t half) {
  int64_t i = 0; /* pair index */
  for (; i + 4 <= half; i += 4)
    _mm256_storeu_ps(v + 2 * i, rope_gptj4(_mm256_loadu_ps(v + 2 * i), _mm_loadu_ps(cs + i),
                                           _mm_loadu_ps(cs + half + i)));
  if (i < half) {
    __m256i m = armllm_avx2_tail_mask(2 * (half - i));
    __m128i m4 = _mm256_castsi256_si128(armllm_avx2_tail_mask(half - i));
    __m256 r = rope_gptj4(_mm256_maskload_ps(v + 2 * i, m), _mm_maskload_ps(cs + i, m4),
                          _mm_maskload_ps(cs + half + i, m4));
    _mm256_maskstore_ps(v + 2 * i, m, r);
  }
}

ARMLLM_ROPE_KERNEL(armllm_avx2_rope, rope_neox_head, rope_gptj_head, ROPE_MIN_CHUNK)
