/* ref/gdn.c: portable Gated DeltaNet kernels (armllm_kernels.h): the causal
 * depthwise conv with its state, the gated delta rule (recurrent and chunked
 * forms), the gated RMSNorm and the sigmoid output gate. Built with
 * -ffp-contract=off: every product is rounded before its add. The vector
 * variants run the same steps in the same order (FMAs where ref rounds twice). */
#include <math.h>

#include "../armllm_kernels.h"
#include "../gdn_common.h"
#include "../vexp.h"

/* ------------------------------------------------------------------ conv */

static void ref_conv_row(const float *const *src, const float *wt, int64_t kernel, int64_t nc,
                         float *y) {
  for (int64_t c = 0; c < nc; c++) {
    float acc = wt[c] * src[0][c];
    for (int64_t j = 1; j < kernel; j++) acc = acc + wt[j * ARMLLM_GDN_CONV_CHANNELS + c] * src[j][c];
    y[c] = armllm_gdn_silu(acc);
  }
}

ARMLLM_GDN_CONV_KERNEL(armllm_ref_gdn_conv, armllm_gdn_conv_weights_scalar, ref_conv_row)

/* ------------------------------------------------------------------ rule */

enum { C = ARMLLM_GDN_CHUNK, D = ARMLLM_GDN_MAX_HEAD_DIM };

/* out[i] = x[i] * (scale / |x|) over n (the sum of squares in double). */
static void ref_l2(const float *x, int64_t n, double scale, float *out) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < n; i++) sum_sq += (double)x[i] * x[i];
  const float f = armllm_gdn_l2_scale(sum_sq, scale);
  for (int64_t i = 0; i < n; i++) out[i] = x[i] * f;
}

/* One token: S = e^g S; delta = beta (v - S^T kn); S += kn delta^T; o = S^T qn, in
 * two passes over S: kv = S^T kn (e^g applied to the sum), then the update and o. */
static void ref_token(const armllm_gdn_head *hd, int64_t r) {
  const int64_t dk = hd->a->dk, dv = hd->a->dv;
  float qn[D], kn[D], kv[D], delta[D], o[D], g, beta;
  ref_l2(armllm_gdn_q(hd, r), dk, hd->q_scale, qn);
  ref_l2(armllm_gdn_k(hd, r), dk, 1.0, kn);
  armllm_gdn_row_gates(hd, r, &g, &beta);
  const float eg = armllm_exp_scalar(g);
  const float *v = armllm_gdn_v(hd, r);
  float *S = hd->S;
  for (int64_t j = 0; j < dv; j++) kv[j] = 0.0f;
  for (int64_t i = 0; i < dk; i++)
    for (int64_t j = 0; j < dv; j++) kv[j] = kv[j] + S[i * dv + j] * kn[i];
  for (int64_t j = 0; j < dv; j++) {
    delta[j] = beta * (v[j] - eg * kv[j]);
    o[j] = 0.0f;
  }
  for (int64_t i = 0; i < dk; i++)
    for (int64_t j = 0; j < dv; j++) {
      const float s = S[i * dv + j] * eg + kn[i] * delta[j];
      S[i * dv + j] = s;
      o[j] = o[j] + s * qn[i];
    }
  float *out = armllm_gdn_o(hd, r);
  for (int64_t j = 0; j < dv; j++) out[j] = o[j];
}

enum { MM_ZERO = 0, MM_LOAD = 1 };

/* Cm[i, j] = init + sign * sum_{l < kk} A[i*ars + l*acs] * B[l*ldb + j], i < m, j < n,
 * summed over l ascending; init 0 (MM_ZERO) or c_scale * Cm (MM_LOAD); sign -1 when
 * sub; kk = k, or min(k, i + 1) when A is lower-triangular (lower). */
static void ref_mm(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                   const float *B, int64_t ldb, float *Cm, int64_t ldc, int init, float c_scale,
                   int sub, int lower) {
  for (int64_t i = 0; i < m; i++) {
    float *c = Cm + i * ldc;
    for (int64_t j = 0; j < n; j++) c[j] = init == MM_LOAD ? c_scale * c[j] : 0.0f;
    const int64_t kk = lower && i + 1 < k ? i + 1 : k;
    for (int64_t l = 0; l < kk; l++) {
      const float a = A[i * ars + l * acs];
      const float *b = B + l * ldb;
      if (sub)
        for (int64_t j = 0; j < n; j++) c[j] = c[j] - a * b[j];
      else
        for (int64_t j = 0; j < n; j++) c[j] = c[j] + a * b[j];
    }
  }
}

/* T = (I + A)^-1 in place, A strictly lower-triangular [C, C] (row stride C): the
 * rows by forward substitution, T[i, :] = e_i - sum_{j<i} A[i, j] T[j, :]. */
static void ref_unit_lower_inverse(float *A) {
  float a_row[C];
  for (int64_t i = 0; i < C; i++) {
    float *t = A + i * C;
    for (int64_t j = 0; j < i; j++) a_row[j] = t[j];
    for (int64_t l = 0; l < C; l++) t[l] = l == i ? 1.0f : 0.0f;
    for (int64_t j = 0; j < i; j++)
      for (int64_t l = 0; l <= j; l++) t[l] = t[l] - a_row[j] * A[j * C + l];
  }
}

/* Rows [r0, r0 + C) in the chunked (WY/UT) form (flash-linear-attention's
 * chunk_gated_delta_rule): with G the cumulative decay in the chunk, D[i, j] =
 * e^(G_i - G_j) (j <= i), A = strict_lower(beta_i kn_i.kn_j D), T = (I + A)^-1:
 *   U = T diag(beta) V - T diag(beta e^G) Kn S     (the new values)
 *   O = diag(e^G) Qn S + lower(Qn Kn^T . D) U
 *   S = e^G_last S + (diag(e^(G_last - G)) Kn)^T U */
static void ref_chunk(const armllm_gdn_head *hd, int64_t r0) {
  const int64_t dk = hd->a->dk, dv = hd->a->dv;
  float Kn[C * D], Qn[C * D], KnT[D * C], U[C * D], W[C * D];
  float A[C * C], P[C * C], Tb[C * C], Tbe[C * C];
  float G[C], beta[C], eG[C], eGl[C];
  for (int64_t i = 0; i < C; i++) {
    float g;
    armllm_gdn_row_gates(hd, r0 + i, &g, &beta[i]);
    G[i] = i ? G[i - 1] + g : g;
    ref_l2(armllm_gdn_q(hd, r0 + i), dk, hd->q_scale, Qn + i * dk);
    ref_l2(armllm_gdn_k(hd, r0 + i), dk, 1.0, Kn + i * dk);
  }
  for (int64_t i = 0; i < C; i++) {
    eG[i] = armllm_exp_scalar(G[i]);
    eGl[i] = armllm_exp_scalar(G[C - 1] - G[i]);
  }
  for (int64_t i = 0; i < C; i++)
    for (int64_t l = 0; l < dk; l++) KnT[l * C + i] = Kn[i * dk + l];
  ref_mm(C, C, dk, Kn, dk, 1, KnT, C, A, C, MM_ZERO, 0.0f, 0, 0);
  ref_mm(C, C, dk, Qn, dk, 1, KnT, C, P, C, MM_ZERO, 0.0f, 0, 0);
  for (int64_t i = 0; i < C; i++)
    for (int64_t j = 0; j < C; j++) {
      const float d = j <= i ? armllm_exp_scalar(G[i] - G[j]) : 0.0f;
      A[i * C + j] = j < i ? beta[i] * A[i * C + j] * d : 0.0f;
      P[i * C + j] = j <= i ? P[i * C + j] * d : 0.0f;
    }
  ref_unit_lower_inverse(A);
  for (int64_t i = 0; i < C; i++)
    for (int64_t l = 0; l < C; l++) {
      Tb[i * C + l] = A[i * C + l] * beta[l];
      Tbe[i * C + l] = Tb[i * C + l] * eG[l];
    }
  float *S = hd->S, *out = armllm_gdn_o(hd, r0);
  const int zero = hd->zero; /* S = 0: no products with it (and S is not read) */
  ref_mm(C, dv, C, Tb, C, 1, armllm_gdn_v(hd, r0), hd->a->ldqkv, U, dv, MM_ZERO, 0.0f, 0, 1);
  if (!zero) {
    ref_mm(C, dk, C, Tbe, C, 1, Kn, dk, W, dk, MM_ZERO, 0.0f, 0, 1);
    ref_mm(C, dv, dk, W, dk, 1, S, dv, U, dv, MM_LOAD, 1.0f, 1, 0);
  }
  for (int64_t i = 0; i < C; i++)
    for (int64_t l = 0; l < dk; l++) {
      Qn[i * dk + l] = Qn[i * dk + l] * eG[i];
      Kn[i * dk + l] = Kn[i * dk + l] * eGl[i];
    }
  if (!zero) ref_mm(C, dv, dk, Qn, dk, 1, S, dv, out, hd->a->ldo, MM_ZERO, 0.0f, 0, 0);
  ref_mm(C, dv, C, P, C, 1, U, dv, out, hd->a->ldo, zero ? MM_ZERO : MM_LOAD, 1.0f, 0, 1);
  ref_mm(dk, dv, C, Kn, 1, dk, U, dv, S, dv, zero ? MM_ZERO : MM_LOAD, eG[C - 1], 0, 0);
}

ARMLLM_GDN_RULE_KERNEL(armllm_ref_gdn_rule, ref_chunk, ref_token, ieee)

/* ---------------------------------------------------- gated norm, gate */

static void ref_gated_rmsnorm_items(void *ctx, int64_t i0, int64_t i1) {
  const armllm_gated_norm_job *job = ctx;
  const int64_t d = job->d;
  for (int64_t it = i0; it < i1; it++) {
    const int64_t r = it / job->heads, off = it % job->heads * d;
    const float *x = job->x + r * job->ldx + off, *z = job->z + r * job->ldz + off;
    float *out = job->out + r * job->ldo + off;
    double sum_sq = 0.0;
    for (int64_t i = 0; i < d; i++) sum_sq += (double)x[i] * x[i];
    const float scale = (float)(1.0 / sqrt(sum_sq / (double)d + (double)job->eps));
    for (int64_t i = 0; i < d; i++) out[i] = x[i] * scale * job->weight[i] * armllm_gdn_silu(z[i]);
  }
}

void armllm_ref_gated_rmsnorm(armllm_pool *pool, const float *x, int64_t ldx, const float *z,
                              int64_t ldz, const float *weight, int64_t t, int64_t heads,
                              int64_t d, float eps, float *out, int64_t ldo) {
  armllm_gated_norm_job job = {x, ldx, z, ldz, weight, heads, d, eps, out, ldo};
  const int64_t items = t * heads;
  armllm_pool_run(pool, items, armllm_pool_grain(pool, items, 2, 1), ref_gated_rmsnorm_items,
                  &job);
}

static void ref_sigmoid_mul_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_sigmoid_mul_job *job = ctx;
  for (int64_t t = t0; t < t1; t++) {
    const float *g = job->gate + t * job->ldg;
    float *x = job->x + t * job->ldx;
    for (int64_t j = 0; j < job->n; j++) x[j] = x[j] / (1.0f + armllm_exp_scalar(-g[j]));
  }
}

void armllm_ref_sigmoid_mul(armllm_pool *pool, const float *gate, int64_t ldg, int64_t t,
                            int64_t n, float *x, int64_t ldx) {
  armllm_sigmoid_mul_job job = {gate, ldg, n, x, ldx};
  armllm_pool_run(pool, t, armllm_pool_grain(pool, t, 2, 1), ref_sigmoid_mul_rows, &job);
}
