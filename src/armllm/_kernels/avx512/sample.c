/* avx512/sample.c: the sampler's vectorizable passes (armllm_kernels.h) on
 * 16-lane registers, with ref's bits: the shared exp (vexp_avx512.h, as it is
 * on [-80, 0]), and the block tree computed for 16 blocks at once, one level
 * per shuffle-and-add, each level adding exactly the lanes the definition
 * pairs. */
#include <math.h>

#include "../armllm_kernels.h"
#include "../sample_argmax.h"
#include "vexp_avx512.h"

#define BLOCK ARMLLM_SAMPLE_BLOCK
/* e is summed a chunk at a time, right after its exp: the in-order double
 * additions of one chunk's sums overlap the next chunk's exp */
#define CHUNK (ARMLLM_SAMPLE_BLOCK * ARMLLM_SAMPLE_BLOCK)

static inline __mmask16 lanes_below(int64_t left) {
  return left >= BLOCK ? (__mmask16)0xffff : armllm_avx512_tail16(left);
}

/* The first x[j] == v in x[0..n), or -1. */
static int64_t first_equal(const float *x, int64_t n, float v) {
  const __m512 vv = _mm512_set1_ps(v);
  for (int64_t i = 0; i < n; i += BLOCK) {
    const __mmask16 lanes = lanes_below(n - i);
    const __mmask16 eq = _mm512_mask_cmp_ps_mask(lanes, _mm512_maskz_loadu_ps(lanes, x + i), vv,
                                                 _CMP_EQ_OQ);
    if (eq) return i + __builtin_ctz(eq);
  }
  return -1;
}

/* The largest value of x[0..n) that is not NaN (-inf if none): four chains of
 * max(x, acc), which keeps acc for a NaN x. */
static float span_max(const float *x, int64_t n) {
  const __m512 none = _mm512_set1_ps(-INFINITY);
  __m512 m0 = none, m1 = none, m2 = none, m3 = none;
  int64_t i = 0;
  for (; i + 4 * BLOCK <= n; i += 4 * BLOCK) {
    m0 = _mm512_max_ps(_mm512_loadu_ps(x + i), m0);
    m1 = _mm512_max_ps(_mm512_loadu_ps(x + i + BLOCK), m1);
    m2 = _mm512_max_ps(_mm512_loadu_ps(x + i + 2 * BLOCK), m2);
    m3 = _mm512_max_ps(_mm512_loadu_ps(x + i + 3 * BLOCK), m3);
  }
  for (; i < n; i += BLOCK)
    m0 = _mm512_max_ps(_mm512_mask_loadu_ps(none, lanes_below(n - i), x + i), m0);
  return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
}

int64_t armllm_avx512_sample_argmax(const float *x, int64_t n) {
  return armllm_argmax_by_spans(x, n, span_max, first_equal);
}

int64_t armllm_avx512_sample_find_above(const float *x, int64_t n, float t) {
  const __m512 tv = _mm512_set1_ps(t);
  int64_t i = 0;
  for (; i + 4 * BLOCK <= n; i += 4 * BLOCK) {
    const uint64_t m0 = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), tv, _CMP_GT_OQ);
    const uint64_t m1 = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i + 16), tv, _CMP_GT_OQ);
    const uint64_t m2 = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i + 32), tv, _CMP_GT_OQ);
    const uint64_t m3 = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i + 48), tv, _CMP_GT_OQ);
    const uint64_t any = m0 | m1 << 16 | m2 << 32 | m3 << 48;
    if (any) return i + __builtin_ctzll(any);
  }
  for (; i < n; i += BLOCK) {
    const __mmask16 lanes = lanes_below(n - i);
    const __mmask16 m = _mm512_mask_cmp_ps_mask(lanes, _mm512_maskz_loadu_ps(lanes, x + i), tv,
                                                _CMP_GT_OQ);
    if (m) return i + __builtin_ctz(m);
  }
  return n;
}

/* v where v >= the floor, else 0; floor_on 0: v (e >= 0 without NaN, the exp
 * pass's with a floor of 0 or below, keeps every lane as it is) */
static inline __attribute__((always_inline)) __m512 floored(__m512 v, __m512 floor_v,
                                                      int floor_on) {
  if (!floor_on) return v;
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, floor_v, _CMP_GE_OQ), v);
}

/* One block's tree in one register: (j, j+8), then (j, j+4), (j, j+2), (0, 1). */
static inline float block_tree(__m512 w) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(w), _mm512_extractf32x8_ps(w, 1));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/* The trees of 16 whole blocks at e, in block order. Level 1 pairs the
 * quarters 0|2 and 1|3 of two blocks, level 2 the quarters 0|1 of each
 * block's s8 for four blocks, level 3 lanes 0|2 and 1|3 of each quarter's s4
 * (eight blocks), level 4 the lanes 0|1 of each s2; a permute puts the
 * blocks back in order. */
static inline __attribute__((always_inline)) __m512 sixteen_trees(const float *e, __m512 floor_v,
                                                          int floor_on) {
  __m512 l1[8], l2[4], l3[2];
  for (int i = 0; i < 8; i++) {
    const __m512 a = floored(_mm512_loadu_ps(e + 32 * i), floor_v, floor_on);
    const __m512 b = floored(_mm512_loadu_ps(e + 32 * i + 16), floor_v, floor_on);
    l1[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                          _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  for (int i = 0; i < 4; i++)
    l2[i] = _mm512_add_ps(_mm512_shuffle_f32x4(l1[2 * i], l1[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_f32x4(l1[2 * i], l1[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int i = 0; i < 2; i++) /* quarter q: blocks q and 4 + q (then 8 + q and 12 + q) */
    l3[i] = _mm512_add_ps(_mm512_shuffle_ps(l2[2 * i], l2[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                          _mm512_shuffle_ps(l2[2 * i], l2[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  /* lane 4q + k holds block q + 4k */
  const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(l3[0], l3[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(l3[0], l3[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, s);
}

/* The block sums of e[0..n) (n a multiple of 16 except at the row's end) into
 * sums, added to total in block order. */
static inline __attribute__((always_inline)) double add_block_sums(
    const float *e, int64_t n, __m512 floor_v, int floor_on, float *sums, double total) {
  int64_t i = 0, b = 0;
  for (; i + BLOCK * BLOCK <= n; i += BLOCK * BLOCK, b += BLOCK) {
    _mm512_storeu_ps(sums + b, sixteen_trees(e + i, floor_v, floor_on));
    for (int j = 0; j < BLOCK; j++) total += sums[b + j];
  }
  for (; i < n; i += BLOCK, b++) {
    sums[b] = block_tree(floored(_mm512_maskz_loadu_ps(lanes_below(n - i), e + i), floor_v, floor_on));
    total += sums[b];
  }
  return total;
}

double armllm_avx512_sample_block_sums(const float *e, int64_t n, float keep_min, float *sums) {
  return add_block_sums(e, n, _mm512_set1_ps(keep_min), 1, sums, 0.0);
}

static inline __m512 e_of(__m512 x, __m512 m_v, __m512 inv_t_v, __m512 d_min) {
  const __m512 d = _mm512_mul_ps(_mm512_sub_ps(x, m_v), inv_t_v);
  return armllm_exp_nonpositive_avx512(_mm512_cmp_ps_mask(d, d_min, _CMP_GE_OQ), d);
}

double armllm_avx512_sample_exp(const float *x, float *e, int64_t n, float m, float inv_t,
                                float keep_min, float *sums) {
  const __m512 m_v = _mm512_set1_ps(m), inv_t_v = _mm512_set1_ps(inv_t);
  const __m512 d_min = _mm512_set1_ps(ARMLLM_SAMPLE_D_MIN), floor_v = _mm512_set1_ps(keep_min);
  double total = 0.0;
  for (int64_t c = 0; c < n; c += CHUNK) {
    const int64_t end = c + CHUNK < n ? c + CHUNK : n;
    int64_t i = c;
    for (; i + 2 * BLOCK <= end; i += 2 * BLOCK) { /* two chains */
      const __m512 a = e_of(_mm512_loadu_ps(x + i), m_v, inv_t_v, d_min);
      const __m512 b = e_of(_mm512_loadu_ps(x + i + BLOCK), m_v, inv_t_v, d_min);
      _mm512_storeu_ps(e + i, a);
      _mm512_storeu_ps(e + i + BLOCK, b);
    }
    for (; i < end; i += BLOCK) {
      const __mmask16 lanes = lanes_below(end - i);
      const __m512 a = e_of(_mm512_maskz_loadu_ps(lanes, x + i), m_v, inv_t_v, d_min);
      _mm512_mask_storeu_ps(e + i, lanes, a);
    }
    /* exp's e are >= 0 and never NaN: a floor of 0 or below keeps them all */
    total = keep_min > 0.0f
                ? add_block_sums(e + c, end - c, floor_v, 1, sums + c / BLOCK, total)
                : add_block_sums(e + c, end - c, floor_v, 0, sums + c / BLOCK, total);
  }
  return total;
}

int64_t armllm_avx512_sample_collect(const float *e, const int32_t *ids, int64_t n,
                                     float keep_min, float *out_e, int32_t *out_id) {
  /* compress in registers, then whole-register stores (the slack takes the
   * lanes past the count; in place they land on entries already read); no
   * branch on the mask: whether a group holds any is a coin toss in a flat row */
  const __m512 floor_v = _mm512_set1_ps(keep_min), zero = _mm512_setzero_ps();
  const __m512i step = _mm512_set1_epi32(BLOCK);
  __m512i at = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int64_t count = 0;
  for (int64_t i = 0; i < n; i += BLOCK, at = _mm512_add_epi32(at, step)) {
    const __mmask16 lanes = lanes_below(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(lanes, e + i);
    const __mmask16 keep = _mm512_mask_cmp_ps_mask(lanes, v, floor_v, _CMP_GE_OQ) &
                           _mm512_cmp_ps_mask(v, zero, _CMP_GT_OQ);
    const __m512i id = ids ? _mm512_maskz_loadu_epi32(lanes, ids + i) : at;
    _mm512_storeu_ps(out_e + count, _mm512_maskz_compress_ps(keep, v));
    _mm512_storeu_si512(out_id + count, _mm512_maskz_compress_epi32(keep, id));
    count += __builtin_popcount(keep);
  }
  return count;
}
