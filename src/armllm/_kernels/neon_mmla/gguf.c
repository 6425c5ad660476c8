/* neon_mmla/gguf.c: the GGUF-block GEMM on Armv8.6 I8MM: the SMMLA prefill
 * tile; decode (M <= 4, memory-bound) runs neon/gguf.c's SDOT kernels
 * straight from the packed blocks, and the packed layout ("gguf-arm-p4"),
 * its unpacking and the driver are gguf_arm.h/.c (so the layout is neon's,
 * and sve's, which runs this code: see sve/table.c). SMMLA multiplies a 2x8
 * block of x (two rows, 8 k) by a 2x8 block of W (two output columns, 8 k)
 * into a 2x2 int32 block [x0w0, x0w1, x1w0, x1w1].
 *
 * Prefill: the driver unpacks each panel's K block once into SMMLA operands
 *   "mmla_n4k8" (32 bytes per 8 k: row pair s = 0, 1 at byte 16s, rows 2s
 *   and 2s + 1 at 8h: W[2s + h, k + i] at byte 16s + 8h + i; a ZIP1/ZIP2
 *   of 64-bit halves of the unpacked rows) and f32 d, o per weight group,
 *   and packs the tile's x rows as row-pair operands once per K block. The
 *   tile is 4 row pairs x 2 W pairs (8 rows x 4 columns, 8 accumulators):
 *   per 8 k 4 x + 2 W loads and 8 SMMLA; the ABI's epilogue per weight group
 *   of 16 or 32 columns on the blocked accumulators (d as [d0, d1, d0, d1],
 *   sx as [s0, s0, s1, s1]), t in registers in the same order over the K
 *   block, converted from / to y's rows at its ends. Group sums start at
 *   quant_arm.h's ACC_BIAS ((float)sum is one FSUB); the driver prepares sx
 *   and b as [s0, s0, s1, s1] per row pair, the unpack d and o as W pairs.
 * llvm-mca, Neoverse N2 model: a group (32 SMMLA) 28 cycles with 32-column
 *   groups (57% of SMMLA peak: the exact per-group epilogue's ceiling),
 *   32.5 with offsets, 45.5-53 with 16-column groups.
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
  const int NG = E / ga_group_len(T); /* weight groups per block */
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
    for (int j = 0; j < NG; j++) { /* as the W pairs' operands: [d0, d1, d0, d1, d2, d3, ..] */
      float32x4_t d, o;
      ga_group_scales(T, blk, j, &d, &o);
      float *dp = pk->d[b * NG + j], *op = pk->o[b * NG + j];
      vst1q_f32(dp, vcombine_f32(vget_low_f32(d), vget_low_f32(d)));
      vst1q_f32(dp + 4, vcombine_f32(vget_high_f32(d), vget_high_f32(d)));
      vst1q_f32(op, vcombine_f32(vget_low_f32(o), vget_low_f32(o)));
      vst1q_f32(op + 4, vcombine_f32(vget_high_f32(o), vget_high_f32(o)));
    }
  }
}

#define UNPACK_MMLA(T)                                                                        \
  static void unpack_mmla_##T(const uint8_t *panel, int64_t b0, int64_t nb,                   \
                              armllm_ga_panel_k *pk) {                                        \
    unpack_mmla(ARMLLM_GGML_##T, panel, b0, nb, pk);                                          \
  }
ARMLLM_GA_TYPES(UNPACK_MMLA)

/* The 8-row x 4-column SMMLA tile over one K block (gguf_arm.h's
 * armllm_ga_tile): weight groups of 16 (G16) or 32 columns, with offsets
 * (OFF) or not. */
ALWAYS_INLINE void mmla_tile(const int G16, const int OFF, const armllm_ga_tile *tl) {
  const armllm_ga_rows *rw = tl->rows;
  const armllm_ga_panel_k *pk = tl->pk;
  const int8_t *wp = pk->w, *xp = rw->ap;
  /* t between row-major y and the blocked order t[pair][s] */
  float ty[MR][NR] __attribute__((aligned(16)));
  memset(ty, 0, sizeof ty);
  if (!tl->first)
    for (int r = 0; r < tl->mv; r++) memcpy(ty[r], tl->y + r * tl->ldy, (size_t)tl->nv * 4);
  float32x4_t t[MP][2];
#pragma GCC unroll 4
  for (int pr = 0; pr < MP; pr++)
#pragma GCC unroll 2
    for (int s = 0; s < 2; s++)
      t[pr][s] = vcombine_f32(vld1_f32(ty[2 * pr] + 2 * s), vld1_f32(ty[2 * pr + 1] + 2 * s));
  for (int64_t g = 0; g < tl->kc / 32; g++) {
    int32x4_t acc[MP][2];
    const int32_t *start = ga_acc_start();
#pragma GCC unroll 4
    for (int pr = 0; pr < MP; pr++)
#pragma GCC unroll 2
      for (int s = 0; s < 2; s++) acc[pr][s] = vld1q_s32(start + 8 * pr + 4 * s);
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++, wp += 32, xp += 16 * MP) { /* 8 k each */
      const int8x16_t w0 = vld1q_s8(wp), w1 = vld1q_s8(wp + 16);
#pragma GCC unroll 4
      for (int pr = 0; pr < MP; pr++) {
        const int8x16_t xv = vld1q_s8(xp + 16 * pr);
        acc[pr][0] = vmmlaq_s32(acc[pr][0], xv, w0);
        acc[pr][1] = vmmlaq_s32(acc[pr][1], xv, w1);
      }
      if (!G16 && c != 3) continue;
      if (G16 && c != 1 && c != 3) continue;
      const int64_t j = G16 ? 2 * g + c / 2 : g; /* the weight group just summed */
      const float32x4_t dp[2] = {vld1q_f32(pk->d[j]), vld1q_f32(pk->d[j] + 4)};
      float32x4_t op[2] = {dp[0], dp[1]};
      if (OFF) op[0] = vld1q_f32(pk->o[j]), op[1] = vld1q_f32(pk->o[j] + 4);
      const int32_t *next = ga_acc_start();
#pragma GCC unroll 4
      for (int pr = 0; pr < MP; pr++) {
        const float32x4_t sxp = vld1q_f32(rw->sxp[g][pr]);
        float32x4_t bp = sxp;
        if (OFF) bp = vld1q_f32(rw->bp[j][pr]);
#pragma GCC unroll 2
        for (int s = 0; s < 2; s++) {
          t[pr][s] = vfmaq_f32(t[pr][s], dp[s], vmulq_f32(ga_acc_f32(acc[pr][s]), sxp));
          if (OFF) t[pr][s] = vfmaq_f32(t[pr][s], op[s], bp);
          if (G16 && c == 1) acc[pr][s] = vld1q_s32(next + 8 * pr + 4 * s);
        }
      }
    }
  }
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

#define MMLA_TILE(G16, OFF)                                                          \
  static __attribute__((noinline)) void mmla_tile_##G16##OFF(const armllm_ga_tile *t) { \
    mmla_tile(G16, OFF, t);                                                          \
  }
MMLA_TILE(0, 0) MMLA_TILE(0, 1) MMLA_TILE(1, 0) MMLA_TILE(1, 1)

#define UNPACK_MMLA_FN(T) unpack_mmla_##T,
static const armllm_ga_prefill mmla_prefill = {
    {{mmla_tile_00, mmla_tile_01}, {mmla_tile_10, mmla_tile_11}},
    MR,
    1,
    {ARMLLM_GA_TYPES(UNPACK_MMLA_FN)},
};

void armllm_neon_mmla_gemm_gguf(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k,
                                int64_t ldq, const float *scale, int64_t ldsc,
                                const int32_t *gsum, int64_t ldgs, const void *packed_w,
                                int64_t n, const float *bias, float *y, int64_t ldy) {
  const armllm_ga_args a = {xq, m, k, ldq, scale, ldsc, gsum, ldgs, bias, y, ldy};
  armllm_ga_gemm(pool, &a, packed_w, n, armllm_neon_gguf_decode(1), &mmla_prefill);
}
