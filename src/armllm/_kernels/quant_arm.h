/* quant_arm.h: the quantized GEMM (int8 or uint4 weights, int8 activations)
 * of the Arm variants (neon, neon_mmla, sve): what their packed weights
 * share (panels of NR output rows, K padded and cut into BLK-k blocks, each
 * group's scales after its blocks), the tile a micro-kernel is handed, and
 * the one driver (quant_arm.c) that packs weights and walks a GEMM's tiles.
 * A variant adds its block layout and its micro-kernels.
 *
 * Exactness: a group's int32 sums are exact, so only the float epilogue
 * could differ; it is the ABI's: a = (float)acc * sx; t = fma(d, a, t)
 * (+ fma(o, (float)gsum * sx, t)), y = t (+ bias), per output, in group
 * order, from +0. Every variant, tile and thread count gives ref's bits. */
#ifndef ARMLLM_QUANT_ARM_H
#define ARMLLM_QUANT_ARM_H

#include <stdint.h>

#include "armllm_kernels.h"
#include "pool.h"

#define ARMLLM_QA_NR 8         /* panel width (output rows of W) */
#define ARMLLM_QA_BLK 32       /* k per block */
#define ARMLLM_QA_KC_BLOCKS 32 /* K block: 1024 k, a multiple of every group */
#define ARMLLM_QA_MAX_ROWS 8   /* rows of x per tile, at most */
#define ARMLLM_QA_MAX_PANELS 8 /* panels per tile, at most (SVE decode at 512 bits) */

/* Group sums start at the bits of 1.5 * 2^23 (ACC_BIAS): a sum s with
 * |s| < 2^22 (any group of <= 128 k: |s| <= 128^3 = 2^21) then reads as the
 * float 1.5 * 2^23 + s exactly, and (float)s is that minus 1.5 * 2^23: one
 * FSUB on either vector pipe instead of SCVTF (two uops on V0 of Neoverse
 * N2/V2). The starting values are loaded from memory (load pipes), not
 * materialized with MOVs. Channelwise weights are groups of 128 too. */
#define ARMLLM_QA_ACC_BIAS 0x4B400000
#define ARMLLM_QA_ACC_BIAS_F 12582912.0f
#define ARMLLM_QA_B4_ ARMLLM_QA_ACC_BIAS, ARMLLM_QA_ACC_BIAS, ARMLLM_QA_ACC_BIAS, ARMLLM_QA_ACC_BIAS
#define ARMLLM_QA_B16_ ARMLLM_QA_B4_, ARMLLM_QA_B4_, ARMLLM_QA_B4_, ARMLLM_QA_B4_
static const int32_t armllm_qa_acc_bias[64] __attribute__((aligned(64))) = {
    ARMLLM_QA_B16_, ARMLLM_QA_B16_, ARMLLM_QA_B16_, ARMLLM_QA_B16_};
#undef ARMLLM_QA_B4_
#undef ARMLLM_QA_B16_

/* One tile as the driver hands it to a micro-kernel: rows x panels of the
 * output over one K block (nb blocks in groups of bpg, whole groups). The
 * rows come in place (x) or packed as SMMLA operands (ap), as the tile
 * kind asks; either way rows past M repeat the last one or are zero. */
typedef struct {
  const uint8_t *w[ARMLLM_QA_MAX_PANELS]; /* panels at the K block (past the valid ones:
                                             the last again) */
  int64_t nb, bpg;                        /* blocks in this K block, blocks per group */
  const int8_t *x[ARMLLM_QA_MAX_ROWS];    /* in place: row r at the K block */
  const int8_t *ap;  /* packed: x operands [block][chunk][pair] of 16 bytes */
  const float *sx;   /* in place: [group of the K block][8 rows] sx; packed: [group][pair]
                        sx as [s0, s0, s1, s1], then (float)gsum * sx likewise (4 bits) */
  const float *sb;   /* in place: [group][8 rows] (float)gsum * sx (4 bits) */
  float *y;          /* the tile's rows x columns, row-major: t between K blocks */
  int64_t ldy;
  const float *bias; /* the tile's columns or NULL; given in the last K block only */
  int first, last;   /* the first / last K block */
  float *tb;         /* packed: scratch for t in the accumulators' order */
} armllm_qa_tile;

typedef void (*armllm_qa_tile_fn)(const armllm_qa_tile *tile);

/* A variant's micro-kernels from its always-inline tile template
 * impl(R, C, B4, G1, tile) (R, C: the tile's rows or row pairs, panels or B
 * vectors; B4: 4-bit weights; G1: group 32, no block loop): P_<R>x<C>_b8
 * and P_<R>x<C>_b4 (ARMLLM_QA_KERNELS_G32: ..._b8_g32 and ..._b4_g32). */
#define ARMLLM_QA_KERNEL(P, impl, R, C, BITS, G1, SUFFIX)                                     \
  static __attribute__((noinline)) void P##_##R##x##C##_b##BITS##SUFFIX(                      \
      const armllm_qa_tile *a) {                                                               \
    impl(R, C, BITS == 4, G1, *a);                                                             \
  }
#define ARMLLM_QA_KERNELS(P, impl, R, C) \
  ARMLLM_QA_KERNEL(P, impl, R, C, 8, 0, ) ARMLLM_QA_KERNEL(P, impl, R, C, 4, 0, )
#define ARMLLM_QA_KERNELS_G32(P, impl, R, C) \
  ARMLLM_QA_KERNEL(P, impl, R, C, 8, 1, _g32) ARMLLM_QA_KERNEL(P, impl, R, C, 4, 1, _g32)

/* A variant's tile: its micro-kernel and shape. */
typedef struct {
  armllm_qa_tile_fn fn;
  int rows;   /* rows of x (an even number when packed) */
  int panels; /* panels of W */
  int packed; /* rows packed as SMMLA operands (pairs), else read in place */
} armllm_qa_kind;

/* Writes block b (k 32b .. 32b + 31) of panel p of q [n, k] in a variant's
 * layout: 256 bytes (8 bits) or 128 (4 bits); rows past n, k past k: 0. */
typedef void (*armllm_qa_block_fn)(uint8_t *dst, const int8_t *q, int64_t n, int64_t k,
                                   int64_t p, int64_t b, int bits);

/* gemm_wq_packed_len / gemm_wq_pack (armllm_kernels.h) around a block layout:
 * panel p is, per group, its blocks, then d[8] (f32, rows 8p..8p+7, 0 past
 * n), then for 4 bits o[8]. */
size_t armllm_qa_packed_len(int64_t n, int64_t k, int bits, int64_t group);
void armllm_qa_pack(const int8_t *q, int64_t n, int64_t k, int bits, int64_t group,
                    const float *d, const float *o, void *packed, armllm_qa_block_fn block);

/* gemm_wq (armllm_kernels.h) with tiles of `kind` (decode for M <=
 * ARMLLM_GEMM_DECODE_MAX_M: one tile of all rows; the variant picks a kind
 * of that many rows or more), of the output columns [n0, n1) (gemm_wq_cols:
 * n0 a multiple of ARMLLM_QA_NR, y and bias the window's; the whole call: 0,
 * n). */
void armllm_qa_gemm(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                    const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                    const void *packed_w, int64_t n0, int64_t n1, int bits, int64_t group,
                    const float *bias, float *y, int64_t ldy, armllm_qa_kind kind,
                    int64_t min_chunk_macs);

#endif /* ARMLLM_QUANT_ARM_H */
