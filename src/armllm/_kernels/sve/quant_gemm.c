/* sve/quant_gemm.c: the quantized GEMM (int8 or uint4 weights, int8
 * activations) on SVE I8MM, vector-length agnostic: the micro-kernels; the
 * driver is quant_arm.c, activations come from neon/quant_act.c, weights
 * use the layout "mmla_n8k8" of neon_mmla/quant_gemm.c (its pack
 * function), which does not depend on the vector length.
 *
 * SVE's SMMLA works on each 128-bit segment: segment i of the result is
 * A_i (2 x rows, 8 k) times B_i (2 W rows, 8 k). With x replicated into
 * every segment (LD1RQB) and a B load covering S consecutive row pairs of
 * one panel chunk (S = VL/128 segments, at most 4: a panel chunk is 4 row
 * pairs), one SMMLA does S 2x2 blocks. 4-bit weights: a load of 16*S bytes
 * unpacks (AND / LSR by 4) to S row pairs of chunk c and of chunk c + 2.
 * Past 512 bits only the low 4 segments are used (predicated loads).
 *
 * A tile is MP row pairs x NBV B vectors per chunk, i.e. NBV*S/4 panels:
 * prefill 4 pairs x 4 vectors (16 accumulators; 1, 2, 4 panels at 128,
 * 256, 512 bits); decode 1 or 2 pairs x 8 vectors. Everything else is as
 * in neon_mmla/quant_gemm.c: x packed per (tile rows, K block) by the
 * driver, the ABI's float epilogue per group into a stack tile in the
 * blocked order (sums start biased so that int -> float is one FSUB), t
 * kept in y between K blocks; for group 32 a prefill tile of 3 pairs x 4
 * vectors without the block loop that keeps t in registers over the K
 * block (12 accumulators + 12 t: no store per group and accumulator, which
 * takes a vector-pipe slot); results are ref's bits at every vector length,
 * path and thread count.
 */
#include <arm_neon.h>
#include <arm_sve.h>

#include "../armllm_kernels.h"
#include "../gemm_plan.h"
#include "../quant_arm.h"

#define BLK ARMLLM_QA_BLK
#define DECODE_MAX_M ARMLLM_GEMM_DECODE_MAX_M
#define MIN_CHUNK_MACS (1 << 18)
/* group 32 from M = 9 on takes the 6-row tile that keeps t in registers:
 * up to 8 rows one 8-row tile (computing no more rows) is cheaper */
#define G32_MIN_M 8

#define AI static inline __attribute__((always_inline))
#define BARRIER __asm__ volatile("" ::: "memory")

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* segments of 128 bits used per vector: 1, 2 or 4 */
static inline int64_t segments(void) {
  const int64_t s = (int64_t)svcntb() / 16;
  return s >= 4 ? 4 : s >= 2 ? 2 : 1;
}

/* ------------------------------------------------------ micro-kernels */

/* accumulator a<pair><vector>, pair < 4, vector < 8 */
#define V8(X, p) X(p, 0) X(p, 1) X(p, 2) X(p, 3) X(p, 4) X(p, 5) X(p, 6) X(p, 7)
#define ALL_PV(X) V8(X, 0) V8(X, 1) V8(X, 2) V8(X, 3)
#define ALL_V(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define ALL_P(X) X(0) X(1) X(2) X(3)
#define HAS(p, v) ((p) < MP && (v) < NBV)

#define DECL_ACC(p, v) svint32_t a##p##v = svdup_n_s32(0);
/* sums start at the bits of 1.5 * 2^23 (quant_arm.h) */
#define ZERO_ACC(p, v) if (HAS(p, v)) a##p##v = svld1rq_s32(pt32, bias0 + 4 * (4 * (p) + ((v) & 3)));
/* B vector v: panel v / VPP, row pairs (v % VPP) * S .. + S - 1 */
#define DECL_BP(v)                                                              \
  const uint8_t *bp##v = a.w[0];                                                \
  int64_t bo##v = 0;                                                            \
  if ((v) < NBV) {                                                              \
    bo##v = 16 * ((v) % vpp) * S;                                               \
    bp##v = a.w[(v) / vpp] + bo##v;                                             \
  }
#define STEP_BP(v) if ((v) < NBV) bp##v += BB;

/* state of earlier K blocks: row-major y -> blocked (64-bit zips) */
#define LOAD_STATE(p, v)                                                                  \
  if (HAS(p, v)) {                                                                        \
    const float *y0 = a.y + 2 * (p) * a.ldy + 2 * S * (v);                                \
    const svfloat64_t r0 = svreinterpret_f64_f32(svld1_f32(p2, y0));                      \
    const svfloat64_t r1 = svreinterpret_f64_f32(svld1_f32(p2, y0 + a.ldy));              \
    const svfloat32_t b = svreinterpret_f32_f64(svzip1_f64(r0, r1));                      \
    svst1_f32(p4, a.tb + ((p) * NBV + (v)) * 16, b);                                      \
  }

#define LOAD_A(p) svint8_t ax##p = svdup_n_s8(0), ah##p = ax##p;
/* x operands are reloaded for each B vector when there are 16 accumulators:
 * GCC then keeps them in registers without copies (loads are cheap). */
#define MM(p, v, A, B) if (HAS(p, v)) a##p##v = svmmla_s32(a##p##v, A##p, B);
/* 8 bits: B vector v of chunk c against every pair */
#define MM8(v)                                                                 \
  if ((v) < NBV) {                                                             \
    const svint8_t b = svld1_s8(pb, (const int8_t *)bp##v + 64 * c);           \
    if (!G1 && MP > 1 && (v) > 0) { ALL_P(LD_AX) } /* G1: 3 pairs, room for x */ \
    MM(0, v, ax, b) MM(1, v, ax, b) MM(2, v, ax, b) MM(3, v, ax, b)            \
    if (MP > 1) BARRIER;                                                       \
  }
/* 4 bits: one load, chunk hh (low nibbles) and hh + 2 (high) */
#define MM4(v)                                                                 \
  if ((v) < NBV) {                                                             \
    const svuint8_t raw = svld1_u8(pb, bp##v + 64 * hh);                       \
    const svint8_t lo = svreinterpret_s8_u8(svand_u8_x(pt8, raw, m15)); /* no MOVPRFX */       \
    const svint8_t hi = svreinterpret_s8_u8(svlsr_n_u8_x(pt8, raw, 4));        \
    if (MP > 1 && (v) > 0) { ALL_P(LD_AL) }                                    \
    MM(0, v, ax, lo) MM(1, v, ax, lo) MM(2, v, ax, lo) MM(3, v, ax, lo)        \
    MM(0, v, ah, hi) MM(1, v, ah, hi) MM(2, v, ah, hi) MM(3, v, ah, hi)        \
    if (MP > 1) BARRIER;                                                       \
  }
#define LD_AX(p) if ((p) < MP) ax##p = svld1rq_s8(pt8, ab + (c * MP + (p)) * 16);
#define LD_AL(p)                                                               \
  if ((p) < MP) {                                                              \
    ax##p = svld1rq_s8(pt8, ab + (hh * MP + (p)) * 16);                        \
    ah##p = svld1rq_s8(pt8, ab + ((hh + 2) * MP + (p)) * 16);                  \
  }

/* the group's d (and o) for vector v, as [D, D] per segment (D = 2 floats) */
#define SCALES(v)                                                                          \
  svfloat32_t dv##v = svdup_n_f32(0.0f), ov##v = dv##v;                                    \
  if ((v) < NBV) {                                                                         \
    const float *sp = (const float *)(const void *)(bp##v - bo##v) + bo##v / 8;           \
    const svfloat64_t d = svreinterpret_f64_f32(svld1_f32(p2, sp));                        \
    dv##v = svreinterpret_f32_f64(svzip1_f64(d, d));                                       \
    if (B4) {                                                                              \
      const svfloat64_t o = svreinterpret_f64_f32(svld1_f32(p2, sp + 8));                  \
      ov##v = svreinterpret_f32_f64(svzip1_f64(o, o));                                     \
    }                                                                                      \
  }
#define EPI(p, v)                                                                          \
  if (HAS(p, v)) {                                                                         \
    float *tp = a.tb + ((p) * NBV + (v)) * 16;                                             \
    const svfloat32_t f = svsub_f32_x(pt32, svreinterpret_f32_s32(a##p##v), mg);           \
    const svfloat32_t av = svmul_f32_x(pt32, f, sx##p);                                    \
    svfloat32_t t = svmla_f32_x(pt32, G1 ? t##p##v : svld1_f32(p4, tp), dv##v, av);        \
    if (B4) t = svmla_f32_x(pt32, t, ov##v, gb##p);                                        \
    if (G1) t##p##v = t;                                                                   \
    else svst1_f32(p4, tp, t);                                                             \
  }
/* group 32: t in registers over the K block (tb before and after) */
#define DECL_T(p, v) svfloat32_t t##p##v = svdup_n_f32(0.0f);
#define T_LOAD(p, v) if (G1 && HAS(p, v)) t##p##v = svld1_f32(p4, a.tb + ((p) * NBV + (v)) * 16);
#define T_STORE(p, v) if (G1 && HAS(p, v)) svst1_f32(p4, a.tb + ((p) * NBV + (v)) * 16, t##p##v);
#define STEP_SB(v) if ((v) < NBV) bp##v += SB;
/* pair p's sx (and b = (float)gsum * sx) of group gi, replicated per segment */
#define PAIR_SX(p)                                                                         \
  svfloat32_t sx##p = svdup_n_f32(0.0f), gb##p = sx##p;                                    \
  if ((p) < MP) {                                                                          \
    sx##p = svld1rq_f32(pt32, a.sx + (gi * MP + (p)) * 8);                                \
    if (B4) gb##p = svld1rq_f32(pt32, a.sx + (gi * MP + (p)) * 8 + 4);                    \
  }

/* blocked -> row-major y (+ bias after the last K block) */
#define STORE(p, v)                                                                        \
  if (HAS(p, v)) {                                                                         \
    float *y0 = a.y + 2 * (p) * a.ldy + 2 * S * (v);                                       \
    const svfloat64_t b = svreinterpret_f64_f32(svld1_f32(p4, a.tb + ((p) * NBV + (v)) * 16)); \
    svfloat32_t r0 = svreinterpret_f32_f64(svuzp1_f64(b, b));                              \
    svfloat32_t r1 = svreinterpret_f32_f64(svuzp2_f64(b, b));                              \
    if (a.last && a.bias) {                                                                \
      const svfloat32_t bv = svld1_f32(p2, a.bias + 2 * S * (v));                          \
      r0 = svadd_f32_x(pt32, r0, bv);                                                      \
      r1 = svadd_f32_x(pt32, r1, bv);                                                      \
    }                                                                                      \
    svst1_f32(p2, y0, r0);                                                                 \
    svst1_f32(p2, y0 + a.ldy, r1);                                                         \
  }

AI void sve_tile(const int MP, const int NBV, const int B4, const int G1,
                 const armllm_qa_tile a) {
  const int64_t BB = B4 ? 128 : 256, SB = B4 ? 64 : 32;
  const int64_t S = segments(), vpp = 4 / S;
  const svbool_t pt8 = svptrue_b8(), pt32 = svptrue_b32();
  svuint8_t m15 = svdup_n_u8(15);
  __asm__("" : "+w"(m15)); /* a register: AND (vectors) needs no MOVPRFX */
  const svbool_t pb = svwhilelt_b8_s64(0, 16 * S);  /* S segments of bytes */
  const svbool_t p2 = svwhilelt_b32_s64(0, 2 * S);  /* one row of S 2x2 blocks */
  const svbool_t p4 = svwhilelt_b32_s64(0, 4 * S);  /* S segments of floats */
  const int8_t *const ap = a.ap;
  const int64_t nb = a.nb, bpg = G1 ? 1 : a.bpg; /* G1: group 32 */
  const int32_t *bias0 = armllm_qa_acc_bias;
  __asm__("" : "+r"(bias0)); /* loads, not constants */
  const svfloat32_t mg = svdup_n_f32(ARMLLM_QA_ACC_BIAS_F);
  ALL_PV(DECL_ACC)
  ALL_PV(DECL_T)
  ALL_V(DECL_BP)
  /* t starts at +0 (ABI), or the state of earlier K blocks */
  if (a.first)
    for (int i = 0; i < MP * NBV; i++) svst1_f32(p4, a.tb + 16 * i, svdup_n_f32(0.0f));
  if (!a.first) { ALL_PV(LOAD_STATE) }
  ALL_PV(T_LOAD)
  for (int64_t g0 = 0, gi = 0; g0 < nb; g0 += bpg, gi++) {
    const int64_t gn = min64(bpg, nb - g0);
    ALL_PV(ZERO_ACC)
    for (int64_t bi = 0; bi < gn; bi++) {
      const int8_t *ab = ap + (g0 + bi) * 4 * MP * 16;
      ALL_P(LOAD_A)
      if (B4) {
        for (int hh = 0; hh < 2; hh++) {
          ALL_P(LD_AL)
          ALL_V(MM4)
          BARRIER;
        }
      } else {
        for (int c = 0; c < 4; c++) {
          ALL_P(LD_AX)
          ALL_V(MM8)
          BARRIER;
        }
      }
      ALL_V(STEP_BP)
    }
    ALL_V(SCALES)
    ALL_P(PAIR_SX)
    ALL_PV(EPI)
    ALL_V(STEP_SB)
  }
  ALL_PV(T_STORE)
  ALL_PV(STORE)
}

/* sve_<pairs>x<B vectors>_b<bits>[_g32] */
ARMLLM_QA_KERNELS(sve, sve_tile, 4, 4) ARMLLM_QA_KERNELS(sve, sve_tile, 1, 8)
ARMLLM_QA_KERNELS(sve, sve_tile, 2, 8) ARMLLM_QA_KERNELS_G32(sve, sve_tile, 3, 4)

typedef struct {
  armllm_qa_tile_fn fn;
  int mp, nbv; /* row pairs, B vectors per chunk */
} sve_kind;

/* [bits 4][M for decode, 0 for prefill] */
#define KINDS(B)                                                                \
  {{sve_4x4_b##B, 4, 4}, {sve_1x8_b##B, 1, 8}, {sve_1x8_b##B, 1, 8},           \
   {sve_2x8_b##B, 2, 8}, {sve_2x8_b##B, 2, 8}}
static const sve_kind sve_kinds[2][DECODE_MAX_M + 1] = {KINDS(8), KINDS(4)};
#undef KINDS

/* The tile kind of a GEMM of m rows. */
static armllm_qa_kind kind_of(int64_t m, int bits, int64_t group) {
  const sve_kind sk = sve_kinds[bits == 4][m <= DECODE_MAX_M ? m : 0];
  armllm_qa_kind kind = {sk.fn, 2 * sk.mp, (int)(sk.nbv * segments() / 4), 1};
  if (group == BLK && m > G32_MIN_M) { /* 3 pairs x 4 B vectors, t in registers */
    kind.fn = bits == 4 ? sve_3x4_b4_g32 : sve_3x4_b8_g32;
    kind.rows = 6;
  }
  return kind;
}

void armllm_sve_gemm_wq(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                        const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                        const void *packed_w, int64_t n, int bits, int64_t group,
                        const float *bias, float *y, int64_t ldy) {
  armllm_qa_gemm(pool, xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, 0, n, bits, group, bias,
                 y, ldy, kind_of(m, bits, group), MIN_CHUNK_MACS);
}

void armllm_sve_gemm_wq_cols(const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                             const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                             const void *packed_w, int64_t n, int bits, int64_t group, int64_t n0,
                             int64_t n1, const float *bias, float *y, int64_t ldy) {
  (void)n;
  armllm_qa_gemm(NULL, xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, n0, n1, bits, group, bias,
                 y, ldy, kind_of(m, bits, group), MIN_CHUNK_MACS);
}
