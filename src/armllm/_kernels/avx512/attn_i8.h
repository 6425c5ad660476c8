/* avx512/attn_i8.h: the micro-kernels of avx512/attn.c for int8 caches, in
 * integers (attn_common.h): QK^T, PV and the int16 weights. Included by
 * avx512/attn.c only, after its macros (MAXD, AINLINE, ...) and before its
 * tiles, which call these from tile_partition_i8. */
#ifndef ARMLLM_AVX512_ATTN_I8_H
#define ARMLLM_AVX512_ATTN_I8_H

/* --------------------------------------------- int8 caches, in integers
 *
 * attn_common.h's arithmetic: q rows quantized as K rows are, exact int32
 * dots, and the softmax weights as int16s of the partition's largest, whose
 * exact int32 sums with V become f32 once per partition.
 *
 * QK^T (qk_i8_rows): keys in lanes. 16 keys' rows, 64 bytes at a time, are
 * transposed in registers (i8_keys16: 64 unpacks and shuffles) so that
 * vector c holds bytes [4c, 4c + 4) of all 16 keys; vpdpbusd then adds each
 * query's 4 q bytes (a broadcast) times them into one lane a key: 16 dots in
 * one vector, no horizontal sums. vpdpbusd multiplies unsigned by signed
 * bytes, so K goes in offset by 128 (an XOR) and each query's sum starts at
 * -128 * sum(q8). The transpose is paid once per 16 keys whatever the
 * queries.
 * PV (pvi_tile): two keys' V rows widened to int16 and interleaved (dim d
 * of key j beside dim d of key j + 1) meet a broadcast of the two keys'
 * int16 weights in vpdpwssd: 32 products a lane pair, 16 dims an
 * instruction. The interleave leaves the dims of each 32 in a fixed order
 * (unpermute_acci puts them back). */

/* 64-byte mask of the first n (1..64) bytes. */
static inline __mmask64 mask64(int64_t n) {
  return n >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << n) - 1;
}

/* kt[c] = bytes [x + 4c, x + 4c + 4) of rows k[0..16) (the first n of the
 * 64 from x, zeros after), key u in lane u, each byte + 128. */
AINLINE void i8_keys16(const void *const *k, int64_t x, int64_t n, __m512i *kt) {
  const __mmask64 m = mask64(n);
  __m512i r[16], t[16];
  UNROLL16 for (int u = 0; u < 16; u++) r[u] = _mm512_maskz_loadu_epi8(m, (const int8_t *)k[u] + x);
  /* 16 x 16 dwords: pairs, quads, then 128-bit lanes twice */
  UNROLL16 for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  UNROLL16 for (int i = 0; i < 4; i++) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  UNROLL16 for (int i = 0; i < 2; i++)
    UNROLL16 for (int j = 0; j < 4; j++) {
      t[8 * i + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_i32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
    }
  const __m512i bias = _mm512_set1_epi8((char)0x80);
  UNROLL16 for (int j = 0; j < 8; j++) {
    kt[j] = _mm512_xor_si512(_mm512_shuffle_i32x4(t[j], t[8 + j], 0x88), bias);
    kt[8 + j] = _mm512_xor_si512(_mm512_shuffle_i32x4(t[j], t[8 + j], 0xdd), bias);
  }
}

/* acc[r] += q8_r . the keys of kt (16 groups of 4 bytes from q8_r + x). */
AINLINE void qki_step(const int NQ, const int8_t *const *q8, int64_t x, const __m512i *kt,
                      __m512i *acc) {
  UNROLL16 for (int c = 0; c < 16; c++) {
    UNROLL for (int r = 0; r < NQ; r++) {
      int32_t qq;
      memcpy(&qq, q8[r] + x + 4 * c, sizeof qq);
      acc[r] = _mm512_dpbusd_epi32(acc[r], kt[c], _mm512_set1_epi32(qq));
    }
  }
}

/* Scores of NQ (1..4) queries over the transposed keys kbuf (nx chunks of
 * 16 vectors): s[r * lds + u] = ((float)dot * ksc[u]) * qf[r] for keys u < m. */
AINLINE void qki_tile(const int NQ, const int8_t *const *q8, const int32_t *qcorr,
                      const float *qf, const __m512i *kbuf, int64_t nx, const float *ksc,
                      float *s, int64_t lds, __mmask16 m) {
  __m512i acc[QB];
  UNROLL for (int r = 0; r < NQ; r++) acc[r] = _mm512_set1_epi32(qcorr[r]);
  for (int64_t c = 0; c < nx; c++) qki_step(NQ, q8, 64 * c, kbuf + 16 * c, acc);
  const __m512 ks = _mm512_maskz_loadu_ps(m, ksc);
  UNROLL for (int r = 0; r < NQ; r++)
    _mm512_mask_storeu_ps(s + r * lds, m,
                          _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[r]), ks),
                                        _mm512_set1_ps(qf[r])));
}

/* s[i*lds + j] for queries i < nq (q8 rows zero-padded to a multiple of
 * 64, with their qcorr and qf) and keys j < nj of an int8 cache (rows kp,
 * scales ksc): 16 keys at a time, transposed once for all queries. */
static void qk_i8_rows(const int8_t (*q8rows)[MAXD], const int32_t *qcorr, const float *qf,
                       int64_t nq, int64_t hd, const void *const *kp, int64_t nj,
                       const float *ksc, float *s, int64_t lds, const void *const *pf,
                       int64_t npf, int64_t pfbytes) {
  const int64_t nx = (hd + 63) / 64;
  __m512i kbuf[16 * (MAXD / 64)];
  for (int64_t j = 0; j < nj; j += 16) {
    for (int64_t u = j; u < j + 16 && u < npf; u++) attn_prefetch_row(pf[u], pfbytes);
    const int64_t m = nj - j < 16 ? nj - j : 16;
    const void *k[16];
    for (int64_t u = 0; u < 16; u++) k[u] = kp[j + (u < m ? u : m - 1)];
    for (int64_t c = 0; c < nx; c++) i8_keys16(k, 64 * c, hd - 64 * c, kbuf + 16 * c);
    const __mmask16 mask = (__mmask16)((1u << m) - 1);
    for (int64_t i = 0; i < nq; i += QB) {
      const int mq = nq - i < QB ? (int)(nq - i) : QB;
      const int8_t *q8[QB];
      for (int r = 0; r < QB; r++) q8[r] = q8rows[i + (r < mq ? r : 0)];
#define QKI_CASE(NQ)                                                                    \
  case NQ:                                                                              \
    qki_tile(NQ, q8, qcorr + i, qf + i, kbuf, nx, ksc + j, s + i * lds + j, lds, mask); \
    break;
      switch (mq) {
        QKI_CASE(1)
        QKI_CASE(2)
        QKI_CASE(3)
        QKI_CASE(4)
      }
#undef QKI_CASE
    }
  }
}

/* c[r][x..x+32*NB) (int32, in pvi order) += sum_j w[r][j] * v_j[x..) for V
 * rows vp[0..nj) (int8, the first n (1..64) bytes from x), NQ (1..4)
 * queries, NB (1..2) blocks of 32 dims; keys in pairs (an odd last key
 * pairs with zeros). */
AINLINE void pvi_tile(const int NQ, const int NB, int32_t *const *c, const int16_t *const *w,
                      const void *const *vp, int64_t nj, int64_t x, int64_t n,
                      const void *const *pf, int64_t npf, int64_t pfbytes) {
  const __mmask64 m = mask64(n);
  const __mmask32 m0 = (__mmask32)m, m1 = (__mmask32)(m >> 32);
  __m512i acc[QB][4];
  UNROLL for (int r = 0; r < NQ; r++)
    UNROLL for (int v = 0; v < 2 * NB; v++) acc[r][v] = _mm512_loadu_si512(c[r] + x + 16 * v);
  for (int64_t j = 0; j < nj; j += 2) {
    if (j < npf) attn_prefetch_row(pf[j], pfbytes);
    if (j + 1 < npf) attn_prefetch_row(pf[j + 1], pfbytes);
    const int8_t *a = (const int8_t *)vp[j] + x;
    const int8_t *b = j + 1 < nj ? (const int8_t *)vp[j + 1] + x : NULL;
    __m512i vv[4];
    UNROLL for (int h = 0; h < NB; h++) {
      const __mmask32 mh = h ? m1 : m0;
      const __m512i a16 = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mh, a + 32 * h));
      const __m512i b16 =
          b ? _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mh, b + 32 * h)) : _mm512_setzero_si512();
      vv[2 * h] = _mm512_unpacklo_epi16(a16, b16);
      vv[2 * h + 1] = _mm512_unpackhi_epi16(a16, b16);
    }
    UNROLL for (int r = 0; r < NQ; r++) {
      int32_t pair;
      memcpy(&pair, w[r] + j, sizeof pair);
      const __m512i wp = _mm512_set1_epi32(pair);
      UNROLL for (int v = 0; v < 2 * NB; v++) acc[r][v] = _mm512_dpwssd_epi32(acc[r][v], vv[v], wp);
    }
  }
  UNROLL for (int r = 0; r < NQ; r++)
    UNROLL for (int v = 0; v < 2 * NB; v++) _mm512_storeu_si512(c[r] + x + 16 * v, acc[r][v]);
}

/* int32 rows c[0..nq) += weights w[0..nq) times int8 V rows vp[0..nj). */
static void pvi_rows(int32_t *const *c, const int16_t *const *w, int nq, const void *const *vp,
                     int64_t nj, int64_t hd, const void *const *pf, int64_t npf,
                     int64_t pfbytes) {
  for (int64_t x = 0; x < hd; x += 64, npf = 0) {
    const int64_t n = hd - x < 64 ? hd - x : 64, nb = n > 32 ? 2 : 1;
#define PVI_CASE(NQ, NB) \
  case (NQ) * 4 + (NB): pvi_tile(NQ, NB, c, w, vp, nj, x, n, pf, npf, pfbytes); break;
    switch (nq * 4 + (int)nb) {
      PVI_CASE(1, 1) PVI_CASE(1, 2) PVI_CASE(2, 1) PVI_CASE(2, 2)
      PVI_CASE(3, 1) PVI_CASE(3, 2) PVI_CASE(4, 1) PVI_CASE(4, 2)
    }
#undef PVI_CASE
  }
}

/* attn_softmax16 for an int8 cache, fused with the PV weights: the
 * numerators e of the query's keys give *m_out and *l_out as there, and
 * their weights w = e * vsc[j - ks] (vsc: the V scales of the keys from
 * pbase + ks; ref's w = e * v_scale, 0 for keys the query does not see)
 * become armllm_attn_i8_weights' int16s w16[u0..u1) (stored to u1 rounded
 * up to 16) with their scale *ws_out. s is left holding w. Returns 0 (s,
 * w16 and the outputs untouched) when the query sees none of the keys. */
static int i8_softmax_weights(float *s, int64_t lo, int64_t pos, int64_t pbase, int64_t u0,
                              int64_t u1, int64_t ks, const float *vsc, int16_t *w16,
                              float *m_out, float *l_out, float *ws_out) {
  int64_t a0, a1;
  if (!attn_range16(lo, pos, pbase, &a0, &a1)) return 0;
  const float m = attn_max16(s, a0, a1);
  const __m512 m16 = _mm512_set1_ps(m), zero = _mm512_setzero_ps();
  __m512 sum = zero, vmax = zero;
  for (int64_t j = u0; j < u1; j += 16) {
    const __mmask16 in = attn_lanes16(a0, a1, j); /* within [ks, u1): vsc's rows */
    const __m512 e = attn_exp16(s, j, in, m16);
    sum = _mm512_add_ps(sum, e);
    const __m512 w = _mm512_maskz_mul_ps(in, e, _mm512_maskz_loadu_ps(in, vsc + (j - ks)));
    vmax = _mm512_max_ps(w, vmax); /* NaN: the old max, as ref's > */
    _mm512_storeu_ps(s + j, w);
  }
  const float wmax = _mm512_reduce_max_ps(vmax);
  const __m512 r = _mm512_set1_ps(wmax > 0.0f ? ARMLLM_ATTN_W16_MAX / wmax : 0.0f);
  const __m512 top = _mm512_set1_ps(ARMLLM_ATTN_W16_MAX);
  for (int64_t j = u0; j < u1; j += 16) {
    __m512 y = _mm512_mul_ps(_mm512_loadu_ps(s + j), r);
    y = _mm512_min_ps(_mm512_max_ps(y, zero), top); /* NaN: 0 */
    _mm256_storeu_si256((__m256i *)(w16 + j), _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(y)));
  }
  *m_out = m;
  *l_out = _mm512_reduce_add_ps(sum);
  *ws_out = wmax / ARMLLM_ATTN_W16_MAX;
  return 1;
}

/* acc rows from pvi_tile's order (per 32 dims: 4-dim groups of the even
 * 8-dim groups, then of the odd ones) to dim order, times ws, as floats. */
static void unpermute_acci(float *out, const int32_t *acc, int64_t hdp, float ws) {
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  const __m512 s = _mm512_set1_ps(ws);
  for (int64_t x = 0; x < hdp; x += 32) {
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_loadu_si512(acc + x));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_loadu_si512(acc + x + 16));
    _mm512_storeu_ps(out + x, _mm512_mul_ps(_mm512_permutex2var_ps(lo, first, hi), s));
    _mm512_storeu_ps(out + x + 16, _mm512_mul_ps(_mm512_permutex2var_ps(lo, second, hi), s));
  }
}

#endif /* ARMLLM_AVX512_ATTN_I8_H */
