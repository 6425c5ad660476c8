/* neon/attn.c: paged KV write and varlen paged attention on Armv8.0 NEON
 * (f32 math; bf16 caches widened with ZIP against zero).
 *
 * Work item = (tile of query rows of one sequence, KV head, chunk of that KV
 * head's query heads): the tile's nq = rows * heads query vectors (<= QMAX)
 * share every K/V row loaded. Per partition of ARMLLM_ATTN_PARTITION
 * absolute key positions the partial kernel computes, for all nq vectors,
 *   S = scale * Q K^T   (4 queries x 4 keys register tile over head_dim),
 *   keys outside a vector's [lo, pos] masked to -inf,
 *   m = max S, E = vexp(S - m) (bit-identical to armllm_exp_scalar), l = sum E,
 *   acc = E V          (4 queries x 16 columns register tile over keys),
 * and the driver merges partitions in order with armllm_attn_merge.
 * bf16 caches: tiles of > 4 queries widen each 4 K rows once into a stack
 * buffer for all query groups; PV runs 8 queries x 8 columns (4 x 8 for a
 * lone 4-query group) so each widened V vector feeds more FMLAs. All exact
 * and per-element orders unchanged: same bits as the plain tiles.
 *
 * Split-KV: when the tiles are fewer than 2x the threads and scratch is
 * large enough, items become (tile, KV head, chunk, partition) writing
 * (m, l, acc) to scratch, and a second pass merges them per (row, head) in
 * partition order. Both paths run the same partial kernel on the same
 * tiles (tiles depend only on the metadata), so they return the same bits.
 *
 * The driver (armllm_neon_attn_run) is shared with sve/attn.c, which passes
 * its own partial kernel. */
#include <arm_neon.h>
#include <math.h>

#include "../armllm_kernels.h"
#include "../attn_common.h"
#include "vexp_neon.h"

#define QMAX 16                     /* query vectors per tile */
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

static void store_row(const float *src, void *cache, int64_t dst, int bf16, int64_t hd) {
  if (!bf16) {
    memcpy((float *)cache + dst, src, (size_t)hd * sizeof(float));
    return;
  }
  uint16_t *o = (uint16_t *)cache + dst;
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
  int bf16;
  int64_t n_kv_heads, hd, bs;
} kv_job;

/* Items are KV heads: each writes its head of every row in row order, so
 * rows sharing a slot end as in ref (last wins) and threads never meet. */
static void kv_write_heads(void *ctx, int64_t h0, int64_t h1) {
  const kv_job *j = ctx;
  for (int64_t h = h0; h < h1; h++)
    for (int64_t i = 0; i < j->t; i++) {
      const int64_t slot = j->slots[i];
      if (slot < 0) continue;
      const int64_t dst = (((slot / j->bs) * j->n_kv_heads + h) * j->bs + slot % j->bs) * j->hd;
      store_row(j->k + i * j->ldk + h * j->hd, j->kc, dst, j->bf16, j->hd);
      store_row(j->v + i * j->ldv + h * j->hd, j->vc, dst, j->bf16, j->hd);
    }
}

int64_t armllm_neon_kv_write(armllm_pool *pool, const float *k, int64_t ldk, const float *v,
                             int64_t ldv, const int32_t *slot_mapping, int64_t t, void *k_cache,
                             void *v_cache, int cache_bf16, int64_t n_kv_heads, int64_t head_dim,
                             int64_t block_size, int64_t num_blocks) {
  const int64_t bad = armllm_attn_first_bad_slot(slot_mapping, t, num_blocks * block_size);
  if (bad >= 0) return bad;
  kv_job job = {k, v, ldk, ldv, slot_mapping, t, k_cache, v_cache, cache_bf16, n_kv_heads,
                head_dim, block_size};
  /* memory-bound: threads only for prefill-sized writes (>= 256 KB) */
  armllm_pool *p = t * n_kv_heads * head_dim >= 65536 ? pool : NULL;
  armllm_pool_run(p, n_kv_heads, 1, kv_write_heads, &job);
  return -1;
}

/* ------------------------------------------------------ partial kernel */

/* What the shared driver calls for one partition p of a tile. */
typedef void (*armllm_attn_partial_fn)(const armllm_attn_args *a, int64_t b, int64_t kvh, int nq,
                                       const float *const *q, const int64_t *lo,
                                       const int64_t *hi, int64_t p, float *m, float *l,
                                       float *accp);
int64_t armllm_neon_attn_run(armllm_pool *pool, const armllm_attn_args *a,
                             armllm_attn_partial_fn partial);

/* 4 widened floats from f32 or bf16 bits at element offset d. */
static inline __attribute__((always_inline)) float32x4_t ld4(const void *p, int64_t d, int bf16) {
  if (bf16) return vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)p + d), 16));
  return vld1q_f32((const float *)p + d);
}

/* 8 widened floats (two vectors) at element offset d. */
static inline __attribute__((always_inline)) void ld8(const void *p, int64_t d, int bf16,
                                                      float32x4_t *lo, float32x4_t *hi) {
  if (bf16) {
    const uint16x8_t z = vdupq_n_u16(0), x = vld1q_u16((const uint16_t *)p + d);
    *lo = vreinterpretq_f32_u16(vzip1q_u16(z, x));
    *hi = vreinterpretq_f32_u16(vzip2q_u16(z, x));
  } else {
    *lo = vld1q_f32((const float *)p + d);
    *hi = vld1q_f32((const float *)p + d + 4);
  }
}

/* Dots of NQ queries with 4 keys: out[i] = (q_i.k_0, .., q_i.k_3). Each dot
 * is one 4-lane accumulator over head_dim (8, then 4, then a zero-padded
 * tail), reduced pairwise, so its bits do not depend on NQ. */
static inline __attribute__((always_inline)) void qk_tile(const float *const *q, const void *const *k,
                                                          int64_t hd, int bf16, const int NQ,
                                                          float32x4_t *out) {
  float32x4_t acc[4][4];
  _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++)
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) acc[i][u] = vdupq_n_f32(0.0f);
  int64_t d = 0;
  for (; d + 8 <= hd; d += 8) {
    float32x4_t k0[4], k1[4];
    if (bf16) {
      _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) ld8(k[u], d, bf16, &k0[u], &k1[u]);
    } else { /* second halves loaded late: fewer live registers */
      _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) k0[u] = ld4(k[u], d, 0);
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++) {
      const float32x4_t q0 = vld1q_f32(q[i] + d);
      _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) acc[i][u] = vfmaq_f32(acc[i][u], q0, k0[u]);
    }
    if (!bf16) {
      _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) k1[u] = ld4(k[u], d + 4, 0);
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++) {
      const float32x4_t q1 = vld1q_f32(q[i] + d + 4);
      _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) acc[i][u] = vfmaq_f32(acc[i][u], q1, k1[u]);
    }
  }
  if (d + 4 <= hd) {
    float32x4_t kv[4];
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) kv[u] = ld4(k[u], d, bf16);
    _Pragma("GCC unroll 4") for (int i = 0; i < NQ; i++) {
      const float32x4_t q0 = vld1q_f32(q[i] + d);
      _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) acc[i][u] = vfmaq_f32(acc[i][u], q0, kv[u]);
    }
    d += 4;
  }
  if (d < hd) { /* 1..3 left: zero-padded copies */
    float kt[4][4] = {{0}}, qt[4] = {0};
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++)
      for (int64_t e = d; e < hd; e++)
        kt[u][e - d] = bf16 ? armllm_bf16_to_f32(((const uint16_t *)k[u])[e]) : ((const float *)k[u])[e];
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
 * each widened bf16 V vector); e rows padded to a multiple of 4 with zeros.
 * Every output element is one fused chain over the keys in order, whatever
 * the tile shape. */
static inline __attribute__((always_inline)) void pv_tile(const float *e, int64_t lde,
                                                          const void *const *vrow, int64_t n4,
                                                          int64_t d0, int bf16, const int NQ,
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
        ld8(vrow[j + U], d0, bf16, &vv[0], &vv[1]);                                \
        ld8(vrow[j + U], d0 + 8, bf16, &vv[2], &vv[3]);                            \
      } else if (nv == 2) {                                                        \
        ld8(vrow[j + U], d0, bf16, &vv[0], &vv[1]);                                \
      } else {                                                                     \
        vv[0] = ld4(vrow[j + U], d0, bf16);                                        \
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
                                                          int bf16, int nqi, float *accp) {
  for (; d0 < hd; d0++)
    for (int t = 0; t < nqi; t++) {
      float acc = 0.0f;
      for (int64_t j = 0; j < n4; j++) {
        const float vv = bf16 ? armllm_bf16_to_f32(((const uint16_t *)vr[j])[d0])
                              : ((const float *)vr[j])[d0];
        acc = fmaf(e[t * PART + j], vv, acc);
      }
      accp[t * hd + d0] = acc;
    }
}

/* dst[r*ldd + c] = bf16 row src[r][d0 + c] widened, r < nr, c < w. */
static void widen_rows(const void *const *src, int64_t nr, int64_t d0, int64_t w, float *dst,
                       int64_t ldd) {
  for (int64_t r = 0; r < nr; r++) {
    const uint16_t *p = (const uint16_t *)src[r] + d0;
    float *o = dst + r * ldd;
    int64_t c = 0;
    for (; c + 16 <= w; c += 16) {
      float32x4_t x0, x1, x2, x3;
      ld8(p, c, 1, &x0, &x1);
      ld8(p, c + 8, 1, &x2, &x3);
      vst1q_f32(o + c, x0);
      vst1q_f32(o + c + 4, x1);
      vst1q_f32(o + c + 8, x2);
      vst1q_f32(o + c + 12, x3);
    }
    for (; c + 4 <= w; c += 4) vst1q_f32(o + c, ld4(p, c, 1));
    for (; c < w; c++) o[c] = armllm_bf16_to_f32(p[c]);
  }
}

static inline __attribute__((always_inline)) void neon_partial_t(
    const armllm_attn_args *a, int64_t b, int64_t kvh, int nq, const float *const *q,
    const int64_t *lo, const int64_t *hi, int64_t p, float *m, float *l, float *accp, int bf16) {
  const int64_t hd = a->head_dim;
  const void *kr[PART], *vr[PART];
  int64_t k0;
  const int64_t n = armllm_attn_partition_rows(a, b, kvh, nq, lo, hi, p, bf16 ? 2 : 4, kr, vr,
                                               &k0);
  const int64_t n4 = (n + 3) & ~(int64_t)3;
  float s[QMAX][PART] __attribute__((aligned(16)));
  const float32x4_t vscale = vdupq_n_f32(a->scale);
  /* bf16 with more than one query group: each 4 keys are widened once into
   * kbuf and the groups run the f32 tile on it (exact, so the same bits) */
  const int kwide = bf16 && nq > 4;
  float kbuf[4][MAXHD] __attribute__((aligned(16)));
  const void *kw[4] = {kbuf[0], kbuf[1], kbuf[2], kbuf[3]};
  for (int64_t j = 0; j < n4; j += 4) {
    if (kwide) widen_rows(kr + j, 4, 0, hd, kbuf[0], MAXHD);
    for (int i = 0; i < nq; i += 4) {
      float32x4_t d[4];
#define QK_CASES(K, BF)                                          \
      switch (nq - i >= 4 ? 4 : nq - i) {                        \
        case 4: qk_tile(q + i, K, hd, BF, 4, d); break;          \
        case 3: qk_tile(q + i, K, hd, BF, 3, d); break;          \
        case 2: qk_tile(q + i, K, hd, BF, 2, d); break;          \
        default: qk_tile(q + i, K, hd, BF, 1, d); break;         \
      }
      if (kwide) {
        QK_CASES(kw, 0)
      } else {
        QK_CASES(kr + j, bf16)
      }
#undef QK_CASES
      for (int t = 0; t < 4 && i + t < nq; t++) vst1q_f32(&s[i + t][j], vmulq_f32(d[t], vscale));
    }
  }
  for (int i = 0; i < nq; i++) { /* mask, softmax numerators */
    float *si = s[i];
    int64_t a0, a1;
    if (!armllm_attn_mask_scores(si, lo[i], hi[i], k0, n, n4, &a0, &a1)) { /* not merged */
      m[i] = -INFINITY;
      l[i] = 0.0f;
      continue;
    }
    float32x4_t vm = vdupq_n_f32(-INFINITY);
    int64_t j = a0;
    for (; j + 4 <= a1; j += 4) vm = vmaxq_f32(vm, vld1q_f32(si + j));
    float mp = vmaxvq_f32(vm);
    for (; j < a1; j++) mp = si[j] > mp ? si[j] : mp;
    const float32x4_t vmp = vdupq_n_f32(mp);
    float32x4_t vl = vdupq_n_f32(0.0f);
    for (j = a0; j + 4 <= a1; j += 4) {
      const float32x4_t ev = armllm_vexpq_f32(vsubq_f32(vld1q_f32(si + j), vmp));
      vst1q_f32(si + j, ev);
      vl = vaddq_f32(vl, ev);
    }
    float lp = vaddvq_f32(vl);
    for (; j < a1; j++) {
      si[j] = armllm_exp_scalar(si[j] - mp);
      lp += si[j];
    }
    m[i] = mp;
    l[i] = lp;
  }
#define PV_CASES(V, BF, W)                                                           \
    switch (nq - i >= 4 ? 4 : nq - i) {                                                  \
      case 4: pv_tile(s[i], PART, V, n4, d0, BF, 4, W, accp + i * hd, hd); break;    \
      case 3: pv_tile(s[i], PART, V, n4, d0, BF, 3, W, accp + i * hd, hd); break;    \
      case 2: pv_tile(s[i], PART, V, n4, d0, BF, 2, W, accp + i * hd, hd); break;    \
      default: pv_tile(s[i], PART, V, n4, d0, BF, 1, W, accp + i * hd, hd); break;   \
    }
  int i = 0;
  if (bf16) /* 8-query tiles: each widened V vector feeds 8 queries */
    for (; i + 8 <= nq; i += 8) {
      int64_t d0 = 0;
      for (; d0 + 8 <= hd; d0 += 8) pv_tile(s[i], PART, vr, n4, d0, 1, 8, 8, accp + i * hd, hd);
      for (; d0 + 4 <= hd; d0 += 4) { /* the rest as 4-query tiles */
        pv_tile(s[i], PART, vr, n4, d0, 1, 4, 4, accp + i * hd, hd);
        pv_tile(s[i + 4], PART, vr, n4, d0, 1, 4, 4, accp + (i + 4) * hd, hd);
      }
      pv_cols(s[i], vr, n4, d0, hd, 1, 8, accp + i * hd);
    }
  for (; i < nq; i += 4) {
    const int nqi = nq - i >= 4 ? 4 : nq - i;
    int64_t d0 = 0;
    if (bf16 && nqi == 4) /* 4 x 8: no accumulator copies (GCC) at 4 x 16 */
      for (; d0 + 8 <= hd; d0 += 8) pv_tile(s[i], PART, vr, n4, d0, 1, 4, 8, accp + i * hd, hd);
    for (; d0 + 16 <= hd; d0 += 16) PV_CASES(vr, bf16, 16)
    for (; d0 + 4 <= hd; d0 += 4) PV_CASES(vr, bf16, 4)
    pv_cols(s[i], vr, n4, d0, hd, bf16, nqi, accp + i * hd);
  }
#undef PV_CASES
}

static void neon_partial_f32(const armllm_attn_args *a, int64_t b, int64_t kvh, int nq,
                             const float *const *q, const int64_t *lo, const int64_t *hi,
                             int64_t p, float *m, float *l, float *accp) {
  neon_partial_t(a, b, kvh, nq, q, lo, hi, p, m, l, accp, 0);
}

static void neon_partial_bf16(const armllm_attn_args *a, int64_t b, int64_t kvh, int nq,
                              const float *const *q, const int64_t *lo, const int64_t *hi,
                              int64_t p, float *m, float *l, float *accp) {
  neon_partial_t(a, b, kvh, nq, q, lo, hi, p, m, l, accp, 1);
}

/* --------------------------------------------------------------- driver */

typedef struct {
  const armllm_attn_args *a;
  armllm_attn_partial_fn partial;
  int64_t group, tr, hcs, nhc, nparts;
} attn_job;

typedef struct {
  int64_t b, row0, nrows, h0, nh, p0, p1;
  int nq;
  const float *q[QMAX];
  int64_t lo[QMAX], hi[QMAX];
} attn_tile;

/* The tile starting at row r (0 if r does not start one). */
static int tile_at(const attn_job *j, int64_t r, int64_t kvh, int64_t hc, attn_tile *t) {
  const armllm_attn_args *a = j->a;
  const int64_t b = armllm_attn_seq_of_row(a, r);
  if ((r - a->query_start[b]) % j->tr != 0) return 0;
  t->b = b;
  t->row0 = r;
  t->nrows = a->query_start[b + 1] - r < j->tr ? a->query_start[b + 1] - r : j->tr;
  t->h0 = kvh * j->group + hc * j->hcs;
  t->nh = j->group - hc * j->hcs < j->hcs ? j->group - hc * j->hcs : j->hcs;
  t->nq = (int)(t->nrows * t->nh);
  int64_t lmin = INT64_MAX, hmax = 0;
  for (int64_t i = 0; i < t->nrows; i++) {
    const int64_t pos = armllm_attn_pos(a, b, r + i), lo = armllm_attn_lo(a, pos);
    lmin = lo < lmin ? lo : lmin;
    hmax = pos + 1 > hmax ? pos + 1 : hmax;
    for (int64_t h = 0; h < t->nh; h++) {
      t->q[i * t->nh + h] = a->q + (r + i) * a->ldq + (t->h0 + h) * a->head_dim;
      t->lo[i * t->nh + h] = lo;
      t->hi[i * t->nh + h] = pos + 1;
    }
  }
  t->p0 = lmin / PART;
  t->p1 = (hmax - 1) / PART;
  return 1;
}

static inline int in_part(const attn_tile *t, int i, int64_t p) {
  return t->lo[i] / PART <= p && p <= (t->hi[i] - 1) / PART;
}

static void finish(float *out, const float *acc, float l, int64_t hd) {
  const float32x4_t vl = vdupq_n_f32(l);
  int64_t d = 0;
  for (; d + 4 <= hd; d += 4) vst1q_f32(out + d, vdivq_f32(vld1q_f32(acc + d), vl));
  for (; d < hd; d++) out[d] = acc[d] / l;
}

static void attn_items(void *ctx, int64_t i0, int64_t i1) {
  const attn_job *j = ctx;
  const armllm_attn_args *a = j->a;
  const int64_t hd = a->head_dim, per_row = a->n_kv_heads * j->nhc;
  float acc[QMAX][MAXHD] __attribute__((aligned(16)));
  float accp[QMAX * MAXHD] __attribute__((aligned(16)));
  float m[QMAX], l[QMAX];
  armllm_softmax_state st[QMAX];
  for (int64_t item = i0; item < i1; item++) {
    attn_tile t;
    if (!tile_at(j, item / per_row, (item % per_row) / j->nhc, item % j->nhc, &t)) continue;
    for (int i = 0; i < t.nq; i++) st[i].have = 0;
    for (int64_t p = t.p0; p <= t.p1; p++) {
      j->partial(a, t.b, (item % per_row) / j->nhc, t.nq, t.q, t.lo, t.hi, p, m, l, accp);
      for (int i = 0; i < t.nq; i++)
        if (in_part(&t, i, p)) armllm_attn_merge(&st[i], acc[i], m[i], l[i], accp + i * hd, hd);
    }
    for (int i = 0; i < t.nq; i++)
      finish(a->out + (t.row0 + i / t.nh) * a->ldo + (t.h0 + i % t.nh) * hd, acc[i], st[i].l, hd);
  }
}

/* Split pass 1: items (row, KV head, chunk, partition) -> scratch partials. */
static void attn_split_items(void *ctx, int64_t i0, int64_t i1) {
  const attn_job *j = ctx;
  const armllm_attn_args *a = j->a;
  const int64_t hd = a->head_dim, per_row = a->n_kv_heads * j->nhc * j->nparts;
  float accp[QMAX * MAXHD] __attribute__((aligned(16)));
  float m[QMAX], l[QMAX];
  for (int64_t item = i0; item < i1; item++) {
    const int64_t r = item / per_row, rest = item % per_row, p = rest % j->nparts;
    const int64_t kvh = rest / j->nparts / j->nhc, hc = rest / j->nparts % j->nhc;
    attn_tile t;
    if (!tile_at(j, r, kvh, hc, &t) || p < t.p0 || p > t.p1) continue;
    j->partial(a, t.b, kvh, t.nq, t.q, t.lo, t.hi, p, m, l, accp);
    for (int i = 0; i < t.nq; i++) {
      if (!in_part(&t, i, p)) continue;
      const int64_t row = t.row0 + i / t.nh, h = t.h0 + i % t.nh;
      float *dst = a->scratch + ((row * a->n_heads + h) * j->nparts + p) * (hd + 2);
      dst[0] = m[i];
      dst[1] = l[i];
      memcpy(dst + 2, accp + i * hd, (size_t)hd * sizeof(float));
    }
  }
}

/* Split pass 2: items (row, head) merge their partitions in order. */
static void attn_merge_items(void *ctx, int64_t i0, int64_t i1) {
  const attn_job *j = ctx;
  const armllm_attn_args *a = j->a;
  const int64_t hd = a->head_dim;
  float acc[MAXHD] __attribute__((aligned(16)));
  for (int64_t item = i0; item < i1; item++) {
    const int64_t row = item / a->n_heads, h = item % a->n_heads;
    const int64_t b = armllm_attn_seq_of_row(a, row);
    const int64_t pos = armllm_attn_pos(a, b, row), lo = armllm_attn_lo(a, pos);
    armllm_softmax_state st = {0.0f, 0.0f, 0};
    for (int64_t p = lo / PART; p <= pos / PART; p++) {
      const float *src = a->scratch + ((row * a->n_heads + h) * j->nparts + p) * (hd + 2);
      armllm_attn_merge(&st, acc, src[0], src[1], src + 2, hd);
    }
    finish(a->out + row * a->ldo + h * hd, acc, st.l, hd);
  }
}

__attribute__((visibility("hidden"))) int64_t armllm_neon_attn_run(
    armllm_pool *pool, const armllm_attn_args *a, armllm_attn_partial_fn partial) {
  const int64_t bad = armllm_attn_check(a);
  if (bad >= 0) return bad;
  const int64_t rows = a->query_start[a->n_seqs];
  if (rows <= 0) return -1;
  attn_job j = {a, partial, a->n_heads / a->n_kv_heads, 1, 1, 1, 1};
  j.hcs = j.group < QMAX ? j.group : QMAX;
  j.nhc = (j.group + j.hcs - 1) / j.hcs;
  j.tr = QMAX / j.hcs;
  int64_t tiles = 0, max_len = 0;
  for (int64_t b = 0; b < a->n_seqs; b++) {
    tiles += (a->query_start[b + 1] - a->query_start[b] + j.tr - 1) / j.tr;
    if (a->seq_lens[b] > max_len) max_len = a->seq_lens[b];
  }
  tiles *= a->n_kv_heads * j.nhc;
  j.nparts = (max_len + PART - 1) / PART;
  const int64_t threads = armllm_pool_threads(pool);
  if (threads > 1 && tiles < 2 * threads && j.nparts > 1 && a->scratch &&
      a->scratch_len >= armllm_attn_scratch_len(rows, a->n_heads, a->head_dim, max_len)) {
    const int64_t items = rows * a->n_kv_heads * j.nhc * j.nparts;
    armllm_pool_run(pool, items, armllm_pool_grain(pool, items, 4, 1), attn_split_items, &j);
    const int64_t mitems = rows * a->n_heads;
    armllm_pool_run(pool, mitems, armllm_pool_grain(pool, mitems, 2, 1), attn_merge_items, &j);
    return -1;
  }
  const int64_t items = rows * a->n_kv_heads * j.nhc;
  armllm_pool_run(pool, items, armllm_pool_grain(pool, items, 4, 1), attn_items, &j);
  return -1;
}

int64_t armllm_neon_attention(armllm_pool *pool, const armllm_attn_args *args) {
  return armllm_neon_attn_run(pool, args, args->cache_bf16 ? neon_partial_bf16 : neon_partial_f32);
}
