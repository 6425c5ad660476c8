/* avx2/attn_i8.h: the micro-kernels of avx2/attn.c for int8 caches, in
 * integers (attn_common.h): QK^T, PV and the int16 weights. Included by
 * avx2/attn.c only, after its macros (MAXD, AINLINE, ...) and before its
 * tiles, which call these from tile_partition_i8. */
#ifndef ARMLLM_AVX2_ATTN_I8_H
#define ARMLLM_AVX2_ATTN_I8_H

/* ------------------------------------------------------------ int8 caches */

/* Widened q rows and V slices step over head_dim by 16 int16s (one vector). */
#define I8_STEP 16

/* 16 int8 at p (n of them, 1..16, the rest 0: a row's last slice when
 * head_dim is not a multiple of 16, never read past the row) as int16. */
static inline __m256i i8_widen16(const int8_t *p, int64_t n) {
  if (n >= I8_STEP) return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
  int8_t t[I8_STEP] = {0};
  memcpy(t, p, (size_t)n);
  return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)t));
}

/* 16 bytes at p, n (1..16) of them as above, for the byte interleave of PV. */
static inline __m128i i8_load16(const int8_t *p, int64_t n) {
  if (n >= I8_STEP) return _mm_loadu_si128((const __m128i *)p);
  int8_t t[I8_STEP] = {0};
  memcpy(t, p, (size_t)n);
  return _mm_loadu_si128((const __m128i *)t);
}

/* Scores of NQ (1..4) quantized query rows q[r] (int16, zero-padded to a
 * multiple of 16) with keys k0 and k1 (int8 rows of hd): the exact int32 dots
 * by VPMADDWD (int16 x int16 pairs summed into int32: exact, unlike
 * VPMADDUBSW's saturating int16 sums), 8 lanes over head_dim per (query,
 * key), reduced by one horizontal-add tree per 8 dots; then s = ((float)dot *
 * ks) * qf as ref, with ks2 = (ks_k0, ks_k1) and qf8 = (qf_0, qf_0, qf_1, ...)
 * (pairs of lanes per query). Stores m (1 or 2) scores to s[r][0..m). */
AINLINE void qk_i8_4x2(const int NQ, const int16_t *const *q, const int8_t *k0,
                       const int8_t *k1, int64_t hd, __m256 ks2, __m256 qf8, float *const *s,
                       int64_t m) {
  __m256i acc[4][2];
  for (int r = 0; r < 4; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  int64_t x = 0;
#define QK_I8_STEP(kv0, kv1)                                                       \
  for (int r = 0; r < NQ; r++) {                                                   \
    const __m256i qv = _mm256_load_si256((const __m256i *)(q[r] + x));             \
    acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(qv, kv0));           \
    acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(qv, kv1));           \
  }
  for (; x + I8_STEP <= hd; x += I8_STEP) {
    const __m256i kv0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(k0 + x)));
    const __m256i kv1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(k1 + x)));
    QK_I8_STEP(kv0, kv1)
  }
  if (x < hd) {
    const __m256i kv0 = i8_widen16(k0 + x, hd - x), kv1 = i8_widen16(k1 + x, hd - x);
    QK_I8_STEP(kv0, kv1)
  }
#undef QK_I8_STEP
  /* per 128-bit half: (q0k0, q0k1, q1k0, q1k1) in h01, q2/q3 in h23; then the halves */
  const __m256i h01 = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[0][0], acc[0][1]),
                                        _mm256_hadd_epi32(acc[1][0], acc[1][1]));
  const __m256i h23 = _mm256_hadd_epi32(_mm256_hadd_epi32(acc[2][0], acc[2][1]),
                                        _mm256_hadd_epi32(acc[3][0], acc[3][1]));
  const __m256i dots = _mm256_add_epi32(_mm256_permute2x128_si256(h01, h23, 0x20),
                                        _mm256_permute2x128_si256(h01, h23, 0x31));
  const __m256 f = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dots), ks2), qf8);
  if (m == 2) {
    const __m128 lo = _mm256_castps256_ps128(f), hi = _mm256_extractf128_ps(f, 1);
    _mm_storel_pi((__m64 *)s[0], lo);
    if (NQ > 1) _mm_storeh_pi((__m64 *)s[1], lo);
    if (NQ > 2) _mm_storel_pi((__m64 *)s[2], hi);
    if (NQ > 3) _mm_storeh_pi((__m64 *)s[3], hi);
  } else {
    float o[8];
    _mm256_storeu_ps(o, f);
    for (int r = 0; r < NQ; r++) s[r][0] = o[2 * r];
  }
}

/* Scores s[r][j] of NQ queries q[r] (factors qf[r]) for keys kp[0..nj) with
 * K scales ksc[0..nj), two keys at a time (an odd last one paired with
 * itself); prefetches pf[0..npf) along the way. */
AINLINE void qk_i8_rows(const int NQ, const int16_t *const *q, const float *qf,
                        const void *const *kp, const float *ksc, int64_t nj, int64_t hd,
                        float *const *s, const void *const *pf, int64_t npf) {
  const __m256 qf8 = _mm256_setr_ps(qf[0], qf[0], NQ > 1 ? qf[1] : 0.0f, NQ > 1 ? qf[1] : 0.0f,
                                    NQ > 2 ? qf[2] : 0.0f, NQ > 2 ? qf[2] : 0.0f,
                                    NQ > 3 ? qf[3] : 0.0f, NQ > 3 ? qf[3] : 0.0f);
  for (int64_t j = 0; j < nj; j += 2) {
    for (int64_t u = j; u < j + 2 && u < npf; u++) attn_prefetch_row(pf[u], hd);
    const int64_t m = nj - j < 2 ? 1 : 2, j1 = j + m - 1;
    const float kpair[2] = {ksc[j], ksc[j1]};
    double k2; /* the two scales as one 64-bit lane, broadcast */
    memcpy(&k2, kpair, sizeof k2);
    const __m256 ks2 = _mm256_castpd_ps(_mm256_set1_pd(k2));
    float *sj[4];
    for (int r = 0; r < NQ; r++) sj[r] = s[r] + j;
    qk_i8_4x2(NQ, q, kp[j], kp[j1], hd, ks2, qf8, sj, m);
  }
}

/* acc[r][0..hd16) += sum_j w[r][j] v_j for NQ (1..4) queries, V rows
 * vp[0..nj) (int8 rows of hd; hd16 = hd rounded up to 16) and int16 weights
 * w[r][0..nj] (w[r][nj] read and 0 when nj is odd), in int32: two keys' rows
 * interleaved byte by byte and widened to int16, so that VPMADDWD with the
 * pair (w_j, w_j+1) in every 32-bit lane gives w_j v_j[d] + w_j+1 v_j+1[d]
 * per lane d. Prefetches pf[0..npf) along the first slice. */
AINLINE void pv_i8_rows(const int NQ, int32_t *const *acc, const int16_t *const *w,
                        const void *const *vp, int64_t nj, int64_t hd,
                        const void *const *pf, int64_t npf) {
  for (int64_t x = 0; x < hd; x += I8_STEP) {
    const int64_t n = hd - x;
    __m256i c[4][2];
    for (int r = 0; r < NQ; r++) {
      c[r][0] = _mm256_load_si256((const __m256i *)(acc[r] + x));
      c[r][1] = _mm256_load_si256((const __m256i *)(acc[r] + x + 8));
    }
    for (int64_t j = 0; j < nj; j += 2) {
      if (j < npf) attn_prefetch_row(pf[j], hd);
      if (j + 1 < npf) attn_prefetch_row(pf[j + 1], hd);
      const int8_t *v0 = vp[j], *v1 = j + 1 < nj ? vp[j + 1] : v0;
      const __m128i b0 = i8_load16(v0 + x, n), b1 = i8_load16(v1 + x, n);
      /* (v0[d], v1[d]) pairs: dims x..x+8 and x+8..x+16 */
      const __m256i lo = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(b0, b1));
      const __m256i hi = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(b0, b1));
      for (int r = 0; r < NQ; r++) {
        int32_t pair;
        memcpy(&pair, w[r] + j, sizeof pair);
        const __m256i wp = _mm256_set1_epi32(pair);
        c[r][0] = _mm256_add_epi32(c[r][0], _mm256_madd_epi16(lo, wp));
        c[r][1] = _mm256_add_epi32(c[r][1], _mm256_madd_epi16(hi, wp));
      }
    }
    npf = 0;
    for (int r = 0; r < NQ; r++) {
      _mm256_store_si256((__m256i *)(acc[r] + x), c[r][0]);
      _mm256_store_si256((__m256i *)(acc[r] + x + 8), c[r][1]);
    }
  }
}

/* A query's PV weights w = s[u0..u1) (tile_softmax's, u0 and u1 multiples
 * of 8, 0 outside its keys) and their largest wmax quantized to
 * w16[u0..u1) as armllm_attn_i8_weights: y = w * r, max(y, 0) with y first
 * (NaN -> 0), min 32767, VCVTPS2DQ rounding to nearest even (the default
 * MXCSR, as nearbyintf). Returns the scale ws. */
static float i8_weights(int16_t *w16, const float *s, float wmax, int64_t u0, int64_t u1) {
  const float r = wmax > 0.0f ? ARMLLM_ATTN_W16_MAX / wmax : 0.0f;
  const __m256 zero = _mm256_setzero_ps(), r8 = _mm256_set1_ps(r);
  const __m256 top = _mm256_set1_ps(ARMLLM_ATTN_W16_MAX);
  for (int64_t j = u0; j < u1; j += 8) {
    __m256 y = _mm256_mul_ps(_mm256_loadu_ps(s + j), r8);
    y = _mm256_min_ps(_mm256_max_ps(y, zero), top);
    const __m256i i = _mm256_cvtps_epi32(y);
    _mm_storeu_si128((__m128i *)(w16 + j),
                     _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1)));
  }
  return wmax / ARMLLM_ATTN_W16_MAX;
}

#endif /* ARMLLM_AVX2_ATTN_I8_H */
