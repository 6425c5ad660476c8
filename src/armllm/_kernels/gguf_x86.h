/* gguf_x86.h: what the GGUF-block GEMMs of both x86 variants (avx2/gguf.c,
 * avx512/gguf.c) share: the packed layout's bookkeeping and its packer (the
 * layout itself is documented in each variant's file: the same bytes with
 * PANEL = 8 or 16 rows), the per-type constants of the kernels, the job and
 * the pool plans. Static functions, so each ISA file compiles them with its
 * own flags; the including file defines PANEL (output rows per panel: one
 * 32-bit lane each, so a vector holds 4 bytes of every row),
 * GGUF_DECODE_STREAMS (panels a decode thread reads at once),
 * GGUF_DECODE_ONE_STREAM() (nonzero: read one at a time instead, on this CPU),
 * GGUF_VF (its float vector type) and GGUF_VF_ZERO (a zero one) first.
 *
 * The packed matrix: the armllm_gguf_parts header (ARMLLM_GGUF_HEADER_BYTES),
 * then each part's panels of PANEL rows (its last one padded with zero
 * values and scales), each panel its chunks of up to GGUF_CHUNK_GROUPS
 * 32-column groups (256 columns: one K-quant super-block, or 8 blocks of a
 * 32-element type), each chunk its values, group by group, then its scales,
 * the chunk padded to a whole vector (GGUF_VEC bytes).
 */
#ifndef ARMLLM_GGUF_X86_H
#define ARMLLM_GGUF_X86_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "armllm_kernels.h"
#include "gguf_blocks.h"
#include "pool.h"
#include "prefetch_x86.h"

#define GGUF_VEC (4 * PANEL)   /* bytes of a vector: 4 bytes of each panel row */
#define GGUF_GROUP 32          /* columns of a values group (= the activation group) */
#define GGUF_CHUNK_GROUPS 8    /* groups per chunk: 256 columns */
#define GGUF_CHUNK_COLS (GGUF_GROUP * GGUF_CHUNK_GROUPS)
#define GGUF_STEPS 8           /* 4-column steps of a group: one vector of bytes each */
#define GGUF_DECODE_MAX_M 8    /* rows up to this take the decode plan (a verify step's k + 1) */
#define GGUF_DECODE_ROWS 4     /* rows a decode pass holds in registers */
_Static_assert(GGUF_DECODE_MAX_M <= 2 * GGUF_DECODE_ROWS, "a decode kernel runs at most 2 passes");
#define GGUF_SUMS_CAP 32768    /* 16-column sums of x a task holds (int16: 64 KiB of stack) */

/* X(type) for each ggml type the kernels specialize code on. */
#define GGUF_TYPES(X)                                                                              \
  X(ARMLLM_GGML_Q4_0) X(ARMLLM_GGML_Q4_1) X(ARMLLM_GGML_Q5_0) X(ARMLLM_GGML_Q5_1)                  \
  X(ARMLLM_GGML_Q8_0) X(ARMLLM_GGML_Q2_K) X(ARMLLM_GGML_Q3_K) X(ARMLLM_GGML_Q4_K)                  \
  X(ARMLLM_GGML_Q5_K) X(ARMLLM_GGML_Q6_K) X(ARMLLM_GGML_IQ4_NL) X(ARMLLM_GGML_IQ4_XS)          \
  X(ARMLLM_GGML_MXFP4)

/* The unsigned operand u = v + bias (u >= 0): the bias each type adds to its
 * values v (gguf_blocks.h's ranges), corrected as -bias * sum(x) in int32. */
static inline int gguf_bias(int type) {
  switch (type) {
  case ARMLLM_GGML_Q4_0: return 8;
  case ARMLLM_GGML_Q5_0: return 16;
  case ARMLLM_GGML_Q3_K: return 4;
  case ARMLLM_GGML_Q6_K: return 32;
  case ARMLLM_GGML_Q8_0: case ARMLLM_GGML_IQ4_NL: case ARMLLM_GGML_IQ4_XS:
  case ARMLLM_GGML_MXFP4:
    return 128;
  default: return 0; /* Q4_1, Q5_1, Q2_K, Q4_K, Q5_K: v >= 0 already */
  }
}

/* Value bytes of one group of a panel, per panel row: 16 (nibbles), + 4 (a
 * bit plane), 8 (2-bit planes), 32 (bytes). */
static inline int64_t gguf_group_row_bytes(int type) {
  switch (type) {
  case ARMLLM_GGML_Q5_0: case ARMLLM_GGML_Q5_1: case ARMLLM_GGML_Q5_K: return 20;
  case ARMLLM_GGML_Q8_0: return 32;
  case ARMLLM_GGML_Q2_K: return 8;
  case ARMLLM_GGML_Q3_K: return 12;
  case ARMLLM_GGML_Q6_K: return 24;
  default: return 16; /* Q4_0, Q4_1, Q4_K, IQ4_NL, IQ4_XS */
  }
}

/* Scale bytes of a chunk of ngr groups, per panel row: f16 d (and m) per
 * group, or the super-block's f16 d (and -dmin) with one small integer per
 * sub-block scale (and min). */
static inline int64_t gguf_scale_row_bytes(int type, int64_t ngr) {
  switch (type) {
  case ARMLLM_GGML_Q4_1: case ARMLLM_GGML_Q5_1: return 4 * ngr;
  case ARMLLM_GGML_Q4_K: case ARMLLM_GGML_Q5_K: return 4 + 8 + 8; /* d, -dmin, sc[8], m[8] */
  case ARMLLM_GGML_Q2_K: return 4 + 16;                           /* d, -dmin, scm[16] */
  case ARMLLM_GGML_Q3_K: case ARMLLM_GGML_Q6_K: return 2 + 16;    /* d, sc[16] */
  case ARMLLM_GGML_IQ4_XS: return 2 + 8;                          /* d, sc[8] */
  case ARMLLM_GGML_MXFP4: return ngr;                             /* e8m0 e */
  default: return 2 * ngr; /* Q4_0, Q5_0, Q8_0, IQ4_NL: d */
  }
}

static inline int64_t gguf_round_vec(int64_t bytes) {
  return (bytes + GGUF_VEC - 1) / GGUF_VEC * GGUF_VEC;
}

/* Bytes of a chunk of ngr groups of a panel. */
static inline int64_t gguf_chunk_bytes(int type, int64_t ngr) {
  const int64_t row_bytes = gguf_group_row_bytes(type) * ngr + gguf_scale_row_bytes(type, ngr);
  return gguf_round_vec(PANEL * row_bytes);
}

static inline int64_t gguf_chunks(int64_t k) { return (k + GGUF_CHUNK_COLS - 1) / GGUF_CHUNK_COLS; }

/* Groups of chunk c (all chunks but a 32-element type's last are whole). */
static inline int64_t gguf_chunk_groups(int64_t k, int64_t c) {
  const int64_t left = k / GGUF_GROUP - c * GGUF_CHUNK_GROUPS;
  return left < GGUF_CHUNK_GROUPS ? left : GGUF_CHUNK_GROUPS;
}

static inline int64_t gguf_panel_bytes(int type, int64_t k) {
  const int64_t whole = k / GGUF_CHUNK_COLS, tail = (k % GGUF_CHUNK_COLS) / GGUF_GROUP;
  return whole * gguf_chunk_bytes(type, GGUF_CHUNK_GROUPS) +
         (tail ? gguf_chunk_bytes(type, tail) : 0);
}

static inline int64_t gguf_panels(int64_t rows) { return (rows + PANEL - 1) / PANEL; }

static inline size_t gguf_packed_len(int64_t k, int64_t nparts, const int32_t *types,
                                     const int64_t *rows) {
  size_t len = ARMLLM_GGUF_HEADER_BYTES;
  for (int64_t i = 0; i < nparts; i++)
    len += (size_t)(gguf_panels(rows[i]) * gguf_panel_bytes(types[i], k));
  return len;
}

/* ------------------------------------------------------------ packing */

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (ggml's get_scale_min_k4). */
static inline void gguf_k4_scale_min(const uint8_t *s, int j, uint8_t *sc, uint8_t *m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (uint8_t)((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
    *m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

/* The 4-bit index of a code book value: IQ4's, or MXFP4's (whose 0 has two
 * codes: either reads 0). */
static inline int gguf_book_index(int type, int8_t v) {
  static const int8_t iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                 1,    13,   25,  38,  53,  69,  89,  113};
  static const int8_t mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  const int8_t *values = type == ARMLLM_GGML_MXFP4 ? mxfp4 : iq4;
  for (int i = 0; i < 16; i++)
    if (values[i] == v) return i;
  return 0;
}

/* Copies an f16 field (2 bytes), negated when neg (the sign bit: exact). */
static inline void gguf_put_f16(uint8_t *dst, const uint8_t *src, int neg) {
  dst[0] = src[0];
  dst[1] = (uint8_t)(src[1] ^ (neg ? 0x80 : 0));
}

/* Values of one group: u[r][0..32) (r < PANEL) into the group's vectors. */
static inline void gguf_put_nibbles(uint8_t *dst, uint8_t u[][GGUF_CHUNK_COLS], int64_t c0) {
  /* vector i, byte 4r + j: column 8i + j in the low nibble, 8i + 4 + j in the high */
  for (int i = 0; i < 4; i++)
    for (int r = 0; r < PANEL; r++)
      for (int j = 0; j < 4; j++)
        dst[i * GGUF_VEC + 4 * r + j] =
            (uint8_t)((u[r][c0 + 8 * i + j] & 15) | (u[r][c0 + 8 * i + 4 + j] & 15) << 4);
}
static inline void gguf_put_plane1(uint8_t *dst, uint8_t u[][GGUF_CHUNK_COLS], int64_t c0, int b) {
  /* byte 4r + j, bit s: bit b of column 4s + j */
  for (int r = 0; r < PANEL; r++)
    for (int j = 0; j < 4; j++) {
      uint8_t h = 0;
      for (int s = 0; s < GGUF_STEPS; s++) h |= (uint8_t)(((u[r][c0 + 4 * s + j] >> b) & 1) << s);
      dst[4 * r + j] = h;
    }
}
static inline void gguf_put_plane2(uint8_t *dst, uint8_t u[][GGUF_CHUNK_COLS], int64_t c0, int b) {
  /* vector i, byte 4r + j, bits 2t, 2t+1: bits b, b+1 of column 4(4i + t) + j */
  for (int i = 0; i < 2; i++)
    for (int r = 0; r < PANEL; r++)
      for (int j = 0; j < 4; j++) {
        uint8_t h = 0;
        for (int t = 0; t < 4; t++)
          h |= (uint8_t)(((u[r][c0 + 4 * (4 * i + t) + j] >> b) & 3) << (2 * t));
        dst[i * GGUF_VEC + 4 * r + j] = h;
      }
}

/* One panel: nrows (<= PANEL) rows of `type` at src (row_bytes apart). */
static void gguf_pack_panel(const uint8_t *src, int64_t nrows, int type, int64_t k, uint8_t *dst) {
  const int be = armllm_gguf_block_elems(type), bb = armllm_gguf_block_bytes(type);
  const size_t row_bytes = armllm_gguf_row_bytes(type, k);
  const int bias = gguf_bias(type), book = type == ARMLLM_GGML_IQ4_NL ||
                                           type == ARMLLM_GGML_IQ4_XS || type == ARMLLM_GGML_MXFP4;
  const int64_t gbytes = PANEL * gguf_group_row_bytes(type);
  for (int64_t c = 0; c < gguf_chunks(k); c++) {
    const int64_t ngr = gguf_chunk_groups(k, c), k0 = c * GGUF_CHUNK_COLS;
    const int64_t cbytes = gguf_chunk_bytes(type, ngr);
    uint8_t u[PANEL][GGUF_CHUNK_COLS];
    int8_t v[ARMLLM_GGUF_MAX_BLOCK];
    float d[ARMLLM_GGUF_MAX_BLOCK / ARMLLM_GGUF_SCALE_COLS]; /* unused: the scales come raw */
    float o[ARMLLM_GGUF_MAX_BLOCK / ARMLLM_GGUF_SCALE_COLS];
    memset(u, 0, sizeof u);
    memset(dst, 0, (size_t)cbytes);
    uint8_t *sc = dst + gbytes * ngr; /* the chunk's scales */
    for (int64_t r = 0; r < nrows; r++) {
      const uint8_t *row = src + (size_t)r * row_bytes;
      for (int64_t e0 = 0; e0 < ngr * GGUF_GROUP; e0 += be) {
        const uint8_t *b = row + (k0 + e0) / be * bb;
        armllm_gguf_decode_block(type, b, v, d, o);
        for (int e = 0; e < be; e++)
          u[r][e0 + e] = (uint8_t)(book ? gguf_book_index(type, v[e]) : v[e] + bias);
      }
      /* scales, row r (the variants' layout), from the block's fields at the
       * byte offsets of gguf_blocks.c's decoder */
      const uint8_t *b = row + k0 / be * bb;
      switch (type) {
      case ARMLLM_GGML_Q4_K: case ARMLLM_GGML_Q5_K:
        gguf_put_f16(sc + 2 * r, b, 0);
        gguf_put_f16(sc + 2 * PANEL + 2 * r, b + 2, 1);
        for (int j = 0; j < 8; j++)
          gguf_k4_scale_min(b + 4, j, &sc[(4 + j) * PANEL + r], &sc[(12 + j) * PANEL + r]);
        break;
      case ARMLLM_GGML_Q2_K:
        gguf_put_f16(sc + 2 * r, b + 80, 0);
        gguf_put_f16(sc + 2 * PANEL + 2 * r, b + 82, 1);
        for (int j = 0; j < 16; j++) sc[(4 + j) * PANEL + r] = b[j];
        break;
      case ARMLLM_GGML_Q3_K:
        gguf_put_f16(sc + 2 * r, b + 108, 0);
        for (int j = 0; j < 16; j++) {
          const int lo = (b[96 + j % 8] >> (4 * (j / 8))) & 15;
          const int hi = (b[96 + 8 + j % 4] >> (2 * (j / 4))) & 3;
          sc[(2 + j) * PANEL + r] = (uint8_t)(int8_t)((lo | hi << 4) - 32);
        }
        break;
      case ARMLLM_GGML_Q6_K:
        gguf_put_f16(sc + 2 * r, b + 208, 0);
        for (int j = 0; j < 16; j++) sc[(2 + j) * PANEL + r] = b[192 + j];
        break;
      case ARMLLM_GGML_IQ4_XS: {
        gguf_put_f16(sc + 2 * r, b, 0);
        const unsigned sh = (unsigned)b[2] | (unsigned)b[3] << 8;
        for (int j = 0; j < 8; j++) {
          const int ls = ((b[4 + j / 2] >> (4 * (j % 2))) & 15) | (int)((sh >> (2 * j)) & 3) << 4;
          sc[(2 + j) * PANEL + r] = (uint8_t)(int8_t)(ls - 32);
        }
        break;
      }
      case ARMLLM_GGML_MXFP4: /* the e8m0 byte of each group */
        for (int64_t g = 0; g < ngr; g++) sc[g * PANEL + r] = row[(k0 / be + g) * bb];
        break;
      default: /* 32-element blocks: d of each group, then m of each */
        for (int64_t g = 0; g < ngr; g++) {
          const uint8_t *bg = row + (k0 / be + g) * bb;
          gguf_put_f16(sc + 2 * (g * PANEL + r), bg, 0);
          if (type == ARMLLM_GGML_Q4_1 || type == ARMLLM_GGML_Q5_1)
            gguf_put_f16(sc + 2 * ((ngr + g) * PANEL + r), bg + 2, 0);
        }
      }
    }
    for (int64_t g = 0; g < ngr; g++) {
      uint8_t *gd = dst + g * gbytes;
      const int64_t c0 = g * GGUF_GROUP;
      switch (type) {
      case ARMLLM_GGML_Q8_0: /* vector s, byte 4r + j: column 4s + j */
        for (int s = 0; s < GGUF_STEPS; s++)
          for (int r = 0; r < PANEL; r++)
            for (int j = 0; j < 4; j++) gd[s * GGUF_VEC + 4 * r + j] = u[r][c0 + 4 * s + j];
        break;
      case ARMLLM_GGML_Q2_K:
        gguf_put_plane2(gd, u, c0, 0);
        break;
      case ARMLLM_GGML_Q3_K:
        gguf_put_plane2(gd, u, c0, 0);
        gguf_put_plane1(gd + 2 * GGUF_VEC, u, c0, 2);
        break;
      case ARMLLM_GGML_Q6_K:
        gguf_put_nibbles(gd, u, c0);
        gguf_put_plane2(gd + 4 * GGUF_VEC, u, c0, 4);
        break;
      case ARMLLM_GGML_Q5_0: case ARMLLM_GGML_Q5_1: case ARMLLM_GGML_Q5_K:
        gguf_put_nibbles(gd, u, c0);
        gguf_put_plane1(gd + 4 * GGUF_VEC, u, c0, 4);
        break;
      default:
        gguf_put_nibbles(gd, u, c0);
      }
    }
    dst += cbytes;
  }
}

static inline void gguf_pack(const uint8_t *blocks, int64_t k, int64_t nparts, const int32_t *types,
                             const int64_t *rows, void *packed) {
  const armllm_gguf_parts parts = armllm_gguf_parts_of(nparts, types, rows);
  uint8_t *dst = packed;
  memset(dst, 0, ARMLLM_GGUF_HEADER_BYTES);
  memcpy(dst, &parts, sizeof parts);
  dst += ARMLLM_GGUF_HEADER_BYTES;
  for (int64_t i = 0; i < nparts; i++) {
    const size_t row_bytes = armllm_gguf_row_bytes(types[i], k);
    const int64_t pbytes = gguf_panel_bytes(types[i], k);
    for (int64_t r0 = 0; r0 < rows[i]; r0 += PANEL, dst += pbytes) {
      const int64_t nrows = rows[i] - r0 < PANEL ? rows[i] - r0 : PANEL;
      gguf_pack_panel(blocks + (size_t)r0 * row_bytes, nrows, types[i], k, dst);
    }
    blocks += (size_t)rows[i] * row_bytes;
  }
}

/* Defines prefix##_gemm_gguf_packed_len and prefix##_gemm_gguf_pack. */
#define ARMLLM_X86_GGUF_PACKING(prefix)                                                         \
  size_t prefix##_gemm_gguf_packed_len(int64_t k, int64_t nparts, const int32_t *types,         \
                                       const int64_t *rows) {                                   \
    return gguf_packed_len(k, nparts, types, rows);                                             \
  }                                                                                             \
  void prefix##_gemm_gguf_pack(const uint8_t *blocks, int64_t k, int64_t nparts,                \
                               const int32_t *types, const int64_t *rows, void *packed) {       \
    gguf_pack(blocks, k, nparts, types, rows, packed);                                          \
  }

/* ------------------------------------------------------------ job */

typedef struct {
  int type;
  int64_t col0;        /* its first output column */
  int64_t rows;        /* its output rows */
  int64_t panel0;      /* its first panel, counted over the whole matrix */
  int64_t panels;
  const uint8_t *w;    /* its first panel */
  int64_t pbytes;      /* bytes per panel */
} gguf_part;

typedef struct {
  const int8_t *xq;
  int64_t m, k, ldq;
  const float *scale;
  int64_t ldsc;
  const int32_t *gsum;
  int64_t ldgs;
  int nparts;
  gguf_part part[ARMLLM_GGUF_MAX_PARTS];
  int64_t panels; /* all parts' */
  const float *bias;
  float *y;
  int64_t ldy;
  int64_t mb, cp, n_pc; /* prefill: rows per block, panels per chunk, chunks */
  int64_t gpa;          /* 32-column groups per activation group: 1, or 8 (G = 256) */
  int sums;             /* G = 256: the kernels read x's 16-column sums (gguf_sums16) */
} gguf_job;

static inline gguf_job gguf_job_of(const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                                   const float *scale, int64_t ldsc, const int32_t *gsum,
                                   int64_t ldgs, const void *packed_w, const float *bias,
                                   float *y, int64_t ldy) {
  const armllm_gguf_parts *hdr = packed_w;
  gguf_job job = {.xq = xq, .m = m, .k = k, .ldq = ldq, .scale = scale, .ldsc = ldsc,
                  .gsum = gsum, .ldgs = ldgs, .nparts = hdr->nparts, .bias = bias, .y = y,
                  .ldy = ldy};
  const uint8_t *w = (const uint8_t *)packed_w + ARMLLM_GGUF_HEADER_BYTES;
  int64_t col = 0, panel = 0;
  for (int i = 0; i < hdr->nparts; i++) {
    gguf_part *p = &job.part[i];
    p->type = hdr->types[i];
    p->col0 = col;
    p->rows = hdr->rows[i];
    p->panel0 = panel;
    p->panels = gguf_panels(p->rows);
    p->w = w;
    p->pbytes = gguf_panel_bytes(p->type, k);
    col += p->rows;
    panel += p->panels;
    w += p->panels * p->pbytes;
  }
  job.panels = panel;
  job.gpa = armllm_gguf_act_group(hdr) / GGUF_GROUP;
  job.sums = job.gpa > 1; /* gsum is then per 256 columns: the sums come from x */
  return job;
}

/* The job narrowed to the columns [n0, n1) (gemm_gguf_cols: n0 on a panel of
 * its part; y and bias the window's): the parts' panels that hold them, cut
 * at n1, their columns counted from n0. */
static inline void gguf_job_window(gguf_job *job, int64_t n0, int64_t n1) {
  int nparts = 0;
  int64_t panel = 0;
  for (int i = 0; i < job->nparts; i++) {
    const gguf_part p = job->part[i];
    const int64_t lo = p.col0 > n0 ? p.col0 : n0, hi = p.col0 + p.rows < n1 ? p.col0 + p.rows : n1;
    if (lo >= hi) continue;
    gguf_part *q = &job->part[nparts++];
    *q = p;
    q->w = p.w + (lo - p.col0) / PANEL * p.pbytes;
    q->col0 = lo - n0;
    q->rows = hi - lo;
    q->panel0 = panel;
    q->panels = gguf_panels(q->rows);
    panel += q->panels;
  }
  job->nparts = nparts;
  job->panels = panel;
}

/* The part that holds panel p (of the whole matrix). */
static inline const gguf_part *gguf_part_of(const gguf_job *job, int64_t p) {
  int i = 0;
  while (i + 1 < job->nparts && p >= job->part[i + 1].panel0) i++;
  return &job->part[i];
}

/* Decode (M <= GGUF_DECODE_MAX_M): memory-bound, so contiguous runs of
 * panels per thread; small matrices stay serial. */
static inline void gguf_run_decode(armllm_pool *pool, gguf_job *job, armllm_task_fn task) {
  double bytes = 0;
  for (int i = 0; i < job->nparts; i++) bytes += (double)job->part[i].panels * job->part[i].pbytes;
  if (bytes < 64.0 * 1024) pool = NULL;
  armllm_pool_run(pool, job->panels, armllm_pool_grain(pool, job->panels, 4, 4), task, job);
}

/* Prefill: row blocks as tall as the stack's t buffer allows (mb_max rows,
 * whole tiles of mr) and, when the kernels read x's 16-column sums, as
 * GGUF_SUMS_CAP allows; evenly cut (every block streams the weights once);
 * about items_per_thread (row block, panel chunk) items a thread, chunks of
 * an even number of panels. */
static inline void gguf_run_prefill(armllm_pool *pool, gguf_job *job, int64_t mb_max, int64_t mr,
                                    int64_t items_per_thread, armllm_task_fn task) {
  const int64_t m = job->m, ns = job->k / 16;
  if ((double)m * (double)job->panels * PANEL * (double)job->k < 4.0e6) pool = NULL;
  if (job->sums && mb_max * ns > GGUF_SUMS_CAP) {
    const int64_t fit = GGUF_SUMS_CAP / ns / mr * mr;
    if (fit >= mr) mb_max = fit;
    else job->sums = 0; /* K of over GGUF_SUMS_CAP / mr sums: the tiles sum x themselves */
  }
  const int64_t n_rb = (m + mb_max - 1) / mb_max;
  job->mb = ((m + n_rb - 1) / n_rb + mr - 1) / mr * mr;
  const int64_t threads = pool ? armllm_pool_threads(pool) : 1;
  int64_t n_pc = (items_per_thread * threads + n_rb - 1) / n_rb;
  const int64_t pairs = (job->panels + 1) / 2;
  n_pc = n_pc > pairs ? pairs : n_pc;
  job->cp = 2 * ((pairs + n_pc - 1) / n_pc);
  job->n_pc = (job->panels + job->cp - 1) / job->cp;
  armllm_pool_run(pool, n_rb * job->n_pc, 1, task, job);
}

/* Sum of the 16 int8 at p. */
static inline int32_t gguf_sum16(const int8_t *p) {
  const __m128i v = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_set1_epi8((char)0x80));
  const __m128i s = _mm_sad_epu8(v, _mm_setzero_si128()); /* two sums of x + 128 over 8 */
  return _mm_cvtsi128_si32(s) + _mm_extract_epi16(s, 4) - 16 * 128;
}

/* The sums of every 16 columns of rows [r0, r1) of x into out (rows k / 16
 * apart; |sum| <= 16 * 127 fits int16): once per decode run or prefill row
 * block, for every panel. */
static inline void gguf_sums16(const gguf_job *job, int64_t r0, int64_t r1, int16_t *out) {
  const int64_t ns = job->k / 16;
  for (int64_t r = r0; r < r1; r++)
    for (int64_t j = 0; j < ns; j++)
      out[(r - r0) * ns + j] = (int16_t)gguf_sum16(job->xq + r * job->ldq + 16 * j);
}

/* The sum of x over columns [16 j, 16 (j + n)) (n = 1 or 2) of row r (row
 * rl of sums, when given): gsum itself for a whole activation group of 32. */
static inline __attribute__((always_inline)) int32_t gguf_xsum(const gguf_job *job,
                                                               const int16_t *sums, int64_t rl,
                                                               int64_t r, int64_t j, int n) {
  if (n == 2 && job->gpa == 1) return job->gsum[r * job->ldgs + j / 2];
  if (sums) {
    const int16_t *s = sums + rl * (job->k / 16) + j;
    return n == 2 ? s[0] + s[1] : s[0];
  }
  const int8_t *x = job->xq + r * job->ldq + 16 * j;
  return n == 2 ? gguf_sum16(x) + gguf_sum16(x + 16) : gguf_sum16(x);
}

/* The sums of columns [16 j, 16 j + 16) and [16 j + 16, 16 j + 32) of row r
 * as the int16 pair of an int32 (low, high): a madd operand. */
static inline __attribute__((always_inline)) int32_t gguf_xpair(const gguf_job *job,
                                                                const int16_t *sums, int64_t rl,
                                                                int64_t r, int64_t j) {
  int32_t v;
  if (sums) {
    memcpy(&v, sums + rl * (job->k / 16) + j, sizeof v);
    return v;
  }
  const int8_t *x = job->xq + r * job->ldq + 16 * j;
  return (int32_t)((uint32_t)(uint16_t)gguf_sum16(x) | (uint32_t)(uint16_t)gguf_sum16(x + 16) << 16);
}

/* The sums of columns [16 j, 16 j + 32) and [16 j + 32, 16 j + 64) of row r
 * as the int16 pair of an int32 (low, high; |sum| <= 32 * 127 fits): a
 * madd / dpwssd operand. */
static inline __attribute__((always_inline)) int32_t gguf_xpair32(const gguf_job *job,
                                                                  const int16_t *sums, int64_t rl,
                                                                  int64_t r, int64_t j) {
  const int32_t lo = gguf_xsum(job, sums, rl, r, j, 2), hi = gguf_xsum(job, sums, rl, r, j + 2, 2);
  return (int32_t)((uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16);
}

/* The int16 pairs of a super-block's linear term (its mins, or Q3_K's and
 * Q6_K's sub-scales for their bias): Q4_K and Q5_K (gl 32, offsets) have one
 * min per 32 columns, so 4 pairs of 32-column groups; the others 8 pairs of
 * 16-column groups. */
static inline int gguf_lin_pairs(int gl, int offs) {
  return offs && gl == 32 ? GGUF_CHUNK_GROUPS / 2 : GGUF_CHUNK_GROUPS;
}

/* x's sum pair i of the super-block starting at 16-column group j0 of row r
 * (row rl of sums), grouped as gguf_lin_pairs pairs the weights. */
static inline __attribute__((always_inline)) int32_t gguf_lin_xpair(int gl, int offs,
                                                                    const gguf_job *job,
                                                                    const int16_t *sums,
                                                                    int64_t rl, int64_t r,
                                                                    int64_t j0, int i) {
  return gguf_lin_pairs(gl, offs) < GGUF_CHUNK_GROUPS ? gguf_xpair32(job, sums, rl, r, j0 + 4 * i)
                                                      : gguf_xpair(job, sums, rl, r, j0 + 2 * i);
}

/* The activation scale of 32-column group g of row r. */
static inline __attribute__((always_inline)) float gguf_sx(const gguf_job *job, int64_t r,
                                                           int64_t g) {
  return job->scale[r * job->ldsc + g / job->gpa];
}

/* ------------------------------------------------------------ decode plan */

/* A decode pass's t: [stream][row of the pass]. */
typedef GGUF_VF gguf_decode_t[GGUF_DECODE_STREAMS][GGUF_DECODE_ROWS];

/* A chunk's groups unpacked by a decode kernel's first pass for its second:
 * [stream][group][step], GGUF_VEC bytes each (at most 8 KiB). */
typedef struct {
  uint8_t u[GGUF_DECODE_STREAMS][GGUF_CHUNK_GROUPS][GGUF_STEPS][GGUF_VEC]
      __attribute__((aligned(64)));
} gguf_decode_u;

/* What a decode pass over a chunk does with its groups' bytes. */
enum {
  GGUF_PASS_ONLY,   /* the only pass: unpacks into registers, prefetching ahead */
  GGUF_PASS_KEEP,   /* the first of two: the same, and keeps them in L1 (gguf_decode_u) */
  GGUF_PASS_REUSE,  /* the second: reads the kept bytes back */
  GGUF_PASS_AGAIN,  /* the second, of a type that unpacks cheaply: unpacks again */
};

/* Types whose groups unpack with a few loads and ANDs: a second pass unpacks
 * them again (from L1) rather than keep them (8 vector stores a group). */
static inline int gguf_cheap_unpack(int type) {
  return type == ARMLLM_GGML_Q4_0 || type == ARMLLM_GGML_Q4_1 || type == ARMLLM_GGML_Q4_K ||
         type == ARMLLM_GGML_Q8_0 || type == ARMLLM_GGML_Q2_K;
}

/* The including file's decode kernel: rows r0 .. r0 + mr (mr <= GGUF_DECODE_ROWS)
 * of x times np panels over chunk c (w[q]: panel q's chunk, np memory streams
 * read in lockstep), t of those rows in and out, the groups' bytes as `pass`
 * says (ub: the kept ones). The type, mr, np and pass are constants after
 * inlining. */
static inline __attribute__((always_inline)) void decode_chunk(
    const int type, const int mr, const int np, const int pass, const gguf_job *job,
    const uint8_t *const *w, int64_t c, int64_t r0, const int16_t *sums, gguf_decode_u *ub,
    gguf_decode_t t);

/* The including file's y rows r0 .. r0 + mr = t (+ bias), masked to N, for np
 * panels (p, p + stride, ...) of part. */
static inline __attribute__((always_inline)) void decode_store(
    const int mr, const int np, const gguf_job *job, const gguf_part *part, int64_t p,
    int64_t stride, int64_t r0, gguf_decode_t t);

/* Decode: rows 0 .. mr (all M) of np panels (p, p + stride, ...) over the
 * whole of K in lockstep, each group unpacked into registers and met by every
 * row of a pass at once (no trip through L1). Up to GGUF_DECODE_ROWS rows are
 * one pass, t in registers throughout; more (a speculative verify step) are
 * two passes over each chunk, the second while the chunk is in L1 (it reads
 * the bytes the first kept, or unpacks again: GGUF_PASS_*), so the weights
 * come from memory once; t waits in memory between chunks (2 * np * mr loads
 * and stores a chunk, beside 64 * np * mr dot products). */
static inline __attribute__((always_inline)) void decode_panels(
    const int type, const int mr, const int np, const gguf_job *job, const gguf_part *part,
    int64_t p, int64_t stride, const int16_t *sums) {
  const int m0 = mr < GGUF_DECODE_ROWS ? mr : GGUF_DECODE_ROWS, m1 = mr - m0; /* each pass's rows */
  const uint8_t *w[GGUF_DECODE_STREAMS];
  gguf_decode_t t[2];
  gguf_decode_t *tp = t;
  gguf_decode_u ub; /* two passes only */
  if (m1) __asm__("" : "+r"(tp)); /* opaque: t stays in memory, not spilled in the loops */
  for (int q = 0; q < np; q++) {
    w[q] = part->w + (p + q * stride - part->panel0) * part->pbytes;
    for (int r = 0; r < m0; r++) tp[0][q][r] = GGUF_VF_ZERO();
    for (int r = 0; r < m1; r++) tp[1][q][r] = GGUF_VF_ZERO();
  }
  const int keep = m1 && !gguf_cheap_unpack(type);
  for (int64_t c = 0; c < gguf_chunks(job->k); c++) {
    decode_chunk(type, m0, np, keep ? GGUF_PASS_KEEP : GGUF_PASS_ONLY, job, w, c, 0, sums, &ub,
                 tp[0]);
    if (m1)
      decode_chunk(type, m1, np, keep ? GGUF_PASS_REUSE : GGUF_PASS_AGAIN, job, w, c,
                   GGUF_DECODE_ROWS, sums, &ub, tp[1]);
    const int64_t cbytes = gguf_chunk_bytes(type, gguf_chunk_groups(job->k, c));
    for (int q = 0; q < np; q++) w[q] += cbytes;
  }
  decode_store(m0, np, job, part, p, stride, 0, tp[0]);
  if (m1) decode_store(m1, np, job, part, p, stride, GGUF_DECODE_ROWS, tp[1]);
}

/* Panels [p0, p1) of one part at mr rows: GGUF_DECODE_STREAMS equal runs in
 * lockstep (one hardware-prefetch stream each, as the read probe reads: a
 * single stream left a core's memory pipe a fifth idle), the rest one by one;
 * all one by one where GGUF_DECODE_ONE_STREAM() (the including file's: a CPU
 * that reads faster so). */
static inline __attribute__((always_inline)) void gguf_decode_streams(
    const int type, const int mr, const gguf_job *job, const gguf_part *part, int64_t p0,
    int64_t p1, const int16_t *sums) {
  const int64_t len = GGUF_DECODE_ONE_STREAM() ? 0 : (p1 - p0) / GGUF_DECODE_STREAMS;
  for (int64_t i = 0; i < len; i++)
    decode_panels(type, mr, GGUF_DECODE_STREAMS, job, part, p0 + i, len, sums);
  for (int64_t p = p0 + GGUF_DECODE_STREAMS * len; p < p1; p++)
    decode_panels(type, mr, 1, job, part, p, 0, sums);
}

/* Panels [p0, p1) of one part, its type and M made constants. */
static inline __attribute__((always_inline)) void gguf_decode_run(
    const int type, const gguf_job *job, const gguf_part *part, int64_t p0, int64_t p1,
    const int16_t *sums) {
  switch (job->m) {
  case 1: gguf_decode_streams(type, 1, job, part, p0, p1, sums); break;
  case 2: gguf_decode_streams(type, 2, job, part, p0, p1, sums); break;
  case 3: gguf_decode_streams(type, 3, job, part, p0, p1, sums); break;
  case 4: gguf_decode_streams(type, 4, job, part, p0, p1, sums); break;
  case 5: gguf_decode_streams(type, 5, job, part, p0, p1, sums); break;
  case 6: gguf_decode_streams(type, 6, job, part, p0, p1, sums); break;
  case 7: gguf_decode_streams(type, 7, job, part, p0, p1, sums); break;
  default: gguf_decode_streams(type, 8, job, part, p0, p1, sums); break;
  }
}

/* The decode task (gguf_run_decode): panels [p0, p1), a part's run at a time. */
static void gguf_decode_task(void *ctx, int64_t p0, int64_t p1) {
  const gguf_job *job = ctx;
  int16_t sums[GGUF_SUMS_CAP];
  const int16_t *hv = NULL; /* x's 16-column sums, once for all the run's panels */
  if (job->sums && job->m * (job->k / 16) <= GGUF_SUMS_CAP) {
    gguf_sums16(job, 0, job->m, sums);
    hv = sums;
  }
  while (p0 < p1) {
    const gguf_part *part = gguf_part_of(job, p0);
    const int64_t end = part->panel0 + part->panels < p1 ? part->panel0 + part->panels : p1;
#define GGUF_TYPE_CASE(t)                                                                          \
  case t: gguf_decode_run(t, job, part, p0, end, hv); break;
    switch (part->type) {
    GGUF_TYPES(GGUF_TYPE_CASE)
    default: break;
    }
#undef GGUF_TYPE_CASE
    p0 = end;
  }
}

#endif /* ARMLLM_GGUF_X86_H */
