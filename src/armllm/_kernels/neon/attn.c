/* neon/attn.c: paged KV write and the partial kernel of varlen paged
 * attention on Armv8.0 NEON (f32 math; bf16 caches widened with ZIP against
 * zero, int8 caches with SXTL and SADDW/FSUB); the driver is attn_arm.c.
 *
 * Per partition, for a tile's nq query vectors:
 *   S = scale * Q K^T   (4 queries x 4 keys register tile over head_dim),
 *   keys outside a vector's [lo, pos] masked out,
 *   m = max S, E = vexp(S - m) (bit-identical to armllm_exp_scalar), l = sum E,
 *   acc = E V          (4 queries x 16 columns register tile over keys).
 * bf16 and int8 caches: tiles of > 4 queries widen each 4 K rows once into a
 * stack buffer for all query groups; PV runs 8 queries x 8 columns (4 x 8
 * for a lone 4-query group) so each widened V vector feeds more FMLAs. All
 * exact and per-element orders unchanged: same bits as the plain tiles.
 * int8 caches as ref: S = (Q K8^T * k_scale) * scale per key, and after the
 * sums l the weights E * v_scale meet the widened V8 rows. */
#include <arm_neon.h>
#include <math.h>

#include "../armllm_kernels.h"
#include "../attn_arm.h"
#include "../attn_common.h"
#include "attn_neon.h"

#define QMAX ARMLLM_ATTN_QMAX
#define PART ARMLLM_ATTN_PARTITION
#define MAXHD ARMLLM_ATTN_MAX_HEAD_DIM

/* ------------------------------------------------------------- KV write */

/* 8 floats -> 8 bf16, round to nearest even, NaN quieted as in ref. */
static inline uint16x8_t bf16_round8(float32x4_t x0, float32x4_t x1) {
  const uint32x4_t one = vdupq_n_u32(1), bias = vdupq_n_u32(0x7fff);
  const uint32x4_t absmask = vdupq_n_u32(0x7fffffffu), inf = vdupq_n_u32(0x7f800000u);
  const uint32x4_t quiet = vdupq_n_u32(0x00400000u);
  uint32x4_t u0 = vreinterpretq_u32_f32(x0), u1 = vreinterpretq_u32_f32(x1);
  uint32x4_t r0 = vaddq_u32(u0, vaddq_u32(vandq_u32(vshrq_n_u32(u0, 16), one), bias));
  uint32x4_t r1 = vaddq_u32(u1, vaddq_u32(vandq_u32(vshrq_n_u32(u1, 16), one), bias));
  r0 = vbslq_u32(vcgtq_u32(vandq_u32(u0, absmask), inf), vorrq_u32(u0, quiet), r0);
  r1 = vbslq_u32(vcgtq_u32(vandq_u32(u1, absmask), inf), vorrq_u32(u1, quiet), r1);
  return vshrn_high_n_u32(vshrn_n_u32(r0, 16), r1, 16);
}

static void store_bf16_row(void *dst_bytes, const float *src, int64_t hd) {
  uint16_t *o = dst_bytes;
  int64_t d = 0;
  for (; d + 8 <= hd; d += 8) vst1q_u16(o + d, bf16_round8(vld1q_f32(src + d), vld1q_f32(src + d + 4)));
  for (; d < hd; d++) o[d] = armllm_f32_to_bf16(src[d]);
}

typedef struct {
  const float *k, *v;
  int64_t ldk, ldv;
  const int32_t *slots;
  int64_t t;
  void *kc, *vc;
  int dtype;
  uint16_t *ks, *vs;
  int64_t n_kv_heads, hd, bs, num_blocks;
} kv_job;

/* Items are KV heads: each writes its head of every row in row order, so
 * rows sharing a slot end as in ref (last wins) and threads never meet. */
static void kv_write_heads(void *ctx, int64_t h0, int64_t h1) {
  const kv_job *j = ctx;
  for (int64_t h = h0; h < h1; h++)
    for (int64_t i = 0; i < j->t; i++) {
      const int64_t slot = j->slots[i];
      if (slot < 0) continue;
      armllm_kv_store_head(j->k + i * j->ldk + h * j->hd, j->v + i * j->ldv + h * j->hd, slot,
                           h, j->kc, j->vc, j->dtype, j->ks, j->vs, j->hd, j->bs, j->num_blocks,
                           store_bf16_row);
    }
}

int64_t armllm_neon_kv_write(armllm_pool *pool, const float *k, int64_t ldk, const float *v,
                             int64_t ldv, const int32_t *slot_mapping, int64_t t, void *k_cache,
                             void *v_cache, int cache_dtype, uint16_t *k_scale,
                             uint16_t *v_scale, int64_t n_kv_heads, int64_t head_dim,
                             int64_t block_size, int64_t num_blocks) {
  const int64_t bad = armllm_attn_first_bad_slot(slot_mapping, t, num_blocks * block_size);
  if (bad >= 0) return bad;
  kv_job job = {k, v, ldk, ldv, slot_mapping, t, k_cache, v_cache, cache_dtype, k_scale,
                v_scale, n_kv_heads, head_dim, block_size, num_blocks};
  /* memory-bound: threads only for prefill-sized writes (>= 256 KB) */
  armllm_pool *p = t * n_kv_heads * head_dim >= 65536 ? pool : NULL;
  armllm_pool_run(p, n_kv_heads, 1, kv_write_heads, &job);
  return -1;
}

/* ------------------------------------------------------ partial kernel */

/* Each helper below takes the cache's armllm_kv_dtype `dt` (a constant in
 * each instance): f32 rows are loaded as they are, bf16 and int8 rows
 * widened exactly to f32 (int8 without its row's scale, which the caller
 * folds into the scores and the PV weights). */

/* Lanes 0-3 (i8_lo) or 4-7 (i8_hi) of 8 sign-extended int8 as exact floats
 * (ARMLLM_I8_F32_BITS). */
static inline __attribute__((always_inline)) float32x4_t i8_lo(int16x8_t x) {
  const int32x4_t w = vaddw_s16(vdupq_n_s32(ARMLLM_I8_F32_BITS), vget_low_s16(x));
  return vsubq_f32(vreinterpretq_f32_s32(w), vdupq_n_f32(ARMLLM_I8_F32_BIAS));
}

static inline __attribute__((always_inline)) float32x4_t i8_hi(int16x8_t x) {
  const int32x4_t w = vaddw_high_s16(vdupq_n_s32(ARMLLM_I8_F32_BITS), x);
  return vsubq_f32(vreinterpretq_f32_s32(w), vdupq_n_f32(ARMLLM_I8_F32_BIAS));
}

/* 4 widened floats at element offset d. */
static inline __attribute__((always_inline)) float32x4_t ld4(const void *p, int64_t d, int dt) {
  if (dt == ARMLLM_KV_BF16)
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)p + d), 16));
  if (dt == ARMLLM_KV_I8) {
    int32_t w; /* 4 bytes only: an 8-byte load could pass the row's (and the cache's) end */
    memcpy(&w, (const int8_t *)p + d, sizeof w);
    return i8_lo(vmovl_s8(vreinterpret_s8_s32(vdup_n_s32(w))));
  }
  return vld1q_f32((const float *)p + d);
}

/* 8 widened floats (two vectors) at element offset d. */
static inline __attribute__((always_inline)) void ld8(const void *p, int64_t d, int dt,
                                                      float32x4_t *lo, float32x4_t *hi) {
  if (dt == ARMLLM_KV_BF16) {
    const uint16x8_t z = vdupq_n_u16(0), x = vld1q_u16((const uint16_t *)p + d);
    *lo = vreinterpretq_f32_u16(vzip1q_u16(z, x));
    *hi = vreinterpretq_f32_u16(vzip2q_u16(z, x));
  } else if (dt == ARMLLM_KV_I8) { /* SXTL to 16 bits, then SADDW and FSUB: exact */
    const int16x8_t x = vmovl_s8(vld1_s8((const int8_t *)p + d));
    *lo = i8_lo(x);
    *hi = i8_hi(x);
  } else {
    *lo = vld1q_f32((const float *)p + d);
    *hi = vld1q_f32((const float *)p + d + 4);
  }
}

/* Element e of a row, widened. */
static inline __attribute__((always_inline)) float ld1(const void *p, int64_t e, int dt) {
  if (dt == ARMLLM_KV_BF16) return armllm_bf16_to_f32(((const uint16_t *)p)[e]);
  if (dt == ARMLLM_KV_I8) return (float)((const int8_t *)p)[e];
  return ((const float *)p)[e];
}

/* Dots of NQ queries with 4 keys: out[i] = (q_i.k_0, .., q_i.k_3). Each dot
 * is one 4-lane accumulator over head_dim (8, then 4, then a zero-padded
 * tail), reduced pairwise, so its bits do not depend on NQ. */
static inline __attribute__((always_inline)) void qk_tile(const float *const *q, const void *const *k,
                                                          int64_t hd, int dt, const int NQ,
                                                          float32x4_t *out) {
  float32x4_t acc[4][4];
  _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++)
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) acc[i][u] = vdupq_n_f32(0.0f);
  int64_t d = 0;
  for (; d + 8 <= hd; d += 8) {
    float32x4_t k0[4], k1[4];
    if (dt != ARMLLM_KV_F32) { /* widened 8 at a time */
      _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) ld8(k[u], d, dt, &k0[u], &k1[u]);
    } else { /* second halves loaded late: fewer live registers */
      _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) k0[u] = ld4(k[u], d, dt);
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++) {
      const float32x4_t q0 = vld1q_f32(q[i] + d);
      _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) acc[i][u] = vfmaq_f32(acc[i][u], q0, k0[u]);
    }
    if (dt == ARMLLM_KV_F32) {
      _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) k1[u] = ld4(k[u], d + 4, dt);
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++) {
      const float32x4_t q1 = vld1q_f32(q[i] + d + 4);
      _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) acc[i][u] = vfmaq_f32(acc[i][u], q1, k1[u]);
    }
  }
  if (d + 4 <= hd) {
    float32x4_t kv[4];
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) kv[u] = ld4(k[u], d, dt);
    _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++) {
      const float32x4_t q0 = vld1q_f32(q[i] + d);
      _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) acc[i][u] = vfmaq_f32(acc[i][u], q0, kv[u]);
    }
    d += 4;
  }
  if (d < hd) { /* 1..3 left: zero-padded copies */
    float kt[4][4] = {{0}}, qt[4] = {0};
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)
      for (int64_t e = d; e < hd; e++) kt[u][e - d] = ld1(k[u], e, dt);
    _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++) {
      for (int64_t e = d; e < hd; e++) qt[e - d] = q[i][e];
      const float32x4_t q0 = vld1q_f32(qt);
      _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) acc[i][u] = vfmaq_f32(acc[i][u], q0, vld1q_f32(kt[u]));
    }
  }
  _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++)
    out[i] = vpaddq_f32(vpaddq_f32(acc[i][0], acc[i][1]), vpaddq_f32(acc[i][2], acc[i][3]));
  _Pragma("GCC unroll 4") for (int i = NQ; i < 4; i++) out[i] = vdupq_n_f32(0.0f);
}

/* acc[i][0..W) = sum over keys j (in order) of e_i[j] * V_j[d0..d0+W), for
 * NQ queries (<= 4 with W = 16 or 4 columns, 8 with W = 8: 8 queries share
 * each widened bf16 or int8 V vector); e rows padded to a multiple of 4
 * with zeros. Every output element is one fused chain over the keys in
 * order, whatever the tile shape. */
static inline __attribute__((always_inline)) void pv_tile(const float *e, int64_t lde,
                                                          const void *const *vrow, int64_t n4,
                                                          int64_t d0, int dt, const int NQ,
                                                          const int W, float *accp, int64_t hd) {
  float32x4_t acc[8][4];
  const int nv = W / 4;
  _Pragma("GCC unroll 8") for (int i = 0; i < NQ; i++)
    _Pragma("GCC unroll 4") for (int c = 0; c < nv; c++) acc[i][c] = vdupq_n_f32(0.0f);
  for (int64_t j = 0; j < n4; j += 4) {
    float32x4_t ev[8];
    _Pragma("GCC unroll 8") for (int i = 0; i < NQ; i++) ev[i] = vld1q_f32(e + i * lde + j);
#define PV_KEY(U)                                                                  \
    {                                                                              \
      float32x4_t vv[4];                                                           \
      if (nv == 4) {                                                               \
        ld8(vrow[j + U], d0, dt, &vv[0], &vv[1]);                                  \
        ld8(vrow[j + U], d0 + 8, dt, &vv[2], &vv[3]);                              \
      } else if (nv == 2) {                                                        \
        ld8(vrow[j + U], d0, dt, &vv[0], &vv[1]);                                  \
      } else {                                                                     \
        vv[0] = ld4(vrow[j + U], d0, dt);                                          \
      }                                                                            \
      _Pragma("GCC unroll 8") for (int i = 0; i < NQ; i++)                                                 \
        _Pragma("GCC unroll 4") for (int c = 0; c < nv; c++) acc[i][c] = vfmaq_laneq_f32(acc[i][c], vv[c], ev[i], U); \
    }
    PV_KEY(0) PV_KEY(1) PV_KEY(2) PV_KEY(3)
#undef PV_KEY
  }
  _Pragma("GCC unroll 8") for (int i = 0; i < NQ; i++)
    _Pragma("GCC unroll 4") for (int c = 0; c < nv; c++) vst1q_f32(accp + i * hd + d0 + 4 * c, acc[i][c]);
}

/* The last 1..3 columns [d0, hd) of nqi queries (e rows PART apart), one
 * scalar fused chain over the keys each. */
static inline __attribute__((always_inline)) void pv_cols(const float *e, const void *const *vr,
                                                          int64_t n4, int64_t d0, int64_t hd,
                                                          int dt, int nqi, float *accp) {
  for (; d0 < hd; d0++)
    for (int t = 0; t < nqi; t++) {
      float acc = 0.0f;
      for (int64_t j = 0; j < n4; j++) acc = fmaf(e[t * PART + j], ld1(vr[j], d0, dt), acc);
      accp[t * hd + d0] = acc;
    }
}

/* dst[r*ldd + c] = row src[r][d0 + c] widened (bf16 or int8), r < nr, c < w. */
static inline __attribute__((always_inline)) void widen_rows(const void *const *src, int64_t nr,
                                                             int64_t d0, int64_t w, float *dst,
                                                             int64_t ldd, int dt) {
  for (int64_t r = 0; r < nr; r++) {
    float *o = dst + r * ldd;
    int64_t c = 0;
    for (; c + 16 <= w; c += 16) {
      float32x4_t x0, x1, x2, x3;
      ld8(src[r], d0 + c, dt, &x0, &x1);
      ld8(src[r], d0 + c + 8, dt, &x2, &x3);
      vst1q_f32(o + c, x0);
      vst1q_f32(o + c + 4, x1);
      vst1q_f32(o + c + 8, x2);
      vst1q_f32(o + c + 12, x3);
    }
    for (; c + 4 <= w; c += 4) vst1q_f32(o + c, ld4(src[r], d0 + c, dt));
    for (; c < w; c++) o[c] = ld1(src[r], d0 + c, dt);
  }
}

static inline __attribute__((always_inline)) void neon_partial_t(
    const armllm_attn_args *a, int64_t b, int64_t kvh, int nq, const float *const *q,
    const int64_t *lo, const int64_t *hi, int64_t p, float *m, float *l, float *accp, int dt) {
  const int64_t hd = a->head_dim;
  const int narrow = dt != ARMLLM_KV_F32; /* bf16 or int8: widened on load */
  armllm_attn_keys keys;
  armllm_attn_keys_of(&keys, a, b, kvh, nq, lo, hi, p, armllm_kv_esz(dt));
  const void *const *kr = keys.kr, *const *vr = keys.vr;
  const int64_t n4 = keys.n4;
  float s[QMAX][PART] __attribute__((aligned(16)));
  const float32x4_t vscale = vdupq_n_f32(a->scale);
  /* bf16 or int8 with more than one query group: each 4 keys are widened
   * once into kbuf and the groups run the f32 tile on it (exact, so the same
   * bits) */
  const int kwide = narrow && nq > 4;
  float kbuf[4][MAXHD] __attribute__((aligned(16)));
  const void *kw[4] = {kbuf[0], kbuf[1], kbuf[2], kbuf[3]};
  for (int64_t j = 0; j < n4; j += 4) {
    if (kwide) widen_rows(kr + j, 4, 0, hd, kbuf[0], MAXHD, dt);
    for (int i = 0; i < nq; i += 4) {
      float32x4_t d[4];
#define QK_CASES(K, DT)                                          \
      switch (nq - i >= 4 ? 4 : nq - i) {                        \
        case 4: qk_tile(q + i, K, hd, DT, 4, d); break;          \
        case 3: qk_tile(q + i, K, hd, DT, 3, d); break;          \
        case 2: qk_tile(q + i, K, hd, DT, 2, d); break;          \
        default: qk_tile(q + i, K, hd, DT, 1, d); break;         \
      }
      if (kwide) {
        QK_CASES(kw, ARMLLM_KV_F32)
      } else {
        QK_CASES(kr + j, dt)
      }
#undef QK_CASES
      for (int t = 0; t < 4 && i + t < nq; t++) {
        float32x4_t st = d[t];
        if (dt == ARMLLM_KV_I8) st = vmulq_f32(st, vld1q_f32(keys.ksc + j)); /* ref's order */
        vst1q_f32(&s[i + t][j], vmulq_f32(st, vscale));
      }
    }
  }
  armllm_attn_softmax(&s[0][0], nq, lo, hi, keys.k0, keys.n, m, l, armllm_neon_softmax_row);
  if (dt == ARMLLM_KV_I8) armllm_attn_scale_weights(&s[0][0], nq, keys.vsc, n4);
#define PV_CASES(V, DT, W)                                                           \
    switch (nq - i >= 4 ? 4 : nq - i) {                                                  \
      case 4: pv_tile(s[i], PART, V, n4, d0, DT, 4, W, accp + i * hd, hd); break;    \
      case 3: pv_tile(s[i], PART, V, n4, d0, DT, 3, W, accp + i * hd, hd); break;    \
      case 2: pv_tile(s[i], PART, V, n4, d0, DT, 2, W, accp + i * hd, hd); break;    \
      default: pv_tile(s[i], PART, V, n4, d0, DT, 1, W, accp + i * hd, hd); break;   \
    }
  int i = 0;
  if (narrow) /* 8-query tiles: each widened V vector feeds 8 queries */
    for (; i + 8 <= nq; i += 8) {
      int64_t d0 = 0;
      for (; d0 + 8 <= hd; d0 += 8) pv_tile(s[i], PART, vr, n4, d0, dt, 8, 8, accp + i * hd, hd);
      for (; d0 + 4 <= hd; d0 += 4) { /* the rest as 4-query tiles */
        pv_tile(s[i], PART, vr, n4, d0, dt, 4, 4, accp + i * hd, hd);
        pv_tile(s[i + 4], PART, vr, n4, d0, dt, 4, 4, accp + (i + 4) * hd, hd);
      }
      pv_cols(s[i], vr, n4, d0, hd, dt, 8, accp + i * hd);
    }
  for (; i < nq; i += 4) {
    const int nqi = nq - i >= 4 ? 4 : nq - i;
    int64_t d0 = 0;
    if (narrow && nqi == 4) /* 4 x 8: no accumulator copies (GCC) at 4 x 16 */
      for (; d0 + 8 <= hd; d0 += 8) pv_tile(s[i], PART, vr, n4, d0, dt, 4, 8, accp + i * hd, hd);
    for (; d0 + 16 <= hd; d0 += 16) PV_CASES(vr, dt, 16)
    for (; d0 + 4 <= hd; d0 += 4) PV_CASES(vr, dt, 4)
    pv_cols(s[i], vr, n4, d0, hd, dt, nqi, accp + i * hd);
  }
#undef PV_CASES
}

ARMLLM_ATTN_PARTIAL(neon_partial_f32, neon_partial_t, ARMLLM_KV_F32)
ARMLLM_ATTN_PARTIAL(neon_partial_bf16, neon_partial_t, ARMLLM_KV_BF16)
ARMLLM_ATTN_PARTIAL(neon_partial_i8, neon_partial_t, ARMLLM_KV_I8)

int64_t armllm_neon_attention(armllm_pool *pool, const armllm_attn_args *args) {
  const armllm_attn_partial_fn partial = args->cache_dtype == ARMLLM_KV_BF16 ? neon_partial_bf16
                                         : args->cache_dtype == ARMLLM_KV_I8 ? neon_partial_i8
                                                                              : neon_partial_f32;
  return armllm_arm_attn_run(pool, args, partial);
}
