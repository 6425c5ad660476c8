/* avx2/gemm.c: GEMM y = x W^T (+ bias) with prepacked weights, AVX2 + FMA.
 *
 * Packed layouts: N is cut into panels of 16 columns, the last one
 * zero-padded; panel p holds, for k = 0 .. K-1 in order, the 16 weights
 * W[16p + j, k], j = 0 .. 15, of one k consecutively (K is not padded):
 *   "nr16k1" (f32):   packed[(p*K + k)*16 + j] = W[16p + j, k]
 *   "nr16k1u" (bf16): the same with the columns of each k step in the order
 *                     0-3, 8-11, 4-7, 12-15, so that two in-lane unpacks with
 *                     zero widen them to f32 columns 0-7 and 8-15
 * (0 past N), packed_len = ceil(N/16) * 16 * K elements. bf16 weights are
 * widened to f32 exactly (into the high half); activations stay f32
 * (compute "f32").
 *
 * Every output is one sequential FMA chain over k ascending, started from
 * +0 and followed by + bias, exactly like ref: results are bit-identical to
 * ref, and therefore independent of M, of the path (decode/prefill) and of
 * the thread count. K blocks keep the chain: the partial sums go through y
 * in f32 between blocks.
 *
 * Prefill (M > 4): a 6x16 register tile (12 accumulators, 2 weight loads
 * and 6 broadcasts per k), x read in place (never past K). Work items are
 * (row block of about MC rows, group of up to GP panels), handed to the pool
 * one at a time; an item runs K block by K block (KC): within a K block its
 * x rows (MC x KC, 192 KiB) stay in L2 for every panel of the group, each
 * panel block (KC x 16, 16 KiB in f32) stays in L1 for every row tile, and
 * the next panel block is prefetched into L2 by the first row tile. bf16
 * panel blocks are widened once into a stack tile, reused by all rows.
 *
 * Decode (M <= 4): a GEMV that streams each panel once over the whole of K,
 * 1 to 4 panels at a time (6 to 8 FMA chains in flight, within the 16 ymm
 * registers), bf16 widened on the fly; with fewer than 4 panel streams it
 * prefetches 4 KiB ahead in software. The panels are split over the pool.
 */
#include <immintrin.h>

#include "../armllm_kernels.h"
#include "../gemm_plan.h"
#include "vexp_avx2.h"

#define NR 16
#define MR 6
#ifndef AVX2_KC
#define AVX2_KC 256 /* at most KC x 16 f32 = 16 KiB: half of L1d */
#endif
#ifndef AVX2_MC
#define AVX2_MC 192 /* multiple of MR; MC x KC f32 = 192 KiB of x in L2 */
#endif
#ifndef AVX2_GP
#define AVX2_GP 8 /* panels per group: the y block MC x 16*GP stays in L2 */
#endif
#ifndef AVX2_PF_BYTES
#define AVX2_PF_BYTES 4096 /* decode: software prefetch distance */
#define AVX2_GEMV_SHORT_K 1024 /* bf16 decode: look one panel group ahead at K up to this */
#endif
#define DECODE_MAX_M 4

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* ------------------------------------------------------------------ pack */

static inline int64_t n_panels(int64_t n) { return (n + NR - 1) / NR; }

size_t armllm_avx2_gemm_f32_packed_len(int64_t n, int64_t k) {
  return (size_t)(n_panels(n) * NR * k);
}
size_t armllm_avx2_gemm_bf16_packed_len(int64_t n, int64_t k) {
  return (size_t)(n_panels(n) * NR * k);
}

void armllm_avx2_gemm_f32_pack(const float *w, int64_t n, int64_t k, float *packed) {
  for (int64_t p = 0; p < n_panels(n); p++) {
    float *dst = packed + p * k * NR;
    int64_t cols = n - p * NR < NR ? n - p * NR : NR;
    for (int64_t kk = 0; kk < k; kk++) {
      for (int64_t j = 0; j < cols; j++) dst[kk * NR + j] = w[(p * NR + j) * k + kk];
      for (int64_t j = cols; j < NR; j++) dst[kk * NR + j] = 0.0f;
    }
  }
}

/* Position of column j (0..15) within a k step of a bf16 panel: the order
 * 0-3, 8-11, 4-7, 12-15 that the in-lane unpacks of widen16() undo. */
static inline int64_t bf16_slot(int64_t j) { return (j & 3) | ((j & 4) << 1) | ((j & 8) >> 1); }

void armllm_avx2_gemm_bf16_pack(const uint16_t *w, int64_t n, int64_t k, uint16_t *packed) {
  for (int64_t p = 0; p < n_panels(n); p++) {
    uint16_t *dst = packed + p * k * NR;
    int64_t cols = n - p * NR < NR ? n - p * NR : NR;
    for (int64_t kk = 0; kk < k; kk++)
      for (int64_t j = 0; j < NR; j++)
        dst[kk * NR + bf16_slot(j)] = j < cols ? w[(p * NR + j) * k + kk] : 0;
  }
}

/* ------------------------------------------------------------- helpers */

/* 16 packed bf16 weights of one k (in the "nr16k1u" order) to two f32
 * vectors of columns 0..7 and 8..15: interleaving with zeros puts each bf16
 * in the high half of a 32-bit lane, which is its exact f32 value. */
static ALWAYS_INLINE void widen16(const uint16_t *p, __m256 *lo, __m256 *hi) {
  __m256i v = _mm256_loadu_si256((const __m256i *)p), z = _mm256_setzero_si256();
  *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v));
  *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v));
}

typedef struct {
  __m256i lo, hi; /* lane masks of columns 0..7 and 8..15 of a partial panel */
} col_mask;

static inline col_mask make_mask(int64_t nv) {
  col_mask m;
  m.lo = armllm_avx2_tail_mask(nv < 8 ? nv : 8);
  m.hi = armllm_avx2_tail_mask(nv > 8 ? nv - 8 : 0);
  return m;
}

/* Writes a 16-wide accumulator pair to y (+ bias at the last K block),
 * masked for a partial panel. */
static ALWAYS_INLINE void store_pair(float *y, __m256 c0, __m256 c1, const float *bias, int full,
                                     col_mask cm) {
  if (full) {
    if (bias) {
      c0 = _mm256_add_ps(c0, _mm256_loadu_ps(bias));
      c1 = _mm256_add_ps(c1, _mm256_loadu_ps(bias + 8));
    }
    _mm256_storeu_ps(y, c0);
    _mm256_storeu_ps(y + 8, c1);
  } else {
    if (bias) {
      c0 = _mm256_add_ps(c0, _mm256_maskload_ps(bias, cm.lo));
      c1 = _mm256_add_ps(c1, _mm256_maskload_ps(bias + 8, cm.hi));
    }
    _mm256_maskstore_ps(y, cm.lo, c0);
    _mm256_maskstore_ps(y + 8, cm.hi, c1);
  }
}

/* ------------------------------------------------------ prefill kernel */

/* y[0..mr, 0..16) (+)= x[0..mr, 0..kc) * panel block w (kc x 16, f32).
 * load_c: continue the chains from y; bias: non-NULL at the last K block. */
static ALWAYS_INLINE void ukr(const int mr, const float *x, int64_t ldx, const float *w,
                              int64_t kc, float *y, int64_t ldy, int load_c,
                              const float *bias, int full, col_mask cm, const char *pf,
                              int64_t pf_step) {
  __m256 c[MR][2];
  const float *xr[MR];
  for (int i = 0; i < mr; i++) {
    xr[i] = x + i * ldx;
    if (!load_c) {
      c[i][0] = _mm256_setzero_ps();
      c[i][1] = _mm256_setzero_ps();
    } else if (full) {
      c[i][0] = _mm256_loadu_ps(y + i * ldy);
      c[i][1] = _mm256_loadu_ps(y + i * ldy + 8);
    } else {
      c[i][0] = _mm256_maskload_ps(y + i * ldy, cm.lo);
      c[i][1] = _mm256_maskload_ps(y + i * ldy + 8, cm.hi);
    }
  }
#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; k++) {
    __m256 b0 = _mm256_loadu_ps(w + k * NR), b1 = _mm256_loadu_ps(w + k * NR + 8);
    if (pf) _mm_prefetch(pf + k * pf_step, _MM_HINT_T1);
    for (int i = 0; i < mr; i++) {
      __m256 a = _mm256_broadcast_ss(xr[i] + k);
      c[i][0] = _mm256_fmadd_ps(a, b0, c[i][0]);
      c[i][1] = _mm256_fmadd_ps(a, b1, c[i][1]);
    }
  }
  for (int i = 0; i < mr; i++) store_pair(y + i * ldy, c[i][0], c[i][1], bias, full, cm);
}

/* The rows [m0, m1) of one panel block, in tiles of MR rows. pf: the next
 * panel block to be used (kc x 16 f32 or bf16 of pf_bytes_per_k per k), or
 * NULL; the first tile prefetches it into L2 while it computes. */
static void ukr_rows(const float *x, int64_t ldx, int64_t m0, int64_t m1, const float *w,
                     int64_t kc, float *y, int64_t ldy, int load_c, const float *bias,
                     int64_t nv, const char *pf, int64_t pf_step) {
  const int full = nv == NR;
  const col_mask cm = make_mask(nv);
  int64_t m = m0;
  if (full && m + MR <= m1) {
    if (pf) {
      ukr(MR, x + m * ldx, ldx, w, kc, y + m * ldy, ldy, load_c, bias, 1, cm, pf, pf_step);
      m += MR;
    }
    for (; m + MR <= m1; m += MR)
      ukr(MR, x + m * ldx, ldx, w, kc, y + m * ldy, ldy, load_c, bias, 1, cm, NULL, 0);
  }
  for (; m < m1; m += MR) {
    int64_t r = m1 - m;
    const float *xm = x + m * ldx;
    float *ym = y + m * ldy;
    switch (r >= MR ? MR : r) {
      case 6: ukr(6, xm, ldx, w, kc, ym, ldy, load_c, bias, full, cm, NULL, 0); break;
      case 5: ukr(5, xm, ldx, w, kc, ym, ldy, load_c, bias, full, cm, NULL, 0); break;
      case 4: ukr(4, xm, ldx, w, kc, ym, ldy, load_c, bias, full, cm, NULL, 0); break;
      case 3: ukr(3, xm, ldx, w, kc, ym, ldy, load_c, bias, full, cm, NULL, 0); break;
      case 2: ukr(2, xm, ldx, w, kc, ym, ldy, load_c, bias, full, cm, NULL, 0); break;
      default: ukr(1, xm, ldx, w, kc, ym, ldy, load_c, bias, full, cm, NULL, 0); break;
    }
  }
}

typedef struct {
  ARMLLM_GEMM_JOB_ARGS;
  int64_t panels; /* ceil(n / 16) */
  int64_t mc;     /* rows per row block (prefill) */
  int64_t gp;     /* panels per group (prefill) */
  int64_t groups; /* ceil(panels / gp) */
  int64_t kc;     /* K block (prefill) */
} gemm_job;

/* One prefill item: the rows of row block mb times the panels of group g,
 * K block by K block; within a K block the x rows (L2) are reused by every
 * panel of the group and each panel block (L1) by every row tile. */
static ALWAYS_INLINE void prefill_item(const gemm_job *job, int64_t item, const int bf16,
                                       float *wf) {
  const int64_t K = job->k;
  const int64_t mb = item / job->groups, g = item % job->groups;
  const int64_t m0 = mb * job->mc, m1 = m0 + job->mc < job->m ? m0 + job->mc : job->m;
  const int64_t p0 = g * job->gp, p1 = p0 + job->gp < job->panels ? p0 + job->gp : job->panels;
  const size_t esz = bf16 ? sizeof(uint16_t) : sizeof(float);
  const char *wbase = job->w;
  for (int64_t kb = 0; kb < K; kb += job->kc) {
    const int64_t kc = K - kb < job->kc ? K - kb : job->kc;
    const int load_c = kb > 0, last = kb + kc == K;
    for (int64_t p = p0; p < p1; p++) {
      const int64_t nv = job->n - p * NR < NR ? job->n - p * NR : NR;
      const float *bias = last && job->bias ? job->bias + p * NR : NULL;
      const char *blk = wbase + (size_t)((p * K + kb) * NR) * esz;
      /* the block after this one: the next panel, or the group's first at kb + KC */
      const char *pf = NULL;
      if (p + 1 < p1) pf = wbase + (size_t)(((p + 1) * K + kb) * NR) * esz;
      else if (!last) pf = wbase + (size_t)((p0 * K + kb + kc) * NR) * esz;
      const float *w = (const float *)blk;
      if (bf16) {
        const uint16_t *src = (const uint16_t *)blk;
        for (int64_t j = 0; j < kc * NR; j += 16) {
          __m256 lo, hi;
          widen16(src + j, &lo, &hi);
          _mm256_store_ps(wf + j, lo);
          _mm256_store_ps(wf + j + 8, hi);
          if (pf) _mm_prefetch(pf + j * 2, _MM_HINT_T1);
        }
        w = wf;
        pf = NULL;
      }
      ukr_rows(job->x + kb, job->ldx, m0, m1, w, kc, job->y + p * NR, job->ldy, load_c, bias,
               nv, pf, NR * (int64_t)esz);
    }
  }
}

static void prefill_f32_task(void *ctx, int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; i++) prefill_item(ctx, i, 0, NULL);
}

static void prefill_bf16_task(void *ctx, int64_t i0, int64_t i1) {
  float wf[AVX2_KC * NR] __attribute__((aligned(64))); /* one widened panel block */
  for (int64_t i = i0; i < i1; i++) prefill_item(ctx, i, 1, wf);
}

/* ------------------------------------------------------- decode kernel */

/* Software prefetch ahead in the panel streams: it helps when a group has
 * 1 or 2 panels (streams); with 4 streams the hardware prefetch is faster. */
#ifndef GEMV_PF
#define GEMV_PF(mr) ((mr) >= 2)
#endif

/* mr (1..4) rows of x times np consecutive panels (np*mr*2 accumulators),
 * the whole of K, one FMA chain per output. */
static ALWAYS_INLINE void gemv(const int mr, const int np, const int bf16, const float *x,
                               int64_t ldx, const void *wv, int64_t K, float *y, int64_t ldy,
                               const float *bias, int full, col_mask cm) {
  __m256 c[DECODE_MAX_M][4][2];
  for (int i = 0; i < mr; i++)
    for (int q = 0; q < np; q++) c[i][q][0] = c[i][q][1] = _mm256_setzero_ps();
  const float *wf = wv;
  const uint16_t *wb = wv;
  /* bf16 panels of short K are short streams that the hardware prefetcher
   * keeps restarting: fetch the next group's streams (np panels further)
   * into L2 while this group runs. */
  const int pf_next = bf16 && mr == 1 && K <= AVX2_GEMV_SHORT_K;
#pragma GCC unroll 2
  for (int64_t k = 0; k < K; k++) {
    __m256 a[DECODE_MAX_M];
    for (int i = 0; i < mr; i++) a[i] = _mm256_broadcast_ss(x + i * ldx + k);
    for (int q = 0; q < np; q++) {
      __m256 b0, b1;
      if (GEMV_PF(mr) && (!bf16 || (k & 1) == 0)) /* one line per k (f32), per 2 k (bf16) */
        _mm_prefetch((const char *)(bf16 ? (const void *)(wb + (q * K + k) * NR)
                                         : (const void *)(wf + (q * K + k) * NR)) +
                         AVX2_PF_BYTES,
                     _MM_HINT_T0);
      if (pf_next && (k & 1) == 0) /* the next group's stream, one line per 2 k */
        _mm_prefetch((const char *)(wb + ((q + np) * K + k) * NR), _MM_HINT_T1);
      if (bf16) {
        widen16(wb + (q * K + k) * NR, &b0, &b1);
      } else {
        b0 = _mm256_loadu_ps(wf + (q * K + k) * NR);
        b1 = _mm256_loadu_ps(wf + (q * K + k) * NR + 8);
      }
      for (int i = 0; i < mr; i++) {
        c[i][q][0] = _mm256_fmadd_ps(a[i], b0, c[i][q][0]);
        c[i][q][1] = _mm256_fmadd_ps(a[i], b1, c[i][q][1]);
      }
    }
  }
  for (int q = 0; q < np; q++) {
    int last = q == np - 1; /* only the last panel of a group may be partial */
    for (int i = 0; i < mr; i++)
      store_pair(y + i * ldy + q * NR, c[i][q][0], c[i][q][1], bias ? bias + q * NR : NULL,
                 full || !last, cm);
  }
}

/* Panels per group: mr*np*2 accumulators + mr broadcasts + 2 (3) weight
 * registers must fit in 16 ymm, or the chains spill (3x slower). */
#define GEMV_NP(mr) ((mr) == 1 ? 4 : (mr) == 2 ? 2 : 1)

static ALWAYS_INLINE void decode_panels(const int mr, const int bf16, const gemm_job *job,
                                        int64_t p0, int64_t p1) {
  const int np = GEMV_NP(mr);
  const int64_t K = job->k;
  const float *wf = job->w;
  const uint16_t *wb = job->w;
  const int64_t last_nv = job->n - (job->panels - 1) * NR;
  const col_mask cm = make_mask(last_nv);
  for (int64_t p = p0; p < p1;) {
    int64_t left = p1 - p;
    int g = left >= np ? np : (int)left;
    int full = p + g < job->panels || last_nv == NR;
    const void *w = bf16 ? (const void *)(wb + p * K * NR) : (const void *)(wf + p * K * NR);
    const float *bias = job->bias ? job->bias + p * NR : NULL;
    float *y = job->y + p * NR;
    if (g == np)
      gemv(mr, np, bf16, job->x, job->ldx, w, K, y, job->ldy, bias, full, cm);
    else if (g == 3)
      gemv(mr, 3, bf16, job->x, job->ldx, w, K, y, job->ldy, bias, full, cm);
    else if (g == 2)
      gemv(mr, 2, bf16, job->x, job->ldx, w, K, y, job->ldy, bias, full, cm);
    else
      gemv(mr, 1, bf16, job->x, job->ldx, w, K, y, job->ldy, bias, full, cm);
    p += g;
  }
}

static void decode_f32_task(void *ctx, int64_t p0, int64_t p1) {
  const gemm_job *job = ctx;
  switch (job->m) {
    case 1: decode_panels(1, 0, job, p0, p1); break;
    case 2: decode_panels(2, 0, job, p0, p1); break;
    case 3: decode_panels(3, 0, job, p0, p1); break;
    default: decode_panels(4, 0, job, p0, p1); break;
  }
}

static void decode_bf16_task(void *ctx, int64_t p0, int64_t p1) {
  const gemm_job *job = ctx;
  switch (job->m) {
    case 1: decode_panels(1, 1, job, p0, p1); break;
    case 2: decode_panels(2, 1, job, p0, p1); break;
    case 3: decode_panels(3, 1, job, p0, p1); break;
    default: decode_panels(4, 1, job, p0, p1); break;
  }
}

/* ------------------------------------------------------------ drivers */

static void gemm_run(armllm_pool *pool, gemm_job *job, size_t wsize, armllm_task_fn decode,
                     armllm_task_fn prefill) {
  const int64_t panels = job->panels;
  if (job->m <= DECODE_MAX_M) {
    /* memory-bound: split the panels; tiny matrices stay on the caller */
    if ((double)panels * NR * (double)job->k * (double)wsize < 256.0 * 1024) pool = NULL;
    int64_t np = GEMV_NP(job->m);
    int64_t grain = armllm_pool_grain(pool, panels, 4, np);
    grain = (grain + np - 1) / np * np; /* whole panel groups per chunk */
    armllm_pool_run(pool, panels, grain, decode, job);
    return;
  }
  job->kc = AVX2_KC; /* the last K block may be short */
  /* row blocks of at most about MC rows, evenly cut into whole tiles */
  int64_t mblocks = (job->m + AVX2_MC - 1) / AVX2_MC;
  int64_t mc = (job->m + mblocks - 1) / mblocks;
  job->mc = (mc + MR - 1) / MR * MR;
  mblocks = (job->m + job->mc - 1) / job->mc;
  if ((double)job->m * (double)job->n * (double)job->k < 2.0e6) pool = NULL;
  /* panel groups: up to AVX2_GP panels, but at least ~3 items per thread */
  int64_t threads = pool ? armllm_pool_threads(pool) : 1;
  int64_t gp = mblocks * panels / (3 * threads);
  gp = gp < 1 ? 1 : gp > AVX2_GP ? AVX2_GP : gp;
  job->gp = gp;
  job->groups = (panels + gp - 1) / gp;
  armllm_pool_run(pool, mblocks * job->groups, 1, prefill, job);
}

void armllm_avx2_gemm_f32(armllm_pool *pool, const float *x, int64_t m, int64_t k, int64_t ldx,
                          const float *packed_w, int64_t n, const float *bias, float *y,
                          int64_t ldy) {
  gemm_job job = {x, m, k, ldx, packed_w, n, bias, y, ldy, n_panels(n), 0, 0, 0, 0};
  gemm_run(pool, &job, sizeof(float), decode_f32_task, prefill_f32_task);
}

void armllm_avx2_gemm_bf16(armllm_pool *pool, const float *x, int64_t m, int64_t k,
                           int64_t ldx, const uint16_t *packed_w, int64_t n, const float *bias,
                           float *y, int64_t ldy) {
  gemm_job job = {x, m, k, ldx, packed_w, n, bias, y, ldy, n_panels(n), 0, 0, 0, 0};
  gemm_run(pool, &job, sizeof(uint16_t), decode_bf16_task, prefill_bf16_task);
}

/* Column windows: panels are contiguous (16 * K elements each, f32 and bf16
 * alike), so a window starting on a panel is the matrix from that panel on. */
void armllm_avx2_gemm_f32_cols(const float *x, int64_t m, int64_t k, int64_t ldx,
                               const float *packed_w, int64_t n, int64_t n0, int64_t n1,
                               const float *bias, float *y, int64_t ldy) {
  (void)n;
  armllm_avx2_gemm_f32(NULL, x, m, k, ldx, packed_w + n0 * k, n1 - n0, bias, y, ldy);
}

void armllm_avx2_gemm_bf16_cols(const float *x, int64_t m, int64_t k, int64_t ldx,
                                const uint16_t *packed_w, int64_t n, int64_t n0, int64_t n1,
                                const float *bias, float *y, int64_t ldy) {
  (void)n;
  armllm_avx2_gemm_bf16(NULL, x, m, k, ldx, packed_w + n0 * k, n1 - n0, bias, y, ldy);
}
