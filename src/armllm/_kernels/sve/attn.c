/* sve/attn.c: varlen paged attention, SVE, vector-length agnostic (f32
 * and bf16 caches in f32 math, bf16 widened with LD1H-to-word loads and
 * LSL #16; int8 caches in integers).
 *
 * Only the per-partition kernel is SVE: the driver (tiles of query rows x
 * the query heads of one KV head, partition-ordered merges, split-KV with
 * scratch) is attn_arm.c's, so every variant merges and splits
 * identically. Per partition, for a tile's nq query vectors:
 *   S = scale * Q K^T: 4 queries x 4 keys, one VL accumulator per dot over
 *     head_dim (WHILELT-predicated tail), reduced with FADDV;
 *   keys outside a vector's [lo, pos] get weight 0, E = vexp(S - max);
 *   acc = E V: 4 queries x up to 4 VL vectors of columns, keys in order,
 *     FMLA (indexed) against the weights replicated with LD1RQW.
 * bf16 whole 2 VL blocks skip the LSL: K and V are loaded as (even, odd)
 * element vectors by LD1H into odd halfword lanes (ld_even/ld_odd), queries
 * are pre-split with LD2W, PV accumulators re-interleaved with ST2W.
 * int8 caches as ref_partition_i8 (attn_common.h), q quantized by the
 * driver (armllm_attn_q8): QK^T with SDOT (4 x 4 int32 accumulators,
 * reduced with TRN/ADD and EXT/ADD), the same softmax, int16 weights
 * (armllm_attn_i8_w16_rows), and PV with 4 V rows transposed in registers
 * (ZIP) meeting the weights' high bytes by SDOT and low bytes by SUDOT
 * (I8MM, which this variant requires) by element: exact int32 sums.
 * kv_write is the neon one (memory-bound).
 *
 * The helpers take the cache's armllm_kv_dtype `dt`, a constant in each
 * instance. */
#include <arm_sve.h>
#include <math.h>

#include "../armllm_kernels.h"
#include "../attn_arm.h"
#include "../attn_common.h"
#include "vexp_sve.h"

#define QMAX ARMLLM_ATTN_QMAX
#define PART ARMLLM_ATTN_PARTITION

#define AI static inline __attribute__((always_inline))

/* VL floats (pg lanes; others 0) of f32, or widened from bf16 bits. */
AI svfloat32_t ldw(svbool_t pg, const void *p, int64_t off, int dt) {
  if (dt == ARMLLM_KV_BF16)
    return svreinterpret_f32_u32(
        svlsl_n_u32_x(svptrue_b32(), svld1uh_u32(pg, (const uint16_t *)p + off), 16));
  return svld1_f32(pg, (const float *)p + off);
}

/* bf16 pair widening without vector-pipe ops: LD1H into only the odd
 * halfword lanes (inactive lanes are zeroed and touch no memory) puts a
 * bf16 element in the high half of each word, i.e. an exact f32. From
 * p + d that gives the odd elements d+1, d+3, ..; from one element earlier
 * the even ones d, d+2, ... So 2 VL elements become (even, odd) vectors with
 * two loads and no shift; the PV accumulators are interleaved back with ST2W
 * at the end of the tile. */
AI svbool_t odd_h(void) { return svtrn2_b16(svpfalse_b(), svptrue_b16()); }

AI svfloat32_t ld_odd(svbool_t po, const void *p, int64_t d) {
  return svreinterpret_f32_u16(svld1_u16(po, (const uint16_t *)p + d));
}

AI svfloat32_t ld_even(svbool_t po, const void *p, int64_t d) {
  /* lane 0 (element d - 1) is inactive: no access before the row */
  return svreinterpret_f32_u16(
      svld1_u16(po, (const uint16_t *)((uintptr_t)p + (uintptr_t)(2 * d - 2))));
}

/* out[i*4 + u] = q_i . k_u for NQ queries and 4 keys; each dot is one VL
 * accumulator over head_dim then FADDV, so its bits do not depend on NQ.
 * PAIR (bf16): the whole 2 VL blocks of head_dim take K as (even, odd)
 * vectors (ld_even/ld_odd, no shifts) against qp, the queries with each
 * block stored as its even then its odd elements; the rest as without. */
AI void sve_qk_tile(const float *const *q, const float *const *qp, const void *const *k,
                    int64_t hd, int dt, const int NQ, float *out, const int PAIR) {
  const svbool_t all = svptrue_b32();
  const int64_t vl = (int64_t)svcntw();
  const svfloat32_t z = svdup_n_f32(0.0f);
  svfloat32_t a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z;
  svfloat32_t a20 = z, a21 = z, a22 = z, a23 = z, a30 = z, a31 = z, a32 = z, a33 = z;
  int64_t d = 0;
  if (PAIR) {
    const svbool_t po = odd_h();
    for (; d + 2 * vl <= hd; d += 2 * vl) {
      const svfloat32_t e0 = ld_even(po, k[0], d), o0 = ld_odd(po, k[0], d);
      const svfloat32_t e1 = ld_even(po, k[1], d), o1 = ld_odd(po, k[1], d);
      const svfloat32_t e2 = ld_even(po, k[2], d), o2 = ld_odd(po, k[2], d);
      const svfloat32_t e3 = ld_even(po, k[3], d), o3 = ld_odd(po, k[3], d);
#define QK_PAIR(I)                                                  \
      if (NQ > I) {                                                 \
        const svfloat32_t qe = svld1_f32(all, qp[I] + d);           \
        const svfloat32_t qo = svld1_f32(all, qp[I] + d + vl);      \
        a##I##0 = svmla_f32_x(all, svmla_f32_x(all, a##I##0, qe, e0), qo, o0); \
        a##I##1 = svmla_f32_x(all, svmla_f32_x(all, a##I##1, qe, e1), qo, o1); \
        a##I##2 = svmla_f32_x(all, svmla_f32_x(all, a##I##2, qe, e2), qo, o2); \
        a##I##3 = svmla_f32_x(all, svmla_f32_x(all, a##I##3, qe, e3), qo, o3); \
      }
      QK_PAIR(0) QK_PAIR(1) QK_PAIR(2) QK_PAIR(3)
#undef QK_PAIR
    }
  }
  for (; d < hd; d += vl) {
    const svbool_t pg = svwhilelt_b32_s64(d, hd);
    const svfloat32_t k0 = ldw(pg, k[0], d, dt), k1 = ldw(pg, k[1], d, dt);
    const svfloat32_t k2 = ldw(pg, k[2], d, dt), k3 = ldw(pg, k[3], d, dt);
#define QK_ROW(I)                                           \
    if (NQ > I) {                                           \
      const svfloat32_t qv = svld1_f32(pg, q[I] + d);       \
      a##I##0 = svmla_f32_x(all, a##I##0, qv, k0);          \
      a##I##1 = svmla_f32_x(all, a##I##1, qv, k1);          \
      a##I##2 = svmla_f32_x(all, a##I##2, qv, k2);          \
      a##I##3 = svmla_f32_x(all, a##I##3, qv, k3);          \
    }
    QK_ROW(0) QK_ROW(1) QK_ROW(2) QK_ROW(3)
#undef QK_ROW
  }
#define QK_OUT(I)                                                                   \
  if (NQ > I) {                                                                     \
    out[I * 4 + 0] = svaddv_f32(all, a##I##0);                                      \
    out[I * 4 + 1] = svaddv_f32(all, a##I##1);                                      \
    out[I * 4 + 2] = svaddv_f32(all, a##I##2);                                      \
    out[I * 4 + 3] = svaddv_f32(all, a##I##3);                                      \
  }
  QK_OUT(0) QK_OUT(1) QK_OUT(2) QK_OUT(3)
#undef QK_OUT
}

/* accp[i][d0 + c*VL ..] = sum over keys j in order of e_i[j] * V_j[...], for
 * NQ queries and NV (<= 4) column vectors; e rows padded with zeros to a
 * multiple of 4. Each output element is one fused chain over the keys.
 * PAIR (bf16, NV = 2 or 4, all NV*VL columns inside head_dim): vector 2c
 * holds the even and 2c+1 the odd columns of d0 + 2c*VL .. + 2VL. */
AI void sve_pv_tile(const float *e, int64_t lde, const void *const *vrow, int64_t n4,
                    int64_t d0, int64_t hd, int dt, const int NQ, const int NV, float *accp,
                    const int PAIR) {
  const svbool_t all = svptrue_b32();
  const int64_t vl = (int64_t)svcntw();
  const svbool_t po = odd_h();
  const svbool_t p0 = svwhilelt_b32_s64(d0, hd), p1 = svwhilelt_b32_s64(d0 + vl, hd);
  const svbool_t p2 = svwhilelt_b32_s64(d0 + 2 * vl, hd), p3 = svwhilelt_b32_s64(d0 + 3 * vl, hd);
  const svfloat32_t z = svdup_n_f32(0.0f);
  svfloat32_t c00 = z, c01 = z, c02 = z, c03 = z, c10 = z, c11 = z, c12 = z, c13 = z;
  svfloat32_t c20 = z, c21 = z, c22 = z, c23 = z, c30 = z, c31 = z, c32 = z, c33 = z;
  for (int64_t j = 0; j < n4; j += 4) {
    const svfloat32_t e0 = svld1rq_f32(all, e + j);
    const svfloat32_t e1 = NQ > 1 ? svld1rq_f32(all, e + lde + j) : z;
    const svfloat32_t e2 = NQ > 2 ? svld1rq_f32(all, e + 2 * lde + j) : z;
    const svfloat32_t e3 = NQ > 3 ? svld1rq_f32(all, e + 3 * lde + j) : z;
#define PV_FMA(I, C, U) \
    if (NQ > I && NV > C) c##I##C = svmla_lane_f32(c##I##C, v##C, e##I, U);
#define PV_KEY(U)                                                                      \
    {                                                                                  \
      const void *vp = vrow[j + U];                                                    \
      svfloat32_t v0, v1, v2, v3;                                                      \
      if (PAIR) {                                                                      \
        v0 = ld_even(po, vp, d0);                                                      \
        v1 = ld_odd(po, vp, d0);                                                       \
        v2 = NV > 2 ? ld_even(po, vp, d0 + 2 * vl) : z;                                \
        v3 = NV > 2 ? ld_odd(po, vp, d0 + 2 * vl) : z;                                 \
      } else {                                                                         \
        v0 = ldw(p0, vp, d0, dt);                                                      \
        v1 = NV > 1 ? ldw(p1, vp, d0 + vl, dt) : z;                                    \
        v2 = NV > 2 ? ldw(p2, vp, d0 + 2 * vl, dt) : z;                                \
        v3 = NV > 3 ? ldw(p3, vp, d0 + 3 * vl, dt) : z;                                \
      }                                                                                \
      PV_FMA(0, 0, U) PV_FMA(0, 1, U) PV_FMA(0, 2, U) PV_FMA(0, 3, U)                  \
      PV_FMA(1, 0, U) PV_FMA(1, 1, U) PV_FMA(1, 2, U) PV_FMA(1, 3, U)                  \
      PV_FMA(2, 0, U) PV_FMA(2, 1, U) PV_FMA(2, 2, U) PV_FMA(2, 3, U)                  \
      PV_FMA(3, 0, U) PV_FMA(3, 1, U) PV_FMA(3, 2, U) PV_FMA(3, 3, U)                  \
    }
    PV_KEY(0) PV_KEY(1) PV_KEY(2) PV_KEY(3)
#undef PV_KEY
#undef PV_FMA
  }
  if (PAIR) {
#define PV_ST2(I, C, D)                                                                  \
  if (NQ > I && NV > C) svst2_f32(all, accp + I * hd + d0 + C * vl, svcreate2_f32(c##I##C, c##I##D));
    PV_ST2(0, 0, 1) PV_ST2(0, 2, 3) PV_ST2(1, 0, 1) PV_ST2(1, 2, 3)
    PV_ST2(2, 0, 1) PV_ST2(2, 2, 3) PV_ST2(3, 0, 1) PV_ST2(3, 2, 3)
#undef PV_ST2
    return;
  }
#define PV_ST(I, C) \
  if (NQ > I && NV > C) svst1_f32(p##C, accp + I * hd + d0 + C * vl, c##I##C);
  PV_ST(0, 0) PV_ST(0, 1) PV_ST(0, 2) PV_ST(0, 3)
  PV_ST(1, 0) PV_ST(1, 1) PV_ST(1, 2) PV_ST(1, 3)
  PV_ST(2, 0) PV_ST(2, 1) PV_ST(2, 2) PV_ST(2, 3)
  PV_ST(3, 0) PV_ST(3, 1) PV_ST(3, 2) PV_ST(3, 3)
#undef PV_ST
}

#define NQ_CASES(CALL)            \
  switch (nqi) {                  \
    case 4: CALL(4); break;       \
    case 3: CALL(3); break;       \
    case 2: CALL(2); break;       \
    default: CALL(1); break;      \
  }

/* armllm_softmax_row_fn: predicated max, vexp and sum over the row */
AI float sve_softmax_row(float *si, int64_t a0, int64_t a1, float *sum) {
  const svbool_t all = svptrue_b32();
  const int64_t vl = (int64_t)svcntw();
  svfloat32_t vm = svdup_n_f32(-INFINITY);
  for (int64_t j = a0; j < a1; j += vl) {
    const svbool_t pg = svwhilelt_b32_s64(j, a1);
    vm = svmax_f32_m(pg, vm, svld1_f32(pg, si + j));
  }
  const float mp = svmaxv_f32(all, vm);
  svfloat32_t vsum = svdup_n_f32(0.0f);
  for (int64_t j = a0; j < a1; j += vl) {
    const svbool_t pg = svwhilelt_b32_s64(j, a1);
    const svfloat32_t ev = armllm_sve_vexp(pg, svsub_n_f32_x(pg, svld1_f32(pg, si + j), mp));
    svst1_f32(pg, si + j, ev);
    vsum = svadd_f32_m(pg, vsum, ev);
  }
  *sum = svaddv_f32(all, vsum);
  return mp;
}

AI void sve_partial_t(const armllm_attn_args *a, int64_t b, int64_t kvh, int nq,
                      const float *const *q, const armllm_attn_q8 *q8, const int64_t *lo,
                      const int64_t *hi, int64_t p, float *m, float *l, float *accp, int dt) {
  (void)q8; /* int8 caches: sve_partial_i8 */
  const int64_t hd = a->head_dim, vl = (int64_t)svcntw();
  const int bf16 = dt == ARMLLM_KV_BF16;
  const svbool_t all = svptrue_b32();
  armllm_attn_keys keys;
  armllm_attn_keys_of(&keys, a, b, kvh, nq, lo, hi, p, armllm_kv_esz(dt));
  const void *const *kr = keys.kr, *const *vr = keys.vr;
  const int64_t n4 = keys.n4;
  float s[QMAX][PART] __attribute__((aligned(16)));
  /* bf16: the queries' whole 2 VL blocks split into even and odd halves
   * (LD2W), to meet K widened as (even, odd) pairs in sve_qk_tile */
  float qd[QMAX][ARMLLM_ATTN_MAX_HEAD_DIM] __attribute__((aligned(16)));
  const float *qp[QMAX];
  for (int i = 0; i < nq && bf16; i++) {
    qp[i] = qd[i];
    for (int64_t d = 0; d + 2 * vl <= hd; d += 2 * vl) {
      const svfloat32x2_t x = svld2_f32(all, q[i] + d);
      svst1_f32(all, qd[i] + d, svget2_f32(x, 0));
      svst1_f32(all, qd[i] + d + vl, svget2_f32(x, 1));
    }
  }
  for (int64_t j = 0; j < n4; j += 4)
    for (int i = 0; i < nq; i += 4) {
      float d[16];
      const int nqi = nq - i >= 4 ? 4 : nq - i;
#define QK_CALL(N) sve_qk_tile(q + i, qp + i, kr + j, hd, dt, N, d, bf16)
      NQ_CASES(QK_CALL)
#undef QK_CALL
      for (int t = 0; t < nqi; t++)
        for (int u = 0; u < 4; u++) s[i + t][j + u] = d[t * 4 + u] * a->scale;
    }
  armllm_attn_softmax(&s[0][0], nq, lo, hi, keys.k0, keys.n, m, l, sve_softmax_row);
  for (int i = 0; i < nq; i += 4) {
    const int nqi = nq - i >= 4 ? 4 : nq - i;
    int64_t d0 = 0;
#define PV_CALL4P(N) sve_pv_tile(s[i], PART, vr, n4, d0, hd, dt, N, 4, accp + i * hd, 1)
#define PV_CALL2P(N) sve_pv_tile(s[i], PART, vr, n4, d0, hd, dt, N, 2, accp + i * hd, 1)
#define PV_CALL4(N) sve_pv_tile(s[i], PART, vr, n4, d0, hd, dt, N, 4, accp + i * hd, 0)
#define PV_CALL2(N) sve_pv_tile(s[i], PART, vr, n4, d0, hd, dt, N, 2, accp + i * hd, 0)
#define PV_CALL1(N) sve_pv_tile(s[i], PART, vr, n4, d0, hd, dt, N, 1, accp + i * hd, 0)
    if (bf16) { /* whole 4- and 2-vector column blocks: shift-free widening */
      for (; hd - d0 >= 4 * vl; d0 += 4 * vl) NQ_CASES(PV_CALL4P)
      if (hd - d0 >= 2 * vl) {
        NQ_CASES(PV_CALL2P)
        d0 += 2 * vl;
      }
    }
    for (; hd - d0 > 3 * vl; d0 += 4 * vl) NQ_CASES(PV_CALL4)
    if (hd - d0 > vl) {
      NQ_CASES(PV_CALL2)
      d0 += 2 * vl;
    }
    if (hd - d0 > 0) NQ_CASES(PV_CALL1)
#undef PV_CALL4P
#undef PV_CALL2P
#undef PV_CALL4
#undef PV_CALL2
#undef PV_CALL1
  }
}

ARMLLM_ATTN_PARTIAL(sve_partial_f32, sve_partial_t, ARMLLM_KV_F32)
ARMLLM_ATTN_PARTIAL(sve_partial_bf16, sve_partial_t, ARMLLM_KV_BF16)

/* ------------------------------------------- int8 caches, in integers */

/* QK^T: the exact int32 dots of NQ int8 queries q8[i] (zero-padded rows)
 * with 4 int8 keys, one SDOT accumulator per pair over head_dim (VL bytes
 * a step, WHILELT-predicated tail: inactive bytes load as 0), then per
 * query TRN1/TRN2 + ADD at 32 and 64 bits leave each 128-bit segment
 * holding its 4 keys' segment sums, and EXT + ADD sum the segments into
 * lanes 0-3 (no SADDV: 4 uops each). Scores in ref's order, (float)dot *
 * k_scale * qf, to s[i][0..4) (rows PART apart). */
AI void sve_qk_i8_tile(const int NQ, const int8_t (*q8)[ARMLLM_ATTN_MAX_HEAD_DIM],
                       const void *const *k, int64_t hd, const float *ksc, const float *qf,
                       float *s) {
  const svbool_t all = svptrue_b32(), p4 = svwhilelt_b32_s32(0, 4);
  const int64_t vb = (int64_t)svcntb(), nseg = (int64_t)svcntw() / 4;
  const svint32_t z = svdup_n_s32(0);
  svint32_t a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z;
  svint32_t a20 = z, a21 = z, a22 = z, a23 = z, a30 = z, a31 = z, a32 = z, a33 = z;
  for (int64_t d = 0; d < hd; d += vb) {
    const svbool_t pg = svwhilelt_b8_s64(d, hd);
    const svint8_t k0 = svld1_s8(pg, (const int8_t *)k[0] + d);
    const svint8_t k1 = svld1_s8(pg, (const int8_t *)k[1] + d);
    const svint8_t k2 = svld1_s8(pg, (const int8_t *)k[2] + d);
    const svint8_t k3 = svld1_s8(pg, (const int8_t *)k[3] + d);
#define QK_ROW(I)                                    \
    if (NQ > I) {                                    \
      const svint8_t qv = svld1_s8(pg, q8[I] + d);   \
      a##I##0 = svdot_s32(a##I##0, qv, k0);          \
      a##I##1 = svdot_s32(a##I##1, qv, k1);          \
      a##I##2 = svdot_s32(a##I##2, qv, k2);          \
      a##I##3 = svdot_s32(a##I##3, qv, k3);          \
    }
    QK_ROW(0) QK_ROW(1) QK_ROW(2) QK_ROW(3)
#undef QK_ROW
  }
  const svfloat32_t ks = svld1_f32(p4, ksc);
#define QK_OUT(I)                                                                                \
  if (NQ > I) {                                                                                  \
    const svint32_t t01 = svadd_s32_x(all, svtrn1_s32(a##I##0, a##I##1), svtrn2_s32(a##I##0, a##I##1)); \
    const svint32_t t23 = svadd_s32_x(all, svtrn1_s32(a##I##2, a##I##3), svtrn2_s32(a##I##2, a##I##3)); \
    const svint64_t e01 = svreinterpret_s64_s32(t01), e23 = svreinterpret_s64_s32(t23);          \
    svint32_t sum = svadd_s32_x(all, svreinterpret_s32_s64(svtrn1_s64(e01, e23)),               \
                                svreinterpret_s32_s64(svtrn2_s64(e01, e23)));                   \
    svint32_t seg = sum;                                                                         \
    for (int64_t g = 1; g < nseg; g++) { /* one rotation by a segment each */                   \
      seg = svext_s32(seg, seg, 4);                                                              \
      sum = svadd_s32_x(all, sum, seg);                                                          \
    }                                                                                            \
    const svfloat32_t f = svmul_f32_x(all, svcvt_f32_s32_x(all, sum), ks);                       \
    svst1_f32(p4, s + I * PART, svmul_n_f32_x(all, f, qf[I]));                                   \
  }
  QK_OUT(0) QK_OUT(1) QK_OUT(2) QK_OUT(3)
#undef QK_OUT
}

/* PV: accp[i][c0 + H * VLB/2, + VLB/2) (VLB = VL in bytes; columns past
 * head_dim dropped) = (float)(sum over keys j of w16_i[j] * V8_j[d]) *
 * ws[i], the sum exact in int32 (attn_common.h): per 4 keys the V rows
 * (VLB columns from c0) are transposed in registers (ZIP1 or ZIP2 (H) of
 * bytes, then ZIP1/ZIP2 of halfwords: one int32 lane a column, its 4 bytes
 * the 4 keys; whole-vector zips keep the columns in order), then SDOT by
 * element with hi = w >> 8 and USDOT's mirror SUDOT by element with the
 * unsigned lo = w & 255 (w8: armllm_attn_i8_w8_row, 8 keys a quadword,
 * replicated per segment by LD1RQB): sum = 256 * HI + LO. */
AI void sve_pv_i8_tile(const int NQ, const int H, const int8_t *w8, const void *const *vr,
                       int64_t n4, int64_t c0, int64_t hd, const float *ws, float *accp) {
  const svbool_t all = svptrue_b32(), pg = svwhilelt_b8_s64(c0, hd);
  const int64_t vw = (int64_t)svcntw(); /* columns of one transposed vector: VLB / 4 */
  const svint32_t z = svdup_n_s32(0);
  svint32_t h00 = z, h01 = z, h10 = z, h11 = z, h20 = z, h21 = z, h30 = z, h31 = z; /* HI */
  svint32_t l00 = z, l01 = z, l10 = z, l11 = z, l20 = z, l21 = z, l30 = z, l31 = z; /* LO */
  const svint8_t zb = svdup_n_s8(0);
#define PV_FMA(I, LH, LL)                                                                       \
  if (NQ > I) {                                                                                 \
    h##I##0 = svdot_lane_s32(h##I##0, t0, w##I, LH);                                            \
    h##I##1 = svdot_lane_s32(h##I##1, t1, w##I, LH);                                            \
    l##I##0 = svsudot_lane_s32(l##I##0, t0, svreinterpret_u8_s8(w##I), LL);                     \
    l##I##1 = svsudot_lane_s32(l##I##1, t1, svreinterpret_u8_s8(w##I), LL);                     \
  }
#define PV_GROUP(G, LH, LL)                                                                     \
  {                                                                                             \
    const svint8_t r0 = svld1_s8(pg, (const int8_t *)vr[j + 4 * G] + c0);                       \
    const svint8_t r1 = svld1_s8(pg, (const int8_t *)vr[j + 4 * G + 1] + c0);                   \
    const svint8_t r2 = svld1_s8(pg, (const int8_t *)vr[j + 4 * G + 2] + c0);                   \
    const svint8_t r3 = svld1_s8(pg, (const int8_t *)vr[j + 4 * G + 3] + c0);                   \
    const svint8_t z01 = H ? svzip2_s8(r0, r1) : svzip1_s8(r0, r1);                             \
    const svint8_t z23 = H ? svzip2_s8(r2, r3) : svzip1_s8(r2, r3);                             \
    const svint16_t y01 = svreinterpret_s16_s8(z01), y23 = svreinterpret_s16_s8(z23);           \
    const svint8_t t0 = svreinterpret_s8_s16(svzip1_s16(y01, y23));                             \
    const svint8_t t1 = svreinterpret_s8_s16(svzip2_s16(y01, y23));                             \
    PV_FMA(0, LH, LL) PV_FMA(1, LH, LL) PV_FMA(2, LH, LL) PV_FMA(3, LH, LL)                     \
  }
#define PV_WEIGHTS                                                                              \
  const svint8_t w0 = svld1rq_s8(svptrue_b8(), w8 + 2 * j);                                    \
  const svint8_t w1 = NQ > 1 ? svld1rq_s8(svptrue_b8(), w8 + 2 * PART + 2 * j) : zb;           \
  const svint8_t w2 = NQ > 2 ? svld1rq_s8(svptrue_b8(), w8 + 4 * PART + 2 * j) : zb;           \
  const svint8_t w3 = NQ > 3 ? svld1rq_s8(svptrue_b8(), w8 + 6 * PART + 2 * j) : zb;
  int64_t j = 0;
  for (; j + 8 <= n4; j += 8) { /* 8 keys: one quadword of weights a query */
    PV_WEIGHTS
    PV_GROUP(0, 0, 1)
    PV_GROUP(1, 2, 3)
  }
  if (j < n4) { /* the last 4 */
    PV_WEIGHTS
    PV_GROUP(0, 0, 1)
  }
#undef PV_WEIGHTS
#undef PV_GROUP
#undef PV_FMA
  const int64_t col = c0 + H * 2 * vw;
  const svbool_t p0 = svwhilelt_b32_s64(col, hd), p1 = svwhilelt_b32_s64(col + vw, hd);
#define PV_ST(I)                                                                                \
  if (NQ > I) {                                                                                 \
    const svint32_t t0 = svadd_s32_x(all, svlsl_n_s32_x(all, h##I##0, 8), l##I##0);             \
    const svint32_t t1 = svadd_s32_x(all, svlsl_n_s32_x(all, h##I##1, 8), l##I##1);             \
    svst1_f32(p0, accp + I * hd + col, svmul_n_f32_x(all, svcvt_f32_s32_x(all, t0), ws[I]));    \
    svst1_f32(p1, accp + I * hd + col + vw, svmul_n_f32_x(all, svcvt_f32_s32_x(all, t1), ws[I])); \
  }
  PV_ST(0) PV_ST(1) PV_ST(2) PV_ST(3)
#undef PV_ST
}

/* The int8 partial kernel, as ref_partition_i8 for each query: scores
 * (float)dot * k_scale * qf, the shared softmax, int16 weights
 * (armllm_attn_i8_w16_rows) and the exact int32 PV. */
static void sve_partial_i8(const armllm_attn_args *a, int64_t b, int64_t kvh, int nq,
                           const float *const *q, const armllm_attn_q8 *q8, const int64_t *lo,
                           const int64_t *hi, int64_t p, float *m, float *l, float *accp) {
  (void)q; /* q8 holds the queries */
  const int64_t hd = a->head_dim, vb = (int64_t)svcntb();
  armllm_attn_keys keys;
  armllm_attn_keys_of(&keys, a, b, kvh, nq, lo, hi, p, 1);
  const void *const *kr = keys.kr, *const *vr = keys.vr;
  const int64_t n4 = keys.n4;
  float s[QMAX][PART] __attribute__((aligned(16)));
  for (int64_t j = 0; j < n4; j += 4)
    for (int i = 0; i < nq; i += 4) {
      const int nqi = nq - i >= 4 ? 4 : nq - i;
#define QK_CALL(N) sve_qk_i8_tile(N, q8->q + i, kr + j, hd, keys.ksc + j, q8->qf + i, &s[i][j])
      NQ_CASES(QK_CALL)
#undef QK_CALL
    }
  armllm_attn_softmax(&s[0][0], nq, lo, hi, keys.k0, keys.n, m, l, sve_softmax_row);
  int16_t w16[QMAX][PART] __attribute__((aligned(16)));
  int8_t w8[QMAX][2 * PART] __attribute__((aligned(16)));
  float ws[QMAX];
  armllm_attn_i8_w16_rows(&s[0][0], nq, keys.vsc, n4, &w16[0][0], ws);
  for (int i = 0; i < nq; i++) armllm_attn_i8_w8_row(w16[i], n4, w8[i], 0); /* lo unsigned */
  for (int i = 0; i < nq; i += 4) {
    const int nqi = nq - i >= 4 ? 4 : nq - i;
    for (int64_t c0 = 0; c0 < hd; c0 += vb) {
#define PV_CALL0(N) sve_pv_i8_tile(N, 0, w8[i], vr, n4, c0, hd, ws + i, accp + i * hd)
#define PV_CALL1(N) sve_pv_i8_tile(N, 1, w8[i], vr, n4, c0, hd, ws + i, accp + i * hd)
      NQ_CASES(PV_CALL0)
      if (c0 + vb / 2 < hd) NQ_CASES(PV_CALL1) /* the upper half's columns */
#undef PV_CALL0
#undef PV_CALL1
    }
  }
}

int64_t armllm_sve_attention(armllm_pool *pool, const armllm_attn_args *args) {
  const armllm_attn_partial_fn partial = args->cache_dtype == ARMLLM_KV_BF16 ? sve_partial_bf16
                                         : args->cache_dtype == ARMLLM_KV_I8 ? sve_partial_i8
                                                                              : sve_partial_f32;
  return armllm_arm_attn_run(pool, args, partial);
}
