/* sve/gdn.c: the Gated DeltaNet kernels on SVE vectors of any length
 * (armllm_kernels.h), inside gdn_common.h's task drivers, as ref/gdn.c.
 *
 * gdn_conv and sigmoid_mul are ref's operations in ref's order (every product
 * rounded before its add, the shared vector exp, IEEE division): ref's bits.
 * Products and exps that feed an add pass through armllm_sve_opaque so that
 * GCC cannot contract them into FMLA. gated_rmsnorm sums the squares in
 * float64 lanes (only the order differs from ref), then ref's float32
 * products in ref's order. Tails are predicated; a task's conv weights are
 * transposed by LD2W/LD3W/LD4W (kernels 2-4).
 *
 * gdn_rule runs gdn_rule.h's steps around these micro-kernels, FMAs where ref
 * rounds twice. A decode token
 * walks the state S [dk, dv] (rows S[i, :] contiguous) in blocks of 8 vectors
 * of columns: kv = S^T kn over the block's rows, then S = e^g S + kn delta^T
 * and o = S^T qn over the same rows, still in L1, so each head's state comes
 * from memory once (prefetched 8 rows ahead) and goes back once. A chunk's
 * matrix products run on 4-row x 4-vector register tiles: A packed in 4-row
 * panels, each panel row replicated to every 128-bit segment (LD1RQW) for FMLA
 * by element.
 */
#include <arm_sve.h>
#include <math.h>
#include <string.h>

#include "../armllm_kernels.h"
#include "../gdn_common.h"
#include "vexp_sve.h"

#define GDN_ROW_PREFETCH 0
#include "../gdn_rule.h"

enum {
  CH = ARMLLM_GDN_CONV_CHANNELS,
  C = ARMLLM_GDN_CHUNK,
};

/* v / (1 + exp(-v)): armllm_gdn_silu */
static inline svfloat32_t silu_vec(svbool_t pg, svfloat32_t v) {
  const svfloat32_t e = armllm_sve_opaque(armllm_sve_vexp(pg, svneg_f32_x(pg, v)));
  return svdiv_f32_x(pg, v, svadd_n_f32_x(pg, e, 1.0f));
}

/* a * b, rounded: kept out of the add that follows */
static inline svfloat32_t mul_rounded(svbool_t pg, svfloat32_t a, svfloat32_t b) {
  return armllm_sve_opaque(svmul_f32_x(pg, a, b));
}

/* acc_e, acc_o += the squares of v's even and odd lanes, in double (exact) */
static inline void sum_squares_vec(svfloat32_t v, svfloat64_t *acc_e, svfloat64_t *acc_o) {
  const svbool_t pd = svptrue_b64();
  const svfloat64_t e = svcvt_f64_f32_x(pd, v);
  const svfloat64_t o =
      svcvt_f64_f32_x(pd, svreinterpret_f32_u64(svlsr_n_u64_x(pd, svreinterpret_u64_f32(v), 32)));
  *acc_e = svmla_f64_x(pd, *acc_e, e, e);
  *acc_o = svmla_f64_x(pd, *acc_o, o, o);
}

/* sum(x[i]^2) in double: ref's sum in another order */
static double gdn_sum_sq(const float *x, int64_t n) {
  const int64_t vl = (int64_t)svcntw();
  const svbool_t pt = svptrue_b32();
  svfloat64_t a0 = svdup_n_f64(0.0), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 2 * vl <= n; i += 2 * vl) {
    sum_squares_vec(svld1_f32(pt, x + i), &a0, &a1);
    sum_squares_vec(svld1_f32(pt, x + i + vl), &a2, &a3);
  }
  for (; i < n; i += vl) /* inactive lanes load 0 */
    sum_squares_vec(svld1_f32(svwhilelt_b32_s64(i, n), x + i), &a0, &a1);
  const svbool_t pd = svptrue_b64();
  return svaddv_f64(pd, svadd_f64_x(pd, svadd_f64_x(pd, a0, a1), svadd_f64_x(pd, a2, a3)));
}

/* ------------------------------------------------------------------ conv */

/* silu(w_0 x_0 + w_1 x_1 + ...) at channels c.. (lanes of pg) */
static inline svfloat32_t conv_vec(svbool_t pg, const float *const *src, const float *wt,
                                   int64_t kernel, int64_t c) {
  svfloat32_t acc = mul_rounded(pg, svld1_f32(pg, wt + c), svld1_f32(pg, src[0] + c));
  for (int64_t j = 1; j < kernel; j++)
    acc = svadd_f32_x(pg, acc,
                      mul_rounded(pg, svld1_f32(pg, wt + j * CH + c), svld1_f32(pg, src[j] + c)));
  return silu_vec(pg, acc);
}

static void sve_conv_row(const float *const *src, const float *wt, int64_t kernel, int64_t nc,
                         float *y) {
  const int64_t vl = (int64_t)svcntw();
  const svbool_t pt = svptrue_b32();
  int64_t c = 0;
  for (; c + 2 * vl <= nc; c += 2 * vl) { /* two exp chains per iteration */
    const svfloat32_t a = conv_vec(pt, src, wt, kernel, c);
    const svfloat32_t b = conv_vec(pt, src, wt, kernel, c + vl);
    svst1_f32(pt, y + c, a);
    svst1_f32(pt, y + c + vl, b);
  }
  for (; c < nc; c += vl) {
    const svbool_t pg = svwhilelt_b32_s64(c, nc);
    svst1_f32(pg, y + c, conv_vec(pg, src, wt, kernel, c));
  }
}

/* wt[j*CH + c] = w[c*kernel + j]: for kernels 2-4, LD2W/LD3W/LD4W split a vector
 * of channels' taps into one vector a tap (predicated tail); other kernels one
 * channel at a time. */
static void sve_conv_weights(const float *w, int64_t kernel, int64_t nc, float *wt) {
  const int64_t vl = (int64_t)svcntw();
  if (kernel < 2 || kernel > 4) {
    armllm_gdn_conv_weights_scalar(w, kernel, nc, wt);
    return;
  }
  for (int64_t c = 0; c < nc; c += vl) {
    const svbool_t pg = svwhilelt_b32_s64(c, nc);
    if (kernel == 2) {
      const svfloat32x2_t t = svld2_f32(pg, w + c * 2);
      svst1_f32(pg, wt + c, svget2_f32(t, 0));
      svst1_f32(pg, wt + CH + c, svget2_f32(t, 1));
    } else if (kernel == 3) {
      const svfloat32x3_t t = svld3_f32(pg, w + c * 3);
      svst1_f32(pg, wt + c, svget3_f32(t, 0));
      svst1_f32(pg, wt + CH + c, svget3_f32(t, 1));
      svst1_f32(pg, wt + 2 * CH + c, svget3_f32(t, 2));
    } else {
      const svfloat32x4_t t = svld4_f32(pg, w + c * 4);
      svst1_f32(pg, wt + c, svget4_f32(t, 0));
      svst1_f32(pg, wt + CH + c, svget4_f32(t, 1));
      svst1_f32(pg, wt + 2 * CH + c, svget4_f32(t, 2));
      svst1_f32(pg, wt + 3 * CH + c, svget4_f32(t, 3));
    }
  }
}

ARMLLM_GDN_CONV_KERNEL(armllm_sve_gdn_conv, sve_conv_weights, sve_conv_row)

/* ------------------------------------------------------------------ rule */

#define EACH8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#define TOKEN_PREFETCH_ROWS 8 /* pass 1 streams S from memory: a few rows ahead */

/* One token over nv vectors of S's columns (lanes of pg; row stride dv): kv =
 * S^T kn, delta = beta (v - e^g kv), then row by row S = e^g S + kn delta^T
 * and o += S qn. At 128 bits, llvm-mca's N2 model gives NEON's figures
 * (neon/gdn.c): 4.0 + 16.0 cycles per row of the 8-vector block. */
static inline __attribute__((always_inline)) void token_cols(float *S, int64_t dk, int64_t dv,
                                                             const float *kn, const float *qn,
                                                             const float *v, float eg,
                                                             float beta, float *out, svbool_t pg,
                                                             const int nv) {
  const int64_t vl = (int64_t)svcntw();
  const svfloat32_t zero = svdup_n_f32(0.0f);
#define TOKEN_DECL(c) svfloat32_t acc##c = zero, delta##c = zero;
  EACH8(TOKEN_DECL)
  for (int64_t i = 0; i < dk; i++) {
    const float *s = S + i * dv;
    if (nv == 8 && i + TOKEN_PREFETCH_ROWS < dk) /* the block's lines, rows ahead */
      for (int64_t line = 0; line < 8 * vl; line += 16)
        __builtin_prefetch(s + TOKEN_PREFETCH_ROWS * dv + line);
    const svfloat32_t k = svdup_n_f32(kn[i]);
#define TOKEN_KV(c) \
  if (nv > c) acc##c = svmla_f32_x(pg, acc##c, svld1_f32(pg, s + c * vl), k);
    EACH8(TOKEN_KV)
  }
#define TOKEN_DELTA(c)                                                                        \
  if (nv > c) {                                                                               \
    const svfloat32_t ekv = svmul_n_f32_x(pg, acc##c, eg);                                    \
    delta##c = svmul_n_f32_x(pg, svsub_f32_x(pg, svld1_f32(pg, v + c * vl), ekv), beta);      \
    acc##c = zero; /* now o */                                                                \
  }
  EACH8(TOKEN_DELTA)
  for (int64_t i = 0; i < dk; i++) {
    float *s = S + i * dv;
    const svfloat32_t k = svdup_n_f32(kn[i]), q = svdup_n_f32(qn[i]);
#define TOKEN_UPDATE(c)                                                                       \
  if (nv > c) {                                                                               \
    const svfloat32_t x =                                                                     \
        svmla_f32_x(pg, svmul_n_f32_x(pg, svld1_f32(pg, s + c * vl), eg), k, delta##c);        \
    svst1_f32(pg, s + c * vl, x);                                                             \
    acc##c = svmla_f32_x(pg, acc##c, x, q);                                                   \
  }
    EACH8(TOKEN_UPDATE)
  }
#define TOKEN_STORE(c) \
  if (nv > c) svst1_f32(pg, out + c * vl, acc##c);
  EACH8(TOKEN_STORE)
}

static void gdn_token_cols(float *S, int64_t dk, int64_t dv, const float *kn, const float *qn,
                           const float *v, float eg, float beta, float *out) {
  const int64_t vl = (int64_t)svcntw();
  int64_t j = 0;
  for (; j + 8 * vl <= dv; j += 8 * vl)
    token_cols(S + j, dk, dv, kn, qn, v + j, eg, beta, out + j, svptrue_b32(), 8);
  for (; j < dv; j += vl)
    token_cols(S + j, dk, dv, kn, qn, v + j, eg, beta, out + j, svwhilelt_b32_s64(j, dv), 1);
}

#define ROWS4(X, c) X(0, c) X(1, c) X(2, c) X(3, c)
#define TILE16(X) ROWS4(X, 0) ROWS4(X, 1) ROWS4(X, 2) ROWS4(X, 3)

/* A 4-row tile of C over nv vectors of columns (lanes of pg): C = init +
 * panel B, the panel [kk][4] holding A's 4 rows (negated for GDN_MM_SUB), summed
 * over l ascending. */
static inline __attribute__((always_inline)) void mm_tile(const float *panel, int64_t kk,
                                                          const float *B, int64_t ldb, float *Cm,
                                                          int64_t ldc, int64_t rows, int load,
                                                          float c_scale, svbool_t pg,
                                                          const int nv) {
  const int64_t vl = (int64_t)svcntw();
  const svfloat32_t zero = svdup_n_f32(0.0f);
  const svbool_t pt = svptrue_b32();
#define MM_INIT(r, c)                                                                         \
  svfloat32_t acc##r##c = zero;                                                               \
  if (nv > c && load && rows > r)                                                             \
    acc##r##c = svmul_n_f32_x(pg, svld1_f32(pg, Cm + r * ldc + c * vl), c_scale);
  TILE16(MM_INIT)
  for (int64_t l = 0; l < kk; l++) {
    const svfloat32_t a = svld1rq_f32(pt, panel + 4 * l);
    const float *b = B + l * ldb;
#define MM_COL(c)                                                                             \
  if (nv > c) {                                                                               \
    const svfloat32_t bc = svld1_f32(pg, b + c * vl);                                         \
    acc0##c = svmla_lane_f32(acc0##c, bc, a, 0);                                              \
    acc1##c = svmla_lane_f32(acc1##c, bc, a, 1);                                              \
    acc2##c = svmla_lane_f32(acc2##c, bc, a, 2);                                              \
    acc3##c = svmla_lane_f32(acc3##c, bc, a, 3);                                              \
  }
    MM_COL(0) MM_COL(1) MM_COL(2) MM_COL(3)
  }
#define MM_STORE(r, c) \
  if (nv > c && rows > r) svst1_f32(pg, Cm + r * ldc + c * vl, acc##r##c);
  TILE16(MM_STORE)
}

/* 4-row panels of A (negated for GDN_MM_SUB) times the tiles of B. */
static void gdn_mm(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                   const float *B, int64_t ldb, float *Cm, int64_t ldc, int flags, float c_scale) {
  const int load = flags & GDN_MM_LOAD, lower = flags & GDN_MM_LOWER;
  const int64_t vl = (int64_t)svcntw();
  float panel[4 * ARMLLM_GDN_MAX_HEAD_DIM];
  for (int64_t i0 = 0; i0 < m; i0 += 4) {
    const int64_t rows = m - i0 < 4 ? m - i0 : 4;
    const int64_t kk = lower && i0 + 4 < k ? i0 + 4 : k;
    for (int64_t l = 0; l < kk; l++)
      for (int64_t r = 0; r < 4; r++) {
        const float a = r < rows && (!lower || l <= i0 + r) ? A[(i0 + r) * ars + l * acs] : 0.0f;
        panel[4 * l + r] = flags & GDN_MM_SUB ? -a : a;
      }
    const int64_t nn = flags & GDN_MM_TRI && i0 + 4 < n ? i0 + 4 : n;
    float *c = Cm + i0 * ldc;
    int64_t j = 0;
    for (; j + 4 * vl <= nn; j += 4 * vl)
      mm_tile(panel, kk, B + j, ldb, c + j, ldc, rows, load, c_scale, svptrue_b32(), 4);
    for (; j < nn; j += vl)
      mm_tile(panel, kk, B + j, ldb, c + j, ldc, rows, load, c_scale, svwhilelt_b32_s64(j, nn), 1);
  }
}

/* T = (I + A)^-1 in place, A strictly lower-triangular [C, C]: row i by forward
 * substitution, T[i, :] = e_i - sum_{j<i} A[i, j] T[j, :], in blocks of 4
 * vectors; T[j, l] = 0 for l > j, so a block starting at l0 only needs rows j >= l0. */
static void gdn_unit_lower_inverse(float *A) {
  const int64_t vl = (int64_t)svcntw();
  float a_row[C];
  for (int64_t i = 0; i < C; i++) {
    float *t = A + i * C;
    memcpy(a_row, t, (size_t)i * sizeof(float));
    for (int64_t l0 = 0; l0 < C; l0 += 4 * vl) {
      const svbool_t p0 = svwhilelt_b32_s64(l0, C), p1 = svwhilelt_b32_s64(l0 + vl, C);
      const svbool_t p2 = svwhilelt_b32_s64(l0 + 2 * vl, C), p3 = svwhilelt_b32_s64(l0 + 3 * vl, C);
      svfloat32_t t0 = svdup_n_f32(0.0f), t1 = t0, t2 = t0, t3 = t0;
      for (int64_t j = l0; j < i; j++) {
        const svfloat32_t a = svdup_n_f32(a_row[j]);
        const float *tj = A + j * C + l0;
        t0 = svmls_f32_x(p0, t0, svld1_f32(p0, tj), a);
        t1 = svmls_f32_x(p1, t1, svld1_f32(p1, tj + vl), a);
        t2 = svmls_f32_x(p2, t2, svld1_f32(p2, tj + 2 * vl), a);
        t3 = svmls_f32_x(p3, t3, svld1_f32(p3, tj + 3 * vl), a);
      }
      svst1_f32(p0, t + l0, t0);
      svst1_f32(p1, t + l0 + vl, t1);
      svst1_f32(p2, t + l0 + 2 * vl, t2);
      svst1_f32(p3, t + l0 + 3 * vl, t3);
    }
    t[i] = 1.0f;
  }
}

static void gdn_transpose(const float *Kn, int64_t dk, float *KnT) {
  gdn_transpose_scalar(Kn, dk, KnT);
}

static void gdn_decays(const float *G, float *eG, float *eGl) {
  for (int64_t i = 0; i < C; i += (int64_t)svcntw()) {
    const svbool_t pg = svwhilelt_b32_s64(i, C);
    const svfloat32_t gi = svld1_f32(pg, G + i);
    svst1_f32(pg, eG + i, armllm_sve_vexp(pg, gi));
    svst1_f32(pg, eGl + i, armllm_sve_vexp(pg, svsubr_n_f32_x(pg, gi, G[C - 1])));
  }
}

static void gdn_decay_masks(const float *G, const float *beta, float *A, float *P) {
  const svfloat32_t vzero = svdup_n_f32(0.0f);
  for (int64_t i = 0; i < C; i++)
    for (int64_t j = 0; j < C; j += (int64_t)svcntw()) {
      const svbool_t pg = svwhilelt_b32_s64(j, C);
      if (j > i) {
        svst1_f32(pg, A + i * C + j, vzero);
        svst1_f32(pg, P + i * C + j, vzero);
        continue;
      }
      const svbool_t strict = svwhilelt_b32_s64(j, i), diag = svwhilelt_b32_s64(j, i + 1);
      const svfloat32_t gj = svld1_f32(diag, G + j);
      const svfloat32_t d = armllm_sve_vexp(diag, svsubr_n_f32_x(diag, gj, G[i]));
      const svfloat32_t ba = svmul_n_f32_x(strict, svld1_f32(strict, A + i * C + j), beta[i]);
      const svfloat32_t a = svmul_f32_x(strict, ba, d);
      const svfloat32_t p = svmul_f32_x(diag, svld1_f32(diag, P + i * C + j), d);
      svst1_f32(pg, A + i * C + j, svsel_f32(strict, a, vzero));
      svst1_f32(pg, P + i * C + j, svsel_f32(diag, p, vzero));
    }
}

/* IEEE subnormals, as ref (see neon/gdn.c) */
ARMLLM_GDN_RULE_KERNEL(armllm_sve_gdn_rule, gdn_chunk, gdn_token, ieee)

/* ---------------------------------------------------- gated norm, gate */

static void sve_gated_rmsnorm_items(void *ctx, int64_t i0, int64_t i1) {
  const armllm_gated_norm_job *job = ctx;
  const int64_t d = job->d, vl = (int64_t)svcntw();
  for (int64_t it = i0; it < i1; it++) {
    const int64_t r = it / job->heads, off = it % job->heads * d;
    const float *x = job->x + r * job->ldx + off, *z = job->z + r * job->ldz + off;
    float *out = job->out + r * job->ldo + off;
    const float scale = (float)(1.0 / sqrt(gdn_sum_sq(x, d) / (double)d + (double)job->eps));
    for (int64_t i = 0; i < d; i += vl) { /* out may be x: loads precede the store */
      const svbool_t pg = svwhilelt_b32_s64(i, d);
      const svfloat32_t xs = svmul_n_f32_x(pg, svld1_f32(pg, x + i), scale);
      const svfloat32_t xw = svmul_f32_x(pg, xs, svld1_f32(pg, job->weight + i));
      svst1_f32(pg, out + i, svmul_f32_x(pg, xw, silu_vec(pg, svld1_f32(pg, z + i))));
    }
  }
}

void armllm_sve_gated_rmsnorm(armllm_pool *pool, const float *x, int64_t ldx, const float *z,
                              int64_t ldz, const float *weight, int64_t t, int64_t heads,
                              int64_t d, float eps, float *out, int64_t ldo) {
  armllm_gated_norm_job job = {x, ldx, z, ldz, weight, heads, d, eps, out, ldo};
  const int64_t items = t * heads;
  armllm_pool_run(pool, items, armllm_pool_grain(pool, items, 2, 1), sve_gated_rmsnorm_items,
                  &job);
}

/* x / (1 + exp(-g)), ref's order */
static inline svfloat32_t sigmoid_mul_vec(svbool_t pg, svfloat32_t g, svfloat32_t x) {
  const svfloat32_t e = armllm_sve_opaque(armllm_sve_vexp(pg, svneg_f32_x(pg, g)));
  return svdiv_f32_x(pg, x, svadd_n_f32_x(pg, e, 1.0f));
}

static void sve_sigmoid_mul_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_sigmoid_mul_job *job = ctx;
  const int64_t n = job->n, vl = (int64_t)svcntw();
  const svbool_t pt = svptrue_b32();
  for (int64_t t = t0; t < t1; t++) {
    const float *g = job->gate + t * job->ldg;
    float *x = job->x + t * job->ldx;
    int64_t j = 0;
    for (; j + 2 * vl <= n; j += 2 * vl) {
      const svfloat32_t a = sigmoid_mul_vec(pt, svld1_f32(pt, g + j), svld1_f32(pt, x + j));
      const svfloat32_t b =
          sigmoid_mul_vec(pt, svld1_f32(pt, g + j + vl), svld1_f32(pt, x + j + vl));
      svst1_f32(pt, x + j, a);
      svst1_f32(pt, x + j + vl, b);
    }
    for (; j < n; j += vl) {
      const svbool_t pg = svwhilelt_b32_s64(j, n);
      svst1_f32(pg, x + j, sigmoid_mul_vec(pg, svld1_f32(pg, g + j), svld1_f32(pg, x + j)));
    }
  }
}

void armllm_sve_sigmoid_mul(armllm_pool *pool, const float *gate, int64_t ldg, int64_t t,
                            int64_t n, float *x, int64_t ldx) {
  armllm_sigmoid_mul_job job = {gate, ldg, n, x, ldx};
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, 1), sve_sigmoid_mul_rows, &job);
}
