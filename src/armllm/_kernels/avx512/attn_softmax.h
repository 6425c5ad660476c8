/* avx512/attn_softmax.h: the two steps of attention that avx512/attn.c and
 * amx/attn.c share bit for bit: one query's softmax weights over a
 * partition's scores, and the final division of its weighted V by the
 * weights' sum. */
#ifndef ARMLLM_AVX512_ATTN_SOFTMAX_H
#define ARMLLM_AVX512_ATTN_SOFTMAX_H

#include <math.h>

#include "../armllm_kernels.h"
#include "vexp_avx512.h"

/* Softmax weights of one query over the scores s[u0..u1) of the partition
 * starting at key pbase, of which keys [lo, pos] are its own (u0 a multiple
 * of 16; the stores run to u1 rounded up to 16). In place: s[j] = exp(s[j] -
 * m) for its keys, 0 for the others; *m_out = m (the max), *l_out = the
 * weights' sum. Lanes are key positions, so the result does not depend on
 * which other queries share a tile. Returns 0 (s zeroed, m and l untouched)
 * when the query sees none of the partition's keys. */
static inline int attn_softmax16(float *s, int64_t lo, int64_t pos, int64_t pbase, int64_t u0,
                                 int64_t u1, float *m_out, float *l_out) {
  const int64_t part = ARMLLM_ATTN_PARTITION;
  const int64_t a0 = (lo > pbase ? lo : pbase) - pbase;
  const int64_t a1 = (pos + 1 < pbase + part ? pos + 1 : pbase + part) - pbase;
  if (a0 >= a1) {
    for (int64_t j = u0; j < u1; j++) s[j] = 0.0f;
    return 0;
  }
  const __m512i lo16 = _mm512_set1_epi32((int32_t)a0), hi16 = _mm512_set1_epi32((int32_t)a1);
  const __m512i step = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#define IN_RANGE(j)                                                                      \
  (_mm512_cmpge_epi32_mask(_mm512_add_epi32(_mm512_set1_epi32((int32_t)(j)), step), lo16) & \
   _mm512_cmplt_epi32_mask(_mm512_add_epi32(_mm512_set1_epi32((int32_t)(j)), step), hi16))
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t j = a0 & ~(int64_t)15; j < a1; j += 16)
    mx = _mm512_mask_max_ps(mx, IN_RANGE(j), mx, _mm512_loadu_ps(s + j));
  const float m = _mm512_reduce_max_ps(mx);
  const __m512 m16 = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = u0; j < u1; j += 16) {
    const __mmask16 in = IN_RANGE(j);
    const __m512 x = _mm512_mask_blend_ps(in, m16, _mm512_loadu_ps(s + j));
    const __m512 e = _mm512_maskz_mov_ps(in, armllm_exp_avx512(_mm512_sub_ps(x, m16)));
    sum = _mm512_add_ps(sum, e);
    _mm512_storeu_ps(s + j, e);
  }
#undef IN_RANGE
  *m_out = m;
  *l_out = _mm512_reduce_add_ps(sum);
  return 1;
}

/* out[0..hd) = acc / l: the one final division both paths of both
 * variants use. */
static __attribute__((noinline)) void attn_finish16(float *out, const float *acc, float l,
                                                    int64_t hd) {
  const __m512 l16 = _mm512_set1_ps(l);
  int64_t d = 0;
  for (; d + 16 <= hd; d += 16) _mm512_storeu_ps(out + d, _mm512_div_ps(_mm512_loadu_ps(acc + d), l16));
  if (d < hd) {
    const __mmask16 m = armllm_avx512_tail16(hd - d);
    _mm512_mask_storeu_ps(out + d, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, acc + d), l16));
  }
}

#endif /* ARMLLM_AVX512_ATTN_SOFTMAX_H */
