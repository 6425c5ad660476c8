/* ref/attn.c: portable paged KV write and varlen paged attention, the
 * reference: one (query row, head) per item, keys one by one; int8 caches
 * in integers (attn_common.h). */
#include <math.h>

#include "../armllm_kernels.h"
#include "../attn_common.h"

static void store_bf16_row(void *dst_bytes, const float *src, int64_t n) {
  uint16_t *dst = dst_bytes;
  for (int64_t d = 0; d < n; d++) dst[d] = armllm_f32_to_bf16(src[d]);
}

ARMLLM_KV_WRITE_ON_CALLER(armllm_ref_kv_write, store_bf16_row)

/* Element i of an f32 or bf16 cache. */
static inline float cache_at(const void *cache, int dtype, int64_t i) {
  if (dtype == ARMLLM_KV_BF16) return armllm_bf16_to_f32(((const uint16_t *)cache)[i]);
  return ((const float *)cache)[i];
}

/* Partition [k0, k1) of one (row, head) of an int8 cache in integers
 * (attn_common.h): q8 and qf its quantized q and score factor; writes *mp,
 * *lp and accp. */
static void ref_partition_i8(const armllm_attn_args *a, int64_t b, int64_t kvh, const int8_t *q8,
                             float qf, int64_t k0, int64_t k1, float *mp, float *lp,
                             float *accp) {
  const int64_t hd = a->head_dim;
  const int8_t *kc = a->k_cache, *vc = a->v_cache;
  float scores[ARMLLM_ATTN_PARTITION], w[ARMLLM_ATTN_PARTITION];
  int16_t w16[ARMLLM_ATTN_PARTITION];
  *mp = -INFINITY;
  for (int64_t j = k0; j < k1; j++) {
    const int64_t off = armllm_attn_kv_offset(a, b, kvh, j);
    int32_t dot = 0;
    for (int64_t d = 0; d < hd; d++) dot += (int32_t)q8[d] * kc[off + d];
    scores[j - k0] = (float)dot * armllm_kv_row_scale(a, a->k_scale, off) * qf;
    if (scores[j - k0] > *mp) *mp = scores[j - k0];
  }
  *lp = 0.0f;
  for (int64_t j = k0; j < k1; j++) {
    const float e = armllm_exp_scalar(scores[j - k0] - *mp);
    const int64_t off = armllm_attn_kv_offset(a, b, kvh, j);
    w[j - k0] = e * armllm_kv_row_scale(a, a->v_scale, off);
    *lp += e;
  }
  const float ws = armllm_attn_i8_weights(w16, w, k1 - k0);
  for (int64_t d = 0; d < hd; d++) {
    int32_t acc = 0;
    for (int64_t j = k0; j < k1; j++)
      acc += (int32_t)w16[j - k0] * vc[armllm_attn_kv_offset(a, b, kvh, j) + d];
    accp[d] = (float)acc * ws;
  }
}

static void ref_attention_items(void *ctx, int64_t i0, int64_t i1) {
  const armllm_attn_args *a = ctx;
  const int64_t hd = a->head_dim, group = a->n_heads / a->n_kv_heads;
  const int i8 = a->cache_dtype == ARMLLM_KV_I8;
  float scores[ARMLLM_ATTN_PARTITION], accp[ARMLLM_ATTN_MAX_HEAD_DIM], acc[ARMLLM_ATTN_MAX_HEAD_DIM];
  int8_t q8[ARMLLM_ATTN_MAX_HEAD_DIM];
  for (int64_t item = i0; item < i1; item++) {
    const int64_t row = item / a->n_heads, h = item % a->n_heads, kvh = h / group;
    const int64_t b = armllm_attn_seq_of_row(a, row);
    const int64_t pos = armllm_attn_pos(a, b, row), lo = armllm_attn_lo(a, pos);
    const float *q = a->q + row * a->ldq + h * hd;
    float qf = 0.0f;
    if (i8) {
      uint16_t qs;
      armllm_kv_quantize_row(q8, &qs, q, hd);
      qf = armllm_attn_i8_qfactor(qs, a->scale);
    }
    armllm_softmax_state st = {0.0f, 0.0f, 0};
    for (int64_t p = lo / ARMLLM_ATTN_PARTITION; p <= pos / ARMLLM_ATTN_PARTITION; p++) {
      const int64_t k0 = p * ARMLLM_ATTN_PARTITION > lo ? p * ARMLLM_ATTN_PARTITION : lo;
      const int64_t k1 = (p + 1) * ARMLLM_ATTN_PARTITION < pos + 1 ? (p + 1) * ARMLLM_ATTN_PARTITION : pos + 1;
      float mp = -INFINITY, lp = 0.0f;
      if (i8) {
        ref_partition_i8(a, b, kvh, q8, qf, k0, k1, &mp, &lp, accp);
        armllm_attn_merge(&st, acc, mp, lp, accp, hd);
        continue;
      }
      for (int64_t j = k0; j < k1; j++) {
        const int64_t off = armllm_attn_kv_offset(a, b, kvh, j);
        float dot = 0.0f;
        for (int64_t d = 0; d < hd; d++)
          dot = fmaf(q[d], cache_at(a->k_cache, a->cache_dtype, off + d), dot);
        scores[j - k0] = dot * a->scale;
        if (scores[j - k0] > mp) mp = scores[j - k0];
      }
      for (int64_t d = 0; d < hd; d++) accp[d] = 0.0f;
      for (int64_t j = k0; j < k1; j++) {
        const float e = armllm_exp_scalar(scores[j - k0] - mp);
        const int64_t off = armllm_attn_kv_offset(a, b, kvh, j);
        lp += e;
        for (int64_t d = 0; d < hd; d++)
          accp[d] = fmaf(e, cache_at(a->v_cache, a->cache_dtype, off + d), accp[d]);
      }
      armllm_attn_merge(&st, acc, mp, lp, accp, hd);
    }
    float *out = a->out + row * a->ldo + h * hd;
    const float l = armllm_attn_denominator(a, &st, h);
    for (int64_t d = 0; d < hd; d++) out[d] = acc[d] / l;
  }
}

int64_t armllm_ref_attention(armllm_pool *pool, const armllm_attn_args *args) {
  const int64_t bad = armllm_attn_check(args);
  if (bad >= 0) return bad;
  const int64_t items = (int64_t)args->query_start[args->n_seqs] * args->n_heads;
  armllm_pool_run(pool, items, armllm_pool_grain(pool, items, 4, 1), ref_attention_items,
                  (void *)args);
  return -1;
}
