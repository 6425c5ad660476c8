/* avx2/attn.c: paged KV write and varlen paged attention, AVX2 + FMA.
 *
 * Work item: (query row tile, KV head, chunk of its query heads). A tile is
 * up to TILE_Q query vectors: R consecutive rows of one sequence times the
 * heads of the GQA group (or a chunk of them), so every K/V row loaded is
 * used by all of them. Per partition of ARMLLM_ATTN_PARTITION keys:
 *   QK^T  register tiles of 3 queries x 4 keys, 8 lanes over head_dim, one
 *         fixed horizontal-add tree per dot product;
 *   softmax  the 8-wide exp (vexp_avx2.h), lanes fixed by key position;
 *   PV    register tiles of 3 queries x 32 head_dim lanes, keys in order.
 * Keys outside a query's range get weight exactly 0, so a query's partial
 * does not depend on which other queries share its tile. Partials meet only
 * in armllm_attn_merge, in partition order (attn_common.h).
 *
 * Split-KV: with few (tile, head) units for the threads and enough scratch,
 * items become (unit, partition); partials go to scratch and a second pass
 * merges them per (row, head) in partition order with the same merge and
 * the same final division: the same bits as the unsplit path.
 *
 * bf16 caches are widened with a 16-bit shift (into a stack buffer once per
 * key chunk when a tile has more than 3 queries). */
#include <math.h>

#include "../armllm_kernels.h"
#include "../attn_common.h"
#include "vexp_avx2.h"

#define PART ARMLLM_ATTN_PARTITION
#define MAXD ARMLLM_ATTN_MAX_HEAD_DIM
#define TILE_Q 12 /* query vectors per tile */
#define KC 32     /* keys per chunk (bf16 widening, PV blocking) */

#define AINLINE static inline __attribute__((always_inline))

/* ------------------------------------------------------------ kv write */

static inline __m256i bf16_round8(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i absu = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(absu, _mm256_set1_epi32(0x7f800000));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  r = _mm256_srli_epi32(r, 16);
  const __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(r, qn, nan); /* 8 x uint32 in [0, 0xffff] */
}

static inline void store_bf16_row(uint16_t *dst, const float *src, int64_t n) {
  int64_t d = 0;
  for (; d + 16 <= n; d += 16) {
    __m256i a = bf16_round8(_mm256_loadu_ps(src + d));
    __m256i b = bf16_round8(_mm256_loadu_ps(src + d + 8));
    __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
    _mm256_storeu_si256((__m256i *)(dst + d), p);
  }
  for (; d + 8 <= n; d += 8) {
    __m256i a = bf16_round8(_mm256_loadu_ps(src + d));
    __m128i p = _mm_packus_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    _mm_storeu_si128((__m128i *)(dst + d), p);
  }
  for (; d < n; d++) dst[d] = armllm_f32_to_bf16(src[d]);
}

int64_t armllm_avx2_kv_write(armllm_pool *pool, const float *k, int64_t ldk, const float *v,
                             int64_t ldv, const int32_t *slot_mapping, int64_t t, void *k_cache,
                             void *v_cache, int cache_bf16, int64_t n_kv_heads, int64_t head_dim,
                             int64_t block_size, int64_t num_blocks) {
  (void)pool; /* T rows of a few KB: memory-bound and short */
  for (int64_t i = 0; i < t; i++)
    if (slot_mapping[i] < -1 || slot_mapping[i] >= num_blocks * block_size) return i;
  for (int64_t i = 0; i < t; i++) {
    const int64_t slot = slot_mapping[i];
    if (slot < 0) continue;
    const int64_t block = slot / block_size, off = slot % block_size;
    for (int64_t h = 0; h < n_kv_heads; h++) {
      const int64_t dst = ((block * n_kv_heads + h) * block_size + off) * head_dim;
      const float *ks = k + i * ldk + h * head_dim, *vs = v + i * ldv + h * head_dim;
      if (cache_bf16) {
        store_bf16_row((uint16_t *)k_cache + dst, ks, head_dim);
        store_bf16_row((uint16_t *)v_cache + dst, vs, head_dim);
      } else {
        memcpy((float *)k_cache + dst, ks, (size_t)head_dim * sizeof(float));
        memcpy((float *)v_cache + dst, vs, (size_t)head_dim * sizeof(float));
      }
    }
  }
  return -1;
}

/* ------------------------------------------------------------ loads */

static inline __m256 widen8(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 elements at p + d of an f32 (bf16 == 0) or bf16 row. */
AINLINE __m256 load8(const void *p, int64_t d, int bf16) {
  if (bf16) return widen8(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + d)));
  return _mm256_loadu_ps((const float *)p + d);
}

/* The first n (1..7) elements at p + d, zeros after. */
static inline __m256 load_tail(const void *p, int64_t d, int64_t n, int bf16) {
  if (bf16) {
    uint16_t t[8] = {0};
    memcpy(t, (const uint16_t *)p + d, (size_t)n * sizeof t[0]);
    return widen8(_mm_loadu_si128((const __m128i *)t));
  }
  return _mm256_maskload_ps((const float *)p + d, armllm_avx2_tail_mask(n));
}

/* Sums of 4 vectors, each with the tree ((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7)),
 * whatever the other three hold. */
static inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

static inline float hsum1(__m256 a) {
  const __m256 z = _mm256_setzero_ps();
  return _mm_cvtss_f32(hsum4(a, z, z, z));
}

static inline float hmax1(__m256 a) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

/* ------------------------------------------------------------ QK^T tile */

/* s[r*lds + c] = scale * q_r . k_c for nq (<= 3) queries (rows of q, stride
 * ldq, zero-padded) and nk (<= 4) key rows kp[c]. */
AINLINE void qk_tile(const float *q, int64_t ldq, const void *const *kp, int64_t hd, int nq,
                     int nk, int bf16, float scale, float *s, int64_t lds) {
  __m256 acc[3][4];
  for (int r = 0; r < 3; r++)
    for (int c = 0; c < 4; c++) acc[r][c] = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 8 <= hd; d += 8) {
    __m256 kv[4];
    for (int c = 0; c < nk; c++) kv[c] = load8(kp[c], d, bf16);
    for (int r = 0; r < nq; r++) {
      const __m256 qv = _mm256_loadu_ps(q + r * ldq + d);
      for (int c = 0; c < nk; c++) acc[r][c] = _mm256_fmadd_ps(qv, kv[c], acc[r][c]);
    }
  }
  if (d < hd) {
    __m256 kv[4];
    for (int c = 0; c < nk; c++) kv[c] = load_tail(kp[c], d, hd - d, bf16);
    for (int r = 0; r < nq; r++) {
      const __m256 qv = _mm256_loadu_ps(q + r * ldq + d);
      for (int c = 0; c < nk; c++) acc[r][c] = _mm256_fmadd_ps(qv, kv[c], acc[r][c]);
    }
  }
  const __m128 sc = _mm_set1_ps(scale);
  for (int r = 0; r < nq; r++) {
    __m128 dots = _mm_mul_ps(hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]), sc);
    if (nk == 4) {
      _mm_storeu_ps(s + r * lds, dots);
    } else {
      float tmp[4];
      _mm_storeu_ps(tmp, dots);
      for (int c = 0; c < nk; c++) s[r * lds + c] = tmp[c];
    }
  }
}

#define QK_CASE(NQ, NK, BF)                                                          \
  case (NQ) * 8 + (NK) * 2 + (BF):                                                   \
    qk_tile(q, ldq, kp, hd, NQ, NK, BF, scale, s, lds);                              \
    break;

static void qk_dispatch(const float *q, int64_t ldq, const void *const *kp, int64_t hd, int nq,
                        int nk, int bf16, float scale, float *s, int64_t lds) {
  switch (nq * 8 + nk * 2 + bf16) {
    QK_CASE(1, 1, 0) QK_CASE(1, 2, 0) QK_CASE(1, 3, 0) QK_CASE(1, 4, 0)
    QK_CASE(2, 1, 0) QK_CASE(2, 2, 0) QK_CASE(2, 3, 0) QK_CASE(2, 4, 0)
    QK_CASE(3, 1, 0) QK_CASE(3, 2, 0) QK_CASE(3, 3, 0) QK_CASE(3, 4, 0)
    QK_CASE(1, 1, 1) QK_CASE(1, 2, 1) QK_CASE(1, 3, 1) QK_CASE(1, 4, 1)
    QK_CASE(2, 1, 1) QK_CASE(2, 2, 1) QK_CASE(2, 3, 1) QK_CASE(2, 4, 1)
    QK_CASE(3, 1, 1) QK_CASE(3, 2, 1) QK_CASE(3, 3, 1) QK_CASE(3, 4, 1)
    default: break;
  }
}

/* ------------------------------------------------------------ PV tile */

/* acc[r*lda + d0 + 8c ..] += sum_j e[r*lde + j] * v_j[d0 + 8c ..] for nq (<= 3)
 * queries, nd (<= 4) vectors of head_dim from d0 (the last one `tail`
 * elements when tail < 8), keys j < nj in order. */
AINLINE void pv_tile(float *acc, int64_t lda, const float *e, int64_t lde,
                     const void *const *vp, int64_t nj, int64_t d0, int nq, int nd, int tail,
                     int bf16) {
  __m256 a[3][4];
  for (int r = 0; r < nq; r++)
    for (int c = 0; c < nd; c++) a[r][c] = _mm256_loadu_ps(acc + r * lda + d0 + 8 * c);
  for (int64_t j = 0; j < nj; j++) {
    __m256 vv[4];
    for (int c = 0; c < nd; c++)
      vv[c] = (c == nd - 1 && tail < 8) ? load_tail(vp[j], d0 + 8 * c, tail, bf16)
                                        : load8(vp[j], d0 + 8 * c, bf16);
    for (int r = 0; r < nq; r++) {
      const __m256 w = _mm256_broadcast_ss(e + r * lde + j);
      for (int c = 0; c < nd; c++) a[r][c] = _mm256_fmadd_ps(w, vv[c], a[r][c]);
    }
  }
  for (int r = 0; r < nq; r++)
    for (int c = 0; c < nd; c++) _mm256_storeu_ps(acc + r * lda + d0 + 8 * c, a[r][c]);
}

#define PV_CASE(NQ, ND, BF)                                                          \
  case (NQ) * 16 + (ND) * 2 + (BF):                                                  \
    if (tail < 8) pv_tile(acc, lda, e, lde, vp, nj, d0, NQ, ND, tail, BF);           \
    else pv_tile(acc, lda, e, lde, vp, nj, d0, NQ, ND, 8, BF);                       \
    break;

static void pv_dispatch(float *acc, int64_t lda, const float *e, int64_t lde,
                        const void *const *vp, int64_t nj, int64_t d0, int nq, int nd, int tail,
                        int bf16) {
  switch (nq * 16 + nd * 2 + bf16) {
    PV_CASE(1, 1, 0) PV_CASE(1, 2, 0) PV_CASE(1, 3, 0) PV_CASE(1, 4, 0)
    PV_CASE(2, 1, 0) PV_CASE(2, 2, 0) PV_CASE(2, 3, 0) PV_CASE(2, 4, 0)
    PV_CASE(3, 1, 0) PV_CASE(3, 2, 0) PV_CASE(3, 3, 0) PV_CASE(3, 4, 0)
    PV_CASE(1, 1, 1) PV_CASE(1, 2, 1) PV_CASE(1, 3, 1) PV_CASE(1, 4, 1)
    PV_CASE(2, 1, 1) PV_CASE(2, 2, 1) PV_CASE(2, 3, 1) PV_CASE(2, 4, 1)
    PV_CASE(3, 1, 1) PV_CASE(3, 2, 1) PV_CASE(3, 3, 1) PV_CASE(3, 4, 1)
    default: break;
  }
}

/* ------------------------------------------------------------ tiles */

typedef struct {
  const armllm_attn_args *a;
  int64_t group;  /* query heads per KV head */
  int64_t hc;     /* query heads per chunk */
  int64_t nhc;    /* chunks per KV head */
  int64_t R;      /* rows per tile */
  int64_t ntiles; /* ceil(rows / R) */
  int64_t parts;  /* partitions per row, at most (split) */
  int64_t units;  /* ntiles * n_kv_heads * nhc */
} attn_job;

/* One sub-tile: rows [r0, r1) of sequence b, query heads [h0, h1) of KV
 * head kvh. Query i = (row r0 + i / nh, head h0 + i % nh). */
typedef struct {
  const armllm_attn_args *a;
  int64_t b, kvh, r0, r1, h0, nh, nq, hd, hdp;
  int64_t pos[TILE_Q], lo[TILE_Q]; /* per query */
  int64_t lo_u, pos_u;             /* the union of their key ranges */
  float q[TILE_Q][MAXD];           /* zero-padded to hdp */
  float s[TILE_Q][PART];           /* scores, then weights */
  float accp[TILE_Q][MAXD];        /* the partition's weighted V */
  float mp[TILE_Q], lp[TILE_Q];
  int valid[TILE_Q];               /* query has keys in the partition */
  float buf[KC][MAXD];             /* widened bf16 rows */
  const void *rows[2][PART];       /* K and V row of each key of the partition */
  int64_t nrows;                   /* keys in rows[][] */
} tile_ctx;

static void tile_init(tile_ctx *t, const armllm_attn_args *a, int64_t b, int64_t kvh, int64_t r0,
                      int64_t r1, int64_t h0, int64_t nh) {
  t->a = a;
  t->b = b;
  t->kvh = kvh;
  t->r0 = r0;
  t->r1 = r1;
  t->h0 = h0;
  t->nh = nh;
  t->nq = (r1 - r0) * nh;
  t->hd = a->head_dim;
  t->hdp = (a->head_dim + 7) & ~(int64_t)7;
  for (int64_t i = 0; i < t->nq; i++) {
    const int64_t row = r0 + i / nh, h = h0 + i % nh;
    t->pos[i] = armllm_attn_pos(a, b, row);
    t->lo[i] = armllm_attn_lo(a, t->pos[i]);
    const float *src = a->q + row * a->ldq + h * t->hd;
    memcpy(t->q[i], src, (size_t)t->hd * sizeof(float));
    for (int64_t d = t->hd; d < t->hdp; d++) t->q[i][d] = 0.0f;
  }
  t->lo_u = t->lo[0];
  t->pos_u = t->pos[t->nq - 1];
}

/* Row pointers of keys [k0, k1) into t->rows (K, then V). */
static void tile_rows(tile_ctx *t, int64_t k0, int64_t k1) {
  const armllm_attn_args *a = t->a;
  const size_t esz = a->cache_bf16 ? 2 : 4;
  const char *kbase = a->k_cache, *vbase = a->v_cache;
  const int32_t *table = a->block_table + t->b * a->max_blocks;
  const int64_t bs = a->block_size, stride = bs * a->n_kv_heads * a->head_dim;
  for (int64_t j = k0; j < k1;) {
    const int64_t blk = j / bs, end = (blk + 1) * bs < k1 ? (blk + 1) * bs : k1;
    const int64_t off = ((int64_t)table[blk] * stride + (t->kvh * bs + j % bs) * a->head_dim) *
                        (int64_t)esz;
    for (const char *kp = kbase + off, *vp = vbase + off; j < end;
         j++, kp += a->head_dim * (int64_t)esz, vp += a->head_dim * (int64_t)esz) {
      t->rows[0][j - k0] = kp;
      t->rows[1][j - k0] = vp;
    }
  }
  t->nrows = k1 - k0;
}

/* Prefetches rows [s0, s1) of the stream K rows, then V rows. */
static inline void tile_prefetch(const tile_ctx *t, int64_t s0, int64_t s1) {
  const int64_t n = t->nrows, bytes = t->hd * (t->a->cache_bf16 ? 2 : 4);
  if (s1 > 2 * n) s1 = 2 * n;
  for (int64_t s = s0; s < s1; s++) {
    const char *p = s < n ? t->rows[0][s] : t->rows[1][s - n];
    for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
    _mm_prefetch(p + bytes - 1, _MM_HINT_T0);
  }
}

/* Widens bf16 rows src[0..n) into t->buf, pointing dst at them. */
static void tile_widen(tile_ctx *t, const void *const *src, const void **dst, int64_t n) {
  const int64_t hd = t->hd;
  for (int64_t j = 0; j < n; j++) {
    const uint16_t *p = src[j];
    float *o = t->buf[j];
    int64_t d = 0;
    for (; d + 8 <= hd; d += 8) _mm256_storeu_ps(o + d, load8(p, d, 1));
    for (; d < hd; d++) o[d] = armllm_bf16_to_f32(p[d]);
    dst[j] = o;
  }
}

/* The partial (mp, lp, accp) of every query of the tile over partition p:
 * keys [max(lo, p*PART), min(pos + 1, (p + 1)*PART)) of each query. */
static void tile_partition(tile_ctx *t, int64_t p) {
  const armllm_attn_args *a = t->a;
  const int64_t nq = t->nq, hd = t->hd, hdp = t->hdp, pbase = p * PART;
  const int64_t k0 = pbase > t->lo_u ? pbase : t->lo_u;
  const int64_t k1 = pbase + PART < t->pos_u + 1 ? pbase + PART : t->pos_u + 1;
  const int bf16 = a->cache_bf16;
  const int widen = bf16 && nq > 3; /* widen once, use for every query triple */
  const void *ptrs[KC];

  /* scores s[i][j - pbase], j in [k0, k1) */
  tile_rows(t, k0, k1);
  tile_prefetch(t, 0, KC);
  for (int64_t jc = k0; jc < k1; jc += KC) {
    const int64_t nj = k1 - jc < KC ? k1 - jc : KC;
    const void *const *kp = t->rows[0] + (jc - k0);
    tile_prefetch(t, jc - k0 + KC, jc - k0 + 2 * KC);
    if (widen) {
      tile_widen(t, kp, ptrs, nj);
      kp = ptrs;
    }
    for (int64_t i = 0; i < nq; i += 3) {
      const int mq = nq - i < 3 ? (int)(nq - i) : 3;
      for (int64_t jj = 0; jj < nj; jj += 4) {
        const int mk = nj - jj < 4 ? (int)(nj - jj) : 4;
        qk_dispatch(t->q[i], MAXD, kp + jj, hd, mq, mk, bf16 && !widen, a->scale,
                    &t->s[i][jc - pbase + jj], PART);
      }
    }
  }

  /* softmax weights; lanes are key positions, so a query's results do not
   * depend on the rest of the tile */
  const int64_t u0 = (k0 - pbase) & ~(int64_t)7, u1 = k1 - pbase;
  for (int64_t i = 0; i < nq; i++) {
    const int64_t a0 = (t->lo[i] > pbase ? t->lo[i] : pbase) - pbase;
    const int64_t a1 = (t->pos[i] + 1 < pbase + PART ? t->pos[i] + 1 : pbase + PART) - pbase;
    float *s = t->s[i];
    t->valid[i] = a0 < a1;
    if (a0 >= a1) {
      for (int64_t j = u0; j < u1; j++) s[j] = 0.0f;
      continue;
    }
    const __m256i lo8 = _mm256_set1_epi32((int32_t)a0), hi8 = _mm256_set1_epi32((int32_t)a1);
    const __m256i step = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (int64_t j = a0 & ~(int64_t)7; j < a1; j += 8) {
      const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int32_t)j), step);
      const __m256 in = _mm256_castsi256_ps(_mm256_andnot_si256(
          _mm256_cmpgt_epi32(lo8, idx), _mm256_cmpgt_epi32(hi8, idx)));
      mx = _mm256_max_ps(mx, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_loadu_ps(s + j), in));
    }
    const float m = hmax1(mx);
    const __m256 m8 = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = u0; j < u1; j += 8) {
      const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int32_t)j), step);
      const __m256 in = _mm256_castsi256_ps(_mm256_andnot_si256(
          _mm256_cmpgt_epi32(lo8, idx), _mm256_cmpgt_epi32(hi8, idx)));
      const __m256 x = _mm256_blendv_ps(m8, _mm256_loadu_ps(s + j), in);
      const __m256 e = _mm256_and_ps(armllm_exp_avx2(_mm256_sub_ps(x, m8)), in);
      sum = _mm256_add_ps(sum, e);
      _mm256_storeu_ps(s + j, e);
    }
    t->mp[i] = m;
    t->lp[i] = hsum1(sum);
  }

  /* accp[i] = sum_j e[i][j] v_j, keys in order */
  for (int64_t i = 0; i < nq; i++) memset(t->accp[i], 0, (size_t)hdp * sizeof(float));
  for (int64_t jc = k0; jc < k1; jc += KC) {
    const int64_t nj = k1 - jc < KC ? k1 - jc : KC;
    const void *const *vp = t->rows[1] + (jc - k0);
    tile_prefetch(t, t->nrows + jc - k0 + KC, t->nrows + jc - k0 + 2 * KC);
    if (widen) {
      tile_widen(t, vp, ptrs, nj);
      vp = ptrs;
    }
    for (int64_t i = 0; i < nq; i += 3) {
      const int mq = nq - i < 3 ? (int)(nq - i) : 3;
      for (int64_t d0 = 0; d0 < hd; d0 += 32) {
        const int64_t left = hd - d0;
        const int nd = left >= 32 ? 4 : (int)((left + 7) / 8);
        const int tail = left >= 32 ? 8 : (int)(left - 8 * (nd - 1));
        pv_dispatch(t->accp[i], MAXD, &t->s[i][jc - pbase], PART, vp, nj, d0, mq, nd, tail,
                    bf16 && !widen);
      }
    }
  }
}

/* The one merge and the one final division both paths use. */
static __attribute__((noinline)) void merge_partial(armllm_softmax_state *st, float *acc,
                                                    float mp, float lp, const float *accp,
                                                    int64_t hd) {
  armllm_attn_merge(st, acc, mp, lp, accp, hd);
}

static __attribute__((noinline)) void finish(float *out, const float *acc, float l, int64_t hd) {
  const __m256 l8 = _mm256_set1_ps(l);
  int64_t d = 0;
  for (; d + 8 <= hd; d += 8) _mm256_storeu_ps(out + d, _mm256_div_ps(_mm256_loadu_ps(acc + d), l8));
  for (; d < hd; d++) out[d] = acc[d] / l;
}

/* Unit u -> its tile, KV head and head chunk; walks the tile's sub-tiles
 * (one per sequence it touches), calling fn on each. */
typedef void (*subtile_fn)(const attn_job *job, tile_ctx *t, int64_t p);

static void run_unit(const attn_job *job, int64_t u, int64_t p, subtile_fn fn, tile_ctx *t) {
  const armllm_attn_args *a = job->a;
  const int64_t c = u % job->nhc, kvh = (u / job->nhc) % a->n_kv_heads;
  /* largest tiles (latest rows: longest causal ranges) first */
  const int64_t tile = job->ntiles - 1 - u / (job->nhc * a->n_kv_heads);
  const int64_t rows = a->query_start[a->n_seqs];
  const int64_t h0 = kvh * job->group + c * job->hc;
  const int64_t h1 = h0 + job->hc < (kvh + 1) * job->group ? h0 + job->hc : (kvh + 1) * job->group;
  int64_t r = tile * job->R;
  const int64_t rend = r + job->R < rows ? r + job->R : rows;
  while (r < rend) {
    const int64_t b = armllm_attn_seq_of_row(a, r);
    const int64_t r1 = a->query_start[b + 1] < rend ? a->query_start[b + 1] : rend;
    tile_init(t, a, b, kvh, r, r1, h0, h1 - h0);
    fn(job, t, p);
    r = r1;
  }
}

/* Unsplit: every partition of the sub-tile, merged as it comes. */
static void subtile_full(const attn_job *job, tile_ctx *t, int64_t p_unused) {
  (void)p_unused;
  const armllm_attn_args *a = job->a;
  float acc[TILE_Q][MAXD];
  armllm_softmax_state st[TILE_Q];
  for (int64_t i = 0; i < t->nq; i++) st[i] = (armllm_softmax_state){0.0f, 0.0f, 0};
  for (int64_t p = t->lo_u / PART; p <= t->pos_u / PART; p++) {
    tile_partition(t, p);
    for (int64_t i = 0; i < t->nq; i++)
      if (t->valid[i]) merge_partial(&st[i], acc[i], t->mp[i], t->lp[i], t->accp[i], t->hd);
  }
  for (int64_t i = 0; i < t->nq; i++) {
    const int64_t row = t->r0 + i / t->nh, h = t->h0 + i % t->nh;
    finish(a->out + row * a->ldo + h * t->hd, acc[i], st[i].l, t->hd);
  }
}

/* Split: partition p of the sub-tile (if it has keys there) into scratch. */
static void subtile_part(const attn_job *job, tile_ctx *t, int64_t p) {
  const armllm_attn_args *a = job->a;
  if (p < t->lo_u / PART || p > t->pos_u / PART) return;
  tile_partition(t, p);
  const int64_t stride = t->hd + 2;
  for (int64_t i = 0; i < t->nq; i++) {
    if (!t->valid[i]) continue;
    const int64_t row = t->r0 + i / t->nh, h = t->h0 + i % t->nh;
    float *dst = a->scratch + ((row * a->n_heads + h) * job->parts + p) * stride;
    dst[0] = t->mp[i];
    dst[1] = t->lp[i];
    memcpy(dst + 2, t->accp[i], (size_t)t->hd * sizeof(float));
  }
}

static void units_full(void *ctx, int64_t u0, int64_t u1) {
  const attn_job *job = ctx;
  tile_ctx t;
  for (int64_t u = u0; u < u1; u++) run_unit(job, u, 0, subtile_full, &t);
}

static void units_part(void *ctx, int64_t i0, int64_t i1) {
  const attn_job *job = ctx;
  tile_ctx t;
  for (int64_t i = i0; i < i1; i++) run_unit(job, i / job->parts, i % job->parts, subtile_part, &t);
}

/* Split, second pass: (row, head) items merge their partitions in order. */
static void merge_rows(void *ctx, int64_t i0, int64_t i1) {
  const attn_job *job = ctx;
  const armllm_attn_args *a = job->a;
  const int64_t hd = a->head_dim, stride = hd + 2;
  float acc[MAXD];
  for (int64_t item = i0; item < i1; item++) {
    const int64_t row = item / a->n_heads, h = item % a->n_heads;
    const int64_t b = armllm_attn_seq_of_row(a, row);
    const int64_t pos = armllm_attn_pos(a, b, row), lo = armllm_attn_lo(a, pos);
    const float *src = a->scratch + (row * a->n_heads + h) * job->parts * stride;
    armllm_softmax_state st = {0.0f, 0.0f, 0};
    for (int64_t p = lo / PART; p <= pos / PART; p++) {
      const float *part = src + p * stride;
      merge_partial(&st, acc, part[0], part[1], part + 2, hd);
    }
    finish(a->out + row * a->ldo + h * hd, acc, st.l, hd);
  }
}

int64_t armllm_avx2_attention(armllm_pool *pool, const armllm_attn_args *args) {
  const int64_t bad = armllm_attn_check(args);
  if (bad >= 0) return bad;
  const armllm_attn_args *a = args;
  const int64_t rows = a->query_start[a->n_seqs];
  if (rows <= 0) return -1;
  attn_job job;
  job.a = a;
  job.group = a->n_heads / a->n_kv_heads;
  job.nhc = (job.group + TILE_Q - 1) / TILE_Q;
  job.hc = (job.group + job.nhc - 1) / job.nhc;
  int64_t max_q = 0, max_len = 0;
  for (int64_t b = 0; b < a->n_seqs; b++) {
    const int64_t ql = a->query_start[b + 1] - a->query_start[b];
    if (ql > max_q) max_q = ql;
    if (ql > 0 && a->seq_lens[b] > max_len) max_len = a->seq_lens[b];
  }
  job.R = TILE_Q / job.hc;
  if (job.R > max_q) job.R = max_q;
  if (job.R < 1) job.R = 1;
  job.ntiles = (rows + job.R - 1) / job.R;
  job.units = job.ntiles * a->n_kv_heads * job.nhc;
  job.parts = (max_len + PART - 1) / PART;

  const int threads = armllm_pool_threads(pool);
  const size_t need = (size_t)(rows * a->n_heads * job.parts * (a->head_dim + 2));
  const int split = pool && threads > 1 && a->scratch && a->scratch_len >= need &&
                    job.parts > 1 && job.units < 4 * (int64_t)threads;
  if (!split) {
    armllm_pool_run(pool, job.units, armllm_pool_grain(pool, job.units, 4, 1), units_full, &job);
  } else {
    const int64_t items = job.units * job.parts;
    armllm_pool_run(pool, items, 1, units_part, &job);
    const int64_t m = rows * a->n_heads;
    armllm_pool_run(pool, m, armllm_pool_grain(pool, m, 2, 1), merge_rows, &job);
  }
  return -1;
}
