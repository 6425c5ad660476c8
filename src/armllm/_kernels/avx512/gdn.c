/* avx512/gdn.c: the Gated DeltaNet kernels (armllm_kernels.h), 16 lanes.
 *
 * conv, gated_rmsnorm and sigmoid_mul run ref's operations in ref's order
 * (products kept apart from their sums, the shared exp, IEEE division): the
 * conv and the gate give ref's bits, the norm differs only in its double sum
 * of squares. gdn_rule runs gdn_rule.h's steps (ref's order) around these
 * micro-kernels over dv-wide rows of the state, with FMAs where ref rounds twice:
 *   - a token (decode, and the rows after the last whole chunk): per block of
 *     up to 128 columns, pass 1 streams the block's rows of S into kv = S^T kn
 *     (8 accumulators), pass 2 rewrites them as e^g S + kn delta^T and sums
 *     o = S^T qn: S read twice (the second time from L1/L2), written once;
 *   - a chunk of 64 rows: the chunked form's products as a 4-row x 64-column
 *     register-tiled kernel (16 accumulators; triangular operands stop at the
 *     diagonal's tile), the (I + A)^-1 by forward substitution a row at a time.
 */
#include <immintrin.h>
#include <math.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"
#include "../gdn_common.h"
#include "vexp_avx512.h"

/* A chunk asks for its input rows this many rows ahead (gdn_rule.h). */
#define GDN_ROW_PREFETCH 4
#include "../gdn_rule.h"

enum { C = ARMLLM_GDN_CHUNK };

/* the product rounded on its own: the compiler may not fuse it into a later add */
#define OPAQUE(v) __asm__("" : "+v"(v))

static inline __m512 silu16(__m512 v) {
  const __m512 e = armllm_exp_avx512(_mm512_castsi512_ps(
      _mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32((int32_t)0x80000000u))));
  return _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

/* Lanes of the 16-wide vector at column j of n columns (0 past the end). */
static inline __mmask16 lanes16(int64_t j, int64_t n) {
  return j >= n ? 0 : armllm_avx512_tail16(n - j >= 16 ? 16 : n - j);
}

/* ------------------------------------------------------------------ conv */

static void avx512_conv_row(const float *const *src, const float *wt, int64_t kernel,
                            int64_t nc, float *y) {
  for (int64_t c = 0; c < nc; c += 16) {
    const __mmask16 m = lanes16(c, nc);
    __m512 acc = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, wt + c), _mm512_maskz_loadu_ps(m, src[0] + c));
    OPAQUE(acc);
    for (int64_t j = 1; j < kernel; j++) {
      __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, wt + j * ARMLLM_GDN_CONV_CHANNELS + c),
                               _mm512_maskz_loadu_ps(m, src[j] + c));
      OPAQUE(p);
      acc = _mm512_add_ps(acc, p);
    }
    _mm512_mask_storeu_ps(y + c, m, silu16(acc));
  }
}

/* wt[j*CHANNELS + c] = w[c*kernel + j]: 16 channels of a tap a gather */
static void avx512_conv_weights(const float *w, int64_t kernel, int64_t nc, float *wt) {
  const __m512i lane = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
      _mm512_set1_epi32((int32_t)kernel));
  for (int64_t c = 0; c < nc; c += 16) {
    const __mmask16 m = lanes16(c, nc);
    for (int64_t j = 0; j < kernel; j++)
      _mm512_storeu_ps(wt + j * ARMLLM_GDN_CONV_CHANNELS + c,
                       _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, lane, w + c * kernel + j, 4));
  }
}

ARMLLM_GDN_CONV_KERNEL(armllm_avx512_gdn_conv, avx512_conv_weights, avx512_conv_row)

/* ------------------------------------------------------------------ rule */

/* x's sum of squares in double (each square exact), 8 x 2 lanes. */
static double gdn_sum_sq(const float *x, int64_t n) {
  __m512d s0 = _mm512_setzero_pd(), s1 = s0;
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(lanes16(i, n), x + i);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
    s0 = _mm512_fmadd_pd(lo, lo, s0); /* exact squares: as mul + add */
    s1 = _mm512_fmadd_pd(hi, hi, s1);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

#define TOKEN_PREFETCH_ROWS 8 /* measured: -10% time with the state in memory */

/* One token's two passes over columns [j0, j0 + 16 NV) of S (m: each vector's lanes). */
static inline __attribute__((always_inline)) void token_block(
    const int NV, float *S, int64_t dk, int64_t dv, int64_t j0, const __mmask16 *m,
    const float *kn, const float *qn, const float *v, float eg, float beta, float *out) {
  __m512 acc[8], delta[8], o[8];
  for (int u = 0; u < NV; u++) acc[u] = _mm512_setzero_ps();
  for (int64_t i = 0; i < dk; i++) {
    const float *s = S + i * dv + j0;
    const __m512 kb = _mm512_set1_ps(kn[i]);
    if (i + TOKEN_PREFETCH_ROWS < dk) /* the stream from memory, a few rows ahead */
      for (int u = 0; u < NV; u++)
        _mm_prefetch((const char *)(s + TOKEN_PREFETCH_ROWS * dv + 16 * u), _MM_HINT_T0);
    for (int u = 0; u < NV; u++)
      acc[u] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m[u], s + 16 * u), kb, acc[u]);
  }
  const __m512 egv = _mm512_set1_ps(eg), bv = _mm512_set1_ps(beta);
  for (int u = 0; u < NV; u++) {
    const __m512 kv = _mm512_mul_ps(egv, acc[u]);
    delta[u] = _mm512_mul_ps(bv, _mm512_sub_ps(_mm512_maskz_loadu_ps(m[u], v + j0 + 16 * u), kv));
    o[u] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < dk; i++) {
    float *s = S + i * dv + j0;
    const __m512 kb = _mm512_set1_ps(kn[i]), qb = _mm512_set1_ps(qn[i]);
    for (int u = 0; u < NV; u++) {
      const __m512 x = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m[u], s + 16 * u), egv,
                                       _mm512_mul_ps(kb, delta[u]));
      _mm512_mask_storeu_ps(s + 16 * u, m[u], x);
      o[u] = _mm512_fmadd_ps(x, qb, o[u]);
    }
  }
  for (int u = 0; u < NV; u++) _mm512_mask_storeu_ps(out + j0 + 16 * u, m[u], o[u]);
}

static void gdn_token_cols(float *S, int64_t dk, int64_t dv, const float *kn, const float *qn,
                           const float *v, float eg, float beta, float *out) {
  for (int64_t j0 = 0; j0 < dv; j0 += 128) {
    __mmask16 m[8];
    for (int u = 0; u < 8; u++) m[u] = lanes16(j0 + 16 * u, dv);
    const int64_t nv = (dv - j0 + 15) / 16;
    switch (nv > 8 ? 8 : nv) { /* a block of 1..8 vectors, each its own code */
#define TOKEN_CASE(n) \
  case n: token_block(n, S, dk, dv, j0, m, kn, qn, v, eg, beta, out); break;
      TOKEN_CASE(1) TOKEN_CASE(2) TOKEN_CASE(3) TOKEN_CASE(4)
      TOKEN_CASE(5) TOKEN_CASE(6) TOKEN_CASE(7) TOKEN_CASE(8)
#undef TOKEN_CASE
    }
  }
}

enum { MR = 4 }; /* rows of a product tile (6 measured slower) */

/* Rows [i0, i0 + MR) x columns [j0, j0 + 16 NV) of ref_mm's product (rows past m
 * repeat row m-1 and are not stored; m[u]: each vector's lanes). */
static inline __attribute__((always_inline)) void mm_tile(
    const int NV, const int SUB, int64_t i0, int64_t m_rows, int64_t kk, const float *A,
    int64_t ars, int64_t acs, const float *B, int64_t ldb, int64_t j0, const __mmask16 *m,
    float *Cm, int64_t ldc, int load, float c_scale) {
  const float *a[MR];
  __m512 acc[MR][4];
  const int64_t mr = m_rows - i0 < MR ? m_rows - i0 : MR;
  for (int r = 0; r < MR; r++) {
    a[r] = A + (i0 + (r < mr ? r : mr - 1)) * ars;
    for (int u = 0; u < NV; u++)
      acc[r][u] = load && r < mr
                      ? _mm512_mul_ps(_mm512_set1_ps(c_scale),
                                      _mm512_maskz_loadu_ps(m[u], Cm + (i0 + r) * ldc + j0 + 16 * u))
                      : _mm512_setzero_ps();
  }
  for (int64_t l = 0; l < kk; l++) {
    __m512 b[4];
    for (int u = 0; u < NV; u++) b[u] = _mm512_maskz_loadu_ps(m[u], B + l * ldb + j0 + 16 * u);
    for (int r = 0; r < MR; r++) {
      const __m512 ar = _mm512_set1_ps(a[r][l * acs]);
      for (int u = 0; u < NV; u++)
        acc[r][u] = SUB ? _mm512_fnmadd_ps(ar, b[u], acc[r][u]) : _mm512_fmadd_ps(ar, b[u], acc[r][u]);
    }
  }
  for (int r = 0; r < MR; r++) /* constant bounds: acc stays in registers */
    for (int u = 0; u < NV; u++)
      if (r < mr) _mm512_mask_storeu_ps(Cm + (i0 + r) * ldc + j0 + 16 * u, m[u], acc[r][u]);
}

/* In 4 x 64 tiles: each output one FMA chain over l ascending. GDN_MM_LOWER: a
 * tile stops at its last row's diagonal; GDN_MM_TRI: at its last row's column. */
static void gdn_mm(int64_t m_rows, int64_t n, int64_t k, const float *A, int64_t ars,
                   int64_t acs, const float *B, int64_t ldb, float *Cm, int64_t ldc, int flags,
                   float c_scale) {
  const int load = flags & GDN_MM_LOAD, sub = (flags & GDN_MM_SUB) != 0;
  const int lower = flags & GDN_MM_LOWER, lower_out = flags & GDN_MM_TRI;
  for (int64_t i0 = 0; i0 < m_rows; i0 += MR) {
    const int64_t kk = lower && i0 + MR < k ? i0 + MR : k;
    const int64_t nn = lower_out && i0 + MR < n ? i0 + MR : n;
    for (int64_t j0 = 0; j0 < nn; j0 += 64) {
      __mmask16 m[4];
      for (int u = 0; u < 4; u++) m[u] = lanes16(j0 + 16 * u, nn);
      const int64_t nv = (nn - j0 + 15) / 16;
      switch ((nv > 4 ? 4 : nv) * 2 + sub) {
#define MM_CASE(n, s)                                                                  \
  case n * 2 + s:                                                                      \
    mm_tile(n, s, i0, m_rows, kk, A, ars, acs, B, ldb, j0, m, Cm, ldc, load, c_scale); \
    break;
        MM_CASE(1, 0) MM_CASE(2, 0) MM_CASE(3, 0) MM_CASE(4, 0)
        MM_CASE(1, 1) MM_CASE(2, 1) MM_CASE(3, 1) MM_CASE(4, 1)
#undef MM_CASE
      }
    }
  }
}

/* Over the vectors that reach column i; row i is read before it is stored. */
static void gdn_unit_lower_inverse(float *A) {
  for (int64_t i = 0; i < C; i++) {
    float *t = A + i * C;
    const int64_t nv = i / 16 + 1;
    __m512 acc[C / 16];
    for (int u = 0; u < C / 16; u++)
      acc[u] = _mm512_maskz_mov_ps(i / 16 == u ? (__mmask16)(1u << (i % 16)) : 0,
                                   _mm512_set1_ps(1.0f));
    for (int64_t j = 0; j < i; j++) {
      const __m512 a = _mm512_set1_ps(t[j]);
      for (int u = 0; u < C / 16; u++)
        if (u < nv) acc[u] = _mm512_fnmadd_ps(a, _mm512_loadu_ps(A + j * C + 16 * u), acc[u]);
    }
    for (int u = 0; u < C / 16; u++) _mm512_storeu_ps(t + 16 * u, acc[u]);
  }
}

/* dst[l*ldd + i] = src[i*lds + l] for 16 rows i and the columns l < n (<= 16) of
 * a block: 16 x 16 in registers (unpack, shuffle, two 128-bit lane shuffles). */
static void transpose16(const float *src, int64_t lds, int64_t n, float *dst, int64_t ldd) {
  const __mmask16 m = armllm_avx512_tail16(n);
  __m512 r[16], t[16];
  for (int i = 0; i < 16; i++) r[i] = _mm512_maskz_loadu_ps(m, src + i * lds);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int h = 0; h < 16; h += 8)
    for (int i = 0; i < 4; i++) {
      t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + 4 + i], 0x88);
      t[h + 4 + i] = _mm512_shuffle_f32x4(r[h + i], r[h + 4 + i], 0xdd);
    }
  for (int i = 0; i < 8; i++) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xdd);
  }
  for (int l = 0; l < 16; l++)
    if (l < n) _mm512_storeu_ps(dst + l * ldd, r[l]);
}

static void gdn_transpose(const float *Kn, int64_t dk, float *KnT) {
  for (int64_t i = 0; i < C; i += 16)
    for (int64_t l = 0; l < dk; l += 16)
      transpose16(Kn + i * dk + l, dk, dk - l < 16 ? dk - l : 16, KnT + l * C + i, C);
}

static void gdn_decays(const float *G, float *eG, float *eGl) {
  const __m512 g_last = _mm512_set1_ps(G[C - 1]);
  for (int64_t i = 0; i < C; i += 16) {
    const __m512 gi = _mm512_loadu_ps(G + i);
    _mm512_storeu_ps(eG + i, armllm_exp_avx512(gi));
    _mm512_storeu_ps(eGl + i, armllm_exp_avx512(_mm512_sub_ps(g_last, gi)));
  }
}

static void gdn_decay_masks(const float *G, const float *beta, float *A, float *P) {
  for (int64_t i = 0; i < C; i++) {
    const __m512 gi = _mm512_set1_ps(G[i]), bi = _mm512_set1_ps(beta[i]);
    for (int64_t j = 0; j < C; j += 16) {
      const __mmask16 on = lanes16(j, i + 1), strict = lanes16(j, i);
      if (!on) { /* above the diagonal */
        _mm512_storeu_ps(A + i * C + j, _mm512_setzero_ps());
        _mm512_storeu_ps(P + i * C + j, _mm512_setzero_ps());
        continue;
      }
      const __m512 d = armllm_exp_avx512(_mm512_sub_ps(gi, _mm512_loadu_ps(G + j)));
      const __m512 a = _mm512_maskz_loadu_ps(strict, A + i * C + j);
      _mm512_storeu_ps(A + i * C + j, _mm512_maskz_mul_ps(strict, _mm512_mul_ps(bi, a), d));
      _mm512_storeu_ps(P + i * C + j, _mm512_maskz_mul_ps(on, _mm512_maskz_loadu_ps(on, P + i * C + j), d));
    }
  }
}

ARMLLM_GDN_RULE_KERNEL(armllm_avx512_gdn_rule, gdn_chunk, gdn_token, ftz)

/* ---------------------------------------------------- gated norm, gate */

static void avx512_gated_rmsnorm_items(void *ctx, int64_t i0, int64_t i1) {
  const armllm_gated_norm_job *job = ctx;
  const int64_t d = job->d;
  for (int64_t it = i0; it < i1; it++) {
    const int64_t r = it / job->heads, off = it % job->heads * d;
    const float *x = job->x + r * job->ldx + off, *z = job->z + r * job->ldz + off;
    float *out = job->out + r * job->ldo + off;
    const __m512 scale =
        _mm512_set1_ps((float)(1.0 / sqrt(gdn_sum_sq(x, d) / (double)d + (double)job->eps)));
    for (int64_t i = 0; i < d; i += 16) { /* x * scale * w * silu(z); out may be x */
      const __mmask16 m = lanes16(i, d);
      const __m512 y = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), scale),
                                     _mm512_maskz_loadu_ps(m, job->weight + i));
      _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(y, silu16(_mm512_maskz_loadu_ps(m, z + i))));
    }
  }
}

void armllm_avx512_gated_rmsnorm(armllm_pool *pool, const float *x, int64_t ldx, const float *z,
                                 int64_t ldz, const float *weight, int64_t t, int64_t heads,
                                 int64_t d, float eps, float *out, int64_t ldo) {
  armllm_gated_norm_job job = {x, ldx, z, ldz, weight, heads, d, eps, out, ldo};
  armllm_rows_run(pool, t * heads, d, 16384, avx512_gated_rmsnorm_items, &job);
}

static void avx512_sigmoid_mul_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_sigmoid_mul_job *job = ctx;
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t t = t0; t < t1; t++) {
    const float *g = job->gate + t * job->ldg;
    float *x = job->x + t * job->ldx;
    for (int64_t j = 0; j < job->n; j += 16) {
      const __mmask16 m = lanes16(j, job->n);
      const __m512 e = armllm_exp_avx512(_mm512_castsi512_ps(_mm512_xor_si512(
          _mm512_castps_si512(_mm512_maskz_loadu_ps(m, g + j)), _mm512_set1_epi32((int32_t)0x80000000u))));
      _mm512_mask_storeu_ps(x + j, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, x + j), _mm512_add_ps(one, e)));
    }
  }
}

void armllm_avx512_sigmoid_mul(armllm_pool *pool, const float *gate, int64_t ldg, int64_t t,
                               int64_t n, float *x, int64_t ldx) {
  armllm_sigmoid_mul_job job = {gate, ldg, n, x, ldx};
  armllm_rows_run(pool, t, n, 16384, avx512_sigmoid_mul_rows, &job);
}
