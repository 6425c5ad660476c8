/* gdn_rule.h: the gated delta rule's steps, written once for every variant
 * (ref/gdn.c holds the scalar micro-kernels; each ISA's gdn.c its vector
 * ones): a token's normalized rows and gates around the variant's pass over
 * the state, and a chunk's gates, cumulative decays, normalized rows,
 * products, decay masks, triangular solve and state update around the
 * variant's exps, products and solve. Static functions, so each ISA file
 * compiles them with its own flags (as attn_x86.h).
 *
 * The including file defines GDN_ROW_PREFETCH (rows of q, k and v a chunk asks
 * for ahead of its l2 pass; 0: none) before including it and, after it, the
 * functions declared below; then
 *   ARMLLM_GDN_RULE_KERNEL(armllm_<isa>_gdn_rule, gdn_chunk, gdn_token, <mode>).
 * The steps between the variant's calls are exact float32 products (each
 * rounded once: no add to contract into), so every variant gets the bits it
 * would get writing them with its own vectors. */
#ifndef ARMLLM_GDN_RULE_H
#define ARMLLM_GDN_RULE_H

#include "armllm_kernels.h"
#include "gdn_common.h"
#include "vexp.h"

/* Flags of gdn_mm. */
enum {
  GDN_MM_LOAD = 1,  /* C starts as c_scale * C, else 0 */
  GDN_MM_SUB = 2,   /* C -= A B */
  GDN_MM_LOWER = 4, /* A is lower-triangular: A[i, l] = 0 for l > i (stored as zeros) */
  GDN_MM_TRI = 8,   /* only C's lower triangle (j <= i) is wanted: a variant may skip the rest */
};

/* ------------------------------------------------ what the variant supplies */

/* sum(x[i]^2) over n, in double (each square exact; the order is the variant's). */
static double gdn_sum_sq(const float *x, int64_t n);
/* One token over all dv columns of S [dk, dv]: kv = S^T kn, delta = beta (v -
 * e^g kv), then row by row S = e^g S + kn delta^T and out = S^T qn. */
static void gdn_token_cols(float *S, int64_t dk, int64_t dv, const float *kn, const float *qn,
                           const float *v, float eg, float beta, float *out);
/* eG[i] = e^G[i] and eGl[i] = e^(G[C-1] - G[i]) for i < C. */
static void gdn_decays(const float *G, float *eG, float *eGl);
/* KnT[l*C + i] = Kn[i*dk + l] for i < C, l < dk. */
static void gdn_transpose(const float *Kn, int64_t dk, float *KnT);
/* Cm[i, j] = init + sign * sum_{l < kk} A[i*ars + l*acs] * B[l*ldb + j], i < m, j < n,
 * summed over l ascending (ref_mm, ref/gdn.c), as `flags` say. */
static void gdn_mm(int64_t m, int64_t n, int64_t k, const float *A, int64_t ars, int64_t acs,
                   const float *B, int64_t ldb, float *Cm, int64_t ldc, int flags,
                   float c_scale);
/* With D[i, j] = e^(G_i - G_j): A = strict_lower(beta_i A . D), P = lower(P . D),
 * every element of both [C, C] written (zeros above the diagonal). */
static void gdn_decay_masks(const float *G, const float *beta, float *A, float *P);
/* T = (I + A)^-1 in place, A strictly lower-triangular [C, C] (row stride C): row
 * i by forward substitution, T[i, :] = e_i - sum_{j<i} A[i, j] T[j, :]. */
static void gdn_unit_lower_inverse(float *A);

/* ------------------------------------------------------------ the steps */

static inline void gdn_transpose_scalar(const float *Kn, int64_t dk, float *KnT) {
  for (int64_t i = 0; i < ARMLLM_GDN_CHUNK; i++)
    for (int64_t l = 0; l < dk; l++) KnT[l * ARMLLM_GDN_CHUNK + i] = Kn[i * dk + l];
}

/* out[i] = x[i] * (scale / |x|) over n. */
static inline void gdn_l2(const float *x, int64_t n, double scale, float *out) {
  const float f = armllm_gdn_l2_scale(gdn_sum_sq(x, n), scale);
  for (int64_t i = 0; i < n; i++) out[i] = x[i] * f;
}

/* One token: S = e^g S; delta = beta (v - S^T kn); S += kn delta^T; o = S^T qn. */
static void gdn_token(const armllm_gdn_head *hd, int64_t r) {
  const int64_t dk = hd->a->dk, dv = hd->a->dv;
  float qn[ARMLLM_GDN_MAX_HEAD_DIM], kn[ARMLLM_GDN_MAX_HEAD_DIM], g, beta;
  gdn_l2(armllm_gdn_q(hd, r), dk, hd->q_scale, qn);
  gdn_l2(armllm_gdn_k(hd, r), dk, 1.0, kn);
  armllm_gdn_row_gates(hd, r, &g, &beta);
  gdn_token_cols(hd->S, dk, dv, kn, qn, armllm_gdn_v(hd, r), armllm_exp_scalar(g), beta,
                 armllm_gdn_o(hd, r));
}

/* A chunk's input rows are a projection's row stride apart: their lines come
 * from L3 or memory one row at a time unless asked for ahead. */
static inline void gdn_prefetch_rows(const armllm_gdn_head *hd, int64_t r) {
  const float *q = armllm_gdn_q(hd, r), *k = armllm_gdn_k(hd, r), *v = armllm_gdn_v(hd, r);
  for (int64_t i = 0; i < hd->a->dk; i += 16) {
    __builtin_prefetch(q + i, 0, 3);
    __builtin_prefetch(k + i, 0, 3);
  }
  for (int64_t i = 0; i < hd->a->dv; i += 16) __builtin_prefetch(v + i, 0, 3);
}

/* Rows [r0, r0 + C) in the chunked (WY/UT) form (flash-linear-attention's
 * chunk_gated_delta_rule): with G the cumulative decay in the chunk, D[i, j] =
 * e^(G_i - G_j) (j <= i), A = strict_lower(beta_i kn_i.kn_j D), T = (I + A)^-1:
 *   U = T diag(beta) V - T diag(beta e^G) Kn S     (the new values)
 *   O = diag(e^G) Qn S + lower(Qn Kn^T . D) U
 *   S = e^G_last S + (diag(e^(G_last - G)) Kn)^T U */
static void gdn_chunk(const armllm_gdn_head *hd, int64_t r0) {
  enum { C = ARMLLM_GDN_CHUNK, D = ARMLLM_GDN_MAX_HEAD_DIM };
  const int64_t dk = hd->a->dk, dv = hd->a->dv;
  float Kn[C * D], Qn[C * D], KnT[D * C], U[C * D], W[C * D];
  float A[C * C], P[C * C], Tb[C * C], Tbe[C * C];
  float G[C], beta[C], eG[C], eGl[C];
  for (int64_t i = 0; i < C; i++) {
    float g;
    if (GDN_ROW_PREFETCH && i + GDN_ROW_PREFETCH < C) gdn_prefetch_rows(hd, r0 + i + GDN_ROW_PREFETCH);
    armllm_gdn_row_gates(hd, r0 + i, &g, &beta[i]);
    G[i] = i ? G[i - 1] + g : g;
    gdn_l2(armllm_gdn_q(hd, r0 + i), dk, hd->q_scale, Qn + i * dk);
    gdn_l2(armllm_gdn_k(hd, r0 + i), dk, 1.0, Kn + i * dk);
  }
  gdn_decays(G, eG, eGl);
  gdn_transpose(Kn, dk, KnT);
  gdn_mm(C, C, dk, Kn, dk, 1, KnT, C, A, C, GDN_MM_TRI, 0.0f);
  gdn_mm(C, C, dk, Qn, dk, 1, KnT, C, P, C, GDN_MM_TRI, 0.0f);
  gdn_decay_masks(G, beta, A, P);
  gdn_unit_lower_inverse(A);
  for (int64_t i = 0; i < C; i++)
    for (int64_t l = 0; l < C; l++) {
      Tb[i * C + l] = A[i * C + l] * beta[l];
      Tbe[i * C + l] = Tb[i * C + l] * eG[l];
    }
  float *S = hd->S, *out = armllm_gdn_o(hd, r0);
  const int64_t ldo = hd->a->ldo;
  const int zero = hd->zero; /* S = 0: no products with it (and S is not read) */
  const int with_s = zero ? 0 : GDN_MM_LOAD;
  gdn_mm(C, dv, C, Tb, C, 1, armllm_gdn_v(hd, r0), hd->a->ldqkv, U, dv, GDN_MM_LOWER, 0.0f);
  if (!zero) {
    gdn_mm(C, dk, C, Tbe, C, 1, Kn, dk, W, dk, GDN_MM_LOWER, 0.0f);
    gdn_mm(C, dv, dk, W, dk, 1, S, dv, U, dv, GDN_MM_LOAD | GDN_MM_SUB, 1.0f);
  }
  for (int64_t i = 0; i < C; i++)
    for (int64_t l = 0; l < dk; l++) {
      Qn[i * dk + l] = Qn[i * dk + l] * eG[i];
      Kn[i * dk + l] = Kn[i * dk + l] * eGl[i];
    }
  if (!zero) gdn_mm(C, dv, dk, Qn, dk, 1, S, dv, out, ldo, 0, 0.0f);
  gdn_mm(C, dv, C, P, C, 1, U, dv, out, ldo, with_s | GDN_MM_LOWER, 1.0f);
  gdn_mm(dk, dv, C, Kn, 1, dk, U, dv, S, dv, with_s, eG[C - 1]);
}

#endif /* ARMLLM_GDN_RULE_H */
