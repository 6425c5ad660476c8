/* neon/gguf.c: the GGUF-block GEMM on Armv8 NEON, with SDOT when the CPU
 * has dotprod: the decode kernels (which neon_mmla and sve run too) and the
 * SDOT prefill tiles; the packed layout ("gguf-arm-p4"), its unpacking and
 * the driver are gguf_arm.h/.c, activations come from neon/quant_act.c.
 *
 * Decode (M <= 4, memory-bound): one kernel per type and row count reads a
 *   panel (4 W rows) straight from its packed blocks: per 32-element chunk
 *   each row's values are unpacked into two int8 vectors in element order
 *   and multiplied with the x rows' same 32 elements (SDOT, 4 lanes of
 *   partial sums; Armv8.0: SMULL + SMLAL2 + SADALP, the two products of a
 *   lane summed in int16: |sum| <= 2 * 128 * 127 < 2^15, x being in
 *   [-127, 127]). The 4 rows' partial sums reduce with two ADDP into one
 *   vector (the 4 output columns); a 32-element block then takes the ABI's
 *   float step with its d and o, a super-block's weight group adds them
 *   times its 4 integer sub-scales into isum (MLA) and its mins times the
 *   row's sum of x into msum, and the float steps come once per 256
 *   columns. t stays in registers over all K. The SDOT code has a target
 *   attribute and runs only when HWCAP says asimddp (cpu.c: `impl` shows
 *   neon+dotprod); on Armv8.0 the same kernels with SMULL run every M in
 *   4-row tiles.
 * Prefill (dotprod): the driver unpacks each panel's K block once into
 *   SDOT operands "n4k4" (16 bytes per 4 k: W[4 rows][4 k], byte 4j + i =
 *   row j, k i; a 4x4 transpose of 32-bit words of the unpacked rows) and
 *   the scales (gguf_arm.h's armllm_ga_panel_k); the tiles are 8 rows x 4
 *   columns: per 4 k one operand load and 8 SDOT by lane against the rows'
 *   x vectors. 32-element types: the ABI's epilogue per block, t in
 *   registers over the K block (8 accumulators + 8 t + 8 x rows + the
 *   operand), the block sums starting at quant_arm.h's ACC_BIAS so that
 *   (float)sum is one FSUB. Super-block types: one MLA per weight group
 *   and accumulator (isum), the float epilogue per 256 columns.
 * llvm-mca, Neoverse N2 model (tools/arm_mca_report.py; per super-block with
 *   its epilogue: the loops' cycles times their trips): the 32-element tile
 *   45 cycles per block (64 SDOT: 71% of SDOT peak; the exact per-block
 *   epilogue's ceiling is 73%), 49 with offsets; a super-block (512 SDOT)
 *   317 cycles with 32-column groups (81%; was 360 = 8 x 45), 362 with mins
 *   (71%; was 392), 355 with 16-column groups (72%; was 484), 434 with
 *   mins (59%; was 544): the hot loops run 89% (32-column groups) and 78%
 *   (16) of peak, msum (one FMLA per group and accumulator) and the SCVTF
 *   of isum take the rest. Decode at M = 1 per 4 rows x 256 k: Q4_K 137
 *   cycles (4.4 bytes of weights a cycle; was 164), Q6_K 240 (3.5; was
 *   289), Q2_K 213 (1.7; was 301), IQ4_XS 139 (was 162), per 4 x 32 k Q4_0
 *   18.5 (3.9); Armv8.0 Q4_K 202 (was 232).
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

/* The sum of a chunk's 32 x values (a 32-column group's gs). */
ALWAYS_INLINE int32_t sum32(int8x16_t x0, int8x16_t x1) {
  return vaddlvq_s16(vpadalq_s8(vpaddlq_s8(x0), x1));
}

/* Block b of a 32-element type (one weight group) onto t: per row r,
 * t = fma(d, (float)acc * sx, t) [t = fma(o, (float)gs * sx, t), gs from
 * the rows' gsum (G = 32) or summed here (gs[r] NULL)]. */
ALWAYS_INLINE void decode_block32(const int T, const int MR, const int DOT,
                                  const armllm_ga_args *a, const int8_t *const *x,
                                  const float *const *sx, const int32_t *const *gs, int64_t b,
                                  const uint8_t *blk, float32x4_t *t) {
  int8x16_t w[NR][2];
#pragma GCC unroll 4
  for (int j = 0; j < NR; j++)
    ga_unpack_chunk(T, blk + ga_hb(T) + j * ga_ub(T), 0, &w[j][0], &w[j][1]);
  float32x4_t d, o;
  ga_block_scales(T, blk, &d, &o);
#pragma GCC unroll 4
  for (int r = 0; r < MR; r++) {
    const int8x16_t x0 = vld1q_s8(x[r] + 32 * b), x1 = vld1q_s8(x[r] + 32 * b + 16);
    const float s = ga_sx(a, sx[r], 32 * b);
    int32x4_t acc[NR];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++)
      acc[j] = dot16(DOT, dot16(DOT, vdupq_n_s32(0), w[j][0], x0), w[j][1], x1);
    t[r] = vfmaq_f32(t[r], d, vmulq_n_f32(vcvtq_f32_s32(reduce4(acc)), s));
    if (ga_offsets(T)) t[r] = vfmaq_n_f32(t[r], o, (float)(gs[r] ? gs[r][b] : sum32(x0, x1)) * s);
    if (MR > 1) BARRIER; /* one row at a time: no spills */
  }
  BARRIER;
}

/* Super-block b onto t: per row r, isum = sum_j s_j * acc_j and msum =
 * sum_j m_j * gs_j in int32 over the block's weight groups (16 or 32
 * columns), then t = fma(D, (float)isum * sx, t) [t = fma(O, (float)msum *
 * sx, t)]. */
ALWAYS_INLINE void decode_super(const int T, const int MR, const int DOT, const armllm_ga_args *a,
                                const int8_t *const *x, const float *const *sx, int64_t b,
                                const uint8_t *blk, float32x4_t *t) {
  const int G16 = ga_group_len(T) == 16, OFF = ga_offsets(T);
  const int64_t k0 = b * ARMLLM_GGUF_SUPER;
  int32x4_t isum[4], msum[4];
#pragma GCC unroll 4
  for (int r = 0; r < MR; r++) isum[r] = msum[r] = vdupq_n_s32(0);
#pragma GCC unroll 8
  for (int c = 0; c < ARMLLM_GGUF_SUPER / 32; c++) {
    int8x16_t w[NR][2];
#pragma GCC unroll 4
    for (int j = 0; j < NR; j++)
      ga_unpack_chunk(T, blk + ga_hb(T) + j * ga_ub(T), c, &w[j][0], &w[j][1]);
    int32x4_t s[2], m[2]; /* the chunk's weight groups: one (32 columns) or two */
    ga_group_ints(T, blk, G16 ? 2 * c : c, &s[0], &m[0]);
    if (G16) ga_group_ints(T, blk, 2 * c + 1, &s[1], &m[1]);
#pragma GCC unroll 4
    for (int r = 0; r < MR; r++) {
      const int8x16_t x0 = vld1q_s8(x[r] + k0 + 32 * c), x1 = vld1q_s8(x[r] + k0 + 32 * c + 16);
      int32x4_t acc[NR];
      if (!G16) {
#pragma GCC unroll 4
        for (int j = 0; j < NR; j++)
          acc[j] = dot16(DOT, dot16(DOT, vdupq_n_s32(0), w[j][0], x0), w[j][1], x1);
        isum[r] = vmlaq_s32(isum[r], reduce4(acc), s[0]);
        if (OFF) msum[r] = vmlaq_n_s32(msum[r], m[0], sum32(x0, x1));
      } else {
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) { /* weight groups 2c, 2c + 1 */
          const int8x16_t xh = h ? x1 : x0;
#pragma GCC unroll 4
          for (int j = 0; j < NR; j++) acc[j] = dot16(DOT, vdupq_n_s32(0), w[j][h], xh);
          isum[r] = vmlaq_s32(isum[r], reduce4(acc), s[h]);
          if (OFF) msum[r] = vmlaq_n_s32(msum[r], m[h], vaddlvq_s8(xh));
        }
      }
      if (MR > 1) BARRIER;
    }
    BARRIER;
  }
  float32x4_t D, O;
  ga_block_supers(T, blk, &D, &O);
#pragma GCC unroll 4
  for (int r = 0; r < MR; r++) {
    const float sxb = ga_sx(a, sx[r], k0);
    t[r] = vfmaq_f32(t[r], D, vmulq_n_f32(vcvtq_f32_s32(isum[r]), sxb));
    if (OFF) t[r] = vfmaq_f32(t[r], O, vmulq_n_f32(vcvtq_f32_s32(msum[r]), sxb));
  }
}

/* Rows [m0, m0 + MR) x one panel of type T over all K (gguf_arm.h's
 * armllm_ga_decode_fn). */
ALWAYS_INLINE void decode_tile(const int T, const int MR, const int DOT, const armllm_ga_args *a,
                               int64_t m0, const uint8_t *panel, int64_t n0, int nv) {
  const int64_t nblk = a->k / ga_elems(T);
  const int8_t *x[4];
  const float *sx[4];
  const int32_t *gs[4];
  float32x4_t t[4];
#pragma GCC unroll 4
  for (int r = 0; r < MR; r++) {
    x[r] = a->xq + (m0 + r) * a->ldq;
    sx[r] = a->scale + (m0 + r) * a->ldsc;
    gs[r] = a->gsum ? a->gsum + (m0 + r) * a->ldgs : NULL;
    t[r] = vdupq_n_f32(0.0f);
  }
  for (int64_t b = 0; b < nblk; b++, panel += ga_pb(T)) {
    if (ga_super(T)) decode_super(T, MR, DOT, a, x, sx, b, panel, t);
    else decode_block32(T, MR, DOT, a, x, sx, gs, b, panel, t);
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
    ga_unpack_scales(T, 0, blk, b, pk);
  }
}

#define UNPACK_N4K4(T)                                                                        \
  static void unpack_n4k4_##T(const uint8_t *panel, int64_t b0, int64_t nb,                   \
                              armllm_ga_panel_k *pk) {                                        \
    unpack_n4k4(ARMLLM_GGML_##T, panel, b0, nb, pk);                                          \
  }
ARMLLM_GA_TYPES(UNPACK_N4K4)

/* acc[r] += x row r's 16 k at xoff times the 4 SDOT operands at wp ("n4k4":
 * 16 k of the panel's 4 columns). */
DOT_FN void sdot_16k(int32x4_t *acc, const armllm_ga_rows *rw, int64_t xoff, const int8_t *wp) {
  int8x16_t xv[PREFILL_MR];
#pragma GCC unroll 8
  for (int r = 0; r < PREFILL_MR; r++) xv[r] = vld1q_s8(rw->x[r] + xoff);
  const int8x16_t w0 = vld1q_s8(wp), w1 = vld1q_s8(wp + 16), w2 = vld1q_s8(wp + 32),
                  w3 = vld1q_s8(wp + 48);
#pragma GCC unroll 8
  for (int r = 0; r < PREFILL_MR; r++) {
    acc[r] = vdotq_laneq_s32(acc[r], w0, xv[r], 0);
    acc[r] = vdotq_laneq_s32(acc[r], w1, xv[r], 1);
    acc[r] = vdotq_laneq_s32(acc[r], w2, xv[r], 2);
    acc[r] = vdotq_laneq_s32(acc[r], w3, xv[r], 3);
  }
}

/* The 8-row x 4-column SDOT tile of a 32-element type over one K block
 * (gguf_arm.h's armllm_ga_tile), with offsets (OFF) or not: the ABI's
 * epilogue per 32-column block. */
DOT_FN void sdot_tile(const int OFF, const armllm_ga_tile *tl) {
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
    for (int h = 0; h < 2; h++, wp += 64) sdot_16k(acc, rw, 32 * g + 16 * h, wp);
    const float32x4_t d = vld1q_f32(pk->d[g]), o = vld1q_f32(pk->o[g]);
    const float32x4_t sx[2] = {vld1q_f32(rw->sx[g]), vld1q_f32(rw->sx[g] + 4)};
    float32x4_t bv[2] = {sx[0], sx[1]};
    if (OFF) bv[0] = vld1q_f32(rw->b[g]), bv[1] = vld1q_f32(rw->b[g] + 4);
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
      const float32x4_t av = vmulq_laneq_f32(ga_acc_f32(acc[r]), sx[r / 4], r % 4);
      t[r] = vfmaq_f32(t[r], d, av);
      if (OFF) t[r] = vfmaq_laneq_f32(t[r], o, bv[r / 4], r % 4);
    }
  }
  t_store(MR, t, tl->y, tl->ldy, tl->bias, tl->mv, tl->nv);
}

/* The 8-row x 4-column SDOT tile of a super-block type over one K block:
 * weight groups of 16 (G16) or 32 columns, with mins (OFF) or not. acc
 * runs over a whole super-block from 0 and after each group isum += acc *
 * (s_j - s_{j+1}) (pk->s, gguf_arm.h): one MLA a group, then the float
 * epilogue once per super-block. msum = sum_j m_j * gs_j is formed there
 * in f32, exactly: every partial sum is an integer below 2^24 (|m_j| <= 63,
 * |gs_j| <= 32 * 127, 8 groups; Q2_K 15, 16 * 127, 16), so it is (float)msum
 * and FMLA runs on both vector pipes (integer MLA on one). t waits in
 * memory between super-blocks: the registers hold acc, isum, x and W. */
DOT_FN void sdot_super_tile(const int G16, const int OFF, const armllm_ga_tile *tl) {
  const int MR = PREFILL_MR, NG = ARMLLM_GGUF_SUPER / (G16 ? 16 : 32);
  const armllm_ga_rows *rw = tl->rows;
  const armllm_ga_panel_k *pk = tl->pk;
  const int8_t *wp = pk->w;
  float tm[PREFILL_MR * NR] __attribute__((aligned(16)));
  float *tp = tm;
  __asm__("" : "+r"(tp)); /* opaque: GCC would promote t to registers and spill */
  {
    float32x4_t t[PREFILL_MR];
    t_load(MR, t, tl->y, tl->ldy, tl->first, tl->mv, tl->nv);
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) vst1q_f32(tp + NR * r, t[r]);
  }
  for (int64_t sb = 0; sb < tl->kc / ARMLLM_GGUF_SUPER; sb++) {
    const int64_t k0 = sb * ARMLLM_GGUF_SUPER, j0 = sb * NG;
    int32x4_t acc[PREFILL_MR], isum[PREFILL_MR];
    const int32_t *zeros = ga_zero_start();
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) acc[r] = vld1q_s32(zeros + 4 * r);
    zeros = ga_zero_start();
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) isum[r] = vld1q_s32(zeros + 4 * r);
    for (int c = 0; c < ARMLLM_GGUF_SUPER / 32; c++) {
#pragma GCC unroll 2
      for (int h = 0; h < 2; h++) {
        sdot_16k(acc, rw, k0 + 32 * c + 16 * h, wp);
        wp += 64;
        if (!G16 && h == 0) continue;
        const int32x4_t sd = vld1q_s32(pk->s[j0 + (G16 ? 2 * c + h : c)]);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) isum[r] = vmlaq_s32(isum[r], acc[r], sd);
      }
    }
    float32x4_t msum[PREFILL_MR]; /* first: isum, msum, then t live (no spills) */
    if (OFF) {
#pragma GCC unroll 8
      for (int r = 0; r < MR; r++) msum[r] = vdupq_n_f32(0.0f);
#pragma GCC unroll 1
      for (int j = 0; j < NG; j++) {
        const float32x4_t m = vld1q_f32(pk->o[j0 + j]);
        const float32x4_t gs[2] = {vld1q_f32(rw->b[j0 + j]), vld1q_f32(rw->b[j0 + j] + 4)};
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) msum[r] = vfmaq_laneq_f32(msum[r], m, gs[r / 4], r % 4);
      }
    }
    const float32x4_t sx[2] = {vld1q_f32(rw->sx[k0 / 32]), vld1q_f32(rw->sx[k0 / 32] + 4)};
    const float32x4_t D = vld1q_f32(pk->D[sb]), O = vld1q_f32(pk->O[sb]);
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
      const float32x4_t av = vmulq_laneq_f32(vcvtq_f32_s32(isum[r]), sx[r / 4], r % 4);
      float32x4_t t = vfmaq_f32(vld1q_f32(tp + NR * r), D, av);
      if (OFF) t = vfmaq_f32(t, O, vmulq_laneq_f32(msum[r], sx[r / 4], r % 4));
      vst1q_f32(tp + NR * r, t);
    }
  }
  float32x4_t t[PREFILL_MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++) t[r] = vld1q_f32(tp + NR * r);
  t_store(MR, t, tl->y, tl->ldy, tl->bias, tl->mv, tl->nv);
}

#define SDOT_TILE(OFF) \
  DOT_NOINLINE void sdot_tile_##OFF(const armllm_ga_tile *t) { sdot_tile(OFF, t); }
#define SDOT_SUPER_TILE(G16, OFF)                                          \
  DOT_NOINLINE void sdot_super_tile_##G16##OFF(const armllm_ga_tile *t) { \
    sdot_super_tile(G16, OFF, t);                                         \
  }
SDOT_TILE(0) SDOT_TILE(1)
SDOT_SUPER_TILE(0, 0) SDOT_SUPER_TILE(0, 1) SDOT_SUPER_TILE(1, 0) SDOT_SUPER_TILE(1, 1)

#define UNPACK_N4K4_FN(T) unpack_n4k4_##T,
static const armllm_ga_prefill sdot_prefill = {
    {{{sdot_tile_0, sdot_tile_1}, {NULL, NULL}},
     {{sdot_super_tile_00, sdot_super_tile_01}, {sdot_super_tile_10, sdot_super_tile_11}}},
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
  const armllm_ga_args a = {.xq = xq, .m = m, .k = k, .ldq = ldq, .scale = scale, .ldsc = ldsc,
                            .gsum = gsum, .ldgs = ldgs, .bias = bias, .y = y, .ldy = ldy};
  /* Armv8.0: every M through the SMULL decode kernels, 4 rows at a time */
  armllm_ga_gemm(pool, &a, packed_w, 0, n, armllm_neon_gguf_decode(dot),
                 dot ? &sdot_prefill : NULL);
}

void armllm_neon_gemm_gguf_cols(const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                                const float *scale, int64_t ldsc, const int32_t *gsum,
                                int64_t ldgs, const void *packed_w, int64_t n, int64_t n0,
                                int64_t n1, const float *bias, float *y, int64_t ldy) {
  (void)n;
  const int dot = armllm_neon_sdot();
  const armllm_ga_args a = {.xq = xq, .m = m, .k = k, .ldq = ldq, .scale = scale, .ldsc = ldsc,
                            .gsum = gsum, .ldgs = ldgs, .bias = bias, .y = y, .ldy = ldy};
  armllm_ga_gemm(NULL, &a, packed_w, n0, n1, armllm_neon_gguf_decode(dot),
                 dot ? &sdot_prefill : NULL);
}
