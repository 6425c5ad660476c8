/* sve/gemm.c: SVE GEMM, y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]).
 *
 * Vector-length agnostic; the packed layouts do not depend on the vector
 * length, the micro-kernels are chosen at run time for the length in use
 * (class A: 128 bits, B: 256/384 bits, C: 512 bits and more; the last
 * vector of a panel row is predicated where it is wider than the panel).
 *
 * f32, layout "nr16k1": panels of 16 columns (the last one zero-padded),
 *   panel p holds W[16p + j, k] at packed[(p*K + k)*16 + j]. Each output is
 *   one sequential FMLA chain over k starting from +0, then + bias, exactly
 *   as in ref: bit-identical to ref for any M, path or thread count. The
 *   micro-kernel broadcasts x with LD1RQ (4 k per load) and uses the indexed
 *   FMLA; the chain is cut into K blocks whose partial sums are stored in y
 *   and reloaded (exact, so the chain is unchanged).
 *
 * bf16, layout "sve_mmla_n16k4" (BFMMLA): K is padded to K4 (multiple of 4)
 *   with zeros; panel p of 16 columns holds, for each group g of 4 k, 8
 *   column pairs s of 8 values (column 16p+2s: k 4g..4g+3, then column
 *   16p+2s+1), i.e. W[16p + 2s + j, 4g + i] at
 *   packed[((p*K4/4 + g)*8 + s)*8 + j*4 + i]: one 128-bit BFMMLA B operand
 *   per column pair and k group. Activations are rounded to bf16 (BFCVT,
 *   round to nearest even) into a stack tile of row pairs; every path
 *   (decode and prefill) computes every output with the same BFMMLA
 *   sequence over the same k groups, so results do not depend on M or on
 *   the thread count.
 *
 * Decode (M <= 4) streams the packed weights once for all rows with several
 * panels per tile; prefill uses register tiles of 16 accumulators. Work
 * is split over panels of 16 outputs; nothing is reduced across threads.
 */
#include <arm_sve.h>

#include "../armllm_kernels.h"
#include "../gemm_plan.h"

#define AI static inline __attribute__((always_inline))

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* vector-length class: 0 = 128-bit, 1 = 256/384-bit, 2 = 512-bit and more */
static inline int vl_class(void) {
  int64_t vl = (int64_t)svcntw();
  return vl <= 4 ? 0 : vl < 16 ? 1 : 2;
}

/* ================================================================== f32 */

size_t armllm_sve_gemm_f32_packed_len(int64_t n, int64_t k) {
  return (size_t)((n + 15) / 16 * 16 * k);
}

void armllm_sve_gemm_f32_pack(const float *w, int64_t n, int64_t k, float *packed) {
  for (int64_t p = 0; p < (n + 15) / 16; p++) {
    float *dst = packed + p * 16 * k;
    for (int64_t j = 0; j < 16; j++) {
      int64_t c = p * 16 + j;
      if (c < n) {
        const float *src = w + c * k;
        for (int64_t i = 0; i < k; i++) dst[i * 16 + j] = src[i];
      } else {
        for (int64_t i = 0; i < k; i++) dst[i * 16 + j] = 0.0f;
      }
    }
  }
}

/* Accumulators a<r><c>: row r < 8, vector c < 8 of the tile's NP panels
 * (c = panel * NV + vector). Only those with r < MR and c < NP*NV exist
 * after constant folding. */
#define F_ROW(X, r) X(r, 0) X(r, 1) X(r, 2) X(r, 3) X(r, 4) X(r, 5) X(r, 6) X(r, 7)
#define F_ALL(X) F_ROW(X, 0) F_ROW(X, 1) F_ROW(X, 2) F_ROW(X, 3) \
                 F_ROW(X, 4) F_ROW(X, 5) F_ROW(X, 6) F_ROW(X, 7)
#define F_R8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define F_C8(X, a) X(0, a) X(1, a) X(2, a) X(3, a) X(4, a) X(5, a) X(6, a) X(7, a)

#define F_BARRIER __asm__ volatile("" ::: "memory");
#define F_DECL(r, c) svfloat32_t a##r##c = svdup_n_f32(0.0f);
#define F_SETUP(c)                                                        \
  svbool_t pw##c = pt, ps##c = pt;                                        \
  const float *wp##c = w;                                                 \
  int64_t co##c = 0;                                                      \
  if ((c) < NCV) {                                                        \
    int64_t q_ = (c) / NV, v_ = (c) % NV;                                 \
    co##c = q_ * 16 + v_ * vl;                                            \
    pw##c = NV == 4 ? pt : svwhilelt_b32_s64(v_ * vl, 16); /* exact at 128 */ \
    ps##c = svwhilelt_b32_s64(co##c, min64(ncols, q_ * 16 + 16));         \
    wp##c = w + q_ * pstride + v_ * vl;                                   \
  }
#define F_XROW(r) const float *xr##r = x + ((r) < mr ? (r) : mr - 1) * ldx;
#define F_INIT(r, c) \
  if ((r) < MR && (c) < NCV && (r) < mr) a##r##c = svld1_f32(ps##c, y + (r) * ldy + co##c);
/* main loop: 4 k per step, x broadcast by quadword, indexed FMLA */
#define F_LDQ(r) svfloat32_t xq##r = (r) < MR ? svld1rq_f32(pt, xr##r + k) : svdup_n_f32(0.0f);
#define F_FMA_L(r, c, L) if ((r) < MR) a##r##c = svmla_lane_f32(a##r##c, wv, xq##r, L);
#define F_COL_L(c, L)                                             \
  if ((c) < NCV) {                                                \
    svfloat32_t wv = svld1_f32(pw##c, wp##c + (k + (L)) * 16);    \
    F_FMA_L(0, c, L) F_FMA_L(1, c, L) F_FMA_L(2, c, L) F_FMA_L(3, c, L) \
    F_FMA_L(4, c, L) F_FMA_L(5, c, L) F_FMA_L(6, c, L) F_FMA_L(7, c, L) \
  }
/* k tail: one k per step */
#define F_LDB(r) svfloat32_t xb##r = (r) < MR ? svdup_n_f32(xr##r[k]) : svdup_n_f32(0.0f);
#define F_FMA_1(r, c) if ((r) < MR) a##r##c = svmla_f32_x(pt, a##r##c, wv, xb##r);
#define F_COL_1(c, unused)                                                  \
  if ((c) < NCV) {                                                          \
    svfloat32_t wv = svld1_f32(pw##c, wp##c + k * 16);                      \
    F_FMA_1(0, c) F_FMA_1(1, c) F_FMA_1(2, c) F_FMA_1(3, c)                 \
    F_FMA_1(4, c) F_FMA_1(5, c) F_FMA_1(6, c) F_FMA_1(7, c)                 \
  }
#define F_STORE(r, c)                                                       \
  if ((r) < MR && (c) < NCV && (r) < mr) {                                  \
    svfloat32_t v_ = a##r##c;                                               \
    if (bias) v_ = svadd_f32_x(ps##c, v_, svld1_f32(ps##c, bias + co##c));  \
    svst1_f32(ps##c, y + (r) * ldy + co##c, v_);                            \
  }

/* One tile: rows [0, mr) (mr <= MR; missing rows repeat the last one and
 * are not stored) x NP panels from w (panel stride pstride), k in [k0, k1).
 * y, bias and ncols are relative to the tile's first column; bias is NULL
 * except in the last K block. */
AI void f32_tile(const int NV, const int MR, const int NP, const float *x, int64_t ldx,
                 int64_t mr, const float *w, int64_t pstride, int64_t k0, int64_t k1,
                 float *y, int64_t ldy, int64_t ncols, const float *bias, int first) {
  const int NCV = NV * NP;
  const int64_t vl = (int64_t)svcntw();
  const svbool_t pt = svptrue_b32();
  F_ALL(F_DECL)
  F_R8(F_SETUP)
  F_R8(F_XROW)
  if (!first) { F_ALL(F_INIT) }
  int64_t k = k0;
  for (; k + 4 <= k1; k += 4) {
    F_R8(F_LDQ)
    /* The barriers keep GCC from hoisting the weight loads of all four k
     * above the FMLAs (16 live weight vectors at 128 bits: spills). */
    F_C8(F_COL_L, 0) F_BARRIER
    F_C8(F_COL_L, 1) F_BARRIER
    F_C8(F_COL_L, 2) F_BARRIER
    F_C8(F_COL_L, 3)
  }
  for (; k < k1; k++) {
    F_R8(F_LDB)
    F_C8(F_COL_1, 0)
  }
  F_ALL(F_STORE)
}

typedef struct {
  ARMLLM_GEMM_JOB_ARGS;
  int64_t kc, mc; /* K block (f32: a multiple of 4, bf16: of 64), M block (a multiple of the
                     tile's rows) */
} sve_gemm_job;

/* Panels [p0, p1): K blocks, then M blocks (x block stays in L2), then
 * groups of NP panels (their K block stays in L1), then row tiles. */
AI void f32_run(const sve_gemm_job *j, int64_t p0, int64_t p1, const int NV, const int MR,
                const int NP) {
  const int64_t K = j->k, M = j->m, ldx = j->ldx, ldy = j->ldy, pstride = 16 * K;
  for (int64_t k0 = 0; k0 < K; k0 += j->kc) {
    int64_t k1 = min64(K, k0 + j->kc);
    int first = k0 == 0, last = k1 == K;
    for (int64_t mb = 0; mb < M; mb += j->mc) {
      int64_t me = min64(M, mb + j->mc);
      int64_t p = p0;
      for (; p + NP <= p1; p += NP)
        for (int64_t m0 = mb; m0 < me; m0 += MR)
          f32_tile(NV, MR, NP, j->x + m0 * ldx, ldx, min64(MR, me - m0),
                   (const float *)j->w + p * pstride, pstride, k0, k1, j->y + m0 * ldy + p * 16,
                   ldy, j->n - p * 16,
                   last && j->bias ? j->bias + p * 16 : NULL, first);
      for (; p < p1; p++)
        for (int64_t m0 = mb; m0 < me; m0 += MR)
          f32_tile(NV, MR, 1, j->x + m0 * ldx, ldx, min64(MR, me - m0),
                   (const float *)j->w + p * pstride, pstride, k0, k1, j->y + m0 * ldy + p * 16,
                   ldy, j->n - p * 16,
                   last && j->bias ? j->bias + p * 16 : NULL, first);
    }
  }
}

#define F32_TASK(name, NV, MR, NP)                                   \
  _Static_assert((NV) * (NP) <= 8 && (MR) <= 8, "tile too large");   \
  static void name(void *ctx, int64_t p0, int64_t p1) {              \
    f32_run((const sve_gemm_job *)ctx, p0, p1, NV, MR, NP);          \
  }
/* class A (128-bit: 4 vectors per panel row) */
F32_TASK(f32_a1, 4, 1, 2)
F32_TASK(f32_a2, 4, 2, 2)
F32_TASK(f32_a3, 4, 3, 1)
F32_TASK(f32_a4, 4, 4, 1)
F32_TASK(f32_ap, 4, 4, 1)
/* class B (256/384-bit: 2 vectors) */
F32_TASK(f32_b1, 2, 1, 4)
F32_TASK(f32_b2, 2, 2, 4)
F32_TASK(f32_b3, 2, 3, 2)
F32_TASK(f32_b4, 2, 4, 2)
F32_TASK(f32_bp, 2, 8, 1)
/* class C (512-bit and more: 1 vector) */
F32_TASK(f32_c1, 1, 1, 4)
F32_TASK(f32_c2, 1, 2, 4)
F32_TASK(f32_c3, 1, 3, 4)
F32_TASK(f32_c4, 1, 4, 4)
F32_TASK(f32_cp, 1, 8, 2)

static const struct {
  armllm_task_fn fn;
  int mr, np;
} f32_tasks[3][5] = {
    {{f32_a1, 1, 2}, {f32_a2, 2, 2}, {f32_a3, 3, 1}, {f32_a4, 4, 1}, {f32_ap, 4, 1}},
    {{f32_b1, 1, 4}, {f32_b2, 2, 4}, {f32_b3, 3, 2}, {f32_b4, 4, 2}, {f32_bp, 8, 1}},
    {{f32_c1, 1, 4}, {f32_c2, 2, 4}, {f32_c3, 3, 4}, {f32_c4, 4, 4}, {f32_cp, 8, 2}},
};

/* Items are panels; chunks are whole groups of np panels. */
static int64_t panel_grain(armllm_pool *pool, int64_t n_panels, int np) {
  int64_t g = armllm_pool_grain(pool, n_panels, 4, np);
  return (g + np - 1) / np * np;
}

void armllm_sve_gemm_f32(armllm_pool *pool, const float *x, int64_t m, int64_t k, int64_t ldx,
                         const float *packed_w, int64_t n, const float *bias, float *y,
                         int64_t ldy) {
  int decode = m <= 4;
  int cls = vl_class(), idx = decode ? (int)m - 1 : 4;
  int mr = f32_tasks[cls][idx].mr, np = f32_tasks[cls][idx].np;
  sve_gemm_job job = {x, m, k, ldx, packed_w, n, bias, y, ldy, 0, 0};
  job.kc = decode ? k : 256;
  job.mc = decode ? m : (256 / mr) * mr;
  int64_t n_panels = (n + 15) / 16;
  armllm_pool_run(pool, n_panels, panel_grain(pool, n_panels, np), f32_tasks[cls][idx].fn, &job);
}

/* ================================================================= bf16 */

size_t armllm_sve_gemm_bf16_packed_len(int64_t n, int64_t k) {
  return (size_t)((n + 15) / 16 * 16 * ((k + 3) / 4 * 4));
}

void armllm_sve_gemm_bf16_pack(const uint16_t *w, int64_t n, int64_t k, uint16_t *packed) {
  const int64_t k4 = (k + 3) / 4 * 4, groups = k4 / 4;
  for (int64_t p = 0; p < (n + 15) / 16; p++)
    for (int64_t c = 0; c < 16; c++) {
      int64_t col = p * 16 + c;
      uint16_t *dst = packed + p * 16 * k4 + (c / 2) * 8 + (c % 2) * 4;
      for (int64_t g = 0; g < groups; g++)
        for (int64_t i = 0; i < 4; i++) {
          int64_t kk = g * 4 + i;
          dst[g * 64 + i] = col < n && kk < k ? w[col * k + kk] : 0;
        }
    }
}

/* The A tile: row pairs (r, r+1) of x[rows, k0..k1) rounded to bf16, each
 * pair as k groups of 8 values (row r: 4 k, row r+1: 4 k), pair i at
 * abuf + i*astride. Groups past k1 are zero up to a whole vector. */
#define ABUF_HALFWORDS 8192 /* 16 KiB on the stack */
static void bf16_pack_a(const float *x, int64_t ldx, int64_t mb, int64_t me, int64_t k0,
                        int64_t k1, uint16_t *abuf, int64_t astride) {
  const int64_t vl = (int64_t)svcntw(), len = k1 - k0;
  const svbool_t pt = svptrue_b32();
  for (int64_t r = mb; r < me; r += 2) {
    const float *x0 = x + r * ldx + k0, *x1 = x + min64(r + 1, me - 1) * ldx + k0;
    uint16_t *dst = abuf + ((r - mb) / 2) * astride;
    for (int64_t off = 0; off < len; off += vl) {
      svbool_t pg = svwhilelt_b32_s64(off, len);
      svbfloat16_t b0 = svcvt_bf16_f32_x(pt, svld1_f32(pg, x0 + off));
      svbfloat16_t b1 = svcvt_bf16_f32_x(pt, svld1_f32(pg, x1 + off));
      svuint64_t c0 = svreinterpret_u64_bf16(svuzp1_bf16(b0, b0));
      svuint64_t c1 = svreinterpret_u64_bf16(svuzp1_bf16(b1, b1));
      /* whole groups, never past this pair's stride (kc need not be a multiple of vl) */
      svst1_u16(svwhilelt_b16_s64(off * 2, astride), dst + off * 2,
                svreinterpret_u16_u64(svzip1_u64(c0, c1)));
    }
  }
}

/* Accumulators m<p><c>: row pair p < 4, vector c < 8 (c = panel * NVB +
 * vector); each 128-bit segment is a 2x2 block (rows 2p, 2p+1) x (columns
 * 2s, 2s+1). */
#define B_P4(X, a) X(0, a) X(1, a) X(2, a) X(3, a)
#define B_ALL(X) B_P4(X, 0) B_P4(X, 1) B_P4(X, 2) B_P4(X, 3) \
                 B_P4(X, 4) B_P4(X, 5) B_P4(X, 6) B_P4(X, 7)
#define B_R4(X) X(0) X(1) X(2) X(3)
#define B_C8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define B_PAIRS(X, p) X(p, 0, 1) X(p, 2, 3) X(p, 4, 5) X(p, 6, 7)
#define B_ALLPAIRS(X) B_PAIRS(X, 0) B_PAIRS(X, 1) B_PAIRS(X, 2) B_PAIRS(X, 3)

#define B_DECL(p, c) svfloat32_t m##p##c = svdup_n_f32(0.0f);
#define B_SETUP(c)                                                        \
  svbool_t pb##c = pt16, ps##c = pt; /* ps of odd c: unused */           \
  (void)ps##c;                                                            \
  const uint16_t *wp##c = w;                                              \
  int64_t co##c = 0;                                                      \
  if ((c) < NCV) {                                                        \
    int64_t q_ = (c) / NVB, v_ = (c) % NVB;                               \
    co##c = q_ * 16 + v_ * (vl / 2);                                      \
    pb##c = NVB == 8 ? pt16 : svwhilelt_b16_s64(v_ * 2 * vl, 64); /* exact at 128 */ \
    ps##c = svwhilelt_b32_s64(co##c, min64(ncols, q_ * 16 + 16));         \
    wp##c = w + q_ * pstride + v_ * 2 * vl;                               \
  }
#define B_AROW(p) \
  const uint16_t *ar##p = a + ((p) < npairs ? (p) : npairs - 1) * astride;
#define B_INIT(p, c0, c1)                                                         \
  if ((p) < RP && (c1) < NCV) {                                                   \
    svfloat32_t y0_ = svdup_n_f32(0.0f), y1_ = svdup_n_f32(0.0f);                 \
    if (2 * (p) < mr) y0_ = svld1_f32(ps##c0, y + 2 * (p) * ldy + co##c0);        \
    if (2 * (p) + 1 < mr) y1_ = svld1_f32(ps##c0, y + (2 * (p) + 1) * ldy + co##c0); \
    svuint64_t u0_ = svreinterpret_u64_f32(y0_), u1_ = svreinterpret_u64_f32(y1_); \
    m##p##c0 = svreinterpret_f32_u64(svzip1_u64(u0_, u1_));                       \
    m##p##c1 = svreinterpret_f32_u64(svzip2_u64(u0_, u1_));                       \
  }
#define B_LDA(p)                                                              \
  svbfloat16_t aq##p = (p) < RP                                               \
      ? svreinterpret_bf16_u16(svld1rq_u16(pt16, ar##p + (g - g0) * 8))              \
      : svreinterpret_bf16_u16(svdup_n_u16(0));
#define B_MMLA(p, c) if ((p) < RP) m##p##c = svbfmmla_f32(m##p##c, aq##p, bv);
#define B_COL(c)                                                                   \
  if ((c) < NCV) {                                                                 \
    svbfloat16_t bv = svreinterpret_bf16_u16(svld1_u16(pb##c, wp##c + g * 64));    \
    B_MMLA(0, c) B_MMLA(1, c) B_MMLA(2, c) B_MMLA(3, c)                            \
  }
#define B_STORE(p, c0, c1)                                                        \
  if ((p) < RP && (c1) < NCV && 2 * (p) < mr) {                                   \
    svuint64_t u0_ = svreinterpret_u64_f32(m##p##c0), u1_ = svreinterpret_u64_f32(m##p##c1); \
    svfloat32_t r0_ = svreinterpret_f32_u64(svuzp1_u64(u0_, u1_));                \
    svfloat32_t r1_ = svreinterpret_f32_u64(svuzp2_u64(u0_, u1_));                \
    if (bias) {                                                                   \
      svfloat32_t b_ = svld1_f32(ps##c0, bias + co##c0);                          \
      r0_ = svadd_f32_x(ps##c0, r0_, b_);                                         \
      r1_ = svadd_f32_x(ps##c0, r1_, b_);                                         \
    }                                                                             \
    svst1_f32(ps##c0, y + 2 * (p) * ldy + co##c0, r0_);                           \
    if (2 * (p) + 1 < mr) svst1_f32(ps##c0, y + (2 * (p) + 1) * ldy + co##c0, r1_); \
  }

/* One tile: rows [0, mr) (mr <= 2*RP) from the A tile a (pair stride
 * astride, its first group is g0) x NP panels, k groups [g0, g1). */
AI void bf16_tile(const int NVB, const int RP, const int NP, const uint16_t *a,
                  int64_t astride, int64_t mr, const uint16_t *w, int64_t pstride, int64_t g0,
                  int64_t g1, float *y, int64_t ldy, int64_t ncols, const float *bias,
                  int first) {
  const int NCV = NVB * NP;
  const int64_t vl = (int64_t)svcntw(), npairs = (mr + 1) / 2;
  const svbool_t pt = svptrue_b32(), pt16 = svptrue_b16();
  B_ALL(B_DECL)
  B_C8(B_SETUP)
  B_R4(B_AROW)
  if (!first) { B_ALLPAIRS(B_INIT) }
  for (int64_t g = g0; g < g1; g++) {
    B_R4(B_LDA)
    B_C8(B_COL)
  }
  B_ALLPAIRS(B_STORE)
}

/* Panels [p0, p1): K blocks, then M blocks (rounded to bf16 once into the
 * stack tile), then groups of NP panels, then row tiles of 2*RP rows. */
AI void bf16_run(const sve_gemm_job *j, int64_t p0, int64_t p1, const int NVB, const int RP,
                 const int NP) {
  uint16_t abuf[ABUF_HALFWORDS] __attribute__((aligned(64)));
  const int MR = 2 * RP;
  const int64_t K = j->k, M = j->m, ldy = j->ldy, pstride = 16 * ((K + 3) / 4 * 4);
  const int64_t astride = 2 * j->kc;
  for (int64_t k0 = 0; k0 < K; k0 += j->kc) {
    int64_t k1 = min64(K, k0 + j->kc);
    int64_t g0 = k0 / 4, g1 = (k1 + 3) / 4;
    int first = k0 == 0, last = k1 == K;
    for (int64_t mb = 0; mb < M; mb += j->mc) {
      int64_t me = min64(M, mb + j->mc);
      bf16_pack_a(j->x, j->ldx, mb, me, k0, k1, abuf, astride);
      int64_t p = p0;
      for (; p + NP <= p1; p += NP)
        for (int64_t m0 = mb; m0 < me; m0 += MR)
          bf16_tile(NVB, RP, NP, abuf + ((m0 - mb) / 2) * astride, astride,
                    min64(MR, me - m0), (const uint16_t *)j->w + p * pstride, pstride, g0, g1,
                    j->y + m0 * ldy + p * 16, ldy, j->n - p * 16,
                    last && j->bias ? j->bias + p * 16 : NULL, first);
      for (; p < p1; p++)
        for (int64_t m0 = mb; m0 < me; m0 += MR)
          bf16_tile(NVB, RP, 1, abuf + ((m0 - mb) / 2) * astride, astride,
                    min64(MR, me - m0), (const uint16_t *)j->w + p * pstride, pstride, g0, g1,
                    j->y + m0 * ldy + p * 16, ldy, j->n - p * 16,
                    last && j->bias ? j->bias + p * 16 : NULL, first);
    }
  }
}

#define BF16_TASK(name, NVB, RP, NP)                                 \
  _Static_assert((NVB) * (NP) <= 8 && (RP) <= 4, "tile too large");  \
  static void name(void *ctx, int64_t p0, int64_t p1) {              \
    bf16_run((const sve_gemm_job *)ctx, p0, p1, NVB, RP, NP);       \
  }
/* class A (128-bit: 8 B vectors per panel and k group) */
BF16_TASK(bf16_a1, 8, 1, 1)
BF16_TASK(bf16_ap, 8, 2, 1)
/* class B (256/384-bit: 4 B vectors) */
BF16_TASK(bf16_b1, 4, 1, 2)
BF16_TASK(bf16_b2, 4, 2, 2)
BF16_TASK(bf16_bp, 4, 4, 1)
/* class C (512-bit and more: 2 B vectors) */
BF16_TASK(bf16_c1, 2, 1, 4)
BF16_TASK(bf16_c2, 2, 2, 4)
BF16_TASK(bf16_cp, 2, 4, 2)

static const struct {
  armllm_task_fn fn;
  int mr, np;
} bf16_tasks[3][3] = {
    {{bf16_a1, 2, 1}, {bf16_ap, 4, 1}, {bf16_ap, 4, 1}},
    {{bf16_b1, 2, 2}, {bf16_b2, 4, 2}, {bf16_bp, 8, 1}},
    {{bf16_c1, 2, 4}, {bf16_c2, 4, 4}, {bf16_cp, 8, 2}},
};

void armllm_sve_gemm_bf16(armllm_pool *pool, const float *x, int64_t m, int64_t k, int64_t ldx,
                          const uint16_t *packed_w, int64_t n, const float *bias, float *y,
                          int64_t ldy) {
  int decode = m <= 4;
  int cls = vl_class(), idx = m <= 2 ? 0 : decode ? 1 : 2;
  int mr = bf16_tasks[cls][idx].mr, np = bf16_tasks[cls][idx].np;
  sve_gemm_job job = {x, m, k, ldx, packed_w, n, bias, y, ldy, 0, 0};
  job.kc = decode ? 2048 : 256; /* the A tile: mc * kc <= ABUF_HALFWORDS */
  job.mc = decode ? 4 : (ABUF_HALFWORDS / job.kc) / mr * mr;
  int64_t n_panels = (n + 15) / 16;
  armllm_pool_run(pool, n_panels, panel_grain(pool, n_panels, np), bf16_tasks[cls][idx].fn, &job);
}

/* Column windows: panels are contiguous (f32: 16 * K elements, bf16: 16 * K4),
 * so a window starting on a panel is the matrix from that panel on. */
void armllm_sve_gemm_f32_cols(const float *x, int64_t m, int64_t k, int64_t ldx,
                              const float *packed_w, int64_t n, int64_t n0, int64_t n1,
                              const float *bias, float *y, int64_t ldy) {
  (void)n;
  armllm_sve_gemm_f32(NULL, x, m, k, ldx, packed_w + n0 * k, n1 - n0, bias, y, ldy);
}

void armllm_sve_gemm_bf16_cols(const float *x, int64_t m, int64_t k, int64_t ldx,
                               const uint16_t *packed_w, int64_t n, int64_t n0, int64_t n1,
                               const float *bias, float *y, int64_t ldy) {
  (void)n;
  armllm_sve_gemm_bf16(NULL, x, m, k, ldx, packed_w + n0 * ((k + 3) / 4 * 4), n1 - n0, bias, y,
                       ldy);
}
