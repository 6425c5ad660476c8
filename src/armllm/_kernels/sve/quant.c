/* sve/quant.c: the quantized GEMM (int8 or uint4 weights, int8
 * activations) on SVE I8MM, vector-length agnostic. Activations are
 * quantized by the NEON quant_act (neon/quant.c); weights use the layout
 * "mmla_n8k8" of neon_mmla/quant.c (its pack function), which does not
 * depend on the vector length.
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
 * in neon_mmla/quant.c: x packed per (tile rows, K block) onto the stack,
 * the ABI's float epilogue per group (a = (float)acc * sx; t = fma(d, a, t)
 * (+ fma(o, (float)gsum * sx, t))) into a stack tile in the blocked order
 * (sums start biased so that int -> float is one FSUB; channelwise
 * weights are groups of 128), t kept in y between K blocks, a
 * group-32 variant of the prefill tile without the block loop; results are
 * ref's bits at every vector length, path and thread count.
 */
#include <arm_neon.h>
#include <arm_sve.h>

#include "../armllm_kernels.h"
#include "../gemm_plan.h"
#define ARMLLM_QA_SMMLA_ROWS
#include "../quant_arm.h"

#define NR ARMLLM_QA_NR
#define BLK ARMLLM_QA_BLK
#define KC_BLOCKS ARMLLM_QA_KC_BLOCKS
#define DECODE_MAX_M 4
#define MIN_CHUNK_MACS (1 << 18)

#define AI static inline __attribute__((always_inline))
#define BARRIER __asm__ volatile("" ::: "memory")

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* segments of 128 bits used per vector: 1, 2 or 4 */
static inline int64_t segments(void) {
  const int64_t s = (int64_t)svcntb() / 16;
  return s >= 4 ? 4 : s >= 2 ? 2 : 1;
}

/* ------------------------------------------------------ micro-kernels */

/* Group sums start at the bits of 1.5 * 2^23: (float)s is then one FSUB
 * (see neon_mmla/quant.c); channelwise weights are groups of 128 too. */
#define ACC_BIAS 0x4B400000
#define ACC_BIAS_F 12582912.0f
#define B4_ ACC_BIAS, ACC_BIAS, ACC_BIAS, ACC_BIAS
#define B16_ B4_, B4_, B4_, B4_
static const int32_t acc_bias[64] __attribute__((aligned(64))) = {B16_, B16_, B16_, B16_};
#undef B4_
#undef B16_

typedef struct {
  const int8_t *ap;    /* x operands of this K block: [block][chunk][pair] 16 bytes */
  const uint8_t *w[8]; /* the tile's panels at the K block (past the valid ones: the last again) */
  int64_t nb, bpg;     /* blocks in this K block, blocks per group */
  const float *sxp;    /* [group of the K block][pair]: sx as [s0, s0, s1, s1], then
                          (float)gsum * sx in the same order (4 bits) */
  float *y;            /* 2*MP rows x 2*S*NBV columns, row-major */
  int64_t ldy;
  const float *bias;   /* the tile's columns or NULL; used in the last K block */
  int first, last;
  float *tb;           /* t in the accumulators' order: [pair][vector][16] */
} stile_args;

/* accumulator a<pair><vector>, pair < 4, vector < 8 */
#define V8(X, p) X(p, 0) X(p, 1) X(p, 2) X(p, 3) X(p, 4) X(p, 5) X(p, 6) X(p, 7)
#define ALL_PV(X) V8(X, 0) V8(X, 1) V8(X, 2) V8(X, 3)
#define ALL_V(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define ALL_P(X) X(0) X(1) X(2) X(3)
#define HAS(p, v) ((p) < MP && (v) < NBV)

#define DECL_ACC(p, v) svint32_t a##p##v = svdup_n_s32(0);
/* sums start at the bits of 1.5 * 2^23 (see neon_mmla/quant.c) */
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
    if (MP > 1 && (v) > 0) { ALL_P(LD_AX) }                                    \
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
    svfloat32_t t = svmla_f32_x(pt32, svld1_f32(p4, tp), dv##v, av);                       \
    if (B4) t = svmla_f32_x(pt32, t, ov##v, gb##p);                                        \
    svst1_f32(p4, tp, t);                                                                  \
  }
#define STEP_SB(v) if ((v) < NBV) bp##v += SB;
/* pair p's sx (and b = (float)gsum * sx) of group gi, replicated per segment */
#define PAIR_SX(p)                                                                         \
  svfloat32_t sx##p = svdup_n_f32(0.0f), gb##p = sx##p;                                    \
  if ((p) < MP) {                                                                          \
    sx##p = svld1rq_f32(pt32, a.sxp + (gi * MP + (p)) * 8);                                \
    if (B4) gb##p = svld1rq_f32(pt32, a.sxp + (gi * MP + (p)) * 8 + 4);                    \
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
                 const stile_args a) {
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
  const int32_t *bias0 = acc_bias;
  __asm__("" : "+r"(bias0)); /* loads, not constants */
  const svfloat32_t mg = svdup_n_f32(ACC_BIAS_F);
  ALL_PV(DECL_ACC)
  ALL_V(DECL_BP)
  /* t starts at +0 (ABI), or the state of earlier K blocks */
  if (a.first)
    for (int i = 0; i < MP * NBV; i++) svst1_f32(p4, a.tb + 16 * i, svdup_n_f32(0.0f));
  if (!a.first) { ALL_PV(LOAD_STATE) }
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
  ALL_PV(STORE)
}

typedef void (*stile_fn)(const stile_args *);

#define SVE_KERNEL(MP, NBV, B)                                                             \
  static __attribute__((noinline)) void sve_##MP##x##NBV##_b##B(const stile_args *a) {     \
    sve_tile(MP, NBV, B == 4, 0, *a);                                                       \
  }
#define SVE_KERNELS(MP, NBV) SVE_KERNEL(MP, NBV, 8) SVE_KERNEL(MP, NBV, 4)
SVE_KERNELS(4, 4) SVE_KERNELS(1, 8) SVE_KERNELS(2, 8)
static __attribute__((noinline)) void sve_4x4_b8_g32(const stile_args *a) { sve_tile(4, 4, 0, 1, *a); }
static __attribute__((noinline)) void sve_4x4_b4_g32(const stile_args *a) { sve_tile(4, 4, 1, 1, *a); }

typedef struct {
  stile_fn fn;
  int mp, nbv; /* row pairs, B vectors per chunk */
} stile_kind;

/* [bits 4][M for decode, 0 for prefill] */
#define KINDS(B)                                                                \
  {{sve_4x4_b##B, 4, 4}, {sve_1x8_b##B, 1, 8}, {sve_1x8_b##B, 1, 8},           \
   {sve_2x8_b##B, 2, 8}, {sve_2x8_b##B, 2, 8}}
static const stile_kind stile_kinds[2][DECODE_MAX_M + 1] = {KINDS(8), KINDS(4)};
#undef KINDS

/* ------------------------------------------------------------- driver */

typedef struct {
  ARMLLM_QA_JOB_ARGS;
  stile_kind kind;
  int64_t pt;             /* panels per tile */
  int64_t n_tiles;        /* column tiles of pt panels */
  int64_t n_mt, cp;       /* M tiles, column tiles per N chunk */
} wq_job;

static void wq_items(void *ctx, int64_t i0, int64_t i1) {
  const wq_job *job = ctx;
  const wq_geom *G = &job->G;
  const int MP = job->kind.mp;
  const int64_t PT = job->pt, tc = PT * NR; /* columns per tile */
  int8_t ap[KC_BLOCKS * BLK * 8] __attribute__((aligned(64)));
  float sxp[KC_BLOCKS * 4 * 8] __attribute__((aligned(16)));
  float tb[256] __attribute__((aligned(64)));
  stile_args a;
  a.ap = ap;
  a.sxp = sxp;
  a.tb = tb;
  a.bpg = G->bpg;
  for (int64_t i = i0; i < i1;) {
    const int64_t nc = i / job->n_mt, mt0 = i % job->n_mt;
    const int64_t mt1 = min64(mt0 + (i1 - i), job->n_mt);
    const int64_t ta = nc * job->cp, tz = min64(ta + job->cp, job->n_tiles);
    for (int64_t b0 = 0; b0 < G->nblk; b0 += KC_BLOCKS) {
      const int64_t g0 = b0 / G->bpg, woff = b0 * G->bb + g0 * G->sb;
      a.nb = min64(KC_BLOCKS, G->nblk - b0);
      a.first = b0 == 0;
      a.last = b0 + a.nb == G->nblk;
      const int64_t gc = (a.nb + G->bpg - 1) / G->bpg;
      for (int64_t mt = mt0; mt < mt1; mt++) {
        const int64_t m0 = mt * 2 * MP, mv = min64(2 * MP, job->m - m0);
        pack_rows(job->xq, job->ldq, job->scale, job->ldsc, job->gsum, job->ldgs, job->m, m0, MP,
                  b0, a.nb, g0, gc, ap, sxp);
        for (int64_t t = ta; t < tz; t++) {
          const int64_t p0 = t * PT, np = min64(PT, job->n_panels - p0);
          const int64_t n0 = p0 * NR, nv = min64(tc, job->n - n0);
          for (int64_t q = 0; q < PT; q++)
            a.w[q] = job->w + (p0 + (q < np ? q : np - 1)) * G->pstride + woff;
          const float *bias = a.last && job->bias ? job->bias + n0 : NULL;
          float *yt = job->y + m0 * job->ldy + n0;
          if (mv == 2 * MP && nv == tc) {
            a.y = yt;
            a.ldy = job->ldy;
            a.bias = bias;
            job->kind.fn(&a);
            continue;
          }
          /* edge tile: rows / panels past the valid ones land here, unused */
          float et[256] __attribute__((aligned(64))); /* 2*MP x tc <= 8 x 32 or 4 x 64 */
          float eb[64] __attribute__((aligned(64))) = {0};
          armllm_edge_tile_load(et, eb, tc, yt, job->ldy, mv, nv, a.first, bias);
          a.y = et;
          a.ldy = tc;
          a.bias = bias ? eb : NULL;
          job->kind.fn(&a);
          armllm_edge_tile_store(et, tc, yt, job->ldy, mv, nv);
        }
      }
    }
    i += mt1 - mt0;
  }
}

void armllm_sve_gemm_wq(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                        const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                        const void *packed_w, int64_t n, int bits, int64_t group,
                        const float *bias, float *y, int64_t ldy) {
  const int b4 = bits == 4;
  wq_job job = {xq, m, ldq, scale, ldsc, b4 ? gsum : NULL, ldgs, packed_w, n, (n + NR - 1) / NR,
                geom_of(k, bits, group), bias, y, ldy,
                stile_kinds[b4][m <= DECODE_MAX_M ? m : 0], 0, 0, 0, 0};
  if (group == BLK && m > DECODE_MAX_M) job.kind.fn = b4 ? sve_4x4_b4_g32 : sve_4x4_b8_g32;
  job.pt = job.kind.nbv * segments() / 4;
  job.n_tiles = (job.n_panels + job.pt - 1) / job.pt;
  const int64_t mr = 2 * job.kind.mp, nr = job.pt * NR;
  armllm_gemm_plan plan;
  if (m <= DECODE_MAX_M) {
    plan = armllm_plan_decode(pool, m, job.G.kpad, job.n_tiles, nr, 1, MIN_CHUNK_MACS);
    job.n_mt = 1; /* one tile of all M rows */
    job.cp = 1;
  } else {
    const int64_t cp_max = job.pt >= 16 ? 1 : 16 / job.pt; /* about 128 columns per chunk */
    plan = armllm_plan_prefill(pool, m, job.G.kpad, job.n_tiles, mr, nr, cp_max, MIN_CHUNK_MACS);
    job.n_mt = plan.n_mt;
    job.cp = plan.cp;
  }
  armllm_pool_run(pool, plan.items, plan.grain, wq_items, &job);
}
