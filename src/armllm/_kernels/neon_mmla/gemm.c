/* neon_mmla/gemm.c: Armv8.6 gemm_bf16 on BFMMLA.
 *
 * Activations are rounded to bf16 (BFCVTN/BFCVTN2, round to nearest even)
 * and multiplied with bf16 weights by BFMMLA: one instruction takes a 2x4
 * block of x (2 rows, 4 k) and a 2x4 block of W (2 output rows, 4 k) and
 * accumulates their 2x2 product into 4 f32 lanes [x0w0, x0w1, x1w0, x1w1].
 *
 * Packed layout "nr8k4x2": W is cut into panels of 8 output rows; K into
 * groups of 4 (the last one zero-padded). Panel p, group g holds 4 vectors
 * of 8 bf16, vector q = rows 8p+2q and 8p+2q+1, 4 k each:
 *   packed[((p*G + g)*4 + q)*8 + h*4 + i] = W[8p + 2q + h, 4g + i],
 * G = ceil(K/4); rows past N and k past K are zero.
 *
 * Batch invariance: an output element is the chain of BFMMLA steps over the
 * k groups 0..G-1 from +0 (each lane depends only on its own x row and W
 * row), then + bias. Decode and prefill run the same chain, so results do
 * not depend on M, on the path or on the thread count.
 *
 * Decode (M <= 4): the x rows are converted on the fly (pairs of rows; an
 * odd last row is paired with zeros) and 2-3 panels are streamed at once.
 * Prefill (M > 4): an 8-row x block of KC k is converted and packed onto the
 * stack as BFMMLA A operands; the 8x8 register tile is 4 row pairs x 4 W
 * vectors = 16 accumulators, 16 BFMMLA per 4 A + 4 B loads. Partial sums
 * live in y between K blocks (exact f32 round trip).
 */
#include <arm_neon.h>

#include "../armllm_kernels.h"
#include "../gemm_plan.h"
#include "../neon/gemm_neon.h"

#define NRM 8            /* panel width (output rows of W) */
#define MRM 8            /* prefill tile height (rows of x), 4 pairs */
#define KCM 512          /* prefill K block (multiple of 4): 8 KB of A, 8 KB per panel */
_Static_assert(KCM <= ARMLLM_ZERO_ROW_FLOATS, "K block longer than the zero row");
#define DECODE_MAX_M ARMLLM_GEMM_DECODE_MAX_M
#define CP_MAX 24        /* panels per prefill N chunk: 192 KB B block in L2 */
#define MIN_CHUNK_MACS (1 << 18)

#define ALWAYS_INLINE static inline __attribute__((always_inline))

static inline int64_t groups_of(int64_t k) { return (k + 3) / 4; }

size_t armllm_neon_mmla_gemm_bf16_packed_len(int64_t n, int64_t k) {
  return (size_t)((n + NRM - 1) / NRM * NRM * groups_of(k) * 4);
}

void armllm_neon_mmla_gemm_bf16_pack(const uint16_t *w, int64_t n, int64_t k,
                                     uint16_t *packed) {
  const int64_t G = groups_of(k), panels = (n + NRM - 1) / NRM;
  for (int64_t p = 0; p < panels; p++)
    for (int64_t g = 0; g < G; g++)
      for (int q = 0; q < 4; q++)
        for (int h = 0; h < 2; h++) {
          int64_t row = p * NRM + 2 * q + h;
          uint16_t *dst = packed + ((p * G + g) * 4 + q) * 8 + h * 4;
          for (int i = 0; i < 4; i++) {
            int64_t kk = 4 * g + i;
            dst[i] = row < n && kk < k ? w[row * k + kk] : 0;
          }
        }
}

ALWAYS_INLINE bfloat16x8_t ld_bf16x8(const uint16_t *p) {
  return vreinterpretq_bf16_u16(vld1q_u16(p));
}

/* 4 k of row r (k0 .. k0+3, fewer if the row ends at k_end) as f32 */
ALWAYS_INLINE float32x4_t ld_x4(const float *row, int64_t k0, int64_t k_end) {
  if (k0 + 4 <= k_end) return vld1q_f32(row + k0);
  float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  memcpy(t, row + k0, (size_t)(k_end - k0) * sizeof *t);
  return vld1q_f32(t);
}

/* Rows (2 x 4 f32) of the 2x2-blocked accumulators: acc0 holds columns 0,1
 * of rows 0,1, acc1 columns 2,3. */
ALWAYS_INLINE float32x4_t row0_of(float32x4_t acc0, float32x4_t acc1) {
  return vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(acc0), vreinterpretq_f64_f32(acc1)));
}
ALWAYS_INLINE float32x4_t row1_of(float32x4_t acc0, float32x4_t acc1) {
  return vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(acc0), vreinterpretq_f64_f32(acc1)));
}

ARMLLM_NEON_STORE_ROW(store_row8, 2)

/* ------------------------------------------------------------- decode */

typedef struct {
  ARMLLM_GEMM_JOB_ARGS;
  armllm_tile_grid grid; /* prefill: 8 x 8 tiles, K blocks of KCM */
} mmla_gemm_job;


ALWAYS_INLINE void decode_tile(const float *x, int64_t ldx, int64_t K, const uint16_t *w,
                               int64_t p0, const float *bias, float *y, int64_t ldy, int64_t N,
                               int M, int P) {
  const int PAIRS = (M + 1) / 2;
  const int64_t G = groups_of(K), pstride = G * 32;
  const uint16_t *wp = w + p0 * pstride;
  float32x4_t acc[2][12];
#pragma GCC unroll 2
  for (int pr = 0; pr < PAIRS; pr++)
#pragma GCC unroll 12
    for (int v = 0; v < 4 * P; v++) acc[pr][v] = vdupq_n_f32(0.0f);
  /* full k groups read x directly; the last, partial one through a stack copy */
#define DECODE_STEP(LOADX)                                                             \
  {                                                                                    \
    bfloat16x8_t a[2];                                                                 \
    _Pragma("GCC unroll 2") for (int pr = 0; pr < PAIRS; pr++) {                       \
      const float *r0 = x + 2 * pr * ldx + 4 * g, *r1 = r0 + ldx;                      \
      a[pr] = vcvtq_low_bf16_f32(LOADX(r0));                                           \
      if (2 * pr + 1 < M) a[pr] = vcvtq_high_bf16_f32(a[pr], LOADX(r1));               \
    }                                                                                  \
    _Pragma("GCC unroll 3") for (int p = 0; p < P; p++)                                \
    _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {                              \
      bfloat16x8_t b = ld_bf16x8(wp + p * pstride + g * 32 + q * 8);                   \
      _Pragma("GCC unroll 2") for (int pr = 0; pr < PAIRS; pr++)                       \
        acc[pr][4 * p + q] = vbfmmlaq_f32(acc[pr][4 * p + q], a[pr], b);               \
    }                                                                                  \
  }
#define LOADX_FULL(r) vld1q_f32(r)
#define LOADX_TAIL(r) ld_x4(r, 0, K - 4 * g)
  int64_t g = 0;
  for (; g < K / 4; g++) DECODE_STEP(LOADX_FULL)
  if (g < G) DECODE_STEP(LOADX_TAIL)
#undef DECODE_STEP
#undef LOADX_FULL
#undef LOADX_TAIL
#pragma GCC unroll 3
  for (int p = 0; p < P; p++) {
    const int64_t n0 = (p0 + p) * NRM, nv = N - n0 < NRM ? N - n0 : NRM;
    const float *bp = bias ? bias + n0 : NULL;
#pragma GCC unroll 2
    for (int pr = 0; pr < PAIRS; pr++) {
      float32x4_t *c = &acc[pr][4 * p];
      const float32x4_t none = vdupq_n_f32(0.0f); /* no third vector */
      store_row8(y + 2 * pr * ldy + n0, row0_of(c[0], c[1]), row0_of(c[2], c[3]), none, bp, nv);
      if (2 * pr + 1 < M)
        store_row8(y + (2 * pr + 1) * ldy + n0, row1_of(c[0], c[1]), row1_of(c[2], c[3]), none,
                   bp, nv);
    }
  }
}

#define DECODE_FN(name, M, P)                                                              \
  static void name(const float *x, int64_t ldx, int64_t K, const void *w, int64_t p0,      \
                   const float *bias, float *y, int64_t ldy, int64_t N) {                  \
    decode_tile(x, ldx, K, w, p0, bias, y, ldy, N, M, P);                                  \
  }
DECODE_FN(dec_1x3, 1, 3)
DECODE_FN(dec_2x3, 2, 3)
DECODE_FN(dec_3x2, 3, 2)
DECODE_FN(dec_4x2, 4, 2)
DECODE_FN(dec_1x1, 1, 1)
DECODE_FN(dec_2x1, 2, 1)
DECODE_FN(dec_3x1, 3, 1)
DECODE_FN(dec_4x1, 4, 1)

static const armllm_decode_fn decode_group[DECODE_MAX_M + 1] = {NULL, dec_1x3, dec_2x3, dec_3x2,
                                                                 dec_4x2};
static const armllm_decode_fn decode_single[DECODE_MAX_M + 1] = {NULL, dec_1x1, dec_2x1, dec_3x1,
                                                                  dec_4x1};
static const int decode_panels[DECODE_MAX_M + 1] = {0, 3, 3, 2, 2};

/* ------------------------------------------------------------ prefill */

/* C[8x8] (+)= A * B over gc k groups. ap: per group 4 row-pair vectors;
 * bp: per group 4 W vectors. C rows at c + i*ldc; first: start from zero;
 * bias (last K block only) added before storing. */
static __attribute__((noinline)) void kern_8x8(int64_t gc, const uint16_t *ap, const uint16_t *bp, float *c, int64_t ldc,
                     int first, const float *bias) {
  float32x4_t c00, c01, c02, c03, c10, c11, c12, c13, c20, c21, c22, c23, c30, c31, c32, c33;
  if (first) {
    c00 = c01 = c02 = c03 = c10 = c11 = c12 = c13 = vdupq_n_f32(0.0f);
    c20 = c21 = c22 = c23 = c30 = c31 = c32 = c33 = c00;
  } else {
#define LOADC(i)                                                                        \
  {                                                                                     \
    float64x2_t r0a = vreinterpretq_f64_f32(vld1q_f32(c + (2 * i) * ldc));              \
    float64x2_t r0b = vreinterpretq_f64_f32(vld1q_f32(c + (2 * i) * ldc + 4));          \
    float64x2_t r1a = vreinterpretq_f64_f32(vld1q_f32(c + (2 * i + 1) * ldc));          \
    float64x2_t r1b = vreinterpretq_f64_f32(vld1q_f32(c + (2 * i + 1) * ldc + 4));      \
    c##i##0 = vreinterpretq_f32_f64(vtrn1q_f64(r0a, r1a));                              \
    c##i##1 = vreinterpretq_f32_f64(vtrn2q_f64(r0a, r1a));                              \
    c##i##2 = vreinterpretq_f32_f64(vtrn1q_f64(r0b, r1b));                              \
    c##i##3 = vreinterpretq_f32_f64(vtrn2q_f64(r0b, r1b));                              \
  }
    LOADC(0) LOADC(1) LOADC(2) LOADC(3)
#undef LOADC
  }
#pragma GCC unroll 2
  for (int64_t g = 0; g < gc; g++) {
    bfloat16x8_t a0 = ld_bf16x8(ap), a1 = ld_bf16x8(ap + 8), a2 = ld_bf16x8(ap + 16),
                 a3 = ld_bf16x8(ap + 24);
    bfloat16x8_t b0 = ld_bf16x8(bp), b1 = ld_bf16x8(bp + 8), b2 = ld_bf16x8(bp + 16),
                 b3 = ld_bf16x8(bp + 24);
#define MM4(i)                          \
  c##i##0 = vbfmmlaq_f32(c##i##0, a##i, b0); \
  c##i##1 = vbfmmlaq_f32(c##i##1, a##i, b1); \
  c##i##2 = vbfmmlaq_f32(c##i##2, a##i, b2); \
  c##i##3 = vbfmmlaq_f32(c##i##3, a##i, b3);
    MM4(0) MM4(1) MM4(2) MM4(3)
#undef MM4
    ap += 32;
    bp += 32;
  }
  float32x4_t d0 = vdupq_n_f32(0.0f), d1 = d0;
  if (bias) {
    d0 = vld1q_f32(bias);
    d1 = vld1q_f32(bias + 4);
  }
#define STOREC(i)                                                                         \
  {                                                                                       \
    float32x4_t r0a = row0_of(c##i##0, c##i##1), r1a = row1_of(c##i##0, c##i##1);         \
    float32x4_t r0b = row0_of(c##i##2, c##i##3), r1b = row1_of(c##i##2, c##i##3);         \
    if (bias) {                                                                           \
      r0a = vaddq_f32(r0a, d0); r1a = vaddq_f32(r1a, d0);                                 \
      r0b = vaddq_f32(r0b, d1); r1b = vaddq_f32(r1b, d1);                                 \
    }                                                                                     \
    vst1q_f32(c + (2 * i) * ldc, r0a);                                                    \
    vst1q_f32(c + (2 * i) * ldc + 4, r0b);                                                \
    vst1q_f32(c + (2 * i + 1) * ldc, r1a);                                                \
    vst1q_f32(c + (2 * i + 1) * ldc + 4, r1b);                                            \
  }
  STOREC(0) STOREC(1) STOREC(2) STOREC(3)
#undef STOREC
}

/* The prefill rows (armllm_tile_rows_fn): ap[(g*4 + pr)*8 + h*4 + i] =
 * bf16(x[m0 + 2pr + h, kb + 4g + i]) for the ceil(kc/4) groups of this K
 * block; rows past M and k past K are zero. */
static void pack_a(const void *ctx, void *scratch, int64_t m0, int64_t kb, int64_t kc) {
  const mmla_gemm_job *job = ctx;
  uint16_t *ap = scratch;
  const float *rp[MRM];
  armllm_tile_rows_at(job->x, job->ldx, job->m, m0, kb, MRM, rp);
  const int64_t gc = groups_of(kc);
  for (int64_t g = 0; g < gc; g++)
    for (int pr = 0; pr < 4; pr++) {
      bfloat16x8_t v = vcvtq_low_bf16_f32(ld_x4(rp[2 * pr], 4 * g, kc));
      v = vcvtq_high_bf16_f32(v, ld_x4(rp[2 * pr + 1], 4 * g, kc));
      vst1q_u16(ap + (g * 4 + pr) * 8, vreinterpretq_u16_bf16(v));
    }
}

/* ------------------------------------------------------------- driver */

static void decode_items(void *ctx, int64_t g0, int64_t g1) {
  const mmla_gemm_job *job = ctx;
  armllm_decode_groups(g0, g1, job->grid.cp, job->grid.n_tiles, decode_group[job->m],
                       decode_single[job->m], job->x, job->ldx, job->k, job->w, job->bias, job->y,
                       job->ldy, job->n);
}

static void prefill_tile(const void *ctx, void *ap, int64_t p, int64_t kb, int64_t kc,
                         float *y, int64_t ldy, int first, const float *bias) {
  const mmla_gemm_job *job = ctx;
  const uint16_t *bp = (const uint16_t *)job->w + (p * groups_of(job->k) + kb / 4) * 32;
  kern_8x8(groups_of(kc), ap, bp, y, ldy, first, bias);
}

static void prefill_items(void *ctx, int64_t i0, int64_t i1) {
  const mmla_gemm_job *job = ctx;
  uint16_t ap[KCM * MRM] __attribute__((aligned(64)));
  armllm_gemm_tiles(&job->grid, ctx, ap, i0, i1, pack_a, prefill_tile);
}

void armllm_neon_mmla_gemm_bf16(armllm_pool *pool, const float *x, int64_t m, int64_t k,
                                int64_t ldx, const uint16_t *packed_w, int64_t n,
                                const float *bias, float *y, int64_t ldy) {
  mmla_gemm_job job = {x, m, k, ldx, packed_w, n, bias, y, ldy,
                       {m, n, MRM, NRM, (n + NRM - 1) / NRM, k, KCM, 0, 0, y, ldy, bias}};
  armllm_gemm_run(pool, &job, &job.grid, k, m <= DECODE_MAX_M ? decode_panels[m] : 1, CP_MAX,
                  MIN_CHUNK_MACS, decode_items, prefill_items);
}

/* Column windows: panels are contiguous (8 rows x 4 G bf16 each), so a window
 * starting on a panel is the matrix from that panel on. */
void armllm_neon_mmla_gemm_bf16_cols(const float *x, int64_t m, int64_t k, int64_t ldx,
                                     const uint16_t *packed_w, int64_t n, int64_t n0, int64_t n1,
                                     const float *bias, float *y, int64_t ldy) {
  (void)n;
  armllm_neon_mmla_gemm_bf16(NULL, x, m, k, ldx, packed_w + n0 * groups_of(k) * 4, n1 - n0, bias,
                             y, ldy);
}
