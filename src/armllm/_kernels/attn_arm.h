/* attn_arm.h: the attention driver every Arm variant runs (attn_arm.c) and
 * what it asks of a variant: one per-partition kernel.
 *
 * Work item = (tile of query rows of one sequence, KV head, chunk of that KV
 * head's query heads): the tile's nq = rows * heads query vectors (<=
 * ARMLLM_ATTN_QMAX) share every K/V row loaded. Per partition of
 * ARMLLM_ATTN_PARTITION absolute key positions the variant's partial kernel
 * computes, for all nq vectors, the partition's softmax partial
 *   m = max S, l = sum E, acc = E V   (S = scale * Q K^T, E = exp(S - m),
 *                                      keys outside a vector's [lo, pos]
 *                                      weighing 0),
 * and the driver merges partitions in order with armllm_attn_merge.
 *
 * Split-KV: when the tiles are fewer than 2x the threads and scratch is
 * large enough, items become (tile, KV head, chunk, partition) writing
 * (m, l, acc) to scratch, and a second pass merges them per (row, head) in
 * partition order. Both paths run the same partial kernel on the same
 * tiles (tiles depend only on the metadata), so they return the same bits. */
#ifndef ARMLLM_ATTN_ARM_H
#define ARMLLM_ATTN_ARM_H

#include <arm_neon.h>
#include <math.h>

#include "armllm_kernels.h"
#include "attn_common.h"

#define ARMLLM_ATTN_QMAX 16 /* query vectors per tile */

/* Int8 caches: a tile's query vectors quantized as K rows are
 * (armllm_attn_quantize_q: armllm_kv_quantize_row's bits, as ref), each row zero-padded past head_dim to
 * a multiple of 16 bytes (whole vector loads), and each's score factor
 * armllm_attn_i8_qfactor. The driver quantizes once per tile, not per
 * partition. */
typedef struct {
  int8_t q[ARMLLM_ATTN_QMAX][ARMLLM_ATTN_MAX_HEAD_DIM] __attribute__((aligned(16)));
  float qf[ARMLLM_ATTN_QMAX];
} armllm_attn_q8;

/* One query row as armllm_kv_quantize_row quantizes a K row, with the
 * same bits, 8 elements a step: FMAXNM skips NaN as its `>` does, FMAX and
 * FMIN keep NaN and FCVTNS takes it to 0, rounding to nearest even as
 * nearbyintf; the scale is the shared scalar code. */
static inline void armllm_attn_quantize_q(int8_t *dst, uint16_t *scale, const float *src,
                                          int64_t n) {
  float32x4_t vmax = vdupq_n_f32(0.0f);
  int64_t d = 0;
  for (; d + 4 <= n; d += 4) vmax = vmaxnmq_f32(vmax, vabsq_f32(vld1q_f32(src + d)));
  float amax = vmaxnmvq_f32(vmax);
  for (; d < n; d++) {
    const float a = fabsf(src[d]);
    if (a > amax) amax = a;
  }
  *scale = armllm_bf16_round_up(amax / 127.0f);
  const float s = armllm_bf16_to_f32(*scale);
  const float inv = s > 0.0f && s < INFINITY ? 1.0f / s : 0.0f;
  const float32x4_t lo = vdupq_n_f32(-127.0f), hi = vdupq_n_f32(127.0f);
  for (d = 0; d + 8 <= n; d += 8) {
    const float32x4_t y0 = vminq_f32(vmaxq_f32(vmulq_n_f32(vld1q_f32(src + d), inv), lo), hi);
    const float32x4_t y1 = vminq_f32(vmaxq_f32(vmulq_n_f32(vld1q_f32(src + d + 4), inv), lo), hi);
    const int16x8_t h = vcombine_s16(vmovn_s32(vcvtnq_s32_f32(y0)), vmovn_s32(vcvtnq_s32_f32(y1)));
    vst1_s8(dst + d, vmovn_s16(h));
  }
  for (; d < n; d++) { /* as armllm_kv_quantize_row */
    float y = src[d] * inv;
    y = y > 127.0f ? 127.0f : y < -127.0f ? -127.0f : y;
    dst[d] = y == y ? (int8_t)nearbyintf(y) : 0;
  }
}

/* Partition p of a tile of sequence b, KV head kvh: nq query vectors q[i]
 * (int8 caches: also q8, else NULL) seeing keys [lo[i], hi[i]); writes
 * m[i], l[i] and accp[i * head_dim ..] (m = -inf for a vector that sees
 * none of the partition's keys). */
typedef void (*armllm_attn_partial_fn)(const armllm_attn_args *a, int64_t b, int64_t kvh, int nq,
                                       const float *const *q, const armllm_attn_q8 *q8,
                                       const int64_t *lo, const int64_t *hi, int64_t p, float *m,
                                       float *l, float *accp);

/* Defines `name`, a partial kernel that runs the always-inline template
 * `impl` (the partial kernel's arguments, then `arg`, a constant in each
 * instance: the cache's armllm_kv_dtype, or a variant's own). */
#define ARMLLM_ATTN_PARTIAL(name, impl, arg)                                                    \
  static void name(const armllm_attn_args *a, int64_t b, int64_t kvh, int nq,                   \
                   const float *const *q, const armllm_attn_q8 *q8, const int64_t *lo,          \
                   const int64_t *hi, int64_t p, float *m, float *l, float *accp) {             \
    impl(a, b, kvh, nq, q, q8, lo, hi, p, m, l, accp, arg);                                     \
  }

/* The keys of one partition as a partial kernel reads them (on its own
 * stack: addressed from sp, its loops keep their registers): [k0, k0 + n),
 * the K/V row of each (element size esz), padded to n4, a multiple of 4, by
 * repeating the last. */
typedef struct {
  const void *kr[ARMLLM_ATTN_PARTITION], *vr[ARMLLM_ATTN_PARTITION];
  float ksc[ARMLLM_ATTN_PARTITION], vsc[ARMLLM_ATTN_PARTITION]; /* int8 caches: row scales */
  int64_t k0, n, n4;
} armllm_attn_keys;

static inline __attribute__((always_inline)) void armllm_attn_keys_of(
    armllm_attn_keys *keys, const armllm_attn_args *a, int64_t b, int64_t kvh, int nq,
    const int64_t *lo, const int64_t *hi, int64_t p, size_t esz) {
  keys->n = armllm_attn_partition_rows(a, b, kvh, nq, lo, hi, p, esz, keys->kr, keys->vr,
                                       keys->ksc, keys->vsc, &keys->k0);
  keys->n4 = (keys->n + 3) & ~(int64_t)3;
}

/* A variant's softmax numerators of one query's scores si[a0, a1) (a1 >
 * a0), in place: returns m = their max, si[j] = exp(si[j] - m), and with
 * sum, *sum = the sum of those. */
typedef float (*armllm_softmax_row_fn)(float *si, int64_t a0, int64_t a1, float *sum);

/* A partition's nq score rows s[i] (stride ARMLLM_ATTN_PARTITION; n keys
 * from k0, zero-padded to a multiple of 4) to softmax numerators: keys
 * outside query i's [lo[i], hi[i]) weigh 0; m[i], and with l the sums
 * l[i], from `row`; a query that sees none of the keys gets m = -inf (and
 * l = 0), so that the merge skips it. */
static inline __attribute__((always_inline)) void armllm_attn_softmax(
    float *s, int nq, const int64_t *lo, const int64_t *hi, int64_t k0, int64_t n, float *m,
    float *l, armllm_softmax_row_fn row) {
  const int64_t n4 = (n + 3) & ~(int64_t)3;
  for (int i = 0; i < nq; i++) {
    float *si = s + i * ARMLLM_ATTN_PARTITION;
    int64_t a0, a1;
    if (!armllm_attn_mask_scores(si, lo[i], hi[i], k0, n, n4, &a0, &a1)) {
      m[i] = -INFINITY;
      if (l) l[i] = 0.0f;
      continue;
    }
    m[i] = row(si, a0, a1, l ? &l[i] : NULL);
  }
}

/* Int8 caches: a partition's softmax numerators s[i][0, n4) (nq rows of
 * stride ARMLLM_ATTN_PARTITION, zero outside each query's keys) to the
 * int16 PV weights of armllm_attn_i8_weights, w = e * vsc[j] (the V rows'
 * scales, keys.vsc) against the row's largest: w16 rows of the same
 * stride, and ws[i]. The same bits as the scalar helpers: FMAXNM skips NaN
 * as their `>` does (from 0: a row of zeros gives wmax 0), FMAX/FMIN keep
 * NaN and FCVTNS takes it to 0, rounding to nearest even as nearbyintf.
 * n4 is a multiple of 4. */
static inline void armllm_attn_i8_w16_rows(const float *s, int nq, const float *vsc, int64_t n4,
                                           int16_t *w16, float *ws) {
  for (int i = 0; i < nq; i++) {
    const float *si = s + i * ARMLLM_ATTN_PARTITION;
    int16_t *wi = w16 + i * ARMLLM_ATTN_PARTITION;
    float32x4_t vmax = vdupq_n_f32(0.0f);
    for (int64_t j = 0; j < n4; j += 4)
      vmax = vmaxnmq_f32(vmax, vmulq_f32(vld1q_f32(si + j), vld1q_f32(vsc + j)));
    const float wmax = vmaxnmvq_f32(vmax);
    const float32x4_t r = vdupq_n_f32(wmax > 0.0f ? ARMLLM_ATTN_W16_MAX / wmax : 0.0f);
    for (int64_t j = 0; j < n4; j += 4) {
      float32x4_t y = vmulq_f32(vmulq_f32(vld1q_f32(si + j), vld1q_f32(vsc + j)), r);
      y = vminq_f32(vmaxq_f32(y, vdupq_n_f32(0.0f)), vdupq_n_f32(ARMLLM_ATTN_W16_MAX));
      vst1_s16(wi + j, vmovn_s32(vcvtnq_s32_f32(y)));
    }
    ws[i] = wmax / ARMLLM_ATTN_W16_MAX;
  }
}

/* The SDOT form of a row of int16 weights w16[0, n4): w = 256 * hi + lo
 * with hi = w >> 8 in [0, 127] and lo = w & 255, as 4-key groups
 * interleaved, (hi of keys 4g..4g+3, lo of the same), so that one 16-byte
 * vector holds 8 keys' (hi, lo) pairs of int8 groups for SDOT by element.
 * lo_bias (0x80 or 0): lo stored as lo ^ lo_bias, i.e. lo - 128 as a
 * signed byte for a signed-only SDOT (the caller adds 128 * sum V). out has
 * room for 2 * n4 bytes rounded up to 16. */
static inline void armllm_attn_i8_w8_row(const int16_t *w16, int64_t n4, int8_t *out,
                                         uint8_t lo_bias) {
  const uint8x8_t bias = vdup_n_u8(lo_bias);
  int64_t j = 0;
  for (; j + 8 <= n4; j += 8) {
    const int16x8_t w = vld1q_s16(w16 + j);
    const int32x2_t hi = vreinterpret_s32_s8(vshrn_n_s16(w, 8));
    const int32x2_t lo = vreinterpret_s32_u8(veor_u8(vmovn_u16(vreinterpretq_u16_s16(w)), bias));
    vst1q_s8(out + 2 * j, vreinterpretq_s8_s32(vcombine_s32(vzip1_s32(hi, lo), vzip2_s32(hi, lo))));
  }
  for (; j < n4; j++) { /* the last 4 keys, n4 not a multiple of 8: group j / 4 */
    out[2 * j - j % 4] = (int8_t)(w16[j] >> 8);
    out[2 * j - j % 4 + 4] = (int8_t)(uint8_t)((w16[j] & 255) ^ lo_bias);
  }
}

/* The attention kernel (armllm_kernels.h) around a partial kernel. */
int64_t armllm_arm_attn_run(armllm_pool *pool, const armllm_attn_args *a,
                            armllm_attn_partial_fn partial);

#endif /* ARMLLM_ATTN_ARM_H */
