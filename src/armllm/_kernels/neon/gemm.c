/* neon/gemm.c: Armv8.0 NEON GEMM, f32 weights and bf16 weights widened to f32.
 *
 * Packed layout "nr12k1" (f32 and bf16 alike): W is cut into panels of 12
 * output rows (n); panel p holds, for k = 0..K-1, the 12 weights
 * W[12p + j, k] (j = 0..11) contiguously, i.e. packed[(p*K + k)*12 + j].
 * Rows past N are zero. K is not padded (every step is one real k).
 *
 * Every output element is one sequential FMA chain over k = 0..K-1 starting
 * from +0, then (+ bias) as a separate add: exactly what ref computes, so
 * both paths are bit-identical to ref, to each other (batch invariance) and
 * for any thread count. Lanes always run over n; k is never split.
 *
 * Decode (M <= 4, memory-bound): the panels are streamed once with all M
 * rows at once; x is read 4 k at a time and used by element (FMLA by lane);
 * 3 panels run together for M = 1, 2 for M = 2, so that >= 9 accumulators
 * hide the FMA latency. Threads split the panels.
 *
 * Prefill (M > 4): GotoBLAS-style. An 8 x KC block of x is transposed onto
 * the stack (k-major, 8 rows per k) and multiplied with 12-wide panels by an
 * 8x12 register tile (24 accumulators, 2 A + 3 B vectors, FMLA by element).
 * K is cut into blocks of KC; partial sums live in y between blocks (exact,
 * so the chain is unchanged). Items are (N chunk, 8-row M tile) pairs.
 */
#include <arm_neon.h>

#include "../armllm_kernels.h"
#include "../gemm_plan.h"
#include "gemm_neon.h"

#define NR 12           /* panel width (output rows of W) */
#define MR 8            /* prefill tile height (rows of x) */
#define KC 256          /* prefill K block: A block 8 KB, f32 panel block 12 KB */
_Static_assert(KC <= ARMLLM_ZERO_ROW_FLOATS, "K block longer than the zero row");
#define DECODE_MAX_M ARMLLM_GEMM_DECODE_MAX_M
#define CP_MAX 16       /* panels per prefill N chunk: 192 KB of f32 B block in L2 */
#define MIN_CHUNK_MACS (1 << 17) /* less work than this per chunk is not worth a thread */

/* ------------------------------------------------------------- packing */

size_t armllm_neon_gemm_f32_packed_len(int64_t n, int64_t k) {
  return (size_t)((n + NR - 1) / NR * NR * k);
}

size_t armllm_neon_gemm_bf16_packed_len(int64_t n, int64_t k) {
  return (size_t)((n + NR - 1) / NR * NR * k);
}

void armllm_neon_gemm_f32_pack(const float *w, int64_t n, int64_t k, float *packed) {
  for (int64_t p = 0; p < (n + NR - 1) / NR; p++)
    for (int64_t j = 0; j < NR; j++) {
      int64_t row = p * NR + j;
      float *dst = packed + p * k * NR + j;
      if (row < n)
        for (int64_t kk = 0; kk < k; kk++) dst[kk * NR] = w[row * k + kk];
      else
        for (int64_t kk = 0; kk < k; kk++) dst[kk * NR] = 0.0f;
    }
}

void armllm_neon_gemm_bf16_pack(const uint16_t *w, int64_t n, int64_t k, uint16_t *packed) {
  for (int64_t p = 0; p < (n + NR - 1) / NR; p++)
    for (int64_t j = 0; j < NR; j++) {
      int64_t row = p * NR + j;
      uint16_t *dst = packed + p * k * NR + j;
      if (row < n)
        for (int64_t kk = 0; kk < k; kk++) dst[kk * NR] = w[row * k + kk];
      else
        for (int64_t kk = 0; kk < k; kk++) dst[kk * NR] = 0;
    }
}

/* ------------------------------------------------------- B panel loads */

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* The 12 weights of one k at element offset `off` of a panel stream, as f32.
 * bf16: ZIP1/ZIP2 against zero put the bits in the high half of each lane
 * (both ASIMD pipes, unlike SHLL). */
ALWAYS_INLINE void load_b12(const void *base, int64_t off, int bf16, float32x4_t *b0,
                            float32x4_t *b1, float32x4_t *b2) {
  if (bf16) {
    const uint16_t *p = (const uint16_t *)base + off;
    const uint16x8_t z = vdupq_n_u16(0);
    uint16x8_t r = vld1q_u16(p);
    uint16x8_t s = vcombine_u16(vld1_u16(p + 8), vdup_n_u16(0));
    *b0 = vreinterpretq_f32_u16(vzip1q_u16(z, r));
    *b1 = vreinterpretq_f32_u16(vzip2q_u16(z, r));
    *b2 = vreinterpretq_f32_u16(vzip1q_u16(z, s));
  } else {
    const float *p = (const float *)base + off;
    *b0 = vld1q_f32(p);
    *b1 = vld1q_f32(p + 4);
    *b2 = vld1q_f32(p + 8);
  }
}

/* ------------------------------------------------------------- decode */

typedef struct {
  ARMLLM_GEMM_JOB_ARGS;
  int bf16;
  armllm_tile_grid grid; /* prefill: 8 x 12 tiles, K blocks of KC */
} neon_gemm_job;

ARMLLM_NEON_STORE_ROW(store_row12, 3)

/* y[0..M, panels p0..p0+P) for M <= 4 rows: one pass over the P panel
 * streams, M*3P accumulators, x used by lane 4 k at a time. */
ALWAYS_INLINE void decode_tile(const float *x, int64_t ldx, int64_t K, const void *w,
                               int64_t p0, const float *bias, float *y, int64_t ldy, int64_t N,
                               int M, int P, int bf16) {
  float32x4_t acc[4][9];
#pragma GCC unroll 4
  for (int m = 0; m < M; m++)
#pragma GCC unroll 9
    for (int v = 0; v < 3 * P; v++) acc[m][v] = vdupq_n_f32(0.0f);
  const int64_t pstride = K * NR; /* elements between panels */
  int64_t off = p0 * pstride;
  int64_t k = 0;
  for (; k + 4 <= K; k += 4) {
    float32x4_t xv[4];
#pragma GCC unroll 4
    for (int m = 0; m < M; m++) xv[m] = vld1q_f32(x + m * ldx + k);
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
#pragma GCC unroll 3
      for (int p = 0; p < P; p++) {
        float32x4_t b0, b1, b2;
        load_b12(w, off + p * pstride + (k + j) * NR, bf16, &b0, &b1, &b2);
#pragma GCC unroll 4
        for (int m = 0; m < M; m++) {
          switch (j) { /* the lane must be a constant */
            case 0:
              acc[m][3 * p] = vfmaq_laneq_f32(acc[m][3 * p], b0, xv[m], 0);
              acc[m][3 * p + 1] = vfmaq_laneq_f32(acc[m][3 * p + 1], b1, xv[m], 0);
              acc[m][3 * p + 2] = vfmaq_laneq_f32(acc[m][3 * p + 2], b2, xv[m], 0);
              break;
            case 1:
              acc[m][3 * p] = vfmaq_laneq_f32(acc[m][3 * p], b0, xv[m], 1);
              acc[m][3 * p + 1] = vfmaq_laneq_f32(acc[m][3 * p + 1], b1, xv[m], 1);
              acc[m][3 * p + 2] = vfmaq_laneq_f32(acc[m][3 * p + 2], b2, xv[m], 1);
              break;
            case 2:
              acc[m][3 * p] = vfmaq_laneq_f32(acc[m][3 * p], b0, xv[m], 2);
              acc[m][3 * p + 1] = vfmaq_laneq_f32(acc[m][3 * p + 1], b1, xv[m], 2);
              acc[m][3 * p + 2] = vfmaq_laneq_f32(acc[m][3 * p + 2], b2, xv[m], 2);
              break;
            default:
              acc[m][3 * p] = vfmaq_laneq_f32(acc[m][3 * p], b0, xv[m], 3);
              acc[m][3 * p + 1] = vfmaq_laneq_f32(acc[m][3 * p + 1], b1, xv[m], 3);
              acc[m][3 * p + 2] = vfmaq_laneq_f32(acc[m][3 * p + 2], b2, xv[m], 3);
              break;
          }
        }
      }
    }
  }
  for (; k < K; k++) { /* K % 4 tail, one k at a time */
#pragma GCC unroll 3
    for (int p = 0; p < P; p++) {
      float32x4_t b0, b1, b2;
      load_b12(w, off + p * pstride + k * NR, bf16, &b0, &b1, &b2);
#pragma GCC unroll 4
      for (int m = 0; m < M; m++) {
        float32x4_t xs = vld1q_dup_f32(x + m * ldx + k);
        acc[m][3 * p] = vfmaq_f32(acc[m][3 * p], b0, xs);
        acc[m][3 * p + 1] = vfmaq_f32(acc[m][3 * p + 1], b1, xs);
        acc[m][3 * p + 2] = vfmaq_f32(acc[m][3 * p + 2], b2, xs);
      }
    }
  }
#pragma GCC unroll 3
  for (int p = 0; p < P; p++) {
    int64_t n0 = (p0 + p) * NR;
    int64_t nv = N - n0 < NR ? N - n0 : NR;
#pragma GCC unroll 4
    for (int m = 0; m < M; m++)
      store_row12(y + m * ldy + n0, acc[m][3 * p], acc[m][3 * p + 1], acc[m][3 * p + 2],
                  bias ? bias + n0 : NULL, nv);
  }
}

#define DECODE_FN(name, M, P, BF)                                                          \
  static void name(const float *x, int64_t ldx, int64_t K, const void *w, int64_t p0,      \
                   const float *bias, float *y, int64_t ldy, int64_t N) {                  \
    decode_tile(x, ldx, K, w, p0, bias, y, ldy, N, M, P, BF);                              \
  }
DECODE_FN(dec_f32_1x3, 1, 3, 0)
DECODE_FN(dec_f32_2x2, 2, 2, 0)
DECODE_FN(dec_f32_4x1, 4, 1, 0)
DECODE_FN(dec_f32_1x1, 1, 1, 0)
DECODE_FN(dec_f32_2x1, 2, 1, 0)
DECODE_FN(dec_f32_3x1, 3, 1, 0)
DECODE_FN(dec_bf16_1x3, 1, 3, 1)
DECODE_FN(dec_bf16_2x2, 2, 2, 1)
DECODE_FN(dec_bf16_4x1, 4, 1, 1)
DECODE_FN(dec_bf16_1x1, 1, 1, 1)
DECODE_FN(dec_bf16_2x1, 2, 1, 1)
DECODE_FN(dec_bf16_3x1, 3, 1, 1)

static const armllm_decode_fn decode_group[2][DECODE_MAX_M + 1] = {
    {NULL, dec_f32_1x3, dec_f32_2x2, dec_f32_3x1, dec_f32_4x1},
    {NULL, dec_bf16_1x3, dec_bf16_2x2, dec_bf16_3x1, dec_bf16_4x1},
};
static const armllm_decode_fn decode_single[2][DECODE_MAX_M + 1] = {
    {NULL, dec_f32_1x1, dec_f32_2x1, dec_f32_3x1, dec_f32_4x1},
    {NULL, dec_bf16_1x1, dec_bf16_2x1, dec_bf16_3x1, dec_bf16_4x1},
};
static const int decode_panels[DECODE_MAX_M + 1] = {0, 3, 2, 1, 1};

/* ------------------------------------------------------------ prefill */

/* C[8x12] (+)= A[kc x 8] * B[kc x 12]: ap is k-major 8 floats per k, the B
 * panel stream starts at element `off`. C rows at c + i*ldc. first: start
 * from zero instead of C. bias (last K block only): added before storing. */
ALWAYS_INLINE void kern_8x12(int64_t kc, const float *ap, const void *w, int64_t off,
                             float *c, int64_t ldc, int first, const float *bias, int bf16) {
  float32x4_t c00, c01, c02, c10, c11, c12, c20, c21, c22, c30, c31, c32;
  float32x4_t c40, c41, c42, c50, c51, c52, c60, c61, c62, c70, c71, c72;
  if (first) {
    c00 = c01 = c02 = c10 = c11 = c12 = c20 = c21 = c22 = c30 = c31 = c32 = vdupq_n_f32(0.0f);
    c40 = c41 = c42 = c50 = c51 = c52 = c60 = c61 = c62 = c70 = c71 = c72 = c00;
  } else {
#define LOADC(i) \
  c##i##0 = vld1q_f32(c + i * ldc); c##i##1 = vld1q_f32(c + i * ldc + 4); c##i##2 = vld1q_f32(c + i * ldc + 8);
    LOADC(0) LOADC(1) LOADC(2) LOADC(3) LOADC(4) LOADC(5) LOADC(6) LOADC(7)
#undef LOADC
  }
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; k++) {
    float32x4_t a0 = vld1q_f32(ap + 8 * k), a1 = vld1q_f32(ap + 8 * k + 4);
    float32x4_t b0, b1, b2;
    load_b12(w, off + k * NR, bf16, &b0, &b1, &b2);
#define FMA3(i, a, l)                        \
  c##i##0 = vfmaq_laneq_f32(c##i##0, b0, a, l); \
  c##i##1 = vfmaq_laneq_f32(c##i##1, b1, a, l); \
  c##i##2 = vfmaq_laneq_f32(c##i##2, b2, a, l);
    FMA3(0, a0, 0) FMA3(1, a0, 1) FMA3(2, a0, 2) FMA3(3, a0, 3)
    FMA3(4, a1, 0) FMA3(5, a1, 1) FMA3(6, a1, 2) FMA3(7, a1, 3)
#undef FMA3
  }
  if (bias) {
    float32x4_t d0 = vld1q_f32(bias), d1 = vld1q_f32(bias + 4), d2 = vld1q_f32(bias + 8);
#define ADDB(i) c##i##0 = vaddq_f32(c##i##0, d0); c##i##1 = vaddq_f32(c##i##1, d1); c##i##2 = vaddq_f32(c##i##2, d2);
    ADDB(0) ADDB(1) ADDB(2) ADDB(3) ADDB(4) ADDB(5) ADDB(6) ADDB(7)
#undef ADDB
  }
#define STOREC(i) \
  vst1q_f32(c + i * ldc, c##i##0); vst1q_f32(c + i * ldc + 4, c##i##1); vst1q_f32(c + i * ldc + 8, c##i##2);
  STOREC(0) STOREC(1) STOREC(2) STOREC(3) STOREC(4) STOREC(5) STOREC(6) STOREC(7)
#undef STOREC
}

/* noinline: the kernels stay functions of their own (one copy, and each
 * inner loop where arm_mca_report looks for it) */
static __attribute__((noinline)) void kern_8x12_f32(int64_t kc, const float *ap, const void *w,
                                                    int64_t off, float *c, int64_t ldc, int first,
                                                    const float *bias) {
  kern_8x12(kc, ap, w, off, c, ldc, first, bias, 0);
}
static __attribute__((noinline)) void kern_8x12_bf16(int64_t kc, const float *ap, const void *w,
                                                     int64_t off, float *c, int64_t ldc, int first,
                                                     const float *bias) {
  kern_8x12(kc, ap, w, off, c, ldc, first, bias, 1);
}

/* The prefill rows (armllm_tile_rows_fn): ap[k*8 + r] = x[m0 + r, kb + k]
 * for k < kc, r < 8; rows past M are zero. 4x4 transposes with TRN1/TRN2. */
static void pack_a(const void *ctx, void *scratch, int64_t m0, int64_t kb, int64_t kc) {
  const neon_gemm_job *job = ctx;
  float *ap = scratch;
  const float *rp[MR];
  armllm_tile_rows_at(job->x, job->ldx, job->m, m0, kb, MR, rp);
  int64_t k = 0;
  for (; k + 4 <= kc; k += 4)
    for (int h = 0; h < 2; h++) {
      float32x4_t r0 = vld1q_f32(rp[4 * h] + k), r1 = vld1q_f32(rp[4 * h + 1] + k);
      float32x4_t r2 = vld1q_f32(rp[4 * h + 2] + k), r3 = vld1q_f32(rp[4 * h + 3] + k);
      float64x2_t t0 = vreinterpretq_f64_f32(vtrn1q_f32(r0, r1));
      float64x2_t t1 = vreinterpretq_f64_f32(vtrn2q_f32(r0, r1));
      float64x2_t t2 = vreinterpretq_f64_f32(vtrn1q_f32(r2, r3));
      float64x2_t t3 = vreinterpretq_f64_f32(vtrn2q_f32(r2, r3));
      float *d = ap + k * MR + 4 * h;
      vst1q_f32(d, vreinterpretq_f32_f64(vtrn1q_f64(t0, t2)));
      vst1q_f32(d + MR, vreinterpretq_f32_f64(vtrn1q_f64(t1, t3)));
      vst1q_f32(d + 2 * MR, vreinterpretq_f32_f64(vtrn2q_f64(t0, t2)));
      vst1q_f32(d + 3 * MR, vreinterpretq_f32_f64(vtrn2q_f64(t1, t3)));
    }
  for (; k < kc; k++)
    for (int r = 0; r < MR; r++) ap[k * MR + r] = rp[r][k];
}

/* ------------------------------------------------------------- driver */

static void decode_items(void *ctx, int64_t g0, int64_t g1) {
  const neon_gemm_job *job = ctx;
  armllm_decode_groups(g0, g1, job->grid.cp, job->grid.n_tiles, decode_group[job->bf16][job->m],
                       decode_single[job->bf16][job->m], job->x, job->ldx, job->k, job->w,
                       job->bias, job->y, job->ldy, job->n);
}

static void prefill_tile(const void *ctx, void *ap, int64_t p, int64_t kb, int64_t kc,
                         float *y, int64_t ldy, int first, const float *bias) {
  const neon_gemm_job *job = ctx;
  const int64_t off = (p * job->k + kb) * NR;
  if (job->bf16) kern_8x12_bf16(kc, ap, job->w, off, y, ldy, first, bias);
  else kern_8x12_f32(kc, ap, job->w, off, y, ldy, first, bias);
}

static void prefill_items(void *ctx, int64_t i0, int64_t i1) {
  const neon_gemm_job *job = ctx;
  float ap[KC * MR] __attribute__((aligned(64)));
  armllm_gemm_tiles(&job->grid, ctx, ap, i0, i1, pack_a, prefill_tile);
}

static void neon_gemm(armllm_pool *pool, const float *x, int64_t m, int64_t k, int64_t ldx,
                      const void *w, int64_t n, const float *bias, float *y, int64_t ldy,
                      int bf16) {
  neon_gemm_job job = {x, m, k, ldx, w, n, bias, y, ldy, bf16,
                       {m, n, MR, NR, (n + NR - 1) / NR, k, KC, 0, 0, y, ldy, bias}};
  armllm_gemm_run(pool, &job, &job.grid, k, m <= DECODE_MAX_M ? decode_panels[m] : 1, CP_MAX,
                  MIN_CHUNK_MACS, decode_items, prefill_items);
}

void armllm_neon_gemm_f32(armllm_pool *pool, const float *x, int64_t m, int64_t k, int64_t ldx,
                          const float *packed_w, int64_t n, const float *bias, float *y,
                          int64_t ldy) {
  neon_gemm(pool, x, m, k, ldx, packed_w, n, bias, y, ldy, 0);
}

void armllm_neon_gemm_bf16(armllm_pool *pool, const float *x, int64_t m, int64_t k,
                           int64_t ldx, const uint16_t *packed_w, int64_t n, const float *bias,
                           float *y, int64_t ldy) {
  neon_gemm(pool, x, m, k, ldx, packed_w, n, bias, y, ldy, 1);
}

/* Column windows: panels are contiguous (12 * K elements each), so a window
 * starting on a panel is the matrix from that panel on. */
void armllm_neon_gemm_f32_cols(const float *x, int64_t m, int64_t k, int64_t ldx,
                               const float *packed_w, int64_t n, int64_t n0, int64_t n1,
                               const float *bias, float *y, int64_t ldy) {
  (void)n;
  neon_gemm(NULL, x, m, k, ldx, packed_w + n0 * k, n1 - n0, bias, y, ldy, 0);
}

void armllm_neon_gemm_bf16_cols(const float *x, int64_t m, int64_t k, int64_t ldx,
                                const uint16_t *packed_w, int64_t n, int64_t n0, int64_t n1,
                                const float *bias, float *y, int64_t ldy) {
  (void)n;
  neon_gemm(NULL, x, m, k, ldx, packed_w + n0 * k, n1 - n0, bias, y, ldy, 1);
}
