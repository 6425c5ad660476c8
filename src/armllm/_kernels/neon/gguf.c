/* neon/gguf.c: the GGUF-block GEMM on Armv8 NEON, with SDOT when the CPU
 * has dotprod: the decode kernels (which neon_mmla and sve run too) and the
 * SDOT prefill tile; the packed layout ("gguf-arm-p4"), its unpacking and
 * the driver are gguf_arm.h/.c, activations come from neon/quant_act.c.
 *
 * Decode (M <= 4, memory-bound): one kernel per type and row count reads a
 *   panel (4 W rows) straight from its packed blocks: per 32-element chunk
 *   each row's values are unpacked into two int8 vectors in element order
 *   and multiplied with the x rows' same 32 elements (SDOT, 4 lanes of
 *   partial sums; Armv8.0: SMULL + SMLAL2 + SADALP, the two products of a
 *   lane summed in int16: |sum| <= 2 * 128 * 127 < 2^15, x being in
 *   [-127, 127]). The 4 rows' partial sums reduce with two ADDP into one
 *   vector (the 4 output columns), the group's d and o come from the
 *   panel's header for the 4 rows at once, and t stays in registers over
 *   all K. The SDOT code has a target attribute and runs only when HWCAP
 *   says asimddp (cpu.c: `impl` shows neon+dotprod); on Armv8.0 the same
 *   kernels with SMULL run every M in 4-row tiles.
 * Prefill (dotprod): the driver unpacks each panel's K block once into
 *   SDOT operands "n4k4" (16 bytes per 4 k: W[4 rows][4 k], byte 4j + i =
 *   row j, k i; a 4x4 transpose of 32-bit words of the unpacked rows) and
 *   f32 d, o per weight group; the tile is 8 rows x 4 columns: per 4 k one
 *   operand load and 8 SDOT by lane against the rows' x vectors, the ABI's
 *   epilogue per weight group of 16 or 32 columns, t in registers over the
 *   K block (8 accumulators + 8 t + 8 x rows + the operand); the group
 *   sums start at quant_arm.h's ACC_BIAS so that (float)sum is one FSUB.
 * llvm-mca, Neoverse N2 model (tools/arm_mca_report.py): the SDOT tile's
 *   group (64 SDOT) 45 cycles with 32-column groups (71% of SDOT peak; the
 *   exact epilogue's ceiling is 73%), 49 with offsets, 61-68 with 16-column
 *   groups; decode at M = 1 per 4 rows x 256 k: Q4_K 164 cycles (3.7 bytes
 *   of weights a cycle), Q6_K 289 (2.9), Q2_K 301 (1.2), per 4 x 32 k Q4_0
 *   18.5 (3.9); Armv8.0 Q4_K 232.
 */
#include <arm_neon.h>

#include "../armllm_kernels.h"
#include "../cpu.h"
#include "../gemm_plan.h"
#include "../gguf_arm.h"

#define NR ARMLLM_GA_NR
#define ALWAYS_INLINE static inline __attribute__((always_inline))
/* The SDOT code: GCC's arm_neon.h defines vdotq_* for arch=armv8.2-a+dotprod
 * ("+dotprod" alone mismatches); dotprod exists only from Armv8.2 anyway. */
#define DOT_TARGET target("arch=armv8.2-a+dotprod")
#define DOT_FN static inline __attribute__((always_inline, DOT_TARGET))
#define DOT_NOINLINE static __attribute__((noinline, DOT_TARGET))
#define PREFILL_MR 8 /* rows of the SDOT prefill tile */
/* Keeps GCC from hoisting the next chunk's loads and unpacking (spills). */
#define BARRIER __asm__ volatile("" ::: "memory")

/* ------------------------------------------------------ output tiles */

/* t of rows [0, mr) x the panel's 4 columns: +0, or what y holds (valid part). */
ALWAYS_INLINE void t_load(const int MR, float32x4_t *t, const float *y, int64_t ldy, int first,
                          int mv, int nv) {
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++) {
    t[r] = vdupq_n_f32(0.0f);
    if (first || r >= mv) continue;
    if (nv == NR) {
      t[r] = vld1q_f32(y + r * ldy);
    } else {
      float e[NR] = {0.0f, 0.0f, 0.0f, 0.0f};
      memcpy(e, y + r * ldy, (size_t)nv * sizeof *e);
      t[r] = vld1q_f32(e);
    }
  }
}

/* y = t (+ bias) for the valid rows and columns. */
ALWAYS_INLINE void t_store(const int MR, const float32x4_t *t, float *y, int64_t ldy,
                           const float *bias, int mv, int nv) {
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++) {
    if (r >= mv) break;
    float32x4_t v = t[r];
    if (bias) v = vaddq_f32(v, vld1q_f32(bias));
    if (nv == NR) {
      vst1q_f32(y + r * ldy, v);
    } else {
      float e[NR];
      vst1q_f32(e, v);
      memcpy(y + r * ldy, e, (size_t)nv * sizeof *e);
    }
  }
}

/* ---------------------------------------------------------- decode */

/* acc += w . x per 4-byte lane: SDOT, or on Armv8.0 SMULL/SMLAL2/SADALP. */
ALWAYS_INLINE int32x4_t dot16(const int DOT, int32x4_t acc, int8x16_t w, int8x16_t x) {
  if (DOT) {
    __asm__("sdot %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(w), "w"(x));
    return acc;
  }
  return vpadalq_s16(acc, vmlal_high_s8(vmull_s8(vget_low_s8(w), vget_low_s8(x)), w, x));
}

/* [sum acc[0], .., sum acc[3]]: the 4 columns' sums */
ALWAYS_INLINE int32x4_t reduce4(const int32x4_t *acc) {
  return vpaddq_s32(vpaddq_s32(acc[0], acc[1]), vpaddq_s32(acc[2], acc[3]));
}

/* Rows [m0, m0 + MR) x one panel of type T over all K (gguf_arm.h's
 * armllm_ga_decode_fn). */
ALWAYS_INLINE void decode_tile(const int T, const int MR, const int DOT, const armllm_ga_args *a,
                               int64_t m0, const uint8_t *panel, int64_t n0, int nv) {
  const int E = ga_elems(T), HB = ga_hb(T), UB = ga_ub(T), PB = ga_pb(T);
  const int G16 = ga_group_len(T) == 16, OFF = ga_offsets(T);
  const int64_t nblk = a->k / E;
  const int8_t *x[4];
  const float *sx[4];
  const int32_t *gs[4];
  float32x4_t t[4];
#pragma GCC unroll 4
  for (int r = 0; r < MR; r++) {
    x[r] = a->xq + (m0 + r) * a->ldq;
    sx[r] = a->scale + (m0 + r) * a->ldsc;
    gs[r] = OFF && !G16 ? a->gsum + (m0 + r) * a->ldgs : NULL;
    t[r] = vdupq_n_f32(0.0f);
  }
  for (int64_t b = 0; b < nblk; b++, panel += PB) {
    const uint8_t *rv = panel + HB;
#pragma GCC unroll 8
    for (int c = 0; c < E / 32; c++) {
      const int64_t g = b * (E / 32) + c; /* activation group */
      int8x16_t w[NR][2];
#pragma GCC unroll 4
      for (int j = 0; j < NR; j++) ga_unpack_chunk(T, rv + j * UB, c, &w[j][0], &w[j][1]);
      float32x4_t d[2], o[2];
      ga_group_scales(T, panel, G16 ? 2 * c : c, &d[0], &o[0]);
      if (G16) ga_group_scales(T, panel, 2 * c + 1, &d[1], &o[1]);
#pragma GCC unroll 4
      for (int r = 0; r < MR; r++) {
        const int8x16_t x0 = vld1q_s8(x[r] + 32 * g), x1 = vld1q_s8(x[r] + 32 * g + 16);
        const float s = sx[r][g];
        int32x4_t acc[NR];
        if (!G16) {
#pragma GCC unroll 4
          for (int j = 0; j < NR; j++)
            acc[j] = dot16(DOT, dot16(DOT, vdupq_n_s32(0), w[j][0], x0), w[j][1], x1);
          t[r] = vfmaq_f32(t[r], d[0], vmulq_n_f32(vcvtq_f32_s32(reduce4(acc)), s));
          if (OFF) t[r] = vfmaq_n_f32(t[r], o[0], (float)gs[r][g] * s);
          if (MR > 1) BARRIER; /* one row at a time: no spills */
          continue;
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) { /* weight groups 2c, 2c + 1 */
          const int8x16_t xh = h ? x1 : x0;
#pragma GCC unroll 4
          for (int j = 0; j < NR; j++) acc[j] = dot16(DOT, vdupq_n_s32(0), w[j][h], xh);
          t[r] = vfmaq_f32(t[r], d[h], vmulq_n_f32(vcvtq_f32_s32(reduce4(acc)), s));
          if (OFF) t[r] = vfmaq_n_f32(t[r], o[h], (float)vaddlvq_s8(xh) * s);
        }
        if (MR > 1) BARRIER;
      }
      BARRIER;
    }
  }
  const float *bias = NULL;
  float eb[NR] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (a->bias) {
    memcpy(eb, a->bias + n0, (size_t)nv * sizeof *eb);
    bias = eb;
  }
  t_store(MR, t, a->y + m0 * a->ldy + n0, a->ldy, bias, MR, nv);
}

#define DEC_ARGS \
  (const armllm_ga_args *a, int64_t m0, const uint8_t *panel, int64_t n0, int nv)
#define DEC_DOT(T, MR)                                                 \
  DOT_NOINLINE void dec_dot_##T##_##MR DEC_ARGS {                      \
    decode_tile(ARMLLM_GGML_##T, MR, 1, a, m0, panel, n0, nv);         \
  }
#define DEC_MULL(T, MR)                                                \
  static __attribute__((noinline)) void dec_mull_##T##_##MR DEC_ARGS { \
    decode_tile(ARMLLM_GGML_##T, MR, 0, a, m0, panel, n0, nv);         \
  }
#define DEC_ALL(T)                                                               \
  DEC_DOT(T, 1) DEC_DOT(T, 2) DEC_DOT(T, 3) DEC_DOT(T, 4)                        \
  DEC_MULL(T, 1) DEC_MULL(T, 2) DEC_MULL(T, 3) DEC_MULL(T, 4)
ARMLLM_GA_TYPES(DEC_ALL)

#define DEC_SET_DOT(T) {dec_dot_##T##_1, dec_dot_##T##_2, dec_dot_##T##_3, dec_dot_##T##_4},
#define DEC_SET_MULL(T) {dec_mull_##T##_1, dec_mull_##T##_2, dec_mull_##T##_3, dec_mull_##T##_4},
static const armllm_ga_decode_set decode_dot = {ARMLLM_GA_TYPES(DEC_SET_DOT)};
static const armllm_ga_decode_set decode_mull = {ARMLLM_GA_TYPES(DEC_SET_MULL)};

const armllm_ga_decode_set *armllm_neon_gguf_decode(int dot) {
  return dot ? &decode_dot : &decode_mull;
}

/* ---------------------------------------------------------- prefill */

/* Blocks [b0, b0 + nb) of a panel of type T as SDOT operands "n4k4". */
ALWAYS_INLINE void unpack_n4k4(const int T, const uint8_t *panel, int64_t b0, int64_t nb,
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
      for (int h = 0; h < 2; h++, dst += 64) { /* 16 k: 4 operands of 4 k */
        const int32x4_t r0 = vreinterpretq_s32_s8(w[0][h]), r1 = vreinterpretq_s32_s8(w[1][h]);
        const int32x4_t r2 = vreinterpretq_s32_s8(w[2][h]), r3 = vreinterpretq_s32_s8(w[3][h]);
        const int64x2_t t0 = vreinterpretq_s64_s32(vtrn1q_s32(r0, r1));
        const int64x2_t t1 = vreinterpretq_s64_s32(vtrn2q_s32(r0, r1));
        const int64x2_t t2 = vreinterpretq_s64_s32(vtrn1q_s32(r2, r3));
        const int64x2_t t3 = vreinterpretq_s64_s32(vtrn2q_s32(r2, r3));
        vst1q_s8(dst, vreinterpretq_s8_s64(vzip1q_s64(t0, t2)));
        vst1q_s8(dst + 16, vreinterpretq_s8_s64(vzip1q_s64(t1, t3)));
        vst1q_s8(dst + 32, vreinterpretq_s8_s64(vzip2q_s64(t0, t2)));
        vst1q_s8(dst + 48, vreinterpretq_s8_s64(vzip2q_s64(t1, t3)));
      }
    }
    for (int j = 0; j < NG; j++) {
      float32x4_t d, o;
      ga_group_scales(T, blk, j, &d, &o);
      vst1q_f32(pk->d[b * NG + j], d);
      vst1q_f32(pk->o[b * NG + j], o);
    }
  }
}

#define UNPACK_N4K4(T)                                                                        \
  static void unpack_n4k4_##T(const uint8_t *panel, int64_t b0, int64_t nb,                   \
                              armllm_ga_panel_k *pk) {                                        \
    unpack_n4k4(ARMLLM_GGML_##T, panel, b0, nb, pk);                                          \
  }
ARMLLM_GA_TYPES(UNPACK_N4K4)

/* The 8-row x 4-column SDOT tile over one K block (gguf_arm.h's
 * armllm_ga_tile): weight groups of 16 (G16) or 32 columns, with offsets
 * (OFF) or not. */
DOT_FN void sdot_tile(const int G16, const int OFF, const armllm_ga_tile *tl) {
  const int MR = PREFILL_MR;
  const armllm_ga_rows *rw = tl->rows;
  const armllm_ga_panel_k *pk = tl->pk;
  const int8_t *wp = pk->w;
  float32x4_t t[PREFILL_MR];
  t_load(MR, t, tl->y, tl->ldy, tl->first, tl->mv, tl->nv);
  for (int64_t g = 0; g < tl->kc / 32; g++) {
    int32x4_t acc[PREFILL_MR];
    const int32_t *start = ga_acc_start();
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) acc[r] = vld1q_s32(start + 4 * r);
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
      int8x16_t xv[PREFILL_MR];
#pragma GCC unroll 8
      for (int r = 0; r < MR; r++) xv[r] = vld1q_s8(rw->x[r] + 32 * g + 16 * h);
      int8x16_t w0 = vld1q_s8(wp), w1 = vld1q_s8(wp + 16), w2 = vld1q_s8(wp + 32),
                w3 = vld1q_s8(wp + 48);
      wp += 64;
#pragma GCC unroll 8
      for (int r = 0; r < MR; r++) {
        acc[r] = vdotq_laneq_s32(acc[r], w0, xv[r], 0);
        acc[r] = vdotq_laneq_s32(acc[r], w1, xv[r], 1);
        acc[r] = vdotq_laneq_s32(acc[r], w2, xv[r], 2);
        acc[r] = vdotq_laneq_s32(acc[r], w3, xv[r], 3);
      }
      if (!G16 && h == 0) continue;
      const int64_t j = G16 ? 2 * g + h : g; /* the weight group just summed */
      const float32x4_t d = vld1q_f32(pk->d[j]), o = vld1q_f32(pk->o[j]);
      const float32x4_t sx[2] = {vld1q_f32(rw->sx[g]), vld1q_f32(rw->sx[g] + 4)};
      float32x4_t bv[2] = {sx[0], sx[1]};
      if (OFF) bv[0] = vld1q_f32(rw->b[j]), bv[1] = vld1q_f32(rw->b[j] + 4);
      const int32_t *next = ga_acc_start();
#pragma GCC unroll 8
      for (int r = 0; r < MR; r++) {
        const float32x4_t av = vmulq_laneq_f32(ga_acc_f32(acc[r]), sx[r / 4], r % 4);
        t[r] = vfmaq_f32(t[r], d, av);
        if (OFF) t[r] = vfmaq_laneq_f32(t[r], o, bv[r / 4], r % 4);
        if (G16 && h == 0) acc[r] = vld1q_s32(next + 4 * r);
      }
    }
  }
  t_store(MR, t, tl->y, tl->ldy, tl->bias, tl->mv, tl->nv);
}

#define SDOT_TILE(G16, OFF) \
  DOT_NOINLINE void sdot_tile_##G16##OFF(const armllm_ga_tile *t) { sdot_tile(G16, OFF, t); }
SDOT_TILE(0, 0) SDOT_TILE(0, 1) SDOT_TILE(1, 0) SDOT_TILE(1, 1)

#define UNPACK_N4K4_FN(T) unpack_n4k4_##T,
static const armllm_ga_prefill sdot_prefill = {
    {{sdot_tile_00, sdot_tile_01}, {sdot_tile_10, sdot_tile_11}},
    PREFILL_MR,
    0,
    {ARMLLM_GA_TYPES(UNPACK_N4K4_FN)},
};

/* ------------------------------------------------------------ slots */

size_t armllm_neon_gemm_gguf_packed_len(int64_t k, int64_t nparts, const int32_t *types,
                                        const int64_t *rows) {
  return armllm_ga_packed_len(k, nparts, types, rows);
}

void armllm_neon_gemm_gguf_pack(const uint8_t *blocks, int64_t k, int64_t nparts,
                                const int32_t *types, const int64_t *rows, void *packed) {
  armllm_ga_pack(blocks, k, nparts, types, rows, packed);
}

void armllm_neon_gemm_gguf(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k,
                           int64_t ldq, const float *scale, int64_t ldsc, const int32_t *gsum,
                           int64_t ldgs, const void *packed_w, int64_t n, const float *bias,
                           float *y, int64_t ldy) {
  const int dot = armllm_neon_sdot(); /* what `armllm info` reports as neon+dotprod */
  const armllm_ga_args a = {xq, m, k, ldq, scale, ldsc, gsum, ldgs, bias, y, ldy};
  /* Armv8.0: every M through the SMULL decode kernels, 4 rows at a time */
  armllm_ga_gemm(pool, &a, packed_w, n, armllm_neon_gguf_decode(dot), dot ? &sdot_prefill : NULL);
}
