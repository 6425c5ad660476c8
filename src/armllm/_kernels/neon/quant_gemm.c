/* neon/quant_gemm.c: the quantized GEMM (int8 or uint4 weights, int8
 * activations) on Armv8 NEON, with SDOT when the CPU has dotprod: the
 * block layout and micro-kernels; the driver is quant_arm.c, activations
 * come from neon/quant_act.c.
 *
 * Packed layout "sdot_n8k4" (quant_arm.h's panels): a block is 8 chunks c
 *   of 4 k, and a chunk two SDOT operands (h = 0, 1) of 4 rows x 4 k:
 *     8 bits: W[8p + 4h + j, 32b + 4c + i] at byte 32c + 16h + 4j + i;
 *     4 bits: byte 16c + 4j + i holds W[8p + j, ...] in its low nibble and
 *             W[8p + 4 + j, ...] in its high nibble (one load, AND + USHR,
 *             gives both operands of a chunk).
 *
 * With dotprod, SDOT by lane: acc[r][h] (4 output columns of row r) +=
 *   W chunk (4 rows x 4 k) . x[r, 4 k], broadcast from a 16-byte x vector.
 *   The SDOT code is compiled with a target attribute and only called when
 *   HWCAP says asimddp, so an Armv8.0 core (Cortex-A72) never executes it;
 *   there the same layout goes through SMULL/SMLAL (two chunks summed in
 *   int16: |sum| <= 2*127*128 < 2^15, activations being in [-127, 127])
 *   and SADALP into int32.
 * Tiles: prefill 8 rows x 1 panel (16 accumulators, 128 SDOT per 32 k,
 *   the block and the group epilogue in inline assembly); for group 32
 *   tiles that keep t in registers over the K block, 8 bits 4 rows and 4
 *   bits 6 rows x 1 panel (dot_g32_b8_tile, dot_g32_b4_tile: with 8 rows,
 *   16 t vectors do not fit and storing them costs vector-pipe slots);
 *   decode (M <= 4) M rows x 2-4 panels;
 *   x rows are read in place (no packing). t lives in y (or an edge tile),
 *   row-major like the accumulators. Grouped sums start biased so that
 *   int -> float is one FSUB (quant_arm.h; the SMULL path sums from 0 and
 *   uses SCVTF).
 */
#include <arm_neon.h>

#include "../armllm_kernels.h"
#include "../cpu.h"
#include "../gemm_plan.h"
#include "../quant_arm.h"

#define BLK ARMLLM_QA_BLK
#define DECODE_MAX_M ARMLLM_GEMM_DECODE_MAX_M
#define MIN_CHUNK_MACS (1 << 17)
/* 4-bit group 32 from M = 9 on takes the 6-row tile that keeps t in
 * registers: up to 8 rows one 8-row tile (computing no more rows) is cheaper */
#define G32_MIN_M 8

#define ALWAYS_INLINE static inline __attribute__((always_inline))
/* The SDOT code: GCC's arm_neon.h defines vdotq_* for arch=armv8.2-a+dotprod
 * ("+dotprod" alone mismatches); dotprod exists only from Armv8.2 anyway. */
#define DOT_TARGET target("arch=armv8.2-a+dotprod")
#define DOT_FN static inline __attribute__((always_inline, DOT_TARGET))
#define DOT_NOINLINE static __attribute__((noinline, DOT_TARGET))

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ----------------------------------------------------------- packing */

static void sdot_block(uint8_t *dst, const int8_t *q, int64_t n, int64_t k, int64_t p, int64_t b,
                       int bits) {
  for (int c = 0; c < 8; c++)
    for (int j = 0; j < 4; j++)
      for (int i = 0; i < 4; i++) {
        const int64_t kk = b * BLK + 4 * c + i;
        uint8_t v[2];
        for (int h = 0; h < 2; h++) {
          const int64_t row = p * ARMLLM_QA_NR + 4 * h + j;
          v[h] = row < n && kk < k ? (uint8_t)q[row * k + kk] : 0;
        }
        if (bits == 4) {
          dst[16 * c + 4 * j + i] = (uint8_t)((v[0] & 15) | (v[1] & 15) << 4);
        } else {
          dst[32 * c + 4 * j + i] = v[0];
          dst[32 * c + 16 + 4 * j + i] = v[1];
        }
      }
}

size_t armllm_neon_gemm_wq_packed_len(int64_t n, int64_t k, int bits, int64_t group,
                                      const float *d, const float *o) {
  (void)d, (void)o; /* f32 scales whatever their values */
  return armllm_qa_packed_len(n, k, bits, group);
}

void armllm_neon_gemm_wq_pack(const int8_t *q, int64_t n, int64_t k, int bits, int64_t group,
                              const float *d, const float *o, void *packed) {
  armllm_qa_pack(q, n, k, bits, group, d, o, packed, sdot_block);
}

/* ------------------------------------------------------ micro-kernels */

ALWAYS_INLINE float32x4_t acc_to_f32(const int BIASED, int32x4_t acc) {
  return BIASED ? vsubq_f32(vreinterpretq_f32_s32(acc), vdupq_n_f32(ARMLLM_QA_ACC_BIAS_F))
                : vcvtq_f32_s32(acc);
}

/* The ABI's float epilogue of one group for the row-major accumulators
 * acc[r][2p + h] (columns 8p + 4h .. + 3 of row r) onto t in y: a =
 * (float)acc * sx[r]; t = fma(d, a, t) (+ fma(o, b[r], t), b = (float)gsum *
 * sx precomputed per row and group: the same rounding). ws[p]: the group's
 * d (and o) in panel p's stream. */
ALWAYS_INLINE void group_epilogue(const int MR, const int NP, const int B4, const int BIASED,
                                  int32x4_t acc[8][8], const uint8_t *const *ws,
                                  const armllm_qa_tile a, int64_t gi) {
  float32x4_t dv[8], ov[8];
#pragma GCC unroll 4
  for (int p = 0; p < NP; p++) {
    const float *s = (const float *)(const void *)ws[p];
    dv[2 * p] = vld1q_f32(s);
    dv[2 * p + 1] = vld1q_f32(s + 4);
    if (B4) {
      ov[2 * p] = vld1q_f32(s + 8);
      ov[2 * p + 1] = vld1q_f32(s + 12);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
    for (int v = 0; v < 2 * NP; v++) {
      float *ty = a.y + r * a.ldy + 4 * v;
      const float32x4_t av = vmulq_n_f32(acc_to_f32(BIASED, acc[r][v]), a.sx[gi * 8 + r]);
      float32x4_t t = vfmaq_f32(vld1q_f32(ty), dv[v], av);
      if (B4) t = vfmaq_n_f32(t, ov[v], a.sb[gi * 8 + r]);
      vst1q_f32(ty, t);
    }
}

/* t = +0 in y before the first group (first K block) */
ALWAYS_INLINE void tile_zero(const int MR, const int NP, const armllm_qa_tile a) {
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
    for (int v = 0; v < 2 * NP; v++) vst1q_f32(a.y + r * a.ldy + 4 * v, vdupq_n_f32(0.0f));
}

/* y = t + bias after the last group (last K block) */
ALWAYS_INLINE void tile_final(const int MR, const int NP, const armllm_qa_tile a) {
  if (!a.bias) return;
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
    for (int v = 0; v < 2 * NP; v++) {
      float *ty = a.y + r * a.ldy + 4 * v;
      vst1q_f32(ty, vaddq_f32(vld1q_f32(ty), vld1q_f32(a.bias + 4 * v)));
    }
}

/* Two SDOT operands (h = 0, 1) of chunk c of a block. */
ALWAYS_INLINE void load_chunk(const int B4, const uint8_t *wb, int c, int8x16_t *w0,
                              int8x16_t *w1) {
  if (B4) {
    const uint8x16_t raw = vld1q_u8(wb + 16 * c);
    *w0 = vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(15)));
    *w1 = vreinterpretq_s8_u8(vshrq_n_u8(raw, 4));
  } else {
    *w0 = vld1q_s8((const int8_t *)wb + 32 * c);
    *w1 = vld1q_s8((const int8_t *)wb + 32 * c + 16);
  }
}

/* Keeps GCC from hoisting the weight loads of later chunks (spills). */
#define BARRIER __asm__ volatile("" ::: "memory")

/* SDOT: chunk 4*half + L against lane L of the rows' x vectors. */
#define DOT_CHUNK(L)                                                           \
  {                                                                            \
    _Pragma("GCC unroll 4") for (int p = 0; p < NP; p++) {                     \
      int8x16_t w0, w1;                                                        \
      load_chunk(B4, w[p], 4 * half + (L), &w0, &w1);                          \
      _Pragma("GCC unroll 8") for (int r = 0; r < MR; r++) {                   \
        if (RELOAD && (L) + p > 0) xv[r] = vld1q_s8(x[r] + 16 * half);   \
        acc[r][2 * p] = vdotq_laneq_s32(acc[r][2 * p], w0, xv[r], L);          \
        acc[r][2 * p + 1] = vdotq_laneq_s32(acc[r][2 * p + 1], w1, xv[r], L);  \
      }                                                                        \
      if (RELOAD) BARRIER;                                                     \
    }                                                                          \
    BARRIER;                                                                   \
  }

/* The 8-row x 1-panel SDOT tile's 32-k block and group epilogue in inline
 * assembly: from intrinsics GCC 12 copies or spills accumulators and moves
 * one around the block loop. The statements are put together from the
 * pieces below (one per instruction group): x rows in v0..v7, W operands
 * through v8..v11, acc[r][h] as %[c<r>] (block) or %[c<r><h>] (epilogue). */
#define ASM_X_ROWS(OFF)                                                              \
  "ldr q0, [%[x0], #" OFF "]\n\t"                                                    \
  "ldr q1, [%[x1], #" OFF "]\n\t"                                                    \
  "ldr q2, [%[x2], #" OFF "]\n\t"                                                    \
  "ldr q3, [%[x3], #" OFF "]\n\t"                                                    \
  "ldr q4, [%[x4], #" OFF "]\n\t"                                                    \
  "ldr q5, [%[x5], #" OFF "]\n\t"                                                    \
  "ldr q6, [%[x6], #" OFF "]\n\t"                                                    \
  "ldr q7, [%[x7], #" OFF "]\n\t"
/* every row's accumulator += operand vW . lane L of the row's x */
#define ASM_SDOT_ROWS(W, L)                                                          \
  "sdot %[c0].4s, v" W ".16b, v0.4b[" L "]\n\t"                                      \
  "sdot %[c1].4s, v" W ".16b, v1.4b[" L "]\n\t"                                      \
  "sdot %[c2].4s, v" W ".16b, v2.4b[" L "]\n\t"                                      \
  "sdot %[c3].4s, v" W ".16b, v3.4b[" L "]\n\t"                                      \
  "sdot %[c4].4s, v" W ".16b, v4.4b[" L "]\n\t"                                      \
  "sdot %[c5].4s, v" W ".16b, v5.4b[" L "]\n\t"                                      \
  "sdot %[c6].4s, v" W ".16b, v6.4b[" L "]\n\t"                                      \
  "sdot %[c7].4s, v" W ".16b, v7.4b[" L "]\n\t"
#define ASM_LD_W(W, OFF) "ldr q" W ", [%[wb], #" OFF "]\n\t"
/* 8 bits: four chunks, the operand of each at byte O0 .. O3, against x lanes 0..3 */
#define ASM_DOT8_CHUNKS(O0, O1, O2, O3)                                              \
  ASM_LD_W("8", O0) ASM_SDOT_ROWS("8", "0") ASM_LD_W("10", O1) ASM_SDOT_ROWS("10", "1") \
  ASM_LD_W("8", O2) ASM_SDOT_ROWS("8", "2") ASM_LD_W("10", O3) ASM_SDOT_ROWS("10", "3")
/* 4 bits: the same from nibbles, UNPACK(dst, src) taking the operand half */
#define ASM_AND15(D, S) "and v" D ".16b, v" S ".16b, %[m15].16b\n\t"
#define ASM_SHR4(D, S) "ushr v" D ".16b, v" S ".16b, #4\n\t"
#define ASM_DOT4_CHUNKS(UNPACK, O0, O1, O2, O3)                                      \
  ASM_LD_W("8", O0) UNPACK("9", "8") ASM_SDOT_ROWS("9", "0")                         \
  ASM_LD_W("10", O1) UNPACK("11", "10") ASM_SDOT_ROWS("11", "1")                     \
  ASM_LD_W("8", O2) UNPACK("9", "8") ASM_SDOT_ROWS("9", "2")                         \
  ASM_LD_W("10", O3) UNPACK("11", "10") ASM_SDOT_ROWS("11", "3")
#define ASM_ACC_HALF(H)                                                              \
  [c0] "+w"(acc[0][H]), [c1] "+w"(acc[1][H]), [c2] "+w"(acc[2][H]), [c3] "+w"(acc[3][H]), \
      [c4] "+w"(acc[4][H]), [c5] "+w"(acc[5][H]), [c6] "+w"(acc[6][H]), [c7] "+w"(acc[7][H])
#define ASM_X_PTRS                                                                   \
  [x0] "r"(x[0]), [x1] "r"(x[1]), [x2] "r"(x[2]), [x3] "r"(x[3]), [x4] "r"(x[4]),   \
      [x5] "r"(x[5]), [x6] "r"(x[6]), [x7] "r"(x[7]), [wb] "r"(wb)
#define ASM_V0_V11 "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11"

/* One 32-k block (x[r]: row r at the block; wb: the block), one statement
 * per operand half h (GCC takes at most 30 operands). 8 bits: the operands
 * of chunk c at bytes 32c + 16h. */
DOT_FN void dot8_block_asm(int32x4_t acc[8][8], const int8_t *const x[8], const uint8_t *wb) {
  __asm__(ASM_X_ROWS("0") ASM_DOT8_CHUNKS("0", "32", "64", "96")
          ASM_X_ROWS("16") ASM_DOT8_CHUNKS("128", "160", "192", "224")
          : ASM_ACC_HALF(0)
          : ASM_X_PTRS
          : ASM_V0_V11, "memory");
  __asm__(ASM_X_ROWS("0") ASM_DOT8_CHUNKS("16", "48", "80", "112")
          ASM_X_ROWS("16") ASM_DOT8_CHUNKS("144", "176", "208", "240")
          : ASM_ACC_HALF(1)
          : ASM_X_PTRS
          : ASM_V0_V11, "memory");
}

/* 4 bits: chunk c at bytes 16c, operand h = 0 in the low nibbles. */
DOT_FN void dot4_block_asm(int32x4_t acc[8][8], const int8_t *const x[8], const uint8_t *wb,
                           uint8x16_t m15) {
  __asm__(ASM_X_ROWS("0") ASM_DOT4_CHUNKS(ASM_AND15, "0", "16", "32", "48")
          ASM_X_ROWS("16") ASM_DOT4_CHUNKS(ASM_AND15, "64", "80", "96", "112")
          : ASM_ACC_HALF(0)
          : ASM_X_PTRS, [m15] "w"(m15)
          : ASM_V0_V11, "memory");
  __asm__(ASM_X_ROWS("0") ASM_DOT4_CHUNKS(ASM_SHR4, "0", "16", "32", "48")
          ASM_X_ROWS("16") ASM_DOT4_CHUNKS(ASM_SHR4, "64", "80", "96", "112")
          : ASM_ACC_HALF(1)
          : ASM_X_PTRS, [m15] "w"(m15)
          : ASM_V0_V11, "memory");
}

/* The group epilogue: per row r and half h, a = (acc - 1.5*2^23) * sx[r]
 * (by element), t = fma(d, a, t) (+ fma(o, b[r], t)) on y, row after row
 * (yp steps by ldy); sp: the group's d[8] (v2, v3; then o[8]: v4, v5), sx,
 * gb: the rows' sx (v6, v7) and b = (float)gsum * sx (v8, v9) of the group.
 * Row R's half H: accumulator C, its sx lane L of vS (and b lane L of vB). */
#define ASM_EPI_A(C, H, S, L)                                                        \
  "fsub v0.4s, %[" C "].4s, %[mg].4s\n\t"                                            \
  "ldr q1, [%[yp], #" H "]\n\t"                                                      \
  "fmul v0.4s, v0.4s, v" S ".s[" L "]\n\t"
#define ASM_EPI_D(D) "fmla v1.4s, v0.4s, v" D ".4s\n\t"
#define ASM_EPI_O(O, B, L) "fmla v1.4s, v" O ".4s, v" B ".s[" L "]\n\t"
#define ASM_EPI_ST(H) "str q1, [%[yp], #" H "]\n\t"
#define ASM_NEXT_ROW "add %[yp], %[yp], %[ld]\n\t"
#define ASM_EPI8_ROW(R, S, L)                                                        \
  ASM_EPI_A("c" #R "0", "0", S, L) ASM_EPI_D("2") ASM_EPI_ST("0")                    \
  ASM_EPI_A("c" #R "1", "16", S, L) ASM_EPI_D("3") ASM_EPI_ST("16")
#define ASM_EPI4_ROW(R, S, B, L)                                                     \
  ASM_EPI_A("c" #R "0", "0", S, L) ASM_EPI_D("2") ASM_EPI_O("4", B, L) ASM_EPI_ST("0") \
  ASM_EPI_A("c" #R "1", "16", S, L) ASM_EPI_D("3") ASM_EPI_O("5", B, L) ASM_EPI_ST("16")
#define ASM_ACC_ROW(R) [c##R##0] "w"(acc[R][0]), [c##R##1] "w"(acc[R][1])
#define ASM_EPI_IN                                                                   \
  ASM_ACC_ROW(0), ASM_ACC_ROW(1), ASM_ACC_ROW(2), ASM_ACC_ROW(3), ASM_ACC_ROW(4),   \
      ASM_ACC_ROW(5), ASM_ACC_ROW(6), ASM_ACC_ROW(7), [ld] "r"(ldy * 4), [sp] "r"(sp), \
      [sx] "r"(sx), [gb] "r"(gb), [mg] "w"(mg)

DOT_FN void dot8_epilogue_asm(int32x4_t acc[8][8], float *y, int64_t ldy, const float *sp,
                              const float *sx, const float *gb, float32x4_t mg) {
  float *yp = y;
  __asm__ volatile("ldp q2, q3, [%[sp]]\n\t"
                   "ldp q6, q7, [%[sx]]\n\t"
                   ASM_EPI8_ROW(0, "6", "0") ASM_NEXT_ROW ASM_EPI8_ROW(1, "6", "1") ASM_NEXT_ROW
                   ASM_EPI8_ROW(2, "6", "2") ASM_NEXT_ROW ASM_EPI8_ROW(3, "6", "3") ASM_NEXT_ROW
                   ASM_EPI8_ROW(4, "7", "0") ASM_NEXT_ROW ASM_EPI8_ROW(5, "7", "1") ASM_NEXT_ROW
                   ASM_EPI8_ROW(6, "7", "2") ASM_NEXT_ROW ASM_EPI8_ROW(7, "7", "3")
                   : [yp] "+r"(yp)
                   : ASM_EPI_IN
                   : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "memory");
}

DOT_FN void dot4_epilogue_asm(int32x4_t acc[8][8], float *y, int64_t ldy, const float *sp,
                              const float *sx, const float *gb, float32x4_t mg) {
  float *yp = y;
  __asm__ volatile("ldp q2, q3, [%[sp]]\n\t"
                   "ldp q4, q5, [%[sp], #32]\n\t"
                   "ldp q6, q7, [%[sx]]\n\t"
                   "ldp q8, q9, [%[gb]]\n\t"
                   ASM_EPI4_ROW(0, "6", "8", "0") ASM_NEXT_ROW ASM_EPI4_ROW(1, "6", "8", "1")
                   ASM_NEXT_ROW ASM_EPI4_ROW(2, "6", "8", "2") ASM_NEXT_ROW
                   ASM_EPI4_ROW(3, "6", "8", "3") ASM_NEXT_ROW ASM_EPI4_ROW(4, "7", "9", "0")
                   ASM_NEXT_ROW ASM_EPI4_ROW(5, "7", "9", "1") ASM_NEXT_ROW
                   ASM_EPI4_ROW(6, "7", "9", "2") ASM_NEXT_ROW ASM_EPI4_ROW(7, "7", "9", "3")
                   : [yp] "+r"(yp)
                   : ASM_EPI_IN
                   : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "memory");
}

DOT_FN void dot_tile(const int MR, const int NP, const int B4, const armllm_qa_tile a) {
  const int64_t BB = B4 ? 128 : 256, SB = B4 ? 64 : 32;
  /* 16 accumulators and more live values: x is reloaded for each W operand
   * pair (loads are cheap) so that GCC allocates registers without copies */
  const int RELOAD = MR * NP >= 8 && (B4 || NP > 1);
  const uint8_t *w[4];
  const int8_t *x[8];
#pragma GCC unroll 4
  for (int p = 0; p < NP; p++) w[p] = a.w[p];
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++) x[r] = a.x[r];
  const int32_t *bias0 = armllm_qa_acc_bias;
  __asm__("" : "+r"(bias0)); /* loads, not constants */
  const float32x4_t mg = vdupq_n_f32(ARMLLM_QA_ACC_BIAS_F);
  if (a.first) tile_zero(MR, NP, a);
  for (int64_t g0 = 0, gi = 0; g0 < a.nb; g0 += a.bpg, gi++) {
    const int64_t gn = min64(a.bpg, a.nb - g0);
    int32x4_t acc[8][8];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
      for (int v = 0; v < 2 * NP; v++)
        acc[r][v] = vld1q_s32(bias0 + 4 * (2 * NP * r + v));
    for (int64_t bi = 0; bi < gn; bi++) {
      if (MR == 8 && NP == 1) {
        if (B4) dot4_block_asm(acc, x, w[0], vdupq_n_u8(15));
        else dot8_block_asm(acc, x, w[0]);
      } else
#pragma GCC unroll 2
      for (int half = 0; half < 2; half++) {
        int8x16_t xv[8];
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) xv[r] = vld1q_s8(x[r] + 16 * half);
        DOT_CHUNK(0) DOT_CHUNK(1) DOT_CHUNK(2) DOT_CHUNK(3)
      }
#pragma GCC unroll 8
      for (int r = 0; r < MR; r++) x[r] += BLK;
#pragma GCC unroll 4
      for (int p = 0; p < NP; p++) w[p] += BB;
    }
    if (MR == 8 && NP == 1) {
      const float *sp = (const float *)(const void *)w[0];
      if (B4) dot4_epilogue_asm(acc, a.y, a.ldy, sp, a.sx + gi * 8, a.sb + gi * 8, mg);
      else dot8_epilogue_asm(acc, a.y, a.ldy, sp, a.sx + gi * 8, a.sb + gi * 8, mg);
    } else
      group_epilogue(MR, NP, B4, 1, acc, w, a, gi);
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++) w[p] += SB;
  }
  if (a.last) tile_final(MR, NP, a);
}

/* The 8-bit group-32 prefill tile: 4 rows x 1 panel, t in registers.
 * With group 32 each accumulator gets 8 SDOT per group and then the ABI's
 * epilogue (FSUB, FMUL, FMLA) on the same vector pipes; the 8-row tile
 * also stores its 16 t vectors per group (a store takes a vector-pipe slot
 * too) since 16 accumulators + 16 t leave no registers for x. 4 rows keep
 * t in registers over the whole K block: 64 SDOT + 24 epilogue operations
 * a group, no stores. One asm statement per group: accumulators v16..v23
 * (acc[r][h] = v(16 + 2r + h)), x rows v0..v3, W operands v4, v5, d v4,
 * v5, sx v6, mg v7; t is %[t<r><h>]. (4 bits gain nothing from this: the
 * nibble unpack per row doubles, so they keep the 8-row tile.) */
#define G_SDOT(A, W, X, L) "sdot v" A ".4s, v" W ".16b, v" X ".4b[" L "]\n\t"
/* chunk c (operands at byte WO) against lane L of every row's x vector */
#define G_DOT8_CHUNK(WO, L)                                                          \
  "ldp q4, q5, [%[wb], #" WO "]\n\t" G_SDOT("16", "4", "0", L) G_SDOT("17", "5", "0", L) \
  G_SDOT("18", "4", "1", L) G_SDOT("19", "5", "1", L) G_SDOT("20", "4", "2", L)        \
  G_SDOT("21", "5", "2", L) G_SDOT("22", "4", "3", L) G_SDOT("23", "5", "3", L)
#define G_X_ROWS(OFF)                                                                \
  "ldr q0, [%[x0], #" OFF "]\n\t" "ldr q1, [%[x1], #" OFF "]\n\t"                    \
  "ldr q2, [%[x2], #" OFF "]\n\t" "ldr q3, [%[x3], #" OFF "]\n\t"
#define G_EPI(A, L, D, T)                                                            \
  "fsub v" A ".4s, v" A ".4s, v7.4s\n\t" "fmul v" A ".4s, v" A ".4s, v6.s[" L "]\n\t" \
  "fmla %[" T "].4s, v" A ".4s, v" D ".4s\n\t"

DOT_FN void dot_g32_b8_tile(const armllm_qa_tile a) {
  const int MR = 4;
  const int8_t *x0 = a.x[0], *x1 = a.x[1], *x2 = a.x[2], *x3 = a.x[3];
  const uint8_t *wb = a.w[0];
  const float *sx = a.sx;
  const int32_t *bias0 = armllm_qa_acc_bias;
  static const float mg[4] __attribute__((aligned(16))) = {
      ARMLLM_QA_ACC_BIAS_F, ARMLLM_QA_ACC_BIAS_F, ARMLLM_QA_ACC_BIAS_F, ARMLLM_QA_ACC_BIAS_F};
  float32x4_t t[4][2]; /* row r, columns 4h .. 4h + 3: +0 (ABI) or earlier K blocks' */
#pragma GCC unroll 4
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++)
      t[r][h] = a.first ? vdupq_n_f32(0.0f) : vld1q_f32(a.y + r * a.ldy + 4 * h);
  for (int64_t gi = 0; gi < a.nb; gi++, x0 += BLK, x1 += BLK, x2 += BLK, x3 += BLK,
               wb += 256 + 32, sx += 8)
    __asm__("ldp q16, q17, [%[bias]]\n\t" "ldp q18, q19, [%[bias], #32]\n\t"
            "ldp q20, q21, [%[bias], #64]\n\t" "ldp q22, q23, [%[bias], #96]\n\t"
            G_X_ROWS("0") G_DOT8_CHUNK("0", "0") G_DOT8_CHUNK("32", "1")
            G_DOT8_CHUNK("64", "2") G_DOT8_CHUNK("96", "3")
            G_X_ROWS("16") G_DOT8_CHUNK("128", "0") G_DOT8_CHUNK("160", "1")
            G_DOT8_CHUNK("192", "2") G_DOT8_CHUNK("224", "3")
            "ldp q4, q5, [%[wb], #256]\n\t" "ldr q6, [%[sx]]\n\t" "ldr q7, [%[mg]]\n\t"
            G_EPI("16", "0", "4", "t00") G_EPI("17", "0", "5", "t01")
            G_EPI("18", "1", "4", "t10") G_EPI("19", "1", "5", "t11")
            G_EPI("20", "2", "4", "t20") G_EPI("21", "2", "5", "t21")
            G_EPI("22", "3", "4", "t30") G_EPI("23", "3", "5", "t31")
            : [t00] "+w"(t[0][0]), [t01] "+w"(t[0][1]), [t10] "+w"(t[1][0]),
              [t11] "+w"(t[1][1]), [t20] "+w"(t[2][0]), [t21] "+w"(t[2][1]),
              [t30] "+w"(t[3][0]), [t31] "+w"(t[3][1])
            : [x0] "r"(x0), [x1] "r"(x1), [x2] "r"(x2), [x3] "r"(x3), [wb] "r"(wb),
              [sx] "r"(sx), [bias] "r"(bias0), [mg] "r"(mg)
            : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v16", "v17", "v18", "v19",
              "v20", "v21", "v22", "v23", "memory");
  /* y = t (+ bias after the last K block) */
#pragma GCC unroll 4
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
      float32x4_t v = t[r][h];
      if (a.last && a.bias) v = vaddq_f32(v, vld1q_f32(a.bias + 4 * h));
      vst1q_f32(a.y + r * a.ldy + 4 * h, v);
    }
}

/* The 4-bit group-32 prefill tile: 6 rows x 1 panel, t in registers (12
 * accumulators v16..v27, acc[r][h] = v(16 + 2r + h), + 12 t + 6 x rows
 * v0..v5 + raw W v6 + the nibble mask v7: all 32 registers). Each raw
 * chunk is loaded twice, once for its low nibbles (AND, operand 0) and once
 * for its high (USHR, operand 1), so that no third W register is needed:
 * 96 SDOT + 16 unpacks + 48 epilogue operations a group, no stores. */
#define G_SDOT6_0(L)                                                                 \
  G_SDOT("16", "6", "0", L) G_SDOT("18", "6", "1", L) G_SDOT("20", "6", "2", L)      \
  G_SDOT("22", "6", "3", L) G_SDOT("24", "6", "4", L) G_SDOT("26", "6", "5", L)
#define G_SDOT6_1(L)                                                                 \
  G_SDOT("17", "6", "0", L) G_SDOT("19", "6", "1", L) G_SDOT("21", "6", "2", L)      \
  G_SDOT("23", "6", "3", L) G_SDOT("25", "6", "4", L) G_SDOT("27", "6", "5", L)
#define G_LO4(WO, L) "ldr q6, [%[wb], #" WO "]\n\t" "and v6.16b, v6.16b, v7.16b\n\t" G_SDOT6_0(L)
#define G_HI4(WO, L) "ldr q6, [%[wb], #" WO "]\n\t" "ushr v6.16b, v6.16b, #4\n\t" G_SDOT6_1(L)
/* x rows from the row pointers in x9..x14 at the byte offset in register OFF */
#define G_X6(OFF)                                                                    \
  "ldr q0, [x9, " OFF "]\n\t" "ldr q1, [x10, " OFF "]\n\t" "ldr q2, [x11, " OFF "]\n\t" \
  "ldr q3, [x12, " OFF "]\n\t" "ldr q4, [x13, " OFF "]\n\t" "ldr q5, [x14, " OFF "]\n\t"
/* row R's accumulators: a = (acc - mg) * sx (lane L of vS), t = fma(d, a, t) */
#define G_EPI6(R, A0, A1, S, L)                                                      \
  G_EPI_X(A0, S, L, "2", "t" #R "0") G_EPI_X(A1, S, L, "3", "t" #R "1")
#define G_EPI_X(A, S, L, D, T)                                                       \
  "fsub v" A ".4s, v" A ".4s, v4.4s\n\t" "fmul v" A ".4s, v" A ".4s, v" S ".s[" L "]\n\t" \
  "fmla %[" T "].4s, v" A ".4s, v" D ".4s\n\t"
#define G_EPO6(R, S, L)                                                              \
  "fmla %[t" #R "0].4s, v2.4s, v" S ".s[" L "]\n\t"                                  \
  "fmla %[t" #R "1].4s, v3.4s, v" S ".s[" L "]\n\t"

DOT_FN void dot_g32_b4_tile(const armllm_qa_tile a) {
  const int MR = 6;
  const int8_t *const *xs = a.x; /* GCC takes at most 30 asm operands: row pointers by address */
  const uint8_t *wb = a.w[0];
  const float *sx = a.sx, *sb = a.sb;
  /* the biased start of the sums; as floats its bits are mg = 1.5 * 2^23 */
  const int32_t *bias0 = armllm_qa_acc_bias;
  float32x4_t t[6][2]; /* row r, columns 4h .. 4h + 3: +0 (ABI) or earlier K blocks' */
#pragma GCC unroll 6
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++)
      t[r][h] = a.first ? vdupq_n_f32(0.0f) : vld1q_f32(a.y + r * a.ldy + 4 * h);
  for (int64_t gi = 0, off = 0; gi < a.nb; gi++, off += BLK, wb += 128 + 64, sx += 8, sb += 8)
    __asm__("ldp q16, q17, [%[bias]]\n\t" "ldp q18, q19, [%[bias], #32]\n\t"
            "ldp q20, q21, [%[bias], #64]\n\t" "ldp q22, q23, [%[bias], #96]\n\t"
            "ldp q24, q25, [%[bias], #128]\n\t" "ldp q26, q27, [%[bias], #160]\n\t"
            "movi v7.16b, #15\n\t" "ldp x9, x10, [%[xs]]\n\t" "ldp x11, x12, [%[xs], #16]\n\t"
            "ldp x13, x14, [%[xs], #32]\n\t" "add x15, %[off], #16\n\t"
            G_X6("%[off]") G_LO4("0", "0") G_LO4("16", "1") G_LO4("32", "2") G_LO4("48", "3")
            G_HI4("0", "0") G_HI4("16", "1") G_HI4("32", "2") G_HI4("48", "3")
            G_X6("x15") G_LO4("64", "0") G_LO4("80", "1") G_LO4("96", "2") G_LO4("112", "3")
            G_HI4("64", "0") G_HI4("80", "1") G_HI4("96", "2") G_HI4("112", "3")
            "ldp q2, q3, [%[wb], #128]\n\t" "ldp q0, q1, [%[sx]]\n\t" "ldr q4, [%[bias]]\n\t"
            G_EPI6(0, "16", "17", "0", "0") G_EPI6(1, "18", "19", "0", "1")
            G_EPI6(2, "20", "21", "0", "2") G_EPI6(3, "22", "23", "0", "3")
            G_EPI6(4, "24", "25", "1", "0") G_EPI6(5, "26", "27", "1", "1")
            "ldp q2, q3, [%[wb], #160]\n\t" "ldp q0, q1, [%[sb]]\n\t"
            G_EPO6(0, "0", "0") G_EPO6(1, "0", "1") G_EPO6(2, "0", "2") G_EPO6(3, "0", "3")
            G_EPO6(4, "1", "0") G_EPO6(5, "1", "1")
            : [t00] "+w"(t[0][0]), [t01] "+w"(t[0][1]), [t10] "+w"(t[1][0]),
              [t11] "+w"(t[1][1]), [t20] "+w"(t[2][0]), [t21] "+w"(t[2][1]),
              [t30] "+w"(t[3][0]), [t31] "+w"(t[3][1]), [t40] "+w"(t[4][0]),
              [t41] "+w"(t[4][1]), [t50] "+w"(t[5][0]), [t51] "+w"(t[5][1])
            : [xs] "r"(xs), [off] "r"(off), [wb] "r"(wb), [sx] "r"(sx), [sb] "r"(sb),
              [bias] "r"(bias0)
            : "x9", "x10", "x11", "x12", "x13", "x14", "x15", "v0", "v1", "v2", "v3", "v4", "v5",
              "v6", "v7", "v16", "v17", "v18", "v19", "v20", "v21", "v22", "v23", "v24", "v25",
              "v26", "v27", "memory");
  /* y = t (+ bias after the last K block) */
#pragma GCC unroll 6
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
      float32x4_t v = t[r][h];
      if (a.last && a.bias) v = vaddq_f32(v, vld1q_f32(a.bias + 4 * h));
      vst1q_f32(a.y + r * a.ldy + 4 * h, v);
    }
}

/* Armv8.0: chunks L and L+1 multiplied in int16 (SMULL + SMLAL) and
 * pairwise added into int32 (SADALP): lo[r][h] holds columns 0, 1 of
 * operand h as two partial sums each, hi[r][h] columns 2, 3. */
#define MULL_CHUNKS(L)                                                               \
  {                                                                                  \
    int8x16_t wa0, wa1, wb0, wb1;                                                    \
    load_chunk(B4, w, 4 * half + (L), &wa0, &wa1);                                   \
    load_chunk(B4, w, 4 * half + (L) + 1, &wb0, &wb1);                               \
    _Pragma("GCC unroll 4") for (int r = 0; r < MR; r++) {                           \
      const int8x16_t xa = vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(xv[r]), L)); \
      const int8x16_t xb =                                                           \
          vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(xv[r]), (L) + 1)); \
      int16x8_t s;                                                                   \
      s = vmlal_s8(vmull_s8(vget_low_s8(wa0), vget_low_s8(xa)), vget_low_s8(wb0), vget_low_s8(xb)); \
      lo[r][0] = vpadalq_s16(lo[r][0], s);                                           \
      s = vmlal_high_s8(vmull_high_s8(wa0, xa), wb0, xb);                            \
      hi[r][0] = vpadalq_s16(hi[r][0], s);                                           \
      s = vmlal_s8(vmull_s8(vget_low_s8(wa1), vget_low_s8(xa)), vget_low_s8(wb1), vget_low_s8(xb)); \
      lo[r][1] = vpadalq_s16(lo[r][1], s);                                           \
      s = vmlal_high_s8(vmull_high_s8(wa1, xa), wb1, xb);                            \
      hi[r][1] = vpadalq_s16(hi[r][1], s);                                           \
    }                                                                                \
  }

ALWAYS_INLINE void mull_tile(const int MR, const int B4, const armllm_qa_tile a) {
  const int64_t BB = B4 ? 128 : 256, SB = B4 ? 64 : 32;
  const uint8_t *w = a.w[0];
  const int8_t *x[8];
#pragma GCC unroll 4
  for (int r = 0; r < MR; r++) x[r] = a.x[r];
  if (a.first) tile_zero(MR, 1, a);
  for (int64_t g0 = 0, gi = 0; g0 < a.nb; g0 += a.bpg, gi++) {
    const int64_t gn = min64(a.bpg, a.nb - g0);
    int32x4_t lo[4][2], hi[4][2], acc[8][8];
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++)
      for (int h = 0; h < 2; h++) lo[r][h] = hi[r][h] = vdupq_n_s32(0);
    for (int64_t bi = 0; bi < gn; bi++) {
#pragma GCC unroll 2
      for (int half = 0; half < 2; half++) {
        int8x16_t xv[4];
#pragma GCC unroll 4
        for (int r = 0; r < MR; r++) xv[r] = vld1q_s8(x[r] + 16 * half);
        MULL_CHUNKS(0) MULL_CHUNKS(2)
      }
#pragma GCC unroll 4
      for (int r = 0; r < MR; r++) x[r] += BLK;
      w += BB;
    }
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++)
      for (int h = 0; h < 2; h++) acc[r][h] = vpaddq_s32(lo[r][h], hi[r][h]);
    const uint8_t *ws[1] = {w};
    group_epilogue(MR, 1, B4, 0, acc, ws, a, gi);
    w += SB;
  }
  if (a.last) tile_final(MR, 1, a);
}

/* dot_<rows>x<panels>_b<bits>[_g32] */
#define DOT_KERNEL(MR, NP, B)                                                             \
  DOT_NOINLINE void dot_##MR##x##NP##_b##B(const armllm_qa_tile *a) {                     \
    dot_tile(MR, NP, B == 4, *a);                                                         \
  }
#define MULL_KERNEL(MR, B)                                                                \
  static __attribute__((noinline)) void mull_##MR##_b##B(const armllm_qa_tile *a) {       \
    mull_tile(MR, B == 4, *a);                                                            \
  }
DOT_KERNEL(8, 1, 8) DOT_KERNEL(1, 4, 8) DOT_KERNEL(2, 2, 8) DOT_KERNEL(3, 2, 8) DOT_KERNEL(4, 2, 8)
DOT_KERNEL(8, 1, 4) DOT_KERNEL(1, 4, 4) DOT_KERNEL(2, 2, 4) DOT_KERNEL(3, 2, 4) DOT_KERNEL(4, 2, 4)
DOT_NOINLINE void dot_4x1_b8_g32(const armllm_qa_tile *a) { dot_g32_b8_tile(*a); }
DOT_NOINLINE void dot_6x1_b4_g32(const armllm_qa_tile *a) { dot_g32_b4_tile(*a); }
MULL_KERNEL(1, 8) MULL_KERNEL(2, 8) MULL_KERNEL(3, 8) MULL_KERNEL(4, 8)
MULL_KERNEL(1, 4) MULL_KERNEL(2, 4) MULL_KERNEL(3, 4) MULL_KERNEL(4, 4)

/* [bits 4][dot][M for decode, 0 for prefill]: {kernel, rows, panels, rows in place} */
#define MULL_KINDS(B) {{mull_4_b##B, 4, 1, 0}, {mull_1_b##B, 1, 1, 0}, {mull_2_b##B, 2, 1, 0}, \
                       {mull_3_b##B, 3, 1, 0}, {mull_4_b##B, 4, 1, 0}}
#define DOT_KINDS(B) {{dot_8x1_b##B, 8, 1, 0}, {dot_1x4_b##B, 1, 4, 0}, {dot_2x2_b##B, 2, 2, 0}, \
                      {dot_3x2_b##B, 3, 2, 0}, {dot_4x2_b##B, 4, 2, 0}}
static const armllm_qa_kind tile_kinds[2][2][DECODE_MAX_M + 1] = {
    {MULL_KINDS(8), DOT_KINDS(8)},
    {MULL_KINDS(4), DOT_KINDS(4)},
};
#undef MULL_KINDS
#undef DOT_KINDS

/* The tile kind of a GEMM of m rows. */
static armllm_qa_kind kind_of(int64_t m, int bits, int64_t group) {
  const int dot = armllm_neon_sdot(); /* what `armllm info` reports as neon+dotprod */
  const int b4 = bits == 4;
  armllm_qa_kind kind = tile_kinds[b4][dot][m <= DECODE_MAX_M ? m : 0];
  /* group 32: the tiles that keep t in registers, {kernel, rows, panels, rows in place} */
  if (dot && group == BLK && !b4 && m > DECODE_MAX_M)
    kind = (armllm_qa_kind){dot_4x1_b8_g32, 4, 1, 0};
  if (dot && group == BLK && b4 && m > G32_MIN_M) kind = (armllm_qa_kind){dot_6x1_b4_g32, 6, 1, 0};
  return kind;
}

void armllm_neon_gemm_wq(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                         const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                         const void *packed_w, int64_t n, int bits, int64_t group,
                         const float *bias, float *y, int64_t ldy) {
  armllm_qa_gemm(pool, xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, 0, n, bits, group, bias,
                 y, ldy, kind_of(m, bits, group), MIN_CHUNK_MACS);
}

void armllm_neon_gemm_wq_cols(const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                              const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                              const void *packed_w, int64_t n, int bits, int64_t group, int64_t n0,
                              int64_t n1, const float *bias, float *y, int64_t ldy) {
  (void)n;
  armllm_qa_gemm(NULL, xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, n0, n1, bits, group, bias,
                 y, ldy, kind_of(m, bits, group), MIN_CHUNK_MACS);
}
