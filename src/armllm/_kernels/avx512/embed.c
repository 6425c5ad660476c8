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

static inline void widen_row(const uint16_t *row, float *o, int64_t d) {
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

static void embed_bf16_rows(void *ctx, int64_t t0, int64_t t1) {
  armllm_embed_bf16_rows(ctx, t0, t1, widen_row);
}

int64_t armllm_avx512_embed_bf16(armllm_pool *pool, const int32_t *ids, int64_t t,
                                 const uint16_t *table, int64_t vocab, int64_t d, float *out,
                                 int64_t ldo) {
  /* each chunk moves a few hundred KiB; small gathers (decode) stay on the caller */
  return armllm_embed_run(pool, ids, t, table, vocab, d, out, ldo, (int64_t)1 << 18,
                          embed_bf16_rows);
}
