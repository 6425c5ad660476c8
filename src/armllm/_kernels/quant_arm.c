/* quant_arm.c: the quantized-GEMM driver every Arm variant runs (see
 * quant_arm.h): weight packing around a variant's block layout, and the
 * GEMM's work loop. K is cut into K blocks of KC_BLOCKS blocks (whole
 * groups); per K block and M tile the rows are gathered in place (row
 * pointers, with each group's activation scales and, for 4 bits, gsum * sx
 * on the stack) or packed as SMMLA operands, then every column tile of the
 * item's N chunk runs the variant's micro-kernel; t stays in y between K
 * blocks. Built at the Armv8.0 baseline (the neon library): the kernels it
 * calls carry their own ISA. */
#include <arm_neon.h>

#include "gemm_plan.h"
#include "quant_arm.h"

#define NR ARMLLM_QA_NR
#define BLK ARMLLM_QA_BLK
#define KC_BLOCKS ARMLLM_QA_KC_BLOCKS
#define CHUNK_PANELS 16 /* prefill N chunk: at most this many panels (128 columns) */

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ----------------------------------------------------------- packing */

typedef struct {
  int64_t kpad, nblk, bpg, ng, bb, sb, pstride; /* bytes: block, scales, panel */
} qa_geom;

static qa_geom geom_of(int64_t k, int bits, int64_t group) {
  qa_geom g;
  g.kpad = armllm_q_kpad(k);
  g.nblk = g.kpad / BLK;
  g.bpg = armllm_q_group_len(group) / BLK;
  g.ng = armllm_q_groups(k, group);
  g.bb = bits == 4 ? 128 : 256;
  g.sb = bits == 4 ? 64 : 32;
  g.pstride = g.nblk * g.bb + g.ng * g.sb;
  return g;
}

size_t armllm_qa_packed_len(int64_t n, int64_t k, int bits, int64_t group) {
  return (size_t)((n + NR - 1) / NR * geom_of(k, bits, group).pstride);
}

void armllm_qa_pack(const int8_t *q, int64_t n, int64_t k, int bits, int64_t group,
                    const float *d, const float *o, void *packed, armllm_qa_block_fn block) {
  const qa_geom G = geom_of(k, bits, group);
  const int64_t ngin = group ? G.ng : 1; /* d, o given per row when channelwise */
  uint8_t *dst = packed;
  for (int64_t p = 0; p < (n + NR - 1) / NR; p++)
    for (int64_t g = 0; g < G.ng; g++) {
      for (int64_t b = g * G.bpg; b < min64((g + 1) * G.bpg, G.nblk); b++, dst += G.bb)
        block(dst, q, n, k, p, b, bits);
      float s[2 * NR]; /* d[8], then o[8] (4 bits) */
      for (int j = 0; j < NR; j++) {
        const int64_t row = p * NR + j, src = row * ngin + (group ? g : 0);
        s[j] = row < n ? d[src] : 0.0f;
        s[NR + j] = row < n && o ? o[src] : 0.0f;
      }
      memcpy(dst, s, (size_t)G.sb);
      dst += G.sb;
    }
}

/* -------------------------------------------------------------- rows */

static const int8_t zero_row[KC_BLOCKS * BLK];

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
      r[h] = row < m ? xq + row * ldq + b0 * BLK : zero_row;
      for (int64_t g = 0; g < gc; g++) {
        float *e = sxp + (g * MP + pr) * 8 + 2 * h;
        const float sx = row < m ? scale[row * ldsc + g0 + g] : 0.0f;
        e[0] = e[1] = sx;
        if (gsum) e[4] = e[5] = row < m ? (float)gsum[row * ldgs + g0 + g] * sx : 0.0f;
      }
    }
    for (int64_t b = 0; b < nb; b++)
      for (int half = 0; half < 2; half++) {
        const int64x2_t x0 = vreinterpretq_s64_s8(vld1q_s8(r[0] + b * BLK + 16 * half));
        const int64x2_t x1 = vreinterpretq_s64_s8(vld1q_s8(r[1] + b * BLK + 16 * half));
        vst1q_s8(ap + ((b * 4 + 2 * half) * MP + pr) * 16,
                 vreinterpretq_s8_s64(vzip1q_s64(x0, x1)));
        vst1q_s8(ap + ((b * 4 + 2 * half + 1) * MP + pr) * 16,
                 vreinterpretq_s8_s64(vzip2q_s64(x0, x1)));
      }
  }
}

/* ------------------------------------------------------------ driver */

typedef struct {
  const int8_t *xq;
  int64_t m, ldq;
  const float *scale;
  int64_t ldsc;
  const int32_t *gsum; /* 4 bits only */
  int64_t ldgs;
  const uint8_t *w;
  int64_t n_panels;
  qa_geom G;
  armllm_qa_kind kind;
  armllm_tile_grid grid; /* K in blocks */
} qa_job;

/* A thread's tile and the rows it points at. */
typedef struct {
  armllm_qa_tile a;
  int64_t woff; /* the K block's first byte in a panel */
  int8_t ap[KC_BLOCKS * BLK * ARMLLM_QA_MAX_ROWS] __attribute__((aligned(64)));
  float sx[KC_BLOCKS * 4 * 8] __attribute__((aligned(16))); /* packed: [group][pair][8] */
  float tb[ARMLLM_EDGE_TILE_FLOATS] __attribute__((aligned(64)));
} qa_scratch;

static void qa_rows(const void *ctx, void *scratch, int64_t m0, int64_t b0, int64_t nb) {
  const qa_job *job = ctx;
  const qa_geom *G = &job->G;
  qa_scratch *s = scratch;
  armllm_qa_tile *a = &s->a;
  const int64_t g0 = b0 / G->bpg;
  a->nb = nb;
  a->first = b0 == 0;
  a->last = b0 + nb == G->nblk;
  s->woff = b0 * G->bb + g0 * G->sb;
  const int64_t gc = (a->nb + G->bpg - 1) / G->bpg;
  const int rows = job->kind.rows;
  if (job->kind.packed) {
    pack_rows(job->xq, job->ldq, job->scale, job->ldsc, job->gsum, job->ldgs, job->m, m0,
              rows / 2, b0, a->nb, g0, gc, s->ap, s->sx);
    return;
  }
  const int64_t mv = min64(rows, job->m - m0);
  float *gsx = s->sx, *gsb = s->sx + KC_BLOCKS * 8;
  for (int r = 0; r < rows; r++) {
    const int64_t row = m0 + (r < mv ? r : mv - 1);
    a->x[r] = job->xq + row * job->ldq + b0 * BLK;
    const float *sx = job->scale + row * job->ldsc + g0;
    for (int64_t g = 0; g < gc; g++) gsx[g * 8 + r] = sx[g];
    if (job->gsum)
      for (int64_t g = 0; g < gc; g++)
        gsb[g * 8 + r] = (float)job->gsum[row * job->ldgs + g0 + g] * sx[g];
  }
}

static void qa_tile(const void *ctx, void *scratch, int64_t t, int64_t b0, int64_t nb,
                    float *y, int64_t ldy, int first, const float *bias) {
  (void)b0, (void)nb, (void)first; /* in the tile since qa_rows */
  const qa_job *job = ctx;
  qa_scratch *s = scratch;
  const int PT = job->kind.panels;
  const int64_t p0 = t * PT, np = min64(PT, job->n_panels - p0);
  for (int q = 0; q < PT; q++)
    s->a.w[q] = job->w + (p0 + (q < np ? q : np - 1)) * job->G.pstride + s->woff;
  s->a.y = y;
  s->a.ldy = ldy;
  s->a.bias = bias;
  job->kind.fn(&s->a);
}

static void qa_items(void *ctx, int64_t i0, int64_t i1) {
  const qa_job *job = ctx;
  qa_scratch s;
  s.a.ap = s.ap;
  s.a.sx = s.sx;
  s.a.sb = s.sx + KC_BLOCKS * 8;
  s.a.tb = s.tb;
  s.a.bpg = job->G.bpg;
  armllm_gemm_tiles(&job->grid, ctx, &s, i0, i1, qa_rows, qa_tile);
}

void armllm_qa_gemm(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                    const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                    const void *packed_w, int64_t n0, int64_t n1, int bits, int64_t group,
                    const float *bias, float *y, int64_t ldy, armllm_qa_kind kind,
                    int64_t min_chunk_macs) {
  const qa_geom G = geom_of(k, bits, group);
  /* the window (y and bias its own): the matrix from n0's panel on, cut at n1 */
  const int64_t n = n1 - n0;
  packed_w = (const uint8_t *)packed_w + n0 / NR * G.pstride;
  const int64_t n_panels = (n + NR - 1) / NR, n_tiles = (n_panels + kind.panels - 1) / kind.panels;
  qa_job job = {xq, m, ldq, scale, ldsc, bits == 4 ? gsum : NULL, ldgs, packed_w, n_panels, G,
                kind, {m, n, kind.rows, kind.panels * NR, n_tiles, G.nblk, KC_BLOCKS, 0, 0, y, ldy,
                       bias}};
  const int64_t cp_max = kind.panels >= CHUNK_PANELS ? 1 : CHUNK_PANELS / kind.panels;
  armllm_gemm_run(pool, &job, &job.grid, G.kpad, 1, cp_max, min_chunk_macs, qa_items, qa_items);
}
