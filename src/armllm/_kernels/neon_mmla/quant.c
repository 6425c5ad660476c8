/* neon_mmla/quant.c: the quantized GEMM (int8 or uint4 weights, int8
 * activations) on Armv8.6 I8MM: SMMLA multiplies a 2x8 block of x (two
 * rows, 8 k) by a 2x8 block of W (two output rows, 8 k) into a 2x2 int32
 * block [x0w0, x0w1, x1w0, x1w1]. Activations are quantized by the NEON
 * quant_act (neon/quant.c).
 *
 * Packed layout "mmla_n8k8" (shared with sve/quant.c): panels of 8 output
 *   rows (the last zero-padded: q = 0, d = o = 0); K padded to kpad (a
 *   multiple of 32) and cut into blocks of 32; a group is group/32 blocks
 *   (channelwise: groups of 128, the row's scale repeated; the last group
 *   may be shorter). Panel p is one byte
 *   stream: for each group, its blocks, then d[8] (f32, rows 8p..8p+7),
 *   then for 4 bits o[8]. A block holds 16 SMMLA operands v = 4c + s of 16
 *   bytes, chunk c (8 k) and row pair s:
 *     8 bits: W[8p + 2s + h, 32b + 8c + i] at byte 16v + 8h + i;
 *     4 bits: operand v < 8 in the low nibbles of bytes 16v .. 16v + 15,
 *             operand v + 8 in their high nibbles (AND / USHR by 4), so a
 *             load of 16, 32 or 64 bytes unpacks to whole row pairs of one
 *             chunk (what SVE at 128, 256 and 512 bits loads).
 *   A panel takes nblk*BB + ng*SB bytes (BB = 256 / 128, SB = 32 / 64).
 *
 * Exactness: group sums are exact int32; the float epilogue is the ABI's
 *   a = (float)acc * sx; t = fma(d, a, t) (+ fma(o, (float)gsum * sx, t))
 *   per group, y = t (+ bias), so every path and thread count gives ref's
 *   bits.
 *
 * Loops: x rows are packed per (8-row tile, K block of 1024 k) onto the
 *   stack as SMMLA operands (row pairs x 8 k), with each pair's per-group
 *   scales as [s0, s0, s1, s1] floats (and gsum * sx likewise). Prefill tile: 4 row pairs x 1 panel = 16
 *   accumulators, 16 SMMLA per 4 x + 4 W operands (4 bits: 2 loads, 4
 *   unpack ops); its 32-k block and its group epilogue are inline assembly
 *   (GCC 12 copies SMMLA accumulators around otherwise), with a variant for
 *   group 32 that drops the block loop. Decode (M <= 4): 1 pair x 4 panels
 *   or 2 pairs x 2 panels. t lives in a stack tile in the accumulators'
 *   2x2-blocked order; between K blocks it is kept in y (row-major,
 *   exact). Group sums start biased so that int -> float is one FSUB
 *   (below).
 */
#include <arm_neon.h>

#include "../armllm_kernels.h"
#include "../gemm_plan.h"
#define ARMLLM_QA_SMMLA_ROWS
#include "../quant_arm.h"

#define NR ARMLLM_QA_NR
#define BLK ARMLLM_QA_BLK
#define KC_BLOCKS ARMLLM_QA_KC_BLOCKS
#define CP_MAX 16          /* panels per prefill N chunk */
#define DECODE_MAX_M 4
#define MIN_CHUNK_MACS (1 << 18)

#define ALWAYS_INLINE static inline __attribute__((always_inline))
/* Keeps GCC from hoisting the weight loads of later chunks (spills). */
#define BARRIER __asm__ volatile("" ::: "memory")

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ----------------------------------------------------------- packing */

size_t armllm_neon_mmla_gemm_wq_packed_len(int64_t n, int64_t k, int bits, int64_t group,
                                           const float *d, const float *o) {
  (void)d, (void)o; /* f32 scales whatever their values */
  return armllm_qa_packed_len(n, k, bits, group);
}

void armllm_neon_mmla_gemm_wq_pack(const int8_t *q, int64_t n, int64_t k, int bits,
                                   int64_t group, const float *d, const float *o, void *packed) {
  const wq_geom G = geom_of(k, bits, group);
  const int64_t ngin = group ? G.ng : 1; /* d, o given per row when channelwise */
  uint8_t *dst = packed;
  for (int64_t p = 0; p < (n + NR - 1) / NR; p++)
    for (int64_t g = 0; g < G.ng; g++) {
      const int64_t b1 = min64((g + 1) * G.bpg, G.nblk);
      for (int64_t b = g * G.bpg; b < b1; b++, dst += G.bb) {
        if (bits == 4) memset(dst, 0, (size_t)G.bb);
        for (int v = 0; v < 16; v++)
          for (int e = 0; e < 16; e++) {
            const int c = v / 4, s = v % 4, h = e / 8, i = e % 8;
            const int64_t row = p * NR + 2 * s + h, kk = b * BLK + 8 * c + i;
            const uint8_t val = row < n && kk < k ? (uint8_t)q[row * k + kk] : 0;
            if (bits == 4) dst[16 * (v % 8) + e] |= (uint8_t)((val & 15) << (v < 8 ? 0 : 4));
            else dst[16 * v + e] = val;
          }
      }
      dst = qa_pack_scales(dst, d, o, n, p, g, group, ngin, G.sb);
    }
}

/* ------------------------------------------------------ micro-kernels */

typedef struct {
  const int8_t *ap;  /* x operands of this K block: [block][chunk][pair] 16 bytes */
  const uint8_t *w[4]; /* panels (past the valid ones: the last again) at the K block */
  int64_t nb, bpg;   /* blocks in this K block, blocks per group */
  const float *sxp;  /* [group of the K block][pair]: sx as [s0, s0, s1, s1], then
                        (float)gsum * sx in the same order (4 bits) */
  float *y;          /* 2*MP rows x 8*NP columns, row-major: t between K blocks */
  int64_t ldy;
  const float *bias; /* this tile's columns or NULL; used in the last K block */
  int first, last;
  float *tb;         /* t in the accumulators' order: [pair][panel*4 + s][4] */
} mtile_args;

/* Group sums of grouped weights start at the bits of 1.5 * 2^23 (ACC_BIAS):
 * a sum s with |s| < 2^22 (any group of <= 128 k: |s| <= 128^3 = 2^21) then
 * reads as the float 1.5 * 2^23 + s exactly, and (float)s is that minus
 * 1.5 * 2^23: one FSUB on either vector pipe instead of SCVTF (two uops on
 * V0 of Neoverse N2/V2). The starting values are loaded from memory (load
 * pipes), not materialized with MOVs. Channelwise weights are groups of 128
 * too. */
#define ACC_BIAS 0x4B400000
#define ACC_BIAS_F 12582912.0f
#define B4_ ACC_BIAS, ACC_BIAS, ACC_BIAS, ACC_BIAS
#define B16_ B4_, B4_, B4_, B4_
static const int32_t acc_bias[64] __attribute__((aligned(64))) = {B16_, B16_, B16_, B16_};
#undef B4_
#undef B16_

ALWAYS_INLINE float32x4_t dup_pair(float32x4_t v, int lane) { /* [v2l, v2l+1] twice */
  const float64x2_t f = vreinterpretq_f64_f32(v);
  return vreinterpretq_f32_f64(lane ? vdupq_laneq_f64(f, 1) : vdupq_laneq_f64(f, 0));
}

/* One 32-k block of the 8x8 prefill tile (4 row pairs x 4 W operands per
 * chunk; acc[pair][operand]) in assembly: from intrinsics GCC 12 copies
 * accumulators between registers (MOVs that take the SMMLA pipes) or
 * spills them. Operands: ap (256 bytes, [chunk][pair]), wb (the block). */
ALWAYS_INLINE void mmla8_block_asm(int32x4_t acc[4][16], const int8_t *ab, const uint8_t *wb) {
  __asm__(
      "ldp q0, q1, [%[ap], #0]\n\t"
      "ldp q2, q3, [%[ap], #32]\n\t"
      "ldp q4, q5, [%[bp], #0]\n\t"
      "smmla %[c00].4s, v0.16b, v4.16b\n\t"
      "smmla %[c10].4s, v1.16b, v4.16b\n\t"
      "smmla %[c20].4s, v2.16b, v4.16b\n\t"
      "smmla %[c30].4s, v3.16b, v4.16b\n\t"
      "smmla %[c01].4s, v0.16b, v5.16b\n\t"
      "smmla %[c11].4s, v1.16b, v5.16b\n\t"
      "smmla %[c21].4s, v2.16b, v5.16b\n\t"
      "smmla %[c31].4s, v3.16b, v5.16b\n\t"
      "ldp q0, q1, [%[ap], #64]\n\t"
      "ldp q2, q3, [%[ap], #96]\n\t"
      "ldp q4, q5, [%[bp], #64]\n\t"
      "smmla %[c00].4s, v0.16b, v4.16b\n\t"
      "smmla %[c10].4s, v1.16b, v4.16b\n\t"
      "smmla %[c20].4s, v2.16b, v4.16b\n\t"
      "smmla %[c30].4s, v3.16b, v4.16b\n\t"
      "smmla %[c01].4s, v0.16b, v5.16b\n\t"
      "smmla %[c11].4s, v1.16b, v5.16b\n\t"
      "smmla %[c21].4s, v2.16b, v5.16b\n\t"
      "smmla %[c31].4s, v3.16b, v5.16b\n\t"
      "ldp q0, q1, [%[ap], #128]\n\t"
      "ldp q2, q3, [%[ap], #160]\n\t"
      "ldp q4, q5, [%[bp], #128]\n\t"
      "smmla %[c00].4s, v0.16b, v4.16b\n\t"
      "smmla %[c10].4s, v1.16b, v4.16b\n\t"
      "smmla %[c20].4s, v2.16b, v4.16b\n\t"
      "smmla %[c30].4s, v3.16b, v4.16b\n\t"
      "smmla %[c01].4s, v0.16b, v5.16b\n\t"
      "smmla %[c11].4s, v1.16b, v5.16b\n\t"
      "smmla %[c21].4s, v2.16b, v5.16b\n\t"
      "smmla %[c31].4s, v3.16b, v5.16b\n\t"
      "ldp q0, q1, [%[ap], #192]\n\t"
      "ldp q2, q3, [%[ap], #224]\n\t"
      "ldp q4, q5, [%[bp], #192]\n\t"
      "smmla %[c00].4s, v0.16b, v4.16b\n\t"
      "smmla %[c10].4s, v1.16b, v4.16b\n\t"
      "smmla %[c20].4s, v2.16b, v4.16b\n\t"
      "smmla %[c30].4s, v3.16b, v4.16b\n\t"
      "smmla %[c01].4s, v0.16b, v5.16b\n\t"
      "smmla %[c11].4s, v1.16b, v5.16b\n\t"
      "smmla %[c21].4s, v2.16b, v5.16b\n\t"
      "smmla %[c31].4s, v3.16b, v5.16b\n\t"
      : [c00] "+w"(acc[0][0]), [c01] "+w"(acc[0][1]), [c10] "+w"(acc[1][0]), [c11] "+w"(acc[1][1]), [c20] "+w"(acc[2][0]), [c21] "+w"(acc[2][1]), [c30] "+w"(acc[3][0]), [c31] "+w"(acc[3][1])
      : [ap] "r"(ab), [bp] "r"(wb)
      : "v0", "v1", "v2", "v3", "v4", "v5", "memory");

  __asm__(
      "ldp q0, q1, [%[ap], #0]\n\t"
      "ldp q2, q3, [%[ap], #32]\n\t"
      "ldp q4, q5, [%[bp], #32]\n\t"
      "smmla %[c02].4s, v0.16b, v4.16b\n\t"
      "smmla %[c12].4s, v1.16b, v4.16b\n\t"
      "smmla %[c22].4s, v2.16b, v4.16b\n\t"
      "smmla %[c32].4s, v3.16b, v4.16b\n\t"
      "smmla %[c03].4s, v0.16b, v5.16b\n\t"
      "smmla %[c13].4s, v1.16b, v5.16b\n\t"
      "smmla %[c23].4s, v2.16b, v5.16b\n\t"
      "smmla %[c33].4s, v3.16b, v5.16b\n\t"
      "ldp q0, q1, [%[ap], #64]\n\t"
      "ldp q2, q3, [%[ap], #96]\n\t"
      "ldp q4, q5, [%[bp], #96]\n\t"
      "smmla %[c02].4s, v0.16b, v4.16b\n\t"
      "smmla %[c12].4s, v1.16b, v4.16b\n\t"
      "smmla %[c22].4s, v2.16b, v4.16b\n\t"
      "smmla %[c32].4s, v3.16b, v4.16b\n\t"
      "smmla %[c03].4s, v0.16b, v5.16b\n\t"
      "smmla %[c13].4s, v1.16b, v5.16b\n\t"
      "smmla %[c23].4s, v2.16b, v5.16b\n\t"
      "smmla %[c33].4s, v3.16b, v5.16b\n\t"
      "ldp q0, q1, [%[ap], #128]\n\t"
      "ldp q2, q3, [%[ap], #160]\n\t"
      "ldp q4, q5, [%[bp], #160]\n\t"
      "smmla %[c02].4s, v0.16b, v4.16b\n\t"
      "smmla %[c12].4s, v1.16b, v4.16b\n\t"
      "smmla %[c22].4s, v2.16b, v4.16b\n\t"
      "smmla %[c32].4s, v3.16b, v4.16b\n\t"
      "smmla %[c03].4s, v0.16b, v5.16b\n\t"
      "smmla %[c13].4s, v1.16b, v5.16b\n\t"
      "smmla %[c23].4s, v2.16b, v5.16b\n\t"
      "smmla %[c33].4s, v3.16b, v5.16b\n\t"
      "ldp q0, q1, [%[ap], #192]\n\t"
      "ldp q2, q3, [%[ap], #224]\n\t"
      "ldp q4, q5, [%[bp], #224]\n\t"
      "smmla %[c02].4s, v0.16b, v4.16b\n\t"
      "smmla %[c12].4s, v1.16b, v4.16b\n\t"
      "smmla %[c22].4s, v2.16b, v4.16b\n\t"
      "smmla %[c32].4s, v3.16b, v4.16b\n\t"
      "smmla %[c03].4s, v0.16b, v5.16b\n\t"
      "smmla %[c13].4s, v1.16b, v5.16b\n\t"
      "smmla %[c23].4s, v2.16b, v5.16b\n\t"
      "smmla %[c33].4s, v3.16b, v5.16b\n\t"
      : [c02] "+w"(acc[0][2]), [c03] "+w"(acc[0][3]), [c12] "+w"(acc[1][2]), [c13] "+w"(acc[1][3]), [c22] "+w"(acc[2][2]), [c23] "+w"(acc[2][3]), [c32] "+w"(acc[3][2]), [c33] "+w"(acc[3][3])
      : [ap] "r"(ab), [bp] "r"(wb)
      : "v0", "v1", "v2", "v3", "v4", "v5", "memory");

}

ALWAYS_INLINE void mmla4_block_asm(int32x4_t acc[4][16], const int8_t *ab, const uint8_t *wb,
                                   uint8x16_t m15) {
  __asm__(
      "ldp q0, q1, [%[ap], #0]\n\t"
      "ldp q2, q3, [%[ap], #32]\n\t"
      "ldp q4, q5, [%[ap], #128]\n\t"
      "ldp q6, q7, [%[ap], #160]\n\t"
      "ldr q8, [%[bp], #0]\n\t"
      "and v9.16b, v8.16b, %[m15].16b\n\t"
      "ushr v10.16b, v8.16b, #4\n\t"
      "smmla %[c00].4s, v0.16b, v9.16b\n\t"
      "smmla %[c10].4s, v1.16b, v9.16b\n\t"
      "smmla %[c20].4s, v2.16b, v9.16b\n\t"
      "smmla %[c30].4s, v3.16b, v9.16b\n\t"
      "smmla %[c00].4s, v4.16b, v10.16b\n\t"
      "smmla %[c10].4s, v5.16b, v10.16b\n\t"
      "smmla %[c20].4s, v6.16b, v10.16b\n\t"
      "smmla %[c30].4s, v7.16b, v10.16b\n\t"
      "ldr q11, [%[bp], #16]\n\t"
      "and v12.16b, v11.16b, %[m15].16b\n\t"
      "ushr v13.16b, v11.16b, #4\n\t"
      "smmla %[c01].4s, v0.16b, v12.16b\n\t"
      "smmla %[c11].4s, v1.16b, v12.16b\n\t"
      "smmla %[c21].4s, v2.16b, v12.16b\n\t"
      "smmla %[c31].4s, v3.16b, v12.16b\n\t"
      "smmla %[c01].4s, v4.16b, v13.16b\n\t"
      "smmla %[c11].4s, v5.16b, v13.16b\n\t"
      "smmla %[c21].4s, v6.16b, v13.16b\n\t"
      "smmla %[c31].4s, v7.16b, v13.16b\n\t"
      "ldp q0, q1, [%[ap], #64]\n\t"
      "ldp q2, q3, [%[ap], #96]\n\t"
      "ldp q4, q5, [%[ap], #192]\n\t"
      "ldp q6, q7, [%[ap], #224]\n\t"
      "ldr q8, [%[bp], #64]\n\t"
      "and v9.16b, v8.16b, %[m15].16b\n\t"
      "ushr v10.16b, v8.16b, #4\n\t"
      "smmla %[c00].4s, v0.16b, v9.16b\n\t"
      "smmla %[c10].4s, v1.16b, v9.16b\n\t"
      "smmla %[c20].4s, v2.16b, v9.16b\n\t"
      "smmla %[c30].4s, v3.16b, v9.16b\n\t"
      "smmla %[c00].4s, v4.16b, v10.16b\n\t"
      "smmla %[c10].4s, v5.16b, v10.16b\n\t"
      "smmla %[c20].4s, v6.16b, v10.16b\n\t"
      "smmla %[c30].4s, v7.16b, v10.16b\n\t"
      "ldr q11, [%[bp], #80]\n\t"
      "and v12.16b, v11.16b, %[m15].16b\n\t"
      "ushr v13.16b, v11.16b, #4\n\t"
      "smmla %[c01].4s, v0.16b, v12.16b\n\t"
      "smmla %[c11].4s, v1.16b, v12.16b\n\t"
      "smmla %[c21].4s, v2.16b, v12.16b\n\t"
      "smmla %[c31].4s, v3.16b, v12.16b\n\t"
      "smmla %[c01].4s, v4.16b, v13.16b\n\t"
      "smmla %[c11].4s, v5.16b, v13.16b\n\t"
      "smmla %[c21].4s, v6.16b, v13.16b\n\t"
      "smmla %[c31].4s, v7.16b, v13.16b\n\t"
      : [c00] "+w"(acc[0][0]), [c01] "+w"(acc[0][1]), [c10] "+w"(acc[1][0]), [c11] "+w"(acc[1][1]), [c20] "+w"(acc[2][0]), [c21] "+w"(acc[2][1]), [c30] "+w"(acc[3][0]), [c31] "+w"(acc[3][1])
      : [ap] "r"(ab), [bp] "r"(wb), [m15] "w"(m15)
      : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11", "v12", "v13", "memory");

  __asm__(
      "ldp q0, q1, [%[ap], #0]\n\t"
      "ldp q2, q3, [%[ap], #32]\n\t"
      "ldp q4, q5, [%[ap], #128]\n\t"
      "ldp q6, q7, [%[ap], #160]\n\t"
      "ldr q8, [%[bp], #32]\n\t"
      "and v9.16b, v8.16b, %[m15].16b\n\t"
      "ushr v10.16b, v8.16b, #4\n\t"
      "smmla %[c02].4s, v0.16b, v9.16b\n\t"
      "smmla %[c12].4s, v1.16b, v9.16b\n\t"
      "smmla %[c22].4s, v2.16b, v9.16b\n\t"
      "smmla %[c32].4s, v3.16b, v9.16b\n\t"
      "smmla %[c02].4s, v4.16b, v10.16b\n\t"
      "smmla %[c12].4s, v5.16b, v10.16b\n\t"
      "smmla %[c22].4s, v6.16b, v10.16b\n\t"
      "smmla %[c32].4s, v7.16b, v10.16b\n\t"
      "ldr q11, [%[bp], #48]\n\t"
      "and v12.16b, v11.16b, %[m15].16b\n\t"
      "ushr v13.16b, v11.16b, #4\n\t"
      "smmla %[c03].4s, v0.16b, v12.16b\n\t"
      "smmla %[c13].4s, v1.16b, v12.16b\n\t"
      "smmla %[c23].4s, v2.16b, v12.16b\n\t"
      "smmla %[c33].4s, v3.16b, v12.16b\n\t"
      "smmla %[c03].4s, v4.16b, v13.16b\n\t"
      "smmla %[c13].4s, v5.16b, v13.16b\n\t"
      "smmla %[c23].4s, v6.16b, v13.16b\n\t"
      "smmla %[c33].4s, v7.16b, v13.16b\n\t"
      "ldp q0, q1, [%[ap], #64]\n\t"
      "ldp q2, q3, [%[ap], #96]\n\t"
      "ldp q4, q5, [%[ap], #192]\n\t"
      "ldp q6, q7, [%[ap], #224]\n\t"
      "ldr q8, [%[bp], #96]\n\t"
      "and v9.16b, v8.16b, %[m15].16b\n\t"
      "ushr v10.16b, v8.16b, #4\n\t"
      "smmla %[c02].4s, v0.16b, v9.16b\n\t"
      "smmla %[c12].4s, v1.16b, v9.16b\n\t"
      "smmla %[c22].4s, v2.16b, v9.16b\n\t"
      "smmla %[c32].4s, v3.16b, v9.16b\n\t"
      "smmla %[c02].4s, v4.16b, v10.16b\n\t"
      "smmla %[c12].4s, v5.16b, v10.16b\n\t"
      "smmla %[c22].4s, v6.16b, v10.16b\n\t"
      "smmla %[c32].4s, v7.16b, v10.16b\n\t"
      "ldr q11, [%[bp], #112]\n\t"
      "and v12.16b, v11.16b, %[m15].16b\n\t"
      "ushr v13.16b, v11.16b, #4\n\t"
      "smmla %[c03].4s, v0.16b, v12.16b\n\t"
      "smmla %[c13].4s, v1.16b, v12.16b\n\t"
      "smmla %[c23].4s, v2.16b, v12.16b\n\t"
      "smmla %[c33].4s, v3.16b, v12.16b\n\t"
      "smmla %[c03].4s, v4.16b, v13.16b\n\t"
      "smmla %[c13].4s, v5.16b, v13.16b\n\t"
      "smmla %[c23].4s, v6.16b, v13.16b\n\t"
      "smmla %[c33].4s, v7.16b, v13.16b\n\t"
      : [c02] "+w"(acc[0][2]), [c03] "+w"(acc[0][3]), [c12] "+w"(acc[1][2]), [c13] "+w"(acc[1][3]), [c22] "+w"(acc[2][2]), [c23] "+w"(acc[2][3]), [c32] "+w"(acc[3][2]), [c33] "+w"(acc[3][3])
      : [ap] "r"(ab), [bp] "r"(wb), [m15] "w"(m15)
      : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11", "v12", "v13", "memory");

}

/* The group epilogue of the 8x8 tile (biased sums) in assembly, for the
 * same reason: a = (acc - 1.5*2^23) * sx; t[pair][s] = fma(d, a, t)
 * (+ fma(o, b, t)) in tb; sp: the group's d[8] (then o[8]); sx: per pair
 * [sx of rows 2pr, 2pr, 2pr+1, 2pr+1], then b = (float)gsum * sx in the
 * same order (4 bits); mg: 1.5*2^23 in every lane. */
ALWAYS_INLINE void mmla8_epilogue_asm(int32x4_t acc[4][16], float *tb, const float *sp,
                                       const float *sx, float32x4_t mg) {
  __asm__ volatile(
      "ldp q0, q1, [%[sp]]\n\t"
      "dup v2.2d, v0.d[0]\n\t"
      "dup v3.2d, v0.d[1]\n\t"
      "dup v4.2d, v1.d[0]\n\t"
      "dup v5.2d, v1.d[1]\n\t"
      "ldr q1, [%[sx], #0]\n\t"
      "fsub v0.4s, %[c00].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #0]\n\t"
      "fmul v0.4s, v0.4s, v1.4s\n\t"
      "fmla v14.4s, v0.4s, v2.4s\n\t"
      "str q14, [%[tb], #0]\n\t"
      "fsub v0.4s, %[c01].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #16]\n\t"
      "fmul v0.4s, v0.4s, v1.4s\n\t"
      "fmla v14.4s, v0.4s, v3.4s\n\t"
      "str q14, [%[tb], #16]\n\t"
      "fsub v0.4s, %[c02].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #32]\n\t"
      "fmul v0.4s, v0.4s, v1.4s\n\t"
      "fmla v14.4s, v0.4s, v4.4s\n\t"
      "str q14, [%[tb], #32]\n\t"
      "fsub v0.4s, %[c03].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #48]\n\t"
      "fmul v0.4s, v0.4s, v1.4s\n\t"
      "fmla v14.4s, v0.4s, v5.4s\n\t"
      "str q14, [%[tb], #48]\n\t"
      "ldr q1, [%[sx], #32]\n\t"
      "fsub v0.4s, %[c10].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #64]\n\t"
      "fmul v0.4s, v0.4s, v1.4s\n\t"
      "fmla v14.4s, v0.4s, v2.4s\n\t"
      "str q14, [%[tb], #64]\n\t"
      "fsub v0.4s, %[c11].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #80]\n\t"
      "fmul v0.4s, v0.4s, v1.4s\n\t"
      "fmla v14.4s, v0.4s, v3.4s\n\t"
      "str q14, [%[tb], #80]\n\t"
      "fsub v0.4s, %[c12].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #96]\n\t"
      "fmul v0.4s, v0.4s, v1.4s\n\t"
      "fmla v14.4s, v0.4s, v4.4s\n\t"
      "str q14, [%[tb], #96]\n\t"
      "fsub v0.4s, %[c13].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #112]\n\t"
      "fmul v0.4s, v0.4s, v1.4s\n\t"
      "fmla v14.4s, v0.4s, v5.4s\n\t"
      "str q14, [%[tb], #112]\n\t"
      "ldr q1, [%[sx], #64]\n\t"
      "fsub v0.4s, %[c20].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #128]\n\t"
      "fmul v0.4s, v0.4s, v1.4s\n\t"
      "fmla v14.4s, v0.4s, v2.4s\n\t"
      "str q14, [%[tb], #128]\n\t"
      "fsub v0.4s, %[c21].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #144]\n\t"
      "fmul v0.4s, v0.4s, v1.4s\n\t"
      "fmla v14.4s, v0.4s, v3.4s\n\t"
      "str q14, [%[tb], #144]\n\t"
      "fsub v0.4s, %[c22].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #160]\n\t"
      "fmul v0.4s, v0.4s, v1.4s\n\t"
      "fmla v14.4s, v0.4s, v4.4s\n\t"
      "str q14, [%[tb], #160]\n\t"
      "fsub v0.4s, %[c23].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #176]\n\t"
      "fmul v0.4s, v0.4s, v1.4s\n\t"
      "fmla v14.4s, v0.4s, v5.4s\n\t"
      "str q14, [%[tb], #176]\n\t"
      "ldr q1, [%[sx], #96]\n\t"
      "fsub v0.4s, %[c30].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #192]\n\t"
      "fmul v0.4s, v0.4s, v1.4s\n\t"
      "fmla v14.4s, v0.4s, v2.4s\n\t"
      "str q14, [%[tb], #192]\n\t"
      "fsub v0.4s, %[c31].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #208]\n\t"
      "fmul v0.4s, v0.4s, v1.4s\n\t"
      "fmla v14.4s, v0.4s, v3.4s\n\t"
      "str q14, [%[tb], #208]\n\t"
      "fsub v0.4s, %[c32].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #224]\n\t"
      "fmul v0.4s, v0.4s, v1.4s\n\t"
      "fmla v14.4s, v0.4s, v4.4s\n\t"
      "str q14, [%[tb], #224]\n\t"
      "fsub v0.4s, %[c33].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #240]\n\t"
      "fmul v0.4s, v0.4s, v1.4s\n\t"
      "fmla v14.4s, v0.4s, v5.4s\n\t"
      "str q14, [%[tb], #240]\n\t"
      :
      : [c00] "w"(acc[0][0]), [c01] "w"(acc[0][1]), [c02] "w"(acc[0][2]), [c03] "w"(acc[0][3]), [c10] "w"(acc[1][0]), [c11] "w"(acc[1][1]), [c12] "w"(acc[1][2]), [c13] "w"(acc[1][3]), [c20] "w"(acc[2][0]), [c21] "w"(acc[2][1]), [c22] "w"(acc[2][2]), [c23] "w"(acc[2][3]), [c30] "w"(acc[3][0]), [c31] "w"(acc[3][1]), [c32] "w"(acc[3][2]), [c33] "w"(acc[3][3]), [tb] "r"(tb), [sp] "r"(sp), [mg] "w"(mg), [sx] "r"(sx)
      : "v0", "v1", "v2", "v3", "v4", "v5", "v14", "memory");
}

ALWAYS_INLINE void mmla4_epilogue_asm(int32x4_t acc[4][16], float *tb, const float *sp,
                                       const float *sx, float32x4_t mg) {
  __asm__ volatile(
      "ldp q0, q1, [%[sp]]\n\t"
      "dup v2.2d, v0.d[0]\n\t"
      "dup v3.2d, v0.d[1]\n\t"
      "dup v4.2d, v1.d[0]\n\t"
      "dup v5.2d, v1.d[1]\n\t"
      "ldp q0, q1, [%[sp], #32]\n\t"
      "dup v6.2d, v0.d[0]\n\t"
      "dup v7.2d, v0.d[1]\n\t"
      "dup v8.2d, v1.d[0]\n\t"
      "dup v9.2d, v1.d[1]\n\t"
      "ldp q10, q11, [%[sx], #0]\n\t"
      "fsub v0.4s, %[c00].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #0]\n\t"
      "fmul v0.4s, v0.4s, v10.4s\n\t"
      "fmla v14.4s, v0.4s, v2.4s\n\t"
      "fmla v14.4s, v6.4s, v11.4s\n\t"
      "str q14, [%[tb], #0]\n\t"
      "fsub v1.4s, %[c01].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #16]\n\t"
      "fmul v1.4s, v1.4s, v10.4s\n\t"
      "fmla v14.4s, v1.4s, v3.4s\n\t"
      "fmla v14.4s, v7.4s, v11.4s\n\t"
      "str q14, [%[tb], #16]\n\t"
      "fsub v0.4s, %[c02].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #32]\n\t"
      "fmul v0.4s, v0.4s, v10.4s\n\t"
      "fmla v14.4s, v0.4s, v4.4s\n\t"
      "fmla v14.4s, v8.4s, v11.4s\n\t"
      "str q14, [%[tb], #32]\n\t"
      "fsub v1.4s, %[c03].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #48]\n\t"
      "fmul v1.4s, v1.4s, v10.4s\n\t"
      "fmla v14.4s, v1.4s, v5.4s\n\t"
      "fmla v14.4s, v9.4s, v11.4s\n\t"
      "str q14, [%[tb], #48]\n\t"
      "ldp q10, q11, [%[sx], #32]\n\t"
      "fsub v0.4s, %[c10].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #64]\n\t"
      "fmul v0.4s, v0.4s, v10.4s\n\t"
      "fmla v14.4s, v0.4s, v2.4s\n\t"
      "fmla v14.4s, v6.4s, v11.4s\n\t"
      "str q14, [%[tb], #64]\n\t"
      "fsub v1.4s, %[c11].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #80]\n\t"
      "fmul v1.4s, v1.4s, v10.4s\n\t"
      "fmla v14.4s, v1.4s, v3.4s\n\t"
      "fmla v14.4s, v7.4s, v11.4s\n\t"
      "str q14, [%[tb], #80]\n\t"
      "fsub v0.4s, %[c12].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #96]\n\t"
      "fmul v0.4s, v0.4s, v10.4s\n\t"
      "fmla v14.4s, v0.4s, v4.4s\n\t"
      "fmla v14.4s, v8.4s, v11.4s\n\t"
      "str q14, [%[tb], #96]\n\t"
      "fsub v1.4s, %[c13].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #112]\n\t"
      "fmul v1.4s, v1.4s, v10.4s\n\t"
      "fmla v14.4s, v1.4s, v5.4s\n\t"
      "fmla v14.4s, v9.4s, v11.4s\n\t"
      "str q14, [%[tb], #112]\n\t"
      "ldp q10, q11, [%[sx], #64]\n\t"
      "fsub v0.4s, %[c20].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #128]\n\t"
      "fmul v0.4s, v0.4s, v10.4s\n\t"
      "fmla v14.4s, v0.4s, v2.4s\n\t"
      "fmla v14.4s, v6.4s, v11.4s\n\t"
      "str q14, [%[tb], #128]\n\t"
      "fsub v1.4s, %[c21].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #144]\n\t"
      "fmul v1.4s, v1.4s, v10.4s\n\t"
      "fmla v14.4s, v1.4s, v3.4s\n\t"
      "fmla v14.4s, v7.4s, v11.4s\n\t"
      "str q14, [%[tb], #144]\n\t"
      "fsub v0.4s, %[c22].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #160]\n\t"
      "fmul v0.4s, v0.4s, v10.4s\n\t"
      "fmla v14.4s, v0.4s, v4.4s\n\t"
      "fmla v14.4s, v8.4s, v11.4s\n\t"
      "str q14, [%[tb], #160]\n\t"
      "fsub v1.4s, %[c23].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #176]\n\t"
      "fmul v1.4s, v1.4s, v10.4s\n\t"
      "fmla v14.4s, v1.4s, v5.4s\n\t"
      "fmla v14.4s, v9.4s, v11.4s\n\t"
      "str q14, [%[tb], #176]\n\t"
      "ldp q10, q11, [%[sx], #96]\n\t"
      "fsub v0.4s, %[c30].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #192]\n\t"
      "fmul v0.4s, v0.4s, v10.4s\n\t"
      "fmla v14.4s, v0.4s, v2.4s\n\t"
      "fmla v14.4s, v6.4s, v11.4s\n\t"
      "str q14, [%[tb], #192]\n\t"
      "fsub v1.4s, %[c31].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #208]\n\t"
      "fmul v1.4s, v1.4s, v10.4s\n\t"
      "fmla v14.4s, v1.4s, v3.4s\n\t"
      "fmla v14.4s, v7.4s, v11.4s\n\t"
      "str q14, [%[tb], #208]\n\t"
      "fsub v0.4s, %[c32].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #224]\n\t"
      "fmul v0.4s, v0.4s, v10.4s\n\t"
      "fmla v14.4s, v0.4s, v4.4s\n\t"
      "fmla v14.4s, v8.4s, v11.4s\n\t"
      "str q14, [%[tb], #224]\n\t"
      "fsub v1.4s, %[c33].4s, %[mg].4s\n\t"
      "ldr q14, [%[tb], #240]\n\t"
      "fmul v1.4s, v1.4s, v10.4s\n\t"
      "fmla v14.4s, v1.4s, v5.4s\n\t"
      "fmla v14.4s, v9.4s, v11.4s\n\t"
      "str q14, [%[tb], #240]\n\t"
      :
      : [c00] "w"(acc[0][0]), [c01] "w"(acc[0][1]), [c02] "w"(acc[0][2]), [c03] "w"(acc[0][3]), [c10] "w"(acc[1][0]), [c11] "w"(acc[1][1]), [c12] "w"(acc[1][2]), [c13] "w"(acc[1][3]), [c20] "w"(acc[2][0]), [c21] "w"(acc[2][1]), [c22] "w"(acc[2][2]), [c23] "w"(acc[2][3]), [c30] "w"(acc[3][0]), [c31] "w"(acc[3][1]), [c32] "w"(acc[3][2]), [c33] "w"(acc[3][3]), [tb] "r"(tb), [sp] "r"(sp), [mg] "w"(mg), [sx] "r"(sx)
      : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11", "v14", "memory");
}

ALWAYS_INLINE void mmla_tile(const int MP, const int NP, const int B4, const int G1,
                             const mtile_args a) {
  const int64_t BB = B4 ? 128 : 256, SB = B4 ? 64 : 32;
  const int8_t *const ap = a.ap;
  const int64_t nb = a.nb, bpg = G1 ? 1 : a.bpg; /* G1: group 32 */
  const uint8_t *w[4];
#pragma GCC unroll 4
  for (int p = 0; p < NP; p++) w[p] = a.w[p];
  const int32_t *bias0 = acc_bias;
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
    const float *sxg = a.sxp + gi * MP * 8;
    if (MP == 4 && NP == 1) {
      const float *sp = (const float *)(const void *)w[0];
      if (B4) mmla4_epilogue_asm(acc, a.tb, sp, sxg, vdupq_n_f32(ACC_BIAS_F));
      else mmla8_epilogue_asm(acc, a.tb, sp, sxg, vdupq_n_f32(ACC_BIAS_F));
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
          const float32x4_t f =
              vsubq_f32(vreinterpretq_f32_s32(acc[pr][4 * p + s]), vdupq_n_f32(ACC_BIAS_F));
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

typedef void (*mtile_fn)(const mtile_args *);

/* mmla_<pairs>x<panels>_b<bits>[_g32] */
#define MMLA_KERNEL(MP, NP, B)                                                            \
  static __attribute__((noinline)) void mmla_##MP##x##NP##_b##B(const mtile_args *a) {   \
    mmla_tile(MP, NP, B == 4, 0, *a);                                                     \
  }
#define MMLA_KERNELS(MP, NP) MMLA_KERNEL(MP, NP, 8) MMLA_KERNEL(MP, NP, 4)
MMLA_KERNELS(4, 1) MMLA_KERNELS(1, 4) MMLA_KERNELS(2, 2)
static __attribute__((noinline)) void mmla_4x1_b8_g32(const mtile_args *a) { mmla_tile(4, 1, 0, 1, *a); }
static __attribute__((noinline)) void mmla_4x1_b4_g32(const mtile_args *a) { mmla_tile(4, 1, 1, 1, *a); }

typedef struct {
  mtile_fn fn;
  int mp, np; /* row pairs and panels of the tile */
} mtile_kind;

/* [bits 4][M for decode, 0 for prefill] */
#define KINDS(B)                                                               \
  {{mmla_4x1_b##B, 4, 1}, {mmla_1x4_b##B, 1, 4}, {mmla_1x4_b##B, 1, 4},       \
   {mmla_2x2_b##B, 2, 2}, {mmla_2x2_b##B, 2, 2}}
static const mtile_kind mtile_kinds[2][DECODE_MAX_M + 1] = {KINDS(8), KINDS(4)};
#undef KINDS

/* ------------------------------------------------------------- driver */

typedef struct {
  ARMLLM_QA_JOB_ARGS;
  mtile_kind kind;
  int64_t n_mt, cp; /* M tiles, panels per N chunk */
} wq_job;

static void wq_items(void *ctx, int64_t i0, int64_t i1) {
  const wq_job *job = ctx;
  const wq_geom *G = &job->G;
  const int MP = job->kind.mp, NP = job->kind.np;
  int8_t ap[KC_BLOCKS * BLK * 8] __attribute__((aligned(64)));
  float sxp[KC_BLOCKS * 4 * 8] __attribute__((aligned(16)));
  float tb[64] __attribute__((aligned(16)));
  mtile_args a;
  a.ap = ap;
  a.sxp = sxp;
  a.tb = tb;
  a.bpg = G->bpg;
  for (int64_t i = i0; i < i1;) {
    const int64_t nc = i / job->n_mt, mt0 = i % job->n_mt;
    const int64_t mt1 = min64(mt0 + (i1 - i), job->n_mt);
    const int64_t pa = nc * job->cp, pb = min64(pa + job->cp, job->n_panels);
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
        for (int64_t p = pa; p < pb; p += NP) {
          const int64_t np = min64(NP, pb - p), n0 = p * NR, nv = min64(NP * NR, job->n - n0);
          for (int q = 0; q < NP; q++)
            a.w[q] = job->w + (p + (q < np ? q : np - 1)) * G->pstride + woff;
          const float *bias = a.last && job->bias ? job->bias + n0 : NULL;
          float *yt = job->y + m0 * job->ldy + n0;
          if (mv == 2 * MP && nv == NP * NR) {
            a.y = yt;
            a.ldy = job->ldy;
            a.bias = bias;
            job->kind.fn(&a);
            continue;
          }
          /* edge tile: rows / panels past the valid ones land here, unused */
          float t[8 * NR] __attribute__((aligned(16))); /* 2*MP*NP <= 8 */
          float tbias[4 * NR] __attribute__((aligned(16))) = {0};
          armllm_edge_tile_load(t, tbias, NP * NR, yt, job->ldy, mv, nv, a.first, bias);
          a.y = t;
          a.ldy = NP * NR;
          a.bias = bias ? tbias : NULL;
          job->kind.fn(&a);
          armllm_edge_tile_store(t, NP * NR, yt, job->ldy, mv, nv);
        }
      }
    }
    i += mt1 - mt0;
  }
}

void armllm_neon_mmla_gemm_wq(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k,
                              int64_t ldq, const float *scale, int64_t ldsc,
                              const int32_t *gsum, int64_t ldgs, const void *packed_w, int64_t n,
                              int bits, int64_t group, const float *bias, float *y, int64_t ldy) {
  const int b4 = bits == 4;
  wq_job job = {xq, m, ldq, scale, ldsc, b4 ? gsum : NULL, ldgs, packed_w, n, (n + NR - 1) / NR,
                geom_of(k, bits, group), bias, y, ldy,
                mtile_kinds[b4][m <= DECODE_MAX_M ? m : 0], 0, 0};
  if (group == BLK && m > DECODE_MAX_M) job.kind.fn = b4 ? mmla_4x1_b4_g32 : mmla_4x1_b8_g32;
  const int64_t mr = 2 * job.kind.mp;
  armllm_gemm_plan plan;
  if (m <= DECODE_MAX_M) {
    plan = armllm_plan_decode(pool, m, job.G.kpad, job.n_panels, NR, job.kind.np, MIN_CHUNK_MACS);
    job.n_mt = 1; /* one tile of all M rows */
    job.cp = job.kind.np;
  } else {
    plan = armllm_plan_prefill(pool, m, job.G.kpad, job.n_panels, mr, NR, CP_MAX, MIN_CHUNK_MACS);
    job.n_mt = plan.n_mt;
    job.cp = plan.cp;
  }
  armllm_pool_run(pool, plan.items, plan.grain, wq_items, &job);
}
