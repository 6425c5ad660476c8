/* neon/attn.c: paged KV write and the partial kernels of varlen paged
 * attention on Armv8 NEON; the driver is attn_arm.c.
 *
 * f32 and bf16 caches, f32 math (bf16 widened with ZIP against zero). Per
 * partition, for a tile's nq query vectors:
 *   S = scale * Q K^T   (4 queries x 4 keys register tile over head_dim),
 *   keys outside a vector's [lo, pos] masked out,
 *   m = max S, E = vexp(S - m) (bit-identical to armllm_exp_scalar), l = sum E,
 *   acc = E V          (4 queries x 16 columns register tile over keys).
 * bf16 caches: tiles of > 4 queries widen each 4 K rows once into a stack
 * buffer for all query groups; PV runs 8 queries x 8 columns (4 x 8 for a
 * lone 4-query group) so each widened V vector feeds more FMLAs. All exact
 * and per-element orders unchanged: same bits as the plain tiles.
 *
 * int8 caches in integers, as ref_partition_i8 (attn_common.h), q
 * quantized by the driver (armllm_attn_q8); with SDOT where the CPU has
 * dotprod (HWCAP asimddp), else SMULL/SMLAL (Armv8.0), one template:
 *   QK^T: 4 queries x 4 keys of int32 accumulators, 16 dims a step (SDOT,
 *     or SMULL + SMLAL2 + SADALP), reduced with ADDP; scores
 *     ((float)dot * k_scale) * qf;
 *   the same softmax; int16 weights of E * v_scale (armllm_attn_i8_w16_rows);
 *   PV, 4 queries x 8 columns: with SDOT, 4 V rows transposed in registers
 *     (ZIP of bytes, then of halfwords) meet the weights split into bytes
 *     by SDOT by element; else V widened (SXTL) times the int16 weights by
 *     SMLAL/SMLAL2; (float)sum * ws.
 * The sums are exact integers, so both paths give ref's bits for them. */
#include <arm_neon.h>
#include <math.h>

#include "../armllm_kernels.h"
#include "../attn_arm.h"
#include "../attn_common.h"
#include "../cpu.h"
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

/* Each helper below takes the cache's armllm_kv_dtype `dt` (f32 or bf16, a
 * constant in each instance): f32 rows are loaded as they are, bf16 rows
 * widened exactly to f32. */

/* 4 widened floats at element offset d. */
static inline __attribute__((always_inline)) float32x4_t ld4(const void *p, int64_t d, int dt) {
  if (dt == ARMLLM_KV_BF16)
    return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)p + d), 16));
  return vld1q_f32((const float *)p + d);
}

/* 8 widened floats (two vectors) at element offset d. */
static inline __attribute__((always_inline)) void ld8(const void *p, int64_t d, int dt,
                                                      float32x4_t *lo, float32x4_t *hi) {
  if (dt == ARMLLM_KV_BF16) {
    const uint16x8_t z = vdupq_n_u16(0), x = vld1q_u16((const uint16_t *)p + d);
    *lo = vreinterpretq_f32_u16(vzip1q_u16(z, x));
    *hi = vreinterpretq_f32_u16(vzip2q_u16(z, x));
  } else {
    *lo = vld1q_f32((const float *)p + d);
    *hi = vld1q_f32((const float *)p + d + 4);
  }
}

/* Element e of a row, widened. */
static inline __attribute__((always_inline)) float ld1(const void *p, int64_t e, int dt) {
  if (dt == ARMLLM_KV_BF16) return armllm_bf16_to_f32(((const uint16_t *)p)[e]);
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
 * each widened bf16 V vector); e rows padded to a multiple of 4
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

/* dst[r*ldd + c] = row src[r][d0 + c] widened (bf16), r < nr, c < w. */
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
    const armllm_attn_q8 *q8, const int64_t *lo, const int64_t *hi, int64_t p, float *m, float *l,
    float *accp, int dt) {
  (void)q8; /* int8 caches: neon_partial_i8_t */
  const int64_t hd = a->head_dim;
  const int narrow = dt != ARMLLM_KV_F32; /* bf16: widened on load */
  armllm_attn_keys keys;
  armllm_attn_keys_of(&keys, a, b, kvh, nq, lo, hi, p, armllm_kv_esz(dt));
  const void *const *kr = keys.kr, *const *vr = keys.vr;
  const int64_t n4 = keys.n4;
  float s[QMAX][PART] __attribute__((aligned(16)));
  const float32x4_t vscale = vdupq_n_f32(a->scale);
  /* bf16 with more than one query group: each 4 keys are widened
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
      for (int t = 0; t < 4 && i + t < nq; t++) vst1q_f32(&s[i + t][j], vmulq_f32(d[t], vscale));
    }
  }
  armllm_attn_softmax(&s[0][0], nq, lo, hi, keys.k0, keys.n, m, l, armllm_neon_softmax_row);
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

/* ------------------------------------------- int8 caches, in integers */

/* SDOT in inline assembly: the library is built for Armv8.0 and GCC's
 * vdotq_* need the dotprod target on every function inlining them, which
 * the shared templates below are not. Only the DOT instances reach these,
 * and armllm_neon_attention picks those only when HWCAP says asimddp. The
 * assembler takes SDOT between .arch directives, back to this library's
 * -march=armv8-a (meson.build) after it (GAS 2.40 refuses .arch_extension
 * dotprod). */
#define SDOT_ASM(insn) ".arch armv8.2-a+dotprod\n\t" insn "\n\t.arch armv8-a"

static inline __attribute__((always_inline)) int32x4_t sdot(int32x4_t acc, int8x16_t a,
                                                            int8x16_t b) {
  __asm__(SDOT_ASM("sdot %0.4s, %1.16b, %2.16b") : "+w"(acc) : "w"(a), "w"(b));
  return acc;
}

/* acc += a's 4-byte groups . 4-byte group L of b (SDOT by element) */
#define SDOT_LANE(acc, a, b, L) \
  __asm__(SDOT_ASM("sdot %0.4s, %1.16b, %2.4b[" #L "]") : "+w"(acc) : "w"(a), "w"(b))

/* acc += 4-lane partial dots of 16 int8 pairs, whose lanes add up to the
 * exact dot: with DOT one SDOT; else SMULL/SMLAL2 (two products a lane:
 * |sum| <= 2 * 127 * 128 < 2^15) and SADALP into int32. */
static inline __attribute__((always_inline)) int32x4_t dot16(const int DOT, int32x4_t acc,
                                                             int8x16_t a, int8x16_t b) {
  if (DOT) return sdot(acc, a, b);
  return vpadalq_s16(acc, vmlal_high_s8(vmull_s8(vget_low_s8(a), vget_low_s8(b)), a, b));
}

/* W (16 or 8) bytes of an int8 row from element d; TAIL: fewer than W are
 * left before n, zero-padded (no load past the row, which may end the
 * cache). */
static inline __attribute__((always_inline)) int8x16_t ld_i8(const int8_t *r, int64_t d, int64_t n,
                                                             const int W, const int TAIL) {
  if (TAIL) {
    int8_t t[16] = {0};
    memcpy(t, r + d, (size_t)(n - d));
    return vld1q_s8(t);
  }
  return W == 16 ? vld1q_s8(r + d) : vcombine_s8(vld1_s8(r + d), vdup_n_s8(0));
}

/* One 16-dim step of qk_i8_tile. */
static inline __attribute__((always_inline)) void qk_i8_step(const int DOT, const int NQ,
                                                             const int TAIL, int32x4_t acc[4][4],
                                                             const int8_t (*q8)[MAXHD],
                                                             const void *const *k, int64_t d,
                                                             int64_t hd) {
  int8x16_t kv[4];
  _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) kv[u] = ld_i8(k[u], d, hd, 16, TAIL);
  _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++) {
    const int8x16_t qv = vld1q_s8(q8[i] + d); /* zero-padded past head_dim */
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) acc[i][u] = dot16(DOT, acc[i][u], kv[u], qv);
  }
}

/* QK^T: the exact int32 dots of NQ int8 queries q8[i] with 4 int8 keys,
 * out[i] = (q_i . k_0, .., q_i . k_3): one accumulator per pair over
 * head_dim, 16 dims a step, reduced with ADDP. Keys in lanes would take a
 * 4x4 transpose per 16 dims (8 TRN), more than the 3 ADDP a query per 4
 * keys here for head_dim 64 and 4 queries. */
static inline __attribute__((always_inline)) void qk_i8_tile(const int DOT, const int NQ,
                                                             const int8_t (*q8)[MAXHD],
                                                             const void *const *k, int64_t hd,
                                                             int32x4_t *out) {
  int32x4_t acc[4][4];
  _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++)
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) acc[i][u] = vdupq_n_s32(0);
  int64_t d = 0;
  for (; d + 16 <= hd; d += 16) qk_i8_step(DOT, NQ, 0, acc, q8, k, d, hd);
  if (d < hd) qk_i8_step(DOT, NQ, 1, acc, q8, k, d, hd);
  _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++)
    out[i] = vpaddq_s32(vpaddq_s32(acc[i][0], acc[i][1]), vpaddq_s32(acc[i][2], acc[i][3]));
  _Pragma("GCC unroll 4") for (int i = NQ; i < 4; i++) out[i] = vdupq_n_s32(0);
}

/* PV: accp[i][d0, d0 + 8) (columns past head_dim dropped) = (float)(sum
 * over keys j of w16_i[j] * V8_j[d]) * ws[i] for NQ queries, the sum exact
 * in int32 (attn_common.h), so its order is free:
 *   DOT: 4 keys' V rows transposed in registers (ZIP1/ZIP2 of bytes, then
 *     of halfwords: one int32 lane a column, its 4 bytes the 4 keys), then
 *     SDOT by element against the keys' weights, w = 256 * hi + lo (w8:
 *     armllm_attn_i8_w8_row, lo stored as lo - 128) and the column sums
 *     (SDOT with ones): sum = 256 * HI + LO + 128 * SUM V. 16-byte V loads
 *     at d0 & ~15; the upper 8 columns (UP: d0 % 16 = 8) take the ZIP2
 *     halves.
 *   else: V rows widened to int16 (SXTL) times the int16 weights (w16) by
 *     element, SMLAL/SMLAL2 into int32.
 * TAIL: the V loads reach past head_dim (zero-padded). */
static inline __attribute__((always_inline)) void pv_i8_tile(
    const int DOT, const int NQ, const int TAIL, const int UP, const int16_t *w16,
    const int8_t *w8, const void *const *vr, int64_t n4, int64_t d0, int64_t hd, const float *ws,
    float *accp) {
  int32x4_t acc[4][2], lo[4][2], cs[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
  _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++)
    _Pragma("GCC unroll 2") for (int c = 0; c < 2; c++) acc[i][c] = lo[i][c] = vdupq_n_s32(0);
  if (DOT) {
    const int64_t c16 = d0 & ~(int64_t)15;
    const int8x16_t ones = vdupq_n_s8(1);
#define PV_GROUP(G, LH, LL)                                                                 \
    {                                                                                       \
      int8x16_t r[4];                                                                       \
      _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)                                   \
        r[u] = ld_i8(vr[j + 4 * G + u], c16, hd, 16, TAIL);                                 \
      const int8x16_t z01 = UP ? vzip2q_s8(r[0], r[1]) : vzip1q_s8(r[0], r[1]);             \
      const int8x16_t z23 = UP ? vzip2q_s8(r[2], r[3]) : vzip1q_s8(r[2], r[3]);             \
      const int16x8_t h01 = vreinterpretq_s16_s8(z01), h23 = vreinterpretq_s16_s8(z23);     \
      const int8x16_t t0 = vreinterpretq_s8_s16(vzip1q_s16(h01, h23));                      \
      const int8x16_t t1 = vreinterpretq_s8_s16(vzip2q_s16(h01, h23));                      \
      cs[0] = sdot(cs[0], t0, ones);                                                        \
      cs[1] = sdot(cs[1], t1, ones);                                                        \
      _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++) {                                \
        SDOT_LANE(acc[i][0], t0, wv[i], LH);                                                \
        SDOT_LANE(acc[i][1], t1, wv[i], LH);                                                \
        SDOT_LANE(lo[i][0], t0, wv[i], LL);                                                 \
        SDOT_LANE(lo[i][1], t1, wv[i], LL);                                                 \
      }                                                                                     \
    }
    int64_t j = 0;
    for (; j + 8 <= n4; j += 8) { /* 8 keys: one 16-byte weight vector a query */
      int8x16_t wv[4];
      _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++) wv[i] = vld1q_s8(w8 + i * 2 * PART + 2 * j);
      PV_GROUP(0, 0, 1)
      PV_GROUP(1, 2, 3)
    }
    if (j < n4) { /* the last 4 */
      int8x16_t wv[4];
      _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++) wv[i] = vld1q_s8(w8 + i * 2 * PART + 2 * j);
      PV_GROUP(0, 0, 1)
    }
#undef PV_GROUP
    _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++)
      _Pragma("GCC unroll 2") for (int c = 0; c < 2; c++)
        acc[i][c] = vaddq_s32(vaddq_s32(vshlq_n_s32(acc[i][c], 8), lo[i][c]), vshlq_n_s32(cs[c], 7));
  } else {
    for (int64_t j = 0; j < n4; j += 4) {
      int16x4_t wv[4];
      _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++) wv[i] = vld1_s16(w16 + i * PART + j);
#define PV_KEY(U)                                                                           \
      {                                                                                     \
        const int16x8_t v = vmovl_s8(vget_low_s8(ld_i8(vr[j + U], d0, hd, 8, TAIL)));       \
        _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++) {                              \
          acc[i][0] = vmlal_lane_s16(acc[i][0], vget_low_s16(v), wv[i], U);                 \
          acc[i][1] = vmlal_high_lane_s16(acc[i][1], v, wv[i], U);                          \
        }                                                                                   \
      }
      PV_KEY(0) PV_KEY(1) PV_KEY(2) PV_KEY(3)
#undef PV_KEY
    }
  }
  _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++) {
    const float32x4_t w = vdupq_n_f32(ws[i]);
    float o[8];
    vst1q_f32(o, vmulq_f32(vcvtq_f32_s32(acc[i][0]), w));
    vst1q_f32(o + 4, vmulq_f32(vcvtq_f32_s32(acc[i][1]), w));
    memcpy(accp + i * hd + d0, o, sizeof(float) * (size_t)(hd - d0 < 8 ? hd - d0 : 8));
  }
}

/* The int8 partial kernel (DOT: with SDOT), as ref_partition_i8 for each
 * query: scores (float)dot * k_scale * qf, the shared softmax, int16
 * weights (armllm_attn_i8_w16_rows) and the exact int32 PV. */
static inline __attribute__((always_inline)) void neon_partial_i8_t(
    const armllm_attn_args *a, int64_t b, int64_t kvh, int nq, const float *const *q,
    const armllm_attn_q8 *q8, const int64_t *lo, const int64_t *hi, int64_t p, float *m, float *l,
    float *accp, const int DOT) {
  (void)q; /* q8 holds the queries */
  const int64_t hd = a->head_dim;
  armllm_attn_keys keys;
  armllm_attn_keys_of(&keys, a, b, kvh, nq, lo, hi, p, 1);
  const void *const *kr = keys.kr, *const *vr = keys.vr;
  const int64_t n4 = keys.n4;
  float s[QMAX][PART] __attribute__((aligned(16)));
  for (int64_t j = 0; j < n4; j += 4) {
    const float32x4_t ks = vld1q_f32(keys.ksc + j);
    for (int i = 0; i < nq; i += 4) {
      int32x4_t d[4];
#define QK_CALL(N) qk_i8_tile(DOT, N, q8->q + i, kr + j, hd, d)
      switch (nq - i >= 4 ? 4 : nq - i) {
        case 4: QK_CALL(4); break;
        case 3: QK_CALL(3); break;
        case 2: QK_CALL(2); break;
        default: QK_CALL(1); break;
      }
#undef QK_CALL
      for (int t = 0; t < 4 && i + t < nq; t++) /* ref's order: dot * k_scale * qf */
        vst1q_f32(&s[i + t][j], vmulq_n_f32(vmulq_f32(vcvtq_f32_s32(d[t]), ks), q8->qf[i + t]));
    }
  }
  armllm_attn_softmax(&s[0][0], nq, lo, hi, keys.k0, keys.n, m, l, armllm_neon_softmax_row);
  int16_t w16[QMAX][PART] __attribute__((aligned(16)));
  int8_t w8[QMAX][2 * PART] __attribute__((aligned(16))); /* DOT only */
  float ws[QMAX];
  armllm_attn_i8_w16_rows(&s[0][0], nq, keys.vsc, n4, &w16[0][0], ws);
  if (DOT) /* lo - 128: signed bytes for SDOT */
    for (int i = 0; i < nq; i++) armllm_attn_i8_w8_row(w16[i], n4, w8[i], 0x80);
  for (int i = 0; i < nq; i += 4)
    for (int64_t d0 = 0; d0 < hd; d0 += 8) {
      /* DOT loads 16 bytes at d0 & ~15, else 8 at d0 */
      const int tail = DOT ? (d0 & ~(int64_t)15) + 16 > hd : d0 + 8 > hd;
      const int8_t *w8i = DOT ? w8[i] : NULL;
      const int up = DOT && (d0 & 15) != 0;
#define PV_CALL(N, T, U) pv_i8_tile(DOT, N, T, U, w16[i], w8i, vr, n4, d0, hd, ws + i, accp + i * hd)
#define PV_CASES(T, U)                          \
      switch (nq - i >= 4 ? 4 : nq - i) {       \
        case 4: PV_CALL(4, T, U); break;        \
        case 3: PV_CALL(3, T, U); break;        \
        case 2: PV_CALL(2, T, U); break;        \
        default: PV_CALL(1, T, U); break;       \
      }
      if (tail) {
        if (up) PV_CASES(1, 1) else PV_CASES(1, 0)
      } else {
        if (up) PV_CASES(0, 1) else PV_CASES(0, 0)
      }
#undef PV_CASES
#undef PV_CALL
    }
}

ARMLLM_ATTN_PARTIAL(neon_partial_i8_dot, neon_partial_i8_t, 1)
ARMLLM_ATTN_PARTIAL(neon_partial_i8_mull, neon_partial_i8_t, 0)

int64_t armllm_neon_attention(armllm_pool *pool, const armllm_attn_args *args) {
  const armllm_attn_partial_fn partial =
      args->cache_dtype == ARMLLM_KV_BF16 ? neon_partial_bf16
      : args->cache_dtype == ARMLLM_KV_I8 ? (armllm_neon_sdot() ? neon_partial_i8_dot
                                                                 : neon_partial_i8_mull)
                                          : neon_partial_f32;
  return armllm_arm_attn_run(pool, args, partial);
}
