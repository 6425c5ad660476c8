/* gguf_blocks.h: GGUF's quantized block formats, decoded exactly: the ggml
 * type ids armllm runs as stored, their block geometry, the decoder of one
 * block into integer values and per-16-column scales, the packed header that
 * records a matrix's parts, and the embedding gather. Portable C (not a slot:
 * packing and gathering are not hot; every variant's packer and the ref
 * GEMM share it).
 *
 * A block of type T holds armllm_gguf_block_elems(T) consecutive elements of
 * a row (32, or 256 for the K-quants and IQ4_XS) in
 * armllm_gguf_block_bytes(T) bytes. It decodes to integer values v (int8) and,
 * per weight group of armllm_gguf_group_len(T) columns (16 or 32), a scale d
 * and, for the types with mins (armllm_gguf_has_offsets), an offset o, all f32
 * and exact: GGUF's f16 scale times its small integer sub-scale needs at most
 * 19 significant bits. The element is then W = d * v + o (d * v exact, one
 * rounding for + o), which is the gguf package's dequantization bit for bit.
 *
 *   type    v range      group  o      block                     ggml's element
 *   Q4_0    [-8, 7]        32   -      d f16, 16 nibbles         q - 8
 *   Q4_1    [0, 15]        32   m      d, m f16, 16 nibbles      q, + m
 *   Q5_0    [-16, 15]      32   -      d, qh[4], 16 nibbles      q - 16
 *   Q5_1    [0, 31]        32   m      d, m, qh[4], 16 nibbles   q, + m
 *   Q8_0    [-128, 127]    32   -      d, 32 int8                q
 *   Q2_K    [0, 3]         16   yes    4+4-bit sc/min, d, dmin   d*sc*q - dmin*m
 *   Q3_K    [-4, 3]        16   -      hmask, 6-bit sc - 32, d   d*(sc-32)*(q - 4*!h)
 *   Q4_K    [0, 15]        32   yes    d, dmin, 6-bit sc/min     d*sc*q - dmin*m
 *   Q5_K    [0, 31]        32   yes    as Q4_K + qh[32]          d*sc*q - dmin*m
 *   Q6_K    [-32, 31]      16   -      ql, qh, int8 sc, d        d*sc*(q - 32)
 *   IQ4_NL  [-127, 113]    32   -      d, 16 nibble indices      d*kvalues[i]
 *   IQ4_XS  [-127, 113]    32   -      d, 6-bit sc - 32, idx     d*(sc-32)*kvalues[i]
 *   MXFP4   [-12, 12]      32   -      e8m0 e, 16 nibble codes   2^(e-128)*2*e2m1[i]
 *
 * MXFP4 (OCP MX, ggml's block_mxfp4): v is the e2m1 code's value doubled,
 * {0, 1, 2, 3, 4, 6, 8, 12} and their negatives, and d = 2^(e - 128) (half
 * the shared scale 2^(e - 127)), exact in f32 down to e = 0 (a subnormal);
 * e = 255 is NaN (the spec's; ggml reads it as 2^127).
 */
#ifndef ARMLLM_GGUF_BLOCKS_H
#define ARMLLM_GGUF_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "pool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ggml type ids (ggml.h's enum ggml_type). */
enum {
  ARMLLM_GGML_Q4_0 = 2,
  ARMLLM_GGML_Q4_1 = 3,
  ARMLLM_GGML_Q5_0 = 6,
  ARMLLM_GGML_Q5_1 = 7,
  ARMLLM_GGML_Q8_0 = 8,
  ARMLLM_GGML_Q2_K = 10,
  ARMLLM_GGML_Q3_K = 11,
  ARMLLM_GGML_Q4_K = 12,
  ARMLLM_GGML_Q5_K = 13,
  ARMLLM_GGML_Q6_K = 14,
  ARMLLM_GGML_IQ4_NL = 20,
  ARMLLM_GGML_IQ4_XS = 23,
  ARMLLM_GGML_MXFP4 = 39,
};

/* MXFP4's d of a shared e8m0 exponent e: the bits of 2^(e - 128) (a
 * subnormal for e < 2), NaN for e = 255; every variant forms d this way. */
static inline uint32_t armllm_mxfp4_d_bits(uint8_t e) {
  if (e == 255) return 0x7fc00000u;
  return e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
}

#define ARMLLM_GGUF_SCALE_COLS 16  /* decoded scales come one per 16 columns */
#define ARMLLM_GGUF_MAX_BLOCK 256  /* elements in the largest block (QK_K) */
#define ARMLLM_GGUF_SUPER 256      /* elements of a super-block (the K-quants', IQ4_XS's) */
#define ARMLLM_GGUF_ACT_GROUP 32   /* activation group of a GEMM of 32-element types only */
#define ARMLLM_GGUF_MAX_PARTS 4    /* row parts of one packed matrix: QKV's 3, gate/up's 2 */
#define ARMLLM_GGUF_HEADER_BYTES 64

/* Elements per block of `type`; 0 for a type this file does not decode. */
int armllm_gguf_block_elems(int type);
/* Bytes per block (0: not decoded here). */
int armllm_gguf_block_bytes(int type);
/* Columns per weight scale group: 16 or 32 (inline: a constant in code
 * specialized for one type). */
static inline int armllm_gguf_group_len(int type) {
  return type == ARMLLM_GGML_Q2_K || type == ARMLLM_GGML_Q3_K || type == ARMLLM_GGML_Q6_K ? 16
                                                                                           : 32;
}
/* 1 for the super-block types (256-element blocks: Q2_K .. Q6_K, IQ4_XS),
 * whose GEMM sums their integer sub-scales in int32 over a whole block. */
static inline int armllm_gguf_is_super(int type) {
  return type == ARMLLM_GGML_Q2_K || type == ARMLLM_GGML_Q3_K || type == ARMLLM_GGML_Q4_K ||
         type == ARMLLM_GGML_Q5_K || type == ARMLLM_GGML_Q6_K || type == ARMLLM_GGML_IQ4_XS;
}
/* 1 when the type's weights carry offsets (mins). */
static inline int armllm_gguf_has_offsets(int type) {
  return type == ARMLLM_GGML_Q4_1 || type == ARMLLM_GGML_Q5_1 || type == ARMLLM_GGML_Q2_K ||
         type == ARMLLM_GGML_Q4_K || type == ARMLLM_GGML_Q5_K;
}
/* Bytes of one row of k elements (k a multiple of the block). */
static inline size_t armllm_gguf_row_bytes(int type, int64_t k) {
  const int e = armllm_gguf_block_elems(type);
  return e ? (size_t)(k / e) * (size_t)armllm_gguf_block_bytes(type) : 0;
}

/* Decodes one block: v[elems] integer values, and d[elems / 16], o[elems / 16]
 * (one per 16 columns; a 32-column group's scale is written twice; o is 0
 * for the types without offsets). */
void armllm_gguf_decode_block(int type, const uint8_t *block, int8_t *v, float *d, float *o);

/* Decodes one block of a super-block type as integers: v[256] as above, the
 * sub-scale s and min m (0 without offsets) of each 16 columns (a 32-column
 * group's twice), and the block's D = d and O = -dmin (0 without offsets),
 * f32 from GGUF's f16: d_j = D * s_j and o_j = O * m_j of the decoder above.
 *   Q2_K  s = sc & 15, m = sc >> 4    Q3_K  s = 6-bit sc - 32
 *   Q4_K, Q5_K  s, m = the 6-bit sc, m    Q6_K  s = int8 sc
 *   IQ4_XS  s = 6-bit ls - 32 */
void armllm_gguf_decode_super(int type, const uint8_t *block, int8_t *v, int16_t *s, int16_t *m,
                              float *D, float *O);

/* Rows of a [rows, k] tensor as stored -> f32 (the gguf package's
 * dequantization, bit for bit); out rows at out + r * ldo. */
void armllm_gguf_dequant_rows(int type, const uint8_t *src, int64_t rows, int64_t k, float *out,
                              int64_t ldo);

/* Embedding gather: out[i, :] = row ids[i] of a [vocab, d] tensor of `type`
 * as stored, dequantized. Returns -1, or the first i whose id is outside
 * [0, vocab) (then nothing is written). */
int64_t armllm_gguf_embed(armllm_pool *pool, const int32_t *ids, int64_t t, const uint8_t *table,
                          int type, int64_t vocab, int64_t d, float *out, int64_t ldo);

/* The first ARMLLM_GGUF_HEADER_BYTES of every packed GGUF-block matrix: its
 * row parts in order (a part of rows[i] rows of types[i]). */
typedef struct {
  int32_t nparts;
  int32_t types[ARMLLM_GGUF_MAX_PARTS];
  int32_t pad_;
  int64_t rows[ARMLLM_GGUF_MAX_PARTS];
} armllm_gguf_parts;

/* 0 when nparts parts of these types and row counts, over k columns, can be
 * packed (1 <= nparts <= ARMLLM_GGUF_MAX_PARTS, known types, rows >= 1, k a
 * positive multiple of every part's block); else -1. */
int armllm_gguf_parts_check(int64_t k, int64_t nparts, const int32_t *types, const int64_t *rows);
/* Fills a header from checked parts. */
armllm_gguf_parts armllm_gguf_parts_of(int64_t nparts, const int32_t *types, const int64_t *rows);
/* The activation group of a GEMM of these parts: ARMLLM_GGUF_SUPER when any
 * part is a super-block type (K is then a multiple of 256), else
 * ARMLLM_GGUF_ACT_GROUP: quant_act's scales (and gsum) come one per that
 * many columns (armllm_kernels.h's GGUF-block GEMM). */
static inline int armllm_gguf_act_group(const armllm_gguf_parts *p) {
  for (int i = 0; i < p->nparts; i++)
    if (armllm_gguf_is_super(p->types[i])) return ARMLLM_GGUF_SUPER;
  return ARMLLM_GGUF_ACT_GROUP;
}
/* The type of output row n of a packed matrix. */
static inline int armllm_gguf_row_type(const armllm_gguf_parts *p, int64_t n) {
  for (int i = 0; i < p->nparts; i++) {
    if (n < p->rows[i]) return p->types[i];
    n -= p->rows[i];
  }
  return -1;
}

#ifdef __cplusplus
}
#endif
#endif /* ARMLLM_GGUF_BLOCKS_H */
