/* avx2/sample.c: the sampler's vectorizable passes (armllm_kernels.h) on
 * 8-lane registers, with ref's bits: the shared exp (vexp_avx2.h, as it is on
 * [-80, 0]), and the block tree computed for 8 blocks at once (two registers
 * a block), one level per shuffle-and-add, each level adding exactly the
 * lanes the definition pairs. */
#include <math.h>

#include "../armllm_kernels.h"
#include "../sample_argmax.h"
#include "vexp_avx2.h"

#define BLOCK ARMLLM_SAMPLE_BLOCK
/* e is summed a chunk at a time, right after its exp: the in-order double
 * additions of one chunk's sums overlap the next chunk's exp */
#define CHUNK (ARMLLM_SAMPLE_BLOCK * ARMLLM_SAMPLE_BLOCK)

/* Lanes of the 8 from i that lie below n (all, a tail, or none). */
static inline __m256i lanes_below(int64_t left) {
  if (left >= 8) return _mm256_set1_epi32(-1);
  return left <= 0 ? _mm256_setzero_si256() : armllm_avx2_tail_mask(left);
}

/* 8 values of x from i (-inf past n) */
static inline __m256 load_or_none(const float *x, int64_t left) {
  if (left >= 8) return _mm256_loadu_ps(x);
  const __m256i lanes = lanes_below(left);
  return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(x, lanes),
                          _mm256_castsi256_ps(lanes));
}

/* The first x[j] == v in x[0..n), or -1. */
static int64_t first_equal(const float *x, int64_t n, float v) {
  const __m256 vv = _mm256_set1_ps(v);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), vv, _CMP_EQ_OQ));
    if (eq) return i + __builtin_ctz((unsigned)eq);
  }
  for (; i < n; i++)
    if (x[i] == v) return i;
  return -1;
}

/* The largest value of x[0..n) that is not NaN (-inf if none): four chains of
 * max(x, acc), which keeps acc for a NaN x. */
static float span_max(const float *x, int64_t n) {
  const __m256 none = _mm256_set1_ps(-INFINITY);
  __m256 m0 = none, m1 = none, m2 = none, m3 = none;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
    m1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), m1);
    m2 = _mm256_max_ps(_mm256_loadu_ps(x + i + 16), m2);
    m3 = _mm256_max_ps(_mm256_loadu_ps(x + i + 24), m3);
  }
  for (; i < n; i += 8) m0 = _mm256_max_ps(load_or_none(x + i, n - i), m0);
  float lanes[8];
  _mm256_storeu_ps(lanes, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
  float m = lanes[0];
  for (int l = 1; l < 8; l++) m = lanes[l] > m ? lanes[l] : m;
  return m;
}

int64_t armllm_avx2_sample_argmax(const float *x, int64_t n) {
  return armllm_argmax_by_spans(x, n, span_max, first_equal);
}

int64_t armllm_avx2_sample_find_above(const float *x, int64_t n, float t) {
  const __m256 tv = _mm256_set1_ps(t);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const uint32_t m0 = (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), tv,
                                                                   _CMP_GT_OQ));
    const uint32_t m1 = (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i + 8), tv,
                                                                   _CMP_GT_OQ));
    const uint32_t m2 = (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i + 16),
                                                                   tv, _CMP_GT_OQ));
    const uint32_t m3 = (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i + 24),
                                                                   tv, _CMP_GT_OQ));
    const uint32_t any = m0 | m1 << 8 | m2 << 16 | m3 << 24;
    if (any) return i + __builtin_ctz(any);
  }
  for (; i < n; i += 8) { /* -inf past n is never above */
    const uint32_t m = (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(load_or_none(x + i, n - i), tv,
                                                                  _CMP_GT_OQ));
    if (m) return i + __builtin_ctz(m);
  }
  return n;
}

/* v where v >= the floor, else 0; floor_on 0: v (e >= 0 without NaN, the exp
 * pass's with a floor of 0 or below, keeps every lane as it is) */
static inline __attribute__((always_inline)) __m256 floored(__m256 v, __m256 floor_v,
                                                      int floor_on) {
  if (!floor_on) return v;
  return _mm256_and_ps(v, _mm256_cmp_ps(v, floor_v, _CMP_GE_OQ));
}

/* One block's tree over lo (lanes 0..7) and hi (8..15): (j, j+8), then
 * (j, j+4), (j, j+2), (0, 1). */
static inline float block_tree(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/* The trees of 8 whole blocks at e, in block order. Level 1 adds a block's
 * two registers, level 2 the halves of two blocks' s8, level 3 lanes 0|2 and
 * 1|3 of each half's s4 (four blocks), level 4 lanes 0|1 of each s2; a permute
 * puts the blocks back in order. */
static inline __attribute__((always_inline)) __m256 eight_trees(const float *e, __m256 floor_v,
                                                          int floor_on) {
  __m256 s8[8], s4[4], s2[2];
  for (int b = 0; b < 8; b++)
    s8[b] = _mm256_add_ps(floored(_mm256_loadu_ps(e + BLOCK * b), floor_v, floor_on),
                          floored(_mm256_loadu_ps(e + BLOCK * b + 8), floor_v, floor_on));
  for (int i = 0; i < 4; i++) /* half h: block 2i + h */
    s4[i] = _mm256_add_ps(_mm256_permute2f128_ps(s8[2 * i], s8[2 * i + 1], 0x20),
                          _mm256_permute2f128_ps(s8[2 * i], s8[2 * i + 1], 0x31));
  for (int i = 0; i < 2; i++) /* half h: blocks 4i + h, 4i + 2 + h */
    s2[i] = _mm256_add_ps(_mm256_shuffle_ps(s4[2 * i], s4[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                          _mm256_shuffle_ps(s4[2 * i], s4[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  /* half h: blocks h, 2 + h, 4 + h, 6 + h */
  const __m256 s = _mm256_add_ps(_mm256_shuffle_ps(s2[0], s2[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm256_shuffle_ps(s2[0], s2[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm256_permutevar8x32_ps(s, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The block sums of e[0..n) (n a multiple of 16 except at the row's end) into
 * sums, added to total in block order. */
static inline __attribute__((always_inline)) double add_block_sums(
    const float *e, int64_t n, __m256 floor_v, int floor_on, float *sums, double total) {
  int64_t i = 0, b = 0;
  for (; i + 8 * BLOCK <= n; i += 8 * BLOCK, b += 8) {
    _mm256_storeu_ps(sums + b, eight_trees(e + i, floor_v, floor_on));
    for (int j = 0; j < 8; j++) total += sums[b + j];
  }
  for (; i < n; i += BLOCK, b++) { /* zeros past n */
    const __m256 lo = _mm256_maskload_ps(e + i, lanes_below(n - i));
    const __m256 hi = _mm256_maskload_ps(e + i + 8, lanes_below(n - i - 8));
    sums[b] = block_tree(floored(lo, floor_v, floor_on), floored(hi, floor_v, floor_on));
    total += sums[b];
  }
  return total;
}

double armllm_avx2_sample_block_sums(const float *e, int64_t n, float keep_min, float *sums) {
  return add_block_sums(e, n, _mm256_set1_ps(keep_min), 1, sums, 0.0);
}

static inline __m256 e_of(__m256 x, __m256 m_v, __m256 inv_t_v, __m256 d_min) {
  const __m256 d = _mm256_mul_ps(_mm256_sub_ps(x, m_v), inv_t_v);
  return _mm256_and_ps(armllm_exp_nonpositive_avx2(d), _mm256_cmp_ps(d, d_min, _CMP_GE_OQ));
}

double armllm_avx2_sample_exp(const float *x, float *e, int64_t n, float m, float inv_t,
                              float keep_min, float *sums) {
  const __m256 m_v = _mm256_set1_ps(m), inv_t_v = _mm256_set1_ps(inv_t);
  const __m256 d_min = _mm256_set1_ps(ARMLLM_SAMPLE_D_MIN), floor_v = _mm256_set1_ps(keep_min);
  double total = 0.0;
  for (int64_t c = 0; c < n; c += CHUNK) {
    const int64_t end = c + CHUNK < n ? c + CHUNK : n;
    int64_t i = c;
    for (; i + 16 <= end; i += 16) { /* two chains */
      const __m256 a = e_of(_mm256_loadu_ps(x + i), m_v, inv_t_v, d_min);
      const __m256 b = e_of(_mm256_loadu_ps(x + i + 8), m_v, inv_t_v, d_min);
      _mm256_storeu_ps(e + i, a);
      _mm256_storeu_ps(e + i + 8, b);
    }
    for (; i < end; i += 8) {
      const __m256i lanes = lanes_below(end - i);
      const __m256 a = e_of(_mm256_maskload_ps(x + i, lanes), m_v, inv_t_v, d_min);
      _mm256_maskstore_ps(e + i, lanes, a);
    }
    /* exp's e are >= 0 and never NaN: a floor of 0 or below keeps them all */
    total = keep_min > 0.0f
                ? add_block_sums(e + c, end - c, floor_v, 1, sums + c / BLOCK, total)
                : add_block_sums(e + c, end - c, floor_v, 0, sums + c / BLOCK, total);
  }
  return total;
}

int64_t armllm_avx2_sample_collect(const float *e, const int32_t *ids, int64_t n,
                                   float keep_min, float *out_e, int32_t *out_id) {
  /* a vector test skips the groups with nothing to take; the others go lane
   * by lane */
  const __m256 floor_v = _mm256_set1_ps(keep_min), zero = _mm256_setzero_ps();
  int64_t count = 0;
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_maskload_ps(e + i, lanes_below(n - i)); /* zeros past n */
    uint32_t keep = (uint32_t)_mm256_movemask_ps(_mm256_and_ps(
        _mm256_cmp_ps(v, floor_v, _CMP_GE_OQ), _mm256_cmp_ps(v, zero, _CMP_GT_OQ)));
    for (; keep; keep &= keep - 1) {
      const int64_t at = i + __builtin_ctz(keep);
      out_e[count] = e[at];
      out_id[count++] = ids ? ids[at] : (int32_t)at;
    }
  }
  return count;
}
