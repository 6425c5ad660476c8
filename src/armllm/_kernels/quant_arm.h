/* quant_arm.h: what the Arm quantized-GEMM variants (neon, neon_mmla, sve)
 * share: the panel geometry of their packed weights (panels of NR output rows,
 * BLK-k blocks, then each group's scales) and, for the SMMLA variants, the
 * run-time packing of activation row pairs into SMMLA operands. */
#ifndef ARMLLM_QUANT_ARM_H
#define ARMLLM_QUANT_ARM_H

#include <arm_neon.h>

#include "armllm_kernels.h"

#define ARMLLM_QA_NR 8         /* panel width (output rows of W) */
#define ARMLLM_QA_BLK 32       /* k per block */
#define ARMLLM_QA_KC_BLOCKS 32 /* K block: 1024 k, a multiple of every group */

typedef struct {
  int64_t kpad, nblk, bpg, ng, bb, sb, pstride; /* bytes: block, scales, panel */
} wq_geom;

static inline wq_geom geom_of(int64_t k, int bits, int64_t group) {
  wq_geom g;
  g.kpad = armllm_q_kpad(k);
  g.nblk = g.kpad / ARMLLM_QA_BLK;
  g.bpg = armllm_q_group_len(group) / ARMLLM_QA_BLK;
  g.ng = armllm_q_groups(k, group);
  g.bb = bits == 4 ? 128 : 256;
  g.sb = bits == 4 ? 64 : 32;
  g.pstride = g.nblk * g.bb + g.ng * g.sb;
  return g;
}

/* The leading fields of each Arm variant's quantized-GEMM job: the call's
 * arguments and the weights' geometry, in the order of the variants'
 * positional initializers; each job adds its tile kind and work plan. */
#define ARMLLM_QA_JOB_ARGS \
  const int8_t *xq;        \
  int64_t m, ldq;          \
  const float *scale;      \
  int64_t ldsc;            \
  const int32_t *gsum;     \
  int64_t ldgs;            \
  const uint8_t *w;        \
  int64_t n, n_panels;     \
  wq_geom G;               \
  const float *bias;       \
  float *y;                \
  int64_t ldy

static inline size_t armllm_qa_packed_len(int64_t n, int64_t k, int bits, int64_t group) {
  return (size_t)((n + ARMLLM_QA_NR - 1) / ARMLLM_QA_NR * geom_of(k, bits, group).pstride);
}

/* Panel p's scales of group g after its weights: d[8] then (4 bits) o[8], rows past n
 * zero; d/o are [n, ngin] (ngin 1: one per row, repeated over its groups). Returns
 * the byte after them (sb bytes on). */
static inline uint8_t *qa_pack_scales(uint8_t *dst, const float *d, const float *o, int64_t n,
                                      int64_t p, int64_t g, int64_t group, int64_t ngin,
                                      int64_t sb) {
  float s[2 * ARMLLM_QA_NR];
  for (int j = 0; j < ARMLLM_QA_NR; j++) {
    const int64_t row = p * ARMLLM_QA_NR + j;
    const int64_t src = row * ngin + (group ? g : 0);
    s[j] = row < n ? d[src] : 0.0f;
    s[ARMLLM_QA_NR + j] = row < n && o ? o[src] : 0.0f;
  }
  memcpy(dst, s, (size_t)sb);
  return dst + sb;
}

#ifdef ARMLLM_QA_SMMLA_ROWS
static const int8_t zero_row[ARMLLM_QA_KC_BLOCKS * ARMLLM_QA_BLK];

/* x rows m0 .. m0 + 2*MP of blocks [b0, b0 + nb) as SMMLA operands
 * ap[((b*4 + c)*MP + pr)*16 + 8h + i] = x[m0 + 2pr + h, 32(b0 + b) + 8c + i]
 * (rows past M: zero), with the scales sx of groups [g0, g0 + gc) per pair
 * as sxp[(g*MP + pr)*8 + 2h + e] and for 4 bits b = (float)gsum * sx at
 * sxp[(g*MP + pr)*8 + 4 + 2h + e] (e = 0, 1). */
static void pack_rows(const int8_t *xq, int64_t ldq, const float *scale, int64_t ldsc,
                      const int32_t *gsum, int64_t ldgs, int64_t m, int64_t m0, int MP,
                      int64_t b0, int64_t nb, int64_t g0, int64_t gc, int8_t *ap, float *sxp) {
  for (int pr = 0; pr < MP; pr++) {
    const int8_t *r[2];
    for (int h = 0; h < 2; h++) {
      const int64_t row = m0 + 2 * pr + h;
      r[h] = row < m ? xq + row * ldq + b0 * ARMLLM_QA_BLK : zero_row;
      for (int64_t g = 0; g < gc; g++) {
        float *e = sxp + (g * MP + pr) * 8 + 2 * h;
        const float sx = row < m ? scale[row * ldsc + g0 + g] : 0.0f;
        e[0] = e[1] = sx;
        if (gsum) e[4] = e[5] = row < m ? (float)gsum[row * ldgs + g0 + g] * sx : 0.0f;
      }
    }
    for (int64_t b = 0; b < nb; b++)
      for (int half = 0; half < 2; half++) {
        const int64x2_t x0 =
            vreinterpretq_s64_s8(vld1q_s8(r[0] + b * ARMLLM_QA_BLK + 16 * half));
        const int64x2_t x1 =
            vreinterpretq_s64_s8(vld1q_s8(r[1] + b * ARMLLM_QA_BLK + 16 * half));
        vst1q_s8(ap + ((b * 4 + 2 * half) * MP + pr) * 16,
                 vreinterpretq_s8_s64(vzip1q_s64(x0, x1)));
        vst1q_s8(ap + ((b * 4 + 2 * half + 1) * MP + pr) * 16,
                 vreinterpretq_s8_s64(vzip2q_s64(x0, x1)));
      }
  }
}
#endif

#endif /* ARMLLM_QUANT_ARM_H */
