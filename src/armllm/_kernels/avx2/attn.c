/* avx2/attn.c: paged KV write and varlen paged attention, AVX2 + FMA.
 *
 * Work item: (query row tile, KV head, chunk of its query heads). A tile is
 * up to TILE_Q query vectors: R consecutive rows of one sequence times the
 * heads of the GQA group (or a chunk of them), so every K/V row loaded is
 * used by all of them. Per partition of ARMLLM_ATTN_PARTITION keys:
 *   QK^T  register tiles of up to 4 queries x 3 keys, 8 lanes over
 *         head_dim, one fixed horizontal-add tree per dot product;
 *   softmax  the 8-wide exp (vexp_avx2.h), lanes fixed by key position;
 *   PV    register tiles of 4 queries x 16 head_dim lanes (fewer queries:
 *         32 lanes), keys in order.
 * Keys outside a query's range get weight exactly 0, so a query's partial
 * does not depend on which other queries share its tile. Partials meet only
 * in armllm_attn_merge, in partition order (attn_common.h).
 *
 * The driver (units, sub-tiles, the partition loop and split-KV) is
 * attn_x86.h's, shared with the other x86 variant; this file holds the
 * micro-kernels and the tile (tile_ctx, tile_partition, finish).
 *
 * bf16 caches are widened in registers (QK^T: a 16-bit shift of 8 dims;
 * PV: 16 dims as even and odd halves, pvb_tile) or, when a tile has more
 * than 4 queries, into a stack buffer once per key chunk. A GQA group of 4
 * is one register tile: the 3-query tiles before ran it as 3 + 1 with two
 * spare queries' FMAs and widened every row into the buffer. On Zen 4 (one
 * thread, Llama-3.2-1B's heads, 4K tokens in L3) bf16 decode attention
 * went from 42 to 21.5 ns a key and KV head, bit for bit the same.
 *
 * int8 caches meet q in integers, as ref (attn_common.h): each q row is
 * quantized as K rows are (tile_q_extra) and widened to int16, and per
 * partition, 4 queries at a time:
 *   QK^T  K rows sign-extended to int16 in registers, VPMADDWD (exact int32
 *         pair sums; VPMADDUBSW's int16 sums would saturate) over 16 dims,
 *         4 queries x 2 keys of 8-lane accumulators, one horizontal-add
 *         tree per 8 dots; s = ((float)dot * k_scale) * qf;
 *   softmax  as above, then the weights times V scales, quantized to int16
 *         against the partition's largest (i8_weights: the same int16s as
 *         armllm_attn_i8_weights);
 *   PV    two keys' V rows interleaved byte by byte and sign-extended, so
 *         that VPMADDWD with the weight pair in every lane adds both keys'
 *         terms per dim, accumulating exact int32 sums (4 queries x 16 dims
 *         in registers); accp = (float)sum * ws.
 * Integer sums do not depend on their order, so a partition's mp and accp
 * equal ref's to the bit; lp, and so the output, differ only by the
 * softmax sum's 8-lane order (as with f32 and bf16 caches). Dims in lanes
 * rather than keys (a transpose of K), by count, not measured: with 4
 * queries a tile, the transpose (~4 shuffles a key per 16 dims) costs more
 * than the one add tree per 8 dots. On Zen 4 (2 threads, Llama-3.2-1B's
 * heads, tools/bench_attention.py --cache int8 --tables engine --long, run
 * interleaved with the float path before it on a loaded machine) decode
 * took 2.2-2.5x less time at 256-32K tokens (4K x 8 sequences: 2.4-3.6x)
 * and a 512- or 1024-row prefill 1.8-1.9x less; decode still reads 3.5-4
 * GB/s against a 12-30 GB/s probe.
 */
#include <math.h>

#include "../armllm_kernels.h"
#include "../attn_common.h"
#include "../attn_x86_tile.h"
#include "vexp_avx2.h"

#define PART ARMLLM_ATTN_PARTITION
#define MAXD ARMLLM_ATTN_MAX_HEAD_DIM
#define TILE_Q 12 /* query vectors per tile */
#define KC 32     /* keys per chunk (bf16/int8 widening, PV blocking) */
#define QPAD 16   /* q and acc rows padded to whole vectors and bf16 PV blocks */

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

static void store_bf16_row(void *dst_bytes, const float *src, int64_t n) {
  uint16_t *dst = dst_bytes;
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

ARMLLM_KV_WRITE_ON_CALLER(armllm_avx2_kv_write, store_bf16_row)

/* ------------------------------------------------------------ loads */

/* 8 bf16 (the low 128 bits of h) as floats. */
static inline __m256 widen8(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* 8 elements at p + d of a row of cache dtype KV (f32 or bf16) as floats. */
AINLINE __m256 load8(const void *p, int64_t d, const int KV) {
  if (KV == ARMLLM_KV_BF16)
    return widen8(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + d)));
  return _mm256_loadu_ps((const float *)p + d);
}

/* The first n (1..7) elements at p + d, zeros after. */
static inline __m256 load_tail(const void *p, int64_t d, int64_t n, const int KV) {
  if (KV == ARMLLM_KV_BF16) {
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

#define QB 4 /* query vectors per register tile */
#define KB 3 /* keys per QK^T register tile: 4 x 3 accumulators and 3 keys */
/* register tiles are arrays indexed by constants once these loops unroll */
#define UNROLL _Pragma("GCC unroll 4")

/* d[r][c] = scale * q_r . k_c for NQ (1..4) query rows q + r * MAXD
 * (zero-padded to whole vectors) and the KB key rows k[c] of cache dtype KV
 * (load8), 8 lanes over head_dim, each dot summed by hsum4's fixed tree:
 * every dot is the same operations whatever its neighbours, the same as
 * for a tile of any other size (a spare key repeats a real one; its dots
 * are dropped). */
AINLINE void qk_tile(const int NQ, const int KV, const float *q, const void *const *k,
                     int64_t hd, float scale, float d[QB][4]) {
  __m256 acc[QB][KB];
  UNROLL for (int r = 0; r < NQ; r++)
    UNROLL for (int c = 0; c < KB; c++) acc[r][c] = _mm256_setzero_ps();
  for (int64_t x = 0; x < hd; x += 8) {
    __m256 kv[KB];
    UNROLL for (int c = 0; c < KB; c++)
      kv[c] = x + 8 <= hd ? load8(k[c], x, KV) : load_tail(k[c], x, hd - x, KV);
    UNROLL for (int r = 0; r < NQ; r++) {
      const __m256 qv = _mm256_loadu_ps(q + r * MAXD + x);
      UNROLL for (int c = 0; c < KB; c++) acc[r][c] = _mm256_fmadd_ps(qv, kv[c], acc[r][c]);
    }
  }
  const __m128 sc = _mm_set1_ps(scale);
  const __m256 z = _mm256_setzero_ps();
  UNROLL for (int r = 0; r < NQ; r++)
    _mm_storeu_ps(d[r], _mm_mul_ps(hsum4(acc[r][0], acc[r][1], acc[r][2], z), sc));
}

/* s[r*lds + j] = scale * q_r . k_j for nq (1..4) queries q + r * MAXD and
 * keys j < nj of cache dtype kv, prefetching rows pf[0..npf) along the way. */
static void qk_rows(const float *q, int nq, const void *const *kp, int64_t nj,
                    int64_t hd, int kv, float scale, float *s, int64_t lds,
                    const void *const *pf, int64_t npf, int64_t pfbytes) {
  float d[QB][4];
  for (int64_t j = 0; j < nj; j += KB) {
    for (int64_t u = j; u < j + KB && u < npf; u++) attn_prefetch_row(pf[u], pfbytes);
    const int64_t m = nj - j < KB ? nj - j : KB;
    const void *k[KB] = {kp[j], kp[j + (m > 1)], kp[j + (m > 2) * 2]};
#define QK_CASE(NQ)                                                           \
  case NQ:                                                                    \
    if (kv == ARMLLM_KV_BF16) qk_tile(NQ, ARMLLM_KV_BF16, q, k, hd, scale, d); \
    else qk_tile(NQ, ARMLLM_KV_F32, q, k, hd, scale, d);                      \
    break;
    switch (nq) {
      QK_CASE(1)
      QK_CASE(2)
      QK_CASE(3)
      QK_CASE(4)
    }
#undef QK_CASE
    for (int r = 0; r < nq; r++)
      for (int64_t c = 0; c < m; c++) s[r * lds + j + c] = d[r][c];
  }
}

/* ------------------------------------------------------------ PV tile */

/* c[r][x..x+8*NV) += sum_{j<nj} e[r][j] * v_j[x..), NQ (1..4) queries, NV
 * (1..4) vectors from x, the last with n (1..8) elements, f32 V rows, keys
 * in order. */
AINLINE void pv_tile(const int NQ, const int NV, float *const *c,
                     const float *const *e, const void *const *vp, int64_t nj, int64_t x,
                     int64_t n, const void *const *pf, int64_t npf, int64_t pfbytes) {
  __m256 acc[QB][4];
  UNROLL for (int r = 0; r < NQ; r++)
    UNROLL for (int v = 0; v < NV; v++) acc[r][v] = _mm256_loadu_ps(c[r] + x + 8 * v);
  for (int64_t j = 0; j < nj; j++) {
    if (j < npf) attn_prefetch_row(pf[j], pfbytes);
    __m256 vv[4];
    UNROLL for (int v = 0; v < NV; v++)
      vv[v] = v < NV - 1 || n == 8 ? load8(vp[j], x + 8 * v, ARMLLM_KV_F32)
                                   : load_tail(vp[j], x + 8 * v, n, ARMLLM_KV_F32);
    UNROLL for (int r = 0; r < NQ; r++) {
      const __m256 w = _mm256_broadcast_ss(e[r] + j);
      UNROLL for (int v = 0; v < NV; v++) acc[r][v] = _mm256_fmadd_ps(w, vv[v], acc[r][v]);
    }
  }
  UNROLL for (int r = 0; r < NQ; r++)
    UNROLL for (int v = 0; v < NV; v++) _mm256_storeu_ps(c[r] + x + 8 * v, acc[r][v]);
}

/* 16 bf16 at p + x, the first n (1..16) of them (zeros after). */
static inline __m256i load16h(const uint16_t *p, int64_t x, int64_t n) {
  if (n == 16) return _mm256_loadu_si256((const __m256i *)(p + x));
  uint16_t t[16] = {0};
  memcpy(t, p + x, (size_t)n * sizeof t[0]);
  return _mm256_loadu_si256((const __m256i *)t);
}

/* pv_tile on bf16 V rows, NB (1..2) blocks of 16 dims from x, the last with
 * n (1..16): one 32-byte load per block gives its even dims (a 16-bit shift
 * left) and its odd dims (the high halves masked), two operations per 16
 * dims where widening 8 at a time takes four. c holds each block as [even 8
 * | odd 8] (unpermute_accp); every dim gets the same FMAs in the same key
 * order as pv_tile on the widened rows. */
AINLINE void pvb_tile(const int NQ, const int NB, float *const *c, const float *const *e,
                      const void *const *vp, int64_t nj, int64_t x, int64_t n,
                      const void *const *pf, int64_t npf, int64_t pfbytes) {
  const __m256i high = _mm256_set1_epi32((int32_t)0xffff0000);
  __m256 acc[QB][4]; /* [r][2 * block + (0: even, 1: odd)] */
  UNROLL for (int r = 0; r < NQ; r++)
    UNROLL for (int v = 0; v < 2 * NB; v++) acc[r][v] = _mm256_loadu_ps(c[r] + x + 8 * v);
  for (int64_t j = 0; j < nj; j++) {
    if (j < npf) attn_prefetch_row(pf[j], pfbytes);
    __m256 vv[4];
    UNROLL for (int b = 0; b < NB; b++) {
      const __m256i raw = load16h(vp[j], x + 16 * b, b < NB - 1 ? 16 : n);
      vv[2 * b] = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
      vv[2 * b + 1] = _mm256_castsi256_ps(_mm256_and_si256(raw, high));
    }
    UNROLL for (int r = 0; r < NQ; r++) {
      const __m256 w = _mm256_broadcast_ss(e[r] + j);
      UNROLL for (int v = 0; v < 2 * NB; v++) acc[r][v] = _mm256_fmadd_ps(w, vv[v], acc[r][v]);
    }
  }
  UNROLL for (int r = 0; r < NQ; r++)
    UNROLL for (int v = 0; v < 2 * NB; v++) _mm256_storeu_ps(c[r] + x + 8 * v, acc[r][v]);
}

/* accp blocks of 16 dims from [even | odd] order (pvb_tile) to dim order. */
static void unpermute_accp(float *acc, int64_t hdp) {
  for (int64_t x = 0; x < hdp; x += 16) {
    const __m256 ev = _mm256_loadu_ps(acc + x), od = _mm256_loadu_ps(acc + x + 8);
    const __m256 lo = _mm256_unpacklo_ps(ev, od), hi = _mm256_unpackhi_ps(ev, od);
    _mm256_storeu_ps(acc + x, _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_storeu_ps(acc + x + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
  }
}

/* acc rows c[0..nq) (padded to a multiple of 16) += weights e[0..nq) times
 * V rows vp[0..nj) of cache dtype kv, all of head_dim: 4 queries take 16
 * dims a pass (8 accumulators), fewer take 32. Rows pf[0..npf) are
 * prefetched in the first pass. bf16 rows leave c in pvb_tile's order. */
static void pv_rows(float *const *c, const float *const *e, int nq, const void *const *vp,
                    int64_t nj, int64_t hd, int kv, const void *const *pf, int64_t npf,
                    int64_t pfbytes) {
  const int64_t step = nq == QB ? 16 : 32; /* dims a pass */
  for (int64_t x = 0; x < hd; x += step, npf = 0) {
    const int64_t len = hd - x < step ? hd - x : step;
    if (kv == ARMLLM_KV_BF16) {
      const int64_t nb = (len + 15) / 16, n = len - 16 * (nb - 1);
#define PVB_CASE(NQ, NB) \
  case (NQ) * 4 + (NB): pvb_tile(NQ, NB, c, e, vp, nj, x, n, pf, npf, pfbytes); break;
      switch (nq * 4 + (int)nb) {
        PVB_CASE(1, 1) PVB_CASE(1, 2) PVB_CASE(2, 1) PVB_CASE(2, 2)
        PVB_CASE(3, 1) PVB_CASE(3, 2) PVB_CASE(4, 1)
      }
#undef PVB_CASE
      continue;
    }
    const int64_t nv = (len + 7) / 8, n = len - 8 * (nv - 1); /* n: the last vector's */
#define PV_CASE(NQ, NV) \
  case (NQ) * 8 + (NV): pv_tile(NQ, NV, c, e, vp, nj, x, n, pf, npf, pfbytes); break;
    switch (nq * 8 + (int)nv) {
      PV_CASE(1, 1) PV_CASE(1, 2) PV_CASE(1, 3) PV_CASE(1, 4)
      PV_CASE(2, 1) PV_CASE(2, 2) PV_CASE(2, 3) PV_CASE(2, 4)
      PV_CASE(3, 1) PV_CASE(3, 2) PV_CASE(3, 3) PV_CASE(3, 4)
      PV_CASE(4, 1) PV_CASE(4, 2)
    }
#undef PV_CASE
  }
}

#include "attn_i8.h" /* int8 caches: QK^T, PV and weights in integers */

/* ------------------------------------------------------------ tiles */

/* One sub-tile: rows [r0, r1) of sequence b, query heads [h0, h1) of KV
 * head kvh. Query i = (row r0 + i / nh, head h0 + i % nh). */
typedef struct {
  ARMLLM_X86_TILE_FIELDS
  float s[TILE_Q][PART];           /* scores, then weights */
  union {
    float buf[KC][MAXD];           /* widened bf16 rows */
    int32_t acc32[TILE_Q][MAXD];   /* int8 caches: PV's exact sums */
  } __attribute__((aligned(64)));
  /* int8 caches: q rows quantized as K rows, widened, zero-padded to 16 */
  int16_t q16[TILE_Q][MAXD] __attribute__((aligned(64)));
  float qf[TILE_Q];                /* their score factors */
  float vsp[PART];                 /* V scales by key position in the partition */
  int16_t w16[TILE_Q][PART + 8];   /* the weights as int16s (+1 for an odd last key) */
} tile_ctx;

#include "../attn_x86.h"

/* int8 caches: q row i quantized (armllm_kv_quantize_row, as ref) into q16. */
static inline void tile_q_extra(tile_ctx *t, int64_t i) {
  if (t->a->cache_dtype != ARMLLM_KV_I8) return;
  int8_t q8[MAXD];
  uint16_t qs;
  armllm_kv_quantize_row(q8, &qs, t->q[i], t->hd);
  t->qf[i] = armllm_attn_i8_qfactor(qs, t->a->scale);
  const int64_t hd16 = (t->hd + I8_STEP - 1) & ~(int64_t)(I8_STEP - 1);
  for (int64_t d = 0; d < t->hd; d++) t->q16[i][d] = q8[d];
  for (int64_t d = t->hd; d < hd16; d++) t->q16[i][d] = 0;
}

/* Widens bf16 (KV) rows src[0..n) into t->buf, pointing dst at them. */
AINLINE void tile_widen_as(const int KV, tile_ctx *t, const void *const *src, const void **dst,
                           int64_t n) {
  const int64_t hd = t->hd;
  for (int64_t j = 0; j < n; j++) {
    float *o = t->buf[j];
    int64_t d = 0;
    for (; d + 8 <= hd; d += 8) _mm256_storeu_ps(o + d, load8(src[j], d, KV));
    if (d < hd) {
      float tail[8];
      _mm256_storeu_ps(tail, load_tail(src[j], d, hd - d, KV));
      memcpy(o + d, tail, (size_t)(hd - d) * sizeof tail[0]);
    }
    dst[j] = o;
  }
}

static void tile_widen(tile_ctx *t, const void *const *src, const void **dst, int64_t n) {
  tile_widen_as(ARMLLM_KV_BF16, t, src, dst, n);
}

/* Query i's softmax over partition pbase's keys: its scores t->s[i][ks..u1)
 * (u1 = k1 - pbase) become weights exp(s - mp), exactly 0 outside its keys
 * and over [ks & ~7, ks) and up to a multiple of 8 past u1; sets mp, lp and
 * valid. Lanes are key positions, so a query's results do not depend on the
 * rest of the tile. With vs (int8 caches: the V scales by key position over
 * the same range), s holds the PV weights e * vs instead (ref's w, 0
 * outside the query's keys) and *wmax their largest (NaN ignored:
 * _mm256_max_ps returns its second operand when either is NaN). */
AINLINE void tile_softmax(tile_ctx *t, int64_t i, int64_t pbase, int64_t ks, int64_t u1,
                          const float *vs, float *wmax) {
  const int64_t u0 = ks & ~(int64_t)7;
  const int64_t a0 = (t->lo[i] > pbase ? t->lo[i] : pbase) - pbase;
  const int64_t a1 = (t->pos[i] + 1 < pbase + PART ? t->pos[i] + 1 : pbase + PART) - pbase;
  float *s = t->s[i];
  t->valid[i] = a0 < a1;
  if (a0 >= a1) {
    for (int64_t j = u0; j < u1; j++) s[j] = 0.0f;
    return;
  }
  __m256 mx = _mm256_set1_ps(-INFINITY);
  for (int64_t j = a0 & ~(int64_t)7; j < a1; j += 8)
    mx = _mm256_max_ps(mx, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_loadu_ps(s + j),
                                            armllm_avx2_range_mask(a0, a1, j)));
  const float m = hmax1(mx);
  const __m256 m8 = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps(), wmx = _mm256_setzero_ps();
  for (int64_t j = u0; j < u1; j += 8) {
    const __m256 in = armllm_avx2_range_mask(a0, a1, j);
    const __m256 e =
        _mm256_and_ps(armllm_exp_scores_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), m8)), in);
    sum = _mm256_add_ps(sum, e);
    if (vs) {
      const __m256 w = _mm256_and_ps(_mm256_mul_ps(e, _mm256_loadu_ps(vs + j)), in);
      wmx = _mm256_max_ps(w, wmx);
      _mm256_storeu_ps(s + j, w);
    } else {
      _mm256_storeu_ps(s + j, e);
    }
  }
  t->mp[i] = m;
  t->lp[i] = hsum1(sum);
  if (vs) *wmax = hmax1(wmx);
}

/* The partial (mp, lp, accp) of every query of the tile over partition p,
 * f32 or bf16 caches: keys [max(lo, p*PART), min(pos + 1, (p + 1)*PART)) of
 * each query. */
static void tile_partition_float(tile_ctx *t, int64_t p) {
  const armllm_attn_args *a = t->a;
  const int64_t nq = t->nq, hd = t->hd, hdp = t->hdp, pbase = p * PART;
  const int64_t k0 = pbase > t->lo_u ? pbase : t->lo_u;
  const int64_t k1 = pbase + PART < t->pos_u + 1 ? pbase + PART : t->pos_u + 1;
  const int kv = a->cache_dtype;
  const int widen = kv != ARMLLM_KV_F32 && nq > QB; /* widen once for every query group */
  const int kv_in = widen ? ARMLLM_KV_F32 : kv;     /* the rows the micro-kernels read */
  const int64_t pfbytes = hd * (int64_t)armllm_kv_esz(kv), ks = k0 - pbase;
  const void *ptrs[KC];

  /* scores s[i][j - pbase], j in [k0, k1) */
  tile_rows(t, k0, k1);
  tile_rows_next(t, p, KC);
  tile_prefetch(t, 0, KC);
  for (int64_t jc = k0; jc < k1; jc += KC) {
    const int64_t nj = k1 - jc < KC ? k1 - jc : KC;
    const void *const *kp = t->rows + (jc - k0);
    if (widen) {
      tile_widen(t, kp, ptrs, nj);
      kp = ptrs;
    }
    const void *const *pf;
    const int64_t npf = tile_pf(t, jc - k0, nj, &pf); /* spread over the first group */
    for (int64_t i = 0; i < nq; i += QB) {
      const int mq = nq - i < QB ? (int)(nq - i) : QB;
      qk_rows(t->q[i], mq, kp, nj, hd, kv_in, a->scale, &t->s[i][jc - pbase], PART, pf,
              i == 0 ? npf : 0, pfbytes);
    }
  }

  for (int64_t i = 0; i < nq; i++) tile_softmax(t, i, pbase, ks, k1 - pbase, NULL, NULL);

  /* accp[i] = sum_j e[i][j] v_j, keys in order */
  for (int64_t i = 0; i < nq; i++) memset(t->accp[i], 0, (size_t)hdp * sizeof(float));
  for (int64_t jc = k0; jc < k1; jc += KC) {
    const int64_t nj = k1 - jc < KC ? k1 - jc : KC, js = jc - pbase;
    const void *const *vp = t->rows + t->nrows + (jc - k0), *const *pf;
    const int64_t npf = tile_pf(t, t->nrows + jc - k0, nj, &pf);
    if (widen) {
      tile_widen(t, vp, ptrs, nj);
      vp = ptrs;
    }
    for (int64_t i = 0; i < nq; i += QB) {
      const int mq = nq - i < QB ? (int)(nq - i) : QB;
      float *c[QB];
      const float *e[QB];
      for (int r = 0; r < mq; r++) c[r] = t->accp[i + r], e[r] = t->s[i + r] + js;
      pv_rows(c, e, mq, vp, nj, hd, kv_in, pf, i == 0 ? npf : 0, pfbytes);
    }
  }
  if (kv_in == ARMLLM_KV_BF16)
    for (int64_t i = 0; i < nq; i++) unpermute_accp(t->accp[i], hdp);
}

/* Queries i..i+nq (1..4) of an int8 tile: the scores of keys kp[0..nj) with
 * scales ksc (s at key offset js), or the PV sums of V rows vp[0..nj) (the
 * weights at js), with NQ a constant for each group size. */
static void qk_i8_group(tile_ctx *t, int64_t i, int nq, const void *const *kp,
                        const float *ksc, int64_t nj, int64_t js, const void *const *pf,
                        int64_t npf) {
  const int16_t *q[4];
  float *s[4];
  for (int r = 0; r < nq; r++) q[r] = t->q16[i + r], s[r] = t->s[i + r] + js;
  const float *qf = t->qf + i;
  if (nq == 4) qk_i8_rows(4, q, qf, kp, ksc, nj, t->hd, s, pf, npf);
  else if (nq == 3) qk_i8_rows(3, q, qf, kp, ksc, nj, t->hd, s, pf, npf);
  else if (nq == 2) qk_i8_rows(2, q, qf, kp, ksc, nj, t->hd, s, pf, npf);
  else qk_i8_rows(1, q, qf, kp, ksc, nj, t->hd, s, pf, npf);
}

static void pv_i8_group(tile_ctx *t, int64_t i, int nq, const void *const *vp, int64_t nj,
                        int64_t js, const void *const *pf, int64_t npf) {
  int32_t *c[4];
  const int16_t *w[4];
  for (int r = 0; r < nq; r++) c[r] = t->acc32[i + r], w[r] = t->w16[i + r] + js;
  if (nq == 4) pv_i8_rows(4, c, w, vp, nj, t->hd, pf, npf);
  else if (nq == 3) pv_i8_rows(3, c, w, vp, nj, t->hd, pf, npf);
  else if (nq == 2) pv_i8_rows(2, c, w, vp, nj, t->hd, pf, npf);
  else pv_i8_rows(1, c, w, vp, nj, t->hd, pf, npf);
}

/* The same, int8 caches, in integers as ref (attn_common.h): scores from
 * exact int32 dots of the quantized q with K (qk_i8_rows), the softmax as
 * above fused with the weights times V scales, quantized to int16
 * (i8_weights), and accp = (exact int32 sums of w16 * V) * ws (pv_i8_rows).
 * Queries go 4 at a time. */
static void tile_partition_i8(tile_ctx *t, int64_t p) {
  const int64_t nq = t->nq, hd = t->hd, pbase = p * PART;
  const int64_t k0 = pbase > t->lo_u ? pbase : t->lo_u;
  const int64_t k1 = pbase + PART < t->pos_u + 1 ? pbase + PART : t->pos_u + 1;
  const int64_t ks = k0 - pbase, u1 = k1 - pbase;
  const int64_t hd16 = (hd + I8_STEP - 1) & ~(int64_t)(I8_STEP - 1);
  float ws[TILE_Q];

  tile_rows(t, k0, k1);
  tile_rows_next(t, p, I8_PF);
  tile_prefetch(t, 0, I8_PF);
  for (int64_t jc = k0; jc < k1; jc += KC) {
    const int64_t nj = k1 - jc < KC ? k1 - jc : KC;
    const void *const *pf;
    const int64_t npf = i8_pf(t, jc - k0, nj, &pf); /* spread over the first group */
    for (int64_t i = 0; i < nq; i += 4)
      qk_i8_group(t, i, nq - i < 4 ? (int)(nq - i) : 4, t->rows + (jc - k0), t->ksc + (jc - k0),
                  nj, jc - pbase, pf, i == 0 ? npf : 0);
  }

  /* the softmax leaves s 0 outside the query's keys over [u0, u1 rounded up
   * to 8); the V scales by key position over the same range (0 outside) */
  const int64_t u0 = ks & ~(int64_t)7, u8 = (u1 + 7) & ~(int64_t)7;
  for (int64_t j = u0; j < ks; j++) t->vsp[j] = 0.0f;
  memcpy(t->vsp + ks, t->vsc, (size_t)t->nrows * sizeof(float));
  for (int64_t j = u1; j < u8; j++) t->vsp[j] = 0.0f;
  for (int64_t i = 0; i < nq; i++) {
    float wmax = 0.0f;
    tile_softmax(t, i, pbase, ks, u1, t->vsp, &wmax);
    ws[i] = i8_weights(t->w16[i], t->s[i], wmax, u0, u8);
    t->w16[i][u1] = 0; /* an odd last key's partner */
    memset(t->acc32[i], 0, (size_t)hd16 * sizeof(int32_t));
  }

  for (int64_t jc = k0; jc < k1; jc += KC) {
    const int64_t nj = k1 - jc < KC ? k1 - jc : KC;
    const void *const *pf;
    const int64_t npf = i8_pf(t, t->nrows + jc - k0, nj, &pf);
    for (int64_t i = 0; i < nq; i += 4)
      pv_i8_group(t, i, nq - i < 4 ? (int)(nq - i) : 4, t->rows + t->nrows + (jc - k0), nj,
                  jc - pbase, pf, i == 0 ? npf : 0);
  }

  for (int64_t i = 0; i < nq; i++) {
    const __m256 w8 = _mm256_set1_ps(ws[i]);
    for (int64_t d = 0; d < hd; d += 8)
      _mm256_store_ps(t->accp[i] + d,
                      _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_load_si256(
                                        (const __m256i *)(t->acc32[i] + d))), w8));
  }
}

static void tile_partition(tile_ctx *t, int64_t p) {
  if (t->a->cache_dtype == ARMLLM_KV_I8) tile_partition_i8(t, p);
  else tile_partition_float(t, p);
}

static __attribute__((noinline)) void finish(float *out, const float *acc, float l, int64_t hd) {
  const __m256 l8 = _mm256_set1_ps(l);
  int64_t d = 0;
  for (; d + 8 <= hd; d += 8)
    _mm256_storeu_ps(out + d, _mm256_div_ps(_mm256_loadu_ps(acc + d), l8));
  for (; d < hd; d++) out[d] = acc[d] / l;
}

int64_t armllm_avx2_attention(armllm_pool *pool, const armllm_attn_args *args) {
  return armllm_x86_attention(pool, args);
}
