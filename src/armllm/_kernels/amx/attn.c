/* amx/attn.c: varlen paged attention on AMX tiles for bf16 caches (the
 * amx variant's attention slot). f32 and int8 caches, and head dims that are
 * not a multiple of 32 (a tile row's 32 bf16), run avx512's kernel: both are
 * fixed for a model, so every query of a model takes one path, decode and
 * prefill alike (paged incremental decode gives a full recompute's bits).
 *
 * The driver (units, sub-tiles, partitions, split-KV, the merge) is
 * attn_x86.h's, as for avx2/avx512; this file holds the tile. A tile is up
 * to TILE_Q = 64 query vectors (consecutive rows of one sequence times the
 * heads of a GQA group): four query blocks of 16, so that one pass over a
 * partition's K and V serves many queries. Per partition of
 * ARMLLM_ATTN_PARTITION keys, one pass over the keys, 32 at a time:
 *   QK^T   S^T = K q^T on TDPBF16PS: the K rows of 16 keys are an A tile
 *          straight from the cache (16 consecutive rows of a cache block;
 *          edge blocks are copied, keys outside the tile's range as zero
 *          rows), q^T (q rounded to bf16 as avx512 rounds it, transposed
 *          once per sub-tile) the B tile; summed over head_dim in steps of
 *          32 from +0; each 16 x 16 block transposed into the queries' score
 *          rows and times scale in f32;
 *   V      staged as B tiles (per 32 keys and 16 dims: 16 key pairs x 16
 *          dims x (even, odd key), one vpermt2w per 16 dims of a key pair;
 *          zero rows outside the range: no stale cache row ever reaches a
 *          product).
 * Then the softmax (avx512's, bit for bit: attn_softmax.h), and
 *   PV     O = P V on TDPBF16PS with the f32 weights P split into three
 *          bf16 parts hi + mid + lo (each the rounded remainder of the
 *          previous: together P to within 2^-27 of it, below f32's own
 *          rounding), so PV is as accurate as avx512's f32 FMAs; keys in
 *          32-key steps at absolute positions.
 * A query's scores and weighted V come from its own q and weight rows only
 * (the other rows and columns of a tile belong to other queries), over key
 * steps at fixed absolute positions, and zero weights add exact zeros: its
 * result does not depend on its tile-mates, nor on the thread count
 * (split-KV merges partitions in order). Compute "bf16" as avx512's: only q
 * is rounded.
 *
 * Speed (tools/bench_attention.py, 2 threads, this Xeon): prefill 2.2-2.7x
 * avx512's (SmolLM2's 9/3 x 64 heads at 1,024 rows; Llama's 32/8 x 64 and
 * x 128 at 512); a decode tile (one row: 3-8 queries) 0.75-0.85x, as the
 * tiles' fixed costs (the V staging, the score transposes, 16-row K tiles)
 * meet too few queries. PV tiles take `nq` rows below 16 queries: a
 * TDPBF16PS's time follows the rows of A.
 *
 * Tiles (16 rows x 64 bytes, but PV's O and weight tiles `nq` rows below 16
 * queries), configured per partition and released after it: QK uses
 * tmm0..3 as a 2 x 2 block of S^T (key blocks x query blocks; a single
 * query block takes four key blocks), tmm4/5 the K tiles, tmm6/7 the q^T
 * tiles; PV uses tmm0/1 for two 16-dim blocks of O, tmm2..4 the weight
 * parts, tmm6/7 the V tiles. The tile context takes ~650 KiB of the stack
 * (pool threads and the caller have 8 MiB).
 */
#include <immintrin.h>

#include "../armllm_kernels.h"
#include "../attn_common.h"
#include "../attn_x86_tile.h"
#include "../avx512/attn_softmax.h"
#include "tiles.h"

#define PART ARMLLM_ATTN_PARTITION
#define MAXD ARMLLM_ATTN_MAX_HEAD_DIM
#define TILE_Q 64 /* query vectors per tile: four row tiles */
#define KC 32     /* keys per chunk of attn_x86.h's prefetch helpers */
#define QPAD 32   /* q rows zero-padded to whole tile rows of bf16 */
#define RT 16     /* rows of a tile */
#define KB 16     /* keys per K tile (rows of an S^T tile) */
#define KS 32     /* keys per PV step (bf16 per weight tile row) */
#define DB 16     /* dims per O tile (its columns) */
#define DS 32     /* dims per QK step (bf16 per q tile row) */
#define P_PARTS 3 /* bf16 parts of a softmax weight */
#define PF_KEYS 64 /* keys ahead that the pass over K and V prefetches the rows of */

_Static_assert(PART % KS == 0, "partitions are whole PV steps");
_Static_assert(TILE_Q % RT == 0, "tiles are whole row tiles");

/* Tile registers (macros: GCC's tile intrinsics need literal numbers). */
#define S00 0 /* QK: S^T blocks [key block][query block] */
#define S01 1
#define S10 2
#define S11 3
#define KA0 4 /* QK: K rows of two key blocks */
#define KA1 5
#define QB0 6 /* QK: q^T of two query blocks */
#define QB1 7
#define O0 0 /* PV: two 16-dim blocks of O */
#define O1 1
#define PH 2 /* PV: weight parts hi, mid, lo */
#define PM 3
#define PL 4
#define VB0 6 /* PV: V tiles */
#define VB1 7

typedef struct {
  ARMLLM_X86_TILE_FIELDS /* q zero-padded to a multiple of 32 */
  uint16_t q16[TILE_Q][MAXD] __attribute__((aligned(64))); /* q rounded to bf16 */
  float s[TILE_Q][PART] __attribute__((aligned(64)));      /* scores, then weights */
  int64_t pbase; /* the partition's first key */
  /* q^T B tiles: [query block][dim pair][query of the block], 32 bits a (dim pair, query) */
  uint32_t qt[TILE_Q / RT][MAXD / 2][RT] __attribute__((aligned(64)));
  uint16_t krows[4][KB][MAXD] __attribute__((aligned(64))); /* K blocks not in place */
  float st[KB][RT] __attribute__((aligned(64)));          /* an S^T tile */
  /* V tiles: [key step][dim block][key pair][dim of the block][even, odd key] */
  uint16_t vt[PART / KS][MAXD / DB][KS / 2][DB][2] __attribute__((aligned(64)));
  /* the weights' bf16 parts: [part][query][key] */
  uint16_t pw[P_PARTS][TILE_Q][PART] __attribute__((aligned(64)));
} tile_ctx;

#include "../attn_x86.h"

static void stage_q(tile_ctx *t);

/* q16[i]: q rounded to bf16, as avx512 rounds it (vcvtneps2bf16); with the
 * last query's row in, the q^T tiles. */
static inline void tile_q_extra(tile_ctx *t, int64_t i) {
  for (int64_t d = 0; d < t->hdp; d += 16)
    _mm256_storeu_si256((__m256i *)(t->q16[i] + d),
                        (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(t->q[i] + d)));
  if (i == t->nq - 1) stage_q(t);
}

static void finish(float *out, const float *acc, float l, int64_t hd) {
  attn_finish16(out, acc, l, hd);
}

/* ------------------------------------------------------------ staging */

/* Transposes a 16 x 16 matrix of 32-bit elements held as 16 row vectors:
 * r[c] becomes column c. */
static inline void transpose16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  /* r[4g + c], lane k: column 4k + c of rows 4g..4g+3 */
  for (int g = 0; g < 16; g += 4) {
    r[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    r[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    r[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    r[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  /* t[c] (c < 4): columns c, c + 8 of rows 0..7; t[4 + c]: columns 4 + c, 12 + c; t[8..15]
   * the same of rows 8..15 */
  for (int c = 0; c < 4; c++) {
    t[c] = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);
    t[4 + c] = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);
    t[8 + c] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
  }
  for (int c = 0; c < 8; c++) {
    r[c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0xdd);
  }
}

/* The cache row of partition key j (relative to the partition), or NULL
 * outside the tile's keys [j0, j1): rows[] holds K rows then V rows. */
static inline const uint16_t *key_row(const tile_ctx *t, int64_t j, int64_t j0, int64_t j1,
                                      int v) {
  if (j < j0 || j >= j1) return NULL;
  return t->rows[(v ? t->nrows : 0) + j - j0];
}

/* Prefetches the cache rows of partition keys [j, j + n) (clipped to the
 * tile's keys [j0, j1); K, or V with v) into L1: a block's rows are
 * consecutive, so one run of lines per cache block. */
static inline void prefetch_keys(const tile_ctx *t, int64_t j, int64_t n, int64_t j0, int64_t j1,
                                 int v) {
  if (j < j0) n -= j0 - j, j = j0;
  if (j + n > j1) n = j1 - j;
  const int64_t bs = t->a->block_size, row_bytes = t->hd * 2;
  while (n > 0) {
    int64_t run = bs - (t->pbase + j) % bs;
    if (run > n) run = n;
    const char *r = t->rows[(v ? t->nrows : 0) + j - j0];
    for (int64_t o = 0; o < run * row_bytes; o += 64) _mm_prefetch(r + o, _MM_HINT_T0);
    j += run;
    n -= run;
  }
}

/* q^T tiles of every query block of the sub-tile (rows past nq zero). */
static void stage_q(tile_ctx *t) {
  for (int64_t qb = 0; qb < (t->nq + RT - 1) / RT; qb++)
    for (int64_t c = 0; c < t->hd / 2; c += 16) {
      __m512i v[RT];
      for (int r = 0; r < RT; r++)
        v[r] = qb * RT + r < t->nq ? _mm512_load_si512(&t->q16[qb * RT + r][2 * c])
                                   : _mm512_setzero_si512();
      transpose16x16(v);
      for (int d = 0; d < 16; d++) _mm512_store_si512(t->qt[qb][c + d], v[d]);
    }
}

/* The K rows of key block blk (partition keys blk*KB..+KB) as an A tile
 * source, *ld its row stride in bytes: in place when the block's 16 rows
 * are all the tile's keys and consecutive in one cache block, else copied
 * into krows[slot] with zero rows for keys outside [j0, j1) (no stale cache
 * row ever reaches a product). */
static const uint16_t *k_tile(tile_ctx *t, int64_t blk, int slot, int64_t j0, int64_t j1,
                              int64_t *ld) {
  const int64_t j = blk * KB, row_bytes = t->hd * 2, bs = t->a->block_size;
  if (j >= j0 && j + KB <= j1 && (t->pbase + j) / bs == (t->pbase + j + KB - 1) / bs) {
    *ld = row_bytes; /* one cache block: its rows are consecutive */
    return t->rows[j - j0];
  }
  for (int r = 0; r < KB; r++) {
    const uint16_t *src = key_row(t, j + r, j0, j1, 0);
    if (src) memcpy(t->krows[slot][r], src, (size_t)row_bytes);
    else memset(t->krows[slot][r], 0, (size_t)row_bytes);
  }
  *ld = MAXD * 2;
  return t->krows[slot][0];
}

/* The V tiles of key step ks (keys ks*KS..+KS of the partition). */
static void stage_v(tile_ctx *t, int64_t ks, int64_t j0, int64_t j1) {
  /* 16 dims of an even and an odd key row, interleaved: e0 o0 e1 o1 ... */
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                      39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int kp = 0; kp < KS / 2; kp++) {
    const uint16_t *ev = key_row(t, ks * KS + 2 * kp, j0, j1, 1);
    const uint16_t *od = key_row(t, ks * KS + 2 * kp + 1, j0, j1, 1);
    for (int64_t d = 0; d < t->hd; d += 32) {
      const __m512i e = ev ? _mm512_loadu_si512(ev + d) : _mm512_setzero_si512();
      const __m512i o = od ? _mm512_loadu_si512(od + d) : _mm512_setzero_si512();
      _mm512_store_si512(t->vt[ks][d / DB][kp], _mm512_permutex2var_epi16(e, lo, o));
      _mm512_store_si512(t->vt[ks][d / DB + 1][kp], _mm512_permutex2var_epi16(e, hi, o));
    }
  }
}

/* The softmax weights of rows [0, rows) over keys [ka, kb) as bf16 parts
 * (zero outside a query's written weights [u0, u1), and for rows >= nq). */
static void split_weights(tile_ctx *t, int64_t rows, int64_t ka, int64_t kb, int64_t u0,
                          int64_t u1) {
  for (int64_t i = t->nq; i < rows; i++)
    for (int part = 0; part < P_PARTS; part++)
      memset(&t->pw[part][i][ka], 0, (size_t)(kb - ka) * sizeof(uint16_t));
  for (int64_t i = 0; i < t->nq; i++)
    for (int64_t j = ka; j < kb; j += 16) {
      __m512 x = j >= u0 && j < u1 ? _mm512_load_ps(t->s[i] + j) : _mm512_setzero_ps();
      for (int part = 0; part < P_PARTS; part++) {
        const __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
        _mm256_store_si256((__m256i *)(t->pw[part][i] + j), h);
        x = _mm512_sub_ps(x, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
      }
    }
}

/* ------------------------------------------------------------ tiles */

/* Every tile 16 rows x 64 bytes, but the PV tiles of the weights and of O
 * (PH, PM, PL, O0, O1) `pv_rows` rows: a TDPBF16PS takes time in
 * proportion to the rows of A, so a decode tile of a few queries runs its
 * PV on tiles of that many rows (each row's result is the same). */
static void load_config(int pv_rows) {
  amx_tilecfg cfg;
  amx_cfg_init(&cfg);
  for (int i = 0; i < AMX_TILES; i++) amx_cfg_tile(&cfg, i, RT, AMX_TILE_COLSB);
  amx_cfg_tile(&cfg, O0, pv_rows, AMX_TILE_COLSB);
  amx_cfg_tile(&cfg, O1, pv_rows, AMX_TILE_COLSB);
  amx_cfg_tile(&cfg, PH, pv_rows, AMX_TILE_COLSB);
  amx_cfg_tile(&cfg, PM, pv_rows, AMX_TILE_COLSB);
  amx_cfg_tile(&cfg, PL, pv_rows, AMX_TILE_COLSB);
  _tile_loadconfig(&cfg);
}

/* s[16 qb + i][16 blk + j] = scale * S^T[j][i] for the queries of block
 * qb (i < nq - 16 qb), S^T the tile in st: one 16 x 16 transpose. */
static void store_scores(tile_ctx *t, int64_t qb, int64_t blk, float scale) {
  __m512i v[KB];
  for (int r = 0; r < KB; r++) v[r] = _mm512_load_si512(t->st[r]);
  transpose16x16(v);
  const __m512 sc = _mm512_set1_ps(scale);
  const int64_t n = t->nq - qb * RT < RT ? t->nq - qb * RT : RT;
  for (int64_t i = 0; i < n; i++)
    _mm512_store_ps(&t->s[qb * RT + i][blk * KB], _mm512_mul_ps(_mm512_castsi512_ps(v[i]), sc));
}

/* The scores of NQB (1, 2) query blocks from qb with key blocks blk and
 * blk + 1 (their K rows at k[0], k[1], row strides ld[0], ld[1] bytes):
 * S^T = K q^T over head_dim in steps of 32 dims from +0, then into s. */
static inline __attribute__((always_inline)) void qk_block(const int NQB, tile_ctx *t, int64_t qb,
                                                           int64_t blk, const uint16_t *const *k,
                                                           const int64_t *ld, float scale) {
  const int64_t ldq = RT * 4, ldst = RT * 4; /* bytes */
  _tile_zero(S00);
  _tile_zero(S10);
  if (NQB > 1) _tile_zero(S01);
  if (NQB > 1) _tile_zero(S11);
  for (int64_t d = 0; d < t->hd; d += DS) {
    _tile_loadd(KA0, k[0] + d, ld[0]);
    _tile_loadd(QB0, t->qt[qb][d / 2], ldq);
    _tile_dpbf16ps(S00, KA0, QB0);
    _tile_loadd(KA1, k[1] + d, ld[1]);
    _tile_dpbf16ps(S10, KA1, QB0);
    if (NQB > 1) {
      _tile_loadd(QB1, t->qt[qb + 1][d / 2], ldq);
      _tile_dpbf16ps(S01, KA0, QB1);
      _tile_dpbf16ps(S11, KA1, QB1);
    }
  }
  _tile_stored(S00, t->st, ldst);
  store_scores(t, qb, blk, scale);
  _tile_stored(S10, t->st, ldst);
  store_scores(t, qb, blk + 1, scale);
  if (NQB > 1) {
    _tile_stored(S01, t->st, ldst);
    store_scores(t, qb + 1, blk, scale);
    _tile_stored(S11, t->st, ldst);
    store_scores(t, qb + 1, blk + 1, scale);
  }
}

/* One query block (a tile of at most 16 queries: decode) with four key
 * blocks from blk: qk_block's scores, on four accumulators (S00, S10, S01,
 * S11 hold key blocks blk..blk+3; the K tiles go through KA0, KA1 and
 * QB1), so that four TDPBF16PS chains overlap. */
static void qk_block4(tile_ctx *t, int64_t blk, const uint16_t *const *k, const int64_t *ld,
                      float scale) {
  const int64_t ldq = RT * 4, ldst = RT * 4; /* bytes */
  _tile_zero(S00);
  _tile_zero(S10);
  _tile_zero(S01);
  _tile_zero(S11);
  for (int64_t d = 0; d < t->hd; d += DS) {
    _tile_loadd(QB0, t->qt[0][d / 2], ldq);
    _tile_loadd(KA0, k[0] + d, ld[0]);
    _tile_dpbf16ps(S00, KA0, QB0);
    _tile_loadd(KA1, k[1] + d, ld[1]);
    _tile_dpbf16ps(S10, KA1, QB0);
    _tile_loadd(QB1, k[2] + d, ld[2]);
    _tile_dpbf16ps(S01, QB1, QB0);
    _tile_loadd(KA0, k[3] + d, ld[3]);
    _tile_dpbf16ps(S11, KA0, QB0);
  }
  _tile_stored(S00, t->st, ldst);
  store_scores(t, 0, blk, scale);
  _tile_stored(S10, t->st, ldst);
  store_scores(t, 0, blk + 1, scale);
  _tile_stored(S01, t->st, ldst);
  store_scores(t, 0, blk + 2, scale);
  _tile_stored(S11, t->st, ldst);
  store_scores(t, 0, blk + 3, scale);
}

/* accp[16 rt.., 32 dp..+32) = the weights' parts times V over key steps
 * [ka, kb) / KS. */
static void pv_block(tile_ctx *t, int64_t rt, int64_t dp, int64_t ka, int64_t kb) {
  const int64_t ldp = PART * 2, ldv = 2 * DB * 2, lda = MAXD * 4; /* bytes */
  const int64_t db = 2 * dp;
  _tile_zero(O0);
  _tile_zero(O1);
  for (int64_t ks = ka / KS; ks < kb / KS; ks++) {
    _tile_loadd(PH, &t->pw[0][rt * RT][ks * KS], ldp);
    _tile_loadd(PM, &t->pw[1][rt * RT][ks * KS], ldp);
    _tile_loadd(PL, &t->pw[2][rt * RT][ks * KS], ldp);
    _tile_loadd(VB0, t->vt[ks][db], ldv);
    _tile_loadd(VB1, t->vt[ks][db + 1], ldv);
    _tile_dpbf16ps(O0, PH, VB0);
    _tile_dpbf16ps(O1, PH, VB1);
    _tile_dpbf16ps(O0, PM, VB0);
    _tile_dpbf16ps(O1, PM, VB1);
    _tile_dpbf16ps(O0, PL, VB0);
    _tile_dpbf16ps(O1, PL, VB1);
  }
  _tile_stored(O0, &t->accp[rt * RT][db * DB], lda);
  _tile_stored(O1, &t->accp[rt * RT][(db + 1) * DB], lda);
}

/* The partial (mp, lp, accp) of every query of the tile over partition p:
 * keys [max(lo, p*PART), min(pos + 1, (p + 1)*PART)) of each query. */
static void tile_partition(tile_ctx *t, int64_t p) {
  const armllm_attn_args *a = t->a;
  const int64_t nq = t->nq, pbase = p * PART;
  const int64_t k0 = pbase > t->lo_u ? pbase : t->lo_u;
  const int64_t k1 = pbase + PART < t->pos_u + 1 ? pbase + PART : t->pos_u + 1;
  const int64_t j0 = k0 - pbase, j1 = k1 - pbase;        /* the tile's keys, in the partition */
  const int64_t ka = j0 & ~(int64_t)(KS - 1);            /* whole PV steps around them */
  const int64_t kb = (j1 + KS - 1) & ~(int64_t)(KS - 1);
  const int64_t nrt = (nq + RT - 1) / RT, rows = nrt * RT;
  const int pv_rows = nq < RT ? (int)nq : RT; /* rows of the PV tiles */
  const int64_t u0 = j0 & ~(int64_t)15;

  t->pbase = pbase;
  tile_rows(t, k0, k1);
  prefetch_keys(t, ka, PF_KEYS, j0, j1, 0);
  prefetch_keys(t, ka, PF_KEYS, j0, j1, 1);
  load_config(RT);
  /* one pass over the keys' K and V rows, 32 keys (a PV step, two key
   * blocks) at a time: their scores, and their V tiles */
  for (int64_t blk = ka / KB; blk < kb / KB;) {
    /* four key blocks at a time for a single query block, else two */
    const int64_t nb = nrt == 1 && kb / KB - blk >= 4 ? 4 : 2;
    prefetch_keys(t, blk * KB + PF_KEYS, nb * KB, j0, j1, 0);
    prefetch_keys(t, blk * KB + PF_KEYS, nb * KB, j0, j1, 1);
    int64_t ld[4];
    const uint16_t *k[4];
    for (int i = 0; i < nb; i++) k[i] = k_tile(t, blk + i, i, j0, j1, &ld[i]);
    if (nb == 4) {
      qk_block4(t, blk, k, ld, a->scale);
    } else {
      for (int64_t qb = 0; qb < nrt; qb += 2) {
        if (nrt - qb > 1) qk_block(2, t, qb, blk, k, ld, a->scale);
        else qk_block(1, t, qb, blk, k, ld, a->scale);
      }
    }
    for (int64_t ks = blk * KB / KS; ks < (blk + nb) * KB / KS; ks++) stage_v(t, ks, j0, j1);
    blk += nb;
  }
  for (int64_t i = 0; i < nq; i++)
    t->valid[i] = attn_softmax16(t->s[i], t->lo[i], t->pos[i], pbase, u0, j1, &t->mp[i], &t->lp[i]);

  split_weights(t, nq < RT ? nq : rows, ka, kb, u0, j1);
  if (pv_rows < RT) load_config(pv_rows);
  for (int64_t rt = 0; rt < nrt; rt++)
    for (int64_t dp = 0; dp < t->hd / (2 * DB); dp++) pv_block(t, rt, dp, ka, kb);
  _tile_release();
}

int64_t armllm_amx_attention(armllm_pool *pool, const armllm_attn_args *args) {
  if (args->cache_dtype != ARMLLM_KV_BF16 || args->head_dim % DS != 0)
    return armllm_avx512_attention(pool, args);
  return armllm_x86_attention(pool, args);
}
