/* gguf_arm.c: the GGUF-block GEMM driver every Arm variant runs (see
 * gguf_arm.h): packing GGUF blocks into the layout "gguf-arm-p4", and the
 * GEMM's work loops. Decode (small M) items are panels, each run by a
 * decode kernel straight from the packed blocks (all K, t in registers).
 * Prefill items are (up to ARMLLM_GA_PG panels of one part) x (an M chunk
 * of ARMLLM_GA_MC rows): per K block of ARMLLM_GA_KC columns the panels are
 * unpacked to int8 once (the variant's operand order) and every M tile of
 * the chunk runs the variant's tile over them; t stays in y between K
 * blocks. Items partition the outputs, so any thread count gives the same
 * bits. Built at the Armv8.0 baseline (the neon library): the kernels it
 * calls carry their own ISA. */
#include "gguf_arm.h"

#include "gemm_plan.h"

#define NR ARMLLM_GA_NR
#define KC ARMLLM_GA_KC
#define MC ARMLLM_GA_MC
#define PG ARMLLM_GA_PG
#define ALIGN 64 /* each part's panels start on a cache line */

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ----------------------------------------------------------- packing */

static float f16_bits_to_f32(uint16_t h) { /* exact (FCVTL) */
  return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}
static uint16_t u16_at(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

static size_t part_bytes(int type, int64_t k, int64_t rows) {
  const size_t b = (size_t)((rows + NR - 1) / NR) * (size_t)(k / ga_elems(type)) *
                   (size_t)ga_pb(type);
  return (b + ALIGN - 1) / ALIGN * ALIGN;
}

size_t armllm_ga_packed_len(int64_t k, int64_t nparts, const int32_t *types, const int64_t *rows) {
  size_t len = ARMLLM_GGUF_HEADER_BYTES;
  for (int64_t p = 0; p < nparts; p++) len += part_bytes(types[p], k, rows[p]);
  return len;
}

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (gguf_blocks.c's). */
static void k4_scale_min(const uint8_t *s, int j, int *sc, int *m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

/* The scale header's entries of row r from its GGUF block blk. */
static void pack_header(int type, const uint8_t *blk, int r, uint8_t *h) {
  float *d = (float *)(void *)h, *dmin = d + NR; /* f32 supers: d[4], then dmin[4] */
  switch (type) {
  case ARMLLM_GGML_Q4_1: case ARMLLM_GGML_Q5_1:
    memcpy(h + 8 + 2 * r, blk + 2, 2); /* m f16 */
    /* fall through */
  case ARMLLM_GGML_Q4_0: case ARMLLM_GGML_Q5_0: case ARMLLM_GGML_Q8_0: case ARMLLM_GGML_IQ4_NL:
    memcpy(h + 2 * r, blk, 2); /* d f16 */
    return;
  case ARMLLM_GGML_MXFP4:
    h[r] = blk[0]; /* e8m0 e */
    return;
  case ARMLLM_GGML_Q2_K:
    d[r] = f16_bits_to_f32(u16_at(blk + 80));
    dmin[r] = f16_bits_to_f32(u16_at(blk + 82));
    for (int j = 0; j < 16; j++) h[32 + 4 * j + r] = blk[j]; /* scale | min << 4 */
    return;
  case ARMLLM_GGML_Q3_K: {
    const uint8_t *s = blk + 96;
    d[r] = f16_bits_to_f32(u16_at(blk + 108));
    for (int j = 0; j < 16; j++) { /* 6-bit scales as in gguf_blocks.c, minus 32 */
      const int lo = (s[j % 8] >> (4 * (j / 8))) & 15, hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
      h[16 + 4 * j + r] = (uint8_t)(int8_t)((lo | hi << 4) - 32);
    }
    return;
  }
  case ARMLLM_GGML_Q4_K: case ARMLLM_GGML_Q5_K:
    d[r] = f16_bits_to_f32(u16_at(blk));
    dmin[r] = f16_bits_to_f32(u16_at(blk + 2));
    for (int j = 0; j < 8; j++) {
      int sc, m;
      k4_scale_min(blk + 4, j, &sc, &m);
      h[32 + 4 * j + r] = (uint8_t)sc;
      h[64 + 4 * j + r] = (uint8_t)m;
    }
    return;
  case ARMLLM_GGML_Q6_K:
    d[r] = f16_bits_to_f32(u16_at(blk + 208));
    for (int j = 0; j < 16; j++) h[16 + 4 * j + r] = blk[192 + j]; /* int8 scales */
    return;
  case ARMLLM_GGML_IQ4_XS: {
    const unsigned sh = u16_at(blk + 2);
    d[r] = f16_bits_to_f32(u16_at(blk));
    for (int j = 0; j < 8; j++) {
      const int ls = ((blk[4 + j / 2] >> (4 * (j % 2))) & 15) | (int)((sh >> (2 * j)) & 3) << 4;
      h[16 + 4 * j + r] = (uint8_t)(int8_t)(ls - 32);
    }
    return;
  }
  default:
    return;
  }
}

/* The unsigned value stored for element value v: v + the type's bias, or
 * the IQ4 index of v. */
static uint8_t stored_q(int type, int8_t v) {
  switch (type) {
  case ARMLLM_GGML_Q4_0: return (uint8_t)(v + 8);
  case ARMLLM_GGML_Q5_0: return (uint8_t)(v + 16);
  case ARMLLM_GGML_Q3_K: return (uint8_t)(v + 4);
  case ARMLLM_GGML_Q6_K: return (uint8_t)(v + 32);
  case ARMLLM_GGML_IQ4_NL: case ARMLLM_GGML_IQ4_XS:
    for (uint8_t i = 0; i < 16; i++)
      if (armllm_ga_iq4_values[i] == v) return i;
    return 0;
  case ARMLLM_GGML_MXFP4: /* 0 has two codes: either reads 0 */
    for (uint8_t i = 0; i < 16; i++)
      if (armllm_ga_mxfp4_values[i] == v) return i;
    return 0;
  default: return (uint8_t)v;
  }
}

/* One row's values (gguf_arm.h's planes) from its decoded block. */
static void pack_values(int type, const int8_t *v, uint8_t *rv) {
  const int e = ga_elems(type);
  uint8_t q[ARMLLM_GGUF_MAX_BLOCK];
  for (int i = 0; i < e; i++) q[i] = stored_q(type, v[i]);
  if (type == ARMLLM_GGML_Q8_0) {
    memcpy(rv, v, 32);
    return;
  }
  if (type == ARMLLM_GGML_Q2_K || type == ARMLLM_GGML_Q3_K) { /* p2 (+ h1 for Q3_K) */
    for (int i = 0; i < e; i++) {
      const int vec = i / 16, el = i % 16;
      rv[16 * (vec / 4) + el] |= (uint8_t)((q[i] & 3) << (2 * (vec % 4)));
      if (type == ARMLLM_GGML_Q3_K)
        rv[64 + 16 * (vec / 8) + el] |= (uint8_t)(((q[i] >> 2) & 1) << (vec % 8));
    }
    return;
  }
  const int qh = type == ARMLLM_GGML_Q5_0 || type == ARMLLM_GGML_Q5_1 ? 4 : 0; /* Q5_0/1's qh */
  for (int i = 0; i < e; i++) {
    const int c = i / 32, el = i % 32, vec = i / 16;
    rv[qh + 16 * c + el % 16] |= (uint8_t)((q[i] & 15) << (el < 16 ? 0 : 4));
    if (qh) rv[i / 8] |= (uint8_t)(((q[i] >> 4) & 1) << (i % 8));
    if (type == ARMLLM_GGML_Q5_K) rv[128 + 16 * (vec / 8) + i % 16] |= (uint8_t)(((q[i] >> 4) & 1) << (vec % 8));
    if (type == ARMLLM_GGML_Q6_K) rv[128 + 16 * (vec / 4) + i % 16] |= (uint8_t)(((q[i] >> 4) & 3) << (2 * (vec % 4)));
  }
}

void armllm_ga_pack(const uint8_t *blocks, int64_t k, int64_t nparts, const int32_t *types,
                    const int64_t *rows, void *packed) {
  const armllm_gguf_parts parts = armllm_gguf_parts_of(nparts, types, rows);
  memset(packed, 0, armllm_ga_packed_len(k, nparts, types, rows));
  memcpy(packed, &parts, sizeof parts);
  uint8_t *dst = (uint8_t *)packed + ARMLLM_GGUF_HEADER_BYTES;
  int8_t v[ARMLLM_GGUF_MAX_BLOCK];
  float d[ARMLLM_GGUF_MAX_BLOCK / ARMLLM_GGUF_SCALE_COLS], o[ARMLLM_GGUF_MAX_BLOCK / ARMLLM_GGUF_SCALE_COLS];
  for (int64_t p = 0; p < nparts; p++) {
    const int type = types[p], e = ga_elems(type), bb = armllm_gguf_block_bytes(type);
    const int64_t nblk = k / e, rb = (int64_t)armllm_gguf_row_bytes(type, k);
    uint8_t *pb = dst;
    for (int64_t r0 = 0; r0 < rows[p]; r0 += NR)
      for (int64_t b = 0; b < nblk; b++, pb += ga_pb(type))
        for (int r = 0; r < NR && r0 + r < rows[p]; r++) {
          const uint8_t *blk = blocks + (r0 + r) * rb + b * bb;
          pack_header(type, blk, r, pb);
          armllm_gguf_decode_block(type, blk, v, d, o);
          pack_values(type, v, pb + ga_hb(type) + r * ga_ub(type));
        }
    blocks += rows[p] * rb;
    dst += part_bytes(type, k, rows[p]);
  }
}

/* ------------------------------------------------------------ driver */

typedef struct {
  int type, ti;
  int64_t n0, rows, panels, pstride, groups; /* first column, panels' bytes, prefill groups */
  const uint8_t *base;
} ga_part;

typedef struct {
  const armllm_ga_args *a;
  int nparts;
  ga_part part[ARMLLM_GGUF_MAX_PARTS];
  const armllm_ga_decode_set *decode;
  const armllm_ga_prefill *prefill;
  int64_t n_mc; /* prefill M chunks */
} ga_job;

/* Panel i of all parts: its part and its index there. */
static const ga_part *panel_part(const ga_job *job, int64_t *i) {
  int p = 0;
  while (*i >= job->part[p].panels) *i -= job->part[p++].panels;
  return &job->part[p];
}

static void ga_decode_items(void *ctx, int64_t i0, int64_t i1) {
  const ga_job *job = ctx;
  const armllm_ga_args *a = job->a;
  for (int64_t i = i0; i < i1; i++) {
    int64_t q = i;
    const ga_part *pt = panel_part(job, &q);
    const uint8_t *panel = pt->base + q * pt->pstride;
    const int nv = (int)min64(NR, pt->rows - q * NR);
    for (int64_t m0 = 0; m0 < a->m; m0 += 4) {
      const int mr = (int)min64(4, a->m - m0);
      (*job->decode)[pt->ti][mr - 1](a, m0, panel, pt->n0 + q * NR, nv);
    }
  }
}

/* The sum of x[0, 16) or x[0, 32): a weight group's gs. */
static int32_t x_sum(const int8_t *x, int len) {
  int32_t s = vaddlvq_s8(vld1q_s8(x));
  return len == 32 ? s + vaddlvq_s8(vld1q_s8(x + 16)) : s;
}

/* The rows [m0, m0 + mr) of a prefill tile over the K block [kb, kb + kc). */
static void ga_prepare_rows(const ga_job *job, int type, int64_t m0, int64_t kb, int64_t kc,
                            armllm_ga_rows *rw) {
  const armllm_ga_args *a = job->a;
  const int mr = job->prefill->mr, gl = ga_group_len(type), super = ga_super(type);
  const int offsets = ga_offsets(type);
  const int64_t mv = min64(mr, a->m - m0), nc = kc / 32, ng = kc / gl;
  for (int r = 0; r < mr; r++) {
    const int64_t row = m0 + (r < mv ? r : mv - 1);
    const int8_t *x = a->xq + row * a->ldq + kb;
    const float *scale_row = a->scale + row * a->ldsc;
    rw->x[r] = x;
    for (int64_t c = 0; c < nc; c++) rw->sx[c][r] = ga_sx(a, scale_row, kb + 32 * c);
    if (!offsets) continue;
    /* gsum only when G = 32, that is without super-block parts: per chunk */
    const int32_t *gsum = a->gsum ? a->gsum + row * a->ldgs + kb / ARMLLM_GGUF_ACT_GROUP : NULL;
    for (int64_t j = 0; j < ng; j++) { /* a 32-element type's group j is chunk j */
      const float gs = (float)(gsum ? gsum[j] : x_sum(x + gl * j, gl));
      rw->b[j][r] = super ? gs : gs * rw->sx[j][r];
    }
  }
  if (!job->prefill->pack_x) return;
  const int mp = mr / 2;
  for (int pr = 0; pr < mp; pr++) {
    for (int64_t c = 0; c < nc; c++)
      for (int e = 0; e < 4; e++) rw->sxp[c][pr][e] = rw->sx[c][2 * pr + e / 2];
    if (offsets)
      for (int64_t j = 0; j < ng; j++)
        for (int e = 0; e < 4; e++) rw->bp[j][pr][e] = rw->b[j][2 * pr + e / 2];
  }
  for (int pr = 0; pr < mp; pr++)
    for (int64_t c = 0; c < kc / 8; c++) {
      const int64x1_t x0 = vld1_s64((const int64_t *)(const void *)(rw->x[2 * pr] + 8 * c));
      const int64x1_t x1 = vld1_s64((const int64_t *)(const void *)(rw->x[2 * pr + 1] + 8 * c));
      vst1q_s8(rw->ap + (c * mp + pr) * 16, vreinterpretq_s8_s64(vcombine_s64(x0, x1)));
    }
}

static void ga_prefill_items(void *ctx, int64_t i0, int64_t i1) {
  const ga_job *job = ctx;
  const armllm_ga_args *a = job->a;
  const armllm_ga_prefill *pf = job->prefill;
  armllm_ga_panel_k pk[PG];
  armllm_ga_rows rw;
  for (int64_t i = i0; i < i1; i++) {
    int64_t gi = i / job->n_mc, p = 0;
    const int64_t mc = i % job->n_mc;
    while (gi >= job->part[p].groups) gi -= job->part[p++].groups;
    const ga_part *pt = &job->part[p];
    const int e = ga_elems(pt->type), g16 = ga_group_len(pt->type) == 16;
    const armllm_ga_tile_fn tile = pf->tile[ga_super(pt->type)][g16][ga_offsets(pt->type)];
    const int64_t q0 = gi * PG, nq = min64(PG, pt->panels - q0);
    const int64_t m1 = min64(a->m, (mc + 1) * MC);
    for (int64_t kb = 0; kb < a->k; kb += KC) {
      const int64_t kc = min64(KC, a->k - kb);
      const int first = kb == 0, last = kb + kc == a->k;
      for (int64_t q = 0; q < nq; q++)
        pf->unpack[pt->ti](pt->base + (q0 + q) * pt->pstride, kb / e, kc / e, &pk[q]);
      for (int64_t m0 = mc * MC; m0 < m1; m0 += pf->mr) {
        ga_prepare_rows(job, pt->type, m0, kb, kc, &rw);
        for (int64_t q = 0; q < nq; q++) {
          const int64_t n0 = pt->n0 + (q0 + q) * NR;
          const int nv = (int)min64(NR, pt->rows - (q0 + q) * NR);
          float eb[NR] = {0.0f, 0.0f, 0.0f, 0.0f}; /* the bias of an edge panel */
          const float *bias = NULL;
          if (last && a->bias) {
            memcpy(eb, a->bias + n0, (size_t)nv * sizeof *eb);
            bias = eb;
          }
          const armllm_ga_tile t = {&rw, &pk[q], kc, a->y + m0 * a->ldy + n0, a->ldy, bias, first,
                                    (int)min64(pf->mr, m1 - m0), nv};
          tile(&t);
        }
      }
    }
  }
}

void armllm_ga_gemm(armllm_pool *pool, const armllm_ga_args *a, const void *packed_w, int64_t n0,
                    int64_t n1, const armllm_ga_decode_set *decode,
                    const armllm_ga_prefill *prefill) {
  const armllm_gguf_parts *hdr = packed_w;
  armllm_ga_args args = *a;
  const int G = armllm_gguf_act_group(hdr); /* 32 or 256 */
  args.act_shift = __builtin_ctz((unsigned)G);
  if (G != ARMLLM_GGUF_ACT_GROUP) args.gsum = NULL;
  a = &args;
  ga_job job;
  memset(&job, 0, sizeof job);
  job.a = a;
  job.decode = decode;
  job.prefill = a->m > ARMLLM_GEMM_DECODE_MAX_M ? prefill : NULL;
  job.n_mc = (a->m + MC - 1) / MC;
  const uint8_t *base = (const uint8_t *)packed_w + ARMLLM_GGUF_HEADER_BYTES;
  /* the parts' rows in the window [n0, n1) (y and bias its own, columns counted
   * from n0): from n0's panel on, cut at n1 */
  int64_t col = 0, panels = 0, groups = 0;
  for (int p = 0; p < hdr->nparts; p++) {
    const int type = hdr->types[p];
    const int64_t rows = hdr->rows[p], pstride = (a->k / ga_elems(type)) * ga_pb(type);
    const int64_t lo = col > n0 ? col : n0, hi = col + rows < n1 ? col + rows : n1;
    if (lo < hi) {
      ga_part *pt = &job.part[job.nparts++];
      pt->type = type;
      pt->ti = armllm_ga_index(type);
      pt->n0 = lo - n0;
      pt->rows = hi - lo;
      pt->panels = (pt->rows + NR - 1) / NR;
      pt->pstride = pstride;
      pt->groups = (pt->panels + PG - 1) / PG;
      pt->base = base + (lo - col) / NR * pstride;
      panels += pt->panels;
      groups += pt->groups;
    }
    base += part_bytes(type, a->k, rows);
    col += rows;
  }
  if (!job.prefill) {
    /* a panel is 4 x k MACs per row; at least about 2^16 MACs per chunk */
    const int64_t per = 4 * a->k * a->m;
    armllm_pool_run(pool, panels, armllm_pool_grain(pool, panels, ARMLLM_ITEMS_PER_THREAD,
                                                    ((1 << 16) + per - 1) / per),
                    ga_decode_items, &job);
    return;
  }
  const int64_t items = groups * job.n_mc;
  armllm_pool_run(pool, items, armllm_pool_grain(pool, items, ARMLLM_ITEMS_PER_THREAD, 1),
                  ga_prefill_items, &job);
}
