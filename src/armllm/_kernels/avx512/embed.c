/* avx512/embed.c: bf16 embedding row gather, rows widened 16 at a time
 * (exact: a 16-bit shift), the tail through a mask. Large gathers (prefill)
 * are split over rows on the pool. (f32 rows are a memcpy: the avx2 slot.) */
#include <immintrin.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"
#include "vexp_avx512.h"

static inline __m512 widen16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static void embed_bf16_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_embed_job *job = ctx;
  const uint16_t *table = job->table;
  const int64_t d = job->d;
  for (int64_t i = t0; i < t1; i++) {
    const uint16_t *row = table + (int64_t)job->ids[i] * d;
    float *o = job->out + i * job->ldo;
    int64_t j = 0;
    for (; j + 32 <= d; j += 32) {
      _mm512_storeu_ps(o + j, widen16(_mm256_loadu_si256((const __m256i *)(row + j))));
      _mm512_storeu_ps(o + j + 16, widen16(_mm256_loadu_si256((const __m256i *)(row + j + 16))));
    }
    for (; j + 16 <= d; j += 16)
      _mm512_storeu_ps(o + j, widen16(_mm256_loadu_si256((const __m256i *)(row + j))));
    if (j < d) {
      const __mmask16 m = armllm_avx512_tail16(d - j);
      _mm512_mask_storeu_ps(o + j, m, widen16(_mm256_maskz_loadu_epi16(m, row + j)));
    }
  }
}

int64_t armllm_avx512_embed_bf16(armllm_pool *pool, const int32_t *ids, int64_t t,
                                 const uint16_t *table, int64_t vocab, int64_t d, float *out,
                                 int64_t ldo) {
  int64_t bad = armllm_first_out_of_range(ids, t, vocab);
  if (bad >= 0) return bad;
  armllm_embed_job job = {ids, table, d, out, ldo};
  /* each chunk moves a few hundred KiB; small gathers (decode) stay on the caller */
  if (t * d < (int64_t)1 << 18) pool = NULL;
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, 1), embed_bf16_rows, &job);
  return -1;
}
