/* avx512/rope.c: rotary position embedding, neox (halves) and gpt-j (pairs),
 * 16 lanes at a time with masked tails.
 *
 * Same products and sums as ref (a*c - b*s, b*c + a*s, each product rounded:
 * no FMA: each product passes through kept(), which the compiler cannot fuse
 * into the add, whatever -ffp-contract says), so results are bit-identical. neox rotates 16 pairs per vector;
 * gpt-j loads 8 interleaved pairs per vector, with cos/sin duplicated into
 * both lanes of a pair, subtracting in even lanes and adding in odd ones.
 */
#include <immintrin.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"
#include "vexp_avx512.h"

#define ROPE_MIN_CHUNK 32768 /* elements: less (a decode row) stays on the caller */

/* x, rounded as a product on its own (opaque to contraction into an FMA). */
static inline __m512 kept(__m512 x) {
  __asm__("" : "+v"(x));
  return x;
}

/* a*c - b*s and b*c + a*s, each product rounded (ref's operations) */
static inline __m512 rot_a(__m512 a, __m512 b, __m512 c, __m512 s) {
  return _mm512_sub_ps(kept(_mm512_mul_ps(a, c)), kept(_mm512_mul_ps(b, s)));
}
static inline __m512 rot_b(__m512 a, __m512 b, __m512 c, __m512 s) {
  return _mm512_add_ps(kept(_mm512_mul_ps(b, c)), kept(_mm512_mul_ps(a, s)));
}

static inline void rope_neox_head(float *v, const float *cs, int64_t half) {
  int64_t i = 0;
  for (; i + 16 <= half; i += 16) {
    __m512 a = _mm512_loadu_ps(v + i), b = _mm512_loadu_ps(v + half + i);
    __m512 c = _mm512_loadu_ps(cs + i), s = _mm512_loadu_ps(cs + half + i);
    _mm512_storeu_ps(v + i, rot_a(a, b, c, s));
    _mm512_storeu_ps(v + half + i, rot_b(a, b, c, s));
  }
  if (i < half) {
    const __mmask16 m = armllm_avx512_tail16(half - i);
    __m512 a = _mm512_maskz_loadu_ps(m, v + i), b = _mm512_maskz_loadu_ps(m, v + half + i);
    __m512 c = _mm512_maskz_loadu_ps(m, cs + i), s = _mm512_maskz_loadu_ps(m, cs + half + i);
    _mm512_mask_storeu_ps(v + i, m, rot_a(a, b, c, s));
    _mm512_mask_storeu_ps(v + half + i, m, rot_b(a, b, c, s));
  }
}

/* 8 pairs [a0 b0 a1 b1 ...] with cos c0..c7, sin s0..s7 (in the low 8 lanes):
 * even lanes a*c - b*s, odd lanes b*c + a*s. */
static inline __m512 rope_gptj8(__m512 v, __m512 c8, __m512 s8) {
  const __m512i dup = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __m512 c = _mm512_permutexvar_ps(dup, c8), s = _mm512_permutexvar_ps(dup, s8);
  const __m512 vc = kept(_mm512_mul_ps(v, c));
  const __m512 ws = kept(_mm512_mul_ps(_mm512_permute_ps(v, 0xB1), s)); /* [b0 a0 b1 a1 ...] * s */
  return _mm512_mask_sub_ps(_mm512_add_ps(vc, ws), 0x5555, vc, ws);
}

static inline void rope_gptj_head(float *v, const float *cs, int64_t half) {
  int64_t i = 0; /* pair index */
  for (; i + 8 <= half; i += 8)
    _mm512_storeu_ps(v + 2 * i,
                     rope_gptj8(_mm512_loadu_ps(v + 2 * i),
                                _mm512_castps256_ps512(_mm256_loadu_ps(cs + i)),
                                _mm512_castps256_ps512(_mm256_loadu_ps(cs + half + i))));
  if (i < half) {
    const __mmask16 m = armllm_avx512_tail16(2 * (half - i)), m8 = armllm_avx512_tail16(half - i);
    __m512 r = rope_gptj8(_mm512_maskz_loadu_ps(m, v + 2 * i), _mm512_maskz_loadu_ps(m8, cs + i),
                          _mm512_maskz_loadu_ps(m8, cs + half + i));
    _mm512_mask_storeu_ps(v + 2 * i, m, r);
  }
}

ARMLLM_ROPE_KERNEL(armllm_avx512_rope, rope_neox_head, rope_gptj_head, ROPE_MIN_CHUNK)
