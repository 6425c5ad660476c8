/* neon_mmla/attn.c: varlen paged attention on Armv8.6 BFMMLA (bf16 caches).
 *
 * Only the per-partition kernel is new: the driver (tiles of query rows x
 * the query heads of one KV head, partition-ordered merges, split-KV with
 * scratch) is attn_arm.c's, so split and unsplit runs compute every
 * partition with this same code and return the same bits. f32 and int8
 * caches run the neon kernel as it is (exact f32 path; int8 in integers
 * with SDOT, neon/attn.c).
 *
 * BFMMLA c += A B^T takes A = 2 rows x 4 k and B = 2 rows x 4 k (8 bf16
 * each, row-major) and accumulates the 2x2 product into 4 f32 lanes
 * [a0b0, a0b1, a1b0, a1b1]. Per partition, for a tile's nq <= 16 query
 * vectors (NP = ceil(nq/2) query pairs; an odd last pair has a zero row):
 *   Q is rounded to bf16 (BFCVTN, nearest even) and packed as A operands,
 *     qa[g][pair] = q[2pr][4g..4g+3], q[2pr+1][4g..4g+3] (dims past
 *     head_dim zero);
 *   S = scale * Q K^T: NP pairs x 2 key pairs (4 keys) of accumulators over
 *     head_dim (tiles of <= 4 pairs, 6..8 pairs as two such halves: two
 *     chains, even and odd dim groups, added at the end; 5 pairs: one chain;
 *     1 pair: two key groups per tile); B operands are packed per 4 keys
 *     (pack_k, 64-bit moves in general registers): 8 dims of keys j, j+1
 *     give (keys j, j+1) x (dims d..d+3) and (d+4..d+7);
 *   keys outside a vector's [lo, pos] get weight exactly 0; E = vexp(S - m)
 *     in f32 (the shared exp), then rounded to bf16 and packed as A
 *     operands pa[key group][pair] = E[2pr][4j..4j+3], E[2pr+1][4j..4j+3];
 *     l = the sum of the rounded weights (so the output is a convex
 *     combination of V rows);
 *   acc = P V: the V rows are packed once per chunk of 32 columns as B
 *     operands (2 columns x 4 keys of V^T; ST4 of 4 key rows writes that
 *     layout), then blocks of NP pairs x C column pairs (C = 16/8/4/2 by NP)
 *     run loads + BFMMLA only, one chain per output over the keys in order.
 * Every sum order depends only on NP and head_dim, never on the thread
 * count or on splitting.
 * Accuracy: q and E carry a relative error of 2^-9 each; with |V| <= 1 the
 * output stays well inside the header's 2^-5 * max|V| for bf16-compute
 * variants. */
#include <arm_neon.h>
#include <math.h>

#include "../armllm_kernels.h"
#include "../attn_arm.h"
#include "../attn_common.h"
#include "../neon/attn_neon.h"

#define QMAX ARMLLM_ATTN_QMAX
#define PMAX (QMAX / 2)
#define PART ARMLLM_ATTN_PARTITION
#define MAXHD ARMLLM_ATTN_MAX_HEAD_DIM

#define AI static inline __attribute__((always_inline))

AI bfloat16x8_t as_bf16(uint16x8_t u) { return vreinterpretq_bf16_u16(u); }

/* 4 floats of a row from dim d, zero past hd. */
AI float32x4_t ld_q4(const float *row, int64_t d, int64_t hd) {
  if (d + 4 <= hd) return vld1q_f32(row + d);
  float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t e = d; e < hd; e++) t[e - d] = row[e];
  return vld1q_f32(t);
}

/* 4 bf16 of a cache row from dim d (zero past hd), in the low half. */
AI uint16x8_t ld_kv4(const uint16_t *row, int64_t d, int64_t hd) {
  if (d + 4 <= hd) return vcombine_u16(vld1_u16(row + d), vdup_n_u16(0));
  uint16_t t[4] = {0, 0, 0, 0};
  for (int64_t e = d; e < hd; e++) t[e - d] = row[e];
  return vcombine_u16(vld1_u16(t), vdup_n_u16(0));
}

/* Columns d..d+3 of a V row in the low half: a plain load, or the padded one. */
AI uint16x8_t ld_v4(const uint16_t *row, int64_t d, int64_t hd, int tail) {
  return tail ? ld_kv4(row, d, hd) : vcombine_u16(vld1_u16(row + d), vdup_n_u16(0));
}

/* qa[(g*np + pr)*8 + h*4 + i] = bf16(q[2pr+h][4g+i]), zero past nq / hd. */
static void pack_q(const float *const *q, int nq, int64_t hd, uint16_t *qa) {
  const int np = (nq + 1) / 2;
  const int64_t G = (hd + 3) / 4;
  for (int pr = 0; pr < np; pr++) {
    const float *r0 = q[2 * pr], *r1 = 2 * pr + 1 < nq ? q[2 * pr + 1] : NULL;
    for (int64_t g = 0; g < G; g++) {
      bfloat16x8_t v = vcvtq_low_bf16_f32(ld_q4(r0, 4 * g, hd));
      if (r1) v = vcvtq_high_bf16_f32(v, ld_q4(r1, 4 * g, hd));
      vst1q_u16(qa + (g * np + pr) * 8, vreinterpretq_u16_bf16(v));
    }
  }
}

/* Packs keys k[0..3] as the QK B operands, kb per 8 dims: (keys 0,1 x dims
 * d..d+3), (keys 2,3 x d..d+3), (keys 0,1 x d+4..d+7), (keys 2,3 x d+4..d+7),
 * 8 bf16 each; a 4-dim tail (zero past hd) gives the first two. 64-bit moves
 * through general registers (the empty asm keeps them there), so packing
 * leaves the vector pipes to BFMMLA. */
AI void pack_k(const void *const *k, int64_t hd, uint16_t *kb) {
  const uint16_t *r[4] = {k[0], k[1], k[2], k[3]}; /* void * -> uint16_t * */
  int64_t d = 0;
  for (; d + 8 <= hd; d += 8, kb += 32) {
    uint64_t x[4][2];
    for (int i = 0; i < 4; i++) {
      memcpy(&x[i][0], r[i] + d, 8);
      memcpy(&x[i][1], r[i] + d + 4, 8);
      __asm__("" : "+r"(x[i][0]), "+r"(x[i][1]));
    }
    for (int h = 0; h < 2; h++)
      for (int i = 0; i < 4; i++) memcpy(kb + 16 * h + 4 * i, &x[i][h], 8);
  }
  for (; d < hd; d += 4, kb += 16)
    for (int i = 0; i < 4; i++) {
      uint16_t t[4] = {0, 0, 0, 0};
      for (int64_t e = d; e < hd && e < d + 4; e++) t[e - d] = r[i][e];
      memcpy(kb + 4 * i, t, 8);
    }
}

/* S tile of NP query pairs (of NT in qa, from qa's first) x KG groups of 4
 * keys (packed by pack_k, kb + 4*hdp per group): acc[pr][2kg + kp] lanes [q(2pr).k(2kp), q(2pr).k(2kp+1),
 * q(2pr+1).k(2kp), q(2pr+1).k(2kp+1)] of group kg.
 * NP <= 4: two BFMMLA chains, over the even and the odd dim groups (a
 * 4-dim tail joins the even one), added at the end, so that short tiles
 * are not bound by BFMMLA latency; NP > 4: one chain in group order.
 * KG = 2 (NP = 1 only) interleaves two key groups' independent chains.
 * qk_keys runs tiles of 6..8 pairs as two halves of <= 4 (two chains each). */
AI void qk_tile(const uint16_t *qa, const uint16_t *kb, int64_t hdp, int64_t hd, const int NP,
                const int NT, const int KG, float32x4_t acc[PMAX][4]) {
  const int SPLIT = NP <= 4;
  float32x4_t acc2[PMAX / 2][4];
  _Pragma("GCC unroll 8") for (int pr = 0; pr < NP; pr++)
    _Pragma("GCC unroll 4") for (int c = 0; c < 2 * KG; c++) acc[pr][c] = vdupq_n_f32(0.0f);
  if (SPLIT)
    _Pragma("GCC unroll 4") for (int pr = 0; pr < NP; pr++)
      _Pragma("GCC unroll 4") for (int c = 0; c < 2 * KG; c++) acc2[pr][c] = vdupq_n_f32(0.0f);
  int64_t d = 0;
  const uint16_t *ap = qa;
  for (; d + 8 <= hd; d += 8, kb += 32) {
    bfloat16x8_t b0[4], b1[4];
    _Pragma("GCC unroll 2") for (int kg = 0; kg < KG; kg++) {
      b0[2 * kg] = as_bf16(vld1q_u16(kb + kg * 4 * hdp));
      b0[2 * kg + 1] = as_bf16(vld1q_u16(kb + kg * 4 * hdp + 8));
      b1[2 * kg] = as_bf16(vld1q_u16(kb + kg * 4 * hdp + 16));
      b1[2 * kg + 1] = as_bf16(vld1q_u16(kb + kg * 4 * hdp + 24));
    }
    _Pragma("GCC unroll 8") for (int pr = 0; pr < NP; pr++) {
      const bfloat16x8_t a = as_bf16(vld1q_u16(ap + pr * 8));
      _Pragma("GCC unroll 4") for (int c = 0; c < 2 * KG; c++) acc[pr][c] = vbfmmlaq_f32(acc[pr][c], a, b0[c]);
    }
    _Pragma("GCC unroll 8") for (int pr = 0; pr < NP; pr++) {
      const bfloat16x8_t a = as_bf16(vld1q_u16(ap + (NT + pr) * 8));
      _Pragma("GCC unroll 4") for (int c = 0; c < 2 * KG; c++) {
        if (SPLIT)
          acc2[pr][c] = vbfmmlaq_f32(acc2[pr][c], a, b1[c]);
        else
          acc[pr][c] = vbfmmlaq_f32(acc[pr][c], a, b1[c]);
      }
    }
    ap += 16 * NT;
  }
  for (; d < hd; d += 4, kb += 16) { /* 4 dims, then a zero-padded 1..3 */
    bfloat16x8_t b0[4];
    _Pragma("GCC unroll 2") for (int kg = 0; kg < KG; kg++) {
      b0[2 * kg] = as_bf16(vld1q_u16(kb + kg * 4 * hdp));
      b0[2 * kg + 1] = as_bf16(vld1q_u16(kb + kg * 4 * hdp + 8));
    }
    _Pragma("GCC unroll 8") for (int pr = 0; pr < NP; pr++) {
      const bfloat16x8_t a = as_bf16(vld1q_u16(ap + pr * 8));
      _Pragma("GCC unroll 4") for (int c = 0; c < 2 * KG; c++) acc[pr][c] = vbfmmlaq_f32(acc[pr][c], a, b0[c]);
    }
    ap += 8 * NT;
  }
  if (SPLIT)
    _Pragma("GCC unroll 4") for (int pr = 0; pr < NP; pr++)
      _Pragma("GCC unroll 4") for (int c = 0; c < 2 * KG; c++) acc[pr][c] = vaddq_f32(acc[pr][c], acc2[pr][c]);
}

/* S rows [s + i*PART + j0 .. +4*KG) = scale * dots, for all NP pairs. */
AI void qk_keys(const uint16_t *qa, const uint16_t *kb, int64_t hdp, int64_t hd, const int NP,
                const int KG, int nq, float32x4_t vscale, float *s, int64_t j0) {
  float32x4_t acc[PMAX][4];
  const int H = NP >= 6 ? (NP + 1) / 2 : NP; /* pairs of the first tile */
  qk_tile(qa, kb, hdp, hd, H, NP, KG, acc);
  if (H < NP) {
    float32x4_t acc1[PMAX][4];
    qk_tile(qa + H * 8, kb, hdp, hd, NP - H, NP, KG, acc1);
    _Pragma("GCC unroll 4") for (int pr = H; pr < NP; pr++)
      _Pragma("GCC unroll 4") for (int c = 0; c < 2 * KG; c++) acc[pr][c] = acc1[pr - H][c];
  }
  _Pragma("GCC unroll 8") for (int pr = 0; pr < NP; pr++)
    _Pragma("GCC unroll 2") for (int kg = 0; kg < KG; kg++) {
      const float64x2_t c0 = vreinterpretq_f64_f32(acc[pr][2 * kg]);
      const float64x2_t c1 = vreinterpretq_f64_f32(acc[pr][2 * kg + 1]);
      vst1q_f32(s + (2 * pr) * PART + j0 + 4 * kg,
                vmulq_f32(vreinterpretq_f32_f64(vtrn1q_f64(c0, c1)), vscale));
      if (2 * pr + 1 < nq)
        vst1q_f32(s + (2 * pr + 1) * PART + j0 + 4 * kg,
                  vmulq_f32(vreinterpretq_f32_f64(vtrn2q_f64(c0, c1)), vscale));
    }
}

#define VCH 32 /* V columns per packed chunk */

/* Packs columns d0..d0+VCH-1 of the partition's V rows (zero past hd) as
 * BFMMLA B operands: vb[(g*(VCH/2) + c)*8 ..] = columns (d0+2c, d0+2c+1) x
 * keys 4g..4g+3, i.e. V^T rows of 4 keys. ST4 of 4 key rows (8 columns
 * each) writes exactly this layout for 4 column pairs. */
static void pack_v(const void *const *vr, int64_t n4, int64_t d0, int64_t hd, uint16_t *vb) {
  for (int64_t j = 0; j < n4; j += 4, vb += VCH * 4)
    for (int sb = 0; sb < VCH / 8; sb++) {
      const int64_t c0 = d0 + 8 * sb;
      uint16x8x4_t t;
      if (c0 + 8 <= hd) {
        for (int r = 0; r < 4; r++) t.val[r] = vld1q_u16((const uint16_t *)vr[j + r] + c0);
      } else if (c0 < hd) {
        for (int r = 0; r < 4; r++) {
          const uint16_t *row = vr[j + r];
          uint16_t u[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          for (int64_t e = c0; e < hd; e++) u[e - c0] = row[e];
          t.val[r] = vld1q_u16(u);
        }
      } else {
        t.val[0] = t.val[1] = t.val[2] = t.val[3] = vdupq_n_u16(0);
      }
      vst4q_u16(vb + 32 * sb, t);
    }
}

/* acc = P V for NP pairs x C column pairs (columns d0 + 2cb .. d0 + 2(cb+C) - 1
 * of the packed chunk vb): one BFMMLA chain per output over the key groups in
 * order; the loop is loads + BFMMLA only. Columns past hd are not stored. */
AI void pv_block(const uint16_t *pa, const uint16_t *vb, int64_t ng, int64_t d0, int cb,
                 int64_t hd, const int NP, const int C, int nq, float *accp) {
  float32x4_t acc[PMAX][VCH / 2];
  _Pragma("GCC unroll 8") for (int pr = 0; pr < NP; pr++)
    _Pragma("GCC unroll 16") for (int c = 0; c < C; c++) acc[pr][c] = vdupq_n_f32(0.0f);
  const uint16_t *ap = pa, *bp = vb + cb * 8;
  for (int64_t g = 0; g < ng; g++) {
    bfloat16x8_t bb[VCH / 2];
    _Pragma("GCC unroll 16") for (int c = 0; c < C; c++) bb[c] = as_bf16(vld1q_u16(bp + c * 8));
    _Pragma("GCC unroll 8") for (int pr = 0; pr < NP; pr++) {
      const bfloat16x8_t a = as_bf16(vld1q_u16(ap + pr * 8));
      _Pragma("GCC unroll 16") for (int c = 0; c < C; c++) acc[pr][c] = vbfmmlaq_f32(acc[pr][c], a, bb[c]);
    }
    ap += 8 * NP;
    bp += VCH * 4;
  }
  _Pragma("GCC unroll 8") for (int pr = 0; pr < NP; pr++)
    _Pragma("GCC unroll 8") for (int h = 0; h < C / 2; h++) {
      const int64_t col = d0 + 2 * cb + 4 * h;
      const int64_t w = hd - col < 4 ? hd - col : 4;
      if (w <= 0) break;
      const float64x2_t c0 = vreinterpretq_f64_f32(acc[pr][2 * h]);
      const float64x2_t c1 = vreinterpretq_f64_f32(acc[pr][2 * h + 1]);
      const float32x4_t row0 = vreinterpretq_f32_f64(vtrn1q_f64(c0, c1));
      const float32x4_t row1 = vreinterpretq_f32_f64(vtrn2q_f64(c0, c1));
      if (w == 4) {
        vst1q_f32(accp + (2 * pr) * hd + col, row0);
        if (2 * pr + 1 < nq) vst1q_f32(accp + (2 * pr + 1) * hd + col, row1);
      } else {
        float t[4];
        vst1q_f32(t, row0);
        memcpy(accp + (2 * pr) * hd + col, t, (size_t)w * sizeof *t);
        if (2 * pr + 1 < nq) {
          vst1q_f32(t, row1);
          memcpy(accp + (2 * pr + 1) * hd + col, t, (size_t)w * sizeof *t);
        }
      }
    }
}

/* Weights (s rows, stride PART) -> bf16 A operands pa[(g*np + pr)*8 + h*4 + i]
 * = bf16(s[2pr+h][4g+i]); l[i] = the sum of row i's rounded weights. */
static void pack_p(const float *s, int nq, int64_t n4, float *l, uint16_t *pa) {
  const int np = (nq + 1) / 2;
  const float32x4_t zero = vdupq_n_f32(0.0f);
  for (int pr = 0; pr < np; pr++) {
    const float *s0 = s + (2 * pr) * PART, *s1 = 2 * pr + 1 < nq ? s0 + PART : NULL;
    float32x4_t l0 = zero, l1 = zero;
    for (int64_t j = 0, g = 0; j < n4; j += 4, g++) {
      bfloat16x8_t v = vcvtq_low_bf16_f32(vld1q_f32(s0 + j));
      v = vcvtq_high_bf16_f32(v, s1 ? vld1q_f32(s1 + j) : zero);
      const uint16x8_t u = vreinterpretq_u16_bf16(v);
      vst1q_u16(pa + (g * np + pr) * 8, u);
      l0 = vaddq_f32(l0, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(u), 16)));
      l1 = vaddq_f32(l1, vreinterpretq_f32_u32(vshll_high_n_u16(u, 16)));
    }
    l[2 * pr] = vaddvq_f32(l0);
    if (s1) l[2 * pr + 1] = vaddvq_f32(l1);
  }
}

/* S = scale * Q K^T for all keys (q rounded and packed here), and
 * acc = P V with P the rounded weights of s (packed here, l their sums):
 * one instance per NP. */
#define MM_FN(NP)                                                                                \
  static void qk_##NP(const float *const *q, int nq, const void *const *kr, int64_t n4,          \
                      int64_t hd, float scale, float *s) {                                       \
    uint16_t qa[(MAXHD / 4) * PMAX * 8] __attribute__((aligned(16)));                            \
    pack_q(q, nq, hd, qa);                                                                       \
    const float32x4_t vscale = vdupq_n_f32(scale);                                               \
    uint16_t kb[2 * MAXHD * 4] __attribute__((aligned(16)));                                     \
    const int64_t hdp = (hd + 3) & ~(int64_t)3; /* packed dims per key */                        \
    int64_t j = 0;                                                                               \
    if (NP == 1) /* two key groups per tile: 8 independent chains */                             \
      for (; j + 8 <= n4; j += 8) {                                                              \
        pack_k(kr + j, hd, kb);                                                                  \
        pack_k(kr + j + 4, hd, kb + 4 * hdp);                                                    \
        qk_keys(qa, kb, hdp, hd, NP, 2, nq, vscale, s, j);                                       \
      }                                                                                          \
    for (; j < n4; j += 4) {                                                                     \
      pack_k(kr + j, hd, kb);                                                                    \
      qk_keys(qa, kb, hdp, hd, NP, 1, nq, vscale, s, j);                                         \
    }                                                                                            \
  }                                                                                              \
  static void pv_##NP(const float *s, int nq, const void *const *vr, int64_t n4, int64_t hd,     \
                      float *l, float *accp) {                                                   \
    uint16_t pa[(PART / 4) * PMAX * 8] __attribute__((aligned(16)));                             \
    uint16_t vb[(PART / 4) * VCH * 4] __attribute__((aligned(16)));                              \
    pack_p(s, nq, n4, l, pa);                                                                    \
    /* column pairs per block (<= 32 registers); C/2 when at most that many are left */          \
    enum { C = NP == 1 ? 16 : NP == 2 ? 8 : NP <= 5 ? 4 : 2, CH = C >= 4 ? C / 2 : C };           \
    for (int64_t d0 = 0; d0 < hd; d0 += VCH) {                                                   \
      pack_v(vr, n4, d0, hd, vb);                                                                \
      const int ncp = (int)((hd - d0 < VCH ? hd - d0 : VCH) + 1) / 2;                            \
      for (int cb = 0; cb < ncp;)                                                                \
        if (ncp - cb > CH) {                                                                     \
          pv_block(pa, vb, n4 / 4, d0, cb, hd, NP, C, nq, accp);                                 \
          cb += C;                                                                               \
        } else {                                                                                 \
          pv_block(pa, vb, n4 / 4, d0, cb, hd, NP, CH, nq, accp);                                \
          cb += CH;                                                                              \
        }                                                                                        \
    }                                                                                            \
  }
MM_FN(1) MM_FN(2) MM_FN(3) MM_FN(4) MM_FN(5) MM_FN(6) MM_FN(7) MM_FN(8)
#undef MM_FN

typedef void (*qk_fn)(const float *const *, int, const void *const *, int64_t, int64_t, float,
                      float *);
typedef void (*pv_fn)(const float *, int, const void *const *, int64_t, int64_t, float *, float *);
static const qk_fn qk_by_np[PMAX + 1] = {NULL, qk_1, qk_2, qk_3, qk_4, qk_5, qk_6, qk_7, qk_8};
static const pv_fn pv_by_np[PMAX + 1] = {NULL, pv_1, pv_2, pv_3, pv_4, pv_5, pv_6, pv_7, pv_8};

static void mmla_partial_bf16(const armllm_attn_args *a, int64_t b, int64_t kvh, int nq,
                              const float *const *q, const armllm_attn_q8 *q8, const int64_t *lo,
                              const int64_t *hi, int64_t p, float *m, float *l, float *accp) {
  (void)q8; /* int8 caches only */
  const int64_t hd = a->head_dim;
  armllm_attn_keys keys;
  armllm_attn_keys_of(&keys, a, b, kvh, nq, lo, hi, p, 2);
  const void *const *kr = keys.kr, *const *vr = keys.vr;
  const int64_t n4 = keys.n4;
  const int np = (nq + 1) / 2;
  float s[QMAX][PART] __attribute__((aligned(16)));

  qk_by_np[np](q, nq, kr, n4, hd, a->scale, &s[0][0]);

  /* f32 softmax numerators; l comes from the rounded weights (pv) */
  armllm_attn_softmax(&s[0][0], nq, lo, hi, keys.k0, keys.n, m, NULL, armllm_neon_softmax_row);
  pv_by_np[np](&s[0][0], nq, vr, n4, hd, l, accp); /* l: sums of the rounded weights */
}

int64_t armllm_neon_mmla_attention(armllm_pool *pool, const armllm_attn_args *args) {
  /* f32 caches: neon's exact f32 path; int8: neon's integer path (SDOT) */
  if (args->cache_dtype != ARMLLM_KV_BF16) return armllm_neon_attention(pool, args);
  return armllm_arm_attn_run(pool, args, mmla_partial_bf16);
}
