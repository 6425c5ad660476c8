/* ref/embed.c: portable embedding row gather from f32 and bf16 tables. */
#include "../armllm_kernels.h"
#include "../family_jobs.h"

int64_t armllm_ref_embed_f32(armllm_pool *pool, const int32_t *ids, int64_t t,
                             const float *table, int64_t vocab, int64_t d, float *out,
                             int64_t ldo) {
  (void)pool; /* a gather of T rows is memory-bound and short: one thread */
  int64_t bad = armllm_first_out_of_range(ids, t, vocab);
  if (bad >= 0) return bad;
  for (int64_t i = 0; i < t; i++)
    memcpy(out + i * ldo, table + (int64_t)ids[i] * d, (size_t)d * sizeof *table);
  return -1;
}

int64_t armllm_ref_embed_bf16(armllm_pool *pool, const int32_t *ids, int64_t t,
                              const uint16_t *table, int64_t vocab, int64_t d, float *out,
                              int64_t ldo) {
  (void)pool;
  int64_t bad = armllm_first_out_of_range(ids, t, vocab);
  if (bad >= 0) return bad;
  for (int64_t i = 0; i < t; i++) {
    const uint16_t *row = table + (int64_t)ids[i] * d;
    float *o = out + i * ldo;
    for (int64_t j = 0; j < d; j++) o[j] = armllm_bf16_to_f32(row[j]);
  }
  return -1;
}
