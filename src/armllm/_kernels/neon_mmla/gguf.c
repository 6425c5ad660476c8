/* neon_mmla/gguf.c: the GGUF-block GEMM on Armv8.6 I8MM: the SMMLA prefill
 * tiles; decode (M <= 4, memory-bound) runs neon/gguf.c's SDOT kernels
 * straight from the packed blocks, and the packed layout ("gguf-arm-p4"),
 * its unpacking and the driver are gguf_arm.h/.c (so the layout is neon's,
 * and sve's, which runs this code: see sve/table.c). SMMLA multiplies a 2x8
 * block of x (two rows, 8 k) by a 2x8 block of W (two output columns, 8 k)
 * into a 2x2 int32 block [x0w0, x0w1, x1w0, x1w1].
 *
 * Prefill: the driver unpacks each panel's K block once into SMMLA operands
 *   "mmla_n4k8" (32 bytes per 8 k: row pair s = 0, 1 at byte 16s, rows 2s
 *   and 2s + 1 at 8h: W[2s + h, k + i] at byte 16s + 8h + i; a ZIP1/ZIP2
 *   of 64-bit halves of the unpacked rows) and the scales as W pairs
 *   ([d0, d1, d0, d1], gguf_arm.h's armllm_ga_panel_k), and packs the
 *   tile's x rows as row-pair operands once per K block. The tiles are 4
 *   row pairs x 2 W pairs (8 rows x 4 columns, 8 accumulators): per 8 k 4 x
 *   + 2 W loads and 8 SMMLA. 32-element types: the ABI's epilogue per block
 *   on the blocked accumulators (sx as [s0, s0, s1, s1]), t in registers
 *   in the same order over the K block, converted from / to y's rows at its
 *   ends; block sums start at quant_arm.h's ACC_BIAS ((float)sum is one
 *   FSUB). Super-block types: as neon/gguf.c's SDOT tile, one MLA per
 *   weight group and accumulator, the float epilogue per 256 columns.
 * llvm-mca, Neoverse N2 model: the 32-element tile 28 cycles per block (32
 *   SMMLA: 57% of SMMLA peak, the exact per-block epilogue's ceiling), 32.5
 *   with offsets; a super-block (256 SMMLA) 192 cycles with 32-column
 *   groups (67%; was 224 = 8 x 28), 239 with mins (54%; was 260), 224 with
 *   16-column groups (57%; was 364), 303 with mins (42%; was 424): the hot
 *   loops run 80% (32-column groups) and 67% (16) of peak.
 */
#include <arm_neon.h>

#include "../armllm_kernels.h"
#include "../cpu.h"
#include "../gemm_plan.h"
#include "../gguf_arm.h"

#define NR ARMLLM_GA_NR
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define MP 4 /* row pairs of the prefill tile */
#define MR (2 * MP)

/* Blocks [b0, b0 + nb) of a panel of type T as SMMLA operands "mmla_n4k8". */
ALWAYS_INLINE void unpack_mmla(const int T, const uint8_t *panel, int64_t b0, int64_t nb,
                               armllm_ga_panel_k *pk) {
  const int E = ga_elems(T), HB = ga_hb(T), UB = ga_ub(T), PB = ga_pb(T);
  const uint8_t *blk = panel + b0 * PB;
  int8_t *dst = pk->w;
  for (int64_t b = 0; b < nb; b++, blk += PB) {
#pragma GCC unroll 8
    for (int c = 0; c < E / 32; c++) {
      int8x16_t w[NR][2];
#pragma GCC unroll 4
      for (int j = 0; j < NR; j++) ga_unpack_chunk(T, blk + HB + j * UB, c, &w[j][0], &w[j][1]);
#pragma GCC unroll 2
      for (int h = 0; h < 2; h++, dst += 64) { /* 16 k: 2 x (8 k: pairs 0, 1) */
        const int64x2_t r0 = vreinterpretq_s64_s8(w[0][h]), r1 = vreinterpretq_s64_s8(w[1][h]);
        const int64x2_t r2 = vreinterpretq_s64_s8(w[2][h]), r3 = vreinterpretq_s64_s8(w[3][h]);
        vst1q_s8(dst, vreinterpretq_s8_s64(vzip1q_s64(r0, r1)));
        vst1q_s8(dst + 16, vreinterpretq_s8_s64(vzip1q_s64(r2, r3)));
        vst1q_s8(dst + 32, vreinterpretq_s8_s64(vzip2q_s64(r0, r1)));
        vst1q_s8(dst + 48, vreinterpretq_s8_s64(vzip2q_s64(r2, r3)));
      }
    }
    ga_unpack_scales(T, 1, blk, b, pk); /* as the W pairs' operands */
  }
}

#define UNPACK_MMLA(T)                                                                        \
  static void unpack_mmla_##T(const uint8_t *panel, int64_t b0, int64_t nb,                   \
                              armllm_ga_panel_k *pk) {                                        \
    unpack_mmla(ARMLLM_GGML_##T, panel, b0, nb, pk);                                          \
  }
ARMLLM_GA_TYPES(UNPACK_MMLA)

/* t (rows [0, MR) x the panel's 4 columns) from y's rows (+0 when first)
 * into the blocked order tb[pair][s]: [t(2pr, 2s), t(2pr, 2s + 1),
 * t(2pr + 1, 2s), t(2pr + 1, 2s + 1)], SMMLA's accumulator lanes. */
ALWAYS_INLINE void t_load_blocked(const armllm_ga_tile *tl, float32x4_t t[MP][2]) {
  float ty[MR][NR] __attribute__((aligned(16)));
  memset(ty, 0, sizeof ty);
  if (!tl->first)
    for (int r = 0; r < tl->mv; r++) memcpy(ty[r], tl->y + r * tl->ldy, (size_t)tl->nv * 4);
#pragma GCC unroll 4
  for (int pr = 0; pr < MP; pr++)
#pragma GCC unroll 2
    for (int s = 0; s < 2; s++)
      t[pr][s] = vcombine_f32(vld1_f32(ty[2 * pr] + 2 * s), vld1_f32(ty[2 * pr + 1] + 2 * s));
}

/* y's valid rows and columns = t (blocked) + bias. */
ALWAYS_INLINE void t_store_blocked(const armllm_ga_tile *tl, float32x4_t t[MP][2]) {
  float ty[MR][NR] __attribute__((aligned(16)));
#pragma GCC unroll 4
  for (int pr = 0; pr < MP; pr++)
#pragma GCC unroll 2
    for (int s = 0; s < 2; s++) {
      vst1_f32(ty[2 * pr] + 2 * s, vget_low_f32(t[pr][s]));
      vst1_f32(ty[2 * pr + 1] + 2 * s, vget_high_f32(t[pr][s]));
    }
  for (int r = 0; r < tl->mv; r++) {
    float32x4_t v = vld1q_f32(ty[r]);
    if (tl->bias) v = vaddq_f32(v, vld1q_f32(tl->bias));
    vst1q_f32(ty[r], v);
    memcpy(tl->y + r * tl->ldy, ty[r], (size_t)tl->nv * 4);
  }
}

/* acc += the MP row pairs' 8 k at xp times the W pairs' operands at wp. */
ALWAYS_INLINE void mmla_8k(int32x4_t acc[MP][2], const int8_t *wp, const int8_t *xp) {
  const int8x16_t w0 = vld1q_s8(wp), w1 = vld1q_s8(wp + 16);
#pragma GCC unroll 4
  for (int pr = 0; pr < MP; pr++) {
    const int8x16_t xv = vld1q_s8(xp + 16 * pr);
    acc[pr][0] = vmmlaq_s32(acc[pr][0], xv, w0);
    acc[pr][1] = vmmlaq_s32(acc[pr][1], xv, w1);
  }
}

/* The 8-row x 4-column SMMLA tile of a 32-element type over one K block
 * (gguf_arm.h's armllm_ga_tile), with offsets (OFF) or not: the ABI's
 * epilogue per 32-column block. */
ALWAYS_INLINE void mmla_tile(const int OFF, const armllm_ga_tile *tl) {
  const armllm_ga_rows *rw = tl->rows;
  const armllm_ga_panel_k *pk = tl->pk;
  const int8_t *wp = pk->w, *xp = rw->ap;
  float32x4_t t[MP][2];
  t_load_blocked(tl, t);
  for (int64_t g = 0; g < tl->kc / 32; g++) {
    int32x4_t acc[MP][2];
    const int32_t *start = ga_acc_start();
#pragma GCC unroll 4
    for (int pr = 0; pr < MP; pr++)
#pragma GCC unroll 2
      for (int s = 0; s < 2; s++) acc[pr][s] = vld1q_s32(start + 8 * pr + 4 * s);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++, wp += 32, xp += 16 * MP) mmla_8k(acc, wp, xp); /* 8 k each */
    const float32x4_t dp[2] = {vld1q_f32(pk->d[g]), vld1q_f32(pk->d[g] + 4)};
    float32x4_t op[2] = {dp[0], dp[1]};
    if (OFF) op[0] = vld1q_f32(pk->o[g]), op[1] = vld1q_f32(pk->o[g] + 4);
#pragma GCC unroll 4
    for (int pr = 0; pr < MP; pr++) {
      const float32x4_t sxp = vld1q_f32(rw->sxp[g][pr]);
      float32x4_t bp = sxp;
      if (OFF) bp = vld1q_f32(rw->bp[g][pr]);
#pragma GCC unroll 2
      for (int s = 0; s < 2; s++) {
        t[pr][s] = vfmaq_f32(t[pr][s], dp[s], vmulq_f32(ga_acc_f32(acc[pr][s]), sxp));
        if (OFF) t[pr][s] = vfmaq_f32(t[pr][s], op[s], bp);
      }
    }
  }
  t_store_blocked(tl, t);
}

/* The 8-row x 4-column SMMLA tile of a super-block type over one K block:
 * weight groups of 16 (G16) or 32 columns, with mins (OFF) or not; as
 * neon/gguf.c's sdot_super_tile (acc over a whole super-block, isum += acc
 * * (s_j - s_{j+1}) per group, msum exact in f32, the epilogue once per
 * super-block, t in memory between them), in the blocked lane order. */
ALWAYS_INLINE void mmla_super_tile(const int G16, const int OFF, const armllm_ga_tile *tl) {
  const int NG = ARMLLM_GGUF_SUPER / (G16 ? 16 : 32), STEPS = G16 ? 2 : 4; /* 8 k a step */
  const armllm_ga_rows *rw = tl->rows;
  const armllm_ga_panel_k *pk = tl->pk;
  const int8_t *wp = pk->w, *xp = rw->ap;
  float tm[MP * 2 * 4] __attribute__((aligned(16))); /* t[pr][s] at tm + 8 pr + 4 s */
  float *tp = tm;
  __asm__("" : "+r"(tp)); /* opaque: GCC would promote t to registers and spill */
  {
    float32x4_t t[MP][2];
    t_load_blocked(tl, t);
#pragma GCC unroll 4
    for (int pr = 0; pr < MP; pr++)
#pragma GCC unroll 2
      for (int s = 0; s < 2; s++) vst1q_f32(tp + 8 * pr + 4 * s, t[pr][s]);
  }
  for (int64_t sb = 0; sb < tl->kc / ARMLLM_GGUF_SUPER; sb++) {
    const int64_t j0 = sb * NG;
    int32x4_t acc[MP][2], isum[MP][2];
    const int32_t *zeros = ga_zero_start();
#pragma GCC unroll 4
    for (int pr = 0; pr < MP; pr++)
#pragma GCC unroll 2
      for (int s = 0; s < 2; s++) acc[pr][s] = vld1q_s32(zeros + 8 * pr + 4 * s);
    zeros = ga_zero_start();
#pragma GCC unroll 4
    for (int pr = 0; pr < MP; pr++)
#pragma GCC unroll 2
      for (int s = 0; s < 2; s++) isum[pr][s] = vld1q_s32(zeros + 8 * pr + 4 * s);
    for (int j = 0; j < NG; j++) {
#pragma GCC unroll 4
      for (int c = 0; c < STEPS; c++, wp += 32, xp += 16 * MP) mmla_8k(acc, wp, xp);
      const int32x4_t sd[2] = {vld1q_s32(pk->s[j0 + j]), vld1q_s32(pk->s[j0 + j] + 4)};
#pragma GCC unroll 4
      for (int pr = 0; pr < MP; pr++)
#pragma GCC unroll 2
        for (int s = 0; s < 2; s++) isum[pr][s] = vmlaq_s32(isum[pr][s], acc[pr][s], sd[s]);
    }
    float32x4_t msum[MP][2]; /* first: isum, msum, then t live (no spills) */
    if (OFF) {
#pragma GCC unroll 4
      for (int pr = 0; pr < MP; pr++) msum[pr][0] = msum[pr][1] = vdupq_n_f32(0.0f);
#pragma GCC unroll 1
      for (int j = 0; j < NG; j++) {
        const float32x4_t m[2] = {vld1q_f32(pk->o[j0 + j]), vld1q_f32(pk->o[j0 + j] + 4)};
#pragma GCC unroll 4
        for (int pr = 0; pr < MP; pr++) {
          const float32x4_t gs = vld1q_f32(rw->bp[j0 + j][pr]);
#pragma GCC unroll 2
          for (int s = 0; s < 2; s++) msum[pr][s] = vfmaq_f32(msum[pr][s], m[s], gs);
        }
      }
    }
    const int64_t c0 = sb * (ARMLLM_GGUF_SUPER / 32); /* the super-block's first chunk */
    const float32x4_t D[2] = {vld1q_f32(pk->D[sb]), vld1q_f32(pk->D[sb] + 4)};
    const float32x4_t O[2] = {vld1q_f32(pk->O[sb]), vld1q_f32(pk->O[sb] + 4)};
#pragma GCC unroll 4
    for (int pr = 0; pr < MP; pr++) {
      const float32x4_t sxp = vld1q_f32(rw->sxp[c0][pr]);
#pragma GCC unroll 2
      for (int s = 0; s < 2; s++) {
        float32x4_t t = vfmaq_f32(vld1q_f32(tp + 8 * pr + 4 * s), D[s],
                                  vmulq_f32(vcvtq_f32_s32(isum[pr][s]), sxp));
        if (OFF) t = vfmaq_f32(t, O[s], vmulq_f32(msum[pr][s], sxp));
        vst1q_f32(tp + 8 * pr + 4 * s, t);
      }
    }
  }
  float32x4_t t[MP][2];
#pragma GCC unroll 4
  for (int pr = 0; pr < MP; pr++)
#pragma GCC unroll 2
    for (int s = 0; s < 2; s++) t[pr][s] = vld1q_f32(tp + 8 * pr + 4 * s);
  t_store_blocked(tl, t);
}

#define MMLA_TILE(OFF)                                                                   \
  static __attribute__((noinline)) void mmla_tile_##OFF(const armllm_ga_tile *t) {       \
    mmla_tile(OFF, t);                                                                   \
  }
#define MMLA_SUPER_TILE(G16, OFF)                                                        \
  static __attribute__((noinline)) void mmla_super_tile_##G16##OFF(const armllm_ga_tile *t) { \
    mmla_super_tile(G16, OFF, t);                                                        \
  }
MMLA_TILE(0) MMLA_TILE(1)
MMLA_SUPER_TILE(0, 0) MMLA_SUPER_TILE(0, 1) MMLA_SUPER_TILE(1, 0) MMLA_SUPER_TILE(1, 1)

#define UNPACK_MMLA_FN(T) unpack_mmla_##T,
static const armllm_ga_prefill mmla_prefill = {
    {{{mmla_tile_0, mmla_tile_1}, {NULL, NULL}},
     {{mmla_super_tile_00, mmla_super_tile_01}, {mmla_super_tile_10, mmla_super_tile_11}}},
    MR,
    1,
    {ARMLLM_GA_TYPES(UNPACK_MMLA_FN)},
};

void armllm_neon_mmla_gemm_gguf(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k,
                                int64_t ldq, const float *scale, int64_t ldsc,
                                const int32_t *gsum, int64_t ldgs, const void *packed_w,
                                int64_t n, const float *bias, float *y, int64_t ldy) {
  const armllm_ga_args a = {.xq = xq, .m = m, .k = k, .ldq = ldq, .scale = scale, .ldsc = ldsc,
                            .gsum = gsum, .ldgs = ldgs, .bias = bias, .y = y, .ldy = ldy};
  armllm_ga_gemm(pool, &a, packed_w, 0, n, armllm_neon_gguf_decode(1), &mmla_prefill);
}

void armllm_neon_mmla_gemm_gguf_cols(const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                                     const float *scale, int64_t ldsc, const int32_t *gsum,
                                     int64_t ldgs, const void *packed_w, int64_t n, int64_t n0,
                                     int64_t n1, const float *bias, float *y, int64_t ldy) {
  (void)n;
  const armllm_ga_args a = {.xq = xq, .m = m, .k = k, .ldq = ldq, .scale = scale, .ldsc = ldsc,
                            .gsum = gsum, .ldgs = ldgs, .bias = bias, .y = y, .ldy = ldy};
  armllm_ga_gemm(NULL, &a, packed_w, n0, n1, armllm_neon_gguf_decode(1), &mmla_prefill);
}
