/* neon/quant.c: int8 activation quantization (per token and group) and the quantized
 * GEMM (int8 or uint4 weights, int8 activations) on Armv8 NEON, with SDOT
 * when the CPU has dotprod.
 *
 * quant_act: FMAX/FMAXV for each group's max |x| (NaN propagates, as in ref),
 *   FDIV (x / s correctly rounded, as ref), FCVTNS (round to nearest even,
 *   what nearbyintf does in the default rounding mode), saturating narrows
 *   and a max with -127: the same bytes as ref.
 *
 * Packed layout "sdot_n8k4": W is cut into panels of 8 output rows (the
 *   last zero-padded: q = 0, d = o = 0) and K (padded to kpad, a multiple
 *   of 32) into blocks of 32. A group is G/32 blocks (G = group, or 128
 *   for channelwise weights, whose row scale is repeated per group; the
 *   last group may be shorter). Panel p is one byte stream:
 *   for each group, its blocks, then d[8] (f32, rows 8p..8p+7), then for 4
 *   bits o[8]. A block is 8 chunks c of 4 k, and a chunk two SDOT operands
 *   (h = 0, 1) of 4 rows x 4 k:
 *     8 bits: W[8p + 4h + j, 32b + 4c + i] at byte 32c + 16h + 4j + i;
 *     4 bits: byte 16c + 4j + i holds W[8p + j, ...] in its low nibble and
 *             W[8p + 4 + j, ...] in its high nibble (one load, AND + USHR,
 *             gives both operands of a chunk).
 *   A panel takes nblk*BB + ng*SB bytes (BB = 256 / 128, SB = 32 / 64 for
 *   8 / 4 bits), so the d and o of a group follow its weights in memory.
 *
 * GEMM: the int32 sums of a group are exact, so only the float epilogue
 *   could differ; it is the ABI's: a = (float)acc * sx; t = fma(d, a, t)
 *   (+ fma(o, (float)gsum * sx, t)), y = t (+ bias), per output, in group
 *   order, from +0. Every path
 *   and thread count therefore gives ref's bits.
 *   With dotprod, SDOT by lane: acc[r][h] (4 output columns of row r) +=
 *   W chunk (4 rows x 4 k) . x[r, 4 k], broadcast from a 16-byte x vector.
 *   The SDOT code is compiled with a target attribute and only called when
 *   HWCAP says asimddp, so an Armv8.0 core (Cortex-A72) never executes it;
 *   there the same layout goes through SMULL/SMLAL (two chunks summed in
 *   int16: |sum| <= 2*127*128 < 2^15, activations being in [-127, 127])
 *   and SADALP into int32.
 *   Tiles: prefill 8 rows x 1 panel (16 accumulators, 128 SDOT per 32 k,
 *   the block in inline assembly; a variant for group 32 without the block
 *   loop); decode (M <= 4) M rows x 2-4 panels; x rows are read in place
 *   (no packing). t lives in y (or an edge tile), row-major like the
 *   accumulators; grouped K is cut into blocks of 1024 k (whole groups)
 *   whose activation scales and gsum * sx are gathered once per M tile on
 *   the stack.
 *   Grouped sums start biased so that int -> float is one FSUB (below).
 */
#include <arm_neon.h>
#include <math.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"
#include "../cpu.h"
#include "../gemm_plan.h"
#include "../quant_arm.h"

#define NR ARMLLM_QA_NR
#define BLK ARMLLM_QA_BLK
#define KC_BLOCKS ARMLLM_QA_KC_BLOCKS
#define CP_MAX 16          /* panels per prefill N chunk */
#define DECODE_MAX_M 4
#define MIN_CHUNK_MACS (1 << 17)

#define ALWAYS_INLINE static inline __attribute__((always_inline))
/* The SDOT code: GCC's arm_neon.h defines vdotq_* for arch=armv8.2-a+dotprod
 * ("+dotprod" alone mismatches); dotprod exists only from Armv8.2 anyway. */
#define DOT_TARGET target("arch=armv8.2-a+dotprod")
#define DOT_FN static inline __attribute__((always_inline, DOT_TARGET))
#define DOT_NOINLINE static __attribute__((noinline, DOT_TARGET))

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ------------------------------------------------------ activations */

/* The sum of a group's stored bytes (k1 - k0 a multiple of 16). */
static int32_t group_sum(const int8_t *qr, int64_t k0, int64_t k1) {
  int32x4_t acc = vdupq_n_s32(0);
  for (int64_t j = k0; j < k1; j += 16) acc = vpadalq_s16(acc, vpaddlq_s8(vld1q_s8(qr + j)));
  return vaddvq_s32(acc);
}

/* One group [k0, k1) of a row, its real columns [k0, kx): scale s, the
 * bytes (padding 0) and their sum. */
static void quant_group(const float *xr, int64_t k0, int64_t kx, int64_t k1, int8_t *qr,
                        float *scale, int32_t *gs) {
  float32x4_t m0 = vdupq_n_f32(0.0f), m1 = m0;
  int64_t i = k0;
  for (; i + 8 <= kx; i += 8) { /* FMAX: a NaN stays */
    m0 = vmaxq_f32(m0, vabsq_f32(vld1q_f32(xr + i)));
    m1 = vmaxq_f32(m1, vabsq_f32(vld1q_f32(xr + i + 4)));
  }
  float amax = vmaxvq_f32(vmaxq_f32(m0, m1));
  for (; i < kx; i++) {
    const float a = fabsf(xr[i]);
    amax = (a > amax || a != a) ? a : amax;
  }
  const float s = amax / 127.0f;
  *scale = s;
  if (s == 0.0f) {
    memset(qr + k0, 0, (size_t)(k1 - k0));
    if (gs) *gs = 0;
    return;
  }
  const float32x4_t sv = vdupq_n_f32(s);
  const int8x16_t lo = vdupq_n_s8(-127);
  for (i = k0; i + 16 <= kx; i += 16) {
    int32x4_t a = vcvtnq_s32_f32(vdivq_f32(vld1q_f32(xr + i), sv));
    int32x4_t b = vcvtnq_s32_f32(vdivq_f32(vld1q_f32(xr + i + 4), sv));
    int32x4_t c = vcvtnq_s32_f32(vdivq_f32(vld1q_f32(xr + i + 8), sv));
    int32x4_t d = vcvtnq_s32_f32(vdivq_f32(vld1q_f32(xr + i + 12), sv));
    int16x8_t ab = vcombine_s16(vqmovn_s32(a), vqmovn_s32(b));
    int16x8_t cd = vcombine_s16(vqmovn_s32(c), vqmovn_s32(d));
    vst1q_s8(qr + i, vmaxq_s8(vcombine_s8(vqmovn_s16(ab), vqmovn_s16(cd)), lo));
  }
  for (; i < kx; i++) {
    float v = nearbyintf(xr[i] / s);
    v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
    qr[i] = (int8_t)(v == v ? v : 0.0f);
  }
  memset(qr + kx, 0, (size_t)(k1 - kx));
  if (gs) *gs = group_sum(qr, k0, k1); /* k1 - k0 is a multiple of 32 */
}

/* One asymmetric group: lo = min(0, min x), hi = max(0, max x) (FMIN/FMAX
 * keep a NaN; then ref's scalar walk gives the same NaN bits), s = (hi - lo)
 * / 254, z = round(-127 - lo / s), xq = clamp(round(x / s) + z, -127, 127). */
static void quant_group_asym(const float *xr, int64_t k0, int64_t kx, int64_t k1, int8_t *qr,
                             float *scale, int32_t *zp, int32_t *gs) {
  float32x4_t mn = vdupq_n_f32(0.0f), mx = mn;
  int64_t i = k0;
  for (; i + 4 <= kx; i += 4) {
    const float32x4_t v = vld1q_f32(xr + i);
    mn = vminq_f32(mn, v);
    mx = vmaxq_f32(mx, v);
  }
  float lo = vminvq_f32(mn), hi = vmaxvq_f32(mx);
  for (; i < kx; i++) {
    hi = (xr[i] > hi || xr[i] != xr[i]) ? xr[i] : hi;
    lo = (xr[i] < lo || xr[i] != xr[i]) ? xr[i] : lo;
  }
  if (lo != lo || hi != hi) { /* ref's order of NaNs */
    lo = hi = 0.0f;
    for (i = k0; i < kx; i++) {
      hi = (xr[i] > hi || xr[i] != xr[i]) ? xr[i] : hi;
      lo = (xr[i] < lo || xr[i] != xr[i]) ? xr[i] : lo;
    }
  }
  const float s = (hi - lo) / 254.0f;
  *scale = s;
  *zp = 0;
  if (gs) *gs = 0;
  if (s == 0.0f || !isfinite(s)) {
    memset(qr + k0, 0, (size_t)(k1 - k0));
    return;
  }
  const int32_t z = (int32_t)nearbyintf(-127.0f - lo / s);
  *zp = z;
  const float32x4_t sv = vdupq_n_f32(s);
  const int32x4_t zv = vdupq_n_s32(z);
  const int8x16_t lo127 = vdupq_n_s8(-127);
  for (i = k0; i + 16 <= kx; i += 16) {
    int32x4_t a = vaddq_s32(vcvtnq_s32_f32(vdivq_f32(vld1q_f32(xr + i), sv)), zv);
    int32x4_t b = vaddq_s32(vcvtnq_s32_f32(vdivq_f32(vld1q_f32(xr + i + 4), sv)), zv);
    int32x4_t c = vaddq_s32(vcvtnq_s32_f32(vdivq_f32(vld1q_f32(xr + i + 8), sv)), zv);
    int32x4_t d = vaddq_s32(vcvtnq_s32_f32(vdivq_f32(vld1q_f32(xr + i + 12), sv)), zv);
    int16x8_t ab = vcombine_s16(vqmovn_s32(a), vqmovn_s32(b));
    int16x8_t cd = vcombine_s16(vqmovn_s32(c), vqmovn_s32(d));
    vst1q_s8(qr + i, vmaxq_s8(vcombine_s8(vqmovn_s16(ab), vqmovn_s16(cd)), lo127));
  }
  for (; i < kx; i++) {
    int32_t v = (int32_t)nearbyintf(xr[i] / s) + z; /* |x / s| <= 254 */
    qr[i] = (int8_t)(v > 127 ? 127 : (v < -127 ? -127 : v));
  }
  memset(qr + kx, 0, (size_t)(k1 - kx));
  if (gs) *gs = group_sum(qr, k0, k1);
}

typedef armllm_quant_job quant_job;

static void quant_rows(void *ctx, int64_t r0, int64_t r1) {
  const quant_job *j = ctx;
  for (int64_t r = r0; r < r1; r++) {
    const float *xr = j->x + r * j->ldx;
    int8_t *qr = j->xq + r * j->ldq;
    for (int64_t g = 0; g < j->ng; g++) {
      const int64_t k0 = g * j->gl, k1 = min64(k0 + j->gl, j->kpad);
      if (j->zp) {
        quant_group_asym(xr, k0, min64(k1, j->k), k1, qr, j->scale + r * j->ldsc + g,
                         j->zp + r * j->ldzp + g, j->gsum ? j->gsum + r * j->ldgs + g : NULL);
        continue;
      }
      quant_group(xr, k0, min64(k1, j->k), k1, qr, j->scale + r * j->ldsc + g,
                  j->gsum ? j->gsum + r * j->ldgs + g : NULL);
    }
  }
}

void armllm_neon_quant_act(armllm_pool *pool, const float *x, int64_t m, int64_t k, int64_t ldx,
                           int64_t group, int8_t *xq, int64_t ldq, float *scale, int64_t ldsc,
                           int32_t *gsum, int64_t ldgs, int32_t *zp, int64_t ldzp) {
  const int64_t kpad = armllm_q_kpad(k);
  quant_job job = {x,  k,   ldx,   kpad, armllm_q_group_len(group), armllm_q_groups(k, group),
                   xq, ldq, scale, ldsc, gsum, ldgs, zp, ldzp};
  armllm_pool_run(pool, m, armllm_pool_grain(pool, m, 4, 1 + 16384 / kpad), quant_rows, &job);
}

/* ----------------------------------------------------------- packing */

size_t armllm_neon_gemm_wq_packed_len(int64_t n, int64_t k, int bits, int64_t group,
                                      const float *d, const float *o) {
  (void)d, (void)o; /* f32 scales whatever their values */
  return armllm_qa_packed_len(n, k, bits, group);
}

void armllm_neon_gemm_wq_pack(const int8_t *q, int64_t n, int64_t k, int bits, int64_t group,
                              const float *d, const float *o, void *packed) {
  const wq_geom G = geom_of(k, bits, group);
  const int64_t ngin = group ? G.ng : 1; /* d, o given per row when channelwise */
  uint8_t *dst = packed;
  for (int64_t p = 0; p < (n + NR - 1) / NR; p++)
    for (int64_t g = 0; g < G.ng; g++) {
      const int64_t b1 = min64((g + 1) * G.bpg, G.nblk);
      for (int64_t b = g * G.bpg; b < b1; b++, dst += G.bb)
        for (int c = 0; c < 8; c++)
          for (int j = 0; j < 4; j++)
            for (int i = 0; i < 4; i++) {
              const int64_t kk = b * BLK + 4 * c + i;
              uint8_t v[2];
              for (int h = 0; h < 2; h++) {
                const int64_t row = p * NR + 4 * h + j;
                v[h] = row < n && kk < k ? (uint8_t)q[row * k + kk] : 0;
              }
              if (bits == 4) {
                dst[16 * c + 4 * j + i] = (uint8_t)((v[0] & 15) | (v[1] & 15) << 4);
              } else {
                dst[32 * c + 4 * j + i] = v[0];
                dst[32 * c + 16 + 4 * j + i] = v[1];
              }
            }
      dst = qa_pack_scales(dst, d, o, n, p, g, group, ngin, G.sb);
    }
}

/* ------------------------------------------------------ micro-kernels */

/* One tile: rows x[r] (repeating the last valid row past it), panels w[p]
 * (repeating likewise), both at the first block of this K block; nb blocks
 * in groups of bpg. y holds t between groups (row-major, ldy). */
typedef struct {
  const int8_t *x[8];
  const uint8_t *w[4];
  int64_t nb, bpg;
  const float *gsx; /* [group of the K block][8 rows]: the activation scales sx */
  const float *gsb; /* [group of the K block][8 rows]: (float)gsum * sx (4 bits) */
  float *y;
  int64_t ldy;
  const float *bias; /* this tile's columns, or NULL; used in the last K block */
  int first, last;
} tile_args;

/* Group sums of grouped weights start at the bits of 1.5 * 2^23 (ACC_BIAS):
 * a sum s with |s| < 2^22 (any group of <= 128 k: |s| <= 128^3 = 2^21) then
 * reads as the float 1.5 * 2^23 + s exactly, and (float)s is that minus
 * 1.5 * 2^23: one FSUB on either vector pipe instead of SCVTF (two uops on
 * V0 of Neoverse N2/V2). The starting values are loaded from memory (load
 * pipes), not materialized with MOVs. Channelwise weights are groups of 128
 * too. (The Armv8.0 SMULL path sums from 0 and uses SCVTF.) */
#define ACC_BIAS 0x4B400000
#define ACC_BIAS_F 12582912.0f
#define B4_ ACC_BIAS, ACC_BIAS, ACC_BIAS, ACC_BIAS
#define B16_ B4_, B4_, B4_, B4_
static const int32_t acc_bias[64] __attribute__((aligned(64))) = {B16_, B16_, B16_, B16_};
#undef B4_
#undef B16_

ALWAYS_INLINE float32x4_t acc_to_f32(const int BIASED, int32x4_t acc) {
  return BIASED ? vsubq_f32(vreinterpretq_f32_s32(acc), vdupq_n_f32(ACC_BIAS_F))
                : vcvtq_f32_s32(acc);
}

/* The ABI's float epilogue of one group for the row-major accumulators
 * acc[r][2p + h] (columns 8p + 4h .. + 3 of row r) onto t in y: a =
 * (float)acc * sx[r]; t = fma(d, a, t) (+ fma(o, b[r], t), b = (float)gsum *
 * sx precomputed per row and group: the same rounding). ws[p]: the group's
 * d (and o) in panel p's stream. */
ALWAYS_INLINE void group_epilogue(const int MR, const int NP, const int B4, const int BIASED,
                                  int32x4_t acc[8][8], const uint8_t *const *ws,
                                  const tile_args a, int64_t gi) {
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
      const float32x4_t av = vmulq_n_f32(acc_to_f32(BIASED, acc[r][v]), a.gsx[gi * 8 + r]);
      float32x4_t t = vfmaq_f32(vld1q_f32(ty), dv[v], av);
      if (B4) t = vfmaq_n_f32(t, ov[v], a.gsb[gi * 8 + r]);
      vst1q_f32(ty, t);
    }
}

/* t = +0 in y before the first group (first K block) */
ALWAYS_INLINE void tile_zero(const int MR, const int NP, const tile_args a) {
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++)
#pragma GCC unroll 8
    for (int v = 0; v < 2 * NP; v++) vst1q_f32(a.y + r * a.ldy + 4 * v, vdupq_n_f32(0.0f));
}

/* y = t + bias after the last group (last K block) */
ALWAYS_INLINE void tile_final(const int MR, const int NP, const tile_args a) {
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

/* One 32-k block of the 8-row x 1-panel SDOT tile in assembly (two
 * statements, one per operand half h, as GCC takes at most 30 operands):
 * from intrinsics GCC 12 copies or spills accumulators. x[r]: row r at the
 * block; acc[r][h]. */
DOT_FN void dot8_block_asm(int32x4_t acc[8][8], const int8_t *const x[8], const uint8_t *wb) {
  __asm__(
      "ldr q0, [%[x0], #0]\n\t"
      "ldr q1, [%[x1], #0]\n\t"
      "ldr q2, [%[x2], #0]\n\t"
      "ldr q3, [%[x3], #0]\n\t"
      "ldr q4, [%[x4], #0]\n\t"
      "ldr q5, [%[x5], #0]\n\t"
      "ldr q6, [%[x6], #0]\n\t"
      "ldr q7, [%[x7], #0]\n\t"
      "ldr q8, [%[wb], #0]\n\t"
      "sdot %[c0].4s, v8.16b, v0.4b[0]\n\t"
      "sdot %[c1].4s, v8.16b, v1.4b[0]\n\t"
      "sdot %[c2].4s, v8.16b, v2.4b[0]\n\t"
      "sdot %[c3].4s, v8.16b, v3.4b[0]\n\t"
      "sdot %[c4].4s, v8.16b, v4.4b[0]\n\t"
      "sdot %[c5].4s, v8.16b, v5.4b[0]\n\t"
      "sdot %[c6].4s, v8.16b, v6.4b[0]\n\t"
      "sdot %[c7].4s, v8.16b, v7.4b[0]\n\t"
      "ldr q10, [%[wb], #32]\n\t"
      "sdot %[c0].4s, v10.16b, v0.4b[1]\n\t"
      "sdot %[c1].4s, v10.16b, v1.4b[1]\n\t"
      "sdot %[c2].4s, v10.16b, v2.4b[1]\n\t"
      "sdot %[c3].4s, v10.16b, v3.4b[1]\n\t"
      "sdot %[c4].4s, v10.16b, v4.4b[1]\n\t"
      "sdot %[c5].4s, v10.16b, v5.4b[1]\n\t"
      "sdot %[c6].4s, v10.16b, v6.4b[1]\n\t"
      "sdot %[c7].4s, v10.16b, v7.4b[1]\n\t"
      "ldr q8, [%[wb], #64]\n\t"
      "sdot %[c0].4s, v8.16b, v0.4b[2]\n\t"
      "sdot %[c1].4s, v8.16b, v1.4b[2]\n\t"
      "sdot %[c2].4s, v8.16b, v2.4b[2]\n\t"
      "sdot %[c3].4s, v8.16b, v3.4b[2]\n\t"
      "sdot %[c4].4s, v8.16b, v4.4b[2]\n\t"
      "sdot %[c5].4s, v8.16b, v5.4b[2]\n\t"
      "sdot %[c6].4s, v8.16b, v6.4b[2]\n\t"
      "sdot %[c7].4s, v8.16b, v7.4b[2]\n\t"
      "ldr q10, [%[wb], #96]\n\t"
      "sdot %[c0].4s, v10.16b, v0.4b[3]\n\t"
      "sdot %[c1].4s, v10.16b, v1.4b[3]\n\t"
      "sdot %[c2].4s, v10.16b, v2.4b[3]\n\t"
      "sdot %[c3].4s, v10.16b, v3.4b[3]\n\t"
      "sdot %[c4].4s, v10.16b, v4.4b[3]\n\t"
      "sdot %[c5].4s, v10.16b, v5.4b[3]\n\t"
      "sdot %[c6].4s, v10.16b, v6.4b[3]\n\t"
      "sdot %[c7].4s, v10.16b, v7.4b[3]\n\t"
      "ldr q0, [%[x0], #16]\n\t"
      "ldr q1, [%[x1], #16]\n\t"
      "ldr q2, [%[x2], #16]\n\t"
      "ldr q3, [%[x3], #16]\n\t"
      "ldr q4, [%[x4], #16]\n\t"
      "ldr q5, [%[x5], #16]\n\t"
      "ldr q6, [%[x6], #16]\n\t"
      "ldr q7, [%[x7], #16]\n\t"
      "ldr q8, [%[wb], #128]\n\t"
      "sdot %[c0].4s, v8.16b, v0.4b[0]\n\t"
      "sdot %[c1].4s, v8.16b, v1.4b[0]\n\t"
      "sdot %[c2].4s, v8.16b, v2.4b[0]\n\t"
      "sdot %[c3].4s, v8.16b, v3.4b[0]\n\t"
      "sdot %[c4].4s, v8.16b, v4.4b[0]\n\t"
      "sdot %[c5].4s, v8.16b, v5.4b[0]\n\t"
      "sdot %[c6].4s, v8.16b, v6.4b[0]\n\t"
      "sdot %[c7].4s, v8.16b, v7.4b[0]\n\t"
      "ldr q10, [%[wb], #160]\n\t"
      "sdot %[c0].4s, v10.16b, v0.4b[1]\n\t"
      "sdot %[c1].4s, v10.16b, v1.4b[1]\n\t"
      "sdot %[c2].4s, v10.16b, v2.4b[1]\n\t"
      "sdot %[c3].4s, v10.16b, v3.4b[1]\n\t"
      "sdot %[c4].4s, v10.16b, v4.4b[1]\n\t"
      "sdot %[c5].4s, v10.16b, v5.4b[1]\n\t"
      "sdot %[c6].4s, v10.16b, v6.4b[1]\n\t"
      "sdot %[c7].4s, v10.16b, v7.4b[1]\n\t"
      "ldr q8, [%[wb], #192]\n\t"
      "sdot %[c0].4s, v8.16b, v0.4b[2]\n\t"
      "sdot %[c1].4s, v8.16b, v1.4b[2]\n\t"
      "sdot %[c2].4s, v8.16b, v2.4b[2]\n\t"
      "sdot %[c3].4s, v8.16b, v3.4b[2]\n\t"
      "sdot %[c4].4s, v8.16b, v4.4b[2]\n\t"
      "sdot %[c5].4s, v8.16b, v5.4b[2]\n\t"
      "sdot %[c6].4s, v8.16b, v6.4b[2]\n\t"
      "sdot %[c7].4s, v8.16b, v7.4b[2]\n\t"
      "ldr q10, [%[wb], #224]\n\t"
      "sdot %[c0].4s, v10.16b, v0.4b[3]\n\t"
      "sdot %[c1].4s, v10.16b, v1.4b[3]\n\t"
      "sdot %[c2].4s, v10.16b, v2.4b[3]\n\t"
      "sdot %[c3].4s, v10.16b, v3.4b[3]\n\t"
      "sdot %[c4].4s, v10.16b, v4.4b[3]\n\t"
      "sdot %[c5].4s, v10.16b, v5.4b[3]\n\t"
      "sdot %[c6].4s, v10.16b, v6.4b[3]\n\t"
      "sdot %[c7].4s, v10.16b, v7.4b[3]\n\t"
      : [c0] "+w"(acc[0][0]), [c1] "+w"(acc[1][0]), [c2] "+w"(acc[2][0]), [c3] "+w"(acc[3][0]), [c4] "+w"(acc[4][0]), [c5] "+w"(acc[5][0]), [c6] "+w"(acc[6][0]), [c7] "+w"(acc[7][0])
      : [x0] "r"(x[0]), [x1] "r"(x[1]), [x2] "r"(x[2]), [x3] "r"(x[3]), [x4] "r"(x[4]), [x5] "r"(x[5]), [x6] "r"(x[6]), [x7] "r"(x[7]), [wb] "r"(wb)
      : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11", "memory");

  __asm__(
      "ldr q0, [%[x0], #0]\n\t"
      "ldr q1, [%[x1], #0]\n\t"
      "ldr q2, [%[x2], #0]\n\t"
      "ldr q3, [%[x3], #0]\n\t"
      "ldr q4, [%[x4], #0]\n\t"
      "ldr q5, [%[x5], #0]\n\t"
      "ldr q6, [%[x6], #0]\n\t"
      "ldr q7, [%[x7], #0]\n\t"
      "ldr q8, [%[wb], #16]\n\t"
      "sdot %[c0].4s, v8.16b, v0.4b[0]\n\t"
      "sdot %[c1].4s, v8.16b, v1.4b[0]\n\t"
      "sdot %[c2].4s, v8.16b, v2.4b[0]\n\t"
      "sdot %[c3].4s, v8.16b, v3.4b[0]\n\t"
      "sdot %[c4].4s, v8.16b, v4.4b[0]\n\t"
      "sdot %[c5].4s, v8.16b, v5.4b[0]\n\t"
      "sdot %[c6].4s, v8.16b, v6.4b[0]\n\t"
      "sdot %[c7].4s, v8.16b, v7.4b[0]\n\t"
      "ldr q10, [%[wb], #48]\n\t"
      "sdot %[c0].4s, v10.16b, v0.4b[1]\n\t"
      "sdot %[c1].4s, v10.16b, v1.4b[1]\n\t"
      "sdot %[c2].4s, v10.16b, v2.4b[1]\n\t"
      "sdot %[c3].4s, v10.16b, v3.4b[1]\n\t"
      "sdot %[c4].4s, v10.16b, v4.4b[1]\n\t"
      "sdot %[c5].4s, v10.16b, v5.4b[1]\n\t"
      "sdot %[c6].4s, v10.16b, v6.4b[1]\n\t"
      "sdot %[c7].4s, v10.16b, v7.4b[1]\n\t"
      "ldr q8, [%[wb], #80]\n\t"
      "sdot %[c0].4s, v8.16b, v0.4b[2]\n\t"
      "sdot %[c1].4s, v8.16b, v1.4b[2]\n\t"
      "sdot %[c2].4s, v8.16b, v2.4b[2]\n\t"
      "sdot %[c3].4s, v8.16b, v3.4b[2]\n\t"
      "sdot %[c4].4s, v8.16b, v4.4b[2]\n\t"
      "sdot %[c5].4s, v8.16b, v5.4b[2]\n\t"
      "sdot %[c6].4s, v8.16b, v6.4b[2]\n\t"
      "sdot %[c7].4s, v8.16b, v7.4b[2]\n\t"
      "ldr q10, [%[wb], #112]\n\t"
      "sdot %[c0].4s, v10.16b, v0.4b[3]\n\t"
      "sdot %[c1].4s, v10.16b, v1.4b[3]\n\t"
      "sdot %[c2].4s, v10.16b, v2.4b[3]\n\t"
      "sdot %[c3].4s, v10.16b, v3.4b[3]\n\t"
      "sdot %[c4].4s, v10.16b, v4.4b[3]\n\t"
      "sdot %[c5].4s, v10.16b, v5.4b[3]\n\t"
      "sdot %[c6].4s, v10.16b, v6.4b[3]\n\t"
      "sdot %[c7].4s, v10.16b, v7.4b[3]\n\t"
      "ldr q0, [%[x0], #16]\n\t"
      "ldr q1, [%[x1], #16]\n\t"
      "ldr q2, [%[x2], #16]\n\t"
      "ldr q3, [%[x3], #16]\n\t"
      "ldr q4, [%[x4], #16]\n\t"
      "ldr q5, [%[x5], #16]\n\t"
      "ldr q6, [%[x6], #16]\n\t"
      "ldr q7, [%[x7], #16]\n\t"
      "ldr q8, [%[wb], #144]\n\t"
      "sdot %[c0].4s, v8.16b, v0.4b[0]\n\t"
      "sdot %[c1].4s, v8.16b, v1.4b[0]\n\t"
      "sdot %[c2].4s, v8.16b, v2.4b[0]\n\t"
      "sdot %[c3].4s, v8.16b, v3.4b[0]\n\t"
      "sdot %[c4].4s, v8.16b, v4.4b[0]\n\t"
      "sdot %[c5].4s, v8.16b, v5.4b[0]\n\t"
      "sdot %[c6].4s, v8.16b, v6.4b[0]\n\t"
      "sdot %[c7].4s, v8.16b, v7.4b[0]\n\t"
      "ldr q10, [%[wb], #176]\n\t"
      "sdot %[c0].4s, v10.16b, v0.4b[1]\n\t"
      "sdot %[c1].4s, v10.16b, v1.4b[1]\n\t"
      "sdot %[c2].4s, v10.16b, v2.4b[1]\n\t"
      "sdot %[c3].4s, v10.16b, v3.4b[1]\n\t"
      "sdot %[c4].4s, v10.16b, v4.4b[1]\n\t"
      "sdot %[c5].4s, v10.16b, v5.4b[1]\n\t"
      "sdot %[c6].4s, v10.16b, v6.4b[1]\n\t"
      "sdot %[c7].4s, v10.16b, v7.4b[1]\n\t"
      "ldr q8, [%[wb], #208]\n\t"
      "sdot %[c0].4s, v8.16b, v0.4b[2]\n\t"
      "sdot %[c1].4s, v8.16b, v1.4b[2]\n\t"
      "sdot %[c2].4s, v8.16b, v2.4b[2]\n\t"
      "sdot %[c3].4s, v8.16b, v3.4b[2]\n\t"
      "sdot %[c4].4s, v8.16b, v4.4b[2]\n\t"
      "sdot %[c5].4s, v8.16b, v5.4b[2]\n\t"
      "sdot %[c6].4s, v8.16b, v6.4b[2]\n\t"
      "sdot %[c7].4s, v8.16b, v7.4b[2]\n\t"
      "ldr q10, [%[wb], #240]\n\t"
      "sdot %[c0].4s, v10.16b, v0.4b[3]\n\t"
      "sdot %[c1].4s, v10.16b, v1.4b[3]\n\t"
      "sdot %[c2].4s, v10.16b, v2.4b[3]\n\t"
      "sdot %[c3].4s, v10.16b, v3.4b[3]\n\t"
      "sdot %[c4].4s, v10.16b, v4.4b[3]\n\t"
      "sdot %[c5].4s, v10.16b, v5.4b[3]\n\t"
      "sdot %[c6].4s, v10.16b, v6.4b[3]\n\t"
      "sdot %[c7].4s, v10.16b, v7.4b[3]\n\t"
      : [c0] "+w"(acc[0][1]), [c1] "+w"(acc[1][1]), [c2] "+w"(acc[2][1]), [c3] "+w"(acc[3][1]), [c4] "+w"(acc[4][1]), [c5] "+w"(acc[5][1]), [c6] "+w"(acc[6][1]), [c7] "+w"(acc[7][1])
      : [x0] "r"(x[0]), [x1] "r"(x[1]), [x2] "r"(x[2]), [x3] "r"(x[3]), [x4] "r"(x[4]), [x5] "r"(x[5]), [x6] "r"(x[6]), [x7] "r"(x[7]), [wb] "r"(wb)
      : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11", "memory");

}

DOT_FN void dot4_block_asm(int32x4_t acc[8][8], const int8_t *const x[8], const uint8_t *wb,
                           uint8x16_t m15) {
  __asm__(
      "ldr q0, [%[x0], #0]\n\t"
      "ldr q1, [%[x1], #0]\n\t"
      "ldr q2, [%[x2], #0]\n\t"
      "ldr q3, [%[x3], #0]\n\t"
      "ldr q4, [%[x4], #0]\n\t"
      "ldr q5, [%[x5], #0]\n\t"
      "ldr q6, [%[x6], #0]\n\t"
      "ldr q7, [%[x7], #0]\n\t"
      "ldr q8, [%[wb], #0]\n\t"
      "and v9.16b, v8.16b, %[m15].16b\n\t"
      "sdot %[c0].4s, v9.16b, v0.4b[0]\n\t"
      "sdot %[c1].4s, v9.16b, v1.4b[0]\n\t"
      "sdot %[c2].4s, v9.16b, v2.4b[0]\n\t"
      "sdot %[c3].4s, v9.16b, v3.4b[0]\n\t"
      "sdot %[c4].4s, v9.16b, v4.4b[0]\n\t"
      "sdot %[c5].4s, v9.16b, v5.4b[0]\n\t"
      "sdot %[c6].4s, v9.16b, v6.4b[0]\n\t"
      "sdot %[c7].4s, v9.16b, v7.4b[0]\n\t"
      "ldr q10, [%[wb], #16]\n\t"
      "and v11.16b, v10.16b, %[m15].16b\n\t"
      "sdot %[c0].4s, v11.16b, v0.4b[1]\n\t"
      "sdot %[c1].4s, v11.16b, v1.4b[1]\n\t"
      "sdot %[c2].4s, v11.16b, v2.4b[1]\n\t"
      "sdot %[c3].4s, v11.16b, v3.4b[1]\n\t"
      "sdot %[c4].4s, v11.16b, v4.4b[1]\n\t"
      "sdot %[c5].4s, v11.16b, v5.4b[1]\n\t"
      "sdot %[c6].4s, v11.16b, v6.4b[1]\n\t"
      "sdot %[c7].4s, v11.16b, v7.4b[1]\n\t"
      "ldr q8, [%[wb], #32]\n\t"
      "and v9.16b, v8.16b, %[m15].16b\n\t"
      "sdot %[c0].4s, v9.16b, v0.4b[2]\n\t"
      "sdot %[c1].4s, v9.16b, v1.4b[2]\n\t"
      "sdot %[c2].4s, v9.16b, v2.4b[2]\n\t"
      "sdot %[c3].4s, v9.16b, v3.4b[2]\n\t"
      "sdot %[c4].4s, v9.16b, v4.4b[2]\n\t"
      "sdot %[c5].4s, v9.16b, v5.4b[2]\n\t"
      "sdot %[c6].4s, v9.16b, v6.4b[2]\n\t"
      "sdot %[c7].4s, v9.16b, v7.4b[2]\n\t"
      "ldr q10, [%[wb], #48]\n\t"
      "and v11.16b, v10.16b, %[m15].16b\n\t"
      "sdot %[c0].4s, v11.16b, v0.4b[3]\n\t"
      "sdot %[c1].4s, v11.16b, v1.4b[3]\n\t"
      "sdot %[c2].4s, v11.16b, v2.4b[3]\n\t"
      "sdot %[c3].4s, v11.16b, v3.4b[3]\n\t"
      "sdot %[c4].4s, v11.16b, v4.4b[3]\n\t"
      "sdot %[c5].4s, v11.16b, v5.4b[3]\n\t"
      "sdot %[c6].4s, v11.16b, v6.4b[3]\n\t"
      "sdot %[c7].4s, v11.16b, v7.4b[3]\n\t"
      "ldr q0, [%[x0], #16]\n\t"
      "ldr q1, [%[x1], #16]\n\t"
      "ldr q2, [%[x2], #16]\n\t"
      "ldr q3, [%[x3], #16]\n\t"
      "ldr q4, [%[x4], #16]\n\t"
      "ldr q5, [%[x5], #16]\n\t"
      "ldr q6, [%[x6], #16]\n\t"
      "ldr q7, [%[x7], #16]\n\t"
      "ldr q8, [%[wb], #64]\n\t"
      "and v9.16b, v8.16b, %[m15].16b\n\t"
      "sdot %[c0].4s, v9.16b, v0.4b[0]\n\t"
      "sdot %[c1].4s, v9.16b, v1.4b[0]\n\t"
      "sdot %[c2].4s, v9.16b, v2.4b[0]\n\t"
      "sdot %[c3].4s, v9.16b, v3.4b[0]\n\t"
      "sdot %[c4].4s, v9.16b, v4.4b[0]\n\t"
      "sdot %[c5].4s, v9.16b, v5.4b[0]\n\t"
      "sdot %[c6].4s, v9.16b, v6.4b[0]\n\t"
      "sdot %[c7].4s, v9.16b, v7.4b[0]\n\t"
      "ldr q10, [%[wb], #80]\n\t"
      "and v11.16b, v10.16b, %[m15].16b\n\t"
      "sdot %[c0].4s, v11.16b, v0.4b[1]\n\t"
      "sdot %[c1].4s, v11.16b, v1.4b[1]\n\t"
      "sdot %[c2].4s, v11.16b, v2.4b[1]\n\t"
      "sdot %[c3].4s, v11.16b, v3.4b[1]\n\t"
      "sdot %[c4].4s, v11.16b, v4.4b[1]\n\t"
      "sdot %[c5].4s, v11.16b, v5.4b[1]\n\t"
      "sdot %[c6].4s, v11.16b, v6.4b[1]\n\t"
      "sdot %[c7].4s, v11.16b, v7.4b[1]\n\t"
      "ldr q8, [%[wb], #96]\n\t"
      "and v9.16b, v8.16b, %[m15].16b\n\t"
      "sdot %[c0].4s, v9.16b, v0.4b[2]\n\t"
      "sdot %[c1].4s, v9.16b, v1.4b[2]\n\t"
      "sdot %[c2].4s, v9.16b, v2.4b[2]\n\t"
      "sdot %[c3].4s, v9.16b, v3.4b[2]\n\t"
      "sdot %[c4].4s, v9.16b, v4.4b[2]\n\t"
      "sdot %[c5].4s, v9.16b, v5.4b[2]\n\t"
      "sdot %[c6].4s, v9.16b, v6.4b[2]\n\t"
      "sdot %[c7].4s, v9.16b, v7.4b[2]\n\t"
      "ldr q10, [%[wb], #112]\n\t"
      "and v11.16b, v10.16b, %[m15].16b\n\t"
      "sdot %[c0].4s, v11.16b, v0.4b[3]\n\t"
      "sdot %[c1].4s, v11.16b, v1.4b[3]\n\t"
      "sdot %[c2].4s, v11.16b, v2.4b[3]\n\t"
      "sdot %[c3].4s, v11.16b, v3.4b[3]\n\t"
      "sdot %[c4].4s, v11.16b, v4.4b[3]\n\t"
      "sdot %[c5].4s, v11.16b, v5.4b[3]\n\t"
      "sdot %[c6].4s, v11.16b, v6.4b[3]\n\t"
      "sdot %[c7].4s, v11.16b, v7.4b[3]\n\t"
      : [c0] "+w"(acc[0][0]), [c1] "+w"(acc[1][0]), [c2] "+w"(acc[2][0]), [c3] "+w"(acc[3][0]), [c4] "+w"(acc[4][0]), [c5] "+w"(acc[5][0]), [c6] "+w"(acc[6][0]), [c7] "+w"(acc[7][0])
      : [x0] "r"(x[0]), [x1] "r"(x[1]), [x2] "r"(x[2]), [x3] "r"(x[3]), [x4] "r"(x[4]), [x5] "r"(x[5]), [x6] "r"(x[6]), [x7] "r"(x[7]), [wb] "r"(wb), [m15] "w"(m15)
      : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11", "memory");

  __asm__(
      "ldr q0, [%[x0], #0]\n\t"
      "ldr q1, [%[x1], #0]\n\t"
      "ldr q2, [%[x2], #0]\n\t"
      "ldr q3, [%[x3], #0]\n\t"
      "ldr q4, [%[x4], #0]\n\t"
      "ldr q5, [%[x5], #0]\n\t"
      "ldr q6, [%[x6], #0]\n\t"
      "ldr q7, [%[x7], #0]\n\t"
      "ldr q8, [%[wb], #0]\n\t"
      "ushr v9.16b, v8.16b, #4\n\t"
      "sdot %[c0].4s, v9.16b, v0.4b[0]\n\t"
      "sdot %[c1].4s, v9.16b, v1.4b[0]\n\t"
      "sdot %[c2].4s, v9.16b, v2.4b[0]\n\t"
      "sdot %[c3].4s, v9.16b, v3.4b[0]\n\t"
      "sdot %[c4].4s, v9.16b, v4.4b[0]\n\t"
      "sdot %[c5].4s, v9.16b, v5.4b[0]\n\t"
      "sdot %[c6].4s, v9.16b, v6.4b[0]\n\t"
      "sdot %[c7].4s, v9.16b, v7.4b[0]\n\t"
      "ldr q10, [%[wb], #16]\n\t"
      "ushr v11.16b, v10.16b, #4\n\t"
      "sdot %[c0].4s, v11.16b, v0.4b[1]\n\t"
      "sdot %[c1].4s, v11.16b, v1.4b[1]\n\t"
      "sdot %[c2].4s, v11.16b, v2.4b[1]\n\t"
      "sdot %[c3].4s, v11.16b, v3.4b[1]\n\t"
      "sdot %[c4].4s, v11.16b, v4.4b[1]\n\t"
      "sdot %[c5].4s, v11.16b, v5.4b[1]\n\t"
      "sdot %[c6].4s, v11.16b, v6.4b[1]\n\t"
      "sdot %[c7].4s, v11.16b, v7.4b[1]\n\t"
      "ldr q8, [%[wb], #32]\n\t"
      "ushr v9.16b, v8.16b, #4\n\t"
      "sdot %[c0].4s, v9.16b, v0.4b[2]\n\t"
      "sdot %[c1].4s, v9.16b, v1.4b[2]\n\t"
      "sdot %[c2].4s, v9.16b, v2.4b[2]\n\t"
      "sdot %[c3].4s, v9.16b, v3.4b[2]\n\t"
      "sdot %[c4].4s, v9.16b, v4.4b[2]\n\t"
      "sdot %[c5].4s, v9.16b, v5.4b[2]\n\t"
      "sdot %[c6].4s, v9.16b, v6.4b[2]\n\t"
      "sdot %[c7].4s, v9.16b, v7.4b[2]\n\t"
      "ldr q10, [%[wb], #48]\n\t"
      "ushr v11.16b, v10.16b, #4\n\t"
      "sdot %[c0].4s, v11.16b, v0.4b[3]\n\t"
      "sdot %[c1].4s, v11.16b, v1.4b[3]\n\t"
      "sdot %[c2].4s, v11.16b, v2.4b[3]\n\t"
      "sdot %[c3].4s, v11.16b, v3.4b[3]\n\t"
      "sdot %[c4].4s, v11.16b, v4.4b[3]\n\t"
      "sdot %[c5].4s, v11.16b, v5.4b[3]\n\t"
      "sdot %[c6].4s, v11.16b, v6.4b[3]\n\t"
      "sdot %[c7].4s, v11.16b, v7.4b[3]\n\t"
      "ldr q0, [%[x0], #16]\n\t"
      "ldr q1, [%[x1], #16]\n\t"
      "ldr q2, [%[x2], #16]\n\t"
      "ldr q3, [%[x3], #16]\n\t"
      "ldr q4, [%[x4], #16]\n\t"
      "ldr q5, [%[x5], #16]\n\t"
      "ldr q6, [%[x6], #16]\n\t"
      "ldr q7, [%[x7], #16]\n\t"
      "ldr q8, [%[wb], #64]\n\t"
      "ushr v9.16b, v8.16b, #4\n\t"
      "sdot %[c0].4s, v9.16b, v0.4b[0]\n\t"
      "sdot %[c1].4s, v9.16b, v1.4b[0]\n\t"
      "sdot %[c2].4s, v9.16b, v2.4b[0]\n\t"
      "sdot %[c3].4s, v9.16b, v3.4b[0]\n\t"
      "sdot %[c4].4s, v9.16b, v4.4b[0]\n\t"
      "sdot %[c5].4s, v9.16b, v5.4b[0]\n\t"
      "sdot %[c6].4s, v9.16b, v6.4b[0]\n\t"
      "sdot %[c7].4s, v9.16b, v7.4b[0]\n\t"
      "ldr q10, [%[wb], #80]\n\t"
      "ushr v11.16b, v10.16b, #4\n\t"
      "sdot %[c0].4s, v11.16b, v0.4b[1]\n\t"
      "sdot %[c1].4s, v11.16b, v1.4b[1]\n\t"
      "sdot %[c2].4s, v11.16b, v2.4b[1]\n\t"
      "sdot %[c3].4s, v11.16b, v3.4b[1]\n\t"
      "sdot %[c4].4s, v11.16b, v4.4b[1]\n\t"
      "sdot %[c5].4s, v11.16b, v5.4b[1]\n\t"
      "sdot %[c6].4s, v11.16b, v6.4b[1]\n\t"
      "sdot %[c7].4s, v11.16b, v7.4b[1]\n\t"
      "ldr q8, [%[wb], #96]\n\t"
      "ushr v9.16b, v8.16b, #4\n\t"
      "sdot %[c0].4s, v9.16b, v0.4b[2]\n\t"
      "sdot %[c1].4s, v9.16b, v1.4b[2]\n\t"
      "sdot %[c2].4s, v9.16b, v2.4b[2]\n\t"
      "sdot %[c3].4s, v9.16b, v3.4b[2]\n\t"
      "sdot %[c4].4s, v9.16b, v4.4b[2]\n\t"
      "sdot %[c5].4s, v9.16b, v5.4b[2]\n\t"
      "sdot %[c6].4s, v9.16b, v6.4b[2]\n\t"
      "sdot %[c7].4s, v9.16b, v7.4b[2]\n\t"
      "ldr q10, [%[wb], #112]\n\t"
      "ushr v11.16b, v10.16b, #4\n\t"
      "sdot %[c0].4s, v11.16b, v0.4b[3]\n\t"
      "sdot %[c1].4s, v11.16b, v1.4b[3]\n\t"
      "sdot %[c2].4s, v11.16b, v2.4b[3]\n\t"
      "sdot %[c3].4s, v11.16b, v3.4b[3]\n\t"
      "sdot %[c4].4s, v11.16b, v4.4b[3]\n\t"
      "sdot %[c5].4s, v11.16b, v5.4b[3]\n\t"
      "sdot %[c6].4s, v11.16b, v6.4b[3]\n\t"
      "sdot %[c7].4s, v11.16b, v7.4b[3]\n\t"
      : [c0] "+w"(acc[0][1]), [c1] "+w"(acc[1][1]), [c2] "+w"(acc[2][1]), [c3] "+w"(acc[3][1]), [c4] "+w"(acc[4][1]), [c5] "+w"(acc[5][1]), [c6] "+w"(acc[6][1]), [c7] "+w"(acc[7][1])
      : [x0] "r"(x[0]), [x1] "r"(x[1]), [x2] "r"(x[2]), [x3] "r"(x[3]), [x4] "r"(x[4]), [x5] "r"(x[5]), [x6] "r"(x[6]), [x7] "r"(x[7]), [wb] "r"(wb), [m15] "w"(m15)
      : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "v10", "v11", "memory");

}

/* The group epilogue of the 8-row x 1-panel tile in assembly (from
 * intrinsics GCC 12 moves an accumulator around the block loop): per row r
 * and half h, a = (acc - 1.5*2^23) * sx[r] (by element), t = fma(d, a, t)
 * (+ fma(o, b[r], t)) on y; sp: the group's d[8] (then o[8]); sx, gb: the
 * rows' sx and b = (float)gsum * sx of the group. */
DOT_FN void dot8_epilogue_asm(int32x4_t acc[8][8], float *y, int64_t ldy, const float *sp,
                              const float *sx, const float *gb, float32x4_t mg) {
  float *yp = y;
  __asm__ volatile(
      "ldp q2, q3, [%[sp]]\n\t"
      "ldp q6, q7, [%[sx]]\n\t"
      "fsub v0.4s, %[c00].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #0]\n\t"
      "fmul v0.4s, v0.4s, v6.s[0]\n\t"
      "fmla v1.4s, v0.4s, v2.4s\n\t"
      "str q1, [%[yp], #0]\n\t"
      "fsub v0.4s, %[c01].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #16]\n\t"
      "fmul v0.4s, v0.4s, v6.s[0]\n\t"
      "fmla v1.4s, v0.4s, v3.4s\n\t"
      "str q1, [%[yp], #16]\n\t"
      "add %[yp], %[yp], %[ld]\n\t"
      "fsub v0.4s, %[c10].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #0]\n\t"
      "fmul v0.4s, v0.4s, v6.s[1]\n\t"
      "fmla v1.4s, v0.4s, v2.4s\n\t"
      "str q1, [%[yp], #0]\n\t"
      "fsub v0.4s, %[c11].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #16]\n\t"
      "fmul v0.4s, v0.4s, v6.s[1]\n\t"
      "fmla v1.4s, v0.4s, v3.4s\n\t"
      "str q1, [%[yp], #16]\n\t"
      "add %[yp], %[yp], %[ld]\n\t"
      "fsub v0.4s, %[c20].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #0]\n\t"
      "fmul v0.4s, v0.4s, v6.s[2]\n\t"
      "fmla v1.4s, v0.4s, v2.4s\n\t"
      "str q1, [%[yp], #0]\n\t"
      "fsub v0.4s, %[c21].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #16]\n\t"
      "fmul v0.4s, v0.4s, v6.s[2]\n\t"
      "fmla v1.4s, v0.4s, v3.4s\n\t"
      "str q1, [%[yp], #16]\n\t"
      "add %[yp], %[yp], %[ld]\n\t"
      "fsub v0.4s, %[c30].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #0]\n\t"
      "fmul v0.4s, v0.4s, v6.s[3]\n\t"
      "fmla v1.4s, v0.4s, v2.4s\n\t"
      "str q1, [%[yp], #0]\n\t"
      "fsub v0.4s, %[c31].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #16]\n\t"
      "fmul v0.4s, v0.4s, v6.s[3]\n\t"
      "fmla v1.4s, v0.4s, v3.4s\n\t"
      "str q1, [%[yp], #16]\n\t"
      "add %[yp], %[yp], %[ld]\n\t"
      "fsub v0.4s, %[c40].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #0]\n\t"
      "fmul v0.4s, v0.4s, v7.s[0]\n\t"
      "fmla v1.4s, v0.4s, v2.4s\n\t"
      "str q1, [%[yp], #0]\n\t"
      "fsub v0.4s, %[c41].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #16]\n\t"
      "fmul v0.4s, v0.4s, v7.s[0]\n\t"
      "fmla v1.4s, v0.4s, v3.4s\n\t"
      "str q1, [%[yp], #16]\n\t"
      "add %[yp], %[yp], %[ld]\n\t"
      "fsub v0.4s, %[c50].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #0]\n\t"
      "fmul v0.4s, v0.4s, v7.s[1]\n\t"
      "fmla v1.4s, v0.4s, v2.4s\n\t"
      "str q1, [%[yp], #0]\n\t"
      "fsub v0.4s, %[c51].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #16]\n\t"
      "fmul v0.4s, v0.4s, v7.s[1]\n\t"
      "fmla v1.4s, v0.4s, v3.4s\n\t"
      "str q1, [%[yp], #16]\n\t"
      "add %[yp], %[yp], %[ld]\n\t"
      "fsub v0.4s, %[c60].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #0]\n\t"
      "fmul v0.4s, v0.4s, v7.s[2]\n\t"
      "fmla v1.4s, v0.4s, v2.4s\n\t"
      "str q1, [%[yp], #0]\n\t"
      "fsub v0.4s, %[c61].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #16]\n\t"
      "fmul v0.4s, v0.4s, v7.s[2]\n\t"
      "fmla v1.4s, v0.4s, v3.4s\n\t"
      "str q1, [%[yp], #16]\n\t"
      "add %[yp], %[yp], %[ld]\n\t"
      "fsub v0.4s, %[c70].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #0]\n\t"
      "fmul v0.4s, v0.4s, v7.s[3]\n\t"
      "fmla v1.4s, v0.4s, v2.4s\n\t"
      "str q1, [%[yp], #0]\n\t"
      "fsub v0.4s, %[c71].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #16]\n\t"
      "fmul v0.4s, v0.4s, v7.s[3]\n\t"
      "fmla v1.4s, v0.4s, v3.4s\n\t"
      "str q1, [%[yp], #16]\n\t"
      : [yp] "+r"(yp)
      : [c00] "w"(acc[0][0]), [c01] "w"(acc[0][1]), [c10] "w"(acc[1][0]), [c11] "w"(acc[1][1]), [c20] "w"(acc[2][0]), [c21] "w"(acc[2][1]), [c30] "w"(acc[3][0]), [c31] "w"(acc[3][1]), [c40] "w"(acc[4][0]), [c41] "w"(acc[4][1]), [c50] "w"(acc[5][0]), [c51] "w"(acc[5][1]), [c60] "w"(acc[6][0]), [c61] "w"(acc[6][1]), [c70] "w"(acc[7][0]), [c71] "w"(acc[7][1]), [ld] "r"(ldy * 4), [sp] "r"(sp), [sx] "r"(sx), [gb] "r"(gb), [mg] "w"(mg)
      : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "memory");
}

DOT_FN void dot4_epilogue_asm(int32x4_t acc[8][8], float *y, int64_t ldy, const float *sp,
                              const float *sx, const float *gb, float32x4_t mg) {
  float *yp = y;
  __asm__ volatile(
      "ldp q2, q3, [%[sp]]\n\t"
      "ldp q4, q5, [%[sp], #32]\n\t"
      "ldp q6, q7, [%[sx]]\n\t"
      "ldp q8, q9, [%[gb]]\n\t"
      "fsub v0.4s, %[c00].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #0]\n\t"
      "fmul v0.4s, v0.4s, v6.s[0]\n\t"
      "fmla v1.4s, v0.4s, v2.4s\n\t"
      "fmla v1.4s, v4.4s, v8.s[0]\n\t"
      "str q1, [%[yp], #0]\n\t"
      "fsub v0.4s, %[c01].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #16]\n\t"
      "fmul v0.4s, v0.4s, v6.s[0]\n\t"
      "fmla v1.4s, v0.4s, v3.4s\n\t"
      "fmla v1.4s, v5.4s, v8.s[0]\n\t"
      "str q1, [%[yp], #16]\n\t"
      "add %[yp], %[yp], %[ld]\n\t"
      "fsub v0.4s, %[c10].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #0]\n\t"
      "fmul v0.4s, v0.4s, v6.s[1]\n\t"
      "fmla v1.4s, v0.4s, v2.4s\n\t"
      "fmla v1.4s, v4.4s, v8.s[1]\n\t"
      "str q1, [%[yp], #0]\n\t"
      "fsub v0.4s, %[c11].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #16]\n\t"
      "fmul v0.4s, v0.4s, v6.s[1]\n\t"
      "fmla v1.4s, v0.4s, v3.4s\n\t"
      "fmla v1.4s, v5.4s, v8.s[1]\n\t"
      "str q1, [%[yp], #16]\n\t"
      "add %[yp], %[yp], %[ld]\n\t"
      "fsub v0.4s, %[c20].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #0]\n\t"
      "fmul v0.4s, v0.4s, v6.s[2]\n\t"
      "fmla v1.4s, v0.4s, v2.4s\n\t"
      "fmla v1.4s, v4.4s, v8.s[2]\n\t"
      "str q1, [%[yp], #0]\n\t"
      "fsub v0.4s, %[c21].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #16]\n\t"
      "fmul v0.4s, v0.4s, v6.s[2]\n\t"
      "fmla v1.4s, v0.4s, v3.4s\n\t"
      "fmla v1.4s, v5.4s, v8.s[2]\n\t"
      "str q1, [%[yp], #16]\n\t"
      "add %[yp], %[yp], %[ld]\n\t"
      "fsub v0.4s, %[c30].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #0]\n\t"
      "fmul v0.4s, v0.4s, v6.s[3]\n\t"
      "fmla v1.4s, v0.4s, v2.4s\n\t"
      "fmla v1.4s, v4.4s, v8.s[3]\n\t"
      "str q1, [%[yp], #0]\n\t"
      "fsub v0.4s, %[c31].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #16]\n\t"
      "fmul v0.4s, v0.4s, v6.s[3]\n\t"
      "fmla v1.4s, v0.4s, v3.4s\n\t"
      "fmla v1.4s, v5.4s, v8.s[3]\n\t"
      "str q1, [%[yp], #16]\n\t"
      "add %[yp], %[yp], %[ld]\n\t"
      "fsub v0.4s, %[c40].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #0]\n\t"
      "fmul v0.4s, v0.4s, v7.s[0]\n\t"
      "fmla v1.4s, v0.4s, v2.4s\n\t"
      "fmla v1.4s, v4.4s, v9.s[0]\n\t"
      "str q1, [%[yp], #0]\n\t"
      "fsub v0.4s, %[c41].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #16]\n\t"
      "fmul v0.4s, v0.4s, v7.s[0]\n\t"
      "fmla v1.4s, v0.4s, v3.4s\n\t"
      "fmla v1.4s, v5.4s, v9.s[0]\n\t"
      "str q1, [%[yp], #16]\n\t"
      "add %[yp], %[yp], %[ld]\n\t"
      "fsub v0.4s, %[c50].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #0]\n\t"
      "fmul v0.4s, v0.4s, v7.s[1]\n\t"
      "fmla v1.4s, v0.4s, v2.4s\n\t"
      "fmla v1.4s, v4.4s, v9.s[1]\n\t"
      "str q1, [%[yp], #0]\n\t"
      "fsub v0.4s, %[c51].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #16]\n\t"
      "fmul v0.4s, v0.4s, v7.s[1]\n\t"
      "fmla v1.4s, v0.4s, v3.4s\n\t"
      "fmla v1.4s, v5.4s, v9.s[1]\n\t"
      "str q1, [%[yp], #16]\n\t"
      "add %[yp], %[yp], %[ld]\n\t"
      "fsub v0.4s, %[c60].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #0]\n\t"
      "fmul v0.4s, v0.4s, v7.s[2]\n\t"
      "fmla v1.4s, v0.4s, v2.4s\n\t"
      "fmla v1.4s, v4.4s, v9.s[2]\n\t"
      "str q1, [%[yp], #0]\n\t"
      "fsub v0.4s, %[c61].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #16]\n\t"
      "fmul v0.4s, v0.4s, v7.s[2]\n\t"
      "fmla v1.4s, v0.4s, v3.4s\n\t"
      "fmla v1.4s, v5.4s, v9.s[2]\n\t"
      "str q1, [%[yp], #16]\n\t"
      "add %[yp], %[yp], %[ld]\n\t"
      "fsub v0.4s, %[c70].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #0]\n\t"
      "fmul v0.4s, v0.4s, v7.s[3]\n\t"
      "fmla v1.4s, v0.4s, v2.4s\n\t"
      "fmla v1.4s, v4.4s, v9.s[3]\n\t"
      "str q1, [%[yp], #0]\n\t"
      "fsub v0.4s, %[c71].4s, %[mg].4s\n\t"
      "ldr q1, [%[yp], #16]\n\t"
      "fmul v0.4s, v0.4s, v7.s[3]\n\t"
      "fmla v1.4s, v0.4s, v3.4s\n\t"
      "fmla v1.4s, v5.4s, v9.s[3]\n\t"
      "str q1, [%[yp], #16]\n\t"
      : [yp] "+r"(yp)
      : [c00] "w"(acc[0][0]), [c01] "w"(acc[0][1]), [c10] "w"(acc[1][0]), [c11] "w"(acc[1][1]), [c20] "w"(acc[2][0]), [c21] "w"(acc[2][1]), [c30] "w"(acc[3][0]), [c31] "w"(acc[3][1]), [c40] "w"(acc[4][0]), [c41] "w"(acc[4][1]), [c50] "w"(acc[5][0]), [c51] "w"(acc[5][1]), [c60] "w"(acc[6][0]), [c61] "w"(acc[6][1]), [c70] "w"(acc[7][0]), [c71] "w"(acc[7][1]), [ld] "r"(ldy * 4), [sp] "r"(sp), [sx] "r"(sx), [gb] "r"(gb), [mg] "w"(mg)
      : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8", "v9", "memory");
}

DOT_FN void dot_tile(const int MR, const int NP, const int B4, const int G1,
                    const tile_args a) {
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
  const int64_t bpg = G1 ? 1 : a.bpg; /* G1: group 32, one block per group */
  const int32_t *bias0 = acc_bias;
  __asm__("" : "+r"(bias0)); /* loads, not constants */
  const float32x4_t mg = vdupq_n_f32(ACC_BIAS_F);
  if (a.first) tile_zero(MR, NP, a);
  for (int64_t g0 = 0, gi = 0; g0 < a.nb; g0 += bpg, gi++) {
    const int64_t gn = min64(bpg, a.nb - g0);
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
      if (B4) dot4_epilogue_asm(acc, a.y, a.ldy, sp, a.gsx + gi * 8, a.gsb + gi * 8, mg);
      else dot8_epilogue_asm(acc, a.y, a.ldy, sp, a.gsx + gi * 8, a.gsb + gi * 8, mg);
    } else
      group_epilogue(MR, NP, B4, 1, acc, w, a, gi);
#pragma GCC unroll 4
    for (int p = 0; p < NP; p++) w[p] += SB;
  }
  if (a.last) tile_final(MR, NP, a);
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

ALWAYS_INLINE void mull_tile(const int MR, const int B4, const tile_args a) {
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

typedef void (*tile_fn)(const tile_args *);

/* dot_<rows>x<panels>_b<bits>[_g32] */
#define DOT_KERNEL(MR, NP, B)                                                             \
  DOT_NOINLINE void dot_##MR##x##NP##_b##B(const tile_args *a) {                          \
    dot_tile(MR, NP, B == 4, 0, *a);                                                      \
  }
#define DOT_KERNEL_G1(MR, NP, B)                                                          \
  DOT_NOINLINE void dot_##MR##x##NP##_b##B##_g32(const tile_args *a) {                    \
    dot_tile(MR, NP, B == 4, 1, *a);                                                      \
  }
#define MULL_KERNEL(MR, B)                                                                \
  static __attribute__((noinline)) void mull_##MR##_b##B(const tile_args *a) {            \
    mull_tile(MR, B == 4, *a);                                                             \
  }
DOT_KERNEL(8, 1, 8) DOT_KERNEL(1, 4, 8) DOT_KERNEL(2, 2, 8) DOT_KERNEL(3, 2, 8) DOT_KERNEL(4, 2, 8)
DOT_KERNEL(8, 1, 4) DOT_KERNEL(1, 4, 4) DOT_KERNEL(2, 2, 4) DOT_KERNEL(3, 2, 4) DOT_KERNEL(4, 2, 4)
DOT_KERNEL_G1(8, 1, 8) DOT_KERNEL_G1(8, 1, 4)
MULL_KERNEL(1, 8) MULL_KERNEL(2, 8) MULL_KERNEL(3, 8) MULL_KERNEL(4, 8)
MULL_KERNEL(1, 4) MULL_KERNEL(2, 4) MULL_KERNEL(3, 4) MULL_KERNEL(4, 4)

typedef struct {
  tile_fn fn;
  int mr, np; /* rows and panels of the tile */
} tile_kind;

/* [bits 4][dot][M for decode, 0 for prefill] */
#define MULL_KINDS(B) {{mull_4_b##B, 4, 1}, {mull_1_b##B, 1, 1}, {mull_2_b##B, 2, 1}, \
                       {mull_3_b##B, 3, 1}, {mull_4_b##B, 4, 1}}
#define DOT_KINDS(B) {{dot_8x1_b##B, 8, 1}, {dot_1x4_b##B, 1, 4}, {dot_2x2_b##B, 2, 2}, \
                      {dot_3x2_b##B, 3, 2}, {dot_4x2_b##B, 4, 2}}
static const tile_kind tile_kinds[2][2][DECODE_MAX_M + 1] = {
    {MULL_KINDS(8), DOT_KINDS(8)},
    {MULL_KINDS(4), DOT_KINDS(4)},
};
#undef MULL_KINDS
#undef DOT_KINDS

/* ------------------------------------------------------------- driver */

typedef struct {
  ARMLLM_QA_JOB_ARGS;
  int b4;
  tile_kind kind;
  int64_t kcb;      /* blocks per K block */
  int64_t n_mt, cp; /* M tiles, panels per N chunk */
} wq_job;

static void wq_items(void *ctx, int64_t i0, int64_t i1) {
  const wq_job *job = ctx;
  const wq_geom *G = &job->G;
  const int MR = job->kind.mr, NP = job->kind.np;
  float gsx[KC_BLOCKS * 8], gsb[KC_BLOCKS * 8];
  tile_args a;
  a.gsx = gsx;
  a.gsb = gsb;
  for (int64_t i = i0; i < i1;) {
    const int64_t nc = i / job->n_mt, mt0 = i % job->n_mt;
    const int64_t mt1 = min64(mt0 + (i1 - i), job->n_mt);
    const int64_t pa = nc * job->cp, pb = min64(pa + job->cp, job->n_panels);
    for (int64_t b0 = 0; b0 < G->nblk; b0 += job->kcb) {
      const int64_t g0 = b0 / G->bpg, woff = b0 * G->bb + g0 * G->sb;
      a.nb = min64(job->kcb, G->nblk - b0);
      a.bpg = G->bpg;
      a.first = b0 == 0;
      a.last = b0 + a.nb == G->nblk;
      const int64_t gc = (a.nb + G->bpg - 1) / G->bpg;
      for (int64_t mt = mt0; mt < mt1; mt++) {
        const int64_t m0 = mt * MR, mv = min64(MR, job->m - m0);
        for (int r = 0; r < MR; r++) {
          const int64_t row = m0 + (r < mv ? r : mv - 1);
          a.x[r] = job->xq + row * job->ldq + b0 * BLK;
          const float *sx = job->scale + row * job->ldsc + g0;
          for (int64_t g = 0; g < gc; g++) gsx[g * 8 + r] = sx[g];
          if (job->b4)
            for (int64_t g = 0; g < gc; g++)
              gsb[g * 8 + r] = (float)job->gsum[row * job->ldgs + g0 + g] * sx[g];
        }
        for (int64_t p = pa; p < pb; p += NP) {
          const int64_t np = min64(NP, pb - p), n0 = p * NR, nv = min64(NP * NR, job->n - n0);
          for (int q = 0; q < NP; q++)
            a.w[q] = job->w + (p + (q < np ? q : np - 1)) * G->pstride + woff;
          const float *bias = a.last && job->bias ? job->bias + n0 : NULL;
          float *yt = job->y + m0 * job->ldy + n0;
          if (mv == MR && nv == NP * NR) {
            a.y = yt;
            a.ldy = job->ldy;
            a.bias = bias;
            job->kind.fn(&a);
            continue;
          }
          /* edge tile: rows / panels past the valid ones land here, unused */
          float t[8 * NR] __attribute__((aligned(16))); /* MR * NP <= 8 */
          float tb[4 * NR] __attribute__((aligned(16))) = {0};
          armllm_edge_tile_load(t, tb, NP * NR, yt, job->ldy, mv, nv, a.first, bias);
          a.y = t;
          a.ldy = NP * NR;
          a.bias = bias ? tb : NULL;
          job->kind.fn(&a);
          armllm_edge_tile_store(t, NP * NR, yt, job->ldy, mv, nv);
        }
      }
    }
    i += mt1 - mt0;
  }
}

void armllm_neon_gemm_wq(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                         const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                         const void *packed_w, int64_t n, int bits, int64_t group,
                         const float *bias, float *y, int64_t ldy) {
  const int dot = armllm_cpu_has(armllm_cpu_detect(), ARMLLM_CPU_ASIMDDP);
  const int b4 = bits == 4;
  wq_job job = {xq, m, ldq, scale, ldsc, gsum, ldgs, packed_w, n, (n + NR - 1) / NR,
                geom_of(k, bits, group), bias, y, ldy, b4,
                tile_kinds[b4][dot][m <= DECODE_MAX_M ? m : 0], 0, 0, 0};
  if (dot && group == BLK && m > DECODE_MAX_M) job.kind.fn = b4 ? dot_8x1_b4_g32 : dot_8x1_b8_g32;
  job.kcb = KC_BLOCKS; /* K blocks of whole groups */
  armllm_gemm_plan plan;
  if (m <= DECODE_MAX_M) {
    plan = armllm_plan_decode(pool, m, job.G.kpad, job.n_panels, NR, job.kind.np, MIN_CHUNK_MACS);
    job.n_mt = 1; /* one tile of all M rows */
    job.cp = job.kind.np;
  } else {
    plan = armllm_plan_prefill(pool, m, job.G.kpad, job.n_panels, job.kind.mr, NR, CP_MAX,
                               MIN_CHUNK_MACS);
    job.n_mt = plan.n_mt;
    job.cp = plan.cp;
  }
  armllm_pool_run(pool, plan.items, plan.grain, wq_items, &job);
}
