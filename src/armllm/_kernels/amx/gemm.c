/* amx/gemm.c: the bf16 GEMM y = x W^T (+ bias) on AMX tiles (TDPBF16PS),
 * for every M.
 *
 * Layout: avx512's "nr16k2" (packing is avx512's): per panel of 16 columns,
 * for each k pair kp the 16 columns' pairs, 64 bytes. 16 consecutive pairs
 * of one panel are exactly one B tile of K = 32 (16 rows of 64 bytes, row
 * stride 64): the kernel loads the packed weights as they are.
 *
 * Numerics (compute "bf16"): activations are rounded to bf16 pairs as
 * avx512 rounds them (avx512/bf16_round.h: round to nearest even, f32
 * denormals flushed); each output is TDPBF16PS's sum over K tiles of 32
 * ascending from +0 (partial sums of K blocks go through memory in f32:
 * exact), then + bias. TDPBF16PS does not give a vdpbf16ps chain's bits
 * (measured on this Xeon: 40% of outputs of random 16 x 16 x 128 products
 * differ in the last bits; it also flushes denormal results), so decode runs
 * AMX as well, with tiles of M rows (M < 16), instead of avx512's GEMV: a
 * row's bits then do not depend on the batch it is in
 * (test_gemm_rows_do_not_depend_on_batch*), and decode, which streams the
 * weights, runs as fast (measured: M = 1 at avx512's bandwidth, M = 8 2.2x
 * its speed). Accuracy: within 2^-8 * sum_k |x*w| of exact.
 *
 * Tiles: tmm0..3 accumulate a 32 x 32 block of y (2 row tiles x 2 panels),
 * tmm4/5 the two row tiles of x (16 rows x 16 pairs), tmm6/7 the two panels'
 * B tiles: per K tile, 4 loads feed 4 TDPBF16PS. An item is (row block of
 * up to AMX_MC rows, group of up to AMX_GP panels): x is read once per
 * group and the weights once per row block, so both are large (traffic per
 * MAC ~ 1/(4 GP) + 2/MC bytes; 64 x 8 was memory-bound at half the speed).
 * For each K block (about KCP_TARGET pairs at AMX_MC rows, longer for fewer rows: all
 * of K for decode, so that a panel's weights stream in one run) the row
 * block is rounded into a stack buffer (zero rows up to a whole row tile,
 * zero pairs up to a whole K tile); the accumulators live in a stack block
 * of the item's outputs (f32, fixed row stride: no edge tiles), and the last
 * K block adds the bias and copies the valid part out to y. A K block's last
 * partial K tile of weights is copied into a zeroed tile first (reading past
 * a panel's pairs would read the next panel's, or past the buffer). The
 * stack buffers take ~400 KiB (threads have 8 MiB stacks; the pool's too).
 *
 * Each pool chunk loads the tile configuration and ends with TILERELEASE
 * (measured: releasing costs nothing visible, within 2% at M = 1..64 on a
 * 576 x 576 matrix, so threads carry no tile state between jobs).
 */
#include <immintrin.h>

#include "../armllm_kernels.h"
#include "../avx512/bf16_round.h"
#include "tiles.h"

#define NR 16       /* columns per panel = f32 lanes of a C tile row */
#define KT 16       /* k pairs per K tile: 64 bytes of a tile row */
#ifndef AMX_KCP
#define AMX_KCP 320 /* k pairs of the rounded rows' buffer per row of a full row block */
#endif
#define KCP_TARGET 256 /* k pairs per K block aimed at for a full row block (more for
                         * fewer rows): 320 measured 0.83-0.97x of it at 8B shapes */
#ifndef AMX_MC
#define AMX_MC 128 /* rows per row block (multiple of 32): rounded, MC x KCP pairs on the stack */
#endif
#ifndef AMX_GP
#define AMX_GP 32 /* panels per group (even): the item's f32 block MC x 16 GP on the stack */
#endif
#ifndef AMX_PF
#define AMX_PF 4 /* K tiles ahead that the first row tile prefetches a panel's weights */
#endif
#define A_PAIRS (AMX_MC * (AMX_KCP + KT)) /* the rounded rows' buffer, in pairs */
#define LDC (AMX_GP * NR)  /* row stride of the accumulator block, in floats */
#define SERIAL_MACS 2.0e6  /* work below this stays on the calling thread ... */
#define SERIAL_BYTES (256 * 1024) /* ... unless it streams more weights than this */
#define ITEMS_PER_THREAD 3 /* enough items per thread to even out the panel groups */

_Static_assert(AMX_MC % (2 * AMX_TILE_ROWS) == 0, "row blocks are whole row-tile pairs");
_Static_assert(AMX_GP % 2 == 0, "groups are whole panel pairs");
_Static_assert(AMX_KCP % KT == 0, "K blocks are whole K tiles");
_Static_assert(AMX_MC * LDC * 4 + A_PAIRS * 4 <= 512 * 1024, "stack buffers fit L2");

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* Tile registers. GCC's tile intrinsics paste the register number into
 * their assembly, so these are macros, passed through one more macro level
 * (TZERO, ...) to be expanded to digits first. */
#define C00 0 /* accumulators: row tile 0 or 1, panel 0 or 1 */
#define C01 1
#define C10 2
#define C11 3
#define A0 4 /* row tiles of x */
#define A1 5
#define B0 6 /* panels' B tiles */
#define B1 7
#define TZERO(t) _tile_zero(t)
#define TLOAD(t, p, stride) _tile_loadd(t, p, stride)
#define TSTORE(t, p, stride) _tile_stored(t, p, stride)
#define TDP(c, a, b) _tile_dpbf16ps(c, a, b)

static inline int64_t n_panels(int64_t n) { return (n + NR - 1) / NR; }
static inline int64_t k_pairs(int64_t k) { return (k + 1) / 2; }

/* Lanes [0, n) of a 16-lane vector (n clamped to 0..16). */
static inline __mmask16 lanes(int64_t n) {
  return n >= NR ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* Rounds `rows` rows of x into the rounded rows' buffer (row stride lda
 * pairs) and zeroes rows [rows, rows_pad): whole tiles of M or 16 rows. */
static void round_rows(const float *x, int64_t ldx, int64_t rows, int64_t rows_pad,
                       int64_t valid, int64_t pairs, uint32_t *out, int64_t lda) {
  bf16_round_rows(x, ldx, rows, valid, pairs, out, lda);
  for (int64_t r = rows; r < rows_pad; r++)
    for (int64_t i = 0; i < pairs; i += KT)
      _mm512_storeu_si512(out + r * lda + i, _mm512_setzero_si512());
}

/* The 16 rows (64 bytes each) of a B tile, into L1. */
static ALWAYS_INLINE void prefetch_tile(const uint16_t *b) {
  for (int r = 0; r < KT; r++) _mm_prefetch((const char *)(b + r * 2 * NR), _MM_HINT_T0);
}

/* The accumulators of mt row tiles x np panels (tmm C00.. as named above)
 * over kt K tiles: a at the rounded rows (row stride lda pairs, row tile 1
 * at a + 16*lda), b[q] at panel q's first B tile (the next one 16 pairs
 * on); c the accumulator block (row tile i, panel q at c + 16i*LDC + 16q),
 * loaded first unless `first` (then zero), stored after. pf: prefetch the
 * weights AMX_PF K tiles ahead, up to K tile pf_end (the first row tile
 * does: it brings the panels' block in for the others). */
static ALWAYS_INLINE void tiles(const int mt, const int np, const uint32_t *a, int64_t lda,
                                const uint16_t *const *b, int64_t kt, float *c, int first,
                                int pf, int64_t pf_end) {
  const int64_t ldab = lda * 4, ldc = LDC * 4, ldb = NR * 4; /* bytes */
  const int64_t tile_elems = KT * 2 * NR;                   /* bf16 of a B tile */
  if (first) {
    TZERO(C00);
    if (np > 1) TZERO(C01);
    if (mt > 1) TZERO(C10);
    if (mt > 1 && np > 1) TZERO(C11);
  } else {
    TLOAD(C00, c, ldc);
    if (np > 1) TLOAD(C01, c + NR, ldc);
    if (mt > 1) TLOAD(C10, c + AMX_TILE_ROWS * LDC, ldc);
    if (mt > 1 && np > 1) TLOAD(C11, c + AMX_TILE_ROWS * LDC + NR, ldc);
  }
  for (int64_t t = 0; t < kt; t++) {
    if (AMX_PF && pf && t + AMX_PF < pf_end) {
      prefetch_tile(b[0] + (t + AMX_PF) * tile_elems);
      if (np > 1) prefetch_tile(b[1] + (t + AMX_PF) * tile_elems);
    }
    TLOAD(B0, b[0] + t * tile_elems, ldb);
    TLOAD(A0, a + t * KT, ldab);
    TDP(C00, A0, B0);
    if (np > 1) {
      TLOAD(B1, b[1] + t * tile_elems, ldb);
      TDP(C01, A0, B1);
    }
    if (mt > 1) {
      TLOAD(A1, a + AMX_TILE_ROWS * lda + t * KT, ldab);
      TDP(C10, A1, B0);
      if (np > 1) TDP(C11, A1, B1);
    }
  }
  TSTORE(C00, c, ldc);
  if (np > 1) TSTORE(C01, c + NR, ldc);
  if (mt > 1) TSTORE(C10, c + AMX_TILE_ROWS * LDC, ldc);
  if (mt > 1 && np > 1) TSTORE(C11, c + AMX_TILE_ROWS * LDC + NR, ldc);
}

typedef struct {
  const float *x;
  int64_t m, k, ldx;
  const uint16_t *w;
  int64_t n;
  const float *bias;
  float *y;
  int64_t ldy;
  int64_t panels; /* ceil(n / 16) */
  int64_t rows;   /* rows of a row tile: min(m, 16) */
  int64_t mc;     /* rows per row block: a multiple of 32, or m below 32 */
  int64_t kcp;    /* k pairs per K block (a multiple of 16) */
  int64_t gp;     /* panels per group */
  int64_t groups; /* ceil(panels / gp) */
} gemm_job;

/* A, B and C tiles of `rows` rows (all of them 16 but at M < 16). */
static void load_config(const gemm_job *job) {
  amx_tilecfg cfg;
  amx_cfg_init(&cfg);
  for (int t = C00; t <= C11; t++) amx_cfg_tile(&cfg, t, (int)job->rows, AMX_TILE_COLSB);
  amx_cfg_tile(&cfg, A0, (int)job->rows, AMX_TILE_COLSB);
  amx_cfg_tile(&cfg, A1, (int)job->rows, AMX_TILE_COLSB);
  amx_cfg_tile(&cfg, B0, AMX_TILE_ROWS, AMX_TILE_COLSB);
  amx_cfg_tile(&cfg, B1, AMX_TILE_ROWS, AMX_TILE_COLSB);
  _tile_loadconfig(&cfg);
}

/* y rows [m0, m0 + mv), panels [p0, p1) = the accumulators (+ bias). */
static void store_block(const gemm_job *job, const float *c, int64_t m0, int64_t mv, int64_t p0,
                        int64_t p1) {
  for (int64_t p = p0; p < p1; p++) {
    const __mmask16 mask = lanes(job->n - p * NR);
    const __m512 bias = job->bias ? _mm512_maskz_loadu_ps(mask, job->bias + p * NR)
                                  : _mm512_setzero_ps();
    for (int64_t r = 0; r < mv; r++) {
      __m512 v = _mm512_loadu_ps(c + r * LDC + (p - p0) * NR);
      if (job->bias) v = _mm512_add_ps(v, bias);
      _mm512_mask_storeu_ps(job->y + (m0 + r) * job->ldy + p * NR, mask, v);
    }
  }
}

static void gemm_task(void *ctx, int64_t i0, int64_t i1) {
  const gemm_job *job = ctx;
  const int64_t K = job->k, KP = k_pairs(K), pstride = KP * 2 * NR, tr = job->rows;
  const int64_t lda = job->kcp + KT; /* +64 B a row: rows 4 KiB apart would share L1 sets */
  uint32_t a[A_PAIRS] __attribute__((aligned(64)));            /* the row block, rounded */
  float c[AMX_MC * LDC] __attribute__((aligned(64)));          /* its accumulators */
  uint16_t btail[2][KT * 2 * NR] __attribute__((aligned(64))); /* a partial last K tile */
  load_config(job);
  for (int64_t item = i0; item < i1; item++) {
    const int64_t mb = item / job->groups, g = item % job->groups;
    const int64_t m0 = mb * job->mc, mv = job->m - m0 < job->mc ? job->m - m0 : job->mc;
    const int64_t p0 = g * job->gp, p1 = p0 + job->gp < job->panels ? p0 + job->gp : job->panels;
    const int64_t n_rt = (mv + tr - 1) / tr; /* row tiles */
    for (int64_t kb = 0; kb < KP; kb += job->kcp) {
      const int64_t kcp = KP - kb < job->kcp ? KP - kb : job->kcp;
      const int64_t full = kcp / KT, part = kcp % KT; /* whole K tiles, pairs of the last */
      round_rows(job->x + m0 * job->ldx + 2 * kb, job->ldx, mv, n_rt * tr, K - 2 * kb,
                 (full + (part > 0)) * KT, a, lda);
      for (int64_t p = p0; p < p1; p += 2) {
        const int np = p1 - p < 2 ? 1 : 2;
        const uint16_t *b[2], *bt[2];
        for (int q = 0; q < np; q++) {
          b[q] = job->w + (p + q) * pstride + kb * 2 * NR;
          if (!part) continue;
          memset(btail[q], 0, sizeof btail[q]);
          memcpy(btail[q], b[q] + full * KT * 2 * NR, (size_t)part * 2 * NR * sizeof(uint16_t));
          bt[q] = btail[q];
        }
        for (int64_t rt = 0; rt < n_rt; rt += 2) {
          const int mt = n_rt - rt < 2 ? 1 : 2;
          const uint32_t *ar = a + rt * tr * lda;
          float *cr = c + rt * tr * LDC + (p - p0) * NR;
#define TILES(MT, NP)                                                                      \
  do {                                                                                     \
    if (full) tiles(MT, NP, ar, lda, b, full, cr, kb == 0, rt == 0, full);                 \
    if (part) tiles(MT, NP, ar + full * KT, lda, bt, 1, cr, kb == 0 && !full, 0, 0);       \
  } while (0)
          if (mt == 2 && np == 2) TILES(2, 2);
          else if (mt == 2) TILES(2, 1);
          else if (np == 2) TILES(1, 2);
          else TILES(1, 1);
#undef TILES
        }
      }
    }
    store_block(job, c, m0, mv, p0, p1);
  }
  _tile_release();
}

void armllm_amx_gemm_bf16(armllm_pool *pool, const float *x, int64_t m, int64_t k, int64_t ldx,
                          const uint16_t *packed_w, int64_t n, const float *bias, float *y,
                          int64_t ldy) {
  gemm_job job = {x, m, k, ldx, packed_w, n, bias, y, ldy, n_panels(n), 0, 0, 0, 0, 0};
  job.rows = m < AMX_TILE_ROWS ? m : AMX_TILE_ROWS;
  /* row blocks of at most MC rows, evenly cut into whole row-tile pairs */
  int64_t mblocks = (m + AMX_MC - 1) / AMX_MC;
  const int64_t pair_rows = 2 * AMX_TILE_ROWS, mc = (m + mblocks - 1) / mblocks;
  job.mc = m < pair_rows ? m : (mc + pair_rows - 1) / pair_rows * pair_rows;
  mblocks = (m + job.mc - 1) / job.mc;
  /* K blocks: of equal whole K tiles, as many as blocks of KCP_TARGET pairs at
   * AMX_MC rows (proportionally longer for fewer rows) would make, rounded to
   * the nearest count, but enough for the rounded rows' buffer (few rows: all
   * of K, so that decode streams each panel's weights in one run). Equal and
   * rounded: a short last block (K = 576 as 512 + 64) costs its accumulators'
   * loads and stores for little work (measured: SmolLM2's K = 576 GEMMs
   * 1.02-1.10x faster as one block). */
  const int64_t rows_pad = (job.mc + job.rows - 1) / job.rows * job.rows;
  const int64_t kp_tiles = (k_pairs(k) + KT - 1) / KT * KT;
  const int64_t kcp_max = (A_PAIRS / rows_pad - KT) / KT * KT;
  const int64_t target = AMX_MC * (KCP_TARGET + KT) / rows_pad - KT;
  int64_t kblocks = (kp_tiles + target / 2) / target;
  if (kblocks < (kp_tiles + kcp_max - 1) / kcp_max) kblocks = (kp_tiles + kcp_max - 1) / kcp_max;
  job.kcp = (kp_tiles / KT + kblocks - 1) / kblocks * KT;
  if ((double)m * (double)n * (double)k < SERIAL_MACS &&
      (double)job.panels * NR * (double)k * sizeof(uint16_t) < SERIAL_BYTES)
    pool = NULL;
  /* panel groups: up to GP panels (whole pairs), but ITEMS_PER_THREAD items per thread */
  const int64_t threads = pool ? armllm_pool_threads(pool) : 1;
  int64_t gp = mblocks * job.panels / (ITEMS_PER_THREAD * threads);
  job.gp = gp < 2 ? 2 : gp > AMX_GP ? AMX_GP : gp / 2 * 2;
  job.groups = (job.panels + job.gp - 1) / job.gp;
  armllm_pool_run(pool, mblocks * job.groups, 1, gemm_task, &job);
}

/* Column windows: panels are contiguous (16 * 2 * KP bf16 each), so a window
 * starting on a panel is the matrix from that panel on. */
void armllm_amx_gemm_bf16_cols(const float *x, int64_t m, int64_t k, int64_t ldx,
                               const uint16_t *packed_w, int64_t n, int64_t n0, int64_t n1,
                               const float *bias, float *y, int64_t ldy) {
  (void)n;
  armllm_amx_gemm_bf16(NULL, x, m, k, ldx, packed_w + n0 * 2 * k_pairs(k), n1 - n0, bias, y, ldy);
}
