/* attn_common.h: what every attention variant shares: the metadata check,
 * the key range of a query row, cache addressing, and the merge of
 * per-partition softmax partials (see armllm_kernels.h). */
#ifndef ARMLLM_ATTN_COMMON_H
#define ARMLLM_ATTN_COMMON_H

#include <math.h>
#include <string.h>

#include "armllm_kernels.h"
#include "vexp.h"

/* -1, or the first sequence whose metadata is inconsistent. */
static inline int64_t armllm_attn_check(const armllm_attn_args *a) {
  if (a->query_start[0] != 0) return 0;
  if (a->bidirectional && a->sliding_window > 0) return 0; /* no window without a causal order */
  for (int64_t b = 0; b < a->n_seqs; b++) {
    const int64_t q_len = a->query_start[b + 1] - a->query_start[b];
    const int64_t seq_len = a->seq_lens[b];
    /* bidirectional rows need a key, not a position: q_len may pass seq_len */
    if (q_len < 0 || (a->bidirectional ? q_len > 0 && seq_len < 1 : q_len > seq_len)) return b;
    const int64_t blocks = (seq_len + a->block_size - 1) / a->block_size;
    if (blocks > a->max_blocks) return b;
    for (int64_t i = 0; i < blocks; i++) {
      const int32_t id = a->block_table[b * a->max_blocks + i];
      if (id < 0 || id >= a->num_blocks) return b;
    }
  }
  return -1;
}

/* The sequence owning query row `row` (binary search over query_start). */
static inline int64_t armllm_attn_seq_of_row(const armllm_attn_args *a, int64_t row) {
  int64_t lo = 0, hi = a->n_seqs - 1;
  while (lo < hi) {
    int64_t mid = (lo + hi + 1) / 2;
    if (a->query_start[mid] <= row) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/* The last key query row `row` of sequence b sees (causal: its position;
 * bidirectional: the sequence's last), and the first. Every variant takes a
 * row's keys [lo, pos] from these two alone. */
static inline int64_t armllm_attn_pos(const armllm_attn_args *a, int64_t b, int64_t row) {
  if (a->bidirectional) return a->seq_lens[b] - 1;
  const int64_t q_len = a->query_start[b + 1] - a->query_start[b];
  return a->seq_lens[b] - q_len + (row - a->query_start[b]);
}

static inline int64_t armllm_attn_lo(const armllm_attn_args *a, int64_t pos) {
  if (a->sliding_window <= 0 || pos - a->sliding_window + 1 < 0) return 0;
  return pos - a->sliding_window + 1;
}

/* The row index of row `off` of block `block` of KV head `kvh` in a cache
 * (armllm_kernels.h: [n_kv_heads, num_blocks, block_size, head_dim]); its
 * element offset is that times head_dim, its scale's the index itself. One
 * head's rows are a run for consecutive blocks, so decode attention reads a
 * head's keys as one stream. On Zen 4 (2 threads) a plain read of a head's
 * keys ran at 34-36 GB/s and at 17-19 in the 2 KiB runs of the layout
 * before, each block holding every head's rows; bf16 decode attention
 * gained 1.02-1.5x at 4K-32K tokens, most cases 1.16-1.4x, int8 1.1-1.25x
 * (tools/bench_attention.py --tables). */
static inline int64_t armllm_kv_row(int64_t block, int64_t kvh, int64_t off, int64_t num_blocks,
                                    int64_t block_size) {
  return (kvh * num_blocks + block) * block_size + off;
}

/* Element offset of token `tok` of KV head `kvh` of sequence b in a cache. */
static inline int64_t armllm_attn_kv_offset(const armllm_attn_args *a, int64_t b, int64_t kvh,
                                            int64_t tok) {
  const int64_t block = a->block_table[b * a->max_blocks + tok / a->block_size];
  return armllm_kv_row(block, kvh, tok % a->block_size, a->num_blocks, a->block_size) *
         a->head_dim;
}

/* -1, or the first row whose KV slot is outside [-1, n_slots) (-1 skips a row). */
static inline int64_t armllm_attn_first_bad_slot(const int32_t *slot_mapping, int64_t t,
                                                 int64_t n_slots) {
  for (int64_t i = 0; i < t; i++)
    if (slot_mapping[i] < -1 || slot_mapping[i] >= n_slots) return i;
  return -1;
}

/* Bytes of one cache element. */
static inline size_t armllm_kv_esz(int cache_dtype) {
  return cache_dtype == ARMLLM_KV_F32 ? 4 : cache_dtype == ARMLLM_KV_BF16 ? 2 : 1;
}

/* bf16 bits of x >= 0 rounded up (toward +inf; inf and NaN kept): an int8
 * row's scale, so that its largest |element| maps to at most 127. */
static inline uint16_t armllm_bf16_round_up(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) != 0x7f800000u && (u & 0xffffu)) u += 0x10000u;
  return (uint16_t)(u >> 16);
}

/* One int8 cache row and its scale: scale = amax / 127 rounded up to bf16
 * (amax = max |src[d]|, NaN ignored), row[d] = src[d] / scale rounded to
 * nearest even (times the scale's reciprocal), clamped to [-127, 127]
 * (NaN: 0). Scalar and shared, so every variant writes the same bits; a
 * decode writes one row a head, a prefill a few per thousand GEMM flops. */
static inline void armllm_kv_quantize_row(int8_t *dst, uint16_t *scale, const float *src,
                                          int64_t n) {
  float amax = 0.0f;
  for (int64_t d = 0; d < n; d++) {
    const float a = fabsf(src[d]);
    if (a > amax) amax = a;
  }
  *scale = armllm_bf16_round_up(amax / 127.0f);
  const float s = armllm_bf16_to_f32(*scale);
  const float inv = s > 0.0f && s < INFINITY ? 1.0f / s : 0.0f;
  for (int64_t d = 0; d < n; d++) {
    float y = src[d] * inv;
    y = y > 127.0f ? 127.0f : y < -127.0f ? -127.0f : y;
    dst[d] = y == y ? (int8_t)nearbyintf(y) : 0;
  }
}

/* ---- int8 caches: q, K and V meet in integers
 *
 * A query row is quantized as K rows are (armllm_kv_quantize_row: q8 and a
 * bf16 scale qs), and key j's score is
 *   s_j = ((float)dot_j * ks_j) * (qs * scale),  dot_j = sum_d q8[d] k8_j[d]
 * with dot_j an exact int32 (|dot| <= 127^2 * ARMLLM_ATTN_MAX_HEAD_DIM < 2^24,
 * so its float is exact too). A partition's softmax weights w_j = e_j * vs_j
 * (0 for keys the query does not see) are quantized to int16 against their
 * largest (armllm_attn_i8_weights), and
 *   accp[d] = (float)(sum_j w16_j v8_j[d]) * ws
 * with the sum an exact int32 (<= PARTITION * 32767 * 127 < 2^31). Integer
 * sums do not depend on their order, so every variant gets the same dots and
 * the same weighted sums whatever its blocking (VNNI, SDOT, widening
 * multiplies). llama.cpp's q8_0 KV cache takes q to 8 bits alike; the
 * weights' 15 bits keep PV's error (<= 2^-16 of the largest weight a key)
 * well under the cache's own rounding (2^-8 of a row's largest element). */
#define ARMLLM_ATTN_W16_MAX 32767.0f /* int16 weights: [0, 32767] */

/* The factor key scores of an int8 query row take after their K scale. */
static inline float armllm_attn_i8_qfactor(uint16_t q_scale, float scale) {
  return armllm_bf16_to_f32(q_scale) * scale;
}

/* The partition's largest weight of w[0..n) (0 if none is > 0; NaN ignored). */
static inline float armllm_attn_i8_wmax(const float *w, int64_t n) {
  float wmax = 0.0f;
  for (int64_t j = 0; j < n; j++)
    if (w[j] > wmax) wmax = w[j];
  return wmax;
}

/* One weight as int16 given r = ARMLLM_ATTN_W16_MAX / wmax: w * r clamped to
 * [0, 32767] (NaN: 0), rounded to nearest even. */
static inline int16_t armllm_attn_i8_w16(float w, float r) {
  float y = w * r;
  y = y > 0.0f ? y : 0.0f;
  y = y < ARMLLM_ATTN_W16_MAX ? y : ARMLLM_ATTN_W16_MAX;
  return (int16_t)nearbyintf(y);
}

/* w16[0..n) of the weights w[0..n), and the scale ws their int32 sums take
 * (0 when no weight is > 0: then every w16 is 0). */
static inline float armllm_attn_i8_weights(int16_t *w16, const float *w, int64_t n) {
  const float wmax = armllm_attn_i8_wmax(w, n);
  const float r = wmax > 0.0f ? ARMLLM_ATTN_W16_MAX / wmax : 0.0f;
  for (int64_t j = 0; j < n; j++) w16[j] = armllm_attn_i8_w16(w[j], r);
  return wmax / ARMLLM_ATTN_W16_MAX;
}

/* Stores one row of head_dim floats into a cache row (float or bf16 bits). */
typedef void (*armllm_kv_row_store)(void *dst, const float *src, int64_t head_dim);

/* Stores K and V row (ks, vs) of KV head h at `slot` (>= 0) of a cache: f32
 * rows copied, bf16 rows with `store_bf16`, int8 rows quantized with their
 * scales. */
static inline void armllm_kv_store_head(const float *ks, const float *vs, int64_t slot, int64_t h,
                                        void *k_cache, void *v_cache, int cache_dtype,
                                        uint16_t *k_scale, uint16_t *v_scale,
                                        int64_t head_dim, int64_t block_size,
                                        int64_t num_blocks, armllm_kv_row_store store_bf16) {
  const int64_t row = armllm_kv_row(slot / block_size, h, slot % block_size, num_blocks,
                                    block_size);
  const size_t dst = (size_t)(row * head_dim) * armllm_kv_esz(cache_dtype);
  if (cache_dtype == ARMLLM_KV_I8) {
    armllm_kv_quantize_row((int8_t *)k_cache + dst, k_scale + row, ks, head_dim);
    armllm_kv_quantize_row((int8_t *)v_cache + dst, v_scale + row, vs, head_dim);
  } else if (cache_dtype == ARMLLM_KV_BF16) {
    store_bf16((char *)k_cache + dst, ks, head_dim);
    store_bf16((char *)v_cache + dst, vs, head_dim);
  } else {
    memcpy((char *)k_cache + dst, ks, (size_t)head_dim * sizeof *ks);
    memcpy((char *)v_cache + dst, vs, (size_t)head_dim * sizeof *vs);
  }
}

/* The KV write every variant shares: check the slots, then store each head's
 * K and V row (armllm_kv_store_head). */
static inline int64_t armllm_kv_write_rows(const float *k, int64_t ldk, const float *v,
                                           int64_t ldv, const int32_t *slot_mapping, int64_t t,
                                           void *k_cache, void *v_cache, int cache_dtype,
                                           uint16_t *k_scale, uint16_t *v_scale,
                                           int64_t n_kv_heads, int64_t head_dim,
                                           int64_t block_size, int64_t num_blocks,
                                           armllm_kv_row_store store_bf16) {
  const int64_t bad = armllm_attn_first_bad_slot(slot_mapping, t, num_blocks * block_size);
  if (bad >= 0) return bad;
  for (int64_t i = 0; i < t; i++) {
    if (slot_mapping[i] < 0) continue;
    for (int64_t h = 0; h < n_kv_heads; h++)
      armllm_kv_store_head(k + i * ldk + h * head_dim, v + i * ldv + h * head_dim,
                           slot_mapping[i], h, k_cache, v_cache, cache_dtype, k_scale, v_scale,
                           head_dim, block_size, num_blocks, store_bf16);
  }
  return -1;
}

/* Defines `name`, a kv_write kernel (armllm_kernels.h) that writes on the
 * calling thread (T rows of a few KB: memory-bound and short), bf16 rows
 * with `store_bf16`. */
#define ARMLLM_KV_WRITE_ON_CALLER(name, store_bf16)                                              \
  int64_t name(armllm_pool *pool, const float *k, int64_t ldk, const float *v, int64_t ldv,      \
               const int32_t *slot_mapping, int64_t t, void *k_cache, void *v_cache,            \
               int cache_dtype, uint16_t *k_scale, uint16_t *v_scale, int64_t n_kv_heads,       \
               int64_t head_dim, int64_t block_size, int64_t num_blocks) {                       \
    (void)pool;                                                                                  \
    return armllm_kv_write_rows(k, ldk, v, ldv, slot_mapping, t, k_cache, v_cache, cache_dtype,  \
                                k_scale, v_scale, n_kv_heads, head_dim, block_size, num_blocks,  \
                                store_bf16);                                                     \
  }

/* An int8 cache's scale of the row at element offset `elem` (int8 rows:
 * elements are bytes) as a float; 1 for the other dtypes. */
static inline float armllm_kv_row_scale(const armllm_attn_args *a, const uint16_t *scales,
                                        int64_t elem) {
  return a->cache_dtype == ARMLLM_KV_I8 ? armllm_bf16_to_f32(scales[elem / a->head_dim]) : 1.0f;
}

/* The keys of partition p that any of nq queries (key ranges [lo[i], hi[i]))
 * sees: [*k0, *k0 + n), with n returned, and the K/V row addresses of each in
 * kr/vr (element size esz), padded to a multiple of 4 by repeating the last;
 * for int8 caches their scales as floats in ksc/vsc (padded alike; NULL: not
 * wanted). */
static inline int64_t armllm_attn_partition_rows(const armllm_attn_args *a, int64_t b,
                                                 int64_t kvh, int nq, const int64_t *lo,
                                                 const int64_t *hi, int64_t p, size_t esz,
                                                 const void **kr, const void **vr, float *ksc,
                                                 float *vsc, int64_t *k0_out) {
  int64_t k0 = p * ARMLLM_ATTN_PARTITION, k1 = (p + 1) * ARMLLM_ATTN_PARTITION;
  int64_t lmin = lo[0], hmax = hi[0];
  for (int i = 1; i < nq; i++) {
    if (lo[i] < lmin) lmin = lo[i];
    if (hi[i] > hmax) hmax = hi[i];
  }
  if (lmin > k0) k0 = lmin;
  if (hmax < k1) k1 = hmax;
  const int64_t n = k1 - k0, n4 = (n + 3) & ~(int64_t)3;
  int64_t blk = k0 / a->block_size, off = k0 % a->block_size;
  for (int64_t j = 0; j < n; j++) {
    const int64_t id = a->block_table[b * a->max_blocks + blk];
    const int64_t row = armllm_kv_row(id, kvh, off, a->num_blocks, a->block_size);
    const size_t o = (size_t)(row * a->head_dim) * esz;
    kr[j] = (const char *)a->k_cache + o;
    vr[j] = (const char *)a->v_cache + o;
    if (ksc && a->cache_dtype == ARMLLM_KV_I8) {
      ksc[j] = armllm_bf16_to_f32(a->k_scale[row]);
      vsc[j] = armllm_bf16_to_f32(a->v_scale[row]);
    }
    if (++off == a->block_size) off = 0, blk++;
  }
  for (int64_t j = n; j < n4; j++) {
    kr[j] = kr[n - 1], vr[j] = vr[n - 1];
    if (ksc && a->cache_dtype == ARMLLM_KV_I8) ksc[j] = ksc[n - 1], vsc[j] = vsc[n - 1];
  }
  *k0_out = k0;
  return n;
}

/* Zeroes a partition's scores si[0..n4) outside the query's keys [lo, hi)
 * (k0 is the partition's first key) and returns its range in [*a0, *a1);
 * false when the query sees none of these keys. */
static inline int armllm_attn_mask_scores(float *si, int64_t lo, int64_t hi, int64_t k0, int64_t n,
                                          int64_t n4, int64_t *a0, int64_t *a1) {
  *a0 = lo - k0 > 0 ? lo - k0 : 0;
  *a1 = hi - k0 < n ? hi - k0 : n;
  for (int64_t j = 0; j < *a0; j++) si[j] = 0.0f;
  for (int64_t j = *a1 > *a0 ? *a1 : *a0; j < n4; j++) si[j] = 0.0f;
  return *a1 > *a0;
}

/* Running softmax state of one (row, head): (m, l, acc[head_dim]). */
typedef struct {
  float m, l;
  int have;
} armllm_softmax_state;

/* Merges a partition's partial (mp, lp, accp) into the running (st, acc),
 * in partition order: the only place partials meet, so split and unsplit
 * runs agree to the bit. */
static inline void armllm_attn_merge(armllm_softmax_state *st, float *acc, float mp, float lp,
                                     const float *accp, int64_t head_dim) {
  if (!st->have) {
    st->m = mp;
    st->l = lp;
    st->have = 1;
    memcpy(acc, accp, (size_t)head_dim * sizeof *acc);
    return;
  }
  const float mn = st->m > mp ? st->m : mp;
  const float ca = armllm_exp_scalar(st->m - mn), cb = armllm_exp_scalar(mp - mn);
  st->l = st->l * ca + lp * cb;
  st->m = mn;
  for (int64_t d = 0; d < head_dim; d++) acc[d] = acc[d] * ca + accp[d] * cb;
}

/* The softmax denominator of head h's row once every partition is merged:
 * the sum of its weights, plus the sink's exp(sinks[h] - m) (0 past exp's
 * range; a sink far above every score makes it inf and the row 0, its limit). */
static inline float armllm_attn_denominator(const armllm_attn_args *a,
                                            const armllm_softmax_state *st, int64_t h) {
  return a->sinks ? st->l + armllm_exp_scalar(a->sinks[h] - st->m) : st->l;
}

#endif /* ARMLLM_ATTN_COMMON_H */
