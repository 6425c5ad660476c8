/* avx512/gemm.c: GEMM y = x W^T (+ bias) with prepacked weights, AVX-512
 * (F/BW/VL) FMA for f32 weights and AVX512_BF16 vdpbf16ps for bf16 weights.
 *
 * Packed layouts: N is cut into panels of 16 columns (one zmm), the last
 * one zero-padded:
 *   "nr16k1" (f32, avx2's layout: buffers are interchangeable): for
 *     k = 0 .. K-1 in order the 16 weights of one k,
 *     packed[(p*K + k)*16 + j] = W[16p + j, k]; length ceil(N/16)*16*K.
 *   "nr16k2" (bf16): k in pairs (k = 2kp, 2kp + 1), KP = ceil(K/2), the
 *     last pair's odd half zero when K is odd; for kp in order the 16
 *     columns' pairs, packed[((p*KP + kp)*16 + j)*2 + h] = W[16p + j, 2kp + h];
 *     length ceil(N/16)*16*2*KP. One 512-bit load is a vdpbf16ps operand:
 *     32-bit lane j holds column j's pair (even k in the low half).
 *
 * f32 (compute "f32"): every output is one sequential FMA chain over k
 * ascending from +0, then + bias, exactly like ref: ref's bits, whatever M,
 * the path (decode/prefill) or the thread count.
 *
 * bf16 (compute "bf16"): activations are rounded to bf16 (vcvtne2ps2bf16:
 * round to nearest even; like vdpbf16ps it flushes f32 denormals to zero)
 * in pairs of k matching the weights', and every output is the chain of
 * vdpbf16ps steps over kp ascending from +0, then + bias. The decode GEMV
 * runs the same chain as the prefill tiles (not the exact f32 widening):
 * a row then gets the same bits alone or inside a batch of any size, which
 * the engine relies on (a request's tokens do not depend on what else runs
 * in its step); decode is bandwidth-bound, so the dot-product form costs
 * nothing there. Accuracy: within 2^-8 * sum_k |x*w| of exact.
 *
 * K blocks keep the chains: partial sums go through y in f32 (exact).
 *
 * Prefill (M > DECODE_MAX_M): a 12 x 32 register tile (2 panels, 24 zmm
 * accumulators; per k step 2 weight loads and 12 broadcasts from memory).
 * The rows of a row block and K block are first copied (f32) or rounded
 * (bf16) into a stack buffer with a fixed row stride: a broadcast is then
 * one displacement from one pointer, and rows of x 4 KiB-multiples apart
 * do not compete for the same L1 sets. Work items are (row block of about
 * MC rows, group of up to GP panels), one at a time from the pool; an item
 * runs K block by K block: the panel-pair block (16 KiB, L1) is reused by
 * every row tile, the row block's copy (48 KiB, L1/L2) by every panel pair
 * of the group, and the first row tile prefetches the next pair's block
 * into L2. Tails: a partial last panel is a lane mask on y and
 * bias (never on the zero-padded weights), a short row tile is a tile of
 * fewer rows (the row count is a compile-time constant of each copy), a
 * short K block a shorter loop; odd K is the zero half of the last pair.
 *
 * Decode (M <= DECODE_MAX_M = 8): a GEMV that streams groups of panels over
 * the whole of K (4 panels up to 4 rows, 2 above: at most 16 accumulators),
 * split over the pool by panel groups; bf16 rows are rounded K block by K
 * block into a small stack buffer while the accumulators stay in registers.
 * Measured on AMD EPYC Zen 5 (2 threads, interleaved): at M = 1..8 it is 10-25%
 * faster than the prefill tiles, whose K blocks and 2-panel tiles keep
 * fewer weight streams in flight.
 */
#include <immintrin.h>

#include "../armllm_kernels.h"
#include "../cpu.h"
#include "../gemm_plan.h"
#include "bf16_round.h"

#define NR 16 /* columns per panel: one zmm of f32 */
#define MR 12 /* prefill tile rows */
#define TP 2  /* prefill tile panels: MR x TP = 24 of the 32 zmm hold accumulators */
#ifndef AVX512_KC
#define AVX512_KC 128 /* f32 K block: TP panels x KC x 64 B = 16 KiB of weights (half L1) */
#endif
#ifndef AVX512_KCP
#define AVX512_KCP 128 /* bf16 K block in pairs: TP x KCP x 64 B = 16 KiB of weights */
#endif
#ifndef AVX512_MC
#define AVX512_MC 96 /* rows per row block (multiple of MR): its K block of x is copied
                        (f32: MC x KC, bf16: rounded, MC x KCP pairs: 48 KiB) onto the stack */
#endif
#ifndef AVX512_GP
#define AVX512_GP 8 /* panels per group (multiple of TP): the y block MC x 128 stays in L2 */
#endif
#ifndef DECODE_MAX_M
#define DECODE_MAX_M 8 /* M above this takes the prefill tiles (measured: see the report) */
#endif
#define GEMV_NP 4 /* the most panels of a decode group: 4 weight streams */
/* Panels per decode group at mr rows: mr * np accumulators, at most 16 of the 32 zmm. */
#define GEMV_NP_AT(mr) ((mr) <= 4 ? GEMV_NP : GEMV_NP / 2)
#define GEMV_KBP 256  /* bf16 decode: pairs of a row rounded at a time (1 KiB a row) */
/* decode: software prefetch distance in each panel stream (as WQ_PF_BYTES);
 * none for bf16 weights on Zen 4 (armllm_x86_gemv_no_prefetch; f32 unmeasured):
 * on the 1B bf16 chain at M = 1, 2 threads (tools/bench_decode_chain.py, in
 * turn), it read 6% faster without, and at 0.90-0.92 of the probe's reads
 * against 0.76 where the box's bandwidth stood near 60 GB/s; 2 panel streams
 * rather than 4 were as fast, 1 slower. (Its quantized GEMVs keep theirs: Q4_K
 * 3% slower without, w4 1.5% faster.) */
#define GEMV_PF_BYTES 2048
#define DECODE_SERIAL_BYTES (256 * 1024) /* decode weights below this stay on the caller */
#define PREFILL_SERIAL_MACS 2.0e6        /* prefill work below this stays on the caller */

_Static_assert(AVX512_MC % MR == 0, "row blocks are whole tiles");
_Static_assert(AVX512_GP % TP == 0, "groups are whole tiles");

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* ------------------------------------------------------------------ pack */

static inline int64_t n_panels(int64_t n) { return (n + NR - 1) / NR; }
static inline int64_t k_pairs(int64_t k) { return (k + 1) / 2; }

size_t armllm_avx512_gemm_bf16_packed_len(int64_t n, int64_t k) {
  return (size_t)(n_panels(n) * NR * 2 * k_pairs(k));
}

void armllm_avx512_gemm_bf16_pack(const uint16_t *w, int64_t n, int64_t k, uint16_t *packed) {
  const int64_t kp_n = k_pairs(k);
  for (int64_t p = 0; p < n_panels(n); p++)
    for (int64_t kp = 0; kp < kp_n; kp++)
      for (int64_t j = 0; j < NR; j++)
        for (int64_t h = 0; h < 2; h++) {
          const int64_t row = p * NR + j, kk = 2 * kp + h;
          packed[((p * kp_n + kp) * NR + j) * 2 + h] = row < n && kk < k ? w[row * k + kk] : 0;
        }
}

/* ------------------------------------------------------------- helpers */

/* Lanes [0, n) of a 16-lane vector (n clamped to 0..16). */
static inline __mmask16 lanes(int64_t n) {
  return n >= NR ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* Copies k [0, kc) of `rows` rows of x (row stride ldx) to out[r*stride + k]
 * (whole vectors: up to kc rounded up to 16, zeros past kc). */
static inline void copy_rows(const float *x, int64_t ldx, int64_t rows, int64_t kc, float *out,
                             int64_t stride) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t i = 0; i < kc; i += NR)
      _mm512_storeu_ps(out + r * stride + i, _mm512_maskz_loadu_ps(lanes(kc - i), x + r * ldx + i));
}

/* y (+ bias) stored through lane mask m. */
static ALWAYS_INLINE void store16(float *y, __m512 c, const float *bias, __mmask16 m) {
  if (bias) c = _mm512_add_ps(c, _mm512_maskz_loadu_ps(m, bias));
  _mm512_mask_storeu_ps(y, m, c);
}

/* ------------------------------------------------------ prefill kernels */

/* y[0..mr, 0..16*np) (+)= x[0..mr, 0..kc) * np panels of f32 weights (panel q
 * at w + q*pstride, 16 floats a k); x is the row block's copy (row i at
 * x + i*AVX512_KC). load_c: continue the chains from y; bias: non-NULL at
 * the last K block; mask[q]: the valid lanes of panel q. */
static ALWAYS_INLINE void tile_f32(const int mr, const int np, const float *x, const float *w,
                                   int64_t pstride, int64_t kc, float *y, int64_t ldy,
                                   int load_c, const float *bias, const __mmask16 *mask,
                                   const float *pf) {
  __m512 c[MR][TP];
  for (int i = 0; i < mr; i++)
    for (int q = 0; q < np; q++)
      c[i][q] = load_c ? _mm512_maskz_loadu_ps(mask[q], y + i * ldy + q * NR) : _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; k++) {
    __m512 b[TP];
    for (int q = 0; q < np; q++) b[q] = _mm512_loadu_ps(w + q * pstride + k * NR);
    if (pf)
      for (int q = 0; q < TP; q++) _mm_prefetch((const char *)(pf + q * pstride + k * NR), _MM_HINT_T1);
    for (int i = 0; i < mr; i++) {
      const __m512 a = _mm512_set1_ps(x[i * AVX512_KC + k]);
      for (int q = 0; q < np; q++) c[i][q] = _mm512_fmadd_ps(a, b[q], c[i][q]);
    }
  }
  for (int i = 0; i < mr; i++)
    for (int q = 0; q < np; q++)
      store16(y + i * ldy + q * NR, c[i][q], bias ? bias + q * NR : NULL, mask[q]);
}

/* The bf16 twin: a holds the rows' bf16 pairs (row i at a + i*AVX512_KCP),
 * w the panels' pairs (panel q at w + q*pstride, 32 bf16 a pair step). */
static ALWAYS_INLINE void tile_bf16(const int mr, const int np, const uint32_t *a,
                                    const uint16_t *w, int64_t pstride, int64_t kcp, float *y,
                                    int64_t ldy, int load_c, const float *bias,
                                    const __mmask16 *mask, const uint16_t *pf) {
  __m512 c[MR][TP];
  for (int i = 0; i < mr; i++)
    for (int q = 0; q < np; q++)
      c[i][q] = load_c ? _mm512_maskz_loadu_ps(mask[q], y + i * ldy + q * NR) : _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t kp = 0; kp < kcp; kp++) {
    __m512bh b[TP];
    for (int q = 0; q < np; q++)
      b[q] = (__m512bh)_mm512_loadu_si512(w + q * pstride + kp * 2 * NR);
    if (pf)
      for (int q = 0; q < TP; q++)
        _mm_prefetch((const char *)(pf + q * pstride + kp * 2 * NR), _MM_HINT_T1);
    for (int i = 0; i < mr; i++) {
      const __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[i * AVX512_KCP + kp]);
      for (int q = 0; q < np; q++) c[i][q] = _mm512_dpbf16_ps(c[i][q], ai, b[q]);
    }
  }
  for (int i = 0; i < mr; i++)
    for (int q = 0; q < np; q++)
      store16(y + i * ldy + q * NR, c[i][q], bias ? bias + q * NR : NULL, mask[q]);
}

/* One copy of a tile kernel per (rows, panels): the loops above unroll into
 * registers only when both are constants. */
#define TILE_SWITCH(KERNEL, mv, np, ...)                     \
  do {                                                       \
    if ((np) == TP) {                                        \
      switch (mv) {                                          \
        case 12: KERNEL(12, TP, __VA_ARGS__); break;         \
        case 11: KERNEL(11, TP, __VA_ARGS__); break;         \
        case 10: KERNEL(10, TP, __VA_ARGS__); break;         \
        case 9: KERNEL(9, TP, __VA_ARGS__); break;           \
        case 8: KERNEL(8, TP, __VA_ARGS__); break;           \
        case 7: KERNEL(7, TP, __VA_ARGS__); break;           \
        case 6: KERNEL(6, TP, __VA_ARGS__); break;           \
        case 5: KERNEL(5, TP, __VA_ARGS__); break;           \
        case 4: KERNEL(4, TP, __VA_ARGS__); break;           \
        case 3: KERNEL(3, TP, __VA_ARGS__); break;           \
        case 2: KERNEL(2, TP, __VA_ARGS__); break;           \
        default: KERNEL(1, TP, __VA_ARGS__); break;          \
      }                                                      \
    } else {                                                 \
      switch (mv) {                                          \
        case 12: KERNEL(12, 1, __VA_ARGS__); break;          \
        case 11: KERNEL(11, 1, __VA_ARGS__); break;          \
        case 10: KERNEL(10, 1, __VA_ARGS__); break;          \
        case 9: KERNEL(9, 1, __VA_ARGS__); break;            \
        case 8: KERNEL(8, 1, __VA_ARGS__); break;            \
        case 7: KERNEL(7, 1, __VA_ARGS__); break;            \
        case 6: KERNEL(6, 1, __VA_ARGS__); break;            \
        case 5: KERNEL(5, 1, __VA_ARGS__); break;            \
        case 4: KERNEL(4, 1, __VA_ARGS__); break;            \
        case 3: KERNEL(3, 1, __VA_ARGS__); break;            \
        case 2: KERNEL(2, 1, __VA_ARGS__); break;            \
        default: KERNEL(1, 1, __VA_ARGS__); break;           \
      }                                                      \
    }                                                        \
  } while (0)

typedef struct {
  ARMLLM_GEMM_JOB_ARGS;
  int64_t panels; /* ceil(n / 16) */
  int64_t mc;     /* rows per row block (prefill) */
  int64_t gp;     /* panels per group (prefill) */
  int64_t groups; /* ceil(panels / gp) */
} gemm_job;

/* Lane masks of the panel pair starting at panel p (only the matrix's last
 * panel is partial). */
static inline void pair_masks(const gemm_job *job, int64_t p, __mmask16 *mask) {
  for (int q = 0; q < TP; q++) mask[q] = lanes(job->n - (p + q) * NR);
}

/* Where an item's next weight block starts, in steps of the layout (k for
 * f32, k pairs for bf16: panel p's step s is step p*steps + s): after panel
 * pair p's block at K step kb (kc steps long), the group's next pair at kb,
 * else its first pair at the next K block; -1 after the last. The first row
 * tile prefetches that block into L2 while it computes: a pair's block is
 * two streams of a few KiB, too short for the hardware prefetcher to bring
 * them from DRAM in time. */
static inline int64_t next_block_at(int64_t steps, int64_t p, int64_t p0, int64_t p1,
                                    int64_t kb, int64_t kc, int last) {
  if (p + TP < p1) return (p + TP) * steps + kb;
  return last ? -1 : p0 * steps + kb + kc;
}

static void prefill_f32_task(void *ctx, int64_t i0, int64_t i1) {
  const gemm_job *job = ctx;
  const int64_t K = job->k, pstride = K * NR;
  const float *wbase = job->w;
  /* the row block's K block, copied: rows of x a multiple of 4 KiB apart would
   * share L1 sets (12 rows of K = 4096 floats thrash them) */
  float xb[AVX512_MC * AVX512_KC] __attribute__((aligned(64)));
  for (int64_t item = i0; item < i1; item++) {
    const int64_t mb = item / job->groups, g = item % job->groups;
    const int64_t m0 = mb * job->mc, m1 = m0 + job->mc < job->m ? m0 + job->mc : job->m;
    const int64_t p0 = g * job->gp, p1 = p0 + job->gp < job->panels ? p0 + job->gp : job->panels;
    for (int64_t kb = 0; kb < K; kb += AVX512_KC) {
      const int64_t kc = K - kb < AVX512_KC ? K - kb : AVX512_KC;
      const int load_c = kb > 0, last = kb + kc == K;
      copy_rows(job->x + m0 * job->ldx + kb, job->ldx, m1 - m0, kc, xb, AVX512_KC);
      for (int64_t p = p0; p < p1; p += TP) {
        const int64_t np = p1 - p < TP ? p1 - p : TP;
        __mmask16 mask[TP];
        pair_masks(job, p, mask);
        const float *bias = last && job->bias ? job->bias + p * NR : NULL;
        const float *w = wbase + p * pstride + kb * NR;
        const int64_t next = next_block_at(K, p, p0, p1, kb, kc, last);
        for (int64_t m = m0; m < m1; m += MR) {
          const int64_t mv = m1 - m < MR ? m1 - m : MR;
          float *y = job->y + m * job->ldy + p * NR;
          const float *pf = m == m0 && next >= 0 ? wbase + next * NR : NULL;
#define CALL_F32(MV, NP, ...) tile_f32(MV, NP, __VA_ARGS__)
          TILE_SWITCH(CALL_F32, mv, np, xb + (m - m0) * AVX512_KC, w, pstride, kc, y, job->ldy,
                      load_c, bias, mask, pf);
#undef CALL_F32
        }
      }
    }
  }
}

static void prefill_bf16_task(void *ctx, int64_t i0, int64_t i1) {
  const gemm_job *job = ctx;
  const int64_t K = job->k, KP = k_pairs(K), pstride = KP * 2 * NR;
  const uint16_t *wbase = job->w;
  uint32_t a[AVX512_MC * AVX512_KCP] __attribute__((aligned(64))); /* the row block, rounded */
  for (int64_t item = i0; item < i1; item++) {
    const int64_t mb = item / job->groups, g = item % job->groups;
    const int64_t m0 = mb * job->mc, m1 = m0 + job->mc < job->m ? m0 + job->mc : job->m;
    const int64_t p0 = g * job->gp, p1 = p0 + job->gp < job->panels ? p0 + job->gp : job->panels;
    for (int64_t kb = 0; kb < KP; kb += AVX512_KCP) {
      const int64_t kcp = KP - kb < AVX512_KCP ? KP - kb : AVX512_KCP;
      const int load_c = kb > 0, last = kb + kcp == KP;
      bf16_round_rows(job->x + m0 * job->ldx + 2 * kb, job->ldx, m1 - m0, K - 2 * kb, kcp, a,
                 AVX512_KCP);
      for (int64_t p = p0; p < p1; p += TP) {
        const int64_t np = p1 - p < TP ? p1 - p : TP;
        __mmask16 mask[TP];
        pair_masks(job, p, mask);
        const float *bias = last && job->bias ? job->bias + p * NR : NULL;
        const uint16_t *w = wbase + p * pstride + kb * 2 * NR;
        const int64_t next = next_block_at(KP, p, p0, p1, kb, kcp, last);
        for (int64_t m = m0; m < m1; m += MR) {
          const int64_t mv = m1 - m < MR ? m1 - m : MR;
          float *y = job->y + m * job->ldy + p * NR;
          const uint16_t *pf = m == m0 && next >= 0 ? wbase + next * 2 * NR : NULL;
#define CALL_BF16(MV, NP, ...) tile_bf16(MV, NP, __VA_ARGS__)
          TILE_SWITCH(CALL_BF16, mv, np, a + (m - m0) * AVX512_KCP, w, pstride, kcp, y,
                      job->ldy, load_c, bias, mask, pf);
#undef CALL_BF16
        }
      }
    }
  }
}

/* ------------------------------------------------------- decode kernels */

/* mr (1..DECODE_MAX_M) rows of x times np consecutive f32 panels from w,
 * the whole of K, one FMA chain per output; mask: the last panel's lanes. */
static ALWAYS_INLINE void gemv_f32(const int mr, const int np, const float *x, int64_t ldx,
                                   const float *w, int64_t K, float *y, int64_t ldy,
                                   const float *bias, __mmask16 mask, int64_t pf) {
  __m512 c[DECODE_MAX_M][GEMV_NP];
  for (int i = 0; i < mr; i++)
    for (int q = 0; q < np; q++) c[i][q] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t k = 0; k < K; k++) {
    __m512 b[GEMV_NP];
    for (int q = 0; q < np; q++) {
      const float *wq = w + (q * K + k) * NR; /* one cache line */
      if (pf) _mm_prefetch((const char *)wq + pf, _MM_HINT_T0);
      b[q] = _mm512_loadu_ps(wq);
    }
    for (int i = 0; i < mr; i++) {
      const __m512 a = _mm512_set1_ps(x[i * ldx + k]);
      for (int q = 0; q < np; q++) c[i][q] = _mm512_fmadd_ps(a, b[q], c[i][q]);
    }
  }
  for (int i = 0; i < mr; i++)
    for (int q = 0; q < np; q++)
      store16(y + i * ldy + q * NR, c[i][q], bias ? bias + q * NR : NULL,
              q == np - 1 ? mask : (__mmask16)0xffff);
}

/* The bf16 twin: x rows rounded GEMV_KBP pairs at a time into a stack
 * buffer; the vdpbf16ps chains stay in registers across those blocks. */
static ALWAYS_INLINE void gemv_bf16(const int mr, const int np, const float *x, int64_t ldx,
                                    const uint16_t *w, int64_t K, float *y, int64_t ldy,
                                    const float *bias, __mmask16 mask, int64_t pf) {
  const int64_t KP = k_pairs(K);
  uint32_t a[DECODE_MAX_M * GEMV_KBP] __attribute__((aligned(64)));
  __m512 c[DECODE_MAX_M][GEMV_NP];
  for (int i = 0; i < mr; i++)
    for (int q = 0; q < np; q++) c[i][q] = _mm512_setzero_ps();
  for (int64_t kb = 0; kb < KP; kb += GEMV_KBP) {
    const int64_t kbp = KP - kb < GEMV_KBP ? KP - kb : GEMV_KBP;
    bf16_round_rows(x + 2 * kb, ldx, mr, K - 2 * kb, kbp, a, GEMV_KBP);
    const uint16_t *wk = w + kb * 2 * NR;
#pragma GCC unroll 2
    for (int64_t kp = 0; kp < kbp; kp++) {
      __m512bh b[GEMV_NP];
      for (int q = 0; q < np; q++) {
        const uint16_t *wq = wk + (q * KP + kp) * 2 * NR; /* one cache line */
        if (pf) _mm_prefetch((const char *)wq + pf, _MM_HINT_T0);
        b[q] = (__m512bh)_mm512_loadu_si512(wq);
      }
      for (int i = 0; i < mr; i++) {
        const __m512bh ai = (__m512bh)_mm512_set1_epi32((int)a[i * GEMV_KBP + kp]);
        for (int q = 0; q < np; q++) c[i][q] = _mm512_dpbf16_ps(c[i][q], ai, b[q]);
      }
    }
  }
  for (int i = 0; i < mr; i++)
    for (int q = 0; q < np; q++)
      store16(y + i * ldy + q * NR, c[i][q], bias ? bias + q * NR : NULL,
              q == np - 1 ? mask : (__mmask16)0xffff);
}

/* Panels [p0, p1) of the decode job, in groups of GEMV_NP (fewer at the end). */
static ALWAYS_INLINE void decode_panels(const int mr, const int bf16, const gemm_job *job,
                                        int64_t p0, int64_t p1) {
  const int64_t K = job->k, group = GEMV_NP_AT(mr);
  const int64_t pstride = bf16 ? k_pairs(K) * 2 * NR : K * NR; /* elements per panel */
  const int64_t pf = bf16 && armllm_x86_gemv_no_prefetch() ? 0 : GEMV_PF_BYTES;
  for (int64_t p = p0; p < p1; p += group) {
    const int np = p1 - p < group ? (int)(p1 - p) : (int)group;
    const __mmask16 mask = lanes(job->n - (p + np - 1) * NR);
    const float *bias = job->bias ? job->bias + p * NR : NULL;
    float *y = job->y + p * NR;
#define GEMV(NP)                                                                             \
  do {                                                                                       \
    if (bf16)                                                                                \
      gemv_bf16(mr, NP, job->x, job->ldx, (const uint16_t *)job->w + p * pstride, K, y,      \
                job->ldy, bias, mask, pf);                                                   \
    else                                                                                     \
      gemv_f32(mr, NP, job->x, job->ldx, (const float *)job->w + p * pstride, K, y, job->ldy, \
               bias, mask, pf);                                                              \
  } while (0)
    switch (np) { /* np <= group: the cases above it are never taken at mr > 4 */
      case 4: GEMV(GEMV_NP_AT(mr)); break;
      case 3: GEMV(mr <= 4 ? 3 : 1); break;
      case 2: GEMV(2); break;
      default: GEMV(1); break;
    }
#undef GEMV
  }
}

_Static_assert(DECODE_MAX_M == 8 && GEMV_NP == 4, "decode_task's and decode_panels' cases");

static ALWAYS_INLINE void decode_task(const int bf16, void *ctx, int64_t p0, int64_t p1) {
  const gemm_job *job = ctx;
  switch (job->m) {
    case 1: decode_panels(1, bf16, job, p0, p1); break;
    case 2: decode_panels(2, bf16, job, p0, p1); break;
    case 3: decode_panels(3, bf16, job, p0, p1); break;
    case 4: decode_panels(4, bf16, job, p0, p1); break;
    case 5: decode_panels(5, bf16, job, p0, p1); break;
    case 6: decode_panels(6, bf16, job, p0, p1); break;
    case 7: decode_panels(7, bf16, job, p0, p1); break;
    default: decode_panels(8, bf16, job, p0, p1); break;
  }
}

static void decode_f32_task(void *ctx, int64_t p0, int64_t p1) { decode_task(0, ctx, p0, p1); }
static void decode_bf16_task(void *ctx, int64_t p0, int64_t p1) { decode_task(1, ctx, p0, p1); }

/* ------------------------------------------------------------ drivers */

static void gemm_run(armllm_pool *pool, gemm_job *job, size_t wsize, armllm_task_fn decode,
                     armllm_task_fn prefill) {
  const int64_t panels = job->panels;
  if (job->m <= DECODE_MAX_M) {
    /* memory-bound: split the panels in whole groups; tiny matrices stay on the caller */
    if ((double)panels * NR * (double)job->k * (double)wsize < DECODE_SERIAL_BYTES) pool = NULL;
    int64_t grain = armllm_pool_grain(pool, panels, 4, GEMV_NP);
    grain = (grain + GEMV_NP - 1) / GEMV_NP * GEMV_NP; /* whole groups at any mr */
    armllm_pool_run(pool, panels, grain, decode, job);
    return;
  }
  /* row blocks of at most MC rows, evenly cut into whole tiles */
  int64_t mblocks = (job->m + AVX512_MC - 1) / AVX512_MC;
  const int64_t mc = (job->m + mblocks - 1) / mblocks;
  job->mc = (mc + MR - 1) / MR * MR;
  mblocks = (job->m + job->mc - 1) / job->mc;
  if ((double)job->m * (double)job->n * (double)job->k < PREFILL_SERIAL_MACS) pool = NULL;
  /* panel groups: up to GP panels (whole tiles), but at least ~3 items per thread */
  const int64_t threads = pool ? armllm_pool_threads(pool) : 1;
  int64_t gp = mblocks * panels / (3 * threads);
  gp = gp < TP ? TP : gp > AVX512_GP ? AVX512_GP : gp / TP * TP;
  job->gp = gp;
  job->groups = (panels + gp - 1) / gp;
  armllm_pool_run(pool, mblocks * job->groups, 1, prefill, job);
}

void armllm_avx512_gemm_f32(armllm_pool *pool, const float *x, int64_t m, int64_t k,
                            int64_t ldx, const float *packed_w, int64_t n, const float *bias,
                            float *y, int64_t ldy) {
  gemm_job job = {x, m, k, ldx, packed_w, n, bias, y, ldy, n_panels(n), 0, 0, 0};
  gemm_run(pool, &job, sizeof(float), decode_f32_task, prefill_f32_task);
}

void armllm_avx512_gemm_bf16(armllm_pool *pool, const float *x, int64_t m, int64_t k,
                             int64_t ldx, const uint16_t *packed_w, int64_t n,
                             const float *bias, float *y, int64_t ldy) {
  gemm_job job = {x, m, k, ldx, packed_w, n, bias, y, ldy, n_panels(n), 0, 0, 0};
  gemm_run(pool, &job, sizeof(uint16_t), decode_bf16_task, prefill_bf16_task);
}

/* Column windows: panels are contiguous (f32: 16 * K elements, bf16: 16 * 2 *
 * KP), so a window starting on a panel is the matrix from that panel on. */
void armllm_avx512_gemm_f32_cols(const float *x, int64_t m, int64_t k, int64_t ldx,
                                 const float *packed_w, int64_t n, int64_t n0, int64_t n1,
                                 const float *bias, float *y, int64_t ldy) {
  (void)n;
  armllm_avx512_gemm_f32(NULL, x, m, k, ldx, packed_w + n0 * k, n1 - n0, bias, y, ldy);
}

void armllm_avx512_gemm_bf16_cols(const float *x, int64_t m, int64_t k, int64_t ldx,
                                  const uint16_t *packed_w, int64_t n, int64_t n0, int64_t n1,
                                  const float *bias, float *y, int64_t ldy) {
  (void)n;
  armllm_avx512_gemm_bf16(NULL, x, m, k, ldx, packed_w + n0 * 2 * k_pairs(k), n1 - n0, bias, y,
                          ldy);
}
