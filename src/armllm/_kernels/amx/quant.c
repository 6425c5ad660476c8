/* amx/quant.c: the quantized GEMM (int8 or int4 weights, int8 activations)
 * on AMX tiles (TDPBSSD) for M >= 32 (64 for groups of 32); fewer rows run
 * avx512's, faster there (AMX_MIN_M).
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
 * end): two sets of C tiles, tmm0, tmm1 (A tmm4) and tmm2, tmm3 (A tmm5),
 * each one row tile x the two panels, take the groups in turn; B tiles tmm6,
 * tmm7. C rows = A rows = min(M, 16); KSTEP = 32 for groups of 32 (one tile
 * a group; a tile product costs the same for 32 k as for 64), else 64. The
 * last row tile of a block starts 16 rows before the block's end (it
 * recomputes rows of the tile before it, with the same bits) so every tile
 * is full height. The running sums t of each tile wait in a stack buffer
 * between epilogue batches and K blocks.
 *
 * Measured on this Xeon (KVM, shared, so +-15%; armllm bench kernels,
 * llama-3.1-8b, M = 512, 2 threads): avx512's time / amx's 1.8-2.0 for
 * 8-bit channelwise, 1.6-1.75 for 4-bit group-128 weights, 1.1-1.6 for
 * groups of 32 (bound by the per-group float epilogue: 3 vector operations
 * per 16 outputs and group, 4 with offsets, which AMX does not speed up).
 * Where the rest goes is open: A tile loads straight from xq (L2) cost
 * about a fifth (measured with A kept in L1; rows a power of two apart
 * conflict in L2, hence row blocks of 256); a 2x2 blocking (2 A, 2 B,
 * 4 C), A and B tiles rotating by k step (each load a whole step ahead),
 * prefetching the next row tile's A, 128-row blocks and batching the
 * epilogue a batch behind the tile products all measured no faster.
 *
 * Work: items are (row block, panel chunk) pairs, as in avx512's prefill;
 * row blocks as tall as TBUF_ROWS, so that the weights stream from memory
 * once per row block.
 */
#include <immintrin.h>
#include <math.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"
#include "tiles.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define PANEL 16         /* output columns per panel: one C tile's columns */
#define TILE_ROWS 16     /* rows of an A / C tile */
#define HEADER_BYTES 64  /* the layout's header (quant_x86.h) */
#define WQ_PF_BYTES 4096 /* prefetch distance while staging weights (quant_x86.h needs one too) */
/* Fewer rows run avx512's: the tile unit waits on each tile's loads, and a
 * tile product costs the same for 5 rows as for 16. Measured, 2 threads,
 * N = K = 4096, amx / avx512 time: groups of 64, 128 or channelwise M = 12
 * 1.33, 16 1.09, 32 0.76 (w8) and 0.68 (w4g128); groups of 32 M = 16 1.02
 * (w8) to 1.22 (w4), 24 1.39 (w4), 32 1.03 (w4), 64 0.94 (w4) and 0.76
 * (w8), 128 0.75 (w4). */
#ifndef AMX_MIN_M
#define AMX_MIN_M 32
#endif
#ifndef AMX_MIN_M_G32
#define AMX_MIN_M_G32 64
#endif
#ifndef STAGE_BYTES
#define STAGE_BYTES (24 * 1024) /* a panel pair's staged K block: half of L1d */
#endif
/* rows per row block, about (their sums t on the stack, 34 KiB): 256, not
 * 512, measured 1.2-1.3x faster with K = 4096 (a block's A rows 4 KiB apart
 * share L2 sets), as fast elsewhere */
#define TBUF_ROWS 256
#define TBUF_TILES (TBUF_ROWS / TILE_ROWS + 2) /* row tiles of a block (its ends round to 16) */
#define TBUF_LD (2 * PANEL)
#define KB_MAX 64 /* groups per K block (bounds the per-tile terms buffer) */
#ifndef EPI_GROUPS
#define EPI_GROUPS 4 /* groups per epilogue pass (even: the C sets alternate) */
#endif
#define ITEMS_PER_THREAD 4

#include "../quant_x86.h"

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
      for (int64_t i = 0; i < len * PANEL; i += 64, src += 64, b += 64) {
        _mm_prefetch((const char *)src + WQ_PF_BYTES, _MM_HINT_T0);
        _mm512_store_si512(b, _mm512_xor_si512(_mm512_load_si512(src), flip));
      }
    } else {
      for (int64_t i = 0; i < len * PANEL; i += 128, src += 64, b += 128) {
        _mm_prefetch((const char *)src + WQ_PF_BYTES, _MM_HINT_T0);
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

/* What a row tile's groups share: its rows, the staged panels, t. */
typedef struct {
  const amx_job *job;
  const int8_t *x; /* the tile's first row of xq */
  int64_t r, g0, g1;
  const uint8_t *b0, *b1; /* staged groups of the two panels */
  float *tb;
  int tail_row; /* the tile holds the last row of xq */
  int8_t *abuf; /* TILE_ROWS x 64 bytes, for an A tile that would read past xq */
} tile_ctx;

/* Issues group g's tile products into C set s (tmm0, tmm1 from A tmm4, or
 * tmm2, tmm3 from tmm5), nc panels. */
static ALWAYS_INLINE void issue(const int s, const int nc, const int64_t kstep, const tile_ctx *tc,
                                int64_t g) {
  const wq_job *wq = &tc->job->wq;
  const int64_t ldq = wq->ldq, k0 = g * wq->gl, len = group_len(wq, g);
  const int64_t padded = round_up(len, kstep), sgb = tc->job->sgb;
  const uint8_t *b0 = tc->b0 + (g - tc->g0) * sgb, *b1 = tc->b1 + (g - tc->g0) * sgb;
  if (s == 0) {
    _tile_zero(0);
    if (nc == 2) _tile_zero(1);
  } else {
    _tile_zero(2);
    if (nc == 2) _tile_zero(3);
  }
  for (int64_t kk = 0; kk < padded; kk += kstep) {
    const int8_t *a = tc->x + k0 + kk;
    int64_t lda = ldq;
    if (tc->tail_row && k0 + kk + kstep > ldq) {
      /* the valid bytes of each row; the rest meets zero rows of B */
      memset(tc->abuf, 0, TILE_ROWS * 64);
      for (int64_t i = 0; i < tc->job->mr; i++)
        memcpy(tc->abuf + i * 64, a + i * ldq, (size_t)(len - kk));
      memory_barrier();
      a = tc->abuf;
      lda = 64;
    }
    /* set s: A in tmm4 + s, C in tmm 2s and 2s + 1 (literal tile numbers: GCC's
     * intrinsics paste them into the assembly) */
#define DP_SET(TA, TC0, TC1)                    \
  do {                                          \
    _tile_loadd(TA, a, lda);                    \
    _tile_loadd(6, b0 + kk * PANEL, 64);        \
    _tile_dpbssd(TC0, TA, 6);                   \
    if (nc == 2) {                              \
      _tile_loadd(7, b1 + kk * PANEL, 64);      \
      _tile_dpbssd(TC1, TA, 7);                 \
    }                                           \
  } while (0)
    if (s == 0) DP_SET(4, 0, 1);
    else DP_SET(5, 2, 3);
#undef DP_SET
  }
}

/* Stores C set s (group g's sums) to cbuf. */
static ALWAYS_INLINE void store_c(const int s, const int nc, int32_t (*cbuf)[TILE_ROWS * PANEL]) {
  if (s == 0) {
    _tile_stored(0, cbuf[0], 64);
    if (nc == 2) _tile_stored(1, cbuf[1], 64);
  } else {
    _tile_stored(2, cbuf[0], 64);
    if (nc == 2) _tile_stored(3, cbuf[1], 64);
  }
}

/* The epilogue of groups [ga, gb) (at most EPI_GROUPS) from their sums in
 * cbuf[g - ga], row by row: t loaded once, the groups in order, stored once. */
static ALWAYS_INLINE void epilogue(const int bits, const int nc, const int64_t kstep,
                                   const tile_ctx *tc, int64_t ga, int64_t gb, const float *terms,
                                   int32_t (*cbuf)[2][TILE_ROWS * PANEL]) {
  const wq_job *wq = &tc->job->wq;
  const int64_t mr = tc->job->mr, sgb = tc->job->sgb;
  const float *scales[EPI_GROUPS][2]; /* each group's d (then o) of each panel */
  for (int64_t g = ga; g < gb; g++)
    for (int c = 0; c < nc; c++)
      scales[g - ga][c] = (const float *)((c ? tc->b1 : tc->b0) + (g - tc->g0) * sgb +
                                          round_up(group_len(wq, g), kstep) * PANEL);
  float *tb = tc->tb;
  for (int64_t i = 0; i < mr; i++) {
    const float *sxr = wq->scale + (tc->r + i) * wq->ldsc;
    __m512 t[2];
    for (int c = 0; c < nc; c++)
      t[c] = ga == 0 ? _mm512_setzero_ps() : _mm512_load_ps(tb + i * TBUF_LD + c * PANEL);
    for (int64_t g = ga; g < gb; g++) {
      const __m512 sx = _mm512_set1_ps(sxr[g]);
      for (int c = 0; c < nc; c++) {
        const __m512i acc = _mm512_load_si512(cbuf[g - ga][c] + i * PANEL);
        const __m512 a = no_contract(_mm512_mul_ps(_mm512_cvtepi32_ps(acc), sx));
        t[c] = _mm512_fmadd_ps(_mm512_load_ps(scales[g - ga][c]), a, t[c]);
        if (bits == 4)
          t[c] = _mm512_fmadd_ps(_mm512_load_ps(scales[g - ga][c] + PANEL),
                                 _mm512_set1_ps(terms[i * KB_MAX + g - tc->g0]), t[c]);
      }
    }
    for (int c = 0; c < nc; c++) _mm512_store_ps(tb + i * TBUF_LD + c * PANEL, t[c]);
  }
}

/* One row tile (rows r .. r+mr) of panels p (and p + 1 when nc = 2) over
 * the staged groups [g0, g1), onto t (tb, rows TBUF_LD floats apart); after
 * the last group, y. Two C sets take the groups in turn: group g+1's
 * products are issued before group g's sums are stored, and the epilogue
 * runs every EPI_GROUPS groups: the vector units work while the tile unit
 * computes, and few vector stores stand before the next tile loads. */
static ALWAYS_INLINE void row_tile(const int bits, const int nc, const int64_t kstep,
                                   const amx_job *job, int64_t r, int64_t p, int64_t g0,
                                   int64_t g1, const uint8_t *stage, float *tb) {
  const wq_job *wq = &job->wq;
  const int64_t mr = job->mr;
  int8_t abuf[TILE_ROWS * 64] __attribute__((aligned(64)));
  float terms[TILE_ROWS * KB_MAX];
  const tile_ctx tc = {.job = job,
                       .x = wq->xq + r * wq->ldq,
                       .r = r,
                       .g0 = g0,
                       .g1 = g1,
                       .b0 = stage,
                       .b1 = stage + (g1 - g0) * job->sgb,
                       .tb = tb,
                       .tail_row = r + mr == wq->m,
                       .abuf = abuf};
  if (bits == 4) /* b = (float)gsum * sx, per row and group: ref's one rounding */
    for (int64_t i = 0; i < mr; i++)
      for (int64_t g = g0; g < g1; g += 16) {
        const __mmask16 in = g1 - g >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (g1 - g)) - 1);
        const __m512i gs = _mm512_maskz_loadu_epi32(in, wq->gsum + (r + i) * wq->ldgs + g);
        const __m512 sx = _mm512_maskz_loadu_ps(in, wq->scale + (r + i) * wq->ldsc + g);
        _mm512_mask_storeu_ps(terms + i * KB_MAX + g - g0, in,
                              no_contract(_mm512_mul_ps(_mm512_cvtepi32_ps(gs), sx)));
      }
  int32_t cbuf[EPI_GROUPS][2][TILE_ROWS * PANEL] __attribute__((aligned(64)));
  issue(0, nc, kstep, &tc, g0);
  for (int64_t g = g0, ga = g0;;) { /* set 0 holds group g, even within the run from ga */
    if (g + 1 < g1) issue(1, nc, kstep, &tc, g + 1);
    store_c(0, nc, cbuf[g - ga]);
    if (++g == g1) {
      epilogue(bits, nc, kstep, &tc, ga, g, terms, cbuf);
      break;
    }
    if (g + 1 < g1) issue(0, nc, kstep, &tc, g + 1);
    store_c(1, nc, cbuf[g - ga]);
    if (++g == g1 || g - ga == EPI_GROUPS) {
      epilogue(bits, nc, kstep, &tc, ga, g, terms, cbuf);
      ga = g;
      if (g == g1) break;
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
  amx_tilecfg cfg;
  amx_cfg_init(&cfg);
  for (int t = 0; t < 4; t++) amx_cfg_tile(&cfg, t, (int)job->mr, 64); /* C: mr x 16 int32 */
  amx_cfg_tile(&cfg, 4, (int)job->mr, (int)kstep);                     /* A: mr x kstep */
  amx_cfg_tile(&cfg, 5, (int)job->mr, (int)kstep);
  amx_cfg_tile(&cfg, 6, (int)kstep / 4, 64); /* B: kstep/4 rows of 16 x 4 bytes */
  amx_cfg_tile(&cfg, 7, (int)kstep / 4, 64);
  memory_barrier();
  _tile_loadconfig(&cfg);
  for (int64_t i = i0; i < i1; i++) item(bits, kstep, job, i, stage, tbuf);
  _tile_release();
}

static void task8_32(void *ctx, int64_t i0, int64_t i1) { task(8, 32, ctx, i0, i1); }
static void task8_64(void *ctx, int64_t i0, int64_t i1) { task(8, 64, ctx, i0, i1); }
static void task4_32(void *ctx, int64_t i0, int64_t i1) { task(4, 32, ctx, i0, i1); }
static void task4_64(void *ctx, int64_t i0, int64_t i1) { task(4, 64, ctx, i0, i1); }

/* Runs a gemm_wq job of at least AMX_MIN_M rows (the whole call's or a
 * column window's) on the pool. */
static void amx_run(armllm_pool *pool, amx_job *job) {
  wq_job *wq = &job->wq;
  const int64_t m = wq->m, n = wq->n;
  const int bits = job->bits;
  job->mr = m < TILE_ROWS ? m : TILE_ROWS; /* < 16 only with AMX_MIN_M lowered */
  job->kstep = wq->gl == 32 ? 32 : 64;
  job->sgb = round_up(wq->gl, job->kstep) * PANEL + 2 * PANEL * (int64_t)sizeof(float);
  if ((double)m * (double)n * (double)wq->kpad < 4.0e6) pool = NULL;
  wq->kb = STAGE_BYTES / (2 * job->sgb);
  wq->kb = wq->kb < 1 ? 1 : wq->kb > KB_MAX ? KB_MAX : wq->kb;
  job->n_rb = (m + TBUF_ROWS - 1) / TBUF_ROWS;
  /* about ITEMS_PER_THREAD items a thread: chunks of an even number of panels */
  const int64_t threads = pool ? armllm_pool_threads(pool) : 1;
  int64_t n_pc = (ITEMS_PER_THREAD * threads + job->n_rb - 1) / job->n_rb;
  const int64_t pairs = (wq->panels + 1) / 2;
  n_pc = n_pc > pairs ? pairs : n_pc;
  wq->cp = 2 * ((pairs + n_pc - 1) / n_pc);
  wq->n_pc = (wq->panels + wq->cp - 1) / wq->cp;
  armllm_task_fn fn = bits == 4 ? (job->kstep == 32 ? task4_32 : task4_64)
                                : (job->kstep == 32 ? task8_32 : task8_64);
  armllm_pool_run(pool, job->n_rb * wq->n_pc, 1, fn, job);
}

void armllm_amx_gemm_wq(armllm_pool *pool, const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                        const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                        const void *packed_w, int64_t n, int bits, int64_t group,
                        const float *bias, float *y, int64_t ldy) {
  if (m < (armllm_q_group_len(group) == 32 ? AMX_MIN_M_G32 : AMX_MIN_M)) {
    armllm_avx512_gemm_wq(pool, xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, n, bits, group,
                          bias, y, ldy);
    return;
  }
  amx_job job = {.wq = wq_job_of(xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, n, bits,
                                 group, bias, y, ldy),
                 .bits = bits};
  amx_run(pool, &job);
}

void armllm_amx_gemm_wq_cols(const int8_t *xq, int64_t m, int64_t k, int64_t ldq,
                             const float *scale, int64_t ldsc, const int32_t *gsum, int64_t ldgs,
                             const void *packed_w, int64_t n, int bits, int64_t group, int64_t n0,
                             int64_t n1, const float *bias, float *y, int64_t ldy) {
  if (m < (armllm_q_group_len(group) == 32 ? AMX_MIN_M_G32 : AMX_MIN_M)) {
    armllm_avx512_gemm_wq_cols(xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, n, bits, group,
                               n0, n1, bias, y, ldy);
    return;
  }
  amx_job job = {.wq = wq_job_of(xq, m, k, ldq, scale, ldsc, gsum, ldgs, packed_w, n, bits,
                                 group, bias, y, ldy),
                 .bits = bits};
  wq_job_window(&job.wq, n0, n1);
  amx_run(NULL, &job);
}
