/* avx2/embed.c: embedding row gather; bf16 rows widened 8 at a time (exact:
 * a 16-bit shift). Large gathers (prefill) are split over rows on the pool. */
#include <immintrin.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"

static void embed_f32_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_embed_job *job = ctx;
  const float *table = job->table;
  for (int64_t i = t0; i < t1; i++)
    memcpy(job->out + i * job->ldo, table + (int64_t)job->ids[i] * job->d,
           (size_t)job->d * sizeof *table);
}

static inline __m256 widen8(const uint16_t *p) {
  __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

static inline void widen_row(const uint16_t *row, float *o, int64_t d) {
  int64_t j = 0;
  for (; j + 16 <= d; j += 16) {
    _mm256_storeu_ps(o + j, widen8(row + j));
    _mm256_storeu_ps(o + j + 8, widen8(row + j + 8));
  }
  for (; j + 8 <= d; j += 8) _mm256_storeu_ps(o + j, widen8(row + j));
  for (; j < d; j++) o[j] = armllm_bf16_to_f32(row[j]);
}

static void embed_bf16_rows(void *ctx, int64_t t0, int64_t t1) {
  armllm_embed_bf16_rows(ctx, t0, t1, widen_row);
}

/* Each chunk moves a few hundred KiB; small gathers (decode) stay on the
 * calling thread. */
#define SERIAL_ELEMS ((int64_t)1 << 18)

int64_t armllm_avx2_embed_f32(armllm_pool *pool, const int32_t *ids, int64_t t,
                              const float *table, int64_t vocab, int64_t d, float *out,
                              int64_t ldo) {
  return armllm_embed_run(pool, ids, t, table, vocab, d, out, ldo, SERIAL_ELEMS, embed_f32_rows);
}

int64_t armllm_avx2_embed_bf16(armllm_pool *pool, const int32_t *ids, int64_t t,
                               const uint16_t *table, int64_t vocab, int64_t d, float *out,
                               int64_t ldo) {
  return armllm_embed_run(pool, ids, t, table, vocab, d, out, ldo, SERIAL_ELEMS, embed_bf16_rows);
}
