/* gguf_blocks.c: the GGUF block decoders of gguf_blocks.h, in portable C.
 * Each follows ggml's block struct and element order (ggml-quants.c's
 * dequantize_row_*); the tests check every type against the gguf package. */
#include "gguf_blocks.h"

#include <string.h>

/* IQ4_NL / IQ4_XS code book: the int8 value of each 4-bit index. */
static const int8_t IQ4_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};
/* MXFP4: e2m1 codes doubled (0.5 -> 1, 6 -> 12), sign in bit 3. */
static const int8_t MXFP4_VALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* IEEE half -> float, exact (subnormals, infinities and NaNs included). */
static float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0x1fu) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp) {
    bits = sign | ((exp + 112u) << 23) | (man << 13); /* rebias 15 -> 127 */
  } else if (man) {
    int shift = 0; /* subnormal: normalize the mantissa */
    while (!(man & 0x400u)) man <<= 1, shift++;
    bits = sign | ((uint32_t)(113 - shift) << 23) | ((man & 0x3ffu) << 13);
  } else {
    bits = sign;
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static float f16_at(const uint8_t *p) { return f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

int armllm_gguf_block_elems(int type) {
  switch (type) {
  case ARMLLM_GGML_Q4_0: case ARMLLM_GGML_Q4_1: case ARMLLM_GGML_Q5_0: case ARMLLM_GGML_Q5_1:
  case ARMLLM_GGML_Q8_0: case ARMLLM_GGML_IQ4_NL: case ARMLLM_GGML_MXFP4:
    return 32;
  case ARMLLM_GGML_Q2_K: case ARMLLM_GGML_Q3_K: case ARMLLM_GGML_Q4_K: case ARMLLM_GGML_Q5_K:
  case ARMLLM_GGML_Q6_K: case ARMLLM_GGML_IQ4_XS:
    return 256;
  default:
    return 0;
  }
}

int armllm_gguf_block_bytes(int type) {
  switch (type) {
  case ARMLLM_GGML_Q4_0: return 18;   /* d, qs[16] */
  case ARMLLM_GGML_Q4_1: return 20;   /* d, m, qs[16] */
  case ARMLLM_GGML_Q5_0: return 22;   /* d, qh[4], qs[16] */
  case ARMLLM_GGML_Q5_1: return 24;   /* d, m, qh[4], qs[16] */
  case ARMLLM_GGML_Q8_0: return 34;   /* d, qs[32] */
  case ARMLLM_GGML_Q2_K: return 84;   /* scales[16], qs[64], d, dmin */
  case ARMLLM_GGML_Q3_K: return 110;  /* hmask[32], qs[64], scales[12], d */
  case ARMLLM_GGML_Q4_K: return 144;  /* d, dmin, scales[12], qs[128] */
  case ARMLLM_GGML_Q5_K: return 176;  /* d, dmin, scales[12], qh[32], qs[128] */
  case ARMLLM_GGML_Q6_K: return 210;  /* ql[128], qh[64], scales[16], d */
  case ARMLLM_GGML_IQ4_NL: return 18; /* d, qs[16] */
  case ARMLLM_GGML_IQ4_XS: return 136; /* d, scales_h (u16), scales_l[4], qs[128] */
  case ARMLLM_GGML_MXFP4: return 17;   /* e, qs[16] */
  default: return 0;
  }
}

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j from the 12 packed bytes. */
static void k4_scale_min(const uint8_t *s, int j, int *sc, int *m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

/* Writes one 32-column group's scale (and offset) into both 16-column slots. */
static void put32(float *d, float *o, int g, float dv, float ov) {
  d[2 * g] = d[2 * g + 1] = dv;
  o[2 * g] = o[2 * g + 1] = ov;
}

void armllm_gguf_decode_super(int type, const uint8_t *b, int8_t *v, int16_t *s16, int16_t *m,
                              float *D, float *O) {
  *D = *O = 0.0f;
  memset(m, 0, 16 * sizeof *m);
  switch (type) {
  case ARMLLM_GGML_Q2_K: {
    const uint8_t *sc = b, *qs = b + 16;
    *D = f16_at(b + 80), *O = -f16_at(b + 82);
    /* element e: byte (e/128)*32 + e%32 of qs, bits 2*((e%128)/32) */
    for (int e = 0; e < 256; e++)
      v[e] = (int8_t)((qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3);
    for (int j = 0; j < 16; j++) s16[j] = (int16_t)(sc[j] & 15), m[j] = (int16_t)(sc[j] >> 4);
    return;
  }
  case ARMLLM_GGML_Q3_K: {
    const uint8_t *hm = b, *qs = b + 32, *s = b + 96;
    *D = f16_at(b + 108);
    /* element e: low 2 bits as Q2_K's; hmask bit e/32 of byte e%32 set = no -4 */
    for (int e = 0; e < 256; e++) {
      const int lo = (qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
      const int h = (hm[e % 32] >> (e / 32)) & 1;
      v[e] = (int8_t)(lo - (h ? 0 : 4));
    }
    /* 16 6-bit scales: low nibbles from bytes 0..7 (j < 8 low, j >= 8 high),
     * high 2 bits from bytes 8..11 (byte 8 + j%4, bits 2*(j/4)) */
    for (int j = 0; j < 16; j++) {
      const int lo = (s[j % 8] >> (4 * (j / 8))) & 15;
      const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
      s16[j] = (int16_t)((lo | hi << 4) - 32);
    }
    return;
  }
  case ARMLLM_GGML_Q4_K:
  case ARMLLM_GGML_Q5_K: {
    const int q5 = type == ARMLLM_GGML_Q5_K;
    *D = f16_at(b), *O = -f16_at(b + 2);
    const uint8_t *s = b + 4, *qh = b + 16, *qs = b + (q5 ? 48 : 16);
    /* element e: byte (e/64)*32 + e%32 of qs, high nibble when (e%64) >= 32;
     * Q5_K's fifth bit is bit e/32 of qh[e%32] */
    for (int e = 0; e < 256; e++) {
      int q = (qs[(e / 64) * 32 + e % 32] >> (4 * ((e % 64) / 32))) & 15;
      if (q5) q |= ((qh[e % 32] >> (e / 32)) & 1) << 4;
      v[e] = (int8_t)q;
    }
    for (int j = 0; j < 8; j++) {
      int sc, mn;
      k4_scale_min(s, j, &sc, &mn);
      s16[2 * j] = s16[2 * j + 1] = (int16_t)sc;
      m[2 * j] = m[2 * j + 1] = (int16_t)mn;
    }
    return;
  }
  case ARMLLM_GGML_Q6_K: {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    *D = f16_at(b + 208);
    /* element e: low nibble from ql[(e/128)*64 + e%64] (high nibble when
     * (e%128) >= 64), high 2 bits from qh[(e/128)*32 + e%32] at 2*((e%128)/32) */
    for (int e = 0; e < 256; e++) {
      const int lo = (ql[(e / 128) * 64 + e % 64] >> (4 * ((e % 128) / 64))) & 15;
      const int hi = (qh[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
      v[e] = (int8_t)((lo | hi << 4) - 32);
    }
    for (int j = 0; j < 16; j++) s16[j] = sc[j];
    return;
  }
  case ARMLLM_GGML_IQ4_XS: {
    *D = f16_at(b);
    const unsigned sh = (unsigned)b[2] | (unsigned)b[3] << 8;
    const uint8_t *sl = b + 4, *qs = b + 8;
    for (int j = 0; j < 8; j++) {
      const int ls = ((sl[j / 2] >> (4 * (j % 2))) & 15) | (int)((sh >> (2 * j)) & 3) << 4;
      s16[2 * j] = s16[2 * j + 1] = (int16_t)(ls - 32);
      /* sub-block j: 16 bytes, low nibbles elements 0..15, high 16..31 */
      for (int i = 0; i < 16; i++) {
        v[32 * j + i] = IQ4_VALUES[qs[16 * j + i] & 15];
        v[32 * j + i + 16] = IQ4_VALUES[qs[16 * j + i] >> 4];
      }
    }
    return;
  }
  default:
    return;
  }
}

void armllm_gguf_decode_block(int type, const uint8_t *b, int8_t *v, float *d, float *o) {
  switch (type) {
  case ARMLLM_GGML_Q4_0:
  case ARMLLM_GGML_IQ4_NL: {
    /* low nibbles are elements 0..15, high nibbles 16..31 */
    for (int i = 0; i < 16; i++) {
      const int lo = b[2 + i] & 15, hi = b[2 + i] >> 4;
      v[i] = (int8_t)(type == ARMLLM_GGML_Q4_0 ? lo - 8 : IQ4_VALUES[lo]);
      v[i + 16] = (int8_t)(type == ARMLLM_GGML_Q4_0 ? hi - 8 : IQ4_VALUES[hi]);
    }
    put32(d, o, 0, f16_at(b), 0.0f);
    return;
  }
  case ARMLLM_GGML_Q4_1:
    for (int i = 0; i < 16; i++) v[i] = (int8_t)(b[4 + i] & 15), v[i + 16] = (int8_t)(b[4 + i] >> 4);
    put32(d, o, 0, f16_at(b), f16_at(b + 2));
    return;
  case ARMLLM_GGML_Q5_0:
  case ARMLLM_GGML_Q5_1: {
    const int off = type == ARMLLM_GGML_Q5_1 ? 2 : 0; /* Q5_1's m after d */
    const uint8_t *qh = b + 2 + off, *qs = b + 6 + off;
    const uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
                       (uint32_t)qh[3] << 24; /* bit e: element e's fifth bit */
    const int bias = type == ARMLLM_GGML_Q5_0 ? 16 : 0;
    for (int i = 0; i < 16; i++) {
      v[i] = (int8_t)(((qs[i] & 15) | ((h >> i) & 1) << 4) - bias);
      v[i + 16] = (int8_t)(((qs[i] >> 4) | ((h >> (i + 16)) & 1) << 4) - bias);
    }
    put32(d, o, 0, f16_at(b), off ? f16_at(b + 2) : 0.0f);
    return;
  }
  case ARMLLM_GGML_Q8_0:
    memcpy(v, b + 2, 32);
    put32(d, o, 0, f16_at(b), 0.0f);
    return;
  case ARMLLM_GGML_Q2_K: case ARMLLM_GGML_Q3_K: case ARMLLM_GGML_Q4_K: case ARMLLM_GGML_Q5_K:
  case ARMLLM_GGML_Q6_K: case ARMLLM_GGML_IQ4_XS: {
    int16_t sj[16], mj[16];
    float dd, od;
    armllm_gguf_decode_super(type, b, v, sj, mj, &dd, &od);
    for (int j = 0; j < 16; j++) d[j] = dd * (float)sj[j], o[j] = od * (float)mj[j]; /* exact */
    return;
  }
  case ARMLLM_GGML_MXFP4: {
    /* low nibbles are elements 0..15, high nibbles 16..31 (as Q4_0) */
    for (int i = 0; i < 16; i++) {
      v[i] = MXFP4_VALUES[b[1 + i] & 15];
      v[i + 16] = MXFP4_VALUES[b[1 + i] >> 4];
    }
    const uint32_t bits = armllm_mxfp4_d_bits(b[0]);
    float dv;
    memcpy(&dv, &bits, sizeof dv);
    put32(d, o, 0, dv, 0.0f);
    return;
  }
  default:
    return;
  }
}

void armllm_gguf_dequant_rows(int type, const uint8_t *src, int64_t rows, int64_t k, float *out,
                              int64_t ldo) {
  const int be = armllm_gguf_block_elems(type), bb = armllm_gguf_block_bytes(type);
  int8_t v[ARMLLM_GGUF_MAX_BLOCK];
  float d[ARMLLM_GGUF_MAX_BLOCK / ARMLLM_GGUF_SCALE_COLS];
  float o[ARMLLM_GGUF_MAX_BLOCK / ARMLLM_GGUF_SCALE_COLS];
  if (!be) return;
  const int has_o = armllm_gguf_has_offsets(type);
  for (int64_t r = 0; r < rows; r++) {
    const uint8_t *row = src + (size_t)r * armllm_gguf_row_bytes(type, k);
    for (int64_t b0 = 0; b0 < k; b0 += be) {
      armllm_gguf_decode_block(type, row + (b0 / be) * bb, v, d, o);
      float *dst = out + r * ldo + b0;
      for (int e = 0; e < be; e++) {
        const float w = d[e / ARMLLM_GGUF_SCALE_COLS] * (float)v[e]; /* exact */
        dst[e] = has_o ? w + o[e / ARMLLM_GGUF_SCALE_COLS] : w;
      }
    }
  }
}

int64_t armllm_gguf_embed(armllm_pool *pool, const int32_t *ids, int64_t t, const uint8_t *table,
                          int type, int64_t vocab, int64_t d, float *out, int64_t ldo) {
  (void)pool; /* a gather of T rows is short: one thread */
  for (int64_t i = 0; i < t; i++)
    if (ids[i] < 0 || ids[i] >= vocab) return i;
  const size_t row_bytes = armllm_gguf_row_bytes(type, d);
  for (int64_t i = 0; i < t; i++)
    armllm_gguf_dequant_rows(type, table + (size_t)ids[i] * row_bytes, 1, d, out + i * ldo, ldo);
  return -1;
}

int armllm_gguf_parts_check(int64_t k, int64_t nparts, const int32_t *types, const int64_t *rows) {
  if (k < 1 || nparts < 1 || nparts > ARMLLM_GGUF_MAX_PARTS) return -1;
  for (int64_t i = 0; i < nparts; i++) {
    const int be = armllm_gguf_block_elems(types[i]);
    if (!be || k % be || rows[i] < 1) return -1;
  }
  return 0;
}

armllm_gguf_parts armllm_gguf_parts_of(int64_t nparts, const int32_t *types, const int64_t *rows) {
  armllm_gguf_parts p;
  memset(&p, 0, sizeof p);
  p.nparts = (int32_t)nparts;
  for (int64_t i = 0; i < nparts; i++) p.types[i] = types[i], p.rows[i] = rows[i];
  return p;
}
