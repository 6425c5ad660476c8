/* ref/gdn.c: portable Gated DeltaNet kernels (armllm_kernels.h): the causal
 * depthwise conv with its state, the gated delta rule (recurrent and chunked
 * forms: gdn_rule.h's steps around scalar micro-kernels), the gated RMSNorm
 * and the sigmoid output gate. Built with -ffp-contract=off: every product is
 * rounded before its add. The vector variants run the same steps in the same
 * order (FMAs where ref rounds twice). */
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

#define GDN_ROW_PREFETCH 0
#include "../gdn_rule.h"

enum { C = ARMLLM_GDN_CHUNK };

static double gdn_sum_sq(const float *x, int64_t n) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < n; i++) sum_sq += (double)x[i] * x[i];
  return sum_sq;
}

/* Two passes over S: kv = S^T kn (e^g applied to the sum), then the update and o. */
static void gdn_token_cols(float *S, int64_t dk, int64_t dv, const float *kn, const float *qn,
                           const float *v, float eg, float beta, float *out) {
  float kv[ARMLLM_GDN_MAX_HEAD_DIM], delta[ARMLLM_GDN_MAX_HEAD_DIM], o[ARMLLM_GDN_MAX_HEAD_DIM];
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
  for (int64_t j = 0; j < dv; j++) out[j] = o[j];
}

static void gdn_decays(const float *G, float *eG, float *eGl) {
  for (int64_t i = 0; i < C; i++) {
    eG[i] = armllm_exp_scalar(G[i]);
    eGl[i] = armllm_exp_scalar(G[C - 1] - G[i]);
  }
}

static void gdn_transpose(const float *Kn, int64_t dk, float *KnT) {
  gdn_transpose_scalar(Kn, dk, KnT);
}

/* GDN_MM_TRI changes nothing here: the whole product is formed. */
static void gdn_mm(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                   const float *B, int64_t ldb, float *Cm, int64_t ldc, int flags,
                   float c_scale) {
  for (int64_t i = 0; i < m; i++) {
    float *c = Cm + i * ldc;
    for (int64_t j = 0; j < n; j++) c[j] = flags & GDN_MM_LOAD ? c_scale * c[j] : 0.0f;
    const int64_t kk = flags & GDN_MM_LOWER && i + 1 < k ? i + 1 : k;
    for (int64_t l = 0; l < kk; l++) {
      const float a = A[i * ars + l * acs];
      const float *b = B + l * ldb;
      if (flags & GDN_MM_SUB)
        for (int64_t j = 0; j < n; j++) c[j] = c[j] - a * b[j];
      else
        for (int64_t j = 0; j < n; j++) c[j] = c[j] + a * b[j];
    }
  }
}

static void gdn_decay_masks(const float *G, const float *beta, float *A, float *P) {
  for (int64_t i = 0; i < C; i++)
    for (int64_t j = 0; j < C; j++) {
      const float d = j <= i ? armllm_exp_scalar(G[i] - G[j]) : 0.0f;
      A[i * C + j] = j < i ? beta[i] * A[i * C + j] * d : 0.0f;
      P[i * C + j] = j <= i ? P[i * C + j] * d : 0.0f;
    }
}

static void gdn_unit_lower_inverse(float *A) {
  float a_row[C];
  for (int64_t i = 0; i < C; i++) {
    float *t = A + i * C;
    for (int64_t j = 0; j < i; j++) a_row[j] = t[j];
    for (int64_t l = 0; l < C; l++) t[l] = l == i ? 1.0f : 0.0f;
    for (int64_t j = 0; j < i; j++)
      for (int64_t l = 0; l <= j; l++) t[l] = t[l] - a_row[j] * A[j * C + l];
  }
}

ARMLLM_GDN_RULE_KERNEL(armllm_ref_gdn_rule, gdn_chunk, gdn_token, ieee)

/* ---------------------------------------------------- gated norm, gate */

static void ref_gated_rmsnorm_items(void *ctx, int64_t i0, int64_t i1) {
  const armllm_gated_norm_job *job = ctx;
  const int64_t d = job->d;
  for (int64_t it = i0; it < i1; it++) {
    const int64_t r = it / job->heads, off = it % job->heads * d;
    const float *x = job->x + r * job->ldx + off, *z = job->z + r * job->ldz + off;
    float *out = job->out + r * job->ldo + off;
    const float scale = (float)(1.0 / sqrt(gdn_sum_sq(x, d) / (double)d + (double)job->eps));
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
