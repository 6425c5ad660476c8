/* amx/quant.c: the quantized GEMM (int8 or int4 weights, int8 activations)
 * on AMX tiles (TDPBSSD) for prefill-sized M; decode-sized M runs avx512's
 * (memory-bound: tiles would not read the weights any faster).
 *
 * Layout: avx512's "nr16k4g" (avx512/quant.c, quant_x86.h; the pack is
 * avx512's). Its 4-k steps of 64 bytes (16 columns x 4 bytes) are the rows
 * of an AMX B tile: K/4 rows x 16 int32 columns, each 4 consecutive k of a
 * column. A tile is 16 rows of xq, read in place (row stride ldq).
 *
 * Staging: panel pair by panel pair and K block by K block (whole groups of
 * both panels' weights fit STAGE_BYTES, in L1), the weights are copied once
 * into signed bytes, tile-ready, and reused by every row tile of the row
 * block: bits 8 q = stored ^ 0x80 (the pack stores q + 128); bits 4 each
 * 8-k step's low nibbles are the B row of k .. k+4, its high nibbles the
 * row of k+4 .. k+8 (values 0..15). So one instruction, TDPBSSD (signed x
 * signed), serves both, and 8-bit weights need no -128 sum(x) correction.
 * A group of L columns is staged as ceil(L / KSTEP) B tiles of KSTEP k
 * (zero rows past L), then its d (and o) as f32 (f16 scales widened:
 * exact).
 *
 * Numerics: a group's C tile is an exact int32 sum (|sum| <= 128 * 127 *
 * 127 per group of 128), so with the group's C tiles stored to memory, the
 * float epilogue runs lane-wise with ref's operations in ref's order:
 * a = (float)acc * sx; t = fma(d, a, t) [; t = fma(o, (float)gsum * sx, t)]
 * for g ascending from t = +0, then y = t (+ bias): every output is
 * bit-identical to ref, whatever M, the tile or the thread count.
 *
 * Tiles (one configuration a call, loaded per pool task, released at its
 * end): tmm0, tmm1 the C tiles of one row tile x the two panels, tmm4 the A
 * tile, tmm6, tmm7 the B tiles; C rows = A rows = min(M, 16); KSTEP = 32
 * for groups of 32 (one tile a group), else 64. The last row tile of a
 * block starts 16 rows before the block's end (it recomputes rows of the
 * tile before it, with the same bits) so every tile is full height. The
 * running sums t of each tile wait in a stack buffer between groups and K
 * blocks (the epilogue is bound by its vector arithmetic, not by these
 * loads and stores).
 *
 * Work: items are (row block, panel chunk) pairs, as in avx512's prefill;
 * row blocks as tall as TBUF_ROWS, so that the weights stream from memory
 * once per row block.
 */
#include <immintrin.h>
#include <math.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define PANEL 16         /* output columns per panel: one C tile's columns */
#define TILE_ROWS 16     /* rows of an A / C tile */
#define HEADER_BYTES 64  /* the layout's header (quant_x86.h) */
#define WQ_PF_BYTES 4096 /* quant_x86.h's decode prefetch (avx512's decode runs here) */
#ifndef AMX_MIN_M
#define AMX_MIN_M 5 /* fewer rows run avx512's decode path */
#endif
#ifndef STAGE_BYTES
#define STAGE_BYTES (24 * 1024) /* a panel pair's staged K block: half of L1d */
#endif
#define TBUF_ROWS 512 /* rows per row block, about: their sums t on the stack (66 KiB) */
#define TBUF_TILES (TBUF_ROWS / TILE_ROWS + 2) /* row tiles of a block (its ends round to 16) */
#define TBUF_LD (2 * PANEL)
#define KB_MAX 64 /* groups per K block (bounds the per-tile terms buffer) */
#define ITEMS_PER_THREAD 4

#include "../quant_x86.h"

/* Tile numbers (the intrinsics take constants). */
#define TC0 0
#define TC1 1
#define TA 4
#define TB0 6
#define TB1 7

/* LDTILECFG's 64-byte operand (palette 1). */
typedef struct {
  uint8_t palette, start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((aligned(64))) tile_config;

/* Tile reads and writes through memory the compiler cannot see: keep its
 * stores before, and its loads after. */
static ALWAYS_INLINE void memory_barrier(void) { __asm__ volatile("" ::: "memory"); }

static ALWAYS_INLINE __m512 no_contract(__m512 v) {
  __asm__("" : "+v"(v));
  return v;
}

typedef struct {
  wq_job wq;
  int bits;
  int64_t mr;          /* tile rows: min(M, 16) */
  int64_t kstep;       /* k per tile product: 32 or 64 */
  int64_t sgb;         /* staged bytes per group and panel */
  int64_t n_rb;        /* row blocks (block_start) */
} amx_job;

/* Columns of group g (the last may be short). */
static ALWAYS_INLINE int64_t group_len(const wq_job *wq, int64_t g) {
  const int64_t k0 = g * wq->gl;
  return k0 + wq->gl < wq->kpad ? wq->gl : wq->kpad - k0;
}

/* Bytes of a packed panel before group g (every group before the last is whole). */
static ALWAYS_INLINE int64_t group_offset(const wq_job *wq, int bits, int64_t g) {
  return g * (wq->gl / 32 * chunk_bytes(bits) + scale_bytes(bits, wq->f16));
}

static ALWAYS_INLINE int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

/* Stages groups [g0, g1) of panel p into dst (sgb bytes a group). */
static ALWAYS_INLINE void stage_panel(const int bits, const amx_job *job, int64_t p, int64_t g0,
                                      int64_t g1, uint8_t *dst) {
  const wq_job *wq = &job->wq;
  const uint8_t *src = wq->w + p * wq->pbytes + group_offset(wq, bits, g0);
  const __m512i flip = _mm512_set1_epi8((char)0x80), nib = _mm512_set1_epi8(0x0f);
  for (int64_t g = g0; g < g1; g++, dst += job->sgb) {
    const int64_t len = group_len(wq, g), padded = round_up(len, job->kstep);
    uint8_t *b = dst;
    if (bits == 8) {
      for (int64_t i = 0; i < len * PANEL; i += 64, src += 64, b += 64)
        _mm512_store_si512(b, _mm512_xor_si512(_mm512_load_si512(src), flip));
    } else {
      for (int64_t i = 0; i < len * PANEL; i += 128, src += 64, b += 128) {
        const __m512i v = _mm512_load_si512(src);
        _mm512_store_si512(b, _mm512_and_si512(v, nib));
        _mm512_store_si512(b + 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), nib));
      }
    }
    for (int64_t i = len * PANEL; i < padded * PANEL; i += 64, b += 64)
      _mm512_store_si512(b, _mm512_setzero_si512());
    float *sc = (float *)(dst + padded * PANEL);
    if (bits == 4 && wq->f16) {
      _mm512_store_ps(sc, _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)src)));
      _mm512_store_ps(sc + PANEL, _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(src + 32))));
    } else {
      _mm512_store_ps(sc, _mm512_load_ps((const float *)src));
      if (bits == 4) _mm512_store_ps(sc + PANEL, _mm512_load_ps((const float *)src + PANEL));
    }
    src += scale_bytes(bits, wq->f16);
  }
}

/* One row tile (rows r .. r+mr) of panels p (and p + 1 when nc = 2) over
 * the staged groups [g0, g1): per group the C tiles, then the epilogue onto
 * t (tb, rows TBUF_LD floats apart); after the last group, y. */
static ALWAYS_INLINE void row_tile(const int bits, const int nc, const int64_t kstep,
                                   const amx_job *job, int64_t r, int64_t p, int64_t g0,
                                   int64_t g1, const uint8_t *stage, float *tb) {
  const wq_job *wq = &job->wq;
  const int64_t mr = job->mr, ldq = wq->ldq, sgb = job->sgb;
  const int8_t *x = wq->xq + r * ldq;
  int32_t cbuf[2][TILE_ROWS * PANEL] __attribute__((aligned(64)));
  int8_t abuf[TILE_ROWS * 64] __attribute__((aligned(64)));
  float terms[TILE_ROWS * KB_MAX];
  /* the A tile of the last k step of a short group may read past the last row of xq */
  const int tail_row = r + mr == wq->m;
  if (bits == 4) /* b = (float)gsum * sx, per row and group: ref's one rounding */
    for (int64_t i = 0; i < mr; i++)
      for (int64_t g = g0; g < g1; g++)
        terms[i * KB_MAX + g - g0] =
            (float)wq->gsum[(r + i) * wq->ldgs + g] * wq->scale[(r + i) * wq->ldsc + g];
  for (int64_t g = g0; g < g1; g++) {
    const int64_t k0 = g * wq->gl, len = group_len(wq, g), padded = round_up(len, kstep);
    const uint8_t *b0 = stage + (g - g0) * sgb, *b1 = b0 + (g1 - g0) * sgb;
    _tile_zero(TC0);
    if (nc == 2) _tile_zero(TC1);
    for (int64_t kk = 0; kk < padded; kk += kstep) {
      if (tail_row && k0 + kk + kstep > ldq) {
        /* copy the valid bytes of each row (the rest is multiplied by zero rows of B) */
        memset(abuf, 0, sizeof abuf);
        for (int64_t i = 0; i < mr; i++) memcpy(abuf + i * 64, x + i * ldq + k0 + kk, len - kk);
        memory_barrier();
        _tile_loadd(TA, abuf, 64);
      } else {
        _tile_loadd(TA, x + k0 + kk, ldq);
      }
      _tile_loadd(TB0, b0 + kk * PANEL, 64);
      _tile_dpbssd(TC0, TA, TB0);
      if (nc == 2) {
        _tile_loadd(TB1, b1 + kk * PANEL, 64);
        _tile_dpbssd(TC1, TA, TB1);
      }
    }
    _tile_stored(TC0, cbuf[0], 64);
    if (nc == 2) _tile_stored(TC1, cbuf[1], 64);
    __m512 dv[2], ov[2];
    for (int c = 0; c < nc; c++) {
      const float *sc = (const float *)((c ? b1 : b0) + padded * PANEL);
      dv[c] = _mm512_load_ps(sc);
      ov[c] = bits == 4 ? _mm512_load_ps(sc + PANEL) : _mm512_setzero_ps();
    }
    for (int64_t i = 0; i < mr; i++) {
      const __m512 sx = _mm512_set1_ps(wq->scale[(r + i) * wq->ldsc + g]);
      const __m512 bv = bits == 4 ? _mm512_set1_ps(terms[i * KB_MAX + g - g0]) : sx;
      for (int c = 0; c < nc; c++) {
        const __m512 a =
            no_contract(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cbuf[c] + i * PANEL)),
                                      sx));
        const __m512 t = g == 0 ? _mm512_setzero_ps() : _mm512_load_ps(tb + i * TBUF_LD + c * PANEL);
        __m512 v = _mm512_fmadd_ps(dv[c], a, t);
        if (bits == 4) v = _mm512_fmadd_ps(ov[c], bv, v);
        _mm512_store_ps(tb + i * TBUF_LD + c * PANEL, v);
      }
    }
  }
  if (g1 < wq->ng) return;
  /* y = t (+ bias), masked to N */
  for (int c = 0; c < nc; c++) {
    const int64_t col = (p + c) * PANEL, nv = wq->n - col;
    const __mmask16 mask = nv >= PANEL ? (__mmask16)0xffff : (__mmask16)((1u << nv) - 1);
    const __m512 bias =
        wq->bias ? _mm512_maskz_loadu_ps(mask, wq->bias + col) : _mm512_setzero_ps();
    for (int64_t i = 0; i < mr; i++) {
      __m512 v = _mm512_load_ps(tb + i * TBUF_LD + c * PANEL);
      if (wq->bias) v = _mm512_add_ps(v, bias);
      _mm512_mask_storeu_ps(wq->y + (r + i) * wq->ldy + col, mask, v);
    }
  }
}

/* Row block rb's first row: the blocks cut M evenly at multiples of 16 rows
 * (each at least 16 rows when M is, at most TBUF_ROWS + 16). */
static inline int64_t block_start(const amx_job *job, int64_t rb) {
  const int64_t m = job->wq.m;
  return rb >= job->n_rb ? m : rb * m / job->n_rb / TILE_ROWS * TILE_ROWS;
}

/* Item i: row block i / n_pc times panel chunk i % n_pc, panel pair by
 * panel pair, K block by K block: staged once, then every row tile. */
static ALWAYS_INLINE void item(const int bits, const int64_t kstep, const amx_job *job, int64_t i,
                               uint8_t *stage, float *tbuf) {
  const wq_job *wq = &job->wq;
  const int64_t rb = i / wq->n_pc, pc = i % wq->n_pc, ng = wq->ng, kb = wq->kb, mr = job->mr;
  const int64_t r0 = block_start(job, rb), r1 = block_start(job, rb + 1);
  const int64_t p0 = pc * wq->cp, p1 = p0 + wq->cp < wq->panels ? p0 + wq->cp : wq->panels;
  for (int64_t p = p0; p < p1; p += 2) {
    const int nc = p + 2 <= p1 ? 2 : 1;
    for (int64_t g0 = 0; g0 < ng; g0 += kb) {
      const int64_t g1 = g0 + kb < ng ? g0 + kb : ng;
      stage_panel(bits, job, p, g0, g1, stage);
      if (nc == 2) stage_panel(bits, job, p + 1, g0, g1, stage + (g1 - g0) * job->sgb);
      memory_barrier();
      for (int64_t r = r0, s = 0; r < r1; r += mr, s++) {
        const int64_t rt = r + mr <= r1 ? r : r1 - mr; /* full height: back over the last rows */
        float *tb = tbuf + s * TILE_ROWS * TBUF_LD;
        if (nc == 2) row_tile(bits, 2, kstep, job, rt, p, g0, g1, stage, tb);
        else row_tile(bits, 1, kstep, job, rt, p, g0, g1, stage, tb);
      }
    }
  }
}

static ALWAYS_INLINE void task(const int bits, const int64_t kstep, void *ctx, int64_t i0,
                               int64_t i1) {
  const amx_job *job = ctx;
  uint8_t stage[STAGE_BYTES] __attribute__((aligned(64)));
  float tbuf[TBUF_TILES * TILE_ROWS * TBUF_LD] __attribute__((aligned(64)));
  tile_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  const int tiles[] = {TC0, TC1, TA, TB0, TB1};
  for (int j = 0; j < 5; j++) {
    const int t = tiles[j];
    const int is_b = t == TB0 || t == TB1;
    cfg.rows[t] = (uint8_t)(is_b ? kstep / 4 : job->mr);
    cfg.colsb[t] = (uint16_t)(t == TA ? kstep : 64);
  }
  memory_barrier();
  _tile_loadconfig(&cfg);
  for (int64_t i = i0; i < i1; i++) item(bits, kstep, job, i, stage, tbuf);
  _tile_release();
}

static void task8_32(void *ctx, int64_t i0, int64_t i1) { task(8, 32, ctx, i0, i1); }
static void task8_64(void *ctx, int64_t i0, int64_t i1) { task(8, 64, ctx, i0, i1); }
static void task4_32(void *ctx, int64_t i0, int64_t i1) { task(4, 32, ctx, i0, i1); }
static void task4_64(void *ctx, int64_t i0, int64_t i1) { task(4, 64, ctx, i0, i1); }

void armllm_amx_gemm_wq(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                        const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                        const void *packed_w, int64_t n, int bits, int64_t group,
                        const float *bias, float *y, int64_t ldy) {
  if (m < AMX_MIN_M) {
    armllm_avx512_gemm_wq(pool, xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, n, bits, group,
                          bias, y, ldy);
    return;
  }
  amx_job job = {.wq = wq_job_of(xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, n, bits,
                                 group, bias, y, ldy),
                 .bits = bits};
  wq_job *wq = &job.wq;
  job.mr = m < TILE_ROWS ? m : TILE_ROWS;
  job.kstep = wq->gl == 32 ? 32 : 64;
  job.sgb = round_up(wq->gl, job.kstep) * PANEL + 2 * PANEL * (int64_t)sizeof(float);
  if ((double)m * (double)n * (double)wq->kpad < 4.0e6) pool = NULL;
  wq->kb = STAGE_BYTES / (2 * job.sgb);
  wq->kb = wq->kb < 1 ? 1 : wq->kb > KB_MAX ? KB_MAX : wq->kb;
  job.n_rb = (m + TBUF_ROWS - 1) / TBUF_ROWS;
  /* about ITEMS_PER_THREAD items a thread: chunks of an even number of panels */
  const int64_t threads = pool ? armllm_pool_threads(pool) : 1;
  int64_t n_pc = (ITEMS_PER_THREAD * threads + job.n_rb - 1) / job.n_rb;
  const int64_t pairs = (wq->panels + 1) / 2;
  n_pc = n_pc > pairs ? pairs : n_pc;
  wq->cp = 2 * ((pairs + n_pc - 1) / n_pc);
  wq->n_pc = (wq->panels + wq->cp - 1) / wq->cp;
  armllm_task_fn fn = bits == 4 ? (job.kstep == 32 ? task4_32 : task4_64)
                                : (job.kstep == 32 ? task8_32 : task8_64);
  armllm_pool_run(pool, job.n_rb * wq->n_pc, 1, fn, &job);
}
