/* neon/embed.c: embedding row gather from f32 (memcpy) and bf16 tables
 * (widened with ZIP1/ZIP2 against zero: the bf16 bits land in the high half
 * of each f32 lane). Rows are split across the pool for long prompts. */
#include <arm_neon.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"

static void embed_f32_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_embed_job *job = ctx;
  const float *table = job->table;
  for (int64_t i = t0; i < t1; i++)
    memcpy(job->out + i * job->ldo, table + (int64_t)job->ids[i] * job->d,
           (size_t)job->d * sizeof(float));
}

static void embed_bf16_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_embed_job *job = ctx;
  const uint16_t *table = job->table;
  const int64_t d = job->d;
  const uint16x8_t zero = vdupq_n_u16(0);
  for (int64_t i = t0; i < t1; i++) {
    const uint16_t *row = table + (int64_t)job->ids[i] * d;
    float *o = job->out + i * job->ldo;
    int64_t j = 0;
    for (; j + 16 <= d; j += 16) {
      uint16x8_t a = vld1q_u16(row + j), b = vld1q_u16(row + j + 8);
      vst1q_f32(o + j, vreinterpretq_f32_u16(vzip1q_u16(zero, a)));
      vst1q_f32(o + j + 4, vreinterpretq_f32_u16(vzip2q_u16(zero, a)));
      vst1q_f32(o + j + 8, vreinterpretq_f32_u16(vzip1q_u16(zero, b)));
      vst1q_f32(o + j + 12, vreinterpretq_f32_u16(vzip2q_u16(zero, b)));
    }
    for (; j < d; j++) o[j] = armllm_bf16_to_f32(row[j]);
  }
}

static int64_t embed_run(armllm_pool *pool, const int32_t *ids, int64_t t, const void *table,
                         int64_t vocab, int64_t d, float *out, int64_t ldo, armllm_task_fn fn) {
  int64_t bad = armllm_first_out_of_range(ids, t, vocab);
  if (bad >= 0) return bad;
  armllm_embed_job job = {ids, table, d, out, ldo};
  int64_t min_rows = (65536 + d - 1) / d; /* a thread per >= 256 KB written */
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, min_rows), fn, &job);
  return -1;
}

int64_t armllm_neon_embed_f32(armllm_pool *pool, const int32_t *ids, int64_t t,
                              const float *table, int64_t vocab, int64_t d, float *out,
                              int64_t ldo) {
  return embed_run(pool, ids, t, table, vocab, d, out, ldo, embed_f32_rows);
}

int64_t armllm_neon_embed_bf16(armllm_pool *pool, const int32_t *ids, int64_t t,
                               const uint16_t *table, int64_t vocab, int64_t d, float *out,
                               int64_t ldo) {
  return embed_run(pool, ids, t, table, vocab, d, out, ldo, embed_bf16_rows);
}
