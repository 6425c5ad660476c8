/* neon/gdn.c: the Gated DeltaNet kernels on 4 float lanes (armllm_kernels.h),
 * inside gdn_common.h's task drivers, as ref/gdn.c.
 *
 * gdn_conv and sigmoid_mul are ref's operations in ref's order (every product
 * rounded before its add, the shared vector exp, IEEE division): ref's bits.
 * GCC may fuse a vmulq into the vaddq that follows it (-ffp-contract=fast), so
 * each conv product passes through ARMLLM_NEON_OPAQUE, and tails go through
 * zero-padded vectors rather than scalar code the compiler may contract; a
 * task's weights are transposed by LD2/LD3/LD4 (kernels 2-4). gated_rmsnorm
 * sums the squares in float64 lanes (only the order differs from ref), then
 * ref's float32 products in ref's order.
 *
 * gdn_rule runs gdn_rule.h's steps around these micro-kernels, FMAs where ref
 * rounds twice. A decode token
 * walks the state S [dk, dv] (rows S[i, :] contiguous) in blocks of 32
 * columns: kv = S^T kn over the block's rows, then S = e^g S + kn delta^T and
 * o = S^T qn over the same rows, which are still in L1 (16 KB at dk = 128),
 * so each head's state comes from memory once (prefetched 8 rows ahead) and
 * goes back once. A chunk's matrix products run on 4-row x 16-column register
 * tiles: A packed in 4-row panels, B rows loaded as vectors, FMLA by element.
 */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "../armllm_kernels.h"
#include "../gdn_common.h"
#include "vexp_neon.h"

#define GDN_ROW_PREFETCH 0
#include "../gdn_rule.h"

enum {
  CH = ARMLLM_GDN_CONV_CHANNELS,
  MAXK = ARMLLM_GDN_MAX_KERNEL,
  C = ARMLLM_GDN_CHUNK,
};

/* v / (1 + exp(-v)): armllm_gdn_silu on 4 lanes */
static inline __attribute__((always_inline)) float32x4_t silu4(float32x4_t v) {
  const float32x4_t den = vaddq_f32(vdupq_n_f32(1.0f), armllm_vexpq_f32(vnegq_f32(v)));
  return vdivq_f32(v, den);
}

/* a * b, rounded: kept out of the add that follows */
static inline __attribute__((always_inline)) float32x4_t mul_rounded(float32x4_t a, float32x4_t b) {
  float32x4_t p = vmulq_f32(a, b);
  ARMLLM_NEON_OPAQUE(p);
  return p;
}

/* sum(x[i]^2) in double: squares of floats are exact in double, so FMLA .2d
 * rounds as ref's adds; four accumulators, then the tail. */
static double gdn_sum_sq(const float *x, int64_t n) {
  float64x2_t s0 = vdupq_n_f64(0.0), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const float32x4_t a = vld1q_f32(x + i), b = vld1q_f32(x + i + 4);
    const float64x2_t a0 = vcvt_f64_f32(vget_low_f32(a)), a1 = vcvt_high_f64_f32(a);
    const float64x2_t b0 = vcvt_f64_f32(vget_low_f32(b)), b1 = vcvt_high_f64_f32(b);
    s0 = vfmaq_f64(s0, a0, a0);
    s1 = vfmaq_f64(s1, a1, a1);
    s2 = vfmaq_f64(s2, b0, b0);
    s3 = vfmaq_f64(s3, b1, b1);
  }
  double tail = 0.0;
  for (; i < n; i++) tail += (double)x[i] * x[i];
  const float64x2_t s = vaddq_f64(vaddq_f64(s0, s1), vaddq_f64(s2, s3));
  return vgetq_lane_f64(s, 0) + vgetq_lane_f64(s, 1) + tail;
}

/* ------------------------------------------------------------------ conv */

/* silu(w_0 x_0 + w_1 x_1 + ...) at channels c..c+3, taps at stride ws in wt */
static inline __attribute__((always_inline)) float32x4_t conv4(const float *const *src,
                                                               const float *wt, int64_t ws,
                                                               int64_t kernel, int64_t c) {
  float32x4_t acc = mul_rounded(vld1q_f32(wt + c), vld1q_f32(src[0] + c));
  for (int64_t j = 1; j < kernel; j++)
    acc = vaddq_f32(acc, mul_rounded(vld1q_f32(wt + j * ws + c), vld1q_f32(src[j] + c)));
  return silu4(acc);
}

static void neon_conv_row(const float *const *src, const float *wt, int64_t kernel, int64_t nc,
                          float *y) {
  int64_t c = 0;
  for (; c + 8 <= nc; c += 8) { /* two exp chains per iteration */
    const float32x4_t a = conv4(src, wt, CH, kernel, c), b = conv4(src, wt, CH, kernel, c + 4);
    vst1q_f32(y + c, a);
    vst1q_f32(y + c + 4, b);
  }
  for (; c + 4 <= nc; c += 4) vst1q_f32(y + c, conv4(src, wt, CH, kernel, c));
  if (c < nc) {
    float x[MAXK][4] = {{0.0f}}, w[MAXK * 4] = {0.0f}, out[4];
    const float *tsrc[MAXK];
    for (int j = 0; j < MAXK; j++) tsrc[j] = x[j];
    const size_t bytes = (size_t)(nc - c) * sizeof(float);
    for (int64_t j = 0; j < kernel; j++) {
      memcpy(x[j], src[j] + c, bytes);
      memcpy(w + j * 4, wt + j * CH + c, bytes);
    }
    vst1q_f32(out, conv4(tsrc, w, 4, kernel, 0));
    memcpy(y + c, out, bytes);
  }
}

/* wt[j*CH + c] = w[c*kernel + j]: for kernels 2-4, LD2/LD3/LD4 split 4 channels' taps
 * into one vector a tap; other kernels and the last channels one at a time. */
static void neon_conv_weights(const float *w, int64_t kernel, int64_t nc, float *wt) {
  int64_t c = 0;
  if (kernel == 2)
    for (; c + 4 <= nc; c += 4) {
      const float32x4x2_t t = vld2q_f32(w + c * 2);
      vst1q_f32(wt + c, t.val[0]);
      vst1q_f32(wt + CH + c, t.val[1]);
    }
  else if (kernel == 3)
    for (; c + 4 <= nc; c += 4) {
      const float32x4x3_t t = vld3q_f32(w + c * 3);
      for (int j = 0; j < 3; j++) vst1q_f32(wt + j * CH + c, t.val[j]);
    }
  else if (kernel == 4)
    for (; c + 4 <= nc; c += 4) {
      const float32x4x4_t t = vld4q_f32(w + c * 4);
      for (int j = 0; j < 4; j++) vst1q_f32(wt + j * CH + c, t.val[j]);
    }
  for (; c < nc; c++)
    for (int64_t j = 0; j < kernel; j++) wt[j * CH + c] = w[c * kernel + j];
}

ARMLLM_GDN_CONV_KERNEL(armllm_neon_gdn_conv, neon_conv_weights, neon_conv_row)

/* ------------------------------------------------------------------ rule */

#define TOKEN_PREFETCH_ROWS 8 /* pass 1 streams S from memory: a few rows ahead */

/* One token over S's columns [0, 4 * nv) (row stride dv): kv = S^T kn, delta =
 * beta (v - e^g kv), then row by row S = e^g S + kn delta^T and o += S qn.
 * llvm-mca 16, Neoverse N2 model, per row of a 32-column block: pass 1 4.0
 * cycles (8 FMLA: the FMLA peak), pass 2 16.0 (8 FMUL + 16 FMLA + 8 Q-register
 * stores' data fill both V pipes): 0.63 cycles a state element, ~10K cycles a
 * 128 x 128 head. (LLVM 16 has no V1 model: -mcpu=neoverse-v1 runs N2's.) */
static inline __attribute__((always_inline)) void token_cols(float *S, int64_t dk, int64_t dv,
                                                             const float *kn, const float *qn,
                                                             const float *v, float eg,
                                                             float beta, float *out,
                                                             const int nv) {
  float32x4_t acc[8], delta[8];
  for (int c = 0; c < nv; c++) acc[c] = vdupq_n_f32(0.0f);
  for (int64_t i = 0; i < dk; i++) {
    const float *s = S + i * dv;
    if (nv == 8 && i + TOKEN_PREFETCH_ROWS < dk) { /* the block's two lines, rows ahead */
      __builtin_prefetch(s + TOKEN_PREFETCH_ROWS * dv);
      __builtin_prefetch(s + TOKEN_PREFETCH_ROWS * dv + 16);
    }
    const float32x4_t k = vld1q_dup_f32(kn + i);
    for (int c = 0; c < nv; c++) acc[c] = vfmaq_f32(acc[c], vld1q_f32(s + 4 * c), k);
  }
  const float32x4_t veg = vdupq_n_f32(eg), vbeta = vdupq_n_f32(beta);
  for (int c = 0; c < nv; c++) {
    delta[c] = vmulq_f32(vbeta, vsubq_f32(vld1q_f32(v + 4 * c), vmulq_f32(veg, acc[c])));
    acc[c] = vdupq_n_f32(0.0f); /* now o */
  }
  for (int64_t i = 0; i < dk; i++) {
    float *s = S + i * dv;
    const float32x4_t k = vld1q_dup_f32(kn + i), q = vld1q_dup_f32(qn + i);
    for (int c = 0; c < nv; c++) {
      const float32x4_t x = vfmaq_f32(vmulq_f32(vld1q_f32(s + 4 * c), veg), k, delta[c]);
      vst1q_f32(s + 4 * c, x);
      acc[c] = vfmaq_f32(acc[c], x, q);
    }
  }
  for (int c = 0; c < nv; c++) vst1q_f32(out + 4 * c, acc[c]);
}

/* token_cols for one column (dv % 4 != 0) */
static void token_col_scalar(float *S, int64_t dk, int64_t dv, const float *kn, const float *qn,
                             float v, float eg, float beta, float *out) {
  float kv = 0.0f, o = 0.0f;
  for (int64_t i = 0; i < dk; i++) kv = fmaf(S[i * dv], kn[i], kv);
  const float delta = beta * (v - eg * kv);
  for (int64_t i = 0; i < dk; i++) {
    const float s = fmaf(kn[i], delta, S[i * dv] * eg);
    S[i * dv] = s;
    o = fmaf(s, qn[i], o);
  }
  *out = o;
}

static void gdn_token_cols(float *S, int64_t dk, int64_t dv, const float *kn, const float *qn,
                           const float *v, float eg, float beta, float *out) {
  int64_t j = 0;
  for (; j + 32 <= dv; j += 32) token_cols(S + j, dk, dv, kn, qn, v + j, eg, beta, out + j, 8);
  for (; j + 4 <= dv; j += 4) token_cols(S + j, dk, dv, kn, qn, v + j, eg, beta, out + j, 1);
  for (; j < dv; j++) token_col_scalar(S + j, dk, dv, kn, qn, v[j], eg, beta, out + j);
}

/* A 4-row tile of C, columns [0, 4 * nv): C = init + panel B, the panel [kk][4]
 * holding A's 4 rows (negated for GDN_MM_SUB), summed over l ascending. */
static inline __attribute__((always_inline)) void mm_tile(const float *panel, int64_t kk,
                                                          const float *B, int64_t ldb, float *Cm,
                                                          int64_t ldc, int64_t rows, int load,
                                                          float c_scale, const int nv) {
  float32x4_t acc[4][4];
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < nv; c++)
      acc[r][c] = load && r < rows ? vmulq_n_f32(vld1q_f32(Cm + r * ldc + 4 * c), c_scale)
                                   : vdupq_n_f32(0.0f);
  for (int64_t l = 0; l < kk; l++) {
    const float32x4_t a = vld1q_f32(panel + 4 * l);
    const float *b = B + l * ldb;
    for (int c = 0; c < nv; c++) {
      const float32x4_t bc = vld1q_f32(b + 4 * c);
      acc[0][c] = vfmaq_laneq_f32(acc[0][c], bc, a, 0);
      acc[1][c] = vfmaq_laneq_f32(acc[1][c], bc, a, 1);
      acc[2][c] = vfmaq_laneq_f32(acc[2][c], bc, a, 2);
      acc[3][c] = vfmaq_laneq_f32(acc[3][c], bc, a, 3);
    }
  }
  for (int r = 0; r < 4; r++) /* constant indices: acc stays in registers */
    for (int c = 0; c < nv; c++)
      if (r < rows) vst1q_f32(Cm + r * ldc + 4 * c, acc[r][c]);
}

/* mm_tile for the last n % 4 columns */
static void mm_tile_scalar(const float *panel, int64_t kk, const float *B, int64_t ldb, float *Cm,
                           int64_t ldc, int64_t rows, int load, float c_scale, int64_t n) {
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < n; j++) {
      float acc = load ? c_scale * Cm[r * ldc + j] : 0.0f;
      for (int64_t l = 0; l < kk; l++) acc = fmaf(panel[4 * l + r], B[l * ldb + j], acc);
      Cm[r * ldc + j] = acc;
    }
}

/* 4-row panels of A (negated for GDN_MM_SUB) times the tiles of B. */
static void gdn_mm(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                    const float *B, int64_t ldb, float *Cm, int64_t ldc, int flags,
                    float c_scale) {
  const int load = flags & GDN_MM_LOAD, lower = flags & GDN_MM_LOWER;
  float panel[4 * ARMLLM_GDN_MAX_HEAD_DIM];
  for (int64_t i0 = 0; i0 < m; i0 += 4) {
    const int64_t rows = m - i0 < 4 ? m - i0 : 4;
    const int64_t kk = lower && i0 + 4 < k ? i0 + 4 : k;
    for (int64_t l = 0; l < kk; l++)
      for (int64_t r = 0; r < 4; r++) {
        const float a = r < rows && (!lower || l <= i0 + r) ? A[(i0 + r) * ars + l * acs] : 0.0f;
        panel[4 * l + r] = flags & GDN_MM_SUB ? -a : a;
      }
    const int64_t diag = (i0 + 4 + 15) / 16 * 16; /* GDN_MM_TRI: the tiles up to the diagonal */
    const int64_t nn = flags & GDN_MM_TRI && diag < n ? diag : n;
    float *c = Cm + i0 * ldc;
    int64_t j = 0;
    for (; j + 16 <= nn; j += 16)
      mm_tile(panel, kk, B + j, ldb, c + j, ldc, rows, load, c_scale, 4);
    for (; j + 4 <= nn; j += 4) mm_tile(panel, kk, B + j, ldb, c + j, ldc, rows, load, c_scale, 1);
    if (j < nn) mm_tile_scalar(panel, kk, B + j, ldb, c + j, ldc, rows, load, c_scale, nn - j);
  }
}

/* T = (I + A)^-1 in place, A strictly lower-triangular [C, C]: row i by forward
 * substitution, T[i, :] = e_i - sum_{j<i} A[i, j] T[j, :], in 16-column blocks;
 * T[j, l] = 0 for l > j, so a block starting at l0 only needs rows j >= l0. */
static void gdn_unit_lower_inverse(float *A) {
  float a_row[C];
  for (int64_t i = 0; i < C; i++) {
    float *t = A + i * C;
    memcpy(a_row, t, (size_t)i * sizeof(float));
    for (int64_t l0 = 0; l0 < C; l0 += 16) {
      float32x4_t acc[4];
      for (int c = 0; c < 4; c++) acc[c] = vdupq_n_f32(0.0f);
      for (int64_t j = l0; j < i; j++) {
        const float32x4_t a = vdupq_n_f32(a_row[j]);
        const float *tj = A + j * C + l0;
        for (int c = 0; c < 4; c++) acc[c] = vfmsq_f32(acc[c], a, vld1q_f32(tj + 4 * c));
      }
      for (int c = 0; c < 4; c++) vst1q_f32(t + l0 + 4 * c, acc[c]);
    }
    t[i] = 1.0f;
  }
}

static void gdn_transpose(const float *Kn, int64_t dk, float *KnT) {
  gdn_transpose_scalar(Kn, dk, KnT);
}

static void gdn_decays(const float *G, float *eG, float *eGl) {
  const float32x4_t g_last = vdupq_n_f32(G[C - 1]);
  for (int64_t i = 0; i < C; i += 4) {
    const float32x4_t gi = vld1q_f32(G + i);
    vst1q_f32(eG + i, armllm_vexpq_f32(gi));
    vst1q_f32(eGl + i, armllm_vexpq_f32(vsubq_f32(g_last, gi)));
  }
}

static void gdn_decay_masks(const float *G, const float *beta, float *A, float *P) {
  const uint32x4_t lane = {0, 1, 2, 3};
  for (int64_t i = 0; i < C; i++) {
    const float32x4_t gi = vdupq_n_f32(G[i]), bi = vdupq_n_f32(beta[i]);
    const uint32x4_t vi = vdupq_n_u32((uint32_t)i);
    for (int64_t j = 0; j < C; j += 4) {
      float32x4_t a = vdupq_n_f32(0.0f), p = a;
      if (j <= i) { /* lanes past the diagonal are computed and dropped */
        const float32x4_t d = armllm_vexpq_f32(vsubq_f32(gi, vld1q_f32(G + j)));
        const uint32x4_t col = vaddq_u32(lane, vdupq_n_u32((uint32_t)j));
        a = vbslq_f32(vcltq_u32(col, vi), vmulq_f32(vmulq_f32(bi, vld1q_f32(A + i * C + j)), d), a);
        p = vbslq_f32(vcleq_u32(col, vi), vmulq_f32(vld1q_f32(P + i * C + j), d), p);
      }
      vst1q_f32(A + i * C + j, a);
      vst1q_f32(P + i * C + j, p);
    }
  }
}

/* IEEE subnormals, as ref: AArch64 computes with them in hardware (no support
 * code), so the x86 variants' reason to flush (microcode assists) does not apply;
 * not measured on Arm hardware. */
ARMLLM_GDN_RULE_KERNEL(armllm_neon_gdn_rule, gdn_chunk, gdn_token, ieee)

/* ---------------------------------------------------- gated norm, gate */

/* ((x * scale) * w) * silu(z), ref's order */
static inline __attribute__((always_inline)) float32x4_t gated4(float32x4_t x, float32x4_t scale,
                                                                float32x4_t w, float32x4_t z) {
  return vmulq_f32(vmulq_f32(vmulq_f32(x, scale), w), silu4(z));
}

static void neon_gated_rmsnorm_items(void *ctx, int64_t i0, int64_t i1) {
  const armllm_gated_norm_job *job = ctx;
  const int64_t d = job->d;
  for (int64_t it = i0; it < i1; it++) {
    const int64_t r = it / job->heads, off = it % job->heads * d;
    const float *x = job->x + r * job->ldx + off, *z = job->z + r * job->ldz + off;
    const float *w = job->weight;
    float *out = job->out + r * job->ldo + off;
    const float scale = (float)(1.0 / sqrt(gdn_sum_sq(x, d) / (double)d + (double)job->eps));
    const float32x4_t vs = vdupq_n_f32(scale);
    int64_t i = 0;
    for (; i + 4 <= d; i += 4) /* out may be x: each block is loaded before it is stored */
      vst1q_f32(out + i, gated4(vld1q_f32(x + i), vs, vld1q_f32(w + i), vld1q_f32(z + i)));
    if (i < d) {
      float tx[4] = {0.0f}, tz[4] = {0.0f}, tw[4] = {0.0f}, to[4];
      const size_t bytes = (size_t)(d - i) * sizeof(float);
      memcpy(tx, x + i, bytes);
      memcpy(tz, z + i, bytes);
      memcpy(tw, w + i, bytes);
      vst1q_f32(to, gated4(vld1q_f32(tx), vs, vld1q_f32(tw), vld1q_f32(tz)));
      memcpy(out + i, to, bytes);
    }
  }
}

void armllm_neon_gated_rmsnorm(armllm_pool *pool, const float *x, int64_t ldx, const float *z,
                               int64_t ldz, const float *weight, int64_t t, int64_t heads,
                               int64_t d, float eps, float *out, int64_t ldo) {
  armllm_gated_norm_job job = {x, ldx, z, ldz, weight, heads, d, eps, out, ldo};
  const int64_t items = t * heads;
  armllm_pool_run(pool, items, armllm_pool_grain(pool, items, 2, 1), neon_gated_rmsnorm_items,
                  &job);
}

/* x / (1 + exp(-g)), ref's order */
static inline __attribute__((always_inline)) float32x4_t sigmoid_mul4(float32x4_t g,
                                                                      float32x4_t x) {
  return vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0f), armllm_vexpq_f32(vnegq_f32(g))));
}

static void neon_sigmoid_mul_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_sigmoid_mul_job *job = ctx;
  const int64_t n = job->n;
  for (int64_t t = t0; t < t1; t++) {
    const float *g = job->gate + t * job->ldg;
    float *x = job->x + t * job->ldx;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      const float32x4_t a = sigmoid_mul4(vld1q_f32(g + j), vld1q_f32(x + j));
      const float32x4_t b = sigmoid_mul4(vld1q_f32(g + j + 4), vld1q_f32(x + j + 4));
      vst1q_f32(x + j, a);
      vst1q_f32(x + j + 4, b);
    }
    for (; j + 4 <= n; j += 4) vst1q_f32(x + j, sigmoid_mul4(vld1q_f32(g + j), vld1q_f32(x + j)));
    if (j < n) {
      float tg[4] = {0.0f}, tx[4] = {0.0f};
      const size_t bytes = (size_t)(n - j) * sizeof(float);
      memcpy(tg, g + j, bytes);
      memcpy(tx, x + j, bytes);
      vst1q_f32(tx, sigmoid_mul4(vld1q_f32(tg), vld1q_f32(tx)));
      memcpy(x + j, tx, bytes);
    }
  }
}

void armllm_neon_sigmoid_mul(armllm_pool *pool, const float *gate, int64_t ldg, int64_t t,
                             int64_t n, float *x, int64_t ldx) {
  armllm_sigmoid_mul_job job = {gate, ldg, n, x, ldx};
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, 1), neon_sigmoid_mul_rows, &job);
}
