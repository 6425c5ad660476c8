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

static void avx2_rope_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_rope_job *job = ctx;
  const int64_t half = job->rot_dim / 2;
  for (int64_t t = t0; t < t1; t++) {
    const float *cs = job->cos_sin + (int64_t)job->positions[t] * job->rot_dim;
    float *row = job->x + t * job->ldx;
    if (job->style == ARMLLM_ROPE_NEOX)
      for (int64_t h = 0; h < job->n_heads; h++) rope_neox_head(row + h * job->head_dim, cs, half);
    else
      for (int64_t h = 0; h < job->n_heads; h++) rope_gptj_head(row + h * job->head_dim, cs, half);
  }
}

int64_t armllm_avx2_rope(armllm_pool *pool, float *x, int64_t t, int64_t n_heads,
                         int64_t head_dim, int64_t ldx, const int32_t *positions,
                         const float *cos_sin, int64_t max_pos, int64_t rot_dim, int style) {
  int64_t bad = armllm_first_out_of_range(positions, t, max_pos);
  if (bad >= 0) return bad;
  armllm_rope_job job = {x, n_heads, head_dim, ldx, positions, cos_sin, rot_dim, style};
  if (t * n_heads * rot_dim < 32768) pool = NULL; /* decode: one row, stay on the caller */
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, 1), avx2_rope_rows, &job);
  return -1;
}
