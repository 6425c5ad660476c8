/* neon_mmla/quant_gemm.c: the quantized GEMM (int8 or uint4 weights, int8
 * activations) on Armv8.6 I8MM: the block layout and micro-kernels; the
 * driver is quant_arm.c, activations come from neon/quant_act.c. SMMLA
 * multiplies a 2x8 block of x (two rows, 8 k) by a 2x8 block of W (two
 * output rows, 8 k) into a 2x2 int32 block [x0w0, x0w1, x1w0, x1w1].
 *
 * Packed layout "mmla_n8k8" (quant_arm.h's panels; shared with
 *   sve/quant_gemm.c): a block holds 16 SMMLA operands v = 4c + s of 16
 *   bytes, chunk c (8 k) and row pair s:
 *     8 bits: W[8p + 2s + h, 32b + 8c + i] at byte 16v + 8h + i;
 *     4 bits: operand v < 8 in the low nibbles of bytes 16v .. 16v + 15,
 *             operand v + 8 in their high nibbles (AND / USHR by 4), so a
 *             load of 16, 32 or 64 bytes unpacks to whole row pairs of one
 *             chunk (what SVE at 128, 256 and 512 bits loads).
 *
 * Tiles: the driver packs x rows per (tile, K block of 1024 k) as SMMLA
 *   operands (row pairs x 8 k), with each pair's per-group scales as
 *   [s0, s0, s1, s1] floats (and gsum * sx likewise). Prefill: 4 row pairs
 *   x 1 panel = 16 accumulators, 16 SMMLA per 4 x + 4 W operands (4 bits:
 *   2 loads, 4 unpack ops); its 32-k block and its group epilogue are
 *   inline assembly (GCC 12 copies SMMLA accumulators around otherwise).
 *   Group 32 (every GGUF Q4_0/Q4_1/Q8_0) has its own prefill tile, 3 row
 *   pairs x 1 panel with t in registers (mmla_g32_tile). Decode (M <= 4):
 *   1 pair x 4 panels or 2 pairs x 2 panels. t lives in a stack tile in the
 *   accumulators' 2x2-blocked order; between K blocks it is kept in y
 *   (row-major, exact). Group sums start biased so that int -> float is
 *   one FSUB (quant_arm.h).
 */
#include <arm_neon.h>

#include "../armllm_kernels.h"
#include "../gemm_plan.h"
#include "../quant_arm.h"

#define BLK ARMLLM_QA_BLK
#define DECODE_MAX_M ARMLLM_GEMM_DECODE_MAX_M
#define MIN_CHUNK_MACS (1 << 18)
/* group 32 from M = 9 on takes the 6-row tile that keeps t in registers:
 * up to 8 rows one 8-row tile (computing no more rows) is cheaper */
#define G32_MIN_M 8

#define ALWAYS_INLINE static inline __attribute__((always_inline))
/* Keeps GCC from hoisting the weight loads of later chunks (spills). */
#define BARRIER __asm__ volatile("" ::: "memory")

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ----------------------------------------------------------- packing */

static void mmla_block(uint8_t *dst, const int8_t *q, int64_t n, int64_t k, int64_t p, int64_t b,
                       int bits) {
  if (bits == 4) memset(dst, 0, 128);
  for (int v = 0; v < 16; v++)
    for (int e = 0; e < 16; e++) {
      const int c = v / 4, s = v % 4, h = e / 8, i = e % 8;
      const int64_t row = p * ARMLLM_QA_NR + 2 * s + h, kk = b * BLK + 8 * c + i;
      const uint8_t val = row < n && kk < k ? (uint8_t)q[row * k + kk] : 0;
      if (bits == 4) dst[16 * (v % 8) + e] |= (uint8_t)((val & 15) << (v < 8 ? 0 : 4));
      else dst[16 * v + e] = val;
    }
}

size_t armllm_neon_mmla_gemm_wq_packed_len(int64_t n, int64_t k, int bits, int64_t group,
                                           const float *d, const float *o) {
  (void)d, (void)o; /* f32 scales whatever their values */
  return armllm_qa_packed_len(n, k, bits, group);
}

void armllm_neon_mmla_gemm_wq_pack(const int8_t *q, int64_t n, int64_t k, int bits,
                                   int64_t group, const float *d, const float *o, void *packed) {
  armllm_qa_pack(q, n, k, bits, group, d, o, packed, mmla_block);
}

/* ------------------------------------------------------ micro-kernels */

ALWAYS_INLINE float32x4_t dup_pair(float32x4_t v, int lane) { /* [v2l, v2l+1] twice */
  const float64x2_t f = vreinterpretq_f64_f32(v);
  return vreinterpretq_f32_f64(lane ? vdupq_laneq_f64(f, 1) : vdupq_laneq_f64(f, 0));
}

/* The 8x8 prefill tile's 32-k block and group epilogue in inline assembly:
 * from intrinsics GCC 12 copies accumulators between registers (MOVs that
 * take the SMMLA pipes) or spills them. The statements are put together
 * from the pieces below: x operands (ap: 256 bytes a block, [chunk][pair])
 * in v0..v3 (4 bits: and the chunk + 2's in v4..v7), W operands from wb
 * (bp) in v4/v5 (4 bits: unpacked from v8 / v11 into v9, v10 / v12, v13),
 * acc[pair][s] as %[c<pair><s>]. */
#define ASM_LDP(Q0, Q1, BASE, OFF) "ldp q" Q0 ", q" Q1 ", [%[" BASE "], #" OFF "]\n\t"
/* the 4 pairs' accumulators of operand s += x pair (vA0 .. vA0 + 3) x vB */
#define ASM_SMMLA_PAIRS(S, A0, A1, A2, A3, B)                                        \
  "smmla %[c0" S "].4s, v" A0 ".16b, v" B ".16b\n\t"                                 \
  "smmla %[c1" S "].4s, v" A1 ".16b, v" B ".16b\n\t"                                 \
  "smmla %[c2" S "].4s, v" A2 ".16b, v" B ".16b\n\t"                                 \
  "smmla %[c3" S "].4s, v" A3 ".16b, v" B ".16b\n\t"
/* 8 bits: chunk c (x at byte 64c, W operands s0, s1 at byte OFF) */
#define ASM_MM8_CHUNK(XOFF, XOFF2, OFF, S0, S1)                                      \
  ASM_LDP("0", "1", "ap", XOFF) ASM_LDP("2", "3", "ap", XOFF2) ASM_LDP("4", "5", "bp", OFF) \
  ASM_SMMLA_PAIRS(S0, "0", "1", "2", "3", "4") ASM_SMMLA_PAIRS(S1, "0", "1", "2", "3", "5")
/* 4 bits: operand s of chunks hh (low nibbles) and hh + 2 (high) from vR */
#define ASM_MM4_OPERAND(S, OFF, R, LO, HI)                                           \
  "ldr q" R ", [%[bp], #" OFF "]\n\t"                                                \
  "and v" LO ".16b, v" R ".16b, %[m15].16b\n\t"                                      \
  "ushr v" HI ".16b, v" R ".16b, #4\n\t"                                             \
  ASM_SMMLA_PAIRS(S, "0", "1", "2", "3", LO) ASM_SMMLA_PAIRS(S, "4", "5", "6", "7", HI)
#define ASM_MM4_CHUNKS(X0, X1, X2, X3, S0, OFF0, S1, OFF1)                           \
  ASM_LDP("0", "1", "ap", X0) ASM_LDP("2", "3", "ap", X1) ASM_LDP("4", "5", "ap", X2)   \
  ASM_LDP("6", "7", "ap", X3) ASM_MM4_OPERAND(S0, OFF0, "8", "9", "10")              \
  ASM_MM4_OPERAND(S1, OFF1, "11", "12", "13")
#define ASM_ACC_PAIR(S0, S1)                                                         \
  [c0##S0] "+w"(acc[0][S0]), [c0##S1] "+w"(acc[0][S1]), [c1##S0] "+w"(acc[1][S0]),   \
      [c1##S1] "+w"(acc[1][S1]), [c2##S0] "+w"(acc[2][S0]), [c2##S1] "+w"(acc[2][S1]), \
      [c3##S0] "+w"(acc[3][S0]), [c3##S1] "+w"(acc[3][S1])

/* One 32-k block: operands s = 0, 1, then 2, 3 (one statement each: GCC
 * takes at most 30 operands). 8 bits: operand v of chunk c at byte 16v. */
ALWAYS_INLINE void mmla8_block_asm(int32x4_t acc[4][16], const int8_t *ab, const uint8_t *wb) {
  __asm__(ASM_MM8_CHUNK("0", "32", "0", "0", "1") ASM_MM8_CHUNK("64", "96", "64", "0", "1")
          ASM_MM8_CHUNK("128", "160", "128", "0", "1") ASM_MM8_CHUNK("192", "224", "192", "0", "1")
          : ASM_ACC_PAIR(0, 1)
          : [ap] "r"(ab), [bp] "r"(wb)
          : "v0", "v1", "v2", "v3", "v4", "v5", "memory");
  __asm__(ASM_MM8_CHUNK("0", "32", "32", "2", "3") ASM_MM8_CHUNK("64", "96", "96", "2", "3")
          ASM_MM8_CHUNK("128", "160", "160", "2", "3") ASM_MM8_CHUNK("192", "224", "224", "2", "3")
          : ASM_ACC_PAIR(2, 3)
          : [ap] "r"(ab), [bp] "r"(wb)
          : "v0", "v1", "v2", "v3", "v4", "v5", "memory");
}

#define ASM_V0_V11 "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11"
#define ASM_V0_V13 ASM_V0_V11, "v12", "v13"

/* 4 bits: operand s of chunks hh and hh + 2 at byte 64hh + 16s. */
ALWAYS_INLINE void mmla4_block_asm(int32x4_t acc[4][16], const int8_t *ab, const uint8_t *wb,
                                   uint8x16_t m15) {
  __asm__(ASM_MM4_CHUNKS("0", "32", "128", "160", "0", "0", "1", "16")
          ASM_MM4_CHUNKS("64", "96", "192", "224", "0", "64", "1", "80")
          : ASM_ACC_PAIR(0, 1)
          : [ap] "r"(ab), [bp] "r"(wb), [m15] "w"(m15)
          : ASM_V0_V13, "memory");
  __asm__(ASM_MM4_CHUNKS("0", "32", "128", "160", "2", "32", "3", "48")
          ASM_MM4_CHUNKS("64", "96", "192", "224", "2", "96", "3", "112")
          : ASM_ACC_PAIR(2, 3)
          : [ap] "r"(ab), [bp] "r"(wb), [m15] "w"(m15)
          : ASM_V0_V13, "memory");
}

/* The group epilogue (biased sums): a = (acc - 1.5*2^23) * sx; t[pair][s]
 * = fma(d, a, t) (+ fma(o, b, t)) in tb; sp: the group's d[8] (then o[8]),
 * each row pair's [D, D] dup'd into v2..v5 (o: v6..v9); sx: per pair [sx of
 * rows 2pr, 2pr, 2pr+1, 2pr+1] (v1; 4 bits: v10), then b = (float)gsum * sx
 * in the same order (v11); mg: 1.5*2^23 in every lane. Accumulator C at tb
 * byte OFF, through vT, scaled by vS, d in vD (o in vO). */
#define ASM_DUP_PAIRS(D0, D1, D2, D3) /* the four [D, D] of d (or o) in v0, v1 */      \
  "dup v" D0 ".2d, v0.d[0]\n\t"                                                      \
  "dup v" D1 ".2d, v0.d[1]\n\t"                                                      \
  "dup v" D2 ".2d, v1.d[0]\n\t"                                                      \
  "dup v" D3 ".2d, v1.d[1]\n\t"
#define ASM_EPI_A(C, OFF, T, S, D)                                                   \
  "fsub v" T ".4s, %[" C "].4s, %[mg].4s\n\t"                                        \
  "ldr q14, [%[tb], #" OFF "]\n\t"                                                   \
  "fmul v" T ".4s, v" T ".4s, v" S ".4s\n\t"                                         \
  "fmla v14.4s, v" T ".4s, v" D ".4s\n\t"
#define ASM_EPI_O(O) "fmla v14.4s, v" O ".4s, v11.4s\n\t"
#define ASM_EPI_ST(OFF) "str q14, [%[tb], #" OFF "]\n\t"
#define ASM_EPI8_PAIR(P, SXOFF, O0, O1, O2, O3)                                      \
  "ldr q1, [%[sx], #" SXOFF "]\n\t"                                                  \
  ASM_EPI_A("c" #P "0", O0, "0", "1", "2") ASM_EPI_ST(O0)                            \
  ASM_EPI_A("c" #P "1", O1, "0", "1", "3") ASM_EPI_ST(O1)                            \
  ASM_EPI_A("c" #P "2", O2, "0", "1", "4") ASM_EPI_ST(O2)                            \
  ASM_EPI_A("c" #P "3", O3, "0", "1", "5") ASM_EPI_ST(O3)
#define ASM_EPI4_PAIR(P, SXOFF, O0, O1, O2, O3)                                      \
  "ldp q10, q11, [%[sx], #" SXOFF "]\n\t"                                            \
  ASM_EPI_A("c" #P "0", O0, "0", "10", "2") ASM_EPI_O("6") ASM_EPI_ST(O0)            \
  ASM_EPI_A("c" #P "1", O1, "1", "10", "3") ASM_EPI_O("7") ASM_EPI_ST(O1)            \
  ASM_EPI_A("c" #P "2", O2, "0", "10", "4") ASM_EPI_O("8") ASM_EPI_ST(O2)            \
  ASM_EPI_A("c" #P "3", O3, "1", "10", "5") ASM_EPI_O("9") ASM_EPI_ST(O3)
#define ASM_ACC_IN(P)                                                                \
  [c##P##0] "w"(acc[P][0]), [c##P##1] "w"(acc[P][1]), [c##P##2] "w"(acc[P][2]),      \
      [c##P##3] "w"(acc[P][3])
#define ASM_EPI_IN                                                                   \
  ASM_ACC_IN(0), ASM_ACC_IN(1), ASM_ACC_IN(2), ASM_ACC_IN(3), [tb] "r"(tb), [sp] "r"(sp), \
      [mg] "w"(mg), [sx] "r"(sx)

ALWAYS_INLINE void mmla8_epilogue_asm(int32x4_t acc[4][16], float *tb, const float *sp,
                                       const float *sx, float32x4_t mg) {
  __asm__ volatile("ldp q0, q1, [%[sp]]\n\t" ASM_DUP_PAIRS("2", "3", "4", "5")
                   ASM_EPI8_PAIR(0, "0", "0", "16", "32", "48")
                   ASM_EPI8_PAIR(1, "32", "64", "80", "96", "112")
                   ASM_EPI8_PAIR(2, "64", "128", "144", "160", "176")
                   ASM_EPI8_PAIR(3, "96", "192", "208", "224", "240")
                   :
                   : ASM_EPI_IN
                   : "v0", "v1", "v2", "v3", "v4", "v5", "v14", "memory");
}

ALWAYS_INLINE void mmla4_epilogue_asm(int32x4_t acc[4][16], float *tb, const float *sp,
                                       const float *sx, float32x4_t mg) {
  __asm__ volatile("ldp q0, q1, [%[sp]]\n\t" ASM_DUP_PAIRS("2", "3", "4", "5")
                   "ldp q0, q1, [%[sp], #32]\n\t" ASM_DUP_PAIRS("6", "7", "8", "9")
                   ASM_EPI4_PAIR(0, "0", "0", "16", "32", "48")
                   ASM_EPI4_PAIR(1, "32", "64", "80", "96", "112")
                   ASM_EPI4_PAIR(2, "64", "128", "144", "160", "176")
                   ASM_EPI4_PAIR(3, "96", "192", "208", "224", "240")
                   :
                   : ASM_EPI_IN
                   : ASM_V0_V11, "v14", "memory");
}

ALWAYS_INLINE void mmla_tile(const int MP, const int NP, const int B4, const int G1,
                             const armllm_qa_tile a) {
  const int64_t BB = B4 ? 128 : 256, SB = B4 ? 64 : 32;
  const int8_t *const ap = a.ap;
  const int64_t nb = a.nb, bpg = G1 ? 1 : a.bpg; /* G1: group 32 */
  const uint8_t *w[4];
#pragma GCC unroll 4
  for (int p = 0; p < NP; p++) w[p] = a.w[p];
  const int32_t *bias0 = armllm_qa_acc_bias;
  __asm__("" : "+r"(bias0)); /* loads, not constants */
  int32x4_t acc[4][16];
  /* t starts at +0 (ABI); or the state of earlier K blocks, from row-major
   * y to the blocked order */
  if (a.first)
#pragma GCC unroll 16
    for (int i = 0; i < 16 * NP * MP; i += 4) vst1q_f32(a.tb + i, vdupq_n_f32(0.0f));
  if (!a.first)
#pragma GCC unroll 4
  for (int pr = 0; pr < MP; pr++)
#pragma GCC unroll 8
    for (int v = 0; v < 2 * NP; v++) { /* v: 4 columns of panel v/2 */
      const float *y0 = a.y + 2 * pr * a.ldy + 4 * v, *y1 = y0 + a.ldy;
      const int i = 4 * (v / 2) + 2 * (v % 2);
      const float64x2_t r0 = vreinterpretq_f64_f32(vld1q_f32(y0));
      const float64x2_t r1 = vreinterpretq_f64_f32(vld1q_f32(y1));
      const float32x4_t b0 = vreinterpretq_f32_f64(vtrn1q_f64(r0, r1));
      const float32x4_t b1 = vreinterpretq_f32_f64(vtrn2q_f64(r0, r1));
      vst1q_f32(a.tb + (pr * 4 * NP + i) * 4, b0);
      vst1q_f32(a.tb + (pr * 4 * NP + i + 1) * 4, b1);
    }
  for (int64_t g0 = 0, gi = 0; g0 < nb; g0 += bpg, gi++) {
    const int64_t gn = min64(bpg, nb - g0);
#pragma GCC unroll 4
    for (int pr = 0; pr < MP; pr++)
#pragma GCC unroll 16
      for (int v = 0; v < 4 * NP; v++) acc[pr][v] = vld1q_s32(bias0 + 4 * (4 * NP * pr + v));
    for (int64_t bi = 0; bi < gn; bi++) {
      const int8_t *ab = ap + (g0 + bi) * 4 * MP * 16;
      if (MP == 4 && NP == 1) {
        if (B4) mmla4_block_asm(acc, ab, w[0], vdupq_n_u8(15));
        else mmla8_block_asm(acc, ab, w[0]);
      } else if (B4) {
#pragma GCC unroll 2
        for (int hh = 0; hh < 2; hh++) { /* chunks hh (low nibbles) and hh + 2 (high) */
          int8x16_t al[4], ah[4];
#pragma GCC unroll 4
          for (int pr = 0; pr < MP; pr++) {
            al[pr] = vld1q_s8(ab + (hh * MP + pr) * 16);
            ah[pr] = vld1q_s8(ab + ((hh + 2) * MP + pr) * 16);
          }
#pragma GCC unroll 4
          for (int p = 0; p < NP; p++)
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++) {
              const uint8x16_t raw = vld1q_u8(w[p] + 16 * (4 * hh + s));
              const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(15)));
              const int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(raw, 4));
#pragma GCC unroll 4
              for (int pr = 0; pr < MP; pr++) {
                if (MP > 1) { /* reloaded: fewer live registers (16 accumulators) */
                  al[pr] = vld1q_s8(ab + (hh * MP + pr) * 16);
                  ah[pr] = vld1q_s8(ab + ((hh + 2) * MP + pr) * 16);
                }
                acc[pr][4 * p + s] = vmmlaq_s32(acc[pr][4 * p + s], al[pr], lo);
                acc[pr][4 * p + s] = vmmlaq_s32(acc[pr][4 * p + s], ah[pr], hi);
              }
              if (MP > 1) BARRIER; /* 16 accumulators + 8 x: one W load live at a time */
            }
          BARRIER;
        }
      } else {
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
          int8x16_t ax[4];
#pragma GCC unroll 4
          for (int pr = 0; pr < MP; pr++) ax[pr] = vld1q_s8(ab + (c * MP + pr) * 16);
#pragma GCC unroll 4
          for (int p = 0; p < NP; p++)
#pragma GCC unroll 4
            for (int s = 0; s < 4; s++) {
              const int8x16_t b = vld1q_s8((const int8_t *)w[p] + 16 * (4 * c + s));
#pragma GCC unroll 4
              for (int pr = 0; pr < MP; pr++) {
                if (MP > 1 && s > 0) ax[pr] = vld1q_s8(ab + (c * MP + pr) * 16); /* see B4 */
                acc[pr][4 * p + s] = vmmlaq_s32(acc[pr][4 * p + s], ax[pr], b);
              }
              if (MP > 1) BARRIER;
            }
          BARRIER;
        }
      }
#pragma GCC unroll 4
      for (int p = 0; p < NP; p++) w[p] += BB;
    }
    /* the group's epilogue, in the blocked order: lanes [r0 c0, r0 c1, r1 c0, r1 c1] */
    const float *sxg = a.sx + gi * MP * 8;
    if (MP == 4 && NP == 1) {
      const float *sp = (const float *)(const void *)w[0];
      if (B4) mmla4_epilogue_asm(acc, a.tb, sp, sxg, vdupq_n_f32(ARMLLM_QA_ACC_BIAS_F));
      else mmla8_epilogue_asm(acc, a.tb, sp, sxg, vdupq_n_f32(ARMLLM_QA_ACC_BIAS_F));
      w[0] += SB;
      continue;
    }
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++) {
      const float *sp = (const float *)(const void *)w[p];
      const float32x4_t d0 = vld1q_f32(sp), d1 = vld1q_f32(sp + 4);
      float32x4_t o0 = d0, o1 = d1;
      if (B4) {
        o0 = vld1q_f32(sp + 8);
        o1 = vld1q_f32(sp + 12);
      }
#pragma GCC unroll 4
      for (int s = 0; s < 4; s++) {
        const float32x4_t dv = dup_pair(s < 2 ? d0 : d1, s & 1);
        const float32x4_t ov = dup_pair(s < 2 ? o0 : o1, s & 1);
#pragma GCC unroll 4
        for (int pr = 0; pr < MP; pr++) {
          float *tp = a.tb + (pr * 4 * NP + 4 * p + s) * 4;
          const float32x4_t f = vsubq_f32(vreinterpretq_f32_s32(acc[pr][4 * p + s]),
                                          vdupq_n_f32(ARMLLM_QA_ACC_BIAS_F));
          const float32x4_t av = vmulq_f32(f, vld1q_f32(sxg + pr * 8));
          float32x4_t t = vfmaq_f32(vld1q_f32(tp), dv, av);
          if (B4) t = vfmaq_f32(t, ov, vld1q_f32(sxg + pr * 8 + 4));
          vst1q_f32(tp, t);
        }
      }
      w[p] += SB;
    }
  }
  /* t to row-major y (+ bias after the last K block) */
#pragma GCC unroll 4
  for (int pr = 0; pr < MP; pr++)
#pragma GCC unroll 8
    for (int v = 0; v < 2 * NP; v++) {
      float *y0 = a.y + 2 * pr * a.ldy + 4 * v, *y1 = y0 + a.ldy;
      const int i = 4 * (v / 2) + 2 * (v % 2);
      const float64x2_t b0 = vreinterpretq_f64_f32(vld1q_f32(a.tb + (pr * 4 * NP + i) * 4));
      const float64x2_t b1 = vreinterpretq_f64_f32(vld1q_f32(a.tb + (pr * 4 * NP + i + 1) * 4));
      float32x4_t r0 = vreinterpretq_f32_f64(vtrn1q_f64(b0, b1));
      float32x4_t r1 = vreinterpretq_f32_f64(vtrn2q_f64(b0, b1));
      if (a.last && a.bias) {
        const float32x4_t bv = vld1q_f32(a.bias + 4 * v);
        r0 = vaddq_f32(r0, bv);
        r1 = vaddq_f32(r1, bv);
      }
      vst1q_f32(y0, r0);
      vst1q_f32(y1, r1);
    }
}

/* The group-32 prefill tile: 3 row pairs x 1 panel, t in registers.
 *
 * With group 32 every 2x2 accumulator gets only 4 SMMLA per group, then
 * the ABI's epilogue (FSUB, FMUL, FMLA; 4 bits: + FMLA) on the same two
 * vector pipes. The 4x1 tile also stored and reloaded its 16 t vectors per
 * group (a store takes a vector-pipe slot too) and needs 16 + 16
 * registers to keep them; 3 pairs x 1 panel keeps its 12 t vectors in
 * registers over the whole K block (12 accumulators + 12 t + 8 working
 * registers), so a group costs 48 SMMLA + 36 (4 bits: 48) epilogue
 * operations + 4 (8) DUPs of d (o) and no stores. One asm statement per
 * group: the accumulators are v16..v27 (acc[pair][s] = v(16 + 4 pair +
 * s)), x operands v0..v2, W operands v4..v7 (4 bits: one raw load at a
 * time, unpacked in place), mg v3; t is %[t<pair><s>]. */
#define G_LDX(XO, XO2) "ldp q0, q1, [%[ab], #" XO "]\n\t" "ldr q2, [%[ab], #" XO2 "]\n\t"
#define G_SMM(A, X, W) "smmla v" A ".4s, v" X ".16b, v" W ".16b\n\t"
#define G_SMM_S(S, A0, A1, A2, W) G_SMM(A0, "0", W) G_SMM(A1, "1", W) G_SMM(A2, "2", W)
/* 8 bits: chunk c, x at byte 48c, W operands s = 0..3 at byte 64c + 16s */
#define G_CHUNK8(XO, XO2, WO, WO2)                                                   \
  G_LDX(XO, XO2) "ldp q4, q5, [%[wb], #" WO "]\n\t" "ldp q6, q7, [%[wb], #" WO2 "]\n\t" \
  G_SMM_S(0, "16", "20", "24", "4") G_SMM_S(1, "17", "21", "25", "5")                \
  G_SMM_S(2, "18", "22", "26", "6") G_SMM_S(3, "19", "23", "27", "7")
/* 4 bits: operand s of chunk hh (low nibbles, AND) or hh + 2 (high, USHR)
 * from the raw bytes at 64hh + 16s */
#define G_NIB_LO(WO, S, A0, A1, A2)                                                  \
  "ldr q4, [%[wb], #" WO "]\n\t" "and v4.16b, v4.16b, v5.16b\n\t" G_SMM_S(S, A0, A1, A2, "4")
#define G_NIB_HI(WO, S, A0, A1, A2)                                                  \
  "ldr q6, [%[wb], #" WO "]\n\t" "ushr v6.16b, v6.16b, #4\n\t" G_SMM_S(S, A0, A1, A2, "6")
#define G_HALF4(NIB, XO, XO2, W0, W1, W2, W3)                                        \
  G_LDX(XO, XO2) NIB(W0, 0, "16", "20", "24") NIB(W1, 1, "17", "21", "25")          \
  NIB(W2, 2, "18", "22", "26") NIB(W3, 3, "19", "23", "27")
#define G_INIT                                                                       \
  "ldp q16, q17, [%[bias]]\n\t" "ldp q18, q19, [%[bias], #32]\n\t"                   \
  "ldp q20, q21, [%[bias], #64]\n\t" "ldp q22, q23, [%[bias], #96]\n\t"              \
  "ldp q24, q25, [%[bias], #128]\n\t" "ldp q26, q27, [%[bias], #160]\n\t"
/* the four [D, D] of the 8 floats at byte SO of the group's scales in v4..v7 */
#define G_DUPS(SO)                                                                   \
  "ldp q6, q7, [%[wb], #" SO "]\n\t" "dup v4.2d, v6.d[0]\n\t" "dup v5.2d, v6.d[1]\n\t"  \
  "dup v6.2d, v7.d[0]\n\t" "dup v7.2d, v7.d[1]\n\t"
/* per pair, [sx, sx, sx', sx'] (then [b, b, b', b'] at byte 16) in v0..v2 */
#define G_SX(OFF)                                                                    \
  "ldr q0, [%[sx], #" OFF "]\n\t" "ldr q1, [%[sx], #32 + " OFF "]\n\t"               \
  "ldr q2, [%[sx], #64 + " OFF "]\n\t"
#define G_EPI_A(A, X, D, T)                                                          \
  "fsub v" A ".4s, v" A ".4s, v3.4s\n\t" "fmul v" A ".4s, v" A ".4s, v" X ".4s\n\t"   \
  "fmla %[" T "].4s, v" A ".4s, v" D ".4s\n\t"
#define G_EPI_D                                                                      \
  G_EPI_A("16", "0", "4", "t00") G_EPI_A("17", "0", "5", "t01")                      \
  G_EPI_A("18", "0", "6", "t02") G_EPI_A("19", "0", "7", "t03")                      \
  G_EPI_A("20", "1", "4", "t10") G_EPI_A("21", "1", "5", "t11")                      \
  G_EPI_A("22", "1", "6", "t12") G_EPI_A("23", "1", "7", "t13")                      \
  G_EPI_A("24", "2", "4", "t20") G_EPI_A("25", "2", "5", "t21")                      \
  G_EPI_A("26", "2", "6", "t22") G_EPI_A("27", "2", "7", "t23")
#define G_EPI_B(X, O, T) "fmla %[" T "].4s, v" O ".4s, v" X ".4s\n\t"
#define G_EPI_O                                                                      \
  G_EPI_B("0", "4", "t00") G_EPI_B("0", "5", "t01") G_EPI_B("0", "6", "t02")          \
  G_EPI_B("0", "7", "t03") G_EPI_B("1", "4", "t10") G_EPI_B("1", "5", "t11")          \
  G_EPI_B("1", "6", "t12") G_EPI_B("1", "7", "t13") G_EPI_B("2", "4", "t20")          \
  G_EPI_B("2", "5", "t21") G_EPI_B("2", "6", "t22") G_EPI_B("2", "7", "t23")
#define G_T_OPS                                                                      \
  [t00] "+w"(t[0][0]), [t01] "+w"(t[0][1]), [t02] "+w"(t[0][2]), [t03] "+w"(t[0][3]), \
      [t10] "+w"(t[1][0]), [t11] "+w"(t[1][1]), [t12] "+w"(t[1][2]), [t13] "+w"(t[1][3]), \
      [t20] "+w"(t[2][0]), [t21] "+w"(t[2][1]), [t22] "+w"(t[2][2]), [t23] "+w"(t[2][3])
#define G_CLOBBERS                                                                   \
  "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v16", "v17", "v18", "v19", "v20", "v21", \
      "v22", "v23", "v24", "v25", "v26", "v27", "memory"

ALWAYS_INLINE void mmla_g32_tile(const int B4, const armllm_qa_tile a) {
  const int MP = 3; /* row pairs */
  const int64_t GB = B4 ? 128 + 64 : 256 + 32; /* a group in the panel: block, scales */
  const int8_t *ab = a.ap;
  const uint8_t *wb = a.w[0];
  const float *sx = a.sx;
  const int32_t *bias0 = armllm_qa_acc_bias;
  static const float mg[4] __attribute__((aligned(16))) = {
      ARMLLM_QA_ACC_BIAS_F, ARMLLM_QA_ACC_BIAS_F, ARMLLM_QA_ACC_BIAS_F, ARMLLM_QA_ACC_BIAS_F};
  static const uint8_t m15[16] __attribute__((aligned(16))) = {
      15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15};
  /* t in the blocked order t[pair][s] = [r0 c, r0 c', r1 c, r1 c'] (c = 2s):
   * +0 (ABI) or the state of earlier K blocks, from row-major y */
  float32x4_t t[3][4];
#pragma GCC unroll 3
  for (int pr = 0; pr < MP; pr++)
#pragma GCC unroll 2
    for (int v = 0; v < 2; v++) {
      if (a.first) {
        t[pr][2 * v] = t[pr][2 * v + 1] = vdupq_n_f32(0.0f);
        continue;
      }
      const float *y0 = a.y + 2 * pr * a.ldy + 4 * v;
      const float64x2_t r0 = vreinterpretq_f64_f32(vld1q_f32(y0));
      const float64x2_t r1 = vreinterpretq_f64_f32(vld1q_f32(y0 + a.ldy));
      t[pr][2 * v] = vreinterpretq_f32_f64(vtrn1q_f64(r0, r1));
      t[pr][2 * v + 1] = vreinterpretq_f32_f64(vtrn2q_f64(r0, r1));
    }
  for (int64_t gi = 0; gi < a.nb; gi++, ab += 4 * MP * 16, wb += GB, sx += MP * 8) {
    if (B4)
      __asm__(G_INIT "ldr q5, [%[m15]]\n\t"
              G_HALF4(G_NIB_LO, "0", "32", "0", "16", "32", "48")
              G_HALF4(G_NIB_HI, "96", "128", "0", "16", "32", "48")
              G_HALF4(G_NIB_LO, "48", "80", "64", "80", "96", "112")
              G_HALF4(G_NIB_HI, "144", "176", "64", "80", "96", "112")
              "ldr q3, [%[mg]]\n\t" G_DUPS("128") G_SX("0") G_EPI_D
              G_DUPS("160") G_SX("16") G_EPI_O
              : G_T_OPS
              : [ab] "r"(ab), [wb] "r"(wb), [sx] "r"(sx), [bias] "r"(bias0), [mg] "r"(mg),
                [m15] "r"(m15)
              : G_CLOBBERS);
    else
      __asm__(G_INIT G_CHUNK8("0", "32", "0", "32") G_CHUNK8("48", "80", "64", "96")
              G_CHUNK8("96", "128", "128", "160") G_CHUNK8("144", "176", "192", "224")
              "ldr q3, [%[mg]]\n\t" G_DUPS("256") G_SX("0") G_EPI_D
              : G_T_OPS
              : [ab] "r"(ab), [wb] "r"(wb), [sx] "r"(sx), [bias] "r"(bias0), [mg] "r"(mg)
              : G_CLOBBERS);
  }
  /* t to row-major y (+ bias after the last K block) */
#pragma GCC unroll 3
  for (int pr = 0; pr < MP; pr++)
#pragma GCC unroll 2
    for (int v = 0; v < 2; v++) {
      float *y0 = a.y + 2 * pr * a.ldy + 4 * v;
      const float64x2_t b0 = vreinterpretq_f64_f32(t[pr][2 * v]);
      const float64x2_t b1 = vreinterpretq_f64_f32(t[pr][2 * v + 1]);
      float32x4_t r0 = vreinterpretq_f32_f64(vtrn1q_f64(b0, b1));
      float32x4_t r1 = vreinterpretq_f32_f64(vtrn2q_f64(b0, b1));
      if (a.last && a.bias) {
        const float32x4_t bv = vld1q_f32(a.bias + 4 * v);
        r0 = vaddq_f32(r0, bv);
        r1 = vaddq_f32(r1, bv);
      }
      vst1q_f32(y0, r0);
      vst1q_f32(y0 + a.ldy, r1);
    }
}

/* mmla_<pairs>x<panels>_b<bits>[_g32] */
ARMLLM_QA_KERNELS(mmla, mmla_tile, 4, 1) ARMLLM_QA_KERNELS(mmla, mmla_tile, 1, 4)
ARMLLM_QA_KERNELS(mmla, mmla_tile, 2, 2)
static __attribute__((noinline)) void mmla_3x1_b8_g32(const armllm_qa_tile *a) {
  mmla_g32_tile(0, *a);
}
static __attribute__((noinline)) void mmla_3x1_b4_g32(const armllm_qa_tile *a) {
  mmla_g32_tile(1, *a);
}

/* [bits 4][M for decode, 0 for prefill]: {kernel, rows, panels, packed rows} */
#define KINDS(B)                                                                          \
  {{mmla_4x1_b##B, 8, 1, 1}, {mmla_1x4_b##B, 2, 4, 1}, {mmla_1x4_b##B, 2, 4, 1},          \
   {mmla_2x2_b##B, 4, 2, 1}, {mmla_2x2_b##B, 4, 2, 1}}
static const armllm_qa_kind tile_kinds[2][DECODE_MAX_M + 1] = {KINDS(8), KINDS(4)};
#undef KINDS

/* The tile kind of a GEMM of m rows. */
static armllm_qa_kind kind_of(int64_t m, int bits, int64_t group) {
  armllm_qa_kind kind = tile_kinds[bits == 4][m <= DECODE_MAX_M ? m : 0];
  if (group == BLK && m > G32_MIN_M) /* {kernel, rows, panels, packed rows} */
    kind = (armllm_qa_kind){bits == 4 ? mmla_3x1_b4_g32 : mmla_3x1_b8_g32, 6, 1, 1};
  return kind;
}

void armllm_neon_mmla_gemm_wq(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k,
                              int64_t ldq, const float *scale, int64_t ldsc,
                              const int32_t *gsum, int64_t ldgs, const void *packed_w, int64_t n,
                              int bits, int64_t group, const float *bias, float *y, int64_t ldy) {
  armllm_qa_gemm(pool, xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, 0, n, bits, group, bias,
                 y, ldy, kind_of(m, bits, group), MIN_CHUNK_MACS);
}

void armllm_neon_mmla_gemm_wq_cols(const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                                   const float *scale, int64_t ldsc, const int32_t *gsum,
                                   int64_t ldgs, const void *packed_w, int64_t n, int bits,
                                   int64_t group, int64_t n0, int64_t n1, const float *bias,
                                   float *y, int64_t ldy) {
  (void)n;
  armllm_qa_gemm(NULL, xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, n0, n1, bits, group, bias,
                 y, ldy, kind_of(m, bits, group), MIN_CHUNK_MACS);
}
