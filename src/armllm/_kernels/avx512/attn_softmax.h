/* avx512/attn_softmax.h: the steps of attention that avx512/attn.c and
 * amx/attn.c share bit for bit: one query's softmax over a partition's
 * scores (for an int8 cache also its int16 PV weights, attn_i8.h), and the
 * final division of its weighted V by the weights' sum. */
#ifndef ARMLLM_AVX512_ATTN_SOFTMAX_H
#define ARMLLM_AVX512_ATTN_SOFTMAX_H

#include <math.h>

#include "../armllm_kernels.h"
#include "vexp_avx512.h"

/* The keys [*a0, *a1) of the partition starting at key pbase that a query
 * with keys [lo, pos] sees, relative to pbase; 0 if it sees none. */
static inline int attn_range16(int64_t lo, int64_t pos, int64_t pbase, int64_t *a0,
                               int64_t *a1) {
  const int64_t part = ARMLLM_ATTN_PARTITION;
  *a0 = (lo > pbase ? lo : pbase) - pbase;
  *a1 = (pos + 1 < pbase + part ? pos + 1 : pbase + part) - pbase;
  return *a0 < *a1;
}

/* The lanes of the 16 keys from j that lie in [a0, a1): scalar arithmetic,
 * all 16 for every chunk but the range's first and last. */
static inline __mmask16 attn_lanes16(int64_t a0, int64_t a1, int64_t j) {
  int64_t lo = a0 - j, hi = a1 - j;
  lo = lo < 0 ? 0 : (lo > 16 ? 16 : lo);
  hi = hi < 0 ? 0 : (hi > 16 ? 16 : hi);
  return (__mmask16)((((uint32_t)1 << hi) - 1) & ~(((uint32_t)1 << lo) - 1));
}

/* The largest score of s[a0..a1) (a1 > a0; whole vectors are read from
 * a0 rounded down to 16). */
static inline float attn_max16(const float *s, int64_t a0, int64_t a1) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t j = a0 & ~(int64_t)15; j < a1; j += 16)
    mx = _mm512_mask_max_ps(mx, attn_lanes16(a0, a1, j), mx, _mm512_loadu_ps(s + j));
  return _mm512_reduce_max_ps(mx);
}

/* The softmax numerators exp(s[j..j+16) - m) in lanes `in`, 0 in the others:
 * the shared exp's bits (armllm_exp_scores_avx512). */
static inline __m512 attn_exp16(const float *s, int64_t j, __mmask16 in, __m512 m16) {
  return armllm_exp_scores_avx512(in, _mm512_sub_ps(_mm512_loadu_ps(s + j), m16));
}

/* Softmax weights of one query over the scores s[u0..u1) of the partition
 * starting at key pbase, of which keys [lo, pos] are its own (u0 a multiple
 * of 16; the stores run to u1 rounded up to 16). In place: s[j] = exp(s[j] -
 * m) for its keys, 0 for the others; *m_out = m (the max), *l_out = the
 * weights' sum. Lanes are key positions, so the result does not depend on
 * which other queries share a tile. Returns 0 (s zeroed, m and l untouched)
 * when the query sees none of the partition's keys. */
static inline int attn_softmax16(float *s, int64_t lo, int64_t pos, int64_t pbase, int64_t u0,
                                 int64_t u1, float *m_out, float *l_out) {
  int64_t a0, a1;
  if (!attn_range16(lo, pos, pbase, &a0, &a1)) {
    for (int64_t j = u0; j < u1; j++) s[j] = 0.0f;
    return 0;
  }
  const float m = attn_max16(s, a0, a1);
  const __m512 m16 = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = u0; j < u1; j += 16) {
    const __m512 e = attn_exp16(s, j, attn_lanes16(a0, a1, j), m16);
    sum = _mm512_add_ps(sum, e);
    _mm512_storeu_ps(s + j, e);
  }
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
