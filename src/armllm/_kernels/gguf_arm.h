/* gguf_arm.h: the GGUF-block GEMM (armllm_kernels.h) of the Arm variants
 * (neon, neon_mmla, sve): the packed layout "gguf-arm-p4" they share, the
 * NEON unpacking of its blocks to int8 values and f32 group scales (one
 * always-inline function per step, specialised by the ggml type), and the
 * driver (gguf_arm.c) that packs weights and walks a GEMM's items. A variant
 * adds its micro-kernels (neon/gguf.c: the decode kernels and the SDOT
 * prefill tiles; neon_mmla/gguf.c: the SMMLA prefill tiles).
 *
 * Packed layout "gguf-arm-p4": the armllm_gguf_parts header
 * (ARMLLM_GGUF_HEADER_BYTES), then each part's panels, the part starting on
 * a 64-byte boundary. A panel is 4 output rows of one part (the last panel's
 * rows past the part: zeros), and holds the K/E blocks of those rows in K
 * order (E = the type's block elements, 32 or 256); a panel block is a scale
 * header for the 4 rows, then each row's values (row r at HB + r * UB):
 *
 *   type    header (HB bytes; [j][r] = group j, row r)          row values (UB)
 *   Q4_0    d f16[4]                                   8        nib[16]               16
 *   IQ4_NL  d f16[4]                                   8        nib[16] (indices)     16
 *   Q8_0    d f16[4]                                   8        int8[32]              32
 *   Q4_1    d f16[4], m f16[4]                        16        nib[16]               16
 *   Q5_0    d f16[4]                                   8        qh u32, nib[16]       20
 *   Q5_1    d f16[4], m f16[4]                        16        qh u32, nib[16]       20
 *   Q2_K    d f32[4], dmin f32[4], scm u8[16][4]      96        p2[64]                64
 *   Q3_K    d f32[4], sc-32 s8[16][4]                 80        p2[64], h1[32]        96
 *   Q4_K    d f32[4], dmin f32[4], sc u8[8][4],       96        nib[128]             128
 *           m u8[8][4]
 *   Q5_K    as Q4_K                                   96        nib[128], h1[32]     160
 *   Q6_K    d f32[4], sc s8[16][4]                    80        nib[128], h2[64]     192
 *   IQ4_XS  d f32[4], ls-32 s8[8][4]                  48        nib[128] (indices)   128
 *   MXFP4   e u8[4] (e8m0)                             4        nib[16] (codes)       16
 *
 * f16 fields are GGUF's bits (converted exactly by FCVTL); f32 ones are
 * GGUF's f16 super-block scales widened; sub-scales are GGUF's small
 * integers (Q2_K's byte as stored: scale in the low nibble, min in the high).
 * The 32-element types' group scale d and offset o (Q4_1, Q5_1: m) widen to
 * f32 exactly (MXFP4's d is formed from e). The super-block types' integer sub-scales s_j and mins
 * m_j widen to int32 and their d and dmin give the block's D = d and
 * O = -dmin (armllm_gguf_decode_super's). Values, in 16-element vectors
 * (vector v = elements 16v .. 16v + 15 of the block):
 *   nib: 16 bytes per vector pair (2c, 2c + 1): low nibble of byte i is
 *        element 32c + i, high nibble element 32c + 16 + i (GGUF's Q4_0
 *        order; AND 15 / USHR 4 give both vectors).
 *   qh:  Q5_0/Q5_1's 32 bits as stored: bit e is element e's fifth bit.
 *   h1:  16 bytes per 8 vectors: bit b of byte i is one high bit of element
 *        i of vector 8h + b (Q5_K: the fifth bit; Q3_K: the third, set =
 *        GGUF's "no -4").
 *   h2:  16 bytes per 4 vectors: bits 2b, 2b + 1 of byte i are two bits of
 *        element i of vector 4h + b (Q6_K: bits 4, 5).
 *   p2:  Q2_K/Q3_K's low 2 bits, laid out as h2.
 * The value an element decodes to is gguf_blocks.h's v: the stored unsigned
 * q minus 8 (Q4_0), 16 (Q5_0), 4 (Q3_K), 32 (Q6_K), or the IQ4 code book
 * entry of the index (TBL). Per row these are GGUF's own bytes but for the
 * K-quants' f16 -> f32 supers and 6-bit -> 8-bit sub-scales (+1% .. +6%).
 *
 * Exactness: a weight group's int32 sum is exact whatever the order, and so
 * are a super-block's isum = sum_j s_j * acc_j and msum = sum_j m_j * gs_j
 * (|isum| < 2^28; int32 wraps, so any order of exact partial terms ends on
 * the exact sum); the float epilogue is the ABI's, per output, in K order,
 * from +0, once per 32-element block or per super-block, so every variant,
 * path, tile and thread count gives ref's bits. */
#ifndef ARMLLM_GGUF_ARM_H
#define ARMLLM_GGUF_ARM_H

#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

#include "armllm_kernels.h"
#include "gguf_blocks.h"
#include "pool.h"
#include "quant_arm.h"

#define ARMLLM_GA_NR 4        /* rows of W per panel */
#define ARMLLM_GA_KC 512      /* prefill K block: a multiple of every block (256) */
#define ARMLLM_GA_MC 64       /* prefill M chunk: rows one item runs per panel group */
#define ARMLLM_GA_PG 4        /* prefill panels per item (all of one part) */
#define ARMLLM_GA_MAX_MR 8    /* rows of x per prefill tile, at most */
#define ARMLLM_GA_GROUPS (ARMLLM_GA_KC / 16) /* weight groups of 16 per K block, at most */
#define ARMLLM_GA_CHUNKS (ARMLLM_GA_KC / 32) /* 32-column chunks per K block */
#define ARMLLM_GA_SUPERS (ARMLLM_GA_KC / ARMLLM_GGUF_SUPER) /* super-blocks per K block */

/* The ggml types in one list, for instantiating per-type code. */
#define ARMLLM_GA_TYPES(X)                                                                 \
  X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(Q8_0) X(Q2_K) X(Q3_K) X(Q4_K) X(Q5_K) X(Q6_K) X(IQ4_NL) \
  X(IQ4_XS) X(MXFP4)
#define ARMLLM_GA_NTYPES 13

#define GA_AI static inline __attribute__((always_inline))

/* The type's index in ARMLLM_GA_TYPES (-1: unknown). */
static inline int armllm_ga_index(int type) {
  int i = 0;
#define GA_IDX_(T) \
  if (type == ARMLLM_GGML_##T) return i; \
  i++;
  ARMLLM_GA_TYPES(GA_IDX_)
#undef GA_IDX_
  return -1;
}

/* ---------------------------------------------------------- geometry */

/* gguf_blocks.c's geometry, inline so that it folds in the per-type
 * kernels: block elements E, weight group length, offsets or not. */
GA_AI int ga_elems(int t) {
  switch (t) {
  case ARMLLM_GGML_Q2_K: case ARMLLM_GGML_Q3_K: case ARMLLM_GGML_Q4_K: case ARMLLM_GGML_Q5_K:
  case ARMLLM_GGML_Q6_K: case ARMLLM_GGML_IQ4_XS:
    return 256;
  default:
    return 32;
  }
}
GA_AI int ga_group_len(int t) {
  return t == ARMLLM_GGML_Q2_K || t == ARMLLM_GGML_Q3_K || t == ARMLLM_GGML_Q6_K ? 16 : 32;
}
GA_AI int ga_offsets(int t) {
  return t == ARMLLM_GGML_Q4_1 || t == ARMLLM_GGML_Q5_1 || t == ARMLLM_GGML_Q2_K ||
         t == ARMLLM_GGML_Q4_K || t == ARMLLM_GGML_Q5_K;
}
/* 1 for the super-block types (256-element blocks: gguf_blocks.h's
 * armllm_gguf_is_super), whose epilogue runs once per block. */
GA_AI int ga_super(int t) { return ga_elems(t) == ARMLLM_GGUF_SUPER; }
/* Scale header bytes HB of a panel block. */
GA_AI int ga_hb(int t) {
  switch (t) {
  case ARMLLM_GGML_Q4_1: case ARMLLM_GGML_Q5_1: return 16;
  case ARMLLM_GGML_Q2_K: case ARMLLM_GGML_Q4_K: case ARMLLM_GGML_Q5_K: return 96;
  case ARMLLM_GGML_Q3_K: case ARMLLM_GGML_Q6_K: return 80;
  case ARMLLM_GGML_IQ4_XS: return 48;
  case ARMLLM_GGML_MXFP4: return 4; /* e u8[4] */
  default: return 8; /* Q4_0, Q5_0, Q8_0, IQ4_NL: d f16[4] */
  }
}
/* Bytes UB of one row's values in a panel block. */
GA_AI int ga_ub(int t) {
  switch (t) {
  case ARMLLM_GGML_Q5_0: case ARMLLM_GGML_Q5_1: return 20;
  case ARMLLM_GGML_Q8_0: return 32;
  case ARMLLM_GGML_Q2_K: return 64;
  case ARMLLM_GGML_Q3_K: return 96;
  case ARMLLM_GGML_Q4_K: case ARMLLM_GGML_IQ4_XS: return 128;
  case ARMLLM_GGML_Q5_K: return 160;
  case ARMLLM_GGML_Q6_K: return 192;
  default: return 16; /* Q4_0, Q4_1, IQ4_NL, MXFP4 */
  }
}
/* Bytes of a panel block. */
GA_AI int ga_pb(int t) { return ga_hb(t) + ARMLLM_GA_NR * ga_ub(t); }

/* --------------------------------------------------------- unpacking */

/* IQ4_NL / IQ4_XS code book (gguf_blocks.c's), for TBL. */
static const int8_t armllm_ga_iq4_values[16] __attribute__((aligned(16))) = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
/* MXFP4's: e2m1 codes doubled, sign in bit 3 (gguf_blocks.c's). */
static const int8_t armllm_ga_mxfp4_values[16] __attribute__((aligned(16))) = {
    0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* x << s for s >= 0, x >> -s otherwise (USHL by a register: any direction) */
GA_AI uint8x16_t ga_shift(uint8x16_t x, int s) { return vshlq_u8(x, vdupq_n_s8((int8_t)s)); }

/* Vector v (elements 16v .. 16v + 15) of a 2-bit plane laid out as h2. */
GA_AI uint8x16_t ga_p2(const uint8_t *plane, int v) {
  const uint8x16_t p = vld1q_u8(plane + 16 * (v / 4));
  return vandq_u8(ga_shift(p, -2 * (v % 4)), vdupq_n_u8(3));
}

/* Bits 2b, 2b + 1 (b = v % 4) of an h2 plane moved to bits POS, POS + 1 of low. */
GA_AI uint8x16_t ga_h2(const uint8_t *plane, int v, int pos, uint8x16_t low) {
  const uint8x16_t p = vld1q_u8(plane + 16 * (v / 4));
  return vbslq_u8(vdupq_n_u8((uint8_t)(3 << pos)), ga_shift(p, pos - 2 * (v % 4)), low);
}

/* Bit v % 8 of an h1 plane moved to bit POS of low. */
GA_AI uint8x16_t ga_h1(const uint8_t *plane, int v, int pos, uint8x16_t low) {
  const uint8x16_t p = vld1q_u8(plane + 16 * (v / 8));
  return vbslq_u8(vdupq_n_u8((uint8_t)(1 << pos)), ga_shift(p, pos - v % 8), low);
}

/* Q5_0/Q5_1: bits 16h .. 16h + 15 of qh (as stored) as 0x10 bytes. */
GA_AI uint8x16_t ga_qh_bits(uint32_t qh, int h) {
  static const uint8_t bit_of[16] __attribute__((aligned(16))) = {1, 2, 4, 8, 16, 32, 64, 128,
                                                                  1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x8_t bytes = vcreate_u8((uint64_t)qh);
  /* bytes 2h (elements 16h .. + 7) and 2h + 1 (.. + 15), 8 times each */
  const uint8x16_t rep = vcombine_u8(vdup_lane_u8(bytes, 0), vdup_lane_u8(bytes, 1));
  const uint8x16_t rep1 = vcombine_u8(vdup_lane_u8(bytes, 2), vdup_lane_u8(bytes, 3));
  const uint8x16_t set = vtstq_u8(h ? rep1 : rep, vld1q_u8(bit_of));
  return vandq_u8(set, vdupq_n_u8(16));
}

/* The 32 values of chunk c (elements 32c .. 32c + 31 of the block) of one
 * row as int8 (gguf_blocks.h's v): w0 = the first 16, w1 = the next 16. */
GA_AI void ga_unpack_chunk(const int T, const uint8_t *rv, int c, int8x16_t *w0, int8x16_t *w1) {
  const uint8x16_t m15 = vdupq_n_u8(15);
  switch (T) {
  case ARMLLM_GGML_Q8_0:
    *w0 = vld1q_s8((const int8_t *)rv);
    *w1 = vld1q_s8((const int8_t *)rv + 16);
    return;
  case ARMLLM_GGML_Q4_0: case ARMLLM_GGML_Q4_1: case ARMLLM_GGML_Q4_K: {
    const uint8x16_t raw = vld1q_u8(rv + 16 * c);
    uint8x16_t lo = vandq_u8(raw, m15), hi = vshrq_n_u8(raw, 4);
    if (T == ARMLLM_GGML_Q4_0) { /* q - 8 */
      lo = vsubq_u8(lo, vdupq_n_u8(8));
      hi = vsubq_u8(hi, vdupq_n_u8(8));
    }
    *w0 = vreinterpretq_s8_u8(lo);
    *w1 = vreinterpretq_s8_u8(hi);
    return;
  }
  case ARMLLM_GGML_IQ4_NL: case ARMLLM_GGML_IQ4_XS: case ARMLLM_GGML_MXFP4: {
    const uint8x16_t raw = vld1q_u8(rv + 16 * c);
    const int8x16_t book =
        vld1q_s8(T == ARMLLM_GGML_MXFP4 ? armllm_ga_mxfp4_values : armllm_ga_iq4_values);
    *w0 = vqtbl1q_s8(book, vandq_u8(raw, m15));
    *w1 = vqtbl1q_s8(book, vshrq_n_u8(raw, 4));
    return;
  }
  case ARMLLM_GGML_Q5_0: case ARMLLM_GGML_Q5_1: {
    uint32_t qh;
    memcpy(&qh, rv, sizeof qh);
    const uint8x16_t raw = vld1q_u8(rv + 4);
    uint8x16_t lo = vorrq_u8(vandq_u8(raw, m15), ga_qh_bits(qh, 0));
    uint8x16_t hi = vorrq_u8(vshrq_n_u8(raw, 4), ga_qh_bits(qh, 1));
    if (T == ARMLLM_GGML_Q5_0) { /* q - 16 */
      lo = vsubq_u8(lo, vdupq_n_u8(16));
      hi = vsubq_u8(hi, vdupq_n_u8(16));
    }
    *w0 = vreinterpretq_s8_u8(lo);
    *w1 = vreinterpretq_s8_u8(hi);
    return;
  }
  case ARMLLM_GGML_Q5_K: {
    const uint8x16_t raw = vld1q_u8(rv + 16 * c);
    *w0 = vreinterpretq_s8_u8(ga_h1(rv + 128, 2 * c, 4, vandq_u8(raw, m15)));
    *w1 = vreinterpretq_s8_u8(ga_h1(rv + 128, 2 * c + 1, 4, vshrq_n_u8(raw, 4)));
    return;
  }
  case ARMLLM_GGML_Q6_K: { /* (nibble | 2 high bits << 4) - 32 */
    const uint8x16_t raw = vld1q_u8(rv + 16 * c), off = vdupq_n_u8(32);
    *w0 = vreinterpretq_s8_u8(vsubq_u8(ga_h2(rv + 128, 2 * c, 4, vandq_u8(raw, m15)), off));
    *w1 = vreinterpretq_s8_u8(vsubq_u8(ga_h2(rv + 128, 2 * c + 1, 4, vshrq_n_u8(raw, 4)), off));
    return;
  }
  case ARMLLM_GGML_Q2_K:
    *w0 = vreinterpretq_s8_u8(ga_p2(rv, 2 * c));
    *w1 = vreinterpretq_s8_u8(ga_p2(rv, 2 * c + 1));
    return;
  case ARMLLM_GGML_Q3_K: { /* (low 2 bits | h << 2) - 4 */
    const uint8x16_t off = vdupq_n_u8(4);
    *w0 = vreinterpretq_s8_u8(vsubq_u8(ga_h1(rv + 64, 2 * c, 2, ga_p2(rv, 2 * c)), off));
    *w1 = vreinterpretq_s8_u8(vsubq_u8(ga_h1(rv + 64, 2 * c + 1, 2, ga_p2(rv, 2 * c + 1)), off));
    return;
  }
  default:
    *w0 = *w1 = vdupq_n_s8(0);
    return;
  }
}

/* 4 bytes (one group's sub-scales of the panel's 4 rows) -> int32. */
GA_AI int32x4_t ga_u8x4_s32(const uint8_t *p) {
  uint32_t w;
  memcpy(&w, p, sizeof w);
  return vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8((uint64_t)w)))));
}
GA_AI int32x4_t ga_s8x4_s32(const uint8_t *p) {
  uint32_t w;
  memcpy(&w, p, sizeof w);
  return vmovl_s16(vget_low_s16(vmovl_s8(vcreate_s8((uint64_t)w))));
}
/* 4 f16 (GGUF's bits) -> f32, exact */
GA_AI float32x4_t ga_f16x4_f32(const uint8_t *p) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(const void *)p)));
}

/* A 32-element type's block (one weight group): its scale d and offset o
 * for the panel's 4 rows, from the header h. */
GA_AI void ga_block_scales(const int T, const uint8_t *h, float32x4_t *d, float32x4_t *o) {
  switch (T) {
  case ARMLLM_GGML_Q4_1: case ARMLLM_GGML_Q5_1:
    *d = ga_f16x4_f32(h);
    *o = ga_f16x4_f32(h + 8);
    return;
  case ARMLLM_GGML_MXFP4: { /* d = 2^(e - 128): gguf_blocks.h's armllm_mxfp4_d_bits */
    uint32_t w;
    memcpy(&w, h, sizeof w);
    const uint32x4_t e = vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8((uint64_t)w))));
    uint32x4_t bits = vshlq_n_u32(vsubq_u32(e, vdupq_n_u32(1)), 23);
    bits = vbslq_u32(vcltq_u32(e, vdupq_n_u32(2)),
                     vshlq_u32(vdupq_n_u32(0x00200000), vreinterpretq_s32_u32(e)), bits);
    bits = vbslq_u32(vceqq_u32(e, vdupq_n_u32(255)), vdupq_n_u32(0x7fc00000), bits);
    *d = vreinterpretq_f32_u32(bits);
    *o = vdupq_n_f32(0.0f);
    return;
  }
  default: /* Q4_0, Q5_0, Q8_0, IQ4_NL */
    *d = ga_f16x4_f32(h);
    *o = vdupq_n_f32(0.0f);
    return;
  }
}

/* A super-block type's weight group j (of 16 or 32 columns): its integer
 * sub-scale s and min m (0 without offsets) for the panel's 4 rows, from
 * the header h (armllm_gguf_decode_super's s_j, m_j). */
GA_AI void ga_group_ints(const int T, const uint8_t *h, int j, int32x4_t *s, int32x4_t *m) {
  switch (T) {
  case ARMLLM_GGML_Q2_K: { /* scale | min << 4 */
    const int32x4_t sm = ga_u8x4_s32(h + 32 + 4 * j);
    *s = vandq_s32(sm, vdupq_n_s32(15));
    *m = vshrq_n_s32(sm, 4);
    return;
  }
  case ARMLLM_GGML_Q4_K: case ARMLLM_GGML_Q5_K:
    *s = ga_u8x4_s32(h + 32 + 4 * j);
    *m = ga_u8x4_s32(h + 64 + 4 * j);
    return;
  default: /* Q3_K, Q6_K, IQ4_XS: signed scales, no mins */
    *s = ga_s8x4_s32(h + 16 + 4 * j);
    *m = vdupq_n_s32(0);
    return;
  }
}

/* A super-block's D = d and O = -dmin (0 without offsets) for the 4 rows. */
GA_AI void ga_block_supers(const int T, const uint8_t *h, float32x4_t *D, float32x4_t *O) {
  *D = vld1q_f32((const float *)(const void *)h);
  *O = ga_offsets(T) ? vnegq_f32(vld1q_f32((const float *)(const void *)(h + 16)))
                     : vdupq_n_f32(0.0f);
}

/* The 32-element types' prefill tiles start their group sums at
 * quant_arm.h's ACC_BIAS (|sum| <= 32 * 128 * 127 < 2^22), so (float)sum is
 * one FSUB rather than SCVTF (two uops on Neoverse N2/V2's V0; the
 * super-block tiles convert isum once per 256 columns, with SCVTF); the
 * start values are loaded (load pipes),
 * each accumulator from its own address so that GCC neither hoists nor
 * merges the loads into register moves. */
GA_AI const int32_t *ga_acc_start(void) {
  const int32_t *p = armllm_qa_acc_bias;
  __asm__("" : "+r"(p)); /* opaque: a fresh load per group */
  return p;
}
/* The super-block tiles' sums (acc, isum) start at 0 once per 256 columns,
 * loaded like ga_acc_start's (8 MOVI would take the vector pipes). */
static const int32_t armllm_ga_zeros[32] __attribute__((aligned(64))) = {0};
GA_AI const int32_t *ga_zero_start(void) {
  const int32_t *p = armllm_ga_zeros;
  __asm__("" : "+r"(p)); /* opaque: loads, not register moves */
  return p;
}
GA_AI float32x4_t ga_acc_f32(int32x4_t acc) {
  return vsubq_f32(vreinterpretq_f32_s32(acc), vdupq_n_f32(ARMLLM_QA_ACC_BIAS_F));
}

/* ------------------------------------------------------------ driver */

/* The call's activations and output, as the kernels read them. */
typedef struct {
  const int8_t *xq;
  int64_t m, k, ldq;
  const float *scale;
  int64_t ldsc;
  /* quant_act's sums per 32 columns when G = 32; NULL when G = 256 (too
   * coarse for a weight group: the kernels sum x themselves) */
  const int32_t *gsum;
  int64_t ldgs;
  int act_shift; /* log2 of the activation group G (armllm_gguf_act_group) */
  const float *bias;
  float *y;
  int64_t ldy;
} armllm_ga_args;

/* The activation scale of row r's column k0 */
GA_AI float ga_sx(const armllm_ga_args *a, const float *scale_row, int64_t k0) {
  return scale_row[k0 >> a->act_shift];
}

/* A decode kernel: rows [m0, m0 + mr) of x (mr <= 4) times one panel of
 * type T (all K) onto y columns [n0, n0 + nv) (+ bias). */
typedef void (*armllm_ga_decode_fn)(const armllm_ga_args *a, int64_t m0, const uint8_t *panel,
                                    int64_t n0, int nv);
/* [type index][mr - 1] */
typedef armllm_ga_decode_fn armllm_ga_decode_set[ARMLLM_GA_NTYPES][4];

/* A panel's K block unpacked for a prefill tile: w in the variant's operand
 * order, and per weight group j, in the variant's lane order (SDOT: the 4
 * rows; SMMLA: [c0, c1, c0, c1, c2, c3, c2, c3], the W pairs' operands):
 *   32-element types: d[j], o[j] (f32);
 *   super-block types: s[j] = s_j - s_{j+1} (s past the block's last group
 *     = 0: the tiles sum acc over a whole block, and sum_j A_j (s_j -
 *     s_{j+1}) over the running sums A_j is sum_j s_j * acc_j), o[j] = m_j
 *     (f32, exact), and per super-block b D[b], O[b]. */
typedef struct {
  int8_t w[ARMLLM_GA_KC * ARMLLM_GA_NR] __attribute__((aligned(64)));
  float d[ARMLLM_GA_GROUPS][2 * ARMLLM_GA_NR] __attribute__((aligned(16)));
  float o[ARMLLM_GA_GROUPS][2 * ARMLLM_GA_NR] __attribute__((aligned(16)));
  int32_t s[ARMLLM_GA_GROUPS][2 * ARMLLM_GA_NR] __attribute__((aligned(16)));
  float D[ARMLLM_GA_SUPERS][2 * ARMLLM_GA_NR] __attribute__((aligned(16)));
  float O[ARMLLM_GA_SUPERS][2 * ARMLLM_GA_NR] __attribute__((aligned(16)));
} armllm_ga_panel_k;

/* Unpacks blocks [b0, b0 + nb) of a panel into pk. */
typedef void (*armllm_ga_unpack_fn)(const uint8_t *panel, int64_t b0, int64_t nb,
                                    armllm_ga_panel_k *pk);

/* v's 4 lanes as one of pk's 8-float rows: the 4 rows (SDOT), or as the W
 * pairs' operands [v0, v1, v0, v1, v2, v3, v2, v3] (PAIRS: SMMLA). */
GA_AI void ga_store_lanes(const int PAIRS, float *dst, float32x4_t v) {
  if (!PAIRS) {
    vst1q_f32(dst, v);
    return;
  }
  vst1q_f32(dst, vcombine_f32(vget_low_f32(v), vget_low_f32(v)));
  vst1q_f32(dst + 4, vcombine_f32(vget_high_f32(v), vget_high_f32(v)));
}
GA_AI void ga_store_lanes_s32(const int PAIRS, int32_t *dst, int32x4_t v) {
  if (!PAIRS) {
    vst1q_s32(dst, v);
    return;
  }
  vst1q_s32(dst, vcombine_s32(vget_low_s32(v), vget_low_s32(v)));
  vst1q_s32(dst + 4, vcombine_s32(vget_high_s32(v), vget_high_s32(v)));
}

/* The scales of block b of a panel of type T (header h) into pk, in the
 * lane order of PAIRS (ga_store_lanes), b counted from the K block's start. */
GA_AI void ga_unpack_scales(const int T, const int PAIRS, const uint8_t *h, int64_t b,
                            armllm_ga_panel_k *pk) {
  if (!ga_super(T)) { /* one weight group per block */
    float32x4_t d, o;
    ga_block_scales(T, h, &d, &o);
    ga_store_lanes(PAIRS, pk->d[b], d);
    ga_store_lanes(PAIRS, pk->o[b], o);
    return;
  }
  const int NG = ARMLLM_GGUF_SUPER / ga_group_len(T); /* weight groups per block */
  float32x4_t D, O;
  ga_block_supers(T, h, &D, &O);
  ga_store_lanes(PAIRS, pk->D[b], D);
  ga_store_lanes(PAIRS, pk->O[b], O);
  int32x4_t s, m, s_next, m_next;
  ga_group_ints(T, h, 0, &s, &m);
#pragma GCC unroll 16
  for (int j = 0; j < NG; j++) {
    if (j + 1 < NG) ga_group_ints(T, h, j + 1, &s_next, &m_next);
    else s_next = m_next = vdupq_n_s32(0);
    ga_store_lanes_s32(PAIRS, pk->s[b * NG + j], vsubq_s32(s, s_next));
    ga_store_lanes(PAIRS, pk->o[b * NG + j], vcvtq_f32_s32(m));
    s = s_next, m = m_next;
  }
}

/* The rows of one prefill tile over one K block, as the driver prepares
 * them: x in place (row pointers at the K block; rows past M repeat the
 * last) or, for SMMLA, packed as row-pair operands; per 32-column chunk
 * the scale sx of the activation group holding it; for the types with
 * offsets per weight group b = (float)gs * sx (32-element types) or
 * (float)gs (super-block types: the tile forms msum first), gs the sum of
 * the row's x over the group. */
typedef struct {
  const int8_t *x[ARMLLM_GA_MAX_MR];
  int8_t ap[ARMLLM_GA_KC * ARMLLM_GA_MAX_MR] __attribute__((aligned(64))); /* packed:
      ap[((k / 8) * (MR / 2) + pair) * 16 + 8h + i] = x[2 pair + h, k + i] */
  float sx[ARMLLM_GA_CHUNKS][ARMLLM_GA_MAX_MR] __attribute__((aligned(16)));
  float b[ARMLLM_GA_GROUPS][ARMLLM_GA_MAX_MR] __attribute__((aligned(16))); /* [weight group] */
  /* packed: the same per row pair as SMMLA's rows, [s0, s0, s1, s1] */
  float sxp[ARMLLM_GA_CHUNKS][ARMLLM_GA_MAX_MR / 2][4] __attribute__((aligned(16)));
  float bp[ARMLLM_GA_GROUPS][ARMLLM_GA_MAX_MR / 2][4] __attribute__((aligned(16)));
} armllm_ga_rows;

/* One prefill tile: MR rows x one panel (4 columns) over one K block of kc
 * columns, t onto y (+0 when first; bias added when given: last K block).
 * mv, nv: the valid rows and columns (the rest is not stored). */
typedef struct {
  const armllm_ga_rows *rows;
  const armllm_ga_panel_k *pk;
  int64_t kc;
  float *y;
  int64_t ldy;
  const float *bias;
  int first, mv, nv;
} armllm_ga_tile;

typedef void (*armllm_ga_tile_fn)(const armllm_ga_tile *t);

/* A variant's prefill: its tiles [super-block type][group of 16][offsets]
 * ([0][1][*], 32-element types with 16-column groups, do not exist), rows
 * per tile, x packed as SMMLA pairs or not, and its unpack per type. */
typedef struct {
  armllm_ga_tile_fn tile[2][2][2];
  int mr, pack_x;
  armllm_ga_unpack_fn unpack[ARMLLM_GA_NTYPES];
} armllm_ga_prefill;

size_t armllm_ga_packed_len(int64_t k, int64_t nparts, const int32_t *types, const int64_t *rows);
void armllm_ga_pack(const uint8_t *blocks, int64_t k, int64_t nparts, const int32_t *types,
                    const int64_t *rows, void *packed);
/* gemm_gguf: decode kernels for M <= ARMLLM_GEMM_DECODE_MAX_M (and every M
 * when prefill is NULL: 4-row tiles), else prefill tiles, over the output
 * columns [n0, n1) (gemm_gguf_cols: n0 on a panel of its part, y and bias
 * the window's; the whole call: 0, N). */
void armllm_ga_gemm(armllm_pool *pool, const armllm_ga_args *a, const void *packed_w, int64_t n0,
                    int64_t n1, const armllm_ga_decode_set *decode,
                    const armllm_ga_prefill *prefill);

/* neon/gguf.c's decode kernels (SDOT, or Armv8.0 SMULL), which every Arm
 * variant runs for small M. */
const armllm_ga_decode_set *armllm_neon_gguf_decode(int dot);

#endif /* ARMLLM_GGUF_ARM_H */
