/* avx2/gdn.c: the Gated DeltaNet kernels (armllm_kernels.h), 8 lanes.
 *
 * The same structure as avx512/gdn.c: conv, gated_rmsnorm and sigmoid_mul run
 * ref's operations in ref's order (the conv and the gate give ref's bits, the
 * norm differs only in its double sum of squares); gdn_rule runs gdn_rule.h's
 * steps (ref's order) around these micro-kernels, FMAs where ref rounds twice:
 *   - a token: per block of up to 64 columns, pass 1 streams the block's rows
 *     of S into kv = S^T kn (8 accumulators), pass 2 rewrites them as
 *     e^g S + kn delta^T (delta from L1) and sums o = S^T qn;
 *   - a chunk of 64 rows: the products as a 4-row x 16-column register-tiled
 *     kernel (8 accumulators), the (I + A)^-1 a row at a time.
 */
#include <immintrin.h>
#include <math.h>

#include "../armllm_kernels.h"
#include "../family_jobs.h"
#include "../gdn_common.h"
#include "vexp_avx2.h"

/* A chunk asks for its input rows this many rows ahead (gdn_rule.h). */
#define GDN_ROW_PREFETCH 4
#include "../gdn_rule.h"

enum { C = ARMLLM_GDN_CHUNK };

/* the product rounded on its own: the compiler may not fuse it into a later add */
#define OPAQUE(v) __asm__("" : "+x"(v))

static inline __m256 silu8(__m256 v) {
  const __m256 e = armllm_exp_avx2(_mm256_xor_ps(v, _mm256_set1_ps(-0.0f)));
  return _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* Lanes of the 8-wide vector at column j of n columns (none past the end). */
static inline __m256i lanes8(int64_t j, int64_t n) {
  return armllm_avx2_tail_mask(j >= n ? 0 : n - j >= 8 ? 8 : n - j);
}

/* ------------------------------------------------------------------ conv */

static void avx2_conv_row(const float *const *src, const float *wt, int64_t kernel, int64_t nc,
                          float *y) {
  int64_t c = 0;
  for (; c + 8 <= nc; c += 8) {
    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(wt + c), _mm256_loadu_ps(src[0] + c));
    OPAQUE(acc);
    for (int64_t j = 1; j < kernel; j++) {
      __m256 p = _mm256_mul_ps(_mm256_loadu_ps(wt + j * ARMLLM_GDN_CONV_CHANNELS + c),
                               _mm256_loadu_ps(src[j] + c));
      OPAQUE(p);
      acc = _mm256_add_ps(acc, p);
    }
    _mm256_storeu_ps(y + c, silu8(acc));
  }
  if (c < nc) {
    const __m256i m = armllm_avx2_tail_mask(nc - c);
    __m256 acc = _mm256_mul_ps(_mm256_maskload_ps(wt + c, m), _mm256_maskload_ps(src[0] + c, m));
    OPAQUE(acc);
    for (int64_t j = 1; j < kernel; j++) {
      __m256 p = _mm256_mul_ps(_mm256_maskload_ps(wt + j * ARMLLM_GDN_CONV_CHANNELS + c, m),
                               _mm256_maskload_ps(src[j] + c, m));
      OPAQUE(p);
      acc = _mm256_add_ps(acc, p);
    }
    _mm256_maskstore_ps(y + c, m, silu8(acc));
  }
}

/* wt[j*CHANNELS + c] = w[c*kernel + j]: 8 channels of a tap a gather */
static void avx2_conv_weights(const float *w, int64_t kernel, int64_t nc, float *wt) {
  const __m256i lane = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                          _mm256_set1_epi32((int32_t)kernel));
  for (int64_t c = 0; c < nc; c += 8) {
    const __m256i m = lanes8(c, nc);
    for (int64_t j = 0; j < kernel; j++)
      _mm256_storeu_ps(wt + j * ARMLLM_GDN_CONV_CHANNELS + c,
                       _mm256_mask_i32gather_ps(_mm256_setzero_ps(), w + c * kernel + j, lane,
                                                _mm256_castsi256_ps(m), 4));
  }
}

ARMLLM_GDN_CONV_KERNEL(armllm_avx2_gdn_conv, avx2_conv_weights, avx2_conv_row)

/* ------------------------------------------------------------------ rule */

/* x's sum of squares in double (each square exact), 4 x 2 lanes. */
static double gdn_sum_sq(const float *x, int64_t n) {
  __m256d s0 = _mm256_setzero_pd(), s1 = s0;
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_maskload_ps(x + i, lanes8(i, n));
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    s0 = _mm256_fmadd_pd(lo, lo, s0);
    s1 = _mm256_fmadd_pd(hi, hi, s1);
  }
  const __m256d s = _mm256_add_pd(s0, s1);
  const __m128d s2 = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s2, _mm_unpackhi_pd(s2, s2)));
}

#define TOKEN_PREFETCH_ROWS 8 /* the stream from memory, a few rows ahead */

/* One token's two passes over columns [j0, j0 + 8 NV) of S (m: each vector's lanes;
 * TAIL: masked loads and stores, else whole vectors). */
static inline __attribute__((always_inline)) void token_block(
    const int NV, const int TAIL, float *S, int64_t dk, int64_t dv, int64_t j0,
    const __m256i *m, const float *kn, const float *qn, const float *v, float eg, float beta,
    float *out) {
#define LOAD(p, u) (TAIL ? _mm256_maskload_ps((p), m[u]) : _mm256_loadu_ps(p))
#define STORE(p, u, x) (TAIL ? _mm256_maskstore_ps((p), m[u], (x)) : _mm256_storeu_ps((p), (x)))
  __m256 acc[8], o[8];
  float delta[64] __attribute__((aligned(32)));
  for (int u = 0; u < NV; u++) acc[u] = _mm256_setzero_ps();
  for (int64_t i = 0; i < dk; i++) {
    const float *s = S + i * dv + j0;
    const __m256 kb = _mm256_set1_ps(kn[i]);
    if (i + TOKEN_PREFETCH_ROWS < dk)
      for (int u = 0; u < NV; u += 2)
        _mm_prefetch((const char *)(s + TOKEN_PREFETCH_ROWS * dv + 8 * u), _MM_HINT_T0);
    for (int u = 0; u < NV; u++) acc[u] = _mm256_fmadd_ps(LOAD(s + 8 * u, u), kb, acc[u]);
  }
  const __m256 egv = _mm256_set1_ps(eg), bv = _mm256_set1_ps(beta);
  for (int u = 0; u < NV; u++) {
    const __m256 kv = _mm256_mul_ps(egv, acc[u]);
    _mm256_store_ps(delta + 8 * u, _mm256_mul_ps(bv, _mm256_sub_ps(LOAD(v + j0 + 8 * u, u), kv)));
    o[u] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < dk; i++) {
    float *s = S + i * dv + j0;
    const __m256 kb = _mm256_set1_ps(kn[i]), qb = _mm256_set1_ps(qn[i]);
    for (int u = 0; u < NV; u++) {
      const __m256 x = _mm256_fmadd_ps(LOAD(s + 8 * u, u), egv,
                                       _mm256_mul_ps(kb, _mm256_load_ps(delta + 8 * u)));
      STORE(s + 8 * u, u, x);
      o[u] = _mm256_fmadd_ps(x, qb, o[u]);
    }
  }
  for (int u = 0; u < NV; u++) STORE(out + j0 + 8 * u, u, o[u]);
#undef LOAD
#undef STORE
}

static void gdn_token_cols(float *S, int64_t dk, int64_t dv, const float *kn, const float *qn,
                           const float *v, float eg, float beta, float *out) {
  int64_t j0 = 0;
  for (; j0 + 64 <= dv; j0 += 64) token_block(8, 0, S, dk, dv, j0, NULL, kn, qn, v, eg, beta, out);
  if (j0 < dv) { /* the last 1..63 columns, masked */
    __m256i m[8];
    for (int u = 0; u < 8; u++) m[u] = lanes8(j0 + 8 * u, dv);
    switch ((dv - j0 + 7) / 8) {
#define TOKEN_CASE(n) \
  case n: token_block(n, 1, S, dk, dv, j0, m, kn, qn, v, eg, beta, out); break;
      TOKEN_CASE(1) TOKEN_CASE(2) TOKEN_CASE(3) TOKEN_CASE(4)
      TOKEN_CASE(5) TOKEN_CASE(6) TOKEN_CASE(7) TOKEN_CASE(8)
#undef TOKEN_CASE
    }
  }
}

/* Rows [i0, i0 + 4) x columns [j0, j0 + 8 NV) of ref_mm's product (rows past m_rows
 * repeat row m_rows-1 and are not stored; TAIL: masked by m, else whole vectors). */
static inline __attribute__((always_inline)) void mm_tile(
    const int NV, const int SUB, const int TAIL, int64_t i0, int64_t m_rows, int64_t kk,
    const float *A, int64_t ars, int64_t acs, const float *B, int64_t ldb, int64_t j0,
    const __m256i *m, float *Cm, int64_t ldc, int load, float c_scale) {
#define LOAD(p, u) (TAIL ? _mm256_maskload_ps((p), m[u]) : _mm256_loadu_ps(p))
  const float *a[4];
  __m256 acc[4][2];
  const int64_t mr = m_rows - i0 < 4 ? m_rows - i0 : 4;
  for (int r = 0; r < 4; r++) {
    a[r] = A + (i0 + (r < mr ? r : mr - 1)) * ars;
    for (int u = 0; u < NV; u++)
      acc[r][u] = load && r < mr
                      ? _mm256_mul_ps(_mm256_set1_ps(c_scale), LOAD(Cm + (i0 + r) * ldc + j0 + 8 * u, u))
                      : _mm256_setzero_ps();
  }
  for (int64_t l = 0; l < kk; l++) {
    __m256 b[2];
    for (int u = 0; u < NV; u++) b[u] = LOAD(B + l * ldb + j0 + 8 * u, u);
    for (int r = 0; r < 4; r++) {
      const __m256 ar = _mm256_broadcast_ss(a[r] + l * acs);
      for (int u = 0; u < NV; u++)
        acc[r][u] = SUB ? _mm256_fnmadd_ps(ar, b[u], acc[r][u]) : _mm256_fmadd_ps(ar, b[u], acc[r][u]);
    }
  }
  for (int r = 0; r < 4; r++) /* constant bounds: acc stays in registers */
    for (int u = 0; u < NV; u++) {
      float *c = Cm + (i0 + r) * ldc + j0 + 8 * u;
      if (r < mr) {
        if (TAIL) _mm256_maskstore_ps(c, m[u], acc[r][u]);
        else _mm256_storeu_ps(c, acc[r][u]);
      }
    }
#undef LOAD
}

/* In 4 x 16 tiles: each output one FMA chain over l ascending. GDN_MM_LOWER: a
 * tile stops at its last row's diagonal; GDN_MM_TRI: at its last row's column. */
static void gdn_mm(int64_t m_rows, int64_t n, int64_t k, const float *A, int64_t ars,
                   int64_t acs, const float *B, int64_t ldb, float *Cm, int64_t ldc, int flags,
                   float c_scale) {
  const int load = flags & GDN_MM_LOAD, sub = (flags & GDN_MM_SUB) != 0;
  const int lower = flags & GDN_MM_LOWER, lower_out = flags & GDN_MM_TRI;
  for (int64_t i0 = 0; i0 < m_rows; i0 += 4) {
    const int64_t kk = lower && i0 + 4 < k ? i0 + 4 : k;
    const int64_t nn = lower_out && i0 + 4 < n ? i0 + 4 : n;
    for (int64_t j0 = 0; j0 < nn; j0 += 16) {
      const __m256i m[2] = {lanes8(j0, nn), lanes8(j0 + 8, nn)};
      const int nv = nn - j0 > 8 ? 2 : 1, tail = nn - j0 < 8 * nv;
      switch (nv * 4 + sub * 2 + tail) {
#define MM_CASE(n, s, t)                                                                     \
  case n * 4 + s * 2 + t:                                                                    \
    mm_tile(n, s, t, i0, m_rows, kk, A, ars, acs, B, ldb, j0, m, Cm, ldc, load, c_scale);    \
    break;
        MM_CASE(1, 0, 0) MM_CASE(1, 0, 1) MM_CASE(1, 1, 0) MM_CASE(1, 1, 1)
        MM_CASE(2, 0, 0) MM_CASE(2, 0, 1) MM_CASE(2, 1, 0) MM_CASE(2, 1, 1)
#undef MM_CASE
      }
    }
  }
}

/* Over the vectors that reach column i; row i is read before it is stored. */
static void gdn_unit_lower_inverse(float *A) {
  for (int64_t i = 0; i < C; i++) {
    float *t = A + i * C;
    const int64_t nv = i / 8 + 1;
    __m256 acc[C / 8];
    for (int u = 0; u < C / 8; u++)
      acc[u] = _mm256_and_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(
                                 _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                 _mm256_set1_epi32((int32_t)(i - 8 * u)))),
                             _mm256_set1_ps(1.0f));
    for (int64_t j = 0; j < i; j++) {
      const __m256 a = _mm256_set1_ps(t[j]);
      for (int u = 0; u < C / 8; u++)
        if (u < nv) acc[u] = _mm256_fnmadd_ps(a, _mm256_loadu_ps(A + j * C + 8 * u), acc[u]);
    }
    for (int u = 0; u < C / 8; u++) _mm256_storeu_ps(t + 8 * u, acc[u]);
  }
}

/* dst[l*ldd + i] = src[i*lds + l] for 8 rows i and the columns l < n (<= 8). */
static void transpose8(const float *src, int64_t lds, int64_t n, float *dst, int64_t ldd) {
  const __m256i m = armllm_avx2_tail_mask(n);
  __m256 r[8], t[8];
  for (int i = 0; i < 8; i++) r[i] = _mm256_maskload_ps(src + i * lds, m);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; i++) {
    t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
    t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
  }
  for (int l = 0; l < 8; l++)
    if (l < n) _mm256_storeu_ps(dst + l * ldd, t[l]);
}

static void gdn_transpose(const float *Kn, int64_t dk, float *KnT) {
  for (int64_t i = 0; i < C; i += 8)
    for (int64_t l = 0; l < dk; l += 8)
      transpose8(Kn + i * dk + l, dk, dk - l < 8 ? dk - l : 8, KnT + l * C + i, C);
}

static void gdn_decays(const float *G, float *eG, float *eGl) {
  const __m256 g_last = _mm256_set1_ps(G[C - 1]);
  for (int64_t i = 0; i < C; i += 8) {
    const __m256 gi = _mm256_loadu_ps(G + i);
    _mm256_storeu_ps(eG + i, armllm_exp_avx2(gi));
    _mm256_storeu_ps(eGl + i, armllm_exp_avx2(_mm256_sub_ps(g_last, gi)));
  }
}

static void gdn_decay_masks(const float *G, const float *beta, float *A, float *P) {
  const __m256i col = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t i = 0; i < C; i++) {
    const __m256 gi = _mm256_set1_ps(G[i]), bi = _mm256_set1_ps(beta[i]);
    for (int64_t j = 0; j < C; j += 8) {
      if (j > i) { /* above the diagonal */
        _mm256_storeu_ps(A + i * C + j, _mm256_setzero_ps());
        _mm256_storeu_ps(P + i * C + j, _mm256_setzero_ps());
        continue;
      }
      const __m256i jj = _mm256_add_epi32(col, _mm256_set1_epi32((int32_t)j));
      const __m256 on = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)i + 1), jj));
      const __m256 strict = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)i), jj));
      const __m256 d = armllm_exp_avx2(_mm256_sub_ps(gi, _mm256_loadu_ps(G + j)));
      const __m256 a = _mm256_and_ps(strict, _mm256_loadu_ps(A + i * C + j));
      _mm256_storeu_ps(A + i * C + j, _mm256_and_ps(strict, _mm256_mul_ps(_mm256_mul_ps(bi, a), d)));
      const __m256 p = _mm256_and_ps(on, _mm256_loadu_ps(P + i * C + j));
      _mm256_storeu_ps(P + i * C + j, _mm256_and_ps(on, _mm256_mul_ps(p, d)));
    }
  }
}

ARMLLM_GDN_RULE_KERNEL(armllm_avx2_gdn_rule, gdn_chunk, gdn_token, ftz)

/* ---------------------------------------------------- gated norm, gate */

static void avx2_gated_rmsnorm_items(void *ctx, int64_t i0, int64_t i1) {
  const armllm_gated_norm_job *job = ctx;
  const int64_t d = job->d;
  for (int64_t it = i0; it < i1; it++) {
    const int64_t r = it / job->heads, off = it % job->heads * d;
    const float *x = job->x + r * job->ldx + off, *z = job->z + r * job->ldz + off;
    float *out = job->out + r * job->ldo + off;
    const __m256 scale =
        _mm256_set1_ps((float)(1.0 / sqrt(gdn_sum_sq(x, d) / (double)d + (double)job->eps)));
    for (int64_t i = 0; i < d; i += 8) { /* x * scale * w * silu(z); out may be x */
      const __m256i m = lanes8(i, d);
      const __m256 y = _mm256_mul_ps(_mm256_mul_ps(_mm256_maskload_ps(x + i, m), scale),
                                     _mm256_maskload_ps(job->weight + i, m));
      _mm256_maskstore_ps(out + i, m, _mm256_mul_ps(y, silu8(_mm256_maskload_ps(z + i, m))));
    }
  }
}

void armllm_avx2_gated_rmsnorm(armllm_pool *pool, const float *x, int64_t ldx, const float *z,
                               int64_t ldz, const float *weight, int64_t t, int64_t heads,
                               int64_t d, float eps, float *out, int64_t ldo) {
  armllm_gated_norm_job job = {x, ldx, z, ldz, weight, heads, d, eps, out, ldo};
  armllm_rows_run(pool, t * heads, d, 16384, avx2_gated_rmsnorm_items, &job);
}

static void avx2_sigmoid_mul_rows(void *ctx, int64_t t0, int64_t t1) {
  const armllm_sigmoid_mul_job *job = ctx;
  const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
  for (int64_t t = t0; t < t1; t++) {
    const float *g = job->gate + t * job->ldg;
    float *x = job->x + t * job->ldx;
    for (int64_t j = 0; j < job->n; j += 8) {
      const __m256i m = lanes8(j, job->n);
      const __m256 e = armllm_exp_avx2(_mm256_xor_ps(_mm256_maskload_ps(g + j, m), neg));
      _mm256_maskstore_ps(x + j, m, _mm256_div_ps(_mm256_maskload_ps(x + j, m), _mm256_add_ps(one, e)));
    }
  }
}

void armllm_avx2_sigmoid_mul(armllm_pool *pool, const float *gate, int64_t ldg, int64_t t,
                             int64_t n, float *x, int64_t ldx) {
  armllm_sigmoid_mul_job job = {gate, ldg, n, x, ldx};
  armllm_rows_run(pool, t, n, 16384, avx2_sigmoid_mul_rows, &job);
}
